//! Errors, one enum per family of operations.
//!
//! Every variant says what went wrong and is matchable. Each enum has
//! `is_retryable()`: `true` means "no resources right now, the same call is
//! likely to succeed later"; everything else failed and will fail again.
//! Every enum converts into [`std::io::Error`] for code that only wants `?`.

use std::io;

use crate::addr::{AddressError, EndpointAddress};
use crate::conn::ConnId;

/// The error source carried by `Failed…` variants.
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

macro_rules! into_io {
    ($t:ty, $($retry:pat => $kind:expr),*) => {
        impl From<$t> for io::Error {
            fn from(e: $t) -> io::Error {
                #[allow(unreachable_patterns)]
                let kind = match &e {
                    $($retry => $kind,)*
                    _ => io::ErrorKind::Other,
                };
                io::Error::new(kind, e)
            }
        }
    };
}

/// Errors of [`Backend::open_listen_endpoint`](crate::Backend::open_listen_endpoint).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenListenError {
    /// The address cannot be listened on.
    #[error("invalid endpoint address {address}: {reason}")]
    InvalidEndpointAddress {
        /// The address given.
        address: EndpointAddress,
        /// What is wrong with it.
        reason: AddressError,
    },
    /// This backend already listens on that address and port.
    #[error("already listening on {0}")]
    ListenEndpointAlreadyExists(EndpointAddress),
    /// The connection parameters conflict with each other or with the
    /// backend configuration (shared pools).
    #[error("invalid connection parameters: {0}")]
    InvalidConnectionParameters(String),
    /// A requested capability is not supported by this provider.
    #[error("not supported by this provider: {0}")]
    NotSupported(&'static str),
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
    /// The system is out of a resource (file descriptors, memory); retrying
    /// later may work.
    #[error("no resources to listen on {address}: {source}")]
    NoResources {
        /// The address given.
        address: EndpointAddress,
        /// The underlying error.
        source: Source,
    },
    /// Opening failed for another reason (address in use, not local, …).
    #[error("failed to listen on {address}: {source}")]
    FailedOpenListenEndpoint {
        /// The address given.
        address: EndpointAddress,
        /// The underlying error.
        source: Source,
    },
}

impl OpenListenError {
    /// `true` for "no resources, retry later".
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::NoResources { .. })
    }
}
into_io!(OpenListenError,
    OpenListenError::InvalidEndpointAddress { .. } => io::ErrorKind::InvalidInput,
    OpenListenError::ListenEndpointAlreadyExists(_) => io::ErrorKind::AlreadyExists,
    OpenListenError::InvalidConnectionParameters(_) => io::ErrorKind::InvalidInput,
    OpenListenError::NotSupported(_) => io::ErrorKind::Unsupported,
    OpenListenError::NoResources { .. } => io::ErrorKind::WouldBlock);

/// Errors of [`Backend::open_active_endpoint`](crate::Backend::open_active_endpoint).
///
/// These are errors found before a connection is attempted. A connection
/// that is attempted but refused is reported through
/// `Handler::on_connection_refused`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenActiveError {
    /// The address cannot be connected to.
    #[error("invalid endpoint address {address}: {reason}")]
    InvalidEndpointAddress {
        /// The address given.
        address: EndpointAddress,
        /// What is wrong with it.
        reason: AddressError,
    },
    /// The connection parameters conflict with each other or with the
    /// backend configuration.
    #[error("invalid connection parameters: {0}")]
    InvalidConnectionParameters(String),
    /// A requested capability is not supported by this provider.
    #[error("not supported by this provider: {0}")]
    NotSupported(&'static str),
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
    /// The system is out of a resource (file descriptors, ports, memory);
    /// retrying later may work.
    #[error("no resources to connect to {address}: {source}")]
    NoResources {
        /// The address given.
        address: EndpointAddress,
        /// The underlying error.
        source: Source,
    },
    /// Opening failed for another reason.
    #[error("failed to open an active endpoint to {address}: {source}")]
    FailedOpenActiveEndpoint {
        /// The address given.
        address: EndpointAddress,
        /// The underlying error.
        source: Source,
    },
}

impl OpenActiveError {
    /// `true` for "no resources, retry later".
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::NoResources { .. })
    }
}
into_io!(OpenActiveError,
    OpenActiveError::InvalidEndpointAddress { .. } => io::ErrorKind::InvalidInput,
    OpenActiveError::InvalidConnectionParameters(_) => io::ErrorKind::InvalidInput,
    OpenActiveError::NotSupported(_) => io::ErrorKind::Unsupported,
    OpenActiveError::NoResources { .. } => io::ErrorKind::WouldBlock);

