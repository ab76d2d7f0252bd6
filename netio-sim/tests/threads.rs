//! The loop drives the world from any thread, thread-unsafe backends keep
//! to the driver thread, and misuse fails with advice.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::time::Duration;

use common::{connect, full_params, listen, node, Event};
use netio_core::{Backend, BackendConfig, EventLoop, SendError, Signal, ThreadSafety, Timer};
use netio_sim::{Sim, SimBackend};

#[test]
fn loop_run_drives_every_host_and_waits_for_other_threads_when_idle() {
    let sim = Sim::with_seed(31);
    // The server stops its loop when "bye" arrives.
    let server = node(
        &sim,
        BackendConfig::default(),
        Some(Box::new(|b: &SimBackend, e: &Event| {
            if let Event::Data { data, .. } = e {
                if data == b"bye" {
                    b.event_loop().stop();
                }
            }
        })),
    );
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let lp = server.host.event_loop().clone();
    let (ready, wait_ready) = mpsc::channel();
    let runner = std::thread::spawn(move || {
        lp.run(|| {
            assert!(lp.on_loop_thread(), "init runs on the loop thread");
            ready.send(()).unwrap();
        });
    });
    wait_ready.recv_timeout(Duration::from_secs(10)).unwrap();
    // The world is idle and the runner blocked; calls from here wake it.
    let conn = client
        .b
        .open_active_endpoint(addr, full_params(64, 4))
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while client.log.established().is_empty() {
        assert!(std::time::Instant::now() < deadline, "never established");
        std::thread::yield_now();
    }
    client.b.send_data_copy(conn, &[b"bye"], &[], 1).unwrap();
    runner.join().expect("run returned after stop");
    assert_eq!(server.log.data().len(), 1);
    assert!(!server.host.event_loop().on_loop_thread());
}

#[test]
fn thread_unsafe_backends_accept_calls_from_the_driver_thread_only() {
    let sim = Sim::with_seed(32);
    let unsafe_cfg = BackendConfig::with_thread_safety(ThreadSafety::Unsafe);
    let server = node(&sim, unsafe_cfg.clone(), None);
    let client = node(&sim, unsafe_cfg, None);
    let addr = listen(&server, full_params(64, 4));
    // This thread created the world and drives it: calls work.
    let (conn, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    client.b.send_data_copy(conn, &[b"ok"], &[], 1).unwrap();
    let b = client.b.clone();
    let off = std::thread::spawn(move || b.send_data_copy(conn, &[b"no"], &[], 2))
        .join()
        .unwrap();
    assert!(matches!(off, Err(SendError::WrongThread)), "{off:?}");
    // Another thread that steps the world becomes the driver.
    let (s2, b2) = (sim.clone(), client.b.clone());
    let there = std::thread::spawn(move || {
        s2.step();
        b2.send_data_copy(conn, &[b"there"], &[], 3)
    })
    .join()
    .unwrap();
    assert!(there.is_ok(), "{there:?}");
    let here = client.b.send_data_copy(conn, &[b"here"], &[], 4);
    assert!(matches!(here, Err(SendError::WrongThread)), "{here:?}");
}

#[test]
fn stepping_from_inside_a_callback_panics_with_advice() {
    let sim = Sim::with_seed(33);
    let lp = sim.next_host().event_loop().clone();
    let s2 = sim.clone();
    let sig = lp.signal(move || {
        s2.step();
    });
    sig.fire();
    let err = std::panic::catch_unwind(AssertUnwindSafe(|| sim.step())).unwrap_err();
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(
        msg.contains("drive the simulation from outside callbacks"),
        "{msg}"
    );
}

#[test]
fn signals_and_timers_run_on_virtual_time() {
    use netio_core::Timer;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let sim = Sim::with_seed(34);
    let lp = sim.next_host().event_loop().clone();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t2 = ticks.clone();
    let timer = lp.timer(move || {
        t2.fetch_add(1, Ordering::SeqCst);
    });
    timer.start(Duration::from_secs(1));
    sim.run_for(Duration::from_secs(3600));
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        3600,
        "an hour of one-second ticks"
    );
    timer.stop();
    sim.run_for(Duration::from_secs(10));
    assert_eq!(ticks.load(Ordering::SeqCst), 3600);
    let fired = Arc::new(AtomicUsize::new(0));
    let f2 = fired.clone();
    let sig = lp.signal(move || {
        f2.fetch_add(1, Ordering::SeqCst);
    });
    let (a, b) = (sig.clone(), sig.clone());
    std::thread::spawn(move || (0..5).for_each(|_| a.fire()))
        .join()
        .unwrap();
    b.fire();
    assert_eq!(sim.run_until_idle(100), 6, "one event per fire");
    assert_eq!(fired.load(Ordering::SeqCst), 6);
    // Fires not yet run when the last handle drops are discarded.
    sig.fire();
    drop((sig, b));
    sim.run_until_idle(100);
    assert_eq!(fired.load(Ordering::SeqCst), 6);
}

