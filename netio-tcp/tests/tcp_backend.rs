//! The TCP backend end to end over loopback: connecting, the three send
//! modes, ordering, limits, closing, errors and thread modes.

mod common;

use std::net::TcpListener as StdListener;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use common::{connect, wait_until, Ev, Recorder, Running, Side};
use netio_core::{
    Backend, BackendConfig, BufferError, CloseError, CloseReason, ConnError, ConnId,
    ConnectionParams, EndpointAddress, MemoryRegion, OpenActiveError, OpenListenError, PoolParams,
    RefuseReason, SendError, ThreadSafety,
};
use netio_tcp::TcpConfig;

/// A server and a client with default configurations on `rt`'s loop,
/// connected over 127.0.0.1 with [`params`] on both sides. Returns the
/// listener's address (the client's name for the connection) and the
/// client's address as the server sees it.
fn default_pair(rt: &Running) -> (Side, Side, EndpointAddress, EndpointAddress) {
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, peer) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params(),
        params(),
    );
    (server, client, addr, peer)
}

fn params() -> ConnectionParams {
    ConnectionParams::receive(4096, 8).with_buffered(4096, 4)
}

#[test]
fn copy_send_arrives_as_header_then_payload_over_ipv4() {
    let rt = Running::start();
    let (server, client, addr, peer) = default_pair(&rt);
    assert_ne!(addr.port(), 0);
    assert_eq!(peer.ip(), addr.ip());
    let caps = client
        .events()
        .iter()
        .find_map(|e| match e {
            Ev::Established(_, c) => Some(*c),
            _ => None,
        })
        .unwrap();
    assert!(caps.receive && caps.send_buffered && caps.send_copy && !caps.send_zero_copy);

    client
        .b
        .send_data_copy(client.conn(addr), &[b"pay", b"load"], b"HDR", 7)
        .unwrap();
    assert!(wait_until(|| client.has(|e| *e == Ev::Completed(addr, 7))));
    assert!(wait_until(|| server.data() == vec![b"HDRpayload".to_vec()]));
    assert!(server.has(|e| *e == Ev::Data(peer, b"HDRpayload".to_vec())));

    // And back.
    server
        .b
        .send_data_copy(server.conn(peer), &[b"pong"], &[], 8)
        .unwrap();
    assert!(wait_until(|| client.data() == vec![b"pong".to_vec()]));
}

#[test]
fn connects_over_ipv6() {
    if StdListener::bind("[::1]:0").is_err() {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    }
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, peer) = connect(
        &server,
        &client,
        EndpointAddress::localhost_v6(0),
        params(),
        params(),
    );
    assert!(addr.ip().is_ipv6() && peer.ip().is_ipv6());
    client
        .b
        .send_data_copy(client.conn(addr), &[b"six"], &[], 1)
        .unwrap();
    assert!(wait_until(|| server.data() == vec![b"six".to_vec()]));
}

#[test]
fn zero_copy_send_writes_from_the_region_and_locks_it_until_completion() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let region = MemoryRegion::new(1 << 20);
    region.write(0, b"zero-copy payload").unwrap();
    let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    region.write(1000, &big).unwrap();
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(300_000, 4),
        ConnectionParams::default().with_zero_copy(region.clone()),
    );
    let s1 = region.slice(0, 4).unwrap();
    let s2 = region.slice(5, 12).unwrap();
    client
        .b
        .send_data(client.conn(addr), &[s1, s2], b"H", 1)
        .unwrap();
    // A large one, assembled by the receiver in a pool buffer.
    let s3 = region.slice(1000, big.len()).unwrap();
    client
        .b
        .send_data(client.conn(addr), &[s3], &[], 2)
        .unwrap();
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == 2));
    assert!(wait_until(|| server.data().len() == 2));
    let data = server.data();
    assert_eq!(data[0], b"Hzerocopy payload");
    assert_eq!(data[1], big);
    // Completed: the region is writable again.
    region.write(0, b"x").unwrap();

    // Slices of another region, or no region at all.
    let other = MemoryRegion::new(16);
    assert!(matches!(
        client
            .b
            .send_data(client.conn(addr), &[other.slice(0, 4).unwrap()], &[], 3),
        Err(SendError::OutsideRegion)
    ));
    assert!(matches!(
        client.b.send_data(client.conn(addr), &[s1], &[0; 17], 3),
        Err(SendError::HeaderTooLong { len: 17, max: 16 })
    ));
    let peer = server.first_remote().unwrap();
    assert!(matches!(
        server.b.send_data(server.conn(peer), &[s1], &[], 3),
        Err(SendError::NotSupported(_))
    ));
}

