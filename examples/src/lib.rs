//! Application logic shared by the example programs, written once against
//! the `netio-core` traits so it runs on every provider.
//!
//! - [`EchoServer`] echoes every message back, and pauses receiving from a
//!   connection whose peer does not read its echoes until they can be sent
//!   (receive-side flow control: nothing dropped, memory bounded);
//!   [`EchoClient`] sends numbered messages one at a time and checks each
//!   echo; [`PingClient`] does the same with messages of a chosen size and
//!   records each round trip's latency ([`LatencySummary`]) on the
//!   backend's clock.
//! - Connections are named by their handle ([`ConnId`]); per-connection
//!   state is keyed by it.
//! - These handlers are generic over the backend: the `echo` program and
//!   `tests/echo_under_faults.rs` run them on the simulator, [`tcp`] runs
//!   them over TCP (the `echo_tcp` and `pingpong` programs, with the
//!   command line of [`cli`]).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use netio_core::{
    Backend, Capabilities, CloseReason, ConnId, EndpointAddress, Handler, RefuseReason, SendError,
};

pub mod cli;
pub mod tcp;

/// Locks `m`, also after a panic on another thread poisoned it (the reports
/// stay readable).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sends `data` on `conn` by copy when the connection can, otherwise
/// through a pool buffer (`NoResources` when none is free).
pub fn send<B: Backend + ?Sized>(
    b: &B,
    conn: ConnId,
    data: &[u8],
    key: u64,
) -> Result<(), SendError> {
    match b.send_data_copy(conn, &[data], &[], key) {
        Err(SendError::NotSupported(_)) => {}
        other => return other,
    }
    let Some(mut buf) = b
        .get_buffer(conn)
        .map_err(|e| SendError::Failed(e.into()))?
    else {
        return Err(SendError::NoResources);
    };
    buf.write(data).map_err(|e| SendError::Failed(e.into()))?;
    b.send_buffer(conn, buf, key)
}

/// What an [`EchoServer`] did, shared with the program that runs it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections established.
    pub connections: u64,
    /// Connections closed since.
    pub closed: u64,
    /// Messages echoed (handed to the backend).
    pub echoed: u64,
    /// Messages that could not be echoed (the send failed for another
    /// reason than a lack of resources, or the connection closed while the
    /// echo was held).
    pub failed: u64,
    /// Times a connection was paused because its echo could not be sent
    /// yet (see [`EchoServer`]).
    pub paused: u64,
    /// Echoes held, unsent, right now (one per paused connection: a paused
    /// connection delivers no more messages).
    pub held: u64,
    /// The largest number of echoes held at once.
    pub max_held: u64,
}

type ClosedCallback = Box<dyn FnMut(&ServerStats) + Send>;

/// Echoes every message back to its sender.
///
/// Flow control: when an echo cannot be sent now (`NoResources`: the send
/// queue or the buffer pool of the connection is full because the peer does
/// not read), the server keeps that echo, pauses receiving from the
/// connection ([`Backend::pause_receive`]) and, once sends of the
/// connection complete, sends the kept echo and resumes receiving
/// ([`Backend::resume_receive`]). No echo is dropped, and the server holds
/// at most one unsent echo per connection however fast the peer sends.
///
/// `EchoServer::default()` keeps its count in [`echoed`](Self::echoed);
/// [`EchoServer::with_stats`] also shares [`ServerStats`] and reports each
/// closed connection, so a program can tell when its clients are done.
#[derive(Default)]
pub struct EchoServer {
    /// Messages echoed so far.
    pub echoed: u64,
    /// The echoes held back on each paused connection, in order.
    held: HashMap<ConnId, VecDeque<Vec<u8>>>,
    stats: Arc<Mutex<ServerStats>>,
    on_closed: Option<ClosedCallback>,
}

impl EchoServer {
    /// A server that counts into `stats` and calls `on_closed` with them
    /// after each connection closes.
    pub fn with_stats(
        stats: Arc<Mutex<ServerStats>>,
        on_closed: impl FnMut(&ServerStats) + Send + 'static,
    ) -> Self {
        Self {
            stats,
            on_closed: Some(Box::new(on_closed)),
            ..Self::default()
        }
    }

