//! The command line.

use std::fmt;
use std::net::SocketAddr;

use clap::{Parser, ValueEnum};

/// Benchmarks of netio-rs providers, each run alternated with the same test
/// over plain `std::net` TCP in the same process (`--baseline`), or, for
/// the libfabric provider's ping-pong, with libfabric's own `fi_pingpong`
/// (`--fi-baseline`).
///
/// By default server and client run in this process, on separate event
/// loops and separate threads, over 127.0.0.1. With no test named, every
/// test runs (with --fi-baseline: pingpong). Every latency figure is
/// given as mean, median, p99 and p99.9; the mean is the headline.
#[derive(Debug, Parser)]
#[command(name = "netio-perf", version, about, long_about = None)]
#[command(after_help = "\
Method: with a baseline, runs are made in pairs in the order A B B A A B B A ...
(A: the provider, B: the baseline); each ratio is taken within its pair, each
figure is the median over the runs. Round trips are reported as mean (the
headline, its ratio first), median, p99, p99.9 and max. Runs are timed unless
--count is given; each row's notes say what was measured.

Examples:
  netio-perf --provider tcp --baseline                  every test, default times
  netio-perf pingpong --sizes 64 --baseline --busy-poll
  netio-perf bw --sizes 1m --mode zero-copy --baseline
  netio-perf pingpong rate --mode async --baseline      async API against callbacks
  netio-perf rate --provider sim                        simulated deliveries per real second
  netio-perf pingpong --provider libfabric --fi-baseline --sizes 64,1m
                                                        libfabric provider against fi_pingpong
  netio-perf --listen 0.0.0.0:7000 [--baseline]         server only (another host)
  netio-perf pingpong --connect HOST:7000 [--baseline]  client only")]
pub struct Cli {
    /// Tests to run (default: all of them).
    #[arg(value_enum)]
    pub tests: Vec<TestKind>,

    /// Tests to run, as an option (same as naming them).
    #[arg(long = "test", value_enum, value_name = "TEST")]
    pub test_opt: Vec<TestKind>,

    /// Provider to benchmark.
    #[arg(long, default_value = "tcp")]
    pub provider: String,

    /// With --provider libfabric: the libfabric provider (tcp, sockets,
    /// verbs, …); default NETIO_LIBFABRIC_PROVIDER, else tcp. The domain
    /// (device or interface) comes from NETIO_LIBFABRIC_DOMAIN.
    #[arg(long, value_name = "NAME")]
    pub fabric: Option<String>,

    /// Message sizes, comma-separated, with k/m suffixes (1k = 1024 bytes).
    /// Default: 64 for pingpong and rate, 64k,1m for bw.
    #[arg(long, value_parser = parse_sizes, value_name = "SIZES")]
    pub sizes: Option<Sizes>,

    /// Measured iterations per run (round trips or messages), instead of
    /// measuring for a time. Default: none, runs are timed (--duration);
    /// with --fi-baseline, a count calibrated by one short run of each side
    /// before the first pair, so that the faster side's run lasts at least
    /// 0.5 s, with a fifth to spare.
    #[arg(long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,

    /// Seconds measured per run, after the warm-up. Default: 0.5 for
    /// pingpong (round trips until 0.5 s have passed), 0.6 for bw and
    /// rate (the sender sends for 0.6 s; the receiver's measured span
    /// starts when the first measured message arrives, up to a few ms
    /// later, so it too lasts at least 0.5 s).
    #[arg(long, value_parser = parse_duration, value_name = "SECS")]
    pub duration: Option<f64>,

    /// Iterations before measuring starts, per run. Default: 1000 round
    /// trips, 16 MiB worth of messages for bw, 100000 messages for rate.
    #[arg(long)]
    pub warmup: Option<u64>,

