//! Port ranges (`TcpConfig::listen_ports`, `TcpConfig::connect_ports`)
//! over 127.0.0.1: listeners and outgoing connections take their ports from
//! the range, an exhausted range is a `NoResources` error saying so, and a
//! port outside the listen range is refused.
//!
//! Each test works on ports it first holds itself: it binds listeners on a
//! block of consecutive ports of 127.0.0.1 below the system's ephemeral
//! range (so the kernel hands none of them to other sockets), then frees
//! the ones the backend may use.

mod common;

use std::io;
use std::net::{Ipv4Addr, TcpListener as StdListener};
use std::sync::atomic::{AtomicU16, Ordering};

use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, OpenActiveError,
    OpenListenError,
};
use netio_tcp::{PortRange, TcpConfig};

/// Where blocks are searched: below Linux's default ephemeral range
/// (32768..=60999) and above the usual service ports.
const BLOCKS_FROM: u16 = 20000;
const BLOCKS_TO: u16 = 32000;
/// How many blocks one reservation tries before giving up.
const MAX_BLOCK_TRIES: usize = 200;

/// Ports this process's tests have looked at, so two tests running at once
/// never search the same ports.
static CURSOR: AtomicU16 = AtomicU16::new(0);

/// Consecutive ports of 127.0.0.1 held by listeners of this test.
struct Reserved {
    range: PortRange,
    held: Vec<Option<StdListener>>,
}

impl Reserved {
    /// Holds `n` consecutive free ports.
    fn block(n: u16) -> Self {
        let span = BLOCKS_TO - BLOCKS_FROM;
        // Start somewhere that depends on the process, so runs of this
        // binary in parallel processes rarely meet.
        let seed = (std::process::id() % u32::from(span)) as u16;
        for _ in 0..MAX_BLOCK_TRIES {
            let at = CURSOR.fetch_add(n, Ordering::Relaxed);
            let first = BLOCKS_FROM + (seed.wrapping_add(at) % (span - n));
            let held: Vec<_> = (first..first + n)
                .map_while(|p| StdListener::bind((Ipv4Addr::LOCALHOST, p)).ok())
                .map(Some)
                .collect();
            if held.len() == usize::from(n) {
                return Self {
                    range: PortRange::new(first, first + n - 1).unwrap(),
                    held,
                };
            }
        }
        panic!("found no {n} consecutive free ports in {BLOCKS_FROM}..{BLOCKS_TO}");
    }

    /// Frees the `i`-th port of the block for the backend.
    fn free(&mut self, i: usize) -> u16 {
        self.held[i] = None;
        self.range.first() + i as u16
    }

    /// Frees every port of the block.
    fn free_all(&mut self) {
        for h in &mut self.held {
            *h = None;
        }
    }

    /// The ports still held.
    fn held_ports(&self) -> Vec<u16> {
        (self.range.first()..=self.range.last())
            .zip(&self.held)
            .filter(|(_, h)| h.is_some())
            .map(|(p, _)| p)
            .collect()
    }
}

fn params() -> ConnectionParams {
    ConnectionParams::receive(1024, 4).with_buffered(1024, 4)
}

fn side(rt: &Running, tcp: TcpConfig) -> Side {
    Side::with(&rt.lp, BackendConfig::default(), tcp, Recorder::default())
}

fn listen_ports(range: PortRange) -> TcpConfig {
    TcpConfig {
        listen_ports: Some(range),
        ..TcpConfig::default()
    }
}

fn connect_ports(range: PortRange) -> TcpConfig {
    TcpConfig {
        connect_ports: Some(range),
        ..TcpConfig::default()
    }
}

/// The remotes of the connections `side` reported established.
fn established(side: &Side) -> Vec<EndpointAddress> {
    side.events()
        .iter()
        .filter_map(|e| match e {
            Ev::Established(r, _) => Some(*r),
            _ => None,
        })
        .collect()
}

