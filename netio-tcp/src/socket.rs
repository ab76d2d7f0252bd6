//! Creating sockets with their options, and sorting system errors.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::config::TcpConfig;

/// Applies the per-connection options to a connected or accepted socket.
pub(crate) fn tune_stream(s: &mio::net::TcpStream, cfg: &TcpConfig) -> io::Result<()> {
    let r = SockRef::from(s);
    r.set_tcp_nodelay(cfg.nodelay)?;
    apply_buffer_sizes(&r, cfg)
}

fn apply_buffer_sizes(s: &Socket, cfg: &TcpConfig) -> io::Result<()> {
    if let Some(n) = cfg.send_buffer_size {
        s.set_send_buffer_size(n)?;
    }
    if let Some(n) = cfg.recv_buffer_size {
        s.set_recv_buffer_size(n)?;
    }
    Ok(())
}

/// The outcome of starting a non-blocking connect.
pub(crate) enum Connect {
    /// Connecting (or connected): wait for writability.
    Started(mio::net::TcpStream),
    /// The system refused at once; report it like a later refusal.
    Failed(io::Error),
}

/// Starts a non-blocking connect to `addr` with the options of `cfg`. An
/// error before the connect is attempted (no socket, bad option) is
/// returned; an error of the connect itself is a [`Connect::Failed`].
pub(crate) fn connect(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<Connect> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    s.set_tcp_nodelay(cfg.nodelay)?;
    // Before connecting, so the window scale is negotiated for them.
    apply_buffer_sizes(&s, cfg)?;
    match s.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e) if is_connect_resource_error(&e) => return Err(e),
        Err(e) => return Ok(Connect::Failed(e)),
    }
    let std: std::net::TcpStream = s.into();
    Ok(Connect::Started(mio::net::TcpStream::from_std(std)))
}

/// Binds and listens on `addr`. IPv6 listeners are IPv6-only, so an
/// accepted connection's address is always of the listener's family.
pub(crate) fn listen(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<mio::net::TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_reuse_address(true)?;
    s.set_nonblocking(true)?;
    apply_buffer_sizes(&s, cfg)?;
    s.bind(&SockAddr::from(addr))?;
    let backlog = i32::try_from(cfg.listen_backlog).unwrap_or(i32::MAX);
    s.listen(backlog)?;
    let std: std::net::TcpListener = s.into();
    Ok(mio::net::TcpListener::from_std(std))
}

/// `true` for errors that mean "out of a resource now" (descriptors,
/// memory, ephemeral ports): retrying later may work.
pub(crate) fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Like [`is_resource_error`], for connecting: there `EADDRNOTAVAIL` means
/// the ephemeral ports are exhausted.
pub(crate) fn is_connect_resource_error(e: &io::Error) -> bool {
    is_resource_error(e) || e.raw_os_error() == Some(libc::EADDRNOTAVAIL)
}

/// `true` for errors of a connect attempt that mean "no route to the
/// peer" rather than "the peer said no".
pub(crate) fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENETUNREACH
                | libc::EHOSTUNREACH
                | libc::ETIMEDOUT
                | libc::ENETDOWN
                | libc::EHOSTDOWN
        )
    )
}

/// `true` for "connection refused".
pub(crate) fn is_refused(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ECONNREFUSED)
}
