//! The libfabric baseline (`--fi-baseline`): libfabric's own ping-pong
//! test, `fi_pingpong` (Debian/Ubuntu package `libfabric-bin`), run as a
//! server process and a client process over 127.0.0.1.
//!
//! Each run starts `fi_pingpong -p FABRIC -e msg -S SIZE -I COUNT -B PORT`
//! (the server, on a control port of its own for every run), waits until
//! the server listens on that port, then starts the client with `-P PORT
//! 127.0.0.1`, and reads the client's result line:
//!
//! ```text
//! bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
//! 64      10k     =10k     1.2m        0.09s     14.65       4.37       0.23
//! ```
//!
//! `fi_pingpong` times all its iterations together (it has no warm-up and
//! no per-message times) and counts two transfers per iteration, one each
//! way: `usec/xfer` is the elapsed time over 2 × iterations, and `MB/sec`
//! the bytes of both directions (10⁶ bytes) per second. So its mean round
//! trip is 2 × `usec/xfer`, which is what is compared with the mean round
//! trip of netio-perf's run (the inverse of its round trips per second).
//!
//! Both processes poll their completion queues in a tight loop (the queues
//! have no wait object), which is why `--fi-baseline` runs netio-perf's own
//! loops busy-polling too.
//!
//! The fabric provider and domain are the libfabric provider's
//! (`NETIO_LIBFABRIC_PROVIDER`, default `tcp`; `NETIO_LIBFABRIC_DOMAIN`).
//! So that `fi_pingpong`'s data connection uses 127.0.0.1 as netio-perf's
//! does, the children get `FI_TCP_IFACE=lo` (`tcp`) or
//! `FI_SOCKETS_IFACE=lo` (`sockets`) unless the environment sets them, and
//! for `sockets` the provider's `FI_SOCKETS_PE_WAITTIME` setting.
//!
//! A run that does not finish within `--timeout` is killed (both
//! processes); a process that fails is reported with its exit status and
//! its error output.

use std::collections::HashSet;
use std::io::{self, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::metrics::{Figures, MEAN, PP_THROUGHPUT, ROUND_TRIPS};

/// The program.
pub const PROGRAM: &str = "fi_pingpong";

/// The Debian/Ubuntu package that installs it.
pub const PACKAGE: &str = "libfabric-bin";

/// `fi_pingpong` on `PATH`, or an error that says how to install it.
pub fn locate() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(PROGRAM))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            format!(
                "--fi-baseline runs libfabric's `{PROGRAM}`, which is not on PATH; \
                 install libfabric's utilities (Debian/Ubuntu: apt-get install {PACKAGE})"
            )
        })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How `fi_pingpong` is run: the program, the fabric provider and domain,
/// and the environment given to both processes.
#[derive(Debug, Clone)]
pub struct FiPingpong {
    /// The program's path.
    pub program: PathBuf,
    /// Fabric provider (`-p`).
    pub fabric: String,
    /// Domain (`-d`), if one is named.
    pub domain: Option<String>,
    /// Variables set in the children's environment.
    pub env: Vec<(String, String)>,
    /// Endpoint type (`-e`): `msg` or `rdm`.
    pub endpoint: String,
}

impl FiPingpong {
    /// `program` over fabric provider `fabric` (and `domain`, if named);
    /// `sockets_pe_waittime`: the value the libfabric provider gives
    /// `FI_SOCKETS_PE_WAITTIME` when the environment does not set it.
    pub fn new(
        program: PathBuf,
        fabric: &str,
        domain: Option<String>,
        sockets_pe_waittime: Option<u32>,
    ) -> Self {
        let unset = |k: &str| std::env::var_os(k).is_none();
        let mut env = Vec::new();
        let iface = match fabric {
            "tcp" => Some("FI_TCP_IFACE"),
            "sockets" => Some("FI_SOCKETS_IFACE"),
            _ => None,
        };
        if let Some(k) = iface {
            if domain.is_none() && unset(k) {
                env.push((k.to_string(), "lo".to_string()));
            }
        }
        if fabric == "sockets" && unset("FI_SOCKETS_PE_WAITTIME") {
            if let Some(w) = sockets_pe_waittime {
                env.push(("FI_SOCKETS_PE_WAITTIME".to_string(), w.to_string()));
            }
        }
        Self {
            program,
            fabric: fabric.to_string(),
            domain,
            env,
            endpoint: "msg".to_string(),
        }
    }