#[test]
fn listener_picks_a_port_in_the_configured_range() {
    let mut block = Reserved::block(6);
    let free = [block.free(1), block.free(4)];
    let rt = Running::start();
    let server = side(&rt, listen_ports(block.range));

    let mut got = Vec::new();
    for _ in 0..2 {
        let addr = server
            .b
            .open_listen_endpoint(EndpointAddress::localhost(0), params())
            .expect("a free port of the range");
        assert!(
            block.range.contains(addr.port()),
            "{addr} outside {}",
            block.range
        );
        assert_eq!(addr.ip(), EndpointAddress::localhost(0).ip());
        got.push(addr.port());
    }
    got.sort_unstable();
    assert_eq!(got, free, "the listeners took exactly the free ports");

    // A listener of the range is an ordinary one: a client connects.
    let client = side(&rt, TcpConfig::default());
    let target = EndpointAddress::localhost(got[0]);
    client.b.open_active_endpoint(target, params()).unwrap();
    assert!(
        wait_until(|| established(&client) == [target] && established(&server).len() == 1),
        "connection to {target}: client {:?}, server {:?}",
        client.events(),
        server.events()
    );

    // A non-zero port inside the range is used as asked.
    let again = block.free(2);
    let asked = EndpointAddress::localhost(again);
    assert_eq!(
        server.b.open_listen_endpoint(asked, params()).unwrap(),
        asked
    );
}

#[test]
fn outgoing_connection_uses_a_local_port_in_the_range() {
    let mut block = Reserved::block(4);
    block.free_all();
    let rt = Running::start();
    let server = side(&rt, TcpConfig::default());
    let client = side(&rt, connect_ports(block.range));

    let listeners: Vec<EndpointAddress> = (0..3)
        .map(|_| {
            server
                .b
                .open_listen_endpoint(EndpointAddress::localhost(0), params())
                .unwrap()
        })
        .collect();
    for &l in &listeners {
        client.b.open_active_endpoint(l, params()).unwrap();
    }
    assert!(
        wait_until(|| established(&client).len() == 3 && established(&server).len() == 3),
        "client {:?}, server {:?}",
        client.events(),
        server.events()
    );
    // The accepting side names each connection by the client's IP and
    // local port.
    for peer in established(&server) {
        assert_eq!(peer.ip(), EndpointAddress::localhost(0).ip());
        assert!(
            block.range.contains(peer.port()),
            "the client connected from {peer}, outside {}",
            block.range
        );
    }

    // Messages flow over such a connection.
    let peer = established(&server)[0];
    server
        .b
        .send_data_copy(server.conn(peer), &[b"ranged"], &[], 1)
        .unwrap();
    assert!(wait_until(|| client.data() == [b"ranged".to_vec()]));
}

#[test]
fn a_local_port_of_the_range_is_used_again_after_its_connection_closed() {
    let mut block = Reserved::block(1);
    block.free_all();
    let rt = Running::start();
    let server = side(&rt, TcpConfig::default());
    let client = side(&rt, connect_ports(block.range));
    let only = block.range.first();

    // Each connection goes to another listener: one local port serves them
    // one after the other, although the earlier ones may linger in the
    // system (TIME_WAIT) after closing.
    for round in 0..3 {
        let l = server
            .b
            .open_listen_endpoint(EndpointAddress::localhost(0), params())
            .unwrap();
        client
            .b
            .open_active_endpoint(l, params())
            .unwrap_or_else(|e| {
                panic!("round {round}: connecting from port {only} again failed: {e}")
            });
        assert!(
            wait_until(|| established(&server).len() == round + 1),
            "round {round}: server {:?}, client {:?}",
            server.events(),
            client.events()
        );
        let peer = *established(&server).last().unwrap();
        assert_eq!(peer.port(), only, "round {round}");
        // The server can see the connection established before the client
        // has read the server's handshake; closing before the client's own
        // `Established` would cancel an opening connection instead.
        assert!(
            wait_until(|| client.has(|e| matches!(e, Ev::Established(r, _) if *r == l))),
            "round {round}: client {:?}",
            client.events()
        );
        client.b.close_active_endpoint(client.conn(l)).unwrap();
        assert!(
            wait_until(|| server
                .has(|e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == peer))),
            "round {round}: server {:?}",
            server.events()
        );
        assert!(wait_until(|| client.has(
            |e| matches!(e, Ev::Closed(r, CloseReason::Local, _) if *r == l)
        )));
        server.b.close_listen_endpoint(l).unwrap();
    }
}

