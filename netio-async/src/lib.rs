//! An async API over any netio provider, runtime-agnostic: it needs
//! `futures` only, and its default feature `tokio` adds
//! [`tokio_driver`], which runs a netio loop inside a tokio runtime.
//!
//! [`AsyncBackend`] installs its own [`Handler`] on a backend and turns its
//! callbacks into wake-ups: [`AsyncBackend::connect`] is a future of an
//! [`AsyncConn`]; accepted connections come from the [`Incoming`] stream;
//! [`AsyncConn::send`] waits while the connection has no room (a full
//! send queue is never an error) and resolves when the provider reports
//! the send completed, or fails with the close reason when the send is
//! cancelled by a close; sends on one connection leave in the order their
//! futures were first polled, also when they had to wait for room
//! ([`AsyncConn::send`]); [`AsyncConn::send_parts`] sends a header and a
//! gather list as one message. [`AsyncConn::recv`] and the [`Messages`]
//! stream give the received messages in order, and pause receiving from
//! the peer while [`HIGH_WATER`] messages wait unread (resumed when half
//! of them were read; [`AsyncConn::set_high_water`] sets another mark per
//! connection), so a slow reader pushes back on its sender;
//! [`AsyncConn::pause`] and [`AsyncConn::resume`] do it by hand.
//!
//! Handler callbacks run on the provider's loop thread. Futures run
//! there too as tasks ([`AsyncBackend::spawn`]): a message or a completion
//! that wakes a task is followed by its poll in the same loop turn, with
//! no system call, so a task answers at about the speed of a handler
//! callback, and on the simulator tasks run inside the simulation with
//! nothing else to drive (one seed, one trace). There an application of
//! tasks runs under the chaos runner as a callback application does: a
//! crash drops the tasks of the host's backends (`Sim::crash`), its
//! restart hook spawns new ones on new backends, and the end of each run
//! (`Sim::shut_down`) frees the tasks that hold their backends.
//! Futures can also be polled on any other thread (the backend must then
//! be thread-safe, `ThreadSafety::Safe`) or, on the simulator, by an
//! executor on the thread that drives it, as below.
//!
//! ```
//! use futures::executor::LocalPool;
//! use futures::task::LocalSpawnExt;
//! use netio_async::AsyncBackend;
//! use netio_core::{BackendConfig, ConnectionParams, EndpointAddress};
//! use netio_sim::Sim;
//! use std::time::Duration;
//!
//! let sim = Sim::with_seed(1);
//! let (hs, hc) = (sim.next_host(), sim.next_host());
//! let server = AsyncBackend::new(|h| hs.backend(BackendConfig::default(), h)).unwrap();
//! let client = AsyncBackend::new(|h| hc.backend(BackendConfig::default(), h)).unwrap();
//! let params = ConnectionParams::receive(64, 4);
//! let addr = server.listen(EndpointAddress::new(hs.ip(), 0), params.clone()).unwrap();
//!
//! let mut pool = LocalPool::new();
//! let got = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
//! let g = got.clone();
//! pool.spawner().spawn_local(async move {
//!     let conn = server.accept().await.unwrap();
//!     while let Some(m) = conn.recv().await {
//!         g.borrow_mut().push(m);
//!     }
//! }).unwrap();
//! pool.spawner().spawn_local(async move {
//!     let conn = client.connect(addr, params).await.unwrap();
//!     conn.send(b"hello").await.unwrap();
//!     conn.close().unwrap();
//! }).unwrap();
//! for _ in 0..1000 {
//!     pool.run_until_stalled();
//!     if !got.borrow().is_empty() { break; }
//!     sim.run_for(Duration::from_micros(100));
//! }
//! assert_eq!(*got.borrow(), vec![b"hello".to_vec()]);
//! ```

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use futures::Stream;

mod exec;
pub mod session;
#[cfg(feature = "tokio")]
pub mod tokio_driver;
pub use exec::Task;
use exec::{Executor, Output, EXEC_TOKEN};
use netio_core::fast_map::FastMap;
use netio_core::{
    Backend, Capabilities, CloseError, CloseReason, ConnError, ConnId, ConnectionParams,
    CopyMessage, EndpointAddress, Handler, OpenActiveError, OpenListenError, RefuseReason,
    SendError,
};

/// Messages a connection keeps unread before it pauses receiving from its
/// peer, unless [`AsyncConn::set_high_water`] says otherwise; it resumes
/// once half of them were read.
pub const HIGH_WATER: usize = 64;

/// Why [`AsyncBackend::connect`] gave no connection.
#[derive(Debug)]
pub enum ConnectError {
    /// The backend refused to start the attempt.
    Open(OpenActiveError),
    /// The attempt failed (reported with `on_connection_refused`).
    Refused(RefuseReason),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open(e) => write!(f, "cannot connect: {e}"),
            Self::Refused(r) => write!(f, "connection refused: {r:?}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// Why an [`AsyncConn::send`] did not complete.
#[derive(Debug)]
pub enum SendFailed {
    /// The connection closed with the send in flight: the provider
    /// reported its key cancelled.
    Cancelled(CloseReason),
    /// The connection closed before the send was made (also while the
    /// send waited for room, or when this side's own `close` came first).
    Closed(CloseReason),
    /// The backend refused the send for a reason other than a full queue
    /// (for example a message larger than the connection allows).
    Refused(SendError),
}

impl fmt::Display for SendFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cancelled(r) => write!(f, "send cancelled: connection closed ({r:?})"),
            Self::Closed(r) => write!(f, "connection closed ({r:?})"),
            Self::Refused(e) => write!(f, "send refused: {e}"),
        }
    }
}

