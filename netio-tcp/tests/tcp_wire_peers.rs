//! The backend against hand-written peers on plain std sockets: a peer that
//! follows docs/wire-format.md byte by byte interoperates; foreign,
//! mismatched, silent and hostile peers are turned away without a panic and
//! without unbounded memory.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener as StdListener, TcpStream as StdStream};
use std::time::Duration;

use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, RefuseReason,
};
use netio_tcp::wire::{CloseCode, CloseFrame, DataPrefix, Handshake};
use netio_tcp::TcpConfig;

fn raw_connect(addr: EndpointAddress) -> StdStream {
    let s = StdStream::connect(addr.socket_addr()).expect("raw connect");
    s.set_read_timeout(Some(common::DEADLINE)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

fn read_n(s: &mut StdStream, n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).expect("read");
    b
}

/// Reads until end of stream (or a reset); returns what arrived.
fn read_to_end(s: &mut StdStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    for _ in 0..100_000 {
        match s.read(&mut buf) {
            Ok(0) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return out,
            Err(e) => panic!("read: {e}"),
        }
    }
    panic!("no end of stream");
}

/// Reads until end of stream or an error; returns what arrived and how
/// the stream ended (`Ok` for an orderly end of stream).
fn read_until_end(s: &mut StdStream) -> (Vec<u8>, std::io::Result<()>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return (got, Err(e)),
        }
    }
}

fn listening_side(
    rt: &Running,
    tcp: TcpConfig,
    params: ConnectionParams,
) -> (Side, EndpointAddress) {
    let side = Side::with(&rt.lp, BackendConfig::default(), tcp, Recorder::default());
    let addr = side
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params)
        .unwrap();
    (side, addr)
}

#[test]
fn a_peer_written_from_the_document_interoperates() {
    let rt = Running::start();
    let (server, addr) = listening_side(
        &rt,
        TcpConfig::default(),
        ConnectionParams::receive(1024, 4),
    );
    let mut raw = raw_connect(addr);
    // The backend's handshake: version 1, max_message 1024.
    assert_eq!(
        read_n(&mut raw, 16),
        [0x4e, 0x54, 0x49, 0x4f, 1, 0, 16, 0, 0, 0, 0, 0, 0, 4, 0, 0]
    );
    // Ours, then one message with header "hdr" and payload "hello".
    raw.write_all(&[0x4e, 0x54, 0x49, 0x4f, 1, 0, 16, 0, 0, 0, 0, 0, 0, 0, 1, 0])
        .unwrap();
    raw.write_all(&[
        1, 0, 0, 0, 8, 0, 0, 0, b'h', b'd', b'r', b'h', b'e', b'l', b'l', b'o',
    ])
    .unwrap();
    assert!(wait_until(|| server.data() == vec![b"hdrhello".to_vec()]));
    let peer = server.first_remote().unwrap();
    assert_eq!(peer.socket_addr(), raw.local_addr().unwrap());

    server
        .b
        .send_data_copy(server.conn(peer), &[b"hello"], b"hdr", 1)
        .unwrap();
    assert_eq!(
        read_n(&mut raw, 16),
        [1, 0, 0, 0, 8, 0, 0, 0, b'h', b'd', b'r', b'h', b'e', b'l', b'l', b'o']
    );
    // An orderly close: a CLOSE frame (code 0), then end of stream.
    server.b.close_active_endpoint(server.conn(peer)).unwrap();
    let rest = read_to_end(&mut raw);
    assert!(rest.len() >= 10, "{rest:?}");
    assert_eq!(&rest[..4], &[2, 0, 0, 0]);
    let body_len = u32::from_le_bytes(rest[4..8].try_into().unwrap()) as usize;
    assert_eq!(rest.len(), 8 + body_len);
    assert_eq!(u16::from_le_bytes([rest[8], rest[9]]), 0);
    assert!(wait_until(
        || server.has(|e| matches!(e, Ev::Closed(_, CloseReason::Local, _)))
    ));
}

