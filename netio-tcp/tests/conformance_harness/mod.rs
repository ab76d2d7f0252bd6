//! The conformance harness of the TCP provider, shared by the suite's test
//! binaries: `conformance` (127.0.0.1), `conformance_v6` (::1) and
//! `conformance_busy_poll` (127.0.0.1 on busy-polling loops).
//!
//! One real event loop per test runs on its own thread and serves every
//! backend of that test; `wait_until` polls the condition on the wall clock
//! with a generous deadline. A [`Flavor`] picks the IP the backends listen
//! on and the loop's configuration.
#![allow(dead_code)]

use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::{mpsc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{BackendConfig, EndpointAddress, EventLoop, Features, Handler, Provider};
use netio_tcp::{TcpBackend, TcpProvider};

/// Wall time `wait_until` gives a condition on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);
/// Wall time `settle` lets pending events run.
const SETTLE: Duration = Duration::from_millis(200);

/// What varies between the suite's runs on TCP.
pub trait Flavor: 'static {
    /// The loopback address backends listen on and connect to.
    const IP: IpAddr;
    /// Run every loop (the harness's and the event-loop tests' fresh ones)
    /// in busy-poll mode.
    const BUSY_POLL: bool;
    /// Run one test of this flavor at a time in the process, whatever
    /// `--test-threads` says: a busy-polling loop keeps a core busy, and
    /// the machines this runs on may have two.
    const ONE_AT_A_TIME: bool;
}

/// 127.0.0.1, loops sleeping in epoll.
pub struct V4;
impl Flavor for V4 {
    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const BUSY_POLL: bool = false;
    const ONE_AT_A_TIME: bool = false;
}

/// ::1, loops sleeping in epoll.
pub struct V6;
impl Flavor for V6 {
    const IP: IpAddr = IpAddr::V6(Ipv6Addr::LOCALHOST);
    const BUSY_POLL: bool = false;
    const ONE_AT_A_TIME: bool = false;
}

/// 127.0.0.1, busy-polling loops, one test at a time.
pub struct V4BusyPoll;
impl Flavor for V4BusyPoll {
    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const BUSY_POLL: bool = true;
    const ONE_AT_A_TIME: bool = true;
}

/// Held by the running test of a [`Flavor::ONE_AT_A_TIME`] flavor.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A loop of the flavor's configuration.
fn new_loop<F: Flavor>() -> MioLoop {
    if F::BUSY_POLL {
        MioLoop::with_config(LoopConfig {
            busy_poll: true,
            ..LoopConfig::default()
        })
        .expect("creating a busy-polling event loop")
    } else {
        MioLoop::new().expect("creating the event loop")
    }
}

/// `true` if a TCP socket can listen on `[::1]:0` on this machine now.
pub fn ipv6_loopback_works() -> bool {
    TcpListener::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)).is_ok()
}

/// TCP's [`netio_conformance::Harness`] for the flavor `F`: a loop thread
/// and the backends on it.
pub struct TcpHarness<F: Flavor> {
    lp: MioLoop,
    thread: Option<JoinHandle<()>>,
    backends: Vec<TcpBackend>,
    /// Released last, after the loop thread has stopped.
    _turn: Option<MutexGuard<'static, ()>>,
    _flavor: PhantomData<F>,
}

impl<F: Flavor> Drop for TcpHarness<F> {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.backends.clear();
    }
}

impl<F: Flavor> netio_conformance::Harness for TcpHarness<F> {
    type Loop = MioLoop;
    type Backend = TcpBackend;

    fn setup() -> Self {
        // A test that failed while holding the turn poisons the lock; the
        // next test may still go (the failed one's harness was dropped).
        let turn =
            F::ONE_AT_A_TIME.then(|| ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner()));
        let lp = new_loop::<F>();
        let runner = lp.clone();
        let (tx, rx) = mpsc::channel();
        let thread = thread::spawn(move || {
            runner.run(|| {
                let _ = tx.send(());
            })
        });
        rx.recv_timeout(DEADLINE).expect("the loop thread started");
        Self {
            lp,
            thread: Some(thread),
            backends: Vec::new(),
            _turn: turn,
            _flavor: PhantomData,
        }
    }

    fn features(&self) -> Features {
        TcpBackend::FEATURES
    }

    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<TcpBackend>>,
    ) -> TcpBackend {
        let b = TcpProvider::create(&self.lp, config, handler).expect("creating a TCP backend");
        self.backends.push(b.clone());
        b
    }

    fn local_ip(&self, _backend: &TcpBackend) -> IpAddr {
        F::IP
    }

    fn refusing_address(&mut self) -> EndpointAddress {
        // A port that was just free: nothing listens there, so the kernel
        // answers a connect with a reset (a refusal).
        let l = TcpListener::bind(SocketAddr::new(F::IP, 0)).expect("binding a probe port");
        let addr = EndpointAddress::from(l.local_addr().expect("probe address"));
        drop(l);
        addr
    }

    fn event_loop(&self, _backend: &TcpBackend) -> &MioLoop {
        &self.lp
    }

    fn on_loop<R: Send + 'static>(
        &mut self,
        _backend: &TcpBackend,
        f: Box<dyn FnOnce() -> R + Send + 'static>,
    ) -> R {
        let (tx, rx) = mpsc::channel();
        self.lp.post(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(DEADLINE)
            .expect("the loop thread ran the closure")
    }

    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
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

    fn settle(&mut self) {
        thread::sleep(SETTLE);
    }

    fn fresh_loop(&mut self) -> MioLoop {
        new_loop::<F>()
    }
}
