//! The loop's cross-thread control, free of mio so loom can model it: the
//! wake flag, the stop request, and the two decisions built on them.
//!
//! - Must a thread that just announced work wake the poller?
//!   ([`Control::announce`]) Only for the first announcement since the loop
//!   last looked, never from the loop thread itself and never on a
//!   busy-polling loop: in every other case the loop is awake, or checks
//!   the flag before it sleeps.
//! - May the loop sleep, and how long? ([`Control::poll_timeout`]) Not at
//!   all while work was announced since it looked, a stop is requested or
//!   signals are still ready; otherwise until the earliest timer, or for
//!   ever.
//!
//! A turn of the loop is: [`begin_look`](Control::begin_look) (lower the
//! flag), run what is queued, ask [`poll_timeout`](Control::poll_timeout),
//! sleep in the poller for that long. Every producer queues its work first
//! and announces it after, so either the loop's look sees the work, or the
//! announcement comes after the flag was lowered and the timeout (or the
//! poller's waker) sees it.

#![cfg_attr(loom, allow(dead_code))]

use std::time::{Duration, Instant};

use super::posts::StopFlag;
use super::signal_queue::WakeFlag;

/// What ends the poller's sleep from another thread: the loop's eventfd in
/// production, a recording stand-in in the loom models. A wake-up that
/// comes while the poller is awake is kept for its next poll.
pub(crate) trait PollWaker {
    /// Ends the poller's current sleep, or its next one.
    fn wake_poller(&self);
}

/// The wake flag and stop request of one loop, and the loop's mode.
#[derive(Debug)]
pub(crate) struct Control {
    busy_poll: bool,
    wake: WakeFlag,
    stop: StopFlag,
}

impl Control {
    /// No work announced, no stop requested. A busy-polling loop never
    /// sleeps, so nothing ever wakes its poller.
    pub(crate) fn new(busy_poll: bool) -> Self {
        Self {
            busy_poll,
            wake: WakeFlag::new(),
            stop: StopFlag::new(),
        }
    }

    /// `true` for a busy-polling loop.
    pub(crate) fn busy_poll(&self) -> bool {
        self.busy_poll
    }

    /// Announces work queued before this call, and wakes the poller
    /// through `waker` when the loop may be asleep: for the first
    /// announcement since the loop last looked, not on a busy-polling loop,
    /// and not from the loop thread, which checks the flag before it
    /// sleeps (`on_loop_thread` is asked only when it matters). Returns
    /// `true` when it woke the poller.
    pub(crate) fn announce(
        &self,
        waker: &impl PollWaker,
        on_loop_thread: impl FnOnce() -> bool,
    ) -> bool {
        // The flag is raised in every case: the loop thread relies on it
        // not to sleep through what it queued itself.
        if self.wake.raise() && !self.busy_poll && !on_loop_thread() {
            waker.wake_poller();
            true
        } else {
            false
        }
    }

    /// Requests a stop and announces it; `run` returns after the callback
    /// now running. Returns `true` when it woke the poller.
    pub(crate) fn request_stop(
        &self,
        waker: &impl PollWaker,
        on_loop_thread: impl FnOnce() -> bool,
    ) -> bool {
        self.stop.request();
        self.announce(waker, on_loop_thread)
    }

    /// `true` while a stop is requested and not yet taken.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.is_requested()
    }

    /// Takes a requested stop: `run` returns, and a later `run` starts
    /// afresh. A busy-polling loop, which never sleeps, reads the flag
    /// before it writes it: a turn with no stop requested then writes
    /// nothing shared, and a request it does not see yet is seen a turn
    /// later.
    pub(crate) fn take_stop(&self) -> bool {
        if self.busy_poll && !self.stop.is_requested() {
            return false;
        }
        self.stop.take()
    }

    /// Lowers the wake flag before the loop looks at its queues; returns
    /// `true` when work was announced since the last look. Everything
    /// queued before an announcement this clears is visible afterwards.
    /// A busy-polling loop reads the flag first, as in
    /// [`take_stop`](Self::take_stop): it never sleeps, so the flag only
    /// orders what it reads, which each queue's own release and acquire
    /// do as well.
    pub(crate) fn begin_look(&self) -> bool {
        if self.busy_poll && !self.wake.is_raised() {
            return false;
        }
        self.wake.clear()
    }

    /// `true` when work was announced since the last
    /// [`begin_look`](Self::begin_look).
    pub(crate) fn work_announced(&self) -> bool {
        self.wake.is_raised()
    }

    /// How long the poller may sleep at the end of a turn: `Some(ZERO)`
    /// (poll without sleeping) on a busy-polling loop, when work was
    /// announced since [`begin_look`](Self::begin_look), when a stop is
    /// requested or when `signals_ready`; otherwise until `next_deadline`
    /// (counted from `now`), or `None`, for ever, when no timer runs. The
    /// closures are called only when their answer matters.
    pub(crate) fn poll_timeout(
        &self,
        signals_ready: impl FnOnce() -> bool,
        next_deadline: impl FnOnce() -> Option<Instant>,
        now: impl FnOnce() -> Instant,
    ) -> Option<Duration> {
        if self.busy_poll || self.wake.is_raised() || self.stop.is_requested() || signals_ready() {
            Some(Duration::ZERO)
        } else {
            next_deadline().map(|when| when.saturating_duration_since(now()))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[derive(Default)]
    struct Count(Cell<usize>);

    impl PollWaker for Count {
        fn wake_poller(&self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn only_the_first_announcement_off_the_loop_thread_wakes_the_poller() {
        let c = Control::new(false);
        let w = Count::default();
        assert!(c.announce(&w, || false));
        assert!(!c.announce(&w, || false), "one wake-up per look");
        assert!(c.begin_look());
        assert!(
            !c.announce(&w, || true),
            "the loop thread never wakes itself"
        );
        let none = || None;
        assert_eq!(
            c.poll_timeout(|| false, none, Instant::now),
            Some(Duration::ZERO)
        );
        assert!(
            c.begin_look(),
            "the loop thread's announcement raised the flag"
        );
        assert_eq!(w.0.get(), 1);
    }

    #[test]
    fn the_loop_sleeps_only_with_nothing_to_do() {
        let c = Control::new(false);
        let w = Count::default();
        let t0 = Instant::now();
        let soon = || Some(t0 + Duration::from_millis(5));
        assert_eq!(c.poll_timeout(|| false, || None, || t0), None);
        assert_eq!(
            c.poll_timeout(|| false, soon, || t0),
            Some(Duration::from_millis(5))
        );
        assert_eq!(c.poll_timeout(|| true, soon, || t0), Some(Duration::ZERO));
        assert!(c.request_stop(&w, || false));
        c.begin_look();
        assert_eq!(
            c.poll_timeout(|| false, || None, || t0),
            Some(Duration::ZERO)
        );
        assert!(c.take_stop());
        assert!(!c.stopping());
        assert_eq!(c.poll_timeout(|| false, || None, || t0), None);
    }

    #[test]
    fn a_busy_polling_loop_never_sleeps_and_is_never_woken() {
        let c = Control::new(true);
        let w = Count::default();
        assert!(!c.announce(&w, || false));
        assert!(!c.request_stop(&w, || false));
        assert_eq!(w.0.get(), 0);
        c.begin_look();
        c.take_stop();
        let none = || None;
        assert_eq!(
            c.poll_timeout(|| false, none, Instant::now),
            Some(Duration::ZERO)
        );
    }
}
