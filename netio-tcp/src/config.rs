//! TCP-specific settings of a backend.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

/// Socket and protocol settings of a [`TcpBackend`](crate::TcpBackend),
/// beside the provider-agnostic [`BackendConfig`](netio_core::BackendConfig).
///
/// ```
/// use netio_tcp::{PortRange, TcpConfig};
/// let cfg = TcpConfig {
///     send_buffer_size: Some(64 * 1024),
///     listen_ports: Some(PortRange::new(40000, 40010)?),
///     ..TcpConfig::default()
/// };
/// assert!(cfg.nodelay);
/// # Ok::<(), netio_tcp::PortRangeError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpConfig {
    /// Sets `TCP_NODELAY` (no Nagle delay) on every connection. Default
    /// `true`: messages are already batched into large writes.
    pub nodelay: bool,
    /// `SO_SNDBUF` of every socket, or `None` for the system's default
    /// (with autotuning).
    pub send_buffer_size: Option<usize>,
    /// `SO_RCVBUF` of every socket, or `None` for the system's default
    /// (with autotuning). Set on listeners too, so accepted connections
    /// inherit it before the TCP window is negotiated.
    pub recv_buffer_size: Option<usize>,
    /// Size of each receiving connection's read buffer, out of which frames
    /// are parsed in place (at least 512 bytes). Messages longer than this
    /// are assembled in a buffer of the connection's receive pool. Default
    /// 64 KiB. It is allocated when the first bytes after the peer's
    /// handshake arrive: until then (an idle connection) a 512-byte
    /// handshake buffer stands in.
    pub read_buffer_size: usize,
    /// How long a connection may take to connect and exchange handshakes
    /// before it is given up. Default 10 s.
    pub handshake_timeout: Duration,
    /// How long a closed connection keeps draining what the peer still
    /// sends, after its CLOSE frame, before the socket is closed. Default
    /// 2 s.
    pub close_linger: Duration,
    /// How long a connection on a *shared* receive pool may hold a pool
    /// buffer for a message that has not fully arrived. Default 5 s.
    ///
    /// A message longer than [`read_buffer_size`](Self::read_buffer_size)
    /// takes a buffer of the connection's receive pool when its frame header
    /// arrives and keeps it until its last byte has. A peer that starts such
    /// a message and then stalls would otherwise keep the buffer as long as
    /// the connection lives; on a shared pool (the backend's
    /// [`shared_receive_pool`](netio_core::BackendConfig::shared_receive_pool),
    /// or a listener's pool made with
    /// [`use_shared_pool`](netio_core::RecvParams::use_shared_pool)) that
    /// starves every other connection using the pool, which stops reading
    /// once all its buffers are taken. So a message still incomplete this
    /// long after its buffer was taken closes the connection in the orderly
    /// way (CLOSE frame code 2) with
    /// [`CloseReason::Protocol`](netio_core::CloseReason::Protocol)
    /// (`"message incomplete for 5s: …"`), its buffer returns to the pool and
    /// waiting connections resume reading. Deadlines are checked every
    /// 50 ms while such a message is under way (nothing is done per
    /// message), so the close may come up to 50 ms late.
    ///
    /// It bounds the whole message, not the pauses in it: a large message
    /// must arrive within this time, so set it above what the pool's buffer
    /// size takes on the slowest link expected (`Duration::MAX`: no limit).
    /// Connections with their own receive pool are not limited: a stalled
    /// message there holds only their own buffer, and their later messages
    /// wait behind it in the stream anyway.
    pub partial_message_timeout: Duration,
    /// Backlog of listening sockets (passed to `listen`): how many
    /// connections the kernel completes and keeps for a listener that is
    /// not accepting them yet, notably while the backend is at
    /// [`max_accepted_handshakes`](Self::max_accepted_handshakes). Beyond
    /// it the kernel turns new connections away (on Linux it drops their
    /// SYN, and the initiator retries until its connect timeout). The
    /// kernel caps it at `net.core.somaxconn` (4096 on Linux since 5.4,
    /// 128 before). Default 1024.
    pub listen_backlog: u32,
    /// The ports listeners may use, or `None` (default) for any port.
    ///
    /// - A listen endpoint opened with port 0 takes a free port of the
    ///   range: ports are tried one after the other, from a start that
    ///   rotates between calls (and is seeded per process), until one
    ///   binds. A port that is in use (or, below 1024, not allowed) is
    ///   skipped.
    /// - When every port of the range is taken, opening fails with
    ///   [`OpenListenError::NoResources`](netio_core::OpenListenError::NoResources),
    ///   whose source says "no free port in 40000..=40010" (retrying after
    ///   a listener closed may work).
    /// - A listen endpoint opened with a non-zero port outside the range
    ///   is refused before any socket is made, with
    ///   [`OpenListenError::FailedOpenListenEndpoint`](netio_core::OpenListenError::FailedOpenListenEndpoint)
    ///   whose source (kind [`InvalidInput`](std::io::ErrorKind::InvalidInput))
    ///   names the port and the range. The address itself is valid (it is
    ///   not `InvalidEndpointAddress`, which the contract keeps for
    ///   addresses no listener could use); this backend's policy refuses
    ///   it, as the system refuses a privileged port.
    pub listen_ports: Option<PortRange>,
    /// The local ports outgoing connections use, or `None` (default) for
    /// the system's ephemeral ports.
    ///
    /// With a range, each connecting socket is bound to a port of the range
    /// before it connects (on the unspecified address of the remote's
    /// family, so the system still picks the source IP), trying ports from
    /// a rotating start. `SO_REUSEADDR` is set on it, so a port that an
    /// earlier connection of this range left in `TIME_WAIT` can be used
    /// again at once; the system still refuses a port whose connection to
    /// the same remote address and port exists (or lingers), and the next
    /// port is tried. Two connections to different remotes may share a
    /// local port. A port on which a socket listens is never taken.
    ///
    /// When no port of the range can be used, opening fails with
    /// [`OpenActiveError::NoResources`](netio_core::OpenActiveError::NoResources),
    /// whose source says "no free local port in …".
    pub connect_ports: Option<PortRange>,
    /// TCP keepalive probes (`SO_KEEPALIVE`, `TCP_KEEPIDLE`,
    /// `TCP_KEEPINTVL`, `TCP_KEEPCNT`) on every connection, opened or
    /// accepted, or `None` (default): derived from
    /// [`BackendConfig::peer_timeout`](netio_core::BackendConfig::peer_timeout)
    /// when that is set ([`Keepalive::for_peer_timeout`]), off otherwise.
    ///
    /// An idle connection whose peer stops answering the probes closes
    /// with [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut).
    /// [`TcpBackend::tcp_config`](crate::TcpBackend::tcp_config) shows the
    /// settings in effect, derived ones included.
    pub keepalive: Option<Keepalive>,
    /// `TCP_USER_TIMEOUT` of every connection: how long sent data may stay
    /// unacknowledged (and, with keepalive, how long probes may go
    /// unanswered) before the kernel gives the connection up, which closes
    /// it with [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut).
    /// `None` (default): `BackendConfig::peer_timeout` when that is set, the
    /// system's retransmission limit (about 15 minutes) otherwise.
    /// Millisecond resolution; longer than `i32::MAX` ms (about 24.8 days)
    /// is taken as that.
    pub user_timeout: Option<Duration>,
    /// Connections one listener holds at once (exchanging handshakes or
    /// established). A connection accepted beyond it is closed at once,
    /// before anything is read from it or allocated for it, and counted
    /// in [`TcpBackend::refused_connections`](crate::TcpBackend::refused_connections);
    /// its initiator sees the connection end during the handshake. The
    /// connections the listener holds are untouched. Default 4096.
    ///
    /// Unlike [`max_accepted_handshakes`](Self::max_accepted_handshakes),
    /// this limit refuses rather than queues: the connections it counts
    /// may stay for hours, so a connection left waiting in the backlog
    /// would only time out there, and would hold backlog room that
    /// connections waiting for a handshake slot need.
    pub max_connections_per_listener: usize,
    /// Accepted connections still exchanging handshakes, over every
    /// listener of the backend: what a flood of connections that never
    /// complete a handshake can hold (each gives up after
    /// [`handshake_timeout`](Self::handshake_timeout)). Default 1024; at
    /// least 1 (0 fails backend creation with `InvalidConfig`).
    ///
    /// At the limit, listeners stop accepting: new connections wait in the
    /// kernel's listen backlog ([`listen_backlog`](Self::listen_backlog)),
    /// with nothing allocated for them, until a handshake ends
    /// (established, failed or timed out); then accepting resumes. So a
    /// burst of clients larger than the limit is served in turn rather
    /// than turned away; only connections beyond the backlog are refused,
    /// by the kernel. Waiting connections are not counted in
    /// [`TcpBackend::refused_connections`](crate::TcpBackend::refused_connections).
    pub max_accepted_handshakes: usize,
}

