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
//! To fill the region in place without `unsafe`, take a [`RegionChunk`]
//! ([`MemoryRegion::chunk`]): an owned, writable piece of the region that
//! nothing else reads or writes while it exists. Hand it to
//! [`Backend::send_chunk`](crate::Backend::send_chunk); its range is free
//! for the next `chunk` once the send completes or is cancelled.
//!
//! ```
//! use netio_core::MemoryRegion;
//! let region = MemoryRegion::new(64);
//! let mut a = region.chunk(16).unwrap();
//! a[..5].copy_from_slice(b"hello"); // in place
//! let b = region.chunk(64); // only 48 bytes are free
//! assert!(b.is_none());
//! assert!(region.write(a.offset(), b"x").is_err()); // the chunk is exclusive
//! drop(a);
//! assert!(region.chunk(64).is_some());
//! ```
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
    /// The range overlaps a [`RegionChunk`] handed out for writing.
    #[error("range {offset}+{len} overlaps a chunk handed out for writing")]
    Held {
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
    /// Allocates a zeroed region of `len` bytes. It starts on a page (4 KiB)
    /// from 4 KiB up, on a cache line (64 B) below: a provider or kernel
    /// that copies from it with the CPU (`shm`'s cross-process copy, a
    /// bounce buffer) copies between aligned addresses, as it does for
    /// page-aligned buffers of other programs. [`from_vec`](Self::from_vec)
    /// keeps the vector's own alignment.
    ///
    /// # Panics
    /// If `len` is larger than `isize::MAX` rounded down to a page, or the
    /// allocation fails (as `vec![0; len]` does).
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return Self::from_vec(Vec::new());
        }
        let align = if len >= 4096 { 4096 } else { 64 };
        let layout = std::alloc::Layout::from_size_align(len, align)
            .expect("a region's length fits isize::MAX");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self::with_memory(ptr, len, Some(layout))
    }

    /// A region over `data`.
    pub fn from_vec(data: Vec<u8>) -> Self {
        let boxed: Box<[u8]> = data.into_boxed_slice();
        let len = boxed.len();
        let ptr = Box::into_raw(boxed) as *mut u8;
        Self::with_memory(ptr, len, None)
    }

    /// A region owning `len` bytes at `ptr`: allocated with `layout`, or
    /// with `None` a leaked `Box<[u8]>` of `len` bytes.
    fn with_memory(ptr: *mut u8, len: usize, layout: Option<std::alloc::Layout>) -> Self {
        Self {
            inner: Arc::new(RegionInner {
                id: NEXT_REGION_ID.fetch_add(1, StdOrdering::Relaxed),
                ptr,
                len,
                layout,
                book: Mutex::new(Book::default()),
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
    /// bytes belong to a send in flight or to a [`RegionChunk`].
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), RegionError> {
        self.inner.check_bounds(offset, data.len())?;
        let book = crate::sync_std_lock(&self.inner.book);
        book.check_free(offset, data.len())?;
        // SAFETY: the range is in bounds (checked above), and no `Lent`
        // guard, chunk or chunk being sent covers it while we hold the lock,
        // so no other reference to these bytes exists: those are the only
        // ways the safe API hands out references into the region, and new
        // ones need the lock.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.inner.ptr.add(offset), data.len());
        }
        Ok(())
    }

    /// Copies `out.len()` bytes at `offset` out of the region. Refused if
    /// any of those bytes belong to a [`RegionChunk`] (its owner may be
    /// writing them).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), RegionError> {
        self.inner.check_bounds(offset, out.len())?;
        let book = crate::sync_std_lock(&self.inner.book);
        if overlaps(&book.held, offset, out.len()) {
            return Err(RegionError::Held {
                offset,
                len: out.len(),
            });
        }
        // SAFETY: in bounds (checked above); no chunk covers the range
        // (checked under the lock, and new chunks need the lock), and
        // `write` holds the same lock, so no write races with this read.
        unsafe {
            std::ptr::copy_nonoverlapping(self.inner.ptr.add(offset), out.as_mut_ptr(), out.len());
        }
        Ok(())
    }

    /// Lends the ranges of `slices` for a send: checks that each belongs to
    /// this region and that none overlaps a [`RegionChunk`], then keeps them
    /// from being written until the returned guard is dropped. Providers
    /// call this when they accept a zero-copy send.
    pub fn lend(&self, slices: &[RegionSlice]) -> Result<Lent, RegionError> {
        let mut ranges = Ranges::with_capacity(slices.len());
        for s in slices {
            if s.region != self.inner.id {
                return Err(RegionError::ForeignSlice);
            }
            self.inner.check_bounds(s.offset, s.len)?;
            ranges.push((s.offset, s.len));
        }
        let mut book = crate::sync_std_lock(&self.inner.book);
        for &(offset, len) in ranges.as_slice() {
            if overlaps(&book.held, offset, len) {
                return Err(RegionError::Held { offset, len });
            }
        }
        book.lent.extend_from_slice(ranges.as_slice());
        Ok(Lent {
            region: Arc::clone(&self.inner),
            ranges,
        })
    }

    /// An owned, writable piece of `len` bytes of the region that no send in
    /// flight and no other chunk uses (the first such range from the
    /// start), or `None` when there is no such range now. Fill it in place
    /// and send it with [`Backend::send_chunk`](crate::Backend::send_chunk);
    /// its range is free again once that send completes or is cancelled,
    /// or when the chunk is dropped unsent.
    pub fn chunk(&self, len: usize) -> Option<RegionChunk> {
        let mut book = crate::sync_std_lock(&self.inner.book);
        let offset = book.first_fit(len, self.inner.len)?;
        book.held.push((offset, len));
        Some(RegionChunk {
            region: Arc::clone(&self.inner),
            offset,
            len,
        })
    }

    /// The chunk of `len` bytes at `offset`, for applications with a fixed
    /// layout; refused if any of those bytes belong to a send in flight or
    /// to another chunk.
    pub fn chunk_at(&self, offset: usize, len: usize) -> Result<RegionChunk, RegionError> {
        self.inner.check_bounds(offset, len)?;
        let mut book = crate::sync_std_lock(&self.inner.book);
        book.check_free(offset, len)?;
        book.held.push((offset, len));
        Ok(RegionChunk {
            region: Arc::clone(&self.inner),
            offset,
            len,
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
        let mut book = crate::sync_std_lock(&self.region.book);
        for r in self.ranges.as_slice() {
            remove_one(&mut book.lent, *r);
        }
    }
}

struct RegionInner {
    id: u64,
    /// Start of `len` bytes owned by this value: allocated with `layout`,
    /// or a `Box<[u8]>` when `layout` is `None`.
    ptr: *mut u8,
    len: usize,
    layout: Option<std::alloc::Layout>,
    /// Which ranges are in use, and how.
    book: Mutex<Book>,
}

/// The ranges `(offset, len)` of a region in use. A range may be in `lent`
/// more than once (two sends of the same bytes); a range in `held` overlaps
/// nothing else in the book.
#[derive(Default)]
struct Book {
    /// Lent to sends in flight: read by providers, written by nobody.
    lent: Vec<(usize, usize)>,
    /// Chunks handed out: written by their owner, read by nobody else.
    held: Vec<(usize, usize)>,
    /// Chunks on their way into a send (`Backend::send_chunk`): written by
    /// nobody, may be lent.
    sending: Vec<(usize, usize)>,
}

impl Book {
    /// `Ok` when no send, chunk or chunk being sent uses any byte of the
    /// range.
    fn check_free(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        if overlaps(&self.held, offset, len) {
            Err(RegionError::Held { offset, len })
        } else if overlaps(&self.lent, offset, len) || overlaps(&self.sending, offset, len) {
            Err(RegionError::InFlight { offset, len })
        } else {
            Ok(())
        }
    }

    /// The lowest offset where `len` free bytes start, below `region_len`.
    /// Allocates nothing (it runs once per `chunk`, on the send path):
    /// every step moves the candidate past one busy range, so it ends
    /// after at most as many steps as there are ranges.
    fn first_fit(&self, len: usize, region_len: usize) -> Option<usize> {
        let mut start = 0usize;
        loop {
            let end = start.checked_add(len)?;
            if end > region_len {
                return None;
            }
            let blocking = self
                .lent
                .iter()
                .chain(&self.held)
                .chain(&self.sending)
                .filter(|&&(o, l)| l > 0 && len > 0 && o < end && start < o + l)
                .map(|&(o, l)| o + l)
                .max();
            match blocking {
                Some(past) => start = past,
                None => return Some(start),
            }
        }
    }
}

fn remove_one(v: &mut Vec<(usize, usize)>, r: (usize, usize)) {
    if let Some(pos) = v.iter().position(|x| *x == r) {
        v.swap_remove(pos);
    }
}

/// An owned, writable piece of a [`MemoryRegion`] (from
/// [`MemoryRegion::chunk`]): it dereferences to its bytes, mutably, and
/// nothing else reads or writes them while it exists. Send it with
/// [`Backend::send_chunk`](crate::Backend::send_chunk); dropping it unsent
/// frees its range.
pub struct RegionChunk {
    region: Arc<RegionInner>,
    offset: usize,
    len: usize,
}

impl RegionChunk {
    /// Start of the chunk in its region.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The id of the region ([`MemoryRegion::id`]).
    pub fn region_id(&self) -> u64 {
        self.region.id
    }

    /// Hands the chunk over for sending: from now on nobody writes it, and
    /// it may be lent. The range stays reserved until the returned value is
    /// dropped.
    pub(crate) fn into_sending(self) -> SendingChunk {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; the Arc is moved
        // out exactly once.
        let region = unsafe { std::ptr::read(&this.region) };
        let r = (this.offset, this.len);
        {
            let mut book = crate::sync_std_lock(&region.book);
            remove_one(&mut book.held, r);
            book.sending.push(r);
        }
        SendingChunk {
            region,
            offset: r.0,
            len: r.1,
        }
    }
}

impl std::ops::Deref for RegionChunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the range was bounds-checked when the chunk was made and
        // is in `held` until the chunk drops: `write`, `read`, `lend` and
        // other chunks refuse it, so only this chunk refers to the bytes;
        // the memory lives as long as `self.region`.
        unsafe { std::slice::from_raw_parts(self.region.ptr.add(self.offset), self.len) }
    }
}

