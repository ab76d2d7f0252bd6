//! Timer bookkeeping of the mio loop: a deadline heap keyed by timer id.
//!
//! Every `start` bumps the timer's generation and pushes a new heap entry;
//! entries of older generations (stopped, restarted, removed timers) are
//! skipped when they reach the top, and swept out when they pile up.

#![cfg_attr(loom, allow(dead_code))]

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::{Duration, Instant};

use super::taken::Taken;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

/// One heap entry: when, which timer, which generation of it.
type Deadline = Reverse<(Instant, usize, u64)>;

#[derive(Debug)]
struct Entry<C> {
    /// `None` while the loop runs the callback.
    callback: Option<C>,
    period: Duration,
    generation: u64,
    active: bool,
}

/// The timers of one loop, with callbacks of type `C`.
#[derive(Debug)]
pub(super) struct Timers<C> {
    entries: HashMap<usize, Entry<C>>,
    heap: BinaryHeap<Deadline>,
}

impl<C> Default for Timers<C> {
    fn default() -> Self {
        Self {
            entries: HashMap::new(),
            heap: BinaryHeap::new(),
        }
    }
}

impl<C> Timers<C> {
    /// Adds a stopped timer.
    pub(super) fn insert(&mut self, id: usize, callback: C) {
        self.entries.insert(
            id,
            Entry {
                callback: Some(callback),
                period: Duration::from_nanos(1),
                generation: 0,
                active: false,
            },
        );
    }

    /// Removes a timer; returns its callback (unless it is running) for the
    /// caller to drop outside the lock.
    pub(super) fn remove(&mut self, id: usize) -> Option<C> {
        self.entries.remove(&id).and_then(|e| e.callback)
    }

    /// (Re)starts a timer: first tick `period` after `now`. Returns `true`
    /// when this is now the earliest deadline (a sleeping loop must wake up
    /// to shorten its wait).
    pub(super) fn start(&mut self, id: usize, period: Duration, now: Instant) -> bool {
        let period = period.max(Duration::from_nanos(1));
        let Some(e) = self.entries.get_mut(&id) else {
            return false;
        };
        e.generation += 1;
        e.period = period;
        let Some(deadline) = now.checked_add(period) else {
            // Beyond the clock's range: never fires.
            e.active = false;
            return false;
        };
        e.active = true;
        let generation = e.generation;
        self.heap.push(Reverse((deadline, id, generation)));
        self.sweep_if_needed();
        self.heap.peek().map(|Reverse((_, i, g))| (*i, *g)) == Some((id, generation))
    }

