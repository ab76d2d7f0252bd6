//! The backend against hostile and faulty peers on plain std sockets
//! (127.0.0.1 only): each case ends with a clear error or close reason at
//! the handler (or, for a peer that never completed a handshake on the
//! accepting side, with nothing reported, as the contract says), no panic,
//! bounded memory, every accepted send ended exactly once (completed or
//! cancelled), and a second, well-behaved connection on the same backend
//! that still exchanges messages afterwards.

mod common;

use std::io::Write;
use std::net::{Shutdown, TcpListener as StdListener, TcpStream as StdStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::raw;
use common::{wait_until, Ev, Recorder, Running, Side, DEADLINE};
use netio_core::{
    Backend, BackendConfig, BufferError, CloseReason, ConnectionParams, EndpointAddress,
    PoolParams, RefuseReason, SendError,
};
use netio_tcp::wire::{CloseCode, CloseFrame, DataPrefix, Handshake, HANDSHAKE_LEN};
use netio_tcp::TcpConfig;

/// A listening backend with a well-behaved client connected to it.
struct Bench {
    rt: Running,
    server: Side,
    client: Side,
    /// The server's listen address.
    listen: EndpointAddress,
    /// The well-behaved client's name on the server.
    good: EndpointAddress,
    /// Key of the next check on the good connection.
    next_key: u64,
}

impl Bench {
    fn new(tcp: TcpConfig, params: ConnectionParams) -> Self {
        Self::with(BackendConfig::default(), tcp, params, Recorder::default())
    }

    fn with(
        config: BackendConfig,
        tcp: TcpConfig,
        params: ConnectionParams,
        rec: Recorder,
    ) -> Self {
        let rt = Running::start();
        let server = Side::with(&rt.lp, config, tcp, rec);
        let client = Side::new(&rt.lp, BackendConfig::default());
        let (listen, good) = common::connect(
            &server,
            &client,
            EndpointAddress::localhost(0),
            params,
            ConnectionParams::receive(1024, 4),
        );
        Self {
            rt,
            server,
            client,
            listen,
            good,
            next_key: 1000,
        }
    }

    /// A round trip on the well-behaved connection: a message each way,
    /// both sends completed and delivered, and nothing of it closed.
    fn good_connection_still_works(&mut self) {
        let key = self.next_key;
        self.next_key += 1;
        let (listen, good) = (self.listen, self.good);
        let ping = format!("ping {key}").into_bytes();
        let pong = format!("pong {key}").into_bytes();
        self.client
            .b
            .send_data_copy(self.client.conn(listen), &[&ping], &[], key)
            .expect("the good client sends");
        assert!(
            wait_until(|| self.server.has(|e| *e == Ev::Data(good, ping.clone()))),
            "the server got the good client's message: {:?}",
            self.server.events()
        );
        self.server
            .b
            .send_data_copy(self.server.conn(good), &[&pong], &[], key)
            .expect("the server answers the good client");
        assert!(
            wait_until(|| self.client.has(|e| *e == Ev::Data(listen, pong.clone()))),
            "the good client got the answer: {:?}",
            self.client.events()
        );
        assert!(wait_until(|| self
            .client
            .has(|e| *e == Ev::Completed(listen, key))
            && self.server.has(|e| *e == Ev::Completed(good, key))));
        assert!(!self
            .server
            .has(|e| matches!(e, Ev::Closed(r, ..) if *r == good)));
        assert!(!self.client.has(|e| matches!(e, Ev::Closed(..))));
        // No callback panicked out of the loop.
        assert!(self.rt.lp.is_running(), "the loop thread is still running");
    }

    /// The server's events about connections other than the good one.
    fn hostile_events(&self) -> Vec<Ev> {
        let good = self.good;
        self.server
            .events()
            .into_iter()
            .filter(|e| match e {
                Ev::Established(r, _)
                | Ev::Refused(r, _)
                | Ev::Closed(r, _, _)
                | Ev::Data(r, _)
                | Ev::Completed(r, _) => *r != good,
            })
            .collect()
    }

    /// Waits until the server reports an event matching `f` about a
    /// hostile connection.
    fn wait_hostile(&self, what: &str, f: impl Fn(&Ev) -> bool) {
        assert!(
            wait_until(|| self.hostile_events().iter().any(&f)),
            "{what}: {:?}",
            self.hostile_events()
        );
    }

    /// The messages the server received from `remote`.
    fn data_from(&self, remote: EndpointAddress) -> Vec<Vec<u8>> {
        self.server
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Data(r, d) if r == remote => Some(d),
                _ => None,
            })
            .collect()
    }

    /// Waits until the server has established the connection of `peer`.
    fn wait_established(&self, peer: &StdStream) -> EndpointAddress {
        let remote = EndpointAddress::from(peer.local_addr().unwrap());
        self.wait_hostile(
            "established",
            |e| matches!(e, Ev::Established(r, _) if *r == remote),
        );
        remote
    }
}

