//! A handler that records every event, for tests.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netio_core::{
    Backend, Capabilities, CloseReason, ConnId, EndpointAddress, Handler, RefuseReason,
};

use crate::watch::{HandlerClock, Watch};

/// One event a backend reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `on_connection_established`.
    Established {
        /// The connection.
        conn: ConnId,
        /// Remote address.
        remote: EndpointAddress,
        /// Capabilities of this side.
        caps: Capabilities,
    },
    /// `on_connection_refused`.
    Refused {
        /// The connection (the handle `open_active_endpoint` returned).
        conn: ConnId,
        /// Remote address.
        remote: EndpointAddress,
        /// Why.
        reason: RefuseReason,
    },
    /// `on_connection_closed`.
    Closed {
        /// The connection.
        conn: ConnId,
        /// Remote address.
        remote: EndpointAddress,
        /// Why.
        reason: CloseReason,
        /// Keys of sends that did not complete.
        keys: Vec<u64>,
    },
    /// `on_data`.
    Data {
        /// The connection.
        conn: ConnId,
        /// The message.
        data: Vec<u8>,
    },
    /// One key of an `on_sends_completed` batch (the batch itself is in
    /// [`Log::batches`]).
    Completed {
        /// The connection.
        conn: ConnId,
        /// The key.
        key: u64,
    },
    /// `on_timer`.
    Timer {
        /// The token given to `set_timer`.
        token: u64,
        /// The backend's clock (`Backend::now`) when the callback ran.
        at: Duration,
    },
    /// `on_wake`.
    Wake {
        /// The token given to `wake`.
        token: u64,
        /// The backend's clock (`Backend::now`) when the callback ran.
        at: Duration,
    },
}

impl Event {
    /// The connection the event is about, if any.
    pub fn conn(&self) -> Option<ConnId> {
        match self {
            Event::Established { conn, .. }
            | Event::Refused { conn, .. }
            | Event::Closed { conn, .. }
            | Event::Data { conn, .. }
            | Event::Completed { conn, .. } => Some(*conn),
            Event::Timer { .. } | Event::Wake { .. } => None,
        }
    }
}

/// A reaction run after an event is recorded, with the backend, on the loop
/// thread (to reply or close from inside a callback). For a batch of
/// completions it runs once per key, in order, after the whole batch was
/// recorded.
pub type React<B> = Box<dyn FnMut(&B, &Event) + Send>;

/// Handler that appends each event to a shared [`Log`] and then runs an
/// optional reaction.
///
/// Made by the suite's test context, it also checks the rules that hold
/// for every event of every test: for each connection handle,
/// `on_connection_established` (or `on_connection_refused`) comes before
/// any other event, and nothing comes after `on_connection_closed` or
/// `on_connection_refused` (a handle is never reused); completions come
/// through `on_sends_completed`; no handler call is nested in another or
/// made from inside a backend call; and it tells the watchdog how long the
/// current handler call has run.
pub struct Recorder<B: ?Sized> {
    log: Log,
    react: Option<React<B>>,
    monitor: Option<Monitor>,
}

/// What the monitor knows of one connection handle.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConnState {
    Open(EndpointAddress),
    Ended,
}

/// The per-backend rule checks of a monitored [`Recorder`].
struct Monitor {
    watch: Arc<Watch>,
    clock: HandlerClock,
    label: String,
    conns: HashMap<ConnId, ConnState>,
}

fn name_of(e: &Event) -> &'static str {
    match e {
        Event::Established { .. } => "on_connection_established",
        Event::Refused { .. } => "on_connection_refused",
        Event::Closed { .. } => "on_connection_closed",
        Event::Data { .. } => "on_data",
        Event::Completed { .. } => "on_sends_completed",
        Event::Timer { .. } => "on_timer",
        Event::Wake { .. } => "on_wake",
    }
}

