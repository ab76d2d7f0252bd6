//! The operations every provider offers: [`Backend`], and [`Provider`], which
//! ties a backend type to its event loop type.

use std::time::Duration;

use crate::addr::EndpointAddress;
use crate::buffer::NetworkBuffer;
use crate::conn::ConnId;
use crate::error::{
    BatchSendError, BufferError, ChunkSendError, CloseError, ConnError, CreateError,
    OpenActiveError, OpenListenError, SendError,
};
use crate::event_loop::EventLoop;
use crate::handler::Handler;
use crate::params::{BackendConfig, ConnectionParams, Features};
use crate::region::{RegionChunk, RegionSlice};

/// Buffer memory a backend holds, for monitoring and for checking that
/// shared pools keep memory constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryUsage {
    /// Bytes of receive buffers (per-connection and shared pools).
    pub receive_bytes: usize,
    /// Bytes of send buffers (per-connection and shared pools).
    pub send_bytes: usize,
}

/// One message of [`Backend::send_copy_batch`]: `header` (at most
/// [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN) bytes) followed by `data`,
/// copied at once, completing with `key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyMessage<'a> {
    /// Header bytes, sent before `data`.
    pub header: &'a [u8],
    /// The message body.
    pub data: &'a [u8],
    /// The completion key.
    pub key: u64,
}

impl<'a> CopyMessage<'a> {
    /// A message of `data` with no header, completing with `key`.
    pub fn new(data: &'a [u8], key: u64) -> Self {
        Self {
            header: &[],
            data,
            key,
        }
    }

    /// A message of `header` followed by `data`, completing with `key`.
    pub fn with_header(header: &'a [u8], data: &'a [u8], key: u64) -> Self {
        Self { header, data, key }
    }
}

