//! Reliable-datagram endpoints beyond the conformance suite: choosing the
//! endpoint type, `peer_timeout` on each type, a fabric the machine lacks,
//! a listener's admission limits, hostile bytes on a listener's control
//! channel, a peer process that dies, and injected sends.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler,
};
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

/// A reliable-datagram backend on `fabric` (see [`rdm`]), default
/// settings otherwise, on `lp` with (a clone of) handler `handler`.
fn rdm_backend<H: Handler<LibfabricBackend> + Clone + 'static>(
    lp: &Running,
    fabric: &str,
    handler: &H,
) -> LibfabricBackend {
    LibfabricBackend::new(
        &lp.lp,
        BackendConfig::default(),
        rdm(fabric),
        handler.clone(),
    )
    .unwrap_or_else(|e| panic!("{fabric}: a backend: {e}"))
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

/// `peer_timeout` asks for something connected endpoints cannot do (they
/// have no keepalive): a backend on them refuses it at creation, saying
/// which endpoint type enforces it, rather than accept it and never close
/// a silent peer's connection. Reliable-datagram backends on the same
/// fabric providers take it (their heartbeats enforce it; the conformance
/// suite's `peer_timeout_ends_a_connection_whose_peer_stops_answering_with_timed_out`
/// runs on them).
#[test]
fn peer_timeout_is_refused_on_connected_endpoints_and_taken_on_reliable_datagrams() {
    let lp = Running::start();
    let config = BackendConfig {
        peer_timeout: Some(Duration::from_secs(5)),
        ..BackendConfig::default()
    };
    for (fabric, endpoint) in [("tcp", EndpointType::Auto), ("sockets", EndpointType::Msg)] {
        let lf = LibfabricConfig {
            endpoint,
            ..LibfabricConfig::provider(fabric)
        };
        let err = LibfabricBackend::new(&lp.lp, config.clone(), lf, Recorder::new(0))
            .err()
            .unwrap_or_else(|| panic!("{fabric}: a connected backend took peer_timeout"));
        let text = err.to_string();
        assert!(
            matches!(err, netio_core::CreateError::NotSupported(_))
                && text.contains("peer_timeout")
                && text.contains("EndpointType::Rdm"),
            "{fabric}: refused as not supported, naming the endpoint type that enforces it: {text}"
        );
    }
    for fabric in ["tcp;ofi_rxm", "shm"] {
        LibfabricBackend::new(&lp.lp, config.clone(), rdm(fabric), Recorder::new(0))
            .unwrap_or_else(|e| panic!("{fabric}: {e}"));
    }
    // The longest timeout there is sets up connections like any other.
    let forever = BackendConfig {
        peer_timeout: Some(Duration::MAX),
        ..BackendConfig::default()
    };
    let (server, client) = (Recorder::new(0), Recorder::new(0));
    let sb = LibfabricBackend::new(&lp.lp, forever.clone(), rdm("shm"), server.clone())
        .expect("server backend");
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(64, 2))
        .expect("listening");
    let cb =
        LibfabricBackend::new(&lp.lp, forever, rdm("shm"), client.clone()).expect("client backend");
    cb.open_active_endpoint(
        EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()))),
        ConnectionParams::receive(64, 2),
    )
    .expect("connecting");
    assert!(
        wait_until(|| client.count(|s| matches!(s, Seen::Established(..))) == 1
            && server.count(|s| matches!(s, Seen::Established(..))) == 1),
        "a peer_timeout of Duration::MAX: {:?} / {:?}",
        client.seen(),
        server.seen()
    );
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
    let sb = rdm_backend(&server_lp, fabric, &server);
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
    let cb = rdm_backend(&client_lp, fabric, &client);
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