    /// Sends the echo of `data` on `conn`; `false` when it cannot be sent
    /// now (`NoResources`) and must be kept for later.
    fn echo<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId, data: &[u8]) -> bool {
        match send(b, conn, data, self.echoed) {
            Ok(()) => {
                self.echoed += 1;
                lock(&self.stats).echoed += 1;
                true
            }
            Err(SendError::NoResources) => false,
            Err(e) => {
                lock(&self.stats).failed += 1;
                eprintln!("echo server: cannot echo on {conn}: {e}");
                true
            }
        }
    }

    /// Sends what `conn` holds, in order; resumes receiving once it is all
    /// sent.
    fn flush<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        let Some(mut queue) = self.held.remove(&conn) else {
            return;
        };
        while let Some(data) = queue.front() {
            if !self.echo(b, conn, data) {
                break;
            }
            queue.pop_front();
        }
        if queue.is_empty() {
            if let Err(e) = b.resume_receive(conn) {
                eprintln!("echo server: cannot resume {conn}: {e}");
            }
        } else {
            self.held.insert(conn, queue);
        }
        self.count_held();
    }

    fn count_held(&self) {
        let held = self.held.values().map(|q| q.len() as u64).sum();
        let mut s = lock(&self.stats);
        s.held = held;
        s.max_held = s.max_held.max(held);
    }
}

impl fmt::Debug for EchoServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EchoServer")
            .field("echoed", &self.echoed)
            .field("paused_connections", &self.held.len())
            .field("stats", &*lock(&self.stats))
            .finish_non_exhaustive()
    }
}

impl<B: Backend + ?Sized> Handler<B> for EchoServer {
    fn on_connection_established(&mut self, _: &B, _: ConnId, _: EndpointAddress, _: Capabilities) {
        lock(&self.stats).connections += 1;
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        if !self.held.is_empty() {
            if let Some(queue) = self.held.get_mut(&conn) {
                // A paused connection gets no data; should some come anyway,
                // its echo goes after the held ones.
                queue.push_back(data.to_vec());
                self.count_held();
                return;
            }
        }
        if !self.echo(b, conn, data) {
            if let Err(e) = b.pause_receive(conn) {
                eprintln!("echo server: cannot pause {conn}: {e}");
            }
            self.held.insert(conn, VecDeque::from([data.to_vec()]));
            lock(&self.stats).paused += 1;
            self.count_held();
        }
    }

    fn on_sends_completed(&mut self, b: &B, conn: ConnId, _: &[u64]) {
        if self.held.is_empty() {
            return;
        }
        self.flush(b, conn);
        // With a send pool shared by several connections, a completion on
        // one frees a buffer for the others: let them try too.
        let others: Vec<ConnId> = self.held.keys().copied().filter(|&c| c != conn).collect();
        for c in others {
            self.flush(b, c);
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &B,
        conn: ConnId,
        remote: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        if !matches!(
            why,
            CloseReason::PeerClosed | CloseReason::Local | CloseReason::ListenerClosed
        ) {
            eprintln!("echo server: connection {conn} from {remote} closed: {why}");
        }
        let dropped = self.held.remove(&conn).map_or(0, |q| q.len() as u64);
        self.count_held();
        let stats = {
            let mut s = lock(&self.stats);
            s.closed += 1;
            s.failed += dropped;
            s.clone()
        };
        if let Some(f) = self.on_closed.as_mut() {
            f(&stats);
        }
    }
}

/// What the echo client saw, shared with the program that runs it.
#[derive(Debug, Default, Clone)]
pub struct EchoReport {
    /// Messages sent.
    pub sent: u64,
    /// Echoes received that matched what was sent, in order.
    pub matched: u64,
    /// Echoes that did not match.
    pub mismatched: u64,
    /// Why the connection closed, once it did.
    pub closed: Option<String>,
    /// Why connecting failed, if it did.
    pub refused: Option<String>,
}

/// Sends `count` numbered messages, one at a time, checks each echo, then
/// closes the connection and calls `done`.
pub struct EchoClient {
    count: u64,
    report: Arc<Mutex<EchoReport>>,
    done: Box<dyn FnMut() + Send>,
}

impl EchoClient {
    /// A client that sends `count` messages and calls `done` at the end.
    pub fn new(
        count: u64,
        report: Arc<Mutex<EchoReport>>,
        done: impl FnMut() + Send + 'static,
    ) -> Self {
        Self {
            count,
            report,
            done: Box::new(done),
        }
    }

