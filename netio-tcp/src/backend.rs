//! The TCP backend: endpoints, sends and the loop-thread I/O paths.
//!
//! All state sits behind one lock (a `LoopLock`: a mutex in thread-safe
//! mode; in thread-unsafe mode, where only the loop thread may touch it,
//! no lock at all, just a check of the thread). Backend operations (any
//! thread in thread-safe mode) change it and post work to the loop: writes are
//! flushed by one posted task per batch, and handler events are queued and
//! dispatched by a posted task. The loop thread reads with no lock held
//! (the connection's reader is taken out of the state while it reads) and
//! hands messages to the handler straight out of the read buffer. The
//! handler is never called while the state lock is held, and never from
//! inside an operation.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::unix::SourceFd;
use mio::Interest;
use netio_core::mio_loop::{LoopLock, LoopLockGuard, MioLoop, MioTimer, SourceId, SpinId};
use netio_core::{
    send_buffers_in_order, Backend, BackendConfig, BatchSendError, BufferError, BufferPool,
    CloseError, CloseReason, ConnError, ConnId, ConnTable, ConnectionParams, CopyMessage,
    CreateError, EndpointAddress, EventLoop, Features, Handler, MemoryUsage, NetworkBuffer,
    NetworkMode, OpenActiveError, OpenListenError, RefuseReason, RegionSlice, SendError,
    ThreadSafety, Timer, TimerQueue,
};

use crate::config::TcpConfig;
use crate::conn::{
    Conn, Ev, Events, Flushed, LingerStatus, Lingering, Out, Payload, Phase, Reader, Release,
};
use crate::socket;
use crate::stats::{BackendStats, ConnStats};
use crate::wire::{
    CloseCode, CloseFrame, DataPrefix, Frame, FrameDecoder, FrameHeader, FrameType, Handshake,
    WireError, FRAME_HEADER_LEN, MAX_MESSAGE_LEN,
};

/// Reads per readable event before other sources get a turn.
const MAX_READS_PER_EVENT: usize = 32;
/// Connections accepted per listener event before other sources get a turn.
const MAX_ACCEPTS_PER_EVENT: usize = 256;
/// Period of the timer that enforces handshake, partial-message and linger
/// deadlines.
const DEADLINE_TICK: Duration = Duration::from_millis(50);
/// A copy send of at least this many bytes on a connection with nothing
/// queued is written straight from the caller's slices (the kernel's copy
/// is then the only one); smaller ones are copied into the connection's
/// ring and leave together with the sends made in the same callback.
const WRITE_THROUGH_MIN: usize = 32 * 1024;
/// How many times the spin callback of a busy-polling loop reads the hot
/// connection's empty socket before it gives the loop its turn back (the
/// loop's turn, with its `epoll_wait` every few turns, costs more than a
/// read, so a message that lands meanwhile waits longer).
const SPIN_READS: u32 = 4;
/// After this many reads in a row found data on the hot connection of a
/// busy-polling loop, its socket leaves epoll: the spin reads it anyway,
/// and epoll's wake-up callback on every arrival costs about a tenth of a
/// microsecond per message (inside the sender's call, on loopback). It is
/// back in epoll when another connection becomes hot, when a write to it
/// blocks (it needs writability reported), and when it closes. The streak
/// keeps a server whose hot connection changes with every message from
/// paying two `epoll_ctl` calls per message.
const SUSPEND_AFTER: u32 = 64;
/// A buffered send of at most this many bytes is copied into the
/// connection's ring (its buffer held until it completes): a gather write
/// costs the kernel more per slice than copying a small message costs here.
const COALESCE_MAX: usize = 2048;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The TCP backend: a cheap handle (clones share one backend).
///
/// Create it with [`TcpProvider::create`](crate::TcpProvider) or
/// [`TcpBackend::new`] on a [`MioLoop`], which must be run (on any thread)
/// for anything to happen. See the [crate documentation](crate) for an
/// example.
///
/// # Faulty and hostile peers
///
/// No input from a peer makes the backend panic, allocate beyond its pools
/// or stop serving its other connections:
///
/// - A peer that is not a netio peer, speaks another version, or closes or
///   stays silent during the handshake
///   ([`TcpConfig::handshake_timeout`]) is turned away: the initiator
///   reports `RefuseReason::Handshake`, the accepting side nothing.
/// - A DATA frame above the receive limit (up to `u32::MAX`) closes the
///   connection with `CloseReason::MessageTooLarge` before any of its body
///   is read; other violations with `CloseReason::Protocol`; a frame cut
///   short, a reset or a broken pipe with `CloseReason::Reset`. Writes never
///   raise SIGPIPE.
/// - A peer that never reads holds at most `send_queue_depth` copy or
///   zero-copy sends and its send pool's buffers
///   ([`queued_send_bytes`](Self::queued_send_bytes)); further sends answer
///   `NoResources` or `get_buffer` gives `None`. A send keeps its slot or
///   buffer until its completion has been reported to the handler.
/// - A flood of connections holds at most
///   [`TcpConfig::max_accepted_handshakes`] accepted connections that have
///   not completed their handshake; the others wait in the listen backlog,
///   nothing allocated for them, and are accepted as handshakes end. A
///   listener at [`TcpConfig::max_connections_per_listener`] closes what
///   it accepts at once.
/// - When the process runs out of file descriptors, opening endpoints
///   answers `NoResources`, and connections waiting to be accepted stay in
///   the listener's backlog and are accepted once descriptors are free
///   again (retried every 50 ms, without spinning).
/// - A message larger than the read buffer holds a buffer of the
///   connection's receive pool until its last byte arrives. On a *shared*
///   pool (a listener's, or the backend's) a peer that starts such a
///   message and then stalls would starve every other connection using the
///   pool: they stop reading once all its buffers are taken. So such a
///   message must be complete within
///   [`TcpConfig::partial_message_timeout`] (5 s by default) of taking its
///   buffer; otherwise the connection is closed in the orderly way (CLOSE
///   code 2) with `CloseReason::Protocol("message incomplete for 5s: …")`,
///   the buffer returns to the pool and the waiting connections resume.
///   The check costs nothing per message: the deadline timer runs while
///   such a message is under way. A connection with its own receive pool
///   is not limited, since its stalled message starves nobody else.
/// - A peer that stops answering altogether (crashed host, cut network) is
///   noticed by the kernel after
///   [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout)
///   (keepalive probes and `TCP_USER_TIMEOUT`, see
///   [`TcpConfig::keepalive`]): the connection closes with
///   `CloseReason::TimedOut`. Without a peer timeout that takes the
///   system's limits (minutes to hours).
#[derive(Clone)]
pub struct TcpBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for TcpBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("TcpBackend");
        d.field("thread_safety", &self.inner.config.thread_safety);
        // In thread-unsafe mode the state is visible on the loop thread only.
        if let Some(st) = self.inner.state.try_lock() {
            d.field("listeners", &st.listeners.len())
                .field("connections", &st.conns.len())
                .field("lingering", &st.lingering.len());
        }
        d.finish_non_exhaustive()
    }
}

struct Listener {
    sock: mio::net::TcpListener,
    source: SourceId,
    params: ConnectionParams,
    /// The pool of a listener opened with `recv.use_shared_pool` and its
    /// own sizes, shared by the connections it accepts.
    recv_pool: Option<BufferPool>,
    /// Accepting failed for want of a resource (descriptors, memory): the
    /// deadline timer tries again, since no new readiness event may come
    /// for the connections waiting in the backlog.
    retry_accept: bool,
    /// Accepting stopped at `TcpConfig::max_accepted_handshakes`: accepting
    /// resumes when a handshake ends, since no new readiness event comes
    /// for the connections already waiting in the backlog.
    at_handshake_limit: bool,
    /// Connections it accepted that are still in the table (the bound of
    /// `TcpConfig::max_connections_per_listener`).
    held: usize,
}

/// Ends a run of the loop thread that writes what its handlers sent when
/// it ends ([`Inner::begin_run`]): runs [`Inner::end_run`] when dropped,
/// also when a handler panics, if this run set `State::flush_at_end`.
struct RunEnd<'a>(&'a Arc<Inner>, bool);

impl Drop for RunEnd<'_> {
    fn drop(&mut self) {
        if self.1 {
            self.0.end_run();
        }
    }
}

/// Ends a dispatch that a handler's panic cut short: what it had not handed
/// over yet waits for a posted dispatch.
struct DispatchEnd<'a>(&'a Inner);

impl Drop for DispatchEnd<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut st = self.0.state.lock();
            st.dispatching = false;
            self.0.post_dispatch(&mut st);
        }
    }
}

#[derive(Default)]
struct State {
    listeners: HashMap<EndpointAddress, Listener>,
    /// Every connection, opening or established, opened here or accepted:
    /// looked up by handle (an index and a generation), never by address.
    conns: ConnTable<Conn>,
    /// Sockets of closed connections still finishing their last frames.
    lingering: HashMap<ConnId, Lingering>,
    events: Events,
    /// The lists a dispatch drained, kept for the next dispatch to swap in
    /// (no allocation per dispatch, none for the events queued meanwhile).
    spare_events: Events,
    dispatch_posted: bool,
    /// A dispatch runs on the loop thread ([`Inner::dispatch`]): events
    /// queued meanwhile (a handler's `wake`, a completion) are handed over
    /// by its next round, so no dispatch is posted for them.
    dispatching: bool,
    dirty: Vec<ConnId>,
    flush_posted: bool,
    /// A run of the loop thread that hands messages or events to the
    /// handler (a readiness event, a spin, a posted dispatch, a timer) is
    /// under way and writes the connections marked dirty when it ends
    /// ([`Inner::begin_run`]): a send meanwhile posts no flush of its own.
    flush_at_end: bool,
    /// Runs ended so far (tests: which run handed something over).
    #[cfg(test)]
    runs_ended: u64,
    /// Connections waiting for a receive-pool buffer.
    pool_waiters: Vec<ConnId>,
    /// The connection that delivered data last: where a busy-polling loop
    /// looks first (see [`Inner::spin`]).
    hot: Option<ConnId>,
    /// Reads in a row that found data on `hot` (see [`SUSPEND_AFTER`]).
    hot_streak: u32,
    /// Order of opening and accepting (see `Conn::seq`).
    next_seq: u64,
    /// Accepted connections still exchanging handshakes (the bound of
    /// `TcpConfig::max_accepted_handshakes`).
    accepted_handshaking: usize,
    /// Some listener stopped accepting at the handshake limit (see
    /// `Listener::at_handshake_limit`): the next handshake to end resumes
    /// accepting.
    accept_stopped: bool,
    /// Lifecycle counters, and the traffic of connections gone.
    counts: BackendStats,
    timer_running: bool,
}

/// The buffer pools of listeners and connections, each counted once
/// however many connections share it (keyed by pool identity and
/// direction), kept apart from the state so that `memory_usage` works from
/// any thread in both modes. Changed on open, establish and close only.
#[derive(Default)]
struct PoolTally {
    pools: HashMap<(usize, bool), (BufferPool, usize)>,
}

impl PoolTally {
    fn add(&mut self, pool: Option<&BufferPool>, recv: bool) {
        if let Some(p) = pool {
            self.pools
                .entry((p.id(), recv))
                .or_insert_with(|| (p.clone(), 0))
                .1 += 1;
        }
    }

    fn remove(&mut self, pool: Option<&BufferPool>, recv: bool) {
        if let Some(p) = pool {
            let key = (p.id(), recv);
            if let Some(e) = self.pools.get_mut(&key) {
                e.1 -= 1;
                if e.1 == 0 {
                    self.pools.remove(&key);
                }
            }
        }
    }

    fn counts(&self, pool: &BufferPool, recv: bool) -> bool {
        self.pools.contains_key(&(pool.id(), recv))
    }

    fn usage(&self) -> MemoryUsage {
        let mut usage = MemoryUsage::default();
        for ((_, recv), (p, _)) in &self.pools {
            if *recv {
                usage.receive_bytes += p.bytes();
            } else {
                usage.send_bytes += p.bytes();
            }
        }
        usage
    }
}

