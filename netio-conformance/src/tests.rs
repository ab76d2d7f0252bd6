//! The behaviours, one function each, generic over the [`Harness`].
//!
//! Each is called by a `#[test]` of the same name that [`suite!`](crate::suite)
//! generates. They panic (fail) with a message saying which rule of the
//! contract broke.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use netio_core::{
    Backend, BackendConfig, BufferError, BufferPool, CloseError, CloseReason, ConnError, ConnId,
    ConnectionParams, CopyMessage, EndpointAddress, EventLoop, Features, MemoryRegion,
    NetworkBuffer, OpenActiveError, OpenListenError, PoolParams, RefuseReason, SendError, Signal,
    ThreadSafety, Timer, MAX_HEADER_LEN,
};

use crate::ctx::{connect_target, full_params, Ctx, Node, SendMode, Turn};
use crate::harness::Harness;
use crate::recorder::{Close, Event, React};

/// Wall-clock bound for loops run by the event loop tests themselves.
const WATCHDOG: Duration = Duration::from_secs(20);

fn copy_supported<H: Harness>(c: &Ctx<H>) -> bool {
    c.h.features().send_copy
}

fn zc_supported<H: Harness>(c: &Ctx<H>) -> bool {
    c.h.features().send_zero_copy
}

// ---------------------------------------------------------------- connections

/// Listening on port 0 returns the bound port, and it accepts connections.
pub fn listen_on_port_zero_returns_bound_port<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    let addr = c.listen(&s, ConnectionParams::receive(64, 4));
    assert_ne!(
        addr.port(),
        0,
        "the returned address must carry the bound port"
    );
    assert!(
        addr.ip() == s.ip || addr.ip().is_unspecified(),
        "listened on {} but got {addr}",
        s.ip
    );
    let target = connect_target(addr, s.ip);
    c.connect(&s, &cl, target, ConnectionParams::buffered(64, 4));
}

/// Listening twice on the same address fails with `ListenEndpointAlreadyExists`.
pub fn listening_twice_on_one_address_fails_with_already_exists<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let addr = c.listen(&s, ConnectionParams::receive(64, 4));
    let r = c.call(&s, move |b| {
        b.open_listen_endpoint(addr, ConnectionParams::receive(64, 4))
    });
    match r {
        Err(OpenListenError::ListenEndpointAlreadyExists(a)) => assert_eq!(a, addr),
        other => {
            panic!("second listen on {addr}: expected ListenEndpointAlreadyExists, got {other:?}")
        }
    }
    assert!(s.log.is_empty(), "a refused listen must report nothing");
}

/// Unusable addresses fail at once with `InvalidEndpointAddress`, naming the
/// address: multicast and broadcast ones to listen on; unspecified, port 0,
/// multicast and broadcast ones to connect to.
pub fn bad_addresses_fail_clearly<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    for (bad, named) in [
        (EndpointAddress::v4(224, 0, 0, 1, 0), "224.0.0.1"),
        (
            EndpointAddress::v4(255, 255, 255, 255, 0),
            "255.255.255.255",
        ),
    ] {
        let r = c.call(&s, move |b| {
            b.open_listen_endpoint(bad, ConnectionParams::receive(64, 4))
        });
        match r {
            Err(e @ OpenListenError::InvalidEndpointAddress { .. }) => {
                assert!(
                    e.to_string().contains(named),
                    "error must name the address: {e}"
                )
            }
            other => panic!("listen on {bad}: expected InvalidEndpointAddress, got {other:?}"),
        }
    }
    let ip = s.ip;
    for bad in [
        EndpointAddress::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 80),
        EndpointAddress::new(ip, 0),
        EndpointAddress::v4(239, 1, 1, 1, 80),
        EndpointAddress::v4(255, 255, 255, 255, 80),
    ] {
        let r = c.call(&s, move |b| {
            b.open_active_endpoint(bad, ConnectionParams::buffered(64, 4))
        });
        match r {
            Err(e @ OpenActiveError::InvalidEndpointAddress { .. }) => {
                assert!(
                    e.to_string().contains(&bad.to_string()),
                    "error must name {bad}: {e}"
                )
            }
            other => panic!("connect to {bad}: expected InvalidEndpointAddress, got {other:?}"),
        }
    }
    c.settle();
    assert!(
        s.log.is_empty(),
        "rejected calls must report nothing: {:?}",
        s.log
    );
}

/// A connection is reported established on both sides, each with the
/// capabilities its own parameters give.
pub fn connect_establishes_on_both_sides_with_capabilities<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let sp = ConnectionParams::receive(128, 4);
    let cp = ConnectionParams::buffered(128, 4);
    let p = c.pair(sp.clone(), cp.clone());
    let cfg = c.config();
    let client_caps = p
        .client
        .log
        .established_caps(p.to_server)
        .expect("client established");
    assert_eq!(client_caps, cp.capabilities(&cfg, copy));
    assert!(client_caps.send_buffered && !client_caps.receive && !client_caps.send_zero_copy);
    let server_caps = p
        .server
        .log
        .established_caps(p.to_client)
        .expect("server established");
    assert_eq!(server_caps, sp.capabilities(&cfg, copy));
    assert!(server_caps.receive && !server_caps.send_buffered && !server_caps.send_zero_copy);
    assert_eq!(
        p.accepted.ip(),
        p.client.ip,
        "the server reports the client's address as the connection's remote address"
    );
    assert_eq!(
        p.client.log.established()[0].1,
        p.listen,
        "the client reports the listener's address as the remote address"
    );
    assert_eq!(p.client.log.established().len(), 1);
    assert_eq!(p.server.log.established().len(), 1);
}

/// Capabilities follow the parameters: a count of 0 or no region means the
/// capability was not requested.
pub fn capabilities_follow_params<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let s = c.node();
    let listen = c.listen(&s, ConnectionParams::receive(64, 4));
    let listen = connect_target(listen, s.ip);
    let mut cases = vec![
        ConnectionParams::default(),
        ConnectionParams::receive(64, 0),
        ConnectionParams::buffered(64, 0),
        ConnectionParams::receive(64, 2),
        ConnectionParams::buffered(64, 2),
    ];
    if zc_supported(&c) {
        cases.push(ConnectionParams::default().with_zero_copy(MemoryRegion::new(64)));
    }
    let cfg = c.config();
    for params in cases {
        let cl = c.node();
        let expected = params.capabilities(&cfg, copy);
        let conn = c.connect(&s, &cl, listen, params.clone()).client;
        let got = cl.log.established_caps(conn).unwrap();
        assert_eq!(got, expected, "capabilities for {params:?}");
    }
    let caps = ConnectionParams::receive(64, 0).capabilities(&cfg, copy);
    assert!(!caps.receive && !caps.send_buffered && !caps.send_zero_copy);
}

/// A listener's parameters apply to every connection it accepts.
pub fn listener_params_apply_to_every_accepted_connection<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let s = c.node();
    let sp = full_params(96, 3);
    let listen = connect_target(c.listen(&s, sp.clone()), s.ip);
    let mut accepted = Vec::new();
    for _ in 0..3 {
        let cl = c.node();
        accepted.push(
            c.connect(&s, &cl, listen, ConnectionParams::receive(96, 3))
                .server,
        );
    }
    let want = sp.capabilities(&c.config(), copy);
    for a in accepted {
        assert_eq!(
            s.log.established_caps(a),
            Some(want),
            "accepted connection {a}"
        );
        let (buf, lw) = c.call(&s, move |b| {
            let buf = b
                .get_buffer(a)
                .expect("get_buffer on an accepted connection");
            (
                buf.map(|b| b.capacity()),
                b.num_available_buffers(a).unwrap(),
            )
        });
        assert_eq!(
            buf,
            Some(96),
            "accepted connection {a} must have the listener's send buffers"
        );
        assert_eq!(lw, 2, "three buffers, one taken: low-water mark 2");
    }
}

/// Connecting where nothing listens reports `on_connection_refused`, with
/// the handle `open_active_endpoint` returned, to the initiator only; the
/// handle is stale afterwards, and opening again works.
pub fn connecting_to_nothing_is_refused_on_initiator_only<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    // A listener that is closed again: nothing listens there any more.
    let listen = connect_target(c.listen(&s, ConnectionParams::receive(64, 2)), s.ip);
    c.call(&s, move |b| b.close_listen_endpoint(listen))
        .unwrap();
    c.settle();
    let mut handles = Vec::new();
    for attempt in 0..2 {
        let conn = c
            .call(&cl, move |b| {
                b.open_active_endpoint(listen, ConnectionParams::buffered(64, 2))
            })
            .unwrap_or_else(|e| panic!("attempt {attempt}: open_active_endpoint failed: {e}"));
        let log = cl.log.clone();
        c.wait("the connection is refused", || {
            log.refused().len() > attempt
        });
        let (refused, remote, reason) = cl.log.refused()[attempt].clone();
        assert_eq!(
            refused, conn,
            "the refusal carries the handle open_active_endpoint returned"
        );
        assert_eq!(remote, listen);
        assert_eq!(reason, RefuseReason::Refused, "nothing listens at {listen}");
        let stale = c.call(&cl, move |b| b.remote_address(conn));
        assert!(
            matches!(stale, Err(ConnError::UnknownConnection(x)) if x == conn),
            "the handle of a refused connection is stale: remote_address gave {stale:?}"
        );
        handles.push(conn);
    }
    assert_ne!(handles[0], handles[1], "each attempt has its own handle");
    let other = c.h.refusing_address();
    c.call(&cl, move |b| {
        b.open_active_endpoint(other, ConnectionParams::buffered(64, 2))
    })
    .unwrap();
    let log = cl.log.clone();
    c.wait("the connection to the refusing address is refused", || {
        log.refused().len() == 3
    });
    c.settle();
    assert!(
        cl.log.established().is_empty(),
        "no connection may be established"
    );
    assert!(
        cl.log.closed().is_empty(),
        "a refused connection is not closed"
    );
    assert!(
        s.log.is_empty(),
        "the other side hears nothing: {:?}",
        s.log
    );
}

/// Both sides of a connection can send.
pub fn connections_are_bidirectional<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    c.send_buffered(&p.client, p.to_server, b"ping".to_vec());
    c.send_buffered(&p.server, p.to_client, b"pong".to_vec());
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("both messages arrive", || {
        !sl.data_on(p.to_client).is_empty() && !cl.data_on(p.to_server).is_empty()
    });
    assert_eq!(p.server.log.data_on(p.to_client), vec![b"ping".to_vec()]);
    assert_eq!(p.client.log.data_on(p.to_server), vec![b"pong".to_vec()]);
}

/// After a connection is closed, a new connection to the same address
/// works, with new handles on both sides.
pub fn reopening_after_close_works<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    let to_server = p.to_server;
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .unwrap();
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("both sides report the close", || {
        cl.closed_count(to_server) == 1 && sl.closed_count(p.to_client) == 1
    });
    let again = c.connect(&p.server, &p.client, p.listen, full_params(64, 4));
    assert!(
        again.client != to_server && again.server != p.to_client,
        "a new connection gets new handles: {again:?} after {to_server} and {}",
        p.to_client
    );
    c.send_buffered(&p.client, again.client, b"again".to_vec());
    let sl = p.server.log.clone();
    c.wait("the message on the new connection arrives", || {
        !sl.data_on(again.server).is_empty()
    });
    assert_eq!(p.server.log.data_on(again.server), vec![b"again".to_vec()]);
    assert_eq!(p.client.log.established().len(), 2);
}

/// A connection with more receive buffers than a provider's default
/// receive queue holds (1,024, all posted at once on RDMA providers) opens
/// on both sides and carries 1,024 messages each way, in order.
pub fn a_connection_with_1024_receive_buffers_opens_and_carries_1024_messages_each_way<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    const N: u64 = 1024;
    let mut c = Ctx::<H>::new(mode);
    // Send buffers too, for a provider without copy sends.
    let params = ConnectionParams::receive(64, N as usize).with_buffered(64, 64);
    let p = c.pair(params.clone(), params);
    for i in 0..N {
        c.send_copy_or_buffered(&p.client, p.to_server, i.to_le_bytes().to_vec(), i);
        c.send_copy_or_buffered(&p.server, p.to_client, i.to_le_bytes().to_vec(), i);
    }
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("1,024 messages arrive each way", || {
        sl.data_on(p.to_client).len() == N as usize && cl.data_on(p.to_server).len() == N as usize
    });
    let expected: Vec<Vec<u8>> = (0..N).map(|i| i.to_le_bytes().to_vec()).collect();
    assert_eq!(
        p.server.log.data_on(p.to_client),
        expected,
        "client to server"
    );
    assert_eq!(
        p.client.log.data_on(p.to_server),
        expected,
        "server to client"
    );
}

// -------------------------------------------------------------- buffered send

/// A buffered send delivers exactly the bytes written, including an empty
/// message and one of every byte value.
pub fn buffered_send_delivers_exact_bytes<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(512, 4),
        ConnectionParams::buffered(512, 4),
    );
    let all: Vec<u8> = (0..=255u8).collect();
    let msgs = vec![
        all.clone(),
        Vec::new(),
        b"x".to_vec(),
        all.iter().rev().copied().collect(),
    ];
    for m in &msgs {
        c.send_buffered(&p.client, p.to_server, m.clone());
    }
    let sl = p.server.log.clone();
    c.wait("all messages arrive", || {
        sl.data_on(p.to_client).len() >= msgs.len()
    });
    assert_eq!(p.server.log.data_on(p.to_client), msgs);
}

/// A buffered send completes (or is cancelled) with the key its caller
/// gave `send_buffer`, whatever the buffer's index.
pub fn buffered_send_completes_with_the_callers_key<H: Harness>(mode: ThreadSafety) {
    const KEYS: [u64; 3] = [0xdead_beef, u64::MAX, 7_000_000];
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::buffered(64, 3),
    );
    let to_server = p.to_server;
    // On the loop thread, so that the three are accepted in this order.
    c.on_loop(&p.client, move |b| {
        let bufs: Vec<_> = (0..3)
            .map(|_| b.get_buffer(to_server).unwrap().unwrap())
            .collect();
        for (mut buf, key) in bufs.into_iter().zip(KEYS) {
            buf.write(&key.to_le_bytes()).unwrap();
            b.send_buffer(to_server, buf, key).unwrap();
        }
    });
    let cl = p.client.log.clone();
    c.wait("three completions", || cl.completed(to_server).len() >= 3);
    c.settle();
    assert_eq!(
        p.client.log.completed(to_server),
        KEYS.to_vec(),
        "buffered sends complete with the caller's keys, in send order"
    );
    // A cancelled buffered send is reported with the caller's key too.
    let s2 = c.node();
    let listen2 = connect_target(c.listen(&s2, ConnectionParams::receive(64, 4)), s2.ip);
    let other = c.connect(&s2, &p.client, listen2, ConnectionParams::buffered(64, 2));
    let conn = other.client;
    c.on_loop(&p.client, move |b| {
        for key in [41u64, 42] {
            let mut buf = b.get_buffer(conn).unwrap().unwrap();
            buf.write(b"bye").unwrap();
            b.send_buffer(conn, buf, key).unwrap();
        }
        b.close_active_endpoint(conn).unwrap();
    });
    c.wait("the close is reported", || cl.closed_count(conn) == 1);
    c.settle();
    assert_each_key_once(&p.client, conn, &[41, 42], "the closing side");
}

/// `get_buffer` gives `None` when every buffer is out, and buffers come back
/// after their sends complete (or when an unsent buffer is dropped).
pub fn get_buffer_gives_none_when_pool_empty_and_buffers_return_after_completion<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::buffered(64, 2),
    );
    let to_server = p.to_server;
    let (a, b2, third) = c.call(&p.client, move |b| {
        let a = b.get_buffer(to_server).unwrap();
        let b2 = b.get_buffer(to_server).unwrap();
        let third = b.get_buffer(to_server).unwrap();
        (a, b2, third.is_none())
    });
    let (a, b2) = (a.expect("first buffer"), b2.expect("second buffer"));
    assert!(
        third,
        "a pool of two must be empty after two get_buffer calls"
    );
    drop(a);
    let again = c.call(&p.client, move |b| {
        b.get_buffer(to_server).unwrap().map(|x| x.index())
    });
    assert!(again.is_some(), "a dropped buffer returns to the pool");
    drop(b2);
    // On the loop thread, so that no completion returns a buffer meanwhile.
    let sent = c.on_loop(&p.client, move |b| {
        let mut n = 0;
        while let Some(mut buf) = b.get_buffer(to_server).unwrap() {
            buf.write(b"m").unwrap();
            b.send_buffer(to_server, buf, n).unwrap();
            n += 1;
            if n > 2 {
                break;
            }
        }
        (n, b.get_buffer(to_server).unwrap().is_none())
    });
    assert_eq!(sent.0, 2, "exactly the pool's two buffers can be in flight");
    assert!(sent.1, "no buffer while both are in flight");
    let cl = p.client.log.clone();
    c.wait("both sends complete", || cl.completed(to_server).len() == 2);
    let back = c.call(&p.client, move |b| {
        let x = b.get_buffer(to_server).unwrap();
        let y = b.get_buffer(to_server).unwrap();
        x.is_some() && y.is_some()
    });
    assert!(back, "both buffers are free again after completion");
}

/// A buffer that does not belong to the connection's pool is rejected with
/// `ForeignBuffer`, and nothing is sent.
pub fn foreign_buffer_is_rejected<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::buffered(64, 2),
    );
    let s2 = c.node();
    let listen2 = connect_target(c.listen(&s2, ConnectionParams::receive(64, 4)), s2.ip);
    let conn2 = c
        .connect(&s2, &p.client, listen2, ConnectionParams::buffered(64, 2))
        .client;
    let to_server = p.to_server;
    let (own_pool, stranger) = c.call(&p.client, move |b| {
        let mut other = b.get_buffer(conn2).unwrap().unwrap();
        other.write(b"x").unwrap();
        let r1 = b.send_buffer(to_server, other, 1);
        let pool = BufferPool::new(64, 1);
        let mut alien = pool.get().unwrap();
        alien.write(b"y").unwrap();
        let r2 = b.send_buffer(to_server, alien, 2);
        (r1, r2)
    });
    assert!(
        matches!(own_pool, Err(SendError::ForeignBuffer)),
        "another connection's buffer: {own_pool:?}"
    );
    assert!(
        matches!(stranger, Err(SendError::ForeignBuffer)),
        "a buffer of a private pool: {stranger:?}"
    );
    assert!(!own_pool.unwrap_err().is_retryable());
    c.settle();
    assert!(
        p.server.log.all_data().is_empty(),
        "nothing may be delivered"
    );
    assert!(s2.log.all_data().is_empty(), "nothing may be delivered");
    let free = c.call(&p.client, move |b| b.get_buffer(conn2).unwrap().is_some());
    assert!(free, "the rejected buffer went back to its own pool");
}

/// `get_buffer` and `num_available_buffers` on a connection without send
/// buffers fail with `NoBuffersAllocated`; `send_buffer` there answers
/// `ForeignBuffer` (a buffer of another connection's pool), and the buffer
/// is back in its own pool at once.
pub fn get_buffer_without_send_buffers_fails_with_no_buffers_allocated<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let mut cp = ConnectionParams::receive(64, 2);
    if zc_supported(&c) {
        cp = cp.with_zero_copy(MemoryRegion::new(64));
    }
    let p = c.pair(ConnectionParams::receive(64, 2), cp);
    let to_server = p.to_server;
    let (g, n) = c.call(&p.client, move |b| {
        (
            b.get_buffer(to_server).map(|o| o.is_some()),
            b.num_available_buffers(to_server),
        )
    });
    assert!(
        matches!(g, Err(BufferError::NoBuffersAllocated(a)) if a == to_server),
        "get_buffer: {g:?}"
    );
    assert!(
        matches!(n, Err(BufferError::NoBuffersAllocated(_))),
        "num_available_buffers: {n:?}"
    );
    // `send_buffer` there: any buffer the caller holds is another pool's.
    let other = c.connect(
        &p.server,
        &p.client,
        p.listen,
        ConnectionParams::receive(64, 2).with_buffered(64, 1),
    );
    let (r, again) = c.call(&p.client, move |b| {
        let buf = b
            .get_buffer(other.client)
            .expect("get_buffer")
            .expect("the other connection's only buffer");
        let r = b.send_buffer(to_server, buf, 1);
        (r, b.get_buffer(other.client).map(|o| o.is_some()))
    });
    assert!(
        matches!(r, Err(SendError::ForeignBuffer)),
        "send_buffer on a connection without send buffers answers ForeignBuffer (the buffer \
         belongs to another pool): {r:?}"
    );
    assert!(
        matches!(again, Ok(true)),
        "the refused buffer is back in its own pool at once: get_buffer there gave {again:?}"
    );
}

/// Every operation on a handle this backend never issued fails with
/// `UnknownConnection` naming the handle; `connection_to` an address
/// without a connection fails with `NoConnectionTo`.
pub fn operations_on_unknown_endpoint_fail<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let p = c.pair(
        ConnectionParams::receive(64, 2),
        ConnectionParams::buffered(64, 2),
    );
    // The server's handle means nothing to the client, nor does a made-up
    // one.
    let to_server = p.to_server;
    let mut r = Vec::new();
    for nobody in [ConnId::new(4_000_000, 77), p.to_client] {
        if nobody == to_server {
            continue;
        }
        r.push((
            nobody,
            c.call(&p.client, move |b| {
                let buf = b.get_buffer(to_server).unwrap().unwrap();
                (
                    b.get_buffer(nobody).map(|o| o.is_some()),
                    b.send_buffer(nobody, buf, 1),
                    b.send_data_copy(nobody, &[b"x"], &[], 2),
                    b.num_available_buffers(nobody),
                    b.close_active_endpoint(nobody),
                    b.pause_receive(nobody),
                    b.resume_receive(nobody),
                    b.remote_address(nobody),
                )
            }),
        ));
    }
    let elsewhere = EndpointAddress::new(p.server.ip, p.listen.port().wrapping_add(1).max(1));
    let to = c.call(&p.client, move |b| b.connection_to(elsewhere));
    assert!(
        matches!(to, Err(ConnError::NoConnectionTo(a)) if a == elsewhere),
        "connection_to an address without a connection: {to:?}"
    );
    for (nobody, r) in r {
        check_unknown(nobody, r, copy);
    }
    c.settle();
    assert!(p.client.log.completed(to_server).is_empty());
    assert!(
        p.client.log.closed().is_empty(),
        "failed calls report nothing: {:?}",
        p.client.log
    );
}

