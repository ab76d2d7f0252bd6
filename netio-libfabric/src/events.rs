//! What both connection managers (connected endpoints, `backend.rs`;
//! reliable datagrams, `rdm/`) share: the events they queue for the
//! handler, the loop that hands them over, the application's timers and the
//! memory count of send pools.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use netio_core::mio_loop::{MioLoop, MioTimer, SpinId};
use netio_core::{
    BufferPool, Capabilities, CloseReason, ConnId, EndpointAddress, EventLoop, Handler,
    RefuseReason, Timer, TimerQueue,
};

use crate::backend::LibfabricBackend;
use crate::config::LibfabricConfig;

/// How many batches one dispatch hands over before it yields to the loop.
const BATCHES: usize = 64;
/// How long one dispatch hands events over before it yields to the loop
/// (whose timers, other sources and posted work then run), and how long
/// one connection's run of deliveries lasts before the rest waits for the
/// next batch. Without it a flood to a slow handler kept the loop in one
/// dispatch for seconds: each delivery run read the completion queue again
/// and queued the next run into the same dispatch.
pub(crate) const DISPATCH_BUDGET: Duration = Duration::from_millis(2);
/// A delivery run reads the clock for its budget every this many messages
/// (first after that many: a run of fewer reads none).
pub(crate) const DELIVER_CLOCK_EVERY: u32 = 4;
/// How many times the spin callback of a busy-polling loop reads an empty
/// completion queue before it returns to the loop (whose own turn, with
/// its epoll call every few turns, costs more than a read).
pub(crate) const SPIN_READS: u32 = 8;
/// On a fabric provider whose completion-queue read only looks at memory
/// ([`cheap_reads`]), how many rounds of [`SPIN_READS`] reads a spin makes
/// by default of one empty queue (the only connection's, or the
/// endpoint's) before it gives the loop its turn back, letting other
/// threads take the state lock between rounds and stopping early when
/// work was announced to the loop ([`LibfabricConfig::spin_rounds`]): fewer
/// loop turns between two reads where a turn costs many reads (under
/// emulation, where soft-RoCE runs). In the guest's 64 B round trip 1 and
/// 8 rounds measured the same within its noise (docs/benchmarks.md,
/// 2026-12-08).
pub(crate) const SPIN_ROUNDS: u32 = 8;
/// With more than one round, how many spins in a row the hot connection
/// stays first in line (read [`SPIN_READS`] times) while its queue stays
/// empty; then it is read with the others, once a spin, until it has
/// completions again. With one round, one empty spin ends it (on
/// socket-based providers each read is a system call).
pub(crate) const HOT_IDLE_SPINS: u32 = 64;

/// The rounds of reads of an empty queue per spin under `lf`
/// ([`LibfabricConfig::spin_rounds`]).
pub(crate) fn spin_rounds(lf: &LibfabricConfig) -> u32 {
    match lf.spin_rounds {
        Some(rounds) => rounds.max(1),
        None if cheap_reads(&lf.provider) => SPIN_ROUNDS,
        None => 1,
    }
}

/// `true` when reading a completion queue of fabric provider `provider`
/// (a name as `fi_info` gives it, layered ones such as `verbs;ofi_rxm`
/// included) only looks at memory the device or the peer writes: not on
/// the socket-based providers (`tcp`, `sockets`, `udp` and the layers on
/// them), whose read progresses the sockets with a system call.
pub(crate) fn cheap_reads(provider: &str) -> bool {
    let core = provider.split(';').next().unwrap_or(provider);
    !matches!(core, "tcp" | "sockets" | "udp")
}

/// Runs its closure when dropped during a panic (a handler's, unwinding
/// through a dispatch or a delivery): puts the state back as the code it
/// unwinds through would have left it, so that a loop run again still
/// hands events and messages over.
pub(crate) struct ClearOnUnwind<F: FnMut()>(pub(crate) F);

