//! A reconnecting session between a client and a server, on the async API:
//! the client redials with backoff after a refused or broken connection,
//! keeps a stable identity across connections, and holds at most a
//! high-water mark of messages not yet acknowledged (a message beyond it is
//! handed back to the caller: dropped, and counted); the server delivers
//! each message of a session once, in order, across reconnects.
//!
//! A message counts as delivered when the server acknowledged it, not when
//! its send completed: on TCP a completed send can still be lost with the
//! connection. The client keeps every message until it is acknowledged and
//! sends the unacknowledged ones again on the next connection; the server
//! drops the copies it already delivered.
//!
//! Frames (one message each): the client's `HELLO` (`0`, session id `u64`,
//! first unacknowledged sequence number `u64`, little-endian), `DATA` (`1`,
//! sequence number `u64`, payload); the server's `ACK` (`2`, highest
//! sequence number delivered `u64`), sent after the `HELLO` and after each
//! `DATA`.
//!
//! Both sides run as futures (`SessionClient::run`, `SessionServer::run`)
//! on one thread with the application (they are not `Send`); on the
//! simulator the whole exchange, reconnects and backoff included, is
//! deterministic.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use futures::channel::mpsc;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use netio_core::{Backend, ConnectionParams, EndpointAddress};

use crate::{AsyncBackend, AsyncConn};

const HELLO: u8 = 0;
const DATA: u8 = 1;
const ACK: u8 = 2;

fn frame(kind: u8, a: u64, b: Option<u64>, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(17 + payload.len());
    f.push(kind);
    f.extend_from_slice(&a.to_le_bytes());
    if let Some(b) = b {
        f.extend_from_slice(&b.to_le_bytes());
    }
    f.extend_from_slice(payload);
    f
}

fn u64_at(f: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(f.get(at..at + 8)?.try_into().ok()?))
}

/// How a [`SessionClient`] redials and how much it holds.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// The first wait after a failed or broken connection; doubled after
    /// each failure in a row, up to `max_backoff`.
    pub initial_backoff: Duration,
    /// The longest wait between attempts.
    pub max_backoff: Duration,
    /// Messages held (sent or not, not yet acknowledged) at most.
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

#[derive(Default)]
struct ClientState {
    /// Held messages, oldest first: `(sequence number, payload)`.
    held: VecDeque<(u64, Vec<u8>)>,
    next_seq: u64,
    acked: u64,
    dropped: u64,
    connects: u64,
    /// Wakes the sender when a message is queued.
    kick: Option<mpsc::UnboundedSender<()>>,
}

/// The client end of a session.
pub struct SessionClient<B: Backend + Clone> {
    backend: Rc<AsyncBackend<B>>,
    server: EndpointAddress,
    id: u64,
    config: SessionConfig,
    state: Rc<RefCell<ClientState>>,
    kicks: RefCell<Option<mpsc::UnboundedReceiver<()>>>,
}

impl<B: Backend + Clone> SessionClient<B> {
    /// A session with identity `id` towards the server at `server`. Nothing
    /// happens until [`run`](Self::run) is polled.
    pub fn new(
        backend: Rc<AsyncBackend<B>>,
        server: EndpointAddress,
        id: u64,
        config: SessionConfig,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded();
        let state = ClientState {
            next_seq: 1,
            kick: Some(tx),
            ..ClientState::default()
        };
        Self {
            backend,
            server,
            id,
            config,
            state: Rc::new(RefCell::new(state)),
            kicks: RefCell::new(Some(rx)),
        }
    }

