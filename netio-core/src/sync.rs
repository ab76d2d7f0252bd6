//! Synchronisation primitives, swapped for loom's under `--cfg loom` so the
#![allow(unused_imports)]
//! shared-state pieces (buffer pool, signal queue) can be model-checked.

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;
#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

/// `std::cell::UnsafeCell` with loom's access API (`with_mut`), so that
/// code using it can be model-checked.
#[cfg(not(loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Calls `f` with a pointer to the value; what `f` may do with it is
    /// the caller's to prove, as with `std::cell::UnsafeCell::get`.
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Locks `m`, ignoring poisoning: every critical section in this crate
/// leaves its state consistent before anything that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
