//! The libfabric provider of netio-rs: the netio contract over libfabric
//! connected endpoints (`FI_EP_MSG` with `FI_MSG`) or reliable datagrams
//! (`FI_EP_RDM` with `FI_TAGGED`), on
//! [`MioLoop`](netio_core::mio_loop::MioLoop).
//!
//! The fabric provider is chosen by name ([`LibfabricConfig::provider`]):
//! `tcp` and `sockets` run on any Linux host; `verbs` takes the same code
//! onto RDMA hardware; `shm` connects processes of one node; `efa`, `cxi`,
//! `opx` and the `;ofi_rxm`/`;ofi_rxd` stacks offer reliable datagrams only.
//! The endpoint type is [`LibfabricConfig::endpoint`] ([`EndpointType`]):
//! by default connected endpoints where the fabric provider has them, else
//! reliable datagrams. See `docs/libfabric.md`.
//!
//! # Reliable datagrams
//!
//! One endpoint, completion queue and address vector serve all of a
//! backend's connections. Each connection is a TCP control channel to the
//! peer (set-up with the fabric addresses, credits, close, heartbeats; the
//! protocol is a sans-IO state machine, `src/rdm/proto.rs`) plus tagged
//! messages over the fabric whose tag names the receiving connection. The
//! receiver grants one credit per receive buffer, so the fabric never
//! holds a message nobody posted a buffer for; `peer_timeout` is enforced
//! with heartbeats, and a peer whose control channel ends without a close
//! is reported as `Reset`. Shared receive pools (backend-wide and per
//! listener) are posted on the one endpoint under tags of their own.
//!
//! # How connected endpoints work
//!
//! - A listen endpoint is a passive endpoint with its own event queue, read
//!   on a thread of its own (libfabric 1.17's `tcp` blocks inside
//!   `fi_eq_read` on a half-sent connection request, which must not stop
//!   the loop). A connection request (`FI_CONNREQ`) is handed to the loop,
//!   which opens an endpoint and accepts it (or rejects it beyond
//!   [`LibfabricConfig::max_connections_per_listener`]); `FI_CONNECTED`
//!   establishes the connection, `FI_SHUTDOWN` closes it (`PeerClosed`), an
//!   error event refuses (`Refused`, `Unreachable`) or resets it. A
//!   connection not set up within [`LibfabricConfig::handshake_timeout`]
//!   ends. On `tcp` a guard thread shuts down connections to a listener
//!   whose request has not arrived in that time, and the newest beyond
//!   [`LibfabricConfig::max_pending_handshakes`].
//! - Every connection has its own endpoint, completion queue and event
//!   queue; both queues' wait fds are registered in the loop. Before the
//!   loop sleeps on them `fi_trywait` is called; when it answers
//!   `-FI_EAGAIN` the queues are read again instead.
//! - Receive buffers are one registered allocation per connection
//!   (`recv.num_buf` buffers of `recv.buf_size + 1` bytes: a message one
//!   byte too large arrives whole, so its size is known), all posted.
//!   `on_data` reads a message in place, in its receive buffer, and the
//!   buffer is posted again once `on_data` returns; the completion queue is
//!   then read once more before the loop sleeps (a provider may hold a
//!   message that waited for a buffer without reporting it to
//!   `fi_trywait`). `pause_receive` stops
//!   posting buffers again: the provider then stops taking the peer's data
//!   and the peer's sends back up.
//! - Messages keep their boundaries (`FI_MSG`): no length prefix. A
//!   message larger than the receive buffer is reported by libfabric as a
//!   truncation (`FI_ETRUNC`): the connection closes with
//!   `CloseReason::MessageTooLarge`. A connection opened without receive
//!   buffers posts one small buffer so that a message sent to it is
//!   noticed and closes it with `CloseReason::Protocol`.
//! - Sends: buffered sends send the pool buffer itself (registered on
//!   first use, the registration kept as long as the connection); copy
//!   sends copy into registered memory reused from a pool of the domain
//!   (size classes, no registration per message once warmed up);
//!   zero-copy sends send the header (copied into pooled memory) and the
//!   region's bytes as one gathered message (`fi_sendv`, the region is
//!   registered once per connection), or copy everything into pooled
//!   memory when the provider's gather limit is too small.
//! - Memory is always registered and its descriptor passed, whatever the
//!   provider's `mr_mode`, as `FI_MR_LOCAL` providers (verbs) require;
//!   every operation gets a context of `fi_context2` size
//!   (`FI_CONTEXT`/`FI_CONTEXT2` modes). Entries of `fi_getinfo` asking for
//!   anything else are skipped.
//! - The in-flight ledger is [`netio_core::ledger::SendLedger`].
//!
//! # Limits of connected endpoints
//!
//! - Do not expose a `tcp` or `sockets` listener to untrusted peers:
//!   libfabric 1.17 itself crashes on some protocol-breaking inputs (see
//!   `docs/libfabric.md`, "Exposing a listener").
//! - Shared receive pools are not supported (each endpoint posts its own
//!   registered buffers; sharing them needs shared receive contexts).
//! - A reset by the peer is reported by libfabric 1.17 (`tcp`, `sockets`)
//!   as an orderly `FI_SHUTDOWN`, so it closes with
//!   `CloseReason::PeerClosed`; only the side whose connection broke
//!   locally (`ECONNABORTED` and the like on its completions) reports
//!   `Reset`.
//! - `sockets` keeps completing sends to a receiver that posts no buffers,
//!   so pausing a receiver does not push back on the sender (see
//!   `docs/libfabric.md`); `tcp` pushes back. Use `tcp`.
//! - Liveness: libfabric 1.17's `tcp`, `sockets` and `verbs` endpoints
//!   offer no keepalive or user timeout, so a peer that becomes unreachable
//!   without a reset would not be noticed: a connected backend refuses
//!   [`BackendConfig::peer_timeout`] at creation
//!   (`CreateError::NotSupported`). Reliable-datagram endpoints
//!   ([`EndpointType::Rdm`]) enforce it.
//!
//! [`BackendConfig::peer_timeout`]: netio_core::BackendConfig::peer_timeout

#![warn(missing_docs)]

mod backend;
mod config;
mod events;
mod ffi;
mod listen;
mod os;
mod rdm;
mod rdm_ffi;

pub use backend::{LibfabricBackend, LibfabricProvider};
pub use config::{EndpointType, LibfabricConfig};