#[test]
fn buffered_send_completes_with_the_buffer_index_and_returns_it() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, peer) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(4096, 2),
        ConnectionParams::buffered(64, 2),
    );
    let mut a = client.b.get_buffer(client.conn(addr)).unwrap().unwrap();
    let b = client.b.get_buffer(client.conn(addr)).unwrap().unwrap();
    assert!(client.b.get_buffer(client.conn(addr)).unwrap().is_none());
    assert_eq!(
        client.b.num_available_buffers(client.conn(addr)).unwrap(),
        0
    );
    a.write(b"buffered").unwrap();
    let key = a.index();
    client.b.send_buffer(client.conn(addr), a, key).unwrap();
    drop(b);
    assert!(wait_until(|| client.has(|e| *e == Ev::Completed(addr, key))));
    assert!(wait_until(|| server.data() == vec![b"buffered".to_vec()]));
    assert!(wait_until(|| client
        .b
        .get_buffer(client.conn(addr))
        .unwrap()
        .is_some()));
    // The low-water mark of the period that began with none free is 0; the
    // next period starts from the current number.
    assert_eq!(
        client.b.num_available_buffers(client.conn(addr)).unwrap(),
        0
    );
    assert_eq!(
        client.b.num_available_buffers(client.conn(addr)).unwrap(),
        2
    );

    // The server has no send buffers; a foreign buffer is refused.
    assert!(matches!(
        server.b.get_buffer(server.conn(peer)),
        Err(BufferError::NoBuffersAllocated(_))
    ));
    let foreign = netio_core::BufferPool::new(8, 1).get().unwrap();
    assert!(matches!(
        client.b.send_buffer(client.conn(addr), foreign, 9),
        Err(SendError::ForeignBuffer)
    ));
}

#[test]
fn many_messages_of_mixed_sizes_arrive_in_order_exactly_once() {
    let rt = Running::start();
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            read_buffer_size: 4096,
            ..TcpConfig::default()
        },
        Recorder::default(),
    );
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(20_000, 4),
        ConnectionParams::default(),
    );
    let n = 3000u32;
    let msg = |i: u32| -> Vec<u8> {
        let len = match i % 7 {
            0 => 0,
            1 => 15_000,
            _ => (i % 300) as usize,
        };
        let mut m = i.to_le_bytes().to_vec();
        m.extend((0..len).map(|j| (j as u32 ^ i) as u8));
        m
    };
    let mut i = 0;
    let mut rounds = 0;
    while i < n {
        rounds += 1;
        assert!(rounds < 1_000_000, "sending made no progress");
        match client
            .b
            .send_data_copy(client.conn(addr), &[&msg(i)], &[], u64::from(i))
        {
            Ok(()) => i += 1,
            Err(SendError::NoResources) => std::thread::yield_now(),
            Err(e) => panic!("send {i}: {e}"),
        }
    }
    assert!(wait_until(
        || server.data_count.load(Ordering::SeqCst) == n as usize
    ));
    let data = server.data();
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d, &msg(i as u32), "message {i}");
    }
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == n as usize));
}

#[test]
fn message_above_the_receive_limit_closes_both_sides() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, peer) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(1024, 2),
        ConnectionParams::default(),
    );
    client
        .b
        .send_data_copy(client.conn(addr), &[&[1u8; 1024]], &[], 1)
        .unwrap();
    client
        .b
        .send_data_copy(client.conn(addr), &[&[2u8; 1025]], &[], 2)
        .unwrap();
    let too_large = CloseReason::MessageTooLarge {
        size: 1025,
        limit: 1024,
    };
    assert!(wait_until(|| server.has(
        |e| matches!(e, Ev::Closed(r, why, _) if *r == peer && *why == too_large)
    )));
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == addr)
    )));
    assert_eq!(server.data(), vec![vec![1u8; 1024]]);
    // Every key ends once.
    let ended = |k: u64| {
        client.count(|e| *e == Ev::Completed(addr, k))
            + client.count(|e| matches!(e, Ev::Closed(_, _, keys) if keys.contains(&k)))
    };
    assert_eq!(ended(1), 1);
    assert_eq!(ended(2), 1);
}