struct Inner {
    lp: MioLoop,
    config: BackendConfig,
    tcp: TcpConfig,
    /// Called on the loop thread only, in both modes: no lock.
    handler: LoopLock<Box<dyn Handler<TcpBackend>>>,
    state: LoopLock<State>,
    /// The buffer pools in use, for `memory_usage` from any thread.
    pools: Mutex<PoolTally>,
    shared_send: Option<BufferPool>,
    shared_recv: Option<BufferPool>,
    weak: Weak<Inner>,
    timer: MioTimer,
    /// The handler's timers (`Backend::set_timer`); `user_timer` is armed
    /// for the earliest.
    timers: Mutex<TimerQueue>,
    user_timer: MioTimer,
    /// On a busy-polling loop: the spin callback reading the hot
    /// connection.
    spin: Option<SpinId>,
    /// Accepted connections closed at once for an admission limit.
    refused: AtomicU64,
    /// Some connection is marked for a flush (`State::dirty` is not
    /// empty): read without the state lock by a delivery, to write a
    /// reply as soon as its message was handed out.
    marked: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(spin) = self.spin {
            self.lp.remove_spin(spin);
        }
        let st = self.state.get_mut();
        for (_, mut l) in st.listeners.drain() {
            let _ = self.lp.deregister(&mut l.sock, l.source);
        }
        for (_, mut c) in st.conns.drain() {
            if c.phase == Phase::Established {
                // Best effort, without waiting: finish a partly written
                // frame and say goodbye, so the peer sees an orderly close
                // when the socket has room.
                let mut bytes = c.cancel_sends().rest;
                bytes.extend_from_slice(
                    CloseFrame::new(CloseCode::GoingAway, "the backend was dropped").as_bytes(),
                );
                let _ = (&*c.stream).write(&bytes);
                let _ = c.stream.shutdown(std::net::Shutdown::Write);
            }
            deregister(&self.lp, &c.stream, c.source);
        }
        for (_, l) in st.lingering.drain() {
            deregister(&self.lp, &l.stream, l.source);
        }
    }
}

fn deregister(lp: &MioLoop, stream: &mio::net::TcpStream, source: SourceId) {
    let fd = stream.as_raw_fd();
    let _ = lp.deregister(&mut SourceFd(&fd), source);
}

impl TcpBackend {
    /// Creates a backend on `event_loop` with the default [`TcpConfig`].
    pub fn new<H: Handler<TcpBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        handler: H,
    ) -> Result<Self, CreateError> {
        Self::with_tcp_config(event_loop, config, TcpConfig::default(), handler)
    }

    /// Creates a backend on `event_loop` with TCP settings `tcp`.
    pub fn with_tcp_config<H: Handler<TcpBackend> + 'static>(
        event_loop: &MioLoop,
        config: BackendConfig,
        tcp: TcpConfig,
        handler: H,
    ) -> Result<Self, CreateError> {
        if config.mode != NetworkMode::Tcp {
            return Err(CreateError::NotSupported(
                "the TCP provider runs in NetworkMode::Tcp only",
            ));
        }
        if config.peer_timeout == Some(Duration::ZERO) {
            return Err(CreateError::InvalidConfig(
                "a peer_timeout of 0 would close every connection at once".into(),
            ));
        }
        let tcp = tcp.with_peer_timeout(config.peer_timeout);
        if let Some(why) = tcp.keepalive.and_then(|k| k.invalid()) {
            return Err(CreateError::InvalidConfig(why));
        }
        if config.send_queue_depth == 0 {
            return Err(CreateError::InvalidConfig(
                "send_queue_depth of 0 leaves no room for any send".into(),
            ));
        }
        if tcp.max_accepted_handshakes == 0 {
            return Err(CreateError::InvalidConfig(
                "max_accepted_handshakes of 0 would never accept a connection".into(),
            ));
        }
        for (name, pool) in [
            ("shared_receive_pool", config.shared_receive_pool),
            ("shared_send_pool", config.shared_send_pool),
        ] {
            if let Some(p) = pool {
                if p.num_buf == 0 || p.buf_size == 0 {
                    return Err(CreateError::InvalidConfig(format!("{name} is empty")));
                }
                if p.num_buf > u32::MAX as usize {
                    return Err(CreateError::InvalidConfig(format!(
                        "{name} has more than 2^32-1 buffers"
                    )));
                }
            }
        }
        let shared_send = config
            .shared_send_pool
            .map(|p| BufferPool::new(p.buf_size, p.num_buf));
        let shared_recv = config
            .shared_receive_pool
            .map(|p| BufferPool::new(p.buf_size, p.num_buf));
        let lp = event_loop.clone();
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let w = weak.clone();
            let timer = lp.timer(move || {
                if let Some(i) = w.upgrade() {
                    i.on_tick();
                }
            });
            let w = weak.clone();
            let user_timer = lp.timer(move || {
                if let Some(i) = w.upgrade() {
                    i.on_user_timer();
                }
            });
            // On a busy-polling loop, every turn reads the connection that
            // delivered data last: a ping-pong's reply is then read by the
            // read that finds it, not after an epoll call that reports it.
            let spin = lp.is_busy_polling().then(|| {
                let w = weak.clone();
                lp.add_spin(move || w.upgrade().is_some_and(|i| i.spin()))
            });
            let handler: LoopLock<Box<dyn Handler<TcpBackend>>> =
                LoopLock::loop_only(&lp, Box::new(handler));
            let state = match config.thread_safety {
                ThreadSafety::Safe => LoopLock::shared(State::default()),
                ThreadSafety::Unsafe => LoopLock::loop_only(&lp, State::default()),
            };
            Inner {
                spin,
                lp,
                config,
                tcp,
                handler,
                state,
                pools: Mutex::new(PoolTally::default()),
                refused: AtomicU64::new(0),
                marked: AtomicBool::new(false),
                shared_send,
                shared_recv,
                weak: weak.clone(),
                timer,
                timers: Mutex::new(TimerQueue::new()),
                user_timer,
            }
        });
        Ok(Self { inner })
    }

    /// Accepted connections closed at once because their listener held
    /// [`TcpConfig::max_connections_per_listener`] connections, since the
    /// backend was created. Connections waiting for a handshake slot
    /// ([`TcpConfig::max_accepted_handshakes`]) are not refused: they wait
    /// in the listen backlog. Callable from any thread.
    pub fn refused_connections(&self) -> u64 {
        self.inner.refused.load(Ordering::Relaxed)
    }

    /// The counters of connection `conn` (opening, open or accepted).
    pub fn connection_stats(&self, conn: ConnId) -> Result<ConnStats, ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = inner.state.lock();
        Ok(inner.issued(&mut st, conn)?.stats())
    }

    /// The backend's counters: connections by outcome, and the traffic of
    /// every connection, closed ones included. `None` in thread-unsafe mode
    /// off the loop thread.
    pub fn stats(&self) -> Option<BackendStats> {
        let inner = &self.inner;
        let st = inner.state.try_lock()?;
        let mut s = st.counts;
        s.admission_refusals = inner.refused.load(Ordering::Relaxed);
        for (_, c) in st.conns.iter() {
            s.traffic.absorb(&c.stats());
        }
        Some(s)
    }

    /// The loop this backend runs on.
    pub fn event_loop(&self) -> &MioLoop {
        &self.inner.lp
    }

    /// The TCP settings in effect: those given, with the keepalive and
    /// user timeout derived from `BackendConfig::peer_timeout` where none
    /// were given.
    pub fn tcp_config(&self) -> &TcpConfig {
        &self.inner.tcp
    }

    /// The file descriptor of connection `conn`'s socket (opening, open or
    /// accepted), to inspect it: its options with `getsockopt`, its
    /// addresses, `ss`. The backend owns it: do not close, read, write or
    /// change it.
    pub fn raw_fd(&self, conn: ConnId) -> Result<RawFd, ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = inner.state.lock();
        Ok(inner.issued(&mut st, conn)?.stream.as_raw_fd())
    }

    /// What this provider supports: everything.
    pub const FEATURES: Features = Features::ALL;

    /// Bytes of messages accepted for sending and not yet handed to a
    /// socket, over every connection, closing ones included. Per
    /// connection it is bounded by `send_queue_depth` copy or zero-copy
    /// messages plus its send pool's buffers, however slowly the peer
    /// reads. `None` in thread-unsafe mode off the loop thread.
    pub fn queued_send_bytes(&self) -> Option<usize> {
        let st = self.inner.state.try_lock()?;
        let open: usize = st.conns.iter().map(|(_, c)| c.queued_bytes()).sum();
        let closing: usize = st.lingering.values().map(Lingering::pending_bytes).sum();
        Some(open + closing)
    }
}

impl Inner {
    fn backend(self: &Arc<Self>) -> TcpBackend {
        TcpBackend {
            inner: Arc::clone(self),
        }
    }

    /// Takes a connection that left the table out of the counts: its
    /// pools out of the tally, an accepted one out of its listener's
    /// connections and, if it was still exchanging handshakes, out of
    /// those.
    fn forget(&self, st: &mut State, c: &Conn) {
        let mut tally = lock(&self.pools);
        tally.remove(c.recv_pool.as_ref(), true);
        tally.remove(c.send_pool.as_ref(), false);
        drop(tally);
        st.counts.traffic.absorb(&c.stats());
        if c.initiator {
            return;
        }
        if c.phase != Phase::Established {
            self.handshake_ended(st);
        }
        if let Some(l) = c.listener.and_then(|a| st.listeners.get_mut(&a)) {
            l.held -= 1;
        }
    }

    /// An accepted connection's handshake ended (established, failed or
    /// timed out): one more may be accepted. If a listener stopped at the
    /// limit, accepting resumes in a posted task (not here, under the
    /// state lock). The listener must call `accept` itself then: mio is
    /// edge-triggered, and the connections already in the backlog raise
    /// no new readiness event.
    fn handshake_ended(&self, st: &mut State) {
        st.accepted_handshaking -= 1;
        if st.accept_stopped && st.accepted_handshaking < self.tcp.max_accepted_handshakes {
            st.accept_stopped = false;
            self.post_with(|i| i.resume_accepting());
        }
    }

    /// Accepts again on every listener that stopped at the handshake
    /// limit.
    fn resume_accepting(self: &Arc<Self>) {
        let stopped: Vec<EndpointAddress> = {
            let mut st = self.state.lock();
            st.listeners
                .iter_mut()
                .filter_map(|(&addr, l)| std::mem::take(&mut l.at_handshake_limit).then_some(addr))
                .collect()
        };
        for addr in stopped {
            self.on_accept(addr);
        }
    }

    fn thread_ok(&self) -> bool {
        self.config.thread_safety == ThreadSafety::Safe || self.lp.on_loop_thread()
    }

    // -- posting work to the loop thread ------------------------------------

    /// Makes sure queued events get dispatched soon, on the loop thread.
    fn post_dispatch(&self, st: &mut State) {
        if st.dispatch_posted || st.dispatching || st.events.is_empty() {
            return;
        }
        st.dispatch_posted = true;
        let w = self.weak.clone();
        self.lp.post(move || {
            if let Some(i) = w.upgrade() {
                let end = {
                    let mut st = i.state.lock();
                    st.dispatch_posted = false;
                    i.begin_run(&mut st)
                };
                i.dispatch();
                drop(end);
            }
        });
    }

