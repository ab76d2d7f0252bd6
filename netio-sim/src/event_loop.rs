//! [`SimLoop`]: a host's event loop on virtual time, with its signals and
//! timers.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{EventLoop, Signal, Timer};

use crate::world::UserFn;
use crate::{assert_not_in_callback, Sim};

/// The event loop of a virtual host. Cheap to clone: clones are handles to
/// the same loop.
///
/// [`run`](EventLoop::run) drives the *whole* world (every host shares one
/// clock) until this loop's [`stop`](EventLoop::stop). When nothing is
/// scheduled it blocks, like a real idle loop, until another thread calls a
/// backend, fires a signal, starts a timer or stops the loop; it never
/// returns just because the world is idle. Tests usually drive the world
/// with [`Sim::run_until`] and friends instead.
///
/// Signals and timers run on virtual time: a timer with a period of one
/// second fires every simulated second, as fast as the world is driven.
#[derive(Clone)]
pub struct SimLoop {
    sim: Sim,
    ip: IpAddr,
}

impl SimLoop {
    pub(crate) fn new(sim: Sim, ip: IpAddr) -> Self {
        Self { sim, ip }
    }

    /// The address of the loop's host.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The world the loop belongs to.
    pub fn sim(&self) -> &Sim {
        &self.sim
    }
}

impl fmt::Debug for SimLoop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimLoop").field("host", &self.ip).finish()
    }
}

impl EventLoop for SimLoop {
    type Signal = SimSignal;
    type Timer = SimTimer;

    /// Makes the calling thread the driver, calls `init`, then runs events
    /// until [`stop`](EventLoop::stop), waiting (in real time) whenever
    /// nothing is scheduled.
    ///
    /// # Panics
    /// If called from inside a simulator callback.
    fn run<F: FnOnce()>(&self, init: F) {
        assert_not_in_callback("SimLoop::run");
        self.sim.world().driver = netio_core::thread_token();
        let _driving = crate::DrivingGuard::enter(&self.sim);
        init();
        loop {
            let done = self.sim.drive(u64::MAX, true, usize::MAX, Some(self.ip));
            if done.stopped {
                return;
            }
            if done.yielded {
                continue;
            }
            let shared = &self.sim.shared;
            let mut g = self.sim.lock_world();
            crate::placed(&mut g).waiters += 1;
            loop {
                let w = crate::placed(&mut g);
                if w.has_work() || w.host_mut(self.ip).stop {
                    break;
                }
                g = shared.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            crate::placed(&mut g).waiters -= 1;
        }
    }

    fn stop(&self) {
        self.sim.with(|w| w.host_mut(self.ip).stop = true);
        // Wake a runner blocked on an idle world even if it registered as
        // a waiter after the check in `with`.
        self.sim.shared.wake.notify_all();
    }

    fn signal<F: FnMut() + Send + 'static>(&self, callback: F) -> SimSignal {
        let f: UserFn = Arc::new(Mutex::new(Box::new(callback)));
        let id = self.sim.with(|w| w.add_signal(self.ip, f));
        SimSignal {
            inner: Arc::new(SignalInner {
                lp: self.clone(),
                id,
            }),
        }
    }

    fn timer<F: FnMut() + Send + 'static>(&self, callback: F) -> SimTimer {
        let f: UserFn = Arc::new(Mutex::new(Box::new(callback)));
        let id = self.sim.with(|w| w.add_timer(self.ip, f));
        SimTimer {
            lp: self.clone(),
            id,
        }
    }

    /// `true` while the calling thread drives the world: inside
    /// [`run`](EventLoop::run) (init included) or inside a callback
    /// dispatched by [`Sim::step`] and the other driving methods.
    ///
    /// Thread-unsafe backends are more lenient: they accept calls from the
    /// thread that drives or last drove the world, so a test thread that
    /// steps the world may call them between steps.
    fn on_loop_thread(&self) -> bool {
        self.sim.driving_here()
    }

    /// Virtual time ([`Sim::now`]).
    fn now(&self) -> Duration {
        self.sim.now()
    }

    /// Schedules `f` at the current virtual time; it runs when the world
    /// is driven, as this host's callback (held while the loop is paused).
    fn post<F: FnOnce() + Send + 'static>(&self, f: F) {
        self.sim.with(|w| w.post(self.ip, Box::new(f)));
    }
}

struct SignalInner {
    lp: SimLoop,
    id: u64,
}

impl Drop for SignalInner {
    fn drop(&mut self) {
        // The callback is dropped after the world is unlocked: it may own
        // handles whose own drop locks the world.
        let f = self.lp.sim.with(|w| w.remove_signal(self.id));
        drop(f);
    }
}

/// A signal of a [`SimLoop`]: each [`fire`](Signal::fire), from any thread,
/// schedules one run of its callback at the current virtual time. Clones
/// fire the same signal; when the last is dropped, fires not yet run are
/// discarded.
#[derive(Clone)]
pub struct SimSignal {
    inner: Arc<SignalInner>,
}

impl Signal for SimSignal {
    fn fire(&self) {
        self.inner.lp.sim.with(|w| w.fire_signal(self.inner.id));
    }
}

impl fmt::Debug for SimSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSignal")
            .field("host", &self.inner.lp.ip)
            .field("id", &self.inner.id)
            .finish()
    }
}

/// A periodic timer of a [`SimLoop`], on virtual time. Dropping it stops it
/// and removes it from the world.
pub struct SimTimer {
    lp: SimLoop,
    id: u64,
}

impl Timer for SimTimer {
    fn start(&self, period: Duration) {
        self.lp.sim.with(|w| w.start_timer(self.id, period));
    }

    fn stop(&self) {
        self.lp.sim.with(|w| w.stop_timer(self.id));
    }
}

impl Drop for SimTimer {
    fn drop(&mut self) {
        let f = self.lp.sim.with(|w| w.remove_timer(self.id));
        drop(f);
    }
}

impl fmt::Debug for SimTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimTimer")
            .field("host", &self.lp.ip)
            .field("id", &self.id)
            .finish()
    }
}
