//! A netio loop driven from tokio (`tokio_driver::drive`), with no thread
//! of its own: TCP over 127.0.0.1 served to tokio tasks and to the loop's
//! own tasks, timers on the loop clock, on a current-thread and on a
//! multi-thread runtime. Each test bounds its run with a tokio timeout.

use std::sync::Arc;
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

use netio_async::{tokio_driver, AsyncBackend};
use netio_core::mio_loop::MioLoop;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress, Provider};
use netio_tcp::{TcpBackend, TcpProvider};

fn backend(lp: &MioLoop) -> Arc<AsyncBackend<TcpBackend>> {
    Arc::new(
        AsyncBackend::new(|h| TcpProvider::create(lp, BackendConfig::default(), h))
            .expect("backend"),
    )
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `lp` on a thread of its own until it is stopped.
fn run_on_a_thread(lp: &MioLoop) -> thread::JoinHandle<()> {
    let runner = lp.clone();
    thread::spawn(move || netio_core::EventLoop::run(&runner, || {}))
}

fn msg(i: usize) -> Vec<u8> {
    format!("message {i:04}").into_bytes()
}

/// An echo of `n` messages between a loop task (the server) and a tokio
/// task (the client); the threads the server task ran on.
async fn echo(lp: &MioLoop, n: usize) -> Vec<ThreadId> {
    let (server, client) = (backend(lp), backend(lp));
    let params = ConnectionParams::receive(256, 8);
    let addr = server
        .listen(EndpointAddress::localhost(0), params.clone())
        .unwrap();
    let s = Arc::clone(&server);
    let served = server.spawn(async move {
        let mut threads = Vec::new();
        let conn = s.accept().await.expect("accepted");
        while let Some(m) = conn.recv().await {
            threads.push(thread::current().id());
            if conn.send(&m).await.is_err() {
                break;
            }
        }
        threads
    });
    let conn = client.connect(addr, params).await.expect("connected");
    for i in 0..n {
        conn.send(&msg(i)).await.expect("sent");
        assert_eq!(conn.recv().await.expect("an echo"), msg(i));
    }
    conn.close().unwrap();
    served.await
}

#[test]
fn on_a_current_thread_runtime_the_loop_runs_on_the_runtimes_own_thread() {
    let rt = current_thread_runtime();
    let me = thread::current().id();
    rt.block_on(async {
        let lp = MioLoop::new().unwrap();
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        let threads = tokio::time::timeout(Duration::from_secs(30), echo(&lp, 200))
            .await
            .expect("the echo finished within 30 s");
        assert_eq!(threads.len(), 200);
        assert!(
            threads.iter().all(|t| *t == me),
            "the loop's tasks ran on the runtime's thread: no thread of its own"
        );
        driver.abort();
    });
}

#[test]
fn on_a_multi_thread_runtime_tokio_and_loop_tasks_share_the_loop_and_its_timers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let lp = MioLoop::new().unwrap();
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        let lp2 = lp.clone();
        let threads = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), echo(&lp2, 200)).await
        })
        .await
        .unwrap()
        .expect("the echo finished within 30 s");
        assert_eq!(threads.len(), 200);
        // A sleep on the loop's clock, from a tokio task and from a loop
        // task: the driver turns the loop when its timer is due.
        let b = backend(&lp);
        let t = Instant::now();
        b.sleep(Duration::from_millis(20)).await;
        assert!(t.elapsed() >= Duration::from_millis(20));
        let b2 = Arc::clone(&b);
        let t = Instant::now();
        tokio::time::timeout(
            Duration::from_secs(10),
            b.spawn(async move { b2.sleep(Duration::from_millis(20)).await }),
        )
        .await
        .expect("the loop task's sleep ended");
        assert!(t.elapsed() >= Duration::from_millis(20));
        driver.abort();
    });
}

#[test]
fn a_driver_aborted_leaves_a_loop_that_runs_on_a_thread_again() {
    let rt = current_thread_runtime();
    let lp = MioLoop::new().unwrap();
    rt.block_on(async {
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        tokio::time::timeout(Duration::from_secs(30), echo(&lp, 10))
            .await
            .expect("the echo finished within 30 s");
        driver.abort();
        assert!(driver.await.unwrap_err().is_cancelled());
    });
    // The same loop, now on a thread of its own.
    let t = run_on_a_thread(&lp);
    let served = futures::executor::block_on(async {
        let (server, client) = (backend(&lp), backend(&lp));
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let accept = async { server.accept().await.is_some() };
        let connect = async { client.connect(addr, params).await.is_ok() };
        futures::future::join(accept, connect).await
    });
    assert_eq!(served, (true, true));
    netio_core::EventLoop::stop(&lp);
    t.join().unwrap();
}

