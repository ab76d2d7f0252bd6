//! A handler that panics in `on_data` ends the loop's `run`; once the loop
//! runs again, the connection goes on: the message that panicked counts as
//! delivered, and the messages after it (sent before the panic and after)
//! arrive. On connected endpoints and on reliable datagrams, on loops that
//! sleep and on busy-polling loops.

mod common;
mod harness;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{wait_until, LastConn, Tracked};
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{Backend, BackendConfig, ConnId, ConnectionParams, EventLoop, Handler};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

/// Records the messages it is handed; panics after recording a message
/// that reads `boom`.
#[derive(Clone, Default)]
struct Side {
    got: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Handler<LibfabricBackend> for Side {
    fn on_data(&mut self, _b: &LibfabricBackend, _c: ConnId, data: &[u8]) {
        self.got.lock().unwrap().push(data.to_vec());
        if data == b"boom" {
            panic!("handler panics in on_data (on purpose)");
        }
    }
}

/// A loop on a thread of its own, run again after each panic that ends
/// `run` (counted), until stopped.
struct Restarting {
    lp: MioLoop,
    panics: Arc<AtomicUsize>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Restarting {
    fn start(busy: bool) -> Self {
        let lp = MioLoop::with_config(LoopConfig {
            busy_poll: busy,
            ..LoopConfig::default()
        })
        .expect("loop");
        let panics = Arc::new(AtomicUsize::new(0));
        let (runner, count) = (lp.clone(), Arc::clone(&panics));
        let thread = thread::spawn(move || loop {
            match catch_unwind(AssertUnwindSafe(|| runner.run(|| {}))) {
                Ok(()) => return,
                Err(_) => {
                    count.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Self {
            lp,
            panics,
            thread: Some(thread),
        }
    }
}

impl Drop for Restarting {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn messages_after_a_panic_arrive(lf: LibfabricConfig, busy: bool) {
    let (rx_loop, tx_loop) = (Restarting::start(busy), Restarting::start(busy));
    let (rx, tx_conn) = (Side::default(), LastConn::default());
    let (receiver, sender) = common::receiver_and_sender(
        &rx_loop.lp,
        &tx_loop.lp,
        lf,
        rx.clone(),
        Tracked::new(Side::default(), &tx_conn),
        ConnectionParams::receive(64, 8),
    );
    let conn = tx_conn.wait().expect("the sender's connection established");
    let send = |m: &[u8], key: u64| {
        assert!(
            wait_until(|| sender.send_data_copy(conn, &[m], &[], key).is_ok()),
            "send {key} accepted"
        );
    };
    for (key, m) in [&b"one"[..], b"boom", b"after", b"it"]
        .into_iter()
        .enumerate()
    {
        send(m, key as u64);
    }
    assert!(
        wait_until(|| rx_loop.panics.load(Ordering::SeqCst) == 1),
        "the handler's panic ended a run of the receiver's loop"
    );
    send(b"later", 10);
    let want: Vec<Vec<u8>> = [&b"one"[..], b"boom", b"after", b"it", b"later"]
        .iter()
        .map(|m| m.to_vec())
        .collect();
    assert!(
        wait_until(|| *rx.got.lock().unwrap() == want),
        "every message arrives, the ones after the panic included: {:?}",
        rx.got
            .lock()
            .unwrap()
            .iter()
            .map(|m| String::from_utf8_lossy(m).into_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(rx_loop.panics.load(Ordering::SeqCst), 1, "one panic only");
    assert_eq!(tx_loop.panics.load(Ordering::SeqCst), 0);
    drop(sender);
    drop(receiver);
}

#[test]
fn on_a_connected_endpoint_the_messages_after_a_handler_panic_arrive() {
    messages_after_a_panic_arrive(LibfabricConfig::provider("tcp"), false);
}

#[test]
fn on_a_busy_connected_endpoint_the_messages_after_a_handler_panic_arrive() {
    messages_after_a_panic_arrive(LibfabricConfig::provider("tcp"), true);
}

#[test]
fn on_reliable_datagrams_the_messages_after_a_handler_panic_arrive() {
    messages_after_a_panic_arrive(harness::rdm_config("tcp;ofi_rxm"), false);
}

#[test]
fn on_busy_reliable_datagrams_the_messages_after_a_handler_panic_arrive() {
    messages_after_a_panic_arrive(harness::rdm_config("shm"), true);
}

/// Records the wake tokens it is handed; panics on token 1.
#[derive(Clone, Default)]
struct Waker(Arc<Mutex<Vec<u64>>>);

impl Handler<LibfabricBackend> for Waker {
    fn on_wake(&mut self, _b: &LibfabricBackend, token: u64) {
        if token == 1 {
            panic!("handler panics in on_wake (on purpose)");
        }
        self.0.lock().unwrap().push(token);
    }
}

/// Two events queued together go to the handler in one dispatch; when the
/// handler panics on the first, the second is handed over once the loop
/// runs again (the dispatch puts what it had not handed over back in the
/// queue and posts another).
fn events_after_a_panic_in_a_dispatch_are_dispatched(lf: LibfabricConfig) {
    let lp = Restarting::start(false);
    let seen = Waker::default();
    let b = Arc::new(
        LibfabricBackend::new(&lp.lp, BackendConfig::default(), lf, seen.clone()).expect("backend"),
    );
    {
        // Queued from one loop callback: one dispatch takes both.
        let b = Arc::clone(&b);
        lp.lp.post(move || {
            b.wake(1);
            b.wake(2);
        });
    }
    assert!(
        wait_until(|| lp.panics.load(Ordering::SeqCst) == 1),
        "the handler's panic on the first event ended a run of the loop"
    );
    assert!(
        wait_until(|| *seen.0.lock().unwrap() == [2]),
        "the event after the one that panicked is dispatched: {:?}",
        seen.0.lock().unwrap()
    );
    b.wake(3);
    assert!(
        wait_until(|| *seen.0.lock().unwrap() == [2, 3]),
        "and later events too: {:?}",
        seen.0.lock().unwrap()
    );
}

#[test]
fn on_connected_endpoints_events_after_a_handler_panic_in_a_dispatch_are_dispatched() {
    events_after_a_panic_in_a_dispatch_are_dispatched(LibfabricConfig::provider("tcp"));
}

#[test]
fn on_reliable_datagrams_events_after_a_handler_panic_in_a_dispatch_are_dispatched() {
    events_after_a_panic_in_a_dispatch_are_dispatched(harness::rdm_config("tcp;ofi_rxm"));
}
