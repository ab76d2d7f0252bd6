//! The deterministic driver the simulator tests share: a single-threaded
//! executor runs until every task waits, then virtual time moves on one
//! step, until the scenario is done.

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use netio_async::AsyncBackend;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress};
use netio_sim::{Sim, SimBackend};

pub type Node = Rc<AsyncBackend<SimBackend>>;

pub struct World {
    pub sim: Sim,
    pub pool: LocalPool,
    /// Virtual time between two rounds of the executor.
    step: Duration,
}

impl World {
    pub fn new(seed: u64, step: Duration) -> Self {
        Self {
            sim: Sim::with_seed(seed),
            pool: LocalPool::new(),
            step,
        }
    }

    /// A new host with an async backend; the host's address.
    pub fn node(&self, config: BackendConfig) -> (Node, IpAddr) {
        let host = self.sim.next_host();
        let b = AsyncBackend::new(|h| host.backend(config, h)).expect("backend");
        (Rc::new(b), host.ip())
    }

    /// A server listening on a new host (at a port of the simulator's
    /// choice) and a client on another; the listening address.
    pub fn pair(
        &self,
        server: BackendConfig,
        client: BackendConfig,
        params: &ConnectionParams,
    ) -> (Node, Node, EndpointAddress) {
        let (s, ip) = self.node(server);
        let (c, _) = self.node(client);
        let addr = s
            .listen(EndpointAddress::new(ip, 0), params.clone())
            .expect("listen");
        (s, c, addr)
    }

    /// An async backend on the host at `ip` (created or restarted).
    pub fn node_at(&self, ip: IpAddr, config: BackendConfig) -> Node {
        let host = self.sim.host(ip);
        Rc::new(AsyncBackend::new(|h| host.backend(config, h)).expect("backend"))
    }

    pub fn spawn(&self, f: impl std::future::Future<Output = ()> + 'static) {
        self.pool.spawner().spawn_local(f).expect("spawn");
    }

    /// Runs tasks and virtual time until `done` holds (at most 100,000
    /// steps); returns whether it did.
    pub fn run_until(&mut self, mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..100_000 {
            self.pool.run_until_stalled();
            if done() {
                return true;
            }
            self.sim.run_for(self.step);
        }
        false
    }

    /// Runs for `d` of virtual time, the tasks in between.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.sim.now() + d;
        while self.sim.now() < end {
            self.pool.run_until_stalled();
            self.sim.run_for(self.step);
        }
        self.pool.run_until_stalled();
    }
}
