//! The suite's eyes on a test: rules checked on every event whatever the
//! test does (order of events per remote, no re-entrant or nested handler
//! calls), and a watchdog that turns a stuck loop thread or a backend call
//! that never returns into a failure that names the cause within seconds.
//!
//! Every behaviour runs on a thread of its own ([`run_behaviour`]), so that
//! a test whose own thread is stuck (a simulator drives its loop on the
//! test thread, and a deadlocked handler holds it) still fails: the thread
//! libtest gave the test waits for the behaviour's thread, and when the
//! watchdog gives up on it, fails with the watchdog's message and leaves
//! the stuck thread behind. The rest of the suite goes on.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long one handler call or one backend call may take before the
/// watchdog fails the test, on a machine that runs at full speed (see
/// [`stuck_limit`]).
pub const STUCK: Duration = Duration::from_secs(5);

/// The watchdog's limits are multiplied by `NETIO_CONFORMANCE_TIME_SCALE`
/// (a number ≥ 1; default 1) where everything runs slower by a known
/// factor, such as the emulated guest of `scripts/verbs-guest.sh`, which
/// sets it: there a provider's endpoint set-up can take seconds without
/// being stuck. A value that is not a number ≥ 1 is ignored.
pub fn time_scale() -> f64 {
    static SCALE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SCALE.get_or_init(|| {
        parse_scale(
            std::env::var("NETIO_CONFORMANCE_TIME_SCALE")
                .ok()
                .as_deref(),
        )
    })
}

/// The factor `value` names: a finite number ≥ 1, else 1.
fn parse_scale(value: Option<&str>) -> f64 {
    value
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|f| f.is_finite() && *f >= 1.0)
        .unwrap_or(1.0)
}

/// [`STUCK`] times [`time_scale`]: how long one call may take here.
pub fn stuck_limit() -> Duration {
    STUCK.mul_f64(time_scale())
}

/// How long the watchdog waits, after it found the loop thread stuck, for
/// the test thread to fail by itself before it ends the process (the test
/// thread is itself stuck when it drives the loop, as a simulator's does).
const GRACE: Duration = Duration::from_secs(3);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    /// The runner of the behaviour this thread runs, if [`run_behaviour`]
    /// started it.
    static RUNNER: RefCell<Option<Arc<Runner>>> = const { RefCell::new(None) };
    /// Set while this thread runs a handler call of the suite's recorder.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread runs a backend call made by the suite.
    static IN_BACKEND_CALL: Cell<bool> = const { Cell::new(false) };
}

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(20);

/// A watchdog tick that came this much later than asked is counted as
/// time in which the process did not run (see [`Lost`]); shorter delays
/// are ordinary scheduling on a loaded machine.
const STALL_SLACK: Duration = Duration::from_millis(100);

/// The time, in nanoseconds, in which the watchdog found that it had not
/// run: its tick came late by more than [`STALL_SLACK`]. On a loaded
/// virtual machine the whole process (or the machine) can be held still
/// for a second or more; a call that was running then is not stuck for
/// that time, so the clocks do not count it.
#[derive(Default)]
pub(crate) struct Lost(AtomicU64);

impl Lost {
    fn now(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Counts the watchdog's tick at `woke`, the previous one having been
    /// at `*last`: the time between them beyond one [`TICK`] came late.
    /// The whole period counts, not only the sleep in it, so that a hold
    /// that begins while the watchdog is awake between two sleeps is
    /// counted too.
    fn tick(&self, last: &mut Instant, woke: Instant) {
        self.tick_late(woke.saturating_duration_since(*last).saturating_sub(TICK));
        *last = woke;
    }

    /// Counts a tick that came `late` after it was due.
    fn tick_late(&self, late: Duration) {
        if late > STALL_SLACK {
            let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
            self.0.fetch_add(ns, Ordering::SeqCst);
        }
    }
}

/// Where a stuck thread is: since when, doing what, the [`Lost`] time
/// counted when it started, and the thread's kernel id (see
/// [`thread_state`]).
#[derive(Default)]
struct Clock {
    since: Option<(Instant, String, u64, Option<i64>)>,
}

/// What [`Clock::overdue`] found: the call, the time the process did not
/// run meanwhile, and the kernel id of the thread in it.
#[derive(Debug, PartialEq)]
struct Overdue {
    what: String,
    lost: Duration,
    tid: Option<i64>,
}

impl Clock {
    fn start(&mut self, what: &str, lost: &Lost) {
        self.since = Some((Instant::now(), what.to_string(), lost.now(), current_tid()));
    }

