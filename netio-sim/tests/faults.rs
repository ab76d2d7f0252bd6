//! Each fault surfaces through the normal callbacks, as a real provider
//! would report it.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{connect, listen, node, run_until};
use netio_conformance::full_params;
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, RefuseReason, SendError,
};
use netio_sim::{Sim, CONNECT_TIMEOUT};

#[test]
fn refused_host_reports_on_connection_refused_to_initiator_only() {
    let sim = Sim::with_seed(11);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 2));
    sim.refuse_connections(server.host.ip(), true);
    client
        .b
        .open_active_endpoint(addr, full_params(64, 2))
        .unwrap();
    let log = client.log.clone();
    run_until(&sim, "the refusal", || !log.refused().is_empty());
    assert_eq!(client.log.refused(), vec![(addr, RefuseReason::Refused)]);
    sim.run_until_idle(1000);
    assert!(server.log.is_empty(), "the refusing side hears nothing");
    assert!(client.log.established().is_empty());
    // Accepting again, the same endpoint can be opened.
    sim.refuse_connections(server.host.ip(), false);
    connect(&sim, &server, &client, addr, full_params(64, 2));
}

#[test]
fn reset_closes_both_sides_with_their_cancelled_keys() {
    let sim = Sim::with_seed(12);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 8));
    let acc = connect(&sim, &server, &client, addr, full_params(64, 8));
    // Sends in flight both ways (one link latency is 10 µs).
    for k in 0..5u64 {
        client.b.send_data_copy(addr, &[b"c"], &[], k).unwrap();
        server.b.send_data_copy(acc, &[b"s"], &[], 100 + k).unwrap();
    }
    sim.reset_connections(client.host.ip(), server.host.ip());
    let (cl, sl) = (client.log.clone(), server.log.clone());
    run_until(&sim, "both sides closed", || {
        cl.closed_count(addr) == 1 && sl.closed_count(acc) == 1
    });
    sim.run_until_idle(1000);
    let (_, why, keys) = client.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    assert_eq!(keys, vec![0, 1, 2, 3, 4], "the client's unfinished sends");
    let (_, why, keys) = server.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    assert_eq!(keys, vec![100, 101, 102, 103, 104]);
    assert!(client.log.completed_to(addr).is_empty());
    assert!(server.log.data().is_empty() && client.log.data().is_empty());
    // The connection can be opened again.
    connect(&sim, &server, &client, addr, full_params(64, 8));
}

#[test]
fn partition_holds_messages_and_heal_delivers_them_in_order() {
    let sim = Sim::with_seed(13);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 16));
    let acc = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.partition(client.host.ip(), server.host.ip());
    for k in 0..10u64 {
        client
            .b
            .send_data_copy(addr, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_secs(30));
    assert!(server.log.data().is_empty(), "nothing crosses a partition");
    assert!(
        client.log.completed_to(addr).is_empty(),
        "held sends do not complete"
    );
    assert!(client.log.closed().is_empty() && server.log.closed().is_empty());
    let healed_at = sim.now();
    sim.heal(client.host.ip(), server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "all held messages arrive", || {
        sl.data_from(acc).len() == 10
    });
    assert!(sim.now() >= healed_at + sim.link(client.host.ip(), server.host.ip()).latency);
    let got: Vec<u64> = server
        .log
        .data_from(acc)
        .iter()
        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..10).collect::<Vec<_>>(), "in order, once each");
    sim.run_until_idle(1000);
    assert_eq!(client.log.completed_to(addr), (0..10).collect::<Vec<_>>());
}

