//! The bytes of a connection's copy sends, one frame after the other in a
//! ring: a copy send is a `memcpy` into it (no allocation once the ring is
//! big enough), and many queued messages go to the socket as one or two
//! slices of a gather write instead of one slice each. [`CopyQueue`] keeps
//! each frame's key with the position where it ends, so the bytes a write
//! took tell which sends completed.

use std::collections::VecDeque;

use netio_core::NetworkBuffer;

/// Smallest ring allocated.
const MIN_CAPACITY: usize = 4096;

/// A growable ring of bytes: appended at the tail, consumed at the head.
#[derive(Default)]
pub(crate) struct ByteRing {
    buf: Vec<u8>,
    /// Index of the first byte.
    head: usize,
    /// Bytes held.
    len: usize,
}

impl ByteRing {
    /// Bytes held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated.
    pub(crate) fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Makes room for `n` more bytes.
    #[inline]
    pub(crate) fn reserve(&mut self, n: usize) {
        if self.buf.len() - self.len < n {
            self.grow(self.len + n);
        }
    }

    /// Appends `part`, growing the ring when it lacks room.
    #[cfg(test)]
    pub(crate) fn push(&mut self, part: &[u8]) {
        self.reserve(part.len());
        self.put(part);
    }

    /// Appends `part`, for which [`reserve`](Self::reserve) made room.
    #[inline]
    fn put(&mut self, part: &[u8]) {
        let cap = self.buf.len();
        debug_assert!(cap - self.len >= part.len());
        let mut tail = self.head + self.len;
        if tail >= cap {
            tail -= cap;
        }
        self.len += part.len();
        if cap - tail >= part.len() {
            self.buf[tail..tail + part.len()].copy_from_slice(part);
        } else {
            let (a, b) = part.split_at(cap - tail);
            self.buf[tail..].copy_from_slice(a);
            self.buf[..b.len()].copy_from_slice(b);
        }
    }

    /// Reallocates to hold at least `need` bytes, the content moved to the
    /// front.
    /// Appends `frame`, `header` and `data`, `n` bytes in all, for which
    /// [`reserve`](Self::reserve) made room: into one run of the buffer
    /// when they fit before its end (its end found once, not per part).
    #[inline(always)]
    fn put_parts(&mut self, n: usize, frame: &[u8], header: &[u8], data: &[&[u8]]) {
        let cap = self.buf.len();
        debug_assert!(cap - self.len >= n);
        let mut tail = self.head + self.len;
        if tail >= cap {
            tail -= cap;
        }
        if cap - tail < n {
            self.put(frame);
            self.put(header);
            for d in data {
                self.put(d);
            }
            return;
        }
        let (run, _) = self.buf[tail..].split_at_mut(n);
        let (to, mut rest) = run.split_at_mut(frame.len());
        to.copy_from_slice(frame);
        if !header.is_empty() {
            let (to, after) = rest.split_at_mut(header.len());
            to.copy_from_slice(header);
            rest = after;
        }
        for d in data {
            let (to, after) = rest.split_at_mut(d.len());
            to.copy_from_slice(d);
            rest = after;
        }
        debug_assert!(rest.is_empty());
        self.len += n;
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, need: usize) {
        let cap = need.max(self.buf.len() * 2).max(MIN_CAPACITY);
        let mut buf = vec![0u8; cap];
        let (a, b) = self.slices(0, self.len);
        buf[..a.len()].copy_from_slice(a);
        buf[a.len()..a.len() + b.len()].copy_from_slice(b);
        self.buf = buf;
        self.head = 0;
    }

    /// The `n` bytes from `skip` bytes past the head, as at most two slices
    /// (the second is empty unless the range wraps around the end).
    pub(crate) fn slices(&self, skip: usize, n: usize) -> (&[u8], &[u8]) {
        assert!(skip + n <= self.len, "range past the ring's content");
        if n == 0 {
            return (&[], &[]);
        }
        let cap = self.buf.len();
        let mut start = self.head + skip;
        if start >= cap {
            start -= cap;
        }
        let first = (cap - start).min(n);
        (&self.buf[start..start + first], &self.buf[..n - first])
    }

