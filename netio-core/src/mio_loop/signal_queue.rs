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
//! RUSTFLAGS="--cfg loom" cargo test -p netio-core --release --lib loom
//! ```
//!
//! (preemptions are bounded to 3 per execution unless `LOOM_MAX_PREEMPTIONS`
//! is set).
#![cfg_attr(loom, allow(dead_code))]

use std::collections::VecDeque;

use super::taken::Taken;
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
    #[cfg(test)]
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

/// A signal whose payload is its callback slot: `None` while the loop runs
/// the callback, and once the signal is removed.
impl<C> SignalCore<Mutex<Option<C>>> {
    /// Runs the callback once with `run` (loop thread), the slot unlocked
    /// meanwhile so the callback may drop or fire its own signal. The
    /// callback goes back to its slot when it returns, and when it panics;
    /// when the signal was removed while it ran, it is dropped instead
    /// (outside any lock) and never runs again.
    pub(crate) fn run_callback(&self, run: impl FnOnce(&mut C)) {
        let Some(callback) = lock(&self.data).take() else {
            return;
        };
        let mut taken = Taken::new(callback, |callback| {
            let leftover = {
                let mut slot = lock(&self.data);
                if self.is_removed() || slot.is_some() {
                    Some(callback)
                } else {
                    *slot = Some(callback);
                    None
                }
            };
            drop(leftover);
        });
        run(taken.callback());
        taken.give_back();
    }

    /// Removes the signal (its pending fires are discarded) and takes its
    /// callback for the caller to drop outside any lock; `None` when the
    /// callback is running now (the loop drops it when it returns).
    pub(crate) fn discard(&self) -> Option<C> {
        self.remove();
        lock(&self.data).take()
    }
}

/// The queue of signals with pending fires, in the order they became ready.
#[derive(Debug)]
pub(crate) struct SignalQueue<T> {
    ready: Mutex<VecDeque<Arc<SignalCore<T>>>>,
    /// The queue's length, written under the lock after each change and
    /// read without it (as [`PostQueue`](super::posts::PostQueue) does):
    /// a turn with no signal ready takes no lock.
    queued: AtomicUsize,
}

impl<T> SignalQueue<T> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self {
            ready: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
        }
    }

    /// Queues a signal whose [`mark_fired`](SignalCore::mark_fired) returned
    /// `true`.
    pub(crate) fn push(&self, core: Arc<SignalCore<T>>) {
        let mut ready = lock(&self.ready);
        ready.push_back(core);
        self.queued.store(ready.len(), Ordering::Release);
    }

    /// Takes one fire of the first ready signal and returns that signal: the
    /// caller runs its callback exactly once. The signal goes back to the end
    /// of the queue if more fires are pending. Removed signals are dropped
    /// from the queue with all their fires.
    pub(crate) fn take_one(&self) -> Option<Arc<SignalCore<T>>> {
        let mut ready = lock(&self.ready);
        let taken = loop {
            let Some(core) = ready.pop_front() else {
                break None;
            };
            if core.is_removed() {
                continue;
            }
            if core.pending.fetch_sub(1, Ordering::AcqRel) > 1 {
                ready.push_back(Arc::clone(&core));
            }
            break Some(core);
        };
        self.queued.store(ready.len(), Ordering::Release);
        taken
    }

    /// The number of ready signals (bounds one dispatch pass), read without
    /// the lock.
    pub(crate) fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// `true` when no signal is ready.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Empties the queue, returning what it held (to be dropped by the
    /// caller outside any lock).
    pub(crate) fn clear(&self) -> VecDeque<Arc<SignalCore<T>>> {
        let mut ready = lock(&self.ready);
        self.queued.store(0, Ordering::Release);
        std::mem::take(&mut *ready)
    }
}

/// The ready queue of signals whose payload is their callback slot.
impl<C> SignalQueue<Mutex<Option<C>>> {
    /// Runs one callback per signal ready when it looked (loop thread), in
    /// the order they became ready, each with no lock held
    /// ([`SignalCore::run_callback`]); a callback whose signal was dropped
    /// while it ran is dropped here, after it returned. Stops early,
    /// returning `false`, as soon as `keep_going` says no after a callback
    /// (a stop was requested).
    pub(crate) fn run_ready(
        &self,
        mut run: impl FnMut(&mut C),
        keep_going: impl Fn() -> bool,
    ) -> bool {
        for _ in 0..self.len() {
            let Some(core) = self.take_one() else {
                break;
            };
            core.run_callback(&mut run);
            if !keep_going() {
                return false;
            }
        }
        true
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
    //! Models of the loop thread sleeping on its waker while other threads
    //! fire. The waker is an eventfd stand-in, loom's `Notify` (one stored
    //! permit, consumed by `wait`). A lost wake-up leaves the loop asleep
    //! forever, which loom reports as a deadlock.

    use super::*;
    use loom::sync::Notify;

    /// Runs `f` under loom, by default with at most three preemptions per
    /// execution (`LOOM_MAX_PREEMPTIONS` overrides it) so a model takes
    /// seconds.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(f);
    }