/// Asserts that every key in `sent` ended exactly once on `side`'s
/// connection to `remote`: completed, or cancelled when it closed.
fn every_send_ended_once(side: &Side, remote: EndpointAddress, sent: &[u64]) {
    let mut ended: Vec<u64> = Vec::new();
    for e in side.events() {
        match e {
            Ev::Completed(r, k) if r == remote => ended.push(k),
            Ev::Closed(r, _, keys) if r == remote => ended.extend(keys),
            _ => {}
        }
    }
    ended.sort_unstable();
    let mut sent = sent.to_vec();
    sent.sort_unstable();
    assert_eq!(ended, sent, "every send ends once, completed or cancelled");
}

/// Whether nothing about `remote` was reported.
fn nothing_reported_about(bench: &Bench, remote: EndpointAddress) -> bool {
    !bench.server.events().iter().any(|e| match e {
        Ev::Established(r, _)
        | Ev::Refused(r, _)
        | Ev::Closed(r, _, _)
        | Ev::Data(r, _)
        | Ev::Completed(r, _) => *r == remote,
    })
}

#[test]
fn a_large_message_in_the_same_read_as_the_handshake_is_delivered() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(100_000, 4));
    let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut out = Handshake::new(100_000).encode().to_vec();
    out.extend_from_slice(DataPrefix::new(&[], msg.len()).unwrap().as_bytes());
    out.extend_from_slice(&msg);
    let mut peer = raw::connect(bench.listen);
    peer.write_all(&out).unwrap();
    assert!(
        wait_until(|| bench
            .hostile_events()
            .iter()
            .any(|e| matches!(e, Ev::Data(_, d) if *d == msg))),
        "{:?}",
        bench.hostile_events()
    );
    assert!(!bench
        .hostile_events()
        .iter()
        .any(|e| matches!(e, Ev::Closed(..))));
    bench.good_connection_still_works();
}

#[test]
fn garbage_instead_of_handshake() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));
    // A foreign client: turned away at its first byte, nothing reported.
    let mut raw = raw::connect(bench.listen);
    let remote = EndpointAddress::from(raw.local_addr().unwrap());
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let got = raw::read_to_end(&mut raw);
    assert!(
        got.len() <= HANDSHAKE_LEN,
        "at most the backend's handshake: {got:?}"
    );
    assert!(
        nothing_reported_about(&bench, remote),
        "{:?}",
        bench.server.events()
    );

    // A foreign server: the backend's connection to it is refused with the
    // reason.
    let foreign = StdListener::bind("127.0.0.1:0").unwrap();
    let target = EndpointAddress::from(foreign.local_addr().unwrap());
    bench
        .server
        .b
        .open_active_endpoint(target, ConnectionParams::receive(64, 1))
        .unwrap();
    let (mut s, _) = foreign.accept().unwrap();
    s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").unwrap();
    bench.wait_hostile("refused as a foreign peer", |e| {
        matches!(e, Ev::Refused(r, RefuseReason::Handshake(why))
            if *r == target && why.contains("not a netio peer"))
    });
    assert!(!bench
        .server
        .has(|e| matches!(e, Ev::Established(r, _) if *r == target)));
    bench.good_connection_still_works();
}

#[test]
fn wrong_protocol_version() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));
    let mut v2 = Handshake::new(64).encode();
    v2[4..6].copy_from_slice(&2u16.to_le_bytes());

    // A client of version 2: it gets this side's version-1 handshake, so it
    // can tell why, then end of stream; nothing is reported here.
    let mut raw = raw::connect(bench.listen);
    let remote = EndpointAddress::from(raw.local_addr().unwrap());
    raw.write_all(&v2).unwrap();
    let got = raw::read_to_end(&mut raw);
    assert_eq!(got, Handshake::new(64).encode(), "only the handshake");
    assert!(
        nothing_reported_about(&bench, remote),
        "{:?}",
        bench.server.events()
    );

    // A server of version 2: refused, naming both versions.
    let other = StdListener::bind("127.0.0.1:0").unwrap();
    let target = EndpointAddress::from(other.local_addr().unwrap());
    bench
        .server
        .b
        .open_active_endpoint(target, ConnectionParams::receive(64, 1))
        .unwrap();
    let (mut s, _) = other.accept().unwrap();
    s.write_all(&v2).unwrap();
    bench.wait_hostile("refused for its version", |e| {
        matches!(e, Ev::Refused(r, RefuseReason::Handshake(why))
            if *r == target && why.contains("version 2") && why.contains("speaks 1"))
    });
    // The handle is stale after the refusal; opening again gives a new one.
    let refused = bench.server.conn(target);
    assert!(bench.server.b.close_active_endpoint(refused).is_err());
    let again = bench
        .server
        .b
        .open_active_endpoint(target, ConnectionParams::receive(64, 1))
        .expect("reopening after a refusal");
    assert_ne!(again, refused);
    bench.server.b.close_active_endpoint(again).unwrap();
    bench.wait_hostile(
        "the reopened endpoint is cancelled",
        |e| matches!(e, Ev::Refused(r, RefuseReason::Cancelled) if *r == target),
    );
    bench.good_connection_still_works();
}

