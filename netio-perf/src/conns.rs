//! The `conns` test: many idle connections, their set-up time and the
//! resident memory (VmRSS of `/proc/self/status`) each one costs.
//!
//! The measured side runs in a fresh child process (this program with a
//! hidden option), so memory freed by earlier tests cannot hide what the
//! connections take; the other side runs in this process. Connections are
//! opened in two halves and memory read after each, so a cost that grows
//! with the count shows as a difference between the halves.
//!
//! - Accepting side: one backend, one listener (`ConnectionParams` per
//!   connection, or the listener's shared receive pool); the connecting
//!   side is one backend opening every connection.
//! - Connecting side: one backend opening every connection (per-connection
//!   receive buffers, or `BackendConfig::shared_receive_pool`), all to one
//!   listener of one backend here: connections are named by their handle
//!   ([`ConnId`]), so many to one address are distinct.
//!
//! On the simulator both sides live in the child (one world), so the
//! figures cover both ends of each connection.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use netio::{
    AnyLoop, Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler, PoolParams,
};

use crate::cli::TestKind;
use crate::metrics::{self, Figures};
use crate::provider::{new_loop, RunError};
use crate::report::{Row, Status};

/// Receive buffer size of each connection, and of each shared-pool buffer.
pub const BUF_SIZE: usize = 64 * 1024;
/// Receive buffers per connection with per-connection pools.
pub const PER_CONN_BUFS: usize = 4;
/// Buffers of a shared receive pool (all connections together).
pub const SHARED_BUFS: usize = 16;
/// How long connections sit idle before memory is read.
const SETTLE: Duration = Duration::from_millis(100);

/// Open descriptors of this process (`/proc/self/fd`).
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Resident memory of this process, from `/proc/self/status`, in bytes.
pub fn rss_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Counts established connections.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU64>, Arc<AtomicU64>);

impl<B: Backend + ?Sized> Handler<B> for Counter {
    fn on_connection_established(&mut self, _: &B, _: ConnId, _: EndpointAddress, _: Capabilities) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn on_connection_refused(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        _: &netio::RefuseReason,
    ) {
        self.1.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counter {
    fn wait_for(&self, n: u64, limit: Duration) -> Result<(), String> {
        let end = Instant::now() + limit;
        loop {
            let (ok, refused) = (self.0.load(Ordering::SeqCst), self.1.load(Ordering::SeqCst));
            if ok >= n {
                return Ok(());
            }
            if refused > 0 {
                return Err(format!("{refused} connection(s) refused"));
            }
            if Instant::now() > end {
                return Err(format!("only {ok} of {n} connections established in time"));
            }
            thread::sleep(Duration::from_micros(200));
        }
    }
}

fn per_conn_params() -> ConnectionParams {
    ConnectionParams::receive(BUF_SIZE, PER_CONN_BUFS)
}

/// The variants, as (child argument, label).
pub fn variants(provider: &str) -> Vec<(&'static str, &'static str)> {
    if provider == "sim" {
        vec![
            (
                "sim:per-connection",
                "accepting side, per-connection receive pools",
            ),
            (
                "sim:shared",
                "accepting side, listener's shared receive pool",
            ),
        ]
    } else {
        vec![
            (
                "accept:per-connection",
                "accepting side, per-connection receive pools",
            ),
            (
                "accept:shared",
                "accepting side, listener's shared receive pool",
            ),
            (
                "connect:per-connection",
                "connecting side, per-connection receive pools",
            ),
            (
                "connect:shared",
                "connecting side, backend's shared receive pool",
            ),
        ]
    }
}

/// Options the child needs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Provider name.
    pub provider: String,
    /// Connections.
    pub connections: u32,
    /// Busy-polling loops.
    pub busy_poll: bool,
    /// Bound of each wait.
    pub timeout: Duration,
}

struct ChildProc {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    timeout: Duration,
}

impl ChildProc {
    fn spawn(variant: &str, o: &Options) -> Result<Self, String> {
        let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["--conns-child", variant, "--provider", &o.provider])
            .args(["--connections", &o.connections.to_string()])
            .args(["--timeout", &o.timeout.as_secs_f64().to_string()]);
        if o.busy_poll {
            cmd.arg("--busy-poll");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the measuring process: {e}"))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            stdin,
            lines,
            timeout: o.timeout,
        })
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| format!("the measuring process went away: {e}"))
    }

    fn expect(&mut self, prefix: &str) -> Result<Vec<String>, String> {
        let line = self
            .lines
            .recv_timeout(self.timeout)
            .map_err(|_| format!("no `{prefix}` from the measuring process in time"))?;
        let mut parts = line.split_whitespace().map(str::to_string);
        match parts.next() {
            Some(p) if p == prefix => Ok(parts.collect()),
            Some(p) if p == "ERROR" => Err(line["ERROR".len()..].trim().to_string()),
            _ => Err(format!(
                "unexpected line from the measuring process: {line}"
            )),
        }
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "QUIT");
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < end => thread::sleep(Duration::from_millis(10)),
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
    }
}

