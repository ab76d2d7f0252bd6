//! `netio-perf`: benchmarks of netio-rs providers, each run alternated
//! with the same test over plain `std::net` TCP in the same process.
//!
//! ```text
//! netio-perf [pingpong] [bw] [rate] [conns] [--provider sim|tcp|libfabric] [--baseline] [--busy-poll]
//!            [--sizes 64,1k,64k,1m] [--mode buffered,zero-copy,copy] [--count N | --duration SECS]
//!            [--warmup N] [--runs N] [--json [FILE]] [--listen ADDR | --connect ADDR]
//! ```
//!
//! See `docs/benchmarks.md` for the method and the results.

mod cli;
mod conns;
mod metrics;
mod plain;
mod proto;
mod provider;
mod report;
mod stats;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use cli::{Cli, SendMode, SizeLabel, TestKind};
use provider::{RunError, Spec};
use report::{Progress, Row, Setup, Status};

/// Exit code for usage errors.
const USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("netio-perf: {msg}");
            ExitCode::from(USAGE)
        }
    }
}

/// Checks the options that clap cannot.
fn validate(cli: &Cli) -> Result<(), String> {
    if cli.mode.contains(&SendMode::Async) {
        return Err(
            "send mode `async` is not available in this version of netio: the contract has no asynchronous send yet (use buffered, zero-copy or copy)"
                .into(),
        );
    }
    if cli.provider == "libfabric" && !netio::providers().contains(&"libfabric") {
        return Err(format!(
            "provider `libfabric` is not built in (it needs the system libfabric): \
             cargo run --release -p netio-perf --features libfabric -- …; available: {}",
            netio::providers().join(", ")
        ));
    }
    if !netio::providers().contains(&cli.provider.as_str()) {
        return Err(format!(
            "unknown provider `{}`; available: {}",
            cli.provider,
            netio::providers().join(", ")
        ));
    }
    let sim = cli.provider == "sim";
    if sim && cli.busy_poll {
        return Err("--busy-poll applies to the real event loop; the simulator runs on virtual time, driven on one thread".into());
    }
    if cli.thread_unsafe && (sim || cli.listen.is_some()) {
        return Err(
            "--thread-unsafe applies to the in-process and --connect runs of a socket provider"
                .into(),
        );
    }
    if sim && (cli.listen.is_some() || cli.connect.is_some()) {
        return Err(
            "--listen and --connect need a socket provider; the simulator runs in one process"
                .into(),
        );
    }
    if cli.serve_for.is_some() && cli.listen.is_none() {
        return Err("--serve-for goes with --listen".into());
    }
    Ok(())
}