/// A reliable-datagram listener's admission limits: connections beyond
/// `max_connections_per_listener` are refused (the initiator sees a
/// refusal, the listener counts it, its handler hears nothing), and
/// control channels beyond `max_pending_handshakes` that have not sent
/// their HELLO are answered REFUSE at once; when the held ones end, a new
/// client is served.
fn rdm_listener_limits(fabric: &str) {
    let (server_lp, client_lp) = (Running::start(), Running::start());
    let server = Recorder::new(0);
    let sb = LibfabricBackend::new(
        &server_lp.lp,
        BackendConfig::default(),
        LibfabricConfig {
            max_connections_per_listener: 2,
            max_pending_handshakes: 3,
            ..rdm(fabric)
        },
        server.clone(),
    )
    .expect("server backend");
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(64, 2))
        .expect("listening");
    let to = EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port())));
    let client = Recorder::new(0);
    let cb = rdm_backend(&client_lp, fabric, &client);
    let conns: Vec<ConnId> = (0..3)
        .map(|_| {
            cb.open_active_endpoint(to, ConnectionParams::receive(64, 2))
                .expect("connecting")
        })
        .collect();
    assert!(
        wait_until(|| {
            client.count(|s| matches!(s, Seen::Established(..)))
                + client.count(|s| matches!(s, Seen::Refused(..)))
                == 3
        }),
        "{fabric}: every connection is established or refused: {:?}",
        client.seen()
    );
    assert_eq!(
        (
            client.count(|s| matches!(s, Seen::Established(..))),
            client.count(|s| matches!(s, Seen::Refused(..)))
        ),
        (2, 1),
        "{fabric}: two connections are held, the third refused: {:?}",
        client.seen()
    );
    assert_eq!(
        sb.refused_connections(),
        1,
        "{fabric}: the refusal is counted"
    );
    assert_eq!(
        server.count(|s| matches!(s, Seen::Established(..))),
        2,
        "{fabric}: the listener's handler hears of the two it holds only"
    );
    for c in conns {
        let _ = cb.close_active_endpoint(c);
    }
    assert!(
        wait_until(|| server.count(|s| matches!(s, Seen::Closed(..))) == 2),
        "{fabric}: the listener's side of both connections closes"
    );

    // Three silent control channels fill the pending limit; the fourth is
    // answered REFUSE at once.
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()));
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(addr).expect("connecting"))
        .collect();
    // The listener takes the connections in the order they came (one
    // accept loop), so the fourth meets the three, which stay pending
    // until the set-up deadline (1 s).
    let mut fourth = TcpStream::connect(addr).expect("connecting");
    fourth
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let mut answer = Vec::new();
    let _ = fourth.read_to_end(&mut answer);
    // A REFUSE frame: type 3 after the 4-byte length, reason 1 (limit).
    assert!(
        answer.len() > 6 && answer[4] == 3 && answer[5] == 1,
        "{fabric}: the control channel beyond the pending limit is refused (limit): {answer:?}"
    );
    drop(silent);
    let late = Recorder::new(0);
    let lb = rdm_backend(&client_lp, fabric, &late);
    lb.open_active_endpoint(to, ConnectionParams::receive(64, 2))
        .expect("connecting");
    assert!(
        wait_until(|| late.count(|s| matches!(s, Seen::Established(..))) == 1),
        "{fabric}: a client is served once the silent channels are gone: {:?}",
        late.seen()
    );
}

#[test]
fn rdm_listener_limits_refuse_and_count_on_tcp_rxm() {
    rdm_listener_limits("tcp;ofi_rxm");
}

