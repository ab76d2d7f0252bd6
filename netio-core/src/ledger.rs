//! [`SendLedger`]: the sans-IO bookkeeping of one connection's sends in
//! flight, shared by providers.
//!
//! The contract says every accepted send ends exactly once, its key either
//! completed (`on_sends_completed`, in send order) or cancelled (in the
//! `cancelled_keys` of `on_connection_closed`), and that at most
//! `send_queue_depth` copy and zero-copy sends are in flight per
//! connection, each holding its slot until its completion is reported. A
//! provider records each send here when it accepts it, marks it done when
//! its transport says so (in any order), and drains what can be reported:
//!
//! ```
//! use netio_core::ledger::SendLedger;
//!
//! // Depth 2; the payload is whatever must live until the send ends
//! // (a buffer, a bounce copy, a lent region guard).
//! let mut l: SendLedger<&str> = SendLedger::new(2);
//! let a = l.accept(10, true, "a").unwrap();
//! let b = l.accept(11, true, "b").unwrap();
//! assert!(l.accept(12, true, "c").is_err(), "the depth is reached");
//! l.mark_done(b);
//! assert!(l.drain_completed().is_empty(), "11 waits for 10");
//! l.mark_done(a);
//! let done: Vec<u64> = l.drain_completed().into_iter().map(|(k, _)| k).collect();
//! assert_eq!(done, [10, 11]);
//! assert!(l.accept(12, true, "c").is_ok(), "slots are free once drained");
//! ```

use std::collections::VecDeque;

/// Identifies one accepted send of a [`SendLedger`] (increasing per
/// ledger, never reused).
pub type SendSeq = u64;

/// `SendLedger::accept` refused a send: the connection already has
/// `depth` counted sends in flight (`SendError::NoResources`). The payload
/// comes back.
#[derive(Debug)]
pub struct LedgerFull<T>(pub T);

struct Entry<T> {
    seq: SendSeq,
    key: u64,
    counted: bool,
    done: bool,
    payload: T,
}

/// The sends of one connection that were accepted and not yet reported,
/// in send order, each with the caller's key and a payload the provider
/// keeps alive until the send ends.
///
/// - [`accept`](Self::accept) records a send if a slot is free (sends
///   with `counted = false`, such as buffered sends bounded by their pool,
///   take no slot);
/// - [`mark_done`](Self::mark_done) records a transport completion, in
///   any order;
/// - [`drain_completed`](Self::drain_completed) removes the longest prefix
///   of done sends: report their keys in one `on_sends_completed` batch
///   (their slots are free from then on);
/// - [`cancel_all`](Self::cancel_all) at close removes everything left,
///   completed prefix first, so a provider can report
///   `(completed, cancelled)` keys and every send ends exactly once.
pub struct SendLedger<T> {
    depth: usize,
    counted: usize,
    next_seq: SendSeq,
    entries: VecDeque<Entry<T>>,
}

/// What [`SendLedger::cancel_all`] returns: the done prefix (still to be
/// reported as completed) and the rest (to be reported as cancelled), each
/// as `(key, payload)` in send order.
pub struct Ended<T> {
    /// Sends that completed but were not yet reported.
    pub completed: Vec<(u64, T)>,
    /// Sends that did not complete (or completed after an earlier one that
    /// did not): cancelled.
    pub cancelled: Vec<(u64, T)>,
}

impl<T> SendLedger<T> {
    /// An empty ledger allowing `depth` counted sends in flight.
    pub fn new(depth: usize) -> Self {
        Self {
            depth,
            counted: 0,
            next_seq: 0,
            entries: VecDeque::new(),
        }
    }

