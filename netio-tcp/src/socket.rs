//! Creating sockets with their options, choosing ports from the configured
//! ranges, and sorting system errors.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use socket2::{Domain, Protocol, SockAddr, SockRef, Socket, Type};

use crate::config::{PortRange, TcpConfig};

/// Applies the per-connection options to a connected or accepted socket.
pub(crate) fn tune_stream(s: &mio::net::TcpStream, cfg: &TcpConfig) -> io::Result<()> {
    let r = SockRef::from(s);
    r.set_tcp_nodelay(cfg.nodelay)?;
    apply_buffer_sizes(&r, cfg)?;
    apply_liveness(&r, cfg)
}

/// Keepalive probes and `TCP_USER_TIMEOUT` (see [`TcpConfig::keepalive`]
/// and [`TcpConfig::user_timeout`]).
fn apply_liveness(s: &Socket, cfg: &TcpConfig) -> io::Result<()> {
    if let Some(k) = cfg.keepalive {
        // Whole seconds, rounded up (backend creation checked the limits).
        let secs = |d: std::time::Duration| {
            std::time::Duration::from_secs(
                d.as_secs()
                    .saturating_add(u64::from(d.subsec_nanos() > 0))
                    .max(1),
            )
        };
        let ka = socket2::TcpKeepalive::new()
            .with_time(secs(k.idle))
            .with_interval(secs(k.interval))
            .with_retries(k.retries.max(1));
        s.set_tcp_keepalive(&ka)?;
    }
    if let Some(t) = cfg.user_timeout {
        // At least 1 ms: 0 would mean "the system's default". At most
        // i32::MAX ms: Linux takes an int and refuses a negative one.
        let max = std::time::Duration::from_millis(i32::MAX as u64);
        s.set_tcp_user_timeout(Some(t.clamp(std::time::Duration::from_millis(1), max)))?;
    }
    Ok(())
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
    /// The system refused at once; report it like a later refusal. The
    /// socket is kept so the connection gets a handle like any other.
    Failed(mio::net::TcpStream, io::Error),
}

/// Starts a non-blocking connect to `addr` with the options of `cfg`. An
/// error before the connect is attempted (no socket, bad option, no free
/// local port) is returned; an error of the connect itself is a
/// [`Connect::Failed`].
///
/// With [`TcpConfig::connect_ports`] the socket is bound to a port of the
/// range first; a port the system will not give (in use, or its connection
/// to `addr` already exists) is skipped for the next one.
pub(crate) fn connect(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<Connect> {
    let Some(range) = cfg.connect_ports else {
        let s = connecting_socket(addr, cfg)?;
        return match start_connect(s, addr)? {
            Attempt::Done(c) => Ok(c),
            Attempt::PortTaken(_, e) if is_connect_resource_error(&e) => Err(e),
            Attempt::PortTaken(s, e) => Ok(Connect::Failed(s, e)),
        };
    };
    let mut last_err = None;
    for port in range.ports_from(next_start()) {
        let s = connecting_socket(addr, cfg)?;
        // Reusing a port that a closed connection left in TIME_WAIT; the
        // system still refuses a port whose four-tuple is in use.
        s.set_reuse_address(true)?;
        let local = SocketAddr::new(unspecified_like(addr.ip()), port);
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        if let Err(e) = s.bind(&SockAddr::from(local)) {
            if is_port_taken(&e) {
                last_err = Some(e);
                continue;
            }
            return Err(e);
        }
        match start_connect(s, addr)? {
            Attempt::Done(c) => return Ok(c),
            Attempt::PortTaken(_, e) => last_err = Some(e),
        }
    }
    Err(PortRangeExhausted {
        range,
        what: Purpose::Connect(addr),
        last_error: last_err.map(|e| e.to_string()),
    }
    .into())
}

/// A new non-blocking TCP socket for connecting to `addr`, with the options
/// of `cfg`.
fn connecting_socket(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_nonblocking(true)?;
    s.set_tcp_nodelay(cfg.nodelay)?;
    // Before connecting, so the window scale is negotiated for them.
    apply_buffer_sizes(&s, cfg)?;
    apply_liveness(&s, cfg)?;
    Ok(s)
}

/// What one connect call gave.
enum Attempt {
    Done(Connect),
    /// `EADDRINUSE` or `EADDRNOTAVAIL`: the local port (or the four-tuple)
    /// is not available. With a port range, try the next port; without
    /// one, `EADDRNOTAVAIL` means the ephemeral ports are exhausted.
    PortTaken(mio::net::TcpStream, io::Error),
}

fn start_connect(s: Socket, addr: SocketAddr) -> io::Result<Attempt> {
    let stream = |s: Socket| mio::net::TcpStream::from_std(std::net::TcpStream::from(s));
    match s.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL)
            ) =>
        {
            return Ok(Attempt::PortTaken(stream(s), e))
        }
        Err(e) if is_connect_resource_error(&e) => return Err(e),
        Err(e) => return Ok(Attempt::Done(Connect::Failed(stream(s), e))),
    }
    Ok(Attempt::Done(Connect::Started(stream(s))))
}

