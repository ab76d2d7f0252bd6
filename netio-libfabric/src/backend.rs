//! [`LibfabricBackend`]: the connection manager, on the loop.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::Interest;
use netio_core::mio_loop::{MioLoop, MioTimer, SourceId, SpinId};
use netio_core::{
    Backend, BackendConfig, BufferError, BufferPool, Capabilities, CloseError, CloseReason,
    ConnError, ConnId, ConnTable, ConnectionParams, CreateError, EndpointAddress, EventLoop,
    Features, Handler, MemoryUsage, NetworkBuffer, OpenActiveError, OpenListenError, Provider,
    RefuseReason, RegionSlice, SendError, ThreadSafety, Timer,
};

use crate::config::{EndpointType, LibfabricConfig};
use crate::events::{
    self, lock, Budget, Ev, UserTimers, DELIVER_CLOCK_EVERY, HOT_IDLE_SPINS, SPIN_READS,
};
use crate::ffi::{
    self, Completion, ConnRequest, Domain, EqEvent, FiError, Info, Link, LinkSpec, PostError,
    Query, RecvMem,
};
use crate::listen::{GuardSettings, KnownPeer, ListenWorker};
use crate::rdm::RdmInner;

/// Size of the one receive buffer posted on a connection without receive
/// capability, to notice (and refuse) a message sent to it.
const SENTINEL_RECV: usize = 64;
/// How many times a queue is read again when `fi_trywait` says events are
/// pending, before the rest is left to a posted callback.
const TRYWAIT_ROUNDS: usize = 16;
/// How many events (messages of a connection, completed sends) a spin
/// hands over itself before it leaves the rest to a dispatch.
const SPIN_EVENTS: usize = 4;
/// How many completion queues besides the hot connection's the spin
/// callback of a busy-polling loop reads per spin (each read costs a system
/// call on socket-based fabric providers).
const SPIN_OTHERS: usize = 8;
/// Receive queue entries below which the provider's default queue size is
/// kept (every provider's default holds this many).
const DEFAULT_RX_QUEUE: usize = 256;
/// How long a close forced by the connection's end (peer close, reset,
/// error) waits for completions of sends already handed to the provider
/// (so that a send whose bytes left is not reported cancelled). Local
/// closes linger instead, without blocking (`LibfabricConfig::close_linger`).
const CLOSE_SETTLE: Duration = Duration::from_millis(2);
/// How often connections closed while opening are looked at (see
/// `State::abandoned`).
const ABANDONED_POLL: Duration = Duration::from_millis(10);

/// The libfabric backend: a cheap `Clone` handle.
///
/// Create it with [`LibfabricBackend::new`] (fabric provider and queue
/// sizes in a [`LibfabricConfig`]) or through [`LibfabricProvider`]
/// (provider from the environment, see [`LibfabricConfig::from_env`]).
#[derive(Clone)]
pub struct LibfabricBackend {
    pub(crate) kind: Kind,
}

/// The endpoint type a backend speaks.
#[derive(Clone)]
pub(crate) enum Kind {
    /// Connected endpoints (`FI_EP_MSG`): an endpoint per connection.
    Msg(Arc<Inner>),
    /// Reliable datagrams (`FI_EP_RDM`): one endpoint per backend.
    Rdm(Arc<RdmInner>),
}

impl fmt::Debug for LibfabricBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Msg(inner) => {
                let st = lock(&inner.state);
                f.debug_struct("LibfabricBackend")
                    .field("endpoint", &"msg")
                    .field("provider", &inner.fabric.provider)
                    .field("listeners", &st.listeners.len())
                    .field("connections", &st.conns.len())
                    .finish()
            }
            Kind::Rdm(inner) => inner.fmt_debug(f),
        }
    }
}

/// Selects [`LibfabricBackend`] by name (`"libfabric"`); the fabric
/// provider comes from `NETIO_LIBFABRIC_PROVIDER` (default `tcp`).
#[derive(Debug, Clone, Copy)]
pub struct LibfabricProvider;

impl Provider for LibfabricProvider {
    type Loop = MioLoop;
    type Backend = LibfabricBackend;
    const NAME: &'static str = "libfabric";

    fn create<H: Handler<LibfabricBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        handler: H,
    ) -> Result<LibfabricBackend, CreateError> {
        LibfabricBackend::new(event_loop, config, LibfabricConfig::from_env(), handler)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Opening,
    Established,
}

struct Conn {
    link: Link,
    phase: Phase,
    initiator: bool,
    remote: EndpointAddress,
    listener: Option<EndpointAddress>,
    caps: Capabilities,
    receive: bool,
    recv_limit: usize,
    paused: bool,
    /// Messages read from the queue, not yet delivered: (buffer, length).
    /// Their buffers stay unposted until delivered; delivery reads them in
    /// place.
    held: VecDeque<(usize, usize)>,
    /// The receive memory (kept past the link's close for held messages).
    recv_mem: Option<Arc<RecvMem>>,
    /// Every receive buffer was out of the provider's hands at a read of
    /// the queue since the last read after a re-post (see `deliver`).
    ran_dry: bool,
    /// Receive buffers waiting to be posted again (while paused).
    unposted: Vec<usize>,
    /// A close waiting for the held messages to be delivered.
    pending_close: Option<CloseReason>,
    deliver_queued: bool,
    /// The completion queue was left unread because no receive buffer was
    /// posted (the next one posted schedules a read).
    starved: bool,
    /// The loop sources of the completion queue's fd (none on a
    /// busy-polling loop) and the event queue's.
    sources: Option<(Option<SourceId>, SourceId)>,
    fds: (Option<RawFd>, RawFd),
    order: u64,
    /// When the connection was opened (loop clock), for the set-up
    /// deadline.
    opened_at: Duration,
    /// An accepted connection's peer, known to the listener's handshake
    /// guard while the connection lives.
    _known: Option<KnownPeer>,
}

/// A locally closed connection whose sends are still with the provider:
/// its handle is gone, its completion queue is still read until every send
/// ended or the deadline passed, then the close is reported.
struct Lingering {
    id: ConnId,
    link: Link,
    remote: EndpointAddress,
    reason: CloseReason,
    deadline: Duration,
    /// The loop source of the completion queue's fd (none on a
    /// busy-polling loop, whose spin reads the queue).
    source: Option<SourceId>,
    cq_fd: Option<RawFd>,
    _known: Option<KnownPeer>,
}

// Field order: the threads stop (and let go of the passive endpoint) before
// this copy is dropped, so that the endpoint is closed, and its port free,
// when the listener is dropped (unless a peer holds the thread inside
// libfabric: then it closes when that thread lets go).
struct Listener {
    /// Stops the listener's threads when dropped.
    _worker: ListenWorker,
    /// Shared with the listener thread, which reads its event queue.
    _pep: Arc<ffi::PassiveEp>,
    /// Accepted endpoints open on the listener's domain (a connection
    /// request's entry may name another fabric: `sockets` does).
    domain: Arc<Domain>,
    params: ConnectionParams,
}

impl events::Queued for State {
    fn queue(&mut self) -> (&mut VecDeque<Ev>, &mut bool) {
        (&mut self.events, &mut self.dispatching)
    }
}

#[derive(Default)]
struct State {
    /// Scratch list of the completions one read returned.
    completions: Vec<Completion>,
    listeners: HashMap<EndpointAddress, Listener>,
    conns: ConnTable<Conn>,
    events: VecDeque<Ev>,
    dispatch_posted: bool,
    /// The loop thread is handing events over (`Inner::run_dispatch`): an
    /// event queued meanwhile is taken by that dispatch, which clears this
    /// under the lock when it finds the queue empty, so none is posted.
    dispatching: bool,
    domains: HashMap<(String, String), Arc<Domain>>,
    next_order: u64,
    lingering: HashMap<u64, Lingering>,
    next_linger: u64,
    /// The earliest set-up deadline the set-up timer is started for.
    setup_deadline: Option<Duration>,
    /// Connections closed locally while still opening, on a fabric
    /// provider whose peer learns of such a close only once the endpoint
    /// is connected (`sockets`): each is closed when its set-up ends, or at
    /// its deadline.
    abandoned: Vec<(Link, Duration)>,
    /// The connection whose completion queue had entries last (read first
    /// by the spin callback of a busy-polling loop).
    hot: Option<ConnId>,
    /// How many spins in a row have found the hot connection's queue empty
    /// (see [`HOT_IDLE_SPINS`]).
    hot_idle: u32,
    /// The established connections of the spin's current round (busy
    /// polling), and how many of them it has read.
    spin_round: Vec<ConnId>,
    spin_at: usize,
    /// Scratch list of the lingering closes' serials the spin reads.
    linger_serials: Vec<u64>,
}

struct FabricSettings {
    provider: String,
    /// Rounds of reads of an empty queue per spin ([`events::spin_rounds`]).
    spin_rounds: u32,
    lf: LibfabricConfig,
}

