//! The network model beyond links: network cards (incast), holding and
//! releasing traffic, restarting crashed hosts, connections that share a
//! local port.

mod common;

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, listen, node, rdma, run_until, Log, Node, Recorder};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    OpenActiveError, OpenListenError,
};
use netio_sim::{LinkConfig, NicConfig, Sim};

const MSG: usize = 64 * 1024;
const PER_SENDER: usize = 16; // 1 MiB each

/// `senders` hosts each push `PER_SENDER` messages of `MSG` bytes to one
/// receiver whose card takes 1 GB/s; links are 10 GB/s. Returns the
/// virtual time from the first send until the last message arrived.
fn incast(senders: usize) -> Duration {
    let sim = Sim::with_seed(401);
    let server = node(&sim, BackendConfig::default(), None);
    sim.set_nic(
        server.host.ip(),
        NicConfig {
            send_bytes_per_sec: 10_000_000_000,
            receive_bytes_per_sec: 1_000_000_000,
        },
    );
    let addr = listen(&server, ConnectionParams::receive(MSG, 64));
    let clients: Vec<(Node, ConnId)> = (0..senders)
        .map(|_| {
            let n = node(&sim, BackendConfig::default(), None);
            let (c, _) = connect(&sim, &server, &n, addr, ConnectionParams::default());
            (n, c)
        })
        .collect();
    let t0 = sim.now();
    let payload = vec![1u8; MSG];
    for (n, c) in &clients {
        for k in 0..PER_SENDER as u64 {
            n.b.send_data_copy(*c, &[&payload], &[], k).unwrap();
        }
    }
    let sl = server.log.clone();
    let want = senders * PER_SENDER;
    run_until(&sim, "every message arrives", || sl.data().len() == want);
    sim.now() - t0
}

#[test]
fn a_receivers_network_card_is_shared_by_incast_senders() {
    let one = incast(1);
    let four = incast(4);
    // 1 MiB at 1 GB/s is ~1.05 ms; 4 MiB ~4.2 ms, whatever the links.
    let bytes = |n: usize| (n * PER_SENDER * MSG) as f64;
    let secs = |d: Duration| d.as_secs_f64();
    assert!(
        secs(one) >= bytes(1) / 1e9 && secs(one) < bytes(1) / 1e9 * 1.2,
        "one sender: {one:?}"
    );
    assert!(
        secs(four) >= bytes(4) / 1e9 && secs(four) < bytes(4) / 1e9 * 1.2,
        "four senders share the receiver's 1 GB/s: {four:?}"
    );
}

#[test]
fn a_senders_network_card_is_shared_by_its_connections() {
    let sim = Sim::with_seed(402);
    let client = node(&sim, BackendConfig::default(), None);
    sim.set_nic(client.host.ip(), NicConfig::symmetric(100_000_000)); // 100 MB/s
    let servers: Vec<Node> = (0..2)
        .map(|_| node(&sim, BackendConfig::default(), None))
        .collect();
    let conns: Vec<ConnId> = servers
        .iter()
        .map(|s| {
            let addr = listen(s, ConnectionParams::receive(MSG, 64));
            connect(&sim, s, &client, addr, ConnectionParams::default()).0
        })
        .collect();
    let t0 = sim.now();
    let payload = vec![2u8; MSG];
    for c in &conns {
        for k in 0..8u64 {
            client.b.send_data_copy(*c, &[&payload], &[], k).unwrap();
        }
    }
    let logs: Vec<Log> = servers.iter().map(|s| s.log.clone()).collect();
    run_until(&sim, "all arrive", || {
        logs.iter().all(|l| l.data().len() == 8)
    });
    let took = (sim.now() - t0).as_secs_f64();
    let need = (2 * 8 * MSG) as f64 / 1e8; // ~10.5 ms through one card
    assert!(
        took >= need && took < need * 1.2,
        "{took} s for {need} s of bytes"
    );
}