impl std::error::Error for SendFailed {}

enum Phase {
    Opening,
    Open,
    Refused(RefuseReason),
    Closed(CloseReason),
}

/// Received messages not yet read: their bytes one after another in one
/// ring, and their lengths. A message costs no allocation of its own until
/// it is read as a `Vec` ([`AsyncConn::recv_into`] reads it with none).
#[derive(Default)]
struct Inbox {
    bytes: VecDeque<u8>,
    lens: VecDeque<usize>,
}

impl Inbox {
    fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        self.lens.push_back(data.len());
    }

    fn len(&self) -> usize {
        self.lens.len()
    }

    /// Moves the oldest message into `out` (replacing what it held);
    /// `false` when there is none.
    fn pop_into(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(n) = self.lens.pop_front() else {
            return false;
        };
        out.clear();
        out.reserve(n);
        let (a, b) = self.bytes.as_slices();
        let from_a = n.min(a.len());
        out.extend_from_slice(&a[..from_a]);
        out.extend_from_slice(&b[..n - from_a]);
        self.bytes.drain(..n);
        true
    }
}

struct ConnState {
    phase: Phase,
    remote: EndpointAddress,
    /// Wakes the connect future.
    opening: Option<Waker>,
    received: Inbox,
    reader: Option<Waker>,
    /// Receiving is paused at the provider (by the high-water mark or by
    /// hand).
    paused: bool,
    /// [`AsyncConn::pause`] holds it paused until [`AsyncConn::resume`].
    held: bool,
    /// Unread messages at which receiving pauses.
    high_water: usize,
    /// The highest key of this connection reported completed: its sends
    /// complete in order, so every earlier one did too.
    completed_through: Option<u64>,
    /// The sends made and not reported completed yet, in key order, with
    /// the waker of the future waiting for each (`None` once it was
    /// dropped).
    in_flight: VecDeque<(u64, Option<Waker>)>,
    /// The key of the last send made on this connection (what
    /// [`AsyncConn::flush`] waits for).
    last_sent: Option<u64>,
    /// Sends waiting for room.
    waiting: Vec<Waker>,
    /// The tickets of the sends waiting for room, oldest first: only the
    /// oldest may try, so sends leave in the order they first asked.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// Its `AsyncConn` was dropped: the state goes with the close report.
    dropped: bool,
}

impl ConnState {
    fn new(phase: Phase, remote: EndpointAddress) -> Self {
        Self {
            phase,
            remote,
            opening: None,
            received: Inbox::default(),
            reader: None,
            paused: false,
            held: false,
            high_water: HIGH_WATER,
            completed_through: None,
            in_flight: VecDeque::new(),
            last_sent: None,
            waiting: Vec::new(),
            queue: VecDeque::new(),
            next_ticket: 0,
            dropped: false,
        }
    }

    fn wake_all(&mut self) {
        if let Some(w) = self.opening.take() {
            w.wake();
        }
        if let Some(w) = self.reader.take() {
            w.wake();
        }
        self.waiting.drain(..).for_each(Waker::wake);
    }

    /// The outcome of the send with `key`, made already: its completion or
    /// cancellation, or pending (the waker kept for it).
    fn poll_sent(&mut self, key: u64, cx: &Context<'_>) -> Poll<Result<(), SendFailed>> {
        if self.completed_through.is_some_and(|k| key <= k) {
            return Poll::Ready(Ok(()));
        }
        // Closed with the send in flight: the close cancelled it.
        if let Phase::Closed(r) = &self.phase {
            return Poll::Ready(Err(SendFailed::Cancelled(r.clone())));
        }
        let waker = Some(cx.waker().clone());
        match self.in_flight.binary_search_by_key(&key, |e| e.0) {
            Ok(i) => self.in_flight[i].1 = waker,
            Err(i) => self.in_flight.insert(i, (key, waker)),
        }
        Poll::Pending
    }

    /// The failure of a send not made yet on a closed connection (it
    /// leaves the line of sends waiting for room).
    fn closed_before_send(&mut self, ticket: &mut Option<u64>) -> Option<SendFailed> {
        let r = self.closed()?.clone();
        let t = ticket.take();
        self.leave_queue(t);
        Some(SendFailed::Closed(r))
    }

    /// Whether a send holding `ticket` (or none yet) may try now.
    fn first_in_line(&self, ticket: Option<u64>) -> bool {
        match ticket {
            Some(t) => self.queue.front() == Some(&t),
            None => self.queue.is_empty(),
        }
    }

