//! The example handlers over TCP: the `netio-tcp` provider on the real
//! event loop ([`MioLoop`]), one loop per process, run on the calling
//! thread.
//!
//! - [`serve`]: an [`EchoServer`] listening on an address, its connections
//!   on one shared receive pool where the provider offers it
//!   ([`server_params`]).
//! - [`echo`] and [`pingpong`]: an [`EchoClient`] or a [`PingClient`],
//!   either against a server elsewhere ([`Target::Connect`]) or against an
//!   [`EchoServer`] started on the same loop over 127.0.0.1
//!   ([`Target::Loopback`]).
//!
//! The `*_on` functions do the same on any provider whose backends run on
//! [`MioLoop`] (`netio_libfabric::LibfabricProvider` with the `libfabric`
//! feature); the others use `netio-tcp`.
//!
//! Every run is bounded by an optional time limit; a run that hits it
//! returns with `timed_out` set and whatever was measured so far.
//!
//! ```
//! use std::time::Duration;
//! use netio_examples::tcp::{self, Target};
//!
//! let run = tcp::echo(Target::Loopback, 20, Some(Duration::from_secs(30))).unwrap();
//! assert!(!run.timed_out);
//! assert_eq!((run.report.matched, run.report.mismatched), (20, 0));
//! assert_eq!(run.server.unwrap().echoed, 20);
//! ```

use std::error::Error;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use netio_core::mio_loop::{MioLoop, WeakMioLoop};
use netio_core::{
    Backend, BackendConfig, ConnectionParams, EndpointAddress, EventLoop, Features, Handler,
    Provider, Timer,
};
use netio_tcp::TcpProvider;

use crate::{lock, EchoClient, EchoReport, EchoServer, PingClient, PingReport, ServerStats};

/// Smallest receive limit of the connections these programs open: messages
/// up to this size are always accepted.
pub const MIN_MESSAGE_LIMIT: usize = 64 * 1024;

/// Receive buffers per connection.
const RECV_BUFFERS: usize = 4;

/// Receive buffers of a server listener's shared pool, for all its
/// connections together (see [`server_params`]).
pub const SHARED_RECV_BUFFERS: usize = 32;

/// The connection parameters for messages of up to `max_message` bytes
/// (at least [`MIN_MESSAGE_LIMIT`]): receiving only; replies are sent by
/// copy, which the TCP provider always offers. What clients open.
pub fn params(max_message: usize) -> ConnectionParams {
    ConnectionParams::receive(max_message.max(MIN_MESSAGE_LIMIT), RECV_BUFFERS)
}

/// The parameters of a server's listener on a backend with `features`,
/// for messages of up to `max_message` bytes (at least
/// [`MIN_MESSAGE_LIMIT`]).
///
/// Where the provider offers it (`Features::shared_receive_pool`: TCP,
/// libfabric reliable datagrams), one receive pool of
/// [`SHARED_RECV_BUFFERS`] buffers serves every connection the listener
/// accepts, instead of [`params`]' pool of its own per connection. A
/// server's memory then stays flat as clients come: with per-connection
/// pools each connection held 4 buffers of the message limit (256 KiB at
/// 64 KiB), and 2,000 idle clients took 370–650 MiB; on the shared pool an
/// idle connection costs about 4 KiB (8 MiB for 2,000; one that has
/// received a message also keeps its 64 KiB read buffer). On
/// TCP a pool buffer is taken only by a message longer than the read
/// buffer (64 KiB), while it arrives and until `on_data` returns, so a
/// few dozen buffers serve any number of clients; when all are taken,
/// connections with such a message wait for one (nothing is dropped). A
/// stalled peer cannot keep a shared buffer beyond
/// `TcpConfig::partial_message_timeout`. Providers without shared pools
/// (libfabric connected endpoints) get [`params`].
pub fn server_params(features: Features, max_message: usize) -> ConnectionParams {
    if features.shared_receive_pool {
        ConnectionParams::receive(max_message.max(MIN_MESSAGE_LIMIT), SHARED_RECV_BUFFERS)
            .with_shared_receive()
    } else {
        params(max_message)
    }
}

