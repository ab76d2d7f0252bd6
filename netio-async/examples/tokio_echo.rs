//! The async API inside tokio, with no thread for the netio loop: the loop
//! is driven by a tokio task (`tokio_driver::drive`), and an echo server
//! and a client run as tokio tasks over TCP on 127.0.0.1. Then the same
//! 64-byte ping-pong written with tokio's own `TcpStream`, alternated with
//! the netio one on the same current-thread runtime, so the round trips
//! compare under the same conditions. Every client runs in a spawned task,
//! as the servers do: tokio looks at its reactor once more before it polls
//! a `block_on` future woken by another task (netio's messages reach a task
//! through the driver's task), a system call per message that tokio's own
//! sockets, which wake the `block_on` future from the reactor, do not pay.
//!
//! ```text
//! cargo run --release -p netio-async --example tokio_echo [-- --runs 5]
//! cargo run --release -p netio-async --example tokio_echo -- --only netio|loop|tokio [--runs N]
//! ```
//!
//! `--only` runs one of the three ping-pongs alone (for a profiler or a
//! system-call count) and prints its mean round trip per run.

use std::time::{Duration, Instant};

use netio_async::{tokio_driver, AsyncBackend, AsyncConn};
use netio_core::mio_loop::MioLoop;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress, Provider};
use netio_tcp::{TcpBackend, TcpProvider};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MSG: [u8; 64] = [7; 64];
const ROUND_TRIPS: u32 = 5_000;

/// The echo server's side: every message back, until the connection ends.
async fn echo_all(conn: AsyncConn<TcpBackend>) {
    let mut m = Vec::new();
    while conn.recv_into(&mut m).await {
        if conn.send(&m).await.is_err() {
            break;
        }
    }
}

/// The client's side: `ROUND_TRIPS` round trips, then a close; the mean
/// round trip.
async fn ping_all(conn: AsyncConn<TcpBackend>) -> Duration {
    let mut back = Vec::new();
    let t = Instant::now();
    for _ in 0..ROUND_TRIPS {
        conn.send(&MSG).await.expect("completed");
        assert!(conn.recv_into(&mut back).await, "an echo");
        assert_eq!(back.len(), MSG.len());
    }
    let rtt = t.elapsed() / ROUND_TRIPS;
    conn.close().expect("close");
    rtt
}

/// netio ping-pong, both sides tokio tasks: mean round trip.
async fn netio_pingpong(lp: &MioLoop) -> Duration {
    let server = AsyncBackend::new(|h| TcpProvider::create(lp, BackendConfig::default(), h))
        .expect("server backend");
    let client = AsyncBackend::new(|h| TcpProvider::create(lp, BackendConfig::default(), h))
        .expect("client backend");
    let params = ConnectionParams::receive(256, 16);
    let addr = server
        .listen(EndpointAddress::localhost(0), params.clone())
        .expect("listen");
    let echo = tokio::spawn(async move {
        echo_all(server.accept().await.expect("accepted")).await;
    });
    let conn = client.connect(addr, params).await.expect("connected");
    let rtt = tokio::spawn(ping_all(conn)).await.expect("client task");
    echo.await.expect("echo task");
    rtt
}

/// netio ping-pong, both sides tasks of the netio loop (awaited from
/// tokio): mean round trip.
async fn netio_loop_pingpong(lp: &MioLoop) -> Duration {
    let server = std::sync::Arc::new(
        AsyncBackend::new(|h| TcpProvider::create(lp, BackendConfig::default(), h))
            .expect("server backend"),
    );
    let client = std::sync::Arc::new(
        AsyncBackend::new(|h| TcpProvider::create(lp, BackendConfig::default(), h))
            .expect("client backend"),
    );
    let params = ConnectionParams::receive(256, 16);
    let addr = server
        .listen(EndpointAddress::localhost(0), params.clone())
        .expect("listen");
    let s = server.clone();
    let echo = server.spawn(async move {
        echo_all(s.accept().await.expect("accepted")).await;
    });
    let c = client.clone();
    let rtt = client
        .spawn(async move { ping_all(c.connect(addr, params).await.expect("connected")).await })
        .await;
    echo.await;
    rtt
}