    /// Begins a run of the loop thread that calls the handler: what the
    /// handlers send meanwhile (on the loop thread or another) is written
    /// when the returned guard drops, in one flush per connection, instead
    /// of by a flush posted for the loop's next turn (a boxed closure per
    /// send, and a turn's wait). A run begun inside another one leaves the
    /// writing to the outer run.
    fn begin_run<'a>(self: &'a Arc<Self>, st: &mut State) -> RunEnd<'a> {
        let outer = !st.flush_at_end;
        st.flush_at_end = true;
        RunEnd(self, outer)
    }

    /// Marks a connection for flushing by the next posted flush task.
    fn schedule_flush(&self, st: &mut State, id: ConnId) {
        let State { conns, dirty, .. } = &mut *st;
        if let Some(c) = conns.get_mut(id) {
            self.mark_dirty(c, dirty, id);
        }
        self.post_flush(st);
    }

    /// Puts connection `id` (`c`) on the list of connections to flush
    /// (`dirty`, the state's), once.
    #[inline]
    fn mark_dirty(&self, c: &mut Conn, dirty: &mut Vec<ConnId>, id: ConnId) {
        if !c.dirty {
            c.dirty = true;
            dirty.push(id);
            self.marked.store(true, Ordering::Relaxed);
        }
    }

    /// The flush of the marked connections posted to the loop, unless one
    /// is posted already or the run under way flushes at its end.
    #[inline]
    fn post_flush(&self, st: &mut State) {
        if !st.flush_posted && !st.flush_at_end {
            st.flush_posted = true;
            let w = self.weak.clone();
            self.lp.post(move || {
                if let Some(i) = w.upgrade() {
                    i.flush_dirty();
                }
            });
        }
    }

    /// Runs `f` on the loop thread soon, with the backend.
    fn post_with(&self, f: impl FnOnce(&Arc<Inner>) + Send + 'static) {
        let w = self.weak.clone();
        self.lp.post(move || {
            if let Some(i) = w.upgrade() {
                f(&i);
            }
        });
    }

    fn ensure_timer(&self, st: &mut State) {
        if !st.timer_running {
            st.timer_running = true;
            self.timer.start(DEADLINE_TICK);
        }
    }

    /// Dispatches queued events to the handler. Loop thread only; no lock
    /// is held while the handler runs.
    fn dispatch(self: &Arc<Self>) {
        self.dispatch_locked(self.state.lock());
    }

    /// [`dispatch`](Self::dispatch), from the state locked by the caller
    /// (released before the handler runs).
    fn dispatch_locked(self: &Arc<Self>, mut st: LoopLockGuard<'_, State>) {
        // Nothing queued (the common case of a busy-polling spin), or a
        // dispatch under way further up this thread's stack hands them
        // over.
        if st.events.is_empty() || st.dispatching {
            return;
        }
        st.dispatching = true;
        // The first round's events, taken under the caller's lock.
        let mut batch = std::mem::take(&mut st.spare_events);
        std::mem::swap(&mut st.events, &mut batch);
        drop(st);
        let _end = DispatchEnd(self);
        let mut backend = None;
        // Each round dispatches what earlier rounds' callbacks queued;
        // bounded so a handler that queues forever cannot starve the loop.
        for round in 0..64 {
            if round > 0 {
                let mut st = self.state.lock();
                if st.events.is_empty() {
                    // `batch` holds the lists the last round drained
                    // (empty, their memory kept) for the next dispatch.
                    st.spare_events = batch;
                    st.dispatching = false;
                    return;
                }
                std::mem::swap(&mut st.events, &mut batch);
            }
            let backend = &*backend.get_or_insert_with(|| self.backend());
            let mut h = self.handler.lock();
            batch.drain(|ev, keys| match ev {
                Ev::Established(c, r, caps) => h.on_connection_established(backend, c, r, caps),
                Ev::Refused(c, r, why) => h.on_connection_refused(backend, c, r, &why),
                Ev::Closed(c, r, why, keys, buffers) => {
                    drop(buffers);
                    h.on_connection_closed(backend, c, r, &why, &keys)
                }
                // Every slot and buffer of the run is free by now.
                Ev::Completed(c, _) => h.on_sends_completed(backend, c, keys),
                Ev::Timer(token) => h.on_timer(backend, token),
                Ev::Wake(token) => h.on_wake(backend, token),
            });
        }
        let mut st = self.state.lock();
        st.spare_events = batch;
        st.dispatching = false;
        self.post_dispatch(&mut st);
    }

    // -- ending connections (under the state lock) ---------------------------

    /// Ends a connection that is not established: the initiator reports
    /// `reason`, an accepted one disappears without a word.
    fn refuse_conn(&self, st: &mut State, id: ConnId, reason: RefuseReason) {
        if let Some(c) = self.remove_refused(st, id, reason) {
            deregister(&self.lp, &c.stream, c.source);
        }
    }

    /// Takes connection `id`, not established, out of the table; its
    /// initiator reports `reason`. Returns it, for its socket.
    fn remove_refused(&self, st: &mut State, id: ConnId, reason: RefuseReason) -> Option<Conn> {
        let c = st.conns.remove(id)?;
        self.forget(st, &c);
        c.open.store(false, Ordering::Release);
        if c.initiator {
            st.counts.connections_refused += 1;
            tracing::debug!(conn = %id, remote = %c.remote, %reason, "connection refused");
            st.events.push(Ev::Refused(id, c.remote, reason));
        }
        Some(c)
    }

    /// Ends an established connection, reporting `reason` with the keys of
    /// every unfinished send. With `code`, this side closes in the orderly
    /// way (finishes its last frame, sends a CLOSE frame, drains the peer);
    /// without, the socket is closed at once (the peer closed or broke it).
    fn close_conn(&self, st: &mut State, id: ConnId, code: Option<CloseCode>, reason: CloseReason) {
        let Some(mut c) = st.conns.remove(id) else {
            return;
        };
        self.forget(st, &c);
        c.open.store(false, Ordering::Release);
        let ended = c.cancel_sends();
        let mut rest = ended.rest;
        let had_assembly = c
            .reader
            .as_mut()
            .is_some_and(|r| r.assembling.take().is_some());
        let text = reason.to_string();
        match &reason {
            CloseReason::Protocol(_) | CloseReason::MessageTooLarge { .. } => {
                tracing::warn!(conn = %id, remote = %c.remote, %reason, "connection closed")
            }
            CloseReason::Local | CloseReason::PeerClosed => {
                tracing::debug!(conn = %id, remote = %c.remote, %reason, "connection closed")
            }
            _ => tracing::info!(conn = %id, remote = %c.remote, %reason, "connection closed"),
        }
        let n = &mut st.counts;
        match &reason {
            CloseReason::Local => n.closed_local += 1,
            CloseReason::PeerClosed => n.closed_by_peer += 1,
            CloseReason::TimedOut => n.closed_timed_out += 1,
            CloseReason::Protocol(_) | CloseReason::MessageTooLarge { .. } => {
                n.closed_protocol += 1
            }
            _ => n.closed_reset += 1,
        }
        if let Some(key) = ended.completed {
            st.events.completed(id, key, Release::Nothing);
        }
        st.events.push(Ev::Closed(
            id,
            c.remote,
            reason,
            ended.cancelled,
            ended.buffers,
        ));
        match code {
            Some(code) => {
                rest.extend_from_slice(CloseFrame::new(code, &text).as_bytes());
                self.linger(st, id, &c, rest);
            }
            None => deregister(&self.lp, &c.stream, c.source),
        }
        if had_assembly {
            self.wake_pool_waiters(st);
        }
    }

    /// Ends a connection whose peer's handshake was rejected: the initiator
    /// reports `reason`, an accepted one disappears without a word. The
    /// socket is not closed at once: closing it with the peer's input
    /// unread would send a reset, and a stack that discards received data
    /// on a reset would lose this side's handshake before the peer reads
    /// it (the peer needs it to say which version this side speaks). So
    /// what is left of this side's handshake is written, the sending
    /// direction shut down, and the peer's input drained until its end of
    /// stream or [`TcpConfig::close_linger`], as after a close.
    fn reject_handshake(&self, st: &mut State, id: ConnId, reason: RefuseReason) {
        tracing::info!(conn = %id, %reason, "handshake rejected");
        let Some(mut c) = self.remove_refused(st, id, reason) else {
            return;
        };
        let rest = c.cancel_sends().rest;
        self.linger(st, id, &c, rest);
    }

    /// Cancels connection `id`, this side's own, whose handshake is under
    /// way: it reports `RefuseReason::Cancelled`. Once any of this side's
    /// handshake was written, the peer may have accepted the connection
    /// and reported it established, so it is told the connection ends in
    /// the orderly way: the rest of the handshake and a CLOSE frame are
    /// written, the sending direction shut down and the peer's input
    /// drained, as after a close (the peer reports `PeerClosed`, not a
    /// reset). Before any of it was written, the socket is closed at once
    /// and the peer, which cannot have accepted, reports nothing.
    fn cancel_handshake(&self, st: &mut State, id: ConnId) {
        let Some(mut c) = self.remove_refused(st, id, RefuseReason::Cancelled) else {
            return;
        };
        let unstarted = c.offset == 0 && matches!(c.queue.front(), Some(Out::Handshake(_)));
        if unstarted {
            deregister(&self.lp, &c.stream, c.source);
            return;
        }
        let mut rest = c.cancel_sends().rest;
        rest.extend_from_slice(
            CloseFrame::new(CloseCode::Normal, "cancelled while opening").as_bytes(),
        );
        self.linger(st, id, &c, rest);
    }

    /// Writes `pending` (the end of the last frame and a CLOSE frame, or
    /// the rest of a handshake) on the socket of connection `c`, which has
    /// left the table, then shuts its sending direction and drains the
    /// peer until end of stream or the linger deadline.
    fn linger(&self, st: &mut State, id: ConnId, c: &Conn, pending: Vec<u8>) {
        // A socket out of epoll goes back: lingering waits on its events.
        if c.suspended {
            let fd = c.stream.as_raw_fd();
            let interest = Interest::READABLE | Interest::WRITABLE;
            if self
                .lp
                .resume(&mut SourceFd(&fd), c.source, interest)
                .is_err()
            {
                deregister(&self.lp, &c.stream, c.source);
                return;
            }
        }
        let mut l = Lingering::new(
            Arc::clone(&c.stream),
            c.source,
            pending,
            Instant::now() + self.tcp.close_linger,
        );
        let status = l.progress();
        if matches!(status, LingerStatus::Done) {
            deregister(&self.lp, &l.stream, l.source);
        } else {
            if matches!(status, LingerStatus::More) {
                self.post_with(move |i| i.on_lingering(id));
            }
            st.lingering.insert(id, l);
            self.ensure_timer(st);
        }
    }

    /// Lets connections that waited for a receive-pool buffer read again.
    fn wake_pool_waiters(&self, st: &mut State) {
        for id in std::mem::take(&mut st.pool_waiters) {
            if let Some(c) = st.conns.get_mut(id) {
                c.recv_blocked = false;
                self.post_with(move |i| i.on_readable(id));
            }
        }
    }

    // -- loop-thread I/O -------------------------------------------------------

    /// A readiness event of connection `id` (or of its lingering socket).
    fn on_conn_event(self: &Arc<Self>, id: ConnId, ev: &Event) {
        // A handle lookup first: the connection's own events need no
        // hashing; only those of a closed one's lingering socket do.
        let (lingering, connecting, end) = {
            let mut st = self.state.lock();
            match st.conns.get(id) {
                Some(c) => {
                    let connecting = c.phase == Phase::Connecting;
                    (false, connecting, Some(self.begin_run(&mut st)))
                }
                None => (st.lingering.contains_key(&id), false, None),
            }
        };
        if lingering {
            self.on_lingering(id);
            return;
        }
        let readable = ev.is_readable() || ev.is_read_closed() || ev.is_error();
        let writable = ev.is_writable() || ev.is_error() || ev.is_write_closed();
        // Reading first: a CLOSE frame from the peer ends the connection
        // before more of its queue is written into a socket the peer no
        // longer reads (those sends are cancelled, not completed). A
        // connection still connecting reads after the connect completed
        // (the peer's handshake may have come with the same event).
        // Data alone (no end of stream, no error) may stop at a short read:
        // a read that did not fill the buffer emptied the socket, and data
        // arriving after it raises a new edge. An end of stream or an error
        // has no edge to come, so it is read until `WouldBlock`.
        let data_only = ev.is_readable() && !ev.is_read_closed() && !ev.is_error();
        if readable && !connecting {
            self.read_conn(id, data_only, 0);
        }
        if writable {
            self.on_writable(id);
        }
        if readable && connecting {
            self.read_conn(id, data_only, 0);
        }
        self.dispatch();
        drop(end);
    }

    /// The spin callback of a busy-polling loop: reads the connection that
    /// delivered data last, as its readiness event would. `true` when it
    /// read something.
    fn spin(self: &Arc<Self>) -> bool {
        let (hot, end) = {
            let mut st = self.state.lock();
            let Some(hot) = st.hot else {
                return false;
            };
            (hot, self.begin_run(&mut st))
        };
        // What the handlers send leaves when the spin ends, not with a
        // flush posted for the loop's next turn; a panicking handler still
        // leaves it to a posted flush.
        let found = self.read_conn(hot, true, SPIN_READS - 1);
        if found {
            self.maybe_suspend(hot);
        }
        self.dispatch();
        drop(end);
        found
    }

    /// Connection `id` delivered data: it is the hot one now. The one
    /// before it, if out of epoll, goes back.
    fn note_hot(&self, st: &mut State, id: ConnId) {
        if st.hot == Some(id) {
            st.hot_streak = st.hot_streak.saturating_add(1);
            return;
        }
        if let Some(old) = st.hot.replace(id) {
            self.unsuspend(st, old);
        }
        st.hot_streak = 1;
    }

    /// Takes the hot connection `id` of a busy-polling loop out of epoll
    /// once it delivered [`SUSPEND_AFTER`] times in a row, when it is
    /// established and has nothing waiting to be written.
    fn maybe_suspend(&self, id: ConnId) {
        let mut st = self.state.lock();
        if st.hot != Some(id) || st.hot_streak < SUSPEND_AFTER {
            return;
        }
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if c.suspended || c.phase != Phase::Established || !c.queue.is_empty() {
            return;
        }
        let fd = c.stream.as_raw_fd();
        if self.lp.suspend(&mut SourceFd(&fd), c.source).is_ok() {
            c.suspended = true;
        }
    }

    /// Puts connection `id` back in epoll if it was out (see
    /// [`maybe_suspend`](Self::maybe_suspend)); a failure to do so ends it.
    fn unsuspend(&self, st: &mut State, id: ConnId) {
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if !std::mem::take(&mut c.suspended) {
            return;
        }
        let fd = c.stream.as_raw_fd();
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(e) = self.lp.resume(&mut SourceFd(&fd), c.source, interest) {
            self.close_conn(st, id, None, close_reason_for_io(&e));
        }
    }

    /// Ends a run begun by [`begin_run`](Self::begin_run): the connections
    /// marked dirty meanwhile are written now, or, when unwinding, by a
    /// posted flush.
    fn end_run(self: &Arc<Self>) {
        let mut st = self.state.lock();
        st.flush_at_end = false;
        #[cfg(test)]
        {
            st.runs_ended += 1;
        }
        if st.dirty.is_empty() {
            return;
        }
        if std::thread::panicking() {
            if let Some(id) = st.dirty.first().copied() {
                self.schedule_flush(&mut st, id);
            }
            return;
        }
        // Written and handed over under this one lock round (a flush
        // posted meanwhile still runs, and finds nothing).
        self.flush_marked(&mut st);
        self.dispatch_locked(st);
    }

    fn on_lingering(self: &Arc<Self>, id: ConnId) {
        let mut st = self.state.lock();
        let Some(l) = st.lingering.get_mut(&id) else {
            return;
        };
        match l.progress() {
            LingerStatus::Waiting => {}
            LingerStatus::More => self.post_with(move |i| i.on_lingering(id)),
            LingerStatus::Done => {
                if let Some(l) = st.lingering.remove(&id) {
                    deregister(&self.lp, &l.stream, l.source);
                }
            }
        }
    }

    fn on_writable(self: &Arc<Self>, id: ConnId) {
        let mut st = self.state.lock();
        let Some(c) = st.conns.get_mut(id) else {
            return;
        };
        if c.phase == Phase::Connecting {
            match c.stream.take_error() {
                Ok(None) => {}
                Ok(Some(e)) | Err(e) => {
                    let reason = refuse_reason(&e);
                    self.refuse_conn(&mut st, id, reason);
                    return;
                }
            }
            match c.stream.peer_addr() {
                Ok(_) => c.phase = Phase::Handshaking,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return,
                Err(e) => {
                    let reason = refuse_reason(&e);
                    self.refuse_conn(&mut st, id, reason);
                    return;
                }
            }
        }
        self.flush_conn(&mut st, id);
    }

    /// Writes connection `id`'s queue; a write error ends it.
    fn flush_conn(&self, st: &mut State, id: ConnId) {
        let State { conns, events, .. } = &mut *st;
        let Some(c) = conns.get_mut(id) else {
            return;
        };
        if c.phase == Phase::Connecting {
            return;
        }
        let phase = c.phase;
        let result = c.flush(events);
        match result {
            Ok(Flushed::Done) => {}
            // Writability must be reported now.
            Ok(Flushed::Blocked) => self.unsuspend(st, id),
            Ok(Flushed::More) => self.schedule_flush(st, id),
            Err(e) => {
                if phase == Phase::Established {
                    self.close_conn(st, id, None, close_reason_for_io(&e));
                } else {
                    let reason =
                        RefuseReason::Handshake(format!("sending the handshake failed: {e}"));
                    self.refuse_conn(st, id, reason);
                }
            }
        }
    }

    /// The posted flush task: writes every connection with new sends.
    fn flush_dirty(self: &Arc<Self>) {
        let mut st = self.state.lock();
        st.flush_posted = false;
        self.flush_marked(&mut st);
        self.dispatch_locked(st);
    }

    /// After the `on_data` of a message `reader` parsed: `true` when it
    /// was the last message the read brought and a handler sent something
    /// since the last flush. What it sent (a reply) is then written at
    /// once ([`flush_marked`](Self::flush_marked)), not when the run ends
    /// (after the reader is put back and the queued events handed out);
    /// with more messages buffered, their replies leave together at the
    /// run's end.
    #[inline]
    fn reply_due(&self, reader: &Reader) -> bool {
        reader.dec.buffered() == 0 && self.marked.load(Ordering::Relaxed)
    }

    /// Writes every connection marked dirty.
    fn flush_marked(&self, st: &mut State) {
        self.marked.store(false, Ordering::Relaxed);
        let dirty = std::mem::take(&mut st.dirty);
        for &id in &dirty {
            if let Some(c) = st.conns.get_mut(id) {
                c.dirty = false;
            }
            self.flush_conn(st, id);
        }
        // Keep the allocation for the next batch.
        if st.dirty.is_empty() {
            let mut dirty = dirty;
            dirty.clear();
            st.dirty = dirty;
        }
    }

    /// Reads connection `id` until the socket is empty (or the budget is
    /// used up), handing out each message as it is parsed.
    ///
    /// A paused connection is neither read nor parsed (once established):
    /// its bytes wait in the kernel, whose receive window fills, so the
    /// peer's sends back up. `resume_receive` runs this again, which hands
    /// out what the read buffer holds and reads until the socket is empty
    /// (mio is edge-triggered: no new readiness event may come).
    fn on_readable(self: &Arc<Self>, id: ConnId) {
        self.read_conn(id, false, 0);
    }

    /// Reads connection `id` until `WouldBlock` (or the per-event budget);
    /// with `stop_short`, also stops after a read that did not fill the
    /// buffer, saving the read that would find nothing (see
    /// `on_conn_event`); `retries`, how many more times the first read
    /// tries an empty socket before it gives up (a busy spin's,
    /// [`SPIN_READS`]). `true` when a read found bytes.
    fn read_conn(self: &Arc<Self>, id: ConnId, stop_short: bool, retries: u32) -> bool {
        // Made when a read needs the handler (not for a read that finds
        // nothing, the common case of a busy-polling spin).
        let mut backend = None;
        let mut got_data = false;
        for _ in 0..MAX_READS_PER_EVENT {
            let taken = {
                let mut st = self.state.lock();
                let Some(c) = st.conns.get_mut(id) else {
                    return got_data;
                };
                if c.phase == Phase::Connecting || c.recv_blocked {
                    return got_data;
                }
                if c.phase == Phase::Established && c.paused.load(Ordering::Acquire) {
                    return got_data;
                }
                let Some(reader) = c.reader.take() else {
                    return got_data;
                };
                (reader, c.phase, c.recv_pool.clone(), c.recv_limit)
            };
            let (mut reader, phase, pool, limit) = taken;
            let r = &mut *reader;
            let room = r.dec.read_buf();
            let room_len = room.len();
            // No room: whole frames wait in the buffer (a connection that
            // waited for a pool buffer); hand them out before reading.
            let read = if room.is_empty() {
                Err(io::ErrorKind::Interrupted.into())
            } else {
                // A busy spin reads an empty socket a few times before it
                // gives the loop its turn back (see `SPIN_READS`).
                let mut tries = if got_data { 0 } else { retries };
                loop {
                    match (&*r.stream).read(room) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries > 0 => {
                            tries -= 1;
                        }
                        read => break read,
                    }
                }
            };
            let mut drained = false;
            let mut end = match read {
                Ok(0) => ReadEnd::Eof,
                Ok(n) => {
                    reader.dec.advance(n);
                    drained = stop_short && n < room_len;
                    got_data = true;
                    ReadEnd::Continue
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => ReadEnd::WouldBlock,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => ReadEnd::Continue,
                Err(e) => ReadEnd::Error(e),
            };
            // An error read earlier, while messages before it were held,
            // is what ended the stream.
            if matches!(end, ReadEnd::Eof) {
                if let Some(e) = reader.held_error.take() {
                    end = ReadEnd::Error(e);
                }
            }
            let mut phase = phase;
            // Nothing read and nothing buffered on an established
            // connection: nothing to decode or hand out (what `process`
            // would find), and no handler to lock.
            let idle = matches!(end, ReadEnd::WouldBlock)
                && phase == Phase::Established
                && reader.dec.buffered() == 0
                && reader.dec.error().is_none()
                && reader.assembling.is_none();
            let step = if idle {
                Step::Continue
            } else {
                let backend = backend.get_or_insert_with(|| self.backend());
                let processed = panic::catch_unwind(AssertUnwindSafe(|| {
                    self.process(backend, id, &mut reader, &mut phase, pool.as_ref(), limit)
                }));
                match processed {
                    Ok(step) => step,
                    Err(payload) => {
                        self.reader_back_after_panic(id, reader);
                        panic::resume_unwind(payload);
                    }
                }
            };
            match step {
                Step::Stop => {
                    self.drop_reader(&mut reader);
                    return got_data;
                }
                // An end of stream or an error waits with the bytes before
                // it: it is reported after them. The end of stream is read
                // again; an error is not, so the reader keeps it.
                Step::Blocked => {
                    if let ReadEnd::Error(e) = std::mem::replace(&mut end, ReadEnd::WouldBlock) {
                        reader.held_error = Some(e);
                    }
                }
                Step::Paused if matches!(end, ReadEnd::Continue) => end = ReadEnd::WouldBlock,
                Step::Paused => {
                    if let ReadEnd::Error(e) = end {
                        reader.held_error = Some(e);
                    }
                    let mut st = self.state.lock();
                    self.put_reader(&mut st, id, reader);
                    return got_data;
                }
                Step::Continue => {}
            }
            // Put the reader back, or end the connection.
            let mut st = self.state.lock();
            if got_data {
                self.note_hot(&mut st, id);
            }
            if !reader.open.load(Ordering::Acquire) || !st.conns.contains(id) {
                drop(st);
                self.drop_reader(&mut reader);
                return got_data;
            }
            match end {
                ReadEnd::Continue if !drained => {}
                ReadEnd::Continue | ReadEnd::WouldBlock => {
                    self.put_reader(&mut st, id, reader);
                    return got_data;
                }
                ReadEnd::Eof | ReadEnd::Error(_) => {
                    let had_assembly = reader.assembling.take().is_some();
                    drop(reader);
                    if phase == Phase::Established {
                        let reason = match &end {
                            ReadEnd::Error(e) => close_reason_for_io(e),
                            _ => CloseReason::Reset,
                        };
                        self.close_conn(&mut st, id, None, reason);
                    } else {
                        let why = match &end {
                            ReadEnd::Error(e) => {
                                format!("connection broke during the handshake: {e}")
                            }
                            _ => "the peer closed the connection during the handshake".into(),
                        };
                        self.refuse_conn(&mut st, id, RefuseReason::Handshake(why));
                    }
                    if had_assembly {
                        self.wake_pool_waiters(&mut st);
                    }
                    return got_data;
                }
            }
            self.put_reader(&mut st, id, reader);
        }
        // Budget used up with data left: continue after other sources.
        self.post_read(id);
        got_data
    }

    /// A handler panicked while connection `id`'s messages were handed
    /// out: the reader goes back (the message being handed out counts as
    /// delivered; the decoder had moved past it), and a read is posted for
    /// the messages after it and what the socket holds, which no new
    /// readiness event may announce. Without this the connection would
    /// never be read again.
    fn reader_back_after_panic(self: &Arc<Self>, id: ConnId, mut reader: Box<Reader>) {
        let mut st = self.state.lock();
        if !reader.open.load(Ordering::Acquire) || !st.conns.contains(id) {
            drop(st);
            self.drop_reader(&mut reader);
            return;
        }
        self.put_reader(&mut st, id, reader);
        drop(st);
        self.post_read(id);
    }

    /// Reads connection `id` on a later turn of the loop, and hands over
    /// what that queues.
    fn post_read(&self, id: ConnId) {
        self.post_with(move |i| {
            i.on_readable(id);
            i.dispatch();
        });
    }

    /// Gives connection `id` its reader back. A message left incomplete in
    /// a shared pool's buffer has a deadline, which the timer enforces.
    fn put_reader(&self, st: &mut State, id: ConnId, reader: Box<Reader>) {
        let partial = reader.partial_deadline().is_some();
        if let Some(c) = st.conns.get_mut(id) {
            c.reader = Some(reader);
        }
        if partial {
            self.ensure_timer(st);
        }
    }

    /// Drops a connection's reader (taken out of a connection that ended),
    /// giving a receive-pool buffer it was assembling in back.
    fn drop_reader(&self, reader: &mut Reader) {
        if reader.assembling.take().is_some() {
            let mut st = self.state.lock();
            self.wake_pool_waiters(&mut st);
        }
    }

    /// Decodes what the reader holds: the peer's handshake first, then
    /// frames, handing each message to the handler.
    #[allow(clippy::too_many_arguments)]
    fn process(
        self: &Arc<Self>,
        backend: &TcpBackend,
        id: ConnId,
        reader: &mut Reader,
        phase: &mut Phase,
        pool: Option<&BufferPool>,
        limit: Option<u32>,
    ) -> Step {
        let mut own_pool = None;
        if *phase == Phase::Handshaking {
            match reader.dec.decode_handshake() {
                Ok(None) => return Step::Continue,
                Err(e) => {
                    let mut st = self.state.lock();
                    self.reject_handshake(&mut st, id, RefuseReason::Handshake(e.to_string()));
                    return Step::Stop;
                }
                Ok(Some(peer)) => {
                    // The full read buffer comes with the first bytes after
                    // the handshake (below): an idle connection keeps the
                    // small handshake buffer.
                    let mut st = self.state.lock();
                    if !self.establish(&mut st, id, peer) {
                        return Step::Stop;
                    }
                    // An accepted connection's own pool is made when it is
                    // established: the frames that came with the handshake
                    // may already need it.
                    own_pool = st.conns.get(id).and_then(|c| c.recv_pool.clone());
                    drop(st);
                    *phase = Phase::Established;
                    self.dispatch();
                }
            }
        }
        // From the small handshake buffer to the full read buffer once
        // bytes follow the handshake, before any frame is parsed (the
        // buffer's size decides which messages are parsed in place).
        if limit.is_some()
            && reader.dec.buffered() > 0
            && reader.dec.capacity() < self.tcp.read_buffer_size
        {
            let mut dec = FrameDecoder::new(self.tcp.read_buffer_size, limit);
            dec.feed(reader.dec.pending());
            reader.dec = dec;
        }
        let pool = own_pool.as_ref().or(pool);
        // The messages of this pass are counted once, when it ends.
        let mut tally = reader.received.tally();
        let mut h = None;
        loop {
            // Closed meanwhile (by a handler, or by another thread): no
            // message of it is handed out any more.
            if !reader.open.load(Ordering::Acquire) {
                return Step::Stop;
            }
            // Paused (by a handler, or by another thread): the rest waits
            // in the read buffer until resumed.
            if reader.paused.load(Ordering::Acquire) {
                return Step::Paused;
            }
            // A whole small message first, without the general decoder's
            // steps (it is never the start of a large message).
            let whole = if reader.assembling.is_none() {
                reader.dec.take_whole_data()
            } else {
                None
            };
            if whole.is_none() && reader.assembling.is_none() && reader.dec.starts_large_message() {
                match pool.and_then(BufferPool::get) {
                    Some(b) => {
                        reader.assembling = Some(b);
                        if reader.shared_pool {
                            reader.partial_deadline =
                                Instant::now().checked_add(self.tcp.partial_message_timeout);
                        }
                    }
                    None if pool.is_some() => {
                        let mut st = self.state.lock();
                        if let Some(c) = st.conns.get_mut(id) {
                            c.recv_blocked = true;
                            st.pool_waiters.push(id);
                        }
                        return Step::Blocked;
                    }
                    None => {}
                }
            }
            let frame = match whole {
                Some(range) => Frame::Data(reader.dec.frame_bytes(range)),
                None => match reader.dec.next_frame() {
                    Ok(None) => return Step::Continue,
                    Ok(Some(f)) => f,
                    Err(e) => {
                        drop(h);
                        let reason = close_reason_for(&e);
                        let mut st = self.state.lock();
                        self.close_conn(&mut st, id, Some(e.close_code()), reason);
                        return Step::Stop;
                    }
                },
            };
            match frame {
                Frame::Data(msg) => {
                    tally.count(msg.len());
                    let hd = h.get_or_insert_with(|| self.handler.lock());
                    hd.on_data(backend, id, msg);
                    if self.reply_due(reader) {
                        let mut st = self.state.lock();
                        self.flush_marked(&mut st);
                    }
                }
                Frame::DataPart {
                    bytes, total_len, ..
                } => {
                    let complete = frame.completes_message();
                    reader.assembling_len = total_len;
                    let Some(buf) = reader.assembling.as_mut() else {
                        drop(h);
                        let mut st = self.state.lock();
                        let reason =
                            CloseReason::Protocol("no receive buffer for a message".into());
                        self.close_conn(&mut st, id, Some(CloseCode::ProtocolError), reason);
                        return Step::Stop;
                    };
                    if buf.write(bytes).is_err() {
                        drop(h);
                        let mut st = self.state.lock();
                        let reason =
                            CloseReason::Protocol("message overflows its receive buffer".into());
                        self.close_conn(&mut st, id, Some(CloseCode::ProtocolError), reason);
                        return Step::Stop;
                    }
                    if complete {
                        reader.partial_deadline = None;
                        if let Some(buf) = reader.assembling.take() {
                            let hd = h.get_or_insert_with(|| self.handler.lock());
                            tally.count(buf.len());
                            hd.on_data(backend, id, buf.as_slice());
                            drop(buf);
                            let mut st = self.state.lock();
                            if !st.pool_waiters.is_empty() {
                                self.wake_pool_waiters(&mut st);
                            }
                            if self.reply_due(reader) {
                                self.flush_marked(&mut st);
                            }
                        }
                    }
                }
                Frame::Close { .. } => {
                    drop(h);
                    let mut st = self.state.lock();
                    self.close_conn(&mut st, id, None, CloseReason::PeerClosed);
                    return Step::Stop;
                }
            }
        }
    }

    /// The peer's handshake arrived: the connection is established. Returns
    /// `false` if it is gone.
    fn establish(&self, st: &mut State, id: ConnId, _peer: Handshake) -> bool {
        let shared_send = self.shared_send.clone();
        let Some(c) = st.conns.get_mut(id) else {
            return false;
        };
        c.phase = Phase::Established;
        c.deadline = None;
        let accepted = !c.initiator;
        let sb = c.params.send_buffered;
        c.send_pool = shared_send
            .or_else(|| (sb.num_buf > 0).then(|| BufferPool::new(sb.buf_size, sb.num_buf)));
        let mut tally = lock(&self.pools);
        tally.add(c.send_pool.as_ref(), false);
        if c.recv_pool.is_none() && c.params.recv.num_buf > 0 && !c.params.recv.use_shared_pool {
            c.recv_pool = Some(BufferPool::new(
                c.params.recv.buf_size,
                c.params.recv.num_buf,
            ));
            tally.add(c.recv_pool.as_ref(), true);
        }
        drop(tally);
        let caps = c.params.capabilities(&self.config, true);
        let remote = c.remote;
        if accepted {
            self.handshake_ended(st);
        }
        st.counts.connections_established += 1;
        tracing::debug!(conn = %id, %remote, accepted, "connection established");
        st.events.push(Ev::Established(id, remote, caps));
        true
    }

    /// A readiness event of listener `addr` (or a retry): accepts every
    /// pending connection.
    ///
    /// mio is edge-triggered, so the backlog must be emptied: when the
    /// budget is used up, accepting continues in a posted task. When the
    /// process is out of descriptors (or memory) the connections wait in
    /// the backlog and the deadline timer retries, instead of spinning on
    /// the error or waiting for a readiness event that may never come.
    /// At [`TcpConfig::max_accepted_handshakes`] accepting stops, the
    /// connections wait in the backlog, and the next handshake to end
    /// resumes it ([`Self::handshake_ended`]).
    fn on_accept(self: &Arc<Self>, addr: EndpointAddress) {
        let mut more = false;
        {
            let mut st = self.state.lock();
            let mut budget = MAX_ACCEPTS_PER_EVENT;
            loop {
                let handshaking = st.accepted_handshaking;
                let Some(l) = st.listeners.get_mut(&addr) else {
                    break;
                };
                if handshaking >= self.tcp.max_accepted_handshakes {
                    // Not accepted yet: the kernel keeps the connections
                    // (up to the listen backlog; beyond it, it refuses
                    // them) until a handshake slot frees up.
                    l.at_handshake_limit = true;
                    st.accept_stopped = true;
                    tracing::trace!(listener = %addr, handshaking, "accepting paused at the handshake limit");
                    break;
                }
                if budget == 0 {
                    more = true;
                    break;
                }
                budget -= 1;
                let (stream, peer) = match l.sock.accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if accept_error_is_transient(&e) => continue,
                    Err(_) => {
                        // Out of descriptors or memory, or a failure this
                        // side cannot tell apart from it: try again on the
                        // next tick.
                        l.retry_accept = true;
                        self.ensure_timer(&mut st);
                        break;
                    }
                };
                l.retry_accept = false;
                if l.held >= self.tcp.max_connections_per_listener {
                    // Over the listener's limit: closed before anything is
                    // read or allocated; the connections held are
                    // untouched.
                    drop(stream);
                    let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
                    tracing::debug!(listener = %addr, %peer, "connection refused by an admission limit");
                    if n.is_power_of_two() {
                        tracing::warn!(
                            listener = %addr,
                            refused = n,
                            held = l.held,
                            "connections refused by admission limits \
                             (TcpConfig::max_connections_per_listener)"
                        );
                    }
                    continue;
                }
                let params = l.params.clone();
                let pool = l.recv_pool.clone();
                let _ = socket::tune_stream(&stream, &self.tcp);
                let (limit, pool) = self.recv_setup(&params, pool);
                // A failed registration drops the socket: the peer sees a
                // closed connection, this side reports nothing.
                let _ = self.add_conn(
                    &mut st,
                    stream,
                    EndpointAddress::from(peer),
                    Phase::Handshaking,
                    false,
                    Some(addr),
                    params,
                    limit,
                    pool,
                );
            }
        }
        if more {
            self.post_with(move |i| i.on_accept(addr));
        }
        self.dispatch();
    }

    /// The receive limit and shared pool of a connection with `params`
    /// (`listener_pool`: the pool of the listener that accepted it).
    fn recv_setup(
        &self,
        params: &ConnectionParams,
        listener_pool: Option<BufferPool>,
    ) -> (Option<u32>, Option<BufferPool>) {
        let clamp = |n: usize| Some(u32::try_from(n).unwrap_or(u32::MAX));
        if params.recv.use_shared_pool {
            match listener_pool.or_else(|| self.shared_recv.clone()) {
                Some(p) => (clamp(p.buf_size()), Some(p)),
                None => (None, None),
            }
        } else if params.recv.num_buf > 0 {
            (clamp(params.recv.buf_size), None)
        } else {
            (None, None)
        }
    }

    /// Registers a new connection and queues its handshake.
    #[allow(clippy::too_many_arguments)]
    fn add_conn(
        &self,
        st: &mut State,
        mut stream: mio::net::TcpStream,
        remote: EndpointAddress,
        phase: Phase,
        initiator: bool,
        listener: Option<EndpointAddress>,
        params: ConnectionParams,
        limit: Option<u32>,
        pool: Option<BufferPool>,
    ) -> io::Result<ConnId> {
        // The handle the connection will get: the state lock is held, so
        // nothing else takes it meanwhile.
        let id = st.conns.next_id();
        let w = self.weak.clone();
        let source = self.lp.register(
            &mut stream,
            Interest::READABLE | Interest::WRITABLE,
            move |ev| {
                if let Some(i) = w.upgrade() {
                    i.on_conn_event(id, ev);
                }
            },
        )?;
        let hs = Handshake::for_limit(limit.map(|l| l as usize)).encode();
        st.next_seq += 1;
        let conn = Conn::new(
            id,
            st.next_seq,
            remote,
            Arc::new(stream),
            source,
            phase,
            initiator,
            listener,
            params,
            limit,
            pool,
            Instant::now() + self.tcp.handshake_timeout,
            hs,
        );
        lock(&self.pools).add(conn.recv_pool.as_ref(), true);
        let inserted = st.conns.insert(conn);
        debug_assert_eq!(inserted, id);
        if let Some(l) = listener.and_then(|a| st.listeners.get_mut(&a)) {
            l.held += 1;
            st.accepted_handshaking += 1;
            st.counts.connections_accepted += 1;
        }
        self.ensure_timer(st);
        if phase == Phase::Handshaking {
            self.schedule_flush(st, id);
        }
        Ok(id)
    }

    /// The deadline timer: gives up connections that took too long to
    /// establish, closes connections whose message holds a shared pool's
    /// buffer too long, and ends lingering sockets that drained too long.
    fn on_tick(self: &Arc<Self>) {
        let mut retry = Vec::new();
        {
            let mut st = self.state.lock();
            let now = Instant::now();
            // The loop thread is not reading now: every reader is in place.
            let stalled: Vec<(ConnId, String)> = st
                .conns
                .iter()
                .filter_map(|(id, c)| {
                    let r = c.reader.as_ref().filter(|r| r.partial_overdue(now))?;
                    let got = r.assembling.as_ref().map_or(0, NetworkBuffer::len);
                    let why = format!(
                        "message incomplete for {:?}: {got} of {} bytes received",
                        self.tcp.partial_message_timeout, r.assembling_len
                    );
                    Some((id, why))
                })
                .collect();
            for (id, why) in stalled {
                // Gives the buffer back and wakes the connections waiting
                // for one.
                self.close_conn(
                    &mut st,
                    id,
                    Some(CloseCode::ProtocolError),
                    CloseReason::Protocol(why),
                );
            }
            let late: Vec<(ConnId, Phase)> = st
                .conns
                .iter()
                .filter(|(_, c)| c.deadline.is_some_and(|d| d <= now))
                .map(|(id, c)| (id, c.phase))
                .collect();
            for (id, phase) in late {
                let reason = if phase == Phase::Connecting {
                    RefuseReason::Unreachable
                } else {
                    RefuseReason::Handshake(
                        "the peer did not complete the handshake in time".into(),
                    )
                };
                self.refuse_conn(&mut st, id, reason);
            }
            let done: Vec<ConnId> = st
                .lingering
                .iter()
                .filter(|(_, l)| l.deadline <= now)
                .map(|(&id, _)| id)
                .collect();
            for id in done {
                if let Some(l) = st.lingering.remove(&id) {
                    deregister(&self.lp, &l.stream, l.source);
                }
            }
            for (&addr, l) in st.listeners.iter_mut() {
                if std::mem::take(&mut l.retry_accept) {
                    retry.push(addr);
                }
            }
            let pending = st.conns.iter().any(|(_, c)| {
                c.deadline.is_some()
                    || c.reader
                        .as_ref()
                        .is_some_and(|r| r.partial_deadline().is_some())
            }) || !st.lingering.is_empty()
                || !retry.is_empty();
            if !pending {
                st.timer_running = false;
                self.timer.stop();
            }
        }
        for addr in retry {
            self.on_accept(addr);
        }
        self.dispatch();
    }

    // -- operations ----------------------------------------------------------------

    /// The start of a copy send, which looks its connection up once
    /// itself (see [`established`]): checks the calling thread and locks
    /// the state.
    #[inline(always)]
    fn send_lock(&self) -> Result<LoopLockGuard<'_, State>, SendError> {
        if !self.thread_ok() {
            return Err(SendError::WrongThread);
        }
        Ok(self.state.lock())
    }

    /// The common start of every send: checks the calling thread, locks the
    /// state and checks that `conn` is established (a handle lookup, no
    /// hashing).
    #[inline(always)]
    fn send_target(&self, conn: ConnId) -> Result<LoopLockGuard<'_, State>, SendError> {
        if !self.thread_ok() {
            return Err(SendError::WrongThread);
        }
        let st = self.state.lock();
        match st.conns.get(conn) {
            Some(c) if c.phase == Phase::Established => Ok(st),
            _ => Err(SendError::UnknownConnection(conn)),
        }
    }

    /// The issued connection `conn` (see [`Conn::issued`]), for the calls
    /// that work while it is still opening.
    fn issued<'a>(&self, st: &'a mut State, conn: ConnId) -> Result<&'a mut Conn, ConnError> {
        match st.conns.get_mut(conn) {
            Some(c) if c.issued() => Ok(c),
            _ => Err(ConnError::UnknownConnection(conn)),
        }
    }

    /// The handler timer fired: hands every due token to `on_timer` and
    /// arms the timer for the next deadline.
    fn on_user_timer(self: &Arc<Self>) {
        let mut due = Vec::new();
        {
            let mut q = lock(&self.timers);
            let now = self.lp.now();
            while let Some(token) = q.pop_due(now) {
                due.push(token);
            }
            match q.next_deadline() {
                Some(d) => self.user_timer.start(d.saturating_sub(now)),
                None => self.user_timer.stop(),
            }
        }
        if due.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        for token in due {
            st.events.push(Ev::Timer(token));
        }
        let end = self.begin_run(&mut st);
        drop(st);
        self.dispatch();
        drop(end);
    }

    /// A buffered send on established connection `conn`, under the state
    /// lock.
    #[inline(always)]
    fn buffer_send(
        &self,
        st: &mut State,
        conn: ConnId,
        buffer: NetworkBuffer,
        key: u64,
    ) -> Result<(), SendError> {
        let State { conns, dirty, .. } = &mut *st;
        let Some(c) = conns.get_mut(conn) else {
            return Err(SendError::UnknownConnection(conn));
        };
        if !c.send_pool.as_ref().is_some_and(|p| p.owns(&buffer)) {
            return Err(SendError::ForeignBuffer);
        }
        if buffer.len() <= COALESCE_MAX {
            let frame = data_frame_header(&[], buffer.len())?;
            c.count_send(buffer.len());
            c.push_buffered_copy(&frame, buffer, key);
            // `schedule_flush` with the connection at hand.
            self.mark_dirty(c, dirty, conn);
            self.post_flush(st);
        } else {
            let prefix = prefix_for(&[], buffer.len())?;
            self.enqueue(
                st,
                conn,
                Out::data(prefix, Payload::Buffer(buffer), key, false),
            );
        }
        Ok(())
    }

    /// A copy send on established connection `conn`, under the state lock.
    #[inline(always)]
    fn copy_send(
        &self,
        st: &mut State,
        conn: ConnId,
        header: &[u8],
        data: &[&[u8]],
        key: u64,
    ) -> Result<(), SendError> {
        // One lookup of the connection for the whole send.
        let State {
            conns,
            events,
            dirty,
            ..
        } = &mut *st;
        let c = conns
            .get_mut(conn)
            .ok_or(SendError::UnknownConnection(conn))?;
        if self.copy_send_on(c, events, conn, header, data, key)? {
            self.post_dispatch(st);
        } else {
            // `schedule_flush` with the connection at hand.
            self.mark_dirty(c, dirty, conn);
            self.post_flush(st);
        }
        Ok(())
    }

    /// A copy send on `c` (connection `conn`): written through at once
    /// when nothing is queued and the frame is large enough (then its
    /// completion goes to `events` and the answer is `true`), else copied
    /// into the connection's ring (`false`: the caller marks the
    /// connection for the flush).
    #[inline(always)]
    fn copy_send_on(
        &self,
        c: &mut Conn,
        events: &mut Events,
        conn: ConnId,
        header: &[u8],
        data: &[&[u8]],
        key: u64,
    ) -> Result<bool, SendError> {
        let (frame, frame_len) = self.accept_copy(c, header, data)?;
        let written = if c.queue.is_empty() && frame_len >= WRITE_THROUGH_MIN {
            c.write_through(&frame, header, data)
        } else {
            0
        };
        if written == frame_len {
            events.completed(conn, key, Release::Slot(&c.slots_released));
            Ok(true)
        } else {
            c.push_copied(&frame, header, data, frame_len, written, key);
            Ok(false)
        }
    }

    /// The checks and accounting of a copy send on `c`: its header and
    /// size checked, the queue depth checked and a slot taken, the send
    /// counted; returns its frame header and frame length.
    #[inline(always)]
    fn accept_copy(
        &self,
        c: &mut Conn,
        header: &[u8],
        data: &[&[u8]],
    ) -> Result<([u8; FRAME_HEADER_LEN], usize), SendError> {
        header_check(header)?;
        let payload_len = data.iter().fold(0usize, |a, s| a.saturating_add(s.len()));
        let frame = data_frame_header(header, payload_len)?;
        // One read of the sends in flight, before this one is counted.
        let in_flight = self.check_queue_depth(c)?;
        c.slots_taken += 1;
        c.count_send_in_flight(header.len() + payload_len, in_flight + 1);
        Ok((frame, FRAME_HEADER_LEN + header.len() + payload_len))
    }

    /// A copy send on `c` after an earlier one of the same batch was
    /// queued: its frame copied into the ring and left for the caller to
    /// add to the send queue ([`Conn::queue_copied`]); returns its length.
    #[inline(always)]
    fn copy_frame_on(
        &self,
        c: &mut Conn,
        header: &[u8],
        data: &[&[u8]],
        key: u64,
    ) -> Result<usize, SendError> {
        let (frame, frame_len) = self.accept_copy(c, header, data)?;
        c.copy_frame(&frame, header, data, frame_len, key);
        Ok(frame_len)
    }

    /// `NoResources` when `send_queue_depth` copy and zero-copy sends of a
    /// connection are in flight; else how many are.
    #[inline]
    fn check_queue_depth(&self, c: &mut Conn) -> Result<usize, SendError> {
        let in_flight = c.in_flight();
        if in_flight >= self.config.send_queue_depth {
            c.stats.no_resources += 1;
            return Err(SendError::NoResources);
        }
        Ok(in_flight)
    }

    /// Queues a DATA frame on an established connection.
    fn enqueue(&self, st: &mut State, id: ConnId, out: Out) {
        if let Some(c) = st.conns.get_mut(id) {
            if let Out::Data {
                unbuffered: true, ..
            } = out
            {
                c.slots_taken += 1;
            }
            c.count_send(out.len() - FRAME_HEADER_LEN);
            c.queue.push_back(out);
        }
        self.schedule_flush(st, id);
    }
}

