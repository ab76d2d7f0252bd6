//! A listener's limits: connections beyond
//! `LibfabricConfig::max_connections_per_listener` are refused (the
//! initiator sees `Refused`) and counted on the listening side; a
//! connection whose set-up does not finish within `handshake_timeout` is
//! refused as `Unreachable`.

mod common;

use std::net::TcpListener;
use std::time::Duration;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress, RefuseReason};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

#[test]
fn connections_beyond_the_listener_limit_are_refused_and_counted() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let server = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig {
            max_connections_per_listener: 2,
            ..LibfabricConfig::provider("tcp")
        },
        rec.clone(),
    )
    .unwrap();
    let crec = Recorder::new(0);
    let client = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("tcp"),
        crec.clone(),
    )
    .unwrap();
    let params = ConnectionParams::receive(64, 4);
    let listen = server
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .unwrap();
    let a = client.open_active_endpoint(listen, params.clone()).unwrap();
    let b = client.open_active_endpoint(listen, params.clone()).unwrap();
    assert!(
        wait_until(|| crec.count(|s| matches!(s, Seen::Established(..))) == 2),
        "two connections within the limit: {:?}",
        crec.seen()
    );
    let c = client.open_active_endpoint(listen, params.clone()).unwrap();
    assert!(
        wait_until(|| crec
            .seen()
            .contains(&Seen::Refused(c, RefuseReason::Refused))),
        "the third is refused: {:?}",
        crec.seen()
    );
    assert_eq!(
        server.refused_connections(),
        1,
        "and counted by the listener"
    );
    assert_eq!(
        rec.count(|s| matches!(s, Seen::Established(..))),
        2,
        "the server saw only the two it accepted"
    );
    // Room again after a close.
    client.close_active_endpoint(a).unwrap();
    assert!(wait_until(
        || rec.count(|s| matches!(s, Seen::Closed(..))) == 1
    ));
    let d = client.open_active_endpoint(listen, params).unwrap();
    assert!(
        wait_until(|| crec.seen().contains(&Seen::Established(d, listen))),
        "a new connection after a close: {:?}",
        crec.seen()
    );
    let _ = b;
}

#[test]
fn a_peer_that_never_answers_the_connection_request_is_refused_as_unreachable() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let client = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig {
            handshake_timeout: Duration::from_millis(300),
            ..LibfabricConfig::provider("tcp")
        },
        rec.clone(),
    )
    .unwrap();
    // A plain TCP listener: the kernel accepts, nobody answers.
    let mute = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = EndpointAddress::from(mute.local_addr().unwrap());
    let conn = client
        .open_active_endpoint(addr, ConnectionParams::receive(64, 4))
        .unwrap();
    assert!(
        wait_until(|| rec
            .seen()
            .contains(&Seen::Refused(conn, RefuseReason::Unreachable))),
        "refused as unreachable after the handshake timeout: {:?}",
        rec.seen()
    );
    drop(mute);
}
