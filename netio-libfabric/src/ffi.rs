//! Every call into libfabric, behind owning types whose safe methods cannot
//! cause undefined behaviour.
//!
//! Ownership rules that make the safe API sound:
//!
//! - each libfabric object is closed once, by `Drop`, after every object
//!   opened from it (children keep their parent alive through an `Arc`);
//! - a [`Link`] (an active endpoint) owns everything the provider may read
//!   or write for it: its receive memory and registration, the memory and
//!   registration of every send in flight, the operation contexts, its
//!   completion and event queues. `Drop` closes the endpoint *first*
//!   (after which the provider touches none of its buffers), then frees
//!   the rest; a send's memory is released before that only when its
//!   completion was read;
//! - memory is registered (`fi_mr_reg`) and its descriptor passed with
//!   every operation whatever the provider's `mr_mode`, so the code path
//!   is the one `FI_MR_LOCAL` providers (verbs) need; a registration is
//!   closed before the memory it covers is freed.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr, CString};
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use netio_core::ledger::{LedgerFull, SendLedger, SendSeq};
use netio_core::{BufferPool, Lent, MemoryRegion, NetworkBuffer};
use netio_libfabric_sys as sys;

use crate::rdm_ffi::OpTable;

pub(crate) use netio_core::fast_map::FastMap;

/// The libfabric API version asked for.
const API_VERSION: u32 = sys::FI_VERSION(1, 17);

/// A failed libfabric call: which one and its error number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FiError {
    /// The call that failed.
    pub call: &'static str,
    /// The positive libfabric error number (`FI_ENODATA`, …).
    pub errno: i32,
}

impl FiError {
    pub(crate) fn new(call: &'static str, rc: isize) -> Self {
        Self {
            call,
            errno: (-rc) as i32,
        }
    }
}

/// The message of a positive libfabric error number.
pub fn strerror(errno: i32) -> String {
    // SAFETY: fi_strerror accepts any number and returns a pointer to a
    // static NUL-terminated string.
    let msg = unsafe { CStr::from_ptr(sys::fi_strerror(errno)) };
    msg.to_string_lossy().into_owned()
}

impl fmt::Display for FiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} (-{})",
            self.call,
            strerror(self.errno),
            self.errno
        )
    }
}

impl std::error::Error for FiError {}

pub(crate) fn check(call: &'static str, rc: c_int) -> Result<(), FiError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(FiError::new(call, rc as isize))
    }
}

/// Mode bits this code honours: it gives every operation a context of
/// `fi_context2` size that stays put until the operation ends.
const SUPPORTED_MODE: u64 = sys::FI_CONTEXT | sys::FI_CONTEXT2;
/// Memory registration modes this code honours: it registers all memory
/// it hands to the provider and passes the descriptors (`FI_MR_LOCAL`),
/// registers only allocated memory, lets the provider pick keys.
const SUPPORTED_MR_MODE: c_int = sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT;

/// What [`Info::get`] asks for.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    /// Provider name (`tcp`, `sockets`, `verbs`, …).
    pub provider: &'a str,
    /// Domain (interface) name, if given.
    pub domain: Option<&'a str>,
    /// The address: the local one (`source`) or the peer's.
    pub addr: SocketAddr,
    /// `true` to get an entry for listening on `addr` (`FI_SOURCE`).
    pub source: bool,
    /// Transmit queue size asked for, if any.
    pub tx_size: Option<usize>,
    /// Receive queue size asked for, if any.
    pub rx_size: Option<usize>,
}

/// An `fi_info` list (owned; freed with `fi_freeinfo`).
pub struct Info {
    pub(crate) ptr: *mut sys::fi_info,
}

// SAFETY: an fi_info list is plain heap data owned by this value alone.
unsafe impl Send for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: `ptr` is a list from fi_getinfo/fi_dupinfo or a CONNREQ
        // event, owned by this value and freed once.
        unsafe { sys::fi_freeinfo(self.ptr) };
    }
}

fn dup_c(s: &str) -> Result<*mut std::ffi::c_char, FiError> {
    let c = CString::new(s).map_err(|_| FiError {
        call: "CString::new",
        errno: sys::FI_EINVAL,
    })?;
    // SAFETY: `c` is NUL-terminated; strdup copies it into malloc'd memory
    // that fi_freeinfo releases with free().
    let p = unsafe { libc::strdup(c.as_ptr()) };
    if p.is_null() {
        return Err(FiError {
            call: "strdup",
            errno: sys::FI_ENOMEM,
        });
    }
    Ok(p)
}

impl Info {
    /// `fi_getinfo` for a connected (`FI_EP_MSG`) messaging endpoint.
    /// Entries whose mode or mr_mode bits this code does not honour are
    /// skipped; none left is `-FI_ENODATA`.
    pub fn get(q: &Query<'_>) -> Result<Info, FiError> {
        prepare_env();
        // SAFETY: fi_allocinfo has no precondition; it returns a zeroed
        // fi_info with its attribute structs allocated, or null.
        let hints = unsafe { sys::fi_allocinfo() };
        if hints.is_null() {
            return Err(FiError {
                call: "fi_allocinfo",
                errno: sys::FI_ENOMEM,
            });
        }
        let hints = Info { ptr: hints };
        let node = CString::new(q.addr.ip().to_string()).expect("an IP has no NUL");
        let service = CString::new(q.addr.port().to_string()).expect("a port has no NUL");
        // SAFETY: `hints` is a valid fi_info from fi_allocinfo with its
        // attribute structs allocated; strings put in it are malloc'd
        // (fi_freeinfo frees them).
        unsafe {
            let h = hints.ptr;
            (*h).caps = sys::FI_MSG;
            (*h).mode = SUPPORTED_MODE;
            (*h).addr_format = if q.addr.is_ipv4() {
                sys::FI_SOCKADDR_IN
            } else {
                sys::FI_SOCKADDR_IN6
            };
            (*(*h).ep_attr).type_ = sys::FI_EP_MSG;
            (*(*h).domain_attr).mr_mode = SUPPORTED_MR_MODE;
            (*(*h).domain_attr).threading = sys::FI_THREAD_SAFE;
            (*(*h).fabric_attr).prov_name = dup_c(q.provider)?;
            if let Some(d) = q.domain {
                (*(*h).domain_attr).name = dup_c(d)?;
            }
            if let Some(n) = q.tx_size {
                (*(*h).tx_attr).size = n;
            }
            if let Some(n) = q.rx_size {
                (*(*h).rx_attr).size = n;
            }
        }
        let mut out: *mut sys::fi_info = ptr::null_mut();
        let flags = if q.source { sys::FI_SOURCE } else { 0 };
        // SAFETY: node/service are NUL-terminated and outlive the call,
        // `hints` is valid, `out` a valid out pointer.
        let rc = unsafe {
            sys::fi_getinfo(
                API_VERSION,
                node.as_ptr(),
                service.as_ptr(),
                flags,
                hints.ptr,
                &mut out,
            )
        };
        Self::pick(rc, out)
    }

    /// `fi_getinfo` for a reliable-datagram (`FI_EP_RDM`) endpoint with
    /// tagged messages sent in order (`FI_ORDER_SAS`), on the interface of
    /// `node` when given (`FI_SOURCE`, any port). Entries whose mode or
    /// mr_mode bits this code does not honour are skipped.
    /// `rx_size`: the receive queue size asked for, if any.
    pub fn get_rdm(
        provider: &str,
        domain: Option<&str>,
        node: Option<std::net::IpAddr>,
        rx_size: Option<usize>,
    ) -> Result<Info, FiError> {
        prepare_env();
        // SAFETY: as in `get`.
        let hints = unsafe { sys::fi_allocinfo() };
        if hints.is_null() {
            return Err(FiError {
                call: "fi_allocinfo",
                errno: sys::FI_ENOMEM,
            });
        }
        let hints = Info { ptr: hints };
        // SAFETY: as in `get`.
        unsafe {
            let h = hints.ptr;
            (*h).caps = sys::FI_MSG | sys::FI_TAGGED;
            (*h).mode = SUPPORTED_MODE;
            (*(*h).ep_attr).type_ = sys::FI_EP_RDM;
            (*(*h).domain_attr).mr_mode = SUPPORTED_MR_MODE;
            (*(*h).domain_attr).threading = sys::FI_THREAD_SAFE;
            (*(*h).tx_attr).msg_order = sys::FI_ORDER_SAS;
            (*(*h).rx_attr).msg_order = sys::FI_ORDER_SAS;
            if let Some(n) = rx_size {
                (*(*h).rx_attr).size = n;
            }
            (*(*h).fabric_attr).prov_name = dup_c(provider)?;
            if let Some(d) = domain {
                (*(*h).domain_attr).name = dup_c(d)?;
            }
            if let Some(ip) = node {
                (*h).addr_format = if ip.is_ipv4() {
                    sys::FI_SOCKADDR_IN
                } else {
                    sys::FI_SOCKADDR_IN6
                };
            }
        }
        let node = node.map(|ip| CString::new(ip.to_string()).expect("an IP has no NUL"));
        let mut out: *mut sys::fi_info = ptr::null_mut();
        let flags = if node.is_some() { sys::FI_SOURCE } else { 0 };
        // SAFETY: node is null or NUL-terminated and outlives the call,
        // `hints` is valid, `out` a valid out pointer.
        let rc = unsafe {
            sys::fi_getinfo(
                API_VERSION,
                node.as_ref().map_or(ptr::null(), |n| n.as_ptr()),
                ptr::null(),
                flags,
                hints.ptr,
                &mut out,
            )
        };
        Self::pick(rc, out)
    }

