//! The suite tests itself: a catalogue of deliberately broken providers,
//! each a wrapper around the simulator that breaks exactly one rule of the
//! contract. For each, the whole suite runs against it and the test named
//! after the broken rule must be among the failures (in both thread modes
//! where it runs in both). A control entry that breaks nothing must pass
//! everything, so the wrapper itself is faithful.
//!
//! The bug is chosen at run time (`select`), so the suite is compiled once
//! for the whole catalogue (as a type parameter per bug it was compiled
//! thirty times: about four minutes of the workspace's build); the entries
//! run one at a time, each running many behaviours at once.
//!
//! Run with `--nocapture` to see, for each broken provider, every failing
//! test and the first line of its failure.

mod sim_harness;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use netio_conformance::{behaviours, Event, Harness, NodeId};
use netio_core::{
    Backend, BackendConfig, BatchSendError, BufferError, Capabilities, CloseError, CloseReason,
    ConnError, ConnId, ConnectionParams, CopyMessage, EndpointAddress, EventLoop, Features,
    Handler, Lent, MemoryRegion, MemoryUsage, NetworkBuffer, OpenActiveError, OpenListenError,
    RefuseReason, RegionSlice, SendError, Signal, ThreadSafety,
};
use netio_sim::{SimBackend, SimLoop, SimSignal};
use sim_harness::SimRdmaHarness;

// ------------------------------------------------------------------ the bugs

/// Breaks nothing (the control).
const NONE: u8 = 0;
/// Drops the first key of every non-empty `cancelled_keys`.
const DROP_CANCELLED_KEY: u8 = 1;
/// Reports every completion twice.
const COMPLETION_TWICE: u8 = 2;
/// Delivers every 7th message twice.
const DATA_TWICE: u8 = 3;
/// Swaps messages pairwise.
const DATA_REORDERED: u8 = 4;
/// Holds `on_connection_established` back until the next event of the
/// connection has been delivered.
const DATA_BEFORE_ESTABLISHED: u8 = 5;
/// Reports copy sends completed as soon as they are queued, before they
/// reached the peer, and forgets their real outcome.
const COMPLETE_EARLY: u8 = 6;
/// Delivers messages a little later, and drops those not yet delivered
/// when the connection's close comes first.
const SWALLOW_BEFORE_CLOSE: u8 = 7;
/// Receives into buffers twice the size asked for, so oversize messages
/// are delivered.
const OVERSIZE_DELIVERED: u8 = 8;
/// Answers `UnknownListenEndpoint` where `UnknownConnection` is due.
const WRONG_ERROR_VARIANT: u8 = 9;
/// Reports a copy send completed from inside `send_data_copy`.
const REENTRANT_COMPLETION: u8 = 10;
/// Queues copy sends without bound instead of answering `NoResources`.
const NO_BACKPRESSURE: u8 = 11;
/// Reports a peer's orderly close as a reset.
const WRONG_CLOSE_REASON: u8 = 12;
/// Delivers the last message once more after the close.
const EVENT_AFTER_CLOSE: u8 = 13;
/// Leaks a listener per closed connection.
const LEAK_PER_CLOSE: u8 = 14;
/// `num_available_buffers` gives the current count, not the low-water mark.
const LOW_WATER_NOT_KEPT: u8 = 15;
/// `send_data` drops the header.
const HEADER_DROPPED: u8 = 16;
/// Reports a refused connection as closed.
const REFUSED_AS_CLOSED: u8 = 17;
/// Calls the handler while holding the lock its operations take.
const HANDLER_UNDER_LOCK: u8 = 18;
/// `pause_receive` answers `Ok` but does not pause.
const DELIVERS_WHILE_PAUSED: u8 = 19;
/// Reports each batch of completions after the next batch of its
/// connection (batches out of send order).
const BATCHES_OUT_OF_ORDER: u8 = 20;
/// Calls `on_send_completed` per key instead of `on_sends_completed`.
const COMPLETIONS_NOT_BATCHED: u8 = 21;
/// Runs timers after half their delay.
const TIMER_EARLY: u8 = 22;
/// Calls `on_wake` from inside `wake`.
const WAKE_INSIDE_THE_CALL: u8 = 23;
/// Ignores `peer_timeout`.
const NO_PEER_TIMEOUT: u8 = 24;
/// `send_copy_batch` goes on past a refused message, sending the rest.
const BATCH_PAST_REFUSAL: u8 = 25;
/// `now()` stops advancing after its first call (a cached clock), and
/// timers measure their deadlines from it (so they fire early).
const CACHED_CLOCK: u8 = 26;
/// Keeps the region ranges of zero-copy sends that a close cancelled (the
/// region leaks until the backend is dropped).
const CHUNK_KEPT_ON_CANCEL: u8 = 27;
/// Ignores `peer_timeout`, behind a harness that cannot partition but
/// silences a peer instead.
const NO_PEER_TIMEOUT_SILENCED: u8 = 28;
/// Forgets the keys of sends in flight on the connections a closed
/// listener accepted.
const LISTENER_CLOSE_FORGETS_KEYS: u8 = 29;
/// Keeps every buffer given to `send_buffer` (sending a copy of its bytes
/// instead), so the pool drains for good.
const SEND_BUFFER_LEAK: u8 = 30;
/// Breaks nothing, but has no copy sends: `send_data_copy` and
/// `send_copy_batch` answer `NotSupported`, connections are established
/// without the `send_copy` capability, and the features say so (a
/// provider the suite must pass with `unsupported = [send_copy]`).
const NO_COPY: u8 = 31;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Inner = Box<dyn Handler<BrokenBackend>>;

/// What one broken backend shares between its handle and its handler.
#[derive(Default)]
struct Shared {
    bug: u8,
    handler: Mutex<Option<Inner>>,
    backend: OnceLock<BrokenBackend>,
    /// Events delivered later, by `flush`.
    pending: Mutex<VecDeque<Event>>,
    flush: OnceLock<SimSignal>,
    /// Keys already reported completed (early or re-entrantly).
    early: Mutex<Vec<u64>>,
    /// Copy sends queued by `NO_BACKPRESSURE`.
    backlog: Mutex<VecDeque<(ConnId, Vec<u8>, u64)>>,
    /// Per-connection state: held events, the last message, a counter.
    held: Mutex<HashMap<ConnId, Vec<Event>>>,
    last: Mutex<HashMap<ConnId, Vec<u8>>>,
    count: Mutex<u64>,
    /// The provider's lock of `HANDLER_UNDER_LOCK`.
    big_lock: Mutex<()>,
    ip: OnceLock<IpAddr>,
    /// The first reading of `now()` (`CACHED_CLOCK`).
    clock: OnceLock<Duration>,
    /// Zero-copy regions of the connections (`CHUNK_KEPT_ON_CANCEL`).
    regions: Mutex<Vec<MemoryRegion>>,
    /// Ranges of zero-copy sends in flight, and those kept for good.
    lent: Mutex<HashMap<(ConnId, u64), Lent>>,
    kept: Mutex<Vec<Lent>>,
    /// Buffers kept for good (`SEND_BUFFER_LEAK`).
    leaked: Mutex<Vec<NetworkBuffer>>,
}

