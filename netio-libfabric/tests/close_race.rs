//! A local close with sends still in the provider's hands reports each key
//! once, and never reports cancelled a send the peer received.
//!
//! `sockets` writes sends on its own progress thread, so a send may still be
//! on its way a few milliseconds after it was posted; a close that gave up
//! waiting for it after a fixed 2 ms reported such sends cancelled while
//! the peer received them (the suite's
//! `closing_with_sends_in_flight_reports_each_key_once` caught it in about
//! one run of sixteen). The close now lingers on the loop until every send
//! ended (`LibfabricConfig::close_linger`). This test runs that behaviour
//! many times in a row on `sockets` and on `tcp`, in both thread modes.

mod harness;

use netio_conformance::mio::MioHarness;
use netio_conformance::tests::closing_with_sends_in_flight_reports_each_key_once as close_in_flight;
use netio_core::ThreadSafety;

const ROUNDS: usize = 40;

fn rounds<H: netio_conformance::Harness>() {
    for mode in [ThreadSafety::Safe, ThreadSafety::Unsafe] {
        for _ in 0..ROUNDS {
            close_in_flight::<H>(mode);
        }
    }
}

#[test]
fn sockets_local_close_never_reports_a_delivered_send_cancelled() {
    rounds::<MioHarness<harness::Sockets>>();
}

#[test]
fn tcp_local_close_never_reports_a_delivered_send_cancelled() {
    rounds::<MioHarness<harness::Tcp>>();
}