    /// Send modes, comma-separated or repeated: copy (send_data_copy),
    /// buffered (get_buffer + send_buffer) and zero-copy (send_data) send
    /// one message per call; copy-batch (send_copy_batch) and
    /// buffered-batch (get_buffers + send_buffer_batch) send up to 256
    /// messages per call, one-way tests only; async writes the client with
    /// the async API (netio::aio, a task on the loop thread), and its
    /// --baseline is the callback path (--mode copy) of the same provider.
    /// Default: copy for pingpong and bw, copy,copy-batch for rate.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub mode: Vec<SendMode>,

    /// SO_SNDBUF and SO_RCVBUF of every socket, netio's (tcp provider) and
    /// the plain baseline's alike, with k/m suffixes. Default: not set,
    /// the system's default with autotuning, on both sides (as netio-tcp's
    /// TcpConfig does by default).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub socket_buffers: Option<usize>,

    /// The plain baseline's sending BufWriter capacity (bw and rate), with
    /// k/m suffixes; 0: none, each frame written straight to the socket.
    /// Default: 256k for messages below 64 KiB, 1m from 64 KiB to below
    /// 1 MiB, 0 from 1 MiB up (see docs/benchmarks.md for the measurements
    /// behind it).
    #[arg(long, value_parser = parse_size_or_zero, value_name = "SIZE")]
    pub plain_write_buffer: Option<usize>,

    /// The plain baseline's receive buffer, out of which frames are parsed
    /// in place, with k/m suffixes (a larger frame grows it). Default: 256k
    /// for messages below 64 KiB, one frame (the message size + 4) from
    /// 64 KiB up (see docs/benchmarks.md).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub plain_read_buffer: Option<usize>,

    /// Receive buffers per connection, on the client and the server alike
    /// (with --listen, the server's). Default: 4 for ping-pong; for the
    /// one-way tests and --listen, 16 MiB worth of messages (4 to 64). A
    /// ping-pong has one message in flight: with large messages one buffer
    /// per side keeps the received bytes in the cache, as fi_pingpong's one
    /// posted buffer does (see docs/benchmarks.md).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65536), value_name = "N")]
    pub recv_buffers: Option<u32>,

    /// Busy-polling event loops (and busy-polling non-blocking sockets for
    /// the baseline) instead of sleeping in epoll.
    #[arg(long)]
    pub busy_poll: bool,

    /// Backends in thread-unsafe mode (netio3's UNSAFE): every call is
    /// made on the loop thread, and the provider takes no lock for it.
    #[arg(long)]
    pub thread_unsafe: bool,

    /// With --provider sim: the simulator's profile, set through the
    /// backends' `BackendConfig::mode`: `tcp` (a send completes when the
    /// connection's window takes it, as a socket's buffer does) or `rdma`
    /// (a send completes when it is delivered). Default: tcp.
    #[arg(long, value_enum, value_name = "PROFILE")]
    pub sim_profile: Option<SimProfile>,

    /// With --provider sim: a shared world, whose callbacks run with the
    /// world unlocked for other threads (the simulator's default), instead
    /// of a driver-only one (`Sim::set_driver_only`), which suits these
    /// runs since they make every call on the one thread that drives.
    #[arg(long)]
    pub sim_shared: bool,

    /// Runs of each side per row. With a baseline, runs are made in pairs
    /// in the order A B B A A B B A ... (A: the provider, B: the
    /// baseline; the first pair starts with the provider, the second with
    /// the baseline, and so on), each ratio is taken within its pair, and
    /// each figure is the median over the runs.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,

    /// Alternate every run with the same test over plain std::net TCP and
    /// print each figure as a ratio provider/baseline.
    #[arg(long)]
    pub baseline: bool,

    /// With --provider libfabric, pingpong only: alternate every run with
    /// libfabric's own fi_pingpong (server and client processes over
    /// 127.0.0.1, the same fabric provider: NETIO_LIBFABRIC_PROVIDER,
    /// default tcp; `-e msg`, or `-e rdm` for the reliable-datagram
    /// fabrics (shm, tcp;ofi_rxm: the endpoint type the libfabric provider
    /// uses); the same size `-S` and count `-I`, a fresh control port per
    /// run) and print each figure as a ratio
    /// libfabric/fi_pingpong. fi_pingpong polls its completion queues in a
    /// tight loop, so this implies --busy-poll. It reports only the mean of
    /// a one-way transfer (usec/xfer); its round trip is taken as 2 ×
    /// usec/xfer and compared with netio-perf's mean round trip. Needs
    /// fi_pingpong on PATH (Debian/Ubuntu package libfabric-bin); a run
    /// longer than --timeout is killed.
    #[arg(long, conflicts_with_all = ["baseline", "duration", "listen", "connect"])]
    pub fi_baseline: bool,