/// A simulator backend with one rule broken.
#[derive(Clone)]
struct BrokenBackend {
    inner: SimBackend,
    shared: Arc<Shared>,
}

impl BrokenBackend {
    fn bug(&self) -> u8 {
        self.shared.bug
    }
    fn guard(&self) -> Option<MutexGuard<'_, ()>> {
        (self.bug() == HANDLER_UNDER_LOCK).then(|| lock(&self.shared.big_lock))
    }
    fn widen(&self, mut p: ConnectionParams) -> ConnectionParams {
        if self.bug() == OVERSIZE_DELIVERED && p.recv.buf_size > 0 {
            p.recv.buf_size *= 2;
        }
        if let (CHUNK_KEPT_ON_CANCEL, Some(r)) = (self.bug(), &p.send_zero_copy) {
            lock(&self.shared.regions).push(r.clone());
        }
        p
    }
}

/// Delivers `events` to `h`: consecutive completions of one connection as
/// one `on_sends_completed` batch (per key for `COMPLETIONS_NOT_BATCHED`).
fn deliver(h: &mut dyn Handler<BrokenBackend>, b: &BrokenBackend, events: &[Event]) {
    let mut i = 0;
    while i < events.len() {
        match &events[i] {
            Event::Established { conn, remote, caps } => {
                let caps = Capabilities {
                    send_copy: caps.send_copy && b.bug() != NO_COPY,
                    ..*caps
                };
                h.on_connection_established(b, *conn, *remote, caps)
            }
            Event::Refused {
                conn,
                remote,
                reason,
            } => h.on_connection_refused(b, *conn, *remote, reason),
            Event::Closed {
                conn,
                remote,
                reason,
                keys,
            } => h.on_connection_closed(b, *conn, *remote, reason, keys),
            Event::Data { conn, data } => h.on_data(b, *conn, data),
            Event::Completed { conn, .. } => {
                let mut keys = Vec::new();
                while let Some(Event::Completed { conn: c, key }) = events.get(i) {
                    if c != conn {
                        break;
                    }
                    keys.push(*key);
                    i += 1;
                }
                if b.bug() == COMPLETIONS_NOT_BATCHED {
                    for k in keys {
                        h.on_send_completed(b, *conn, k);
                    }
                } else {
                    h.on_sends_completed(b, *conn, &keys);
                }
                continue;
            }
            Event::Timer { token, .. } => h.on_timer(b, *token),
            Event::Wake { token, .. } => h.on_wake(b, *token),
        }
        i += 1;
    }
}

fn conn_of(e: &Event) -> Option<ConnId> {
    e.conn()
}

impl Shared {
    /// Delivers events to the suite's handler.
    fn dispatch(&self, events: Vec<Event>) {
        let Some(b) = self.backend.get() else { return };
        let _g = (self.bug == HANDLER_UNDER_LOCK).then(|| lock(&self.big_lock));
        let mut h = lock(&self.handler);
        if let Some(h) = h.as_mut() {
            deliver(h.as_mut(), b, &events);
        }
    }

    /// Delivers what was put aside for later.
    fn flush(&self) {
        let events: Vec<Event> = lock(&self.pending).drain(..).collect();
        self.dispatch(events);
    }

    fn later(&self, e: Event) {
        lock(&self.pending).push_back(e);
        if let Some(s) = self.flush.get() {
            s.fire();
        }
    }

    /// The broken provider's view of one handler call of the simulator.
    fn on_call(&self, events: Vec<Event>) {
        let mut out = Vec::new();
        if self.bug == BATCHES_OUT_OF_ORDER {
            if let Some(Event::Completed { conn, .. }) = events.first() {
                let conn = *conn;
                let mut held = lock(&self.held);
                match held.remove(&conn) {
                    Some(earlier) => {
                        out.extend(events);
                        out.extend(earlier);
                    }
                    None => {
                        held.insert(conn, events);
                    }
                }
                drop(held);
                self.dispatch(out);
                return;
            }
        }
        for e in events {
            self.on_event(e, &mut out);
        }
        self.dispatch(out);
    }

