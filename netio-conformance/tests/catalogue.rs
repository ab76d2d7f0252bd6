//! A catalogue of deliberately broken providers: the suite tests itself.
//!
//! Each entry is the simulator behind a wrapper ([`Broken`]) that breaks
//! exactly one rule of the contract, chosen by a [`Bug`] type. For each
//! entry the whole suite runs in this process
//! ([`netio_conformance::behaviours`]), each behaviour on a thread of its
//! own named `catalogue <bug> <path>`, at most [`PARALLEL`] at a time, each
//! given [`LIMIT`] of wall time. The entry's test asserts that the suite
//! fails, that the behaviour named after the broken rule is among the
//! failures (in both thread modes where it runs in both), and that nothing
//! hung. A control entry that breaks nothing must pass everything, which
//! shows that the wrapper itself is faithful.
//!
//! One entry, a handler called while the provider holds its lock, makes
//! the loop thread deadlock; the suite's watchdog ends such a process, so
//! that entry runs in a child process (one ignored test per thread mode).
//!
//! Run with `--nocapture` to see, for each entry, the failing behaviours
//! and the first line of each failure.

mod sim_harness;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::Read;
use std::marker::PhantomData;
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netio_conformance::{behaviours, Event, Harness, NodeId};
use netio_core::{
    Backend, BackendConfig, BufferError, Capabilities, CloseError, CloseReason, ConnectionParams,
    EndpointAddress, EventLoop, Features, Handler, MemoryUsage, NetworkBuffer, OpenActiveError,
    OpenListenError, RefuseReason, RegionSlice, SendError, Signal, ThreadSafety,
};
use netio_sim::{SimBackend, SimLoop, SimSignal};
use sim_harness::SimHarness;

// ------------------------------------------------------------------ bugs

/// The rule a broken provider breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Breaks nothing (the control).
    Nothing,
    /// Drops the first key of every non-empty `cancelled_keys`.
    DropCancelledKey,
    /// Reports every completion twice.
    CompletionTwice,
    /// Delivers every 7th message twice.
    DataTwice,
    /// Holds a message back and delivers it after the next one.
    DataReordered,
    /// On the initiating side, holds `on_connection_established` back until
    /// the next event of that remote has been delivered.
    DataBeforeEstablished,
    /// Reports copy sends completed before the simulator does, hides the
    /// real outcome (completion or cancelled key).
    CompleteEarly,
    /// Holds messages until a signal flushes them and drops those still
    /// held when the remote's close comes first.
    SwallowBeforeClose,
    /// Receives into buffers twice the size asked for.
    OversizeDelivered,
    /// Answers `UnknownListenEndpoint` for an unknown active endpoint.
    WrongErrorVariant,
    /// Reports a copy send completed from inside `send_data_copy`.
    ReentrantCompletion,
    /// Queues copy sends without bound instead of answering `NoResources`.
    NoBackpressure,
    /// Reports a peer's orderly close as a reset.
    WrongCloseReason,
    /// Delivers the last message of a remote once more after its close.
    EventAfterClose,
    /// Opens a listen endpoint per closed connection and never closes it.
    LeakPerClose,
    /// `num_available_buffers` gives the current count, not the low-water
    /// mark since the last read.
    LowWaterNotReset,
    /// `send_data` drops the header.
    HeaderDropped,
    /// Reports a refused connection as closed.
    RefusedAsClosed,
    /// Calls the handler while holding the lock every operation takes.
    HandlerUnderLock,
}

/// A type naming one [`Kind`], so that [`Broken`] can be a harness type.
trait Bug: Send + Sync + 'static {
    /// The broken rule.
    const KIND: Kind;
}

macro_rules! bugs {
    ($($ty:ident => $kind:ident),* $(,)?) => {$(
        #[doc = concat!("The bug [`Kind::", stringify!($kind), "`].")]
        struct $ty;
        impl Bug for $ty {
            const KIND: Kind = Kind::$kind;
        }
    )*};
}

