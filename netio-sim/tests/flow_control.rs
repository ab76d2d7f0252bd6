//! `pause_receive` / `resume_receive`: a paused receiver takes nothing in,
//! its sender feels backpressure, and resuming delivers everything in
//! order, once.

mod common;

use std::time::Duration;

use common::{connect, listen, node, rdma, run_until, unlimited_nics, Event, React};
use netio_core::{Backend, BackendConfig, CloseReason, ConnectionParams, SendError};
use netio_sim::{LinkConfig, Sim, SimBackend};

fn ids(msgs: Vec<Vec<u8>>) -> Vec<u64> {
    msgs.iter()
        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
        .collect()
}

#[test]
fn a_paused_receiver_pushes_back_and_resume_delivers_everything_in_order() {
    let sim = Sim::with_seed(61);
    let server = node(&sim, rdma(), None);
    let client = node(
        &sim,
        BackendConfig {
            send_queue_depth: 4,
            ..rdma()
        },
        None,
    );
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(
        &sim,
        &server,
        &client,
        addr,
        ConnectionParams::buffered(64, 3),
    );
    server.b.pause_receive(s).unwrap();
    server.b.pause_receive(s).unwrap(); // pausing twice does nothing more
    let mut accepted = Vec::new();
    let mut no_buffer = false;
    for k in 0..20u64 {
        match client.b.send_data_copy(c, &[&k.to_le_bytes()], &[], k) {
            Ok(()) => accepted.push(k),
            Err(SendError::NoResources) => {}
            Err(e) => panic!("{e}"),
        }
        match client.b.get_buffer(c).unwrap() {
            Some(mut buf) => {
                buf.write(&(100 + k).to_le_bytes()).unwrap();
                client.b.send_buffer(c, buf, 100 + k).unwrap();
                accepted.push(100 + k);
            }
            None => no_buffer = true,
        }
        sim.run_for(Duration::from_millis(1));
    }
    assert_eq!(
        accepted,
        vec![0, 100, 1, 101, 2, 102, 3],
        "four copy sends and three buffers in flight, then NoResources and None"
    );
    assert!(no_buffer);
    assert!(
        server.log.data().is_empty(),
        "nothing reaches a paused receiver"
    );
    assert!(
        client.log.completed_to(c).is_empty(),
        "the paused receiver took nothing into its buffers"
    );
    assert_eq!(server.log.closed_count(s), 0);
    server.b.resume_receive(s).unwrap();
    assert!(server.log.data().is_empty(), "never from inside the call");
    let sl = server.log.clone();
    run_until(&sim, "everything arrives", || {
        sl.data_from(s).len() == accepted.len()
    });
    assert_eq!(ids(server.log.data_from(s)), accepted, "in order, once");
    sim.run_until_idle(10_000);
    assert_eq!(client.log.completed_to(c), accepted);
    assert!(server.b.resume_receive(s).is_ok(), "resuming twice is fine");
}

/// A receiver that pauses its connection on the first message.
fn pause_on_first() -> Option<React<SimBackend>> {
    let mut paused = false;
    Some(Box::new(move |b: &SimBackend, e: &Event| {
        if let Event::Data { conn, .. } = e {
            if !paused {
                paused = true;
                b.pause_receive(*conn).unwrap();
            }
        }
    }))
}

#[test]
fn pausing_inside_on_data_holds_the_rest_of_that_delivery() {
    let sim = Sim::with_seed(62);
    let server = node(&sim, rdma(), pause_on_first());
    let client = node(&sim, rdma(), None);
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_micros(10), 0),
    );
    unlimited_nics(&sim, &[client.host.ip(), server.host.ip()]);
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    for k in 0..5u64 {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_millis(10));
    assert_eq!(ids(server.log.data_from(s)), vec![0], "one, then paused");
    // Those already in receive buffers completed; the rest wait.
    assert_eq!(client.log.completed_to(c), vec![0, 1, 2, 3, 4]);
    server.b.resume_receive(s).unwrap();
    sim.run_until_idle(10_000);
    assert_eq!(ids(server.log.data_from(s)), vec![0, 1, 2, 3, 4]);
}

