//! Connection floods against one listener: the admission limits of
//! `TcpConfig` bound what a flood holds (connections over the handshake
//! limit wait in the listen backlog, connections over the listener's limit
//! are refused), the connections already held are untouched, every refusal
//! is counted, and a well-behaved client is served once the flood is gone.
//! A test binary of its own: it holds thousands of descriptors.

mod common;

use std::net::TcpStream as StdStream;
use std::time::{Duration, Instant};

use common::raw::require_fd_limit;
use common::{wait_until, Ev, Running, Side};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress, MemoryUsage};
use netio_tcp::TcpConfig;

/// Connection attempts per flood.
const FLOOD: usize = 5000;

/// The flood's client ends, the server's held ends, and margin.
fn enough_fds() {
    require_fd_limit((FLOOD + 1024) as u64);
}

/// Opens `n` plain connections to `addr`, each sending `first` (nothing if
/// empty), and keeps them open.
fn flood(addr: EndpointAddress, n: usize, first: &[u8]) -> Vec<StdStream> {
    use std::io::Write;
    let end = Instant::now() + Duration::from_secs(120);
    let mut socks = Vec::with_capacity(n);
    while socks.len() < n {
        assert!(
            Instant::now() < end,
            "flood: {} of {n} connected",
            socks.len()
        );
        match StdStream::connect_timeout(&addr.socket_addr(), Duration::from_secs(5)) {
            Ok(mut s) => {
                if !first.is_empty() {
                    // A refused connection may be reset before this.
                    let _ = s.write_all(first);
                }
                socks.push(s);
            }
            // The accept queue was full for a moment: try again.
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    socks
}

/// A backend on `rt` with TCP settings `tcp`, listening on 127.0.0.1 with
/// `params`.
fn listening(rt: &Running, tcp: TcpConfig, params: ConnectionParams) -> (Side, EndpointAddress) {
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        tcp,
        common::Recorder::default(),
    );
    let addr = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params)
        .unwrap();
    (server, addr)
}

/// Waits until `server` has refused `refused` connections.
fn wait_refused(server: &Side, refused: u64) {
    assert!(
        wait_until(|| server.b.refused_connections() == refused),
        "refused {} of {FLOOD}, expected {refused}",
        server.b.refused_connections()
    );
}

/// A client that completes its handshake and exchanges a message.
fn served(rt: &Running, server: &Side, addr: EndpointAddress) {
    let client = Side::new(&rt.lp, BackendConfig::default());
    let params = ConnectionParams::receive(4096, 4);
    let conn = client.b.open_active_endpoint(addr, params).unwrap();
    assert!(
        wait_until(|| client.has(|e| matches!(e, Ev::Established(r, _) if *r == addr))),
        "the well-behaved client is served: {:?}",
        client.events()
    );
    client
        .b
        .send_data_copy(conn, &[b"after the flood"], &[], 1)
        .unwrap();
    assert!(wait_until(|| server
        .data()
        .iter()
        .any(|d| d == b"after the flood")));
}

#[test]
fn a_flood_of_silent_connections_holds_at_most_the_handshake_limit() {
    enough_fds();
    const HANDSHAKES: usize = 64;
    // Silent connections: all fit in the backlog, so all connect.
    const SILENT: usize = 2000;
    let rt = Running::start();
    let tcp = TcpConfig {
        max_accepted_handshakes: HANDSHAKES,
        listen_backlog: 4096,
        // Long enough that no silent connection is given up mid-flood.
        handshake_timeout: Duration::from_secs(300),
        ..TcpConfig::default()
    };
    let (server, addr) = listening(&rt, tcp, ConnectionParams::receive(64 << 10, 16));
    let rss_before = common::rss_kib();
    let socks = flood(addr, SILENT, &[]);
    let accepted = || server.b.stats().unwrap().connections_accepted;
    assert!(wait_until(|| accepted() == HANDSHAKES as u64));
    // The rest wait in the backlog: not accepted, not refused.
    std::thread::sleep(Duration::from_millis(200));
    let grown = common::rss_kib().saturating_sub(rss_before);
    eprintln!(
        "silent flood: {SILENT} connections, {} accepted, {} refused, RSS grew {grown} KiB",
        accepted(),
        server.b.refused_connections()
    );
    assert_eq!(accepted(), HANDSHAKES as u64);
    assert_eq!(server.b.refused_connections(), 0);
    // Nothing is allocated for a connection before its handshake: the
    // 16 x 64 KiB receive pool would come with establishment.
    assert_eq!(server.b.memory_usage(), MemoryUsage::default());
    assert!(grown < 16 * 1024, "RSS grew {grown} KiB");
    assert!(server.events().is_empty(), "{:?}", server.events());
    drop(socks);
    // The held connections end with their peers, which frees their slots:
    // each waiting connection is accepted in turn (and ends, its peer gone).
    assert!(
        wait_until(|| accepted() == SILENT as u64),
        "{} of {SILENT} accepted",
        accepted()
    );
    assert_eq!(server.b.refused_connections(), 0);
    assert!(server.events().is_empty(), "{:?}", server.events());
    served(&rt, &server, addr);
}

#[test]
fn a_flood_of_handshaking_connections_holds_at_most_the_listener_limit() {
    enough_fds();
    const HELD: usize = 100;
    let rt = Running::start();
    let tcp = TcpConfig {
        max_connections_per_listener: HELD,
        ..TcpConfig::default()
    };
    let per_conn = 16 * 1024 * 4;
    let (server, addr) = listening(&rt, tcp, ConnectionParams::receive(16 << 10, 4));
    let rss_before = common::rss_kib();
    let hs = netio_tcp::wire::Handshake::new(64 << 10).encode();
    let socks = flood(addr, FLOOD, &hs);
    let refused = (FLOOD - HELD) as u64;
    wait_refused(&server, refused);
    let established = || {
        server
            .events()
            .iter()
            .filter(|e| matches!(e, Ev::Established(..)))
            .count()
    };
    assert!(wait_until(|| established() == HELD), "{}", established());
    let grown = common::rss_kib().saturating_sub(rss_before);
    eprintln!(
        "handshaking flood: {FLOOD} attempts, {HELD} held, {} refused, RSS grew {grown} KiB, \
         receive memory {} B",
        server.b.refused_connections(),
        server.b.memory_usage().receive_bytes
    );
    assert_eq!(server.b.memory_usage().receive_bytes, HELD * per_conn);
    let stats = server.b.stats().expect("a thread-safe backend");
    assert_eq!(stats.admission_refusals, refused);
    assert_eq!(stats.connections_accepted, HELD as u64);
    // 100 connections of 64 KiB pools and 64 KiB read buffers, with room.
    assert!(grown < 64 * 1024, "RSS grew {grown} KiB");
    // Closing the flood ends every held connection; the limit frees up.
    drop(socks);
    assert!(wait_until(|| server
        .events()
        .iter()
        .filter(|e| matches!(e, Ev::Closed(..)))
        .count()
        == HELD));
    assert_eq!(server.b.memory_usage(), MemoryUsage::default());
    served(&rt, &server, addr);
}