    /// The broken provider's view of one event from the simulator.
    fn on_event(&self, e: Event, out: &mut Vec<Event>) {
        match (self.bug, e) {
            (
                DROP_CANCELLED_KEY,
                Event::Closed {
                    conn,
                    remote,
                    reason,
                    mut keys,
                },
            ) => {
                if !keys.is_empty() {
                    keys.remove(0);
                }
                out.push(Event::Closed {
                    conn,
                    remote,
                    reason,
                    keys,
                });
            }
            (COMPLETION_TWICE, e @ Event::Completed { .. }) => {
                out.push(e.clone());
                out.push(e);
            }
            (DATA_TWICE, e @ Event::Data { .. }) => {
                let mut n = lock(&self.count);
                *n += 1;
                if *n % 7 == 0 {
                    out.push(e.clone());
                }
                out.push(e);
            }
            (DATA_REORDERED, e) if conn_of(&e).is_some() => {
                let r = conn_of(&e).expect("a connection event");
                let mut held = lock(&self.held);
                match e {
                    Event::Data { .. } => match held.remove(&r) {
                        Some(first) => {
                            out.push(e);
                            out.extend(first);
                        }
                        None => {
                            held.insert(r, vec![e]);
                        }
                    },
                    other => {
                        out.extend(held.remove(&r).into_iter().flatten());
                        out.push(other);
                    }
                }
            }
            (BATCHES_OUT_OF_ORDER, e) if conn_of(&e).is_some() => {
                // A batch held back by `on_call` comes before anything else
                // of its connection.
                let r = conn_of(&e).expect("a connection event");
                out.extend(lock(&self.held).remove(&r).into_iter().flatten());
                out.push(e);
            }
            (DATA_BEFORE_ESTABLISHED, e) if conn_of(&e).is_some() => {
                let r = conn_of(&e).expect("a connection event");
                let mut held = lock(&self.held);
                if matches!(e, Event::Established { .. }) {
                    held.insert(r, vec![e]);
                } else {
                    out.push(e);
                    out.extend(held.remove(&r).into_iter().flatten());
                }
            }
            (COMPLETE_EARLY | REENTRANT_COMPLETION, Event::Completed { conn, key }) => {
                let mut early = lock(&self.early);
                if let Some(i) = early.iter().position(|k| *k == key) {
                    early.swap_remove(i);
                } else {
                    out.push(Event::Completed { conn, key });
                }
            }
            (
                COMPLETE_EARLY | REENTRANT_COMPLETION,
                Event::Closed {
                    conn,
                    remote,
                    reason,
                    keys,
                },
            ) => {
                let mut early = lock(&self.early);
                let keys = keys
                    .into_iter()
                    .filter(|k| match early.iter().position(|x| x == k) {
                        Some(i) => {
                            early.swap_remove(i);
                            false
                        }
                        None => true,
                    })
                    .collect();
                out.push(Event::Closed {
                    conn,
                    remote,
                    reason,
                    keys,
                });
            }
            (SWALLOW_BEFORE_CLOSE, e @ Event::Data { .. }) => {
                self.later(e);
            }
            (SWALLOW_BEFORE_CLOSE, e @ Event::Closed { .. }) => {
                let r = conn_of(&e);
                lock(&self.pending).retain(|p| conn_of(p) != r);
                out.push(e);
            }
            (NO_BACKPRESSURE, e @ Event::Completed { .. }) => {
                out.push(e);
                let b = self.backend.get().expect("backend").inner.clone();
                let mut backlog = lock(&self.backlog);
                while let Some((to, data, key)) = backlog.pop_front() {
                    if b.send_data_copy(to, &[&data], &[], key).is_err() {
                        backlog.push_front((to, data, key));
                        break;
                    }
                }
            }
            (
                WRONG_CLOSE_REASON,
                Event::Closed {
                    conn,
                    remote,
                    reason,
                    keys,
                },
            ) => {
                let reason = if reason == CloseReason::PeerClosed {
                    CloseReason::Reset
                } else {
                    reason
                };
                out.push(Event::Closed {
                    conn,
                    remote,
                    reason,
                    keys,
                });
            }
            (EVENT_AFTER_CLOSE, e) if conn_of(&e).is_some() => {
                let r = conn_of(&e).expect("a connection event");
                match &e {
                    Event::Data { data, .. } => {
                        lock(&self.last).insert(r, data.clone());
                        out.push(e);
                    }
                    Event::Closed { .. } => {
                        out.push(e);
                        if let Some(data) = lock(&self.last).remove(&r) {
                            out.push(Event::Data { conn: r, data });
                        }
                    }
                    _ => out.push(e),
                }
            }
            (LEAK_PER_CLOSE, e @ Event::Closed { .. }) => {
                let b = self.backend.get().expect("backend").inner.clone();
                let ip = *self.ip.get().expect("ip");
                let _ = b.open_listen_endpoint(
                    EndpointAddress::new(ip, 0),
                    ConnectionParams::receive(64, 1),
                );
                out.push(e);
            }
            (
                REFUSED_AS_CLOSED,
                Event::Refused {
                    conn,
                    remote,
                    reason,
                },
            ) => out.push(Event::Closed {
                conn,
                remote,
                reason: CloseReason::Other(reason.to_string()),
                keys: Vec::new(),
            }),
            (CHUNK_KEPT_ON_CANCEL, e @ Event::Completed { .. }) => {
                if let Event::Completed { conn, key } = &e {
                    lock(&self.lent).remove(&(*conn, *key));
                }
                out.push(e);
            }
            (CHUNK_KEPT_ON_CANCEL, e @ Event::Closed { .. }) => {
                if let Event::Closed { conn, keys, .. } = &e {
                    let mut lent = lock(&self.lent);
                    let mut kept = lock(&self.kept);
                    kept.extend(keys.iter().filter_map(|k| lent.remove(&(*conn, *k))));
                }
                out.push(e);
            }
            (
                LISTENER_CLOSE_FORGETS_KEYS,
                Event::Closed {
                    conn,
                    remote,
                    reason: CloseReason::ListenerClosed,
                    ..
                },
            ) => out.push(Event::Closed {
                conn,
                remote,
                reason: CloseReason::ListenerClosed,
                keys: Vec::new(),
            }),
            (_, e) => out.push(e),
        }
    }
}

/// The handler given to the simulator.
struct Wrap(Arc<Shared>);

impl Handler<SimBackend> for Wrap {
    fn on_connection_established(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.0
            .on_call(vec![Event::Established { conn, remote, caps }]);
    }
    fn on_connection_refused(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        self.0.on_call(vec![Event::Refused {
            conn,
            remote,
            reason: reason.clone(),
        }]);
    }
    fn on_connection_closed(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        self.0.on_call(vec![Event::Closed {
            conn,
            remote,
            reason: reason.clone(),
            keys: keys.to_vec(),
        }]);
    }
    fn on_data(&mut self, _: &SimBackend, conn: ConnId, data: &[u8]) {
        self.0.on_call(vec![Event::Data {
            conn,
            data: data.to_vec(),
        }]);
    }
    fn on_sends_completed(&mut self, _: &SimBackend, conn: ConnId, keys: &[u64]) {
        let events = keys
            .iter()
            .map(|&key| Event::Completed { conn, key })
            .collect();
        self.0.on_call(events);
    }
    fn on_timer(&mut self, b: &SimBackend, token: u64) {
        self.0.on_call(vec![Event::Timer { token, at: b.now() }]);
    }
    fn on_wake(&mut self, b: &SimBackend, token: u64) {
        self.0.on_call(vec![Event::Wake { token, at: b.now() }]);
    }
}

