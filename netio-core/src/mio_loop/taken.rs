//! A callback taken out of its slot while it runs, and the way back.

/// Holds a callback taken out of its slot to run, and gives it to `back`:
/// with [`give_back`](Self::give_back) after the run returned, and when
/// dropped unwinding from a run that panicked.
/// A callback that panics is thereby kept (its source, spin, signal or
/// timer goes on working once the loop runs again), rather than lost with
/// its registration left silent.
pub(crate) struct Taken<C, B: FnOnce(C)> {
    callback: Option<C>,
    back: Option<B>,
}

impl<C, B: FnOnce(C)> Taken<C, B> {
    #[inline]
    pub(crate) fn new(callback: C, back: B) -> Self {
        Self {
            callback: Some(callback),
            back: Some(back),
        }
    }

    /// The callback, to run.
    #[inline]
    pub(crate) fn callback(&mut self) -> &mut C {
        self.callback.as_mut().expect("held until given back")
    }

    /// Gives the callback back after a run that returned.
    #[inline]
    pub(crate) fn give_back(mut self) {
        if let (Some(callback), Some(back)) = (self.callback.take(), self.back.take()) {
            back(callback);
        }
    }

    /// Gives the callback back after a run that panicked (out of line: the
    /// normal path has given it back already).
    #[cold]
    #[inline(never)]
    fn give_back_unwound(&mut self) {
        if let (Some(callback), Some(back)) = (self.callback.take(), self.back.take()) {
            back(callback);
        }
    }
}

impl<C, B: FnOnce(C)> Drop for Taken<C, B> {
    #[inline]
    fn drop(&mut self) {
        if self.callback.is_some() {
            self.give_back_unwound();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[test]
    fn the_callback_goes_back_after_a_run_and_after_a_panic() {
        let mut slot: Option<u32> = None;
        let mut t = Taken::new(7, |c| slot = Some(c));
        *t.callback() += 1;
        t.give_back();
        assert_eq!(slot.take(), Some(8), "back after a run that returned");
        let r = catch_unwind(AssertUnwindSafe(|| {
            let mut t = Taken::new(1, |c| slot = Some(c));
            *t.callback() += 1;
            panic!("the run panics");
        }));
        assert!(r.is_err());
        assert_eq!(slot, Some(2), "back after a run that panicked");
    }
}