type Answers = (
    Result<bool, BufferError>,
    Result<(), SendError>,
    Result<(), SendError>,
    Result<usize, BufferError>,
    Result<(), CloseError>,
    Result<(), ConnError>,
    Result<(), ConnError>,
    Result<EndpointAddress, ConnError>,
);

/// Every answer in `r` is `UnknownConnection(nobody)`.
#[track_caller]
fn check_unknown(nobody: ConnId, r: Answers, copy: bool) {
    assert!(
        matches!(r.0, Err(BufferError::UnknownConnection(a)) if a == nobody),
        "get_buffer({nobody}): {:?}",
        r.0
    );
    assert!(
        matches!(r.1, Err(SendError::UnknownConnection(a)) if a == nobody),
        "send_buffer({nobody}): {:?}",
        r.1
    );
    // A provider without copy sends answers NotSupported to every one.
    assert!(
        match &r.2 {
            Err(SendError::UnknownConnection(a)) => *a == nobody,
            Err(SendError::NotSupported(_)) => !copy,
            _ => false,
        },
        "send_data_copy({nobody}): {:?}",
        r.2
    );
    assert!(
        matches!(r.3, Err(BufferError::UnknownConnection(a)) if a == nobody),
        "num_available_buffers({nobody}): {:?}",
        r.3
    );
    assert!(
        matches!(r.4, Err(CloseError::UnknownConnection(a)) if a == nobody),
        "close_active_endpoint({nobody}): {:?}",
        r.4
    );
    assert!(
        matches!(r.5, Err(ConnError::UnknownConnection(a)) if a == nobody),
        "pause_receive({nobody}): {:?}",
        r.5
    );
    assert!(
        matches!(r.6, Err(ConnError::UnknownConnection(a)) if a == nobody),
        "resume_receive({nobody}): {:?}",
        r.6
    );
    assert!(
        matches!(r.7, Err(ConnError::UnknownConnection(a)) if a == nobody),
        "remote_address({nobody}): {:?}",
        r.7
    );
}

/// `num_available_buffers` reports the fewest free buffers since the last
/// call, then starts over from the current number.
pub fn low_water_mark_of_free_buffers_resets_on_read<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::buffered(64, 4),
    );
    let to_server = p.to_server;
    let marks = c.call(&p.client, move |b| {
        let first = b.num_available_buffers(to_server).unwrap();
        let held: Vec<_> = (0..3)
            .map(|_| b.get_buffer(to_server).unwrap().unwrap())
            .collect();
        drop(held);
        let after_dip = b.num_available_buffers(to_server).unwrap();
        let after_reset = b.num_available_buffers(to_server).unwrap();
        (first, after_dip, after_reset)
    });
    assert_eq!(
        marks,
        (4, 1, 4),
        "(initial, after taking 3 of 4, after reading once)"
    );
}

// ------------------------------------------------------------------ zero-copy

fn zc_pair<H: Harness>(c: &mut Ctx<H>, region: &MemoryRegion) -> crate::Pair<H> {
    c.pair(
        ConnectionParams::receive(1024, 8),
        ConnectionParams::receive(1024, 8).with_zero_copy(region.clone()),
    )
}

/// The header given to `send_data` arrives in front of the payload, as one
/// message.
pub fn zero_copy_header_is_prepended_to_payload<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(256);
    region.write(10, b"payload").unwrap();
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let s = region.slice(10, 7).unwrap();
    c.call(&p.client, move |b| b.send_data(to_server, &[s], b"HDR:", 7))
        .unwrap();
    let sl = p.server.log.clone();
    c.wait("the message arrives", || {
        !sl.data_on(p.to_client).is_empty()
    });
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"HDR:payload".to_vec()]
    );
}

/// A chunk of the registered region filled in place and sent with
/// `send_chunk` arrives as written, after its header, completes with the
/// caller's key, and its range is free for the next chunk once the send
/// completed.
pub fn a_chunk_written_in_place_arrives_and_its_range_is_free_again_after_completion<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let mut chunk = region.chunk(16).expect("an empty region has a free chunk");
    let offset = chunk.offset();
    chunk.copy_from_slice(b"written in place");
    c.call(&p.client, move |b| b.send_chunk(to_server, chunk, b"H:", 5))
        .expect("send_chunk on an established zero-copy connection");
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("the chunk arrives and its send completes", || {
        !sl.data_on(p.to_client).is_empty() && cl.completed(to_server) == vec![5]
    });
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"H:written in place".to_vec()],
        "the receiver gets the header, then the chunk's bytes as written"
    );
    let again = region.chunk_at(offset, 16);
    assert!(
        again.is_ok(),
        "a completed chunk send frees its range for the next chunk: {again:?}"
    );
}

/// A refused `send_chunk` gives the chunk back unchanged, and it can be
/// sent again.
pub fn a_refused_chunk_send_gives_the_chunk_back_unchanged<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let mut chunk = region.chunk(8).expect("an empty region has a free chunk");
    chunk.copy_from_slice(b"retry me");
    let offset = chunk.offset();
    let back = c.call(&p.client, move |b| {
        match b.send_chunk(to_server, chunk, &[0u8; MAX_HEADER_LEN + 1], 1) {
            Ok(()) => Err("a 17-byte header was accepted".to_string()),
            Err(e) => match (e.error, e.chunk) {
                (SendError::HeaderTooLong { .. }, Some(ch)) => Ok(ch),
                (err, ch) => Err(format!("error {err:?}, chunk back: {}", ch.is_some())),
            },
        }
    });
    let chunk = back.expect("a refused send answers HeaderTooLong and gives the chunk back");
    assert_eq!((&chunk[..], chunk.offset()), (&b"retry me"[..], offset));
    c.call(&p.client, move |b| b.send_chunk(to_server, chunk, &[], 2))
        .expect("the chunk given back can be sent");
    let sl = p.server.log.clone();
    c.wait("the chunk arrives", || !sl.data_on(p.to_client).is_empty());
    c.settle();
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"retry me".to_vec()],
        "only the accepted send is delivered"
    );
}

/// A header longer than 16 bytes is rejected with `HeaderTooLong`; 16 bytes
/// are fine.
pub fn zero_copy_header_longer_than_16_bytes_is_rejected<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let s = region.slice(0, 4).unwrap();
    let (long, exact) = c.call(&p.client, move |b| {
        (
            b.send_data(to_server, &[s], &[1u8; MAX_HEADER_LEN + 1], 1),
            b.send_data(to_server, &[s], &[2u8; MAX_HEADER_LEN], 2),
        )
    });
    assert!(
        matches!(long, Err(SendError::HeaderTooLong { len: 17, max: 16 })),
        "17-byte header: {long:?}"
    );
    exact.expect("a 16-byte header is allowed");
    let sl = p.server.log.clone();
    c.wait("the valid message arrives", || {
        !sl.data_on(p.to_client).is_empty()
    });
    c.settle();
    let got = p.server.log.data_on(p.to_client);
    assert_eq!(got.len(), 1, "only the valid send is delivered");
    assert_eq!(got[0].len(), 20);
    assert_eq!(p.client.log.completed(to_server), vec![2]);
}

/// Data outside the connection's registered region is rejected with
/// `OutsideRegion`; a connection without a region answers `NotSupported`.
pub fn zero_copy_data_outside_region_is_rejected<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let other = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let foreign = other.slice(0, 8).unwrap();
    let r = c.call(&p.client, move |b| {
        b.send_data(to_server, &[foreign], &[], 1)
    });
    assert!(
        matches!(r, Err(SendError::OutsideRegion)),
        "slice of another region: {r:?}"
    );
    // A connection without a region.
    let s2 = c.node();
    let l2 = connect_target(c.listen(&s2, ConnectionParams::receive(64, 2)), s2.ip);
    let conn2 = c
        .connect(&s2, &p.client, l2, ConnectionParams::buffered(64, 2))
        .client;
    let own = region.slice(0, 8).unwrap();
    let r = c.call(&p.client, move |b| b.send_data(conn2, &[own], &[], 2));
    assert!(
        matches!(r, Err(SendError::NotSupported(_))),
        "no region on the connection: {r:?}"
    );
    c.settle();
    assert!(
        p.server.log.all_data().is_empty() && s2.log.all_data().is_empty(),
        "nothing may be delivered"
    );
    region
        .write(0, b"free")
        .expect("a rejected send must not keep the region lent");
}

/// A zero-copy send completes with the caller's key, and its data is lent
/// (cannot be written through the safe API) until then.
pub fn zero_copy_completion_carries_callers_key<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let (a, b2) = (region.slice(0, 8).unwrap(), region.slice(8, 8).unwrap());
    let r2 = region.clone();
    // On the loop thread, so that the sends cannot complete before the write.
    let refused = c.on_loop(&p.client, move |b| {
        b.send_data(to_server, &[a], &[], 0xdead_beef).unwrap();
        b.send_data(to_server, &[b2], &[], u64::MAX).unwrap();
        r2.write(0, b"overwrite").is_err()
    });
    assert!(refused, "data of a send in flight must not be writable");
    let cl = p.client.log.clone();
    c.wait("both sends complete", || cl.completed(to_server).len() == 2);
    let keys: BTreeSet<u64> = p.client.log.completed(to_server).into_iter().collect();
    assert_eq!(keys, BTreeSet::from([0xdead_beef, u64::MAX]));
    region
        .write(0, b"overwrite")
        .expect("writable again after completion");
}

/// Several slices (scatter/gather) arrive as one message, in the order
/// given.
pub fn zero_copy_scatter_gather_arrives_as_one_message<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(128);
    region.write(0, b"AAAA").unwrap();
    region.write(64, b"BBBBBB").unwrap();
    region.write(100, b"CC").unwrap();
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let slices = [
        region.slice(64, 6).unwrap(),
        region.slice(0, 4).unwrap(),
        region.slice(100, 2).unwrap(),
    ];
    c.call(&p.client, move |b| b.send_data(to_server, &slices, b"h", 5))
        .unwrap();
    let sl = p.server.log.clone();
    c.wait("the message arrives", || {
        !sl.data_on(p.to_client).is_empty()
    });
    c.settle();
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"hBBBBBBAAAACC".to_vec()]
    );
}

/// Buffered and zero-copy sends work side by side on one connection.
pub fn buffered_and_zero_copy_work_on_one_connection<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::from_vec(b"zero-copy".to_vec());
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::buffered(64, 2).with_zero_copy(region.clone()),
    );
    let to_server = p.to_server;
    let s = region.slice(0, 9).unwrap();
    c.call(&p.client, move |b| b.send_data(to_server, &[s], &[], 100))
        .unwrap();
    let sl = p.server.log.clone();
    c.wait("the zero-copy message arrives", || {
        sl.data_on(p.to_client).len() == 1
    });
    c.send_buffered(&p.client, to_server, b"buffered".to_vec());
    c.wait("the buffered message arrives", || {
        sl.data_on(p.to_client).len() == 2
    });
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"zero-copy".to_vec(), b"buffered".to_vec()]
    );
}

/// Waits until the server of `p` has `n` messages from the client and the
/// client `n` completions of its sends to the server, then lets the loops
/// settle (so that anything more would be seen).
fn wait_for_messages_and_completions<H: Harness>(c: &mut Ctx<H>, p: &crate::Pair<H>, n: usize) {
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    let (to_client, to_server) = (p.to_client, p.to_server);
    c.wait(&format!("{n} messages arrive and complete"), || {
        sl.data_on(to_client).len() >= n && cl.completed(to_server).len() >= n
    });
    c.settle();
}

/// Empty and header-only messages are messages like any other, in the
/// copy and zero-copy modes as in the buffered one: an empty copy send, a
/// copy send of a 16-byte header and no data, and a zero-copy send of an
/// empty slice with a header arrive as exactly those bytes, in order, and
/// each completes with its key.
pub fn empty_and_header_only_messages_arrive_as_sent<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::from_vec(vec![0u8; 64]);
    let p = c.pair(
        ConnectionParams::receive(64, 8),
        ConnectionParams::receive(64, 8).with_zero_copy(region.clone()),
    );
    let to_server = p.to_server;
    let header = [0xa5u8; 16];
    let empty = region.slice(0, 0).expect("an empty slice of the region");
    c.call(&p.client, move |b| {
        b.send_data_copy(to_server, &[], &[], 1)?;
        b.send_data_copy(to_server, &[&[]], &header, 2)?;
        b.send_data(to_server, &[empty], b"hdr", 3)
    })
    .expect("empty and header-only sends are accepted");
    wait_for_messages_and_completions(&mut c, &p, 3);
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![Vec::new(), header.to_vec(), b"hdr".to_vec()],
        "each message is exactly its header and data"
    );
    assert_eq!(p.client.log.completed(to_server), vec![1, 2, 3]);
}

// ----------------------------------------------------------------------- copy

/// `send_data_copy` copies at once: overwriting the caller's memory right
/// after the call does not change what arrives.
pub fn copy_send_data_may_be_overwritten_after_call<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(256, 8),
        ConnectionParams::default(),
    );
    let to_server = p.to_server;
    let r = c.call(&p.client, move |b| {
        let mut data = b"original".to_vec();
        let mut tail = b"-tail".to_vec();
        let mut header = b"H1".to_vec();
        b.send_data_copy(to_server, &[&data, &tail], &header, 42)
            .unwrap();
        data.iter_mut().for_each(|x| *x = b'X');
        tail.clear();
        header.iter_mut().for_each(|x| *x = b'Y');
        drop((data, tail, header));
        b.send_data_copy(to_server, &[b"z"], &[0u8; MAX_HEADER_LEN + 1], 43)
    });
    assert!(
        matches!(r, Err(SendError::HeaderTooLong { .. })),
        "17-byte header: {r:?}"
    );
    let sl = p.server.log.clone();
    c.wait("the message arrives", || {
        !sl.data_on(p.to_client).is_empty()
    });
    let cl = p.client.log.clone();
    c.wait("the send completes", || cl.completed(to_server) == vec![42]);
    c.settle();
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![b"H1original-tail".to_vec()]
    );
}

/// A provider either sends by copy, or says `NotSupported`, as its declared
/// features say.
pub fn copy_send_is_supported_or_reports_not_supported<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let p = c.pair(
        ConnectionParams::receive(64, 4),
        ConnectionParams::default(),
    );
    let to_server = p.to_server;
    let caps = p.client.log.established_caps(to_server).unwrap();
    assert_eq!(
        caps.send_copy, copy,
        "the capability must match the declared feature"
    );
    let r = c.call(&p.client, move |b| {
        b.send_data_copy(to_server, &[b"copy"], &[], 9)
    });
    if copy {
        r.expect("copy sending is declared supported");
        let sl = p.server.log.clone();
        c.wait("the message arrives", || {
            !sl.data_on(p.to_client).is_empty()
        });
    } else {
        assert!(matches!(r, Err(SendError::NotSupported(_))), "{r:?}");
    }
}

/// A server and a client whose backend allows `depth` copy sends in flight
/// per connection, connected for copy sends to the server.
fn copy_pair_with_depth<H: Harness>(c: &mut Ctx<H>, depth: usize) -> crate::ctx::Pair<H> {
    let s = c.node();
    let cfg = BackendConfig {
        send_queue_depth: depth,
        ..c.config()
    };
    let cl = c.node_with(cfg, None);
    c.pair_of(
        s,
        cl,
        ConnectionParams::receive(64, 16),
        ConnectionParams::default(),
    )
}

/// At most `send_queue_depth` copy sends are in flight per connection; one
/// more answers `NoResources`, and retrying after completions works.
pub fn send_queue_depth_bounds_sends_with_no_resources<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = copy_pair_with_depth(&mut c, 4);
    let to_server = p.to_server;
    // On the loop thread, so that no send completes between the five calls.
    let results = c.on_loop(&p.client, move |b| {
        (0..5u64)
            .map(|k| b.send_data_copy(to_server, &[&k.to_le_bytes()], &[], k))
            .collect::<Vec<_>>()
    });
    for (k, r) in results.iter().take(4).enumerate() {
        assert!(r.is_ok(), "send {k} within the depth: {r:?}");
    }
    let fifth = results.into_iter().nth(4).unwrap();
    match fifth {
        Err(e) => assert!(
            e.is_retryable() && matches!(e, SendError::NoResources),
            "{e:?}"
        ),
        Ok(()) => panic!("the fifth send must answer NoResources"),
    }
    let cl = p.client.log.clone();
    c.wait("four sends complete", || cl.completed(to_server).len() == 4);
    c.call(&p.client, move |b| {
        b.send_data_copy(to_server, &[b"retry"], &[], 99)
    })
    .expect("a retry after completions works");
    let sl = p.server.log.clone();
    c.wait("five messages arrive", || {
        sl.data_on(p.to_client).len() == 5
    });
}

/// A batch of copy sends arrives as its messages, in order (each header
/// before its data), and each key completes once, in batch order.
pub fn a_copy_batch_arrives_in_order_with_each_key_completed_once<H: Harness>(mode: ThreadSafety) {
    const N: u64 = 40;
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 16),
        ConnectionParams::default(),
    );
    let to_server = p.to_server;
    let r = c.call(&p.client, move |b| {
        let bodies: Vec<Vec<u8>> = (0..N).map(|k| vec![k as u8; 1 + k as usize]).collect();
        let heads: Vec<[u8; 2]> = (0..N).map(|k| [0xa0, k as u8]).collect();
        let msgs: Vec<CopyMessage<'_>> = (0..N as usize)
            .map(|i| {
                if i % 3 == 0 {
                    CopyMessage::with_header(&heads[i], &bodies[i], 100 + i as u64)
                } else {
                    CopyMessage::new(&bodies[i], 100 + i as u64)
                }
            })
            .collect();
        b.send_copy_batch(to_server, &msgs)
    });
    r.expect("a batch within the queue depth is accepted whole");
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("every message arrives and every send completes", || {
        sl.data_on(p.to_client).len() >= N as usize && cl.completed(to_server).len() >= N as usize
    });
    c.settle();
    let expected: Vec<Vec<u8>> = (0..N)
        .map(|k| {
            let mut m = Vec::new();
            if k % 3 == 0 {
                m.extend_from_slice(&[0xa0, k as u8]);
            }
            m.extend(std::iter::repeat_n(k as u8, 1 + k as usize));
            m
        })
        .collect();
    assert_eq!(
        p.server.log.data_on(p.to_client),
        expected,
        "each message once, in batch order"
    );
    assert_eq!(
        p.client.log.completed(to_server),
        (100..100 + N).collect::<Vec<_>>(),
        "each key once, in batch order"
    );
}

/// A batch of copy sends stops at the first message refused and says how
/// many went before it: a header over the limit, then the queue depth.
/// Exactly the accepted messages arrive and complete; sending the rest
/// after completions works.
pub fn a_copy_batch_stops_at_the_first_refused_message_and_says_how_many_were_sent<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = copy_pair_with_depth(&mut c, 4);
    let to_server = p.to_server;
    let long = [0u8; MAX_HEADER_LEN + 1];
    let bad_header = c.on_loop(&p.client, move |b| {
        let msgs = [
            CopyMessage::new(b"h0", 0),
            CopyMessage::new(b"h1", 1),
            CopyMessage::with_header(&long, b"h2", 2),
            CopyMessage::new(b"h3", 3),
        ];
        b.send_copy_batch(to_server, &msgs)
    });
    match bad_header {
        Err(e) => {
            assert_eq!(e.sent, 2, "two messages went before the bad header: {e}");
            assert!(
                matches!(e.error, SendError::HeaderTooLong { .. }),
                "{:?}",
                e.error
            );
            assert!(!e.is_retryable());
        }
        Ok(()) => panic!("a header over MAX_HEADER_LEN must stop the batch"),
    }
    let cl = p.client.log.clone();
    c.wait("the two accepted sends complete", || {
        cl.completed(to_server).len() == 2
    });
    // On the loop thread, so that no send completes during the call.
    let full = c.on_loop(&p.client, move |b| {
        let bodies: Vec<[u8; 2]> = (10..16u8).map(|k| [b'd', k]).collect();
        let msgs: Vec<CopyMessage<'_>> = bodies
            .iter()
            .enumerate()
            .map(|(i, d)| CopyMessage::new(d, 10 + i as u64))
            .collect();
        b.send_copy_batch(to_server, &msgs)
    });
    match full {
        Err(e) => {
            assert_eq!(e.sent, 4, "the queue depth admits four: {e}");
            assert!(matches!(e.error, SendError::NoResources), "{:?}", e.error);
            assert!(e.is_retryable());
        }
        Ok(()) => panic!("six sends on a depth of four must stop at the fifth"),
    }
    c.wait("the four accepted sends complete", || {
        cl.completed(to_server).len() == 6
    });
    c.call(&p.client, move |b| {
        b.send_copy_batch(
            to_server,
            &[
                CopyMessage::new(b"d\x0e", 14),
                CopyMessage::new(b"d\x0f", 15),
            ],
        )
    })
    .expect("the rest, sent again after completions, is accepted");
    let sl = p.server.log.clone();
    c.wait("eight messages arrive", || {
        sl.data_on(p.to_client).len() == 8
    });
    c.settle();
    let got = p.server.log.data_on(p.to_client);
    let mut expected: Vec<Vec<u8>> = vec![b"h0".to_vec(), b"h1".to_vec()];
    expected.extend((10..16u8).map(|k| vec![b'd', k]));
    assert_eq!(got, expected, "exactly the accepted messages, in order");
    assert_eq!(
        p.client.log.completed(to_server),
        vec![0, 1, 10, 11, 12, 13, 14, 15],
        "exactly the accepted keys"
    );
}

