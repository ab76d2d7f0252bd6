//! Hand-written peers on plain std sockets, for tests of how the backend
//! copes with faulty and hostile peers (127.0.0.1 only).

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream as StdStream;
use std::time::Instant;

use netio_core::EndpointAddress;
use netio_tcp::wire::{DataPrefix, Handshake, FRAME_HEADER_LEN, HANDSHAKE_LEN};

use super::DEADLINE;

/// Connects a plain socket to `addr`, with a read timeout of the deadline.
pub fn connect(addr: EndpointAddress) -> StdStream {
    let s = StdStream::connect(addr.socket_addr()).expect("raw connect");
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.set_write_timeout(Some(DEADLINE)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Connects and sends a version-1 handshake announcing `max_message`.
pub fn connect_with_handshake(addr: EndpointAddress, max_message: u32) -> StdStream {
    let mut s = connect(addr);
    s.write_all(&Handshake::new(max_message).encode()).unwrap();
    s
}

/// Reads exactly `n` bytes.
pub fn read_n(s: &mut StdStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).expect("read");
    b
}

/// Reads until end of stream (or a reset); returns what arrived.
pub fn read_to_end(s: &mut StdStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
    panic!("no end of stream within the deadline");
}

/// A DATA frame carrying `msg`.
pub fn data_frame(msg: &[u8]) -> Vec<u8> {
    let mut v = DataPrefix::new(&[], msg.len()).unwrap().as_bytes().to_vec();
    v.extend_from_slice(msg);
    v
}

/// A frame header of type `ty` and body length `len`.
pub fn frame_header(ty: u8, len: u32) -> [u8; FRAME_HEADER_LEN] {
    let mut h = [0u8; FRAME_HEADER_LEN];
    h[0] = ty;
    h[4..].copy_from_slice(&len.to_le_bytes());
    h
}

/// The CLOSE frame in `stream` after the backend's handshake: its code.
pub fn close_code_after_handshake(stream: &[u8]) -> Option<u16> {
    let f = stream.get(HANDSHAKE_LEN..)?;
    if f.len() < FRAME_HEADER_LEN + 2 || f[0] != 2 {
        return None;
    }
    Some(u16::from_le_bytes([f[8], f[9]]))
}

/// Sets `SO_LINGER` to zero and drops the socket: the peer sees a reset
/// (RST) instead of an orderly end of stream.
pub fn reset(s: StdStream) {
    let sock = socket2::Socket::from(s);
    sock.set_linger(Some(std::time::Duration::ZERO)).unwrap();
    drop(sock);
}

/// The number of open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

/// Raises the soft limit of open files to the hard limit if it is below
/// `needed`; `false` if even the hard limit is below it.
/// Raises the open-file limit to at least `needed`, or fails the test
/// saying so: a test that needs the descriptors must not pass without them.
pub fn require_fd_limit(needed: u64) {
    assert!(
        ensure_fd_limit(needed),
        "the hard limit of open files is below the {needed} this test needs \
         (raise it with `ulimit -Hn`)"
    );
}

pub fn ensure_fd_limit(needed: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives
    // on this stack frame.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(got, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if lim.rlim_cur >= needed {
        return true;
    }
    if lim.rlim_max < needed {
        return false;
    }
    lim.rlim_cur = lim.rlim_max;
    // SAFETY: setrlimit only reads the struct it is given.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(set, 0, "setrlimit: {}", std::io::Error::last_os_error());
    true
}