#[test]
fn a_call_from_a_second_thread_marks_the_run_unreproducible() {
    let sim = Sim::with_seed(35);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    // The driver's own calls keep the run reproducible.
    client
        .b
        .send_data_copy(c, &[b"from the driver"], &[], 1)
        .unwrap();
    sim.run_until_idle(1000);
    assert!(sim.reproducible());
    let b = client.b.clone();
    std::thread::spawn(move || b.send_data_copy(c, &[b"from elsewhere"], &[], 2).unwrap())
        .join()
        .unwrap();
    assert!(!sim.reproducible(), "a call from another thread is noticed");
}

#[test]
fn a_refused_call_from_another_thread_leaves_the_run_reproducible() {
    let sim = Sim::with_seed(36);
    let n = node(
        &sim,
        BackendConfig::with_thread_safety(ThreadSafety::Unsafe),
        None,
    );
    let b = n.b.clone();
    let addr = netio_core::EndpointAddress::new(n.host.ip(), 0);
    std::thread::spawn(move || {
        assert!(matches!(
            b.open_listen_endpoint(addr, full_params(64, 1)),
            Err(netio_core::OpenListenError::WrongThread)
        ));
    })
    .join()
    .unwrap();
    assert!(sim.reproducible(), "a refused call changes nothing");
}