/// `get_buffers` takes up to the free buffers (none while all are in
/// flight); a batch of buffered sends arrives in order; a refused buffer in
/// the middle stops it, goes back to its pool, and leaves the buffers after
/// it with the caller, who sends them next.
pub fn a_buffer_batch_arrives_in_order_and_a_refused_buffer_leaves_the_rest_with_the_caller<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 8),
        ConnectionParams::buffered(64, 4),
    );
    let to_server = p.to_server;
    let r = c.on_loop(&p.client, move |b| {
        let mut bufs = Vec::new();
        let took = b.get_buffers(to_server, 8, &mut bufs).expect("get_buffers");
        let none_left = b.get_buffers(to_server, 8, &mut bufs).expect("get_buffers");
        let mut batch: Vec<(NetworkBuffer, u64)> = Vec::new();
        for (i, mut buf) in bufs.into_iter().enumerate() {
            buf.write(&[b'b', i as u8]).unwrap();
            batch.push((buf, 20 + i as u64));
        }
        let alien_pool = BufferPool::new(64, 1);
        let mut alien = alien_pool.get().unwrap();
        alien.write(b"alien").unwrap();
        batch.insert(2, (alien, 99));
        let r = b.send_buffer_batch(to_server, &mut batch);
        let left: Vec<(Vec<u8>, u64)> = batch
            .iter()
            .map(|(b, k)| (b.as_slice().to_vec(), *k))
            .collect();
        let r2 = b.send_buffer_batch(to_server, &mut batch);
        (
            took,
            none_left,
            r,
            left,
            r2,
            batch.len(),
            alien_pool.available(),
        )
    });
    let (took, none_left, first, left, second, after, alien_free) = r;
    assert_eq!(took, 4, "get_buffers takes every free buffer, up to max");
    assert_eq!(none_left, 0, "and none while all are taken");
    match first {
        Err(e) => {
            assert_eq!(e.sent, 2, "{e}");
            assert!(matches!(e.error, SendError::ForeignBuffer), "{:?}", e.error);
        }
        Ok(()) => panic!("a foreign buffer must stop the batch"),
    }
    assert_eq!(
        left,
        vec![(vec![b'b', 2], 22), (vec![b'b', 3], 23)],
        "the buffers after the refused one stay with the caller, in order"
    );
    assert_eq!(alien_free, 1, "the refused buffer went back to its pool");
    second.expect("the rest of the batch is accepted");
    assert_eq!(after, 0, "a batch sent whole leaves the vector empty");
    wait_for_messages_and_completions(&mut c, &p, 4);
    assert_eq!(
        p.server.log.data_on(p.to_client),
        (0..4u8).map(|i| vec![b'b', i]).collect::<Vec<_>>()
    );
    assert_eq!(p.client.log.completed(to_server), vec![20, 21, 22, 23]);
    let back = c.call(&p.client, move |b| {
        let mut v = Vec::new();
        b.get_buffers(to_server, 8, &mut v)
    });
    assert_eq!(back.expect("get_buffers"), 4, "every buffer is free again");
}

// ------------------------------------------------------------------- delivery

/// Many messages arrive in order, exactly once, and every send completes
/// once.
pub fn many_messages_arrive_in_order_exactly_once<H: Harness>(mode: ThreadSafety) {
    const N: u32 = 500;
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 8),
        ConnectionParams::buffered(64, 8),
    );
    for i in 0..N {
        c.send_buffered(&p.client, p.to_server, i.to_le_bytes().to_vec());
    }
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("every message arrives and every send completes", || {
        sl.data_on(p.to_client).len() >= N as usize && cl.completed(p.to_server).len() >= N as usize
    });
    c.settle();
    let got: Vec<u32> = p
        .server
        .log
        .data_on(p.to_client)
        .iter()
        .map(|d| u32::from_le_bytes(d[..4].try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "in order, exactly once");
    assert_eq!(
        p.client.log.completed(p.to_server).len(),
        N as usize,
        "one completion per send"
    );
    assert!(p.client.log.closed().is_empty() && p.server.log.closed().is_empty());
}

/// A message exactly as large as the receive buffer arrives, and the
/// connection stays open.
pub fn message_of_exactly_receive_buffer_size_arrives<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(256, 2),
        ConnectionParams::buffered(256, 2),
    );
    let msg: Vec<u8> = (0..256u32).map(|i| (i * 7) as u8).collect();
    c.send_buffered(&p.client, p.to_server, msg.clone());
    let sl = p.server.log.clone();
    c.wait("the message arrives", || {
        !sl.data_on(p.to_client).is_empty()
    });
    c.send_buffered(&p.client, p.to_server, b"after".to_vec());
    c.wait("the next message arrives", || {
        sl.data_on(p.to_client).len() == 2
    });
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![msg, b"after".to_vec()]
    );
    assert!(p.server.log.closed().is_empty() && p.client.log.closed().is_empty());
}

/// A message larger than the receiver's buffer closes the connection with
/// `MessageTooLarge`; it is never delivered, receive memory does not grow,
/// and the sender's key is reported once.
pub fn message_larger_than_receive_buffer_closes_connection_clearly<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(256, 2),
        ConnectionParams::buffered(1024, 2),
    );
    let before = p.server.backend.memory_usage();
    let key = c.send_buffered(&p.client, p.to_server, vec![0xab; 257]);
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait_unless(
        "both sides report the close",
        "a message larger than the receive buffer (257 > 256 bytes) is never delivered",
        || sl.closed_count(p.to_client) == 1 && cl.closed_count(p.to_server) == 1,
        || {
            sl.all_data()
                .first()
                .map(|d| format!("on_data delivered {} bytes", d.1.len()))
        },
    );
    c.settle();
    let reason = p.server.log.closed()[0].reason.clone();
    assert_eq!(
        reason,
        CloseReason::MessageTooLarge {
            size: 257,
            limit: 256
        },
        "the receiver's close reason"
    );
    assert!(
        reason.to_string().contains("257"),
        "reason must say the size: {reason}"
    );
    assert!(
        p.server.log.all_data().is_empty(),
        "the oversized message must not be delivered"
    );
    let done = p.client.log.completed(p.to_server);
    let cancelled = p.client.log.cancelled(p.to_server);
    let reports = done.iter().chain(&cancelled).filter(|k| **k == key).count();
    assert_eq!(
        reports, 1,
        "key {key}: completed {done:?}, cancelled {cancelled:?}"
    );
    assert!(
        p.server.backend.memory_usage().receive_bytes <= before.receive_bytes,
        "receive memory grew: {:?} -> {:?}",
        before,
        p.server.backend.memory_usage()
    );
}

// -------------------------------------------------------------------- closing

/// Closing an active endpoint reports `on_connection_closed` on both sides:
/// `Local` here, `PeerClosed` there.
pub fn closing_active_endpoint_reports_closed_on_both_sides<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 2), full_params(64, 2));
    let to_server = p.to_server;
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .unwrap();
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("both sides report the close", || {
        cl.closed_count(to_server) == 1 && sl.closed_count(p.to_client) == 1
    });
    c.settle();
    assert_eq!(
        p.client.log.closed(),
        vec![Close {
            conn: to_server,
            remote: p.listen,
            reason: CloseReason::Local,
            keys: vec![]
        }]
    );
    assert_eq!(
        p.server.log.closed(),
        vec![Close {
            conn: p.to_client,
            remote: p.accepted,
            reason: CloseReason::PeerClosed,
            keys: vec![]
        }]
    );
}

/// Closing with sends in flight reports every key exactly once: completed or
/// cancelled, never both; nothing cancelled is delivered.
pub fn closing_with_sends_in_flight_reports_each_key_once<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 32),
        ConnectionParams::buffered(64, 16),
    );
    let to_server = p.to_server;
    // On the loop thread, so that no completion returns a buffer meanwhile.
    let sent = c.on_loop(&p.client, move |b| {
        let mut keys = Vec::new();
        let mut key = 100u64;
        while let Some(mut buf) = b.get_buffer(to_server).unwrap() {
            buf.write_int(key).unwrap();
            keys.push(key);
            b.send_buffer(to_server, buf, key).unwrap();
            key += 3;
        }
        b.close_active_endpoint(to_server).unwrap();
        keys
    });
    assert_eq!(sent.len(), 16);
    let cl = p.client.log.clone();
    c.wait("the close is reported", || cl.closed_count(to_server) == 1);
    c.settle();
    let done = p.client.log.completed(to_server);
    let cancelled = p.client.log.cancelled(to_server);
    let mut all: Vec<u64> = done.iter().chain(&cancelled).copied().collect();
    all.sort_unstable();
    let mut want = sent.clone();
    want.sort_unstable();
    assert_eq!(
        all, want,
        "each key once: completed {done:?}, cancelled {cancelled:?}"
    );
    let events = p.client.log.events();
    let close_at = events
        .iter()
        .position(|e| matches!(e, Event::Closed { .. }))
        .unwrap();
    assert!(
        !events[close_at..]
            .iter()
            .any(|e| matches!(e, Event::Completed { .. })),
        "no completion may follow the close: {events:?}"
    );
    let delivered: Vec<u64> = p
        .server
        .log
        .data_on(p.to_client)
        .iter()
        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
        .collect();
    for k in &delivered {
        assert!(
            !cancelled.contains(k),
            "key {k} was delivered but reported cancelled"
        );
    }
    let order: Vec<usize> = delivered
        .iter()
        .map(|k| sent.iter().position(|s| s == k).unwrap())
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "delivered out of order: {delivered:?}"
    );
}

/// Closing a listener closes every connection it accepted (and only those);
/// the listener itself is reported nowhere.
pub fn closing_listener_closes_its_connections<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let listen = connect_target(c.listen(&s, full_params(64, 2)), s.ip);
    let clients: Vec<Node<H>> = (0..3).map(|_| c.node()).collect();
    let mut conns = Vec::new();
    for cl in &clients {
        conns.push(c.connect(&s, cl, listen, full_params(64, 2)));
    }
    // The server's own outgoing connection must survive.
    let other = c.node();
    let other_listen = connect_target(c.listen(&other, full_params(64, 2)), other.ip);
    let outgoing = c.connect(&other, &s, other_listen, full_params(64, 2));
    c.call(&s, move |b| b.close_listen_endpoint(listen))
        .unwrap();
    let sl = s.log.clone();
    c.wait("every accepted connection is closed", || {
        sl.closed().len() >= 3
    });
    for (cl, conn) in clients.iter().zip(&conns) {
        let log = cl.log.clone();
        let conn = conn.client;
        c.wait("each client hears of the close", || {
            log.closed_count(conn) == 1
        });
        assert_eq!(cl.log.closed()[0].reason, CloseReason::PeerClosed);
    }
    c.settle();
    let closed = s.log.closed();
    assert_eq!(
        closed.len(),
        3,
        "exactly the accepted connections: {closed:?}"
    );
    let names: BTreeSet<_> = closed.iter().map(|x| x.conn).collect();
    assert_eq!(
        names,
        conns.iter().map(|x| x.server).collect::<BTreeSet<_>>()
    );
    assert!(
        closed
            .iter()
            .all(|x| x.reason == CloseReason::ListenerClosed),
        "{closed:?}"
    );
    c.send_buffered(&s, outgoing.client, b"still open".to_vec());
    let ol = other.log.clone();
    c.wait("the outgoing connection still works", || {
        !ol.all_data().is_empty()
    });
    let cl = c.node();
    c.call(&cl, move |b| {
        b.open_active_endpoint(listen, full_params(64, 2))
    })
    .unwrap();
    let log = cl.log.clone();
    c.wait("a new connection to the closed listener is refused", || {
        !log.refused().is_empty()
    });
}

/// Closing a listener that accepted nothing reports nothing, and the
/// address can be listened on again. (The port is one outside the
/// system's ephemeral range: see [`Ctx::listen_on_fixed_port`].)
pub fn closing_listener_without_connections_reports_nothing<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let listen = c.listen_on_fixed_port(&s, full_params(64, 2));
    c.call(&s, move |b| b.close_listen_endpoint(listen))
        .unwrap();
    c.settle();
    assert!(
        s.log.is_empty(),
        "nothing is reported for a listener: {:?}",
        s.log
    );
    let again = c.call(&s, move |b| {
        b.open_listen_endpoint(listen, full_params(64, 2))
    });
    assert_eq!(again.expect("listening again on the same address"), listen);
}

/// Closing a connection or listener that does not exist fails with
/// `UnknownConnection` or `UnknownListenEndpoint`, also the second time a
/// listener is closed.
pub fn closing_unknown_endpoint_fails<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let listen = c.listen(&s, full_params(64, 2));
    let nowhere = EndpointAddress::new(s.ip, 9);
    let nobody = ConnId::new(9, 9);
    let r = c.call(&s, move |b| {
        (
            b.close_active_endpoint(nobody),
            b.close_listen_endpoint(nowhere),
            b.close_listen_endpoint(listen),
            b.close_listen_endpoint(listen),
            b.close_active_endpoint(nobody),
        )
    });
    assert!(
        matches!(r.0, Err(CloseError::UnknownConnection(a)) if a == nobody),
        "{:?}",
        r.0
    );
    assert!(
        matches!(r.1, Err(CloseError::UnknownListenEndpoint(a)) if a == nowhere),
        "{:?}",
        r.1
    );
    assert!(r.2.is_ok(), "{:?}", r.2);
    assert!(
        matches!(r.3, Err(CloseError::UnknownListenEndpoint(a)) if a == listen),
        "{:?}",
        r.3
    );
    assert!(
        matches!(r.4, Err(CloseError::UnknownConnection(a)) if a == nobody),
        "a second close of an unknown handle: {:?}",
        r.4
    );
}

/// An accepted connection can be closed with the handle its
/// `on_connection_established` gave; both sides report it.
pub fn accepted_connection_can_be_closed_by_its_handle<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 2), full_params(64, 2));
    let to_client = p.to_client;
    c.call(&p.server, move |b| b.close_active_endpoint(to_client))
        .unwrap();
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("both sides report the close", || {
        sl.closed_count(to_client) == 1 && cl.closed_count(p.to_server) == 1
    });
    assert_eq!(p.server.log.closed()[0].reason, CloseReason::Local);
    assert_eq!(p.client.log.closed()[0].reason, CloseReason::PeerClosed);
}

/// A peer's close is reported; afterwards the handle is stale (calls fail
/// with `UnknownConnection`), and connecting again works.
pub fn peer_close_is_reported_and_endpoint_is_gone<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 2), full_params(64, 2));
    let to_client = p.to_client;
    c.call(&p.server, move |b| b.close_active_endpoint(to_client))
        .unwrap();
    let cl = p.client.log.clone();
    c.wait("the client hears of the close", || {
        cl.closed_count(p.to_server) == 1
    });
    let to_server = p.to_server;
    let r = c.call(&p.client, move |b| {
        b.get_buffer(to_server).map(|x| x.is_some())
    });
    assert!(
        matches!(r, Err(BufferError::UnknownConnection(a)) if a == to_server),
        "{r:?}"
    );
    c.connect(&p.server, &p.client, p.listen, full_params(64, 2));
}

// -------------------------------------------------------------------- threads

/// In thread-safe mode, sends from many threads at once all arrive, each
/// thread's in its order.
pub fn sends_from_many_threads_all_arrive<H: Harness>(mode: ThreadSafety) {
    const THREADS: u32 = 4;
    const PER: u32 = 100;
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 16),
        ConnectionParams::buffered(64, 16),
    );
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let b = p.client.backend.clone();
            let to_server = p.to_server;
            let failures = failures.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + WATCHDOG;
                for i in 0..PER {
                    loop {
                        if Instant::now() > deadline {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("thread {t} timed out at {i}"));
                            return;
                        }
                        match b.get_buffer(to_server) {
                            Ok(Some(mut buf)) => {
                                buf.write_int(t).unwrap();
                                buf.write_int(i).unwrap();
                                let key = (u64::from(t) << 32) | u64::from(i);
                                match b.send_buffer(to_server, buf, key) {
                                    Ok(()) => break,
                                    Err(e) if e.is_retryable() => {}
                                    Err(e) => {
                                        failures.lock().unwrap().push(format!("thread {t}: {e}"));
                                        return;
                                    }
                                }
                            }
                            Ok(None) => std::thread::yield_now(),
                            Err(e) => {
                                failures.lock().unwrap().push(format!("thread {t}: {e}"));
                                return;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let sl = p.server.log.clone();
    let total = (THREADS * PER) as usize;
    let f2 = failures.clone();
    c.wait("every message from every thread arrives", || {
        sl.data_on(p.to_client).len() >= total || !f2.lock().unwrap().is_empty()
    });
    for h in handles {
        h.join().expect("sender thread panicked");
    }
    assert!(
        failures.lock().unwrap().is_empty(),
        "{:?}",
        failures.lock().unwrap()
    );
    let mut per: HashMap<u32, Vec<u32>> = HashMap::new();
    for d in p.server.log.data_on(p.to_client) {
        let t = u32::from_le_bytes(d[0..4].try_into().unwrap());
        let i = u32::from_le_bytes(d[4..8].try_into().unwrap());
        per.entry(t).or_default().push(i);
    }
    for t in 0..THREADS {
        assert_eq!(
            per.get(&t),
            Some(&(0..PER).collect::<Vec<_>>()),
            "thread {t}'s messages"
        );
    }
}

/// A handler can send and close from inside its callbacks without
/// deadlock: the server echoes, and closes when asked to.
pub fn handler_can_send_and_close_inside_callbacks<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let e2 = errors.clone();
    let react: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Data { conn, data } = ev {
            if data == b"close" {
                if let Err(e) = b.close_active_endpoint(*conn) {
                    e2.lock().unwrap().push(e.to_string());
                }
                return;
            }
            match b.get_buffer(*conn) {
                Ok(Some(mut buf)) => {
                    buf.write(b"echo:").unwrap();
                    buf.write(data).unwrap();
                    if let Err(e) = b.send_buffer(*conn, buf, data.len() as u64) {
                        e2.lock().unwrap().push(e.to_string());
                    }
                }
                other => e2.lock().unwrap().push(format!("get_buffer: {other:?}")),
            }
        }
    });
    let server = c.node_with(c.config(), Some(react));
    let client = c.node();
    let p = c.pair_of(server, client, full_params(64, 8), full_params(64, 8));
    c.send_buffered(&p.client, p.to_server, b"a".to_vec());
    c.send_buffered(&p.client, p.to_server, b"b".to_vec());
    let cl = p.client.log.clone();
    c.wait("both echoes arrive", || cl.data_on(p.to_server).len() == 2);
    assert_eq!(
        p.client.log.data_on(p.to_server),
        vec![b"echo:a".to_vec(), b"echo:b".to_vec()]
    );
    c.send_buffered(&p.client, p.to_server, b"close".to_vec());
    let sl = p.server.log.clone();
    c.wait("the handler's close is reported on both sides", || {
        cl.closed_count(p.to_server) == 1 && sl.closed_count(p.to_client) == 1
    });
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
    assert_eq!(p.server.log.closed()[0].reason, CloseReason::Local);
}

/// In thread-unsafe mode, every operation called from a thread other than
/// the loop thread fails with `WrongThread`, without side effects.
pub fn calls_off_the_loop_thread_fail_with_wrong_thread<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    assert_eq!(mode, ThreadSafety::Unsafe);
    let p = c.pair(full_params(64, 2), full_params(64, 2));
    let b = p.client.backend.clone();
    let to_server = p.to_server;
    let ip = p.client.ip;
    let listen = p.listen;
    // A provider without copy sends answers NotSupported to every one.
    let copy = copy_supported(&c);
    let buf = c
        .on_loop(&p.client, move |b| b.get_buffer(to_server))
        .unwrap()
        .expect("a free buffer");
    let r = std::thread::spawn(move || {
        let any = EndpointAddress::new(ip, 0);
        vec![
            (
                "open_listen_endpoint",
                matches!(
                    b.open_listen_endpoint(any, full_params(64, 2)),
                    Err(OpenListenError::WrongThread)
                ),
            ),
            (
                "open_active_endpoint",
                matches!(
                    b.open_active_endpoint(listen, full_params(64, 2)),
                    Err(OpenActiveError::WrongThread)
                ),
            ),
            (
                "get_buffer",
                matches!(b.get_buffer(to_server), Err(BufferError::WrongThread)),
            ),
            (
                "send_buffer",
                matches!(
                    b.send_buffer(to_server, buf, 3),
                    Err(SendError::WrongThread)
                ),
            ),
            (
                "num_available_buffers",
                matches!(
                    b.num_available_buffers(to_server),
                    Err(BufferError::WrongThread)
                ),
            ),
            (
                "send_data_copy",
                match b.send_data_copy(to_server, &[b"x"], &[], 1) {
                    Err(SendError::WrongThread) => true,
                    Err(SendError::NotSupported(_)) => !copy,
                    _ => false,
                },
            ),
            (
                "pause_receive",
                matches!(b.pause_receive(to_server), Err(ConnError::WrongThread)),
            ),
            (
                "resume_receive",
                matches!(b.resume_receive(to_server), Err(ConnError::WrongThread)),
            ),
            (
                "remote_address",
                matches!(b.remote_address(to_server), Err(ConnError::WrongThread)),
            ),
            (
                "connection_to",
                matches!(b.connection_to(listen), Err(ConnError::WrongThread)),
            ),
            (
                "close_active_endpoint",
                matches!(
                    b.close_active_endpoint(to_server),
                    Err(CloseError::WrongThread)
                ),
            ),
            (
                "close_listen_endpoint",
                matches!(
                    b.close_listen_endpoint(listen),
                    Err(CloseError::WrongThread)
                ),
            ),
        ]
    })
    .join()
    .unwrap();
    let wrong: Vec<&str> = r.iter().filter(|x| !x.1).map(|x| x.0).collect();
    assert!(
        wrong.is_empty(),
        "each call off the loop thread must fail with WrongThread; these did not: {wrong:?}"
    );
    c.settle();
    assert!(
        p.client.log.closed().is_empty(),
        "nothing may have been closed"
    );
    assert!(
        p.server.log.all_data().is_empty(),
        "nothing may have been sent"
    );
    c.send_buffered(&p.client, to_server, b"ok".to_vec());
    let sl = p.server.log.clone();
    c.wait("the connection still works from the loop thread", || {
        !sl.all_data().is_empty()
    });
}

