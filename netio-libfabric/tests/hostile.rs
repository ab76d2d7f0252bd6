//! Hostile conditions reach the handler, or the caller, as clear reasons:
//! a refused connection, an unknown fabric provider, bad addresses, a peer
//! process that disappears. Never a panic or a hang.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, OpenActiveError,
    OpenListenError, RefuseReason,
};
use netio_libfabric::{EndpointType, LibfabricBackend, LibfabricConfig};

fn backend(running: &Running, provider: &str, rec: &Recorder) -> LibfabricBackend {
    LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider(provider),
        rec.clone(),
    )
    .expect("a libfabric backend")
}

fn params() -> ConnectionParams {
    ConnectionParams::receive(64, 4)
}

#[test]
fn connecting_to_a_refusing_address_is_reported_refused() {
    for provider in ["tcp", "sockets"] {
        let running = Running::start();
        let rec = Recorder::new(0);
        let b = backend(&running, provider, &rec);
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = EndpointAddress::from(probe.local_addr().unwrap());
        drop(probe);
        let conn = b.open_active_endpoint(addr, params()).unwrap();
        assert!(
            wait_until(|| !rec.seen().is_empty()),
            "{provider}: the attempt is answered"
        );
        assert_eq!(
            rec.seen(),
            vec![Seen::Refused(conn, RefuseReason::Refused)],
            "{provider}: refused, nothing else"
        );
    }
}

#[test]
fn an_unknown_fabric_provider_fails_clearly() {
    let running = Running::start();
    let rec = Recorder::new(0);
    // Choosing the endpoint type finds neither kind: creation fails.
    let e = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig::provider("no-such-provider"),
        rec.clone(),
    )
    .expect_err("a backend on an unknown fabric provider was created");
    let text = e.to_string();
    assert!(
        text.contains("no-such-provider") && text.contains("unknown provider name"),
        "the error names the provider and the likely cause: {text}"
    );
    // With connected endpoints asked for, each open fails.
    let b = LibfabricBackend::new(
        &running.lp,
        BackendConfig::default(),
        LibfabricConfig {
            endpoint: EndpointType::Msg,
            ..LibfabricConfig::provider("no-such-provider")
        },
        rec.clone(),
    )
    .expect("a backend with connected endpoints");
    let e = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params())
        .unwrap_err();
    assert!(
        matches!(e, OpenListenError::FailedOpenListenEndpoint { .. }),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(
        text.contains("no-such-provider") && text.contains("fi_getinfo"),
        "the error names the provider and the failing call: {text}"
    );
    let e = b
        .open_active_endpoint("127.0.0.1:9".parse().unwrap(), params())
        .unwrap_err();
    assert!(
        matches!(e, OpenActiveError::FailedOpenActiveEndpoint { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("no-such-provider"), "{e}");
    assert!(rec.seen().is_empty(), "nothing reported: {:?}", rec.seen());
}

#[test]
fn bad_addresses_fail_clearly() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let b = backend(&running, "tcp", &rec);
    for bad in [
        "0.0.0.0:5000",
        "127.0.0.1:0",
        "224.0.0.1:5000",
        "255.255.255.255:5000",
    ] {
        let e = b
            .open_active_endpoint(bad.parse().unwrap(), params())
            .unwrap_err();
        assert!(
            matches!(e, OpenActiveError::InvalidEndpointAddress { .. }),
            "connecting to {bad}: {e:?}"
        );
    }
    // An address of no local interface (TEST-NET-1): no fabric serves it.
    let e = b
        .open_listen_endpoint("192.0.2.1:0".parse().unwrap(), params())
        .unwrap_err();
    assert!(
        matches!(e, OpenListenError::FailedOpenListenEndpoint { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("192.0.2.1"), "{e}");
    assert!(rec.seen().is_empty(), "nothing reported: {:?}", rec.seen());
}

/// The peer process of `a_peer_process_that_disappears_closes_the_connection`:
/// connects to `NETIO_LF_PEER_OF`, says ping, and waits to be killed.
#[test]
#[ignore = "the peer process of a_peer_process_that_disappears_closes_the_connection"]
fn peer_process() {
    let addr: EndpointAddress = std::env::var("NETIO_LF_PEER_OF")
        .expect("run only as the child of a_peer_process_that_disappears_closes_the_connection")
        .parse()
        .unwrap();
    let running = Running::start();
    let rec = Recorder::new(1);
    rec.greet_port
        .store(addr.port(), std::sync::atomic::Ordering::SeqCst);
    let b = backend(&running, "tcp", &rec);
    b.open_active_endpoint(addr, params()).unwrap();
    // Killed by the parent long before this ends.
    std::thread::sleep(Duration::from_secs(30));
    panic!("the parent did not kill this peer process");
}

#[test]
fn a_peer_process_that_disappears_closes_the_connection() {
    let running = Running::start();
    let rec = Recorder::new(0);
    let b = backend(&running, "tcp", &rec);
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params())
        .unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "peer_process", "--ignored", "--test-threads=1"])
        .env("NETIO_LF_PEER_OF", listen.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting the peer process");
    let conn = wait_until(|| {
        rec.seen()
            .iter()
            .any(|s| matches!(s, Seen::Established(..)))
    });
    let established = rec.seen();
    if !conn {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the peer process connected: {established:?}");
    }
    // Its ping is answered, so the connection carries data both ways.
    std::thread::sleep(Duration::from_millis(200));
    child.kill().expect("killing the peer process");
    child.wait().expect("reaping the peer process");
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Closed(..))) == 1),
        "the connection of the killed peer is closed: {:?}",
        rec.seen()
    );
    let closed: Vec<_> = rec
        .seen()
        .into_iter()
        .filter(|s| matches!(s, Seen::Closed(..)))
        .collect();
    assert!(
        matches!(
            closed[0],
            Seen::Closed(_, CloseReason::PeerClosed | CloseReason::Reset)
        ),
        "closed as the peer's close or a reset: {closed:?}"
    );
    // The backend keeps working: a new connection establishes.
    let again = b.open_active_endpoint(listen, params()).unwrap();
    assert!(
        wait_until(|| rec.seen().contains(&Seen::Established(again, listen))),
        "a new connection after the peer vanished: {:?}",
        rec.seen()
    );
}
