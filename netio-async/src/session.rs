//! A reconnecting session between a client and a server, on the async API,
//! carrying messages both ways: the client redials with backoff after a
//! refused or broken connection and keeps a stable identity across
//! connections; each side delivers the other's messages once, in order,
//! across reconnects.
//!
//! Each direction keeps only what the other side has not acknowledged, at
//! most a high-water mark of messages ([`SessionConfig::high_water`]). A
//! message sent beyond the mark is dropped there and handed back to the
//! caller, and still takes its sequence number: the receiver sees a
//! [`Received::Gap`] where it would have been, so a dropped message never
//! leaves a silent hole. A message the server publishes to many sessions
//! ([`SessionServer::publish`]) is held once and shared by all of them.
//! What arrives waits for the application ([`SessionClient::recv`],
//! [`SessionServer::recv`]) in a queue of at most the high-water mark:
//! while it is full, the session stops reading, and the peer's own mark
//! bounds what it holds.
//!
//! A message counts as delivered when the receiver acknowledged it, not
//! when its send completed: on TCP a completed send can still be lost with
//! the connection. The sender keeps every message until it is
//! acknowledged and sends the unacknowledged ones again on the next
//! connection; the receiver drops the copies it already has.
//!
//! Frames (one message each, numbers `u64` little-endian): the client's
//! `HELLO` (`0`: session id, the client's instance, the first sequence
//! number it holds, the last it received), the server's `WELCOME` (`3`:
//! the server's instance, the first it holds for this session, the last it
//! received), then both ways `DATA` (`1`: sequence number, payload), `GAP`
//! (`4`: first and last sequence number dropped at the sender) and `ACK`
//! (`2`: the last sequence number received). An instance changes when a
//! side starts afresh (a restarted process): its peer then expects its
//! numbering from the start.
//!
//! Both sides run as futures (`SessionClient::run`, `SessionServer::run`),
//! which are `Send`: as tasks on the backend's loop
//! ([`AsyncBackend::spawn`]) or on any executor; on the simulator the whole
//! exchange, reconnects and backoff included, is deterministic.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use netio_core::{Backend, ConnectionParams, EndpointAddress};

use crate::{AsyncBackend, AsyncConn};

const HELLO: u8 = 0;
const DATA: u8 = 1;
const ACK: u8 = 2;
const WELCOME: u8 = 3;
const GAP: u8 = 4;

fn frame(kind: u8, nums: &[u64], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(1 + 8 * nums.len() + payload.len());
    f.push(kind);
    for n in nums {
        f.extend_from_slice(&n.to_le_bytes());
    }
    f.extend_from_slice(payload);
    f
}

fn u64_at(f: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(f.get(at..at + 8)?.try_into().ok()?))
}

/// A mutex's guard, whether or not a panic poisoned it.
trait Guard<T> {
    fn guard(&self) -> MutexGuard<'_, T>;
}

impl<T> Guard<T> for Mutex<T> {
    fn guard(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How a session side redials and how much it holds.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The first wait after a failed or broken connection; doubled after
    /// each failure in a row, up to `max_backoff` (client).
    pub initial_backoff: Duration,
    /// The longest wait between attempts (client).
    pub max_backoff: Duration,
    /// Messages held per direction and session (sent or not, not yet
    /// acknowledged), and received messages waiting for the application,
    /// at most.
    pub high_water: usize,
    /// Receive parameters of the client's connections.
    pub params: ConnectionParams,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_secs(1),
            high_water: 1024,
            params: ConnectionParams::receive(256, 16),
        }
    }
}

/// What a session side receives, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A message, with its sequence number.
    Message {
        /// Its number in its direction of the session (from 1).
        seq: u64,
        /// The payload.
        data: Vec<u8>,
    },
    /// Messages the sender dropped at its high-water mark (or no longer
    /// holds after starting afresh): the numbers `first..=last` will never
    /// arrive.
    Gap {
        /// The first missing number.
        first: u64,
        /// The last missing number.
        last: u64,
    },
}

enum Held {
    Msg(u64, Arc<[u8]>),
    Gap(u64, u64),
}

impl Held {
    fn last(&self) -> u64 {
        match self {
            Held::Msg(s, _) | Held::Gap(_, s) => *s,
        }
    }
}

