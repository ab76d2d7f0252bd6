//! libfabric reliable-datagram endpoints (`FI_EP_RDM`), behind owning types
//! whose safe methods cannot cause undefined behaviour.
//!
//! One [`RdmEp`] serves every connection of a backend: one endpoint, one
//! completion queue, one address vector. Connections are told apart by
//! the tags of their messages (see `rdm::proto`), so an operation of a
//! connection may still be with the provider after the connection ended.
//! The ownership rule that keeps this sound: the endpoint owns every
//! operation the provider holds, with everything the provider may read or
//! write for it (receive memory, send memory, registrations, the operation
//! context), in a table whose slots are found from the context's address
//! by arithmetic ([`OpTable`]). An entry leaves the table only when its
//! completion is read, or when the endpoint is closed (`Drop` closes the
//! endpoint before the table is freed).

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use netio_core::ledger::SendSeq;
use netio_core::{Lent, MemoryRegion, NetworkBuffer};
use netio_libfabric_sys as sys;

use crate::ffi::{check, trywait, wait_fd, Domain, FiError, Info, Mr, Pooled, PostError, RecvMem};

/// A registration of a zero-copy region, kept by every send from it.
pub struct RegionMr {
    mr: Mr,
    region: MemoryRegion,
}

// SAFETY: a registration is a libfabric object opened with FI_THREAD_SAFE;
// it is only read (its descriptor) and closed once, by its last owner.
unsafe impl Send for RegionMr {}
// SAFETY: as above.
unsafe impl Sync for RegionMr {}

impl RegionMr {
    /// Registers `region`.
    pub fn new(domain: &Arc<Domain>, region: MemoryRegion) -> Result<Arc<RegionMr>, FiError> {
        // SAFETY: the region's memory lives as long as the clone kept next
        // to the registration, dropped after it (field order).
        let mr = unsafe { Mr::register(domain, region.as_mut_ptr(), region.len()) }?;
        Ok(Arc::new(RegionMr { mr, region }))
    }

    /// The registered region.
    pub fn region(&self) -> &MemoryRegion {
        &self.region
    }
}

/// A registration of a send pool's buffer, kept by every send of it.
pub struct BufferMr {
    mr: Mr,
}

/// A send ready to be handed to the provider: the memory it reads and
/// where in it (addresses of memory `keep` owns, stable while it lives).
pub struct Staged {
    /// (address, length, descriptor) of each segment.
    iov: Vec<(usize, usize, usize)>,
    keep: Arc<TxKeep>,
}

/// What a send keeps alive, held by the connection until its end is
/// reported: the memory is released when the provider is done with it
/// *and* the connection let go of this.
#[allow(dead_code)] // held, never read
pub enum Held {
    /// A staged send's memory, shared with its operation.
    Keep(Arc<TxKeep>),
    /// Region bytes of an injected zero-copy send: the provider copied
    /// them, but they stay lent (unwritable) until the send's completion
    /// is reported, as for any zero-copy send.
    Lent(Lent),
}

impl Staged {
    /// A handle that keeps the send's memory until dropped.
    pub fn held(&self) -> Held {
        Held::Keep(Arc::clone(&self.keep))
    }
}

impl Staged {
    /// The written bytes of `buf`, registered by `mr` (see
    /// [`RdmEp::register_buffer`]).
    pub fn buffer(buf: NetworkBuffer, mr: Arc<BufferMr>) -> Staged {
        let data = buf.as_slice();
        let iov = vec![(data.as_ptr() as usize, data.len(), mr.mr.desc as usize)];
        Staged {
            iov,
            keep: Arc::new(TxKeep::Buffer(mr, buf)),
        }
    }
}

// SAFETY: see RegionMr.
unsafe impl Send for BufferMr {}
// SAFETY: see RegionMr.
unsafe impl Sync for BufferMr {}

// SAFETY: a TxKeep is never read, only held and dropped (once, by the last
// Arc); its parts may move between threads.
unsafe impl Sync for TxKeep {}
// SAFETY: as above.
unsafe impl Send for TxKeep {}

/// What a send in flight keeps alive (held, never read).
#[allow(dead_code)]
pub enum TxKeep {
    /// A registration and the pool buffer it covers (closed before the
    /// buffer goes back to its pool: field order).
    Buffer(Arc<BufferMr>, NetworkBuffer),
    /// A copy in registered memory.
    Bounce(Pooled),
    /// Region bytes (and a copied header), with the region's registration.
    ZeroCopy(Option<Pooled>, Lent, Arc<RegionMr>),
}

enum Op {
    Recv {
        mem: Arc<RecvMem>,
        index: usize,
        owner: u64,
    },
    Send {
        _keep: Arc<TxKeep>,
        owner: u64,
        seq: Option<SendSeq>,
        dest: sys::fi_addr_t,
    },
}

/// The operations posted to an endpoint, each in a slot with the context
/// the provider was given for it.
///
/// Contexts live in chunks that never move (chunk `k` holds
/// `FIRST_CHUNK << k` of them), so the context address a completion
/// reports maps back to its slot by address arithmetic: no hashing on the
/// completion path, and no read through a pointer the provider returned.
/// A context is handed out again only after its operation's completion was
/// read (or never, once the endpoint leaks the table on close).
pub(crate) struct OpTable<T> {
    /// The contexts; the provider writes into a context while its
    /// operation is posted.
    chunks: Vec<Box<[UnsafeCell<sys::fi_context2>]>>,
    /// The operation of each slot (`None`: free, or reserved for a post in
    /// progress).
    ops: Vec<Option<T>>,
    /// Free slots below `ops.len()`.
    free: Vec<usize>,
    /// Slots holding an operation.
    live: usize,
}

/// The number of contexts of an [`OpTable`]'s first chunk.
const FIRST_CHUNK: usize = 64;

