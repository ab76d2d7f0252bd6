//! Shared helpers of the TCP integration tests: a loop on its own thread, a
//! handler that records events, and waiting with a deadline.
//!
//! The recorder logs every event twice: by remote address ([`Ev`], what most
//! tests match on: a connection's remote address is unique in them), and by
//! handle ([`Side::log`]), with every batch of completions as it came
//! ([`Side::batches`]). [`Side::conn`] gives the handle of a connection by
//! remote address (the latest one, still valid or not).
#![allow(dead_code)]

pub mod raw;

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, EndpointAddress, EventLoop, Handler,
    RefuseReason,
};
use netio_tcp::{TcpBackend, TcpConfig, TcpProvider};

/// How long any awaited condition may take on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Resident memory of this process, in KiB (`VmRSS`).
#[allow(dead_code)] // not every test binary measures memory
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Waits until `cond` holds or the deadline passes; returns whether it held.
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
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

/// A loop running on its own thread; stopped and joined on drop.
pub struct Running {
    pub lp: MioLoop,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    pub fn start() -> Self {
        let lp = MioLoop::new().expect("loop");
        let l2 = lp.clone();
        let (tx, rx) = mpsc::channel();
        let thread = thread::spawn(move || {
            l2.run(|| {
                let _ = tx.send(());
            })
        });
        rx.recv_timeout(DEADLINE).expect("loop started");
        Self {
            lp,
            thread: Some(thread),
        }
    }