    fn message(i: u64) -> Vec<u8> {
        format!("message {i}").into_bytes()
    }

    fn next<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        let mut r = self.report.lock().unwrap();
        if r.sent == self.count {
            drop(r);
            if let Err(e) = b.close_active_endpoint(conn) {
                eprintln!("echo client: close failed: {e}");
            }
            return;
        }
        match send(b, conn, &Self::message(r.sent), r.sent) {
            Ok(()) => r.sent += 1,
            Err(e) => {
                eprintln!("echo client: send failed: {e}");
                let _ = b.close_active_endpoint(conn);
            }
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for EchoClient {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.next(b, conn);
    }

    fn on_connection_refused(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        reason: &RefuseReason,
    ) {
        self.report.lock().unwrap().refused = Some(reason.to_string());
        (self.done)();
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        {
            let mut r = self.report.lock().unwrap();
            let expected = Self::message(r.matched + r.mismatched);
            if data == expected.as_slice() {
                r.matched += 1;
            } else {
                r.mismatched += 1;
            }
        }
        self.next(b, conn);
    }

    fn on_connection_closed(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        self.report.lock().unwrap().closed = Some(why.to_string());
        (self.done)();
    }
}

/// What a [`PingClient`] measured, shared with the program that runs it.
#[derive(Debug, Default, Clone)]
pub struct PingReport {
    /// Messages sent.
    pub sent: u64,
    /// Echoes received that matched what was sent.
    pub matched: u64,
    /// Echoes that did not match.
    pub mismatched: u64,
    /// Round-trip time of every echo received, in order: from just before
    /// the send call to the start of `on_data` for its echo, on the
    /// backend's clock ([`Backend::now`]: virtual time on the simulator).
    pub round_trips: Vec<Duration>,
    /// From just before the first send to the last echo received, on the
    /// same clock.
    pub elapsed: Duration,
    /// Why the connection closed, once it did.
    pub closed: Option<String>,
    /// Why connecting failed, if it did.
    pub refused: Option<String>,
}

impl PingReport {
    /// Round trips per second over [`elapsed`](Self::elapsed) (`None`
    /// before any echo arrived).
    pub fn round_trips_per_sec(&self) -> Option<f64> {
        let secs = self.elapsed.as_secs_f64();
        (secs > 0.0 && !self.round_trips.is_empty()).then(|| self.round_trips.len() as f64 / secs)
    }

    /// Latency statistics of the round trips.
    pub fn latency(&self) -> Option<LatencySummary> {
        LatencySummary::from_samples(&self.round_trips)
    }
}

/// Minimum, median, 99th percentile and maximum of a set of durations.
/// Percentiles are nearest-rank: the smallest sample with at least that
/// share of samples at or below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencySummary {
    /// Number of samples.
    pub samples: usize,
    /// Smallest sample.
    pub min: Duration,
    /// 50th percentile.
    pub median: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Largest sample.
    pub max: Duration,
}

impl LatencySummary {
    /// The summary of `samples`, or `None` if there are none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use netio_examples::LatencySummary;
    /// let us: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
    /// let s = LatencySummary::from_samples(&us).unwrap();
    /// assert_eq!(s.min, Duration::from_micros(1));
    /// assert_eq!(s.median, Duration::from_micros(50));
    /// assert_eq!(s.p99, Duration::from_micros(99));
    /// assert_eq!(s.max, Duration::from_micros(100));
    /// ```
    pub fn from_samples(samples: &[Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut sorted = samples.to_vec();
        sorted.sort_unstable();
        let n = sorted.len();
        let rank = |pct: usize| sorted[(n * pct).div_ceil(100).clamp(1, n) - 1];
        Some(Self {
            samples: n,
            min: sorted[0],
            median: rank(50),
            p99: rank(99),
            max: sorted[n - 1],
        })
    }
}

impl fmt::Display for LatencySummary {
    /// `min 12.3 µs, median …, p99 …, max …`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        write!(
            f,
            "min {:.1} µs, median {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            us(self.min),
            us(self.median),
            us(self.p99),
            us(self.max)
        )
    }
}

