//! Fixed-size buffer pools and the network buffers they hand out.
//!
//! A [`BufferPool`] allocates all its buffers when it is created. Handing a
//! buffer out and taking it back moves it between the pool's free list and a
//! [`NetworkBuffer`] value: no allocation happens on that path. A buffer goes
//! back to its pool when it is dropped, so a buffer can never leak and never
//! be returned twice.
//!
//! ```
//! use netio_core::BufferPool;
//! let pool = BufferPool::new(64, 2);
//! let mut a = pool.get().unwrap();
//! a.write(b"hello").unwrap();
//! a.write_int(7u32).unwrap();
//! assert_eq!(a.len(), 9);
//! let _b = pool.get().unwrap();
//! assert!(pool.get().is_none()); // exhausted
//! drop(a);
//! assert_eq!(pool.available(), 1);
//! ```

use std::fmt;
use std::io::IoSlice;

use crate::free_list::FreeList;
use crate::sync::{Arc, AtomicUsize, Ordering};

/// A pool of `num_buf` buffers of `buf_size` bytes each.
///
/// Cloning a pool gives another handle to the same buffers. All methods may
/// be called from any thread, and none takes a lock: the free buffers form
/// a lock-free stack, so taking one (or a batch) and giving it back are
/// atomic swaps.
#[derive(Clone)]
pub struct BufferPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    buf_size: usize,
    num_buf: usize,
    /// The buffers' memory, by index, free or handed out: taken and given
    /// back without a lock.
    free: FreeList<Box<[u8]>>,
    /// Smallest number of free buffers seen since the last
    /// `take_low_water`.
    low_water: AtomicUsize,
}

impl PoolInner {
    /// Notes that `left` buffers are free after a take. The mark only
    /// falls, so a take that does not lower it writes nothing (no locked
    /// read-modify-write on the common path).
    #[inline]
    fn note_low(&self, left: usize) {
        if left < self.low_water.load(Ordering::Relaxed) {
            self.low_water.fetch_min(left, Ordering::Relaxed);
        }
    }
}

impl BufferPool {
    /// Allocates `num_buf` zeroed buffers of `buf_size` bytes.
    ///
    /// # Panics
    /// If `num_buf` exceeds `u32::MAX` (buffer indices are 32-bit).
    pub fn new(buf_size: usize, num_buf: usize) -> Self {
        assert!(
            num_buf <= u32::MAX as usize,
            "at most 2^32-1 buffers per pool"
        );
        // Handed out lowest index first.
        let free = FreeList::new(
            (0..num_buf)
                .map(|_| vec![0u8; buf_size].into_boxed_slice())
                .collect(),
        );
        Self {
            inner: Arc::new(PoolInner {
                buf_size,
                num_buf,
                free,
                low_water: AtomicUsize::new(num_buf),
            }),
        }
    }

    /// Takes a free buffer (empty, capacity `buf_size`), or `None` if all are
    /// handed out.
    pub fn get(&self) -> Option<NetworkBuffer> {
        let (index, data) = self.inner.free.take()?;
        self.inner.note_low(self.inner.free.free());
        Some(NetworkBuffer {
            index,
            len: 0,
            data: Some(data),
            pool: Arc::clone(&self.inner),
        })
    }

    /// Takes up to `max` free buffers with one atomic swap and appends
    /// them to `out`; returns how many it took.
    pub fn get_many(&self, max: usize, out: &mut Vec<NetworkBuffer>) -> usize {
        out.reserve(max.min(self.inner.free.free()));
        let n = self.inner.free.take_many(max, |index, data| {
            out.push(NetworkBuffer {
                index,
                len: 0,
                data: Some(data),
                pool: Arc::clone(&self.inner),
            })
        });
        self.inner.note_low(self.inner.free.free());
        n
    }

    /// An identity of the pool: equal for clones of one pool (handles to
    /// the same buffers), different between pools alive at the same time.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Number of free buffers now.
    pub fn available(&self) -> usize {
        self.inner.free.free()
    }