    /// A send future dropped: it leaves the line, and its outcome, if its
    /// send was made, is forgotten when it comes.
    fn abandon(&mut self, ticket: Option<u64>, key: Option<u64>) {
        self.leave_queue(ticket);
        let Some(key) = key else { return };
        if let Ok(i) = self.in_flight.binary_search_by_key(&key, |e| e.0) {
            self.in_flight[i].1 = None;
        }
    }

    /// Waits for room: takes a place at the end of the line unless it
    /// holds one, and is woken when room comes.
    fn wait_in_line(&mut self, ticket: &mut Option<u64>, cx: &Context<'_>) {
        if ticket.is_none() {
            let t = self.next_ticket;
            self.next_ticket += 1;
            self.queue.push_back(t);
            *ticket = Some(t);
        }
        self.waiting.push(cx.waker().clone());
    }

    /// Leaves the queue of sends waiting for room; the next one in line
    /// may try.
    fn leave_queue(&mut self, ticket: Option<u64>) {
        let Some(t) = ticket else { return };
        let was_first = self.queue.front() == Some(&t);
        self.queue.retain(|&x| x != t);
        if was_first {
            self.waiting.drain(..).for_each(Waker::wake);
        }
    }

    fn closed(&self) -> Option<&CloseReason> {
        match &self.phase {
            Phase::Closed(r) => Some(r),
            _ => None,
        }
    }
}

#[derive(Default)]
struct State {
    next_key: u64,
    conns: FastMap<ConnId, ConnState>,
    /// Accepted connections not yet taken with `accept`.
    incoming: VecDeque<(ConnId, EndpointAddress)>,
    acceptor: Option<Waker>,
    next_timer: u64,
    /// Sleeps by timer token: fired yet, and the sleeper's waker.
    timers: FastMap<u64, (bool, Option<Waker>)>,
}

struct Shared {
    state: Mutex<State>,
    /// The tasks of [`AsyncBackend::spawn`], polled on the loop thread.
    exec: Arc<Executor>,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            exec: Arc::new(Executor::new()),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// The handler [`AsyncBackend`] installs on its backend.
///
/// When the backend drops it (the backend ended, or on the simulator its
/// host crashed), the backend's tasks are dropped: nothing can poll them
/// any more.
pub struct AsyncHandler {
    shared: Arc<Shared>,
}

impl Drop for AsyncHandler {
    fn drop(&mut self) {
        self.shared.exec.shut_down();
    }
}

impl<B: Backend + ?Sized> Handler<B> for AsyncHandler {
    fn on_connection_established(
        &mut self,
        _b: &B,
        conn: ConnId,
        remote: EndpointAddress,
        _capabilities: Capabilities,
    ) {
        let mut st = self.shared.lock();
        if let Some(c) = st.conns.get_mut(&conn) {
            c.phase = Phase::Open;
            if let Some(w) = c.opening.take() {
                w.wake();
            }
        } else {
            st.conns.insert(conn, ConnState::new(Phase::Open, remote));
            st.incoming.push_back((conn, remote));
            if let Some(w) = st.acceptor.take() {
                w.wake();
            }
        }
    }

    fn on_connection_refused(
        &mut self,
        _b: &B,
        conn: ConnId,
        _remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let mut st = self.shared.lock();
        if let Some(c) = st.conns.get_mut(&conn) {
            c.phase = Phase::Refused(reason.clone());
            c.wake_all();
            if c.dropped {
                st.conns.remove(&conn);
            }
        }
    }

    fn on_connection_closed(
        &mut self,
        _b: &B,
        conn: ConnId,
        _remote: EndpointAddress,
        reason: &CloseReason,
        _cancelled_keys: &[u64],
    ) {
        let mut st = self.shared.lock();
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        c.phase = Phase::Closed(reason.clone());
        // Every send still in flight was cancelled: its future sees the
        // close.
        c.in_flight
            .drain(..)
            .filter_map(|(_, w)| w)
            .for_each(Waker::wake);
        c.wake_all();
        if c.dropped {
            st.conns.remove(&conn);
        }
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        let mut st = self.shared.lock();
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        c.received.push(data);
        if c.received.len() >= c.high_water && !c.paused && b.pause_receive(conn).is_ok() {
            c.paused = true;
        }
        if let Some(w) = c.reader.take() {
            w.wake();
        }
    }

    fn on_timer(&mut self, _b: &B, token: u64) {
        let mut st = self.shared.lock();
        if let Some((fired, waker)) = st.timers.get_mut(&token) {
            *fired = true;
            if let Some(w) = waker.take() {
                w.wake();
            }
        }
    }

    fn on_sends_completed(&mut self, _b: &B, conn: ConnId, keys: &[u64]) {
        let mut st = self.shared.lock();
        let Some(c) = st.conns.get_mut(&conn) else {
            return;
        };
        // In send order: the last key is the highest.
        if let Some(&last) = keys.last() {
            c.completed_through = Some(c.completed_through.map_or(last, |k| k.max(last)));
            while c.in_flight.front().is_some_and(|e| e.0 <= last) {
                if let Some((_, Some(w))) = c.in_flight.pop_front() {
                    w.wake();
                }
            }
        }
        // Room again.
        c.waiting.drain(..).for_each(Waker::wake);
    }

