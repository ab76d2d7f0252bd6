//! The provider-agnostic contract of netio-rs.
//!
//! Applications are written against these traits and run unchanged on every
//! provider: the deterministic simulator (`netio-sim`), TCP (`netio-tcp`) or
//! libfabric. This crate holds:
//!
//! - value types: [`EndpointAddress`], [`ConnId`] (connection handles),
//!   [`ConnectionParams`],
//!   [`Capabilities`], [`BackendConfig`], [`Features`];
//! - errors, one enum per operation family ([`OpenListenError`],
//!   [`OpenActiveError`], [`CloseError`], [`BufferError`], [`SendError`]),
//!   each with `is_retryable()`;
//! - the traits: [`Backend`] (operations), [`Handler`] (events),
//!   [`EventLoop`], [`Signal`], [`Timer`], and [`Provider`] (ties a backend to
//!   its loop);
//! - shared machinery for providers: [`BufferPool`] and [`NetworkBuffer`],
//!   [`MemoryRegion`] for zero-copy sends, [`ConnTable`] (connections by
//!   handle), [`TimerQueue`] (handler timers);
//! - the real event loop on mio, [`mio_loop::MioLoop`].
//!
//! # For users
//!
//! Write the application generic over the backend, hand a [`Handler`] to the
//! provider, run the loop. The handler gets the backend in every callback so
//! it can reply or close:
//!
//! ```
//! use netio_core::{Backend, Capabilities, ConnId, EndpointAddress, Handler};
//!
//! /// Sends a greeting on every new connection and echoes what arrives.
//! struct App;
//!
//! impl<B: Backend + ?Sized> Handler<B> for App {
//!     fn on_connection_established(
//!         &mut self,
//!         b: &B,
//!         conn: ConnId,
//!         _remote: EndpointAddress,
//!         caps: Capabilities,
//!     ) {
//!         if caps.send_copy {
//!             let _ = b.send_data_copy(conn, &[b"hello"], &[], 1);
//!         }
//!     }
//!     fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
//!         let _ = b.send_data_copy(conn, &[data], &[], 2);
//!     }
//! }
//! ```
//!
//! # For provider authors
//!
//! Implement [`Backend`] and [`Provider`], reuse [`BufferPool`] and
//! [`MemoryRegion`], and run the shared behavioural suite from
//! `netio-conformance` in your crate (see `docs/provider-guide.md`).

#![warn(missing_docs)]

mod addr;
mod backend;
mod buffer;
mod conn;
mod error;
mod event_loop;
pub mod fast_map;
mod free_list;
mod handler;
pub mod ledger;
pub mod mio_loop;
mod params;
pub mod preamble;
mod region;
mod sync;
mod timer_queue;

pub use addr::{AddressError, EndpointAddress};
pub use backend::{send_buffers_in_order, Backend, CopyMessage, MemoryUsage, Provider};
pub use buffer::{BufferFull, BufferPool, NetworkBuffer, WireInt};
pub use conn::{ConnId, ConnTable};
pub use error::{
    BatchSendError, BufferError, ChunkSendError, CloseError, ConnError, CreateError,
    OpenActiveError, OpenListenError, SendError, Source,
};
pub use event_loop::{thread_token, EventLoop, Signal, Timer};
pub use handler::{CloseReason, DynHandler, Handler, NoopHandler, RefuseReason};
pub use params::{
    BackendConfig, BufferedSendParams, Capabilities, ConnectionParams, Features, NetworkMode,
    PoolParams, RecvParams, ThreadSafety, DEFAULT_SEND_QUEUE_DEPTH, MAX_HEADER_LEN,
};
pub use region::{Lent, MemoryRegion, RegionChunk, RegionError, RegionSlice};
pub use timer_queue::TimerQueue;

/// Locks a std mutex, ignoring poisoning (state is kept consistent before
/// anything that can panic).
pub(crate) fn sync_std_lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
