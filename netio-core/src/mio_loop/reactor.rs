//! [`MioLoop`] and its signals and timers.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::Weak;
use std::time::{Duration, Instant};

use mio::event::{Event, Source};
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use super::cadence::ClockCadence;
use super::control::{Control, PollWaker};
use super::posts::PostQueue;
use super::signal_queue::{SignalCore, SignalQueue};
use super::taken::Taken;
use super::timers::SharedTimers;
use crate::event_loop::{thread_token, EventLoop, Signal, Timer};
use crate::fast_map::FastMap;
use crate::sync::{lock, Arc, AtomicBool, AtomicU64, AtomicUsize, Mutex, Ordering};

/// The token of the loop's waker; sources get tokens from 1 on.
const WAKER: Token = Token(0);
/// Events fetched per poll when [`LoopConfig::events_capacity`] is 0.
const DEFAULT_EVENTS_CAPACITY: usize = 1024;

type SourceCallback = Box<dyn FnMut(&Event) + Send>;
type Callback = Box<dyn FnMut() + Send>;
type Task = Box<dyn FnOnce() + Send>;

type SpinCallback = Box<dyn FnMut() -> bool + Send>;

/// A spin callback and its removal flag. The loop thread holds its own list
/// of these (refreshed when the shared one changes) and locks only the
/// slot of the callback it runs, holding the lock while the callback runs;
/// [`MioLoop::remove_spin`] only tries that lock, so a callback may remove
/// itself.
struct SpinSlot {
    id: usize,
    /// `None` once removed.
    callback: Mutex<Option<SpinCallback>>,
    removed: AtomicBool,
}

/// On a busy-polling loop with spin callbacks, epoll is asked once every
/// this many turns while it reports events; the spin callbacks run every
/// turn.
const SPINS_PER_POLL: u32 = 8;
/// While epoll reports nothing, the turns between two asks double after
/// each ask, up to this many: a system call costs several idle spins (a
/// fraction of a microsecond on a virtual machine), and a message that
/// arrives meanwhile waits for it. The first event reported brings the
/// cadence back to [`SPINS_PER_POLL`].
const MAX_SPINS_PER_POLL: u32 = 64;
/// A signal's callback slot: `None` while the loop runs it or once removed.
type SignalSlot = Mutex<Option<Callback>>;

/// Settings of a [`MioLoop`].
#[derive(Debug, Clone, Default)]
pub struct LoopConfig {
    /// Poll with a zero timeout in a tight loop instead of sleeping in
    /// epoll: the loop thread keeps a core busy, in exchange events, signals
    /// and timers are seen without a wake-up and timers tick with sub-ms
    /// precision. Cross-thread wake-ups then cost no system call.
    pub busy_poll: bool,
    /// How many readiness events one poll fetches; 0 means 1024. Sources
    /// beyond it are served by the next poll.
    pub events_capacity: usize,
}

/// Identifies a source registered with [`MioLoop::register`]; pass it to
/// [`MioLoop::reregister`] and [`MioLoop::deregister`]. Ids are never
/// reused by a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceId(usize);

/// Identifies a spin callback added with [`MioLoop::add_spin`]; pass it to
/// [`MioLoop::remove_spin`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpinId(usize);

/// The real event loop: epoll through mio, plus signals, timers and posted
/// closures. See the [module documentation](super) for an example.
///
/// Clones are handles to the same loop. When the last handle is dropped the
/// loop drops every callback it holds (sources, signals, timers, posts) and
/// closes its file descriptors; signals and timers that outlive it do
/// nothing. A callback that captures a `MioLoop` handle keeps the loop
/// alive until that callback is dropped (deregister the source, drop the
/// signal or timer); capture a [`WeakMioLoop`] instead to avoid the cycle.
#[derive(Clone)]
pub struct MioLoop {
    handle: Arc<Handle>,
}

/// A handle to a [`MioLoop`] that does not keep it alive
/// ([`MioLoop::downgrade`]); for callbacks stored in the loop itself.
#[derive(Clone)]
pub struct WeakMioLoop {
    handle: Weak<Handle>,
}

impl WeakMioLoop {
    /// The loop, unless its last [`MioLoop`] handle was dropped.
    pub fn upgrade(&self) -> Option<MioLoop> {
        self.handle.upgrade().map(|handle| MioLoop { handle })
    }
}

impl fmt::Debug for WeakMioLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakMioLoop")
            .field("alive", &(self.handle.strong_count() > 0))
            .finish()
    }
}

/// Owned by the `MioLoop` handles only: dropping the last one shuts the loop
/// down, which breaks reference cycles through callbacks.
struct Handle {
    inner: Arc<Inner>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.inner.shutdown();
    }
}

