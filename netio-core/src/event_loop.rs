//! The event loop contract: run/stop, signals and timers.
//!
//! A loop runs on one thread: [`EventLoop::run`] calls the init callback
//! first, then dispatches events (network readiness, signals, timers) until
//! [`EventLoop::stop`] is called from any thread. Every callback runs on the
//! loop thread and must not block.
//!
//! The real loop ([`crate::mio_loop::MioLoop`]) waits on epoll through mio;
//! the simulator's loop runs on virtual time. Generic code gets signals and
//! timers from whatever loop its provider runs on
//! ([`Provider::Loop`](crate::Provider::Loop)).

use std::time::Duration;

/// An event loop.
pub trait EventLoop: Send + Sync + 'static {
    /// The signal type of this loop.
    type Signal: Signal;
    /// The timer type of this loop.
    type Timer: Timer;

    /// Runs the loop on the calling thread: calls `init` first, before any
    /// other event, then dispatches until [`stop`](Self::stop). A `stop`
    /// that came before `run` makes `run` return right after `init`.
    fn run<F: FnOnce()>(&self, init: F);

    /// Makes `run` return after the callback now running (if any). May be
    /// called from any thread, or from a callback.
    fn stop(&self);

    /// Creates a signal whose callback runs on the loop thread once per
    /// [`Signal::fire`]. User data is whatever the closure captures.
    fn signal<F: FnMut() + Send + 'static>(&self, callback: F) -> Self::Signal;

    /// Creates a timer, stopped, whose callback runs on the loop thread once
    /// per period after [`Timer::start`].
    fn timer<F: FnMut() + Send + 'static>(&self, callback: F) -> Self::Timer;

    /// `true` when called on the thread running this loop (inside `run`).
    fn on_loop_thread(&self) -> bool;

    /// The loop's clock: time since the loop was created on a real loop,
    /// virtual time on the simulator. Code that reads time only here stays
    /// deterministic on the simulator.
    fn now(&self) -> Duration;

    /// Runs `f` once on the loop thread, soon; never from inside this call.
    /// Callable from any thread.
    fn post<F: FnOnce() + Send + 'static>(&self, f: F);
}

/// A signal: fired from any thread, its callback runs on the loop thread
/// once per fire (semaphore semantics: three fires, three calls).
///
/// Clones fire the same signal. When the last clone is dropped the signal is
/// removed from its loop; fires not yet dispatched are discarded.
pub trait Signal: Clone + Send + Sync + 'static {
    /// Fires the signal. Never blocks; callable from any thread, including
    /// the loop thread.
    fn fire(&self);
}

/// A periodic timer. Dropping it stops it and removes it from its loop.
pub trait Timer: Send + Sync + 'static {
    /// Starts (or restarts, with a new period) the timer: the callback runs
    /// every `period`, the first time one period from now. Callable from any
    /// thread.
    ///
    /// A zero period is treated as one nanosecond.
    fn start(&self, period: Duration);

    /// Stops the timer; the callback does not run again until the next
    /// `start`.
    fn stop(&self);

    /// Starts with a period in seconds.
    fn start_s(&self, s: u64) {
        self.start(Duration::from_secs(s))
    }

    /// Starts with a period in milliseconds.
    fn start_ms(&self, ms: u64) {
        self.start(Duration::from_millis(ms))
    }

    /// Starts with a period in microseconds.
    fn start_us(&self, us: u64) {
        self.start(Duration::from_micros(us))
    }

    /// Starts with a period in nanoseconds.
    fn start_ns(&self, ns: u64) {
        self.start(Duration::from_nanos(ns))
    }
}

/// A small process-unique number for the calling thread (never 0), cheaper
/// to compare than [`std::thread::ThreadId`]. Loops record the token of the
/// thread running them so backends can check the caller in thread-unsafe
/// mode.
#[inline]
pub fn thread_token() -> u64 {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: Cell<u64> = const { Cell::new(0) };
    }
    TOKEN.with(|t| {
        if t.get() == 0 {
            t.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn thread_tokens_differ_between_threads_and_stay_fixed() {
        let a = super::thread_token();
        assert_eq!(a, super::thread_token());
        let b = std::thread::spawn(super::thread_token).join().unwrap();
        assert_ne!(a, b);
        assert_ne!(a, 0);
    }
}
