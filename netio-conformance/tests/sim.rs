//! The netio-rs conformance suite on the simulator, in both thread modes.
//! The harness is in `sim_harness`.

mod sim_harness;

netio_conformance::suite!(crate::sim_harness::SimHarness);