/// What only the thread inside `run` uses; out of its mutex while running.
struct PollState {
    poll: Poll,
    events: Events,
    /// Index of the next event of `events` to dispatch (a `stop` can come
    /// between two; the rest are dispatched by the next `run`).
    next: usize,
    /// Turns since epoll was last asked (busy polling with spin callbacks);
    /// 0 on a turn that reads the clock and looks at the timers.
    spin_turns: u32,
    /// Turns from one ask of epoll to the next (busy polling with spin
    /// callbacks): [`SPINS_PER_POLL`] after an ask that reported events,
    /// doubled after one that reported none, up to
    /// [`MAX_SPINS_PER_POLL`].
    poll_every: u32,
    /// The next turn reads the clock and looks at the timers whatever
    /// `spin_turns` says: spin callbacks found work on the last turn (on
    /// every such turn, or every few while they are short, see
    /// `cadence`), so that work handed over from spin callbacks turn after
    /// turn does not keep a due timer waiting.
    clock_due: bool,
    /// How many turns that found work go by between two clock reads.
    cadence: ClockCadence,
    /// The spin callbacks as of `spin_epoch` (the loop thread's copy).
    spins: Vec<Arc<SpinSlot>>,
    /// The [`Inner::spin_epoch`] `spins` was copied at.
    spin_epoch: usize,
}

struct Inner {
    registry: Registry,
    waker: Waker,
    poll: Mutex<Option<PollState>>,
    /// `thread_token()` of the thread inside `run`, 0 when not running.
    running_on: AtomicU64,
    /// The wake flag, the stop request and the busy-poll mode.
    control: Control,
    next_id: AtomicUsize,
    /// Keyed by ids this loop hands out ([`FastMap`]: one multiplication
    /// per lookup, two lookups per readiness event).
    sources: Mutex<FastMap<usize, Option<SourceCallback>>>,
    /// Spin callbacks in the order added.
    spins: Mutex<Vec<Arc<SpinSlot>>>,
    spin_count: AtomicUsize,
    /// Bumped (under the `spins` lock) by every addition and removal: the
    /// loop thread copies `spins` again when it changed.
    spin_epoch: AtomicUsize,
    posts: PostQueue<Task>,
    signal_queue: SignalQueue<SignalSlot>,
    signals: Mutex<HashMap<usize, Arc<SignalCore<SignalSlot>>>>,
    timers: SharedTimers<Callback>,
    /// The loop clock's zero (`EventLoop::now`).
    created: std::time::Instant,
    /// The loop's time (nanoseconds since `created`) as of this turn's
    /// timer check ([`MioLoop::turn_now`]).
    turn_nanos: AtomicU64,
    /// The task that drives the loop, woken instead of the eventfd
    /// ([`MioLoop::set_driver_waker`]).
    driver: DriverWaker,
    /// The last driven turn's look at epoll reported readiness
    /// ([`MioLoop::turn_found_events`]).
    turn_found: AtomicBool,
}

/// The waker of an async task that drives a loop turn by turn
/// ([`MioLoop::set_driver_waker`]); `set` spares the lock when there is
/// none, as on every loop that `run` drives.
#[derive(Default)]
struct DriverWaker {
    set: AtomicBool,
    waker: Mutex<Option<std::task::Waker>>,
}

/// How an announcement wakes a loop that may be asleep: its driver task
/// if it has one, else the eventfd that wakes epoll.
struct Wakers<'a> {
    eventfd: &'a Waker,
    driver: &'a DriverWaker,
}

impl PollWaker for Wakers<'_> {
    fn wake_poller(&self) {
        if self.driver.set.load(Ordering::Acquire) {
            // Woken with no lock held: an executor may poll the task
            // from inside `wake`.
            let waker = lock(&self.driver.waker).clone();
            if let Some(w) = waker {
                w.wake();
                return;
            }
        }
        self.eventfd.wake_poller();
    }
}

impl MioLoop {
    /// Creates a loop with the default [`LoopConfig`].
    pub fn new() -> io::Result<Self> {
        Self::with_config(LoopConfig::default())
    }

