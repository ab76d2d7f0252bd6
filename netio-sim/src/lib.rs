//! A deterministic in-memory fabric for netio-rs.
//!
//! A [`Sim`] is one world of virtual hosts with IP addresses, one virtual
//! clock and one seeded scheduler. Each host has an event loop
//! ([`SimLoop`]) and any number of backends ([`SimBackend`]); both implement
//! the `netio-core` traits, so application code written against
//! [`Backend`](netio_core::Backend) and [`EventLoop`](netio_core::EventLoop)
//! runs here unchanged. The same seed gives the same run, byte for byte
//! ([`Sim::trace`] proves it), and simulated minutes take milliseconds: no
//! real sleeping ever happens.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use netio_core::{
//!     Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, EndpointAddress, Handler,
//! };
//! use netio_sim::Sim;
//!
//! /// Sends every message back on the connection it came from.
//! struct Echo;
//! impl<B: Backend + ?Sized> Handler<B> for Echo {
//!     fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
//!         let _ = b.send_data_copy(conn, &[data], &[], 0);
//!     }
//! }
//!
//! /// Says "ping" once connected and keeps what comes back.
//! struct Client(Arc<Mutex<Vec<Vec<u8>>>>);
//! impl<B: Backend + ?Sized> Handler<B> for Client {
//!     fn on_connection_established(&mut self, b: &B, conn: ConnId, _: EndpointAddress, _: Capabilities) {
//!         b.send_data_copy(conn, &[b"ping"], &[], 1).unwrap();
//!     }
//!     fn on_data(&mut self, _: &B, _: ConnId, data: &[u8]) {
//!         self.0.lock().unwrap().push(data.to_vec());
//!     }
//! }
//!
//! let sim = Sim::with_seed(7);
//! let (server_host, client_host) = (sim.next_host(), sim.next_host()); // 127.0.0.1, 127.0.0.2
//! let server = server_host.backend(BackendConfig::default(), Echo).unwrap();
//! let addr = server
//!     .open_listen_endpoint(EndpointAddress::new(server_host.ip(), 0), ConnectionParams::receive(64, 4))
//!     .unwrap();
//!
//! let got = Arc::new(Mutex::new(Vec::new()));
//! let client = client_host.backend(BackendConfig::default(), Client(got.clone())).unwrap();
//! // The handle names this connection in every event and operation.
//! let conn = client.open_active_endpoint(addr, ConnectionParams::receive(64, 4)).unwrap();
//!
//! // Drive the world (on this thread) until the echo is back.
//! assert!(sim.run_until(Duration::from_secs(1), || !got.lock().unwrap().is_empty()));
//! assert_eq!(got.lock().unwrap()[0], b"ping");
//! assert!(sim.now() < Duration::from_millis(1)); // a few link latencies of 10 µs
//! assert_eq!(client.remote_address(conn).unwrap(), addr);
//! ```
//!
//! # The model
//!
//! - **Addresses.** [`Sim::next_host`] hands out 127.0.0.1, 127.0.0.2, …;
//!   [`Sim::host`] takes any unicast address. A host listens on its own
//!   address (or the unspecified one). Ephemeral ports come from the
//!   seeded generator, in 49152–65535.
//! - **Time.** Every operation returns at once; every outcome is an event on
//!   the virtual clock, dispatched later by whoever drives the world
//!   ([`Sim::step`], [`Sim::run_for`], [`Sim::run_until`],
//!   [`Sim::run_until_idle`], or [`SimLoop`]'s `run`). Handlers are never
//!   called from inside a backend call nor with the world locked, so they
//!   may call back into any backend, close, fire signals.
//! - **Connections** are named by [`ConnId`](netio_core::ConnId) handles,
//!   kept per backend in a [`ConnTable`](netio_core::ConnTable): the
//!   initiator's is the one `open_active_endpoint` returns, the acceptor
//!   gets a new one per accepted connection with
//!   `on_connection_established`. Several connections between the same
//!   two addresses are distinct; a closed connection's handle stays stale.
//!   They open with TCP's three-way handshake: the initiator is
//!   established one round trip after `open_active_endpoint`, the acceptor
//!   one latency later. Nothing listening, or a refusing host, answers with
//!   a refusal (`Refused`); a missing, crashed or partitioned host does not
//!   answer, and the attempt gives up after [`CONNECT_TIMEOUT`]
//!   (`Unreachable`).
//! - **Links and cards.** Each direction between two hosts has a latency,
//!   a bandwidth (messages are serialised one after another) and a small
//!   random jitter ([`LinkConfig`], [`Sim::set_link`]). Each host has a
//!   network card with a send and a receive bandwidth ([`NicConfig`],
//!   [`Sim::set_nic`], 10 GB/s each way by default) shared by all its
//!   links, so several senders pushing into one receiver (incast) share
//!   its receive bandwidth. Messages of one connection always arrive in
//!   order.
//! - **Profiles: what a completion means.** A backend's
//!   [`NetworkMode`](netio_core::NetworkMode) picks the semantics of the
//!   real provider the simulator stands in for, on every connection it
//!   opens or accepts (a listener refuses an initiator of the other mode
//!   with `RefuseReason::Handshake`):
//!   - `NetworkMode::Tcp` (the default, as on `netio-tcp`): a send
//!     completes when its bytes are handed to the sending "kernel": at
//!     once while the connection's window ([`Sim::set_tcp_window`],
//!     [`DEFAULT_TCP_WINDOW`]) has room, later once the receiver takes
//!     earlier messages (reported in the step of the delivery that made
//!     the room, right after its messages). A completed send is still lost if the receiver
//!     closes, resets or crashes before taking it; an orderly close by the
//!     sender delivers what completed before the peer hears the close; a
//!     message too large for the receiver is reported completed.
//!   - `NetworkMode::Rdma` (as on verbs): a send completes when the
//!     receiver has taken the message into a receive buffer (the peer's
//!     acknowledgement); what it never took is cancelled.
//!
//!   The TCP profile is the default because it exposes more application
//!   bugs: an application that reads a completion as "the peer has it"
//!   loses messages there, as it would on TCP. Test under `Rdma` what is
//!   meant to run on the libfabric provider over verbs, and under both
//!   what must run on either.
//! - **Buffers.** A message needs a free receive buffer at the receiver
//!   (per connection, the listener's shared pool, or the backend's shared
//!   pool). Until its completion is reported the sender's buffer, lent
//!   region or queue slot stays in flight. A busy receiver therefore
//!   pushes back (under TCP once the window is full): senders see
//!   `get_buffer` = `None` and `SendError::NoResources`. Completions of
//!   one connection that happen at one instant come in one
//!   `on_sends_completed` call, in send order.
//! - **Receive flow control.** After `pause_receive` the receiver takes no
//!   message of that connection into its buffers, so the sender's sends
//!   stop completing and it feels backpressure; messages already in
//!   buffers wait. `resume_receive` hands the held ones over first, then
//!   the rest, in order. The peer's orderly close of a paused connection is
//!   reported after its held messages (so after the resume); a reset is
//!   reported at once; a local close drops what was held.
//! - **Time for handlers.** `Backend::now` and `EventLoop::now` read the
//!   virtual clock; `set_timer(delay, token)` calls `on_timer` exactly at
//!   now + `delay` (equal deadlines in the order set); `wake(token)` and
//!   `EventLoop::post` run at the current virtual time, after whatever the
//!   current event is doing, never inside the call.
//! - **Closing.** The closing side reports `Local` at once (as an event),
//!   the peer `PeerClosed` one latency later (under TCP, after the data
//!   the closing side had completed); each side's unfinished sends are
//!   cancelled and never delivered. A message larger than the receiver's
//!   buffer closes the connection (`MessageTooLarge` at the receiver,
//!   `PeerClosed` at the sender), as does a message to a side without
//!   receive buffers (`Protocol`).
//! - **Local ports.** Outgoing connections leave from a random ephemeral
//!   port, or from a range set with [`Sim::set_connect_ports`]; with a
//!   one-port range, two connections of one host to two listeners of
//!   another carry equal remote addresses, and stay two connections.
//! - **Faults**, first-class and reported through the normal callbacks:
//!   [`Sim::refuse_connections`], [`Sim::reset_connections`],
//!   [`Sim::partition`] / [`Sim::heal`], [`Sim::hold`] /
//!   [`Sim::release`] (delay without loss: no timeout),
//!   [`Sim::crash`], [`Sim::crash_silently`], [`Sim::restart`] (same
//!   address, fresh state, the hook of [`SimHost::on_restart`] makes the
//!   application again), [`Sim::slow_receiver`],
//!   [`Sim::pause_loop`].
//! - **Liveness.** A backend with a
//!   [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout)
//!   closes an open connection with
//!   [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut) (unfinished
//!   sends cancelled) once its peer has been unreachable that long: cut off
//!   by [`Sim::partition`], or crashed by [`Sim::crash_silently`]. If the
//!   cut heals, the peer hears a reset. Without it, a partition never
//!   times out.
//! - **Threads.** The world sits behind one mutex, and one event with its
//!   callbacks runs at a time, whoever drives. Callbacks run with the
//!   world unlocked, so another thread may call in while one runs, even
//!   while it waits for that thread, as on a real provider; a world made
//!   [driver-only](Sim::set_driver_only) keeps it to its driver instead,
//!   which is faster, and refuses such calls (they panic). The *driver
//!   thread* is the thread currently (or last) driving the world,
//!   initially the one that created the [`Sim`]; a backend created with
//!   [`ThreadSafety::Unsafe`](netio_core::ThreadSafety::Unsafe) refuses
//!   calls from any other thread with `WrongThread`, so a test thread that
//!   steps the world may call it between steps.
//!   [`EventLoop::on_loop_thread`](netio_core::EventLoop::on_loop_thread) is
//!   stricter: it holds only while the thread is inside `run` or a
//!   callback. Thread-safe backends accept calls from every thread; such a
//!   call only queues work.
//!
//! # When runs are reproducible
//!
//! A run is determined by its seed and by the order of the calls made into
//! the world. That order is fixed when every backend call, fault and step
//! comes from one thread (the driver), or from callbacks the driver runs:
//! then the same seed gives the same trace, byte for byte, however loaded
//! the machine. A call into a thread-safe backend from another thread
//! while the driver drives lands between two events at a moment set by
//! the operating system's scheduler, so two runs may differ from there
//! on. The world notices the first such call ([`Sim::reproducible`]
//! turns `false`) and, in debug builds, says so once on stderr. To keep a
//! multi-threaded test reproducible, hand the calls to the loop
//! ([`EventLoop::post`](netio_core::EventLoop::post)) or make them from
//! the driver between steps. Apart from threads, only what the
//! application itself brings in (the wall clock, a `HashMap`'s order,
//! randomness not drawn from the seed) breaks reproducibility;
//! [`chaos::check_determinism`] finds the first line where two runs
//! part.
//!
//! # Seeds
//!
//! [`Sim::new`] uses [`Sim::DEFAULT_SEED`], or the `NETIO_SIM_SEED`
//! environment variable when it is set (decimal, or hexadecimal with `0x`),
//! so a failing run can be replayed with `NETIO_SIM_SEED=… cargo test`.
//! [`Sim::with_seed`] ignores the environment.
//!
//! # Lifetimes
//!
//! Backends, listeners and connections live as long as the world: dropping a
//! [`SimBackend`] handle closes nothing (close endpoints or crash the host
//! for that). The world is freed when the last handle ([`Sim`],
//! [`SimHost`], [`SimLoop`], [`SimBackend`], signals, timers) is dropped, so
//! a handler or callback that stores such a handle keeps its world alive;
//! handlers do not need to, since every callback receives its backend.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
pub mod chaos;
mod event_loop;
mod lend;
mod rng;
mod world;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, TryLockError};

