//! Listening off the loop thread.
//!
//! A passive endpoint's event queue is read on a thread of its own, never
//! on the loop: libfabric 1.17's `tcp` provider reads a connection
//! request's header and data with blocking `recv` calls inside
//! `fi_eq_read`, so a peer that sends half a request and then nothing
//! would stop every connection of the loop. Here it stops only that
//! listener's thread, until the handshake guard ends it.
//!
//! The handshake guard (on `tcp`) runs on a second thread: it lists the
//! process's TCP connections on the listener's address whose peer has not
//! had its connection request read yet, and shuts down those older than the
//! handshake timeout (a half-sent request unblocks the listener thread, a
//! silent connection ends) and the newest beyond the admission limit. It
//! never closes a descriptor (see [`crate::os`]); libfabric sees the
//! connection end and closes its socket itself.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::ffi::{ConnRequest, PassiveEp};
use crate::os::{self, SocketSeen, WakeFd};

/// How long a listener thread sleeps between looks at its stop flag when
/// nothing happens.
const IDLE_WAIT: Duration = Duration::from_millis(200);
/// Rounds without any event before the listener thread backs off (a
/// listening socket that stays readable while accepting fails, e.g. out of
/// descriptors, must not spin a core).
const EMPTY_ROUNDS: u32 = 64;
/// How long a listener stopping waits for its thread to let go of the
/// passive endpoint, so that the endpoint is closed, and its port free,
/// when the close returns (a listener opened again on that port right
/// after must not fail). The thread answers its wake-up at once; a peer
/// holding it inside libfabric (`tcp`) holds it only until the guard's
/// stop pass ends that peer's connection, also at once. The bound is for a
/// provider that blocks elsewhere: its thread then lets go later.
const STOP_WAIT: Duration = Duration::from_secs(10);

/// The handshake guard's settings.
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    /// Age at which a connection without a request read is shut down.
    pub timeout: Duration,
    /// Connections without a request read that one listener holds.
    pub max_pending: usize,
}

/// What a listener's threads and the backend share.
pub struct ListenShared {
    stop: AtomicBool,
    wake: WakeFd,
    /// Peers whose connection request was read (the guard leaves them).
    known: Mutex<HashSet<SocketAddr>>,
    /// Connections refused by the backend (shared with it).
    refused: Arc<AtomicU64>,
}

/// A peer whose request was read, known to the guard while this lives
/// (kept by the connection it became).
pub struct KnownPeer {
    shared: Arc<ListenShared>,
    peer: SocketAddr,
}

impl KnownPeer {
    /// Marks `peer` known until the value is dropped.
    pub fn new(shared: &Arc<ListenShared>, peer: SocketAddr) -> Self {
        shared
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer);
        Self {
            shared: Arc::clone(shared),
            peer,
        }
    }
}

impl Drop for KnownPeer {
    fn drop(&mut self) {
        self.shared
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.peer);
    }
}

/// A listener's threads, stopped on drop.
pub struct ListenWorker {
    shared: Arc<ListenShared>,
    done: Option<mpsc::Receiver<()>>,
}

impl ListenWorker {
    /// Starts the threads of a listener bound to `bound`: every connection
    /// request read goes to `on_request` (on the listener thread; it hands
    /// the request to the loop).
    pub fn spawn(
        pep: Arc<PassiveEp>,
        bound: SocketAddr,
        guard: Option<GuardSettings>,
        refused: Arc<AtomicU64>,
        on_request: impl Fn(ConnRequest, KnownPeer) + Send + 'static,
    ) -> std::io::Result<ListenWorker> {
        let shared = Arc::new(ListenShared {
            stop: AtomicBool::new(false),
            wake: WakeFd::new()?,
            known: Mutex::new(HashSet::new()),
            refused,
        });
        let guard = match guard {
            Some(g) => {
                let s = Arc::clone(&shared);
                // The name is cut to 15 bytes by the system: the port fits.
                Some(
                    std::thread::Builder::new()
                        .name(format!("lf-guard {}", bound.port()))
                        .spawn(move || guard_thread(bound, g, &s))?,
                )
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel();
        let s = Arc::clone(&shared);
        let started = std::thread::Builder::new()
            .name(format!("netio-lf-listen {bound}"))
            .spawn(move || {
                listen_thread(&pep, &s, on_request);
                // The port stays bound until the guard's last scan is
                // done: that scan shuts down every connection on the port
                // whose request was not read, and once the port is free a
                // new listener of this process may be bound to it, whose
                // set-ups it would end (the connecting side is refused
                // with EIO).
                if let Some(g) = guard {
                    let _ = g.join();
                }
                drop(pep);
                let _ = tx.send(());
            });
        if let Err(e) = started {
            // The guard (if any) ends on its own.
            shared.stop.store(true, Ordering::SeqCst);
            shared.wake.wake();
            return Err(e);
        }
        Ok(ListenWorker {
            shared,
            done: Some(rx),
        })
    }
}

impl Drop for ListenWorker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.wake();
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(STOP_WAIT);
        }
    }
}