impl Monitor {
    /// Checks the order of events for one connection.
    fn check(&mut self, e: &Event) {
        let Some(conn) = e.conn() else { return };
        let name = name_of(e);
        let state = self.conns.get(&conn).copied();
        let problem = match (e, state) {
            (Event::Established { .. }, Some(ConnState::Open(_))) => {
                Some("a second on_connection_established for one handle".to_string())
            }
            (Event::Established { .. }, Some(ConnState::Ended)) => Some(
                "on_connection_established for a handle already closed or refused (a handle \
                 is never reused)"
                    .to_string(),
            ),
            (Event::Established { remote, .. }, None) => {
                self.conns.insert(conn, ConnState::Open(*remote));
                None
            }
            (Event::Refused { .. }, Some(ConnState::Open(_))) => Some(
                "on_connection_refused for a connection already reported established".to_string(),
            ),
            (Event::Refused { .. }, None) => {
                self.conns.insert(conn, ConnState::Ended);
                None
            }
            (Event::Closed { remote, .. }, Some(ConnState::Open(r))) => {
                self.conns.insert(conn, ConnState::Ended);
                (*remote != r).then(|| {
                    format!(
                        "on_connection_closed names the remote {remote}, but the connection was \
                         established with {r}"
                    )
                })
            }
            (_, Some(ConnState::Open(_))) => None,
            (_, Some(ConnState::Ended)) => Some(format!(
                "{name} after on_connection_closed or on_connection_refused (nothing is \
                 reported for a connection after its end)"
            )),
            (_, None) => Some(format!(
                "{name} before on_connection_established (establishment is reported before any \
                 other event of a connection)"
            )),
        };
        if let Some(p) = problem {
            self.watch
                .violation(format!("{}: {conn}: {p}; event: {}", self.label, brief(e)));
        }
    }
}

/// An event in a few words (messages cut short).
fn brief(e: &Event) -> String {
    match e {
        Event::Data { conn, data } if data.len() > 16 => {
            format!(
                "on_data on {conn} of {} bytes {:02x?}…",
                data.len(),
                &data[..16]
            )
        }
        other => format!("{other:?}"),
    }
}

impl<B: ?Sized> Recorder<B> {
    /// A recorder writing to `log`, with an optional reaction.
    pub fn new(log: Log, react: Option<React<B>>) -> Self {
        Self {
            log,
            react,
            monitor: None,
        }
    }

    /// A recorder that also checks the rules of every event (see the type's
    /// docs) and reports what breaks them to `watch`.
    pub(crate) fn monitored(
        log: Log,
        react: Option<React<B>>,
        watch: Arc<Watch>,
        label: String,
    ) -> Self {
        let clock = watch.handler_clock();
        Self {
            log,
            react,
            monitor: Some(Monitor {
                watch,
                clock,
                label,
                conns: HashMap::new(),
            }),
        }
    }

    /// Records one handler call: `events` (one, or the keys of a batch) and,
    /// for a batch, the batch; then runs the reaction for each event.
    fn push(&mut self, b: &B, events: Vec<Event>, batch: Option<(ConnId, Vec<u64>)>) {
        let what = match (&batch, events.first()) {
            (Some((conn, keys)), _) => format!("on_sends_completed on {conn} with keys {keys:?}"),
            (None, Some(e)) => brief(e),
            (None, None) => "a handler call".to_string(),
        };
        let entered = self.monitor.as_mut().map(|m| {
            let (nested, v) = m.clock.enter(&what);
            if let Some(v) = v {
                m.watch.violation(format!("{}: {v}", m.label));
            }
            for e in &events {
                m.check(e);
            }
            nested
        });
        {
            let mut log = self.log.lock();
            log.events.extend(events.iter().cloned());
            if let Some(batch) = batch {
                log.batches.push(batch);
            }
        }
        if let Some(r) = &mut self.react {
            for e in &events {
                if self.monitor.is_some() {
                    let r = catch_unwind(AssertUnwindSafe(|| r(b, e)));
                    if let (Err(p), Some(m)) = (r, &self.monitor) {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        m.watch.violation(format!(
                            "{}: the test's reaction to {} panicked: {msg}",
                            m.label,
                            brief(e)
                        ));
                    }
                } else {
                    r(b, e);
                }
            }
        }
        if let (Some(m), Some(nested)) = (&self.monitor, entered) {
            m.clock.leave(nested);
        }
    }