#[test]
fn hold_delays_traffic_without_ending_connections_and_release_delivers_it_in_order() {
    for config in [BackendConfig::default(), rdma()] {
        let tcp = config.mode == netio_core::NetworkMode::Tcp;
        let config = BackendConfig {
            peer_timeout: Some(Duration::from_secs(1)),
            ..config
        };
        let sim = Sim::with_seed(403);
        let server = node(&sim, config.clone(), None);
        let client = node(&sim, config, None);
        let addr = listen(&server, ConnectionParams::receive(64, 16));
        let (c, s) = connect(&sim, &server, &client, addr, ConnectionParams::default());
        let (a, b) = (client.host.ip(), server.host.ip());
        sim.hold(a, b);
        for k in 0..10u64 {
            client
                .b
                .send_data_copy(c, &[&k.to_le_bytes()], &[], k)
                .unwrap();
        }
        sim.run_for(Duration::from_secs(5));
        assert!(server.log.data().is_empty(), "nothing passes a hold");
        assert!(
            client.log.closed().is_empty() && server.log.closed().is_empty(),
            "a hold is not a lost peer: no timeout"
        );
        // TCP completes on hand-off; RDMA waits for the receiver.
        let done = client.log.completed_to(c).len();
        assert_eq!(done, if tcp { 10 } else { 0 }, "tcp={tcp}");
        let released = sim.now();
        sim.release(a, b);
        let (sl, cl) = (server.log.clone(), client.log.clone());
        run_until(&sim, "all arrive", || {
            sl.data_from(s).len() == 10 && cl.completed_to(c).len() == 10
        });
        assert!(sim.now() >= released + sim.link(a, b).latency);
        let got: Vec<u64> = server
            .log
            .data_from(s)
            .iter()
            .map(|d| u64::from_le_bytes(d[..8].try_into().unwrap()))
            .collect();
        assert_eq!(got, (0..10).collect::<Vec<_>>());
    }
}

#[test]
fn a_connection_attempt_across_a_hold_is_made_once_released_in_time() {
    let sim = Sim::with_seed(404);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    sim.hold(client.host.ip(), server.host.ip());
    let c = client
        .b
        .open_active_endpoint(addr, ConnectionParams::default())
        .unwrap();
    sim.run_for(Duration::from_secs(1));
    assert!(client.log.is_empty() && server.log.is_empty());
    sim.release(client.host.ip(), server.host.ip());
    let cl = client.log.clone();
    run_until(&sim, "established", || {
        cl.established().iter().any(|e| e.0 == c)
    });
}

#[test]
fn restart_brings_a_crashed_host_back_fresh_and_runs_its_hook() {
    let sim = Sim::with_seed(405);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, ConnectionParams::default());

    // The application's restart: a new backend listening on the old port.
    let reborn: Arc<Mutex<Vec<(netio_sim::SimBackend, Log)>>> = Arc::default();
    let r = reborn.clone();
    server.host.on_restart(move |host| {
        let log = Log::default();
        let b = host
            .backend(BackendConfig::default(), Recorder::new(log.clone(), None))
            .unwrap();
        b.open_listen_endpoint(addr, ConnectionParams::receive(64, 4))
            .unwrap();
        r.lock().unwrap().push((b, log));
    });

    let ip = server.host.ip();
    sim.crash(ip);
    assert!(sim.crashed(ip));
    let cl = client.log.clone();
    run_until(&sim, "the client hears the reset", || {
        cl.closed_count(c) == 1
    });
    assert_eq!(client.log.closed()[0].1, CloseReason::Reset);
    sim.restart(ip);
    assert!(!sim.crashed(ip));
    assert_eq!(reborn.lock().unwrap().len(), 1, "the hook ran once");

    // The old backend stays dead; its handler hears nothing more.
    let old_events = server.log.len();
    assert!(matches!(
        server
            .b
            .open_listen_endpoint(EndpointAddress::new(ip, 0), ConnectionParams::default()),
        Err(OpenListenError::FailedOpenListenEndpoint { .. })
    ));
    // Same address, fresh state: the client connects to the new backend.
    let c2 = client
        .b
        .open_active_endpoint(addr, ConnectionParams::default())
        .unwrap();
    let new_log = reborn.lock().unwrap()[0].1.clone();
    run_until(&sim, "connected to the restarted host", || {
        cl.established().iter().any(|e| e.0 == c2) && !new_log.established().is_empty()
    });
    client.b.send_data_copy(c2, &[b"again"], &[], 1).unwrap();
    run_until(&sim, "delivered", || new_log.data().len() == 1);
    assert_eq!(new_log.data()[0].1, b"again");
    sim.run_until_idle(10_000);
    assert_eq!(server.log.len(), old_events, "the old life is silent");
}