#[test]
fn frame_length_larger_than_receive_buffer() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(4096, 2));
    let memory = bench.server.b.memory_usage();
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    // A message that fits, then one a byte too large, then some of its
    // body.
    let mut out = raw::data_frame(b"fits");
    out.extend_from_slice(&raw::frame_header(1, 4097));
    out.extend_from_slice(&[7u8; 100]);
    raw.write_all(&out).unwrap();
    let too_large = CloseReason::MessageTooLarge {
        size: 4097,
        limit: 4096,
    };
    bench.wait_hostile(
        "closed as too large",
        |e| matches!(e, Ev::Closed(r, why, _) if *r == remote && *why == too_large),
    );
    assert_eq!(bench.data_from(remote), vec![b"fits".to_vec()]);
    // The peer gets a CLOSE frame with code 1, then end of stream.
    let got = raw::read_to_end(&mut raw);
    assert_eq!(raw::close_code_after_handshake(&got), Some(1), "{got:?}");
    // Receive memory is the pools, and the closed connection's is gone.
    assert_eq!(bench.server.b.memory_usage(), memory);
    bench.good_connection_still_works();
}

#[test]
fn frame_length_u32_max() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(1 << 20, 2));
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let mut out = raw::data_frame(b"fits");
    out.extend_from_slice(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]);
    raw.write_all(&out).unwrap();
    let too_large = CloseReason::MessageTooLarge {
        size: u64::from(u32::MAX),
        limit: 1 << 20,
    };
    bench.wait_hostile(
        "closed as too large",
        |e| matches!(e, Ev::Closed(r, why, _) if *r == remote && *why == too_large),
    );
    assert_eq!(bench.data_from(remote), vec![b"fits".to_vec()]);
    let got = raw::read_to_end(&mut raw);
    assert_eq!(raw::close_code_after_handshake(&got), Some(1), "{got:?}");

    // On a connection that receives nothing, any DATA frame is a protocol
    // error, the largest one too.
    let mute = bench
        .server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), ConnectionParams::default())
        .unwrap();
    let mut raw = raw::connect_with_handshake(mute, 0);
    let remote = bench.wait_established(&raw);
    raw.write_all(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff])
        .unwrap();
    bench.wait_hostile("closed as a protocol error", |e| {
        matches!(e, Ev::Closed(r, CloseReason::Protocol(why), _)
            if *r == remote && why.contains("without receive capability"))
    });
    let got = raw::read_to_end(&mut raw);
    assert_eq!(raw::close_code_after_handshake(&got), Some(2), "{got:?}");
    bench.good_connection_still_works();
}

#[test]
fn frame_cut_off_by_disconnect() {
    // A small read buffer, and one receive buffer for every connection the
    // listener accepts: messages above 4 KiB are assembled in it.
    let tcp = TcpConfig {
        read_buffer_size: 4096,
        ..TcpConfig::default()
    };
    let params = ConnectionParams::receive(100_000, 1).with_shared_receive();
    let mut bench = Bench::new(tcp, params);

    // A small frame cut short by an orderly end of stream.
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let mut out = raw::data_frame(b"whole");
    out.extend_from_slice(&raw::frame_header(1, 100));
    out.extend_from_slice(&[1u8; 10]);
    raw.write_all(&out).unwrap();
    raw.shutdown(Shutdown::Write).unwrap();
    bench.wait_hostile(
        "a reset",
        |e| matches!(e, Ev::Closed(r, CloseReason::Reset, _) if *r == remote),
    );
    assert_eq!(bench.data_from(remote), vec![b"whole".to_vec()]);
    drop(raw);

    // A large frame cut short while it is assembled in the only buffer.
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let mut out = raw::frame_header(1, 50_000).to_vec();
    out.extend_from_slice(&[2u8; 20_000]);
    raw.write_all(&out).unwrap();
    drop(raw);
    bench.wait_hostile(
        "a reset",
        |e| matches!(e, Ev::Closed(r, CloseReason::Reset, _) if *r == remote),
    );
    assert!(bench.data_from(remote).is_empty());

    // The buffer was given back: a large message on another connection
    // arrives whole.
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let big: Vec<u8> = (0..50_000u32).map(|i| (i % 249) as u8).collect();
    raw.write_all(&raw::data_frame(&big)).unwrap();
    bench.wait_hostile(
        "the large message",
        |e| matches!(e, Ev::Data(r, d) if *r == remote && *d == big),
    );
    bench.good_connection_still_works();
}