    /// Queues `msg`; returns its sequence number, or gives the message back
    /// when the high-water mark is reached (it is dropped and counted).
    pub fn send(&self, msg: Vec<u8>) -> Result<u64, Vec<u8>> {
        let mut st = self.state.borrow_mut();
        if st.held.len() >= self.config.high_water {
            st.dropped += 1;
            return Err(msg);
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.held.push_back((seq, msg));
        if let Some(k) = &st.kick {
            let _ = k.unbounded_send(());
        }
        Ok(seq)
    }

    /// Messages the server acknowledged: every sequence number up to this
    /// one was delivered there once.
    pub fn acknowledged(&self) -> u64 {
        self.state.borrow().acked
    }

    /// Messages held (sent or not, not yet acknowledged).
    pub fn held(&self) -> usize {
        self.state.borrow().held.len()
    }

    /// Messages handed back by [`send`](Self::send) at the high-water mark.
    pub fn dropped(&self) -> u64 {
        self.state.borrow().dropped
    }

    /// Connections established so far.
    pub fn connects(&self) -> u64 {
        self.state.borrow().connects
    }

    /// Runs the session for ever: connects, sends, takes acknowledgements,
    /// and redials with backoff whenever the connection fails or breaks.
    /// Poll it alongside the application (call once).
    pub async fn run(&self) {
        let mut kicks = self
            .kicks
            .borrow_mut()
            .take()
            .expect("SessionClient::run is called once");
        let mut backoff = self.config.initial_backoff;
        loop {
            let connected = self
                .backend
                .connect(self.server, self.config.params.clone())
                .await;
            if let Ok(conn) = connected {
                self.state.borrow_mut().connects += 1;
                if self.serve(&conn, &mut kicks, &mut backoff).await {
                    backoff = self.config.initial_backoff;
                }
                let _ = conn.close();
            }
            self.backend.sleep(backoff).await;
            backoff = (backoff * 2).min(self.config.max_backoff);
        }
    }

    /// One connection's life; `true` if the server answered the hello.
    async fn serve(
        &self,
        conn: &AsyncConn<B>,
        kicks: &mut mpsc::UnboundedReceiver<()>,
        backoff: &mut Duration,
    ) -> bool {
        let first = {
            let st = self.state.borrow();
            st.held.front().map_or(st.next_seq, |m| m.0)
        };
        if conn
            .send(&frame(HELLO, self.id, Some(first), &[]))
            .await
            .is_err()
        {
            return false;
        }
        match conn.recv().await.as_deref().and_then(ack_of) {
            Some(acked) => self.acked(acked),
            None => return false,
        }
        *backoff = self.config.initial_backoff;
        // Everything held goes again, in order; acknowledgements come
        // alongside.
        let mut sent_up_to = self.state.borrow().acked;
        let sending = async {
            loop {
                let next = {
                    let st = self.state.borrow();
                    st.held
                        .iter()
                        .find(|(seq, _)| *seq > sent_up_to)
                        .map(|(seq, m)| (*seq, frame(DATA, *seq, None, m)))
                };
                match next {
                    Some((seq, f)) => {
                        if conn.send(&f).await.is_err() {
                            return;
                        }
                        sent_up_to = seq;
                    }
                    None => {
                        if kicks.next().await.is_none() {
                            return;
                        }
                    }
                }
            }
        };
        let acking = async {
            while let Some(f) = conn.recv().await {
                if let Some(acked) = ack_of(&f) {
                    self.acked(acked);
                }
            }
        };
        futures::pin_mut!(sending, acking);
        futures::future::select(sending, acking).await;
        true
    }

    fn acked(&self, acked: u64) {
        let mut st = self.state.borrow_mut();
        if acked > st.acked {
            st.acked = acked;
        }
        let a = st.acked;
        while st.held.front().is_some_and(|m| m.0 <= a) {
            st.held.pop_front();
        }
    }
}

fn ack_of(f: &[u8]) -> Option<u64> {
    (f.first() == Some(&ACK)).then(|| u64_at(f, 1)).flatten()
}

/// What a [`SessionServer`] delivered: `(session id, payload)`, in order
/// per session, each message once.
pub type Delivered = Rc<RefCell<Vec<(u64, Vec<u8>)>>>;

/// The server end: accepts sessions on a listener and delivers their
/// messages once each, in order, across reconnects.
pub struct SessionServer<B: Backend + Clone> {
    backend: Rc<AsyncBackend<B>>,
    /// Highest sequence number delivered per session.
    last: Rc<RefCell<HashMap<u64, u64>>>,
    delivered: Delivered,
}

impl<B: Backend + Clone> SessionServer<B> {
    /// A server on `backend`'s listeners (listen first).
    pub fn new(backend: Rc<AsyncBackend<B>>) -> Self {
        Self {
            backend,
            last: Rc::default(),
            delivered: Rc::default(),
        }
    }

    /// What was delivered so far.
    pub fn delivered(&self) -> Delivered {
        self.delivered.clone()
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
        let (Some(&HELLO), Some(id), Some(first)) =
            (hello.first(), u64_at(&hello, 1), u64_at(&hello, 9))
        else {
            let _ = conn.close();
            return;
        };
        let mut last = *self
            .last
            .borrow_mut()
            .entry(id)
            .or_insert(first.saturating_sub(1));
        if first > last + 1 {
            // The client no longer holds what came between (this server
            // restarted and lost its state): go on from what it holds.
            last = first - 1;
            self.last.borrow_mut().insert(id, last);
        }
        if conn.send(&frame(ACK, last, None, &[])).await.is_err() {
            return;
        }
        while let Some(f) = conn.recv().await {
            let (Some(&DATA), Some(seq)) = (f.first(), u64_at(&f, 1)) else {
                break;
            };
            let ack = {
                let mut l = self.last.borrow_mut();
                let last = l.entry(id).or_default();
                if seq == *last + 1 {
                    *last = seq;
                    self.delivered.borrow_mut().push((id, f[9..].to_vec()));
                }
                *last
            };
            if conn.send(&frame(ACK, ack, None, &[])).await.is_err() {
                break;
            }
        }
    }
}
