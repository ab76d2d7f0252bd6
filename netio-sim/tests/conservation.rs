//! Conservation of messages under random operations and every fault the
//! simulator has: a seeded, replayable, shrinking property test.
//!
//! # What is generated
//!
//! A case is a [`Scenario`]: a profile for the whole world (TCP or RDMA,
//! `NetworkMode`), a configuration per node (backend-wide shared receive
//! pool or not, shared send pool or not, `peer_timeout` or not, send queue
//! depth, thread-safe or not) and a list of [`Op`]s. Four nodes, each a host
//! with one backend and two listeners (port 7000 with per-connection receive
//! buffers, port 7001 with the listener's own shared receive pool), connect
//! to each other and to themselves (so clients are servers too), choosing the
//! listener and, for the initiator, the backend's shared receive pool. Every
//! connection leaves from a port of its own (`Sim::set_connect_ports`), which
//! is how the model pairs the two ends. The operations:
//!
//! - sends in every mode: buffered, copy (header and several chunks),
//!   zero-copy with a header, copy batches (`send_copy_batch`) and buffer
//!   batches (`get_buffers` + `send_buffer_batch`); now and then larger than
//!   the receiver's buffer (the receiver must close with
//!   `MessageTooLarge`); a message may ask its receiver to echo it (a send
//!   from inside `on_data`) or to close the connection from inside `on_data`;
//! - closes, operations on stale handles, pause/resume of receiving,
//!   listener closes and reopens;
//! - faults: refused connections, link settings (latency, bandwidth,
//!   jitter), network cards, the TCP window, slow receivers, paused loops,
//!   hold/release, partition/heal (with and without `peer_timeout`), resets,
//!   crashes (with a reset to the peers or silent) and restarts (the
//!   `SimHost::on_restart` hook rebuilds the node: backend and listeners);
//! - running the world for a while (from microseconds to seconds).
//!
//! QuickCheck runs the cases (`QuickCheck::new().rng(Gen::new(MAX_OPS))`)
//! and shrinks failures, but quickcheck 1.x cannot seed its `Gen`, and a
//! case must be replayable from a number: so each case is generated from a
//! seed of our own seeded splitmix64 stream ([`Input`]; `Gen` only gives
//! the size). Shrinking is ours too ([`Input::shrink`], [`candidates`]):
//! drop chunks of operations (halves, quarters, … single operations), then
//! simplify single operations; QuickCheck re-runs each candidate (the
//! simulator is deterministic) and keeps shrinking the first one that
//! still fails, until none does.
//!
//! # What is checked
//!
//! As events arrive (tagged `[check]` in failures):
//! - `[exactly-once]` every accepted send ends exactly once: completed or
//!   cancelled, never both, never twice; a close report leaves nothing
//!   outstanding on its connection;
//! - `[order]` completions come in send order; deliveries on a connection
//!   are exactly the peer's accepted sends, in order, without gaps;
//! - `[integrity]`, `[length]` every message carries its id, its length and
//!   a checksum of its body; the checksum, the length and every byte are
//!   verified on receipt; `[misrouted]` it arrives on the right connection;
//! - `[after-close]` nothing is delivered, completed or reported for a
//!   connection after its close call or its close report; `[pause]` nothing
//!   is delivered while receiving is paused; `[oversize]` no message larger
//!   than the receive buffer is delivered; `[crash]` no callback reaches a
//!   crashed backend;
//! - `[close-once]` one close (or refusal) report per connection end;
//!   `[close-reason]` the reason is the right one: `Local` on the closer,
//!   `Cancelled` for a connection closed while opening, `ListenerClosed` for
//!   the connections of a closed listener, `Reset` for `reset_connections`
//!   (and `Refused` for one still opening), otherwise one that some event
//!   explains (`PeerClosed` after the peer closed or refused an oversize
//!   message, `Reset` after the peer's host crashed or timed out,
//!   `TimedOut` only with a `peer_timeout` after a partition or silent
//!   crash, `MessageTooLarge` with the size of an oversize message and this
//!   side's limit);
//! - `[tcp-profile]` (TCP) a cancelled send is never delivered;
//! - `[stale-handle]` operations on closed handles answer
//!   `UnknownConnection`; `[op]` operations the model knows must work do
//!   (connecting, closing, pausing a live connection, closing and reopening
//!   listeners); `[handshake]` establishment, refusal and close reports
//!   carry the right handles, remote addresses and capabilities, and come
//!   in a possible order; `[unknown]` no event names a handle the backend
//!   never gave out; `[panic]` neither simulator nor model panics.
//!
//! After every fault is lifted and the world has run (the settle point):
//! - `[close-reported]` when one end closed (or its host crashed with a
//!   reset, or crashed silently and this end has a `peer_timeout`), the
//!   other end has heard of it;
//! - `[liveness]` on a connection open at both ends every accepted send in
//!   either direction has completed and been delivered.
//!
//! After closing everything: every end of a live host was reported closed or
//! refused, every send of a live host ended, the world keeps nothing but the
//! listeners (`[leak]`), and per message (`[tcp-profile]`, `[rdma-profile]`):
//! delivered at most once; delivered ⇒ completed (unless its sender
//! crashed); RDMA: completed ⇒ delivered between hosts that did not crash
//! (unless the receiver dropped what it had taken: closed by the application
//! with callbacks still pending, or while receiving was paused), an
//! oversize send is never completed; TCP: completed ⇒ delivered when the
//! receiver heard an orderly close (`PeerClosed`) and neither host crashed.
//!
//! A second test drives the same world while another OS thread sends on
//! thread-safe backends (a few sends granted per operation, made while the
//! driver applies it and runs the world). There the run depends on thread
//! timing, so only conservation (exactly once, integrity, order, nothing
//! after a close or while paused, delivered ⇒ completed) is checked, nothing
//! is shrunk, and `[threads]` checks that the world noticed the other
//! thread (`Sim::reproducible` turned false).
//!
//! Where the model cannot know the world's state for sure (a node whose
//! loop is paused may hold reports the model has not seen), it accepts each
//! outcome the operation may have had instead of demanding one.
//!
//! # Running and replaying
//!
//! - `NETIO_PROP_SEED=<u64>` (decimal or `0x` hex): run the cases of this
//!   seed only. Case 0 of a seed is the scenario of that very seed, so the
//!   replay command printed with a failure regenerates the failing case
//!   first, and shrinks it again to the same minimal case.
//! - `NETIO_PROP_CASES=<n>`: cases per seed (default [`DEFAULT_CASES`]).
//! - Neither set (CI): the seeds of [`FIXED_SEEDS`] plus one random seed,
//!   printed (stderr) before it runs.
//!
//! A failure prints the seed, the minimal operation list, the errors, the
//! command to replay it (`NETIO_PROP_SEED=… NETIO_PROP_CASES=1 cargo test
//! -p netio-sim --test conservation -- <test>`) and where the simulator's
//! trace of the minimal case was written.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

use netio_core::{
    Backend, BackendConfig, BufferError, Capabilities, CloseError, CloseReason, ConnError, ConnId,
    ConnectionParams, CopyMessage, EndpointAddress, Handler, MemoryRegion, NetworkMode,
    OpenListenError, PoolParams, RefuseReason, SendError, ThreadSafety, MAX_HEADER_LEN,
};
use netio_sim::{LinkConfig, NicConfig, Sim, SimBackend, SimHost};
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};

// ---------------------------------------------------------------------------
// Parameters

/// Cases per seed when `NETIO_PROP_CASES` is not set.
const DEFAULT_CASES: usize = 4000;
/// Seeds run when `NETIO_PROP_SEED` is not set (plus one random seed).
const FIXED_SEEDS: [u64; 3] = [1, 0x5EED_0002, 0xC0FF_EE03];
/// Cases of the multi-threaded test when `NETIO_PROP_CASES` is not set.
const DEFAULT_THREAD_CASES: usize = 50;
/// QuickCheck's size: the most random operations in a case.
const MAX_OPS: usize = 200;
/// How long shrinking may take before it gives up with what it has.
const SHRINK_BUDGET: Duration = Duration::from_secs(120);

const NODES: usize = 4;
/// Listener 0: per-connection receive buffers; listener 1: its own pool.
const LISTEN_PORTS: [u16; 2] = [7000, 7001];
/// Receive buffer size of initiators without the shared pool and of
/// listener 0's connections.
const CONN_RECV: usize = 96;
/// Buffer size of listener 1's own receive pool.
const LISTENER_RECV: usize = 80;
/// Buffer size of a backend's shared receive pool.
const SHARED_RECV: usize = 112;
/// Send buffers (per connection or the shared send pool).
const SEND_BUF: usize = 128;
/// Id (8 bytes), length (2), checksum (4).
const HEAD: usize = 14;
const MAX_LEN: usize = 128;
/// Zero-copy slots of a node's region.
const SLOTS: u64 = 512;
const SLOT: usize = MAX_LEN;
/// A message's key is its id plus this, so no key equals a buffer index.
const KEY_BASE: u64 = 1 << 40;
/// First local port handed out to an outgoing connection.
const FIRST_PORT: u16 = 10_000;
/// Virtual time each drain phase runs: longer than every `peer_timeout`
/// and than `CONNECT_TIMEOUT`.
const SETTLE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Seeded generation

/// splitmix64: a tiny, good, seedable generator.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 if `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }

    fn node(&mut self) -> u8 {
        self.below(NODES as u64) as u8
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Buffered,
    Copy,
    ZeroCopy,
    /// `send_copy_batch` of this many messages.
    CopyBatch(u8),
    /// `get_buffers` and `send_buffer_batch` of up to this many buffers.
    BufferBatch(u8),
}

