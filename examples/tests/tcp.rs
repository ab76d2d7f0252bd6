//! The echo and ping-pong applications over TCP on 127.0.0.1: through the
//! library in one process, through the `echo_tcp` and `pingpong` programs in
//! one process, and as a server process and a client process. Every run is
//! bounded: the library runs by their time limit, the programs by a deadline
//! after which they are killed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_examples::tcp::{self, Target};
use netio_examples::{EchoServer, PingClient, PingReport};
use netio_sim::Sim;

mod common;
use common::{line_with, run_ok, Proc, LIMIT};

#[test]
fn one_process_echo_matches_every_message() {
    let run = tcp::echo(Target::Loopback, 500, Some(LIMIT)).unwrap();
    assert!(!run.timed_out, "{run:?}");
    assert!(run.server_address.ip().is_loopback());
    let r = &run.report;
    assert_eq!((r.sent, r.matched, r.mismatched), (500, 500, 0), "{r:?}");
    assert_eq!(r.closed.as_deref(), Some("closed locally"));
    let s = run.server.unwrap();
    assert_eq!(
        (s.connections, s.closed, s.echoed, s.failed),
        (1, 1, 500, 0)
    );
}

#[test]
fn one_process_pingpong_times_every_round_trip() {
    let run = tcp::pingpong(Target::Loopback, 300, 1500, Some(LIMIT)).unwrap();
    assert!(!run.timed_out);
    let r = &run.report;
    assert_eq!((r.sent, r.matched, r.mismatched), (300, 300, 0));
    assert_eq!(r.round_trips.len(), 300);
    let l = r.latency().unwrap();
    assert_eq!(l.samples, 300);
    assert!(
        l.min <= l.median && l.median <= l.p99 && l.p99 <= l.max,
        "{l:?}"
    );
    assert!(r.elapsed >= l.max);
    assert!(r.round_trips_per_sec().unwrap() > 0.0);
    assert_eq!(run.server.unwrap().echoed, 300);
}

#[test]
fn pingpong_with_messages_larger_than_the_read_buffer() {
    // 200 kB messages exceed the provider's 64 KiB read buffer: they are
    // assembled in receive-pool buffers on both sides.
    let run = tcp::pingpong(Target::Loopback, 20, 200_000, Some(LIMIT)).unwrap();
    assert!(!run.timed_out);
    assert_eq!((run.report.matched, run.report.mismatched), (20, 0));
}

#[test]
fn client_hears_of_a_refused_connection() {
    // Bind a listener, note its port, close it: nothing listens there now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = EndpointAddress::localhost(port);
    let run = tcp::echo(Target::Connect(addr), 10, Some(LIMIT)).unwrap();
    assert!(!run.timed_out);
    assert!(run.report.refused.is_some(), "{run:?}");
    assert_eq!(run.report.matched, 0);
}

#[test]
fn ping_client_runs_unchanged_on_the_simulator() {
    let sim = Sim::with_seed(7);
    let (server, client) = (sim.next_host(), sim.next_host());
    let params = ConnectionParams::receive(4096, 4).with_buffered(4096, 4);
    let sb = server
        .backend(BackendConfig::default(), EchoServer::default())
        .unwrap();
    let listen = sb
        .open_listen_endpoint(EndpointAddress::new(server.ip(), 0), params.clone())
        .unwrap();
    let report = Arc::new(Mutex::new(PingReport::default()));
    let cb = client
        .backend(
            BackendConfig::default(),
            PingClient::new(50, 1000, report.clone(), || {}),
        )
        .unwrap();
    cb.open_active_endpoint(listen, params).unwrap();
    let r = report.clone();
    assert!(sim.run_until(Duration::from_secs(60), || r
        .lock()
        .unwrap()
        .closed
        .is_some()));
    let r = report.lock().unwrap();
    assert_eq!((r.sent, r.matched, r.mismatched), (50, 50, 0));
    assert_eq!(r.round_trips.len(), 50);
}

const ECHO: &str = env!("CARGO_BIN_EXE_echo_tcp");
const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");

#[test]
fn echo_tcp_program_runs_both_sides_in_one_process() {
    let out = run_ok("echo_tcp", ECHO, &[]);
    assert!(
        line_with(&out, "client to 127.0.0.1:")
            .contains("sent 1000, echoed back intact 1000, mismatched 0"),
        "{out:#?}"
    );
    assert!(line_with(&out, "server:").contains("echoed 1000, failed 0"));
}

#[test]
fn pingpong_program_runs_both_sides_in_one_process() {
    let out = run_ok("pingpong", PINGPONG, &[]);
    assert!(line_with(&out, "pingpong over TCP to 127.0.0.1:")
        .contains("10000 round trips of 64 bytes"));
    let l = line_with(&out, "round-trip latency:");
    for part in ["min ", "median ", "p99 ", "max ", "µs"] {
        assert!(l.contains(part), "{l}");
    }
    assert!(line_with(&out, "rate:").contains("round trips/s"));
    assert!(line_with(&out, "echoes intact").contains("echoes intact 10000, mismatched 0"));
}

/// Starts `exe --listen 127.0.0.1:0 <server_args>`, reads the address it
/// prints, runs `exe --connect ADDR <client_args>` to its end, then waits
/// for the server to exit after its one client. Returns both outputs.
fn two_processes(
    exe: &str,
    server_args: &[&str],
    client_args: &[&str],
) -> (Vec<String>, Vec<String>) {
    let mut args = vec!["--listen", "127.0.0.1:0", "--timeout", "30"];
    args.extend_from_slice(server_args);
    let mut server = Proc::spawn("server", exe, &args);
    let first = server.next_line();
    let addr: EndpointAddress = first
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let addr = addr.to_string();
    let mut args = vec!["--connect", &addr, "--timeout", "30"];
    args.extend_from_slice(client_args);
    let client = run_ok("client", exe, &args);
    let (status, server_out, err) = server.finish();
    assert!(status.success(), "server: {status}\n{server_out:#?}\n{err}");
    (server_out, client)
}

#[test]
fn echo_tcp_server_and_client_in_two_processes() {
    let (server, client) = two_processes(ECHO, &[], &["--count", "400"]);
    assert!(
        line_with(&client, "client to").contains("sent 400, echoed back intact 400, mismatched 0"),
        "{client:#?}"
    );
    assert!(
        line_with(&server, "server:").contains("1 connection(s), 1 closed, echoed 400, failed 0"),
        "{server:#?}"
    );
}

#[test]
fn pingpong_server_and_client_in_two_processes() {
    let (server, client) = two_processes(
        PINGPONG,
        &["--size", "4096"],
        &["--count", "200", "--size", "4096"],
    );
    assert!(line_with(&client, "pingpong over TCP").contains("200 round trips of 4096 bytes"));
    assert!(line_with(&client, "echoes intact").contains("echoes intact 200, mismatched 0"));
    assert!(line_with(&server, "server:").contains("echoed 200, failed 0"));
}
