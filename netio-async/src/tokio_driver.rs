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

use std::future::{poll_fn, Future};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

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
///
/// Work that tokio tasks give the loop between its turns (a send, which
/// the provider writes from a closure posted to the loop) wakes this
/// task, not the loop's eventfd ([`MioLoop::set_driver_waker`]): the
/// task then runs what waits without asking epoll, and neither side makes
/// a system call for the hand-over.
pub async fn drive(lp: MioLoop) -> io::Result<()> {
    // SAFETY: `LoopFd` holds a handle of the loop for as long as the
    // `AsyncFd` lives, so the descriptor stays open, and it returns the
    // loop's one epoll descriptor every time.
    let fd = unsafe { AsyncFd::register_with_interest(LoopFd(lp.clone()), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    lp.set_driver_waker(Some(waker));
    let _eventfd_again = DriverGone(&lp);
    // Whether epoll may have something new: not after a yield for work
    // that was waiting already, nor when only announced work woke this
    // task, unless tokio saw the descriptor readable.
    let mut look = true;
    loop {
        let wait = if look {
            lp.turn(Duration::ZERO)
        } else {
            lp.run_pending()
        };
        if wait == Some(Duration::ZERO) {
            // Work waits already: let tokio's other tasks run first.
            // (`tokio::task::yield_now` would also make tokio's next
            // look at its own epoll one of its own, a system call.)
            requeue().await;
            look = fd
                .poll_read_ready(&mut Context::from_waker(Waker::noop()))
                .is_ready();
            continue;
        }
        let mut timer = std::pin::pin!(wait.map(tokio::time::sleep));
        look = poll_fn(|cx| wake_reason(&lp, &fd, timer.as_mut().as_pin_mut(), cx)).await?;
    }
}

/// What the driver waits for after a turn: its descriptor readable
/// (`true`: the next turn looks at epoll), work announced to the loop or
/// the loop's next timer due (`false`: the next turn runs what waits).
fn wake_reason(
    lp: &MioLoop,
    fd: &AsyncFd<LoopFd>,
    timer: Option<Pin<&mut tokio::time::Sleep>>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<bool>> {
    if let Poll::Ready(ready) = fd.poll_read_ready(cx) {
        // Cleared before the turn: what becomes ready after the turn's
        // look at epoll makes the descriptor readable again.
        ready?.clear_ready();
        return Poll::Ready(Ok(true));
    }
    // Checked after this task's waker was left with the loop (and with
    // tokio): an announcement after the check wakes it again.
    if lp.work_announced() || timer.is_some_and(|t| t.poll(cx).is_ready()) {
        return Poll::Ready(Ok(false));
    }
    Poll::Pending
}

/// Pending once, with this task woken at once: it goes behind the tasks
/// that are ready now.
async fn requeue() {
    let mut again = false;
    poll_fn(|cx| {
        if again {
            return Poll::Ready(());
        }
        again = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// Gives the loop back its eventfd wake-ups when the driver stops.
struct DriverGone<'a>(&'a MioLoop);

impl Drop for DriverGone<'_> {
    fn drop(&mut self) {
        self.0.set_driver_waker(None);
    }
}