#[test]
fn rdm_listener_limits_refuse_and_count_on_shm() {
    rdm_listener_limits("shm");
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
    let b = rdm_backend(&lp, fabric, &client);
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
    // `shm` removes its shared-memory file at a normal exit only (netio
    // names it `netio-<pid>-…`).
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with(&format!("netio-{pid}-"))
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

/// Sizes cycled by [`Mixed`]: below, at and above `shm`'s injection limit
/// (4,096 bytes), so that injected copy sends and ordinary ones alternate.
const MIXED_SIZES: [usize; 6] = [1, 64, 4096, 4097, 9000, 200];

/// The bytes of message `i`.
fn mixed_message(i: usize) -> Vec<u8> {
    let len = MIXED_SIZES[i % MIXED_SIZES.len()];
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

/// Sends `total` copy sends of [`mixed_message`]s as the queue allows
/// (the sender), and records what arrives and which keys complete.
#[derive(Clone, Default)]
struct Mixed {
    total: usize,
    next: Arc<Mutex<usize>>,
    got: Arc<Mutex<Vec<Vec<u8>>>>,
    completed: Arc<Mutex<Vec<u64>>>,
    closed: Arc<Mutex<Vec<CloseReason>>>,
}

impl Mixed {
    fn send_more<B: Backend + ?Sized>(&self, b: &B, conn: ConnId) {
        let mut next = self.next.lock().unwrap();
        while *next < self.total {
            let m = mixed_message(*next);
            match b.send_data_copy(conn, &[&m], &[], *next as u64) {
                Ok(()) => *next += 1,
                Err(netio_core::SendError::NoResources) => return,
                Err(e) => panic!("copy send {} refused: {e}", *next),
            }
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for Mixed {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        _r: EndpointAddress,
        _c: Capabilities,
    ) {
        self.send_more(b, conn);
    }

    fn on_sends_completed(&mut self, b: &B, conn: ConnId, keys: &[u64]) {
        self.completed.lock().unwrap().extend_from_slice(keys);
        self.send_more(b, conn);
    }

    fn on_connection_closed(
        &mut self,
        _b: &B,
        _conn: ConnId,
        _r: EndpointAddress,
        why: &CloseReason,
        _keys: &[u64],
    ) {
        self.closed.lock().unwrap().push(why.clone());
    }

    fn on_data(&mut self, _b: &B, _conn: ConnId, data: &[u8]) {
        self.got.lock().unwrap().push(data.to_vec());
    }
}

/// `shm` takes copy sends of up to 4,096 bytes by injection (no
/// completion from the fabric: the key completes at once); interleaved
/// with larger sends, which take the ordinary path, every message still
/// arrives once, whole and in order, and every key completes once, in
/// order.
#[test]
fn injected_copy_sends_keep_their_order_among_ordinary_ones_on_shm() {
    const TOTAL: usize = 3_000;
    let server_lp = Running::start();
    let client_lp = Running::start();
    let server = Mixed::default();
    let sb = LibfabricBackend::new(
        &server_lp.lp,
        BackendConfig::default(),
        rdm("shm"),
        server.clone(),
    )
    .expect("server backend");
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(16 * 1024, 32))
        .expect("listening");
    let client = Mixed {
        total: TOTAL,
        ..Mixed::default()
    };
    let cb = LibfabricBackend::new(
        &client_lp.lp,
        BackendConfig::default(),
        rdm("shm"),
        client.clone(),
    )
    .expect("client backend");
    cb.open_active_endpoint(
        EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()))),
        ConnectionParams::receive(16 * 1024, 32),
    )
    .expect("connecting");
    assert!(
        wait_until(|| server.got.lock().unwrap().len() >= TOTAL
            && client.completed.lock().unwrap().len() >= TOTAL),
        "all sent and completed: {} arrived, {} completed, closed {:?} {:?}",
        server.got.lock().unwrap().len(),
        client.completed.lock().unwrap().len(),
        server.closed.lock().unwrap(),
        client.closed.lock().unwrap(),
    );
    // Nothing more comes later.
    std::thread::sleep(Duration::from_millis(100));
    let got = server.got.lock().unwrap();
    assert_eq!(got.len(), TOTAL, "each message arrives once");
    for (i, m) in got.iter().enumerate() {
        assert!(
            *m == mixed_message(i),
            "message {i} ({} bytes) arrived in order and whole",
            m.len()
        );
    }
    let completed = client.completed.lock().unwrap();
    let expected: Vec<u64> = (0..TOTAL as u64).collect();
    assert_eq!(*completed, expected, "each key completes once, in order");
    assert!(server.closed.lock().unwrap().is_empty());
    assert!(client.closed.lock().unwrap().is_empty());
}

/// A TCP relay for one connection to `target`, counting the bytes each
/// way: `[towards target, back]`. Shows what a control channel carries.
fn counting_relay(target: u16) -> (u16, Arc<[std::sync::atomic::AtomicU64; 2]>) {
    use std::sync::atomic::AtomicU64;
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let c = Arc::clone(&counts);
    std::thread::spawn(move || {
        let Ok((inbound, _)) = listener.accept() else {
            return;
        };
        let Ok(outbound) = TcpStream::connect((Ipv4Addr::LOCALHOST, target)) else {
            return;
        };
        let pipe = |mut from: TcpStream, mut to: TcpStream, i: usize, c: Arc<[AtomicU64; 2]>| {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    c[i].fetch_add(n as u64, Ordering::SeqCst);
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            })
        };
        pipe(
            inbound.try_clone().unwrap(),
            outbound.try_clone().unwrap(),
            0,
            Arc::clone(&c),
        );
        pipe(outbound, inbound, 1, c);
    });
    (port, counts)
}

