//! Loom models of the loop's thread-shared pieces, driven the way `MioLoop`
//! drives them: posting from other threads, a stop requested from another
//! thread, timers started, stopped and restarted from another thread while
//! the loop fires them, and signals dropped while they fire.
//!
//! Everything the models call is the production code of those pieces:
//! [`Control`] (the wake flag, the stop request, the decisions "must this
//! announcement wake the poller?" and "may the loop sleep, how long?"),
//! [`PostQueue::run_queued`], [`SignalQueue::run_ready`],
//! [`SharedTimers`]. Only epoll is a stand-in ([`FakePoller`]): it records
//! the wake-ups written to it and keeps one pending like the eventfd's
//! edge; a poll consumes it, and a poll with no timeout and no wake-up
//! pending sleeps until one comes, so a lost wake-up leaves the loop asleep
//! for ever, which loom reports as a deadlock. Timers run on a virtual
//! clock, one second per turn.
//!
//! A turn follows `Inner::turn`: [`Control::begin_look`], run the queued
//! posts, ready signals and due timers (stopping early when a stop is
//! requested), then poll for as long as [`Control::poll_timeout`] allows.
//! A model's loop leaves between running and polling once it has seen all
//! the work it expects.
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" cargo test -p netio-core --release --lib mio_loop::
//! ```

use std::time::{Duration, Instant};

use loom::sync::Condvar;

use super::control::{Control, PollWaker};
use super::posts::PostQueue;
use super::signal_queue::{SignalCore, SignalQueue};
use super::timers::SharedTimers;
use crate::sync::{lock, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Runs `f` under loom with at most three preemptions per execution unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

fn spawn<W: Send + Sync + 'static>(
    world: &Arc<W>,
    f: impl FnOnce(&W) + Send + 'static,
) -> loom::thread::JoinHandle<()> {
    let world = Arc::clone(world);
    loom::thread::spawn(move || f(&world))
}

/// epoll and the loop's eventfd, as far as wake-ups go.
struct FakePoller {
    /// A wake-up is pending (the eventfd's edge not yet seen by a poll),
    /// and how many wake-ups were ever written.
    state: Mutex<(bool, usize)>,
    woken: Condvar,
}

impl PollWaker for FakePoller {
    fn wake_poller(&self) {
        let mut state = lock(&self.state);
        state.0 = true;
        state.1 += 1;
        self.woken.notify_one();
    }
}

impl FakePoller {
    fn new() -> Self {
        Self {
            state: Mutex::new((false, 0)),
            woken: Condvar::new(),
        }
    }

    /// `epoll_wait` with `timeout`: returns at once when a wake-up is
    /// pending (consuming it) or the timeout is finite (the virtual clock
    /// moves on past any deadline); with no timeout, sleeps until woken.
    fn poll(&self, timeout: Option<Duration>) {
        let mut state = lock(&self.state);
        if timeout.is_none() {
            while !state.0 {
                state = self.woken.wait(state).unwrap();
            }
        }
        state.0 = false;
    }

    /// Wake-ups written so far.
    fn wakes(&self) -> usize {
        lock(&self.state).1
    }
}

/// The loop's control and its poller.
struct Loop {
    control: Control,
    poller: FakePoller,
}

impl Loop {
    fn new() -> Self {
        Self {
            control: Control::new(false),
            poller: FakePoller::new(),
        }
    }

    /// `Inner::wake` off the loop thread.
    fn announce(&self) {
        self.control.announce(&self.poller, || false);
    }

    /// `Inner::wake` on the loop thread, from inside a callback.
    fn announce_on_loop(&self) {
        let woke = self.control.announce(&self.poller, || true);
        assert!(!woke, "the loop thread never writes its own waker");
    }

    /// `EventLoop::stop` off the loop thread.
    fn stop(&self) {
        self.control.request_stop(&self.poller, || false);
    }

    /// Still going after a callback: no stop requested.
    fn keep_going(&self) -> bool {
        !self.control.stopping()
    }

    /// The end of `Inner::turn`: poll for as long as the loop may sleep.
    /// No signal is ready in the models that sleep.
    fn sleep(&self, next_deadline: impl FnOnce() -> Option<Instant>, now: Instant) {
        let timeout = self.control.poll_timeout(|| false, next_deadline, || now);
        self.poller.poll(timeout);
    }
}

