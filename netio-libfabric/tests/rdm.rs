//! Reliable-datagram endpoints beyond the conformance suite: choosing the
//! endpoint type, a fabric the machine lacks, hostile bytes on a listener's
//! control channel, and a peer process that dies.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress};
use netio_libfabric::{EndpointType, LibfabricBackend, LibfabricConfig};

fn rdm(fabric: &str) -> LibfabricConfig {
    LibfabricConfig {
        endpoint: EndpointType::Rdm,
        handshake_timeout: Duration::from_secs(1),
        ..LibfabricConfig::provider(fabric)
    }
}

fn any_port() -> EndpointAddress {
    EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
}

#[test]
fn auto_picks_connected_endpoints_where_offered_and_reliable_datagrams_elsewhere() {
    let lp = Running::start();
    for (fabric, want) in [
        ("tcp", EndpointType::Msg),
        ("sockets", EndpointType::Msg),
        ("tcp;ofi_rxm", EndpointType::Rdm),
        ("shm", EndpointType::Rdm),
        ("udp;ofi_rxd", EndpointType::Rdm),
    ] {
        let config = LibfabricConfig::provider(fabric);
        assert_eq!(config.endpoint, EndpointType::Auto);
        assert_eq!(config.resolved_endpoint(), want, "{fabric}");
        let b = LibfabricBackend::new(&lp.lp, BackendConfig::default(), config, Recorder::new(0))
            .unwrap_or_else(|e| panic!("{fabric}: {e}"));
        assert_eq!(b.endpoint_type(), want, "{fabric}");
    }
}

#[test]
fn a_fabric_without_reliable_datagrams_here_fails_at_creation_and_names_it() {
    let lp = Running::start();
    for fabric in ["efa", "no-such-fabric"] {
        let err = LibfabricBackend::new(
            &lp.lp,
            BackendConfig::default(),
            rdm(fabric),
            Recorder::new(0),
        )
        .err()
        .unwrap_or_else(|| panic!("an RDM backend on `{fabric}` was created"));
        let text = err.to_string();
        assert!(
            text.contains(fabric) && text.contains("FI_EP_RDM"),
            "the error names the fabric and what it lacks: {text}"
        );
    }
}

/// A listener on `fabric` with a client that pings it, while hostile
/// connections are held on the listener's port.
fn hostile_bytes_on_the_listener(fabric: &str) {
    let server_lp = Running::start();
    let client_lp = Running::start();
    let server = Recorder::new(0);
    let sb = LibfabricBackend::new(
        &server_lp.lp,
        BackendConfig::default(),
        rdm(fabric),
        server.clone(),
    )
    .expect("server backend");
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(256, 4))
        .expect("listening");
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()));

    // Random bytes, a frame of an unknown type, a length beyond the limit,
    // a HELLO with a bad magic, half a HELLO held open, silence.
    let garbage: Vec<Vec<u8>> = vec![
        (0..200u32).map(|i| (i * 7919 % 251) as u8).collect(),
        vec![1, 0, 0, 0, 99],
        vec![0xff, 0xff, 0xff, 0x7f, 1],
        [
            &[14u8, 0, 0, 0, 1][..],
            b"XXXX",
            &[1, 0, 1, 2, 3, 4, 0, 0, 0],
        ]
        .concat(),
    ];
    let mut ended_by_server = Vec::new();
    for g in &garbage {
        let mut s = TcpStream::connect(addr).expect("connecting");
        s.write_all(g).expect("writing garbage");
        ended_by_server.push(s);
    }
    let mut half = TcpStream::connect(addr).expect("connecting");
    half.write_all(&[0x2e, 0, 0, 0, 1, b'N', b'R'])
        .expect("half a HELLO");
    let silent: Vec<TcpStream> = (0..50)
        .map(|_| TcpStream::connect(addr).expect("connecting"))
        .collect();

    // A real client is served meanwhile.
    let client = Recorder::new(3);
    client.greet_port.store(listen.port(), Ordering::SeqCst);
    let cb = LibfabricBackend::new(
        &client_lp.lp,
        BackendConfig::default(),
        rdm(fabric),
        client.clone(),
    )
    .expect("client backend");
    cb.open_active_endpoint(
        EndpointAddress::from(addr),
        ConnectionParams::receive(256, 4),
    )
    .expect("connecting");
    assert!(
        wait_until(|| client.count(|s| matches!(s, Seen::Pong(_))) == 3),
        "{fabric}: the client got its pongs while hostile connections were held: {:?}",
        client.seen()
    );

    // Every malformed stream is ended by the server; the silent and the
    // half-sent ones at the set-up deadline (1 s).
    let start = Instant::now();
    for mut s in ended_by_server.into_iter().chain(silent).chain([half]) {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        let mut buf = [0u8; 64];
        let ended = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                // A REFUSE may come before the end.
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
                Err(_) => break false,
            }
        };
        assert!(
            ended,
            "{fabric}: a hostile connection was still open after {:?}",
            start.elapsed()
        );
    }
    assert!(
        sb.refused_connections() >= 50,
        "{fabric}: the silent connections are counted: {}",
        sb.refused_connections()
    );
    assert_eq!(
        server.count(|s| matches!(s, Seen::Established(..))),
        1,
        "{fabric}: only the real client reached the handler: {:?}",
        server.seen()
    );
}