impl<F: FnMut()> Drop for ClearOnUnwind<F> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            (self.0)();
        }
    }
}

/// A connection manager's state, as the dispatch sees it: the queued
/// events and the flag that says the loop thread is handing them over
/// (set by the caller of [`run_dispatch`]; an event queued while it is set
/// is taken by that dispatch, so none is posted).
pub(crate) trait Queued {
    fn queue(&mut self) -> (&mut VecDeque<Ev>, &mut bool);
}

/// Sets the dispatching flag of `state`; `false` if it was set already
/// (inside a dispatch, which takes the queued events).
pub(crate) fn begin_dispatch<S: Queued>(state: &Mutex<S>) -> bool {
    let mut st = lock(state);
    let dispatching = st.queue().1;
    !std::mem::replace(dispatching, true)
}

/// Hands the events queued in `state` over, its dispatching flag set by
/// the caller; clears the flag under the lock when the queue is found
/// empty. Returns `false` if events were left for another round (the flag
/// is cleared then too, and the caller posts a dispatch).
pub(crate) fn run_dispatch<S: Queued>(
    state: &Mutex<S>,
    backend: &LibfabricBackend,
    handler: &Mutex<Box<dyn Handler<LibfabricBackend>>>,
    deliver: impl FnMut(ConnId),
    drain: impl FnMut(ConnId),
) -> bool {
    let _unwinding = ClearOnUnwind(|| *lock(state).queue().1 = false);
    let done = dispatch(
        backend,
        handler,
        |batch| {
            let mut st = lock(state);
            let (events, dispatching) = st.queue();
            batch.extend(events.drain(..));
            if batch.is_empty() {
                *dispatching = false;
            }
        },
        |rest| {
            // A handler panicked: what this dispatch had not handed over
            // goes back to the front of the queue, in order.
            let mut st = lock(state);
            let (events, _) = st.queue();
            for ev in rest.drain(..).rev() {
                events.push_front(ev);
            }
        },
        deliver,
        drain,
    );
    if !done {
        *lock(state).queue().1 = false;
    }
    done
}

/// A [`DISPATCH_BUDGET`] counted in steps (batches, messages) and read
/// from the clock only every `every` steps, first at the `every`-th: a
/// short run reads no clock at all, so the per-message path pays nothing
/// for it. The time counts from that first reading.
pub(crate) struct Budget {
    every: u32,
    steps: u32,
    since: Option<Instant>,
}

impl Budget {
    pub(crate) const fn new(every: u32) -> Self {
        Self {
            every,
            steps: 0,
            since: None,
        }
    }

