//! The thread-shared core of signals, free of mio so loom can model it.
//!
//! A signal counts its pending fires in an atomic ([`SignalCore`]). Only the
//! fire that moves the count from 0 to 1 puts the signal on the ready queue
//! ([`SignalQueue`]) and asks for a wake-up; later fires only add to the
//! count, without a lock or a system call. The loop thread takes a ready
//! signal, consumes one fire and, while fires remain, puts it back at the end
//! of the queue. So every fire yields exactly one callback, a signal is on the
//! queue at most once, and a busy signal cannot starve the others.
//!
//! [`WakeFlag`] coalesces wake-ups of a sleeping loop: of all the state
//! changes made between two looks of the loop, only the first one writes to
//! the loop's waker.
//!
//! The model checks live at the bottom of this file; run them with
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=2 RUSTFLAGS="--cfg loom" cargo test -p netio-core --release --lib loom
//! ```
#![cfg_attr(loom, allow(dead_code))]

use std::collections::VecDeque;

use crate::sync::{lock, Arc, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Tells a sleeping loop that there is work, at most one wake-up per look.
///
/// Producers change shared state first, then call [`raise`](Self::raise); the
/// loop calls [`clear`](Self::clear) before it looks at the shared state and
/// [`is_raised`](Self::is_raised) just before it sleeps.
#[derive(Debug)]
pub(crate) struct WakeFlag {
    raised: AtomicBool,
}

impl WakeFlag {
    /// A lowered flag.
    pub(crate) fn new() -> Self {
        Self {
            raised: AtomicBool::new(false),
        }
    }

    /// Marks that there is work. Returns `true` when the flag was lowered:
    /// the caller must then wake the loop (write its waker). `false` means a
    /// wake-up is already on its way, or the loop has not looked yet.
    pub(crate) fn raise(&self) -> bool {
        !self.raised.swap(true, Ordering::AcqRel)
    }

    /// Lowers the flag before the loop looks for work. Everything written
    /// before a `raise` that this clears is visible to the caller afterwards.
    pub(crate) fn clear(&self) -> bool {
        self.raised.swap(false, Ordering::AcqRel)
    }

    /// `true` when work was announced since the last [`clear`](Self::clear);
    /// the loop must then not sleep.
    pub(crate) fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }
}

/// One signal's shared state: its pending fires, whether it was removed,
/// and the loop's payload (the callback slot).
#[derive(Debug)]
pub(crate) struct SignalCore<T> {
    pending: AtomicUsize,
    removed: AtomicBool,
    data: T,
}

impl<T> SignalCore<T> {
    /// A signal with no pending fire.
    pub(crate) fn new(data: T) -> Self {
        Self {
            pending: AtomicUsize::new(0),
            removed: AtomicBool::new(false),
            data,
        }
    }

    /// The loop's payload.
    pub(crate) fn data(&self) -> &T {
        &self.data
    }

    /// Records one fire. Returns `true` when the signal just became ready:
    /// the caller must then [`push`](SignalQueue::push) it and wake the loop.
    pub(crate) fn mark_fired(&self) -> bool {
        self.pending.fetch_add(1, Ordering::AcqRel) == 0
    }

    /// Marks the signal removed: its queued fires are discarded.
    pub(crate) fn remove(&self) {
        self.removed.store(true, Ordering::Release);
    }

    /// `true` once [`remove`](Self::remove) was called.
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Acquire)
    }

    /// Fires recorded and not yet taken by the loop.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

/// The queue of signals with pending fires, in the order they became ready.
#[derive(Debug)]
pub(crate) struct SignalQueue<T> {
    ready: Mutex<VecDeque<Arc<SignalCore<T>>>>,
}

