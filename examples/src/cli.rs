//! The command line of the TCP programs (`echo_tcp`, `pingpong`).
//!
//! ```text
//! PROGRAM                       server and client in this process, over 127.0.0.1
//! PROGRAM --listen [ADDR]       server only (default 127.0.0.1:0); prints
//!                               "listening on IP:PORT" as its first line
//! PROGRAM --connect ADDR        client only, to a server started with --listen
//!
//! --count N      messages to send (client)
//! --size BYTES   message size (pingpong; the server accepts messages up to
//!                max(BYTES, 64 KiB))
//! --clients N    the server exits after N clients have disconnected
//!                (default 1; 0: serve until killed)
//! --timeout SECS give up after SECS seconds (default 60 for a client or
//!                both in one process, none for a server; 0: none)
//! --provider P   tcp (default), or libfabric (built with the `libfabric`
//!                feature)
//! --fabric F     the libfabric provider for --provider libfabric: tcp,
//!                sockets, verbs, ... (default NETIO_LIBFABRIC_PROVIDER, else tcp)
//! ```

use std::time::Duration;

use netio_core::EndpointAddress;

/// Which side(s) this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Server and client in one process, over loopback.
    Both,
    /// Server only, listening on this address.
    Listen(EndpointAddress),
    /// Client only, connecting to this address.
    Connect(EndpointAddress),
}

/// Parsed options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Which side(s) to run.
    pub role: Role,
    /// Messages the client sends.
    pub count: u64,
    /// Message size in bytes (pingpong).
    pub size: usize,
    /// Clients a server serves before it exits; 0 for no limit.
    pub clients: u64,
    /// Time limit of the run, `None` for none.
    pub timeout: Option<Duration>,
    /// `--help` was given.
    pub help: bool,
    /// `--provider NAME`: the netio provider (`tcp`, or `libfabric` when
    /// built with the `libfabric` feature); default `tcp`.
    pub provider: String,
    /// `--fabric NAME`: the libfabric provider (`tcp`, `sockets`, `verbs`,
    /// …) for `--provider libfabric`; default `NETIO_LIBFABRIC_PROVIDER`,
    /// else `tcp`.
    pub fabric: Option<String>,
}

/// Default listen address of `--listen` without an address.
pub const DEFAULT_LISTEN: EndpointAddress = EndpointAddress::localhost(0);

/// Default time limit of a client, or of both sides in one process.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

impl Options {
    /// Parses `args` (without the program name). `default_count` is the
    /// default of `--count`; `default_size` is the default of `--size`, and
    /// `None` refuses `--size` (the echo program sends its own messages).
    ///
    /// ```
    /// use netio_examples::cli::{Options, Role};
    /// let o = Options::parse(["--listen"].map(String::from), 10, None).unwrap();
    /// assert_eq!(o.role, Role::Listen("127.0.0.1:0".parse().unwrap()));
    /// assert_eq!(o.timeout, None);
    /// let o = Options::parse(
    ///     ["--connect", "127.0.0.1:5000", "--count", "3", "--size", "100"].map(String::from),
    ///     10,
    ///     Some(64),
    /// )
    /// .unwrap();
    /// assert_eq!((o.count, o.size), (3, 100));
    /// assert!(Options::parse(["--size", "1"].map(String::from), 10, None).is_err());
    /// ```
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        default_count: u64,
        default_size: Option<usize>,
    ) -> Result<Self, String> {
        let mut listen = None;
        let mut connect = None;
        let mut count = default_count;
        let mut size = default_size.unwrap_or(0);
        let mut clients = 1;
        let mut timeout = None;
        let mut help = false;
        let mut provider = String::from("tcp");
        let mut fabric = None;
        let mut args = args.into_iter().peekable();
        fn value<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String>
        where
            T::Err: std::fmt::Display,
        {
            let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
            v.parse().map_err(|e| format!("{flag} {v}: {e}"))
        }
        while let Some(a) = args.next() {
            match a.as_str() {
                "--listen" => {
                    let addr = match args.next_if(|v| !v.starts_with("--")) {
                        Some(v) => value("--listen", Some(v))?,
                        None => DEFAULT_LISTEN,
                    };
                    listen = Some(addr);
                }
                "--connect" => connect = Some(value("--connect", args.next())?),
                "--count" => count = value("--count", args.next())?,
                "--size" if default_size.is_some() => size = value("--size", args.next())?,
                "--clients" => clients = value("--clients", args.next())?,
                "--timeout" => {
                    let secs: f64 = value("--timeout", args.next())?;
                    if !secs.is_finite() || secs < 0.0 {
                        return Err(format!("--timeout {secs}: not a number of seconds"));
                    }
                    timeout = Some((secs > 0.0).then(|| Duration::from_secs_f64(secs)));
                }
                "--provider" => provider = value("--provider", args.next())?,
                "--fabric" => fabric = Some(value("--fabric", args.next())?),
                "-h" | "--help" => help = true,
                other => return Err(format!("unknown argument `{other}` (try --help)")),
            }
        }
        let role = match (listen, connect) {
            (Some(_), Some(_)) => return Err("--listen and --connect exclude each other".into()),
            (Some(a), None) => Role::Listen(a),
            (None, Some(a)) => Role::Connect(a),
            (None, None) => Role::Both,
        };
        let timeout = timeout.unwrap_or(match role {
            Role::Listen(_) => None,
            _ => Some(DEFAULT_TIMEOUT),
        });
        Ok(Self {
            role,
            count,
            size,
            clients,
            timeout,
            help,
            provider,
            fabric,
        })
    }
}