#[test]
fn a_loop_driving_a_busy_world_gives_way_to_another_thread_that_drives() {
    let sim = Sim::with_seed(34);
    let lp = sim.next_host().event_loop().clone();
    // A periodic timer keeps the world busy for as long as anyone drives.
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = ticks.clone();
    let timer = lp.timer(move || {
        t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    timer.start(Duration::from_micros(1));
    let (ready, wait_ready) = mpsc::channel();
    let runner = {
        let lp = lp.clone();
        std::thread::spawn(move || lp.run(|| ready.send(()).unwrap()))
    };
    wait_ready.recv_timeout(Duration::from_secs(10)).unwrap();
    // This thread gets its turns while the loop runs on the other one.
    let (done, wait_done) = mpsc::channel();
    let s2 = sim.clone();
    let other = std::thread::spawn(move || {
        let before = s2.now();
        s2.run_for(Duration::from_millis(1));
        let stepped = s2.step();
        let ran = s2.run_until_idle(10);
        done.send((s2.now() - before, stepped, ran)).unwrap();
    });
    let (advanced, stepped, ran) = wait_done
        .recv_timeout(Duration::from_secs(60))
        .expect("the second driver got its turn");
    assert!(advanced >= Duration::from_millis(1), "{advanced:?}");
    assert!(stepped, "a timer event was due");
    assert_eq!(ran, 10, "the timer keeps the world busy");
    other.join().unwrap();
    lp.stop();
    runner.join().expect("run returned after stop");
    assert!(ticks.load(std::sync::atomic::Ordering::Relaxed) >= 1000);
}

#[test]
fn a_handler_that_panics_keeps_its_backend_and_is_called_again() {
    let sim = Sim::with_seed(35);
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let c2 = calls.clone();
    let server = node(
        &sim,
        BackendConfig::default(),
        Some(Box::new(move |_: &SimBackend, e: &Event| {
            if let Event::Data { data, .. } = e {
                c2.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                assert!(data != b"boom", "the handler panics on boom");
            }
        })),
    );
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    client.b.send_data_copy(conn, &[b"boom"], &[], 1).unwrap();
    let err = std::panic::catch_unwind(AssertUnwindSafe(|| {
        sim.run_until_idle(1000);
    }))
    .expect_err("the handler's panic reaches the driver");
    let msg = err
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(msg.contains("panics on boom"), "{msg}");
    // The same handler (it kept its log) hears the next message.
    client.b.send_data_copy(conn, &[b"after"], &[], 2).unwrap();
    common::run_until(&sim, "the next message arrives", || {
        server.log.data().len() == 2
    });
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(server.log.data()[1].1, b"after");
}

#[test]
fn a_host_crashed_from_its_own_callback_drops_that_handler_when_the_callback_returns() {
    struct Crasher(std::sync::Arc<std::sync::atomic::AtomicU64>);
    impl netio_core::Handler<SimBackend> for Crasher {
        fn on_data(&mut self, b: &SimBackend, _: netio_core::ConnId, _: &[u8]) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            b.sim().crash(b.ip());
            // Still alive here: the call under way owns it.
            assert_eq!(self.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        }
    }
    impl Drop for Crasher {
        fn drop(&mut self) {
            self.0.fetch_add(100, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let sim = Sim::with_seed(36);
    let state = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let host = sim.next_host();
    let server = host
        .backend(BackendConfig::default(), Crasher(state.clone()))
        .unwrap();
    let addr = server
        .open_listen_endpoint(
            netio_core::EndpointAddress::new(host.ip(), 0),
            full_params(64, 4),
        )
        .unwrap();
    let client = node(&sim, BackendConfig::default(), None);
    let conn = client
        .b
        .open_active_endpoint(addr, full_params(64, 4))
        .unwrap();
    common::run_until(&sim, "established", || !client.log.established().is_empty());
    client.b.send_data_copy(conn, &[b"one"], &[], 1).unwrap();
    client.b.send_data_copy(conn, &[b"two"], &[], 2).unwrap();
    common::run_until(&sim, "the handler is dropped", || {
        state.load(std::sync::atomic::Ordering::Relaxed) >= 100
    });
    sim.run_for(Duration::from_millis(10));
    // Called once, dropped once: nothing reached it after the crash.
    assert_eq!(state.load(std::sync::atomic::Ordering::Relaxed), 101);
    assert!(sim.crashed(host.ip()));
}

/// An echo world where the server's handler, on a message, has another
/// thread send on the client's connection and waits for that thread: what
/// an application does when a thread shares a lock with its handler.
/// Returns whether the other thread's send went through (or how it failed)
/// and how many messages the server saw.
fn callback_waits_for_a_thread_that_sends(driver_only: bool) -> (Result<(), String>, usize) {
    let sim = Sim::with_seed(37);
    sim.set_driver_only(driver_only);
    let client = node(&sim, BackendConfig::default(), None);
    let cb = client.b.clone();
    let conn = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (outcome, outcomes) = mpsc::channel();
    let c2 = conn.clone();
    let server = node(
        &sim,
        BackendConfig::default(),
        Some(Box::new(move |_: &SimBackend, e: &Event| {
            let Event::Data { data, .. } = e else { return };
            if data != b"first" {
                return;
            }
            let (b, c) = (cb.clone(), c2.lock().unwrap().expect("connected"));
            let sent = std::thread::spawn(move || {
                b.send_data_copy(c, &[b"second"], &[], 2)
                    .map_err(|e| e.to_string())
            })
            .join()
            .unwrap_or_else(|panic| {
                Err(panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default())
            });
            outcome.send(sent).unwrap();
        })),
    );
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    *conn.lock().unwrap() = Some(c);
    client.b.send_data_copy(c, &[b"first"], &[], 1).unwrap();
    sim.run_until_idle(10_000);
    let sent = outcomes
        .recv_timeout(Duration::from_secs(10))
        .expect("the callback ran");
    (sent, server.log.data().len())
}

#[test]
fn a_callback_may_wait_for_another_thread_that_calls_into_a_shared_world() {
    let (sent, seen) = callback_waits_for_a_thread_that_sends(false);
    assert_eq!(sent, Ok(()), "the other thread's send went through");
    assert_eq!(seen, 2, "and its message arrived");
}

#[test]
fn another_thread_calling_into_a_driver_only_world_while_it_is_driven_panics_with_advice() {
    let (sent, seen) = callback_waits_for_a_thread_that_sends(true);
    let msg = sent.expect_err("the call from the other thread is not made");
    assert!(
        msg.contains("driver-only") && msg.contains("driving thread"),
        "{msg}"
    );
    assert_eq!(seen, 1, "nothing more was sent");
}

#[test]
fn any_thread_may_call_into_a_driver_only_world_between_runs_of_steps() {
    let sim = Sim::with_seed(38);
    sim.set_driver_only(true);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    let b = client.b.clone();
    std::thread::spawn(move || b.send_data_copy(c, &[b"from elsewhere"], &[], 1))
        .join()
        .expect("no panic: nobody drives")
        .expect("sent");
    sim.run_until_idle(1000);
    assert_eq!(server.log.data().len(), 1);
    assert_eq!(client.log.completed_to(c), vec![1]);
}

#[test]
fn a_handler_that_panics_in_a_driver_only_world_leaves_the_world_in_place() {
    let sim = Sim::with_seed(39);
    sim.set_driver_only(true);
    let server = node(
        &sim,
        BackendConfig::default(),
        Some(Box::new(move |b: &SimBackend, e: &Event| {
            if let Event::Data { conn, data } = e {
                // A call made with the world lent, then the panic.
                let _ = b.num_available_buffers(*conn);
                assert!(data != b"boom", "the handler panics on boom");
            }
        })),
    );
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    client.b.send_data_copy(conn, &[b"boom"], &[], 1).unwrap();
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        sim.run_until_idle(1000);
    }))
    .expect_err("the handler's panic reaches the driver");
    // The world answers from this thread and from another one, and runs on.
    let s2 = sim.clone();
    std::thread::spawn(move || s2.now()).join().unwrap();
    client.b.send_data_copy(conn, &[b"after"], &[], 2).unwrap();
    common::run_until(&sim, "the next message arrives", || {
        server.log.data().len() == 2
    });
    assert_eq!(server.log.data()[1].1, b"after");
}
