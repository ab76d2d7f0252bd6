//! A paused connection with the peer's messages waiting does not spin: the
//! provider cannot take those messages while no receive buffer is posted,
//! so its completion queue's fd stays ready; the backend must not keep
//! reading the queue then, but wait until a buffer is posted again.
//!
//! One test in this file, so that the process measured runs nothing else
//! (the bound is explained in `idle_cpu.rs`: a spinning loop costs near a
//! whole core, twenty times the bound). A backend that read the queue in a
//! loop while starved also made the benchmark tool's message rate collapse
//! (6 k/s instead of about 200 k/s) and the suite time out under load.

mod common;

use std::time::Duration;

use common::{process_cpu, wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

const PINGS: usize = 100;

#[test]
fn a_paused_connection_with_messages_waiting_uses_almost_no_cpu() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let b = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("tcp"),
        rec.clone(),
    )
    .expect("a libfabric backend");
    let params = ConnectionParams::receive(64, 4);
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .unwrap();
    let conn = b.open_active_endpoint(listen, params).unwrap();
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Established(..))) == 2),
        "the connection is established on both sides: {:?}",
        rec.seen()
    );
    let accepted = rec
        .seen()
        .iter()
        .find_map(|s| match s {
            Seen::Established(c, _) if *c != conn => Some(*c),
            _ => None,
        })
        .expect("the accepted side");
    b.pause_receive(accepted).unwrap();
    for i in 0..PINGS {
        b.send_data_copy(conn, &[b"ping"], &[], i as u64)
            .expect("a ping is accepted");
    }
    // The pings fill the 4 posted buffers; the rest wait in the transport.
    std::thread::sleep(Duration::from_millis(200));
    let before = process_cpu();
    std::thread::sleep(Duration::from_secs(1));
    let used = process_cpu() - before;
    assert!(
        used < Duration::from_millis(50),
        "a paused second with messages waiting cost {used:?} of CPU time (bound 50 ms, 5% of \
         a core): the completion queue is read in a loop"
    );
    assert_eq!(
        rec.count(|s| matches!(s, Seen::Pong(_))),
        0,
        "nothing delivered while paused"
    );
    b.resume_receive(accepted).unwrap();
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Pong(_))) == PINGS),
        "after the resume every ping is answered: {} pongs",
        rec.count(|s| matches!(s, Seen::Pong(_)))
    );
}
