//! A peer that breaks the connection while the backend writes must not
//! kill a process that keeps SIGPIPE's default action. In a test binary of
//! its own, since it restores that default for the whole process.

mod common;

use std::net::Shutdown;

use common::{raw, wait_until, Ev, Running, Side};
use netio_core::{Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress};

#[test]
fn a_peer_that_shuts_down_then_resets_raises_no_sigpipe() {
    // As in a process that has not ignored SIGPIPE (the Rust runtime
    // ignores it; C programs, and Rust ones built otherwise, do not): a
    // write that fails with EPIPE would kill the process.
    // SAFETY: setting a signal's disposition to its default installs no
    // handler code; nothing else in this test binary handles SIGPIPE.
    let previous = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    assert_ne!(previous, libc::SIG_ERR);

    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let params = ConnectionParams::receive(1024, 4);
    let (listen, good) = common::connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params.clone(),
        params,
    );
    for round in 0..3u64 {
        let raw = raw::connect_with_handshake(listen, 1024);
        let remote = EndpointAddress::from(raw.local_addr().unwrap());
        assert!(wait_until(
            || server.has(|e| matches!(e, Ev::Established(r, _) if *r == remote))
        ));
        // On the loop thread, so the backend notices nothing before it
        // writes: the peer ends its sending direction (the backend's socket
        // goes to CLOSE_WAIT), then resets (the error waiting on the socket
        // is then EPIPE, the one that raises SIGPIPE); then the backend
        // sends.
        let b = server.b.clone();
        let conn = server.conn(remote);
        let key = 10 + round;
        let sent = rt.on_loop(move || {
            raw.shutdown(Shutdown::Write).unwrap();
            raw::reset(raw);
            b.send_data_copy(conn, &[b"into a broken pipe"], &[], key)
        });
        sent.expect("the send is accepted");
        assert!(
            wait_until(|| server.has(|e| matches!(
                e,
                Ev::Closed(r, CloseReason::Reset | CloseReason::PeerClosed, _) if *r == remote
            ))),
            "{:?}",
            server.events()
        );
        // The send ended once: completed, or cancelled with the close.
        let ended = server
            .events()
            .iter()
            .filter(|e| match e {
                Ev::Completed(r, k) => *r == remote && *k == key,
                Ev::Closed(r, _, keys) => *r == remote && keys.contains(&key),
                _ => false,
            })
            .count();
        assert_eq!(ended, 1, "{:?}", server.events());
    }
    // And the well-behaved connection still works.
    client
        .b
        .send_data_copy(client.conn(listen), &[b"ping"], &[], 1)
        .unwrap();
    assert!(wait_until(
        || server.has(|e| *e == Ev::Data(good, b"ping".to_vec()))
    ));
    assert!(rt.lp.is_running(), "no callback panicked out of the loop");
}
