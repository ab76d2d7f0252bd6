//! A stream's last message arrives with no other traffic to wake anyone:
//! a sender streams numbered small messages to a receiver that only counts
//! them (in order), with and without the receiver pausing at a high-water
//! mark and resuming from another thread (the pattern `netio-async` uses).
//!
//! Every run must deliver every message. A run that stops making progress
//! for [`STALL`] fails and says what it saw: messages delivered, sends
//! completed, whether the receiver was paused, whether each side saw the
//! connection established, and any refusal (a series of 1,000 runs on a
//! loaded machine once stalled before the connection was established).
//! On libfabric 1.17's `tcp` a message whose header was read while no
//! receive buffer was posted waits in the provider until the completion
//! queue is read again, and `fi_trywait` does not report it: without a
//! read after re-posting buffers, the last messages of a stream waited for
//! unrelated traffic.
//!
//! `NETIO_LF_STREAM_RUNS` sets the number of runs per test (default 10 on
//! `tcp`, where the lost wake-up was found; 3 elsewhere).
//! With the `verbs-conformance` feature the same streams run on `verbs`
//! and `verbs;ofi_rxm` (in the soft-RoCE guest of `scripts/verbs-guest.sh`),
//! and without it on each reliable-datagram fabric provider of this machine
//! (`tcp;ofi_rxm`, `shm`, `sockets`, `udp;ofi_rxd`).

mod common;
mod harness;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Running;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, RefuseReason, SendError,
};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

/// Messages per run.
const MESSAGES: u64 = 20_000;
/// No progress for this long (of the time the process ran) fails the run.
const STALL: Duration = Duration::from_secs(5);
/// The receiver pauses with this many messages unread, resumes at half.
const HIGH_WATER: usize = 64;

