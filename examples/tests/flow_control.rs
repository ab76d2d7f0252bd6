//! Receive-side flow control of the [`EchoServer`]: a peer floods it with
//! messages and does not read its echoes. The server must neither drop an
//! echo nor hold more and more of them: it pauses receiving from the
//! connection, keeps the one echo it could not send, and resumes once that
//! echo went out. When the peer starts reading, every echo arrives, in
//! order. On the simulator and over TCP on 127.0.0.1 (bounded in time).

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler, RefuseReason, SendError,
};
use netio_examples::{lock, ping_message, send, EchoServer, ServerStats};
use netio_sim::Sim;
use netio_tcp::{TcpConfig, TcpProvider};

/// What the flooding peer saw.
#[derive(Debug, Default, Clone)]
struct FloodReport {
    /// Its connection, once established.
    conn: Option<ConnId>,
    /// Messages sent (accepted by the backend).
    sent: u64,
    /// Echoes received that matched message number `received`, in order.
    matched: u64,
    /// Echoes that did not.
    mismatched: u64,
    /// Send errors other than `NoResources`.
    errors: Vec<String>,
    /// Why the connection closed or was refused, once it did.
    closed: Option<String>,
}

/// Sends `count` numbered messages of `size` bytes as fast as the backend
/// takes them, without reading: receiving is paused as soon as the
/// connection is established. The test resumes it ("starts reading"); the
/// peer closes after the last echo.
struct Flood {
    count: u64,
    size: usize,
    msg: Vec<u8>,
    expected: Vec<u8>,
    report: Arc<Mutex<FloodReport>>,
}

impl Flood {
    fn new(count: u64, size: usize, report: Arc<Mutex<FloodReport>>) -> Self {
        Self {
            count,
            size,
            msg: Vec::with_capacity(size),
            expected: Vec::with_capacity(size),
            report,
        }
    }