#[test]
fn hostile_bytes_on_a_tcp_rxm_listener_end_only_their_own_connections() {
    hostile_bytes_on_the_listener("tcp;ofi_rxm");
}

#[test]
fn hostile_bytes_on_a_shm_listener_end_only_their_own_connections() {
    hostile_bytes_on_the_listener("shm");
}

/// The child half of [`a_peer_process_that_dies_is_reported_as_a_reset`]:
/// listens, prints its port, and waits to be killed. Run only by that
/// test, in a child process (`--ignored`).
#[test]
#[ignore = "the child process of a_peer_process_that_dies_is_reported_as_a_reset_*"]
fn rdm_child_listener() {
    let fabric = std::env::var("NETIO_RDM_CHILD_FABRIC")
        .expect("run as the child of a_peer_process_that_dies_is_reported_as_a_reset_*");
    let lp = Running::start();
    let b = LibfabricBackend::new(
        &lp.lp,
        BackendConfig::default(),
        rdm(&fabric),
        Recorder::new(0),
    )
    .expect("child backend");
    let listen = b
        .open_listen_endpoint(any_port(), ConnectionParams::receive(256, 4))
        .expect("child listening");
    println!("PORT {}", listen.port());
    std::thread::sleep(Duration::from_secs(60));
}

fn a_dead_peer_process_is_a_reset(fabric: &str) {
    let exe = std::env::current_exe().expect("the test executable");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "rdm_child_listener",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("NETIO_RDM_CHILD_FABRIC", fabric)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the child");
    let out = child.stdout.take().expect("child stdout");
    let port: u16 = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            // The harness writes the test's name on the same line.
            let at = l.find("PORT ")?;
            l[at + 5..].trim().parse().ok()
        })
        .expect("the child's port");

    let lp = Running::start();
    let client = Recorder::new(1);
    client.greet_port.store(port, Ordering::SeqCst);
    let b = LibfabricBackend::new(
        &lp.lp,
        BackendConfig::default(),
        rdm(fabric),
        client.clone(),
    )
    .expect("backend");
    let conn = b
        .open_active_endpoint(
            EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
            ConnectionParams::receive(256, 4),
        )
        .expect("connecting");
    assert!(
        wait_until(|| client.count(|s| matches!(s, Seen::Pong(_))) == 1),
        "{fabric}: the child answered: {:?}",
        client.seen()
    );
    let pid = child.id();
    child.kill().expect("killing the child");
    let _ = child.wait();
    // `shm` removes its shared-memory file at a normal exit only.
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{pid}:"))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    assert!(
        wait_until(|| client.count(|s| matches!(s, Seen::Closed(..))) == 1),
        "{fabric}: the dead peer was noticed: {:?}",
        client.seen()
    );
    assert!(
        client
            .seen()
            .contains(&Seen::Closed(conn, CloseReason::Reset)),
        "{fabric}: a peer that died without closing is a reset: {:?}",
        client.seen()
    );
}

#[test]
fn a_peer_process_that_dies_is_reported_as_a_reset_on_tcp_rxm() {
    a_dead_peer_process_is_a_reset("tcp;ofi_rxm");
}

#[test]
fn a_peer_process_that_dies_is_reported_as_a_reset_on_shm() {
    a_dead_peer_process_is_a_reset("shm");
}