    /// Drops the first `n` bytes.
    pub(crate) fn consume(&mut self, n: usize) {
        assert!(n <= self.len, "consuming more than the ring holds");
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        } else {
            self.head += n;
            if self.head >= self.buf.len() {
                self.head -= self.buf.len();
            }
        }
    }

    /// Drops every byte and frees the ring if it is larger than `keep`.
    pub(crate) fn clear(&mut self, keep: usize) {
        self.head = 0;
        self.len = 0;
        if self.buf.len() > keep {
            self.buf = Vec::new();
        }
    }
}

/// What [`CopyQueue::consume`] hands over, in send order.
pub(crate) trait Completed {
    /// Frames written whole that were not buffered sends: their keys (the
    /// second of each pair).
    fn keys(&mut self, frames: &[(u64, u64)]);
    /// A buffered send's frame written whole: its key and pool buffer.
    fn buffered(&mut self, key: u64, buffer: NetworkBuffer);
}

/// Copied frames not yet completed: their unwritten bytes in a
/// [`ByteRing`], their keys with the position (in bytes of copied frames
/// since the connection began) where each ends. Small buffered sends are
/// copied in too (their bytes leave with their neighbours in one slice);
/// their pool buffers are held here until they complete.
///
/// A write that completes many frames hands them over as one or two
/// slices, not one by one.
#[derive(Default)]
pub(crate) struct CopyQueue {
    ring: ByteRing,
    /// Each frame not completed, in send order: where it ends and its key.
    frames: VecDeque<(u64, u64)>,
    /// Pool buffers of the buffered frames among them, in order, each
    /// with its frame's number (frames are numbered from 0 in send order).
    buffers: VecDeque<(u64, NetworkBuffer)>,
    /// Frames completed (or ended) so far: the number of the first in
    /// `frames`.
    popped: u64,
    /// Bytes of copied frames queued (including bytes written before they
    /// were queued).
    pushed: u64,
    /// Bytes of copied frames written.
    written: u64,
    /// End of the last completed frame.
    done: u64,
}

/// The elements `range` of `d` as at most two slices.
fn deque_range<T>(d: &VecDeque<T>, range: std::ops::Range<usize>) -> (&[T], &[T]) {
    let (a, b) = d.as_slices();
    if range.end <= a.len() {
        (&a[range], &[])
    } else if range.start >= a.len() {
        (&b[range.start - a.len()..range.end - a.len()], &[])
    } else {
        (&a[range.start..], &b[..range.end - a.len()])
    }
}

impl CopyQueue {
    /// The ring of unwritten bytes.
    pub(crate) fn ring(&self) -> &ByteRing {
        &self.ring
    }

    /// Bytes of copied frames written so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Queues a frame of `frame_len` bytes: `frame` (its frame header),
    /// `header`, then `data`; its first `skip` bytes were already written
    /// (only possible when nothing else is queued).
    #[inline(always)]
    pub(crate) fn push(
        &mut self,
        frame: &[u8],
        header: &[u8],
        data: &[&[u8]],
        skip: usize,
        frame_len: usize,
        key: u64,
    ) {
        debug_assert!(skip == 0 || self.frames.is_empty());
        if skip == 0 {
            self.ring.reserve(frame_len);
            self.ring.put_parts(frame_len, frame, header, data);
            self.pushed += frame_len as u64;
            self.frames.push_back((self.pushed, key));
        } else {
            self.push_rest(frame, header, data, skip, frame_len, key);
        }
    }