enum ReadEnd {
    Continue,
    WouldBlock,
    Eof,
    Error(io::Error),
}

enum Step {
    /// Everything buffered was handled.
    Continue,
    /// Waiting for a receive-pool buffer.
    Blocked,
    /// The connection ended.
    Stop,
    /// The connection is paused: what is left waits in the read buffer.
    Paused,
}

fn refuse_reason(e: &io::Error) -> RefuseReason {
    if socket::is_refused(e) {
        RefuseReason::Refused
    } else if socket::is_unreachable(e) {
        RefuseReason::Unreachable
    } else {
        RefuseReason::Other(e.to_string())
    }
}

/// `true` for accept errors that concern one pending connection only (it
/// was aborted, or refused by a filter): accepting the next one may work.
fn accept_error_is_transient(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted
        || e.kind() == io::ErrorKind::ConnectionAborted
        || matches!(
            e.raw_os_error(),
            Some(libc::ECONNABORTED | libc::EPROTO | libc::EPERM | libc::EINTR)
        )
}

/// Why an established connection ended, from the error its socket gave.
///
/// The kernel gives up on a peer that stopped acknowledging (for
/// `TCP_USER_TIMEOUT`, or through unanswered keepalive probes) with
/// `ETIMEDOUT`, or with the last soft error it saw on the way (a host or
/// network unreachable from ICMP or a failed route lookup): an established
/// socket reports those only then. All of them are
/// [`CloseReason::TimedOut`]; anything else is a reset.
pub(crate) fn close_reason_for_io(e: &io::Error) -> CloseReason {
    let gave_up = matches!(
        e.raw_os_error(),
        Some(
            libc::ETIMEDOUT
                | libc::EHOSTUNREACH
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::ENETDOWN
        )
    );
    if gave_up || e.kind() == io::ErrorKind::TimedOut {
        CloseReason::TimedOut
    } else {
        CloseReason::Reset
    }
}