/// The operations of the contract. Object safe: `Box<dyn Backend>` works for
/// run-time selection, and `fn app<B: Backend>` for static dispatch.
///
/// Every operation returns at once; outcomes arrive through the
/// [`Handler`] given when the backend was created, on the loop thread.
/// Connections, whether opened here or accepted by a listener, are named
/// by their [`ConnId`]; [`connection_to`](Self::connection_to) finds one by
/// remote address for code that thinks in addresses.
///
/// In [`ThreadSafety::Unsafe`](crate::ThreadSafety::Unsafe) mode every
/// operation must be called on the loop thread and fails with `WrongThread`
/// otherwise, except [`features`](Self::features),
/// [`memory_usage`](Self::memory_usage), [`now`](Self::now),
/// [`set_timer`](Self::set_timer) and [`wake`](Self::wake), which work from
/// any thread in both modes.
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

    /// Starts connecting to the listener at `address` and returns the new
    /// connection's handle. Success or refusal is reported later
    /// (`on_connection_established` on both sides, or
    /// `on_connection_refused` on this side), with this handle. Several
    /// connections to one address are distinct connections.
    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError>;

    /// Closes the listener on `address` and every connection it accepted.
    /// Each such connection reports `on_connection_closed`; the listener
    /// itself reports nothing.
    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError>;

    /// Closes the connection `conn` (opened here or accepted). Sends in
    /// flight are cancelled and their keys reported with
    /// `on_connection_closed`; a connection still being opened is reported
    /// with `on_connection_refused` (reason `Cancelled`). The handle is
    /// stale as soon as this returns `Ok`.
    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError>;

    /// A free send buffer of `conn` (or of the shared send pool), or
    /// `Ok(None)` if every buffer is in flight.
    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError>;

    /// Sends the bytes written into `buffer`, completing with `key` (pass
    /// `buffer.index() as u64` for netio3's buffer-index keys). The buffer
    /// returns to its pool when the send completes or is cancelled; on error
    /// it returns to its pool at once.
    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError>;

    /// Sends `header` (at most [`MAX_HEADER_LEN`](crate::MAX_HEADER_LEN)
    /// bytes, copied at once) followed by the bytes of `data`, which must lie
    /// in the connection's registered region and stay untouched until the
    /// completion with `key`. The receiver gets one message.
    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;

    /// Sends `header` followed by the bytes of `chunk`, a piece of the
    /// connection's registered region filled in place
    /// ([`MemoryRegion::chunk`](crate::MemoryRegion::chunk)): zero-copy
    /// without `unsafe`. Completes with `key`; the chunk's range is free for
    /// the next `chunk` once the send completes or is cancelled. When the
    /// send is refused the error gives the chunk back unchanged, so it can
    /// be sent again after `NoResources`.
    ///
    /// Provided: it hands the chunk's range to
    /// [`send_data`](Self::send_data), read-only, so every provider that
    /// sends zero-copy supports it.
    fn send_chunk(
        &self,
        conn: ConnId,
        chunk: RegionChunk,
        header: &[u8],
        key: u64,
    ) -> Result<(), ChunkSendError> {
        let sending = chunk.into_sending();
        match self.send_data(conn, &[sending.slice()], header, key) {
            Ok(()) => Ok(()),
            Err(error) => Err(ChunkSendError {
                error,
                chunk: sending.into_chunk(),
            }),
        }
    }

    /// Sends `header` followed by `data`, copied at once: the caller may
    /// reuse its memory as soon as this returns. Completes with `key`.
    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError>;

    /// Sends every message of `messages` in order, as that many
    /// [`send_data_copy`](Self::send_data_copy) calls would, each completing
    /// with its own key. Providers that can do better check the thread and
    /// the connection and take their locks once for the whole batch (the
    /// TCP provider does), so small messages are cheapest sent this way.
    ///
    /// Stops at the first message refused: the error says how many were
    /// accepted before it ([`BatchSendError::sent`]); none after it is
    /// tried. After `NoResources`, sending the rest again once sends have
    /// completed works.
    fn send_copy_batch(
        &self,
        conn: ConnId,
        messages: &[CopyMessage<'_>],
    ) -> Result<(), BatchSendError> {
        for (sent, m) in messages.iter().enumerate() {
            self.send_data_copy(conn, &[m.data], m.header, m.key)
                .map_err(|error| BatchSendError { sent, error })?;
        }
        Ok(())
    }

    /// Sends the buffers of `buffers` in order, each completing with the
    /// key paired with it, as that many
    /// [`send_buffer`](Self::send_buffer) calls would; providers that can
    /// take their locks once for the whole batch do. Sent buffers are taken
    /// out of `buffers`: it is empty on success.
    ///
    /// Stops at the first buffer refused: the error says how many were
    /// accepted before it; the refused buffer returns to its pool (as with
    /// `send_buffer`), and the ones after it stay in `buffers`, in order.
    fn send_buffer_batch(
        &self,
        conn: ConnId,
        buffers: &mut Vec<(NetworkBuffer, u64)>,
    ) -> Result<(), BatchSendError> {
        send_buffers_in_order(buffers, |buffer, key| self.send_buffer(conn, buffer, key))
    }

    /// Takes up to `max` free send buffers of `conn` (or of the shared send
    /// pool) and appends them to `out`, returning how many it took (0 when
    /// every buffer is in flight). One call instead of `max`
    /// [`get_buffer`](Self::get_buffer) calls; providers that can take
    /// their locks once do.
    fn get_buffers(
        &self,
        conn: ConnId,
        max: usize,
        out: &mut Vec<NetworkBuffer>,
    ) -> Result<usize, BufferError> {
        let mut n = 0;
        while n < max {
            match self.get_buffer(conn)? {
                Some(b) => out.push(b),
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }

    /// The smallest number of free send buffers of `conn` since the
    /// previous call (a low-water mark for monitoring).
    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError>;

    /// Stops delivering messages of `conn` (receive-side flow control).
    /// After this returns no `on_data` comes for `conn` until
    /// [`resume_receive`](Self::resume_receive); the provider stops taking
    /// the peer's data, so the peer's sends back up until they answer
    /// `NoResources`. Pausing a paused connection does nothing. Allowed
    /// while the connection is still opening.
    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError>;

    /// Delivers messages of `conn` again, in order, starting with those held
    /// while it was paused. Resuming a connection that is not paused does
    /// nothing.
    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError>;

    /// The remote address of `conn` (opening, open or accepted).
    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError>;

    /// A connection (opening, open or accepted) whose remote address is
    /// `remote`; of several, the one opened or accepted first. For code that
    /// names peers by address (as netio3 does).
    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError>;

    /// Buffer memory held now.
    fn memory_usage(&self) -> MemoryUsage;

    /// The time on the backend's event loop clock: the time since the loop
    /// was created on a real loop, virtual time on the simulator. Generic
    /// code that reads time only here stays deterministic on the
    /// simulator.
    fn now(&self) -> Duration;

    /// Calls `Handler::on_timer(token)` once, on the loop thread, `delay`
    /// from [`now`](Self::now) (virtual time on the simulator). Timers with
    /// equal deadlines run in the order they were set. There is no cancel:
    /// a handler ignores tokens it no longer wants (put a generation in
    /// the token). Callable from any thread.
    fn set_timer(&self, delay: Duration, token: u64);

    /// Calls `Handler::on_wake(token)` once, on the loop thread, soon;
    /// never from inside this call. Callable from any thread: this is how
    /// other threads hand work to the handler.
    fn wake(&self, token: u64);
}

/// Sends the buffers of `buffers` in order with `send`, with the semantics
/// of [`Backend::send_buffer_batch`]: sent buffers leave the vector; at the
/// first refusal the error says how many went before it, the refused
/// buffer is `send`'s (it returns to its pool when dropped) and the rest
/// stay in the vector. For providers that override `send_buffer_batch`
/// with their own per-buffer send under one lock.
pub fn send_buffers_in_order(
    buffers: &mut Vec<(NetworkBuffer, u64)>,
    mut send: impl FnMut(NetworkBuffer, u64) -> Result<(), SendError>,
) -> Result<(), BatchSendError> {
    let mut rest = std::mem::take(buffers).into_iter();
    let mut sent = 0;
    while let Some((buffer, key)) = rest.next() {
        if let Err(error) = send(buffer, key) {
            buffers.extend(rest);
            return Err(BatchSendError { sent, error });
        }
        sent += 1;
    }
    Ok(())
}

macro_rules! forward_backend {
    ($($ty:ty),*) => {$(
        impl<T: Backend + ?Sized> Backend for $ty {
            fn features(&self) -> Features { (**self).features() }
            fn open_listen_endpoint(&self, a: EndpointAddress, p: ConnectionParams)
                -> Result<EndpointAddress, OpenListenError> { (**self).open_listen_endpoint(a, p) }
            fn open_active_endpoint(&self, a: EndpointAddress, p: ConnectionParams)
                -> Result<ConnId, OpenActiveError> { (**self).open_active_endpoint(a, p) }
            fn close_listen_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
                (**self).close_listen_endpoint(a)
            }
            fn close_active_endpoint(&self, c: ConnId) -> Result<(), CloseError> {
                (**self).close_active_endpoint(c)
            }
            fn get_buffer(&self, c: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
                (**self).get_buffer(c)
            }
            fn send_buffer(&self, c: ConnId, b: NetworkBuffer, k: u64) -> Result<(), SendError> {
                (**self).send_buffer(c, b, k)
            }
            fn send_data(&self, c: ConnId, d: &[RegionSlice], h: &[u8], k: u64)
                -> Result<(), SendError> { (**self).send_data(c, d, h, k) }
            fn send_data_copy(&self, c: ConnId, d: &[&[u8]], h: &[u8], k: u64)
                -> Result<(), SendError> { (**self).send_data_copy(c, d, h, k) }
            fn send_copy_batch(&self, c: ConnId, m: &[CopyMessage<'_>])
                -> Result<(), BatchSendError> { (**self).send_copy_batch(c, m) }
            fn send_buffer_batch(&self, c: ConnId, b: &mut Vec<(NetworkBuffer, u64)>)
                -> Result<(), BatchSendError> { (**self).send_buffer_batch(c, b) }
            fn get_buffers(&self, c: ConnId, max: usize, out: &mut Vec<NetworkBuffer>)
                -> Result<usize, BufferError> { (**self).get_buffers(c, max, out) }
            fn num_available_buffers(&self, c: ConnId) -> Result<usize, BufferError> {
                (**self).num_available_buffers(c)
            }
            fn pause_receive(&self, c: ConnId) -> Result<(), ConnError> { (**self).pause_receive(c) }
            fn resume_receive(&self, c: ConnId) -> Result<(), ConnError> { (**self).resume_receive(c) }
            fn remote_address(&self, c: ConnId) -> Result<EndpointAddress, ConnError> {
                (**self).remote_address(c)
            }
            fn connection_to(&self, r: EndpointAddress) -> Result<ConnId, ConnError> {
                (**self).connection_to(r)
            }
            fn memory_usage(&self) -> MemoryUsage { (**self).memory_usage() }
            fn now(&self) -> Duration { (**self).now() }
            fn set_timer(&self, d: Duration, t: u64) { (**self).set_timer(d, t) }
            fn wake(&self, t: u64) { (**self).wake(t) }
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
