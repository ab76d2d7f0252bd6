//! Registered memory for zero-copy sending.
//!
//! A [`MemoryRegion`] owns a block of memory that a connection may send from
//! without copying it into a send buffer. The caller describes what to send
//! with [`RegionSlice`]s; while a send is in flight, the provider holds a
//! [`Lent`] guard on those ranges and the safe [`MemoryRegion::write`]
//! refuses to touch them, so the bytes on the wire are the bytes that were
//! there when the send was queued. The raw path ([`MemoryRegion::as_mut_ptr`])
//! puts that duty on the caller.
//!
//! ```
//! use netio_core::MemoryRegion;
//! let region = MemoryRegion::new(1024);
//! region.write(0, b"payload").unwrap();
//! let slice = region.slice(0, 7).unwrap();
//! let lent = region.lend(&[slice]).unwrap();
//! assert!(region.write(3, b"x").is_err()); // in flight: refused
//! assert_eq!(lent.chunks().next().unwrap(), b"payload");
//! drop(lent); // completion
//! region.write(3, b"x").unwrap();
//! ```

use std::fmt;
use std::io::IoSlice;
use std::sync::atomic::AtomicU64 as StdAtomicU64;
use std::sync::atomic::Ordering as StdOrdering;
use std::sync::{Arc, Mutex};

/// Why a region access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// The range does not lie inside the region.
    #[error("range {offset}+{len} lies outside the region of {region_len} bytes")]
    OutOfBounds {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
        /// Size of the region.
        region_len: usize,
    },
    /// The slice was made from another region.
    #[error("the slice belongs to another memory region")]
    ForeignSlice,
    /// The range overlaps data of a send that has not completed.
    #[error("range {offset}+{len} overlaps data of a send in flight")]
    InFlight {
        /// Start of the range.
        offset: usize,
        /// Length of the range.
        len: usize,
    },
}

static NEXT_REGION_ID: StdAtomicU64 = StdAtomicU64::new(1);

/// A block of memory registered for zero-copy sending. Cloning gives another
/// handle to the same memory; the memory is freed when the last handle and
/// the last [`Lent`] guard are dropped.
#[derive(Clone)]
pub struct MemoryRegion {
    inner: Arc<RegionInner>,
}

/// A range of a [`MemoryRegion`], as handed to `send_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionSlice {
    region: u64,
    offset: usize,
    len: usize,
}

impl RegionSlice {
    /// Start of the range in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length of the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for an empty range.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Ranges of a region lent to a provider for a send in flight. While it
/// exists, [`MemoryRegion::write`] refuses to write these ranges. Dropping it
/// (on completion or cancellation) gives them back.
pub struct Lent {
    region: Arc<RegionInner>,
    ranges: Ranges,
}

/// How many lent ranges a [`Lent`] keeps inline before it allocates: a
/// zero-copy send of up to this many slices allocates nothing.
const INLINE_RANGES: usize = 4;

/// The `(offset, len)` ranges of a [`Lent`]: inline for the common case of
/// a few slices, on the heap beyond.
enum Ranges {
    Inline([(usize, usize); INLINE_RANGES], usize),
    Heap(Vec<(usize, usize)>),
}

impl Ranges {
    fn with_capacity(n: usize) -> Self {
        if n <= INLINE_RANGES {
            Ranges::Inline([(0, 0); INLINE_RANGES], 0)
        } else {
            Ranges::Heap(Vec::with_capacity(n))
        }
    }

    fn push(&mut self, r: (usize, usize)) {
        match self {
            Ranges::Inline(a, n) if *n < INLINE_RANGES => {
                a[*n] = r;
                *n += 1;
            }
            Ranges::Inline(a, n) => {
                let mut v = a[..*n].to_vec();
                v.push(r);
                *self = Ranges::Heap(v);
            }
            Ranges::Heap(v) => v.push(r),
        }
    }

