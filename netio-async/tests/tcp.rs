//! The async API on TCP over 127.0.0.1: the real loop runs on its own
//! thread, the futures on the test's (`futures::executor::block_on`), so
//! the backends are thread-safe. Each test runs under a watchdog.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use futures::executor::block_on;
use futures::future::join;
use netio_async::{AsyncBackend, ConnectError};
use netio_core::mio_loop::MioLoop;
use netio_core::{
    BackendConfig, CloseReason, ConnectionParams, EndpointAddress, EventLoop, RefuseReason,
    ThreadSafety,
};
use netio_tcp::{TcpBackend, TcpConfig, TcpProvider};

/// Runs `body` with a loop running on another thread; fails the test if
/// it takes more than 30 s.
fn with_loop(body: impl FnOnce(&MioLoop) + Send + 'static) {
    let lp = MioLoop::new().expect("loop");
    let runner = lp.clone();
    let t = thread::spawn(move || runner.run(|| {}));
    let (tx, rx) = mpsc::channel();
    let lp2 = lp.clone();
    let test = thread::spawn(move || {
        body(&lp2);
        let _ = tx.send(());
    });
    let finished = rx.recv_timeout(Duration::from_secs(30));
    lp.stop();
    let _ = t.join();
    if finished.is_err() {
        match test.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => panic!("the test did not finish within 30 s"),
        }
    }
    test.join().expect("test body");
}

fn backend(lp: &MioLoop) -> AsyncBackend<TcpBackend> {
    let config = BackendConfig {
        thread_safety: ThreadSafety::Safe,
        ..BackendConfig::default()
    };
    AsyncBackend::new(|h| TcpProvider::create_with(lp, config, TcpConfig::default(), h))
        .expect("backend")
}

fn msg(i: usize) -> Vec<u8> {
    format!("message {i:04}").into_bytes()
}

#[test]
fn over_tcp_sends_complete_and_arrive_in_order_and_a_close_ends_the_peers_stream() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let receive = async {
            let conn = server.accept().await.expect("accepted");
            let mut got = Vec::new();
            while let Some(m) = conn.recv().await {
                got.push(m);
            }
            (got, conn.close_reason())
        };
        let send = async {
            let conn = client
                .connect(addr, params.clone())
                .await
                .expect("connected");
            for i in 0..200 {
                conn.send(&msg(i)).await.expect("completed");
            }
            conn.close().unwrap();
        };
        let ((got, reason), ()) = block_on(join(receive, send));
        assert_eq!(got, (0..200).map(msg).collect::<Vec<_>>());
        assert_eq!(reason, Some(CloseReason::PeerClosed));
    });
}

#[test]
fn over_tcp_connecting_where_nothing_listens_fails_with_refused() {
    with_loop(|lp| {
        let client = backend(lp);
        // A port that was free a moment ago.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let r = block_on(client.connect(
            EndpointAddress::localhost(port),
            ConnectionParams::receive(64, 4),
        ));
        assert!(
            matches!(r, Err(ConnectError::Refused(RefuseReason::Refused))),
            "{r:?}"
        );
    });
}

fn backend_with_depth(lp: &MioLoop, depth: usize) -> AsyncBackend<TcpBackend> {
    let config = BackendConfig {
        send_queue_depth: depth,
        ..BackendConfig::default()
    };
    AsyncBackend::new(|h| TcpProvider::create_with(lp, config, TcpConfig::default(), h))
        .expect("backend")
}

#[test]
fn over_tcp_sends_wait_for_room_instead_of_failing_when_the_queue_is_full() {
    with_loop(|lp| {
        let server = backend(lp);
        let client = backend_with_depth(lp, 2);
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let all: Vec<Vec<u8>> = (0..100).map(msg).collect();
        let receive = async {
            let conn = server.accept().await.expect("accepted");
            let mut got = Vec::new();
            while got.len() < all.len() {
                got.push(conn.recv().await.expect("open"));
            }
            got
        };
        let send = async {
            let conn = client.connect(addr, params.clone()).await.unwrap();
            futures::future::join_all(all.iter().map(|m| conn.send(m))).await
        };
        let (mut got, outcomes) = block_on(join(receive, send));
        assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
        got.sort();
        assert_eq!(got, all, "each message once");
    });
}

#[test]
fn over_tcp_a_close_fails_the_sends_that_did_not_complete() {
    with_loop(|lp| {
        let server = backend(lp);
        let client = backend(lp);
        let big = 64 * 1024;
        let params = ConnectionParams::receive(big + 64, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let payload = vec![7u8; big];
        let (server_conn, conn) = block_on(join(
            async { server.accept().await.expect("accepted") },
            async { client.connect(addr, params.clone()).await.unwrap() },
        ));
        // The server never reads: it pauses, the kernel buffers fill, and
        // most of 400 × 64 KiB cannot complete.
        let sends = futures::future::join_all((0..400).map(|_| conn.send(&payload)));
        let closer = async {
            // Let the sends run into the full connection, then close.
            let (tx, rx) = futures::channel::oneshot::channel::<()>();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(300));
                let _ = tx.send(());
            });
            let _ = rx.await;
            conn.close().unwrap();
        };
        let (outcomes, ()) = block_on(join(sends, closer));
        let ok = outcomes.iter().filter(|o| o.is_ok()).count();
        let failed: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
        assert!(
            !failed.is_empty(),
            "the close failed the sends still waiting"
        );
        assert!(
            failed.iter().all(|e| matches!(
                e,
                netio_async::SendFailed::Cancelled(CloseReason::Local)
                    | netio_async::SendFailed::Closed(CloseReason::Local)
            )),
            "{failed:?}"
        );
        assert_eq!(ok + failed.len(), 400);
        drop(server_conn);
    });
}
