//! The provider closes no file descriptor it does not own.
//!
//! libfabric 1.17's `sockets` closes a connection-manager socket inside
//! `fi_shutdown` and again on its connection-manager thread; when the
//! process reused the number in between, the second close hit somebody
//! else's descriptor (another connection's socket, a loop's epoll instance:
//! "polling epoll failed: Invalid argument", connections refused or stuck at
//! random in the `sockets` suite). The provider therefore ends `sockets`
//! connections with `fi_close` alone. This test opens and closes
//! connections in a loop while a canary thread keeps taking the lowest free
//! descriptor numbers (pipes) and checks that each one still is its own
//! pipe until it closes it itself.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use common::{wait_until, Recorder, Running, Seen};
use netio_core::{Backend, BackendConfig, ConnectionParams};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

const CYCLES: usize = 150;
const HELD: usize = 24;

/// The inode of `fd`, or `None` if it is not open.
fn inode(fd: i32) -> Option<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a `stat` into the buffer it is given; a closed
    // or foreign descriptor makes it fail or report another inode, nothing
    // worse.
    let rc = unsafe { libc::fstat(fd, st.as_mut_ptr()) };
    // SAFETY: fstat succeeded, so it filled the buffer.
    (rc == 0).then(|| unsafe { st.assume_init() }.st_ino)
}

/// Takes descriptor numbers as they become free and checks they stay its
/// own; returns what it found wrong.
fn canary(stop: Arc<AtomicBool>) -> JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut held: Vec<(i32, u64)> = Vec::new();
        let mut problems = Vec::new();
        while !stop.load(Ordering::Relaxed) && problems.is_empty() {
            while held.len() < HELD {
                let mut fds = [0i32; 2];
                // SAFETY: pipe2 writes two descriptors into the array.
                if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                    break;
                }
                for fd in fds {
                    let ino = inode(fd).expect("a pipe just opened is open");
                    held.push((fd, ino));
                }
            }
            for &(fd, ino) in &held {
                match inode(fd) {
                    Some(now) if now == ino => {}
                    Some(_) => {
                        problems.push(format!("descriptor {fd} was replaced under its owner"))
                    }
                    None => problems.push(format!("descriptor {fd} was closed under its owner")),
                }
            }
            if !problems.is_empty() {
                // Leave the numbers alone: they may belong to somebody else now.
                break;
            }
            // Give half of the numbers back, oldest first, so that the
            // provider's next sockets take them and the canary takes its
            // freed ones.
            for (fd, _) in held.drain(..HELD / 2) {
                // SAFETY: the descriptor is the canary's own pipe (checked
                // just above) and closed once.
                unsafe { libc::close(fd) };
            }
            std::thread::yield_now();
        }
        if problems.is_empty() {
            for (fd, _) in held {
                // SAFETY: as above.
                unsafe { libc::close(fd) };
            }
        }
        problems
    })
}

fn cycles(provider: &str) {
    let running = Running::start();
    let (srec, crec) = (Recorder::new(0), Recorder::new(0));
    let make = |rec: &Recorder| {
        LibfabricBackend::new(
            &running.lp,
            BackendConfig::default(),
            LibfabricConfig::provider(provider),
            rec.clone(),
        )
        .expect("a libfabric backend")
    };
    let (server, client) = (make(&srec), make(&crec));
    let params = ConnectionParams::receive(64, 4);
    let listen = server
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .expect("listening");
    let stop = Arc::new(AtomicBool::new(false));
    let watch = canary(Arc::clone(&stop));
    for round in 0..CYCLES {
        let conn = client
            .open_active_endpoint(listen, params.clone())
            .unwrap_or_else(|e| panic!("{provider}, round {round}: connecting failed: {e}"));
        let established = |rec: &Recorder| {
            rec.seen()
                .iter()
                .filter_map(|s| match s {
                    Seen::Established(c, _) => Some(*c),
                    _ => None,
                })
                .next_back()
        };
        assert!(
            wait_until(|| established(&crec) == Some(conn)
                && srec.count(|s| matches!(s, Seen::Established(..))) == round + 1),
            "{provider}, round {round}: established on both sides; client saw {:?}",
            crec.seen().last()
        );
        // Close from either side in turn.
        if round % 2 == 0 {
            client.close_active_endpoint(conn).unwrap();
        } else {
            let accepted = established(&srec).expect("the server saw it");
            server.close_active_endpoint(accepted).unwrap();
        }
        let closed = |rec: &Recorder| rec.count(|s| matches!(s, Seen::Closed(..)));
        assert!(
            wait_until(|| closed(&crec) == round + 1 && closed(&srec) == round + 1),
            "{provider}, round {round}: the close is reported on both sides"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let problems = watch.join().expect("the canary thread");
    assert!(problems.is_empty(), "{provider}: {problems:?}");
}

#[test]
fn sockets_connections_close_no_descriptor_of_somebody_else() {
    cycles("sockets");
}

#[test]
fn tcp_connections_close_no_descriptor_of_somebody_else() {
    cycles("tcp");
}
