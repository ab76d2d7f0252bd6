//! Tasks on the loop thread (`AsyncBackend::spawn`), on the simulator and
//! on TCP over 127.0.0.1: where they are polled and dropped, how a message
//! wakes one, their outputs, and a thread-unsafe backend serving them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use futures::executor::block_on;
use netio_async::{AsyncBackend, AsyncHandler};
use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler, RefuseReason, ThreadSafety,
};
use netio_sim::Sim;
use netio_tcp::{TcpConfig, TcpProvider};

/// The async handler, with its `on_wake` calls counted: how often the
/// executor asked the loop for a turn of its own.
struct CountWakes {
    inner: AsyncHandler,
    wakes: Arc<AtomicUsize>,
}

impl<B: Backend + ?Sized> Handler<B> for CountWakes {
    fn on_connection_established(
        &mut self,
        b: &B,
        c: ConnId,
        r: EndpointAddress,
        caps: Capabilities,
    ) {
        self.inner.on_connection_established(b, c, r, caps);
    }
    fn on_connection_refused(&mut self, b: &B, c: ConnId, r: EndpointAddress, why: &RefuseReason) {
        self.inner.on_connection_refused(b, c, r, why);
    }
    fn on_connection_closed(
        &mut self,
        b: &B,
        c: ConnId,
        r: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        self.inner.on_connection_closed(b, c, r, why, keys);
    }
    fn on_data(&mut self, b: &B, c: ConnId, d: &[u8]) {
        self.inner.on_data(b, c, d);
    }
    fn on_sends_completed(&mut self, b: &B, c: ConnId, k: &[u64]) {
        self.inner.on_sends_completed(b, c, k);
    }
    fn on_timer(&mut self, b: &B, t: u64) {
        self.inner.on_timer(b, t);
    }
    fn on_wake(&mut self, b: &B, t: u64) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        self.inner.on_wake(b, t);
    }
}

fn msg(i: usize) -> Vec<u8> {
    format!("message {i:04}").into_bytes()
}

