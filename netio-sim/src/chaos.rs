//! Chaos runs and determinism checks for applications on the simulator.
//!
//! [`Chaos`] runs an application under a random schedule of faults drawn
//! from a seed: for a stretch of virtual time it cuts, holds, resets,
//! slows, pauses, crashes and restarts hosts and changes links; then it
//! heals everything, lets the world settle, and calls the application's
//! invariant check. A failure names the seed, the faults applied and the
//! command that replays exactly that run (`NETIO_CHAOS_SEED=…`).
//!
//! [`check_determinism`] runs a scenario twice with one seed and reports
//! the first line where the two traces differ: the way to find what makes
//! a test unreproducible (a wall clock, a thread, a `HashMap` order).
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use netio_core::{Backend, BackendConfig, ConnId, ConnectionParams, EndpointAddress, Handler};
//! use netio_sim::{chaos::{Chaos, Faults}, Sim};
//!
//! /// Counts what arrives.
//! struct Count(Arc<Mutex<usize>>);
//! impl<B: Backend + ?Sized> Handler<B> for Count {
//!     fn on_data(&mut self, _: &B, _: ConnId, _: &[u8]) {
//!         *self.0.lock().unwrap() += 1;
//!     }
//! }
//!
//! let result = Chaos::new()
//!     .runs(3)
//!     .duration(Duration::from_millis(200))
//!     .faults(Faults::ALL)
//!     .run(
//!         |sim: &Sim| {
//!             let got = Arc::new(Mutex::new(0));
//!             let host = sim.next_host();
//!             let b = host.backend(BackendConfig::default(), Count(got.clone())).unwrap();
//!             b.open_listen_endpoint(
//!                 EndpointAddress::new(host.ip(), 0),
//!                 ConnectionParams::receive(64, 4),
//!             )
//!             .unwrap();
//!             (b, got)
//!         },
//!         |_sim, (b, got)| {
//!             // Nobody sends: nothing may arrive.
//!             let _ = b;
//!             if *got.lock().unwrap() == 0 { Ok(()) } else { Err("data from nowhere".into()) }
//!         },
//!     );
//! assert!(result.is_ok());
//! ```

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::rng::Rng;
use crate::{LinkConfig, Sim};

/// The kinds of fault a [`Chaos`] run may apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Faults {
    /// [`Sim::partition`] two hosts, later [`Sim::heal`].
    pub partition: bool,
    /// [`Sim::hold`] the traffic between two hosts, later
    /// [`Sim::release`].
    pub hold: bool,
    /// [`Sim::reset_connections`] between two hosts.
    pub reset: bool,
    /// [`Sim::crash`] or [`Sim::crash_silently`] a host, later
    /// [`Sim::restart`] it (the application's
    /// [`SimHost::on_restart`](crate::SimHost::on_restart) hook runs).
    pub crash: bool,
    /// [`Sim::slow_receiver`] on a host.
    pub slow: bool,
    /// [`Sim::pause_loop`] a host's loop, later resume it.
    pub pause: bool,
    /// [`Sim::refuse_connections`] on a host, later accept again.
    pub refuse: bool,
    /// [`Sim::set_link`] with a random latency and bandwidth.
    pub link: bool,
}

impl Faults {
    /// Every kind.
    pub const ALL: Self = Self {
        partition: true,
        hold: true,
        reset: true,
        crash: true,
        slow: true,
        pause: true,
        refuse: true,
        link: true,
    };

    /// None: the run only lets the application work (useful to check the
    /// invariants hold without faults first).
    pub const NONE: Self = Self {
        partition: false,
        hold: false,
        reset: false,
        crash: false,
        slow: false,
        pause: false,
        refuse: false,
        link: false,
    };

    /// Every kind that loses nothing by itself: partitions, holds, slow
    /// receivers, paused loops and link changes; no resets, crashes or
    /// refusals.
    pub const LOSSLESS: Self = Self {
        reset: false,
        crash: false,
        refuse: false,
        ..Self::ALL
    };
}

