//! The simulator at scale: a world of many hosts and connections, its
//! set-up time and memory, and deliveries per real second in two traffic
//! patterns.
//!
//! ```text
//! cargo run --release -p netio-sim --example scale [-- HOSTS FANOUT MESSAGES INCAST]
//! cargo run --release -p netio-sim --example scale -- 10000 10 10 1000   # the issue's size
//! ```
//!
//! - Every host runs one backend and listens; host `i` connects to the
//!   `FANOUT` hosts after it (`HOSTS × FANOUT` connections: all-to-all
//!   neighbourhoods).
//! - **set-up**: real time until every connection is established on both
//!   sides; memory is the process's resident set (`VmRSS`) before the
//!   world and after the set-up, per connection and per host.
//! - **all-to-all**: every connection sends `MESSAGES` 64-byte messages
//!   each way, at once; deliveries per real second until all arrived.
//! - **incast**: `INCAST` hosts each send `MESSAGES` 64-byte messages to
//!   host 0 over one new connection each, all into host 0's network card.
//!
//! The TCP profile and the default network cards (10 GB/s) throughout.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use netio_core::{
    Backend, BackendConfig, Capabilities, ConnId, ConnectionParams, EndpointAddress, Handler,
};
use netio_sim::{Sim, SimBackend};

const PORT: u16 = 7000;
const MSG: [u8; 64] = [7; 64];

/// Counts what the world did.
#[derive(Default)]
struct Counts {
    established: AtomicU64,
    delivered: AtomicU64,
}

/// Counts every connection and message; sends `burst` messages on each
/// connection it opened or accepted when asked (`on_timer`).
struct Node {
    counts: Arc<Counts>,
    conns: Vec<ConnId>,
}

/// The token of the timer that starts a node's burst.
const BURST: u64 = 1;

impl Handler<SimBackend> for Node {
    fn on_connection_established(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.conns.push(conn);
        self.counts.established.fetch_add(1, Ordering::Relaxed);
    }

    fn on_data(&mut self, _: &SimBackend, _: ConnId, _: &[u8]) {
        self.counts.delivered.fetch_add(1, Ordering::Relaxed);
    }

    fn on_timer(&mut self, b: &SimBackend, token: u64) {
        let n = token >> 8;
        if token & 0xff == BURST {
            for &conn in &self.conns {
                for _ in 0..n {
                    let _ = b.send_data_copy(conn, &[&MSG], &[], 0);
                }
            }
        }
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(default)
}

fn params() -> ConnectionParams {
    ConnectionParams::receive(64, 16)
}

fn config() -> BackendConfig {
    BackendConfig {
        send_queue_depth: 64,
        ..BackendConfig::default()
    }
}

/// A counting backend on `host`.
fn node(host: &netio_sim::SimHost, counts: &Arc<Counts>) -> SimBackend {
    host.backend(
        config(),
        Node {
            counts: Arc::clone(counts),
            conns: Vec::new(),
        },
    )
    .expect("backend")
}

/// Runs the world until `done`, at most `limit` of virtual time; the real
/// time it took.
fn run(sim: &Sim, limit: Duration, done: impl Fn() -> bool) -> Duration {
    let t = Instant::now();
    let ok = sim.run_until(limit, done);
    assert!(ok, "not done within {limit:?} of virtual time");
    t.elapsed()
}

fn main() {
    let hosts = arg(1, 1_000);
    let fanout = arg(2, 10);
    let messages = arg(3, 10);
    let incast = arg(4, 100).min(hosts - 1);
    let conns = hosts * fanout;
    println!(
        "netio-sim at scale: {hosts} hosts, {conns} connections (each host to the {fanout} after it), \
         {messages} messages of 64 B per connection and direction; incast: {incast} senders into host 0"
    );
    let rss0 = rss_kib();
    let sim = Sim::with_seed(1);
    let counts = Arc::new(Counts::default());
    let t = Instant::now();
    let mut backends = Vec::with_capacity(hosts as usize);
    let mut ips: Vec<IpAddr> = Vec::with_capacity(hosts as usize);
    for _ in 0..hosts {
        let host = sim.next_host();
        let b = node(&host, &counts);
        b.open_listen_endpoint(EndpointAddress::new(host.ip(), PORT), params())
            .expect("listen");
        ips.push(host.ip());
        backends.push(b);
    }
    let made = t.elapsed();
    for i in 0..hosts as usize {
        for k in 1..=fanout as usize {
            let to = ips[(i + k) % hosts as usize];
            backends[i]
                .open_active_endpoint(EndpointAddress::new(to, PORT), params())
                .expect("connect");
        }
    }
    let opened = t.elapsed();
    let c = Arc::clone(&counts);
    let wired = run(&sim, Duration::from_secs(60), move || {
        c.established.load(Ordering::Relaxed) == 2 * conns
    });
    let setup = opened + wired;
    let rss1 = rss_kib();
    let mem = (rss1.saturating_sub(rss0)) as f64 * 1024.0;
    println!(
        "set-up: {:.2} s real ({:.2} s hosts and backends, {:.2} s opening, {:.2} s until all established, {:?} virtual)",
        setup.as_secs_f64(),
        made.as_secs_f64(),
        (opened - made).as_secs_f64(),
        wired.as_secs_f64(),
        sim.now()
    );
    println!(
        "memory: {:.0} MiB resident after set-up; {:.1} KiB per connection, or {:.1} KiB per host",
        mem / (1 << 20) as f64,
        mem / conns as f64 / 1024.0,
        mem / hosts as f64 / 1024.0
    );

    // All-to-all: every connection, both ways.
    let want = 2 * conns * messages;
    for b in &backends {
        b.set_timer(Duration::ZERO, (messages << 8) | BURST);
    }
    let c = Arc::clone(&counts);
    let v0 = sim.now();
    let took = run(&sim, Duration::from_secs(600), move || {
        c.delivered.load(Ordering::Relaxed) >= want
    });
    println!(
        "all-to-all: {want} deliveries in {:.2} s real: {:.2} M deliveries per real second ({:?} virtual)",
        took.as_secs_f64(),
        want as f64 / took.as_secs_f64() / 1e6,
        sim.now() - v0
    );
    println!("memory: {:.0} MiB resident", rss_kib() as f64 / 1024.0);

    // Incast: new connections from `incast` hosts into host 0.
    let before = counts.delivered.load(Ordering::Relaxed);
    let est = counts.established.load(Ordering::Relaxed);
    let senders: Vec<SimBackend> = (1..=incast as usize)
        .map(|i| {
            let b = node(&sim.host(ips[i]), &counts);
            b.open_active_endpoint(EndpointAddress::new(ips[0], PORT), params())
                .expect("connect");
            b
        })
        .collect();
    let c = Arc::clone(&counts);
    run(&sim, Duration::from_secs(60), move || {
        c.established.load(Ordering::Relaxed) == est + 2 * incast
    });
    for b in &senders {
        b.set_timer(Duration::ZERO, (messages << 8) | BURST);
    }
    let want = before + incast * messages;
    let c = Arc::clone(&counts);
    let v0 = sim.now();
    let took = run(&sim, Duration::from_secs(600), move || {
        c.delivered.load(Ordering::Relaxed) >= want
    });
    let n = incast * messages;
    let virt = sim.now() - v0;
    println!(
        "incast: {n} deliveries into one host in {:.2} s real: {:.2} M deliveries per real second; \
         {:?} virtual, {:.2} GB/s of payload into its card",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64() / 1e6,
        virt,
        (n * 64) as f64 / virt.as_secs_f64() / 1e9
    );
}