    type Core = Arc<SignalCore<AtomicUsize>>;

    /// What the firing threads and the loop share.
    struct World {
        queue: SignalQueue<AtomicUsize>,
        flag: WakeFlag,
        waker: Notify,
        /// Wake-ups ever written.
        wakes: AtomicUsize,
    }

    impl World {
        fn new() -> Self {
            Self {
                queue: SignalQueue::new(),
                flag: WakeFlag::new(),
                waker: Notify::new(),
                wakes: AtomicUsize::new(0),
            }
        }

        /// `Signal::fire` as the real loop does it, from another thread.
        fn fire(&self, core: &Core) {
            if core.mark_fired() {
                self.queue.push(Arc::clone(core));
                if self.flag.raise() {
                    self.wakes.fetch_add(1, Ordering::Relaxed);
                    self.waker.notify();
                }
            }
        }

        /// `Signal::fire` on the loop thread: the flag, no waker write (the
        /// loop checks the flag before it sleeps).
        fn fire_on_loop(&self, core: &Core) {
            if core.mark_fired() {
                self.queue.push(Arc::clone(core));
                self.flag.raise();
            }
        }

        /// The loop thread: look, dispatch one pass, sleep unless there is
        /// work, until `total` callbacks ran. `inside` is fired once from
        /// inside the first callback. Returns the looks that found the flag
        /// raised.
        fn run_loop(&self, total: usize, mut inside: Option<&Core>) -> usize {
            let mut calls = 0;
            let mut raised_looks = 0;
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
                    if let Some(s) = inside.take() {
                        self.fire_on_loop(s);
                    }
                }
                assert!(calls <= total, "more callbacks than fires");
                if calls == total {
                    return raised_looks;
                }
                if self.queue.is_empty() && !self.flag.is_raised() {
                    self.waker.wait();
                }
            }
        }
    }

    fn signal() -> Core {
        Arc::new(SignalCore::new(AtomicUsize::new(0)))
    }

    fn calls(core: &Core) -> usize {
        core.data().load(Ordering::Relaxed)
    }

    /// Two threads fire one signal, twice and once, while the loop drains:
    /// three callbacks, none lost, none doubled, and no more wake-ups written
    /// than the loop consumed plus one.
    #[test]
    fn fires_from_two_threads_each_run_once() {
        model(|| {
            let world = Arc::new(World::new());
            let sig = signal();
            let threads: Vec<_> = [2usize, 1]
                .into_iter()
                .map(|n| {
                    let (world, sig) = (Arc::clone(&world), Arc::clone(&sig));
                    loom::thread::spawn(move || (0..n).for_each(|_| world.fire(&sig)))
                })
                .collect();
            let raised_looks = world.run_loop(3, None);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(calls(&sig), 3);
            assert_eq!(sig.pending(), 0);
            assert!(world.queue.is_empty());
            assert!(world.wakes.load(Ordering::Relaxed) <= raised_looks + 1);
        });
    }

    /// Two signals fired from two threads, one of them fired again by the
    /// loop thread from inside a callback: each fire runs exactly once.
    #[test]
    fn two_signals_and_a_fire_from_inside_a_callback() {
        model(|| {
            let world = Arc::new(World::new());
            let (a, b) = (signal(), signal());
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
            assert_eq!((calls(&a), calls(&b)), (2, 1));
            assert_eq!(a.pending() + b.pending(), 0);
        });
    }

    /// A signal removed by another thread while fires are pending: the loop
    /// never runs more callbacks than fires, drops the signal from its
    /// queue, and other signals keep working.
    #[test]
    fn removal_discards_pending_fires() {
        model(|| {
            let world = Arc::new(World::new());
            let (a, b) = (signal(), signal());
            world.fire(&a);
            world.fire(&a);
            let remover = {
                let (world, a, b) = (Arc::clone(&world), Arc::clone(&a), Arc::clone(&b));
                loom::thread::spawn(move || {
                    a.remove();
                    world.fire(&b);
                })
            };
            // `b`'s callback is the last one: `a` runs 0 to 2 times before it.
            let mut seen = 0;
            while calls(&b) == 0 {
                if world.flag.clear() || !world.queue.is_empty() {
                    while let Some(core) = world.queue.take_one() {
                        core.data().fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    world.waker.wait();
                }
                seen += 1;
                assert!(seen < 10);
            }
            remover.join().unwrap();
            assert!(calls(&a) <= 2);
            assert_eq!(calls(&b), 1);
            assert!(world.queue.take_one().is_none());
        });
    }
}