/// Binds and listens on `addr`. IPv6 listeners are IPv6-only, so an
/// accepted connection's address is always of the listener's family.
///
/// With [`TcpConfig::listen_ports`], port 0 takes the first port of the
/// range (from a rotating start) that binds, and any other port must lie
/// in the range.
pub(crate) fn listen(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<mio::net::TcpListener> {
    let Some(range) = cfg.listen_ports else {
        return listen_on(addr, cfg);
    };
    if addr.port() != 0 {
        if !range.contains(addr.port()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "port {} is outside the listen port range {range} (TcpConfig::listen_ports)",
                    addr.port()
                ),
            ));
        }
        return listen_on(addr, cfg);
    }
    let mut last_err = None;
    for port in range.ports_from(next_start()) {
        match listen_on(SocketAddr::new(addr.ip(), port), cfg) {
            Ok(l) => return Ok(l),
            Err(e) if is_port_taken(&e) => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(PortRangeExhausted {
        range,
        what: Purpose::Listen(addr.ip()),
        last_error: last_err.map(|e| e.to_string()),
    }
    .into())
}

fn listen_on(addr: SocketAddr, cfg: &TcpConfig) -> io::Result<mio::net::TcpListener> {
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

/// The unspecified address of `ip`'s family.
fn unspecified_like(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Where a search through a port range starts: a per-process random seed
/// plus one per search, so successive searches start at successive ports
/// and processes sharing a range rarely collide.
fn next_start() -> u32 {
    static SEED: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let seed = *SEED.get_or_init(|| {
        // Truncating the random 64-bit hash is fine: any 32 bits will do.
        RandomState::new().build_hasher().finish() as u32
    });
    seed.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed))
}

/// `true` for a bind (or listen, or connect) error that concerns this port
/// only: another port of the range may work.
fn is_port_taken(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EADDRINUSE | libc::EACCES))
}

/// What a port range was searched for.
#[derive(Debug)]
enum Purpose {
    Listen(IpAddr),
    Connect(SocketAddr),
}

/// Every port of a configured range was tried and none could be used: a
/// shortage, like running out of descriptors, so the backend reports
/// `NoResources`.
#[derive(Debug)]
struct PortRangeExhausted {
    range: PortRange,
    what: Purpose,
    last_error: Option<String>,
}

impl fmt::Display for PortRangeExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.what {
            Purpose::Listen(ip) => write!(
                f,
                "no free port in {} (TcpConfig::listen_ports) to listen on {ip}",
                self.range
            )?,
            Purpose::Connect(to) => write!(
                f,
                "no free local port in {} (TcpConfig::connect_ports) to connect to {to}",
                self.range
            )?,
        }
        if let Some(e) = &self.last_error {
            write!(f, "; last error: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for PortRangeExhausted {}

impl From<PortRangeExhausted> for io::Error {
    fn from(e: PortRangeExhausted) -> Self {
        let kind = match e.what {
            Purpose::Listen(_) => io::ErrorKind::AddrInUse,
            Purpose::Connect(_) => io::ErrorKind::AddrNotAvailable,
        };
        io::Error::new(kind, e)
    }
}

/// `true` for errors that mean "out of a resource now" (descriptors,
/// memory, the ports of a configured range): retrying later may work.
pub(crate) fn is_resource_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    ) || e
        .get_ref()
        .is_some_and(|inner| inner.is::<PortRangeExhausted>())
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