    fn on_wake(&mut self, _b: &B, token: u64) {
        if token == EXEC_TOKEN {
            self.shared.exec.woken();
            self.shared.exec.run_ready();
        }
    }
}

/// A backend driven through futures and streams.
pub struct AsyncBackend<B> {
    backend: B,
    shared: Arc<Shared>,
}

impl<B: Backend + Clone> AsyncBackend<B> {
    /// Creates the backend with `make`, handing it the handler that feeds
    /// the futures (for example `|h| host.backend(config, h)` on the
    /// simulator, `|h| TcpProvider::create(&lp, config, h)` on TCP).
    pub fn new<E>(make: impl FnOnce(AsyncHandler) -> Result<B, E>) -> Result<Self, E> {
        let shared = Arc::new(Shared::default());
        let backend = make(AsyncHandler {
            shared: Arc::clone(&shared),
        })?;
        Ok(Self { backend, shared })
    }

    /// The backend, for what this API does not cover.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Runs `future` as a task on the backend's loop thread and returns a
    /// [`Task`], a future of its output (which any thread may await).
    ///
    /// A task is polled only on the loop thread, from the handler's
    /// `on_wake` ([`Backend::wake`]). A message, a send completion or a
    /// connection event that wakes it, reported on the loop thread, asks
    /// for that with no system call, and the poll follows the events the
    /// provider is dispatching, in the same loop turn: a reply the task
    /// sends leaves in the turn that delivered the message, and a burst of
    /// messages read at once costs the task one poll. A task woken from
    /// another thread is polled soon after the loop wakes. A task's future
    /// is dropped on the loop thread too (also when its `Task` is dropped
    /// elsewhere), so on the loop thread a backend made for one thread
    /// (`ThreadSafety::Unsafe`) serves tasks.
    ///
    /// A task that never finishes keeps what it holds alive, this backend
    /// included when it holds an [`AsyncConn`] or the `AsyncBackend`
    /// itself: end it, or drop its `Task`, to let them go.
    pub fn spawn<F>(&self, future: F) -> Task<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
        B: 'static,
    {
        let output = Output::new();
        let out = Arc::clone(&output);
        let task = self.shared.exec.spawn(
            Box::pin(async move { out.set(future.await) }),
            exec::wake_loop(&self.backend),
        );
        Task::new(task, output)
    }

    /// Tasks spawned with [`spawn`](Self::spawn) that have not finished
    /// (nor been dropped with their `Task`) yet.
    pub fn tasks(&self) -> usize {
        self.shared.exec.len()
    }

    /// Listens at `address`; the connections it accepts come from
    /// [`accept`](Self::accept) and [`incoming`](Self::incoming).
    pub fn listen(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        self.backend.open_listen_endpoint(address, params)
    }

    /// Connects to `address`: resolves once the connection is established,
    /// or with the reason it was refused.
    pub fn connect(
        &self,
        address: EndpointAddress,
        params: ConnectionParams,
    ) -> impl Future<Output = Result<AsyncConn<B>, ConnectError>> + '_ {
        // Opened under the state lock, so the handler cannot report the
        // connection before its state exists.
        let mut opened = {
            let mut st = self.shared.lock();
            self.backend
                .open_active_endpoint(address, params)
                .inspect(|id| {
                    st.conns
                        .insert(*id, ConnState::new(Phase::Opening, address));
                })
                .map_err(Some)
        };
        futures::future::poll_fn(move |cx| {
            let id = match &mut opened {
                Ok(id) => *id,
                Err(e) => {
                    return Poll::Ready(Err(match e.take() {
                        Some(e) => ConnectError::Open(e),
                        None => ConnectError::Refused(RefuseReason::Cancelled),
                    }))
                }
            };
            let mut st = self.shared.lock();
            let Some(c) = st.conns.get_mut(&id) else {
                return Poll::Ready(Err(ConnectError::Refused(RefuseReason::Cancelled)));
            };
            match &c.phase {
                Phase::Opening => {
                    c.opening = Some(cx.waker().clone());
                    Poll::Pending
                }
                Phase::Refused(r) => {
                    let r = r.clone();
                    st.conns.remove(&id);
                    Poll::Ready(Err(ConnectError::Refused(r)))
                }
                Phase::Open | Phase::Closed(_) => Poll::Ready(Ok(self.conn(id, c.remote))),
            }
        })
    }

    /// The time on the backend's loop clock (virtual on the simulator).
    pub fn now(&self) -> std::time::Duration {
        self.backend.now()
    }

