//! TCP-specific settings of a backend.

use std::time::Duration;

/// Socket and protocol settings of a [`TcpBackend`](crate::TcpBackend),
/// beside the provider-agnostic [`BackendConfig`](netio_core::BackendConfig).
///
/// ```
/// use netio_tcp::TcpConfig;
/// let cfg = TcpConfig {
///     send_buffer_size: Some(64 * 1024),
///     ..TcpConfig::default()
/// };
/// assert!(cfg.nodelay);
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
    /// 64 KiB.
    pub read_buffer_size: usize,
    /// How long a connection may take to connect and exchange handshakes
    /// before it is given up. Default 10 s.
    pub handshake_timeout: Duration,
    /// How long a closed connection keeps draining what the peer still
    /// sends, after its CLOSE frame, before the socket is closed. Default
    /// 2 s.
    pub close_linger: Duration,
    /// Backlog of listening sockets. Default 1024.
    pub listen_backlog: u32,
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
            listen_backlog: 1024,
        }
    }
}