/// One direction's sending side: what is held until acknowledged.
struct Outbox {
    held: VecDeque<Held>,
    /// `Msg` entries in `held`.
    msgs: usize,
    next_seq: u64,
    acked: u64,
    dropped: u64,
    high_water: usize,
    /// The connection's sender, waiting for something to send.
    waker: Option<Waker>,
}

impl Outbox {
    fn new(high_water: usize) -> Self {
        Self {
            held: VecDeque::new(),
            msgs: 0,
            next_seq: 1,
            acked: 0,
            dropped: 0,
            high_water: high_water.max(1),
            waker: None,
        }
    }

    /// Queues `m` with the next number; at the high-water mark the number
    /// becomes part of a gap and `m` comes back.
    fn push(&mut self, m: Arc<[u8]>) -> Result<u64, Arc<[u8]>> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let r = if self.msgs >= self.high_water {
            self.dropped += 1;
            match self.held.back_mut() {
                Some(Held::Gap(_, last)) if *last + 1 == seq => *last = seq,
                _ => self.held.push_back(Held::Gap(seq, seq)),
            }
            Err(m)
        } else {
            self.held.push_back(Held::Msg(seq, m));
            self.msgs += 1;
            Ok(seq)
        };
        if let Some(w) = self.waker.take() {
            w.wake();
        }
        r
    }

    /// The peer has everything up to `a`.
    fn ack(&mut self, a: u64) {
        self.acked = self.acked.max(a.min(self.next_seq - 1));
        while let Some(front) = self.held.front_mut() {
            if front.last() <= self.acked {
                if let Some(Held::Msg(..)) = self.held.pop_front() {
                    self.msgs -= 1;
                }
            } else {
                if let Held::Gap(first, _) = front {
                    *first = (*first).max(self.acked + 1);
                }
                break;
            }
        }
    }

    /// The first number still held (the next to come when nothing is).
    fn first_held(&self) -> u64 {
        self.held.front().map_or(self.next_seq, |h| match h {
            Held::Msg(s, _) | Held::Gap(s, _) => *s,
        })
    }

    /// The frame of the first entry after `sent`, and its last number.
    fn next_after(&self, sent: u64) -> Option<(Vec<u8>, u64)> {
        self.held.iter().find(|h| h.last() > sent).map(|h| match h {
            Held::Msg(s, m) => (frame(DATA, &[*s], m), *s),
            Held::Gap(first, last) => (frame(GAP, &[(*first).max(sent + 1), *last], &[]), *last),
        })
    }
}

/// Received items waiting for the application, at most `limit`.
struct Inbox<T> {
    queue: VecDeque<T>,
    limit: usize,
    /// The application waiting for an item.
    reader: Option<Waker>,
    /// Connections waiting for room.
    room: Vec<Waker>,
}