/// Runs per test: `NETIO_LF_STREAM_RUNS`, else `default`.
fn runs(default: usize) -> usize {
    std::env::var("NETIO_LF_STREAM_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    delivered: AtomicU64,
    completed: AtomicU64,
    out_of_order: AtomicU64,
    closed: AtomicU64,
    established: AtomicU64,
    /// Refusals reported to this side, with their reasons.
    refused: Mutex<Vec<String>>,
}

/// The receiving side's unread queue (pause mode).
#[derive(Default)]
struct Unread {
    queued: usize,
    paused: bool,
    conn: Option<ConnId>,
    pauses: u64,
}

#[derive(Clone)]
struct Side {
    counts: Arc<Counts>,
    next: Arc<Mutex<u64>>,
    expected: Arc<Mutex<u64>>,
    unread: Option<Arc<Mutex<Unread>>>,
    sender: bool,
}

impl Side {
    fn fill(&self, b: &LibfabricBackend, conn: ConnId) {
        let mut next = self.next.lock().unwrap();
        while *next < MESSAGES {
            let seq = (*next as u32).to_le_bytes();
            match b.send_data_copy(conn, &[&seq, &[0u8; 28]], &[], *next) {
                Ok(()) => *next += 1,
                Err(SendError::NoResources) => return,
                Err(e) => panic!("send {} failed: {e}", *next),
            }
        }
    }
}

impl Handler<LibfabricBackend> for Side {
    fn on_connection_established(
        &mut self,
        b: &LibfabricBackend,
        conn: ConnId,
        _r: EndpointAddress,
        _c: Capabilities,
    ) {
        self.counts.established.fetch_add(1, Ordering::SeqCst);
        if self.sender {
            self.fill(b, conn);
        } else if let Some(u) = &self.unread {
            u.lock().unwrap().conn = Some(conn);
        }
    }

    fn on_connection_refused(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.counts.refused.lock().unwrap().push(why.to_string());
    }

    fn on_connection_closed(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        _why: &CloseReason,
        _keys: &[u64],
    ) {
        self.counts.closed.fetch_add(1, Ordering::SeqCst);
    }

    fn on_data(&mut self, b: &LibfabricBackend, conn: ConnId, data: &[u8]) {
        let seq = u32::from_le_bytes(data[..4].try_into().unwrap()) as u64;
        let mut expected = self.expected.lock().unwrap();
        if seq != *expected {
            self.counts.out_of_order.fetch_add(1, Ordering::SeqCst);
        }
        *expected = seq + 1;
        self.counts.delivered.fetch_add(1, Ordering::SeqCst);
        if let Some(u) = &self.unread {
            let mut u = u.lock().unwrap();
            u.queued += 1;
            if u.queued >= HIGH_WATER && !u.paused {
                b.pause_receive(conn).expect("pause on the loop thread");
                u.paused = true;
                u.pauses += 1;
            }
        }
    }

    fn on_sends_completed(&mut self, b: &LibfabricBackend, conn: ConnId, keys: &[u64]) {
        self.counts
            .completed
            .fetch_add(keys.len() as u64, Ordering::SeqCst);
        self.fill(b, conn);
    }
}

fn side(sender: bool, pause: bool) -> Side {
    Side {
        counts: Arc::default(),
        next: Arc::default(),
        expected: Arc::default(),
        unread: pause.then(Arc::default),
        sender,
    }
}

fn stream(lf: LibfabricConfig, ip: std::net::IpAddr, pause: bool) {
    stream_on(lf, ip, pause, false, runs(10))
}

/// A stream between two loops, busy polling or not, `runs` times.
fn stream_on(lf: LibfabricConfig, ip: std::net::IpAddr, pause: bool, busy: bool, runs: usize) {
    let provider = lf.provider.clone();
    let start = if busy {
        Running::start_busy
    } else {
        Running::start
    };
    let (rx_loop, tx_loop) = (start(), start());
    for run in 0..runs {
        let rx = side(false, pause);
        let tx = side(true, false);
        let receiver = LibfabricBackend::new(
            &rx_loop.lp,
            BackendConfig::default(),
            lf.clone(),
            rx.clone(),
        )
        .expect("the receiving backend");
        let sender = LibfabricBackend::new(
            &tx_loop.lp,
            BackendConfig::default(),
            lf.clone(),
            tx.clone(),
        )
        .expect("the sending backend");
        // Few receive buffers: they run out often.
        let listen = receiver
            .open_listen_endpoint(
                EndpointAddress::new(ip, 0),
                ConnectionParams::receive(64, 8),
            )
            .unwrap();
        let conn = sender
            .open_active_endpoint(listen, ConnectionParams::default())
            .unwrap();
        // The consumer of the unread queue, on a thread of its own.
        let done = Arc::new(AtomicBool::new(false));
        let consumer = rx.unread.clone().map(|u| {
            let receiver = receiver.clone();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    {
                        // A reader slower than the stream: it reads only
                        // while the receiver is paused, down to half the
                        // high-water mark, then resumes it.
                        let mut u = u.lock().unwrap();
                        if u.paused {
                            u.queued = u.queued.saturating_sub(4);
                        }
                        if u.paused && u.queued <= HIGH_WATER / 2 {
                            if let Some(c) = u.conn {
                                receiver
                                    .resume_receive(c)
                                    .expect("resume from another thread");
                            }
                            u.paused = false;
                        }
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            })
        });
        let mut last = (u64::MAX, u64::MAX);
        // Time without progress, as this thread saw it run: a gap between
        // two of its looks counts at most `LOOK_GAP`, so a spell in which
        // the whole process (or a loaded virtual machine) was held still
        // is not taken for a stall.
        const LOOK_GAP: Duration = Duration::from_millis(100);
        let mut still = Duration::ZERO;
        let mut looked = Instant::now();
        loop {
            let now = (
                rx.counts.delivered.load(Ordering::SeqCst),
                tx.counts.completed.load(Ordering::SeqCst),
            );
            if now.0 == MESSAGES && now.1 == MESSAGES {
                break;
            }
            let gap = looked.elapsed().min(LOOK_GAP);
            looked = Instant::now();
            if now != last {
                last = now;
                still = Duration::ZERO;
            } else {
                still += gap;
            }
            if still > STALL {
                done.store(true, Ordering::SeqCst);
                let paused = rx.unread.as_ref().map(|u| {
                    let u = u.lock().unwrap();
                    (u.paused, u.queued, u.pauses)
                });
                panic!(
                    "{provider}, run {run} of {}: no progress for {STALL:?} with {} of {MESSAGES} \
                     messages delivered, {} of {} sends completed, {} closes seen; receiver \
                     (paused, unread, pauses so far): {paused:?}; established on the \
                     receiving side {} and the sending side {} time(s); refusals reported to \
                     the sender {:?}; connections the listener refused {}",
                    runs,
                    now.0,
                    now.1,
                    tx.next.lock().unwrap(),
                    rx.counts.closed.load(Ordering::SeqCst)
                        + tx.counts.closed.load(Ordering::SeqCst),
                    rx.counts.established.load(Ordering::SeqCst),
                    tx.counts.established.load(Ordering::SeqCst),
                    tx.counts.refused.lock().unwrap(),
                    receiver.refused_connections(),
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        done.store(true, Ordering::SeqCst);
        if let Some(t) = consumer {
            t.join().unwrap();
        }
        assert_eq!(
            rx.counts.out_of_order.load(Ordering::SeqCst),
            0,
            "{provider}, run {run}: messages out of order"
        );
        if let Some(u) = &rx.unread {
            assert!(
                u.lock().unwrap().pauses > 0,
                "{provider}, run {run}: the receiver never paused (the test is not testing pauses)"
            );
        }
        sender.close_active_endpoint(conn).unwrap();
        receiver.close_listen_endpoint(listen).unwrap();
        if (run + 1) % 10 == 0 {
            eprintln!(
                "{provider}, pause {pause}: {} runs delivered everything",
                run + 1
            );
        }
    }
}

fn localhost() -> std::net::IpAddr {
    std::net::Ipv4Addr::LOCALHOST.into()
}

#[test]
fn a_stream_to_a_counting_receiver_delivers_every_message() {
    stream(LibfabricConfig::provider("tcp"), localhost(), false);
}

#[test]
fn a_stream_to_a_receiver_paused_and_resumed_from_another_thread_delivers_every_message() {
    stream(LibfabricConfig::provider("tcp"), localhost(), true);
}

// Busy-polling loops read the queue after re-posting buffers only when
// every buffer was out of the provider's hands (see the backend's
// `deliver`); their spin reads it too. These pin that such streams deliver
// everything. (They also passed 60 runs with that read removed: on a busy
// loop the spin alone found the held messages here.)
#[test]
fn on_busy_polling_loops_a_stream_to_a_counting_receiver_delivers_every_message() {
    stream_on(
        LibfabricConfig::provider("tcp"),
        localhost(),
        false,
        true,
        runs(3),
    );
}

#[test]
fn on_busy_polling_loops_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message() {
    stream_on(
        LibfabricConfig::provider("tcp"),
        localhost(),
        true,
        true,
        runs(3),
    );
}

/// Connected `tcp` with the spin reading the hot connection's empty queue
/// in 8 rounds (`LibfabricConfig::spin_rounds`), as on `verbs`.
fn tcp_rounds() -> LibfabricConfig {
    LibfabricConfig {
        spin_rounds: Some(8),
        ..LibfabricConfig::provider("tcp")
    }
}

#[test]
fn on_busy_polling_loops_reading_in_rounds_a_stream_to_a_counting_receiver_delivers_every_message()
{
    stream_on(tcp_rounds(), localhost(), false, true, runs(3));
}

#[test]
fn on_busy_polling_loops_reading_in_rounds_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message(
) {
    stream_on(tcp_rounds(), localhost(), true, true, runs(3));
}

/// The reliable-datagram streams: one test per fabric provider and mode,
/// on loops that sleep or, after `busy`, on busy-polling loops (where the
/// spin hands a single message found by a completion read straight to the
/// handler, and any more through the event queue).
macro_rules! rdm_streams {
    ($($(busy $busy:tt)? $fabric:literal: $plain:ident, $paused:ident;)*) => {$(
        #[test]
        fn $plain() {
            let busy = false $(|| $busy)?;
            stream_on(harness::rdm_config($fabric), localhost(), false, busy, runs(3));
        }

        #[test]
        fn $paused() {
            let busy = false $(|| $busy)?;
            stream_on(harness::rdm_config($fabric), localhost(), true, busy, runs(3));
        }
    )*};
}

rdm_streams! {
    "tcp;ofi_rxm": on_rdm_tcp_rxm_a_stream_to_a_counting_receiver_delivers_every_message,
        on_rdm_tcp_rxm_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
    "shm": on_rdm_shm_a_stream_to_a_counting_receiver_delivers_every_message,
        on_rdm_shm_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
    "sockets": on_rdm_sockets_a_stream_to_a_counting_receiver_delivers_every_message,
        on_rdm_sockets_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
    "udp;ofi_rxd": on_rdm_udp_rxd_a_stream_to_a_counting_receiver_delivers_every_message,
        on_rdm_udp_rxd_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
    busy true "tcp;ofi_rxm":
        on_busy_polling_loops_on_rdm_tcp_rxm_a_stream_to_a_counting_receiver_delivers_every_message,
        on_busy_polling_loops_on_rdm_tcp_rxm_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
    busy true "shm":
        on_busy_polling_loops_on_rdm_shm_a_stream_to_a_counting_receiver_delivers_every_message,
        on_busy_polling_loops_on_rdm_shm_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message;
}

#[cfg(feature = "verbs-conformance")]
#[test]
fn on_rdm_verbs_rxm_a_stream_to_a_counting_receiver_delivers_every_message() {
    stream(
        LibfabricConfig {
            endpoint: netio_libfabric::EndpointType::Rdm,
            ..harness::verbs_config_for("verbs;ofi_rxm")
        },
        harness::verbs_ip(),
        false,
    );
}

#[cfg(feature = "verbs-conformance")]
#[test]
fn on_rdm_verbs_rxm_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message() {
    stream(
        LibfabricConfig {
            endpoint: netio_libfabric::EndpointType::Rdm,
            ..harness::verbs_config_for("verbs;ofi_rxm")
        },
        harness::verbs_ip(),
        true,
    );
}

#[cfg(feature = "verbs-conformance")]
#[test]
fn on_verbs_a_stream_to_a_counting_receiver_delivers_every_message() {
    stream(harness::verbs_config(), harness::verbs_ip(), false);
}

#[cfg(feature = "verbs-conformance")]
#[test]
fn on_verbs_a_stream_to_a_receiver_paused_and_resumed_from_another_thread_delivers_every_message() {
    stream(harness::verbs_config(), harness::verbs_ip(), true);
}

/// On a busy-polling loop `verbs` reads an empty queue in rounds
/// (`LibfabricConfig::spin_rounds`, 8 by default there) and keeps the hot
/// connection first in line between messages.
#[cfg(feature = "verbs-conformance")]
#[test]
fn on_verbs_on_busy_polling_loops_a_stream_to_a_counting_receiver_delivers_every_message() {
    stream_on(
        harness::verbs_config(),
        harness::verbs_ip(),
        false,
        true,
        runs(3),
    );
}

#[cfg(feature = "verbs-conformance")]
#[test]
fn on_verbs_on_busy_polling_loops_a_stream_to_a_paused_and_resumed_receiver_delivers_every_message()
{
    stream_on(
        harness::verbs_config(),
        harness::verbs_ip(),
        true,
        true,
        runs(3),
    );
}

/// Reliable datagrams over `verbs;ofi_rxm` on busy-polling loops: the
/// spin's rounds of reads, and the stall guard beside them.
#[cfg(feature = "verbs-conformance")]
#[test]
fn on_rdm_verbs_rxm_on_busy_polling_loops_a_stream_to_a_counting_receiver_delivers_every_message() {
    stream_on(
        LibfabricConfig {
            endpoint: netio_libfabric::EndpointType::Rdm,
            ..harness::verbs_config_for("verbs;ofi_rxm")
        },
        harness::verbs_ip(),
        false,
        true,
        runs(3),
    );
}
