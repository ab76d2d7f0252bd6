//! Shared helpers of the TCP integration tests: a loop on its own thread, a
//! handler that records events, and waiting with a deadline.
#![allow(dead_code)]

pub mod raw;

use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    BackendConfig, Capabilities, CloseReason, EndpointAddress, EventLoop, Handler, RefuseReason,
};
use netio_tcp::{TcpBackend, TcpConfig, TcpProvider};

/// How long any awaited condition may take on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

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

type DataHook = Box<dyn FnMut(&TcpBackend, EndpointAddress, &[u8]) + Send>;
type EstablishedHook = Box<dyn FnMut(&TcpBackend, EndpointAddress) + Send>;
type CompletedHook = Box<dyn FnMut(&TcpBackend, EndpointAddress, u64) + Send>;

/// Records every event; optional hooks act on some.
#[derive(Default)]
pub struct Recorder {
    pub events: Arc<Mutex<Vec<Ev>>>,
    pub on_data: Option<DataHook>,
    pub on_established: Option<EstablishedHook>,
    /// Runs after a completion is recorded.
    pub on_completed: Option<CompletedHook>,
    /// Record data events (off for bulk tests that only count).
    pub skip_data: bool,
    pub data_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handler<TcpBackend> for Recorder {
    fn on_connection_established(&mut self, b: &TcpBackend, r: EndpointAddress, c: Capabilities) {
        self.events.lock().unwrap().push(Ev::Established(r, c));
        if let Some(h) = &mut self.on_established {
            h(b, r);
        }
    }
    fn on_connection_refused(&mut self, _: &TcpBackend, r: EndpointAddress, why: &RefuseReason) {
        self.events
            .lock()
            .unwrap()
            .push(Ev::Refused(r, why.clone()));
    }
    fn on_connection_closed(
        &mut self,
        _: &TcpBackend,
        r: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        self.events
            .lock()
            .unwrap()
            .push(Ev::Closed(r, why.clone(), keys.to_vec()));
    }
    fn on_data(&mut self, b: &TcpBackend, r: EndpointAddress, d: &[u8]) {
        self.data_count
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if !self.skip_data {
            self.events.lock().unwrap().push(Ev::Data(r, d.to_vec()));
        }
        if let Some(h) = &mut self.on_data {
            h(b, r, d);
        }
    }
    fn on_send_completed(&mut self, b: &TcpBackend, r: EndpointAddress, k: u64) {
        self.events.lock().unwrap().push(Ev::Completed(r, k));
        if let Some(h) = &mut self.on_completed {
            h(b, r, k);
        }
    }
}

/// A backend with its recorded events.
pub struct Side {
    pub b: TcpBackend,
    pub events: Arc<Mutex<Vec<Ev>>>,
    pub data_count: Arc<std::sync::atomic::AtomicUsize>,
}

impl Side {
    pub fn new(lp: &MioLoop, config: BackendConfig) -> Self {
        Self::with(lp, config, TcpConfig::default(), Recorder::default())
    }

    pub fn with(lp: &MioLoop, config: BackendConfig, tcp: TcpConfig, rec: Recorder) -> Self {
        let events = Arc::clone(&rec.events);
        let data_count = Arc::clone(&rec.data_count);
        let b = TcpProvider::create_with(lp, config, tcp, rec).expect("backend");
        Self {
            b,
            events,
            data_count,
        }
    }

    pub fn events(&self) -> Vec<Ev> {
        self.events.lock().unwrap().clone()
    }

    pub fn has(&self, f: impl Fn(&Ev) -> bool) -> bool {
        self.events.lock().unwrap().iter().any(f)
    }

    pub fn count(&self, f: impl Fn(&Ev) -> bool) -> usize {
        self.events.lock().unwrap().iter().filter(|e| f(e)).count()
    }

    /// The remote of the first established connection.
    pub fn first_remote(&self) -> Option<EndpointAddress> {
        self.events.lock().unwrap().iter().find_map(|e| match e {
            Ev::Established(r, _) => Some(*r),
            _ => None,
        })
    }

    pub fn data(&self) -> Vec<Vec<u8>> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .filter_map(|e| match e {
                Ev::Data(_, d) => Some(d.clone()),
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
