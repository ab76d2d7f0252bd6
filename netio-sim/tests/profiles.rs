//! Provider profiles: what a completion means is chosen by the backend's
//! `NetworkMode`. TCP (the default): a send completes once its bytes are
//! handed to the sender's "kernel" (a bounded window), so it can complete
//! and still be lost when the receiver closes. RDMA: a send completes when
//! the receiver has taken the message.

mod common;

use std::time::Duration;

use common::{connect, listen, node, rdma, run_until, Node};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnId, ConnectionParams, RefuseReason, SendError,
};
use netio_sim::{LinkConfig, Sim};

/// Two nodes in `config`'s mode joined by a 1 ms link; returns the client's
/// and the server's handle of one connection (server receives 8 × 64 B).
fn pair(sim: &Sim, config: BackendConfig) -> (Node, Node, ConnId, ConnId) {
    let server = node(sim, config.clone(), None);
    let client = node(sim, config, None);
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_millis(1), 0),
    );
    let addr = listen(&server, ConnectionParams::receive(64, 8));
    let (c, s) = connect(sim, &server, &client, addr, ConnectionParams::default());
    (server, client, c, s)
}

fn send_ten(client: &Node, c: ConnId) {
    for k in 0..10u64 {
        client
            .b
            .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
            .unwrap();
    }
}

#[test]
fn the_default_profile_is_tcp() {
    assert_eq!(
        BackendConfig::default().mode,
        netio_core::NetworkMode::Tcp,
        "the default backend runs the TCP profile"
    );
}

#[test]
fn tcp_profile_completes_on_hand_off_and_loses_completed_sends_when_the_receiver_closes() {
    let sim = Sim::with_seed(301);
    let (server, client, c, s) = pair(&sim, BackendConfig::default());
    let t0 = sim.now();
    send_ten(&client, c);
    let cl = client.log.clone();
    run_until(&sim, "all ten complete", || cl.completed_to(c).len() == 10);
    assert!(
        sim.now() < t0 + Duration::from_millis(1),
        "completed before the first byte could reach the receiver"
    );
    assert!(server.log.data().is_empty());
    // The receiver closes before anything arrives: what completed is lost.
    server.b.close_active_endpoint(s).unwrap();
    run_until(&sim, "the client hears the close", || {
        cl.closed_count(c) == 1
    });
    sim.run_until_idle(10_000);
    assert!(
        server.log.data().is_empty(),
        "nothing delivered after close"
    );
    assert_eq!(client.log.completed_to(c), (0..10).collect::<Vec<_>>());
    assert_eq!(
        client.log.closed(),
        vec![(c, CloseReason::PeerClosed, vec![])],
        "completed sends are not cancelled again"
    );
}

#[test]
fn rdma_profile_completes_on_delivery_and_cancels_what_the_receiver_never_took() {
    let sim = Sim::with_seed(301);
    let (server, client, c, s) = pair(&sim, rdma());
    send_ten(&client, c);
    sim.run_for(Duration::from_micros(500));
    assert!(client.log.completed_to(c).is_empty(), "nothing arrived yet");
    server.b.close_active_endpoint(s).unwrap();
    let cl = client.log.clone();
    run_until(&sim, "the client hears the close", || {
        cl.closed_count(c) == 1
    });
    sim.run_until_idle(10_000);
    assert!(server.log.data().is_empty());
    assert!(client.log.completed_to(c).is_empty());
    assert_eq!(
        client.log.closed(),
        vec![(c, CloseReason::PeerClosed, (0..10).collect())]
    );
}

#[test]
fn both_profiles_deliver_and_complete_everything_when_nobody_closes() {
    for config in [BackendConfig::default(), rdma()] {
        let sim = Sim::with_seed(302);
        let (server, client, c, s) = pair(&sim, config);
        send_ten(&client, c);
        let (sl, cl) = (server.log.clone(), client.log.clone());
        run_until(&sim, "all delivered and completed", || {
            sl.data_from(s).len() == 10 && cl.completed_to(c).len() == 10
        });
        let got: Vec<u64> = server
            .log
            .data_from(s)
            .iter()
            .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
            .collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
        assert_eq!(client.log.completed_to(c), (0..10).collect::<Vec<_>>());
    }
}

