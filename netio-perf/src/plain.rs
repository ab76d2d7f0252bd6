//! The baseline: the same tests over plain `std::net` TCP, server and
//! client on two threads, messages framed by a 4-byte little-endian length.
//!
//! Interrupt-mode runs use blocking sockets; busy-poll runs use
//! non-blocking sockets polled in a tight loop. Readers go through a
//! `BufReader`; one-way senders write through a `BufWriter` (large frames
//! pass straight through it), ping-pong writes each frame with one
//! `write_all`. `TCP_NODELAY` is set on every socket, as netio-tcp does.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::cli::TestKind;
use crate::metrics::{self, Figures};
use crate::proto::{self, Report, Role, SinkCounter};
use crate::provider::{RunError, Spec};

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

/// Reads one frame (length included) into `buf`; `false` at a clean end of
/// stream.
fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut hdr = [0u8; 4];
    match r.read_exact(&mut hdr) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(hdr) as usize;
    if len > crate::cli::MAX_SIZE + 64 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame too long"));
    }
    buf.resize(4 + len, 0);
    buf[..4].copy_from_slice(&hdr);
    r.read_exact(&mut buf[4..])?;
    Ok(true)
}

/// Serves one connection: reads the set-up message, then echoes or counts.
pub fn serve_conn(s: TcpStream, busy: bool, deadline: Instant) -> io::Result<()> {
    let mut r = BufReader::with_capacity(256 * 1024, Io::new(s.try_clone()?, busy, deadline)?);
    let mut w = Io::new(s, busy, deadline)?;
    let mut frame = Vec::new();
    if !read_frame(&mut r, &mut frame)? {
        return Ok(());
    }
    let Some((role, _, warmup)) = proto::parse_setup(&frame[4..]) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "bad set-up message",
        ));
    };
    match role {
        Role::Echo => {
            while read_frame(&mut r, &mut frame)? {
                w.write_all(&frame)?;
            }
        }
        Role::Sink => {
            let mut c = SinkCounter::new(warmup);
            while read_frame(&mut r, &mut frame)? {
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
    let mut r = BufReader::with_capacity(256 * 1024, Io::new(s.try_clone()?, busy, deadline)?);
    let w = Io::new(s, busy, deadline)?;
    let mut msg = Vec::new();
    proto::data_message(&mut msg, spec.size);
    let mut frame = frame_of(&msg);
    let setup = frame_of(&proto::setup(spec.role(), spec.mode, spec.warmup));
    let mut reply = Vec::new();
    match spec.role() {
        Role::Echo => {
            let mut w = w;
            w.write_all(&setup)?;
            let reserve = spec.count.unwrap_or(1 << 16).min(1 << 22) as usize;
            let mut samples = Vec::with_capacity(reserve);
            let mut start = Instant::now();
            let mut i = 0u64;
            loop {
                if i == spec.warmup {
                    start = Instant::now();
                }
                proto::set_seq(&mut frame[4..], i);
                let t = Instant::now();
                w.write_all(&frame)?;
                if !read_frame(&mut r, &mut reply)? {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "server closed",
                    ));
                }
                let now = Instant::now();
                if !proto::echo_matches(&reply[4..], spec.size, i, true) {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "echo mismatch"));
                }
                if i >= spec.warmup {
                    samples.push((now - t).as_nanos() as u64);
                }
                i += 1;
                let measured = i.saturating_sub(spec.warmup);
                let fin = match (spec.count, spec.duration) {
                    (Some(n), _) => measured >= n,
                    (None, Some(d)) => measured > 0 && now - start >= d,
                    (None, None) => true,
                };
                if fin {
                    return Ok(Got::PingPong(samples, now - start));
                }
            }
        }
        Role::Sink => {
            let mut w = BufWriter::with_capacity(64 * 1024, w);
            w.write_all(&setup)?;
            let mut sent = 0u64;
            let mut end_at = None;
            loop {
                let more = match spec.count {
                    Some(n) => sent < spec.warmup + n,
                    None => end_at.is_none_or(|d| Instant::now() < d),
                };
                if !more {
                    break;
                }
                if sent == spec.warmup {
                    end_at = spec.duration.map(|d| Instant::now() + d);
                }
                w.write_all(&frame)?;
                sent += 1;
            }
            w.write_all(&frame_of(&proto::end()))?;
            w.flush()?;
            if !read_frame(&mut r, &mut reply)? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed",
                ));
            }
            Report::decode(&reply[4..])
                .map(Got::Sink)
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad report"))
        }
    }
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
            let addr = l.local_addr().map_err(|e| fail("cannot listen", &e))?;
            let busy = spec.busy_poll;
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
                        serve_conn(s, busy, deadline)
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
            let r = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
                .and_then(|s| client(&spec2, s, deadline));
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

/// Serves the baseline on `address` until `limit` passes (forever with
/// `None`), one thread per connection.
pub fn serve(
    address: SocketAddr,
    busy: bool,
    limit: Option<Duration>,
    on_listening: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let l = TcpListener::bind(address)?;
    on_listening(l.local_addr()?);
    let end = limit.map(|d| Instant::now() + d);
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                let deadline = end.unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400));
                thread::spawn(move || {
                    if let Err(e) = serve_conn(s, busy, deadline) {
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