    /// Runs `f` on the loop thread and returns its result.
    pub fn on_loop<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = mpsc::channel();
        self.lp.post(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(DEADLINE).expect("loop ran the closure")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One handler event.
#[derive(Debug, Clone, PartialEq)]
pub enum Ev {
    Established(EndpointAddress, Capabilities),
    Refused(EndpointAddress, RefuseReason),
    Closed(EndpointAddress, CloseReason, Vec<u64>),
    Data(EndpointAddress, Vec<u8>),
    Completed(EndpointAddress, u64),
}

type DataHook = Box<dyn FnMut(&TcpBackend, ConnId, &[u8]) + Send>;
type EstablishedHook = Box<dyn FnMut(&TcpBackend, ConnId) + Send>;
type CompletedHook = Box<dyn FnMut(&TcpBackend, ConnId, u64) + Send>;

/// What the recorder shares with its [`Side`].
#[derive(Default)]
pub struct Shared {
    pub events: Mutex<Vec<Ev>>,
    /// Every event with its handle.
    pub log: Mutex<Vec<(ConnId, Ev)>>,
    /// Each `on_sends_completed` call: the handle and its keys.
    pub batches: Mutex<Vec<(ConnId, Vec<u64>)>>,
    /// Remote address of every handle seen.
    pub remotes: Mutex<HashMap<ConnId, EndpointAddress>>,
    /// The latest handle seen for each remote address.
    pub handles: Mutex<HashMap<EndpointAddress, ConnId>>,
    pub timers: Mutex<Vec<(u64, std::time::Duration)>>,
    pub wakes: Mutex<Vec<u64>>,
}

impl Shared {
    fn record(&self, conn: ConnId, ev: Ev) {
        self.log.lock().unwrap().push((conn, ev.clone()));
        self.events.lock().unwrap().push(ev);
    }
    fn remote(&self, conn: ConnId) -> EndpointAddress {
        self.remotes
            .lock()
            .unwrap()
            .get(&conn)
            .copied()
            .unwrap_or_else(|| panic!("event of {conn}, never reported established"))
    }
    fn saw(&self, conn: ConnId, remote: EndpointAddress) {
        self.remotes.lock().unwrap().insert(conn, remote);
        self.handles.lock().unwrap().insert(remote, conn);
    }
}

/// Records every event; optional hooks act on some.
#[derive(Default)]
pub struct Recorder {
    pub shared: Arc<Shared>,
    pub on_data: Option<DataHook>,
    pub on_established: Option<EstablishedHook>,
    /// Runs after a completion is recorded.
    pub on_completed: Option<CompletedHook>,
    /// Record data events (off for bulk tests that only count).
    pub skip_data: bool,
    pub data_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handler<TcpBackend> for Recorder {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        r: EndpointAddress,
        c: Capabilities,
    ) {
        self.shared.saw(conn, r);
        self.shared.record(conn, Ev::Established(r, c));
        if let Some(h) = &mut self.on_established {
            h(b, conn);
        }
    }
    fn on_connection_refused(
        &mut self,
        _: &TcpBackend,
        conn: ConnId,
        r: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.shared.saw(conn, r);
        self.shared.record(conn, Ev::Refused(r, why.clone()));
    }
    fn on_connection_closed(
        &mut self,
        _: &TcpBackend,
        conn: ConnId,
        r: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        assert_eq!(self.shared.remote(conn), r, "the remote of {conn} changed");
        self.shared
            .record(conn, Ev::Closed(r, why.clone(), keys.to_vec()));
    }
    fn on_data(&mut self, b: &TcpBackend, conn: ConnId, d: &[u8]) {
        if !self.skip_data {
            let r = self.shared.remote(conn);
            self.shared.record(conn, Ev::Data(r, d.to_vec()));
        }
        // Counted once recorded: a test that waits for the count sees the
        // data.
        self.data_count
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = &mut self.on_data {
            h(b, conn, d);
        }
    }
    fn on_sends_completed(&mut self, b: &TcpBackend, conn: ConnId, keys: &[u64]) {
        assert!(!keys.is_empty(), "an empty batch of completions");
        self.shared
            .batches
            .lock()
            .unwrap()
            .push((conn, keys.to_vec()));
        let r = self.shared.remote(conn);
        for &k in keys {
            self.shared.record(conn, Ev::Completed(r, k));
            if let Some(h) = &mut self.on_completed {
                h(b, conn, k);
            }
        }
    }
    fn on_timer(&mut self, b: &TcpBackend, token: u64) {
        self.shared.timers.lock().unwrap().push((token, b.now()));
    }
    fn on_wake(&mut self, _: &TcpBackend, token: u64) {
        self.shared.wakes.lock().unwrap().push(token);
    }
}

/// A handle no backend issues (for "unknown connection" checks).
pub const NEVER_ISSUED: ConnId = ConnId::new(u32::MAX - 1, u32::MAX);

/// A backend with its recorded events.
pub struct Side {
    pub b: TcpBackend,
    pub shared: Arc<Shared>,
    pub data_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Side {
    pub fn new(lp: &MioLoop, config: BackendConfig) -> Self {
        Self::with(lp, config, TcpConfig::default(), Recorder::default())
    }

    pub fn with(lp: &MioLoop, config: BackendConfig, tcp: TcpConfig, rec: Recorder) -> Self {
        let shared = Arc::clone(&rec.shared);
        let data_count = Arc::clone(&rec.data_count);
        let b = TcpProvider::create_with(lp, config, tcp, rec).expect("backend");
        Self {
            b,
            shared,
            data_count,
        }
    }

    /// The handle of the connection with remote address `remote`: the
    /// latest reported (established, refused or closed), else the one the
    /// backend knows, else one never issued.
    pub fn conn(&self, remote: EndpointAddress) -> ConnId {
        if let Some(&c) = self.shared.handles.lock().unwrap().get(&remote) {
            return c;
        }
        self.b.connection_to(remote).unwrap_or(NEVER_ISSUED)
    }

    pub fn events(&self) -> Vec<Ev> {
        self.shared.events.lock().unwrap().clone()
    }

    /// Every event with its handle.
    pub fn log(&self) -> Vec<(ConnId, Ev)> {
        self.shared.log.lock().unwrap().clone()
    }

    /// Every batch of completions, in order.
    pub fn batches(&self) -> Vec<(ConnId, Vec<u64>)> {
        self.shared.batches.lock().unwrap().clone()
    }

    pub fn has(&self, f: impl Fn(&Ev) -> bool) -> bool {
        self.shared.events.lock().unwrap().iter().any(f)
    }

    pub fn count(&self, f: impl Fn(&Ev) -> bool) -> usize {
        self.shared
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| f(e))
            .count()
    }

    /// The remote of the first established connection.
    pub fn first_remote(&self) -> Option<EndpointAddress> {
        self.shared
            .events
            .lock()
            .unwrap()
            .iter()
            .find_map(|e| match e {
                Ev::Established(r, _) => Some(*r),
                _ => None,
            })
    }

    pub fn data(&self) -> Vec<Vec<u8>> {
        self.shared
            .events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Ev::Data(_, d) => Some(d.clone()),
                _ => None,
            })
            .collect()
    }

    /// The data of connection `conn`, in order.
    pub fn data_of(&self, conn: ConnId) -> Vec<Vec<u8>> {
        self.log()
            .into_iter()
            .filter_map(|(c, e)| match e {
                Ev::Data(_, d) if c == conn => Some(d),
                _ => None,
            })
            .collect()
    }
}

/// Connects `client` to a listener of `server` with the given params and
/// waits until both sides are established. Returns (the listener's
/// address, the client's name on the server).
pub fn connect(
    server: &Side,
    client: &Side,
    listen_at: EndpointAddress,
    server_params: netio_core::ConnectionParams,
    client_params: netio_core::ConnectionParams,
) -> (EndpointAddress, EndpointAddress) {
    use netio_core::Backend;
    let addr = server
        .b
        .open_listen_endpoint(listen_at, server_params)
        .expect("listen");
    // (Some callers' handlers close the connection at once, so the handle
    // may be stale by the time the events are seen.)
    client
        .b
        .open_active_endpoint(addr, client_params)
        .expect("connect");
    assert!(
        wait_until(|| client.has(|e| matches!(e, Ev::Established(r, _) if *r == addr))),
        "client established: {:?}",
        client.events()
    );
    assert!(
        wait_until(|| server.first_remote().is_some()),
        "server established: {:?}",
        server.events()
    );
    (addr, server.first_remote().unwrap())
}