    fn pump<B: Backend + ?Sized>(&mut self, b: &B, conn: ConnId) {
        let mut r = lock(&self.report);
        while r.sent < self.count {
            ping_message(&mut self.msg, r.sent, self.size);
            match send(b, conn, &self.msg, r.sent) {
                Ok(()) => r.sent += 1,
                Err(SendError::NoResources) => break,
                Err(e) => {
                    r.errors.push(e.to_string());
                    break;
                }
            }
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for Flood {
    fn on_connection_established(
        &mut self,
        b: &B,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        b.pause_receive(conn)
            .expect("pause an established connection");
        lock(&self.report).conn = Some(conn);
        self.pump(b, conn);
    }

    fn on_connection_refused(&mut self, _: &B, _: ConnId, _: EndpointAddress, why: &RefuseReason) {
        lock(&self.report).closed = Some(format!("refused: {why}"));
    }

    fn on_sends_completed(&mut self, b: &B, conn: ConnId, _: &[u64]) {
        self.pump(b, conn);
    }

    fn on_data(&mut self, b: &B, conn: ConnId, data: &[u8]) {
        let mut r = lock(&self.report);
        ping_message(&mut self.expected, r.matched + r.mismatched, self.size);
        if data == self.expected.as_slice() {
            r.matched += 1;
        } else {
            r.mismatched += 1;
        }
        if r.matched + r.mismatched == self.count {
            drop(r);
            b.close_active_endpoint(conn)
                .expect("close after the last echo");
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &B,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        lock(&self.report).closed = Some(why.to_string());
    }
}

/// Small queues, so the backlog reaches the peer after a few messages.
fn config() -> BackendConfig {
    BackendConfig {
        send_queue_depth: 4,
        ..BackendConfig::default()
    }
}

#[test]
fn echo_server_pauses_a_peer_that_does_not_read_and_drops_no_echo_on_the_simulator() {
    const COUNT: u64 = 500;
    const SIZE: usize = 512;
    let sim = Sim::with_seed(11);
    // Small socket buffers (TCP profile), so that 500 × 512 bytes are more
    // than the connection holds without the peer reading.
    sim.set_tcp_window(16 * 1024);
    let (server_host, client_host) = (sim.next_host(), sim.next_host());
    let stats = Arc::new(Mutex::new(ServerStats::default()));
    let server = server_host
        .backend(config(), EchoServer::with_stats(stats.clone(), |_| {}))
        .unwrap();
    let params = ConnectionParams::receive(1024, 4).with_buffered(1024, 4);
    let listen = server
        .open_listen_endpoint(EndpointAddress::new(server_host.ip(), 0), params.clone())
        .unwrap();
    let report = Arc::new(Mutex::new(FloodReport::default()));
    let client = client_host
        .backend(config(), Flood::new(COUNT, SIZE, report.clone()))
        .unwrap();
    let conn = client.open_active_endpoint(listen, params).unwrap();
    let r = report.clone();
    assert!(sim.run_until(Duration::from_secs(1), || lock(&r).conn.is_some()));
    assert_eq!(lock(&report).conn, Some(conn));
    let memory_at_start = server.memory_usage();

    // The peer does not read: the backlog fills and the sends stop.
    sim.run_for(Duration::from_secs(10));
    let stalled = lock(&report).clone();
    sim.run_for(Duration::from_secs(10));
    let still = lock(&report).clone();
    assert!(
        stalled.sent < COUNT,
        "every send went through without the peer reading: {stalled:?}"
    );
    assert_eq!(
        still.sent, stalled.sent,
        "sends went on while nothing was read"
    );
    assert_eq!(
        (still.matched, still.mismatched),
        (0, 0),
        "paused, yet data came"
    );
    let s = lock(&stats).clone();
    assert!(s.paused >= 1, "the server never paused: {s:?}");
    assert_eq!(
        s.held, 1,
        "one echo held on the one paused connection: {s:?}"
    );
    assert_eq!(s.max_held, 1, "{s:?}");
    assert_eq!(s.failed, 0, "{s:?}");
    assert!(s.echoed < COUNT, "{s:?}");
    assert_eq!(server.memory_usage(), memory_at_start);

    // The peer starts reading: every echo arrives, in order, none dropped.
    client.resume_receive(conn).unwrap();
    let r = report.clone();
    assert!(
        sim.run_until(sim.now() + Duration::from_secs(60), || lock(&r)
            .closed
            .is_some())
    );
    let r = lock(&report).clone();
    assert_eq!(
        (r.sent, r.matched, r.mismatched),
        (COUNT, COUNT, 0),
        "{r:?}"
    );
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(r.closed.as_deref(), Some("closed locally"));
    let s = lock(&stats).clone();
    assert_eq!(
        (s.echoed, s.failed, s.held, s.max_held),
        (COUNT, 0, 0, 1),
        "{s:?}"
    );
}

#[test]
fn echo_server_pauses_a_peer_that_does_not_read_and_drops_no_echo_over_tcp() {
    // 64 KiB messages and 128 KiB socket buffers: 12.5 MiB cannot all sit
    // in the sockets and queues, so the peer's sends must stop.
    const COUNT: u64 = 200;
    const SIZE: usize = 64 * 1024;
    const LIMIT: Duration = Duration::from_secs(30);
    let tcp = TcpConfig {
        send_buffer_size: Some(128 * 1024),
        recv_buffer_size: Some(128 * 1024),
        ..TcpConfig::default()
    };
    let lp = MioLoop::new().unwrap();
    let stats = Arc::new(Mutex::new(ServerStats::default()));
    let server = TcpProvider::create_with(
        &lp,
        config(),
        tcp.clone(),
        EchoServer::with_stats(stats.clone(), |_| {}),
    )
    .unwrap();
    let params = ConnectionParams::receive(SIZE, 4);
    let listen = server
        .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
        .unwrap();
    let report = Arc::new(Mutex::new(FloodReport::default()));
    let client =
        TcpProvider::create_with(&lp, config(), tcp, Flood::new(COUNT, SIZE, report.clone()))
            .unwrap();
    let runner = lp.clone();
    let loop_thread = thread::spawn(move || runner.run(|| {}));
    let conn = client.open_active_endpoint(listen, params).unwrap();

    let outcome = (|| {
        // Wait until the peer's sends have stopped for a while.
        let deadline = Instant::now() + LIMIT;
        let mut last = (u64::MAX, Instant::now());
        loop {
            thread::sleep(Duration::from_millis(20));
            let (sent, s) = (lock(&report).sent, lock(&stats).clone());
            if sent != last.0 {
                last = (sent, Instant::now());
            } else if s.held > 0 && last.1.elapsed() > Duration::from_millis(300) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "no stall in time: {:?}, server {s:?}",
                    lock(&report)
                ));
            }
        }
        let stalled = lock(&report).clone();
        let s = lock(&stats).clone();
        if stalled.sent >= COUNT || stalled.matched + stalled.mismatched > 0 {
            return Err(format!("the peer was not held back: {stalled:?}"));
        }
        if s.paused < 1 || s.held != 1 || s.max_held != 1 || s.failed != 0 {
            return Err(format!("server while the peer does not read: {s:?}"));
        }

        // Start reading.
        client.resume_receive(conn).map_err(|e| e.to_string())?;
        while lock(&report).closed.is_none() {
            if Instant::now() > deadline + LIMIT {
                return Err(format!("not done in time: {:?}", lock(&report)));
            }
            thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    })();
    lp.stop();
    loop_thread.join().unwrap();
    outcome.unwrap();
    let r = lock(&report).clone();
    assert_eq!(
        (r.sent, r.matched, r.mismatched),
        (COUNT, COUNT, 0),
        "{r:?}"
    );
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(r.closed.as_deref(), Some("closed locally"));
    let s = lock(&stats).clone();
    assert_eq!((s.echoed, s.failed, s.max_held), (COUNT, 0, 1), "{s:?}");
}