/// Fills `buf` with message `i` of `size` bytes: the number `i`
/// (little-endian, as much of it as fits) followed by a pattern that
/// depends on `i`, so a misplaced or corrupted echo does not match.
pub fn ping_message(buf: &mut Vec<u8>, i: u64, size: usize) {
    buf.clear();
    let seed = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    buf.extend((0..size).map(|j| (seed >> ((j % 8) * 8)) as u8 ^ j as u8));
    let n = size.min(8);
    buf[..n].copy_from_slice(&i.to_le_bytes()[..n]);
}

/// Ping-pong: sends `count` messages of `size` bytes one at a time, each
/// after the echo of the previous one, times every round trip, checks every
/// echo, then closes the connection and calls `done`. Run it against an
/// [`EchoServer`].
pub struct PingClient {
    count: u64,
    size: usize,
    report: Arc<Mutex<PingReport>>,
    done: Box<dyn FnMut() + Send>,
    message: Vec<u8>,
    started: Option<Duration>,
    sent_at: Option<Duration>,
}

impl PingClient {
    /// A client that sends `count` messages of `size` bytes and calls
    /// `done` at the end.
    pub fn new(
        count: u64,
        size: usize,
        report: Arc<Mutex<PingReport>>,
        done: impl FnMut() + Send + 'static,
    ) -> Self {
        // Reserve up front (bounded) so recording a sample does not
        // reallocate while measuring.
        lock(&report)
            .round_trips
            .reserve(count.min(1 << 20) as usize);
        Self {
            count,
            size,
            report,
            done: Box::new(done),
            message: Vec::with_capacity(size),
            started: None,
            sent_at: None,
        }
    }

    fn next<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        let i = lock(&self.report).sent;
        if i == self.count {
            if let Err(e) = b.close_active_endpoint(conn) {
                eprintln!("ping client: close failed: {e}");
            }
            return;
        }
        ping_message(&mut self.message, i, self.size);
        let now = b.now();
        self.started.get_or_insert(now);
        self.sent_at = Some(now);
        match send(b, conn, &self.message, i) {
            Ok(()) => lock(&self.report).sent += 1,
            Err(e) => {
                eprintln!("ping client: send failed: {e}");
                self.sent_at = None;
                let _ = b.close_active_endpoint(conn);
            }
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for PingClient {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.next(b, conn);
    }

    fn on_connection_refused(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        reason: &RefuseReason,
    ) {
        lock(&self.report).refused = Some(reason.to_string());
        (self.done)();
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        let now = b.now();
        {
            let mut r = lock(&self.report);
            if let Some(t) = self.sent_at.take() {
                r.round_trips.push(now - t);
            }
            if let Some(t) = self.started {
                r.elapsed = now - t;
            }
            if data == self.message.as_slice() {
                r.matched += 1;
            } else {
                r.mismatched += 1;
            }
        }
        self.next(b, conn);
    }

    fn on_connection_closed(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        lock(&self.report).closed = Some(why.to_string());
        (self.done)();
    }
}

/// The provider named by `--provider`, running `$run` with it as the type
/// parameter `P` (a [`Provider`](netio_core::Provider) on `MioLoop`).
#[macro_export]
macro_rules! with_provider {
    ($opts:expr, |$p:ident| $run:expr) => {{
        let o: &$crate::cli::Options = &$opts;
        match o.provider.as_str() {
            "tcp" => {
                type $p = netio_tcp::TcpProvider;
                $run
            }
            #[cfg(feature = "libfabric")]
            "libfabric" => {
                if let Some(f) = &o.fabric {
                    // Read by LibfabricConfig::from_env when the backends
                    // are created, on this thread, before any other starts.
                    std::env::set_var("NETIO_LIBFABRIC_PROVIDER", f);
                }
                type $p = netio_libfabric::LibfabricProvider;
                $run
            }
            #[cfg(not(feature = "libfabric"))]
            "libfabric" => {
                return Err("this program was built without the `libfabric` feature \
                     (cargo build -p netio-examples --features libfabric)"
                    .into())
            }
            other => return Err(format!("unknown provider `{other}` (tcp, libfabric)").into()),
        }
    }};
}