fn close_reason_for(e: &WireError) -> CloseReason {
    match e {
        WireError::DataTooLarge { len, limit } => CloseReason::MessageTooLarge {
            size: u64::from(*len),
            limit: *limit as usize,
        },
        e => CloseReason::Protocol(e.to_string()),
    }
}

/// The header check of `netio_core::preamble::send` (the thread is
/// checked where the state is taken).
/// The established connection `conn` of `conns`.
#[inline(always)]
fn established(conns: &mut ConnTable<Conn>, conn: ConnId) -> Result<&mut Conn, SendError> {
    match conns.get_mut(conn) {
        Some(c) if c.phase == Phase::Established => Ok(c),
        _ => Err(SendError::UnknownConnection(conn)),
    }
}

fn header_check(header: &[u8]) -> Result<(), SendError> {
    netio_core::preamble::send(true, header)
}

/// The frame header of a DATA frame carrying `header` and `payload_len`
/// bytes of payload.
fn data_frame_header(
    header: &[u8],
    payload_len: usize,
) -> Result<[u8; FRAME_HEADER_LEN], SendError> {
    let len = header.len().saturating_add(payload_len);
    match u32::try_from(len) {
        Ok(len) => Ok(FrameHeader {
            frame_type: FrameType::Data,
            len,
        }
        .encode()),
        Err(_) => Err(SendError::MessageTooLarge {
            len,
            max: MAX_MESSAGE_LEN,
        }),
    }
}