/// One step of a scenario. Nodes are taken modulo [`NODES`]; `pick`
/// chooses among the connection ends that fit the operation at that
/// moment (modulo their number), so an operation stays meaningful when
/// shrinking removes others.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Connect {
        from: u8,
        to: u8,
        listener: u8,
        shared_recv: bool,
    },
    Send {
        pick: u16,
        mode: Mode,
        len: u8,
        header: u8,
        echo: bool,
        close_after: bool,
    },
    Close {
        pick: u16,
    },
    Stale {
        pick: u16,
    },
    PauseReceive {
        pick: u16,
    },
    ResumeReceive {
        pick: u16,
    },
    CloseListener {
        node: u8,
        listener: u8,
    },
    ReopenListener {
        node: u8,
        listener: u8,
    },
    PauseLoop {
        node: u8,
    },
    ResumeLoop {
        node: u8,
    },
    Hold {
        a: u8,
        b: u8,
    },
    Release {
        a: u8,
        b: u8,
    },
    Partition {
        a: u8,
        b: u8,
    },
    Heal {
        a: u8,
        b: u8,
    },
    Reset {
        a: u8,
        b: u8,
    },
    Refuse {
        node: u8,
        on: bool,
    },
    SetLink {
        a: u8,
        b: u8,
        latency_us: u16,
        bandwidth: u64,
        jitter_us: u8,
    },
    SetNic {
        node: u8,
        send: u64,
        receive: u64,
    },
    TcpWindow {
        bytes: u32,
    },
    Slow {
        node: u8,
        micros: u16,
    },
    Crash {
        node: u8,
    },
    CrashSilently {
        node: u8,
    },
    Restart {
        node: u8,
    },
    Run {
        micros: u32,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct NodeCfg {
    shared_recv: bool,
    shared_send: bool,
    peer_timeout_ms: Option<u64>,
    depth: usize,
    thread_safe: bool,
}

#[derive(Clone, Debug)]
struct Scenario {
    /// The seed the scenario was generated from; also the world's seed.
    seed: u64,
    /// The TCP profile, else RDMA.
    tcp: bool,
    nodes: Vec<NodeCfg>,
    ops: Vec<Op>,
}

fn two_nodes(g: &mut Rng) -> (u8, u8) {
    let a = g.node();
    let b = (a + 1 + g.below(NODES as u64 - 1) as u8) % NODES as u8;
    (a, b)
}

impl Op {
    fn generate(g: &mut Rng) -> Op {
        let (a, b) = two_nodes(g);
        let node = g.node();
        let pick = g.next() as u16;
        match g.below(1000) {
            0..=379 => {
                let mode = match g.below(100) {
                    0..=24 => Mode::Buffered,
                    25..=54 => Mode::Copy,
                    55..=79 => Mode::ZeroCopy,
                    80..=89 => Mode::CopyBatch(g.range(2, 5) as u8),
                    _ => Mode::BufferBatch(g.range(2, 4) as u8),
                };
                let len = if g.percent(6) {
                    g.range(81, MAX_LEN as u64)
                } else {
                    g.range(HEAD as u64, 80)
                };
                Op::Send {
                    pick,
                    mode,
                    len: len as u8,
                    header: g.below(MAX_HEADER_LEN as u64 + 1) as u8,
                    echo: g.percent(10),
                    close_after: g.below(1000) < 15,
                }
            }
            380..=459 => Op::Connect {
                from: node,
                // Now and then to itself.
                to: if g.percent(10) { node } else { b },
                listener: g.below(2) as u8,
                shared_recv: g.percent(50),
            },
            460..=619 => Op::Run {
                micros: match g.below(100) {
                    0..=69 => g.below(200),
                    70..=94 => g.range(200, 5_000),
                    _ => g.range(50_000, 2_000_000),
                } as u32,
            },
            620..=654 => Op::Close { pick },
            655..=669 => Op::Stale { pick },
            670..=689 => Op::PauseReceive { pick },
            690..=714 => Op::ResumeReceive { pick },
            715..=729 => Op::CloseListener {
                node,
                listener: g.below(2) as u8,
            },
            730..=749 => Op::ReopenListener {
                node,
                listener: g.below(2) as u8,
            },
            750..=764 => Op::PauseLoop { node },
            765..=789 => Op::ResumeLoop { node },
            790..=804 => Op::Hold { a, b },
            805..=824 => Op::Release { a, b },
            825..=844 => Op::Partition { a, b },
            845..=869 => Op::Heal { a, b },
            870..=889 => {
                // Now and then a host's connections to itself.
                let b = if g.percent(15) { a } else { b };
                Op::Reset { a, b }
            }
            890..=904 => Op::Refuse {
                node,
                on: g.percent(60),
            },
            905..=924 => Op::SetLink {
                a,
                b,
                latency_us: g.below(301) as u16,
                bandwidth: g.pick(&[0, 2_000_000, 50_000_000, 10_000_000_000]),
                jitter_us: g.below(21) as u8,
            },
            925..=934 => Op::SetNic {
                node,
                send: g.pick(&[0, 1_000_000, 100_000_000, 10_000_000_000]),
                receive: g.pick(&[0, 1_000_000, 100_000_000, 10_000_000_000]),
            },
            935..=944 => Op::TcpWindow {
                bytes: g.pick(&[64, 150, 1_000, 10_000, 262_144]),
            },
            945..=959 => Op::Slow {
                node,
                micros: g.pick(&[0, 0, 20, 200, 1_000]),
            },
            960..=969 => Op::Crash { node },
            970..=979 => Op::CrashSilently { node },
            _ => Op::Restart { node },
        }
    }

    /// Simpler variants of this operation, tried by the shrinker.
    fn simpler(&self) -> Vec<Op> {
        let mut out = Vec::new();
        match self {
            Op::Send {
                pick,
                mode,
                len,
                header,
                echo,
                close_after,
            } => {
                let with = |mode: Mode, echo: bool, close_after: bool| Op::Send {
                    pick: *pick,
                    mode,
                    len: *len,
                    header: *header,
                    echo,
                    close_after,
                };
                if *echo {
                    out.push(with(*mode, false, *close_after));
                }
                if *close_after {
                    out.push(with(*mode, *echo, false));
                }
                match mode {
                    Mode::CopyBatch(n) if *n > 1 => {
                        out.push(with(Mode::CopyBatch(n - 1), *echo, *close_after))
                    }
                    Mode::BufferBatch(n) if *n > 1 => {
                        out.push(with(Mode::BufferBatch(n - 1), *echo, *close_after))
                    }
                    Mode::Copy => {}
                    _ => out.push(with(Mode::Copy, *echo, *close_after)),
                }
            }
            Op::Run { micros } if *micros > 0 => {
                out.push(Op::Run { micros: micros / 2 });
            }
            Op::Connect {
                from,
                to,
                listener,
                shared_recv: true,
            } => out.push(Op::Connect {
                from: *from,
                to: *to,
                listener: *listener,
                shared_recv: false,
            }),
            _ => {}
        }
        out
    }
}

impl Scenario {
    /// The scenario of `seed`, with up to `max_ops` random operations:
    /// everything follows from the seed.
    fn generate(seed: u64, threaded: bool, max_ops: usize) -> Scenario {
        let mut g = Rng::new(seed);
        let tcp = g.percent(50);
        let nodes = (0..NODES)
            .map(|_| NodeCfg {
                shared_recv: g.percent(50),
                shared_send: g.percent(40),
                peer_timeout_ms: g.percent(50).then(|| g.range(100, 800)),
                depth: g.range(2, 6) as usize,
                thread_safe: threaded || g.percent(50),
            })
            .collect();
        let n = g.range(10, max_ops.max(10) as u64) as usize;
        let mut ops = Vec::with_capacity(n + 4);
        // Start with a few connections, so there is traffic from the start.
        for _ in 0..4 {
            let (from, to) = two_nodes(&mut g);
            ops.push(Op::Connect {
                from,
                to,
                listener: g.below(2) as u8,
                shared_recv: g.percent(50),
            });
        }
        ops.push(Op::Run { micros: 100 });
        for _ in 0..n {
            ops.push(Op::generate(&mut g));
        }
        Scenario {
            seed,
            tcp,
            nodes,
            ops,
        }
    }
}

// ---------------------------------------------------------------------------
// Messages: id, length and checksum in every message

fn fnv32(parts: &[&[u8]]) -> u32 {
    let mut h: u32 = 0x811C_9DC5;
    for p in parts {
        for &b in *p {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    }
    h
}

fn checksum(id: u64, len: u16, body: &[u8]) -> u32 {
    fnv32(&[&id.to_le_bytes(), &len.to_le_bytes(), body])
}

/// Message `id` of `len` bytes: id, length, checksum, then a body that
/// follows from the id.
fn message(id: u64, len: usize) -> Vec<u8> {
    assert!((HEAD..=MAX_LEN).contains(&len));
    let mut v = vec![0u8; len];
    v[0..8].copy_from_slice(&id.to_le_bytes());
    v[8..10].copy_from_slice(&(len as u16).to_le_bytes());
    let mut r = Rng::new(id ^ 0xB0D1_B0D1);
    for b in &mut v[HEAD..] {
        *b = r.next() as u8;
    }
    let sum = checksum(id, len as u16, &v[HEAD..]);
    v[10..14].copy_from_slice(&sum.to_le_bytes());
    v
}

fn key(id: u64) -> u64 {
    KEY_BASE + id
}

fn id_of(key: u64) -> Option<u64> {
    key.checked_sub(KEY_BASE).filter(|&id| id > 0)
}

/// Length of message `i` of a batch whose first message has `len` bytes.
fn batch_len(len: usize, i: usize) -> usize {
    let span = MAX_LEN - HEAD + 1;
    HEAD + (len - HEAD + 5 * i) % span
}

// ---------------------------------------------------------------------------
// The model

/// How a connection end ended, as reported (or as expected).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Closed(CloseReason),
    Refused(RefuseReason),
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Closed(r) => write!(f, "closed ({r:?})"),
            Outcome::Refused(r) => write!(f, "refused ({r:?})"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Death {
    /// `Sim::crash` or `Sim::restart`: the peers hear a reset.
    Reset,
    /// `Sim::crash_silently`.
    Silent,
}

/// One end of a connection, as the model knows it.
#[derive(Default)]
struct End {
    node: usize,
    /// The life of the node the end belongs to (restarts count).
    inc: usize,
    /// The handle: the initiator's from `open_active_endpoint`, the
    /// acceptor's from `on_connection_established` (unknown until then).
    handle: Option<ConnId>,
    established: bool,
    /// `close_active_endpoint` returned `Ok`.
    close_called: bool,
    /// Closed by the application: its close call or its listener's close.
    app_closed: bool,
    /// May have dropped messages it had taken (RDMA): closed by the
    /// application while callbacks were pending.
    lossy: bool,
    rx_paused: bool,
    rx_paused_ever: bool,
    /// The report this end must give, set by the first operation that ends
    /// it, when the model knows the world's state for sure.
    cause: Option<Outcome>,
    /// Reports operations may have caused, when the model could not know
    /// the world's state (its loop was paused: reports may be pending).
    maybe: Vec<Outcome>,
    report: Option<Outcome>,
    /// Its host crashed while it lived.
    vanished: bool,
    /// The peer's host crashed with a reset (or restarted).
    peer_reset: bool,
    /// The peer's host crashed silently.
    peer_silent: bool,
    /// The target's host crashed before the acceptor was known (initiator).
    peer_maybe_reset: bool,
    peer_maybe_silent: bool,
    /// Ids of accepted sends not yet ended, in send order.
    outstanding: VecDeque<u64>,
    /// Ids of every accepted send, in send order.
    sent: Vec<u64>,
    /// How many of the peer's `sent` were delivered here.
    delivered: usize,
    /// Largest message this end can receive.
    recv_limit: usize,
}

impl End {
    fn known(&self) -> bool {
        self.handle.is_some()
    }
}

struct Link {
    from: usize,
    to: usize,
    listener: usize,
    /// The listener's address (the initiator's remote).
    target: EndpointAddress,
    /// The initiator's local address (the acceptor's remote).
    source: EndpointAddress,
    ends: [End; 2],
    /// Partitioned at some point while it lived.
    cut: bool,
    /// Lengths of oversize messages accepted from each side.
    oversize: [Vec<usize>; 2],
    /// Side `s` may hear `PeerClosed`: its peer closed, or was sent an
    /// oversize message it must refuse.
    may_hear_peer_closed: [bool; 2],
}

struct MsgRec {
    link: usize,
    side: usize,
    /// Its index in the sender's `End::sent`.
    seq: usize,
    len: usize,
    echo: bool,
    close_after: bool,
    oversize: bool,
    completed: u32,
    cancelled: u32,
    delivered: u32,
}

struct NodeState {
    cfg: NodeCfg,
    host: SimHost,
    /// One per life: how it ended (`None`: alive, the last one only).
    deaths: Vec<Option<Death>>,
    /// The backend of each life.
    backends: Vec<SimBackend>,
    region: MemoryRegion,
    listeners: [bool; 2],
    loop_paused: bool,
    /// Callbacks of this node may be pending (its loop is paused, or was
    /// resumed and the world has not run since): what the model knows of
    /// its connections may be out of date.
    unsynced: bool,
}

impl NodeState {
    fn inc(&self) -> usize {
        self.deaths.len() - 1
    }

    fn alive(&self) -> bool {
        self.deaths.last() == Some(&None)
    }

    fn backend(&self) -> SimBackend {
        self.backends.last().expect("a backend per life").clone()
    }
}

/// Counts of what the cases exercised.
#[derive(Default, Debug, Clone)]
struct Stats {
    cases: u64,
    ops: u64,
    accepted: u64,
    delivered: u64,
    completed: u64,
    cancelled: u64,
    oversize: u64,
    zero_copy: u64,
    batches: u64,
    echoes: u64,
    callback_closes: u64,
    stale_checks: u64,
    restarts: u64,
    established: u64,
    /// Sends accepted from the second thread (threaded test).
    other_thread: u64,
    closes: BTreeMap<String, u64>,
    refusals: BTreeMap<String, u64>,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.cases += o.cases;
        self.ops += o.ops;
        self.accepted += o.accepted;
        self.delivered += o.delivered;
        self.completed += o.completed;
        self.cancelled += o.cancelled;
        self.oversize += o.oversize;
        self.zero_copy += o.zero_copy;
        self.batches += o.batches;
        self.echoes += o.echoes;
        self.callback_closes += o.callback_closes;
        self.stale_checks += o.stale_checks;
        self.restarts += o.restarts;
        self.established += o.established;
        self.other_thread += o.other_thread;
        for (k, v) in &o.closes {
            *self.closes.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.refusals {
            *self.refusals.entry(k.clone()).or_default() += v;
        }
    }
}

fn variant<T: fmt::Debug>(x: &T) -> String {
    let s = format!("{x:?}");
    s.split([' ', '(', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

struct Model {
    tcp: bool,
    /// All checks (deterministic runs), or conservation only (threads).
    strict: bool,
    sim: Option<Sim>,
    nodes: Vec<NodeState>,
    links: Vec<Link>,
    /// (node, life, handle) → (link, side).
    handles: BTreeMap<(usize, usize, ConnId), (usize, usize)>,
    /// Initiator's local address → link.
    by_source: BTreeMap<EndpointAddress, usize>,
    msgs: BTreeMap<u64, MsgRec>,
    next_id: u64,
    next_port: u16,
    partitions: BTreeSet<(usize, usize)>,
    holds: BTreeSet<(usize, usize)>,
    errors: Vec<String>,
    stats: Stats,
}

type Shared = Arc<Mutex<Model>>;

fn lock(m: &Shared) -> MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pair(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

impl Model {
    fn err(&mut self, check: &str, msg: String) {
        if self.errors.len() < 40 {
            let now = self.sim.as_ref().map(Sim::now).unwrap_or_default();
            self.errors
                .push(format!("[{check}] at {:.6}s: {msg}", now.as_secs_f64()));
        }
    }

    fn who(&self, l: usize, s: usize) -> String {
        let link = &self.links[l];
        let e = &link.ends[s];
        format!(
            "link {l} ({} {}→{} listener {} from port {}), {} on node {} life {} {}",
            if self.tcp { "tcp" } else { "rdma" },
            link.from,
            link.to,
            link.listener,
            link.source.port(),
            if s == 0 { "initiator" } else { "acceptor" },
            e.node,
            e.inc,
            e.handle.map(|h| h.to_string()).unwrap_or_default(),
        )
    }

    fn end_alive(&self, l: usize, s: usize) -> bool {
        let e = &self.links[l].ends[s];
        e.known() && !e.vanished && self.nodes[e.node].deaths[e.inc].is_none()
    }

    /// Ends that can send: established, open, on a live host.
    fn usable(&self) -> Vec<(usize, usize)> {
        self.ends_where(|m, l, s| {
            let e = &m.links[l].ends[s];
            m.end_alive(l, s) && e.established && !e.app_closed && e.report.is_none()
        })
    }

    fn ends_where(&self, f: impl Fn(&Model, usize, usize) -> bool) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for l in 0..self.links.len() {
            for s in 0..2 {
                if f(self, l, s) {
                    out.push((l, s));
                }
            }
        }
        out
    }

    fn backend_of(&self, l: usize, s: usize) -> SimBackend {
        let e = &self.links[l].ends[s];
        self.nodes[e.node].backends[e.inc].clone()
    }

    fn lookup(
        &mut self,
        node: usize,
        inc: usize,
        conn: ConnId,
        what: &str,
    ) -> Option<(usize, usize)> {
        let found = self.handles.get(&(node, inc, conn)).copied();
        if found.is_none() {
            self.err(
                "unknown",
                format!("node {node} life {inc}: {what} for {conn}, a handle it never had"),
            );
        }
        found
    }

    /// Called first in every callback: a crashed life hears nothing.
    fn alive_check(&mut self, node: usize, inc: usize, what: &str) -> bool {
        if self.nodes[node].deaths[inc].is_some() {
            self.err(
                "crash",
                format!("node {node} life {inc} crashed, yet its handler got {what}"),
            );
            return false;
        }
        true
    }

    // -- sending ---------------------------------------------------------

    /// Sends fresh messages from side `s` of link `l` with backend `b`;
    /// records those the backend accepts.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        b: &SimBackend,
        l: usize,
        s: usize,
        mode: Mode,
        len: usize,
        header: usize,
        echo: bool,
        close_after: bool,
    ) {
        let Some(conn) = self.links[l].ends[s].handle else {
            return;
        };
        let count = match mode {
            Mode::CopyBatch(n) | Mode::BufferBatch(n) => usize::from(n.max(1)),
            _ => 1,
        };
        let ids: Vec<u64> = (0..count)
            .map(|_| {
                self.next_id += 1;
                self.next_id
            })
            .collect();
        let lens: Vec<usize> = (0..count).map(|i| batch_len(len, i)).collect();
        let msgs: Vec<Vec<u8>> = ids
            .iter()
            .zip(&lens)
            .map(|(&id, &n)| message(id, n))
            .collect();
        let hdr = |m: &[u8]| header.min(MAX_HEADER_LEN).min(m.len() - 1);
        let accepted = match mode {
            Mode::Buffered => match b.get_buffer(conn) {
                Ok(Some(mut buf)) => {
                    buf.write(&msgs[0])
                        .expect("a send buffer holds every message");
                    usize::from(b.send_buffer(conn, buf, key(ids[0])).is_ok())
                }
                _ => 0,
            },
            Mode::Copy => {
                let m = &msgs[0];
                let (head, rest) = m.split_at(hdr(m));
                let (x, rest) = rest.split_at(rest.len() / 3);
                let (y, z) = rest.split_at(rest.len() / 2);
                usize::from(
                    b.send_data_copy(conn, &[x, y, z], head, key(ids[0]))
                        .is_ok(),
                )
            }
            Mode::ZeroCopy => {
                let m = &msgs[0];
                let h = hdr(m);
                let region = self.nodes[self.links[l].ends[s].node].region.clone();
                let at = (ids[0] % SLOTS) as usize * SLOT;
                // A slot still lent to a send in flight is refused: skip.
                if region.write(at, &m[h..]).is_err() {
                    0
                } else {
                    let slice = region.slice(at, m.len() - h).expect("in the region");
                    let ok = b.send_data(conn, &[slice], &m[..h], key(ids[0])).is_ok();
                    self.stats.zero_copy += u64::from(ok);
                    usize::from(ok)
                }
            }
            Mode::CopyBatch(_) => {
                let batch: Vec<CopyMessage<'_>> = msgs
                    .iter()
                    .zip(&ids)
                    .map(|(m, &id)| {
                        let h = hdr(m);
                        CopyMessage::with_header(&m[..h], &m[h..], key(id))
                    })
                    .collect();
                self.stats.batches += 1;
                match b.send_copy_batch(conn, &batch) {
                    Ok(()) => count,
                    Err(e) => e.sent,
                }
            }
            Mode::BufferBatch(_) => {
                let mut bufs = Vec::new();
                if b.get_buffers(conn, count, &mut bufs).is_err() {
                    return;
                }
                let mut batch = Vec::new();
                for (i, mut buf) in bufs.into_iter().enumerate() {
                    buf.write(&msgs[i])
                        .expect("a send buffer holds every message");
                    batch.push((buf, key(ids[i])));
                }
                let n = batch.len();
                self.stats.batches += 1;
                match b.send_buffer_batch(conn, &mut batch) {
                    Ok(()) => n,
                    Err(e) => e.sent,
                }
            }
        };
        for i in 0..accepted {
            self.record(l, s, ids[i], lens[i], echo, close_after);
        }
    }

    fn record(&mut self, l: usize, s: usize, id: u64, len: usize, echo: bool, close_after: bool) {
        let link = &mut self.links[l];
        let oversize = len > link.ends[1 - s].recv_limit;
        if oversize {
            link.oversize[s].push(len);
            link.may_hear_peer_closed[s] = true;
            self.stats.oversize += 1;
        }
        let e = &mut link.ends[s];
        e.outstanding.push_back(id);
        let seq = e.sent.len();
        e.sent.push(id);
        self.msgs.insert(
            id,
            MsgRec {
                link: l,
                side: s,
                seq,
                len,
                echo,
                close_after,
                oversize,
                completed: 0,
                cancelled: 0,
                delivered: 0,
            },
        );
        self.stats.accepted += 1;
    }

    // -- closing -----------------------------------------------------------

    /// `close_active_endpoint` on side `s` of link `l` returned `Ok`.
    fn closed_by_app(&mut self, l: usize, s: usize, in_callback: bool) {
        // Inside a callback the side may already be ending with
        // `MessageTooLarge`: the delivery that called us can have found an
        // oversize message behind the ones it hands over.
        let unsynced = if in_callback {
            !self.links[l].oversize[1 - s].is_empty()
        } else {
            self.nodes[self.links[l].ends[s].node].unsynced
        };
        let e = &mut self.links[l].ends[s];
        e.close_called = true;
        e.app_closed = true;
        if in_callback || unsynced {
            // Messages taken at this instant, or held for the paused loop,
            // are dropped with the close.
            e.lossy = true;
        }
        if e.cause.is_none() && e.report.is_none() {
            if unsynced || !e.maybe.is_empty() {
                e.maybe.push(Outcome::Closed(CloseReason::Local));
                e.maybe.push(Outcome::Refused(RefuseReason::Cancelled));
            } else if e.established {
                e.cause = Some(Outcome::Closed(CloseReason::Local));
            } else {
                e.cause = Some(Outcome::Refused(RefuseReason::Cancelled));
            }
        }
        self.links[l].may_hear_peer_closed[1 - s] = true;
    }

    /// Closes side `s` of link `l` from the driver (or from a callback).
    fn close(&mut self, b: &SimBackend, l: usize, s: usize, in_callback: bool) {
        let Some(h) = self.links[l].ends[s].handle else {
            return;
        };
        match b.close_active_endpoint(h) {
            Ok(()) => self.closed_by_app(l, s, in_callback),
            Err(e) => {
                let synced = !self.nodes[self.links[l].ends[s].node].unsynced;
                if self.strict && synced && !in_callback {
                    let who = self.who(l, s);
                    self.err(
                        "op",
                        format!("closing {who}, open as far as anyone was told, failed: {e}"),
                    );
                }
            }
        }
    }

    /// A fault or listener close that ends side `s` with `want` (if the
    /// model is sure of the world's state) or perhaps with it.
    fn ended_by_op(&mut self, l: usize, s: usize, want: Outcome, or_opening: Option<Outcome>) {
        let unsynced = self.nodes[self.links[l].ends[s].node].unsynced;
        let e = &mut self.links[l].ends[s];
        if e.cause.is_some() || e.report.is_some() || e.vanished {
            return; // the first end wins; a gone side is not touched
        }
        if !e.known() {
            // An acceptor not yet reported: unless its loop holds its
            // report, it is not open yet, and the operation drops it or
            // misses it.
            if unsynced {
                e.maybe.push(want);
            }
            return;
        }
        if e.close_called {
            return; // already ending as its close call said
        }
        if unsynced || !e.maybe.is_empty() {
            e.maybe.push(want);
            e.maybe.extend(or_opening);
        } else if e.established {
            e.cause = Some(want);
        } else if let Some(o) = or_opening {
            e.cause = Some(o);
        }
    }

    /// Checks the reason of a close or refusal report of side `s`.
    fn check_reason(&mut self, l: usize, s: usize, got: &Outcome) {
        if !self.strict {
            return;
        }
        let link = &self.links[l];
        let e = &link.ends[s];
        if let Some(want) = &e.cause {
            if want != got {
                let (want, who) = (want.clone(), self.who(l, s));
                self.err(
                    "close-reason",
                    format!("{who} reported {got}, but the operation that ended it means {want}"),
                );
            }
            return;
        }
        let own_timeout = self.nodes[e.node].cfg.peer_timeout_ms.is_some();
        let peer_timeout = self.nodes[link.ends[1 - s].node]
            .cfg
            .peer_timeout_ms
            .is_some();
        let ok = e.maybe.contains(got)
            || match got {
                Outcome::Closed(CloseReason::PeerClosed) => link.may_hear_peer_closed[s],
                Outcome::Closed(CloseReason::Reset) => {
                    e.peer_reset || e.peer_maybe_reset || (peer_timeout && link.cut)
                }
                Outcome::Closed(CloseReason::TimedOut) => {
                    own_timeout && (link.cut || e.peer_silent || e.peer_maybe_silent)
                }
                Outcome::Closed(CloseReason::MessageTooLarge { size, limit }) => {
                    *limit == e.recv_limit && link.oversize[1 - s].contains(&(*size as usize))
                }
                Outcome::Refused(RefuseReason::Refused | RefuseReason::Unreachable) => s == 0,
                _ => false,
            };
        if !ok {
            let who = self.who(l, s);
            let why = format!(
                "may hear PeerClosed: {}, peer crashed: {}/{} (silently: {}/{}), cut: {}, \
                 own/peer timeout: {own_timeout}/{peer_timeout}, oversize towards it: {:?}, \
                 limit {}, perhaps: {:?}",
                link.may_hear_peer_closed[s],
                e.peer_reset,
                e.peer_maybe_reset,
                e.peer_silent,
                e.peer_maybe_silent,
                link.cut,
                link.oversize[1 - s],
                e.recv_limit,
                e.maybe
            );
            self.err(
                "close-reason",
                format!("{who} reported {got}, which nothing explains ({why})"),
            );
        }
    }

    // -- crashes -------------------------------------------------------------

    fn crashed(&mut self, node: usize, death: Death) {
        if !self.nodes[node].alive() {
            return;
        }
        let inc = self.nodes[node].inc();
        self.nodes[node].deaths[inc] = Some(death);
        self.nodes[node].listeners = [false; 2];
        for link in &mut self.links {
            for s in 0..2 {
                let e = &link.ends[s];
                if e.known() && e.node == node {
                    let lived = e.report.is_none() && e.inc == inc;
                    link.ends[s].vanished |= lived;
                    // (Also a connection of an earlier life: its peer, if
                    // still open, hears the reset, or loses the host again.)
                    let peer = &mut link.ends[1 - s];
                    match death {
                        Death::Reset => peer.peer_reset = true,
                        Death::Silent => peer.peer_silent = true,
                    }
                } else if s == 1 && !e.known() && link.to == node {
                    let initiator = &mut link.ends[0];
                    match death {
                        Death::Reset => initiator.peer_maybe_reset = true,
                        Death::Silent => initiator.peer_maybe_silent = true,
                    }
                }
            }
        }
    }

    /// Before `Sim::restart(node)`: the running life crashes (with a
    /// reset); the peers of lives lost silently hear a reset; a new life
    /// begins.
    fn restarting(&mut self, node: usize) {
        self.crashed(node, Death::Reset);
        for link in &mut self.links {
            for s in 0..2 {
                let peer_here = {
                    let p = &link.ends[1 - s];
                    (p.known() && p.node == node) || (s == 0 && !p.known() && link.to == node)
                };
                if peer_here {
                    let e = &mut link.ends[s];
                    if e.peer_silent {
                        e.peer_reset = true;
                    }
                    if e.peer_maybe_silent {
                        e.peer_maybe_reset = true;
                    }
                }
            }
        }
        let n = &mut self.nodes[node];
        n.deaths.push(None);
        n.loop_paused = false;
        n.unsynced = false;
        n.listeners = [false; 2];
        self.stats.restarts += 1;
    }

    // -- events ----------------------------------------------------------------

    fn on_established(
        &mut self,
        node: usize,
        inc: usize,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        self.stats.established += 1;
        let want_caps = Capabilities {
            receive: true,
            send_buffered: true,
            send_zero_copy: true,
            send_copy: true,
        };
        if caps != want_caps {
            self.err(
                "handshake",
                format!("node {node}: {conn} established with capabilities {caps:?}"),
            );
        }
        if let Some(&(l, s)) = self.handles.get(&(node, inc, conn)) {
            let who = self.who(l, s);
            let e = &self.links[l].ends[s];
            let problem = if s != 0 || e.established {
                Some(("handshake", "established twice"))
            } else if e.close_called && matches!(e.cause, Some(Outcome::Refused(_))) {
                // (A paused loop may hand over an establishment the world
                // made before the close call; then the model is unsure.)
                Some((
                    "after-close",
                    "established after closing it while it was opening",
                ))
            } else if e.report.is_some() {
                Some(("after-close", "established after its close report"))
            } else {
                None
            };
            if let Some((check, what)) = problem {
                self.err(check, format!("{who}: {what}"));
            }
            if remote != self.links[l].target {
                self.err(
                    "handshake",
                    format!("{who}: established with remote {remote}"),
                );
            }
            self.links[l].ends[s].established = true;
            return;
        }
        let Some(&l) = self.by_source.get(&remote) else {
            self.err(
                "handshake",
                format!("node {node}: accepted {conn} from {remote}, where nobody connected from"),
            );
            return;
        };
        if self.links[l].to != node || self.links[l].ends[1].known() {
            let who = self.who(l, 1);
            self.err(
                "handshake",
                format!("node {node} life {inc}: accepted {conn} from {remote}, but that is {who}"),
            );
            return;
        }
        let e = &mut self.links[l].ends[1];
        e.handle = Some(conn);
        e.inc = inc;
        e.established = true;
        self.handles.insert((node, inc, conn), (l, 1));
    }

    fn on_refused(
        &mut self,
        node: usize,
        inc: usize,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        *self.stats.refusals.entry(variant(reason)).or_default() += 1;
        let Some((l, s)) = self.lookup(node, inc, conn, "a refusal") else {
            return;
        };
        let who = self.who(l, s);
        if s != 0 || self.links[l].ends[s].established {
            self.err(
                "handshake",
                format!("{who}: refused ({reason}) after it was established"),
            );
        }
        if let Some(prev) = &self.links[l].ends[s].report {
            let prev = prev.clone();
            self.err(
                "close-once",
                format!("{who}: refused ({reason}) after {prev}"),
            );
            return;
        }
        if remote != self.links[l].target {
            self.err("handshake", format!("{who}: refused with remote {remote}"));
        }
        let got = Outcome::Refused(reason.clone());
        self.check_reason(l, s, &got);
        if !self.links[l].ends[s].outstanding.is_empty() {
            self.err(
                "exactly-once",
                format!("{who}: refused with sends outstanding"),
            );
        }
        self.links[l].ends[s].report = Some(got);
    }

    fn on_closed(
        &mut self,
        node: usize,
        inc: usize,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        *self.stats.closes.entry(variant(reason)).or_default() += 1;
        let Some((l, s)) = self.lookup(node, inc, conn, "a close") else {
            return;
        };
        let who = self.who(l, s);
        let e = &self.links[l].ends[s];
        if let Some(prev) = &e.report {
            let prev = prev.clone();
            self.err(
                "close-once",
                format!("{who}: closed ({reason:?}) after {prev}"),
            );
            return;
        }
        if !e.established {
            self.err(
                "handshake",
                format!("{who}: closed ({reason:?}) but never established"),
            );
        }
        let want_remote = if s == 0 {
            self.links[l].target
        } else {
            self.links[l].source
        };
        if remote != want_remote {
            self.err(
                "handshake",
                format!("{who}: closed with remote {remote}, not {want_remote}"),
            );
        }
        for &k in keys {
            self.stats.cancelled += 1;
            let Some(id) = id_of(k) else {
                self.err(
                    "exactly-once",
                    format!("{who}: cancelled key {k}, never used"),
                );
                continue;
            };
            let e = &mut self.links[l].ends[s];
            match e.outstanding.iter().position(|&x| x == id) {
                Some(p) => {
                    e.outstanding.remove(p);
                    let m = self.msgs.get_mut(&id).expect("recorded");
                    m.cancelled += 1;
                    if m.delivered > 0 && self.tcp {
                        self.err(
                            "tcp-profile",
                            format!("{who}: message {id} cancelled after it was delivered"),
                        );
                    }
                }
                None => {
                    let state = self.msg_state(id);
                    self.err(
                        "exactly-once",
                        format!("{who}: cancelled key of message {id}, which is not outstanding here ({state})"),
                    );
                }
            }
        }
        let left: Vec<u64> = self.links[l].ends[s].outstanding.drain(..).collect();
        if !left.is_empty() {
            self.err(
                "exactly-once",
                format!("{who}: closed ({reason:?}) leaving messages {left:?} neither completed nor cancelled"),
            );
        }
        let got = Outcome::Closed(reason.clone());
        self.check_reason(l, s, &got);
        self.links[l].ends[s].report = Some(got);
    }

    fn msg_state(&self, id: u64) -> String {
        match self.msgs.get(&id) {
            None => "never accepted".into(),
            Some(m) => format!(
                "sent on link {} side {}, completed {}×, cancelled {}×, delivered {}×",
                m.link, m.side, m.completed, m.cancelled, m.delivered
            ),
        }
    }

    fn on_completed(&mut self, node: usize, inc: usize, conn: ConnId, keys: &[u64]) {
        let Some((l, s)) = self.lookup(node, inc, conn, "completions") else {
            return;
        };
        let who = self.who(l, s);
        if let Some(r) = &self.links[l].ends[s].report {
            let r = r.clone();
            self.err(
                "after-close",
                format!("{who}: completions {keys:?} after its report: {r}"),
            );
        }
        if keys.is_empty() {
            self.err("exactly-once", format!("{who}: an empty completion batch"));
        }
        for &k in keys {
            self.stats.completed += 1;
            let Some(id) = id_of(k) else {
                self.err(
                    "exactly-once",
                    format!("{who}: completed key {k}, never used"),
                );
                continue;
            };
            let e = &mut self.links[l].ends[s];
            match e.outstanding.iter().position(|&x| x == id) {
                Some(p) => {
                    let earlier: Vec<u64> = e.outstanding.iter().take(p).copied().collect();
                    e.outstanding.remove(p);
                    if p > 0 {
                        self.err(
                            "order",
                            format!(
                                "{who}: message {id} completed before earlier sends {earlier:?}"
                            ),
                        );
                    }
                    let m = self.msgs.get_mut(&id).expect("recorded");
                    m.completed += 1;
                    let oversize = m.oversize;
                    if oversize && !self.tcp && self.strict {
                        self.err(
                            "rdma-profile",
                            format!("{who}: oversize message {id} completed, which its receiver cannot take"),
                        );
                    }
                }
                None => {
                    let state = self.msg_state(id);
                    self.err(
                        "exactly-once",
                        format!("{who}: completed message {id}, which is not outstanding here ({state})"),
                    );
                }
            }
        }
    }

    /// Checks a delivery; returns what the receiver should do next (echo,
    /// close) as (link, side, echo length, close).
    fn on_data(
        &mut self,
        node: usize,
        inc: usize,
        conn: ConnId,
        data: &[u8],
    ) -> Option<(usize, usize, Option<usize>, bool)> {
        self.stats.delivered += 1;
        let (l, s) = self.lookup(node, inc, conn, "data")?;
        let who = self.who(l, s);
        let e = &self.links[l].ends[s];
        let state = if !e.established {
            Some("before it was established")
        } else if e.close_called {
            Some("after its close call")
        } else if e.app_closed {
            Some("after its listener was closed")
        } else if e.report.is_some() {
            Some("after its close report")
        } else {
            None
        };
        if let Some(state) = state {
            self.err(
                "after-close",
                format!("{who}: {} bytes delivered {state}", data.len()),
            );
        }
        if self.links[l].ends[s].rx_paused {
            self.err(
                "pause",
                format!(
                    "{who}: {} bytes delivered while receiving is paused",
                    data.len()
                ),
            );
        }
        if data.len() < HEAD {
            self.err(
                "length",
                format!(
                    "{who}: a message of {} bytes, shorter than any sent",
                    data.len()
                ),
            );
            return None;
        }
        let id = u64::from_le_bytes(data[0..8].try_into().expect("8 bytes"));
        let declared = u16::from_le_bytes(data[8..10].try_into().expect("2 bytes"));
        let sum = u32::from_le_bytes(data[10..14].try_into().expect("4 bytes"));
        if usize::from(declared) != data.len() {
            self.err(
                "length",
                format!(
                    "{who}: message {id} has {} bytes, its header says {declared}",
                    data.len()
                ),
            );
        } else if checksum(id, declared, &data[HEAD..]) != sum {
            self.err(
                "integrity",
                format!("{who}: message {id}: checksum mismatch"),
            );
        }
        let Some(m) = self.msgs.get(&id) else {
            self.err(
                "misrouted",
                format!("{who}: message {id} delivered, never sent"),
            );
            return None;
        };
        if (m.link, m.side) != (l, 1 - s) {
            let (ml, ms) = (m.link, m.side);
            self.err(
                "misrouted",
                format!("{who}: message {id} delivered here, but was sent on link {ml} side {ms}"),
            );
            return None;
        }
        let (len, echo, close_after, oversize, p) =
            (m.len, m.echo, m.close_after, m.oversize, m.seq);
        if data.len() == len {
            let want = message(id, len);
            if let Some(i) = (0..len).find(|&i| want[i] != data[i]) {
                self.err(
                    "integrity",
                    format!(
                        "{who}: message {id}: byte {i} is {:#04x}, sent as {:#04x}",
                        data[i], want[i]
                    ),
                );
            }
        } else {
            self.err(
                "length",
                format!(
                    "{who}: message {id} of {len} bytes arrived with {}",
                    data.len()
                ),
            );
        }
        if oversize || data.len() > self.links[l].ends[s].recv_limit {
            let limit = self.links[l].ends[s].recv_limit;
            self.err(
                "oversize",
                format!(
                    "{who}: message {id} of {} bytes delivered, the receive buffers hold {limit}",
                    data.len()
                ),
            );
        }
        let m = self.msgs.get_mut(&id).expect("checked");
        m.delivered += 1;
        let (delivered, cancelled) = (m.delivered, m.cancelled);
        if delivered > 1 {
            self.err(
                "exactly-once",
                format!("{who}: message {id} delivered {delivered} times"),
            );
        }
        if cancelled > 0 {
            self.err(
                if self.tcp {
                    "tcp-profile"
                } else {
                    "rdma-profile"
                },
                format!("{who}: message {id} delivered although its send was cancelled"),
            );
        }
        // In order, without gaps: the next of the peer's accepted sends.
        let k = self.links[l].ends[s].delivered;
        if p != k {
            let expected = self.links[l].ends[1 - s].sent.get(k).copied();
            self.err(
                "order",
                format!("{who}: message {id} (send #{p} of the peer) delivered where send #{k} ({expected:?}) was due"),
            );
        }
        let e = &mut self.links[l].ends[s];
        e.delivered = e.delivered.max(p + 1);
        Some((l, s, echo.then_some(len), close_after))
    }
}

// ---------------------------------------------------------------------------
// The handler of every node

struct Probe {
    node: usize,
    inc: usize,
    model: Shared,
}

impl Handler<SimBackend> for Probe {
    fn on_connection_established(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        caps: Capabilities,
    ) {
        let mut m = lock(&self.model);
        if m.alive_check(self.node, self.inc, "on_connection_established") {
            m.on_established(self.node, self.inc, conn, remote, caps);
        }
    }

    fn on_connection_refused(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &RefuseReason,
    ) {
        let mut m = lock(&self.model);
        if m.alive_check(self.node, self.inc, "on_connection_refused") {
            m.on_refused(self.node, self.inc, conn, remote, reason);
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        reason: &CloseReason,
        keys: &[u64],
    ) {
        let mut m = lock(&self.model);
        if m.alive_check(self.node, self.inc, "on_connection_closed") {
            m.on_closed(self.node, self.inc, conn, remote, reason, keys);
        }
    }

    fn on_sends_completed(&mut self, _: &SimBackend, conn: ConnId, keys: &[u64]) {
        let mut m = lock(&self.model);
        if m.alive_check(self.node, self.inc, "on_sends_completed") {
            m.on_completed(self.node, self.inc, conn, keys);
        }
    }

    fn on_data(&mut self, b: &SimBackend, conn: ConnId, data: &[u8]) {
        let mut m = lock(&self.model);
        if !m.alive_check(self.node, self.inc, "on_data") {
            return;
        }
        let Some((l, s, echo, close)) = m.on_data(self.node, self.inc, conn, data) else {
            return;
        };
        // Calls into the backend from inside a callback.
        if let Some(len) = echo {
            m.stats.echoes += 1;
            let mode = if len % 2 == 0 {
                Mode::Copy
            } else {
                Mode::Buffered
            };
            m.send(b, l, s, mode, len, 4, false, false);
        }
        if close {
            m.stats.callback_closes += 1;
            m.close(b, l, s, true);
        }
    }
}

// ---------------------------------------------------------------------------
// Building the world

fn backend_config(tcp: bool, cfg: &NodeCfg) -> BackendConfig {
    BackendConfig {
        mode: if tcp {
            NetworkMode::Tcp
        } else {
            NetworkMode::Rdma
        },
        thread_safety: if cfg.thread_safe {
            ThreadSafety::Safe
        } else {
            ThreadSafety::Unsafe
        },
        shared_receive_pool: cfg.shared_recv.then_some(PoolParams::new(SHARED_RECV, 4)),
        shared_send_pool: cfg.shared_send.then_some(PoolParams::new(SEND_BUF, 4)),
        send_queue_depth: cfg.depth,
        peer_timeout: cfg.peer_timeout_ms.map(Duration::from_millis),
    }
}

fn listener_params(which: usize, region: &MemoryRegion) -> ConnectionParams {
    let p = if which == 0 {
        ConnectionParams::receive(CONN_RECV, 3).with_buffered(SEND_BUF, 3)
    } else {
        ConnectionParams::receive(LISTENER_RECV, 4)
            .with_shared_receive()
            .with_buffered(SEND_BUF, 2)
    };
    p.with_zero_copy(region.clone())
}

fn active_params(shared: bool, region: &MemoryRegion) -> ConnectionParams {
    let p = if shared {
        ConnectionParams::default().with_shared_receive()
    } else {
        ConnectionParams::receive(CONN_RECV, 3)
    };
    p.with_buffered(SEND_BUF, 3).with_zero_copy(region.clone())
}

/// Makes the application of `node` for its current life: a backend and
/// both listeners. Runs at the start and from the restart hook.
fn start_node(model: &Shared, host: &SimHost, node: usize) {
    let mut m = lock(model);
    let inc = m.nodes[node].inc();
    let config = backend_config(m.tcp, &m.nodes[node].cfg);
    let region = MemoryRegion::new(SLOTS as usize * SLOT);
    let probe = Probe {
        node,
        inc,
        model: model.clone(),
    };
    let b = host
        .backend(config, probe)
        .expect("a backend on a live host");
    for (which, port) in LISTEN_PORTS.into_iter().enumerate() {
        let addr = EndpointAddress::new(host.ip(), port);
        match b.open_listen_endpoint(addr, listener_params(which, &region)) {
            Ok(_) => m.nodes[node].listeners[which] = true,
            Err(e) => m.err(
                "op",
                format!("node {node} life {inc}: listening on {addr} failed: {e}"),
            ),
        }
    }
    let n = &mut m.nodes[node];
    n.backends.push(b);
    n.region = region;
}

/// One case's world and model.
struct Case {
    sim: Sim,
    model: Shared,
    ips: Vec<IpAddr>,
}

impl Case {
    fn new(sc: &Scenario, strict: bool, trace: bool) -> Case {
        let sim = Sim::with_seed(sc.seed);
        sim.enable_trace(trace);
        let hosts: Vec<SimHost> = (0..NODES).map(|_| sim.next_host()).collect();
        let ips: Vec<IpAddr> = hosts.iter().map(SimHost::ip).collect();
        let model: Shared = Arc::new(Mutex::new(Model {
            tcp: sc.tcp,
            strict,
            sim: Some(sim.clone()),
            nodes: hosts
                .iter()
                .zip(&sc.nodes)
                .map(|(h, cfg)| NodeState {
                    cfg: cfg.clone(),
                    host: h.clone(),
                    deaths: vec![None],
                    backends: Vec::new(),
                    region: MemoryRegion::new(1),
                    listeners: [false; 2],
                    loop_paused: false,
                    unsynced: false,
                })
                .collect(),
            links: Vec::new(),
            handles: BTreeMap::new(),
            by_source: BTreeMap::new(),
            msgs: BTreeMap::new(),
            next_id: 0,
            next_port: FIRST_PORT,
            partitions: BTreeSet::new(),
            holds: BTreeSet::new(),
            errors: Vec::new(),
            stats: Stats::default(),
        }));
        for (node, host) in hosts.iter().enumerate() {
            start_node(&model, host, node);
            let model = model.clone();
            host.on_restart(move |h| start_node(&model, h, node));
        }
        Case { sim, model, ips }
    }

    fn run_for(&self, d: Duration) {
        self.sim.run_for(d);
        // Whatever paused loops held back has been handed over.
        let mut m = lock(&self.model);
        for n in &mut m.nodes {
            n.unsynced = n.loop_paused;
        }
    }

    /// Applies one operation.
    fn apply(&self, op: &Op) {
        let n = |x: u8| usize::from(x) % NODES;
        let pair_of = |a: u8, b: u8| {
            let (a, b) = (n(a), n(b));
            (a, if a == b { (b + 1) % NODES } else { b })
        };
        match *op {
            Op::Run { micros } => self.run_for(Duration::from_micros(u64::from(micros))),
            Op::Connect {
                from,
                to,
                listener,
                shared_recv,
            } => {
                let (from, to, listener) = (n(from), n(to), usize::from(listener) % 2);
                let mut m = lock(&self.model);
                let port = m.next_port;
                m.next_port += 1;
                self.sim
                    .set_connect_ports(self.ips[from], Some(port..=port));
                let shared = shared_recv && m.nodes[from].cfg.shared_recv;
                let params = active_params(shared, &m.nodes[from].region);
                let target = EndpointAddress::new(self.ips[to], LISTEN_PORTS[listener]);
                let alive = m.nodes[from].alive();
                match m.nodes[from].backend().open_active_endpoint(target, params) {
                    Ok(h) => {
                        if !alive {
                            m.err("op", format!("node {from} crashed, yet connecting worked"));
                            return;
                        }
                        let inc = m.nodes[from].inc();
                        let source = EndpointAddress::new(self.ips[from], port);
                        let l = m.links.len();
                        let cut = m.partitions.contains(&pair(from, to));
                        m.links.push(Link {
                            from,
                            to,
                            listener,
                            target,
                            source,
                            ends: [
                                End {
                                    node: from,
                                    inc,
                                    handle: Some(h),
                                    recv_limit: if shared { SHARED_RECV } else { CONN_RECV },
                                    ..End::default()
                                },
                                End {
                                    node: to,
                                    recv_limit: if listener == 0 {
                                        CONN_RECV
                                    } else {
                                        LISTENER_RECV
                                    },
                                    ..End::default()
                                },
                            ],
                            cut,
                            oversize: [Vec::new(), Vec::new()],
                            may_hear_peer_closed: [false; 2],
                        });
                        m.handles.insert((from, inc, h), (l, 0));
                        m.by_source.insert(source, l);
                    }
                    Err(e) => {
                        if alive && m.strict {
                            m.err(
                                "op",
                                format!("node {from} connecting to {target} failed: {e}"),
                            );
                        }
                    }
                }
            }
            Op::Send {
                pick,
                mode,
                len,
                header,
                echo,
                close_after,
            } => {
                let mut m = lock(&self.model);
                let ends = m.usable();
                if ends.is_empty() {
                    return;
                }
                let (l, s) = ends[usize::from(pick) % ends.len()];
                let b = m.backend_of(l, s);
                let len = usize::from(len).clamp(HEAD, MAX_LEN);
                m.send(&b, l, s, mode, len, usize::from(header), echo, close_after);
            }
            Op::Close { pick } => {
                let mut m = lock(&self.model);
                let ends = m.ends_where(|m, l, s| {
                    let e = &m.links[l].ends[s];
                    m.end_alive(l, s) && !e.close_called && e.report.is_none()
                });
                if ends.is_empty() {
                    return;
                }
                let (l, s) = ends[usize::from(pick) % ends.len()];
                let b = m.backend_of(l, s);
                m.close(&b, l, s, false);
            }
            Op::Stale { pick } => {
                let mut m = lock(&self.model);
                let ends = m.ends_where(|m, l, s| {
                    let e = &m.links[l].ends[s];
                    e.known() && (e.close_called || e.report.is_some())
                });
                if ends.is_empty() {
                    return;
                }
                let (l, s) = ends[usize::from(pick) % ends.len()];
                let b = m.backend_of(l, s);
                let h = m.links[l].ends[s].handle.expect("known");
                m.stats.stale_checks += 1;
                let msg = message(u64::MAX >> 8, HEAD);
                let mut wrong = Vec::new();
                match b.send_data_copy(h, &[&msg], &[], 1) {
                    Err(SendError::UnknownConnection(x)) if x == h => {}
                    other => wrong.push(format!("send_data_copy: {other:?}")),
                }
                match b.get_buffer(h) {
                    Err(BufferError::UnknownConnection(x)) if x == h => {}
                    other => wrong.push(format!("get_buffer: {:?}", other.map(|b| b.is_some()))),
                }
                match b.pause_receive(h) {
                    Err(ConnError::UnknownConnection(x)) if x == h => {}
                    other => wrong.push(format!("pause_receive: {other:?}")),
                }
                match b.close_active_endpoint(h) {
                    Err(CloseError::UnknownConnection(x)) if x == h => {}
                    other => wrong.push(format!("close_active_endpoint: {other:?}")),
                }
                if !wrong.is_empty() {
                    let who = m.who(l, s);
                    m.err(
                        "stale-handle",
                        format!(
                            "{who}, closed, answered {} instead of UnknownConnection",
                            wrong.join(", ")
                        ),
                    );
                }
            }
            Op::PauseReceive { pick } | Op::ResumeReceive { pick } => {
                let pause = matches!(op, Op::PauseReceive { .. });
                let mut m = lock(&self.model);
                let ends = m.ends_where(|m, l, s| {
                    let e = &m.links[l].ends[s];
                    let live =
                        m.end_alive(l, s) && e.established && !e.close_called && e.report.is_none();
                    live && if pause {
                        !e.app_closed && !e.rx_paused
                    } else {
                        e.rx_paused
                    }
                });
                if ends.is_empty() {
                    return;
                }
                let (l, s) = ends[usize::from(pick) % ends.len()];
                let b = m.backend_of(l, s);
                let h = m.links[l].ends[s].handle.expect("known");
                let r = if pause {
                    b.pause_receive(h)
                } else {
                    b.resume_receive(h)
                };
                match r {
                    Ok(()) => {
                        let e = &mut m.links[l].ends[s];
                        e.rx_paused = pause;
                        e.rx_paused_ever |= pause;
                    }
                    Err(e) => {
                        if m.strict && !m.nodes[m.links[l].ends[s].node].unsynced {
                            let who = m.who(l, s);
                            m.err("op", format!("pause/resume of {who}, open, failed: {e}"));
                        }
                    }
                }
            }
            Op::CloseListener { node, listener } => {
                let (node, which) = (n(node), usize::from(listener) % 2);
                let mut m = lock(&self.model);
                let addr = EndpointAddress::new(self.ips[node], LISTEN_PORTS[which]);
                let open = m.nodes[node].alive() && m.nodes[node].listeners[which];
                match m.nodes[node].backend().close_listen_endpoint(addr) {
                    Ok(()) => {
                        if !open {
                            m.err(
                                "op",
                                format!("closing listener {addr}, closed or crashed, worked"),
                            );
                        }
                        m.nodes[node].listeners[which] = false;
                        let unsynced = m.nodes[node].unsynced;
                        let inc = m.nodes[node].inc();
                        for l in 0..m.links.len() {
                            let link = &m.links[l];
                            if link.to != node || link.listener != which {
                                continue;
                            }
                            let e = &link.ends[1];
                            if e.known() && e.inc != inc {
                                continue; // a connection of an earlier life
                            }
                            m.links[l].may_hear_peer_closed[0] = true;
                            let e = &mut m.links[l].ends[1];
                            // (With its loop paused the connection may have
                            // ended already, its report and data pending;
                            // then the listener's close does not touch it.)
                            if e.known() && e.report.is_none() && !unsynced {
                                e.app_closed = true;
                            }
                            // A paused loop may hold this connection's
                            // establishment and data: they are dropped.
                            e.lossy |= unsynced;
                            m.ended_by_op(l, 1, Outcome::Closed(CloseReason::ListenerClosed), None);
                        }
                    }
                    Err(e) => {
                        let expected =
                            matches!(e, CloseError::UnknownListenEndpoint(a) if a == addr);
                        if open || !expected {
                            m.err(
                                "op",
                                format!("closing listener {addr} (open: {open}) failed: {e}"),
                            );
                        }
                    }
                }
            }
            Op::ReopenListener { node, listener } => {
                let (node, which) = (n(node), usize::from(listener) % 2);
                let mut m = lock(&self.model);
                let addr = EndpointAddress::new(self.ips[node], LISTEN_PORTS[which]);
                let (alive, open) = (m.nodes[node].alive(), m.nodes[node].listeners[which]);
                let params = listener_params(which, &m.nodes[node].region);
                match m.nodes[node].backend().open_listen_endpoint(addr, params) {
                    Ok(_) => {
                        if !alive || open {
                            m.err(
                                "op",
                                format!("listening on {addr} (alive {alive}, open {open}) worked"),
                            );
                        }
                        m.nodes[node].listeners[which] = true;
                    }
                    Err(e) => {
                        let exists = matches!(e, OpenListenError::ListenEndpointAlreadyExists(a) if a == addr);
                        if alive && (!open || !exists) {
                            m.err(
                                "op",
                                format!("listening on {addr} (open {open}) failed: {e}"),
                            );
                        }
                    }
                }
            }
            Op::PauseLoop { node } => {
                let node = n(node);
                self.sim.pause_loop(self.ips[node]);
                let mut m = lock(&self.model);
                m.nodes[node].loop_paused = true;
                m.nodes[node].unsynced = true;
            }
            Op::ResumeLoop { node } => {
                let node = n(node);
                self.sim.resume_loop(self.ips[node]);
                // Still unsynced until the world runs the held callbacks.
                lock(&self.model).nodes[node].loop_paused = false;
            }
            Op::Hold { a, b } | Op::Release { a, b } => {
                let (a, b) = pair_of(a, b);
                let mut m = lock(&self.model);
                if matches!(op, Op::Hold { .. }) {
                    self.sim.hold(self.ips[a], self.ips[b]);
                    m.holds.insert(pair(a, b));
                } else {
                    self.sim.release(self.ips[a], self.ips[b]);
                    m.holds.remove(&pair(a, b));
                }
            }
            Op::Partition { a, b } => {
                let (a, b) = pair_of(a, b);
                self.sim.partition(self.ips[a], self.ips[b]);
                let mut m = lock(&self.model);
                m.partitions.insert(pair(a, b));
                for link in &mut m.links {
                    if pair(link.from, link.to) == pair(a, b) {
                        link.cut = true;
                    }
                }
            }
            Op::Heal { a, b } => {
                let (a, b) = pair_of(a, b);
                self.sim.heal(self.ips[a], self.ips[b]);
                lock(&self.model).partitions.remove(&pair(a, b));
            }
            Op::Reset { a, b } => {
                let (a, b) = (n(a), n(b));
                self.sim.reset_connections(self.ips[a], self.ips[b]);
                let mut m = lock(&self.model);
                for l in 0..m.links.len() {
                    if pair(m.links[l].from, m.links[l].to) != pair(a, b) {
                        continue;
                    }
                    for s in 0..2 {
                        m.ended_by_op(
                            l,
                            s,
                            Outcome::Closed(CloseReason::Reset),
                            Some(Outcome::Refused(RefuseReason::Refused)),
                        );
                    }
                }
            }
            Op::Refuse { node, on } => self.sim.refuse_connections(self.ips[n(node)], on),
            Op::SetLink {
                a,
                b,
                latency_us,
                bandwidth,
                jitter_us,
            } => {
                let (a, b) = pair_of(a, b);
                let link = LinkConfig {
                    latency: Duration::from_micros(u64::from(latency_us)),
                    bandwidth_bytes_per_sec: bandwidth,
                    jitter: Duration::from_micros(u64::from(jitter_us)),
                };
                self.sim.set_link(self.ips[a], self.ips[b], link);
            }
            Op::SetNic {
                node,
                send,
                receive,
            } => self.sim.set_nic(
                self.ips[n(node)],
                NicConfig {
                    send_bytes_per_sec: send,
                    receive_bytes_per_sec: receive,
                },
            ),
            Op::TcpWindow { bytes } => self.sim.set_tcp_window(bytes as usize),
            Op::Slow { node, micros } => self
                .sim
                .slow_receiver(self.ips[n(node)], Duration::from_micros(u64::from(micros))),
            Op::Crash { node } | Op::CrashSilently { node } => {
                let node = n(node);
                let silent = matches!(op, Op::CrashSilently { .. });
                lock(&self.model).crashed(node, if silent { Death::Silent } else { Death::Reset });
                if silent {
                    self.sim.crash_silently(self.ips[node]);
                } else {
                    self.sim.crash(self.ips[node]);
                }
            }
            Op::Restart { node } => {
                let node = n(node);
                lock(&self.model).restarting(node);
                // The hook (start_node) makes the new life's application.
                self.sim.restart(self.ips[node]);
            }
        }
    }

    /// Lifts every fault and lets the world settle; checks that closes
    /// were heard and that open connections delivered everything.
    fn settle(&self) {
        for (i, &ip) in self.ips.iter().enumerate() {
            self.sim.resume_loop(ip);
            self.sim.refuse_connections(ip, false);
            self.sim.slow_receiver(ip, Duration::ZERO);
            lock(&self.model).nodes[i].loop_paused = false;
            for &other in &self.ips[i + 1..] {
                self.sim.heal(ip, other);
                self.sim.release(ip, other);
            }
        }
        {
            let mut m = lock(&self.model);
            m.partitions.clear();
            m.holds.clear();
        }
        self.run_for(Duration::from_millis(1));
        {
            let mut m = lock(&self.model);
            let paused = m.ends_where(|m, l, s| m.links[l].ends[s].rx_paused && m.end_alive(l, s));
            for (l, s) in paused {
                let b = m.backend_of(l, s);
                let h = m.links[l].ends[s].handle.expect("known");
                if b.resume_receive(h).is_ok() {
                    m.links[l].ends[s].rx_paused = false;
                }
            }
        }
        self.run_for(SETTLE);
        let mut m = lock(&self.model);
        if !m.strict {
            return;
        }
        for l in 0..m.links.len() {
            for s in 0..2 {
                let open = |m: &Model, s: usize| {
                    let e = &m.links[l].ends[s];
                    m.end_alive(l, s)
                        && e.established
                        && !e.app_closed
                        && e.cause.is_none()
                        && e.report.is_none()
                };
                if !open(&m, s) {
                    continue;
                }
                let timeout = m.nodes[m.links[l].ends[s].node]
                    .cfg
                    .peer_timeout_ms
                    .is_some();
                let e = &m.links[l].ends[s];
                let p = &m.links[l].ends[1 - s];
                let peer_dead = p.known() && m.nodes[p.node].deaths[p.inc].is_some();
                let told = if !p.known() {
                    // An acceptor that never reported the connection was
                    // dropped: its initiator hears of it, unless the
                    // acceptor's host went silent.
                    s == 0 && (!e.peer_maybe_silent || timeout)
                } else if p.vanished
                    && m.nodes[p.node].deaths[p.inc] == Some(Death::Silent)
                    && !e.peer_reset
                    && !timeout
                {
                    // Its host went silent before the peer's report: what
                    // it had sent may be lost, its close with it.
                    false
                } else {
                    p.report.is_some()
                        || p.app_closed
                        || p.cause.is_some()
                        || e.peer_reset
                        || (e.peer_silent && timeout)
                };
                if told {
                    let (who, peer) = (m.who(l, s), m.who(l, 1 - s));
                    let p = &m.links[l].ends[1 - s];
                    let what = format!(
                        "report {:?}, close call {}, cause {:?}, crashed {} (reset {}, silent {})",
                        p.report.as_ref().map(ToString::to_string),
                        p.close_called,
                        p.cause,
                        peer_dead,
                        e.peer_reset,
                        e.peer_silent
                    );
                    m.err(
                        "close-reported",
                        format!("{who} is still open after every fault was lifted, though its peer ended ({peer}: {what})"),
                    );
                } else if p.known() && open(&m, 1 - s) {
                    let stuck: Vec<String> = e
                        .sent
                        .iter()
                        .filter_map(|id| {
                            let r = &m.msgs[id];
                            (r.completed != 1 || r.delivered != 1).then(|| {
                                format!(
                                    "{id} (completed {}×, delivered {}×)",
                                    r.completed, r.delivered
                                )
                            })
                        })
                        .collect();
                    if !stuck.is_empty() {
                        let who = m.who(l, s);
                        m.err(
                            "liveness",
                            format!(
                                "{who}: open at both ends with every fault lifted, yet sends {} are not completed and delivered",
                                stuck.join(", ")
                            ),
                        );
                    }
                }
            }
        }
    }

    /// Closes every end still open (initiators first, so their peers hear
    /// an orderly close), runs, and checks the final state.
    fn close_all_and_check(&self) {
        for side in [0, 1] {
            {
                let mut m = lock(&self.model);
                let ends = m.ends_where(|m, l, s| {
                    let e = &m.links[l].ends[s];
                    s == side && m.end_alive(l, s) && !e.close_called && e.report.is_none()
                });
                for (l, s) in ends {
                    let b = m.backend_of(l, s);
                    m.close(&b, l, s, false);
                }
            }
            self.run_for(SETTLE);
        }
        let live = self.sim.live_objects();
        let mut m = lock(&self.model);
        let listeners: usize = m
            .nodes
            .iter()
            .filter(|n| n.alive())
            .map(|n| n.listeners.iter().filter(|&&x| x).count())
            .sum();
        if m.strict && live != listeners {
            m.err(
                "leak",
                format!("with everything closed the world keeps {live} objects, but {listeners} listeners are open"),
            );
        }
        for l in 0..m.links.len() {
            for s in 0..2 {
                let e = &m.links[l].ends[s];
                if !m.end_alive(l, s) {
                    continue;
                }
                if e.report.is_none() {
                    let who = m.who(l, s);
                    m.err(
                        "close-reported",
                        format!("{who}: never reported closed or refused"),
                    );
                }
                let e = &m.links[l].ends[s];
                if !e.outstanding.is_empty() {
                    let (who, left) = (m.who(l, s), e.outstanding.clone());
                    m.err(
                        "exactly-once",
                        format!("{who}: sends {left:?} never completed nor cancelled"),
                    );
                }
                if s == 1
                    && m.links[l].ends[1].established
                    && m.end_alive(l, 0)
                    && !m.links[l].ends[0].established
                {
                    let who = m.who(l, 0);
                    m.err(
                        "handshake",
                        format!("{who}: never established, yet its acceptor was"),
                    );
                }
            }
        }
        let tcp = m.tcp;
        let ids: Vec<u64> = m.msgs.keys().copied().collect();
        for id in ids {
            let r = &m.msgs[&id];
            let (l, s) = (r.link, r.side);
            let sender_ok = m.end_alive(l, s);
            let rx = &m.links[l].ends[1 - s];
            let receiver_ok = m.end_alive(l, 1 - s);
            let profile = if tcp { "tcp-profile" } else { "rdma-profile" };
            let mut problems = Vec::new();
            if r.completed + r.cancelled > 1 {
                problems.push(("exactly-once", "ended more than once"));
            }
            if sender_ok && r.completed + r.cancelled == 0 {
                problems.push(("exactly-once", "never ended"));
            }
            if r.delivered > 1 {
                problems.push(("exactly-once", "delivered more than once"));
            }
            if r.delivered > 0 && r.cancelled > 0 {
                problems.push((profile, "delivered and cancelled"));
            }
            if sender_ok && r.delivered > 0 && r.completed == 0 {
                problems.push((profile, "delivered, never completed"));
            }
            if m.strict && sender_ok && receiver_ok && r.completed > 0 && r.delivered == 0 {
                let rx_lossy = rx.lossy
                    || (rx.rx_paused_ever
                        && rx.report != Some(Outcome::Closed(CloseReason::PeerClosed)));
                let heard_orderly = rx.report == Some(Outcome::Closed(CloseReason::PeerClosed))
                    && rx.cause.is_none()
                    && rx.maybe.is_empty();
                if !tcp && !rx_lossy {
                    problems.push((profile, "completed (the receiver took it), never delivered"));
                }
                if tcp && heard_orderly {
                    problems.push((
                        profile,
                        "completed, then lost although its receiver heard an orderly close",
                    ));
                }
            }
            if m.strict && !tcp && sender_ok && r.oversize && r.completed > 0 {
                problems.push((profile, "oversize, completed"));
            }
            if !problems.is_empty() {
                let who = m.who(l, s);
                let detail = format!(
                    "completed {}×, cancelled {}×, delivered {}×, {} bytes, echo {}, close after {}; receiver {:?}",
                    r.completed,
                    r.cancelled,
                    r.delivered,
                    r.len,
                    r.echo,
                    r.close_after,
                    rx.report.as_ref().map(ToString::to_string)
                );
                for (check, what) in problems {
                    m.err(check, format!("message {id} from {who}: {what} ({detail})"));
                }
            }
        }
    }

    /// Breaks the reference cycles (world → handler → model → backend →
    /// world, and the restart hooks) so the world is freed.
    fn finish(self) -> (Vec<String>, Stats) {
        let mut m = lock(&self.model);
        for n in &m.nodes {
            n.host.on_restart(|_| {});
        }
        // Backends and hosts hold the world; the world holds the handlers,
        // which hold the model.
        m.nodes.clear();
        m.sim = None;
        (std::mem::take(&mut m.errors), std::mem::take(&mut m.stats))
    }
}

// ---------------------------------------------------------------------------
// Running a case

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// Everything from the driver thread: deterministic, all checks.
    Deterministic,
    /// Another thread sends while the driver drives: conservation only.
    Threaded,
}

/// Runs one case; returns its errors (empty if it passed) and its stats,
/// and the world's trace if asked for.
fn execute(sc: &Scenario, flavor: Flavor, trace: bool) -> (Vec<String>, Stats, String) {
    let strict = flavor == Flavor::Deterministic;
    let case = Case::new(sc, strict, trace);
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    // The other thread makes a send attempt while `attempts < budget`; the
    // driver grants a few per operation, before applying it, so that they
    // land while it drives the world too.
    let attempts = Arc::new(AtomicU64::new(0));
    let budget = Arc::new(AtomicU64::new(0));
    let sender = (flavor == Flavor::Threaded).then(|| {
        let (model, stop) = (case.model.clone(), stop.0.clone());
        let (attempts, budget) = (attempts.clone(), budget.clone());
        let mut g = Rng::new(sc.seed ^ 0x7EAD);
        std::thread::spawn(move || {
            let mut accepted = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if attempts.load(Ordering::Relaxed) >= budget.load(Ordering::Relaxed) {
                    std::thread::yield_now();
                    continue;
                }
                {
                    let mut m = lock(&model);
                    let ends = m.usable();
                    if !ends.is_empty() {
                        let (l, s) = ends[g.below(ends.len() as u64) as usize];
                        let b = m.backend_of(l, s);
                        let mode = g.pick(&[
                            Mode::Buffered,
                            Mode::Copy,
                            Mode::ZeroCopy,
                            Mode::CopyBatch(3),
                        ]);
                        let before = m.stats.accepted;
                        let len = g.range(HEAD as u64, 80) as usize;
                        m.send(&b, l, s, mode, len, 3, false, false);
                        accepted += m.stats.accepted - before;
                    }
                }
                attempts.fetch_add(1, Ordering::Relaxed);
                std::thread::yield_now();
            }
            accepted
        })
    });
    for op in &sc.ops {
        let granted = budget.fetch_add(3, Ordering::Relaxed) + 3;
        case.apply(op);
        if sender.is_some() {
            let deadline = Instant::now() + Duration::from_millis(20);
            while attempts.load(Ordering::Relaxed) < granted && Instant::now() < deadline {
                std::thread::yield_now();
            }
        }
    }
    drop(stop);
    let mut extra = Vec::new();
    if let Some(t) = sender {
        match t.join() {
            Ok(n) => {
                lock(&case.model).stats.other_thread += n;
                if n > 0 && case.sim.reproducible() {
                    extra.push(format!(
                        "[threads] the other thread's {n} sends went unnoticed: Sim::reproducible is still true"
                    ));
                }
            }
            Err(_) => extra.push("[threads] the sending thread panicked".to_owned()),
        }
    }
    case.settle();
    case.close_all_and_check();
    let text = if trace {
        case.sim.trace()
    } else {
        String::new()
    };
    let (mut errors, mut stats) = case.finish();
    errors.extend(extra);
    stats.cases = 1;
    stats.ops = sc.ops.len() as u64;
    (errors, stats, text)
}

/// Tells the sending thread to stop, also when the driver panics.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

thread_local! {
    /// Set while shrinking: panics of candidate cases are expected.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    /// The property run on this thread (see [`run_property`]).
    static RUN: RefCell<Option<PropRun>> = const { RefCell::new(None) };
}

/// Silences the panics of candidate cases while shrinking, and
/// QuickCheck's own failure panic (its one-line witness): the failure
/// report of [`run_property`] says it all.
fn quiet_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let prev = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let quickcheck = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("[quickcheck]"));
            if !QUIET.with(Cell::get) && !quickcheck {
                prev(info);
            }
        }));
    });
}

