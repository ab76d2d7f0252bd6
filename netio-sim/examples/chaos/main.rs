//! Finds a planted application bug with the chaos runner.
//!
//! A producer makes 300 records, one every 5 ms, and forwards them to a collector while the network
//! partitions, holds, resets, slows down, and hosts crash and restart
//! (see `app.rs`). The planted bug: the producer forgets a record when its
//! send completes, which on TCP only means "handed to the kernel". The
//! chaos runner finds a seed that loses records, prints it with the faults
//! it applied and the command that replays it; then the fixed producer
//! (forget on the collector's acknowledgement) passes the same seeds.
//!
//! The seeds run on every core (`Chaos::run_parallel`; the failing seed
//! reported is the same for any number of threads), and the fixed run
//! prints how many seeds a second that made.
//!
//! ```text
//! cargo run -p netio-sim --example chaos            # find the bug, check the fix
//! NETIO_CHAOS_SEED=0x3 cargo run -p netio-sim --example chaos   # replay one seed
//! NETIO_CHAOS_THREADS=1 cargo run -p netio-sim --example chaos  # on one thread
//! ```
//!
//! Exits with 0 when the bug was found and the fix passes, 1 otherwise.

mod app;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use netio_sim::chaos::{check_determinism, Chaos, Faults};

fn main() -> ExitCode {
    let chaos = Chaos::new()
        .runs(50)
        .duration(Duration::from_secs(2))
        .interval(Duration::from_millis(50))
        .settle(Duration::from_secs(10))
        .faults(Faults::ALL)
        .replay_command("cargo run -p netio-sim --example chaos");

    // First: the application must be reproducible, or no seed can be
    // replayed.
    if let Err(d) = check_determinism(1, |sim| {
        let _disks = app::setup(sim, app::Ack::OnCompletion);
        sim.run_for(Duration::from_secs(1));
    }) {
        eprintln!("not deterministic: {d}");
        return ExitCode::FAILURE;
    }

    println!("planted bug: the producer forgets a record when its send completes");
    let found = match chaos.run_parallel(|sim| app::setup(sim, app::Ack::OnCompletion), app::check)
    {
        Ok(r) => {
            println!("  not found in {} runs ({} faults)", r.runs, r.faults);
            false
        }
        Err(failure) => {
            println!("  found:\n{failure}");
            true
        }
    };

    println!("fixed: the producer forgets a record when the collector acknowledges it");
    let started = Instant::now();
    let fixed = match chaos.run_parallel(|sim| app::setup(sim, app::Ack::FromCollector), app::check)
    {
        Ok(r) => {
            let secs = started.elapsed().as_secs_f64();
            println!(
                "  {} runs passed ({} faults applied) in {secs:.2} s on {} threads: {:.1} seeds/s",
                r.runs,
                r.faults,
                chaos.thread_count(),
                r.runs as f64 / secs
            );
            true
        }
        Err(failure) => {
            println!("  fails too:\n{failure}");
            false
        }
    };
    if found && fixed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