/// Runs `body` with a loop running on another thread (whose id it gets);
/// fails the test if it takes more than 30 s.
fn with_loop(body: impl FnOnce(&MioLoop, ThreadId) + Send + 'static) {
    let lp = MioLoop::new().expect("loop");
    let runner = lp.clone();
    let (id_tx, id_rx) = mpsc::channel();
    let t = thread::spawn(move || {
        let _ = id_tx.send(thread::current().id());
        runner.run(|| {})
    });
    let loop_thread = id_rx.recv().expect("loop thread id");
    let (tx, rx) = mpsc::channel();
    let lp2 = lp.clone();
    let test = thread::spawn(move || {
        body(&lp2, loop_thread);
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

fn tcp_backend(
    lp: &MioLoop,
    safety: ThreadSafety,
    wakes: &Arc<AtomicUsize>,
) -> Arc<AsyncBackend<netio_tcp::TcpBackend>> {
    let config = BackendConfig {
        thread_safety: safety,
        ..BackendConfig::default()
    };
    let wakes = Arc::clone(wakes);
    let b = AsyncBackend::new(|h| {
        let h = CountWakes { inner: h, wakes };
        TcpProvider::create_with(lp, config, TcpConfig::default(), h)
    })
    .expect("backend");
    Arc::new(b)
}

/// The threads tasks were polled on, in order.
type Threads = Arc<Mutex<Vec<ThreadId>>>;

/// An echo server and a client that sends `n` messages one after another,
/// each after the echo of the one before, as tasks of their backends; the
/// echoes the client got, and the threads the tasks were polled on.
fn echo_tasks<B: Backend + Clone + 'static>(
    server: &Arc<AsyncBackend<B>>,
    client: &Arc<AsyncBackend<B>>,
    addr: EndpointAddress,
    params: ConnectionParams,
    n: usize,
) -> (netio_async::Task<Vec<Vec<u8>>>, Threads) {
    let threads = Arc::new(Mutex::new(Vec::new()));
    let (s, t) = (Arc::clone(server), Arc::clone(&threads));
    server
        .spawn(async move {
            let conn = s.accept().await.expect("accepted");
            while let Some(m) = conn.recv().await {
                t.lock().unwrap().push(thread::current().id());
                if conn.send(&m).await.is_err() {
                    break;
                }
            }
        })
        .detach();
    let (c, t) = (Arc::clone(client), Arc::clone(&threads));
    let task = client.spawn(async move {
        let conn = c.connect(addr, params).await.expect("connected");
        let mut echoes = Vec::new();
        for i in 0..n {
            conn.send(&msg(i)).await.expect("sent");
            echoes.push(conn.recv().await.expect("echo"));
            t.lock().unwrap().push(thread::current().id());
        }
        echoes
    });
    (task, threads)
}

#[test]
fn over_tcp_tasks_are_polled_on_the_loop_thread() {
    with_loop(|lp, loop_thread| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let server = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let client = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let (task, threads) = echo_tasks(&server, &client, addr, params, 500);
        let echoes = block_on(task);
        assert_eq!(echoes, (0..500).map(msg).collect::<Vec<_>>());
        let threads = threads.lock().unwrap();
        assert_eq!(threads.len(), 1000);
        assert!(
            threads.iter().all(|t| *t == loop_thread),
            "every poll ran on the loop thread"
        );
        assert!(wakes.load(Ordering::SeqCst) >= 2, "tasks run from on_wake");
    });
}

/// Counts the polls of the future it wraps.
struct CountPolls<F> {
    inner: std::pin::Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: std::future::Future> std::future::Future for CountPolls<F> {
    type Output = F::Output;
    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        self.inner.as_mut().poll(cx)
    }
}

#[test]
fn over_tcp_a_task_reading_a_burst_of_messages_is_polled_once_for_many_of_them() {
    with_loop(|lp, _| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let server = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let client = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let params = ConnectionParams::receive(256, 256);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let polls = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&server);
        let received = server.spawn(CountPolls {
            inner: Box::pin(async move {
                let conn = s.accept().await.expect("accepted");
                let mut got = 0;
                while got < 1000 {
                    conn.recv().await.expect("a message");
                    got += 1;
                }
                got
            }),
            polls: Arc::clone(&polls),
        });
        let c = Arc::clone(&client);
        let sent = client.spawn(async move {
            let conn = c.connect(addr, params).await.expect("connected");
            let all: Vec<Vec<u8>> = (0..1000).map(msg).collect();
            for chunk in all.chunks(100) {
                let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
                conn.send_batch(&refs).await.expect("the batch completed");
            }
        });
        block_on(sent);
        assert_eq!(block_on(received), 1000);
        // Each batch of 100 leaves in one write; the messages of one read
        // are dispatched together, and the task is polled after them.
        let n = polls.load(Ordering::SeqCst);
        assert!(n < 500, "{n} polls for 1,000 messages");
    });
}

#[test]
fn over_tcp_tasks_serve_a_backend_made_for_the_loop_thread_alone() {
    with_loop(|lp, _| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let server = tcp_backend(lp, ThreadSafety::Unsafe, &wakes);
        let client = tcp_backend(lp, ThreadSafety::Unsafe, &wakes);
        let params = ConnectionParams::receive(256, 8);
        // Listening and connecting off the loop thread is refused by such
        // a backend, so a task does it.
        let (s, p) = (Arc::clone(&server), params.clone());
        let addr = block_on(
            server
                .spawn(async move { s.listen(EndpointAddress::localhost(0), p).expect("listen") }),
        );
        let (task, _) = echo_tasks(&server, &client, addr, params, 100);
        assert_eq!(block_on(task), (0..100).map(msg).collect::<Vec<_>>());
    });
}

/// Records the thread it is dropped on.
struct DropProbe(Arc<Mutex<Option<ThreadId>>>);

impl Drop for DropProbe {
    fn drop(&mut self) {
        *self.0.lock().unwrap() = Some(thread::current().id());
    }
}

