//! What the async layer costs: 64-byte ping-pong latency and 64-byte
//! message rate over TCP on 127.0.0.1, through handler callbacks and
//! through `netio-async`, alternated in one process so the ratio is
//! measured under the same conditions.
//!
//! ```text
//! cargo run --release -p netio-async --example cost [-- --runs 5]
//! ```
//!
//! All paths use one `MioLoop` thread for the backends. The async path
//! runs twice: as tasks on the loop thread (`AsyncBackend::spawn`), and
//! with its futures polled on two more threads (server and client, with
//! `futures::executor::block_on`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::StreamExt;
use netio_async::AsyncBackend;
use netio_core::mio_loop::MioLoop;
use netio_core::Provider;
use netio_core::{
    Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, CopyMessage, EndpointAddress,
    EventLoop, Handler, SendError,
};
use netio_tcp::{TcpBackend, TcpProvider};

const MSG: [u8; 64] = [7; 64];
const ROUND_TRIPS: usize = 5_000;
const MESSAGES: usize = 200_000;

fn params() -> ConnectionParams {
    ConnectionParams::receive(256, 64)
}

fn config() -> BackendConfig {
    BackendConfig {
        send_queue_depth: 256,
        ..BackendConfig::default()
    }
}

/// Echoes every message (the ping-pong server of the callback path).
struct Echo;
impl Handler<TcpBackend> for Echo {
    fn on_data(&mut self, b: &TcpBackend, conn: ConnId, data: &[u8]) {
        let _ = b.send_data_copy(conn, &[data], &[], 0);
    }
}

/// Sends the next ping on each pong until `left` is used up.
struct Pinger {
    left: Arc<AtomicUsize>,
}
impl Handler<TcpBackend> for Pinger {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        let _ = b.send_data_copy(conn, &[&MSG], &[], 0);
    }
    fn on_data(&mut self, b: &TcpBackend, conn: ConnId, _: &[u8]) {
        if self.left.fetch_sub(1, Ordering::AcqRel) > 1 {
            let _ = b.send_data_copy(conn, &[&MSG], &[], 0);
        }
    }
}

/// Counts what arrives.
struct Counter(Arc<AtomicUsize>);
impl Handler<TcpBackend> for Counter {
    fn on_data(&mut self, _: &TcpBackend, _: ConnId, _: &[u8]) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Keeps the connection's send queue full until `left` is used up.
struct Pump {
    left: Arc<Mutex<usize>>,
}
impl Pump {
    fn fill(&self, b: &TcpBackend, conn: ConnId) {
        let mut left = self.left.lock().unwrap();
        while *left > 0 {
            match b.send_data_copy(conn, &[&MSG], &[], 0) {
                Ok(()) => *left -= 1,
                Err(SendError::NoResources) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
    }
}
impl Handler<TcpBackend> for Pump {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.fill(b, conn);
    }
    fn on_sends_completed(&mut self, b: &TcpBackend, conn: ConnId, _: &[u64]) {
        self.fill(b, conn);
    }
}

/// Keeps the connection's send queue full with batch sends (up to 256
/// messages a call) until `left` is used up.
struct PumpBatch {
    left: Arc<Mutex<usize>>,
}
impl PumpBatch {
    fn fill(&self, b: &TcpBackend, conn: ConnId) {
        let mut left = self.left.lock().unwrap();
        let batch: Vec<CopyMessage<'_>> = (0..256).map(|_| CopyMessage::new(&MSG, 0)).collect();
        while *left > 0 {
            let n = (*left).min(batch.len());
            match b.send_copy_batch(conn, &batch[..n]) {
                Ok(()) => *left -= n,
                Err(e) if matches!(e.error, SendError::NoResources) => {
                    *left -= e.sent;
                    break;
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }
}
impl Handler<TcpBackend> for PumpBatch {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.fill(b, conn);
    }
    fn on_sends_completed(&mut self, b: &TcpBackend, conn: ConnId, _: &[u64]) {
        self.fill(b, conn);
    }
}

fn wait(cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < end, "a measurement did not finish in 60 s");
        thread::yield_now();
    }
}

/// Callback ping-pong: mean round trip.
fn callback_pingpong(lp: &MioLoop) -> Duration {
    let server = TcpProvider::create(lp, config(), Echo).unwrap();
    let addr = server
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .unwrap();
    let left = Arc::new(AtomicUsize::new(ROUND_TRIPS));
    let client = TcpProvider::create(lp, config(), Pinger { left: left.clone() }).unwrap();
    let t = Instant::now();
    client.open_active_endpoint(addr, params()).unwrap();
    wait(|| left.load(Ordering::Acquire) == 0);
    t.elapsed() / ROUND_TRIPS as u32
}

/// Async ping-pong: mean round trip.
fn async_pingpong(lp: &MioLoop) -> Duration {
    let server = AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap();
    let client = AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap();
    let addr = server
        .listen(EndpointAddress::localhost(0), params())
        .unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            block_on(async {
                let conn = server.accept().await.unwrap();
                while let Some(m) = conn.recv().await {
                    if conn.send(&m).await.is_err() {
                        break;
                    }
                }
            })
        });
        let t = Instant::now();
        block_on(async {
            let conn = client.connect(addr, params()).await.unwrap();
            for _ in 0..ROUND_TRIPS {
                conn.send(&MSG).await.unwrap();
                conn.recv().await.unwrap();
            }
            let rtt = t.elapsed() / ROUND_TRIPS as u32;
            conn.close().unwrap();
            rtt
        })
    })
}

