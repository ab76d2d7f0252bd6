//! What a hostile peer sends to a listener on libfabric's `tcp` provider:
//! a half-sent connection request held open, random bytes, a burst of
//! silent connections, connect-and-close churn, and, after a valid
//! request, messages that break the protocol. Meanwhile the loop keeps
//! serving its other connections (a libfabric one and a netio-tcp one on
//! the same loop), new clients are served once the handshake timeout has
//! ended the hostile connections, and afterwards the process's descriptors
//! and memory are back near where they were.
//!
//! The tests share the process's descriptor table, so they run one at a
//! time (a lock).

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnId, ConnectionParams, EndpointAddress, Provider};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};
use netio_tcp::{TcpBackend, TcpProvider};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The handshake timeout of the attacked listener.
const HANDSHAKE: Duration = Duration::from_millis(800);

fn params() -> ConnectionParams {
    ConnectionParams::receive(64, 8)
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A loop with a libfabric backend (listening, with a connection to its
/// own listener) and a netio-tcp backend (likewise).
struct Served {
    _running: Running,
    lf: LibfabricBackend,
    lf_rec: Recorder,
    lf_conn: ConnId,
    listen: EndpointAddress,
    tcp: TcpBackend,
    tcp_rec: Recorder,
    tcp_conn: ConnId,
    /// A second loop for new clients.
    clients: Running,
}

impl Served {
    fn start() -> Self {
        let running = Running::start();
        let lf_rec = Recorder::new(0);
        let tcp_rec = Recorder::new(0);
        let lf = LibfabricBackend::new(
            &running.lp,
            BackendConfig::default(),
            LibfabricConfig {
                handshake_timeout: HANDSHAKE,
                max_pending_handshakes: 64,
                ..LibfabricConfig::provider("tcp")
            },
            lf_rec.clone(),
        )
        .expect("a libfabric backend");
        let tcp = TcpProvider::create(&running.lp, BackendConfig::default(), tcp_rec.clone())
            .expect("a TCP backend");
        let any: EndpointAddress = "127.0.0.1:0".parse().unwrap();
        let listen = lf.open_listen_endpoint(any, params()).unwrap();
        let tcp_listen = tcp.open_listen_endpoint(any, params()).unwrap();
        let lf_conn = lf.open_active_endpoint(listen, params()).unwrap();
        let tcp_conn = tcp.open_active_endpoint(tcp_listen, params()).unwrap();
        assert!(
            wait_until(|| lf_rec.count(|s| matches!(s, Seen::Established(..))) == 2
                && tcp_rec.count(|s| matches!(s, Seen::Established(..))) == 2),
            "both backends' connections established: {:?} {:?}",
            lf_rec.seen(),
            tcp_rec.seen()
        );
        Self {
            _running: running,
            lf,
            lf_rec,
            lf_conn,
            listen,
            tcp,
            tcp_rec,
            tcp_conn,
            clients: Running::start(),
        }
    }

    /// Both established connections answer a ping within `within`.
    fn answers(&self, within: Duration) -> Result<(), String> {
        let lf_before = self.lf_rec.count(|s| *s == Seen::Pong(self.lf_conn));
        let tcp_before = self.tcp_rec.count(|s| *s == Seen::Pong(self.tcp_conn));
        self.lf
            .send_data_copy(self.lf_conn, &[b"ping"], &[], 1)
            .map_err(|e| format!("libfabric ping: {e}"))?;
        self.tcp
            .send_data_copy(self.tcp_conn, &[b"ping"], &[], 1)
            .map_err(|e| format!("tcp ping: {e}"))?;
        let end = Instant::now() + within;
        loop {
            let lf = self.lf_rec.count(|s| *s == Seen::Pong(self.lf_conn)) > lf_before;
            let tcp = self.tcp_rec.count(|s| *s == Seen::Pong(self.tcp_conn)) > tcp_before;
            if lf && tcp {
                return Ok(());
            }
            if Instant::now() > end {
                return Err(format!(
                    "no answer within {within:?}: libfabric pong {lf}, netio-tcp pong {tcp}"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A new client (its own backend and loop) connects and is answered
    /// within `within`.
    fn new_client_served(&self, within: Duration) -> Result<Duration, String> {
        let rec = Recorder::new(1);
        rec.greet_port.store(self.listen.port(), Ordering::SeqCst);
        let b = LibfabricBackend::new(
            &self.clients.lp,
            BackendConfig::default(),
            LibfabricConfig::provider("tcp"),
            rec.clone(),
        )
        .map_err(|e| e.to_string())?;
        let start = Instant::now();
        let conn = b
            .open_active_endpoint(self.listen, params())
            .map_err(|e| e.to_string())?;
        while start.elapsed() < within {
            if rec.count(|s| *s == Seen::Pong(conn)) == 1 {
                let took = start.elapsed();
                let _ = b.close_active_endpoint(conn);
                return Ok(took);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Err(format!(
            "a new client was not served within {within:?}: {:?}",
            rec.seen()
        ))
    }
}

fn lf_addr(a: EndpointAddress) -> SocketAddr {
    SocketAddr::new(a.ip(), a.port())
}

/// A connection-request header of libfabric 1.17's `tcp` (version 3, type
/// connect-request) announcing `data` bytes of connection data.
fn request_header(data: u16) -> Vec<u8> {
    let mut h = vec![3u8, 0];
    h.extend_from_slice(&data.to_be_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&[0u8; 16]);
    h.extend_from_slice(&1u64.to_le_bytes());
    assert_eq!(h.len(), 32);
    h
}

/// A connection to `listen` holding a request header that announces 256
/// bytes of connection data, none of which follow.
fn half_sent_request(listen: EndpointAddress) -> TcpStream {
    let mut s = TcpStream::connect(lf_addr(listen)).unwrap();
    s.write_all(&request_header(256)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    s
}

/// `true` once the peer ended the connection (EOF or reset) within
/// `within`.
fn ended_by_listener(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    let end = Instant::now() + within;
    while Instant::now() < end {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return false,
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn a_half_sent_connection_request_held_open_stops_neither_the_loop_nor_the_listener() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::start();
    let mut hostile = half_sent_request(served.listen);
    // The loop's other connections are served while the request is held.
    for _ in 0..5 {
        served
            .answers(Duration::from_millis(500))
            .expect("served while a request is held half-sent");
    }
    // A new client is served once the handshake timeout ended the hostile
    // connection.
    let took = served
        .new_client_served(HANDSHAKE * 6)
        .expect("a new client served after the handshake timeout");
    assert!(
        ended_by_listener(&mut hostile, Duration::from_secs(10)),
        "the half-sent request's connection was ended"
    );
    assert!(
        served.lf.refused_connections() >= 1,
        "counted as refused: {}",
        served.lf.refused_connections()
    );
    eprintln!("new client served after {took:?}");
}

#[test]
fn random_bytes_to_a_listener_are_refused_and_others_served() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::start();
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut streams = Vec::new();
    for n in [1usize, 7, 31, 32, 33, 300, 4096] {
        let mut s = TcpStream::connect(lf_addr(served.listen)).unwrap();
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = s.write_all(&bytes);
        streams.push(s);
    }
    served
        .answers(Duration::from_secs(2))
        .expect("served while random bytes arrive");
    served
        .new_client_served(HANDSHAKE * 6)
        .expect("a new client served");
    for (i, s) in streams.iter_mut().enumerate() {
        assert!(
            ended_by_listener(s, HANDSHAKE * 4),
            "random-bytes connection {i} was ended"
        );
    }
}

#[test]
fn a_burst_of_silent_connections_is_shut_down_and_others_served() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::start();
    std::thread::sleep(Duration::from_millis(200));
    let fds_before = open_fds();
    let rss_before = rss_kib();
    let mut silent: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(lf_addr(served.listen)).unwrap())
        .collect();
    served
        .answers(Duration::from_secs(2))
        .expect("served during the burst");
    served
        .new_client_served(HANDSHAKE * 6)
        .expect("a new client served during the burst");
    let ended = silent
        .iter_mut()
        .map(|s| ended_by_listener(s, HANDSHAKE * 4))
        .filter(|ended| *ended)
        .count();
    assert_eq!(ended, 200, "every silent connection was ended");
    // The 200 silent ones: beyond the admission limit (64) at once, the
    // rest at the handshake timeout. (Now and then libfabric ends one
    // itself before the guard does.)
    assert!(
        served.lf.refused_connections() >= 190,
        "counted as refused: {}",
        served.lf.refused_connections()
    );
    drop(silent);
    assert!(
        wait_until(|| open_fds() <= fds_before + 4),
        "descriptors back: {} before, {} after",
        fds_before,
        open_fds()
    );
    let grown = rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "resident memory grew by {grown} KiB");
    served
        .answers(Duration::from_secs(2))
        .expect("served after");
}

#[test]
fn connect_and_close_churn_leaves_no_descriptor_behind() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::start();
    std::thread::sleep(Duration::from_millis(200));
    let fds_before = open_fds();
    let rss_before = rss_kib();
    for i in 0..500 {
        let mut s = TcpStream::connect(lf_addr(served.listen)).unwrap();
        // Every third one closes after half a request header.
        if i % 3 == 0 {
            let _ = s.write_all(&request_header(64)[..16]);
        }
        drop(s);
        if i % 100 == 0 {
            served
                .answers(Duration::from_secs(2))
                .expect("served during churn");
        }
    }
    served
        .new_client_served(HANDSHAKE * 6)
        .expect("a new client served after the churn");
    assert!(
        wait_until(|| open_fds() <= fds_before + 4),
        "descriptors back: {} before, {} after",
        fds_before,
        open_fds()
    );
    let grown = rss_kib().saturating_sub(rss_before);
    assert!(grown < 32 * 1024, "resident memory grew by {grown} KiB");
}

#[test]
fn a_listener_closed_while_a_request_is_held_half_sent_closes_promptly() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let served = Served::start();
    let mut hostile = half_sent_request(served.listen);
    let start = Instant::now();
    served.lf.close_listen_endpoint(served.listen).unwrap();
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "closing the listener took {took:?}"
    );
    assert!(
        ended_by_listener(&mut hostile, Duration::from_secs(2)),
        "the held connection was ended by the close"
    );
    // The passive endpoint is closed: its port can be listened on again.
    let again = served
        .lf
        .open_listen_endpoint(served.listen, params())
        .expect("the port is free again");
    assert_eq!(again, served.listen);
    // The listener's own connections closed with it; the netio-tcp
    // backend on the loop is served.
    let before = served.tcp_rec.count(|s| *s == Seen::Pong(served.tcp_conn));
    served
        .tcp
        .send_data_copy(served.tcp_conn, &[b"ping"], &[], 1)
        .unwrap();
    assert!(wait_until(|| served
        .tcp_rec
        .count(|s| *s == Seen::Pong(served.tcp_conn))
        > before));
}

/// libfabric 1.17's `tcp` provider crashes (SIGSEGV in its completion
/// queue progress) when, after a valid connection request, the peer sends
/// one unsolicited message header of type ACK. The provider cannot prevent
/// it: the bytes are read and acted on inside libfabric. Run by hand to
/// check a newer libfabric: it kills the test process on 1.17.
#[test]
#[ignore = "libfabric 1.17 tcp crashes (SIGSEGV) on an unsolicited ACK header after a valid \
            connection request: 32-byte request header (version 3, type 0, no data), then \
            after the response 16 bytes: op 0 (msg), flags 0, op_data 2 (ACK), hdr_size 16, \
            size 16"]
fn an_unsolicited_ack_after_a_valid_request() {
    let served = Served::start();
    let mut s = TcpStream::connect(lf_addr(served.listen)).unwrap();
    s.write_all(&request_header(0)).unwrap();
    let mut resp = [0u8; 32];
    s.read_exact(&mut resp).unwrap();
    // base header: version 3, op msg, flags, op_data ACK, rma_iov_cnt,
    // hdr_size, id, size.
    let mut ack = vec![3u8, 0, 0, 0, 2, 0, 16, 0];
    ack.extend_from_slice(&16u64.to_le_bytes());
    s.write_all(&ack).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    served
        .answers(Duration::from_secs(2))
        .expect("served after");
}

/// libfabric 1.17's `sockets` provider crashes the process (SIGSEGV, in
/// one of its own threads) when peers connect to a listener, send a few
/// bytes that are not a connection request (1 to 200 bytes of 0x00, 0x5a,
/// 0xff or 0x01 here) and close. Run by hand to check a newer libfabric:
/// it kills the test process on 1.17.
#[test]
#[ignore = "libfabric 1.17 sockets crashes the process (SIGSEGV in a libfabric thread) when \
            peers send a listener short non-request bytes and close"]
fn short_garbage_and_a_close_to_a_sockets_listener() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let b = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("sockets"),
        rec.clone(),
    )
    .unwrap();
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params())
        .unwrap();
    for fill in [0u8, 0x5a, 0xff, 1] {
        for n in [1usize, 10, 40, 200] {
            let mut s = TcpStream::connect(lf_addr(listen)).unwrap();
            let _ = s.write_all(&vec![fill; n]);
            drop(s);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let conn = b.open_active_endpoint(listen, params()).unwrap();
    assert!(wait_until(|| rec
        .seen()
        .iter()
        .any(|e| matches!(e, Seen::Established(c, _) if *c == conn))));
}