    /// Resolves `delay` from now on the backend's loop clock (a timer of
    /// the backend: virtual time on the simulator, so a simulated run
    /// stays deterministic).
    pub fn sleep(&self, delay: std::time::Duration) -> impl Future<Output = ()> + '_ {
        let token = {
            let mut st = self.shared.lock();
            let token = st.next_timer;
            st.next_timer += 1;
            st.timers.insert(token, (false, None));
            token
        };
        self.backend.set_timer(delay, token);
        Sleep {
            shared: &self.shared,
            token,
        }
    }

    /// The next connection accepted by any listener of this backend.
    pub fn accept(&self) -> impl Future<Output = Option<AsyncConn<B>>> + '_ {
        futures::future::poll_fn(move |cx| self.poll_accept(cx))
    }

    /// The accepted connections as a stream.
    pub fn incoming(&self) -> Incoming<'_, B> {
        Incoming { backend: self }
    }

    fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Option<AsyncConn<B>>> {
        let mut st = self.shared.lock();
        match st.incoming.pop_front() {
            Some((id, remote)) => Poll::Ready(Some(self.conn(id, remote))),
            None => {
                st.acceptor = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn conn(&self, id: ConnId, remote: EndpointAddress) -> AsyncConn<B> {
        AsyncConn {
            backend: self.backend.clone(),
            shared: Arc::clone(&self.shared),
            id,
            remote,
        }
    }
}

/// The stream of accepted connections ([`AsyncBackend::incoming`]).
pub struct Incoming<'a, B> {
    backend: &'a AsyncBackend<B>,
}

impl<B: Backend + Clone> Stream for Incoming<'_, B> {
    type Item = AsyncConn<B>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AsyncConn<B>>> {
        self.backend.poll_accept(cx)
    }
}

/// One connection. Dropping it closes the connection if it is still open.
pub struct AsyncConn<B: Backend + Clone> {
    backend: B,
    shared: Arc<Shared>,
    id: ConnId,
    remote: EndpointAddress,
}

impl<B: Backend + Clone> AsyncConn<B> {
    /// The connection's handle on its backend.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// The peer's address.
    pub fn remote(&self) -> EndpointAddress {
        self.remote
    }

    /// Sends one message (copied when the send is made): waits while the
    /// connection has no room, then resolves when the provider reports the
    /// send completed. A close with the send in flight fails it with
    /// [`SendFailed::Cancelled`].
    ///
    /// Sends on one connection are made in the order their futures were
    /// first polled: a send that finds others waiting for room waits
    /// behind them, whatever order the executor polls them in later, so
    /// the peer receives them in that order. A send future dropped before
    /// its send was made gives up its place.
    pub fn send<'a>(&'a self, data: &'a [u8]) -> impl Future<Output = Result<(), SendFailed>> + 'a {
        SendFuture {
            conn: self,
            header: &[],
            parts: Parts::One(data),
            feed: false,
            finished: false,
            key: None,
            ticket: None,
        }
    }

    /// Sends one message (copied when the send is made) without waiting
    /// for its completion: resolves once the provider took it, waiting
    /// while the connection has no room, in line with the other sends as
    /// [`send`](Self::send) does. The cheap way to send many small
    /// messages one at a time: `feed(&m).await` per message, then
    /// [`flush`](Self::flush) to know they all completed. A close after
    /// the send was made is reported by `flush` (and by `recv`), not here.
    pub fn feed<'a>(&'a self, data: &'a [u8]) -> impl Future<Output = Result<(), SendFailed>> + 'a {
        SendFuture {
            conn: self,
            header: &[],
            parts: Parts::One(data),
            feed: true,
            finished: false,
            key: None,
            ticket: None,
        }
    }