fn prefix_for(header: &[u8], payload_len: usize) -> Result<DataPrefix, SendError> {
    DataPrefix::new(header, payload_len).map_err(|_| SendError::MessageTooLarge {
        len: header.len().saturating_add(payload_len),
        max: MAX_MESSAGE_LEN,
    })
}

impl Backend for TcpBackend {
    fn features(&self) -> Features {
        Self::FEATURES
    }

    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        let inner = &self.inner;
        netio_core::preamble::open_listen(inner.thread_ok(), address, &params, &inner.config)?;
        let own_pool =
            params.recv.use_shared_pool && params.recv.num_buf > 0 && params.recv.buf_size > 0;
        if params.recv.use_shared_pool && !own_pool && inner.shared_recv.is_none() {
            return Err(OpenListenError::InvalidConnectionParameters(
                "use_shared_pool on a listen endpoint needs recv.buf_size and recv.num_buf \
                 (its own pool) or a BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let mut st = inner.state.lock();
        if address.port() != 0 && st.listeners.contains_key(&address) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(address));
        }
        let fail = |e: io::Error| {
            if socket::is_resource_error(&e) {
                OpenListenError::NoResources {
                    address,
                    source: Box::new(e),
                }
            } else {
                OpenListenError::FailedOpenListenEndpoint {
                    address,
                    source: Box::new(e),
                }
            }
        };
        let mut sock = socket::listen(address.socket_addr(), &inner.tcp).map_err(fail)?;
        let bound = sock
            .local_addr()
            .map(|a| address.with_port(a.port()))
            .map_err(fail)?;
        if st.listeners.contains_key(&bound) {
            return Err(OpenListenError::ListenEndpointAlreadyExists(bound));
        }
        let w = inner.weak.clone();
        let source = inner
            .lp
            .register(&mut sock, Interest::READABLE, move |_| {
                if let Some(i) = w.upgrade() {
                    i.on_accept(bound);
                }
            })
            .map_err(fail)?;
        let recv_pool =
            own_pool.then(|| BufferPool::new(params.recv.buf_size, params.recv.num_buf));
        lock(&inner.pools).add(recv_pool.as_ref(), true);
        st.listeners.insert(
            bound,
            Listener {
                sock,
                source,
                params,
                recv_pool,
                retry_accept: false,
                at_handshake_limit: false,
                held: 0,
            },
        );
        Ok(bound)
    }

    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        let inner = &self.inner;
        netio_core::preamble::open_active(inner.thread_ok(), address, &params, &inner.config)?;
        if params.recv.use_shared_pool && inner.shared_recv.is_none() {
            return Err(OpenActiveError::InvalidConnectionParameters(
                "recv.use_shared_pool on an active endpoint needs \
                 BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let mut st = inner.state.lock();
        let fail = |e: io::Error| {
            if socket::is_connect_resource_error(&e) {
                OpenActiveError::NoResources {
                    address,
                    source: Box::new(e),
                }
            } else {
                OpenActiveError::FailedOpenActiveEndpoint {
                    address,
                    source: Box::new(e),
                }
            }
        };
        let (stream, failed) =
            match socket::connect(address.socket_addr(), &inner.tcp).map_err(fail)? {
                socket::Connect::Started(s) => (s, None),
                socket::Connect::Failed(s, e) => (s, Some(refuse_reason(&e))),
            };
        let (limit, pool) = inner.recv_setup(&params, None);
        let id = inner
            .add_conn(
                &mut st,
                stream,
                address,
                Phase::Connecting,
                true,
                None,
                params,
                limit,
                pool,
            )
            .map_err(fail)?;
        st.counts.connections_opened += 1;
        if let Some(reason) = failed {
            // Refused at once: reported later like any refusal, with the
            // handle returned now (unless closed meanwhile).
            inner.post_with(move |i| {
                i.refuse_conn(&mut i.state.lock(), id, reason);
                i.dispatch();
            });
        }
        Ok(id)
    }

    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = inner.state.lock();
        let Some(mut l) = st.listeners.remove(&address) else {
            return Err(CloseError::UnknownListenEndpoint(address));
        };
        let _ = inner.lp.deregister(&mut l.sock, l.source);
        lock(&inner.pools).remove(l.recv_pool.as_ref(), true);
        drop(l);
        let accepted: Vec<(ConnId, Phase)> = st
            .conns
            .iter()
            .filter(|(_, c)| c.listener == Some(address))
            .map(|(id, c)| (id, c.phase))
            .collect();
        for (id, phase) in accepted {
            if phase == Phase::Established {
                inner.close_conn(
                    &mut st,
                    id,
                    Some(CloseCode::GoingAway),
                    CloseReason::ListenerClosed,
                );
            } else {
                inner.refuse_conn(&mut st, id, RefuseReason::Cancelled);
            }
        }
        inner.post_dispatch(&mut st);
        Ok(())
    }

    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(CloseError::WrongThread);
        }
        let mut st = inner.state.lock();
        let phase = match st.conns.get(conn) {
            Some(c) if c.issued() => c.phase,
            _ => return Err(CloseError::UnknownConnection(conn)),
        };
        match phase {
            Phase::Established => {
                inner.close_conn(&mut st, conn, Some(CloseCode::Normal), CloseReason::Local)
            }
            Phase::Handshaking => inner.cancel_handshake(&mut st, conn),
            Phase::Connecting => inner.refuse_conn(&mut st, conn, RefuseReason::Cancelled),
        }
        inner.post_dispatch(&mut st);
        Ok(())
    }

    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        // Under the state lock, without cloning the pool handle: a pop from
        // the pool's free list.
        self.with_send_pool(conn, BufferPool::get)
    }

    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError> {
        let inner = &self.inner;
        let mut st = inner.send_target(conn)?;
        inner.buffer_send(&mut st, conn, buffer, key)
    }

    fn send_buffer_batch(
        &self,
        conn: ConnId,
        buffers: &mut Vec<(NetworkBuffer, u64)>,
    ) -> Result<(), BatchSendError> {
        let inner = &self.inner;
        let mut st = inner
            .send_target(conn)
            .map_err(|error| BatchSendError { sent: 0, error })?;
        send_buffers_in_order(buffers, |buffer, key| {
            inner.buffer_send(&mut st, conn, buffer, key)
        })
    }

    fn get_buffers(
        &self,
        conn: ConnId,
        max: usize,
        out: &mut Vec<NetworkBuffer>,
    ) -> Result<usize, BufferError> {
        self.with_send_pool(conn, |p| p.get_many(max, out))
    }

    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let inner = &self.inner;
        let mut st = inner.send_target(conn)?;
        header_check(header)?;
        let c = st
            .conns
            .get_mut(conn)
            .ok_or(SendError::UnknownConnection(conn))?;
        if c.params.send_zero_copy.is_none() {
            return Err(SendError::NotSupported(
                "zero-copy sending needs a registered region (ConnectionParams::with_zero_copy)",
            ));
        }
        inner.check_queue_depth(c)?;
        let Some(region) = c.params.send_zero_copy.as_ref() else {
            return Err(SendError::UnknownConnection(conn));
        };
        let payload_len = data.iter().fold(0usize, |a, s| a.saturating_add(s.len()));
        let prefix = prefix_for(header, payload_len)?;
        let lent = region.lend(data).map_err(|_| SendError::OutsideRegion)?;
        inner.enqueue(
            &mut st,
            conn,
            Out::data(prefix, Payload::Region(lent), key, true),
        );
        Ok(())
    }

    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let inner = &self.inner;
        let mut st = inner.send_target(conn)?;
        inner.copy_send(&mut st, conn, header, data, key)
    }

    fn send_copy_batch(
        &self,
        conn: ConnId,
        messages: &[CopyMessage<'_>],
    ) -> Result<(), BatchSendError> {
        let inner = &self.inner;
        let mut st = inner
            .send_lock()
            .map_err(|error| BatchSendError { sent: 0, error })?;
        // One lookup, one flush mark and one post for the whole batch.
        let State {
            conns,
            events,
            dirty,
            ..
        } = &mut *st;
        let c = established(conns, conn).map_err(|error| BatchSendError { sent: 0, error })?;
        let (mut done_at_once, mut queued) = (false, false);
        // Bytes of the frames after the first queued one: copied into the
        // ring one by one, they join the send queue together at the end.
        let mut copied = 0;
        let mut result = Ok(());
        for (sent, m) in messages.iter().enumerate() {
            let data = std::slice::from_ref(&m.data);
            let r = if queued {
                inner
                    .copy_frame_on(c, m.header, data, m.key)
                    .map(|len| copied += len)
            } else {
                // Nothing queued yet: the send may be written through.
                inner
                    .copy_send_on(c, events, conn, m.header, data, m.key)
                    .map(|at_once| {
                        done_at_once |= at_once;
                        queued = !at_once;
                    })
            };
            if let Err(error) = r {
                result = Err(BatchSendError { sent, error });
                break;
            }
        }
        if copied > 0 {
            c.queue_copied(copied);
        }
        // Written through can only be the sends before the first queued
        // one: their dispatch is posted first, as one by one.
        if queued {
            inner.mark_dirty(c, dirty, conn);
        }
        if done_at_once {
            inner.post_dispatch(&mut st);
        }
        if queued {
            inner.post_flush(&mut st);
        }
        result
    }

    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError> {
        self.with_send_pool(conn, BufferPool::take_low_water)
    }

    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = inner.state.lock();
        let c = inner.issued(&mut st, conn)?;
        c.paused.store(true, Ordering::Release);
        Ok(())
    }

    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = inner.state.lock();
        let c = inner.issued(&mut st, conn)?;
        if c.paused.swap(false, Ordering::AcqRel) {
            // Hand out what the read buffer holds, then read until the
            // socket is empty: readiness that came while paused was
            // ignored, and no new event may come for it.
            inner.post_with(move |i| {
                i.on_readable(conn);
                i.dispatch();
            });
        }
        Ok(())
    }

    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let mut st = inner.state.lock();
        Ok(inner.issued(&mut st, conn)?.remote)
    }

    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(ConnError::WrongThread);
        }
        let st = inner.state.lock();
        st.conns
            .iter()
            .filter(|(_, c)| c.remote == remote && c.issued())
            .min_by_key(|(_, c)| c.seq)
            .map(|(id, _)| id)
            .ok_or(ConnError::NoConnectionTo(remote))
    }

    fn memory_usage(&self) -> MemoryUsage {
        let inner = &self.inner;
        let mut usage = lock(&inner.pools).usage();
        // The shared pools count once, used or not.
        for (p, recv) in [(&inner.shared_recv, true), (&inner.shared_send, false)] {
            if let Some(p) = p {
                if !lock(&inner.pools).counts(p, recv) {
                    if recv {
                        usage.receive_bytes += p.bytes();
                    } else {
                        usage.send_bytes += p.bytes();
                    }
                }
            }
        }
        usage
    }

    fn now(&self) -> Duration {
        self.inner.lp.now()
    }

    fn set_timer(&self, delay: Duration, token: u64) {
        let inner = &self.inner;
        let mut q = lock(&inner.timers);
        let now = inner.lp.now();
        let deadline = now.saturating_add(delay);
        q.push(deadline, token);
        if q.next_deadline() == Some(deadline) {
            // The new earliest: the loop timer measures from now, never
            // less than `delay`.
            inner.user_timer.start(delay);
        }
    }

    fn wake(&self, token: u64) {
        let inner = &self.inner;
        match inner.state.try_lock() {
            Some(mut st) => {
                st.events.push(Ev::Wake(token));
                inner.post_dispatch(&mut st);
            }
            // Thread-unsafe mode, off the loop thread: the loop queues it.
            None => inner.post_with(move |i| {
                let end = {
                    let mut st = i.state.lock();
                    st.events.push(Ev::Wake(token));
                    i.begin_run(&mut st)
                };
                i.dispatch();
                drop(end);
            }),
        }
    }
}