bugs!(
    Control => Nothing,
    DropCancelledKey => DropCancelledKey,
    CompletionTwice => CompletionTwice,
    DataTwice => DataTwice,
    DataReordered => DataReordered,
    DataBeforeEstablished => DataBeforeEstablished,
    CompleteEarly => CompleteEarly,
    SwallowBeforeClose => SwallowBeforeClose,
    OversizeDelivered => OversizeDelivered,
    WrongErrorVariant => WrongErrorVariant,
    ReentrantCompletion => ReentrantCompletion,
    NoBackpressure => NoBackpressure,
    WrongCloseReason => WrongCloseReason,
    EventAfterClose => EventAfterClose,
    LeakPerClose => LeakPerClose,
    LowWaterNotReset => LowWaterNotReset,
    HeaderDropped => HeaderDropped,
    RefusedAsClosed => RefusedAsClosed,
    Deadlock => HandlerUnderLock,
);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The suite's handler of one backend.
type Inner = Box<dyn Handler<BrokenBackend>>;

/// What a broken backend's handles and its handler share.
struct Shared {
    kind: Kind,
    /// The suite's handler.
    handler: Mutex<Inner>,
    /// Events to deliver when `flush` fires, with the simulator backend
    /// they belong to.
    pending: Mutex<VecDeque<(SimBackend, Event)>>,
    flush: OnceLock<SimSignal>,
    /// Keys reported completed already (early or re-entrantly).
    early: Mutex<Vec<u64>>,
    /// Copy sends queued instead of refused (`NoBackpressure`).
    backlog: Mutex<VecDeque<(EndpointAddress, Vec<u8>, u64)>>,
    /// An event held back per remote.
    held: Mutex<HashMap<EndpointAddress, Event>>,
    /// The last message per remote.
    last: Mutex<HashMap<EndpointAddress, Vec<u8>>>,
    /// Remotes this side opened active endpoints to.
    initiated: Mutex<HashSet<EndpointAddress>>,
    /// Messages seen.
    count: Mutex<u64>,
    /// The provider's lock (`HandlerUnderLock`).
    big_lock: Mutex<()>,
    /// The backend's IP address (known once the simulator made it).
    ip: OnceLock<IpAddr>,
}

/// A simulator backend with one rule broken.
#[derive(Clone)]
struct BrokenBackend {
    inner: SimBackend,
    shared: Arc<Shared>,
}

fn deliver(h: &mut dyn Handler<BrokenBackend>, b: &BrokenBackend, e: &Event) {
    match e {
        Event::Established { remote, caps } => h.on_connection_established(b, *remote, *caps),
        Event::Refused { remote, reason } => h.on_connection_refused(b, *remote, reason),
        Event::Closed {
            remote,
            reason,
            keys,
        } => h.on_connection_closed(b, *remote, reason, keys),
        Event::Data { remote, data } => h.on_data(b, *remote, data),
        Event::Completed { remote, key } => h.on_send_completed(b, *remote, *key),
    }
}

fn remote_of(e: &Event) -> EndpointAddress {
    match e {
        Event::Established { remote, .. }
        | Event::Refused { remote, .. }
        | Event::Closed { remote, .. }
        | Event::Data { remote, .. }
        | Event::Completed { remote, .. } => *remote,
    }
}

/// Takes the first occurrence of `key` out of `list`; `true` if it was there.
fn take_key(list: &mut Vec<u64>, key: u64) -> bool {
    match list.iter().position(|k| *k == key) {
        Some(i) => {
            list.swap_remove(i);
            true
        }
        None => false,
    }
}

impl Shared {
    /// Delivers `events` to the suite's handler, with a broken backend
    /// handle made of `sim` and this shared state.
    fn dispatch(self: &Arc<Self>, sim: &SimBackend, events: &[Event]) {
        if events.is_empty() {
            return;
        }
        let b = BrokenBackend {
            inner: sim.clone(),
            shared: self.clone(),
        };
        let _provider_lock = (self.kind == Kind::HandlerUnderLock).then(|| lock(&self.big_lock));
        let mut h = lock(&self.handler);
        for e in events {
            deliver(h.as_mut(), &b, e);
        }
    }

    /// Delivers what was put aside for the flush signal.
    fn flush(self: &Arc<Self>) {
        let events: Vec<(SimBackend, Event)> = lock(&self.pending).drain(..).collect();
        for (sim, e) in events {
            self.dispatch(&sim, &[e]);
        }
    }

