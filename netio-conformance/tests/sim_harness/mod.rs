//! The simulator's harness, shared by the suite's run on the simulator
//! (`tests/sim.rs`) and the catalogue of broken providers
//! (`tests/self_test.rs`).
//!
//! One virtual host per backend (so each backend has its own address), all
//! in one [`Sim`] per test, driven by the test thread: `wait_until` and
//! `settle` step the world on virtual time.
#![allow(dead_code)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use netio_conformance::NodeId;
use netio_core::{BackendConfig, EndpointAddress, Features, Handler, NetworkMode};
use netio_sim::{Sim, SimBackend, SimHost, SimLoop};

/// Virtual time `wait_until` gives a condition before giving up.
const VIRTUAL_DEADLINE: Duration = Duration::from_secs(300);
/// Events `wait_until` and `settle` run at most (a 1 ms timer over five
/// virtual minutes is 300 000 events).
const MAX_STEPS: usize = 2_000_000;
/// Real time `wait_until` waits in total for other threads (senders in
/// thread-safe tests) to schedule something while the world is idle.
const IDLE_WALL: Duration = Duration::from_secs(5);

/// The simulator's [`netio_conformance::Harness`] under its TCP profile
/// (the default `NetworkMode::Tcp`).
pub type SimHarness = SimHarnessIn<false>;

/// The simulator's harness under its RDMA profile: every backend is made
/// with `NetworkMode::Rdma`, whatever the test's configuration says.
pub type SimRdmaHarness = SimHarnessIn<true>;

/// The simulator's [`netio_conformance::Harness`], under the RDMA profile
/// if `RDMA`, else the TCP profile.
pub struct SimHarnessIn<const RDMA: bool> {
    /// The world.
    pub sim: Sim,
    /// The hosts of the backends, by `NodeId`.
    nodes: Vec<SimHost>,
    /// Other hosts (refusing addresses).
    others: Vec<SimHost>,
}

impl<const RDMA: bool> SimHarnessIn<RDMA> {
    /// The number of backends made so far.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

impl<const RDMA: bool> netio_conformance::Harness for SimHarnessIn<RDMA> {
    type Loop = SimLoop;
    type Backend = SimBackend;

    fn setup() -> Self {
        Self {
            sim: Sim::new(),
            nodes: Vec::new(),
            others: Vec::new(),
        }
    }

    fn features(&self) -> Features {
        Features::ALL
    }

    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<SimBackend>>,
    ) -> SimBackend {
        let host = self.sim.next_host();
        let config = BackendConfig {
            mode: if RDMA { NetworkMode::Rdma } else { config.mode },
            ..config
        };
        let b = host
            .backend(config, handler)
            .expect("creating a simulated backend");
        self.nodes.push(host);
        b
    }

    fn local_ip(&self, node: NodeId) -> IpAddr {
        self.nodes[node].ip()
    }

    fn refusing_address(&mut self) -> EndpointAddress {
        // A host that exists but listens nowhere answers with a refusal.
        let host = self.sim.next_host();
        let ip = host.ip();
        self.others.push(host);
        EndpointAddress::new(ip, 9)
    }

    fn event_loop(&self, node: NodeId) -> &SimLoop {
        self.nodes[node].event_loop()
    }

    fn post(&mut self, _node: NodeId, f: Box<dyn FnOnce() + Send + 'static>) {
        // The test thread drives the world, so it is the loop thread.
        f()
    }

    fn pause(&mut self, node: NodeId) {
        self.sim.pause_loop(self.nodes[node].ip());
    }

    fn resume(&mut self, node: NodeId, first: Box<dyn FnOnce() + Send + 'static>) {
        self.sim.resume_loop(self.nodes[node].ip());
        first();
    }

    fn resources(&mut self) -> usize {
        self.sim.live_objects()
    }

    fn can_reset(&self) -> bool {
        true
    }

    fn reset(&mut self, node: NodeId, remote: EndpointAddress) {
        self.sim
            .reset_connections(self.nodes[node].ip(), remote.ip());
    }

    fn can_partition(&self) -> bool {
        true
    }

    fn can_fix_local_port(&self) -> bool {
        true
    }

    fn backend_from_one_port(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<SimBackend>>,
    ) -> SimBackend {
        let b = netio_conformance::Harness::backend(self, config, handler);
        let ip = self.nodes.last().expect("just made").ip();
        self.sim.set_connect_ports(ip, Some(50_000..=50_000));
        b
    }

    fn partition(&mut self, a: NodeId, b: NodeId) {
        self.sim.partition(self.nodes[a].ip(), self.nodes[b].ip());
    }

    fn heal(&mut self, a: NodeId, b: NodeId) {
        self.sim.heal(self.nodes[a].ip(), self.nodes[b].ip());
    }

    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        let deadline = self.sim.now() + VIRTUAL_DEADLINE;
        let mut idle = Duration::ZERO;
        for _ in 0..MAX_STEPS {
            if cond() {
                return true;
            }
            match self.sim.next_event_at() {
                Some(t) if t <= deadline => {
                    self.sim.step();
                }
                Some(_) => return cond(),
                None => {
                    // Only another thread can add work now.
                    if idle >= IDLE_WALL {
                        return cond();
                    }
                    let start = Instant::now();
                    self.sim.wait_for_work(Duration::from_millis(20));
                    idle += start.elapsed();
                }
            }
        }
        cond()
    }

    fn settle(&mut self) {
        // Bounded in virtual time: a running periodic timer never idles.
        let deadline = self.sim.now() + Duration::from_secs(1);
        for _ in 0..MAX_STEPS {
            match self.sim.next_event_at() {
                Some(t) if t <= deadline => {
                    self.sim.step();
                }
                _ => return,
            }
        }
    }

    fn fresh_loop(&mut self) -> SimLoop {
        Sim::new().next_host().event_loop().clone()
    }
}