impl<T> OpTable<T> {
    pub(crate) fn new() -> Self {
        Self {
            chunks: Vec::new(),
            ops: Vec::new(),
            free: Vec::new(),
            live: 0,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The context of `slot` (below `ops.len()`).
    fn ctx(&self, mut slot: usize) -> *mut sys::fi_context2 {
        for c in &self.chunks {
            if slot < c.len() {
                return c[slot].get();
            }
            slot -= c.len();
        }
        unreachable!("a slot below ops.len() lies in a chunk")
    }

    /// The slot whose context is at `addr`, if any.
    #[inline]
    fn slot_of(&self, addr: usize) -> Option<usize> {
        let size = std::mem::size_of::<UnsafeCell<sys::fi_context2>>();
        let mut base = 0;
        for c in &self.chunks {
            let start = c.as_ptr() as usize;
            let off = addr.wrapping_sub(start);
            if off < c.len() * size {
                return (off % size == 0).then_some(base + off / size);
            }
            base += c.len();
        }
        None
    }

    /// A free slot and its context, zeroed, for an operation about to be
    /// posted: [`fill`](Self::fill) it once posted, or
    /// [`release`](Self::release) it if the post failed.
    pub(crate) fn reserve(&mut self) -> (usize, *mut c_void) {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let capacity: usize = self.chunks.iter().map(|c| c.len()).sum();
                if self.ops.len() == capacity {
                    let n = FIRST_CHUNK << self.chunks.len();
                    // SAFETY: fi_context2 is plain data; zeroed is a valid
                    // value.
                    let zero =
                        || UnsafeCell::new(unsafe { std::mem::zeroed::<sys::fi_context2>() });
                    self.chunks.push((0..n).map(|_| zero()).collect());
                }
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        let ctx = self.ctx(slot);
        // SAFETY: the slot is free, so the provider holds no pointer to its
        // context and nothing else refers to it; fi_context2 is plain data.
        unsafe { ctx.write(std::mem::zeroed::<sys::fi_context2>()) };
        (slot, ctx.cast::<c_void>())
    }

    /// Records the operation posted with `slot`'s context.
    pub(crate) fn fill(&mut self, slot: usize, op: T) {
        debug_assert!(self.ops[slot].is_none());
        self.ops[slot] = Some(op);
        self.live += 1;
    }

    /// Frees a slot [`reserve`](Self::reserve)d for a post that failed.
    pub(crate) fn release(&mut self, slot: usize) {
        self.free.push(slot);
    }

    /// Takes the operation whose completion reported context `ctx`, freeing
    /// its slot; `None` for a context that is not one of this table's
    /// operations.
    #[inline]
    pub(crate) fn take(&mut self, ctx: *mut c_void) -> Option<T> {
        self.take_if(ctx, |_| true)
    }

    /// [`take`](Self::take), if the operation is one that `wanted` accepts
    /// (otherwise left in place).
    #[inline]
    fn take_if(&mut self, ctx: *mut c_void, wanted: impl FnOnce(&T) -> bool) -> Option<T> {
        let slot = self.slot_of(ctx as usize)?;
        let entry = self.ops.get_mut(slot)?;
        if !wanted(entry.as_ref()?) {
            return None;
        }
        let op = entry.take()?;
        self.live -= 1;
        self.free.push(slot);
        Some(op)
    }

    /// Each operation with its context.
    fn iter(&self) -> impl Iterator<Item = (*mut c_void, &T)> + '_ {
        self.ops
            .iter()
            .enumerate()
            .filter_map(|(slot, op)| op.as_ref().map(|op| (self.ctx(slot).cast::<c_void>(), op)))
    }
}

/// A peer address in the address vector: who uses it.
struct Peer {
    /// The address as inserted (the key of `RdmEp::peers`).
    name: Vec<u8>,
    /// Successful [`RdmEp::insert`]s not yet [`RdmEp::release`]d.
    users: u32,
    /// Sends to it whose completion has not been read.
    sends: u32,
}

/// One completion of the endpoint's queue.
#[derive(Debug, Clone)]
pub enum RdmCompletion {
    /// Buffer `index` of `owner`'s receive memory holds a message of `len`
    /// bytes sent with `tag`.
    Received {
        /// The connection that posted the buffer.
        owner: u64,
        /// Buffer index.
        index: usize,
        /// Message length.
        len: usize,
        /// The sender's tag.
        tag: u64,
    },
    /// A message did not fit buffer `index` of `owner`: `size` bytes in
    /// all (0: not reported).
    Truncated {
        /// The connection that posted the buffer.
        owner: u64,
        /// Buffer index.
        index: usize,
        /// The message's full size, as far as the provider reports it.
        size: u64,
    },
    /// A receive ended without a message (cancelled, or an error).
    RecvEnded {
        /// The connection that posted the buffer.
        owner: u64,
        /// Buffer index.
        index: usize,
        /// The positive error number.
        errno: i32,
    },
    /// A send completed.
    Sent {
        /// The sending connection.
        owner: u64,
        /// Its ledger entry (`None`: a send of the connection layer).
        seq: Option<SendSeq>,
    },
    /// A send failed.
    SendFailed {
        /// The sending connection.
        owner: u64,
        /// Its ledger entry (`None`: a send of the connection layer).
        seq: Option<SendSeq>,
        /// The positive error number.
        errno: i32,
    },
}

/// What [`RdmEp::poll_single`] read.
pub enum Polled {
    /// Nothing.
    Empty,
    /// Exactly one completion, a message (the fields of
    /// [`RdmCompletion::Received`]), not put in the list.
    Message {
        /// The connection that posted the buffer.
        owner: u64,
        /// Buffer index.
        index: usize,
        /// Message length.
        len: usize,
        /// The sender's tag.
        tag: u64,
        /// The memory the buffer is in.
        mem: Arc<RecvMem>,
    },
    /// Anything else, put in the list as [`RdmEp::poll`] does (`true`:
    /// something was read).
    Listed(bool),
}

/// A reliable-datagram endpoint with its completion queue and address
/// vector, and every operation it holds.
pub struct RdmEp {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    cq_fd: Option<RawFd>,
    // Freed after the endpoint is closed (Drop).
    ops: OpTable<Op>,
    /// Peer addresses in the address vector, by address and by handle.
    /// An address leaves the vector once nothing uses it: fabrics hold a
    /// bounded number of peers (`shm`: 256), so a long-lived endpoint
    /// must not keep every peer it ever had.
    peers: HashMap<Vec<u8>, sys::fi_addr_t>,
    peer_uses: HashMap<sys::fi_addr_t, Peer>,
    /// Whether unused addresses leave the address vector ([`av_remove`]).
    av_remove: bool,
    name: Vec<u8>,
    /// The address format of `name` and of every peer's address.
    addr_format: u32,
    iov_limit: usize,
    max_msg: usize,
    /// The largest message sent by injection (see [`RdmEp::inject`]).
    inject_max: usize,
    /// Where the parts of an injected message are gathered.
    gather: Vec<u8>,
    scratch: Vec<sys::fi_cq_tagged_entry>,
    // Kept until the endpoint is closed (providers keep pointers into it).
    info: Option<Info>,
    domain: Arc<Domain>,
}

// SAFETY: the raw pointers are libfabric objects owned here (opened with
// FI_THREAD_SAFE); the operations' memory is owned by `ops`.
unsafe impl Send for RdmEp {}

impl Drop for RdmEp {
    fn drop(&mut self) {
        // Operations still with the provider (receives cancelled by a
        // connection's close whose completions were not read yet, sends,
        // a set-up probe) get a moment to end before the endpoint closes:
        // libfabric 1.17's `verbs;ofi_rxm` crashed (SIGSEGV in fi_close)
        // closing an endpoint right after a connection still opening was
        // closed, and no longer does with this wait.
        if !self.ep.is_null() && !self.cq.is_null() && !self.ops.is_empty() {
            // Receives still posted end now (FI_ECANCELED), so that only
            // sends are waited for.
            let recvs: Vec<*mut c_void> = self
                .ops
                .iter()
                .filter(|(_, op)| matches!(op, Op::Recv { .. }))
                .map(|(ctx, _)| ctx)
                .collect();
            for ctx in recvs {
                // SAFETY: the endpoint is open and `ctx` is the context of
                // a receive it holds.
                unsafe { sys::fi_cancel(&mut (*self.ep).fid, ctx) };
            }
            let end = std::time::Instant::now() + CLOSE_SETTLE;
            let mut out = Vec::new();
            while !self.ops.is_empty() && std::time::Instant::now() < end {
                out.clear();
                if self.poll(&mut out).is_err() {
                    break;
                }
                if !self.ops.is_empty() {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
        }
        // SAFETY: each object was opened here and is closed once, the
        // endpoint first. Operations whose completion was never read are
        // not freed (below).
        unsafe {
            if !self.ep.is_null() {
                sys::fi_close(&mut (*self.ep).fid);
            }
            if !self.av.is_null() {
                sys::fi_close(&mut (*self.av).fid);
            }
            if !self.cq.is_null() {
                sys::fi_close(&mut (*self.cq).fid);
            }
        }
        // An operation still unended after the wait may yet be written to
        // by the fabric (an RDMA read of a rendezvous message landing in a
        // receive buffer, a context the provider keeps on a list): its
        // context and memory are leaked rather than handed back to the
        // allocator. This happens only when a send to an unresponsive peer
        // outlives the wait.
        if !self.ops.is_empty() {
            std::mem::forget(std::mem::replace(&mut self.ops, OpTable::new()));
        }
    }
}

/// The largest message sent by injection whatever the provider offers
/// (the gathering buffer's largest size).
const INJECT_LIMIT: usize = 4096;

/// The largest message sent by injection on `info`'s fabric provider: 0
/// (never) unless an injected message is in the peer's memory when the
/// call returns.
///
/// Injection reports no completion, so its key completes at once; where
/// the provider may keep the message in a queue of its own for a while
/// (`tcp;ofi_rxm`, `sockets`, `udp;ofi_rxd`, `verbs;ofi_rxm`: written to a
/// socket or retransmitted later), closing the endpoint in that window
/// would drop a message already reported completed, and nothing tells
/// when the window ends. `shm` writes it into the receiver's command
/// queue (or answers `-FI_EAGAIN`) before the call returns.
fn inject_max(info: &Info) -> usize {
    if info.prov_name() == "shm" {
        info.inject_size().min(INJECT_LIMIT)
    } else {
        0
    }
}

/// Whether addresses nothing uses any more leave the address vector on
/// fabric provider `prov`. They do, except where libfabric 1.17's removal
/// misbehaves and the provider holds no fixed number of peers:
/// `udp;ofi_rxd` keeps the removed address in its lookup map (inserting it
/// again, for a new peer on a recycled UDP port, gives a handle that
/// reaches nobody), and `sockets` leaves its connection to the peer open
/// (two descriptors per removal when the same peer comes back).
fn av_remove(prov: &str) -> bool {
    !(prov.ends_with("ofi_rxd") || prov == "sockets")
}

/// A name for an `shm` endpoint that no other endpoint, live or dead, has
/// had: `fi_shm://netio-<pid>-<random>-<n>`.
///
/// libfabric 1.17 names an `shm` endpoint `<pid>:<uid>:<n>` (the n-th of
/// the process) and creates a file of that name in `/dev/shm` (16 MiB by
/// default), which a process that ends without closing its endpoints
/// (killed, or crashed) leaves behind. A later process that gets the same
/// process id (they wrap at `kernel.pid_max`, 32,768 by default) then
/// fails to open its n-th endpoint: libfabric finds the file, reads its
/// own process id in it and answers `fi_enable` with `-FI_EBUSY`. A random
/// part per process makes the names of two processes differ whatever
/// their ids.
fn shm_name() -> std::ffi::CString {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64;
    use std::sync::OnceLock;
    static NONCE: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nonce = *NONCE.get_or_init(|| {
        // The standard library's per-process random hash keys, mixed with
        // the clock.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.finish()
    });
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("fi_shm://netio-{}-{nonce:016x}-{n}", std::process::id());
    std::ffi::CString::new(name).expect("no NUL in a formatted name")
}

/// How long dropping an endpoint waits for its operations to end.
const CLOSE_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// The longest fabric address a peer may announce, in bytes: above every
/// provider's (a `sockaddr_storage` is 128, `shm`'s names at most 256).
const ADDR_MAX: usize = 512;
/// The size of the zeroed buffer a peer's address is copied into for
/// `fi_av_insert` (see [`padded_addr`]).
const ADDR_PAD: usize = 2 * ADDR_MAX;

/// Checks a peer's fabric address (`addr`, from the network) against
/// this endpoint's own (`own`, of address format `format`) before it goes
/// to `fi_av_insert`, which takes no length and trusts what it is given:
/// an address of the same length as this endpoint's, and for socket
/// addresses of the same family; for string names (`shm`), a name of at
/// most [`ADDR_MAX`] bytes that ends with a NUL. libfabric 1.17's address
/// vector of socket addresses (`tcp;ofi_rxm`, `udp;ofi_rxd`) takes the
/// length of the first address inserted for all later ones, so a single
/// address of an unknown family (length 0) from one hostile HELLO would
/// make every later insert fail, and no peer could connect again.
fn check_peer_addr(format: u32, own: &[u8], addr: &[u8]) -> Result<(), FiError> {
    let bad = |call| {
        Err(FiError {
            call,
            errno: sys::FI_EINVAL,
        })
    };
    if addr.is_empty() || addr.len() > ADDR_MAX {
        return bad("fi_av_insert (a peer's fabric address must have 1 to 512 bytes)");
    }
    match format {
        sys::FI_ADDR_STR if !addr.contains(&0) => {
            bad("fi_av_insert (a peer's fabric name must end with a NUL)")
        }
        sys::FI_ADDR_STR => Ok(()),
        _ if addr.len() != own.len() => {
            bad("fi_av_insert (a peer's fabric address differs in length from this endpoint's)")
        }
        // `sa_family` leads every socket address.
        sys::FI_SOCKADDR | sys::FI_SOCKADDR_IN | sys::FI_SOCKADDR_IN6 | sys::FI_SOCKADDR_IB
            if addr.get(..2) != own.get(..2) =>
        {
            bad("fi_av_insert (a peer's socket address is of another family than this endpoint's)")
        }
        _ => Ok(()),
    }
}

/// A peer's fabric address (`addr`, at most [`ADDR_MAX`] bytes, from the
/// network) in a zeroed buffer of [`ADDR_PAD`] bytes, for providers that
/// read a fixed length or up to a NUL from it.
fn padded_addr(addr: &[u8]) -> Box<[u8; ADDR_PAD]> {
    let mut padded = Box::new([0u8; ADDR_PAD]);
    padded[..addr.len()].copy_from_slice(addr);
    padded
}

impl RdmEp {
    /// Opens an endpoint for `info` (from [`Info::get_rdm`]) on `domain`
    /// with a completion queue of `cq_size` entries (with a wait fd if
    /// `with_fd` and the provider has one) and a table address vector.
    pub fn open(
        domain: &Arc<Domain>,
        info: Info,
        cq_size: usize,
        with_fd: bool,
    ) -> Result<RdmEp, FiError> {
        let mut this = RdmEp {
            ep: ptr::null_mut(),
            cq: ptr::null_mut(),
            av: ptr::null_mut(),
            cq_fd: None,
            ops: OpTable::new(),
            peers: HashMap::new(),
            peer_uses: HashMap::new(),
            av_remove: av_remove(&info.prov_name()),
            name: Vec::new(),
            addr_format: info.addr_format(),
            iov_limit: info.iov_limit(),
            max_msg: info.max_msg_size(),
            inject_max: inject_max(&info),
            gather: Vec::new(),
            scratch: Vec::with_capacity(64),
            info: None,
            domain: Arc::clone(domain),
        };
        // With `with_fd`, a wait fd where the provider has one
        // (`tcp;ofi_rxm`, `sockets`); `shm` refuses FI_WAIT_FD and
        // `udp;ofi_rxd` gives no fd: their queue is read without one (see
        // `fd`). A busy-polling loop reads the queue without one in any
        // case (no epoll instance behind it to keep up to date).
        let wait_objs: &[_] = if with_fd {
            &[sys::FI_WAIT_FD, sys::FI_WAIT_NONE]
        } else {
            &[sys::FI_WAIT_NONE]
        };
        for &wait_obj in wait_objs {
            let mut cq_attr = sys::fi_cq_attr {
                size: cq_size,
                format: sys::FI_CQ_FORMAT_TAGGED,
                wait_obj,
                ..Default::default()
            };
            // SAFETY: the domain is open; attr and out pointer valid.
            let rc =
                unsafe { sys::fi_cq_open(domain.ptr, &mut cq_attr, &mut this.cq, ptr::null_mut()) };
            if rc != 0 && wait_obj == sys::FI_WAIT_FD {
                continue;
            }
            check("fi_cq_open", rc)?;
            if wait_obj == sys::FI_WAIT_FD {
                // SAFETY: the CQ is open.
                this.cq_fd = wait_fd(unsafe { &mut (*this.cq).fid }).ok();
            }
            break;
        }
        let mut av_attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            ..Default::default()
        };
        // SAFETY: the domain is open; attr and out pointer valid.
        let rc =
            unsafe { sys::fi_av_open(domain.ptr, &mut av_attr, &mut this.av, ptr::null_mut()) };
        check("fi_av_open", rc)?;
        // SAFETY: domain open, info valid, out pointer valid.
        let rc = unsafe { sys::fi_endpoint(domain.ptr, info.ptr, &mut this.ep, ptr::null_mut()) };
        check("fi_endpoint", rc)?;
        if info.prov_name() == "shm" {
            let name = shm_name();
            let bytes = name.as_bytes_with_nul();
            // SAFETY: the endpoint is open and not enabled yet; `shm`
            // copies the NUL-terminated name, `bytes.len()` long.
            let rc = unsafe {
                sys::fi_setname(
                    &mut (*this.ep).fid,
                    bytes.as_ptr().cast_mut().cast::<c_void>(),
                    bytes.len(),
                )
            };
            check("fi_setname", rc)?;
        }
        this.info = Some(info);
        // SAFETY: endpoint, CQ and AV are open.
        unsafe {
            check(
                "fi_ep_bind(av)",
                sys::fi_ep_bind(this.ep, &mut (*this.av).fid, 0),
            )?;
            check(
                "fi_ep_bind(cq)",
                sys::fi_ep_bind(
                    this.ep,
                    &mut (*this.cq).fid,
                    sys::FI_TRANSMIT | sys::FI_RECV,
                ),
            )?;
            check("fi_enable", sys::fi_enable(this.ep))?;
        }
        this.name = this.getname()?;
        Ok(this)
    }

    fn getname(&self) -> Result<Vec<u8>, FiError> {
        let mut len = 0usize;
        // SAFETY: the endpoint is open; a zero length asks for the size.
        let rc = unsafe { sys::fi_getname(&mut (*self.ep).fid, ptr::null_mut(), &mut len) };
        if rc != 0 && rc != -(sys::FI_ETOOSMALL as i32) {
            check("fi_getname", rc)?;
        }
        let mut buf = vec![0u8; len.max(1)];
        let mut len = buf.len();
        // SAFETY: `buf` has `len` writable bytes.
        let rc = unsafe {
            sys::fi_getname(
                &mut (*self.ep).fid,
                buf.as_mut_ptr().cast::<c_void>(),
                &mut len,
            )
        };
        check("fi_getname", rc)?;
        buf.truncate(len);
        Ok(buf)
    }

    /// The endpoint's own fabric address, for peers to insert.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The completion queue's wait fd; `None` for a provider without one,
    /// whose queue must be read without waiting for readiness.
    pub fn fd(&self) -> Option<RawFd> {
        self.cq_fd
    }

    /// `true` if the loop may sleep on the completion queue's fd.
    pub fn trywait(&self) -> bool {
        // SAFETY: taking the address of the open CQ's fid.
        trywait(&self.domain.fabric, unsafe { &mut (*self.cq).fid })
    }

    /// The domain the endpoint is open on.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The largest message the endpoint sends.
    pub fn max_msg_size(&self) -> usize {
        self.max_msg
    }

    /// The fabric address handle of a peer's raw address, inserting it
    /// into the address vector the first time. Handles stay valid while
    /// the endpoint is open.
    /// Each successful call is answered by one [`RdmEp::release`] of the
    /// handle once the caller is done with the peer.
    pub fn insert(&mut self, addr: &[u8]) -> Result<sys::fi_addr_t, FiError> {
        if let Some(&a) = self.peers.get(addr) {
            if let Some(p) = self.peer_uses.get_mut(&a) {
                p.users += 1;
            }
            return Ok(a);
        }
        check_peer_addr(self.addr_format, &self.name, addr)?;
        let padded = padded_addr(addr);
        let mut out: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: the AV is open and `out` is one handle. `fi_av_insert`
        // takes no length: the provider reads as many bytes as its
        // address format has, or up to a NUL (`shm`'s names). `padded`
        // holds the peer's bytes followed by at least `ADDR_PAD -
        // ADDR_MAX` zero bytes, more than any provider's address, so the
        // read stays inside it whatever the peer sent (a short address is
        // rejected or taken as another address, never read past).
        let rc = unsafe {
            sys::fi_av_insert(
                self.av,
                padded.as_ptr().cast::<c_void>(),
                1,
                &mut out,
                0,
                ptr::null_mut(),
            )
        };
        if rc != 1 || out == sys::FI_ADDR_NOTAVAIL {
            return Err(FiError {
                call: "fi_av_insert",
                errno: if rc < 0 { -rc } else { sys::FI_EINVAL },
            });
        }
        self.peers.insert(addr.to_vec(), out);
        self.peer_uses.insert(
            out,
            Peer {
                name: addr.to_vec(),
                users: 1,
                sends: 0,
            },
        );
        Ok(out)
    }

    /// Gives back one use of `addr` (from [`RdmEp::insert`]). The address
    /// leaves the address vector when nothing uses it any more: no
    /// insert holds it and no send to it is unfinished (else when the last
    /// such send's completion is read).
    pub fn release(&mut self, addr: sys::fi_addr_t) {
        let Some(p) = self.peer_uses.get_mut(&addr) else {
            return;
        };
        p.users = p.users.saturating_sub(1);
        self.remove_if_unused(addr);
    }

    fn remove_if_unused(&mut self, addr: sys::fi_addr_t) {
        let Some(p) = self.peer_uses.get(&addr) else {
            return;
        };
        if p.users > 0 || p.sends > 0 || !self.av_remove {
            return;
        }
        let p = self.peer_uses.remove(&addr).expect("present");
        self.peers.remove(&p.name);
        let mut a = addr;
        // SAFETY: the AV is open and `a` is one of its handles, inserted
        // here and removed once; no operation to it is unfinished.
        let rc = unsafe { sys::fi_av_remove(self.av, &mut a, 1, 0) };
        // A failure leaves the entry in the vector; the next insert of the
        // address adds it again, or fails as it would have without the
        // removal.
        let _ = rc;
    }

    /// Counts a send to `dest` handed to the provider.
    fn send_started(&mut self, dest: sys::fi_addr_t) {
        if let Some(p) = self.peer_uses.get_mut(&dest) {
            p.sends += 1;
        }
    }

    /// Counts the end of a send to `dest` (its completion read).
    fn send_ended(&mut self, dest: sys::fi_addr_t) {
        if let Some(p) = self.peer_uses.get_mut(&dest) {
            p.sends = p.sends.saturating_sub(1);
            if p.users == 0 {
                self.remove_if_unused(dest);
            }
        }
    }

    /// Posts buffer `index` of `mem` for messages whose tag equals `tag`
    /// outside the bits of `ignore`, on behalf of `owner`.
    pub fn post_recv(
        &mut self,
        mem: &Arc<RecvMem>,
        index: usize,
        tag: u64,
        ignore: u64,
        owner: u64,
    ) -> Result<(), FiError> {
        if index >= mem.count() || mem.posted[index].load(Ordering::Acquire) {
            return Err(FiError {
                call: "fi_trecv (no such buffer, or posted already)",
                errno: sys::FI_EINVAL,
            });
        }
        let (slot, ctx) = self.ops.reserve();
        mem.posted[index].store(true, Ordering::Release);
        // SAFETY: buffer `index` lies inside `mem` (checked), is not posted
        // elsewhere, and `mem` is kept in `ops` with `ctx`'s slot until the
        // completion is read or the endpoint is closed.
        let rc = unsafe {
            sys::fi_trecv(
                self.ep,
                mem.buffer_ptr(index).cast::<c_void>(),
                mem.size,
                mem.mr.desc,
                sys::FI_ADDR_UNSPEC,
                tag,
                ignore,
                ctx,
            )
        };
        if rc < 0 {
            mem.posted[index].store(false, Ordering::Release);
            self.ops.release(slot);
            return Err(FiError::new("fi_trecv", rc));
        }
        self.ops.fill(
            slot,
            Op::Recv {
                mem: Arc::clone(mem),
                index,
                owner,
            },
        );
        Ok(())
    }

    /// Asks the provider to end every receive `owner` posted; each one
    /// completes with `FI_ECANCELED` (or its message) later.
    pub fn cancel_recvs(&mut self, owner: u64) {
        for (ctx, op) in self.ops.iter() {
            if let Op::Recv { owner: o, .. } = op {
                if *o == owner {
                    // SAFETY: the endpoint is open and `ctx` is the
                    // context of a receive it holds.
                    unsafe { sys::fi_cancel(&mut (*self.ep).fid, ctx) };
                }
            }
        }
    }

    /// Copies `header` then `parts` into registered memory, ready to send.
    pub fn stage_copy(&self, parts: &[&[u8]], header: &[u8]) -> Result<Staged, FiError> {
        let (b, p, n, desc) = Pooled::copy_of(&self.domain, header, parts)?;
        Ok(Staged {
            iov: vec![(p as usize, n, desc as usize)],
            keep: Arc::new(TxKeep::Bounce(b)),
        })
    }

    /// Registers the whole storage of `buf` (a pool buffer whose storage
    /// never moves while its pool lives).
    pub fn register_buffer(&self, buf: &NetworkBuffer) -> Result<Arc<BufferMr>, FiError> {
        let p = buf.as_slice().as_ptr();
        // SAFETY: the buffer's storage belongs to its pool and never
        // moves; every send of the buffer keeps the buffer next to this
        // registration, which is closed first (TxKeep::Buffer field
        // order), and the caller keeps the pool alive while it caches the
        // registration.
        let mr = unsafe { Mr::register(&self.domain, p, buf.capacity()) }?;
        Ok(Arc::new(BufferMr { mr }))
    }

    /// The header (copied into registered memory) then the lent region
    /// bytes, ready to send without copying them when the gather limit
    /// allows (otherwise all copied).
    pub fn stage_zero_copy(
        &self,
        lent: Lent,
        header: &[u8],
        region: &Arc<RegionMr>,
    ) -> Result<Staged, FiError> {
        let chunks: Vec<&[u8]> = lent.chunks().filter(|c| !c.is_empty()).collect();
        let segments = chunks.len() + usize::from(!header.is_empty());
        if segments == 0 || segments > self.iov_limit {
            let r = self.stage_copy(&chunks, header);
            drop(chunks);
            drop(lent);
            return r;
        }
        let mut iov = Vec::with_capacity(segments);
        let head = if header.is_empty() {
            None
        } else {
            let (b, p, n, desc) = Pooled::copy_of(&self.domain, header, &[])?;
            iov.push((p as usize, n, desc as usize));
            Some(b)
        };
        for c in &chunks {
            iov.push((c.as_ptr() as usize, c.len(), region.mr.desc as usize));
        }
        drop(chunks);
        Ok(Staged {
            iov,
            keep: Arc::new(TxKeep::ZeroCopy(head, lent, Arc::clone(region))),
        })
    }

    /// The largest message [`inject`](Self::inject) sends; 0 when the
    /// provider has no injection.
    pub fn inject_max(&self) -> usize {
        self.inject_max
    }

    /// Sends `header` then `parts` (`inject_max` bytes at most in all,
    /// `total`, which the caller summed) to `dest` with `tag` by
    /// injection: the provider copies them before it returns and writes no
    /// completion, so the send is complete when this returns `Ok`. No
    /// registration and no operation context are needed.
    #[inline]
    pub fn inject(
        &mut self,
        dest: sys::fi_addr_t,
        tag: u64,
        parts: &[&[u8]],
        header: &[u8],
        total: usize,
    ) -> Result<(), PostError> {
        debug_assert_eq!(
            total,
            header.len() + parts.iter().map(|p| p.len()).sum::<usize>()
        );
        if total > self.inject_max {
            return Err(PostError::Failed(FiError::new(
                "fi_tinject",
                -(sys::FI_EMSGSIZE as isize),
            )));
        }
        let one = match (header.is_empty(), parts) {
            (true, [only]) => Some(*only),
            (false, []) => Some(header),
            (false, [[]]) => Some(header),
            _ => None,
        };
        let bytes = match one {
            Some(b) => b,
            None => {
                self.gather.clear();
                self.gather.extend_from_slice(header);
                for p in parts {
                    self.gather.extend_from_slice(p);
                }
                &self.gather[..]
            }
        };
        // SAFETY: the endpoint is open; `bytes` is valid for the call, and
        // the provider copies it before returning (that is what injection
        // means; no descriptor is needed).
        let rc = unsafe {
            sys::fi_tinject(
                self.ep,
                bytes.as_ptr().cast::<c_void>(),
                bytes.len(),
                dest,
                tag,
            )
        };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Err(PostError::Again);
        }
        if rc < 0 {
            return Err(PostError::Failed(FiError::new("fi_tinject", rc)));
        }
        Ok(())
    }

