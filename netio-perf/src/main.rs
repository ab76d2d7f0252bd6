//! `netio-perf`: benchmarks of netio-rs providers, each run alternated
//! with the same test over plain `std::net` TCP in the same process.
//!
//! ```text
//! netio-perf [pingpong] [bw] [rate] [conns] [--provider sim|tcp|libfabric] [--baseline] [--busy-poll]
//!            [--sizes 64,1k,64k,1m] [--mode copy,copy-batch,buffered,buffered-batch,zero-copy]
//!            [--count N | --duration SECS] [--warmup N] [--runs N] [--socket-buffers SIZE]
//!            [--json [FILE]] [--listen ADDR | --connect ADDR]
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
//! The method (see `docs/benchmarks.md` for it and the results): runs in
//! pairs, A B B A A B B A … (provider, baseline), each ratio within its
//! pair, each figure the median over the runs; runs timed (0.5 s of round
//! trips, 0.6 s of sending) unless `--count` is given; round trips
//! reported as mean (the headline), median, p99, p99.9 and max; the plain
//! baseline tuned by measurement (see the `plain` module).

mod aio;
mod cli;
mod conns;
mod fi;
mod metrics;
mod plain;
mod proto;
mod provider;
mod report;
mod server_proc;
mod stats;
mod stop;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;