/// In thread-unsafe mode, sends issued from signal and timer callbacks (on
/// the loop thread) work.
pub fn sends_through_signals_and_timers_work<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::receive(64, 16),
        ConnectionParams::buffered(64, 16),
    );
    let to_server = p.to_server;
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let send = {
        let b = p.client.backend.clone();
        let errors = errors.clone();
        move |msg: &[u8]| match b.get_buffer(to_server) {
            Ok(Some(mut buf)) => {
                buf.write(msg).unwrap();
                if let Err(e) = b.send_buffer(to_server, buf, msg.len() as u64) {
                    errors.lock().unwrap().push(e.to_string());
                }
            }
            other => errors
                .lock()
                .unwrap()
                .push(format!("get_buffer: {other:?}")),
        }
    };
    let lp = c.h.event_loop(p.client.id);
    let s1 = send.clone();
    let signal = lp.signal(move || s1(b"sig"));
    let timer_slot: Arc<Mutex<Option<<H::Loop as EventLoop>::Timer>>> = Arc::new(Mutex::new(None));
    let ticks = Arc::new(AtomicUsize::new(0));
    let (slot2, ticks2) = (timer_slot.clone(), ticks.clone());
    let timer = lp.timer(move || {
        if ticks2.fetch_add(1, Ordering::SeqCst) < 3 {
            send(b"tick");
        }
        if ticks2.load(Ordering::SeqCst) >= 3 {
            if let Some(t) = slot2.lock().unwrap().as_ref() {
                t.stop();
            }
        }
    });
    timer.start(Duration::from_millis(1));
    *timer_slot.lock().unwrap() = Some(timer);
    let s2 = signal.clone();
    std::thread::spawn(move || (0..3).for_each(|_| s2.fire()))
        .join()
        .unwrap();
    let sl = p.server.log.clone();
    c.wait("three signal and three timer messages arrive", || {
        sl.all_data().len() >= 6
    });
    c.settle();
    timer_slot.lock().unwrap().take();
    let data = p.server.log.data_on(p.to_client);
    assert_eq!(
        data.iter().filter(|d| d.as_slice() == b"sig").count(),
        3,
        "{data:?}"
    );
    assert_eq!(
        data.iter().filter(|d| d.as_slice() == b"tick").count(),
        3,
        "{data:?}"
    );
    assert!(
        errors.lock().unwrap().is_empty(),
        "{:?}",
        errors.lock().unwrap()
    );
}

// ----------------------------------------------------------------- event loop

/// Runs `lp` on this thread with `init`, with a watchdog that stops it after
/// [`WATCHDOG`] so a broken loop fails the test instead of hanging it.
/// Returns whether the watchdog had to stop it.
fn run_guarded<L: EventLoop>(lp: &L, init: impl FnOnce()) -> bool {
    let done = AtomicBool::new(false);
    let fired = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            while !done.load(Ordering::SeqCst) {
                if start.elapsed() > WATCHDOG {
                    fired.store(true, Ordering::SeqCst);
                    lp.stop();
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        lp.run(init);
        done.store(true, Ordering::SeqCst);
    });
    fired.load(Ordering::SeqCst)
}

/// `run` calls the init callback before any other callback, even a signal
/// fired before `run`.
pub fn init_runs_before_any_other_callback<H: Harness>(_mode: ThreadSafety) {
    let _turn = Turn::shared();
    let mut h = H::setup();
    let lp = Arc::new(h.fresh_loop());
    let order = Arc::new(Mutex::new(Vec::new()));
    let (o2, l2) = (order.clone(), lp.clone());
    let sig = lp.signal(move || {
        o2.lock().unwrap().push("signal");
        l2.stop();
    });
    sig.fire();
    let (o3, l3) = (order.clone(), lp.clone());
    let watchdog = run_guarded(&*lp, move || {
        o3.lock().unwrap().push(if l3.on_loop_thread() {
            "init"
        } else {
            "init off the loop thread"
        });
    });
    drop(sig);
    assert!(!watchdog, "the signal fired before run never ran");
    assert_eq!(*order.lock().unwrap(), vec!["init", "signal"]);
}

/// `stop` called from another thread makes `run` return.
pub fn stop_from_another_thread_returns_run<H: Harness>(_mode: ThreadSafety) {
    let _turn = Turn::shared();
    let mut h = H::setup();
    let lp = h.fresh_loop();
    let stopped_by_other = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<()>();
    let (lpr, flag) = (&lp, &stopped_by_other);
    std::thread::scope(|s| {
        s.spawn(move || {
            rx.recv_timeout(WATCHDOG).expect("init ran");
            assert!(!lpr.on_loop_thread(), "this thread does not run the loop");
            flag.store(true, Ordering::SeqCst);
            lpr.stop();
        });
        lp.run(|| tx.send(()).unwrap());
    });
    assert!(
        stopped_by_other.load(Ordering::SeqCst),
        "run returned before stop was called"
    );
    assert!(
        !lp.on_loop_thread(),
        "after run the caller is no longer the loop thread"
    );
}

/// A `stop` before `run` makes `run` return right after the init callback.
pub fn stop_before_run_returns_after_init<H: Harness>(_mode: ThreadSafety) {
    let _turn = Turn::shared();
    let mut h = H::setup();
    let lp = h.fresh_loop();
    lp.stop();
    let mut inited = false;
    let watchdog = run_guarded(&lp, || inited = true);
    assert!(inited, "init must run");
    assert!(
        !watchdog,
        "run must return by itself after a stop before run"
    );
}

/// A signal fired N times, from several threads, runs its callback N times on
/// the loop thread.
pub fn signal_fired_n_times_runs_n_times_from_any_thread<H: Harness>(_mode: ThreadSafety) {
    const THREADS: usize = 3;
    const FIRES: usize = 50;
    let _turn = Turn::shared();
    let mut h = H::setup();
    let lp = Arc::new(h.fresh_loop());
    let count = Arc::new(AtomicUsize::new(0));
    let off_thread = Arc::new(AtomicUsize::new(0));
    let (c2, o2, l2) = (count.clone(), off_thread.clone(), lp.clone());
    let sig = lp.signal(move || {
        if !l2.on_loop_thread() {
            o2.fetch_add(1, Ordering::SeqCst);
        }
        if c2.fetch_add(1, Ordering::SeqCst) + 1 == THREADS * FIRES {
            l2.stop();
        }
    });
    let watchdog = run_guarded(&*lp, || {
        for _ in 0..THREADS {
            let s = sig.clone();
            std::thread::spawn(move || (0..FIRES).for_each(|_| s.fire()));
        }
    });
    assert!(
        !watchdog,
        "only {} of {} fires ran",
        count.load(Ordering::SeqCst),
        THREADS * FIRES
    );
    assert_eq!(count.load(Ordering::SeqCst), THREADS * FIRES);
    assert_eq!(
        off_thread.load(Ordering::SeqCst),
        0,
        "callbacks must run on the loop thread"
    );
}

/// A timer fires periodically; after `stop` it does not fire; `start` with a
/// new period restarts it.
pub fn timer_fires_periodically_stops_and_restarts_with_new_period<H: Harness>(
    _mode: ThreadSafety,
) {
    let _turn = Turn::shared();
    let mut h = H::setup();
    let lp = Arc::new(h.fresh_loop());
    let ticks = Arc::new(AtomicUsize::new(0));
    let slot: Arc<Mutex<Option<<H::Loop as EventLoop>::Timer>>> = Arc::new(Mutex::new(None));
    let quiet_ticks = Arc::new(AtomicUsize::new(0));
    let quiet_slot: Arc<Mutex<Option<<H::Loop as EventLoop>::Timer>>> = Arc::new(Mutex::new(None));
    let ticks_at_stop = Arc::new(AtomicUsize::new(usize::MAX));

    // Timer A: 3 ticks at 1 ms, restart at 2 ms, 3 more ticks, then stop and
    // start timer B, which watches for 5 of its own ticks that A stays quiet.
    let (t2, s2, qs2, tas2) = (
        ticks.clone(),
        slot.clone(),
        quiet_slot.clone(),
        ticks_at_stop.clone(),
    );
    let timer = lp.timer(move || {
        let n = t2.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = s2.lock().unwrap();
        let Some(t) = guard.as_ref() else { return };
        if n == 3 {
            t.stop();
            t.start(Duration::from_millis(2));
        } else if n == 6 {
            t.stop();
            tas2.store(n, Ordering::SeqCst);
            if let Some(q) = qs2.lock().unwrap().as_ref() {
                q.start(Duration::from_millis(3));
            }
        }
    });
    let (q2, l2) = (quiet_ticks.clone(), lp.clone());
    let quiet = lp.timer(move || {
        if q2.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
            l2.stop();
        }
    });
    *slot.lock().unwrap() = Some(timer);
    *quiet_slot.lock().unwrap() = Some(quiet);
    let s3 = slot.clone();
    let watchdog = run_guarded(&*lp, move || {
        s3.lock()
            .unwrap()
            .as_ref()
            .unwrap()
            .start(Duration::from_millis(1));
    });
    slot.lock().unwrap().take();
    quiet_slot.lock().unwrap().take();
    assert!(
        !watchdog,
        "the timers did not finish: {} ticks",
        ticks.load(Ordering::SeqCst)
    );
    assert_eq!(
        ticks_at_stop.load(Ordering::SeqCst),
        6,
        "restarted timer ticked 3 more times"
    );
    assert_eq!(
        ticks.load(Ordering::SeqCst),
        6,
        "a stopped timer must not fire"
    );
    assert_eq!(quiet_ticks.load(Ordering::SeqCst), 5);
}

// --------------------------------------------------------------- shared pools

/// With a backend-wide shared receive pool, receive memory stays constant as
/// connections grow, and every connection still receives.
pub fn shared_receive_pool_keeps_memory_constant_as_connections_grow<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let pool = PoolParams::new(128, 8);
    let cfg = BackendConfig {
        shared_receive_pool: Some(pool),
        ..c.config()
    };
    let shared = c.node_with(cfg, None);
    let private = c.node();
    let mut usage = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..4 {
        let s = c.node();
        let listen = connect_target(c.listen(&s, full_params(128, 4)), s.ip);
        let a = c.connect(
            &s,
            &shared,
            listen,
            ConnectionParams::receive(128, 8).with_shared_receive(),
        );
        c.connect(&s, &private, listen, ConnectionParams::receive(128, 8));
        usage.push((
            shared.backend.memory_usage().receive_bytes,
            private.backend.memory_usage().receive_bytes,
        ));
        servers.push((s, a.server));
    }
    for (i, (s, p)) in usage.iter().enumerate() {
        assert_eq!(
            *s,
            pool.bytes(),
            "shared: constant after {} connections",
            i + 1
        );
        assert_eq!(*p, (i + 1) * 128 * 8, "private pools grow per connection");
    }
    for (i, (s, a)) in servers.iter().enumerate() {
        c.send_buffered(s, *a, vec![i as u8; 100]);
    }
    let log = shared.log.clone();
    c.wait("every connection delivers through the shared pool", || {
        log.all_data().len() == 4
    });
}

/// A listener's own shared pool serves only the connections it accepts.
pub fn per_listener_shared_pool_serves_only_its_listener<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let la = connect_target(
        c.listen(&s, ConnectionParams::receive(100, 4).with_shared_receive()),
        s.ip,
    );
    let lb = connect_target(c.listen(&s, ConnectionParams::receive(100, 4)), s.ip);
    let base = s.backend.memory_usage().receive_bytes;
    let mut clients = Vec::new();
    for i in 0..5 {
        let cl = c.node();
        let target = if i < 3 { la } else { lb };
        let conn = c
            .connect(&s, &cl, target, ConnectionParams::buffered(100, 2))
            .client;
        clients.push((cl, conn));
    }
    let used = s.backend.memory_usage().receive_bytes - base;
    assert!(
        used == 2 * 400 || used == 400 + 2 * 400,
        "listener A's three connections share one pool of 400 bytes, listener B's two have 400 each; \
         got {used} bytes beyond the {base} before any connection"
    );
    for (cl, conn) in &clients {
        c.send_buffered(cl, *conn, vec![7; 100]);
    }
    let log = s.log.clone();
    c.wait("every connection receives", || log.all_data().len() == 5);
}

/// A connection closed from inside `on_data` gives the buffer of the
/// message being delivered back to the shared pool it came from: a
/// listener's pool of two buffers serves six connections in turn, each
/// closed by the server's handler on its first message.
pub fn a_connection_closed_inside_on_data_gives_its_buffer_back_to_the_shared_pool<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let react: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Data { conn, .. } = ev {
            b.close_active_endpoint(*conn)
                .expect("closing the connection whose message is delivered");
        }
    });
    let s = c.node_with(c.config(), Some(react));
    let listen = connect_target(
        c.listen(&s, ConnectionParams::receive(100, 2).with_shared_receive()),
        s.ip,
    );
    let cl = c.node();
    for i in 0..6u8 {
        let conn = c
            .connect(&s, &cl, listen, ConnectionParams::buffered(100, 2))
            .client;
        c.send_buffered(&cl, conn, vec![i; 100]);
        let (sl, clog) = (s.log.clone(), cl.log.clone());
        c.wait(
            &format!(
                "connection {i}: its message arrives and the server's close reaches the client"
            ),
            || sl.all_data().len() == usize::from(i) + 1 && clog.closed_count(conn) == 1,
        );
    }
    let data = s.log.all_data();
    for (i, (_, d)) in data.iter().enumerate() {
        assert_eq!(d, &vec![i as u8; 100], "message {i}");
    }
}

/// With a backend-wide shared send pool, every connection can send buffered
/// and all share the pool's buffers.
pub fn shared_send_pool_serves_every_connection<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let cfg = BackendConfig {
        shared_send_pool: Some(PoolParams::new(64, 3)),
        ..c.config()
    };
    let cl = c.node_with(cfg.clone(), None);
    let (s1, s2) = (c.node(), c.node());
    let l1 = connect_target(c.listen(&s1, ConnectionParams::receive(64, 4)), s1.ip);
    let l2 = connect_target(c.listen(&s2, ConnectionParams::receive(64, 4)), s2.ip);
    let l1 = c.connect(&s1, &cl, l1, ConnectionParams::default()).client;
    let l2 = c.connect(&s2, &cl, l2, ConnectionParams::default()).client;
    let caps = cl.log.established_caps(l1).unwrap();
    assert_eq!(caps, ConnectionParams::default().capabilities(&cfg, copy));
    assert!(
        caps.send_buffered,
        "a shared send pool gives every connection buffered sending"
    );
    assert_eq!(
        cl.backend.memory_usage().send_bytes,
        64 * 3,
        "the pool counts once"
    );
    let r = c.call(&cl, move |b| {
        let x = b.get_buffer(l1).unwrap();
        let y = b.get_buffer(l2).unwrap();
        let z = b.get_buffer(l1).unwrap();
        let none = b.get_buffer(l2).unwrap().is_none();
        let (mut x, mut y, z) = (x.unwrap(), y.unwrap(), z.unwrap());
        x.write(b"via-l1").unwrap();
        y.write(b"via-l2").unwrap();
        b.send_buffer(l2, x, 1).unwrap();
        b.send_buffer(l1, y, 2).unwrap();
        drop(z);
        none
    });
    assert!(
        r,
        "three buffers shared by both connections: the fourth get_buffer gives None"
    );
    let (a, b) = (s1.log.clone(), s2.log.clone());
    c.wait("both messages arrive", || {
        a.all_data().len() == 1 && b.all_data().len() == 1
    });
    assert_eq!(s2.log.all_data()[0].1, b"via-l1".to_vec());
    assert_eq!(s1.log.all_data()[0].1, b"via-l2".to_vec());
}

// ----------------------------------------------------------------------- meta

/// The `unsupported` list given to `suite!` matches [`Harness::features`].
pub fn declared_features_match<H: Harness>(unsupported: &[&str]) {
    let h = H::setup();
    let f: Features = h.features();
    let reset = h.can_reset();
    let table = [
        ("send_copy", f.send_copy),
        ("send_zero_copy", f.send_zero_copy),
        ("buffered_with_zero_copy", f.buffered_with_zero_copy),
        ("thread_unsafe_mode", f.thread_unsafe_mode),
        ("shared_receive_pool", f.shared_receive_pool),
        ("shared_send_pool", f.shared_send_pool),
        ("reset", reset),
        // `partition`: the harness can make no peer stop answering, by
        // partition or by silencing it.
        ("partition", h.can_partition() || h.can_silence()),
        ("liveness", h.enforces_peer_timeout()),
        ("backpressure", h.pushes_back()),
        ("one_local_port", h.can_fix_local_port()),
        ("close_in_accept", h.reports_close_in_accept()),
    ];
    for name in unsupported {
        assert!(
            table.iter().any(|(n, _)| n == name),
            "unknown feature `{name}` in the unsupported list"
        );
    }
    for (name, supported) in table {
        assert_eq!(
            unsupported.contains(&name),
            !supported,
            "feature `{name}`: Harness::features (or can_reset, can_partition or can_silence, \
             enforces_peer_timeout, pushes_back, can_fix_local_port, reports_close_in_accept) says supported = \
             {supported}, the suite! list disagrees"
        );
    }
}

// ------------------------------------------------------- v2: helpers

/// Size of the messages the tests with a held peer send.
const HELD_MSG: usize = 16 * 1024;
/// The sender's queue depth in those tests.
const HELD_DEPTH: usize = 32;
/// Bytes a test sends to a paused peer before it must have been pushed back.
const FILL_LIMIT: usize = 64 << 20;

fn key_of(d: &[u8]) -> u64 {
    let mut k = [0u8; 8];
    let n = d.len().min(8);
    k[..n].copy_from_slice(&d[..n]);
    u64::from_le_bytes(k)
}

/// A server and a client whose queue depth is [`HELD_DEPTH`], both able to
/// receive [`HELD_MSG`]-byte messages.
fn held_pair<H: Harness>(c: &mut Ctx<H>) -> crate::Pair<H> {
    let cfg = BackendConfig {
        send_queue_depth: HELD_DEPTH,
        ..c.config()
    };
    let (s, cl) = (c.node_with(cfg.clone(), None), c.node_with(cfg, None));
    c.pair_of(
        s,
        cl,
        ConnectionParams::receive(HELD_MSG, 8).with_buffered(HELD_MSG, 8),
        ConnectionParams::receive(HELD_MSG, 8).with_buffered(HELD_MSG, 8),
    )
}

/// Every key in `sent` was reported exactly once by `node` for `remote`,
/// as completed or cancelled, and nothing else was.
#[track_caller]
fn assert_each_key_once<H: Harness>(node: &Node<H>, conn: ConnId, sent: &[u64], who: &str) {
    let done = node.log.completed(conn);
    let cancelled = node.log.cancelled(conn);
    let mut counts: HashMap<u64, usize> = HashMap::new();
    for k in done.iter().chain(&cancelled) {
        *counts.entry(*k).or_default() += 1;
    }
    let missing: Vec<u64> = sent
        .iter()
        .filter(|k| !counts.contains_key(k))
        .copied()
        .collect();
    let twice: Vec<u64> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(k, _)| *k)
        .collect();
    let foreign: Vec<u64> = counts
        .keys()
        .filter(|k| !sent.contains(k))
        .copied()
        .collect();
    assert!(
        missing.is_empty() && twice.is_empty() && foreign.is_empty(),
        "every accepted send ends exactly once, completed or cancelled ({who}): {} sent, {} \
         completed, {} cancelled; never reported: {missing:?}; reported twice: {twice:?}; \
         reported but never sent: {foreign:?}",
        sent.len(),
        done.len(),
        cancelled.len()
    );
}

/// What `receiver` received on `from` is a run of `sent` messages, in
/// order, without repeats, and none of them was reported cancelled by the
/// sender (on its handle `to`).
#[track_caller]
fn assert_delivered_in_order<H: Harness>(
    receiver: &Node<H>,
    from: ConnId,
    sender: &Node<H>,
    to: ConnId,
    sent: &[u64],
) -> Vec<u64> {
    let got: Vec<u64> = receiver
        .log
        .data_on(from)
        .iter()
        .map(|d| key_of(d))
        .collect();
    let pos: Vec<Option<usize>> = got
        .iter()
        .map(|k| sent.iter().position(|s| s == k))
        .collect();
    assert!(
        pos.iter().all(Option::is_some),
        "only sent messages are delivered: got keys {got:?}, sent {sent:?}"
    );
    assert!(
        pos.windows(2).all(|w| w[0] < w[1]),
        "messages of one connection arrive in order, exactly once: got keys {got:?}"
    );
    let cancelled = sender.log.cancelled(to);
    for k in &got {
        assert!(
            !cancelled.contains(k),
            "a cancelled send is never delivered: key {k} was delivered and reported cancelled"
        );
    }
    got
}

/// `node` reported the connection `conn` closed exactly once, for one of
/// `reasons`.
#[track_caller]
fn assert_closed_for<H: Harness>(node: &Node<H>, conn: ConnId, reasons: &[CloseReason], who: &str) {
    let closes: Vec<_> = node
        .log
        .closed()
        .into_iter()
        .filter(|c| c.conn == conn)
        .collect();
    assert_eq!(
        closes.len(),
        1,
        "a closed connection is reported once on each side ({who}): {closes:?}"
    );
    assert!(
        reasons.contains(&closes[0].reason),
        "{who} reports the close as {:?}, expected one of {reasons:?}",
        closes[0].reason
    );
}