#[test]
fn over_tcp_a_task_whose_handle_is_dropped_is_dropped_on_the_loop_thread() {
    with_loop(|lp, loop_thread| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let b = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let dropped = Arc::new(Mutex::new(None));
        let probe = DropProbe(Arc::clone(&dropped));
        let polled = Arc::new(AtomicUsize::new(0));
        let p = Arc::clone(&polled);
        let task = b.spawn(async move {
            let _probe = probe;
            p.fetch_add(1, Ordering::SeqCst);
            futures::future::pending::<()>().await;
        });
        let end = Instant::now() + Duration::from_secs(10);
        while polled.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < end, "the task was never polled");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(b.tasks(), 1);
        assert!(!task.is_finished());
        drop(task);
        while dropped.lock().unwrap().is_none() {
            assert!(Instant::now() < end, "the task was never dropped");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*dropped.lock().unwrap(), Some(loop_thread));
        assert_eq!(b.tasks(), 0);
        assert_eq!(polled.load(Ordering::SeqCst), 1, "not polled again");
    });
}

#[test]
fn over_tcp_a_task_that_keeps_waking_itself_does_not_hold_the_loop() {
    // The spinning task stops when the sleep has resolved, or after
    // LIMIT polls (seconds of them): a loop held by the spinner would run
    // the sleep's timer only after the spinner ended, at LIMIT. (A fixed
    // small count raced the sleep: on a fast machine 100,000 polls fit in
    // its 5 ms.)
    const LIMIT: usize = 50_000_000;
    with_loop(|lp, _| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let b = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        let spins = Arc::new(AtomicUsize::new(0));
        let slept = Arc::new(AtomicBool::new(false));
        let (s, done) = (Arc::clone(&spins), Arc::clone(&slept));
        let spinner = b.spawn(async move {
            // Wakes itself at every poll.
            while s.load(Ordering::SeqCst) < LIMIT && !done.load(Ordering::SeqCst) {
                s.fetch_add(1, Ordering::SeqCst);
                let mut yielded = false;
                futures::future::poll_fn(|cx| {
                    if yielded {
                        std::task::Poll::Ready(())
                    } else {
                        yielded = true;
                        cx.waker().wake_by_ref();
                        std::task::Poll::Pending
                    }
                })
                .await;
            }
        });
        // Meanwhile a sleep on the same loop resolves.
        let b2 = Arc::clone(&b);
        let done = Arc::clone(&slept);
        block_on(b.spawn(async move {
            b2.sleep(Duration::from_millis(5)).await;
            done.store(true, Ordering::SeqCst);
        }));
        let at_sleep = spins.load(Ordering::SeqCst);
        assert!(
            at_sleep < LIMIT,
            "the sleep resolved after {at_sleep} polls of the spinning task (limit {LIMIT})"
        );
        block_on(spinner);
        assert!(
            spins.load(Ordering::SeqCst) < LIMIT,
            "the spinner saw the sleep end"
        );
    });
}

/// One echo scenario on the simulator with tasks on the loop: the trace
/// and the echoes.
fn sim_echo(seed: u64) -> (String, Vec<Vec<u8>>, usize) {
    let sim = Sim::with_seed(seed);
    sim.enable_trace(true);
    let (hs, hc) = (sim.next_host(), sim.next_host());
    let wakes = Arc::new(AtomicUsize::new(0));
    let make = |host: &netio_sim::SimHost| {
        let wakes = Arc::clone(&wakes);
        Arc::new(
            AsyncBackend::new(|h| {
                host.backend(BackendConfig::default(), CountWakes { inner: h, wakes })
            })
            .expect("backend"),
        )
    };
    let (server, client) = (make(&hs), make(&hc));
    let params = ConnectionParams::receive(64, 8);
    let addr = server
        .listen(EndpointAddress::new(hs.ip(), 0), params.clone())
        .unwrap();
    let (task, _) = echo_tasks(&server, &client, addr, params, 50);
    assert!(
        sim.run_until(Duration::from_secs(10), || task.is_finished()),
        "the client task finished in virtual time"
    );
    let echoes = block_on(task);
    (sim.trace(), echoes, wakes.load(Ordering::SeqCst))
}

#[test]
fn on_the_simulator_tasks_run_inside_the_simulation_with_no_executor_to_drive() {
    let (_, echoes, wakes) = sim_echo(7);
    assert_eq!(echoes, (0..50).map(msg).collect::<Vec<_>>());
    assert!(wakes >= 100, "{wakes} runs of the tasks for 100 messages");
}