#[test]
fn message_on_a_connection_without_receive_is_a_protocol_error() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::default(),
        ConnectionParams::default(),
    );
    client
        .b
        .send_data_copy(client.conn(addr), &[b"x"], &[], 1)
        .unwrap();
    assert!(wait_until(|| server.has(|e| matches!(
        e,
        Ev::Closed(_, CloseReason::Protocol(_), _)
    ))));
    assert!(wait_until(|| client.has(|e| matches!(
        e,
        Ev::Closed(_, CloseReason::PeerClosed, _)
    ))));
}

#[test]
fn closing_reports_local_and_peer_closed_and_allows_reopening() {
    let rt = Running::start();
    let (server, client, addr, peer) = default_pair(&rt);
    let conn = client.conn(addr);
    client.b.close_active_endpoint(conn).unwrap();
    // The handle is stale at once.
    assert!(matches!(
        client.b.close_active_endpoint(conn),
        Err(CloseError::UnknownConnection(c)) if c == conn
    ));
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::Local, k) if *r == addr && k.is_empty())
    )));
    assert!(wait_until(|| server.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == peer)
    )));
    assert!(matches!(
        client.b.send_data_copy(conn, &[b"late"], &[], 1),
        Err(SendError::UnknownConnection(c)) if c == conn
    ));
    let again = client.b.open_active_endpoint(addr, params()).unwrap();
    assert_ne!(again, conn);
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Established(r, _) if *r == addr))
        == 2));
    // The old handle stays stale; the new one works.
    assert!(matches!(
        client.b.send_data_copy(conn, &[b"late"], &[], 1),
        Err(SendError::UnknownConnection(_))
    ));
    client.b.send_data_copy(again, &[b"again"], &[], 2).unwrap();
    assert!(wait_until(|| server.data() == vec![b"again".to_vec()]));
}