    /// The smallest number of free buffers since the previous call (or since
    /// creation), then starts a new period from the current number.
    pub fn take_low_water(&self) -> usize {
        let lw = self
            .inner
            .low_water
            .swap(self.inner.free.free(), Ordering::Relaxed);
        lw.min(self.inner.num_buf)
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// Number of buffers.
    pub fn num_buf(&self) -> usize {
        self.inner.num_buf
    }

    /// Bytes of buffer memory the pool holds.
    pub fn bytes(&self) -> usize {
        self.inner.buf_size * self.inner.num_buf
    }

    /// `true` if `buffer` was handed out by this pool.
    pub fn owns(&self, buffer: &NetworkBuffer) -> bool {
        Arc::ptr_eq(&self.inner, &buffer.pool)
    }

    /// `true` if both handles refer to the same pool.
    pub fn same_pool(&self, other: &BufferPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("buf_size", &self.inner.buf_size)
            .field("num_buf", &self.inner.num_buf)
            .field("available", &self.available())
            .finish()
    }
}

/// The buffer is full: the write would exceed its capacity. Nothing was
/// written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("writing {needed} bytes into a buffer with {remaining} bytes left")]
pub struct BufferFull {
    /// Bytes the write needed.
    pub needed: usize,
    /// Bytes that were left.
    pub remaining: usize,
}

/// An integer that can be written into a [`NetworkBuffer`] in little-endian
/// byte order.
pub trait WireInt: Copy {
    /// The value's little-endian bytes.
    fn to_le(self) -> impl AsRef<[u8]>;
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl WireInt for $t {
            fn to_le(self) -> impl AsRef<[u8]> { self.to_le_bytes() }
        }
    )*};
}
wire_int!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

/// A buffer from a [`BufferPool`], filled by the user and handed to
/// `send_buffer`.
///
/// Dropping it returns it to its pool. A provider keeps the buffer while the
/// send is in flight and drops it on completion or cancellation.
pub struct NetworkBuffer {
    index: u32,
    len: usize,
    /// Always `Some` until `drop`.
    data: Option<Box<[u8]>>,
    pool: Arc<PoolInner>,
}

