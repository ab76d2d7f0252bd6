//! [`FreeList`]: a fixed set of slots, each holding a value while it is
//! free, taken and given back from any thread without a lock.
//!
//! All `unsafe` of the buffer pool is here. The free slots form a stack
//! (Treiber's): `head` holds the index of the top slot (plus one; 0 when
//! empty) and, in its upper half, a generation that every successful
//! change increments, so that a thread whose view of the top is stale
//! (the top was taken and given back meanwhile) fails its
//! compare-and-swap instead of linking a wrong successor (the ABA
//! problem; a stale view would need 2^32 changes in between to pass).
//! Each slot's `next` names the slot below it.
//!
//! Ownership of a slot's value: a thread that takes slot `i` (its
//! compare-and-swap removed `i` from the top) is the only one that may
//! touch `i`'s value until it gives it back; giving back writes the value
//! first and publishes the slot with a release compare-and-swap, which the
//! next taker's acquire compare-and-swap synchronises with.

use crate::sync::{AtomicU32, AtomicU64, AtomicUsize, Ordering, UnsafeCell};

struct Slot<T> {
    value: UnsafeCell<Option<T>>,
    /// The slot below this one in the stack (index plus one; 0: none).
    next: AtomicU32,
}

/// Slots `0..n`, each free (holding its value) or taken.
pub(crate) struct FreeList<T> {
    slots: Box<[Slot<T>]>,
    /// Generation (upper 32 bits) and top slot plus one (lower 32 bits).
    head: AtomicU64,
    /// Free slots; never below the number in the stack (it grows before a
    /// slot is pushed and shrinks after one is taken).
    free: AtomicUsize,
}

// SAFETY: a slot's value is only reached by the one thread that took the
// slot (see the module comment), so sharing the list between threads
// shares no `T` between them; values move between threads, hence `T: Send`.
unsafe impl<T: Send> Sync for FreeList<T> {}
// SAFETY: as above; the list owns its values.
unsafe impl<T: Send> Send for FreeList<T> {}

const INDEX: u64 = 0xffff_ffff;

impl<T> FreeList<T> {
    /// A list whose slot `i` is free and holds `values[i]`; taking gives
    /// the lowest indices first.
    ///
    /// # Panics
    /// With `u32::MAX` values or more.
    pub(crate) fn new(values: Vec<T>) -> Self {
        let n = values.len();
        assert!(n < u32::MAX as usize, "fewer than 2^32-1 slots");
        let slots: Box<[Slot<T>]> = values
            .into_iter()
            .enumerate()
            .map(|(i, v)| Slot {
                value: UnsafeCell::new(Some(v)),
                // Slot i sits on slot i + 1; the last on nothing.
                next: AtomicU32::new(if i + 1 < n { i as u32 + 2 } else { 0 }),
            })
            .collect();
        Self {
            slots,
            head: AtomicU64::new(if n > 0 { 1 } else { 0 }),
            free: AtomicUsize::new(n),
        }
    }