impl FabricSettings {
    /// Starts the orderly end of a connection before its endpoint is
    /// closed. Not on `sockets`: its `fi_shutdown` (libfabric 1.17) closes
    /// the connection-manager socket that its connection-manager thread
    /// closes again later, so a descriptor number the process reused
    /// meanwhile (another connection's socket, an epoll instance) is closed
    /// under its owner. `fi_close` alone ends the connection there, and the
    /// peer still sees `FI_SHUTDOWN`.
    fn shutdown(&self, link: &mut Link) {
        if self.provider != "sockets" {
            link.shutdown();
        }
    }
}

pub(crate) struct Inner {
    lp: MioLoop,
    config: BackendConfig,
    fabric: FabricSettings,
    handler: Mutex<Box<dyn Handler<LibfabricBackend>>>,
    state: Mutex<State>,
    shared_send: Option<BufferPool>,
    weak: Weak<Inner>,
    timers: UserTimers,
    linger_timer: MioTimer,
    setup_timer: MioTimer,
    /// On a busy-polling loop: the spin callback reading the completion
    /// queues (which have no wait fd there).
    spin: Option<SpinId>,
    /// Connections refused by a listener: over a limit, past the handshake
    /// deadline, or failing to open.
    refused: Arc<AtomicU64>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(spin) = self.spin.take() {
            self.lp.remove_spin(spin);
        }
        let st = match self.state.get_mut() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        // Each listener's threads stop as it is dropped.
        st.listeners.clear();
        for (_, mut c) in st.conns.drain() {
            deregister_conn(&self.lp, &mut c);
            self.fabric.shutdown(&mut c.link);
        }
        for (_, mut l) in st.lingering.drain() {
            if let (Some(src), Some(fd)) = (l.source.take(), l.cq_fd) {
                let _ = self.lp.deregister(&mut SourceFd(&fd), src);
            }
            self.fabric.shutdown(&mut l.link);
        }
    }
}

fn deregister_conn(lp: &MioLoop, c: &mut Conn) {
    if let Some((a, b)) = c.sources.take() {
        if let (Some(a), Some(fd)) = (a, c.fds.0) {
            let _ = lp.deregister(&mut SourceFd(&fd), a);
        }
        let _ = lp.deregister(&mut SourceFd(&c.fds.1), b);
    }
}

static ENV_ONCE: Once = Once::new();

impl LibfabricBackend {
    /// What connected endpoints support: everything but shared receive
    /// pools.
    pub const FEATURES: Features = Features {
        shared_receive_pool: false,
        ..Features::ALL
    };

    /// What reliable-datagram endpoints support: everything.
    pub const RDM_FEATURES: Features = Features::ALL;

    /// Creates a backend on `event_loop` using the fabric provider and
    /// sizes of `lf`.
    pub fn new<H: Handler<LibfabricBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        lf: LibfabricConfig,
        handler: H,
    ) -> Result<Self, CreateError> {
        if config.send_queue_depth == 0 {
            return Err(CreateError::InvalidConfig(
                "send_queue_depth of 0 leaves no room for any send".into(),
            ));
        }
        if config.peer_timeout == Some(Duration::ZERO) {
            return Err(CreateError::InvalidConfig(
                "a peer_timeout of 0 would close every connection at once".into(),
            ));
        }

        if let Some(p) = config.shared_send_pool {
            if p.num_buf == 0 || p.buf_size == 0 {
                return Err(CreateError::InvalidConfig(
                    "shared_send_pool is empty".into(),
                ));
            }
        }
        if lf.provider.is_empty() {
            return Err(CreateError::InvalidConfig(
                "no libfabric provider name given".into(),
            ));
        }
        let rdm = lf.resolved_endpoint() == EndpointType::Rdm;
        if lf.cq_size == 0 {
            return Err(CreateError::InvalidConfig("cq_size of 0".into()));
        }
        if lf.handshake_timeout.is_zero() {
            return Err(CreateError::InvalidConfig(
                "a handshake_timeout of 0 would refuse every connection".into(),
            ));
        }
        if lf.max_pending_handshakes == 0 || lf.max_connections_per_listener == 0 {
            return Err(CreateError::InvalidConfig(
                "max_pending_handshakes and max_connections_per_listener must be at least 1".into(),
            ));
        }
        if let Some(w) = lf.sockets_pe_waittime {
            ENV_ONCE.call_once(|| ffi::default_env("FI_SOCKETS_PE_WAITTIME", &w.to_string()));
        }
        if rdm {
            return RdmInner::create(event_loop, config, lf, handler);
        }
        if config.shared_receive_pool.is_some() {
            return Err(CreateError::NotSupported(
                "shared receive pools on connected endpoints (each endpoint posts its own \
                 buffers; reliable-datagram endpoints share them)",
            ));
        }
        if config.peer_timeout.is_some() {
            return Err(CreateError::NotSupported(
                "peer_timeout on connected endpoints (libfabric's tcp, sockets and verbs \
                 endpoints have no keepalive, so a peer that goes silent would never be \
                 noticed; reliable-datagram endpoints, EndpointType::Rdm, enforce it with \
                 heartbeats)",
            ));
        }
        let shared_send = config
            .shared_send_pool
            .map(|p| BufferPool::new(p.buf_size, p.num_buf));
        let lp = event_loop.clone();
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let user_timer = events::timer_to(&lp, weak, Inner::on_user_timer);
            let linger_timer = events::timer_to(&lp, weak, Inner::on_linger_timer);
            let setup_timer = events::timer_to(&lp, weak, Inner::on_setup_timer);
            let spin = events::spin_to(&lp, weak, Inner::spin_owned);
            Inner {
                lp,
                config,
                fabric: FabricSettings {
                    provider: lf.provider.clone(),
                    spin_rounds: events::spin_rounds(&lf),
                    lf,
                },
                handler: Mutex::new(Box::new(handler)),
                state: Mutex::new(State::default()),
                shared_send,
                weak: weak.clone(),
                timers: UserTimers::new(user_timer),
                linger_timer,
                setup_timer,
                spin,
                refused: Arc::new(AtomicU64::new(0)),
            }
        });
        Ok(Self {
            kind: Kind::Msg(inner),
        })
    }

    /// The loop this backend runs on.
    pub fn event_loop(&self) -> &MioLoop {
        match &self.kind {
            Kind::Msg(inner) => &inner.lp,
            Kind::Rdm(inner) => inner.event_loop(),
        }
    }

    /// The libfabric settings of this backend.
    pub fn libfabric_config(&self) -> &LibfabricConfig {
        match &self.kind {
            Kind::Msg(inner) => &inner.fabric.lf,
            Kind::Rdm(inner) => inner.libfabric_config(),
        }
    }

    /// The endpoint type this backend speaks: [`EndpointType::Msg`] or
    /// [`EndpointType::Rdm`] (never `Auto`: that is decided at creation).
    pub fn endpoint_type(&self) -> EndpointType {
        match &self.kind {
            Kind::Msg(_) => EndpointType::Msg,
            Kind::Rdm(_) => EndpointType::Rdm,
        }
    }

    fn ops(&self) -> &dyn Ops {
        match &self.kind {
            Kind::Msg(inner) => &**inner,
            Kind::Rdm(inner) => &**inner,
        }
    }

    /// Connections this backend's listeners refused or ended before they
    /// were accepted: over [`LibfabricConfig::max_connections_per_listener`]
    /// or [`LibfabricConfig::max_pending_handshakes`], past
    /// [`LibfabricConfig::handshake_timeout`], or failing to open an
    /// endpoint. None of them reaches the handler.
    pub fn refused_connections(&self) -> u64 {
        match &self.kind {
            Kind::Msg(inner) => inner.refused.load(Ordering::Relaxed),
            Kind::Rdm(inner) => inner.refused_connections(),
        }
    }

    /// Memory registrations (`fi_mr_reg`) made so far on the domains this
    /// backend opened: each connection's receive memory, each send buffer
    /// and zero-copy region once, and copy sends' registered memory once
    /// per size class in use (reused afterwards). A steady stream of sends
    /// makes none.
    pub fn memory_registrations(&self) -> u64 {
        match &self.kind {
            Kind::Msg(inner) => {
                let st = lock(&inner.state);
                st.domains.values().map(|d| d.registrations()).sum()
            }
            Kind::Rdm(inner) => inner.memory_registrations(),
        }
    }
}

fn fi_source(e: FiError) -> netio_core::Source {
    Box::new(e)
}