fn listen_thread(
    pep: &PassiveEp,
    shared: &Arc<ListenShared>,
    on_request: impl Fn(ConnRequest, KnownPeer),
) {
    let mut empty = 0u32;
    while !shared.stop.load(Ordering::SeqCst) {
        let mut any = false;
        loop {
            match pep.read_request() {
                Ok(Some(Some(req))) => {
                    any = true;
                    if shared.stop.load(Ordering::SeqCst) {
                        pep.reject(req);
                        continue;
                    }
                    match req.peer() {
                        Some(peer) => on_request(req, KnownPeer::new(shared, peer)),
                        None => {
                            shared.refused.fetch_add(1, Ordering::Relaxed);
                            pep.reject(req);
                        }
                    }
                }
                Ok(Some(None)) => any = true,
                Ok(None) => break,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    break;
                }
            }
        }
        if any {
            empty = 0;
        } else {
            empty += 1;
            if empty >= EMPTY_ROUNDS {
                empty = 0;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        if !pep.eq().trywait() {
            continue;
        }
        os::wait_readable(pep.eq().fd(), shared.wake.fd(), IDLE_WAIT);
    }
    // Requests that came meanwhile are refused.
    while let Ok(Some(ev)) = pep.read_request() {
        if let Some(req) = ev {
            pep.reject(req);
        }
    }
}

/// The ports whose handshake guard runs (in this crate's unit tests only:
/// the guard's end made visible at the instant it happens).
#[cfg(test)]
static RUNNING_GUARDS: Mutex<Vec<u16>> = Mutex::new(Vec::new());

fn guard_thread(bound: SocketAddr, g: GuardSettings, shared: &ListenShared) {
    #[cfg(test)]
    RUNNING_GUARDS.lock().unwrap().push(bound.port());
    #[cfg(test)]
    struct Ended(u16);
    #[cfg(test)]
    impl Drop for Ended {
        fn drop(&mut self) {
            let mut running = RUNNING_GUARDS.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = running.iter().position(|&p| p == self.0) {
                running.swap_remove(i);
            }
        }
    }
    #[cfg(test)]
    let _ended = Ended(bound.port());
    let base = (g.timeout / 8).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let mut first_seen: HashMap<SocketSeen, Instant> = HashMap::new();
    loop {
        let stopping = shared.stop.load(Ordering::SeqCst);
        let started = Instant::now();
        let cpu_started = os::thread_cpu_time();
        let known = shared
            .known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let pending: Vec<SocketSeen> = os::sockets_on(bound)
            .into_iter()
            .filter(|s| !known.contains(&s.peer))
            .collect();
        first_seen.retain(|k, _| pending.contains(k));
        for p in &pending {
            first_seen.entry(*p).or_insert(started);
        }
        let mut doomed: Vec<SocketSeen> = Vec::new();
        if stopping {
            doomed = pending;
        } else {
            let mut rest: Vec<(Instant, SocketSeen)> = Vec::new();
            for p in pending {
                let t = first_seen[&p];
                if started.duration_since(t) >= g.timeout {
                    doomed.push(p);
                } else {
                    rest.push((t, p));
                }
            }
            if rest.len() > g.max_pending {
                rest.sort_by_key(|(t, _)| *t);
                doomed.extend(rest.drain(g.max_pending..).map(|(_, p)| p));
            }
        }
        for d in doomed {
            // Counted before the shutdown, so that whoever sees the
            // connection end also sees it counted; taken back in the rare
            // case where the shutdown itself fails.
            let counted = Cell::new(false);
            let wanted = || {
                let wanted = !shared
                    .known
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&d.peer);
                if wanted {
                    shared.refused.fetch_add(1, Ordering::SeqCst);
                    counted.set(true);
                }
                wanted
            };
            if os::shut_down(d, wanted) {
                first_seen.remove(&d);
            } else if counted.get() {
                shared.refused.fetch_sub(1, Ordering::SeqCst);
            }
        }
        if stopping {
            return;
        }
        // A scan costs in proportion to the process's descriptors: keep it
        // to a few percent of a core. Its cost is the CPU time it took, not
        // the wall time: on a loaded machine the scan waits for a core, and
        // pacing by wall time would stretch the interval (and the handshake
        // deadline it enforces) by the load.
        let wait = base.max(os::thread_cpu_time().saturating_sub(cpu_started) * 20);
        os::wait_readable(shared.wake.fd(), shared.wake.fd(), wait);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::{Duration, Instant};

    use netio_core::mio_loop::MioLoop;
    use netio_core::{
        Backend, BackendConfig, ConnectionParams, EndpointAddress, EventLoop, Handler,
    };

    use super::RUNNING_GUARDS;
    use crate::backend::LibfabricBackend;
    use crate::config::LibfabricConfig;

    struct Quiet;
    impl Handler<LibfabricBackend> for Quiet {}

    fn guard_runs(port: u16) -> bool {
        RUNNING_GUARDS.lock().unwrap().contains(&port)
    }

    /// The handshake guard of a connected `tcp` listener has ended when
    /// `close_listen_endpoint` returns, not a moment after (a guard that
    /// outlived its listener shut down the set-ups of the next listener
    /// bound to the same port). Checked at the instant the call returns:
    /// the guard leaves the registry as its thread function ends.
    #[test]
    fn a_listeners_handshake_guard_has_ended_when_its_close_returns() {
        let lp = MioLoop::new().expect("a loop");
        let runner = lp.clone();
        let thread = std::thread::spawn(move || runner.run(|| {}));
        let backend = LibfabricBackend::new(
            &lp,
            BackendConfig::default(),
            LibfabricConfig::provider("tcp"),
            Quiet,
        )
        .expect("a tcp backend");
        for round in 0..10 {
            let listen = backend
                .open_listen_endpoint(
                    EndpointAddress::from(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
                    ConnectionParams::receive(64, 2),
                )
                .expect("listening");
            let port = listen.port();
            let start = Instant::now();
            while !guard_runs(port) {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "round {round}: the guard of port {port} never started"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            backend.close_listen_endpoint(listen).expect("closing");
            assert!(
                !guard_runs(port),
                "round {round}: the guard of port {port} still runs after its listener's close returned"
            );
        }
        drop(backend);
        lp.stop();
        thread.join().expect("the loop thread");
    }
}