/// TCP keepalive settings (see [`TcpConfig::keepalive`]). The kernel takes
/// whole seconds: durations are rounded up, and zero counts as one
/// second.
///
/// ```
/// use std::time::Duration;
/// use netio_tcp::Keepalive;
/// let k = Keepalive::for_peer_timeout(Duration::from_secs(60));
/// assert_eq!(k.idle, Duration::from_secs(30));
/// assert_eq!((k.interval, k.retries), (Duration::from_secs(10), 3));
/// // Probing gives up within the peer timeout.
/// assert!(k.idle + k.interval * k.retries <= Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe (`TCP_KEEPIDLE`).
    pub idle: Duration,
    /// Time between probes (`TCP_KEEPINTVL`).
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped
    /// (`TCP_KEEPCNT`, at least 1).
    pub retries: u32,
}

impl Keepalive {
    /// The longest idle time and probe interval Linux takes (`TCP_KEEPIDLE`
    /// and `TCP_KEEPINTVL` are at most 32,767 s; longer ones make backend
    /// creation fail with `InvalidConfig`).
    pub const MAX_SECS: u64 = 32_767;
    /// The most unanswered probes Linux takes (`TCP_KEEPCNT`).
    pub const MAX_RETRIES: u32 = 127;
    /// The longest peer timeout that [`for_peer_timeout`](Self::for_peer_timeout)
    /// turns into probes that end within it: 131,068 s (about 36 h), an
    /// idle time and three intervals of at most [`MAX_SECS`](Self::MAX_SECS)
    /// each. A longer `BackendConfig::peer_timeout` gets no probes, only
    /// `TCP_USER_TIMEOUT` (which notices a silent peer once data is sent
    /// to it).
    pub const LONGEST_PEER_TIMEOUT: Duration = Duration::from_secs(4 * Self::MAX_SECS);

