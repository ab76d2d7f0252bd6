//! Behaviour of the real event loop, `netio_core::mio_loop::MioLoop`.
//!
//! Nothing here sleeps to synchronise: tests wait for conditions with a
//! deadline, and every loop is bounded.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use mio::net::{TcpListener, UnixStream};
use mio::unix::SourceFd;
use mio::Interest;
use netio_core::mio_loop::{LoopConfig, MioLoop, MioSignal, SourceId};
use netio_core::{EventLoop, Signal, Timer};

/// How long any awaited condition may take on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(5);

/// Tests that open file descriptors hold this shared; the fd-leak test holds
/// it exclusively so its count of open fds is not disturbed.
static FDS: RwLock<()> = RwLock::new(());

fn fds_shared() -> RwLockReadGuard<'static, ()> {
    FDS.read().unwrap_or_else(|p| p.into_inner())
}

/// Waits until `cond` holds or the deadline passes; returns whether it held.
fn wait_until(mut cond: impl FnMut() -> bool) -> bool {
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

/// A loop with the default settings, busy-polling with `busy`.
fn looping(busy: bool) -> MioLoop {
    MioLoop::with_config(LoopConfig {
        busy_poll: busy,
        ..LoopConfig::default()
    })
    .unwrap()
}

fn count(c: &AtomicUsize) -> usize {
    c.load(Ordering::SeqCst)
}

/// A loop running on its own thread; stopped and joined on drop.
struct Running {
    el: MioLoop,
    thread: Option<JoinHandle<()>>,
    loop_thread: ThreadId,
}

impl Running {
    fn start(el: &MioLoop) -> Self {
        Self::start_with(el, || {})
    }

    /// Starts the loop with `init` as (part of) its init callback.
    fn start_with(el: &MioLoop, init: impl FnOnce() + Send + 'static) -> Self {
        let (tx, rx) = mpsc::channel();
        let runner = el.clone();
        let thread = thread::spawn(move || {
            runner.run(move || {
                init();
                tx.send(thread::current().id()).unwrap();
            });
        });
        let loop_thread = rx.recv_timeout(DEADLINE).expect("init ran");
        Self {
            el: el.clone(),
            thread: Some(thread),
            loop_thread,
        }
    }

    /// Stops the loop and waits for `run` to return.
    fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(t) = self.thread.take() {
            self.el.stop();
            assert!(wait_until(|| t.is_finished()), "run did not return");
            t.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if thread::panicking() {
            // Do not hang a failing test on a stuck loop.
            self.el.stop();
        } else {
            self.stop_and_join();
        }
    }
}

/// Returns once the loop finished a turn that began after this call: every
/// signal fired and closure posted before it has been dispatched.
fn fence(el: &MioLoop) {
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    let inner = el.clone();
    el.post(move || inner.post(move || d.store(true, Ordering::SeqCst)));
    assert!(wait_until(|| done.load(Ordering::SeqCst)), "fence");
}

#[test]
fn init_runs_before_any_other_callback() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let push = |name: &'static str| {
        let log = Arc::clone(&log);
        move || log.lock().unwrap().push(name)
    };

    // Everything below is ready to be dispatched before `run` starts.
    let sig = el.signal(push("signal"));
    sig.fire();
    el.post(push("post"));
    let timer = el.timer(push("timer"));
    timer.start_ns(1);
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let on_source = push("source");
    let id = el
        .register(&mut b, Interest::READABLE, move |_| on_source())
        .unwrap();
    a.write_all(b"x").unwrap();
    // Let the timer's first deadline pass before the loop starts.
    let t0 = Instant::now();
    assert!(wait_until(|| t0.elapsed() >= Duration::from_millis(2)));

    let running = Running::start_with(&el, push("init"));
    let seen = |name| log.lock().unwrap().contains(&name);
    assert!(wait_until(|| ["signal", "post", "timer", "source"]
        .iter()
        .all(|n| seen(*n))));
    running.stop();
    assert_eq!(log.lock().unwrap().first(), Some(&"init"));
    assert_eq!(
        log.lock().unwrap().iter().filter(|n| **n == "init").count(),
        1
    );
    el.deregister(&mut b, id).unwrap();
}

#[test]
fn stop_from_another_thread_returns_run() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let runner = el.clone();
    let t = thread::spawn(move || runner.run(|| {}));
    assert!(wait_until(|| el.is_running()));
    // The loop is asleep in epoll with nothing to do: stop must wake it.
    el.stop();
    assert!(wait_until(|| t.is_finished()), "run did not return");
    t.join().unwrap();
    assert!(!el.is_running());

    // And a second run on the same loop works the same way.
    let runner = el.clone();
    let t = thread::spawn(move || runner.run(|| {}));
    assert!(wait_until(|| el.is_running()));
    el.stop();
    assert!(wait_until(|| t.is_finished()), "second run did not return");
    t.join().unwrap();
}

