//! One connection's state: its send queue and how it is written with
//! vectored writes, its reader, and the lingering state after a close.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;
use netio_core::mio_loop::SourceId;
use netio_core::{
    BufferPool, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress, Lent,
    NetworkBuffer, RefuseReason,
};

use crate::ring::{ByteRing, Completed, CopyQueue};
use crate::stats::{ConnStats, RecvCounters};
use crate::wire::{DataPrefix, FrameDecoder, FRAME_HEADER_LEN, HANDSHAKE_LEN};

/// Slices handed to one `writev`: many messages per system call.
pub(crate) const MAX_IOV: usize = 512;
/// The slices a flush gathers before it sets up [`MAX_IOV`] of them.
const SMALL_IOV: usize = 16;
/// `writev` calls per flush of one connection before others get a turn.
const MAX_WRITES_PER_FLUSH: usize = 16;
/// A handler event, collected under the state lock and dispatched after it
/// is released, on the loop thread.
#[derive(Debug)]
pub(crate) enum Ev {
    Established(ConnId, EndpointAddress, Capabilities),
    Refused(ConnId, EndpointAddress, RefuseReason),
    /// With the pool buffers of the cancelled sends, given back when the
    /// close is reported.
    Closed(
        ConnId,
        EndpointAddress,
        CloseReason,
        Vec<u64>,
        Vec<NetworkBuffer>,
    ),
    /// Consecutive completions of one connection, reported in one
    /// `on_sends_completed` call: their keys and pool buffers are the
    /// next ones in [`Events`].
    Completed(ConnId, Run),
    /// A handler timer is due.
    Timer(u64),
    /// `Backend::wake` was called.
    Wake(u64),
}

/// A run of completions of one connection (see [`Ev::Completed`]). What a
/// send holds until its completion is reported to the handler (a slot of
/// the connection's send queue depth, or its pool buffer) is given back
/// right before the report, so a handler never sees more sends in flight
/// than the depth or the pool allows, however long reporting takes, and
/// may send again from its callback.
#[derive(Debug)]
pub(crate) struct Run {
    /// Keys in the run.
    keys: usize,
    /// Pool buffers of its buffered sends.
    buffers: usize,
    /// Slots of its copy and zero-copy sends, given back to the
    /// connection's `slots_released`.
    slots: usize,
    in_flight: Option<Arc<AtomicUsize>>,
}

/// What a completed send gives back (see [`Run`]).
pub(crate) enum Release<'a> {
    /// Nothing (the connection is gone).
    Nothing,
    /// A copy or zero-copy send's slot: the connection's count of slots
    /// given back.
    Slot(&'a Arc<AtomicUsize>),
    /// A buffered send's buffer.
    Buffer(NetworkBuffer),
}

/// Handler events collected under the state lock and dispatched after it
/// is released, on the loop thread. Completions are kept compact: one
/// event per run of one connection, its keys and buffers in lists of
/// their own.
#[derive(Default)]
pub(crate) struct Events {
    list: Vec<Ev>,
    keys: Vec<u64>,
    buffers: Vec<NetworkBuffer>,
    /// The buffers of one run, given back together.
    run_buffers: Vec<NetworkBuffer>,
}

impl Conn {
    /// Copy and zero-copy sends accepted and not yet reported.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots_taken
            .wrapping_sub(self.slots_released.load(Ordering::Acquire))
    }
}

impl Events {
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub(crate) fn push(&mut self, ev: Ev) {
        self.list.push(ev);
    }

    /// The run of completions of `conn` at the end of `list`, started if
    /// the last event is not one.
    #[inline]
    fn run_of(list: &mut Vec<Ev>, conn: ConnId) -> &mut Run {
        if !matches!(list.last(), Some(Ev::Completed(c, _)) if *c == conn) {
            list.push(Ev::Completed(
                conn,
                Run {
                    keys: 0,
                    buffers: 0,
                    slots: 0,
                    in_flight: None,
                },
            ));
        }
        let Some(Ev::Completed(_, run)) = list.last_mut() else {
            unreachable!("the last event is a run of this connection");
        };
        run
    }

    /// A send of `conn` completed: joins the run before it when that run
    /// is `conn`'s.
    #[inline]
    pub(crate) fn completed(&mut self, conn: ConnId, key: u64, release: Release<'_>) {
        let run = Self::run_of(&mut self.list, conn);
        self.keys.push(key);
        run.keys += 1;
        match release {
            Release::Nothing => {}
            Release::Slot(n) => {
                if run.in_flight.is_none() {
                    run.in_flight = Some(Arc::clone(n));
                }
                run.slots += 1;
            }
            Release::Buffer(b) => {
                self.buffers.push(b);
                run.buffers += 1;
            }
        }
    }

