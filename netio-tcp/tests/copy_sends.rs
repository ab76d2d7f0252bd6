//! Copy sends: small ones are copied into the connection's ring and leave
//! together, a large one on a connection with nothing queued is written
//! straight from the caller's slices and only its unwritten rest is kept.
//! Whatever the path, every byte arrives once and in order, and a frame
//! partly written when the connection closes is finished first.

mod common;

use common::{connect, wait_until, Ev, Running, Side};
use netio_core::{Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress};

/// Message `i` of `len` bytes: its index, then a pattern of it.
fn message(i: u32, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len)
        .map(|j| (j as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect();
    let n = len.min(4);
    m[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    m
}

/// Lengths that mix ring copies and writes straight from the caller.
const LENGTHS: [usize; 6] = [300 * 1024, 10, 1 << 20, 1024, 64 * 1024, 3];

#[test]
fn large_and_small_copy_sends_through_a_full_socket_arrive_whole_in_order_and_complete_once() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (_, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(2 << 20, 8),
        ConnectionParams::default(),
    );
    let peer = server.conn(server.first_remote().unwrap());
    let conn = client.conn(client.first_remote().unwrap());
    // The server reads nothing, so the socket fills and the large frames
    // are partly written: their rest waits in the ring behind them.
    server.b.pause_receive(peer).unwrap();
    let sent: Vec<Vec<u8>> = (0..24u32)
        .map(|i| message(i, LENGTHS[i as usize % LENGTHS.len()]))
        .collect();
    for (i, m) in sent.iter().enumerate() {
        // Two slices, to exercise the gather of the caller's data.
        let (a, b) = m.split_at(m.len() / 3);
        client
            .b
            .send_data_copy(conn, &[a, b], &[], i as u64)
            .unwrap_or_else(|e| panic!("send {i}: {e}"));
    }
    server.b.resume_receive(peer).unwrap();
    assert!(
        wait_until(|| server.data_of(peer).len() == sent.len()),
        "{} of {} messages arrived",
        server.data_of(peer).len(),
        sent.len()
    );
    let got = server.data_of(peer);
    for (i, (g, s)) in got.iter().zip(&sent).enumerate() {
        assert!(
            g == s,
            "message {i}: {} bytes arrived, {} sent",
            g.len(),
            s.len()
        );
    }
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == sent.len()));
    let keys: Vec<u64> = client.batches().into_iter().flat_map(|(_, k)| k).collect();
    assert_eq!(keys, (0..sent.len() as u64).collect::<Vec<_>>());
}

#[test]
fn a_copy_batch_of_large_and_small_messages_written_through_and_copied_arrives_whole_in_order() {
    use netio_core::CopyMessage;
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (_, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(2 << 20, 8),
        ConnectionParams::default(),
    );
    let peer = server.conn(server.first_remote().unwrap());
    let conn = client.conn(client.first_remote().unwrap());
    let sent: Vec<Vec<u8>> = (0..24u32)
        .map(|i| message(i, LENGTHS[i as usize % LENGTHS.len()]))
        .collect();
    // Three batches: the first large message of each may be written
    // through (nothing queued), the rest is copied into the ring behind
    // it; with the server paused for the second, its socket fills.
    for (n, range) in [0..6usize, 6..18, 18..24].into_iter().enumerate() {
        if n == 1 {
            server.b.pause_receive(peer).unwrap();
        }
        let msgs: Vec<CopyMessage<'_>> = range
            .clone()
            .map(|i| CopyMessage::new(&sent[i], i as u64))
            .collect();
        client
            .b
            .send_copy_batch(conn, &msgs)
            .unwrap_or_else(|e| panic!("batch {n}: {e:?}"));
        if n == 1 {
            server.b.resume_receive(peer).unwrap();
        }
    }
    assert!(
        wait_until(|| server.data_of(peer).len() == sent.len()),
        "{} of {} messages arrived",
        server.data_of(peer).len(),
        sent.len()
    );
    for (i, (g, s)) in server.data_of(peer).iter().zip(&sent).enumerate() {
        assert!(
            g == s,
            "message {i}: {} bytes arrived, {} sent",
            g.len(),
            s.len()
        );
    }
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == sent.len()));
    let keys: Vec<u64> = client.batches().into_iter().flat_map(|(_, k)| k).collect();
    assert_eq!(keys, (0..sent.len() as u64).collect::<Vec<_>>());
}