    /// Creates a loop: an epoll instance and its waker (an eventfd).
    pub fn with_config(config: LoopConfig) -> io::Result<Self> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let capacity = match config.events_capacity {
            0 => DEFAULT_EVENTS_CAPACITY,
            n => n,
        };
        let created = std::time::Instant::now();
        let inner = Inner {
            registry,
            waker,
            poll: Mutex::new(Some(PollState {
                poll,
                events: Events::with_capacity(capacity),
                next: 0,
                spin_turns: 0,
                poll_every: SPINS_PER_POLL,
                clock_due: false,
                cadence: ClockCadence::default(),
                spins: Vec::new(),
                spin_epoch: 0,
            })),
            running_on: AtomicU64::new(0),
            control: Control::new(config.busy_poll),
            next_id: AtomicUsize::new(WAKER.0 + 1),
            sources: Mutex::new(FastMap::default()),
            spins: Mutex::new(Vec::new()),
            spin_count: AtomicUsize::new(0),
            spin_epoch: AtomicUsize::new(1),
            posts: PostQueue::new(),
            signal_queue: SignalQueue::new(),
            signals: Mutex::new(HashMap::new()),
            timers: SharedTimers::with_base(created),
            created,
            turn_nanos: AtomicU64::new(0),
            driver: DriverWaker::default(),
            turn_found: AtomicBool::new(false),
        };
        Ok(Self {
            handle: Arc::new(Handle {
                inner: Arc::new(inner),
            }),
        })
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// Registers a readiness source (a mio socket, or any fd through
    /// [`mio::unix::SourceFd`]); `callback` runs on the loop thread with each
    /// mio event for it. mio is edge-triggered: on a readable event, read
    /// until `WouldBlock`.
    ///
    /// Callable from any thread, including from inside any callback of this
    /// loop. The source must stay alive (and open) until
    /// [`deregister`](Self::deregister).
    pub fn register<S: Source + ?Sized>(
        &self,
        source: &mut S,
        interest: Interest,
        callback: impl FnMut(&Event) + Send + 'static,
    ) -> io::Result<SourceId> {
        let inner = self.inner();
        let id = inner.next_id();
        // The callback is in place before epoll can report the source.
        lock(&inner.sources).insert(id, Some(Box::new(callback)));
        if let Err(e) = inner.registry.register(source, Token(id), interest) {
            let callback = lock(&inner.sources).remove(&id);
            drop(callback);
            return Err(e);
        }
        Ok(SourceId(id))
    }

    /// The loop's state, if it knows source `id`; `ErrorKind::NotFound`
    /// otherwise.
    fn known(&self, id: SourceId) -> io::Result<&Inner> {
        let inner = self.inner();
        if !lock(&inner.sources).contains_key(&id.0) {
            return Err(unknown_source(id));
        }
        Ok(inner)
    }

    /// Changes the interest of a registered source. Callable from any
    /// thread. An id this loop does not know: `ErrorKind::NotFound`.
    pub fn reregister<S: Source + ?Sized>(
        &self,
        source: &mut S,
        id: SourceId,
        interest: Interest,
    ) -> io::Result<()> {
        self.known(id)?
            .registry
            .reregister(source, Token(id.0), interest)
    }

    /// Takes a registered source out of epoll for a while, keeping its id
    /// and callback: none of its readiness is reported until
    /// [`resume`](Self::resume). For a source that a busy loop's spin
    /// callback reads anyway, so that its readiness costs nothing (epoll's
    /// wake-up callback runs on every arrival at a registered socket, under
    /// its lock). [`deregister`](Self::deregister) still ends it. Callable
    /// from any thread; an id this loop does not know:
    /// `ErrorKind::NotFound`.
    pub fn suspend<S: Source + ?Sized>(&self, source: &mut S, id: SourceId) -> io::Result<()> {
        self.known(id)?.registry.deregister(source)
    }

    /// Puts a [`suspend`](Self::suspend)ed source back with `interest`.
    /// What is ready already is reported (the registration is
    /// edge-triggered, and a new one starts from the source's state).
    pub fn resume<S: Source + ?Sized>(
        &self,
        source: &mut S,
        id: SourceId,
        interest: Interest,
    ) -> io::Result<()> {
        self.known(id)?
            .registry
            .register(source, Token(id.0), interest)
    }

    /// Deregisters a source and drops its callback (also when called from
    /// inside that very callback: it is dropped once it returns). No event
    /// of the source is dispatched after this returns on the loop thread.
    /// Callable from any thread; an id this loop does not know:
    /// `ErrorKind::NotFound`.
    pub fn deregister<S: Source + ?Sized>(&self, source: &mut S, id: SourceId) -> io::Result<()> {
        let inner = self.inner();
        let removed = lock(&inner.sources).remove(&id.0);
        let Some(callback) = removed else {
            return Err(unknown_source(id));
        };
        let result = inner.registry.deregister(source);
        // After epoll let go of the source: the callback may own it.
        drop(callback);
        result
    }

    /// Runs `f` once on the loop thread, soon: never inline, also when
    /// called on the loop thread. Closures run in the order posted. Posts
    /// not yet run when the loop is dropped are dropped.
    pub fn post(&self, f: impl FnOnce() + Send + 'static) {
        let inner = self.inner();
        inner.posts.push(Box::new(f));
        inner.wake();
    }

    /// `true` for a loop that busy-polls ([`LoopConfig::busy_poll`]).
    pub fn is_busy_polling(&self) -> bool {
        self.inner().control.busy_poll()
    }