    /// Keepalive that notices a silent peer within `peer_timeout`: probes
    /// start after half of it (at least 1 s) and up to 3 probes share the
    /// rest, so `idle + interval * retries` stays within the timeout
    /// (timeouts under 2 s: 1 s + one probe after 1 s, the kernel's
    /// smallest settings). `TCP_USER_TIMEOUT`, set to the timeout as well,
    /// bounds the whole. Beyond [`LONGEST_PEER_TIMEOUT`](Self::LONGEST_PEER_TIMEOUT)
    /// the idle time and interval stay at [`MAX_SECS`](Self::MAX_SECS), so
    /// the probes give up before the timeout.
    pub fn for_peer_timeout(peer_timeout: Duration) -> Self {
        let secs = peer_timeout
            .as_secs()
            .saturating_add(u64::from(peer_timeout.subsec_nanos() > 0));
        let secs = secs.max(2);
        let idle = (secs / 2).clamp(1, Self::MAX_SECS);
        let rest = (secs - idle).max(1);
        let retries = rest.min(3);
        let interval = (rest / retries).clamp(1, Self::MAX_SECS);
        Self {
            idle: Duration::from_secs(idle),
            interval: Duration::from_secs(interval),
            // At most 3.
            retries: u32::try_from(retries).unwrap_or(3),
        }
    }

    /// Why the kernel would refuse these settings, if it would.
    pub(crate) fn invalid(&self) -> Option<String> {
        let too_long = |d: Duration| d > Duration::from_secs(Self::MAX_SECS);
        if too_long(self.idle) || too_long(self.interval) {
            Some(format!(
                "keepalive idle time and interval must be at most {} s: {:?}",
                Self::MAX_SECS,
                self
            ))
        } else if self.retries > Self::MAX_RETRIES {
            Some(format!(
                "keepalive retries must be at most {}: {}",
                Self::MAX_RETRIES,
                self.retries
            ))
        } else {
            None
        }
    }
}