    /// Write machine-readable results to FILE ("-": stdout, instead of the
    /// table).
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<String>,

    /// Run the server only, on ADDR, until killed (or --serve-for).
    #[arg(long, value_name = "ADDR", conflicts_with = "connect")]
    pub listen: Option<SocketAddr>,

    /// Run the client only, against a `netio-perf --listen` at ADDR.
    #[arg(long, value_name = "ADDR")]
    pub connect: Option<SocketAddr>,

    /// With --listen: stop serving after this many seconds.
    #[arg(long, value_parser = parse_duration, value_name = "SECS")]
    pub serve_for: Option<f64>,

    /// Connections for the conns test (at most 5000).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(2..=5000))]
    pub connections: u32,

    /// Give up a single run after this many seconds (with --fi-baseline,
    /// fi_pingpong's processes are killed after it).
    #[arg(long, default_value_t = 120.0, value_parser = parse_duration, value_name = "SECS")]
    pub timeout: f64,

    /// Internal: one side of the conns test, in a child process.
    #[arg(long, hide = true)]
    pub conns_child: Option<String>,
}

/// A test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
pub enum TestKind {
    /// Round-trip latency: one message at a time, each echoed.
    Pingpong,
    /// One-way bandwidth.
    Bw,
    /// Small-message rate, one way, one delivery per message.
    Rate,
    /// Many connections on one loop: set-up time and memory.
    Conns,
}

impl TestKind {
    /// The test's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pingpong => "pingpong",
            Self::Bw => "bw",
            Self::Rate => "rate",
            Self::Conns => "conns",
        }
    }
}

/// The simulator's network profile (`--sim-profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum SimProfile {
    /// A send completes when the window takes it.
    #[default]
    Tcp,
    /// A send completes when it is delivered.
    Rdma,
}

impl SimProfile {
    /// The backends' network mode that selects it.
    pub fn mode(self) -> netio::NetworkMode {
        match self {
            Self::Tcp => netio::NetworkMode::Tcp,
            Self::Rdma => netio::NetworkMode::Rdma,
        }
    }
}

/// How messages are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum SendMode {
    /// `get_buffer` + `send_buffer`: written into a pool buffer.
    Buffered,
    /// `send_data` from a registered memory region.
    ZeroCopy,
    /// `send_data_copy`: copied at once.
    Copy,
    /// `send_copy_batch`: up to 256 copy sends per call (one-way tests).
    CopyBatch,
    /// `get_buffers` + `send_buffer_batch`: up to 256 pool buffers per
    /// call (one-way tests).
    BufferedBatch,
    /// The async API (`netio::aio`): the client as a task on its loop
    /// thread; ping-pong `send().await`, one way `feed().await` per
    /// message.
    Async,
}