    /// Resolves when every send made so far on this connection completed
    /// (at once if there was none), or fails with
    /// [`SendFailed::Cancelled`] when a close cancelled any of them.
    pub fn flush(&self) -> impl Future<Output = Result<(), SendFailed>> + '_ {
        futures::future::poll_fn(move |cx| {
            let mut st = self.shared.lock();
            let Some(c) = st.conns.get_mut(&self.id) else {
                return Poll::Ready(Err(SendFailed::Closed(CloseReason::Local)));
            };
            match c.last_sent {
                None => Poll::Ready(Ok(())),
                Some(key) => c.poll_sent(key, cx),
            }
        })
    }

    /// Sends `header` followed by each of `parts` as one message (copied
    /// when the send is made), as [`send`](Self::send) does.
    pub fn send_parts<'a>(
        &'a self,
        header: &'a [u8],
        parts: &'a [&'a [u8]],
    ) -> impl Future<Output = Result<(), SendFailed>> + 'a {
        SendFuture {
            conn: self,
            header,
            parts: Parts::Many(parts),
            feed: false,
            finished: false,
            key: None,
            ticket: None,
        }
    }

    /// Sends `header` followed by the bytes of `slices` as one message
    /// without copying them: the slices lie in the memory region the
    /// connection was opened with (`ConnectionParams::with_zero_copy`), and
    /// the provider reads them from there (`Backend::send_data`), so they
    /// must stay as they are until the future resolves, when the send
    /// completed. Waits for room and keeps its place in line as
    /// [`send`](Self::send) does. A connection without a region, or a slice
    /// outside it, fails it with [`SendFailed::Refused`].
    pub fn send_region<'a>(
        &'a self,
        header: &'a [u8],
        slices: &'a [netio_core::RegionSlice],
    ) -> impl Future<Output = Result<(), SendFailed>> + 'a {
        SendFuture {
            conn: self,
            header,
            parts: Parts::Region(slices),
            feed: false,
            finished: false,
            key: None,
            ticket: None,
        }
    }

    /// Sends each of `messages` (copied when sent), in order, with the
    /// provider's batch call ([`Backend::send_copy_batch`]), taking the
    /// connection's locks once for as many as there is room for: the
    /// cheapest way to send many small messages. Waits for room as
    /// [`send`](Self::send) does, keeping its place in line until every
    /// message was sent, so no other send on the connection comes in
    /// between; resolves when the last one completed (the provider
    /// reports a connection's completions in order, so every one did).
    ///
    /// A close fails it with [`SendFailed::Cancelled`] or
    /// [`SendFailed::Closed`] as for `send`; some of the messages may have
    /// arrived. [`SendFailed::Refused`] (for example a message larger than
    /// the connection allows) means the messages before that one were
    /// sent, and none after it.
    pub fn send_batch<'a>(
        &'a self,
        messages: &'a [&'a [u8]],
    ) -> impl Future<Output = Result<(), SendFailed>> + 'a {
        BatchFuture {
            conn: self,
            messages,
            sent: 0,
            last_key: None,
            ticket: None,
            scratch: Vec::new(),
        }
    }

    /// The messages received and not yet read.
    pub fn unread(&self) -> usize {
        let st = self.shared.lock();
        st.conns.get(&self.id).map_or(0, |c| c.received.len())
    }

    /// Sets the number of unread messages at which this connection pauses
    /// receiving from its peer (at least 1; [`HIGH_WATER`] by default); it
    /// resumes once half as many (rounded down) wait unread. Takes effect
    /// at once: a connection already holding that many pauses now, and a
    /// paused one with half the new mark or fewer unread resumes.
    pub fn set_high_water(&self, messages: usize) -> Result<(), ConnError> {
        self.change_flow(|c| c.high_water = messages.max(1))
    }

    /// Pauses receiving from the peer until [`resume`](Self::resume),
    /// however few messages wait unread: the peer's sends back up. The
    /// messages that arrived before still come from [`recv`](Self::recv).
    pub fn pause(&self) -> Result<(), ConnError> {
        self.change_flow(|c| c.held = true)
    }

    /// Ends a [`pause`](Self::pause): receiving resumes, unless the
    /// high-water mark holds it (then it resumes once half of the mark
    /// waits unread).
    pub fn resume(&self) -> Result<(), ConnError> {
        self.change_flow(|c| c.held = false)
    }

    /// Applies `change` to the connection's state, then pauses or resumes
    /// receiving as its hold and high-water mark say (nothing once it is
    /// gone).
    fn change_flow(&self, change: impl FnOnce(&mut ConnState)) -> Result<(), ConnError> {
        let mut st = self.shared.lock();
        let Some(c) = st.conns.get_mut(&self.id) else {
            return Ok(());
        };
        change(c);
        if c.closed().is_some() {
            return Ok(());
        }
        let want_paused = c.held
            || c.received.len() >= c.high_water
            || (c.paused && c.received.len() > c.high_water / 2);
        let r = match (c.paused, want_paused) {
            (false, true) => self
                .backend
                .pause_receive(self.id)
                .map(|()| c.paused = true),
            (true, false) => self
                .backend
                .resume_receive(self.id)
                .map(|()| c.paused = false),
            _ => Ok(()),
        };
        match r {
            // Closed meanwhile: its close report is on the way.
            Err(ConnError::UnknownConnection(_)) => Ok(()),
            other => other,
        }
    }

    /// The next message, in order; `None` once the connection is closed
    /// and every message that arrived before the close was read.
    pub fn recv(&self) -> impl Future<Output = Option<Vec<u8>>> + '_ {
        futures::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    /// Reads the next message into `buf` (replacing what it held), with no
    /// allocation once `buf` has grown to the size of the messages:
    /// resolves `true` with a message, `false` once the connection is
    /// closed and every message that arrived before the close was read.
    pub fn recv_into<'a>(&'a self, buf: &'a mut Vec<u8>) -> impl Future<Output = bool> + 'a {
        futures::future::poll_fn(move |cx| self.poll_recv_into(cx, buf))
    }

    /// The received messages as a stream (ends with the connection).
    pub fn messages(&self) -> Messages<'_, B> {
        Messages { conn: self }
    }

    /// Closes the connection. Sends in flight fail with
    /// [`SendFailed::Cancelled`]; [`recv`](Self::recv) ends.
    ///
    /// Closing a connection that has already closed (the peer's close may
    /// race with this one, its event still on the way) is not an error: the
    /// connection keeps the reason it closed with.
    pub fn close(&self) -> Result<(), CloseError> {
        match self.backend.close_active_endpoint(self.id) {
            Err(CloseError::UnknownConnection(_)) => Ok(()),
            other => other,
        }
    }

    /// Why the connection closed, once it has.
    pub fn close_reason(&self) -> Option<CloseReason> {
        let st = self.shared.lock();
        st.conns.get(&self.id).and_then(|c| c.closed().cloned())
    }

    fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        let mut m = Vec::new();
        self.poll_recv_into(cx, &mut m).map(|got| got.then_some(m))
    }

    fn poll_recv_into(&self, cx: &mut Context<'_>, out: &mut Vec<u8>) -> Poll<bool> {
        let mut st = self.shared.lock();
        let Some(c) = st.conns.get_mut(&self.id) else {
            return Poll::Ready(false);
        };
        if c.received.pop_into(out) {
            if c.paused
                && !c.held
                && c.received.len() <= c.high_water / 2
                && c.closed().is_none()
                && self.backend.resume_receive(self.id).is_ok()
            {
                c.paused = false;
            }
            return Poll::Ready(true);
        }
        match c.phase {
            Phase::Closed(_) | Phase::Refused(_) => Poll::Ready(false),
            Phase::Opening | Phase::Open => {
                c.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<B: Backend + Clone> Drop for AsyncConn<B> {
    fn drop(&mut self) {
        let open = {
            let mut st = self.shared.lock();
            let open = match st.conns.get_mut(&self.id) {
                Some(c) if matches!(c.phase, Phase::Open | Phase::Opening) => {
                    c.dropped = true;
                    true
                }
                _ => false,
            };
            if !open {
                st.conns.remove(&self.id);
            }
            open
        };
        if open {
            // The state goes with the close report.
            let _ = self.backend.close_active_endpoint(self.id);
        }
    }
}

impl<B: Backend + Clone> fmt::Debug for AsyncConn<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncConn")
            .field("id", &self.id)
            .field("remote", &self.remote)
            .finish_non_exhaustive()
    }
}

/// The stream of a connection's messages ([`AsyncConn::messages`]).
pub struct Messages<'a, B: Backend + Clone> {
    conn: &'a AsyncConn<B>,
}

