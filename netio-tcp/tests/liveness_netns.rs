//! A peer that stops answering, for real: both backends run in a network
//! namespace of their own whose loopback interface the test takes down,
//! so the kernel drops every packet between them. With a peer timeout of
//! 1 s the kernel gives both connections up (`TCP_USER_TIMEOUT` on the side
//! with unacknowledged data, keepalive probes on the idle side) with
//! `ETIMEDOUT`, reported as `CloseReason::TimedOut`.
//!
//! Needs root and iproute2 (`ip netns`); where namespaces cannot be made
//! the test says so and passes without running (`NETIO_REQUIRE_NETNS=1`
//! makes that a failure).

mod common;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress};
use netio_tcp::TcpConfig;

/// A network namespace, deleted on drop.
struct Netns(String);

impl Netns {
    fn create() -> Result<Self, String> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "netio-tcp-liveness-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let ns = Self(name);
        ns.ip(&["netns", "add", &ns.0])?;
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("running ip: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Runs a command inside the namespace.
    fn exec(&self, cmd: &[&str]) -> Result<(), String> {
        let mut args = vec!["netns", "exec", &self.0];
        args.extend_from_slice(cmd);
        self.ip(&args)
    }

    /// Moves the calling thread (only it) into the namespace; threads it
    /// starts afterwards are in it too.
    fn enter(&self) {
        let f = File::open(format!("/var/run/netns/{}", self.0)).expect("opening the namespace");
        // SAFETY: setns with a valid namespace descriptor only changes the
        // calling thread's network namespace; no memory is involved.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.ip(&["netns", "del", &self.0]);
    }
}

#[test]
fn a_peer_that_stops_answering_closes_both_sides_with_timed_out() {
    in_a_namespace(EndpointAddress::localhost(0));
}

/// Over IPv6 the kernel gives up with the route failure it met on the way
/// (`ENETUNREACH` once `lo` is down), not `ETIMEDOUT`: still a timeout.
#[test]
fn a_peer_that_stops_answering_over_ipv6_closes_both_sides_with_timed_out() {
    in_a_namespace("[::1]:0".parse().unwrap());
}

/// A connection paused with messages held, whose peer then stops
/// answering: the kernel's error comes while the messages are still held,
/// and after they are handed out the connection closes with
/// `CloseReason::TimedOut`, not as a reset.
#[test]
fn a_paused_connection_whose_peer_stops_answering_closes_with_timed_out_after_its_messages() {
    in_a_namespace_run(EndpointAddress::localhost(0), run_paused_in_namespace);
}

fn in_a_namespace(listen_at: EndpointAddress) {
    in_a_namespace_run(listen_at, run_in_namespace);
}

fn in_a_namespace_run(listen_at: EndpointAddress, run: fn(&Netns, EndpointAddress)) {
    let ns = match Netns::create() {
        Ok(ns) => ns,
        Err(e) => {
            assert!(
                std::env::var("NETIO_REQUIRE_NETNS").as_deref() != Ok("1"),
                "no network namespace: {e}"
            );
            eprintln!("no network namespace here ({e}); the real timeout is not tested");
            return;
        }
    };
    let name = ns.0.clone();
    // Everything on a thread inside the namespace (the loop thread it
    // starts too).
    let result = thread::spawn(move || {
        let ns = Netns(name);
        ns.enter();
        run(&ns, listen_at);
        std::mem::forget(ns); // deleted by the outer handle
    })
    .join();
    drop(ns);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

fn run_in_namespace(ns: &Netns, listen_at: EndpointAddress) {
    let rt = Running::start();
    let config = BackendConfig {
        peer_timeout: Some(Duration::from_secs(1)),
        ..BackendConfig::default()
    };
    let server = Side::with(
        &rt.lp,
        config.clone(),
        TcpConfig::default(),
        Recorder::default(),
    );
    let client = Side::with(&rt.lp, config, TcpConfig::default(), Recorder::default());
    let params = ConnectionParams::receive(1024, 4);
    let (addr, peer) = common::connect(&server, &client, listen_at, params.clone(), params);
    let conn = client.conn(addr);
    client.b.send_data_copy(conn, &[b"before"], &[], 1).unwrap();
    assert!(wait_until(|| server.data() == vec![b"before".to_vec()]));

    // From now on every packet is dropped.
    ns.exec(&["ip", "link", "set", "lo", "down"]).unwrap();
    let start = Instant::now();
    // Unacknowledged data on the client: TCP_USER_TIMEOUT. The server is
    // idle: its keepalive probes go unanswered.
    client.b.send_data_copy(conn, &[b"lost"], &[], 2).unwrap();
    let timed_out = |side: &Side, remote: EndpointAddress| {
        side.has(|e| matches!(e, Ev::Closed(r, CloseReason::TimedOut, _) if *r == remote))
    };
    let bound = Duration::from_secs(10);
    while start.elapsed() < bound && !(timed_out(&client, addr) && timed_out(&server, peer)) {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(
        timed_out(&client, addr),
        "client after {:?}: {:?}",
        start.elapsed(),
        client.events()
    );
    assert!(
        timed_out(&server, peer),
        "server after {:?}: {:?}",
        start.elapsed(),
        server.events()
    );
    // The unfinished send's key is either completed (it left this side's
    // buffers) or cancelled, once.
    let ended = client.count(|e| *e == Ev::Completed(addr, 2))
        + client.count(|e| matches!(e, Ev::Closed(_, _, keys) if keys.contains(&2)));
    assert_eq!(ended, 1);
}

fn run_paused_in_namespace(ns: &Netns, listen_at: EndpointAddress) {
    let rt = Running::start();
    let config = BackendConfig {
        peer_timeout: Some(Duration::from_secs(1)),
        ..BackendConfig::default()
    };
    // The server pauses after every message it gets.
    let pausing = Recorder {
        on_data: Some(Box::new(|b, c, _| {
            b.pause_receive(c).unwrap();
        })),
        ..Recorder::default()
    };
    let server = Side::with(&rt.lp, config.clone(), TcpConfig::default(), pausing);
    let client = Side::with(&rt.lp, config, TcpConfig::default(), Recorder::default());
    let params = ConnectionParams::receive(1024, 4);
    let (addr, peer) = common::connect(&server, &client, listen_at, params.clone(), params);
    let conn = client.conn(addr);
    let s_conn = server.conn(peer);
    // Five messages in one write: the server reads them together, hands
    // out the first and holds four.
    let cb = client.b.clone();
    rt.on_loop(move || {
        for k in 0..5u64 {
            cb.send_data_copy(conn, &[&[k as u8; 8]], &[], k).unwrap();
        }
    });
    assert!(wait_until(|| server.data().len() == 1));
    ns.exec(&["ip", "link", "set", "lo", "down"]).unwrap();
    client.b.send_data_copy(conn, &[b"lost"], &[], 9).unwrap();
    let timed_out = |side: &Side, remote: EndpointAddress| {
        side.has(|e| matches!(e, Ev::Closed(r, CloseReason::TimedOut, _) if *r == remote))
    };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) && !timed_out(&client, addr) {
        thread::sleep(Duration::from_millis(20));
    }
    assert!(timed_out(&client, addr), "client: {:?}", client.events());
    // The server's idle connection gives up by keepalive meanwhile; its
    // error waits in the socket, behind the held messages. Resume once:
    // the read meets the error, one held message is handed out, and the
    // handler pauses again, with three still held.
    thread::sleep(Duration::from_secs(2));
    server.b.resume_receive(s_conn).unwrap();
    assert!(wait_until(|| server.data().len() == 2));
    // Hand out the rest, one resume each.
    let closed = |side: &Side| side.has(|e| matches!(e, Ev::Closed(..)));
    let end = Instant::now() + Duration::from_secs(10);
    while !closed(&server) && Instant::now() < end {
        let _ = server.b.resume_receive(s_conn);
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.data().len(), 5, "every held message is handed out");
    assert!(
        timed_out(&server, peer),
        "the held error is the reason: {:?}",
        server.events()
    );
}
