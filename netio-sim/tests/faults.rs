//! Each fault surfaces through the normal callbacks, as a real provider
//! would report it.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{connect, full_params, listen, node, rdma, run_until};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, RefuseReason, SendError,
};
use netio_sim::{Sim, CONNECT_TIMEOUT};

#[test]
fn refused_host_reports_on_connection_refused_to_initiator_only() {
    let sim = Sim::with_seed(11);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 2));
    sim.refuse_connections(server.host.ip(), true);
    let conn = client
        .b
        .open_active_endpoint(addr, full_params(64, 2))
        .unwrap();
    let log = client.log.clone();
    run_until(&sim, "the refusal", || !log.refused().is_empty());
    assert_eq!(
        client.log.refused(),
        vec![(conn, addr, RefuseReason::Refused)]
    );
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
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 8));
    let (conn, acc) = connect(&sim, &server, &client, addr, full_params(64, 8));
    // Sends in flight both ways (one link latency is 10 µs).
    for k in 0..5u64 {
        client.b.send_data_copy(conn, &[b"c"], &[], k).unwrap();
        server.b.send_data_copy(acc, &[b"s"], &[], 100 + k).unwrap();
    }
    sim.reset_connections(client.host.ip(), server.host.ip());
    let (cl, sl) = (client.log.clone(), server.log.clone());
    run_until(&sim, "both sides closed", || {
        cl.closed_count(conn) == 1 && sl.closed_count(acc) == 1
    });
    sim.run_until_idle(1000);
    let (_, why, keys) = client.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    assert_eq!(keys, vec![0, 1, 2, 3, 4], "the client's unfinished sends");
    let (_, why, keys) = server.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    assert_eq!(keys, vec![100, 101, 102, 103, 104]);
    assert!(client.log.completed_to(conn).is_empty());
    assert!(server.log.data().is_empty() && client.log.data().is_empty());
    // The connection can be opened again.
    connect(&sim, &server, &client, addr, full_params(64, 8));
}

#[test]
fn partition_holds_messages_and_heal_delivers_them_in_order() {
    let sim = Sim::with_seed(13);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 16));
    let (conn, acc) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.partition(client.host.ip(), server.host.ip());
    for k in 0..10u64 {
        client
            .b
            .send_data_copy(conn, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_secs(30));
    assert!(server.log.data().is_empty(), "nothing crosses a partition");
    assert!(
        client.log.completed_to(conn).is_empty(),
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
    assert_eq!(client.log.completed_to(conn), (0..10).collect::<Vec<_>>());
}

#[test]
fn connect_across_partition_is_unreachable_after_connect_timeout() {
    let sim = Sim::with_seed(14);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 2));
    sim.partition(client.host.ip(), server.host.ip());
    let start = sim.now();
    let conn = client
        .b
        .open_active_endpoint(addr, full_params(64, 2))
        .unwrap();
    let log = client.log.clone();
    run_until(&sim, "the refusal", || !log.refused().is_empty());
    assert_eq!(
        client.log.refused(),
        vec![(conn, addr, RefuseReason::Unreachable)]
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
    let server = node(&sim, rdma(), None);
    let c1 = node(&sim, rdma(), None);
    let c2 = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 8));
    let (k1, a1) = connect(&sim, &server, &c1, addr, full_params(64, 8));
    let (k2, _) = connect(&sim, &server, &c2, addr, full_params(64, 8));
    sim.slow_receiver(server.host.ip(), Duration::from_secs(1));
    for k in 0..12u64 {
        let _ = c1.b.send_data_copy(k1, &[b"x"], &[], k);
    }
    server.b.send_data_copy(a1, &[b"to c1"], &[], 7).unwrap();
    // Eight messages fill the server's eight busy receive buffers.
    sim.run_for(Duration::from_millis(1));
    assert_eq!(server.log.data().len(), 8);
    let server_events = server.log.len();
    sim.crash(server.host.ip());
    let (l1, l2) = (c1.log.clone(), c2.log.clone());
    run_until(&sim, "both clients see the reset", || {
        l1.closed_count(k1) == 1 && l2.closed_count(k2) == 1
    });
    sim.run_for(Duration::from_secs(10));
    let (_, why, cancelled) = c1.log.closed()[0].clone();
    assert_eq!(why, CloseReason::Reset);
    let done = c1.log.completed_to(k1);
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
    let again = c1.b.open_active_endpoint(addr, full_params(64, 8)).unwrap();
    let l1 = c1.log.clone();
    run_until(&sim, "the attempt gives up", || !l1.refused().is_empty());
    assert_eq!(
        c1.log.refused(),
        vec![(again, addr, RefuseReason::Unreachable)]
    );
}