/// A libfabric error with the fabric provider and address it concerns.
#[derive(Debug)]
struct FabricError {
    provider: String,
    addr: SocketAddr,
    error: FiError,
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "libfabric provider `{}` for {}: {}",
            self.provider, self.addr, self.error
        )?;
        if self.error.call == "fi_getinfo" && self.error.errno == netio_libfabric_sys::FI_ENODATA {
            f.write_str(
                " (unknown provider name, a capability it lacks (FI_EP_MSG, FI_MSG), \
                 an address on none of its interfaces, or a receive queue of one entry \
                 per receive buffer beyond its limit)",
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for FabricError {}

impl Inner {
    fn backend(&self) -> LibfabricBackend {
        LibfabricBackend {
            kind: Kind::Msg(
                self.weak
                    .upgrade()
                    .expect("backend alive while dispatching"),
            ),
        }
    }

    fn thread_ok(&self) -> bool {
        self.config.thread_safety == ThreadSafety::Safe || self.lp.on_loop_thread()
    }

    /// The `fi_getinfo` query for `addr`; `rx_buffers`: the receive
    /// buffers the endpoint posts at once (its receive queue holds them).
    fn query(&self, addr: SocketAddr, source: bool, rx_buffers: usize) -> Query<'_> {
        let lf = &self.fabric.lf;
        let rx_size = match lf.rx_size {
            Some(n) => Some(n.max(rx_buffers)),
            None if rx_buffers > DEFAULT_RX_QUEUE => Some(rx_buffers),
            None => None,
        };
        Query {
            provider: &lf.provider,
            domain: lf.domain.as_deref(),
            addr,
            source,
            tx_size: lf.tx_size,
            rx_size,
        }
    }

    /// `fi_getinfo` for `addr`, asking for a receive queue that holds
    /// `rx_buffers`; a provider that refuses that hint (`sockets` caps it
    /// at 256) is asked again without it: posting more buffers than its
    /// queue size may still work, and fails clearly where it does not.
    fn info(&self, addr: SocketAddr, source: bool, rx_buffers: usize) -> Result<Info, FiError> {
        let q = self.query(addr, source, rx_buffers);
        match Info::get(&q) {
            Err(e) if e.errno == netio_libfabric_sys::FI_ENODATA && q.rx_size.is_some() => {
                let plain = Query {
                    rx_size: self.fabric.lf.rx_size,
                    ..q
                };
                Info::get(&plain)
            }
            other => other,
        }
    }

    fn domain_for(&self, st: &mut State, info: &Info) -> Result<Arc<Domain>, FiError> {
        let key = info.names();
        if let Some(d) = st.domains.get(&key) {
            return Ok(Arc::clone(d));
        }
        let d = Domain::open(info)?;
        st.domains.insert(key, Arc::clone(&d));
        Ok(d)
    }

    fn post_with(&self, f: impl FnOnce(&Arc<Inner>) + Send + 'static) {
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

    fn link_spec(&self, params: &ConnectionParams) -> (LinkSpec, bool, usize) {
        let receive = params.recv.num_buf > 0;
        // One byte more than the limit: a message one byte too large is
        // then received whole and its size known exactly (libfabric's tcp
        // provider does not report how much a truncated message overflowed).
        let recv = if receive {
            (params.recv.buf_size + 1, params.recv.num_buf)
        } else {
            (SENTINEL_RECV, 1)
        };
        // The completion queue holds a completion of every receive buffer
        // and of every send that may be in flight at once (a full queue
        // is an error on verbs).
        let sends = self.config.send_queue_depth
            + params.send_buffered.num_buf
            + self.config.shared_send_pool.map_or(0, |p| p.num_buf);
        let cq_size = self.fabric.lf.cq_size.max(recv.1 + sends + 16);
        (
            LinkSpec {
                recv,
                zero_copy: params.send_zero_copy.clone(),
                depth: self.config.send_queue_depth,
                cq_size,
                cq_wait_fd: self.spin.is_none(),
            },
            receive,
            params.recv.buf_size,
        )
    }

    fn register_conn(&self, st: &mut State, id: ConnId) -> std::io::Result<()> {
        let Some(c) = st.conns.get_mut(id) else {
            return Ok(());
        };
        let (cq_fd, eq_fd) = c.fds;
        let cq_src = match cq_fd {
            Some(fd) => {
                let w = self.weak.clone();
                Some(
                    self.lp
                        .register(&mut SourceFd(&fd), Interest::READABLE, move |_| {
                            if let Some(i) = w.upgrade() {
                                i.on_cq(id);
                            }
                        })?,
                )
            }
            // Busy polling: the spin reads the queue.
            None => None,
        };
        let w = self.weak.clone();
        let eq_src = match self
            .lp
            .register(&mut SourceFd(&eq_fd), Interest::READABLE, move |_| {
                if let Some(i) = w.upgrade() {
                    i.on_eq(id);
                }
            }) {
            Ok(s) => s,
            Err(e) => {
                if let (Some(fd), Some(src)) = (cq_fd, cq_src) {
                    let _ = self.lp.deregister(&mut SourceFd(&fd), src);
                }
                return Err(e);
            }
        };
        c.sources = Some((cq_src, eq_src));
        Ok(())
    }

    // -- ending connections (under the state lock) -----------------------

    fn refuse_conn(&self, st: &mut State, id: ConnId, reason: RefuseReason) {
        let Some(mut c) = st.conns.remove(id) else {
            return;
        };
        deregister_conn(&self.lp, &mut c);
        let _ = c.link.close();
        if c.initiator {
            st.events.push_back(Ev::Refused(id, c.remote, reason));
        }
        self.post_dispatch(st);
    }

    fn close_conn(&self, st: &mut State, id: ConnId, reason: CloseReason, orderly: bool) {
        let Some(mut c) = st.conns.remove(id) else {
            return;
        };
        deregister_conn(&self.lp, &mut c);
        if c.phase != Phase::Established {
            if c.initiator {
                st.events
                    .push_back(Ev::Refused(id, c.remote, RefuseReason::Cancelled));
            }
            if c.initiator && self.fabric.provider == "sockets" {
                // libfabric 1.17 `sockets` tells the peer of a close only
                // from a connected endpoint: one closed while its set-up
                // is under way left the peer's side established for good.
                // It is closed once its set-up ended.
                let deadline = self
                    .lp
                    .now()
                    .saturating_add(self.fabric.lf.handshake_timeout);
                st.abandoned.push((c.link, deadline));
                self.setup_timer.start(ABANDONED_POLL);
            } else {
                let _ = c.link.close();
            }
            self.post_dispatch(st);
            return;
        }
        if orderly {
            // A local close: sends the provider has not finished yet may
            // still be on their way (written inside the send call, or by a
            // progress thread right now); wait for them on the loop.
            let mut dropped = Vec::new();
            let polled = c.link.poll(&mut dropped);
            if polled.is_ok() && !c.link.sends_done() {
                self.linger(st, id, c.link, c.remote, reason, c._known);
                return;
            }
            self.finish_close(st, id, c.link, c.remote, reason, true);
            return;
        }
        // Sends the provider finished (possibly inside the send call, or on
        // its progress thread a moment ago) are reported completed, not
        // cancelled: their bytes left. Bounded: a peer that reads nothing
        // leaves the rest cancelled.
        c.link.settle_sends(CLOSE_SETTLE);
        self.finish_close(st, id, c.link, c.remote, reason, false);
    }

    /// Closes `link` and reports its end: the sends completed but not yet
    /// reported, then the close with the keys of the rest.
    fn finish_close(
        &self,
        st: &mut State,
        id: ConnId,
        mut link: Link,
        remote: EndpointAddress,
        reason: CloseReason,
        orderly: bool,
    ) {
        if orderly {
            self.fabric.shutdown(&mut link);
        }
        let (completed, cancelled) = link.close();
        if !completed.is_empty() {
            st.events.push_back(Ev::Completed(id, completed));
        }
        st.events
            .push_back(Ev::Closed(id, remote, reason, cancelled));
        self.post_dispatch(st);
    }

    /// Keeps reading the completion queue of a locally closed connection
    /// until its sends ended or `close_linger` passed (then
    /// [`finish_close`](Self::finish_close)).
    fn linger(
        &self,
        st: &mut State,
        id: ConnId,
        link: Link,
        remote: EndpointAddress,
        reason: CloseReason,
        known: Option<KnownPeer>,
    ) {
        let serial = st.next_linger;
        st.next_linger += 1;
        let (cq_fd, _) = link.fds();
        // Busy polling (no fd): the spin reads the queue.
        let source = match cq_fd {
            None => None,
            Some(fd) => {
                let w = self.weak.clone();
                match self
                    .lp
                    .register(&mut SourceFd(&fd), Interest::READABLE, move |_| {
                        if let Some(i) = w.upgrade() {
                            i.on_linger(serial);
                        }
                    }) {
                    Ok(src) => Some(src),
                    Err(_) => {
                        // Without a wakeup the queue cannot be watched: end
                        // now.
                        self.finish_close(st, id, link, remote, reason, true);
                        return;
                    }
                }
            }
        };
        let deadline = self.lp.now().saturating_add(self.fabric.lf.close_linger);
        let first = st.lingering.values().map(|l| l.deadline).min();
        st.lingering.insert(
            serial,
            Lingering {
                id,
                link,
                remote,
                reason,
                deadline,
                source,
                cq_fd,
                _known: known,
            },
        );
        if first.is_none_or(|d| deadline < d) {
            self.linger_timer
                .start(self.fabric.lf.close_linger.max(Duration::from_micros(1)));
        }
        // Completions that arrived before the registration wake nobody.
        self.post_with(move |i| i.on_linger(serial));
    }

    fn end_linger(&self, st: &mut State, serial: u64) {
        let Some(mut l) = st.lingering.remove(&serial) else {
            return;
        };
        if let (Some(src), Some(fd)) = (l.source.take(), l.cq_fd) {
            let _ = self.lp.deregister(&mut SourceFd(&fd), src);
        }
        self.finish_close(st, l.id, l.link, l.remote, l.reason, true);
    }

    fn on_linger(&self, serial: u64) {
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        for _ in 0..TRYWAIT_ROUNDS {
            if !self.read_lingering(st, serial) {
                return;
            }
            let Some(l) = st.lingering.get(&serial) else {
                return;
            };
            if l.link.trywait_cq() {
                return;
            }
        }
        self.post_with(move |i| i.on_linger(serial));
    }

    /// Reads the completion queue of a lingering connection once and
    /// reports the sends that ended; ends the linger when none is left.
    /// Returns `false` once it ended.
    fn read_lingering(&self, st: &mut State, serial: u64) -> bool {
        let Some(l) = st.lingering.get_mut(&serial) else {
            return false;
        };
        let mut dropped = std::mem::take(&mut st.completions);
        dropped.clear();
        let polled = l.link.poll(&mut dropped);
        dropped.clear();
        st.completions = dropped;
        // The keys' memory comes back from the report (`events::give_keys`).
        let mut done = events::take_keys();
        l.link.drain_completed_into(&mut done);
        let id = l.id;
        let ended = polled.is_err() || l.link.sends_done();
        if done.is_empty() {
            events::give_keys(done);
        } else {
            st.events.push_back(Ev::Completed(id, done));
        }
        if ended {
            self.end_linger(st, serial);
            return false;
        }
        self.post_dispatch(st);
        true
    }

    fn on_linger_timer(&self) {
        let mut st = lock(&self.state);
        let now = self.lp.now();
        let due: Vec<u64> = st
            .lingering
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(s, _)| *s)
            .collect();
        for serial in due {
            self.end_linger(&mut st, serial);
        }
        if let Some(next) = st.lingering.values().map(|l| l.deadline).min() {
            self.linger_timer
                .start(next.saturating_sub(now).max(Duration::from_micros(1)));
        }
    }

    /// Closes `id` with `reason` once its held messages are delivered
    /// (at once if nothing is held, or if paused and `reason` is not an
    /// orderly close).
    fn close_after_held(&self, st: &mut State, id: ConnId, reason: CloseReason) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        let orderly = matches!(reason, CloseReason::PeerClosed);
        if c.held.is_empty() || (c.paused && !orderly) {
            self.close_conn(st, id, reason, false);
        } else {
            if c.pending_close.is_none() {
                c.pending_close = Some(reason);
            }
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

    // -- progress (loop thread) -------------------------------------------

    /// Reads the completion queue of `id` until `fi_trywait` lets the loop
    /// sleep; returns `false` if the connection ended.
    fn progress_cq(&self, st: &mut State, id: ConnId) -> bool {
        for _ in 0..TRYWAIT_ROUNDS {
            match self.read_cq(st, id, self.fabric.lf.max_poll) {
                None => return false,
                Some(false) => return true,
                Some(true) => {}
            }
            let Some(c) = st.conns.get_mut(id) else {
                return false;
            };
            if c.link.trywait_cq() {
                return true;
            }
            if c.posted_receives() == 0 {
                // Events are pending (data the provider cannot take while
                // no receive buffer is posted), but nothing can complete
                // until a buffer is posted again: reading again now would
                // spin. `repost` schedules the next read.
                c.starved = true;
                return true;
            }
        }
        self.post_with(move |i| i.on_cq(id));
        true
    }

    /// Reads the completion queue of `id` once (again up to `extra` times
    /// while it is empty) and handles what it held. `None` if the
    /// connection ended, `Some(false)` if it is not established (nothing
    /// to read), `Some(true)` after a read.
    fn read_cq(&self, st: &mut State, id: ConnId, extra: u32) -> Option<bool> {
        // The completions read (memory kept in the state).
        let mut out = std::mem::take(&mut st.completions);
        let r = self.read_cq_into(st, id, &mut out, extra, None);
        out.clear();
        st.completions = out;
        r
    }

    /// [`read_cq`](Self::read_cq) for the spin's hot connection: a read
    /// that found a single message for a connection with nothing else
    /// going on (established, receiving, not paused, nothing held or being
    /// delivered, no close waiting, no event queued) does not hold and
    /// queue it but returns it as (buffer, length), marked queued for
    /// delivery, for the caller to hand over at once with
    /// [`deliver_locked`](Self::deliver_locked). The sends the read found
    /// completed are queued as usual, behind it.
    fn read_cq_one(
        &self,
        st: &mut State,
        id: ConnId,
        extra: u32,
    ) -> (Option<bool>, Option<(usize, usize)>) {
        let mut out = std::mem::take(&mut st.completions);
        let mut single = None;
        let r = self.read_cq_into(st, id, &mut out, extra, Some(&mut single));
        out.clear();
        st.completions = out;
        (r, single)
    }

    fn read_cq_into(
        &self,
        st: &mut State,
        id: ConnId,
        out: &mut Vec<Completion>,
        extra: u32,
        mut single: Option<&mut Option<(usize, usize)>>,
    ) -> Option<bool> {
        // Another event queued would be handed over before the message.
        let none_queued = st.events.is_empty();
        let c = st.conns.get_mut(id)?;
        if c.phase != Phase::Established {
            return Some(false);
        }
        out.clear();
        let mut polls = 0;
        let read = loop {
            match c.link.poll(out) {
                Ok(true) => break Ok(true),
                Ok(false) if polls < extra => polls += 1,
                Ok(false) => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        let any = match read {
            Ok(any) => any,
            Err(e) => {
                self.close_conn(st, id, CloseReason::Other(e.to_string()), false);
                return None;
            }
        };
        if any {
            st.hot = Some(id);
            st.hot_idle = 0;
        }
        let c = st.conns.get_mut(id)?;
        // A single message handed over without the held list and the
        // event queue (see `read_cq_one`).
        let alone = single.is_some()
            && none_queued
            && out.len() == 1
            && c.held.is_empty()
            && !c.deliver_queued
            && !c.paused
            && c.pending_close.is_none();
        let mut ending: Option<CloseReason> = None;
        for comp in out.drain(..) {
            match comp {
                Completion::Received { index, len } => {
                    if !c.receive {
                        ending.get_or_insert(CloseReason::Protocol(
                            "a message arrived on a connection without receive buffers".into(),
                        ));
                        continue;
                    }
                    if len > c.recv_limit {
                        ending.get_or_insert(CloseReason::MessageTooLarge {
                            size: len as u64,
                            limit: c.recv_limit,
                        });
                        continue;
                    }
                    match single.as_deref_mut() {
                        Some(slot) if alone => {
                            *slot = Some((index, len));
                            c.deliver_queued = true;
                        }
                        _ => c.held.push_back((index, len)),
                    }
                }
                Completion::Truncated { size, .. } => {
                    if c.receive {
                        // Without an overflow length from the provider the
                        // size is known to exceed the buffer (limit + 1
                        // bytes) at least.
                        let at_least = c.recv_limit as u64 + 2;
                        ending.get_or_insert(CloseReason::MessageTooLarge {
                            size: size.max(at_least),
                            limit: c.recv_limit,
                        });
                    } else {
                        ending.get_or_insert(CloseReason::Protocol(
                            "a message arrived on a connection without receive buffers".into(),
                        ));
                    }
                }
                Completion::SendFailed(errno) | Completion::RecvFailed(errno) => {
                    if errno != libc::ECANCELED && errno != netio_libfabric_sys::FI_ECANCELED {
                        ending.get_or_insert(CloseReason::Reset);
                    }
                }
            }
        }
        if c.posted_receives() == 0 {
            c.ran_dry = true;
        }
        // The keys' memory comes back from the report (`events::give_keys`).
        let mut done = events::take_keys();
        c.link.drain_completed_into(&mut done);
        if let Some(reason) = ending {
            // Reported before the close, which reports the rest.
            Self::queue_completed(st, id, done);
            match reason {
                CloseReason::Reset => self.close_after_held(st, id, reason),
                other => self.close_conn(st, id, other, false),
            }
            self.post_dispatch(st);
            return None;
        }
        // The messages first: a reply to one is then sent before the sends
        // this read found completed are reported (the contract orders
        // completions among themselves, not against messages), which keeps
        // that report off a round trip's path. (A single message returned
        // to the caller is handed over before anything queued here.)
        if !single.is_some_and(|s| s.is_some()) {
            self.queue_deliver(st, id);
        }
        Self::queue_completed(st, id, done);
        self.post_dispatch(st);
        Some(true)
    }

    /// Queues the report of the completed sends `done` of `id` (none:
    /// the list's memory goes back).
    fn queue_completed(st: &mut State, id: ConnId, done: Vec<u64>) {
        if done.is_empty() {
            events::give_keys(done);
        } else {
            st.events.push_back(Ev::Completed(id, done));
        }
    }

    /// The spin callback of a busy-polling loop, whose completion queues
    /// have no wait fd: reads the queue of the connection that had
    /// completions last (up to [`SPIN_READS`] times while it is empty, or
    /// more rounds of that when it is the only connection: see
    /// [`LibfabricConfig::spin_rounds`]), then those of [`SPIN_OTHERS`]
    /// other connections in turn, and of the lingering ones; dispatches
    /// what it found at once. `true` when it found something to hand over.
    fn spin_owned(this: Arc<Inner>) -> bool {
        let backend = LibfabricBackend {
            kind: Kind::Msg(this),
        };
        match &backend.kind {
            Kind::Msg(inner) => inner.spin(&backend),
            _ => false,
        }
    }

    /// One spin (see [`spin_owned`](Self::spin_owned), which makes
    /// `backend`, this backend's handle, of the reference the spin
    /// callback took: no other one is taken per spin).
    fn spin(&self, backend: &LibfabricBackend) -> bool {
        {
            let mut guard = lock(&self.state);
            if guard.dispatching {
                return false;
            }
            // What the reads queue is handed over right here, not posted.
            guard.dispatching = true;
            let hot = guard.hot;
            // A single message of the hot connection, read with nothing
            // else going on: handed over below without being held or
            // queued.
            let mut one = None;
            if let Some(id) = hot {
                let (g, found) = self.spin_hot(guard, id);
                guard = g;
                one = found.map(|first| (id, first));
            }
            let st = &mut *guard;
            // What the hot connection brought is handed over first; the
            // other queues are read after it (below), off its reply's path.
            let hot_found = one.is_some() || !st.events.is_empty();
            if !hot_found {
                self.spin_rest(st, hot);
            }
            if one.is_none() && st.events.is_empty() {
                st.dispatching = false;
                return false;
            }
            // Messages and completed sends (the usual find of a read: a
            // reply's completion and the next message): handed over right
            // here, in order, the messages under the lock of the read that
            // found them, with no event taken into a dispatch's batch.
            // Anything else, or more than a few, takes the dispatch.
            if one.is_some()
                || matches!(st.events.front(), Some(Ev::Deliver(_) | Ev::Completed(..)))
            {
                let _unwinding = events::ClearOnUnwind(|| {
                    let mut st = lock(&self.state);
                    st.dispatching = false;
                    self.post_dispatch(&mut st);
                });
                if let Some((id, first)) = one {
                    guard = self.deliver_locked(backend, id, guard, Some(first));
                }
                for _ in 0..SPIN_EVENTS {
                    match guard.events.front() {
                        Some(&Ev::Deliver(id)) => {
                            guard.events.pop_front();
                            guard = self.deliver_locked(backend, id, guard, None);
                        }
                        Some(Ev::Completed(..)) => {
                            let Some(Ev::Completed(id, keys)) = guard.events.pop_front() else {
                                unreachable!("the front was a completion report");
                            };
                            drop(guard);
                            lock(&self.handler).on_sends_completed(backend, id, &keys);
                            events::give_keys(keys);
                            guard = lock(&self.state);
                        }
                        _ => break,
                    }
                }
            }
            if hot_found {
                self.spin_rest(&mut guard, hot);
            }
            if guard.events.is_empty() {
                guard.dispatching = false;
                return true;
            }
        }
        self.run_dispatch();
        true
    }

    /// The spin's reads of the hot connection `id`: [`SPIN_READS`] while
    /// its queue is empty, and, when `id` is the only connection and
    /// nothing lingers, up to [`LibfabricConfig::spin_rounds`] rounds of
    /// them, the state unlocked between two rounds (another
    /// thread's send waits for one round at most) and none begun once
    /// work was announced to the loop or an event is queued. Returns the
    /// state locked again and the lone message found, if any. The
    /// connection stops being hot when it is gone, or when its queue
    /// stayed empty for one spin (one round a spin) or for
    /// [`HOT_IDLE_SPINS`] (more).
    fn spin_hot<'a>(
        &'a self,
        mut guard: MutexGuard<'a, State>,
        id: ConnId,
    ) -> (MutexGuard<'a, State>, Option<(usize, usize)>) {
        let mut rounds = 1;
        loop {
            let (read, single) = self.read_cq_one(&mut guard, id, SPIN_READS - 1);
            if read == Some(true) || single.is_some() {
                return (guard, single);
            }
            let alone = guard.conns.len() <= 1 && guard.lingering.is_empty();
            if read.is_some()
                && alone
                && rounds < self.fabric.spin_rounds
                && guard.events.is_empty()
                && !self.lp.work_announced()
            {
                rounds += 1;
                drop(guard);
                guard = lock(&self.state);
                if guard.hot == Some(id) {
                    continue;
                }
                return (guard, None);
            }
            let st = &mut *guard;
            if st.hot == Some(id) {
                st.hot_idle += 1;
                if read.is_none() || self.fabric.spin_rounds == 1 || st.hot_idle >= HOT_IDLE_SPINS {
                    st.hot = None;
                }
            }
            return (guard, None);
        }
    }

    /// The part of a spin after the hot connection: the other
    /// connections' queues ([`spin_others`](Self::spin_others)) and the
    /// lingering ones.
    fn spin_rest(&self, st: &mut State, hot: Option<ConnId>) {
        self.spin_others(st, hot);
        if !st.lingering.is_empty() {
            // The serials' memory is kept in the state.
            let mut serials = std::mem::take(&mut st.linger_serials);
            serials.clear();
            serials.extend(st.lingering.keys().copied());
            for &serial in &serials {
                self.read_lingering(st, serial);
            }
            st.linger_serials = serials;
        }
    }

    /// Reads the completion queues of up to [`SPIN_OTHERS`] established
    /// connections other than `hot`, going on from where the last spin
    /// stopped: every connection is read within a few spins, however many
    /// there are, and the hot one is not kept waiting behind them.
    fn spin_others(&self, st: &mut State, hot: Option<ConnId>) {
        if st.conns.len() <= 1 && hot.is_some_and(|id| st.conns.contains(id)) {
            // The hot connection is the only one.
            return;
        }
        let mut renewed = false;
        let mut read = 0;
        while read < SPIN_OTHERS {
            if st.spin_at >= st.spin_round.len() {
                if renewed {
                    return;
                }
                // A new round: the connections established now.
                let mut round = std::mem::take(&mut st.spin_round);
                round.clear();
                round.extend(
                    st.conns
                        .iter()
                        .filter(|(_, c)| c.phase == Phase::Established)
                        .map(|(id, _)| id),
                );
                st.spin_round = round;
                st.spin_at = 0;
                renewed = true;
                continue;
            }
            let id = st.spin_round[st.spin_at];
            st.spin_at += 1;
            if Some(id) != hot {
                self.read_cq(st, id, 0);
                read += 1;
            }
        }
    }

    fn on_cq(&self, id: ConnId) {
        {
            let mut st = lock(&self.state);
            if st.dispatching {
                self.progress_cq(&mut st, id);
                return;
            }
            // What the reads queue is handed over right here, not posted.
            st.dispatching = true;
            self.progress_cq(&mut st, id);
            if st.events.is_empty() {
                st.dispatching = false;
                return;
            }
        }
        self.run_dispatch();
    }

    fn on_eq(&self, id: ConnId) {
        let mut st = lock(&self.state);
        for _ in 0..TRYWAIT_ROUNDS {
            loop {
                let Some(c) = st.conns.get_mut(id) else {
                    return;
                };
                let ev = match c.link.eq().read() {
                    Ok(Some(ev)) => ev,
                    Ok(None) => break,
                    Err(e) => {
                        self.fail_conn(&mut st, id, e.errno, 0);
                        return;
                    }
                };
                let c = st.conns.get_mut(id).expect("checked above");
                let phase = c.phase;
                match ev {
                    EqEvent::Connected => {
                        if phase == Phase::Opening {
                            c.phase = Phase::Established;
                            let e = Ev::Established(id, c.remote, c.caps);
                            st.events.push_back(e);
                            self.post_dispatch(&mut st);
                            if !self.progress_cq(&mut st, id) {
                                return;
                            }
                        }
                    }
                    EqEvent::Shutdown => {
                        if phase == Phase::Opening {
                            self.refuse_conn(&mut st, id, RefuseReason::Refused);
                            return;
                        }
                        if !self.progress_cq(&mut st, id) {
                            return;
                        }
                        self.close_after_held(&mut st, id, CloseReason::PeerClosed);
                    }
                    EqEvent::Error { errno, prov_errno } => {
                        self.fail_conn(&mut st, id, errno, prov_errno);
                    }
                    EqEvent::ConnReq(_) | EqEvent::Other => {}
                }
            }
            let Some(c) = st.conns.get(id) else {
                return;
            };
            if c.link.eq().trywait() {
                return;
            }
        }
        self.post_with(move |i| i.on_eq(id));
    }

    fn fail_conn(&self, st: &mut State, id: ConnId, errno: i32, prov_errno: i32) {
        let Some(c) = st.conns.get(id) else {
            return;
        };
        let text = format!(
            "{} (provider error {prov_errno})",
            ffi::strerror(errno.saturating_abs())
        );
        if c.phase == Phase::Opening {
            let reason = match errno.saturating_abs() {
                libc::ECONNREFUSED => RefuseReason::Refused,
                libc::ENETUNREACH | libc::EHOSTUNREACH | libc::ETIMEDOUT => {
                    RefuseReason::Unreachable
                }
                libc::ECONNRESET => RefuseReason::Refused,
                _ => RefuseReason::Other(text),
            };
            self.refuse_conn(st, id, reason);
        } else {
            if !self.progress_cq(st, id) {
                return;
            }
            let reason = match errno.saturating_abs() {
                libc::ETIMEDOUT => CloseReason::TimedOut,
                libc::ECONNRESET | libc::EPIPE | libc::ECONNABORTED => CloseReason::Reset,
                _ => CloseReason::Other(text),
            };
            self.close_after_held(st, id, reason);
        }
    }

    /// A connection request read by the listener thread of `addr`
    /// (on the loop thread).
    fn on_request(
        &self,
        addr: EndpointAddress,
        pep: &ffi::PassiveEp,
        req: ConnRequest,
        known: KnownPeer,
    ) {
        let mut st = lock(&self.state);
        let Some(l) = st.listeners.get(&addr) else {
            // Closed meanwhile: the peer sees its connection refused.
            pep.reject(req);
            return;
        };
        let params = l.params.clone();
        let held = st
            .conns
            .iter()
            .filter(|(_, c)| c.listener == Some(addr))
            .count();
        if held >= self.fabric.lf.max_connections_per_listener {
            self.refused.fetch_add(1, Ordering::Relaxed);
            pep.reject(req);
            return;
        }
        self.accept(&mut st, addr, params, req, known);
    }

    /// Opens and accepts an endpoint for a connection request. A failure
    /// is counted in `refused` before the request or the endpoint is
    /// dropped (the request is then left to the provider, and the peer
    /// sees its connection end), so that the listener's count never lags
    /// what the peer can see.
    fn accept(
        &self,
        st: &mut State,
        addr: EndpointAddress,
        params: ConnectionParams,
        req: ConnRequest,
        known: KnownPeer,
    ) {
        let refused = || self.refused.fetch_add(1, Ordering::Relaxed);
        let Some(remote) = req.peer() else {
            refused();
            return;
        };
        let domain = match st.listeners.get(&addr) {
            Some(l) => Arc::clone(&l.domain),
            None => {
                refused();
                return;
            }
        };
        let (spec, receive, limit) = self.link_spec(&params);
        let Ok(mut link) = Link::open(&domain, req.into_info(), spec) else {
            refused();
            return;
        };
        if let Some(p) = self.send_pool_for(&params) {
            link.keep_pool(p);
        }
        let caps = params.capabilities(&self.config, true);
        let fds = link.fds();
        let order = st.next_order;
        st.next_order += 1;
        let recv_mem = link.recv_mem();
        let id = st.conns.insert(Conn {
            link,
            phase: Phase::Opening,
            initiator: false,
            remote: EndpointAddress::from(remote),
            listener: Some(addr),
            caps,
            receive,
            recv_limit: limit,
            paused: false,
            held: VecDeque::new(),
            recv_mem,
            ran_dry: false,
            unposted: Vec::new(),
            pending_close: None,
            deliver_queued: false,
            starved: false,
            sources: None,
            fds,
            order,
            opened_at: self.lp.now(),
            _known: Some(known),
        });
        if self.register_conn(st, id).is_err() {
            refused();
            if let Some(c) = st.conns.remove(id) {
                let _ = c.link.close();
            }
            return;
        }
        let c = st.conns.get_mut(id).expect("just inserted");
        if c.link.accept().is_err() {
            refused();
            let mut c = st.conns.remove(id).expect("just inserted");
            deregister_conn(&self.lp, &mut c);
            let _ = c.link.close();
            return;
        }
        self.watch_setup(st);
    }

    /// Starts the set-up deadline's timer for a connection just opened
    /// (if it is not running for an earlier one).
    fn watch_setup(&self, st: &mut State) {
        let timeout = self.fabric.lf.handshake_timeout;
        let deadline = self.lp.now().saturating_add(timeout);
        if st.setup_deadline.is_none_or(|d| deadline < d) {
            st.setup_deadline = Some(deadline);
            self.setup_timer
                .start(timeout.max(Duration::from_micros(1)));
        }
    }

    /// Ends the connections still opening after `handshake_timeout`: an
    /// initiated one is refused (`Unreachable`), an accepted one closed
    /// unreported (its peer sees the connection end).
    fn on_setup_timer(&self) {
        let mut st = lock(&self.state);
        let now = self.lp.now();
        let timeout = self.fabric.lf.handshake_timeout;
        let mut next: Option<Duration> = None;
        let mut late = Vec::new();
        for (id, c) in st.conns.iter() {
            if c.phase != Phase::Opening {
                continue;
            }
            let deadline = c.opened_at.saturating_add(timeout);
            if deadline <= now {
                late.push(id);
            } else {
                next = Some(next.map_or(deadline, |n| n.min(deadline)));
            }
        }
        for id in late {
            if st.conns.get(id).is_some_and(|c| !c.initiator) {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            self.refuse_conn(&mut st, id, RefuseReason::Unreachable);
        }
        // Connections abandoned while opening: closed once their set-up
        // ended (connected, refused, or past the deadline).
        for (link, deadline) in std::mem::take(&mut st.abandoned) {
            // Any event (connected, refused, an error) ends the set-up.
            let ended = match link.eq().read() {
                Ok(Some(_)) | Err(_) => true,
                Ok(None) => deadline <= now,
            };
            if ended {
                let _ = link.close();
            } else {
                st.abandoned.push((link, deadline));
            }
        }
        if !st.abandoned.is_empty() {
            next = Some(next.map_or(now + ABANDONED_POLL, |n| n.min(now + ABANDONED_POLL)));
        }
        st.setup_deadline = next;
        match next {
            Some(n) => self
                .setup_timer
                .start(n.saturating_sub(now).max(Duration::from_micros(1))),
            None => self.setup_timer.stop(),
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

    // -- dispatch (loop thread, no lock held while the handler runs) -------

    fn dispatch(&self) {
        if events::begin_dispatch(&self.state) {
            self.run_dispatch();
        }
    }

    /// Hands the queued events over; `State::dispatching` is set. Clears
    /// it under the lock when the queue is found empty (or posts another
    /// dispatch when events are left for another round).
    fn run_dispatch(&self) {
        let backend = self.backend();
        // A handler's panic leaves what was not handed over queued (and
        // the flag cleared): a posted dispatch takes it.
        let _unwinding = events::ClearOnUnwind(|| self.post_dispatch(&mut lock(&self.state)));
        let done = events::run_dispatch(
            &self.state,
            &backend,
            &self.handler,
            |id| self.deliver(&backend, id),
            // Completions are reported as they are read, on the loop.
            |_| {},
        );
        if !done {
            let mut st = lock(&self.state);
            self.post_dispatch(&mut st);
        }
    }

    fn deliver(&self, backend: &LibfabricBackend, id: ConnId) {
        drop(self.deliver_locked(backend, id, lock(&self.state), None));
    }

    /// [`deliver`](Self::deliver), starting under the state lock `st` (the
    /// spin's, which found the messages) and returning with it held;
    /// `first`, a message (buffer, length) to hand over before the held
    /// ones, taken from a read by [`read_cq_one`](Self::read_cq_one).
    fn deliver_locked<'a>(
        &'a self,
        backend: &LibfabricBackend,
        id: ConnId,
        st: MutexGuard<'a, State>,
        first: Option<(usize, usize)>,
    ) -> MutexGuard<'a, State> {
        let mut reposted = false;
        let mut st = self.deliver_held(backend, id, &mut reposted, st, first);
        if reposted {
            // A provider may hold a message whose header it read while no
            // buffer was posted (libfabric 1.17 `tcp`); posting a buffer
            // does not complete it and `fi_trywait` does not report it, so
            // the queue is read again now, or that message would wait for
            // unrelated traffic.
            // A busy-polling loop never sleeps on the queue's fd: one read
            // is enough, without `fi_trywait`, and only where the provider
            // may hold such a message. Only a provider without a posted
            // buffer holds one, and then every completion it wrote is in
            // the queue: either a read saw every buffer out of its hands
            // (`ran_dry`), or completions are left unread, and the spin or
            // their fd's readiness brings the next read. (A loop that
            // sleeps reads here in any case: the read also takes the
            // completion of a reply sent from the handler, which would
            // otherwise wake the loop once more.)
            let dry = st
                .conns
                .get_mut(id)
                .is_some_and(|c| std::mem::take(&mut c.ran_dry));
            if self.spin.is_some() {
                if !dry {
                    return st;
                }
                self.read_cq(&mut st, id, 0);
            } else {
                self.progress_cq(&mut st, id);
            }
        }
        st
    }

    /// Delivers the held messages of `id` (up to 1,024, or for
    /// [`events::DISPATCH_BUDGET`], then queues the rest), `first` before
    /// them, starting under the state lock `st` and taking it once per
    /// message besides the handler call; returns with the lock held.
    fn deliver_held<'a>(
        &'a self,
        backend: &LibfabricBackend,
        id: ConnId,
        reposted: &mut bool,
        mut st: MutexGuard<'a, State>,
        mut first: Option<(usize, usize)>,
    ) -> MutexGuard<'a, State> {
        let mut budget = Budget::new(DELIVER_CLOCK_EVERY);
        for _ in 0..1024 {
            let Some(c) = st.conns.get_mut(id) else {
                return st;
            };
            if c.paused {
                // Kept, in order, for the delivery after a resume.
                if let Some(m) = first.take() {
                    c.held.push_front(m);
                }
                c.deliver_queued = false;
                return st;
            }
            let next = first.take().or_else(|| c.held.pop_front());
            let (mem, index, len) = match (next, &c.recv_mem) {
                (Some((index, len)), Some(mem)) => (Arc::clone(mem), index, len),
                (Some(_), None) => unreachable!("a message held without receive memory"),
                (None, _) => {
                    self.end_run(&mut st, id);
                    return st;
                }
            };
            drop(st);
            {
                let _unwinding = events::ClearOnUnwind(|| self.delivery_unwound(id, index));
                // The buffer is not posted again before on_data returns:
                // its bytes stay put.
                lock(&self.handler).on_data(backend, id, mem.bytes(index, len));
            }
            st = lock(&self.state);
            let Some(c) = st.conns.get_mut(id) else {
                return st;
            };
            c.unposted.push(index);
            if !c.paused {
                *reposted |= self.repost(&mut st, id);
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
    /// held messages is carried out now (no other event would bring it).
    fn end_run(&self, st: &mut State, id: ConnId) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        c.deliver_queued = false;
        if c.held.is_empty() {
            if let Some(reason) = c.pending_close.take() {
                self.close_conn(st, id, reason, false);
            }
        } else {
            self.queue_deliver(st, id);
        }
    }

    /// A handler panicked in `on_data` for the message in buffer `index`
    /// of `id`: the connection is left as after a delivery that ended with
    /// that message. Its buffer is posted again, the messages held after
    /// it are queued for another delivery (or a close waiting for them to
    /// be handed over is carried out), and the completion queue is read
    /// again on a later turn, as after any re-post.
    fn delivery_unwound(&self, id: ConnId, index: usize) {
        let mut st = lock(&self.state);
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        c.unposted.push(index);
        if !c.paused {
            self.repost(&mut st, id);
        }
        self.end_run(&mut st, id);
        self.post_dispatch(&mut st);
        drop(st);
        self.post_with(move |i| {
            let mut st = lock(&i.state);
            if i.spin.is_some() {
                i.read_cq(&mut st, id, 0);
            } else {
                i.progress_cq(&mut st, id);
            }
            i.post_dispatch(&mut st);
        });
    }

    /// Posts the receive buffers waiting to be posted again; `true` if any
    /// was posted (the caller then reads the completion queue again before
    /// the loop sleeps, see [`deliver`](Self::deliver)).
    fn repost(&self, st: &mut State, id: ConnId) -> bool {
        let Some(c) = st.conns.get_mut(id) else {
            return false;
        };
        let mut failed = None;
        let mut posted = false;
        // Drained in place: the list keeps its memory for the next
        // delivery (taking it would free and allocate it once a message).
        for index in c.unposted.drain(..) {
            match c.link.post_recv(index) {
                Ok(()) => posted = true,
                Err(e) => failed = Some(e),
            }
        }
        if posted && c.starved {
            c.starved = false;
            self.post_with(move |i| i.on_cq(id));
        }
        if let Some(e) = failed {
            self.close_conn(st, id, CloseReason::Other(e.to_string()), false);
            return false;
        }
        posted
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

    fn established(&self, st: &State, conn: ConnId) -> bool {
        st.conns
            .get(conn)
            .is_some_and(|c| c.phase == Phase::Established)
    }
}

fn socket_addr(a: EndpointAddress) -> SocketAddr {
    SocketAddr::new(a.ip(), a.port())
}

fn post_error(e: PostError) -> SendError {
    match e {
        PostError::Again => SendError::NoResources,
        PostError::Failed(e) => SendError::Failed(fi_source(e)),
    }
}

/// The operations of [`Backend`], implemented by each endpoint type's
/// connection manager; [`LibfabricBackend`] forwards to one of them.
pub(crate) trait Ops {
    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError>;
    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError>;
    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError>;
    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError>;
    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError>;
    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError>;
    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;
    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;
    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError>;
    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError>;
    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError>;
    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError>;
    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError>;
    fn memory_usage(&self) -> MemoryUsage;
    fn now(&self) -> Duration;
    fn set_timer(&self, delay: Duration, token: u64);
    fn wake(&self, token: u64);
}

impl Backend for LibfabricBackend {
    fn features(&self) -> Features {
        match self.kind {
            Kind::Msg(_) => Self::FEATURES,
            Kind::Rdm(_) => Self::RDM_FEATURES,
        }
    }

    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        self.ops().open_listen_endpoint(address, params)
    }

    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        self.ops().open_active_endpoint(address, params)
    }

    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError> {
        self.ops().close_listen_endpoint(address)
    }

    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError> {
        self.ops().close_active_endpoint(conn)
    }

    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        self.ops().get_buffer(conn)
    }

    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError> {
        self.ops().send_buffer(conn, buffer, key)
    }

    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        self.ops().send_data(conn, data, header, key)
    }

    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        self.ops().send_data_copy(conn, data, header, key)
    }

    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError> {
        self.ops().num_available_buffers(conn)
    }

    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        self.ops().pause_receive(conn)
    }

    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        self.ops().resume_receive(conn)
    }

    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError> {
        self.ops().remote_address(conn)
    }

    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError> {
        self.ops().connection_to(remote)
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.ops().memory_usage()
    }

    fn now(&self) -> Duration {
        self.ops().now()
    }

    fn set_timer(&self, delay: Duration, token: u64) {
        self.ops().set_timer(delay, token)
    }

    fn wake(&self, token: u64) {
        self.ops().wake(token)
    }
}

