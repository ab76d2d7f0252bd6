//! The netio-rs conformance suite on libfabric's `sockets` provider over
//! 127.0.0.1, in both thread modes.
//!
//! Built only with the `sockets-conformance` feature:
//!
//! ```text
//! cargo test -p netio-libfabric --features sockets-conformance --test conformance_sockets
//! ```
//!
//! Known failures on libfabric 1.17 (15 of 145 run, about 6 minutes): the
//! `sockets` provider keeps completing sends to a receiver that is held or
//! paused (its buffers not posted again), so nothing pushes back before the
//! suite's limit of 4096 sends (64 MiB); see `docs/libfabric.md`. In both
//! thread modes:
//! `backpressure_stops_buffered_sends_and_resumes_after_the_peer_reads`,
//! `backpressure_stops_copy_sends_and_resumes_after_the_peer_reads`,
//! `backpressure_stops_zero_copy_sends_and_resumes_after_the_peer_reads`,
//! `listener_close_with_sends_in_flight_reports_each_key_once_on_both_sides`,
//! `local_close_with_sends_held_in_flight_reports_each_key_once_on_both_sides`,
//! `peer_close_with_sends_in_flight_reports_each_key_once_on_both_sides`,
//! `pausing_receive_stops_delivery_and_pushes_back_on_the_sender_and_resume_delivers_everything_in_order`;
//! and, intermittently, `closing_with_sends_in_flight_reports_each_key_once`
//! (a send the progress thread delivers after the close reported it
//! cancelled).

mod harness;

pub use harness::Sockets;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::Sockets>,
    unsupported = [
        reset = "libfabric 1.17 sockets reports a connection reset by the peer as an orderly \
                 FI_SHUTDOWN (in-flight operations flushed with FI_ECANCELED), so this side \
                 cannot tell a reset from the peer's close",
        shared_receive_pool = "libfabric endpoints post their own registered receive buffers; \
                               sharing them needs shared receive contexts, not implemented",
        partition = "libfabric 1.17 sockets endpoints offer no keepalive or user timeout, so an \
                     unreachable peer cannot be detected (peer_timeout is not enforced)"
    ]
);