#[test]
fn stop_before_run_returns_after_init() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let sig = {
        let calls = Arc::clone(&calls);
        el.signal(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    el.stop();
    let inits = Arc::new(AtomicUsize::new(0));
    let (runner, s, i) = (el.clone(), sig.clone(), Arc::clone(&inits));
    let t = thread::spawn(move || {
        runner.run(|| {
            i.fetch_add(1, Ordering::SeqCst);
            s.fire();
        })
    });
    assert!(wait_until(|| t.is_finished()), "run did not return");
    t.join().unwrap();
    assert_eq!(count(&inits), 1);
    assert_eq!(count(&calls), 0, "nothing is dispatched after init");

    // A later run works again, and dispatches the fire left pending.
    let running = Running::start(&el);
    assert!(wait_until(|| count(&calls) == 1));
    sig.fire();
    assert!(wait_until(|| count(&calls) == 2));
    running.stop();
}

#[test]
fn signal_fired_n_times_runs_n_times_from_many_threads() {
    let _fds = fds_shared();
    const THREADS: usize = 4;
    const FIRES: usize = 2_000;
    let el = MioLoop::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let sig = {
        let calls = Arc::clone(&calls);
        el.signal(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    let running = Running::start(&el);
    let firers: Vec<_> = (0..THREADS)
        .map(|_| {
            let sig = sig.clone();
            thread::spawn(move || {
                for _ in 0..FIRES {
                    sig.fire();
                }
            })
        })
        .collect();
    for _ in 0..FIRES {
        sig.fire();
    }
    for f in firers {
        f.join().unwrap();
    }
    let total = (THREADS + 1) * FIRES;
    assert!(
        wait_until(|| count(&calls) >= total),
        "{} of {total}",
        count(&calls)
    );
    fence(&el);
    assert_eq!(count(&calls), total);
    running.stop();
}

#[test]
fn signal_callback_runs_on_loop_thread() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sig = {
        let seen = Arc::clone(&seen);
        let el = el.clone();
        el.clone().signal(move || {
            seen.lock()
                .unwrap()
                .push((thread::current().id(), el.on_loop_thread()))
        })
    };
    let running = Running::start(&el);
    assert!(!el.on_loop_thread());
    sig.fire();
    let other = sig.clone();
    thread::spawn(move || other.fire()).join().unwrap();
    // Fired on the loop thread, from a posted closure: not run inline.
    let inline = Arc::new(AtomicBool::new(true));
    {
        let (sig, seen, inline) = (sig.clone(), Arc::clone(&seen), Arc::clone(&inline));
        el.post(move || {
            let before = seen.lock().unwrap().len();
            sig.fire();
            inline.store(seen.lock().unwrap().len() != before, Ordering::SeqCst);
        });
    }
    assert!(wait_until(|| seen.lock().unwrap().len() == 3));
    assert!(
        !inline.load(Ordering::SeqCst),
        "fire ran the callback inline"
    );
    for (thread, on_loop) in seen.lock().unwrap().iter() {
        assert_eq!(*thread, running.loop_thread);
        assert!(*on_loop);
    }
    running.stop();
}

#[test]
fn timer_fires_periodically_then_stops() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let timer = Arc::new(OnceLock::<netio_core::mio_loop::MioTimer>::new());
    let t = {
        let (ticks, timer) = (Arc::clone(&ticks), Arc::clone(&timer));
        el.timer(move || {
            if ticks.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
                timer.get().unwrap().stop();
            }
        })
    };
    let _ = timer.set(t);
    let running = Running::start(&el);
    let t0 = Instant::now();
    timer.get().unwrap().start_ms(2);
    assert!(wait_until(|| count(&ticks) == 5));
    // Five periods of 2 ms take at least 10 ms.
    assert!(t0.elapsed() >= Duration::from_millis(10));

    // A second timer ticks 20 times at 2 ms (40 ms or more): the stopped
    // one must stay silent meanwhile.
    let other_ticks = Arc::new(AtomicUsize::new(0));
    let other = {
        let o = Arc::clone(&other_ticks);
        el.timer(move || {
            o.fetch_add(1, Ordering::SeqCst);
        })
    };
    other.start_ms(2);
    assert!(wait_until(|| count(&other_ticks) >= 20));
    assert_eq!(count(&ticks), 5);

    // Stopping from another thread works too.
    other.stop();
    fence(&el);
    let frozen = count(&other_ticks);
    timer.get().unwrap().start_ms(2);
    assert!(wait_until(|| count(&ticks) >= 8));
    assert_eq!(count(&other_ticks), frozen);
    running.stop();
}

#[test]
fn timer_restarts_with_new_period() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let timer = {
        let ticks = Arc::clone(&ticks);
        Arc::new(el.timer(move || {
            ticks.fetch_add(1, Ordering::SeqCst);
        }))
    };
    let running = Running::start(&el);

    // A long period restarted with a short one: ticks come at the short one.
    let t0 = Instant::now();
    timer.start_s(10);
    timer.start_ms(2);
    assert!(wait_until(|| count(&ticks) >= 10));
    assert!(t0.elapsed() < Duration::from_secs(5));

    // Restarted (on the loop thread, so no tick slips in between) with a
    // long period: it stays silent while a 5 ms timer ticks 20 times.
    {
        let (timer, ticks) = (Arc::clone(&timer), Arc::clone(&ticks));
        el.post(move || {
            timer.start_ms(1_000);
            ticks.store(0, Ordering::SeqCst);
        });
    }
    let fence_ticks = Arc::new(AtomicUsize::new(0));
    let fence_timer = {
        let f = Arc::clone(&fence_ticks);
        el.timer(move || {
            f.fetch_add(1, Ordering::SeqCst);
        })
    };
    fence(&el);
    let restarted = Instant::now();
    fence_timer.start_ms(5);
    assert!(wait_until(|| count(&fence_ticks) >= 20));
    // At 2 ms it would have ticked about 50 times; allow one 1 s tick in case
    // the machine stalled for that long.
    let slow_window = restarted.elapsed();
    assert!(
        count(&ticks) <= 1 + (slow_window.as_millis() / 1_000) as usize,
        "{} ticks in {slow_window:?} at a 1 s period",
        count(&ticks)
    );

    // And back to a short period.
    timer.start_us(500);
    assert!(wait_until(|| count(&ticks) >= 10));
    running.stop();
}

