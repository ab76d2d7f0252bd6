//! Results: rows of runs, the table on stdout, the JSON document, the
//! progress line, and the machine facts.

use std::io::{IsTerminal, Write};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::cli::{SendMode, SizeLabel, TestKind};
use crate::metrics::{Better, Figures, Metric};
use crate::stats::{median, min_max};

/// How a row ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Every run produced figures.
    Ok,
    /// The provider does not support what the row needs.
    Unsupported(String),
    /// A run failed; figures of earlier runs are kept.
    Failed(String),
}

/// One line of the results: a test at one size and mode (or one conns
/// variant), with the figures of every run.
#[derive(Debug, Clone)]
pub struct Row {
    /// The test.
    pub test: TestKind,
    /// Message size.
    pub size: Option<usize>,
    /// Send mode.
    pub mode: Option<SendMode>,
    /// Variant of the test (conns).
    pub variant: Option<String>,
    /// How it ended.
    pub status: Status,
    /// Figures of each provider run.
    pub provider_runs: Vec<Figures>,
    /// Figures of each baseline run, paired with the provider run of the
    /// same index.
    pub baseline_runs: Vec<Figures>,
    /// Remarks printed under the row.
    pub notes: Vec<String>,
    /// The sides in the order their runs were made.
    pub order: Vec<Side>,
    /// This row's baseline, when it is not the invocation's (an async
    /// row's is the callback path).
    pub baseline_label: Option<&'static str>,
}

/// Which side a run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The provider (A).
    Provider,
    /// The baseline (B).
    Baseline,
}

impl Side {
    /// The side's name in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Baseline => "baseline",
        }
    }
}

/// The order of the two runs of pair `i` (from 0): A B B A A B B A …, so
/// that neither side always runs first.
pub fn pair_order(i: u32) -> [Side; 2] {
    if i % 2 == 0 {
        [Side::Provider, Side::Baseline]
    } else {
        [Side::Baseline, Side::Provider]
    }
}

impl Row {
    /// An empty row.
    pub fn new(test: TestKind, size: Option<usize>, mode: Option<SendMode>) -> Self {
        Self {
            test,
            size,
            mode,
            variant: None,
            status: Status::Ok,
            provider_runs: Vec::new(),
            baseline_runs: Vec::new(),
            notes: Vec::new(),
            order: Vec::new(),
            baseline_label: None,
        }
    }

    fn title(&self) -> String {
        let mut t = self.test.name().to_string();
        if let Some(s) = self.size {
            t += &format!(" {}", SizeLabel(s));
        }
        if let Some(m) = self.mode {
            t += &format!(", {} ({})", m.name(), m.description());
        }
        if let Some(v) = &self.variant {
            t += &format!(", {v}");
        }
        t
    }

    /// Every figure with its per-run values and ratios.
    pub fn aggregate(&self) -> Vec<Aggregate> {
        let mut metrics: Vec<Metric> = Vec::new();
        for run in &self.provider_runs {
            for (m, _) in run {
                if !metrics.iter().any(|x| x.key == m.key && x.unit == m.unit) {
                    metrics.push(*m);
                }
            }
        }
        let value = |runs: &[Figures], m: &Metric| -> Vec<f64> {
            runs.iter()
                .map(|r| {
                    r.iter()
                        .find(|(x, _)| x.key == m.key && x.unit == m.unit)
                        .map_or(f64::NAN, |(_, v)| *v)
                })
                .collect()
        };
        metrics
            .into_iter()
            .map(|m| {
                let provider = value(&self.provider_runs, &m);
                let baseline = value(&self.baseline_runs, &m);
                let ratios: Vec<f64> = if m.better == Better::Neither {
                    Vec::new()
                } else {
                    provider
                        .iter()
                        .zip(&baseline)
                        .map(|(p, b)| p / b)
                        .filter(|r| r.is_finite())
                        .collect()
                };
                Aggregate {
                    metric: m,
                    provider,
                    baseline,
                    ratios,
                }
            })
            .collect()
    }
}

/// One figure of a row over all runs.
#[derive(Debug, Clone)]
pub struct Aggregate {
    /// The figure.
    pub metric: Metric,
    /// Its value in each provider run.
    pub provider: Vec<f64>,
    /// Its value in each baseline run.
    pub baseline: Vec<f64>,
    /// provider/baseline of each pair of runs.
    pub ratios: Vec<f64>,
}

/// What the whole invocation ran, for the table's header and the JSON.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Provider name.
    pub provider: String,
    /// Busy-polling loops.
    pub busy_poll: bool,
    /// Backends in thread-unsafe mode.
    pub thread_unsafe: bool,
    /// Runs per row.
    pub runs: u32,
    /// The baseline alternated with the provider, if any.
    pub baseline: Option<Baseline>,
    /// Where the server runs.
    pub layout: String,
    /// `--socket-buffers`, if given.
    pub socket_buffers: Option<usize>,
}