/// Pauses the server, fills the client's connection until it pushes back,
/// runs `close` on the server as it resumes, and checks that every key is
/// reported once on both sides.
fn sends_in_flight_then<H: Harness>(
    mode: ThreadSafety,
    how: &str,
    close: impl FnOnce(&mut Ctx<H>, &crate::Pair<H>),
    client_reasons: &[CloseReason],
    server_reasons: &[CloseReason],
) {
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    c.pause(&p.server);
    let filled = c.fill(
        &p.client,
        p.to_server,
        SendMode::Copy,
        HELD_MSG,
        0,
        FILL_LIMIT,
    );
    close(&mut c, &p);
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait(
        &format!("both sides report the connection closed ({how})"),
        || cl.closed_count(p.to_server) == 1 && sl.closed_count(p.to_client) == 1,
    );
    c.settle();
    assert_each_key_once(&p.client, p.to_server, &filled.keys, "the sender");
    assert_each_key_once(
        &p.server,
        p.to_client,
        &[],
        "the receiver, which sent nothing",
    );
    assert!(
        !p.client.log.cancelled(p.to_server).is_empty(),
        "{how}: the sends still queued when the provider pushed back ({}) cannot have left; \
         they must be reported cancelled, but none was",
        filled.pushed_back
    );
    assert_delivered_in_order(&p.server, p.to_client, &p.client, p.to_server, &filled.keys);
    assert_closed_for(&p.client, p.to_server, client_reasons, "the sender");
    assert_closed_for(&p.server, p.to_client, server_reasons, "the receiver");
}

// ------------------------------------------------------- v2: connections

/// Listening on the unspecified address (`0.0.0.0` or `::`) returns it with
/// the bound port, and connections to the node's own address arrive.
pub fn listening_on_the_unspecified_address_keeps_it_and_accepts<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    let any = match s.ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    };
    let addr = c
        .call(&s, move |b| {
            b.open_listen_endpoint(EndpointAddress::new(any, 0), full_params(64, 2))
        })
        .unwrap_or_else(|e| panic!("listening on the unspecified address failed: {e}"));
    assert!(
        addr.ip().is_unspecified() && addr.port() != 0,
        "listening on {any}:0 returns the unspecified IP with the bound port, got {addr}"
    );
    c.connect(&s, &cl, connect_target(addr, s.ip), full_params(64, 2));
}

/// Listening on an address that is not this node's fails with
/// `FailedOpenListenEndpoint`, naming the reason; nothing is reported.
pub fn listening_on_an_address_of_another_host_fails_with_the_reason<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    // TEST-NET-1: never a local address; binding fails without traffic.
    let foreign = match s.ip {
        IpAddr::V4(_) => EndpointAddress::v4(192, 0, 2, 1, 0),
        IpAddr::V6(_) => EndpointAddress::new("2001:db8::1".parse().unwrap(), 0),
    };
    let r = c.call(&s, move |b| {
        b.open_listen_endpoint(foreign, full_params(64, 2))
    });
    match r {
        Err(e @ OpenListenError::FailedOpenListenEndpoint { .. }) => assert!(
            !e.to_string().is_empty() && !e.is_retryable(),
            "the error says why and is not retryable: {e}"
        ),
        other => panic!(
            "listening on {foreign}, not an address of this host: expected \
             FailedOpenListenEndpoint, got {other:?}"
        ),
    }
    c.settle();
    assert!(
        s.log.is_empty(),
        "a failed listen reports nothing: {:?}",
        s.log
    );
}

/// Parameters that cannot work fail at once with
/// `InvalidConnectionParameters`, on listen and on connect.
pub fn invalid_parameters_fail_with_invalid_connection_parameters<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let listen = connect_target(c.listen(&s, full_params(64, 2)), s.ip);
    let ip = s.ip;
    let (l, a) = c.call(&s, move |b| {
        (
            b.open_listen_endpoint(EndpointAddress::new(ip, 0), ConnectionParams::receive(0, 4)),
            b.open_active_endpoint(listen, ConnectionParams::buffered(0, 4)),
        )
    });
    assert!(
        matches!(l, Err(OpenListenError::InvalidConnectionParameters(_))),
        "listen with receive buffers of size 0: expected InvalidConnectionParameters, got {l:?}"
    );
    assert!(
        matches!(a, Err(OpenActiveError::InvalidConnectionParameters(_))),
        "connect with send buffers of size 0: expected InvalidConnectionParameters, got {a:?}"
    );
    c.settle();
    assert!(
        s.log.established().is_empty(),
        "a rejected open makes no connection: {:?}",
        s.log
    );
}

/// `on_connection_established` comes before any other event of the
/// connection on both sides, even when each side sends from inside its own
/// established callback (so the greeting may travel with the handshake).
pub fn established_comes_first_even_when_the_peer_greets_from_its_established_callback<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let greet = |hello: &'static [u8]| -> React<H::Backend> {
        Box::new(move |b, ev| {
            if let Event::Established { conn, .. } = ev {
                let _ = b.send_data_copy(*conn, &[hello], &[], 1);
                if let Ok(Some(mut buf)) = b.get_buffer(*conn) {
                    buf.write(hello).unwrap();
                    let _ = b.send_buffer(*conn, buf, 2);
                }
            }
        })
    };
    let (sc, cc) = (c.config(), c.config());
    let server = c.node_with(sc, Some(greet(b"hello from the server")));
    let client = c.node_with(cc, Some(greet(b"hello from the client")));
    let p = c.pair_of(server, client, full_params(64, 8), full_params(64, 8));
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("each side receives the other's greeting", || {
        !sl.data_on(p.to_client).is_empty() && !cl.data_on(p.to_server).is_empty()
    });
    c.settle();
    for (who, log, conn) in [
        ("the client", &p.client.log, p.to_server),
        ("the server", &p.server.log, p.to_client),
    ] {
        let first = log.events_of(conn).into_iter().next();
        assert!(
            matches!(first, Some(Event::Established { .. })),
            "{who}: on_connection_established comes before any other event of the \
             connection; the first was {first:?}"
        );
    }
}

/// Closing a connection that is still opening reports
/// `on_connection_refused` with `Cancelled` and its handle on the
/// initiator, never `on_connection_closed`; the handle is stale from the
/// close call on, and a new connection to the address works.
pub fn closing_a_connection_still_opening_reports_it_refused_as_cancelled<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, full_params(64, 2)), s.ip);
    let (conn, close, again) = c.on_loop(&cl, move |b| {
        let conn = b
            .open_active_endpoint(listen, full_params(64, 2))
            .unwrap_or_else(|e| panic!("opening: {e}"));
        (
            conn,
            b.close_active_endpoint(conn),
            b.close_active_endpoint(conn),
        )
    });
    close.unwrap_or_else(|e| panic!("closing a connection still opening is allowed: {e}"));
    assert!(
        matches!(again, Err(CloseError::UnknownConnection(x)) if x == conn),
        "the handle is stale once the close call returned: a second close gave {again:?}"
    );
    let log = cl.log.clone();
    c.wait("the attempt is reported refused", || {
        !log.refused().is_empty() || !log.closed().is_empty()
    });
    c.settle();
    assert_eq!(
        cl.log.refused(),
        vec![(conn, listen, RefuseReason::Cancelled)],
        "closing a connection still opening reports it refused (Cancelled) to the initiator"
    );
    assert!(
        cl.log.closed().is_empty() && cl.log.established().is_empty(),
        "a connection closed while opening is neither established nor closed: {:?}",
        cl.log
    );
    c.connect(&s, &cl, listen, full_params(64, 2));
}

/// A connection still opening is not established: send and buffer calls
/// on its handle answer `UnknownConnection`, while `remote_address`,
/// `connection_to`, `pause_receive` and `resume_receive` work; once it is
/// established, sending works.
pub fn sends_on_a_connection_still_opening_answer_unknown_connection<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, full_params(64, 2)), s.ip);
    // On the loop thread, so that the connection cannot be established
    // between the calls.
    let (conn, r) = c.on_loop(&cl, move |b| {
        let conn = b
            .open_active_endpoint(listen, full_params(64, 2))
            .unwrap_or_else(|e| panic!("opening: {e}"));
        let r = (
            b.get_buffer(conn).map(|x| x.is_some()),
            b.send_data_copy(conn, &[b"early"], &[], 1),
            b.num_available_buffers(conn),
            b.remote_address(conn),
            b.connection_to(listen),
            b.pause_receive(conn),
            b.resume_receive(conn),
        );
        (conn, r)
    });
    assert!(
        matches!(r.0, Err(BufferError::UnknownConnection(x)) if x == conn),
        "get_buffer on a connection still opening: {:?}",
        r.0
    );
    // A provider without copy sends answers NotSupported to every one.
    assert!(
        match &r.1 {
            Err(SendError::UnknownConnection(x)) => *x == conn,
            Err(SendError::NotSupported(_)) => !copy_supported(&c),
            _ => false,
        },
        "send_data_copy on a connection still opening: {:?}",
        r.1
    );
    assert!(
        matches!(r.2, Err(BufferError::UnknownConnection(x)) if x == conn),
        "num_available_buffers on a connection still opening: {:?}",
        r.2
    );
    assert_eq!(
        r.3.ok(),
        Some(listen),
        "remote_address works while the connection is opening"
    );
    assert_eq!(
        r.4.ok(),
        Some(conn),
        "connection_to finds a connection still opening"
    );
    assert!(
        r.5.is_ok() && r.6.is_ok(),
        "pause_receive and resume_receive work while opening: {:?} {:?}",
        r.5,
        r.6
    );
    let log = cl.log.clone();
    c.wait("the connection is established", || {
        log.established_caps(conn).is_some()
    });
    c.send_buffered(&cl, conn, b"now".to_vec());
    let sl = s.log.clone();
    c.wait("the message arrives", || sl.all_data().len() == 1);
    assert_eq!(s.log.all_data()[0].1, b"now".to_vec(), "nothing sent early");
}

// ------------------------------------------------------- v2: sending

/// A send's queue slot is free when its `on_send_completed` runs: a handler
/// may send again from inside it at full depth, without `NoResources`.
pub fn a_send_slot_is_free_when_its_completion_is_reported<H: Harness>(mode: ThreadSafety) {
    const DEPTH: usize = 2;
    const MORE: u64 = 20;
    let mut c = Ctx::<H>::new(mode);
    let answers = Arc::new(Mutex::new(Vec::<String>::new()));
    let a2 = answers.clone();
    let react: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Completed { conn, key } = ev {
            if *key < MORE {
                let r = b.send_data_copy(
                    *conn,
                    &[&(key + DEPTH as u64).to_le_bytes()],
                    &[],
                    key + DEPTH as u64,
                );
                if let Err(e) = r {
                    a2.lock().unwrap().push(format!(
                        "send from inside the completion of key {key}: {e:?}"
                    ));
                }
            }
        }
    });
    let cfg = BackendConfig {
        send_queue_depth: DEPTH,
        ..c.config()
    };
    let cl = c.node_with(cfg, Some(react));
    let s = c.node();
    let p = c.pair_of(
        s,
        cl,
        ConnectionParams::receive(64, 64),
        ConnectionParams::default(),
    );
    let to_server = p.to_server;
    let first = c.on_loop(&p.client, move |b| {
        (0..DEPTH as u64)
            .map(|k| b.send_data_copy(to_server, &[&k.to_le_bytes()], &[], k))
            .collect::<Vec<_>>()
    });
    assert!(first.iter().all(Result::is_ok), "{first:?}");
    let total = MORE as usize + DEPTH;
    let (sl, a3) = (p.server.log.clone(), answers.clone());
    c.wait("every send made from a completion arrives", || {
        sl.data_on(p.to_client).len() >= total || !a3.lock().unwrap().is_empty()
    });
    let a = answers.lock().unwrap().clone();
    assert!(
        a.is_empty(),
        "a send's queue slot is free when its completion is reported, so a send from inside \
         on_send_completed at full depth must be accepted: {a:?}"
    );
}

/// A buffered send's buffer is back in its pool when its
/// `on_send_completed` runs: `get_buffer` from inside it succeeds with a
/// pool of one.
pub fn a_send_buffer_is_free_when_its_completion_is_reported<H: Harness>(mode: ThreadSafety) {
    const MORE: usize = 10;
    let mut c = Ctx::<H>::new(mode);
    let answers = Arc::new(Mutex::new(Vec::<String>::new()));
    let sent = Arc::new(AtomicUsize::new(1));
    let (a2, s2) = (answers.clone(), sent.clone());
    let react: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Completed { conn, .. } = ev {
            let n = s2.load(Ordering::SeqCst);
            if n <= MORE {
                match b.get_buffer(*conn) {
                    Ok(Some(mut buf)) => {
                        buf.write(b"again").unwrap();
                        match b.send_buffer(*conn, buf, n as u64) {
                            Ok(()) => {
                                s2.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => a2.lock().unwrap().push(format!("send_buffer: {e:?}")),
                        }
                    }
                    other => a2.lock().unwrap().push(format!(
                        "get_buffer from inside the completion of the only buffer: {other:?}"
                    )),
                }
            }
        }
    });
    let cfg = c.config();
    let cl = c.node_with(cfg, Some(react));
    let s = c.node();
    let p = c.pair_of(
        s,
        cl,
        ConnectionParams::receive(64, 64),
        ConnectionParams::buffered(64, 1),
    );
    c.send_buffered(&p.client, p.to_server, b"first".to_vec());
    let (sl, a3) = (p.server.log.clone(), answers.clone());
    c.wait("every send made from a completion arrives", || {
        sl.data_on(p.to_client).len() > MORE || !a3.lock().unwrap().is_empty()
    });
    let a = answers.lock().unwrap().clone();
    assert!(
        a.is_empty(),
        "a buffered send's buffer is back in its pool when its completion is reported: {a:?}"
    );
}

// ------------------------------------------------------- v2: backpressure

fn backpressure<H: Harness>(mode: ThreadSafety, how: &str) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(HELD_MSG * (HELD_DEPTH + 32));
    let cfg = BackendConfig {
        send_queue_depth: HELD_DEPTH,
        ..c.config()
    };
    let (s, cl) = (c.node(), c.node_with(cfg, None));
    let mut cp = ConnectionParams::buffered(HELD_MSG, 16);
    let send_mode = match how {
        "copy" => SendMode::Copy,
        "zero-copy" => {
            cp = cp.with_zero_copy(region.clone());
            SendMode::ZeroCopy(region.clone())
        }
        _ => SendMode::Buffered,
    };
    let p = c.pair_of(s, cl, ConnectionParams::receive(HELD_MSG, 8), cp);
    let before = (
        p.client.backend.memory_usage(),
        p.server.backend.memory_usage(),
    );
    c.pause(&p.server);
    let filled = c.fill(
        &p.client,
        p.to_server,
        send_mode.clone(),
        HELD_MSG,
        0,
        FILL_LIMIT,
    );
    // Pushed back, it stays pushed back while the peer reads nothing.
    c.settle();
    let again = c.fill(
        &p.client,
        p.to_server,
        send_mode.clone(),
        HELD_MSG,
        1 << 32,
        FILL_LIMIT,
    );
    assert!(
        again.keys.len() <= HELD_DEPTH + 16,
        "backpressure ({how}): after the provider pushed back ({}), {} more sends were \
         accepted while the peer read nothing",
        filled.pushed_back,
        again.keys.len()
    );
    let during = (
        p.client.backend.memory_usage(),
        p.server.backend.memory_usage(),
    );
    assert_eq!(
        during, before,
        "backpressure ({how}): buffer memory must not grow while the peer reads nothing"
    );
    c.resume(&p.server);
    let mut sent = filled.keys.clone();
    sent.extend(&again.keys);
    let (sl, cl2) = (p.server.log.clone(), p.client.log.clone());
    let n = sent.len();
    let to_server = p.to_server;
    c.wait(
        &format!("every accepted {how} send is delivered once the peer reads"),
        || sl.data_on(p.to_client).len() >= n && cl2.completed(to_server).len() >= n,
    );
    if matches!(send_mode, SendMode::Buffered) {
        let got: Vec<u64> = p
            .server
            .log
            .data_on(p.to_client)
            .iter()
            .map(|d| key_of(d))
            .collect();
        let want: Vec<u64> = (0..filled.keys.len() as u64)
            .chain((1u64 << 32)..(1u64 << 32) + again.keys.len() as u64)
            .collect();
        assert_eq!(
            got, want,
            "backpressure (buffered): every accepted send arrives, in order"
        );
        assert_eq!(
            p.client.log.completed(to_server).len(),
            n,
            "backpressure (buffered): one completion per accepted send"
        );
    } else {
        let got = assert_delivered_in_order(&p.server, p.to_client, &p.client, p.to_server, &sent);
        assert_eq!(
            got.len(),
            n,
            "backpressure ({how}): every accepted send arrives"
        );
        assert_each_key_once(&p.client, p.to_server, &sent, "the sender");
    }
    // Sending works again.
    let k = 1u64 << 40;
    let m = send_mode.clone();
    let r = c.call(&p.client, move |b| {
        let mut msg = vec![0u8; 64];
        msg[..8].copy_from_slice(&k.to_le_bytes());
        match &m {
            SendMode::Copy => b.send_data_copy(to_server, &[&msg], &[], k),
            SendMode::ZeroCopy(region) => {
                region.write(0, &msg).expect("the region is free again");
                b.send_data(to_server, &[region.slice(0, 64).unwrap()], &[], k)
            }
            SendMode::Chunk(region) => {
                let mut chunk = region.chunk(64).expect("the region is free again");
                chunk.copy_from_slice(&msg);
                b.send_chunk(to_server, chunk, &[], k).map_err(|e| e.error)
            }
            SendMode::Buffered => {
                let mut buf = b
                    .get_buffer(to_server)
                    .unwrap()
                    .expect("a free buffer again");
                buf.write(&msg).unwrap();
                b.send_buffer(to_server, buf, k)
            }
        }
    });
    r.unwrap_or_else(|e| panic!("backpressure ({how}): sending resumes after the peer reads: {e}"));
    c.wait("the send after the backlog arrives", || {
        sl.data_on(p.to_client).len() > n
    });
}

/// With the peer held back, buffered sends run out of buffers
/// (`get_buffer` = `None`), memory does not grow, and once the peer reads,
/// every accepted send arrives in order and sending resumes.
pub fn backpressure_stops_buffered_sends_and_resumes_after_the_peer_reads<H: Harness>(
    mode: ThreadSafety,
) {
    backpressure::<H>(mode, "buffered");
}

/// With the peer held back, copy sends answer `NoResources` once the
/// connection's queue is full, memory does not grow, and once the peer
/// reads, every accepted send arrives in order and sending resumes.
pub fn backpressure_stops_copy_sends_and_resumes_after_the_peer_reads<H: Harness>(
    mode: ThreadSafety,
) {
    backpressure::<H>(mode, "copy");
}

/// With the peer held back, zero-copy sends answer `NoResources` once the
/// connection's queue is full, and once the peer reads, every accepted send
/// arrives in order and sending resumes.
pub fn backpressure_stops_zero_copy_sends_and_resumes_after_the_peer_reads<H: Harness>(
    mode: ThreadSafety,
) {
    backpressure::<H>(mode, "zero-copy");
}

// ------------------------------------------------------- v2: delivery

/// A message to a side that opened the connection without receive buffers
/// closes the connection there with `CloseReason::Protocol`; it is never
/// delivered, and the sender's key is reported once.
pub fn message_to_a_side_without_receive_buffers_closes_with_protocol_error<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(
        ConnectionParams::buffered(64, 2),
        ConnectionParams::receive(64, 2),
    );
    let to_server = p.to_server;
    c.call(&p.client, move |b| {
        b.send_data_copy(to_server, &[b"unwanted"], &[], 5)
    })
    .expect("sending is allowed; the receiver decides");
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait_unless(
        "both sides report the close",
        "a message to a side without receive buffers is never delivered",
        || sl.closed_count(p.to_client) == 1 && cl.closed_count(to_server) == 1,
        || (!sl.all_data().is_empty()).then(|| format!("delivered: {:?}", sl.all_data())),
    );
    c.settle();
    let reason = p.server.log.closed()[0].reason.clone();
    assert!(
        matches!(reason, CloseReason::Protocol(_)),
        "the receiver without receive buffers closes with Protocol, got {reason:?}"
    );
    assert_each_key_once(&p.client, to_server, &[5], "the sender");
}

// ------------------------------------------------------- v2: closing

/// Closing locally while the peer is held back, with sends truly in
/// flight: every key is reported once on both sides, the queued ones
/// cancelled, nothing cancelled is delivered, and a message partly written
/// at the close (on a stream) is finished, never cut: the peer gets every
/// message whole.
pub fn local_close_with_sends_held_in_flight_reports_each_key_once_on_both_sides<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    c.pause(&p.server);
    let filled = c.fill(
        &p.client,
        p.to_server,
        SendMode::Copy,
        HELD_MSG,
        0,
        FILL_LIMIT,
    );
    let to_server = p.to_server;
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .expect("closing the sender's side");
    let cl = p.client.log.clone();
    c.wait("the sender reports its close", || {
        cl.closed_count(to_server) == 1
    });
    c.resume(&p.server);
    let sl = p.server.log.clone();
    c.wait("the receiver reports the close", || {
        sl.closed_count(p.to_client) == 1
    });
    c.settle();
    assert_each_key_once(&p.client, to_server, &filled.keys, "the sender");
    assert_each_key_once(
        &p.server,
        p.to_client,
        &[],
        "the receiver, which sent nothing",
    );
    assert!(
        !p.client.log.cancelled(to_server).is_empty(),
        "the sends still queued when the provider pushed back ({}) must be reported cancelled",
        filled.pushed_back
    );
    assert_delivered_in_order(&p.server, p.to_client, &p.client, to_server, &filled.keys);
    let cut: Vec<usize> = p
        .server
        .log
        .data_on(p.to_client)
        .iter()
        .map(Vec::len)
        .filter(|n| *n != HELD_MSG)
        .collect();
    assert!(
        cut.is_empty(),
        "a message partly written when its connection is closed is finished first: the peer \
         gets every message whole ({HELD_MSG} bytes) or not at all, never cut; got messages of \
         {cut:?} bytes"
    );
    assert_closed_for(
        &p.client,
        to_server,
        &[CloseReason::Local],
        "the closing side",
    );
    assert_closed_for(
        &p.server,
        p.to_client,
        &[CloseReason::PeerClosed, CloseReason::Reset],
        "the peer",
    );
}