impl<B: Backend + Clone> Stream for Messages<'_, B> {
    type Item = Vec<u8>;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Vec<u8>>> {
        self.conn.poll_recv(cx)
    }
}

/// What a [`SendFuture`] sends after its header.
enum Parts<'a> {
    One(&'a [u8]),
    Many(&'a [&'a [u8]]),
    /// Slices of the connection's registered region, sent without a copy.
    Region(&'a [netio_core::RegionSlice]),
}

struct SendFuture<'a, B: Backend + Clone> {
    conn: &'a AsyncConn<B>,
    header: &'a [u8],
    parts: Parts<'a>,
    /// Resolves once the send is made, not when it completed
    /// ([`AsyncConn::feed`]).
    feed: bool,
    /// It returned its outcome: nothing to give up when dropped.
    finished: bool,
    key: Option<u64>,
    /// Its place among the sends waiting for room, once it had to wait.
    ticket: Option<u64>,
}

impl<B: Backend + Clone> Future for SendFuture<'_, B> {
    type Output = Result<(), SendFailed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = self.as_mut().poll_send(cx);
        if r.is_ready() {
            self.finished = true;
        }
        r
    }
}

impl<B: Backend + Clone> SendFuture<'_, B> {
    fn poll_send(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), SendFailed>> {
        let conn = self.conn;
        let mut st = conn.shared.lock();
        let key = match self.key {
            Some(k) => k,
            None => st.next_key,
        };
        let Some(c) = st.conns.get_mut(&conn.id) else {
            return Poll::Ready(Err(SendFailed::Closed(CloseReason::Local)));
        };
        if self.key.is_some() {
            return c.poll_sent(key, cx);
        }
        if let Some(failed) = c.closed_before_send(&mut self.ticket) {
            return Poll::Ready(Err(failed));
        }
        // Sends waiting for room go in the order they first asked.
        if !c.first_in_line(self.ticket) {
            c.wait_in_line(&mut self.ticket, cx);
            return Poll::Pending;
        }
        let one;
        // Under the state lock: its completion cannot be reported before
        // the key is known.
        let sent = match &self.parts {
            Parts::One(d) => {
                one = [*d];
                conn.backend.send_data_copy(conn.id, &one, self.header, key)
            }
            Parts::Many(p) => conn.backend.send_data_copy(conn.id, p, self.header, key),
            Parts::Region(slices) => conn.backend.send_data(conn.id, slices, self.header, key),
        };
        match sent {
            Ok(()) => {
                c.last_sent = Some(key);
                let fed = self.feed;
                if !fed {
                    c.in_flight.push_back((key, Some(cx.waker().clone())));
                }
                // Polled again, a fed send waits for its completion.
                self.key = Some(key);
                st.next_key += 1;
                if let Some(t) = self.ticket.take() {
                    let c = st.conns.get_mut(&conn.id).expect("present");
                    c.queue.pop_front();
                    debug_assert!(c.queue.iter().all(|&x| x != t));
                    // The next in line may find room too.
                    c.waiting.drain(..).for_each(Waker::wake);
                }
                if fed {
                    Poll::Ready(Ok(()))
                } else {
                    Poll::Pending
                }
            }
            // No room: a completion wakes the send. Unknown: the provider
            // has let go of the connection (a close from any thread, or the
            // peer's) but the close has not reached this side's state yet;
            // it will, and the send then fails with the close's reason.
            Err(SendError::NoResources | SendError::UnknownConnection(_)) => {
                c.wait_in_line(&mut self.ticket, cx);
                Poll::Pending
            }
            Err(e) => {
                c.leave_queue(self.ticket.take());
                Poll::Ready(Err(SendFailed::Refused(e)))
            }
        }
    }
}