#[test]
fn closing_with_sends_in_flight_reports_each_key_once() {
    let rt = Running::start();
    let sender_loop = Running::start();
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            recv_buffer_size: Some(4096),
            ..TcpConfig::default()
        },
        Recorder {
            skip_data: true,
            ..Recorder::default()
        },
    );
    let client = Side::with(
        &sender_loop.lp,
        BackendConfig {
            send_queue_depth: 64,
            ..BackendConfig::default()
        },
        TcpConfig {
            send_buffer_size: Some(4096),
            ..TcpConfig::default()
        },
        Recorder::default(),
    );
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(70_000, 4),
        ConnectionParams::default(),
    );
    // The receiver reads nothing until released, so sends stay in flight.
    let (release, wait) = mpsc::channel::<()>();
    let (blocked_tx, blocked) = mpsc::channel::<()>();
    rt.lp.post(move || {
        let _ = blocked_tx.send(());
        let _ = wait.recv_timeout(common::DEADLINE);
    });
    blocked.recv_timeout(common::DEADLINE).unwrap();
    let payload = vec![7u8; 60_000];
    let mut accepted = Vec::new();
    for k in 0..64u64 {
        match client
            .b
            .send_data_copy(client.conn(addr), &[&payload], &[], k)
        {
            Ok(()) => accepted.push(k),
            Err(SendError::NoResources) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(!accepted.is_empty());
    client.b.close_active_endpoint(client.conn(addr)).unwrap();
    release.send(()).unwrap();
    assert!(wait_until(
        || client.has(|e| matches!(e, Ev::Closed(_, CloseReason::Local, _)))
    ));
    for k in accepted {
        let completed = client.count(|e| *e == Ev::Completed(addr, k));
        let cancelled = client.count(|e| matches!(e, Ev::Closed(_, _, ks) if ks.contains(&k)));
        assert_eq!(completed + cancelled, 1, "key {k}");
    }
    assert!(wait_until(|| server.has(|e| matches!(
        e,
        Ev::Closed(_, CloseReason::PeerClosed, _)
    ))));
}

#[test]
fn backpressure_stops_completions_until_the_receiver_reads() {
    let receiver_loop = Running::start();
    let sender_loop = Running::start();
    let small = TcpConfig {
        send_buffer_size: Some(4096),
        recv_buffer_size: Some(4096),
        ..TcpConfig::default()
    };
    let server = Side::with(
        &receiver_loop.lp,
        BackendConfig::default(),
        small.clone(),
        Recorder {
            skip_data: true,
            ..Recorder::default()
        },
    );
    let client = Side::with(
        &sender_loop.lp,
        BackendConfig {
            send_queue_depth: 8,
            ..BackendConfig::default()
        },
        small,
        Recorder::default(),
    );
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(70_000, 2),
        ConnectionParams::default(),
    );
    // Block the receiver's loop thread until released (bounded).
    let (release, wait) = mpsc::channel::<()>();
    let (blocked_tx, blocked) = mpsc::channel::<()>();
    receiver_loop.lp.post(move || {
        let _ = blocked_tx.send(());
        let _ = wait.recv_timeout(common::DEADLINE);
    });
    blocked.recv_timeout(common::DEADLINE).unwrap();
    let payload = vec![1u8; 64_000];
    let completed = || client.count(|e| matches!(e, Ev::Completed(..)));
    let mut sent = 0u64;
    let mut stalled = false;
    let end = std::time::Instant::now() + common::DEADLINE;
    while std::time::Instant::now() < end && sent < 10_000 {
        match client
            .b
            .send_data_copy(client.conn(addr), &[&payload], &[], sent)
        {
            Ok(()) => sent += 1,
            Err(SendError::NoResources) => {
                // Backpressure holds when completions stop for a while
                // (the receiver reads nothing); otherwise keep sending.
                let before = completed();
                let window = std::time::Instant::now() + std::time::Duration::from_millis(500);
                let mut progressed = false;
                while std::time::Instant::now() < window {
                    if completed() > before {
                        progressed = true;
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                if !progressed {
                    stalled = true;
                    break;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(stalled, "sent {sent} without backpressure");
    assert!(completed() < sent as usize);
    assert!(matches!(
        client
            .b
            .send_data_copy(client.conn(addr), &[&payload], &[], sent),
        Err(SendError::NoResources)
    ));
    release.send(()).unwrap();
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == sent as usize));
    assert!(wait_until(
        || server.data_count.load(Ordering::SeqCst) == sent as usize
    ));
}

#[test]
fn closing_a_listener_closes_what_it_accepted() {
    let rt = Running::start();
    let (server, client, addr, peer) = default_pair(&rt);
    server.b.close_listen_endpoint(addr).unwrap();
    assert!(matches!(
        server.b.close_listen_endpoint(addr),
        Err(CloseError::UnknownListenEndpoint(_))
    ));
    assert!(wait_until(|| server.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::ListenerClosed, _) if *r == peer)
    )));
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == addr)
    )));
    // Nothing listens there any more.
    client.b.open_active_endpoint(addr, params()).unwrap();
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Refused(r, RefuseReason::Refused) if *r == addr)
    )));
}

#[test]
fn connecting_to_a_closed_port_is_refused_and_can_be_retried() {
    let rt = Running::start();
    let client = Side::new(&rt.lp, BackendConfig::default());
    let port = StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = EndpointAddress::localhost(port);
    client.b.open_active_endpoint(addr, params()).unwrap();
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Refused(r, RefuseReason::Refused) if *r == addr)
    )));
    client.b.open_active_endpoint(addr, params()).unwrap();
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Refused(..)))
        == 2));
}

#[test]
fn closing_a_connection_still_opening_is_a_cancelled_refusal() {
    let rt = Running::start();
    let client = Side::new(&rt.lp, BackendConfig::default());
    // A listener that accepts at the TCP level but never speaks.
    let silent = StdListener::bind("127.0.0.1:0").unwrap();
    let addr = EndpointAddress::from(silent.local_addr().unwrap());
    let conn = client.b.open_active_endpoint(addr, params()).unwrap();
    // Still opening: no sends yet, but its address is known.
    assert!(matches!(
        client.b.send_data_copy(conn, &[b"x"], &[], 1),
        Err(SendError::UnknownConnection(_))
    ));
    assert_eq!(client.b.remote_address(conn).unwrap(), addr);
    assert_eq!(client.b.connection_to(addr).unwrap(), conn);
    client.b.close_active_endpoint(conn).unwrap();
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Refused(r, RefuseReason::Cancelled) if *r == addr)
    )));
    assert!(client
        .log()
        .iter()
        .any(|(c, e)| *c == conn && matches!(e, Ev::Refused(..))));
    assert!(!client.has(|e| matches!(e, Ev::Closed(..) | Ev::Established(..))));
}