use lend::{Lending, Place, Slot, WorldGuard};
use std::time::Duration;

pub use backend::{SimBackend, SimProvider};
pub use event_loop::{SimLoop, SimSignal, SimTimer};
pub use netio_core;

use world::{Call, Due, NetEv, World};

/// How long a connection attempt waits for an answer before it is refused
/// with [`RefuseReason::Unreachable`](netio_core::RefuseReason::Unreachable)
/// (target host missing, crashed, or partitioned away). Virtual time.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Bytes one direction of a TCP-profile connection accepts before its
/// receiver takes them (the sending and receiving sockets' buffers
/// together); see [`Sim::set_tcp_window`].
pub const DEFAULT_TCP_WINDOW: usize = 256 * 1024;

/// A host's network card: how fast it sends and takes in bytes, over all
/// its links together. Several senders towards one host share its receive
/// bandwidth (incast), several connections of one host its send
/// bandwidth. 0 means unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NicConfig {
    /// Bytes per second the host can send; 0 means unlimited.
    pub send_bytes_per_sec: u64,
    /// Bytes per second the host can take in; 0 means unlimited.
    pub receive_bytes_per_sec: u64,
}

impl NicConfig {
    /// A card with the same bandwidth both ways.
    pub const fn symmetric(bytes_per_sec: u64) -> Self {
        Self {
            send_bytes_per_sec: bytes_per_sec,
            receive_bytes_per_sec: bytes_per_sec,
        }
    }
}