#[test]
fn peer_connects_and_sends_nothing() {
    let timeout = Duration::from_millis(300);
    let tcp = TcpConfig {
        handshake_timeout: timeout,
        ..TcpConfig::default()
    };
    let mut bench = Bench::new(tcp, ConnectionParams::receive(64, 1));

    // A client that never sends its handshake is given up: it gets this
    // side's handshake, then end of stream; nothing is reported.
    let started = Instant::now();
    let mut raw = raw::connect(bench.listen);
    let remote = EndpointAddress::from(raw.local_addr().unwrap());
    let got = raw::read_to_end(&mut raw);
    assert_eq!(got, Handshake::new(64).encode());
    assert!(started.elapsed() >= timeout, "given up too early");
    assert!(
        nothing_reported_about(&bench, remote),
        "{:?}",
        bench.server.events()
    );

    // A server that accepts and never answers: refused as a handshake
    // failure.
    let silent = StdListener::bind("127.0.0.1:0").unwrap();
    let target = EndpointAddress::from(silent.local_addr().unwrap());
    bench
        .server
        .b
        .open_active_endpoint(target, ConnectionParams::receive(64, 1))
        .unwrap();
    let (_held, _) = silent.accept().unwrap();
    bench.wait_hostile("refused for its silence", |e| {
        matches!(e, Ev::Refused(r, RefuseReason::Handshake(why))
            if *r == target && why.contains("in time"))
    });
    // The established connection outlived both timeouts.
    bench.good_connection_still_works();
}

#[test]
fn peer_closes_during_handshake() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));

    // Clients that end (orderly, or with a reset) halfway through their
    // handshake: nothing reported.
    let mut raw = raw::connect(bench.listen);
    let first = EndpointAddress::from(raw.local_addr().unwrap());
    raw.write_all(&Handshake::new(64).encode()[..6]).unwrap();
    raw.shutdown(Shutdown::Write).unwrap();
    assert_eq!(raw::read_to_end(&mut raw), Handshake::new(64).encode());
    let mut raw = raw::connect(bench.listen);
    let second = EndpointAddress::from(raw.local_addr().unwrap());
    raw.write_all(&Handshake::new(64).encode()[..10]).unwrap();
    raw::read_n(&mut raw, HANDSHAKE_LEN);
    raw::reset(raw);

    // Servers that do the same: refused as handshake failures.
    for reset in [false, true] {
        let half = StdListener::bind("127.0.0.1:0").unwrap();
        let target = EndpointAddress::from(half.local_addr().unwrap());
        bench
            .server
            .b
            .open_active_endpoint(target, ConnectionParams::receive(64, 1))
            .unwrap();
        let (mut s, _) = half.accept().unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        raw::read_n(&mut s, HANDSHAKE_LEN);
        s.write_all(&Handshake::new(64).encode()[..8]).unwrap();
        if reset {
            raw::reset(s);
        } else {
            drop(s);
        }
        bench.wait_hostile(
            "refused during the handshake",
            |e| matches!(e, Ev::Refused(r, RefuseReason::Handshake(_)) if *r == target),
        );
    }
    bench.good_connection_still_works();
    assert!(nothing_reported_about(&bench, first));
    assert!(nothing_reported_about(&bench, second));
}

#[test]
fn reset_in_the_middle_of_a_frame() {
    let tcp = TcpConfig {
        read_buffer_size: 4096,
        ..TcpConfig::default()
    };
    let mut bench = Bench::new(tcp, ConnectionParams::receive(100_000, 2));
    // Cut inside a frame that fits the read buffer, then inside one that is
    // being assembled in a pool buffer.
    for (len, sent) in [(1000u32, 10usize), (50_000, 20_000)] {
        let mut raw = raw::connect_with_handshake(bench.listen, 1024);
        let remote = bench.wait_established(&raw);
        // The server sends the peer a few messages first.
        let keys: Vec<u64> = (1..=3).collect();
        for &k in &keys {
            bench
                .server
                .b
                .send_data_copy(bench.server.conn(remote), &[b"to the peer"], &[], k)
                .unwrap();
        }
        let mut out = raw::data_frame(b"before");
        out.extend_from_slice(&raw::frame_header(1, len));
        out.extend(std::iter::repeat_n(3u8, sent));
        raw.write_all(&out).unwrap();
        bench.wait_hostile(
            "the message before the cut",
            |e| matches!(e, Ev::Data(r, d) if *r == remote && d == b"before"),
        );
        raw::reset(raw);
        bench.wait_hostile(
            "a reset",
            |e| matches!(e, Ev::Closed(r, CloseReason::Reset, _) if *r == remote),
        );
        assert_eq!(bench.data_from(remote), vec![b"before".to_vec()]);
        every_send_ended_once(&bench.server, remote, &keys);
    }
    bench.good_connection_still_works();
}

