//! The benchmark over a netio provider: a [`Server`] handler (echo or sink,
//! chosen by the client's set-up message) and a [`Client`] handler, written
//! against the `Backend` trait, created by name through the `netio` facade.
//!
//! Socket providers run server and client on two event loops, each on its
//! own thread; the simulator runs both virtual hosts of one world, driven on
//! the calling thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use netio::mio_loop::{LoopConfig, MioLoop};
use netio::sim::Sim;
use netio::{
    AnyLoop, Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams,
    CopyMessage, EndpointAddress, EventLoop, Features, Handler, MemoryRegion, NetworkBuffer,
    NetworkMode, RefuseReason, SendError, ThreadSafety,
};

use crate::cli::{SendMode, TestKind};
use crate::metrics::{self, Figures};
use crate::proto::{self, Report, Role, SinkCounter};
use crate::stats::RoundTrips;

/// What one run measures.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The test (not `Conns`).
    pub test: TestKind,
    /// Message size in bytes.
    pub size: usize,
    /// Send mode.
    pub mode: SendMode,
    /// Iterations before measuring.
    pub warmup: u64,
    /// Measured iterations, or `None` with a duration.
    pub count: Option<u64>,
    /// Measuring time, when there is no count.
    pub duration: Option<Duration>,
    /// Busy-polling loops.
    pub busy_poll: bool,
    /// Backends in thread-unsafe mode (every call on the loop thread).
    pub thread_unsafe: bool,
    /// The backends' network mode (the simulator's profile).
    pub network_mode: NetworkMode,
    /// With the simulator: a shared world instead of a driver-only one.
    pub sim_shared: bool,
    /// Bound of the whole run.
    pub timeout: Duration,
    /// `SO_SNDBUF` and `SO_RCVBUF` of every socket (netio's tcp provider
    /// and the baseline), or `None` for the system's default.
    pub socket_buffers: Option<usize>,
    /// The plain baseline's sending `BufWriter` capacity (0: none, every
    /// frame written straight to the socket).
    pub plain_write_buffer: usize,
    /// The plain baseline's receive buffer.
    pub plain_read_buffer: usize,
    /// Receive buffers per connection on both sides (`--recv-buffers`), or
    /// `None` for the defaults ([`ECHO_RECV_BUFFERS`], [`recv_buffers`]).
    pub recv_buffers: Option<usize>,
}

impl Spec {
    /// The server's role for this test.
    pub fn role(&self) -> Role {
        if self.test == TestKind::Pingpong {
            Role::Echo
        } else {
            Role::Sink
        }
    }
}

/// Why a run produced no figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunError {
    /// The provider does not support what the run needs.
    Unsupported(String),
    /// The run failed.
    Failed(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported(s) | Self::Failed(s) => f.write_str(s),
        }
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> RunError {
    RunError::Failed(format!("{what}: {e}"))
}

/// Messages in flight per connection for one-way tests: about 16 MiB, at
/// least 2, at most 1024 (the client's send queue depth is set to match,
/// see [`client_config`]), so small messages leave in writes of a few
/// tens of KiB, as a `BufWriter` stream's do.
pub fn window(size: usize) -> usize {
    ((16 << 20) / size.max(1)).clamp(2, 1024)
}

/// The client backend's configuration: a send queue as deep as the window.
fn client_config(spec: &Spec) -> BackendConfig {
    let default = BackendConfig::default();
    BackendConfig {
        send_queue_depth: window(spec.size).max(default.send_queue_depth),
        ..backend_config(spec)
    }
}

/// A backend's configuration: the thread mode the run asks for.
fn backend_config(spec: &Spec) -> BackendConfig {
    BackendConfig {
        mode: spec.network_mode,
        thread_safety: if spec.thread_unsafe {
            ThreadSafety::Unsafe
        } else {
            ThreadSafety::Safe
        },
        ..BackendConfig::default()
    }
}

/// Receive buffers per connection of a ping-pong's client and server by
/// default.
pub const ECHO_RECV_BUFFERS: usize = 4;

/// Receive buffers of a receiving connection for messages of `size`.
pub fn recv_buffers(size: usize) -> usize {
    ((16 << 20) / size.max(1)).clamp(4, 64)
}

/// Receive limit for messages of `size` (room for the control messages).
fn recv_size(size: usize) -> usize {
    size.max(64)
}

/// Checks that the provider supports `mode`.
pub fn check_mode(provider: &str, f: Features, mode: SendMode) -> Result<(), RunError> {
    let missing = match mode {
        SendMode::Copy if !f.send_copy => Some("copy sends (send_data_copy)"),
        SendMode::CopyBatch if !f.send_copy => Some("copy sends (send_copy_batch)"),
        SendMode::ZeroCopy if !f.send_zero_copy => Some("zero-copy sends (send_data)"),
        SendMode::Async if !f.send_copy => {
            Some("copy sends (send_data_copy), which the async API's sends use")
        }
        _ => None,
    };
    match missing {
        Some(m) => Err(RunError::Unsupported(format!(
            "provider `{provider}` does not support {m}"
        ))),
        None => Ok(()),
    }
}