#[test]
fn operations_report_their_documented_errors() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let b = &server.b;
    let nowhere = EndpointAddress::localhost(9);
    assert!(matches!(
        b.open_listen_endpoint("224.0.0.1:0".parse().unwrap(), params()),
        Err(OpenListenError::InvalidEndpointAddress { .. })
    ));
    assert!(matches!(
        b.open_active_endpoint("0.0.0.0:80".parse().unwrap(), params()),
        Err(OpenActiveError::InvalidEndpointAddress { .. })
    ));
    assert!(matches!(
        b.open_active_endpoint(EndpointAddress::localhost(0), params()),
        Err(OpenActiveError::InvalidEndpointAddress { .. })
    ));
    assert!(matches!(
        b.open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(0, 1)
        ),
        Err(OpenListenError::InvalidConnectionParameters(_))
    ));
    assert!(matches!(
        b.open_active_endpoint(
            EndpointAddress::localhost(1),
            ConnectionParams::receive(8, 1).with_shared_receive()
        ),
        Err(OpenActiveError::InvalidConnectionParameters(_))
    ));
    let addr = b
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .unwrap();
    assert!(matches!(
        b.open_listen_endpoint(addr, params()),
        Err(OpenListenError::ListenEndpointAlreadyExists(a)) if a == addr
    ));
    // A port someone else holds.
    let other = StdListener::bind("127.0.0.1:0").unwrap();
    let taken = EndpointAddress::from(other.local_addr().unwrap());
    assert!(matches!(
        b.open_listen_endpoint(taken, params()),
        Err(OpenListenError::FailedOpenListenEndpoint { .. })
    ));
    // An address that is not local.
    assert!(matches!(
        b.open_listen_endpoint("192.0.2.1:0".parse().unwrap(), params()),
        Err(OpenListenError::FailedOpenListenEndpoint { .. })
    ));
    let never = common::NEVER_ISSUED;
    assert!(matches!(
        b.send_data_copy(never, &[b"x"], &[], 1),
        Err(SendError::UnknownConnection(c)) if c == never
    ));
    assert!(matches!(
        b.get_buffer(never),
        Err(BufferError::UnknownConnection(_))
    ));
    assert!(matches!(
        b.close_active_endpoint(never),
        Err(CloseError::UnknownConnection(_))
    ));
    assert!(matches!(
        b.connection_to(nowhere),
        Err(ConnError::NoConnectionTo(a)) if a == nowhere
    ));
    assert!(matches!(
        b.remote_address(never),
        Err(ConnError::UnknownConnection(_))
    ));
    assert!(matches!(
        b.close_listen_endpoint(nowhere),
        Err(CloseError::UnknownListenEndpoint(_))
    ));
    // Unspecified listen addresses keep their IP.
    let any = b
        .open_listen_endpoint("0.0.0.0:0".parse().unwrap(), params())
        .unwrap();
    assert!(any.ip().is_unspecified() && any.port() != 0);
}

#[test]
fn thread_unsafe_mode_refuses_calls_off_the_loop_thread() {
    let rt = Running::start();
    let server = Side::new(
        &rt.lp,
        BackendConfig::with_thread_safety(ThreadSafety::Unsafe),
    );
    let client = Side::new(
        &rt.lp,
        BackendConfig::with_thread_safety(ThreadSafety::Unsafe),
    );
    let any = EndpointAddress::localhost(0);
    assert!(matches!(
        server.b.open_listen_endpoint(any, params()),
        Err(OpenListenError::WrongThread)
    ));
    assert!(matches!(
        client.b.send_data_copy(client.conn(any), &[b"x"], &[], 1),
        Err(SendError::WrongThread)
    ));
    assert!(matches!(
        client.b.get_buffer(client.conn(any)),
        Err(BufferError::WrongThread)
    ));
    let (_, conn) = connect_on_loop(&rt, &server, &client, any);
    let cb = client.b.clone();
    rt.on_loop(move || cb.send_data_copy(conn, &[b"on loop"], &[], 1))
        .unwrap();
    assert!(wait_until(|| server.data() == vec![b"on loop".to_vec()]));
}

