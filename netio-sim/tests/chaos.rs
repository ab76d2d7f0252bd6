//! The chaos runner and the determinism check, on the application of the
//! `chaos` example (a producer forwarding records to a collector, with a
//! planted bug).

#[path = "../examples/chaos/app.rs"]
mod app;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use netio_sim::chaos::{check_determinism, Chaos, Faults};
use netio_sim::LinkConfig;

fn chaos() -> Chaos {
    Chaos::new()
        .runs(20)
        .duration(Duration::from_secs(2))
        .interval(Duration::from_millis(50))
        .settle(Duration::from_secs(10))
}

#[test]
fn the_chaos_runner_finds_the_planted_bug_and_its_seed_replays_it() {
    if std::env::var_os("NETIO_CHAOS_SEED").is_some() {
        return; // replaying something else
    }
    let failure = chaos()
        .run(|sim| app::setup(sim, app::Ack::OnCompletion), app::check)
        .expect_err("forgetting records on completion loses some under faults");
    assert!(
        failure.message.contains("never reached the collector"),
        "{failure}"
    );
    assert!(!failure.faults.is_empty());
    assert!(
        failure
            .replay
            .starts_with(&format!("NETIO_CHAOS_SEED={:#x} cargo test", failure.seed)),
        "{}",
        failure.replay
    );
    // The seed alone replays the same run: same faults, same outcome.
    let again = chaos()
        .seed(failure.seed)
        .runs(1)
        .run(|sim| app::setup(sim, app::Ack::OnCompletion), app::check)
        .expect_err("the same seed fails again");
    assert_eq!(again.seed, failure.seed);
    assert_eq!(again.message, failure.message);
    assert_eq!(again.faults, failure.faults);
}

#[test]
fn the_fixed_application_survives_the_same_chaos() {
    let report = chaos().run_or_panic(|sim| app::setup(sim, app::Ack::FromCollector), app::check);
    assert!(report.runs >= 1);
    assert!(report.faults > 10 * report.runs, "{report:?}");
}

#[test]
fn without_faults_even_the_planted_bug_loses_nothing() {
    let report = chaos()
        .runs(3)
        .faults(Faults::NONE)
        .run_or_panic(|sim| app::setup(sim, app::Ack::OnCompletion), app::check);
    assert_eq!(report.faults, 0);
}

#[test]
fn a_panic_in_the_application_is_a_failure_with_its_message() {
    let failure = chaos()
        .runs(1)
        .faults(Faults::NONE)
        .run(|_| (), |_, _| -> Result<(), String> { panic!("boom") })
        .expect_err("a panic fails the run");
    assert!(failure.message.contains("boom"), "{}", failure.message);
}

#[test]
fn check_determinism_accepts_the_chaos_run_of_the_example() {
    chaos()
        .check_determinism(|sim| app::setup(sim, app::Ack::FromCollector))
        .unwrap();
}

#[test]
fn check_determinism_names_the_first_line_where_two_runs_differ() {
    // A scenario that depends on something outside the seed: a counter
    // kept across runs (as a wall clock or a thread race would be).
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let err = check_determinism(7, |sim| {
        let _disks = app::setup(sim, app::Ack::FromCollector);
        sim.run_for(Duration::from_millis(20));
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        let hosts = sim.hosts();
        sim.set_link(
            hosts[0],
            hosts[1],
            LinkConfig::new(Duration::from_micros(10 + n), 0),
        );
        sim.run_for(Duration::from_millis(20));
    })
    .expect_err("the second run sets another latency");
    assert_eq!(err.seed, 7);
    let (a, b) = (err.first.clone().unwrap(), err.second.clone().unwrap());
    assert!(
        a.contains("latency=10µs") && b.contains("latency=11µs"),
        "{err}"
    );
    assert!(err.line > 1);
}

/// The failure `run_parallel` reports is that of the smallest failing
/// seed, whatever the number of threads, also when a larger failing seed
/// finishes first: here seeds 4, 9, 14, … fail, and seed 4 takes longest.
#[test]
fn run_parallel_reports_the_smallest_failing_seed_whatever_the_thread_count() {
    if std::env::var_os("NETIO_CHAOS_SEED").is_some() {
        return; // replaying something else
    }
    let quick = || {
        Chaos::new()
            .runs(30)
            .duration(Duration::from_millis(10))
            .settle(Duration::from_millis(10))
            .faults(Faults::NONE)
    };
    let check = |sim: &netio_sim::Sim, _: &mut ()| {
        if sim.seed() == 4 {
            std::thread::sleep(Duration::from_millis(100));
        }
        if sim.seed() % 5 == 4 {
            Err(format!("seed {} fails", sim.seed()))
        } else {
            Ok(())
        }
    };
    for threads in [1, 2, 3, 8] {
        let failure = quick()
            .threads(threads)
            .run_parallel(|_| (), check)
            .expect_err("seeds 4, 9, 14, … fail");
        assert_eq!(failure.seed, 4, "{threads} threads: {failure}");
        assert_eq!(failure.message, "seed 4 fails");
        assert!(
            failure
                .replay
                .starts_with("NETIO_CHAOS_SEED=0x4 cargo test")
                && failure
                    .replay
                    .contains("run_parallel_reports_the_smallest_failing_seed"),
            "the replay command names this test, not a worker thread: {}",
            failure.replay
        );
    }
    // Without failures every seed runs once.
    let report = quick()
        .threads(3)
        .run_parallel(|_| (), |_, _| Ok(()))
        .expect("nothing fails");
    assert_eq!(report.runs, 30);
}

#[test]
fn run_parallel_finds_the_planted_bug_at_the_seed_run_finds() {
    if std::env::var_os("NETIO_CHAOS_SEED").is_some() {
        return; // replaying something else
    }
    let one = chaos()
        .run(|sim| app::setup(sim, app::Ack::OnCompletion), app::check)
        .expect_err("the planted bug is found");
    let two = chaos()
        .threads(2)
        .run_parallel(|sim| app::setup(sim, app::Ack::OnCompletion), app::check)
        .expect_err("the planted bug is found on two threads");
    assert_eq!(two.seed, one.seed);
    assert_eq!(two.message, one.message);
    assert_eq!(two.faults, one.faults, "the same faults, in the same order");
    let fixed = chaos()
        .threads(2)
        .run_parallel(|sim| app::setup(sim, app::Ack::FromCollector), app::check)
        .expect("the fixed producer passes every seed");
    assert_eq!(fixed.runs, 20);
}
