//! The reconnecting session on the simulator: a partition healed later, a
//! server that crashes and restarts, a listener that appears late, and the
//! high-water mark. Every message the client saw acknowledged was
//! delivered exactly once; none is delivered twice by one server; all
//! arrive in order.

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use netio_async::session::{Delivered, SessionClient, SessionConfig, SessionServer};
use netio_async::AsyncBackend;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress};
use netio_sim::{Sim, SimBackend};

type Client = Rc<SessionClient<SimBackend>>;

fn config() -> BackendConfig {
    BackendConfig {
        peer_timeout: Some(Duration::from_millis(200)),
        ..BackendConfig::default()
    }
}

struct World {
    sim: Sim,
    pool: LocalPool,
}

impl World {
    fn new(seed: u64) -> Self {
        Self {
            sim: Sim::with_seed(seed),
            pool: LocalPool::new(),
        }
    }

    fn spawn(&self, f: impl std::future::Future<Output = ()> + 'static) {
        self.pool.spawner().spawn_local(f).expect("spawn");
    }

    /// A session server listening at `ip`:7000; what it delivers.
    fn server(&self, ip: IpAddr) -> Delivered {
        let host = self.sim.host(ip);
        let b = Rc::new(AsyncBackend::new(|h| host.backend(config(), h)).unwrap());
        b.listen(
            EndpointAddress::new(ip, 7000),
            ConnectionParams::receive(256, 16),
        )
        .unwrap();
        let server = Rc::new(SessionServer::new(b));
        let delivered = server.delivered();
        self.spawn(async move { server.run().await });
        delivered
    }

    fn client(&self, server: IpAddr, session: SessionConfig) -> Client {
        let host = self.sim.next_host();
        let b = Rc::new(AsyncBackend::new(|h| host.backend(config(), h)).unwrap());
        let client = Rc::new(SessionClient::new(
            b,
            EndpointAddress::new(server, 7000),
            42,
            session,
        ));
        let c = client.clone();
        self.spawn(async move { c.run().await });
        client
    }

    /// Runs for `d` of virtual time, the tasks in between.
    fn run_for(&mut self, d: Duration) {
        let end = self.sim.now() + d;
        while self.sim.now() < end {
            self.pool.run_until_stalled();
            self.sim.run_for(Duration::from_micros(500));
        }
        self.pool.run_until_stalled();
    }

    fn run_until(&mut self, mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..100_000 {
            self.pool.run_until_stalled();
            if done() {
                return true;
            }
            self.sim.run_for(Duration::from_micros(500));
        }
        false
    }
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
    let mut w = World::new(21);
    let sip = w.sim.next_host().ip();
    let delivered = w.server(sip);
    let client = w.client(sip, SessionConfig::default());
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
    let mut w = World::new(22);
    let sip = w.sim.next_host().ip();
    let first = w.server(sip);
    let client = w.client(sip, SessionConfig::default());
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
    let second = w.server(sip);
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
    let mut w = World::new(23);
    let sip = w.sim.next_host().ip();
    let client = w.client(sip, SessionConfig::default());
    for i in 1..=50 {
        client.send(msg(i)).unwrap();
    }
    // Refused for a while.
    w.run_for(Duration::from_secs(1));
    assert_eq!(client.connects(), 0);
    assert_eq!(client.held(), 50);
    let delivered = w.server(sip);
    assert!(w.run_until(|| client.acknowledged() == 50));
    assert_eq!(seqs(&delivered.borrow()), (1..=50).collect::<Vec<_>>());
    assert_eq!(client.connects(), 1);
}

#[test]
fn the_high_water_mark_bounds_what_the_client_holds_and_counts_each_drop() {
    let mut w = World::new(24);
    let sip = w.sim.next_host().ip();
    let client = w.client(
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
    let delivered = w.server(sip);
    assert!(w.run_until(|| client.acknowledged() == 10));
    assert_eq!(seqs(&delivered.borrow()), (1..=10).collect::<Vec<_>>());
    assert_eq!(client.held(), 0);
}

#[test]
fn messages_delivered_whose_acknowledgements_were_lost_are_not_delivered_again() {
    let mut w = World::new(25);
    let sip = w.sim.next_host().ip();
    let delivered = w.server(sip);
    let client = w.client(sip, SessionConfig::default());
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