    /// Records a send with `key`. `counted` sends take one of the `depth`
    /// slots; when none is free the send is refused and `payload` handed
    /// back.
    pub fn accept(
        &mut self,
        key: u64,
        counted: bool,
        payload: T,
    ) -> Result<SendSeq, LedgerFull<T>> {
        if counted && self.counted >= self.depth {
            return Err(LedgerFull(payload));
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        if counted {
            self.counted += 1;
        }
        self.entries.push_back(Entry {
            seq,
            key,
            counted,
            done: false,
            payload,
        });
        Ok(seq)
    }

    /// Records a send that the transport already completed (an injected
    /// send, done as soon as it was handed over): [`accept`](Self::accept)
    /// then [`mark_done`](Self::mark_done) in one step, with no search.
    pub fn accept_done(
        &mut self,
        key: u64,
        counted: bool,
        payload: T,
    ) -> Result<SendSeq, LedgerFull<T>> {
        let seq = self.accept(key, counted, payload)?;
        if let Some(e) = self.entries.back_mut() {
            e.done = true;
        }
        Ok(seq)
    }

    /// `true` if a counted send would be accepted now.
    pub fn has_room(&self) -> bool {
        self.counted < self.depth
    }

    /// Marks send `seq` as completed by the transport. Returns `false` if
    /// the ledger does not hold it (already ended, or never accepted).
    pub fn mark_done(&mut self, seq: SendSeq) -> bool {
        // Entries are sorted by seq: the oldest first (completions mostly
        // come in send order), else a binary search.
        let i = match self.entries.front() {
            Some(e) if e.seq == seq => 0,
            _ => match self.entries.binary_search_by_key(&seq, |e| e.seq) {
                Ok(i) => i,
                Err(_) => return false,
            },
        };
        let e = &mut self.entries[i];
        let fresh = !e.done;
        e.done = true;
        fresh
    }

    /// Removes the sends that can be reported as completed now: the done
    /// ones up to the first not done, in send order. Their slots are free
    /// once this returns.
    pub fn drain_completed(&mut self) -> Vec<(u64, T)> {
        let mut out = Vec::new();
        self.drain_completed_each(|key, payload| out.push((key, payload)));
        out
    }

    /// Like [`drain_completed`](Self::drain_completed), handing each
    /// removed send's key and payload to `f` in send order instead of
    /// collecting them.
    pub fn drain_completed_each(&mut self, mut f: impl FnMut(u64, T)) {
        while self.entries.front().is_some_and(|e| e.done) {
            let e = self.entries.pop_front().expect("front exists");
            if e.counted {
                self.counted -= 1;
            }
            f(e.key, e.payload);
        }
    }

    /// Ends every send: the completed prefix, then the rest as cancelled.
    /// The ledger is empty afterwards.
    pub fn cancel_all(&mut self) -> Ended<T> {
        let completed = self.drain_completed();
        let cancelled = self.entries.drain(..).map(|e| (e.key, e.payload)).collect();
        self.counted = 0;
        Ended {
            completed,
            cancelled,
        }
    }

    /// Number of sends accepted and not yet drained.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// `true` if no send is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number of slots taken (counted sends not yet drained).
    pub fn slots_in_use(&self) -> usize {
        self.counted
    }
}

impl<T> std::fmt::Debug for SendLedger<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendLedger")
            .field("depth", &self.depth)
            .field("in_flight", &self.entries.len())
            .field("slots_in_use", &self.counted)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<T>(v: Vec<(u64, T)>) -> Vec<u64> {
        v.into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn completions_are_reported_in_send_order_whatever_order_they_come_in() {
        let mut l = SendLedger::new(8);
        let s: Vec<_> = (0..4).map(|k| l.accept(k, true, ()).unwrap()).collect();
        assert!(l.mark_done(s[2]));
        assert!(l.mark_done(s[1]));
        assert!(keys(l.drain_completed()).is_empty());
        assert!(l.mark_done(s[0]));
        assert_eq!(keys(l.drain_completed()), [0, 1, 2]);
        assert!(l.mark_done(s[3]));
        assert_eq!(keys(l.drain_completed()), [3]);
        assert!(l.is_empty());
    }

    #[test]
    fn depth_counts_only_counted_sends_and_frees_slots_when_drained() {
        let mut l = SendLedger::new(1);
        let a = l.accept(1, true, ()).unwrap();
        assert!(!l.has_room());
        assert!(l.accept(2, true, ()).is_err());
        let b = l
            .accept(3, false, ())
            .expect("uncounted sends take no slot");
        l.mark_done(a);
        assert!(!l.has_room(), "the slot is held until the report");
        assert_eq!(keys(l.drain_completed()), [1]);
        assert!(l.has_room());
        assert_eq!(l.slots_in_use(), 0);
        l.mark_done(b);
        assert_eq!(keys(l.drain_completed()), [3]);
    }

    #[test]
    fn a_send_accepted_done_completes_in_order_behind_earlier_sends() {
        let mut l = SendLedger::new(2);
        let a = l.accept(1, true, ()).unwrap();
        let b = l.accept_done(2, true, ()).unwrap();
        assert!(b > a);
        assert!(!l.mark_done(b), "already done");
        assert!(keys(l.drain_completed()).is_empty(), "2 waits for 1");
        assert!(l.accept_done(3, true, ()).is_err(), "it takes a slot");
        l.mark_done(a);
        assert_eq!(keys(l.drain_completed()), [1, 2]);
        l.accept_done(4, false, ()).unwrap();
        assert_eq!(keys(l.drain_completed()), [4]);
        assert!(l.is_empty());
    }

    #[test]
    fn a_refused_send_gives_its_payload_back() {
        let mut l = SendLedger::new(0);
        let LedgerFull(p) = l.accept(1, true, "payload").unwrap_err();
        assert_eq!(p, "payload");
        assert!(l.is_empty());
    }

    #[test]
    fn cancel_all_ends_every_send_exactly_once() {
        let mut l = SendLedger::new(8);
        let s: Vec<_> = (0..5)
            .map(|k| l.accept(k, k % 2 == 0, k).unwrap())
            .collect();
        l.mark_done(s[0]);
        l.mark_done(s[1]);
        l.mark_done(s[3]);
        let ended = l.cancel_all();
        assert_eq!(keys(ended.completed), [0, 1]);
        assert_eq!(keys(ended.cancelled), [2, 3, 4]);
        assert!(l.is_empty());
        assert!(l.has_room());
        assert!(!l.mark_done(s[4]), "an ended send is unknown");
    }

    #[test]
    fn marking_twice_or_unknown_sequences_is_harmless() {
        let mut l = SendLedger::new(2);
        let a = l.accept(7, true, ()).unwrap();
        assert!(l.mark_done(a));
        assert!(!l.mark_done(a));
        assert!(!l.mark_done(a + 100));
        assert_eq!(keys(l.drain_completed()), [7]);
        assert!(keys(l.drain_completed()).is_empty());
    }

    #[test]
    fn payloads_are_dropped_when_drained_or_cancelled() {
        use std::rc::Rc;
        let token = Rc::new(());
        let mut l = SendLedger::new(4);
        let a = l.accept(1, true, Rc::clone(&token)).unwrap();
        l.accept(2, true, Rc::clone(&token)).unwrap();
        assert_eq!(Rc::strong_count(&token), 3);
        l.mark_done(a);
        drop(l.drain_completed());
        assert_eq!(Rc::strong_count(&token), 2);
        drop(l.cancel_all());
        assert_eq!(Rc::strong_count(&token), 1);
    }
}
