//! The async API on TCP over 127.0.0.1: the real loop runs on its own
//! thread, the futures on the test's (`futures::executor::block_on`), so
//! the backends are thread-safe. Each test runs under a watchdog.

use std::future::Future;
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
        let (got, outcomes) = block_on(join(receive, send));
        assert!(outcomes.iter().all(|o| o.is_ok()), "{outcomes:?}");
        // join_all polls its futures in order first: they arrive in that
        // order.
        assert_eq!(got, all, "each message once, in order");
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

/// Waits `d` of wall time inside an async block (a thread sleeps, the
/// executor does not).
async fn pause_for(d: Duration) {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    thread::spawn(move || {
        thread::sleep(d);
        let _ = tx.send(());
    });
    let _ = rx.await;
}

/// A server and a connected client; the server's side of the connection
/// and the client's.
fn connected(
    server: &AsyncBackend<TcpBackend>,
    client: &AsyncBackend<TcpBackend>,
) -> (
    netio_async::AsyncConn<TcpBackend>,
    netio_async::AsyncConn<TcpBackend>,
) {
    let params = ConnectionParams::receive(256, 8);
    let addr = server
        .listen(EndpointAddress::localhost(0), params.clone())
        .unwrap();
    block_on(join(
        async { server.accept().await.expect("accepted") },
        async { client.connect(addr, params.clone()).await.unwrap() },
    ))
}

/// Six sends on a queue of one, polled first in order 0..6 and then
/// always in reverse: they arrive in the order 0..6.
#[test]
fn over_tcp_sends_on_one_connection_leave_in_the_order_their_futures_were_first_polled() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend_with_depth(lp, 1));
        let (sconn, conn) = connected(&server, &client);
        let all: Vec<Vec<u8>> = (0..6).map(msg).collect();
        let mut futs: Vec<_> = all.iter().map(|m| Box::pin(conn.send(m))).collect();
        let mut done = vec![false; futs.len()];
        block_on(futures::future::poll_fn(|cx| {
            for (i, f) in futs.iter_mut().enumerate() {
                done[i] = f.as_mut().poll(cx).is_ready();
            }
            std::task::Poll::Ready(())
        }));
        block_on(futures::future::poll_fn(|cx| {
            for (i, f) in futs.iter_mut().enumerate().rev() {
                if !done[i] {
                    if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                        r.expect("completed");
                        done[i] = true;
                    }
                }
            }
            if done.iter().all(|d| *d) {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        }));
        let got: Vec<Vec<u8>> = block_on(async {
            let mut got = Vec::new();
            while got.len() < 6 {
                got.push(sconn.recv().await.expect("open"));
            }
            got
        });
        assert_eq!(got, all, "in the order first polled");
    });
}

/// With a mark of 4, the reading side holds at most 4 unread messages:
/// the provider stops delivering until some are read.
#[test]
fn over_tcp_a_connections_own_high_water_mark_holds_that_many_unread() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let (sconn, conn) = connected(&server, &client);
        sconn.set_high_water(4).unwrap();
        let all: Vec<Vec<u8>> = (0..100).map(msg).collect();
        block_on(async {
            for o in futures::future::join_all(all.iter().map(|m| conn.send(m))).await {
                o.expect("completed into the kernel's buffers");
            }
            pause_for(Duration::from_millis(200)).await;
        });
        assert_eq!(sconn.unread(), 4, "paused at the mark");
        let got: Vec<Vec<u8>> = block_on(async {
            let mut got = Vec::new();
            while got.len() < all.len() {
                got.push(sconn.recv().await.expect("open"));
                assert!(sconn.unread() <= 4);
            }
            got
        });
        assert_eq!(got, all);
    });
}