#[test]
fn peer_never_reads() {
    const DEPTH: usize = 8;
    const MSG: usize = 16 * 1024;
    const POOL: usize = 4;
    /// Copy sends have keys from here; buffered sends are keyed by their
    /// buffer's index, below.
    const COPY: u64 = 1 << 32;
    let config = BackendConfig {
        send_queue_depth: DEPTH,
        ..BackendConfig::default()
    };
    let tcp = TcpConfig {
        send_buffer_size: Some(8192),
        close_linger: Duration::from_millis(300),
        ..TcpConfig::default()
    };
    let params = ConnectionParams::receive(64, 1).with_buffered(MSG, POOL);
    let mut bench = Bench::with(config, tcp, params, Recorder::default());

    // A peer with a small receive buffer that reads nothing at all.
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect(&bench.listen.socket_addr().into()).unwrap();
    let mut raw: StdStream = sock.into();
    raw.write_all(&Handshake::new(64).encode()).unwrap();
    let remote = bench.wait_established(&raw);
    let conn = bench.server.conn(remote);
    let memory = bench.server.b.memory_usage();
    let events = Arc::clone(&bench.server.shared);
    let completed = move |shared: &common::Shared, copy: bool| {
        let events = &shared.events;
        events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, Ev::Completed(r, k) if *r == remote && (*k >= COPY) == copy))
            .count()
    };

    // Copy sends, each on the loop thread so no completion is reported
    // meanwhile: accepted while fewer than the depth are in flight (sent
    // and not reported complete), then NoResources once the socket is
    // full.
    let mut copies: Vec<u64> = Vec::new();
    let mut refused_in_a_row = 0;
    let end = Instant::now() + DEADLINE;
    for attempt in 0..10_000u64 {
        if refused_in_a_row == 20 || Instant::now() > end {
            break;
        }
        let key = COPY + attempt;
        let (b, ev) = (bench.server.b.clone(), Arc::clone(&events));
        let (result, done) = bench.rt.on_loop(move || {
            let done = completed(&ev, true);
            let r = b.send_data_copy(conn, &[&vec![0xAB; MSG]], &[], key);
            (r, done)
        });
        let in_flight = copies.len() - done;
        match result {
            Ok(()) => {
                assert!(in_flight < DEPTH, "accepted with {in_flight} in flight");
                copies.push(key);
                refused_in_a_row = 0;
            }
            Err(SendError::NoResources) => {
                assert_eq!(in_flight, DEPTH, "refused below the depth");
                refused_in_a_row += 1;
            }
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!(
        refused_in_a_row, 20,
        "sends to a peer that never reads stop"
    );
    let frame = MSG + 8;
    let queued = bench
        .server
        .b
        .queued_send_bytes()
        .expect("a thread-safe backend answers from any thread");
    assert!(
        queued > 0 && queued <= DEPTH * frame,
        "{queued} bytes queued"
    );

    // Buffered sends: at most the pool's buffers, then get_buffer is None.
    let mut buffered: Vec<u64> = Vec::new();
    let mut exhausted = false;
    for _ in 0..POOL + 10 {
        let (b, ev) = (bench.server.b.clone(), Arc::clone(&events));
        let (key, done) = bench.rt.on_loop(move || {
            let done = completed(&ev, false);
            let key = b.get_buffer(conn).unwrap().map(|mut buf| {
                buf.write(&[0xCD; MSG]).unwrap();
                let key = buf.index();
                b.send_buffer(conn, buf, key).unwrap();
                key
            });
            (key, done)
        });
        let in_flight = buffered.len() - done;
        match key {
            Some(k) => {
                assert!(in_flight < POOL, "a buffer with {in_flight} in flight");
                buffered.push(k);
            }
            None => {
                assert_eq!(in_flight, POOL, "no buffer below the pool size");
                exhausted = true;
                break;
            }
        }
    }
    assert!(exhausted, "the pool runs dry");
    let queued = bench
        .server
        .b
        .queued_send_bytes()
        .expect("a thread-safe backend answers from any thread");
    assert!(queued <= (DEPTH + POOL) * frame, "{queued} bytes queued");
    // No memory beyond the pools.
    assert_eq!(bench.server.b.memory_usage(), memory);
    bench.good_connection_still_works();

    // Closing: every accepted send is reported once, completed or
    // cancelled; what was queued is let go of once the linger ends.
    bench
        .server
        .b
        .close_active_endpoint(bench.server.conn(remote))
        .unwrap();
    bench.wait_hostile(
        "closed locally",
        |e| matches!(e, Ev::Closed(r, CloseReason::Local, _) if *r == remote),
    );
    let mut sent = copies.clone();
    sent.extend(&buffered);
    every_send_ended_once(&bench.server, remote, &sent);
    assert!(
        wait_until(|| bench
            .server
            .b
            .queued_send_bytes()
            .expect("a thread-safe backend answers from any thread")
            == 0),
        "{} bytes still queued",
        bench
            .server
            .b
            .queued_send_bytes()
            .expect("a thread-safe backend answers from any thread")
    );
    assert!(matches!(
        bench.server.b.get_buffer(bench.server.conn(remote)),
        Err(BufferError::UnknownConnection(c)) if c == conn
    ));
    assert!(bench.server.b.memory_usage().send_bytes < memory.send_bytes);
    drop(raw);
    bench.good_connection_still_works();
}

#[test]
fn close_frame_with_a_garbage_reason() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));
    // An unknown code and a reason that is not UTF-8: an orderly close all
    // the same; what follows the CLOSE frame is ignored.
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let mut out = raw::data_frame(b"last words");
    out.extend_from_slice(&raw::frame_header(2, 256));
    out.extend_from_slice(&0xbeefu16.to_le_bytes());
    out.extend((0..254u32).map(|i| 0x80 | (i as u8)));
    out.extend_from_slice(&raw::data_frame(b"ignored"));
    raw.write_all(&out).unwrap();
    bench.wait_hostile(
        "closed by the peer",
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == remote),
    );
    assert_eq!(bench.data_from(remote), vec![b"last words".to_vec()]);

    // CLOSE frames of a bad length are protocol errors.
    for len in [0u32, 1, 257, u32::MAX] {
        let mut raw = raw::connect_with_handshake(bench.listen, 0);
        let remote = bench.wait_established(&raw);
        raw.write_all(&raw::frame_header(2, len)).unwrap();
        bench.wait_hostile("a protocol error", |e| {
            matches!(e, Ev::Closed(r, CloseReason::Protocol(why), _)
                if *r == remote && why.contains(&format!("CLOSE frame body of {len} bytes")))
        });
        let got = raw::read_to_end(&mut raw);
        assert_eq!(raw::close_code_after_handshake(&got), Some(2), "{got:?}");
    }
    // The backend's own CLOSE frames decode as the document says.
    assert_eq!(
        CloseFrame::new(CloseCode::ProtocolError, "x").as_bytes()[..10],
        [2, 0, 0, 0, 3, 0, 0, 0, 2, 0]
    );
    bench.good_connection_still_works();
}