    fn as_slice(&self) -> &[(usize, usize)] {
        match self {
            Ranges::Inline(a, n) => &a[..*n],
            Ranges::Heap(v) => v,
        }
    }
}

impl MemoryRegion {
    /// Allocates a zeroed region of `len` bytes.
    pub fn new(len: usize) -> Self {
        Self::from_vec(vec![0u8; len])
    }

    /// A region over `data`.
    pub fn from_vec(data: Vec<u8>) -> Self {
        let boxed: Box<[u8]> = data.into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed) as *mut u8;
        Self {
            inner: Arc::new(RegionInner {
                id: NEXT_REGION_ID.fetch_add(1, StdOrdering::Relaxed),
                ptr,
                len,
                lent: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// `true` for a region of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// A process-unique identifier of this region.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Describes `len` bytes at `offset` for `send_data`.
    pub fn slice(&self, offset: usize, len: usize) -> Result<RegionSlice, RegionError> {
        self.inner.check_bounds(offset, len)?;
        Ok(RegionSlice {
            region: self.inner.id,
            offset,
            len,
        })
    }

    /// Copies `data` into the region at `offset`. Refused if any of those
    /// bytes belong to a send in flight.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.inner.check_bounds(offset, data.len())?;
        let lent = crate::sync_std_lock(&self.inner.lent);
        if overlaps(&lent, offset, data.len()) {
            return Err(RegionError::InFlight {
                offset,
                len: data.len(),
            });
        }
        // SAFETY: the range is in bounds (checked above), and no `Lent` guard
        // covers it while we hold the lock, so no shared reference to these
        // bytes exists: `Lent` is the only way the safe API hands out
        // references into the region, and new guards need the lock.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.ptr.add(offset), data.len());
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), RegionError> {
        self.inner.check_bounds(offset, out.len())?;
        let _lent = crate::sync_std_lock(&self.inner.lent);
        // SAFETY: in bounds (checked above); writers through the safe API
        // hold the same lock, so no write races with this read.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.ptr.add(offset), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Lends the ranges of `slices` for a send: checks that each belongs to
    /// this region, then keeps them from being written until the returned
    /// guard is dropped. Providers call this when they accept a zero-copy
    /// send.
    pub fn lend(&self, slices: &[RegionSlice]) -> Result<Lent, RegionError> {
        let mut ranges = Ranges::with_capacity(slices.len());
        for s in slices {
            if s.region != self.inner.id {
                return Err(RegionError::ForeignSlice);
            }
            self.inner.check_bounds(s.offset, s.len)?;
            ranges.push((s.offset, s.len));
        }
        crate::sync_std_lock(&self.inner.lent).extend_from_slice(ranges.as_slice());
        Ok(Lent {
            region: Arc::clone(&self.inner),
            ranges,
        })
    }

    /// The start of the region's memory, for callers that fill it in place.
    ///
    /// Writing through this pointer is `unsafe` for the caller: the bytes
    /// of a send in flight (from `send_data` until its completion or
    /// cancellation) must not be written, and writes must not race with
    /// [`MemoryRegion::write`] or [`MemoryRegion::read`] on the same bytes.
    /// Only `len()` bytes from this pointer belong to the region.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.inner.ptr
    }
}

impl PartialEq for MemoryRegion {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for MemoryRegion {}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("id", &self.inner.id)
            .field("len", &self.inner.len)
            .finish()
    }
}

impl Lent {
    /// The lent bytes, one chunk per slice, in the order given.
    pub fn chunks(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.ranges.as_slice().iter().map(move |&(off, len)| {
            // SAFETY: the range was bounds-checked in `lend` and is recorded
            // as lent until `self` drops, so the safe API cannot write it;
            // the region memory lives as long as `self.region`.
            unsafe { std::slice::from_raw_parts(self.region.ptr.add(off), len) }
        })
    }

