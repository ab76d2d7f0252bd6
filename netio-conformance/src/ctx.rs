//! Test context: a harness in one thread-safety mode, with helpers to make
//! recorded backends, connect them, and call them the way the mode allows.

use std::net::IpAddr;

use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress, ThreadSafety};

use crate::harness::Harness;
use crate::recorder::{Log, React, Recorder};

/// A backend made for a test, with the log of its events.
pub struct Node<H: Harness> {
    /// The backend.
    pub backend: H::Backend,
    /// Its events.
    pub log: Log,
    /// Its address.
    pub ip: IpAddr,
}

/// Two connected backends.
pub struct Pair<H: Harness> {
    /// The listening side.
    pub server: Node<H>,
    /// The connecting side.
    pub client: Node<H>,
    /// The listener's address: the client's name for the connection.
    pub listen: EndpointAddress,
    /// The client's address as the server sees it: the server's name for
    /// the connection.
    pub accepted: EndpointAddress,
}

/// A harness in one thread-safety mode.
pub struct Ctx<H: Harness> {
    /// The provider's harness.
    pub h: H,
    /// The mode under test.
    pub mode: ThreadSafety,
}

impl<H: Harness> Ctx<H> {
    /// Sets up the harness for a test in `mode`.
    pub fn new(mode: ThreadSafety) -> Self {
        Self {
            h: H::setup(),
            mode,
        }
    }

    /// The default configuration in the mode under test.
    pub fn config(&self) -> BackendConfig {
        BackendConfig::with_thread_safety(self.mode)
    }

    /// A recorded backend with the default configuration.
    pub fn node(&mut self) -> Node<H> {
        let cfg = self.config();
        self.node_with(cfg, None)
    }

    /// A recorded backend with `config` (its mode is set to the mode under
    /// test) and an optional reaction to events.
    pub fn node_with(
        &mut self,
        mut config: BackendConfig,
        react: Option<React<H::Backend>>,
    ) -> Node<H> {
        config.thread_safety = self.mode;
        let log = Log::default();
        let backend = self
            .h
            .backend(config, Box::new(Recorder::new(log.clone(), react)));
        let ip = self.h.local_ip(&backend);
        Node { backend, log, ip }
    }

