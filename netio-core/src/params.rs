//! Configuration values: backend configuration, connection parameters and
//! the capabilities they give a connection.

use crate::region::MemoryRegion;

/// The kind of network a backend is configured for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkMode {
    /// Stream sockets (TCP). The default.
    #[default]
    Tcp,
    /// Remote direct memory access (libfabric verbs and friends).
    Rdma,
}

/// Who may call into a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ThreadSafety {
    /// Every operation may be called from any thread. The default.
    #[default]
    Safe,
    /// Operations may only be called on the thread that runs the backend's
    /// event loop: inside handler callbacks, signal callbacks and timer
    /// callbacks. A call from another thread is refused with a `WrongThread`
    /// error; it never causes undefined behaviour.
    Unsafe,
}

/// Size and number of buffers in a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolParams {
    /// Size of each buffer in bytes.
    pub buf_size: usize,
    /// Number of buffers.
    pub num_buf: usize,
}

impl PoolParams {
    /// A pool of `num_buf` buffers of `buf_size` bytes each.
    pub const fn new(buf_size: usize, num_buf: usize) -> Self {
        Self { buf_size, num_buf }
    }

    /// Total bytes held by the pool.
    pub const fn bytes(&self) -> usize {
        self.buf_size * self.num_buf
    }
}

/// Default for [`BackendConfig::send_queue_depth`].
pub const DEFAULT_SEND_QUEUE_DEPTH: usize = 256;

/// Configuration of a backend instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// The kind of network.
    pub mode: NetworkMode,
    /// Who may call into the backend.
    pub thread_safety: ThreadSafety,
    /// A receive pool shared by every connection of the backend that asks for
    /// it (`RecvParams::use_shared_pool` on an active endpoint), or `None`.
    pub shared_receive_pool: Option<PoolParams>,
    /// A send pool shared by every connection of the backend, or `None`.
    /// When set, every connection can send buffered, and `get_buffer` hands
    /// out buffers of this pool.
    pub shared_send_pool: Option<PoolParams>,
    /// How many `send_data` and `send_data_copy` sends may be in flight on
    /// one connection; one more answers `SendError::NoResources`. Buffered
    /// sends are bounded by their pool instead.
    pub send_queue_depth: usize,
    /// Liveness: a connection whose peer stops answering for this long is
    /// closed with [`CloseReason::TimedOut`](crate::CloseReason::TimedOut):
    /// data it sent stays unacknowledged, or, when idle, its liveness probes
    /// go unanswered. `None` (the default) leaves it to the transport (on
    /// TCP, minutes to hours).
    pub peer_timeout: Option<std::time::Duration>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        Self {
            mode: NetworkMode::default(),
            thread_safety: ThreadSafety::default(),
            shared_receive_pool: None,
            shared_send_pool: None,
            send_queue_depth: DEFAULT_SEND_QUEUE_DEPTH,
            peer_timeout: None,
        }
    }
}

impl BackendConfig {
    /// The default configuration in the given thread-safety mode.
    pub fn with_thread_safety(thread_safety: ThreadSafety) -> Self {
        Self {
            thread_safety,
            ..Self::default()
        }
    }
}

/// Receive parameters of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RecvParams {
    /// Largest message the connection can receive, in bytes (header
    /// included).
    pub buf_size: usize,
    /// Number of messages that can be held before the `on_data` callback has
    /// processed them. 0 means "receiving not requested".
    pub num_buf: usize,
    /// Take receive buffers from a shared pool instead of per-connection
    /// ones. On a listen endpoint this creates one pool of
    /// `buf_size`×`num_buf` for all connections the listener spawns; on an
    /// active endpoint it uses the backend-wide shared receive pool.
    pub use_shared_pool: bool,
}

/// Buffered-send parameters of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct BufferedSendParams {
    /// Size of each send buffer in bytes.
    pub buf_size: usize,
    /// Number of send buffers. 0 means "buffered sending not requested".
    pub num_buf: usize,
}

/// Parameters of a connection. On a listen endpoint they apply to every
/// connection the listener spawns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectionParams {
    /// Receiving.
    pub recv: RecvParams,
    /// Buffered sending.
    pub send_buffered: BufferedSendParams,
    /// Zero-copy sending from this registered memory region; `None` means
    /// "zero-copy sending not requested".
    pub send_zero_copy: Option<MemoryRegion>,
}

impl ConnectionParams {
    /// Parameters that request receiving with `num_buf` buffers of
    /// `buf_size` bytes.
    pub fn receive(buf_size: usize, num_buf: usize) -> Self {
        Self::default().with_receive(buf_size, num_buf)
    }

    /// Parameters that request buffered sending with `num_buf` buffers of
    /// `buf_size` bytes.
    pub fn buffered(buf_size: usize, num_buf: usize) -> Self {
        Self::default().with_buffered(buf_size, num_buf)
    }