/// Why a [`Chaos`] run failed, with what it takes to replay it.
#[derive(Debug, Clone)]
pub struct ChaosFailure {
    /// The seed of the failing run.
    pub seed: u64,
    /// What the invariant check (or a panic in the application) said.
    pub message: String,
    /// The faults applied, one line each, with their virtual time.
    pub faults: Vec<String>,
    /// A shell command that replays this run alone.
    pub replay: String,
}

impl fmt::Display for ChaosFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos run with seed {:#x} failed: {}",
            self.seed, self.message
        )?;
        writeln!(f, "faults applied ({}):", self.faults.len())?;
        for line in &self.faults {
            writeln!(f, "  {line}")?;
        }
        write!(f, "replay with: {}", self.replay)
    }
}

impl std::error::Error for ChaosFailure {}

/// A seeded chaos runner (see the [module docs](self)).
///
/// Each run makes a fresh [`Sim`] with the run's seed, builds the
/// application with `setup`, applies random faults among the world's hosts
/// for [`duration`](Self::duration) of virtual time (one every
/// [`interval`](Self::interval) on average), heals everything (partitions
/// healed, holds released, crashed hosts restarted, links, loops and
/// receivers back to normal), runs [`settle`](Self::settle) more, and
/// calls `check`. The schedule of faults, like everything else in the
/// world, depends on the seed alone.
///
/// Seeds: [`seed`](Self::seed) (default 1) and the ones after it, one per
/// run ([`runs`](Self::runs), default 10, or `NETIO_CHAOS_RUNS`). With
/// `NETIO_CHAOS_SEED` set (decimal or `0x` hexadecimal), exactly that seed
/// runs once: the replay.
///
/// [`run`](Self::run) tries the seeds one after another on the calling
/// thread; [`run_parallel`](Self::run_parallel) spreads them over
/// [`threads`](Self::threads) threads, one world per thread, and reports
/// the same failing seed whatever the number of threads.
#[derive(Debug, Clone)]
pub struct Chaos {
    seed: u64,
    runs: u64,
    duration: Duration,
    settle: Duration,
    interval: Duration,
    faults: Faults,
    replay: Option<String>,
    threads: Option<usize>,
}

impl Default for Chaos {
    fn default() -> Self {
        Self::new()
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    match parsed {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a u64 (decimal or 0x-prefixed hexadecimal)"),
    }
}

impl Chaos {
    /// Ten runs from seed 1, each one virtual second of faults every 20 ms
    /// on average (all kinds), then five seconds to settle.
    pub fn new() -> Self {
        Self {
            seed: 1,
            runs: 10,
            duration: Duration::from_secs(1),
            settle: Duration::from_secs(5),
            interval: Duration::from_millis(20),
            faults: Faults::ALL,
            replay: None,
            threads: None,
        }
    }

    /// The first seed (the others follow it).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// How many runs (seeds) to try; `NETIO_CHAOS_RUNS` overrides it.
    pub fn runs(mut self, runs: u64) -> Self {
        self.runs = runs;
        self
    }

    /// Virtual time during which faults are applied.
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }

    /// Virtual time the healed world runs before the check.
    pub fn settle(mut self, d: Duration) -> Self {
        self.settle = d;
        self
    }