/// A region holding one data message of `size` bytes (allocated by
/// `MemoryRegion::new`, which aligns it as registered memory should be).
fn data_region(size: usize) -> MemoryRegion {
    let mut m = Vec::new();
    proto::data_message(&mut m, size);
    let region = MemoryRegion::new(m.len());
    region.write(0, &m).expect("the message fits its region");
    region
}

/// Parameters of the server's connections: receiving messages of up to
/// `max_size`, and sending back in each of `echo_modes`.
pub fn server_params(
    max_size: usize,
    recv_bufs: usize,
    echo_modes: &[SendMode],
    region: Option<&MemoryRegion>,
    features: Features,
) -> ConnectionParams {
    let mut p = ConnectionParams::receive(recv_size(max_size), recv_bufs);
    let zero_copy = echo_modes.contains(&SendMode::ZeroCopy) && features.send_zero_copy;
    if echo_modes.contains(&SendMode::Buffered) && (!zero_copy || features.buffered_with_zero_copy)
    {
        p = p.with_buffered(recv_size(max_size), 4);
    }
    if zero_copy {
        if let Some(r) = region {
            p = p.with_zero_copy(r.clone());
        }
    }
    p
}

/// The server's connection parameters for a run of `spec`: echoing in the
/// run's mode, or sinking.
fn run_server_params(
    spec: &Spec,
    region: Option<&MemoryRegion>,
    features: Features,
) -> ConnectionParams {
    match spec.role() {
        Role::Echo => server_params(
            spec.size,
            spec.recv_buffers.unwrap_or(ECHO_RECV_BUFFERS),
            &[spec.mode],
            region,
            features,
        ),
        Role::Sink => server_params(
            spec.size,
            spec.recv_buffers.unwrap_or_else(|| recv_buffers(spec.size)),
            &[],
            None,
            features,
        ),
    }
}

/// Per-connection state of a handler, indexed by the slot of the
/// connection's handle: finding a connection's entry is an index and a
/// compare, no hashing.
pub struct ByConn<T> {
    slots: Vec<Option<(ConnId, T)>>,
}

impl<T> Default for ByConn<T> {
    fn default() -> Self {
        Self { slots: Vec::new() }
    }
}