    /// The loop's time ([`EventLoop::now`]) as last read for its timers,
    /// without reading the clock again: for a spin callback (see
    /// [`add_spin`](Self::add_spin)) it is at most 64 idle turns or 16
    /// short turns that found work old (a busy-polling loop with spin
    /// callbacks reads the clock on the turns that ask epoll, one in 8 to
    /// one in 64, on turns that run posted closures or signals, and after
    /// turns on which a spin callback found work: after each such turn
    /// while they take 50 µs or more, after every second, fourth, … up to
    /// every 16th while they are shorter). A loop that sleeps reads it
    /// before it sleeps, so elsewhere it may be as old as that sleep: use
    /// [`EventLoop::now`] there.
    pub fn turn_now(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.inner().turn_nanos.load(Ordering::Relaxed))
    }

    /// Adds a spin callback: on a [busy-polling](LoopConfig::busy_poll)
    /// loop it runs on the loop thread every turn, and while there is one,
    /// epoll is asked only every few turns: every 8 while it reports
    /// events, up to every 64 while it reports none (the turns between two
    /// asks double after each ask that found nothing). A provider uses it
    /// to look at the sockets or completion queues where the next data is
    /// most likely to come (a read that finds data there saves the epoll
    /// call before it); sources without a spin callback wait a few turns
    /// longer. Never called on a loop that sleeps in epoll.
    ///
    /// The callback returns `true` when it found work (and handed it
    /// over), `false` when it looked and found nothing. The loop skips the
    /// clock on idle turns; after turns that found work it reads it and
    /// looks at the timers, so a flood handed over from spin callbacks does
    /// not hold a due timer back: after every such turn while they are long
    /// (together 50 µs or more from one read to the next), after every
    /// second, fourth, … up to every 16th while they are shorter (a busy
    /// ping-pong finds a message every other turn, and a clock read costs
    /// about as much as the work of such a turn).
    ///
    /// Callable from any thread, including from inside a callback of this
    /// loop.
    pub fn add_spin(&self, callback: impl FnMut() -> bool + Send + 'static) -> SpinId {
        let inner = self.inner();
        let id = inner.next_id();
        let slot = Arc::new(SpinSlot {
            id,
            callback: Mutex::new(Some(Box::new(callback))),
            removed: AtomicBool::new(false),
        });
        let mut spins = lock(&inner.spins);
        spins.push(slot);
        inner.spin_epoch.fetch_add(1, Ordering::AcqRel);
        inner.spin_count.fetch_add(1, Ordering::AcqRel);
        SpinId(id)
    }

    /// Removes a spin callback and drops it (also from inside that very
    /// callback: it is dropped once it returns). `false` if this loop does
    /// not know `id`.
    pub fn remove_spin(&self, id: SpinId) -> bool {
        let inner = self.inner();
        let removed = {
            let mut spins = lock(&inner.spins);
            let at = spins.iter().position(|slot| slot.id == id.0);
            at.map(|at| {
                let slot = spins.remove(at);
                slot.removed.store(true, Ordering::SeqCst);
                inner.spin_epoch.fetch_add(1, Ordering::AcqRel);
                inner.spin_count.fetch_sub(1, Ordering::AcqRel);
                slot
            })
        };
        let Some(slot) = removed else {
            return false;
        };
        // Not running now: drop the callback here. Running (on the loop
        // thread, maybe this very call): the loop drops it when it returns.
        let callback = match slot.callback.try_lock() {
            Ok(mut callback) => callback.take(),
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner().take(),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        drop(callback);
        true
    }

    /// Runs the loop for one turn on the calling thread, for an
    /// application that drives it from another event loop (tokio, for
    /// example) instead of giving it a thread in [`run`](EventLoop::run):
    /// dispatches what epoll reports (waiting at most `max_wait` when there
    /// is nothing to do), then runs the posted closures, the ready signals
    /// and the due timers, as a turn of `run` does. The calling thread is
    /// the loop thread until `turn` returns.
    ///
    /// Returns how long the driver may wait before the next turn:
    /// `Some(Duration::ZERO)` when work is already waiting (turn again
    /// soon, after letting the driver's other tasks run), the time to the
    /// earliest timer, or `None` for as long as nothing happens. Something
    /// happens when the loop's file descriptor ([`AsRawFd`], the epoll
    /// instance) becomes readable: a source is ready, or another thread
    /// posted, fired a signal, started a timer or called
    /// [`stop`](EventLoop::stop). Register that descriptor with the
    /// driver's reactor for readability and call `turn` when it reports
    /// it (or the time is up). A stop request is left for `run`.
    ///
    /// # Panics
    ///
    /// When the loop is running on another thread (or `turn` is called
    /// from one of its callbacks), and when epoll fails (not for `EINTR`).
    ///
    /// [`AsRawFd`]: std::os::fd::AsRawFd
    pub fn turn(&self, max_wait: Duration) -> Option<Duration> {
        self.turn_with(Some(max_wait))
    }

    /// A [`turn`](Self::turn) that does not ask epoll: runs what already
    /// waits (events an earlier turn fetched and left, posted closures,
    /// ready signals, due timers). For a driver told to turn again at once
    /// (`Some(Duration::ZERO)`) whose reactor reports no readiness of the
    /// loop's descriptor meanwhile: it saves the system call of a look at
    /// epoll that would find nothing.
    ///
    /// # Panics
    ///
    /// As [`turn`](Self::turn).
    pub fn run_pending(&self) -> Option<Duration> {
        self.turn_with(None)
    }

    fn turn_with(&self, poll: Option<Duration>) -> Option<Duration> {
        let inner = self.inner();
        let mut guard = RunGuard::enter(
            inner,
            "MioLoop::turn: the loop is running on another thread",
        );
        let st = guard.state.as_mut().expect("poll state present");
        // Driven turn by turn (no spin callbacks run): the clock every turn.
        st.spin_turns = 0;
        // What an earlier turn fetched and left, then what is ready now.
        if inner.work(st) {
            if let Some(max_wait) = poll {
                inner.poll(st, Some(max_wait));
                let found = st.events.iter().any(|e| e.token() != WAKER);
                inner.turn_found.store(found, Ordering::Relaxed);
                inner.work(st);
            }
        }
        let events_left = st.events.iter().nth(st.next).is_some();
        drop(guard);
        if events_left {
            Some(Duration::ZERO)
        } else {
            inner.sleep_for()
        }
    }

    /// For a driver that runs the loop turn by turn from an async task
    /// (netio-async's tokio driver): while `waker` is set, work announced
    /// to the loop from outside a turn (a post, a signal, a timer started,
    /// a stop) wakes `waker` instead of writing the loop's eventfd, so that
    /// what the other tasks of the driver's executor give the loop costs
    /// no system call and the loop's descriptor does not turn readable for
    /// it. A task woken so should [`run_pending`](Self::run_pending) (no
    /// look at epoll needed) once [`work_announced`](Self::work_announced)
    /// says so; readiness of sockets still comes through the descriptor.
    ///
    /// `None` goes back to the eventfd: set it when the driver stops, as
    /// a loop later [`run`](EventLoop::run) on a thread sleeps in epoll
    /// and would not see announcements made to a task that is gone.
    pub fn set_driver_waker(&self, waker: Option<std::task::Waker>) {
        let d = &self.inner().driver;
        let mut slot = lock(&d.waker);
        d.set.store(waker.is_some(), Ordering::Release);
        *slot = waker;
    }

    /// `true` when work was announced to the loop since its last turn
    /// looked at its queues: the turn a driver's task runs when its
    /// [driver waker](Self::set_driver_waker) woke it.
    pub fn work_announced(&self) -> bool {
        self.inner().control.work_announced()
    }

    /// `true` when the last [`turn`](Self::turn) that looked at epoll
    /// (not [`run_pending`](Self::run_pending), not [`run`](EventLoop::run))
    /// found readiness to hand over. A driver can learn from it whether a
    /// look right after announced work pays: it does when the work's
    /// writes are answered at once (a peer in the same process or on the
    /// same host), and costs a system call that finds nothing when they
    /// are not.
    pub fn turn_found_events(&self) -> bool {
        self.inner().turn_found.load(Ordering::Relaxed)
    }

    /// `true` while a thread is inside [`run`](EventLoop::run).
    pub fn is_running(&self) -> bool {
        self.inner().running_on.load(Ordering::Acquire) != 0
    }

    /// A handle that does not keep the loop alive: what a callback stored
    /// in this loop should capture to reach the loop without a reference
    /// cycle.
    pub fn downgrade(&self) -> WeakMioLoop {
        WeakMioLoop {
            handle: Arc::downgrade(&self.handle),
        }
    }
}