    /// The first entry of an `fi_getinfo` answer whose requirements are
    /// honoured here, as a list of one.
    fn pick(rc: c_int, out: *mut sys::fi_info) -> Result<Info, FiError> {
        check("fi_getinfo", rc)?;
        if out.is_null() {
            return Err(FiError::new("fi_getinfo", -(sys::FI_ENODATA as isize)));
        }
        let list = Info { ptr: out };
        let mut e = list.ptr;
        while !e.is_null() {
            // SAFETY: `e` is an entry of `list`, alive while `list` is.
            let (mode, mr_mode, next) = unsafe {
                let attr = (*e).domain_attr;
                let mr = if attr.is_null() { 0 } else { (*attr).mr_mode };
                ((*e).mode, mr, (*e).next)
            };
            if mode & !SUPPORTED_MODE == 0 && mr_mode & !SUPPORTED_MR_MODE == 0 {
                // SAFETY: `e` is a valid entry; fi_dupinfo copies that one
                // entry (not the list).
                let one = unsafe { sys::fi_dupinfo(e) };
                if one.is_null() {
                    return Err(FiError {
                        call: "fi_dupinfo",
                        errno: sys::FI_ENOMEM,
                    });
                }
                // SAFETY: `one` is a fresh single-entry list we own; its
                // `next` must be null so that freeing it frees one entry.
                unsafe { (*one).next = ptr::null_mut() };
                return Ok(Info { ptr: one });
            }
            e = next;
        }
        Err(FiError {
            call: "fi_getinfo (no entry with supported mode and mr_mode bits)",
            errno: sys::FI_ENODATA,
        })
    }

    fn string(p: *const std::ffi::c_char) -> Option<String> {
        if p.is_null() {
            None
        } else {
            // SAFETY: a non-null libfabric string is NUL-terminated and
            // lives as long as the fi_info it belongs to (borrowed here).
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    }

    /// The fabric provider's name (`tcp`, `shm`, `tcp;ofi_rxm`, ...).
    pub fn prov_name(&self) -> String {
        // SAFETY: `ptr` is a valid entry; fabric_attr may be null.
        unsafe {
            let f = (*self.ptr).fabric_attr;
            if f.is_null() {
                String::new()
            } else {
                Self::string((*f).prov_name).unwrap_or_default()
            }
        }
    }

    /// The fabric and domain names of the entry (a cache key).
    pub fn names(&self) -> (String, String) {
        // SAFETY: `ptr` is a valid entry; the attribute structs may be
        // null.
        unsafe {
            let f = (*self.ptr).fabric_attr;
            let d = (*self.ptr).domain_attr;
            let fname = if f.is_null() {
                None
            } else {
                Self::string((*f).name)
            };
            let dname = if d.is_null() {
                None
            } else {
                Self::string((*d).name)
            };
            (fname.unwrap_or_default(), dname.unwrap_or_default())
        }
    }

    /// The entry's address format (`FI_SOCKADDR_IN`, `FI_ADDR_STR`, ...).
    pub fn addr_format(&self) -> u32 {
        // SAFETY: `ptr` is a valid entry.
        unsafe { (*self.ptr).addr_format }
    }

    /// The transmit queue's gather limit (iovec entries per send).
    pub fn iov_limit(&self) -> usize {
        // SAFETY: `ptr` is a valid entry; tx_attr may be null.
        unsafe {
            let t = (*self.ptr).tx_attr;
            if t.is_null() {
                1
            } else {
                (*t).iov_limit.max(1)
            }
        }
    }

    /// The largest message the transmit queue takes by injection (copied
    /// at once, no completion); 0 when it has none.
    pub fn inject_size(&self) -> usize {
        // SAFETY: `ptr` is a valid entry; tx_attr may be null.
        unsafe {
            let t = (*self.ptr).tx_attr;
            if t.is_null() {
                0
            } else {
                (*t).inject_size
            }
        }
    }

    /// The largest message the endpoint sends.
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: `ptr` is a valid entry; ep_attr may be null.
        unsafe {
            let e = (*self.ptr).ep_attr;
            if e.is_null() {
                usize::MAX
            } else {
                (*e).max_msg_size
            }
        }
    }

    /// The peer's address of a CONNREQ entry or of a connecting entry.
    pub fn dest_addr(&self) -> Option<SocketAddr> {
        // SAFETY: `ptr` is a valid entry; dest_addr is null or a sockaddr
        // of dest_addrlen bytes.
        unsafe { sockaddr((*self.ptr).dest_addr, (*self.ptr).dest_addrlen) }
    }
}

/// Reads a `sockaddr_in`/`sockaddr_in6` of `len` bytes at `p`.
///
/// # Safety
///
/// `p` is null or points to `len` readable bytes.
unsafe fn sockaddr(p: *const c_void, len: usize) -> Option<SocketAddr> {
    if p.is_null() || len < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above).
    let family = c_int::from(unsafe { ptr::read_unaligned(p.cast::<libc::sa_family_t>()) });
    if family == libc::AF_INET && len >= std::mem::size_of::<libc::sockaddr_in>() {
        // SAFETY: `len` covers a sockaddr_in.
        let a = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
        let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
        Some(SocketAddr::V4(SocketAddrV4::new(
            ip,
            u16::from_be(a.sin_port),
        )))
    } else if family == libc::AF_INET6 && len >= std::mem::size_of::<libc::sockaddr_in6>() {
        // SAFETY: `len` covers a sockaddr_in6.
        let a = unsafe { ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
        let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
        Some(SocketAddr::V6(SocketAddrV6::new(
            ip,
            u16::from_be(a.sin6_port),
            a.sin6_flowinfo,
            a.sin6_scope_id,
        )))
    } else {
        None
    }
}

/// An open fabric.
pub struct Fabric {
    pub(crate) ptr: *mut sys::fid_fabric,
}

// SAFETY: fabric objects are thread safe in libfabric; every use here is
// serialised by the backend's lock anyway.
unsafe impl Send for Fabric {}
// SAFETY: as above.
unsafe impl Sync for Fabric {}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: opened by fi_fabric, closed once, after every child (the
        // children hold an Arc of it).
        unsafe { sys::fi_close(&mut (*self.ptr).fid) };
    }
}

/// An open domain (and its fabric).
pub struct Domain {
    pub(crate) ptr: *mut sys::fid_domain,
    /// The fabric provider's name, from the entry the domain was opened
    /// with (the entry of a connection request names none).
    prov: String,
    /// Registered send memory kept for reuse (closed before the domain).
    bounces: Arc<BouncePool>,
    /// Memory registrations made on this domain so far.
    registrations: AtomicU64,
    pub(crate) fabric: Arc<Fabric>,
}

// SAFETY: see Fabric.
unsafe impl Send for Domain {}
// SAFETY: see Fabric.
unsafe impl Sync for Domain {}

impl Drop for Domain {
    fn drop(&mut self) {
        // The cached registrations are children of the domain: closed
        // first. (Memory in flight holds the domain, so none is out now.)
        self.bounces.clear();
        // SAFETY: opened by fi_domain, closed once, after its children.
        unsafe { sys::fi_close(&mut (*self.ptr).fid) };
    }
}

/// Smallest size class of registered send memory.
const BOUNCE_MIN: usize = 256;
/// Largest size class kept for reuse; larger copies are registered per
/// send.
const BOUNCE_MAX_CLASS: usize = 64 << 20;
/// Registered send memory one domain keeps for reuse, in bytes.
const BOUNCE_CACHE_BYTES: usize = 64 << 20;

/// Bytes registered at once for the slots of one small size class.
const BOUNCE_CHUNK: usize = 64 << 10;

/// One registration covering the memory of several [`Slot`]s.
struct Chunk {
    mr: *mut sys::fid_mr,
    desc: *mut c_void,
    /// Freed after the registration is closed (dropped after `Drop::drop`).
    mem: RawMem,
}

// SAFETY: a registration handle and heap memory whose slots are written
// only by their exclusive owners (`Slot`).
unsafe impl Send for Chunk {}
// SAFETY: as above; the chunk itself is never written through `&Chunk`.
unsafe impl Sync for Chunk {}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: `mr` was opened by fi_mr_reg on a domain that is still
        // open (a chunk lives in slots of its domain's pool, cleared before
        // the domain closes, or of a `Pooled` that holds the domain) and is
        // closed once, before the memory it covers is freed (`mem` is
        // dropped after this body).
        unsafe { sys::fi_close(&mut (*self.mr).fid) };
    }
}

impl Chunk {
    /// Registers `len` zeroed bytes, starting on a page, on `domain`.
    fn register(domain: &Domain, len: usize) -> Result<Arc<Chunk>, FiError> {
        let mem = RawMem::zeroed(len)?;
        // SAFETY: `mem` is valid for `len` bytes and freed only after the
        // registration is closed (Drop); on an error it is freed here,
        // unregistered.
        let (mr, desc) = unsafe { domain.mr_reg(mem.ptr, len) }?;
        Ok(Arc::new(Chunk { mr, desc, mem }))
    }
}