impl Default for NicConfig {
    /// 10 GB/s each way, as fast as a default link.
    fn default() -> Self {
        Self::symmetric(10_000_000_000)
    }
}

/// The model of one link direction between two hosts.
///
/// A message of `n` bytes occupies the link for `n / bandwidth` seconds
/// after the messages before it, then travels `latency` plus a random
/// `jitter` (uniform in `0..=jitter`, from the seeded generator). Control
/// packets (connect, refuse, close) only take latency and jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinkConfig {
    /// One-way propagation delay.
    pub latency: Duration,
    /// Bytes per second; 0 means unlimited.
    pub bandwidth_bytes_per_sec: u64,
    /// Largest extra delay added at random to each packet.
    pub jitter: Duration,
}

impl LinkConfig {
    /// A link with `latency`, `bandwidth_bytes_per_sec` and no jitter.
    pub const fn new(latency: Duration, bandwidth_bytes_per_sec: u64) -> Self {
        Self {
            latency,
            bandwidth_bytes_per_sec,
            jitter: Duration::ZERO,
        }
    }
}

impl Default for LinkConfig {
    /// 10 µs latency, 10 GB/s, up to 1 µs jitter.
    fn default() -> Self {
        Self {
            latency: Duration::from_micros(10),
            bandwidth_bytes_per_sec: 10_000_000_000,
            jitter: Duration::from_micros(1),
        }
    }
}

pub(crate) struct Shared {
    /// The world; its driver holds it for a whole run of steps (see
    /// `lend`).
    world: Place,
    /// Signalled when work is scheduled or a loop is stopped, for threads
    /// blocked in [`SimLoop::run`] or [`Sim::wait_for_work`].
    wake: Condvar,
    /// Held while one event is processed and its callbacks dispatched: one
    /// callback at a time, whoever drives.
    step_lock: Mutex<Stepping>,
    /// Threads waiting for [`Shared::step_lock`] to drive; the driver gives
    /// way to them between steps.
    drivers_waiting: AtomicUsize,
    seed: u64,
    /// What each host's application does when the host restarts.
    restart_hooks: Mutex<std::collections::BTreeMap<IpAddr, RestartHook>>,
}

type RestartHook = Arc<Mutex<Box<dyn FnMut(&SimHost) + Send>>>;

/// What the driver keeps from one step to the next (behind
/// [`Shared::step_lock`]).
#[derive(Default)]
struct Stepping {
    /// The callbacks of the step (empty between steps; its memory kept).
    calls: Vec<Call>,
    /// Key lists of reported completions and closes, handed back to the
    /// world at the next step for later reports to reuse.
    spent: Vec<Vec<u64>>,
}

/// A simulated world: hosts, links, one virtual clock, one seeded scheduler.
///
/// `Sim` is a cheap handle (clone it freely; it is `Send + Sync`). See the
/// [crate docs](crate) for the model.
#[derive(Clone)]
pub struct Sim {
    shared: Arc<Shared>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The world (by address of its shared state) whose callbacks this
    /// thread runs right now, or 0. A callback cannot drive a world, so
    /// there is at most one.
    static DISPATCHING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Worlds this thread drives in `SimLoop::run`.
    static DRIVING: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Marks the current thread as running simulator callbacks of `sim`.
struct CallbackGuard;

impl CallbackGuard {
    fn enter(sim: &Sim) -> Self {
        DISPATCHING.with(|c| c.set(sim.id()));
        Self
    }
}

impl Drop for CallbackGuard {
    fn drop(&mut self) {
        DISPATCHING.with(|c| c.set(0));
    }
}

/// Marks the current thread as driving `sim` in `SimLoop::run` (see
/// [`EventLoop::on_loop_thread`](netio_core::EventLoop::on_loop_thread)).
pub(crate) struct DrivingGuard(usize);

impl DrivingGuard {
    pub(crate) fn enter(sim: &Sim) -> Self {
        let id = sim.id();
        DRIVING.with(|d| d.borrow_mut().push(id));
        Self(id)
    }
}

impl Drop for DrivingGuard {
    fn drop(&mut self) {
        DRIVING.with(|d| {
            let mut d = d.borrow_mut();
            if let Some(i) = d.iter().rposition(|&x| x == self.0) {
                d.swap_remove(i);
            }
        });
    }
}

fn assert_not_in_callback(what: &str) {
    assert!(
        DISPATCHING.with(|c| c.get()) == 0,
        "{what} called from inside a simulator callback (handler, signal or timer); \
         drive the simulation from outside callbacks, e.g. call SimLoop::stop in the \
         callback and step from the code that called run"
    );
}

impl Default for Sim {
    fn default() -> Self {
        Self::new()
    }
}

impl Sim {
    /// The seed [`Sim::new`] uses when `NETIO_SIM_SEED` is not set.
    pub const DEFAULT_SEED: u64 = 0x5EED_5EED_5EED;