impl<T> Inbox<T> {
    fn new(limit: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            limit: limit.max(1),
            reader: None,
            room: Vec::new(),
        }
    }

    fn push(&mut self, item: T) {
        self.queue.push_back(item);
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }

    fn poll_pop(&mut self, cx: &mut Context<'_>) -> Poll<T> {
        match self.pop() {
            Some(item) => Poll::Ready(item),
            None => {
                self.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn pop(&mut self) -> Option<T> {
        let item = self.queue.pop_front()?;
        self.room.drain(..).for_each(Waker::wake);
        Some(item)
    }

    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.queue.len() < self.limit {
            Poll::Ready(())
        } else {
            self.room.push(cx.waker().clone());
            Poll::Pending
        }
    }
}

/// The receiving side of one direction: the last number taken.
#[derive(Default)]
struct InState {
    last: u64,
    /// The sender's instance these numbers belong to.
    instance: Option<u64>,
}

impl InState {
    /// The peer `instance` says it holds from `first` on: a new instance
    /// starts the numbering afresh; numbers the peer no longer holds
    /// (its state lost) are a gap.
    fn resume(&mut self, instance: u64, first: u64) -> Option<Received> {
        if self.instance != Some(instance) {
            let fresh = self.instance.is_none();
            self.instance = Some(instance);
            self.last = first.saturating_sub(1);
            return (!fresh && first > 1).then_some(Received::Gap {
                first: 1,
                last: first - 1,
            });
        }
        if first > self.last + 1 {
            let gap = Received::Gap {
                first: self.last + 1,
                last: first - 1,
            };
            self.last = first - 1;
            return Some(gap);
        }
        None
    }

    /// Takes a `DATA` or `GAP` frame: what to deliver, if it is the next;
    /// `Err` for a frame out of order or not understood.
    fn take(&mut self, f: &[u8]) -> Result<Option<Received>, ()> {
        match f.first() {
            Some(&DATA) => {
                let seq = u64_at(f, 1).ok_or(())?;
                if seq <= self.last {
                    return Ok(None); // a copy of one delivered
                }
                if seq != self.last + 1 {
                    return Err(());
                }
                self.last = seq;
                Ok(Some(Received::Message {
                    seq,
                    data: f[9..].to_vec(),
                }))
            }
            Some(&GAP) => {
                let (first, last) = (u64_at(f, 1).ok_or(())?, u64_at(f, 9).ok_or(())?);
                if last <= self.last {
                    return Ok(None);
                }
                if first > self.last + 1 || first > last {
                    return Err(());
                }
                let first = self.last + 1;
                self.last = last;
                Ok(Some(Received::Gap { first, last }))
            }
            _ => Err(()),
        }
    }
}

fn ack_of(f: &[u8]) -> Option<u64> {
    (f.first() == Some(&ACK)).then(|| u64_at(f, 1)).flatten()
}

/// An instance number for a side starting now: its backend's clock in
/// nanoseconds (so a simulated run repeats it, and two lives of a process
/// or host, started at different instants, differ), never 0.
fn instance_of<B: Backend + Clone>(b: &AsyncBackend<B>, salt: u64) -> u64 {
    (b.now().as_nanos() as u64 ^ salt.rotate_left(29)).max(1)
}

/// One connection's exchange once the hello is done: sends what `out`
/// holds after `sent`, takes acknowledgements, and hands what arrives to
/// `deliver` (waiting while `room` says the application's queue is full).
/// Returns when the connection fails or the peer breaks the protocol.
async fn exchange<B: Backend + Clone>(
    conn: &AsyncConn<B>,
    out: &Mutex<Outbox>,
    incoming: &Mutex<InState>,
    mut sent: u64,
    room: impl Fn(&mut Context<'_>) -> Poll<()>,
    deliver: impl Fn(Received),
) {
    let sending = async {
        loop {
            let next = futures::future::poll_fn(|cx| {
                let mut o = out.guard();
                match o.next_after(sent) {
                    Some(n) => Poll::Ready(n),
                    None => {
                        o.waker = Some(cx.waker().clone());
                        Poll::Pending
                    }
                }
            })
            .await;
            if conn.send(&next.0).await.is_err() {
                return;
            }
            sent = next.1;
        }
    };
    let receiving = async {
        loop {
            futures::future::poll_fn(&room).await;
            let Some(f) = conn.recv().await else {
                return;
            };
            if let Some(a) = ack_of(&f) {
                out.guard().ack(a);
                continue;
            }
            let taken = incoming.guard().take(&f);
            match taken {
                Ok(item) => {
                    if let Some(item) = item {
                        deliver(item);
                    }
                    let last = incoming.guard().last;
                    if conn.send(&frame(ACK, &[last], &[])).await.is_err() {
                        return;
                    }
                }
                Err(()) => {
                    let _ = conn.close();
                    return;
                }
            }
        }
    };
    futures::pin_mut!(sending, receiving);
    futures::future::select(sending, receiving).await;
}

struct ClientState {
    out: Mutex<Outbox>,
    incoming: Mutex<InState>,
    inbox: Mutex<Inbox<Received>>,
    connects: AtomicU64,
}

/// The client end of a session.
pub struct SessionClient<B: Backend + Clone> {
    backend: Arc<AsyncBackend<B>>,
    server: EndpointAddress,
    id: u64,
    instance: u64,
    config: SessionConfig,
    state: Arc<ClientState>,
}

impl<B: Backend + Clone> SessionClient<B> {
    /// A session with identity `id` towards the server at `server`. Nothing
    /// happens until [`run`](Self::run) is polled.
    pub fn new(
        backend: Arc<AsyncBackend<B>>,
        server: EndpointAddress,
        id: u64,
        config: SessionConfig,
    ) -> Self {
        let state = ClientState {
            out: Mutex::new(Outbox::new(config.high_water)),
            incoming: Mutex::default(),
            inbox: Mutex::new(Inbox::new(config.high_water)),
            connects: AtomicU64::new(0),
        };
        Self {
            instance: instance_of(&backend, id),
            backend,
            server,
            id,
            config,
            state: Arc::new(state),
        }
    }

    /// Queues `msg` for the server; returns its sequence number, or gives
    /// the message back at the high-water mark: it is dropped and counted,
    /// and the server sees a [`Received::Gap`] in its place.
    pub fn send(&self, msg: Vec<u8>) -> Result<u64, Vec<u8>> {
        self.state
            .out
            .guard()
            .push(msg.into())
            .map_err(|m| m.to_vec())
    }

    /// The next message (or gap) from the server, in order.
    pub fn recv(&self) -> impl Future<Output = Received> + '_ {
        futures::future::poll_fn(move |cx| self.state.inbox.guard().poll_pop(cx))
    }

    /// The next message (or gap) from the server, if one waits.
    pub fn try_recv(&self) -> Option<Received> {
        self.state.inbox.guard().pop()
    }

    /// Messages the server acknowledged: every sequence number up to this
    /// one was delivered there once (or dropped here, as a gap).
    pub fn acknowledged(&self) -> u64 {
        self.state.out.guard().acked
    }

    /// Messages held for the server (sent or not, not yet acknowledged).
    pub fn held(&self) -> usize {
        self.state.out.guard().msgs
    }

    /// Messages handed back by [`send`](Self::send) at the high-water mark.
    pub fn dropped(&self) -> u64 {
        self.state.out.guard().dropped
    }

    /// Connections established so far.
    pub fn connects(&self) -> u64 {
        self.state.connects.load(Ordering::Relaxed)
    }

    /// Runs the session for ever: connects, exchanges messages both ways,
    /// and redials with backoff whenever the connection fails or breaks.
    /// Poll it alongside the application (one `run` at a time).
    pub async fn run(&self) {
        let mut backoff = self.config.initial_backoff;
        loop {
            let connected = self
                .backend
                .connect(self.server, self.config.params.clone())
                .await;
            if let Ok(conn) = connected {
                self.state.connects.fetch_add(1, Ordering::Relaxed);
                if self.serve(&conn).await {
                    backoff = self.config.initial_backoff;
                }
                let _ = conn.close();
            }
            self.backend.sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
    }

    /// One connection's life; `true` if the server answered the hello.
    async fn serve(&self, conn: &AsyncConn<B>) -> bool {
        let st = &self.state;
        let hello = {
            let first = st.out.guard().first_held();
            let last = st.incoming.guard().last;
            frame(HELLO, &[self.id, self.instance, first, last], &[])
        };
        if conn.send(&hello).await.is_err() {
            return false;
        }
        let Some(w) = conn.recv().await else {
            return false;
        };
        let (Some(&WELCOME), Some(instance), Some(first), Some(peer_last)) =
            (w.first(), u64_at(&w, 1), u64_at(&w, 9), u64_at(&w, 17))
        else {
            return false;
        };
        st.out.guard().ack(peer_last);
        let gap = st.incoming.guard().resume(instance, first);
        if let Some(gap) = gap {
            st.inbox.guard().push(gap);
        }
        let sent = st.out.guard().acked;
        exchange(
            conn,
            &st.out,
            &st.incoming,
            sent,
            |cx| st.inbox.guard().poll_room(cx),
            |item| st.inbox.guard().push(item),
        )
        .await;
        true
    }
}

/// One session as the server keeps it.
struct ServerSession {
    out: Mutex<Outbox>,
    incoming: Mutex<InState>,
}

struct ServerState {
    sessions: Mutex<BTreeMap<u64, Arc<ServerSession>>>,
    inbox: Mutex<Inbox<(u64, Received)>>,
}

/// The server end: accepts sessions on a listener, delivers their messages
/// once each, in order, across reconnects, and sends to them
/// ([`send_to`](Self::send_to), [`publish`](Self::publish)). A session
/// stays known for the server's life once its client said hello, holding
/// at most the high-water mark of messages for its client.
pub struct SessionServer<B: Backend + Clone> {
    backend: Arc<AsyncBackend<B>>,
    instance: u64,
    high_water: usize,
    state: Arc<ServerState>,
}

impl<B: Backend + Clone> SessionServer<B> {
    /// A server on `backend`'s listeners (listen first), with the default
    /// high-water mark.
    pub fn new(backend: Arc<AsyncBackend<B>>) -> Self {
        Self::with_config(backend, &SessionConfig::default())
    }

    /// A server holding at most `config.high_water` messages per session
    /// for its client, and as many received ones for the application.
    pub fn with_config(backend: Arc<AsyncBackend<B>>, config: &SessionConfig) -> Self {
        Self {
            instance: instance_of(&backend, u64::MAX),
            high_water: config.high_water,
            state: Arc::new(ServerState {
                sessions: Mutex::default(),
                inbox: Mutex::new(Inbox::new(config.high_water)),
            }),
            backend,
        }
    }

    /// The next message (or gap) from a client, with its session id; in
    /// order per session.
    pub fn recv(&self) -> impl Future<Output = (u64, Received)> + '_ {
        futures::future::poll_fn(move |cx| self.state.inbox.guard().poll_pop(cx))
    }

    /// The next message (or gap) from a client, if one waits.
    pub fn try_recv(&self) -> Option<(u64, Received)> {
        self.state.inbox.guard().pop()
    }

    /// The sessions that have said hello, by id.
    pub fn sessions(&self) -> Vec<u64> {
        self.state.sessions.guard().keys().copied().collect()
    }

    /// Queues `msg` for session `id`: its sequence number, or the message
    /// back at the session's high-water mark (the client sees a gap), or
    /// `None` for a session that never said hello.
    pub fn send_to(&self, id: u64, msg: impl Into<Arc<[u8]>>) -> Option<Result<u64, Arc<[u8]>>> {
        let s = self.state.sessions.guard().get(&id).cloned()?;
        let r = s.out.guard().push(msg.into());
        Some(r)
    }

    /// Queues `msg` for every session, one copy shared by all: how many
    /// took it (the others were at their high-water mark, and their
    /// clients see a gap).
    pub fn publish(&self, msg: impl Into<Arc<[u8]>>) -> usize {
        let msg = msg.into();
        let sessions: Vec<Arc<ServerSession>> =
            self.state.sessions.guard().values().cloned().collect();
        sessions
            .iter()
            .filter(|s| s.out.guard().push(Arc::clone(&msg)).is_ok())
            .count()
    }

    /// Messages held for session `id` (not yet acknowledged by its client).
    pub fn held(&self, id: u64) -> Option<usize> {
        Some(self.state.sessions.guard().get(&id)?.out.guard().msgs)
    }

    /// Messages for session `id` dropped at its high-water mark.
    pub fn dropped(&self, id: u64) -> Option<u64> {
        Some(self.state.sessions.guard().get(&id)?.out.guard().dropped)
    }

    /// Accepts and serves sessions for ever.
    pub async fn run(&self) {
        let mut conns = FuturesUnordered::new();
        let mut incoming = self.backend.incoming().fuse();
        loop {
            futures::select! {
                conn = incoming.next() => match conn {
                    Some(conn) => conns.push(self.serve(conn)),
                    None => return,
                },
                _ = conns.select_next_some() => {}
            }
        }
    }

    async fn serve(&self, conn: AsyncConn<B>) {
        let Some(hello) = conn.recv().await else {
            return;
        };
        let (Some(&HELLO), Some(id), Some(instance), Some(first), Some(peer_last)) = (
            hello.first(),
            u64_at(&hello, 1),
            u64_at(&hello, 9),
            u64_at(&hello, 17),
            u64_at(&hello, 25),
        ) else {
            let _ = conn.close();
            return;
        };
        let s = Arc::clone(self.state.sessions.guard().entry(id).or_insert_with(|| {
            Arc::new(ServerSession {
                out: Mutex::new(Outbox::new(self.high_water)),
                incoming: Mutex::default(),
            })
        }));
        let gap = s.incoming.guard().resume(instance, first);
        if let Some(gap) = gap {
            self.state.inbox.guard().push((id, gap));
        }
        s.out.guard().ack(peer_last);
        let welcome = {
            let out = s.out.guard();
            frame(
                WELCOME,
                &[self.instance, out.first_held(), s.incoming.guard().last],
                &[],
            )
        };
        if conn.send(&welcome).await.is_err() {
            return;
        }
        let sent = s.out.guard().acked;
        let st = &self.state;
        exchange(
            &conn,
            &s.out,
            &s.incoming,
            sent,
            |cx| st.inbox.guard().poll_room(cx),
            |item| st.inbox.guard().push((id, item)),
        )
        .await;
    }
}
