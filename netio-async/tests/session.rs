//! The reconnecting session on the simulator: a partition healed later, a
//! server that crashes and restarts, a listener that appears late, the
//! high-water mark and the gaps it leaves, and messages from the server to
//! clients that dial in (one copy shared by every subscriber). Every
//! message the sender saw acknowledged was delivered exactly once; none is
//! delivered twice by one receiver; all arrive in order.

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use netio_async::session::{Received, SessionClient, SessionConfig, SessionServer};
use netio_async::AsyncBackend;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress};
use netio_sim::SimBackend;

mod common;
use common::World;

type Client = Arc<SessionClient<SimBackend>>;

/// What a server's application read, in order: `(session id, item)`.
type Delivered = Rc<RefCell<Vec<(u64, Received)>>>;

fn config() -> BackendConfig {
    BackendConfig {
        peer_timeout: Some(Duration::from_millis(200)),
        ..BackendConfig::default()
    }
}

/// Virtual time between two rounds of the executor.
const STEP: Duration = Duration::from_micros(500);

/// A session server listening at `ip`:7000, and an application reading
/// everything it receives.
fn server_with(
    w: &World,
    ip: IpAddr,
    session: &SessionConfig,
) -> (Arc<SessionServer<SimBackend>>, Delivered) {
    let b = backend_at(w, ip);
    b.listen(
        EndpointAddress::new(ip, 7000),
        ConnectionParams::receive(256, 16),
    )
    .unwrap();
    let server = Arc::new(SessionServer::with_config(b.clone(), session));
    let delivered = Delivered::default();
    // The session runs as a task on its backend's loop; the application
    // reading it on the test's executor.
    let s = server.clone();
    b.spawn(async move { s.run().await }).detach();
    let (s, d) = (server.clone(), delivered.clone());
    w.spawn(async move {
        loop {
            let item = s.recv().await;
            d.borrow_mut().push(item);
        }
    });
    (server, delivered)
}

fn server(w: &World, ip: IpAddr) -> Delivered {
    server_with(w, ip, &SessionConfig::default()).1
}

/// An async backend on the host at `ip` (created or restarted), shared
/// with the session's task.
fn backend_at(w: &World, ip: IpAddr) -> Arc<AsyncBackend<SimBackend>> {
    let host = w.sim.host(ip);
    Arc::new(AsyncBackend::new(|h| host.backend(config(), h)).expect("backend"))
}

/// A session client with identity `id`, run as a task on its backend's
/// loop.
fn session_client(w: &World, server: IpAddr, id: u64, session: SessionConfig) -> Client {
    let b = backend_at(w, w.sim.next_host().ip());
    let client = Arc::new(SessionClient::new(
        b.clone(),
        EndpointAddress::new(server, 7000),
        id,
        session,
    ));
    let c = client.clone();
    b.spawn(async move { c.run().await }).detach();
    client
}

fn client(w: &World, server: IpAddr, session: SessionConfig) -> Client {
    session_client(w, server, 42, session)
}

fn msg(i: u64) -> Vec<u8> {
    i.to_le_bytes().to_vec()
}