    fn one(&mut self, b: &B, e: Event) {
        self.push(b, vec![e], None);
    }
}

impl<B: Backend + ?Sized> Handler<B> for Recorder<B> {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.one(b, Event::Established { conn, remote, caps });
    }
    fn on_connection_refused(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let reason = reason.clone();
        self.one(
            b,
            Event::Refused {
                conn,
                remote,
                reason,
            },
        );
    }
    fn on_connection_closed(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        let e = Event::Closed {
            conn,
            remote,
            reason: reason.clone(),
            keys: keys.to_vec(),
        };
        self.one(b, e);
    }
    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        let data = data.to_vec();
        self.one(b, Event::Data { conn, data });
    }
    fn on_send_completed(&mut self, b: &B, conn: ConnId, key: u64) {
        if let Some(m) = &self.monitor {
            m.watch.violation(format!(
                "{}: on_send_completed({conn}, {key}) was called directly: providers report \
                 completions through on_sends_completed (whose default forwards each key to \
                 on_send_completed), or a handler that implements only on_sends_completed \
                 misses them",
                m.label
            ));
        }
        self.on_sends_completed(b, conn, &[key]);
    }
    fn on_sends_completed(&mut self, b: &B, conn: ConnId, keys: &[u64]) {
        let events = keys
            .iter()
            .map(|&key| Event::Completed { conn, key })
            .collect();
        self.push(b, events, Some((conn, keys.to_vec())));
    }
    fn on_timer(&mut self, b: &B, token: u64) {
        let at = b.now();
        self.one(b, Event::Timer { token, at });
    }
    fn on_wake(&mut self, b: &B, token: u64) {
        let at = b.now();
        self.one(b, Event::Wake { token, at });
    }
}

/// A handler that implements only the per-key `on_send_completed`, as
/// handlers written for netio3 do, around a [`Recorder`]: it sees batches
/// only through the trait's default `on_sends_completed`, and records each
/// key as a batch of one.
pub(crate) struct PerKey<B: ?Sized>(pub(crate) Recorder<B>);

impl<B: Backend + ?Sized> Handler<B> for PerKey<B> {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.0.on_connection_established(b, conn, remote, caps)
    }
    fn on_connection_refused(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        self.0.on_connection_refused(b, conn, remote, reason)
    }
    fn on_connection_closed(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        self.0.on_connection_closed(b, conn, remote, reason, keys)
    }
    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        self.0.on_data(b, conn, data)
    }
    fn on_send_completed(&mut self, b: &B, conn: ConnId, key: u64) {
        self.0.on_sends_completed(b, conn, &[key])
    }
    fn on_timer(&mut self, b: &B, token: u64) {
        self.0.on_timer(b, token)
    }
    fn on_wake(&mut self, b: &B, token: u64) {
        self.0.on_wake(b, token)
    }
}

/// One `on_connection_closed`, as [`Log::closed`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    /// The connection.
    pub conn: ConnId,
    /// Its remote address.
    pub remote: EndpointAddress,
    /// Why it closed.
    pub reason: CloseReason,
    /// The keys of its sends that did not complete.
    pub keys: Vec<u64>,
}

#[derive(Default)]
struct Inner {
    events: Vec<Event>,
    batches: Vec<(ConnId, Vec<u64>)>,
}