fn unknown_source(id: SourceId) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{id:?} is not registered with this loop"),
    )
}

impl EventLoop for MioLoop {
    type Signal = MioSignal;
    type Timer = MioTimer;

    /// Runs the loop on the calling thread.
    ///
    /// # Panics
    ///
    /// When the loop is already running (on another thread, or `run` called
    /// from one of its callbacks), and when epoll fails (not for `EINTR`).
    /// A panic in a callback propagates out of `run`, and the loop can be
    /// run again. The callback is kept: its source, spin, signal or timer
    /// runs it again at its next event (a provider's callback, through
    /// which a handler's panic unwound, goes on serving its connections).
    /// A posted closure that panicked is gone, as it would be once run.
    fn run<F: FnOnce()>(&self, init: F) {
        let inner = self.inner();
        let mut guard = RunGuard::enter(inner, "MioLoop::run: the loop is already running");
        init();
        let state = guard.state.as_mut().expect("poll state present");
        while !inner.control.take_stop() {
            inner.turn(state);
        }
    }

    fn stop(&self) {
        let inner = self.inner();
        inner
            .control
            .request_stop(&inner.waker, || inner.on_loop_thread());
    }

    fn signal<F: FnMut() + Send + 'static>(&self, callback: F) -> MioSignal {
        let inner = self.inner();
        let slot: SignalSlot = Mutex::new(Some(Box::new(callback)));
        let core = Arc::new(SignalCore::new(slot));
        let id = inner.next_id();
        lock(&inner.signals).insert(id, Arc::clone(&core));
        MioSignal {
            handle: Arc::new(SignalHandle {
                id,
                core,
                inner: Arc::downgrade(inner),
            }),
        }
    }

    fn timer<F: FnMut() + Send + 'static>(&self, callback: F) -> MioTimer {
        let inner = self.inner();
        let id = inner.next_id();
        inner.timers.insert(id, Box::new(callback));
        MioTimer {
            id,
            inner: Arc::downgrade(inner),
        }
    }

    fn on_loop_thread(&self) -> bool {
        self.inner().on_loop_thread()
    }

    /// Time since the loop was created (monotonic).
    fn now(&self) -> std::time::Duration {
        self.inner().created.elapsed()
    }

    fn post<F: FnOnce() + Send + 'static>(&self, f: F) {
        MioLoop::post(self, f)
    }
}