fn num(v: &[String], i: usize) -> Result<f64, String> {
    v.get(i)
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| format!("bad reply from the measuring process: {v:?}"))
}

/// One run of one variant.
fn run_variant(variant: &str, o: &Options) -> Result<Figures, String> {
    let n = o.connections as usize;
    let halves = [n / 2, n - n / 2];
    let mut child = ChildProc::spawn(variant, o)?;
    let ready = child.expect("READY")?;
    if variant.starts_with("sim:") {
        // The child does everything; it replies with the figures.
        child.send("RUN")?;
        let v = child.expect("FIGURES")?;
        let per = |b: f64, k: usize| b / k as f64;
        return Ok(vec![
            (metrics::SETUP, num(&v, 0)? / 1e6),
            (metrics::V_SETUP, num(&v, 1)? / 1e6),
            (metrics::RSS_PER_CONN, per(num(&v, 4)? - num(&v, 2)?, n)),
            (
                metrics::RSS_FIRST_HALF,
                per(num(&v, 3)? - num(&v, 2)?, halves[0]),
            ),
            (
                metrics::RSS_SECOND_HALF,
                per(num(&v, 4)? - num(&v, 3)?, halves[1]),
            ),
            (metrics::BUFFERS_PER_CONN, per(num(&v, 5)?, n)),
        ]);
    }
    child.send("MEASURE 0")?;
    let first = child.expect("RSS")?;
    let rss0 = num(&first, 0)?;
    let fds0 = num(&first, 2)?;
    let mut fds = fds0;
    let mut rss = Vec::new();
    let mut buffers = 0.0;
    let mut setup = Duration::ZERO;
    if variant.starts_with("accept:") {
        let addr: EndpointAddress = ready
            .first()
            .and_then(|a| a.parse().ok())
            .ok_or("the measuring process did not say where it listens")?;
        let lp = new_loop(o.busy_poll).map_err(|e| e.to_string())?;
        let counter = Counter::default();
        let client = netio::create_backend(
            &o.provider,
            &AnyLoop::Mio(lp.clone()),
            BackendConfig::default(),
            counter.clone(),
        )
        .map_err(|e| format!("cannot create the client backend: {e}"))?;
        let runner = lp.clone();
        let t = thread::spawn(move || runner.run(|| {}));
        let mut total = 0u64;
        let result = (|| {
            for k in halves {
                let started = Instant::now();
                for _ in 0..k {
                    client
                        .open_active_endpoint(addr, ConnectionParams::default())
                        .map_err(|e| format!("cannot connect: {e}"))?;
                }
                total += k as u64;
                counter.wait_for(total, o.timeout)?;
                setup += started.elapsed();
                child.send(&format!("MEASURE {total}"))?;
                let v = child.expect("RSS")?;
                rss.push(num(&v, 0)?);
                buffers = num(&v, 1)?;
                fds = num(&v, 2)?;
            }
            Ok::<(), String>(())
        })();
        drop(child);
        lp.stop();
        let _ = t.join();
        drop(client);
        result?;
    } else {
        let lp = new_loop(o.busy_poll).map_err(|e| e.to_string())?;
        let server = netio::create_backend(
            &o.provider,
            &AnyLoop::Mio(lp.clone()),
            BackendConfig::default(),
            Counter::default(),
        )
        .map_err(|e| format!("cannot create the server backend: {e}"))?;
        let listen = server
            .open_listen_endpoint(EndpointAddress::localhost(0), per_conn_params())
            .map_err(|e| format!("cannot listen: {e}"))?;
        let runner = lp.clone();
        let t = thread::spawn(move || runner.run(|| {}));
        let result = (|| {
            let mut total = 0;
            for k in halves {
                total += k;
                child.send(&format!("CONNECT {listen} {k}"))?;
                setup += Duration::from_nanos(num(&child.expect("CONNECTED")?, 0)? as u64);
                child.send(&format!("MEASURE {total}"))?;
                let v = child.expect("RSS")?;
                rss.push(num(&v, 0)?);
                buffers = num(&v, 1)?;
                fds = num(&v, 2)?;
            }
            Ok::<(), String>(())
        })();
        drop(child);
        lp.stop();
        let _ = t.join();
        drop(server);
        result?;
    }
    Ok(vec![
        (metrics::SETUP, setup.as_secs_f64() * 1e3),
        (metrics::RSS_PER_CONN, (rss[1] - rss0) / n as f64),
        (metrics::RSS_FIRST_HALF, (rss[0] - rss0) / halves[0] as f64),
        (
            metrics::RSS_SECOND_HALF,
            (rss[1] - rss[0]) / halves[1] as f64,
        ),
        (metrics::FDS_PER_CONN, (fds - fds0) / n as f64),
        (metrics::BUFFERS_PER_CONN, buffers / n as f64),
    ])
}