    /// A world seeded with `NETIO_SIM_SEED` if set, else
    /// [`Sim::DEFAULT_SEED`].
    ///
    /// # Panics
    /// If `NETIO_SIM_SEED` is set but is not a `u64` (decimal or `0x` hex).
    pub fn new() -> Self {
        match std::env::var("NETIO_SIM_SEED") {
            Ok(v) => {
                let t = v.trim();
                let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16),
                    None => t.parse(),
                };
                match parsed {
                    Ok(seed) => Self::with_seed(seed),
                    Err(_) => panic!(
                        "NETIO_SIM_SEED={v:?} is not a u64; set it to a decimal or 0x-prefixed \
                         hexadecimal number, or unset it to use Sim::DEFAULT_SEED"
                    ),
                }
            }
            Err(_) => Self::with_seed(Self::DEFAULT_SEED),
        }
    }

    /// A world whose schedule is determined by `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self {
            shared: Arc::new(Shared {
                world: Place::new(World::new(seed, netio_core::thread_token())),
                wake: Condvar::new(),
                step_lock: Mutex::new(Stepping::default()),
                drivers_waiting: AtomicUsize::new(0),
                seed,
                restart_hooks: Mutex::new(std::collections::BTreeMap::new()),
            }),
        }
    }

    /// The seed of this world.
    pub fn seed(&self) -> u64 {
        self.shared.seed
    }

    /// Identity of this world, for thread-local bookkeeping.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// `true` while the calling thread drives this world: inside
    /// [`SimLoop::run`] or a callback dispatched by any driving method.
    pub(crate) fn driving_here(&self) -> bool {
        let id = self.id();
        DISPATCHING.with(|c| c.get()) == id || DRIVING.with(|d| d.borrow().contains(&id))
    }

    /// The world, for the calling thread: the one lent to it if it runs
    /// this world's callbacks, else through the mutex.
    #[inline]
    pub(crate) fn world(&self) -> WorldGuard<'_> {
        WorldGuard::get(&self.shared.world, self.id())
    }

    /// The world's mutex, locked (for a driver, or to wait on
    /// [`Shared::wake`]). Never called with the world lent to this thread.
    pub(crate) fn lock_world(&self) -> MutexGuard<'_, Slot> {
        self.shared.world.lock()
    }

    /// Runs `f` on the world, then wakes threads waiting for work. (With
    /// the world lent to a callback they cannot see the change before the
    /// driver unlocks it, which wakes them then.)
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        let mut w = self.world();
        let r = f(&mut w);
        let notify = w.waiters > 0 && !w.lent();
        drop(w);
        if notify {
            self.shared.wake.notify_all();
        }
        r
    }

    /// The host at `ip`, created if new.
    ///
    /// # Panics
    /// If `ip` is unspecified, multicast or broadcast: a host needs a
    /// unicast address.
    pub fn host(&self, ip: IpAddr) -> SimHost {
        let bad = ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::V4(Ipv4Addr::BROADCAST);
        assert!(
            !bad,
            "Sim::host({ip}): a host needs a unicast address such as 127.0.0.5"
        );
        self.world().ensure_host(ip);
        SimHost {
            lp: SimLoop::new(self.clone(), ip),
        }
    }

    /// A new host at the next free address of 127.0.0.1, 127.0.0.2, ….
    ///
    /// # Panics
    /// If all of 127.0.0.0/8 is taken.
    pub fn next_host(&self) -> SimHost {
        let ip = {
            let mut w = self.world();
            loop {
                let n = w.next_auto_host;
                assert!(
                    n < 1 << 24,
                    "Sim::next_host: 127.0.0.0/8 is full; use Sim::host with other addresses"
                );
                w.next_auto_host += 1;
                let ip = IpAddr::V4(Ipv4Addr::from(0x7F00_0000 | n));
                if !w.hosts.contains_key(&ip) {
                    w.ensure_host(ip);
                    break ip;
                }
            }
        };
        SimHost {
            lp: SimLoop::new(self.clone(), ip),
        }
    }

    /// `false` once a thread-safe backend of this world was called from a
    /// thread other than the one driving it: from then on the run depends
    /// on thread timing, not on the seed alone (see the
    /// [crate docs](crate#when-runs-are-reproducible)). Debug builds also
    /// say so once on stderr.
    pub fn reproducible(&self) -> bool {
        self.world().foreign_call.is_none()
    }

    /// Makes the world *driver-only* (or shared again, the default): every
    /// call into it while it is driven comes from the driving thread, in
    /// callbacks or between steps. The driver then keeps the world to
    /// itself while its callbacks run, so the calls they make (a send, a
    /// timer) take no lock each, and a run of steps takes none per
    /// callback: a busy single-threaded simulation runs 1.15–1.25×
    /// faster (`docs/benchmarks.md`).
    ///
    /// In a shared world a callback runs with the world unlocked, so
    /// other threads may call in meanwhile, also while the callback waits
    /// for them (a mutex shared with a thread that sends while it holds
    /// it, say), as they may on a real provider. A driver-only world
    /// cannot let them wait for it: a call from another thread while the
    /// world is driven **panics** with a message saying so. Between runs
    /// of steps any thread may call in. The chaos runner and the
    /// determinism checks suit it when the scenario makes every call on
    /// the driving thread, as a reproducible run does anyway (see
    /// [When runs are reproducible](crate#when-runs-are-reproducible)).
    /// Takes effect from the next run of steps.
    pub fn set_driver_only(&self, on: bool) {
        self.shared.world.set_driver_only(on);
    }

    /// The addresses of every host of the world, in address order.
    pub fn hosts(&self) -> Vec<IpAddr> {
        self.world().hosts.keys().copied().collect()
    }

    /// Virtual time since the world was created.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.world().sched.now)
    }

    /// Virtual time of the next scheduled event, if any.
    pub fn next_event_at(&self) -> Option<Duration> {
        self.world().next_at().map(Duration::from_nanos)
    }

    /// Runs the next scheduled event (advancing the clock to it) and the
    /// callbacks it causes. Returns `false` if nothing is scheduled.
    ///
    /// # Panics
    /// If called from inside a simulator callback.
    pub fn step(&self) -> bool {
        self.drive(u64::MAX, false, 1, None).steps == 1
    }

    /// Runs steps, each the next event due no later than `deadline` (virtual
    /// ns) with its callbacks, until none is due, `max_steps` have run, or
    /// (with `stop`) that host's loop was told to stop (checked before each
    /// step; the request is taken). With `batch`, events that cause no
    /// callback (nothing an observer could see between them) are run back
    /// to back, up to the first that does, as one step.
    ///
    /// One call takes the step lock once and keeps the world locked for
    /// the whole run, lending it to the callbacks it runs (see `lend`), so
    /// a run of steps costs what its callbacks need; no user code runs
    /// between the steps. It gives way (ends, `yielded`) after a step when
    /// another thread waits to drive, as a loop of single steps would let
    /// it in, and unlocks the world between steps for a thread that waits
    /// for it.
    pub(crate) fn drive(
        &self,
        deadline: u64,
        batch: bool,
        max_steps: usize,
        stop: Option<IpAddr>,
    ) -> Driven {
        assert_not_in_callback("Sim::step");
        let waiting = &self.shared.drivers_waiting;
        let mut stepping = match self.shared.step_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Another thread drives: it gives way after its step.
                waiting.fetch_add(1, Ordering::Relaxed);
                let g = lock(&self.shared.step_lock);
                waiting.fetch_sub(1, Ordering::Relaxed);
                g
            }
        };
        let st = &mut *stepping;
        // Left by a callback that panicked; dropped with the world unlocked.
        st.calls.clear();
        let _guard = CallbackGuard::enter(self);
        let mut handles = Handles::default();
        let mut g = self.lock_world();
        placed(&mut g).driver = netio_core::thread_token();
        let mut held = Held {
            lend: self.shared.world.start_driving(),
            guard: Some(g),
        };
        let mut done = Driven {
            steps: 0,
            stopped: false,
            yielded: false,
        };
        while done.steps < max_steps {
            if done.steps > 0 {
                if waiting.load(Ordering::Relaxed) > 0 {
                    done.yielded = true;
                    break;
                }
                if self.shared.world.waited_for() {
                    self.give_way(&mut held);
                }
            }
            let w = held.world();
            if let Some(ip) = stop {
                if std::mem::replace(&mut w.host_mut(ip).stop, false) {
                    done.stopped = true;
                    break;
                }
            }
            if !st.spent.is_empty() {
                w.sched.reuse_keys(&mut st.spent);
            }
            let mut ran = false;
            while w.run_next(deadline) {
                ran = true;
                if !batch || w.has_calls() {
                    break;
                }
            }
            if !ran {
                break;
            }
            done.steps += 1;
            if w.has_calls() {
                w.take_calls(&mut st.calls);
                if let Err(panic) = self.dispatch(&mut held, st, &mut handles) {
                    self.end_run(held);
                    drop(stepping);
                    resume_unwind(panic);
                }
            }
        }
        self.end_run(held);
        drop(stepping);
        if done.yielded {
            // Let the waiting thread in before this one asks again.
            while waiting.load(Ordering::Relaxed) > 0 {
                std::thread::yield_now();
            }
        }
        done
    }

    /// Runs events until none is scheduled or `max_events` have run; returns
    /// how many ran. A running periodic timer keeps the world busy, so this
    /// then runs exactly `max_events`.
    ///
    /// # Panics
    /// If called from inside a simulator callback.
    pub fn run_until_idle(&self, max_events: usize) -> usize {
        let mut n = 0;
        loop {
            let done = self.drive(u64::MAX, false, max_events - n, None);
            n += done.steps;
            if !done.yielded {
                return n;
            }
        }
    }

    /// Runs every event due within `d` of virtual time, then sets the clock
    /// to now + `d`.
    ///
    /// # Panics
    /// If called from inside a simulator callback.
    pub fn run_for(&self, d: Duration) {
        let deadline = self.world().sched.now.saturating_add(world::nanos(d));
        while self.drive(deadline, true, usize::MAX, None).yielded {}
        let mut w = self.world();
        w.sched.now = w.sched.now.max(deadline);
    }

    /// Runs events until `cond` holds (checked before each event) or the
    /// clock would pass `deadline` (virtual time since the start). Returns
    /// whether `cond` holds. When nothing more is due by `deadline`, the
    /// clock moves to `deadline` and `cond` is checked one last time.
    pub fn run_until(&self, deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
        let deadline = world::nanos(deadline);
        loop {
            if cond() {
                return true;
            }
            if self.world().next_at().is_none_or(|t| t > deadline) {
                let mut w = self.world();
                w.sched.now = w.sched.now.max(deadline);
                drop(w);
                return cond();
            }
            self.step();
        }
    }

    /// Blocks the calling thread for up to `timeout` of *real* time until
    /// some event is scheduled (by another thread: a backend call, a signal
    /// fire). Returns whether one is. For drivers that share the world with
    /// other threads. Inside a callback of this world it does not wait:
    /// no other thread can reach the world until the callback returns.
    pub fn wait_for_work(&self, timeout: Duration) -> bool {
        {
            let w = self.world();
            if w.lent() || w.has_work() {
                return w.has_work();
            }
        }
        let mut g = self.lock_world();
        placed(&mut g).waiters += 1;
        let (mut g, _) = self
            .shared
            .wake
            .wait_timeout_while(g, timeout, |g| !placed_mut_slot(g).has_work())
            .unwrap_or_else(|p| p.into_inner());
        let w = placed(&mut g);
        w.waiters -= 1;
        w.has_work()
    }

    /// Records one line per event from now on, or stops recording.
    /// Recording is off at first. A line reads `<virtual ns> <host> <event>`,
    /// for example `21213 127.0.0.2 b1 established conn#0.0 127.0.0.1:61301 caps=rb-c`
    /// (`b1` is the host's backend number in the world, `conn#0.0` the
    /// connection's handle in that backend).
    pub fn enable_trace(&self, on: bool) {
        let mut w = self.world();
        match (on, w.sched.trace.is_some()) {
            (true, false) => w.sched.trace = Some(String::new()),
            (false, true) => w.sched.trace = None,
            _ => {}
        }
    }

    /// The recorded trace (empty if recording is off). Two runs with the
    /// same seed and the same driving code give identical traces.
    pub fn trace(&self) -> String {
        self.world().sched.trace.clone().unwrap_or_default()
    }

    /// Sets the link model between hosts `a` and `b`, both directions.
    pub fn set_link(&self, a: IpAddr, b: IpAddr, link: LinkConfig) {
        self.with(|w| w.set_link(a, b, link));
    }

    /// The link model from `a` to `b` ([`LinkConfig::default`] unless set).
    pub fn link(&self, a: IpAddr, b: IpAddr) -> LinkConfig {
        self.world().link_config(a, b)
    }

    /// Sets `host`'s network card ([`NicConfig::default`] unless set).
    pub fn set_nic(&self, host: IpAddr, nic: NicConfig) {
        self.with(|w| w.set_nic(host, nic));
    }

    /// The network card of `host`.
    pub fn nic(&self, host: IpAddr) -> NicConfig {
        self.world().nic_config(host)
    }

    /// Sets how many bytes one direction of a TCP-profile connection
    /// accepts (and reports completed) before its receiver takes them:
    /// the sockets' buffers. Default [`DEFAULT_TCP_WINDOW`]; applies to
    /// messages sent from now on. A message larger than the window is
    /// accepted alone once the window is empty.
    ///
    /// # Panics
    /// If `bytes` is 0.
    pub fn set_tcp_window(&self, bytes: usize) {
        assert!(
            bytes > 0,
            "Sim::set_tcp_window(0): the window must hold something"
        );
        self.with(|w| w.tcp_window = bytes);
    }

    /// Holds every message and connection packet between hosts `a` and `b`
    /// in flight, in both directions, until [`release`](Self::release): as
    /// a network that delays instead of dropping. Unlike a
    /// [`partition`](Self::partition), a hold is not a loss of the peer: it
    /// never ends a connection through `peer_timeout` (a connection
    /// attempt still gives up after [`CONNECT_TIMEOUT`]). Sends keep
    /// completing as their profile says (under TCP while the window has
    /// room), so the application can be driven into a chosen state before
    /// the held traffic lands.
    pub fn hold(&self, a: IpAddr, b: IpAddr) {
        self.with(|w| w.hold_between(a, b));
    }

    /// Ends a [`hold`](Self::hold): everything held moves on, in order,
    /// one link latency from now (unless a partition still cuts them).
    pub fn release(&self, a: IpAddr, b: IpAddr) {
        self.with(|w| w.release_between(a, b));
    }

    /// Makes every outgoing connection of `host` leave from a port of
    /// `ports` (as `TcpConfig::connect_ports` does on TCP), or from an
    /// ephemeral port again with `None`. Connections to different remote
    /// addresses may share a port, so the peers of a host with a one-port
    /// range see equal remote addresses; a port whose connection to the same
    /// remote address lives is skipped, and when none is left opening fails
    /// with [`OpenActiveError::NoResources`](netio_core::OpenActiveError::NoResources).
    ///
    /// # Panics
    /// If the range is empty or includes port 0.
    pub fn set_connect_ports(&self, host: IpAddr, ports: Option<std::ops::RangeInclusive<u16>>) {
        let ports = ports.map(|r| {
            assert!(
                !r.is_empty() && *r.start() > 0,
                "Sim::set_connect_ports({host}, {r:?}): the range must be non-empty and exclude port 0"
            );
            (*r.start(), *r.end())
        });
        self.with(|w| w.set_connect_ports(host, ports));
    }

    /// Makes `host` refuse (or accept again) every incoming connection, even
    /// on ports it listens on: initiators see `on_connection_refused`
    /// (`Refused`).
    pub fn refuse_connections(&self, host: IpAddr, refuse: bool) {
        self.with(|w| w.refuse(host, refuse));
    }

    /// Breaks every connection between hosts `a` and `b` (in either
    /// direction; `a == b` for a host's connections to itself): both sides
    /// report `on_connection_closed` with `Reset` and their unfinished sends
    /// cancelled; connections still opening are refused.
    pub fn reset_connections(&self, a: IpAddr, b: IpAddr) {
        self.with(|w| w.reset(a, b));
    }

    /// Cuts hosts `a` and `b` apart. Messages and connection packets between
    /// them are held (senders' sends stop completing); connection attempts
    /// across the cut are refused with `Unreachable` after
    /// [`CONNECT_TIMEOUT`] unless the cut heals first. An open connection
    /// whose backend has a
    /// [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout)
    /// closes with [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut)
    /// when the cut lasts that long; without one it waits for the heal.
    pub fn partition(&self, a: IpAddr, b: IpAddr) {
        self.with(|w| w.partition(a, b));
    }

    /// Joins `a` and `b` again: everything held is delivered, in order, one
    /// link latency from now.
    pub fn heal(&self, a: IpAddr, b: IpAddr) {
        self.with(|w| w.heal(a, b));
    }

    /// Crashes `host` for good: its listeners and connections vanish without
    /// a word to its own handlers (they hear nothing more), its peers see
    /// `on_connection_closed` with `Reset` one latency later, and connection
    /// attempts to it time out (`Unreachable`). Its backends drop their
    /// handlers, with the world unlocked, before this returns: what a
    /// handler owns goes with the host (the tasks of a `netio-async`
    /// backend included). Its loop's signals and timers keep running; its
    /// backends' operations fail.
    pub fn crash(&self, host: IpAddr) {
        let dead = self.with(|w| w.crash(host, true));
        drop(dead);
    }

    /// Crashes `host` for good without a word to anyone, as a machine that
    /// loses power or a cable cut for good: like [`crash`](Self::crash),
    /// but no reset reaches its peers. Their connections stay open and
    /// their sends stop completing, unless their backend has a
    /// [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout):
    /// then they close with
    /// [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut) that long
    /// after the crash.
    pub fn crash_silently(&self, host: IpAddr) {
        let dead = self.with(|w| w.crash(host, false));
        drop(dead);
    }

    /// Restarts `host` after a crash, as a machine that reboots: same
    /// address, fresh state. Backends made before (their handlers were
    /// dropped at the crash), the loop's timers and signals and closures
    /// posted to it stay dead;
    /// the host refuses nothing, is not slow and its loop runs. Then the
    /// hook set with [`SimHost::on_restart`] runs (on the calling thread,
    /// with the world unlocked), which is where the application makes its
    /// backends and listeners again. A host that is up is crashed first
    /// (its peers hear a reset), so this is also a reboot.
    pub fn restart(&self, host: IpAddr) {
        let dead = self.with(|w| w.restart(host));
        drop(dead);
        let hook = lock(&self.shared.restart_hooks).get(&host).cloned();
        if let Some(hook) = hook {
            let h = self.host(host);
            (lock(&hook))(&h);
        }
    }

    /// Ends the world: every backend drops its handler and every loop its
    /// timers, signals and posted closures, with the world unlocked, before
    /// this returns; nothing runs any more (a step finds nothing to do).
    /// For the end of a run: what handlers and callbacks hold is freed even
    /// when it holds the world in turn (an async task holding its
    /// backend), which dropping the last handle alone would leave in
    /// memory. The chaos runner does it after each run's check.
    pub fn shut_down(&self) {
        let dead = self.with(World::shut_down);
        drop(dead);
    }

    /// `true` if `host` has crashed and not restarted.
    pub fn crashed(&self, host: IpAddr) -> bool {
        self.world().hosts.get(&host).is_some_and(|h| h.crashed)
    }

    /// Makes every receive buffer on `host` stay busy for `per_message` of
    /// virtual time after `on_data` returns, so its senders feel
    /// backpressure. `Duration::ZERO` restores normal speed.
    pub fn slow_receiver(&self, host: IpAddr, per_message: Duration) {
        self.with(|w| w.slow(host, per_message));
    }

    /// Connections (open, opening or closing) and listeners the world still
    /// keeps, on every host: what a test counts to show that open and close
    /// cycles leave nothing behind.
    pub fn live_objects(&self) -> usize {
        self.world().live_objects()
    }

    /// Pauses `host`'s event loop, as if its thread were stuck in a long
    /// callback: its handlers, signals and timers are not called, so every
    /// message that reaches it stays in its receive buffer; once those are
    /// full, its senders feel backpressure. The network itself goes on
    /// (connections open and close, the host's own sends travel).
    /// [`resume_loop`](Self::resume_loop) runs what was held back, in order.
    pub fn pause_loop(&self, host: IpAddr) {
        self.with(|w| w.pause(host, true));
    }

    /// Resumes a loop paused by [`pause_loop`](Self::pause_loop): the
    /// callbacks held back run first, in their order, at the current
    /// virtual time.
    pub fn resume_loop(&self, host: IpAddr) {
        self.with(|w| w.pause(host, false));
    }

    /// Unlocks the world, waking threads waiting for work.
    #[inline]
    fn unlock(&self, g: MutexGuard<'_, Slot>) {
        let notify = placed_ref(&g).waiters > 0;
        drop(g);
        if notify {
            self.shared.wake.notify_all();
        }
    }

    /// Ends a run of steps: unlocks the world (if a callback that
    /// panicked did not leave it unlocked).
    fn end_run(&self, mut held: Held<'_>) {
        self.shared.world.stop_driving();
        if let Some(g) = held.guard.take() {
            self.unlock(g);
        }
    }

    /// Unlocks the world for the threads waiting for it, lets them in,
    /// and locks it again.
    fn give_way<'a>(&'a self, held: &mut Held<'a>) {
        let g = held.guard.take().expect("the driver holds the world");
        self.shared.world.stop_driving();
        self.unlock(g);
        // Each waiter counts itself out once it holds the lock; a bounded
        // wait, so that threads calling in without pause cannot hold the
        // driver up for good.
        for _ in 0..64 {
            if !self.shared.world.waited_for() {
                break;
            }
            std::thread::yield_now();
        }
        held.guard = Some(self.lock_world());
        held.lend = self.shared.world.start_driving();
    }

    /// Runs the callbacks of a step (`st.calls`, left empty), each with
    /// the world open to it ([`Open`]), and returns the panic
    /// of one that panicked (the rest are then dropped at the next step).
    /// Whether a callback still runs is decided just before it, which
    /// also gives the handler back and frees the receive buffer an
    /// `on_data` read after it. What a callback owns is dropped with the
    /// world open too (a stopped timer's callback or a retired handler may
    /// hold handles that call into it).
    fn dispatch<'a>(
        &'a self,
        held: &mut Held<'a>,
        st: &mut Stepping,
        handles: &mut Handles,
    ) -> Result<(), Box<dyn std::any::Any + Send>> {
        // Taken from the back: in their order.
        st.calls.reverse();
        while let Some(call) = st.calls.pop() {
            let w = held.world();
            let (backend, ev) = match call {
                Call::Net { backend, ev } => (backend, ev),
                call => {
                    let run = w.loop_call_due(&call);
                    let _open = Open::new(self, held);
                    if !run {
                        drop(call);
                        continue;
                    }
                    match call {
                        Call::Timer { f, .. } | Call::Signal { f, .. } => {
                            catch_unwind(AssertUnwindSafe(|| (lock(&f))()))?;
                        }
                        Call::Post { f, .. } => catch_unwind(AssertUnwindSafe(f))?,
                        Call::Net { .. } => unreachable!("handler calls are taken above"),
                    }
                    continue;
                }
            };
            let (mut h, host) = match w.due(backend, &ev) {
                Due::Handler(handler, host) => (handler, host),
                Due::Skip => {
                    if let NetEv::Data(m) = ev {
                        w.recv_done(backend, m);
                    }
                    continue;
                }
                Due::Hold => {
                    if let NetEv::Data(m) = ev {
                        w.hold(m);
                    }
                    continue;
                }
            };
            let b = handles.get(self, host, backend);
            // The handler goes back to its backend even if it panics; a
            // message comes back for its buffer to be freed.
            let spent = &mut st.spent;
            // Opened and closed by hand rather than by an `Open` guard (its
            // drop glue is not inlined): `catch_unwind` returns in every
            // case, so the close always runs.
            self.open_world(held);
            let ran = {
                catch_unwind(AssertUnwindSafe(|| match ev {
                    NetEv::Data(m) => {
                        h.on_data(b, m.conn, m.buf.as_slice());
                        Some(m)
                    }
                    NetEv::Established(c, r, caps) => {
                        h.on_connection_established(b, c, r, caps);
                        None
                    }
                    NetEv::Refused(c, r, why) => {
                        h.on_connection_refused(b, c, r, &why);
                        None
                    }
                    NetEv::Closed(c, r, why, keys) => {
                        h.on_connection_closed(b, c, r, &why, &keys);
                        spent.push(keys);
                        None
                    }
                    NetEv::Completed(c, keys) => {
                        h.on_sends_completed(b, c, keys.as_slice());
                        if let world::Keys::List(keys) = keys {
                            spent.push(keys);
                        }
                        None
                    }
                    NetEv::Timer(token) => {
                        h.on_timer(b, token);
                        None
                    }
                    NetEv::Wake(token) => {
                        h.on_wake(b, token);
                        None
                    }
                }))
            };
            self.close_world(held);
            let w = held.world();
            let retired = w.put_handler(backend, h);
            match ran {
                Ok(Some(m)) => w.recv_done(backend, m),
                Ok(None) => {}
                Err(panic) => {
                    // The message's buffer went with the unwinding.
                    let _open = Open::new(self, held);
                    drop(retired);
                    return Err(panic);
                }
            }
            if let Some(retired) = retired {
                // Its backend was retired during the call (a crash or the
                // world's end).
                let _open = Open::new(self, held);
                drop(retired);
            }
        }
        Ok(())
    }
}