    /// Puts `e` aside until the flush signal runs on the loop.
    fn later(&self, sim: &SimBackend, e: Event) {
        lock(&self.pending).push_back((sim.clone(), e));
        if let Some(s) = self.flush.get() {
            s.fire();
        }
    }

    /// The broken provider's view of one event of the simulator.
    fn on_event(self: &Arc<Self>, sim: &SimBackend, e: Event) {
        let mut out = Vec::new();
        match (self.kind, e) {
            (
                Kind::DropCancelledKey,
                Event::Closed {
                    remote,
                    reason,
                    mut keys,
                },
            ) => {
                if !keys.is_empty() {
                    keys.remove(0);
                }
                out.push(Event::Closed {
                    remote,
                    reason,
                    keys,
                });
            }
            (Kind::CompletionTwice, e @ Event::Completed { .. }) => {
                out.push(e.clone());
                out.push(e);
            }
            (Kind::DataTwice, e @ Event::Data { .. }) => {
                let mut n = lock(&self.count);
                *n += 1;
                if *n % 7 == 0 {
                    out.push(e.clone());
                }
                out.push(e);
            }
            (Kind::DataReordered, e) => {
                let r = remote_of(&e);
                let mut held = lock(&self.held);
                match e {
                    Event::Data { .. } => match held.remove(&r) {
                        Some(first) => {
                            out.push(e);
                            out.push(first);
                        }
                        None => {
                            held.insert(r, e);
                        }
                    },
                    other => {
                        out.extend(held.remove(&r));
                        out.push(other);
                    }
                }
            }
            (Kind::DataBeforeEstablished, e) => {
                let r = remote_of(&e);
                let mut held = lock(&self.held);
                if matches!(e, Event::Established { .. }) && lock(&self.initiated).contains(&r) {
                    held.insert(r, e);
                } else {
                    out.push(e);
                    out.extend(held.remove(&r));
                }
            }
            (Kind::CompleteEarly | Kind::ReentrantCompletion, Event::Completed { remote, key }) => {
                if !take_key(&mut lock(&self.early), key) {
                    out.push(Event::Completed { remote, key });
                }
            }
            (
                Kind::CompleteEarly | Kind::ReentrantCompletion,
                Event::Closed {
                    remote,
                    reason,
                    keys,
                },
            ) => {
                let mut early = lock(&self.early);
                let keys = keys
                    .into_iter()
                    .filter(|k| !take_key(&mut early, *k))
                    .collect();
                out.push(Event::Closed {
                    remote,
                    reason,
                    keys,
                });
            }
            (Kind::SwallowBeforeClose, e @ Event::Data { .. }) => {
                self.later(sim, e);
            }
            (Kind::SwallowBeforeClose, e @ Event::Closed { .. }) => {
                let r = remote_of(&e);
                lock(&self.pending).retain(|(_, p)| remote_of(p) != r);
                out.push(e);
            }
            (Kind::NoBackpressure, e @ Event::Completed { .. }) => {
                out.push(e);
                let mut backlog = lock(&self.backlog);
                for _ in 0..backlog.len() {
                    let Some((to, data, key)) = backlog.pop_front() else {
                        break;
                    };
                    if sim.send_data_copy(to, &[&data], &[], key).is_err() {
                        backlog.push_front((to, data, key));
                        break;
                    }
                }
            }
            (
                Kind::WrongCloseReason,
                Event::Closed {
                    remote,
                    reason,
                    keys,
                },
            ) => {
                let reason = if reason == CloseReason::PeerClosed {
                    CloseReason::Reset
                } else {
                    reason
                };
                out.push(Event::Closed {
                    remote,
                    reason,
                    keys,
                });
            }
            (Kind::EventAfterClose, e) => {
                let r = remote_of(&e);
                match &e {
                    Event::Data { data, .. } => {
                        lock(&self.last).insert(r, data.clone());
                        out.push(e);
                    }
                    Event::Closed { .. } => {
                        out.push(e);
                        if let Some(data) = lock(&self.last).remove(&r) {
                            out.push(Event::Data { remote: r, data });
                        }
                    }
                    _ => out.push(e),
                }
            }
            (Kind::LeakPerClose, e @ Event::Closed { .. }) => {
                // The listener is never closed; its address is forgotten.
                let ip = self.ip.get().copied().unwrap_or(IpAddr::from([0, 0, 0, 0]));
                let _ = sim.open_listen_endpoint(
                    EndpointAddress::new(ip, 0),
                    ConnectionParams::receive(64, 1),
                );
                out.push(e);
            }
            (Kind::RefusedAsClosed, Event::Refused { remote, reason }) => {
                out.push(Event::Closed {
                    remote,
                    reason: CloseReason::Other(reason.to_string()),
                    keys: Vec::new(),
                });
            }
            (_, e) => out.push(e),
        }
        self.dispatch(sim, &out);
    }
}