impl TcpConfig {
    /// These settings with the liveness options derived from
    /// `peer_timeout` where none are given explicitly.
    pub(crate) fn with_peer_timeout(mut self, peer_timeout: Option<Duration>) -> Self {
        if let Some(t) = peer_timeout {
            if t <= Keepalive::LONGEST_PEER_TIMEOUT {
                self.keepalive
                    .get_or_insert_with(|| Keepalive::for_peer_timeout(t));
            }
            self.user_timeout.get_or_insert(t);
        }
        self
    }
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self {
            nodelay: true,
            send_buffer_size: None,
            recv_buffer_size: None,
            read_buffer_size: 64 * 1024,
            handshake_timeout: Duration::from_secs(10),
            close_linger: Duration::from_secs(2),
            partial_message_timeout: Duration::from_secs(5),
            listen_backlog: 1024,
            listen_ports: None,
            connect_ports: None,
            keepalive: None,
            user_timeout: None,
            max_connections_per_listener: 4096,
            max_accepted_handshakes: 1024,
        }
    }
}

/// A non-empty inclusive range of TCP ports, without port 0 (which means
/// "any port" and cannot be bound as such). Displayed as `first..=last`.
///
/// ```
/// use netio_tcp::PortRange;
/// let r = PortRange::new(40000, 40010)?;
/// assert_eq!(r.len(), 11);
/// assert!(r.contains(40010) && !r.contains(40011));
/// assert_eq!(r.to_string(), "40000..=40010");
/// assert_eq!(PortRange::try_from(40000..=40010)?, r);
/// assert!(PortRange::new(0, 10).is_err());
/// assert!(PortRange::new(10, 9).is_err());
/// # Ok::<(), netio_tcp::PortRangeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    first: u16,
    last: u16,
}

impl PortRange {
    /// The ports `first..=last`. Fails if `first` is 0 or greater than
    /// `last`.
    pub const fn new(first: u16, last: u16) -> Result<Self, PortRangeError> {
        if first == 0 || first > last {
            return Err(PortRangeError { first, last });
        }
        Ok(Self { first, last })
    }

    /// The single port `port` (not 0).
    pub const fn single(port: u16) -> Result<Self, PortRangeError> {
        Self::new(port, port)
    }

    /// The lowest port of the range.
    pub const fn first(&self) -> u16 {
        self.first
    }

    /// The highest port of the range.
    pub const fn last(&self) -> u16 {
        self.last
    }

    /// How many ports the range holds (at least 1).
    #[allow(clippy::len_without_is_empty)] // never empty
    pub const fn len(&self) -> u32 {
        self.last as u32 - self.first as u32 + 1
    }

    /// `true` if `port` lies in the range.
    pub const fn contains(&self, port: u16) -> bool {
        self.first <= port && port <= self.last
    }

    /// Every port of the range once, starting at the `start`-th (taken
    /// modulo the length) and wrapping around.
    pub(crate) fn ports_from(self, start: u32) -> impl Iterator<Item = u16> {
        let len = self.len();
        let first = u32::from(self.first);
        (0..len).map(move |i| {
            let offset = (start % len + i) % len;
            // Lies in first..=last, so it fits.
            u16::try_from(first + offset).unwrap_or(self.last)
        })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.first, self.last)
    }
}

impl TryFrom<RangeInclusive<u16>> for PortRange {
    type Error = PortRangeError;

    fn try_from(r: RangeInclusive<u16>) -> Result<Self, PortRangeError> {
        Self::new(*r.start(), *r.end())
    }
}

impl From<PortRange> for RangeInclusive<u16> {
    fn from(r: PortRange) -> Self {
        r.first..=r.last
    }
}