/// Plays ping-pong from `on_data`: the server echoes each message, the
/// client sends the next one from the echo's `on_data` until `target`.
#[derive(Clone, Default)]
struct PingPong {
    client: bool,
    target: Arc<std::sync::atomic::AtomicUsize>,
    echoes: Arc<std::sync::atomic::AtomicUsize>,
    conn: Arc<Mutex<Option<ConnId>>>,
    closed: Arc<Mutex<Vec<CloseReason>>>,
}

impl<B: Backend + ?Sized> Handler<B> for PingPong {
    fn on_connection_established(
        &mut self,
        _b: &B,
        conn: ConnId,
        _r: EndpointAddress,
        _c: Capabilities,
    ) {
        *self.conn.lock().unwrap() = Some(conn);
    }

    fn on_connection_closed(
        &mut self,
        _b: &B,
        _conn: ConnId,
        _r: EndpointAddress,
        why: &CloseReason,
        _keys: &[u64],
    ) {
        self.closed.lock().unwrap().push(why.clone());
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        if !self.client {
            b.send_data_copy(conn, &[data], &[], 0)
                .expect("the echo has the credit the ping brought");
            return;
        }
        let n = self.echoes.fetch_add(1, Ordering::SeqCst) + 1;
        if n < self.target.load(Ordering::SeqCst) {
            b.send_data_copy(conn, &[data], &[], n as u64)
                .expect("the next ping has the credit the echo brought");
        }
    }
}

/// With one receive buffer on each side, a reply sent from `on_data`
/// carries the credit of the buffer being delivered, which is posted
/// again as soon as `on_data` returns: a ping-pong then writes nothing
/// on the control channel but the credit of its last message (a CREDIT
/// frame each way per round trip otherwise, and the next message waiting
/// for it).
fn a_reply_from_on_data_carries_the_credit_of_the_delivered_buffer(fabric: &str) {
    const SIZE: usize = 4096;
    let server_lp = Running::start();
    let client_lp = Running::start();
    let server = PingPong::default();
    let sb = rdm_backend(&server_lp, fabric, &server);
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(SIZE, 1))
        .expect("listening");
    let (relay, bytes) = counting_relay(listen.port());
    let client = PingPong {
        client: true,
        ..PingPong::default()
    };
    let cb = rdm_backend(&client_lp, fabric, &client);
    cb.open_active_endpoint(
        EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, relay))),
        ConnectionParams::receive(SIZE, 1),
    )
    .expect("connecting");
    assert!(
        wait_until(|| client.conn.lock().unwrap().is_some()),
        "{fabric}: connected"
    );
    let conn = client.conn.lock().unwrap().unwrap();
    let ping = vec![7u8; SIZE];
    let play = |rounds: usize| {
        let from = client.echoes.load(Ordering::SeqCst);
        client.target.store(from + rounds, Ordering::SeqCst);
        cb.send_data_copy(conn, &[&ping], &[], 0).expect("a ping");
        assert!(
            wait_until(|| client.echoes.load(Ordering::SeqCst) >= from + rounds),
            "{fabric}: {} of {rounds} round trips, closed {:?} {:?}",
            client.echoes.load(Ordering::SeqCst) - from,
            client.closed.lock().unwrap(),
            server.closed.lock().unwrap(),
        );
    };
    // Set-up done and the credits of the first round granted.
    play(2);
    std::thread::sleep(Duration::from_millis(100));
    let before = [
        bytes[0].load(Ordering::SeqCst),
        bytes[1].load(Ordering::SeqCst),
    ];
    play(500);
    std::thread::sleep(Duration::from_millis(100));
    let after = [
        bytes[0].load(Ordering::SeqCst),
        bytes[1].load(Ordering::SeqCst),
    ];
    // One CREDIT frame (9 bytes) goes to the server at the end: the last
    // echo's buffer, which the client answers with nothing.
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (9, 0),
        "{fabric}: control bytes written during 500 round trips (client → server, server → client)"
    );
    assert!(client.closed.lock().unwrap().is_empty());
    assert!(server.closed.lock().unwrap().is_empty());
}

#[test]
fn a_reply_from_on_data_carries_the_credit_of_the_delivered_buffer_on_shm() {
    a_reply_from_on_data_carries_the_credit_of_the_delivered_buffer("shm");
}