/// Errors of [`Backend::close_active_endpoint`](crate::Backend::close_active_endpoint)
/// and [`Backend::close_listen_endpoint`](crate::Backend::close_listen_endpoint).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CloseError {
    /// No connection (opening, open or accepted) has that handle: it was
    /// never issued by this backend, or the connection is closed.
    #[error("no connection {0}: never opened here, or closed")]
    UnknownConnection(ConnId),
    /// No listen endpoint has that address.
    #[error("no listen endpoint on {0}")]
    UnknownListenEndpoint(EndpointAddress),
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
    /// Closing the active endpoint failed.
    #[error("failed to close connection {conn}: {source}")]
    FailedCloseActiveEndpoint {
        /// The connection.
        conn: ConnId,
        /// The underlying error.
        source: Source,
    },
    /// Closing the listen endpoint failed.
    #[error("failed to close the listen endpoint on {address}: {source}")]
    FailedCloseListenEndpoint {
        /// The endpoint.
        address: EndpointAddress,
        /// The underlying error.
        source: Source,
    },
}

impl CloseError {
    /// Always `false`: closing never lacks resources.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
into_io!(CloseError,
    CloseError::UnknownConnection(_) => io::ErrorKind::NotFound,
    CloseError::UnknownListenEndpoint(_) => io::ErrorKind::NotFound);

/// Errors of [`Backend::get_buffer`](crate::Backend::get_buffer) and
/// [`Backend::num_available_buffers`](crate::Backend::num_available_buffers).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BufferError {
    /// No established connection has that handle (not yet established,
    /// closed, or never issued by this backend).
    #[error("no established connection {0}")]
    UnknownConnection(ConnId),
    /// The connection has no send buffers (it was opened for zero-copy or
    /// copy sending only).
    #[error("connection {0} has no send buffers allocated")]
    NoBuffersAllocated(ConnId),
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
}

impl BufferError {
    /// Always `false`: an empty pool is `Ok(None)`, not an error.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
into_io!(BufferError,
    BufferError::UnknownConnection(_) => io::ErrorKind::NotFound,
    BufferError::NoBuffersAllocated(_) => io::ErrorKind::Unsupported);

/// Errors of the send operations: `send_buffer`, `send_data` and
/// `send_data_copy`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// No established connection has that handle (not yet established,
    /// closed, or never issued by this backend).
    #[error("no established connection {0}")]
    UnknownConnection(ConnId),
    /// The send cannot be queued now (buffers or queue slots are all in
    /// flight); retrying after a completion is likely to work.
    #[error("no resources to send now; retry after a send completes")]
    NoResources,
    /// The send mode is not available on this connection or provider.
    #[error("not supported: {0}")]
    NotSupported(&'static str),
    /// The buffer was not handed out by `get_buffer` for this connection.
    #[error("the buffer does not belong to this connection's pool")]
    ForeignBuffer,
    /// The header is longer than [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN).
    #[error("header of {len} bytes is longer than the maximum of {max}")]
    HeaderTooLong {
        /// Header length given.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// A zero-copy slice does not lie inside the connection's registered
    /// memory region.
    #[error("zero-copy data lies outside the connection's registered memory region")]
    OutsideRegion,
    /// The message is larger than the provider can frame.
    #[error("message of {len} bytes exceeds the limit of {max}")]
    MessageTooLarge {
        /// Message length (header included).
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
    /// Sending failed and retrying will not help.
    #[error("send failed: {0}")]
    Failed(Source),
}

impl SendError {
    /// `true` for "no resources, retry later".
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::NoResources)
    }
}
into_io!(SendError,
    SendError::UnknownConnection(_) => io::ErrorKind::NotFound,
    SendError::NoResources => io::ErrorKind::WouldBlock,
    SendError::NotSupported(_) => io::ErrorKind::Unsupported,
    SendError::HeaderTooLong { .. } => io::ErrorKind::InvalidInput,
    SendError::OutsideRegion => io::ErrorKind::InvalidInput,
    SendError::ForeignBuffer => io::ErrorKind::InvalidInput,
    SendError::MessageTooLarge { .. } => io::ErrorKind::InvalidInput);

/// Errors of the per-connection calls that neither send nor close:
/// [`Backend::pause_receive`](crate::Backend::pause_receive),
/// [`Backend::resume_receive`](crate::Backend::resume_receive),
/// [`Backend::remote_address`](crate::Backend::remote_address) and
/// [`Backend::connection_to`](crate::Backend::connection_to).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// No connection (opening, open or accepted) has that handle.
    #[error("no connection {0}: never opened here, or closed")]
    UnknownConnection(ConnId),
    /// No connection (opening, open or accepted) has that remote address.
    #[error("no connection to {0}")]
    NoConnectionTo(EndpointAddress),
    /// Called from a thread other than the loop thread in thread-unsafe mode.
    #[error("called from outside the event loop thread in thread-unsafe mode")]
    WrongThread,
}

