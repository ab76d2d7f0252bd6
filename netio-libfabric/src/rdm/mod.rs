//! The reliable-datagram (`FI_EP_RDM`) connection manager behind
//! [`LibfabricBackend`](crate::LibfabricBackend).
//!
//! One fabric endpoint, completion queue and address vector serve every
//! connection of the backend. A connection is a TCP control channel
//! between the two processes (set-up with the fabric addresses, refusal,
//! credits, close, heartbeats: [`proto`]) plus the data messages, sent over
//! the fabric endpoint as tagged messages whose tag names the receiving
//! connection. The receiver grants the sender one credit per receive
//! buffer it posts, so the fabric never has to hold a message nobody
//! posted a buffer for.

pub(crate) mod proto;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::Interest;
use netio_core::ledger::SendLedger;
use netio_core::mio_loop::{MioLoop, MioTimer, SourceId, SpinId};
use netio_core::{
    BackendConfig, BufferError, BufferPool, Capabilities, CloseError, CloseReason, ConnError,
    ConnId, ConnTable, ConnectionParams, CreateError, EndpointAddress, EventLoop, Handler,
    MemoryUsage, NetworkBuffer, OpenActiveError, OpenListenError, RefuseReason, RegionSlice,
    SendError, ThreadSafety, Timer,
};

use crate::backend::{Kind, LibfabricBackend, Ops};
use crate::config::LibfabricConfig;
use crate::events::{self, lock, Budget, Ev, UserTimers, DELIVER_CLOCK_EVERY, SPIN_READS};
use crate::ffi::{Domain, FiError, Info, PostError};
use crate::ffi::{FastMap, RecvMem};
use crate::rdm_ffi::{BufferMr, Held, Polled, RdmCompletion, RdmEp, RegionMr, Staged};
use proto::{Decoder, Frame, Session};

/// How often heartbeats, liveness and set-up deadlines are looked at.
const TICK: Duration = Duration::from_millis(50);
/// How long a peer's close waits for the data it announced, before the
/// close is reported anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// How long the last bytes of a closed connection's control channel (its
/// CLOSE frame) may take to be written.
const FLUSH_WAIT: Duration = Duration::from_secs(2);
/// How often sends the provider could not take yet are retried on a loop
/// that does not busy poll.
const POLL: Duration = Duration::from_micros(500);
/// How long the completion queue is polled after a connection was set up
/// or closed (see `State::poll_until`).
const SETUP_POLL: Duration = Duration::from_secs(2);
/// How long the progress thread keeps yielding after the last completion
/// before it starts to sleep.
const PROGRESS_SPIN: Duration = Duration::from_micros(200);
/// The longest the progress thread sleeps between reads of an idle queue.
const PROGRESS_SLEEP: Duration = Duration::from_millis(1);
/// How often the stall guard of a busy-polling loop (see
/// [`RdmInner::spawn_stall_guard`]) looks whether the loop spun.
const STALL_CHECK: Duration = Duration::from_millis(1);
/// Heartbeat interval without a peer timeout.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// The tag bit of set-up probes (see [`RdmInner::send_probe`]): above
/// every data tag, whose connection tags stay below 2^31.
const PROBE_BIT: u64 = 1 << 47;
/// The tag bits a data receive ignores: the sender's grant, and the probe
/// bit (a receiving side takes the peer's probe into a data buffer and
/// posts it again at once; see [`RdmInner::send_probe`]).
const DATA_IGNORE: u64 = proto::RECV_IGNORE | PROBE_BIT;
/// Marks the probe operations' owner (the connection tag below it).
const PROBE_OWNER: u64 = 1 << 32;
/// Connection tags stay below this (see [`PROBE_BIT`]).
const TAG_LIMIT: u32 = 1 << 31;
/// A connection tag is a receive pool's number (0: the connection's own
/// buffers) above this many bits of connection index.
const POOL_SHIFT: u32 = 20;
/// Marks the receive operations of a shared pool (its number below it).
const POOL_OWNER: u64 = 1 << 33;
/// The receive queue size an RDM endpoint asks for (all connections'
/// receive buffers are posted on it) when `LibfabricConfig::rx_size` does
/// not say.
const RDM_RX_QUEUE: usize = 16384;
/// How many times the queue is read again when `fi_trywait` says events
/// are pending, before the rest is left to a posted callback.
const TRYWAIT_ROUNDS: usize = 16;

