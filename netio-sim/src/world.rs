//! The world: hosts, backends, connections, links and the event queue, all
//! behind one lock, with no user code ever called from here.
//!
//! Calling order (the sans-IO shape): a backend call or a fault locks the
//! world, changes state and schedules events; [`World::pop`] hands the
//! driver the next event, [`World::process`] applies it and queues the
//! handler callbacks it causes in [`Sched::calls`]; the driver takes those,
//! unlocks, and dispatches them (see `Sim::step`).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::fmt::{self, Write as _};
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{
    BackendConfig, BufferError, BufferPool, Capabilities, CloseError, CloseReason, ConnError,
    ConnId, ConnTable, ConnectionParams, EndpointAddress, Handler, Lent, MemoryRegion, MemoryUsage,
    NetworkBuffer, NetworkMode, OpenActiveError, OpenListenError, RefuseReason, RegionSlice,
    SendError, ThreadSafety, TimerQueue, MAX_HEADER_LEN,
};

use netio_core::fast_map::FastMap;

use crate::backend::SimBackend;
use crate::rng::Rng;
use crate::{LinkConfig, NicConfig};

/// Index of a backend in [`World::backends`].
pub(crate) type BackendId = usize;
/// A connection in the world (both sides); applications see per-backend
/// [`ConnId`] handles instead.
type WireId = u64;
type ListenerId = u64;
pub(crate) type PoolId = u64;

/// A backend's handler. The driver takes it out of the world for each call
/// (with the world unlocked) and puts it back after: one callback runs at a
/// time, so nothing else ever needs it meanwhile.
pub(crate) type HandlerBox = Box<dyn Handler<SimBackend>>;
/// A signal or timer callback.
pub(crate) type UserFn = Arc<Mutex<Box<dyn FnMut() + Send>>>;
/// A closure given to `EventLoop::post`.
pub(crate) type PostFn = Box<dyn FnOnce() + Send>;

/// What a crash or a restart took from a host: its backends' handlers, the
/// callbacks its paused loop held back, its loop's timers and signals. The
/// caller drops them after unlocking the world, since dropping a handler
/// may call back into it (an async handler drops its tasks, and they their
/// connections).
#[must_use]
#[derive(Default)]
pub(crate) struct Remains {
    handlers: Vec<HandlerBox>,
    calls: Vec<Call>,
    callbacks: Vec<UserFn>,
    /// Events still scheduled ([`World::shut_down`]): posted closures.
    queue: Queue,
}

/// First port handed out for listen port 0 and for the local side of
/// outgoing connections (the IANA dynamic range).
const EPHEMERAL_FIRST: u16 = 49152;
const EPHEMERAL_COUNT: u64 = 65536 - EPHEMERAL_FIRST as u64;

/// Nanoseconds `len` bytes take at `bw` bytes per second (0: unlimited),
/// rounded up.
fn serialise_ns(len: usize, bw: u64) -> u64 {
    const NS: u64 = 1_000_000_000;
    match u64::try_from(len) {
        _ if bw == 0 => 0,
        // The usual case, in 64 bits.
        Ok(len) if len <= u64::MAX / NS => (len * NS).div_ceil(bw),
        _ => u64::try_from((len as u128 * u128::from(NS)).div_ceil(u128::from(bw)))
            .unwrap_or(u64::MAX),
    }
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------
// Scheduling

/// Something that happens at a virtual instant. Four words at most (the
/// rare large payloads are boxed), so that the event queue's heap moves
/// little.
pub(crate) enum Ev {
    /// A control packet reaches side `to` of a connection.
    Ctrl {
        conn: WireId,
        to: usize,
        pkt: Box<Ctrl>,
    },
    /// The initiator gives up connecting.
    ConnectTimeout { conn: WireId },
    /// A side that is `Closing` reports its end.
    Finish { conn: WireId, side: usize },
    /// Messages of pipe `dir` (from side `dir` to the other) may arrive.
    Deliver { conn: WireId, dir: usize },
    /// TCP profile: the sends of pipe `dir` accepted into the window are
    /// reported completed.
    Complete { conn: WireId, dir: usize },
    /// A slow receiver frees a receive buffer.
    Release {
        buf: Box<NetworkBuffer>,
        pool: PoolId,
    },
    /// A timer period elapsed.
    Timer { id: u64, gen: u64 },
    /// A signal was fired.
    Signal { id: u64 },
    /// A paused host's loop resumes: the callbacks held for it run.
    Resume { host: IpAddr },
    /// Handler timers of backend `b` may be due.
    HandlerTimer { b: BackendId },
    /// The oldest pending `wake` of backend `b` is reported.
    Wake { b: BackendId },
    /// A closure posted to a host's loop runs (unless the host restarted
    /// since the post).
    Post(Box<Posted>),
    /// Side `side`, whose receiving was resumed, gets what it held back.
    Unhold { conn: WireId, side: usize },
    /// Side `side` reports the orderly close its peer made while it was
    /// paused, if it is still not paused.
    DeferredClose { conn: WireId, side: usize },
    /// Side `side` times out if its peer has been unreachable since `since`.
    PeerTimeout {
        conn: WireId,
        side: usize,
        since: u64,
    },
}

/// A closure posted to `host`'s loop when its incarnation was `inc`.
pub(crate) struct Posted {
    host: IpAddr,
    inc: u64,
    f: PostFn,
}

/// Connection management packets. Opening is TCP's three-way handshake:
/// the initiator is established when the `SynAck` arrives, the acceptor
/// when the `Ack` does.
pub(crate) enum Ctrl {
    Syn,
    SynAck,
    Ack,
    Refuse(RefuseReason),
    Close(CloseReason),
}

struct Entry {
    at: u64,
    tie: u64,
    seq: u64,
    ev: Ev,
}

impl Entry {
    fn key(&self) -> (u64, u64, u64) {
        (self.at, self.tie, self.seq)
    }
}
impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.key() == o.key()
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    /// Reversed, so the `BinaryHeap` pops the earliest event first.
    fn cmp(&self, o: &Self) -> Ordering {
        o.key().cmp(&self.key())
    }
}

/// The scheduled events, taken earliest first (by time, then tie, then
/// sequence number: a total order, so the order of taking does not depend
/// on how they are kept). A world usually has a handful scheduled: they
/// are then kept in a vector sorted latest first, where taking the next is
/// taking the last and an event at the current instant goes at the end;
/// past [`Queue::LARGE`] events they move to a binary heap, and back into
/// a vector below [`Queue::SMALL`].
enum Queue {
    Sorted(Vec<Entry>),
    Heap(BinaryHeap<Entry>),
}

impl Default for Queue {
    fn default() -> Self {
        Self::Sorted(Vec::new())
    }
}

impl Queue {
    /// Events from which the sorted vector becomes a heap.
    const LARGE: usize = 64;
    /// Events below which the heap becomes a sorted vector again.
    const SMALL: usize = 16;

    #[inline(always)]
    fn push(&mut self, e: Entry) {
        match self {
            Self::Sorted(v) => {
                if v.len() >= Self::LARGE {
                    let mut heap = BinaryHeap::from(std::mem::take(v));
                    heap.push(e);
                    *self = Self::Heap(heap);
                    return;
                }
                let k = e.key();
                // After every later event: usually at or near the end.
                match v.last() {
                    Some(last) if last.key() < k => {
                        let i = v.iter().rposition(|o| o.key() > k).map_or(0, |i| i + 1);
                        v.insert(i, e);
                    }
                    _ => v.push(e),
                }
            }
            Self::Heap(h) => h.push(e),
        }
    }

    #[inline]
    fn pop(&mut self) -> Option<Entry> {
        match self {
            Self::Sorted(v) => v.pop(),
            Self::Heap(h) => {
                let e = h.pop();
                if h.len() < Self::SMALL {
                    // Ascending in the heap's order, which is reversed:
                    // earliest last.
                    *self = Self::Sorted(std::mem::take(h).into_sorted_vec());
                }
                e
            }
        }
    }

    /// [`pop`](Self::pop) for a queue known not to be empty: the record
    /// comes back whole, not inside an `Option` whose tag shares the
    /// event's (which makes its copies go byte-shifted through the stack).
    #[inline]
    fn take_next(&mut self) -> Entry {
        match self {
            Self::Sorted(v) => {
                let last = v.len() - 1;
                v.swap_remove(last)
            }
            Self::Heap(_) => self.take_from_heap(),
        }
    }

    /// [`take_next`](Self::take_next) from the heap; out of line, so that
    /// the usual path has no `Option` to unpack.
    #[inline(never)]
    fn take_from_heap(&mut self) -> Entry {
        self.pop().expect("the queue is not empty")
    }

    fn peek_at(&self) -> Option<u64> {
        match self {
            Self::Sorted(v) => v.last().map(|e| e.at),
            Self::Heap(h) => h.peek().map(|e| e.at),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Sorted(v) => v.is_empty(),
            Self::Heap(h) => h.is_empty(),
        }
    }
}

/// A handler or loop callback the driver runs after unlocking the world.
pub(crate) enum Call {
    /// `ev` for the handler of `backend` (the one it has when the call
    /// runs), on the backend's host.
    Net {
        backend: BackendId,
        ev: NetEv,
    },
    Timer {
        host: IpAddr,
        id: u64,
        gen: u64,
        f: UserFn,
    },
    Signal {
        host: IpAddr,
        f: UserFn,
    },
    Post {
        host: IpAddr,
        f: PostFn,
    },
}

impl Call {
    /// The host whose loop runs this callback.
    fn host(&self, backends: &[BackendState]) -> IpAddr {
        match self {
            Self::Net { backend, .. } => backends[*backend].host,
            Self::Timer { host, .. } | Self::Signal { host, .. } | Self::Post { host, .. } => *host,
        }
    }
}

/// What the driver does with a handler call ([`World::due`]).
pub(crate) enum Due {
    /// Run it with this handler (the one its backend has now, taken out of
    /// the world until [`World::put_handler`]), on the loop of this host.
    Handler(HandlerBox, IpAddr),
    /// Drop it (a message's receive buffer is freed).
    Skip,
    /// A message for a paused side: keep it until the side resumes
    /// ([`World::hold`]).
    Hold,
}

/// The handler method to call.
pub(crate) enum NetEv {
    Established(ConnId, EndpointAddress, Capabilities),
    Refused(ConnId, EndpointAddress, RefuseReason),
    Closed(ConnId, EndpointAddress, CloseReason, Vec<u64>),
    Data(DataMsg),
    /// Sends of one connection completed together, in send order.
    Completed(ConnId, Keys),
    Timer(u64),
    Wake(u64),
}

/// The keys of one completion report: a single key inline (the usual
/// report of a stream of small sends), more in a list.
pub(crate) enum Keys {
    One(u64),
    List(Vec<u64>),
}

impl Keys {
    /// The keys, in send order.
    #[inline]
    pub(crate) fn as_slice(&self) -> &[u64] {
        match self {
            Self::One(k) => std::slice::from_ref(k),
            Self::List(v) => v,
        }
    }
}

/// A message in a receive buffer of pool `pool` until `on_data` returns
/// (and a slow receiver's delay has passed). It is delivered only while
/// side `side` of connection `wire` is open and receiving; while that side
/// is paused it is held back.
pub(crate) struct DataMsg {
    pub(crate) conn: ConnId,
    pub(crate) buf: NetworkBuffer,
    pub(crate) pool: PoolId,
    pub(crate) wire: WireId,
    pub(crate) side: usize,
}

/// Clock, random numbers, event queue, trace and pending callbacks.
pub(crate) struct Sched {
    pub(crate) now: u64,
    pub(crate) rng: Rng,
    seq: u64,
    queue: Queue,
    pub(crate) trace: Option<String>,
    pub(crate) calls: Vec<Call>,
    /// Empty key lists of earlier reports, for later ones.
    spare_keys: Vec<Vec<u64>>,
}

/// How many empty key lists [`Sched`] keeps for reuse.
const SPARE_KEY_LISTS: usize = 16;

impl Sched {
    #[inline]
    fn schedule(&mut self, at: u64, ev: Ev) {
        debug_assert!(at >= self.now);
        let tie = self.rng.next_u64();
        self.seq += 1;
        self.queue.push(Entry {
            at,
            tie,
            seq: self.seq,
            ev,
        });
    }

    /// Records a trace line, if recording. Inlined, so that the arguments
    /// are only put together when they are written.
    #[inline(always)]
    pub(crate) fn log(&mut self, host: IpAddr, args: fmt::Arguments<'_>) {
        if let Some(t) = &mut self.trace {
            Self::write_line(t, self.now, host, args);
        }
    }

    #[cold]
    #[inline(never)]
    fn write_line(t: &mut String, now: u64, host: IpAddr, args: fmt::Arguments<'_>) {
        let _ = writeln!(t, "{now} {host} {args}");
    }

    #[inline]
    fn emit(&mut self, backends: &[BackendState], b: BackendId, ev: NetEv) {
        debug_assert!(!matches!(ev, NetEv::Data(_)), "messages go to emit_data");
        self.emit_from(backends, b, ev, None);
    }

    /// Reports message `m`, from the sender at `from`, to backend `b`.
    #[inline]
    fn emit_data(
        &mut self,
        backends: &[BackendState],
        b: BackendId,
        m: DataMsg,
        from: &EndpointAddress,
    ) {
        self.emit_from(backends, b, NetEv::Data(m), Some(from));
    }

    /// Queues `ev` for backend `b`'s handler (a message with `from`, the
    /// address the trace names as its sender).
    #[inline]
    fn emit_from(
        &mut self,
        backends: &[BackendState],
        b: BackendId,
        ev: NetEv,
        from: Option<&EndpointAddress>,
    ) {
        if self.trace.is_some() {
            self.log_call(backends, b, &ev, from);
        }
        self.calls.push(Call::Net { backend: b, ev });
    }

