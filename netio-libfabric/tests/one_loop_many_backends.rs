//! One `MioLoop` serves a netio-tcp backend and a libfabric backend at
//! once: both answer pings over their own connections while the other one
//! is busy too.

mod common;

use std::sync::atomic::Ordering;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress, Provider};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};
use netio_tcp::TcpProvider;

const PINGS: usize = 200;

#[test]
fn a_tcp_backend_and_a_libfabric_backend_share_one_loop_and_both_serve_traffic() {
    let running = Running::start();
    let tcp_rec = Recorder::new(PINGS);
    let lf_rec = Recorder::new(PINGS);
    let tcp = TcpProvider::create(&running.lp, BackendConfig::default(), tcp_rec.clone())
        .expect("a TCP backend");
    let lf = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("tcp"),
        lf_rec.clone(),
    )
    .expect("a libfabric backend");
    let params = ConnectionParams::receive(64, 16);
    let any: EndpointAddress = "127.0.0.1:0".parse().unwrap();
    let tcp_listen = tcp.open_listen_endpoint(any, params.clone()).unwrap();
    let lf_listen = lf.open_listen_endpoint(any, params.clone()).unwrap();
    tcp_rec
        .greet_port
        .store(tcp_listen.port(), Ordering::SeqCst);
    lf_rec.greet_port.store(lf_listen.port(), Ordering::SeqCst);
    // Both start pinging as soon as they are established, so their traffic
    // overlaps on the loop.
    let tcp_conn = tcp
        .open_active_endpoint(tcp_listen, params.clone())
        .unwrap();
    let lf_conn = lf.open_active_endpoint(lf_listen, params).unwrap();
    let pongs = |r: &Recorder, c| r.count(|s| *s == Seen::Pong(c));
    assert!(
        wait_until(|| pongs(&tcp_rec, tcp_conn) == PINGS && pongs(&lf_rec, lf_conn) == PINGS),
        "every ping answered on both backends: tcp {} of {PINGS} ({:?}), libfabric {} of {PINGS} ({:?})",
        pongs(&tcp_rec, tcp_conn),
        tcp_rec.seen().iter().find(|s| !matches!(s, Seen::Pong(_))),
        pongs(&lf_rec, lf_conn),
        lf_rec.seen().iter().find(|s| !matches!(s, Seen::Pong(_))),
    );
    for r in [&tcp_rec, &lf_rec] {
        assert_eq!(
            r.count(|s| matches!(s, Seen::Established(..))),
            2,
            "both sides of each backend's connection established"
        );
        assert_eq!(
            r.count(|s| matches!(s, Seen::Closed(..))),
            0,
            "nothing closed"
        );
    }
}
