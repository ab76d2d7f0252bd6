//! netio-rs: move messages between processes and hosts through one
//! contract, over whichever provider is compiled in.
//!
//! This crate re-exports [`netio_core`] (the traits and types every
//! application uses: [`Backend`], [`Handler`], connection handles
//! [`ConnId`] and the [`ConnTable`] to keep per-connection state in, the
//! errors including [`ConnError`], [`TimerQueue`], …) and the provider
//! crates behind Cargo features:
//!
//! | feature | provider | loop |
//! |---|---|---|
//! | `sim` (default) | [`sim`]: deterministic in-memory fabric | [`sim::SimLoop`] |
//! | `tcp` (default) | [`tcp`]: TCP on mio, wire format of `docs/wire-format.md` | [`mio_loop::MioLoop`] |
//! | `libfabric` | `libfabric`: libfabric `FI_EP_MSG` endpoints (fabric provider from `NETIO_LIBFABRIC_PROVIDER`: `tcp`, `sockets`, `verbs`; see `docs/libfabric.md`) | [`mio_loop::MioLoop`] |
//!
//! Applications are written generically (`fn app<B: Backend>`) for static
//! dispatch, or pick a provider by name at run time with [`create_backend`]
//! and use it as `Box<dyn Backend>`. Connections are named by the
//! [`ConnId`] handle that `open_active_endpoint` returns (or that comes with
//! `on_connection_established` on the accepting side):
//!
//! ```
//! # #[cfg(feature = "sim")] {
//! use netio::{AnyLoop, Backend, BackendConfig, ConnectionParams, EndpointAddress, NoopHandler};
//!
//! let lp = AnyLoop::for_provider("sim").unwrap();
//! let backend: Box<dyn Backend> =
//!     netio::create_backend("sim", &lp, BackendConfig::default(), NoopHandler).unwrap();
//! let ip = lp.local_ip();
//! let addr = backend
//!     .open_listen_endpoint(EndpointAddress::new(ip, 0), ConnectionParams::receive(64, 4))
//!     .unwrap();
//! assert_ne!(addr.port(), 0);
//! // Two connections to one address are two connections, with two handles.
//! let a = backend.open_active_endpoint(addr, ConnectionParams::receive(64, 4)).unwrap();
//! let b = backend.open_active_endpoint(addr, ConnectionParams::receive(64, 4)).unwrap();
//! assert_ne!(a, b);
//! assert_eq!(backend.remote_address(b).unwrap(), addr);
//! assert_eq!(backend.connection_to(addr).unwrap(), a); // the oldest
//! assert!(netio::create_backend("nope", &lp, BackendConfig::default(), NoopHandler).is_err());
//! # }
//! ```
//!
//! The same over TCP on 127.0.0.1, with the real event loop running on its
//! own thread:
//!
//! ```
//! # #[cfg(feature = "tcp")] {
//! use netio::{AnyLoop, Backend, BackendConfig, ConnectionParams, EndpointAddress, NoopHandler};
//!
//! let lp = AnyLoop::for_provider("tcp").unwrap();
//! let backend: Box<dyn Backend> =
//!     netio::create_backend("tcp", &lp, BackendConfig::default(), NoopHandler).unwrap();
//! let addr = backend
//!     .open_listen_endpoint(EndpointAddress::new(lp.local_ip(), 0), ConnectionParams::receive(64, 4))
//!     .unwrap();
//! assert_ne!(addr.port(), 0);
//! let runner = lp.clone();
//! let t = std::thread::spawn(move || runner.run(|| {}));
//! lp.stop();
//! t.join().unwrap();
//! # }
//! ```
#![warn(missing_docs)]

use std::net::{IpAddr, Ipv4Addr};

pub use netio_core::*;

#[cfg(feature = "async")]
pub use netio_async as aio;
#[cfg(feature = "libfabric")]
pub use netio_libfabric as libfabric;
#[cfg(feature = "sim")]
pub use netio_sim as sim;
#[cfg(feature = "tcp")]
pub use netio_tcp as tcp;

/// Names of the providers compiled in, for [`create_backend`].
pub fn providers() -> &'static [&'static str] {
    &[
        #[cfg(feature = "sim")]
        "sim",
        #[cfg(feature = "tcp")]
        "tcp",
        #[cfg(feature = "libfabric")]
        "libfabric",
    ]
}

