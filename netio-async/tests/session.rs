//! The reconnecting session on the simulator: a partition healed later, a
//! server that crashes and restarts, a listener that appears late, and the
//! high-water mark. Every message the client saw acknowledged was
//! delivered exactly once; none is delivered twice by one server; all
//! arrive in order.

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use netio_async::session::{Delivered, SessionClient, SessionConfig, SessionServer};
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress};
use netio_sim::SimBackend;

mod common;
use common::World;

type Client = Rc<SessionClient<SimBackend>>;

fn config() -> BackendConfig {
    BackendConfig {
        peer_timeout: Some(Duration::from_millis(200)),
        ..BackendConfig::default()
    }
}

/// Virtual time between two rounds of the executor.
const STEP: Duration = Duration::from_micros(500);

/// A session server listening at `ip`:7000; what it delivers.
fn server(w: &World, ip: IpAddr) -> Delivered {
    let b = w.node_at(ip, config());
    b.listen(
        EndpointAddress::new(ip, 7000),
        ConnectionParams::receive(256, 16),
    )
    .unwrap();
    let server = Rc::new(SessionServer::new(b));
    let delivered = server.delivered();
    w.spawn(async move { server.run().await });
    delivered
}

fn client(w: &World, server: IpAddr, session: SessionConfig) -> Client {
    let (b, _) = w.node(config());
    let client = Rc::new(SessionClient::new(
        b,
        EndpointAddress::new(server, 7000),
        42,
        session,
    ));
    let c = client.clone();
    w.spawn(async move { c.run().await });
    client
}

fn msg(i: u64) -> Vec<u8> {
    i.to_le_bytes().to_vec()
}

fn seqs(d: &[(u64, Vec<u8>)]) -> Vec<u64> {
    d.iter()
        .map(|(id, m)| {
            assert_eq!(*id, 42, "the session keeps its identity");
            u64::from_le_bytes(m[..8].try_into().unwrap())
        })
        .collect()
}

#[test]
fn a_partition_healed_later_loses_and_repeats_nothing_and_needs_no_watchdog() {
    let mut w = World::new(21, STEP);
    let sip = w.sim.next_host().ip();
    let delivered = server(&w, sip);
    let client = client(&w, sip, SessionConfig::default());
    for i in 1..=30 {
        client.send(msg(i)).unwrap();
    }
    assert!(w.run_until(|| client.acknowledged() == 30));
    let cip = w.sim.hosts().into_iter().find(|h| *h != sip).unwrap();
    w.sim.partition(sip, cip);
    for i in 31..=100 {
        client.send(msg(i)).unwrap();
    }
    // Far longer than the peer timeout: the connection ends, the client
    // redials (in vain) with backoff.
    w.run_for(Duration::from_secs(3));
    assert!(client.acknowledged() < 100);
    w.sim.heal(sip, cip);
    assert!(
        w.run_until(|| client.acknowledged() == 100),
        "acked {}",
        client.acknowledged()
    );
    assert_eq!(seqs(&delivered.borrow()), (1..=100).collect::<Vec<_>>());
    assert!(client.connects() >= 2, "reconnected after the partition");
    assert_eq!(client.held(), 0);
}

#[test]
fn a_server_that_crashes_and_restarts_gets_the_rest_and_nothing_acknowledged_again() {
    let mut w = World::new(22, STEP);
    let sip = w.sim.next_host().ip();
    let first = server(&w, sip);
    let client = client(&w, sip, SessionConfig::default());
    for i in 1..=40 {
        client.send(msg(i)).unwrap();
    }
    assert!(w.run_until(|| client.acknowledged() >= 20));
    w.sim.crash(sip);
    let acked_at_crash = client.acknowledged();
    for i in 41..=80 {
        client.send(msg(i)).unwrap();
    }
    // Down for a while: the client's attempts are refused, it backs off.
    w.run_for(Duration::from_secs(2));
    assert_eq!(client.acknowledged(), acked_at_crash);
    w.sim.restart(sip);
    let second = server(&w, sip);
    assert!(
        w.run_until(|| client.acknowledged() == 80),
        "acked {}",
        client.acknowledged()
    );

    let old = seqs(&first.borrow());
    let new = seqs(&second.borrow());
    assert_eq!(
        old,
        (1..=old.len() as u64).collect::<Vec<_>>(),
        "in order, once"
    );
    assert!(old.len() as u64 >= acked_at_crash);
    assert_eq!(
        new,
        (acked_at_crash + 1..=80).collect::<Vec<_>>(),
        "the restarted server gets exactly what was not acknowledged, in order"
    );
    assert!(client.connects() >= 2);
}

#[test]
fn a_listener_that_appears_late_gets_everything_once() {
    let mut w = World::new(23, STEP);
    let sip = w.sim.next_host().ip();
    let client = client(&w, sip, SessionConfig::default());
    for i in 1..=50 {
        client.send(msg(i)).unwrap();
    }
    // Refused for a while.
    w.run_for(Duration::from_secs(1));
    assert_eq!(client.connects(), 0);
    assert_eq!(client.held(), 50);
    let delivered = server(&w, sip);
    assert!(w.run_until(|| client.acknowledged() == 50));
    assert_eq!(seqs(&delivered.borrow()), (1..=50).collect::<Vec<_>>());
    assert_eq!(client.connects(), 1);
}

#[test]
fn the_high_water_mark_bounds_what_the_client_holds_and_counts_each_drop() {
    let mut w = World::new(24, STEP);
    let sip = w.sim.next_host().ip();
    let client = client(
        &w,
        sip,
        SessionConfig {
            high_water: 10,
            ..SessionConfig::default()
        },
    );
    let mut handed_back = 0;
    for i in 1..=25 {
        if let Err(m) = client.send(msg(i)) {
            assert_eq!(m, msg(i), "the dropped message is handed back");
            handed_back += 1;
        }
    }
    w.run_for(Duration::from_millis(100));
    assert_eq!(handed_back, 15);
    assert_eq!(client.dropped(), 15);
    assert_eq!(client.held(), 10);
    let delivered = server(&w, sip);
    assert!(w.run_until(|| client.acknowledged() == 10));
    assert_eq!(seqs(&delivered.borrow()), (1..=10).collect::<Vec<_>>());
    assert_eq!(client.held(), 0);
}

#[test]
fn messages_delivered_whose_acknowledgements_were_lost_are_not_delivered_again() {
    let mut w = World::new(25, STEP);
    let sip = w.sim.next_host().ip();
    let delivered = server(&w, sip);
    let client = client(&w, sip, SessionConfig::default());
    let cip = w.sim.hosts().into_iter().find(|h| *h != sip).unwrap();
    w.sim.set_link(
        sip,
        cip,
        netio_sim::LinkConfig::new(Duration::from_millis(5), 0),
    );
    assert!(w.run_until(|| client.connects() == 1));
    for i in 1..=20 {
        client.send(msg(i)).unwrap();
    }
    // Delivered, the acknowledgements still on their way back: cut.
    assert!(w.run_until(|| delivered.borrow().len() == 20));
    w.sim.partition(sip, cip);
    assert!(
        client.acknowledged() < 20,
        "acknowledgements still in flight"
    );
    w.run_for(Duration::from_secs(2));
    w.sim.heal(sip, cip);
    assert!(w.run_until(|| client.acknowledged() == 20 && client.connects() >= 2));
    w.run_for(Duration::from_millis(100));
    assert_eq!(
        seqs(&delivered.borrow()),
        (1..=20).collect::<Vec<_>>(),
        "the answer to the new hello says the server has them: none is delivered twice"
    );
}