/// The loop's epoll instance: readable when the loop has something to do
/// (see [`MioLoop::turn`]).
impl std::os::fd::AsRawFd for MioLoop {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inner().registry.as_raw_fd()
    }
}

impl fmt::Debug for MioLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MioLoop")
            .field("busy_poll", &self.inner().control.busy_poll())
            .field("running", &self.is_running())
            .finish_non_exhaustive()
    }
}

/// The loop's eventfd wakes epoll.
impl PollWaker for Waker {
    fn wake_poller(&self) {
        // Fails only if the eventfd is gone, i.e. never while the loop
        // lives; a failed wake-up would show as a stuck loop, not as
        // corrupted state.
        let _ = self.wake();
    }
}

/// Gives the poll state back when `run` returns or unwinds.
struct RunGuard<'a> {
    inner: &'a Inner,
    state: Option<PollState>,
}

impl<'a> RunGuard<'a> {
    /// Makes the calling thread the loop thread: takes the poll state.
    ///
    /// # Panics
    ///
    /// With `busy` when another thread has it (the loop runs there).
    fn enter(inner: &'a Inner, busy: &str) -> Self {
        let mut slot = lock(&inner.poll);
        let state = slot.take().expect(busy);
        inner.running_on.store(thread_token(), Ordering::Release);
        drop(slot);
        Self {
            inner,
            state: Some(state),
        }
    }
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        // The loop thread's copy of the spin callbacks goes: a removed one
        // it still held is dropped here, with no lock held.
        if let Some(state) = self.state.as_mut() {
            let spins = std::mem::take(&mut state.spins);
            state.spin_epoch = 0;
            drop(spins);
        }
        let mut slot = lock(&self.inner.poll);
        self.inner.running_on.store(0, Ordering::Release);
        *slot = self.state.take();
    }
}