#[test]
fn an_oversize_message_is_completed_under_tcp_and_cancelled_under_rdma() {
    for (config, tcp) in [(BackendConfig::default(), true), (rdma(), false)] {
        let sim = Sim::with_seed(303);
        let (server, client, c, s) = pair(&sim, config);
        client.b.send_data_copy(c, &[&[7u8; 100]], &[], 42).unwrap();
        let cl = client.log.clone();
        run_until(&sim, "the close", || cl.closed_count(c) == 1);
        sim.run_until_idle(10_000);
        assert!(server.log.data().is_empty(), "never delivered");
        assert!(matches!(
            server.log.closed()[..],
            [(id, CloseReason::MessageTooLarge { size: 100, limit: 64 }, _)] if id == s
        ));
        let (done, cancelled) = (client.log.completed_to(c), client.log.cancelled_to(c));
        if tcp {
            assert_eq!((done, cancelled), (vec![42], vec![]), "TCP: the bytes left");
        } else {
            assert_eq!((done, cancelled), (vec![], vec![42]), "RDMA: never taken");
        }
    }
}

#[test]
fn tcp_profile_window_bounds_what_completes_before_the_receiver_takes_it() {
    let sim = Sim::with_seed(304);
    sim.set_tcp_window(1000);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(100, 4));
    let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    server.b.pause_receive(s).unwrap();
    for k in 0..30u64 {
        client
            .b
            .send_data_copy(c, &[&[k as u8; 100]], &[], k)
            .unwrap();
    }
    sim.run_for(Duration::from_secs(1));
    assert_eq!(
        client.log.completed_to(c),
        (0..10).collect::<Vec<_>>(),
        "ten 100-byte messages fill a 1000-byte window"
    );
    assert!(server.log.data().is_empty(), "paused");
    server.b.resume_receive(s).unwrap();
    let (sl, cl) = (server.log.clone(), client.log.clone());
    run_until(&sim, "everything", || {
        sl.data_from(s).len() == 30 && cl.completed_to(c).len() == 30
    });
    let firsts: Vec<u8> = server.log.data_from(s).iter().map(|d| d[0]).collect();
    assert_eq!(firsts, (0..30).collect::<Vec<u8>>(), "in order, once each");
}

/// A send that waits for room in the window completes in the step of the
/// delivery that makes the room: at the instant the receiver takes the
/// message before it, reported right after that message, with no step of
/// its own.
#[test]
fn tcp_profile_reports_a_send_the_window_lets_in_in_the_step_of_the_delivery_that_freed_room() {
    let sim = Sim::with_seed(309);
    sim.set_tcp_window(100);
    let (server, client, c, s) = pair(&sim, BackendConfig::default());
    client.b.send_data_copy(c, &[&[1; 60]], &[], 1).unwrap();
    client.b.send_data_copy(c, &[&[2; 60]], &[], 2).unwrap();
    let cl = client.log.clone();
    run_until(&sim, "the first completes", || cl.completed_to(c) == [1]);
    sim.run_for(Duration::from_micros(100));
    assert_eq!(client.log.completed_to(c), [1], "the second waits for room");
    assert!(server.log.data().is_empty(), "nothing has arrived yet");
    let mut steps = 0;
    while server.log.data_from(s).is_empty() {
        assert!(sim.step(), "the first message is on its way");
        steps += 1;
        assert!(steps < 100, "the first message did not arrive");
    }
    let taken_at = sim.now();
    assert_eq!(
        client.log.completed_to(c),
        [1, 2],
        "the step that delivered the first message reported the second send"
    );
    assert_eq!(
        server.log.data_from(s),
        [vec![1; 60]],
        "only the first arrived"
    );
    assert!(
        sim.next_event_at().is_some_and(|t| t > taken_at),
        "no event left at the delivery's instant for the completion"
    );
    let sl = server.log.clone();
    run_until(&sim, "the second arrives", || sl.data_from(s).len() == 2);
}