/// What the provider's runs are alternated with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Baseline {
    /// The same test over plain `std::net` TCP in this process
    /// (`--baseline`).
    PlainTcp,
    /// libfabric's `fi_pingpong`, server and client processes
    /// (`--fi-baseline`).
    FiPingpong,
}

impl Setup {
    fn baseline_name(&self) -> &'static str {
        match self.baseline {
            Some(Baseline::FiPingpong) => "fi_pingpong",
            _ if self.busy_poll => "plain busy-polling TCP",
            _ => "plain blocking TCP",
        }
    }

    /// The baseline's column heading and its name in the ratio.
    fn baseline_short(&self) -> &'static str {
        match self.baseline {
            Some(Baseline::FiPingpong) => "fi_pingpong",
            _ => "plain TCP",
        }
    }
}

fn unsafe_note(setup: &Setup) -> &'static str {
    if setup.thread_unsafe {
        ", thread-unsafe backends"
    } else {
        ""
    }
}

/// Prints the table.
pub fn print_table(out: &mut impl Write, setup: &Setup, rows: &[Row]) -> std::io::Result<()> {
    let sim = setup.provider == "sim";
    writeln!(
        out,
        "netio-perf: provider {}, {}; {}",
        setup.provider,
        if sim {
            "virtual time, driven on one thread".to_string()
        } else if setup.baseline == Some(Baseline::FiPingpong) {
            "busy-polling loops (--fi-baseline: fi_pingpong polls its completion queues)"
                .to_string()
                + unsafe_note(setup)
        } else if setup.busy_poll {
            "busy-polling loops".to_string() + unsafe_note(setup)
        } else {
            "interrupt mode (loops sleep in epoll)".to_string() + unsafe_note(setup)
        },
        setup.layout
    )?;
    if setup.baseline == Some(Baseline::FiPingpong) {
        writeln!(
            out,
            "each figure: median of {} runs, in pairs with libfabric's fi_pingpong (server and client processes over 127.0.0.1, same fabric provider and endpoint type), in the order A B B A A B B A ... (A: {}); ratio = {}/fi_pingpong of the same pair of runs, median (min–max)",
            setup.runs,
            setup.provider,
            setup.provider
        )?;
        writeln!(
            out,
            "fi_pingpong reports one time for all its iterations: usec/xfer = elapsed / (2 × iterations), one transfer each way; its mean round trip is 2 × usec/xfer, compared with netio-perf's measured time / round trips; median and percentiles are netio-perf's only"
        )?;
    } else if setup.baseline.is_some() {
        writeln!(
            out,
            "each figure: median of {} runs, in pairs with {}, in the order A B B A A B B A ... (A: {}, B: plain); ratio = {}/plain of the same pair of runs, median (min–max)",
            setup.runs,
            setup.baseline_name(),
            setup.provider,
            setup.provider
        )?;
        writeln!(
            out,
            "plain TCP: TCP_NODELAY and the socket buffers of {}'s side ({}); frames parsed in place out of one read buffer; one-way: each length-prefixed message written to a BufWriter, the baseline of per-message and batch sends alike (sizes in each row's note)",
            setup.provider,
            match setup.socket_buffers {
                Some(n) => format!("SO_SNDBUF = SO_RCVBUF = {}", SizeLabel(n)),
                None => "the system's default, autotuned".into(),
            },
        )?;
    } else {
        writeln!(out, "each figure: median of {} runs", setup.runs)?;
    }
    writeln!(
        out,
        "latency: the mean round trip is the headline (its ratio first); median, p99, p99.9 and max follow"
    )?;
    if sim {
        writeln!(
            out,
            "simulator: figures marked (virtual) are in simulated time; the others are real time on this machine"
        )?;
    }
    for row in rows {
        writeln!(out)?;
        writeln!(out, "{}", row.title())?;
        match &row.status {
            Status::Unsupported(m) => {
                writeln!(out, "  not supported: {m}")?;
                continue;
            }
            Status::Failed(m) => writeln!(out, "  FAILED: {m}")?,
            Status::Ok => {}
        }
        let aggs = row.aggregate();
        let with_base = aggs.iter().any(|a| !a.ratios.is_empty());
        if !aggs.is_empty() {
            if with_base {
                writeln!(
                    out,
                    "  {:<30} {:>22} {:>22}   ratio (min–max)",
                    "",
                    setup.provider,
                    row.baseline_label.unwrap_or(setup.baseline_short())
                )?;
            } else {
                writeln!(out, "  {:<30} {:>22}", "", setup.provider)?;
            }
        }
        for a in &aggs {
            let p = a.metric.unit.format(median(&a.provider));
            if a.ratios.is_empty() {
                let b = median(&a.baseline);
                if with_base && b.is_finite() {
                    let b = a.metric.unit.format(b);
                    writeln!(out, "  {:<30} {:>22} {:>22}", a.metric.label, p, b)?;
                } else {
                    writeln!(out, "  {:<30} {:>22}", a.metric.label, p)?;
                }
            } else {
                let b = a.metric.unit.format(median(&a.baseline));
                let (lo, hi) = min_max(&a.ratios);
                writeln!(
                    out,
                    "  {:<30} {:>22} {:>22}   {:.3}× ({:.3}–{:.3}×){}",
                    a.metric.label,
                    p,
                    b,
                    median(&a.ratios),
                    lo,
                    hi,
                    match a.metric.better {
                        Better::Lower => "  lower is better",
                        Better::Higher | Better::Neither => "",
                    }
                )?;
            }
        }
        for n in &row.notes {
            writeln!(out, "  note: {n}")?;
        }
    }
    Ok(())
}