fn run(cli: Cli) -> Result<ExitCode, String> {
    validate(&cli)?;
    let timeout = Duration::from_secs_f64(cli.timeout);
    if let Some(variant) = &cli.conns_child {
        let o = conns::Options {
            provider: cli.provider.clone(),
            connections: cli.connections,
            busy_poll: cli.busy_poll,
            timeout,
        };
        return Ok(match conns::child(variant, &o) {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::FAILURE,
        });
    }
    let mut tests: Vec<TestKind> = cli.tests.iter().chain(&cli.test_opt).copied().collect();
    tests.sort();
    tests.dedup();
    if tests.is_empty() {
        tests = vec![
            TestKind::Pingpong,
            TestKind::Bw,
            TestKind::Rate,
            TestKind::Conns,
        ];
    }
    let mut modes = cli.mode.clone();
    modes.dedup();
    if let Some(addr) = cli.listen {
        return serve(&cli, addr, timeout);
    }
    let sim = cli.provider == "sim";
    if cli.connect.is_some() && tests.contains(&TestKind::Conns) {
        return Err(
            "the conns test runs in one process; name the other tests with --connect".into(),
        );
    }
    let baseline = cli.baseline && !sim;
    let layout = match cli.connect {
        Some(a) => format!("client only, server at {a}"),
        None if sim => "two virtual hosts of one simulated world".into(),
        None => {
            "server and client in this process on separate loops and threads over 127.0.0.1".into()
        }
    };
    let setup = Setup {
        provider: cli.provider.clone(),
        busy_poll: cli.busy_poll,
        thread_unsafe: cli.thread_unsafe,
        runs: cli.runs,
        baseline,
        layout,
    };
    let duration = cli.duration.map(Duration::from_secs_f64);
    let mut progress = Progress::new();
    let mut rows = Vec::new();
    for &test in &tests {
        if test == TestKind::Conns {
            let o = conns::Options {
                provider: cli.provider.clone(),
                connections: cli.connections,
                busy_poll: cli.busy_poll,
                timeout,
            };
            let mut conns_rows = conns::run(&o, cli.runs, |s| progress.update(s));
            if cli.baseline {
                for r in &mut conns_rows {
                    r.notes.push(
                        "no plain-TCP baseline: plain sockets hold no buffers in user space".into(),
                    );
                }
            }
            rows.extend(conns_rows);
            continue;
        }
        let sizes = match &cli.sizes {
            Some(s) => s.0.clone(),
            None if test == TestKind::Bw => vec![64 << 10, 1 << 20],
            None => vec![64],
        };
        for &size in &sizes {
            for &mode in &modes {
                let (count, warmup) = defaults(test, size);
                let spec = Spec {
                    test,
                    size,
                    mode,
                    warmup: cli.warmup.unwrap_or(warmup),
                    count: match duration {
                        Some(_) => None,
                        None => Some(cli.count.unwrap_or(count)),
                    },
                    duration,
                    busy_poll: cli.busy_poll,
                    thread_unsafe: cli.thread_unsafe,
                    timeout,
                };
                rows.push(run_row(&cli, &spec, baseline, &mut progress));
            }
        }
    }
    progress.clear();
    if cli.baseline && sim {
        if let Some(r) = rows.first_mut() {
            r.notes.push("no baseline for the simulator: it runs on virtual time in one process; its figure is deliveries per real second".into());
        }
    }
    let settings = json!({
        "tests": tests.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "modes": modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "sizes": cli.sizes.as_ref().map(|s| s.0.clone()),
        "count": cli.count,
        "duration_s": cli.duration,
        "warmup": cli.warmup,
        "connections": cli.connections,
        "connect": cli.connect.map(|a| a.to_string()),
    });
    let doc = report::to_json(&setup, settings, &rows);
    match cli.json.as_deref() {
        Some("-") => {
            println!(
                "{}",
                serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?
            );
        }
        other => {
            let stdout = std::io::stdout();
            report::print_table(&mut stdout.lock(), &setup, &rows)
                .map_err(|e| format!("cannot write the table: {e}"))?;
            if let Some(path) = other {
                std::fs::write(
                    path,
                    serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n",
                )
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            }
        }
    }
    let failed = rows.iter().any(|r| matches!(r.status, Status::Failed(_)));
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Default (count, warm-up) of a test at a size.
fn defaults(test: TestKind, size: usize) -> (u64, u64) {
    match test {
        TestKind::Pingpong => (10_000, 1_000),
        TestKind::Bw => (
            ((256u64 << 20) / size as u64).clamp(64, 1_000_000),
            ((16u64 << 20) / size as u64).clamp(8, 100_000),
        ),
        TestKind::Rate => (500_000, 50_000),
        TestKind::Conns => (0, 0),
    }
}

/// Runs one row: `runs` provider runs, each followed by a baseline run.
fn run_row(cli: &Cli, spec: &Spec, baseline: bool, progress: &mut Progress) -> Row {
    let mut row = Row::new(spec.test, Some(spec.size), Some(spec.mode));
    let label = format!(
        "{} {} {}",
        spec.test.name(),
        SizeLabel(spec.size),
        spec.mode.name()
    );
    let connect = cli.connect.map(netio::EndpointAddress::from);
    for i in 0..cli.runs {
        progress.update(&format!(
            "{label}: run {}/{} {}",
            i + 1,
            cli.runs,
            cli.provider
        ));
        let r = if cli.provider == "sim" {
            provider::run_sim(spec)
        } else {
            provider::run_socket(&cli.provider, spec, connect)
        };
        match r {
            Ok(f) => row.provider_runs.push(f),
            Err(RunError::Unsupported(m)) => {
                row.status = Status::Unsupported(m);
                return row;
            }
            Err(RunError::Failed(m)) => {
                row.status = Status::Failed(format!("{} run {}: {m}", cli.provider, i + 1));
                return row;
            }
        }
        if baseline {
            progress.update(&format!("{label}: run {}/{} plain TCP", i + 1, cli.runs));
            let plain_addr = cli.connect.map(|mut a| {
                a.set_port(a.port().wrapping_add(1));
                a
            });
            match plain::run(spec, plain_addr) {
                Ok(f) => row.baseline_runs.push(f),
                Err(e) => {
                    row.status = Status::Failed(format!("plain TCP run {}: {e}", i + 1));
                    row.provider_runs.truncate(row.baseline_runs.len());
                    return row;
                }
            }
        }
    }
    if cli.provider == "sim" {
        row.notes.push(match spec.test {
            TestKind::Pingpong => "real time per round trip is the simulator's cost; (virtual) is the modelled link (10 µs latency each way)".into(),
            _ => "deliveries per real second: how fast the simulator delivers; (virtual): the modelled link".into(),
        });
    }
    row
}

/// `--listen`: serves every test until killed (or `--serve-for`), with the
/// plain-TCP baseline server on the next port when `--baseline`.
fn serve(cli: &Cli, addr: std::net::SocketAddr, timeout: Duration) -> Result<ExitCode, String> {
    let _ = timeout;
    let limit = cli.serve_for.map(Duration::from_secs_f64);
    let max_size = cli
        .sizes
        .as_ref()
        .and_then(|s| s.0.iter().copied().max())
        .unwrap_or(1 << 20);
    if cli.baseline {
        let mut plain_addr = addr;
        plain_addr.set_port(addr.port().wrapping_add(1));
        let busy = cli.busy_poll;
        std::thread::spawn(move || {
            if let Err(e) = plain::serve(plain_addr, busy, limit, |a| {
                println!("plain TCP baseline listening on {a}")
            }) {
                eprintln!("netio-perf: plain TCP baseline server: {e}");
            }
        });
    }
    provider::serve(
        &cli.provider,
        addr.into(),
        max_size,
        cli.busy_poll,
        limit,
        |a| {
            println!(
                "{} server listening on {a} (messages up to {}; Ctrl-C to stop)",
                cli.provider,
                SizeLabel(max_size)
            )
        },
    )
    .map_err(|e| e.to_string())?;
    Ok(ExitCode::SUCCESS)
}