/// Runs a case, turning a panic (of the simulator or of the model) into
/// an error.
fn check(sc: &Scenario, flavor: Flavor) -> (Vec<String>, Stats) {
    match panic::catch_unwind(AssertUnwindSafe(|| execute(sc, flavor, false))) {
        Ok((errors, stats, _)) => (errors, stats),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            (vec![format!("[panic] {msg}")], Stats::default())
        }
    }
}

/// Shrinking candidates of an operation list, biggest cuts first: the
/// list without each chunk of half its length, of a quarter, … of one
/// operation; then with one operation made simpler ([`Op::simpler`]).
/// QuickCheck tries them in order and restarts from the first that still
/// fails, so the last failing case it finds has no failing candidate left.
fn candidates(ops: Vec<Op>) -> impl Iterator<Item = Vec<Op>> {
    let ops = Rc::new(ops);
    let n = ops.len();
    let sizes = std::iter::successors((n > 0).then_some((n / 2).max(1)), |&c| {
        (c > 1).then_some(c / 2)
    });
    let cuts = {
        let ops = ops.clone();
        sizes.flat_map(move |c| {
            let ops = ops.clone();
            (0..n).step_by(c).map(move |i| {
                let mut v = ops.to_vec();
                v.drain(i..(i + c).min(n));
                v
            })
        })
    };
    let simpler = (0..n).flat_map(move |i| {
        let ops = ops.clone();
        let variants = ops[i].simpler();
        variants.into_iter().map(move |op| {
            let mut v = ops.to_vec();
            v[i] = op;
            v
        })
    });
    cuts.chain(simpler)
}

