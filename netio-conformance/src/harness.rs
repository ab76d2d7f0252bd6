//! What a provider implements to run the suite.

use std::net::IpAddr;

use netio_core::{Backend, BackendConfig, EndpointAddress, EventLoop, Features, Handler};

/// Drives one provider for the suite. One value is made per test
/// ([`Harness::setup`]) and dropped at its end; dropping it must stop every
/// loop thread it started and free every backend it made.
///
/// All waiting goes through [`Harness::wait_until`] and
/// [`Harness::settle`], so a simulator can advance virtual time there while a
/// real provider waits on the wall clock.
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
    /// that runs (or is driven by `wait_until`/`settle`) until the harness
    /// is dropped.
    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<Self::Backend>>,
    ) -> Self::Backend;

    /// The IP address `backend` listens on and is reached at (for example
    /// 127.0.0.1 for TCP, the virtual host's address for the simulator).
    fn local_ip(&self, backend: &Self::Backend) -> IpAddr;

    /// An address at which nothing listens and whose connection attempts are
    /// refused (not silently dropped).
    fn refusing_address(&mut self) -> EndpointAddress;

    /// The loop `backend` runs on (for signals and timers).
    fn event_loop(&self, backend: &Self::Backend) -> &Self::Loop;

    /// Runs `f` on the loop thread of `backend` and returns its result; used
    /// for every backend call in thread-unsafe mode. A simulator whose loop
    /// is driven by the test thread may just call `f`.
    fn on_loop<R: Send + 'static>(
        &mut self,
        backend: &Self::Backend,
        f: Box<dyn FnOnce() -> R + Send + 'static>,
    ) -> R;

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
}