    /// The same over endpoint type `endpoint` (`msg` or `rdm`).
    pub fn with_endpoint(mut self, endpoint: &str) -> Self {
        self.endpoint = endpoint.to_string();
        self
    }

    /// The options common to server and client.
    fn common_args(&self, size: usize, iterations: u64) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "-p".into(),
            self.fabric.clone(),
            "-e".into(),
            self.endpoint.clone(),
        ];
        if let Some(d) = &self.domain {
            a.extend(["-d".into(), d.clone()]);
        }
        a.extend([
            "-S".into(),
            size.to_string(),
            "-I".into(),
            iterations.to_string(),
        ]);
        a
    }

    /// The server's and the client's command lines, for the report
    /// (`PORT`: the control port, a fresh one for every run).
    pub fn command_lines(&self, size: usize, iterations: u64) -> String {
        let env: String = self.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let common = self.common_args(size, iterations).join(" ");
        format!("`{env}{PROGRAM} {common} -B PORT` and `{env}{PROGRAM} {common} -P PORT 127.0.0.1`")
    }

    fn command(&self, size: usize, iterations: u64, tail: &[String]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(self.common_args(size, iterations))
            .args(tail)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// One run: `iterations` round trips of `size` bytes, both processes
    /// killed if the run takes longer than `timeout`.
    pub fn run(&self, size: usize, iterations: u64, timeout: Duration) -> Result<Sample, String> {
        let deadline = Instant::now() + timeout;
        let port = fresh_port()?;
        let mut server = Proc::spawn(
            "server",
            self.command(size, iterations, &["-B".into(), port.to_string()]),
        )
        .map_err(|e| format!("cannot start {}: {e}", self.program.display()))?;
        server.wait_listening(port, deadline, timeout)?;
        let mut client = Proc::spawn(
            "client",
            self.command(
                size,
                iterations,
                &["-P".into(), port.to_string(), "127.0.0.1".into()],
            ),
        )
        .map_err(|e| format!("cannot start {}: {e}", self.program.display()))?;
        let Some(status) = client.wait_until(deadline) else {
            client.kill();
            server.kill();
            return Err(format!(
                "{PROGRAM} did not finish within the time limit of {timeout:?} (--timeout); \
                 server and client killed{}{}",
                server.describe_output(),
                client.describe_output()
            ));
        };
        if !status.success() {
            // The server is waiting for a client that has gone: give it a
            // moment to notice, then stop it.
            let _ = server.wait_until(Instant::now() + Duration::from_secs(1));
            server.kill();
            return Err(format!(
                "{PROGRAM} client exited with {status}{}{}",
                client.describe_output(),
                server.describe_output()
            ));
        }
        let grace = deadline.min(Instant::now() + Duration::from_secs(10));
        match server.wait_until(grace) {
            Some(s) if s.success() => {}
            Some(s) => {
                return Err(format!(
                    "{PROGRAM} server exited with {s}{}",
                    server.describe_output()
                ))
            }
            None => {
                server.kill();
                return Err(format!(
                    "{PROGRAM} server did not exit after its client finished; killed{}",
                    server.describe_output()
                ));
            }
        }
        let (out, _) = client.output();
        let sample = parse(&out).map_err(|e| format!("{e}{}", client.describe_output()))?;
        sample.check(size, iterations)?;
        Ok(sample)
    }
}

/// A control port not handed out before in this process: one the system
/// has just given to a listener on all addresses, as the server binds.
fn fresh_port() -> Result<u16, String> {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..64 {
        let port = TcpListener::bind("0.0.0.0:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port for {PROGRAM}: {e}"))?
            .port();
        let mut used = USED.lock().unwrap_or_else(|p| p.into_inner());
        if used.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    Err(format!(
        "cannot find a free port for {PROGRAM} that was not used before"
    ))
}

/// Whether a TCP socket listens on `port` (IPv4, `/proc/net/tcp`); `None`
/// where the table cannot be read.
fn listening(port: u16) -> Option<bool> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    Some(table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // Fields: sl, local address (hex ip:port), remote address, state
        // (0A: listening), ...
        f.len() > 3
            && f[3] == "0A"
            && f[1]
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port)
    }))
}

/// A child process whose output is collected by two threads; killed and
/// reaped on drop if it is still running.
struct Proc {
    role: &'static str,
    child: Child,
    status: Option<ExitStatus>,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    collected: Option<(String, String)>,
}

