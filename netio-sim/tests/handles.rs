//! Connections are named by handles: distinct per connection, stale after
//! close, and completions come in batches with the caller's keys.

mod common;

use std::time::Duration;

use common::{connect, full_params, listen, node, rdma, run_until, unlimited_nics};
use netio_core::{
    Backend, BufferError, CloseError, ConnError, ConnId, ConnectionParams, RefuseReason, SendError,
};
use netio_sim::{LinkConfig, Sim};

#[test]
fn two_connections_to_one_address_are_distinct() {
    let sim = Sim::with_seed(41);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c1, s1) = connect(&sim, &server, &client, addr, full_params(64, 4));
    let (c2, s2) = connect(&sim, &server, &client, addr, full_params(64, 4));
    assert_ne!(c1, c2, "the client has two handles");
    assert_ne!(s1, s2, "the server has two handles");
    // The server sees the peer's address (ip:port), one per connection.
    let remotes: Vec<_> = server.log.established().iter().map(|e| e.1).collect();
    assert_eq!(remotes.len(), 2);
    assert_ne!(remotes[0], remotes[1], "two local ports");
    assert!(remotes.iter().all(|r| r.ip() == client.host.ip()));
    assert_eq!(client.b.remote_address(c1).unwrap(), addr);
    assert_eq!(client.b.remote_address(c2).unwrap(), addr);
    assert_eq!(server.b.remote_address(s1).unwrap(), remotes[0]);

    client.b.send_data_copy(c1, &[b"one"], &[], 1).unwrap();
    client.b.send_data_copy(c2, &[b"two"], &[], 2).unwrap();
    let sl = server.log.clone();
    run_until(&sim, "both arrive", || sl.data().len() == 2);
    assert_eq!(server.log.data_from(s1), vec![b"one".to_vec()]);
    assert_eq!(server.log.data_from(s2), vec![b"two".to_vec()]);

    // Closing one leaves the other working.
    client.b.close_active_endpoint(c1).unwrap();
    run_until(&sim, "the server sees the close", || {
        sl.closed_count(s1) == 1
    });
    server.b.send_data_copy(s2, &[b"still"], &[], 3).unwrap();
    let cl = client.log.clone();
    run_until(&sim, "the reply", || !cl.data_from(c2).is_empty());
    assert!(client.log.data_from(c1).is_empty());
    assert_eq!(server.log.closed_count(s2), 0);
}

#[test]
fn a_stale_or_foreign_handle_answers_unknown_connection() {
    let sim = Sim::with_seed(42);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    client.b.close_active_endpoint(c).unwrap();
    // Dead at the call.
    assert!(matches!(
        client.b.send_data_copy(c, &[b"x"], &[], 1),
        Err(SendError::UnknownConnection(x)) if x == c
    ));
    assert!(matches!(client.b.get_buffer(c), Err(BufferError::UnknownConnection(x)) if x == c));
    assert!(
        matches!(client.b.close_active_endpoint(c), Err(CloseError::UnknownConnection(x)) if x == c)
    );
    assert!(matches!(client.b.remote_address(c), Err(ConnError::UnknownConnection(x)) if x == c));
    assert!(matches!(
        client.b.pause_receive(c),
        Err(ConnError::UnknownConnection(_))
    ));
    sim.run_until_idle(1000);
    // A new connection may reuse the slot; the old handle stays stale.
    let (c2, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    assert_ne!(c, c2);
    assert!(matches!(
        client.b.send_data_copy(c, &[b"x"], &[], 1),
        Err(SendError::UnknownConnection(_))
    ));
    client.b.send_data_copy(c2, &[b"ok"], &[], 1).unwrap();
    // A handle never issued.
    let never = ConnId::new(999, 0);
    assert!(matches!(
        client.b.num_available_buffers(never),
        Err(BufferError::UnknownConnection(x)) if x == never
    ));
    assert_eq!(
        client.log.closed()[0].0,
        c,
        "the close report names the handle"
    );
}

#[test]
fn an_opening_connection_has_a_handle_but_cannot_send_and_close_cancels_it() {
    let sim = Sim::with_seed(43);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let c = client
        .b
        .open_active_endpoint(addr, full_params(64, 4))
        .unwrap();
    assert_eq!(client.b.remote_address(c).unwrap(), addr);
    assert_eq!(client.b.connection_to(addr).unwrap(), c);
    client.b.pause_receive(c).unwrap();
    client.b.resume_receive(c).unwrap();
    assert!(matches!(
        client.b.send_data_copy(c, &[b"x"], &[], 1),
        Err(SendError::UnknownConnection(_))
    ));
    assert!(matches!(
        client.b.get_buffer(c),
        Err(BufferError::UnknownConnection(_))
    ));
    client.b.close_active_endpoint(c).unwrap();
    assert!(client.log.is_empty(), "never reported from inside the call");
    sim.run_until_idle(1000);
    assert_eq!(
        client.log.refused(),
        vec![(c, addr, RefuseReason::Cancelled)]
    );
    assert!(client.log.established().is_empty());
}

#[test]
fn connection_to_finds_the_oldest_connection_to_an_address() {
    let sim = Sim::with_seed(44);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    assert!(matches!(
        client.b.connection_to(addr),
        Err(ConnError::NoConnectionTo(a)) if a == addr
    ));
    let (c1, s1) = connect(&sim, &server, &client, addr, full_params(64, 4));
    let (c2, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    assert_eq!(client.b.connection_to(addr).unwrap(), c1);
    let peer = server.b.remote_address(s1).unwrap();
    assert_eq!(server.b.connection_to(peer).unwrap(), s1);
    client.b.close_active_endpoint(c1).unwrap();
    assert_eq!(client.b.connection_to(addr).unwrap(), c2);
}

#[test]
fn send_buffer_completes_with_the_callers_key() {
    let sim = Sim::with_seed(45);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    let mut buf = client.b.get_buffer(c).unwrap().unwrap();
    buf.write(b"keyed").unwrap();
    client.b.send_buffer(c, buf, 0xDEAD_BEEF).unwrap();
    let cl = client.log.clone();
    run_until(&sim, "the completion", || !cl.completed_to(c).is_empty());
    assert_eq!(client.log.completed_to(c), vec![0xDEAD_BEEF]);
}

#[test]
fn completions_at_one_instant_come_in_one_batch_in_send_order() {
    let sim = Sim::with_seed(46);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    // No jitter, unlimited bandwidth: a burst arrives at one instant.
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_micros(10), 0),
    );
    unlimited_nics(&sim, &[client.host.ip(), server.host.ip()]);
    let addr = listen(&server, ConnectionParams::receive(64, 16));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    let keys = [7u64, 3, 11, 5, 2];
    for k in keys {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    let cl = client.log.clone();
    run_until(&sim, "all complete", || {
        cl.completed_to(c).len() == keys.len()
    });
    assert_eq!(
        client.log.batches_to(c),
        vec![keys.to_vec()],
        "one call, keys in send order"
    );
    let got: Vec<u64> = server
        .log
        .data_from(s)
        .iter()
        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
        .collect();
    assert_eq!(got, keys.to_vec());
    // Spread over time (1 MB/s, 1000 bytes: 1 ms each), each completes
    // at its own instant, still in order.
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_micros(10), 1_000_000),
    );
    for k in 20..23u64 {
        client.b.send_data_copy(c, &[&[0; 60]], &[], k).unwrap();
    }
    run_until(&sim, "all complete", || cl.completed_to(c).len() == 8);
    assert_eq!(
        client.log.batches_to(c)[1..],
        [vec![20], vec![21], vec![22]]
    );
}
