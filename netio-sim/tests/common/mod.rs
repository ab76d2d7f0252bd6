//! Helpers shared by the simulator's tests: recorded backends on hosts,
//! and connecting them by driving the world.

#![allow(dead_code)]

use std::time::Duration;

use netio_conformance::{Log, React, Recorder};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_sim::{Sim, SimBackend, SimHost};

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
/// the connection; returns the server's name for it.
#[track_caller]
pub fn connect(
    sim: &Sim,
    server: &Node,
    client: &Node,
    addr: EndpointAddress,
    params: ConnectionParams,
) -> EndpointAddress {
    let before = server.log.established().len();
    client
        .b
        .open_active_endpoint(addr, params)
        .expect("connect");
    let deadline = sim.now() + Duration::from_secs(10);
    let (s, c) = (server.log.clone(), client.log.clone());
    let client_before = c.established().len();
    assert!(
        sim.run_until(deadline, || {
            s.established().len() > before && c.established().len() > client_before
        }),
        "connection to {addr} not established"
    );
    server.log.established()[before].0
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