/// Listens on `at` with `server` and connects `client` to it, calling both
/// on the loop thread (as thread-unsafe mode requires); waits for the
/// client's `Established`. Returns the listener's address and the handle.
fn connect_on_loop(
    rt: &Running,
    server: &Side,
    client: &Side,
    at: EndpointAddress,
) -> (EndpointAddress, ConnId) {
    let sb = server.b.clone();
    let addr = rt
        .on_loop(move || sb.open_listen_endpoint(at, params()))
        .unwrap();
    let cb = client.b.clone();
    let conn = rt
        .on_loop(move || cb.open_active_endpoint(addr, params()))
        .unwrap();
    assert!(wait_until(
        || client.has(|e| matches!(e, Ev::Established(..)))
    ));
    (addr, conn)
}

/// A thread-unsafe backend keeps its state without a lock, reachable on
/// the loop thread only: what must work from any thread still does
/// (`memory_usage`, `wake`, `Debug`), and `queued_send_bytes` answers on
/// the loop thread and `None` elsewhere, never a guess.
#[test]
fn thread_unsafe_mode_answers_the_any_thread_calls_without_reaching_into_loop_state() {
    let rt = Running::start();
    let cfg = BackendConfig::with_thread_safety(ThreadSafety::Unsafe);
    let server = Side::new(&rt.lp, cfg.clone());
    let client = Side::new(&rt.lp, cfg);
    let (_, conn) = connect_on_loop(&rt, &server, &client, EndpointAddress::localhost(0));
    // params(): 8 x 4096 receive and 4 x 4096 send buffers per connection,
    // and the listener's accepted connection has its own.
    let per_conn = 8 * 4096;
    assert_eq!(client.b.memory_usage().receive_bytes, per_conn);
    assert_eq!(client.b.memory_usage().send_bytes, 4 * 4096);
    assert!(wait_until(
        || server.b.memory_usage().receive_bytes == per_conn
    ));
    assert_eq!(client.b.queued_send_bytes(), None, "off the loop thread");
    let cb = client.b.clone();
    assert_eq!(rt.on_loop(move || cb.queued_send_bytes()), Some(0));
    let shown = format!("{:?}", client.b);
    assert!(shown.contains("Unsafe"), "{shown}");
    client.b.wake(7);
    assert!(wait_until(
        || *client.shared.wakes.lock().unwrap() == vec![7]
    ));
    // Closing gives the connection's pools back: the tally follows.
    let cb = client.b.clone();
    rt.on_loop(move || cb.close_active_endpoint(conn)).unwrap();
    assert_eq!(client.b.memory_usage(), netio_core::MemoryUsage::default());
    assert!(wait_until(|| server.b.memory_usage().receive_bytes == 0));
}

