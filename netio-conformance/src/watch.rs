//! The suite's eyes on a test: rules checked on every event whatever the
//! test does (order of events per remote, no re-entrant or nested handler
//! calls), and a watchdog that turns a stuck loop thread or a backend call
//! that never returns into a failure that names the cause within seconds.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long one handler call or one backend call may take before the
/// watchdog fails the test.
pub const STUCK: Duration = Duration::from_secs(5);

/// How long the watchdog waits, after it found the loop thread stuck, for
/// the test thread to fail by itself before it ends the process (the test
/// thread is itself stuck when it drives the loop, as a simulator's does).
const GRACE: Duration = Duration::from_secs(3);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// Set while this thread runs a handler call of the suite's recorder.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread runs a backend call made by the suite.
    static IN_BACKEND_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Where a stuck thread is.
#[derive(Default)]
struct Clock {
    since: Option<(Instant, String)>,
}

/// Shared by a test's context, its recorders and its watchdog thread.
#[derive(Default)]
pub(crate) struct Watch {
    /// The test's name, for messages printed by the watchdog.
    pub(crate) name: String,
    violations: Mutex<Vec<String>>,
    handler_clocks: Mutex<Vec<Arc<Mutex<Clock>>>>,
    call_clock: Arc<Mutex<Clock>>,
    stuck: Mutex<Option<String>>,
    done: AtomicBool,
}

impl Watch {
    pub(crate) fn new(name: String) -> Arc<Self> {
        Arc::new(Self {
            name,
            ..Self::default()
        })
    }

    /// Records a broken rule; the test fails at its next check.
    pub(crate) fn violation(&self, what: String) {
        lock(&self.violations).push(what);
    }

    /// The first broken rule seen, if any.
    pub(crate) fn first_violation(&self) -> Option<String> {
        lock(&self.violations).first().cloned()
    }

    /// What the watchdog found stuck, if anything.
    pub(crate) fn stuck(&self) -> Option<String> {
        lock(&self.stuck).clone()
    }

    /// Panics with the first broken rule or what is stuck.
    #[track_caller]
    pub(crate) fn check(&self) {
        if let Some(s) = self.stuck() {
            panic!("{s}");
        }
        if let Some(v) = self.first_violation() {
            panic!("contract broken: {v}");
        }
    }

    /// `true` if the test should stop waiting and fail.
    pub(crate) fn failing(&self) -> bool {
        self.stuck().is_some() || !lock(&self.violations).is_empty()
    }

    /// A clock for one recorder's handler calls.
    pub(crate) fn handler_clock(&self) -> HandlerClock {
        let c = Arc::new(Mutex::new(Clock::default()));
        lock(&self.handler_clocks).push(c.clone());
        HandlerClock(c)
    }

    /// Runs `f` as a backend call made by the suite: handler calls from
    /// inside it are flagged, and the watchdog fails the test if it does not
    /// return.
    pub(crate) fn backend_call<R>(&self, what: &str, f: impl FnOnce() -> R) -> R {
        let nested = IN_BACKEND_CALL.with(|c| c.replace(true));
        let outer = !nested && !IN_HANDLER.with(Cell::get);
        if outer {
            lock(&self.call_clock).since = Some((Instant::now(), what.to_string()));
        }
        let r = f();
        if outer {
            lock(&self.call_clock).since = None;
        }
        IN_BACKEND_CALL.with(|c| c.set(nested));
        r
    }

    /// Starts the watchdog thread; it ends when the returned guard drops.
    pub(crate) fn start_watchdog(self: &Arc<Self>) -> WatchdogGuard {
        let w = self.clone();
        let thread = thread::Builder::new()
            .name(format!("watchdog {}", self.name))
            .spawn(move || w.watchdog())
            .expect("starting the watchdog thread");
        WatchdogGuard {
            watch: self.clone(),
            thread: Some(thread),
        }
    }

    fn watchdog(&self) {
        let mut found_at: Option<Instant> = None;
        while !self.done.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20));
            if let Some(at) = found_at {
                if at.elapsed() >= GRACE && !self.done.load(Ordering::SeqCst) {
                    // The test thread did not fail by itself: it is the
                    // stuck one. Say why and end the process rather than
                    // hang it.
                    eprintln!(
                        "\nconformance test {} failed: {}\n(the test thread itself is stuck, \
                         so the watchdog ends the test process)",
                        self.name,
                        self.stuck().unwrap_or_default()
                    );
                    std::process::exit(101);
                }
                continue;
            }
            let stuck_handler = lock(&self.handler_clocks).iter().find_map(|c| {
                let c = lock(c);
                let (since, what) = c.since.as_ref()?;
                (since.elapsed() >= STUCK).then(|| what.clone())
            });
            let msg = if let Some(what) = stuck_handler {
                Some(format!(
                    "the loop thread has been inside a handler call ({what}) for {} s: a handler \
                     calling the backend deadlocked (is the provider calling the handler while \
                     holding its own lock?), or the provider called the handler from inside a \
                     backend call that holds it",
                    STUCK.as_secs()
                ))
            } else {
                let c = lock(&self.call_clock);
                c.since.as_ref().and_then(|(since, what)| {
                    (since.elapsed() >= STUCK).then(|| {
                        format!(
                            "the backend call `{what}` has not returned for {} s: the provider \
                             deadlocked inside it (a lock held by its loop thread, or a call \
                             blocking on the loop)",
                            STUCK.as_secs()
                        )
                    })
                })
            };
            if let Some(m) = msg {
                *lock(&self.stuck) = Some(m);
                found_at = Some(Instant::now());
            }
        }
    }
}

/// Stops the watchdog thread when dropped.
pub(crate) struct WatchdogGuard {
    watch: Arc<Watch>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for WatchdogGuard {
    fn drop(&mut self) {
        self.watch.done.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Measures how long one recorder's current handler call has run, and
/// flags nested calls.
pub(crate) struct HandlerClock(Arc<Mutex<Clock>>);

impl HandlerClock {
    /// Marks the start of a handler call. Returns whether it is nested in
    /// another handler call, and a violation if it is nested in a handler
    /// call or in a backend call on this thread.
    pub(crate) fn enter(&self, what: &str) -> (bool, Option<String>) {
        let nested = IN_HANDLER.with(|c| c.replace(true));
        let in_call = IN_BACKEND_CALL.with(Cell::get);
        let mut c = lock(&self.0);
        if !nested {
            c.since = Some((Instant::now(), what.to_string()));
        }
        let v = if nested {
            Some(format!(
                "{what} was called while another handler call was still running on this thread \
                 (handlers run one at a time and are never called from inside a backend call \
                 made by a handler)"
            ))
        } else if in_call {
            Some(format!(
                "{what} was called from inside a backend call (providers report events later, \
                 on the loop thread, never from inside an operation)"
            ))
        } else {
            None
        };
        (nested, v)
    }

    /// Marks the end of the handler call begun by `enter`.
    pub(crate) fn leave(&self, nested: bool) {
        if !nested {
            lock(&self.0).since = None;
            IN_HANDLER.with(|c| c.set(false));
        }
    }
}
