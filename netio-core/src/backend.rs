//! The operations every provider offers: [`Backend`], and [`Provider`], which
//! ties a backend type to its event loop type.

use crate::addr::EndpointAddress;
use crate::buffer::NetworkBuffer;
use crate::error::{
    BufferError, CloseError, CreateError, OpenActiveError, OpenListenError, SendError,
};
use crate::event_loop::EventLoop;
use crate::handler::Handler;
use crate::params::{BackendConfig, ConnectionParams, Features};
use crate::region::RegionSlice;

/// Buffer memory a backend holds, for monitoring and for checking that
/// shared pools keep memory constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// Bytes of receive buffers (per-connection and shared pools).
    pub receive_bytes: usize,
    /// Bytes of send buffers (per-connection and shared pools).
    pub send_bytes: usize,
}

/// The operations of the contract. Object safe: `Box<dyn Backend>` works for
/// run-time selection, and `fn app<B: Backend>` for static dispatch.
///
/// Every operation returns at once; outcomes arrive through the
/// [`Handler`] given when the backend was created, on the loop thread.
/// Active endpoints, whether opened here or accepted by a listener, are named
/// by their remote address.
///
/// In [`ThreadSafety::Unsafe`](crate::ThreadSafety::Unsafe) mode every
/// operation must be called on the loop thread and fails with `WrongThread`
/// otherwise.
pub trait Backend: Send + Sync {
    /// What this provider supports.
    fn features(&self) -> Features;

    /// Starts listening on `address` (port 0: the system picks one) and
    /// returns the address actually bound. Every connection the listener
    /// accepts gets `params`.
    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError>;

    /// Starts connecting to the listener at `address`. Success or refusal is
    /// reported later (`on_connection_established` on both sides, or
    /// `on_connection_refused` on this side).
    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<(), OpenActiveError>;

    /// Closes the listener on `address` and every connection it accepted.
    /// Each such connection reports `on_connection_closed`; the listener
    /// itself reports nothing.
    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError>;

    /// Closes the active endpoint to `remote` (opened here or accepted).
    /// Sends in flight are cancelled and their keys reported with
    /// `on_connection_closed`; a connection still being opened is reported
    /// with `on_connection_refused` (reason `Cancelled`).
    fn close_active_endpoint(&self, remote: EndpointAddress) -> Result<(), CloseError>;

    /// A free send buffer of the connection to `remote` (or of the shared
    /// send pool), or `Ok(None)` if every buffer is in flight.
    fn get_buffer(&self, remote: EndpointAddress) -> Result<Option<NetworkBuffer>, BufferError>;

    /// Sends the bytes written into `buffer`. The completion key is
    /// `buffer.index()`; the buffer returns to its pool when the send
    /// completes or is cancelled. On error the buffer returns to its pool at
    /// once.
    fn send_buffer(&self, remote: EndpointAddress, buffer: NetworkBuffer) -> Result<(), SendError>;

    /// Sends `header` (at most [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN)
    /// bytes, copied at once) followed by the bytes of `data`, which must lie
    /// in the connection's registered region and stay untouched until the
    /// completion with `key`. The receiver gets one message.
    fn send_data(
        &self,
        remote: EndpointAddress,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;

    /// Sends `header` followed by `data`, copied at once: the caller may
    /// reuse its memory as soon as this returns. Completes with `key`.
    fn send_data_copy(
        &self,
        remote: EndpointAddress,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;

    /// The smallest number of free send buffers of the connection to
    /// `remote` since the previous call (a low-water mark for monitoring).
    fn num_available_buffers(&self, remote: EndpointAddress) -> Result<usize, BufferError>;

    /// Buffer memory held now.
    fn memory_usage(&self) -> MemoryUsage;
}

macro_rules! forward_backend {
    ($($ty:ty),*) => {$(
        impl<T: Backend + ?Sized> Backend for $ty {
            fn features(&self) -> Features { (**self).features() }
            fn open_listen_endpoint(&self, a: EndpointAddress, p: ConnectionParams)
                -> Result<EndpointAddress, OpenListenError> { (**self).open_listen_endpoint(a, p) }
            fn open_active_endpoint(&self, a: EndpointAddress, p: ConnectionParams)
                -> Result<(), OpenActiveError> { (**self).open_active_endpoint(a, p) }
            fn close_listen_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
                (**self).close_listen_endpoint(a)
            }
            fn close_active_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
                (**self).close_active_endpoint(a)
            }
            fn get_buffer(&self, a: EndpointAddress) -> Result<Option<NetworkBuffer>, BufferError> {
                (**self).get_buffer(a)
            }
            fn send_buffer(&self, a: EndpointAddress, b: NetworkBuffer) -> Result<(), SendError> {
                (**self).send_buffer(a, b)
            }
            fn send_data(&self, a: EndpointAddress, d: &[RegionSlice], h: &[u8], k: u64)
                -> Result<(), SendError> { (**self).send_data(a, d, h, k) }
            fn send_data_copy(&self, a: EndpointAddress, d: &[&[u8]], h: &[u8], k: u64)
                -> Result<(), SendError> { (**self).send_data_copy(a, d, h, k) }
            fn num_available_buffers(&self, a: EndpointAddress) -> Result<usize, BufferError> {
                (**self).num_available_buffers(a)
            }
            fn memory_usage(&self) -> MemoryUsage { (**self).memory_usage() }
        }
    )*};
}
forward_backend!(&T, Box<T>, std::sync::Arc<T>);

/// A provider: creates backends that run on its event loop type.
///
/// Generic application code names a provider to get both its backend and
/// its loop (for signals and timers):
///
/// ```
/// use netio_core::{Backend, BackendConfig, CreateError, EventLoop, NoopHandler, Provider, Signal};
///
/// fn app<P: Provider>(lp: &P::Loop) -> Result<P::Backend, CreateError> {
///     let backend = P::create(lp, BackendConfig::default(), NoopHandler)?;
///     // Signals and timers come from the same loop the backend runs on.
///     let tick = lp.signal(|| println!("tick"));
///     tick.fire();
///     Ok(backend)
/// }
/// ```
pub trait Provider {
    /// The event loop backends of this provider run on.
    type Loop: EventLoop;
    /// The backend type.
    type Backend: Backend + 'static;
    /// Short name for run-time selection (`"sim"`, `"tcp"`, …).
    const NAME: &'static str;

    /// Creates a backend on `event_loop` that reports to `handler`.
    fn create<H: Handler<Self::Backend> + 'static>(
        event_loop: &Self::Loop,
        config: BackendConfig,
        handler: H,
    ) -> Result<Self::Backend, CreateError>;
}
