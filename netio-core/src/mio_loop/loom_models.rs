//! Loom models of the loop's thread-shared pieces as `MioLoop` uses them:
//! posting from other threads, a stop requested from another thread, a
//! timer started from another thread, and a signal dropped inside its own
//! callback while another thread fires it.
//!
//! The loop sleeps on a stand-in for its eventfd, loom's `Notify` (one
//! stored permit): a lost wake-up leaves it asleep forever, which loom
//! reports as a deadlock. Each turn follows `Inner::turn`: lower the wake
//! flag, run what was queued, then sleep only if the flag is still lowered,
//! no stop is requested and nothing is due.
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg loom" cargo test -p netio-core --release --lib loom
//! ```

use std::time::{Duration, Instant};

use loom::sync::Notify;

use super::posts::{PostQueue, StopFlag};
use super::signal_queue::{SignalCore, SignalQueue, WakeFlag};
use super::timers::Timers;
use crate::sync::{lock, Arc, AtomicUsize, Mutex, Ordering};

/// Runs `f` under loom with at most three preemptions per execution unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(f);
}

/// A posted task: which poster, which of its posts.
type Task = (usize, usize);

/// What other threads and the loop share.
struct Shared {
    posts: PostQueue<Task>,
    stop: StopFlag,
    flag: WakeFlag,
    waker: Notify,
    timers: Mutex<Timers<usize>>,
}

impl Shared {
    fn new() -> Self {
        Self {
            posts: PostQueue::new(),
            stop: StopFlag::new(),
            flag: WakeFlag::new(),
            waker: Notify::new(),
            timers: Mutex::new(Timers::default()),
        }
    }

    /// `Inner::wake` from a thread other than the loop's.
    fn wake(&self) {
        if self.flag.raise() {
            self.waker.notify();
        }
    }

    /// `MioLoop::post` from another thread.
    fn post(&self, task: Task) {
        self.posts.push(task);
        self.wake();
    }

    /// `EventLoop::stop` from another thread.
    fn stop(&self) {
        self.stop.request();
        self.wake();
    }

    /// `Timer::start` from another thread: wakes the loop when the timer
    /// became the earliest deadline.
    fn start_timer(&self, id: usize, period: Duration) {
        let earliest = lock(&self.timers).start(id, period, Instant::now());
        if earliest {
            self.wake();
        }
    }

    /// `Inner::run_posts`: the tasks queued when the turn looked.
    fn run_posts(&self, ran: &mut Vec<Task>) {
        for _ in 0..self.posts.len() {
            let Some(task) = self.posts.pop() else { break };
            ran.push(task);
        }
    }

    /// Sleeps unless something announced work since the flag was lowered.
    /// `due` stands for a timer deadline (epoll then waits with a timeout,
    /// it does not sleep for ever).
    fn sleep_unless_work(&self, due: bool) {
        if !self.flag.is_raised() && !self.stop.is_requested() && !due {
            self.waker.wait();
        }
    }
}

fn spawn(
    shared: &Arc<Shared>,
    f: impl FnOnce(&Shared) + Send + 'static,
) -> loom::thread::JoinHandle<()> {
    let shared = Arc::clone(shared);
    loom::thread::spawn(move || f(&shared))
}

