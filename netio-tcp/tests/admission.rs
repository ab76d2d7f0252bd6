//! Admission at `TcpConfig::max_accepted_handshakes`: a listener at the
//! limit stops accepting, connections wait in the kernel's listen backlog,
//! and accepting resumes as handshakes end (established, failed or timed
//! out). A burst of clients far above the limit is served in full. A test
//! binary of its own: it holds thousands of descriptors.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::time::{Duration, Instant};

use common::raw::{self, require_fd_limit};
use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{Backend, BackendConfig, ConnId, ConnectionParams, EndpointAddress};
use netio_tcp::wire::HANDSHAKE_LEN;
use netio_tcp::{TcpConfig, TcpProvider};

/// Clients of the burst.
const BURST: usize = 2000;

/// The message client connection `conn` sends.
fn hello(conn: ConnId) -> Vec<u8> {
    format!("hello from {conn}").into_bytes()
}

#[test]
fn a_burst_of_2000_clients_is_served_in_full_at_a_handshake_limit_of_100() {
    // Both ends of every connection are in this process, plus margin.
    let needed = (2 * BURST + 256) as u64;
    require_fd_limit(needed);
    // Server and clients on loops of their own, so both cores work.
    let server_loop = Running::start();
    let client_loop = Running::start();
    let small = TcpConfig {
        read_buffer_size: 4096,
        ..TcpConfig::default()
    };
    let server = Side::with(
        &server_loop.lp,
        BackendConfig::default(),
        TcpConfig {
            max_accepted_handshakes: 100,
            // Room for the whole burst (the kernel caps it at
            // net.core.somaxconn, 4096 by default since Linux 5.4).
            listen_backlog: 4096,
            ..small.clone()
        },
        Recorder {
            skip_data: true,
            on_data: Some(Box::new(|b, conn, d| {
                b.send_data_copy(conn, &[d], &[], 0).unwrap();
            })),
            ..Recorder::default()
        },
    );
    let params = ConnectionParams::receive(256, 4);
    let addr = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
        .unwrap();
    let client = Side::with(
        &client_loop.lp,
        BackendConfig::default(),
        small,
        Recorder {
            on_established: Some(Box::new(|b, conn| {
                b.send_data_copy(conn, &[&hello(conn)], &[], 0).unwrap();
            })),
            ..Recorder::default()
        },
    );
    let started = Instant::now();
    // Every client at once, from the client loop's thread: a burst.
    let b = client.b.clone();
    let opened = client_loop.on_loop(move || {
        (0..BURST)
            .map(|_| b.open_active_endpoint(addr, params.clone()))
            .filter(Result::is_ok)
            .count()
    });
    assert_eq!(opened, BURST);
    let echoed = || client.data_count.load(std::sync::atomic::Ordering::SeqCst);
    let done = wait_until(|| {
        echoed() == BURST || client.has(|e| matches!(e, Ev::Refused(..) | Ev::Closed(..)))
    });
    let refused = client.count(|e| matches!(e, Ev::Refused(..)));
    let established = client.count(|e| matches!(e, Ev::Established(..)));
    eprintln!(
        "burst of {BURST} at a handshake limit of 100: {established} established, \
         {refused} refused, {} echoed in {:?}",
        echoed(),
        started.elapsed()
    );
    assert!(done, "{} of {BURST} echoed", echoed());
    assert_eq!((established, refused, echoed()), (BURST, 0, BURST));
    assert!(!client.has(|e| matches!(e, Ev::Closed(..))));
    // Each client got its own message back.
    let mut echoes: HashMap<ConnId, Vec<Vec<u8>>> = HashMap::new();
    for (conn, ev) in client.log() {
        if let Ev::Data(_, d) = ev {
            echoes.entry(conn).or_default().push(d);
        }
    }
    assert_eq!(echoes.len(), BURST);
    for (conn, got) in &echoes {
        assert_eq!(got, &[hello(*conn)], "{conn}");
    }
    assert_eq!(server.b.refused_connections(), 0);
    let stats = server.b.stats().expect("a thread-safe backend");
    assert_eq!(
        (
            stats.connections_accepted,
            stats.connections_established,
            stats.admission_refusals
        ),
        (BURST as u64, BURST as u64, 0)
    );
}

#[test]
fn a_silent_connection_holding_the_last_handshake_slot_times_out_then_admission_resumes() {
    const TIMEOUT: Duration = Duration::from_millis(1500);
    let rt = Running::start();
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            max_accepted_handshakes: 1,
            handshake_timeout: TIMEOUT,
            ..TcpConfig::default()
        },
        Recorder::default(),
    );
    let params = ConnectionParams::receive(4096, 4);
    let addr = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
        .unwrap();
    // A peer that connects and says nothing takes the only slot.
    let mut silent = raw::connect(addr);
    let silent_since = Instant::now();
    let accepted = || server.b.stats().unwrap().connections_accepted;
    assert!(wait_until(|| accepted() == 1));
    // A well-behaved client waits in the backlog meanwhile: neither
    // accepted nor refused.
    let client = Side::new(&rt.lp, BackendConfig::default());
    client.b.open_active_endpoint(addr, params).unwrap();
    std::thread::sleep(TIMEOUT / 3);
    assert_eq!(accepted(), 1);
    assert!(client.events().is_empty(), "{:?}", client.events());
    assert_eq!(server.b.refused_connections(), 0);
    // The silent peer is given up at the handshake timeout: the server
    // closes its socket without a word.
    let mut got = Vec::new();
    let ended = silent.read_to_end(&mut got);
    let held = silent_since.elapsed();
    assert!(ended.is_ok(), "{ended:?} after {held:?}");
    assert_eq!(
        got.len(),
        HANDSHAKE_LEN,
        "the server's handshake, then the end"
    );
    assert!(held >= TIMEOUT - Duration::from_millis(100), "{held:?}");
    // Its slot goes to the waiting client, which is served.
    assert!(
        wait_until(|| client.has(|e| matches!(e, Ev::Established(r, _) if *r == addr))),
        "{:?}",
        client.events()
    );
    assert_eq!(accepted(), 2);
    assert_eq!(server.b.refused_connections(), 0);
    assert_eq!(server.count(|e| matches!(e, Ev::Established(..))), 1);
}

#[test]
fn a_handshake_limit_of_zero_is_an_invalid_configuration() {
    let rt = Running::start();
    let err = TcpProvider::create_with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            max_accepted_handshakes: 0,
            ..TcpConfig::default()
        },
        Recorder::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("max_accepted_handshakes"), "{err}");
}