#[test]
fn tcp_profile_holds_the_queue_slot_until_the_completion_is_reported() {
    let sim = Sim::with_seed(305);
    let config = BackendConfig {
        send_queue_depth: 2,
        ..BackendConfig::default()
    };
    let (_server, client, c, _s) = pair(&sim, config);
    client.b.send_data_copy(c, &[b"a"], &[], 1).unwrap();
    client.b.send_data_copy(c, &[b"b"], &[], 2).unwrap();
    assert!(
        matches!(
            client.b.send_data_copy(c, &[b"c"], &[], 3),
            Err(SendError::NoResources)
        ),
        "accepted into the window, but not reported yet"
    );
    let cl = client.log.clone();
    run_until(&sim, "both complete", || cl.completed_to(c).len() == 2);
    client.b.send_data_copy(c, &[b"c"], &[], 3).unwrap();
}

#[test]
fn tcp_profile_orderly_close_after_completions_delivers_everything_first() {
    let sim = Sim::with_seed(306);
    let (server, client, c, s) = pair(&sim, BackendConfig::default());
    send_ten(&client, c);
    let cl = client.log.clone();
    run_until(&sim, "all complete", || cl.completed_to(c).len() == 10);
    client.b.close_active_endpoint(c).unwrap();
    let sl = server.log.clone();
    run_until(&sim, "the server hears the close", || {
        sl.closed_count(s) == 1
    });
    assert_eq!(
        server.log.data_from(s).len(),
        10,
        "all data before the close"
    );
    let last = server.log.events().last().cloned().unwrap();
    assert!(
        matches!(
            last,
            common::Event::Closed {
                reason: CloseReason::PeerClosed,
                ..
            }
        ),
        "{last:?}"
    );
}

#[test]
fn a_listener_in_one_network_mode_refuses_an_initiator_in_the_other() {
    let sim = Sim::with_seed(307);
    let server = node(&sim, rdma(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let c = client
        .b
        .open_active_endpoint(addr, ConnectionParams::default())
        .unwrap();
    let cl = client.log.clone();
    run_until(&sim, "the refusal", || !cl.refused().is_empty());
    let (id, remote, reason) = client.log.refused()[0].clone();
    assert_eq!((id, remote), (c, addr));
    match reason {
        RefuseReason::Handshake(why) => {
            assert!(why.contains("Rdma") && why.contains("Tcp"), "{why}")
        }
        other => panic!("expected a handshake failure, got {other:?}"),
    }
    sim.run_until_idle(1000);
    assert!(server.log.is_empty(), "the listener reports nothing");
}

#[test]
fn peer_timeout_ends_a_partitioned_connection_under_either_profile() {
    for config in [BackendConfig::default(), rdma()] {
        let config = BackendConfig {
            peer_timeout: Some(Duration::from_secs(2)),
            ..config
        };
        let sim = Sim::with_seed(308);
        let (server, client, c, s) = pair(&sim, config);
        let cut = sim.now();
        sim.partition(client.host.ip(), server.host.ip());
        send_ten(&client, c);
        let (sl, cl) = (server.log.clone(), client.log.clone());
        run_until(&sim, "both time out", || {
            cl.closed_count(c) == 1 && sl.closed_count(s) == 1
        });
        assert_eq!(
            sim.now(),
            cut + Duration::from_secs(2),
            "exactly the timeout"
        );
        assert_eq!(client.log.closed()[0].1, CloseReason::TimedOut);
        assert_eq!(server.log.closed()[0].1, CloseReason::TimedOut);
        assert!(server.log.data().is_empty());
        // Every key once: completed (TCP, handed off) or cancelled.
        let mut keys = client.log.completed_to(c);
        keys.extend(client.log.cancelled_to(c));
        keys.sort_unstable();
        assert_eq!(keys, (0..10).collect::<Vec<_>>());
    }
}
