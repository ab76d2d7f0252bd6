//! The netio-rs conformance suite on libfabric's `tcp` provider over
//! 127.0.0.1, in both thread modes.

#[macro_use]
mod harness;

pub use harness::Tcp;

tcp_msg_suite!(crate::Tcp);