fn collect(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut b = Vec::new();
        let _ = pipe.read_to_end(&mut b);
        let _ = tx.send(String::from_utf8_lossy(&b).into_owned());
    });
    rx
}

impl Proc {
    fn spawn(role: &'static str, mut cmd: Command) -> io::Result<Self> {
        let mut child = cmd.spawn()?;
        let stdout = collect(child.stdout.take().expect("stdout is piped"));
        let stderr = collect(child.stderr.take().expect("stderr is piped"));
        Ok(Self {
            role,
            child,
            status: None,
            stdout,
            stderr,
            collected: None,
        })
    }

    /// The exit status, if the process has exited.
    fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits for the process to exit until `deadline`.
    fn wait_until(&mut self, deadline: Instant) -> Option<ExitStatus> {
        loop {
            if let Some(s) = self.poll() {
                return Some(s);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            thread::sleep((deadline - now).min(Duration::from_millis(10)));
        }
    }

    /// Waits until the (server) process listens on `port`.
    fn wait_listening(
        &mut self,
        port: u16,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), String> {
        loop {
            match listening(port) {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => {
                    // No table to look at: give it time to start.
                    thread::sleep(Duration::from_millis(300));
                    return Ok(());
                }
            }
            if let Some(s) = self.poll() {
                return Err(format!(
                    "{PROGRAM} server exited with {s} before it listened on port {port}{}",
                    self.describe_output()
                ));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "{PROGRAM} server did not listen on port {port} within the time limit of \
                     {timeout:?} (--timeout); killed{}",
                    self.describe_output()
                ));
            }
            // Reading the table costs milliseconds of system time on a
            // small VM; the server takes longer than that to start.
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it, SIGTERM first ([`crate::stop`]).
    fn kill(&mut self) {
        if self.poll().is_none() {
            self.status = crate::stop::stop(&mut self.child, crate::stop::GRACE);
        }
    }

    /// Its standard output and error, once it has exited (empty where a
    /// pipe is still held open after a second, e.g. by a process it
    /// started).
    fn output(&mut self) -> (String, String) {
        if self.collected.is_none() {
            let wait = Duration::from_secs(1);
            self.collected = Some((
                self.stdout.recv_timeout(wait).unwrap_or_default(),
                self.stderr.recv_timeout(wait).unwrap_or_default(),
            ));
        }
        self.collected.clone().unwrap_or_default()
    }

    /// `; the server's error output: ...` (its last lines), or its
    /// standard output when it wrote no errors, or nothing.
    fn describe_output(&mut self) -> String {
        let (out, err) = self.output();
        let (what, text) = if err.trim().is_empty() {
            ("output", out)
        } else {
            ("error output", err)
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            return String::new();
        }
        let tail = &lines[lines.len().saturating_sub(12)..];
        format!(
            "; the {}'s {what}: {}",
            self.role,
            tail.iter()
                .map(|l| l.trim_end())
                .collect::<Vec<_>>()
                .join(" | ")
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One result line of `fi_pingpong`, as printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Message size as printed (`64`, `1m`, `1.5k`).
    pub bytes: String,
    /// Iterations as printed (`10k`).
    pub sent: String,
    /// Messages acknowledged, as printed: `=` and the count when it matches.
    pub acked: String,
    /// Elapsed seconds (two decimals).
    pub time_s: f64,
    /// Bytes of both directions per second, in 10⁶ bytes.
    pub mb_per_s: f64,
    /// Elapsed microseconds over 2 × iterations: the mean one-way
    /// transfer.
    pub usec_per_xfer: f64,
    /// Transfers per microsecond.
    pub mxfers_per_s: f64,
}

/// Reads the result line of `fi_pingpong`'s output (the line under the
/// header that names `usec/xfer`), taking each column by its header.
pub fn parse(out: &str) -> Result<Sample, String> {
    let mut lines = out.lines();
    let header = lines
        .by_ref()
        .find(|l| l.split_whitespace().any(|w| w == "usec/xfer"))
        .ok_or_else(|| format!("{PROGRAM} printed no result table"))?;
    let names: Vec<&str> = header.split_whitespace().collect();
    let data = lines
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| format!("{PROGRAM} printed a result header and no result line"))?;
    let values: Vec<&str> = data.split_whitespace().collect();
    if values.len() != names.len() {
        return Err(format!(
            "{PROGRAM}'s result line `{}` has {} columns, its header {}",
            data.trim(),
            values.len(),
            names.len()
        ));
    }
    let column = |name: &str| -> Result<&str, String> {
        names
            .iter()
            .position(|n| *n == name)
            .map(|i| values[i])
            .ok_or_else(|| {
                format!(
                    "{PROGRAM}'s result header `{}` has no `{name}`",
                    header.trim()
                )
            })
    };
    let number = |name: &str| -> Result<f64, String> {
        let v = column(name)?;
        v.trim_end_matches('s').parse::<f64>().map_err(|_| {
            format!(
                "{PROGRAM}'s `{name}` is `{v}`, not a number (line `{}`)",
                data.trim()
            )
        })
    };
    Ok(Sample {
        bytes: column("bytes")?.to_string(),
        sent: column("#sent")?.to_string(),
        acked: column("#ack")?.to_string(),
        time_s: number("time")?,
        mb_per_s: number("MB/sec")?,
        usec_per_xfer: number("usec/xfer")?,
        mxfers_per_s: number("Mxfers/sec")?,
    })
}

/// A size as `fi_pingpong` prints it: `64`, `1k`, `1.5k`, `64k`, `1m`
/// (one decimal below 10 units, truncated).
pub fn size_label(size: u64) -> String {
    let (base, unit) = match size {
        s if s >= 1 << 30 => (1u64 << 30, "g"),
        s if s >= 1 << 20 => (1 << 20, "m"),
        s if s >= 1 << 10 => (1 << 10, "k"),
        _ => (1, ""),
    };
    let tenth = if size / base < 10 {
        size % base * 10 / base
    } else {
        0
    };
    if tenth > 0 {
        format!("{}.{tenth}{unit}", size / base)
    } else {
        format!("{}{unit}", size / base)
    }
}

/// A count as `fi_pingpong` prints it: `200`, `10k`, `1m` (truncated).
pub fn count_label(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{}b", n / 1_000_000_000),
        n if n >= 1_000_000 => format!("{}m", n / 1_000_000),
        n if n >= 1_000 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

impl Sample {
    /// Checks that the run is the one asked for and was timed.
    pub fn check(&self, size: usize, iterations: u64) -> Result<(), String> {
        if self.bytes != size_label(size as u64) {
            return Err(format!(
                "{PROGRAM} ran messages of {}, not {size} bytes",
                self.bytes
            ));
        }
        if self.sent != count_label(iterations) {
            return Err(format!(
                "{PROGRAM} ran {} iterations, not {iterations}",
                self.sent
            ));
        }
        if self.acked.strip_prefix('=') != Some(self.sent.as_str()) {
            return Err(format!(
                "{PROGRAM}'s client and server counted different numbers of messages (#sent {}, #ack {})",
                self.sent, self.acked
            ));
        }
        if !(self.usec_per_xfer.is_finite() && self.usec_per_xfer > 0.0) {
            return Err(format!(
                "{PROGRAM} reported {} usec/xfer: too few iterations to time; raise --count",
                self.usec_per_xfer
            ));
        }
        Ok(())
    }

    /// Mean round trip in µs: two transfers.
    pub fn mean_round_trip_us(&self) -> f64 {
        2.0 * self.usec_per_xfer
    }

    /// The figures comparable with netio-perf's ping-pong: mean round
    /// trip, round trips per second, bytes per second of both directions.
    pub fn figures(&self) -> Figures {
        let rtt = self.mean_round_trip_us();
        vec![
            (MEAN, rtt),
            (ROUND_TRIPS, 1e6 / rtt),
            (PP_THROUGHPUT, self.mb_per_s * 1e6),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client output of `fi_pingpong -p tcp -e msg -S 64 -I 10000 -P PORT
    /// 127.0.0.1` (libfabric 1.17).
    const SMALL: &str = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
64      10k     =10k     1.2m        0.09s     14.65       4.37       0.23
";

    /// Same with `-S 1048576 -I 2000`.
    const LARGE: &str = "\
bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec
1m      2k      =2k      3.9g        0.80s   5267.80     199.05       0.01
";

    #[test]
    fn parses_the_result_line() {
        let s = parse(SMALL).unwrap();
        assert_eq!(
            s,
            Sample {
                bytes: "64".into(),
                sent: "10k".into(),
                acked: "=10k".into(),
                time_s: 0.09,
                mb_per_s: 14.65,
                usec_per_xfer: 4.37,
                mxfers_per_s: 0.23,
            }
        );
        s.check(64, 10_000).unwrap();
        let l = parse(LARGE).unwrap();
        assert_eq!(l.bytes, "1m");
        assert_eq!(l.usec_per_xfer, 199.05);
        l.check(1 << 20, 2000).unwrap();
    }

    #[test]
    fn a_round_trip_is_two_transfers() {
        let s = parse(SMALL).unwrap();
        let f = s.figures();
        let get = |k: &str| f.iter().find(|(m, _)| m.key == k).unwrap().1;
        assert!((get("mean_rtt") - 8.74).abs() < 1e-9);
        assert!((get("round_trips_per_s") - 1e6 / 8.74).abs() < 1e-6);
        assert!((get("pingpong_bytes_per_s") - 14.65e6).abs() < 1e-3);
        // The columns agree: 2 × 64 bytes per round trip.
        let l = parse(LARGE).unwrap().figures();
        let rt = l
            .iter()
            .find(|(m, _)| m.key == "round_trips_per_s")
            .unwrap()
            .1;
        let bytes = l
            .iter()
            .find(|(m, _)| m.key == "pingpong_bytes_per_s")
            .unwrap()
            .1;
        assert!((2.0 * (1 << 20) as f64 * rt / bytes - 1.0).abs() < 1e-3);
    }

    #[test]
    fn skips_other_lines_and_reads_columns_by_name() {
        let noisy = format!("some banner\n\n{SMALL}trailing\n");
        assert_eq!(parse(&noisy).unwrap(), parse(SMALL).unwrap());
        let reordered = "\
bytes   #ack    #sent    total       time     usec/xfer   MB/sec    Mxfers/sec
64      =10k    10k      1.2m        0.09s     4.37        14.65     0.23
";
        assert_eq!(parse(reordered).unwrap(), parse(SMALL).unwrap());
    }

    #[test]
    fn bad_output_is_an_error() {
        assert!(parse("").unwrap_err().contains("no result table"));
        assert!(parse("[error] failed to connect\n").is_err());
        let header_only = SMALL.lines().next().unwrap();
        assert!(parse(header_only).unwrap_err().contains("no result line"));
        let short = SMALL.replace(" 0.23", "");
        assert!(parse(&short).unwrap_err().contains("columns"));
        let nan = SMALL.replace("4.37", "x.yz");
        assert!(parse(&nan).unwrap_err().contains("not a number"));
    }

    #[test]
    fn checks_the_run_asked_for() {
        let s = parse(SMALL).unwrap();
        assert!(s.check(128, 10_000).unwrap_err().contains("not 128 bytes"));
        assert!(s.check(64, 20_000).unwrap_err().contains("not 20000"));
        let short = parse(&SMALL.replace("=10k", "+2")).unwrap();
        assert!(short.check(64, 10_000).unwrap_err().contains("different"));
        let untimed = parse(&SMALL.replace("4.37", "0.00")).unwrap();
        assert!(untimed.check(64, 10_000).unwrap_err().contains("--count"));
    }

    #[test]
    fn labels_as_fi_pingpong_prints_them() {
        assert_eq!(size_label(64), "64");
        assert_eq!(size_label(1024), "1k");
        assert_eq!(size_label(1536), "1.5k");
        assert_eq!(size_label(65536), "64k");
        assert_eq!(size_label(1 << 20), "1m");
        assert_eq!(size_label(3 << 29), "1.5g");
        assert_eq!(count_label(200), "200");
        assert_eq!(count_label(10_000), "10k");
        assert_eq!(count_label(2_500_000), "2m");
    }

    #[test]
    fn children_keep_to_the_loopback_interface() {
        let f = FiPingpong::new(PathBuf::from("/x/fi_pingpong"), "sockets", None, Some(0));
        if std::env::var_os("FI_SOCKETS_IFACE").is_none() {
            assert!(f.env.contains(&("FI_SOCKETS_IFACE".into(), "lo".into())));
        }
        let d = FiPingpong::new(
            PathBuf::from("fi_pingpong"),
            "verbs",
            Some("mlx5_0".into()),
            None,
        );
        assert!(d.env.is_empty());
        let cl = d.command_lines(64, 200);
        assert!(
            cl.contains("fi_pingpong -p verbs -e msg -d mlx5_0 -S 64 -I 200 -B PORT"),
            "{cl}"
        );
    }
}
