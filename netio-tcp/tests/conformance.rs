//! The netio-rs conformance suite on TCP over loopback, in both thread
//! modes.
//!
//! One real event loop per test runs on its own thread and serves every
//! backend of that test; `wait_until` polls the condition on the wall clock
//! with a generous deadline.

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{BackendConfig, EndpointAddress, EventLoop, Features, Handler, Provider};
use netio_tcp::{TcpBackend, TcpProvider};

/// Wall time `wait_until` gives a condition on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(20);
/// Wall time `settle` lets pending events run.
const SETTLE: Duration = Duration::from_millis(200);

/// TCP's [`netio_conformance::Harness`]: a loop thread and the backends on
/// it.
pub struct TcpHarness {
    lp: MioLoop,
    thread: Option<JoinHandle<()>>,
    backends: Vec<TcpBackend>,
}

impl Drop for TcpHarness {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.backends.clear();
    }
}

impl netio_conformance::Harness for TcpHarness {
    type Loop = MioLoop;
    type Backend = TcpBackend;

    fn setup() -> Self {
        let lp = MioLoop::new().expect("creating the event loop");
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
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    fn refusing_address(&mut self) -> EndpointAddress {
        // A port that was just free: nothing listens there, so the kernel
        // answers a connect with a reset (a refusal).
        let l = TcpListener::bind("127.0.0.1:0").expect("binding a probe port");
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
        MioLoop::new().expect("creating an event loop")
    }
}

netio_conformance::suite!(crate::TcpHarness);
