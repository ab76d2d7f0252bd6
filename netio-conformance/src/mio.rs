//! A ready-made [`Harness`] for providers that run on
//! [`MioLoop`]: implement [`MioProvider`] (how to create a backend on a
//! loop, and the addresses to use) and the suite runs.
//!
//! ```text
//! // in the provider's tests/conformance.rs
//! struct Mine;
//! impl netio_conformance::mio::MioProvider for Mine {
//!     type Backend = MyBackend;
//!     fn features() -> Features { MyBackend::FEATURES }
//!     fn create(lp: &MioLoop, config: BackendConfig, handler: Box<dyn Handler<MyBackend>>)
//!         -> Result<MyBackend, CreateError> { MyProvider::create(lp, config, handler) }
//!     fn local_ip() -> IpAddr { Ipv4Addr::LOCALHOST.into() }
//!     fn refusing_address() -> EndpointAddress { /* bind a port, close it, return it */ }
//! }
//! // Without `const NETNS_PARTITION: bool = true` (see below) the harness
//! // cannot partition nodes, so the liveness behaviour is declared
//! // unsupported:
//! netio_conformance::suite!(
//!     netio_conformance::mio::MioHarness<crate::Mine>,
//!     unsupported = [partition = "loopback sockets cannot be partitioned"]
//! );
//! ```
//!
//! Each backend gets a loop of its own on a thread of its own, so one side
//! can be paused while the other runs, and no message between the two sides
//! of a test is delivered without waking another thread. Dropping the
//! harness stops every loop and joins its thread, giving up (and leaving
//! the thread behind) after a few seconds if a loop is stuck, so a
//! deadlocked provider fails its test instead of hanging the run.
//!
//! # Partitions in a private network namespace
//!
//! A provider whose backends reach each other over the loopback interface
//! only (TCP on 127.0.0.1 or ::1, say) sets [`MioProvider::NETNS_PARTITION`];
//! the harness can then partition nodes (Linux, root: `CAP_SYS_ADMIN`, and
//! `CAP_BPF` or `CAP_SYS_ADMIN`). A test that partitions calls
//! [`Harness::isolate`] before it makes any backend; the harness moves the
//! test's thread into a fresh network namespace (`unshare(CLONE_NEWNET)`)
//! and brings its `lo` up. A network namespace belongs to a thread and is
//! inherited by the threads it starts, so the loop threads, and every
//! socket of that test, live in the private namespace, where loopback is
//! the only interface. [`Harness::partition`] attaches an XDP program that
//! drops every packet (generic mode) to that `lo`: each packet leaves its
//! sender and is dropped on arrival, with no reset, no answer and no local
//! error, as behind a cut cable. Since `lo` carries all of the test's
//! traffic, this cuts all of the test's nodes from each other, so it is
//! accepted only in a test whose nodes are the two it names.
//! [`Harness::heal`] detaches the program. Nothing changes in the host's
//! namespace (no firewall rule, no address, no interface). Dropping the
//! harness moves the test's thread back into the namespace it came from;
//! the private one disappears with its last socket and thread. If the
//! namespace or the program cannot be made (no privilege, no BPF),
//! `isolate` or `partition` panics, so the test fails instead of passing: a
//! provider that cannot run it declares `partition` unsupported with a
//! reason.

