//! The checks every provider makes first, in the same order, before an
//! operation touches its transport: the calling thread, the address, the
//! parameters, the header. A provider (a third-party one too) calls these
//! so that every provider answers bad input with the same error.
//!
//! ```
//! use netio_core::{preamble, BackendConfig, ConnectionParams, EndpointAddress, OpenActiveError};
//!
//! let config = BackendConfig::default();
//! let unspecified: EndpointAddress = "0.0.0.0:5000".parse().unwrap();
//! let params = ConnectionParams::receive(64, 4);
//! assert!(matches!(
//!     preamble::open_active(true, unspecified, &params, &config),
//!     Err(OpenActiveError::InvalidEndpointAddress { .. })
//! ));
//! assert!(matches!(
//!     preamble::open_active(false, unspecified, &params, &config),
//!     Err(OpenActiveError::WrongThread)
//! ));
//! ```

use crate::{
    BackendConfig, ConnectionParams, EndpointAddress, OpenActiveError, OpenListenError, SendError,
    MAX_HEADER_LEN,
};

/// `open_active_endpoint`'s first checks: `thread_ok` (the call is allowed
/// on this thread, see [`ThreadSafety`](crate::ThreadSafety)), a remote
/// address (not unspecified, port 0, multicast or broadcast), valid
/// parameters for `config`.
pub fn open_active(
    thread_ok: bool,
    address: EndpointAddress,
    params: &ConnectionParams,
    config: &BackendConfig,
) -> Result<(), OpenActiveError> {
    if !thread_ok {
        return Err(OpenActiveError::WrongThread);
    }
    address
        .validate_remote()
        .map_err(|reason| OpenActiveError::InvalidEndpointAddress { address, reason })?;
    params
        .validate(config)
        .map_err(OpenActiveError::InvalidConnectionParameters)
}

/// `open_listen_endpoint`'s first checks: the thread, an address one can
/// listen on (not multicast or broadcast), valid parameters for `config`.
pub fn open_listen(
    thread_ok: bool,
    address: EndpointAddress,
    params: &ConnectionParams,
    config: &BackendConfig,
) -> Result<(), OpenListenError> {
    if !thread_ok {
        return Err(OpenListenError::WrongThread);
    }
    address
        .validate_listen()
        .map_err(|reason| OpenListenError::InvalidEndpointAddress { address, reason })?;
    params
        .validate(config)
        .map_err(OpenListenError::InvalidConnectionParameters)
}

/// `send_data` and `send_data_copy`'s first checks: the thread, a header
/// of at most [`MAX_HEADER_LEN`] bytes.
pub fn send(thread_ok: bool, header: &[u8]) -> Result<(), SendError> {
    if !thread_ok {
        return Err(SendError::WrongThread);
    }
    if header.len() > MAX_HEADER_LEN {
        return Err(SendError::HeaderTooLong {
            len: header.len(),
            max: MAX_HEADER_LEN,
        });
    }
    Ok(())
}