/// Async ping-pong with both sides tasks on the loop thread: mean round
/// trip.
fn loop_pingpong(lp: &MioLoop) -> Duration {
    let server = Arc::new(AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap());
    let client = Arc::new(AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap());
    let addr = server
        .listen(EndpointAddress::localhost(0), params())
        .unwrap();
    let s = Arc::clone(&server);
    server
        .spawn(async move {
            let conn = s.accept().await.unwrap();
            while let Some(m) = conn.recv().await {
                if conn.send(&m).await.is_err() {
                    break;
                }
            }
        })
        .detach();
    let c = Arc::clone(&client);
    let t = Instant::now();
    block_on(client.spawn(async move {
        let conn = c.connect(addr, params()).await.unwrap();
        for _ in 0..ROUND_TRIPS {
            conn.send(&MSG).await.unwrap();
            conn.recv().await.unwrap();
        }
        let rtt = t.elapsed() / ROUND_TRIPS as u32;
        conn.close().unwrap();
        rtt
    }))
}

/// Callback rate: messages per second, one send call per message or
/// batches of 256.
fn callback_rate(lp: &MioLoop, batch: bool) -> f64 {
    let got = Arc::new(AtomicUsize::new(0));
    let server = TcpProvider::create(lp, config(), Counter(got.clone())).unwrap();
    let addr = server
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .unwrap();
    let left = Arc::new(Mutex::new(MESSAGES));
    let client = if batch {
        TcpProvider::create(
            lp,
            config(),
            Box::new(PumpBatch { left }) as Box<dyn Handler<TcpBackend>>,
        )
    } else {
        TcpProvider::create(
            lp,
            config(),
            Box::new(Pump { left }) as Box<dyn Handler<TcpBackend>>,
        )
    }
    .unwrap();
    let t = Instant::now();
    client.open_active_endpoint(addr, params()).unwrap();
    wait(|| got.load(Ordering::Relaxed) == MESSAGES);
    MESSAGES as f64 / t.elapsed().as_secs_f64()
}

/// Async rate: messages per second, 256 sends in flight.
fn async_rate(lp: &MioLoop) -> f64 {
    let server = AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap();
    let client = AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap();
    let addr = server
        .listen(EndpointAddress::localhost(0), params())
        .unwrap();
    thread::scope(|s| {
        let t = Instant::now();
        let receiver = s.spawn(|| {
            block_on(async {
                let conn = server.accept().await.unwrap();
                let mut n = 0;
                while n < MESSAGES && conn.recv().await.is_some() {
                    n += 1;
                }
                n
            })
        });
        block_on(async {
            let conn = client.connect(addr, params()).await.unwrap();
            futures::stream::iter(0..MESSAGES)
                .map(|_| conn.send(&MSG))
                .buffer_unordered(256)
                .for_each(|r| {
                    r.unwrap();
                    futures::future::ready(())
                })
                .await;
        });
        assert_eq!(receiver.join().unwrap(), MESSAGES);
        MESSAGES as f64 / t.elapsed().as_secs_f64()
    })
}

/// How the sending task of [`loop_rate`] sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum How {
    /// One `send` future per message, 256 in flight.
    Futures,
    /// `send_batch` of 256.
    Batch,
    /// `feed` per message, `flush` at the end.
    Feed,
}

