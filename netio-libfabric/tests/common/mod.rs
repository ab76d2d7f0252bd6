//! What the integration tests share: a handler that records events and
//! answers `ping` with `pong`, and a loop running on a thread of its own.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler, RefuseReason,
};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

/// Wall time a condition gets on a loaded machine.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// What a [`Recorder`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// `on_connection_established`.
    Established(ConnId, EndpointAddress),
    /// `on_connection_refused`.
    Refused(ConnId, RefuseReason),
    /// `on_connection_closed`.
    Closed(ConnId, CloseReason),
    /// `on_data` with a `pong`.
    Pong(ConnId),
}

/// Records events; answers every `ping` with a `pong` (copy send); when a
/// connection to `greet_port` is established, sends `pings` pings on it.
#[derive(Clone, Default)]
pub struct Recorder {
    pub log: Arc<Mutex<Vec<Seen>>>,
    pub greet_port: Arc<AtomicU16>,
    pub pings: usize,
}

impl Recorder {
    pub fn new(pings: usize) -> Self {
        Self {
            pings,
            ..Self::default()
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    pub fn count(&self, f: impl Fn(&Seen) -> bool) -> usize {
        self.log.lock().unwrap().iter().filter(|s| f(s)).count()
    }
}

impl<B: Backend + ?Sized> Handler<B> for Recorder {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        _caps: Capabilities,
    ) {
        self.log
            .lock()
            .unwrap()
            .push(Seen::Established(conn, remote));
        if remote.port() == self.greet_port.load(Ordering::SeqCst) {
            for i in 0..self.pings {
                b.send_data_copy(conn, &[b"ping"], &[], i as u64)
                    .expect("a ping is accepted (the queue depth exceeds the pings)");
            }
        }
    }

    fn on_connection_refused(
        &mut self,
        _b: &B,
        conn: ConnId,
        _r: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.log
            .lock()
            .unwrap()
            .push(Seen::Refused(conn, why.clone()));
    }

    fn on_connection_closed(
        &mut self,
        _b: &B,
        conn: ConnId,
        _r: EndpointAddress,
        why: &CloseReason,
        _keys: &[u64],
    ) {
        self.log
            .lock()
            .unwrap()
            .push(Seen::Closed(conn, why.clone()));
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        match data {
            b"ping" => {
                let _ = b.send_data_copy(conn, &[b"pong"], &[], 0);
            }
            b"pong" => self.log.lock().unwrap().push(Seen::Pong(conn)),
            _ => {}
        }
    }
}

/// The connection a [`Tracked`] handler saw established last, shared
/// with the test.
#[derive(Clone, Default)]
pub struct LastConn(Arc<Mutex<Option<ConnId>>>);

impl LastConn {
    /// The connection established last, if any yet.
    pub fn get(&self) -> Option<ConnId> {
        *self.0.lock().unwrap()
    }

    /// Waits (bounded by [`DEADLINE`]) for a connection to be established.
    pub fn wait(&self) -> Option<ConnId> {
        wait_until(|| self.get().is_some());
        self.get()
    }
}

/// Handler `H` whose `on_connection_established` is recorded in a
/// [`LastConn`] before `H` sees it; every other call goes to `H` as is.
pub struct Tracked<H> {
    inner: H,
    conn: LastConn,
}

impl<H> Tracked<H> {
    /// `inner`, tracked in `conn`.
    pub fn new(inner: H, conn: &LastConn) -> Self {
        Self {
            inner,
            conn: conn.clone(),
        }
    }
}

impl<B: ?Sized, H: Handler<B>> Handler<B> for Tracked<H> {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        *self.conn.0.lock().unwrap() = Some(conn);
        self.inner.on_connection_established(b, conn, remote, caps);
    }

    fn on_connection_refused(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.inner.on_connection_refused(b, conn, remote, why);
    }

    fn on_connection_closed(
        &mut self,
        b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        self.inner.on_connection_closed(b, conn, remote, why, keys);
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        self.inner.on_data(b, conn, data);
    }

    fn on_send_completed(&mut self, b: &B, conn: ConnId, key: u64) {
        self.inner.on_send_completed(b, conn, key);
    }

    fn on_sends_completed(&mut self, b: &B, conn: ConnId, keys: &[u64]) {
        self.inner.on_sends_completed(b, conn, keys);
    }

    fn on_timer(&mut self, b: &B, token: u64) {
        self.inner.on_timer(b, token);
    }

    fn on_wake(&mut self, b: &B, token: u64) {
        self.inner.on_wake(b, token);
    }
}

/// A loop running on its own thread until dropped.
pub struct Running {
    pub lp: MioLoop,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    pub fn start() -> Self {
        Self::with(MioLoop::new().expect("creating a loop"))
    }

    /// A busy-polling loop on a thread of its own.
    #[allow(dead_code)] // not every test binary polls busily
    pub fn start_busy() -> Self {
        Self::with(
            MioLoop::with_config(netio_core::mio_loop::LoopConfig {
                busy_poll: true,
                ..Default::default()
            })
            .expect("creating a busy-polling loop"),
        )
    }

    fn with(lp: MioLoop) -> Self {
        let runner = lp.clone();
        let thread = std::thread::spawn(move || runner.run(|| {}));
        Self {
            lp,
            thread: Some(thread),
        }
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

/// A receiving and a sending backend made with `lf` on loops `rx` and
/// `tx` (handlers `r` and `t`), and the sender connecting (with default
/// parameters) to the receiver's listener on 127.0.0.1, which takes
/// `recv` for the connections it accepts. The connection is not yet
/// established when this returns.
pub fn receiver_and_sender(
    rx: &MioLoop,
    tx: &MioLoop,
    lf: LibfabricConfig,
    r: impl Handler<LibfabricBackend> + 'static,
    t: impl Handler<LibfabricBackend> + 'static,
    recv: ConnectionParams,
) -> (LibfabricBackend, LibfabricBackend) {
    listener_and_connector(rx, tx, lf, r, t, recv, ConnectionParams::default())
}

/// [`receiver_and_sender`] with the connecting side's parameters `send`.
#[allow(dead_code)] // not every test binary connects with parameters of its own
pub fn listener_and_connector(
    rx: &MioLoop,
    tx: &MioLoop,
    lf: LibfabricConfig,
    r: impl Handler<LibfabricBackend> + 'static,
    t: impl Handler<LibfabricBackend> + 'static,
    recv: ConnectionParams,
    send: ConnectionParams,
) -> (LibfabricBackend, LibfabricBackend) {
    let receiver =
        LibfabricBackend::new(rx, BackendConfig::default(), lf.clone(), r).expect("receiver");
    let sender = LibfabricBackend::new(tx, BackendConfig::default(), lf, t).expect("sender");
    let listen = receiver
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), recv)
        .expect("listening");
    sender
        .open_active_endpoint(listen, send)
        .expect("connecting");
    (receiver, sender)
}

/// Waits (bounded by [`DEADLINE`]) until `cond` holds; `false` if it never did.
pub fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + DEADLINE;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

/// CPU time (user + system) of the whole process so far.
pub fn process_cpu() -> Duration {
    // SAFETY: all-zero is a valid rusage; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}
