//! Where the world lives while it is driven.
//!
//! The world sits in a mutex ([`Slot`]). The thread that drives it keeps
//! that mutex locked for a whole run of steps. Around each callback it
//! either unlocks it, so that any thread can call in while the callback
//! runs (the default), or, in a driver-only world
//! ([`Sim::set_driver_only`](crate::Sim::set_driver_only)), *lends* the
//! world to itself: the boxed world moves from the slot into a
//! thread-local cell, and every call the callback makes into the world (a
//! send, a timer, a fault) takes it from there instead of from the mutex,
//! which saves a lock round per call and two per callback. Another thread
//! that calls in while such a world is driven cannot wait for it (a
//! callback may wait for that thread: a deadlock), so it panics.
//!
//! Everything here is safe code: the world moves by value (a `Box`), so
//! at most one place holds it at any time.

use std::cell::Cell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

use crate::world::World;

/// The world's place in its mutex: `None` only while the thread holding
/// the mutex has lent the world to its callbacks.
pub(crate) type Slot = Option<Box<World>>;

thread_local! {
    /// The world (by address of its shared state) lent to this thread's
    /// callbacks, or 0.
    static LENT_TO: Cell<usize> = const { Cell::new(0) };
    /// The lent world; `None` while a [`WorldGuard`] has it.
    static LENT: Cell<Option<Box<World>>> = const { Cell::new(None) };
}

/// The world's mutex and what is known about who holds it.
pub(crate) struct Place {
    slot: Mutex<Slot>,
    /// Threads waiting for the mutex while a driver holds it.
    waiting: AtomicUsize,
    /// Whether the world is driver-only (see the module docs).
    driver_only: AtomicBool,
    /// The thread (`netio_core::thread_token`) driving the world in a
    /// driver-only world, or 0.
    driving: AtomicU64,
}

impl Place {
    pub(crate) fn new(world: World) -> Self {
        Self {
            slot: Mutex::new(Some(Box::new(world))),
            waiting: AtomicUsize::new(0),
            driver_only: AtomicBool::new(false),
            driving: AtomicU64::new(0),
        }
    }

    /// Whether some thread waits for the world.
    #[inline]
    pub(crate) fn waited_for(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn set_driver_only(&self, on: bool) {
        self.driver_only.store(on, Ordering::Relaxed);
    }

    /// Locks the world's mutex, counting the caller as waiting while it
    /// waits. A poisoned mutex is taken as it is (no operation panics
    /// halfway through a change of the world; callbacks run outside it).
    ///
    /// # Panics
    /// In a driver-only world, if another thread drives it (now, or
    /// starts to while the caller waits).
    #[inline(always)]
    pub(crate) fn lock(&self) -> MutexGuard<'_, Slot> {
        match self.slot.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => self.lock_contended(),
        }
    }

    /// [`lock`](Self::lock) when another thread holds the mutex.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> MutexGuard<'_, Slot> {
        if !self.driver_only.load(Ordering::Relaxed) {
            self.waiting.fetch_add(1, Ordering::Relaxed);
            let g = self.slot.lock().unwrap_or_else(|p| p.into_inner());
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            return g;
        }
        // A driver-only world: wait only while no other thread drives it,
        // since a callback of that driver may wait for this thread.
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let _counted = Uncount(&self.waiting);
        let me = netio_core::thread_token();
        loop {
            let driver = self.driving.load(Ordering::Relaxed);
            assert!(
                driver == 0 || driver == me,
                "a driver-only simulated world (Sim::set_driver_only) was called from a \
                 thread other than the one driving it; make the call on the driving thread \
                 or post it to the loop (EventLoop::post), or leave the world shared"
            );
            match self.slot.try_lock() {
                Ok(g) => return g,
                Err(TryLockError::Poisoned(p)) => return p.into_inner(),
                Err(TryLockError::WouldBlock) => std::thread::yield_now(),
            }
        }
    }

    /// Marks the caller, which holds the mutex, as driving the world, and
    /// returns whether to lend it to callbacks (a driver-only world).
    #[inline]
    pub(crate) fn start_driving(&self) -> bool {
        let lend = self.driver_only.load(Ordering::Relaxed);
        if lend {
            self.driving
                .store(netio_core::thread_token(), Ordering::Relaxed);
        }
        lend
    }

    /// Ends what [`start_driving`](Self::start_driving) began (before the
    /// mutex is unlocked).
    #[inline]
    pub(crate) fn stop_driving(&self) {
        self.driving.store(0, Ordering::Relaxed);
    }
}

