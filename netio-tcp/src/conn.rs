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

use crate::wire::{DataPrefix, FrameDecoder, HANDSHAKE_LEN};

/// Slices handed to one `writev`: many messages per system call.
pub(crate) const MAX_IOV: usize = 512;
/// `writev` calls per flush of one connection before others get a turn.
const MAX_WRITES_PER_FLUSH: usize = 16;
/// Copy-send vectors kept for reuse per connection.
const MAX_SPARE_VECS: usize = 16;
/// Bytes of copy-send vectors kept for reuse per connection, in all: large
/// copies (a MiB) reuse their memory too instead of faulting in fresh pages
/// for every message.
const SPARE_BYTES: usize = 4 * 1024 * 1024;

/// Copy-send vectors of one connection kept for reuse, within
/// [`MAX_SPARE_VECS`] and [`SPARE_BYTES`].
#[derive(Default)]
struct SpareVecs {
    vecs: Vec<Vec<u8>>,
    /// Total capacity of `vecs`.
    bytes: usize,
}

impl SpareVecs {
    /// An empty vector of at least `capacity`, reused when one is spare.
    fn take(&mut self, capacity: usize) -> Vec<u8> {
        match self.vecs.pop() {
            Some(mut v) => {
                self.bytes -= v.capacity();
                v.clear();
                v.reserve(capacity);
                v
            }
            None => Vec::with_capacity(capacity),
        }
    }

    /// Keeps `v` for reuse if the budget allows, else frees it.
    fn put(&mut self, v: Vec<u8>) {
        let cap = v.capacity();
        if self.vecs.len() < MAX_SPARE_VECS && self.bytes + cap <= SPARE_BYTES {
            self.bytes += cap;
            self.vecs.push(v);
        }
    }
}

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
    /// Consecutive completions of one connection are reported in one
    /// `on_sends_completed` call.
    Completed(ConnId, u64, Release),
    /// A handler timer is due.
    Timer(u64),
    /// `Backend::wake` was called.
    Wake(u64),
}

/// What a send holds until its completion is reported to the handler: a
/// slot of the connection's send queue depth, or its pool buffer. So a
/// handler never sees more sends in flight than the depth or the pool
/// allows, however long reporting takes.
#[derive(Debug)]
pub(crate) enum Release {
    /// Nothing (the connection is gone).
    Nothing,
    /// A copy or zero-copy send's slot: the connection's in-flight count.
    Slot(Arc<AtomicUsize>),
    /// A buffered send's buffer.
    Buffer(NetworkBuffer),
}

impl Release {
    /// Gives the slot or buffer back; called right before the completion
    /// is reported, so the handler may send again from its callback.
    pub(crate) fn release(self) {
        match self {
            Release::Nothing => {}
            Release::Slot(n) => {
                n.fetch_sub(1, Ordering::AcqRel);
            }
            Release::Buffer(b) => drop(b),
        }
    }
}

/// The bytes of a message after its prefix.
pub(crate) enum Payload {
    /// `send_data_copy`: the whole frame, prefix included, copied at once
    /// (one slice per message in the gather write).
    Copy(Vec<u8>),
    /// `send_data`: straight from the registered region.
    Region(Lent),
    /// `send_buffer`: the pool buffer itself.
    Buffer(NetworkBuffer),
}

