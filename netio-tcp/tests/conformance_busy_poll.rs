//! The netio-rs conformance suite on TCP over 127.0.0.1 with busy-polling
//! event loops (`LoopConfig { busy_poll: true, .. }`), in both thread
//! modes.
//!
//! A busy-polling loop thread keeps a core busy for as long as it runs, so
//! the harness runs one test of this binary at a time, whatever
//! `--test-threads` says (the machines this runs on may have two cores).

mod conformance_harness;

netio_conformance::suite!(
    crate::conformance_harness::TcpHarness<crate::conformance_harness::V4BusyPoll>
);