/// What one read of the completion queue found
/// ([`RdmInner::read_cq_one`]).
enum CqRead {
    Nothing,
    /// Completions, handled.
    Some,
    /// One message of connection `.0` in buffer `.1`, `.2` bytes, of
    /// receive memory `.3`, to be delivered by the caller.
    One(ConnId, usize, usize, Arc<RecvMem>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Established,
}

/// A send accepted but not yet handed to the fabric (no credit yet).
struct Backlogged {
    seq: netio_core::ledger::SendSeq,
    staged: Staged,
}

struct Conn {
    stream: TcpStream,
    source: Option<SourceId>,
    /// Control bytes not written yet.
    out: Vec<u8>,
    decoder: Decoder,
    session: Session,
    phase: Phase,
    initiator: bool,
    remote: EndpointAddress,
    listener: Option<EndpointAddress>,
    caps: Capabilities,
    /// This side's connection tag (the peer's messages carry it).
    tag: u32,
    /// The peer's fabric address handle, once known.
    peer: Option<u64>,
    recv: Option<Arc<RecvMem>>,
    receive: bool,
    recv_limit: usize,
    paused: bool,
    /// Received messages not yet delivered: buffer index and length.
    held: VecDeque<(usize, usize)>,
    /// Buffers waiting to be posted again (while paused).
    unposted: Vec<usize>,
    pending_close: Option<CloseReason>,
    deliver_queued: bool,
    /// A `Drain` event is queued: completed sends wait for it.
    drain_queued: bool,
    /// Sends marked done since the last `Drain` was queued.
    done_pending: bool,
    /// `deliver` is handing this connection's messages over: sends
    /// completed meanwhile are reported by it, right after the `on_data`
    /// that made them, instead of by a `Drain` event.
    delivering: bool,
    /// While `on_data` runs for one of its messages: whether a send made
    /// meanwhile granted that message's buffer early
    /// ([`Session::on_send_freeing`]); the buffer is then posted again
    /// as soon as `on_data` returns, paused or not.
    early_grant: Option<bool>,
    /// Each send's memory (none for an injected one).
    ledger: SendLedger<Option<Held>>,
    backlog: VecDeque<Backlogged>,
    pools: Vec<BufferPool>,
    buffer_mrs: HashMap<usize, Arc<BufferMr>>,
    region: Option<Arc<RegionMr>>,
    order: u64,
    opened_at: Duration,
    /// The peer's CLOSE: why, and when it came.
    peer_closing: Option<(CloseReason, Duration)>,
    /// The initiator's set-up probe: `Some(false)` waiting to be sent,
    /// `Some(true)` sent and not completed.
    probe: Option<bool>,
    /// The peer's connection tag, once known.
    peer_tag: u32,
    /// Sends handed to the fabric and not completed.
    in_flight: usize,
    /// The shared receive pool the connection's messages land in, if any
    /// (its buffers are then `recv`).
    pool: Option<u32>,
}

/// A shared receive pool: buffers posted for every connection whose tag
/// carries the pool's number.
struct Pool {
    mem: Arc<RecvMem>,
    /// The largest message a connection of the pool takes.
    limit: usize,
    /// The listener it serves (`None`: the backend-wide pool).
    listener: Option<EndpointAddress>,
}

/// A connection accepted on a listener whose HELLO has not arrived.
struct Pending {
    stream: TcpStream,
    source: Option<SourceId>,
    listener: EndpointAddress,
    remote: EndpointAddress,
    decoder: Decoder,
    since: Duration,
}

/// A closed connection's control channel with bytes still to write.
struct Flushing {
    stream: TcpStream,
    out: Vec<u8>,
    deadline: Duration,
}

struct Listener {
    socket: TcpListener,
    source: Option<SourceId>,
    params: ConnectionParams,
    /// The listener's own shared receive pool.
    pool: Option<u32>,
}

impl events::Queued for State {
    fn queue(&mut self) -> (&mut VecDeque<Ev>, &mut bool) {
        (&mut self.events, &mut self.dispatching)
    }
}

#[derive(Default)]
struct State {
    ep: Option<RdmEp>,
    /// Scratch list of the connections a completion read concerned.
    touched: Vec<ConnId>,
    /// Scratch list of the completions one read returned.
    completions: Vec<RdmCompletion>,
    /// The loop's time at the last completion read that found anything.
    read_at: Duration,
    ep_source: Option<SourceId>,
    listeners: HashMap<EndpointAddress, Listener>,
    conns: ConnTable<Conn>,
    /// Shared receive pools by number (from 1).
    pools: HashMap<u32, Pool>,
    next_pool: u32,
    /// The backend-wide pool's number, once made.
    backend_pool: Option<u32>,
    by_tag: FastMap<u32, ConnId>,
    next_tag: u32,
    pending: HashMap<u64, Pending>,
    next_pending: u64,
    flushing: Vec<Flushing>,
    events: VecDeque<Ev>,
    dispatch_posted: bool,
    /// The loop thread is handing events over (`RdmInner::run_dispatch`):
    /// an event queued meanwhile is taken by that dispatch, which clears
    /// this under the lock when it finds the queue empty, so none is
    /// posted.
    dispatching: bool,
    next_order: u64,
    ticking: bool,
    polling: bool,
    /// The poll timer runs until then at least: connections are being set
    /// up, and a fabric provider whose connection manager progresses only
    /// while its queue is read (`verbs;ofi_rxm`) may have nothing for the
    /// queue's fd to report meanwhile.
    poll_until: Duration,
    /// Connections with sends the provider answered `-FI_EAGAIN` (while
    /// it connects to a new peer, or its queue is full).
    blocked: Vec<ConnId>,
}

pub(crate) struct RdmInner {
    lp: MioLoop,
    config: BackendConfig,
    lf: LibfabricConfig,
    /// Rounds of reads of an empty queue per spin ([`events::spin_rounds`]).
    spin_rounds: u32,
    handler: Mutex<Box<dyn Handler<LibfabricBackend>>>,
    state: Mutex<State>,
    shared_send: Option<BufferPool>,
    weak: Weak<RdmInner>,
    timers: UserTimers,
    tick_timer: MioTimer,
    /// Reads the completion queue every [`POLL`] where it has no wait fd,
    /// and retries sends the provider answered `-FI_EAGAIN`.
    poll_timer: MioTimer,
    spin: Option<SpinId>,
    /// Spins so far, counted by the spin callback (the loop thread alone
    /// writes it) for the stall guard.
    spins: AtomicU64,
    refused: AtomicU64,
    /// Tells the progress thread (see [`RdmInner::spawn_progress`]) to end.
    stop_progress: Arc<AtomicBool>,
    /// Registrations of the endpoint's domain (kept after it closes).
    domain: Mutex<Option<Arc<Domain>>>,
}

impl Drop for RdmInner {
    fn drop(&mut self) {
        self.stop_progress.store(true, Ordering::Release);
        if let Some(spin) = self.spin.take() {
            self.lp.remove_spin(spin);
        }
        let st = match self.state.get_mut() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        for (_, mut l) in st.listeners.drain() {
            if let Some(src) = l.source.take() {
                let _ = self.lp.deregister(&mut l.socket, src);
            }
        }
        for (_, mut p) in st.pending.drain() {
            if let Some(src) = p.source.take() {
                let _ = self.lp.deregister(&mut p.stream, src);
            }
        }
        for (_, mut c) in st.conns.drain() {
            if let Some(src) = c.source.take() {
                let _ = self.lp.deregister(&mut c.stream, src);
            }
        }
        if let (Some(fd), Some(src)) = (st.ep.as_ref().and_then(|e| e.fd()), st.ep_source.take()) {
            let _ = self.lp.deregister(&mut SourceFd(&fd), src);
        }
        // The endpoint closes (and frees what its operations held) with
        // the state.
    }
}

fn socket_addr(a: EndpointAddress) -> SocketAddr {
    SocketAddr::new(a.ip(), a.port())
}

/// A libfabric error with the fabric provider it concerns.
#[derive(Debug)]
struct FabricError {
    provider: String,
    error: FiError,
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "libfabric provider `{}` (reliable-datagram endpoint): {}",
            self.provider, self.error
        )?;
        if self.error.call == "fi_getinfo" && self.error.errno == netio_libfabric_sys::FI_ENODATA {
            f.write_str(
                " (unknown provider name, or one without FI_EP_RDM, FI_TAGGED and \
                 in-order sends on this machine)",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for FabricError {}

/// The keys of ended sends, and their memory to release when they are
/// reported.
fn split_ended(ended: Vec<(u64, Option<Held>)>) -> (Vec<u64>, Vec<Option<Held>>) {
    ended.into_iter().unzip()
}

/// The CLOSE reason telling the peer about a close for `reason`.
fn close_code(reason: &CloseReason) -> (proto::CloseCode, u64, u64) {
    match reason {
        CloseReason::ListenerClosed => (proto::CloseCode::ListenerClosed, 0, 0),
        CloseReason::MessageTooLarge { size, limit } => {
            (proto::CloseCode::TooLarge, *size, *limit as u64)
        }
        CloseReason::Protocol(_) => (proto::CloseCode::Protocol, 0, 0),
        _ => (proto::CloseCode::Orderly, 0, 0),
    }
}

impl RdmInner {
    pub(crate) fn create<H: Handler<LibfabricBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        lf: LibfabricConfig,
        handler: H,
    ) -> Result<LibfabricBackend, CreateError> {
        // The fabric provider must offer reliable datagrams here: checked
        // now, so that a missing one is a creation error.
        Info::get_rdm(&lf.provider, lf.domain.as_deref(), None, None)
            .or_else(|_| {
                Info::get_rdm(
                    &lf.provider,
                    lf.domain.as_deref(),
                    Some(IpAddr::from([127, 0, 0, 1])),
                    None,
                )
            })
            .map_err(|error| {
                CreateError::Failed(Box::new(FabricError {
                    provider: lf.provider.clone(),
                    error,
                }))
            })?;
        let shared_send = config
            .shared_send_pool
            .map(|p| BufferPool::new(p.buf_size, p.num_buf));
        let lp = event_loop.clone();
        let inner = Arc::new_cyclic(|weak: &Weak<RdmInner>| {
            let user_timer = events::timer_to(&lp, weak, RdmInner::on_user_timer);
            let tick_timer = events::timer_to(&lp, weak, RdmInner::on_tick);
            let poll_timer = events::timer_to(&lp, weak, RdmInner::on_poll);
            let spin = events::spin_to(&lp, weak, RdmInner::spin_owned);
            RdmInner {
                lp,
                config,
                spin_rounds: events::spin_rounds(&lf),
                lf,
                handler: Mutex::new(Box::new(handler)),
                state: Mutex::new(State {
                    next_tag: 1,
                    ..State::default()
                }),
                shared_send,
                weak: weak.clone(),
                timers: UserTimers::new(user_timer),
                tick_timer,
                poll_timer,
                spin,
                spins: AtomicU64::new(0),
                refused: AtomicU64::new(0),
                stop_progress: Arc::new(AtomicBool::new(false)),
                domain: Mutex::new(None),
            }
        });
        Ok(LibfabricBackend {
            kind: Kind::Rdm(inner),
        })
    }

    pub(crate) fn fmt_debug(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("LibfabricBackend")
            .field("endpoint", &"rdm")
            .field("provider", &self.lf.provider)
            .field("listeners", &st.listeners.len())
            .field("connections", &st.conns.len())
            .finish()
    }

    pub(crate) fn event_loop(&self) -> &MioLoop {
        &self.lp
    }

    pub(crate) fn libfabric_config(&self) -> &LibfabricConfig {
        &self.lf
    }

    pub(crate) fn refused_connections(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    pub(crate) fn memory_registrations(&self) -> u64 {
        lock(&self.domain).as_ref().map_or(0, |d| d.registrations())
    }

    fn backend(&self) -> LibfabricBackend {
        LibfabricBackend {
            kind: Kind::Rdm(
                self.weak
                    .upgrade()
                    .expect("backend alive while dispatching"),
            ),
        }
    }

    fn thread_ok(&self) -> bool {
        self.config.thread_safety == ThreadSafety::Safe || self.lp.on_loop_thread()
    }

    fn provider_error(&self, error: FiError) -> FabricError {
        FabricError {
            provider: self.lf.provider.clone(),
            error,
        }
    }

    /// Opens the backend's fabric endpoint if it is not open yet, on the
    /// interface of `near` where the fabric provider takes addresses.
    fn ensure_ep(&self, st: &mut State, near: Option<IpAddr>) -> Result<(), FiError> {
        if st.ep.is_some() {
            return Ok(());
        }
        let near = near.filter(|ip| !ip.is_unspecified());
        // Every connection's receive buffers are posted on the one
        // endpoint: its receive queue is asked to be as large as
        // `rx_size` (default RDM_RX_QUEUE); a provider that cannot is
        // asked again for its own default.
        let want = Some(self.lf.rx_size.unwrap_or(RDM_RX_QUEUE));
        let (prov, dom) = (&self.lf.provider, self.lf.domain.as_deref());
        let get = |node: Option<IpAddr>| {
            Info::get_rdm(prov, dom, node, want).or_else(|_| Info::get_rdm(prov, dom, node, None))
        };
        let info = match near {
            Some(ip) => get(Some(ip)).or_else(|_| get(None)),
            None => get(None),
        }?;
        let domain = Domain::open(&info)?;
        let ep = RdmEp::open(
            &domain,
            info,
            self.lf.cq_size.max(1024),
            self.spin.is_none(),
        )?;
        if let Some(fd) = ep.fd() {
            let w = self.weak.clone();
            let src = self
                .lp
                .register(&mut SourceFd(&fd), Interest::READABLE, move |_| {
                    if let Some(i) = w.upgrade() {
                        i.on_cq();
                    }
                })
                .map_err(|e| FiError {
                    call: "registering the completion queue's fd",
                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                })?;
            st.ep_source = Some(src);
        }
        let progress = ep.fd().is_none() && self.spin.is_none();
        *lock(&self.domain) = Some(Arc::clone(&domain));
        st.ep = Some(ep);
        if progress {
            self.spawn_progress()?;
        } else if self.spin.is_some() {
            self.spawn_stall_guard()?;
        }
        Ok(())
    }

    /// On a busy-polling loop, starts the thread that reads the completion
    /// queue while the loop does not spin: stalled in a handler or a
    /// posted closure, or not running. Every [`STALL_CHECK`] it looks at
    /// the spin count; when it has not moved since the last look, it reads
    /// the queue as the progress thread does (again at once while the reads
    /// find something). A peer's sends that complete only when this
    /// process reads its queue (`shm`'s larger messages, `udp;ofi_rxd`)
    /// then complete while the loop is held up, as they do on a loop that
    /// sleeps; a loop that spins pays one relaxed store per spin.
    fn spawn_stall_guard(&self) -> Result<(), FiError> {
        self.spawn_reader(
            "netio-lf-stall",
            "starting the completion queue's stall guard",
            |weak, stop| {
                let mut seen = None;
                let mut nap = STALL_CHECK;
                while !stop.load(Ordering::Acquire) {
                    if nap.is_zero() {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(nap);
                    }
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    let spins = inner.spins.load(Ordering::Relaxed);
                    let stalled = seen == Some(spins);
                    seen = Some(spins);
                    nap = if stalled && inner.progress_once() {
                        Duration::ZERO
                    } else {
                        STALL_CHECK
                    };
                }
            },
        )
    }

    /// Starts thread `name`, which runs `body` with this backend's weak
    /// handle and the flag that tells it to end; `call` names the start in
    /// the error when the thread cannot be started.
    fn spawn_reader(
        &self,
        name: &str,
        call: &'static str,
        body: fn(Weak<RdmInner>, Arc<AtomicBool>),
    ) -> Result<(), FiError> {
        let weak = self.weak.clone();
        let stop = Arc::clone(&self.stop_progress);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || body(weak, stop))
            .map(|_| ())
            .map_err(|e| FiError {
                call,
                errno: e.raw_os_error().unwrap_or(libc::EAGAIN),
            })
    }

    /// Starts the thread that reads a completion queue without a wait fd
    /// (`shm`, `udp;ofi_rxd`) on a loop that does not busy poll: it reads
    /// the queue under the state lock (as the loop would on readiness),
    /// queues what it found for the loop and wakes it, and backs off while
    /// nothing happens (yielding for [`PROGRESS_SPIN`] after the last
    /// completion, then sleeping up to [`PROGRESS_SLEEP`]). Handlers still
    /// run on the loop only. It also keeps providers whose sends complete
    /// only when the receiving process reads its queue (`udp;ofi_rxd`)
    /// going while the loop is busy in a handler.
    fn spawn_progress(&self) -> Result<(), FiError> {
        self.spawn_reader(
            "netio-lf-progress",
            "starting the completion queue's progress thread",
            |weak, stop| {
                let mut last = std::time::Instant::now();
                let mut nap = Duration::from_micros(20);
                while !stop.load(Ordering::Acquire) {
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    let active = inner.progress_once();
                    drop(inner);
                    if active {
                        last = std::time::Instant::now();
                        nap = Duration::from_micros(20);
                        continue;
                    }
                    if last.elapsed() < PROGRESS_SPIN {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(nap);
                        nap = (nap * 2).min(PROGRESS_SLEEP);
                    }
                }
            },
        )
    }

    /// One read of the completion queue from the progress thread; `true`
    /// if it held anything.
    fn progress_once(&self) -> bool {
        let mut st = lock(&self.state);
        let now = self.lp.now();
        let any = self.read_cq(&mut st, now);
        if !st.blocked.is_empty() {
            self.retry_blocked(&mut st);
        }
        self.post_dispatch(&mut st);
        any
    }

    fn post_with(&self, f: impl FnOnce(&Arc<RdmInner>) + Send + 'static) {
        let w = self.weak.clone();
        self.lp.post(move || {
            if let Some(i) = w.upgrade() {
                f(&i);
            }
        });
    }

    fn post_dispatch(&self, st: &mut State) {
        if !st.dispatch_posted && !st.dispatching && !st.events.is_empty() {
            st.dispatch_posted = true;
            self.post_with(|i| {
                lock(&i.state).dispatch_posted = false;
                i.dispatch();
            });
        }
    }

    fn start_tick(&self, st: &mut State) {
        // Called as connections are set up (and closed).
        st.poll_until = st.poll_until.max(self.lp.now() + SETUP_POLL);
        if !st.ticking {
            st.ticking = true;
            self.tick_timer.start(TICK);
        }
        self.start_poll(st);
    }

    /// Starts the poll timer when sends are to be retried or connections
    /// are being set up (a queue without a wait fd has the progress
    /// thread instead).
    fn start_poll(&self, st: &mut State) {
        // The flags first: the clock is read only when the timer may start.
        if st.polling || self.spin.is_some() {
            return;
        }
        if !st.blocked.is_empty() || self.lp.now() < st.poll_until {
            st.polling = true;
            self.poll_timer.start(POLL);
        }
    }

    fn on_poll(&self) {
        let mut st = lock(&self.state);
        let now = self.lp.now();
        self.read_cq(&mut st, now);
        self.retry_blocked(&mut st);
        if st.blocked.is_empty() && self.lp.now() >= st.poll_until {
            st.polling = false;
            self.poll_timer.stop();
        }
        self.post_dispatch(&mut st);
    }

    fn retry_blocked(&self, st: &mut State) {
        for id in std::mem::take(&mut st.blocked) {
            if st.conns.get(id).is_some_and(|c| c.probe == Some(false)) {
                self.send_probe(st, id);
            } else {
                self.flush_backlog(st, id);
            }
        }
    }

    /// Ends every receive posted for connection tag `tag`.
    fn cancel_tag(st: &mut State, tag: u32) {
        if let Some(ep) = st.ep.as_mut() {
            ep.cancel_recvs(tag as u64);
            ep.cancel_recvs(PROBE_OWNER | tag as u64);
        }
    }

    /// Posts again a data buffer the peer's probe took.
    fn repost_probe_buffer(&self, st: &mut State, id: ConnId, index: usize) {
        let State { ep, conns, .. } = &mut *st;
        let (Some(ep), Some(c)) = (ep.as_mut(), conns.get_mut(id)) else {
            return;
        };
        let Some(mem) = c.recv.clone() else {
            return;
        };
        if let Err(e) = ep.post_recv(
            &mem,
            index,
            proto::recv_tag(c.tag),
            DATA_IGNORE,
            c.tag as u64,
        ) {
            self.close_conn(st, id, CloseReason::Other(e.to_string()), true);
        }
    }

    /// Posts the receive of the peer's set-up probe on a listening side
    /// without receive buffers.
    fn post_probe_recv(st: &mut State, tag: u32) -> Result<(), FiError> {
        let ep = st.ep.as_mut().expect("endpoint open");
        let mem = RecvMem::new(ep.domain(), 1, 1)?;
        ep.post_recv(
            &mem,
            0,
            PROBE_BIT | proto::recv_tag(tag),
            proto::RECV_IGNORE,
            PROBE_OWNER | tag as u64,
        )
    }

    /// Sends the initiator's set-up probe: an empty message to the peer's
    /// probe receive. Fabric providers set up their own connection to a
    /// peer on the first message (`tcp;ofi_rxm`, `shm`), and that needs the
    /// peer to read its completion queue; the probe makes that happen
    /// during set-up, while both sides are reading, and the initiator
    /// reports the connection established when it completed. Without it a
    /// first send to a peer whose loop is busy would not complete.
    fn send_probe(&self, st: &mut State, id: ConnId) {
        let State {
            ep, conns, blocked, ..
        } = &mut *st;
        let (Some(ep), Some(c)) = (ep.as_mut(), conns.get_mut(id)) else {
            return;
        };
        let Some(dest) = c.peer else {
            return;
        };
        let staged = match ep.stage_copy(&[], &[]) {
            Ok(s) => s,
            Err(e) => {
                self.refuse_conn(st, id, RefuseReason::Other(e.to_string()));
                return;
            }
        };
        let tag = PROBE_BIT | proto::recv_tag(c.peer_tag);
        match ep.post(dest, tag, PROBE_OWNER | c.tag as u64, None, staged) {
            Ok(()) => {
                c.probe = Some(true);
                // Both sides' queues are read while the probe goes through.
                st.poll_until = st.poll_until.max(self.lp.now() + SETUP_POLL);
                self.start_poll(st);
            }
            Err((PostError::Again, _)) => {
                c.probe = Some(false);
                if !blocked.contains(&id) {
                    blocked.push(id);
                }
                self.start_poll(st);
            }
            Err((PostError::Failed(e), _)) => {
                self.refuse_conn(st, id, RefuseReason::Other(e.to_string()));
            }
        }
    }

    fn send_pool_for(&self, params: &ConnectionParams) -> Option<BufferPool> {
        if params.send_buffered.num_buf > 0 {
            Some(BufferPool::new(
                params.send_buffered.buf_size,
                params.send_buffered.num_buf,
            ))
        } else {
            self.shared_send.clone()
        }
    }

    fn heartbeat(&self) -> Duration {
        match self.config.peer_timeout {
            Some(t) => (t / 4).max(Duration::from_millis(10)),
            None => HEARTBEAT,
        }
    }

    /// A connection tag unused now: on shared pool `pool`'s number, or
    /// on 0 for a connection with buffers of its own.
    fn new_tag(st: &mut State, pool: Option<u32>) -> u32 {
        let base = pool.unwrap_or(0) << POOL_SHIFT;
        loop {
            let index = st.next_tag;
            st.next_tag = (st.next_tag + 1) % (1 << POOL_SHIFT);
            st.next_tag = st.next_tag.max(1);
            let t = base | index;
            if !st.by_tag.contains_key(&t) {
                return t;
            }
        }
    }

    /// The pool a connection opened with `params` takes its buffers from:
    /// the listener's (`listener`) or the backend's, made at first use.
    fn pool_for(
        &self,
        st: &mut State,
        params: &ConnectionParams,
        listener: Option<EndpointAddress>,
    ) -> Result<Option<u32>, FiError> {
        if !params.recv.use_shared_pool {
            return Ok(None);
        }
        if let Some(p) = listener
            .and_then(|l| st.listeners.get(&l))
            .and_then(|l| l.pool)
        {
            return Ok(Some(p));
        }
        if let Some(p) = st.backend_pool {
            return Ok(Some(p));
        }
        let Some(spec) = self.config.shared_receive_pool else {
            return Ok(None);
        };
        let p = self.new_pool(st, spec.buf_size, spec.num_buf, None)?;
        st.backend_pool = Some(p);
        Ok(Some(p))
    }

    /// Makes a shared pool of `count` buffers of `size` bytes, all posted.
    fn new_pool(
        &self,
        st: &mut State,
        size: usize,
        count: usize,
        listener: Option<EndpointAddress>,
    ) -> Result<u32, FiError> {
        st.next_pool += 1;
        let id = st.next_pool;
        if id >= TAG_LIMIT >> POOL_SHIFT {
            return Err(FiError {
                call: "shared receive pool (too many pools on this backend)",
                errno: netio_libfabric_sys::FI_ENOSPC,
            });
        }
        let ep = st.ep.as_mut().expect("endpoint open");
        let mem = RecvMem::new(ep.domain(), size + 1, count)?;
        for i in 0..count {
            if let Err(e) = Self::post_pool_buffer(ep, &mem, id, i) {
                ep.cancel_recvs(POOL_OWNER | id as u64);
                return Err(e);
            }
        }
        st.pools.insert(
            id,
            Pool {
                mem,
                limit: size,
                listener,
            },
        );
        Ok(id)
    }

    /// Posts buffer `index` of pool `id`: it takes a message of any
    /// connection of the pool.
    fn post_pool_buffer(
        ep: &mut RdmEp,
        mem: &Arc<RecvMem>,
        id: u32,
        index: usize,
    ) -> Result<(), FiError> {
        let connections = ((1u64 << POOL_SHIFT) - 1) << 16;
        ep.post_recv(
            mem,
            index,
            proto::recv_tag(id << POOL_SHIFT),
            DATA_IGNORE | connections,
            POOL_OWNER | id as u64,
        )
    }

    /// Gives buffers of pool `id` back to it.
    fn refill_pool(&self, st: &mut State, id: u32, indices: impl IntoIterator<Item = usize>) {
        let State { ep, pools, .. } = &mut *st;
        let (Some(ep), Some(pool)) = (ep.as_mut(), pools.get(&id)) else {
            return;
        };
        for i in indices {
            // A failure leaves the pool one buffer smaller; nothing else
            // depends on it.
            let _ = Self::post_pool_buffer(ep, &pool.mem, id, i);
        }
    }

    /// Receive memory for `params`, every buffer posted on the endpoint
    /// for `tag`; `None` for a side without receive capability (it
    /// announces none, and a peer that sends to it anyway closes the
    /// connection with a protocol error).
    fn open_receive(
        &self,
        st: &mut State,
        params: &ConnectionParams,
        tag: u32,
    ) -> Result<Option<Arc<RecvMem>>, FiError> {
        if let Some(pool) = st.pools.get(&(tag >> POOL_SHIFT)) {
            return Ok(Some(Arc::clone(&pool.mem)));
        }
        if params.recv.num_buf == 0 {
            return Ok(None);
        }
        // The sender checks sizes against the announced one; the receive
        // buffers hold one byte more, so that a peer that sends one byte
        // too many anyway is caught with the message's exact size.
        let (size, count) = (params.recv.buf_size + 1, params.recv.num_buf);
        let ep = st.ep.as_mut().expect("endpoint open");
        let mem = RecvMem::new(ep.domain(), size, count)?;
        for i in 0..count {
            if let Err(e) = ep.post_recv(&mem, i, proto::recv_tag(tag), DATA_IGNORE, tag as u64) {
                ep.cancel_recvs(tag as u64);
                let full = e.errno == netio_libfabric_sys::FI_EAGAIN
                    || e.errno == netio_libfabric_sys::FI_ENOMEM;
                return Err(if full {
                    FiError {
                        call: "fi_trecv (the endpoint's receive queue, shared by every \
                               connection of the backend, is full: fewer receive buffers per \
                               connection, or a larger LibfabricConfig::rx_size)",
                        ..e
                    }
                } else {
                    e
                });
            }
        }
        Ok(Some(mem))
    }

    fn local(&self, st: &State, tag: u32, params: &ConnectionParams) -> proto::Local {
        // A connection of a shared pool may send as many messages as the
        // pool holds.
        let (buf_size, credits) = match st.pools.get(&(tag >> POOL_SHIFT)) {
            Some(p) => (p.limit, p.mem.count()),
            None => (params.recv.buf_size, params.recv.num_buf),
        };
        proto::Local {
            tag,
            buf_size: buf_size as u64,
            credits: credits as u32,
            fabric: self.lf.provider.clone(),
            addr: st
                .ep
                .as_ref()
                .map(|e| e.name().to_vec())
                .unwrap_or_default(),
            // The peer writes at least every heartbeat (a PING when it has
            // nothing else to say), looked at every TICK: counting the
            // timeout from the last sign of life plus both, a connection
            // closes no earlier than `peer_timeout` after the peer went
            // silent.
            peer_timeout: self
                .config
                .peer_timeout
                .map(|t| t.saturating_add(self.heartbeat()).saturating_add(TICK)),
            heartbeat: self.heartbeat(),
        }
    }

    fn register_stream(
        &self,
        stream: &mut TcpStream,
        f: impl FnMut(&Arc<RdmInner>, &mio::event::Event) + Send + 'static,
    ) -> io::Result<SourceId> {
        let w = self.weak.clone();
        let mut f = f;
        self.lp
            .register(stream, Interest::READABLE | Interest::WRITABLE, move |ev| {
                if let Some(i) = w.upgrade() {
                    f(&i, ev);
                }
            })
    }

    // -- control channel ----------------------------------------------------

    /// Writes what the connection's control channel has queued; `false`
    /// if the channel failed.
    fn flush(c: &mut Conn) -> bool {
        while !c.out.is_empty() {
            match c.stream.write(&c.out) {
                Ok(0) => return false,
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }

    /// Queues the control frames the session wants to send and writes.
    fn pump(&self, st: &mut State, id: ConnId) {
        self.pump_at(st, id, self.lp.now());
    }

    /// [`pump`](Self::pump) at time `now` (the session uses it only to
    /// space its pings: a `now` in the past makes a ping later, never
    /// earlier, and the tick sends the pings that are due).
    fn pump_at(&self, st: &mut State, id: ConnId, now: Duration) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        // Most calls (one per message delivered) have nothing to write.
        if c.out.is_empty() && !c.session.frame_due(now) {
            return;
        }
        while let Some(f) = c.session.poll_frame(now) {
            f.encode(&mut c.out);
        }
        if !Self::flush(c) {
            self.close_after_held(st, id, CloseReason::Reset);
        }
    }

    fn on_stream(&self, id: ConnId, ev: &mio::event::Event) {
        let mut st = lock(&self.state);
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if c.phase == Phase::Opening && c.initiator && ev.is_writable() {
            // The TCP connection finished opening (or failed).
            match c.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => {
                    let why = match e.kind() {
                        io::ErrorKind::ConnectionRefused => RefuseReason::Refused,
                        _ => match e.raw_os_error() {
                            Some(libc::ENETUNREACH) | Some(libc::EHOSTUNREACH) => {
                                RefuseReason::Unreachable
                            }
                            _ => RefuseReason::Other(e.to_string()),
                        },
                    };
                    self.refuse_conn(&mut st, id, why);
                    self.post_dispatch(&mut st);
                    return;
                }
            }
        }
        if !Self::flush(c) {
            self.stream_ended(&mut st, id, true);
            self.post_dispatch(&mut st);
            return;
        }
        let mut buf = [0u8; 16 * 1024];
        let mut eof = false;
        let mut broken = false;
        while let Some(c) = st.conns.get_mut(id) {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    c.decoder.push(&buf[..n]);
                    if !self.handle_frames(&mut st, id) {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    broken = true;
                    break;
                }
            }
        }
        if eof || broken {
            self.stream_ended(&mut st, id, broken);
        } else {
            self.pump(&mut st, id);
        }
        self.post_dispatch(&mut st);
    }

    /// The control channel ended (end of stream, or an error).
    fn stream_ended(&self, st: &mut State, id: ConnId, broken: bool) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if let Some(src) = c.source.take() {
            let _ = self.lp.deregister(&mut c.stream, src);
        }
        match c.phase {
            Phase::Opening => {
                if c.initiator {
                    let why = if broken {
                        RefuseReason::Refused
                    } else {
                        RefuseReason::Handshake(
                            "the listener ended the control channel before accepting".into(),
                        )
                    };
                    self.refuse_conn(st, id, why);
                }
            }
            Phase::Established => {
                if let Some((reason, _)) = c.peer_closing.clone() {
                    // The peer closed in order; its data may still be on
                    // the way (the tick ends the wait).
                    if c.session.peer_done() {
                        self.close_after_held(st, id, reason);
                    }
                } else {
                    self.close_after_held(st, id, CloseReason::Reset);
                }
            }
        }
    }