impl<B: Backend + Clone> Drop for SendFuture<'_, B> {
    fn drop(&mut self) {
        if self.finished || (self.ticket.is_none() && self.key.is_none()) {
            return;
        }
        let mut st = self.conn.shared.lock();
        let Some(c) = st.conns.get_mut(&self.conn.id) else {
            return;
        };
        c.abandon(self.ticket.take(), self.key);
    }
}

struct BatchFuture<'a, B: Backend + Clone> {
    conn: &'a AsyncConn<B>,
    messages: &'a [&'a [u8]],
    /// How many of `messages` were sent.
    sent: usize,
    /// The key of the last message, once every one was sent: the only one
    /// whose completion is tracked.
    last_key: Option<u64>,
    ticket: Option<u64>,
    scratch: Vec<CopyMessage<'a>>,
}

impl<B: Backend + Clone> Future for BatchFuture<'_, B> {
    type Output = Result<(), SendFailed>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.messages.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        let conn = this.conn;
        let mut st = conn.shared.lock();
        let first_key = st.next_key;
        let Some(c) = st.conns.get_mut(&conn.id) else {
            return Poll::Ready(Err(SendFailed::Closed(CloseReason::Local)));
        };
        if let Some(key) = this.last_key {
            return c.poll_sent(key, cx);
        }
        if let Some(failed) = c.closed_before_send(&mut this.ticket) {
            return Poll::Ready(Err(failed));
        }
        if !c.first_in_line(this.ticket) {
            c.wait_in_line(&mut this.ticket, cx);
            return Poll::Pending;
        }
        let rest = &this.messages[this.sent..];
        this.scratch.clear();
        this.scratch.extend(
            rest.iter()
                .zip(first_key..)
                .map(|(m, key)| CopyMessage::new(m, key)),
        );
        // Under the state lock: no completion is reported before the keys
        // are known.
        let (made, error) = match conn.backend.send_copy_batch(conn.id, &this.scratch) {
            Ok(()) => (rest.len(), None),
            Err(e) => (e.sent, Some(e.error)),
        };
        st.next_key += made as u64;
        this.sent += made;
        let c = st.conns.get_mut(&conn.id).expect("present");
        if made > 0 {
            c.last_sent = Some(first_key + made as u64 - 1);
        }
        if this.sent == this.messages.len() {
            let key = first_key + made as u64 - 1;
            c.in_flight.push_back((key, Some(cx.waker().clone())));
            this.last_key = Some(key);
            if this.ticket.take().is_some() {
                c.queue.pop_front();
                c.waiting.drain(..).for_each(Waker::wake);
            }
            return Poll::Pending;
        }
        match error {
            // No room: a completion wakes it; it keeps its place in line.
            Some(SendError::NoResources | SendError::UnknownConnection(_)) | None => {
                c.wait_in_line(&mut this.ticket, cx);
                Poll::Pending
            }
            Some(e) => {
                c.leave_queue(this.ticket.take());
                Poll::Ready(Err(SendFailed::Refused(e)))
            }
        }
    }
}

impl<B: Backend + Clone> Drop for BatchFuture<'_, B> {
    fn drop(&mut self) {
        let mut st = self.conn.shared.lock();
        let Some(c) = st.conns.get_mut(&self.conn.id) else {
            return;
        };
        c.abandon(self.ticket.take(), self.last_key);
    }
}

struct Sleep<'a> {
    shared: &'a Shared,
    token: u64,
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.shared.lock();
        match st.timers.get_mut(&self.token) {
            Some((false, waker)) => {
                *waker = Some(cx.waker().clone());
                Poll::Pending
            }
            _ => Poll::Ready(()),
        }
    }
}

impl Drop for Sleep<'_> {
    fn drop(&mut self) {
        // A timer has no cancel: forget the token; `on_timer` ignores it.
        self.shared.lock().timers.remove(&self.token);
    }
}

#[cfg(test)]
mod tests {
    use super::Inbox;

    #[test]
    fn the_inbox_gives_messages_back_whole_and_in_order_across_its_ring_wrapping() {
        let mut inbox = Inbox::default();
        let mut out = vec![9u8; 3];
        assert!(!inbox.pop_into(&mut out));
        let msg = |i: usize| vec![i as u8; i % 7];
        let (mut next_in, mut next_out) = (0, 0);
        // Pushes and pops interleaved, so the ring wraps many times.
        for round in 0..200 {
            for _ in 0..(round % 5) + 1 {
                inbox.push(&msg(next_in));
                next_in += 1;
            }
            for _ in 0..(round % 3) + 1 {
                if inbox.pop_into(&mut out) {
                    assert_eq!(out, msg(next_out), "message {next_out}");
                    next_out += 1;
                }
            }
            assert_eq!(inbox.len(), next_in - next_out);
        }
        while inbox.pop_into(&mut out) {
            assert_eq!(out, msg(next_out));
            next_out += 1;
        }
        assert_eq!(next_out, next_in);
        assert!(inbox.bytes.is_empty());
    }
}