#[test]
fn many_tiny_frames_in_one_read() {
    const N: u32 = 100_000;
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));
    let before = bench
        .server
        .data_count
        .load(std::sync::atomic::Ordering::SeqCst);
    let mut raw = raw::connect_with_handshake(bench.listen, 0);
    let remote = bench.wait_established(&raw);
    let mut out = Vec::with_capacity(N as usize * 12 + 8);
    for i in 0..N {
        out.extend_from_slice(DataPrefix::new(&[], 4).unwrap().as_bytes());
        out.extend_from_slice(&i.to_le_bytes());
    }
    // And an empty message last.
    out.extend_from_slice(&raw::data_frame(b""));
    raw.write_all(&out).unwrap();
    let count = Arc::clone(&bench.server.data_count);
    assert!(
        wait_until(|| count.load(std::sync::atomic::Ordering::SeqCst) - before == N as usize + 1),
        "{} of {} messages",
        count.load(std::sync::atomic::Ordering::SeqCst) - before,
        N + 1
    );
    let data = bench.data_from(remote);
    let (last, numbered) = data.split_last().unwrap();
    assert!(last.is_empty());
    let got: Vec<u32> = numbered
        .iter()
        .map(|d| u32::from_le_bytes(d[..].try_into().unwrap()))
        .collect();
    assert!(got.iter().copied().eq(0..N), "in order, exactly once");
    bench.good_connection_still_works();
}

#[test]
fn a_handler_that_closes_mid_batch_gets_no_more_messages() {
    let rec = Recorder {
        on_data: Some(Box::new(|b, r, d| {
            if d.starts_with(b"close me") {
                b.close_active_endpoint(r).unwrap();
            }
        })),
        ..Recorder::default()
    };
    let tcp = TcpConfig {
        read_buffer_size: 4096,
        ..TcpConfig::default()
    };
    let mut bench = Bench::with(
        BackendConfig::default(),
        tcp,
        ConnectionParams::receive(100_000, 2),
        rec,
    );
    let mut big = b"close me".to_vec();
    big.resize(10_000, 5);
    // Closed on a message parsed in place, and on one assembled in a pool
    // buffer; every frame after it is in the same read.
    for closing in [b"close me".to_vec(), big] {
        let mut raw = raw::connect_with_handshake(bench.listen, 0);
        let remote = bench.wait_established(&raw);
        let mut out = raw::data_frame(b"one");
        out.extend_from_slice(&raw::data_frame(&closing));
        out.extend_from_slice(&raw::data_frame(b"after 1"));
        out.extend_from_slice(&raw::data_frame(&[6u8; 9000]));
        out.extend_from_slice(&raw::data_frame(b"after 2"));
        raw.write_all(&out).unwrap();
        bench.wait_hostile(
            "closed by the handler",
            |e| matches!(e, Ev::Closed(r, CloseReason::Local, _) if *r == remote),
        );
        assert_eq!(bench.data_from(remote), vec![b"one".to_vec(), closing]);
        let got = raw::read_to_end(&mut raw);
        assert_eq!(raw::close_code_after_handshake(&got), Some(0), "{got:?}");
    }
    bench.good_connection_still_works();
}