/// Two threads post two closures and one while the loop runs: every
/// closure runs exactly once, each poster's in the order posted, and the
/// loop never sleeps through a post.
#[test]
fn loom_posts_from_two_threads_run_once_each_in_order() {
    model(|| {
        let shared = Arc::new(Shared::new());
        let a = spawn(&shared, |s| {
            s.post((0, 0));
            s.post((0, 1));
        });
        let b = spawn(&shared, |s| s.post((1, 0)));
        let mut ran = Vec::new();
        while ran.len() < 3 {
            shared.flag.clear();
            shared.run_posts(&mut ran);
            if ran.len() < 3 && shared.posts.len() == 0 {
                shared.sleep_unless_work(false);
            }
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(ran.len(), 3, "each post runs once: {ran:?}");
        let of =
            |p: usize| -> Vec<usize> { ran.iter().filter(|t| t.0 == p).map(|t| t.1).collect() };
        assert_eq!(of(0), vec![0, 1], "a poster's closures run in order");
        assert_eq!(of(1), vec![0]);
        assert!(shared.posts.pop().is_none(), "nothing runs twice");
    });
}

/// A stop requested from another thread, with a post made just before it,
/// ends a loop that is running or about to sleep: `run` returns (no lost
/// wake-up), the stop is taken (a later `run` starts afresh), and the post
/// ran or is still queued, never lost.
#[test]
fn loom_stop_from_another_thread_ends_a_sleeping_loop() {
    model(|| {
        let shared = Arc::new(Shared::new());
        let stopper = spawn(&shared, |s| {
            s.post((0, 0));
            s.stop();
        });
        let mut ran = Vec::new();
        let mut turns = 0;
        // `MioLoop::run`.
        while !shared.stop.take() {
            turns += 1;
            assert!(turns < 10, "the loop keeps turning after the stop");
            shared.flag.clear();
            shared.run_posts(&mut ran);
            if shared.stop.is_requested() {
                continue;
            }
            shared.sleep_unless_work(false);
        }
        stopper.join().unwrap();
        assert!(!shared.stop.is_requested(), "the stop was taken");
        let queued = shared.posts.take_all().len();
        assert_eq!(ran.len() + queued, 1, "the post ran or waits, once");
    });
}

/// A timer started from another thread while the loop sleeps with no
/// deadline: the loop wakes and the timer fires, once per due tick; a
/// timer the loop stops from its callback does not fire again.
#[test]
fn loom_a_timer_started_from_another_thread_wakes_the_loop_and_fires() {
    model(|| {
        let shared = Arc::new(Shared::new());
        lock(&shared.timers).insert(7, 0usize);
        let starter = spawn(&shared, |s| s.start_timer(7, Duration::ZERO));
        let mut fired = 0;
        let mut turns = 0;
        while fired == 0 {
            turns += 1;
            assert!(turns < 10, "the loop keeps turning without firing");
            shared.flag.clear();
            // `Inner::run_timers`, a second after the start: every started
            // deadline is due.
            let now = Instant::now() + Duration::from_secs(1);
            loop {
                let due = lock(&shared.timers).pop_due(now);
                let Some((id, mut calls)) = due else { break };
                assert_eq!(id, 7);
                calls += 1;
                fired += 1;
                // The callback stops its own timer.
                lock(&shared.timers).stop(id);
                assert!(lock(&shared.timers).put_back(id, calls).is_none());
            }
            let due = lock(&shared.timers).next_deadline().is_some();
            if fired == 0 {
                shared.sleep_unless_work(due);
            }
        }
        starter.join().unwrap();
        assert_eq!(fired, 1, "one tick, then stopped");
        let now = Instant::now() + Duration::from_secs(2);
        assert!(
            lock(&shared.timers).pop_due(now).is_none(),
            "a stopped timer does not fire again"
        );
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

/// A signal whose callback drops the signal (as dropping the last
/// `MioSignal` inside its own callback does) while another thread fires it
/// again: the callback runs once, never after the drop, is dropped exactly
/// once (by the loop, when it returns), and no lock is held across it (a
/// nested lock would deadlock).
#[test]
fn loom_a_signal_dropped_inside_its_own_callback_while_fired_elsewhere() {
    model(|| {
        let calls = Arc::new(AtomicUsize::new(0));
        let drops = Arc::new(AtomicUsize::new(0));
        let core: Arc<SignalCore<Slot>> = Arc::new(SignalCore::new(Mutex::new(Some(Counted {
            calls: Arc::clone(&calls),
            drops: Arc::clone(&drops),
        }))));
        let queue = Arc::new(SignalQueue::new());
        let fire = |core: &Arc<SignalCore<Slot>>, queue: &SignalQueue<Slot>| {
            if core.mark_fired() {
                queue.push(Arc::clone(core));
            }
        };
        fire(&core, &queue);
        let firer = {
            let (core, queue) = (Arc::clone(&core), Arc::clone(&queue));
            loom::thread::spawn(move || fire(&core, &queue))
        };
        let drain = || {
            while let Some(c) = queue.take_one() {
                let leftover = c.run_callback(|cb| {
                    cb.calls.fetch_add(1, Ordering::Relaxed);
                    // `SignalHandle::drop` inside the callback: the slot
                    // is empty while the callback runs.
                    assert!(c.discard().is_none(), "the running callback is out");
                });
                drop(leftover);
            }
        };
        drain();
        firer.join().unwrap();
        drain();
        assert_eq!(calls.load(Ordering::Relaxed), 1, "no call after the drop");
        assert_eq!(
            drops.load(Ordering::Relaxed),
            1,
            "dropped once, by the loop"
        );
        assert!(core.is_removed());
        assert!(lock(core.data()).is_none());
    });
}