/// Where a client connects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// To an [`EchoServer`] started on the same loop, on 127.0.0.1 and a
    /// port the system picks.
    Loopback,
    /// To a server at this address.
    Connect(EndpointAddress),
}

/// The outcome of a client run.
#[derive(Debug, Clone)]
pub struct ClientRun<R> {
    /// What the client saw.
    pub report: R,
    /// The address the client connected to.
    pub server_address: EndpointAddress,
    /// What the server did, for [`Target::Loopback`] (where it runs on the
    /// same loop).
    pub server: Option<ServerStats>,
    /// The time limit ran out before the client finished.
    pub timed_out: bool,
    /// Wall-clock time the loop ran, connection setup and teardown
    /// included.
    pub wall: Duration,
}

/// The outcome of [`serve`].
#[derive(Debug, Clone)]
pub struct ServerRun {
    /// The address the server listened on.
    pub address: EndpointAddress,
    /// What it did.
    pub stats: ServerStats,
    /// The time limit ran out before the expected clients had come and
    /// gone.
    pub timed_out: bool,
}

/// Runs `lp` on this thread until it is stopped or `timeout` passes;
/// returns `true` if the time ran out.
fn run_bounded(lp: &MioLoop, timeout: Option<Duration>) -> bool {
    let timed_out = Arc::new(AtomicBool::new(false));
    let timer = timeout.map(|t| {
        let (flag, weak) = (timed_out.clone(), lp.downgrade());
        let timer = lp.timer(move || {
            flag.store(true, Ordering::SeqCst);
            if let Some(lp) = weak.upgrade() {
                lp.stop();
            }
        });
        timer.start(t);
        timer
    });
    lp.run(|| {});
    if let Some(t) = timer {
        t.stop();
    }
    timed_out.load(Ordering::SeqCst)
}

/// Stops the loop once the client is done and, when the server runs on the
/// same loop, once the server has seen each of its connections close.
struct Finish {
    lp: WeakMioLoop,
    client_done: AtomicBool,
    server: Option<Arc<Mutex<ServerStats>>>,
    stopped: AtomicBool,
}

impl Finish {
    fn check(&self) {
        if !self.client_done.load(Ordering::SeqCst) {
            return;
        }
        if let Some(s) = &self.server {
            let s = lock(s);
            if s.closed < s.connections {
                return;
            }
        }
        if !self.stopped.swap(true, Ordering::SeqCst) {
            if let Some(lp) = self.lp.upgrade() {
                lp.stop();
            }
        }
    }
}

/// Creates the client made by `make` (given the callback it calls when it
/// is done), connects it to `target` and runs the loop until it is done.
fn run_client<P, R, H>(
    target: Target,
    max_message: usize,
    timeout: Option<Duration>,
    report: &Arc<Mutex<R>>,
    make: impl FnOnce(Box<dyn FnMut() + Send>) -> H,
) -> Result<ClientRun<R>, Box<dyn Error>>
where
    P: Provider<Loop = MioLoop>,
    R: Clone,
    H: Handler<P::Backend> + 'static,
{
    let lp = MioLoop::new()?;
    let params = params(max_message);
    let stats = Arc::new(Mutex::new(ServerStats::default()));
    let finish = Arc::new(Finish {
        lp: lp.downgrade(),
        client_done: AtomicBool::new(false),
        server: (target == Target::Loopback).then(|| stats.clone()),
        stopped: AtomicBool::new(false),
    });
    let (server, server_address) = match target {
        Target::Loopback => {
            let f = finish.clone();
            let server = P::create(
                &lp,
                BackendConfig::default(),
                EchoServer::with_stats(stats.clone(), move |_| f.check()),
            )?;
            let listen = server_params(server.features(), max_message);
            let addr = server.open_listen_endpoint(EndpointAddress::localhost(0), listen)?;
            (Some(server), addr)
        }
        Target::Connect(addr) => (None, addr),
    };
    let f = finish.clone();
    let client = P::create(
        &lp,
        BackendConfig::default(),
        make(Box::new(move || {
            f.client_done.store(true, Ordering::SeqCst);
            f.check();
        })),
    )?;
    client.open_active_endpoint(server_address, params)?;
    let started = Instant::now();
    let timed_out = run_bounded(&lp, timeout) && !finish.stopped.load(Ordering::SeqCst);
    let wall = started.elapsed();
    drop(client);
    drop(server);
    let report = lock(report).clone();
    let server = finish.server.as_ref().map(|s| lock(s).clone());
    Ok(ClientRun {
        report,
        server_address,
        server,
        timed_out,
        wall,
    })
}