    /// Stops a timer; its pending heap entry becomes stale.
    pub(super) fn stop(&mut self, id: usize) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.generation += 1;
            e.active = false;
        }
    }

    /// The earliest live deadline (stale entries on top are dropped).
    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((when, id, generation))) = self.heap.peek() {
            if self.is_live(id, generation) {
                return Some(when);
            }
            self.heap.pop();
        }
        None
    }

    /// Takes the next timer due at `now`: schedules its next tick (missed
    /// ticks coalesce into this one, the schedule stays aligned to the
    /// start) and hands out its callback, to be given back with
    /// [`put_back`](Self::put_back). Timers rescheduled here are after `now`,
    /// so repeated calls with the same `now` end.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<(usize, C)> {
        loop {
            let &Reverse((when, id, generation)) = self.heap.peek()?;
            if when > now {
                return None;
            }
            self.heap.pop();
            if !self.is_live(id, generation) {
                continue;
            }
            let e = self.entries.get_mut(&id)?;
            let late = now.duration_since(when).as_nanos();
            let period = e.period.as_nanos();
            let ticks = late / period + 1;
            let next = u64::try_from(ticks.saturating_mul(period))
                .ok()
                .and_then(|ns| when.checked_add(Duration::from_nanos(ns)));
            match next {
                Some(next) => self.heap.push(Reverse((next, id, generation))),
                None => e.active = false,
            }
            match e.callback.take() {
                Some(cb) => return Some((id, cb)),
                // Running now (its own callback's run reached here: it
                // cannot, the loop runs timers on one thread), or gone.
                None => continue,
            }
        }
    }

    /// Gives a callback back after it ran. Returns it when its timer was
    /// removed meanwhile (the caller drops it outside the lock).
    pub(super) fn put_back(&mut self, id: usize, callback: C) -> Option<C> {
        match self.entries.get_mut(&id) {
            Some(e) if e.callback.is_none() => {
                e.callback = Some(callback);
                None
            }
            _ => Some(callback),
        }
    }

    /// Removes every timer, returning the callbacks.
    pub(super) fn drain(&mut self) -> Vec<C> {
        self.heap.clear();
        self.entries
            .drain()
            .filter_map(|(_, e)| e.callback)
            .collect()
    }

    /// The deadline on top of the heap, live or stale: no live deadline is
    /// earlier.
    fn earliest_entry(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((when, _, _))| *when)
    }

    fn is_live(&self, id: usize, generation: u64) -> bool {
        self.entries
            .get(&id)
            .is_some_and(|e| e.active && e.generation == generation)
    }

    /// Drops stale entries once they outnumber the live ones (many restarts
    /// of long timers would otherwise grow the heap without bound).
    fn sweep_if_needed(&mut self) {
        if self.heap.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.heap.retain(|Reverse((_, id, generation))| {
                entries
                    .get(id)
                    .is_some_and(|e| e.active && e.generation == *generation)
            });
        }
    }
}

/// The timers of one loop behind their mutex, as the loop thread and every
/// thread holding a timer share them. The mutex is never held while a
/// callback runs, so a callback may start, stop or drop any timer, its own
/// included.
///
/// What a [`stop`](Self::stop) promises depends on where it runs. On the
/// loop thread (inside a callback) it is exact: the timer's callback does
/// not run again until the next start. From another thread it does not
/// wait for the loop: a callback [`run_due`](Self::run_due) took out
/// before the stop may still start after it returned (at most that one
/// call), none after. A restart likewise retires the old schedule: after
/// [`start`](Self::start) returns, the callback runs on the new schedule
/// only, apart from that one call taken before.
#[derive(Debug)]
pub(super) struct SharedTimers<C> {
    timers: Mutex<Timers<C>>,
    /// The clock's zero for [`earliest`](Self::earliest).
    base: Instant,
    /// Nanoseconds from `base` to the deadline on top of the heap
    /// (`u64::MAX`: none), written under the lock after each change of the
    /// heap. No live deadline is earlier, so the loop thread reads it
    /// without the lock and takes the lock only once it is due.
    earliest: AtomicU64,
}

impl<C> SharedTimers<C> {
    /// No timers.
    #[cfg(any(test, loom))]
    pub(super) fn new() -> Self {
        Self::with_base(Instant::now())
    }

    /// No timers; deadlines counted from `base` (the loop's clock zero, so
    /// that the loop converts its turn's clock reading once for both).
    pub(super) fn with_base(base: Instant) -> Self {
        Self {
            timers: Mutex::new(Timers::default()),
            base,
            earliest: AtomicU64::new(u64::MAX),
        }
    }