impl TcpBackend {
    /// `f` of the send pool of established connection `conn`.
    fn with_send_pool<R>(
        &self,
        conn: ConnId,
        f: impl FnOnce(&BufferPool) -> R,
    ) -> Result<R, BufferError> {
        let inner = &self.inner;
        if !inner.thread_ok() {
            return Err(BufferError::WrongThread);
        }
        let st = inner.state.lock();
        match st.conns.get(conn) {
            Some(c) if c.phase == Phase::Established => c
                .send_pool
                .as_ref()
                .map(f)
                .ok_or(BufferError::NoBuffersAllocated(conn)),
            _ => Err(BufferError::UnknownConnection(conn)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// Replies to each message from `on_data`, and once more from a timer
    /// it sets there, recording after each send whether a flush was posted
    /// for it.
    struct Replier(mpsc::Sender<(&'static str, bool)>, Option<ConnId>);

    impl Handler<TcpBackend> for Replier {
        fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
            b.send_data_copy(conn, &[data], &[], 0).expect("reply");
            let posted = b.inner.state.lock().flush_posted;
            let _ = self.0.send(("on_data", posted));
            self.1 = Some(conn);
            b.set_timer(Duration::from_millis(1), 1);
        }
        fn on_timer(&mut self, b: &TcpBackend, _token: u64) {
            let conn = self.1.expect("a connection");
            b.send_data_copy(conn, &[b"timer"], &[], 1).expect("reply");
            let posted = b.inner.state.lock().flush_posted;
            let _ = self.0.send(("on_timer", posted));
        }
    }

    /// Reports what it receives.
    struct Receiver(mpsc::Sender<Vec<u8>>);

    impl Handler<TcpBackend> for Receiver {
        fn on_data(&mut self, _b: &TcpBackend, _conn: ConnId, data: &[u8]) {
            let _ = self.0.send(data.to_vec());
        }
    }

    /// On `lp`, a server with `handler` and a client that reports what it
    /// receives in `got`, connected, the loop running on a thread of its
    /// own; the client's first message, "ping", sent. Returns the loop
    /// thread (stop `lp`, then join it) and both backends (kept alive).
    fn ping_server(
        lp: &MioLoop,
        handler: impl Handler<TcpBackend> + 'static,
        got: mpsc::Sender<Vec<u8>>,
    ) -> (std::thread::JoinHandle<()>, TcpBackend, TcpBackend) {
        let server = TcpBackend::new(lp, BackendConfig::default(), handler).expect("server");
        let client = TcpBackend::new(lp, BackendConfig::default(), Receiver(got)).expect("client");
        let params = ConnectionParams::receive(64, 4);
        let addr = server
            .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
            .expect("listen");
        let conn = client.open_active_endpoint(addr, params).expect("connect");
        let l2 = lp.clone();
        let runner = std::thread::spawn(move || l2.run(|| {}));
        let start = Instant::now();
        while client.send_data_copy(conn, &[b"ping"], &[], 0).is_err() {
            assert!(start.elapsed() < WAIT, "the connection did not open");
            std::thread::sleep(Duration::from_millis(5));
        }
        (runner, server, client)
    }

    const WAIT: Duration = Duration::from_secs(10);

    /// What a handler sends from a readiness event's messages or from a
    /// timer is written when that run of the loop ends: no flush is posted
    /// for the loop's next turn (a boxed closure and a turn's wait per
    /// reply), and the replies arrive.
    #[test]
    fn a_reply_from_a_handler_is_written_when_its_run_ends_with_no_flush_posted() {
        let lp = MioLoop::new().expect("loop");
        let (sent_tx, sent) = mpsc::channel();
        let (got_tx, got) = mpsc::channel();
        let (runner, _server, _client) = ping_server(&lp, Replier(sent_tx, None), got_tx);
        assert_eq!(got.recv_timeout(WAIT).expect("the reply"), b"ping");
        assert_eq!(got.recv_timeout(WAIT).expect("the timer's"), b"timer");
        let seen: Vec<_> = sent.try_iter().collect();
        assert_eq!(seen, [("on_data", false), ("on_timer", false)]);
        lp.stop();
        runner.join().expect("loop thread");
    }

    /// Replies to each message, and reports for each reply's completion
    /// whether the run of the loop that delivered the message was still
    /// going when the completion was handed over (no run ended between
    /// the two callbacks, and the run had not begun to end).
    struct EarlyReplier(mpsc::Sender<bool>, u64);

    impl Handler<TcpBackend> for EarlyReplier {
        fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
            b.send_data_copy(conn, &[data], &[], 7).expect("reply");
            self.1 = b.inner.state.lock().runs_ended;
        }
        fn on_sends_completed(&mut self, b: &TcpBackend, _conn: ConnId, keys: &[u64]) {
            if keys.contains(&7) {
                let st = b.inner.state.lock();
                let _ = self.0.send(st.flush_at_end && st.runs_ended == self.1);
            }
        }
    }

    /// A reply to the last message a read brought is written as soon as
    /// that message's `on_data` returns, not when the run ends (after the
    /// reader is put back and the queued events handed over): its
    /// completion is reported while the run is still going. Busy-polling
    /// and interrupt loops (on an interrupt loop the readiness event often
    /// says writable too, and that flush writes the reply before the run
    /// ends as well; the busy loop's spin has no such event).
    #[test]
    fn a_reply_to_the_last_message_of_a_read_is_written_before_its_run_ends() {
        for busy in [false, true] {
            let lp = MioLoop::with_config(netio_core::mio_loop::LoopConfig {
                busy_poll: busy,
                ..netio_core::mio_loop::LoopConfig::default()
            })
            .expect("loop");
            let (done_tx, done) = mpsc::channel();
            let (got_tx, got) = mpsc::channel();
            let (runner, _server, _client) = ping_server(&lp, EarlyReplier(done_tx, 0), got_tx);
            assert_eq!(got.recv_timeout(WAIT).expect("the reply"), b"ping");
            let in_run = done.recv_timeout(WAIT).expect("the reply's completion");
            assert!(
                in_run,
                "busy {busy}: the reply was written when the run ended, not after its on_data"
            );
            lp.stop();
            runner.join().expect("loop thread");
        }
    }

    /// What a [`Reporter`] reports.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Data(ConnId, usize),
        Completed(ConnId, Vec<u64>),
        Closed(ConnId),
    }

    /// Reports messages, completions and closes; with `echo`, also echoes
    /// each message (key 0), or on `flood` sends 64 messages of 8 KiB
    /// instead (keys 1 to 64).
    struct Reporter {
        tx: mpsc::Sender<Seen>,
        echo: bool,
    }

    impl Handler<TcpBackend> for Reporter {
        fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
            let _ = self.tx.send(Seen::Data(conn, data.len()));
            match data {
                _ if !self.echo => {}
                b"flood" => {
                    for k in 1..=64 {
                        b.send_data_copy(conn, &[&[7u8; 8192]], &[], k)
                            .expect("flood");
                    }
                }
                _ => b.send_data_copy(conn, &[data], &[], 0).expect("echo"),
            }
        }
        fn on_sends_completed(&mut self, _b: &TcpBackend, conn: ConnId, keys: &[u64]) {
            let _ = self.tx.send(Seen::Completed(conn, keys.to_vec()));
        }
        fn on_connection_closed(
            &mut self,
            _b: &TcpBackend,
            conn: ConnId,
            _remote: EndpointAddress,
            _reason: &CloseReason,
            _keys: &[u64],
        ) {
            let _ = self.tx.send(Seen::Closed(conn));
        }
    }

    /// The hot connection of a busy-polling loop leaves epoll after a long
    /// run of reads that found data, and everything still works: a message
    /// on another connection (which comes through epoll and puts the first
    /// back), a write that blocks (it needs writability, so the socket goes
    /// back), the peer's close, and this side's orderly close (its
    /// lingering socket, back in epoll, ends on the client's end of
    /// stream).
    #[test]
    fn a_hot_connection_out_of_epoll_still_reports_data_writability_and_closes() {
        let busy = MioLoop::with_config(netio_core::mio_loop::LoopConfig {
            busy_poll: true,
            ..netio_core::mio_loop::LoopConfig::default()
        })
        .expect("busy loop");
        let lp = MioLoop::new().expect("loop");
        let (stx, srx) = mpsc::channel();
        let (ctx, crx) = mpsc::channel();
        // Small socket buffers, so that a flood blocks.
        let tcp = TcpConfig {
            send_buffer_size: Some(4096),
            recv_buffer_size: Some(4096),
            ..TcpConfig::default()
        };
        let server = TcpBackend::with_tcp_config(
            &busy,
            BackendConfig::default(),
            tcp.clone(),
            Reporter {
                tx: stx,
                echo: true,
            },
        )
        .expect("server");
        let client = TcpBackend::with_tcp_config(
            &lp,
            BackendConfig::default(),
            tcp,
            Reporter {
                tx: ctx,
                echo: false,
            },
        )
        .expect("client");
        let params = ConnectionParams::receive(8192, 64);
        let addr = server
            .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
            .expect("listen");
        let (b2, l2) = (busy.clone(), lp.clone());
        let runners = [
            std::thread::spawn(move || b2.run(|| {})),
            std::thread::spawn(move || l2.run(|| {})),
        ];
        let suspended = |id: ConnId| server.inner.state.lock().conns.get(id).map(|c| c.suspended);
        // The next event that is not a completion.
        let next = |rx: &mpsc::Receiver<Seen>| loop {
            match rx.recv_timeout(WAIT) {
                Ok(Seen::Completed(..)) => continue,
                e => break e.ok(),
            }
        };
        let connect = || {
            let conn = client
                .open_active_endpoint(addr, params.clone())
                .expect("connect");
            let start = Instant::now();
            while client.send_data_copy(conn, &[b"hi"], &[], 0).is_err() {
                assert!(start.elapsed() < WAIT, "the connection did not open");
                std::thread::sleep(Duration::from_millis(2));
            }
            let greeting = next(&srx);
            let Some(Seen::Data(at_server, 2)) = greeting else {
                panic!("the server got no greeting: {greeting:?}");
            };
            assert_eq!(next(&crx), Some(Seen::Data(conn, 2)), "the echo");
            (conn, at_server)
        };
        // Ping-pong until the server's side is out of epoll.
        let run_hot = |conn: ConnId, at_server: ConnId| {
            for _ in 0..2 * SUSPEND_AFTER {
                client
                    .send_data_copy(conn, &[b"ping"], &[], 0)
                    .expect("ping");
                assert_eq!(next(&srx), Some(Seen::Data(at_server, 4)));
                assert_eq!(next(&crx), Some(Seen::Data(conn, 4)));
            }
            // (The last echo leaves before the spin's read ends.)
            let start = Instant::now();
            while suspended(at_server) != Some(true) {
                assert!(start.elapsed() < WAIT, "a long hot run leaves epoll");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let drain = |rx: &mpsc::Receiver<Seen>| while rx.try_recv().is_ok() {};
        let (a, a_at) = connect();
        drain(&srx);
        run_hot(a, a_at);
        // Another connection's message comes through epoll; the first
        // goes back.
        let (b, b_at) = connect();
        // (The echo leaves before the server's read of B ends.)
        let start = Instant::now();
        while suspended(a_at) != Some(false) {
            assert!(start.elapsed() < WAIT, "back in epoll when another is hot");
            std::thread::sleep(Duration::from_millis(1));
        }
        run_hot(a, a_at);
        // A write that blocks: the client does not read meanwhile.
        client.pause_receive(a).expect("pause");
        client
            .send_data_copy(a, &[b"flood"], &[], 0)
            .expect("flood");
        let start = Instant::now();
        while suspended(a_at) == Some(true) {
            assert!(
                start.elapsed() < WAIT,
                "a blocked write puts the socket back in epoll"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        client.resume_receive(a).expect("resume");
        let (mut got, mut done) = (0, 0);
        let start = Instant::now();
        while got < 64 || done < 64 {
            if start.elapsed() >= WAIT {
                // What each side holds: sent and received counts, the
                // server's unwritten queue, the client's read buffer.
                let sent = server.connection_stats(a_at);
                let queued = server
                    .inner
                    .state
                    .lock()
                    .conns
                    .get(a_at)
                    .map(|c| (c.queue.len(), c.suspended));
                let received = client.connection_stats(a);
                let reader = client.inner.state.lock().conns.get(a).map(|c| {
                    let buffered = c.reader.as_ref().map(|r| r.dec.buffered());
                    (c.paused.load(Ordering::Acquire), c.recv_blocked, buffered)
                });
                panic!(
                    "the flood: {got} of 64 arrived, {done} completed; server {sent:?}, \
                     (queue items, suspended) {queued:?}; client {received:?}, \
                     (paused, waiting for a buffer, bytes buffered) {reader:?}"
                );
            }
            while let Ok(e) = crx.recv_timeout(Duration::from_millis(10)) {
                if e == Seen::Data(a, 8192) {
                    got += 1;
                }
            }
            while let Ok(e) = srx.try_recv() {
                // (Key 0: a ping's echo completed late.)
                if let Seen::Completed(c, keys) = e {
                    if c == a_at {
                        done += keys.iter().filter(|&&k| k > 0).count();
                    }
                }
            }
        }
        drain(&srx);
        drain(&crx);
        // The peer's close of a connection out of epoll.
        run_hot(a, a_at);
        client.close_active_endpoint(a).expect("close");
        let start = Instant::now();
        loop {
            assert!(
                start.elapsed() < WAIT,
                "the server hears of the client's close"
            );
            if let Ok(Seen::Closed(c)) = srx.recv_timeout(Duration::from_millis(10)) {
                assert_eq!(c, a_at);
                break;
            }
        }
        // The client's own close report is dispatched on its loop thread,
        // maybe after the server's: the next connection's echoes come
        // after it.
        assert_eq!(
            next(&crx),
            Some(Seen::Closed(a)),
            "the client reports its own close"
        );
        // This side's orderly close (its CLOSE frame is written by the
        // lingering socket, which waits on the socket's events).
        run_hot(b, b_at);
        server.close_active_endpoint(b_at).expect("close");
        assert_eq!(
            next(&crx),
            Some(Seen::Closed(b)),
            "the client hears of the close"
        );
        busy.stop();
        lp.stop();
        for r in runners {
            r.join().expect("loop thread");
        }
    }

    #[test]
    fn the_kernel_giving_up_on_a_peer_closes_with_timed_out_and_other_errors_with_reset() {
        for errno in [
            libc::ETIMEDOUT,
            libc::EHOSTUNREACH,
            libc::ENETUNREACH,
            libc::EHOSTDOWN,
            libc::ENETDOWN,
        ] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(
                close_reason_for_io(&e),
                CloseReason::TimedOut,
                "errno {errno}"
            );
        }
        for errno in [libc::ECONNRESET, libc::EPIPE, libc::ECONNABORTED] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(close_reason_for_io(&e), CloseReason::Reset, "errno {errno}");
        }
    }
}
