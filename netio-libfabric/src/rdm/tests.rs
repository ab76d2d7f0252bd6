//! The connection manager's answer to completions no fabric here produces
//! on demand: a receive that ends with an error.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler,
};

use super::{RdmInner, PROBE_OWNER};
use crate::backend::{Kind, LibfabricBackend};
use crate::config::{EndpointType, LibfabricConfig};
use crate::events::lock;
use crate::rdm_ffi::RdmCompletion;

/// What a handler saw: connections established, closed (with the reason),
/// and the bytes of each message.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Seen>>>);

#[derive(Clone, Debug, PartialEq)]
enum Seen {
    Established(ConnId),
    Closed(ConnId, CloseReason),
    Data(ConnId, Vec<u8>),
}

impl Log {
    fn seen(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn wait_for(&self, what: &str, f: impl Fn(&[Seen]) -> bool) {
        let start = Instant::now();
        while !f(&self.seen()) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "waited 10 s for {what}; seen: {:?}",
                self.seen()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Handler<LibfabricBackend> for Log {
    fn on_connection_established(
        &mut self,
        _: &LibfabricBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.0.lock().unwrap().push(Seen::Established(conn));
    }

    fn on_connection_closed(
        &mut self,
        _: &LibfabricBackend,
        conn: ConnId,
        _: EndpointAddress,
        reason: &CloseReason,
        _: &[u64],
    ) {
        self.0
            .lock()
            .unwrap()
            .push(Seen::Closed(conn, reason.clone()));
    }

    fn on_data(&mut self, _: &LibfabricBackend, conn: ConnId, data: &[u8]) {
        self.0.lock().unwrap().push(Seen::Data(conn, data.to_vec()));
    }
}

/// A loop on a thread of its own, stopped when dropped.
struct Running {
    lp: MioLoop,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    fn start() -> Self {
        let lp = MioLoop::new().expect("creating a loop");
        let runner = lp.clone();
        let thread = Some(std::thread::spawn(move || runner.run(|| {})));
        Self { lp, thread }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.lp.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn shm() -> LibfabricConfig {
    LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..LibfabricConfig::provider("shm")
    }
}

/// A backend on `lp` with settings `lf` and handler `log`, listening on
/// 127.0.0.1 (a port of the system's choice) with 2 receive buffers of 64
/// bytes per connection; returns it with the listener's port.
fn listening(lp: &Running, lf: LibfabricConfig, log: Log) -> (LibfabricBackend, u16) {
    let backend =
        LibfabricBackend::new(&lp.lp, BackendConfig::default(), lf, log).expect("server backend");
    let listen = backend
        .open_listen_endpoint(
            EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            ConnectionParams::receive(64, 2),
        )
        .expect("listening");
    (backend, listen.port())
}

/// The bytes of a HELLO for `fabric` announcing fabric address `addr`
/// (connection tag 1, 2 buffers of 64 bytes).
fn hello_bytes(fabric: &str, addr: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    super::proto::Frame::Hello(super::proto::Hello {
        tag: 1,
        buf_size: 64,
        credits: 2,
        fabric: fabric.into(),
        addr,
    })
    .encode(&mut out);
    out
}

/// The first control frame a listener answers on `s` with, or `None` if
/// the stream ends (or stays silent for 10 s) before one.
fn answer(s: &mut std::net::TcpStream) -> Option<super::proto::Frame> {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut decoder = super::proto::Decoder::new();
    let mut buf = [0u8; 256];
    loop {
        match decoder.next() {
            Ok(Some(f)) => return Some(f),
            Ok(None) => {}
            Err(e) => panic!("a malformed answer: {e}"),
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => decoder.push(&buf[..n]),
        }
    }
}

fn rdm(b: &LibfabricBackend) -> Arc<RdmInner> {
    match &b.kind {
        Kind::Rdm(inner) => Arc::clone(inner),
        Kind::Msg(_) => panic!("a connected backend"),
    }
}

/// Hands `completion` to `backend`'s connection manager on its loop
/// thread, as if its completion queue had returned it.
fn complete(lp: &MioLoop, backend: &LibfabricBackend, completion: RdmCompletion) {
    let inner = rdm(backend);
    lp.post(move || {
        let mut st = lock(&inner.state);
        let now = inner.lp.now();
        inner.handle_completions(&mut st, &mut vec![completion], now);
        inner.post_dispatch(&mut st);
    });
}

/// [`complete`] with the end of a receive of `owner`'s (buffer 0) with
/// error `errno`.
fn recv_ended(lp: &MioLoop, backend: &LibfabricBackend, owner: u64, errno: i32) {
    let completion = RdmCompletion::RecvEnded {
        owner,
        index: 0,
        errno,
    };
    complete(lp, backend, completion);
}

/// A server and a client backend on `shm`, connected; returns them with
/// their logs and the connection ids (server side, client side).
#[allow(clippy::type_complexity)]
fn pair(
    server_lp: &Running,
    client_lp: &Running,
) -> (LibfabricBackend, Log, ConnId, LibfabricBackend, Log, ConnId) {
    let (server_log, client_log) = (Log::default(), Log::default());
    let (server, port) = listening(server_lp, shm(), server_log.clone());
    let client = LibfabricBackend::new(
        &client_lp.lp,
        BackendConfig::default(),
        shm(),
        client_log.clone(),
    )
    .expect("client backend");
    client
        .open_active_endpoint(
            EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
            ConnectionParams::receive(64, 2),
        )
        .expect("connecting");
    let established = |log: &Log| {
        log.wait_for("the connection", |s| {
            s.iter().any(|e| matches!(e, Seen::Established(_)))
        });
        log.seen()
            .iter()
            .find_map(|e| match e {
                Seen::Established(c) => Some(*c),
                _ => None,
            })
            .expect("established")
    };
    let (s, c) = (established(&server_log), established(&client_log));
    (server, server_log, s, client, client_log, c)
}

/// The connection tag `conn` of `backend` posts its receives under.
fn tag_of(backend: &LibfabricBackend, conn: ConnId) -> u64 {
    let inner = rdm(backend);
    let st = lock(&inner.state);
    u64::from(st.conns.get(conn).expect("the connection").tag)
}

/// A receive of an established connection that ends with an error (not a
/// cancel) ends the connection with a reason naming the error, on both
/// sides: the buffer is gone, and with it maybe a message the peer sent.
#[test]
fn a_receive_that_fails_on_the_fabric_closes_its_connection_with_the_error() {
    let (server_lp, client_lp) = (Running::start(), Running::start());
    let (server, server_log, s, client, client_log, c) = pair(&server_lp, &client_lp);
    let owner = tag_of(&server, s);
    recv_ended(&server_lp.lp, &server, owner, netio_libfabric_sys::FI_EIO);
    server_log.wait_for("the server's close", |seen| {
        seen.iter().any(|e| matches!(e, Seen::Closed(..)))
    });
    let reason = server_log.seen().into_iter().find_map(|e| match e {
        Seen::Closed(id, r) if id == s => Some(r),
        _ => None,
    });
    assert!(
        matches!(&reason, Some(CloseReason::Other(t)) if t.contains("a receive failed")),
        "the server closed with a reason naming the failed receive: {reason:?}"
    );
    client_log.wait_for("the client's close", |seen| {
        seen.iter()
            .any(|e| matches!(e, Seen::Closed(id, _) if *id == c))
    });
    drop((server, client));
}

/// Receives the backend cancelled itself end with `FI_ECANCELED`: such an
/// end, or an error on a set-up probe's buffer once the connection is
/// established, leaves the connection as it was; messages still flow.
#[test]
fn a_cancelled_receive_leaves_its_connection_open() {
    let (server_lp, client_lp) = (Running::start(), Running::start());
    let (server, server_log, s, client, client_log, c) = pair(&server_lp, &client_lp);
    let owner = tag_of(&server, s);
    for (owner, errno) in [
        (owner, netio_libfabric_sys::FI_ECANCELED),
        (PROBE_OWNER | owner, netio_libfabric_sys::FI_EIO),
    ] {
        recv_ended(&server_lp.lp, &server, owner, errno);
    }
    client
        .send_data_copy(c, &[b"still here"], &[], 1)
        .expect("sending");
    server_log.wait_for("the message", |seen| {
        seen.iter()
            .any(|e| matches!(e, Seen::Data(id, d) if *id == s && d == b"still here"))
    });
    assert!(
        !server_log
            .seen()
            .iter()
            .chain(client_log.seen().iter())
            .any(|e| matches!(e, Seen::Closed(..))),
        "no side closed: {:?} / {:?}",
        server_log.seen(),
        client_log.seen()
    );
    drop((server, client));
}

/// A HELLO whose fabric address is shorter than the fabric's addresses
/// (one byte, or sixteen bytes of no known family and with no NUL for
/// `shm`'s names), from a peer that speaks the control channel: the
/// listener refuses it, and a real client connects afterwards and is
/// served. On `tcp;ofi_rxm` one such address, handed to libfabric 1.17's
/// address vector, made every later insert fail: no client could connect
/// again (`rdm_ffi::check_peer_addr`).
fn short_fabric_addresses_are_answered_and_others_served(lf: LibfabricConfig) {
    use std::io::Write;
    let (server_lp, client_lp) = (Running::start(), Running::start());
    let server_log = Log::default();
    let (server, port) = listening(&server_lp, lf.clone(), server_log.clone());
    let to = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut peers = Vec::new();
    for addr in [vec![b'x'], vec![0xffu8; 16]] {
        let mut s = std::net::TcpStream::connect(to).expect("connecting");
        s.write_all(&hello_bytes(&lf.provider, addr))
            .expect("writing the HELLO");
        peers.push(s);
    }
    for s in &mut peers {
        // The address is unlike the listener's own.
        let answer = answer(s);
        assert!(
            matches!(&answer, Some(super::proto::Frame::Refuse { .. })),
            "{}: the listener refuses a short address: {answer:?}",
            lf.provider
        );
    }
    let client_log = Log::default();
    let client = LibfabricBackend::new(
        &client_lp.lp,
        BackendConfig::default(),
        lf.clone(),
        client_log.clone(),
    )
    .expect("client backend");
    let c = client
        .open_active_endpoint(EndpointAddress::from(to), ConnectionParams::receive(64, 2))
        .expect("connecting");
    client_log.wait_for("the real client's connection", |s| {
        s.contains(&Seen::Established(c))
    });
    client
        .send_data_copy(c, &[b"served"], &[], 1)
        .expect("sending");
    server_log.wait_for("the real client's message", |seen| {
        seen.iter()
            .any(|e| matches!(e, Seen::Data(_, d) if d == b"served"))
    });
    drop((peers, client, server));
}

#[test]
fn short_fabric_addresses_are_answered_and_others_served_on_shm() {
    short_fabric_addresses_are_answered_and_others_served(shm());
}

#[test]
fn short_fabric_addresses_are_answered_and_others_served_on_tcp_rxm() {
    short_fabric_addresses_are_answered_and_others_served(LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..LibfabricConfig::provider("tcp;ofi_rxm")
    });
}

#[test]
fn short_fabric_addresses_are_answered_and_others_served_on_udp_rxd() {
    short_fabric_addresses_are_answered_and_others_served(LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..LibfabricConfig::provider("udp;ofi_rxd")
    });
}

#[test]
fn short_fabric_addresses_are_answered_and_others_served_on_sockets() {
    short_fabric_addresses_are_answered_and_others_served(LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..LibfabricConfig::provider("sockets")
    });
}

/// A HELLO of another protocol version is answered with a REFUSE that
/// names the version (the wire format's promise to a newer or older
/// peer), and the listener serves on.
#[test]
fn a_hello_of_another_protocol_version_is_refused_with_reason_version() {
    use std::io::Write;
    let server_lp = Running::start();
    let (server, port) = listening(&server_lp, shm(), Log::default());
    let mut out = hello_bytes("shm", b"fi_shm_peer\0".to_vec());
    // The version follows the 4-byte length, the type and the magic.
    assert_eq!(&out[5..9], b"NRDM");
    out[9] = out[9].wrapping_add(1);
    let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connecting");
    s.write_all(&out).expect("writing the HELLO");
    let answer = answer(&mut s);
    match answer {
        Some(super::proto::Frame::Refuse { reason, text }) => {
            assert_eq!(reason, super::proto::RefuseCode::Version, "{text}");
            assert!(text.contains("version"), "{text}");
        }
        other => panic!("expected a REFUSE (version), got {other:?}"),
    }
    assert_eq!(server.refused_connections(), 1);
}