/// Async rate with both sides tasks on the loop thread: messages per
/// second, sent as `how` says.
fn loop_rate(lp: &MioLoop, how: How) -> f64 {
    let server = Arc::new(AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap());
    let client = Arc::new(AsyncBackend::new(|h| TcpProvider::create(lp, config(), h)).unwrap());
    let addr = server
        .listen(EndpointAddress::localhost(0), params())
        .unwrap();
    let t = Instant::now();
    let s = Arc::clone(&server);
    let receiver = server.spawn(async move {
        let conn = s.accept().await.unwrap();
        let (mut n, mut buf) = (0, Vec::new());
        while n < MESSAGES && conn.recv_into(&mut buf).await {
            n += 1;
        }
        n
    });
    let c = Arc::clone(&client);
    let sender = client.spawn(async move {
        let conn = c.connect(addr, params()).await.unwrap();
        if how == How::Feed {
            for _ in 0..MESSAGES {
                conn.feed(&MSG).await.unwrap();
            }
            conn.flush().await.unwrap();
        } else if how == How::Batch {
            let batch = [&MSG[..]; 256];
            let mut left = MESSAGES;
            while left > 0 {
                let n = left.min(batch.len());
                conn.send_batch(&batch[..n]).await.unwrap();
                left -= n;
            }
        } else {
            futures::stream::iter(0..MESSAGES)
                .map(|_| conn.send(&MSG))
                .buffer_unordered(256)
                .for_each(|r| {
                    r.unwrap();
                    futures::future::ready(())
                })
                .await;
        }
    });
    block_on(sender);
    assert_eq!(block_on(receiver), MESSAGES);
    MESSAGES as f64 / t.elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .map(|n| n.parse().expect("--runs N"))
        .unwrap_or(5);
    let lp = MioLoop::new().unwrap();
    let runner = lp.clone();
    let t = thread::spawn(move || runner.run(|| {}));

    let (mut pp, mut rate, mut pp_l, mut rate_l) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut pp_cb, mut pp_as, mut r_cb, mut r_as) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut pp_lo, mut r_lo) = (Vec::new(), Vec::new());
    let (mut rate_b, mut r_cbb, mut r_lob) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rate_f, mut r_cbf, mut r_lof) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        // The order alternates: A B C, C B A, ...
        let (c, l, a) = if run % 2 == 0 {
            let c = callback_pingpong(&lp);
            let l = loop_pingpong(&lp);
            (c, l, async_pingpong(&lp))
        } else {
            let a = async_pingpong(&lp);
            let l = loop_pingpong(&lp);
            (callback_pingpong(&lp), l, a)
        };
        pp.push(a.as_secs_f64() / c.as_secs_f64());
        pp_l.push(l.as_secs_f64() / c.as_secs_f64());
        pp_cb.push(c.as_secs_f64() * 1e6);
        pp_as.push(a.as_secs_f64() * 1e6);
        pp_lo.push(l.as_secs_f64() * 1e6);
        let (c, l, a) = if run % 2 == 0 {
            let c = callback_rate(&lp, false);
            let l = loop_rate(&lp, How::Futures);
            (c, l, async_rate(&lp))
        } else {
            let a = async_rate(&lp);
            let l = loop_rate(&lp, How::Futures);
            (callback_rate(&lp, false), l, a)
        };
        rate.push(a / c);
        rate_l.push(l / c);
        r_cb.push(c / 1e6);
        r_as.push(a / 1e6);
        r_lo.push(l / 1e6);
        let (cb, lb) = if run % 2 == 0 {
            let c = callback_rate(&lp, true);
            (c, loop_rate(&lp, How::Batch))
        } else {
            let l = loop_rate(&lp, How::Batch);
            (callback_rate(&lp, true), l)
        };
        rate_b.push(lb / cb);
        r_cbb.push(cb / 1e6);
        r_lob.push(lb / 1e6);
        let (c, f) = if run % 2 == 0 {
            let c = callback_rate(&lp, false);
            (c, loop_rate(&lp, How::Feed))
        } else {
            let f = loop_rate(&lp, How::Feed);
            (callback_rate(&lp, false), f)
        };
        rate_f.push(f / c);
        r_cbf.push(c / 1e6);
        r_lof.push(f / 1e6);
    }
    lp.stop();
    let _ = t.join();
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        format!("{lo:.2}-{hi:.2}")
    };
    println!("netio-async against handler callbacks, TCP 127.0.0.1, 64 B, {runs} alternated pairs");
    println!(
        "ping-pong round trip: callbacks {:.1} us; async, tasks on the loop {:.1} us: {:.2}x (range {}); async, futures on other threads {:.1} us: {:.2}x (range {})",
        median(pp_cb),
        median(pp_lo),
        median(pp_l.clone()),
        range(&pp_l),
        median(pp_as),
        median(pp.clone()),
        range(&pp)
    );
    println!(
        "message rate: callbacks {:.2} M/s; async, tasks on the loop {:.2} M/s: {:.2}x (range {}); async, futures on other threads {:.2} M/s: {:.2}x (range {})",
        median(r_cb),
        median(r_lo),
        median(rate_l.clone()),
        range(&rate_l),
        median(r_as),
        median(rate.clone()),
        range(&rate)
    );
    println!(
        "message rate, one at a time without awaiting each completion: callbacks {:.2} M/s; async, tasks on the loop (feed, then flush) {:.2} M/s: {:.2}x (range {})",
        median(r_cbf),
        median(r_lof),
        median(rate_f.clone()),
        range(&rate_f)
    );
    println!(
        "message rate, batches of 256: callbacks (send_copy_batch) {:.2} M/s; async, tasks on the loop (send_batch) {:.2} M/s: {:.2}x (range {})",
        median(r_cbb),
        median(r_lob),
        median(rate_b.clone()),
        range(&rate_b)
    );
}