impl Inner {
    fn next_id(&self) -> usize {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn on_loop_thread(&self) -> bool {
        self.running_on.load(Ordering::Acquire) == thread_token()
    }

    fn stopping(&self) -> bool {
        self.control.stopping()
    }

    /// Announces work to the loop, writing the waker only when the loop may
    /// be asleep in epoll: not from the loop thread itself (it checks the
    /// flag before it sleeps), not in busy-poll mode, and only for the first
    /// announcement since the loop last looked ([`Control::announce`]).
    fn wake(&self) {
        let wakers = Wakers {
            eventfd: &self.waker,
            driver: &self.driver,
        };
        self.control.announce(&wakers, || self.on_loop_thread());
    }

    /// One turn of the loop. Returns early (leaving the rest for the next
    /// turn) as soon as a callback requested a stop.
    fn turn(&self, st: &mut PollState) {
        if !self.work(st) {
            return;
        }
        if self.control.busy_poll() && self.spin_count.load(Ordering::Acquire) > 0 {
            if !self.run_spins(st) {
                return;
            }
            st.spin_turns += 1;
            if st.spin_turns < st.poll_every {
                // Every event of the last poll was dispatched.
                st.events.clear();
                st.next = 0;
                return;
            }
            // The next turn reads the clock (see `work`).
            st.spin_turns = 0;
            self.poll(st, None);
            st.poll_every = if st.events.is_empty() {
                (st.poll_every * 2).min(MAX_SPINS_PER_POLL)
            } else {
                SPINS_PER_POLL
            };
            return;
        }
        st.spin_turns = 0;
        self.poll(st, None);
    }

    /// Dispatches the events of the last poll, then runs the posted
    /// closures, the ready signals and the due timers. `false` when a
    /// callback requested a stop (the rest waits for the next turn).
    ///
    /// The clock is read (and the timers looked at) every turn, except on
    /// a busy-polling loop with spin callbacks, where an idle turn skips
    /// it: there it is read on the turns that ask epoll (one in
    /// [`SPINS_PER_POLL`] to one in [`MAX_SPINS_PER_POLL`]), on turns that run posted closures or signals,
    /// and on the turn after a spin callback found work. A clock read costs
    /// as much as an idle spin on some machines (a system call on a
    /// virtual machine without a usable TSC).
    fn work(&self, st: &mut PollState) -> bool {
        if !self.dispatch_events(st) {
            return false;
        }
        self.control.begin_look();
        // Posted closures and signals may run long (a provider's dispatch
        // runs from a post): a turn that runs any reads the clock after.
        let clock = st.spin_turns == 0
            || std::mem::take(&mut st.clock_due)
            || self.posts.len() > 0
            || !self.signal_queue.is_empty();
        self.run_posts() && self.run_signals() && (!clock || self.run_timers(&mut st.cadence))
    }

    /// How long the loop may sleep in epoll: zero with work announced or
    /// signals ready, until the earliest timer, or for ever (`None`).
    fn sleep_for(&self) -> Option<Duration> {
        self.control.poll_timeout(
            || !self.signal_queue.is_empty(),
            || self.timers.next_deadline(),
            Instant::now,
        )
    }

    /// Asks epoll for events, waiting as long as [`sleep_for`] allows and
    /// at most `cap`.
    ///
    /// [`sleep_for`]: Self::sleep_for
    fn poll(&self, st: &mut PollState, cap: Option<Duration>) {
        let timeout = match (self.sleep_for(), cap) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, None) => t,
            (None, c) => c,
        };
        st.next = 0;
        match st.poll.poll(&mut st.events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => st.events.clear(),
            Err(e) => panic!("MioLoop: polling epoll failed: {e}"),
        }
    }

    /// Dispatches the events of the last poll not dispatched yet. Returns
    /// `false` when a callback requested a stop.
    fn dispatch_events(&self, st: &mut PollState) -> bool {
        let start = st.next;
        for (i, event) in st.events.iter().enumerate().skip(start) {
            st.next = i + 1;
            let id = event.token().0;
            if id == WAKER.0 {
                continue;
            }
            let taken = lock(&self.sources).get_mut(&id).and_then(Option::take);
            let Some(callback) = taken else {
                // Deregistered.
                continue;
            };
            // Put back when it returns, and when it panics.
            let mut taken = Taken::new(callback, |callback| {
                let leftover = {
                    let mut sources = lock(&self.sources);
                    match sources.get_mut(&id) {
                        Some(slot @ None) => {
                            *slot = Some(callback);
                            None
                        }
                        _ => Some(callback),
                    }
                };
                // Deregistered from inside its own callback: dropped now,
                // with no lock held.
                drop(leftover);
            });
            (taken.callback())(event);
            taken.give_back();
            if self.stopping() {
                return false;
            }
        }
        true
    }

    /// Runs every spin callback once, noting in `clock_due` whether the
    /// next turn is to read the clock (see `PollState::cadence`). Returns
    /// `false` when a callback requested a stop.
    fn run_spins(&self, st: &mut PollState) -> bool {
        let mut found = false;
        let more = self.run_each_spin(st, &mut found);
        if found && st.cadence.found_work() {
            st.clock_due = true;
        }
        more
    }

    /// [`run_spins`](Self::run_spins)' callbacks, noting in `found`
    /// whether one found work.
    fn run_each_spin(&self, st: &mut PollState, found: &mut bool) -> bool {
        let epoch = self.spin_epoch.load(Ordering::Acquire);
        if epoch != st.spin_epoch {
            let copy: Vec<_> = lock(&self.spins).iter().map(Arc::clone).collect();
            // Removed ones the old copy held are dropped with no lock held.
            drop(std::mem::replace(&mut st.spins, copy));
            st.spin_epoch = epoch;
        }
        for slot in &st.spins {
            if slot.removed.load(Ordering::Acquire) {
                continue;
            }
            let mut held = lock(&slot.callback);
            // Run in place, its slot locked meanwhile (a removal meanwhile
            // only marks it): a panic unwinds through the lock and leaves
            // the callback where it is, to run again on the next turn.
            let Some(callback) = held.as_mut() else {
                continue;
            };
            *found |= callback();
            if slot.removed.load(Ordering::SeqCst) {
                // Removed from inside its own callback (or from another
                // thread while it ran): dropped now, with no lock held.
                let removed = held.take();
                drop(held);
                drop(removed);
            } else {
                drop(held);
                // A removal between the check above and the unlock found
                // the callback locked and left it here: taken now. (A
                // removal after this finds it unlocked and drops it.)
                if slot.removed.load(Ordering::SeqCst) {
                    let late = lock(&slot.callback).take();
                    drop(late);
                }
            }
            if self.stopping() {
                return false;
            }
        }
        true
    }

    /// Runs the closures posted before this turn.
    fn run_posts(&self) -> bool {
        self.posts.run_queued(|task| task(), || !self.stopping())
    }

    /// Runs one callback per ready signal (a signal fired k times runs once
    /// per turn, k turns in a row, so signals take turns fairly).
    fn run_signals(&self) -> bool {
        self.signal_queue
            .run_ready(|callback| callback(), || !self.stopping())
    }

    /// Runs the timers due now, each at most once.
    /// `cadence` learns how long it was since the clock was last read.
    fn run_timers(&self, cadence: &mut ClockCadence) -> bool {
        let now = Instant::now();
        // One conversion serves the turn's time and the timers' check (the
        // timers count from `created` too).
        let nanos = self.timers.nanos(now);
        // Written only here, by the thread that holds the poll state.
        let last = self.turn_nanos.load(Ordering::Relaxed);
        self.turn_nanos.store(nanos, Ordering::Relaxed);
        cadence.read(nanos.saturating_sub(last));
        // Takes the timers' lock only when one may be due.
        self.timers
            .run_due_at(now, nanos, |callback| callback(), || !self.stopping())
    }

    /// Drops every callback and queued closure (the last `MioLoop` handle is
    /// gone). Dropping a callback can drop signals and timers, which come
    /// back here to unregister, so nothing is dropped under a lock, and the
    /// sweep repeats until nothing is left.
    fn shutdown(&self) {
        loop {
            let sources = std::mem::take(&mut *lock(&self.sources));
            let posts = self.posts.take_all();
            let signals = std::mem::take(&mut *lock(&self.signals));
            let queued = self.signal_queue.clear();
            let timers = self.timers.drain();
            if sources.is_empty()
                && posts.is_empty()
                && signals.is_empty()
                && queued.is_empty()
                && timers.is_empty()
            {
                return;
            }
            let signal_callbacks: Vec<_> = signals.values().map(|core| core.discard()).collect();
            drop(signal_callbacks);
            drop((sources, posts, signals, queued, timers));
        }
    }
}