#[test]
fn slow_receiver_makes_sender_see_no_resources_and_no_buffers() {
    let sim = Sim::with_seed(16);
    let server = node(&sim, rdma(), None);
    let client = node(
        &sim,
        BackendConfig {
            send_queue_depth: 4,
            ..rdma()
        },
        None,
    );
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let (conn, acc) = connect(
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
        match client.b.send_data_copy(conn, &[b"copy"], &[], 1000 + k) {
            Ok(()) => {
                accepted.insert(1000 + k);
            }
            Err(SendError::NoResources) => no_resources += 1,
            Err(e) => panic!("{e}"),
        }
        match client.b.get_buffer(conn).unwrap() {
            Some(mut buf) => {
                buf.write(b"buf").unwrap();
                client.b.send_buffer(conn, buf, k).unwrap();
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
        .completed_to(conn)
        .into_iter()
        .filter(|k| *k >= 1000)
        .collect();
    assert_eq!(done, accepted, "every accepted copy send completes");
    assert_eq!(
        client.b.num_available_buffers(conn).unwrap(),
        0,
        "the low-water mark saw the pool empty"
    );
    assert_eq!(client.b.num_available_buffers(conn).unwrap(), 4);
}

#[test]
fn crashed_host_operations_fail_and_new_backends_are_refused() {
    let sim = Sim::with_seed(17);
    let n = node(&sim, rdma(), None);
    sim.crash(n.host.ip());
    let any = EndpointAddress::new(n.host.ip(), 0);
    assert!(n.b.open_listen_endpoint(any, full_params(64, 2)).is_err());
    assert!(n
        .b
        .open_active_endpoint(EndpointAddress::v4(127, 0, 0, 99, 80), full_params(64, 2))
        .is_err());
    assert!(n.host.backend(rdma(), netio_core::NoopHandler).is_err());
}

#[test]
fn a_paused_loop_holds_its_callbacks_and_pushes_back_until_resumed() {
    let sim = Sim::with_seed(21);
    let server = node(&sim, rdma(), None);
    let cfg = BackendConfig {
        send_queue_depth: 4,
        ..rdma()
    };
    let client = node(&sim, cfg, None);
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let (conn, acc) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    let seen = server.log.len();
    sim.pause_loop(server.host.ip());
    let mut accepted = Vec::new();
    for k in 0..20u64 {
        match client.b.send_data_copy(conn, &[&k.to_le_bytes()], &[], k) {
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
        client.log.completed_to(conn),
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
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (conn, acc) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.pause_loop(server.host.ip());
    for k in 0..3u64 {
        client.b.send_data_copy(conn, &[b"m"], &[], k).unwrap();
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
            Err(netio_core::CloseError::UnknownConnection(c)) if c == acc
        ),
        "the handle is stale"
    );
}

fn with_peer_timeout(t: Duration) -> BackendConfig {
    BackendConfig {
        peer_timeout: Some(t),
        ..rdma()
    }
}

#[test]
fn peer_timeout_closes_a_partitioned_connection_with_timed_out() {
    let sim = Sim::with_seed(71);
    let t = Duration::from_secs(2);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, with_peer_timeout(t), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, acc) = connect(&sim, &server, &client, addr, full_params(64, 4));
    sim.partition(client.host.ip(), server.host.ip());
    let cut_at = sim.now();
    for k in 0..3u64 {
        client.b.send_data_copy(conn, &[b"x"], &[], k).unwrap();
    }
    let cl = client.log.clone();
    run_until(&sim, "the timeout", || cl.closed_count(conn) == 1);
    assert_eq!(sim.now() - cut_at, t, "exactly peer_timeout after the cut");
    let (_, why, cancelled) = client.log.closed()[0].clone();
    assert_eq!(why, CloseReason::TimedOut);
    assert_eq!(cancelled, vec![0, 1, 2], "unfinished keys are cancelled");
    assert!(client.b.send_data_copy(conn, &[b"x"], &[], 9).is_err());
    // The side without a peer_timeout waits; after the heal it hears a
    // reset, as a TCP peer would.
    sim.run_for(Duration::from_secs(60));
    assert_eq!(server.log.closed_count(acc), 0);
    sim.heal(client.host.ip(), server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the reset after the heal", || {
        sl.closed_count(acc) == 1
    });
    assert_eq!(server.log.closed()[0].1, CloseReason::Reset);
    assert!(server.log.data().is_empty());
    sim.run_until_idle(1000);
    assert_eq!(sim.live_objects(), 1, "only the listener is left");
}

#[test]
fn a_partition_healed_before_peer_timeout_does_not_time_out() {
    let sim = Sim::with_seed(72);
    let t = Duration::from_secs(2);
    let server = node(&sim, with_peer_timeout(t), None);
    let client = node(&sim, with_peer_timeout(t), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, acc) = connect(&sim, &server, &client, addr, full_params(64, 4));
    sim.partition(client.host.ip(), server.host.ip());
    sim.run_for(t / 2);
    sim.heal(client.host.ip(), server.host.ip());
    // Cut again: the timeout counts from the new cut.
    sim.run_for(t / 2);
    sim.partition(client.host.ip(), server.host.ip());
    let cut_at = sim.now();
    sim.run_for(t - Duration::from_millis(1));
    assert!(client.log.closed().is_empty() && server.log.closed().is_empty());
    let (cl, sl) = (client.log.clone(), server.log.clone());
    run_until(&sim, "both sides time out", || {
        cl.closed_count(conn) == 1 && sl.closed_count(acc) == 1
    });
    assert_eq!(sim.now() - cut_at, t);
    assert_eq!(client.log.closed()[0].1, CloseReason::TimedOut);
    assert_eq!(server.log.closed()[0].1, CloseReason::TimedOut);
}

#[test]
fn without_peer_timeout_a_partition_never_times_out() {
    let sim = Sim::with_seed(73);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, acc) = connect(&sim, &server, &client, addr, full_params(64, 4));
    sim.partition(client.host.ip(), server.host.ip());
    client.b.send_data_copy(conn, &[b"late"], &[], 1).unwrap();
    sim.run_for(Duration::from_secs(3600));
    assert!(client.log.closed().is_empty() && server.log.closed().is_empty());
    sim.heal(client.host.ip(), server.host.ip());
    let sl = server.log.clone();
    run_until(&sim, "the message after an hour", || {
        sl.data_from(acc).len() == 1
    });
}

#[test]
fn peer_timeout_closes_connections_to_a_silently_crashed_host() {
    let sim = Sim::with_seed(74);
    let t = Duration::from_millis(500);
    let server = node(&sim, rdma(), None);
    let c1 = node(&sim, with_peer_timeout(t), None);
    let c2 = node(&sim, rdma(), None);
    let addr = listen(&server, full_params(64, 4));
    let (k1, _) = connect(&sim, &server, &c1, addr, full_params(64, 4));
    let (k2, _) = connect(&sim, &server, &c2, addr, full_params(64, 4));
    sim.crash_silently(server.host.ip());
    let crashed_at = sim.now();
    c1.b.send_data_copy(k1, &[b"x"], &[], 5).unwrap();
    c2.b.send_data_copy(k2, &[b"x"], &[], 6).unwrap();
    let l1 = c1.log.clone();
    run_until(&sim, "the timeout", || l1.closed_count(k1) == 1);
    assert_eq!(sim.now() - crashed_at, t);
    assert_eq!(c1.log.closed(), vec![(k1, CloseReason::TimedOut, vec![5])]);
    // Without a peer_timeout nothing is ever reported: no reset comes.
    sim.run_for(Duration::from_secs(600));
    assert!(c2.log.closed().is_empty());
    assert!(
        c2.log.completed_to(k2).is_empty(),
        "its send never completes"
    );
}

/// A handler that holds its own backend (as an application's state may)
/// and calls into the world when it is dropped: dropped inside the world's
/// lock it would deadlock.
struct HoldsItsBackend {
    me: std::sync::Arc<std::sync::Mutex<Option<netio_sim::SimBackend>>>,
    dropped: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl netio_core::Handler<netio_sim::SimBackend> for HoldsItsBackend {}

impl Drop for HoldsItsBackend {
    fn drop(&mut self) {
        if let Some(b) = self.me.lock().unwrap().take() {
            // Calls into the world, then lets the backend go.
            let _ = b.now();
            let _ = b.open_listen_endpoint(
                EndpointAddress::new(b.ip(), 0),
                ConnectionParams::receive(64, 1),
            );
        }
        self.dropped
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn holding_backend(
    host: &netio_sim::SimHost,
) -> (
    netio_sim::SimBackend,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let me = std::sync::Arc::new(std::sync::Mutex::new(None));
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let b = host
        .backend(
            BackendConfig::default(),
            HoldsItsBackend {
                me: me.clone(),
                dropped: dropped.clone(),
            },
        )
        .unwrap();
    *me.lock().unwrap() = Some(b.clone());
    (b, dropped)
}

#[test]
fn a_crash_drops_the_hosts_handlers_with_the_world_unlocked() {
    let sim = Sim::with_seed(5);
    let (h1, h2) = (sim.next_host(), sim.next_host());
    let (b1, dropped1) = holding_backend(&h1);
    let (_b2, dropped2) = holding_backend(&h2);
    // A paused loop holding a callback for the handler when it crashes.
    let addr = b1
        .open_listen_endpoint(
            EndpointAddress::new(h1.ip(), 0),
            ConnectionParams::receive(64, 4),
        )
        .unwrap();
    sim.pause_loop(h1.ip());
    let peer = h2
        .backend(BackendConfig::default(), netio_core::NoopHandler)
        .unwrap();
    peer.open_active_endpoint(addr, ConnectionParams::receive(64, 4))
        .unwrap();
    sim.run_for(Duration::from_millis(10));
    sim.crash(h1.ip());
    assert!(
        dropped1.load(std::sync::atomic::Ordering::SeqCst),
        "the crashed host's handler was dropped"
    );
    assert!(!dropped2.load(std::sync::atomic::Ordering::SeqCst));
    sim.run_for(Duration::from_millis(10));
    sim.restart(h1.ip());
    sim.run_for(Duration::from_millis(10));
    // The end of the world drops the other handler too, though it holds
    // its backend (and so the world).
    sim.shut_down();
    assert!(dropped2.load(std::sync::atomic::Ordering::SeqCst));
    assert!(!sim.step(), "nothing runs after the end");
}