    /// Adds receiving.
    pub fn with_receive(mut self, buf_size: usize, num_buf: usize) -> Self {
        self.recv.buf_size = buf_size;
        self.recv.num_buf = num_buf;
        self
    }

    /// Takes receive buffers from a shared pool (see
    /// [`RecvParams::use_shared_pool`]).
    pub fn with_shared_receive(mut self) -> Self {
        self.recv.use_shared_pool = true;
        self
    }

    /// Adds buffered sending.
    pub fn with_buffered(mut self, buf_size: usize, num_buf: usize) -> Self {
        self.send_buffered = BufferedSendParams { buf_size, num_buf };
        self
    }

    /// Adds zero-copy sending from `region`.
    pub fn with_zero_copy(mut self, region: MemoryRegion) -> Self {
        self.send_zero_copy = Some(region);
        self
    }

    /// Checks the parameters on their own and against the backend's
    /// configuration. Providers call this before opening an endpoint.
    pub fn validate(&self, config: &BackendConfig) -> Result<(), String> {
        if self.recv.num_buf > 0 && self.recv.buf_size == 0 && !self.recv.use_shared_pool {
            return Err("receive buffers of size 0 requested".into());
        }
        if self.send_buffered.num_buf > 0 && self.send_buffered.buf_size == 0 {
            return Err("send buffers of size 0 requested".into());
        }
        if self.send_buffered.num_buf > u32::MAX as usize || self.recv.num_buf > u32::MAX as usize {
            return Err("more than 2^32-1 buffers requested".into());
        }
        if config.send_queue_depth == 0 {
            return Err("send_queue_depth of 0 leaves no room for any send".into());
        }
        if config.peer_timeout == Some(std::time::Duration::ZERO) {
            return Err("a peer_timeout of 0 would close every connection at once".into());
        }
        if let Some(p) = config.shared_receive_pool {
            if p.num_buf == 0 || p.buf_size == 0 {
                return Err("the backend's shared receive pool is empty".into());
            }
        }
        if let Some(p) = config.shared_send_pool {
            if p.num_buf == 0 || p.buf_size == 0 {
                return Err("the backend's shared send pool is empty".into());
            }
        }
        Ok(())
    }

    /// The capabilities these parameters give a connection on a backend with
    /// `config`, for a provider that can send by copy if `copy_supported`.
    pub fn capabilities(&self, config: &BackendConfig, copy_supported: bool) -> Capabilities {
        Capabilities {
            receive: self.recv.num_buf > 0 || self.recv.use_shared_pool,
            send_buffered: self.send_buffered.num_buf > 0 || config.shared_send_pool.is_some(),
            send_zero_copy: self.send_zero_copy.is_some(),
            send_copy: copy_supported,
        }
    }
}

/// What an established connection can do, reported with
/// `on_connection_established`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Capabilities {
    /// The connection receives messages.
    pub receive: bool,
    /// `get_buffer`/`send_buffer` work on the connection.
    pub send_buffered: bool,
    /// `send_data` works on the connection.
    pub send_zero_copy: bool,
    /// `send_data_copy` works on the connection.
    pub send_copy: bool,
}

/// What a provider supports at all, declared once per provider. The
/// conformance suite reports behaviours a provider does not support as
/// "not supported", never as passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Features {
    /// `send_data_copy` is supported.
    pub send_copy: bool,
    /// `send_data` (zero-copy from a registered region) is supported.
    pub send_zero_copy: bool,
    /// Buffered and zero-copy sending can be requested on the same
    /// connection.
    pub buffered_with_zero_copy: bool,
    /// [`ThreadSafety::Unsafe`] is supported.
    pub thread_unsafe_mode: bool,
    /// Backend-wide and per-listener shared receive pools are supported.
    pub shared_receive_pool: bool,
    /// A backend-wide shared send pool is supported.
    pub shared_send_pool: bool,
}

impl Features {
    /// Everything supported.
    pub const ALL: Features = Features {
        send_copy: true,
        send_zero_copy: true,
        buffered_with_zero_copy: true,
        thread_unsafe_mode: true,
        shared_receive_pool: true,
        shared_send_pool: true,
    };
}

/// The largest header `send_data` and `send_data_copy` accept, in bytes.
pub const MAX_HEADER_LEN: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_peer_timeout_is_invalid_and_none_or_positive_is_fine() {
        let p = ConnectionParams::receive(64, 4);
        let mut c = BackendConfig {
            peer_timeout: Some(std::time::Duration::ZERO),
            ..BackendConfig::default()
        };
        assert!(p.validate(&c).unwrap_err().contains("peer_timeout"));
        c.peer_timeout = Some(std::time::Duration::from_millis(1));
        assert_eq!(p.validate(&c), Ok(()));
        c.peer_timeout = None;
        assert_eq!(p.validate(&c), Ok(()));
    }
}