/// The world's mutex as a run of steps holds it.
struct Held<'a> {
    /// The locked mutex; `None` only while user code runs with it unlocked
    /// (or after such code panicked).
    guard: Option<MutexGuard<'a, Slot>>,
    /// Lend the world to callbacks instead of unlocking it (a driver-only
    /// world).
    lend: bool,
}

/// The world open to user code (a callback, or the drop of what one
/// owned) while this lives: lent to the calling thread in a driver-only
/// world, else unlocked; locked again (or given back) when this drops,
/// also when that code unwinds.
struct Open<'h, 'a> {
    sim: &'a Sim,
    held: &'h mut Held<'a>,
}

impl<'h, 'a> Open<'h, 'a> {
    #[inline(always)]
    fn new(sim: &'a Sim, held: &'h mut Held<'a>) -> Self {
        sim.open_world(held);
        Self { sim, held }
    }
}

impl Drop for Open<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.sim.close_world(self.held);
    }
}

impl Sim {
    /// Opens the world to user code (see [`Open`]).
    #[inline(always)]
    fn open_world(&self, held: &mut Held<'_>) {
        if held.lend {
            let g = held.guard.as_mut().expect("the driver holds the world");
            Lending::lend(g, self.id());
        } else {
            let g = held.guard.take().expect("the driver holds the world");
            self.unlock(g);
        }
    }