    /// Counts a step; `true` once the budget is spent.
    pub(crate) fn spent(&mut self) -> bool {
        self.steps += 1;
        if self.steps % self.every != 0 {
            return false;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= DISPATCH_BUDGET
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An event queued for the handler, handed over on the loop with no lock
/// held.
pub(crate) enum Ev {
    Established(ConnId, EndpointAddress, Capabilities),
    Refused(ConnId, EndpointAddress, RefuseReason),
    Closed(ConnId, EndpointAddress, CloseReason, Vec<u64>),
    Completed(ConnId, Vec<u64>),
    /// Deliver the connection's held messages.
    Deliver(ConnId),
    /// Report the connection's sends that completed (their slots are
    /// free from then on).
    Drain(ConnId),
    Timer(u64),
    Wake(u64),
    /// Memory of sends that ended, released on the loop right before the
    /// event that reports them (so that a buffered send's buffer is back
    /// in its pool when, and not before, its completion is reported).
    Release(Box<dyn std::any::Any + Send>),
}

thread_local! {
    /// The memory of a dispatch's batches, kept between dispatches on the
    /// loop thread (a nested dispatch, if any, finds it taken and
    /// allocates its own).
    static BATCH: Cell<Vec<Ev>> = const { Cell::new(Vec::new()) };
}

thread_local! {
    /// The keys of one completion report, kept between reports on the
    /// loop thread (a nested report, if any, finds it taken and allocates
    /// its own).
    static KEYS: Cell<Vec<u64>> = const { Cell::new(Vec::new()) };
}

/// An empty vector for the keys of a completion report (give it back
/// with [`give_keys`]).
pub(crate) fn take_keys() -> Vec<u64> {
    KEYS.with(Cell::take)
}

/// Keeps the memory of `keys` for the next report.
pub(crate) fn give_keys(mut keys: Vec<u64>) {
    keys.clear();
    KEYS.with(|k| k.set(keys));
}

/// Hands queued events to the handler: `take` moves the queued events into
/// the batch it is given (left empty when there are none), `deliver`
/// delivers a connection's held messages, `drain` reports a connection's
/// completed sends.
/// Returns `false` if events may be left for another round, after
/// [`BATCHES`] batches or once [`DISPATCH_BUDGET`] is spent (the caller
/// posts one, and the loop's turn runs in between).
pub(crate) fn dispatch(
    backend: &LibfabricBackend,
    handler: &Mutex<Box<dyn Handler<LibfabricBackend>>>,
    mut take: impl FnMut(&mut Vec<Ev>),
    requeue: impl FnMut(&mut Vec<Ev>),
    mut deliver: impl FnMut(ConnId),
    mut drain: impl FnMut(ConnId),
) -> bool {
    let mut batch = BATCH.with(Cell::take);
    let mut rest = Rest {
        batch: &mut batch,
        requeue,
    };
    let done = dispatch_batches(
        backend,
        handler,
        &mut rest,
        &mut take,
        &mut deliver,
        &mut drain,
    );
    drop(rest);
    batch.clear();
    BATCH.with(|b| b.set(batch));
    done
}

/// The batch a dispatch hands over, its events in reverse (the next is
/// the last), and where those not handed over go when a handler's panic
/// unwinds through the dispatch (`requeue`, given them in order).
struct Rest<'a, R: FnMut(&mut Vec<Ev>)> {
    batch: &'a mut Vec<Ev>,
    requeue: R,
}

impl<R: FnMut(&mut Vec<Ev>)> Drop for Rest<'_, R> {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.batch.is_empty() {
            self.batch.reverse();
            (self.requeue)(self.batch);
        }
    }
}

fn dispatch_batches<R: FnMut(&mut Vec<Ev>)>(
    backend: &LibfabricBackend,
    handler: &Mutex<Box<dyn Handler<LibfabricBackend>>>,
    rest: &mut Rest<'_, R>,
    take: &mut impl FnMut(&mut Vec<Ev>),
    deliver: &mut impl FnMut(ConnId),
    drain: &mut impl FnMut(ConnId),
) -> bool {
    // The clock is first read after the second batch: a dispatch of one
    // or two batches (the common case: the events a read found, and the
    // check that nothing was queued meanwhile) reads none.
    let mut budget = Budget::new(1);
    for round in 0..BATCHES {
        rest.batch.clear();
        take(rest.batch);
        if rest.batch.is_empty() {
            return true;
        }
        rest.batch.reverse();
        while let Some(ev) = rest.batch.pop() {
            let ev = match ev {
                Ev::Deliver(id) => {
                    deliver(id);
                    continue;
                }
                Ev::Drain(id) => {
                    drain(id);
                    continue;
                }
                Ev::Release(memory) => {
                    drop(memory);
                    continue;
                }
                other => other,
            };
            let mut h = lock(handler);
            match ev {
                Ev::Established(c, r, caps) => h.on_connection_established(backend, c, r, caps),
                Ev::Refused(c, r, why) => h.on_connection_refused(backend, c, r, &why),
                Ev::Closed(c, r, why, keys) => h.on_connection_closed(backend, c, r, &why, &keys),
                Ev::Completed(c, keys) => {
                    h.on_sends_completed(backend, c, &keys);
                    give_keys(keys);
                }
                Ev::Timer(t) => h.on_timer(backend, t),
                Ev::Wake(t) => h.on_wake(backend, t),
                Ev::Deliver(_) | Ev::Drain(_) | Ev::Release(_) => {}
            }
        }
        if round > 0 && budget.spent() {
            return false;
        }
    }
    false
}