/// A posted task: which poster, which of its posts.
type Task = (usize, usize);

struct Posts {
    lp: Loop,
    posts: PostQueue<Task>,
}

impl Posts {
    fn new() -> Self {
        Self {
            lp: Loop::new(),
            posts: PostQueue::new(),
        }
    }

    /// `MioLoop::post` off the loop thread.
    fn post(&self, task: Task) {
        self.posts.push(task);
        self.lp.announce();
    }

    /// `MioLoop::post` on the loop thread, from inside a posted closure.
    fn post_on_loop(&self, task: Task) {
        self.posts.push(task);
        self.lp.announce_on_loop();
    }
}

/// Two threads post two closures and one while the loop runs and sleeps:
/// every closure runs exactly once, each poster's in the order posted, the
/// loop never sleeps through a post, and announcements between two looks
/// of the loop write its waker once at most.
#[test]
fn loom_posts_from_two_threads_run_once_each_in_order() {
    model(|| {
        let w = Arc::new(Posts::new());
        let a = spawn(&w, |w| {
            w.post((0, 0));
            w.post((0, 1));
        });
        let b = spawn(&w, |w| w.post((1, 0)));
        let t0 = Instant::now();
        let mut ran = Vec::new();
        let mut raised_looks = 0;
        loop {
            if w.lp.control.begin_look() {
                raised_looks += 1;
            }
            w.posts
                .run_queued(|task| ran.push(task), || w.lp.keep_going());
            if ran.len() >= 3 {
                break;
            }
            w.lp.sleep(|| None, t0);
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(ran.len(), 3, "each post runs once: {ran:?}");
        let of =
            |p: usize| -> Vec<usize> { ran.iter().filter(|t| t.0 == p).map(|t| t.1).collect() };
        assert_eq!(of(0), vec![0, 1], "a poster's closures run in order");
        assert_eq!(of(1), vec![0]);
        assert!(w.posts.pop().is_none(), "nothing runs twice");
        let wakes = w.lp.poller.wakes();
        assert!(
            wakes <= raised_looks + 1,
            "{wakes} wake-ups for {raised_looks} looks that found work"
        );
    });
}

/// A closure that posts another one from the loop thread while a second
/// thread posts: the inner post runs once, on a later turn than the
/// closure that posted it (never inline, never in the same pass), without
/// any wake-up written by the loop thread, and the loop does not sleep
/// through it.
#[test]
fn loom_a_post_from_inside_a_closure_runs_on_a_later_turn() {
    model(|| {
        let w = Arc::new(Posts::new());
        w.post((0, 0));
        // The poll that ended the loop's sleep took the wake-up: the flag
        // stays raised until the loop looks, and later posts write none.
        w.lp.poller.poll(Some(Duration::ZERO));
        let b = spawn(&w, |w| w.post((1, 0)));
        let t0 = Instant::now();
        // (task, turn it ran on)
        let mut ran: Vec<(Task, usize)> = Vec::new();
        let mut turn = 0;
        loop {
            turn += 1;
            assert!(turn < 10, "the loop keeps turning");
            w.lp.control.begin_look();
            w.posts.run_queued(
                |task| {
                    ran.push((task, turn));
                    if task == (0, 0) {
                        w.post_on_loop((0, 1));
                    }
                },
                || w.lp.keep_going(),
            );
            if ran.len() >= 3 {
                break;
            }
            w.lp.sleep(|| None, t0);
        }
        b.join().unwrap();
        let turn_of = |t: Task| ran.iter().find(|r| r.0 == t).map(|r| r.1);
        assert_eq!(ran.len(), 3, "each post runs once: {ran:?}");
        let (outer, inner) = (turn_of((0, 0)).unwrap(), turn_of((0, 1)).unwrap());
        assert!(
            inner > outer,
            "the inner post ran in its poster's pass: {ran:?}"
        );
        assert!(turn_of((1, 0)).is_some());
    });
}

/// A stop requested from another thread, with a post made just before it,
/// ends a loop that is running or about to sleep: `run` returns (no lost
/// wake-up), the stop is taken (a later `run` starts afresh), and the post
/// either ran or waits for the next `run`, which runs it, once.
#[test]
fn loom_stop_from_another_thread_ends_a_sleeping_loop() {
    model(|| {
        let w = Arc::new(Posts::new());
        let stopper = spawn(&w, |w| {
            w.post((0, 0));
            w.lp.stop();
        });
        let t0 = Instant::now();
        let mut ran = Vec::new();
        let mut turns = 0;
        // `MioLoop::run`: a turn cut short by a stop goes straight back to
        // the loop condition.
        while !w.lp.control.take_stop() {
            turns += 1;
            assert!(turns < 10, "the loop keeps turning after the stop");
            w.lp.control.begin_look();
            if !w
                .posts
                .run_queued(|task| ran.push(task), || w.lp.keep_going())
            {
                continue;
            }
            w.lp.sleep(|| None, t0);
        }
        stopper.join().unwrap();
        assert!(!w.lp.control.stopping(), "the stop was taken");
        assert!(ran.len() <= 1, "the post ran twice");
        // The next `run`'s first turn.
        w.lp.control.begin_look();
        w.posts
            .run_queued(|task| ran.push(task), || w.lp.keep_going());
        assert_eq!(ran, vec![(0, 0)], "the post ran, or waited, once");
    });
}

struct Timed {
    lp: Loop,
    /// Each timer's callback counts its calls.
    timers: SharedTimers<usize>,
}

const TIMER: usize = 7;

impl Timed {
    fn new() -> Self {
        let timers = SharedTimers::new();
        timers.insert(TIMER, 0);
        Self {
            lp: Loop::new(),
            timers,
        }
    }

    /// `MioTimer::start` off the loop thread: wakes the loop when the
    /// timer became the earliest deadline.
    fn start(&self, period: Duration, now: Instant) {
        if self.timers.start(TIMER, period, now) {
            self.lp.announce();
        }
    }

    fn sleep(&self, now: Instant) {
        self.lp.sleep(|| self.timers.next_deadline(), now);
    }
}

/// The virtual clock at turn `turn`.
fn at(t0: Instant, turn: u64) -> Instant {
    t0 + Duration::from_secs(turn)
}

/// A timer started from another thread while the loop sleeps with no
/// deadline: the loop wakes and the timer fires, once per start when its
/// callback stops it (a one-shot); a timer stopped from its own callback
/// does not fire again.
#[test]
fn loom_a_timer_started_from_another_thread_wakes_the_loop_and_fires() {
    model(|| {
        let w = Arc::new(Timed::new());
        let t0 = Instant::now();
        let starter = spawn(&w, move |w| w.start(Duration::ZERO, t0));
        let mut fired = 0;
        let mut turn = 0;
        loop {
            turn += 1;
            assert!(turn < 10, "the loop keeps turning without firing");
            let now = at(t0, turn);
            w.lp.control.begin_look();
            w.timers.run_due(
                now,
                |calls| {
                    *calls += 1;
                    fired += 1;
                    w.timers.stop(TIMER);
                },
                || w.lp.keep_going(),
            );
            if fired > 0 {
                break;
            }
            w.sleep(now);
        }
        starter.join().unwrap();
        assert_eq!(fired, 1, "one tick, then stopped");
        assert_eq!(w.timers.next_deadline(), None, "stopped");
        let late = at(t0, 100);
        assert!(
            w.timers
                .run_due(late, |_| panic!("a stopped timer fired"), || true),
            "nothing stopped the pass"
        );
    });
}

/// A periodic timer stopped from another thread while the loop fires it
/// every turn: a pass over the due timers that begins after the stop
/// returned runs nothing, so at most the one call the loop took out
/// before the stop starts after it returned; the stopped timer keeps no
/// deadline, and the loop may sleep for ever.
#[test]
fn loom_a_timer_stopped_from_another_thread_runs_no_call_taken_after_the_stop() {
    model(|| {
        let w = Arc::new(Timed::new());
        let t0 = Instant::now();
        w.timers.start(TIMER, Duration::ZERO, t0);
        let stopped = Arc::new(AtomicBool::new(false));
        let stopper = {
            let (w, stopped) = (Arc::clone(&w), Arc::clone(&stopped));
            loom::thread::spawn(move || {
                w.timers.stop(TIMER);
                stopped.store(true, Ordering::SeqCst);
            })
        };
        let mut started_after_stop = 0;
        let mut turn = |n: u64| {
            w.lp.control.begin_look();
            let stop_returned = stopped.load(Ordering::SeqCst);
            w.timers.run_due(
                at(t0, n),
                |calls| {
                    assert!(!stop_returned, "a call taken after the stop returned");
                    *calls += 1;
                    if stopped.load(Ordering::SeqCst) {
                        started_after_stop += 1;
                    }
                },
                || w.lp.keep_going(),
            );
        };
        // The timer is due every turn: the loop does not sleep.
        turn(1);
        turn(2);
        stopper.join().unwrap();
        turn(3);
        assert!(
            started_after_stop <= 1,
            "{started_after_stop} calls after the stop"
        );
        assert_eq!(
            w.timers.next_deadline(),
            None,
            "a stopped timer has no deadline"
        );
        let timeout =
            w.lp.control
                .poll_timeout(|| false, || w.timers.next_deadline(), || at(t0, 3));
        assert_eq!(timeout, None, "nothing left to wake up for");
    });
}

/// A one-shot timer (its callback stops it) restarted from another thread
/// while the loop fires it: one call per start that is not cancelled, never
/// a second call for one start, never a lost one. A restart that returned
/// before a call stopped the timer is consumed by that call (it is the
/// restarted tick, or the stop after it wins); a restart that began after
/// the call stopped the timer fires once more.
#[test]
fn loom_a_one_shot_restarted_from_another_thread_while_it_fires_runs_once_per_start() {
    model(|| {
        let w = Arc::new(Timed::new());
        let t0 = Instant::now();
        w.timers.start(TIMER, Duration::ZERO, t0);
        let began = Arc::new(AtomicBool::new(false));
        let returned = Arc::new(AtomicBool::new(false));
        let restarter = {
            let (w, began, returned) = (Arc::clone(&w), Arc::clone(&began), Arc::clone(&returned));
            loom::thread::spawn(move || {
                began.store(true, Ordering::SeqCst);
                w.start(Duration::ZERO, t0);
                returned.store(true, Ordering::SeqCst);
                // Ends the model's loop.
                w.lp.announce();
            })
        };
        // Per call: the restart had returned before the call stopped the
        // timer; the restart had begun by the time it had stopped it.
        let mut calls: Vec<(bool, bool)> = Vec::new();
        let mut turn = 0;
        loop {
            turn += 1;
            assert!(turn < 10, "the loop keeps turning");
            let now = at(t0, turn);
            w.lp.control.begin_look();
            let done = returned.load(Ordering::SeqCst);
            w.timers.run_due(
                now,
                |n| {
                    *n += 1;
                    let before = returned.load(Ordering::SeqCst);
                    w.timers.stop(TIMER);
                    calls.push((before, began.load(Ordering::SeqCst)));
                },
                || w.lp.keep_going(),
            );
            if done {
                break;
            }
            w.sleep(now);
        }
        restarter.join().unwrap();
        assert!(
            (1..=2).contains(&calls.len()),
            "two starts, {} calls: {calls:?}",
            calls.len()
        );
        for (i, &(restart_returned, restart_began)) in calls.iter().enumerate() {
            if restart_returned {
                assert_eq!(
                    i + 1,
                    calls.len(),
                    "a call after the restart was used: {calls:?}"
                );
            }
            if !restart_began {
                assert!(
                    i + 1 < calls.len(),
                    "the restart after a call was lost: {calls:?}"
                );
            }
        }
        assert_eq!(w.timers.next_deadline(), None, "one-shot: stopped");
    });
}

/// Counts how often a callback ran and was dropped.
struct Counted {
    calls: Arc<AtomicUsize>,
    drops: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::Relaxed);
    }
}