impl Backend for BrokenBackend {
    fn features(&self) -> Features {
        self.inner.features()
    }
    fn open_listen_endpoint(
        &self,
        a: EndpointAddress,
        p: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        let _g = self.guard();
        self.inner.open_listen_endpoint(a, self.widen(p))
    }
    fn open_active_endpoint(
        &self,
        a: EndpointAddress,
        p: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        let _g = self.guard();
        self.inner.open_active_endpoint(a, self.widen(p))
    }
    fn close_listen_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
        let _g = self.guard();
        self.inner.close_listen_endpoint(a)
    }
    fn close_active_endpoint(&self, c: ConnId) -> Result<(), CloseError> {
        let _g = self.guard();
        match self.inner.close_active_endpoint(c) {
            Err(CloseError::UnknownConnection(_)) if self.bug() == WRONG_ERROR_VARIANT => Err(
                CloseError::UnknownListenEndpoint(EndpointAddress::localhost(0)),
            ),
            r => r,
        }
    }
    fn get_buffer(&self, c: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        let _g = self.guard();
        self.inner.get_buffer(c)
    }
    fn send_buffer(&self, c: ConnId, b: NetworkBuffer, k: u64) -> Result<(), SendError> {
        let _g = self.guard();
        if self.bug() == SEND_BUFFER_LEAK {
            // Sends a copy and keeps the buffer for good.
            self.inner.send_data_copy(c, &[b.as_slice()], &[], k)?;
            lock(&self.shared.leaked).push(b);
            return Ok(());
        }
        self.inner.send_buffer(c, b, k)
    }
    fn send_data(&self, c: ConnId, d: &[RegionSlice], h: &[u8], k: u64) -> Result<(), SendError> {
        let _g = self.guard();
        let h = if self.bug() == HEADER_DROPPED {
            &[][..]
        } else {
            h
        };
        self.inner.send_data(c, d, h, k)?;
        if self.bug() == CHUNK_KEPT_ON_CANCEL {
            let lent = lock(&self.shared.regions)
                .iter()
                .find_map(|r| r.lend(d).ok());
            if let Some(l) = lent {
                lock(&self.shared.lent).insert((c, k), l);
            }
        }
        Ok(())
    }
    fn send_copy_batch(&self, c: ConnId, m: &[CopyMessage<'_>]) -> Result<(), BatchSendError> {
        if self.bug() == NO_COPY {
            return Err(BatchSendError {
                sent: 0,
                error: SendError::NotSupported("copy sends"),
            });
        }
        let mut first_error = None;
        let mut sent = 0;
        for msg in m {
            match self.send_data_copy(c, &[msg.data], msg.header, msg.key) {
                Ok(()) => sent += 1,
                Err(error) if self.bug() == BATCH_PAST_REFUSAL => {
                    first_error.get_or_insert(error);
                }
                Err(error) => return Err(BatchSendError { sent, error }),
            }
        }
        match first_error {
            Some(error) => Err(BatchSendError { sent, error }),
            None => Ok(()),
        }
    }
    fn send_data_copy(&self, c: ConnId, d: &[&[u8]], h: &[u8], k: u64) -> Result<(), SendError> {
        if self.bug() == NO_COPY {
            return Err(SendError::NotSupported("copy sends"));
        }
        let _g = self.guard();
        let r = self.inner.send_data_copy(c, d, h, k);
        match (self.bug(), r) {
            (COMPLETE_EARLY, Ok(())) => {
                lock(&self.shared.early).push(k);
                self.shared.later(Event::Completed { conn: c, key: k });
                Ok(())
            }
            (REENTRANT_COMPLETION, Ok(())) => {
                lock(&self.shared.early).push(k);
                let done = Event::Completed { conn: c, key: k };
                // From inside this call; when the call itself comes from a
                // handler (the handler is busy), a little later.
                match self.shared.handler.try_lock() {
                    Ok(mut h) => {
                        if let Some(h) = h.as_mut() {
                            deliver(h.as_mut(), self, &[done]);
                        }
                    }
                    Err(_) => self.shared.later(done),
                }
                Ok(())
            }
            (NO_BACKPRESSURE, Err(SendError::NoResources)) => {
                let mut data = h.to_vec();
                d.iter().for_each(|x| data.extend_from_slice(x));
                lock(&self.shared.backlog).push_back((c, data, k));
                Ok(())
            }
            (_, r) => r,
        }
    }
    fn num_available_buffers(&self, c: ConnId) -> Result<usize, BufferError> {
        let _g = self.guard();
        let first = self.inner.num_available_buffers(c);
        if self.bug() == LOW_WATER_NOT_KEPT {
            // The second read gives the current count.
            return first.and_then(|_| self.inner.num_available_buffers(c));
        }
        first
    }
    fn pause_receive(&self, c: ConnId) -> Result<(), ConnError> {
        let _g = self.guard();
        if self.bug() == DELIVERS_WHILE_PAUSED {
            // Checks the handle, pauses nothing.
            return self.inner.remote_address(c).map(|_| ());
        }
        self.inner.pause_receive(c)
    }
    fn resume_receive(&self, c: ConnId) -> Result<(), ConnError> {
        let _g = self.guard();
        self.inner.resume_receive(c)
    }
    fn remote_address(&self, c: ConnId) -> Result<EndpointAddress, ConnError> {
        let _g = self.guard();
        self.inner.remote_address(c)
    }
    fn connection_to(&self, r: EndpointAddress) -> Result<ConnId, ConnError> {
        let _g = self.guard();
        self.inner.connection_to(r)
    }
    fn memory_usage(&self) -> MemoryUsage {
        self.inner.memory_usage()
    }
    fn now(&self) -> Duration {
        if self.bug() == CACHED_CLOCK {
            return *self.shared.clock.get_or_init(|| self.inner.now());
        }
        self.inner.now()
    }
    fn set_timer(&self, d: Duration, t: u64) {
        let d = match self.bug() {
            TIMER_EARLY => d / 2,
            // The deadline on the cached clock, the wait on the real one.
            CACHED_CLOCK => (self.now() + d).saturating_sub(self.inner.now()),
            _ => d,
        };
        self.inner.set_timer(d, t)
    }
    fn wake(&self, t: u64) {
        if self.bug() != WAKE_INSIDE_THE_CALL {
            return self.inner.wake(t);
        }
        let woken = Event::Wake {
            token: t,
            at: self.inner.now(),
        };
        match self.shared.handler.try_lock() {
            Ok(mut h) => {
                if let Some(h) = h.as_mut() {
                    deliver(h.as_mut(), self, &[woken]);
                }
            }
            Err(_) => self.shared.later(woken),
        }
    }
}

/// The simulator's harness with the backends broken by the bug selected
/// when it was set up (see [`select`]).
///
/// It wraps the simulator's RDMA profile, where a completion means the
/// peer has the message: on the TCP profile a send completes as soon as
/// the connection's window takes it, so a provider that completes early
/// (bug `COMPLETE_EARLY`) differs from a correct one only while a window
/// is full. The suite runs unbroken on both profiles (tests `sim` and
/// `sim_rdma`).
struct Broken {
    sim: SimRdmaHarness,
    bug: u8,
}

