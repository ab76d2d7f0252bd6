//! The netio-rs conformance suite on libfabric's `sockets` provider over
//! 127.0.0.1, in both thread modes.
//!
//! Built only with the `sockets-conformance` feature:
//!
//! ```text
//! cargo test -p netio-libfabric --features sockets-conformance --test conformance_sockets
//! ```
//!
//! `backpressure` is declared unsupported: `sockets` keeps completing sends
//! to a receiver that posts no buffers, so the behaviours that need sends
//! held in flight are ignored. Not in the default test run because of
//! intermittent failures (1–2 behaviours in 5 of 8 runs, a different mix
//! each time; see `docs/libfabric.md`):
//! `closing_with_sends_in_flight_reports_each_key_once` (a send the progress
//! thread delivers after the close reported it cancelled),
//! `accepted_connection_can_be_closed_by_its_handle` (a connect reported
//! refused), `handler_can_send_and_close_inside_callbacks`,
//! `a_refused_chunk_send_gives_the_chunk_back_unchanged`.

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
                     unreachable peer cannot be detected (peer_timeout is not enforced)",
        backpressure = "libfabric 1.17 sockets keeps completing sends to a receiver that posts no \
                        buffers (its progress thread buffers them without bound), so a sender \
                        is never pushed back and no send can be held in flight"
    ]
);