    /// The lent bytes as I/O slices for a vectored write, appended to `out`.
    pub fn io_slices<'a>(&'a self, out: &mut Vec<IoSlice<'a>>) {
        out.extend(self.chunks().map(IoSlice::new));
    }

    /// Total number of lent bytes.
    pub fn len(&self) -> usize {
        self.ranges.as_slice().iter().map(|r| r.1).sum()
    }

    /// `true` if no bytes are lent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Lent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("region", &self.region.id)
            .field("ranges", &self.ranges.as_slice())
            .finish()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut lent = crate::sync_std_lock(&self.region.lent);
        for r in self.ranges.as_slice() {
            if let Some(pos) = lent.iter().position(|x| x == r) {
                lent.swap_remove(pos);
            }
        }
    }
}

struct RegionInner {
    id: u64,
    /// Start of a `Box<[u8]>` of `len` bytes, owned by this value.
    ptr: *mut u8,
    len: usize,
    /// Ranges `(offset, len)` lent to sends in flight.
    lent: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the memory is owned (like a `Box<[u8]>`, which is Send + Sync);
// every access through the safe API is serialised by the `lent` lock or
// limited to ranges no safe writer can touch (see `Lent`).
unsafe impl Send for RegionInner {}
// SAFETY: see `Send` above.
unsafe impl Sync for RegionInner {}

impl RegionInner {
    fn check_bounds(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(RegionError::OutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}

impl Drop for RegionInner {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[u8]>` in
        // `from_vec` and are freed exactly once, here.
        drop(unsafe { Box::from_raw(slice) });
    }
}

fn overlaps(lent: &[(usize, usize)], offset: usize, len: usize) -> bool {
    let end = offset + len;
    lent.iter()
        .any(|&(o, l)| l > 0 && len > 0 && o < end && offset < o + l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_outside_bounds_are_refused() {
        let r = MemoryRegion::new(10);
        assert!(r.slice(0, 10).is_ok());
        assert!(matches!(
            r.slice(5, 6),
            Err(RegionError::OutOfBounds { .. })
        ));
        assert!(matches!(
            r.slice(usize::MAX, 2),
            Err(RegionError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn slice_of_another_region_cannot_be_lent() {
        let a = MemoryRegion::new(10);
        let b = MemoryRegion::new(10);
        let s = b.slice(0, 4).unwrap();
        assert_eq!(a.lend(&[s]).unwrap_err(), RegionError::ForeignSlice);
    }

    #[test]
    fn many_slices_are_lent_in_order_beyond_the_inline_capacity() {
        let r = MemoryRegion::from_vec((0u8..20).collect());
        let slices: Vec<_> = (0..10).rev().map(|i| r.slice(i * 2, 2).unwrap()).collect();
        let lent = r.lend(&slices).unwrap();
        let got: Vec<u8> = lent.chunks().flatten().copied().collect();
        let want: Vec<u8> = (0..10).rev().flat_map(|i| [i * 2, i * 2 + 1]).collect();
        assert_eq!(got, want);
        assert_eq!(lent.len(), 20);
        assert!(r.write(19, b"x").is_err());
        drop(lent);
        r.write(0, &[9; 20]).unwrap();
    }

    #[test]
    fn lent_ranges_refuse_writes_until_dropped() {
        let r = MemoryRegion::from_vec(b"0123456789".to_vec());
        let lent = r
            .lend(&[r.slice(2, 3).unwrap(), r.slice(8, 2).unwrap()])
            .unwrap();
        assert!(r.write(0, b"ab").is_ok());
        assert!(r.write(5, b"abc").is_ok());
        assert!(r.write(4, b"z").is_err());
        assert!(r.write(9, b"z").is_err());
        let got: Vec<u8> = lent.chunks().flatten().copied().collect();
        assert_eq!(got, b"23489");
        drop(lent);
        r.write(4, b"z").unwrap();
        let mut out = [0u8; 10];
        r.read(0, &mut out).unwrap();
        assert_eq!(&out, b"ab23zabc89");
    }
}
