//! `netio-perf`: benchmarks of netio-rs providers, each run alternated
//! with the same test over plain `std::net` TCP in the same process.
//!
//! ```text
//! netio-perf [pingpong] [bw] [rate] [conns] [--provider sim|tcp|libfabric] [--baseline] [--busy-poll]
//!            [--sizes 64,1k,64k,1m] [--mode buffered,zero-copy,copy] [--count N | --duration SECS]
//!            [--warmup N] [--runs N] [--json [FILE]] [--listen ADDR | --connect ADDR]
//! netio-perf pingpong --provider libfabric --fi-baseline [--sizes ...] [--count N] [--runs N] [--json [FILE]]
//! ```
//!
//! `--fi-baseline` alternates the libfabric provider's ping-pong with
//! libfabric's own `fi_pingpong` (server and client processes over
//! 127.0.0.1, the same fabric provider and endpoint type (`-e msg` or `-e rdm`), the same
//! size and count); `fi_pingpong` busy-polls its completion queues, so the
//! option implies `--busy-poll`. `fi_pingpong` reports the mean time of a
//! one-way transfer (`usec/xfer`): its round trip is 2 × `usec/xfer`,
//! compared with netio-perf's mean round trip (see the `fi` module).
//!
//! See `docs/benchmarks.md` for the method and the results.

mod cli;
mod conns;
mod fi;
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
use report::{Baseline, Progress, Row, Setup, Status};