    /// What the thread is doing, if at `at` it had been at it for `limit`
    /// of the time the process ran; with the time it did not run
    /// meanwhile. `at` is when the watchdog last counted [`Lost`] time, so
    /// that a hold that begins after it is not counted as running time.
    fn overdue(&self, lost: &Lost, at: Instant, limit: Duration) -> Option<Overdue> {
        let (since, what, lost_then, tid) = self.since.as_ref()?;
        let lost = Duration::from_nanos(lost.now().saturating_sub(*lost_then));
        let ran = at.saturating_duration_since(*since).saturating_sub(lost);
        (ran >= limit).then(|| Overdue {
            what: what.clone(),
            lost,
            tid: *tid,
        })
    }
}

thread_local! {
    /// This thread's kernel id, asked for once.
    static TID: Option<i64> = os_tid();
}

/// The calling thread's kernel id (Linux), for [`thread_state`].
fn current_tid() -> Option<i64> {
    TID.with(|t| *t)
}

#[cfg(target_os = "linux")]
fn os_tid() -> Option<i64> {
    // SAFETY: gettid takes no arguments and cannot fail.
    Some(unsafe { libc::syscall(libc::SYS_gettid) })
}

#[cfg(not(target_os = "linux"))]
fn os_tid() -> Option<i64> {
    None
}

/// How long [`thread_state`] watches a stuck thread.
const WATCH_THREAD: Duration = Duration::from_millis(200);

/// What the kernel says of thread `tid` of this process, watched for
/// [`WATCH_THREAD`]: its scheduling state and where it sleeps, and how
/// much of that time it ran and how much it waited for a CPU. This tells
/// a thread blocked on a lock or a system call (sleeping, neither running
/// nor waiting) from one starved of a CPU (runnable, waiting) and from one
/// spinning (running) the moment a stuck call is found, where a stack
/// taken later by `gdb` may come too late. `None` off Linux, or if the
/// thread has ended.
fn thread_state(tid: i64) -> Option<String> {
    let dir = format!("/proc/self/task/{tid}");
    let sched = || -> Option<(u64, u64)> {
        let s = std::fs::read_to_string(format!("{dir}/schedstat")).ok()?;
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
        Some((f.next()??, f.next()??))
    };
    let state = || -> Option<(String, String)> {
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        // The state follows the name, which is in parentheses and may
        // itself hold spaces or parentheses.
        let state = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .next()?
            .to_string();
        let wchan = std::fs::read_to_string(format!("{dir}/wchan")).unwrap_or_default();
        Some((state, wchan.trim().to_string()))
    };
    let (run0, wait0) = sched()?;
    let (state0, wchan0) = state()?;
    thread::sleep(WATCH_THREAD);
    let (run1, wait1) = sched()?;
    let (state1, _) = state()?;
    let ms = |ns: u64| ns as f64 / 1e6;
    let wchan = if wchan0.is_empty() || wchan0 == "0" {
        String::new()
    } else {
        format!(" in {wchan0}")
    };
    Some(format!(
        "thread {tid}: state {state0}{wchan}, then {state1}; in the next {} ms it ran {:.1} ms \
         and waited {:.1} ms for a CPU",
        WATCH_THREAD.as_millis(),
        ms(run1.saturating_sub(run0)),
        ms(wait1.saturating_sub(wait0)),
    ))
}

/// " (not counting …)" for a stuck find that discounted `lost` time.
fn not_counting(lost: Duration) -> String {
    if lost.is_zero() {
        String::new()
    } else {
        format!(
            " (not counting {:.1} s in which this process did not run, its watchdog included)",
            lost.as_secs_f64()
        )
    }
}

/// Shared by a test's context, its recorders and its watchdog thread.
#[derive(Default)]
pub(crate) struct Watch {
    /// The test's name, for messages printed by the watchdog.
    pub(crate) name: String,
    violations: Mutex<Vec<String>>,
    handler_clocks: Mutex<Vec<Arc<Mutex<Clock>>>>,
    call_clock: Arc<Mutex<Clock>>,
    lost: Arc<Lost>,
    stuck: Mutex<Option<String>>,
    done: AtomicBool,
    /// The runner of the behaviour, if it runs under [`run_behaviour`].
    runner: Option<Arc<Runner>>,
}

impl Watch {
    pub(crate) fn new(name: String) -> Arc<Self> {
        Arc::new(Self {
            name,
            runner: RUNNER.with(|r| r.borrow().clone()),
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
        HandlerClock(c, self.lost.clone())
    }

    /// Runs `f` as a backend call made by the suite: handler calls from
    /// inside it are flagged, and the watchdog fails the test if it does not
    /// return.
    pub(crate) fn backend_call<R>(&self, what: &str, f: impl FnOnce() -> R) -> R {
        let nested = IN_BACKEND_CALL.with(|c| c.replace(true));
        let outer = !nested && !IN_HANDLER.with(Cell::get);
        if outer {
            lock(&self.call_clock).start(what, &self.lost);
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
        // Taken here, not in the new thread: on a loaded machine the thread
        // may first run after a hold that began once this call returned.
        let started = Instant::now();
        let thread = thread::Builder::new()
            .name(format!("watchdog {}", self.name))
            .spawn(move || w.watchdog(started))
            .expect("starting the watchdog thread");
        WatchdogGuard {
            watch: self.clone(),
            thread: Some(thread),
        }
    }

    /// The watchdog thread's loop; `started` is when it was asked for.
    fn watchdog(&self, started: Instant) {
        let mut found_at: Option<Instant> = None;
        let mut last = started;
        while !self.done.load(Ordering::SeqCst) {
            thread::sleep(TICK);
            let woke = Instant::now();
            self.lost.tick(&mut last, woke);
            if let Some(at) = found_at {
                if at.elapsed() >= GRACE.mul_f64(time_scale()) && !self.done.load(Ordering::SeqCst)
                {
                    // The test thread did not fail by itself: it is the
                    // stuck one.
                    let what = self.stuck().unwrap_or_default();
                    if let Some(runner) = &self.runner {
                        // The thread libtest waits on fails the test with
                        // this and leaves the stuck one behind.
                        runner.give_up(format!(
                            "{what} (the test's own thread is stuck there too: the suite left \
                             it behind and went on)"
                        ));
                        return;
                    }
                    // Run without [`run_behaviour`]: nothing can fail the
                    // test but ending the process. Say why on the real
                    // standard error (captured output would be lost).
                    let _ = writeln!(
                        std::io::stderr(),
                        "\nconformance test {} failed: {what}\n(the test thread itself is \
                         stuck, so the watchdog ends the test process)",
                        self.name
                    );
                    std::process::exit(101);
                }
                continue;
            }
            let stuck = stuck_limit();
            let stuck_handler = lock(&self.handler_clocks)
                .iter()
                .find_map(|c| lock(c).overdue(&self.lost, woke, stuck));
            let found = stuck_handler.map(|o| (o, true)).or_else(|| {
                lock(&self.call_clock)
                    .overdue(&self.lost, woke, stuck)
                    .map(|o| (o, false))
            });
            let msg = found.map(|(Overdue { what, lost, tid }, handler)| {
                let mut m = if handler {
                    format!(
                        "the loop thread has been inside a handler call ({what}) for {} s{}: a \
                     handler calling the backend deadlocked (is the provider calling the handler \
                     while holding its own lock?), or the provider called the handler from \
                     inside a backend call that holds it",
                        stuck.as_secs(),
                        not_counting(lost)
                    )
                } else {
                    format!(
                        "the backend call `{what}` has not returned for {} s{}: the provider \
                         deadlocked inside it (a lock held by its loop thread, or a call \
                         blocking on the loop)",
                        stuck.as_secs(),
                        not_counting(lost)
                    )
                };
                if let Some(t) = tid.and_then(thread_state) {
                    m.push_str(&format!(" [{t}]"));
                }
                m
            });
            if let Some(mut m) = msg {
                if let Some(path) = dump_stacks(&self.name) {
                    m.push_str(&format!(" (every thread's stack: {})", path.display()));
                }
                *lock(&self.stuck) = Some(m);
                found_at = Some(Instant::now());
            }
        }
    }
}

/// Where `NETIO_CONFORMANCE_STACKS` asks for them (a directory), writes
/// the stacks of every thread of this process, taken by `gdb` (which must
/// be on the path) the moment the watchdog finds a thread stuck, to a file
/// named after the test and the process; returns its path. A failure that
/// shows once in hundreds of runs under load then names the lock or call
/// each thread was in. Nothing happens without the variable.
fn dump_stacks(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("NETIO_CONFORMANCE_STACKS")?;
    let name: String = test
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let path = std::path::Path::new(&dir).join(format!("{name}-{}.txt", std::process::id()));
    let file = std::fs::File::create(&path).ok()?;
    let status = std::process::Command::new("timeout")
        .args(["120", "gdb", "-nx", "-batch", "-p"])
        .arg(std::process::id().to_string())
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 40"])
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().ok()?)
        .stderr(file)
        .status()
        .ok()?;
    status.success().then_some(path)
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
pub(crate) struct HandlerClock(Arc<Mutex<Clock>>, Arc<Lost>);

impl HandlerClock {
    /// Marks the start of a handler call. Returns whether it is nested in
    /// another handler call, and a violation if it is nested in a handler
    /// call or in a backend call on this thread.
    pub(crate) fn enter(&self, what: &str) -> (bool, Option<String>) {
        let nested = IN_HANDLER.with(|c| c.replace(true));
        let in_call = IN_BACKEND_CALL.with(Cell::get);
        let mut c = lock(&self.0);
        if !nested {
            c.start(what, &self.1);
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

/// What the thread libtest gave a behaviour knows of the thread that runs
/// it.
#[derive(Default)]
pub(crate) struct Runner {
    /// Set by the watchdog when it gave up on the behaviour's thread.
    gave_up: Mutex<Option<String>>,
    woken: Condvar,
    /// Turns the behaviour holds, released if it is left behind.
    turns: Mutex<Vec<Arc<crate::ctx::TurnHandle>>>,
}

impl Runner {
    fn give_up(&self, why: String) {
        *lock(&self.gave_up) = Some(why);
        self.woken.notify_all();
    }

    /// The runner of the behaviour on this thread, if any.
    pub(crate) fn current() -> Option<Arc<Runner>> {
        RUNNER.with(|r| r.borrow().clone())
    }

    /// Remembers a turn the behaviour holds (see `ctx::Turn`), so that it
    /// is given back if the behaviour is left behind stuck.
    pub(crate) fn holds(&self, turn: Arc<crate::ctx::TurnHandle>) {
        lock(&self.turns).push(turn);
    }
}

/// Runs one behaviour of the suite on a thread of its own and waits for it.
/// A panic there fails the calling test with the same payload; when the
/// watchdog finds the behaviour's own thread stuck (a deadlocked handler on
/// a loop the test thread drives), the calling test fails with the
/// watchdog's message and the stuck thread is left behind, so the process
/// and the rest of the suite go on. Used by [`suite!`](crate::suite) and
/// [`behaviours`](crate::behaviours).
#[doc(hidden)]
pub fn run_behaviour(f: fn()) {
    let runner = Arc::new(Runner::default());
    let r = runner.clone();
    // The same name, so that the test's name shows in messages and in the
    // behaviour's own panics.
    let name = thread::current()
        .name()
        .unwrap_or("conformance test")
        .to_string();
    let body = thread::Builder::new()
        .name(name)
        .spawn(move || {
            RUNNER.with(|slot| *slot.borrow_mut() = Some(r));
            f()
        })
        .expect("starting a behaviour's thread");
    let mut gave_up = lock(&runner.gave_up);
    loop {
        if body.is_finished() {
            drop(gave_up);
            if let Err(payload) = body.join() {
                std::panic::resume_unwind(payload);
            }
            return;
        }
        if let Some(why) = gave_up.clone() {
            drop(gave_up);
            for t in lock(&runner.turns).iter() {
                crate::ctx::release_turn(t);
            }
            panic!("{why}");
        }
        gave_up = runner
            .woken
            .wait_timeout(gave_up, Duration::from_millis(10))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_scale, Clock, Lost, Overdue, TICK};
    use std::time::{Duration, Instant};

    /// A call that has run for 6 s, 2 s of which the process did not run,
    /// has run 4 s: under a 5 s limit it is not overdue; without the lost
    /// time it is. Lost time counted before the call started does not
    /// count for it, nor does a late tick within the slack.
    #[test]
    fn time_in_which_the_process_did_not_run_is_not_counted_against_a_call() {
        let lost = Lost::default();
        lost.tick_late(Duration::from_secs(3));
        let started = Instant::now() - Duration::from_secs(6);
        let clock = Clock {
            since: Some((started, "a call".into(), lost.now(), Some(7))),
        };
        let limit = Duration::from_secs(5);
        let now = Instant::now();
        assert_eq!(
            clock.overdue(&lost, now, limit),
            Some(Overdue {
                what: "a call".to_string(),
                lost: Duration::ZERO,
                tid: Some(7)
            })
        );
        lost.tick_late(Duration::from_millis(90));
        assert!(
            clock.overdue(&lost, now, limit).is_some(),
            "90 ms late is on time"
        );
        // Seen as of 2 s after it started, it has not run for the limit.
        let early = started + Duration::from_secs(2);
        assert_eq!(clock.overdue(&lost, early, limit), None);
        lost.tick_late(Duration::from_secs(2));
        assert_eq!(clock.overdue(&lost, now, limit), None);
        let idle = Clock::default();
        assert_eq!(idle.overdue(&lost, now, Duration::ZERO), None);
    }

    /// A hold that begins after one tick woke and ends before the next
    /// sleep begins is counted: the period from wake to wake counts, not
    /// only the sleep in it. A period of one tick is on time.
    #[test]
    fn a_hold_between_two_sleeps_of_the_watchdog_is_counted() {
        let lost = Lost::default();
        let mut last = Instant::now();
        let start = last;
        lost.tick(&mut last, start + TICK);
        assert_eq!(lost.now(), 0, "a tick on time");
        assert_eq!(last, start + TICK);
        // Held for 6 s while awake, then a sleep of one tick.
        lost.tick(&mut last, start + TICK + Duration::from_secs(6) + TICK);
        assert_eq!(
            Duration::from_nanos(lost.now()),
            Duration::from_secs(6),
            "the hold is lost time"
        );
    }

    /// The report on a stuck thread tells one blocked on a lock (sleeping,
    /// not running) from one spinning (runnable).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_stuck_threads_report_tells_blocked_from_spinning() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        let held = Arc::new(Mutex::new(()));
        let guard = held.lock().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let blocked = {
            let (held, tx) = (held.clone(), tx.clone());
            std::thread::spawn(move || {
                tx.send(super::current_tid()).unwrap();
                drop(held.lock());
            })
        };
        let spinning = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                tx.send(super::current_tid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let (a, b) = (rx.recv().unwrap().unwrap(), rx.recv().unwrap().unwrap());
        // The blocked thread reaches its lock soon after it said its id.
        std::thread::sleep(Duration::from_millis(100));
        let reports: Vec<String> = [a, b]
            .iter()
            .map(|t| super::thread_state(*t).expect("a live thread of this process"))
            .collect();
        stop.store(true, Ordering::Relaxed);
        drop(guard);
        blocked.join().unwrap();
        spinning.join().unwrap();
        let sleeping: Vec<&String> = reports
            .iter()
            .filter(|r| r.contains("state S") && r.contains("it ran 0.0 ms"))
            .collect();
        let running: Vec<&String> = reports.iter().filter(|r| r.contains("state R")).collect();
        assert_eq!(
            (sleeping.len(), running.len()),
            (1, 1),
            "one thread sleeps without running, one is runnable: {reports:?}"
        );
        assert!(
            super::thread_state(i64::from(i32::MAX)).is_none(),
            "no report on a thread that is not there"
        );
    }

    #[test]
    fn the_time_scale_is_a_number_of_at_least_one_else_one() {
        assert_eq!(parse_scale(None), 1.0);
        assert_eq!(parse_scale(Some("4")), 4.0);
        assert_eq!(parse_scale(Some(" 2.5 ")), 2.5);
        assert_eq!(parse_scale(Some("0.5")), 1.0);
        assert_eq!(parse_scale(Some("-3")), 1.0);
        assert_eq!(parse_scale(Some("inf")), 1.0);
        assert_eq!(parse_scale(Some("NaN")), 1.0);
        assert_eq!(parse_scale(Some("fast")), 1.0);
    }
}
