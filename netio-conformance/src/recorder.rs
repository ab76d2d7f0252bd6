//! A handler that records every event, for tests.

use std::collections::HashMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};

use netio_core::{Capabilities, CloseReason, EndpointAddress, Handler, RefuseReason};

use crate::watch::{HandlerClock, Watch};

/// One event a backend reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `on_connection_established`.
    Established {
        /// Remote address.
        remote: EndpointAddress,
        /// Capabilities of this side.
        caps: Capabilities,
    },
    /// `on_connection_refused`.
    Refused {
        /// Remote address.
        remote: EndpointAddress,
        /// Why.
        reason: RefuseReason,
    },
    /// `on_connection_closed`.
    Closed {
        /// Remote address.
        remote: EndpointAddress,
        /// Why.
        reason: CloseReason,
        /// Keys of sends that did not complete.
        keys: Vec<u64>,
    },
    /// `on_data`.
    Data {
        /// Remote address.
        remote: EndpointAddress,
        /// The message.
        data: Vec<u8>,
    },
    /// `on_send_completed`.
    Completed {
        /// Remote address.
        remote: EndpointAddress,
        /// The key.
        key: u64,
    },
}

/// A reaction run after an event is recorded, with the backend, on the loop
/// thread (to reply or close from inside a callback).
pub type React<B> = Box<dyn FnMut(&B, &Event) + Send>;

/// Handler that appends each event to a shared [`Log`] and then runs an
/// optional reaction.
///
/// Made by the suite's test context, it also checks the rules that hold
/// for every event of every test: for each remote,
/// `on_connection_established` comes before any other event and nothing
/// comes after `on_connection_closed` (until it is established again); no
/// handler call is nested in another or made from inside a backend call;
/// and it tells the watchdog how long the current handler call has run.
pub struct Recorder<B: ?Sized> {
    log: Log,
    react: Option<React<B>>,
    monitor: Option<Monitor>,
}

/// The per-backend rule checks of a monitored [`Recorder`].
struct Monitor {
    watch: Arc<Watch>,
    clock: HandlerClock,
    label: String,
    remotes: HashMap<EndpointAddress, bool>,
}

impl Monitor {
    /// Checks the order of events for one remote; `true` = open.
    fn check(&mut self, e: &Event) {
        let (remote, name) = match e {
            Event::Established { remote, .. } => (remote, "on_connection_established"),
            Event::Refused { remote, .. } => (remote, "on_connection_refused"),
            Event::Closed { remote, .. } => (remote, "on_connection_closed"),
            Event::Data { remote, .. } => (remote, "on_data"),
            Event::Completed { remote, .. } => (remote, "on_send_completed"),
        };
        let open = self.remotes.get(remote).copied();
        let problem = match (e, open) {
            (Event::Established { .. }, Some(true)) => Some(
                "a second on_connection_established without on_connection_closed in between"
                    .to_string(),
            ),
            (Event::Established { .. }, _) => {
                self.remotes.insert(*remote, true);
                None
            }
            (Event::Refused { .. }, Some(true)) => Some(
                "on_connection_refused for a connection already reported established".to_string(),
            ),
            (Event::Refused { .. }, _) => None,
            (_, Some(true)) => {
                if matches!(e, Event::Closed { .. }) {
                    self.remotes.insert(*remote, false);
                }
                None
            }
            (_, Some(false)) => Some(format!(
                "{name} after on_connection_closed (nothing is reported for a remote after its                  close until it is established again)"
            )),
            (_, None) => Some(format!(
                "{name} before on_connection_established (establishment is reported before any                  other event of a connection)"
            )),
        };
        if let Some(p) = problem {
            self.watch.violation(format!(
                "{}: {remote}: {p}; event: {}",
                self.label,
                brief(e)
            ));
        }
    }
}

