//! A busy-polling loop's spin reads the connection that delivered data
//! last and hands its messages over; what a handler sends from there
//! leaves when the spin ends, with no flush posted for the next turn. A
//! handler that panics (in the spin, in a readiness event or in a
//! dispatched callback) leaves the backend serving its other connections
//! and events once the loop runs again, and the connection it panicked on
//! hands out the messages after the one that panicked.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread;

use common::{raw, DEADLINE};
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{
    Backend, BackendConfig, ConnId, ConnectionParams, EndpointAddress, EventLoop, Handler,
};
use netio_tcp::wire::HANDSHAKE_LEN;
use netio_tcp::TcpBackend;

/// Echoes each message; panics after echoing one that reads `boom`.
struct EchoThenPanic;

impl Handler<TcpBackend> for EchoThenPanic {
    fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
        b.send_data_copy(conn, &[data], &[], 0).expect("echo");
        if data == b"boom" {
            panic!("handler panics after its reply (on purpose)");
        }
    }
}

/// A raw peer connected to `addr` that sent `messages` and read each one's
/// echo.
fn echoed(addr: EndpointAddress, messages: &[&[u8]]) -> TcpStream {
    let mut peer = raw::connect_with_handshake(addr, 64);
    let _their_handshake = raw::read_n(&mut peer, HANDSHAKE_LEN);
    for m in messages {
        peer.write_all(&raw::data_frame(m)).unwrap();
        let echo = raw::read_n(&mut peer, raw::data_frame(m).len());
        assert_eq!(echo, raw::data_frame(m), "the echo of {m:?}");
    }
    peer
}

/// A backend on `lp` whose handler is [`EchoThenPanic`], listening on a
/// port of 127.0.0.1.
fn echo_then_panic_listening(lp: &MioLoop) -> (TcpBackend, EndpointAddress) {
    let backend = TcpBackend::new(lp, BackendConfig::default(), EchoThenPanic).expect("backend");
    let addr = backend
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64, 4),
        )
        .expect("listen");
    (backend, addr)
}

/// A busy-polling loop.
fn busy_loop() -> MioLoop {
    MioLoop::with_config(LoopConfig {
        busy_poll: true,
        ..LoopConfig::default()
    })
    .expect("loop")
}

/// Runs `lp` on a thread of its own, again after each panic that ends
/// `run` (each reported on the channel), until stopped.
fn run_restarting(lp: &MioLoop) -> (thread::JoinHandle<()>, mpsc::Receiver<()>) {
    let (panics_tx, panics) = mpsc::channel();
    let l2 = lp.clone();
    let runner = thread::spawn(move || loop {
        match catch_unwind(AssertUnwindSafe(|| l2.run(|| {}))) {
            Ok(()) => return,
            Err(_) => {
                let _ = panics_tx.send(());
            }
        }
    });
    (runner, panics)
}

#[test]
fn on_a_busy_polling_loop_other_connections_are_served_after_a_handler_panicked() {
    let lp = busy_loop();
    let (backend, addr) = echo_then_panic_listening(&lp);
    let (runner, panics) = run_restarting(&lp);

    // Ordinary messages first: their echoes come back, and the connection
    // is the one the spin reads (it delivered data last).
    let mut peer = echoed(addr, &[b"one", b"two", b"three"]);
    peer.write_all(&raw::data_frame(b"boom")).unwrap();
    panics
        .recv_timeout(DEADLINE)
        .expect("the handler's panic ended a run of the loop");
    // The loop runs again; another connection of the backend is served
    // (its replies are written: a spin that panicked still ended).
    echoed(addr, &[b"after", b"the", b"panic"]);
    assert_eq!(panics.try_iter().count(), 0, "one panic only");

    lp.stop();
    runner.join().expect("loop thread");
    drop(backend);
}

/// Reports each wake token; panics on token 1.
struct WakeThenPanic(mpsc::Sender<u64>);

impl Handler<TcpBackend> for WakeThenPanic {
    fn on_wake(&mut self, b: &TcpBackend, token: u64) {
        if token == 1 {
            // Queued while this dispatch runs: its next round would hand
            // it over, but the panic cuts the dispatch short.
            b.wake(3);
            panic!("handler panics in on_wake (on purpose)");
        }
        let _ = self.0.send(token);
    }
}