/// What QuickCheck generates: case `index` of the seed being run, made
/// from the next seed of that seed's splitmix64 stream (case 0 from the
/// seed itself). quickcheck 1.x cannot seed its `Gen`, so its randomness
/// is not used, only its size (the most random operations in a case).
#[derive(Clone, Debug)]
struct Input {
    index: usize,
    sc: Scenario,
}

/// The state of a property run (one seed) on this thread.
struct PropRun {
    master: u64,
    stream: Rng,
    next_index: usize,
    flavor: Flavor,
    stats: Stats,
    /// The smallest failing case so far.
    failure: Option<Failure>,
    shrink_deadline: Option<Instant>,
    shrink_runs: usize,
}

struct Failure {
    index: usize,
    seed: u64,
    first_len: usize,
    min: Scenario,
    errors: Vec<String>,
}

fn with_run<R>(f: impl FnOnce(&mut PropRun) -> R) -> R {
    RUN.with(|r| f(r.borrow_mut().as_mut().expect("called by run_property")))
}

impl Arbitrary for Input {
    fn arbitrary(g: &mut Gen) -> Self {
        with_run(|r| {
            let index = r.next_index;
            r.next_index += 1;
            let seed = if index == 0 {
                r.master
            } else {
                r.stream.next()
            };
            let sc = Scenario::generate(seed, r.flavor == Flavor::Threaded, g.size());
            Input { index, sc }
        })
    }

