//! No memory registration on the per-message path: once a connection has
//! sent a message of each size, further copy sends (small and large) and
//! zero-copy sends with a header reuse registered memory: they register at
//! most the pool slots a full send queue needs, however many are sent.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::{listener_and_connector, wait_until, LastConn, Running, Tracked};
use netio_core::{
    Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, EndpointAddress, Handler,
    MemoryRegion, RegionSlice, SendError,
};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

#[derive(Clone, Default)]
struct Count {
    established: Arc<AtomicU64>,
    completed: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl Handler<LibfabricBackend> for Count {
    fn on_connection_established(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        _caps: Capabilities,
    ) {
        self.established.fetch_add(1, Ordering::SeqCst);
    }

    fn on_data(&mut self, _b: &LibfabricBackend, _c: ConnId, _d: &[u8]) {
        self.received.fetch_add(1, Ordering::SeqCst);
    }

    fn on_sends_completed(&mut self, _b: &LibfabricBackend, _c: ConnId, keys: &[u64]) {
        self.completed
            .fetch_add(keys.len() as u64, Ordering::SeqCst);
    }
}

/// Sends `n` messages with `send`, retrying while the queue is full, and
/// waits for their completions and deliveries.
fn send_all(count: &Count, n: u64, mut send: impl FnMut(u64) -> Result<(), SendError>) {
    let (c0, r0) = (
        count.completed.load(Ordering::SeqCst),
        count.received.load(Ordering::SeqCst),
    );
    let mut i = 0;
    while i < n {
        match send(i) {
            Ok(()) => i += 1,
            Err(SendError::NoResources) => std::thread::yield_now(),
            Err(e) => panic!("send {i}: {e}"),
        }
    }
    assert!(
        wait_until(|| count.completed.load(Ordering::SeqCst) == c0 + n
            && count.received.load(Ordering::SeqCst) == r0 + n),
        "{n} sends completed and delivered: {} completed, {} received",
        count.completed.load(Ordering::SeqCst) - c0,
        count.received.load(Ordering::SeqCst) - r0
    );
}

#[test]
fn copy_and_zero_copy_sends_register_no_memory_once_warmed_up() {
    for provider in ["tcp", "sockets"] {
        let running = Running::start();
        let count = Count::default();
        let b = LibfabricBackend::new(
            &running.lp,
            BackendConfig::default(),
            LibfabricConfig::provider(provider),
            count.clone(),
        )
        .expect("a libfabric backend");
        let region = MemoryRegion::new(1 << 20);
        let listen = b
            .open_listen_endpoint(
                "127.0.0.1:0".parse().unwrap(),
                ConnectionParams::receive(128 * 1024, 16),
            )
            .unwrap();
        let conn = b
            .open_active_endpoint(
                listen,
                ConnectionParams::default().with_zero_copy(region.clone()),
            )
            .unwrap();
        assert!(wait_until(|| count.established.load(Ordering::SeqCst) == 2));
        let small = [7u8; 64];
        let large = vec![9u8; 100 * 1024];
        let slice: RegionSlice = region.slice(0, 4096).unwrap();
        let round = |n: u64| {
            send_all(&count, n, |k| b.send_data_copy(conn, &[&small], &[], k));
            send_all(&count, n, |k| b.send_data_copy(conn, &[&large], b"head", k));
            send_all(&count, n, |k| b.send_data(conn, &[slice], b"header", k));
        };
        // Warm-up. How many sends are in flight at once depends on timing;
        // the pool keeps a registered slot for each, so a later round with
        // more in flight than any before registers one slot per extra
        // send, up to the send queue's depth (256 large-message slots; the
        // small class registers a 64 KiB chunk of 256 slots at a time).
        // A registration per send would add at least 4,000 here.
        round(2000);
        let warmed = b.memory_registrations();
        round(2000);
        let after = b.memory_registrations();
        let depth = BackendConfig::default().send_queue_depth as u64;
        // One slot per large send in flight, and two chunks of small slots
        // (copies and zero-copy headers) at most.
        let bound = depth + 2;
        assert!(
            after - warmed <= bound,
            "{provider}: 6000 sends after warm-up registered memory {} times, more than \
             a full send queue ({depth} sends) could ever need ({bound})",
            after - warmed
        );
    }
}

/// On `sockets`, which copies an injected send during the call, small
/// copy sends go out by injection from both ends of a connection, the
/// accepting one too: neither registers memory for them, not even a
/// first bounce buffer. (The entry of an accepted connection's request
/// names no provider; the injection limit comes from the domain's.)
#[test]
fn on_sockets_small_copy_sends_register_no_memory_on_the_accepting_side_either() {
    let (server_loop, client_loop) = (Running::start(), Running::start());
    let (server_side, client_side) = (Count::default(), Count::default());
    let (server_last, client_last) = (LastConn::default(), LastConn::default());
    let params = ConnectionParams::receive(256, 16);
    let (server, client) = listener_and_connector(
        &server_loop.lp,
        &client_loop.lp,
        LibfabricConfig::provider("sockets"),
        Tracked::new(server_side.clone(), &server_last),
        Tracked::new(client_side.clone(), &client_last),
        params.clone(),
        params,
    );
    let (Some(server_conn), Some(client_conn)) = (server_last.wait(), client_last.wait()) else {
        panic!("both ends established");
    };
    let small = [5u8; 64];
    for (name, from, conn, sender, to) in [
        (
            "accepting",
            &server,
            server_conn,
            &server_side,
            &client_side,
        ),
        (
            "connecting",
            &client,
            client_conn,
            &client_side,
            &server_side,
        ),
    ] {
        let before = from.memory_registrations();
        let (c0, r0) = (
            sender.completed.load(Ordering::SeqCst),
            to.received.load(Ordering::SeqCst),
        );
        for k in 0..100u64 {
            loop {
                match from.send_data_copy(conn, &[&small], &[], k) {
                    Ok(()) => break,
                    Err(SendError::NoResources) => std::thread::yield_now(),
                    Err(e) => panic!("{name} end, send {k}: {e}"),
                }
            }
        }
        assert!(
            wait_until(|| sender.completed.load(Ordering::SeqCst) == c0 + 100
                && to.received.load(Ordering::SeqCst) == r0 + 100),
            "{name} end: 100 sends completed and delivered"
        );
        assert_eq!(
            from.memory_registrations() - before,
            0,
            "the {name} end registered memory for 100 copy sends of 64 bytes, which \
             sockets takes by injection"
        );
    }
}
