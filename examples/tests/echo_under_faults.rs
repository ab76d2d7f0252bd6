//! Testing an application on the simulator, with faults: the echo client and
//! server from `netio_examples` run unchanged on virtual hosts while the
//! network misbehaves.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_examples::{EchoClient, EchoReport, EchoServer};
use netio_sim::{Sim, SimHost};

struct World {
    sim: Sim,
    server: SimHost,
    client: SimHost,
    report: Arc<Mutex<EchoReport>>,
}

/// Starts an echo server with `server_bufs` receive buffers per connection
/// and a client that will send `count` messages.
fn start(seed: u64, count: u64, server_bufs: usize) -> World {
    let sim = Sim::with_seed(seed);
    let (server, client) = (sim.next_host(), sim.next_host());
    let params = ConnectionParams::receive(256, 8).with_buffered(256, 8);
    let sb = server
        .backend(BackendConfig::default(), EchoServer::default())
        .unwrap();
    let server_params = ConnectionParams::receive(256, server_bufs).with_buffered(256, 8);
    let listen = sb
        .open_listen_endpoint(EndpointAddress::new(server.ip(), 0), server_params)
        .unwrap();
    let report = Arc::new(Mutex::new(EchoReport::default()));
    let cb = client
        .backend(
            BackendConfig::default(),
            EchoClient::new(count, report.clone(), || {}),
        )
        .unwrap();
    cb.open_active_endpoint(listen, params).unwrap();
    World {
        sim,
        server,
        client,
        report,
    }
}

fn done(r: &Arc<Mutex<EchoReport>>) -> impl FnMut() -> bool + '_ {
    move || {
        let r = r.lock().unwrap();
        r.closed.is_some() || r.refused.is_some()
    }
}

#[test]
fn echo_completes_across_a_partition_that_heals() {
    let w = start(1, 200, 8);
    let r = w.report.clone();
    assert!(w
        .sim
        .run_until(Duration::from_secs(1), || r.lock().unwrap().matched >= 50));
    w.sim.partition(w.server.ip(), w.client.ip());
    w.sim.run_for(Duration::from_secs(30));
    let stalled = w.report.lock().unwrap().matched;
    assert!(stalled < 200, "nothing crosses a partition");
    w.sim.heal(w.server.ip(), w.client.ip());
    assert!(w.sim.run_until(Duration::from_secs(120), done(&w.report)));
    let r = w.report.lock().unwrap();
    assert_eq!((r.matched, r.mismatched), (200, 0), "{r:?}");
    assert_eq!(r.closed.as_deref(), Some("closed locally"));
}

#[test]
fn echo_completes_with_a_slow_server() {
    // One receive buffer, busy 5 ms after each message: the client, which
    // sends the next message only after the echo, still gets every echo.
    let w = start(2, 100, 1);
    w.sim.slow_receiver(w.server.ip(), Duration::from_millis(5));
    assert!(w.sim.run_until(Duration::from_secs(120), done(&w.report)));
    let r = w.report.lock().unwrap();
    assert_eq!((r.matched, r.mismatched), (100, 0), "{r:?}");
    let now = w.sim.now();
    assert!(
        now >= Duration::from_millis(99 * 5),
        "99 waits of 5 ms, took {now:?}"
    );
}

#[test]
fn client_hears_of_a_server_crash() {
    let w = start(3, 1_000_000, 8);
    let r = w.report.clone();
    assert!(w
        .sim
        .run_until(Duration::from_secs(1), || r.lock().unwrap().matched >= 10));
    w.sim.crash(w.server.ip());
    assert!(w.sim.run_until(Duration::from_secs(120), done(&w.report)));
    let r = w.report.lock().unwrap();
    assert_eq!(r.mismatched, 0);
    assert_eq!(r.closed.as_deref(), Some("connection reset"), "{r:?}");
}

#[test]
fn client_hears_of_a_refusing_server() {
    let sim = Sim::with_seed(4);
    let (server, client) = (sim.next_host(), sim.next_host());
    sim.refuse_connections(server.ip(), true);
    let report = Arc::new(Mutex::new(EchoReport::default()));
    let cb = client
        .backend(
            BackendConfig::default(),
            EchoClient::new(10, report.clone(), || {}),
        )
        .unwrap();
    cb.open_active_endpoint(
        EndpointAddress::new(server.ip(), 7000),
        ConnectionParams::receive(64, 2),
    )
    .unwrap();
    assert!(sim.run_until(Duration::from_secs(60), done(&report)));
    assert_eq!(
        report.lock().unwrap().refused.as_deref(),
        Some("connection refused")
    );
}