/// An event in a few words (messages cut short).
fn brief(e: &Event) -> String {
    match e {
        Event::Data { data, .. } if data.len() > 16 => {
            format!("on_data of {} bytes {:02x?}…", data.len(), &data[..16])
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
                remotes: HashMap::new(),
            }),
        }
    }

    fn push(&mut self, b: &B, e: Event) {
        let entered = self.monitor.as_mut().map(|m| {
            let (nested, v) = m.clock.enter(&brief(&e));
            if let Some(v) = v {
                m.watch.violation(format!("{}: {v}", m.label));
            }
            m.check(&e);
            nested
        });
        self.log.lock().push(e.clone());
        if let Some(r) = &mut self.react {
            if self.monitor.is_some() {
                let r = catch_unwind(AssertUnwindSafe(|| r(b, &e)));
                if let (Err(p), Some(m)) = (r, &self.monitor) {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    m.watch.violation(format!(
                        "{}: the test's reaction to {} panicked: {msg}",
                        m.label,
                        brief(&e)
                    ));
                }
            } else {
                r(b, &e);
            }
        }
        if let (Some(m), Some(nested)) = (&self.monitor, entered) {
            m.clock.leave(nested);
        }
    }
}

impl<B: ?Sized> Handler<B> for Recorder<B> {
    fn on_connection_established(&mut self, b: &B, remote: EndpointAddress, caps: Capabilities) {
        self.push(b, Event::Established { remote, caps });
    }
    fn on_connection_refused(&mut self, b: &B, remote: EndpointAddress, reason: &RefuseReason) {
        let reason = reason.clone();
        self.push(b, Event::Refused { remote, reason });
    }
    fn on_connection_closed(
        &mut self,
        b: &B,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        let e = Event::Closed {
            remote,
            reason: reason.clone(),
            keys: keys.to_vec(),
        };
        self.push(b, e);
    }
    fn on_data(&mut self, b: &B, remote: EndpointAddress, data: &[u8]) {
        let data = data.to_vec();
        self.push(b, Event::Data { remote, data });
    }
    fn on_send_completed(&mut self, b: &B, remote: EndpointAddress, key: u64) {
        self.push(b, Event::Completed { remote, key });
    }
}

/// The shared list of events a [`Recorder`] wrote, with queries.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Event>>>);

impl fmt::Debug for Log {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A copy of every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` if nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Capabilities of the first connection established with `remote`.
    pub fn established_with(&self, remote: EndpointAddress) -> Option<Capabilities> {
        self.lock().iter().find_map(|e| match e {
            Event::Established { remote: r, caps } if *r == remote => Some(*caps),
            _ => None,
        })
    }

    /// Remote addresses of every established connection, in order.
    pub fn established(&self) -> Vec<(EndpointAddress, Capabilities)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Established { remote, caps } => Some((*remote, *caps)),
                _ => None,
            })
            .collect()
    }

    /// Refusals, in order.
    pub fn refused(&self) -> Vec<(EndpointAddress, RefuseReason)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Refused { remote, reason } => Some((*remote, reason.clone())),
                _ => None,
            })
            .collect()
    }

    /// Closes, in order: remote, reason, cancelled keys.
    pub fn closed(&self) -> Vec<(EndpointAddress, CloseReason, Vec<u64>)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Closed {
                    remote,
                    reason,
                    keys,
                } => Some((*remote, reason.clone(), keys.clone())),
                _ => None,
            })
            .collect()
    }

    /// Number of closes reported for `remote`.
    pub fn closed_count(&self, remote: EndpointAddress) -> usize {
        self.closed().iter().filter(|c| c.0 == remote).count()
    }

    /// Messages received from `remote`, in order.
    pub fn data_from(&self, remote: EndpointAddress) -> Vec<Vec<u8>> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Data { remote: r, data } if *r == remote => Some(data.clone()),
                _ => None,
            })
            .collect()
    }

    /// Every message received, with its sender, in order.
    pub fn data(&self) -> Vec<(EndpointAddress, Vec<u8>)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Data { remote, data } => Some((*remote, data.clone())),
                _ => None,
            })
            .collect()
    }

    /// Keys of completed sends to `remote`, in order.
    pub fn completed_to(&self, remote: EndpointAddress) -> Vec<u64> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Completed { remote: r, key } if *r == remote => Some(*key),
                _ => None,
            })
            .collect()
    }

    /// Keys cancelled on every close of `remote`, concatenated.
    pub fn cancelled_to(&self, remote: EndpointAddress) -> Vec<u64> {
        self.closed()
            .into_iter()
            .filter(|c| c.0 == remote)
            .flat_map(|c| c.2)
            .collect()
    }
}
