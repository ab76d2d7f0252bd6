//! The netio-rs conformance suite on reliable-datagram endpoints over
//! libfabric's `udp;ofi_rxd` on 127.0.0.1, in both thread modes.
//!
//! Not part of the test command: `udp;ofi_rxd` completes a send only when
//! the receiving process has read its completion queue (its data progress
//! is manual and a send waits for the receiver's acknowledgement), so the
//! suite's behaviours that hold the peer's loop back and wait for the
//! sender's completions (`messages_before_a_peer_close_are_delivered_before_the_close`,
//! `messages_before_a_reset_are_delivered_before_the_close`,
//! `pause_then_peer_close_reports_the_close_after_the_held_messages`,
//! `sender_close_after_completions_delivers_everything_before_the_peer_hears_of_it`,
//! both thread modes) time out; the other 153 pass. Run it with
//!
//! ```text
//! cargo test -p netio-libfabric --features rxd-conformance --test conformance_rdm_udp_rxd
//! ```
#![cfg(feature = "rxd-conformance")]

mod harness;

pub use harness::RdmUdpRxd;

netio_conformance::suite!(
    netio_conformance::mio::MioHarness<crate::RdmUdpRxd>,
    unsupported = [
        shared_receive_pool = "not implemented on reliable-datagram endpoints yet",
        one_local_port = "netio-libfabric has no setting for the source port of its control \
                          channels"
    ]
);
