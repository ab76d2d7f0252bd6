//! The baseline: the same tests over plain `std::net` TCP, server and
//! client on two threads, messages framed by a 4-byte little-endian length,
//! written as a careful engineer would write it for speed.
//!
//! - Interrupt-mode runs use blocking sockets; busy-poll runs use
//!   non-blocking sockets polled in a tight loop.
//! - Every socket has `TCP_NODELAY`, and the `SO_SNDBUF`/`SO_RCVBUF` of
//!   netio's side (`--socket-buffers`; by default neither side sets them,
//!   as netio-tcp's `TcpConfig` does not: the system's default with
//!   autotuning).
//! - Receivers parse frames in place out of one read buffer
//!   ([`FrameReader`], `--plain-read-buffer`, default [`read_buffer`]):
//!   one `read` per buffer-full, no copy of a frame, as
//!   netio-tcp parses frames in place out of its read buffer. The echo
//!   server writes each frame back straight from that buffer.
//! - One-way senders write each length-prefixed message to a `BufWriter`
//!   (`--plain-write-buffer`, default [`write_buffer`]: sizes chosen by
//!   measurement, see there), the per-message baseline for netio's
//!   per-message and batch sends alike; ping-pong writes each frame with
//!   one `write_all`, one system call.
//! - Timed runs read the clock once per [`CHUNK`] messages, as netio's
//!   sender does between its batches.