#[test]
fn a_close_frame_from_the_peer_is_peer_closed() {
    let rt = Running::start();
    let (server, addr) =
        listening_side(&rt, TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    let mut out = Handshake::new(0).encode().to_vec();
    out.extend_from_slice(CloseFrame::new(CloseCode::Normal, "bye").as_bytes());
    raw.write_all(&out).unwrap();
    assert!(wait_until(|| server.has(|e| matches!(
        e,
        Ev::Closed(_, CloseReason::PeerClosed, _)
    ))));
    assert!(server.has(|e| matches!(e, Ev::Established(..))));
}

#[test]
fn a_foreign_client_is_turned_away_silently() {
    let rt = Running::start();
    let (server, addr) =
        listening_side(&rt, TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = read_to_end(&mut raw);
    // At most the backend's own handshake, then the connection is gone.
    assert!(got.len() <= 16);
    assert!(server.events().is_empty(), "{:?}", server.events());
}

/// A peer of another version that sends more than its handshake: the
/// backend rejects it, but still lets it read the backend's handshake (to
/// see which version this side speaks) followed by an orderly end of
/// stream, not a reset that a stack may use to discard the handshake.
#[test]
fn a_rejected_peer_reads_the_handshake_then_an_orderly_end_of_stream() {
    let rt = Running::start();
    let (server, addr) =
        listening_side(&rt, TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    // Version 2, and more bytes behind it than the backend reads before it
    // rejects: closing with them unread would be a reset.
    let mut bytes = vec![0x4e, 0x54, 0x49, 0x4f, 2, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    bytes.extend(std::iter::repeat_n(0xab, 32 * 1024));
    raw.write_all(&bytes).unwrap();
    let (got, end) = read_until_end(&mut raw);
    assert_eq!(got.len(), 16, "the backend's handshake, whole: {got:?}");
    assert_eq!(&got[..4], b"NTIO");
    assert_eq!(&got[4..6], &[1, 0], "it says which version it speaks");
    end.expect("an orderly end of stream after the handshake, not a reset");
    assert!(server.events().is_empty(), "{:?}", server.events());
}

#[test]
fn a_server_of_another_version_is_refused_with_the_reason() {
    let rt = Running::start();
    let client = Side::new(&rt.lp, BackendConfig::default());
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = EndpointAddress::from(listener.local_addr().unwrap());
    client
        .b
        .open_active_endpoint(addr, ConnectionParams::receive(64, 1))
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.write_all(&[0x4e, 0x54, 0x49, 0x4f, 2, 0, 16, 0]).unwrap();
    assert!(wait_until(|| client.has(|e| matches!(
        e,
        Ev::Refused(r, RefuseReason::Handshake(why)) if *r == addr && why.contains("version 2")
    ))));
    assert!(!client.has(|e| matches!(e, Ev::Established(..))));
}

/// A connection its initiator cancels once its handshake went out: the
/// listener may have accepted it already (and reported it established), so
/// the initiator ends it in the orderly way, its handshake followed by a
/// CLOSE frame and an end of stream, and keeps reading until the listener's
/// end of stream (closing with the listener's handshake unread would be a
/// reset). A netio-tcp listener then reports `PeerClosed`, not a reset.
#[test]
fn cancelling_a_connection_whose_handshake_went_out_ends_it_with_a_close_frame() {
    let rt = Running::start();
    let client = Side::new(&rt.lp, BackendConfig::default());
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = EndpointAddress::from(listener.local_addr().unwrap());
    let conn = client
        .b
        .open_active_endpoint(addr, ConnectionParams::receive(64, 1))
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(common::DEADLINE)).unwrap();
    let hs_len = Handshake::new(0).encode().len();
    let hs = read_n(&mut s, hs_len);
    assert_eq!(&hs[..4], b"NTIO", "the initiator's handshake");
    client.b.close_active_endpoint(conn).unwrap();
    assert!(wait_until(|| client.has(|e| matches!(
        e,
        Ev::Refused(r, RefuseReason::Cancelled) if *r == addr
    ))));
    // The listener's handshake, which the initiator must drain.
    s.write_all(&Handshake::new(64).encode()).unwrap();
    let (got, end) = read_until_end(&mut s);
    end.expect("an orderly end of stream, not a reset");
    let close = CloseFrame::new(CloseCode::Normal, "cancelled while opening");
    assert_eq!(
        got,
        close.as_bytes(),
        "after its handshake the initiator sends one CLOSE frame (code 0), then nothing"
    );
    assert!(!client.has(|e| matches!(e, Ev::Established(..))));
}

/// Cancelled before its TCP connect completed, a connection has sent
/// nothing, and the listener reads an end of stream with no byte before it.
#[test]
fn cancelling_a_connection_before_its_handshake_went_out_sends_nothing() {
    let rt = Running::start();
    let client = Side::new(&rt.lp, BackendConfig::default());
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = EndpointAddress::from(listener.local_addr().unwrap());
    // Cancelled from the loop thread in the call that opened it: the loop
    // has not seen the connect complete, so no handshake was written.
    let (tx, rx) = std::sync::mpsc::channel();
    let b = client.b.clone();
    rt.lp.post(move || {
        let conn = b
            .open_active_endpoint(addr, ConnectionParams::receive(64, 1))
            .unwrap();
        b.close_active_endpoint(conn).unwrap();
        tx.send(()).unwrap();
    });
    rx.recv_timeout(common::DEADLINE)
        .expect("the loop ran the post");
    assert!(wait_until(|| client.has(|e| matches!(
        e,
        Ev::Refused(r, RefuseReason::Cancelled) if *r == addr
    ))));
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(common::DEADLINE)).unwrap();
    let got = read_to_end(&mut s);
    assert!(got.is_empty(), "nothing before the end of stream: {got:?}");
}

#[test]
fn an_oversized_length_closes_before_any_body_is_read() {
    let rt = Running::start();
    let (server, addr) = listening_side(
        &rt,
        TcpConfig::default(),
        ConnectionParams::receive(4096, 2),
    );
    let mut raw = raw_connect(addr);
    let mut out = Handshake::new(0).encode().to_vec();
    out.extend_from_slice(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    raw.write_all(&out).unwrap();
    let too_large = CloseReason::MessageTooLarge {
        size: u64::from(u32::MAX),
        limit: 4096,
    };
    assert!(wait_until(|| server.has(
        |e| matches!(e, Ev::Closed(_, why, _) if *why == too_large)
    )));
    let got = read_to_end(&mut raw);
    // The backend's handshake, then a CLOSE frame with code 1.
    assert_eq!(&got[16..20], &[2, 0, 0, 0]);
    assert_eq!(u16::from_le_bytes([got[24], got[25]]), 1);
}

#[test]
fn an_unknown_frame_type_is_a_protocol_error() {
    let rt = Running::start();
    let (server, addr) =
        listening_side(&rt, TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    let mut out = Handshake::new(0).encode().to_vec();
    out.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
    raw.write_all(&out).unwrap();
    assert!(wait_until(|| server.has(
        |e| matches!(e, Ev::Closed(_, CloseReason::Protocol(why), _) if why.contains("frame type"))
    )));
    let got = read_to_end(&mut raw);
    assert_eq!(u16::from_le_bytes([got[24], got[25]]), 2);
}

#[test]
fn a_peer_that_vanishes_is_a_reset() {
    let rt = Running::start();
    let (server, addr) =
        listening_side(&rt, TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    let mut out = Handshake::new(0).encode().to_vec();
    // A frame cut short, then end of stream.
    out.extend_from_slice(&[1, 0, 0, 0, 10, 0, 0, 0, 1, 2]);
    raw.write_all(&out).unwrap();
    assert!(wait_until(
        || server.has(|e| matches!(e, Ev::Established(..)))
    ));
    drop(raw);
    assert!(wait_until(
        || server.has(|e| matches!(e, Ev::Closed(_, CloseReason::Reset, _)))
    ));
    assert!(server.data().is_empty());
}

#[test]
fn silent_peers_are_given_up_after_the_handshake_timeout() {
    let rt = Running::start();
    let tcp = TcpConfig {
        handshake_timeout: Duration::from_millis(200),
        ..TcpConfig::default()
    };
    // A client that never sends its handshake.
    let (server, addr) = listening_side(&rt, tcp.clone(), ConnectionParams::receive(64, 1));
    let mut raw = raw_connect(addr);
    let got = read_to_end(&mut raw);
    assert_eq!(got.len(), 16);
    assert!(server.events().is_empty());

    // A server that accepts but never answers.
    let client = Side::with(&rt.lp, BackendConfig::default(), tcp, Recorder::default());
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    let target = EndpointAddress::from(listener.local_addr().unwrap());
    client
        .b
        .open_active_endpoint(target, ConnectionParams::receive(64, 1))
        .unwrap();
    let (_held, _) = listener.accept().unwrap();
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Refused(r, RefuseReason::Handshake(_)) if *r == target)
    )));
}

#[test]
fn random_bytes_after_the_handshake_never_break_the_backend() {
    let rt = Running::start();
    let (server, addr) = listening_side(
        &rt,
        TcpConfig {
            read_buffer_size: 1024,
            ..TcpConfig::default()
        },
        ConnectionParams::receive(4096, 2),
    );
    // A small deterministic generator (xorshift).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..20 {
        let mut raw = raw_connect(addr);
        let mut out = Handshake::new(0).encode().to_vec();
        // Some valid messages first, then noise.
        for i in 0..(next() % 5) {
            let len = (next() % 5000) as usize;
            out.extend_from_slice(DataPrefix::new(&[], len).unwrap().as_bytes());
            out.extend((0..len).map(|j| (i as usize + j) as u8));
        }
        for _ in 0..(next() % 3000) {
            out.push(next() as u8);
        }
        // The backend may close while we write: ignore write errors.
        let _ = raw.write_all(&out);
        drop(raw);
        assert!(
            wait_until(|| server.count(|e| matches!(e, Ev::Closed(..))) == round + 1),
            "round {round}: {:?}",
            server.events()
        );
    }
    assert!(server.data().iter().all(|d| d.len() < 5000));
}