    /// [`push`](Self::push) of a frame whose first `skip` bytes (at least
    /// one) were written.
    #[inline(never)]
    fn push_rest(
        &mut self,
        frame: &[u8],
        header: &[u8],
        data: &[&[u8]],
        skip: usize,
        frame_len: usize,
        key: u64,
    ) {
        self.ring.reserve(frame_len - skip);
        let mut skip_left = skip;
        for part in [frame, header].into_iter().chain(data.iter().copied()) {
            if skip_left >= part.len() {
                skip_left -= part.len();
            } else {
                self.ring.put(&part[skip_left..]);
                skip_left = 0;
            }
        }
        self.pushed += frame_len as u64;
        self.written += skip as u64;
        self.frames.push_back((self.pushed, key));
    }

    /// Queues a buffered send's frame (`frame` header, then the buffer's
    /// bytes), holding `buffer` until the frame completes.
    pub(crate) fn push_buffer(&mut self, frame: &[u8], buffer: NetworkBuffer, key: u64) {
        let frame_len = frame.len() + buffer.len();
        self.ring.reserve(frame_len);
        self.ring.put(frame);
        self.ring.put(buffer.as_slice());
        self.pushed += frame_len as u64;
        let number = self.popped + self.frames.len() as u64;
        self.frames.push_back((self.pushed, key));
        self.buffers.push_back((number, buffer));
    }

    /// Takes the first frame: its end, key and pool buffer if it has one.
    fn pop(&mut self) -> Option<(u64, u64, Option<NetworkBuffer>)> {
        let (end, key) = self.frames.pop_front()?;
        let b = match self.buffers.front() {
            Some(&(n, _)) if n == self.popped => self.buffers.pop_front().map(|(_, b)| b),
            _ => None,
        };
        self.popped += 1;
        Some((end, key, b))
    }

    /// `n` more bytes were written: hands every frame now written whole to
    /// `done`, in order (the keys of a run of frames without pool buffers
    /// in one or two slices).
    pub(crate) fn consume(&mut self, n: usize, done: &mut impl Completed) {
        self.ring.consume(n);
        self.written += n as u64;
        let written = self.written;
        // How many frames are written whole: all of them in the common
        // case, else found by bisection (the ends ascend).
        let k = match self.frames.back() {
            None => return,
            Some(&(last, _)) if last <= written => self.frames.len(),
            Some(_) => self.frames.partition_point(|&(end, _)| end <= written),
        };
        if k == 0 {
            return;
        }
        self.done = self.frames[k - 1].0;
        let mut from = 0;
        while let Some(&(number, _)) = self.buffers.front() {
            let at = (number - self.popped) as usize;
            if at >= k {
                break;
            }
            self.hand_keys(from..at, done);
            let (_, b) = self.buffers.pop_front().expect("looked at");
            done.buffered(self.frames[at].1, b);
            from = at + 1;
        }
        self.hand_keys(from..k, done);
        self.frames.drain(..k);
        self.popped += k as u64;
        if self.frames.is_empty() && self.ring.capacity() > SPARE_BYTES {
            self.ring.clear(SPARE_BYTES);
        }
    }

    /// Hands the keys `range` of `keys` to `done`.
    #[inline]
    fn hand_keys(&self, range: std::ops::Range<usize>, done: &mut impl Completed) {
        if range.is_empty() {
            return;
        }
        let (a, b) = deque_range(&self.frames, range);
        done.keys(a);
        if !b.is_empty() {
            done.keys(b);
        }
    }

    /// Ends the frames up to position `until` (the end of a run of them in
    /// the send queue): a frame already started is finished — its key goes
    /// to `completed`, its unwritten bytes to `rest` — and the others'
    /// keys to `cancelled`; pool buffers go to `buffers`.
    pub(crate) fn end_until(
        &mut self,
        until: u64,
        completed: &mut Option<u64>,
        rest: &mut Vec<u8>,
        cancelled: &mut Vec<u64>,
        buffers: &mut Vec<NetworkBuffer>,
    ) {
        while self.frames.front().is_some_and(|&(end, _)| end <= until) {
            let Some((end, key, b)) = self.pop() else {
                break;
            };
            let unwritten = (end - self.written) as usize;
            if self.written > self.done {
                // Started: finish it from the ring.
                let (x, y) = self.ring.slices(0, unwritten);
                rest.extend_from_slice(x);
                rest.extend_from_slice(y);
                *completed = Some(key);
            } else {
                cancelled.push(key);
            }
            buffers.extend(b);
            self.ring.consume(unwritten);
            self.done = end;
            self.written = end;
        }
    }