#[test]
fn exhausted_port_range_is_a_clear_error() {
    let mut block = Reserved::block(3);
    let range = block.range;
    let rt = Running::start();

    // Listening: every port of the range is held by someone else.
    let server = side(&rt, listen_ports(range));
    let err = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .expect_err("every port of the range is taken");
    let text = err.to_string();
    assert!(
        matches!(err, OpenListenError::NoResources { .. }),
        "expected NoResources, got {err:?}"
    );
    assert!(err.is_retryable());
    assert!(
        text.contains(&format!("no free port in {range}")),
        "the error names the range: {text}"
    );
    assert_eq!(io::Error::from(err).kind(), io::ErrorKind::WouldBlock);

    // Connecting: the same ports, as local ports.
    let target_side = side(&rt, TcpConfig::default());
    let target = target_side
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .unwrap();
    let client = side(&rt, connect_ports(range));
    let err = client
        .b
        .open_active_endpoint(target, params())
        .expect_err("every local port of the range is taken");
    let text = err.to_string();
    assert!(
        matches!(err, OpenActiveError::NoResources { .. }),
        "expected NoResources, got {err:?}"
    );
    assert!(
        text.contains(&format!("no free local port in {range}")) && text.contains("connect to"),
        "the error names the range and the remote: {text}"
    );
    // Nothing was attempted: no event.
    client
        .b
        .close_active_endpoint(client.conn(target))
        .unwrap_err();

    // Retrying once a port is free works.
    let freed = block.free(1);
    let l = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .expect("the freed port");
    assert_eq!(l.port(), freed);
    assert_eq!(block.held_ports(), [range.first(), range.last()]);
    let err = client
        .b
        .open_active_endpoint(target, params())
        .expect_err("the freed port now listens: it cannot be a local port");
    assert!(
        matches!(err, OpenActiveError::NoResources { .. }),
        "{err:?}"
    );
    server.b.close_listen_endpoint(l).unwrap();
    // Closing the listener frees its port for connecting. The loop closes
    // the socket at once (a closed listener has no connections to drain).
    assert!(
        wait_until(|| client.b.open_active_endpoint(target, params()).is_ok()),
        "connecting from the freed port {freed}"
    );
    assert!(wait_until(|| established(&target_side)
        .iter()
        .any(|p| p.port() == freed)));
    assert!(wait_until(|| established(&client) == [target]));
}

#[test]
fn port_outside_range_is_refused() {
    let mut block = Reserved::block(3);
    block.free_all();
    let range = block.range;
    let rt = Running::start();
    let server = side(&rt, listen_ports(range));
    // A port just above the range, that nothing here holds.
    for port in [range.last() + 1, range.first() - 1] {
        let asked = EndpointAddress::localhost(port);
        let err = server
            .b
            .open_listen_endpoint(asked, params())
            .expect_err("a port outside the range");
        let text = err.to_string();
        let OpenListenError::FailedOpenListenEndpoint { address, source } = &err else {
            panic!("expected FailedOpenListenEndpoint, got {err:?}");
        };
        assert_eq!(*address, asked);
        assert!(!err.is_retryable());
        assert!(
            text.contains(&format!(
                "port {port} is outside the listen port range {range}"
            )),
            "the error names the port and the range: {text}"
        );
        let io = source
            .downcast_ref::<io::Error>()
            .expect("the source is the system-level error");
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
    }
    // Inside the range is fine.
    let inside = EndpointAddress::localhost(range.first() + 1);
    assert_eq!(
        server.b.open_listen_endpoint(inside, params()).unwrap(),
        inside
    );
}

/// Both ranges over ::1, where this host has it (the build script's probe;
/// `conformance_v6` reports when it does not).
#[cfg(netio_tcp_ipv6_loopback)]
#[test]
fn port_ranges_apply_over_ipv6_too() {
    // Held on 127.0.0.1 so no other test of this binary picks them, then
    // freed: the backend uses them on ::1.
    let mut listen_block = Reserved::block(3);
    let mut connect_block = Reserved::block(3);
    listen_block.free_all();
    connect_block.free_all();
    let rt = Running::start();
    let server = side(&rt, listen_ports(listen_block.range));
    let client = side(&rt, connect_ports(connect_block.range));
    let l = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost_v6(0), params())
        .expect("a port of the range on ::1");
    assert_eq!(l.ip(), EndpointAddress::localhost_v6(0).ip());
    assert!(listen_block.range.contains(l.port()), "{l}");
    client.b.open_active_endpoint(l, params()).unwrap();
    assert!(
        wait_until(|| established(&server).len() == 1 && established(&client) == [l]),
        "server {:?}, client {:?}",
        server.events(),
        client.events()
    );
    let peer = established(&server)[0];
    assert_eq!(peer.ip(), l.ip());
    assert!(connect_block.range.contains(peer.port()), "{peer}");
}