impl std::ops::DerefMut for RegionChunk {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference
        // derived from the chunk.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.add(self.offset), self.len) }
    }
}

impl fmt::Debug for RegionChunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionChunk")
            .field("region", &self.region.id)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for RegionChunk {
    fn drop(&mut self) {
        remove_one(
            &mut crate::sync_std_lock(&self.region.book).held,
            (self.offset, self.len),
        );
    }
}

/// A chunk on its way into a send: read-only, may be lent; the range is
/// reserved until this drops (by then the provider holds a [`Lent`] on it,
/// or refused the send).
pub(crate) struct SendingChunk {
    region: Arc<RegionInner>,
    offset: usize,
    len: usize,
}

impl SendingChunk {
    /// The chunk's range, for `send_data`.
    pub(crate) fn slice(&self) -> RegionSlice {
        RegionSlice {
            region: self.region.id,
            offset: self.offset,
            len: self.len,
        }
    }

    /// Makes it a writable chunk again (the send was refused), unless a
    /// send still has its bytes lent.
    pub(crate) fn into_chunk(self) -> Option<RegionChunk> {
        let r = (self.offset, self.len);
        let mut book = crate::sync_std_lock(&self.region.book);
        if overlaps(&book.lent, r.0, r.1) {
            return None;
        }
        remove_one(&mut book.sending, r);
        book.held.push(r);
        drop(book);
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; the Arc is moved
        // out exactly once.
        let region = unsafe { std::ptr::read(&this.region) };
        Some(RegionChunk {
            region,
            offset: r.0,
            len: r.1,
        })
    }
}

