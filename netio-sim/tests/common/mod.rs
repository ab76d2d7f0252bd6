//! Helpers shared by the simulator's tests: a handler that records every
//! event, recorded backends on hosts, and connecting them by driving the
//! world.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, RefuseReason,
};
use netio_sim::{Sim, SimBackend, SimHost};

/// One event a backend reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Established {
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    },
    Refused {
        conn: ConnId,
        remote: EndpointAddress,
        reason: RefuseReason,
    },
    Closed {
        conn: ConnId,
        remote: EndpointAddress,
        reason: CloseReason,
        keys: Vec<u64>,
    },
    Data {
        conn: ConnId,
        data: Vec<u8>,
    },
    /// One `on_sends_completed` call.
    Completed {
        conn: ConnId,
        keys: Vec<u64>,
    },
    Timer(u64),
    Wake(u64),
}

/// A reaction run after an event is recorded, with the backend, on the loop
/// thread.
pub type React<B> = Box<dyn FnMut(&B, &Event) + Send>;

/// The events of one backend, shared between its handler and the test.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<Event>>>);

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.lock().iter()).finish()
    }
}

impl Log {
    fn lock(&self) -> MutexGuard<'_, Vec<Event>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, e: Event) {
        self.lock().push(e);
    }

    pub fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    pub fn established(&self) -> Vec<(ConnId, EndpointAddress, Capabilities)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Established { conn, remote, caps } => Some((*conn, *remote, *caps)),
                _ => None,
            })
            .collect()
    }

    pub fn refused(&self) -> Vec<(ConnId, EndpointAddress, RefuseReason)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Refused {
                    conn,
                    remote,
                    reason,
                } => Some((*conn, *remote, reason.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn closed(&self) -> Vec<(ConnId, CloseReason, Vec<u64>)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Closed {
                    conn, reason, keys, ..
                } => Some((*conn, reason.clone(), keys.clone())),
                _ => None,
            })
            .collect()
    }

    pub fn closed_count(&self, c: ConnId) -> usize {
        self.closed().iter().filter(|x| x.0 == c).count()
    }

    pub fn data_from(&self, c: ConnId) -> Vec<Vec<u8>> {
        self.data()
            .into_iter()
            .filter(|(x, _)| *x == c)
            .map(|(_, d)| d)
            .collect()
    }

    pub fn data(&self) -> Vec<(ConnId, Vec<u8>)> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Data { conn, data } => Some((*conn, data.clone())),
                _ => None,
            })
            .collect()
    }

    /// Completed keys of `c`, in the order reported.
    pub fn completed_to(&self, c: ConnId) -> Vec<u64> {
        self.batches_to(c).into_iter().flatten().collect()
    }

    /// The `on_sends_completed` calls of `c`.
    pub fn batches_to(&self, c: ConnId) -> Vec<Vec<u64>> {
        self.lock()
            .iter()
            .filter_map(|e| match e {
                Event::Completed { conn, keys } if *conn == c => Some(keys.clone()),
                _ => None,
            })
            .collect()
    }

    /// Keys cancelled by the close of `c`.
    pub fn cancelled_to(&self, c: ConnId) -> Vec<u64> {
        self.closed()
            .into_iter()
            .filter(|x| x.0 == c)
            .flat_map(|x| x.2)
            .collect()
    }
}

/// A handler that appends every event to a [`Log`], then runs an optional
/// reaction.
pub struct Recorder {
    log: Log,
    react: Option<React<SimBackend>>,
}

impl Recorder {
    pub fn new(log: Log, react: Option<React<SimBackend>>) -> Self {
        Self { log, react }
    }

    fn record(&mut self, b: &SimBackend, e: Event) {
        self.log.push(e.clone());
        if let Some(r) = &mut self.react {
            r(b, &e);
        }
    }
}