#[test]
fn events_queued_after_a_handler_panicked_in_a_dispatch_are_still_dispatched() {
    let lp = MioLoop::new().expect("loop");
    let (woken_tx, woken) = mpsc::channel();
    let backend =
        TcpBackend::new(&lp, BackendConfig::default(), WakeThenPanic(woken_tx)).expect("backend");
    let (runner, panics) = run_restarting(&lp);
    backend.wake(1);
    panics
        .recv_timeout(DEADLINE)
        .expect("the handler's panic ended a run of the loop");
    // What the panicking dispatch left queued, and what comes after it.
    backend.wake(2);
    let mut got: Vec<u64> = (0..2)
        .map(|_| {
            woken
                .recv_timeout(DEADLINE)
                .expect("a wake after the panic is dispatched")
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [2, 3]);
    assert_eq!(panics.try_iter().count(), 0, "one panic only");

    lp.stop();
    runner.join().expect("loop thread");
    drop(backend);
}

/// A peer sends `boom` (whose handler panics after echoing it) and, in the
/// same write, two more messages: once the loop runs again, the messages
/// after the one that panicked are handed out, and later ones too (the
/// read that the panic cut short gave the connection its reader back).
fn later_messages_arrive_after_a_panic_in_on_data(lp: MioLoop) {
    let (backend, addr) = echo_then_panic_listening(&lp);
    let (runner, panics) = run_restarting(&lp);
    let mut peer = echoed(addr, &[b"one"]);
    let mut burst = raw::data_frame(b"boom");
    burst.extend(raw::data_frame(b"after"));
    burst.extend(raw::data_frame(b"it"));
    peer.write_all(&burst).unwrap();
    panics
        .recv_timeout(DEADLINE)
        .expect("the handler's panic ended a run of the loop");
    let echoes = raw::read_n(&mut peer, burst.len());
    assert_eq!(
        echoes, burst,
        "the echoes of `boom` and of the two messages after it"
    );
    // And the connection is read as before.
    for m in [&b"later"[..], b"on"] {
        peer.write_all(&raw::data_frame(m)).unwrap();
        let echo = raw::read_n(&mut peer, raw::data_frame(m).len());
        assert_eq!(echo, raw::data_frame(m), "the echo of {m:?}");
    }
    assert_eq!(panics.try_iter().count(), 0, "one panic only");
    // Every message handed out is counted, the one whose handler panicked
    // too (a read's counts are added when it ends, however it ends).
    let received = || {
        let t = backend.stats().expect("stats").traffic;
        (t.messages_received, t.bytes_received)
    };
    let want = (6, [3, 4, 5, 2, 5, 2].iter().sum());
    assert!(
        common::wait_until(|| received() == want),
        "received {:?}, {want:?} sent",
        received()
    );

    lp.stop();
    runner.join().expect("loop thread");
    drop(backend);
}

#[test]
fn a_connection_whose_handler_panicked_in_on_data_delivers_the_messages_after_it() {
    later_messages_arrive_after_a_panic_in_on_data(MioLoop::new().expect("loop"));
}

#[test]
fn on_a_busy_polling_loop_a_connection_whose_handler_panicked_delivers_the_messages_after_it() {
    later_messages_arrive_after_a_panic_in_on_data(busy_loop());
}

/// The spin reads the hot connection; when it finds the end of the stream
/// or a reset instead of data, the connection ends and its handler hears
/// of it, after the message before it.
#[test]
fn on_a_busy_polling_loop_the_hot_connections_end_of_stream_and_reset_end_it() {
    let lp = busy_loop();
    let side = common::Side::new(&lp, BackendConfig::default());
    let addr = side
        .b
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64, 4),
        )
        .expect("listen");
    let (runner, _panics) = run_restarting(&lp);
    let closed = |n: usize| side.count(|e| matches!(e, common::Ev::Closed(..))) >= n;

    // Each peer's message makes its connection the one the spin reads;
    // then the peer ends the stream (a FIN), or resets it.
    for (i, reset) in [(1, false), (2, true)] {
        let mut peer = raw::connect_with_handshake(addr, 64);
        let _their_handshake = raw::read_n(&mut peer, HANDSHAKE_LEN);
        peer.write_all(&raw::data_frame(b"hot")).unwrap();
        assert!(
            common::wait_until(|| side.count(|e| matches!(e, common::Ev::Data(..))) == i),
            "message {i} handed out: {:?}",
            side.events()
        );
        if reset {
            raw::reset(peer);
        } else {
            peer.shutdown(std::net::Shutdown::Both).unwrap();
            drop(peer);
        }
        assert!(
            common::wait_until(|| closed(i)),
            "connection {i} ended (reset: {reset}): {:?}",
            side.events()
        );
    }

    lp.stop();
    runner.join().expect("loop thread");
}