/// Counts a waiting thread out when it stops waiting, also by a panic.
struct Uncount<'a>(&'a AtomicUsize);

impl Drop for Uncount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Access to the world: through its locked mutex, or (inside a callback
/// of the thread driving a driver-only world) the world lent to that
/// thread, given back when the guard drops.
pub(crate) enum WorldGuard<'a> {
    Locked(MutexGuard<'a, Slot>),
    Lent(Option<Box<World>>),
}

impl WorldGuard<'_> {
    /// The world of `place` (by address `id`) for the calling thread.
    ///
    /// # Panics
    /// If the calling thread has the world lent and already holds it (a
    /// call into the world made while one of its own operations runs,
    /// which with the mutex would deadlock), and as [`Place::lock`].
    #[inline(always)]
    pub(crate) fn get(place: &Place, id: usize) -> WorldGuard<'_> {
        if LENT_TO.with(Cell::get) == id {
            let w = LENT.with(Cell::take);
            assert!(
                w.is_some(),
                "the simulated world was entered again while one of its own operations runs"
            );
            return WorldGuard::Lent(w);
        }
        WorldGuard::Locked(place.lock())
    }

    /// Whether this is the world lent to a callback: its mutex is held by
    /// the driver on this thread.
    pub(crate) fn lent(&self) -> bool {
        matches!(self, WorldGuard::Lent(_))
    }
}

impl Deref for WorldGuard<'_> {
    type Target = World;

    #[inline]
    fn deref(&self) -> &World {
        match self {
            WorldGuard::Locked(g) => g.as_deref(),
            WorldGuard::Lent(w) => w.as_deref(),
        }
        .expect("the simulated world is in its place")
    }
}

impl DerefMut for WorldGuard<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut World {
        match self {
            WorldGuard::Locked(g) => g.as_deref_mut(),
            WorldGuard::Lent(w) => w.as_deref_mut(),
        }
        .expect("the simulated world is in its place")
    }
}

impl Drop for WorldGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        if let WorldGuard::Lent(w) = self {
            put(w.take());
        }
    }
}

/// Lending the world to the calling thread's callbacks.
pub(crate) struct Lending;

impl Lending {
    /// Lends the world in `slot` (which must hold it; world `id`) to the
    /// calling thread until [`take_back`](Self::take_back).
    #[inline]
    pub(crate) fn lend(slot: &mut Slot, id: usize) {
        let w = slot.take();
        debug_assert!(w.is_some(), "a world is lent only from its place");
        put(w);
        LENT_TO.with(|t| t.set(id));
    }

    /// Puts the lent world back into `slot`. Every guard a callback took
    /// is gone by the time it returns or unwinds to here, so the world is
    /// back in the cell.
    #[inline]
    pub(crate) fn take_back(slot: &mut Slot) {
        LENT_TO.with(|t| t.set(0));
        let w = LENT.with(Cell::take);
        debug_assert!(w.is_some(), "the lent world came back");
        let none = std::mem::replace(slot, w);
        debug_assert!(none.is_none());
        // Nothing to drop; saves the call to the world's drop glue.
        std::mem::forget(none);
    }
}

/// Puts `w` into the thread's cell, which is empty.
#[inline]
fn put(w: Option<Box<World>>) {
    let none = LENT.with(|l| l.replace(w));
    debug_assert!(none.is_none());
    std::mem::forget(none);
}