/// Runs an [`EchoClient`] sending `count` messages to `target`.
pub fn echo(
    target: Target,
    count: u64,
    timeout: Option<Duration>,
) -> Result<ClientRun<EchoReport>, Box<dyn Error>> {
    echo_on::<TcpProvider>(target, count, timeout)
}

/// [`echo`] on provider `P`.
pub fn echo_on<P: Provider<Loop = MioLoop>>(
    target: Target,
    count: u64,
    timeout: Option<Duration>,
) -> Result<ClientRun<EchoReport>, Box<dyn Error>> {
    let report = Arc::new(Mutex::new(EchoReport::default()));
    let r = report.clone();
    run_client::<P, _, _>(target, 0, timeout, &report, move |done| {
        EchoClient::new(count, r, done)
    })
}

/// Runs a [`PingClient`] doing `count` round trips of `size`-byte messages
/// with `target`.
pub fn pingpong(
    target: Target,
    count: u64,
    size: usize,
    timeout: Option<Duration>,
) -> Result<ClientRun<PingReport>, Box<dyn Error>> {
    pingpong_on::<TcpProvider>(target, count, size, timeout)
}

/// [`pingpong`] on provider `P`.
pub fn pingpong_on<P: Provider<Loop = MioLoop>>(
    target: Target,
    count: u64,
    size: usize,
    timeout: Option<Duration>,
) -> Result<ClientRun<PingReport>, Box<dyn Error>> {
    let report = Arc::new(Mutex::new(PingReport::default()));
    let r = report.clone();
    run_client::<P, _, _>(target, size, timeout, &report, move |done| {
        PingClient::new(count, size, r, done)
    })
}

/// Runs an [`EchoServer`] on `address` accepting messages of up to
/// `max_message` bytes (at least [`MIN_MESSAGE_LIMIT`]). Calls
/// `on_listening` with the bound address once listening, then serves until
/// `clients` connections have closed (0: until the time runs out) or
/// `timeout` passes.
pub fn serve(
    address: EndpointAddress,
    max_message: usize,
    clients: u64,
    timeout: Option<Duration>,
    on_listening: impl FnOnce(EndpointAddress),
) -> Result<ServerRun, Box<dyn Error>> {
    serve_on::<TcpProvider>(address, max_message, clients, timeout, on_listening)
}

/// [`serve`] on provider `P`.
pub fn serve_on<P: Provider<Loop = MioLoop>>(
    address: EndpointAddress,
    max_message: usize,
    clients: u64,
    timeout: Option<Duration>,
    on_listening: impl FnOnce(EndpointAddress),
) -> Result<ServerRun, Box<dyn Error>> {
    let lp = MioLoop::new()?;
    let stats = Arc::new(Mutex::new(ServerStats::default()));
    let weak = lp.downgrade();
    let server = P::create(
        &lp,
        BackendConfig::default(),
        EchoServer::with_stats(stats.clone(), move |s| {
            if clients != 0 && s.closed >= clients {
                if let Some(lp) = weak.upgrade() {
                    lp.stop();
                }
            }
        }),
    )?;
    let bound =
        server.open_listen_endpoint(address, server_params(server.features(), max_message))?;
    on_listening(bound);
    let timed_out = run_bounded(&lp, timeout);
    let stats = lock(&stats).clone();
    drop(server);
    Ok(ServerRun {
        address: bound,
        timed_out: timed_out && clients != 0 && stats.closed < clients,
        stats,
    })
}