use cli::{Cli, SendMode, SimProfile, SizeLabel, TestKind};
use provider::{RunError, Spec};
use report::{Baseline, Progress, Row, Setup, Side, Status};

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
    if cli.fi_baseline && cli.mode.contains(&SendMode::Async) {
        return Err(
            "--fi-baseline compares the provider's copy and zero-copy sends with fi_pingpong; \
             send mode `async` is compared with the callback path (--baseline)"
                .into(),
        );
    }
    if let Some(n) = cli.socket_buffers {
        if cli.provider != "tcp" {
            return Err(format!(
                "--socket-buffers sets the tcp provider's sockets and the plain baseline's alike; \
                 provider `{}` does not take it",
                cli.provider
            ));
        }
        if n < 4096 || n > i32::MAX as usize {
            return Err("--socket-buffers: between 4k and 2047m".into());
        }
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
    if cli.sim_profile.is_some() && !sim {
        return Err(format!(
            "--sim-profile chooses the simulator's profile: use it with --provider sim (not `{}`)",
            cli.provider
        ));
    }
    if cli.sim_shared && !sim {
        return Err(format!(
            "--sim-shared chooses how the simulator's world is shared: use it with --provider sim (not `{}`)",
            cli.provider
        ));
    }
    if cli.thread_unsafe && sim {
        return Err("--thread-unsafe applies to the socket providers' backends".into());
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
        None if sim => format!(
            "two virtual hosts of one simulated world, {} profile",
            match cli.sim_profile.unwrap_or_default() {
                SimProfile::Tcp => "TCP (a send completes when the window takes it)",
                SimProfile::Rdma => "RDMA (a send completes when it is delivered)",
            }
        ),
        None if fi.is_some() => "client in this process, server in a second one (`netio-perf --listen`, as fi_pingpong runs) over 127.0.0.1".into(),
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
        socket_buffers: cli.socket_buffers,
    };
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
        let mut modes = cli.mode.clone();
        if modes.is_empty() {
            modes = default_modes(test);
        }
        let mut seen = Vec::new();
        modes.retain(|m| {
            let new = !seen.contains(m);
            seen.push(*m);
            new
        });
        for &size in &sizes {
            for &mode in &modes {
                let (warmup, default_duration) = defaults(test, size);
                let (count, duration) = match (cli.count, cli.duration) {
                    (Some(n), _) => (Some(n), None),
                    (None, Some(d)) => (None, Some(Duration::from_secs_f64(d))),
                    // fi_pingpong takes a count: calibrated in run_fi_row.
                    (None, None) if fi.is_some() => (None, None),
                    (None, None) => (None, Some(default_duration)),
                };
                let spec = Spec {
                    test,
                    size,
                    mode,
                    warmup: cli.warmup.unwrap_or(warmup),
                    count,
                    duration,
                    busy_poll,
                    thread_unsafe: cli.thread_unsafe,
                    network_mode: cli.sim_profile.unwrap_or_default().mode(),
                    sim_shared: cli.sim_shared,
                    timeout,
                    socket_buffers: cli.socket_buffers,
                    plain_write_buffer: cli
                        .plain_write_buffer
                        .unwrap_or_else(|| plain::write_buffer(size)),
                    plain_read_buffer: cli
                        .plain_read_buffer
                        .unwrap_or_else(|| plain::read_buffer(size)),
                    recv_buffers: cli.recv_buffers.map(|n| n as usize),
                };
                if mode.is_batch() && test == TestKind::Pingpong {
                    let mut row = Row::new(test, Some(size), Some(mode));
                    row.status = Status::Unsupported(
                        "batch sends apply to the one-way tests (bw, rate); ping-pong sends one message at a time".into(),
                    );
                    rows.push(row);
                    continue;
                }
                // An async row's baseline is the callback path of the same
                // provider (copy sends), on the simulator too.
                let row_base = match baseline {
                    _ if mode == SendMode::Async && cli.baseline => RowBaseline::Callbacks,
                    Some(Baseline::PlainTcp) => RowBaseline::PlainTcp,
                    _ => RowBaseline::None,
                };
                let mut row = match &fi {
                    Some(fi) => run_fi_row(&cli, &spec, fi, &mut progress),
                    None => run_row(&cli, &spec, row_base, &mut progress),
                };
                if fi.is_none() {
                    row.notes
                        .insert(0, measure_note(&spec, row_base == RowBaseline::PlainTcp));
                }
                rows.push(row);
            }
        }
    }
    progress.clear();
    if cli.baseline && sim {
        if let Some(r) = rows.iter_mut().find(|r| r.baseline_label.is_none()) {
            r.notes.push("no baseline for the simulator: it runs on virtual time in one process; its figure is deliveries per real second".into());
        }
    }
    let settings = json!({
        "tests": tests.iter().map(|t| t.name()).collect::<Vec<_>>(),
        "modes": cli.mode.iter().map(|m| m.name()).collect::<Vec<_>>(),
        "default_modes": tests.iter().map(|&t| (t.name().to_string(), json!(default_modes(t).iter().map(|m| m.name()).collect::<Vec<_>>()))).collect::<serde_json::Map<_, _>>(),
        "default_duration_s": tests.iter().filter(|&&t| t != TestKind::Conns).map(|&t| (t.name().to_string(), json!(defaults(t, 64).1.as_secs_f64()))).collect::<serde_json::Map<_, _>>(),
        "socket_buffers": cli.socket_buffers,
        "plain_write_buffer": cli.plain_write_buffer,
        "plain_read_buffer": cli.plain_read_buffer,
        "recv_buffers": cli.recv_buffers,
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

/// Measured time per run of ping-pong without `--count` or `--duration`.
const PINGPONG_SECS: f64 = 0.5;

/// Sending time per run of the one-way tests without `--count` or
/// `--duration`: the receiver's measured span starts when the first
/// measured message arrives, behind up to a window of warm-up messages
/// (16 MiB), so the sender sends a little longer than the 0.5 s every run
/// is to measure.
const ONE_WAY_SECS: f64 = 0.6;

/// Per run with `--fi-baseline` and no `--count`: the count is chosen so
/// that the faster side takes at least this long.
const FI_SECS: f64 = 0.5;

/// Default (warm-up, measured time) of a test at a size.
fn defaults(test: TestKind, size: usize) -> (u64, Duration) {
    match test {
        TestKind::Pingpong => (1_000, Duration::from_secs_f64(PINGPONG_SECS)),
        TestKind::Bw => (
            ((16u64 << 20) / size as u64).clamp(8, 100_000),
            Duration::from_secs_f64(ONE_WAY_SECS),
        ),
        TestKind::Rate => (100_000, Duration::from_secs_f64(ONE_WAY_SECS)),
        TestKind::Conns => (0, Duration::ZERO),
    }
}

/// Default send modes of a test: per-message copy sends, and for `rate`
/// batch copy sends too.
fn default_modes(test: TestKind) -> Vec<SendMode> {
    match test {
        TestKind::Rate => vec![SendMode::Copy, SendMode::CopyBatch],
        _ => vec![SendMode::Copy],
    }
}

/// What a row measured and how the baseline was set up, for its notes.
fn measure_note(spec: &Spec, baseline: bool) -> String {
    let what = match spec.test {
        TestKind::Pingpong => "round trips",
        _ => "messages",
    };
    let mut n = match (spec.count, spec.duration) {
        (Some(c), _) => format!("{c} {what} per run"),
        (None, Some(d)) if spec.role() == proto::Role::Sink => {
            format!("sending for {} s per run", d.as_secs_f64())
        }
        (None, Some(d)) => format!("{} s of {what} per run", d.as_secs_f64()),
        (None, None) => String::new(),
    };
    n += &format!(", after {} unmeasured", spec.warmup);
    if let Some(b) = spec.recv_buffers {
        n += &format!("; receive buffers per connection: {b}");
    }
    if baseline {
        n += &format!(
            "; plain TCP reads into a {} buffer",
            SizeLabel(spec.plain_read_buffer)
        );
        if spec.role() == proto::Role::Sink {
            n += &match spec.plain_write_buffer {
                0 => " and writes each frame straight to the socket".to_string(),
                b => format!(" and writes each frame to a {} BufWriter", SizeLabel(b)),
            };
        }
    }
    n
}

/// What a row's provider runs are alternated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowBaseline {
    /// Nothing.
    None,
    /// The same test over plain TCP.
    PlainTcp,
    /// The same test through the provider's callback API with copy sends
    /// (the baseline of `--mode async`).
    Callbacks,
}

/// Runs one row: `runs` pairs of a provider run and a baseline run, in
/// the order A B B A A B B A …; without a baseline, `runs` provider runs.
fn run_row(cli: &Cli, spec: &Spec, base: RowBaseline, progress: &mut Progress) -> Row {
    let baseline = base != RowBaseline::None;
    let mut row = Row::new(spec.test, Some(spec.size), Some(spec.mode));
    let callbacks = Spec {
        mode: SendMode::Copy,
        ..spec.clone()
    };
    if base == RowBaseline::Callbacks {
        row.baseline_label = Some("callbacks");
        row.notes.push(format!(
            "baseline: the same test through {}'s callback API (handler callbacks, copy sends: \
             --mode copy), alternated A B B A ... in this process; ratio = async/callbacks",
            cli.provider
        ));
    }
    let label = format!(
        "{} {} {}",
        spec.test.name(),
        SizeLabel(spec.size),
        spec.mode.name()
    );
    let connect = cli.connect.map(netio::EndpointAddress::from);
    let plain_addr = cli.connect.map(|mut a| {
        a.set_port(a.port().wrapping_add(1));
        a
    });
    for i in 0..cli.runs {
        let order = if baseline {
            report::pair_order(i).to_vec()
        } else {
            vec![Side::Provider]
        };
        for side in order {
            match side {
                Side::Provider => {
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
                    if !add_provider_run(&mut row, r, &cli.provider, i) {
                        return row;
                    }
                }
                Side::Baseline if base == RowBaseline::Callbacks => {
                    progress.update(&format!("{label}: run {}/{} callbacks", i + 1, cli.runs));
                    let r = if cli.provider == "sim" {
                        provider::run_sim(&callbacks)
                    } else {
                        provider::run_socket(&cli.provider, &callbacks, connect)
                    };
                    match r {
                        Ok(f) => row.baseline_runs.push(f),
                        Err(e) => {
                            row.status = Status::Failed(format!("callback run {}: {e}", i + 1));
                            row.provider_runs.truncate(row.baseline_runs.len());
                            return row;
                        }
                    }
                }
                Side::Baseline => {
                    progress.update(&format!("{label}: run {}/{} plain TCP", i + 1, cli.runs));
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
            row.order.push(side);
        }
    }
    if cli.provider == "sim" {
        row.notes.push(match spec.test {
            TestKind::Pingpong => "real time per round trip is the simulator's cost; (virtual) is the modelled link (10 µs latency each way)".into(),
            _ => "deliveries per real second: how fast the simulator delivers; (virtual): the modelled link".into(),
        });
        row.notes.push(if cli.sim_shared {
            "the world is shared (--sim-shared): callbacks run with it unlocked for other threads".into()
        } else {
            "the world is driver-only (Sim::set_driver_only): the run makes every call on the thread that drives it; --sim-shared for the default".into()
        });
    }
    row
}

/// `fi_pingpong` for `--fi-baseline`, over the libfabric provider's fabric
/// provider and domain.
/// Adds the figures of provider run `i` to `row`, or ends the row with
/// the run's error: `false` when the row is done.
fn add_provider_run(
    row: &mut Row,
    r: Result<metrics::Figures, RunError>,
    provider: &str,
    i: u32,
) -> bool {
    match r {
        Ok(f) => {
            row.provider_runs.push(f);
            true
        }
        Err(RunError::Unsupported(m)) => {
            row.status = Status::Unsupported(m);
            false
        }
        Err(RunError::Failed(m)) => {
            row.status = Status::Failed(format!("{provider} run {}: {m}", i + 1));
            row.baseline_runs.truncate(row.provider_runs.len());
            false
        }
    }
}

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

/// The count of a `--fi-baseline` row without `--count`: one short run
/// of each side (not reported), then enough round trips that the faster
/// side takes at least [`FI_SECS`], with a fifth to spare, rounded up to a
/// thousand. netio's side is taken at its median round trip (a stall in
/// its short run would make the count too small); `fi_pingpong` gives
/// only its mean.
fn fi_count(cli: &Cli, spec: &Spec, fi: &fi::FiPingpong) -> Result<u64, String> {
    const PROBE: u64 = 2_000;
    let probe = Spec {
        count: Some(PROBE),
        duration: None,
        ..spec.clone()
    };
    let netio_us = fi_provider_run(cli, &probe)
        .map(|f| {
            f.iter()
                .find(|(m, _)| *m == metrics::MEDIAN)
                .map_or(f64::NAN, |(_, v)| *v)
        })
        .map_err(|e| format!("{} calibration run: {e}", cli.provider))?;
    let fi_us = fi
        .run(spec.size, PROBE, spec.timeout)
        .map(|s| s.mean_round_trip_us())
        .map_err(|e| format!("fi_pingpong calibration run: {e}"))?;
    let fastest = netio_us.min(fi_us);
    if !(fastest.is_finite() && fastest > 0.0) {
        return Err("calibration: no round-trip time measured".into());
    }
    let n = (1.2 * FI_SECS * 1e6 / fastest).ceil() as u64;
    Ok((n.div_ceil(1000).max(1) * 1000).min(i32::MAX as u64))
}

/// Receive buffers per connection on each side of a `--fi-baseline` run
/// unless `--recv-buffers` says otherwise: one, as `fi_pingpong` posts.
const FI_RECV_BUFFERS: usize = 1;

/// One run of the provider's ping-pong for `--fi-baseline`: its server
/// in a second process, as `fi_pingpong`'s is, started for this run alone
/// (a busy-polling server left running would take a core from
/// `fi_pingpong`'s runs).
fn fi_provider_run(cli: &Cli, spec: &Spec) -> Result<metrics::Figures, RunError> {
    let server = server_proc::ServerProc::start(&server_proc::ServerArgs {
        provider: &cli.provider,
        max_size: spec.size,
        recv_buffers: spec.recv_buffers.unwrap_or(FI_RECV_BUFFERS),
        busy_poll: spec.busy_poll,
        thread_unsafe: spec.thread_unsafe,
        serve_for: spec.timeout.saturating_mul(2),
        start_timeout: spec.timeout,
    })
    .map_err(RunError::Failed)?;
    provider::run_socket(&cli.provider, spec, Some(server.addr()))
}

/// Runs one `--fi-baseline` row: `runs` pairs of a run of the provider's
/// ping-pong and a run of `fi_pingpong` with the same size and count, in
/// the order A B B A A B B A ….
fn run_fi_row(cli: &Cli, spec: &Spec, fi: &fi::FiPingpong, progress: &mut Progress) -> Row {
    let mut row = Row::new(spec.test, Some(spec.size), Some(spec.mode));
    let label = format!(
        "{} {} {}",
        spec.test.name(),
        SizeLabel(spec.size),
        spec.mode.name()
    );
    let mut spec = spec.clone();
    let recv_buffers = *spec.recv_buffers.get_or_insert(FI_RECV_BUFFERS);
    let calibrated = spec.count.is_none();
    if calibrated {
        progress.update(&format!("{label}: calibrating the count"));
        match fi_count(cli, &spec, fi) {
            Ok(n) => spec.count = Some(n),
            Err(e) => {
                row.status = Status::Failed(e);
                return row;
            }
        }
    }
    let count = spec.count.unwrap_or(1);
    for i in 0..cli.runs {
        for side in report::pair_order(i) {
            match side {
                Side::Provider => {
                    progress.update(&format!(
                        "{label}: run {}/{} {}",
                        i + 1,
                        cli.runs,
                        cli.provider
                    ));
                    let r = fi_provider_run(cli, &spec).map(|f| metrics::with_means(f, spec.size));
                    if !add_provider_run(&mut row, r, &cli.provider, i) {
                        return row;
                    }
                }
                Side::Baseline => {
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
            }
            row.order.push(side);
        }
    }
    if calibrated {
        row.notes.push(format!(
            "count {count}: calibrated by one unreported run of each side so that the faster one takes at least {FI_SECS} s (with a fifth to spare; a stall in either short run can still make it shorter)"
        ));
    }
    row.notes.push(format!(
        "fi_pingpong: {} (fabric provider `{}`); it times all {count} iterations with no warm-up, netio-perf times {count} after {} unmeasured; netio-perf's server runs as `netio-perf --listen` in a second process, and receive buffers per connection: {recv_buffers} on each side (fi_pingpong: 1; `--recv-buffers` sets it)",
        fi.command_lines(spec.size, count),
        fi.fabric,
        spec.warmup,
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
        let o = plain::ServeOptions {
            busy: cli.busy_poll,
            socket_buffers: cli.socket_buffers,
            read_buffer: cli.plain_read_buffer.unwrap_or(plain::READ_BUFFER),
        };
        std::thread::spawn(move || {
            if let Err(e) = plain::serve(plain_addr, o, limit, |a| {
                println!("plain TCP baseline listening on {a}")
            }) {
                eprintln!("netio-perf: plain TCP baseline server: {e}");
            }
        });
    }
    provider::serve(
        &cli.provider,
        addr.into(),
        &provider::ServeOptions {
            max_size,
            recv_buffers: cli.recv_buffers.map(|n| n as usize),
            busy_poll: cli.busy_poll,
            socket_buffers: cli.socket_buffers,
            thread_unsafe: cli.thread_unsafe,
        },
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
