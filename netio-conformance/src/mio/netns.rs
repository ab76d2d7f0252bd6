//! A private network namespace for the threads of one test (Linux), whose
//! loopback traffic can be cut off and let through again.
//!
//! A network namespace belongs to a thread, and threads inherit the one of
//! the thread that starts them. [`Netns::enter`] moves the calling thread
//! into a fresh namespace (`unshare(CLONE_NEWNET)`, which needs
//! `CAP_SYS_ADMIN`) and brings its loopback interface up: every socket that
//! thread, or a thread it starts afterwards, creates lives there, and
//! loopback is the only interface.
//!
//! [`Netns::cut`] attaches a two-instruction XDP program that drops every
//! packet (`XDP_DROP`, generic mode) to that `lo`: each packet leaves its
//! sender normally and is dropped on arrival, so the senders see neither
//! an error nor a reset nor an answer, as behind a cut cable (taking `lo`
//! down instead would make IPv6 senders see "network unreachable" when
//! they route their retransmissions). [`Netns::mend`] detaches it. Loading
//! the program needs `CAP_BPF` or `CAP_SYS_ADMIN` and a kernel with BPF
//! and generic XDP.
//!
//! Dropping the value moves the thread back into the namespace it came
//! from; the private one disappears with its last socket and thread.
//!
//! This is the only module of the crate with `unsafe` code.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread::{self, ThreadId};

/// The loopback interface.
const LOOPBACK: &CStr = c"lo";

/// `BPF_PROG_LOAD` (`enum bpf_cmd`).
const BPF_PROG_LOAD: libc::c_long = 5;
/// `BPF_PROG_TYPE_XDP` (`enum bpf_prog_type`).
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `XDP_DROP` (`enum xdp_action`).
const XDP_DROP: i32 = 1;
/// `IFLA_XDP` and its nested `IFLA_XDP_FD`, `IFLA_XDP_FLAGS`
/// (`linux/if_link.h`).
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_FLAGS: u16 = 3;
/// `XDP_FLAGS_SKB_MODE`: generic XDP, which every device (lo too) has.
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `NLA_F_NESTED`.
const NLA_F_NESTED: u16 = 1 << 15;

/// The calling thread's stay in a private network namespace.
pub(crate) struct Netns {
    /// The namespace the thread was in before (to go back on drop).
    original: File,
    /// The thread that entered (only it can go back).
    thread: ThreadId,
    /// A datagram socket created inside the private namespace: interface
    /// requests on it address that namespace's interfaces, from any thread.
    ctl: OwnedFd,
    /// A route-netlink socket created inside the private namespace.
    rtnl: OwnedFd,
    /// The index of the namespace's `lo`.
    lo: i32,
    /// The loaded drop-everything XDP program, once [`Netns::cut`] made it.
    drop_all: Option<OwnedFd>,
}