    /// Sends of `conn` completed, in order, each giving back a slot of
    /// `in_flight`, their keys the second of each pair: joins the run
    /// before them when that run is `conn`'s.
    #[inline]
    pub(crate) fn completed_slots(
        &mut self,
        conn: ConnId,
        frames: &[(u64, u64)],
        in_flight: &Arc<AtomicUsize>,
    ) {
        let run = Self::run_of(&mut self.list, conn);
        self.keys.extend(frames.iter().map(|&(_, key)| key));
        run.keys += frames.len();
        run.slots += frames.len();
        if run.in_flight.is_none() {
            run.in_flight = Some(Arc::clone(in_flight));
        }
    }

    /// Hands every event to `f` in order, a completion run with its keys
    /// once its slots and buffers were given back; leaves `self` empty
    /// with its memory kept.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(Ev, &[u64])) {
        let mut keys_at = 0;
        let mut buffers = self.buffers.drain(..);
        for ev in self.list.drain(..) {
            if let Ev::Completed(_, run) = &ev {
                if run.buffers > 0 {
                    self.run_buffers.extend(buffers.by_ref().take(run.buffers));
                    NetworkBuffer::release_all(&mut self.run_buffers);
                }
                if let Some(n) = &run.in_flight {
                    n.fetch_add(run.slots, Ordering::AcqRel);
                }
                let keys = &self.keys[keys_at..keys_at + run.keys];
                keys_at += run.keys;
                f(ev, keys);
            } else {
                f(ev, &[]);
            }
        }
        drop(buffers);
        self.keys.clear();
    }

    /// The keys of every completion run, in order (for tests).
    #[cfg(test)]
    pub(crate) fn completed_keys(&self) -> &[u64] {
        &self.keys
    }
}

/// Copied frames' completions of one connection, into [`Events`].
struct ToEvents<'a> {
    events: &'a mut Events,
    conn: ConnId,
    in_flight: &'a Arc<AtomicUsize>,
}

impl Completed for ToEvents<'_> {
    #[inline]
    fn keys(&mut self, frames: &[(u64, u64)]) {
        self.events
            .completed_slots(self.conn, frames, self.in_flight);
    }

    fn buffered(&mut self, key: u64, buffer: NetworkBuffer) {
        self.events
            .completed(self.conn, key, Release::Buffer(buffer));
    }
}

/// The bytes of a message after its prefix.
pub(crate) enum Payload {
    /// `send_data`: straight from the registered region.
    Region(Lent),
    /// `send_buffer`: the pool buffer itself.
    Buffer(NetworkBuffer),
}

/// One item of a connection's send queue.
pub(crate) enum Out {
    /// This side's handshake.
    Handshake([u8; HANDSHAKE_LEN]),
    /// Copy sends (`send_data_copy`), one whole frame after the other in
    /// the connection's [`CopyQueue`]: their total length. Consecutive copy
    /// sends make one item, written as one slice of the gather write.
    Copied(usize),
    /// A DATA frame.
    Data {
        prefix: DataPrefix,
        payload: Payload,
        key: u64,
        /// Counts against `send_queue_depth` (copy and zero-copy sends).
        unbuffered: bool,
        /// Whole frame length.
        len: usize,
    },
}