    /// Handles every complete frame; `false` if the connection ended.
    fn handle_frames(&self, st: &mut State, id: ConnId) -> bool {
        let now = self.lp.now();
        loop {
            let Some(c) = st.conns.get_mut(id) else {
                return false;
            };
            let frame = match c.decoder.next() {
                Ok(Some(f)) => f,
                Ok(None) => return true,
                Err(e) => {
                    let reason = CloseReason::Protocol(format!("control channel: {e}"));
                    if c.phase == Phase::Opening {
                        if c.initiator {
                            self.refuse_conn(st, id, RefuseReason::Other(reason.to_string()));
                        }
                    } else {
                        self.close_conn(st, id, reason, true);
                    }
                    return false;
                }
            };
            match c.session.on_frame(frame, now) {
                None => {}
                Some(proto::Event::Established {
                    peer_addr,
                    peer_tag,
                    ..
                }) => {
                    let ep = st.ep.as_mut().expect("endpoint open");
                    match ep.insert(&peer_addr) {
                        Ok(a) => {
                            let c = st.conns.get_mut(id).expect("present");
                            c.peer = Some(a);
                            c.peer_tag = peer_tag;
                            c.probe = Some(false);
                            self.send_probe(st, id);
                        }
                        Err(e) => {
                            self.refuse_conn(st, id, RefuseReason::Other(e.to_string()));
                            return false;
                        }
                    }
                }
                Some(proto::Event::Refused { reason, text }) => {
                    let why = match reason {
                        proto::RefuseCode::Limit => RefuseReason::Refused,
                        _ => RefuseReason::Other(format!("{reason}: {text}")),
                    };
                    self.refuse_conn(st, id, why);
                    return false;
                }
                Some(proto::Event::ProtocolError(text)) => {
                    if c.phase == Phase::Opening {
                        if c.initiator {
                            self.refuse_conn(st, id, RefuseReason::Other(text));
                        }
                    } else {
                        self.close_conn(st, id, CloseReason::Protocol(text), true);
                    }
                    return false;
                }
                Some(proto::Event::PeerClosing {
                    reason,
                    size,
                    limit,
                    ..
                }) => {
                    let why = match reason {
                        proto::CloseCode::TooLarge => CloseReason::MessageTooLarge {
                            size,
                            limit: limit as usize,
                        },
                        proto::CloseCode::Protocol => CloseReason::Protocol(
                            "the peer closed the connection for a protocol error".into(),
                        ),
                        _ => CloseReason::PeerClosed,
                    };
                    c.peer_closing = Some((why.clone(), now));
                    if c.session.peer_done() {
                        self.close_after_held(st, id, why);
                        return false;
                    }
                }
                Some(proto::Event::TimedOut) => {
                    self.close_conn(st, id, CloseReason::TimedOut, true);
                    return false;
                }
            }
            // Credits may have arrived.
            self.flush_backlog(st, id);
        }
    }