impl<T> ByConn<T> {
    /// Sets the entry of `conn`.
    pub fn insert(&mut self, conn: ConnId, value: T) {
        let i = conn.index() as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i] = Some((conn, value));
    }

    /// The entry of `conn`, if it has one (not one of an earlier handle of
    /// the same slot).
    #[inline]
    pub fn get_mut(&mut self, conn: ConnId) -> Option<&mut T> {
        match self.slots.get_mut(conn.index() as usize) {
            Some(Some((c, v))) if *c == conn => Some(v),
            _ => None,
        }
    }

    /// Removes the entry of `conn`.
    pub fn remove(&mut self, conn: ConnId) -> Option<T> {
        let slot = self.slots.get_mut(conn.index() as usize)?;
        match slot {
            Some((c, _)) if *c == conn => slot.take().map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Sends `data` in `mode` (zero-copy: the first `data.len()` bytes of
/// `region`, which hold a data message).
fn send_msg<B: Backend + ?Sized>(
    b: &B,
    conn: ConnId,
    mode: SendMode,
    data: &[u8],
    region: Option<&MemoryRegion>,
    key: u64,
) -> Result<(), SendError> {
    match mode {
        SendMode::Copy | SendMode::CopyBatch => b.send_data_copy(conn, &[data], &[], key),
        SendMode::Buffered | SendMode::BufferedBatch => {
            let Some(mut buf) = b
                .get_buffer(conn)
                .map_err(|e| SendError::Failed(e.into()))?
            else {
                return Err(SendError::NoResources);
            };
            buf.write(data).map_err(|e| SendError::Failed(e.into()))?;
            b.send_buffer(conn, buf, key)
        }
        SendMode::ZeroCopy => {
            let region = region.ok_or(SendError::NotSupported("no region registered"))?;
            let s = region
                .slice(0, data.len())
                .map_err(|e| SendError::Failed(e.into()))?;
            b.send_data(conn, &[s], &[], key)
        }
        SendMode::Async => Err(SendError::NotSupported("asynchronous sends")),
    }
}

/// Sends a control message: by copy, or through a pool buffer where the
/// provider cannot copy.
fn send_control<B: Backend + ?Sized>(
    b: &B,
    conn: ConnId,
    data: &[u8],
    key: u64,
) -> Result<(), SendError> {
    match b.send_data_copy(conn, &[data], &[], key) {
        Err(SendError::NotSupported(_)) => send_msg(b, conn, SendMode::Buffered, data, None, key),
        other => other,
    }
}

enum SrvConn {
    Await,
    Echo(SendMode),
    Sink(SinkCounter),
}

/// The server: echoes (ping-pong) or counts (one-way tests) on each
/// connection, as the client's set-up message says.
pub struct Server {
    conns: ByConn<SrvConn>,
    region: Option<MemoryRegion>,
    virtual_time: bool,
    key: u64,
}

impl Server {
    /// A server that sends zero-copy echoes from `region`; with
    /// `virtual_time` (on the simulator) its one-way reports also carry
    /// times on the backend's clock.
    pub fn new(region: Option<MemoryRegion>, virtual_time: bool) -> Self {
        Self {
            conns: ByConn::default(),
            region,
            virtual_time,
            key: 0,
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for Server {
    fn on_connection_established(
        &mut self,
        _: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.conns.insert(conn, SrvConn::Await);
    }

    fn on_data(&mut self, b: &B, id: ConnId, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(id) else {
            return;
        };
        self.key = self.key.wrapping_add(1);
        // A ping-pong's echo, or a one-way test's data message counted
        // with no clock read (as a plain reader counts); the rest out of
        // line.
        match (conn, data.first()) {
            (SrvConn::Sink(c), Some(&proto::DATA)) => {
                if !c.count(data.len()) {
                    self.on_data_rest(b, id, data);
                }
            }
            (SrvConn::Echo(mode), Some(&proto::DATA)) => {
                if let Err(e) = send_msg(b, id, *mode, data, self.region.as_ref(), self.key) {
                    eprintln!("netio-perf server: cannot echo on {id}: {e}");
                    let _ = b.close_active_endpoint(id);
                }
            }
            _ => self.on_data_rest(b, id, data),
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: &CloseReason,
        _: &[u64],
    ) {
        self.conns.remove(conn);
    }
}

impl Server {
    /// What [`Handler::on_data`] does besides echoing and counting a data
    /// message.
    #[inline(never)]
    fn on_data_rest<B: Backend + ?Sized>(&mut self, b: &B, id: ConnId, data: &[u8]) {
        let Some(conn) = self.conns.get_mut(id) else {
            return;
        };
        let tag = data.first().copied();
        let vnow = || self.virtual_time.then(|| b.now());
        match (conn, tag) {
            (SrvConn::Sink(c), Some(proto::DATA)) => c.data(data.len(), vnow),
            (SrvConn::Sink(c), Some(proto::END)) => {
                c.end(vnow);
                if let Err(e) = send_control(b, id, &c.report().encode(), self.key) {
                    eprintln!("netio-perf server: cannot report on {id}: {e}");
                }
            }
            (conn @ SrvConn::Await, Some(proto::SETUP)) => match proto::parse_setup(data) {
                // An async client's pings are echoed with copy sends: the
                // mode names the client's API.
                Some((Role::Echo, SendMode::Async, _)) => *conn = SrvConn::Echo(SendMode::Copy),
                Some((Role::Echo, mode, _)) => *conn = SrvConn::Echo(mode),
                Some((Role::Sink, _, warmup)) => *conn = SrvConn::Sink(SinkCounter::new(warmup)),
                None => {
                    eprintln!("netio-perf server: bad set-up message on {id}");
                    let _ = b.close_active_endpoint(id);
                }
            },
            _ => {
                eprintln!("netio-perf server: unexpected message on {id}");
                let _ = b.close_active_endpoint(id);
            }
        }
    }
}

/// What a client run produced.
#[derive(Debug)]
pub enum ClientResult {
    /// Ping-pong: measured round trips (ns), the same in virtual time, and
    /// the real time they took.
    PingPong(Vec<u64>, Vec<u64>, Duration),
    /// One-way: the receiver's report.
    Sink(Report),
}

type Outcome = Arc<Mutex<Option<Result<ClientResult, String>>>>;

/// Most data messages sent in one batch call.
const MAX_BATCH: u64 = 256;

/// Data messages sent between two reads of the clock against a run's
/// deadline.
const LOOK_EVERY: u64 = 64;

/// The client: ping-pong, or sends one way as fast as the window allows.
pub struct Client {
    spec: Spec,
    msg: Vec<u8>,
    region: Option<MemoryRegion>,
    virtual_time: bool,
    // ping-pong
    i: u64,
    vsent_at: Option<Duration>,
    round_trips: Option<RoundTrips>,
    vsamples: Vec<u64>,
    // one-way
    inflight: usize,
    window: usize,
    data_sent: u64,
    end_sent: bool,
    deadline: Option<Instant>,
    /// `data_sent` at which the clock is read again against `deadline`.
    next_look: u64,
    /// The deadline has passed: no more data.
    past_deadline: bool,
    key: u64,
    /// Buffers taken for the next batch of buffered sends.
    bufs: Vec<NetworkBuffer>,
    /// The batch of buffered sends being made.
    batch: Vec<(NetworkBuffer, u64)>,
    finished: bool,
    outcome: Outcome,
    done: Arc<AtomicBool>,
    notify: mpsc::Sender<()>,
}

impl Client {
    fn new(
        spec: Spec,
        region: Option<MemoryRegion>,
        virtual_time: bool,
        outcome: Outcome,
        done: Arc<AtomicBool>,
        notify: mpsc::Sender<()>,
    ) -> Self {
        let mut msg = Vec::new();
        proto::data_message(&mut msg, spec.size);
        let reserve = spec.count.unwrap_or(1 << 16).min(1 << 22) as usize;
        Self {
            window: window(spec.size),
            msg,
            region,
            virtual_time,
            i: 0,
            vsent_at: None,
            round_trips: (spec.role() == Role::Echo).then(|| RoundTrips::new(spec.warmup, reserve)),
            vsamples: Vec::with_capacity(if virtual_time && spec.role() == Role::Echo {
                reserve
            } else {
                0
            }),
            inflight: 0,
            data_sent: 0,
            end_sent: false,
            deadline: None,
            next_look: 0,
            past_deadline: false,
            key: 0,
            bufs: Vec::new(),
            batch: Vec::new(),
            finished: false,
            outcome,
            done,
            notify,
            spec,
        }
    }

    fn finish<B: Backend + ?Sized>(&mut self, b: &B, r: Result<ClientResult, String>) {
        let _ = b;
        if self.finished {
            return;
        }
        self.finished = true;
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        self.done.store(true, Ordering::Release);
        let _ = self.notify.send(());
    }

    fn next_key(&mut self) -> u64 {
        self.key = self.key.wrapping_add(1);
        self.key
    }

    /// Sends ping `self.i`, then reads the clock for its round trip (see
    /// [`RoundTrips`]).
    fn ping<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        let zero_copy = self.spec.mode == SendMode::ZeroCopy;
        if !zero_copy {
            proto::set_seq(&mut self.msg, self.i);
        }
        let key = self.next_key();
        if self.virtual_time {
            self.vsent_at = Some(b.now());
        }
        if let Err(e) = send_msg(
            b,
            conn,
            self.spec.mode,
            &self.msg,
            self.region.as_ref(),
            key,
        ) {
            self.finish(b, Err(format!("send failed: {e}")));
            return;
        }
        if let Some(rt) = &mut self.round_trips {
            rt.sent(self.i);
        }
    }

    fn more_data(&mut self) -> bool {
        match self.spec.count {
            Some(n) => self.data_sent < self.spec.warmup + n,
            None => match self.deadline {
                None => true,
                Some(_) if self.past_deadline => false,
                // The clock is read once per `LOOK_EVERY` messages sent, so
                // a provider that completes one send at a time does not pay
                // a clock read per message; the run ends at most that many
                // messages past its deadline.
                Some(_) if self.data_sent < self.next_look => true,
                Some(d) => {
                    self.next_look = self.data_sent + LOOK_EVERY;
                    self.past_deadline = Instant::now() >= d;
                    !self.past_deadline
                }
            },
        }
    }

    fn pump<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        while !self.end_sent && !self.finished && self.inflight < self.window {
            let r = if self.more_data() {
                if self.data_sent == self.spec.warmup {
                    if let Some(d) = self.spec.duration {
                        self.deadline = Some(Instant::now() + d);
                    }
                }
                // As many as the window has room for, up to the end of the
                // warm-up or of the count (neither is crossed), at most
                // MAX_BATCH in one call.
                let mut n = (self.window - self.inflight) as u64;
                if let Some(count) = self.spec.count {
                    n = n.min(self.spec.warmup + count - self.data_sent);
                }
                if self.data_sent < self.spec.warmup {
                    n = n.min(self.spec.warmup - self.data_sent);
                }
                let n = n.min(MAX_BATCH) as usize;
                let (sent, r) = self.send_batch(b, conn, n);
                self.data_sent += sent as u64;
                self.inflight += sent;
                r
            } else {
                let key = self.next_key();
                send_control(b, conn, &proto::end(), key).map(|()| {
                    self.end_sent = true;
                    self.inflight += 1;
                })
            };
            match r {
                Ok(()) => {}
                Err(SendError::NoResources) => break,
                Err(e) => {
                    self.finish(b, Err(format!("send failed: {e}")));
                    break;
                }
            }
        }
    }

    /// Sends up to `n` data messages (at least one): one batch call in the
    /// batch modes, one call per message in the others; returns how many
    /// were accepted.
    fn send_batch<B: Backend + ?Sized>(
        &mut self,
        b: &B,
        conn: ConnId,
        n: usize,
    ) -> (usize, Result<(), SendError>) {
        let first = self.key.wrapping_add(1);
        let (sent, r) = match self.spec.mode {
            SendMode::CopyBatch => {
                // Small batches on the stack: a provider that completes one
                // send at a time gets a batch of one per call, and an
                // allocation per call would be this tool's cost.
                const SMALL: usize = 8;
                let mut small = [CopyMessage::new(&self.msg, first); SMALL];
                let large: Vec<CopyMessage<'_>>;
                let msgs: &[CopyMessage<'_>] = if n <= SMALL {
                    for (i, m) in small.iter_mut().enumerate().take(n) {
                        m.key = first.wrapping_add(i as u64);
                    }
                    &small[..n]
                } else {
                    large = (0..n as u64)
                        .map(|i| CopyMessage::new(&self.msg, first.wrapping_add(i)))
                        .collect();
                    &large
                };
                match b.send_copy_batch(conn, msgs) {
                    Ok(()) => (n, Ok(())),
                    Err(e) => (e.sent, Err(e.error)),
                }
            }
            SendMode::BufferedBatch => match b.get_buffers(conn, n, &mut self.bufs) {
                Err(e) => (0, Err(SendError::Failed(e.into()))),
                Ok(0) => (0, Err(SendError::NoResources)),
                Ok(_) => {
                    let mut key = first;
                    for mut buf in self.bufs.drain(..) {
                        if let Err(e) = buf.write(&self.msg) {
                            return (0, Err(SendError::Failed(e.into())));
                        }
                        self.batch.push((buf, key));
                        key = key.wrapping_add(1);
                    }
                    let k = self.batch.len();
                    let r = b.send_buffer_batch(conn, &mut self.batch);
                    // What a refusal left behind goes back to the pool.
                    self.batch.clear();
                    match r {
                        Ok(()) => (k, Ok(())),
                        Err(e) => (e.sent, Err(e.error)),
                    }
                }
            },
            SendMode::Copy => {
                // The loop a user would write: one call per message, the
                // backend called straight, nothing else per message.
                let data = [&self.msg[..]];
                let mut sent = 0;
                let mut r = Ok(());
                while sent < n {
                    if let Err(e) =
                        b.send_data_copy(conn, &data, &[], first.wrapping_add(sent as u64))
                    {
                        r = Err(e);
                        break;
                    }
                    sent += 1;
                }
                (sent, r)
            }
            mode => {
                let mut key = first;
                let mut sent = 0;
                let mut r = Ok(());
                while sent < n {
                    r = send_msg(b, conn, mode, &self.msg, self.region.as_ref(), key);
                    if r.is_err() {
                        break;
                    }
                    sent += 1;
                    key = key.wrapping_add(1);
                }
                (sent, r)
            }
        };
        self.key = self.key.wrapping_add(sent as u64);
        (sent, r)
    }
}

impl<B: Backend + ?Sized> Handler<B> for Client {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        let setup = proto::setup(self.spec.role(), self.spec.mode, self.spec.warmup);
        let key = self.next_key();
        if let Err(e) = send_control(b, conn, &setup, key) {
            self.finish(b, Err(format!("cannot send the set-up message: {e}")));
            return;
        }
        self.inflight += 1;
        match self.spec.role() {
            Role::Echo => self.ping(b, conn),
            Role::Sink => self.pump(b, conn),
        }
    }

    fn on_connection_refused(
        &mut self,
        b: &B,
        _: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        self.finish(b, Err(format!("connecting to {remote} failed: {reason}")));
    }

    fn on_connection_closed(
        &mut self,
        b: &B,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        self.finish(b, Err(format!("connection closed before the end: {why}")));
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        if self.finished {
            return;
        }
        match self.spec.role() {
            Role::Echo => {
                let check_seq = self.spec.mode != SendMode::ZeroCopy;
                if !proto::echo_matches(data, self.spec.size, self.i, check_seq) {
                    self.finish(
                        b,
                        Err(format!("echo {} does not match what was sent", self.i)),
                    );
                    return;
                }
                if self.i >= self.spec.warmup {
                    if let Some(v0) = self.vsent_at {
                        self.vsamples.push((b.now() - v0).as_nanos() as u64);
                    }
                }
                self.i += 1;
                let measured = self.i.saturating_sub(self.spec.warmup);
                let Some(rt) = &self.round_trips else {
                    return;
                };
                let fin = match (self.spec.count, self.spec.duration) {
                    (Some(n), _) => measured >= n,
                    (None, Some(d)) => measured > 0 && rt.measured() >= d,
                    (None, None) => true,
                };
                if fin {
                    let (s, elapsed) = self.round_trips.take().expect("echo role").finish();
                    let v = std::mem::take(&mut self.vsamples);
                    self.finish(b, Ok(ClientResult::PingPong(s, v, elapsed)));
                } else {
                    self.ping(b, conn);
                }
            }
            Role::Sink => match Report::decode(data) {
                Some(r) => self.finish(b, Ok(ClientResult::Sink(r))),
                None => self.finish(b, Err("unexpected message from the server".into())),
            },
        }
    }

    fn on_sends_completed(&mut self, b: &B, conn: ConnId, keys: &[u64]) {
        self.inflight = self.inflight.saturating_sub(keys.len());
        if self.spec.role() == Role::Sink && !self.finished {
            self.pump(b, conn);
        }
    }
}

/// Client connection parameters for `spec`.
fn client_params(spec: &Spec, region: Option<&MemoryRegion>) -> ConnectionParams {
    let mut p = ConnectionParams::receive(
        recv_size(spec.size),
        spec.recv_buffers.unwrap_or(ECHO_RECV_BUFFERS),
    );
    match spec.mode {
        SendMode::Buffered | SendMode::BufferedBatch => {
            let n = if spec.role() == Role::Echo {
                4
            } else {
                window(spec.size)
            };
            p = p.with_buffered(recv_size(spec.size), n);
        }
        SendMode::ZeroCopy => {
            if let Some(r) = region {
                p = p.with_zero_copy(r.clone());
            }
        }
        _ => {}
    }
    p
}

fn figures(spec: &Spec, r: ClientResult, sim: bool) -> Result<Figures, RunError> {
    match r {
        ClientResult::PingPong(mut s, mut v, elapsed) => {
            let f = metrics::pingpong(&mut s, &mut v, elapsed);
            if f.is_empty() {
                Err(RunError::Failed("no round trip measured".into()))
            } else {
                Ok(f)
            }
        }
        ClientResult::Sink(rep) => {
            metrics::one_way(spec.test == TestKind::Bw, &rep, sim).map_err(RunError::Failed)
        }
    }
}

fn take(outcome: &Outcome) -> Option<Result<ClientResult, String>> {
    outcome.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// A running event loop thread; stopped and joined on drop.
struct LoopThread {
    lp: MioLoop,
    thread: Option<thread::JoinHandle<()>>,
}

impl LoopThread {
    fn start(lp: MioLoop, name: &str) -> Result<Self, RunError> {
        let runner = lp.clone();
        let thread = thread::Builder::new()
            .name(name.into())
            .spawn(move || runner.run(|| {}))
            .map_err(|e| failed("cannot start a loop thread", e))?;
        Ok(Self {
            lp,
            thread: Some(thread),
        })
    }
}

impl LoopThread {
    /// Runs `f` on the loop thread and returns its result: how a
    /// thread-unsafe backend is called from outside its loop.
    fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, RunError> {
        let (tx, rx) = mpsc::channel();
        self.lp.post(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|e| failed("the loop thread did not answer", e))
    }
}

impl Drop for LoopThread {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A backend of `provider` on the real loop `lp`; with `socket_buffers`
/// (tcp provider only), its sockets get that `SO_SNDBUF` and `SO_RCVBUF`,
/// as the plain baseline's do.
fn create_socket_backend<H>(
    provider: &str,
    lp: &MioLoop,
    config: BackendConfig,
    socket_buffers: Option<usize>,
    handler: H,
) -> Result<Box<dyn Backend>, netio::CreateError>
where
    H: Handler<dyn Backend> + Handler<netio::tcp::TcpBackend> + 'static,
{
    match socket_buffers {
        Some(n) if provider == "tcp" => {
            let tcp = netio::tcp::TcpConfig {
                send_buffer_size: Some(n),
                recv_buffer_size: Some(n),
                ..netio::tcp::TcpConfig::default()
            };
            Ok(Box::new(netio::tcp::TcpBackend::with_tcp_config(
                lp, config, tcp, handler,
            )?))
        }
        _ => netio::create_backend(provider, &AnyLoop::Mio(lp.clone()), config, handler),
    }
}

/// A new real event loop.
pub fn new_loop(busy_poll: bool) -> Result<MioLoop, RunError> {
    MioLoop::with_config(LoopConfig {
        busy_poll,
        ..LoopConfig::default()
    })
    .map_err(|e| failed("cannot create an event loop", e))
}

/// The in-process server of a socket provider's run: its loop thread, its
/// backend and the address it listens at.
type LocalServer = (LoopThread, Arc<Box<dyn Backend>>);

/// Starts the server of a run of `spec` on its own loop and thread.
fn start_server(
    provider: &str,
    spec: &Spec,
    region: Option<&MemoryRegion>,
) -> Result<(LocalServer, EndpointAddress), RunError> {
    let lp = new_loop(spec.busy_poll)?;
    let backend = Arc::new(
        create_socket_backend(
            provider,
            &lp,
            backend_config(spec),
            spec.socket_buffers,
            Server::new(region.cloned(), false),
        )
        .map_err(|e| failed("cannot create the server backend", e))?,
    );
    check_mode(provider, backend.features(), spec.mode)?;
    let params = run_server_params(spec, region, backend.features());
    // Calls are made on the loop thread, as thread-unsafe mode requires.
    let t = LoopThread::start(lp, "perf-server")?;
    let b = backend.clone();
    let addr = t
        .call(move || b.open_listen_endpoint(EndpointAddress::localhost(0), params))?
        .map_err(|e| failed("cannot listen", e))?;
    Ok(((t, backend), addr))
}

/// One run over a socket provider: server (unless `connect` names a remote
/// one) and client on two loops, each on its own thread.
pub fn run_socket(
    provider: &str,
    spec: &Spec,
    connect: Option<EndpointAddress>,
) -> Result<Figures, RunError> {
    let region = (spec.mode == SendMode::ZeroCopy).then(|| data_region(spec.size));
    // Server first, on its own loop and thread.
    let (server, addr) = match connect {
        Some(a) => (None, a),
        None => {
            let (server, addr) = start_server(provider, spec, region.as_ref())?;
            (Some(server), addr)
        }
    };
    if spec.mode == SendMode::Async {
        let r = run_async_client(provider, spec, addr);
        drop(server);
        return r;
    }
    let lp = new_loop(spec.busy_poll)?;
    let outcome: Outcome = Arc::default();
    let (tx, rx) = mpsc::channel();
    let client = Arc::new(
        create_socket_backend(
            provider,
            &lp,
            client_config(spec),
            spec.socket_buffers,
            Client::new(
                spec.clone(),
                region.clone(),
                false,
                outcome.clone(),
                Arc::default(),
                tx,
            ),
        )
        .map_err(|e| failed("cannot create the client backend", e))?,
    );
    check_mode(provider, client.features(), spec.mode)?;
    let client_thread = LoopThread::start(lp, "perf-client")?;
    let (b, params) = (client.clone(), client_params(spec, region.as_ref()));
    let conn = client_thread
        .call(move || b.open_active_endpoint(addr, params))?
        .map_err(|e| failed("cannot connect", e))?;
    let got = rx.recv_timeout(spec.timeout);
    let b = client.clone();
    let _ = client_thread.call(move || b.close_active_endpoint(conn));
    drop(client_thread);
    drop(client);
    drop(server);
    match (got, take(&outcome)) {
        (Ok(()), Some(Ok(r))) => figures(spec, r, false),
        (Ok(()), Some(Err(e))) => Err(RunError::Failed(e)),
        _ => Err(timed_out(spec)),
    }
}

/// The async client of a run, spawned on the backend `make` creates,
/// which must support the run's mode.
fn async_client<B, E: std::fmt::Display>(
    provider: &str,
    make: impl FnOnce(BackendConfig, netio::aio::AsyncHandler) -> Result<B, E>,
    spec: &Spec,
    addr: EndpointAddress,
    params: ConnectionParams,
    virtual_time: bool,
    done: mpsc::Sender<Result<ClientResult, String>>,
) -> Result<(Arc<netio::aio::AsyncBackend<B>>, netio::aio::Task<()>), RunError>
where
    B: Backend + Clone + 'static,
{
    let (ab, task) = crate::aio::spawn_client(
        make,
        client_config(spec),
        spec,
        addr,
        params,
        virtual_time,
        done,
    )
    .map_err(|e| failed("cannot create the client backend", e))?;
    check_mode(provider, ab.backend().features(), spec.mode)?;
    Ok((ab, task))
}

fn timed_out(spec: &Spec) -> RunError {
    RunError::Failed(format!(
        "no result within the time limit of {:?} (--timeout)",
        spec.timeout
    ))
}

/// The client of an async run over a socket provider, as a task on its own
/// loop thread, against the server at `addr`.
fn run_async_client(
    provider: &str,
    spec: &Spec,
    addr: EndpointAddress,
) -> Result<Figures, RunError> {
    let lp = new_loop(spec.busy_poll)?;
    let params = client_params(spec, None);
    let (tx, rx) = mpsc::channel();
    let socket_buffers = spec.socket_buffers;
    // The backend's concrete type: the async API needs one it can clone.
    let client: Box<dyn std::any::Any> = match provider {
        "tcp" => {
            let make = |config, h| {
                let tcp = netio::tcp::TcpConfig {
                    send_buffer_size: socket_buffers,
                    recv_buffer_size: socket_buffers,
                    ..netio::tcp::TcpConfig::default()
                };
                netio::tcp::TcpBackend::with_tcp_config(&lp, config, tcp, h)
            };
            Box::new(async_client(provider, make, spec, addr, params, false, tx)?)
        }
        #[cfg(feature = "libfabric")]
        "libfabric" => {
            let make = |config, h| {
                <netio::libfabric::LibfabricProvider as netio::Provider>::create(&lp, config, h)
            };
            Box::new(async_client(provider, make, spec, addr, params, false, tx)?)
        }
        other => {
            return Err(RunError::Unsupported(format!(
                "provider `{other}` has no async client in netio-perf"
            )))
        }
    };
    let client_thread = LoopThread::start(lp, "perf-client")?;
    let got = rx.recv_timeout(spec.timeout);
    // The task (if still running) is dropped on the loop thread, then the
    // loop stops.
    drop(client);
    drop(client_thread);
    match got {
        Ok(Ok(r)) => figures(spec, r, false),
        Ok(Err(e)) => Err(RunError::Failed(e)),
        Err(_) => Err(timed_out(spec)),
    }
}

/// One run on the simulator: two virtual hosts of a new world, driven on
/// this thread until the client is done.
pub fn run_sim(spec: &Spec) -> Result<Figures, RunError> {
    let sim = Sim::with_seed(1);
    sim.set_driver_only(!spec.sim_shared);
    let (hs, hc) = (sim.next_host(), sim.next_host());
    let region = (spec.mode == SendMode::ZeroCopy).then(|| data_region(spec.size));
    (|| {
        let server = netio::create_backend(
            "sim",
            &AnyLoop::Sim(hs.event_loop().clone()),
            backend_config(spec),
            Server::new(region.clone(), true),
        )
        .map_err(|e| failed("cannot create the server backend", e))?;
        check_mode("sim", server.features(), spec.mode)?;
        let params = run_server_params(spec, region.as_ref(), server.features());
        let addr = server
            .open_listen_endpoint(EndpointAddress::new(hs.ip(), 0), params)
            .map_err(|e| failed("cannot listen", e))?;
        if spec.mode == SendMode::Async {
            return run_sim_async(&sim, &hc, spec, addr);
        }
        let outcome: Outcome = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let (tx, _rx) = mpsc::channel();
        let client = netio::create_backend(
            "sim",
            &AnyLoop::Sim(hc.event_loop().clone()),
            client_config(spec),
            Client::new(
                spec.clone(),
                region.clone(),
                true,
                outcome.clone(),
                done.clone(),
                tx,
            ),
        )
        .map_err(|e| failed("cannot create the client backend", e))?;
        client
            .open_active_endpoint(addr, client_params(spec, region.as_ref()))
            .map_err(|e| failed("cannot connect", e))?;
        drive(&sim, spec, || done.load(Ordering::Acquire))?;
        match take(&outcome) {
            Some(Ok(r)) => figures(spec, r, true),
            Some(Err(e)) => Err(RunError::Failed(e)),
            None => Err(RunError::Failed("the client reported nothing".into())),
        }
    })()
}

/// Steps the simulation of a run of `spec` until `done`.
fn drive(sim: &Sim, spec: &Spec, done: impl Fn() -> bool) -> Result<(), RunError> {
    // Steps in runs of `STEPS` (one driving call each, so the simulator's
    // driver is set up once per run, not per step): the client's own clock
    // marks the measured time, so steps past its end count for nothing.
    const STEPS: usize = 256;
    let started = Instant::now();
    while !done() {
        if sim.run_until_idle(STEPS) == 0 {
            return Err(RunError::Failed(
                "the simulation stalled (nothing scheduled) before the client was done".into(),
            ));
        }
        if started.elapsed() > spec.timeout {
            return Err(timed_out(spec));
        }
    }
    Ok(())
}

/// The client of an async run on the simulator: a task of host `hc`'s
/// backend, run inside the simulation.
fn run_sim_async(
    sim: &Sim,
    hc: &netio::sim::SimHost,
    spec: &Spec,
    addr: EndpointAddress,
) -> Result<Figures, RunError> {
    let (tx, rx) = mpsc::channel();
    let make = |config, h| {
        <netio::sim::SimProvider as netio::Provider>::create(hc.event_loop(), config, h)
    };
    let (ab, task) = async_client("sim", make, spec, addr, client_params(spec, None), true, tx)?;
    let got = std::cell::RefCell::new(None);
    drive(sim, spec, || {
        if got.borrow().is_none() {
            *got.borrow_mut() = rx.try_recv().ok();
        }
        got.borrow().is_some()
    })?;
    drop(task);
    drop(ab);
    match got.into_inner() {
        Some(Ok(r)) => figures(spec, r, true),
        Some(Err(e)) => Err(RunError::Failed(e)),
        None => Err(RunError::Failed("the client reported nothing".into())),
    }
}

/// How [`serve`] serves.
pub struct ServeOptions {
    /// The largest message.
    pub max_size: usize,
    /// Receive buffers per connection; `None`: [`recv_buffers`] of
    /// `max_size`.
    pub recv_buffers: Option<usize>,
    /// A busy-polling loop.
    pub busy_poll: bool,
    /// `SO_SNDBUF` and `SO_RCVBUF` (tcp provider).
    pub socket_buffers: Option<usize>,
    /// The backend in thread-unsafe mode (every call on the loop thread).
    pub thread_unsafe: bool,
}

/// Serves every test on `address` with a socket provider until `limit`
/// passes (forever with `None`): echo or sink per connection, echoes in
/// any send mode, as `o` says.
pub fn serve(
    provider: &str,
    address: EndpointAddress,
    o: &ServeOptions,
    limit: Option<Duration>,
    on_listening: impl FnOnce(EndpointAddress),
) -> Result<(), RunError> {
    let ServeOptions {
        max_size,
        recv_buffers: recv_bufs,
        busy_poll,
        socket_buffers,
        thread_unsafe,
    } = *o;
    let lp = new_loop(busy_poll)?;
    let region = data_region(max_size);
    let config = BackendConfig {
        thread_safety: if thread_unsafe {
            ThreadSafety::Unsafe
        } else {
            ThreadSafety::Safe
        },
        ..BackendConfig::default()
    };
    let backend = Arc::new(
        create_socket_backend(
            provider,
            &lp,
            config,
            socket_buffers,
            Server::new(Some(region.clone()), false),
        )
        .map_err(|e| failed("cannot create the server backend", e))?,
    );
    let params = server_params(
        max_size,
        recv_bufs.unwrap_or_else(|| recv_buffers(max_size)),
        &[SendMode::Buffered, SendMode::ZeroCopy, SendMode::Copy],
        Some(&region),
        backend.features(),
    );
    // Calls are made on the loop thread, as thread-unsafe mode requires.
    let t = LoopThread::start(lp, "perf-server")?;
    let b = backend.clone();
    let bound = t
        .call(move || b.open_listen_endpoint(address, params))?
        .map_err(|e| failed("cannot listen", e))?;
    on_listening(bound);
    match limit {
        Some(d) => thread::sleep(d),
        None => loop {
            thread::sleep(Duration::from_secs(3600));
        },
    }
    drop(t);
    drop(backend);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_conn_finds_a_connection_by_its_handle_and_never_by_a_stale_one() {
        let mut m = ByConn::default();
        let (a, b) = (ConnId::new(3, 0), ConnId::new(0, 0));
        m.insert(a, "a");
        m.insert(b, "b");
        assert_eq!(m.get_mut(a), Some(&mut "a"));
        assert_eq!(m.get_mut(b), Some(&mut "b"));
        assert_eq!(m.get_mut(ConnId::new(1, 0)), None);
        assert_eq!(m.remove(a), Some("a"));
        // The slot serves a new connection: the old handle finds nothing.
        let a2 = ConnId::new(3, 1);
        m.insert(a2, "a2");
        assert_eq!(m.get_mut(a), None);
        assert_eq!(m.remove(a), None);
        assert_eq!(m.get_mut(a2), Some(&mut "a2"));
        assert_eq!(m.get_mut(ConnId::new(100, 0)), None);
    }
}
