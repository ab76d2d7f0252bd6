//! The bytes of a connection's copy sends, one frame after the other in a
//! ring: a copy send is a `memcpy` into it (no allocation once the ring is
//! big enough), and many queued messages go to the socket as one or two
//! slices of a gather write instead of one slice each.

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
    pub(crate) fn reserve(&mut self, n: usize) {
        if self.buf.len() - self.len < n {
            self.grow(self.len + n);
        }
    }

    /// Appends `part`, growing the ring when it lacks room.
    pub(crate) fn push(&mut self, mut part: &[u8]) {
        self.reserve(part.len());
        let cap = self.buf.len();
        let mut tail = self.head + self.len;
        if tail >= cap {
            tail -= cap;
        }
        self.len += part.len();
        while !part.is_empty() {
            let room = (cap - tail).min(part.len());
            self.buf[tail..tail + room].copy_from_slice(&part[..room]);
            part = &part[room..];
            tail = 0;
        }
    }

    /// Reallocates to hold at least `need` bytes, the content moved to the
    /// front.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