/// The counters: messages and bytes each way per connection, `NoResources`
/// answers and the high-water mark of sends in flight, and the backend's
/// connections by outcome with the traffic of closed ones kept.
#[test]
fn stats_count_traffic_push_backs_and_connection_outcomes() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(
        &rt.lp,
        BackendConfig {
            send_queue_depth: 2,
            ..BackendConfig::default()
        },
    );
    let (addr, peer) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params(),
        params(),
    );
    let conn = client.conn(addr);
    let s_conn = server.conn(peer);
    // On the loop thread, so that nothing completes between the sends:
    // two copy sends (10 bytes, and 4 + 20), a third answered NoResources.
    let cb = client.b.clone();
    let third = rt.on_loop(move || {
        cb.send_data_copy(conn, &[&[1; 10]], &[], 1).unwrap();
        cb.send_data_copy(conn, &[&[2; 20]], b"head", 2).unwrap();
        cb.send_data_copy(conn, &[&[3; 5]], &[], 3)
    });
    assert!(matches!(third, Err(SendError::NoResources)), "{third:?}");
    assert!(wait_until(|| client.has(|e| *e == Ev::Completed(addr, 2))));
    let mut buf = client.b.get_buffer(conn).unwrap().unwrap();
    buf.write(&[4; 7]).unwrap();
    client.b.send_buffer(conn, buf, 4).unwrap();
    assert!(wait_until(|| server.data().len() == 3));

    let c = client.b.connection_stats(conn).unwrap();
    assert_eq!((c.messages_sent, c.bytes_sent), (3, 10 + 24 + 7));
    assert_eq!((c.no_resources, c.max_in_flight), (1, 2));
    assert_eq!((c.messages_received, c.bytes_received), (0, 0));
    // A read's messages are counted when the read ends, after their
    // `on_data`.
    let received = || {
        let s = server.b.connection_stats(s_conn).unwrap();
        (s.messages_received, s.bytes_received)
    };
    assert!(wait_until(|| received() == (3, 41)), "{:?}", received());
    let s = server.b.connection_stats(s_conn).unwrap();
    assert_eq!(s.messages_sent, 0);

    client.b.close_active_endpoint(conn).unwrap();
    assert!(wait_until(|| server.has(|e| matches!(e, Ev::Closed(..)))));
    assert!(client.b.connection_stats(conn).is_err(), "stale handle");
    let cs = client.b.stats().unwrap();
    assert_eq!(
        (
            cs.connections_opened,
            cs.connections_established,
            cs.closed_local
        ),
        (1, 1, 1)
    );
    assert_eq!(cs.traffic, c, "a closed connection's counts are kept");
    let ss = server.b.stats().unwrap();
    assert_eq!(
        (
            ss.connections_accepted,
            ss.connections_established,
            ss.closed_by_peer
        ),
        (1, 1, 1)
    );
    assert_eq!(
        (ss.traffic.messages_received, ss.traffic.bytes_received),
        (3, 41)
    );
    assert_eq!(
        (
            ss.connections_refused,
            ss.admission_refusals,
            ss.closed_reset
        ),
        (0, 0, 0)
    );
}

#[test]
fn handlers_reply_and_close_from_inside_callbacks() {
    let rt = Running::start();
    // The server echoes every message, and closes on "bye".
    let echo = Recorder {
        on_data: Some(Box::new(|b, r, d| {
            if d == b"bye" {
                b.close_active_endpoint(r).unwrap();
            } else {
                b.send_data_copy(r, &[d], b"re:", 0).unwrap();
            }
        })),
        ..Recorder::default()
    };
    let server = Side::with(&rt.lp, BackendConfig::default(), TcpConfig::default(), echo);
    // The client sends on establishment, from inside the callback.
    let greet = Recorder {
        on_established: Some(Box::new(|b, r| {
            b.send_data_copy(r, &[b"one"], &[], 1).unwrap();
            b.send_data_copy(r, &[b"two"], &[], 2).unwrap();
            b.send_data_copy(r, &[b"bye"], &[], 3).unwrap();
        })),
        ..Recorder::default()
    };
    let client = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig::default(),
        greet,
    );
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params(),
        params(),
    );
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == addr)
    )));
    // Replies queued before the close either went out (in order) or were
    // cancelled by it.
    let got = client.data();
    let want = [b"re:one".to_vec(), b"re:two".to_vec()];
    assert!(want.starts_with(&got), "{got:?}");
    assert!(wait_until(
        || server.has(|e| matches!(e, Ev::Closed(_, CloseReason::Local, _)))
    ));
    // Nothing after the close.
    let evs = server.events();
    let closed_at = evs
        .iter()
        .position(|e| matches!(e, Ev::Closed(..)))
        .unwrap();
    assert!(evs[closed_at + 1..]
        .iter()
        .all(|e| !matches!(e, Ev::Data(..))));
}