#[test]
fn dropped_signal_no_longer_runs() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(()); // captured by the callback: tells when it is dropped
    let make = |el: &MioLoop| {
        let (calls, held) = (Arc::clone(&calls), Arc::clone(&held));
        el.signal(move || {
            let _ = &held;
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };

    // Fires pending when the last clone goes are discarded.
    let sig = make(&el);
    sig.fire();
    sig.fire();
    drop(sig);
    assert_eq!(
        Arc::strong_count(&held),
        1,
        "callback dropped with the signal"
    );
    let running = Running::start(&el);
    fence(&el);
    assert_eq!(count(&calls), 0);

    // A clone keeps it alive; the last drop removes it.
    let sig = make(&el);
    let clone = sig.clone();
    sig.fire();
    assert!(wait_until(|| count(&calls) == 1));
    drop(sig);
    clone.fire();
    assert!(wait_until(|| count(&calls) == 2));
    drop(clone);
    assert_eq!(Arc::strong_count(&held), 1);
    fence(&el);
    assert_eq!(count(&calls), 2);

    // Dropped from inside its own callback: runs once, then is gone.
    let slot: Arc<Mutex<Option<netio_core::mio_loop::MioSignal>>> = Arc::default();
    let sig = {
        let (calls, slot, held) = (Arc::clone(&calls), Arc::clone(&slot), Arc::clone(&held));
        el.signal(move || {
            let _ = &held;
            calls.fetch_add(1, Ordering::SeqCst);
            drop(slot.lock().unwrap().take());
        })
    };
    {
        // Fired twice and handed over on the loop thread, so both fires are
        // pending when the first callback drops the last handle.
        let slot = Arc::clone(&slot);
        el.post(move || {
            sig.fire();
            sig.fire();
            *slot.lock().unwrap() = Some(sig);
        });
    }
    assert!(wait_until(|| count(&calls) == 3));
    assert!(wait_until(|| Arc::strong_count(&held) == 1));
    fence(&el);
    assert_eq!(count(&calls), 3);
    running.stop();
}

#[test]
fn registered_source_callback_runs_on_readiness() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let mut listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let listen_fd = listener.as_raw_fd();
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let on_loop = Arc::new(AtomicBool::new(true));
    let id = {
        let (accepted, on_loop, el2) = (Arc::clone(&accepted), Arc::clone(&on_loop), el.clone());
        // The callback accepts through the listener's fd, borrowed as a
        // std listener for the call.
        el.register(&mut listener, Interest::READABLE, move |event| {
            assert!(event.is_readable());
            if !el2.on_loop_thread() {
                on_loop.store(false, Ordering::SeqCst);
            }
            accept_all(listen_fd, &accepted);
        })
        .unwrap()
    };
    let running = Running::start(&el);
    let mut clients = Vec::new();
    for n in 1..=3 {
        clients.push(std::net::TcpStream::connect(addr).unwrap());
        assert!(wait_until(|| accepted.lock().unwrap().len() == n));
    }
    assert!(on_loop.load(Ordering::SeqCst));

    // Data on an accepted connection, registered from the test thread while
    // the loop runs.
    let conn = accepted.lock().unwrap().remove(0);
    conn.set_nonblocking(true).unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let conn_fd = conn.as_raw_fd();
    let conn_id = {
        let got = Arc::clone(&got);
        let mut stream = mio::net::TcpStream::from_std(conn.try_clone().unwrap());
        el.register(&mut SourceFd(&conn_fd), Interest::READABLE, move |_| {
            let mut buf = [0u8; 64];
            while let Ok(n @ 1..) = stream.read(&mut buf) {
                got.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
        .unwrap()
    };
    clients[0].write_all(b"hello").unwrap();
    assert!(wait_until(|| got.lock().unwrap().as_slice() == b"hello"));
    el.deregister(&mut SourceFd(&conn_fd), conn_id).unwrap();
    el.deregister(&mut listener, id).unwrap();
    running.stop();
}

/// Accepts every pending connection of the (non-blocking) listener `fd`.
fn accept_all(fd: i32, out: &Mutex<Vec<std::net::TcpStream>>) {
    use std::os::fd::BorrowedFd;
    // SAFETY: `fd` is the listener registered with the loop; it stays open
    // until the test deregisters it after stopping the loop.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let listener = std::net::TcpListener::from(borrowed.try_clone_to_owned().unwrap());
    while let Ok((s, _)) = listener.accept() {
        out.lock().unwrap().push(s);
    }
}

#[test]
fn deregister_from_inside_callback_works() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let (mut a, b) = UnixStream::pair().unwrap();
    let b_fd = b.as_raw_fd();
    let calls = Arc::new(AtomicUsize::new(0));
    let held = Arc::new(());
    let id_cell = Arc::new(OnceLock::<SourceId>::new());
    let id = {
        let (calls, held, id_cell, el2) = (
            Arc::clone(&calls),
            Arc::clone(&held),
            Arc::clone(&id_cell),
            el.clone(),
        );
        el.register(&mut SourceFd(&b_fd), Interest::READABLE, move |_| {
            let _ = &held;
            calls.fetch_add(1, Ordering::SeqCst);
            let id = *id_cell.get().unwrap();
            el2.deregister(&mut SourceFd(&b_fd), id).unwrap();
            // Deregistering twice is an error, not a crash.
            assert!(el2.deregister(&mut SourceFd(&b_fd), id).is_err());
        })
        .unwrap()
    };
    id_cell.set(id).unwrap();
    let running = Running::start(&el);
    a.write_all(b"1").unwrap();
    assert!(wait_until(|| count(&calls) == 1));
    // The callback (and what it captured) is dropped once it returned.
    assert!(wait_until(|| Arc::strong_count(&held) == 1));
    // New readiness reaches nobody.
    a.write_all(b"2").unwrap();
    fence(&el);
    assert_eq!(count(&calls), 1);

    // The fd can be registered again, from a loop callback, with a new id.
    let again = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    {
        let (again, el2) = (Arc::clone(&again), el.clone());
        el.post(move || {
            let id2 = el2
                .register(&mut SourceFd(&b_fd), Interest::READABLE, move |_| {
                    again.fetch_add(1, Ordering::SeqCst);
                })
                .unwrap();
            tx.send(id2).unwrap();
        });
    }
    let id2 = rx.recv_timeout(DEADLINE).unwrap();
    assert_ne!(id, id2);
    // Already readable (unread data): the new registration reports it.
    assert!(wait_until(|| count(&again) >= 1));
    el.deregister(&mut SourceFd(&b_fd), id2).unwrap();
    running.stop();
    drop(b);
}

#[test]
fn post_runs_once_on_loop_thread() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let running = Running::start(&el);
    for n in 0..100 {
        let (log, el2) = (Arc::clone(&log), el.clone());
        el.post(move || {
            log.lock()
                .unwrap()
                .push((n, thread::current().id(), el2.on_loop_thread()))
        });
    }
    assert!(wait_until(|| log.lock().unwrap().len() == 100));
    fence(&el);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 100, "each closure ran once");
    for (i, (n, thread, on_loop)) in log.iter().enumerate() {
        assert_eq!(i, *n, "in order");
        assert_eq!(*thread, running.loop_thread);
        assert!(*on_loop);
    }

    // A post from the loop thread is not run inline.
    let ran = Arc::new(AtomicUsize::new(0));
    let inline = Arc::new(AtomicBool::new(true));
    {
        let (ran, inline, el2) = (Arc::clone(&ran), Arc::clone(&inline), el.clone());
        el.post(move || {
            let r = Arc::clone(&ran);
            el2.post(move || {
                r.fetch_add(1, Ordering::SeqCst);
            });
            inline.store(ran.load(Ordering::SeqCst) != 0, Ordering::SeqCst);
        });
    }
    assert!(wait_until(|| count(&ran) == 1));
    assert!(!inline.load(Ordering::SeqCst));
    drop(log);
    running.stop();
}