    /// Takes a free slot: its index and value, or `None` if none is free.
    pub(crate) fn take(&self) -> Option<(u32, T)> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let top = (head & INDEX) as u32;
            if top == 0 {
                return None;
            }
            let i = (top - 1) as usize;
            let next = self.slots[i].next.load(Ordering::Relaxed);
            let new = (((head >> 32).wrapping_add(1)) << 32) | u64::from(next);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.free.fetch_sub(1, Ordering::Relaxed);
                    // SAFETY: the swap removed slot `i` from the stack, so
                    // this thread alone owns it until `give_back`; the
                    // acquire orders this read after the write of whoever
                    // gave it back.
                    let value = self.slots[i]
                        .value
                        .with_mut(|p| unsafe { (*p).take() })
                        .expect("a free slot holds its value");
                    return Some((i as u32, value));
                }
                Err(h) => head = h,
            }
        }
    }

    /// Gives slot `index`, taken before, back with `value`.
    ///
    /// # Panics
    /// If `index` is out of range. Giving back a slot that was not taken is
    /// a bug of the caller that this module cannot see: the caller must
    /// pair each `give_back` with one `take` (the buffer pool does: a
    /// `NetworkBuffer` gives back its own index once).
    pub(crate) fn give_back(&self, index: u32, value: T) {
        let i = index as usize;
        let slot = &self.slots[i];
        // SAFETY: the caller took slot `i` and has not given it back, so
        // this thread alone owns it; the release swap below publishes the
        // write to the next taker.
        slot.value.with_mut(|p| unsafe { *p = Some(value) });
        self.free.fetch_add(1, Ordering::Relaxed);
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            slot.next.store((head & INDEX) as u32, Ordering::Relaxed);
            let new = (((head >> 32).wrapping_add(1)) << 32) | (u64::from(index) + 1);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Takes up to `max` free slots with one swap, calling `f` with the
    /// index and value of each; returns how many it took.
    pub(crate) fn take_many(&self, max: usize, mut f: impl FnMut(u32, T)) -> usize {
        if max == 0 {
            return 0;
        }
        let mut head = self.head.load(Ordering::Acquire);
        let (top, n) = loop {
            let top = (head & INDEX) as u32;
            if top == 0 {
                return 0;
            }
            // Walk down up to `max` slots. While `head` keeps its
            // generation these links cannot change: a slot below the top
            // is only relinked after being taken, which changes `head`.
            let mut last = (top - 1) as usize;
            let mut n = 1;
            while n < max {
                let next = self.slots[last].next.load(Ordering::Relaxed);
                if next == 0 {
                    break;
                }
                last = (next - 1) as usize;
                n += 1;
            }
            let after = self.slots[last].next.load(Ordering::Relaxed);
            let new = (((head >> 32).wrapping_add(1)) << 32) | u64::from(after);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break (top, n),
                Err(h) => head = h,
            }
        };
        self.free.fetch_sub(n, Ordering::Relaxed);
        let mut i = (top - 1) as usize;
        for k in 0..n {
            // SAFETY: the swap removed these `n` slots (the chain from the
            // old top) from the stack, so this thread alone owns them; the
            // acquire orders the reads after the writes of whoever gave
            // them back. Their links are ours to read until given back.
            let value = self.slots[i]
                .value
                .with_mut(|p| unsafe { (*p).take() })
                .expect("a free slot holds its value");
            let next = self.slots[i].next.load(Ordering::Relaxed);
            f(i as u32, value);
            if k + 1 < n {
                i = (next - 1) as usize;
            }
        }
        n
    }

    /// Gives back slots taken before, each with its value, with one swap;
    /// returns how many. The same pairing rule as
    /// [`give_back`](Self::give_back).
    pub(crate) fn give_back_many(&self, items: impl IntoIterator<Item = (u32, T)>) -> usize {
        let mut first: Option<u32> = None;
        let mut last: Option<u32> = None;
        let mut n = 0;
        for (index, value) in items {
            // SAFETY: the caller took slot `index` and has not given it
            // back, so this thread alone owns it until the release swap
            // below publishes it.
            self.slots[index as usize]
                .value
                .with_mut(|p| unsafe { *p = Some(value) });
            match last {
                Some(prev) => self.slots[prev as usize]
                    .next
                    .store(index + 1, Ordering::Relaxed),
                None => first = Some(index),
            }
            last = Some(index);
            n += 1;
        }
        let (Some(first), Some(last)) = (first, last) else {
            return 0;
        };
        self.free.fetch_add(n, Ordering::Relaxed);
        let tail = &self.slots[last as usize].next;
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            tail.store((head & INDEX) as u32, Ordering::Relaxed);
            let new = (((head >> 32).wrapping_add(1)) << 32) | (u64::from(first) + 1);
            match self
                .head
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return n,
                Err(h) => head = h,
            }
        }
    }

    /// Free slots now (a snapshot; at least the number in the stack).
    pub(crate) fn free(&self) -> usize {
        self.free.load(Ordering::Relaxed)
    }

    /// Number of slots.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn takes_lowest_first_and_last_given_back_first() {
        let l = FreeList::new(vec!['a', 'b', 'c']);
        assert_eq!(l.take(), Some((0, 'a')));
        assert_eq!(l.take(), Some((1, 'b')));
        assert_eq!(l.free(), 1);
        l.give_back(0, 'x');
        assert_eq!(l.take(), Some((0, 'x')));
        assert_eq!(l.take(), Some((2, 'c')));
        assert_eq!(l.take(), None);
        assert_eq!((l.free(), l.len()), (0, 3));
        l.give_back(2, 'c');
        l.give_back(1, 'b');
        assert_eq!(l.take(), Some((1, 'b')));
    }

    #[test]
    fn take_many_and_give_back_many_move_chains_in_stack_order() {
        let l = FreeList::new(vec![10, 11, 12, 13, 14]);
        let mut got = Vec::new();
        assert_eq!(l.take_many(3, |i, v| got.push((i, v))), 3);
        assert_eq!(got, vec![(0, 10), (1, 11), (2, 12)]);
        assert_eq!(l.free(), 2);
        // Given back as a chain: the first of it is taken first.
        assert_eq!(l.give_back_many([(2, 22), (0, 20)]), 2);
        got.clear();
        assert_eq!(l.take_many(10, |i, v| got.push((i, v))), 4);
        assert_eq!(got, vec![(2, 22), (0, 20), (3, 13), (4, 14)]);
        assert_eq!(l.take_many(10, |_, _| panic!("nothing is free")), 0);
        assert_eq!(l.give_back_many(Vec::new()), 0);
        assert_eq!(l.give_back_many([(1, 11)]), 1);
        assert_eq!(l.take(), Some((1, 11)));
        assert_eq!(l.take_many(0, |_, _| ()), 0);
    }

    #[test]
    fn an_empty_list_has_nothing_to_take() {
        let l: FreeList<u8> = FreeList::new(Vec::new());
        assert_eq!(l.take(), None);
        assert_eq!(l.free(), 0);
    }

    #[test]
    fn threads_taking_and_giving_back_never_share_a_slot() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        const N: usize = 4;
        let l = Arc::new(FreeList::new((0..N).map(|i| i * 10).collect()));
        let held: Arc<Vec<AtomicBool>> = Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (l, held) = (l.clone(), held.clone());
                std::thread::spawn(move || {
                    let mut batch = Vec::new();
                    let rounds = if cfg!(miri) { 100 } else { 20_000 };
                    for round in 0..rounds {
                        if round % 2 == 0 {
                            if let Some((i, v)) = l.take() {
                                batch.push((i, v));
                            }
                        } else {
                            l.take_many(2, |i, v| batch.push((i, v)));
                        }
                        for &(i, v) in &batch {
                            assert_eq!(v, i as usize * 10, "the slot's own value");
                            assert!(
                                !held[i as usize].swap(true, Ordering::SeqCst),
                                "slot {i} twice"
                            );
                        }
                        for &(i, _) in &batch {
                            held[i as usize].store(false, Ordering::SeqCst);
                        }
                        if round % 3 == 0 {
                            l.give_back_many(batch.drain(..));
                        } else {
                            for (i, v) in batch.drain(..) {
                                l.give_back(i, v);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(l.free(), N);
        let mut all: Vec<u32> = (0..N).map(|_| l.take().unwrap().0).collect();
        all.sort();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;

    /// Two threads take and give back concurrently (each twice) while the
    /// main thread takes one: no slot is held twice, every value returns.
    #[test]
    fn concurrent_take_and_give_back_conserve_slots() {
        loom::model(|| {
            let l = Arc::new(FreeList::new(vec![0u32, 1]));
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    loom::thread::spawn(move || {
                        if let Some((i, v)) = l.take() {
                            assert_eq!(i, v);
                            l.give_back(i, v);
                        }
                        let mut got = Vec::new();
                        l.take_many(2, |i, v| got.push((i, v)));
                        for &(i, v) in &got {
                            assert_eq!(i, v);
                        }
                        l.give_back_many(got);
                    })
                })
                .collect();
            let mine = l.take();
            if let Some((i, v)) = mine {
                assert_eq!(i, v);
                l.give_back(i, v);
            }
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(l.free(), 2);
            let mut all = [l.take().unwrap().0, l.take().unwrap().0];
            all.sort();
            assert_eq!(all, [0, 1]);
            assert!(l.take().is_none());
        });
    }
}
