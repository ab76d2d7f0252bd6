//! Tasks polled on the backend's loop thread ([`AsyncBackend::spawn`]).
//!
//! A task lives in a slot of its backend's [`Executor`], which the
//! backend's handler shares. Waking a task queues it, and the first wake
//! since the queue last ran asks for a run with [`Backend::wake`], whose
//! `on_wake` runs the queue on the loop thread. Woken from a handler
//! callback (a message, a completion, a connection event), on the loop
//! thread, that costs no system call, and the run comes after the events
//! the provider is dispatching now: a task that reads a burst of messages
//! is polled once for all of them, and a reply it sends leaves in the same
//! loop turn as the message it answers.
//!
//! A task is polled only on the loop thread, and dropped there too (a
//! [`Task`] handle dropped elsewhere only asks for it), so its future may
//! use a backend made for one thread (`ThreadSafety::Unsafe`).
//!
//! [`AsyncBackend::spawn`]: crate::AsyncBackend::spawn

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};

use netio_core::Backend;

/// The token of the executor's [`Backend::wake`] calls.
pub(crate) const EXEC_TOKEN: u64 = u64::MAX;

/// Tasks one turn of the queue polls at most before it leaves the rest to
/// the next `on_wake` (so a task that keeps waking itself does not hold
/// the loop).
const POLLS_PER_RUN: usize = 256;

type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

enum Slot {
    Free,
    /// Waiting to be polled (woken or not).
    Idle(BoxFuture, Waker),
    /// Taken out by the poll running now.
    Running,
}

struct Slots {
    slots: Vec<(u64, Slot)>,
    free: Vec<usize>,
}

/// The tasks of one backend.
pub(crate) struct Executor {
    slots: Mutex<Slots>,
    ready: Mutex<VecDeque<Arc<TaskRef>>>,
    /// A `Backend::wake` is on its way (cleared when its `on_wake` runs).
    wake_requested: AtomicBool,
    /// Asks the loop to run the queue (`Backend::wake`), while a task lives:
    /// held by the backend's own handler, it would otherwise keep the
    /// backend alive for ever.
    wake_loop: Mutex<Option<Arc<dyn Fn() + Send + Sync>>>,
    /// The queue is being run (loop thread): a callback made from inside a
    /// task's poll leaves the queue to that run.
    running: AtomicBool,
    /// The backend dropped its handler ([`shut_down`](Self::shut_down)):
    /// no task is polled again.
    closed: AtomicBool,
}

/// What a task's waker and its [`Task`] handle share.
pub(crate) struct TaskRef {
    exec: Weak<Executor>,
    index: usize,
    generation: u64,
    /// In the ready queue.
    queued: AtomicBool,
    /// Its `Task` handle was dropped: the task is dropped, not polled.
    cancelled: AtomicBool,
}

impl Wake for TaskRef {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(exec) = self.exec.upgrade() else {
            return;
        };
        lock(&exec.ready).push_back(Arc::clone(self));
        exec.request_run();
    }
}

/// Lowers [`Executor::running`] however a run ends.
struct RunFlag<'a>(&'a AtomicBool);

impl Drop for RunFlag<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Frees a task's slot when its poll panicked (the future is lost with the
/// unwinding).
struct SlotGuard<'a> {
    exec: &'a Executor,
    index: usize,
    armed: bool,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut slots = lock(&self.exec.slots);
            slots.slots[self.index].1 = Slot::Free;
            slots.free.push(self.index);
        }
    }
}

impl Executor {
    pub(crate) fn new() -> Self {
        Self {
            slots: Mutex::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
            ready: Mutex::new(VecDeque::new()),
            wake_requested: AtomicBool::new(false),
            wake_loop: Mutex::new(None),
            running: AtomicBool::new(false),
            closed: AtomicBool::new(false),
        }
    }

