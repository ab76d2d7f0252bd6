//! [`LoopLock`]: a lock that costs no atomic read-modify-write where only
//! the loop thread may touch the value.
//!
//! All `unsafe` of this module is here: a value in an `UnsafeCell`, reached
//! either under a mutex (shared mode) or, without one, only by the thread
//! inside [`MioLoop::run`](crate::EventLoop::run) (loop-only mode).
//!
//! Why loop-only mode is sound: at most one thread is inside `run` of a
//! given loop at a time (a second `run` panics), and
//! [`MioLoop::on_loop_thread`](crate::EventLoop::on_loop_thread) is true
//! exactly on that thread (only the thread itself stores its token, and it
//! clears it before it leaves `run`). One thread's turn ends before the
//! next thread's begins, ordered by the loop's own poll-state mutex, so
//! every access of one turn happens before every access of the next. A
//! borrow flag, read and written only by the thread that passed the check,
//! turns a nested `lock` on that thread into a panic instead of two
//! mutable references.

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use crate::event_loop::EventLoop;

use super::MioLoop;

/// A value shared by a provider's handles and its loop callbacks, locked
/// in one of two ways chosen at creation:
///
/// - [`LoopLock::shared`]: behind a mutex, reachable from any thread (a
///   backend in thread-safe mode);
/// - [`LoopLock::loop_only`]: reachable only from the thread running the
///   loop, with no lock at all: [`lock`](Self::lock) checks the thread
///   (a thread-local read and an atomic load) and a borrow flag. For a
///   backend in thread-unsafe mode, whose operations are refused off the
///   loop thread anyway, and for state only loop callbacks touch.
///
/// In loop-only mode, [`lock`](Self::lock) off the loop thread and a nested
/// `lock` on it panic; [`try_lock`](Self::try_lock) answers `None` instead.
///
/// ```
/// use netio_core::mio_loop::{LoopLock, MioLoop};
/// use netio_core::EventLoop;
///
/// let lp = MioLoop::new().unwrap();
/// let count = std::sync::Arc::new(LoopLock::loop_only(&lp, 0u32));
/// assert!(count.try_lock().is_none(), "not on the loop thread");
/// let c = count.clone();
/// let l2 = lp.clone();
/// lp.run(move || {
///     *c.lock() += 1;
///     l2.stop();
/// });
/// assert_eq!(count.try_lock().map(|g| *g), None);
/// ```
pub struct LoopLock<T> {
    /// `Some` in shared mode.
    mutex: Option<Mutex<()>>,
    /// The loop whose thread may lock, in loop-only mode.
    lp: Option<MioLoop>,
    /// A guard exists (loop-only mode; touched only by the loop thread).
    borrowed: Cell<bool>,
    value: UnsafeCell<T>,
}

// SAFETY: the value is reached only through `LoopLock::lock`/`try_lock`,
// which give out at most one guard at a time: under the mutex in shared
// mode, or (loop-only mode) on the one thread inside `run` after the
// borrow flag says no guard exists; `borrowed` is read and written only
// by that thread (see the module comment for why turns of different
// threads are ordered). So `&LoopLock<T>` may go to other threads as long
// as `T` itself may move between threads.
unsafe impl<T: Send> Sync for LoopLock<T> {}

impl<T> LoopLock<T> {
    /// `value` behind a mutex: [`lock`](Self::lock) works from any thread.
    pub fn shared(value: T) -> Self {
        Self {
            mutex: Some(Mutex::new(())),
            lp: None,
            borrowed: Cell::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// `value` reachable only from the thread running `event_loop`, with
    /// no lock.
    pub fn loop_only(event_loop: &MioLoop, value: T) -> Self {
        Self {
            mutex: None,
            lp: Some(event_loop.clone()),
            borrowed: Cell::new(false),
            value: UnsafeCell::new(value),
        }
    }

    /// `true` for a lock made with [`shared`](Self::shared).
    pub fn is_shared(&self) -> bool {
        self.mutex.is_some()
    }

    /// The value, locked.
    ///
    /// # Panics
    /// In loop-only mode, off the loop thread or while this thread holds a
    /// guard already.
    #[track_caller]
    pub fn lock(&self) -> LoopLockGuard<'_, T> {
        match self.try_lock() {
            Some(g) => g,
            None => panic!(
                "LoopLock::lock: a loop-only value locked off the loop thread or while already locked"
            ),
        }
    }

    /// The value, locked; `None` in loop-only mode off the loop thread or
    /// while this thread holds a guard already. In shared mode it waits
    /// for the mutex like [`lock`](Self::lock).
    pub fn try_lock(&self) -> Option<LoopLockGuard<'_, T>> {
        match (&self.mutex, &self.lp) {
            (Some(m), _) => Some(LoopLockGuard {
                lock: self,
                _held: Some(m.lock().unwrap_or_else(|p| p.into_inner())),
                _value: PhantomData,
            }),
            (None, Some(lp)) => {
                // The thread check comes first: only the loop thread may
                // touch the borrow flag.
                if !lp.on_loop_thread() || self.borrowed.replace(true) {
                    return None;
                }
                Some(LoopLockGuard {
                    lock: self,
                    _held: None,
                    _value: PhantomData,
                })
            }
            (None, None) => None,
        }
    }

