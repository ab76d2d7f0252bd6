//! A soak: many connections over 127.0.0.1 carrying messages of random
//! sizes in every send mode (copy, copy batches, buffered, write-through
//! sizes), closed and reopened at random by the sender and now and then by
//! the receiver, checked message by message and accounted for at the end.
//!
//! Every message names its connection (a tag) and its sequence number and
//! carries a body derived from both, so the receiver sees at once a lost,
//! duplicated, reordered, truncated or corrupted message. At the end, per
//! connection, the receiver's deliveries are compared with the sender's
//! completions and cancellations:
//!
//! - each send ended exactly once (completed or cancelled);
//! - a cancelled send was never delivered;
//! - when the sender closed, everything it saw completed was delivered
//!   (the contract's orderly close);
//! - when the receiver closed, sends completed but not delivered are
//!   counted apart: on TCP a completion means "handed to the kernel", so
//!   the receiver's close may lose them (allowed, and reported).
//!
//! Descriptors and resident memory are sampled before and after. The
//! sender runs in thread-unsafe mode (no lock on its state), the receiver
//! in thread-safe mode.
//!
//! Short by default (about 10 s, part of `cargo test`). A long run:
//!
//! ```text
//! NETIO_SOAK_SECS=600 NETIO_SOAK_CONNS=50 cargo test --release -p netio-tcp --test soak -- --nocapture
//! ```
//!
//! `NETIO_SOAK_SEED` sets the seed of the random choices (printed at the
//! start); the threads' timing still differs from run to run.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::raw::open_fds;
use common::Running;
use netio_core::{
    Backend, BackendConfig, BufferError, Capabilities, CloseReason, ConnId, ConnectionParams,
    CopyMessage, EndpointAddress, Handler, RefuseReason, SendError, ThreadSafety,
};
use netio_tcp::{TcpBackend, TcpConfig, TcpProvider};

/// Bytes before each body: tag (u64), sequence (u64), body length (u32).
const HEAD: usize = 20;
/// Largest body: above the ring's write-through size, within the
/// receiver's buffers.
const MAX_BODY: usize = 48 * 1024;
/// Sends in flight per connection.
const WINDOW: usize = 64;
/// Socket buffers, small so that writes stop mid-frame often (closes
/// then meet partly written frames).
const SOCKET_BUFFER: usize = 16 * 1024;
/// Period of the sender's timer: random closes and reopens.
const TICK: Duration = Duration::from_millis(5);
/// How long a close may take to hand its last bytes to the peer
/// (`TcpConfig::close_linger`, 2 s by default). A close can leave a window
/// of up to 64 sends of 48 KiB to flush through 16 KiB socket buffers to a
/// receiver that pauses; on a loaded two-core machine (the test command
/// runs busy-polling suites beside this one) that can take longer than
/// 2 s, and the receiver then sees the stream cut short (a reset). The
/// deadline is not under test here: the orderly close is.
const LINGER: Duration = Duration::from_secs(30);

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v} is not a number")),
        Err(_) => default,
    }
}

/// xorshift64*: small, seeded, good enough for choosing.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Byte `i` of the body of message `seq` of connection `tag`.
fn body_byte(tag: u64, seq: u64, i: usize) -> u8 {
    (tag.wrapping_mul(31) ^ seq.wrapping_mul(131) ^ (i as u64).wrapping_mul(7)) as u8
}

fn message(tag: u64, seq: u64, len: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend((0..len).map(|i| body_byte(tag, seq, i)));
}

/// Completion keys: tag in the high half, sequence in the low half.
fn key(tag: u64, seq: u64) -> u64 {
    (tag << 32) | seq
}

fn unkey(k: u64) -> (u64, u64) {
    (k >> 32, k & 0xffff_ffff)
}

/// What the sender saw, per tag.
#[derive(Default)]
struct SenderLog {
    sent: HashMap<u64, u64>,
    completed: HashMap<u64, Vec<u64>>,
    cancelled: HashMap<u64, Vec<u64>>,
    /// Tags whose close came from the receiver.
    peer_closed: HashSet<u64>,
    /// Tags whose close this side asked for.
    closing: HashSet<u64>,
    closed: HashSet<u64>,
    problems: Vec<String>,
    opened: u64,
    /// The sender stopped sending and closed everything it had.
    stopped: bool,
}