impl Harness for Broken {
    type Loop = SimLoop;
    type Backend = BrokenBackend;

    fn setup() -> Self {
        Self {
            sim: SimRdmaHarness::setup(),
            bug: BUG.load(Ordering::SeqCst),
        }
    }
    fn features(&self) -> Features {
        Features {
            send_copy: self.bug != NO_COPY,
            ..self.sim.features()
        }
    }
    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<BrokenBackend>>,
    ) -> BrokenBackend {
        self.broken_backend(config, handler, false)
    }
    fn can_fix_local_port(&self) -> bool {
        self.sim.can_fix_local_port()
    }
    fn backend_from_one_port(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<BrokenBackend>>,
    ) -> BrokenBackend {
        self.broken_backend(config, handler, true)
    }
    fn local_ip(&self, node: NodeId) -> IpAddr {
        self.sim.local_ip(node)
    }
    fn refusing_address(&mut self) -> EndpointAddress {
        self.sim.refusing_address()
    }
    fn event_loop(&self, node: NodeId) -> &SimLoop {
        self.sim.event_loop(node)
    }
    fn post(&mut self, node: NodeId, f: Box<dyn FnOnce() + Send + 'static>) {
        self.sim.post(node, f)
    }
    fn pause(&mut self, node: NodeId) {
        self.sim.pause(node)
    }
    fn resume(&mut self, node: NodeId, first: Box<dyn FnOnce() + Send + 'static>) {
        self.sim.resume(node, first)
    }
    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        self.sim.wait_until(cond)
    }
    fn settle(&mut self) {
        self.sim.settle()
    }
    fn fresh_loop(&mut self) -> SimLoop {
        self.sim.fresh_loop()
    }
    fn resources(&mut self) -> usize {
        self.sim.resources()
    }
    fn can_reset(&self) -> bool {
        self.sim.can_reset()
    }
    fn reset(&mut self, node: NodeId, remote: EndpointAddress) {
        self.sim.reset(node, remote)
    }
    fn can_partition(&self) -> bool {
        self.bug != NO_PEER_TIMEOUT_SILENCED && self.sim.can_partition()
    }
    fn partition(&mut self, a: NodeId, b: NodeId) {
        assert!(self.can_partition(), "this harness cannot partition");
        self.sim.partition(a, b)
    }
    fn heal(&mut self, a: NodeId, b: NodeId) {
        self.sim.heal(a, b)
    }
    fn can_silence(&self) -> bool {
        self.bug == NO_PEER_TIMEOUT_SILENCED
    }
    fn silence(&mut self, node: NodeId) {
        for other in (0..self.sim.node_count()).filter(|o| *o != node) {
            self.sim.partition(node, other);
        }
    }
    fn unsilence(&mut self, node: NodeId) {
        for other in (0..self.sim.node_count()).filter(|o| *o != node) {
            self.sim.heal(node, other);
        }
    }
}

impl Broken {
    /// A backend of the simulator, wrapped with the harness's bug.
    fn broken_backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<BrokenBackend>>,
        one_port: bool,
    ) -> BrokenBackend {
        let shared = Arc::new(Shared {
            bug: self.bug,
            handler: Mutex::new(Some(handler)),
            ..Shared::default()
        });
        let mut config = config;
        if self.bug == NO_PEER_TIMEOUT || self.bug == NO_PEER_TIMEOUT_SILENCED {
            config.peer_timeout = None;
        }
        let wrap = Box::new(Wrap(shared.clone()));
        let inner = if one_port {
            self.sim.backend_from_one_port(config, wrap)
        } else {
            self.sim.backend(config, wrap)
        };
        let node = self.sim_nodes();
        let _ = shared.ip.set(self.sim.local_ip(node));
        let s2 = shared.clone();
        let _ = shared
            .flush
            .set(self.sim.event_loop(node).signal(move || s2.flush()));
        let b = BrokenBackend {
            inner,
            shared: shared.clone(),
        };
        let _ = shared.backend.set(b.clone());
        b
    }

    /// The node id of the backend just created.
    fn sim_nodes(&self) -> NodeId {
        self.sim.node_count() - 1
    }
}

// ------------------------------------------------------------------ running

/// Wall time one behaviour may take against a broken provider.
const LIMIT: Duration = Duration::from_secs(60);
/// Behaviours run at once (against a broken provider most of them wait
/// for something that never comes; the whole catalogue took 190 s with
/// 16 at once and two entries at a time, 107 s with 96 and one entry at a
/// time, on 2 vCPUs).
const PARALLEL: usize = 96;

fn quiet_catalogue_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = thread::current()
                .name()
                .is_some_and(|n| n.starts_with("catalogue "));
            if !ours {
                previous(info);
            }
        }));
    });
}

/// What the suite did against one broken provider.
struct Outcome {
    /// The failing tests, with the first line of each failure.
    failed: BTreeMap<String, String>,
    /// The whole message of each failure.
    messages: BTreeMap<String, String>,
    /// How long each test took until it passed or failed.
    took: BTreeMap<String, Duration>,
    /// The tests that hung.
    hung: Vec<String>,
}

/// The bug of the harnesses set up from now on.
static BUG: AtomicU8 = AtomicU8::new(NONE);

/// Selects `bug` for the harnesses set up while the returned guard lives:
/// one catalogue entry runs at a time. (A runtime choice rather than a
/// type parameter: the suite is compiled once for all the bugs.)
fn select(bug: u8) -> MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    BUG.store(bug, Ordering::SeqCst);
    guard
}

/// Runs the whole suite against `Broken` with `bug`.
fn run_suite(bug: u8, label: &str) -> Outcome {
    run_suite_without(bug, label, &[])
}