/// Registered memory of one size class: a range of a [`Chunk`] that this
/// slot alone writes, owned by a [`BouncePool`] or a send in flight
/// ([`Pooled`]).
struct Slot {
    chunk: Arc<Chunk>,
    offset: usize,
    size: usize,
}

impl Slot {
    /// Copies `parts` to the start of the slot (they fit: checked by the
    /// caller's size class).
    fn fill(&mut self, header: &[u8], parts: &[&[u8]]) -> *const u8 {
        // SAFETY: `offset..offset + size` lies inside the chunk and belongs
        // to this slot alone (slots of a chunk are disjoint, and a slot is
        // owned by one pool entry or one send); `&mut self` excludes other
        // writers; the provider reads it only while the send that owns the
        // slot is in flight, which is not the case while it is filled.
        let base = unsafe { self.chunk.mem.ptr.add(self.offset) };
        let mut at = 0;
        for p in std::iter::once(&header).chain(parts) {
            assert!(at + p.len() <= self.size, "a copy larger than its slot");
            // SAFETY: in bounds (asserted); `p` does not overlap the slot
            // (it is caller memory, not registered send memory).
            unsafe { ptr::copy_nonoverlapping(p.as_ptr(), base.add(at), p.len()) };
            at += p.len();
        }
        base
    }
}

/// Registered send memory kept for reuse, by size class (powers of two
/// from [`BOUNCE_MIN`]): after warm-up a copy send registers nothing.
#[derive(Default)]
struct BouncePool {
    free: std::sync::Mutex<(Vec<Vec<Slot>>, usize)>,
}

impl BouncePool {
    fn class(n: usize) -> Option<(usize, usize)> {
        let size = n.max(BOUNCE_MIN).checked_next_power_of_two()?;
        if size > BOUNCE_MAX_CLASS {
            return None;
        }
        Some(((size / BOUNCE_MIN).trailing_zeros() as usize, size))
    }

    fn take(&self, class: usize) -> Option<Slot> {
        let mut g = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let slot = g.0.get_mut(class)?.pop()?;
        g.1 -= slot.size;
        Some(slot)
    }

    fn give(&self, class: usize, slot: Slot) {
        let mut g = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 + slot.size > BOUNCE_CACHE_BYTES {
            return;
        }
        if g.0.len() <= class {
            g.0.resize_with(class + 1, Vec::new);
        }
        g.1 += slot.size;
        g.0[class].push(slot);
    }

    fn clear(&self) {
        let mut g = self.free.lock().unwrap_or_else(|p| p.into_inner());
        g.0.clear();
        g.1 = 0;
    }
}

/// Registered send memory taken from a domain's pool for one send; it goes
/// back to the pool when dropped (after the send's completion, or after
/// its endpoint was closed).
pub(crate) struct Pooled {
    slot: Option<Slot>,
    class: Option<usize>,
    pool: Arc<BouncePool>,
    // Keeps the domain (and so the registration) open; dropped last.
    _domain: Arc<Domain>,
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let (Some(slot), Some(class)) = (self.slot.take(), self.class) {
            self.pool.give(class, slot);
        }
    }
}

impl Pooled {
    /// Registered memory holding `header` then `parts` one after the
    /// other: from the pool, or registered now (the first use of a size
    /// class, or a size beyond the largest class). Returns it with the
    /// address, length and descriptor to send.
    pub(crate) fn copy_of(
        domain: &Arc<Domain>,
        header: &[u8],
        parts: &[&[u8]],
    ) -> Result<(Pooled, *const u8, usize, *mut c_void), FiError> {
        let n: usize = header.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let class = BouncePool::class(n);
        let slot = match class.and_then(|(c, _)| domain.bounces.take(c)) {
            Some(slot) => slot,
            None => {
                let size = class.map_or(n.max(1), |(_, size)| size);
                // Small classes register a chunk of slots at once; the
                // slots beyond the first go to the pool.
                let count = (BOUNCE_CHUNK / size).max(1);
                let chunk = Chunk::register(domain, size * count)?;
                if let Some((c, _)) = class {
                    for i in 1..count {
                        domain.bounces.give(
                            c,
                            Slot {
                                chunk: Arc::clone(&chunk),
                                offset: i * size,
                                size,
                            },
                        );
                    }
                }
                Slot {
                    chunk,
                    offset: 0,
                    size,
                }
            }
        };
        let mut pooled = Pooled {
            slot: Some(slot),
            class: class.map(|(c, _)| c),
            pool: Arc::clone(&domain.bounces),
            _domain: Arc::clone(domain),
        };
        let slot = pooled.slot.as_mut().expect("just set");
        let ptr = slot.fill(header, parts);
        let desc = slot.chunk.desc;
        Ok((pooled, ptr, n, desc))
    }
}

impl Domain {
    /// Registers `len` bytes at `addr` for local send and receive; returns
    /// the registration and its descriptor.
    ///
    /// # Safety
    ///
    /// The memory stays allocated until the registration is closed, which
    /// the caller does before the domain is closed.
    unsafe fn mr_reg(
        &self,
        addr: *const u8,
        len: usize,
    ) -> Result<(*mut sys::fid_mr, *mut c_void), FiError> {
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the domain is open; the memory is valid (caller); out
        // pointer valid.
        let rc = unsafe {
            sys::fi_mr_reg(
                self.ptr,
                addr.cast::<c_void>(),
                len,
                sys::FI_SEND | sys::FI_RECV,
                0,
                key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        check("fi_mr_reg", rc)?;
        self.registrations.fetch_add(1, Ordering::Relaxed);
        // SAFETY: `mr` is open.
        let desc = unsafe { sys::fi_mr_desc(mr) };
        Ok((mr, desc))
    }

    /// Memory registrations made on this domain so far (receive memory,
    /// send buffers, zero-copy regions, and send memory for copies, which
    /// is registered once per size class and reused).
    pub fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Relaxed)
    }

    /// Opens the fabric and domain of `info`.
    pub fn open(info: &Info) -> Result<Arc<Domain>, FiError> {
        let mut fabric: *mut sys::fid_fabric = ptr::null_mut();
        // SAFETY: `info` is a valid entry; the out pointer is valid.
        let rc = unsafe { sys::fi_fabric((*info.ptr).fabric_attr, &mut fabric, ptr::null_mut()) };
        check("fi_fabric", rc)?;
        let fabric = Arc::new(Fabric { ptr: fabric });
        let mut domain: *mut sys::fid_domain = ptr::null_mut();
        // SAFETY: the fabric is open; `info` valid; out pointer valid.
        let rc = unsafe { sys::fi_domain(fabric.ptr, info.ptr, &mut domain, ptr::null_mut()) };
        check("fi_domain", rc)?;
        Ok(Arc::new(Domain {
            ptr: domain,
            prov: info.prov_name(),
            bounces: Arc::default(),
            registrations: AtomicU64::new(0),
            fabric,
        }))
    }

    /// Opens a passive endpoint listening with `info` (from an
    /// `FI_SOURCE` query), reporting to a new event queue.
    pub fn listen(self: &Arc<Self>, info: Info) -> Result<PassiveEp, FiError> {
        let eq = EventQueue::open(&self.fabric)?;
        let mut pep: *mut sys::fid_pep = ptr::null_mut();
        // SAFETY: the fabric is open, `info` valid, out pointer valid.
        let rc =
            unsafe { sys::fi_passive_ep(self.fabric.ptr, info.ptr, &mut pep, ptr::null_mut()) };
        check("fi_passive_ep", rc)?;
        let pep = PassiveEp {
            ptr: pep,
            eq,
            _info: info,
            _domain: Arc::clone(self),
        };
        // SAFETY: pep and eq are open.
        let rc = unsafe { sys::fi_pep_bind(pep.ptr, &mut (*pep.eq.ptr).fid, 0) };
        check("fi_pep_bind", rc)?;
        // SAFETY: pep is open and bound.
        let rc = unsafe { sys::fi_listen(pep.ptr) };
        check("fi_listen", rc)?;
        Ok(pep)
    }
}

/// The outcome of `fi_trywait`.
pub(crate) fn trywait(fabric: &Fabric, fid: *mut sys::fid) -> bool {
    let mut fids = [fid];
    // SAFETY: the fabric and the object are open; the array holds one
    // valid fid.
    let rc = unsafe { sys::fi_trywait(fabric.ptr, fids.as_mut_ptr(), 1) };
    // -FI_EAGAIN: events are pending, do not sleep. Other errors (a
    // provider without trywait support) cannot be acted on: sleep on the
    // fd, which then wakes on new events.
    rc != -sys::FI_EAGAIN
}

pub(crate) fn wait_fd(fid: *mut sys::fid) -> Result<RawFd, FiError> {
    let mut fd: c_int = -1;
    // SAFETY: `fid` is an open EQ or CQ made with FI_WAIT_FD, for which
    // FI_GETWAIT writes an int.
    let rc = unsafe {
        sys::fi_control(
            fid,
            sys::FI_GETWAIT as c_int,
            (&mut fd as *mut c_int).cast::<c_void>(),
        )
    };
    check("fi_control(FI_GETWAIT)", rc)?;
    Ok(fd)
}

