//! Test context: a harness in one thread-safety mode, with helpers to make
//! recorded backends, connect them, call them the way the mode allows, hold
//! a peer back, and fail fast with the cause when a rule breaks.

use std::net::IpAddr;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use netio_core::{
    Backend, BackendConfig, BufferError, ConnId, ConnectionParams, EndpointAddress, MemoryRegion,
    OpenListenError, SendError, ThreadSafety,
};

use crate::harness::{Harness, NodeId};
use crate::recorder::{Event, Log, PerKey, React, Recorder};
use crate::watch::{lock, Runner, Watch, WatchdogGuard};

/// Wall time the suite waits for a posted call to run on a loop thread.
const POST_DEADLINE: Duration = Duration::from_secs(20);

/// The first key [`Ctx::send_buffered`] picks (far from the small keys
/// tests choose themselves).
pub(crate) const KEY_BASE: u64 = 1 << 48;

/// Who holds the turn of the suite's tests in this process: any number of
/// tests at once, or the one that counts the process's resources alone (so
/// no other test opens or closes descriptors meanwhile).
struct Turns {
    shared: usize,
    alone: bool,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns {
    shared: 0,
    alone: false,
});
static TURN_FREE: Condvar = Condvar::new();

/// One test's turn, given back when dropped, or by the runner when the
/// test is left behind stuck (so a deadlocked test does not keep the one
/// that runs alone waiting for ever).
pub(crate) struct Turn(Arc<TurnHandle>);

pub(crate) struct TurnHandle {
    alone: bool,
    released: AtomicBool,
}

impl Turn {
    /// A turn shared with any number of tests.
    pub(crate) fn shared() -> Self {
        Self::take(false)
    }

    fn alone() -> Self {
        Self::take(true)
    }

    fn take(alone: bool) -> Self {
        let mut t = lock(&TURNS);
        while t.alone || (alone && t.shared > 0) {
            t = TURN_FREE.wait(t).unwrap_or_else(|p| p.into_inner());
        }
        if alone {
            t.alone = true;
        } else {
            t.shared += 1;
        }
        let handle = Arc::new(TurnHandle {
            alone,
            released: AtomicBool::new(false),
        });
        if let Some(r) = Runner::current() {
            r.holds(handle.clone());
        }
        Self(handle)
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        release_turn(&self.0);
    }
}

/// Gives a turn back (once, however often it is called).
pub(crate) fn release_turn(h: &TurnHandle) {
    if h.released.swap(true, Ordering::SeqCst) {
        return;
    }
    let mut t = lock(&TURNS);
    if h.alone {
        t.alone = false;
    } else {
        t.shared -= 1;
    }
    TURN_FREE.notify_all();
}

/// A backend made for a test, with the log of its events.
pub struct Node<H: Harness> {
    /// The backend.
    pub backend: H::Backend,
    /// Its events.
    pub log: Log,
    /// Its address.
    pub ip: IpAddr,
    /// Its index in the harness.
    pub id: NodeId,
}

/// Two connected backends.
pub struct Pair<H: Harness> {
    /// The listening side.
    pub server: Node<H>,
    /// The connecting side.
    pub client: Node<H>,
    /// The listener's address (the client connected there).
    pub listen: EndpointAddress,
    /// The client's address as the server sees it.
    pub accepted: EndpointAddress,
    /// The client's handle of the connection.
    pub to_server: ConnId,
    /// The server's handle of the connection.
    pub to_client: ConnId,
}

/// One connection made by [`Ctx::connect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    /// The client's handle (the one `open_active_endpoint` returned).
    pub client: ConnId,
    /// The server's handle (first seen in its `on_connection_established`).
    pub server: ConnId,
    /// The client's address as the server sees it.
    pub accepted: EndpointAddress,
}

/// How a test sends.
#[derive(Debug, Clone)]
pub enum SendMode {
    /// `get_buffer` + `send_buffer`.
    Buffered,
    /// `send_data` from this region (registered on the connection).
    ZeroCopy(MemoryRegion),
    /// `send_data_copy`.
    Copy,
    /// `send_chunk` of chunks of this region (registered on the
    /// connection), each the first free range ([`MemoryRegion::chunk`]).
    Chunk(MemoryRegion),
}