#[test]
fn a_reply_from_on_data_carries_the_credit_of_the_delivered_buffer_on_tcp_rxm() {
    a_reply_from_on_data_carries_the_credit_of_the_delivered_buffer("tcp;ofi_rxm");
}

/// A server outlives many client endpoints, each with a fabric address of
/// its own (as short-lived client processes have): every one of `total`
/// clients, connected, answered and closed one after another, is served.
/// `shm` holds at most 256 peers in an address vector, so a server that
/// kept the address of every peer it ever had would refuse the 257th.
fn a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once(
    fabric: &str,
    total: usize,
) {
    let server_lp = Running::start();
    let server = Recorder::new(0);
    let sb = rdm_backend(&server_lp, fabric, &server);
    let listen = sb
        .open_listen_endpoint(any_port(), ConnectionParams::receive(256, 2))
        .expect("listening");
    let client_lp = Running::start();
    let mut closes = 0;
    let fds = || std::fs::read_dir("/proc/self/fd").unwrap().count();
    let mut fds_at_start = 0;
    for i in 0..total {
        if i == 1 {
            // After a first client, so that lazily made resources exist.
            std::thread::sleep(Duration::from_millis(100));
            fds_at_start = fds();
        }
        let client = Recorder::new(1);
        client.greet_port.store(listen.port(), Ordering::SeqCst);
        let cb = LibfabricBackend::new(
            &client_lp.lp,
            BackendConfig::default(),
            rdm(fabric),
            client.clone(),
        )
        .unwrap_or_else(|e| panic!("client backend {i}: {e}"));
        // The first clients connect twice: the server takes an address it
        // let go of again.
        let rounds = if i < 3 { 2 } else { 1 };
        for round in 1..=rounds {
            let conn = cb
                .open_active_endpoint(
                    EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, listen.port()))),
                    ConnectionParams::receive(256, 2),
                )
                .expect("connecting");
            let pongs = || client.count(|s| matches!(s, Seen::Pong(c) if *c == conn));
            assert!(
                wait_until(|| pongs() == 1
                    || client.count(|s| matches!(s, Seen::Refused(..) | Seen::Closed(..)))
                        >= round),
                "{fabric}: client {i}, connection {round}: no answer; saw {:?}",
                client.seen()
            );
            assert_eq!(
                pongs(),
                1,
                "{fabric}: client {i} of {total}, connection {round}, is served; saw {:?}",
                client.seen()
            );
            cb.close_active_endpoint(conn).expect("closing");
            closes += 1;
            assert!(
                wait_until(|| server.count(|s| matches!(s, Seen::Closed(..))) == closes),
                "{fabric}: the server sees client {i}'s close {round}"
            );
        }
        drop(cb);
    }
    // What the server keeps for departed peers does not grow with them
    // (a descriptor per peer would be a connection the fabric keeps).
    let mut fds_at_end = fds();
    for _ in 0..20 {
        if fds_at_end <= fds_at_start + total / 10 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        fds_at_end = fds();
    }
    assert!(
        fds_at_end <= fds_at_start + total / 10,
        "{fabric}: descriptors after the first client {fds_at_start}, after {total}: {fds_at_end}"
    );
}

#[test]
fn a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once_on_shm() {
    a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once("shm", 300);
}

#[test]
fn a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once_on_tcp_rxm() {
    a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once(
        "tcp;ofi_rxm",
        300,
    );
}

#[test]
fn a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once_on_sockets() {
    a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once("sockets", 300);
}

/// `udp;ofi_rxd` in libfabric 1.17 keeps its per-peer protocol state by
/// address for the endpoint's life (its address removal keeps that
/// entry), so a new peer endpoint that happens to get a departed one's UDP
/// port can be left unanswered: a client among the first 300 got no
/// answer in 3 of 4 runs (clients 183, 202 and 231), with or without the
/// server removing departed addresses. Not a limit of the server.
#[test]
#[ignore = "udp;ofi_rxd 1.17 keeps the state of departed peers by UDP address; a new peer on a recycled port may go unanswered"]
fn a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once_on_udp_rxd() {
    a_server_serves_more_peer_endpoints_over_its_life_than_the_fabric_holds_at_once(
        "udp;ofi_rxd",
        300,
    );
}