/// Exit code for usage errors.
const USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(f) = &cli.fabric {
        if cli.provider != "libfabric" {
            eprintln!(
                "netio-perf: --fabric names a libfabric provider: use it with --provider libfabric"
            );
            return ExitCode::from(USAGE);
        }
        // Read by LibfabricConfig::from_env (and the fi_pingpong baseline)
        // when backends are created, after this, before other threads run.
        std::env::set_var("NETIO_LIBFABRIC_PROVIDER", f);
    }
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
    if cli.fi_baseline {
        if cli.provider != "libfabric" {
            return Err(format!(
                "--fi-baseline compares the libfabric provider with libfabric's fi_pingpong: \
                 use it with --provider libfabric (not `{}`)",
                cli.provider
            ));
        }
        if let Some(t) = cli
            .tests
            .iter()
            .chain(&cli.test_opt)
            .find(|t| **t != TestKind::Pingpong)
        {
            return Err(format!(
                "--fi-baseline compares ping-pong only, not `{}`: fi_pingpong has no one-way \
                 stream test (its MB/sec is the ping-pong's bytes of both directions over its \
                 time); run {} without --fi-baseline",
                t.name(),
                t.name()
            ));
        }
        if cli.count.is_some_and(|c| c > i32::MAX as u64) {
            return Err(format!(
                "--count is at most {} with --fi-baseline (fi_pingpong's -I)",
                i32::MAX
            ));
        }
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
    let fi = if cli.fi_baseline {
        Some(fi_pingpong()?)
    } else {
        None
    };
    if tests.is_empty() && fi.is_some() {
        tests = vec![TestKind::Pingpong];
    }
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
    let baseline = if fi.is_some() {
        Some(Baseline::FiPingpong)
    } else if cli.baseline && !sim {
        Some(Baseline::PlainTcp)
    } else {
        None
    };
    // fi_pingpong polls its completion queues without sleeping: netio's
    // loops do the same for a like-for-like comparison.
    let busy_poll = cli.busy_poll || fi.is_some();
    let layout = match cli.connect {
        Some(a) => format!("client only, server at {a}"),
        None if sim => "two virtual hosts of one simulated world".into(),
        None => {
            "server and client in this process on separate loops and threads over 127.0.0.1".into()
        }
    };
    let setup = Setup {
        provider: cli.provider.clone(),
        busy_poll,
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
                    busy_poll,
                    thread_unsafe: cli.thread_unsafe,
                    timeout,
                };
                rows.push(match &fi {
                    Some(fi) => run_fi_row(&cli, &spec, fi, &mut progress),
                    None => run_row(
                        &cli,
                        &spec,
                        baseline == Some(Baseline::PlainTcp),
                        &mut progress,
                    ),
                });
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
        "fi_pingpong": fi.as_ref().map(|f| json!({
            "program": f.program.display().to_string(),
            "fabric_provider": f.fabric,
            "domain": f.domain,
            "environment": f.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        })),
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

/// `fi_pingpong` for `--fi-baseline`, over the libfabric provider's fabric
/// provider and domain.
fn fi_pingpong() -> Result<fi::FiPingpong, String> {
    let program = fi::locate()?;
    let (fabric, domain, sockets_pe_waittime, endpoint) = fabric_settings()?;
    Ok(fi::FiPingpong::new(program, &fabric, domain, sockets_pe_waittime).with_endpoint(endpoint))
}

/// A fabric provider, domain, `FI_SOCKETS_PE_WAITTIME` setting and
/// endpoint type (`msg` or `rdm`).
type FabricSettings = (String, Option<String>, Option<u32>, &'static str);

/// The libfabric provider's fabric provider, domain,
/// `FI_SOCKETS_PE_WAITTIME` setting and endpoint type, as its backends
/// read them.
#[cfg(feature = "libfabric")]
fn fabric_settings() -> Result<FabricSettings, String> {
    let c = netio::libfabric::LibfabricConfig::from_env();
    let endpoint = match c.resolved_endpoint() {
        netio::libfabric::EndpointType::Rdm => "rdm",
        _ => "msg",
    };
    Ok((c.provider, c.domain, c.sockets_pe_waittime, endpoint))
}

/// Without the libfabric provider there is nothing to compare.
#[cfg(not(feature = "libfabric"))]
fn fabric_settings() -> Result<FabricSettings, String> {
    Err("--fi-baseline needs the libfabric provider, which is not built in".into())
}

/// Runs one `--fi-baseline` row: `runs` runs of the provider's ping-pong,
/// each followed by a run of `fi_pingpong` with the same size and count.
fn run_fi_row(cli: &Cli, spec: &Spec, fi: &fi::FiPingpong, progress: &mut Progress) -> Row {
    let mut row = Row::new(spec.test, Some(spec.size), Some(spec.mode));
    let label = format!(
        "{} {} {}",
        spec.test.name(),
        SizeLabel(spec.size),
        spec.mode.name()
    );
    let count = spec.count.unwrap_or(1);
    for i in 0..cli.runs {
        progress.update(&format!(
            "{label}: run {}/{} {}",
            i + 1,
            cli.runs,
            cli.provider
        ));
        match provider::run_socket(&cli.provider, spec, None) {
            Ok(f) => row.provider_runs.push(metrics::with_means(f, spec.size)),
            Err(RunError::Unsupported(m)) => {
                row.status = Status::Unsupported(m);
                return row;
            }
            Err(RunError::Failed(m)) => {
                row.status = Status::Failed(format!("{} run {}: {m}", cli.provider, i + 1));
                return row;
            }
        }
        progress.update(&format!("{label}: run {}/{} fi_pingpong", i + 1, cli.runs));
        match fi.run(spec.size, count, spec.timeout) {
            Ok(s) => row.baseline_runs.push(s.figures()),
            Err(e) => {
                row.status = Status::Failed(format!("fi_pingpong run {}: {e}", i + 1));
                row.provider_runs.truncate(row.baseline_runs.len());
                return row;
            }
        }
    }
    row.notes.push(format!(
        "fi_pingpong: {} (fabric provider `{}`); it times all {count} iterations with no warm-up, netio-perf times {count} after {} unmeasured",
        fi.command_lines(spec.size, count),
        fi.fabric,
        spec.warmup
    ));
    row.notes.push(
        "mean round trip: fi_pingpong's 2 × usec/xfer, netio-perf's measured time / round trips; bytes, both directions: 2 × size × round trips/s (fi_pingpong's MB/sec)".into(),
    );
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