impl NetworkBuffer {
    /// The buffer's index in its pool; buffered sends complete with this key.
    pub fn index(&self) -> u64 {
        u64::from(self.index)
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` if nothing was written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total size of the buffer.
    pub fn capacity(&self) -> usize {
        self.storage().len()
    }

    /// Bytes that can still be written.
    pub fn remaining(&self) -> usize {
        self.capacity() - self.len
    }

    /// The bytes written so far.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage()[..self.len]
    }

    /// Forgets what was written.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `bytes`, or writes nothing and fails if they do not fit.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), BufferFull> {
        self.reserve(bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Appends every slice in order (gather), or writes nothing and fails if
    /// they do not fit together.
    pub fn write_iovec(&mut self, iov: &[IoSlice<'_>]) -> Result<(), BufferFull> {
        let total: usize = iov.iter().map(|s| s.len()).sum();
        let mut dst = self.reserve(total)?;
        for s in iov {
            let (head, tail) = dst.split_at_mut(s.len());
            head.copy_from_slice(s);
            dst = tail;
        }
        Ok(())
    }

    /// Appends an integer in little-endian byte order.
    pub fn write_int<T: WireInt>(&mut self, value: T) -> Result<(), BufferFull> {
        self.write(value.to_le().as_ref())
    }

    /// Extends the written part by `n` bytes and returns them for filling.
    /// The new bytes hold whatever the buffer held before (no zeroing).
    pub fn reserve(&mut self, n: usize) -> Result<&mut [u8], BufferFull> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(BufferFull {
                needed: n,
                remaining,
            });
        }
        let start = self.len;
        self.len += n;
        Ok(&mut self.storage_mut()[start..start + n])
    }

    fn storage(&self) -> &[u8] {
        self.data.as_deref().unwrap_or(&[])
    }

    fn storage_mut(&mut self) -> &mut [u8] {
        self.data.as_deref_mut().unwrap_or(&mut [])
    }
}

impl AsRef<[u8]> for NetworkBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for NetworkBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetworkBuffer")
            .field("index", &self.index)
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .finish()
    }
}

impl NetworkBuffer {
    /// Gives every buffer of `buffers` back to its pool, with one atomic
    /// swap per run of buffers of one pool instead of one per buffer (what
    /// dropping them one by one would do); leaves `buffers` empty, with
    /// its capacity. For a provider that releases the buffers of many
    /// completed sends at once.
    pub fn release_all(buffers: &mut Vec<NetworkBuffer>) {
        let mut i = 0;
        while i < buffers.len() {
            // One swap per run of buffers of one pool.
            let pool = Arc::clone(&buffers[i].pool);
            let start = i;
            while i < buffers.len() && Arc::ptr_eq(&buffers[i].pool, &pool) {
                i += 1;
            }
            pool.free.give_back_many(
                buffers[start..i]
                    .iter_mut()
                    .filter_map(|b| b.data.take().map(|d| (b.index, d))),
            );
        }
        // Their memory is back in the pools: dropping them only lets go of
        // the pool handles.
        buffers.clear();
    }
}

impl Drop for NetworkBuffer {
    fn drop(&mut self) {
        if let Some(data) = self.data.take() {
            self.pool.free.give_back(self.index, data);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn hands_out_every_index_once_then_none() {
        let pool = BufferPool::new(8, 3);
        let bufs: Vec<_> = (0..3).map(|_| pool.get().unwrap()).collect();
        let mut idx: Vec<u64> = bufs.iter().map(|b| b.index()).collect();
        idx.sort();
        assert_eq!(idx, vec![0, 1, 2]);
        assert!(pool.get().is_none());
        drop(bufs);
        assert_eq!(pool.available(), 3);
    }

    #[test]
    fn release_all_gives_every_buffer_back_to_its_own_pool() {
        let (a, b) = (BufferPool::new(8, 3), BufferPool::new(8, 2));
        let mut bufs = vec![
            a.get().unwrap(),
            a.get().unwrap(),
            b.get().unwrap(),
            a.get().unwrap(),
            b.get().unwrap(),
        ];
        assert_eq!((a.available(), b.available()), (0, 0));
        NetworkBuffer::release_all(&mut bufs);
        assert!(bufs.is_empty());
        assert_eq!((a.available(), b.available()), (3, 2));
        let again: Vec<_> = (0..3).map(|_| a.get().unwrap()).collect();
        let mut idx: Vec<u64> = again.iter().map(NetworkBuffer::index).collect();
        idx.sort();
        assert_eq!(idx, vec![0, 1, 2]);
    }

    #[test]
    fn get_many_takes_at_most_what_is_free_in_index_order_and_lowers_the_low_water_mark() {
        let pool = BufferPool::new(8, 4);
        let mut out = Vec::new();
        assert_eq!(pool.get_many(3, &mut out), 3);
        let idx: Vec<u64> = out.iter().map(NetworkBuffer::index).collect();
        assert_eq!(idx, vec![0, 1, 2]);
        assert!(out.iter().all(|b| b.is_empty() && b.capacity() == 8));
        assert_eq!(pool.get_many(5, &mut out), 1, "only one was left");
        assert_eq!(pool.get_many(5, &mut out), 0);
        assert_eq!(out.len(), 4);
        assert_eq!(pool.take_low_water(), 0);
        out.truncate(1);
        assert_eq!(pool.available(), 3);
    }

    #[test]
    fn writes_fail_whole_when_full() {
        let pool = BufferPool::new(4, 1);
        let mut b = pool.get().unwrap();
        b.write(b"ab").unwrap();
        assert_eq!(
            b.write(b"xyz"),
            Err(BufferFull {
                needed: 3,
                remaining: 2
            })
        );
        assert_eq!(b.as_slice(), b"ab");
        b.write_iovec(&[IoSlice::new(b"c"), IoSlice::new(b"d")])
            .unwrap();
        assert_eq!(b.as_slice(), b"abcd");
        assert!(b.write_int(1u8).is_err());
        b.clear();
        b.write_int(0x0102u16).unwrap();
        assert_eq!(b.as_slice(), &[2, 1]);
    }

    #[test]
    fn low_water_mark_resets_on_read() {
        let pool = BufferPool::new(1, 4);
        assert_eq!(pool.take_low_water(), 4);
        let a = pool.get().unwrap();
        let b = pool.get().unwrap();
        drop(a);
        drop(b);
        assert_eq!(pool.available(), 4);
        assert_eq!(pool.take_low_water(), 2);
        assert_eq!(pool.take_low_water(), 4);
    }

    #[test]
    fn ownership_is_by_pool_identity() {
        let p1 = BufferPool::new(1, 1);
        let p2 = BufferPool::new(1, 1);
        let b = p1.get().unwrap();
        assert!(p1.owns(&b));
        assert!(!p2.owns(&b));
        assert!(p1.clone().owns(&b));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Two threads take and return buffers concurrently with a third reading
    /// the low-water mark: no index is ever handed out twice, every buffer
    /// comes back, and the low-water mark never exceeds the pool size.
    #[test]
    fn concurrent_get_and_drop_conserve_buffers() {
        loom::model(|| {
            let pool = BufferPool::new(1, 2);
            let threads: Vec<_> = (0..2)
                .map(|_| {
                    let p = pool.clone();
                    loom::thread::spawn(move || {
                        let a = p.get();
                        let b = p.get();
                        if let (Some(a), Some(b)) = (&a, &b) {
                            assert_ne!(a.index(), b.index());
                        }
                        drop(a);
                        drop(b);
                    })
                })
                .collect();
            let lw = pool.take_low_water();
            assert!(lw <= 2);
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(pool.available(), 2);
            let mut idx = [pool.get().unwrap(), pool.get().unwrap()].map(|b| b.index());
            idx.sort();
            assert_eq!(idx, [0, 1]);
        });
    }
}
