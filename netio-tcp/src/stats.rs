//! Counters of connections and of the backend, readable through
//! [`TcpBackend::connection_stats`](crate::TcpBackend::connection_stats) and
//! [`TcpBackend::stats`](crate::TcpBackend::stats).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one connection since it was opened or accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnStats {
    /// Sends accepted (every mode).
    pub messages_sent: u64,
    /// Bytes of the sends accepted (headers included).
    pub bytes_sent: u64,
    /// Messages handed to the handler. A read's messages are counted
    /// when the read's pass over them ends (one pair of atomic additions
    /// per read rather than per message), so a handler that reads the
    /// counters in `on_data` may not yet see the messages of its own read.
    pub messages_received: u64,
    /// Bytes of those messages.
    pub bytes_received: u64,
    /// Sends answered `NoResources` (the send queue was full).
    pub no_resources: u64,
    /// The most copy and zero-copy sends in flight at once (high-water
    /// mark of the send queue, at most `send_queue_depth`).
    pub max_in_flight: u64,
}

impl ConnStats {
    /// Adds `other`'s counts to these (the high-water mark is the larger).
    pub(crate) fn absorb(&mut self, other: &ConnStats) {
        self.messages_sent += other.messages_sent;
        self.bytes_sent += other.bytes_sent;
        self.messages_received += other.messages_received;
        self.bytes_received += other.bytes_received;
        self.no_resources += other.no_resources;
        self.max_in_flight = self.max_in_flight.max(other.max_in_flight);
    }
}

/// Counters of a backend since it was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Connections opened with `open_active_endpoint`.
    pub connections_opened: u64,
    /// Connections accepted by listeners (admission refusals not included).
    pub connections_accepted: u64,
    /// Connections established (opened or accepted).
    pub connections_established: u64,
    /// Connections opened here and refused (the peer, the handshake, a
    /// cancel, a timeout).
    pub connections_refused: u64,
    /// Accepted connections closed at once by an admission limit
    /// (`TcpConfig::max_connections_per_listener`). Connections waiting for
    /// a handshake slot (`max_accepted_handshakes`) wait in the listen
    /// backlog and are not counted.
    pub admission_refusals: u64,
    /// Established connections closed by this side.
    pub closed_local: u64,
    /// Established connections closed by the peer in order.
    pub closed_by_peer: u64,
    /// Established connections ended by a reset or a broken stream.
    pub closed_reset: u64,
    /// Established connections given up because the peer stopped
    /// answering (keepalive, `TCP_USER_TIMEOUT`).
    pub closed_timed_out: u64,
    /// Established connections closed for a protocol violation or an
    /// oversized message.
    pub closed_protocol: u64,
    /// The counters of every connection, closed ones included (the
    /// high-water mark is the largest of any connection).
    pub traffic: ConnStats,
}

/// The receive counters of a connection, shared between its entry in the
/// backend and its reader (which counts without the backend's lock, once
/// per batch of messages).
#[derive(Debug, Default)]
pub(crate) struct RecvCounters {
    messages: AtomicU64,
    bytes: AtomicU64,
}

impl RecvCounters {
    pub(crate) fn add(&self, messages: u64, bytes: u64) {
        if messages > 0 {
            self.messages.fetch_add(messages, Ordering::Relaxed);
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// A tally of one pass over a reader's buffer, added to these
    /// counters when the pass ends (however it ends): two atomic additions
    /// a pass instead of two a message.
    pub(crate) fn tally(&self) -> RecvTally<'_> {
        RecvTally {
            counters: self,
            messages: 0,
            bytes: 0,
        }
    }

    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.messages.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// Messages received in one pass (see [`RecvCounters::tally`]).
pub(crate) struct RecvTally<'a> {
    counters: &'a RecvCounters,
    messages: u64,
    bytes: u64,
}

impl RecvTally<'_> {
    /// One message of `bytes` bytes was handed out.
    pub(crate) fn count(&mut self, bytes: usize) {
        self.messages += 1;
        self.bytes += bytes as u64;
    }
}

impl Drop for RecvTally<'_> {
    fn drop(&mut self) {
        self.counters.add(self.messages, self.bytes);
    }
}