/// The peer closes while this side's sends are truly in flight: every key
/// is reported once on both sides (the queued ones cancelled), nothing
/// cancelled is delivered.
pub fn peer_close_with_sends_in_flight_reports_each_key_once_on_both_sides<H: Harness>(
    mode: ThreadSafety,
) {
    sends_in_flight_then::<H>(
        mode,
        "the peer closed",
        |c, p| {
            let to_client = p.to_client;
            c.resume_with(&p.server, move |b| b.close_active_endpoint(to_client))
                .expect("the peer closes");
        },
        &[CloseReason::PeerClosed, CloseReason::Reset],
        &[CloseReason::Local],
    );
}

/// The peer closes the listener that accepted the connection while this
/// side's sends are truly in flight: every key is reported once on both
/// sides.
pub fn listener_close_with_sends_in_flight_reports_each_key_once_on_both_sides<H: Harness>(
    mode: ThreadSafety,
) {
    sends_in_flight_then::<H>(
        mode,
        "the peer closed its listener",
        |c, p| {
            let l = p.listen;
            c.resume_with(&p.server, move |b| b.close_listen_endpoint(l))
                .expect("the peer closes its listener");
        },
        &[CloseReason::PeerClosed, CloseReason::Reset],
        &[CloseReason::ListenerClosed],
    );
}

/// The connection is reset (a network failure) while this side's sends are
/// truly in flight: every key is reported once on both sides, and the peer
/// of the broken side reports `Reset`.
pub fn reset_with_sends_in_flight_reports_each_key_once_on_both_sides<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    c.pause(&p.server);
    let filled = c.fill(
        &p.client,
        p.to_server,
        SendMode::Copy,
        HELD_MSG,
        0,
        FILL_LIMIT,
    );
    c.reset(&p.server, p.to_client, p.accepted);
    c.resume(&p.server);
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("both sides report the reset connection closed", || {
        cl.closed_count(p.to_server) == 1 && sl.closed_count(p.to_client) == 1
    });
    c.settle();
    assert_each_key_once(&p.client, p.to_server, &filled.keys, "the sender");
    assert_each_key_once(
        &p.server,
        p.to_client,
        &[],
        "the receiver, which sent nothing",
    );
    assert!(
        !p.client.log.cancelled(p.to_server).is_empty(),
        "the sends queued when the provider pushed back must be reported cancelled"
    );
    assert_delivered_in_order(&p.server, p.to_client, &p.client, p.to_server, &filled.keys);
    assert_closed_for(&p.client, p.to_server, &[CloseReason::Reset], "the sender");
}

/// After all of a side's sends have completed, its orderly close delivers
/// every one of them to the peer before the peer's `on_connection_closed`
/// (each direction in turn).
pub fn sender_close_after_completions_delivers_everything_before_the_peer_hears_of_it<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    const N: u64 = 6;
    for server_sends in [false, true] {
        let mut c = Ctx::<H>::new(mode);
        let p = held_pair(&mut c);
        let (sender, receiver, to, from) = if server_sends {
            (&p.server, &p.client, p.to_client, p.to_server)
        } else {
            (&p.client, &p.server, p.to_server, p.to_client)
        };
        let dir = if server_sends {
            "server to client"
        } else {
            "client to server"
        };
        c.pause(receiver);
        for k in 0..N {
            let mut msg = vec![k as u8; 1000];
            msg[..8].copy_from_slice(&k.to_le_bytes());
            c.send_copy(sender, to, msg, k);
        }
        let log = sender.log.clone();
        c.wait(&format!("all {N} sends complete ({dir})"), || {
            log.completed(to).len() as u64 == N
        });
        c.call(sender, move |b| b.close_active_endpoint(to))
            .expect("the sender closes");
        c.wait("the sender reports its close", || log.closed_count(to) == 1);
        c.resume(receiver);
        let rl = receiver.log.clone();
        c.wait("the receiver reports the close", || {
            rl.closed_count(from) == 1
        });
        let events = receiver.log.events();
        let close_at = events
            .iter()
            .position(|e| matches!(e, Event::Closed { .. }))
            .expect("a close");
        let before: Vec<u64> = events[..close_at]
            .iter()
            .filter_map(|e| match e {
                Event::Data { data, .. } => Some(key_of(data)),
                _ => None,
            })
            .collect();
        assert_eq!(
            before,
            (0..N).collect::<Vec<_>>(),
            "{dir}: every send the sender saw completed before its orderly close is delivered \
             before the peer's on_connection_closed"
        );
        assert_closed_for(receiver, from, &[CloseReason::PeerClosed], "the receiver");
    }
}

/// Messages that reached the peer before this side closed are delivered to
/// it before it reports the close; nothing is reported after the close.
pub fn messages_before_a_peer_close_are_delivered_before_the_close<H: Harness>(mode: ThreadSafety) {
    arrived_then_closed::<H>(mode, false);
}

/// Messages that reached the peer before the connection was reset are
/// delivered to it before it reports the close; nothing after.
pub fn messages_before_a_reset_are_delivered_before_the_close<H: Harness>(mode: ThreadSafety) {
    arrived_then_closed::<H>(mode, true);
}

fn arrived_then_closed<H: Harness>(mode: ThreadSafety, reset: bool) {
    const N: u64 = 5;
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    c.pause(&p.server);
    for k in 0..N {
        let mut msg = vec![k as u8; 100];
        msg[..8].copy_from_slice(&k.to_le_bytes());
        c.send_copy(&p.client, p.to_server, msg, k);
    }
    let cl = p.client.log.clone();
    c.wait("the sends complete", || {
        cl.completed(p.to_server).len() as u64 == N
    });
    // Give the bytes time to cross into the held peer's transport.
    c.settle();
    if reset {
        c.reset(&p.client, p.to_server, p.listen);
    } else {
        let to_server = p.to_server;
        c.call(&p.client, move |b| b.close_active_endpoint(to_server))
            .expect("closing");
    }
    c.wait("the sender reports the close", || {
        cl.closed_count(p.to_server) == 1
    });
    // Let the hang-up reach the held peer too, so that it finds the
    // messages and the hang-up together when it resumes.
    c.settle();
    c.resume(&p.server);
    let sl = p.server.log.clone();
    c.wait("the peer reports the close", || {
        sl.closed_count(p.to_client) == 1
    });
    c.settle();
    let events = p.server.log.events();
    let close_at = events
        .iter()
        .position(|e| matches!(e, Event::Closed { .. }))
        .expect("a close");
    let before: Vec<u64> = events[..close_at]
        .iter()
        .filter_map(|e| match e {
            Event::Data { data, .. } => Some(key_of(data)),
            _ => None,
        })
        .collect();
    let how = if reset { "reset" } else { "closed by the peer" };
    assert_eq!(
        before,
        (0..N).collect::<Vec<_>>(),
        "messages that arrived before the connection was {how} are delivered before \
         on_connection_closed, not dropped with the hang-up"
    );
    assert_eq!(
        close_at + 1,
        events.len(),
        "nothing is reported after the close: {events:?}"
    );
    let want = if reset {
        CloseReason::Reset
    } else {
        CloseReason::PeerClosed
    };
    assert_closed_for(&p.server, p.to_client, &[want], "the peer");
}

/// From the close call on, the connection takes no more operations (sends,
/// `get_buffer`, `pause_receive`, `remote_address` and a second close
/// answer `UnknownConnection` with its handle at once), delivers nothing
/// more, and is no longer found by `connection_to`; a new connection to the
/// same address can be opened at once, gets a new handle and works.
pub fn a_closed_connection_refuses_operations_at_once_and_its_handle_is_stale<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    let (to_server, listen) = (p.to_server, p.listen);
    let r = c.on_loop(&p.client, move |b| {
        b.close_active_endpoint(to_server).expect("close");
        (
            b.send_data_copy(to_server, &[b"late"], &[], 1),
            b.get_buffer(to_server).map(|x| x.is_some()),
            b.close_active_endpoint(to_server),
            b.pause_receive(to_server),
            b.remote_address(to_server),
            b.connection_to(listen),
            b.open_active_endpoint(listen, full_params(64, 4)),
        )
    });
    assert!(
        matches!(r.0, Err(SendError::UnknownConnection(x)) if x == to_server),
        "a send after the close call fails at once with UnknownConnection: {:?}",
        r.0
    );
    assert!(
        matches!(r.1, Err(BufferError::UnknownConnection(x)) if x == to_server),
        "get_buffer after the close call fails with UnknownConnection: {:?}",
        r.1
    );
    assert!(
        matches!(r.2, Err(CloseError::UnknownConnection(x)) if x == to_server),
        "a second close fails with UnknownConnection: {:?}",
        r.2
    );
    assert!(
        matches!(r.3, Err(ConnError::UnknownConnection(x)) if x == to_server),
        "pause_receive after the close call fails with UnknownConnection: {:?}",
        r.3
    );
    assert!(
        matches!(r.4, Err(ConnError::UnknownConnection(x)) if x == to_server),
        "remote_address after the close call fails with UnknownConnection: {:?}",
        r.4
    );
    assert!(
        matches!(r.5, Err(ConnError::NoConnectionTo(a)) if a == listen),
        "connection_to no longer finds a closed connection: {:?}",
        r.5
    );
    let new =
        r.6.unwrap_or_else(|e| panic!("opening a new connection right after the close: {e}"));
    assert_ne!(new, to_server, "the new connection gets a new handle");
    let (cl, sl) = (p.client.log.clone(), p.server.log.clone());
    c.wait(
        "the old connection's close and the new connection are reported",
        || {
            cl.closed_count(to_server) == 1
                && cl.established_caps(new).is_some()
                && sl.established().len() == 2
        },
    );
    c.send_copy(&p.client, new, b"new".to_vec(), 2);
    c.wait("the new connection carries data", || {
        sl.all_data().iter().any(|d| d.1 == b"new")
    });
    c.settle();
    assert_eq!(
        p.client.log.closed()[0].reason,
        CloseReason::Local,
        "the closed connection reports Local"
    );
    assert!(
        p.client.log.data_on(to_server).is_empty(),
        "nothing is delivered on a closed connection"
    );
}

/// 500 cycles of connect, one message, close leave the provider's resources
/// (descriptors for socket providers) where they started.
pub fn open_close_cycles_leave_no_resources_behind<H: Harness>(mode: ThreadSafety) {
    const CYCLES: usize = 500;
    let mut c = Ctx::<H>::alone(mode);
    let (s, cl) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, full_params(64, 4)), s.ip);
    // One cycle first, so that lazily made resources exist before counting.
    let cycle = |c: &mut Ctx<H>, i: usize| {
        let conn = c.connect(&s, &cl, listen, full_params(64, 4));
        c.send_copy_or_buffered(&cl, conn.client, vec![i as u8; 8], i as u64);
        let (sl, clog) = (s.log.clone(), cl.log.clone());
        c.wait("the message arrives", || sl.all_data().len() > i);
        if i % 2 == 0 {
            c.call(&cl, move |b| b.close_active_endpoint(conn.client))
                .expect("close");
        } else {
            c.call(&s, move |b| b.close_active_endpoint(conn.server))
                .expect("close");
        }
        c.wait("both sides report the close", || {
            clog.closed().len() > i && sl.closed().len() > i
        });
    };
    cycle(&mut c, 0);
    c.settle();
    let start = c.h.resources();
    for i in 1..=CYCLES {
        cycle(&mut c, i);
    }
    let mut now = c.h.resources();
    for _ in 0..10 {
        if now <= start {
            break;
        }
        c.settle();
        now = c.h.resources();
    }
    assert!(
        now <= start,
        "{CYCLES} open and close cycles leave no resources behind: {start} before, {now} after \
         ({} leaked, about {:.2} per cycle)",
        now - start,
        (now - start) as f64 / CYCLES as f64
    );
}

/// Handlers are called on the loop thread after the operation that caused
/// the event returned, never from inside it: many sends, closes and
/// replies from the test thread and from callbacks, with events pending,
/// and the suite's monitor sees no handler call nested in a backend call.
pub fn handlers_are_never_called_from_inside_a_backend_call<H: Harness>(mode: ThreadSafety) {
    const N: u64 = 200;
    let mut c = Ctx::<H>::new(mode);
    let echo: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Data { conn, data } = ev {
            let _ = b.send_data_copy(*conn, &[data], &[], key_of(data));
        }
    });
    let cfg = c.config();
    let s = c.node_with(cfg, Some(echo));
    let cl = c.node();
    let p = c.pair_of(s, cl, full_params(64, 16), full_params(64, 16));
    let to_server = p.to_server;
    let mut sent = 0;
    while sent < N {
        let k0 = sent;
        let n = c.on_loop(&p.client, move |b| {
            let mut n = 0;
            for k in k0..N {
                if b.send_data_copy(to_server, &[&k.to_le_bytes()], &[], k)
                    .is_err()
                {
                    break;
                }
                let _ = b.num_available_buffers(to_server);
                n += 1;
            }
            n
        });
        sent += n;
        let cl = p.client.log.clone();
        c.wait("some sends complete", || {
            cl.completed(to_server).len() as u64 >= sent.min(N) / 2
        });
    }
    let cl = p.client.log.clone();
    c.wait("every echo arrives", || {
        cl.data_on(to_server).len() as u64 == N
    });
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .expect("close");
    let sl = p.server.log.clone();
    c.wait("both sides report the close", || {
        cl.closed_count(to_server) == 1 && sl.closed_count(p.to_client) == 1
    });
    c.settle();
    c.check();
}

// ------------------------------------------------------- v2: handles

/// A client whose connections all leave from one local port reaches two
/// listeners of one server: the server sees two connections with equal
/// remote addresses (ip:port). Both establish, each has its own handle on
/// each side, data of one never appears on the other, `connection_to` on
/// the server names the older, and closing one leaves the other working
/// (no reset, no close of the other).
pub fn two_connections_from_one_local_port_to_two_listeners_are_distinct<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let cl = c.node_from_one_port();
    let la = connect_target(c.listen(&s, full_params(64, 4)), s.ip);
    let lb = connect_target(c.listen(&s, full_params(64, 4)), s.ip);
    let a = c
        .call(&cl, move |b| b.open_active_endpoint(la, full_params(64, 4)))
        .unwrap_or_else(|e| panic!("the connection to the first listener {la}: {e}"));
    let (sl, clog) = (s.log.clone(), cl.log.clone());
    c.wait("the first connection is established on both sides", || {
        clog.established_caps(a).is_some() && sl.established().len() == 1
    });
    let b = c
        .call(&cl, move |bk| {
            bk.open_active_endpoint(lb, full_params(64, 4))
        })
        .unwrap_or_else(|e| {
            panic!("a connection from the same local port to another listener {lb}: {e}")
        });
    c.wait_unless(
        "the second connection is established on both sides",
        "a second connection from one local port to another listener establishes",
        || clog.established_caps(b).is_some() && sl.established().len() == 2,
        || {
            let r = clog.refused();
            (!r.is_empty()).then(|| format!("refused: {r:?}"))
        },
    );
    let accepted = s.log.established();
    let ((srv_a, ra, _), (srv_b, rb, _)) = (accepted[0], accepted[1]);
    assert_ne!(srv_a, srv_b, "the server sees two distinct handles");
    assert_eq!(
        ra, rb,
        "both connections come from one local port, so their remote addresses are equal"
    );
    assert_eq!(ra.ip(), cl.ip);
    let named = c.call(&s, move |bk| bk.connection_to(ra));
    assert_eq!(
        named.ok(),
        Some(srv_a),
        "connection_to names the older connection"
    );
    c.send_buffered(&cl, a, b"to a".to_vec());
    c.send_buffered(&cl, b, b"to b".to_vec());
    c.wait("both messages arrive", || sl.all_data().len() == 2);
    c.settle();
    assert_eq!(s.log.data_on(srv_a), vec![b"to a".to_vec()]);
    assert_eq!(s.log.data_on(srv_b), vec![b"to b".to_vec()]);
    c.send_buffered(&s, srv_b, b"back on b".to_vec());
    c.wait("the reply arrives", || !clog.data_on(b).is_empty());
    c.settle();
    assert!(
        clog.data_on(a).is_empty(),
        "data of one connection never appears on the other"
    );
    c.call(&s, move |bk| bk.close_active_endpoint(srv_a))
        .expect("closing the first on the server");
    c.wait("both sides report the first closed", || {
        clog.closed_count(a) == 1 && sl.closed_count(srv_a) == 1
    });
    let named = c.call(&s, move |bk| bk.connection_to(ra));
    assert_eq!(
        named.ok(),
        Some(srv_b),
        "the other is still named by the address"
    );
    c.send_buffered(&cl, b, b"b still works".to_vec());
    c.wait("the second connection still works", || {
        sl.data_on(srv_b).len() == 2
    });
    c.settle();
    assert_eq!(clog.closed_count(b), 0, "closing one leaves the other open");
    assert_eq!(
        sl.closed_count(srv_b),
        0,
        "closing one leaves the other open"
    );
}

/// Two connections from one backend to one listener are distinct: both
/// establish, each side sees two handles, data of one never appears on the
/// other, and closing one leaves the other working.
pub fn two_connections_to_one_address_are_distinct_connections<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let (s, cl) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, full_params(64, 4)), s.ip);
    let (a, b) = c.on_loop(&cl, move |b| {
        (
            b.open_active_endpoint(listen, full_params(64, 4)),
            b.open_active_endpoint(listen, full_params(64, 4)),
        )
    });
    let a = a.unwrap_or_else(|e| panic!("the first connection to {listen}: {e}"));
    let b = b.unwrap_or_else(|e| panic!("a second connection to {listen} is allowed: {e}"));
    assert_ne!(a, b, "two connections to one address have distinct handles");
    let (sl, clog) = (s.log.clone(), cl.log.clone());
    c.wait_unless(
        "both connections are established on both sides",
        "two connections to one listening address both establish",
        || {
            clog.established_caps(a).is_some()
                && clog.established_caps(b).is_some()
                && sl.established().len() == 2
        },
        || {
            let r = clog.refused();
            (!r.is_empty()).then(|| format!("refused: {r:?}"))
        },
    );
    let accepted = s.log.established();
    let (x, y) = (accepted[0].0, accepted[1].0);
    assert_ne!(x, y, "the server sees two distinct handles");
    assert!(
        accepted[0].1.ip() == cl.ip && accepted[1].1.ip() == cl.ip,
        "the server reports the client's address for both: {accepted:?}"
    );
    assert_ne!(
        accepted[0].1, accepted[1].1,
        "two connections from one client have distinct remote addresses (ports)"
    );
    c.send_buffered(&cl, a, b"on a".to_vec());
    c.send_buffered(&cl, b, b"on b".to_vec());
    c.wait("both messages arrive", || sl.all_data().len() == 2);
    c.settle();
    let on_x = s.log.data_on(x);
    let on_y = s.log.data_on(y);
    assert_eq!(
        on_x.len(),
        1,
        "one message per connection: {on_x:?} {on_y:?}"
    );
    assert_eq!(
        on_y.len(),
        1,
        "one message per connection: {on_x:?} {on_y:?}"
    );
    // Which accepted handle is which client handle, by what arrived.
    let (srv_a, srv_b) = if on_x[0] == b"on a" { (x, y) } else { (y, x) };
    assert_eq!(s.log.data_on(srv_b), vec![b"on b".to_vec()]);
    c.send_buffered(&s, srv_a, b"back on a".to_vec());
    c.wait("the reply arrives", || !clog.data_on(a).is_empty());
    c.settle();
    assert_eq!(clog.data_on(a), vec![b"back on a".to_vec()]);
    assert!(
        clog.data_on(b).is_empty(),
        "data of one connection never appears on the other"
    );
    c.call(&cl, move |bk| bk.close_active_endpoint(a))
        .expect("closing the first");
    c.wait("both sides report the first closed", || {
        clog.closed_count(a) == 1 && sl.closed_count(srv_a) == 1
    });
    c.send_buffered(&cl, b, b"b still works".to_vec());
    c.wait("the second connection still works", || {
        sl.data_on(srv_b).len() == 2
    });
    c.settle();
    assert_eq!(clog.closed_count(b), 0, "closing one leaves the other open");
    assert_eq!(
        sl.closed_count(srv_b),
        0,
        "closing one leaves the other open"
    );
}

/// A handle whose connection closed answers `UnknownConnection` with that
/// handle for good, also once new connections (which may reuse its slot)
/// exist; no new connection gets an old handle.
pub fn a_stale_handle_answers_unknown_connection_even_after_its_slot_is_reused<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let copy = copy_supported(&c);
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    let (old_c, old_s) = (p.to_server, p.to_client);
    c.call(&p.client, move |b| b.close_active_endpoint(old_c))
        .expect("close");
    let (cl, sl) = (p.client.log.clone(), p.server.log.clone());
    c.wait("both sides report the close", || {
        cl.closed_count(old_c) == 1 && sl.closed_count(old_s) == 1
    });
    let mut issued_c = vec![old_c];
    let mut issued_s = vec![old_s];
    for round in 0..4 {
        let n = c.connect(&p.server, &p.client, p.listen, full_params(64, 4));
        assert!(
            !issued_c.contains(&n.client) && !issued_s.contains(&n.server),
            "round {round}: a new connection got a handle issued before: {n:?}, earlier \
             {issued_c:?} / {issued_s:?}"
        );
        issued_c.push(n.client);
        issued_s.push(n.server);
        for (node, stale, live) in [(&p.client, old_c, n.client), (&p.server, old_s, n.server)] {
            let r = c.call(node, move |b| {
                let spare = b
                    .get_buffer(live)
                    .unwrap()
                    .expect("a free buffer on the new connection");
                (
                    b.get_buffer(stale).map(|o| o.is_some()),
                    b.send_buffer(stale, spare, 1),
                    b.send_data_copy(stale, &[b"x"], &[], 2),
                    b.num_available_buffers(stale),
                    b.close_active_endpoint(stale),
                    b.pause_receive(stale),
                    b.resume_receive(stale),
                    b.remote_address(stale),
                )
            });
            check_unknown(stale, r, copy);
        }
        // The new connection works.
        c.send_buffered(&p.client, n.client, vec![round as u8; 4]);
        c.wait("the message on the new connection arrives", || {
            sl.data_on(n.server).len() == 1
        });
        // Close it from alternating sides, so both tables recycle.
        if round % 2 == 0 {
            c.call(&p.server, move |b| b.close_active_endpoint(n.server))
                .expect("close");
        } else {
            c.call(&p.client, move |b| b.close_active_endpoint(n.client))
                .expect("close");
        }
        c.wait("both sides report the close", || {
            cl.closed_count(n.client) == 1 && sl.closed_count(n.server) == 1
        });
    }
    c.settle();
    assert!(
        cl.data_on(old_c).is_empty() && sl.data_on(old_s).is_empty(),
        "nothing is delivered on a stale handle"
    );
}

