//! What idle connections cost: an accepted connection whose peer sent its
//! handshake and nothing more holds no read buffer (it comes with the
//! first bytes after the handshake), and on the listener's shared receive
//! pool no buffer at all. A test binary of its own: it holds thousands of
//! descriptors and reads the process's resident memory.

mod common;

use std::io::Write;

use common::raw::{self, require_fd_limit};
use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_tcp::wire::HANDSHAKE_LEN;
use netio_tcp::TcpConfig;

/// Idle connections.
const IDLE: usize = 2000;

#[test]
fn idle_connections_on_a_shared_pool_hold_no_read_buffer() {
    let needed = (2 * IDLE + 256) as u64;
    require_fd_limit(needed);
    let rt = Running::start();
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        // The default 64 KiB read buffer: 125 MiB for 2,000 connections if
        // each had one.
        TcpConfig::default(),
        Recorder::default(),
    );
    let addr = server
        .b
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64 << 10, 16).with_shared_receive(),
        )
        .unwrap();
    let rss_before = common::rss_kib();
    let mut socks: Vec<_> = (0..IDLE)
        .map(|_| raw::connect_with_handshake(addr, 1 << 16))
        .collect();
    for s in &mut socks {
        assert_eq!(raw::read_n(s, HANDSHAKE_LEN).len(), HANDSHAKE_LEN);
    }
    let established = || server.count(|e| matches!(e, Ev::Established(..)));
    assert!(wait_until(|| established() == IDLE), "{}", established());
    let grown = common::rss_kib().saturating_sub(rss_before);
    eprintln!(
        "{IDLE} idle connections: RSS grew {grown} KiB ({} KiB each, both ends)",
        grown / IDLE as u64
    );
    // The shared pool (16 x 64 KiB, untouched), the connection table and
    // the events the recorder keeps: about 2 KiB a connection. With a
    // 64 KiB read buffer each it was 9 KiB a connection here (on this
    // loop thread's allocator arena most of a fresh buffer stays
    // untouched) and 48 KiB in a server whose loop runs on the main
    // thread (`echo_tcp`, where the allocator zeroes each buffer).
    assert!(grown < 10 * 1024, "RSS grew {grown} KiB");
    // Every connection still works: a message gets its read buffer.
    socks[7].write_all(&raw::data_frame(b"awake")).unwrap();
    assert!(wait_until(|| server.data() == [b"awake".to_vec()]));
    drop(socks);
    assert!(wait_until(
        || server.count(|e| matches!(e, Ev::Closed(..))) == IDLE
    ));
}