type Slot = Mutex<Option<Counted>>;

struct Signals {
    lp: Loop,
    queue: SignalQueue<Slot>,
    core: Arc<SignalCore<Slot>>,
    calls: Arc<AtomicUsize>,
    drops: Arc<AtomicUsize>,
}

impl Signals {
    fn new() -> Self {
        let calls = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let counted = Counted {
            calls: Arc::clone(&calls),
            drops: Arc::clone(&drops),
        };
        Self {
            lp: Loop::new(),
            queue: SignalQueue::new(),
            core: Arc::new(SignalCore::new(Mutex::new(Some(counted)))),
            calls,
            drops,
        }
    }

    /// `Signal::fire` off the loop thread.
    fn fire(&self) {
        if self.core.mark_fired() {
            self.queue.push(Arc::clone(&self.core));
            self.lp.announce();
        }
    }

    /// `SignalHandle::drop` of the last handle: the callback, unless it is
    /// running, is dropped here.
    fn drop_signal(&self) {
        let callback = self.core.discard();
        drop(callback);
    }

    /// One turn's pass over the ready signals.
    fn run(&self, mut run: impl FnMut(&mut Counted)) {
        self.queue.run_ready(
            |cb| {
                cb.calls.fetch_add(1, Ordering::Relaxed);
                run(cb);
            },
            || self.lp.keep_going(),
        );
    }
}