    /// Ends [`open_world`](Self::open_world): takes the lent world back,
    /// or locks the world again.
    #[inline(always)]
    fn close_world<'a>(&'a self, held: &mut Held<'a>) {
        match &mut held.guard {
            Some(g) => Lending::take_back(g),
            None => held.guard = Some(self.lock_world()),
        }
    }
}

impl Held<'_> {
    #[inline]
    fn world(&mut self) -> &mut World {
        placed(self.guard.as_mut().expect("the driver holds the world"))
    }
}

/// The world in its place in the locked mutex.
#[inline]
pub(crate) fn placed<'a>(g: &'a mut MutexGuard<'_, Slot>) -> &'a mut World {
    g.as_deref_mut()
        .expect("the simulated world is in its place while its driver holds it")
}

/// [`placed`], from the slot itself (as a condition variable hands it).
#[inline]
pub(crate) fn placed_mut_slot(slot: &mut Slot) -> &mut World {
    slot.as_deref_mut()
        .expect("the simulated world is in its place while its driver holds it")
}

/// [`placed`], shared.
#[inline]
fn placed_ref<'a>(g: &'a MutexGuard<'_, Slot>) -> &'a World {
    g.as_deref()
        .expect("the simulated world is in its place while its driver holds it")
}

/// How a [`Sim::drive`] call ended.
pub(crate) struct Driven {
    /// Steps run.
    pub(crate) steps: usize,
    /// It stopped because the host's loop was told to.
    pub(crate) stopped: bool,
    /// It gave way to another thread waiting to drive; more may be due.
    pub(crate) yielded: bool,
}