    /// Threaded runs do not replay, so they are not shrunk.
    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let deadline = with_run(|r| {
            (r.flavor == Flavor::Deterministic)
                .then_some(r.shrink_deadline)
                .flatten()
        });
        let Some(deadline) = deadline else {
            return Box::new(std::iter::empty());
        };
        let (index, sc) = (self.index, self.sc.clone());
        Box::new(
            candidates(self.sc.ops.clone())
                .take_while(move |_| Instant::now() < deadline)
                .map(move |ops| Input {
                    index,
                    sc: Scenario { ops, ..sc.clone() },
                }),
        )
    }
}

/// The property QuickCheck checks: the case passes every check. Notes the
/// smallest failure for the report.
fn property(input: Input) -> TestResult {
    let (flavor, shrinking) = with_run(|r| (r.flavor, r.failure.is_some()));
    QUIET.with(|q| q.set(shrinking));
    let (errors, stats) = check(&input.sc, flavor);
    QUIET.with(|q| q.set(false));
    with_run(|r| {
        if shrinking {
            r.shrink_runs += 1;
        } else {
            r.stats.add(&stats);
        }
        if errors.is_empty() {
            return;
        }
        let first_len = match &r.failure {
            Some(f) => f.first_len,
            None => {
                eprintln!(
                    "case {} of seed {:#x} (seed {:#x}, {} operations) failed: {}{}",
                    input.index,
                    r.master,
                    input.sc.seed,
                    input.sc.ops.len(),
                    errors[0],
                    if flavor == Flavor::Deterministic {
                        "; shrinking…"
                    } else {
                        ""
                    }
                );
                r.shrink_deadline = Some(Instant::now() + SHRINK_BUDGET);
                input.sc.ops.len()
            }
        };
        r.failure = Some(Failure {
            index: input.index,
            seed: input.sc.seed,
            first_len,
            min: input.sc.clone(),
            errors: errors.clone(),
        });
    });
    if errors.is_empty() {
        TestResult::passed()
    } else {
        TestResult::error(errors.join("\n"))
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let t = v.trim().replace('_', "");
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a u64 (decimal or 0x hex)")))
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// The seeds to run: `NETIO_PROP_SEED`, or the fixed ones plus a random
/// one (printed before it runs).
fn seeds(test: &str) -> Vec<u64> {
    match env_u64("NETIO_PROP_SEED") {
        Some(s) => vec![s],
        None => {
            let r = random_seed();
            eprintln!(
                "{test}: seeds {FIXED_SEEDS:#x?} and the random seed {r:#x}; replay with \
                 NETIO_PROP_SEED={r:#x} cargo test -p netio-sim --test conservation -- {test}"
            );
            let mut s = FIXED_SEEDS.to_vec();
            s.push(r);
            s
        }
    }
}

/// Runs `cases` cases of each seed with QuickCheck; on a failure
/// (shrunk by QuickCheck through [`Input::shrink`] for deterministic runs)
/// prints everything needed to replay it, and panics.
fn run_property(test: &str, flavor: Flavor, default_cases: usize) -> Stats {
    quiet_panics();
    let cases = env_u64("NETIO_PROP_CASES").map_or(default_cases as u64, |n| n);
    let mut total = Stats::default();
    for master in seeds(test) {
        RUN.with(|r| {
            *r.borrow_mut() = Some(PropRun {
                master,
                stream: Rng::new(master),
                next_index: 0,
                flavor,
                stats: Stats::default(),
                failure: None,
                shrink_deadline: None,
                shrink_runs: 0,
            })
        });
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
            QuickCheck::new()
                .rng(Gen::new(MAX_OPS))
                .tests(cases)
                .max_tests(cases)
                .quickcheck(property as fn(Input) -> TestResult)
        }));
        let run = RUN.with(|r| r.borrow_mut().take()).expect("set above");
        total.add(&run.stats);
        let Some(f) = run.failure else {
            if let Err(p) = outcome {
                panic::resume_unwind(p);
            }
            continue;
        };
        let (min, seed) = (&f.min, f.seed);
        let mut report = String::new();
        let _ = writeln!(
            report,
            "{test}: case {} of seed {master:#x} failed: seed {seed:#x}, profile {}, {} of {} operations after {} shrinking runs",
            f.index,
            if min.tcp { "TCP" } else { "RDMA" },
            min.ops.len(),
            f.first_len,
            run.shrink_runs
        );
        for (n, cfg) in min.nodes.iter().enumerate() {
            let _ = writeln!(report, "  node {n}: {cfg:?}");
        }
        let _ = writeln!(report, "operations:");
        for (k, op) in min.ops.iter().enumerate() {
            let _ = writeln!(report, "  {k:3}: {op:?}");
        }
        let _ = writeln!(report, "errors:");
        for e in f.errors.iter().take(12) {
            let _ = writeln!(report, "  {e}");
        }
        if flavor == Flavor::Deterministic {
            let traced = panic::catch_unwind(AssertUnwindSafe(|| execute(min, flavor, true)));
            let trace = traced.map(|t| t.2).unwrap_or_default();
            let path = std::env::temp_dir().join(format!("netio-sim-conservation-{seed:x}.trace"));
            if std::fs::write(&path, trace).is_ok() {
                let _ = writeln!(report, "trace of the minimal case: {}", path.display());
            }
        } else {
            let _ = writeln!(
                report,
                "(another thread sends: the run depends on thread timing and may not replay exactly)"
            );
        }
        let _ = writeln!(
            report,
            "replay: NETIO_PROP_SEED={seed:#x} NETIO_PROP_CASES=1 cargo test -p netio-sim --test conservation -- {test}"
        );
        eprintln!("{report}");
        panic!("{report}");
    }
    total
}