/// `remote_address` gives a connection's remote address on both sides
/// (the listener's address on the initiator, the client's ip:port on the
/// acceptor), and `connection_to` finds the oldest connection with that
/// remote address, or answers `NoConnectionTo`.
pub fn connection_to_and_remote_address_name_connections_by_address<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    let (to_server, to_client, listen, accepted) = (p.to_server, p.to_client, p.listen, p.accepted);
    let (ra, ct) = c.call(&p.client, move |b| {
        (b.remote_address(to_server), b.connection_to(listen))
    });
    assert_eq!(ra.ok(), Some(listen), "the initiator's remote address");
    assert_eq!(ct.ok(), Some(to_server), "connection_to the listener");
    let (ra, ct) = c.call(&p.server, move |b| {
        (b.remote_address(to_client), b.connection_to(accepted))
    });
    assert_eq!(
        ra.ok(),
        Some(accepted),
        "the acceptor's remote address is the one on_connection_established gave"
    );
    assert_eq!(
        ct.ok(),
        Some(to_client),
        "connection_to the client's address"
    );
    // A second connection to the same address: connection_to still gives
    // the oldest, until it closes.
    let second = c.connect(&p.server, &p.client, listen, full_params(64, 4));
    let (ct, ra2) = c.call(&p.client, move |b| {
        (b.connection_to(listen), b.remote_address(second.client))
    });
    assert_eq!(
        ct.ok(),
        Some(to_server),
        "of two connections to one address, connection_to gives the oldest"
    );
    assert_eq!(ra2.ok(), Some(listen));
    let ra = c.call(&p.server, move |b| b.remote_address(second.server));
    assert_eq!(ra.ok(), Some(second.accepted));
    let (cl, sl) = (p.client.log.clone(), p.server.log.clone());
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .expect("close");
    let ct = c.call(&p.client, move |b| b.connection_to(listen));
    assert_eq!(
        ct.ok(),
        Some(second.client),
        "once the oldest is closed, connection_to gives the other"
    );
    c.wait("the server hears of the close", || {
        sl.closed_count(to_client) == 1
    });
    let ct = c.call(&p.server, move |b| b.connection_to(accepted));
    assert!(
        matches!(ct, Err(ConnError::NoConnectionTo(a)) if a == accepted),
        "connection_to the address of a closed connection: {ct:?}"
    );
    let s2 = second.client;
    c.call(&p.client, move |b| b.close_active_endpoint(s2))
        .expect("close");
    let ct = c.call(&p.client, move |b| b.connection_to(listen));
    assert!(
        matches!(ct, Err(ConnError::NoConnectionTo(a)) if a == listen),
        "no connection to {listen} is left: {ct:?}"
    );
    c.wait("both closes are reported", || {
        cl.closed_count(to_server) == 1 && cl.closed_count(second.client) == 1
    });
}

// ------------------------------------------------------- v2: batches

/// Completions of one connection come through `on_sends_completed` in the
/// order the sends were accepted, each key exactly once; a handler that
/// implements only `on_send_completed` still gets every key, in order.
pub fn completions_of_one_connection_come_in_send_order<H: Harness>(mode: ThreadSafety) {
    const ROUNDS: u64 = 12;
    const POOL: usize = 16;
    let mut c = Ctx::<H>::new(mode);
    let s = c.node();
    let listen = connect_target(c.listen(&s, full_params(64, 64)), s.ip);
    let cfg = c.config();
    let batched = c.node_with(cfg.clone(), None);
    let per_key = c.node_per_key(cfg, None);
    for node in [&batched, &per_key] {
        let both = c.connect(&s, node, listen, full_params(64, POOL));
        let conn = both.client;
        let mut sent: Vec<u64> = Vec::new();
        for round in 0..ROUNDS {
            // Many sends in one loop callback, so that several complete
            // together; keys neither sorted nor buffer indices.
            let base = sent.len() as u64;
            let keys = c.on_loop(node, move |b| {
                let mut keys = Vec::new();
                while let Some(mut buf) = b.get_buffer(conn).unwrap() {
                    let key = ((base + keys.len() as u64) * 7919 + round) ^ 0x5a5a;
                    buf.write(&key.to_le_bytes()).unwrap();
                    b.send_buffer(conn, buf, key).unwrap();
                    keys.push(key);
                }
                keys
            });
            assert!(!keys.is_empty(), "a free buffer after the previous round");
            sent.extend(keys);
            let log = node.log.clone();
            let n = sent.len();
            c.wait("the round's sends complete", || {
                log.completed(conn).len() >= n
            });
        }
        // A completion may come before the delivery (a TCP send completes
        // when the kernel takes it): wait for the messages, not a while.
        let server_log = s.log.clone();
        let (server, n) = (both.server, sent.len());
        c.wait("every message reaches the server", || {
            server_log.data_on(server).len() >= n
        });
        c.settle();
        let got = node.log.completed(conn);
        assert_eq!(
            got, sent,
            "completions of one connection come in the order the sends were accepted, each \
             key exactly once"
        );
        let batches = node.log.batches(conn);
        assert!(
            batches.iter().all(|b| !b.is_empty()),
            "no empty batch: {batches:?}"
        );
        assert_eq!(
            batches.concat(),
            sent,
            "the batches, one after another, are the sends in order"
        );
        let delivered: Vec<u64> = s
            .log
            .data_on(both.server)
            .iter()
            .map(|d| key_of(d))
            .collect();
        assert_eq!(delivered, sent, "every message arrives once, in order");
    }
}

// ------------------------------------------------------- v2: flow control

/// Messages sent to a paused connection are not lost, whether or not the
/// provider pushes the sender back meanwhile (that is the `backpressure`
/// behaviours' business): every message the sender handed over while the
/// receiver was paused, eight times as many as the receiver posts buffers
/// for, arrives after `resume_receive`, in order, exactly once, and every
/// send completes.
pub fn messages_sent_to_a_paused_connection_all_arrive_after_resume<H: Harness>(
    mode: ThreadSafety,
) {
    // 64 messages of 16 KiB: the receiver has buffers for 8.
    const LIMIT: usize = 64 * HELD_MSG;
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    let (to_server, to_client) = (p.to_server, p.to_client);
    let r = c.call(&p.server, move |b| b.pause_receive(to_client));
    assert!(r.is_ok(), "pausing an open connection: {r:?}");
    // Send until the limit, or until the provider pushes back and still
    // does once the loops settled.
    let mut keys: Vec<u64> = Vec::new();
    let mut retried = false;
    while keys.len() * HELD_MSG < LIMIT {
        let k = keys.len() as u64;
        let sent = c.call(&p.client, move |b| match b.get_buffer(to_server) {
            Ok(Some(mut buf)) => {
                let mut msg = vec![(k % 251) as u8; HELD_MSG];
                msg[..8].copy_from_slice(&k.to_le_bytes());
                buf.write(&msg).expect("message fits the send buffer");
                match b.send_buffer(to_server, buf, k) {
                    Ok(()) => Ok(true),
                    Err(SendError::NoResources) => Ok(false),
                    Err(e) => Err(format!("send_buffer: {e}")),
                }
            }
            Ok(None) => Ok(false),
            Err(e) => Err(format!("get_buffer: {e}")),
        });
        match sent {
            Ok(true) => {
                keys.push(k);
                retried = false;
            }
            Ok(false) if !retried => {
                c.settle();
                retried = true;
            }
            Ok(false) => break,
            Err(e) => panic!("sending to a paused peer: {e}"),
        }
    }
    assert!(!keys.is_empty(), "nothing could be sent at all");
    c.settle();
    assert!(
        p.server.log.data_on(to_client).is_empty(),
        "no on_data for a paused connection"
    );
    let r = c.call(&p.server, move |b| b.resume_receive(to_client));
    assert!(r.is_ok(), "resuming a paused connection: {r:?}");
    let n = keys.len();
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("every message sent while paused arrives", || {
        sl.data_on(to_client).len() >= n && cl.completed(to_server).len() >= n
    });
    c.settle();
    let got: Vec<u64> = p
        .server
        .log
        .data_on(to_client)
        .iter()
        .map(|d| key_of(d))
        .collect();
    assert_eq!(
        got, keys,
        "every message sent to the paused connection arrives, in order, exactly once"
    );
    assert_eq!(p.client.log.completed(to_server), keys);
}

/// After `pause_receive` returns, nothing of the connection is delivered;
/// the provider stops taking the peer's data, so the peer's sends push
/// back (`NoResources` or no free buffer) while this side's loop keeps
/// running; after `resume_receive` every message arrives in order, exactly
/// once, and sending goes on.
pub fn pausing_receive_stops_delivery_and_pushes_back_on_the_sender_and_resume_delivers_everything_in_order<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    const BEFORE: u64 = 3;
    let mut c = Ctx::<H>::new(mode);
    let p = held_pair(&mut c);
    let (to_server, to_client) = (p.to_server, p.to_client);
    for k in 0..BEFORE {
        let mut msg = vec![k as u8; 64];
        msg[..8].copy_from_slice(&k.to_le_bytes());
        c.send_buffered_key(&p.client, to_server, msg, k);
    }
    let sl = p.server.log.clone();
    c.wait("the first messages arrive", || {
        sl.data_on(to_client).len() as u64 == BEFORE
    });
    let r = c.call(&p.server, move |b| {
        (b.pause_receive(to_client), b.pause_receive(to_client))
    });
    assert!(
        r.0.is_ok() && r.1.is_ok(),
        "pausing (twice) an open connection: {r:?}"
    );
    let filled = c.fill(
        &p.client,
        to_server,
        SendMode::Buffered,
        HELD_MSG,
        BEFORE,
        FILL_LIMIT,
    );
    c.settle();
    let during = p.server.log.data_on(to_client).len() as u64;
    assert_eq!(
        during,
        BEFORE,
        "no on_data for a paused connection: {} messages were delivered after pause_receive \
         returned",
        during - BEFORE
    );
    let r = c.call(&p.server, move |b| {
        (b.resume_receive(to_client), b.resume_receive(to_client))
    });
    assert!(
        r.0.is_ok() && r.1.is_ok(),
        "resuming (twice) a paused connection: {r:?}"
    );
    let n = BEFORE as usize + filled.keys.len();
    let cl = p.client.log.clone();
    c.wait("every message arrives after resume_receive", || {
        sl.data_on(to_client).len() >= n && cl.completed(to_server).len() >= n
    });
    c.settle();
    let got: Vec<u64> = p
        .server
        .log
        .data_on(to_client)
        .iter()
        .map(|d| key_of(d))
        .collect();
    let want: Vec<u64> = (0..BEFORE).chain(filled.keys.iter().copied()).collect();
    assert_eq!(
        got, want,
        "after resume_receive every message held arrives, in order, exactly once"
    );
    c.send_buffered_key(
        &p.client,
        to_server,
        (1u64 << 40).to_le_bytes().to_vec(),
        1 << 40,
    );
    c.wait("sending goes on after the backlog", || {
        sl.data_on(to_client).len() > n
    });
    assert!(
        p.client.log.closed().is_empty() && p.server.log.closed().is_empty(),
        "pausing closes nothing"
    );
}

/// A peer's orderly close of a paused connection is reported after the
/// messages held while paused: messages that reached this side (its loop
/// held back) before `pause_receive` are not reported while paused, nor is
/// the peer's close that follows them; after `resume_receive` every
/// message arrives, in order, then the close.
pub fn pause_then_peer_close_reports_the_close_after_the_held_messages<H: Harness>(
    mode: ThreadSafety,
) {
    pause_then_peer_close::<H>(mode, 5, Duration::ZERO);
}

/// The same with 64 messages held and a handler that spends half a
/// millisecond on each: a provider that hands held messages over in runs
/// bounded in time (so that its loop's timers keep firing) still reports
/// the close after the last message, also when the last run ends on its
/// bound with nothing left held.
pub fn pause_then_peer_close_to_a_slow_handler_reports_the_close_after_many_held_messages<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    pause_then_peer_close::<H>(mode, 64, Duration::from_micros(500));
}

/// [`pause_then_peer_close_reports_the_close_after_the_held_messages`]
/// with `n` messages and a server handler that spends `slow` on each.
fn pause_then_peer_close<H: Harness>(mode: ThreadSafety, n: u64, slow: Duration) {
    let mut c = Ctx::<H>::new(mode);
    let react: Option<React<H::Backend>> = (!slow.is_zero()).then(|| {
        let react: React<H::Backend> = Box::new(move |_, ev| {
            if let Event::Data { .. } = ev {
                std::thread::sleep(slow);
            }
        });
        react
    });
    let cfg = c.config();
    let (server, client) = (c.node_with(cfg, react), c.node());
    let bufs = (n as usize).max(16);
    let p = c.pair_of(server, client, full_params(64, bufs), full_params(64, bufs));
    let (to_server, to_client) = (p.to_server, p.to_client);
    // The server's loop is held, so the messages reach it unread.
    c.pause(&p.server);
    for k in 0..n {
        let mut msg = vec![k as u8; 32];
        msg[..8].copy_from_slice(&k.to_le_bytes());
        c.send_buffered_key(&p.client, to_server, msg, k);
    }
    let cl = p.client.log.clone();
    c.wait("the sends complete", || {
        cl.completed(to_server).len() as u64 == n
    });
    c.settle();
    // Pause receiving first thing when the loop goes on.
    c.resume_with(&p.server, move |b| b.pause_receive(to_client))
        .expect("pause_receive");
    c.settle();
    let sl = p.server.log.clone();
    assert!(
        sl.data_on(to_client).is_empty(),
        "no on_data after pause_receive returned, also for messages that had already \
         arrived: {:?}",
        sl.events_of(to_client)
    );
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .expect("close");
    c.wait("the closing side reports its close", || {
        cl.closed_count(to_server) == 1
    });
    c.settle();
    let events = p.server.log.events_of(to_client);
    assert_eq!(
        events.len(),
        1,
        "while paused, neither the held messages nor the peer's orderly close are reported: \
         {events:?}"
    );
    c.call(&p.server, move |b| b.resume_receive(to_client))
        .expect("resume_receive");
    c.wait("the close is reported after resume", || {
        sl.closed_count(to_client) == 1
    });
    c.settle();
    let events = p.server.log.events_of(to_client);
    let data: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            Event::Data { data, .. } => Some(key_of(data)),
            _ => None,
        })
        .collect();
    assert_eq!(
        data,
        (0..n).collect::<Vec<_>>(),
        "every held message is delivered after resume_receive, in order, exactly once"
    );
    assert!(
        matches!(
            events.last(),
            Some(Event::Closed {
                reason: CloseReason::PeerClosed,
                ..
            })
        ),
        "the peer's orderly close comes after the held messages: {events:?}"
    );
}

// ------------------------------------------------------- v2: time

/// `set_timer` (callable from any thread) calls `on_timer(token)` once per
/// call, no earlier than `delay` after the call, in deadline order (equal
/// deadlines in the order set); a handler can set a timer from `on_timer`.
pub fn set_timer_calls_on_timer_after_the_delay_in_order<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let again: React<H::Backend> = Box::new(|b, ev| {
        if let Event::Timer { token: 4, .. } = ev {
            b.set_timer(Duration::from_millis(5), 5);
        }
    });
    let cfg = c.config();
    let n = c.node_with(cfg, Some(again));
    let b = n.backend.clone();
    let (t0, t1) = c.direct(|| {
        let t0 = b.now();
        b.set_timer(Duration::from_millis(60), 1);
        b.set_timer(Duration::from_millis(20), 2);
        b.set_timer(Duration::from_millis(20), 3);
        b.set_timer(Duration::ZERO, 4);
        (t0, b.now())
    });
    let log = n.log.clone();
    c.wait("every timer fires", || log.timers().len() >= 5);
    c.settle();
    let timers = n.log.timers();
    let tokens: Vec<u64> = timers.iter().map(|t| t.0).collect();
    let set_here: Vec<u64> = tokens.iter().copied().filter(|t| *t != 5).collect();
    let pos = |k: u64| tokens.iter().position(|t| *t == k);
    assert!(
        set_here == [4, 2, 3, 1] && tokens.len() == 5 && pos(5) > pos(4),
        "on_timer once per set_timer, in deadline order (equal deadlines in the order set, the \
         timer set from on_timer(4) after it): got tokens {tokens:?}"
    );
    for (token, at) in &timers {
        let delay = match token {
            1 => 60,
            2 | 3 => 20,
            _ => 0,
        };
        assert!(
            *at >= t0 + Duration::from_millis(delay),
            "timer {token} ran at {at:?}, before its deadline (set at or after {t0:?}, delay \
             {delay} ms)"
        );
    }
    let at4 = timers.iter().find(|t| t.0 == 4).unwrap().1;
    let at5 = timers.iter().find(|t| t.0 == 5).unwrap().1;
    assert!(
        at5 >= at4 + Duration::from_millis(5),
        "a timer set from on_timer runs its delay later: {at4:?} then {at5:?}"
    );
    assert!(t1 >= t0, "now went backwards: {t0:?} then {t1:?}");
}

/// `wake` works from any thread, in both modes: each call brings one
/// `on_wake` with its token, on the loop thread, never from inside the
/// call (also when a handler wakes from inside `on_wake`).
pub fn wake_from_another_thread_calls_on_wake_once_per_call<H: Harness>(mode: ThreadSafety) {
    const THREADS: u64 = 3;
    const PER: u64 = 20;
    const CHAIN: u64 = 1 << 20;
    let mut c = Ctx::<H>::new(mode);
    let chain: React<H::Backend> = Box::new(|b, ev| {
        if let Event::Wake { token, .. } = ev {
            if *token >= CHAIN && *token < CHAIN + 3 {
                b.wake(token + 1);
            }
        }
    });
    let cfg = c.config();
    let n = c.node_with(cfg, Some(chain));
    let direct = Arc::new(c.direct_anywhere());
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (b, direct) = (n.backend.clone(), direct.clone());
            std::thread::spawn(move || {
                for i in 0..PER {
                    direct("wake from another thread", &mut || b.wake(t * 1000 + i));
                }
            })
        })
        .collect();
    let b = n.backend.clone();
    c.direct(|| {
        b.wake(CHAIN);
        b.wake(CHAIN + 100);
    });
    for t in threads {
        t.join().expect("a waking thread panicked");
    }
    let want = (THREADS * PER + 5) as usize;
    let log = n.log.clone();
    c.wait("every wake is delivered", || log.wakes().len() >= want);
    c.settle();
    let mut tokens: Vec<u64> = n.log.wakes().iter().map(|w| w.0).collect();
    let mut expected: Vec<u64> = (0..THREADS)
        .flat_map(|t| (0..PER).map(move |i| t * 1000 + i))
        .chain([CHAIN, CHAIN + 1, CHAIN + 2, CHAIN + 3, CHAIN + 100])
        .collect();
    tokens.sort_unstable();
    expected.sort_unstable();
    assert_eq!(
        tokens, expected,
        "on_wake exactly once per wake call, with its token"
    );
    // Each thread's wakes come in the order it made them.
    let order: Vec<u64> = n.log.wakes().iter().map(|w| w.0).collect();
    for t in 0..THREADS {
        let mine: Vec<u64> = order
            .iter()
            .copied()
            .filter(|k| *k / 1000 == t && *k < CHAIN)
            .collect();
        assert_eq!(
            mine,
            (0..PER).map(|i| t * 1000 + i).collect::<Vec<_>>(),
            "the wakes of one thread come in the order it made them"
        );
    }
}

/// `now` never goes backwards, read from any thread and inside callbacks,
/// and moves on: after a timer of `d`, at least `d` has passed.
pub fn now_never_goes_backwards<H: Harness>(mode: ThreadSafety) {
    let mut c = Ctx::<H>::new(mode);
    let n = c.node();
    let p = c.pair(full_params(64, 4), full_params(64, 4));
    let b = n.backend.clone();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let b = b.clone();
            std::thread::spawn(move || {
                let mut last = b.now();
                for _ in 0..2000 {
                    let t = b.now();
                    if t < last {
                        return Err(format!("{t:?} after {last:?}"));
                    }
                    last = t;
                }
                Ok(())
            })
        })
        .collect();
    let t0 = c.direct(|| b.now());
    for k in 0..10u64 {
        c.direct(|| b.set_timer(Duration::from_millis(k * 3), k));
    }
    let log = n.log.clone();
    c.wait("the timers fire", || log.timers().len() == 10);
    let t1 = c.direct(|| b.now());
    for r in readers {
        r.join()
            .expect("a reading thread panicked")
            .unwrap_or_else(|e| panic!("now() went backwards on another thread: {e}"));
    }
    let ats: Vec<Duration> = n.log.timers().iter().map(|t| t.1).collect();
    assert!(
        ats.windows(2).all(|w| w[0] <= w[1]),
        "now() read in successive callbacks went backwards: {ats:?}"
    );
    assert!(
        t1 >= t0 + Duration::from_millis(27),
        "after a timer of 27 ms fired, now() moved on by at least that: {t0:?} then {t1:?}"
    );
    // The clock of another backend on its own loop moves on as well, and a
    // loop-thread read agrees with the order of events.
    let in_loop = c.on_loop(&p.client, |b| b.now());
    let after = c.direct(|| p.client.backend.now());
    assert!(
        after >= in_loop,
        "now() off the loop thread after a read on it went backwards: {in_loop:?} then \
         {after:?}"
    );
}

// ------------------------------------------------------- v2: liveness

