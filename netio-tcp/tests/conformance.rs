//! The netio-rs conformance suite on TCP over 127.0.0.1, in both thread
//! modes. `conformance_v6` runs it over ::1, `conformance_busy_poll` on
//! busy-polling loops; the harness is in `conformance_harness`.

mod conformance_harness;

pub use conformance_harness::{TcpHarness, V4};

netio_conformance::suite!(
    crate::TcpHarness<crate::V4>,
    unsupported = [partition =
        "loopback cannot be cut between two backends of one process; see tests/liveness_netns.rs"]
);
