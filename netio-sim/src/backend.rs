//! [`SimBackend`]: the contract's operations on a virtual host, and
//! [`SimProvider`], which ties it to [`SimLoop`].

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use netio_core::{
    Backend, BackendConfig, BatchSendError, BufferError, CloseError, ConnError, ConnId,
    ConnectionParams, CopyMessage, CreateError, EndpointAddress, Features, Handler, MemoryUsage,
    NetworkBuffer, OpenActiveError, OpenListenError, Provider, RegionSlice, SendError,
};

use crate::world::BackendId;
use crate::{Sim, SimLoop};

/// A backend on a virtual host. Cheap to clone: clones are handles to the
/// same backend.
///
/// Every operation locks the world briefly, changes its state and schedules
/// events; outcomes reach the backend's [`Handler`] when the world is driven.
/// Dropping handles closes nothing: the backend lives as long as its world.
#[derive(Clone)]
pub struct SimBackend {
    lp: SimLoop,
    id: BackendId,
}

impl SimBackend {
    pub(crate) fn from_parts(lp: SimLoop, id: BackendId) -> Self {
        Self { lp, id }
    }

    /// The backend's index in the world.
    pub(crate) fn index(&self) -> BackendId {
        self.id
    }

    pub(crate) fn create<H: Handler<SimBackend> + 'static>(
        lp: &SimLoop,
        config: BackendConfig,
        handler: H,
    ) -> Result<Self, CreateError> {
        ConnectionParams::default()
            .validate(&config)
            .map_err(CreateError::InvalidConfig)?;
        let ip = lp.ip();
        let handler: Box<dyn Handler<SimBackend>> = Box::new(handler);
        let id = lp.sim().with(|w| {
            if !w.host_alive(ip) {
                return Err(CreateError::Failed(
                    format!("simulated host {ip} has crashed").into(),
                ));
            }
            Ok(w.add_backend(ip, config, handler))
        })?;
        Ok(Self::from_parts(lp.clone(), id))
    }

    /// The address of the backend's host.
    pub fn ip(&self) -> IpAddr {
        self.lp.ip()
    }

    /// The loop of the backend's host.
    pub fn event_loop(&self) -> &SimLoop {
        &self.lp
    }

    /// The world the backend lives in.
    pub fn sim(&self) -> &Sim {
        self.lp.sim()
    }

    fn with<R>(&self, f: impl FnOnce(&mut crate::world::World, BackendId) -> R) -> R {
        self.lp.sim().with(|w| {
            w.note_caller(self.id);
            f(w, self.id)
        })
    }
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimBackend")
            .field("host", &self.ip())
            .field("id", &self.id)
            .finish()
    }
}

impl Backend for SimBackend {
    /// Everything: the simulator supports every send mode, both thread
    /// modes and all shared pools.
    fn features(&self) -> Features {
        Features::ALL
    }

    fn open_listen_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        self.with(|w, b| w.op_listen(b, address, params))
    }

    fn open_active_endpoint(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        self.with(|w, b| w.op_connect(b, address, params))
    }

    fn close_listen_endpoint(&self, address: EndpointAddress) -> Result<(), CloseError> {
        self.with(|w, b| w.op_close_listen(b, address))
    }

    fn close_active_endpoint(&self, conn: ConnId) -> Result<(), CloseError> {
        self.with(|w, b| w.op_close(b, conn))
    }

    fn get_buffer(&self, conn: ConnId) -> Result<Option<NetworkBuffer>, BufferError> {
        self.with(|w, b| w.op_get_buffer(b, conn))
    }

    fn send_buffer(&self, conn: ConnId, buffer: NetworkBuffer, key: u64) -> Result<(), SendError> {
        // On error the buffer is dropped at once, which returns it to its
        // pool.
        self.with(|w, b| w.op_send_buffer(b, conn, buffer, key))
    }

    fn send_data(
        &self,
        conn: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        self.with(|w, b| w.op_send_data(b, conn, data, header, key))
    }

    fn send_data_copy(
        &self,
        conn: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        self.with(|w, b| w.op_send_copy(b, conn, data, header, key))
    }

    /// As many `send_data_copy` calls, under one lock of the world.
    fn send_copy_batch(
        &self,
        conn: ConnId,
        messages: &[CopyMessage<'_>],
    ) -> Result<(), BatchSendError> {
        self.with(|w, b| {
            for (sent, m) in messages.iter().enumerate() {
                w.op_send_copy(b, conn, &[m.data], m.header, m.key)
                    .map_err(|error| BatchSendError { sent, error })?;
            }
            Ok(())
        })
    }

    fn num_available_buffers(&self, conn: ConnId) -> Result<usize, BufferError> {
        self.with(|w, b| w.op_available(b, conn))
    }

    /// The receiver stops taking the connection's messages into its
    /// buffers: the peer's sends stop completing, so its buffers and queue
    /// slots run out (`get_buffer` gives `None`, sends answer
    /// `NoResources`). Messages already in buffers wait for the resume.
    fn pause_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        self.with(|w, b| w.op_pause(b, conn))
    }

    fn resume_receive(&self, conn: ConnId) -> Result<(), ConnError> {
        self.with(|w, b| w.op_resume(b, conn))
    }

    fn remote_address(&self, conn: ConnId) -> Result<EndpointAddress, ConnError> {
        self.with(|w, b| w.op_remote_address(b, conn))
    }

    fn connection_to(&self, remote: EndpointAddress) -> Result<ConnId, ConnError> {
        self.with(|w, b| w.op_connection_to(b, remote))
    }

    fn memory_usage(&self) -> MemoryUsage {
        self.with(|w, b| w.memory_usage(b))
    }

    /// Virtual time ([`Sim::now`]).
    fn now(&self) -> Duration {
        self.lp.sim().now()
    }

    /// On virtual time: `on_timer(token)` runs exactly at now + `delay`.
    fn set_timer(&self, delay: Duration, token: u64) {
        self.with(|w, b| w.set_timer(b, delay, token))
    }

    /// `on_wake(token)` runs at the current virtual time, after the
    /// backend's earlier wakes.
    fn wake(&self, token: u64) {
        self.with(|w, b| w.wake(b, token))
    }
}

/// The simulator as a [`Provider`]: backends on [`SimLoop`]s.
///
/// ```
/// use netio_core::{BackendConfig, NoopHandler, Provider};
/// use netio_sim::{Sim, SimProvider};
/// let sim = Sim::new();
/// let host = sim.next_host();
/// let backend = SimProvider::create(host.event_loop(), BackendConfig::default(), NoopHandler).unwrap();
/// assert_eq!(backend.ip(), host.ip());
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SimProvider;

impl Provider for SimProvider {
    type Loop = SimLoop;
    type Backend = SimBackend;
    const NAME: &'static str = "sim";

    /// Creates a backend on the loop's host. Fails with `InvalidConfig` for
    /// an inconsistent configuration (empty shared pools, a
    /// `send_queue_depth` of 0) and with `Failed` on a crashed host.
    fn create<H: Handler<SimBackend> + 'static>(
        event_loop: &SimLoop,
        config: BackendConfig,
        handler: H,
    ) -> Result<SimBackend, CreateError> {
        SimBackend::create(event_loop, config, handler)
    }
}