#[test]
fn a_peers_orderly_close_comes_after_the_held_messages() {
    let sim = Sim::with_seed(63);
    let server = node(&sim, rdma(), pause_on_first());
    let client = node(&sim, rdma(), None);
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_micros(10), 0),
    );
    unlimited_nics(&sim, &[client.host.ip(), server.host.ip()]);
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    for k in 0..3u64 {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_millis(1));
    client.b.close_active_endpoint(c).unwrap();
    sim.run_for(Duration::from_secs(1));
    assert_eq!(server.log.closed_count(s), 0, "not while paused");
    assert_eq!(server.log.data_from(s).len(), 1);
    server.b.resume_receive(s).unwrap();
    sim.run_until_idle(10_000);
    let tail: Vec<Event> = server.log.events()[1..].to_vec();
    let kinds: Vec<&str> = tail
        .iter()
        .map(|e| match e {
            Event::Data { .. } => "data",
            Event::Closed { .. } => "closed",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, vec!["data", "data", "data", "closed"]);
    assert_eq!(server.log.closed()[0].1, CloseReason::PeerClosed);
    assert_eq!(ids(server.log.data_from(s)), vec![0, 1, 2]);
}

#[test]
fn a_local_close_of_a_paused_connection_drops_what_it_held() {
    let sim = Sim::with_seed(64);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    server.b.pause_receive(s).unwrap();
    for k in 0..3u64 {
        client.b.send_data_copy(c, &[b"m"], &[], k).unwrap();
    }
    sim.run_for(Duration::from_millis(1));
    server.b.close_active_endpoint(s).unwrap();
    sim.run_until_idle(10_000);
    assert!(server.log.data().is_empty(), "{:?}", server.log);
    assert_eq!(server.log.closed()[0].1, CloseReason::Local);
    assert_eq!(client.log.closed()[0].1, CloseReason::PeerClosed);
    assert_eq!(
        client.log.cancelled_to(c),
        vec![0, 1, 2],
        "nothing was taken in, so every send is cancelled"
    );
    assert_eq!(sim.live_objects(), 1, "only the listener is left");
}

#[test]
fn a_reset_is_reported_while_paused_and_drops_held_messages() {
    let sim = Sim::with_seed(65);
    let server = node(&sim, rdma(), pause_on_first());
    let client = node(&sim, rdma(), None);
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_micros(10), 0),
    );
    unlimited_nics(&sim, &[client.host.ip(), server.host.ip()]);
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    for k in 0..3u64 {
        client.b.send_data_copy(c, &[b"m"], &[], k).unwrap();
    }
    sim.run_for(Duration::from_millis(1));
    sim.reset_connections(client.host.ip(), server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the reset", || sl.closed_count(s) == 1);
    assert_eq!(server.log.closed()[0].1, CloseReason::Reset);
    assert_eq!(server.log.data().len(), 1, "the held messages are dropped");
    sim.run_until_idle(10_000);
    assert_eq!(sim.live_objects(), 1);
}

/// Messages that reached a paused loop, for a connection paused after they
/// arrived and then reset, are dropped with the connection: none is
/// delivered once `pause_receive` returned (found by the conservation
/// property, seed 0x26444a14a2b34c89).
#[test]
fn a_reset_of_a_connection_paused_while_its_loop_was_paused_delivers_nothing_more() {
    let sim = Sim::with_seed(66);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.pause_loop(server.host.ip());
    for k in 0..3u64 {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    // The messages reach the server's buffers; its loop holds them back.
    sim.run_for(Duration::from_millis(1));
    assert!(server.log.data().is_empty(), "the loop is paused");
    server.b.pause_receive(s).unwrap();
    sim.reset_connections(client.host.ip(), server.host.ip());
    sim.run_for(Duration::from_millis(1));
    sim.resume_loop(server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the reset", || sl.closed_count(s) == 1);
    sim.run_until_idle(10_000);
    assert!(
        server.log.data().is_empty(),
        "nothing is delivered after pause_receive returned: {:?}",
        server.log
    );
    assert_eq!(server.log.closed()[0].1, CloseReason::Reset);
    assert_eq!(sim.live_objects(), 1, "only the listener is left");
}

/// A running connection whose loop was paused hears the messages that
/// reached it before the peer's close, then the close.
#[test]
fn a_paused_loop_hears_held_messages_before_a_close_that_came_after_them() {
    let sim = Sim::with_seed(67);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.pause_loop(server.host.ip());
    for k in 0..3u64 {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_millis(1));
    client.b.close_active_endpoint(c).unwrap();
    sim.run_for(Duration::from_millis(1));
    sim.resume_loop(server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the close", || sl.closed_count(s) == 1);
    assert_eq!(ids(server.log.data_from(s)), vec![0, 1, 2]);
    assert_eq!(server.log.closed()[0].1, CloseReason::PeerClosed);
}