#[test]
fn connect_across_partition_is_unreachable_after_connect_timeout() {
    let sim = Sim::with_seed(14);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 2));
    sim.partition(client.host.ip(), server.host.ip());
    let start = sim.now();
    client
        .b
        .open_active_endpoint(addr, full_params(64, 2))
        .unwrap();
    let log = client.log.clone();
    run_until(&sim, "the refusal", || !log.refused().is_empty());
    assert_eq!(
        client.log.refused(),
        vec![(addr, RefuseReason::Unreachable)]
    );
    assert!(sim.now() - start >= CONNECT_TIMEOUT);
    sim.heal(client.host.ip(), server.host.ip());
    sim.run_until_idle(1000);
    assert!(
        server.log.is_empty(),
        "the held connection request must not surface after the timeout: {:?}",
        server.log
    );
    // Healed before the timeout, a connection attempt goes through.
    sim.partition(client.host.ip(), server.host.ip());
    client
        .b
        .open_active_endpoint(addr, full_params(64, 2))
        .unwrap();
    sim.run_for(CONNECT_TIMEOUT / 2);
    sim.heal(client.host.ip(), server.host.ip());
    let (cl, sl) = (client.log.clone(), server.log.clone());
    run_until(&sim, "established after heal", || {
        !cl.established().is_empty() && !sl.established().is_empty()
    });
    assert_eq!(client.log.refused().len(), 1);
}

#[test]
fn crash_closes_peers_with_reset_and_silences_the_host() {
    let sim = Sim::with_seed(15);
    let server = node(&sim, BackendConfig::default(), None);
    let c1 = node(&sim, BackendConfig::default(), None);
    let c2 = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 8));
    let a1 = connect(&sim, &server, &c1, addr, full_params(64, 8));
    connect(&sim, &server, &c2, addr, full_params(64, 8));
    sim.slow_receiver(server.host.ip(), Duration::from_secs(1));
    for k in 0..12u64 {
        let _ = c1.b.send_data_copy(addr, &[b"x"], &[], k);
    }
    server.b.send_data_copy(a1, &[b"to c1"], &[], 7).unwrap();
    // Eight messages fill the server's eight busy receive buffers.
    sim.run_for(Duration::from_millis(1));
    assert_eq!(server.log.data().len(), 8);
    let server_events = server.log.len();
    sim.crash(server.host.ip());
    let (l1, l2) = (c1.log.clone(), c2.log.clone());
    run_until(&sim, "both clients see the reset", || {
        l1.closed_count(addr) == 1 && l2.closed_count(addr) == 1
    });
    sim.run_for(Duration::from_secs(10));
    let (_, why, cancelled) = c1.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    let done = c1.log.completed_to(addr);
    let mut all: Vec<u64> = done.iter().chain(&cancelled).copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..12).collect::<Vec<_>>(),
        "each key once: {done:?} {cancelled:?}"
    );
    assert!(
        !cancelled.is_empty(),
        "a slow receiver leaves sends in flight"
    );
    assert_eq!(c2.log.closed()[0].1, CloseReason::Reset);
    assert_eq!(
        server.log.len(),
        server_events,
        "a crashed host's handler hears nothing more"
    );
    assert!(server.b.send_data_copy(a1, &[b"x"], &[], 8).is_err());
    // Connection attempts to the crashed host time out.
    c1.b.open_active_endpoint(addr, full_params(64, 8)).unwrap();
    let l1 = c1.log.clone();
    run_until(&sim, "the attempt gives up", || !l1.refused().is_empty());
    assert_eq!(c1.log.refused(), vec![(addr, RefuseReason::Unreachable)]);
}

#[test]
fn slow_receiver_makes_sender_see_no_resources_and_no_buffers() {
    let sim = Sim::with_seed(16);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(
        &sim,
        BackendConfig {
            send_queue_depth: 4,
            ..BackendConfig::default()
        },
        None,
    );
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let acc = connect(
        &sim,
        &server,
        &client,
        addr,
        ConnectionParams::buffered(64, 4),
    );
    sim.slow_receiver(server.host.ip(), Duration::from_millis(100));
    let mut accepted = BTreeSet::new();
    let mut no_resources = 0;
    let mut no_buffer = 0;
    for k in 0..50u64 {
        match client.b.send_data_copy(addr, &[b"copy"], &[], 1000 + k) {
            Ok(()) => {
                accepted.insert(1000 + k);
            }
            Err(SendError::NoResources) => no_resources += 1,
            Err(e) => panic!("{e}"),
        }
        match client.b.get_buffer(addr).unwrap() {
            Some(mut buf) => {
                buf.write(b"buf").unwrap();
                client.b.send_buffer(addr, buf).unwrap();
            }
            None => no_buffer += 1,
        }
        sim.run_for(Duration::from_millis(10));
    }
    assert!(no_resources > 0, "copy sends must answer NoResources");
    assert!(no_buffer > 0, "get_buffer must give None");
    // Only about two messages per 100 ms get through two busy buffers.
    let delivered = server.log.data_from(acc).len();
    assert!(
        (6..=14).contains(&delivered),
        "{delivered} messages in 500 ms through 2 buffers held 100 ms each"
    );
    // Back to normal speed, everything accepted drains.
    sim.slow_receiver(server.host.ip(), Duration::ZERO);
    sim.run_for(Duration::from_secs(2));
    let done: BTreeSet<u64> = client
        .log
        .completed_to(addr)
        .into_iter()
        .filter(|k| *k >= 1000)
        .collect();
    assert_eq!(done, accepted, "every accepted copy send completes");
    assert_eq!(
        client.b.num_available_buffers(addr).unwrap(),
        0,
        "the low-water mark saw the pool empty"
    );
    assert_eq!(client.b.num_available_buffers(addr).unwrap(), 4);
}

