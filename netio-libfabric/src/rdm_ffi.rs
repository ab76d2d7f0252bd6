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
//! context), in a table keyed by the context's address. An entry leaves the
//! table only when its completion is read, or when the endpoint is closed
//! (`Drop` closes the endpoint before the table is freed).

use std::collections::HashMap;
use std::ffi::c_void;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use netio_core::ledger::SendSeq;
use netio_core::{Lent, MemoryRegion, NetworkBuffer};
use netio_libfabric_sys as sys;

use crate::ffi::{
    check, trywait, wait_fd, Domain, FastMap, FiError, Info, Mr, Pooled, PostError, RecvMem,
};

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
        ctx: Box<sys::fi_context2>,
        mem: Arc<RecvMem>,
        index: usize,
        owner: u64,
    },
    Send {
        ctx: Box<sys::fi_context2>,
        _keep: Arc<TxKeep>,
        owner: u64,
        seq: Option<SendSeq>,
        dest: sys::fi_addr_t,
    },
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
        /// The memory the buffer is in: the reference the receive held,
        /// handed on (to keep it while the message is read).
        mem: Arc<RecvMem>,
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
    /// A receive ended without a message (cancelled, or an error). Its
    /// fields are for the record (`Debug`): the connection manager takes
    /// no action on it.
    #[allow(dead_code)]
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

