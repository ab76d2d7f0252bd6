//! The few operating-system calls the listener threads need, behind safe
//! functions: a wake-up descriptor, waiting on two descriptors, and the
//! handshake guard's view of the process's TCP sockets.
//!
//! The guard never closes a descriptor it does not own: it duplicates one
//! (`dup`), checks the duplicate's addresses, and shuts the connection down
//! through the duplicate (`shutdown` acts on the connection, not on a
//! descriptor number), so a number closed and reused by another thread in
//! the meantime is never touched.

use std::ffi::c_int;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An `eventfd` to wake a thread waiting in [`wait_readable`].
pub struct WakeFd {
    fd: OwnedFd,
}

impl WakeFd {
    /// A new, unsignalled descriptor.
    pub fn new() -> std::io::Result<WakeFd> {
        // SAFETY: eventfd has no memory preconditions; it returns a new
        // descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(WakeFd { fd })
    }

    /// Signals it (it stays readable from then on).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd we own.
        let _ = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
    }

    /// The descriptor to wait on.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The CPU time the calling thread has used so far (zero if the clock
/// cannot be read). Unlike a wall clock, it does not run on while the
/// thread waits for a core on a loaded machine.
pub fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that clock_gettime writes.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

/// Waits until `a` or `b` is readable or `timeout` passed.
pub fn wait_readable(a: RawFd, b: RawFd, timeout: Duration) {
    let mut fds = [
        libc::pollfd {
            fd: a,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = timeout.as_millis().min(c_int::MAX as u128) as c_int;
    // SAFETY: `fds` is a valid array of two pollfd; poll only reads and
    // writes inside it. A closed descriptor shows as POLLNVAL, no harm.
    let _ = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
}

fn sockaddr_of(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    match c_int::from(storage.ss_family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says this storage holds a sockaddr_in,
            // and `len` covers it; sockaddr_storage is aligned for it.
            let a =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The local and peer addresses of a connected IP socket, `None` for
/// anything else (a listening socket, a pipe, a closed number).
fn names(fd: RawFd) -> Option<(SocketAddr, SocketAddr)> {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut local: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the out buffer and its length are valid; on a descriptor
    // that is not a socket the call fails without writing.
    let rc = unsafe {
        libc::getsockname(
            fd,
            (&mut local as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    let local = sockaddr_of(&local, len)?;
    // SAFETY: as above.
    let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut plen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut peer as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
            &mut plen,
        )
    };
    if rc != 0 {
        return None;
    }
    Some((local, sockaddr_of(&peer, plen)?))
}

/// A connected TCP socket of this process: its descriptor number (as seen
/// when listed) and its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SocketSeen {
    /// Descriptor number when listed.
    pub fd: RawFd,
    /// Local address.
    pub local: SocketAddr,
    /// Peer address.
    pub peer: SocketAddr,
}

/// The process's connected IP sockets whose local address is accepted by
/// `local` (same port; same IP unless `local`'s is unspecified).
pub fn sockets_on(local: SocketAddr) -> Vec<SocketSeen> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<RawFd>().ok())
        else {
            continue;
        };
        match std::fs::read_link(entry.path()) {
            Ok(target) if target.to_string_lossy().starts_with("socket:") => {}
            _ => continue,
        }
        if let Some((l, p)) = names(fd) {
            if matches(local, l) {
                out.push(SocketSeen {
                    fd,
                    local: l,
                    peer: p,
                });
            }
        }
    }
    out
}

fn matches(listener: SocketAddr, local: SocketAddr) -> bool {
    listener.port() == local.port()
        && (listener.ip().is_unspecified() || listener.ip() == local.ip())
}

/// Shuts down (both directions) the connection `seen` names, if the
/// descriptor still names that connection, and `still_wanted` agrees
/// (asked after the check, just before the shutdown). The descriptor
/// itself stays open: its owner sees the connection end and closes it.
pub fn shut_down(seen: SocketSeen, still_wanted: impl FnOnce() -> bool) -> bool {
    // SAFETY: dup has no memory preconditions; it returns a new
    // descriptor for the same open file, or -1 (a closed number).
    let dup = unsafe { libc::fcntl(seen.fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return false;
    }
    // SAFETY: `dup` is a fresh descriptor owned here alone.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    if names(dup.as_raw_fd()) != Some((seen.local, seen.peer)) || !still_wanted() {
        return false;
    }
    // SAFETY: shutdown on our own duplicate: it ends the connection the
    // duplicate names (checked above), whichever descriptor numbers
    // other owners use for it.
    unsafe { libc::shutdown(dup.as_raw_fd(), libc::SHUT_RDWR) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The guard paces its scans by this clock: it runs while the thread
    /// works and stands still while it sleeps.
    #[test]
    fn thread_cpu_time_counts_work_not_sleep() {
        let t0 = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(200));
        let slept = thread_cpu_time().saturating_sub(t0);
        assert!(
            slept < Duration::from_millis(50),
            "{slept:?} counted while asleep"
        );
        let t1 = thread_cpu_time();
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let worked = thread_cpu_time().saturating_sub(t1);
        assert!(
            worked > Duration::ZERO,
            "no CPU time counted for 100 ms of work"
        );
    }
}