/// Backend handles a driving call hands to handlers, made once per call
/// and backend instead of once per callback (a handle holds the world's
/// `Arc`); kept by backend index modulo the slots.
#[derive(Default)]
struct Handles {
    slots: [Option<SimBackend>; Handles::SLOTS],
}

impl Handles {
    const SLOTS: usize = 8;

    #[inline]
    fn get(&mut self, sim: &Sim, host: IpAddr, b: world::BackendId) -> &SimBackend {
        let slot = &mut self.slots[b % Self::SLOTS];
        if slot.as_ref().is_none_or(|h| h.index() != b) {
            *slot = Some(SimBackend::from_parts(SimLoop::new(sim.clone(), host), b));
        }
        slot.as_ref().expect("just filled")
    }
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("seed", &self.seed())
            .field("now", &self.now())
            .finish_non_exhaustive()
    }
}

/// A virtual host: an IP address with its own event loop. Cheap to clone.
#[derive(Clone, Debug)]
pub struct SimHost {
    lp: SimLoop,
}

impl SimHost {
    /// The host's address.
    pub fn ip(&self) -> IpAddr {
        self.lp.ip()
    }

    /// The host's event loop; backends created on it run on this host.
    pub fn event_loop(&self) -> &SimLoop {
        &self.lp
    }

    /// The world this host belongs to.
    pub fn sim(&self) -> &Sim {
        self.lp.sim()
    }

    /// Sets what the application does when [`Sim::restart`] brings this
    /// host back: typically make its backends and listeners again (the
    /// ones from before the crash stay dead). Replaces an earlier hook.
    pub fn on_restart(&self, hook: impl FnMut(&SimHost) + Send + 'static) {
        let hook: Box<dyn FnMut(&SimHost) + Send> = Box::new(hook);
        lock(&self.sim().shared.restart_hooks).insert(self.ip(), Arc::new(Mutex::new(hook)));
    }

    /// Creates a backend on this host (same as
    /// [`SimProvider::create`](netio_core::Provider::create) with this
    /// host's loop).
    pub fn backend<H: netio_core::Handler<SimBackend> + 'static>(
        &self,
        config: netio_core::BackendConfig,
        handler: H,
    ) -> Result<SimBackend, netio_core::CreateError> {
        SimBackend::create(&self.lp, config, handler)
    }
}