/// [`run_suite`] without the behaviours that need a feature of `gated`
/// (as `suite!` ignores them when `unsupported` lists the feature).
fn run_suite_without(bug: u8, label: &str, gated: &[&str]) -> Outcome {
    quiet_catalogue_panics();
    let _selected = select(bug);
    let mut list = behaviours::<Broken>();
    list.retain(|b| !b.needs.iter().any(|n| gated.contains(n)));
    let mut out = Outcome {
        failed: BTreeMap::new(),
        messages: BTreeMap::new(),
        took: BTreeMap::new(),
        hung: Vec::new(),
    };
    for chunk in list.chunks(PARALLEL) {
        let running: Vec<_> = chunk
            .iter()
            .map(|b| {
                let (run, path) = (b.run, b.path());
                let t = thread::Builder::new()
                    .name(format!("catalogue {label} {path}"))
                    .spawn(move || {
                        let start = Instant::now();
                        let r = std::panic::catch_unwind(run);
                        let r = r.map_err(|p| {
                            p.downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default()
                        });
                        (r, start.elapsed())
                    })
                    .expect("spawning a behaviour");
                (path, t, Instant::now())
            })
            .collect();
        for (path, t, start) in running {
            while !t.is_finished() && start.elapsed() < LIMIT {
                thread::sleep(Duration::from_millis(2));
            }
            if !t.is_finished() {
                out.hung.push(path);
                continue;
            }
            if let Ok((r, took)) = t.join() {
                out.took.insert(path.clone(), took);
                if let Err(msg) = r {
                    out.failed
                        .insert(path.clone(), msg.lines().next().unwrap_or("").to_string());
                    out.messages.insert(path, msg);
                }
            }
        }
    }
    out
}

/// Asserts that the broken provider fails each test in `expected` (given
/// without the module: both modules where the behaviour runs in both).
fn caught(bug: u8, label: &str, expected: &[&str]) -> Outcome {
    let t0 = Instant::now();
    let out = run_suite(bug, label);
    println!(
        "{label}: {} failing tests, {:.1} s",
        out.failed.len(),
        t0.elapsed().as_secs_f64()
    );
    for (path, msg) in &out.failed {
        println!("  {path}: {msg}");
    }
    assert!(
        out.hung.is_empty(),
        "{label}: tests hung instead of failing: {:?}",
        out.hung
    );
    for name in expected {
        for path in paths_of(label, name) {
            assert!(
                out.failed.contains_key(&path),
                "{label}: the suite must fail {path}, the test named after the broken rule; \
                 it failed only {:?}",
                out.failed.keys().collect::<Vec<_>>()
            );
        }
    }
    out
}

/// `module::name` of behaviour `name` in each module it runs in.
fn paths_of(label: &str, name: &str) -> Vec<String> {
    let paths: Vec<String> = behaviours::<Broken>()
        .iter()
        .filter(|b| b.name == name)
        .map(|b| b.path())
        .collect();
    assert!(!paths.is_empty(), "{label}: no behaviour named {name}");
    paths
}

/// Like [`caught`], and each test in `expected` fails within `bound`
/// with a message that contains `says`.
fn caught_fast(bug: u8, label: &str, expected: &[&str], bound: Duration, says: &str) {
    let out = caught(bug, label, expected);
    for name in expected {
        for path in paths_of(label, name) {
            let took = out.took[&path];
            assert!(
                took < bound,
                "{label}: {path} must fail within {bound:?}, it took {took:?}"
            );
            let msg = &out.messages[&path];
            assert!(
                msg.contains(says),
                "{label}: the failure of {path} must say `{says}`: {msg}"
            );
        }
    }
    let slowest = out.took.values().max().copied().unwrap_or_default();
    assert!(
        slowest < LIMIT / 2,
        "{label}: some test took {slowest:?}; against this provider every test must end \
         within seconds"
    );
}

#[test]
fn an_unbroken_wrapper_passes_the_whole_suite() {
    let out = run_suite(NONE, "control");
    assert!(
        out.failed.is_empty() && out.hung.is_empty(),
        "the wrapper without a bug must pass: failed {:?}, hung {:?}",
        out.failed,
        out.hung
    );
}

/// A provider without copy sends, declared `unsupported = [send_copy]`,
/// passes every behaviour that does not need them: none of those relies
/// on a copy send succeeding, and where one calls `send_data_copy` to see
/// an error (an unknown or stale handle, a connection still opening, the
/// wrong thread) `NotSupported` is an answer too.
#[test]
fn a_provider_without_copy_sends_passes_every_behaviour_that_does_not_need_them() {
    let out = run_suite_without(NO_COPY, "no copy sends", &["send_copy"]);
    assert!(
        out.failed.is_empty() && out.hung.is_empty(),
        "a provider without copy sends must pass what does not need them: failed {:?}, \
         hung {:?}",
        out.failed,
        out.hung
    );
}

#[test]
fn dropping_a_cancelled_key_is_caught() {
    caught(
        DROP_CANCELLED_KEY,
        "drop a cancelled key",
        &[
            "peer_close_with_sends_in_flight_reports_each_key_once_on_both_sides",
            "local_close_with_sends_held_in_flight_reports_each_key_once_on_both_sides",
        ],
    );
}