/// Runs every variant `runs` times, each in a fresh process.
pub fn run(o: &Options, runs: u32, mut progress: impl FnMut(&str)) -> Vec<Row> {
    variants(&o.provider)
        .into_iter()
        .map(|(variant, label)| {
            let mut row = Row::new(TestKind::Conns, None, None);
            row.variant = Some(format!("{} connections, {label}", o.connections));
            for i in 0..runs {
                progress(&format!(
                    "conns {label}: run {}/{runs} ({} connections)",
                    i + 1,
                    o.connections
                ));
                match run_variant(variant, o) {
                    Ok(f) => row.provider_runs.push(f),
                    Err(e) => {
                        row.status = Status::Failed(e);
                        break;
                    }
                }
            }
            row.notes.push(if o.provider == "sim" {
                "memory of both ends (the connecting ends hold no receive buffers) and of the simulated world, in one fresh process".into()
            } else {
                "memory of the measured side only, in a fresh process; the other side runs in this one".into()
            });
            row.notes.push(format!(
                "receive buffers: {} × {} KiB per connection, or one shared pool of {} × {} KiB",
                PER_CONN_BUFS,
                BUF_SIZE / 1024,
                SHARED_BUFS,
                BUF_SIZE / 1024
            ));
            row
        })
        .collect()
}

/// The child process: `variant` is `side:pools`. Reads commands on stdin,
/// answers on stdout (see [`run_variant`]).
pub fn child(variant: &str, o: &Options) -> Result<(), RunError> {
    let out = |line: String| {
        let mut s = std::io::stdout().lock();
        let _ = writeln!(s, "{line}");
        let _ = s.flush();
    };
    let r = child_inner(variant, o, &out);
    if let Err(e) = &r {
        out(format!("ERROR {e}"));
    }
    r
}

fn child_inner(variant: &str, o: &Options, out: &dyn Fn(String)) -> Result<(), RunError> {
    let fail = |e: String| RunError::Failed(e);
    let (side, pools) = variant
        .split_once(':')
        .ok_or_else(|| fail(format!("bad variant {variant}")))?;
    let shared = match pools {
        "shared" => true,
        "per-connection" => false,
        _ => return Err(fail(format!("bad variant {variant}"))),
    };
    if side == "sim" {
        return sim_child(shared, o, out);
    }
    let lp = new_loop(o.busy_poll)?;
    let config = BackendConfig {
        shared_receive_pool: (shared && side == "connect")
            .then(|| PoolParams::new(BUF_SIZE, SHARED_BUFS)),
        ..BackendConfig::default()
    };
    let counter = Counter::default();
    let backend = netio::create_backend(
        &o.provider,
        &AnyLoop::Mio(lp.clone()),
        config,
        counter.clone(),
    )
    .map_err(|e| fail(format!("cannot create the backend: {e}")))?;
    if shared && !backend.features().shared_receive_pool {
        return Err(RunError::Unsupported(format!(
            "provider `{}` does not support shared receive pools",
            o.provider
        )));
    }
    let params = if shared {
        ConnectionParams::receive(BUF_SIZE, SHARED_BUFS).with_shared_receive()
    } else {
        per_conn_params()
    };
    let listening = if side == "accept" {
        backend
            .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
            .map_err(|e| fail(format!("cannot listen: {e}")))?
            .to_string()
    } else {
        "-".into()
    };
    let runner = lp.clone();
    let t = thread::spawn(move || runner.run(|| {}));
    out(format!("READY {listening}"));
    let stdin = std::io::stdin();
    let mut result = Ok(());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let mut words = line.split_whitespace();
        match words.next() {
            Some("MEASURE") => {
                let k: u64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
                if let Err(e) = counter.wait_for(k, o.timeout) {
                    result = Err(fail(e));
                    break;
                }
                thread::sleep(SETTLE);
                let m = backend.memory_usage();
                out(format!(
                    "RSS {} {} {}",
                    rss_bytes().unwrap_or(0),
                    m.receive_bytes + m.send_bytes,
                    open_fds()
                ));
            }
            Some("CONNECT") => {
                let started = Instant::now();
                let before = counter.0.load(Ordering::SeqCst);
                let (Some(Ok(a)), Some(Ok(k))) = (
                    words.next().map(str::parse::<EndpointAddress>),
                    words.next().map(str::parse::<u64>),
                ) else {
                    result = Err(fail(format!("bad command: {line}")));
                    break;
                };
                // Every connection goes to the same listener: each is a
                // connection of its own, with its own handle.
                if let Err(e) = (0..k)
                    .try_for_each(|_| backend.open_active_endpoint(a, params.clone()).map(drop))
                {
                    result = Err(fail(format!("cannot connect: {e}")));
                    break;
                }
                if let Err(e) = counter.wait_for(before + k, o.timeout) {
                    result = Err(fail(e));
                    break;
                }
                out(format!("CONNECTED {}", started.elapsed().as_nanos()));
            }
            _ => break,
        }
    }
    lp.stop();
    let _ = t.join();
    drop(backend);
    result
}