/// The application's timers (`Backend::set_timer`): a queue of deadlines
/// and one loop timer started for the earliest.
pub(crate) struct UserTimers {
    queue: Mutex<TimerQueue>,
    timer: MioTimer,
}

impl UserTimers {
    pub(crate) fn new(timer: MioTimer) -> Self {
        Self {
            queue: Mutex::new(TimerQueue::new()),
            timer,
        }
    }

    /// Adds a timer for `token` due `delay` after `now`.
    pub(crate) fn set(&self, now: Duration, delay: Duration, token: u64) {
        let mut q = lock(&self.queue);
        let deadline = now.saturating_add(delay);
        q.push(deadline, token);
        if q.next_deadline() == Some(deadline) {
            self.timer.start(delay.max(Duration::from_micros(1)));
        }
    }

    /// The tokens due at `now`, in order; the loop timer is started again
    /// for the next deadline.
    pub(crate) fn due(&self, now: Duration) -> Vec<u64> {
        let mut q = lock(&self.queue);
        let mut due = Vec::new();
        while let Some(t) = q.pop_due(now) {
            due.push(t);
        }
        match q.next_deadline() {
            Some(next) => self
                .timer
                .start(next.saturating_sub(now).max(Duration::from_micros(1))),
            None => self.timer.stop(),
        }
        due
    }
}

/// The bytes of `pools`, each counted once however often it appears.
pub(crate) fn pool_bytes(pools: impl Iterator<Item = BufferPool>) -> usize {
    let mut counted: Vec<BufferPool> = Vec::new();
    let mut bytes = 0;
    for p in pools {
        if !counted.iter().any(|q| q.same_pool(&p)) {
            bytes += p.bytes();
            counted.push(p);
        }
    }
    bytes
}

/// A loop timer that calls `f` on the backend behind `weak` while it lives.
pub(crate) fn timer_to<T: Send + Sync + 'static>(
    lp: &MioLoop,
    weak: &Weak<T>,
    f: fn(&T),
) -> MioTimer {
    let w = weak.clone();
    lp.timer(move || {
        if let Some(i) = w.upgrade() {
            f(&i);
        }
    })
}

/// On a busy-polling loop, a spin callback that calls `f` on the backend
/// behind `weak` while it lives, handing it the reference the call took;
/// `f` says whether it found work.
pub(crate) fn spin_to<T: Send + Sync + 'static>(
    lp: &MioLoop,
    weak: &Weak<T>,
    f: fn(Arc<T>) -> bool,
) -> Option<SpinId> {
    lp.is_busy_polling().then(|| {
        let w = weak.clone();
        lp.add_spin(move || w.upgrade().is_some_and(f))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spin_reads_an_empty_queue_in_rounds_only_where_reads_look_at_memory() {
        let rounds = |provider: &str, set: Option<u32>| {
            spin_rounds(&LibfabricConfig {
                spin_rounds: set,
                ..LibfabricConfig::provider(provider)
            })
        };
        for memory in ["verbs", "verbs;ofi_rxm", "shm", "efa", "cxi", "opx"] {
            assert_eq!(rounds(memory, None), SPIN_ROUNDS, "{memory}");
        }
        for sockets in ["tcp", "tcp;ofi_rxm", "sockets", "udp;ofi_rxd"] {
            assert_eq!(rounds(sockets, None), 1, "{sockets}");
        }
        assert_eq!(rounds("tcp", Some(8)), 8, "a setting wins");
        assert_eq!(rounds("verbs", Some(1)), 1, "a setting wins");
        assert_eq!(rounds("shm", Some(0)), 1, "0 counts as 1");
    }
}
