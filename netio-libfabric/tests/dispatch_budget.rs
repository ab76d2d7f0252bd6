//! A flood of messages to a slow handler leaves the loop's timers firing on
//! time: one dispatch hands events over for a bounded time
//! (`events::DISPATCH_BUDGET`) and then yields to the loop, whose turn runs
//! the timers before the flood goes on.
//!
//! Before the budget, a delivery run read the completion queue again when
//! it ended and queued the next run into the same dispatch, up to 64
//! rounds of up to 1,024 messages: at half a millisecond a message, a
//! 10 ms timer waited for the whole flood.

mod common;
mod harness;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{wait_until, Running};
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, SendError,
};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

/// What the receiving handler spends on each message.
const HANDLER_TIME: Duration = Duration::from_micros(500);
/// The timer the receiver sets when the first message arrives.
const TIMER: Duration = Duration::from_millis(10);
const TIMER_TOKEN: u64 = 7;
/// Messages in the flood: about two seconds of the handler's time.
const MESSAGES: u64 = 4_000;
/// At most this many messages may be delivered between the timer's set
/// and its firing. The timer's own 10 ms are about 20 messages, and each
/// dispatch yields after a few milliseconds; without the budget one
/// delivery run alone hands over hundreds (up to the 1,024 receive
/// buffers). Counted in messages rather than time, so that a loaded
/// machine, which slows the handler and the loop alike, does not move it.
const MAX_DELIVERED_WHILE_DUE: u64 = 300;

#[derive(Default)]
struct Seen {
    conn: Option<ConnId>,
    delivered: u64,
    completed: u64,
    timer_set: Option<Instant>,
    /// When the timer fired, and how many messages had been delivered then.
    fired: Option<(Instant, u64)>,
    closed: Option<CloseReason>,
}

/// Records what it sees; as a receiver, spends [`HANDLER_TIME`] on each
/// message and sets a [`TIMER`] when the first arrives.
#[derive(Clone, Default)]
struct Side {
    seen: Arc<Mutex<Seen>>,
    slow: bool,
}

impl Handler<LibfabricBackend> for Side {
    fn on_connection_established(
        &mut self,
        _b: &LibfabricBackend,
        conn: ConnId,
        _r: EndpointAddress,
        _c: Capabilities,
    ) {
        self.seen.lock().unwrap().conn = Some(conn);
    }

    fn on_connection_closed(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        why: &CloseReason,
        _keys: &[u64],
    ) {
        self.seen.lock().unwrap().closed = Some(why.clone());
    }

    fn on_data(&mut self, b: &LibfabricBackend, _c: ConnId, _data: &[u8]) {
        {
            let mut s = self.seen.lock().unwrap();
            s.delivered += 1;
            if s.delivered == 1 {
                s.timer_set = Some(Instant::now());
                b.set_timer(TIMER, TIMER_TOKEN);
            }
        }
        if self.slow {
            std::thread::sleep(HANDLER_TIME);
        }
    }

    fn on_sends_completed(&mut self, _b: &LibfabricBackend, _c: ConnId, keys: &[u64]) {
        self.seen.lock().unwrap().completed += keys.len() as u64;
    }

    fn on_timer(&mut self, _b: &LibfabricBackend, token: u64) {
        if token == TIMER_TOKEN {
            let mut s = self.seen.lock().unwrap();
            s.fired = Some((Instant::now(), s.delivered));
        }
    }
}

/// Floods a slow receiver on `lf` with [`MESSAGES`] small messages and
/// checks that its timer fired while the flood went on.
fn flood_leaves_timers_firing(lf: LibfabricConfig, busy: bool) {
    let start = if busy {
        Running::start_busy
    } else {
        Running::start
    };
    let (rx_loop, tx_loop) = (start(), start());
    let rx = Side {
        slow: true,
        ..Side::default()
    };
    let tx = Side::default();
    let receiver = LibfabricBackend::new(
        &rx_loop.lp,
        BackendConfig::default(),
        lf.clone(),
        rx.clone(),
    )
    .unwrap();
    let sender =
        LibfabricBackend::new(&tx_loop.lp, BackendConfig::default(), lf, tx.clone()).unwrap();
    // Enough receive buffers that one delivery run has hundreds of
    // messages to hand over.
    let listen = receiver
        .open_listen_endpoint(
            "127.0.0.1:0".parse().unwrap(),
            ConnectionParams::receive(256, 1024),
        )
        .unwrap();
    sender
        .open_active_endpoint(listen, ConnectionParams::default())
        .unwrap();
    assert!(
        wait_until(|| tx.seen.lock().unwrap().conn.is_some()),
        "the sender's connection established"
    );
    let conn = tx.seen.lock().unwrap().conn.unwrap();
    let payload = [5u8; 64];
    let mut sent = 0;
    let started = Instant::now();
    while sent < MESSAGES && started.elapsed() < common::DEADLINE {
        match sender.send_data_copy(conn, &[&payload], &[], sent) {
            Ok(()) => sent += 1,
            Err(SendError::NoResources) => std::thread::sleep(Duration::from_micros(200)),
            Err(e) => panic!("send {sent}: {e}"),
        }
    }
    assert_eq!(sent, MESSAGES, "every message of the flood accepted");
    let all_in = wait_until(|| {
        let s = rx.seen.lock().unwrap();
        s.delivered == MESSAGES && s.fired.is_some()
    });
    let s = rx.seen.lock().unwrap();
    assert!(
        all_in,
        "the flood delivered ({} of {MESSAGES}, {} sends completed, closed: {:?}) and the \
         timer fired ({:?})",
        s.delivered,
        tx.seen.lock().unwrap().completed,
        s.closed,
        s.fired.is_some()
    );
    let set = s.timer_set.expect("set with the first message");
    let (fired, delivered_then) = s.fired.expect("checked");
    let took = fired - set;
    assert!(
        took >= TIMER,
        "the timer fired {took:?} after it was set, before its {TIMER:?}"
    );
    let meanwhile = delivered_then - 1;
    assert!(
        meanwhile <= MAX_DELIVERED_WHILE_DUE,
        "a {TIMER:?} timer fired {took:?} after it was set, held up by the flood: {meanwhile} \
         messages of {HANDLER_TIME:?} each were delivered meanwhile (at most \
         {MAX_DELIVERED_WHILE_DUE} expected)"
    );
    // The flood was still on when the timer fired, or the test showed
    // nothing.
    assert!(
        delivered_then < MESSAGES / 2,
        "the timer fired only after {delivered_then} of {MESSAGES} messages: the flood had \
         (nearly) ended, so the test did not check what it is for"
    );
}

#[test]
fn a_flood_to_a_slow_handler_on_a_connected_endpoint_leaves_timers_firing() {
    flood_leaves_timers_firing(LibfabricConfig::provider("tcp"), false);
}

#[test]
fn on_busy_polling_loops_a_flood_on_a_connected_endpoint_leaves_timers_firing() {
    flood_leaves_timers_firing(LibfabricConfig::provider("tcp"), true);
}

#[test]
fn a_flood_to_a_slow_handler_on_reliable_datagrams_leaves_timers_firing() {
    flood_leaves_timers_firing(harness::rdm_config("tcp;ofi_rxm"), false);
}

#[test]
fn on_busy_polling_loops_a_flood_on_reliable_datagrams_leaves_timers_firing() {
    flood_leaves_timers_firing(harness::rdm_config("shm"), true);
}