fn print_stats(test: &str, s: &Stats) {
    eprintln!(
        "{test}: {} cases, {} operations: {} sends accepted ({} zero-copy, {} batches, {} echoes, {} oversize), \
         {} delivered, {} completed, {} cancelled, {} established, closes {:?}, refusals {:?}, \
         {} closes from callbacks, {} stale-handle checks, {} restarts, {} sends from another thread",
        s.cases,
        s.ops,
        s.accepted,
        s.zero_copy,
        s.batches,
        s.echoes,
        s.oversize,
        s.delivered,
        s.completed,
        s.cancelled,
        s.established,
        s.closes,
        s.refusals,
        s.callback_closes,
        s.stale_checks,
        s.restarts,
        s.other_thread
    );
}

#[test]
fn random_operations_and_faults_conserve_messages() {
    let test = "random_operations_and_faults_conserve_messages";
    let s = run_property(test, Flavor::Deterministic, DEFAULT_CASES);
    print_stats(test, &s);
    if std::env::var_os("NETIO_PROP_SEED").is_none()
        && std::env::var_os("NETIO_PROP_CASES").is_none()
    {
        // The default run must exercise what it claims to check.
        let closes = |k: &str| s.closes.get(k).copied().unwrap_or(0);
        let refusals = |k: &str| s.refusals.get(k).copied().unwrap_or(0);
        for (what, n) in [
            ("deliveries", s.delivered),
            ("cancellations", s.cancelled),
            ("zero-copy sends", s.zero_copy),
            ("batches", s.batches),
            ("echoes", s.echoes),
            ("closes from callbacks", s.callback_closes),
            ("stale-handle checks", s.stale_checks),
            ("restarts", s.restarts),
            ("Local closes", closes("Local")),
            ("PeerClosed closes", closes("PeerClosed")),
            ("Reset closes", closes("Reset")),
            ("ListenerClosed closes", closes("ListenerClosed")),
            ("TimedOut closes", closes("TimedOut")),
            ("MessageTooLarge closes", closes("MessageTooLarge")),
            ("Refused refusals", refusals("Refused")),
            ("Cancelled refusals", refusals("Cancelled")),
        ] {
            assert!(
                n > 0,
                "{test}: the default run saw no {what}; the generator needs a look"
            );
        }
    }
}

