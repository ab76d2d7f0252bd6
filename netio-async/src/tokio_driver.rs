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
/// task, not the loop's eventfd ([`MioLoop::set_driver_waker`]): neither
/// side makes a system call for the hand-over.
///
/// A peer in the same process or on the same host often answers what a
/// turn's work wrote at once. So the turn that runs announced work looks
/// at epoll right after it, and after a turn that handed readiness over
/// this task lets the tasks it woke run and then looks again, rather than
/// wait for tokio's reactor to report the answer (an `epoll_wait` of
/// tokio's and another poll of this task). While such looks find nothing
/// (the peer is far, or does not answer), they are made ever more rarely,
/// down to one in 64.
pub async fn drive(lp: MioLoop) -> io::Result<()> {
    // SAFETY: `LoopFd` holds a handle of the loop for as long as the
    // `AsyncFd` lives, so the descriptor stays open, and it returns the
    // loop's one epoll descriptor every time.
    let fd = unsafe { AsyncFd::register_with_interest(LoopFd(lp.clone()), Interest::READABLE) }
        .map_err(|e| e.into_parts().1)?;
    let waker = poll_fn(|cx| Poll::Ready(cx.waker().clone())).await;
    lp.set_driver_waker(Some(waker));
    let _eventfd_again = DriverGone(&lp);
    // Whether a look at epoll right after work pays (see `Answers`).
    let mut answers = Answers::default();
    let mut wake = Wake::Ready;
    loop {
        let (wait, found) = match wake {
            Wake::Ready => (lp.turn(Duration::ZERO), lp.turn_found_events()),
            Wake::Announced | Wake::Again if answers.look() => {
                let wait = lp.turn(Duration::ZERO);
                let found = lp.turn_found_events();
                answers.found(found);
                (wait, found)
            }
            Wake::Announced | Wake::Again | Wake::Pending => (lp.run_pending(), false),
        };
        if found && wait != Some(Duration::ZERO) {
            // The turn handed readiness over, and its callbacks, or the
            // tasks they woke, may write what a near peer answers at once:
            // let those tasks run, then look again rather than wait for
            // tokio's reactor.
            requeue().await;
            wake = Wake::Again;
            continue;
        }
        if wait == Some(Duration::ZERO) {
            // Work waits already: let tokio's other tasks run first.
            // (`tokio::task::yield_now` would also make tokio's next
            // look at its own epoll one of its own, a system call.)
            requeue().await;
            // No look at epoll for work that was waiting already, unless
            // tokio saw the descriptor readable meanwhile.
            wake = if fd
                .poll_read_ready(&mut Context::from_waker(Waker::noop()))
                .is_ready()
            {
                Wake::Ready
            } else {
                Wake::Pending
            };
            continue;
        }
        let mut timer = std::pin::pin!(wait.map(tokio::time::sleep));
        wake = poll_fn(|cx| wake_reason(&lp, &fd, timer.as_mut().as_pin_mut(), cx)).await?;
    }
}

/// Why the driver runs its next turn.
#[derive(Clone, Copy)]
enum Wake {
    /// Its descriptor is readable: the turn looks at epoll.
    Ready,
    /// Work was announced to the loop: the turn runs it, and looks at
    /// epoll after it while such looks pay ([`Answers`]).
    Announced,
    /// The last turn handed readiness over and the tasks it woke ran
    /// since: the turn runs what they gave the loop and looks at epoll,
    /// while such looks pay.
    Again,
    /// Work waits already (left by the last turn), or the loop's next
    /// timer is due: the turn runs what waits, with no look.
    Pending,
}

/// Whether a look at epoll right after work pays: it does while such
/// looks find readiness (the work's writes answered at once); after each
/// one that finds none, twice as many of the turns that would look skip
/// the look as before, up to 63 in a row.
#[derive(Default)]
struct Answers {
    /// Looks in a row that found nothing (at most 6).
    misses: u32,
    /// Turns still to run without a look.
    skip: u32,
}

impl Answers {
    /// Whether this turn looks.
    fn look(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// What the look found.
    fn found(&mut self, found: bool) {
        if found {
            self.misses = 0;
        } else {
            self.misses = (self.misses + 1).min(6);
            self.skip = (1 << self.misses) - 1;
        }
    }
}

/// What the driver waits for after a turn: its descriptor readable, work
/// announced to the loop, or the loop's next timer due.
fn wake_reason(
    lp: &MioLoop,
    fd: &AsyncFd<LoopFd>,
    timer: Option<Pin<&mut tokio::time::Sleep>>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<Wake>> {
    if let Poll::Ready(ready) = fd.poll_read_ready(cx) {
        // Cleared before the turn: what becomes ready after the turn's
        // look at epoll makes the descriptor readable again.
        ready?.clear_ready();
        return Poll::Ready(Ok(Wake::Ready));
    }
    // Checked after this task's waker was left with the loop (and with
    // tokio): an announcement after the check wakes it again.
    if lp.work_announced() {
        return Poll::Ready(Ok(Wake::Announced));
    }
    if timer.is_some_and(|t| t.poll(cx).is_ready()) {
        return Poll::Ready(Ok(Wake::Pending));
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

#[cfg(test)]
mod tests {
    use super::Answers;

    /// The turns that look, out of `turns`, with every look answered by
    /// `found`.
    fn looks(answers: &mut Answers, turns: usize, found: bool) -> usize {
        (0..turns)
            .filter(|_| {
                let look = answers.look();
                if look {
                    answers.found(found);
                }
                look
            })
            .count()
    }

    #[test]
    fn looks_that_find_something_go_on_every_turn() {
        let mut a = Answers::default();
        assert_eq!(looks(&mut a, 100, true), 100);
    }

    /// After each look that finds nothing, twice as many turns skip it
    /// (1, 3, 7, ... 63), then one in 64 looks; a look that finds
    /// something brings the looks back on every turn.
    #[test]
    fn looks_that_find_nothing_back_off_to_one_in_64_turns_until_one_finds_something() {
        let mut a = Answers::default();
        let pattern: Vec<bool> = (0..130)
            .map(|_| {
                let look = a.look();
                if look {
                    a.found(false);
                }
                look
            })
            .collect();
        let at: Vec<usize> = (0..pattern.len()).filter(|&i| pattern[i]).collect();
        assert_eq!(at, [0, 2, 6, 14, 30, 62, 126]);
        assert_eq!(looks(&mut a, 640, false), 10, "one in 64 at most");
        // The next look finds something: every turn looks again.
        while !a.look() {}
        a.found(true);
        assert_eq!(looks(&mut a, 10, true), 10);
    }
}
