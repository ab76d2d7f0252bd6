//! The thread-shared state of posting and stopping, free of mio so loom can
//! model it together with [`Control`](super::control::Control), which
//! announces both through the wake flag.
//!
//! Posters push a closure, then announce it with the wake flag; the loop
//! lowers the flag before it looks, runs the closures that were queued when
//! it looked (later ones wait for the next turn), and sleeps only when the
//! flag is still lowered. A stop is a flag of its own, announced the same
//! way, taken (and so reset) by the loop before each turn.
#![cfg_attr(loom, allow(dead_code))]

use std::collections::VecDeque;

use crate::sync::{lock, AtomicBool, AtomicUsize, Mutex, Ordering};

/// Closures posted to the loop, in the order posted.
#[derive(Debug)]
pub(crate) struct PostQueue<T> {
    posts: Mutex<VecDeque<T>>,
    /// The queue's length, written under the lock after each change: the
    /// loop reads it without the lock, so a turn with nothing posted takes
    /// no lock. A poster announces its post (the wake flag) after this
    /// store, and the loop lowers the flag before it reads it, so a post it
    /// does not see keeps the flag raised.
    queued: AtomicUsize,
}

impl<T> PostQueue<T> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        Self {
            posts: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
        }
    }

    /// Queues `task` behind every earlier one.
    pub(crate) fn push(&self, task: T) {
        let mut posts = lock(&self.posts);
        posts.push_back(task);
        self.queued.store(posts.len(), Ordering::Release);
    }

    /// The number of queued tasks: what one turn runs at most, so tasks
    /// posted by the tasks themselves wait for the next turn. Read without
    /// the lock.
    pub(crate) fn len(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Takes the oldest task; it runs with no lock held, so it may post.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut posts = lock(&self.posts);
        let task = posts.pop_front();
        self.queued.store(posts.len(), Ordering::Release);
        task
    }

    /// Runs, in order, the tasks queued when it looked (tasks posted
    /// meanwhile, by these tasks too, wait for the next turn), each with no
    /// lock held. Stops early, returning `false`, as soon as `keep_going`
    /// says no after a task (a stop was requested).
    pub(crate) fn run_queued(&self, mut run: impl FnMut(T), keep_going: impl Fn() -> bool) -> bool {
        for _ in 0..self.len() {
            let Some(task) = self.pop() else { break };
            run(task);
            if !keep_going() {
                return false;
            }
        }
        true
    }

    /// Empties the queue, returning what it held (to be dropped by the
    /// caller outside the lock: dropping a task may post or drop handles).
    pub(crate) fn take_all(&self) -> VecDeque<T> {
        let mut posts = lock(&self.posts);
        self.queued.store(0, Ordering::Release);
        std::mem::take(&mut *posts)
    }
}

/// A stop requested from any thread, taken by the loop thread.
#[derive(Debug)]
pub(crate) struct StopFlag {
    requested: AtomicBool,
}

impl StopFlag {
    /// No stop requested.
    pub(crate) fn new() -> Self {
        Self {
            requested: AtomicBool::new(false),
        }
    }

    /// Requests a stop; the caller then announces it with the wake flag.
    ///
    /// A read-modify-write, like the loop's [`take`](Self::take). A plain
    /// release store would do under the memory model (a take that runs
    /// after the request is announced reads it), but loom 0.7 lets a plain
    /// store slip between the read and the write of a concurrent `swap`
    /// (tokio-rs/loom#254), and the model
    /// `loom_stop_from_another_thread_ends_a_sleeping_loop` then reports a
    /// loop that takes no stop and sleeps for ever. `take` itself must stay
    /// one `swap`: as a load then a store it can erase a request made in
    /// between, and that loop really does sleep for ever (the same model
    /// finds it).
    pub(crate) fn request(&self) {
        self.requested.swap(true, Ordering::AcqRel);
    }

    /// `true` while a stop is requested and not yet taken.
    pub(crate) fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Takes a requested stop (the loop returns from `run`); a later `run`
    /// starts afresh.
    pub(crate) fn take(&self) -> bool {
        self.requested.swap(false, Ordering::AcqRel)
    }
}