/// A reliable-datagram endpoint with its completion queue and address
/// vector, and every operation it holds.
pub struct RdmEp {
    ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    cq_fd: Option<RawFd>,
    // Freed after the endpoint is closed (Drop).
    ops: FastMap<usize, Op>,
    /// Peer addresses in the address vector, by address and by handle.
    /// An address leaves the vector once nothing uses it: fabrics hold a
    /// bounded number of peers (`shm`: 256), so a long-lived endpoint
    /// must not keep every peer it ever had.
    peers: HashMap<Vec<u8>, sys::fi_addr_t>,
    peer_uses: HashMap<sys::fi_addr_t, Peer>,
    /// Whether unused addresses leave the address vector ([`av_remove`]).
    av_remove: bool,
    name: Vec<u8>,
    iov_limit: usize,
    max_msg: usize,
    /// The largest message sent by injection (see [`RdmEp::inject`]).
    inject_max: usize,
    /// Where the parts of an injected message are gathered.
    gather: Vec<u8>,
    /// Operation contexts of operations that ended, taken by the next
    /// ones (boxed: a context's address is its operation's while posted).
    #[allow(clippy::vec_box)]
    ctx_pool: Vec<Box<sys::fi_context2>>,
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
            let recvs: Vec<usize> = self
                .ops
                .iter()
                .filter(|(_, op)| matches!(op, Op::Recv { .. }))
                .map(|(k, _)| *k)
                .collect();
            for key in recvs {
                // SAFETY: the endpoint is open and `key` is the context of
                // a receive it holds.
                unsafe { sys::fi_cancel(&mut (*self.ep).fid, key as *mut c_void) };
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
            std::mem::forget(std::mem::take(&mut self.ops));
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

/// How long dropping an endpoint waits for its operations to end.
const CLOSE_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

fn zeroed_ctx() -> Box<sys::fi_context2> {
    // SAFETY: fi_context2 is plain data; zeroed is a valid value.
    Box::new(unsafe { std::mem::zeroed::<sys::fi_context2>() })
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
            ops: FastMap::default(),
            peers: HashMap::new(),
            peer_uses: HashMap::new(),
            av_remove: av_remove(&info.prov_name()),
            name: Vec::new(),
            iov_limit: info.iov_limit(),
            max_msg: info.max_msg_size(),
            inject_max: inject_max(&info),
            gather: Vec::new(),
            ctx_pool: Vec::new(),
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
        if addr.is_empty() {
            return Err(FiError {
                call: "fi_av_insert (empty address)",
                errno: sys::FI_EINVAL,
            });
        }
        let mut out: sys::fi_addr_t = sys::FI_ADDR_NOTAVAIL;
        // SAFETY: the AV is open; `addr` holds one address of the
        // provider's format (a peer's fi_getname; a malformed one is
        // rejected by the provider), `out` one handle.
        let rc = unsafe {
            sys::fi_av_insert(
                self.av,
                addr.as_ptr().cast::<c_void>(),
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
        let mut ctx = self.take_ctx();
        let key = (&mut *ctx as *mut sys::fi_context2) as usize;
        mem.posted[index].store(true, Ordering::Release);
        // SAFETY: buffer `index` lies inside `mem` (checked), is not posted
        // elsewhere, and `mem` and `ctx` are kept in `ops` until the
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
                key as *mut c_void,
            )
        };
        if rc < 0 {
            mem.posted[index].store(false, Ordering::Release);
            return Err(FiError::new("fi_trecv", rc));
        }
        self.ops.insert(
            key,
            Op::Recv {
                ctx,
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
        for (&key, op) in &self.ops {
            if let Op::Recv { owner: o, .. } = op {
                if *o == owner {
                    // SAFETY: the endpoint is open and `key` is the
                    // context of a receive it holds.
                    unsafe { sys::fi_cancel(&mut (*self.ep).fid, key as *mut c_void) };
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

    /// A cleared operation context: one of an operation that ended, or a
    /// new one.
    fn take_ctx(&mut self) -> Box<sys::fi_context2> {
        match self.ctx_pool.pop() {
            Some(mut ctx) => {
                // SAFETY: fi_context2 is plain data; zeroed is a valid value.
                *ctx = unsafe { std::mem::zeroed::<sys::fi_context2>() };
                ctx
            }
            None => zeroed_ctx(),
        }
    }

    /// The largest message [`inject`](Self::inject) sends; 0 when the
    /// provider has no injection.
    pub fn inject_max(&self) -> usize {
        self.inject_max
    }

    /// Sends `header` then `parts` (`inject_max` bytes at most in all) to
    /// `dest` with `tag` by injection: the provider copies them before it
    /// returns and writes no completion, so the send is complete when this
    /// returns `Ok`. No registration and no operation context are needed.
    pub fn inject(
        &mut self,
        dest: sys::fi_addr_t,
        tag: u64,
        parts: &[&[u8]],
        header: &[u8],
    ) -> Result<(), PostError> {
        let total = header.len() + parts.iter().map(|p| p.len()).sum::<usize>();
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
        let mut ctx = self.take_ctx();
        let key = (&mut *ctx as *mut sys::fi_context2) as usize;
        let iov = &staged.iov;
        let rc = if iov.len() == 1 {
            // SAFETY: the endpoint is open; the memory is owned by
            // `staged.keep` (registered, descriptor given), kept with `ctx`
            // in `ops` until the completion is read or the endpoint is
            // closed.
            unsafe {
                sys::fi_tsend(
                    self.ep,
                    iov[0].0 as *const c_void,
                    iov[0].1,
                    iov[0].2 as *mut c_void,
                    dest,
                    tag,
                    key as *mut c_void,
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
                    key as *mut c_void,
                )
            }
        };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Err((PostError::Again, staged));
        }
        if rc < 0 {
            return Err((PostError::Failed(FiError::new("fi_tsend", rc)), staged));
        }
        self.ops.insert(
            key,
            Op::Send {
                ctx,
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
                match self.ops.remove(&(e.op_context as usize)) {
                    Some(Op::Recv {
                        mem, index, owner, ..
                    }) => {
                        mem.posted[index].store(false, Ordering::Release);
                        // `shm` reports the error number negated.
                        if e.err.abs() == sys::FI_ETRUNC as i32 {
                            out.push(RdmCompletion::Truncated {
                                owner,
                                index,
                                size: (e.len as u64).saturating_add(e.olen as u64),
                            });
                        } else {
                            out.push(RdmCompletion::RecvEnded {
                                owner,
                                index,
                                errno: e.err.abs(),
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
                            errno: e.err.abs(),
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
                match self.ops.remove(&(e.op_context as usize)) {
                    Some(Op::Recv {
                        mem,
                        index,
                        owner,
                        ctx,
                    }) => {
                        // The operation ended: its context is free again.
                        self.ctx_pool.push(ctx);
                        mem.posted[index].store(false, Ordering::Release);
                        out.push(RdmCompletion::Received {
                            owner,
                            index,
                            len: e.len,
                            tag: e.tag,
                            mem,
                        });
                    }
                    Some(Op::Send {
                        owner,
                        seq,
                        ctx,
                        dest,
                        ..
                    }) => {
                        self.ctx_pool.push(ctx);
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