impl Out {
    pub(crate) fn data(prefix: DataPrefix, payload: Payload, key: u64, unbuffered: bool) -> Self {
        // The prefix holds a u32 length, so this fits a usize on every
        // supported (32- and 64-bit) target.
        let len = usize::try_from(prefix.frame_len()).unwrap_or(usize::MAX);
        Out::Data {
            prefix,
            payload,
            key,
            unbuffered,
            len,
        }
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Out::Handshake(h) => h.len(),
            Out::Copied(len) | Out::Data { len, .. } => *len,
        }
    }

    /// `true` for a frame held in the connection's ring.
    fn is_copied(&self) -> bool {
        matches!(self, Out::Copied(_))
    }

    /// Calls `f` with each slice of a frame not held in the ring, in order,
    /// until it returns `false`.
    fn chunks<'a>(&'a self, f: &mut dyn FnMut(&'a [u8]) -> bool) {
        match self {
            Out::Handshake(h) => {
                f(h);
            }
            Out::Copied(_) => {}
            Out::Data {
                prefix, payload, ..
            } => {
                if !f(prefix.as_bytes()) {
                    return;
                }
                match payload {
                    Payload::Buffer(b) => {
                        f(b.as_slice());
                    }
                    Payload::Region(l) => {
                        for c in l.chunks() {
                            if !f(c) {
                                break;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Puts the run of `*run_len` ring bytes at `*run_at` into `iov` from
/// `*n` on, then starts an empty run after it; `false` when `iov` is full.
fn put_run<'a>(
    ring: &'a ByteRing,
    iov: &mut [IoSlice<'a>],
    n: &mut usize,
    run_at: &mut usize,
    run_len: &mut usize,
) -> bool {
    if *run_len == 0 {
        return true;
    }
    let (a, b) = ring.slices(*run_at, *run_len);
    *run_at += *run_len;
    *run_len = 0;
    for s in [a, b] {
        if s.is_empty() {
            continue;
        }
        if *n == iov.len() {
            return false;
        }
        iov[*n] = IoSlice::new(s);
        *n += 1;
    }
    true
}

/// Fills `iov` with the unwritten slices of `queue`, skipping the first
/// `skip` bytes (already written of the front frame). Copied frames come
/// from `ring`, which holds exactly their unwritten bytes in queue order;
/// a run of them is one slice (two where the ring wraps). Returns the
/// number of slices.
fn fill_iov<'a>(
    queue: &'a VecDeque<Out>,
    ring: &'a ByteRing,
    mut skip: usize,
    iov: &mut [IoSlice<'a>],
) -> usize {
    let mut n = 0;
    // The run of copied frames not yet put into `iov`: where it starts in
    // the ring, and its length.
    let mut run_at = 0;
    let mut run_len = 0;
    for out in queue {
        if out.is_copied() {
            run_len += out.len() - skip;
            skip = 0;
            continue;
        }
        if !put_run(ring, iov, &mut n, &mut run_at, &mut run_len) {
            return n;
        }
        let mut full = false;
        out.chunks(&mut |c: &'a [u8]| {
            let c = if skip >= c.len() {
                skip -= c.len();
                return true;
            } else {
                let rest = &c[skip..];
                skip = 0;
                rest
            };
            if n == iov.len() {
                full = true;
                return false;
            }
            iov[n] = IoSlice::new(c);
            n += 1;
            true
        });
        if full || n == iov.len() {
            return n;
        }
    }
    put_run(ring, iov, &mut n, &mut run_at, &mut run_len);
    n
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The initiator's TCP connect is in progress.
    Connecting,
    /// Handshakes are being exchanged.
    Handshaking,
    /// Established and reported.
    Established,
}

/// What the loop thread reads with: taken out of the connection while it
/// reads and dispatches, so no lock is held then.
pub(crate) struct Reader {
    pub(crate) dec: FrameDecoder,
    /// The connection's socket, its `open` and its `paused` (the
    /// connection's own, shared): the loop thread reads without taking
    /// references per read.
    pub(crate) stream: Arc<TcpStream>,
    pub(crate) open: Arc<AtomicBool>,
    pub(crate) paused: Arc<AtomicBool>,
    /// The receive-pool buffer a message too large for the read buffer is
    /// assembled in.
    pub(crate) assembling: Option<NetworkBuffer>,
    /// Length of the message being assembled.
    pub(crate) assembling_len: u32,
    /// The receive pool is shared with other connections: a message may
    /// hold one of its buffers until `partial_deadline` only.
    pub(crate) shared_pool: bool,
    /// When the message being assembled in a shared pool's buffer must be
    /// complete (`TcpConfig::partial_message_timeout`); `None` when no such
    /// message is under way.
    pub(crate) partial_deadline: Option<Instant>,
    /// Messages handed out, counted for [`Conn::stats`].
    pub(crate) received: Arc<RecvCounters>,
    /// A socket error read while messages read before it were still held
    /// (the connection paused, or waiting for a pool buffer): it ends the
    /// connection once they are handed out. The socket reports an error
    /// once; the reads after it see only the end of stream.
    pub(crate) held_error: Option<io::Error>,
}

impl Reader {
    /// `true` if a message assembled in a shared pool's buffer is still
    /// incomplete at `now`, past its deadline.
    pub(crate) fn partial_overdue(&self, now: Instant) -> bool {
        self.partial_deadline().is_some_and(|d| d <= now)
    }

    /// The deadline of the message under way in a shared pool's buffer.
    pub(crate) fn partial_deadline(&self) -> Option<Instant> {
        self.assembling.as_ref().and(self.partial_deadline)
    }
}

/// What a flush achieved.
pub(crate) enum Flushed {
    /// The queue is empty.
    Done,
    /// The socket is full; a writable event will resume.
    Blocked,
    /// The write budget is used up; flush again soon.
    More,
}

/// One connection (opening or established).
pub(crate) struct Conn {
    /// Its handle.
    pub(crate) id: ConnId,
    /// When it was opened or accepted, in the backend's order: of several
    /// connections to one address, `connection_to` gives the oldest.
    pub(crate) seq: u64,
    pub(crate) remote: EndpointAddress,
    pub(crate) stream: Arc<TcpStream>,
    pub(crate) source: SourceId,
    pub(crate) phase: Phase,
    pub(crate) initiator: bool,
    /// The listen endpoint that accepted it.
    pub(crate) listener: Option<EndpointAddress>,
    pub(crate) params: ConnectionParams,
    /// Cleared when the connection ends, so the loop thread stops handing
    /// out its messages at once.
    pub(crate) open: Arc<AtomicBool>,
    /// Set by `pause_receive`: the socket is not read and nothing buffered
    /// is handed out until `resume_receive`.
    pub(crate) paused: Arc<AtomicBool>,
    /// `None` while the loop thread is reading (boxed: taken out and put
    /// back around every read).
    pub(crate) reader: Option<Box<Reader>>,
    /// Largest message accepted; `None`: no receive capability.
    pub(crate) recv_limit: Option<u32>,
    pub(crate) recv_pool: Option<BufferPool>,
    pub(crate) send_pool: Option<BufferPool>,
    /// Stopped reading until a receive-pool buffer is free.
    pub(crate) recv_blocked: bool,
    pub(crate) queue: VecDeque<Out>,
    /// Bytes of the front of `queue` already written.
    pub(crate) offset: usize,
    /// Copy and zero-copy sends accepted so far (under the state lock).
    /// Those not yet reported (see [`Release`]) are `slots_taken` minus
    /// `slots_released`: the count a send takes is a plain field, and
    /// only the report, made without the lock, touches the atomic.
    pub(crate) slots_taken: usize,
    /// Copy and zero-copy sends reported so far.
    pub(crate) slots_released: Arc<AtomicUsize>,
    /// In the backend's list of connections to flush.
    pub(crate) dirty: bool,
    /// Out of epoll while a busy loop's spin reads it
    /// ([`MioLoop::suspend`](netio_core::mio_loop::MioLoop::suspend)).
    pub(crate) suspended: bool,
    /// Give up if not established by then.
    pub(crate) deadline: Option<Instant>,
    /// The copied frames of `queue`: their unwritten bytes and keys.
    copies: CopyQueue,
    /// Send-side counters (under the backend's lock).
    pub(crate) stats: ConnStats,
    /// Receive-side counters, kept by the reader.
    pub(crate) received: Arc<RecvCounters>,
}

impl Conn {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        id: ConnId,
        seq: u64,
        remote: EndpointAddress,
        stream: Arc<TcpStream>,
        source: SourceId,
        phase: Phase,
        initiator: bool,
        listener: Option<EndpointAddress>,
        params: ConnectionParams,
        recv_limit: Option<u32>,
        recv_pool: Option<BufferPool>,
        deadline: Instant,
        handshake: [u8; HANDSHAKE_LEN],
    ) -> Self {
        let mut queue = VecDeque::new();
        queue.push_back(Out::Handshake(handshake));
        let shared_pool = params.recv.use_shared_pool;
        let received = Arc::new(RecvCounters::default());
        let open = Arc::new(AtomicBool::new(true));
        let paused = Arc::new(AtomicBool::new(false));
        Self {
            id,
            seq,
            remote,
            stream: Arc::clone(&stream),
            source,
            phase,
            initiator,
            listener,
            params,
            open: Arc::clone(&open),
            paused: Arc::clone(&paused),
            reader: Some(Box::new(Reader {
                dec: FrameDecoder::new(0, recv_limit),
                stream,
                open,
                paused,
                assembling: None,
                assembling_len: 0,
                shared_pool,
                partial_deadline: None,
                received: Arc::clone(&received),
                held_error: None,
            })),
            recv_limit,
            recv_pool,
            send_pool: None,
            recv_blocked: false,
            queue,
            offset: 0,
            slots_taken: 0,
            slots_released: Arc::new(AtomicUsize::new(0)),
            dirty: false,
            suspended: false,
            deadline: Some(deadline),
            copies: CopyQueue::default(),
            stats: ConnStats::default(),
            received,
        }
    }

    /// `true` when the application knows the handle: the connection was
    /// opened here (any phase), or accepted and reported established. An
    /// accepted connection still exchanging handshakes has not been
    /// issued to the application yet.
    pub(crate) fn issued(&self) -> bool {
        self.initiator || self.phase == Phase::Established
    }

    /// The counters of this connection now.
    pub(crate) fn stats(&self) -> ConnStats {
        let (messages, bytes) = self.received.get();
        ConnStats {
            messages_received: messages,
            bytes_received: bytes,
            ..self.stats
        }
    }

    /// Counts a send of `bytes` accepted.
    #[inline]
    pub(crate) fn count_send(&mut self, bytes: usize) {
        let n = self.in_flight();
        self.count_send_in_flight(bytes, n);
    }

    /// [`count_send`](Self::count_send) with the sends in flight, this one
    /// included, read by the caller.
    #[inline]
    pub(crate) fn count_send_in_flight(&mut self, bytes: usize, in_flight: usize) {
        self.stats.messages_sent += 1;
        self.stats.bytes_sent += bytes as u64;
        let n = in_flight as u64;
        if n > self.stats.max_in_flight {
            self.stats.max_in_flight = n;
        }
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued_bytes(&self) -> usize {
        let total: usize = self.queue.iter().map(Out::len).sum();
        total - self.offset
    }

    /// Queues a copy send whose first `written` bytes already went out
    /// (see [`Conn::write_through`]): the rest of its frame (`frame`
    /// header, application `header`, then `data`, `frame_len` bytes in
    /// all) is copied into the ring. Only a send on a connection with
    /// nothing queued may be partly written.
    #[inline]
    pub(crate) fn push_copied(
        &mut self,
        frame: &[u8; FRAME_HEADER_LEN],
        header: &[u8],
        data: &[&[u8]],
        frame_len: usize,
        written: usize,
        key: u64,
    ) {
        debug_assert!(written == 0 || self.queue.is_empty());
        self.copies
            .push(frame, header, data, written, frame_len, key);
        self.queue_copied(frame_len);
        if written > 0 {
            self.offset = written;
        }
    }

    /// Copies a frame into the ring as [`push_copied`](Self::push_copied)
    /// does with nothing written, but leaves it out of the send queue:
    /// the frames of a batch so copied join the queue together, with one
    /// [`queue_copied`](Self::queue_copied) call (which must come before
    /// anything else is queued or written).
    #[inline]
    pub(crate) fn copy_frame(
        &mut self,
        frame: &[u8; FRAME_HEADER_LEN],
        header: &[u8],
        data: &[&[u8]],
        frame_len: usize,
        key: u64,
    ) {
        self.copies.push(frame, header, data, 0, frame_len, key);
    }

    /// Adds `len` bytes of copied frames to the send queue: to its last
    /// item when that is copied frames too.
    #[inline]
    pub(crate) fn queue_copied(&mut self, len: usize) {
        match self.queue.back_mut() {
            Some(Out::Copied(n)) => *n += len,
            _ => self.queue.push_back(Out::Copied(len)),
        }
    }

    /// Queues a small buffered send by copying its bytes into the ring
    /// (its frame then leaves in one slice with its neighbours instead of
    /// two of its own); the buffer is held until the send completes.
    pub(crate) fn push_buffered_copy(
        &mut self,
        frame: &[u8; FRAME_HEADER_LEN],
        buffer: NetworkBuffer,
        key: u64,
    ) {
        let frame_len = FRAME_HEADER_LEN + buffer.len();
        self.copies.push_buffer(frame, buffer, key);
        match self.queue.back_mut() {
            Some(Out::Copied(len)) => *len += frame_len,
            _ => self.queue.push_back(Out::Copied(frame_len)),
        }
    }

    /// Writes a copy send's frame (`frame` header, application `header`,
    /// `data`) straight from the caller's slices, for a connection whose
    /// queue is empty: a large message is then copied once (by the
    /// kernel), not twice. Returns the bytes written; 0 when the socket
    /// takes nothing or fails (the queued frame then meets the same error
    /// in the next flush, which handles it).
    pub(crate) fn write_through(
        &mut self,
        frame: &[u8; FRAME_HEADER_LEN],
        header: &[u8],
        data: &[&[u8]],
    ) -> usize {
        debug_assert!(self.queue.is_empty());
        if data.len() + 2 > MAX_IOV {
            return 0;
        }
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        iov[0] = IoSlice::new(frame);
        iov[1] = IoSlice::new(header);
        for (slot, d) in iov[2..].iter_mut().zip(data) {
            *slot = IoSlice::new(d);
        }
        socket2::SockRef::from(&*self.stream)
            .send_vectored_with_flags(&iov[..data.len() + 2], libc::MSG_NOSIGNAL)
            .unwrap_or(0)
    }

    /// Writes as much of the queue as the socket takes, completing every
    /// message fully written (its event goes to `events`).
    /// Writes the front of the queue with one `sendmsg`, gathering at most
    /// [`MAX_IOV`] slices. A short queue (the common case: a few copied
    /// frames, one ring run) is gathered in a small array first; only
    /// when that fills up is the full-size one set up.
    fn write_queued(&self) -> io::Result<usize> {
        // `sendmsg` with MSG_NOSIGNAL rather than `writev`: a peer that
        // resets the connection must not kill a process that has not
        // ignored SIGPIPE.
        let send = |iov: &[IoSlice<'_>]| {
            socket2::SockRef::from(&*self.stream).send_vectored_with_flags(iov, libc::MSG_NOSIGNAL)
        };
        let mut small = [IoSlice::new(&[]); SMALL_IOV];
        let n = fill_iov(&self.queue, self.copies.ring(), self.offset, &mut small);
        if n < SMALL_IOV {
            return send(&small[..n]);
        }
        let mut iov = [IoSlice::new(&[]); MAX_IOV];
        let n = fill_iov(&self.queue, self.copies.ring(), self.offset, &mut iov);
        send(&iov[..n])
    }

    pub(crate) fn flush(&mut self, events: &mut Events) -> io::Result<Flushed> {
        for _ in 0..MAX_WRITES_PER_FLUSH {
            if self.queue.is_empty() {
                return Ok(Flushed::Done);
            }
            let written = self.write_queued();
            match written {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(w) => self.advance(w, events),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flushed::Blocked),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(if self.queue.is_empty() {
            Flushed::Done
        } else {
            Flushed::More
        })
    }

    fn advance(&mut self, written: usize, events: &mut Events) {
        let mut w = written;
        while let Some(front) = self.queue.front() {
            let left = front.len() - self.offset;
            if front.is_copied() {
                let mut to = ToEvents {
                    events: &mut *events,
                    conn: self.id,
                    in_flight: &self.slots_released,
                };
                self.copies.consume(w.min(left), &mut to);
            }
            if w < left {
                self.offset += w;
                break;
            }
            w -= left;
            self.offset = 0;
            if let Some(Out::Data {
                payload,
                key,
                unbuffered,
                ..
            }) = self.queue.pop_front()
            {
                let release = match payload {
                    Payload::Buffer(b) => Release::Buffer(b),
                    _ if unbuffered => Release::Slot(&self.slots_released),
                    _ => Release::Nothing,
                };
                events.completed(self.id, key, release);
            }
        }
    }

    /// Ends sending. Every queued message not yet started is cancelled and
    /// its key returned. A partly written frame must still be finished (the
    /// stream must stay whole frames): its unwritten rest is copied out and
    /// returned with this side's unsent handshake as bytes still to write,
    /// and its key is returned as completed, since its bytes leave this
    /// side's buffers and reach the peer.
    pub(crate) fn cancel_sends(&mut self) -> Ended {
        let mut ended = Ended::default();
        // Where the first run of copied frames starts, in bytes of copied
        // frames.
        let mut copied_at = self.copies.written();
        if self.queue.front().is_some_and(Out::is_copied) {
            copied_at -= self.offset as u64;
        }
        for (i, out) in self.queue.iter().enumerate() {
            let partial = i == 0 && self.offset > 0;
            match out {
                Out::Copied(len) => {
                    copied_at += *len as u64;
                    self.copies.end_until(
                        copied_at,
                        &mut ended.completed,
                        &mut ended.rest,
                        &mut ended.cancelled,
                        &mut ended.buffers,
                    );
                    continue;
                }
                Out::Data { key, .. } if partial => ended.completed = Some(*key),
                Out::Data { key, .. } => ended.cancelled.push(*key),
                Out::Handshake(_) => {}
            }
            if partial || matches!(out, Out::Handshake(_)) {
                let mut skip = if partial { self.offset } else { 0 };
                out.chunks(&mut |c| {
                    if skip >= c.len() {
                        skip -= c.len();
                    } else {
                        ended.rest.extend_from_slice(&c[skip..]);
                        skip = 0;
                    }
                    true
                });
            }
        }
        for out in self.queue.drain(..) {
            if let Out::Data {
                payload: Payload::Buffer(b),
                ..
            } = out
            {
                ended.buffers.push(b);
            }
        }
        self.offset = 0;
        self.copies.clear();
        ended
    }
}

/// What [`Conn::cancel_sends`] leaves.
#[derive(Default)]
pub(crate) struct Ended {
    /// Keys of sends that never started.
    pub(crate) cancelled: Vec<u64>,
    /// Key of the partly written send, finished from `rest`.
    pub(crate) completed: Option<u64>,
    /// Bytes still to write before a CLOSE frame.
    pub(crate) rest: Vec<u8>,
    /// Pool buffers of the ended sends, to give back when the end is
    /// reported.
    pub(crate) buffers: Vec<NetworkBuffer>,
}

/// A connection closed by this side, finishing its last frame and its
/// CLOSE frame, then draining the peer until end of stream.
pub(crate) struct Lingering {
    pub(crate) stream: Arc<TcpStream>,
    pub(crate) source: SourceId,
    pending: Vec<u8>,
    written: usize,
    shut: bool,
    pub(crate) deadline: Instant,
}

/// Reads per event while draining a lingering connection.
const MAX_DRAIN_READS: usize = 64;

/// What a lingering connection needs next.
pub(crate) enum LingerStatus {
    /// Waiting for the socket.
    Waiting,
    /// The read budget is used up; drain again soon.
    More,
    /// Finished: deregister and close it.
    Done,
}

impl Lingering {
    pub(crate) fn new(
        stream: Arc<TcpStream>,
        source: SourceId,
        pending: Vec<u8>,
        deadline: Instant,
    ) -> Self {
        Self {
            stream,
            source,
            pending,
            written: 0,
            shut: false,
            deadline,
        }
    }

    /// Bytes still to write before the sending direction is shut down.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.pending.len() - self.written
    }

    /// Writes what is pending, shuts down the sending direction, then reads
    /// and discards until end of stream.
    pub(crate) fn progress(&mut self) -> LingerStatus {
        while self.written < self.pending.len() {
            match (&*self.stream).write(&self.pending[self.written..]) {
                Ok(0) => return LingerStatus::Done,
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return LingerStatus::Waiting,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return LingerStatus::Done,
            }
        }
        if !self.shut {
            self.shut = true;
            self.pending = Vec::new();
            self.written = 0;
            if self.stream.shutdown(std::net::Shutdown::Write).is_err() {
                return LingerStatus::Done;
            }
        }
        let mut sink = [0u8; 4096];
        for _ in 0..MAX_DRAIN_READS {
            match (&*self.stream).read(&mut sink) {
                Ok(0) => return LingerStatus::Done,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return LingerStatus::Waiting,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return LingerStatus::Done,
            }
        }
        LingerStatus::More
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues a copy send of `bytes` on `c`.
    fn copy(c: &mut Conn, bytes: &[u8], key: u64) {
        let frame = DataPrefix::new(&[], bytes.len())
            .unwrap()
            .as_bytes()
            .try_into()
            .unwrap();
        c.push_copied(&frame, &[], &[bytes], 8 + bytes.len(), 0, key);
    }

    #[test]
    fn fill_iov_skips_written_bytes_and_stops_when_full() {
        let pool = BufferPool::new(8, 2);
        let buffered = |bytes: &[u8], key| {
            let mut b = pool.get().unwrap();
            b.write(bytes).unwrap();
            Out::data(
                DataPrefix::new(&[], bytes.len()).unwrap(),
                Payload::Buffer(b),
                key,
                false,
            )
        };
        let mut q = VecDeque::new();
        q.push_back(buffered(b"abc", 1));
        q.push_back(buffered(b"de", 2));
        let ring = ByteRing::default();
        let mut iov = [IoSlice::new(&[]); 8];
        let n = fill_iov(&q, &ring, 9, &mut iov);
        let got: Vec<&[u8]> = iov[..n].iter().map(|s| &**s).collect();
        assert_eq!(got[0], b"bc");
        assert_eq!(got[1].len(), 8);
        assert_eq!(got[2], b"de");
        assert_eq!(n, 3);
        let mut small = [IoSlice::new(&[]); 2];
        assert_eq!(fill_iov(&q, &ring, 0, &mut small), 2);
    }

    /// The slices `fill_iov` gives for `c`'s queue, concatenated per slice.
    fn iov_of(c: &Conn, slots: usize) -> Vec<Vec<u8>> {
        let mut iov = vec![IoSlice::new(&[]); slots];
        let n = fill_iov(&c.queue, c.copies.ring(), c.offset, &mut iov);
        iov[..n].iter().map(|s| s.to_vec()).collect()
    }

    fn frame(bytes: &[u8]) -> Vec<u8> {
        let prefix = DataPrefix::new(&[], bytes.len()).unwrap();
        [prefix.as_bytes(), bytes].concat()
    }

    #[test]
    fn consecutive_copied_messages_are_one_slice() {
        let (mut c, _keep) = conn();
        copy(&mut c, b"abc", 1);
        copy(&mut c, b"de", 2);
        copy(&mut c, b"f", 3);
        c.advance(1, &mut Events::default());
        let all = [frame(b"abc"), frame(b"de"), frame(b"f")].concat();
        assert_eq!(iov_of(&c, 8), vec![all[1..].to_vec()]);
    }

    #[test]
    fn copied_runs_and_other_sends_keep_their_order() {
        let (mut c, _keep) = conn();
        let pool = BufferPool::new(8, 2);
        copy(&mut c, b"abc", 1);
        copy(&mut c, b"de", 2);
        let mut b = pool.get().unwrap();
        b.write(b"xyz").unwrap();
        let prefix = DataPrefix::new(&[], 3).unwrap();
        c.queue
            .push_back(Out::data(prefix, Payload::Buffer(b), 3, false));
        copy(&mut c, b"g", 4);
        let got = iov_of(&c, 8);
        assert_eq!(got.len(), 4, "run, buffer prefix, buffer, run: {got:?}");
        assert_eq!(got[0], [frame(b"abc"), frame(b"de")].concat());
        assert_eq!([got[1].clone(), got[2].clone()].concat(), frame(b"xyz"));
        assert_eq!(got[3], frame(b"g"));
        // With room for one slice only, the first run comes alone.
        assert_eq!(iov_of(&c, 1).len(), 1);
    }

    #[test]
    fn a_run_across_the_end_of_the_ring_is_two_slices_and_completes_in_order() {
        let (mut c, _keep) = conn();
        let mut events = Events::default();
        let big = vec![5u8; 3000];
        copy(&mut c, &big, 1);
        c.advance(3008, &mut events);
        // The ring (4096 bytes) restarts at its front once empty; fill it
        // past its end with a frame partly written.
        copy(&mut c, &big, 2);
        c.advance(2000, &mut events);
        copy(&mut c, &[6u8; 2000], 3);
        let got = iov_of(&c, 8);
        assert_eq!(got.len(), 2, "the run wraps");
        let expect = [frame(&big)[2000..].to_vec(), frame(&[6u8; 2000])].concat();
        assert_eq!(got.concat(), expect);
        c.advance(expect.len(), &mut events);
        let keys = events.completed_keys().to_vec();
        assert_eq!(keys, vec![1, 2, 3]);
        assert_eq!(c.copies.ring().len(), 0);
        assert!(c.queue.is_empty());
    }

    #[test]
    fn a_frame_partly_written_through_keeps_only_its_rest_in_the_ring() {
        let (mut c, _keep) = conn();
        let frame = DataPrefix::new(&[], 5)
            .unwrap()
            .as_bytes()
            .try_into()
            .unwrap();
        c.push_copied(&frame, &[], &[b"hel", b"lo"], 13, 10, 7);
        assert_eq!(c.copies.ring().len(), 3);
        assert_eq!(c.queued_bytes(), 3);
        assert_eq!(iov_of(&c, 4), vec![b"llo".to_vec()]);
        let ended = c.cancel_sends();
        assert_eq!(ended.completed, Some(7));
        assert_eq!(ended.rest, b"llo");
    }

    #[test]
    fn advance_completes_whole_frames_and_keeps_the_offset() {
        let (mut c, _keep) = conn();
        copy(&mut c, b"abc", 1);
        copy(&mut c, b"de", 2);
        copy(&mut c, b"f", 3);
        c.slots_taken = 3;
        let mut events = Events::default();
        // Frame 1 (11 bytes) complete, 4 bytes of frame 2 written.
        c.advance(11 + 4, &mut events);
        let keys = events.completed_keys().to_vec();
        assert_eq!(keys, vec![1]);
        let rest = c.cancel_sends();
        assert_eq!(rest.completed, Some(2));
        assert_eq!(rest.cancelled, vec![3]);
        // The unwritten rest of frame 2: 6 of its 10 bytes.
        assert_eq!(rest.rest.len(), 6);
        assert_eq!(&rest.rest[4..], b"de");
    }

    /// What a test connection needs to stay alive.
    type Keep = (std::net::TcpListener, netio_core::mio_loop::MioLoop);

    /// An established connection over loopback with an empty send queue.
    fn conn() -> (Conn, Keep) {
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let lp = netio_core::mio_loop::MioLoop::new().unwrap();
        let fd = s.as_raw_fd();
        let source = lp
            .register(
                &mut mio::unix::SourceFd(&fd),
                mio::Interest::READABLE,
                |_| {},
            )
            .unwrap();
        let mut c = Conn::new(
            ConnId::new(0, 0),
            0,
            EndpointAddress::localhost(1),
            Arc::new(TcpStream::from_std(s)),
            source,
            Phase::Established,
            true,
            None,
            ConnectionParams::default(),
            None,
            None,
            Instant::now(),
            [0; HANDSHAKE_LEN],
        );
        c.queue.clear();
        (c, (listener, lp))
    }
}