impl ConnError {
    /// Always `false`.
    pub fn is_retryable(&self) -> bool {
        false
    }
}
into_io!(ConnError,
    ConnError::UnknownConnection(_) => io::ErrorKind::NotFound,
    ConnError::NoConnectionTo(_) => io::ErrorKind::NotFound);

/// Error of [`Backend::send_chunk`](crate::Backend::send_chunk): why the
/// send was refused, and the chunk, given back unchanged so it can be sent
/// again (after `NoResources`). `chunk` is `None` only when another send of
/// the same bytes still has them lent.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ChunkSendError {
    /// Why the send was refused.
    pub error: SendError,
    /// The chunk, writable again.
    pub chunk: Option<crate::region::RegionChunk>,
}

impl ChunkSendError {
    /// `true` for "no resources, retry later" (see [`SendError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        self.error.is_retryable()
    }
}

impl From<ChunkSendError> for SendError {
    fn from(e: ChunkSendError) -> SendError {
        e.error
    }
}

/// Error of the batch sends ([`Backend::send_copy_batch`](crate::Backend::send_copy_batch),
/// [`Backend::send_buffer_batch`](crate::Backend::send_buffer_batch)): the
/// first `sent` messages of the batch were accepted (each completes or is
/// cancelled as a single send would), message `sent` was refused with
/// `error`, and none after it was tried.
#[derive(Debug, thiserror::Error)]
#[error("batch stopped after {sent} messages: {error}")]
pub struct BatchSendError {
    /// Messages accepted, from the start of the batch.
    pub sent: usize,
    /// Why the next one was refused.
    #[source]
    pub error: SendError,
}

impl BatchSendError {
    /// `true` for "no resources, retry later" (see [`SendError::is_retryable`]).
    pub fn is_retryable(&self) -> bool {
        self.error.is_retryable()
    }
}

/// Errors creating a backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CreateError {
    /// The configuration is inconsistent.
    #[error("invalid backend configuration: {0}")]
    InvalidConfig(String),
    /// The configuration asks for something this provider does not support.
    #[error("not supported by this provider: {0}")]
    NotSupported(&'static str),
    /// No provider of that name is compiled in.
    #[error("unknown provider `{0}`")]
    UnknownProvider(String),
    /// Creating the backend failed.
    #[error("failed to create the backend: {0}")]
    Failed(Source),
}
into_io!(CreateError,
    CreateError::InvalidConfig(_) => io::ErrorKind::InvalidInput,
    CreateError::NotSupported(_) => io::ErrorKind::Unsupported,
    CreateError::UnknownProvider(_) => io::ErrorKind::NotFound);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_no_resources_is_retryable() {
        assert!(SendError::NoResources.is_retryable());
        assert!(!SendError::ForeignBuffer.is_retryable());
        assert!(!SendError::Failed("x".into()).is_retryable());
        let a = EndpointAddress::localhost(1);
        assert!(OpenActiveError::NoResources {
            address: a,
            source: "emfile".into()
        }
        .is_retryable());
        assert!(!OpenActiveError::WrongThread.is_retryable());
        assert!(!ConnError::UnknownConnection(ConnId::new(0, 0)).is_retryable());
    }

    #[test]
    fn converts_into_io_error_with_matching_kind() {
        let e: io::Error = SendError::NoResources.into();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        let e: io::Error = CloseError::UnknownListenEndpoint(EndpointAddress::localhost(1)).into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("127.0.0.1:1"));
        let e: io::Error = SendError::UnknownConnection(ConnId::new(4, 2)).into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("conn#4.2"));
    }
}
