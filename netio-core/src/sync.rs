//! Synchronisation primitives, swapped for loom's under `--cfg loom` so the
#![allow(unused_imports)]
//! shared-state pieces (buffer pool, signal queue) can be model-checked.

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

/// Locks `m`, ignoring poisoning: every critical section in this crate
/// leaves its state consistent before anything that can panic.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