/// A signal whose callback drops the signal (as dropping the last
/// `MioSignal` inside its own callback does) while another thread fires it
/// again: the callback runs once, never after the drop, is dropped exactly
/// once (by the loop, when it returns), and no lock is held across it (a
/// nested lock would deadlock).
#[test]
fn loom_a_signal_dropped_inside_its_own_callback_while_fired_elsewhere() {
    model(|| {
        let w = Arc::new(Signals::new());
        w.fire();
        let firer = spawn(&w, |w| w.fire());
        let inside = |_: &mut Counted| {
            let callback = w.core.discard();
            assert!(
                callback.is_none(),
                "the running callback is out of its slot"
            );
            assert!(w.core.is_removed());
            assert_eq!(w.drops.load(Ordering::Relaxed), 0, "dropped while running");
        };
        w.lp.control.begin_look();
        w.run(inside);
        firer.join().unwrap();
        // The next turn, after the second fire.
        w.lp.control.begin_look();
        w.run(|_| panic!("the callback ran after its signal was dropped"));
        assert_eq!(w.calls.load(Ordering::Relaxed), 1, "no call after the drop");
        assert_eq!(
            w.drops.load(Ordering::Relaxed),
            1,
            "dropped once, by the loop"
        );
        assert!(lock(w.core.data()).is_none());
        assert!(
            w.queue.is_empty(),
            "a dropped signal leaves the ready queue"
        );
    });
}

