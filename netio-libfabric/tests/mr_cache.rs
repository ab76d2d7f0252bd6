//! libfabric's memory-registration cache stays off unless the environment
//! chooses it, and `verbs` domains open and close safely while other
//! threads of the process free memory.
//!
//! libfabric 1.17's default cache monitor (`memhooks`) rewrites the entry
//! of libc's `madvise`, `munmap`, `mmap` and `brk` when the first domain
//! with a cache opens and restores it when the last one closes; a thread
//! inside one of them meanwhile crashed (SIGSEGV at `madvise+9`) or hung.
//! The provider sets `FI_MR_CACHE_MONITOR=disabled` before libfabric
//! initialises, unless `FI_MR_CACHE_MONITOR` or `FI_MR_CACHE_MAX_COUNT` is
//! already set.
//!
//! The `verbs` test needs the `verbs-conformance` feature and a verbs
//! device (the soft-RoCE guest of `scripts/verbs-guest.sh`, which the test
//! command runs it in). Run there with `FI_MR_CACHE_MONITOR=memhooks` it
//! shows the crash the default prevents.

mod common;
mod harness;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

const MONITOR: &str = "FI_MR_CACHE_MONITOR";
const MAX_COUNT: &str = "FI_MR_CACHE_MAX_COUNT";

/// Opens a listener and one connection to it on `lf` at `ip`, waits until
/// both sides are established, closes the connection and drops the
/// backend.
fn connect_once(lf: &LibfabricConfig, ip: std::net::IpAddr, lp: &Running) {
    let rec = Recorder::new(0);
    let b = LibfabricBackend::new(&lp.lp, BackendConfig::default(), lf.clone(), rec.clone())
        .expect("creating the backend");
    let listen = b
        .open_listen_endpoint(EndpointAddress::new(ip, 0), ConnectionParams::default())
        .expect("listening");
    let conn = b
        .open_active_endpoint(listen, ConnectionParams::default())
        .expect("connecting");
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Established(..))) == 2),
        "both sides established; saw {:?}",
        rec.seen()
    );
    b.close_active_endpoint(conn).expect("closing");
    assert!(
        wait_until(|| rec.count(|s| matches!(s, Seen::Closed(..))) == 2),
        "both sides closed; saw {:?}",
        rec.seen()
    );
    drop(b);
}

#[test]
fn the_memory_registration_cache_is_off_unless_the_environment_chooses_it() {
    let monitor = std::env::var_os(MONITOR);
    let max_count = std::env::var_os(MAX_COUNT);
    let lp = Running::start();
    connect_once(
        &LibfabricConfig::provider("tcp"),
        std::net::Ipv4Addr::LOCALHOST.into(),
        &lp,
    );
    match (monitor, max_count) {
        (Some(m), _) => assert_eq!(
            std::env::var_os(MONITOR),
            Some(m),
            "a monitor chosen by the environment is kept"
        ),
        (None, Some(_)) => assert_eq!(
            std::env::var_os(MONITOR),
            None,
            "a cache size chosen by the environment leaves the monitor to libfabric"
        ),
        (None, None) => assert_eq!(
            std::env::var(MONITOR).as_deref(),
            Ok("disabled"),
            "the first backend turns libfabric's registration cache off"
        ),
    }
}

/// Three threads churn the heap (large blocks that glibc maps and unmaps,
/// and short-lived threads whose arenas are trimmed with `madvise` when
/// they exit) while domains open and close one after another, so that
/// every round starts and stops libfabric's cache monitor if one is on.
#[cfg(feature = "verbs-conformance")]
#[test]
fn verbs_domains_open_and_close_while_other_threads_free_memory() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    const ROUNDS: usize = 150;
    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicU64::new(0));
    let churners: Vec<_> = (0..3)
        .map(|t| {
            let stop = Arc::clone(&stop);
            let churned = Arc::clone(&churned);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::spawn(move || {
                        let big: Vec<Vec<u8>> = (0..4)
                            .map(|i| vec![t as u8; (256 + 64 * i) << 10])
                            .collect();
                        let small: Vec<Box<[u8; 512]>> =
                            (0..512).map(|_| Box::new([1u8; 512])).collect();
                        std::hint::black_box((&big, &small));
                    })
                    .join()
                    .expect("a churning thread");
                    churned.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let lp = Running::start();
    for _ in 0..ROUNDS {
        connect_once(&harness::verbs_config(), harness::verbs_ip(), &lp);
    }
    stop.store(true, Ordering::Relaxed);
    for c in churners {
        c.join().expect("a churner");
    }
    assert!(
        churned.load(Ordering::Relaxed) >= ROUNDS as u64,
        "the heap was churned while domains opened and closed"
    );
}