impl Payload {
    fn chunks<'a>(&'a self, f: &mut dyn FnMut(&'a [u8]) -> bool) {
        match self {
            Payload::Copy(v) => {
                f(v);
            }
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

/// One item of a connection's send queue.
pub(crate) enum Out {
    /// This side's handshake.
    Handshake([u8; HANDSHAKE_LEN]),
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

    fn len(&self) -> usize {
        match self {
            Out::Handshake(h) => h.len(),
            Out::Data { len, .. } => *len,
        }
    }

    /// Calls `f` with each slice of the frame in order until it returns
    /// `false`.
    fn chunks<'a>(&'a self, f: &mut dyn FnMut(&'a [u8]) -> bool) {
        match self {
            Out::Handshake(h) => {
                f(h);
            }
            Out::Data {
                payload: payload @ Payload::Copy(_),
                ..
            } => payload.chunks(f),
            Out::Data {
                prefix, payload, ..
            } => {
                if f(prefix.as_bytes()) {
                    payload.chunks(f);
                }
            }
        }
    }
}

/// Fills `iov` with the unwritten slices of `queue`, skipping the first
/// `skip` bytes (already written). Returns the number of slices.
fn fill_iov<'a>(queue: &'a VecDeque<Out>, mut skip: usize, iov: &mut [IoSlice<'a>]) -> usize {
    let mut n = 0;
    for out in queue {
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
            break;
        }
    }
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
    /// `None` while the loop thread is reading.
    pub(crate) reader: Option<Reader>,
    /// Largest message accepted; `None`: no receive capability.
    pub(crate) recv_limit: Option<u32>,
    pub(crate) recv_pool: Option<BufferPool>,
    pub(crate) send_pool: Option<BufferPool>,
    /// Stopped reading until a receive-pool buffer is free.
    pub(crate) recv_blocked: bool,
    pub(crate) queue: VecDeque<Out>,
    /// Bytes of the front of `queue` already written.
    pub(crate) offset: usize,
    /// Copy and zero-copy sends queued or completed but not yet reported
    /// (see [`Release`]).
    pub(crate) in_flight: Arc<AtomicUsize>,
    /// In the backend's list of connections to flush.
    pub(crate) dirty: bool,
    /// Give up if not established by then.
    pub(crate) deadline: Option<Instant>,
    spare: SpareVecs,
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
        Self {
            id,
            seq,
            remote,
            stream,
            source,
            phase,
            initiator,
            listener,
            params,
            open: Arc::new(AtomicBool::new(true)),
            paused: Arc::new(AtomicBool::new(false)),
            reader: Some(Reader {
                dec: FrameDecoder::new(0, recv_limit),
                assembling: None,
                assembling_len: 0,
                shared_pool,
                partial_deadline: None,
            }),
            recv_limit,
            recv_pool,
            send_pool: None,
            recv_blocked: false,
            queue,
            offset: 0,
            in_flight: Arc::new(AtomicUsize::new(0)),
            dirty: false,
            deadline: Some(deadline),
            spare: SpareVecs::default(),
        }
    }

    /// `true` when the application knows the handle: the connection was
    /// opened here (any phase), or accepted and reported established. An
    /// accepted connection still exchanging handshakes has not been
    /// issued to the application yet.
    pub(crate) fn issued(&self) -> bool {
        self.initiator || self.phase == Phase::Established
    }

    /// Bytes queued and not yet written.
    pub(crate) fn queued_bytes(&self) -> usize {
        let total: usize = self.queue.iter().map(Out::len).sum();
        total - self.offset
    }

    /// A vector for a copy send, reused when one is spare.
    pub(crate) fn take_vec(&mut self, capacity: usize) -> Vec<u8> {
        self.spare.take(capacity)
    }

    fn recycle(&mut self, payload: Payload) {
        if let Payload::Copy(v) = payload {
            self.spare.put(v);
        }
    }

    /// Writes as much of the queue as the socket takes, completing every
    /// message fully written (its event goes to `events`).
    pub(crate) fn flush(&mut self, events: &mut Vec<Ev>) -> io::Result<Flushed> {
        for _ in 0..MAX_WRITES_PER_FLUSH {
            if self.queue.is_empty() {
                return Ok(Flushed::Done);
            }
            let written = {
                let mut iov = [IoSlice::new(&[]); MAX_IOV];
                let n = fill_iov(&self.queue, self.offset, &mut iov);
                // `sendmsg` with MSG_NOSIGNAL rather than `writev`: a peer
                // that resets the connection must not kill a process that
                // has not ignored SIGPIPE.
                socket2::SockRef::from(&*self.stream)
                    .send_vectored_with_flags(&iov[..n], libc::MSG_NOSIGNAL)
            };
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

    fn advance(&mut self, written: usize, events: &mut Vec<Ev>) {
        let mut w = written + self.offset;
        self.offset = 0;
        while let Some(front) = self.queue.front() {
            let len = front.len();
            if w < len {
                self.offset = w;
                break;
            }
            w -= len;
            if let Some(Out::Data {
                payload,
                key,
                unbuffered,
                ..
            }) = self.queue.pop_front()
            {
                let release = match payload {
                    Payload::Buffer(b) => Release::Buffer(b),
                    other => {
                        self.recycle(other);
                        if unbuffered {
                            Release::Slot(Arc::clone(&self.in_flight))
                        } else {
                            Release::Nothing
                        }
                    }
                };
                events.push(Ev::Completed(self.id, key, release));
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
        for (i, out) in self.queue.iter().enumerate() {
            let partial = i == 0 && self.offset > 0;
            if let Out::Data { key, .. } = out {
                if partial {
                    ended.completed = Some(*key);
                } else {
                    ended.cancelled.push(*key);
                }
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

    fn data(bytes: &[u8], key: u64) -> Out {
        let prefix = DataPrefix::new(&[], bytes.len()).unwrap();
        let frame = [prefix.as_bytes(), bytes].concat();
        Out::data(prefix, Payload::Copy(frame), key, true)
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
        let mut iov = [IoSlice::new(&[]); 8];
        let n = fill_iov(&q, 9, &mut iov);
        let got: Vec<&[u8]> = iov[..n].iter().map(|s| &**s).collect();
        assert_eq!(got[0], b"bc");
        assert_eq!(got[1].len(), 8);
        assert_eq!(got[2], b"de");
        assert_eq!(n, 3);
        let mut small = [IoSlice::new(&[]); 2];
        assert_eq!(fill_iov(&q, 0, &mut small), 2);
    }

    #[test]
    fn a_large_copy_vector_is_reused_and_the_spare_budget_holds() {
        let mut spare = SpareVecs::default();
        let v = spare.take(1 << 20);
        let ptr = v.as_ptr();
        spare.put(v);
        let again = spare.take(1 << 20);
        assert_eq!(
            again.as_ptr(),
            ptr,
            "a 1 MiB vector is reused, not allocated anew"
        );
        assert!(again.is_empty());
        for _ in 0..8 {
            spare.put(Vec::with_capacity(1 << 20));
        }
        assert!(spare.bytes <= SPARE_BYTES, "{} bytes kept", spare.bytes);
        assert_eq!(spare.vecs.len(), SPARE_BYTES >> 20);
        for _ in 0..40 {
            spare.put(Vec::with_capacity(16));
        }
        assert!(spare.vecs.len() <= MAX_SPARE_VECS);
    }

    #[test]
    fn a_copied_message_is_one_slice() {
        let mut q = VecDeque::new();
        q.push_back(data(b"abc", 1));
        q.push_back(data(b"de", 2));
        let mut iov = [IoSlice::new(&[]); 8];
        let n = fill_iov(&q, 9, &mut iov);
        let got: Vec<&[u8]> = iov[..n].iter().map(|s| &**s).collect();
        assert_eq!(
            got,
            vec![&b"bc"[..], &[1, 0, 0, 0, 2, 0, 0, 0, b'd', b'e'][..]]
        );
    }

    #[test]
    fn advance_completes_whole_frames_and_keeps_the_offset() {
        let mut q = VecDeque::new();
        q.push_back(data(b"abc", 1));
        q.push_back(data(b"de", 2));
        q.push_back(data(b"f", 3));
        let mut events = Vec::new();
        let (keys, rest) = split_after(q, 11 + 4, &mut events);
        // Frame 1 (11 bytes) complete, 4 bytes of frame 2 written.
        assert_eq!(keys, vec![1]);
        assert_eq!(rest.completed, Some(2));
        assert_eq!(rest.cancelled, vec![3]);
        // The unwritten rest of frame 2: 6 of its 10 bytes.
        assert_eq!(rest.rest.len(), 6);
        assert_eq!(&rest.rest[4..], b"de");
    }

    /// Writes `written` bytes of `q` (as a socket would take them), then
    /// ends sending; returns the completed keys and what ending left.
    fn split_after(q: VecDeque<Out>, written: usize, events: &mut Vec<Ev>) -> (Vec<u64>, Ended) {
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
        c.queue = q;
        c.in_flight.store(3, Ordering::Relaxed);
        c.advance(written, events);
        let keys = events
            .iter()
            .filter_map(|e| match e {
                Ev::Completed(_, k, _) => Some(*k),
                _ => None,
            })
            .collect();
        (keys, c.cancel_sends())
    }
}