    /// Hands a staged send to the provider: to `dest` with `tag`, for
    /// `owner`, completing ledger entry `seq`. On error it comes back.
    #[allow(clippy::result_large_err)]
    pub fn post(
        &mut self,
        dest: sys::fi_addr_t,
        tag: u64,
        owner: u64,
        seq: Option<SendSeq>,
        staged: Staged,
    ) -> Result<(), (PostError, Staged)> {
        let (slot, ctx) = self.ops.reserve();
        let iov = &staged.iov;
        let rc = if iov.len() == 1 {
            // SAFETY: the endpoint is open; the memory is owned by
            // `staged.keep` (registered, descriptor given), kept in `ops`
            // with `ctx`'s slot until the completion is read or the endpoint is
            // closed.
            unsafe {
                sys::fi_tsend(
                    self.ep,
                    iov[0].0 as *const c_void,
                    iov[0].1,
                    iov[0].2 as *mut c_void,
                    dest,
                    tag,
                    ctx,
                )
            }
        } else {
            let vecs: Vec<sys::iovec> = iov
                .iter()
                .map(|&(p, n, _)| sys::iovec {
                    iov_base: p as *mut c_void,
                    iov_len: n,
                })
                .collect();
            let mut descs: Vec<*mut c_void> =
                iov.iter().map(|&(_, _, d)| d as *mut c_void).collect();
            // SAFETY: as above; `vecs` and `descs` outlive the call.
            unsafe {
                sys::fi_tsendv(
                    self.ep,
                    vecs.as_ptr(),
                    descs.as_mut_ptr(),
                    vecs.len(),
                    dest,
                    tag,
                    ctx,
                )
            }
        };
        if rc < 0 {
            self.ops.release(slot);
        }
        if rc == -(sys::FI_EAGAIN as isize) {
            return Err((PostError::Again, staged));
        }
        if rc < 0 {
            return Err((PostError::Failed(FiError::new("fi_tsend", rc)), staged));
        }
        self.ops.fill(
            slot,
            Op::Send {
                _keep: staged.keep,
                owner,
                seq,
                dest,
            },
        );
        self.send_started(dest);
        Ok(())
    }