/// A signal of a [`MioLoop`]: [`fire`](Signal::fire) from any thread, the
/// callback runs on the loop thread once per fire.
///
/// Firing costs one atomic add when the signal already has a pending fire;
/// otherwise it also queues the signal and, if the loop may be asleep,
/// writes the loop's eventfd. Clones fire the same signal; dropping the last
/// clone removes it (pending fires are discarded; if its callback is running
/// it is dropped when it returns). Dropped inside its own callback, the
/// signal's callback never runs again; dropped on another thread, at most
/// the one call the loop took out before the drop may still start after it.
#[derive(Clone)]
pub struct MioSignal {
    handle: Arc<SignalHandle>,
}

struct SignalHandle {
    id: usize,
    core: Arc<SignalCore<SignalSlot>>,
    inner: Weak<Inner>,
}

impl Signal for MioSignal {
    fn fire(&self) {
        let h = &*self.handle;
        if h.core.mark_fired() {
            if let Some(inner) = h.inner.upgrade() {
                inner.signal_queue.push(Arc::clone(&h.core));
                inner.wake();
            }
        }
    }
}

impl Drop for SignalHandle {
    fn drop(&mut self) {
        let callback = self.core.discard();
        drop(callback);
        if let Some(inner) = self.inner.upgrade() {
            let core = lock(&inner.signals).remove(&self.id);
            drop(core);
        }
    }
}

impl fmt::Debug for MioSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MioSignal")
            .field("id", &self.handle.id)
            .finish_non_exhaustive()
    }
}

/// A periodic timer of a [`MioLoop`], created stopped.
///
/// Deadlines live in a heap; the loop sleeps in epoll until the earliest
/// one. epoll waits in whole milliseconds (rounded up, never early), so
/// without [busy polling](LoopConfig::busy_poll) periods below about a
/// millisecond tick about once per millisecond: ticks the loop could not
/// serve in time coalesce into one callback (like a timerfd read), and the
/// schedule stays aligned to `start`. Dropping the timer stops and removes
/// it.
///
/// [`stop`](Timer::stop) on the loop thread (from a callback) is exact: the
/// callback does not run again until the next start. From another thread
/// it does not wait for the loop: a call the loop took out before the stop
/// may still start after `stop` returns, at most that one, none after; a
/// [`start`](Timer::start) from another thread retires the old schedule the
/// same way.
pub struct MioTimer {
    id: usize,
    inner: Weak<Inner>,
}

impl Timer for MioTimer {
    fn start(&self, period: Duration) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let earliest = inner.timers.start(self.id, period, Instant::now());
        if earliest && !inner.on_loop_thread() {
            inner.wake();
        }
    }

    fn stop(&self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.timers.stop(self.id);
        }
    }
}

impl Drop for MioTimer {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            let callback = inner.timers.remove(self.id);
            drop(callback);
        }
    }
}

impl fmt::Debug for MioTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MioTimer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}
