//! What a provider implements to run the suite.

use std::net::IpAddr;

use netio_core::{Backend, BackendConfig, ConnId, EndpointAddress, EventLoop, Features, Handler};

/// The index of a backend in the order the harness created it during one
/// test (0 for the first [`Harness::backend`] call, 1 for the second, …).
pub type NodeId = usize;

/// Drives one provider for the suite. One value is made per test
/// ([`Harness::setup`]) and dropped at its end; dropping it must stop every
/// loop thread it started and free every backend it made, and must not
/// hang even when a loop thread is stuck (give up on joining it after a few
/// seconds).
///
/// Providers on [`MioLoop`](netio_core::mio_loop::MioLoop) need not write
/// one: [`MioHarness`](crate::mio::MioHarness) is ready-made.
///
/// All waiting goes through [`Harness::wait_until`] and
/// [`Harness::settle`], so a simulator can advance virtual time there while a
/// real provider waits on the wall clock. No method may block for long: the
/// suite does its own waiting (with a watchdog) around [`Harness::post`].
pub trait Harness: Sized + 'static {
    /// The provider's event loop.
    type Loop: EventLoop;
    /// The provider's backend. Cloning gives another handle to the same
    /// backend (providers' backends are handles).
    type Backend: Backend + Clone + 'static;

    /// A fresh environment for one test.
    fn setup() -> Self;

    /// What the provider supports. Must agree with the `unsupported` list
    /// given to [`suite!`](crate::suite); a test checks that.
    fn features(&self) -> Features;

    /// Creates a backend with `config` that reports to `handler`, on a loop
    /// of its own that runs (or is driven by `wait_until`/`settle`) until the
    /// harness is dropped. Its [`NodeId`] is the number of backends created
    /// before it.
    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Self::Backend;

    /// The IP address backend `node` listens on and is reached at (for
    /// example 127.0.0.1 for TCP, the virtual host's address for the
    /// simulator). A transport without IP addresses returns the address its
    /// [`EndpointAddress`]es carry for that node.
    fn local_ip(&self, node: NodeId) -> IpAddr;

    /// An address at which nothing listens and whose connection attempts are
    /// refused (not silently dropped).
    fn refusing_address(&mut self) -> EndpointAddress;

    /// The loop backend `node` runs on (for signals and timers).
    fn event_loop(&self, node: NodeId) -> &Self::Loop;

    /// Runs `f` on the loop thread of backend `node` soon, without waiting
    /// for it. A simulator whose loops are driven by the test thread may
    /// just call `f`.
    fn post(&mut self, node: NodeId, f: Box<dyn FnOnce() + Send + 'static>);

    /// Holds the loop of backend `node` back until [`Harness::resume`], as if
    /// its thread were busy in a long callback: it calls no handler, reads
    /// nothing, so what its peers send piles up in the transport and their
    /// sends stay in flight. Other nodes' loops keep running. A real loop is
    /// held by a posted call that blocks on a latch; this returns once that
    /// call has started.
    fn pause(&mut self, node: NodeId);

    /// Lets a paused loop go on. `first` runs on that loop's thread before
    /// anything the loop held back (for example a close, so that it happens
    /// with the peer's sends still in flight).
    fn resume(&mut self, node: NodeId, first: Box<dyn FnOnce() + Send + 'static>);

    /// Drives the loops until `cond` holds, and returns `true`; or returns
    /// `false` after a generous deadline (seconds of wall time, or minutes
    /// of virtual time). Must poll `cond` often and never sleep for long.
    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool;

    /// Lets pending events run before the suite checks that something did
    /// *not* happen: a simulator runs until idle (bounded), a real provider
    /// waits a bounded short time (for example 200 ms).
    fn settle(&mut self);

    /// A new loop of the provider's type, not yet running, for the event loop
    /// tests, which call `run` themselves (possibly on another thread).
    fn fresh_loop(&mut self) -> Self::Loop;

    /// A count of what a leak would make grow: open file descriptors of the
    /// process for socket providers, live connection objects for a
    /// simulator. The suite compares it before and after 500 open and close
    /// cycles (run with no other suite test in the process).
    fn resources(&mut self) -> usize;

    /// `true` if [`Harness::reset`] works; declare `reset` unsupported in
    /// [`suite!`](crate::suite) otherwise.
    fn can_reset(&self) -> bool {
        false
    }

    /// Breaks the connection of backend `node` whose remote address is
    /// `remote` the way a network failure would (a TCP reset, a crashed peer): the peer must
    /// see the connection closed with [`CloseReason::Reset`](netio_core::CloseReason::Reset).
    /// Called only when [`Harness::can_reset`] says so.
    fn reset(&mut self, node: NodeId, remote: EndpointAddress) {
        let _ = (node, remote);
        panic!("this harness cannot reset connections (Harness::can_reset is false)");
    }

    /// `true` (default) if the provider pushes back on a sender whose
    /// receiver takes nothing (it holds its loop, or paused receiving):
    /// sends answer [`SendError::NoResources`](netio_core::SendError::NoResources)
    /// or buffers run out after a bounded amount. `false` for a transport
    /// that buffers without bound on the sender's behalf (libfabric's
    /// `sockets` provider); declare `backpressure` unsupported in
    /// [`suite!`](crate::suite), with the reason. The behaviours that need
    /// sends truly held in flight are then ignored.
    fn pushes_back(&self) -> bool {
        true
    }

    /// `true` (default) if the provider tells the listener's side of a
    /// peer's close that comes while the listener accepts the connection:
    /// the accepted connection, once established, closes. `false` for a
    /// transport that loses such a close (libfabric 1.17's `sockets`
    /// provider marks an accepted endpoint connected only after it watches
    /// the peer's socket, and drops a close read in between), so that the
    /// listener's side stays established until liveness ends it; declare
    /// `close_in_accept` unsupported in [`suite!`](crate::suite), with the
    /// reason.
    fn reports_close_in_accept(&self) -> bool {
        true
    }

    /// `true` if [`Harness::partition`] and [`Harness::heal`] work; declare
    /// `partition` unsupported in [`suite!`](crate::suite) otherwise (with
    /// a reason: `unsupported = [partition = "why"]`).
    fn can_partition(&self) -> bool {
        false
    }

    /// Called by a test that will partition its nodes, first thing, before
    /// it makes any loop or backend: a harness that partitions by cutting
    /// a network private to the test sets that network up here.
    /// [`MioHarness`](crate::mio::MioHarness) moves the test's thread into
    /// a fresh network namespace, which the loop threads it starts
    /// afterwards inherit. It must panic (fail the test) if it cannot, not
    /// go on without. Called only when [`Harness::can_partition`] says so.
    /// The default does nothing (a simulator partitions virtual hosts).
    fn isolate(&mut self) {}

    /// Makes backends `a` and `b` unreachable from each other, in both
    /// directions, the way a cut cable or a dropping firewall does: nothing
    /// either sends reaches the other and neither hears a reset, until
    /// [`Harness::heal`]. Called only when [`Harness::can_partition`] says
    /// so, in a test that called [`Harness::isolate`] before making its
    /// backends. A harness may cut more than `a` and `b` from each other
    /// (MioHarness cuts the test's whole loopback network, and so accepts
    /// only a test whose nodes are `a` and `b`).
    fn partition(&mut self, a: NodeId, b: NodeId) {
        let _ = (a, b);
        panic!("this harness cannot partition nodes (Harness::can_partition is false)");
    }

    /// `true` if [`Harness::backend_from_one_port`] works; declare
    /// `one_local_port` unsupported in [`suite!`](crate::suite) otherwise
    /// (with the reason).
    fn can_fix_local_port(&self) -> bool {
        false
    }

    /// Like [`Harness::backend`], but every connection the backend opens
    /// leaves from one local port the harness picks (on TCP,
    /// `TcpConfig::connect_ports` with a single port), so that a peer with
    /// two listeners sees two connections with equal remote addresses.
    /// Called only when [`Harness::can_fix_local_port`] says so.
    fn backend_from_one_port(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Self::Backend {
        let _ = (config, handler);
        panic!(
            "this harness cannot fix a backend's local port (Harness::can_fix_local_port is false)"
        );
    }

    /// Undoes [`Harness::partition`] of `a` and `b`.
    fn heal(&mut self, a: NodeId, b: NodeId) {
        let _ = (a, b);
        panic!("this harness cannot partition nodes (Harness::can_partition is false)");
    }

    /// `true` (default) if the provider enforces
    /// [`BackendConfig::peer_timeout`]: a connection whose peer stops
    /// answering closes with [`CloseReason::TimedOut`](netio_core::CloseReason::TimedOut)
    /// after about that long. A provider that accepts the setting and
    /// leaves liveness to its transport returns `false` and declares
    /// `liveness` unsupported in [`suite!`](crate::suite), with the reason.
    fn enforces_peer_timeout(&self) -> bool {
        true
    }

    /// `true` if [`Harness::silence`] works. The liveness behaviours make a
    /// peer stop answering with [`Harness::partition`] where the harness
    /// can partition, else with [`Harness::silence`]: a transport that
    /// cannot be partitioned (shared memory, a fabric without a packet
    /// filter) runs them by silencing a peer. A harness that can do
    /// neither declares `partition` unsupported, which ignores them.
    fn can_silence(&self) -> bool {
        false
    }

    /// Makes backend `node` stop answering, without closing anything or
    /// telling anyone: nothing it sends reaches a peer and nothing a peer
    /// sends reaches it (or is acknowledged), until
    /// [`Harness::unsilence`]. Its loop keeps running, so its own
    /// `peer_timeout` can fire. A harness implements it however its
    /// transport allows: a fault hook of the provider's own (drop every
    /// frame in and out), a proxy between the nodes that stops forwarding,
    /// a device it can take down. Called only when [`Harness::can_silence`]
    /// says so and [`Harness::can_partition`] does not.
    fn silence(&mut self, node: NodeId) {
        let _ = node;
        panic!("this harness cannot silence a node (Harness::can_silence is false)");
    }

    /// Undoes [`Harness::silence`] of `node`.
    fn unsilence(&mut self, node: NodeId) {
        let _ = node;
        panic!("this harness cannot silence a node (Harness::can_silence is false)");
    }

    /// Like [`Harness::reset`], naming the connection by its handle `conn`
    /// on backend `node` as well as by its remote address (two connections
    /// may share one). The default calls [`Harness::reset`] with the
    /// address; a harness whose transport has no IP addresses, or that can
    /// reset one connection of several to one address, overrides it.
    fn reset_connection(&mut self, node: NodeId, conn: ConnId, remote: EndpointAddress) {
        let _ = conn;
        self.reset(node, remote);
    }
}