#[test]
fn a_send_holds_its_slot_and_buffer_until_its_batch_is_reported() {
    // The client's handler stops in the first completion of each kind until
    // the test lets it go. The sends flushed by one write are reported in
    // one batch, every slot and buffer of which is free when it is
    // reported, and no other.
    let (entered_tx, entered) = mpsc::channel::<u64>();
    let (release, gate) = mpsc::channel::<()>();
    let mut blocked = Vec::new();
    let rec = Recorder {
        on_completed: Some(Box::new(move |_, _, k| {
            let first_of_kind = !blocked.iter().any(|b: &u64| (*b >= 100) == (k >= 100));
            if first_of_kind {
                blocked.push(k);
                entered_tx.send(k).unwrap();
                gate.recv_timeout(DEADLINE).unwrap();
            }
        })),
        ..Recorder::default()
    };
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let config = BackendConfig {
        send_queue_depth: 2,
        ..BackendConfig::default()
    };
    let client = Side::with(&rt.lp, config, TcpConfig::default(), rec);
    let (addr, _) = common::connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(64, 8),
        ConnectionParams::buffered(64, 2),
    );
    let conn = client.conn(addr);

    // Copy sends: two in one go (written in one flush).
    let b = client.b.clone();
    rt.on_loop(move || {
        b.send_data_copy(conn, &[b"a"], &[], 100).unwrap();
        b.send_data_copy(conn, &[b"b"], &[], 101).unwrap();
    });
    assert_eq!(entered.recv_timeout(DEADLINE).unwrap(), 100);
    // The batch [100, 101] is being reported: both slots are free, and
    // only they.
    assert_eq!(client.batches(), vec![(conn, vec![100, 101])]);
    client.b.send_data_copy(conn, &[b"c"], &[], 102).unwrap();
    client.b.send_data_copy(conn, &[b"d"], &[], 103).unwrap();
    assert!(matches!(
        client.b.send_data_copy(conn, &[b"e"], &[], 104),
        Err(SendError::NoResources)
    ));
    release.send(()).unwrap();
    assert!(wait_until(
        || (100..=103).all(|k| client.has(|e| *e == Ev::Completed(addr, k)))
    ));

    // Buffered sends: both buffers in one go.
    let b = client.b.clone();
    let keys = rt.on_loop(move || {
        let mut keys = Vec::new();
        for msg in [b"x", b"y"] {
            let mut buf = b.get_buffer(conn).unwrap().unwrap();
            buf.write(msg).unwrap();
            keys.push(buf.index());
            let key = buf.index();
            b.send_buffer(conn, buf, key).unwrap();
        }
        keys
    });
    assert_eq!(entered.recv_timeout(DEADLINE).unwrap(), keys[0]);
    // Both buffers went out in one batch: both are back in the pool.
    assert_eq!(client.batches().last(), Some(&(conn, keys.clone())));
    let again = client.b.get_buffer(conn).unwrap();
    let again2 = client.b.get_buffer(conn).unwrap();
    assert!(again.is_some() && again2.is_some());
    assert!(client.b.get_buffer(conn).unwrap().is_none());
    drop((again, again2));
    release.send(()).unwrap();
    assert!(wait_until(|| keys
        .iter()
        .all(|&k| client.has(|e| *e == Ev::Completed(addr, k)))));
    assert!(wait_until(|| server.data().len() == 6));
}

#[test]
fn a_backlog_longer_than_one_accept_batch_is_accepted_whole() {
    const PEERS: usize = 300;
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(64, 1));
    // Hold the loop while the peers connect, so they all wait in the
    // listener's backlog behind a single readiness event.
    let (release, gate) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel::<()>();
    bench.rt.lp.post(move || {
        held_tx.send(()).unwrap();
        let _ = gate.recv_timeout(DEADLINE);
    });
    held.recv_timeout(DEADLINE).unwrap();
    let mut peers: Vec<StdStream> = (0..PEERS)
        .map(|_| raw::connect_with_handshake(bench.listen, 0))
        .collect();
    release.send(()).unwrap();
    // Every one of them is accepted and answered.
    for p in &mut peers {
        assert_eq!(raw::read_n(p, HANDSHAKE_LEN), Handshake::new(64).encode());
    }
    assert!(wait_until(|| bench
        .hostile_events()
        .iter()
        .filter(|e| matches!(e, Ev::Established(..)))
        .count()
        == PEERS));
    bench.good_connection_still_works();
}