#[test]
fn on_the_simulator_a_scenario_of_tasks_run_twice_with_one_seed_gives_the_same_trace() {
    let (a, ea, _) = sim_echo(11);
    let (b, eb, _) = sim_echo(11);
    assert!(a.lines().count() > 100, "the trace records the run:\n{a}");
    assert!(a == b, "same seed, same trace");
    assert_eq!(ea, eb);
}

#[test]
fn over_tcp_a_task_sends_batches_that_arrive_whole_and_in_order() {
    with_loop(|lp, _| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let config = BackendConfig {
            send_queue_depth: 8,
            ..BackendConfig::default()
        };
        let make = |lp: &MioLoop| {
            let wakes = Arc::clone(&wakes);
            Arc::new(
                AsyncBackend::new(|h| {
                    let h = CountWakes { inner: h, wakes };
                    TcpProvider::create_with(lp, config.clone(), TcpConfig::default(), h)
                })
                .expect("backend"),
            )
        };
        let (server, client) = (make(lp), make(lp));
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let s = Arc::clone(&server);
        let received = server.spawn(async move {
            let conn = s.accept().await.expect("accepted");
            let mut got = Vec::new();
            while got.len() < 1000 {
                got.push(conn.recv().await.expect("a message"));
            }
            got
        });
        let c = Arc::clone(&client);
        let sent = client.spawn(async move {
            let conn = c.connect(addr, params).await.expect("connected");
            let all: Vec<Vec<u8>> = (0..1000).map(msg).collect();
            for chunk in all.chunks(100) {
                let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
                conn.send_batch(&refs).await.expect("the batch completed");
            }
        });
        block_on(sent);
        assert_eq!(block_on(received), (0..1000).map(msg).collect::<Vec<_>>());
    });
}

#[test]
fn over_tcp_a_batch_the_backend_refuses_fails_with_the_refusal_and_sends_nothing() {
    with_loop(|lp, _| {
        let wakes = Arc::new(AtomicUsize::new(0));
        let server = tcp_backend(lp, ThreadSafety::Safe, &wakes);
        // Made for the loop thread alone, used from this one.
        let client = tcp_backend(lp, ThreadSafety::Unsafe, &wakes);
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let c = Arc::clone(&client);
        let conn = block_on(
            client.spawn(async move { c.connect(addr, params).await.expect("connected") }),
        );
        let (a, b) = (msg(0), msg(1));
        let refs: [&[u8]; 2] = [&a, &b];
        let r = block_on(conn.send_batch(&refs));
        assert!(
            matches!(
                r,
                Err(netio_async::SendFailed::Refused(
                    netio_core::SendError::WrongThread
                ))
            ),
            "{r:?}"
        );
        // A marker sent afterwards from the loop thread, where the backend
        // allows it, is the first message the server gets: nothing of the
        // refused batch went out before it.
        let marker = b"marker".to_vec();
        let m = marker.clone();
        block_on(client.spawn(async move {
            conn.send(&m).await.expect("the marker is sent");
            // Dropped here, on the loop thread, where its backend lets it
            // close.
            drop(conn);
        }));
        let accepted = block_on(server.accept()).expect("accepted");
        assert_eq!(block_on(accepted.recv()), Some(marker));
    });
}