/// What [`Ctx::fill`] sent before the provider pushed back.
#[derive(Debug, Clone)]
pub struct Filled {
    /// The completion keys of the accepted sends, in order; each message
    /// starts with its key as 8 little-endian bytes.
    pub keys: Vec<u64>,
    /// Bytes accepted.
    pub bytes: usize,
    /// How the provider pushed back: `NoResources`, or `get_buffer` = `None`.
    pub pushed_back: String,
}

/// A harness in one thread-safety mode.
pub struct Ctx<H: Harness> {
    /// The provider's harness.
    pub h: H,
    /// The mode under test.
    pub mode: ThreadSafety,
    watch: Arc<Watch>,
    nodes: usize,
    /// Every node's log, for the summary a timed-out wait prints.
    logs: Vec<Log>,
    next_key: AtomicU64,
    /// The keys [`Ctx::send_buffered_key`] sent, per node and connection.
    sent_buffered: std::collections::HashMap<(NodeId, ConnId), Vec<u64>>,
    _watchdog: WatchdogGuard,
    _turn: Turn,
}

impl<H: Harness> Drop for Ctx<H> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.watch.check();
        }
    }
}

impl<H: Harness> Ctx<H> {
    /// Sets up the harness for a test in `mode`.
    pub fn new(mode: ThreadSafety) -> Self {
        Self::with_turn(mode, Turn::shared())
    }

    /// Like [`Ctx::new`], waiting until no other suite test runs in the
    /// process and keeping them out until this one ends (for counting the
    /// process's resources).
    pub fn alone(mode: ThreadSafety) -> Self {
        Self::with_turn(mode, Turn::alone())
    }

    fn with_turn(mode: ThreadSafety, turn: Turn) -> Self {
        let name = std::thread::current()
            .name()
            .unwrap_or("conformance test")
            .to_string();
        let watch = Watch::new(name);
        let watchdog = watch.start_watchdog();
        Self {
            h: H::setup(),
            mode,
            watch,
            nodes: 0,
            logs: Vec::new(),
            next_key: AtomicU64::new(KEY_BASE),
            sent_buffered: std::collections::HashMap::new(),
            _watchdog: watchdog,
            _turn: turn,
        }
    }

    /// Fails the test now if a rule was broken or something is stuck.
    #[track_caller]
    pub fn check(&self) {
        self.watch.check();
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
        config: BackendConfig,
        react: Option<React<H::Backend>>,
    ) -> Node<H> {
        self.make_node(config, react, false)
    }

    /// Like [`Ctx::node_with`], with a handler that implements only the
    /// per-key `on_send_completed` (as netio3 handlers do): its log shows
    /// every completion as a batch of one.
    pub fn node_per_key(
        &mut self,
        config: BackendConfig,
        react: Option<React<H::Backend>>,
    ) -> Node<H> {
        self.make_node(config, react, true)
    }

    /// A recorded backend in the default configuration whose connections
    /// all leave from one local port ([`Harness::backend_from_one_port`]).
    pub fn node_from_one_port(&mut self) -> Node<H> {
        let cfg = self.config();
        self.make_node_with(cfg, None, false, true)
    }

    fn make_node(
        &mut self,
        config: BackendConfig,
        react: Option<React<H::Backend>>,
        per_key: bool,
    ) -> Node<H> {
        self.make_node_with(config, react, per_key, false)
    }

    fn make_node_with(
        &mut self,
        mut config: BackendConfig,
        react: Option<React<H::Backend>>,
        per_key: bool,
        one_port: bool,
    ) -> Node<H> {
        config.thread_safety = self.mode;
        let log = Log::default();
        let id = self.nodes;
        self.nodes += 1;
        self.logs.push(log.clone());
        let label = format!("backend #{id}");
        let recorder = Recorder::monitored(log.clone(), react, self.watch.clone(), label);
        let handler: Box<dyn netio_core::Handler<H::Backend>> = if per_key {
            Box::new(PerKey(recorder))
        } else {
            Box::new(recorder)
        };
        let backend = if one_port {
            self.h.backend_from_one_port(config, handler)
        } else {
            self.h.backend(config, handler)
        };
        let ip = self.h.local_ip(id);
        Node {
            backend,
            log,
            ip,
            id,
        }
    }