/// The same exchange with tokio's `TcpStream` (no delay): mean round trip.
async fn tokio_pingpong() -> Duration {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let echo = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("accepted");
        s.set_nodelay(true).expect("nodelay");
        let mut buf = [0u8; 64];
        while s.read_exact(&mut buf).await.is_ok() {
            if s.write_all(&buf).await.is_err() {
                break;
            }
        }
    });
    let mut s = TcpStream::connect(addr).await.expect("connected");
    s.set_nodelay(true).expect("nodelay");
    let rtt = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let t = Instant::now();
        for _ in 0..ROUND_TRIPS {
            s.write_all(&MSG).await.expect("written");
            s.read_exact(&mut buf).await.expect("an echo");
        }
        t.elapsed() / ROUND_TRIPS
    })
    .await
    .expect("client task");
    echo.await.expect("echo task");
    rtt
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
    // `--only netio|loop|tokio`: that ping-pong alone, once per run, for a
    // profiler or a system-call count (no ratios).
    let only: Option<String> = std::env::args().skip_while(|a| a != "--only").nth(1);
    if let Some(which) = only {
        return run_only(&which, runs);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (netio, plain, ratio) = rt.block_on(async {
        let lp = MioLoop::new().expect("loop");
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        let (mut netio, mut plain, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        let (mut lnetio, mut lratio) = (Vec::new(), Vec::new());
        for run in 0..runs {
            // A B C, then C B A, ...
            let (n, l, p) = if run % 2 == 0 {
                let n = netio_pingpong(&lp).await;
                let l = netio_loop_pingpong(&lp).await;
                (n, l, tokio_pingpong().await)
            } else {
                let p = tokio_pingpong().await;
                let l = netio_loop_pingpong(&lp).await;
                (netio_pingpong(&lp).await, l, p)
            };
            netio.push(n.as_secs_f64() * 1e6);
            lnetio.push(l.as_secs_f64() * 1e6);
            plain.push(p.as_secs_f64() * 1e6);
            ratio.push(n.as_secs_f64() / p.as_secs_f64());
            lratio.push(l.as_secs_f64() / p.as_secs_f64());
        }
        driver.abort();
        ((netio, lnetio), plain, (ratio, lratio))
    });
    let ((netio, lnetio), (ratio, lratio)) = (netio, ratio);
    let range = |v: &[f64]| {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
        format!("{lo:.2}-{hi:.2}")
    };
    println!(
        "tokio current-thread runtime, TCP 127.0.0.1, 64 B ping-pong, {runs} alternated pairs, {ROUND_TRIPS} round trips each"
    );
    let plain = median(plain);
    println!("mean round trip: tokio TcpStream {plain:.1} us");
    println!(
        "  netio-async, tokio tasks, loop driven by tokio: {:.1} us: {:.2}x (range {})",
        median(netio),
        median(ratio.clone()),
        range(&ratio)
    );
    println!(
        "  netio-async, tasks of the netio loop, loop driven by tokio: {:.1} us: {:.2}x (range {})",
        median(lnetio),
        median(lratio.clone()),
        range(&lratio)
    );
}

/// One ping-pong alone, `runs` times: `netio` (tokio tasks), `loop` (tasks
/// of the netio loop) or `tokio` (`TcpStream`).
fn run_only(which: &str, runs: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let lp = MioLoop::new().expect("loop");
        let driver = tokio::spawn(tokio_driver::drive(lp.clone()));
        for _ in 0..runs {
            let rtt = match which {
                "netio" => netio_pingpong(&lp).await,
                "loop" => netio_loop_pingpong(&lp).await,
                "tokio" => tokio_pingpong().await,
                other => panic!("--only {other}: expected netio, loop or tokio"),
            };
            println!(
                "{which}: mean round trip {:.1} us ({ROUND_TRIPS} round trips)",
                rtt.as_secs_f64() * 1e6
            );
        }
        driver.abort();
    });
}