fn stat(values: &[f64]) -> Value {
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return Value::Null;
    }
    let (lo, hi) = min_max(&finite);
    json!({ "median": median(&finite), "min": lo, "max": hi, "runs": finite })
}

/// The JSON document.
pub fn to_json(setup: &Setup, settings: Value, rows: &[Row]) -> Value {
    let results: Vec<Value> = rows
        .iter()
        .map(|row| {
            let (status, message) = match &row.status {
                Status::Ok => ("ok", Value::Null),
                Status::Unsupported(m) => ("unsupported", json!(m)),
                Status::Failed(m) => ("failed", json!(m)),
            };
            let figures: Vec<Value> = row
                .aggregate()
                .iter()
                .map(|a| {
                    json!({
                        "key": a.metric.key,
                        "label": a.metric.label,
                        "unit": a.metric.unit.json_name(),
                        "better": match a.metric.better { Better::Lower => "lower", Better::Higher => "higher", Better::Neither => "neither" },
                        "provider": stat(&a.provider),
                        "baseline": stat(&a.baseline),
                        "ratio": stat(&a.ratios),
                    })
                })
                .collect();
            json!({
                "test": row.test.name(),
                "provider": setup.provider,
                "size": row.size,
                "mode": row.mode.map(SendMode::name),
                "variant": row.variant,
                "status": status,
                "message": message,
                "mode_description": row.mode.map(SendMode::description),
                "figures": figures,
                "headline": row.aggregate().first().map(|a| a.metric.key),
                "run_order": row.order.iter().map(|s| s.name()).collect::<Vec<_>>(),
                "row_baseline": row.baseline_label,
                "notes": row.notes,
            })
        })
        .collect();
    json!({
        "tool": "netio-perf",
        "version": env!("CARGO_PKG_VERSION"),
        "machine": machine(),
        "command_line": std::env::args().collect::<Vec<_>>(),
        "settings": settings,
        "provider": setup.provider,
        "busy_poll": setup.busy_poll,
        "thread_unsafe": setup.thread_unsafe,
        "baseline": if setup.baseline.is_some() { json!(setup.baseline_name()) } else { Value::Null },
        "runs": setup.runs,
        "layout": setup.layout,
        "results": results,
    })
}

/// Facts about this machine and build.
pub fn machine() -> Value {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cpu = read("/proc/cpuinfo").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
    });
    let mem_kib = read("/proc/meminfo").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    });
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit
        .as_ref()
        .and(git(&["status", "--porcelain", "--untracked-files=no"]))
        .map(|s| !s.is_empty());
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cpu": cpu,
        "memory_kib": mem_kib,
        "kernel": read("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()),
        "os": std::env::consts::OS,
        "arch": std::env::consts::ARCH,
        "date": utc_now(),
        "git_commit": commit,
        "git_dirty": dirty,
        "debug_build": cfg!(debug_assertions),
    })
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (proleptic Gregorian), after H. Hinnant.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// A one-line progress display on stderr, shown when stderr is a terminal
/// and the invocation has run for more than a second.
pub struct Progress {
    start: Instant,
    enabled: bool,
    shown: bool,
}

impl Progress {
    /// A progress display.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            enabled: std::io::stderr().is_terminal(),
            shown: false,
        }
    }

    /// Shows `what` in place of the previous line.
    pub fn update(&mut self, what: &str) {
        if self.enabled && self.start.elapsed().as_secs_f64() > 1.0 {
            eprint!(
                "\r\x1b[K[{:5.1} s] {what}",
                self.start.elapsed().as_secs_f64()
            );
            let _ = std::io::stderr().flush();
            self.shown = true;
        }
    }

    /// Removes the line.
    pub fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
            self.shown = false;
        }
    }
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn date_format() {
        let d = utc_now();
        assert_eq!(d.len(), 20);
        assert!(d.starts_with("20"));
        assert!(d.ends_with('Z'));
    }
}
