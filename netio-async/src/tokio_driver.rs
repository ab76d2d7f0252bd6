//! A netio loop driven from a tokio runtime, with no thread of its own
//! (feature `tokio`, on by default).
//!
//! [`drive`] is a future that runs a [`MioLoop`] inside tokio: the loop's
//! epoll instance is registered with tokio's reactor, and each time it is
//! readable (a socket is ready, or another thread gave the loop work) or
//! the loop's next timer is due, the future runs one
//! [`turn`](MioLoop::turn) of the loop on whichever tokio thread polls it.
//! Backends created on that loop then serve tokio tasks and the loop's own
//! tasks ([`AsyncBackend::spawn`](crate::AsyncBackend::spawn)) alike.
//!
//! ```
//! use netio_async::{tokio_driver, AsyncBackend};
//! use netio_core::mio_loop::MioLoop;
//! use netio_core::{BackendConfig, ConnectionParams, EndpointAddress, Provider};
//! use netio_tcp::TcpProvider;
//!
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! rt.block_on(async {
//!     let lp = MioLoop::new().unwrap();
//!     let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
//!     let server = AsyncBackend::new(|h| TcpProvider::create(&lp, BackendConfig::default(), h)).unwrap();
//!     let client = AsyncBackend::new(|h| TcpProvider::create(&lp, BackendConfig::default(), h)).unwrap();
//!     let params = ConnectionParams::receive(256, 8);
//!     let addr = server.listen(EndpointAddress::localhost(0), params.clone()).unwrap();
//!     let echo = tokio::spawn(async move {
//!         let conn = server.accept().await.unwrap();
//!         while let Some(m) = conn.recv().await {
//!             conn.send(&m).await.unwrap();
//!         }
//!     });
//!     let conn = client.connect(addr, params).await.unwrap();
//!     conn.send(b"ping").await.unwrap();
//!     assert_eq!(conn.recv().await.unwrap(), b"ping");
//!     conn.close().unwrap();
//!     echo.await.unwrap();
//!     driver.abort();
//! });
//! ```

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Waker};
use std::time::Duration;

use futures::future::{select, Either};
use netio_core::mio_loop::MioLoop;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// The loop's epoll descriptor, as tokio registers it: a handle of the
/// loop, which keeps the descriptor open (a loop closes it only when its
/// last handle is dropped) and always names the same one.
struct LoopFd(MioLoop);

impl AsRawFd for LoopFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Runs `lp` inside the tokio runtime that polls this future, until the
/// future is dropped (abort its task to stop; the loop can be driven or
/// [`run`](netio_core::EventLoop::run) again later). Fails only when tokio
/// cannot register the loop's descriptor (no reactor: a runtime built
/// without `enable_io`).
///
/// The loop's callbacks, and the tasks of its backends, run on the tokio
/// thread that polls this future, one turn at a time; while a turn runs
/// that thread is the loop thread. The loop must not be
/// [`run`](netio_core::EventLoop::run) elsewhere meanwhile.
pub async fn drive(lp: MioLoop) -> io::Result<()> {
    // SAFETY: `LoopFd` holds a handle of the loop for as long as the
    // `AsyncFd` lives, so the descriptor stays open, and it returns the
    // loop's one epoll descriptor every time.
    let fd = unsafe { AsyncFd::register_with_interest(LoopFd(lp.clone()), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    // Whether epoll may have something new: not after a yield for work
    // that was waiting already, unless tokio saw the descriptor readable.
    let mut look = true;
    loop {
        let wait = if look {
            lp.turn(Duration::ZERO)
        } else {
            lp.run_pending()
        };
        if wait == Some(Duration::ZERO) {
            // Work waits already: let tokio's other tasks run first.
            tokio::task::yield_now().await;
            look = fd
                .poll_read_ready(&mut Context::from_waker(Waker::noop()))
                .is_ready();
            continue;
        }
        look = true;
        let mut ready = match wait {
            None => fd.readable().await?,
            Some(d) => {
                let readable = std::pin::pin!(fd.readable());
                let timer = std::pin::pin!(tokio::time::sleep(d));
                match select(readable, timer).await {
                    Either::Left((ready, _)) => ready?,
                    // A timer is due.
                    Either::Right(_) => continue,
                }
            }
        };
        // Cleared before the turn: what becomes ready after the turn's
        // look at epoll makes the descriptor readable again.
        ready.clear_ready();
    }
}