/// A signal fired, then dropped, from another thread while the loop runs
/// its ready signals: a pass that begins after the drop returned runs
/// nothing (at most the call the loop took out before the drop starts
/// after it), and the callback is dropped exactly once, by the dropper or,
/// when it was running, by the loop after it returned.
#[test]
fn loom_a_signal_dropped_from_another_thread_runs_no_call_taken_after_the_drop() {
    model(|| {
        let w = Arc::new(Signals::new());
        w.fire();
        let dropped = Arc::new(AtomicBool::new(false));
        let dropper = {
            let (w, dropped) = (Arc::clone(&w), Arc::clone(&dropped));
            loom::thread::spawn(move || {
                w.fire();
                w.drop_signal();
                dropped.store(true, Ordering::SeqCst);
            })
        };
        let mut after_drop = 0;
        for _ in 0..2 {
            w.lp.control.begin_look();
            let drop_returned = dropped.load(Ordering::SeqCst);
            w.run(|_| {
                assert!(!drop_returned, "a call taken after the drop returned");
                if dropped.load(Ordering::SeqCst) {
                    after_drop += 1;
                }
            });
        }
        dropper.join().unwrap();
        w.lp.control.begin_look();
        w.run(|_| panic!("the callback ran after the drop returned"));
        assert!(after_drop <= 1);
        assert!(
            w.calls.load(Ordering::Relaxed) <= 2,
            "more calls than fires"
        );
        assert_eq!(w.drops.load(Ordering::Relaxed), 1, "dropped once");
        assert!(lock(w.core.data()).is_none());
    });
}