/// Sets its flag when dropped.
struct DropFlag(Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// An echo server of tasks on `host`: a task accepting, one per
/// connection echoing; each task holds the backend (as an application's
/// tasks do) and a drop flag, and counts its polls.
fn sim_echo_server(
    host: &netio_sim::SimHost,
    port: u16,
    dropped: &Arc<std::sync::atomic::AtomicBool>,
    polls: &Arc<AtomicUsize>,
) -> Arc<AsyncBackend<netio_sim::SimBackend>> {
    let server = Arc::new(
        AsyncBackend::new(|h| host.backend(BackendConfig::default(), h)).expect("backend"),
    );
    server
        .listen(
            EndpointAddress::new(host.ip(), port),
            ConnectionParams::receive(64, 8),
        )
        .unwrap();
    let (s, flag, polls) = (
        Arc::clone(&server),
        DropFlag(Arc::clone(dropped)),
        Arc::clone(polls),
    );
    server
        .spawn(async move {
            let _flag = flag;
            while let Some(conn) = s.accept().await {
                polls.fetch_add(1, Ordering::SeqCst);
                let polls = Arc::clone(&polls);
                let _held = Arc::clone(&s);
                s.spawn(async move {
                    let _held = _held;
                    while let Some(m) = conn.recv().await {
                        polls.fetch_add(1, Ordering::SeqCst);
                        if conn.send(&m).await.is_err() {
                            break;
                        }
                    }
                })
                .detach();
            }
        })
        .detach();
    server
}

/// Crash and restart on the simulator: the tasks of a crashed host are
/// dropped as the crash happens (they hold their backend, which alone
/// would keep them in memory for ever) and never polled again; the
/// restart hook spawns new ones on a new backend, which serve a client;
/// the whole run is deterministic for a seed.
fn crash_and_restart(seed: u64) -> String {
    use std::sync::atomic::AtomicBool;
    let sim = Sim::with_seed(seed);
    sim.enable_trace(true);
    let (hs, hc) = (sim.next_host(), sim.next_host());
    let first_dropped = Arc::new(AtomicBool::new(false));
    let first_polls = Arc::new(AtomicUsize::new(0));
    let first = sim_echo_server(&hs, 7000, &first_dropped, &first_polls);
    let restarted = Arc::new(Mutex::new(None));
    let (r, second_dropped) = (Arc::clone(&restarted), Arc::new(AtomicBool::new(false)));
    let d = Arc::clone(&second_dropped);
    hs.on_restart(move |h| {
        let polls = Arc::new(AtomicUsize::new(0));
        *r.lock().unwrap() = Some(sim_echo_server(h, 7000, &d, &polls));
    });
    let client =
        Arc::new(AsyncBackend::new(|h| hc.backend(BackendConfig::default(), h)).expect("backend"));
    let addr = EndpointAddress::new(hs.ip(), 7000);
    let params = ConnectionParams::receive(64, 8);
    // One echo from the first life, then the crash with the connection open.
    let c = Arc::clone(&client);
    let p = params.clone();
    let before = client.spawn(async move {
        let conn = c.connect(addr, p).await.expect("connected");
        conn.send(b"one").await.expect("sent");
        let echo = conn.recv().await;
        (conn, echo)
    });
    assert!(sim.run_until(Duration::from_secs(5), || before.is_finished()));
    let (old_conn, echo) = block_on(before);
    assert_eq!(echo.as_deref(), Some(&b"one"[..]));
    assert_eq!(first.tasks(), 2, "the acceptor and one echo task");
    let polls = first_polls.load(Ordering::SeqCst);
    sim.crash(hs.ip());
    assert!(
        first_dropped.load(Ordering::SeqCst),
        "the crash dropped the acceptor task"
    );
    assert_eq!(first.tasks(), 0, "every task of the crashed host is gone");
    sim.run_for(Duration::from_millis(50));
    // The client's connection heard the reset.
    assert!(old_conn.close_reason().is_some());
    sim.restart(hs.ip());
    let second = restarted.lock().unwrap().clone().expect("the hook ran");
    assert_eq!(second.tasks(), 1, "the new life's acceptor");
    let c = Arc::clone(&client);
    let after = client.spawn(async move {
        let conn = c.connect(addr, params).await.expect("connected again");
        conn.send(b"two").await.expect("sent");
        conn.recv().await
    });
    assert!(sim.run_until(Duration::from_secs(5), || after.is_finished()));
    assert_eq!(block_on(after).as_deref(), Some(&b"two"[..]));
    assert_eq!(
        first_polls.load(Ordering::SeqCst),
        polls,
        "nothing of the first life ran after the crash"
    );
    assert!(!second_dropped.load(Ordering::SeqCst));
    let trace = sim.trace();
    // The end of the world frees the new life's tasks too.
    sim.shut_down();
    assert!(second_dropped.load(Ordering::SeqCst));
    assert_eq!(second.tasks(), 0);
    trace
}

#[test]
fn on_the_simulator_a_crash_drops_the_hosts_tasks_and_a_restart_hook_spawns_new_ones() {
    let a = crash_and_restart(3);
    assert!(a.contains("fault crash"), "{a}");
    assert_eq!(a, crash_and_restart(3), "same seed, same trace");
}
