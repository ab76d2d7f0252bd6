//! What a backend reports: the [`Handler`] trait and the reasons it carries.

use std::fmt;

use crate::addr::EndpointAddress;
use crate::conn::ConnId;
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
    /// The peer stopped answering for longer than
    /// [`BackendConfig::peer_timeout`](crate::BackendConfig::peer_timeout):
    /// what was sent went unacknowledged, or the idle connection's liveness
    /// probes went unanswered.
    TimedOut,
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
            Self::TimedOut => f.write_str("the peer stopped answering (timed out)"),
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
/// backend so they can reply, close, pause a connection or set a timer from
/// inside the callback; backends never call a handler while holding a lock
/// the handler's calls need, and never call a handler from inside one of
/// their own operations. Callbacks must not block: that stops every
/// connection of the loop.
///
/// Connections are named by their [`ConnId`]; the remote address comes with
/// establishment, refusal and close.
///
/// `B` is the backend type. Write `impl<B: Backend + ?Sized> Handler<B>` to
/// use one handler with every provider, including `dyn Backend`.
///
/// ```
/// use netio_core::{Backend, ConnId, Handler};
/// struct Echo;
/// impl<B: Backend + ?Sized> Handler<B> for Echo {
///     fn on_data(&mut self, backend: &B, conn: ConnId, data: &[u8]) {
///         let _ = backend.send_data_copy(conn, &[data], &[], 0);
///     }
/// }
/// ```
pub trait Handler<B: ?Sized>: Send {
    /// A connection is established, on both sides. `conn` is its handle (on
    /// the initiating side, the one `open_active_endpoint` returned);
    /// `remote` the peer's address; `capabilities` what this side can do on
    /// it.
    fn on_connection_established(
        &mut self,
        backend: &B,
        conn: ConnId,
        remote: EndpointAddress,
        capabilities: Capabilities,
    ) {
        let _ = (backend, conn, remote, capabilities);
    }

    /// A connection attempt by this side failed. Only the initiator hears of
    /// it; the handle is stale afterwards.
    fn on_connection_refused(
        &mut self,
        backend: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let _ = (backend, conn, remote, reason);
    }

    /// An established connection is closed. `cancelled_keys` holds the key of
    /// every send on it that had not completed, each once. The handle is
    /// stale afterwards.
    fn on_connection_closed(
        &mut self,
        backend: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        cancelled_keys: &[u64],
    ) {
        let _ = (backend, conn, remote, reason, cancelled_keys);
    }

    /// A whole message arrived (header followed by payload, as sent). The
    /// slice is valid during the call only.
    fn on_data(&mut self, backend: &B, conn: ConnId, data: &[u8]) {
        let _ = (backend, conn, data);
    }

    /// One send of `conn` completed: its data left this side's buffers.
    /// `key` is the key given with the send.
    ///
    /// Providers report completions through
    /// [`on_sends_completed`](Self::on_sends_completed), whose default calls
    /// this once per key; implement one or the other.
    fn on_send_completed(&mut self, backend: &B, conn: ConnId, key: u64) {
        let _ = (backend, conn, key);
    }

    /// Several sends of `conn` completed, in the order they were sent (and
    /// after every earlier completion of `conn`). Each send's slot or
    /// buffer is free again when this is called. The default calls
    /// [`on_send_completed`](Self::on_send_completed) for each key.
    fn on_sends_completed(&mut self, backend: &B, conn: ConnId, keys: &[u64]) {
        for &key in keys {
            self.on_send_completed(backend, conn, key);
        }
    }

    /// A timer set with [`Backend::set_timer`](crate::Backend::set_timer) is
    /// due.
    fn on_timer(&mut self, backend: &B, token: u64) {
        let _ = (backend, token);
    }

    /// [`Backend::wake`](crate::Backend::wake) was called, from any thread.
    fn on_wake(&mut self, backend: &B, token: u64) {
        let _ = (backend, token);
    }
}

macro_rules! forward_handler {
    ($self:ident, $($ty:tt)*) => {
        fn on_connection_established(&mut $self, b: &B, c: ConnId, r: EndpointAddress, caps: Capabilities) {
            $($ty)*.on_connection_established(b, c, r, caps)
        }
        fn on_connection_refused(&mut $self, b: &B, c: ConnId, r: EndpointAddress, why: &RefuseReason) {
            $($ty)*.on_connection_refused(b, c, r, why)
        }
        fn on_connection_closed(
            &mut $self,
            b: &B,
            c: ConnId,
            r: EndpointAddress,
            why: &CloseReason,
            k: &[u64],
        ) {
            $($ty)*.on_connection_closed(b, c, r, why, k)
        }
        fn on_data(&mut $self, b: &B, c: ConnId, d: &[u8]) {
            $($ty)*.on_data(b, c, d)
        }
        fn on_send_completed(&mut $self, b: &B, c: ConnId, k: u64) {
            $($ty)*.on_send_completed(b, c, k)
        }
        fn on_sends_completed(&mut $self, b: &B, c: ConnId, k: &[u64]) {
            $($ty)*.on_sends_completed(b, c, k)
        }
        fn on_timer(&mut $self, b: &B, t: u64) {
            $($ty)*.on_timer(b, t)
        }
        fn on_wake(&mut $self, b: &B, t: u64) {
            $($ty)*.on_wake(b, t)
        }
    };
}

impl<B: ?Sized, H: Handler<B> + ?Sized> Handler<B> for Box<H> {
    forward_handler!(self, (**self));
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
    forward_handler!(self, self.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Singles(Vec<(ConnId, u64)>);
    impl Handler<()> for Singles {
        fn on_send_completed(&mut self, _: &(), conn: ConnId, key: u64) {
            self.0.push((conn, key));
        }
    }

    #[test]
    fn a_batch_reaches_a_per_message_handler_key_by_key_in_order() {
        let mut h = Singles::default();
        let c = ConnId::new(1, 0);
        h.on_sends_completed(&(), c, &[3, 1, 2]);
        assert_eq!(h.0, vec![(c, 3), (c, 1), (c, 2)]);
    }

    #[test]
    fn a_boxed_handler_forwards_batches_and_singles() {
        let mut h: Box<Singles> = Box::default();
        let c = ConnId::new(0, 5);
        h.on_sends_completed(&(), c, &[7]);
        h.on_send_completed(&(), c, 8);
        assert_eq!(h.0, vec![(c, 7), (c, 8)]);
    }
}