/// A paused connection delivers nothing, however little is unread, until
/// `resume`.
#[test]
fn over_tcp_an_explicit_pause_holds_everything_until_resume() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let (sconn, conn) = connected(&server, &client);
        sconn.pause().unwrap();
        let all: Vec<Vec<u8>> = (0..100).map(msg).collect();
        block_on(async {
            for o in futures::future::join_all(all.iter().map(|m| conn.send(m))).await {
                o.expect("completed into the kernel's buffers");
            }
            pause_for(Duration::from_millis(200)).await;
        });
        assert_eq!(sconn.unread(), 0, "nothing delivered while paused");
        sconn.resume().unwrap();
        let got: Vec<Vec<u8>> = block_on(async {
            let mut got = Vec::new();
            while got.len() < all.len() {
                got.push(sconn.recv().await.expect("open"));
            }
            got
        });
        assert_eq!(got, all);
    });
}

#[test]
fn over_tcp_send_parts_sends_a_header_and_its_parts_as_one_message() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let (sconn, conn) = connected(&server, &client);
        block_on(conn.send_parts(b"hdr:", &[b"one,", b"two,", b"three"])).unwrap();
        assert_eq!(block_on(sconn.recv()), Some(b"hdr:one,two,three".to_vec()));
    });
}

/// A session both ways over TCP: the client's messages reach the server's
/// application once each, in order; the server's reach the client's,
/// published and sent to it alike; a message beyond the server's mark for
/// the session is a gap at the client.
#[test]
fn over_tcp_a_session_carries_messages_both_ways_and_shows_a_gap_past_the_mark() {
    use futures::executor::LocalPool;
    use netio_async::session::{Received, SessionClient, SessionConfig, SessionServer};
    use std::sync::Arc;

    with_loop(|lp| {
        let session = SessionConfig {
            high_water: 8,
            ..SessionConfig::default()
        };
        let server_b = Arc::new(backend(lp));
        let addr = server_b
            .listen(
                EndpointAddress::localhost(0),
                ConnectionParams::receive(256, 16),
            )
            .unwrap();
        let server = Arc::new(SessionServer::with_config(server_b.clone(), &session));
        let client_b = Arc::new(backend(lp));
        let client = Arc::new(SessionClient::new(
            client_b.clone(),
            addr,
            5,
            SessionConfig::default(),
        ));
        // The sessions run as tasks on the loop thread; the test reads
        // them from its own.
        let mut pool = LocalPool::new();
        let (s, c) = (server.clone(), client.clone());
        server_b.spawn(async move { s.run().await }).detach();
        client_b.spawn(async move { c.run().await }).detach();
        // Polls until `done`, the loop's clock moving on in between.
        let wait = |pool: &mut LocalPool, done: &dyn Fn() -> bool| {
            let b = client_b.clone();
            pool.run_until(async move {
                for _ in 0..20_000 {
                    if done() {
                        return true;
                    }
                    b.sleep(Duration::from_millis(1)).await;
                }
                false
            })
        };
        assert!(wait(&mut pool, &|| server.sessions() == vec![5]));
        for i in 0..20 {
            assert!(client.send(msg(i)).is_ok());
        }
        assert_eq!(server.publish(msg(100)), 1);
        assert_eq!(server.send_to(5, msg(101)).map(|r| r.is_ok()), Some(true));
        let mut from_client = Vec::new();
        let mut from_server = Vec::new();
        let got_all = |fc: &mut Vec<Vec<u8>>, fs: &mut Vec<Received>, pool: &mut LocalPool| {
            pool.run_until(async {
                while fc.len() < 20 {
                    let (id, r) = server.recv().await;
                    assert_eq!(id, 5);
                    match r {
                        Received::Message { data, .. } => fc.push(data),
                        gap => panic!("no message was dropped: {gap:?}"),
                    }
                }
                while fs.len() < 2 {
                    fs.push(client.recv().await);
                }
            })
        };
        got_all(&mut from_client, &mut from_server, &mut pool);
        assert_eq!(from_client, (0..20).map(msg).collect::<Vec<_>>());
        assert_eq!(
            from_server,
            vec![
                Received::Message {
                    seq: 1,
                    data: msg(100)
                },
                Received::Message {
                    seq: 2,
                    data: msg(101)
                },
            ]
        );
        assert!(wait(&mut pool, &|| client.acknowledged() == 20
            && server.held(5) == Some(0)));
        // Twelve published at once, before anything can be acknowledged:
        // the session holds its mark, the rest is a gap at the client.
        let taken = (200..212).filter(|&i| server.publish(msg(i)) == 1).count();
        assert_eq!(taken, 8);
        assert_eq!(server.dropped(5), Some(4));
        let rest = pool.run_until(async {
            let mut rest = Vec::new();
            while rest.len() < 9 {
                rest.push(client.recv().await);
            }
            rest
        });
        for (k, r) in rest[..8].iter().enumerate() {
            assert_eq!(
                r,
                &Received::Message {
                    seq: 3 + k as u64,
                    data: msg(200 + k)
                }
            );
        }
        assert_eq!(
            rest[8],
            Received::Gap {
                first: 11,
                last: 14
            }
        );
    });
}