/// The handler given to the simulator: it turns each call into an
/// [`Event`] for [`Shared::on_event`].
struct Wrap(Arc<Shared>);

impl Handler<SimBackend> for Wrap {
    fn on_connection_established(
        &mut self,
        sim: &SimBackend,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.0.on_event(sim, Event::Established { remote, caps });
    }
    fn on_connection_refused(
        &mut self,
        sim: &SimBackend,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let reason = reason.clone();
        self.0.on_event(sim, Event::Refused { remote, reason });
    }
    fn on_connection_closed(
        &mut self,
        sim: &SimBackend,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        let (reason, keys) = (reason.clone(), keys.to_vec());
        self.0.on_event(
            sim,
            Event::Closed {
                remote,
                reason,
                keys,
            },
        );
    }
    fn on_data(&mut self, sim: &SimBackend, remote: EndpointAddress, data: &[u8]) {
        let data = data.to_vec();
        self.0.on_event(sim, Event::Data { remote, data });
    }
    fn on_send_completed(&mut self, sim: &SimBackend, remote: EndpointAddress, key: u64) {
        self.0.on_event(sim, Event::Completed { remote, key });
    }
}

impl BrokenBackend {
    fn kind(&self) -> Kind {
        self.shared.kind
    }

    /// The provider's lock, taken by every operation (`HandlerUnderLock`).
    fn guard(&self) -> Option<MutexGuard<'_, ()>> {
        (self.kind() == Kind::HandlerUnderLock).then(|| lock(&self.shared.big_lock))
    }

    fn widen(&self, mut p: ConnectionParams) -> ConnectionParams {
        if self.kind() == Kind::OversizeDelivered {
            p.recv.buf_size *= 2;
        }
        p
    }
}