/// An event loop of any compiled-in provider, for run-time selection.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyLoop {
    /// The simulator's loop (one virtual host of a fresh world).
    #[cfg(feature = "sim")]
    Sim(netio_sim::SimLoop),
    /// The real event loop on mio, used by the socket providers (`"tcp"`).
    Mio(mio_loop::MioLoop),
}

impl AnyLoop {
    /// A new loop of the kind the named provider runs on: for `"sim"`, the
    /// loop of the first host (127.0.0.1) of a new simulated world; for
    /// `"tcp"`, a new [`MioLoop`](mio_loop::MioLoop) (failing with
    /// [`CreateError::Failed`] if the system refuses its epoll instance).
    pub fn for_provider(name: &str) -> Result<Self, CreateError> {
        match name {
            #[cfg(feature = "sim")]
            "sim" => Ok(Self::Sim(
                netio_sim::Sim::new().next_host().event_loop().clone(),
            )),
            #[cfg(any(feature = "tcp", feature = "libfabric"))]
            "tcp" | "libfabric" => Ok(Self::Mio(
                mio_loop::MioLoop::new().map_err(|e| CreateError::Failed(Box::new(e)))?,
            )),
            _ => Err(CreateError::UnknownProvider(name.to_owned())),
        }
    }

    /// The address backends on this loop listen on: the virtual host's
    /// address for the simulator, 127.0.0.1 otherwise.
    pub fn local_ip(&self) -> IpAddr {
        match self {
            #[cfg(feature = "sim")]
            Self::Sim(l) => l.ip(),
            Self::Mio(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// Runs the loop on this thread: `init` first, then events until
    /// [`AnyLoop::stop`].
    pub fn run<F: FnOnce()>(&self, init: F) {
        match self {
            #[cfg(feature = "sim")]
            Self::Sim(l) => l.run(init),
            Self::Mio(l) => l.run(init),
        }
    }

    /// Makes `run` return; callable from any thread.
    pub fn stop(&self) {
        match self {
            #[cfg(feature = "sim")]
            Self::Sim(l) => l.stop(),
            Self::Mio(l) => l.stop(),
        }
    }
}

/// Creates a backend of the provider called `name` on `event_loop`, as a
/// `Box<dyn Backend>`, reporting to `handler`.
///
/// Fails with [`CreateError::UnknownProvider`] for a name not in
/// [`providers`], and with [`CreateError::InvalidConfig`] when the loop is
/// not of the kind the provider runs on.
#[cfg_attr(
    not(any(feature = "sim", feature = "tcp", feature = "libfabric")),
    allow(unused_variables)
)]
pub fn create_backend<H>(
    name: &str,
    event_loop: &AnyLoop,
    config: BackendConfig,
    handler: H,
) -> Result<Box<dyn Backend>, CreateError>
where
    H: Handler<dyn Backend> + 'static,
{
    match (name, event_loop) {
        #[cfg(feature = "sim")]
        ("sim", AnyLoop::Sim(l)) => Ok(Box::new(<netio_sim::SimProvider as Provider>::create(
            l,
            config,
            DynHandler(handler),
        )?)),
        #[cfg(feature = "tcp")]
        ("tcp", AnyLoop::Mio(l)) => Ok(Box::new(<netio_tcp::TcpProvider as Provider>::create(
            l,
            config,
            DynHandler(handler),
        )?)),
        #[cfg(feature = "libfabric")]
        ("libfabric", AnyLoop::Mio(l)) => Ok(Box::new(
            <netio_libfabric::LibfabricProvider as Provider>::create(
                l,
                config,
                DynHandler(handler),
            )?,
        )),
        _ if !providers().contains(&name) => Err(CreateError::UnknownProvider(name.to_owned())),
        _ => Err(CreateError::InvalidConfig(format!(
            "provider `{name}` cannot run on this kind of event loop ({event_loop:?})"
        ))),
    }
}

/// The code of `docs/user-guide.md`, compiled and run as doc tests so the
/// guide cannot drift from the API.
#[cfg(all(doctest, feature = "sim", feature = "tcp"))]
#[doc = include_str!("../../docs/user-guide.md")]
pub struct UserGuide;