    /// The value, through exclusive access (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

impl<T> fmt::Debug for LoopLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoopLock")
            .field("shared", &self.is_shared())
            .finish_non_exhaustive()
    }
}

/// Access to the value of a [`LoopLock`]; unlocks when dropped.
pub struct LoopLockGuard<'a, T> {
    lock: &'a LoopLock<T>,
    /// The mutex guard in shared mode.
    _held: Option<MutexGuard<'a, ()>>,
    /// Shared across threads only where `&T` may be (as `MutexGuard`).
    _value: PhantomData<&'a mut T>,
}

impl<T> Deref for LoopLockGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: this guard is the only one of its lock (see `try_lock`),
        // and it lives no longer than the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for LoopLockGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this reference unique.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for LoopLockGuard<'_, T> {
    fn drop(&mut self) {
        if self._held.is_none() {
            // Loop-only mode: this is the loop thread, which set the flag.
            self.lock.borrowed.set(false);
        }
        // Shared mode: `_held` unlocks the mutex after this.
    }
}

impl<T: fmt::Debug> fmt::Debug for LoopLockGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn run_once(lp: &MioLoop, f: impl FnOnce() + Send + 'static) {
        let l2 = lp.clone();
        lp.run(move || {
            f();
            l2.stop();
        });
    }

    #[test]
    fn loop_only_locks_on_the_loop_thread_and_nowhere_else() {
        let lp = MioLoop::new().unwrap();
        let v = Arc::new(LoopLock::loop_only(&lp, 1u32));
        assert!(!v.is_shared());
        assert!(v.try_lock().is_none(), "before run, on this thread");
        let v2 = v.clone();
        let ok = Arc::new(AtomicBool::new(false));
        let ok2 = ok.clone();
        run_once(&lp, move || {
            *v2.lock() += 1;
            let g = v2.lock();
            ok2.store(*g == 2, Ordering::SeqCst);
        });
        assert!(ok.load(Ordering::SeqCst));
        assert!(v.try_lock().is_none(), "after run");
        let v3 = v.clone();
        std::thread::spawn(move || assert!(v3.try_lock().is_none()))
            .join()
            .unwrap();
    }

    #[test]
    fn loop_only_follows_the_loop_to_another_thread() {
        let lp = MioLoop::new().unwrap();
        let v = Arc::new(LoopLock::loop_only(&lp, 0u32));
        for _ in 0..3 {
            let (lp2, v2) = (lp.clone(), v.clone());
            std::thread::spawn(move || run_once(&lp2, move || *v2.lock() += 1))
                .join()
                .unwrap();
        }
        let mut v = Arc::try_unwrap(v).ok().unwrap();
        assert_eq!(*v.get_mut(), 3);
    }

    #[test]
    fn a_nested_lock_on_the_loop_thread_is_refused_not_aliased() {
        let lp = MioLoop::new().unwrap();
        let v = Arc::new(LoopLock::loop_only(&lp, 0u32));
        let v2 = v.clone();
        let seen = Arc::new(Mutex::new(None));
        let s2 = seen.clone();
        run_once(&lp, move || {
            let g = v2.lock();
            let nested = v2.try_lock().is_none();
            let panicked =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(v2.lock()))).is_err();
            drop(g);
            let again = v2.try_lock().is_some();
            *s2.lock().unwrap() = Some((nested, panicked, again));
        });
        assert_eq!(*seen.lock().unwrap(), Some((true, true, true)));
    }

    #[test]
    fn shared_locks_from_any_thread() {
        let v = Arc::new(LoopLock::shared(0u64));
        assert!(v.is_shared());
        let ts: Vec<_> = (0..4)
            .map(|_| {
                let v = v.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        *v.lock() += 1;
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(*v.lock(), 4000);
    }
}
