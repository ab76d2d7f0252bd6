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

use common::{wait_until, LastConn, Running, Tracked};
use netio_core::{
    Backend, CloseReason, ConnId, ConnectionParams, EndpointAddress, Handler, SendError,
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
    delivered: u64,
    completed: u64,
    timer_set: Option<Instant>,
    /// When the timer fired, and how many messages had been delivered then.
    fired: Option<(Instant, u64)>,
    closed: Option<CloseReason>,
    closed_at: Option<Instant>,
}

/// Records what it sees; as a receiver, spends [`HANDLER_TIME`] on each
/// message and sets a [`TIMER`] when the first arrives.
#[derive(Clone, Default)]
struct Side {
    seen: Arc<Mutex<Seen>>,
    slow: bool,
}

impl Handler<LibfabricBackend> for Side {
    fn on_connection_closed(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        why: &CloseReason,
        _keys: &[u64],
    ) {
        let mut s = self.seen.lock().unwrap();
        s.closed = Some(why.clone());
        s.closed_at = Some(Instant::now());
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

/// A receiver whose handler is slow and a sender connected to it, on
/// `lf`, each backend on a loop of its own (busy-polling with `busy`).
struct SlowPair {
    rx: Side,
    tx: Side,
    receiver: LibfabricBackend,
    sender: LibfabricBackend,
    /// The connection on the receiver's side and on the sender's.
    rx_conn: ConnId,
    tx_conn: ConnId,
    /// The two loops (stopped when dropped, after the backends).
    _loops: (Running, Running),
}

/// [`SlowPair`] with `recv_buffers` receive buffers on the receiver's
/// side, once both sides saw the connection established.
fn slow_pair(lf: LibfabricConfig, busy: bool, recv_buffers: usize) -> SlowPair {
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
    let (rx_last, tx_last) = (LastConn::default(), LastConn::default());
    let (receiver, sender) = common::receiver_and_sender(
        &rx_loop.lp,
        &tx_loop.lp,
        lf,
        Tracked::new(rx.clone(), &rx_last),
        Tracked::new(tx.clone(), &tx_last),
        ConnectionParams::receive(256, recv_buffers),
    );
    let (Some(rx_conn), Some(tx_conn)) = (rx_last.wait(), tx_last.wait()) else {
        panic!("both sides established");
    };
    SlowPair {
        rx,
        tx,
        receiver,
        sender,
        rx_conn,
        tx_conn,
        _loops: (rx_loop, tx_loop),
    }
}

/// Floods a slow receiver on `lf` with [`MESSAGES`] small messages and
/// checks that its timer fired while the flood went on.
fn flood_leaves_timers_firing(lf: LibfabricConfig, busy: bool) {
    // Enough receive buffers that one delivery run has hundreds of
    // messages to hand over.
    // Every part bound (a part left out would be dropped at once), the
    // loops first so that they are dropped last.
    let SlowPair {
        _loops,
        rx,
        tx,
        receiver: _receiver,
        sender,
        tx_conn: conn,
        ..
    } = slow_pair(lf, busy, 1024);
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

/// Messages held when the peer closed, to a slow handler: a multiple of
/// the messages one delivery run hands over before its budget is spent
/// (its clock is read every 4 messages, first to start the budget, and
/// 4 × [`HANDLER_TIME`] spend it: runs of 8).
const HELD_AT_CLOSE: u64 = 64;

/// A receiver paused while its peer sends [`HELD_AT_CLOSE`] messages and
/// closes, then resumed: the messages are delivered, in runs that each end
/// when the dispatch budget is spent, and then the peer's close is
/// reported. The last run ends on its budget with nothing left held; the
/// close waiting for it must be carried out there too, or it waits for an
/// event that never comes (connected endpoints), or for the deadline of
/// the peer's close, 2 s after its CLOSE frame (reliable datagrams).
fn a_close_held_behind_messages_is_reported_after_the_last_run(lf: LibfabricConfig, busy: bool) {
    let SlowPair {
        _loops,
        rx,
        tx,
        receiver,
        sender,
        rx_conn,
        tx_conn,
    } = slow_pair(lf, busy, HELD_AT_CLOSE as usize);
    receiver.pause_receive(rx_conn).unwrap();
    let payload = [5u8; 64];
    for key in 0..HELD_AT_CLOSE {
        sender
            .send_data_copy(tx_conn, &[&payload], &[], key)
            .unwrap_or_else(|e| panic!("send {key}: {e}"));
    }
    assert!(
        wait_until(|| tx.seen.lock().unwrap().completed == HELD_AT_CLOSE),
        "every send completed ({} of {HELD_AT_CLOSE})",
        tx.seen.lock().unwrap().completed
    );
    let closed_by_peer = Instant::now();
    sender.close_active_endpoint(tx_conn).unwrap();
    // The receiver learns of the close while paused, with every message
    // held; nothing is delivered or reported meanwhile.
    std::thread::sleep(Duration::from_millis(100));
    {
        let s = rx.seen.lock().unwrap();
        assert_eq!(s.delivered, 0, "nothing delivered while paused");
        assert!(s.closed.is_none(), "no close reported before the messages");
    }
    receiver.resume_receive(rx_conn).unwrap();
    let done = wait_until(|| {
        let s = rx.seen.lock().unwrap();
        s.delivered == HELD_AT_CLOSE && s.closed.is_some()
    });
    let s = rx.seen.lock().unwrap();
    assert!(
        done,
        "the held messages delivered ({} of {HELD_AT_CLOSE}) and then the close reported ({:?})",
        s.delivered, s.closed
    );
    assert_eq!(s.closed, Some(CloseReason::PeerClosed));
    // Not by the close wait's deadline: that comes 2 s after the CLOSE
    // frame, which left after `closed_by_peer`.
    let after = s.closed_at.expect("closed") - closed_by_peer;
    assert!(
        after < PEER_CLOSE_WAIT,
        "the close was reported {after:?} after the peer closed: by the close wait's \
         {PEER_CLOSE_WAIT:?} deadline, not after the last message"
    );
}

/// How long a reliable-datagram receiver waits, after the peer's CLOSE
/// frame, for messages still on the way (docs/libfabric.md, "Closing").
const PEER_CLOSE_WAIT: Duration = Duration::from_secs(2);

#[test]
fn a_close_held_behind_messages_on_a_connected_endpoint_is_reported_after_the_last_run() {
    a_close_held_behind_messages_is_reported_after_the_last_run(
        LibfabricConfig::provider("tcp"),
        false,
    );
}

#[test]
fn a_close_held_behind_messages_on_reliable_datagrams_is_reported_after_the_last_run() {
    a_close_held_behind_messages_is_reported_after_the_last_run(
        harness::rdm_config("tcp;ofi_rxm"),
        false,
    );
}

#[test]
fn on_busy_polling_loops_a_close_held_behind_messages_on_reliable_datagrams_is_reported_after_the_last_run(
) {
    a_close_held_behind_messages_is_reported_after_the_last_run(harness::rdm_config("shm"), true);
}