impl Drop for SendingChunk {
    fn drop(&mut self) {
        remove_one(
            &mut crate::sync_std_lock(&self.region.book).sending,
            (self.offset, self.len),
        );
    }
}

// SAFETY: the memory is owned (like a `Box<[u8]>`, which is Send + Sync);
// every access through the safe API is serialised by the `book` lock or
// limited to ranges the book reserves for one user (see `Lent` and
// `RegionChunk`).
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
        match self.layout {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` in `new` and
            // is freed exactly once, here.
            Some(layout) => unsafe { std::alloc::dealloc(self.ptr, layout) },
            None => {
                let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
                // SAFETY: `ptr`/`len` came from `Box::into_raw` of a
                // `Box<[u8]>` in `from_vec` and are freed exactly once, here.
                drop(unsafe { Box::from_raw(slice) });
            }
        }
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
    fn a_new_region_is_zeroed_and_starts_on_a_page_from_a_page_up_and_a_cache_line_below() {
        for (len, align) in [
            (1usize, 64usize),
            (100, 64),
            (4095, 64),
            (4096, 4096),
            ((1 << 20) + 3, 4096),
        ] {
            let r = MemoryRegion::new(len);
            assert_eq!(r.len(), len);
            assert_eq!(r.as_mut_ptr() as usize % align, 0, "{len} B");
            let mut out = vec![1u8; len];
            r.read(0, &mut out).unwrap();
            assert!(out.iter().all(|&b| b == 0), "{len} B not zeroed");
            r.write(len - 1, &[7]).unwrap();
        }
        let empty = MemoryRegion::new(0);
        assert!(empty.is_empty());
        assert!(empty.slice(0, 0).is_ok());
    }

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
    fn chunks_are_exclusive_and_their_range_is_free_again_when_dropped() {
        let r = MemoryRegion::new(32);
        let mut a = r.chunk(10).unwrap();
        let b = r.chunk(10).unwrap();
        assert_eq!((a.offset(), b.offset()), (0, 10));
        a.copy_from_slice(b"0123456789");
        assert_eq!(&a[..], b"0123456789");
        assert!(matches!(r.write(5, b"x"), Err(RegionError::Held { .. })));
        assert!(matches!(
            r.read(9, &mut [0; 2]),
            Err(RegionError::Held { .. })
        ));
        assert!(matches!(
            r.lend(&[r.slice(0, 1).unwrap()]),
            Err(RegionError::Held { .. })
        ));
        assert!(matches!(r.chunk_at(19, 2), Err(RegionError::Held { .. })));
        assert!(r.chunk(13).is_none(), "only 12 bytes are free");
        let c = r.chunk(12).unwrap();
        assert_eq!(c.offset(), 20);
        drop(a);
        let mut out = [0u8; 10];
        r.read(0, &mut out).unwrap();
        assert_eq!(&out, b"0123456789", "a dropped chunk keeps what it wrote");
        assert_eq!(r.chunk(10).unwrap().offset(), 0);
        drop((b, c));
    }

    #[test]
    fn a_chunk_being_sent_can_be_lent_but_not_written_or_taken_and_comes_back_unless_lent() {
        let r = MemoryRegion::new(16);
        let mut c = r.chunk(8).unwrap();
        c.copy_from_slice(b"abcdefgh");
        let sending = c.into_sending();
        assert!(matches!(
            r.write(0, b"x"),
            Err(RegionError::InFlight { .. })
        ));
        assert_eq!(r.chunk(16).map(|c| c.offset()), None);
        assert_eq!(r.chunk(8).map(|c| c.offset()), Some(8));
        // Refused send: the chunk comes back, bytes unchanged.
        let c = sending
            .into_chunk()
            .expect("nothing lent: the chunk comes back");
        assert_eq!(&c[..], b"abcdefgh");
        // Accepted send: lent; the chunk does not come back while lent, and
        // the range stays busy until the lend ends.
        let sending = c.into_sending();
        let lent = r.lend(&[sending.slice()]).unwrap();
        assert_eq!(lent.chunks().next().unwrap(), b"abcdefgh");
        let s2 = r.chunk_at(0, 8).map(|_| ());
        assert!(matches!(s2, Err(RegionError::InFlight { .. })));
        drop(sending);
        assert!(r.chunk_at(0, 8).is_err(), "still lent to the send");
        drop(lent);
        assert_eq!(r.chunk(16).unwrap().offset(), 0);
    }

    #[test]
    fn first_fit_skips_busy_ranges_and_respects_the_end() {
        let r = MemoryRegion::new(10);
        let _lent = r
            .lend(&[r.slice(2, 2).unwrap(), r.slice(6, 1).unwrap()])
            .unwrap();
        assert_eq!(r.chunk(2).unwrap().offset(), 0);
        let a = r.chunk(2).unwrap();
        assert_eq!(a.offset(), 0);
        assert_eq!(r.chunk(3).unwrap().offset(), 7);
        assert!(r.chunk(4).is_none());
        assert_eq!(r.chunk(0).map(|c| c.len()), Some(0));
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
