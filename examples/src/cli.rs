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

use clap::Parser;
use netio_core::EndpointAddress;

/// The command line as clap reads it; [`Options::parse`] applies the
/// program's defaults and rules.
#[derive(Debug, Parser)]
#[command(disable_help_flag = true)]
struct Args {
    /// Server only, listening on ADDR (default 127.0.0.1:0).
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:0", value_name = "ADDR")]
    listen: Option<EndpointAddress>,
    /// Client only, connecting to ADDR.
    #[arg(long, value_name = "ADDR")]
    connect: Option<EndpointAddress>,
    /// Messages the client sends.
    #[arg(long)]
    count: Option<u64>,
    /// Message size in bytes (pingpong).
    #[arg(long)]
    size: Option<usize>,
    /// The server exits after N clients have disconnected (0: never).
    #[arg(long, default_value_t = 1)]
    clients: u64,
    /// Give up after SECS seconds (0: no limit).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    timeout: Option<f64>,
    /// The netio provider: tcp, or libfabric.
    #[arg(long, default_value = "tcp")]
    provider: String,
    /// The libfabric provider for --provider libfabric.
    #[arg(long)]
    fabric: Option<String>,
    /// Prints the usage.
    #[arg(short, long)]
    help: bool,
}

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
        let args = std::iter::once(String::from("program")).chain(args);
        let a = Args::try_parse_from(args).map_err(|e| e.to_string().trim_end().to_string())?;
        if a.size.is_some() && default_size.is_none() {
            return Err("--size is not an option of this program".into());
        }
        let role = match (a.listen, a.connect) {
            (Some(_), Some(_)) => return Err("--listen and --connect exclude each other".into()),
            (Some(addr), None) => Role::Listen(addr),
            (None, Some(addr)) => Role::Connect(addr),
            (None, None) => Role::Both,
        };
        let timeout = match a.timeout {
            Some(secs) if !secs.is_finite() || secs < 0.0 => {
                return Err(format!("--timeout {secs}: not a number of seconds"))
            }
            Some(secs) => (secs > 0.0).then(|| Duration::from_secs_f64(secs)),
            None => match role {
                Role::Listen(_) => None,
                _ => Some(DEFAULT_TIMEOUT),
            },
        };
        Ok(Self {
            role,
            count: a.count.unwrap_or(default_count),
            size: a.size.or(default_size).unwrap_or(0),
            clients: a.clients,
            timeout,
            help: a.help,
            provider: a.provider,
            fabric: a.fabric,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Options, String> {
        Options::parse(args.iter().map(|s| s.to_string()), 10, Some(64))
    }

    #[test]
    fn listen_takes_an_optional_address_and_the_defaults_follow_the_role() {
        let o = parse(&["--listen", "--count", "3"]).unwrap();
        assert_eq!(o.role, Role::Listen(DEFAULT_LISTEN));
        assert_eq!((o.count, o.size, o.clients, o.timeout), (3, 64, 1, None));
        let o = parse(&["--listen", "127.0.0.1:9000"]).unwrap();
        assert_eq!(o.role, Role::Listen("127.0.0.1:9000".parse().unwrap()));
        let o = parse(&[]).unwrap();
        assert_eq!((o.role, o.timeout), (Role::Both, Some(DEFAULT_TIMEOUT)));
        assert_eq!((o.provider.as_str(), o.fabric), ("tcp", None));
        let o = parse(&[
            "--connect",
            "127.0.0.1:1",
            "--timeout",
            "0",
            "--fabric",
            "sockets",
        ])
        .unwrap();
        assert_eq!(o.timeout, None);
        assert_eq!(o.fabric.as_deref(), Some("sockets"));
        assert!(parse(&["--help"]).unwrap().help);
    }

    #[test]
    fn bad_command_lines_are_refused_with_the_reason() {
        let e = parse(&["--listen", "--connect", "127.0.0.1:1"]).unwrap_err();
        assert!(e.contains("exclude each other"), "{e}");
        let e = parse(&["--timeout", "-1"]).unwrap_err();
        assert!(e.contains("--timeout"), "{e}");
        let e = parse(&["--bogus"]).unwrap_err();
        assert!(e.contains("--bogus"), "{e}");
        let e = parse(&["--count", "many"]).unwrap_err();
        assert!(e.contains("many"), "{e}");
        let e = parse(&["--connect", "nowhere"]).unwrap_err();
        assert!(e.contains("nowhere"), "{e}");
        let e = Options::parse(["--size", "1"].map(String::from), 10, None).unwrap_err();
        assert!(e.contains("--size"), "{e}");
    }
}