/// The simulator variant: one world, a server host with one listener
/// (per-connection pools or the listener's shared pool) and a client host
/// with one backend opening every connection, without receive buffers;
/// replies
/// `FIGURES setup_ns virtual_setup_ns rss0 rss_half rss_full buffer_bytes`.
fn sim_child(shared: bool, o: &Options, out: &dyn Fn(String)) -> Result<(), RunError> {
    let fail = |e: String| RunError::Failed(e);
    out("READY -".into());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    if line.trim() != "RUN" {
        return Ok(());
    }
    let sim = netio::sim::Sim::with_seed(1);
    let (hs, hc) = (sim.next_host(), sim.next_host());
    let counter = Counter::default();
    let server = netio::create_backend(
        "sim",
        &AnyLoop::Sim(hs.event_loop().clone()),
        BackendConfig::default(),
        counter.clone(),
    )
    .map_err(|e| fail(e.to_string()))?;
    let params = if shared {
        ConnectionParams::receive(BUF_SIZE, SHARED_BUFS).with_shared_receive()
    } else {
        per_conn_params()
    };
    let addr = server
        .open_listen_endpoint(EndpointAddress::new(hs.ip(), 0), params)
        .map_err(|e| fail(e.to_string()))?;
    // The connecting ends receive nothing: only the accepting ends' pools
    // differ between the variants.
    let client_config = BackendConfig::default();
    let client_params = ConnectionParams::default();
    let n = o.connections as usize;
    let rss0 = rss_bytes().unwrap_or(0);
    let (t0, v0) = (Instant::now(), sim.now());
    let client = netio::create_backend(
        "sim",
        &AnyLoop::Sim(hc.event_loop().clone()),
        client_config,
        counter.clone(),
    )
    .map_err(|e| fail(e.to_string()))?;
    let mut opened = 0;
    let mut rss_half = 0;
    for (i, k) in [n / 2, n - n / 2].into_iter().enumerate() {
        for _ in 0..k {
            client
                .open_active_endpoint(addr, client_params.clone())
                .map_err(|e| fail(e.to_string()))?;
        }
        opened += k as u64;
        // Both ends report each connection.
        let want = 2 * opened;
        let deadline = sim.now() + Duration::from_secs(60);
        if !sim.run_until(deadline, || counter.0.load(Ordering::SeqCst) >= want) {
            return Err(fail("connections not established in virtual time".into()));
        }
        if i == 0 {
            rss_half = rss_bytes().unwrap_or(0);
        }
    }
    let (setup, vsetup) = (t0.elapsed(), sim.now() - v0);
    let rss_full = rss_bytes().unwrap_or(0);
    let buffers = [server.memory_usage(), client.memory_usage()]
        .iter()
        .map(|m| m.receive_bytes + m.send_bytes)
        .sum::<usize>();
    out(format!(
        "FIGURES {} {} {rss0} {rss_half} {rss_full} {buffers}",
        setup.as_nanos(),
        vsetup.as_nanos()
    ));
    Ok(())
}