    /// The trace line of a handler call.
    #[cold]
    #[inline(never)]
    fn log_call(
        &mut self,
        backends: &[BackendState],
        b: BackendId,
        ev: &NetEv,
        from: Option<&EndpointAddress>,
    ) {
        let text = match ev {
            NetEv::Established(id, r, c) => format!(
                "established {id} {r} caps={}{}{}{}",
                if c.receive { 'r' } else { '-' },
                if c.send_buffered { 'b' } else { '-' },
                if c.send_zero_copy { 'z' } else { '-' },
                if c.send_copy { 'c' } else { '-' },
            ),
            NetEv::Refused(id, r, why) => format!("refused {id} {r} ({why})"),
            NetEv::Closed(id, r, why, keys) => {
                format!("closed {id} {r} ({why}) cancelled={keys:?}")
            }
            NetEv::Data(m) => {
                format!(
                    "data {} from {} len={} fnv={:016x}",
                    m.conn,
                    from.expect("a message is reported with its sender"),
                    m.buf.len(),
                    fnv(m.buf.as_slice())
                )
            }
            NetEv::Completed(id, keys) => format!("completed {id} keys={:?}", keys.as_slice()),
            NetEv::Timer(t) => format!("on_timer {t}"),
            NetEv::Wake(t) => format!("on_wake {t}"),
        };
        self.log(backends[b].host, format_args!("b{b} {text}"));
    }

    /// An empty list for the keys of a report, reusing one of an earlier
    /// report if there is one.
    fn key_list(&mut self) -> Vec<u64> {
        let mut keys = self.spare_keys.pop().unwrap_or_default();
        keys.clear();
        keys
    }

    /// Takes back the key lists of reports the driver dispatched
    /// (`spent`, left empty), keeping a few for [`key_list`](Self::key_list).
    #[inline]
    pub(crate) fn reuse_keys(&mut self, spent: &mut Vec<Vec<u64>>) {
        if self.spare_keys.is_empty() && spent.len() <= SPARE_KEY_LISTS {
            // The two lists trade places; the spent ones are emptied when
            // they are taken again.
            std::mem::swap(&mut self.spare_keys, spent);
            return;
        }
        while let Some(mut keys) = spent.pop() {
            if self.spare_keys.len() < SPARE_KEY_LISTS {
                keys.clear();
                self.spare_keys.push(keys);
            }
        }
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ---------------------------------------------------------------------------
// State

#[derive(Clone)]
pub(crate) struct Pool {
    id: PoolId,
    pool: BufferPool,
}

pub(crate) struct Host {
    pub(crate) crashed: bool,
    /// Bumped by each restart: backends of an earlier life stay dead.
    pub(crate) incarnation: u64,
    refusing: bool,
    slow: u64,
    /// Set by `SimLoop::stop`, cleared when `run` returns.
    pub(crate) stop: bool,
    /// The loop is paused: its callbacks are held back.
    paused: bool,
    /// Callbacks held while paused, run in order after `Resume`.
    held_calls: Vec<Call>,
    listeners: BTreeMap<u16, ListenerId>,
    /// Local ports of connections this host initiated (in use).
    ports: BTreeMap<u16, usize>,
    /// Local ports of accepted connections (a listener's port), kept out of
    /// the ephemeral choice while such connections live.
    accepted_ports: BTreeMap<u16, usize>,
    /// Ports outgoing connections leave from (`Sim::set_connect_ports`),
    /// or `None` for the ephemeral range.
    pub(crate) connect_ports: Option<(u16, u16)>,
}

/// The hosts of the world, by address and by index. Hosts are never
/// removed, so an index stays valid (a backend keeps its host's); the
/// address order is the one the world iterates them in.
#[derive(Default)]
pub(crate) struct Hosts {
    list: Vec<Host>,
    at: BTreeMap<IpAddr, usize>,
}

impl Hosts {
    pub(crate) fn get(&self, ip: &IpAddr) -> Option<&Host> {
        self.at.get(ip).map(|&i| &self.list[i])
    }

    pub(crate) fn get_mut(&mut self, ip: &IpAddr) -> Option<&mut Host> {
        self.at.get(ip).map(|&i| &mut self.list[i])
    }

    pub(crate) fn contains_key(&self, ip: &IpAddr) -> bool {
        self.at.contains_key(ip)
    }

    /// The addresses, in order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &IpAddr> {
        self.at.keys()
    }

    /// The index of the host at `ip`, made by `make` if there is none.
    fn ensure(&mut self, ip: IpAddr, make: impl FnOnce() -> Host) -> usize {
        let list = &mut self.list;
        *self.at.entry(ip).or_insert_with(|| {
            list.push(make());
            list.len() - 1
        })
    }

    /// Calls `f` on every host, in address order.
    fn for_each_mut(&mut self, mut f: impl FnMut(&mut Host)) {
        for &i in self.at.values() {
            f(&mut self.list[i]);
        }
    }
}

impl std::ops::Index<&IpAddr> for Hosts {
    type Output = Host;

    fn index(&self, ip: &IpAddr) -> &Host {
        self.get(ip).expect("a host of the world")
    }
}

/// A backend's entry for one of its connections.
struct Endpoint {
    wire: WireId,
    side: usize,
    /// Order of opening or accepting, for `connection_to`.
    seq: u64,
}

pub(crate) struct BackendState {
    pub(crate) host: IpAddr,
    /// The index of its host in [`World::hosts`].
    hix: usize,
    /// The life of its host it belongs to (see `Host::incarnation`).
    incarnation: u64,
    pub(crate) config: BackendConfig,
    /// `None` while the driver calls it, and for good once retired.
    handler: Option<HandlerBox>,
    /// Its handler was taken for good (the host crashed, or the world was
    /// shut down): one that comes back from a call is dropped.
    retired: bool,
    /// Connections by handle: opened here (from `open_active_endpoint` on)
    /// or accepted (from the SYN on; named to the application once
    /// established).
    conns: ConnTable<Endpoint>,
    next_seq: u64,
    /// Handler timers (`Backend::set_timer`).
    timers: TimerQueue,
    /// Tokens of `Backend::wake` calls not yet reported, oldest first.
    wakes: VecDeque<u64>,
    listens: BTreeMap<EndpointAddress, ListenerId>,
    shared_recv: Option<Pool>,
    shared_send: Option<Pool>,
}

struct Listener {
    backend: BackendId,
    host: IpAddr,
    addr: EndpointAddress,
    params: ConnectionParams,
    pool: Option<Pool>,
}

#[derive(Clone, Debug)]
enum Ending {
    Closed(CloseReason),
    Refused(RefuseReason),
}

#[derive(Clone, Debug)]
enum SideState {
    /// Opening: the initiator waits for the `SynAck`, the acceptor for the
    /// `Ack`. Nothing was reported yet.
    Connecting,
    Open,
    /// Ended by this side (local close, fault, protocol error); `Ev::Finish`
    /// reports it.
    Closing(Ending),
    Gone,
}

/// Receive flow control of a side (`pause_receive` / `resume_receive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rx {
    Running,
    Paused,
    /// Resumed; what was held is reported by the pending `Ev::Unhold`
    /// before anything newer.
    Resuming,
}

struct Side {
    backend: BackendId,
    host: IpAddr,
    local: EndpointAddress,
    /// The peer's address.
    remote: EndpointAddress,
    /// The handle of this side in its backend.
    handle: ConnId,
    state: SideState,
    rx: Rx,
    /// Messages taken into receive buffers but held back while paused.
    held: VecDeque<(NetworkBuffer, PoolId)>,
    /// The peer closed in an orderly way while this side was paused: it is
    /// reported after the held messages.
    deferred_close: bool,
    /// When the peer's host crashed without a word (`Sim::crash_silently`).
    peer_lost: Option<u64>,
    caps: Capabilities,
    recv: Option<Pool>,
    /// `recv` is this side's own pool (not a listener's or a backend's
    /// shared one).
    recv_own: bool,
    /// A free buffer of its own `recv` pool, emptied, kept for the next
    /// message instead of going back to the pool: the pool is this side's
    /// alone, so which of its free buffers is where changes nothing.
    spare: Option<NetworkBuffer>,
    send: Option<Pool>,
    region: Option<MemoryRegion>,
    /// Copy and zero-copy sends in flight (bounded by `send_queue_depth`).
    unbuffered: usize,
    /// The application closed it (its endpoint or its listener): nothing
    /// more is delivered to it.
    app_closed: bool,
}

/// How many copied bytes a message keeps in place, without an allocation.
const INLINE: usize = 64;

/// Bytes copied from the application: a small message in place, a larger
/// one on the heap.
enum Copied {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Vec<u8>),
}

impl Copied {
    /// `parts` one after the other, `len` bytes in all.
    fn gather<'a>(len: usize, parts: impl IntoIterator<Item = &'a [u8]>) -> Copied {
        if len <= INLINE {
            let mut bytes = [0; INLINE];
            let mut at = 0;
            for p in parts {
                bytes[at..at + p.len()].copy_from_slice(p);
                at += p.len();
            }
            debug_assert_eq!(at, len);
            Copied::Inline {
                len: at as u8,
                bytes,
            }
        } else {
            let mut v = Vec::with_capacity(len);
            for p in parts {
                v.extend_from_slice(p);
            }
            Copied::Heap(v)
        }
    }

    /// `header` followed by `data`.
    #[inline]
    fn of(header: &[u8], data: &[&[u8]]) -> Copied {
        let len = header.len()
            + match data {
                [d] => d.len(),
                _ => data.iter().map(|d| d.len()).sum::<usize>(),
            };
        if len > INLINE {
            let mut v = Vec::with_capacity(len);
            v.extend_from_slice(header);
            for d in data {
                v.extend_from_slice(d);
            }
            return Copied::Heap(v);
        }
        let mut bytes = [0; INLINE];
        // (Most messages have no header: no copy call for it.)
        if !header.is_empty() {
            bytes[..header.len()].copy_from_slice(header);
        }
        let mut at = header.len();
        for d in data {
            bytes[at..at + d.len()].copy_from_slice(d);
            at += d.len();
        }
        Copied::Inline {
            len: at as u8,
            bytes,
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Copied::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Copied::Heap(v) => v,
        }
    }
}

enum Body {
    Copy(Copied),
    Buffer(NetworkBuffer),
    ZeroCopy {
        header: [u8; MAX_HEADER_LEN],
        header_len: usize,
        lent: Lent,
    },
}

impl Body {
    fn len(&self) -> usize {
        match self {
            Body::Copy(c) => c.as_slice().len(),
            Body::Buffer(b) => b.len(),
            Body::ZeroCopy {
                header_len, lent, ..
            } => header_len + lent.len(),
        }
    }

    /// The bytes, copied.
    fn copied(&self) -> Copied {
        match self {
            Body::Copy(c) => Copied::gather(c.as_slice().len(), [c.as_slice()]),
            Body::Buffer(b) => Copied::gather(b.len(), [b.as_slice()]),
            Body::ZeroCopy {
                header,
                header_len,
                lent,
            } => Copied::gather(
                header_len + lent.len(),
                std::iter::once(&header[..*header_len]).chain(lent.chunks()),
            ),
        }
    }

    fn write_into(&self, buf: &mut NetworkBuffer) {
        let ok = match self {
            Body::Copy(c) => buf.write(c.as_slice()).is_ok(),
            Body::Buffer(b) => buf.write(b.as_slice()).is_ok(),
            Body::ZeroCopy {
                header,
                header_len,
                lent,
            } => {
                buf.write(&header[..*header_len]).is_ok()
                    && lent.chunks().all(|c| buf.write(c).is_ok())
            }
        };
        debug_assert!(ok, "message length checked against the receive buffer");
    }
}

struct Msg {
    key: u64,
    arrival: u64,
    body: Body,
}

#[derive(Default)]
struct Pipe {
    queue: VecDeque<Msg>,
    /// Time of the pending `Ev::Deliver`, if any.
    wake: Option<u64>,
    /// Waiting for a free receive buffer.
    blocked: bool,
    last_arrival: u64,
    /// TCP profile: how many messages at the head of `queue` the sender's
    /// "kernel" accepted (their sends completed; they travel on even if
    /// the sender closes, and are lost if the receiver does).
    accepted: usize,
    /// TCP profile: bytes of the accepted messages, bounded by the window.
    window: usize,
    /// TCP profile: the keys of sends accepted but not yet reported
    /// (`Ev::Complete`), in send order: the list the report hands over.
    /// Until then each keeps its buffer, lent region or queue slot, as the
    /// contract says.
    completing: Vec<u64>,
    /// How many of `completing` take a `send_queue_depth` slot (copy and
    /// zero-copy sends).
    completing_slots: usize,
    /// The buffers and lent regions the accepted sends of `completing`
    /// were copied from, kept only to be dropped when they are reported.
    copied_from: Vec<Body>,
}

impl Pipe {
    /// TCP profile: the first message waiting for the window does not fit
    /// in a window of `cap` bytes beside what is in flight (a message
    /// larger than the window fits an empty one).
    #[inline]
    fn next_waits_for_room(&self, cap: usize) -> bool {
        self.queue
            .get(self.accepted)
            .is_some_and(|m| self.window > 0 && self.window + m.body.len() > cap)
    }
}

struct Conn {
    /// Initiator's host and the target's address.
    hosts: [IpAddr; 2],
    target: EndpointAddress,
    sides: [Option<Side>; 2],
    /// `pipes[d]` carries messages from side `d` to side `1 - d`.
    pipes: [Pipe; 2],
    /// Arrival time of the last control packet towards each side; control
    /// packets of one direction arrive in order.
    ctrl_last: [u64; 2],
    listener: Option<ListenerId>,
    /// The profile: TCP (complete on local hand-off) or RDMA (complete on
    /// delivery), from the initiator's `NetworkMode`.
    tcp: bool,
    /// `route[d]`: the link and network cards of direction `d`, once it
    /// sent (so that a send looks none of them up by address).
    route: [Option<Route>; 2],
}

/// Where one direction of a connection sends: indices of its link and of
/// the sender's and the receiver's network cards; and the serialisation
/// times of its last message's length on each of them, while the models
/// are those of [`World::model_gen`] `gen`.
#[derive(Clone, Copy)]
struct Route {
    link: usize,
    out: usize,
    inc: usize,
    gen: u64,
    len: usize,
    link_tx: u64,
    nic_tx: u64,
    nic_rx: u64,
}

impl Conn {
    fn between(&self, a: IpAddr, b: IpAddr) -> bool {
        (self.hosts[0] == a && self.hosts[1] == b) || (self.hosts[0] == b && self.hosts[1] == a)
    }
}

/// Connections by wire id. Ids are handed out in increasing order and
/// never reused, so a vector indexed by id finds one with an index and
/// keeps them in id order (as an ordered map would); a closed connection
/// leaves an empty slot of one pointer.
#[derive(Default)]
struct Wires {
    slots: Vec<Option<Box<Conn>>>,
    len: usize,
}