    /// Reads every completion into `out`. Returns `true` if anything was
    /// read.
    ///
    /// A read that finds the queue empty, the common case of a busy loop,
    /// is this function alone (inlined into the caller); what was read is
    /// handled out of line.
    #[inline]
    pub fn poll(&mut self, out: &mut Vec<RdmCompletion>) -> Result<bool, FiError> {
        let rc = self.read_raw();
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(false);
        }
        self.poll_from(rc, out)
    }

    /// One `fi_cq_read` into `scratch` (emptied first), up to its capacity.
    /// [`poll`](Self::poll), except that a read that returns exactly one
    /// completion, of a receive, returns its message instead of listing it
    /// (the common case of a busy ping-pong, without the list).
    #[inline]
    pub fn poll_single(&mut self, out: &mut Vec<RdmCompletion>) -> Result<Polled, FiError> {
        let rc = self.read_raw();
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(Polled::Empty);
        }
        if rc == 1 {
            // SAFETY: fi_cq_read wrote one entry.
            unsafe { self.scratch.set_len(1) };
            let e = self.scratch[0];
            if let Some(Op::Recv { mem, index, owner }) = self
                .ops
                .take_if(e.op_context, |op| matches!(op, Op::Recv { .. }))
            {
                mem.posted[index].store(false, Ordering::Release);
                return Ok(Polled::Message {
                    owner,
                    index,
                    len: e.len,
                    tag: e.tag,
                    mem,
                });
            }
        }
        self.poll_from(rc, out).map(Polled::Listed)
    }

    #[inline]
    fn read_raw(&mut self) -> isize {
        self.scratch.clear();
        let cap = self.scratch.capacity();
        // SAFETY: the CQ is open; `scratch` has room for `cap` entries of
        // the format it was opened with (FI_CQ_FORMAT_TAGGED).
        unsafe { sys::fi_cq_read(self.cq, self.scratch.as_mut_ptr().cast::<c_void>(), cap) }
    }

    /// [`poll`](Self::poll) after a first read that returned `rc`.
    #[inline(never)]
    fn poll_from(&mut self, mut rc: isize, out: &mut Vec<RdmCompletion>) -> Result<bool, FiError> {
        let cap = self.scratch.capacity();
        let mut any = false;
        let mut first = true;
        loop {
            if !std::mem::take(&mut first) {
                rc = self.read_raw();
            }
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
                match self.ops.take(e.op_context) {
                    Some(Op::Recv { mem, index, owner }) => {
                        mem.posted[index].store(false, Ordering::Release);
                        // `shm` reports the error number negated.
                        if e.err.saturating_abs() == sys::FI_ETRUNC as i32 {
                            out.push(RdmCompletion::Truncated {
                                owner,
                                index,
                                size: (e.len as u64).saturating_add(e.olen as u64),
                            });
                        } else {
                            out.push(RdmCompletion::RecvEnded {
                                owner,
                                index,
                                errno: e.err.saturating_abs(),
                            });
                        }
                    }
                    Some(Op::Send {
                        owner, seq, dest, ..
                    }) => {
                        self.send_ended(dest);
                        out.push(RdmCompletion::SendFailed {
                            owner,
                            seq,
                            errno: e.err.saturating_abs(),
                        })
                    }
                    _ => {}
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
                match self.ops.take(e.op_context) {
                    Some(Op::Recv { mem, index, owner }) => {
                        mem.posted[index].store(false, Ordering::Release);
                        out.push(RdmCompletion::Received {
                            owner,
                            index,
                            len: e.len,
                            tag: e.tag,
                        });
                    }
                    Some(Op::Send {
                        owner, seq, dest, ..
                    }) => {
                        self.send_ended(dest);
                        out.push(RdmCompletion::Sent { owner, seq })
                    }
                    _ => {}
                }
            }
            if n < cap {
                return Ok(any);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn posted(t: &mut OpTable<u32>, op: u32) -> *mut c_void {
        let (slot, ctx) = t.reserve();
        t.fill(slot, op);
        ctx
    }

    /// A peer's address of any length up to the limit is followed by
    /// zeros well past every provider's address size: a one-byte address
    /// (or a name without its NUL) cannot make the provider read beyond
    /// the buffer it is handed.
    #[test]
    fn a_peer_address_is_handed_over_zero_padded_past_every_providers_address_size() {
        for addr in [vec![7u8], vec![b'x'; 16], vec![0xffu8; ADDR_MAX]] {
            let p = padded_addr(&addr);
            assert_eq!(&p[..addr.len()], &addr[..]);
            assert!(
                p[addr.len()..].iter().all(|&b| b == 0),
                "zeros after the address"
            );
            assert!(p.len() - addr.len() >= 512, "at least 512 bytes of padding");
        }
    }

    /// A peer's address reaches `fi_av_insert` only when it looks like
    /// this endpoint's own: a socket address of the same length and
    /// family, a name that ends with a NUL, any other format's address of
    /// the same length.
    #[test]
    fn a_peer_address_unlike_this_endpoints_own_is_refused_before_the_address_vector() {
        let mut v4 = vec![0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        let mut v6 = vec![0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        let mut v4_peer = v4.clone();
        v4_peer[4..8].copy_from_slice(&[127, 0, 0, 2]);
        for format in [sys::FI_SOCKADDR, sys::FI_SOCKADDR_IN] {
            assert!(check_peer_addr(format, &v4, &v4_peer).is_ok());
            for bad in [&b"x"[..], &[0xff; 16][..], &v6[..], &v4[..15], &[][..]] {
                let e = check_peer_addr(format, &v4, bad).expect_err("refused");
                assert_eq!(e.errno, sys::FI_EINVAL, "{bad:?}: {}", e.call);
            }
        }
        let mut v6_other_family = v6.clone();
        v6_other_family[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        assert!(check_peer_addr(sys::FI_SOCKADDR_IN6, &v6, &v6).is_ok());
        assert!(check_peer_addr(sys::FI_SOCKADDR_IN6, &v6, &v6_other_family).is_err());
        let own = b"fi_ns://1234:0\0".to_vec();
        assert!(check_peer_addr(sys::FI_ADDR_STR, &own, b"another, longer name\0").is_ok());
        assert!(
            check_peer_addr(sys::FI_ADDR_STR, &own, &[b'x'; 16]).is_err(),
            "no NUL"
        );
        assert!(
            check_peer_addr(sys::FI_ADDR_STR, &own, &[0; ADDR_MAX + 1]).is_err(),
            "too long"
        );
        let raw = [9u8; 32];
        assert!(check_peer_addr(sys::FI_ADDR_EFA, &raw, &[1u8; 32]).is_ok());
        assert!(check_peer_addr(sys::FI_ADDR_EFA, &raw, &[1u8; 31]).is_err());
    }

    #[test]
    fn an_operation_table_finds_each_operation_by_its_context_across_chunks() {
        let mut t = OpTable::new();
        let n = FIRST_CHUNK * 7 + 5; // four chunks
        let ctxs: Vec<*mut c_void> = (0..n as u32).map(|i| posted(&mut t, i)).collect();
        assert_eq!(t.chunks.len(), 4);
        let mut seen: Vec<*mut c_void> = ctxs.clone();
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen.len(),
            n,
            "every posted operation has a context of its own"
        );
        assert_eq!(t.iter().count(), n);
        // Taken in an order unlike the posting order.
        for (i, &ctx) in ctxs.iter().enumerate().rev() {
            assert_eq!(t.take(ctx), Some(i as u32));
            assert_eq!(t.take(ctx), None, "a completion is taken once");
        }
        assert!(t.is_empty());
    }

    #[test]
    fn an_operation_table_ignores_contexts_that_are_not_its_own() {
        let mut t = OpTable::new();
        let ctx = posted(&mut t, 1);
        let mut other = 0u64;
        let size = std::mem::size_of::<sys::fi_context2>();
        assert_eq!(t.take(ptr::null_mut()), None);
        assert_eq!(t.take((&mut other as *mut u64).cast()), None);
        assert_eq!(
            t.take(ctx.cast::<u8>().wrapping_add(1).cast()),
            None,
            "inside a context"
        );
        assert_eq!(
            t.take(ctx.cast::<u8>().wrapping_add(size).cast()),
            None,
            "a free context of the chunk"
        );
        assert_eq!(
            t.take(ctx.cast::<u8>().wrapping_sub(size).cast()),
            None,
            "before the chunk"
        );
        assert_eq!(t.take(ctx), Some(1));
    }

    #[test]
    fn an_operation_table_reuses_a_context_only_after_its_completion_and_zeroes_it() {
        let mut t = OpTable::new();
        let a = posted(&mut t, 1);
        // The provider's use of the context while the operation is posted.
        // SAFETY: the context is the table's and is not referenced
        // elsewhere in this test.
        unsafe {
            a.cast::<u8>()
                .write_bytes(0xab, std::mem::size_of::<sys::fi_context2>())
        };
        let b = posted(&mut t, 2);
        assert_ne!(a, b, "a posted operation's context is not handed out");
        let (slot, failed) = t.reserve();
        t.release(slot);
        assert_eq!(
            t.take(failed),
            None,
            "a post that failed leaves no operation"
        );
        assert_eq!(t.take(a), Some(1));
        let again = posted(&mut t, 3);
        assert_eq!(again, a, "the freed context is taken next");
        // SAFETY: as above.
        let bytes = unsafe {
            std::slice::from_raw_parts(again.cast::<u8>(), std::mem::size_of::<sys::fi_context2>())
        };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "a context is zeroed before reuse"
        );
        assert_eq!(t.take(b), Some(2));
        assert_eq!(t.take(again), Some(3));
        assert!(t.is_empty());
    }
}