    /// Nanoseconds from the base to `at` (zero before it, `u64::MAX` past
    /// about 584 years), without 128-bit arithmetic: the loop calls this
    /// once per turn.
    pub(super) fn nanos(&self, at: Instant) -> u64 {
        let d = at.saturating_duration_since(self.base);
        d.as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(d.subsec_nanos()))
    }

    /// Publishes the heap's top deadline for [`may_be_due`](Self::may_be_due)
    /// (under the lock).
    fn publish(&self, timers: &Timers<C>) {
        let earliest = timers.earliest_entry().map_or(u64::MAX, |t| self.nanos(t));
        self.earliest.store(earliest, Ordering::Release);
    }

    /// `false` when no timer can be due at `now`, read without the lock.
    /// `now_nanos` is [`nanos(now)`](Self::nanos).
    pub(super) fn may_be_due(&self, now_nanos: u64) -> bool {
        self.earliest.load(Ordering::Acquire) <= now_nanos
    }

    /// Adds a stopped timer.
    pub(super) fn insert(&self, id: usize, callback: C) {
        lock(&self.timers).insert(id, callback);
    }

    /// Removes a timer; returns its callback (unless it is running) for the
    /// caller to drop with no lock held.
    pub(super) fn remove(&self, id: usize) -> Option<C> {
        lock(&self.timers).remove(id)
    }

    /// (Re)starts a timer: first tick `period` after `now`. Returns `true`
    /// when this is now the earliest deadline: a caller off the loop thread
    /// must then wake the loop, which may sleep until a later deadline or
    /// for ever.
    pub(super) fn start(&self, id: usize, period: Duration, now: Instant) -> bool {
        let mut timers = lock(&self.timers);
        let earliest = timers.start(id, period, now);
        self.publish(&timers);
        earliest
    }

    /// Stops a timer (see the type's documentation for what a stop from
    /// another thread promises).
    pub(super) fn stop(&self, id: usize) {
        lock(&self.timers).stop(id);
    }

    /// The earliest live deadline.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let mut timers = lock(&self.timers);
        let next = timers.next_deadline();
        self.publish(&timers);
        next
    }

    /// Runs the timers due at `now`, each at most once (loop thread): takes
    /// a due timer's callback out under the lock, runs it with `run` with
    /// no lock held, then gives it back, or drops it if its timer was
    /// removed meanwhile. Stops early, returning `false`, as soon as
    /// `keep_going` says no after a callback (a stop was requested).
    #[cfg(any(test, loom))]
    pub(super) fn run_due(
        &self,
        now: Instant,
        run: impl FnMut(&mut C),
        keep_going: impl Fn() -> bool,
    ) -> bool {
        self.run_due_at(now, self.nanos(now), run, keep_going)
    }

    /// [`run_due`](Self::run_due) with `now` already converted:
    /// `now_nanos` is [`nanos(now)`](Self::nanos).
    pub(super) fn run_due_at(
        &self,
        now: Instant,
        now_nanos: u64,
        mut run: impl FnMut(&mut C),
        keep_going: impl Fn() -> bool,
    ) -> bool {
        if !self.may_be_due(now_nanos) {
            return true;
        }
        loop {
            let due = {
                let mut timers = lock(&self.timers);
                let due = timers.pop_due(now);
                self.publish(&timers);
                due
            };
            let Some((id, callback)) = due else {
                return true;
            };
            // Given back when it returns, and when it panics.
            let mut taken = Taken::new(callback, |callback| {
                let leftover = lock(&self.timers).put_back(id, callback);
                // The timer was dropped from inside its own callback, or
                // from another thread while it ran.
                drop(leftover);
            });
            run(taken.callback());
            taken.give_back();
            if !keep_going() {
                return false;
            }
        }
    }

    /// Removes every timer, returning the callbacks for the caller to drop
    /// with no lock held.
    pub(super) fn drain(&self) -> Vec<C> {
        let mut timers = lock(&self.timers);
        let drained = timers.drain();
        self.publish(&timers);
        drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_timer_is_rescheduled_aligned_and_coalesces_missed_ticks() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        t.insert(1, "a");
        assert!(t.start(1, Duration::from_millis(10), t0));
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(10)));
        assert!(t.pop_due(t0 + Duration::from_millis(9)).is_none());
        // 35 ms late: ticks at 10, 20, 30 coalesce; next one at 40.
        let (id, cb) = t.pop_due(t0 + Duration::from_millis(35)).unwrap();
        assert_eq!((id, cb), (1, "a"));
        assert!(t.pop_due(t0 + Duration::from_millis(35)).is_none());
        assert_eq!(t.put_back(1, cb), None);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(40)));
    }

    #[test]
    fn stop_restart_and_remove_make_old_deadlines_stale() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        t.insert(1, 1);
        t.insert(2, 2);
        t.start(1, Duration::from_millis(5), t0);
        t.start(2, Duration::from_millis(8), t0);
        t.stop(1);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(8)));
        assert!(t.start(1, Duration::from_millis(1), t0));
        assert!(!t.start(2, Duration::from_millis(30), t0));
        let late = t0 + Duration::from_millis(20);
        assert_eq!(t.pop_due(late).map(|(id, _)| id), Some(1));
        assert!(t.pop_due(late).is_none());
        assert_eq!(t.remove(2), Some(2));
        assert_eq!(t.put_back(1, 1), None);
        assert_eq!(t.put_back(2, 2), Some(2));
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_millis(21)));
    }

    #[cfg(not(loom))]
    #[test]
    fn the_loops_time_is_whole_nanoseconds_from_the_base_and_never_negative() {
        let base = Instant::now();
        let t: SharedTimers<&str> = SharedTimers::with_base(base);
        assert_eq!(t.nanos(base), 0);
        assert_eq!(t.nanos(base + Duration::new(3, 999_999_999)), 3_999_999_999);
        assert_eq!(t.nanos(base + Duration::from_nanos(1)), 1);
        // Before the base (a clock read taken earlier): zero, not a wrap.
        if let Some(before) = base.checked_sub(Duration::from_secs(1)) {
            assert_eq!(t.nanos(before), 0);
        }
    }

    // `SharedTimers` holds an atomic, which loom allows only inside a model.
    #[cfg(not(loom))]
    #[test]
    fn may_be_due_follows_the_earliest_deadline_without_the_lock() {
        let t: SharedTimers<&str> = SharedTimers::new();
        let t0 = Instant::now();
        assert!(
            !t.may_be_due(t.nanos(t0 + Duration::from_secs(1_000_000))),
            "no timer"
        );
        t.insert(1, "long");
        t.insert(2, "short");
        t.start(1, Duration::from_secs(60), t0);
        assert!(!t.may_be_due(t.nanos(t0 + Duration::from_secs(59))));
        assert!(t.may_be_due(t.nanos(t0 + Duration::from_secs(60))));
        assert!(t.start(2, Duration::from_millis(5), t0), "now the earliest");
        assert!(!t.may_be_due(t.nanos(t0 + Duration::from_millis(4))));
        assert!(t.may_be_due(t.nanos(t0 + Duration::from_millis(5))));
        let mut ran = Vec::new();
        assert!(t.run_due(t0 + Duration::from_millis(5), |cb| ran.push(*cb), || true));
        assert_eq!(ran, ["short"]);
        // Rescheduled at 10 ms: due again only then.
        assert!(!t.may_be_due(t.nanos(t0 + Duration::from_millis(9))));
        assert!(t.may_be_due(t.nanos(t0 + Duration::from_millis(10))));
        t.stop(2);
        // A stopped timer's deadline stays published until the loop looks
        // (a false alarm costs one lock); the look publishes the next one.
        assert!(t.run_due(t0 + Duration::from_millis(10), |cb| ran.push(*cb), || true));
        assert_eq!(ran, ["short"]);
        assert!(!t.may_be_due(t.nanos(t0 + Duration::from_secs(59))));
        assert_eq!(t.drain().len(), 2);
        assert!(!t.may_be_due(t.nanos(t0 + Duration::from_secs(1_000_000))));
    }

    #[test]
    fn zero_period_is_one_nanosecond_and_restarts_do_not_pile_up() {
        let mut t = Timers::default();
        let t0 = Instant::now();
        t.insert(7, ());
        t.start(7, Duration::ZERO, t0);
        assert_eq!(t.next_deadline(), Some(t0 + Duration::from_nanos(1)));
        for _ in 0..10_000 {
            t.start(7, Duration::from_secs(60), t0);
        }
        assert!(t.heap.len() <= 2 * t.entries.len() + 65);
        t.start(7, Duration::MAX, t0);
        assert_eq!(t.next_deadline(), None);
        assert_eq!(t.drain().len(), 1);
        assert!(t.entries.is_empty() && t.heap.is_empty());
    }
}