use std::io::{self, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::cli::TestKind;
use crate::metrics::{self, Figures};
use crate::proto::{self, Report, Role, SinkCounter};
use crate::provider::{RunError, Spec};
use crate::stats::RoundTrips;

/// Messages a one-way sender writes between two reads of the clock (the
/// provider's sender sends at most as many between two reads).
pub const CHUNK: u64 = 256;

/// Receive buffer of the baseline's receivers for messages below 64 KiB
/// (see [`read_buffer`]): 256 KiB, the size of the sender's `BufWriter`
/// for them, so that one `read` can take what one `write` sent. Frames are
/// parsed in place, so the size only sets how many messages a `read`
/// takes; a larger frame grows the buffer.
///
/// Measured (`--plain-read-buffer 64k` and `1m` against this default,
/// `rate --sizes 64 --mode copy --baseline --runs 2`, three interleaved
/// rounds) on a 2-vCPU machine at load average 11–15, where the same
/// setting varied up to 10× between runs: no size could be ranked. The
/// commands to measure it on a quiet machine are in
/// `docs/benchmarks.md`.
pub const READ_BUFFER: usize = 256 << 10;

/// Default receive buffer of the baseline's receivers for messages of
/// `size` bytes: [`READ_BUFFER`] below 64 KiB; from 64 KiB up, one frame
/// (`size` + 4), so that every `read` ends at most at the end of the frame
/// being read and no part of a frame is ever moved to the front of the
/// buffer (with a larger buffer, the partial frame at its end is, up to a
/// whole message per buffer-full); a `read` per 64 KiB or more costs less
/// than moving it.
pub fn read_buffer(size: usize) -> usize {
    if size < 64 << 10 {
        READ_BUFFER
    } else {
        size + 4
    }
}

/// Default capacity of the one-way sender's `BufWriter` for messages of
/// `size` bytes (0: no `BufWriter`, each frame written straight to the
/// socket).
///
/// - Below 64 KiB: 256 KiB. On a quiet machine (issue 24: load below
///   0.8, medians of 5 pairs) a 256 KiB `BufWriter` streamed 64-byte
///   messages at 55 M/s where the 64 KiB one this tool used before reached
///   28–47 M/s.
/// - From 64 KiB to below 1 MiB: 1 MiB. A `BufWriter` that gathers
///   several frames into one `write` beats writing each frame: on a quiet
///   machine (2026-11-26, load 0.6–1.3) the plain stream of 64 KiB
///   messages reached 9.3–10.7 GB/s with it and 6.0–6.8 GB/s without, of
///   256 KiB messages 8.1 against 6.6 GB/s.
/// - From 1 MiB up: straight writes (a 4 MiB `BufWriter` streamed 1 MiB
///   messages at 5.1 GB/s, straight writes at 6.1 GB/s).
///
/// The whole sweep (with the read buffer and the socket buffers, where the
/// defaults came out strongest) is in `docs/benchmarks.md`;
/// `--plain-write-buffer` re-measures it.
pub fn write_buffer(size: usize) -> usize {
    if size < 64 << 10 {
        256 << 10
    } else if size < 1 << 20 {
        1 << 20
    } else {
        0
    }
}

/// `setsockopt(2)`, from the C library the standard library links.
#[cfg(unix)]
mod sockopt {
    use std::io;
    use std::os::fd::AsRawFd;

    extern "C" {
        fn setsockopt(fd: i32, level: i32, name: i32, value: *const u8, len: u32) -> i32;
    }

    #[cfg(target_os = "linux")]
    const SOL_SOCKET: i32 = 1;
    #[cfg(target_os = "linux")]
    const SO_SNDBUF: i32 = 7;
    #[cfg(target_os = "linux")]
    const SO_RCVBUF: i32 = 8;
    #[cfg(not(target_os = "linux"))]
    const SOL_SOCKET: i32 = 0xffff;
    #[cfg(not(target_os = "linux"))]
    const SO_SNDBUF: i32 = 0x1001;
    #[cfg(not(target_os = "linux"))]
    const SO_RCVBUF: i32 = 0x1002;

    fn set(fd: &impl AsRawFd, name: i32, value: usize) -> io::Result<()> {
        let v = i32::try_from(value).unwrap_or(i32::MAX);
        // SAFETY: `fd` is an open socket borrowed for the call; the value
        // is a live `i32` whose size is passed as the option length.
        let r = unsafe {
            setsockopt(
                fd.as_raw_fd(),
                SOL_SOCKET,
                name,
                (&v as *const i32).cast(),
                std::mem::size_of::<i32>() as u32,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Sets `SO_SNDBUF` and `SO_RCVBUF` of `fd` to `n`.
    pub fn buffers(fd: &impl AsRawFd, n: usize) -> io::Result<()> {
        set(fd, SO_SNDBUF, n)?;
        set(fd, SO_RCVBUF, n)
    }
}

/// Sets the socket buffers of `fd`, when asked to.
fn socket_buffers(fd: &impl std::os::fd::AsRawFd, n: Option<usize>) -> io::Result<()> {
    match n {
        Some(n) => sockopt::buffers(fd, n),
        None => Ok(()),
    }
}

/// A socket that, when non-blocking, retries until the operation
/// completes, giving up at `deadline`.
struct Io {
    s: TcpStream,
    busy: bool,
    deadline: Instant,
}

impl Io {
    fn new(s: TcpStream, busy: bool, deadline: Instant) -> io::Result<Self> {
        s.set_nodelay(true)?;
        s.set_nonblocking(busy)?;
        if !busy {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            s.set_read_timeout(Some(left))?;
            s.set_write_timeout(Some(left))?;
        }
        Ok(Self { s, busy, deadline })
    }

    fn retry<T>(&mut self, mut op: impl FnMut(&mut TcpStream) -> io::Result<T>) -> io::Result<T> {
        let mut spins = 0u32;
        loop {
            match op(&mut self.s) {
                Err(e) if self.busy && e.kind() == io::ErrorKind::WouldBlock => {
                    std::hint::spin_loop();
                    spins = spins.wrapping_add(1);
                    if spins % 4096 == 0 && Instant::now() > self.deadline {
                        return Err(io::Error::new(io::ErrorKind::TimedOut, "time limit"));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
}

impl Read for Io {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.retry(|s| s.read(buf))
    }
}

impl Write for Io {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.retry(|s| s.write(buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(4 + payload.len());
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// Frames parsed in place out of one read buffer: a `read` fills the free
/// end of the buffer, frames are handed out as ranges of it, and what is
/// left of a partial frame moves to the front when room runs short. A
/// frame longer than the buffer grows it.
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameReader {
    /// A reader with a buffer of `capacity` bytes (at least 4 KiB).
    pub fn new(capacity: usize) -> Self {
        Self {
            buf: vec![0; capacity.max(4096)],
            start: 0,
            end: 0,
        }
    }

    /// The bytes of a range returned by [`next`](Self::next).
    #[inline]
    pub fn get(&self, r: Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    /// The next frame, length included, as a range of the buffer (valid
    /// until the next call); `None` at a clean end of stream.
    #[inline]
    pub fn next(&mut self, r: &mut impl Read) -> io::Result<Option<Range<usize>>> {
        loop {
            let avail = self.end - self.start;
            let mut need = 4;
            if avail >= 4 {
                let hdr: [u8; 4] = self.buf[self.start..self.start + 4].try_into().unwrap();
                let len = u32::from_le_bytes(hdr) as usize;
                if len > crate::cli::MAX_SIZE + 64 {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
                }
                need = 4 + len;
                if avail >= need {
                    let f = self.start..self.start + need;
                    self.start += need;
                    return Ok(Some(f));
                }
            }
            self.make_room(need);
            let n = r.read(&mut self.buf[self.end..])?;
            if n == 0 {
                return if self.end == self.start {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
            self.end += n;
        }
    }

    /// Room behind the data for a frame of `need` bytes, and at least half
    /// the buffer free for the next read.
    fn make_room(&mut self, need: usize) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        let cap = self.buf.len();
        if self.start > 0 && (cap - self.start < need || cap - self.end < cap / 2) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
    }
}

/// Serves one connection: reads the set-up message, then echoes or counts.
pub fn serve_conn(
    s: TcpStream,
    busy: bool,
    read_buffer: usize,
    deadline: Instant,
) -> io::Result<()> {
    let mut rd = FrameReader::new(read_buffer);
    let mut r = Io::new(s.try_clone()?, busy, deadline)?;
    let mut w = Io::new(s, busy, deadline)?;
    let Some(f) = rd.next(&mut r)? else {
        return Ok(());
    };
    let Some((role, _, warmup)) = proto::parse_setup(&rd.get(f)[4..]) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad set-up message",
        ));
    };
    match role {
        Role::Echo => {
            while let Some(f) = rd.next(&mut r)? {
                w.write_all(rd.get(f))?;
            }
        }
        Role::Sink => {
            let mut c = SinkCounter::new(warmup);
            while let Some(f) = rd.next(&mut r)? {
                let frame = rd.get(f);
                match frame.get(4) {
                    Some(&proto::DATA) => c.data(frame.len() - 4, || None),
                    Some(&proto::END) => {
                        c.end(|| None);
                        w.write_all(&frame_of(&c.report().encode()))?;
                    }
                    _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad message")),
                }
            }
        }
    }
    Ok(())
}

enum Got {
    PingPong(Vec<u64>, Duration),
    Sink(Report),
}

fn client(spec: &Spec, s: TcpStream, deadline: Instant) -> io::Result<Got> {
    let busy = spec.busy_poll;
    let mut rd = FrameReader::new(spec.plain_read_buffer);
    let mut r = Io::new(s.try_clone()?, busy, deadline)?;
    let mut w = Io::new(s, busy, deadline)?;
    let mut msg = Vec::new();
    proto::data_message(&mut msg, spec.size);
    let mut frame = frame_of(&msg);
    let setup = frame_of(&proto::setup(spec.role(), spec.mode, spec.warmup));
    let closed = || io::Error::new(io::ErrorKind::UnexpectedEof, "server closed");
    match spec.role() {
        Role::Echo => {
            w.write_all(&setup)?;
            let reserve = spec.count.unwrap_or(1 << 16).min(1 << 22) as usize;
            let mut rt = RoundTrips::new(spec.warmup, reserve);
            let mut i = 0u64;
            loop {
                proto::set_seq(&mut frame[4..], i);
                w.write_all(&frame)?;
                rt.sent(i);
                let f = rd.next(&mut r)?.ok_or_else(closed)?;
                if !proto::echo_matches(&rd.get(f)[4..], spec.size, i, true) {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "echo mismatch"));
                }
                i += 1;
                let measured = i.saturating_sub(spec.warmup);
                let fin = match (spec.count, spec.duration) {
                    (Some(n), _) => measured >= n,
                    (None, Some(d)) => measured > 0 && rt.measured() >= d,
                    (None, None) => true,
                };
                if fin {
                    let (samples, elapsed) = rt.finish();
                    return Ok(Got::PingPong(samples, elapsed));
                }
            }
        }
        Role::Sink => {
            if spec.plain_write_buffer == 0 {
                send_stream(spec, &mut w, &setup, &frame)?;
            } else {
                let mut bw = BufWriter::with_capacity(spec.plain_write_buffer, &mut w);
                send_stream(spec, &mut bw, &setup, &frame)?;
                bw.flush()?;
            }
            let f = rd.next(&mut r)?.ok_or_else(closed)?;
            Report::decode(&rd.get(f)[4..])
                .map(Got::Sink)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad report"))
        }
    }
}

/// The one-way sender: the set-up message, the warm-up and measured
/// frames, each written on its own, and the end message.
fn send_stream(spec: &Spec, w: &mut impl Write, setup: &[u8], frame: &[u8]) -> io::Result<()> {
    w.write_all(setup)?;
    let total = spec.count.map(|n| spec.warmup + n);
    let mut sent = 0u64;
    let mut end_at = None;
    loop {
        if sent == spec.warmup && end_at.is_none() {
            end_at = spec.duration.map(|d| Instant::now() + d);
        }
        let mut n = CHUNK;
        if let Some(t) = total {
            n = n.min(t - sent);
        }
        if sent < spec.warmup {
            n = n.min(spec.warmup - sent);
        }
        if n == 0 {
            break;
        }
        for _ in 0..n {
            w.write_all(frame)?;
        }
        sent += n;
        if sent > spec.warmup && end_at.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    w.write_all(&frame_of(&proto::end()))
}

/// One baseline run: a server thread (unless `connect` names a remote
/// one) and a client thread.
pub fn run(spec: &Spec, connect: Option<SocketAddr>) -> Result<Figures, RunError> {
    let deadline = Instant::now() + spec.timeout;
    let fail = |what: &str, e: &dyn std::fmt::Display| RunError::Failed(format!("{what}: {e}"));
    let mut server = None;
    let addr = match connect {
        Some(a) => a,
        None => {
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| fail("cannot listen", &e))?;
            // Accepted sockets inherit the listener's buffer sizes.
            socket_buffers(&l, spec.socket_buffers).map_err(|e| fail("SO_SNDBUF/SO_RCVBUF", &e))?;
            let addr = l.local_addr().map_err(|e| fail("cannot listen", &e))?;
            let busy = spec.busy_poll;
            let read_buffer = spec.plain_read_buffer;
            server = Some(
                thread::Builder::new()
                    .name("plain-server".into())
                    .spawn(move || -> io::Result<()> {
                        l.set_nonblocking(true)?;
                        let s = loop {
                            match l.accept() {
                                Ok((s, _)) => break s,
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                    if Instant::now() > deadline {
                                        return Err(io::ErrorKind::TimedOut.into());
                                    }
                                    thread::sleep(Duration::from_millis(1));
                                }
                                Err(e) => return Err(e),
                            }
                        };
                        serve_conn(s, busy, read_buffer, deadline)
                    })
                    .map_err(|e| fail("cannot start a thread", &e))?,
            );
            addr
        }
    };
    let (tx, rx) = mpsc::channel();
    let spec2 = spec.clone();
    let client_thread = thread::Builder::new()
        .name("plain-client".into())
        .spawn(move || {
            let r = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).and_then(|s| {
                socket_buffers(&s, spec2.socket_buffers)?;
                client(&spec2, s, deadline)
            });
            let _ = tx.send(r);
        })
        .map_err(|e| fail("cannot start a thread", &e))?;
    let got = rx.recv_timeout(spec.timeout + Duration::from_secs(5));
    let _ = client_thread.join();
    if let Some(t) = server {
        if let Ok(Err(e)) = t.join() {
            if got.as_ref().is_ok_and(|g| g.is_err()) {
                eprintln!("netio-perf: plain server: {e}");
            }
        }
    }
    match got {
        Ok(Ok(Got::PingPong(mut s, elapsed))) => {
            let f = metrics::pingpong(&mut s, &mut [], elapsed);
            if f.is_empty() {
                Err(RunError::Failed("no round trip measured".into()))
            } else {
                Ok(f)
            }
        }
        Ok(Ok(Got::Sink(rep))) => {
            metrics::one_way(spec.test == TestKind::Bw, &rep, false).map_err(RunError::Failed)
        }
        Ok(Err(e)) => Err(fail("plain TCP run failed", &e)),
        Err(_) => Err(RunError::Failed("plain TCP run: no result in time".into())),
    }
}

/// How the baseline's server side is set up.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Busy-polling non-blocking sockets.
    pub busy: bool,
    /// `SO_SNDBUF` and `SO_RCVBUF`, or the system's default.
    pub socket_buffers: Option<usize>,
    /// The receive buffer frames are parsed out of.
    pub read_buffer: usize,
}

/// Serves the baseline on `address` until `limit` passes (forever with
/// `None`), one thread per connection.
pub fn serve(
    address: SocketAddr,
    o: ServeOptions,
    limit: Option<Duration>,
    on_listening: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let l = TcpListener::bind(address)?;
    socket_buffers(&l, o.socket_buffers)?;
    on_listening(l.local_addr()?);
    let end = limit.map(|d| Instant::now() + d);
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                let deadline = end.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
                thread::spawn(move || {
                    if let Err(e) = serve_conn(s, o.busy, o.read_buffer, deadline) {
                        eprintln!("netio-perf: plain connection: {e}");
                    }
                });
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if end.is_some_and(|d| Instant::now() > d) {
                    return Ok(());
                }
                thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that hands out at most `step` bytes per `read`.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.step.min(buf.len()).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn frames_are_parsed_across_reads_and_the_buffer_grows_for_large_ones() {
        let sizes = [1usize, 64, 5000, 70_000, 3, 200_000, 64];
        let mut stream = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            stream.extend_from_slice(&frame_of(&vec![i as u8; n]));
        }
        for step in [1, 7, 4096, 1 << 20] {
            let mut src = Trickle {
                data: &stream,
                step,
            };
            let mut rd = FrameReader::new(4096);
            for (i, &n) in sizes.iter().enumerate() {
                let f = rd.next(&mut src).unwrap().expect("a frame");
                let f = rd.get(f);
                assert_eq!(f.len(), 4 + n, "step {step}");
                assert_eq!(&f[..4], &(n as u32).to_le_bytes());
                assert!(f[4..].iter().all(|&b| b == i as u8), "step {step}");
            }
            assert_eq!(rd.next(&mut src).unwrap(), None, "clean end");
        }
        // A stream that ends inside a frame is an error, not an end.
        let mut src = Trickle {
            data: &stream[..10],
            step: 3,
        };
        let mut rd = FrameReader::new(4096);
        rd.next(&mut src).unwrap().unwrap();
        assert!(rd.next(&mut src).is_err());
    }

    #[test]
    fn buffer_sizes_by_message_size() {
        assert_eq!(write_buffer(64), 256 << 10);
        assert_eq!(write_buffer((64 << 10) - 1), 256 << 10);
        assert_eq!(write_buffer(64 << 10), 1 << 20);
        assert_eq!(write_buffer((1 << 20) - 1), 1 << 20);
        assert_eq!(write_buffer(1 << 20), 0);
        assert_eq!(read_buffer(64), READ_BUFFER);
        assert_eq!(read_buffer(1 << 20), (1 << 20) + 4);
    }
}