/// The shared list of events a [`Recorder`] wrote, with queries.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Inner>>);

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().events.iter()).finish()
    }
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn filter<T>(&self, f: impl FnMut(&Event) -> Option<T>) -> Vec<T> {
        self.lock().events.iter().filter_map(f).collect()
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().events.clone()
    }

    /// Every event of `conn` so far, in order.
    pub fn events_of(&self, conn: ConnId) -> Vec<Event> {
        self.filter(|e| (e.conn() == Some(conn)).then(|| e.clone()))
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.lock().events.len()
    }

    /// `true` if nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().events.is_empty()
    }

    /// Capabilities `conn` was established with, if it was.
    pub fn established_caps(&self, conn: ConnId) -> Option<Capabilities> {
        self.lock().events.iter().find_map(|e| match e {
            Event::Established { conn: c, caps, .. } if *c == conn => Some(*caps),
            _ => None,
        })
    }

    /// Every established connection, in order: handle, remote address,
    /// capabilities.
    pub fn established(&self) -> Vec<(ConnId, EndpointAddress, Capabilities)> {
        self.filter(|e| match e {
            Event::Established { conn, remote, caps } => Some((*conn, *remote, *caps)),
            _ => None,
        })
    }

    /// Refusals, in order: handle, remote address, reason.
    pub fn refused(&self) -> Vec<(ConnId, EndpointAddress, RefuseReason)> {
        self.filter(|e| match e {
            Event::Refused {
                conn,
                remote,
                reason,
            } => Some((*conn, *remote, reason.clone())),
            _ => None,
        })
    }

    /// Closes, in order.
    pub fn closed(&self) -> Vec<Close> {
        self.filter(|e| match e {
            Event::Closed {
                conn,
                remote,
                reason,
                keys,
            } => Some(Close {
                conn: *conn,
                remote: *remote,
                reason: reason.clone(),
                keys: keys.clone(),
            }),
            _ => None,
        })
    }

    /// Number of closes reported for `conn`.
    pub fn closed_count(&self, conn: ConnId) -> usize {
        self.closed().iter().filter(|c| c.conn == conn).count()
    }

    /// Messages received on `conn`, in order.
    pub fn data_on(&self, conn: ConnId) -> Vec<Vec<u8>> {
        self.filter(|e| match e {
            Event::Data { conn: c, data } if *c == conn => Some(data.clone()),
            _ => None,
        })
    }

    /// Every message received, with its connection, in order.
    pub fn all_data(&self) -> Vec<(ConnId, Vec<u8>)> {
        self.filter(|e| match e {
            Event::Data { conn, data } => Some((*conn, data.clone())),
            _ => None,
        })
    }

    /// Keys of completed sends of `conn`, in order.
    pub fn completed(&self, conn: ConnId) -> Vec<u64> {
        self.filter(|e| match e {
            Event::Completed { conn: c, key } if *c == conn => Some(*key),
            _ => None,
        })
    }

    /// The `on_sends_completed` batches of `conn`, in order.
    pub fn batches(&self, conn: ConnId) -> Vec<Vec<u64>> {
        self.lock()
            .batches
            .iter()
            .filter(|b| b.0 == conn)
            .map(|b| b.1.clone())
            .collect()
    }

    /// Keys cancelled on every close of `conn`, concatenated.
    pub fn cancelled(&self, conn: ConnId) -> Vec<u64> {
        self.closed()
            .into_iter()
            .filter(|c| c.conn == conn)
            .flat_map(|c| c.keys)
            .collect()
    }

    /// `on_timer` calls, in order: token, clock.
    pub fn timers(&self) -> Vec<(u64, Duration)> {
        self.filter(|e| match e {
            Event::Timer { token, at } => Some((*token, *at)),
            _ => None,
        })
    }

    /// `on_wake` calls, in order: token, clock.
    pub fn wakes(&self) -> Vec<(u64, Duration)> {
        self.filter(|e| match e {
            Event::Wake { token, at } => Some((*token, *at)),
            _ => None,
        })
    }
}
