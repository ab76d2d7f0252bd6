//! `shm` endpoints open even where a dead process with this process's id
//! left its shared-memory files behind.
//!
//! libfabric 1.17 names the n-th `shm` endpoint of a process
//! `<pid>:<uid>:<n>` and keeps it in a file of that name in `/dev/shm`,
//! which a killed process leaves there. Process ids wrap (at 32,768 by
//! default), and a later process with the same id found such a file,
//! read its own id in it and failed to open the endpoint (`fi_enable`:
//! `-FI_EBUSY`); seen in the libfabric suites on a machine whose
//! `/dev/shm` held files of killed `fi_pingpong` runs. netio names its
//! `shm` endpoints itself, with a random part per process.
//!
//! This test binary runs in a process of its own: it lays such files for
//! the first endpoints of this process before any is opened.

mod common;
mod harness;

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_libfabric::LibfabricBackend;

/// The files libfabric 1.17 would name this process's first `shm`
/// endpoints with, removed when dropped.
struct StaleFiles(Vec<PathBuf>);

impl StaleFiles {
    /// Lays `count` files as a dead process with this process's id would
    /// have left them: an `shm` region header of version 4 naming this
    /// process.
    fn lay(count: usize) -> Self {
        let pid = std::process::id();
        let uid = std::fs::metadata("/proc/self").expect("/proc/self").uid();
        let mut header = vec![0u8; 64];
        header[0] = 4; // the region layout's version in libfabric 1.17
        header[4..8].copy_from_slice(&(pid as i32).to_ne_bytes());
        let paths = (0..count)
            .map(|n| {
                let path = PathBuf::from(format!("/dev/shm/{pid}:{uid}:{n}"));
                std::fs::write(&path, &header).expect("laying a stale shm file");
                path
            })
            .collect();
        Self(paths)
    }
}

impl Drop for StaleFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[test]
fn shm_endpoints_open_beside_files_a_dead_process_with_the_same_id_left() {
    let _stale = StaleFiles::lay(16);
    let lp = Running::start();
    let server = Recorder::new(0);
    let client = Recorder::new(1);
    let rdm = harness::rdm_config("shm");
    let s = LibfabricBackend::new(
        &lp.lp,
        BackendConfig::default(),
        rdm.clone(),
        server.clone(),
    )
    .expect("the server's backend");
    let listen = s
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64, 4),
        )
        .expect("listening on shm beside the stale files");
    client.greet_port.store(listen.port(), Ordering::SeqCst);
    let c = LibfabricBackend::new(&lp.lp, BackendConfig::default(), rdm, client.clone())
        .expect("the client's backend");
    c.open_active_endpoint(listen, ConnectionParams::receive(64, 4))
        .expect("connecting on shm beside the stale files");
    assert!(
        wait_until(|| client.count(|e| matches!(e, Seen::Pong(_))) == 1),
        "a ping and its pong went both ways: {:?}",
        client.seen()
    );
    drop(c);
    drop(s);
}
