//! Busy polling (`LibfabricConfig::max_poll`, on a busy-polling `MioLoop`)
//! carries traffic like interrupt mode does.

mod common;

use std::sync::atomic::Ordering;

use common::{wait_until, Recorder, Seen};
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{Backend, BackendConfig, ConnectionParams, EventLoop};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

const PINGS: usize = 200;

#[test]
fn pings_are_answered_with_busy_polling() {
    let lp = MioLoop::with_config(LoopConfig {
        busy_poll: true,
        ..LoopConfig::default()
    })
    .unwrap();
    let runner = lp.clone();
    let thread = std::thread::spawn(move || runner.run(|| {}));
    let rec = Recorder::new(PINGS);
    let lf = LibfabricConfig {
        max_poll: 100,
        ..LibfabricConfig::provider("tcp")
    };
    let b = LibfabricBackend::new(&lp, BackendConfig::default(), lf, rec.clone()).unwrap();
    let params = ConnectionParams::receive(64, 16);
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .unwrap();
    rec.greet_port.store(listen.port(), Ordering::SeqCst);
    let conn = b.open_active_endpoint(listen, params).unwrap();
    let ok = wait_until(|| rec.count(|s| *s == Seen::Pong(conn)) == PINGS);
    lp.stop();
    thread.join().unwrap();
    assert!(
        ok,
        "every ping answered: {} of {PINGS}",
        rec.count(|s| *s == Seen::Pong(conn))
    );
}