/// An event queue with a wait fd.
pub struct EventQueue {
    ptr: *mut sys::fid_eq,
    fd: RawFd,
    fabric: Arc<Fabric>,
}

// SAFETY: see Fabric.
unsafe impl Send for EventQueue {}
// SAFETY: see Fabric.
unsafe impl Sync for EventQueue {}

impl Drop for EventQueue {
    fn drop(&mut self) {
        // SAFETY: opened by fi_eq_open, closed once, after the endpoints
        // bound to it (they are dropped first by their owners).
        unsafe { sys::fi_close(&mut (*self.ptr).fid) };
    }
}

/// One event of an event queue.
pub enum EqEvent {
    /// A connection request on a passive endpoint.
    ConnReq(Info),
    /// The endpoint is connected.
    Connected,
    /// The peer shut the connection down.
    Shutdown,
    /// An error: the positive error number and the provider's.
    Error {
        /// libfabric error number.
        errno: i32,
        /// Provider-specific error number.
        prov_errno: i32,
    },
    /// Another event type (ignored).
    Other,
}

impl EventQueue {
    fn open(fabric: &Arc<Fabric>) -> Result<EventQueue, FiError> {
        let mut attr = sys::fi_eq_attr {
            size: 64,
            wait_obj: sys::FI_WAIT_FD,
            ..Default::default()
        };
        let mut eq: *mut sys::fid_eq = ptr::null_mut();
        // SAFETY: the fabric is open; attr and out pointer valid.
        let rc = unsafe { sys::fi_eq_open(fabric.ptr, &mut attr, &mut eq, ptr::null_mut()) };
        check("fi_eq_open", rc)?;
        let mut q = EventQueue {
            ptr: eq,
            fd: -1,
            fabric: Arc::clone(fabric),
        };
        // SAFETY: the EQ is open.
        q.fd = wait_fd(unsafe { &mut (*q.ptr).fid })?;
        Ok(q)
    }

    /// The wait fd to register in the event loop.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Reads one event, `None` if there is none.
    pub fn read(&self) -> Result<Option<EqEvent>, FiError> {
        let mut event: u32 = 0;
        let mut buf = [0u64; 32];
        // SAFETY: the EQ is open; `buf` is 256 writable bytes, aligned for
        // fi_eq_cm_entry.
        let rc = unsafe {
            sys::fi_eq_read(
                self.ptr,
                &mut event,
                buf.as_mut_ptr().cast::<c_void>(),
                std::mem::size_of_val(&buf),
                0,
            )
        };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(None);
        }
        if rc == -(sys::FI_EAVAIL as isize) {
            let mut err = sys::fi_eq_err_entry::default();
            // SAFETY: the EQ is open; `err` is a valid entry to fill.
            let rc = unsafe { sys::fi_eq_readerr(self.ptr, &mut err, 0) };
            if rc < 0 {
                return Err(FiError::new("fi_eq_readerr", rc));
            }
            return Ok(Some(EqEvent::Error {
                errno: err.err,
                prov_errno: err.prov_errno,
            }));
        }
        if rc < 0 {
            return Err(FiError::new("fi_eq_read", rc));
        }
        Ok(Some(match event {
            sys::FI_CONNREQ => {
                // SAFETY: a CONNREQ event is an fi_eq_cm_entry, whose
                // `info` the application owns and frees.
                let info = unsafe { (*buf.as_ptr().cast::<sys::fi_eq_cm_entry>()).info };
                if info.is_null() {
                    EqEvent::Other
                } else {
                    EqEvent::ConnReq(Info { ptr: info })
                }
            }
            sys::FI_CONNECTED => EqEvent::Connected,
            sys::FI_SHUTDOWN => EqEvent::Shutdown,
            _ => EqEvent::Other,
        }))
    }

    /// `true` if the loop may sleep on the fd (`fi_trywait`).
    pub fn trywait(&self) -> bool {
        // SAFETY: taking the address of the open EQ's fid.
        trywait(&self.fabric, unsafe { &mut (*self.ptr).fid })
    }
}

/// A listening passive endpoint with its event queue.
pub struct PassiveEp {
    ptr: *mut sys::fid_pep,
    eq: EventQueue,
    // Kept until the endpoint is closed: providers (sockets) keep pointers
    // into the entry they were opened with.
    _info: Info,
    _domain: Arc<Domain>,
}

// SAFETY: see Fabric.
unsafe impl Send for PassiveEp {}
// SAFETY: libfabric objects opened with FI_THREAD_SAFE may be used from
// several threads at once (the listener thread reads the event queue while
// the loop rejects a request); nothing here mutates Rust-side state.
unsafe impl Sync for PassiveEp {}

/// A connection request read from a passive endpoint's event queue: the
/// entry to open the accepting endpoint with, or to reject.
pub struct ConnRequest {
    info: Info,
    /// The passive endpoint it came from (checked by `reject`).
    pep: usize,
}

impl ConnRequest {
    /// The peer's address.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.info.dest_addr()
    }

    /// The entry, to open the accepting endpoint with.
    pub fn into_info(self) -> Info {
        self.info
    }
}

impl Drop for PassiveEp {
    fn drop(&mut self) {
        // SAFETY: opened by fi_passive_ep, closed once, before its EQ (a
        // field, dropped after this).
        unsafe { sys::fi_close(&mut (*self.ptr).fid) };
    }
}

impl PassiveEp {
    /// The bound address (with the port the system picked).
    pub fn local_addr(&self) -> Result<SocketAddr, FiError> {
        let mut buf = [0u64; 16];
        let mut len = std::mem::size_of_val(&buf);
        // SAFETY: the pep is open; `buf` has `len` writable bytes.
        let rc = unsafe {
            sys::fi_getname(
                &mut (*self.ptr).fid,
                buf.as_mut_ptr().cast::<c_void>(),
                &mut len,
            )
        };
        check("fi_getname", rc)?;
        // SAFETY: fi_getname wrote `len` bytes (at most the buffer size).
        unsafe { sockaddr(buf.as_ptr().cast::<c_void>(), len.min(128)) }.ok_or(FiError {
            call: "fi_getname (not an IP address)",
            errno: sys::FI_EINVAL,
        })
    }

    /// The event queue.
    pub fn eq(&self) -> &EventQueue {
        &self.eq
    }

    /// Reads one event of the event queue: `Ok(Some(Some(request)))` for a
    /// connection request, `Ok(Some(None))` for another event, `Ok(None)`
    /// when there is none.
    pub fn read_request(&self) -> Result<Option<Option<ConnRequest>>, FiError> {
        Ok(self.eq.read()?.map(|ev| match ev {
            EqEvent::ConnReq(info) => Some(ConnRequest {
                info,
                pep: self.ptr as usize,
            }),
            _ => None,
        }))
    }

    /// Rejects a request read from this endpoint (the peer sees its
    /// connection refused, the provider frees what it held for it). A
    /// request of another endpoint is only dropped.
    pub fn reject(&self, req: ConnRequest) {
        if req.pep != self.ptr as usize {
            return;
        }
        // SAFETY: the pep is open; `handle` comes from a CONNREQ entry of
        // this pep's event queue (checked above) and is answered once (the
        // request is consumed).
        unsafe {
            let handle = (*req.info.ptr).handle;
            if !handle.is_null() {
                sys::fi_reject(self.ptr, handle, ptr::null(), 0);
            }
        }
    }
}

/// A memory registration.
pub struct Mr {
    ptr: *mut sys::fid_mr,
    pub(crate) desc: *mut c_void,
    _domain: Arc<Domain>,
}

// SAFETY: see Fabric.
unsafe impl Send for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: opened by fi_mr_reg, closed once, before the memory it
        // covers is freed (owners drop the Mr first).
        unsafe { sys::fi_close(&mut (*self.ptr).fid) };
    }
}

/// Keys for providers that do not pick them (no `FI_MR_PROV_KEY`): unique
/// per process, so per domain.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

impl Mr {
    /// Registers `len` bytes at `addr` for local send and receive.
    ///
    /// # Safety
    ///
    /// The memory stays allocated until the returned `Mr` is dropped.
    pub(crate) unsafe fn register(
        domain: &Arc<Domain>,
        addr: *const u8,
        len: usize,
    ) -> Result<Mr, FiError> {
        // SAFETY: the memory stays allocated until the `Mr` is dropped
        // (caller), which closes the registration first.
        let (mr, desc) = unsafe { domain.mr_reg(addr, len.max(1)) }?;
        Ok(Mr {
            ptr: mr,
            desc,
            _domain: Arc::clone(domain),
        })
    }
}

/// Pieces (header and parts) of a copy send sent with `FI_INJECT`, at most.
const INJECT_IOV: usize = 8;

/// The largest copy send handed over with `FI_INJECT` (`fi_sendmsg`, the
/// bytes copied by the provider before the call returns, the completion
/// still reported) on `info`'s connected fabric provider; 0 where that is
/// not known to hold. No bounce copy and no registered memory are then
/// needed for a small copy send.
///
/// `verbs` copies such a send into the work request (`IBV_SEND_INLINE`),
/// `sockets` into its transmit ring. libfabric 1.17's `tcp` ignores the
/// flag in `fi_sendmsg` (it keeps pointers to the caller's bytes until it
/// writes them to its socket, as for an ordinary send), so it gets none.
///
/// `prov` is the provider's name: the domain's, since the entry of an
/// accepted connection's request (`FI_CONNREQ`) carries no provider name,
/// and a name taken from it would leave the accepting side without
/// injection.
fn inject_copy_max(prov: &str, info: &Info) -> usize {
    match prov {
        "verbs" | "sockets" => info.inject_size().min(INJECT_COPY_LIMIT),
        _ => 0,
    }
}

