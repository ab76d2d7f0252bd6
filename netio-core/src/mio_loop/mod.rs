//! The real event loop, on mio (epoll on Linux).
//!
//! [`MioLoop`] implements [`EventLoop`](crate::EventLoop): one thread calls
//! [`run`](crate::EventLoop::run) and dispatches, on that thread, in turns:
//!
//! 1. readiness events of registered sources ([`MioLoop::register`]), one
//!    callback per mio event;
//! 2. closures handed to [`MioLoop::post`];
//! 3. fired signals ([`MioSignal`]), one callback per fire;
//! 4. due timers ([`MioTimer`]);
//!
//! then sleeps in epoll until a source is ready, another thread announces
//! work through the loop's waker (an eventfd), or the earliest timer is due.
//! With [`LoopConfig::busy_poll`] it never sleeps: it polls with a zero
//! timeout in a tight loop, trading a core for latency.
//!
//! Every callback may call back into the loop: register and deregister
//! sources, fire signals, start and stop timers, post, stop. The loop never
//! holds an internal lock while user code runs: it takes a callback out, calls
//! it, and puts it back if it is still registered, also when the callback
//! panicked (the panic ends `run`; the callback runs again at its next event
//! once the loop runs again). [`stop`](crate::EventLoop::stop)
//! takes effect after the callback now running; what was not dispatched yet
//! waits for the next `run`.
//!
//! # Example
//!
//! Hello world: init fires a signal, the signal starts a timer, the timer
//! stops the loop after three ticks.
//!
//! ```
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//!
//! use netio_core::mio_loop::MioLoop;
//! use netio_core::{EventLoop, Signal, Timer};
//!
//! # fn main() -> std::io::Result<()> {
//! let event_loop = MioLoop::new()?;
//! let ticks = Arc::new(AtomicU32::new(0));
//!
//! let timer = event_loop.timer({
//!     let event_loop = event_loop.clone();
//!     let ticks = Arc::clone(&ticks);
//!     move || {
//!         if ticks.fetch_add(1, Ordering::Relaxed) + 1 == 3 {
//!             event_loop.stop();
//!         }
//!     }
//! });
//! let start_timer = event_loop.signal(move || timer.start_ms(1));
//!
//! event_loop.run(|| {
//!     println!("Hello, NetIO!");
//!     start_timer.fire();
//! });
//! assert_eq!(ticks.load(Ordering::Relaxed), 3);
//!
//! // The signal owns the timer, whose callback holds a loop handle: dropping
//! // the signal releases both, and dropping `event_loop` then frees the loop.
//! drop(start_timer);
//! drop(event_loop);
//! # Ok(())
//! # }
//! ```
//!
//! # Sources
//!
//! Any [`mio::event::Source`] can be registered: mio's sockets, or a raw fd
//! through [`mio::unix::SourceFd`]. mio is edge-triggered, so a callback
//! reads or writes until `WouldBlock`.
//!
//! ```
//! use std::io::{Read, Write};
//! use std::os::fd::AsRawFd;
//! use std::sync::mpsc;
//!
//! use mio::net::UnixStream;
//! use mio::unix::SourceFd;
//! use mio::Interest;
//! use netio_core::mio_loop::MioLoop;
//! use netio_core::EventLoop;
//!
//! # fn main() -> std::io::Result<()> {
//! let event_loop = MioLoop::new()?;
//! let (mut a, mut b) = UnixStream::pair()?;
//! let (tx, rx) = mpsc::channel();
//! let stopper = event_loop.clone();
//! let fd = b.as_raw_fd();
//! let id = event_loop.register(&mut SourceFd(&fd), Interest::READABLE, move |event| {
//!     if event.is_readable() {
//!         let mut buf = [0u8; 16];
//!         let n = b.read(&mut buf).unwrap_or(0);
//!         tx.send(buf[..n].to_vec()).unwrap();
//!         stopper.stop();
//!     }
//! })?;
//! a.write_all(b"ping")?;
//! event_loop.run(|| {});
//! assert_eq!(rx.recv().unwrap(), b"ping");
//! event_loop.deregister(&mut SourceFd(&fd), id)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Threads and memory
//!
//! Signals and timers hold a weak reference to their loop; the loop's
//! handles are the [`MioLoop`] clones. Dropping the last handle drops every
//! callback the loop holds and closes its file descriptors. A callback that
//! needs the loop can capture a [`WeakMioLoop`] ([`MioLoop::downgrade`]) so
//! the loop does not keep itself alive through it.
//!
//! What threads share with the loop (signals' pending-fire counts and
//! callback slots, the ready queue, the wake-up flag, posted closures, the
//! stop request, timer deadlines), the loop's drains of it, and its two
//! decisions (must a thread that announced work write the eventfd? may the
//! loop sleep, and how long?) live in mio-free pieces that use the crate's
//! `sync` shims, and are model-checked with loom, epoll being a stand-in
//! that records wake-ups: fires from several threads, posts from two
//! threads and from inside a closure, a stop from another thread, a timer
//! started, stopped and restarted from another thread while the loop fires
//! it, a signal dropped inside its own callback or from another thread
//! while it fires (the models bound preemptions to 3 per execution unless
//! `LOOM_MAX_PREEMPTIONS` says otherwise, and finish in seconds):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p netio-core --release --lib mio_loop::
//! ```
//!
//! Under `--cfg loom` only those pieces are compiled; the mio loop is not.

mod cadence;
mod control;
#[cfg(not(loom))]
mod loop_lock;
mod posts;
mod signal_queue;
mod taken;

#[cfg(all(test, loom))]
mod loom_models;
#[cfg(not(loom))]
mod reactor;
mod timers;

#[cfg(not(loom))]
pub use loop_lock::{LoopLock, LoopLockGuard};
#[cfg(not(loom))]
pub use reactor::{LoopConfig, MioLoop, MioSignal, MioTimer, SourceId, SpinId, WeakMioLoop};