impl Backend for BrokenBackend {
    fn features(&self) -> Features {
        self.inner.features()
    }
    fn open_listen_endpoint(
        &self,
        a: EndpointAddress,
        p: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        let _g = self.guard();
        self.inner.open_listen_endpoint(a, self.widen(p))
    }
    fn open_active_endpoint(
        &self,
        a: EndpointAddress,
        p: ConnectionParams,
    ) -> Result<(), OpenActiveError> {
        let _g = self.guard();
        lock(&self.shared.initiated).insert(a);
        self.inner.open_active_endpoint(a, self.widen(p))
    }
    fn close_listen_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
        let _g = self.guard();
        self.inner.close_listen_endpoint(a)
    }
    fn close_active_endpoint(&self, a: EndpointAddress) -> Result<(), CloseError> {
        let _g = self.guard();
        match self.inner.close_active_endpoint(a) {
            Err(CloseError::UnknownActiveEndpoint(x)) if self.kind() == Kind::WrongErrorVariant => {
                Err(CloseError::UnknownListenEndpoint(x))
            }
            r => r,
        }
    }
    fn get_buffer(&self, a: EndpointAddress) -> Result<Option<NetworkBuffer>, BufferError> {
        let _g = self.guard();
        self.inner.get_buffer(a)
    }
    fn send_buffer(&self, a: EndpointAddress, b: NetworkBuffer) -> Result<(), SendError> {
        let _g = self.guard();
        self.inner.send_buffer(a, b)
    }
    fn send_data(
        &self,
        a: EndpointAddress,
        d: &[RegionSlice],
        h: &[u8],
        k: u64,
    ) -> Result<(), SendError> {
        let _g = self.guard();
        let h = if self.kind() == Kind::HeaderDropped {
            &[][..]
        } else {
            h
        };
        self.inner.send_data(a, d, h, k)
    }
    fn send_data_copy(
        &self,
        a: EndpointAddress,
        d: &[&[u8]],
        h: &[u8],
        k: u64,
    ) -> Result<(), SendError> {
        let _g = self.guard();
        let r = self.inner.send_data_copy(a, d, h, k);
        let done = Event::Completed { remote: a, key: k };
        match (self.kind(), r) {
            (Kind::CompleteEarly, Ok(())) => {
                lock(&self.shared.early).push(k);
                self.shared.later(&self.inner, done);
                Ok(())
            }
            (Kind::ReentrantCompletion, Ok(())) => {
                lock(&self.shared.early).push(k);
                // From inside this call; when the call comes from a handler
                // (which is busy), a little later instead.
                match self.shared.handler.try_lock() {
                    Ok(mut inner) => deliver(inner.as_mut(), self, &done),
                    Err(_) => self.shared.later(&self.inner, done),
                }
                Ok(())
            }
            (Kind::NoBackpressure, Err(SendError::NoResources)) => {
                let mut data = h.to_vec();
                d.iter().for_each(|c| data.extend_from_slice(c));
                lock(&self.shared.backlog).push_back((a, data, k));
                Ok(())
            }
            (_, r) => r,
        }
    }
    fn num_available_buffers(&self, a: EndpointAddress) -> Result<usize, BufferError> {
        let _g = self.guard();
        let first = self.inner.num_available_buffers(a);
        if self.kind() == Kind::LowWaterNotReset {
            // The first read resets the mark, so the second is the count now.
            return first.and_then(|_| self.inner.num_available_buffers(a));
        }
        first
    }
    fn memory_usage(&self) -> MemoryUsage {
        self.inner.memory_usage()
    }
}

/// The simulator's harness with its backends broken by `K`.
struct Broken<K: Bug> {
    sim: SimHarness,
    bug: PhantomData<K>,
}

impl<K: Bug> Harness for Broken<K> {
    type Loop = SimLoop;
    type Backend = BrokenBackend;

    fn setup() -> Self {
        Self {
            sim: SimHarness::setup(),
            bug: PhantomData,
        }
    }
    fn features(&self) -> Features {
        Features::ALL
    }
    fn backend(
        &mut self,
        config: BackendConfig,
        handler: Box<dyn Handler<BrokenBackend>>,
    ) -> BrokenBackend {
        // The next node's address: the simulator gives each backend a host.
        let node = self.sim.node_count();
        let shared = Arc::new(Shared {
            kind: K::KIND,
            handler: Mutex::new(handler),
            pending: Mutex::default(),
            flush: OnceLock::new(),
            early: Mutex::default(),
            backlog: Mutex::default(),
            held: Mutex::default(),
            last: Mutex::default(),
            initiated: Mutex::default(),
            count: Mutex::default(),
            big_lock: Mutex::default(),
            ip: OnceLock::new(),
        });
        let inner = self.sim.backend(config, Box::new(Wrap(shared.clone())));
        debug_assert_eq!(self.sim.node_count(), node + 1);
        let _ = shared.ip.set(self.sim.local_ip(node));
        let weak = Arc::downgrade(&shared);
        let signal = self.sim.event_loop(node).signal(move || {
            if let Some(s) = weak.upgrade() {
                s.flush();
            }
        });
        let _ = shared.flush.set(signal);
        BrokenBackend { inner, shared }
    }
    fn local_ip(&self, node: NodeId) -> IpAddr {
        self.sim.local_ip(node)
    }
    fn refusing_address(&mut self) -> EndpointAddress {
        self.sim.refusing_address()
    }
    fn event_loop(&self, node: NodeId) -> &SimLoop {
        self.sim.event_loop(node)
    }
    fn post(&mut self, node: NodeId, f: Box<dyn FnOnce() + Send + 'static>) {
        self.sim.post(node, f)
    }
    fn pause(&mut self, node: NodeId) {
        self.sim.pause(node)
    }
    fn resume(&mut self, node: NodeId, first: Box<dyn FnOnce() + Send + 'static>) {
        self.sim.resume(node, first)
    }
    fn wait_until(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        self.sim.wait_until(cond)
    }
    fn settle(&mut self) {
        self.sim.settle()
    }
    fn fresh_loop(&mut self) -> SimLoop {
        self.sim.fresh_loop()
    }
    fn resources(&mut self) -> usize {
        self.sim.resources()
    }
    fn can_reset(&self) -> bool {
        true
    }
    fn reset(&mut self, node: NodeId, remote: EndpointAddress) {
        self.sim.reset(node, remote)
    }
}