#[test]
fn shared_pools_keep_memory_constant_as_connections_grow() {
    let rt = Running::start();
    let config = BackendConfig {
        shared_receive_pool: Some(PoolParams::new(2048, 8)),
        shared_send_pool: Some(PoolParams::new(1024, 8)),
        ..BackendConfig::default()
    };
    let server = Side::new(&rt.lp, config.clone());
    let client = Side::new(&rt.lp, config);
    let listen_params = ConnectionParams::receive(4096, 4).with_shared_receive();
    let addr = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), listen_params)
        .unwrap();
    let before = server.b.memory_usage();
    assert_eq!(before.receive_bytes, 2048 * 8 + 4096 * 4);
    assert_eq!(before.send_bytes, 1024 * 8);
    // Three clients from three backends (one connection each).
    let mut clients = vec![client];
    for _ in 0..2 {
        clients.push(Side::new(&rt.lp, BackendConfig::default()));
    }
    for c in &clients {
        c.b.open_active_endpoint(addr, ConnectionParams::default())
            .unwrap();
    }
    assert!(wait_until(|| server
        .count(|e| matches!(e, Ev::Established(..)))
        == 3));
    assert_eq!(server.b.memory_usage(), before);
    // Every connection's get_buffer hands out the shared send pool.
    let remotes: Vec<ConnId> = server
        .log()
        .iter()
        .filter_map(|(conn, e)| match e {
            Ev::Established(_, c) => {
                assert!(c.send_buffered && c.receive);
                Some(*conn)
            }
            _ => None,
        })
        .collect();
    let held: Vec<_> = (0..8)
        .map(|i| server.b.get_buffer(remotes[i % 3]).unwrap().unwrap())
        .collect();
    assert!(server.b.get_buffer(remotes[0]).unwrap().is_none());
    drop(held);
    assert_eq!(
        server
            .b
            .get_buffer(remotes[1])
            .unwrap()
            .map(|b| b.capacity()),
        Some(1024)
    );
}

#[test]
fn a_dropped_backend_closes_its_connections_in_order() {
    let rt = Running::start();
    let (server, client, addr, _) = default_pair(&rt);
    drop(server);
    // An idle connection has room for the goodbye: an orderly close.
    assert!(wait_until(|| client.has(
        |e| matches!(e, Ev::Closed(r, CloseReason::PeerClosed, _) if *r == addr)
    )));
}

#[test]
fn large_messages_share_a_small_receive_pool_without_loss() {
    let rt = Running::start();
    // One shared buffer of 100 kB: two connections assembling large messages
    // at once take turns (the second stops reading until the buffer is
    // free).
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            read_buffer_size: 4096,
            ..TcpConfig::default()
        },
        Recorder::default(),
    );
    let addr = server
        .b
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(100_000, 1).with_shared_receive(),
        )
        .unwrap();
    let clients: Vec<Side> = (0..3)
        .map(|_| Side::new(&rt.lp, BackendConfig::default()))
        .collect();
    for c in &clients {
        c.b.open_active_endpoint(addr, ConnectionParams::default())
            .unwrap();
    }
    assert!(wait_until(|| clients
        .iter()
        .all(|c| c.has(|e| matches!(e, Ev::Established(..))))));
    let msg = |i: u8| vec![i; 100_000];
    for round in 0..3u8 {
        for (i, c) in clients.iter().enumerate() {
            let m = msg(round * 3 + i as u8);
            c.b.send_data_copy(c.conn(addr), &[&m], &[], u64::from(round))
                .unwrap();
        }
    }
    let ok = wait_until(|| server.data_count.load(Ordering::SeqCst) == 9);
    assert!(
        ok,
        "{} {:?}",
        server.data_count.load(Ordering::SeqCst),
        server
            .events()
            .iter()
            .filter(|e| !matches!(e, Ev::Data(..)))
            .collect::<Vec<_>>()
    );
    let mut got: Vec<u8> = server
        .data()
        .iter()
        .map(|d| {
            assert_eq!(d.len(), 100_000);
            assert!(d.iter().all(|&b| b == d[0]));
            d[0]
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0..9).collect::<Vec<u8>>());
    assert!(!server.has(|e| matches!(e, Ev::Closed(..))));
}

#[test]
fn a_zero_copy_message_of_more_slices_than_one_write_takes_arrives_whole() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let region = MemoryRegion::from_vec((0..10_000u32).map(|i| (i % 251) as u8).collect());
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(20_000, 4),
        ConnectionParams::default().with_zero_copy(region.clone()),
    );
    // 1200 slices of 7 bytes, backwards through the region.
    let slices: Vec<_> = (0..1200)
        .rev()
        .map(|i| region.slice(i * 8, 7).unwrap())
        .collect();
    let mut want = b"head".to_vec();
    let mut chunk = [0u8; 7];
    for s in &slices {
        region.read(s.offset(), &mut chunk).unwrap();
        want.extend_from_slice(&chunk);
    }
    for k in 0..3 {
        client
            .b
            .send_data(client.conn(addr), &slices, b"head", k)
            .unwrap();
    }
    assert!(wait_until(|| server.data().len() == 3));
    assert!(server.data().iter().all(|d| *d == want));
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == 3));
}