    // -- listening -----------------------------------------------------------

    fn on_listener(&self, addr: EndpointAddress) {
        let mut st = lock(&self.state);
        loop {
            let Some(l) = st.listeners.get_mut(&addr) else {
                return;
            };
            let (mut stream, peer) = match l.socket.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Out of descriptors or a connection reset before accept:
                // try again on the next readiness.
                Err(_) => return,
            };
            let held = st.pending.values().filter(|p| p.listener == addr).count()
                + st.conns
                    .iter()
                    .filter(|(_, c)| c.listener == Some(addr))
                    .count();
            if held >= self.lf.max_connections_per_listener
                || st.pending.len() >= self.lf.max_pending_handshakes
            {
                self.refuse(
                    &mut stream,
                    proto::Refusal::new(
                        proto::RefuseCode::Limit,
                        "the listener's connection limit is reached",
                    ),
                );
                continue;
            }
            let _ = stream.set_nodelay(true);
            let key = st.next_pending;
            st.next_pending += 1;
            let source = match self.register_stream(&mut stream, move |i, _| i.on_pending(key)) {
                Ok(s) => s,
                Err(_) => continue,
            };
            st.pending.insert(
                key,
                Pending {
                    stream,
                    source: Some(source),
                    listener: addr,
                    remote: EndpointAddress::from(peer),
                    decoder: Decoder::new(),
                    since: self.lp.now(),
                },
            );
            self.start_tick(&mut st);
        }
    }

    fn drop_pending(&self, st: &mut State, key: u64) -> Option<Pending> {
        let mut p = st.pending.remove(&key)?;
        if let Some(src) = p.source.take() {
            let _ = self.lp.deregister(&mut p.stream, src);
        }
        Some(p)
    }

    fn on_pending(&self, key: u64) {
        let mut st = lock(&self.state);
        let mut buf = [0u8; 4096];
        let hello = loop {
            let Some(p) = st.pending.get_mut(&key) else {
                return;
            };
            match p.decoder.next() {
                Ok(Some(Frame::Hello(h))) => break h,
                Ok(Some(_)) => {
                    self.drop_pending(&mut st, key);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(e) => {
                    // A HELLO of another protocol version is answered with
                    // a REFUSE that says so (best effort: the socket is
                    // closed right after); anything else malformed is
                    // dropped unanswered.
                    match e.refusal() {
                        Some(refusal) => self.refuse(&mut p.stream, refusal),
                        None => {
                            self.refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    self.drop_pending(&mut st, key);
                    return;
                }
                Ok(None) => {}
            }
            match p.stream.read(&mut buf) {
                Ok(0) => {
                    self.drop_pending(&mut st, key);
                    return;
                }
                Ok(n) => p.decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.drop_pending(&mut st, key);
                    return;
                }
            }
        };
        let Some(p) = self.drop_pending(&mut st, key) else {
            return;
        };
        self.accept(&mut st, p, hello);
        self.post_dispatch(&mut st);
    }

    /// Counts a refused connection request and answers it with
    /// `refusal` (best effort: the socket is closed right after). Counted
    /// first, so a peer that has read the answer finds it counted.
    fn refuse(&self, stream: &mut TcpStream, refusal: proto::Refusal) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        let mut out = Vec::new();
        refusal.frame().encode(&mut out);
        let _ = stream.write(&out);
    }

    fn accept(&self, st: &mut State, p: Pending, hello: proto::Hello) {
        let Pending {
            mut stream,
            listener,
            remote,
            mut decoder,
            ..
        } = p;
        let error = |e: FiError| proto::Refusal::new(proto::RefuseCode::Error, e.to_string());
        let Some(params) = st.listeners.get(&listener).map(|l| l.params.clone()) else {
            return;
        };
        if let Err(e) = self.ensure_ep(st, Some(listener.ip())) {
            self.refuse(&mut stream, error(e));
            return;
        }
        let pool = match self.pool_for(st, &params, Some(listener)) {
            Ok(p) => p,
            Err(e) => {
                self.refuse(&mut stream, error(e));
                return;
            }
        };
        let tag = Self::new_tag(st, pool);
        let mem = match self.open_receive(st, &params, tag) {
            Ok(x) => x,
            Err(e) => {
                self.refuse(&mut stream, error(e));
                return;
            }
        };
        let local = self.local(st, tag, &params);
        let now = self.lp.now();
        let (session, accept) = match Session::accept(&hello, local, now) {
            Ok(x) => x,
            Err(refusal) => {
                Self::cancel_tag(st, tag);
                self.refuse(&mut stream, refusal);
                return;
            }
        };
        if mem.is_none() {
            if let Err(e) = Self::post_probe_recv(st, tag) {
                Self::cancel_tag(st, tag);
                self.refuse(&mut stream, error(e));
                return;
            }
        }
        let peer = match st.ep.as_mut().expect("open").insert(&hello.addr) {
            Ok(a) => a,
            Err(e) => {
                Self::cancel_tag(st, tag);
                self.refuse(&mut stream, error(e));
                return;
            }
        };
        let mut out = Vec::new();
        accept.encode(&mut out);
        let region = match params.send_zero_copy.clone() {
            Some(r) => match RegionMr::new(st.ep.as_ref().expect("open").domain(), r) {
                Ok(r) => Some(r),
                Err(e) => {
                    Self::cancel_tag(st, tag);
                    st.ep.as_mut().expect("open").release(peer);
                    self.refuse(&mut stream, error(e));
                    return;
                }
            },
            None => None,
        };
        // Bytes the peer sent after its HELLO stay in the decoder.
        let _ = &mut decoder;
        let mut c = self.new_conn(st, stream, session, remote, tag, mem, region, &params);
        c.out = out;
        c.decoder = decoder;
        c.phase = Phase::Established;
        c.initiator = false;
        c.listener = Some(listener);
        c.peer = Some(peer);
        c.peer_tag = hello.tag;
        let caps = c.caps;
        let id = st.conns.insert(c);
        st.by_tag.insert(tag, id);
        let c = st.conns.get_mut(id).expect("just inserted");
        match self.register_stream(&mut c.stream, move |i, ev| i.on_stream(id, ev)) {
            Ok(s) => c.source = Some(s),
            Err(_) => {
                self.drop_conn(st, id);
                self.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        // Established is queued before anything the peer sends can be
        // delivered (deliveries are queued after it).
        st.events.push_back(Ev::Established(id, remote, caps));
        if !Self::flush(st.conns.get_mut(id).expect("present")) {
            self.close_after_held(st, id, CloseReason::Reset);
        }
        // Frames that came with the HELLO.
        self.handle_frames(st, id);
        self.start_tick(st);
    }

    // -- ending connections (under the state lock) ---------------------------

    /// A connection as the initiator opens it (the listener's side sets
    /// what differs).
    #[allow(clippy::too_many_arguments)]
    fn new_conn(
        &self,
        st: &mut State,
        stream: TcpStream,
        session: Session,
        remote: EndpointAddress,
        tag: u32,
        mem: Option<Arc<RecvMem>>,
        region: Option<Arc<RegionMr>>,
        params: &ConnectionParams,
    ) -> Conn {
        let order = st.next_order;
        st.next_order += 1;
        Conn {
            stream,
            source: None,
            out: Vec::new(),
            decoder: Decoder::new(),
            session,
            phase: Phase::Opening,
            initiator: true,
            remote,
            listener: None,
            caps: params.capabilities(&self.config, true),
            tag,
            peer: None,
            receive: mem.is_some(),
            recv: mem,
            recv_limit: st
                .pools
                .get(&(tag >> POOL_SHIFT))
                .map_or(params.recv.buf_size, |p| p.limit),
            paused: false,
            early_grant: None,
            held: VecDeque::new(),
            unposted: Vec::new(),
            pending_close: None,
            deliver_queued: false,
            drain_queued: false,
            done_pending: false,
            delivering: false,
            ledger: SendLedger::new(self.config.send_queue_depth),
            backlog: VecDeque::new(),
            pools: self.send_pool_for(params).into_iter().collect(),
            buffer_mrs: HashMap::new(),
            region,
            order,
            opened_at: self.lp.now(),
            peer_closing: None,
            probe: None,
            peer_tag: 0,
            in_flight: 0,
            pool: Some(tag >> POOL_SHIFT).filter(|p| *p != 0),
        }
    }

    /// Removes a connection without reporting anything: its receives are
    /// cancelled, its sends left to end with the endpoint.
    fn drop_conn(&self, st: &mut State, id: ConnId) -> Option<Conn> {
        let mut c = st.conns.remove(id)?;
        if let Some(src) = c.source.take() {
            let _ = self.lp.deregister(&mut c.stream, src);
        }
        st.by_tag.remove(&c.tag);
        Self::cancel_tag(st, c.tag);
        if let (Some(peer), Some(ep)) = (c.peer.take(), st.ep.as_mut()) {
            ep.release(peer);
        }
        if let Some(pool) = c.pool {
            // Buffers of the pool the connection still held.
            let held: Vec<usize> = c
                .held
                .drain(..)
                .map(|(i, _)| i)
                .chain(c.unposted.drain(..))
                .collect();
            self.refill_pool(st, pool, held);
        }
        Some(c)
    }

    fn refuse_conn(&self, st: &mut State, id: ConnId, reason: RefuseReason) {
        if let Some(c) = self.drop_conn(st, id) {
            st.events.push_back(Ev::Refused(id, c.remote, reason));
        }
    }

    /// Closes a connection and reports it; `notify`: tell the peer with a
    /// CLOSE frame.
    fn close_conn(&self, st: &mut State, id: ConnId, reason: CloseReason, notify: bool) {
        let Some(mut c) = self.drop_conn(st, id) else {
            return;
        };
        // A send handed to the fabric cannot be called back: it may
        // still be delivered, so it is reported completed (its memory
        // stays with the endpoint until the fabric is done with it, and a
        // zero-copy range stays lent). Sends still queued for a credit are
        // the newest ones and never reached the fabric: cancelled.
        let queued = c.backlog.len();
        c.backlog.clear();
        let ended = c.ledger.cancel_all();
        let (mut completed, mut released) = split_ended(ended.completed);
        let (mut cancelled, more) = split_ended(ended.cancelled);
        released.extend(more);
        let posted = cancelled.len().saturating_sub(queued);
        completed.extend(cancelled.drain(..posted));
        // Everything handed to the fabric is to be delivered.
        let deliver = c.session.sent();
        if notify && c.phase == Phase::Established {
            let (code, size, limit) = close_code(&reason);
            let frame = c.session.close(code, deliver, size, limit, self.lp.now());
            frame.encode(&mut c.out);
        }
        if !c.out.is_empty() && Self::flush(&mut c) && !c.out.is_empty() {
            st.flushing.push(Flushing {
                stream: c.stream,
                out: c.out,
                deadline: self.lp.now() + FLUSH_WAIT,
            });
            self.start_tick(st);
        } else {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        if c.phase == Phase::Opening {
            if c.initiator {
                st.events
                    .push_back(Ev::Refused(id, c.remote, RefuseReason::Cancelled));
            }
            return;
        }
        st.events.push_back(Ev::Release(Box::new(released)));
        if !completed.is_empty() {
            st.events.push_back(Ev::Completed(id, completed));
        }
        st.events
            .push_back(Ev::Closed(id, c.remote, reason, cancelled));
    }

    /// Closes once the held messages are delivered.
    /// A receive (of `owner`, buffer `index`) ended without a message,
    /// with error `errno`. Receives this backend cancelled end so
    /// (`FI_ECANCELED`: their owner is going away): nothing to do. Any
    /// other error ended the receive, and maybe a message with it: a
    /// shared pool's buffer goes back to its pool (its sender is unknown,
    /// as for a truncated message); a connection's own buffer ends the
    /// connection, after the messages held before it, with a reason that
    /// names the error (an opening one is refused so). A connection is not
    /// left with a buffer fewer and a peer holding a credit for it.
    fn recv_ended(&self, st: &mut State, owner: u64, index: usize, errno: i32) {
        if errno == netio_libfabric_sys::FI_ECANCELED {
            return;
        }
        if owner & POOL_OWNER != 0 {
            self.refill_pool(st, owner as u32, [index]);
            return;
        }
        let Some(&id) = st.by_tag.get(&(owner as u32)) else {
            return;
        };
        let Some(c) = st.conns.get(id) else {
            return;
        };
        let text = format!(
            "a receive failed on the fabric: {}",
            crate::ffi::strerror(errno)
        );
        if c.phase == Phase::Opening {
            self.refuse_conn(st, id, RefuseReason::Other(text));
        } else if owner & PROBE_OWNER == 0 && c.peer_closing.is_none() {
            if c.held.is_empty() {
                self.close_conn(st, id, CloseReason::Other(text), true);
            } else {
                self.close_after_held(st, id, CloseReason::Other(text));
            }
        }
    }

    fn close_after_held(&self, st: &mut State, id: ConnId, reason: CloseReason) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if c.held.is_empty() {
            self.close_conn(st, id, reason, false);
        } else {
            c.pending_close.get_or_insert(reason);
            self.queue_deliver(st, id);
        }
    }

    fn queue_deliver(&self, st: &mut State, id: ConnId) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if c.phase == Phase::Established && !c.paused && !c.held.is_empty() && !c.deliver_queued {
            c.deliver_queued = true;
            st.events.push_back(Ev::Deliver(id));
            self.post_dispatch(st);
        }
    }

    // -- sending ---------------------------------------------------------------

    /// Hands queued sends to the fabric while credits last.
    fn flush_backlog(&self, st: &mut State, id: ConnId) {
        let State {
            ep, conns, blocked, ..
        } = st;
        let (Some(ep), Some(c)) = (ep.as_mut(), conns.get_mut(id)) else {
            return;
        };
        let Some(dest) = c.peer else {
            return;
        };
        let mut failed = None;
        while !c.backlog.is_empty() {
            let Some(tag) = Self::take_credit(c) else {
                break;
            };
            let b = c.backlog.pop_front().expect("not empty");
            match ep.post(dest, tag, c.tag as u64, Some(b.seq), b.staged) {
                Ok(()) => c.in_flight += 1,
                Err((PostError::Again, staged)) => {
                    c.session.unsend(tag);
                    c.backlog.push_front(Backlogged { seq: b.seq, staged });
                    if !blocked.contains(&id) {
                        blocked.push(id);
                    }
                    break;
                }
                Err((PostError::Failed(e), _)) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            self.close_conn(st, id, CloseReason::Other(e.to_string()), true);
        }
        self.start_poll(st);
    }

    /// Takes a send credit of `c` ([`Session::on_send`]). While one of
    /// its messages is delivered, the first send also grants that
    /// message's buffer, which `deliver` then posts again as soon as
    /// `on_data` returns: a reply from `on_data` carries the credit the
    /// peer needs for its next message, with no CREDIT frame even when
    /// the connection has a single buffer. At most that one message per
    /// connection can reach the fabric before its buffer is posted.
    fn take_credit(c: &mut Conn) -> Option<u64> {
        if c.early_grant == Some(false) {
            let tag = c.session.on_send_freeing()?;
            c.early_grant = Some(true);
            return Some(tag);
        }
        c.session.on_send()
    }

    /// Accepts a staged send of `len` bytes: records it and hands it to
    /// the fabric when a credit allows.
    ///
    /// A message the peer cannot take (larger than the buffer size it
    /// announced, or sent to a peer without receive buffers) is accepted
    /// and never sent: it closes the connection at once, on both sides, as
    /// the receiver would on a connected endpoint (`MessageTooLarge`,
    /// `Protocol`), its key cancelled. Fabric providers differ on an
    /// oversized message (`tcp;ofi_rxm` drops the connection under it,
    /// `udp;ofi_rxd` truncates it silently), so it never reaches them.
    fn submit(
        &self,
        st: &mut State,
        id: ConnId,
        key: u64,
        counted: bool,
        staged: Staged,
        len: usize,
    ) -> Result<(), SendError> {
        let c = st.conns.get_mut(id).expect("checked");
        let seq = match c.ledger.accept(key, counted, Some(staged.held())) {
            Ok(seq) => seq,
            Err(_) => return Err(SendError::NoResources),
        };
        let limit = c.session.peer_buf_size();
        if limit == 0 || len as u64 > limit {
            drop(staged);
            let reason = if limit == 0 {
                CloseReason::Protocol("a message was sent to a peer without receive buffers".into())
            } else {
                CloseReason::MessageTooLarge {
                    size: len as u64,
                    limit: limit as usize,
                }
            };
            self.close_conn(st, id, reason, true);
            return Ok(());
        }
        c.backlog.push_back(Backlogged { seq, staged });
        self.flush_backlog(st, id);
        Ok(())
    }

    /// Sends a small send by injection when nothing waits before it and
    /// a credit allows: the fabric copies it at once and reports no
    /// completion, so no registered copy, operation context or completion
    /// read is needed; the caller then records its key as complete with
    /// [`injected`](Self::injected). `false`, with nothing changed, when
    /// the send takes the ordinary path (too large for injection, sends
    /// queued before it, no credit, the fabric's queue full).
    fn try_inject(
        ep: &mut RdmEp,
        c: &mut Conn,
        data: &[&[u8]],
        header: &[u8],
        total: usize,
    ) -> bool {
        let limit = c.session.peer_buf_size();
        if total > ep.inject_max() || limit == 0 || total as u64 > limit || !c.backlog.is_empty() {
            return false;
        }
        let Some(dest) = c.peer else {
            return false;
        };
        let Some(tag) = Self::take_credit(c) else {
            return false;
        };
        if ep.inject(dest, tag, data, header, total).is_err() {
            // Full, or failing: the ordinary path queues the send or
            // reports the failure.
            c.session.unsend(tag);
            return false;
        }
        true
    }

    /// Records the key of a send [`try_inject`](Self::try_inject) sent as
    /// complete at once (reported by the next dispatch, like any
    /// completion), keeping `held` until then.
    fn injected(c: &mut Conn, events: &mut VecDeque<Ev>, id: ConnId, key: u64, held: Option<Held>) {
        if c.ledger.accept_done(key, true, held).is_err() {
            unreachable!("the caller checked the ledger's room under the same lock");
        }
        if c.delivering {
            c.done_pending = true;
        } else if !c.drain_queued {
            c.drain_queued = true;
            events.push_back(Ev::Drain(id));
        }
    }

    fn check_send(&self, st: &State, conn: ConnId, header: &[u8]) -> Result<(), SendError> {
        netio_core::preamble::send(self.thread_ok(), header)?;
        match st.conns.get(conn) {
            Some(c) if c.phase == Phase::Established => Ok(()),
            _ => Err(SendError::UnknownConnection(conn)),
        }
    }

    /// [`check_send`](Self::check_send) that returns the connection.
    fn established<'c>(
        thread_ok: bool,
        conns: &'c mut ConnTable<Conn>,
        conn: ConnId,
        header: &[u8],
    ) -> Result<&'c mut Conn, SendError> {
        netio_core::preamble::send(thread_ok, header)?;
        match conns.get_mut(conn) {
            Some(c) if c.phase == Phase::Established => Ok(c),
            _ => Err(SendError::UnknownConnection(conn)),
        }
    }

    fn max_msg(st: &State) -> usize {
        st.ep.as_ref().map_or(usize::MAX, |e| e.max_msg_size())
    }

    // -- progress (loop thread) ------------------------------------------------

    fn on_cq(&self) {
        {
            let mut st = lock(&self.state);
            if st.dispatching {
                self.progress(&mut st);
                return;
            }
            // What the reads queue is handed over right here, not posted.
            st.dispatching = true;
            self.progress(&mut st);
            if st.events.is_empty() {
                st.dispatching = false;
                return;
            }
        }
        self.run_dispatch();
    }

    fn progress(&self, st: &mut State) {
        let now = self.lp.now();
        for _ in 0..TRYWAIT_ROUNDS {
            self.read_cq(st, now);
            match st.ep.as_ref() {
                Some(ep) if !ep.trywait() => continue,
                _ => {
                    self.post_dispatch(st);
                    return;
                }
            }
        }
        self.post_with(|i| i.on_cq());
        self.post_dispatch(st);
    }

    /// Reads the completion queue once and handles what it held; `true`
    /// if anything was read.
    /// `now` is the loop's time, read before the reads (a read that finds
    /// a message reads no clock).
    #[inline]
    fn read_cq(&self, st: &mut State, now: Duration) -> bool {
        !matches!(self.read_cq_one(st, now, false), CqRead::Nothing)
    }

    /// [`read_cq`](Self::read_cq); with `one` set, a read that returned a
    /// single message for a connection with nothing else going on (see
    /// [`take_one`](Self::take_one)) is not queued but returned, for the
    /// caller (the spin, with `State::dispatching` set) to hand over at
    /// once with [`deliver_locked`](Self::deliver_locked).
    #[inline]
    fn read_cq_one(&self, st: &mut State, now: Duration, one: bool) -> CqRead {
        let State {
            ep, completions, ..
        } = st;
        let Some(ep) = ep.as_mut() else {
            return CqRead::Nothing;
        };
        // The completions read (memory kept in the state).
        completions.clear();
        match ep.poll_single(completions) {
            Ok(Polled::Empty) | Err(_) => return CqRead::Nothing,
            Ok(Polled::Listed(any)) => {
                if completions.is_empty() {
                    return if any { CqRead::Some } else { CqRead::Nothing };
                }
            }
            Ok(Polled::Message {
                owner,
                index,
                len,
                tag,
                mem,
            }) => {
                if one {
                    match self.take_one(st, owner, index, len, tag, now) {
                        Some(Some(id)) => return CqRead::One(id, index, len, mem),
                        Some(None) => return CqRead::Some,
                        None => {}
                    }
                }
                st.completions.push(RdmCompletion::Received {
                    owner,
                    index,
                    len,
                    tag,
                });
            }
        }
        let mut out = std::mem::take(&mut st.completions);
        self.handle_completions(st, &mut out, now);
        out.clear();
        st.completions = out;
        CqRead::Some
    }

    /// The single message a read returned, taken on the way to its
    /// handler without the queues of
    /// [`handle_completions`](Self::handle_completions) when its
    /// connection has nothing else going on: established, receiving, not
    /// paused, no message held or being delivered, no completed send or
    /// backlog waiting, no buffer to post again, no close from the peer,
    /// and no event queued. `None`, with nothing changed, when the message
    /// takes the ordinary path; `Some(Some(id))` when the caller is to
    /// deliver it (marked queued for delivery, as
    /// [`queue_deliver`](Self::queue_deliver) would); `Some(None)` when it
    /// was handled here (a protocol violation closed the connection, or
    /// the peer's CLOSE said not to deliver it).
    #[inline]
    fn take_one(
        &self,
        st: &mut State,
        owner: u64,
        index: usize,
        len: usize,
        tag: u64,
        now: Duration,
    ) -> Option<Option<ConnId>> {
        if owner & (PROBE_OWNER | POOL_OWNER) != 0 || tag & PROBE_BIT != 0 || !st.events.is_empty()
        {
            return None;
        }
        let id = *st.by_tag.get(&(owner as u32))?;
        let c = st.conns.get_mut(id)?;
        let quiet = c.phase == Phase::Established
            && c.receive
            && !c.paused
            && len <= c.recv_limit
            && c.held.is_empty()
            && !c.deliver_queued
            && !c.delivering
            && !c.done_pending
            && c.backlog.is_empty()
            && c.unposted.is_empty()
            && c.peer_closing.is_none();
        if !quiet {
            return None;
        }
        st.read_at = now;
        match c.session.on_received(tag, now) {
            Ok(seq) if c.session.should_deliver(seq) => {
                c.deliver_queued = true;
                Some(Some(id))
            }
            Ok(_) => {
                c.unposted.push(index);
                self.repost(st, id);
                Some(None)
            }
            Err(text) => {
                self.close_conn(st, id, CloseReason::Protocol(text), true);
                Some(None)
            }
        }
    }

    /// Handles the completions of one read, `out` (left empty).
    #[inline(never)]
    fn handle_completions(&self, st: &mut State, out: &mut Vec<RdmCompletion>, now: Duration) {
        st.read_at = now;

        // The connections the read concerned (memory kept in the state).
        let mut touched = std::mem::take(&mut st.touched);
        touched.clear();
        for comp in out.drain(..) {
            match comp {
                RdmCompletion::Sent { owner, seq } => {
                    let tag = owner as u32;
                    let Some(&id) = st.by_tag.get(&tag) else {
                        continue;
                    };
                    let Some(c) = st.conns.get_mut(id) else {
                        continue;
                    };
                    match seq {
                        Some(seq) => {
                            c.ledger.mark_done(seq);
                            c.in_flight = c.in_flight.saturating_sub(1);
                            c.done_pending = true;
                        }
                        None if owner & PROBE_OWNER != 0 && c.phase == Phase::Opening => {
                            // The probe went through: the fabric reaches
                            // the peer.
                            c.probe = None;
                            c.phase = Phase::Established;
                            let (remote, caps) = (c.remote, c.caps);
                            st.events.push_back(Ev::Established(id, remote, caps));
                        }
                        None => {}
                    }
                    if !touched.contains(&id) {
                        touched.push(id);
                    }
                }
                RdmCompletion::SendFailed { owner, errno, seq } => {
                    let tag = owner as u32;
                    if let Some(c) = st.by_tag.get(&tag).and_then(|id| st.conns.get_mut(*id)) {
                        if seq.is_some() {
                            c.in_flight = c.in_flight.saturating_sub(1);
                        }
                    }
                    if let Some(&id) = st.by_tag.get(&(owner as u32)) {
                        if st.conns.get(id).is_some_and(|c| c.phase == Phase::Opening) {
                            let why = RefuseReason::Other(format!(
                                "the fabric did not reach the peer: {}",
                                crate::ffi::strerror(errno)
                            ));
                            self.refuse_conn(st, id, why);
                        } else {
                            self.close_after_held(st, id, CloseReason::Reset);
                        }
                    }
                }
                RdmCompletion::Received {
                    owner,
                    index,
                    len,
                    tag,
                    ..
                } => {
                    if owner & PROBE_OWNER != 0 {
                        continue;
                    }
                    let conn_tag = if owner & POOL_OWNER != 0 {
                        (tag >> 16) as u32 & (TAG_LIMIT - 1)
                    } else {
                        owner as u32
                    };
                    let known = st.by_tag.get(&conn_tag).copied();
                    if owner & POOL_OWNER != 0 && (tag & PROBE_BIT != 0 || known.is_none()) {
                        // A probe, or a message for a connection gone:
                        // the buffer goes back to its pool.
                        self.refill_pool(st, owner as u32, [index]);
                        continue;
                    }
                    let Some(id) = known else {
                        continue;
                    };
                    if tag & PROBE_BIT != 0 {
                        // The peer's set-up probe took a data buffer: it
                        // goes back at once, no credit involved.
                        self.repost_probe_buffer(st, id, index);
                        continue;
                    }
                    let Some(c) = st.conns.get_mut(id) else {
                        continue;
                    };
                    let seq = match c.session.on_received(tag, now) {
                        Ok(seq) => seq,
                        Err(text) => {
                            let reason = CloseReason::Protocol(text);
                            self.close_conn(st, id, reason, true);
                            continue;
                        }
                    };
                    if !c.session.should_deliver(seq) {
                        c.unposted.push(index);
                    } else if !c.receive {
                        self.close_conn(
                            st,
                            id,
                            CloseReason::Protocol(
                                "a message arrived on a connection without receive buffers".into(),
                            ),
                            true,
                        );
                        continue;
                    } else if len > c.recv_limit {
                        let limit = c.recv_limit;
                        self.close_conn(
                            st,
                            id,
                            CloseReason::MessageTooLarge {
                                size: len as u64,
                                limit,
                            },
                            true,
                        );
                        continue;
                    } else {
                        c.held.push_back((index, len));
                    }
                    if !touched.contains(&id) {
                        touched.push(id);
                    }
                }
                RdmCompletion::Truncated {
                    owner, size, index, ..
                } => {
                    if owner & PROBE_OWNER != 0 {
                        continue;
                    }
                    if owner & POOL_OWNER != 0 {
                        // The sender is unknown here (the tag was cut
                        // off with the message); the buffer goes back.
                        self.refill_pool(st, owner as u32, [index]);
                        continue;
                    }
                    let Some(&id) = st.by_tag.get(&(owner as u32)) else {
                        continue;
                    };
                    let Some(c) = st.conns.get(id) else {
                        continue;
                    };
                    let reason = if c.receive {
                        let limit = c.recv_limit;
                        CloseReason::MessageTooLarge {
                            size: size.max(limit as u64 + 2),
                            limit,
                        }
                    } else {
                        CloseReason::Protocol(
                            "a message arrived on a connection without receive buffers".into(),
                        )
                    };
                    self.close_conn(st, id, reason, true);
                }
                RdmCompletion::RecvEnded {
                    owner,
                    index,
                    errno,
                } => self.recv_ended(st, owner, index, errno),
            }
        }
        for &id in &touched {
            let Some(c) = st.conns.get_mut(id) else {
                continue;
            };
            // Completed sends are taken from the ledger (their slots freed)
            // on the loop, as they are reported: the queue may be read by
            // the progress thread meanwhile.
            if c.done_pending && !c.drain_queued {
                c.done_pending = false;
                c.drain_queued = true;
                st.events.push_back(Ev::Drain(id));
            }
            // A completion may leave room for a send refused with EAGAIN,
            // a piggybacked grant room for backlogged sends.
            if !c.backlog.is_empty() {
                self.flush_backlog(st, id);
            }
            let Some(c) = st.conns.get_mut(id) else {
                continue;
            };
            if c.peer_closing.is_some() && c.session.peer_done() {
                let reason = c.peer_closing.clone().expect("checked").0;
                self.close_after_held(st, id, reason);
                continue;
            }
            if !c.unposted.is_empty() {
                self.repost(st, id);
            }
            self.queue_deliver(st, id);
        }
        st.touched = touched;
    }

    /// The spin callback: [`spin`](Self::spin) with a backend handle made
    /// of the reference the callback took (no other one taken per
    /// delivery).
    fn spin_owned(this: Arc<RdmInner>) -> bool {
        let backend = LibfabricBackend {
            kind: Kind::Rdm(this),
        };
        match &backend.kind {
            Kind::Rdm(inner) => inner.spin(&backend),
            _ => false,
        }
    }

    /// One spin of a busy-polling loop: reads of the completion queue
    /// until one finds something ([`SPIN_READS`] at most, or up to
    /// [`LibfabricConfig::spin_rounds`] rounds of them, the state
    /// unlocked between two rounds and none begun once work was announced
    /// to the loop, an event is queued or a send waits for a retry), then
    /// what they found handed over; `backend`, this backend's handle.
    /// `true` when a read found something.
    fn spin(&self, backend: &LibfabricBackend) -> bool {
        // For the stall guard. Only the loop thread writes it.
        let spins = self.spins.load(Ordering::Relaxed);
        self.spins.store(spins.wrapping_add(1), Ordering::Relaxed);
        {
            let mut st = lock(&self.state);
            if st.dispatching {
                return false;
            }
            // What the reads queue is handed over right here, not posted.
            st.dispatching = true;
            // The time the loop read for this turn's timers: no clock read
            // on the way from the read that finds a message to the reply.
            let now = self.lp.turn_now();
            let mut one = None;
            let mut read_some = false;
            let mut rounds = 1;
            'rounds: loop {
                for _ in 0..SPIN_READS {
                    match self.read_cq_one(&mut st, now, true) {
                        CqRead::Nothing => {}
                        CqRead::Some => {
                            read_some = true;
                            break 'rounds;
                        }
                        CqRead::One(id, index, len, mem) => {
                            one = Some((id, Some((index, len, mem))));
                            break 'rounds;
                        }
                    }
                }
                if rounds >= self.spin_rounds
                    || !st.events.is_empty()
                    || !st.blocked.is_empty()
                    || self.lp.work_announced()
                {
                    break;
                }
                rounds += 1;
                // Another thread's send waits for one round at most.
                drop(st);
                st = lock(&self.state);
            }
            if !st.blocked.is_empty() {
                self.retry_blocked(&mut st);
            }
            // The messages of one connection and nothing else: handed over
            // right here, under the lock of the read that found them, with
            // no event queued and taken again (a single message with no
            // queue at all).
            let found = read_some || one.is_some() || !st.events.is_empty();
            let deliver = one.or_else(|| match (st.events.len(), st.events.front()) {
                (1, Some(&Ev::Deliver(id))) => {
                    st.events.pop_front();
                    Some((id, None))
                }
                _ => None,
            });
            if let Some((id, first)) = deliver {
                let _unwinding = events::ClearOnUnwind(|| {
                    let mut st = lock(&self.state);
                    st.dispatching = false;
                    self.post_dispatch(&mut st);
                });
                st = self.deliver_locked(backend, id, st, first);
            }
            if st.events.is_empty() {
                st.dispatching = false;
                return found;
            }
        }
        self.run_dispatch_on(backend);
        true
    }

    /// Posts the buffers waiting to be posted again (not while paused),
    /// granting the peer a credit for each.
    fn repost(&self, st: &mut State, id: ConnId) {
        // The time of the last completion read, which found the messages
        // whose buffers come back here (no clock read per message).
        let read_at = st.read_at;
        let State {
            ep, conns, pools, ..
        } = &mut *st;
        let (Some(ep), Some(c)) = (ep.as_mut(), conns.get_mut(id)) else {
            return;
        };
        if c.paused || c.unposted.is_empty() {
            return;
        }
        if let Some(pool) = c.pool {
            // The pool's buffers go back to the pool, closing or not.
            if c.peer_closing.is_none() {
                for _ in 0..c.unposted.len() {
                    c.session.on_buffer_freed();
                }
            }
            match pools.get(&pool) {
                // Drained in place, as below. A failure leaves the pool
                // one buffer smaller; nothing else depends on it.
                Some(p) => {
                    for i in c.unposted.drain(..) {
                        let _ = Self::post_pool_buffer(ep, &p.mem, pool, i);
                    }
                }
                None => c.unposted.clear(),
            }
            self.pump_at(st, id, read_at);
            return;
        }
        if c.peer_closing.is_some() {
            return;
        }
        // Borrowed, not cloned: the posts take their own references.
        let Some(mem) = c.recv.as_ref() else {
            return;
        };
        let mut failed = None;
        // Drained in place: the list keeps its memory for the next
        // delivery (taking it would free and allocate it once a message).
        for index in c.unposted.drain(..) {
            match ep.post_recv(
                mem,
                index,
                proto::recv_tag(c.tag),
                DATA_IGNORE,
                c.tag as u64,
            ) {
                Ok(()) => c.session.on_buffer_freed(),
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            self.close_conn(st, id, CloseReason::Other(e.to_string()), true);
            return;
        }
        self.pump_at(st, id, read_at);
    }

    /// Posts buffer `index` of `id` again at once, paused or not: a send
    /// during its delivery granted its credit ([`Self::take_credit`]).
    fn post_granted(&self, st: &mut State, id: ConnId, index: usize) {
        let read_at = st.read_at;
        let State { ep, conns, .. } = &mut *st;
        let (Some(ep), Some(c)) = (ep.as_mut(), conns.get_mut(id)) else {
            return;
        };
        if let Some(pool) = c.pool {
            self.refill_pool(st, pool, [index]);
        } else {
            if c.peer_closing.is_some() {
                return;
            }
            let Some(mem) = c.recv.as_ref() else {
                return;
            };
            if let Err(e) = ep.post_recv(
                mem,
                index,
                proto::recv_tag(c.tag),
                DATA_IGNORE,
                c.tag as u64,
            ) {
                self.close_conn(st, id, CloseReason::Other(e.to_string()), true);
                return;
            }
            // Nothing to write (the usual case): no second lookup.
            if c.out.is_empty() && !c.session.frame_due(read_at) {
                return;
            }
        }
        // A send that failed after the grant left it owed.
        self.pump_at(st, id, read_at);
    }

    fn on_tick(&self) {
        let mut st = lock(&self.state);
        let now = self.lp.now();
        // Set-up deadlines of accepted connections whose HELLO is missing.
        let late: Vec<u64> = st
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_sub(p.since) >= self.lf.handshake_timeout)
            .map(|(k, _)| *k)
            .collect();
        for k in late {
            self.drop_pending(&mut st, k);
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        for id in st.conns.ids() {
            let Some(c) = st.conns.get_mut(id) else {
                continue;
            };
            if c.phase == Phase::Opening {
                if now.saturating_sub(c.opened_at) >= self.lf.handshake_timeout {
                    self.refuse_conn(&mut st, id, RefuseReason::Unreachable);
                }
                continue;
            }
            if let Some((reason, since)) = c.peer_closing.clone() {
                if now.saturating_sub(since) >= CLOSE_WAIT {
                    self.close_after_held(&mut st, id, reason);
                }
                continue;
            }
            if let Some(proto::Event::TimedOut) = c.session.on_tick(now) {
                self.close_conn(&mut st, id, CloseReason::TimedOut, true);
                continue;
            }
            self.pump(&mut st, id);
        }
        st.flushing.retain_mut(|f| {
            while !f.out.is_empty() {
                match f.stream.write(&f.out) {
                    Ok(0) => return false,
                    Ok(n) => {
                        f.out.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return now < f.deadline;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return false,
                }
            }
            let _ = f.stream.shutdown(std::net::Shutdown::Write);
            false
        });
        if st.conns.is_empty() && st.pending.is_empty() && st.flushing.is_empty() {
            st.ticking = false;
            self.tick_timer.stop();
        }
        self.post_dispatch(&mut st);
    }

    // -- dispatch (loop thread, no lock held while the handler runs) ----------

    fn dispatch(&self) {
        if events::begin_dispatch(&self.state) {
            self.run_dispatch();
        }
    }

    /// Hands the queued events over; `State::dispatching` is set. Clears
    /// it under the lock when the queue is found empty (or posts another
    /// dispatch when events are left for another round).
    fn run_dispatch(&self) {
        self.run_dispatch_on(&self.backend());
    }

    /// [`run_dispatch`](Self::run_dispatch) with this backend's handle
    /// `backend` (the spin's, which holds one already).
    fn run_dispatch_on(&self, backend: &LibfabricBackend) {
        // A handler's panic leaves what was not handed over queued (and
        // the flag cleared): a posted dispatch takes it.
        let _unwinding = events::ClearOnUnwind(|| self.post_dispatch(&mut lock(&self.state)));
        let done = events::run_dispatch(
            &self.state,
            backend,
            &self.handler,
            |id| self.deliver(backend, id),
            |id| self.drain(backend, id),
        );
        if !done {
            let mut st = lock(&self.state);
            self.post_dispatch(&mut st);
        }
    }

    /// Reports the sends of `id` that completed, freeing their slots and
    /// memory right before the report.
    fn drain(&self, backend: &LibfabricBackend, id: ConnId) {
        let mut keys = events::take_keys();
        let released = {
            let mut st = lock(&self.state);
            let Some(c) = st.conns.get_mut(id) else {
                return;
            };
            c.drain_queued = false;
            c.done_pending = false;
            Self::take_completed(c, &mut keys)
        };
        drop(released);
        if !keys.is_empty() {
            lock(&self.handler).on_sends_completed(backend, id, &keys);
        }
        events::give_keys(keys);
    }

    /// Takes the completed sends of `c` off its ledger: their keys into
    /// `keys`, their memory returned (to be released, with no lock held,
    /// right before the report).
    fn take_completed(c: &mut Conn, keys: &mut Vec<u64>) -> Vec<Held> {
        let mut released = Vec::new();
        c.ledger.drain_completed_each(|key, held| {
            keys.push(key);
            if let Some(h) = held {
                released.push(h);
            }
        });
        released
    }

    /// Hands the connection's held messages to the handler, each buffer
    /// posted again when its `on_data` returned, and reports the sends
    /// that completed meanwhile right after the `on_data` that made them
    /// (see `Conn::delivering`). The handler stays locked for the whole
    /// run; at most 1,024 messages or [`events::DISPATCH_BUDGET`], the
    /// rest in another batch.
    fn deliver(&self, backend: &LibfabricBackend, id: ConnId) {
        drop(self.deliver_locked(backend, id, lock(&self.state), None));
    }

    /// [`deliver`](Self::deliver), starting under the state lock `st` (the
    /// spin's, which found the messages) and returning with it held;
    /// `first`, the buffer index, length and receive memory of a message
    /// to hand over before the held ones (found by the same lock's read,
    /// its connection checked by [`take_one`](Self::take_one)).
    fn deliver_locked<'a>(
        &'a self,
        backend: &LibfabricBackend,
        id: ConnId,
        mut st: MutexGuard<'a, State>,
        mut first: Option<(usize, usize, Arc<RecvMem>)>,
    ) -> MutexGuard<'a, State> {
        let mut handler = None;
        let mut budget = Budget::new(DELIVER_CLOCK_EVERY);
        for _ in 0..1024 {
            let Some(c) = st.conns.get_mut(id) else {
                return st;
            };
            let next = match first.take() {
                Some((index, len, mem)) => Some((index, len, Some(mem))),
                None if c.paused => {
                    c.deliver_queued = false;
                    Self::end_delivering(&mut st, id);
                    self.post_dispatch(&mut st);
                    return st;
                }
                None => c.held.pop_front().map(|(index, len)| (index, len, None)),
            };
            let Some((index, len, mem)) = next else {
                self.end_run(&mut st, id);
                return st;
            };
            c.delivering = true;
            c.early_grant = c.peer_closing.is_none().then_some(false);
            let pool = c.pool;
            let mem = mem.unwrap_or_else(|| c.recv.clone().expect("receiving"));
            drop(st);
            // The buffer is not posted again before on_data returns: its
            // bytes stay put.
            let h = handler.get_or_insert_with(|| lock(&self.handler));
            {
                // A handler's panic leaves the connection as a delivery
                // that ended with this message would.
                let _unwinding =
                    events::ClearOnUnwind(|| self.delivery_unwound(id, pool, Some(index)));
                h.on_data(backend, id, mem.bytes(index, len));
            }
            drop(mem);
            st = lock(&self.state);
            let Some(c) = st.conns.get_mut(id) else {
                // Closed meanwhile: a shared pool's buffer goes back to
                // the pool (the connection's own buffers went with it).
                if let Some(pool) = pool {
                    self.refill_pool(&mut st, pool, [index]);
                }
                return st;
            };
            if c.early_grant.take() == Some(true) {
                self.post_granted(&mut st, id, index);
            } else {
                c.unposted.push(index);
            }
            let Some(c) = st.conns.get_mut(id) else {
                return st;
            };
            let done = std::mem::take(&mut c.done_pending);
            if !c.unposted.is_empty() {
                self.repost(&mut st, id);
            }
            if done {
                let Some(c) = st.conns.get_mut(id) else {
                    return st;
                };
                let mut keys = events::take_keys();
                let released = Self::take_completed(c, &mut keys);
                if !keys.is_empty() {
                    drop(st);
                    drop(released);
                    {
                        // As above; this message's buffer is back already.
                        let _unwinding =
                            events::ClearOnUnwind(|| self.delivery_unwound(id, pool, None));
                        h.on_sends_completed(backend, id, &keys);
                    }
                    st = lock(&self.state);
                }
                events::give_keys(keys);
            }
            if budget.spent() {
                break;
            }
        }
        self.end_run(&mut st, id);
        st
    }

    /// Ends a delivery run of `id` (the last message handed out, the
    /// budget spent, or a handler's panic): what is still held is queued
    /// for another run; with nothing held, a close that waited for the
    /// held messages is carried out now (else only the close wait's
    /// deadline would bring it).
    fn end_run(&self, st: &mut State, id: ConnId) {
        if let Some(c) = st.conns.get_mut(id) {
            c.deliver_queued = false;
            let pending_close = if c.held.is_empty() {
                c.pending_close.take()
            } else {
                None
            };
            Self::end_delivering(st, id);
            if let Some(reason) = pending_close {
                self.close_conn(st, id, reason, false);
            }
            self.queue_deliver(st, id);
        }
        self.post_dispatch(st);
    }

    /// A handler panicked while `id`'s messages were handed out (in
    /// `on_data`, or reporting completed sends between two messages): the
    /// connection is left as after a delivery that ended there. The buffer
    /// of the message being handed out (`index`, unless it went back
    /// already) is posted again (or returned to its shared `pool` if the
    /// connection is gone), and the messages held after it are queued for
    /// another delivery (or a close waiting for them is carried out).
    fn delivery_unwound(&self, id: ConnId, pool: Option<u32>, index: Option<usize>) {
        let mut st = lock(&self.state);
        let Some(c) = st.conns.get_mut(id) else {
            if let (Some(pool), Some(index)) = (pool, index) {
                self.refill_pool(&mut st, pool, [index]);
            }
            return;
        };
        let granted = c.early_grant.take() == Some(true);
        match index {
            Some(index) if granted => self.post_granted(&mut st, id, index),
            Some(index) => c.unposted.push(index),
            None => {}
        }
        self.repost(&mut st, id);
        if st.conns.get(id).is_some() {
            self.end_run(&mut st, id);
        }
    }

    /// Ends `deliver`'s run on `id`: sends completed since its last report
    /// (by another thread) are left to a `Drain` event.
    fn end_delivering(st: &mut State, id: ConnId) {
        let State { conns, events, .. } = st;
        let Some(c) = conns.get_mut(id) else {
            return;
        };
        c.delivering = false;
        if c.done_pending && !c.drain_queued {
            c.done_pending = false;
            c.drain_queued = true;
            events.push_back(Ev::Drain(id));
        }
    }

    fn on_user_timer(&self) {
        let due = self.timers.due(self.lp.now());
        if due.is_empty() {
            return;
        }
        let mut st = lock(&self.state);
        for t in due {
            st.events.push_back(Ev::Timer(t));
        }
        self.post_dispatch(&mut st);
    }

    fn send_pool(&self, conn: ConnId) -> Result<BufferPool, BufferError> {
        if !self.thread_ok() {
            return Err(BufferError::WrongThread);
        }
        let st = lock(&self.state);
        match st.conns.get(conn) {
            Some(c) if c.phase == Phase::Established => c
                .pools
                .first()
                .cloned()
                .ok_or(BufferError::NoBuffersAllocated(conn)),
            _ => Err(BufferError::UnknownConnection(conn)),
        }
    }
}