impl Wires {
    fn get(&self, id: &WireId) -> Option<&Conn> {
        self.slots.get(usize::try_from(*id).ok()?)?.as_deref()
    }

    fn get_mut(&mut self, id: &WireId) -> Option<&mut Conn> {
        self.slots
            .get_mut(usize::try_from(*id).ok()?)?
            .as_deref_mut()
    }

    /// Adds connection `id`, an id above every earlier one.
    fn insert(&mut self, id: WireId, c: Conn) {
        let i = usize::try_from(id).expect("wire ids fit in memory");
        debug_assert!(i >= self.slots.len(), "wire ids are never reused");
        self.slots.resize_with(i, || None);
        self.slots.push(Some(Box::new(c)));
        self.len += 1;
    }

    fn remove(&mut self, id: &WireId) -> Option<Conn> {
        let c = self.slots.get_mut(usize::try_from(*id).ok()?)?.take()?;
        self.len -= 1;
        Some(*c)
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The connections in id order.
    fn values(&self) -> impl Iterator<Item = &Conn> {
        self.slots.iter().filter_map(|c| c.as_deref())
    }

    /// The connections with their ids, in id order.
    fn iter(&self) -> impl Iterator<Item = (WireId, &Conn)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i as WireId, c.as_deref()?)))
    }
}

impl std::ops::Index<&WireId> for Wires {
    type Output = Conn;

    fn index(&self, id: &WireId) -> &Conn {
        self.get(id).expect("a live connection")
    }
}

struct Link {
    cfg: LinkConfig,
    free_at: u64,
    /// `cfg`'s latency and jitter in nanoseconds.
    latency: u64,
    jitter: u64,
}

impl Link {
    fn new(cfg: LinkConfig) -> Self {
        Self {
            cfg,
            free_at: 0,
            latency: nanos(cfg.latency),
            jitter: nanos(cfg.jitter),
        }
    }

    fn set(&mut self, cfg: LinkConfig) {
        *self = Self {
            free_at: self.free_at,
            ..Self::new(cfg)
        };
    }
}

/// A host's network card: bandwidth each way, and until when each way is
/// busy with messages already scheduled.
#[derive(Default)]
struct Nic {
    cfg: NicConfig,
    tx_free_at: u64,
    rx_free_at: u64,
}

struct Held {
    conn: WireId,
    to: usize,
    pkt: Ctrl,
}

pub(crate) struct TimerState {
    host: IpAddr,
    f: UserFn,
    gen: u64,
    period: u64,
    active: bool,
}

/// Everything the simulator knows.
pub(crate) struct World {
    pub(crate) sched: Sched,
    pub(crate) hosts: Hosts,
    pub(crate) next_auto_host: u32,
    pub(crate) backends: Vec<BackendState>,
    conns: Wires,
    next_conn: WireId,
    listeners: BTreeMap<ListenerId, Listener>,
    next_listener: ListenerId,
    next_pool: PoolId,
    /// Links and network cards, made when first used and never removed;
    /// found by address pair and address (never iterated: their order
    /// does not matter), and by the index a connection keeps for each
    /// direction ([`Route`]).
    links: Vec<Link>,
    link_at: FastMap<(IpAddr, IpAddr), usize>,
    nics: Vec<Nic>,
    nic_at: FastMap<IpAddr, usize>,
    /// Bumped when a link or card model changes (serialisation times a
    /// [`Route`] keeps are then computed again).
    model_gen: u64,
    /// TCP profile: bytes one direction of a connection accepts before the
    /// receiver takes them (the sockets' buffers).
    pub(crate) tcp_window: usize,
    /// Cut host pairs, with the time of the cut.
    partitions: BTreeMap<(IpAddr, IpAddr), u64>,
    /// Host pairs whose traffic is held (`Sim::hold`).
    holds: BTreeSet<(IpAddr, IpAddr)>,
    held: Vec<Held>,
    blocked: BTreeMap<PoolId, BTreeSet<(WireId, usize)>>,
    timers: BTreeMap<u64, TimerState>,
    signals: BTreeMap<u64, (IpAddr, UserFn)>,
    next_user_id: u64,
    pub(crate) connect_timeout: u64,
    /// Thread token of the thread that drives (or last drove) the world.
    pub(crate) driver: u64,
    /// Threads blocked waiting for something to be scheduled.
    pub(crate) waiters: usize,
    /// The virtual time of the first call into a thread-safe backend from
    /// a thread other than the driver (the run stopped being reproducible).
    pub(crate) foreign_call: Option<u64>,
    seed: u64,
    /// Hosts whose loop is paused or holds callbacks back: every such
    /// host is here (some here may no longer be), so a step with this
    /// empty checks no host.
    held_loops: BTreeSet<IpAddr>,
}

