//! A handler that records every event, for tests.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use netio_core::{Capabilities, CloseReason, EndpointAddress, Handler, RefuseReason};

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
pub struct Recorder<B: ?Sized> {
    log: Log,
    react: Option<React<B>>,
}

impl<B: ?Sized> Recorder<B> {
    /// A recorder writing to `log`, with an optional reaction.
    pub fn new(log: Log, react: Option<React<B>>) -> Self {
        Self { log, react }
    }

    fn push(&mut self, b: &B, e: Event) {
        self.log.lock().push(e.clone());
        if let Some(r) = &mut self.react {
            r(b, &e);
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