impl Ops for RdmInner {
    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        netio_core::preamble::open_listen(self.thread_ok(), address, &params, &self.config)?;
        let own_pool =
            params.recv.use_shared_pool && params.recv.num_buf > 0 && params.recv.buf_size > 0;
        if params.recv.use_shared_pool && !own_pool && self.config.shared_receive_pool.is_none() {
            return Err(OpenListenError::InvalidConnectionParameters(
                "use_shared_pool on a listen endpoint needs recv.buf_size and recv.num_buf \
                 (its own pool) or a BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let mut st = lock(&self.state);
        if address.port() != 0 && st.listeners.contains_key(&address) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(address));
        }
        self.ensure_ep(&mut st, Some(address.ip())).map_err(|e| {
            OpenListenError::FailedOpenListenEndpoint {
                address,
                source: Box::new(self.provider_error(e)),
            }
        })?;
        let mut socket = TcpListener::bind(socket_addr(address)).map_err(|e| {
            OpenListenError::FailedOpenListenEndpoint {
                address,
                source: Box::new(e),
            }
        })?;
        let bound = socket
            .local_addr()
            .map_err(|e| OpenListenError::FailedOpenListenEndpoint {
                address,
                source: Box::new(e),
            })?;
        let bound = EndpointAddress::from(SocketAddr::new(address.ip(), bound.port()));
        if st.listeners.contains_key(&bound) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(bound));
        }
        let w = self.weak.clone();
        let source = self
            .lp
            .register(&mut socket, Interest::READABLE, move |_| {
                if let Some(i) = w.upgrade() {
                    i.on_listener(bound);
                }
            })
            .map_err(|e| OpenListenError::FailedOpenListenEndpoint {
                address,
                source: Box::new(e),
            })?;
        let pool = if own_pool {
            match self.new_pool(
                &mut st,
                params.recv.buf_size,
                params.recv.num_buf,
                Some(bound),
            ) {
                Ok(p) => Some(p),
                Err(e) => {
                    let _ = self.lp.deregister(&mut socket, source);
                    return Err(OpenListenError::FailedOpenListenEndpoint {
                        address,
                        source: Box::new(self.provider_error(e)),
                    });
                }
            }
        } else {
            None
        };
        st.listeners.insert(
            bound,
            Listener {
                socket,
                source: Some(source),
                params,
                pool,
            },
        );
        Ok(bound)
    }

    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        netio_core::preamble::open_active(self.thread_ok(), address, &params, &self.config)?;
        if params.recv.use_shared_pool && self.config.shared_receive_pool.is_none() {
            return Err(OpenActiveError::InvalidConnectionParameters(
                "recv.use_shared_pool on an active endpoint needs \
                 BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| {
            OpenActiveError::FailedOpenActiveEndpoint { address, source: e }
        };
        let mut st = lock(&self.state);
        let near = address.ip().is_loopback().then(|| address.ip());
        self.ensure_ep(&mut st, near)
            .map_err(|e| failed(Box::new(self.provider_error(e))))?;
        let stream = TcpStream::connect(socket_addr(address)).map_err(|e| failed(Box::new(e)))?;
        let _ = stream.set_nodelay(true);
        let pool = self
            .pool_for(&mut st, &params, None)
            .map_err(|e| failed(Box::new(self.provider_error(e))))?;
        let tag = Self::new_tag(&mut st, pool);
        let mem = self
            .open_receive(&mut st, &params, tag)
            .map_err(|e| failed(Box::new(self.provider_error(e))))?;
        let local = self.local(&st, tag, &params);
        let now = self.lp.now();
        let (session, hello) = Session::initiator(local, now);
        let mut out = Vec::new();
        hello.encode(&mut out);
        let region = match params.send_zero_copy.clone() {
            Some(r) => match RegionMr::new(st.ep.as_ref().expect("open").domain(), r) {
                Ok(r) => Some(r),
                Err(e) => {
                    Self::cancel_tag(&mut st, tag);
                    return Err(failed(Box::new(self.provider_error(e))));
                }
            },
            None => None,
        };
        let mut c = self.new_conn(&mut st, stream, session, address, tag, mem, region, &params);
        c.out = out;
        let id = st.conns.insert(c);
        st.by_tag.insert(tag, id);
        let c = st.conns.get_mut(id).expect("just inserted");
        match self.register_stream(&mut c.stream, move |i, ev| i.on_stream(id, ev)) {
            Ok(s) => c.source = Some(s),
            Err(e) => {
                self.drop_conn(&mut st, id);
                return Err(failed(Box::new(e)));
            }
        }
        self.start_tick(&mut st);
        Ok(id)
    }

    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError> {
        if !self.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = lock(&self.state);
        let Some(mut l) = st.listeners.remove(&address) else {
            return Err(CloseError::UnknownListenEndpoint(address));
        };
        if let Some(src) = l.source.take() {
            let _ = self.lp.deregister(&mut l.socket, src);
        }
        drop(l);
        let pending: Vec<u64> = st
            .pending
            .iter()
            .filter(|(_, p)| p.listener == address)
            .map(|(k, _)| *k)
            .collect();
        for k in pending {
            self.drop_pending(&mut st, k);
        }
        let ids: Vec<ConnId> = st
            .conns
            .iter()
            .filter(|(_, c)| c.listener == Some(address))
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            self.close_conn(&mut st, id, CloseReason::ListenerClosed, true);
        }
        let pools: Vec<u32> = st
            .pools
            .iter()
            .filter(|(_, p)| p.listener == Some(address))
            .map(|(id, _)| *id)
            .collect();
        for id in pools {
            // Its buffers stay with the endpoint until their receives end.
            st.pools.remove(&id);
            if let Some(ep) = st.ep.as_mut() {
                ep.cancel_recvs(POOL_OWNER | id as u64);
            }
        }
        self.post_dispatch(&mut st);
        Ok(())
    }

    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError> {
        if !self.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = lock(&self.state);
        if !st.conns.contains(conn) {
            return Err(CloseError::UnknownConnection(conn));
        }
        self.close_conn(&mut st, conn, CloseReason::Local, true);
        self.post_dispatch(&mut st);
        Ok(())
    }

    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        Ok(self.send_pool(conn)?.get())
    }

    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError> {
        let mut st = lock(&self.state);
        self.check_send(&st, conn, &[])?;
        let c = st.conns.get_mut(conn).expect("checked");
        if !c.pools.iter().any(|p| p.owns(&buffer)) {
            return Err(SendError::ForeignBuffer);
        }
        let at = buffer.as_slice().as_ptr() as usize;
        let mr = match c.buffer_mrs.get(&at) {
            Some(mr) => Arc::clone(mr),
            None => {
                let ep = st.ep.as_ref().expect("open");
                let mr = ep
                    .register_buffer(&buffer)
                    .map_err(|e| SendError::Failed(Box::new(e)))?;
                let c = st.conns.get_mut(conn).expect("checked");
                c.buffer_mrs.insert(at, Arc::clone(&mr));
                mr
            }
        };
        let len = buffer.as_slice().len();
        let staged = Staged::buffer(buffer, mr);
        self.submit(&mut st, conn, key, false, staged, len)?;
        self.post_dispatch(&mut st);
        Ok(())
    }

    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let mut st = lock(&self.state);
        self.check_send(&st, conn, header)?;
        let max = Self::max_msg(&st);
        let c = st.conns.get_mut(conn).expect("checked");
        let Some(region) = c.region.clone() else {
            return Err(SendError::NotSupported(
                "zero-copy send on a connection without a memory region",
            ));
        };
        if !c.ledger.has_room() {
            return Err(SendError::NoResources);
        }
        let lent = region
            .region()
            .lend(data)
            .map_err(|_| SendError::OutsideRegion)?;
        let total = header.len() + lent.len();
        if total > max {
            return Err(SendError::MessageTooLarge { len: total, max });
        }
        // A small one is injected like a copy send (its bytes stay lent
        // until its completion is reported).
        let injected = {
            let mut parts: [&[u8]; 4] = [&[]; 4];
            let mut n = 0;
            let mut fits = true;
            for chunk in lent.chunks() {
                if n == parts.len() {
                    fits = false;
                    break;
                }
                parts[n] = chunk;
                n += 1;
            }
            let State { ep, conns, .. } = &mut *st;
            fits && match (ep.as_mut(), conns.get_mut(conn)) {
                (Some(ep), Some(c)) => Self::try_inject(ep, c, &parts[..n], header, total),
                _ => false,
            }
        };
        if injected {
            let State { conns, events, .. } = &mut *st;
            let c = conns.get_mut(conn).expect("checked");
            Self::injected(c, events, conn, key, Some(Held::Lent(lent)));
            self.post_dispatch(&mut st);
            return Ok(());
        }
        let ep = st.ep.as_ref().expect("open");
        let staged = ep
            .stage_zero_copy(lent, header, &region)
            .map_err(|e| SendError::Failed(Box::new(e)))?;
        self.submit(&mut st, conn, key, true, staged, total)?;
        self.post_dispatch(&mut st);
        Ok(())
    }

    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let mut st = lock(&self.state);
        // One lookup of the connection on the way to an injected send.
        let State {
            ep, conns, events, ..
        } = &mut *st;
        let c = Self::established(self.thread_ok(), conns, conn, header)?;
        if !c.ledger.has_room() {
            return Err(SendError::NoResources);
        }
        let max = ep.as_ref().map_or(usize::MAX, |e| e.max_msg_size());
        let total = header.len() + data.iter().map(|d| d.len()).sum::<usize>();
        if total > max {
            return Err(SendError::MessageTooLarge { len: total, max });
        }
        if let Some(ep) = ep.as_mut() {
            if Self::try_inject(ep, c, data, header, total) {
                Self::injected(c, events, conn, key, None);
                self.post_dispatch(&mut st);
                return Ok(());
            }
        }
        let ep = st.ep.as_ref().expect("open");
        let staged = ep
            .stage_copy(data, header)
            .map_err(|e| SendError::Failed(Box::new(e)))?;
        self.submit(&mut st, conn, key, true, staged, total)?;
        self.post_dispatch(&mut st);
        Ok(())
    }

    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError> {
        Ok(self.send_pool(conn)?.take_low_water())
    }

    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        if !self.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = lock(&self.state);
        let c = st
            .conns
            .get_mut(conn)
            .ok_or(ConnError::UnknownConnection(conn))?;
        c.paused = true;
        Ok(())
    }

    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        if !self.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = lock(&self.state);
        let c = st
            .conns
            .get_mut(conn)
            .ok_or(ConnError::UnknownConnection(conn))?;
        if !c.paused {
            return Ok(());
        }
        c.paused = false;
        if c.held.is_empty() {
            if let Some(reason) = c.pending_close.take() {
                self.close_conn(&mut st, conn, reason, false);
                self.post_dispatch(&mut st);
                return Ok(());
            }
        }
        self.repost(&mut st, conn);
        self.queue_deliver(&mut st, conn);
        Ok(())
    }

    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError> {
        if !self.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let st = lock(&self.state);
        st.conns
            .get(conn)
            .map(|c| c.remote)
            .ok_or(ConnError::UnknownConnection(conn))
    }

    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError> {
        if !self.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let st = lock(&self.state);
        st.conns
            .iter()
            .filter(|(_, c)| c.remote == remote)
            .min_by_key(|(_, c)| c.order)
            .map(|(id, _)| id)
            .ok_or(ConnError::NoConnectionTo(remote))
    }

    fn memory_usage(&self) -> MemoryUsage {
        let st = lock(&self.state);
        let mut usage = MemoryUsage::default();
        // The buffers' sizes as the application gave them (each buffer
        // has one byte more, see `open_receive`).
        for (_, c) in st.conns.iter() {
            if c.receive && c.pool.is_none() {
                if let Some(m) = &c.recv {
                    usage.receive_bytes += c.recv_limit * m.count();
                }
            }
        }
        // Each pool once, however many connections use it; the
        // backend-wide one from the backend's creation on (it is made at
        // first use).
        for p in st.pools.values().filter(|p| p.listener.is_some()) {
            usage.receive_bytes += p.limit * p.mem.count();
        }
        if let Some(spec) = self.config.shared_receive_pool {
            usage.receive_bytes += spec.buf_size * spec.num_buf;
        }
        usage.send_bytes = events::pool_bytes(
            self.shared_send
                .iter()
                .cloned()
                .chain(st.conns.iter().flat_map(|(_, c)| c.pools.clone())),
        );
        usage
    }

    fn now(&self) -> Duration {
        self.lp.now()
    }

    fn set_timer(&self, delay: Duration, token: u64) {
        self.timers.set(self.lp.now(), delay, token);
    }

    fn wake(&self, token: u64) {
        let mut st = lock(&self.state);
        st.events.push_back(Ev::Wake(token));
        self.post_dispatch(&mut st);
    }
}