/// The longest `peer_timeout` there is (`Duration::MAX`) is a timeout
/// like any other: connections set up under it carry messages both ways,
/// and nothing overflows where the provider derives its heartbeats,
/// keepalive or deadlines from it.
pub fn the_longest_peer_timeout_sets_up_connections_that_carry_messages<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let cfg = BackendConfig {
        peer_timeout: Some(Duration::MAX),
        ..c.config()
    };
    let (s, cl) = (c.node_with(cfg.clone(), None), c.node_with(cfg, None));
    let p = c.pair_of(s, cl, full_params(64, 8), full_params(64, 8));
    let (to_server, to_client) = (p.to_server, p.to_client);
    c.send_buffered_key(&p.client, to_server, b"ping".to_vec(), 1);
    c.send_buffered_key(&p.server, to_client, b"pong".to_vec(), 2);
    let (sl, cl) = (p.server.log.clone(), p.client.log.clone());
    c.wait("a message each way", || {
        !sl.data_on(to_client).is_empty() && !cl.data_on(to_server).is_empty()
    });
    assert_eq!(p.server.log.data_on(to_client), vec![b"ping".to_vec()]);
    assert_eq!(p.client.log.data_on(to_server), vec![b"pong".to_vec()]);
}

/// With `peer_timeout`, a connection whose peer stops answering (no
/// answer, no reset: a partition, or the harness silencing the peer where
/// the transport cannot be partitioned) closes on each side with
/// `TimedOut`, no earlier than the timeout, each unfinished key reported
/// once. Runs on every provider that enforces `peer_timeout` (declared
/// liveness) and whose harness can partition or silence a peer.
pub fn peer_timeout_ends_a_connection_whose_peer_stops_answering_with_timed_out<H: Harness>(
    mode: ThreadSafety,
) {
    // Short, for real transports: TCP closes within about twice this.
    const TIMEOUT: Duration = Duration::from_secs(2);
    let mut c = Ctx::<H>::new(mode);
    // A network of the test's own that `partition` can cut (before any
    // node exists).
    c.isolate();
    let cfg = BackendConfig {
        peer_timeout: Some(TIMEOUT),
        ..c.config()
    };
    let closed_at = Arc::new(Mutex::new(None::<Duration>));
    let at = closed_at.clone();
    let when: React<H::Backend> = Box::new(move |b, ev| {
        if let Event::Closed { .. } = ev {
            *at.lock().unwrap() = Some(b.now());
        }
    });
    let (s, cl) = (c.node_with(cfg.clone(), None), c.node_with(cfg, Some(when)));
    let p = c.pair_of(s, cl, full_params(64, 8), full_params(64, 8));
    let (to_server, to_client) = (p.to_server, p.to_client);
    // The client has sends in flight when the peer goes away; the server
    // is idle.
    c.send_buffered_key(&p.client, to_server, b"before".to_vec(), 1);
    let sl = p.server.log.clone();
    c.wait("the first message arrives", || {
        !sl.data_on(to_client).is_empty()
    });
    let t0 = c.direct(|| p.client.backend.now());
    c.cut_off(&p.client, &p.server);
    // On a heavily loaded machine cutting the peer off (a harness's
    // firewall commands) can take longer than the timeout itself: the
    // connection may have timed out before these sends, which the checks
    // below allow (the close still comes no earlier than the timeout).
    let mut sent = Vec::new();
    for k in 10..14u64 {
        if !c.send_buffered_key_if_open(&p.client, to_server, k.to_le_bytes().to_vec(), k) {
            break;
        }
        sent.push(k);
    }
    c.settle();
    let cl = p.client.log.clone();
    let early = c.direct(|| p.client.backend.now()) < t0 + TIMEOUT;
    if early {
        assert_eq!(
            cl.closed_count(to_server),
            0,
            "a connection whose peer stopped answering stays open until peer_timeout passed"
        );
    }
    // The recorder logs an event before it runs the test's reaction to it:
    // the close time is waited for too, not read as soon as the log shows
    // the close.
    c.wait("both sides close the unreachable connection", || {
        cl.closed_count(to_server) == 1
            && sl.closed_count(to_client) == 1
            && closed_at.lock().unwrap().is_some()
    });
    let t1 = closed_at.lock().unwrap().expect("the close time");
    assert!(
        t1 >= t0 + TIMEOUT,
        "closed {:?} after the partition, before peer_timeout ({TIMEOUT:?})",
        t1.saturating_sub(t0)
    );
    c.reconnect(&p.client, &p.server);
    c.settle();
    assert_closed_for(&p.client, to_server, &[CloseReason::TimedOut], "the sender");
    assert_closed_for(
        &p.server,
        to_client,
        &[CloseReason::TimedOut],
        "the idle side",
    );
    let mut all = vec![1];
    all.extend(&sent);
    assert_each_key_once(&p.client, to_server, &all, "the sender");
    assert!(
        sl.data_on(to_client)
            .iter()
            .all(|d| d.as_slice() == b"before" || sent.contains(&key_of(d))),
        "only sent messages arrive"
    );
}

// ------------------------------------------------------- v3: the edges

/// Time and timers seen from callbacks advance with the loop's clock
/// (virtual on the simulator, real elsewhere), and a timer fires no
/// earlier than its delay: a chain of timers, each set from the callback
/// of the one before with a delay of `D`, sees `now()` move on by at
/// least `D` from one callback to the next; every reading lies between
/// the loop's own clock read before the chain and after it; and the
/// loop's clock says the chain took at least its `N × D`.
pub fn time_and_timers_seen_from_callbacks_advance_with_the_loops_clock<H: Harness>(
    mode: ThreadSafety,
) {
    const N: u64 = 5;
    const D: Duration = Duration::from_millis(20);
    let mut c = Ctx::<H>::new(mode);
    let chain: React<H::Backend> = Box::new(|b, ev| {
        if let Event::Timer { token, .. } = ev {
            if *token < N {
                b.set_timer(D, token + 1);
            }
        }
    });
    let cfg = c.config();
    let n = c.node_with(cfg, Some(chain));
    let b = n.backend.clone();
    let loop_before = c.h.event_loop(n.id).now();
    let set_at = c.direct(|| {
        let t = b.now();
        b.set_timer(D, 1);
        t
    });
    let log = n.log.clone();
    c.wait("the chain of timers ends", || {
        log.timers().len() as u64 >= N
    });
    let loop_after = c.h.event_loop(n.id).now();
    c.settle();
    let timers = n.log.timers();
    let tokens: Vec<u64> = timers.iter().map(|t| t.0).collect();
    assert_eq!(
        tokens,
        (1..=N).collect::<Vec<_>>(),
        "each timer of the chain fires once, in order"
    );
    assert!(
        set_at >= loop_before,
        "now() read off the loop ({set_at:?}) is the loop's clock, which read {loop_before:?} \
         just before"
    );
    let mut previous = set_at;
    for (token, at) in &timers {
        assert!(
            *at >= previous + D,
            "now() seen from on_timer({token}) is {at:?}, less than {D:?} after {previous:?}, \
             when the timer was set with that delay: time seen from callbacks must advance with \
             the loop's clock (a cached clock stands still), and a timer fires no earlier than \
             its delay; all readings from callbacks: {timers:?}"
        );
        assert!(
            *at <= loop_after,
            "now() seen from on_timer({token}) is {at:?}, later than the loop's own clock \
             after the chain ({loop_after:?}): now() is the loop's clock"
        );
        previous = *at;
    }
    let took = loop_after.saturating_sub(loop_before);
    assert!(
        took >= D * N as u32,
        "a chain of {N} timers of {D:?}, each set when the one before fired, ended after \
         {took:?} by the loop's clock: timers fired before their delay"
    );
}

/// `wake` never calls the handler inside the call, wherever it is called
/// from: the test thread, the loop thread outside a handler (a posted
/// call), and inside `on_wake`, `on_timer` and `on_data`. Each call brings
/// exactly one `on_wake` with its token, later, on the loop thread.
pub fn wake_never_calls_the_handler_inside_the_call<H: Harness>(mode: ThreadSafety) {
    // The threads now inside a `wake` call of this test.
    let inside: Arc<Mutex<Vec<std::thread::ThreadId>>> = Arc::default();
    let problems: Arc<Mutex<Vec<String>>> = Arc::default();
    fn checked<B: Backend + ?Sized>(inside: &Mutex<Vec<std::thread::ThreadId>>, b: &B, token: u64) {
        let me = std::thread::current().id();
        inside.lock().unwrap().push(me);
        b.wake(token);
        let mut v = inside.lock().unwrap();
        let i = v.iter().position(|t| *t == me).expect("this thread's mark");
        v.swap_remove(i);
    }
    let (ins, probs) = (inside.clone(), problems.clone());
    let react: React<H::Backend> = Box::new(move |b, ev| {
        let me = std::thread::current().id();
        if let Event::Wake { token, .. } = ev {
            if ins.lock().unwrap().contains(&me) {
                probs.lock().unwrap().push(format!(
                    "on_wake({token}) was called from inside the wake call that asked for it"
                ));
            }
        }
        let next = match ev {
            Event::Wake { token: 20, .. } => 21,
            Event::Timer { token: 30, .. } => 31,
            Event::Data { .. } => 41,
            _ => return,
        };
        checked(&ins, b, next);
    });
    let mut c = Ctx::<H>::new(mode);
    let cfg = c.config();
    let s = c.node_with(cfg, Some(react));
    let cl = c.node();
    let p = c.pair_of(s, cl, full_params(64, 4), full_params(64, 4));
    let b = p.server.backend.clone();
    let ins = inside.clone();
    c.direct(|| checked(&ins, &b, 10));
    let ins = inside.clone();
    c.on_loop(&p.server, move |b| checked(&ins, b, 20));
    c.direct(|| b.set_timer(Duration::ZERO, 30));
    c.send_buffered(&p.client, p.to_server, b"wake".to_vec());
    let log = p.server.log.clone();
    c.wait("every wake is delivered", || log.wakes().len() >= 5);
    c.settle();
    let problems = problems.lock().unwrap().clone();
    assert!(
        problems.is_empty(),
        "wake never calls the handler inside the call (on_wake comes later, from the loop): \
         {problems:?}"
    );
    let mut tokens: Vec<u64> = p.server.log.wakes().iter().map(|w| w.0).collect();
    tokens.sort_unstable();
    assert_eq!(
        tokens,
        vec![10, 20, 21, 31, 41],
        "one on_wake per wake call (from the test thread, a posted call, on_wake, on_timer \
         and on_data), with its token"
    );
}

/// A chunk of a registered region comes back once its send ends, on
/// completion and on cancellation: after sends that completed, and again
/// after a close cancelled sends held in flight (the peer's loop held
/// back), the whole region is one free chunk again; every key is reported
/// exactly once, completed or cancelled.
pub fn a_region_chunk_comes_back_on_completion_and_on_cancellation_exactly_once<H: Harness>(
    mode: ThreadSafety,
) {
    const COMPLETED: u64 = 8;
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(HELD_MSG * (HELD_DEPTH + 32));
    let cfg = BackendConfig {
        send_queue_depth: HELD_DEPTH,
        ..c.config()
    };
    let (s, cl) = (c.node(), c.node_with(cfg, None));
    let p = c.pair_of(
        s,
        cl,
        ConnectionParams::receive(HELD_MSG, 8),
        ConnectionParams::receive(64, 4).with_zero_copy(region.clone()),
    );
    let to_server = p.to_server;
    // On completion.
    for k in 0..COMPLETED {
        let r = region.clone();
        let sent = c.call(&p.client, move |b| {
            let mut chunk = r.chunk(HELD_MSG).expect("a free chunk");
            chunk[..8].copy_from_slice(&k.to_le_bytes());
            b.send_chunk(to_server, chunk, &[], k).map_err(|e| e.error)
        });
        sent.unwrap_or_else(|e| panic!("send_chunk {k}: {e}"));
    }
    let cl_log = p.client.log.clone();
    c.wait("the chunk sends complete", || {
        cl_log.completed(to_server).len() as u64 == COMPLETED
    });
    c.settle();
    assert!(
        region.chunk(region.len()).is_some(),
        "a chunk's range comes back when its send completes: after {COMPLETED} chunk sends \
         completed, the region ({} bytes) is not free as a whole",
        region.len()
    );
    // On cancellation: sends held in flight, then a local close.
    c.pause(&p.server);
    let filled = c.fill(
        &p.client,
        to_server,
        SendMode::Chunk(region.clone()),
        HELD_MSG,
        1 << 32,
        FILL_LIMIT,
    );
    c.call(&p.client, move |b| b.close_active_endpoint(to_server))
        .expect("closing with chunk sends in flight");
    c.wait("the closing side reports its close", || {
        cl_log.closed_count(to_server) == 1
    });
    c.settle();
    let mut sent: Vec<u64> = (0..COMPLETED).collect();
    sent.extend(&filled.keys);
    assert_each_key_once(&p.client, to_server, &sent, "the sender");
    let cancelled = p.client.log.cancelled(to_server);
    assert!(
        !cancelled.is_empty(),
        "the chunk sends still queued when the provider pushed back ({}) cannot have left; \
         the close must report them cancelled, but none was",
        filled.pushed_back
    );
    let free = region.chunk(region.len());
    assert!(
        free.is_some(),
        "a chunk's range comes back when its send is cancelled by a close: the close reported \
         {} chunk sends cancelled, yet the region ({} bytes) is not free as a whole (the \
         provider still holds their ranges)",
        cancelled.len(),
        region.len()
    );
    drop(free);
    c.resume(&p.server);
    let sl = p.server.log.clone();
    c.wait("the peer reports the close", || {
        sl.closed_count(p.to_client) == 1
    });
    assert_delivered_in_order(&p.server, p.to_client, &p.client, to_server, &sent);
}

/// Closing a listener reports every key of the sends in flight on each
/// connection it accepted exactly once (completed, or cancelled in that
/// connection's `on_connection_closed`), on two accepted connections whose
/// peers hold their loops back; nothing cancelled is delivered.
pub fn a_listener_close_reports_every_key_of_its_accepted_connections_once<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let cfg = BackendConfig {
        send_queue_depth: HELD_DEPTH,
        ..c.config()
    };
    let params = ConnectionParams::receive(HELD_MSG, 8).with_buffered(HELD_MSG, 8);
    let s = c.node_with(cfg, None);
    let (a, b) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, params.clone()), s.ip);
    let ca = c.connect(&s, &a, listen, params.clone());
    let cb = c.connect(&s, &b, listen, params);
    c.pause(&a);
    c.pause(&b);
    let fa = c.fill(&s, ca.server, SendMode::Copy, HELD_MSG, 0, FILL_LIMIT);
    let fb = c.fill(&s, cb.server, SendMode::Copy, HELD_MSG, 1 << 32, FILL_LIMIT);
    c.call(&s, move |bk| bk.close_listen_endpoint(listen))
        .expect("closing the listener");
    let sl = s.log.clone();
    c.wait(
        "the listener's side reports both connections closed",
        || sl.closed_count(ca.server) == 1 && sl.closed_count(cb.server) == 1,
    );
    c.resume(&a);
    c.resume(&b);
    let (al, bl) = (a.log.clone(), b.log.clone());
    c.wait("both peers report their connection closed", || {
        al.closed_count(ca.client) == 1 && bl.closed_count(cb.client) == 1
    });
    c.settle();
    for (conn, filled, who) in [
        (ca.server, &fa, "the first accepted connection"),
        (cb.server, &fb, "the second accepted connection"),
    ] {
        assert_each_key_once(&s, conn, &filled.keys, who);
        assert!(
            !s.log.cancelled(conn).is_empty(),
            "{who}: the sends still queued when the provider pushed back ({}) cannot have \
             left; the listener's close must report them cancelled, but none was",
            filled.pushed_back
        );
        assert_closed_for(&s, conn, &[CloseReason::ListenerClosed], who);
    }
    assert_delivered_in_order(&a, ca.client, &s, ca.server, &fa.keys);
    assert_delivered_in_order(&b, cb.client, &s, cb.server, &fb.keys);
}

/// A range of a registered region held by a [`RegionChunk`](netio_core::RegionChunk)
/// cannot be sent by `send_data`: `OutsideRegion`, and nothing is sent. A
/// range already in flight may be sent again (both sends only read it):
/// both arrive, both complete; the chunk, sent afterwards, arrives too.
pub fn a_region_range_held_by_a_chunk_is_refused_and_one_in_flight_may_be_sent_again<H: Harness>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let region = MemoryRegion::new(64);
    let p = zc_pair(&mut c, &region);
    let to_server = p.to_server;
    let mut chunk = region.chunk_at(0, 8).expect("a free chunk");
    chunk.copy_from_slice(b"chunk!!!");
    region.write(32, b"twice!!!").expect("a free range");
    let r = region.clone();
    let (held, first, second) = c.call(&p.client, move |b| {
        (
            b.send_data(to_server, &[r.slice(0, 8).unwrap()], &[], 1),
            b.send_data(to_server, &[r.slice(32, 8).unwrap()], &[], 2),
            b.send_data(to_server, &[r.slice(32, 8).unwrap()], &[], 3),
        )
    });
    assert!(
        matches!(held, Err(SendError::OutsideRegion)),
        "send_data of a range held by a chunk answers OutsideRegion: {held:?}"
    );
    assert!(
        first.is_ok() && second.is_ok(),
        "a range in flight may be sent again: {first:?}, {second:?}"
    );
    c.call(&p.client, move |b| b.send_chunk(to_server, chunk, &[], 4))
        .expect("the chunk itself can be sent");
    wait_for_messages_and_completions(&mut c, &p, 3);
    assert_eq!(
        p.server.log.data_on(p.to_client),
        vec![
            b"twice!!!".to_vec(),
            b"twice!!!".to_vec(),
            b"chunk!!!".to_vec()
        ],
        "the refused send is not delivered; the others arrive in order"
    );
    assert_eq!(p.client.log.completed(to_server), vec![2, 3, 4]);
}

/// Opens `ROUNDS` connections from one node to a listener of another and
/// closes each at a different point of its opening, from right after
/// `open_active_endpoint` to after the handshake; waits until the
/// initiator has heard of every connection's end. Returns the
/// connections, the listener's node, the initiator's node and the
/// listener's address.
fn close_during_openings<H: Harness>(
    c: &mut Ctx<H>,
) -> (Vec<ConnId>, Node<H>, Node<H>, EndpointAddress) {
    const ROUNDS: u32 = 24;
    let (s, cl) = (c.node(), c.node());
    let listen = connect_target(c.listen(&s, full_params(64, 2)), s.ip);
    let mut conns = Vec::new();
    for round in 0..ROUNDS {
        let spin = Duration::from_micros(u64::from(round) * 25);
        let conn = c.call(&cl, move |b| {
            let conn = b.open_active_endpoint(listen, full_params(64, 2))?;
            if spin > Duration::ZERO {
                let start = Instant::now();
                while start.elapsed() < spin {
                    std::hint::spin_loop();
                }
            }
            Ok::<_, OpenActiveError>(conn)
        });
        let conn = conn.unwrap_or_else(|e| panic!("connecting: {e}"));
        if round % 3 == 2 {
            // Let the loops run a little: the handshake may be done.
            c.settle();
        }
        c.call(&cl, move |b| b.close_active_endpoint(conn))
            .expect("closing a connection that is opening or just established");
        conns.push(conn);
    }
    let clog = cl.log.clone();
    let all = conns.clone();
    c.wait("the initiator hears of every connection's end", || {
        all.iter()
            .all(|k| clog.closed_count(*k) == 1 || clog.refused().iter().any(|r| r.0 == *k))
    });
    (conns, s, cl, listen)
}

/// A close that races an establishment not yet reported ends the
/// connection one of two ways, decided by the provider's own state at the
/// close call, never both and never neither: still opening,
/// `on_connection_refused(Cancelled)` alone; already established inside
/// the provider, `on_connection_established` and then
/// `on_connection_closed(Local)` (with no keys: nothing was sent). Closes
/// come at every point of the opening, from right after
/// `open_active_endpoint` to after the handshake. The listener's side
/// never closes a connection it did not report established, and its
/// listener still works afterwards.
pub fn a_close_racing_an_unreported_establishment_reports_a_refusal_or_establishment_then_close<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let (conns, s, cl, listen) = close_during_openings(&mut c);
    c.settle();
    for conn in &conns {
        let events = cl.log.events_of(*conn);
        let refused = matches!(
            events.as_slice(),
            [Event::Refused {
                reason: RefuseReason::Cancelled,
                ..
            }]
        );
        let established_then_closed = matches!(
            events.as_slice(),
            [Event::Established { .. }, Event::Closed { reason: CloseReason::Local, keys, .. }]
                if keys.is_empty()
        );
        assert!(
            refused || established_then_closed,
            "a close racing the establishment of {conn} reports refused(Cancelled) alone, or \
             established then closed(Local); got {events:?}"
        );
    }
    for (conn, _, _) in s.log.established() {
        let events = s.log.events_of(conn);
        assert!(
            s.log.closed_count(conn) <= 1
                && matches!(events.first(), Some(Event::Established { .. })),
            "the listener's side reports a connection established before anything else, and \
             closes it at most once: {events:?}"
        );
    }
    // The listener still works.
    c.connect(&s, &cl, listen, full_params(64, 2));
}

/// Every connection the listener reported established, of those whose
/// initiator closed them at some point of their opening (the closes of
/// [`a_close_racing_an_unreported_establishment_reports_a_refusal_or_establishment_then_close`]),
/// is closed on the listener's side too, once: the initiator's close is
/// not lost however early it came, even while the listener was accepting
/// the connection.
pub fn the_listener_ends_every_connection_whose_peer_closed_it_while_it_was_being_accepted<
    H: Harness,
>(
    mode: ThreadSafety,
) {
    let mut c = Ctx::<H>::new(mode);
    let (_conns, s, _cl, _listen) = close_during_openings(&mut c);
    let slog = s.log.clone();
    c.wait(
        "every connection the listener saw established is closed on its side",
        || {
            slog.established()
                .iter()
                .all(|(k, _, _)| slog.closed_count(*k) == 1)
        },
    );
    c.settle();
    for (conn, _, _) in s.log.established() {
        let events = s.log.events_of(conn);
        assert!(
            matches!(events.last(), Some(Event::Closed { .. })) && s.log.closed_count(conn) == 1,
            "the listener's side closes every connection it saw established: {events:?}"
        );
    }
}