#[test]
fn sends_from_another_thread_conserve_messages() {
    let test = "sends_from_another_thread_conserve_messages";
    let s = run_property(test, Flavor::Threaded, DEFAULT_THREAD_CASES);
    print_stats(test, &s);
}

/// A stand-in case for the shrinking test: QuickCheck generates the
/// given operations and shrinks them with [`candidates`].
#[derive(Clone, Debug)]
struct Planted(Vec<Op>);

impl Arbitrary for Planted {
    fn arbitrary(_: &mut Gen) -> Self {
        let mut ops = Scenario::generate(7, false, MAX_OPS).ops;
        ops.insert(ops.len() / 3, Op::Crash { node: 1 });
        ops.push(Op::Restart { node: 1 });
        Planted(ops)
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        Box::new(candidates(self.0.clone()).map(Planted))
    }
}

#[test]
fn generation_follows_the_seed_and_shrinking_finds_a_minimal_case() {
    let a = Scenario::generate(42, false, MAX_OPS);
    let b = Scenario::generate(42, false, MAX_OPS);
    assert_eq!((&a.ops, &a.nodes, a.tcp), (&b.ops, &b.nodes, b.tcp));
    assert_ne!(Scenario::generate(43, false, MAX_OPS).ops, a.ops);
    // A planted property: it fails when node 1 crashes and later restarts.
    fn no_restart_after_a_crash(p: Planted) -> bool {
        let crash = p.0.iter().position(|o| *o == Op::Crash { node: 1 });
        !crash.is_some_and(|c| p.0[c..].contains(&Op::Restart { node: 1 }))
    }
    quiet_panics();
    let failed = panic::catch_unwind(|| {
        QuickCheck::new()
            .rng(Gen::new(MAX_OPS))
            .tests(1)
            .quickcheck(no_restart_after_a_crash as fn(Planted) -> bool)
    });
    let msg = failed.expect_err("the planted property fails");
    let msg = msg.downcast_ref::<String>().expect("a message");
    assert!(
        msg.contains("Planted([Crash { node: 1 }, Restart { node: 1 }])"),
        "not shrunk to the two operations: {msg}"
    );
    // A small case of real operations passes.
    let sc = Scenario {
        ops: vec![
            Op::Connect {
                from: 0,
                to: 1,
                listener: 1,
                shared_recv: true,
            },
            Op::Run { micros: 100 },
            Op::Send {
                pick: 0,
                mode: Mode::ZeroCopy,
                len: 40,
                header: 5,
                echo: true,
                close_after: false,
            },
            Op::Run { micros: 100 },
        ],
        ..a
    };
    let (errors, stats) = check(&sc, Flavor::Deterministic);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(stats.delivered >= 2, "{stats:?}");
}