impl Netns {
    /// Moves the calling thread into a fresh network namespace and brings
    /// its loopback interface up.
    pub(crate) fn enter() -> io::Result<Self> {
        let original = File::open("/proc/thread-self/ns/net")
            .map_err(|e| context(e, "opening /proc/thread-self/ns/net"))?;
        // SAFETY: unshare(CLONE_NEWNET) touches no memory of this process;
        // it only gives the calling thread a new network namespace (other
        // threads keep theirs).
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(context(
                io::Error::last_os_error(),
                "unshare(CLONE_NEWNET) (needs CAP_SYS_ADMIN, e.g. root)",
            ));
        }
        let thread = thread::current().id();
        let sockets = socket(libc::AF_INET, libc::SOCK_DGRAM, 0).and_then(|ctl| {
            Ok((
                ctl,
                socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE)?,
            ))
        });
        let (ctl, rtnl) = match sockets {
            Ok(s) => s,
            Err(e) => {
                back_to(&original);
                return Err(e);
            }
        };
        // From here on, dropping `ns` moves the thread back.
        let mut ns = Self {
            original,
            thread,
            ctl,
            rtnl,
            lo: 0,
            drop_all: None,
        };
        let mut req = ifreq_for(LOOPBACK);
        ns.ifreq(libc::SIOCGIFINDEX, &mut req, "the index of lo")?;
        // SAFETY: SIOCGIFINDEX filled the `ifru_ifindex` member.
        ns.lo = unsafe { req.ifr_ifru.ifru_ifindex };
        ns.ifreq(libc::SIOCGIFFLAGS, &mut req, "the flags of lo")?;
        // SAFETY: SIOCGIFFLAGS filled the `ifru_flags` member.
        let flags = unsafe { req.ifr_ifru.ifru_flags };
        req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
        ns.ifreq(libc::SIOCSIFFLAGS, &mut req, "bringing lo up")?;
        Ok(ns)
    }

    /// Drops every packet that arrives on the namespace's `lo` from now
    /// on, until [`Netns::mend`].
    pub(crate) fn cut(&mut self) -> io::Result<()> {
        let prog = match &self.drop_all {
            Some(p) => p.as_raw_fd(),
            None => self.drop_all.insert(load_drop_all()?).as_raw_fd(),
        };
        self.attach_xdp(prog)
            .map_err(|e| context(e, "attaching an XDP drop program to lo"))
    }

    /// Lets packets on `lo` through again.
    pub(crate) fn mend(&mut self) -> io::Result<()> {
        self.attach_xdp(-1)
            .map_err(|e| context(e, "detaching the XDP drop program from lo"))
    }

    /// An interface ioctl on the namespace's control socket.
    fn ifreq(&self, request: libc::c_ulong, req: &mut libc::ifreq, what: &str) -> io::Result<()> {
        // SAFETY: `req` is a valid, initialised ifreq naming an interface;
        // the get requests write into its union and the set requests only
        // read it. `ctl` is an open socket.
        if unsafe { libc::ioctl(self.ctl.as_raw_fd(), request as _, req as *mut libc::ifreq) } != 0
        {
            return Err(context(io::Error::last_os_error(), what));
        }
        Ok(())
    }

    /// Attaches XDP program `prog` to `lo` in generic mode (`-1`:
    /// detaches), by an `RTM_SETLINK` request, and waits for its answer.
    fn attach_xdp(&self, prog: RawFd) -> io::Result<()> {
        let mut xdp = Vec::new();
        attr(&mut xdp, IFLA_XDP_FD, &prog.to_ne_bytes());
        attr(&mut xdp, IFLA_XDP_FLAGS, &XDP_FLAGS_SKB_MODE.to_ne_bytes());
        // struct ifinfomsg: family, pad, type, index, flags, change.
        let mut body = Vec::new();
        body.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
        body.extend_from_slice(&0u16.to_ne_bytes());
        body.extend_from_slice(&self.lo.to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        body.extend_from_slice(&0u32.to_ne_bytes());
        attr(&mut body, IFLA_XDP | NLA_F_NESTED, &xdp);
        // struct nlmsghdr: len, type, flags, seq, pid.
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16;
        let mut msg = Vec::new();
        msg.extend_from_slice(&u32::try_from(16 + body.len()).unwrap().to_ne_bytes());
        msg.extend_from_slice(&libc::RTM_SETLINK.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&1u32.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        msg.extend_from_slice(&body);
        let fd = self.rtnl.as_raw_fd();
        // SAFETY: `msg` is a live buffer of `msg.len()` bytes; send only
        // reads it. An unaddressed netlink send goes to the kernel.
        let sent = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(context(io::Error::last_os_error(), "netlink send"));
        }
        let mut answer = [0u8; 4096];
        // SAFETY: `answer` is a live, writable buffer of its length.
        let n = unsafe { libc::recv(fd, answer.as_mut_ptr().cast(), answer.len(), 0) };
        if n < 0 {
            return Err(context(io::Error::last_os_error(), "netlink receive"));
        }
        let answer = &answer[..usize::try_from(n).unwrap()];
        // The answer is an NLMSG_ERROR message: nlmsghdr, then the error
        // code (0 for an acknowledgement).
        let kind = answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
        let code = answer
            .get(16..20)
            .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
        match (kind, code) {
            (Some(k), Some(0)) if i32::from(k) == libc::NLMSG_ERROR => Ok(()),
            (Some(k), Some(e)) if i32::from(k) == libc::NLMSG_ERROR => {
                Err(io::Error::from_raw_os_error(-e))
            }
            _ => Err(io::Error::other(format!(
                "unexpected netlink answer {answer:?}"
            ))),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if thread::current().id() == self.thread {
            back_to(&self.original);
        }
        // Dropped on another thread: the entering thread stays in the
        // private namespace until it ends (harnesses live on the test's
        // thread, so this does not happen in the suite).
    }
}

/// `e` with what was being done.
fn context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Appends a netlink attribute (`struct nlattr` + payload, padded to 4).
fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = u16::try_from(4 + payload.len()).expect("netlink attribute too long");
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// Loads an XDP program that drops every packet: `r0 = XDP_DROP; exit`.
fn load_drop_all() -> io::Result<OwnedFd> {
    // struct bpf_insn: code, dst_reg:4 | src_reg:4, off (i16), imm (i32).
    let mut insns = [0u8; 16];
    insns[0] = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K, into r0
    insns[4..8].copy_from_slice(&XDP_DROP.to_ne_bytes());
    insns[8] = 0x95; // BPF_JMP | BPF_EXIT
    let license = c"MIT OR Apache-2.0";
    /// The head of `union bpf_attr` for `BPF_PROG_LOAD` (the kernel takes
    /// a shorter attribute and treats the rest as zero).
    #[repr(C)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
    }
    let attr = ProgLoad {
        prog_type: BPF_PROG_TYPE_XDP,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        kern_version: 0,
        prog_flags: 0,
    };
    // SAFETY: `attr` is a valid BPF_PROG_LOAD attribute of the given size
    // whose pointers point at `insns` and `license`, both alive for the
    // call; the kernel only reads them.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_LOAD,
            &attr as *const ProgLoad,
            std::mem::size_of::<ProgLoad>(),
        )
    };
    if fd < 0 {
        return Err(context(
            io::Error::last_os_error(),
            "loading an XDP drop program (bpf(BPF_PROG_LOAD); needs CAP_BPF or \
             CAP_SYS_ADMIN and a kernel with BPF)",
        ));
    }
    let fd = RawFd::try_from(fd).expect("a descriptor fits an int");
    // SAFETY: `fd` is a descriptor bpf(2) just returned, owned by no one
    // else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Moves the calling thread into the namespace `ns` is a handle of.
fn back_to(ns: &File) {
    // SAFETY: `ns` is an open network-namespace descriptor; setns only
    // changes the calling thread's namespace and touches no memory.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        // Not fatal for the test that ran: the thread stays in the private
        // namespace, and libtest ends it with the test.
        eprintln!(
            "netio-conformance: could not return to the original network namespace: {}",
            io::Error::last_os_error()
        );
    }
}

/// A socket in the calling thread's network namespace.
fn socket(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call; the result is checked below.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(context(io::Error::last_os_error(), "socket"));
    }
    // SAFETY: `fd` is a descriptor socket(2) just returned, owned by no
    // one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An interface request naming `name`, all else zero.
fn ifreq_for(name: &CStr) -> libc::ifreq {
    // SAFETY: ifreq is plain C data (a name array and a union of integers
    // and plain structs) for which all-zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.to_bytes();
    assert!(bytes.len() < req.ifr_name.len(), "interface name too long");
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    req
}