    /// Mean virtual time between two faults (at least 1 µs).
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d.max(Duration::from_micros(1));
        self
    }

    /// The kinds of fault to apply.
    pub fn faults(mut self, faults: Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The command a failure tells to run, after `NETIO_CHAOS_SEED=…`.
    /// Default: `cargo test <name of the current test> -- --exact` inside a
    /// test, else the current program with its arguments.
    pub fn replay_command(mut self, cmd: impl Into<String>) -> Self {
        self.replay = Some(cmd.into());
        self
    }

    /// Threads for [`run_parallel`](Self::run_parallel) (at least 1;
    /// default: the machine's cores). `NETIO_CHAOS_THREADS` overrides it.
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = Some(n.max(1));
        self
    }

    /// The threads [`run_parallel`](Self::run_parallel) uses.
    pub fn thread_count(&self) -> usize {
        env_u64("NETIO_CHAOS_THREADS")
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX).max(1))
            .or(self.threads)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    /// The command that replays a seed, after `NETIO_CHAOS_SEED=…`; named
    /// on the caller's thread (a test's thread bears the test's name).
    fn replay_base(&self) -> String {
        self.replay
            .clone()
            .unwrap_or_else(|| match std::thread::current().name() {
                Some(name) if name != "main" => format!("cargo test {name} -- --exact"),
                _ => std::env::args().collect::<Vec<_>>().join(" "),
            })
    }

    /// One run with `seed`: the number of faults applied, or the failure.
    fn run_seed<S>(
        &self,
        seed: u64,
        setup: &mut dyn FnMut(&Sim) -> S,
        check: &mut dyn FnMut(&Sim, &mut S) -> Result<(), String>,
        replay: &str,
    ) -> Result<usize, ChaosFailure> {
        let mut faults = Vec::new();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let sim = Sim::with_seed(seed);
            let mut state = setup(&sim);
            self.apply_faults(&sim, seed, &mut faults);
            sim.run_for(self.settle);
            let checked = check(&sim, &mut state);
            // Frees what the application's handlers hold, cycles through
            // the world included (async tasks holding their backends).
            sim.shut_down();
            checked
        }));
        let message = match outcome {
            Ok(Ok(())) => return Ok(faults.len()),
            Ok(Err(why)) => why,
            Err(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .map_or_else(|| "panicked".to_owned(), |p| format!("panicked: {p}")),
        };
        Err(ChaosFailure {
            seed,
            message,
            faults,
            replay: format!("NETIO_CHAOS_SEED={seed:#x} {replay}"),
        })
    }

    /// The seeds this runner tries, in order.
    pub fn seeds(&self) -> Vec<u64> {
        if let Some(seed) = env_u64("NETIO_CHAOS_SEED") {
            return vec![seed];
        }
        let runs = env_u64("NETIO_CHAOS_RUNS").unwrap_or(self.runs);
        (0..runs).map(|i| self.seed.wrapping_add(i)).collect()
    }

    /// Runs the application once per seed (see [`Chaos`]); stops at the
    /// first failure. `check` returns `Err(why)` when an invariant does not
    /// hold; a panic in `setup`, `check` or a handler is a failure too.
    pub fn run<S>(
        &self,
        mut setup: impl FnMut(&Sim) -> S,
        mut check: impl FnMut(&Sim, &mut S) -> Result<(), String>,
    ) -> Result<ChaosReport, ChaosFailure> {
        let replay = self.replay_base();
        let mut report = ChaosReport::default();
        for seed in self.seeds() {
            report.faults += self.run_seed(seed, &mut setup, &mut check, &replay)?;
            report.runs += 1;
        }
        Ok(report)
    }

    /// [`run`](Self::run) on [`thread_count`](Self::thread_count) threads,
    /// each taking the next seed not yet tried and running it in a world
    /// of its own. When runs fail, the failure reported is that of the
    /// smallest failing seed in the order of [`seeds`](Self::seeds) (not of
    /// the first run to fail), so it does not depend on the number of
    /// threads or their timing: seeds after a failing one are not started,
    /// the ones before it all run. The replay command is
    /// [`run`](Self::run)'s, and replays the seed on one thread.
    pub fn run_parallel<S>(
        &self,
        setup: impl Fn(&Sim) -> S + Sync,
        check: impl Fn(&Sim, &mut S) -> Result<(), String> + Sync,
    ) -> Result<ChaosReport, ChaosFailure> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Mutex;

        let seeds = self.seeds();
        let threads = self.thread_count().min(seeds.len()).max(1);
        let replay = self.replay_base();
        let next = AtomicUsize::new(0);
        // The smallest index of a failing seed found so far.
        let failed_at = AtomicUsize::new(usize::MAX);
        let failures = Mutex::new(Vec::<(usize, ChaosFailure)>::new());
        let report = Mutex::new(ChaosReport::default());
        std::thread::scope(|scope| {
            for t in 0..threads {
                let (seeds, replay) = (&seeds, &replay);
                let (next, failed_at, failures, report) = (&next, &failed_at, &failures, &report);
                let (setup, check) = (&setup, &check);
                let worker = move || loop {
                    // Indices are taken in order: every index below a
                    // failing one was taken before it, and finishes.
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= seeds.len() || i > failed_at.load(Ordering::SeqCst) {
                        return;
                    }
                    let mut setup = |sim: &Sim| setup(sim);
                    let mut check = |sim: &Sim, state: &mut S| check(sim, state);
                    match self.run_seed(seeds[i], &mut setup, &mut check, replay) {
                        Ok(n) => {
                            let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                            r.runs += 1;
                            r.faults += n;
                        }
                        Err(f) => {
                            failed_at.fetch_min(i, Ordering::SeqCst);
                            failures
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((i, f));
                        }
                    }
                };
                std::thread::Builder::new()
                    .name(format!("chaos-{t}"))
                    .spawn_scoped(scope, worker)
                    .expect("spawning a chaos thread");
            }
        });
        let failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
        match failures.into_iter().min_by_key(|(i, _)| *i) {
            Some((_, f)) => Err(f),
            None => Ok(report.into_inner().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// [`run`](Self::run), panicking with the failure (seed, faults and
    /// replay command) if one run fails: for tests.
    pub fn run_or_panic<S>(
        &self,
        setup: impl FnMut(&Sim) -> S,
        check: impl FnMut(&Sim, &mut S) -> Result<(), String>,
    ) -> ChaosReport {
        match self.run(setup, check) {
            Ok(r) => r,
            Err(f) => panic!("{f}"),
        }
    }

    /// Runs the chaos schedule of the first seed twice, with traces, and
    /// reports the first line where they differ (see
    /// [`check_determinism`]).
    pub fn check_determinism<S>(&self, mut setup: impl FnMut(&Sim) -> S) -> Result<(), Divergence> {
        let seed = self.seeds().first().copied().unwrap_or(self.seed);
        check_determinism(seed, |sim| {
            let _state = setup(sim);
            let mut faults = Vec::new();
            self.apply_faults(sim, seed, &mut faults);
            sim.run_for(self.settle);
        })
    }

    /// The fault schedule of one run, then the healing.
    fn apply_faults(&self, sim: &Sim, seed: u64, log: &mut Vec<String>) {
        let mut rng = Rng::new(seed ^ 0xC4A0_5C4A_05C4_A05C);
        let hosts = sim.hosts();
        let mut active = Active::default();
        let end = sim.now() + self.duration;
        let mean = crate::world::nanos(self.interval).max(1);
        loop {
            // Uniform in 0..2·mean: the mean is `interval`.
            let gap = Duration::from_nanos(rng.below(2 * mean) + 1);
            let at = sim.now() + gap;
            if at >= end {
                break;
            }
            sim.run_for(gap);
            if let Some(line) = self.one_fault(sim, &hosts, &mut rng, &mut active) {
                log.push(format!("{:>12?} {line}", sim.now()));
            }
        }
        let rest = end.saturating_sub(sim.now());
        sim.run_for(rest);
        for line in active.heal(sim) {
            log.push(format!("{:>12?} {line}", sim.now()));
        }
    }

    /// Applies one random fault (or undoes an earlier one); returns its
    /// description, or `None` if the drawn kind had nothing to do.
    fn one_fault(
        &self,
        sim: &Sim,
        hosts: &[IpAddr],
        rng: &mut Rng,
        active: &mut Active,
    ) -> Option<String> {
        let f = self.faults;
        let kinds: Vec<u8> = [
            (f.partition, 0u8),
            (f.hold, 1),
            (f.reset, 2),
            (f.crash, 3),
            (f.slow, 4),
            (f.pause, 5),
            (f.refuse, 6),
            (f.link, 7),
        ]
        .into_iter()
        .filter_map(|(on, k)| on.then_some(k))
        .collect();
        if kinds.is_empty() || hosts.is_empty() {
            return None;
        }
        let pick = |rng: &mut Rng, v: &[IpAddr]| v[rng.below(v.len() as u64) as usize];
        let two = |rng: &mut Rng| {
            let a = pick(rng, hosts);
            let b = pick(rng, hosts);
            (a != b).then_some((a, b))
        };
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        // Half of the draws undo an active fault of the kind, if any.
        let undo = rng.below(2) == 0;
        match kind {
            0 => {
                if undo && !active.partitions.is_empty() {
                    let (a, b) = active
                        .partitions
                        .swap_remove(rng.below(active.partitions.len() as u64) as usize);
                    sim.heal(a, b);
                    return Some(format!("heal {a} {b}"));
                }
                let (a, b) = two(rng)?;
                sim.partition(a, b);
                active.partitions.push((a, b));
                Some(format!("partition {a} {b}"))
            }
            1 => {
                if undo && !active.holds.is_empty() {
                    let (a, b) = active
                        .holds
                        .swap_remove(rng.below(active.holds.len() as u64) as usize);
                    sim.release(a, b);
                    return Some(format!("release {a} {b}"));
                }
                let (a, b) = two(rng)?;
                sim.hold(a, b);
                active.holds.push((a, b));
                Some(format!("hold {a} {b}"))
            }
            2 => {
                let (a, b) = two(rng)?;
                sim.reset_connections(a, b);
                Some(format!("reset {a} {b}"))
            }
            3 => {
                if undo && !active.crashed.is_empty() {
                    let h = active
                        .crashed
                        .swap_remove(rng.below(active.crashed.len() as u64) as usize);
                    sim.restart(h);
                    return Some(format!("restart {h}"));
                }
                let up: Vec<IpAddr> = hosts.iter().copied().filter(|h| !sim.crashed(*h)).collect();
                if up.is_empty() {
                    return None;
                }
                let h = pick(rng, &up);
                let silently = rng.below(2) == 0;
                if silently {
                    sim.crash_silently(h);
                } else {
                    sim.crash(h);
                }
                active.crashed.push(h);
                Some(format!(
                    "crash{} {h}",
                    if silently { " silently" } else { "" }
                ))
            }
            4 => {
                let h = pick(rng, hosts);
                let d = if undo {
                    Duration::ZERO
                } else {
                    Duration::from_micros(1 + rng.below(1000))
                };
                sim.slow_receiver(h, d);
                active.slowed.push(h);
                Some(format!("slow_receiver {h} {d:?}"))
            }
            5 => {
                if undo && !active.paused.is_empty() {
                    let h = active
                        .paused
                        .swap_remove(rng.below(active.paused.len() as u64) as usize);
                    sim.resume_loop(h);
                    return Some(format!("resume_loop {h}"));
                }
                let h = pick(rng, hosts);
                sim.pause_loop(h);
                active.paused.push(h);
                Some(format!("pause_loop {h}"))
            }
            6 => {
                let h = pick(rng, hosts);
                let refuse = !undo;
                sim.refuse_connections(h, refuse);
                active.refusing.push(h);
                Some(format!("refuse_connections {h} {refuse}"))
            }
            _ => {
                let (a, b) = two(rng)?;
                if !active.links.iter().any(|(x, y, _)| (*x, *y) == (a, b)) {
                    active.links.push((a, b, sim.link(a, b)));
                }
                let link = LinkConfig {
                    latency: Duration::from_micros(1 + rng.below(5000)),
                    bandwidth_bytes_per_sec: [0, 1_000_000, 100_000_000, 10_000_000_000]
                        [rng.below(4) as usize],
                    jitter: Duration::from_micros(rng.below(100)),
                };
                sim.set_link(a, b, link);
                Some(format!(
                    "link {a} {b} latency={:?} bandwidth={} jitter={:?}",
                    link.latency, link.bandwidth_bytes_per_sec, link.jitter
                ))
            }
        }
    }
}

/// Faults a run applied that healing undoes.
#[derive(Default)]
struct Active {
    partitions: Vec<(IpAddr, IpAddr)>,
    holds: Vec<(IpAddr, IpAddr)>,
    crashed: Vec<IpAddr>,
    slowed: Vec<IpAddr>,
    paused: Vec<IpAddr>,
    refusing: Vec<IpAddr>,
    links: Vec<(IpAddr, IpAddr, LinkConfig)>,
}

impl Active {
    fn heal(self, sim: &Sim) -> Vec<String> {
        let mut log = Vec::new();
        for (a, b) in self.partitions {
            sim.heal(a, b);
            log.push(format!("heal {a} {b}"));
        }
        for (a, b) in self.holds {
            sim.release(a, b);
            log.push(format!("release {a} {b}"));
        }
        for (a, b, link) in self.links {
            sim.set_link(a, b, link);
            log.push(format!("link {a} {b} restored"));
        }
        for h in self.slowed {
            sim.slow_receiver(h, Duration::ZERO);
        }
        for h in self.refusing {
            sim.refuse_connections(h, false);
        }
        for h in self.paused {
            sim.resume_loop(h);
            log.push(format!("resume_loop {h}"));
        }
        for h in self.crashed {
            sim.restart(h);
            log.push(format!("restart {h}"));
        }
        log
    }
}

/// What a successful [`Chaos::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChaosReport {
    /// Runs (seeds) that passed.
    pub runs: usize,
    /// Faults applied over all of them (healing included).
    pub faults: usize,
}