/// A driver that stops gives the loop back its own wake-ups: a closure
/// posted from another thread to the loop, now run on a thread and asleep
/// in epoll, runs (the waker of the driver's task, gone, would wake
/// nothing).
#[test]
fn a_loop_run_on_a_thread_after_its_driver_stopped_is_woken_by_posts() {
    let rt = current_thread_runtime();
    let lp = MioLoop::new().unwrap();
    rt.block_on(async {
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        // The driver has run and waits.
        tokio::time::sleep(Duration::from_millis(20)).await;
        driver.abort();
        assert!(driver.await.unwrap_err().is_cancelled());
    });
    let t = run_on_a_thread(&lp);
    // Asleep in epoll by now.
    thread::sleep(Duration::from_millis(50));
    let (tx, rx) = std::sync::mpsc::channel();
    lp.post(move || {
        let _ = tx.send(());
    });
    let ran = rx.recv_timeout(Duration::from_secs(10)).is_ok();
    netio_core::EventLoop::stop(&lp);
    if ran {
        t.join().unwrap();
    }
    assert!(ran, "the posted closure ran within 10 s");
}

/// `n` round trips of an echo between two tokio tasks over loopback TCP
/// (`loop_tasks`: two tasks of the netio loop instead), on a
/// current-thread runtime; the times the runtime parked its thread in its
/// reactor meanwhile.
fn parks_during_an_echo(n: usize, loop_tasks: bool) -> u64 {
    let rt = current_thread_runtime();
    let metrics = rt.metrics();
    rt.block_on(async {
        let lp = MioLoop::new().unwrap();
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        let (server, client) = (backend(&lp), backend(&lp));
        let params = ConnectionParams::receive(256, 8);
        let addr = server
            .listen(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        let s = Arc::clone(&server);
        let serve = async move {
            let conn = s.accept().await.expect("accepted");
            while let Some(m) = conn.recv().await {
                if conn.send(&m).await.is_err() {
                    break;
                }
            }
        };
        let c = Arc::clone(&client);
        let ping = async move {
            let conn = c.connect(addr, params).await.expect("connected");
            // Connected and one round trip made before counting.
            conn.send(&msg(0)).await.expect("sent");
            assert_eq!(conn.recv().await.expect("an echo"), msg(0));
            let before = metrics.worker_park_count(0);
            for i in 1..=n {
                conn.send(&msg(i)).await.expect("sent");
                assert_eq!(conn.recv().await.expect("an echo"), msg(i));
            }
            let parks = metrics.worker_park_count(0) - before;
            conn.close().unwrap();
            parks
        };
        let parks = tokio::time::timeout(Duration::from_secs(30), async {
            if loop_tasks {
                let served = server.spawn(serve);
                let parks = client.spawn(ping).await;
                served.await;
                parks
            } else {
                let served = tokio::spawn(serve);
                let parks = tokio::spawn(ping).await.unwrap();
                served.await.unwrap();
                parks
            }
        })
        .await
        .expect("the echo finished within 30 s");
        driver.abort();
        parks
    })
}

/// The peer's answer is usually there as soon as a send is written on
/// loopback: the driver looks for it right after the turn that wrote it
/// (and after a turn that handed readiness over, once the tasks it woke
/// ran), instead of waiting for tokio's reactor, which would park the
/// runtime's thread twice per round trip.
#[test]
fn an_answer_that_is_there_at_once_is_handed_over_without_parking_in_tokios_reactor() {
    const N: usize = 400;
    for loop_tasks in [false, true] {
        let parks = parks_during_an_echo(N, loop_tasks);
        let tasks = if loop_tasks { "loop" } else { "tokio" };
        assert!(
            parks < N as u64 / 2,
            "{tasks} tasks: the runtime parked {parks} times in {N} round trips \
             (about {} when each answer waits for tokio's reactor)",
            2 * N
        );
    }
}