    /// Forgets everything (the connection ended); frees a large ring.
    pub(crate) fn clear(&mut self) {
        self.ring.clear(SPARE_BYTES);
        self.popped += self.frames.len() as u64;
        self.frames.clear();
        self.buffers.clear();
        self.written = self.pushed;
        self.done = self.pushed;
    }
}

/// Bytes of a connection's copy-send ring kept allocated once it empties:
/// large copies (a MiB) reuse their memory instead of faulting in fresh
/// pages for every message, and an idle connection holds no more.
const SPARE_BYTES: usize = 4 * 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// A [`Completed`] that hands each frame to a closure.
    struct Each<F>(F);

    impl<F: FnMut(u64, Option<NetworkBuffer>)> Completed for Each<F> {
        fn keys(&mut self, frames: &[(u64, u64)]) {
            for &(_, k) in frames {
                (self.0)(k, None);
            }
        }
        fn buffered(&mut self, key: u64, buffer: NetworkBuffer) {
            (self.0)(key, Some(buffer));
        }
    }

    fn content(r: &ByteRing) -> Vec<u8> {
        let (a, b) = r.slices(0, r.len());
        [a, b].concat()
    }

    #[test]
    fn pushed_parts_come_back_in_order_across_the_wrap() {
        let mut r = ByteRing::default();
        r.push(&[1u8; 3000]);
        assert_eq!(r.capacity(), MIN_CAPACITY);
        r.consume(2500);
        // 500 held from 2500; 2000 more wrap past the end of 4096.
        let part: Vec<u8> = (0..2000u32).map(|i| i as u8).collect();
        r.push(&part[..1000]);
        r.push(&part[1000..]);
        assert_eq!(r.capacity(), MIN_CAPACITY, "room was there: no growth");
        let (a, b) = r.slices(500, 2000);
        assert!(!b.is_empty(), "the range wraps");
        assert_eq!([a, b].concat(), part);
        let all = content(&r);
        assert_eq!(&all[..500], &[1u8; 500][..]);
    }

    #[test]
    fn growing_keeps_the_content_and_its_order() {
        let mut r = ByteRing::default();
        r.push(b"abcd");
        r.consume(2);
        for i in 0..3000u32 {
            r.push(&i.to_le_bytes());
        }
        let all = content(&r);
        assert_eq!(&all[..2], b"cd");
        for (i, w) in all[2..].chunks(4).enumerate() {
            assert_eq!(w, (i as u32).to_le_bytes());
        }
        assert!(r.capacity() >= r.len());
    }

    #[test]
    fn an_emptied_ring_starts_over_at_the_front_and_clear_frees_a_large_one() {
        let mut r = ByteRing::default();
        r.push(&[7u8; 100]);
        r.consume(100);
        r.push(&[8u8; 4000]);
        assert_eq!(r.slices(0, 4000).1.len(), 0, "no wrap after emptying");
        r.push(&[9u8; 10_000]);
        r.clear(1 << 20);
        assert_eq!((r.len(), r.capacity() > 0), (0, true), "small ring kept");
        r.push(&vec![1u8; 2 << 20]);
        r.clear(1 << 20);
        assert_eq!(r.capacity(), 0, "a ring over the budget is freed");
    }

    #[test]
    #[should_panic(expected = "consuming more")]
    fn consuming_more_than_held_panics() {
        let mut r = ByteRing::default();
        r.push(b"ab");
        r.consume(3);
    }

    #[test]
    fn a_frame_completes_when_its_last_byte_is_written_in_order() {
        let mut q = CopyQueue::default();
        q.push(b"ab", b"c", &[b"de"], 0, 5, 1);
        q.push(b"fgh", &[], &[], 0, 3, 2);
        q.push(b"i", &[], &[b"", b"j"], 0, 2, 3);
        let mut done = Vec::new();
        q.consume(4, &mut Each(|k, _| done.push(k)));
        assert!(done.is_empty(), "4 of 5 bytes: nothing complete");
        q.consume(4, &mut Each(|k, _| done.push(k)));
        assert_eq!(done, vec![1, 2], "frames 1 and 2 written whole");
        assert_eq!(q.ring().slices(0, 2), (&b"ij"[..], &b""[..]));
        q.consume(2, &mut Each(|k, _| done.push(k)));
        assert_eq!(done, vec![1, 2, 3]);
    }

    #[test]
    fn queued_frames_keep_their_parts_in_order_before_and_across_the_wrap() {
        let mut q = CopyQueue::default();
        q.push(&[0xAA; 2500], &[], &[], 0, 2500, 0);
        q.consume(2400, &mut Each(|_, _| {}));
        q.push(&[0xBB; 1000], &[], &[], 0, 1000, 1);
        // The ring's content runs from 2400 to 3500 of 4096: frames of 100
        // bytes fit before the end until the 6th, which wraps; an empty
        // header and an empty data part add nothing.
        let mut expected = [vec![0xAA; 100], vec![0xBB; 1000]].concat();
        for i in 0..8u8 {
            let frame = [i; 8];
            let header = vec![i ^ 0x40; usize::from(i % 3) * 4];
            let a = vec![i ^ 0x80; 30];
            let b = vec![i ^ 0xC0; 62 - header.len()];
            q.push(&frame, &header, &[&a, &[], &b], 0, 100, u64::from(i) + 2);
            expected.extend([&frame[..], &header, &a, &b].concat());
        }
        assert_eq!(q.ring().capacity(), MIN_CAPACITY, "no growth");
        let (x, y) = q.ring().slices(0, 1900);
        assert!(!y.is_empty(), "the content wraps");
        assert_eq!([x, y].concat(), expected);
        let mut done = Vec::new();
        q.consume(1900, &mut Each(|k, _| done.push(k)));
        assert_eq!(done, (0..=9).collect::<Vec<u64>>());
    }

    #[test]
    fn a_frame_written_in_part_before_it_was_queued_keeps_only_its_rest() {
        let mut q = CopyQueue::default();
        q.push(b"hel", b"lo", &[b" world"], 7, 11, 9);
        assert_eq!(q.ring().slices(0, 4).0, b"orld");
        let mut done = Vec::new();
        q.consume(4, &mut Each(|k, _| done.push(k)));
        assert_eq!(done, vec![9]);
        assert_eq!(q.written(), 11);
    }

    #[test]
    fn ending_finishes_the_started_frame_and_cancels_the_rest() {
        let mut q = CopyQueue::default();
        q.push(b"abcd", &[], &[], 0, 4, 1);
        q.push(b"efgh", &[], &[], 0, 4, 2);
        q.push(b"ijkl", &[], &[], 0, 4, 3);
        q.push(b"mnop", &[], &[], 0, 4, 4);
        q.consume(6, &mut Each(|_, _| {}));
        let (mut completed, mut rest, mut cancelled) = (None, Vec::new(), Vec::new());
        let mut buffers = Vec::new();
        // A first run of three frames, a second of one.
        q.end_until(12, &mut completed, &mut rest, &mut cancelled, &mut buffers);
        assert_eq!(
            (completed, &rest[..], &cancelled[..]),
            (Some(2), &b"gh"[..], &[3][..])
        );
        q.end_until(16, &mut completed, &mut rest, &mut cancelled, &mut buffers);
        assert_eq!(cancelled, vec![3, 4]);
        assert_eq!(rest, b"gh", "a frame not started adds nothing");
    }

    /// A [`Completed`] that records each call.
    #[derive(Default)]
    struct Calls(Vec<(Vec<u64>, bool)>);

    impl Completed for Calls {
        fn keys(&mut self, frames: &[(u64, u64)]) {
            self.0.push((frames.iter().map(|f| f.1).collect(), false));
        }
        fn buffered(&mut self, key: u64, _buffer: NetworkBuffer) {
            self.0.push((vec![key], true));
        }
    }

    #[test]
    fn a_write_hands_its_completed_keys_over_in_runs_split_only_at_buffered_frames() {
        let pool = netio_core::BufferPool::new(16, 2);
        let mut q = CopyQueue::default();
        // Move the lists' start on, so that their content wraps.
        for k in 0..3 {
            q.push(b"zz", &[], &[], 0, 2, 100 + k);
        }
        let mut calls = Calls::default();
        q.consume(6, &mut calls);
        assert_eq!(calls.0, vec![(vec![100, 101, 102], false)]);
        for k in 0..6 {
            q.push(b"ab", &[], &[], 0, 2, k);
        }
        let mut b = pool.get().unwrap();
        b.write(b"c").unwrap();
        q.push_buffer(b"h", b, 6);
        for k in 7..10 {
            q.push(b"de", &[], &[], 0, 2, k);
        }
        let mut calls = Calls::default();
        // Frames 0..=5 (12 bytes), the buffered one (2), frame 7 (2) and
        // half of frame 8.
        q.consume(17, &mut calls);
        let keys: Vec<u64> = calls.0.iter().flat_map(|(k, _)| k.clone()).collect();
        assert_eq!(keys, (0..=7).collect::<Vec<u64>>(), "in order, 8 not yet");
        assert!(
            calls.0.iter().all(|(k, b)| !b || k == &[6]),
            "only the buffered frame goes alone: {:?}",
            calls.0
        );
        assert_eq!(calls.0.iter().filter(|(_, b)| *b).count(), 1);
        assert_eq!(pool.available(), 2, "its buffer handed over and dropped");
        let mut calls = Calls::default();
        q.consume(1, &mut calls);
        assert_eq!(calls.0, vec![(vec![8], false)]);
        q.consume(1, &mut calls);
        assert_eq!(calls.0.len(), 1, "half a frame completes nothing");
        q.consume(1, &mut calls);
        assert_eq!(calls.0[1], (vec![9], false));
    }

    #[test]
    fn a_buffered_frame_holds_its_buffer_until_it_completes_or_ends() {
        let pool = netio_core::BufferPool::new(16, 2);
        let mut q = CopyQueue::default();
        let mut b = pool.get().unwrap();
        b.write(b"abc").unwrap();
        q.push(b"xy", &[], &[], 0, 2, 1);
        q.push_buffer(b"h", b, 2);
        let mut b = pool.get().unwrap();
        b.write(b"de").unwrap();
        q.push_buffer(b"h", b, 3);
        assert_eq!(pool.available(), 0, "both buffers held");
        assert_eq!(q.ring().slices(0, 9), (&b"xyhabchde"[..], &b""[..]));
        let mut done = Vec::new();
        q.consume(
            6,
            &mut Each(|k, b: Option<NetworkBuffer>| {
                done.push((k, b.map(|b| b.as_slice().to_vec())))
            }),
        );
        assert_eq!(done, vec![(1, None), (2, Some(b"abc".to_vec()))]);
        drop(done);
        assert_eq!(
            pool.available(),
            1,
            "a completed frame's buffer is given back"
        );
        let (mut completed, mut rest, mut cancelled) = (None, Vec::new(), Vec::new());
        let mut buffers = Vec::new();
        q.end_until(9, &mut completed, &mut rest, &mut cancelled, &mut buffers);
        assert_eq!((completed, cancelled), (None, vec![3]));
        assert_eq!(buffers.len(), 1, "the cancelled frame's buffer");
    }
}