#[test]
fn reporting_a_completion_twice_is_caught() {
    caught(
        COMPLETION_TWICE,
        "completion twice",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn delivering_a_message_twice_is_caught() {
    caught(
        DATA_TWICE,
        "data twice",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn delivering_out_of_order_is_caught() {
    caught(
        DATA_REORDERED,
        "data reordered",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn data_before_established_is_caught() {
    caught(
        DATA_BEFORE_ESTABLISHED,
        "data before established",
        &["established_comes_first_even_when_the_peer_greets_from_its_established_callback"],
    );
}

#[test]
fn completing_a_send_early_is_caught() {
    caught(
        COMPLETE_EARLY,
        "complete early",
        &["sender_close_after_completions_delivers_everything_before_the_peer_hears_of_it"],
    );
}

#[test]
fn swallowing_messages_that_arrive_with_the_hang_up_is_caught() {
    caught(
        SWALLOW_BEFORE_CLOSE,
        "swallow before close",
        &["messages_before_a_peer_close_are_delivered_before_the_close"],
    );
}

#[test]
fn delivering_an_oversize_message_is_caught() {
    caught(
        OVERSIZE_DELIVERED,
        "oversize delivered",
        &["message_larger_than_receive_buffer_closes_connection_clearly"],
    );
}

#[test]
fn a_wrong_error_variant_is_caught() {
    caught(
        WRONG_ERROR_VARIANT,
        "wrong error variant",
        &[
            "closing_unknown_endpoint_fails",
            "operations_on_unknown_endpoint_fail",
        ],
    );
}

#[test]
fn a_handler_called_from_inside_a_backend_call_is_caught() {
    caught(
        REENTRANT_COMPLETION,
        "re-entrant completion",
        &["handlers_are_never_called_from_inside_a_backend_call"],
    );
}

#[test]
fn missing_backpressure_is_caught() {
    caught(
        NO_BACKPRESSURE,
        "no backpressure",
        &["backpressure_stops_copy_sends_and_resumes_after_the_peer_reads"],
    );
}

#[test]
fn a_wrong_close_reason_is_caught() {
    caught(
        WRONG_CLOSE_REASON,
        "wrong close reason",
        &["closing_active_endpoint_reports_closed_on_both_sides"],
    );
}

#[test]
fn an_event_after_the_close_is_caught() {
    caught(
        EVENT_AFTER_CLOSE,
        "event after close",
        &["messages_before_a_peer_close_are_delivered_before_the_close"],
    );
}

#[test]
fn a_leak_per_closed_connection_is_caught() {
    caught(
        LEAK_PER_CLOSE,
        "leak per close",
        &["open_close_cycles_leave_no_resources_behind"],
    );
}

#[test]
fn a_low_water_mark_that_is_not_kept_is_caught() {
    caught(
        LOW_WATER_NOT_KEPT,
        "low-water mark not kept",
        &["low_water_mark_of_free_buffers_resets_on_read"],
    );
}

#[test]
fn a_dropped_header_is_caught() {
    caught(
        HEADER_DROPPED,
        "header dropped",
        &["zero_copy_header_is_prepended_to_payload"],
    );
}

#[test]
fn a_refusal_reported_as_a_close_is_caught() {
    caught(
        REFUSED_AS_CLOSED,
        "refused as closed",
        &["connecting_to_nothing_is_refused_on_initiator_only"],
    );
}

#[test]
fn delivering_while_paused_is_caught() {
    caught(
        DELIVERS_WHILE_PAUSED,
        "delivers while paused",
        &[
            "pausing_receive_stops_delivery_and_pushes_back_on_the_sender_and_resume_delivers_everything_in_order",
            "pause_then_peer_close_reports_the_close_after_the_held_messages",
        ],
    );
}

#[test]
fn batches_out_of_order_are_caught() {
    caught(
        BATCHES_OUT_OF_ORDER,
        "batches out of order",
        &["completions_of_one_connection_come_in_send_order"],
    );
}

#[test]
fn completions_not_batched_are_caught() {
    caught(
        COMPLETIONS_NOT_BATCHED,
        "completions not batched",
        &["completions_of_one_connection_come_in_send_order"],
    );
}

#[test]
fn a_timer_that_fires_early_is_caught() {
    caught(
        TIMER_EARLY,
        "timer early",
        &["set_timer_calls_on_timer_after_the_delay_in_order"],
    );
}

#[test]
fn a_copy_batch_that_goes_past_a_refusal_is_caught() {
    caught(
        BATCH_PAST_REFUSAL,
        "batch past refusal",
        &["a_copy_batch_stops_at_the_first_refused_message_and_says_how_many_were_sent"],
    );
}

#[test]
fn on_wake_from_inside_wake_is_caught() {
    caught(
        WAKE_INSIDE_THE_CALL,
        "wake inside the call",
        &["wake_never_calls_the_handler_inside_the_call"],
    );
}

#[test]
fn an_ignored_peer_timeout_is_caught() {
    caught(
        NO_PEER_TIMEOUT,
        "no peer timeout",
        &["peer_timeout_ends_a_connection_whose_peer_stops_answering_with_timed_out"],
    );
}

#[test]
fn an_ignored_peer_timeout_is_caught_by_silencing_a_peer_where_nothing_can_be_partitioned() {
    caught(
        NO_PEER_TIMEOUT_SILENCED,
        "no peer timeout, silenced",
        &["peer_timeout_ends_a_connection_whose_peer_stops_answering_with_timed_out"],
    );
}

#[test]
fn a_cached_clock_is_caught() {
    caught(
        CACHED_CLOCK,
        "cached clock",
        &["time_and_timers_seen_from_callbacks_advance_with_the_loops_clock"],
    );
}

#[test]
fn a_region_chunk_kept_after_a_close_cancelled_its_send_is_caught() {
    caught(
        CHUNK_KEPT_ON_CANCEL,
        "chunk kept on cancel",
        &["a_region_chunk_comes_back_on_completion_and_on_cancellation_exactly_once"],
    );
}

#[test]
fn keys_forgotten_by_a_listener_close_are_caught() {
    caught(
        LISTENER_CLOSE_FORGETS_KEYS,
        "listener close forgets keys",
        &["a_listener_close_reports_every_key_of_its_accepted_connections_once"],
    );
}

#[test]
fn leaked_send_buffers_fail_in_seconds_with_a_message() {
    caught_fast(
        SEND_BUFFER_LEAK,
        "send buffer leak",
        &["many_messages_arrive_in_order_exactly_once"],
        Duration::from_secs(20),
        "a send buffer is back in its pool when its completion is reported",
    );
}

/// Waits for `child`, started at `start`, to end; kills it and fails the
/// test when it runs past [`LIMIT`].
fn wait_child(
    child: &mut std::process::Child,
    start: Instant,
    what: &str,
) -> std::process::ExitStatus {
    loop {
        if let Some(s) = child.try_wait().expect("waiting for the child") {
            return s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            panic!("the child test did not end within {LIMIT:?} {what}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// The environment variable that makes the ignored child tests run a mode.
const CHILD_MODE: &str = "NETIO_SELF_TEST_MODE";

fn child_mode() -> ThreadSafety {
    match std::env::var(CHILD_MODE).as_deref() {
        Ok("unsafe") => ThreadSafety::Unsafe,
        _ => ThreadSafety::Safe,
    }
}

#[test]
#[ignore = "run in a child process by a_deadlocked_provider_fails_its_test_with_the_watchdogs_message_and_the_suite_goes_on"]
fn child_a_handler_under_lock() {
    let _selected = select(HANDLER_UNDER_LOCK);
    // As `suite!` runs a behaviour.
    netio_conformance::__private::run_behaviour(|| {
        netio_conformance::tests::handler_can_send_and_close_inside_callbacks::<Broken>(child_mode())
    });
}

#[test]
#[ignore = "run in a child process by a_deadlocked_provider_fails_its_test_with_the_watchdogs_message_and_the_suite_goes_on"]
fn child_b_after_the_deadlocked_test() {
    let _selected = select(NONE);
    netio_conformance::__private::run_behaviour(|| {
        netio_conformance::tests::handler_can_send_and_close_inside_callbacks::<Broken>(child_mode())
    });
}

#[test]
#[ignore = "run in a child process by a_process_held_still_during_a_call_does_not_fail_its_test"]
fn call_held_still_in_another_process() {
    let _selected = select(NONE);
    netio_conformance::__private::run_behaviour(|| {
        let mut c = netio_conformance::Ctx::<Broken>::new(ThreadSafety::Safe);
        c.direct(|| {
            use std::io::Write;
            println!("inside the call");
            let _ = std::io::stdout().flush();
            // Until the process has been held still (a step that took
            // over a second), and 200 ms after: the call runs for little
            // of the process's own time however loaded the machine is.
            // Never held, it runs until the watchdog fails it.
            let mut held = false;
            let mut after = 0;
            while after < 20 {
                let step = Instant::now();
                thread::sleep(Duration::from_millis(10));
                held |= step.elapsed() > Duration::from_secs(1);
                if held {
                    after += 1;
                }
            }
        });
        c.wait("the watchdog's verdict", || true);
    });
}

/// A process held still (here by `SIGSTOP`, on a loaded virtual machine by
/// the hypervisor) for longer than the watchdog's limit while a backend
/// call runs does not fail its test: the watchdog does not count the time
/// in which it did not run itself.
#[test]
fn a_process_held_still_during_a_call_does_not_fail_its_test() {
    use std::io::{BufRead, BufReader, Read};
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--ignored",
            "--exact",
            "call_held_still_in_another_process",
            "--nocapture",
        ])
        .env_remove("NETIO_CONFORMANCE_TIME_SCALE")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running the child test");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut seen = String::new();
    while !line.contains("inside the call") {
        line.clear();
        if out.read_line(&mut line).expect("the child's output") == 0 {
            let _ = child.kill();
            panic!("the child ended before its call: {seen}");
        }
        seen.push_str(&line);
    }
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    thread::sleep(netio_conformance::stuck_limit() + Duration::from_secs(1));
    signal("-CONT");
    let status = wait_child(&mut child, Instant::now(), "after it went on");
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let mut err = String::new();
    let _ = child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    assert!(
        status.success(),
        "held still for longer than the limit during a call, the test failed: \
         {status:?}\n{seen}{rest}\n{err}"
    );
}

/// With `NETIO_CONFORMANCE_STACKS` naming a directory, the watchdog that
/// finds a thread stuck writes every thread's stack there (taken by
/// `gdb`) and names the file in its message: the stack of the deadlocked
/// test shows the handler call it is stuck in. Without `gdb` on the path
/// the message names no file.
#[test]
fn a_stuck_test_leaves_every_threads_stack_where_netio_conformance_stacks_says() {
    let dir = std::env::temp_dir().join(format!("netio-stacks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the stacks");
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args(["--ignored", "--exact", "child_a_handler_under_lock"])
        .env(CHILD_MODE, "unsafe")
        .env("NETIO_CONFORMANCE_STACKS", &dir)
        .output()
        .expect("running the child test");
    let all = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(101), "the stuck test fails: {all}");
    assert!(
        all.contains("inside a handler call"),
        "the watchdog's cause: {all}"
    );
    let files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the stacks directory")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    let gdb = Command::new("gdb")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if gdb {
        assert_eq!(
            files.len(),
            1,
            "one stack file per stuck find: {files:?}\n{all}"
        );
        let stacks = std::fs::read_to_string(&files[0]).expect("the stack file");
        assert!(
            all.contains(&format!("every thread's stack: {}", files[0].display())),
            "the message names the file: {all}"
        );
        assert!(
            stacks.contains("Thread ") && stacks.contains("child_a_handler_under_lock"),
            "the file holds every thread's stack, the stuck test's among them: {stacks}"
        );
        println!(
            "{} lines of stacks in {}",
            stacks.lines().count(),
            files[0].display()
        );
    } else {
        assert!(
            !all.contains("every thread's stack"),
            "without gdb no file is named: {all}"
        );
        println!("gdb is not on the path: the watchdog named no stack file");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A provider that calls its handler under its own lock deadlocks the
/// loop (here the test thread, which drives the simulator). Under plain
/// `cargo test` (output captured), the stuck test fails within seconds
/// with the watchdog's explanation in the output libtest prints, the
/// process lives on, and the next test runs and passes.
#[test]
fn a_deadlocked_provider_fails_its_test_with_the_watchdogs_message_and_the_suite_goes_on() {
    for mode in ["safe", "unsafe"] {
        let start = Instant::now();
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--ignored", "child_"])
            .args(["--test-threads", "1"])
            .env(CHILD_MODE, mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running the child tests");
        let (mut out, mut err) = (
            child.stdout.take().expect("stdout"),
            child.stderr.take().expect("stderr"),
        );
        let readers = [
            thread::spawn(move || {
                let mut s = String::new();
                use std::io::Read;
                let _ = out.read_to_string(&mut s);
                s
            }),
            thread::spawn(move || {
                let mut s = String::new();
                use std::io::Read;
                let _ = err.read_to_string(&mut s);
                s
            }),
        ];
        let status = wait_child(
            &mut child,
            start,
            &format!("({mode}, a deadlocked provider)"),
        );
        let elapsed = start.elapsed();
        let [out, err] = readers.map(|r| r.join().expect("reading the child's output"));
        let all = format!("{out}\n{err}");
        assert!(
            !status.success() && status.code() == Some(101),
            "{mode}: the run with a deadlocked provider fails as a failed test (status 101), \
             not by being killed: {status:?}\n{all}"
        );
        assert!(
            elapsed < Duration::from_secs(30),
            "{mode}: it must fail in seconds, took {elapsed:?}"
        );
        assert!(
            all.contains("child_a_handler_under_lock") && all.contains("inside a handler call"),
            "{mode}: libtest's report names the test and the watchdog's cause: {all}"
        );
        assert!(
            all.contains("state S") && all.contains("for a CPU]"),
            "{mode}: the watchdog's message says the stuck thread sleeps (blocked on the \
             lock), as the kernel saw it: {all}"
        );
        assert!(
            all.contains("test child_b_after_the_deadlocked_test ... ok")
                && all.contains("1 passed; 1 failed"),
            "{mode}: the test after the deadlocked one runs and passes: {all}"
        );
        let cause = all
            .lines()
            .find(|l| l.contains("inside a handler call"))
            .unwrap_or_default();
        println!(
            "{mode}: failed after {:.1} s, the next test passed: {}",
            elapsed.as_secs_f64(),
            cause.trim()
        );
    }
}