#[test]
fn stalled_partial_message_does_not_starve_a_shared_pool() {
    const TIMEOUT: Duration = Duration::from_millis(200);
    const BIG: usize = 50_000;
    // Messages above 4 KiB are assembled in a pool buffer.
    let tcp = TcpConfig {
        read_buffer_size: 4096,
        partial_message_timeout: TIMEOUT,
        close_linger: Duration::from_millis(300),
        ..TcpConfig::default()
    };
    let backend_pool = BackendConfig {
        shared_receive_pool: Some(PoolParams::new(100_000, 1)),
        ..BackendConfig::default()
    };
    // A listener's shared pool of one buffer, and the backend's.
    let cases = [
        (
            BackendConfig::default(),
            ConnectionParams::receive(100_000, 1).with_shared_receive(),
        ),
        (
            backend_pool,
            ConnectionParams::default().with_shared_receive(),
        ),
    ];
    for (config, params) in cases {
        let mut bench = Bench::with(config, tcp.clone(), params, Recorder::default());
        let (listen, good) = (bench.listen, bench.good);
        let big =
            |seed: u32| -> Vec<u8> { (0..BIG as u32).map(|i| (i % 241 + seed) as u8).collect() };

        // A peer on a listener with per-connection pools stalls first: it
        // is not limited, since it starves nobody.
        let own = bench
            .server
            .b
            .open_listen_endpoint(
                EndpointAddress::localhost(0),
                ConnectionParams::receive(100_000, 1),
            )
            .unwrap();
        let mut patient = raw::connect_with_handshake(own, 0);
        let patient_remote = bench.wait_established(&patient);
        let mut out = raw::data_frame(b"patient");
        out.extend_from_slice(&raw::frame_header(1, BIG as u32));
        out.extend_from_slice(&big(1)[..BIG / 2]);
        patient.write_all(&out).unwrap();
        bench.wait_hostile(
            "the patient peer's first message",
            |e| matches!(e, Ev::Data(r, d) if *r == patient_remote && d == b"patient"),
        );

        // A peer on the shared pool: a small message, then half of a large
        // one in the same write, so the pool's only buffer is taken by the
        // time the small message is reported; then silence.
        let mut stalled = raw::connect_with_handshake(listen, 0);
        let remote = bench.wait_established(&stalled);
        let mut out = raw::data_frame(b"before");
        out.extend_from_slice(&raw::frame_header(1, BIG as u32));
        out.extend_from_slice(&[9u8; BIG / 2]);
        stalled.write_all(&out).unwrap();
        bench.wait_hostile(
            "the stalled peer's first message",
            |e| matches!(e, Ev::Data(r, d) if *r == remote && d == b"before"),
        );

        // The good client needs the pool's buffer too: its message arrives
        // once the stalled peer has been closed for it.
        let first = big(2);
        bench
            .client
            .b
            .send_data_copy(bench.client.conn(listen), &[&first], &[], 1)
            .unwrap();
        assert!(
            wait_until(|| bench.server.has(|e| *e == Ev::Data(good, first.clone()))),
            "the good client's large message: {:?}",
            bench.hostile_events()
        );
        let events = bench.server.events();
        let closed = events.iter().position(|e| {
            matches!(e, Ev::Closed(r, CloseReason::Protocol(why), keys)
                if *r == remote && keys.is_empty()
                    && why.contains("message incomplete for 200ms")
                    && why.contains(&format!("of {BIG} bytes received")))
        });
        let delivered = events
            .iter()
            .position(|e| *e == Ev::Data(good, first.clone()));
        assert!(
            closed.is_some() && closed < delivered,
            "the stalled peer is closed first: {events:?}"
        );
        assert_eq!(bench.data_from(remote), vec![b"before".to_vec()]);
        // It gets a CLOSE frame (protocol error), then end of stream.
        let got = raw::read_to_end(&mut stalled);
        assert_eq!(raw::close_code_after_handshake(&got), Some(2), "{got:?}");

        // The buffer is back: the next large message arrives too.
        let second = big(3);
        bench
            .client
            .b
            .send_data_copy(bench.client.conn(listen), &[&second], &[], 2)
            .unwrap();
        assert!(
            wait_until(|| bench.server.has(|e| *e == Ev::Data(good, second.clone()))),
            "the good client's second large message: {:?}",
            bench.hostile_events()
        );
        assert!(wait_until(
            || (1..=2).all(|k| bench.client.has(|e| *e == Ev::Completed(listen, k)))
        ));

        // The peer with its own pool stalled longer, and is still open: its
        // message completes.
        assert!(!bench
            .server
            .has(|e| matches!(e, Ev::Closed(r, ..) if *r == patient_remote)));
        patient.write_all(&big(1)[BIG / 2..]).unwrap();
        bench.wait_hostile(
            "the patient peer's large message",
            |e| matches!(e, Ev::Data(r, d) if *r == patient_remote && *d == big(1)),
        );
        bench.good_connection_still_works();
    }
}