impl Handler<SimBackend> for Recorder {
    fn on_connection_established(
        &mut self,
        b: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.record(b, Event::Established { conn, remote, caps });
    }
    fn on_connection_refused(
        &mut self,
        b: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let reason = reason.clone();
        self.record(
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
        b: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        let (reason, keys) = (reason.clone(), keys.to_vec());
        self.record(
            b,
            Event::Closed {
                conn,
                remote,
                reason,
                keys,
            },
        );
    }
    fn on_data(&mut self, b: &SimBackend, conn: ConnId, data: &[u8]) {
        let data = data.to_vec();
        self.record(b, Event::Data { conn, data });
    }
    fn on_sends_completed(&mut self, b: &SimBackend, conn: ConnId, keys: &[u64]) {
        let keys = keys.to_vec();
        self.record(b, Event::Completed { conn, keys });
    }
    fn on_timer(&mut self, b: &SimBackend, token: u64) {
        self.record(b, Event::Timer(token));
    }
    fn on_wake(&mut self, b: &SimBackend, token: u64) {
        self.record(b, Event::Wake(token));
    }
}

/// Receive and buffered-send pools of `num_buf` buffers of `buf_size`.
pub fn full_params(buf_size: usize, num_buf: usize) -> ConnectionParams {
    ConnectionParams::receive(buf_size, num_buf).with_buffered(buf_size, num_buf)
}

/// A backend on its own host, recording its events.
pub struct Node {
    pub host: SimHost,
    pub b: SimBackend,
    pub log: Log,
}

/// A new host with one recorded backend.
pub fn node(sim: &Sim, config: BackendConfig, react: Option<React<SimBackend>>) -> Node {
    let host = sim.next_host();
    let log = Log::default();
    let b = host
        .backend(config, Recorder::new(log.clone(), react))
        .expect("backend");
    Node { host, b, log }
}

/// Listens on port 0 of the node's host.
#[track_caller]
pub fn listen(n: &Node, params: ConnectionParams) -> EndpointAddress {
    n.b.open_listen_endpoint(EndpointAddress::new(n.host.ip(), 0), params)
        .expect("listen")
}

/// Connects `client` to `addr` and runs the world until both sides report
/// the connection; returns the client's and the server's handle for it.
#[track_caller]
pub fn connect(
    sim: &Sim,
    server: &Node,
    client: &Node,
    addr: EndpointAddress,
    params: ConnectionParams,
) -> (ConnId, ConnId) {
    let before = server.log.established().len();
    let id = client
        .b
        .open_active_endpoint(addr, params)
        .expect("connect");
    let deadline = sim.now() + Duration::from_secs(10);
    let (s, c) = (server.log.clone(), client.log.clone());
    assert!(
        sim.run_until(deadline, || {
            s.established().len() > before && c.established().iter().any(|e| e.0 == id)
        }),
        "connection to {addr} not established"
    );
    (id, server.log.established()[before].0)
}

/// Runs the world until `cond` holds, at most one virtual minute from now.
#[track_caller]
pub fn run_until(sim: &Sim, what: &str, cond: impl FnMut() -> bool) {
    let deadline = sim.now() + Duration::from_secs(60);
    assert!(
        sim.run_until(deadline, cond),
        "timed out waiting until {what}"
    );
}

/// The default configuration in `NetworkMode::Rdma`: the RDMA profile,
/// where a send completes when the receiver has taken the message.
#[allow(dead_code)]
pub fn rdma() -> BackendConfig {
    BackendConfig {
        mode: netio_core::NetworkMode::Rdma,
        ..BackendConfig::default()
    }
}

/// Takes the network cards of `hosts` out of the way (unlimited both
/// ways), so that a link with unlimited bandwidth delivers a burst at one
/// instant.
#[allow(dead_code)]
pub fn unlimited_nics(sim: &Sim, hosts: &[std::net::IpAddr]) {
    for &h in hosts {
        sim.set_nic(h, netio_sim::NicConfig::symmetric(0));
    }
}

/// Sends `msg` through one of the connection's send buffers, if one is
/// free (nothing is sent otherwise).
#[allow(dead_code)]
pub fn send_buffered(b: &SimBackend, conn: ConnId, msg: &[u8], key: u64) {
    if let Ok(Some(mut buf)) = b.get_buffer(conn) {
        buf.write(msg).unwrap();
        let _ = b.send_buffer(conn, buf, key);
    }
}