impl Ops for Inner {
    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        let inner = self;
        netio_core::preamble::open_listen(inner.thread_ok(), address, &params, &inner.config)?;
        let ip = address.ip();
        if params.recv.use_shared_pool {
            return Err(OpenListenError::NotSupported("shared receive pools"));
        }
        let mut st = lock(&inner.state);
        if address.port() != 0 && st.listeners.contains_key(&address) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(address));
        }
        let failed = |error: FiError| OpenListenError::FailedOpenListenEndpoint {
            address,
            source: Box::new(FabricError {
                provider: inner.fabric.provider.clone(),
                addr: socket_addr(address),
                error,
            }),
        };
        let info = inner
            .info(socket_addr(address), true, params.recv.num_buf)
            .map_err(failed)?;
        let domain = inner.domain_for(&mut st, &info).map_err(failed)?;
        let pep = domain.listen(info).map_err(failed)?;
        let bound = pep.local_addr().map_err(failed)?;
        let bound = EndpointAddress::from(SocketAddr::new(ip, bound.port()));
        if st.listeners.contains_key(&bound) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(bound));
        }
        let pep = Arc::new(pep);
        let guard = (inner.fabric.provider == "tcp").then_some(GuardSettings {
            timeout: inner.fabric.lf.handshake_timeout,
            max_pending: inner.fabric.lf.max_pending_handshakes,
        });
        let w = inner.weak.clone();
        let lp = inner.lp.clone();
        let p = Arc::clone(&pep);
        let worker = ListenWorker::spawn(
            Arc::clone(&pep),
            socket_addr(bound),
            guard,
            Arc::clone(&inner.refused),
            move |req, known| {
                let w = w.clone();
                let p = Arc::clone(&p);
                lp.post(move || match w.upgrade() {
                    Some(i) => i.on_request(bound, &p, req, known),
                    None => p.reject(req),
                });
            },
        )
        .map_err(|e| OpenListenError::FailedOpenListenEndpoint {
            address,
            source: Box::new(e),
        })?;
        st.listeners.insert(
            bound,
            Listener {
                _worker: worker,
                _pep: pep,
                domain,
                params,
            },
        );
        Ok(bound)
    }

    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        let inner = self;
        netio_core::preamble::open_active(inner.thread_ok(), address, &params, &inner.config)?;
        if params.recv.use_shared_pool {
            return Err(OpenActiveError::NotSupported("shared receive pools"));
        }
        let failed = |error: FiError| OpenActiveError::FailedOpenActiveEndpoint {
            address,
            source: Box::new(FabricError {
                provider: inner.fabric.provider.clone(),
                addr: socket_addr(address),
                error,
            }),
        };
        let mut st = lock(&inner.state);
        let info = inner
            .info(socket_addr(address), false, params.recv.num_buf)
            .map_err(failed)?;
        let domain = inner.domain_for(&mut st, &info).map_err(failed)?;
        let (spec, receive, limit) = inner.link_spec(&params);
        let mut link = Link::open(&domain, info, spec).map_err(failed)?;
        if let Some(p) = inner.send_pool_for(&params) {
            link.keep_pool(p);
        }
        let caps = params.capabilities(&inner.config, true);
        let fds = link.fds();
        let order = st.next_order;
        st.next_order += 1;
        let recv_mem = link.recv_mem();
        let id = st.conns.insert(Conn {
            link,
            phase: Phase::Opening,
            initiator: true,
            remote: address,
            listener: None,
            caps,
            receive,
            recv_limit: limit,
            paused: false,
            held: VecDeque::new(),
            recv_mem,
            ran_dry: false,
            unposted: Vec::new(),
            pending_close: None,
            deliver_queued: false,
            starved: false,
            sources: None,
            fds,
            order,
            opened_at: inner.lp.now(),
            _known: None,
        });
        if let Err(e) = inner.register_conn(&mut st, id) {
            if let Some(c) = st.conns.remove(id) {
                let _ = c.link.close();
            }
            return Err(OpenActiveError::FailedOpenActiveEndpoint {
                address,
                source: Box::new(e),
            });
        }
        let c = st.conns.get_mut(id).expect("just inserted");
        if let Err(e) = c.link.connect() {
            // Reported like any refusal, from the loop.
            let reason = match e.errno {
                libc::ECONNREFUSED => RefuseReason::Refused,
                libc::ENETUNREACH | libc::EHOSTUNREACH => RefuseReason::Unreachable,
                _ => RefuseReason::Other(e.to_string()),
            };
            inner.refuse_conn(&mut st, id, reason);
        } else {
            inner.watch_setup(&mut st);
        }
        Ok(id)
    }

    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = lock(&inner.state);
        let Some(l) = st.listeners.remove(&address) else {
            return Err(CloseError::UnknownListenEndpoint(address));
        };
        // Stops the listener's threads; the passive endpoint closes when
        // the last of them lets go.
        drop(l);
        let ids: Vec<ConnId> = st
            .conns
            .iter()
            .filter(|(_, c)| c.listener == Some(address))
            .map(|(id, _)| id)
            .collect();
        for id in ids {
            inner.close_conn(&mut st, id, CloseReason::ListenerClosed, true);
        }
        Ok(())
    }

    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = lock(&inner.state);
        if !st.conns.contains(conn) {
            return Err(CloseError::UnknownConnection(conn));
        }
        inner.close_conn(&mut st, conn, CloseReason::Local, true);
        Ok(())
    }

    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        let pool = self.send_pool(conn)?;
        Ok(pool.get())
    }

    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(SendError::WrongThread);
        }
        let mut st = lock(&inner.state);
        if !inner.established(&st, conn) {
            return Err(SendError::UnknownConnection(conn));
        }
        let c = st.conns.get_mut(conn).expect("checked");
        match c.link.send_buffer(buffer, key) {
            Ok(()) => Ok(()),
            Err((PostError::Failed(e), Some(b))) if e.call.contains("foreign") => {
                drop(b);
                Err(SendError::ForeignBuffer)
            }
            Err((e, b)) => {
                drop(b);
                Err(post_error(e))
            }
        }
    }

    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let inner = self;
        netio_core::preamble::send(inner.thread_ok(), header)?;
        let mut st = lock(&inner.state);
        if !inner.established(&st, conn) {
            return Err(SendError::UnknownConnection(conn));
        }
        let c = st.conns.get_mut(conn).expect("checked");
        let Some(region) = c.link_region() else {
            return Err(SendError::NotSupported(
                "zero-copy send on a connection without a memory region",
            ));
        };
        if !c.link.has_room() {
            return Err(SendError::NoResources);
        }
        let lent = region.lend(data).map_err(|_| SendError::OutsideRegion)?;
        let total = header.len() + lent.len();
        if total > c.link.max_msg_size() {
            return Err(SendError::MessageTooLarge {
                len: total,
                max: c.link.max_msg_size(),
            });
        }
        c.link.send_zero_copy(lent, header, key).map_err(post_error)
    }

    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let inner = self;
        netio_core::preamble::send(inner.thread_ok(), header)?;
        let mut st = lock(&inner.state);
        if !inner.established(&st, conn) {
            return Err(SendError::UnknownConnection(conn));
        }
        let c = st.conns.get_mut(conn).expect("checked");
        let total = header.len() + data.iter().map(|d| d.len()).sum::<usize>();
        if total > c.link.max_msg_size() {
            return Err(SendError::MessageTooLarge {
                len: total,
                max: c.link.max_msg_size(),
            });
        }
        c.link.send_copy(data, header, key).map_err(post_error)
    }

    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError> {
        let pool = self.send_pool(conn)?;
        Ok(pool.take_low_water())
    }

    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = lock(&inner.state);
        let c = st
            .conns
            .get_mut(conn)
            .ok_or(ConnError::UnknownConnection(conn))?;
        c.paused = true;
        Ok(())
    }

    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = lock(&inner.state);
        let c = st
            .conns
            .get_mut(conn)
            .ok_or(ConnError::UnknownConnection(conn))?;
        if !c.paused {
            return Ok(());
        }
        c.paused = false;
        let pending = c.pending_close.is_some() && c.held.is_empty();
        // The queue is read again below (posted) whatever this posted.
        inner.repost(&mut st, conn);
        if pending {
            let reason = st.conns.get_mut(conn).and_then(|c| c.pending_close.take());
            if let Some(r) = reason {
                inner.close_conn(&mut st, conn, r, false);
            }
            return Ok(());
        }
        inner.queue_deliver(&mut st, conn);
        // Completions that came while paused (and the trywait state) are
        // read again on the loop.
        inner.post_with(move |i| i.on_cq(conn));
        Ok(())
    }

    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let st = lock(&inner.state);
        st.conns
            .get(conn)
            .map(|c| c.remote)
            .ok_or(ConnError::UnknownConnection(conn))
    }

    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let st = lock(&inner.state);
        st.conns
            .iter()
            .filter(|(_, c)| c.remote == remote)
            .min_by_key(|(_, c)| c.order)
            .map(|(id, _)| id)
            .ok_or(ConnError::NoConnectionTo(remote))
    }

    fn memory_usage(&self) -> MemoryUsage {
        let inner = self;
        let st = lock(&inner.state);
        let mut usage = MemoryUsage::default();
        for (_, c) in st.conns.iter() {
            if c.receive {
                let (size, num) = c.link.recv_shape();
                usage.receive_bytes += size * num;
            }
        }
        usage.send_bytes = events::pool_bytes(
            inner
                .shared_send
                .iter()
                .cloned()
                .chain(st.conns.iter().flat_map(|(_, c)| c.link_pools())),
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
        let inner = self;
        let mut st = lock(&inner.state);
        st.events.push_back(Ev::Wake(token));
        inner.post_dispatch(&mut st);
    }
}

impl Conn {
    /// Receive buffers the provider holds now: all of them but those whose
    /// message waits for delivery and those waiting to be posted again.
    fn posted_receives(&self) -> usize {
        let (_, num) = self.link.recv_shape();
        num.saturating_sub(self.held.len() + self.unposted.len())
    }

    fn link_region(&self) -> Option<netio_core::MemoryRegion> {
        self.link.region()
    }

    fn link_pools(&self) -> Vec<BufferPool> {
        self.link.pools()
    }
}

impl Inner {
    fn send_pool(&self, conn: ConnId) -> Result<BufferPool, BufferError> {
        let inner = self;
        if !inner.thread_ok() {
            return Err(BufferError::WrongThread);
        }
        let st = lock(&inner.state);
        match st.conns.get(conn) {
            Some(c) if c.phase == Phase::Established => c
                .link
                .pools()
                .into_iter()
                .next()
                .ok_or(BufferError::NoBuffersAllocated(conn)),
            _ => Err(BufferError::UnknownConnection(conn)),
        }
    }
}
