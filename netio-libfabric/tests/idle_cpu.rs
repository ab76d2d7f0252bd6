//! In interrupt mode an idle libfabric backend sleeps: the listener's event
//! queue and the connection's completion and event queues wait in epoll
//! (after `fi_trywait`), so an idle second costs next to no CPU time.
//!
//! This file holds one test so that the process measured runs nothing else.
//! The bound, 5% of one core (50 ms of CPU time over one second), is safe:
//! a loop sleeping in epoll uses microseconds per second here, while a loop
//! that polls instead of sleeping (a missed `fi_trywait`, a fd that stays
//! ready) keeps a core busy, near 100%, twenty times the bound.

mod common;

use std::time::Duration;

use common::{process_cpu, wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

#[test]
fn an_idle_listener_and_connection_use_almost_no_cpu() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let b = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("tcp"),
        rec.clone(),
    )
    .expect("a libfabric backend");
    let params = ConnectionParams::receive(64, 8);
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .unwrap();
    let _conn = b.open_active_endpoint(listen, params).unwrap();
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Established(..))) == 2),
        "the connection is established on both sides: {:?}",
        rec.seen()
    );
    // Let the establishment's last events settle.
    std::thread::sleep(Duration::from_millis(200));
    let before = process_cpu();
    std::thread::sleep(Duration::from_secs(1));
    let used = process_cpu() - before;
    assert!(
        used < Duration::from_millis(50),
        "an idle second cost {used:?} of CPU time (bound 50 ms, 5% of a core): something \
         polls instead of sleeping in epoll"
    );
    assert_eq!(rec.count(|s| matches!(s, Seen::Closed(..))), 0);
}
