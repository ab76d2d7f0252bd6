//! [`TimerQueue`]: the handler timers of [`Backend::set_timer`], sans-IO.
//!
//! [`Backend::set_timer`]: crate::Backend::set_timer

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// One-shot timers by deadline, for providers implementing
/// [`Backend::set_timer`](crate::Backend::set_timer): push a deadline and a
/// token, arm one loop timer for [`next_deadline`](Self::next_deadline),
/// and when it fires hand every [`pop_due`](Self::pop_due) token to
/// `Handler::on_timer`.
///
/// Timers with the same deadline come out in the order they were set.
///
/// ```
/// use std::time::Duration;
/// use netio_core::TimerQueue;
/// let mut q = TimerQueue::new();
/// q.push(Duration::from_millis(20), 2);
/// q.push(Duration::from_millis(10), 1);
/// assert_eq!(q.next_deadline(), Some(Duration::from_millis(10)));
/// assert_eq!(q.pop_due(Duration::from_millis(15)), Some(1));
/// assert_eq!(q.pop_due(Duration::from_millis(15)), None);
/// assert_eq!(q.pop_due(Duration::from_millis(20)), Some(2));
/// ```
#[derive(Debug, Default)]
pub struct TimerQueue {
    heap: BinaryHeap<Reverse<(Duration, u64, u64)>>,
    seq: u64,
}

impl TimerQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a timer for `token` due at `deadline`.
    pub fn push(&mut self, deadline: Duration, token: u64) {
        self.heap.push(Reverse((deadline, self.seq, token)));
        self.seq += 1;
    }

    /// The earliest deadline, if any timer is set.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse((d, _, _))| *d)
    }

    /// Removes and returns the token of the earliest timer due at `now` or
    /// before.
    pub fn pop_due(&mut self, now: Duration) -> Option<u64> {
        match self.heap.peek() {
            Some(Reverse((d, _, _))) if *d <= now => self.heap.pop().map(|Reverse((_, _, t))| t),
            _ => None,
        }
    }

    /// Number of timers set.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// `true` when no timer is set.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Removes every timer.
    pub fn clear(&mut self) {
        self.heap.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_deadlines_come_out_in_the_order_they_were_set() {
        let mut q = TimerQueue::new();
        let d = Duration::from_secs(1);
        for t in [5, 3, 9, 1] {
            q.push(d, t);
        }
        let got: Vec<_> = std::iter::from_fn(|| q.pop_due(d)).collect();
        assert_eq!(got, vec![5, 3, 9, 1]);
        assert!(q.is_empty());
    }

    #[test]
    fn nothing_is_due_before_its_deadline() {
        let mut q = TimerQueue::new();
        q.push(Duration::from_nanos(100), 7);
        assert_eq!(q.pop_due(Duration::from_nanos(99)), None);
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop_due(Duration::from_nanos(100)), Some(7));
        assert_eq!(q.next_deadline(), None);
    }
}