    /// Calls `f` with the node's backend: directly from the test thread in
    /// thread-safe mode, on the loop thread in thread-unsafe mode.
    pub fn call<R: Send + 'static>(
        &mut self,
        node: &Node<H>,
        f: impl FnOnce(&H::Backend) -> R + Send + 'static,
    ) -> R {
        match self.mode {
            ThreadSafety::Safe => f(&node.backend),
            ThreadSafety::Unsafe => {
                let b = node.backend.clone();
                self.h.on_loop(&node.backend, Box::new(move || f(&b)))
            }
        }
    }

    /// Calls `f` with the node's backend on its loop thread, in either mode,
    /// so that no completion can be dispatched between the calls `f` makes.
    pub fn on_loop<R: Send + 'static>(
        &mut self,
        node: &Node<H>,
        f: impl FnOnce(&H::Backend) -> R + Send + 'static,
    ) -> R {
        let b = node.backend.clone();
        self.h.on_loop(&node.backend, Box::new(move || f(&b)))
    }

    /// Drives the loops until `cond` holds; panics with `what` if the
    /// harness deadline passes first.
    #[track_caller]
    pub fn wait(&mut self, what: &str, mut cond: impl FnMut() -> bool) {
        if !self.h.wait_until(&mut cond) {
            panic!("timed out waiting until {what}");
        }
    }

    /// Waits until `node` has recorded more than `seen` events (a send
    /// completed, say), or the harness deadline passes.
    fn wait_for_news(&mut self, node: &Node<H>, seen: usize) {
        let log = node.log.clone();
        self.h.wait_until(&mut || log.len() > seen);
    }

    /// Lets pending events run (see [`Harness::settle`]).
    pub fn settle(&mut self) {
        self.h.settle();
    }

    /// Opens a listener with `params` on `server` (port 0) and returns its
    /// address.
    #[track_caller]
    pub fn listen(&mut self, server: &Node<H>, params: ConnectionParams) -> EndpointAddress {
        let addr = EndpointAddress::new(server.ip, 0);
        self.call(server, move |b| b.open_listen_endpoint(addr, params))
            .unwrap_or_else(|e| panic!("listening on {addr} failed: {e}"))
    }

    /// Connects `client` to `listen` with `params` and waits until both
    /// sides report the connection. Returns the client's address as
    /// `server` sees it.
    #[track_caller]
    pub fn connect(
        &mut self,
        server: &Node<H>,
        client: &Node<H>,
        listen: EndpointAddress,
        params: ConnectionParams,
    ) -> EndpointAddress {
        let before = server.log.established().len();
        let count_to = |log: &Log| log.established().iter().filter(|e| e.0 == listen).count();
        let client_before = count_to(&client.log);
        self.call(client, move |b| b.open_active_endpoint(listen, params))
            .unwrap_or_else(|e| panic!("connecting to {listen} failed: {e}"));
        let (slog, clog) = (server.log.clone(), client.log.clone());
        self.wait("the connection is established on both sides", || {
            count_to(&clog) > client_before && slog.established().len() > before
        });
        server.log.established()[before].0
    }

    /// A server listening with `server_params` and a client connected to it
    /// with `client_params`, both with default configurations.
    #[track_caller]
    pub fn pair(
        &mut self,
        server_params: ConnectionParams,
        client_params: ConnectionParams,
    ) -> Pair<H> {
        let (s, c) = (self.node(), self.node());
        self.pair_of(s, c, server_params, client_params)
    }

    /// Like [`Ctx::pair`] with given nodes.
    #[track_caller]
    pub fn pair_of(
        &mut self,
        server: Node<H>,
        client: Node<H>,
        server_params: ConnectionParams,
        client_params: ConnectionParams,
    ) -> Pair<H> {
        let listen = self.listen(&server, server_params);
        let listen = connect_target(listen, server.ip);
        let accepted = self.connect(&server, &client, listen, client_params);
        Pair {
            server,
            client,
            listen,
            accepted,
        }
    }

    /// Sends `data` by copy from `from` to `to` with `key`, retrying (after
    /// letting the loops run) while the provider answers `NoResources`.
    #[track_caller]
    pub fn send_copy(&mut self, from: &Node<H>, to: EndpointAddress, data: Vec<u8>, key: u64) {
        for _ in 0..10_000 {
            let d = data.clone();
            let seen = from.log.len();
            match self.call(from, move |b| b.send_data_copy(to, &[&d], &[], key)) {
                Ok(()) => return,
                Err(e) if e.is_retryable() => self.wait_for_news(from, seen),
                Err(e) => panic!("send_data_copy to {to} failed: {e}"),
            }
        }
        panic!("send_data_copy to {to} kept answering NoResources");
    }

    /// Sends `data` through a pool buffer from `from` to `to`, waiting for a
    /// free buffer if needed. Returns the completion key (buffer index).
    #[track_caller]
    pub fn send_buffered(&mut self, from: &Node<H>, to: EndpointAddress, data: Vec<u8>) -> u64 {
        for _ in 0..10_000 {
            let d = data.clone();
            let seen = from.log.len();
            let r = self.call(from, move |b| {
                let mut buf = b.get_buffer(to).expect("get_buffer")?;
                buf.write(&d).expect("message fits the send buffer");
                let key = buf.index();
                Some(b.send_buffer(to, buf).map(|()| key))
            });
            match r {
                Some(Ok(key)) => return key,
                Some(Err(e)) if !e.is_retryable() => panic!("send_buffer to {to} failed: {e}"),
                _ => self.wait_for_news(from, seen),
            }
        }
        panic!("no send buffer to {to} came free");
    }
}

/// The address to connect to for a listener bound to `listen` on a node at
/// `ip` (an unspecified listen IP is replaced by the node's address).
pub fn connect_target(listen: EndpointAddress, ip: IpAddr) -> EndpointAddress {
    if listen.ip().is_unspecified() {
        EndpointAddress::new(ip, listen.port())
    } else {
        listen
    }
}

/// Receive + buffered send + copy parameters commonly used by the suite.
pub fn full_params(buf_size: usize, num_buf: usize) -> ConnectionParams {
    ConnectionParams::receive(buf_size, num_buf).with_buffered(buf_size, num_buf)
}