    /// Calls `f` with the node's backend: directly from the test thread in
    /// thread-safe mode, on the loop thread in thread-unsafe mode.
    #[track_caller]
    pub fn call<R: Send + 'static>(
        &mut self,
        node: &Node<H>,
        f: impl FnOnce(&H::Backend) -> R + Send + 'static,
    ) -> R {
        match self.mode {
            ThreadSafety::Safe => {
                let what = Location::caller().to_string();
                self.watch.backend_call(&what, || f(&node.backend))
            }
            ThreadSafety::Unsafe => self.on_loop(node, f),
        }
    }

    /// Runs `f` as a backend call made by the suite on this thread (any
    /// thread): handler calls from inside it are flagged, and the watchdog
    /// fails the test if it does not return. For the calls that work from
    /// any thread in both modes (`now`, `set_timer`, `wake`, …).
    #[track_caller]
    pub fn direct<R>(&self, f: impl FnOnce() -> R) -> R {
        let what = Location::caller().to_string();
        self.watch.backend_call(&what, f)
    }

    /// A function that runs a closure as a backend call made by the suite
    /// on whatever thread calls it (see [`Ctx::direct`]), for threads a
    /// test spawns.
    pub fn direct_anywhere(&self) -> impl Fn(&str, &mut dyn FnMut()) + Send + Sync + 'static {
        let watch = self.watch.clone();
        move |what: &str, f: &mut dyn FnMut()| watch.backend_call(what, f)
    }

    /// Calls `f` with the node's backend on its loop thread, in either mode,
    /// so that no completion can be dispatched between the calls `f` makes.
    #[track_caller]
    pub fn on_loop<R: Send + 'static>(
        &mut self,
        node: &Node<H>,
        f: impl FnOnce(&H::Backend) -> R + Send + 'static,
    ) -> R {
        let what = Location::caller().to_string();
        let (tx, rx) = mpsc::channel();
        let (b, watch) = (node.backend.clone(), self.watch.clone());
        let w = what.clone();
        self.h.post(
            node.id,
            Box::new(move || {
                let _ = tx.send(watch.backend_call(&w, || f(&b)));
            }),
        );
        self.wait_posted(rx, node.id, &what)
    }

    #[track_caller]
    fn wait_posted<R>(&mut self, rx: mpsc::Receiver<R>, id: NodeId, what: &str) -> R {
        let end = Instant::now() + POST_DEADLINE;
        loop {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "the call posted to the loop of backend #{id} ({what}) was dropped without \
                     running: did the loop stop?"
                ),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            self.watch.check();
            if Instant::now() > end {
                panic!(
                    "the loop thread of backend #{id} did not run a posted call ({what}) within \
                     {} s: it is stuck or not running; {}",
                    POST_DEADLINE.as_secs(),
                    self.seen_so_far()
                );
            }
        }
    }

    /// Holds the node's loop back (see [`Harness::pause`]): it reads and
    /// reports nothing until [`Ctx::resume_with`].
    pub fn pause(&mut self, node: &Node<H>) {
        self.h.pause(node.id);
    }

    /// Lets a paused node go on; `f` runs on its loop thread with its
    /// backend before anything the loop held back, and its result is
    /// returned.
    #[track_caller]
    pub fn resume_with<R: Send + 'static>(
        &mut self,
        node: &Node<H>,
        f: impl FnOnce(&H::Backend) -> R + Send + 'static,
    ) -> R {
        let what = Location::caller().to_string();
        let (tx, rx) = mpsc::channel();
        let (b, watch) = (node.backend.clone(), self.watch.clone());
        let w = what.clone();
        self.h.resume(
            node.id,
            Box::new(move || {
                let _ = tx.send(watch.backend_call(&w, || f(&b)));
            }),
        );
        self.wait_posted(rx, node.id, &what)
    }

    /// Lets a paused node go on.
    #[track_caller]
    pub fn resume(&mut self, node: &Node<H>) {
        self.resume_with(node, |_| ());
    }

    /// Drives the loops until `cond` holds; panics with `what` if the
    /// harness deadline passes first, and at once (naming the cause) when a
    /// rule of the contract breaks or the loop thread is stuck.
    #[track_caller]
    pub fn wait(&mut self, what: &str, mut cond: impl FnMut() -> bool) {
        let watch = self.watch.clone();
        let ok = self.h.wait_until(&mut || watch.failing() || cond());
        self.watch.check();
        if !ok {
            panic!("timed out waiting until {what}; {}", self.seen_so_far());
        }
    }

    /// What every node recorded so far, counted by kind and connection
    /// (for the message of a wait that timed out).
    pub fn seen_so_far(&self) -> String {
        use std::collections::BTreeMap;
        let mut out = Vec::new();
        for (id, log) in self.logs.iter().enumerate() {
            let mut per: BTreeMap<String, [usize; 5]> = BTreeMap::new();
            let (mut timers, mut wakes) = (0, 0);
            for e in log.events() {
                let Some(conn) = e.conn() else {
                    match e {
                        Event::Timer { .. } => timers += 1,
                        Event::Wake { .. } => wakes += 1,
                        _ => {}
                    }
                    continue;
                };
                let n = per.entry(format!("{conn:?}")).or_default();
                match e {
                    Event::Data { .. } => n[0] += 1,
                    Event::Completed { .. } => n[1] += 1,
                    Event::Closed { keys, .. } => {
                        n[2] += 1;
                        n[3] += keys.len();
                    }
                    _ => n[4] += 1,
                }
            }
            let mut conns: Vec<String> = per
                .iter()
                .map(|(c, n)| {
                    format!(
                        "{c}: {} messages, {} completions, {} closes with {} cancelled keys, {} \
                         set-up events",
                        n[0], n[1], n[2], n[3], n[4]
                    )
                })
                .collect();
            if timers + wakes > 0 {
                conns.push(format!("{timers} on_timer, {wakes} on_wake"));
            }
            out.push(format!("backend #{id} saw [{}]", conns.join("; ")));
        }
        if out.is_empty() {
            "no backend made yet".into()
        } else {
            out.join("; ")
        }
    }

    /// Like [`Ctx::wait`], failing at once with `rule` when `broken` returns
    /// a description of something that must not happen.
    #[track_caller]
    pub fn wait_unless(
        &mut self,
        what: &str,
        rule: &str,
        mut cond: impl FnMut() -> bool,
        mut broken: impl FnMut() -> Option<String>,
    ) {
        let mut seen = None;
        self.wait(what, || {
            seen = broken();
            seen.is_some() || cond()
        });
        if let Some(s) = seen {
            panic!("{rule}: {s}");
        }
    }

    /// Waits until `node` has recorded more than `seen` events (a send
    /// completed, say); `false` if the harness deadline passed first.
    fn wait_for_news(&mut self, node: &Node<H>, seen: usize) -> bool {
        let log = node.log.clone();
        let watch = self.watch.clone();
        let news = self
            .h
            .wait_until(&mut || watch.failing() || log.len() > seen);
        self.watch.check();
        news
    }

    /// Lets pending events run (see [`Harness::settle`]).
    #[track_caller]
    pub fn settle(&mut self) {
        self.h.settle();
        self.watch.check();
    }

    /// Opens a listener with `params` on `server` (port 0) and returns its
    /// address.
    #[track_caller]
    pub fn listen(&mut self, server: &Node<H>, params: ConnectionParams) -> EndpointAddress {
        let addr = EndpointAddress::new(server.ip, 0);
        self.call(server, move |b| b.open_listen_endpoint(addr, params))
            .unwrap_or_else(|e| panic!("listening on {addr} failed: {e}"))
    }

    /// Opens a listener with `params` on `server` on a port below Linux's
    /// default ephemeral range (32768–60999), the first of up to 200
    /// candidates from 20000 up that opens (a port that fails with
    /// `FailedOpenListenEndpoint`, taken, is skipped; any other error
    /// fails at once), and returns its address. For a
    /// behaviour that listens on the same address again after a close: a
    /// port handed out by the system (port 0) comes from the ephemeral
    /// range, where a connection opened meanwhile by another test of the
    /// same process (or by a fabric provider) may take it as its local
    /// port, and the second listen would then fail through no fault of
    /// the provider.
    #[track_caller]
    pub fn listen_on_fixed_port(
        &mut self,
        server: &Node<H>,
        params: ConnectionParams,
    ) -> EndpointAddress {
        // Spread over the candidates, so that test processes running at
        // once rarely try the same ports in the same order.
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let start = (u64::from(std::process::id()) * 37
            + NEXT.fetch_add(1, Ordering::Relaxed) * 211)
            % 12_000;
        let mut last = None;
        for i in 0..200 {
            let port = 20_000 + ((start + i * 61) % 12_000) as u16;
            let addr = EndpointAddress::new(server.ip, port);
            let p = params.clone();
            match self.call(server, move |b| b.open_listen_endpoint(addr, p)) {
                Ok(a) => return a,
                // The port is taken (by another process): the next one.
                Err(e @ OpenListenError::FailedOpenListenEndpoint { .. }) => last = Some(e),
                Err(e) => panic!("listening on {addr} failed: {e}"),
            }
        }
        panic!(
            "listening on {} failed on 200 ports from 20000 up; the last error: {:?}",
            server.ip, last
        )
    }

    /// Connects `client` to `listen` with `params` and waits until both
    /// sides report the connection. Returns both handles and the client's
    /// address as `server` sees it.
    #[track_caller]
    pub fn connect(
        &mut self,
        server: &Node<H>,
        client: &Node<H>,
        listen: EndpointAddress,
        params: ConnectionParams,
    ) -> Connection {
        let before = server.log.established().len();
        let conn = self
            .call(client, move |b| b.open_active_endpoint(listen, params))
            .unwrap_or_else(|e| panic!("connecting to {listen} failed: {e}"));
        let (slog, clog) = (server.log.clone(), client.log.clone());
        self.wait_unless(
            "the connection is established on both sides",
            "a connection to a listening peer must be established",
            || clog.established_caps(conn).is_some() && slog.established().len() > before,
            || {
                clog.refused()
                    .into_iter()
                    .find(|r| r.0 == conn)
                    .map(|r| format!("the client saw {conn} refused: {:?}", r.2))
            },
        );
        let (server_conn, accepted, _) = server.log.established()[before];
        Connection {
            client: conn,
            server: server_conn,
            accepted,
        }
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
        let c = self.connect(&server, &client, listen, client_params);
        Pair {
            server,
            client,
            listen,
            accepted: c.accepted,
            to_server: c.client,
            to_client: c.server,
        }
    }

    /// Sends `data` by copy from `from` on connection `to` with `key`,
    /// retrying (after letting the loops run) while the provider answers
    /// `NoResources`; fails, saying what every node saw, when nothing
    /// happens on `from` within the harness deadline.
    #[track_caller]
    pub fn send_copy(&mut self, from: &Node<H>, to: ConnId, data: Vec<u8>, key: u64) {
        loop {
            let d = data.clone();
            let seen = from.log.len();
            match self.call(from, move |b| b.send_data_copy(to, &[&d], &[], key)) {
                Ok(()) => return,
                Err(e) if e.is_retryable() => {
                    if !self.wait_for_news(from, seen) {
                        panic!(
                            "send_data_copy to {to} kept answering {e} and backend #{} reported \
                             nothing (no completion) within the harness deadline; {}",
                            from.id,
                            self.seen_so_far()
                        );
                    }
                }
                Err(e) => panic!("send_data_copy to {to} failed: {e}"),
            }
        }
    }

    /// Sends `data` from `from` on connection `to` with `key` by copy where
    /// the provider has copy sends, else through a pool buffer (the
    /// connection then needs send buffers): for behaviours whose subject is
    /// not the send mode, so that they run on every provider.
    #[track_caller]
    pub fn send_copy_or_buffered(&mut self, from: &Node<H>, to: ConnId, data: Vec<u8>, key: u64) {
        if self.h.features().send_copy {
            self.send_copy(from, to, data, key);
        } else {
            self.send_buffered_key(from, to, data, key);
        }
    }

    /// Sends `data` through a pool buffer from `from` on connection `to`,
    /// waiting for a free buffer if needed. Returns the completion key,
    /// which the suite picks (distinct in the test).
    #[track_caller]
    pub fn send_buffered(&mut self, from: &Node<H>, to: ConnId, data: Vec<u8>) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.send_buffered_key(from, to, data, key);
        key
    }

    /// Like [`Ctx::send_buffered`] with the caller's `key`.
    ///
    /// While `get_buffer` gives `None` it waits for `from` to report
    /// something (a completion brings a buffer back). It fails within
    /// seconds, naming the rule, when every send this test made through
    /// the suite's helpers on `to` has been reported and still no buffer
    /// comes free (the provider keeps the buffers of ended sends: a send
    /// buffer is back in its pool when its completion is reported), and
    /// after the harness deadline when nothing happens at all.
    #[track_caller]
    pub fn send_buffered_key(&mut self, from: &Node<H>, to: ConnId, data: Vec<u8>, key: u64) {
        self.send_buffered_on(from, to, data, key, false);
    }

    /// [`Ctx::send_buffered_key`] on a connection that may have ended by
    /// the time the send is made (a peer timeout that may already have
    /// passed): `false`, with nothing sent, if the provider no longer
    /// knows the connection.
    #[track_caller]
    pub fn send_buffered_key_if_open(
        &mut self,
        from: &Node<H>,
        to: ConnId,
        data: Vec<u8>,
        key: u64,
    ) -> bool {
        self.send_buffered_on(from, to, data, key, true)
    }

    #[track_caller]
    fn send_buffered_on(
        &mut self,
        from: &Node<H>,
        to: ConnId,
        data: Vec<u8>,
        key: u64,
        may_be_gone: bool,
    ) -> bool {
        // The log's length when every send had been reported and no buffer
        // was free.
        let mut suspect: Option<usize> = None;
        loop {
            let d = data.clone();
            let seen = from.log.len();
            let r = self.call(from, move |b| {
                let mut buf = match b.get_buffer(to) {
                    Ok(buf) => buf?,
                    Err(BufferError::UnknownConnection(_)) if may_be_gone => {
                        return Some(Err(SendError::UnknownConnection(to)));
                    }
                    Err(e) => panic!("get_buffer: {e:?}"),
                };
                buf.write(&d).expect("message fits the send buffer");
                Some(b.send_buffer(to, buf, key).map(|()| key))
            });
            match r {
                Some(Ok(_)) => {
                    self.sent_buffered
                        .entry((from.id, to))
                        .or_default()
                        .push(key);
                    return true;
                }
                Some(Err(SendError::UnknownConnection(_))) if may_be_gone => return false,
                Some(Err(e)) if !e.is_retryable() => panic!("send_buffer to {to} failed: {e}"),
                _ => {}
            }
            let sent = self
                .sent_buffered
                .get(&(from.id, to))
                .cloned()
                .unwrap_or_default();
            let ended: std::collections::HashSet<u64> = from
                .log
                .completed(to)
                .into_iter()
                .chain(from.log.cancelled(to))
                .collect();
            if sent.iter().all(|k| ended.contains(k)) {
                if suspect == Some(from.log.len()) {
                    panic!(
                        "a send buffer is back in its pool when its completion is reported: \
                         all {} buffered sends on {to} have been reported (completed or \
                         cancelled) and nothing else happened, yet get_buffer gives None (the \
                         provider keeps the buffers of ended sends); {}",
                        sent.len(),
                        self.seen_so_far()
                    );
                }
                // Let a provider that returns buffers a little after it
                // reported their sends catch up, once.
                suspect = Some(from.log.len());
                self.settle();
                continue;
            }
            suspect = None;
            if !self.wait_for_news(from, seen) {
                panic!(
                    "no send buffer of {to} came free: get_buffer gives None and backend #{} \
                     reported nothing (no completion) within the harness deadline; {}",
                    from.id,
                    self.seen_so_far()
                );
            }
        }
    }

    /// Sends messages of `size` bytes (at least 8: each starts with its key)
    /// from `from` to `to` in `mode` until the provider pushes back and
    /// still does after the loops settled: with the peer paused, what is
    /// then unfinished is truly in flight (the transport's buffers are full
    /// and the connection's queue too). Keys count up from `first_key`, in
    /// every mode. Panics if `max_bytes` are accepted without any
    /// push-back.
    #[track_caller]
    pub fn fill(
        &mut self,
        from: &Node<H>,
        to: ConnId,
        mode: SendMode,
        size: usize,
        first_key: u64,
        max_bytes: usize,
    ) -> Filled {
        let mut filled = Filled {
            keys: Vec::new(),
            bytes: 0,
            pushed_back: String::new(),
        };
        let mut counter = first_key;
        let mut settled = false;
        // Calls go in batches, on the loop thread in thread-unsafe mode.
        while filled.bytes < max_bytes {
            let m = mode.clone();
            let (k0, batch) = (counter, 64);
            let (keys, stop): (Vec<u64>, Option<String>) = self.call(from, move |b| {
                let mut keys = Vec::new();
                for i in 0..batch {
                    let n = k0 + i;
                    let mut msg = vec![(n % 251) as u8; size.max(8)];
                    msg[..8].copy_from_slice(&n.to_le_bytes());
                    let r = match &m {
                        SendMode::Copy => b.send_data_copy(to, &[&msg], &[], n).map(|()| n),
                        SendMode::ZeroCopy(region) => {
                            let off = ((n as usize) % (region.len() / size.max(8))) * size.max(8);
                            if region.write(off, &msg).is_err() {
                                return (keys, Some("the region is all lent out".into()));
                            }
                            let s = region.slice(off, size.max(8)).expect("slice in region");
                            b.send_data(to, &[s], &[], n).map(|()| n)
                        }
                        SendMode::Chunk(region) => {
                            let Some(mut chunk) = region.chunk(size.max(8)) else {
                                return (keys, Some("the region is all lent out".into()));
                            };
                            chunk.copy_from_slice(&msg);
                            b.send_chunk(to, chunk, &[], n)
                                .map(|()| n)
                                .map_err(|e| e.error)
                        }
                        SendMode::Buffered => match b.get_buffer(to) {
                            Ok(Some(mut buf)) => {
                                buf.write(&msg).expect("message fits the send buffer");
                                b.send_buffer(to, buf, n).map(|()| n)
                            }
                            Ok(None) => {
                                return (keys, Some("get_buffer gave None".into()));
                            }
                            Err(e) => panic!("get_buffer to {to} failed: {e}"),
                        },
                    };
                    match r {
                        Ok(k) => keys.push(k),
                        Err(SendError::NoResources) => {
                            return (keys, Some("NoResources".into()));
                        }
                        Err(e) => panic!("sending to {to} failed: {e}"),
                    }
                }
                (keys, None)
            });
            counter += keys.len() as u64;
            filled.bytes += keys.len() * size.max(8);
            let accepted = keys.len();
            filled.keys.extend(keys);
            if let Some(s) = stop {
                // Pushed back: done if it still holds once the sender's
                // loop had time to move what it queued into the transport
                // (and nothing was accepted since the last such pause).
                if accepted == 0 && settled {
                    filled.pushed_back = s;
                    return filled;
                }
                self.settle();
                // And once the sender's loop has run a turn since: on a
                // loaded machine the settle can pass with the loop thread
                // never scheduled (or the whole process held still), its
                // completions unread, and a push-back that was only the
                // loop falling behind taken for the peer's.
                self.on_loop(from, |_| ());
                settled = true;
            } else {
                settled = false;
            }
        }
        panic!(
            "backpressure: {} sends ({} bytes) to a peer that reads nothing were all accepted; \
             a provider must push back (NoResources, or get_buffer = None) once the connection's \
             queue is full, not buffer without bound",
            filled.keys.len(),
            filled.bytes
        );
    }

    /// Breaks the connection `conn` of `node`, whose remote address is
    /// `remote`, like a network failure (see [`Harness::reset_connection`]).
    pub fn reset(&mut self, node: &Node<H>, conn: ConnId, remote: EndpointAddress) {
        self.h.reset_connection(node.id, conn, remote);
    }

    /// Makes `peer` stop answering `node` (see [`Harness::partition`] and
    /// [`Harness::silence`]): partitions the two where the harness can,
    /// else silences `peer`. The test called [`Ctx::isolate`] first.
    pub fn cut_off(&mut self, node: &Node<H>, peer: &Node<H>) {
        if self.h.can_partition() {
            self.h.partition(node.id, peer.id);
        } else {
            self.h.silence(peer.id);
        }
    }

    /// Undoes [`Ctx::cut_off`].
    pub fn reconnect(&mut self, node: &Node<H>, peer: &Node<H>) {
        if self.h.can_partition() {
            self.h.heal(node.id, peer.id);
        } else {
            self.h.unsilence(peer.id);
        }
    }

    /// Prepares the harness for [`Ctx::partition`] (see
    /// [`Harness::isolate`]); call it before making any node.
    pub fn isolate(&mut self) {
        assert_eq!(
            self.nodes, 0,
            "Ctx::isolate must come before the test makes its nodes"
        );
        self.h.isolate();
    }

    /// Makes `a` and `b` unreachable from each other (see
    /// [`Harness::partition`]); the test called [`Ctx::isolate`] first.
    pub fn partition(&mut self, a: &Node<H>, b: &Node<H>) {
        self.h.partition(a.id, b.id);
    }

    /// Undoes [`Ctx::partition`].
    pub fn heal(&mut self, a: &Node<H>, b: &Node<H>) {
        self.h.heal(a.id, b.id);
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