fn pair(a: IpAddr, b: IpAddr) -> (IpAddr, IpAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

fn failed(kind: io::ErrorKind, msg: String) -> netio_core::Source {
    Box::new(io::Error::new(kind, msg))
}

/// Why a handle did not lead to a connection.
#[derive(Debug)]
enum Lookup {
    WrongThread,
    Unknown(ConnId),
}

macro_rules! from_lookup {
    ($($t:ty),*) => {$(
        impl From<Lookup> for $t {
            fn from(e: Lookup) -> Self {
                match e {
                    Lookup::WrongThread => Self::WrongThread,
                    Lookup::Unknown(id) => Self::UnknownConnection(id),
                }
            }
        }
    )*};
}
from_lookup!(CloseError, BufferError, SendError, ConnError);

impl World {
    pub(crate) fn new(seed: u64, driver: u64) -> Self {
        Self {
            sched: Sched {
                now: 0,
                rng: Rng::new(seed),
                seq: 0,
                queue: Queue::default(),
                trace: None,
                calls: Vec::new(),
                spare_keys: Vec::new(),
            },
            hosts: Hosts::default(),
            next_auto_host: 1,
            backends: Vec::new(),
            conns: Wires::default(),
            next_conn: 1,
            listeners: BTreeMap::new(),
            next_listener: 1,
            next_pool: 1,
            links: Vec::new(),
            link_at: FastMap::default(),
            nics: Vec::new(),
            nic_at: FastMap::default(),
            model_gen: 0,
            tcp_window: crate::DEFAULT_TCP_WINDOW,
            partitions: BTreeMap::new(),
            holds: BTreeSet::new(),
            held: Vec::new(),
            blocked: BTreeMap::new(),
            timers: BTreeMap::new(),
            signals: BTreeMap::new(),
            next_user_id: 1,
            connect_timeout: nanos(crate::CONNECT_TIMEOUT),
            driver,
            waiters: 0,
            foreign_call: None,
            seed,
            held_loops: BTreeSet::new(),
        }
    }

    // -- queue ---------------------------------------------------------------

    pub(crate) fn next_at(&self) -> Option<u64> {
        self.sched.queue.peek_at()
    }

    /// Callbacks are waiting to be dispatched.
    pub(crate) fn has_calls(&self) -> bool {
        !self.sched.calls.is_empty()
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.sched.queue.is_empty()
    }

    /// Runs the next event if one is due by `deadline`: advances the clock
    /// to it and applies it (callbacks it causes go to `self.sched.calls`).
    /// Returns whether one ran.
    #[inline]
    pub(crate) fn run_next(&mut self, deadline: u64) -> bool {
        if self.next_at().is_none_or(|t| t > deadline) {
            return false;
        }
        let e = self.sched.queue.take_next();
        self.process(e);
        true
    }

    /// Applies the event of `e`, at its time.
    fn process(&mut self, e: Entry) {
        self.sched.now = self.sched.now.max(e.at);
        match e.ev {
            Ev::Ctrl { conn, to, pkt } => self.on_ctrl(conn, to, *pkt),
            Ev::ConnectTimeout { conn } => self.on_connect_timeout(conn),
            Ev::Finish { conn, side } => {
                let ending = match self.side(conn, side).map(|s| &s.state) {
                    Some(SideState::Closing(e)) => e.clone(),
                    _ => return,
                };
                self.end_side(conn, side, Some(ending));
            }
            Ev::Deliver { conn, dir } => self.deliver(conn, dir),
            Ev::Complete { conn, dir } => self.complete(conn, dir),
            Ev::Release { buf, pool } => self.release_recv(*buf, pool),
            Ev::Timer { id, gen } => {
                let now = self.sched.now;
                let Some(t) = self.timers.get(&id) else {
                    return;
                };
                if !t.active || t.gen != gen {
                    return;
                }
                let (host, period, f) = (t.host, t.period, Arc::clone(&t.f));
                self.sched.schedule(now + period, Ev::Timer { id, gen });
                self.sched.log(host, format_args!("timer {id}"));
                self.sched.calls.push(Call::Timer { host, id, gen, f });
            }
            Ev::Signal { id } => {
                if let Some((host, f)) = self.signals.get(&id) {
                    let (host, f) = (*host, Arc::clone(f));
                    self.sched.log(host, format_args!("signal {id}"));
                    self.sched.calls.push(Call::Signal { host, f });
                }
            }
            Ev::Resume { host } => {
                if let Some(h) = self.hosts.get_mut(&host) {
                    let held = std::mem::take(&mut h.held_calls);
                    self.sched
                        .log(host, format_args!("resume ({} callbacks)", held.len()));
                    self.sched.calls.extend(held);
                }
            }
            Ev::HandlerTimer { b } => {
                let now = self.sched.now;
                while let Some(token) = self.backends[b].timers.pop_due(Duration::from_nanos(now)) {
                    self.sched.emit(&self.backends, b, NetEv::Timer(token));
                }
            }
            Ev::Wake { b } => {
                if let Some(token) = self.backends[b].wakes.pop_front() {
                    self.sched.emit(&self.backends, b, NetEv::Wake(token));
                }
            }
            Ev::Post(posted) => {
                let Posted { host, inc, f } = *posted;
                if self.hosts.get(&host).map(|h| h.incarnation) != Some(inc) {
                    return; // posted by the host's life before a restart
                }
                self.sched.log(host, format_args!("post"));
                self.sched.calls.push(Call::Post { host, f });
            }
            Ev::Unhold { conn, side } => self.unhold(conn, side),
            Ev::DeferredClose { conn, side } => {
                let due = self.side(conn, side).is_some_and(|s| {
                    s.deferred_close && s.rx == Rx::Running && matches!(s.state, SideState::Open)
                }) && !self.accepted_towards(conn, side);
                if due {
                    self.end_side(conn, side, Some(Ending::Closed(CloseReason::PeerClosed)));
                }
            }
            Ev::PeerTimeout { conn, side, since } => self.peer_timeout(conn, side, since),
        }
    }

    // -- handler timers, wakes and posts ----------------------------------------

    /// `Backend::set_timer`: `on_timer(token)` at now + `delay`.
    pub(crate) fn set_timer(&mut self, b: BackendId, delay: Duration, token: u64) {
        let at = self.sched.now.saturating_add(nanos(delay));
        self.backends[b]
            .timers
            .push(Duration::from_nanos(at), token);
        self.sched.log(
            self.backends[b].host,
            format_args!("b{b} set_timer {token} at={at}"),
        );
        self.sched.schedule(at, Ev::HandlerTimer { b });
    }

    /// `Backend::wake`: `on_wake(token)` soon, after earlier wakes.
    pub(crate) fn wake(&mut self, b: BackendId, token: u64) {
        self.backends[b].wakes.push_back(token);
        let now = self.sched.now;
        self.sched.schedule(now, Ev::Wake { b });
    }

    /// `EventLoop::post`: `f` runs on `host`'s loop at the current time.
    pub(crate) fn post(&mut self, host: IpAddr, f: PostFn) {
        let now = self.sched.now;
        let inc = self.host_mut(host).incarnation;
        self.sched
            .schedule(now, Ev::Post(Box::new(Posted { host, inc, f })));
    }

    // -- receive flow control ----------------------------------------------------

    /// Keeps a message that reached a paused side until it resumes.
    pub(crate) fn hold(&mut self, m: DataMsg) {
        if let Some(s) = self.side_mut(m.wire, m.side) {
            s.held.push_back((m.buf, m.pool));
        } else {
            self.release_recv(m.buf, m.pool);
        }
    }

    /// Reports what side `side` held while paused, then lets its peer's
    /// messages flow again.
    fn unhold(&mut self, conn: WireId, side: usize) {
        let Some(s) = self.side_mut(conn, side) else {
            return;
        };
        if s.rx != Rx::Resuming || !matches!(s.state, SideState::Open) {
            return;
        }
        s.rx = Rx::Running;
        let held = std::mem::take(&mut s.held);
        let (b, handle, remote, deferred) = (s.backend, s.handle, s.remote, s.deferred_close);
        for (buf, pool) in held {
            let m = DataMsg {
                conn: handle,
                buf,
                pool,
                wire: conn,
                side,
            };
            self.sched.emit_data(&self.backends, b, m, &remote);
        }
        let now = self.sched.now;
        if deferred {
            self.sched.schedule(now, Ev::DeferredClose { conn, side });
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            Self::kick(&mut self.sched, conn, c, 1 - side, now);
        }
    }

    pub(crate) fn op_pause(&mut self, b: BackendId, id: ConnId) -> Result<(), ConnError> {
        let (conn, side) = self.conn_of(b, id).map_err(ConnError::from)?;
        let s = self.side_mut(conn, side).expect("side of a live handle");
        if s.rx == Rx::Paused {
            return Ok(());
        }
        s.rx = Rx::Paused;
        let host = s.host;
        self.sched.log(host, format_args!("b{b} pause {id}"));
        Ok(())
    }

    pub(crate) fn op_resume(&mut self, b: BackendId, id: ConnId) -> Result<(), ConnError> {
        let (conn, side) = self.conn_of(b, id).map_err(ConnError::from)?;
        let s = self.side_mut(conn, side).expect("side of a live handle");
        if s.rx != Rx::Paused {
            return Ok(());
        }
        s.rx = Rx::Resuming;
        let host = s.host;
        self.sched.log(host, format_args!("b{b} resume {id}"));
        let now = self.sched.now;
        self.sched.schedule(now, Ev::Unhold { conn, side });
        Ok(())
    }

    pub(crate) fn op_remote_address(
        &mut self,
        b: BackendId,
        id: ConnId,
    ) -> Result<EndpointAddress, ConnError> {
        let (conn, side) = self.conn_of(b, id).map_err(ConnError::from)?;
        Ok(self.side(conn, side).expect("side of a live handle").remote)
    }

    pub(crate) fn op_connection_to(
        &mut self,
        b: BackendId,
        remote: EndpointAddress,
    ) -> Result<ConnId, ConnError> {
        if !self.thread_ok(b) {
            return Err(ConnError::WrongThread);
        }
        self.backends[b]
            .conns
            .iter()
            .filter(|(_, e)| {
                self.side(e.wire, e.side)
                    .is_some_and(|s| s.remote == remote && Self::named(s, e.side))
            })
            .min_by_key(|(_, e)| e.seq)
            .map(|(id, _)| id)
            .ok_or(ConnError::NoConnectionTo(remote))
    }

    /// TCP profile: data accepted by the peer's kernel still travels
    /// towards side `side`.
    fn accepted_towards(&self, conn: WireId, side: usize) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| c.tcp && c.pipes[1 - side].accepted > 0)
    }

    // -- liveness (peer_timeout) --------------------------------------------------

    /// Since when the peer of side `side` has been unreachable (partition,
    /// or a silent crash of its host), if it is.
    fn unreachable_since(&self, conn: WireId, side: usize) -> Option<u64> {
        let c = self.conns.get(&conn)?;
        if let Some(t) = c.sides[side].as_ref()?.peer_lost {
            return Some(t);
        }
        if c.hosts[0] == c.hosts[1] {
            return None;
        }
        self.partitions.get(&pair(c.hosts[0], c.hosts[1])).copied()
    }

    /// Arms side `side`'s peer timeout, if its backend has one and the
    /// side is open, for a peer unreachable since
    /// [`unreachable_since`](Self::unreachable_since).
    fn arm_peer_timeout(&mut self, conn: WireId, side: usize) {
        let Some(since) = self.unreachable_since(conn, side) else {
            return;
        };
        let Some(s) = self.side(conn, side) else {
            return;
        };
        if !matches!(s.state, SideState::Open) {
            return;
        }
        let Some(t) = self.backends[s.backend].config.peer_timeout else {
            return;
        };
        let at = since.saturating_add(nanos(t)).max(self.sched.now);
        self.sched
            .schedule(at, Ev::PeerTimeout { conn, side, since });
    }

    fn peer_timeout(&mut self, conn: WireId, side: usize, since: u64) {
        if self.unreachable_since(conn, side) != Some(since) {
            return; // healed (and maybe cut again later) in between
        }
        let Some(s) = self.side(conn, side) else {
            return;
        };
        if !matches!(s.state, SideState::Open) {
            return;
        }
        let (b, host, id) = (s.backend, s.host, s.handle);
        self.sched.log(host, format_args!("b{b} peer timeout {id}"));
        // The peer, if it still exists, hears a reset once the cut heals,
        // as a TCP peer would on its next segment.
        let other = 1 - side;
        if matches!(
            self.side(conn, other).map(|s| &s.state),
            Some(SideState::Open | SideState::Connecting)
        ) {
            self.send_ctrl(conn, other, Ctrl::Close(CloseReason::Reset));
        }
        self.end_side(conn, side, Some(Ending::Closed(CloseReason::TimedOut)));
    }

    /// Takes the callbacks of the last event out of the queue, keeping back
    /// those of paused hosts (and, until their `Resume`, of hosts with
    /// callbacks still held, so each host's callbacks keep their order).
    /// Moves the callbacks to run now into `run` (empty: the two lists
    /// trade their memory), those of paused hosts to the hosts.
    #[inline]
    pub(crate) fn take_calls(&mut self, run: &mut Vec<Call>) {
        debug_assert!(run.is_empty());
        std::mem::swap(&mut self.sched.calls, run);
        if !self.held_loops.is_empty() {
            let hosts = &self.hosts;
            self.held_loops.retain(|ip| {
                hosts
                    .get(ip)
                    .is_some_and(|h| h.paused || !h.held_calls.is_empty())
            });
        }
        if self.held_loops.is_empty() {
            return;
        }
        for call in std::mem::take(run) {
            match self.hosts.get_mut(&call.host(&self.backends)) {
                Some(h) if h.paused || !h.held_calls.is_empty() => h.held_calls.push(call),
                _ => run.push(call),
            }
        }
    }

    /// Pauses or resumes `host`'s loop (see `Sim::pause_loop`).
    pub(crate) fn pause(&mut self, host: IpAddr, paused: bool) {
        self.ensure_host(host);
        let now = self.sched.now;
        let h = self.host_mut(host);
        if h.paused == paused {
            return;
        }
        h.paused = paused;
        let held = !h.held_calls.is_empty();
        if paused {
            self.held_loops.insert(host);
        }
        self.sched.log(
            host,
            format_args!("{}", if paused { "pause loop" } else { "resume loop" }),
        );
        if !paused && held {
            self.sched.schedule(now, Ev::Resume { host });
        }
    }

    // -- hosts ---------------------------------------------------------------

    /// The index of the host at `ip`, made if new.
    pub(crate) fn ensure_host(&mut self, ip: IpAddr) -> usize {
        self.hosts.ensure(ip, || Host {
            crashed: false,
            incarnation: 0,
            refusing: false,
            slow: 0,
            stop: false,
            paused: false,
            held_calls: Vec::new(),
            listeners: BTreeMap::new(),
            ports: BTreeMap::new(),
            accepted_ports: BTreeMap::new(),
            connect_ports: None,
        })
    }

    pub(crate) fn host_mut(&mut self, ip: IpAddr) -> &mut Host {
        let i = self.ensure_host(ip);
        &mut self.hosts.list[i]
    }

    /// The host exists and has not crashed.
    pub(crate) fn host_alive(&self, ip: IpAddr) -> bool {
        self.hosts.get(&ip).is_some_and(|h| !h.crashed)
    }

    /// Backend `b`'s host is up and has not restarted since `b` was made.
    pub(crate) fn backend_alive(&self, b: BackendId) -> bool {
        let be = &self.backends[b];
        let h = &self.hosts.list[be.hix];
        !h.crashed && h.incarnation == be.incarnation
    }

    /// Whether `ev`, a call of backend `b`'s handler, runs now, decided
    /// just before it would (see [`Due`]).
    #[inline]
    pub(crate) fn due(&mut self, b: BackendId, ev: &NetEv) -> Due {
        if !self.backend_alive(b) {
            return Due::Skip;
        }
        if let NetEv::Data(m) = ev {
            // Nothing is delivered after the connection was closed (by this
            // side's call, or reported closed); nothing while it is paused
            // (held until resumed).
            if let Some(s) = self.side(m.wire, m.side) {
                if s.app_closed {
                    return Due::Skip;
                }
                if s.rx != Rx::Running && !matches!(s.state, SideState::Gone) {
                    return Due::Hold;
                }
            }
        }
        let be = &mut self.backends[b];
        match be.handler.take() {
            Some(h) => Due::Handler(h, be.host),
            None => Due::Skip,
        }
    }

    /// Gives backend `b` back the handler [`due`](Self::due) took, or
    /// returns it if the backend was retired meanwhile (for the caller to
    /// drop after unlocking).
    #[inline]
    #[must_use]
    pub(crate) fn put_handler(&mut self, b: BackendId, h: HandlerBox) -> Option<HandlerBox> {
        let be = &mut self.backends[b];
        if be.retired {
            return Some(h);
        }
        debug_assert!(be.handler.is_none(), "one handler call at a time");
        be.handler = Some(h);
        None
    }

    /// Takes backend `b`'s handler for good (into `dead`, for the caller to
    /// drop after unlocking); one being called comes back to
    /// [`put_handler`](Self::put_handler), which returns it to be dropped.
    fn retire(be: &mut BackendState, dead: &mut Remains) {
        be.retired = true;
        dead.handlers.extend(be.handler.take());
    }

    /// Whether `call`, a loop callback (timer, signal, post), runs now: a
    /// stopped timer's does not.
    pub(crate) fn loop_call_due(&self, call: &Call) -> bool {
        match call {
            Call::Timer { id, gen, .. } => self.timer_live(*id, *gen),
            _ => true,
        }
    }

    /// Brings a crashed `host` back with a fresh state (crashing it first,
    /// with resets to its peers, if it is up): its earlier backends, loop
    /// timers, signals and posted closures stay dead. Returns the dead
    /// callbacks, for the caller to drop after unlocking.
    pub(crate) fn restart(&mut self, host: IpAddr) -> Remains {
        let mut dead = self.crash(host, true);
        // Peers still holding a connection to the host's earlier life (it
        // crashed silently) hear a reset, as TCP's next segment to a
        // rebooted host is answered by one.
        let stale: Vec<(WireId, usize)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| {
                (0..2).find_map(|side| {
                    let (me, other) = (c.sides[side].as_ref()?, c.sides[1 - side].as_ref()?);
                    (me.host == host
                        && matches!(me.state, SideState::Gone)
                        && other.peer_lost.is_some()
                        && matches!(other.state, SideState::Open))
                    .then_some((id, 1 - side))
                })
            })
            .collect();
        for (conn, to) in stale {
            self.send_ctrl(conn, to, Ctrl::Close(CloseReason::Reset));
        }
        let h = self.host_mut(host);
        h.crashed = false;
        h.incarnation += 1;
        h.refusing = false;
        h.slow = 0;
        h.paused = false;
        let inc = h.incarnation;
        let timers: Vec<u64> = self
            .timers
            .iter()
            .filter(|(_, t)| t.host == host)
            .map(|(&id, _)| id)
            .collect();
        dead.callbacks
            .extend(timers.into_iter().filter_map(|id| self.remove_timer(id)));
        let signals: Vec<u64> = self
            .signals
            .iter()
            .filter(|(_, (h, _))| *h == host)
            .map(|(&id, _)| id)
            .collect();
        dead.callbacks
            .extend(signals.into_iter().filter_map(|id| self.remove_signal(id)));
        self.sched
            .log(host, format_args!("fault restart (life {inc})"));
        dead
    }

    fn pick_port(&mut self, ip: IpAddr) -> Option<u16> {
        let start = self.sched.rng.below(EPHEMERAL_COUNT);
        let h = self.hosts.get(&ip)?;
        (0..EPHEMERAL_COUNT)
            .map(|i| EPHEMERAL_FIRST + ((start + i) % EPHEMERAL_COUNT) as u16)
            .find(|p| {
                !h.listeners.contains_key(p)
                    && !h.ports.contains_key(p)
                    && !h.accepted_ports.contains_key(p)
            })
    }

    /// A local port for a connection from `ip` to `to`: from the host's
    /// connect range if it has one (a port is skipped while a listener uses
    /// it or a connection from it to `to` lives; connections to other
    /// remotes may share it), else an ephemeral port nothing uses.
    fn pick_connect_port(&mut self, ip: IpAddr, to: EndpointAddress) -> Result<u16, String> {
        let Some((first, last)) = self.hosts.get(&ip).and_then(|h| h.connect_ports) else {
            return self
                .pick_port(ip)
                .ok_or_else(|| "no free local port left".to_owned());
        };
        let count = u64::from(last - first) + 1;
        let start = self.sched.rng.below(count);
        let h = &self.hosts[&ip];
        let in_use = |port: u16| {
            h.listeners.contains_key(&port)
                || self.conns.values().any(|c| {
                    c.target == to
                        && c.sides[0].as_ref().is_some_and(|s| {
                            s.local.port() == port
                                && s.host == ip
                                && !matches!(s.state, SideState::Gone)
                        })
                })
        };
        (0..count)
            .map(|i| first + ((start + i) % count) as u16)
            .find(|&p| !in_use(p))
            .ok_or_else(|| {
                format!(
                    "no free local port in {first}-{last} (Sim::set_connect_ports) to connect to {to}"
                )
            })
    }

    pub(crate) fn set_connect_ports(&mut self, ip: IpAddr, ports: Option<(u16, u16)>) {
        self.host_mut(ip).connect_ports = ports;
        self.sched.log(ip, format_args!("connect ports {ports:?}"));
    }

    fn new_pool(&mut self, buf_size: usize, num_buf: usize) -> Pool {
        self.next_pool += 1;
        Pool {
            id: self.next_pool,
            pool: BufferPool::new(buf_size, num_buf),
        }
    }

    // -- backends ------------------------------------------------------------

    pub(crate) fn add_backend(
        &mut self,
        host: IpAddr,
        config: BackendConfig,
        handler: HandlerBox,
    ) -> BackendId {
        let shared_recv = config
            .shared_receive_pool
            .map(|p| self.new_pool(p.buf_size, p.num_buf));
        let shared_send = config
            .shared_send_pool
            .map(|p| self.new_pool(p.buf_size, p.num_buf));
        let hix = self.ensure_host(host);
        let incarnation = self.hosts.list[hix].incarnation;
        self.backends.push(BackendState {
            host,
            hix,
            incarnation,
            config,
            handler: Some(handler),
            retired: false,
            conns: ConnTable::new(),
            next_seq: 0,
            timers: TimerQueue::new(),
            wakes: VecDeque::new(),
            listens: BTreeMap::new(),
            shared_recv,
            shared_send,
        });
        let id = self.backends.len() - 1;
        self.sched.log(host, format_args!("b{id} created"));
        id
    }

    /// Notes a call into backend `b`: one from a thread other than the
    /// driver, into a backend that accepts it, makes the run depend on
    /// thread timing (said once on stderr in debug builds).
    pub(crate) fn note_caller(&mut self, b: BackendId) {
        if self.foreign_call.is_some()
            || self.backends[b].config.thread_safety != ThreadSafety::Safe
            || self.driver == netio_core::thread_token()
        {
            return;
        }
        self.foreign_call = Some(self.sched.now);
        if cfg!(debug_assertions) {
            let thread = std::thread::current();
            eprintln!(
                "netio-sim: a backend on {} was called from thread {:?} while another thread \
                 drives the world (seed {:#x}, virtual time {} ns); from here on this run \
                 depends on thread timing and is not reproducible from its seed. Make the \
                 calls on the driving thread, or post them to the loop (EventLoop::post).",
                self.backends[b].host,
                thread.name().unwrap_or("unnamed"),
                self.seed,
                self.sched.now
            );
        }
    }

    /// `false` if `b` is thread-unsafe and the caller is not the driver.
    pub(crate) fn thread_ok(&self, b: BackendId) -> bool {
        self.backends[b].config.thread_safety == ThreadSafety::Safe
            || self.driver == netio_core::thread_token()
    }

    // -- connections -----------------------------------------------------------

    fn side(&self, conn: WireId, side: usize) -> Option<&Side> {
        self.conns.get(&conn)?.sides[side].as_ref()
    }

    fn side_mut(&mut self, conn: WireId, side: usize) -> Option<&mut Side> {
        self.conns.get_mut(&conn)?.sides[side].as_mut()
    }

    #[allow(clippy::too_many_arguments)]
    fn make_side(
        &mut self,
        b: BackendId,
        wire: WireId,
        side: usize,
        local: EndpointAddress,
        remote: EndpointAddress,
        params: &ConnectionParams,
        listener_pool: Option<Pool>,
    ) -> Side {
        let recv_own = !params.recv.use_shared_pool && params.recv.num_buf > 0;
        let recv = if params.recv.use_shared_pool {
            listener_pool.or_else(|| self.backends[b].shared_recv.clone())
        } else if recv_own {
            Some(self.new_pool(params.recv.buf_size, params.recv.num_buf))
        } else {
            None
        };
        let send = match &self.backends[b].shared_send {
            Some(p) => Some(p.clone()),
            None if params.send_buffered.num_buf > 0 => {
                Some(self.new_pool(params.send_buffered.buf_size, params.send_buffered.num_buf))
            }
            None => None,
        };
        let be = &mut self.backends[b];
        let seq = be.next_seq;
        be.next_seq += 1;
        let handle = be.conns.insert(Endpoint { wire, side, seq });
        Side {
            backend: b,
            host: be.host,
            local,
            remote,
            handle,
            state: SideState::Connecting,
            rx: Rx::Running,
            held: VecDeque::new(),
            deferred_close: false,
            peer_lost: None,
            caps: params.capabilities(&be.config, true),
            recv,
            recv_own,
            spare: None,
            send,
            region: params.send_zero_copy.clone(),
            unbuffered: 0,
            app_closed: false,
        }
    }

    /// Latency of one packet from `src` to `dst`, jitter included.
    fn latency(&mut self, src: IpAddr, dst: IpAddr) -> u64 {
        let cfg = self.link_config(src, dst);
        nanos(cfg.latency) + self.sched.rng.below(nanos(cfg.jitter) + 1)
    }

    pub(crate) fn link_config(&self, src: IpAddr, dst: IpAddr) -> LinkConfig {
        self.link_at
            .get(&(src, dst))
            .map_or_else(LinkConfig::default, |&i| self.links[i].cfg)
    }

    /// The index of the link from `src` to `dst`, made (with the default
    /// model) if there is none.
    fn link_index(&mut self, src: IpAddr, dst: IpAddr) -> usize {
        let links = &mut self.links;
        *self.link_at.entry((src, dst)).or_insert_with(|| {
            links.push(Link::new(LinkConfig::default()));
            links.len() - 1
        })
    }

    /// The index of `host`'s network card, made (unlimited) if it has none.
    fn nic_index(&mut self, host: IpAddr) -> usize {
        let nics = &mut self.nics;
        *self.nic_at.entry(host).or_insert_with(|| {
            nics.push(Nic::default());
            nics.len() - 1
        })
    }

    pub(crate) fn set_link(&mut self, a: IpAddr, b: IpAddr, cfg: LinkConfig) {
        for (src, dst) in [(a, b), (b, a)] {
            let i = self.link_index(src, dst);
            self.links[i].set(cfg);
        }
        self.model_gen += 1;
        self.sched.log(
            a,
            format_args!(
                "link {b} latency={:?} bandwidth={} jitter={:?}",
                cfg.latency, cfg.bandwidth_bytes_per_sec, cfg.jitter
            ),
        );
    }

    pub(crate) fn set_nic(&mut self, host: IpAddr, cfg: NicConfig) {
        let i = self.nic_index(host);
        self.nics[i].cfg = cfg;
        self.model_gen += 1;
        self.sched.log(
            host,
            format_args!(
                "nic send={} receive={}",
                cfg.send_bytes_per_sec, cfg.receive_bytes_per_sec
            ),
        );
    }

    pub(crate) fn nic_config(&self, host: IpAddr) -> NicConfig {
        self.nic_at
            .get(&host)
            .map_or_else(NicConfig::default, |&i| self.nics[i].cfg)
    }

    /// Nothing passes between `a` and `b`: they are partitioned, or their
    /// traffic is held (`Sim::hold`).
    fn blocked_between(&self, a: IpAddr, b: IpAddr) -> bool {
        // The maps first: usually there is no cut nor hold at all.
        !(self.partitions.is_empty() && self.holds.is_empty()) && a != b && {
            let k = pair(a, b);
            self.partitions.contains_key(&k) || self.holds.contains(&k)
        }
    }

    /// Sends a control packet towards side `to`; packets of one direction
    /// of one connection arrive in the order sent.
    fn send_ctrl(&mut self, conn: WireId, to: usize, pkt: Ctrl) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        let (src, dst) = (c.hosts[1 - to], c.hosts[to]);
        let lat = self.latency(src, dst);
        let now = self.sched.now;
        let c = self.conns.get_mut(&conn).expect("checked above");
        let mut at = (now + lat).max(c.ctrl_last[to] + 1);
        if c.tcp && matches!(pkt, Ctrl::Close(CloseReason::PeerClosed)) {
            // An orderly close travels behind the data already accepted.
            let p = &c.pipes[1 - to];
            if let Some(m) = p.queue.get(p.accepted.wrapping_sub(1)) {
                at = at.max(m.arrival + 1);
            }
        }
        c.ctrl_last[to] = at;
        self.sched.schedule(
            at,
            Ev::Ctrl {
                conn,
                to,
                pkt: Box::new(pkt),
            },
        );
    }

    /// Makes sure pipe `dir` of `conn` is looked at no later than `at`.
    #[inline]
    fn kick(sched: &mut Sched, conn: WireId, c: &mut Conn, dir: usize, at: u64) {
        Self::kick_pipe(sched, conn, &mut c.pipes[dir], dir, at);
    }

    /// [`kick`](Self::kick) with the pipe at hand.
    #[inline(always)]
    fn kick_pipe(sched: &mut Sched, conn: WireId, p: &mut Pipe, dir: usize, at: u64) {
        if p.wake.is_none_or(|w| at < w) {
            p.wake = Some(at);
            sched.schedule(at, Ev::Deliver { conn, dir });
        }
    }

    fn on_ctrl(&mut self, conn: WireId, to: usize, pkt: Ctrl) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if self.blocked_between(c.hosts[0], c.hosts[1]) {
            self.held.push(Held { conn, to, pkt });
            return;
        }
        match pkt {
            Ctrl::Syn => self.on_syn(conn),
            // The initiator (side 0) is open once the SYN-ACK is back and
            // answers with the ACK that opens the acceptor (side 1).
            Ctrl::SynAck => {
                if self.establish_side(conn, 0) {
                    self.send_ctrl(conn, 1, Ctrl::Ack);
                }
            }
            Ctrl::Ack => {
                self.establish_side(conn, 1);
            }
            Ctrl::Refuse(reason) => {
                if matches!(
                    self.side(conn, 0).map(|s| &s.state),
                    Some(SideState::Connecting)
                ) {
                    self.end_side(conn, 0, Some(Ending::Refused(reason)));
                }
            }
            Ctrl::Close(reason) => match self.side(conn, to).map(|s| (&s.state, s.rx)) {
                // An orderly close comes after the messages a paused side
                // holds: reported once it resumes and has handed them over;
                // under the TCP profile also after the data the peer's
                // kernel accepted before it closed.
                Some((SideState::Open, rx))
                    if reason == CloseReason::PeerClosed
                        && (rx != Rx::Running || self.accepted_towards(conn, to)) =>
                {
                    if let Some(s) = self.side_mut(conn, to) {
                        s.deferred_close = true;
                    }
                }
                Some((SideState::Open, _)) => self.end_side(conn, to, Some(Ending::Closed(reason))),
                // The initiator hears a refusal; an acceptor that never
                // reported the connection drops it silently.
                Some((SideState::Connecting, _)) if to == 0 => {
                    self.end_side(conn, 0, Some(Ending::Refused(RefuseReason::Refused)))
                }
                Some((SideState::Connecting, _)) => self.end_side(conn, 1, None),
                _ => {}
            },
        }
    }

    fn on_syn(&mut self, conn: WireId) {
        let c = &self.conns[&conn];
        let (target, tcp) = (c.target, c.tcp);
        let Some(s0) = c.sides[0].as_ref() else {
            return;
        };
        if !matches!(s0.state, SideState::Connecting) {
            return;
        }
        let key = s0.local;
        let Some(h) = self.hosts.get(&target.ip()) else {
            return; // nobody there: the initiator times out
        };
        if h.crashed {
            return;
        }
        let lid = match h.listeners.get(&target.port()) {
            Some(&l) if !h.refusing => l,
            _ => {
                self.sched
                    .log(target.ip(), format_args!("refuse {key} -> {target}"));
                self.send_ctrl(conn, 0, Ctrl::Refuse(RefuseReason::Refused));
                return;
            }
        };
        let l = &self.listeners[&lid];
        let (lb, params, pool) = (l.backend, l.params.clone(), l.pool.clone());
        let mode = self.backends[lb].config.mode;
        if (mode == NetworkMode::Tcp) != tcp {
            // A stream socket and an RDMA endpoint do not speak to each
            // other: the handshake fails.
            self.sched.log(
                target.ip(),
                format_args!("refuse {key} -> {target}: network mode {mode:?}"),
            );
            let why = format!(
                "the listener at {target} runs NetworkMode::{mode:?}, the initiator NetworkMode::{:?}",
                if tcp { NetworkMode::Tcp } else { NetworkMode::Rdma }
            );
            self.send_ctrl(conn, 0, Ctrl::Refuse(RefuseReason::Handshake(why)));
            return;
        }
        let side = self.make_side(lb, conn, 1, target, key, &params, pool);
        *self
            .host_mut(target.ip())
            .accepted_ports
            .entry(target.port())
            .or_default() += 1;
        let c = self.conns.get_mut(&conn).expect("exists");
        c.sides[1] = Some(side);
        c.listener = Some(lid);
        self.sched
            .log(target.ip(), format_args!("b{lb} accept {key} on {target}"));
        self.send_ctrl(conn, 0, Ctrl::SynAck);
    }

    fn on_connect_timeout(&mut self, conn: WireId) {
        if !matches!(
            self.side(conn, 0).map(|s| &s.state),
            Some(SideState::Connecting)
        ) {
            return;
        }
        let accepted = matches!(
            self.side(conn, 1).map(|s| &s.state),
            Some(SideState::Open | SideState::Connecting)
        );
        self.end_side(conn, 0, Some(Ending::Refused(RefuseReason::Unreachable)));
        if accepted {
            self.send_ctrl(conn, 1, Ctrl::Close(CloseReason::Reset));
        }
    }

    /// Opens `side` of a connection that is still connecting: reports it
    /// established and lets the other side's queued messages flow towards
    /// it. Returns `false` (and does nothing) if the side is gone or open.
    fn establish_side(&mut self, conn: WireId, side: usize) -> bool {
        let Some(s) = self.side_mut(conn, side) else {
            return false;
        };
        if !matches!(s.state, SideState::Connecting) {
            return false;
        }
        s.state = SideState::Open;
        let (b, id, remote, caps) = (s.backend, s.handle, s.remote, s.caps);
        self.sched
            .emit(&self.backends, b, NetEv::Established(id, remote, caps));
        let now = self.sched.now;
        let c = self.conns.get_mut(&conn).expect("side exists");
        Self::kick(&mut self.sched, conn, c, 1 - side, now);
        // Opened towards a peer already lost (it crashed silently after
        // answering): the peer timeout applies from the loss on.
        self.arm_peer_timeout(conn, side);
        true
    }

    /// Ends `side`: its unfinished sends are cancelled, its endpoint name is
    /// freed, and `ending` (if any: a crash ends silently) is reported.
    fn end_side(&mut self, conn: WireId, side: usize, ending: Option<Ending>) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let Some(s) = c.sides[side].as_mut() else {
            return;
        };
        if matches!(s.state, SideState::Gone) {
            return;
        }
        s.state = SideState::Gone;
        s.unbuffered = 0;
        let paused = s.rx != Rx::Running;
        let held = std::mem::take(&mut s.held);
        let (b, host, local, remote, id) = (s.backend, s.host, s.local, s.remote, s.handle);
        // Nothing more arrives here: stop waiting for this side's buffers.
        if let Some(pool) = s.recv.as_ref().map(|p| p.id) {
            if let Some(w) = self.blocked.get_mut(&pool) {
                w.remove(&(conn, 1 - side));
                if w.is_empty() {
                    self.blocked.remove(&pool);
                }
            }
        }
        // Sends not yet accepted are cancelled. Under the TCP profile the
        // accepted ones travel on (a local close delivers them) or are lost
        // with the receiver; they were reported completed already, or are
        // now, before the close.
        let p = &mut c.pipes[side];
        let completed = std::mem::take(&mut p.completing);
        p.completing_slots = 0;
        p.copied_from.clear();
        let keys: Vec<u64> = if c.tcp {
            p.queue.iter().skip(p.accepted).map(|m| m.key).collect()
        } else {
            p.queue.iter().map(|m| m.key).collect()
        };
        let keep = if c.tcp && ending.is_some() {
            p.accepted
        } else {
            0
        };
        p.queue.truncate(keep);
        if keep == 0 {
            // Nothing of this side travels on: no window is in use.
            p.accepted = 0;
            p.window = 0;
        }
        let all_gone = c.sides.iter().all(|s| {
            s.as_ref()
                .is_none_or(|s| matches!(s.state, SideState::Gone))
        });
        if all_gone {
            self.conns.remove(&conn);
        }
        self.backends[b].conns.remove(id);
        // Held messages are dropped with the connection. A side that ends
        // while paused also loses what its paused loop still holds for it:
        // those messages came after the pause and no pause lets them
        // through. (A running side hears them before the close.)
        for (buf, pool) in held {
            self.release_recv(buf, pool);
        }
        if paused {
            self.drop_held_data(host, conn, side);
        }
        let h = self.host_mut(host);
        let ports = if side == 0 {
            &mut h.ports
        } else {
            &mut h.accepted_ports
        };
        if let Some(n) = ports.get_mut(&local.port()) {
            *n -= 1;
            if *n == 0 {
                ports.remove(&local.port());
            }
        }
        if !completed.is_empty() && ending.is_some() {
            self.sched.emit(
                &self.backends,
                b,
                NetEv::Completed(id, Keys::List(completed)),
            );
        }
        match ending {
            Some(Ending::Closed(reason)) => {
                self.sched
                    .emit(&self.backends, b, NetEv::Closed(id, remote, reason, keys))
            }
            Some(Ending::Refused(reason)) => {
                self.sched
                    .emit(&self.backends, b, NetEv::Refused(id, remote, reason))
            }
            None => self.sched.log(
                host,
                format_args!("b{b} vanished {id} {remote} lost={keys:?}"),
            ),
        }
    }

    /// Marks `side` as ending with `ending` and reports it at once (as an
    /// event, never from inside the caller); tells the peer with `peer`.
    fn begin_end(&mut self, conn: WireId, side: usize, ending: Ending, peer: Option<CloseReason>) {
        let Some(s) = self.side_mut(conn, side) else {
            return;
        };
        if !matches!(s.state, SideState::Open | SideState::Connecting) {
            return;
        }
        s.state = SideState::Closing(ending);
        let now = self.sched.now;
        self.sched.schedule(now, Ev::Finish { conn, side });
        if let Some(reason) = peer {
            let other = 1 - side;
            if matches!(
                self.side(conn, other).map(|s| &s.state),
                Some(SideState::Open | SideState::Connecting)
            ) {
                self.send_ctrl(conn, other, Ctrl::Close(reason));
            }
        }
    }

    fn deliver(&mut self, conn: WireId, dir: usize) {
        let now = self.sched.now;
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.pipes[dir].wake != Some(now) {
            return; // superseded by an earlier wake-up
        }
        let cut = self.blocked_between(c.hosts[0], c.hosts[1]);
        let World {
            conns,
            sched,
            backends,
            blocked,
            ..
        } = self;
        let c = conns.get_mut(&conn).expect("exists");
        c.pipes[dir].wake = None;
        let tcp = c.tcp;
        let rx_host = c.hosts[1 - dir];
        let (tx_side, rx_side) = if dir == 0 {
            let [a, b] = &mut c.sides;
            (a, b)
        } else {
            let [a, b] = &mut c.sides;
            (b, a)
        };
        let (Some(tx), Some(rx)) = (tx_side.as_mut(), rx_side.as_mut()) else {
            return;
        };
        let p = &mut c.pipes[dir];
        // Under the TCP profile what the sender's kernel accepted travels
        // on after the sender closed.
        let tx_ok = matches!(tx.state, SideState::Open) || (tcp && p.accepted > 0);
        if !tx_ok || !matches!(rx.state, SideState::Open) || rx.rx != Rx::Running || cut {
            // Resumed by establishment, heal or resume_receive, or purged
            // by close.
            return;
        }
        p.blocked = false;
        let (rx_b, rx_id) = (rx.backend, rx.handle);
        let Some(pool) = rx.recv.as_ref() else {
            if !p.queue.is_empty() {
                let reason =
                    CloseReason::Protocol("message on a connection without receive buffers".into());
                self.begin_end(
                    conn,
                    1 - dir,
                    Ending::Closed(reason),
                    Some(CloseReason::PeerClosed),
                );
            }
            return;
        };
        // Each message taken is reported at once (`on_data`, in order);
        // under the RDMA profile their completions follow in one batch.
        // The first key inline, a list from the second on.
        let mut first_key = None;
        let mut more_keys: Option<Vec<u64>> = None;
        // Where this delivery's trace lines begin, should a message too
        // large have to be named before them.
        let mark = sched.trace.as_ref().map(String::len);
        let mut freed = false;
        let mut too_large = None;
        while let Some(head) = p.queue.front() {
            if tcp && p.accepted == 0 {
                break; // still in the sender's queue: admitted later
            }
            if head.arrival > now {
                let at = head.arrival;
                Self::kick_pipe(sched, conn, p, dir, at);
                break;
            }
            let len = head.body.len();
            if len > pool.pool.buf_size() {
                too_large = Some(len);
                break;
            }
            let spare = if rx.recv_own { rx.spare.take() } else { None };
            let Some(mut buf) = spare.or_else(|| pool.pool.get()) else {
                p.blocked = true;
                blocked.entry(pool.id).or_default().insert((conn, dir));
                break;
            };
            head.body.write_into(&mut buf);
            let (key, slot) = (head.key, !matches!(head.body, Body::Buffer(_)));
            // Taken: what it was sent from (under RDMA) is free again.
            p.queue.pop_front();
            if tcp {
                p.accepted -= 1;
                p.window -= len;
                freed = true;
            } else {
                if slot {
                    tx.unbuffered -= 1;
                }
                match (first_key, &mut more_keys) {
                    (None, _) => first_key = Some(key),
                    (Some(_), Some(more)) => more.push(key),
                    (Some(k), None) => {
                        let mut more = sched.key_list();
                        more.extend([k, key]);
                        more_keys = Some(more);
                    }
                }
            }
            let m = DataMsg {
                conn: rx_id,
                buf,
                pool: pool.id,
                wire: conn,
                side: 1 - dir,
            };
            sched.emit_data(backends, rx_b, m, &rx.remote);
        }
        let tx_b = tx.backend;
        let tx_id = tx.handle;
        let drained = tcp && p.accepted == 0;
        let pool_limit = pool.pool.buf_size();
        if let Some(len) = too_large {
            // Named before the messages taken at this delivery, as their
            // report follows the check.
            if let (Some(mark), Some(t)) = (mark, sched.trace.as_mut()) {
                let mut line = String::new();
                Sched::write_line(
                    &mut line,
                    now,
                    rx_host,
                    format_args!("b{rx_b} too large from {} len={len}", rx.remote),
                );
                t.insert_str(mark, &line);
            }
        }
        let keys = match (first_key, more_keys) {
            (_, Some(list)) => Some(Keys::List(list)),
            (Some(k), None) => Some(Keys::One(k)),
            (None, None) => None,
        };
        if let Some(keys) = keys {
            sched.emit(backends, tx_b, NetEv::Completed(tx_id, keys));
        }
        if let Some(len) = too_large {
            let reason = CloseReason::MessageTooLarge {
                size: len as u64,
                limit: pool_limit,
            };
            self.begin_end(
                conn,
                1 - dir,
                Ending::Closed(reason),
                Some(CloseReason::PeerClosed),
            );
            return;
        }
        if freed {
            // The sends the freed room lets in complete in this step,
            // reported after the messages taken.
            self.admit(conn, dir, true);
            self.complete(conn, dir);
        }
        // An orderly close that came behind the data is reported once the
        // data is taken.
        if drained
            && self
                .side(conn, 1 - dir)
                .is_some_and(|s| s.deferred_close && s.rx == Rx::Running)
        {
            self.sched.schedule(
                now,
                Ev::DeferredClose {
                    conn,
                    side: 1 - dir,
                },
            );
        }
    }

    /// TCP profile: accepts queued messages of pipe `dir` into the window
    /// while there is room (a message larger than the window goes alone
    /// into an empty one). An accepted send completes now: its bytes are
    /// copied (the buffer or region is free again), its queue slot freed.
    /// The completions are reported by an `Ev::Complete` at the current
    /// instant, or, with `reported`, by the caller's own call of
    /// [`complete`](Self::complete) in the same step (a delivery that
    /// freed room in the window: no event of its own for them).
    fn admit(&mut self, conn: WireId, dir: usize, reported: bool) {
        let now = self.sched.now;
        let cap = self.tcp_window;
        let World {
            conns,
            links,
            link_at,
            sched,
            ..
        } = self;
        let Some(c) = conns.get_mut(&conn) else {
            return;
        };
        if !c.tcp
            || !c.sides[dir]
                .as_ref()
                .is_some_and(|s| matches!(s.state, SideState::Open))
        {
            return;
        }
        let base = match c.route[dir] {
            Some(r) => links[r.link].latency,
            None => link_at.get(&(c.hosts[dir], c.hosts[1 - dir])).map_or_else(
                || nanos(LinkConfig::default().latency),
                |&i| links[i].latency,
            ),
        };
        let p = &mut c.pipes[dir];
        let start = p.accepted;
        // Bytes cannot leave before they were handed over, nor before the
        // message accepted before them.
        let mut prev = p.queue.get(start.wrapping_sub(1)).map_or(0, |m| m.arrival);
        // The arrival of the first message accepted now.
        let mut first = None;
        while let Some(m) = p.queue.get_mut(p.accepted) {
            let len = m.body.len();
            if p.window > 0 && p.window + len > cap {
                break;
            }
            p.window += len;
            p.accepted += 1;
            let slot = match m.body {
                Body::Copy(_) => true,
                Body::Buffer(_) | Body::ZeroCopy { .. } => {
                    let copied = m.body.copied();
                    let from = std::mem::replace(&mut m.body, Body::Copy(copied));
                    let slot = !matches!(from, Body::Buffer(_));
                    p.copied_from.push(from);
                    slot
                }
            };
            m.arrival = m.arrival.max(now + base).max(prev);
            prev = m.arrival;
            first.get_or_insert(prev);
            p.completing.push(m.key);
            p.completing_slots += usize::from(slot);
        }
        // Nothing waits to be accepted, or the next does not fit.
        let Some(at) = first else {
            return;
        };
        if !reported && p.completing.len() == p.accepted - start {
            sched.schedule(now, Ev::Complete { conn, dir });
        }
        if !p.blocked {
            Self::kick_pipe(sched, conn, p, dir, at);
        }
    }

    /// TCP profile: reports the sends of pipe `dir` accepted since the last
    /// report, in one batch.
    fn complete(&mut self, conn: WireId, dir: usize) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        let p = &mut c.pipes[dir];
        if p.completing.is_empty() {
            return;
        }
        // Buffers return to their pools, regions are no longer lent.
        if !p.copied_from.is_empty() {
            p.copied_from.clear();
        }
        let slots = std::mem::take(&mut p.completing_slots);
        let Some(tx) = c.sides[dir].as_mut() else {
            p.completing.clear();
            return;
        };
        tx.unbuffered -= slots;
        // A single key goes inline; a list goes with the report and the
        // pipe takes a spare one.
        let keys = if let [k] = p.completing[..] {
            p.completing.clear();
            Keys::One(k)
        } else {
            Keys::List(std::mem::replace(&mut p.completing, self.sched.key_list()))
        };
        let (b, id) = (tx.backend, tx.handle);
        self.sched
            .emit(&self.backends, b, NetEv::Completed(id, keys));
    }

    /// A receive buffer of `pool` is free again: pipes waiting for one
    /// resume.
    #[inline]
    pub(crate) fn release_recv(&mut self, buf: NetworkBuffer, pool: PoolId) {
        drop(buf);
        self.recv_freed(pool);
    }

    /// Pipes waiting for a receive buffer of `pool` resume. Inlined: usually
    /// no pipe waits.
    #[inline(always)]
    fn recv_freed(&mut self, pool: PoolId) {
        if !self.blocked.is_empty() {
            self.wake_blocked(pool);
        }
    }

    /// [`recv_freed`](Self::recv_freed) when some pipe waits.
    fn wake_blocked(&mut self, pool: PoolId) {
        let Some(waiting) = self.blocked.remove(&pool) else {
            return;
        };
        let now = self.sched.now;
        for (conn, dir) in waiting {
            if let Some(c) = self.conns.get_mut(&conn) {
                if c.pipes[dir].blocked {
                    c.pipes[dir].blocked = false;
                    Self::kick(&mut self.sched, conn, c, dir, now);
                }
            }
        }
    }

    /// After `on_data` of backend `b` returned: frees message `m`'s buffer
    /// now, or after its host's slow-receiver delay. A buffer of its side's
    /// own pool freed now is kept by the side for its next message.
    /// Inlined into the driver, which calls it after every `on_data`.
    #[inline(always)]
    pub(crate) fn recv_done(&mut self, b: BackendId, m: DataMsg) {
        let h = &self.hosts.list[self.backends[b].hix];
        let slow = h.slow;
        if slow > 0 && !h.crashed {
            let at = self.sched.now + slow;
            self.sched.schedule(
                at,
                Ev::Release {
                    buf: Box::new(m.buf),
                    pool: m.pool,
                },
            );
            return;
        }
        let DataMsg {
            buf,
            pool,
            wire,
            side,
            ..
        } = m;
        match self.side_mut(wire, side) {
            Some(s) if s.recv_own && s.spare.is_none() => {
                debug_assert!(s.recv.as_ref().is_some_and(|p| p.id == pool));
                let mut buf = buf;
                buf.clear();
                s.spare = Some(buf);
                self.recv_freed(pool);
            }
            _ => self.release_recv(buf, pool),
        }
    }

    // -- backend operations ---------------------------------------------------

    pub(crate) fn op_listen(
        &mut self,
        b: BackendId,
        addr: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<EndpointAddress, OpenListenError> {
        if !self.thread_ok(b) {
            return Err(OpenListenError::WrongThread);
        }
        addr.validate_listen()
            .map_err(|reason| OpenListenError::InvalidEndpointAddress {
                address: addr,
                reason,
            })?;
        let be = &self.backends[b];
        params
            .validate(&be.config)
            .map_err(OpenListenError::InvalidConnectionParameters)?;
        let ip = be.host;
        let own_pool =
            params.recv.use_shared_pool && params.recv.num_buf > 0 && params.recv.buf_size > 0;
        if params.recv.use_shared_pool && !own_pool && be.shared_recv.is_none() {
            return Err(OpenListenError::InvalidConnectionParameters(
                "use_shared_pool on a listen endpoint needs recv.buf_size and recv.num_buf \
                 (its own pool) or a BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let fail = |kind, msg: String| OpenListenError::FailedOpenListenEndpoint {
            address: addr,
            source: failed(kind, msg),
        };
        if !self.backend_alive(b) {
            return Err(fail(
                io::ErrorKind::NotConnected,
                format!(
                    "simulated host {ip} has crashed (or restarted since this backend was made)"
                ),
            ));
        }
        if addr.ip() != ip && !addr.ip().is_unspecified() {
            return Err(fail(
                io::ErrorKind::AddrNotAvailable,
                format!("{} is not the address of simulated host {ip}", addr.ip()),
            ));
        }
        let port = if addr.port() == 0 {
            self.pick_port(ip)
                .ok_or_else(|| OpenListenError::NoResources {
                    address: addr,
                    source: failed(io::ErrorKind::AddrInUse, "no free port left".into()),
                })?
        } else {
            let h = &self.hosts[&ip];
            if let Some(l) = h.listeners.get(&addr.port()) {
                let l = &self.listeners[l];
                if l.backend == b && l.addr == addr {
                    return Err(OpenListenError::ListenEndpointAlreadyExists(addr));
                }
                return Err(fail(
                    io::ErrorKind::AddrInUse,
                    format!("port {} of {ip} is in use by another listener", addr.port()),
                ));
            }
            if h.ports.contains_key(&addr.port()) {
                return Err(fail(
                    io::ErrorKind::AddrInUse,
                    format!("port {} of {ip} is in use by a connection", addr.port()),
                ));
            }
            addr.port()
        };
        let pool = own_pool.then(|| self.new_pool(params.recv.buf_size, params.recv.num_buf));
        let bound = addr.with_port(port);
        self.next_listener += 1;
        let lid = self.next_listener;
        self.listeners.insert(
            lid,
            Listener {
                backend: b,
                host: ip,
                addr: bound,
                params,
                pool,
            },
        );
        self.host_mut(ip).listeners.insert(port, lid);
        self.backends[b].listens.insert(bound, lid);
        self.sched.log(ip, format_args!("b{b} listen {bound}"));
        Ok(bound)
    }

    pub(crate) fn op_connect(
        &mut self,
        b: BackendId,
        addr: EndpointAddress,
        params: ConnectionParams,
    ) -> Result<ConnId, OpenActiveError> {
        if !self.thread_ok(b) {
            return Err(OpenActiveError::WrongThread);
        }
        addr.validate_remote()
            .map_err(|reason| OpenActiveError::InvalidEndpointAddress {
                address: addr,
                reason,
            })?;
        let be = &self.backends[b];
        params
            .validate(&be.config)
            .map_err(OpenActiveError::InvalidConnectionParameters)?;
        if params.recv.use_shared_pool && be.shared_recv.is_none() {
            return Err(OpenActiveError::InvalidConnectionParameters(
                "recv.use_shared_pool on an active endpoint needs \
                 BackendConfig::shared_receive_pool"
                    .into(),
            ));
        }
        let ip = be.host;
        if !self.backend_alive(b) {
            return Err(OpenActiveError::FailedOpenActiveEndpoint {
                address: addr,
                source: failed(
                    io::ErrorKind::NotConnected,
                    format!(
                        "simulated host {ip} has crashed (or restarted since this backend was made)"
                    ),
                ),
            });
        }
        let port =
            self.pick_connect_port(ip, addr)
                .map_err(|msg| OpenActiveError::NoResources {
                    address: addr,
                    source: failed(io::ErrorKind::AddrInUse, msg),
                })?;
        let local = EndpointAddress::new(ip, port);
        self.next_conn += 1;
        let conn = self.next_conn;
        let side = self.make_side(b, conn, 0, local, addr, &params, None);
        let id = side.handle;
        *self.host_mut(ip).ports.entry(port).or_default() += 1;
        self.conns.insert(
            conn,
            Conn {
                hosts: [ip, addr.ip()],
                target: addr,
                sides: [Some(side), None],
                pipes: Default::default(),
                ctrl_last: [0; 2],
                listener: None,
                tcp: self.backends[b].config.mode == NetworkMode::Tcp,
                route: [None; 2],
            },
        );
        self.sched
            .log(ip, format_args!("b{b} connect {id} {addr} from {local}"));
        let at = self.sched.now + self.connect_timeout;
        self.sched.schedule(at, Ev::ConnectTimeout { conn });
        self.send_ctrl(conn, 1, Ctrl::Syn);
        Ok(id)
    }

    pub(crate) fn op_close_listen(
        &mut self,
        b: BackendId,
        addr: EndpointAddress,
    ) -> Result<(), CloseError> {
        if !self.thread_ok(b) {
            return Err(CloseError::WrongThread);
        }
        let lid = self.backends[b]
            .listens
            .remove(&addr)
            .ok_or(CloseError::UnknownListenEndpoint(addr))?;
        let l = self.listeners.remove(&lid).expect("listener of a backend");
        self.host_mut(l.host).listeners.remove(&l.addr.port());
        self.sched
            .log(l.host, format_args!("b{b} close listen {addr}"));
        let accepted: Vec<WireId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.listener == Some(lid))
            .map(|(id, _)| id)
            .collect();
        for conn in accepted {
            if matches!(
                self.side(conn, 1).map(|s| &s.state),
                Some(SideState::Connecting)
            ) {
                // Not reported yet: dropped without a word, the initiator
                // hears the close.
                self.end_side(conn, 1, None);
                self.send_ctrl(conn, 0, Ctrl::Close(CloseReason::PeerClosed));
                continue;
            }
            self.app_close(conn, 1);
            self.begin_end(
                conn,
                1,
                Ending::Closed(CloseReason::ListenerClosed),
                Some(CloseReason::PeerClosed),
            );
        }
        Ok(())
    }

    /// `true` if the application knows side `side` by its handle: an
    /// accepted side is named from its establishment on.
    fn named(s: &Side, side: usize) -> bool {
        side == 0 || !matches!(s.state, SideState::Connecting)
    }

    /// The connection backend `b` names `id` (opening, open or accepted;
    /// still ending after a fault is fine), checking the calling thread.
    #[inline]
    fn conn_of(&self, b: BackendId, id: ConnId) -> Result<(WireId, usize), Lookup> {
        if !self.thread_ok(b) {
            return Err(Lookup::WrongThread);
        }
        let e = self.backends[b].conns.get(id).ok_or(Lookup::Unknown(id))?;
        match self.side(e.wire, e.side) {
            Some(s) if Self::named(s, e.side) => Ok((e.wire, e.side)),
            _ => Err(Lookup::Unknown(id)),
        }
    }

    /// The open side backend `b` names `id` (not one still opening).
    #[inline]
    fn open_side(&self, b: BackendId, id: ConnId) -> Result<(WireId, usize), Lookup> {
        self.open_side_ref(b, id)
            .map(|(conn, side, _)| (conn, side))
    }

    /// [`open_side`](Self::open_side) with the side itself (one lookup of
    /// it). An open side is named, so `conn_of`'s check is implied.
    #[inline]
    fn open_side_ref(&self, b: BackendId, id: ConnId) -> Result<(WireId, usize, &Side), Lookup> {
        if !self.thread_ok(b) {
            return Err(Lookup::WrongThread);
        }
        let e = self.backends[b].conns.get(id).ok_or(Lookup::Unknown(id))?;
        match self.side(e.wire, e.side) {
            Some(s) if matches!(s.state, SideState::Open) => Ok((e.wire, e.side, s)),
            _ => Err(Lookup::Unknown(id)),
        }
    }

    pub(crate) fn op_close(&mut self, b: BackendId, id: ConnId) -> Result<(), CloseError> {
        let (conn, side) = self.conn_of(b, id)?;
        let s = self.side(conn, side).expect("side of a live handle");
        let host = s.host;
        let ending = match s.state {
            SideState::Connecting => Ending::Refused(RefuseReason::Cancelled),
            SideState::Open => Ending::Closed(CloseReason::Local),
            _ => {
                // Already ending (a fault or a protocol error); reported
                // once. The handle is dead from now on all the same.
                self.app_close(conn, side);
                self.backends[b].conns.remove(id);
                return Ok(());
            }
        };
        self.sched.log(host, format_args!("b{b} close {id}"));
        self.app_close(conn, side);
        self.begin_end(conn, side, ending, Some(CloseReason::PeerClosed));
        // The handle is dead for the application at the call: further
        // operations with it fail (this connection's report comes later,
        // as an event).
        self.backends[b].conns.remove(id);
        Ok(())
    }

    pub(crate) fn op_get_buffer(
        &mut self,
        b: BackendId,
        id: ConnId,
    ) -> Result<Option<NetworkBuffer>, BufferError> {
        Ok(self.send_pool(b, id)?.pool.get())
    }

    pub(crate) fn op_available(&mut self, b: BackendId, id: ConnId) -> Result<usize, BufferError> {
        Ok(self.send_pool(b, id)?.pool.take_low_water())
    }

    fn send_pool(&mut self, b: BackendId, id: ConnId) -> Result<Pool, BufferError> {
        let (conn, side) = self.open_side(b, id)?;
        self.side(conn, side)
            .and_then(|s| s.send.clone())
            .ok_or(BufferError::NoBuffersAllocated(id))
    }

    pub(crate) fn op_send_buffer(
        &mut self,
        b: BackendId,
        id: ConnId,
        buf: NetworkBuffer,
        key: u64,
    ) -> Result<(), SendError> {
        let (conn, side) = self.open_side(b, id)?;
        let s = self.side(conn, side).expect("open side");
        if !s.send.as_ref().is_some_and(|p| p.pool.owns(&buf)) {
            return Err(SendError::ForeignBuffer);
        }
        self.enqueue(conn, side, key, Body::Buffer(buf));
        Ok(())
    }

    pub(crate) fn op_send_data(
        &mut self,
        b: BackendId,
        id: ConnId,
        data: &[RegionSlice],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let (conn, side) = self.open_side(b, id)?;
        let max_len = MAX_HEADER_LEN;
        if header.len() > max_len {
            return Err(SendError::HeaderTooLong {
                len: header.len(),
                max: max_len,
            });
        }
        let s = self.side(conn, side).expect("open side");
        let region = s.region.as_ref().ok_or(SendError::NotSupported(
            "zero-copy sending needs a registered region (ConnectionParams::with_zero_copy)",
        ))?;
        let lent = region.lend(data).map_err(|_| SendError::OutsideRegion)?;
        if s.unbuffered >= self.backends[b].config.send_queue_depth {
            return Err(SendError::NoResources);
        }
        let mut h = [0u8; MAX_HEADER_LEN];
        h[..header.len()].copy_from_slice(header);
        self.enqueue(
            conn,
            side,
            key,
            Body::ZeroCopy {
                header: h,
                header_len: header.len(),
                lent,
            },
        );
        Ok(())
    }

    pub(crate) fn op_send_copy(
        &mut self,
        b: BackendId,
        id: ConnId,
        data: &[&[u8]],
        header: &[u8],
        key: u64,
    ) -> Result<(), SendError> {
        let (conn, side, s) = self.open_side_ref(b, id)?;
        if header.len() > MAX_HEADER_LEN {
            return Err(SendError::HeaderTooLong {
                len: header.len(),
                max: MAX_HEADER_LEN,
            });
        }
        if s.unbuffered >= self.backends[b].config.send_queue_depth {
            return Err(SendError::NoResources);
        }
        self.enqueue(conn, side, key, Body::Copy(Copied::of(header, data)));
        Ok(())
    }

    /// Puts a message on the wire: it leaves once the sender's NIC and the
    /// link are free (taking its serialisation time on the slower of them),
    /// travels the link's latency, and is taken in by the receiver's NIC
    /// once that is free (incast: several senders share it); it never
    /// arrives before earlier messages of the same connection. Under the
    /// TCP profile it then waits for room in the window (see `admit`).
    fn enqueue(&mut self, conn: WireId, side: usize, key: u64, body: Body) {
        if self.conns[&conn].route[side].is_none() {
            self.make_route(conn, side);
        }
        let len = body.len();
        let now = self.sched.now;
        let gen = self.model_gen;
        let cap = self.tcp_window;
        let World {
            conns,
            links,
            nics,
            sched,
            ..
        } = self;
        let c = conns.get_mut(&conn).expect("a live connection");
        let route = c.route[side].as_mut().expect("made above");
        let link = &mut links[route.link];
        // The packet's latency, jitter included (as `latency` draws it).
        let lat = link.latency + sched.rng.below(link.jitter + 1);
        if route.gen != gen || route.len != len {
            route.link_tx = serialise_ns(len, link.cfg.bandwidth_bytes_per_sec);
            route.nic_tx = serialise_ns(len, nics[route.out].cfg.send_bytes_per_sec);
            route.nic_rx = serialise_ns(len, nics[route.inc].cfg.receive_bytes_per_sec);
            route.gen = gen;
            route.len = len;
        }
        let (link_tx, nic_tx, nic_rx) = (route.link_tx, route.nic_tx, route.nic_rx);
        let out = &mut nics[route.out];
        let start = now.max(link.free_at).max(out.tx_free_at);
        let sent = start.saturating_add(link_tx.max(nic_tx));
        out.tx_free_at = start.saturating_add(nic_tx);
        link.free_at = start.saturating_add(link_tx);
        let inc = &mut nics[route.inc];
        let first_bit = start.saturating_add(lat);
        let rx_start = first_bit.max(inc.rx_free_at);
        let arrived = rx_start
            .saturating_add(nic_rx)
            .max(sent.saturating_add(lat));
        inc.rx_free_at = rx_start.saturating_add(nic_rx);
        let s = c.sides[side].as_mut().expect("open side");
        if !matches!(body, Body::Buffer(_)) {
            s.unbuffered += 1;
        }
        let (host, id, b) = (s.host, s.handle, s.backend);
        let tcp = c.tcp;
        let p = &mut c.pipes[side];
        let arrival = arrived.max(p.last_arrival);
        p.last_arrival = arrival;
        p.queue.push_back(Msg { key, arrival, body });
        if sched.trace.is_some() {
            sched.log(
                host,
                format_args!("b{b} send {id} key={key} len={len} arrives={arrival}"),
            );
        }
        if tcp {
            // `admit` takes nothing while the first message waiting for
            // the window does not fit (usually one sent earlier).
            if !p.next_waits_for_room(cap) {
                self.admit(conn, side, false);
            }
        } else if !p.blocked {
            Self::kick_pipe(sched, conn, p, side, arrival);
        }
    }

    /// Looks up the link and network cards of direction `side` of `conn`
    /// (made with the default models if new) for its sends.
    #[cold]
    fn make_route(&mut self, conn: WireId, side: usize) {
        let c = &self.conns[&conn];
        let (src, dst) = (c.hosts[side], c.hosts[1 - side]);
        let r = Route {
            link: self.link_index(src, dst),
            out: self.nic_index(src),
            inc: self.nic_index(dst),
            gen: u64::MAX,
            len: 0,
            link_tx: 0,
            nic_tx: 0,
            nic_rx: 0,
        };
        if let Some(c) = self.conns.get_mut(&conn) {
            c.route[side] = Some(r);
        }
    }

    /// Marks a side closed by the application and drops the messages its
    /// paused loop still holds for it.
    fn app_close(&mut self, conn: WireId, side: usize) {
        let Some(s) = self.side_mut(conn, side) else {
            return;
        };
        s.app_closed = true;
        let host = s.host;
        // What a paused side held is dropped.
        let held = std::mem::take(&mut s.held);
        for (buf, pool) in held {
            self.release_recv(buf, pool);
        }
        self.drop_held_data(host, conn, side);
    }

    /// Drops the messages for side `side` of `conn` that the paused loop of
    /// `host` holds back, returning their receive buffers: the side is
    /// closed and must hear nothing more.
    fn drop_held_data(&mut self, host: IpAddr, conn: WireId, side: usize) {
        let h = self.host_mut(host);
        if h.held_calls.is_empty() {
            return;
        }
        let (dropped, kept): (Vec<Call>, Vec<Call>) = std::mem::take(&mut h.held_calls)
            .into_iter()
            .partition(|call| {
                matches!(call, Call::Net { ev: NetEv::Data(m), .. }
                        if m.wire == conn && m.side == side)
            });
        h.held_calls = kept;
        for call in dropped {
            if let Call::Net {
                ev: NetEv::Data(m), ..
            } = call
            {
                self.release_recv(m.buf, m.pool);
            }
        }
    }

    /// Connections and listeners the world still keeps.
    pub(crate) fn live_objects(&self) -> usize {
        self.conns.len() + self.listeners.len()
    }

    pub(crate) fn memory_usage(&self, b: BackendId) -> MemoryUsage {
        let be = &self.backends[b];
        let mut recv: BTreeMap<PoolId, usize> = BTreeMap::new();
        let mut send: BTreeMap<PoolId, usize> = BTreeMap::new();
        let add = |m: &mut BTreeMap<PoolId, usize>, p: &Option<Pool>| {
            if let Some(p) = p {
                m.insert(p.id, p.pool.bytes());
            }
        };
        add(&mut recv, &be.shared_recv);
        add(&mut send, &be.shared_send);
        for lid in be.listens.values() {
            add(&mut recv, &self.listeners[lid].pool);
        }
        for (_, e) in be.conns.iter() {
            if let Some(s) = self.side(e.wire, e.side) {
                add(&mut recv, &s.recv);
                add(&mut send, &s.send);
            }
        }
        MemoryUsage {
            receive_bytes: recv.values().sum(),
            send_bytes: send.values().sum(),
        }
    }

    // -- faults ----------------------------------------------------------------

    pub(crate) fn refuse(&mut self, host: IpAddr, refuse: bool) {
        self.host_mut(host).refusing = refuse;
        self.sched
            .log(host, format_args!("fault refuse_connections={refuse}"));
    }

    pub(crate) fn slow(&mut self, host: IpAddr, per_message: Duration) {
        self.host_mut(host).slow = nanos(per_message);
        self.sched
            .log(host, format_args!("fault slow_receiver {per_message:?}"));
    }

    fn conns_between(&self, a: IpAddr, b: IpAddr) -> Vec<WireId> {
        self.conns
            .iter()
            .filter(|(_, c)| c.between(a, b))
            .map(|(id, _)| id)
            .collect()
    }

    pub(crate) fn reset(&mut self, a: IpAddr, b: IpAddr) {
        self.sched.log(a, format_args!("fault reset {b}"));
        for conn in self.conns_between(a, b) {
            for side in 0..2 {
                let ending = match self.side(conn, side).map(|s| &s.state) {
                    Some(SideState::Open) => Ending::Closed(CloseReason::Reset),
                    Some(SideState::Connecting) if side == 0 => {
                        Ending::Refused(RefuseReason::Refused)
                    }
                    Some(SideState::Connecting) => {
                        self.end_side(conn, side, None);
                        continue;
                    }
                    _ => continue,
                };
                self.begin_end(conn, side, ending, None);
            }
        }
    }

    pub(crate) fn partition(&mut self, a: IpAddr, b: IpAddr) {
        if a == b || self.partitions.contains_key(&pair(a, b)) {
            return;
        }
        let now = self.sched.now;
        self.partitions.insert(pair(a, b), now);
        self.sched.log(a, format_args!("fault partition {b}"));
        for conn in self.conns_between(a, b) {
            for side in 0..2 {
                self.arm_peer_timeout(conn, side);
            }
        }
    }

    pub(crate) fn heal(&mut self, a: IpAddr, b: IpAddr) {
        if self.partitions.remove(&pair(a, b)).is_none() {
            return;
        }
        self.sched.log(a, format_args!("fault heal {b}"));
        self.unblock(a, b);
    }

    /// Holds the traffic between `a` and `b` (see `Sim::hold`).
    pub(crate) fn hold_between(&mut self, a: IpAddr, b: IpAddr) {
        if a != b && self.holds.insert(pair(a, b)) {
            self.sched.log(a, format_args!("fault hold {b}"));
        }
    }

    /// Releases what `hold_between` held.
    pub(crate) fn release_between(&mut self, a: IpAddr, b: IpAddr) {
        if self.holds.remove(&pair(a, b)) {
            self.sched.log(a, format_args!("fault release {b}"));
            self.unblock(a, b);
        }
    }

    /// Every cut and hold between `a` and `b` ended: what waited moves on,
    /// one latency from now.
    fn unblock(&mut self, a: IpAddr, b: IpAddr) {
        if self.blocked_between(a, b) {
            return; // still partitioned, or still held
        }
        let now = self.sched.now;
        for conn in self.conns_between(a, b) {
            for dir in 0..2 {
                let c = &self.conns[&conn];
                let lat = self.latency(c.hosts[dir], c.hosts[1 - dir]);
                let c = self.conns.get_mut(&conn).expect("exists");
                let p = &mut c.pipes[dir];
                for m in p.queue.iter_mut() {
                    m.arrival = m.arrival.max(now + lat);
                }
                p.last_arrival = p.last_arrival.max(now + lat);
                if let Some(at) = p.queue.front().map(|m| m.arrival) {
                    if !p.blocked {
                        Self::kick(&mut self.sched, conn, c, dir, at);
                    }
                }
            }
        }
        let mut release = Vec::new();
        let mut keep = Vec::new();
        for h in std::mem::take(&mut self.held) {
            match self.conns.get(&h.conn) {
                Some(c) if c.between(a, b) => release.push(h),
                Some(_) => keep.push(h),
                None => {} // the connection is gone: nobody to tell
            }
        }
        self.held = keep;
        for h in release {
            self.send_ctrl(h.conn, h.to, h.pkt);
        }
    }

    /// Crashes `host`; its peers hear a reset if `reset`, else nothing
    /// (they time out if they have a `peer_timeout`).
    /// Ends the world: every backend gives up its handler, and every
    /// callback of every loop (timers, signals, posted closures, calls held
    /// or pending) is taken, so nothing runs any more. Returned for the
    /// caller to drop after unlocking: what an application's handlers and
    /// callbacks hold (async tasks holding their backends, which hold the
    /// world) goes with them.
    pub(crate) fn shut_down(&mut self) -> Remains {
        let mut dead = Remains::default();
        for be in &mut self.backends {
            Self::retire(be, &mut dead);
        }
        self.hosts
            .for_each_mut(|h| dead.calls.append(&mut h.held_calls));
        dead.calls.append(&mut self.sched.calls);
        dead.queue = std::mem::take(&mut self.sched.queue);
        let timers: Vec<u64> = self.timers.keys().copied().collect();
        dead.callbacks
            .extend(timers.into_iter().filter_map(|id| self.remove_timer(id)));
        let signals: Vec<u64> = self.signals.keys().copied().collect();
        dead.callbacks
            .extend(signals.into_iter().filter_map(|id| self.remove_signal(id)));
        dead
    }

    pub(crate) fn crash(&mut self, host: IpAddr, reset: bool) -> Remains {
        let mut dead = Remains::default();
        let h = self.host_mut(host);
        if h.crashed {
            return dead;
        }
        h.crashed = true;
        let lids: Vec<ListenerId> = std::mem::take(&mut h.listeners).into_values().collect();
        self.sched.log(
            host,
            format_args!("fault crash{}", if reset { "" } else { " silently" }),
        );
        for lid in lids {
            if let Some(l) = self.listeners.remove(&lid) {
                self.backends[l.backend].listens.remove(&l.addr);
            }
        }
        let ids: Vec<WireId> = self.conns.iter().map(|(id, _)| id).collect();
        for conn in ids {
            for side in 0..2 {
                if self.side(conn, side).is_some_and(|s| s.host == host) {
                    self.end_side(conn, side, None);
                    let other = 1 - side;
                    if self.side(conn, other).is_some_and(|s| {
                        s.host != host && matches!(s.state, SideState::Open | SideState::Connecting)
                    }) {
                        if reset {
                            self.send_ctrl(conn, other, Ctrl::Close(CloseReason::Reset));
                        } else if other == 1
                            && self
                                .side(conn, other)
                                .is_some_and(|s| matches!(s.state, SideState::Connecting))
                        {
                            // Never named to its application: dropped.
                            self.end_side(conn, other, None);
                        } else {
                            let now = self.sched.now;
                            if let Some(s) = self.side_mut(conn, other) {
                                s.peer_lost = Some(now);
                            }
                            self.arm_peer_timeout(conn, other);
                        }
                    }
                }
            }
        }
        // The host's application is gone with it: its backends' handlers
        // (and with an async handler its tasks) and what its paused loop
        // held back, returned for the caller to drop after unlocking.
        let inc = self.host_mut(host).incarnation;
        for be in &mut self.backends {
            if be.host == host && be.incarnation == inc {
                Self::retire(be, &mut dead);
            }
        }
        let held = std::mem::take(&mut self.host_mut(host).held_calls);
        for call in held {
            match call {
                Call::Net {
                    ev: NetEv::Data(m), ..
                } => self.release_recv(m.buf, m.pool),
                other => dead.calls.push(other),
            }
        }
        dead
    }

    // -- timers and signals ------------------------------------------------------

    pub(crate) fn add_timer(&mut self, host: IpAddr, f: UserFn) -> u64 {
        self.next_user_id += 1;
        let id = self.next_user_id;
        self.timers.insert(
            id,
            TimerState {
                host,
                f,
                gen: 0,
                period: 1,
                active: false,
            },
        );
        id
    }

    pub(crate) fn start_timer(&mut self, id: u64, period: Duration) {
        let now = self.sched.now;
        if let Some(t) = self.timers.get_mut(&id) {
            t.gen += 1;
            t.period = nanos(period).max(1);
            t.active = true;
            let (at, gen) = (now + t.period, t.gen);
            self.sched.schedule(at, Ev::Timer { id, gen });
        }
    }

    pub(crate) fn stop_timer(&mut self, id: u64) {
        if let Some(t) = self.timers.get_mut(&id) {
            t.gen += 1;
            t.active = false;
        }
    }

    pub(crate) fn timer_live(&self, id: u64, gen: u64) -> bool {
        self.timers
            .get(&id)
            .is_some_and(|t| t.active && t.gen == gen)
    }

    /// Removes a timer; the caller drops the callback after unlocking.
    pub(crate) fn remove_timer(&mut self, id: u64) -> Option<UserFn> {
        self.timers.remove(&id).map(|t| t.f)
    }

    pub(crate) fn add_signal(&mut self, host: IpAddr, f: UserFn) -> u64 {
        self.next_user_id += 1;
        let id = self.next_user_id;
        self.signals.insert(id, (host, f));
        id
    }

    pub(crate) fn fire_signal(&mut self, id: u64) {
        let now = self.sched.now;
        self.sched.schedule(now, Ev::Signal { id });
    }

    /// Removes a signal; the caller drops the callback after unlocking.
    pub(crate) fn remove_signal(&mut self, id: u64) -> Option<UserFn> {
        self.signals.remove(&id).map(|s| s.1)
    }
}

#[cfg(test)]
mod tests {
    use super::{serialise_ns, Entry, Ev, Queue};
    use crate::rng::Rng;

    #[test]
    fn the_queue_takes_events_in_key_order_small_or_large() {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;

        let mut rng = Rng::new(5);
        let mut q = Queue::default();
        let mut model = BinaryHeap::new();
        let mut seq = 0;
        let mut now = 0;
        // Grows past `LARGE` and shrinks below `SMALL` several times.
        for round in 0..2000u64 {
            let burst = if round % 300 < 150 { 3 } else { 1 };
            for _ in 0..burst {
                seq += 1;
                let (at, tie) = (now + rng.below(50), rng.below(4));
                q.push(Entry {
                    at,
                    tie,
                    seq,
                    ev: Ev::Signal { id: seq },
                });
                model.push(Reverse((at, tie, seq)));
            }
            for _ in 0..2 {
                assert_eq!(q.peek_at(), model.peek().map(|e| e.0 .0));
                assert_eq!(q.is_empty(), model.is_empty());
                let (Some(e), Some(Reverse(k))) = (q.pop(), model.pop()) else {
                    break;
                };
                assert_eq!(e.key(), k);
                now = e.at;
            }
        }
        while let Some(Reverse(k)) = model.pop() {
            assert_eq!(q.pop().map(|e| e.key()), Some(k));
        }
        assert!(q.pop().is_none());
    }

    #[test]
    fn serialisation_time_is_the_exact_rounded_up_quotient() {
        let exact = |len: usize, bw: u64| {
            if bw == 0 {
                0
            } else {
                u64::try_from((len as u128 * 1_000_000_000).div_ceil(u128::from(bw)))
                    .unwrap_or(u64::MAX)
            }
        };
        let lens = [
            0,
            1,
            63,
            64,
            65,
            1 << 20,
            18_446_744_073,
            18_446_744_074,
            usize::MAX,
        ];
        let bws = [
            0,
            1,
            3,
            999_999_999,
            1_000_000_000,
            10_000_000_000,
            u64::MAX,
        ];
        for len in lens {
            for bw in bws {
                assert_eq!(
                    serialise_ns(len, bw),
                    exact(len, bw),
                    "{len} bytes at {bw} B/s"
                );
            }
        }
    }
}
