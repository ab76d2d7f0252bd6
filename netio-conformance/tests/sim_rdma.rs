//! The netio-rs conformance suite on the simulator under its RDMA profile
//! (every backend in `NetworkMode::Rdma`: a send completes when the
//! receiver has the message), in both thread modes. `tests/sim.rs` runs it
//! under the default TCP profile.

mod sim_harness;

netio_conformance::suite!(crate::sim_harness::SimRdmaHarness);