impl<T> SignalQueue<T> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self {
            ready: Mutex::new(VecDeque::new()),
        }
    }

    /// Queues a signal whose [`mark_fired`](SignalCore::mark_fired) returned
    /// `true`.
    pub(crate) fn push(&self, core: Arc<SignalCore<T>>) {
        lock(&self.ready).push_back(core);
    }

    /// Takes one fire of the first ready signal and returns that signal: the
    /// caller runs its callback exactly once. The signal goes back to the end
    /// of the queue if more fires are pending. Removed signals are dropped
    /// from the queue with all their fires.
    pub(crate) fn take_one(&self) -> Option<Arc<SignalCore<T>>> {
        let mut ready = lock(&self.ready);
        loop {
            let core = ready.pop_front()?;
            if core.is_removed() {
                continue;
            }
            if core.pending.fetch_sub(1, Ordering::AcqRel) > 1 {
                ready.push_back(Arc::clone(&core));
            }
            return Some(core);
        }
    }

    /// The number of ready signals (bounds one dispatch pass).
    pub(crate) fn len(&self) -> usize {
        lock(&self.ready).len()
    }

    /// `true` when no signal is ready.
    pub(crate) fn is_empty(&self) -> bool {
        lock(&self.ready).is_empty()
    }

    /// Empties the queue, returning what it held (to be dropped by the
    /// caller outside any lock).
    pub(crate) fn clear(&self) -> VecDeque<Arc<SignalCore<T>>> {
        std::mem::take(&mut *lock(&self.ready))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn each_fire_is_taken_once_and_signals_take_turns() {
        let q = SignalQueue::new();
        let a = Arc::new(SignalCore::new('a'));
        let b = Arc::new(SignalCore::new('b'));
        for core in [&a, &a, &b, &a] {
            if core.mark_fired() {
                q.push(Arc::clone(core));
            }
        }
        assert_eq!(q.len(), 2);
        let order: Vec<char> = std::iter::from_fn(|| q.take_one().map(|c| *c.data())).collect();
        assert_eq!(order, ['a', 'b', 'a', 'a']);
        assert!(q.is_empty());
        assert_eq!(a.pending(), 0);
        assert!(a.mark_fired(), "a drained signal becomes ready again");
    }

    #[test]
    fn removed_signal_loses_its_pending_fires() {
        let q = SignalQueue::new();
        let a = Arc::new(SignalCore::new(()));
        assert!(a.mark_fired());
        q.push(Arc::clone(&a));
        assert!(!a.mark_fired());
        a.remove();
        assert!(q.take_one().is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn wake_flag_asks_for_one_wake_per_look() {
        let f = WakeFlag::new();
        assert!(f.raise());
        assert!(!f.raise());
        assert!(f.is_raised());
        assert!(f.clear());
        assert!(!f.is_raised());
        assert!(!f.clear());
        assert!(f.raise());
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    //! Models of the loop thread sleeping on a waker while other threads
    //! fire. The waker is an eventfd stand-in: a counter under a mutex with
    //! a condition variable; reading it resets it. A lost wake-up leaves the
    //! loop asleep forever, which loom reports as a deadlock.

    use super::*;
    use loom::sync::Condvar;

    /// What the firing threads and the loop share.
    struct World {
        queue: SignalQueue<AtomicUsize>,
        flag: WakeFlag,
        /// The eventfd stand-in: wake-ups written and not yet read.
        waker: Mutex<usize>,
        waker_cv: Condvar,
        /// Wake-ups ever written.
        wakes: AtomicUsize,
    }

    impl World {
        fn new() -> Self {
            Self {
                queue: SignalQueue::new(),
                flag: WakeFlag::new(),
                waker: Mutex::new(0),
                waker_cv: Condvar::new(),
                wakes: AtomicUsize::new(0),
            }
        }

        /// `Signal::fire` as the real loop does it.
        fn fire(&self, core: &Arc<SignalCore<AtomicUsize>>) {
            if core.mark_fired() {
                self.queue.push(Arc::clone(core));
                if self.flag.raise() {
                    self.wakes.fetch_add(1, Ordering::Relaxed);
                    *lock(&self.waker) += 1;
                    self.waker_cv.notify_one();
                }
            }
        }

        /// Blocks until a wake-up was written, then consumes all of them.
        fn sleep(&self) {
            let mut w = lock(&self.waker);
            while *w == 0 {
                w = self.waker_cv.wait(w).unwrap();
            }
            *w = 0;
        }

        /// The loop thread: look, dispatch, sleep unless there is work, until
        /// `total` callbacks ran. Returns the number of looks that found the
        /// flag raised.
        fn run_loop(
            &self,
            total: usize,
            fire_inside: Option<&Arc<SignalCore<AtomicUsize>>>,
        ) -> usize {
            let mut calls = 0;
            let mut raised_looks = 0;
            let mut fired_inside = false;
            loop {
                if self.flag.clear() {
                    raised_looks += 1;
                }
                for _ in 0..self.queue.len() {
                    let Some(core) = self.queue.take_one() else {
                        break;
                    };
                    core.data().fetch_add(1, Ordering::Relaxed);
                    calls += 1;
                    if let (Some(s), false) = (fire_inside, fired_inside) {
                        fired_inside = true;
                        self.fire(s);
                    }
                }
                if calls == total {
                    return raised_looks;
                }
                assert!(calls < total, "more callbacks than fires");
                if self.queue.is_empty() && !self.flag.is_raised() {
                    self.sleep();
                }
            }
        }
    }

    /// Two threads fire one signal twice and once while the loop drains:
    /// three callbacks, nothing lost, nothing doubled, at most one wake-up
    /// written per look that consumed one.
    #[test]
    fn fires_from_two_threads_each_run_once() {
        loom::model(|| {
            let world = Arc::new(World::new());
            let sig = Arc::new(SignalCore::new(AtomicUsize::new(0)));
            let threads: Vec<_> = [2usize, 1]
                .into_iter()
                .map(|n| {
                    let world = Arc::clone(&world);
                    let sig = Arc::clone(&sig);
                    loom::thread::spawn(move || {
                        for _ in 0..n {
                            world.fire(&sig);
                        }
                    })
                })
                .collect();
            let raised_looks = world.run_loop(3, None);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(sig.data().load(Ordering::Relaxed), 3);
            assert_eq!(sig.pending(), 0);
            assert!(world.queue.is_empty());
            // Each written wake-up needed the flag lowered: the initial state
            // or a look that found it raised.
            assert!(world.wakes.load(Ordering::Relaxed) <= raised_looks + 1);
        });
    }

    /// Two signals fired from two threads, one of them re-fired by the loop
    /// thread from inside its callback: every fire runs exactly once per
    /// signal.
    #[test]
    fn two_signals_and_a_fire_from_inside_a_callback() {
        loom::model(|| {
            let world = Arc::new(World::new());
            let a = Arc::new(SignalCore::new(AtomicUsize::new(0)));
            let b = Arc::new(SignalCore::new(AtomicUsize::new(0)));
            let threads: Vec<_> = [Arc::clone(&a), Arc::clone(&b)]
                .into_iter()
                .map(|sig| {
                    let world = Arc::clone(&world);
                    loom::thread::spawn(move || world.fire(&sig))
                })
                .collect();
            world.run_loop(3, Some(&a));
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(a.data().load(Ordering::Relaxed), 2);
            assert_eq!(b.data().load(Ordering::Relaxed), 1);
            assert_eq!(a.pending() + b.pending(), 0);
        });
    }
}