/// What the receiver saw.
#[derive(Default)]
struct ReceiverLog {
    delivered: HashMap<u64, u64>,
    /// Tags of connections the receiver closed.
    closed_here: HashSet<u64>,
    problems: Vec<String>,
    messages: u64,
    bytes: u64,
    /// Connections established and not yet reported closed.
    open: u64,
}

struct Sender {
    rng: Rng,
    target: EndpointAddress,
    conns: usize,
    /// Open connections: handle to (tag, next sequence, in flight).
    live: HashMap<ConnId, (u64, u64, usize)>,
    /// Tags of connections still opening.
    opening: HashMap<ConnId, u64>,
    /// Tags of connections this side closed, until their close is reported.
    closing: HashMap<ConnId, u64>,
    next_tag: u64,
    stop_at: Instant,
    stopping: bool,
    scratch: Vec<Vec<u8>>,
    log: Arc<Mutex<SenderLog>>,
}

impl Sender {
    fn open(&mut self, b: &TcpBackend) {
        let tag = self.next_tag;
        self.next_tag += 1;
        match b.open_active_endpoint(self.target, ConnectionParams::buffered(MAX_BODY + HEAD, 8)) {
            Ok(c) => {
                self.opening.insert(c, tag);
                self.log.lock().unwrap().opened += 1;
            }
            Err(e) => self
                .log
                .lock()
                .unwrap()
                .problems
                .push(format!("open failed: {e}")),
        }
    }

    fn body_len(&mut self) -> usize {
        match self.rng.below(100) {
            0..=79 => self.rng.below(200) as usize,
            80..=97 => 1024 + self.rng.below(7 * 1024) as usize,
            _ => 33 * 1024 + self.rng.below((MAX_BODY - 33 * 1024) as u64) as usize,
        }
    }

    /// Fills the window of `conn` in a randomly chosen send mode.
    fn pump(&mut self, b: &TcpBackend, conn: ConnId) {
        if self.stopping {
            return;
        }
        let Some(&(tag, mut seq, mut inflight)) = self.live.get(&conn) else {
            return;
        };
        let shared = Arc::clone(&self.log);
        let mut log = shared.lock().unwrap();
        while inflight < WINDOW {
            let room = WINDOW - inflight;
            let accepted = match self.rng.below(3) {
                // One copy send.
                0 => {
                    let len = self.body_len();
                    let mut m = std::mem::take(&mut self.scratch[0]);
                    message(tag, seq, len, &mut m);
                    let r = b.send_data_copy(conn, &[&m], &[], key(tag, seq));
                    self.scratch[0] = m;
                    match r {
                        Ok(()) => 1,
                        Err(SendError::NoResources) => 0,
                        // Closed by the peer; the close is reported next.
                        Err(SendError::UnknownConnection(_)) => 0,
                        Err(e) => {
                            log.problems.push(format!("copy send on {tag}: {e}"));
                            0
                        }
                    }
                }
                // A batch of copy sends.
                1 => {
                    let n = (1 + self.rng.below(16) as usize).min(room);
                    for i in 0..n {
                        let len = self.body_len();
                        message(tag, seq + i as u64, len, &mut self.scratch[i]);
                    }
                    let msgs: Vec<CopyMessage<'_>> = (0..n)
                        .map(|i| CopyMessage::new(&self.scratch[i], key(tag, seq + i as u64)))
                        .collect();
                    match b.send_copy_batch(conn, &msgs) {
                        Ok(()) => n,
                        Err(e)
                            if e.is_retryable()
                                || matches!(e.error, SendError::UnknownConnection(_)) =>
                        {
                            e.sent
                        }
                        Err(e) => {
                            log.problems.push(format!("batch on {tag}: {e}"));
                            e.sent
                        }
                    }
                }
                // One buffered send.
                _ => match b.get_buffer(conn) {
                    Ok(Some(mut buf)) => {
                        let len = self.body_len();
                        let mut m = std::mem::take(&mut self.scratch[0]);
                        message(tag, seq, len, &mut m);
                        buf.write(&m).expect("fits the buffer");
                        self.scratch[0] = m;
                        match b.send_buffer(conn, buf, key(tag, seq)) {
                            Ok(()) => 1,
                            Err(e) => {
                                log.problems.push(format!("buffered send on {tag}: {e}"));
                                0
                            }
                        }
                    }
                    Ok(None) | Err(BufferError::UnknownConnection(_)) => 0,
                    Err(e) => {
                        log.problems.push(format!("get_buffer on {tag}: {e}"));
                        0
                    }
                },
            };
            if accepted == 0 {
                break;
            }
            seq += accepted as u64;
            inflight += accepted;
            *log.sent.entry(tag).or_default() += accepted as u64;
        }
        self.live.insert(conn, (tag, seq, inflight));
    }
}

