//! Ping-pong over TCP: `--count` round trips of a `--size`-byte message,
//! each sent when the echo of the previous one arrived. Prints the
//! round-trip latency (min, median, p99, max) and the rate. These are
//! measurements of this machine at this moment, not guarantees.
//!
//! ```text
//! cargo run --release -p netio-examples --bin pingpong                     # both, one process
//! cargo run --release -p netio-examples --bin pingpong -- --listen [ADDR]  # server
//! cargo run --release -p netio-examples --bin pingpong -- --connect ADDR   # client
//!     [--count N] [--size BYTES] [--clients N] [--timeout SECS] [--provider tcp|libfabric] [--fabric NAME]
//! ```
//!
//! A server accepts messages up to max(`--size`, 64 KiB): give it the same
//! `--size` as the client for larger messages; its connections share one
//! receive pool where the provider offers it ([`tcp::server_params`]: its
//! memory does not grow with the clients). Options:
//! [`netio_examples::cli`].

use std::error::Error;
use std::process::ExitCode;

use netio_examples::cli::{Options, Role};
use netio_examples::tcp::{self, Target};

const USAGE: &str = "\
usage: pingpong [--listen [ADDR] | --connect ADDR] [--count N] [--size BYTES] [--clients N] [--timeout SECS] [--provider tcp|libfabric] [--fabric NAME]
  no --listen/--connect: server and client in this process over 127.0.0.1";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let o = Options::parse(std::env::args().skip(1), 10_000, Some(64))
        .map_err(|e| format!("{e}\n{USAGE}"))?;
    if o.help {
        println!("{USAGE}");
        return Ok(());
    }
    let target = match o.role {
        Role::Listen(addr) => {
            let run = netio_examples::with_provider!(o, |P| tcp::serve_on::<P>(
                addr,
                o.size,
                o.clients,
                o.timeout,
                |a| { println!("listening on {a}") }
            ))?;
            let s = &run.stats;
            println!(
                "server: {} connection(s), {} closed, echoed {}, failed {}",
                s.connections, s.closed, s.echoed, s.failed
            );
            if run.timed_out {
                return Err("time limit reached before the clients were done".into());
            }
            return Ok(());
        }
        Role::Connect(addr) => Target::Connect(addr),
        Role::Both => Target::Loopback,
    };
    let run = netio_examples::with_provider!(o, |P| tcp::pingpong_on::<P>(
        target, o.count, o.size, o.timeout
    ))?;
    let r = &run.report;
    let setup = match target {
        Target::Loopback => "server and client in one process, one event loop",
        Target::Connect(_) => "client",
    };
    println!(
        "pingpong over {} to {} ({setup}): {} round trips of {} bytes",
        if o.provider == "tcp" {
            "TCP"
        } else {
            "libfabric"
        },
        run.server_address,
        r.sent,
        o.size
    );
    match r.latency() {
        Some(l) => println!("round-trip latency: {l}"),
        None => println!("round-trip latency: no echo received"),
    }
    if let Some(rate) = r.round_trips_per_sec() {
        println!(
            "rate: {rate:.0} round trips/s = {:.0} messages/s counting both directions ({:?} for all)",
            2.0 * rate,
            r.elapsed
        );
    }
    println!(
        "echoes intact {}, mismatched {}, closed: {}",
        r.matched,
        r.mismatched,
        r.closed.as_deref().or(r.refused.as_deref()).unwrap_or("no")
    );
    if run.timed_out {
        return Err("time limit reached".into());
    }
    if r.matched != o.count || r.mismatched != 0 {
        return Err(format!("expected {} intact echoes", o.count).into());
    }
    Ok(())
}
