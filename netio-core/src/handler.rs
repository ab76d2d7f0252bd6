//! What a backend reports: the [`Handler`] trait and the reasons it carries.

use std::fmt;

use crate::addr::EndpointAddress;
use crate::params::Capabilities;

/// Why a connection attempt did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefuseReason {
    /// Nothing listens at the address, or the peer refused the connection.
    Refused,
    /// The peer could not be reached (network or host unreachable,
    /// partitioned, timed out).
    Unreachable,
    /// The peer answered but is not a compatible netio peer (bad handshake,
    /// wrong protocol version).
    Handshake(String),
    /// The attempt was given up because the endpoint was closed locally.
    Cancelled,
    /// Another error.
    Other(String),
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused => f.write_str("connection refused"),
            Self::Unreachable => f.write_str("peer unreachable"),
            Self::Handshake(s) => write!(f, "handshake failed: {s}"),
            Self::Cancelled => f.write_str("closed before the connection was established"),
            Self::Other(s) => f.write_str(s),
        }
    }
}

/// Why a connection was closed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// This side closed it (`close_active_endpoint`).
    Local,
    /// Its listen endpoint was closed (`close_listen_endpoint`).
    ListenerClosed,
    /// The peer closed it in an orderly way.
    PeerClosed,
    /// The connection was reset or broke (peer crashed, network error).
    Reset,
    /// The peer sent a message larger than this side's receive buffer.
    MessageTooLarge {
        /// Size the peer announced.
        size: u64,
        /// This side's receive buffer size.
        limit: usize,
    },
    /// The peer broke the protocol.
    Protocol(String),
    /// Another error.
    Other(String),
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local => f.write_str("closed locally"),
            Self::ListenerClosed => f.write_str("listen endpoint closed"),
            Self::PeerClosed => f.write_str("closed by the peer"),
            Self::Reset => f.write_str("connection reset"),
            Self::MessageTooLarge { size, limit } => write!(
                f,
                "message of {size} bytes exceeds the receive buffer size of {limit}"
            ),
            Self::Protocol(s) => write!(f, "protocol error: {s}"),
            Self::Other(s) => f.write_str(s),
        }
    }
}

/// Receives a backend's events. Every method has a default that does
/// nothing, so a handler implements only what it needs.
///
/// Callbacks run on the event loop thread, one at a time. They receive the
/// backend so they can reply or close from inside the callback; backends
/// never call a handler while holding a lock the handler's calls need, and
/// never call a handler from inside one of their own operations. Callbacks
/// must not block: that stops every connection of the loop.
///
/// `B` is the backend type. Write `impl<B: Backend + ?Sized> Handler<B>` to
/// use one handler with every provider, including `dyn Backend`.
///
/// ```
/// use netio_core::{Backend, EndpointAddress, Handler};
/// struct Echo;
/// impl<B: Backend + ?Sized> Handler<B> for Echo {
///     fn on_data(&mut self, backend: &B, remote: EndpointAddress, data: &[u8]) {
///         let _ = backend.send_data_copy(remote, &[data], &[], 0);
///     }
/// }
/// ```
pub trait Handler<B: ?Sized>: Send {
    /// A connection is established, on both sides. `capabilities` says what
    /// this side can do on it.
    fn on_connection_established(
        &mut self,
        backend: &B,
        remote: EndpointAddress,
        capabilities: Capabilities,
    ) {
        let _ = (backend, remote, capabilities);
    }

    /// A connection attempt by this side failed. Only the initiator hears of
    /// it; the active endpoint no longer exists afterwards.
    fn on_connection_refused(
        &mut self,
        backend: &B,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let _ = (backend, remote, reason);
    }

    /// An established connection is closed. `cancelled_keys` holds the key of
    /// every send on it that had not completed, each once. The endpoint no
    /// longer exists afterwards.
    fn on_connection_closed(
        &mut self,
        backend: &B,
        remote: EndpointAddress,
        reason: &CloseReason,
        cancelled_keys: &[u64],
    ) {
        let _ = (backend, remote, reason, cancelled_keys);
    }

    /// A whole message arrived (header followed by payload, as sent). The
    /// slice is valid during the call only.
    fn on_data(&mut self, backend: &B, remote: EndpointAddress, data: &[u8]) {
        let _ = (backend, remote, data);
    }

    /// A send completed: its data left this side's buffers. `key` is the
    /// buffer index for buffered sends, the caller's key otherwise.
    fn on_send_completed(&mut self, backend: &B, remote: EndpointAddress, key: u64) {
        let _ = (backend, remote, key);
    }
}

impl<B: ?Sized, H: Handler<B> + ?Sized> Handler<B> for Box<H> {
    fn on_connection_established(&mut self, b: &B, r: EndpointAddress, c: Capabilities) {
        (**self).on_connection_established(b, r, c)
    }
    fn on_connection_refused(&mut self, b: &B, r: EndpointAddress, why: &RefuseReason) {
        (**self).on_connection_refused(b, r, why)
    }
    fn on_connection_closed(&mut self, b: &B, r: EndpointAddress, why: &CloseReason, k: &[u64]) {
        (**self).on_connection_closed(b, r, why, k)
    }
    fn on_data(&mut self, b: &B, r: EndpointAddress, d: &[u8]) {
        (**self).on_data(b, r, d)
    }
    fn on_send_completed(&mut self, b: &B, r: EndpointAddress, k: u64) {
        (**self).on_send_completed(b, r, k)
    }
}

/// A handler that ignores every event.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopHandler;

impl<B: ?Sized> Handler<B> for NoopHandler {}

/// Adapts a handler written for `dyn Backend` to a concrete backend type, so
/// a provider created for run-time selection can call it.
pub struct DynHandler<H>(pub H);

impl<B, H> Handler<B> for DynHandler<H>
where
    B: crate::Backend + Sized + 'static,
    H: Handler<dyn crate::Backend>,
{
    fn on_connection_established(&mut self, b: &B, r: EndpointAddress, c: Capabilities) {
        self.0.on_connection_established(b, r, c)
    }
    fn on_connection_refused(&mut self, b: &B, r: EndpointAddress, why: &RefuseReason) {
        self.0.on_connection_refused(b, r, why)
    }
    fn on_connection_closed(&mut self, b: &B, r: EndpointAddress, why: &CloseReason, k: &[u64]) {
        self.0.on_connection_closed(b, r, why, k)
    }
    fn on_data(&mut self, b: &B, r: EndpointAddress, d: &[u8]) {
        self.0.on_data(b, r, d)
    }
    fn on_send_completed(&mut self, b: &B, r: EndpointAddress, k: u64) {
        self.0.on_send_completed(b, r, k)
    }
}