/// A [`PortRange`] that would be empty or contain port 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid port range {first}..={last}: it must be non-empty and must not contain port 0")]
pub struct PortRangeError {
    /// The first port given.
    pub first: u16,
    /// The last port given.
    pub last: u16,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Keepalive, PortRange, TcpConfig};

    #[test]
    fn keepalive_derived_from_the_peer_timeout_gives_up_within_it() {
        for secs in [1u64, 2, 3, 5, 10, 30, 60, 600, 7200] {
            let t = Duration::from_secs(secs);
            let k = Keepalive::for_peer_timeout(t);
            assert!(k.retries >= 1 && k.retries <= 3, "{secs}: {k:?}");
            assert!(k.idle >= Duration::from_secs(1) && k.interval >= Duration::from_secs(1));
            let total = k.idle + k.interval * k.retries;
            assert!(total <= t.max(Duration::from_secs(2)), "{secs}: {k:?}");
        }
        let k = Keepalive::for_peer_timeout(Duration::from_millis(1500));
        assert_eq!(k.idle, Duration::from_secs(1));
    }

    /// The longest timeouts neither overflow nor ask the kernel for more
    /// than it takes: up to `LONGEST_PEER_TIMEOUT` the probes end within
    /// the timeout and stay within the kernel's limits; beyond it no
    /// probes are derived (only the user timeout), and `for_peer_timeout`
    /// itself stays at the kernel's limits.
    #[test]
    fn the_longest_peer_timeouts_stay_within_the_kernels_keepalive_limits() {
        let longest = Keepalive::LONGEST_PEER_TIMEOUT;
        let k = Keepalive::for_peer_timeout(longest);
        assert_eq!(k.invalid(), None, "{k:?}");
        assert!(k.idle + k.interval * k.retries <= longest, "{k:?}");
        let cfg = TcpConfig::default().with_peer_timeout(Some(longest));
        assert_eq!(cfg.keepalive, Some(k));
        for t in [longest + Duration::from_secs(1), Duration::MAX] {
            let cfg = TcpConfig::default().with_peer_timeout(Some(t));
            assert_eq!(cfg.keepalive, None, "{t:?}: no probes");
            assert_eq!(cfg.user_timeout, Some(t));
            assert_eq!(Keepalive::for_peer_timeout(t).invalid(), None, "{t:?}");
        }
        let too_long = Keepalive {
            idle: Duration::from_secs(Keepalive::MAX_SECS + 1),
            interval: Duration::from_secs(1),
            retries: 1,
        };
        assert!(too_long.invalid().is_some());
        let too_many = Keepalive {
            retries: Keepalive::MAX_RETRIES + 1,
            ..Keepalive::for_peer_timeout(Duration::from_secs(10))
        };
        assert!(too_many.invalid().is_some());
    }

    #[test]
    fn explicit_liveness_settings_win_over_the_peer_timeout() {
        let t = Duration::from_secs(8);
        let derived = TcpConfig::default().with_peer_timeout(Some(t));
        assert_eq!(derived.keepalive, Some(Keepalive::for_peer_timeout(t)));
        assert_eq!(derived.user_timeout, Some(t));
        let own = Keepalive {
            idle: Duration::from_secs(100),
            interval: Duration::from_secs(7),
            retries: 9,
        };
        let cfg = TcpConfig {
            keepalive: Some(own),
            user_timeout: Some(Duration::from_secs(1)),
            ..TcpConfig::default()
        }
        .with_peer_timeout(Some(t));
        assert_eq!(cfg.keepalive, Some(own));
        assert_eq!(cfg.user_timeout, Some(Duration::from_secs(1)));
        assert_eq!(
            TcpConfig::default().with_peer_timeout(None),
            TcpConfig::default()
        );
    }

    #[test]
    fn ports_from_visits_every_port_once_from_the_start() {
        let r = PortRange::new(10, 13).unwrap();
        assert_eq!(r.ports_from(0).collect::<Vec<_>>(), [10, 11, 12, 13]);
        assert_eq!(r.ports_from(2).collect::<Vec<_>>(), [12, 13, 10, 11]);
        assert_eq!(r.ports_from(7).collect::<Vec<_>>(), [13, 10, 11, 12]);
        assert_eq!(r.ports_from(u32::MAX).count(), 4);
        let all = PortRange::new(1, u16::MAX).unwrap();
        assert_eq!(all.len(), 65535);
        let mut seen = all.ports_from(12345).collect::<Vec<_>>();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 65535);
        assert_eq!((seen[0], seen[65534]), (1, u16::MAX));
    }

    #[test]
    fn single_port_range() {
        let r = PortRange::single(80).unwrap();
        assert_eq!((r.first(), r.last(), r.len()), (80, 80, 1));
        assert_eq!(r.ports_from(5).collect::<Vec<_>>(), [80]);
        assert!(PortRange::single(0).is_err());
    }
}