#[test]
fn busy_poll_mode_dispatches_signals() {
    let _fds = fds_shared();
    let el = MioLoop::with_config(LoopConfig {
        busy_poll: true,
        events_capacity: 16,
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let sig = {
        let calls = Arc::clone(&calls);
        el.signal(move || {
            calls.fetch_add(1, Ordering::SeqCst);
        })
    };
    let ticks = Arc::new(AtomicUsize::new(0));
    let timer = {
        let ticks = Arc::clone(&ticks);
        el.timer(move || {
            ticks.fetch_add(1, Ordering::SeqCst);
        })
    };
    let running = Running::start(&el);
    let firers: Vec<_> = (0..2)
        .map(|_| {
            let sig = sig.clone();
            thread::spawn(move || (0..1_000).for_each(|_| sig.fire()))
        })
        .collect();
    for f in firers {
        f.join().unwrap();
    }
    assert!(wait_until(|| count(&calls) == 2_000));
    timer.start_us(100);
    assert!(wait_until(|| count(&ticks) >= 10));
    timer.stop();
    fence(&el);
    assert_eq!(count(&calls), 2_000);
    running.stop();
}

#[test]
fn spin_callbacks_run_every_turn_of_a_busy_polling_loop_and_sources_are_still_served() {
    let _fds = fds_shared();
    let el = MioLoop::with_config(LoopConfig {
        busy_poll: true,
        events_capacity: 16,
    })
    .unwrap();
    assert!(el.is_busy_polling());
    let spins = Arc::new(AtomicUsize::new(0));
    let id = {
        let spins = Arc::clone(&spins);
        el.add_spin(move || {
            spins.fetch_add(1, Ordering::SeqCst);
            false
        })
    };
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    {
        let reads = Arc::clone(&reads);
        el.register(&mut b, Interest::READABLE, move |_| {
            reads.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let running = Running::start(&el);
    assert!(wait_until(|| count(&spins) > 100), "spin callback runs");
    a.write_all(b"x").unwrap();
    assert!(
        wait_until(|| count(&reads) >= 1),
        "a source is still polled while a spin callback runs"
    );
    assert!(el.remove_spin(id));
    assert!(!el.remove_spin(id), "a removed spin is unknown");
    fence(&el);
    let after = count(&spins);
    fence(&el);
    assert_eq!(count(&spins), after, "a removed spin runs no more");
    running.stop();
}

/// On a busy loop whose spin callback counts its turns and writes one byte
/// to a socket pair at the turns `write_at` chooses (given the turn and the
/// turn the last byte was read at, `None` before the first), returns how
/// many turns each byte waited from its write to the source callback that
/// read it, for the first `bytes` bytes.
fn turns_bytes_wait(
    bytes: usize,
    write_at: impl Fn(usize, Option<usize>) -> bool + Send + 'static,
) -> Vec<usize> {
    let _fds = fds_shared();
    let el = looping(true);
    let (mut a, reader) = std::os::unix::net::UnixStream::pair().unwrap();
    reader.set_nonblocking(true).unwrap();
    let mut b = UnixStream::from_std(reader.try_clone().unwrap());
    let mut reader = reader;
    let turns = Arc::new(AtomicUsize::new(0));
    // The turn the unread byte was written at (usize::MAX: none unread),
    // the turn the last byte was read at, the waits.
    let written = Arc::new(AtomicUsize::new(usize::MAX));
    let read_at = Arc::new(AtomicUsize::new(usize::MAX));
    let waits = Arc::new(Mutex::new(Vec::new()));
    {
        let (turns, written, read_at) = (
            Arc::clone(&turns),
            Arc::clone(&written),
            Arc::clone(&read_at),
        );
        el.add_spin(move || {
            let turn = turns.fetch_add(1, Ordering::SeqCst) + 1;
            let last = match count(&read_at) {
                usize::MAX => None,
                t => Some(t),
            };
            if count(&written) == usize::MAX && write_at(turn, last) {
                written.store(turn, Ordering::SeqCst);
                a.write_all(b"x").unwrap();
            }
            false
        });
    }
    {
        let (turns, written, read_at, waits) = (
            Arc::clone(&turns),
            Arc::clone(&written),
            Arc::clone(&read_at),
            Arc::clone(&waits),
        );
        el.register(&mut b, Interest::READABLE, move |_| {
            let mut buf = [0u8; 8];
            while matches!(reader.read(&mut buf), Ok(n) if n > 0) {}
            let turn = count(&turns);
            let at = written.swap(usize::MAX, Ordering::SeqCst);
            if at != usize::MAX {
                waits.lock().unwrap().push(turn - at);
                read_at.store(turn, Ordering::SeqCst);
            }
        })
        .unwrap();
    }
    let running = Running::start(&el);
    assert!(
        wait_until(|| waits.lock().unwrap().len() >= bytes),
        "{bytes} bytes read: {:?}",
        waits.lock().unwrap()
    );
    running.stop();
    let waits = waits.lock().unwrap().clone();
    waits
}

/// While epoll reports an event at every ask (a byte written again on the
/// turn the last one was read), a busy loop with spin callbacks asks it
/// every 8 turns: no byte waits longer.
#[test]
fn a_busy_loop_whose_epoll_reports_events_asks_it_every_eight_turns() {
    let waits = turns_bytes_wait(50, |turn, last| last.is_none_or(|l| turn > l));
    assert!(
        waits.iter().all(|&w| w <= 9),
        "a byte waited more than 8 turns: {waits:?}"
    );
}

/// While epoll reports nothing, a busy loop with spin callbacks asks it
/// less and less often, down to once every 64 turns: a byte written after
/// 300 idle turns waits more than 8 turns at some phase of that cadence,
/// and never more than 64.
#[test]
fn a_busy_loop_whose_epoll_reports_nothing_asks_it_less_often_down_to_every_64_turns() {
    // A byte 300 turns after the last read, one turn later each time, so
    // the writes fall at different phases of the asks.
    let round = Arc::new(AtomicUsize::new(0));
    let waits = turns_bytes_wait(16, move |turn, last| {
        let from = last.unwrap_or(0);
        let r = count(&round);
        if turn >= from + 300 + r {
            round.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    });
    assert!(
        waits.iter().all(|&w| w <= 65),
        "a byte waited more than 64 turns: {waits:?}"
    );
    assert!(
        waits.iter().any(|&w| w > 9),
        "every byte was read within 8 turns after idle spells: {waits:?}"
    );
}

/// In a spin callback, `turn_now` is the time the loop read for this
/// turn's timers: never after `now`, never behind the previous turn's, and
/// advancing as the loop turns.
#[test]
fn turn_now_in_a_spin_callback_is_this_turns_time() {
    let _fds = fds_shared();
    let el = looping(true);
    // (turn_now, now) per spin, for the first 10,000 spins.
    let seen: Arc<Mutex<Vec<(Duration, Duration)>>> = Arc::new(Mutex::new(Vec::new()));
    {
        let (seen, lp) = (Arc::clone(&seen), el.clone());
        el.add_spin(move || {
            let mut s = seen.lock().unwrap();
            if s.len() < 10_000 {
                s.push((lp.turn_now(), lp.now()));
            }
            false
        });
    }
    let running = Running::start(&el);
    assert!(wait_until(|| seen.lock().unwrap().len() == 10_000));
    running.stop();
    let seen = seen.lock().unwrap();
    let mut last = Duration::ZERO;
    for (i, &(turn, now)) in seen.iter().enumerate() {
        assert!(turn <= now, "spin {i}: turn_now {turn:?} after now {now:?}");
        assert!(
            turn >= last,
            "spin {i}: turn_now {turn:?} went back from {last:?}"
        );
        last = turn;
    }
    let (first, end) = (seen[0].0, seen[seen.len() - 1].0);
    assert!(
        end > first,
        "turn_now advances over 10,000 turns: {first:?} to {end:?}"
    );
    assert!(first > Duration::ZERO, "read in the first turn already");
}

#[test]
fn spin_callbacks_never_run_on_a_loop_that_sleeps_and_may_remove_themselves() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    assert!(!el.is_busy_polling());
    let spins = Arc::new(AtomicUsize::new(0));
    {
        let spins = Arc::clone(&spins);
        el.add_spin(move || {
            spins.fetch_add(1, Ordering::SeqCst);
            false
        });
    }
    let running = Running::start(&el);
    for _ in 0..10 {
        fence(&el);
    }
    assert_eq!(count(&spins), 0, "not busy polling: no spin");
    running.stop();

    let busy = MioLoop::with_config(LoopConfig {
        busy_poll: true,
        events_capacity: 0,
    })
    .unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let me: Arc<OnceLock<netio_core::mio_loop::SpinId>> = Arc::new(OnceLock::new());
    {
        let (calls, cell, weak) = (Arc::clone(&calls), Arc::clone(&me), busy.downgrade());
        let id = busy.add_spin(move || {
            calls.fetch_add(1, Ordering::SeqCst);
            if let (Some(id), Some(lp)) = (cell.get(), weak.upgrade()) {
                assert!(lp.remove_spin(*id), "removing itself from inside");
            }
            false
        });
        let _ = me.set(id);
    }
    let running = Running::start(&busy);
    assert!(wait_until(|| count(&calls) >= 1));
    for _ in 0..10 {
        fence(&busy);
    }
    assert_eq!(count(&calls), 1, "removed from inside its first call");
    running.stop();
}

/// A removed spin callback is dropped: at once when the loop is not
/// running it, and by the loop within a turn when another thread removes
/// it while the loop runs (the loop keeps its own list of the callbacks).
#[test]
fn a_removed_spin_callback_is_dropped_running_or_not() {
    let _fds = fds_shared();
    let el = looping(true);
    let held = Arc::new(());
    let calls = Arc::new(AtomicUsize::new(0));
    let add = |el: &MioLoop| {
        let (held, calls) = (Arc::clone(&held), Arc::clone(&calls));
        el.add_spin(move || {
            let _ = &held;
            calls.fetch_add(1, Ordering::SeqCst);
            false
        })
    };
    // Never run: dropped by remove_spin itself.
    let id = add(&el);
    assert_eq!(Arc::strong_count(&held), 2);
    assert!(el.remove_spin(id));
    assert_eq!(Arc::strong_count(&held), 1, "dropped by remove_spin");

    // Run, then the loop stopped: dropped by remove_spin itself.
    let id = add(&el);
    let running = Running::start(&el);
    assert!(wait_until(|| count(&calls) > 10));
    running.stop();
    assert!(el.remove_spin(id));
    assert_eq!(
        Arc::strong_count(&held),
        1,
        "the stopped loop keeps no copy of a removed callback"
    );

    // Removed from another thread while the loop spins.
    let id = add(&el);
    let running = Running::start(&el);
    let before = count(&calls);
    assert!(wait_until(|| count(&calls) > before + 10));
    assert!(el.remove_spin(id));
    fence(&el);
    fence(&el);
    assert_eq!(
        Arc::strong_count(&held),
        1,
        "the running loop dropped the removed callback"
    );
    let after = count(&calls);
    fence(&el);
    assert_eq!(count(&calls), after, "a removed spin runs no more");
    running.stop();
}

/// A timer started from another thread while a busy-polling loop spins is
/// run although the loop reads the earliest deadline without the timers'
/// lock; one that is restarted later than its first deadline does not tick
/// at the old one.
#[test]
fn a_busy_loop_runs_a_timer_started_from_another_thread_at_its_deadline() {
    let _fds = fds_shared();
    let el = looping(true);
    let _spin = el.add_spin(|| false);
    let long_ticks = Arc::new(AtomicUsize::new(0));
    let long = {
        let t = Arc::clone(&long_ticks);
        el.timer(move || {
            t.fetch_add(1, Ordering::SeqCst);
        })
    };
    long.start(Duration::from_secs(3600));
    let ticks = Arc::new(AtomicUsize::new(0));
    let short = {
        let t = Arc::clone(&ticks);
        el.timer(move || {
            t.fetch_add(1, Ordering::SeqCst);
        })
    };
    let running = Running::start(&el);
    fence(&el);
    let started = Instant::now();
    short.start(Duration::from_millis(2));
    assert!(
        wait_until(|| count(&ticks) >= 3),
        "a timer earlier than the loop's earliest deadline ticks"
    );
    assert!(started.elapsed() >= Duration::from_millis(6));
    short.stop();
    assert_eq!(count(&long_ticks), 0, "the hour-long timer has not ticked");
    running.stop();
}

/// A busy loop with spin callbacks reads the clock once every few turns;
/// once its last spin callback is removed (whichever turn of that cycle it
/// was on) it reads it every turn again, and its timers keep ticking.
#[test]
fn a_busy_loop_whose_spin_callbacks_are_removed_still_runs_its_timers() {
    let _fds = fds_shared();
    let el = looping(true);
    let running = Running::start(&el);
    // Each round removes the spin callback at some turn of the cycle: the
    // timer ticks after every removal.
    for round in 0..3 {
        let spins = Arc::new(AtomicUsize::new(0));
        let id = {
            let s = Arc::clone(&spins);
            el.add_spin(move || {
                s.fetch_add(1, Ordering::SeqCst);
                false
            })
        };
        let target = 1000 + 13 * round;
        assert!(
            wait_until(|| count(&spins) >= target),
            "round {round}: spins"
        );
        assert!(el.remove_spin(id));
        fence(&el);
        let ticks = Arc::new(AtomicUsize::new(0));
        let timer = {
            let t = Arc::clone(&ticks);
            el.timer(move || {
                t.fetch_add(1, Ordering::SeqCst);
            })
        };
        timer.start(Duration::from_millis(1));
        assert!(
            wait_until(|| count(&ticks) >= 3),
            "round {round}: the timer ticks once the spin callback is gone"
        );
        timer.stop();
    }
    running.stop();
}

/// Waits until `fd` is readable, at most `ms` milliseconds, through an
/// epoll instance of its own (which reports an fd that is ready when it is
/// added).
fn readable_within(fd: std::os::fd::RawFd, ms: u64) -> bool {
    let mut poll = mio::Poll::new().unwrap();
    let mut events = mio::Events::with_capacity(4);
    poll.registry()
        .register(&mut SourceFd(&fd), mio::Token(1), Interest::READABLE)
        .unwrap();
    poll.poll(&mut events, Some(Duration::from_millis(ms)))
        .unwrap();
    !events.is_empty()
}

/// A loop driven one turn at a time from outside (`MioLoop::turn`): a
/// ready source is dispatched in the turn that finds it, the returned wait
/// says when to turn again, and the loop's descriptor becomes readable
/// when another thread gives it work.
#[test]
fn a_loop_driven_by_turns_dispatches_what_is_ready_and_says_when_to_turn_again() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let fd = el.as_raw_fd();
    assert_eq!(el.turn(Duration::ZERO), None, "idle: nothing to wait for");

    // A ready source, dispatched by the turn that finds it.
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    {
        let reads = Arc::clone(&reads);
        el.register(&mut b, Interest::READABLE, move |_| {
            reads.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    a.write_all(b"x").unwrap();
    assert!(
        readable_within(fd, 2_000),
        "a ready source makes the fd readable"
    );
    el.turn(Duration::ZERO);
    assert_eq!(count(&reads), 1);

    // Work posted from the loop thread: turn again at once. A chain of
    // closures, each posting the next, takes several turns.
    fn chain(el: &MioLoop, ran: Arc<AtomicUsize>, left: usize) {
        if left == 0 {
            return;
        }
        let el2 = el.clone();
        el.post(move || {
            ran.fetch_add(1, Ordering::SeqCst);
            chain(&el2, ran, left - 1);
        });
    }
    let ran = Arc::new(AtomicUsize::new(0));
    chain(&el, Arc::clone(&ran), 10);
    let mut again = 0;
    while el.turn(Duration::ZERO) == Some(Duration::ZERO) {
        again += 1;
        assert!(again < 100);
    }
    assert_eq!(count(&ran), 10);
    assert!(
        again >= 2,
        "each turn said to turn again while the chain went on"
    );

    // A timer: the wait is the time to its deadline.
    let t = el.timer(|| {});
    t.start(Duration::from_secs(60));
    let wait = el.turn(Duration::ZERO).expect("a timer to wait for");
    assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
    t.stop();

    // A post from another thread makes the fd readable.
    while el.turn(Duration::ZERO) == Some(Duration::ZERO) {}
    assert!(!readable_within(fd, 10));
    let posted = Arc::new(AtomicUsize::new(0));
    {
        let (el2, posted) = (el.clone(), Arc::clone(&posted));
        thread::spawn(move || {
            el2.post(move || {
                posted.fetch_add(1, Ordering::SeqCst);
            })
        })
        .join()
        .unwrap();
    }
    assert!(
        readable_within(fd, 2_000),
        "another thread's post wakes the driver"
    );
    el.turn(Duration::ZERO);
    assert_eq!(count(&posted), 1);
}

/// Counts its wake-ups: a driver task's waker, as `set_driver_waker`
/// takes it.
struct CountingWaker(AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// With a driver waker set, work announced from outside a turn wakes it,
/// once per look of the loop, and leaves the loop's descriptor alone;
/// `work_announced` says there is work until a turn runs it. Cleared, the
/// descriptor turns readable again.
#[test]
fn a_driver_waker_takes_the_wake_ups_of_the_loops_descriptor_until_cleared() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let fd = el.as_raw_fd();
    let woken = Arc::new(CountingWaker(AtomicUsize::new(0)));
    el.set_driver_waker(Some(std::task::Waker::from(Arc::clone(&woken))));
    assert!(!el.work_announced());

    let ran = Arc::new(AtomicUsize::new(0));
    let post = |from_another_thread: bool| {
        let (el2, ran) = (el.clone(), Arc::clone(&ran));
        let f = move || {
            el2.post(move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
        };
        if from_another_thread {
            thread::spawn(f).join().unwrap();
        } else {
            f();
        }
    };
    post(false);
    assert_eq!(count(&woken.0), 1, "the post woke the driver");
    assert!(el.work_announced());
    post(true);
    assert_eq!(
        count(&woken.0),
        1,
        "the driver was told already: the second post wakes nothing"
    );
    assert!(
        !readable_within(fd, 10),
        "the descriptor stays quiet: the driver, not epoll, was told"
    );
    assert_eq!(el.run_pending(), None, "both ran, nothing left to wait for");
    assert_eq!(count(&ran), 2);
    assert!(!el.work_announced());
    post(true);
    assert_eq!(count(&woken.0), 2, "a post after the look wakes it again");
    el.run_pending();

    el.set_driver_waker(None);
    post(true);
    assert_eq!(count(&woken.0), 2, "a cleared waker is not woken");
    assert!(
        readable_within(fd, 2_000),
        "without a driver waker a post wakes the descriptor"
    );
    el.turn(Duration::ZERO);
    assert_eq!(count(&ran), 4);
}

/// `turn_found_events` says whether the last turn that looked at epoll
/// found readiness of a source: not for a look that found nothing, nor for
/// the loop's own wake-up (a post from another thread with no driver
/// waker), and `run_pending`, which does not look, leaves it as it was.
#[test]
fn turn_found_events_reports_whether_the_last_look_found_a_ready_source() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let (mut a, mut b) = UnixStream::pair().unwrap();
    let read = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&read);
    let id = el
        .register(&mut b, Interest::READABLE, move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    el.turn(Duration::ZERO);
    assert!(!el.turn_found_events(), "nothing was ready");

    a.write_all(b"x").unwrap();
    el.turn(Duration::from_secs(5));
    assert_eq!(count(&read), 1, "the turn handed the readiness over");
    assert!(el.turn_found_events(), "the look found the source ready");
    el.run_pending();
    assert!(
        el.turn_found_events(),
        "run_pending does not look: the answer stays that of the last look"
    );
    el.turn(Duration::ZERO);
    assert!(!el.turn_found_events(), "the next look found nothing new");

    let el2 = el.clone();
    thread::spawn(move || el2.post(|| {})).join().unwrap();
    el.turn(Duration::from_secs(5));
    assert!(
        !el.turn_found_events(),
        "the loop's own wake-up is not a source's readiness"
    );
    el.deregister(&mut b, id).unwrap();
}

#[test]
fn turn_waits_at_most_its_bound_and_refuses_a_loop_running_elsewhere() {
    let _fds = fds_shared();
    let el = MioLoop::new().unwrap();
    let t = Instant::now();
    assert_eq!(el.turn(Duration::from_millis(20)), None);
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(19), "waited {waited:?}");
    let running = Running::start(&el);
    let el2 = el.clone();
    let r = thread::spawn(move || el2.turn(Duration::ZERO)).join();
    assert!(r.is_err(), "turn on a loop that runs elsewhere panics");
    running.stop();
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn no_fd_leak_after_drop() {
    let _fds = FDS.write().unwrap_or_else(|p| p.into_inner());
    let before = open_fds();
    for round in 0..5 {
        let el = MioLoop::with_config(LoopConfig {
            busy_poll: round % 2 == 1,
            events_capacity: 0,
        })
        .unwrap();
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        // A cycle through callbacks: the signal's callback owns a timer whose
        // callback owns the signal.
        let sig_cell = Arc::new(OnceLock::<netio_core::mio_loop::MioSignal>::new());
        let timer = {
            let (cell, hits) = (Arc::clone(&sig_cell), Arc::clone(&hits));
            el.timer(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                cell.get().unwrap().fire();
            })
        };
        let sig = {
            let (hits, weak) = (Arc::clone(&hits), el.downgrade());
            el.signal(move || {
                hits.fetch_add(1, Ordering::SeqCst);
                timer.stop();
                // A weak handle reaches the loop without keeping it alive.
                assert!(weak.upgrade().unwrap().on_loop_thread());
            })
        };
        let _ = sig_cell.set(sig.clone());
        {
            let hits = Arc::clone(&hits);
            el.register(&mut b, Interest::READABLE, move |_| {
                hits.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        let weak = el.downgrade();
        let running = Running::start(&el);
        a.write_all(b"x").unwrap();
        sig.fire();
        assert!(wait_until(|| count(&hits) >= 2));
        running.stop();
        // Left behind: a pending post, a pending fire and a surviving signal
        // handle; none of them may keep the loop's fds open.
        el.post(|| {});
        sig.fire();
        drop(el);
        assert!(weak.upgrade().is_none(), "the loop is gone");
        sig.fire();
        drop(sig);
        drop((a, b));
    }
    assert_eq!(open_fds(), before, "fds leaked");
}

/// Starts a 2 ms timer on `el` (a busy-polling loop whose work, steps of a
/// millisecond or more, `steps` counts) once per round, and returns the
/// most steps any round took from the start to the first tick.
///
/// Everything that counts happens on the loop thread: a posted closure
/// stops the timer (exact there), reads the step count and starts it; the
/// callback reads the count at the first tick of the round. The loop's
/// steps go on while the test thread is descheduled, so a count read
/// there, or a stop from there, could mix in steps or ticks of another
/// moment.
fn most_steps_a_timer_waits(el: &MioLoop, steps: &Arc<AtomicUsize>) -> usize {
    let fired_at = Arc::new(AtomicUsize::new(usize::MAX));
    let started_at = Arc::new(AtomicUsize::new(0));
    let rounds = Arc::new(AtomicUsize::new(0));
    let timer = Arc::new({
        let (f, s, r) = (
            Arc::clone(&fired_at),
            Arc::clone(steps),
            Arc::clone(&rounds),
        );
        el.timer(move || {
            if count(&f) == usize::MAX {
                f.store(count(&s), Ordering::SeqCst);
                r.fetch_add(1, Ordering::SeqCst);
            }
        })
    });
    let mut most = 0;
    for round in 0..8 {
        {
            let (timer, fired, started, s) = (
                Arc::clone(&timer),
                Arc::clone(&fired_at),
                Arc::clone(&started_at),
                Arc::clone(steps),
            );
            el.post(move || {
                timer.stop();
                fired.store(usize::MAX, Ordering::SeqCst);
                started.store(count(&s), Ordering::SeqCst);
                timer.start(Duration::from_millis(2));
            });
        }
        assert!(
            wait_until(|| count(&rounds) == round + 1),
            "round {round}: the timer fired"
        );
        most = most.max(count(&fired_at) - count(&started_at));
    }
    timer.stop();
    most
}

/// A busy loop skips the clock on idle spins, not after work: when a spin
/// callback finds work (a millisecond of it, turn after turn), the next
/// turn looks at the timers. A 2 ms timer then fires within four such
/// turns (the one under way when it was set, two that make the 2 ms, the
/// one that sees it due); were the clock read only on the turns that ask
/// epoll (one in eight at best), it would wait up to nine or more, and in
/// eight rounds nearly surely more than five at least once.
#[test]
fn a_busy_loop_whose_spin_callbacks_find_work_every_turn_runs_its_timers_on_time() {
    let _fds = fds_shared();
    let el = looping(true);
    let steps = Arc::new(AtomicUsize::new(0));
    {
        let s = Arc::clone(&steps);
        el.add_spin(move || {
            std::thread::sleep(Duration::from_millis(1));
            s.fetch_add(1, Ordering::SeqCst);
            true
        });
    }
    let running = Running::start(&el);
    let most = most_steps_a_timer_waits(&el, &steps);
    running.stop();
    assert!(
        most <= 5,
        "a 2 ms timer waited {most} spins that found 1 ms of work each"
    );
}

/// Posts a closure that spends a millisecond, counts itself in `steps` and
/// posts itself again, until `go` is cleared.
fn post_chain(lp: MioLoop, steps: Arc<AtomicUsize>, go: Arc<AtomicBool>) {
    let next = lp.clone();
    lp.post(move || {
        if !go.load(Ordering::SeqCst) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
        steps.fetch_add(1, Ordering::SeqCst);
        post_chain(next, steps, go);
    });
}

/// Likewise for posted closures on a busy loop whose spin callback finds
/// nothing: a turn that runs posted closures reads the clock after them,
/// so a chain of closures of a millisecond each, one a turn, does not hold
/// a due timer back until epoll is asked.
#[test]
fn a_busy_loop_running_long_posted_closures_turn_after_turn_runs_its_timers_on_time() {
    let most = most_steps_beside_idle_spins(post_chain);
    assert!(
        most <= 5,
        "a 2 ms timer waited {most} posted closures of 1 ms each"
    );
}

/// On a busy loop whose one spin callback finds nothing, starts the work
/// `start` sets up (steps of a millisecond or more, counted in the counter
/// it is given, going on while the flag it is given is set) and returns
/// [`most_steps_a_timer_waits`] beside it.
fn most_steps_beside_idle_spins(
    start: impl FnOnce(MioLoop, Arc<AtomicUsize>, Arc<AtomicBool>),
) -> usize {
    let _fds = fds_shared();
    let el = looping(true);
    let _spin = el.add_spin(|| false);
    let steps = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(AtomicBool::new(true));
    start(el.clone(), Arc::clone(&steps), Arc::clone(&go));
    let running = Running::start(&el);
    let most = most_steps_a_timer_waits(&el, &steps);
    go.store(false, Ordering::SeqCst);
    fence(&el);
    running.stop();
    most
}

/// Likewise for signals: a turn that runs a signal's callback reads the
/// clock after it, so a signal of a millisecond that fires itself again,
/// once a turn, does not hold a due timer back until epoll is asked.
#[test]
fn a_busy_loop_running_a_long_signal_turn_after_turn_runs_its_timers_on_time() {
    let most = most_steps_beside_idle_spins(|el, steps, go| {
        let me: Arc<OnceLock<MioSignal>> = Arc::new(OnceLock::new());
        let signal = {
            let me = Arc::clone(&me);
            el.signal(move || {
                if !go.load(Ordering::SeqCst) {
                    return;
                }
                thread::sleep(Duration::from_millis(1));
                steps.fetch_add(1, Ordering::SeqCst);
                if let Some(s) = me.get() {
                    s.fire();
                }
            })
        };
        signal.fire();
        assert!(me.set(signal).is_ok());
    });
    assert!(
        most <= 5,
        "a 2 ms timer waited {most} runs of a 1 ms signal"
    );
}

/// Runs `el` on a thread of its own, again after each panic that ends
/// `run` (counted in `panics`), until a run returns.
fn run_restarting(el: &MioLoop, panics: &Arc<AtomicUsize>) -> JoinHandle<()> {
    let (runner, panics) = (el.clone(), Arc::clone(panics));
    thread::spawn(move || loop {
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runner.run(|| {})));
        match ran {
            Ok(()) => return,
            Err(_) => {
                panics.fetch_add(1, Ordering::SeqCst);
            }
        }
    })
}

/// A callback that counts its runs in `runs` and panics on its first.
fn panics_first(runs: &Arc<AtomicUsize>) -> impl FnMut() + Send + 'static {
    let runs = Arc::clone(runs);
    move || {
        if runs.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("a callback panics on its first run (on purpose)");
        }
    }
}

/// A panic in a callback ends `run`; the callback is kept, so it runs
/// again at its next event once the loop runs again (a provider's
/// callback, through which a handler's panic unwound, goes on serving its
/// connections). `arm` registers a callback made by [`panics_first`] with
/// the given counter, makes its first event happen, and returns what makes
/// the next one happen (nothing for those that come by themselves); what
/// `arm` returns second is kept alive until the end.
fn a_callback_that_panicked_runs_again<K: Send + 'static>(
    busy: bool,
    arm: impl FnOnce(&MioLoop, &Arc<AtomicUsize>) -> (Box<dyn Fn()>, K),
) {
    let _fds = fds_shared();
    let el = looping(busy);
    let panics = Arc::new(AtomicUsize::new(0));
    let runner = run_restarting(&el, &panics);
    let runs = Arc::new(AtomicUsize::new(0));
    let (again, keep) = arm(&el, &runs);
    assert!(
        wait_until(|| count(&runs) >= 1 && count(&panics) == 1),
        "the first run panicked and ended run"
    );
    again();
    assert!(
        wait_until(|| count(&runs) >= 2),
        "its next event runs the callback again ({} runs)",
        count(&runs)
    );
    el.stop();
    assert!(wait_until(|| runner.is_finished()), "run returned");
    runner.join().unwrap();
    assert_eq!(count(&panics), 1, "one panic");
    drop(keep);
}

#[test]
fn a_source_whose_callback_panicked_runs_it_again_at_its_next_readiness() {
    a_callback_that_panicked_runs_again(false, |el, runs| {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut on_readable = panics_first(runs);
        el.register(&mut b, Interest::READABLE, move |_| on_readable())
            .unwrap();
        (&a).write_all(b"x").unwrap();
        // Edge-triggered: more data raises a new edge.
        let again = Box::new(move || (&a).write_all(b"y").unwrap());
        (again as Box<dyn Fn()>, b)
    });
}

#[test]
fn a_signal_whose_callback_panicked_runs_it_again_when_fired_again() {
    a_callback_that_panicked_runs_again(false, |el, runs| {
        let signal = Arc::new(el.signal(panics_first(runs)));
        signal.fire();
        let s = Arc::clone(&signal);
        (Box::new(move || s.fire()) as Box<dyn Fn()>, signal)
    });
}

#[test]
fn a_timer_whose_callback_panicked_runs_it_again_at_its_next_tick() {
    a_callback_that_panicked_runs_again(false, |el, runs| {
        let timer = el.timer(panics_first(runs));
        timer.start(Duration::from_millis(1));
        (Box::new(|| {}) as Box<dyn Fn()>, timer)
    });
}

#[test]
fn a_spin_callback_that_panicked_runs_again_on_the_next_turn() {
    a_callback_that_panicked_runs_again(true, |el, runs| {
        let mut spin = panics_first(runs);
        let id = el.add_spin(move || {
            spin();
            false
        });
        (Box::new(|| {}) as Box<dyn Fn()>, id)
    });
}