// ------------------------------------------------------------------ running

/// Wall time one behaviour may take against a broken provider before it
/// counts as hung.
const LIMIT: Duration = Duration::from_secs(60);
/// Behaviours of one entry running at once.
const PARALLEL: usize = 4;

/// Keeps panics of the catalogue's threads off stderr (their messages are
/// collected and printed per entry); other threads' panics are reported as
/// usual.
fn quiet_catalogue_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let ours = thread::current()
                .name()
                .is_some_and(|n| n.starts_with("catalogue "));
            if !ours {
                previous(info);
            }
        }));
    });
}

/// The outcome of one behaviour: `Ok` if it passed, its failure message if
/// it panicked.
type Outcome = Result<(), String>;

/// What running the suite against one entry gave.
struct Report {
    /// Failing behaviours (`module::name`) with the first line of each
    /// failure.
    failed: BTreeMap<String, String>,
    /// Behaviours still running after [`LIMIT`].
    hung: Vec<String>,
    /// How many behaviours ran.
    ran: usize,
}

/// Runs the whole suite against `Broken<K>`.
fn run_suite<K: Bug>(label: &str) -> Report {
    quiet_catalogue_panics();
    let list = behaviours::<Broken<K>>();
    let mut todo: VecDeque<_> = list.iter().collect();
    let mut running: Vec<(String, JoinHandle<Outcome>, Instant)> = Vec::new();
    let mut report = Report {
        failed: BTreeMap::new(),
        hung: Vec::new(),
        ran: list.len(),
    };
    // Every behaviour is started once and waited for at most LIMIT, so the
    // loop ends; the bound on rounds is a second guard.
    let max_rounds = (list.len() as u128 + 1) * (LIMIT.as_millis() / 2 + 1);
    let mut rounds = 0u128;
    while !(todo.is_empty() && running.is_empty()) {
        rounds += 1;
        assert!(rounds <= max_rounds, "{label}: the runner did not finish");
        while running.len() < PARALLEL {
            let Some(b) = todo.pop_front() else { break };
            let (run, path) = (b.run, b.path());
            let t = thread::Builder::new()
                .name(format!("catalogue {label} {path}"))
                .spawn(move || {
                    std::panic::catch_unwind(run).map_err(|p| {
                        p.downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "(a panic without a message)".to_string())
                    })
                })
                .expect("spawning a behaviour's thread");
            running.push((path, t, Instant::now()));
        }
        let mut i = 0;
        while i < running.len() {
            let (_, t, start) = &running[i];
            if t.is_finished() {
                let (path, t, _) = running.swap_remove(i);
                let outcome = t
                    .join()
                    .unwrap_or_else(|_| Err("(the thread panicked outside the test)".into()));
                if let Err(msg) = outcome {
                    let first = msg.lines().next().unwrap_or("").to_string();
                    report.failed.insert(path, first);
                }
            } else if start.elapsed() > LIMIT {
                // A hung thread cannot be ended; it is left behind.
                let (path, _, _) = running.swap_remove(i);
                report.hung.push(path);
            } else {
                i += 1;
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
    report
}

/// Runs the suite against `Broken<K>`, prints what failed, and asserts that
/// it failed each behaviour in `expected` (named without the module: in
/// every module where it runs) and that nothing hung. Returns the failures.
fn assert_caught<K: Bug>(label: &str, expected: &[&str]) -> BTreeMap<String, String> {
    let start = Instant::now();
    let report = run_suite::<K>(label);
    println!(
        "{label}: {} of {} behaviours failed in {:.1} s",
        report.failed.len(),
        report.ran,
        start.elapsed().as_secs_f64()
    );
    for (path, msg) in &report.failed {
        println!("  {path}: {msg}");
    }
    assert!(
        report.hung.is_empty(),
        "{label}: behaviours hung instead of failing: {:?}",
        report.hung
    );
    assert!(
        !report.failed.is_empty(),
        "{label}: the suite passed a provider that breaks a rule"
    );
    let list = behaviours::<Broken<K>>();
    for name in expected {
        let paths: Vec<String> = list
            .iter()
            .filter(|b| b.name == *name)
            .map(|b| b.path())
            .collect();
        assert!(
            !paths.is_empty(),
            "{label}: the suite has no behaviour {name}"
        );
        for path in paths {
            assert!(
                report.failed.contains_key(&path),
                "{label}: the suite must fail {path}, the behaviour named after the broken \
                 rule; it failed {:?}",
                report.failed.keys().collect::<Vec<_>>()
            );
        }
    }
    report.failed
}

#[test]
fn the_unbroken_wrapper_passes_the_whole_suite() {
    let report = run_suite::<Control>("control");
    println!("control: {} behaviours ran", report.ran);
    assert!(
        report.failed.is_empty() && report.hung.is_empty(),
        "the wrapper that breaks nothing must pass: failed {:?}, hung {:?}",
        report.failed,
        report.hung
    );
}

#[test]
fn dropping_a_cancelled_key_is_caught() {
    assert_caught::<DropCancelledKey>(
        "dropping a cancelled key",
        &[
            "peer_close_with_sends_in_flight_reports_each_key_once_on_both_sides",
            "local_close_with_sends_held_in_flight_reports_each_key_once_on_both_sides",
        ],
    );
}

#[test]
fn reporting_a_completion_twice_is_caught() {
    assert_caught::<CompletionTwice>(
        "reporting a completion twice",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn delivering_a_message_twice_is_caught() {
    assert_caught::<DataTwice>(
        "delivering a message twice",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn delivering_messages_out_of_order_is_caught() {
    assert_caught::<DataReordered>(
        "delivering messages out of order",
        &["many_messages_arrive_in_order_exactly_once"],
    );
}

#[test]
fn data_before_established_is_caught() {
    assert_caught::<DataBeforeEstablished>(
        "data before established",
        &["established_comes_first_even_when_the_peer_greets_from_its_established_callback"],
    );
}

#[test]
fn completing_a_send_early_is_caught() {
    assert_caught::<CompleteEarly>(
        "completing a send early",
        &["sender_close_after_completions_delivers_everything_before_the_peer_hears_of_it"],
    );
}

#[test]
fn swallowing_messages_that_arrive_with_the_hang_up_is_caught() {
    assert_caught::<SwallowBeforeClose>(
        "swallowing messages with the hang-up",
        &["messages_before_a_peer_close_are_delivered_before_the_close"],
    );
}

#[test]
fn delivering_an_oversize_message_is_caught() {
    assert_caught::<OversizeDelivered>(
        "delivering an oversize message",
        &["message_larger_than_receive_buffer_closes_connection_clearly"],
    );
}

#[test]
fn a_wrong_error_variant_is_caught() {
    assert_caught::<WrongErrorVariant>(
        "wrong error variant",
        &[
            "closing_unknown_endpoint_fails",
            "operations_on_unknown_endpoint_fail",
        ],
    );
}

#[test]
fn a_handler_called_from_inside_a_backend_call_is_caught() {
    assert_caught::<ReentrantCompletion>(
        "handler called from inside a backend call",
        &["handlers_are_never_called_from_inside_a_backend_call"],
    );
}

#[test]
fn missing_backpressure_is_caught() {
    assert_caught::<NoBackpressure>(
        "no backpressure",
        &["backpressure_stops_copy_sends_and_resumes_after_the_peer_reads"],
    );
}

#[test]
fn a_wrong_close_reason_is_caught() {
    assert_caught::<WrongCloseReason>(
        "wrong close reason",
        &["closing_active_endpoint_reports_closed_on_both_sides"],
    );
}

#[test]
fn an_event_after_the_close_is_caught() {
    // Only behaviours that exchange messages before a close can see this
    // one (closing_active_endpoint_reports_closed_on_both_sides sends
    // nothing, so it passes); the monitor names the rule.
    let failed = assert_caught::<EventAfterClose>(
        "event after close",
        &["messages_before_a_peer_close_are_delivered_before_the_close"],
    );
    assert!(
        failed
            .values()
            .any(|m| m.contains("after on_connection_closed")),
        "the monitor must name the rule (an event after on_connection_closed): {failed:?}"
    );
}

#[test]
fn a_leak_per_closed_connection_is_caught() {
    assert_caught::<LeakPerClose>(
        "a leak per closed connection",
        &["open_close_cycles_leave_no_resources_behind"],
    );
}

#[test]
fn a_low_water_mark_that_is_not_reset_is_caught() {
    assert_caught::<LowWaterNotReset>(
        "low-water mark not reset",
        &["low_water_mark_of_free_buffers_resets_on_read"],
    );
}

#[test]
fn a_dropped_header_is_caught() {
    assert_caught::<HeaderDropped>(
        "header dropped",
        &["zero_copy_header_is_prepended_to_payload"],
    );
}

#[test]
fn a_refusal_reported_as_a_close_is_caught() {
    assert_caught::<RefusedAsClosed>(
        "refusal reported as a close",
        &["connecting_to_nothing_is_refused_on_initiator_only"],
    );
}

// ------------------------------------------------- the deadlock, in a child

/// Wall time the child may take before it counts as hung.
const CHILD_LIMIT: Duration = Duration::from_secs(60);
/// Wall time within which the child must have failed.
const CHILD_FAILS_WITHIN: Duration = Duration::from_secs(30);

#[test]
#[ignore = "run in a child process by handler_under_the_providers_lock_fails_in_seconds"]
fn handler_under_the_providers_lock_thread_safe() {
    netio_conformance::tests::handler_can_send_and_close_inside_callbacks::<Broken<Deadlock>>(
        ThreadSafety::Safe,
    );
}

#[test]
#[ignore = "run in a child process by handler_under_the_providers_lock_fails_in_seconds"]
fn handler_under_the_providers_lock_thread_unsafe() {
    netio_conformance::tests::handler_can_send_and_close_inside_callbacks::<Broken<Deadlock>>(
        ThreadSafety::Unsafe,
    );
}

#[test]
fn handler_under_the_providers_lock_fails_in_seconds() {
    let exe = std::env::current_exe().expect("the path of this test binary");
    for child_test in [
        "handler_under_the_providers_lock_thread_safe",
        "handler_under_the_providers_lock_thread_unsafe",
    ] {
        let start = Instant::now();
        let mut child = Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                child_test,
                "--nocapture",
                "--test-threads=1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the child test");
        // Read stderr on a thread of its own so a full pipe never blocks
        // the child.
        let mut pipe = child.stderr.take().expect("the child's stderr");
        let reader = thread::spawn(move || {
            let mut err = String::new();
            let _ = pipe.read_to_string(&mut err);
            err
        });
        let status = loop {
            if let Some(s) = child.try_wait().expect("waiting for the child") {
                break Some(s);
            }
            if start.elapsed() > CHILD_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        let err = reader.join().unwrap_or_default();
        let status = status.unwrap_or_else(|| {
            panic!(
                "{child_test}: the deadlocked provider hung the child for {CHILD_LIMIT:?}: {err}"
            )
        });
        println!(
            "{child_test}: {status} after {:.1} s; stderr: {}",
            elapsed.as_secs_f64(),
            err.trim()
        );
        assert!(
            !status.success(),
            "{child_test}: a provider that deadlocks in a handler must fail; stderr: {err}"
        );
        assert!(
            elapsed < CHILD_FAILS_WITHIN,
            "{child_test}: it must fail within {CHILD_FAILS_WITHIN:?}, took {elapsed:?}"
        );
        assert!(
            err.contains("inside a handler call"),
            "{child_test}: the failure must name the cause (stuck inside a handler call); \
             stderr: {err}"
        );
    }
}