impl SendMode {
    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Buffered => "buffered",
            Self::ZeroCopy => "zero-copy",
            Self::Copy => "copy",
            Self::CopyBatch => "copy-batch",
            Self::BufferedBatch => "buffered-batch",
            Self::Async => "async",
        }
    }

    /// What the mode calls, for the table: per message or per batch.
    pub fn description(self) -> &'static str {
        match self {
            Self::Buffered => "per message: get_buffer + send_buffer",
            Self::ZeroCopy => "per message: send_data",
            Self::Copy => "per message: send_data_copy",
            Self::CopyBatch => "batch: send_copy_batch, up to 256 per call",
            Self::BufferedBatch => "batch: get_buffers + send_buffer_batch, up to 256 per call",
            Self::Async => "netio::aio task on the loop thread: send().await per ping, feed().await per one-way message",
        }
    }

    /// Whether the mode sends batches (one-way tests only).
    pub fn is_batch(self) -> bool {
        matches!(self, Self::CopyBatch | Self::BufferedBatch)
    }

    /// Wire code in the benchmark's set-up message.
    pub fn code(self) -> u8 {
        match self {
            Self::Buffered => 0,
            Self::ZeroCopy => 1,
            Self::Copy => 2,
            Self::Async => 3,
            Self::CopyBatch => 4,
            Self::BufferedBatch => 5,
        }
    }

    /// The mode of a wire code.
    pub fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => Self::Buffered,
            1 => Self::ZeroCopy,
            2 => Self::Copy,
            3 => Self::Async,
            4 => Self::CopyBatch,
            5 => Self::BufferedBatch,
            _ => return None,
        })
    }
}

/// Largest message size accepted.
pub const MAX_SIZE: usize = 16 << 20;

/// A list of message sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizes(pub Vec<usize>);

/// Parses `64,1k,64k,1m` (1k = 1024).
pub fn parse_sizes(s: &str) -> Result<Sizes, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("empty size in `{s}`"));
        }
        let n = parse_size(part)?;
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(Sizes(out))
}

/// Parses one size: digits with an optional `k`, `m` (or `b`) suffix.
pub fn parse_size(part: &str) -> Result<usize, String> {
    let lower = part.to_ascii_lowercase();
    let (digits, mult) = match lower.as_bytes().last() {
        Some(b'k') => (&lower[..lower.len() - 1], 1024),
        Some(b'm') => (&lower[..lower.len() - 1], 1024 * 1024),
        Some(b'b') => (&lower[..lower.len() - 1], 1),
        _ => (&lower[..], 1),
    };
    let n: usize = digits.parse().map_err(|_| {
        format!("invalid size `{part}`: expected a number with an optional k or m suffix (1k = 1024 bytes), e.g. 64,1k,64k,1m")
    })?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("size `{part}` is too large"))?;
    if n == 0 {
        return Err(format!(
            "invalid size `{part}`: messages need at least 1 byte"
        ));
    }
    if n > MAX_SIZE {
        return Err(format!(
            "size `{part}` ({n} bytes) is above the largest supported, 16m"
        ));
    }
    Ok(n)
}

/// Parses a size as [`parse_size`] does, or `0`.
pub fn parse_size_or_zero(part: &str) -> Result<usize, String> {
    if part.trim() == "0" {
        Ok(0)
    } else {
        parse_size(part)
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("invalid number of seconds `{s}`"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!(
            "seconds must be above 0 and at most 86400, got `{s}`"
        ));
    }
    Ok(v)
}

/// `64 B`, `1 KiB`, `64 KiB`, `1 MiB`, or bytes when not a round multiple.
pub struct SizeLabel(pub usize);

impl fmt::Display for SizeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n >= 1 << 20 && n % (1 << 20) == 0 {
            write!(f, "{} MiB", n >> 20)
        } else if n >= 1024 && n % 1024 == 0 {
            write!(f, "{} KiB", n >> 10)
        } else {
            write!(f, "{n} B")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(
            parse_sizes("64,1k,64k,1m").unwrap().0,
            vec![64, 1024, 65536, 1 << 20]
        );
        assert_eq!(parse_sizes("2K, 3M").unwrap().0, vec![2048, 3 << 20]);
        assert!(parse_sizes("0").is_err());
        assert!(parse_sizes("x").is_err());
        assert!(parse_sizes("64,,1k").is_err());
        assert!(parse_sizes("1g").is_err());
        assert!(parse_sizes("17m").is_err());
    }

    #[test]
    fn size_labels() {
        assert_eq!(SizeLabel(64).to_string(), "64 B");
        assert_eq!(SizeLabel(1024).to_string(), "1 KiB");
        assert_eq!(SizeLabel(1 << 20).to_string(), "1 MiB");
        assert_eq!(SizeLabel(1500).to_string(), "1500 B");
    }
}