#[test]
fn over_tcp_send_region_sends_region_slices_without_a_copy_resolving_on_completion() {
    use netio_core::MemoryRegion;
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let region = MemoryRegion::new(4096);
        for i in 0..64 {
            region.write(i * 64, &[i as u8; 64]).unwrap();
        }
        let receive = async {
            let conn = server.accept().await.expect("accepted");
            let mut got = Vec::new();
            while let Some(m) = conn.recv().await {
                got.push(m);
            }
            got
        };
        let send = async {
            let conn = client
                .connect(addr, params.clone().with_zero_copy(region.clone()))
                .await
                .expect("connected");
            for i in 0..64 {
                // Two chunks of the region per message, behind a header.
                let slices = [
                    region.slice(i * 64, 32).unwrap(),
                    region.slice(((i + 1) % 64) * 64, 16).unwrap(),
                ];
                conn.send_region(&[0xAB], &slices).await.expect("completed");
            }
            conn.close().unwrap();
        };
        let (got, ()) = block_on(join(receive, send));
        let expected: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                let mut m = vec![0xAB];
                m.extend_from_slice(&[i as u8; 32]);
                m.extend_from_slice(&[((i + 1) % 64) as u8; 16]);
                m
            })
            .collect();
        assert_eq!(got, expected);
    });
}

/// `recv_into` reads each message into the one buffer it is given, sizes
/// from empty to the receive buffer's, and returns `false` once the peer
/// closed and everything was read.
#[test]
fn over_tcp_recv_into_reads_each_message_into_one_buffer_and_ends_with_the_connection() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend(lp));
        let (sconn, conn) = connected(&server, &client);
        let sizes = [5usize, 0, 256, 1, 17];
        for (i, n) in sizes.iter().enumerate() {
            block_on(conn.send(&vec![i as u8; *n])).expect("completed");
        }
        conn.close().unwrap();
        let mut buf = Vec::new();
        let mut got = Vec::new();
        while block_on(sconn.recv_into(&mut buf)) {
            got.push(buf.clone());
        }
        let want: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| vec![i as u8; *n])
            .collect();
        assert_eq!(got, want);
    });
}

/// `feed` waits only for room in the send queue (four sends here), not
/// for completions; `flush` waits until every send made completed, so a
/// close right after it cancels none of them: all 100 arrive, in order.
/// With nothing in flight `flush` resolves at once.
#[test]
fn over_tcp_feed_waits_for_room_only_and_flush_for_every_completion() {
    with_loop(|lp| {
        let (server, client) = (backend(lp), backend_with_depth(lp, 4));
        let (sconn, conn) = connected(&server, &client);
        block_on(async {
            for i in 0..100 {
                conn.feed(&msg(i)).await.expect("made");
            }
            conn.flush().await.expect("every send completed");
        });
        block_on(conn.flush()).expect("nothing in flight");
        conn.close().unwrap();
        let mut got = Vec::new();
        while let Some(m) = block_on(sconn.recv()) {
            got.push(m);
        }
        assert_eq!(got, (0..100).map(msg).collect::<Vec<_>>());
    });
}