#[test]
fn crashed_host_operations_fail_and_new_backends_are_refused() {
    let sim = Sim::with_seed(17);
    let n = node(&sim, BackendConfig::default(), None);
    sim.crash(n.host.ip());
    let any = EndpointAddress::new(n.host.ip(), 0);
    assert!(n.b.open_listen_endpoint(any, full_params(64, 2)).is_err());
    assert!(n
        .b
        .open_active_endpoint(EndpointAddress::v4(127, 0, 0, 99, 80), full_params(64, 2))
        .is_err());
    assert!(n
        .host
        .backend(BackendConfig::default(), netio_core::NoopHandler)
        .is_err());
}

#[test]
fn a_paused_loop_holds_its_callbacks_and_pushes_back_until_resumed() {
    let sim = Sim::with_seed(21);
    let server = node(&sim, BackendConfig::default(), None);
    let cfg = BackendConfig {
        send_queue_depth: 4,
        ..BackendConfig::default()
    };
    let client = node(&sim, cfg, None);
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let acc = connect(&sim, &server, &client, addr, ConnectionParams::default());
    let seen = server.log.len();
    sim.pause_loop(server.host.ip());
    let mut accepted = Vec::new();
    for k in 0..20u64 {
        match client.b.send_data_copy(addr, &[&k.to_le_bytes()], &[], k) {
            Ok(()) => accepted.push(k),
            Err(SendError::NoResources) => {}
            Err(e) => panic!("{e}"),
        }
        // Two messages fill the paused receiver's buffers (and complete);
        // the rest stay in flight.
        sim.run_until_idle(10_000);
    }
    sim.run_until_idle(10_000);
    assert_eq!(
        server.log.len(),
        seen,
        "a paused loop calls no handler: {:?}",
        server.log
    );
    assert_eq!(
        accepted,
        (0..6).collect::<Vec<_>>(),
        "two messages in the receiver's buffers and four in flight, then NoResources"
    );
    assert_eq!(
        client.log.completed_to(addr),
        vec![0, 1],
        "the two messages taken into receive buffers complete"
    );
    sim.resume_loop(server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "every accepted message arrives", || {
        sl.data_from(acc).len() == 6
    });
    let got: Vec<u64> = server
        .log
        .data_from(acc)
        .iter()
        .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
        .collect();
    assert_eq!(got, accepted, "held callbacks run in their order");
}

#[test]
fn closing_drops_what_a_paused_loop_still_holds_for_the_connection() {
    let sim = Sim::with_seed(22);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let acc = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.pause_loop(server.host.ip());
    for k in 0..3u64 {
        client.b.send_data_copy(addr, &[b"m"], &[], k).unwrap();
    }
    sim.run_until_idle(10_000);
    server.b.close_active_endpoint(acc).unwrap();
    sim.resume_loop(server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the close is reported", || sl.closed_count(acc) == 1);
    sim.run_until_idle(10_000);
    assert!(
        server.log.data().is_empty(),
        "nothing is delivered after the close call: {:?}",
        server.log
    );
    assert!(
        matches!(
            server.b.close_active_endpoint(acc),
            Err(netio_core::CloseError::UnknownActiveEndpoint(_))
        ),
        "the endpoint is gone"
    );
}
