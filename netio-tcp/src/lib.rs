//! TCP provider of netio-rs, on mio.
//!
//! [`TcpProvider`] creates [`TcpBackend`]s on the real event loop,
//! [`MioLoop`]. A backend speaks the
//! versioned wire format of `docs/wire-format.md` ([`wire`] is its sans-IO
//! codec): a handshake that refuses foreign or mismatched peers, then
//! length-prefixed frames.
//!
//! - Connections are named by [`ConnId`](netio_core::ConnId) handles and
//!   kept in a [`ConnTable`](netio_core::ConnTable): every operation finds
//!   its connection by index and generation, never by address. Each
//!   accepted connection gets a handle of its own, so any number of
//!   connections may share a remote address.
//! - Non-blocking sockets, `TCP_NODELAY`, socket buffer sizes and timeouts
//!   from [`TcpConfig`]; IPv4 and IPv6.
//! - Liveness: with [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout)
//!   every connection gets keepalive probes and `TCP_USER_TIMEOUT`
//!   ([`TcpConfig::keepalive`], [`TcpConfig::user_timeout`]); a peer that
//!   stops answering closes the connection with `CloseReason::TimedOut`.
//! - Receive flow control: a paused connection
//!   ([`pause_receive`](netio_core::Backend::pause_receive)) is not read,
//!   so the kernel's receive window fills and the peer's sends back up.
//! - Handler timers and wake-ups (`set_timer`, `wake`) run on the loop,
//!   dispatched like every other event.
//! - Receiving: each connection reads into one large buffer and hands
//!   every whole message to `on_data` straight out of it; a message larger
//!   than the buffer is assembled in a buffer of the connection's receive
//!   pool. A message above the receive limit closes the connection before
//!   any of it is buffered.
//! - Sending: queued frames are written with vectored writes, many messages
//!   per system call. Copy sends are copied into one byte ring per
//!   connection, so the messages queued in one callback leave as one slice
//!   of the gather write; a large copy send (32 KiB and more) on a
//!   connection with nothing queued is written straight from the caller's
//!   slices, and only what the socket did not take is copied. Buffered
//!   sends of up to 2 KiB are copied into the ring too (their buffer is
//!   held until the send completes); larger ones write the pool buffer.
//!   Zero-copy sends write straight from the registered region. The sends
//!   one write completes are reported in one `on_sends_completed` call per
//!   connection.
//! - Thread-safe and thread-unsafe modes; handlers run on the loop thread,
//!   never under a backend lock and never from inside an operation.
//! - Port ranges: [`TcpConfig::listen_ports`] confines listeners to a
//!   [`PortRange`] (port 0 takes a free port of it),
//!   [`TcpConfig::connect_ports`] binds outgoing connections to a local
//!   port of one, for firewalls that open only some ports.
//! - [`local_addresses`] lists this host's interface addresses, to tell
//!   peers where to connect.
//!
//! ```
//! use std::sync::mpsc;
//! use std::time::Duration;
//!
//! use netio_core::mio_loop::MioLoop;
//! use netio_core::{
//!     Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, EndpointAddress, EventLoop,
//!     Handler, Provider,
//! };
//! use netio_tcp::{TcpBackend, TcpProvider};
//!
//! /// Sends "hello" once connected; stops the loop when it arrives.
//! struct App(mpsc::Sender<Vec<u8>>, MioLoop);
//! impl Handler<TcpBackend> for App {
//!     fn on_connection_established(
//!         &mut self,
//!         b: &TcpBackend,
//!         conn: ConnId,
//!         _remote: EndpointAddress,
//!         c: Capabilities,
//!     ) {
//!         if c.send_copy {
//!             let _ = b.send_data_copy(conn, &[b"hello"], &[], 1);
//!         }
//!     }
//!     fn on_data(&mut self, _: &TcpBackend, _: ConnId, data: &[u8]) {
//!         let _ = self.0.send(data.to_vec());
//!         self.1.stop();
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let lp = MioLoop::new()?;
//! let (tx, rx) = mpsc::channel();
//! let backend = TcpProvider::create(&lp, BackendConfig::default(), App(tx, lp.clone()))?;
//! let params = ConnectionParams::receive(1024, 4);
//! let addr = backend.open_listen_endpoint(EndpointAddress::localhost(0), params.clone())?;
//! let conn = backend.open_active_endpoint(addr, params)?;
//! assert_eq!(backend.remote_address(conn)?, addr);
//! lp.run(|| {});
//! assert_eq!(rx.recv_timeout(Duration::from_secs(10))?, b"hello");
//! # Ok(())
//! # }
//! ```
//!
//! # Busy polling
//!
//! By default the loop thread sleeps in `epoll_wait` until something
//! happens. A loop made with [`LoopConfig::busy_poll`](netio_core::mio_loop::LoopConfig::busy_poll)
//! never sleeps: it polls with a zero timeout in a tight loop, so readiness,
//! posted work, signals and calls from other threads are seen without a
//! scheduler wake-up (and waking it costs no system call), and timers tick
//! with sub-millisecond precision. The price is one core kept at 100% for
//! as long as the loop runs, whether traffic flows or not. Backends need
//! nothing else: create them on that loop as usual. On such a loop a
//! backend reads the connection that delivered data last on every turn
//! (a [spin callback](netio_core::mio_loop::MioLoop::add_spin)), and the
//! loop asks epoll about the rest every few turns: a ping-pong's reply is
//! found by the read that returns it. A connection that stays the one
//! delivering leaves epoll until another one delivers, a write to it
//! blocks or it closes (its arrivals then cost the kernel no epoll
//! wake-up, which on loopback is paid inside the sender's call). What
//! handlers send while the spin hands messages over is written when the
//! spin ends, in the same turn, as on any loop what they send from a
//! readiness event, a timer, a wake or a dispatched completion is written
//! when that callback's run ends (small copy sends made outside such a
//! run, from another thread or a posted closure, are written by a flush
//! posted to the loop).
//!
//! ```
//! use std::thread;
//!
//! use netio_core::mio_loop::{LoopConfig, MioLoop};
//! use netio_core::{BackendConfig, EventLoop, Handler, Provider};
//! use netio_tcp::{TcpBackend, TcpProvider};
//!
//! struct App;
//! impl Handler<TcpBackend> for App {}
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let lp = MioLoop::with_config(LoopConfig {
//!     busy_poll: true,
//!     ..LoopConfig::default()
//! })?;
//! let backend = TcpProvider::create(&lp, BackendConfig::default(), App)?;
//! // One thread per busy-polling loop, on a core of its own.
//! let runner = lp.clone();
//! let t = thread::spawn(move || runner.run(|| {}));
//! // ... open endpoints and send from any thread (thread-safe mode) ...
//! # let _ = backend;
//! lp.stop();
//! t.join().unwrap();
//! # Ok(())
//! # }
//! ```
//!
//! Use it when latency matters more than CPU time and the machine has a
//! core to spare for each busy loop: a busy loop sharing its core with
//! another busy thread only takes time slices away from it. Keep to one busy loop per process unless there are
//! cores for more, and pin its thread if the system allows (for example
//! `taskset`). The loop polls without a bound and never yields the thread;
//! where the core must be shared, keep the default. This is the event
//! loop's polling, not the kernel's `SO_BUSY_POLL` socket option, which
//! this provider does not set: the kernel's TCP processing is the same in
//! both modes. The conformance suite runs on busy-polling loops too
//! (`tests/conformance_busy_poll.rs`).

#![warn(missing_docs)]

mod addrs;
mod backend;
mod config;
mod conn;
mod ring;
mod socket;
mod stats;
pub mod wire;

pub use addrs::{local_addresses, LocalAddress};
pub use backend::TcpBackend;
pub use config::{Keepalive, PortRange, PortRangeError, TcpConfig};
pub use stats::{BackendStats, ConnStats};

use netio_core::mio_loop::MioLoop;
use netio_core::{BackendConfig, CreateError, Handler, Provider};

/// The TCP provider: backends on [`MioLoop`], named `"tcp"`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpProvider;

impl Provider for TcpProvider {
    type Loop = MioLoop;
    type Backend = TcpBackend;
    const NAME: &'static str = "tcp";

    fn create<H: Handler<TcpBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        handler: H,
    ) -> Result<TcpBackend, CreateError> {
        TcpBackend::new(event_loop, config, handler)
    }
}

impl TcpProvider {
    /// Creates a backend with TCP settings other than the defaults.
    pub fn create_with<H: Handler<TcpBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        tcp: TcpConfig,
        handler: H,
    ) -> Result<TcpBackend, CreateError> {
        TcpBackend::with_tcp_config(event_loop, config, tcp, handler)
    }
}