#[test]
fn restarting_a_running_host_is_a_reboot() {
    let sim = Sim::with_seed(406);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.restart(server.host.ip());
    let cl = client.log.clone();
    run_until(&sim, "the reset", || cl.closed_count(c) == 1);
    assert_eq!(client.log.closed()[0].1, CloseReason::Reset);
    // Nobody listens in the new life (no hook): refused.
    client
        .b
        .open_active_endpoint(addr, ConnectionParams::default())
        .unwrap();
    run_until(&sim, "refused", || !cl.refused().is_empty());
}

fn one_port(sim: &Sim, ip: IpAddr) -> u16 {
    sim.set_connect_ports(ip, Some(50_000..=50_000));
    50_000
}

#[test]
fn two_connections_from_one_local_port_to_two_listeners_are_distinct() {
    let sim = Sim::with_seed(407);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let port = one_port(&sim, client.host.ip());
    let la = listen(&server, ConnectionParams::receive(64, 4));
    let lb = listen(&server, ConnectionParams::receive(64, 4));
    let (ca, sa) = connect(&sim, &server, &client, la, ConnectionParams::receive(64, 4));
    let (cb, sb) = connect(&sim, &server, &client, lb, ConnectionParams::receive(64, 4));
    assert_ne!(sa, sb);
    let remote_a = server.b.remote_address(sa).unwrap();
    let remote_b = server.b.remote_address(sb).unwrap();
    assert_eq!(remote_a, remote_b, "one local port: equal remote addresses");
    assert_eq!(remote_a.port(), port);
    assert_eq!(server.b.connection_to(remote_a).unwrap(), sa, "the oldest");
    client.b.send_data_copy(ca, &[b"to a"], &[], 1).unwrap();
    client.b.send_data_copy(cb, &[b"to b"], &[], 2).unwrap();
    let sl = server.log.clone();
    run_until(&sim, "both arrive", || sl.data().len() == 2);
    assert_eq!(server.log.data_from(sa), vec![b"to a".to_vec()]);
    assert_eq!(server.log.data_from(sb), vec![b"to b".to_vec()]);
    // Closing one leaves the other working.
    server.b.close_active_endpoint(sa).unwrap();
    let cl = client.log.clone();
    run_until(&sim, "a closed", || cl.closed_count(ca) == 1);
    assert_eq!(server.b.connection_to(remote_a).unwrap(), sb);
    server.b.send_data_copy(sb, &[b"still"], &[], 3).unwrap();
    run_until(&sim, "b still works", || cl.data_from(cb).len() == 1);
    assert_eq!(client.log.closed_count(cb), 0);
    assert_eq!(server.log.closed_count(sb), 0);
}

#[test]
fn a_port_whose_connection_to_that_remote_lives_is_not_reused() {
    let sim = Sim::with_seed(408);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    one_port(&sim, client.host.ip());
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    match client
        .b
        .open_active_endpoint(addr, ConnectionParams::default())
    {
        Err(OpenActiveError::NoResources { source, .. }) => {
            assert!(
                source.to_string().contains("no free local port"),
                "{source}"
            )
        }
        other => panic!("expected NoResources, got {other:?}"),
    }
    // Once it is closed, the port is free for that remote again.
    client.b.close_active_endpoint(c).unwrap();
    sim.run_until_idle(10_000);
    connect(&sim, &server, &client, addr, ConnectionParams::default());
}

#[test]
fn link_latency_still_applies_on_top_of_the_cards() {
    let sim = Sim::with_seed(409);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(Duration::from_millis(2), 0),
    );
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    let t0 = sim.now();
    client.b.send_data_copy(c, &[b"x"], &[], 1).unwrap();
    let sl = server.log.clone();
    run_until(&sim, "arrives", || sl.data().len() == 1);
    let took = sim.now() - t0;
    assert!(
        took >= Duration::from_millis(2) && took < Duration::from_micros(2_010),
        "{took:?}"
    );
}

#[test]
fn a_restart_resets_peers_still_connected_to_the_silently_crashed_life() {
    let sim = Sim::with_seed(410);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, ConnectionParams::receive(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    sim.crash_silently(server.host.ip());
    sim.run_for(Duration::from_secs(10));
    assert_eq!(client.log.closed_count(c), 0, "no word, no peer_timeout");
    sim.restart(server.host.ip());
    let cl = client.log.clone();
    run_until(&sim, "the reset", || cl.closed_count(c) == 1);
    assert_eq!(client.log.closed()[0].1, CloseReason::Reset);
}