impl Handler<TcpBackend> for Sender {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        if let Some(tag) = self.opening.remove(&conn) {
            self.live.insert(conn, (tag, 0, 0));
            self.pump(b, conn);
        }
    }

    fn on_connection_refused(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.opening.remove(&conn);
        if !matches!(why, RefuseReason::Cancelled) {
            self.log
                .lock()
                .unwrap()
                .problems
                .push(format!("refused: {why}"));
        }
        if !self.stopping {
            self.open(b);
        }
    }

    fn on_connection_closed(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        reason: &CloseReason,
        cancelled: &[u64],
    ) {
        let Some(tag) = self
            .live
            .remove(&conn)
            .map(|e| e.0)
            .or_else(|| self.closing.remove(&conn))
        else {
            return;
        };
        let mut log = self.log.lock().unwrap();
        for &k in cancelled {
            let (t, s) = unkey(k);
            if t != tag {
                log.problems.push(format!("cancelled key of {t} on {tag}"));
            }
            log.cancelled.entry(tag).or_default().push(s);
        }
        match reason {
            CloseReason::Local => {}
            CloseReason::PeerClosed => {
                log.peer_closed.insert(tag);
            }
            other => log
                .problems
                .push(format!("connection {tag} closed: {other}")),
        }
        log.closed.insert(tag);
        drop(log);
        if !self.stopping {
            self.open(b);
        }
    }

    fn on_sends_completed(&mut self, b: &TcpBackend, conn: ConnId, keys: &[u64]) {
        // A connection this side closed still reports the frame it was
        // writing when it closed (finished on the way out), before its
        // close.
        let tag = match self.live.get_mut(&conn) {
            Some(entry) => {
                entry.2 -= keys.len();
                entry.0
            }
            None => match self.closing.get(&conn) {
                Some(&tag) => tag,
                None => return,
            },
        };
        {
            let mut log = self.log.lock().unwrap();
            let done = log.completed.entry(tag).or_default();
            for &k in keys {
                let (t, s) = unkey(k);
                if t != tag {
                    log.problems.push(format!("completed key of {t} on {tag}"));
                    return;
                }
                done.push(s);
            }
        }
        self.pump(b, conn);
    }

    fn on_timer(&mut self, b: &TcpBackend, _: u64) {
        if Instant::now() >= self.stop_at {
            // Stop: close every connection; their outcomes come as events.
            self.stopping = true;
            let all: Vec<ConnId> = self.live.keys().copied().collect();
            for c in all {
                self.close(b, c);
            }
            for (c, _) in std::mem::take(&mut self.opening) {
                let _ = b.close_active_endpoint(c);
            }
            self.log.lock().unwrap().stopped = true;
            return;
        }
        // Now and then close a random connection and open another.
        if !self.live.is_empty() && self.rng.below(4) == 0 {
            let i = self.rng.below(self.live.len() as u64) as usize;
            let c = *self.live.keys().nth(i).expect("index in range");
            self.close(b, c);
        }
        while self.live.len() + self.opening.len() < self.conns {
            self.open(b);
        }
        b.set_timer(TICK, 0);
    }
}

impl Sender {
    /// Closes open connection `c`; its close is reported later, with the
    /// keys of the sends it cancelled.
    fn close(&mut self, b: &TcpBackend, c: ConnId) {
        let Some((tag, _, _)) = self.live.remove(&c) else {
            return;
        };
        self.closing.insert(c, tag);
        self.log.lock().unwrap().closing.insert(tag);
        if let Err(e) = b.close_active_endpoint(c) {
            self.log
                .lock()
                .unwrap()
                .problems
                .push(format!("closing {tag}: {e}"));
        }
    }
}

struct Receiver {
    rng: Rng,
    /// Handle to tag, learnt from the first message.
    tags: HashMap<ConnId, u64>,
    /// Connections paused for a moment (their senders back up, so the
    /// sender's closes meet partly written frames).
    paused: Vec<ConnId>,
    log: Arc<Mutex<ReceiverLog>>,
}

impl Handler<TcpBackend> for Receiver {
    fn on_connection_established(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.log.lock().unwrap().open += 1;
    }

    fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
        let mut log = self.log.lock().unwrap();
        if data.len() < HEAD {
            log.problems
                .push(format!("a message of {} bytes on {conn}", data.len()));
            return;
        }
        let tag = u64::from_le_bytes(data[..8].try_into().unwrap());
        let seq = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let len = u32::from_le_bytes(data[16..20].try_into().unwrap()) as usize;
        if let Some(&t) = self.tags.get(&conn) {
            if t != tag {
                log.problems
                    .push(format!("message of connection {tag} on connection {t}"));
                return;
            }
        }
        self.tags.insert(conn, tag);
        if data.len() != HEAD + len {
            log.problems.push(format!(
                "{tag}/{seq}: {} bytes, {} expected",
                data.len(),
                HEAD + len
            ));
        } else if (0..len).any(|i| data[HEAD + i] != body_byte(tag, seq, i)) {
            log.problems.push(format!("{tag}/{seq}: corrupted body"));
        }
        let next = log.delivered.entry(tag).or_default();
        if seq != *next {
            let n = *next;
            log.problems.push(format!(
                "{tag}: got {seq}, expected {n} (lost, duplicated or reordered)"
            ));
        }
        *log.delivered.get_mut(&tag).unwrap() = seq + 1;
        log.messages += 1;
        log.bytes += data.len() as u64;
        // Rarely, the receiver closes: what the sender saw completed may
        // then be lost (TCP completion is local).
        if self.rng.below(20_000) == 0 {
            log.closed_here.insert(tag);
            drop(log);
            let _ = b.close_active_endpoint(conn);
        } else if self.rng.below(500) == 0 && !self.paused.contains(&conn) {
            let _ = b.pause_receive(conn);
            if self.paused.is_empty() {
                b.set_timer(Duration::from_millis(1 + self.rng.below(20)), 0);
            }
            self.paused.push(conn);
        }
    }

    fn on_timer(&mut self, b: &TcpBackend, _: u64) {
        for c in self.paused.drain(..) {
            // A connection closed meanwhile answers UnknownConnection.
            let _ = b.resume_receive(c);
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        reason: &CloseReason,
        _: &[u64],
    ) {
        self.tags.remove(&conn);
        let mut log = self.log.lock().unwrap();
        log.open -= 1;
        if !matches!(reason, CloseReason::Local | CloseReason::PeerClosed) {
            log.problems
                .push(format!("receiver: {conn} closed: {reason}"));
        }
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
fn soak_loses_duplicates_reorders_and_corrupts_nothing() {
    let secs = env_u64("NETIO_SOAK_SECS", 10);
    let conns = env_u64("NETIO_SOAK_CONNS", 24) as usize;
    let seed = env_u64(
        "NETIO_SOAK_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            | 1,
    );
    eprintln!(
        "soak: {secs} s, {conns} connections, seed {seed} (NETIO_SOAK_SEED={seed} to reuse it)"
    );
    let fds_before = open_fds();
    let rss_before = rss_kib();
    let (server_rt, client_rt) = (Running::start(), Running::start());
    let rlog = Arc::new(Mutex::new(ReceiverLog::default()));
    let server = TcpProvider::create_with(
        &server_rt.lp,
        BackendConfig::default(),
        TcpConfig {
            recv_buffer_size: Some(SOCKET_BUFFER),
            close_linger: LINGER,
            ..TcpConfig::default()
        },
        Receiver {
            rng: Rng(seed ^ 0x9e37_79b9_7f4a_7c15),
            tags: HashMap::new(),
            paused: Vec::new(),
            log: rlog.clone(),
        },
    )
    .expect("server backend");
    let addr = server
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64 * 1024, 8),
        )
        .expect("listen");
    let slog = Arc::new(Mutex::new(SenderLog::default()));
    let client = TcpProvider::create_with(
        &client_rt.lp,
        BackendConfig {
            send_queue_depth: WINDOW,
            ..BackendConfig::with_thread_safety(ThreadSafety::Unsafe)
        },
        TcpConfig {
            send_buffer_size: Some(SOCKET_BUFFER),
            close_linger: LINGER,
            ..TcpConfig::default()
        },
        Sender {
            rng: Rng(seed),
            target: addr,
            conns,
            live: HashMap::new(),
            opening: HashMap::new(),
            closing: HashMap::new(),
            next_tag: 1,
            stop_at: Instant::now() + Duration::from_secs(secs),
            stopping: false,
            scratch: vec![Vec::new(); 16],
            log: slog.clone(),
        },
    )
    .expect("client backend");
    // The first tick opens the connections.
    client.set_timer(Duration::ZERO, 0);

    // Wait for the stop and for every connection's close to be reported.
    let deadline = Instant::now() + Duration::from_secs(secs + 60);
    loop {
        std::thread::sleep(Duration::from_millis(50));
        let l = slog.lock().unwrap();
        if l.stopped && l.closing.iter().all(|t| l.closed.contains(t)) {
            break;
        }
        assert!(Instant::now() < deadline, "the soak did not wind down");
    }
    // The last closes' bytes reach the receiver (their sockets linger,
    // flushing through small buffers) before the backends are dropped:
    // dropping the sender's backend cuts a lingering stream short, which
    // the receiver would see as a reset. That holds for the end of the
    // stream too, not only the messages before it: the receiver has
    // reported the close of every connection it had (a sender's close is
    // reported once its side is done, while its socket may still hold the
    // last bytes and the end of the stream).
    let flushed = Instant::now() + LINGER;
    loop {
        let expected: Vec<(u64, u64)> = {
            let l = slog.lock().unwrap();
            l.completed
                .iter()
                .filter(|(t, _)| !l.peer_closed.contains(t))
                .map(|(&t, c)| (t, c.len() as u64))
                .collect()
        };
        let done = {
            let r = rlog.lock().unwrap();
            r.open == 0
                && expected.iter().all(|(t, c)| {
                    r.closed_here.contains(t) || r.delivered.get(t).copied().unwrap_or(0) >= *c
                })
        };
        if done || Instant::now() >= flushed {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(client);
    drop(server);
    drop(client_rt);
    drop(server_rt);

    let s = slog.lock().unwrap();
    let r = rlog.lock().unwrap();
    let mut lost_to_receiver_close = 0u64;
    let mut problems: Vec<String> = s.problems.clone();
    problems.extend(r.problems.iter().cloned());
    for (&tag, &sent) in &s.sent {
        let completed = s.completed.get(&tag).cloned().unwrap_or_default();
        let cancelled = s.cancelled.get(&tag).cloned().unwrap_or_default();
        let delivered = r.delivered.get(&tag).copied().unwrap_or(0);
        let c = completed.len() as u64;
        if c + cancelled.len() as u64 != sent {
            problems.push(format!(
                "{tag}: {sent} sent, {c} completed + {} cancelled",
                cancelled.len()
            ));
        }
        if completed != (0..c).collect::<Vec<_>>() {
            problems.push(format!("{tag}: completions out of order"));
        }
        if cancelled.iter().any(|&q| q < delivered) {
            problems.push(format!("{tag}: a cancelled send was delivered"));
        }
        if r.closed_here.contains(&tag) || s.peer_closed.contains(&tag) {
            // Completed means handed to the kernel: the receiver's close
            // may lose those it had not read.
            if delivered > c {
                problems.push(format!("{tag}: {delivered} delivered, {c} completed"));
            }
            lost_to_receiver_close += c - delivered.min(c);
        } else if delivered != c {
            problems.push(format!(
                "{tag}: {c} completed but {delivered} delivered, sender closed in order"
            ));
        }
    }
    let total_sent: u64 = s.sent.values().sum();
    let total_cancelled: usize = s.cancelled.values().map(Vec::len).sum();
    // Give lingering sockets their time.
    let settle = Instant::now() + LINGER + Duration::from_secs(5);
    while open_fds() > fds_before && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(50));
    }
    let fds_after = open_fds();
    let rss_after = rss_kib();
    eprintln!(
        "soak: {} connections opened, {total_sent} sent, {} delivered ({} MB), \
         {total_cancelled} cancelled, {lost_to_receiver_close} completed but lost to {} \
         receiver closes; descriptors {fds_before} -> {fds_after}; RSS {rss_before} -> \
         {rss_after} KiB; {} problems",
        s.opened,
        r.messages,
        r.bytes >> 20,
        r.closed_here.len(),
        problems.len()
    );
    for p in problems.iter().take(20) {
        eprintln!("  {p}");
    }
    assert!(
        problems.is_empty(),
        "{} problems (first: {})",
        problems.len(),
        problems[0]
    );
    assert!(total_sent > 0 && r.messages > 0, "nothing was sent");
    assert!(s.opened > conns as u64, "connections were reopened");
    assert!(
        fds_after <= fds_before,
        "descriptors leaked: {fds_before} -> {fds_after}"
    );
}