use std::marker::PhantomData;
use std::net::IpAddr;
use std::sync::{mpsc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{
    Backend, BackendConfig, ConnId, CreateError, EndpointAddress, EventLoop, Features, Handler,
};

use crate::harness::{Harness, NodeId};

mod netns;

use netns::Netns;

/// Wall time `wait_until` gives a condition on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);
/// Wall time `settle` lets pending events run.
const SETTLE: Duration = Duration::from_millis(200);
/// How long a paused loop stays paused if the test never resumes it.
const PAUSE_LIMIT: Duration = Duration::from_secs(60);
/// How long dropping the harness waits for a loop thread to end.
const JOIN_LIMIT: Duration = Duration::from_secs(5);

/// What a provider on [`MioLoop`] tells the ready-made [`MioHarness`].
pub trait MioProvider: 'static {
    /// The provider's backend (a cheap `Clone` handle).
    type Backend: Backend + Clone + 'static;

    /// Run one test of this provider at a time in the process, whatever
    /// `--test-threads` says (for busy-polling loops, which keep a core
    /// busy each).
    const ONE_AT_A_TIME: bool = false;

    /// What the provider supports.
    fn features() -> Features;

    /// Creates a backend on `lp` (the harness runs the loop).
    fn create(
        lp: &MioLoop,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Result<Self::Backend, CreateError>;

    /// The address backends listen on and are reached at (a loopback
    /// address for IP transports; for a transport without IP addresses,
    /// the address its [`EndpointAddress`]es carry). Every node has it
    /// unless [`MioProvider::node_ip`] gives each its own.
    fn local_ip() -> IpAddr;

    /// An address where nothing listens, whose connection attempts are
    /// refused at once (for IP: a port that was just bound and released).
    fn refusing_address() -> EndpointAddress;

    /// The configuration of every loop (busy polling, say).
    fn loop_config() -> LoopConfig {
        LoopConfig::default()
    }

    /// What a leak would make grow; by default the process's open file
    /// descriptors.
    fn resources() -> usize {
        open_fds()
    }

    /// `true` if backends reach each other over the loopback interface
    /// only ([`MioProvider::local_ip`] is a loopback address), so that the
    /// harness can partition them by running the test in a private network
    /// namespace and dropping every packet on its `lo` (see the
    /// [module](self) docs; Linux, needs root). `false` (default): the harness
    /// cannot partition; declare `partition` unsupported.
    const NETNS_PARTITION: bool = false;

    /// `true` if [`MioProvider::reset`] works.
    fn can_reset() -> bool {
        false
    }

    /// `false` for a transport that buffers sends without bound when the
    /// receiver takes nothing (see [`Harness::pushes_back`]).
    const PUSHES_BACK: bool = true;

    /// `false` for a transport that loses a peer's close arriving while
    /// the listener accepts (see [`Harness::reports_close_in_accept`]);
    /// declare `close_in_accept` unsupported then.
    const CLOSE_IN_ACCEPT: bool = true;

    /// `true` if [`MioProvider::create_from_one_port`] works (see
    /// [`Harness::can_fix_local_port`]); declare `one_local_port`
    /// unsupported otherwise.
    const ONE_LOCAL_PORT: bool = false;

    /// Like [`MioProvider::create`], for a backend whose connections all
    /// leave from one local port (see [`Harness::backend_from_one_port`]).
    fn create_from_one_port(
        lp: &MioLoop,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Result<Self::Backend, CreateError> {
        let _ = (lp, config, handler);
        panic!("this provider's harness cannot fix a backend's local port");
    }

    /// Breaks the connection between `local` (a backend's own IP) and
    /// `remote` like a network failure would. See [`Harness::reset`].
    fn reset(local: IpAddr, remote: EndpointAddress) {
        let _ = (local, remote);
        panic!("this provider's harness cannot reset connections");
    }

    /// The address of backend `node` (the `node`-th backend the test made,
    /// from 0): where it listens and is reached. By default
    /// [`MioProvider::local_ip`] for every node. A transport whose nodes
    /// need addresses of their own (a non-IP transport whose
    /// [`EndpointAddress`]es carry a node number, a fabric with an address
    /// per device or per process) gives each its own here, and makes
    /// backend `node` with that address in [`MioProvider::create_node`].
    fn node_ip(node: NodeId) -> IpAddr {
        let _ = node;
        Self::local_ip()
    }

    /// Creates backend `node` on `lp` (the harness runs the loop). By
    /// default [`MioProvider::create`]; override it with
    /// [`MioProvider::node_ip`] when nodes need addresses of their own.
    fn create_node(
        node: NodeId,
        lp: &MioLoop,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Result<Self::Backend, CreateError> {
        let _ = node;
        Self::create(lp, config, handler)
    }

    /// Like [`MioProvider::create_node`], for a backend whose connections
    /// all leave from one local port. By default
    /// [`MioProvider::create_from_one_port`].
    fn create_node_from_one_port(
        node: NodeId,
        lp: &MioLoop,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Result<Self::Backend, CreateError> {
        let _ = node;
        Self::create_from_one_port(lp, config, handler)
    }

    /// Breaks the connection `conn` of `backend` (backend `node`), whose
    /// remote address is `remote`, like a network failure would (see
    /// [`Harness::reset_connection`]). By default
    /// [`MioProvider::reset`] with the node's address
    /// ([`MioProvider::node_ip`]) and `remote`; a transport that can name
    /// the connection itself (a provider's fault hook taking the handle)
    /// overrides this instead.
    fn reset_connection(
        backend: &Self::Backend,
        node: NodeId,
        conn: ConnId,
        remote: EndpointAddress,
    ) {
        let _ = (backend, conn);
        Self::reset(Self::node_ip(node), remote)
    }

    /// `true` (default) if the provider enforces
    /// [`BackendConfig::peer_timeout`] (see
    /// [`Harness::enforces_peer_timeout`]); declare `liveness` unsupported
    /// otherwise.
    const LIVENESS: bool = true;

    /// `true` if [`MioProvider::silence`] works (see
    /// [`Harness::can_silence`]): the way to run the liveness behaviours
    /// on a transport that [`MioProvider::NETNS_PARTITION`] cannot
    /// partition.
    fn can_silence() -> bool {
        false
    }

    /// Makes `backend` (backend `node`) stop answering its peers until
    /// [`MioProvider::unsilence`] (see [`Harness::silence`]).
    fn silence(backend: &Self::Backend, node: NodeId) {
        let _ = (backend, node);
        panic!("this provider's harness cannot silence a node");
    }

    /// Undoes [`MioProvider::silence`].
    fn unsilence(backend: &Self::Backend, node: NodeId) {
        let _ = (backend, node);
        panic!("this provider's harness cannot silence a node");
    }
}

/// The number of open file descriptors of this process
/// (`/proc/self/fd`).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("counting open descriptors in /proc/self/fd: {e}"))
}

/// Held by the running test of a [`MioProvider::ONE_AT_A_TIME`] provider.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct LoopThread<B> {
    lp: MioLoop,
    thread: Option<JoinHandle<()>>,
    backend: Option<B>,
    paused: Option<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
}

/// The ready-made [`Harness`] for a [`MioProvider`]: one loop thread per
/// backend, waiting on the wall clock. It partitions nodes only for a
/// provider with [`MioProvider::NETNS_PARTITION`] (in a private network
/// namespace, see the [module](self) docs); otherwise declare `partition`
/// unsupported in [`suite!`](crate::suite).
pub struct MioHarness<P: MioProvider> {
    loops: Vec<LoopThread<P::Backend>>,
    /// Loops made for the event loop tests (not running here).
    spare: Vec<MioLoop>,
    /// The test's private network namespace, once [`Harness::isolate`]
    /// made it (left on drop, after the loop threads ended).
    netns: Option<Netns>,
    _turn: Option<MutexGuard<'static, ()>>,
    _provider: PhantomData<P>,
}

impl<P: MioProvider> MioHarness<P> {
    /// Starts a loop thread running `lp`, which backend `b` lives on.
    fn run_backend(&mut self, lp: MioLoop, b: P::Backend) -> P::Backend {
        let runner = lp.clone();
        let (tx, rx) = mpsc::channel();
        let id = self.loops.len();
        let thread = thread::Builder::new()
            .name(format!("loop of backend #{id}"))
            .spawn(move || {
                runner.run(|| {
                    let _ = tx.send(());
                })
            })
            .expect("starting a loop thread");
        rx.recv_timeout(DEADLINE).expect("the loop thread started");
        self.loops.push(LoopThread {
            lp,
            thread: Some(thread),
            backend: Some(b.clone()),
            paused: None,
        });
        b
    }

    fn new_loop() -> MioLoop {
        MioLoop::with_config(P::loop_config()).expect("creating an event loop")
    }
}

impl<P: MioProvider> Drop for MioHarness<P> {
    fn drop(&mut self) {
        for l in &mut self.loops {
            l.paused.take();
            l.lp.stop();
        }
        let end = Instant::now() + JOIN_LIMIT;
        for l in &mut self.loops {
            let Some(t) = l.thread.take() else { continue };
            while !t.is_finished() && Instant::now() < end {
                thread::sleep(Duration::from_millis(1));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                // A stuck loop thread: leave it (and its backend) behind
                // rather than hang the test run.
                std::mem::forget(l.backend.take());
                std::mem::forget(t);
            }
        }
        self.loops.clear();
        self.spare.clear();
        // Back to the thread's own network namespace, last.
        self.netns.take();
    }
}

impl<P: MioProvider> Harness for MioHarness<P> {
    type Loop = MioLoop;
    type Backend = P::Backend;

    fn setup() -> Self {
        // A test that failed while holding the turn poisons the lock; the
        // next test may still go (the failed one's harness was dropped).
        let turn =
            P::ONE_AT_A_TIME.then(|| ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
        Self {
            loops: Vec::new(),
            spare: Vec::new(),
            netns: None,
            _turn: turn,
            _provider: PhantomData,
        }
    }

    fn features(&self) -> Features {
        P::features()
    }

    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<P::Backend>>,
    ) -> P::Backend {
        let lp = Self::new_loop();
        let b = P::create_node(self.loops.len(), &lp, config, handler).expect("creating a backend");
        self.run_backend(lp, b)
    }

    fn can_fix_local_port(&self) -> bool {
        P::ONE_LOCAL_PORT
    }

    fn backend_from_one_port(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<P::Backend>>,
    ) -> P::Backend {
        let lp = Self::new_loop();
        let b = P::create_node_from_one_port(self.loops.len(), &lp, config, handler)
            .expect("creating a backend");
        self.run_backend(lp, b)
    }

    fn local_ip(&self, node: NodeId) -> IpAddr {
        P::node_ip(node)
    }

    fn refusing_address(&mut self) -> EndpointAddress {
        P::refusing_address()
    }

    fn event_loop(&self, node: NodeId) -> &MioLoop {
        &self.loops[node].lp
    }

    fn post(&mut self, node: NodeId, f: Box<dyn FnOnce() + Send + 'static>) {
        self.loops[node].lp.post(f);
    }

    fn pause(&mut self, node: NodeId) {
        let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let (started_tx, started_rx) = mpsc::channel();
        self.loops[node].lp.post(move || {
            let _ = started_tx.send(());
            if let Ok(first) = rx.recv_timeout(PAUSE_LIMIT) {
                first();
            }
        });
        started_rx
            .recv_timeout(DEADLINE)
            .unwrap_or_else(|_| panic!("the loop of backend #{node} did not start its pause"));
        self.loops[node].paused = Some(tx);
    }

    fn resume(&mut self, node: NodeId, first: Box<dyn FnOnce() + Send + 'static>) {
        let tx = self.loops[node]
            .paused
            .take()
            .unwrap_or_else(|| panic!("backend #{node} is not paused"));
        tx.send(first)
            .unwrap_or_else(|_| panic!("backend #{node} stopped being paused on its own"));
    }

    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        let end = Instant::now() + DEADLINE;
        loop {
            if cond() {
                return true;
            }
            if Instant::now() >= end {
                return false;
            }
            thread::sleep(Duration::from_millis(1));
        }
    }

    fn settle(&mut self) {
        thread::sleep(SETTLE);
    }

    fn fresh_loop(&mut self) -> MioLoop {
        let lp = Self::new_loop();
        self.spare.push(lp.clone());
        lp
    }

    fn resources(&mut self) -> usize {
        P::resources()
    }

    fn can_reset(&self) -> bool {
        P::can_reset()
    }

    fn reset(&mut self, node: NodeId, remote: EndpointAddress) {
        P::reset(P::node_ip(node), remote);
    }

    fn reset_connection(&mut self, node: NodeId, conn: ConnId, remote: EndpointAddress) {
        let b = self.loops[node]
            .backend
            .clone()
            .unwrap_or_else(|| panic!("backend #{node} is gone"));
        P::reset_connection(&b, node, conn, remote);
    }

    fn enforces_peer_timeout(&self) -> bool {
        P::LIVENESS
    }

    fn can_silence(&self) -> bool {
        P::can_silence()
    }

    fn silence(&mut self, node: NodeId) {
        let b = self.loops[node]
            .backend
            .clone()
            .unwrap_or_else(|| panic!("backend #{node} is gone"));
        P::silence(&b, node);
    }

    fn unsilence(&mut self, node: NodeId) {
        let b = self.loops[node]
            .backend
            .clone()
            .unwrap_or_else(|| panic!("backend #{node} is gone"));
        P::unsilence(&b, node);
    }

    fn can_partition(&self) -> bool {
        P::NETNS_PARTITION
    }

    fn pushes_back(&self) -> bool {
        P::PUSHES_BACK
    }

    fn reports_close_in_accept(&self) -> bool {
        P::CLOSE_IN_ACCEPT
    }

    /// With [`MioProvider::NETNS_PARTITION`]: moves the calling (test)
    /// thread into a fresh network namespace with `lo` up, so that the
    /// loops and backends made afterwards live there. Panics if that
    /// cannot be done (no privilege), or if backends exist already.
    /// Without it: nothing.
    fn isolate(&mut self) {
        if !P::NETNS_PARTITION {
            return;
        }
        assert!(
            self.loops.is_empty() && self.spare.is_empty(),
            "Harness::isolate must be called before any loop or backend is made"
        );
        assert!(self.netns.is_none(), "Harness::isolate was called twice");
        for node in 0..2 {
            assert!(
                P::node_ip(node).is_loopback(),
                "MioProvider::NETNS_PARTITION needs loopback node addresses, not {}",
                P::node_ip(node)
            );
        }
        let ns = Netns::enter().unwrap_or_else(|e| {
            panic!(
                "partitioning needs a private network namespace for the test's threads, \
                 which could not be made: {e}. Run as root (CAP_SYS_ADMIN), or declare \
                 `partition` unsupported with a reason in suite!"
            )
        });
        self.netns = Some(ns);
    }

    fn partition(&mut self, a: NodeId, b: NodeId) {
        self.set_partitioned(a, b, true);
    }

    fn heal(&mut self, a: NodeId, b: NodeId) {
        self.set_partitioned(a, b, false);
    }
}

impl<P: MioProvider> MioHarness<P> {
    /// Cuts (`partitioned`) or mends the loopback network of the test's
    /// private namespace.
    fn set_partitioned(&mut self, a: NodeId, b: NodeId, partitioned: bool) {
        assert!(
            P::NETNS_PARTITION,
            "this provider's harness cannot partition nodes (MioProvider::NETNS_PARTITION is false)"
        );
        let n = self.loops.len();
        assert!(
            a < n && b < n && a != b,
            "partition of nodes {a} and {b} of {n}"
        );
        assert!(
            n == 2,
            "the harness partitions by cutting the test's loopback interface, which cuts \
             every node from every other: a test that partitions must have exactly the two \
             nodes it names (it has {n})"
        );
        let ns = self.netns.as_mut().unwrap_or_else(|| {
            panic!("Harness::partition needs Harness::isolate before the backends are made")
        });
        if partitioned { ns.cut() } else { ns.mend() }
            .unwrap_or_else(|e| panic!("partition of nodes {a} and {b}: {e}"));
    }
}