/// The payload numbers of the messages read (gaps are not messages).
fn seqs(d: &[(u64, Received)]) -> Vec<u64> {
    d.iter()
        .filter_map(|(id, r)| {
            assert_eq!(*id, 42, "the session keeps its identity");
            match r {
                Received::Message { data, .. } => {
                    Some(u64::from_le_bytes(data[..8].try_into().unwrap()))
                }
                Received::Gap { .. } => None,
            }
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
    // The dropped messages took their numbers: acknowledged as a gap.
    assert!(w.run_until(|| client.acknowledged() == 25));
    assert_eq!(seqs(&delivered.borrow()), (1..=10).collect::<Vec<_>>());
    assert_eq!(
        delivered.borrow().last(),
        Some(&(
            42,
            Received::Gap {
                first: 11,
                last: 25
            }
        )),
        "the server sees where the dropped messages were"
    );
    assert_eq!(client.held(), 0);
    // After the gap, the numbering goes on.
    assert_eq!(client.send(msg(26)), Ok(26));
    assert!(w.run_until(|| client.acknowledged() == 26));
    assert_eq!(
        seqs(&delivered.borrow()),
        [(1..=10).collect(), vec![26]].concat()
    );
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

/// A client session with identity `id`, and an application reading what
/// the server sends it.
fn subscriber(w: &World, server: IpAddr, id: u64) -> (Client, Rc<RefCell<Vec<Received>>>) {
    let client = session_client(w, server, id, SessionConfig::default());
    let got = Rc::new(RefCell::new(Vec::new()));
    let (c, g) = (client.clone(), got.clone());
    w.spawn(async move {
        loop {
            let item = c.recv().await;
            g.borrow_mut().push(item);
        }
    });
    (client, got)
}

fn payloads(got: &[Received]) -> Vec<u64> {
    got.iter()
        .filter_map(|r| match r {
            Received::Message { data, .. } => {
                Some(u64::from_le_bytes(data[..8].try_into().unwrap()))
            }
            Received::Gap { .. } => None,
        })
        .collect()
}

#[test]
fn a_server_sends_to_a_client_that_dialed_in_once_each_in_order_across_a_partition() {
    let mut w = World::new(26, STEP);
    let sip = w.sim.next_host().ip();
    let (server, _) = server_with(&w, sip, &SessionConfig::default());
    let (client, got) = subscriber(&w, sip, 7);
    assert!(w.run_until(|| server.sessions() == vec![7]));
    for i in 1..=30 {
        assert_eq!(server.send_to(7, msg(i)), Some(Ok(i)));
    }
    assert!(w.run_until(|| got.borrow().len() >= 10));
    let cip = w.sim.hosts().into_iter().find(|h| *h != sip).unwrap();
    w.sim.partition(sip, cip);
    for i in 31..=60 {
        assert_eq!(server.send_to(7, msg(i)), Some(Ok(i)));
    }
    w.run_for(Duration::from_secs(1));
    w.sim.heal(sip, cip);
    assert!(
        w.run_until(|| got.borrow().len() == 60 && server.held(7) == Some(0)),
        "got {}",
        got.borrow().len()
    );
    assert_eq!(payloads(&got.borrow()), (1..=60).collect::<Vec<_>>());
    assert!(client.connects() >= 2, "the partition broke the connection");
    assert_eq!(server.send_to(8, msg(0)), None, "no such session");
}

#[test]
fn a_published_message_is_held_once_for_every_subscriber_until_each_acknowledged_it() {
    let mut w = World::new(27, STEP);
    let sip = w.sim.next_host().ip();
    let (server, _) = server_with(&w, sip, &SessionConfig::default());
    let subs: Vec<_> = (1..=3).map(|id| subscriber(&w, sip, id)).collect();
    assert!(w.run_until(|| server.sessions().len() == 3));
    let m: Arc<[u8]> = Arc::from(msg(1));
    assert_eq!(server.publish(Arc::clone(&m)), 3);
    assert_eq!(Arc::strong_count(&m), 4, "one copy, held for each session");
    assert!(w.run_until(|| subs.iter().all(|(_, g)| g.borrow().len() == 1)));
    assert!(w.run_until(|| (1..=3).all(|id| server.held(id) == Some(0))));
    assert_eq!(Arc::strong_count(&m), 1, "acknowledged: no longer held");
    for (_, got) in &subs {
        assert_eq!(payloads(&got.borrow()), vec![1]);
    }
}

#[test]
fn a_subscriber_away_past_the_mark_sees_a_gap_where_messages_were_dropped() {
    let mut w = World::new(28, STEP);
    let sip = w.sim.next_host().ip();
    let (server, _) = server_with(
        &w,
        sip,
        &SessionConfig {
            high_water: 5,
            ..SessionConfig::default()
        },
    );
    let (_client, got) = subscriber(&w, sip, 9);
    assert!(w.run_until(|| server.sessions() == vec![9]));
    let cip = w.sim.hosts().into_iter().find(|h| *h != sip).unwrap();
    w.sim.partition(sip, cip);
    let taken = (1..=12).filter(|&i| server.publish(msg(i)) == 1).count();
    assert_eq!(taken, 5);
    assert_eq!(server.held(9), Some(5));
    assert_eq!(server.dropped(9), Some(7));
    w.run_for(Duration::from_secs(1));
    w.sim.heal(sip, cip);
    assert!(w.run_until(|| got.borrow().len() == 6 && server.held(9) == Some(0)));
    assert_eq!(server.publish(msg(13)), 1, "room again once acknowledged");
    assert!(w.run_until(|| got.borrow().len() == 7));
    let got = got.borrow();
    assert_eq!(payloads(&got[..5]), (1..=5).collect::<Vec<_>>());
    assert_eq!(got[5], Received::Gap { first: 6, last: 12 });
    assert!(matches!(&got[6], Received::Message { seq: 13, .. }));
}