#[test]
fn a_large_frame_partly_written_at_a_local_close_is_finished_before_the_close() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    // Larger than what the loopback socket buffers hold, so the write
    // straight from the caller stops part way.
    const LEN: usize = 24 << 20;
    let (_, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(LEN, 2),
        ConnectionParams::default(),
    );
    let peer = server.conn(server.first_remote().unwrap());
    let conn = client.conn(client.first_remote().unwrap());
    server.b.pause_receive(peer).unwrap();
    let big = message(1, LEN);
    client.b.send_data_copy(conn, &[&big], &[], 1).unwrap();
    client.b.send_data_copy(conn, &[b"after"], &[], 2).unwrap();
    client.b.close_active_endpoint(conn).unwrap();
    server.b.resume_receive(peer).unwrap();
    assert!(
        wait_until(|| server.has(|e| matches!(e, Ev::Closed(..)))),
        "server: no close"
    );
    let got = server.data_of(peer);
    assert_eq!(got.len(), 1, "only the started frame arrives");
    assert!(got[0] == big, "the large frame arrived whole");
    assert!(server.has(|e| matches!(e, Ev::Closed(_, CloseReason::PeerClosed, _))));
    // The started send completed, the queued one was cancelled.
    assert!(wait_until(|| client.has(|e| matches!(e, Ev::Closed(..)))));
    assert!(client.has(|e| matches!(e, Ev::Completed(_, 1))));
    assert!(client.has(|e| matches!(e, Ev::Closed(_, CloseReason::Local, k) if k == &[2])));
}

#[test]
fn small_buffered_sends_copied_into_the_ring_keep_their_order_and_their_buffers_until_completed() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let (_, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        ConnectionParams::receive(1 << 20, 8),
        // Buffers larger than what is copied into the ring, so both kinds
        // of buffered send are made.
        ConnectionParams::default().with_buffered(16 * 1024, 8),
    );
    let peer = server.conn(server.first_remote().unwrap());
    let conn = client.conn(client.first_remote().unwrap());
    server.b.pause_receive(peer).unwrap();
    // On the loop thread, so no write and no completion report can come
    // between the sends and the check after them.
    let b = client.b.clone();
    let (sent, ninth) = rt.on_loop(move || {
        let mut sent = Vec::new();
        for i in 0..8u32 {
            let len = [10, 16 * 1024, 100, 3000][i as usize % 4];
            let m = message(i, len);
            let mut buf = b.get_buffer(conn).unwrap().expect("a free buffer");
            buf.write(&m).unwrap();
            b.send_buffer(conn, buf, u64::from(i) * 2).unwrap();
            let c = message(100 + i, 20);
            b.send_data_copy(conn, &[&c], &[], u64::from(i) * 2 + 1)
                .unwrap();
            sent.push(m);
            sent.push(c);
        }
        (sent, b.get_buffer(conn).unwrap().is_some())
    });
    assert!(!ninth, "every buffer is held by a send until it completes");
    server.b.resume_receive(peer).unwrap();
    assert!(wait_until(|| server.data_of(peer).len() == sent.len()));
    assert!(
        server.data_of(peer) == sent,
        "all arrived whole, in send order"
    );
    assert!(wait_until(|| client
        .count(|e| matches!(e, Ev::Completed(..)))
        == sent.len()));
    let keys: Vec<u64> = client.batches().into_iter().flat_map(|(_, k)| k).collect();
    assert_eq!(keys, (0..sent.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        client.b.num_available_buffers(conn).unwrap(),
        0,
        "low water"
    );
    assert!(client.b.get_buffer(conn).unwrap().is_some(), "buffers back");
}
