//! The behavioural suite every netio-rs provider must pass.
#![warn(missing_docs)]

mod harness;
pub use harness::Harness;