    /// The backend dropped its handler (the backend ended, or its host
    /// crashed on the simulator): nothing will run the queue again. Drops
    /// every task that is not being polled, here with no lock held; one
    /// being polled is dropped when its poll returns, one spawned later at
    /// once.
    pub(crate) fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        let (futures, wake_loop) = {
            let mut slots = lock(&self.slots);
            let Slots { slots, free } = &mut *slots;
            let mut futures = Vec::new();
            for (i, (_, slot)) in slots.iter_mut().enumerate() {
                if matches!(slot, Slot::Idle(..)) {
                    if let Slot::Idle(future, waker) = std::mem::replace(slot, Slot::Free) {
                        futures.push((future, waker));
                        free.push(i);
                    }
                }
            }
            (futures, lock(&self.wake_loop).take())
        };
        let ready = std::mem::take(&mut *lock(&self.ready));
        drop(ready);
        drop(futures);
        drop(wake_loop);
    }

    /// `on_wake` with [`EXEC_TOKEN`]: a later wake asks again.
    pub(crate) fn woken(&self) {
        self.wake_requested.store(false, Ordering::Release);
    }

    /// Asks the loop for a run of the queue, unless one is on its way (or
    /// no task lives: a stale waker's entry waits for the next run).
    fn request_run(&self) {
        if self.wake_requested.swap(true, Ordering::AcqRel) {
            return;
        }
        let wake = lock(&self.wake_loop).clone();
        match wake {
            Some(wake) => wake(),
            None => self.wake_requested.store(false, Ordering::Release),
        }
    }

    /// Adds a task and queues its first poll.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        future: BoxFuture,
        wake_loop: Arc<dyn Fn() + Send + Sync>,
    ) -> Arc<TaskRef> {
        if self.closed.load(Ordering::Acquire) {
            // Nothing will poll it: dropped at once, never run.
            drop(future);
            return Arc::new(TaskRef {
                exec: Arc::downgrade(self),
                index: usize::MAX,
                generation: 0,
                queued: AtomicBool::new(false),
                cancelled: AtomicBool::new(true),
            });
        }
        let mut slots = lock(&self.slots);
        let index = match slots.free.pop() {
            Some(i) => i,
            None => {
                slots.slots.push((0, Slot::Free));
                slots.slots.len() - 1
            }
        };
        let generation = slots.slots[index].0 + 1;
        let task = Arc::new(TaskRef {
            exec: Arc::downgrade(self),
            index,
            generation,
            queued: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
        });
        let waker = Waker::from(Arc::clone(&task));
        slots.slots[index] = (generation, Slot::Idle(future, waker.clone()));
        let old = lock(&self.wake_loop).replace(wake_loop);
        drop(slots);
        drop(old);
        waker.wake();
        task
    }

    /// Runs the queued tasks (loop thread, from `on_wake`): each is polled
    /// once, or dropped if its `Task` was, at most [`POLLS_PER_RUN`] of
    /// them. Does nothing when called from inside a run.
    pub(crate) fn run_ready(&self) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let flag = RunFlag(&self.running);
        let mut polls = 0;
        loop {
            if polls == POLLS_PER_RUN {
                break;
            }
            let Some(task) = lock(&self.ready).pop_front() else {
                break;
            };
            polls += 1;
            task.queued.store(false, Ordering::Release);
            self.poll_task(&task);
        }
        drop(flag);
        // Left for the next run: ask for it (a wake from another thread
        // since this run started asked already).
        if !lock(&self.ready).is_empty() {
            self.request_run();
        }
    }

    fn poll_task(&self, task: &Arc<TaskRef>) {
        let taken = {
            let mut slots = lock(&self.slots);
            match slots.slots.get_mut(task.index) {
                Some((generation, slot)) if *generation == task.generation => {
                    match std::mem::replace(slot, Slot::Running) {
                        Slot::Idle(future, waker) => Some((future, waker)),
                        other => {
                            *slot = other;
                            None
                        }
                    }
                }
                _ => None,
            }
        };
        let Some((mut future, waker)) = taken else {
            return;
        };
        let mut guard = SlotGuard {
            exec: self,
            index: task.index,
            armed: true,
        };
        let done = task.cancelled.load(Ordering::Acquire)
            || future
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready();
        guard.armed = false;
        if done || self.closed.load(Ordering::Acquire) {
            let wake_loop = {
                let mut slots = lock(&self.slots);
                slots.slots[task.index].1 = Slot::Free;
                slots.free.push(task.index);
                // The last task gone: the executor holds no backend.
                let none_left = slots.free.len() == slots.slots.len();
                none_left.then(|| lock(&self.wake_loop).take())
            };
            // Dropped here, on the loop thread, with no lock held.
            drop(future);
            drop(wake_loop);
        } else {
            lock(&self.slots).slots[task.index].1 = Slot::Idle(future, waker);
        }
    }

    /// Tasks not finished yet.
    pub(crate) fn len(&self) -> usize {
        let slots = lock(&self.slots);
        slots.slots.len() - slots.free.len()
    }
}

/// A task spawned on the loop thread ([`AsyncBackend::spawn`]): a future
/// of its output. Dropping it drops the task (on the loop thread, before
/// its next poll); [`detach`](Self::detach) lets it run to its end
/// instead.
///
/// [`AsyncBackend::spawn`]: crate::AsyncBackend::spawn
#[must_use = "dropping a Task cancels it; call detach() to let it run"]
pub struct Task<T> {
    task: Arc<TaskRef>,
    output: Arc<Output<T>>,
    detached: bool,
}

pub(crate) struct Output<T> {
    value: Mutex<(Option<T>, Option<Waker>, bool)>,
}

impl<T> Output<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            value: Mutex::new((None, None, false)),
        })
    }

    /// The task's output (loop thread, when its future finished).
    pub(crate) fn set(&self, value: T) {
        let waker = {
            let mut v = lock(&self.value);
            v.0 = Some(value);
            v.2 = true;
            v.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Task<T> {
    pub(crate) fn new(task: Arc<TaskRef>, output: Arc<Output<T>>) -> Self {
        Self {
            task,
            output,
            detached: false,
        }
    }

    /// Lets the task run to its end without this handle; its output is
    /// dropped.
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// `true` once the task's future finished (its output is ready).
    pub fn is_finished(&self) -> bool {
        lock(&self.output.value).2
    }
}

impl<T> Future for Task<T> {
    type Output = T;

    /// The task's output, once it finished.
    ///
    /// # Panics
    ///
    /// When polled again after it returned the output.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut v = lock(&self.output.value);
        if let Some(value) = v.0.take() {
            return Poll::Ready(value);
        }
        assert!(!v.2, "a Task polled after it returned its output");
        v.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for Task<T> {
    fn drop(&mut self) {
        if self.detached || self.is_finished() {
            return;
        }
        self.task.cancelled.store(true, Ordering::Release);
        // Dropped by the loop thread's next run.
        Waker::from(Arc::clone(&self.task)).wake();
    }
}

impl<T> fmt::Debug for Task<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

/// The [`Backend::wake`] call that runs `exec`'s queue, for a backend.
pub(crate) fn wake_loop<B: Backend + Clone + 'static>(backend: &B) -> Arc<dyn Fn() + Send + Sync> {
    let b = backend.clone();
    Arc::new(move || b.wake(EXEC_TOKEN))
}