/// The largest copy send sent with `FI_INJECT`, whatever the provider
/// offers.
const INJECT_COPY_LIMIT: usize = 4096;

/// What a send in flight keeps alive.
enum TxData {
    /// Nothing: the provider copied the bytes during the call (`FI_INJECT`).
    Injected,
    Buffer(#[allow(dead_code)] NetworkBuffer),
    Bounce(#[allow(dead_code)] Pooled),
    ZeroCopy(#[allow(dead_code)] Option<Pooled>, #[allow(dead_code)] Lent),
}

struct TxOp {
    _data: TxData,
}

/// Receive memory of an endpoint: `num` buffers of `size` bytes in one
/// registered allocation, each with its operation context.
struct RecvSlab {
    mem: Arc<RecvMem>,
    ctx: Box<[sys::fi_context2]>,
}

/// Receive memory of one connection: `count` buffers of `size` bytes in
/// one registered allocation, shared by the connection, the operations
/// posted from it and the delivery of its messages (which reads a buffer
/// in place while it is not posted).
///
/// The allocation starts on a page and each buffer on a cache line (on a
/// page from 4 KiB up), as `fi_pingpong`'s buffers do: a provider that
/// copies a large message with the CPU (`shm`'s `process_vm_readv`, a
/// bounce buffer) copies between aligned addresses, which is measurably
/// faster than into a buffer one byte past the previous one's end.
pub struct RecvMem {
    // Closed before the memory it covers is freed (field order).
    pub(crate) mr: Mr,
    pub(crate) mem: RawMem,
    /// Bytes a buffer holds (what is posted).
    pub(crate) size: usize,
    /// Distance from one buffer's start to the next one's.
    stride: usize,
    /// Which buffers are with the provider.
    pub(crate) posted: Box<[AtomicBool]>,
}

impl fmt::Debug for RecvMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvMem")
            .field("buffers", &self.posted.len())
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// A zeroed, page-aligned heap allocation written by the provider through
/// raw pointers.
pub(crate) struct RawMem {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

/// Alignment of receive memory.
const PAGE: usize = 4096;

impl RawMem {
    /// `len` zeroed bytes (at least one) starting on a page.
    fn zeroed(len: usize) -> Result<RawMem, FiError> {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), PAGE).map_err(|_| FiError {
                call: "receive memory (size out of range)",
                errno: sys::FI_EINVAL,
            })?;
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(FiError {
                call: "receive memory (allocation failed)",
                errno: sys::FI_ENOMEM,
            });
        }
        Ok(RawMem { ptr, layout })
    }
}

impl Drop for RawMem {
    fn drop(&mut self) {
        // SAFETY: `ptr` was allocated in `RawMem::zeroed` with `layout`
        // and is freed once, here.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

// SAFETY: the memory is plain bytes; the provider writes a buffer only
// while it is posted, and `RecvMem::bytes` reads only buffers that are not.
unsafe impl Send for RecvMem {}
// SAFETY: as above; `posted` is atomic.
unsafe impl Sync for RecvMem {}

/// The distance between receive buffers of `size` bytes: a whole number of
/// cache lines, of pages from a page up; `None` past `isize::MAX`.
fn recv_stride(size: usize) -> Option<usize> {
    let align = if size >= PAGE { PAGE } else { 64 };
    size.checked_add(align - 1).map(|s| s & !(align - 1))
}

impl RecvMem {
    /// Allocates and registers `count` buffers of `size` bytes.
    pub fn new(domain: &Arc<Domain>, size: usize, count: usize) -> Result<Arc<RecvMem>, FiError> {
        let size = size.max(1);
        let stride = recv_stride(size).ok_or(FiError {
            call: "receive memory (size out of range)",
            errno: sys::FI_EINVAL,
        })?;
        let len = stride.checked_mul(count.max(1)).ok_or(FiError {
            call: "receive memory (size times count out of range)",
            errno: sys::FI_EINVAL,
        })?;
        let mem = RawMem::zeroed(len)?;
        // SAFETY: `mem` lives in the RecvMem next to the registration and
        // is freed after it (field order).
        let mr = unsafe { Mr::register(domain, mem.ptr, len) }?;
        Ok(Arc::new(RecvMem {
            mr,
            mem,
            size,
            stride,
            posted: (0..count).map(|_| AtomicBool::new(false)).collect(),
        }))
    }

    /// Start of buffer `index` (`index < count`, which callers check).
    pub(crate) fn buffer_ptr(&self, index: usize) -> *mut u8 {
        debug_assert!(index < self.posted.len().max(1));
        self.mem.ptr.wrapping_add(index.wrapping_mul(self.stride))
    }

    /// Buffer count.
    pub fn count(&self) -> usize {
        self.posted.len()
    }

    /// The first `len` bytes of buffer `index`, or nothing while the
    /// buffer is posted (or out of range).
    pub fn bytes(&self, index: usize, len: usize) -> &[u8] {
        if index >= self.posted.len() || self.posted[index].load(Ordering::Acquire) {
            return &[];
        }
        let len = len.min(self.size);
        // SAFETY: the range lies inside the allocation (index < count) and
        // the buffer is not posted, so the provider does not write it.
        unsafe { std::slice::from_raw_parts(self.buffer_ptr(index), len) }
    }
}

/// One completion of an endpoint's queue.
#[derive(Debug)]
pub enum Completion {
    /// Receive buffer `index` holds a message of `len` bytes.
    Received {
        /// Buffer index.
        index: usize,
        /// Message length.
        len: usize,
    },
    /// A message did not fit receive buffer `index`: `size` bytes in all.
    Truncated {
        /// The message's full size (0: not reported by the provider).
        size: u64,
    },
    /// A send failed (the connection broke).
    SendFailed(i32),
    /// A receive failed for another reason (`FI_ECANCELED` at close, a
    /// broken connection).
    RecvFailed(i32),
}

/// Why a send was not posted.
pub enum PostError {
    /// The send queue depth is reached, or the provider's transmit queue
    /// is full (`-FI_EAGAIN`): retry after a completion.
    Again,
    /// Another error.
    Failed(FiError),
}

/// What each side of a link needs.
pub struct LinkSpec {
    /// Receive buffer size and count (0 buffers: no receive capability).
    pub recv: (usize, usize),
    /// Region for zero-copy sends.
    pub zero_copy: Option<MemoryRegion>,
    /// Send queue depth for copy and zero-copy sends.
    pub depth: usize,
    /// Completion queue size.
    pub cq_size: usize,
    /// The completion queue gets a wait fd, for a loop that sleeps until
    /// it has entries. A busy-polling loop reads its queues without one:
    /// libfabric's `tcp` then watches the connection's socket with `poll`
    /// from the read itself, instead of through an epoll instance nested
    /// in the loop's (a 64 B round trip took 1.26× `fi_pingpong`'s with
    /// the fd, 1.07× without).
    pub cq_wait_fd: bool,
}

/// An active endpoint and everything the provider may touch for it.
pub struct Link {
    ep: *mut sys::fid_ep,
    // Dropped after the endpoint is closed (see Drop), in this order.
    ledger: SendLedger<TxOp>,
    /// The operation contexts of the sends in flight, each with its
    /// place in the ledger: found again from the context a completion
    /// reports by address arithmetic (a link allocates no more contexts
    /// than it had sends in flight at once).
    tx_ops: OpTable<SendSeq>,
    recv: Option<RecvSlab>,
    zero_copy: Option<(Mr, MemoryRegion)>,
    buffer_mrs: HashMap<usize, Mr>,
    pools: Vec<BufferPool>,
    cq: *mut sys::fid_cq,
    cq_fd: Option<RawFd>,
    eq: EventQueue,
    domain: Arc<Domain>,
    // Kept until the endpoint is closed: providers (sockets) keep pointers
    // into the entry they were opened with.
    info: Option<Info>,
    iov_limit: usize,
    max_msg: usize,
    /// The largest copy send handed over with `FI_INJECT` (0: none; see
    /// [`inject_copy_max`]).
    inject_max: usize,
    scratch: Vec<sys::fi_cq_msg_entry>,
}

// SAFETY: see Fabric; the raw pointers are libfabric objects owned here.
unsafe impl Send for Link {}

impl Drop for Link {
    fn drop(&mut self) {
        self.close_ep();
        // SAFETY: the CQ was opened by fi_cq_open and is closed once,
        // after the endpoint bound to it. The EQ and the domain are fields
        // dropped after this.
        unsafe { sys::fi_close(&mut (*self.cq).fid) };
    }
}

impl Link {
    /// Opens an endpoint for `info` on `domain` with its own completion
    /// and event queues, registers its receive memory and posts every
    /// receive buffer. Connect it with [`connect`](Self::connect) or
    /// accept it with [`accept`](Self::accept).
    pub fn open(domain: &Arc<Domain>, info: Info, spec: LinkSpec) -> Result<Link, FiError> {
        // The receive queue holds every receive buffer (all are posted at
        // once); the entry may carry the provider's smaller default.
        let want_rx = spec.recv.1;
        // SAFETY: `info` is a valid entry we own; rx_attr may be null.
        unsafe {
            let rx = (*info.ptr).rx_attr;
            if !rx.is_null() && (*rx).size < want_rx {
                (*rx).size = want_rx;
            }
        }
        let eq = EventQueue::open(&domain.fabric)?;
        let mut attr = sys::fi_cq_attr {
            size: spec.cq_size,
            format: sys::FI_CQ_FORMAT_MSG,
            wait_obj: if spec.cq_wait_fd {
                sys::FI_WAIT_FD
            } else {
                sys::FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut cq: *mut sys::fid_cq = ptr::null_mut();
        // SAFETY: the domain is open; attr and out pointer valid.
        let rc = unsafe { sys::fi_cq_open(domain.ptr, &mut attr, &mut cq, ptr::null_mut()) };
        check("fi_cq_open", rc)?;
        let mut link = Link {
            ep: ptr::null_mut(),
            ledger: SendLedger::new(spec.depth),
            tx_ops: OpTable::new(),
            recv: None,
            zero_copy: None,
            buffer_mrs: HashMap::new(),
            pools: Vec::new(),
            cq,
            cq_fd: None,
            eq,
            domain: Arc::clone(domain),
            info: None,
            iov_limit: info.iov_limit(),
            max_msg: info.max_msg_size(),
            inject_max: inject_copy_max(&domain.prov, &info),
            scratch: Vec::with_capacity(64),
        };
        if spec.cq_wait_fd {
            // SAFETY: the CQ is open, made with FI_WAIT_FD.
            link.cq_fd = Some(wait_fd(unsafe { &mut (*link.cq).fid })?);
        }
        let mut ep: *mut sys::fid_ep = ptr::null_mut();
        // SAFETY: domain open, info valid, out pointer valid.
        let rc = unsafe { sys::fi_endpoint(domain.ptr, info.ptr, &mut ep, ptr::null_mut()) };
        check("fi_endpoint", rc).map_err(|e| FiError {
            call: "fi_endpoint (with a receive queue of one entry per receive buffer: fewer \
                   receive buffers may fit the device's queue limit)",
            ..e
        })?;
        link.ep = ep;
        link.info = Some(info);
        // SAFETY: the endpoint, EQ and CQ are open; the CQ takes both
        // directions' completions.
        unsafe {
            check(
                "fi_ep_bind(eq)",
                sys::fi_ep_bind(ep, &mut (*link.eq.ptr).fid, 0),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(ep, &mut (*link.cq).fid, sys::FI_TRANSMIT | sys::FI_RECV),
            )?;
            check("fi_enable", sys::fi_enable(ep))?;
        }
        if let Some(region) = spec.zero_copy {
            // SAFETY: the region's memory lives as long as the clone kept
            // next to the registration, dropped after it (tuple order).
            let mr = unsafe { Mr::register(domain, region.as_mut_ptr(), region.len()) }?;
            link.zero_copy = Some((mr, region));
        }
        let (size, num) = spec.recv;
        if num > 0 {
            let mem = RecvMem::new(domain, size, num)?;
            // SAFETY: fi_context2 is plain data; zeroed is a valid value.
            let ctx = vec![unsafe { std::mem::zeroed::<sys::fi_context2>() }; num];
            link.recv = Some(RecvSlab {
                mem,
                ctx: ctx.into_boxed_slice(),
            });
            for i in 0..num {
                link.post_recv(i)?;
            }
        }
        Ok(link)
    }

    /// The completion queue's wait fd (none for a busy-polling loop, see
    /// [`LinkSpec::cq_wait_fd`]) and the event queue's.
    pub fn fds(&self) -> (Option<RawFd>, RawFd) {
        (self.cq_fd, self.eq.fd)
    }

    /// Keeps a send pool alive as long as the registrations of its
    /// buffers (needed before [`send_buffer`](Self::send_buffer) with its
    /// buffers).
    pub fn keep_pool(&mut self, pool: BufferPool) {
        if !self.pools.iter().any(|p| p.same_pool(&pool)) {
            self.pools.push(pool);
        }
    }

    /// Starts connecting to the destination of the entry the endpoint was
    /// opened with.
    pub fn connect(&mut self) -> Result<(), FiError> {
        self.live()?;
        let info = self.info.as_ref().ok_or(FiError {
            call: "fi_connect (no entry)",
            errno: sys::FI_EINVAL,
        })?;
        // SAFETY: the endpoint is open; dest_addr is the address fi_getinfo
        // resolved for it (the provider reads its format's size).
        let rc = unsafe { sys::fi_connect(self.ep, (*info.ptr).dest_addr, ptr::null(), 0) };
        check("fi_connect", rc)
    }

    /// Accepts the connection request this endpoint was opened for.
    pub fn accept(&mut self) -> Result<(), FiError> {
        self.live()?;
        // SAFETY: the endpoint is open.
        let rc = unsafe { sys::fi_accept(self.ep, ptr::null(), 0) };
        check("fi_accept", rc)
    }

    fn live(&self) -> Result<(), FiError> {
        if self.ep.is_null() {
            Err(FiError {
                call: "endpoint closed",
                errno: sys::FI_EINVAL,
            })
        } else {
            Ok(())
        }
    }

    /// Posts receive buffer `index` (again).
    pub fn post_recv(&mut self, index: usize) -> Result<(), FiError> {
        self.live()?;
        let slab = self.recv.as_mut().ok_or(FiError {
            call: "fi_recv (no receive buffers)",
            errno: sys::FI_EINVAL,
        })?;
        if index >= slab.ctx.len() {
            return Err(FiError {
                call: "fi_recv (no such buffer)",
                errno: sys::FI_EINVAL,
            });
        }
        let mem = &slab.mem;
        if mem.posted[index].swap(true, Ordering::AcqRel) {
            return Err(FiError {
                call: "fi_recv (buffer posted already)",
                errno: sys::FI_EINVAL,
            });
        }
        // SAFETY: buffer `index` lies inside the memory (index < count) and
        // is not posted elsewhere (its flag was clear); the memory and its
        // registration live until after the endpoint is closed (the slab
        // holds them), and the context slot stays put (boxed slice).
        let rc = unsafe {
            sys::fi_recv(
                self.ep,
                mem.buffer_ptr(index).cast::<c_void>(),
                mem.size,
                mem.mr.desc,
                sys::FI_ADDR_UNSPEC,
                (&mut slab.ctx[index] as *mut sys::fi_context2).cast::<c_void>(),
            )
        };
        if rc < 0 {
            mem.posted[index].store(false, Ordering::Release);
            return Err(FiError::new("fi_recv", rc));
        }
        Ok(())
    }

    /// The receive memory, read in place by the delivery of a message
    /// while its buffer is not posted.
    pub fn recv_mem(&self) -> Option<Arc<RecvMem>> {
        self.recv.as_ref().map(|s| Arc::clone(&s.mem))
    }

    /// Receive buffer size and count.
    pub fn recv_shape(&self) -> (usize, usize) {
        self.recv
            .as_ref()
            .map_or((0, 0), |s| (s.mem.size, s.ctx.len()))
    }

    /// Buffer `index` is no longer with the provider.
    fn recv_ended(&self, index: usize) {
        if let Some(s) = &self.recv {
            s.mem.posted[index].store(false, Ordering::Release);
        }
    }

    fn recv_index(&self, ctx: *mut c_void) -> Option<usize> {
        let s = self.recv.as_ref()?;
        let base = s.ctx.as_ptr() as usize;
        let size = std::mem::size_of::<sys::fi_context2>();
        let p = ctx as usize;
        if p >= base && p < base + size * s.ctx.len() && (p - base) % size == 0 {
            Some((p - base) / size)
        } else {
            None
        }
    }

    /// Reads every completion: receives are returned, sends marked done in
    /// the ledger (collect them with [`drain_completed_into`](Self::drain_completed_into)).
    /// Returns `true` if anything was read.
    pub fn poll(&mut self, out: &mut Vec<Completion>) -> Result<bool, FiError> {
        if self.ep.is_null() {
            return Ok(false);
        }
        let mut any = false;
        loop {
            self.scratch.clear();
            let cap = self.scratch.capacity();
            // SAFETY: the CQ is open; `scratch` has room for `cap` entries
            // of the format it was opened with (FI_CQ_FORMAT_MSG).
            let rc = unsafe {
                sys::fi_cq_read(self.cq, self.scratch.as_mut_ptr().cast::<c_void>(), cap)
            };
            if rc == -(sys::FI_EAGAIN as isize) {
                return Ok(any);
            }
            if rc == -(sys::FI_EAVAIL as isize) {
                any = true;
                let mut e = sys::fi_cq_err_entry::default();
                // SAFETY: the CQ is open; `e` is a valid entry to fill.
                let rc = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
                if rc < 0 {
                    if rc == -(sys::FI_EAGAIN as isize) {
                        continue;
                    }
                    return Err(FiError::new("fi_cq_readerr", rc));
                }
                if let Some(index) = self.recv_index(e.op_context) {
                    self.recv_ended(index);
                    if e.err == sys::FI_ETRUNC as c_int {
                        let _ = index;
                        out.push(Completion::Truncated {
                            size: (e.len as u64).saturating_add(e.olen as u64),
                        });
                    } else {
                        out.push(Completion::RecvFailed(e.err));
                    }
                } else if self.tx_ops.take(e.op_context).is_some() {
                    // The send stays in the ledger: it is cancelled when the
                    // broken connection is closed.
                    out.push(Completion::SendFailed(e.err));
                } else if e.flags & sys::FI_RECV != 0 {
                    out.push(Completion::RecvFailed(e.err));
                }
                continue;
            }
            if rc < 0 {
                return Err(FiError::new("fi_cq_read", rc));
            }
            let n = rc as usize;
            // SAFETY: fi_cq_read wrote `n` <= cap entries.
            unsafe { self.scratch.set_len(n) };
            any = true;
            for i in 0..n {
                let e = self.scratch[i];
                if let Some(index) = self.recv_index(e.op_context) {
                    self.recv_ended(index);
                    out.push(Completion::Received { index, len: e.len });
                } else if let Some(seq) = self.tx_ops.take(e.op_context) {
                    self.ledger.mark_done(seq);
                }
            }
            if n < cap {
                return Ok(any);
            }
        }
    }

    /// `true` if the loop may sleep on the completion queue's fd; always
    /// for a queue without one (no loop sleeps on it: a busy-polling loop
    /// reads it again on its own).
    pub fn trywait_cq(&self) -> bool {
        if self.cq_fd.is_none() {
            return true;
        }
        // SAFETY: taking the address of the open CQ's fid.
        trywait(&self.domain.fabric, unsafe { &mut (*self.cq).fid })
    }

    /// The event queue.
    pub fn eq(&self) -> &EventQueue {
        &self.eq
    }

    /// Appends the keys of sends that completed, in send order, to `keys`
    /// (whose memory the caller keeps between reads); their memory is
    /// released here.
    pub fn drain_completed_into(&mut self, keys: &mut Vec<u64>) {
        self.ledger.drain_completed_each(|key, _op| keys.push(key));
    }

    /// Reads completions (dropping received messages) until every send
    /// completed or `limit` passed.
    pub fn settle_sends(&mut self, limit: std::time::Duration) {
        let end = std::time::Instant::now() + limit;
        let mut dropped = Vec::new();
        loop {
            dropped.clear();
            if self.poll(&mut dropped).is_err() || self.ledger_done() {
                return;
            }
            if std::time::Instant::now() >= end {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
    }

    fn ledger_done(&self) -> bool {
        self.tx_ops.is_empty()
    }

    /// `true` when the provider holds no send of this link any more (each
    /// one completed or failed).
    pub fn sends_done(&self) -> bool {
        self.ledger_done()
    }

    /// `true` if a copy or zero-copy send would find a free slot.
    pub fn has_room(&self) -> bool {
        self.ledger.has_room()
    }

    /// Posts a send of `header` then `parts` (at least one byte, at most
    /// `inject_max` in all, fewer than [`INJECT_IOV`] pieces) with
    /// `FI_INJECT`: the provider copies the bytes before the call returns,
    /// so no registered memory is involved; the send still completes (and
    /// is counted in the ledger) like any other.
    fn post_injected(&mut self, key: u64, header: &[u8], parts: &[&[u8]]) -> Result<(), PostError> {
        self.live().map_err(PostError::Failed)?;
        let empty = sys::iovec {
            iov_base: ptr::null_mut(),
            iov_len: 0,
        };
        let mut vecs = [empty; INJECT_IOV];
        let mut count = 0;
        for piece in std::iter::once(header).chain(parts.iter().copied()) {
            if !piece.is_empty() {
                vecs[count] = sys::iovec {
                    iov_base: piece.as_ptr().cast_mut().cast::<c_void>(),
                    iov_len: piece.len(),
                };
                count += 1;
            }
        }
        let (slot, ctx) = self.tx_ops.reserve();
        let msg = sys::fi_msg {
            msg_iov: vecs.as_ptr(),
            desc: ptr::null_mut(),
            iov_count: count,
            addr: sys::FI_ADDR_UNSPEC,
            context: ctx,
            data: 0,
        };
        // SAFETY: the endpoint is open; `msg` and the iovec array it points
        // to are read during the call only, and with FI_INJECT the provider
        // has copied the bytes they name when the call returns (checked
        // per provider: `inject_copy_max` is 0 for the others), so no
        // descriptor is needed; `ctx` is a context of `tx_ops`, which
        // stays put and is not handed out again until the completion is
        // read (or the endpoint is closed).
        let rc = unsafe { sys::fi_sendmsg(self.ep, &msg, sys::FI_INJECT | sys::FI_COMPLETION) };
        if rc < 0 {
            self.tx_ops.release(slot);
            if rc == -(sys::FI_EAGAIN as isize) {
                return Err(PostError::Again);
            }
            return Err(PostError::Failed(FiError::new("fi_sendmsg", rc)));
        }
        let op = TxOp {
            _data: TxData::Injected,
        };
        self.accept_posted(key, true, slot, op);
        Ok(())
    }

    /// Records a send posted with the context of `slot` in the ledger and
    /// the operation table.
    fn accept_posted(&mut self, key: u64, counted: bool, slot: usize, op: TxOp) {
        match self.ledger.accept(key, counted, op) {
            Ok(seq) => self.tx_ops.fill(slot, seq),
            Err(LedgerFull(op)) => {
                // Not reachable (room was checked under the same &mut); the
                // send is posted, so its memory must outlive the endpoint:
                // keep it by leaking rather than freeing it under the NIC.
                std::mem::forget(op);
            }
        }
    }

    // The payload goes back to the caller on the failure path only.
    #[allow(clippy::result_large_err)]
    fn post(
        &mut self,
        key: u64,
        counted: bool,
        iov: &[(*const u8, usize, *mut c_void)],
        data: TxData,
    ) -> Result<(), (PostError, TxData)> {
        if let Err(e) = self.live() {
            return Err((PostError::Failed(e), data));
        }
        if counted && !self.ledger.has_room() {
            return Err((PostError::Again, data));
        }
        let (slot, ctx) = self.tx_ops.reserve();
        // SAFETY: the endpoint is open; every iovec entry points into
        // registered memory owned by `data` (a buffer, a bounce copy, or a
        // region kept by the Link and lent to it), whose heap memory the
        // ledger keeps (in the `TxOp` made of it) until the send's
        // completion is read or the endpoint is closed; `ctx` is a context
        // of `tx_ops`, which never moves and is not handed out again
        // before then; descriptors match the memory.
        // The iovec and descriptor arrays are read during the call only.
        let rc = unsafe {
            if let [(p, n, desc)] = iov {
                sys::fi_send(
                    self.ep,
                    p.cast_mut().cast::<c_void>(),
                    *n,
                    *desc,
                    sys::FI_ADDR_UNSPEC,
                    ctx,
                )
            } else {
                let mut vecs: Vec<sys::iovec> = iov
                    .iter()
                    .map(|&(p, n, _)| sys::iovec {
                        iov_base: p as *mut c_void,
                        iov_len: n,
                    })
                    .collect();
                let mut descs: Vec<*mut c_void> = iov.iter().map(|&(_, _, d)| d).collect();
                sys::fi_sendv(
                    self.ep,
                    vecs.as_mut_ptr(),
                    descs.as_mut_ptr(),
                    vecs.len(),
                    sys::FI_ADDR_UNSPEC,
                    ctx,
                )
            }
        };
        if rc < 0 {
            // Not posted: the context is free again.
            self.tx_ops.release(slot);
            if rc == -(sys::FI_EAGAIN as isize) {
                return Err((PostError::Again, data));
            }
            return Err((PostError::Failed(FiError::new("fi_send", rc)), data));
        }
        self.accept_posted(key, counted, slot, TxOp { _data: data });
        Ok(())
    }

    /// Sends the bytes of `buf` (a buffer of a pool given to
    /// [`keep_pool`](Self::keep_pool)), completing with `key`. On error the
    /// buffer comes back.
    pub fn send_buffer(
        &mut self,
        buf: NetworkBuffer,
        key: u64,
    ) -> Result<(), (PostError, Option<NetworkBuffer>)> {
        if !self.pools.iter().any(|p| p.owns(&buf)) {
            return Err((
                PostError::Failed(FiError {
                    call: "send_buffer (foreign buffer)",
                    errno: sys::FI_EINVAL,
                }),
                Some(buf),
            ));
        }
        let data = buf.as_slice();
        let (p, n) = (data.as_ptr(), data.len());
        // The whole buffer is registered once (its storage never moves
        // while its pool, kept by this link, lives).
        let full = buf.capacity();
        let desc = match self.buffer_mrs.get(&(p as usize)) {
            Some(mr) => mr.desc,
            None => {
                // SAFETY: the buffer's storage belongs to a pool this link
                // keeps alive (`pools`, dropped after `buffer_mrs`).
                match unsafe { Mr::register(&self.domain, p, full) } {
                    Ok(mr) => {
                        let d = mr.desc;
                        self.buffer_mrs.insert(p as usize, mr);
                        d
                    }
                    Err(e) => return Err((PostError::Failed(e), Some(buf))),
                }
            }
        };
        match self.post(key, false, &[(p, n, desc)], TxData::Buffer(buf)) {
            Ok(()) => Ok(()),
            Err((e, TxData::Buffer(b))) => Err((e, Some(b))),
            Err((e, _)) => Err((e, None)),
        }
    }

    /// Sends `header` then `parts`: handed over with `FI_INJECT` where the
    /// provider copies them during the call (see [`inject_copy_max`]),
    /// otherwise copied into registered memory now.
    pub fn send_copy(&mut self, parts: &[&[u8]], header: &[u8], key: u64) -> Result<(), PostError> {
        if !self.ledger.has_room() {
            return Err(PostError::Again);
        }
        if self.inject_max > 0 && parts.len() < INJECT_IOV && parts.len() < self.iov_limit {
            let n = header.len() + parts.iter().map(|p| p.len()).sum::<usize>();
            if n > 0 && n <= self.inject_max {
                return self.post_injected(key, header, parts);
            }
        }
        let (b, p, n, desc) =
            Pooled::copy_of(&self.domain, header, parts).map_err(PostError::Failed)?;
        self.post(key, true, &[(p, n, desc)], TxData::Bounce(b))
            .map_err(|(e, _)| e)
    }

    /// Sends `header` (copied into registered memory) then the lent
    /// region bytes, without copying them when the provider's gather limit
    /// allows (otherwise everything is copied into registered memory).
    pub fn send_zero_copy(&mut self, lent: Lent, header: &[u8], key: u64) -> Result<(), PostError> {
        if !self.ledger.has_room() {
            return Err(PostError::Again);
        }
        let Some((mr, _)) = &self.zero_copy else {
            return Err(PostError::Failed(FiError {
                call: "send_data (no region)",
                errno: sys::FI_EINVAL,
            }));
        };
        let region_desc = mr.desc;
        let chunks: Vec<&[u8]> = lent.chunks().filter(|c| !c.is_empty()).collect();
        let segments = chunks.len() + usize::from(!header.is_empty());
        if segments == 0 || segments > self.iov_limit {
            let mut parts = chunks;
            parts.retain(|c| !c.is_empty());
            let r = self.send_copy(&parts, header, key);
            drop(lent);
            return r;
        }
        let mut iov: Vec<(*const u8, usize, *mut c_void)> = Vec::with_capacity(segments);
        let head = if header.is_empty() {
            None
        } else {
            let (b, p, n, desc) =
                Pooled::copy_of(&self.domain, header, &[]).map_err(PostError::Failed)?;
            iov.push((p, n, desc));
            Some(b)
        };
        for c in &chunks {
            iov.push((c.as_ptr(), c.len(), region_desc));
        }
        drop(chunks);
        self.post(key, true, &iov, TxData::ZeroCopy(head, lent))
            .map_err(|(e, _)| e)
    }

    /// The largest message the endpoint sends.
    pub fn max_msg_size(&self) -> usize {
        self.max_msg
    }

    /// The region of zero-copy sends, if any.
    pub fn region(&self) -> Option<MemoryRegion> {
        self.zero_copy.as_ref().map(|(_, r)| r.clone())
    }

    /// The send pools whose buffers this link sends.
    pub fn pools(&self) -> Vec<BufferPool> {
        self.pools.clone()
    }

    /// Starts an orderly shutdown (`fi_shutdown`).
    pub fn shutdown(&mut self) {
        if !self.ep.is_null() {
            // SAFETY: the endpoint is open.
            unsafe { sys::fi_shutdown(self.ep, 0) };
        }
    }

    fn close_ep(&mut self) {
        if !self.ep.is_null() {
            // SAFETY: the endpoint is open and closed once; afterwards the
            // provider uses none of its buffers or contexts.
            unsafe { sys::fi_close(&mut (*self.ep).fid) };
            self.ep = ptr::null_mut();
        }
    }

    /// Closes the endpoint, then ends every send: the completed ones not yet
    /// reported, then the cancelled ones (keys in send order).
    pub fn close(mut self) -> (Vec<u64>, Vec<u64>) {
        self.close_ep();
        let ended = self.ledger.cancel_all();
        let keys = |v: Vec<(u64, TxOp)>| v.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        (keys(ended.completed), keys(ended.cancelled))
    }
}

/// `true` if fabric provider `provider` offers connected endpoints
/// (`FI_EP_MSG` with `FI_MSG`) on this machine.
pub fn offers_msg(provider: &str) -> bool {
    prepare_env();
    // SAFETY: as in `Info::get`.
    let hints = unsafe { sys::fi_allocinfo() };
    if hints.is_null() {
        return false;
    }
    let hints = Info { ptr: hints };
    let Ok(name) = dup_c(provider) else {
        return false;
    };
    // SAFETY: `hints` is a valid fi_info with its attribute structs
    // allocated; the name is malloc'd (fi_freeinfo frees it).
    unsafe {
        let h = hints.ptr;
        (*h).caps = sys::FI_MSG;
        (*h).mode = SUPPORTED_MODE;
        (*(*h).ep_attr).type_ = sys::FI_EP_MSG;
        (*(*h).domain_attr).mr_mode = SUPPORTED_MR_MODE;
        (*(*h).fabric_attr).prov_name = name;
    }
    let mut out: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: no node or service; `hints` valid; `out` a valid out pointer.
    let rc = unsafe {
        sys::fi_getinfo(
            API_VERSION,
            ptr::null(),
            ptr::null(),
            0,
            hints.ptr,
            &mut out,
        )
    };
    if rc != 0 || out.is_null() {
        return false;
    }
    drop(Info { ptr: out });
    true
}

/// Turns libfabric's memory-registration cache off, once, before the first
/// call that initialises libfabric in this process, unless the environment
/// already chooses a monitor (`FI_MR_CACHE_MONITOR`) or a cache size
/// (`FI_MR_CACHE_MAX_COUNT`).
///
/// libfabric 1.17's default monitor (`memhooks`) rewrites the first bytes
/// of libc's `madvise`, `munmap`, `mmap`, `brk` and friends when the first
/// domain with a cache opens (`verbs`, `efa`), and writes the original
/// bytes back when the last one closes. A thread inside one of those
/// functions at that moment runs half-rewritten code: on `verbs;ofi_rxm`
/// the conformance suite (four test threads opening and closing domains)
/// died with SIGSEGV at `madvise+9` in a thread freeing its heap on exit,
/// or hung, in 3 of 53 runs. This crate registers its memory
/// once per connection or pool, so the cache gains it nothing.
pub(crate) fn prepare_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("FI_MR_CACHE_MAX_COUNT").is_none() {
            default_env("FI_MR_CACHE_MONITOR", "disabled");
        }
    });
}

/// Sets `name` to `value` in the environment unless it is set already, for
/// providers that read their settings from the environment when first
/// initialised. `setenv` races with other threads reading the environment:
/// `docs/libfabric.md` tells programs with threads of their own to set the
/// variables before starting them.
pub fn default_env(name: &str, value: &str) {
    if std::env::var_os(name).is_none() {
        std::env::set_var(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connected_info(provider: &str) -> Info {
        Info::get(&Query {
            provider,
            domain: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            source: true,
            tx_size: None,
            rx_size: None,
        })
        .unwrap_or_else(|e| panic!("libfabric {provider}: {e}"))
    }

    #[test]
    fn copy_sends_are_injected_only_where_the_provider_copies_them_during_the_call() {
        // libfabric's `tcp` keeps pointers to an `fi_sendmsg`'s bytes even
        // with FI_INJECT: a copy send injected there could go out after
        // the caller's memory changed.
        assert_eq!(inject_copy_max("tcp", &connected_info("tcp")), 0);
        let sockets = connected_info("sockets");
        let max = inject_copy_max("sockets", &sockets);
        assert!(max >= 64, "sockets injects copy sends up to {max} bytes");
        assert!(max <= sockets.inject_size() && max <= INJECT_COPY_LIMIT);
    }

    #[test]
    fn receive_buffers_are_spaced_by_whole_cache_lines_and_pages_from_a_page_up() {
        assert_eq!(recv_stride(1), Some(64));
        assert_eq!(recv_stride(64), Some(64));
        assert_eq!(recv_stride(65), Some(128));
        assert_eq!(recv_stride(4095), Some(4096));
        assert_eq!(recv_stride(4096), Some(4096));
        assert_eq!(recv_stride((1 << 20) + 1), Some((1 << 20) + 4096));
        assert_eq!(recv_stride(usize::MAX - 10), None);
    }

    #[test]
    fn every_receive_buffer_starts_aligned_and_holds_its_size() {
        let info = Info::get_rdm("shm", None, None, None).expect("libfabric shm");
        let domain = Domain::open(&info).expect("domain");
        for (size, align) in [(100, 64), ((1 << 20) + 1, PAGE)] {
            let mem = RecvMem::new(&domain, size, 3).expect("receive memory");
            assert_eq!(mem.size, size);
            assert_eq!(
                mem.mem.ptr as usize % PAGE,
                0,
                "the allocation starts a page"
            );
            for i in 0..3 {
                let p = mem.buffer_ptr(i) as usize;
                assert_eq!(p % align, 0, "buffer {i} of {size} B at {p:#x}");
                assert_eq!(mem.bytes(i, usize::MAX).len(), size);
                if i > 0 {
                    assert!(
                        p - mem.buffer_ptr(i - 1) as usize >= size,
                        "buffers overlap"
                    );
                }
            }
        }
    }
}
