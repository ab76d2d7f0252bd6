//! The echo application of `echo` (simulator), over TCP: a client sends
//! `--count` numbered messages one at a time and checks every echo.
//!
//! ```text
//! cargo run -p netio-examples --bin echo_tcp                          # both, one process, 127.0.0.1
//! cargo run -p netio-examples --bin echo_tcp -- --listen [ADDR]       # server (default 127.0.0.1:0)
//! cargo run -p netio-examples --bin echo_tcp -- --connect ADDR        # client
//!     [--count N] [--clients N] [--timeout SECS] [--provider tcp|libfabric] [--fabric NAME]
//! ```
//!
//! The server prints `listening on IP:PORT` as its first line and exits
//! after `--clients` clients (default 1) have disconnected. The exit code is
//! 0 only if every echo came back intact (client) or the expected clients
//! came and went (server). Options: [`netio_examples::cli`].
//!
//! Memory: the server's listener puts all its connections on one shared
//! receive pool ([`tcp::server_params`]) where the provider offers it, so
//! a server with thousands of idle clients stays small (2,000 take about
//! 8 MiB, against 370–650 MiB with a 256 KiB pool per connection):
//! on TCP a pool buffer is needed only while a message longer than the
//! 64 KiB read buffer arrives, so a few dozen serve any number of clients.

use std::error::Error;
use std::process::ExitCode;

use netio_examples::cli::{Options, Role};
use netio_examples::tcp::{self, Target};
use netio_examples::ServerStats;

const USAGE: &str = "\
usage: echo_tcp [--listen [ADDR] | --connect ADDR] [--count N] [--clients N] [--timeout SECS] [--provider tcp|libfabric] [--fabric NAME]
  no --listen/--connect: server and client in this process over 127.0.0.1";

fn server_line(s: &ServerStats) -> String {
    format!(
        "server: {} connection(s), {} closed, echoed {}, failed {}, paused {} time(s)",
        s.connections, s.closed, s.echoed, s.failed, s.paused
    )
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo_tcp: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn Error>> {
    let o = Options::parse(std::env::args().skip(1), 1000, None)
        .map_err(|e| format!("{e}\n{USAGE}"))?;
    if o.help {
        println!("{USAGE}");
        return Ok(());
    }
    let target = match o.role {
        Role::Listen(addr) => {
            let run = netio_examples::with_provider!(o, |P| tcp::serve_on::<P>(
                addr,
                0,
                o.clients,
                o.timeout,
                |a| { println!("listening on {a}") }
            ))?;
            println!("{}", server_line(&run.stats));
            if run.timed_out {
                return Err("time limit reached before the clients were done".into());
            }
            return Ok(());
        }
        Role::Connect(addr) => Target::Connect(addr),
        Role::Both => Target::Loopback,
    };
    let run = netio_examples::with_provider!(o, |P| tcp::echo_on::<P>(target, o.count, o.timeout))?;
    let r = &run.report;
    println!(
        "client to {}: sent {}, echoed back intact {}, mismatched {}, closed: {}",
        run.server_address,
        r.sent,
        r.matched,
        r.mismatched,
        r.closed.as_deref().or(r.refused.as_deref()).unwrap_or("no"),
    );
    if let Some(s) = &run.server {
        println!("{}", server_line(s));
    }
    println!("{} round trips in {:?}", r.matched, run.wall);
    if run.timed_out {
        return Err("time limit reached".into());
    }
    if r.matched != o.count || r.mismatched != 0 {
        return Err(format!("expected {} intact echoes", o.count).into());
    }
    Ok(())
}