/// Where two runs of one scenario with one seed went apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The seed both runs used.
    pub seed: u64,
    /// 1-based number of the first differing trace line.
    pub line: usize,
    /// That line in the first run (`None`: the first run's trace ended).
    pub first: Option<String>,
    /// That line in the second run.
    pub second: Option<String>,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |l: &Option<String>| l.clone().unwrap_or_else(|| "<end of trace>".into());
        write!(
            f,
            "two runs with seed {:#x} differ at trace line {}:\n  first:  {}\n  second: {}",
            self.seed,
            self.line,
            show(&self.first),
            show(&self.second)
        )
    }
}

impl std::error::Error for Divergence {}

/// Runs `scenario` twice, each on a fresh [`Sim`] with `seed` and its
/// trace on, and compares the traces line by line. `scenario` builds its
/// application on the world it gets and drives it (for example with
/// [`Sim::run_for`]). `Err` names the first line that differs; a scenario
/// that reads the wall clock, races threads or iterates a `HashMap` to
/// decide what to do shows up here.
pub fn check_determinism(seed: u64, mut scenario: impl FnMut(&Sim)) -> Result<(), Divergence> {
    let mut trace = || {
        let sim = Sim::with_seed(seed);
        sim.enable_trace(true);
        scenario(&sim);
        sim.trace()
    };
    let (a, b) = (trace(), trace());
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut line = 0;
    loop {
        line += 1;
        match (la.next(), lb.next()) {
            (None, None) => return Ok(()),
            (x, y) if x == y => {}
            (x, y) => {
                return Err(Divergence {
                    seed,
                    line,
                    first: x.map(str::to_owned),
                    second: y.map(str::to_owned),
                })
            }
        }
    }
}
