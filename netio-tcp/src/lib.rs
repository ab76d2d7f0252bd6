//! TCP provider of netio-rs, on mio.
//!
//! The bytes on the wire are specified in `docs/wire-format.md`; [`wire`]
//! is the sans-IO codec for them (handshake, frame encoding, streaming frame
//! decoder) and touches no socket.

#![warn(missing_docs)]

pub mod wire;
