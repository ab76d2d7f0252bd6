//! Differential test: one random schedule of operations (no faults) runs on
//! the simulator in its TCP profile and on the TCP provider over loopback,
//! and both must report the same per-connection outcome: the messages each
//! side received, in order; the keys completed and cancelled; how each
//! side's connection ended; and every error an operation returned.
//!
//! Each operation is followed by waiting until what it caused has been
//! reported (a connection established on both sides, every key of a burst
//! completed or cancelled and every message delivered or its connection
//! closed, a close reported on both sides), so that the outcome does not
//! depend on timing. Timing itself (virtual or real) is not compared.
//!
//! Seeded and replayable: the schedules come from seeds 1..=`NETIO_DIFF_SEEDS`
//! (default 6); `NETIO_DIFF_SEED=<n>` runs that seed alone. A mismatch
//! prints the seed, the schedule and both outcomes.

use std::fmt::Debug;
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use netio_core::mio_loop::MioLoop;
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    EventLoop, Handler, Provider, RefuseReason,
};
use netio_sim::{Sim, SimBackend};
use netio_tcp::{TcpBackend, TcpProvider};

const CLIENTS: usize = 3;
const BUF: usize = 256;
const OPS: usize = 40;

// -- schedules ----------------------------------------------------------------

/// SplitMix64, for schedules that depend on the seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    /// Client `client` opens a connection to the server.
    Connect { client: usize },
    /// A burst of `count` messages on logical connection `conn` (in order
    /// of opening; wraps around), `len` bytes each but the last, which is
    /// `last` bytes (more than the receive buffer now and then).
    Send {
        conn: usize,
        from_server: bool,
        buffered: bool,
        count: usize,
        len: usize,
        last: usize,
    },
    /// One side closes logical connection `conn`.
    Close { conn: usize, by_server: bool },
}

fn schedule(seed: u64) -> Vec<Op> {
    let mut r = Rng(seed);
    let mut ops = vec![Op::Connect { client: 0 }];
    for _ in 1..OPS {
        ops.push(match r.below(10) {
            0 | 1 => Op::Connect {
                client: r.below(CLIENTS),
            },
            2 => Op::Close {
                conn: r.below(16),
                by_server: r.below(2) == 0,
            },
            _ => Op::Send {
                conn: r.below(16),
                from_server: r.below(2) == 0,
                buffered: r.below(2) == 0,
                count: 1 + r.below(4),
                len: r.below(BUF + 1),
                last: if r.below(8) == 0 {
                    BUF + 1 + r.below(BUF)
                } else {
                    r.below(BUF + 1)
                },
            },
        });
    }
    ops
}

// -- recording ------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Ev {
    Established,
    Refused(String),
    Data(Vec<u8>),
    Completed(Vec<u64>),
    Closed(String, Vec<u64>),
}

type Log = Arc<Mutex<Vec<(usize, ConnId, Ev)>>>;

struct Rec {
    node: usize,
    log: Log,
}

impl Rec {
    fn push(&self, c: ConnId, e: Ev) {
        self.log.lock().unwrap().push((self.node, c, e));
    }
}

impl<B: Backend + ?Sized> Handler<B> for Rec {
    fn on_connection_established(&mut self, _: &B, c: ConnId, _: EndpointAddress, _: Capabilities) {
        self.push(c, Ev::Established);
    }
    fn on_connection_refused(&mut self, _: &B, c: ConnId, _: EndpointAddress, why: &RefuseReason) {
        self.push(c, Ev::Refused(format!("{why:?}")));
    }
    fn on_connection_closed(
        &mut self,
        _: &B,
        c: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        // The reason's kind (`MessageTooLarge`'s numbers are the same on
        // both, but a Protocol text may differ).
        let kind = format!("{why:?}");
        let kind = kind.split(['(', ' ', '{']).next().unwrap_or("").to_owned();
        self.push(c, Ev::Closed(kind, keys.to_vec()));
    }
    fn on_data(&mut self, _: &B, c: ConnId, data: &[u8]) {
        self.push(c, Ev::Data(data.to_vec()));
    }
    fn on_sends_completed(&mut self, _: &B, c: ConnId, keys: &[u64]) {
        self.push(c, Ev::Completed(keys.to_vec()));
    }
}

/// What one side of one logical connection saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct SideOutcome {
    established: bool,
    refused: Option<String>,
    data: Vec<Vec<u8>>,
    completed: Vec<u64>,
    closed: Option<(String, Vec<u64>)>,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Outcome {
    /// Per logical connection: (client side, server side).
    conns: Vec<(SideOutcome, SideOutcome)>,
    /// Errors returned by operations, with the operation's index.
    errors: Vec<(usize, String)>,
}

// -- running ----------------------------------------------------------------------

/// Waiting, on virtual or real time.
trait Drive {
    fn wait(&mut self, cond: &mut dyn FnMut() -> bool) -> bool;
}

struct SimDrive(Sim);

impl Drive for SimDrive {
    fn wait(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        let deadline = self.0.now() + Duration::from_secs(60);
        self.0.run_until(deadline, cond)
    }
}

struct RealDrive;

impl Drive for RealDrive {
    fn wait(&mut self, cond: &mut dyn FnMut() -> bool) -> bool {
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if cond() {
                return true;
            }
            thread::sleep(Duration::from_micros(200));
        }
        cond()
    }
}

struct Logical {
    client: usize,
    /// Handles: the client's, and the server's once accepted.
    cid: ConnId,
    sid: Option<ConnId>,
}

const SERVER: usize = CLIENTS;

fn side_of(log: &[(usize, ConnId, Ev)], node: usize, c: ConnId) -> SideOutcome {
    let mut o = SideOutcome::default();
    for (n, id, e) in log {
        if *n != node || *id != c {
            continue;
        }
        match e {
            Ev::Established => o.established = true,
            Ev::Refused(r) => o.refused = Some(r.clone()),
            Ev::Data(d) => o.data.push(d.clone()),
            Ev::Completed(k) => o.completed.extend(k),
            Ev::Closed(r, k) => o.closed = Some((r.clone(), k.clone())),
        }
    }
    o
}

/// Runs `ops` on a server (node `CLIENTS`) and clients `0..CLIENTS`.
fn run<B: Backend>(
    ops: &[Op],
    server: &B,
    clients: &[B],
    log: &Log,
    drive: &mut dyn Drive,
) -> Outcome {
    let params = || ConnectionParams::receive(BUF, 8).with_buffered(2 * BUF, 4);
    let listen = server
        .open_listen_endpoint(EndpointAddress::localhost(0), params())
        .expect("listen");
    let mut conns: Vec<Logical> = Vec::new();
    let mut out = Outcome::default();
    let mut key = 0u64;
    let snapshot = |log: &Log| log.lock().unwrap().clone();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Connect { client } => {
                let before = snapshot(log)
                    .iter()
                    .filter(|(n, _, e)| *n == SERVER && matches!(e, Ev::Established))
                    .count();
                let cid = match clients[client].open_active_endpoint(listen, params()) {
                    Ok(c) => c,
                    Err(e) => {
                        out.errors.push((i, format!("{e:?}")));
                        continue;
                    }
                };
                let ok = drive.wait(&mut || {
                    let l = snapshot(log);
                    let server_count = l
                        .iter()
                        .filter(|(n, _, e)| *n == SERVER && matches!(e, Ev::Established))
                        .count();
                    server_count > before
                        && l.iter().any(|(n, c, e)| {
                            *n == client && *c == cid && matches!(e, Ev::Established)
                        })
                });
                assert!(ok, "op {i}: connection not established");
                let sid = snapshot(log)
                    .iter()
                    .filter(|(n, _, e)| *n == SERVER && matches!(e, Ev::Established))
                    .nth(before)
                    .map(|(_, c, _)| *c);
                conns.push(Logical { client, cid, sid });
            }
            Op::Send {
                conn,
                from_server,
                buffered,
                count,
                len,
                last,
            } => {
                if conns.is_empty() {
                    continue;
                }
                // One of the three newest: most are still open.
                let l = &conns[conns.len() - 1 - conn % conns.len().min(3)];
                let (b, from, id) = if from_server {
                    (server, SERVER, l.sid.expect("accepted"))
                } else {
                    (&clients[l.client], l.client, l.cid)
                };
                // What the receiver had before the burst (taken before the
                // first send: a real loop may deliver while we send).
                let to = if from_server { l.client } else { SERVER };
                let to_id = if from_server { Some(l.cid) } else { l.sid };
                let rx_before = to_id.map_or(0, |t| side_of(&snapshot(log), to, t).data.len());
                let mut keys = Vec::new();
                for m in 0..count {
                    key += 1;
                    let n = if m + 1 == count { last } else { len };
                    let body: Vec<u8> = (0..n).map(|j| (key as usize * 31 + j) as u8).collect();
                    let r = if buffered {
                        match b.get_buffer(id) {
                            Ok(Some(mut buf)) => match buf.write(&body) {
                                Ok(()) => b.send_buffer(id, buf, key),
                                Err(e) => {
                                    out.errors.push((i, format!("write: {e:?}")));
                                    continue;
                                }
                            },
                            Ok(None) => {
                                out.errors.push((i, "no buffer".into()));
                                continue;
                            }
                            Err(e) => {
                                out.errors.push((i, format!("{e:?}")));
                                continue;
                            }
                        }
                    } else {
                        b.send_data_copy(id, &[&body], &[], key)
                    };
                    match r {
                        Ok(()) => keys.push(key),
                        Err(e) => out.errors.push((i, format!("{e:?}"))),
                    }
                }
                // Settled: every key reported, and every completed message
                // of the burst delivered, unless the connection ended.
                let ok = drive.wait(&mut || {
                    let lg = snapshot(log);
                    let tx = side_of(&lg, from, id);
                    let reported = keys.iter().all(|k| {
                        tx.completed.contains(k)
                            || tx.closed.as_ref().is_some_and(|(_, c)| c.contains(k))
                    });
                    let rx = to_id.map(|t| side_of(&lg, to, t)).unwrap_or_default();
                    let ended = tx.closed.is_some() && rx.closed.is_some();
                    let done = keys.iter().filter(|k| tx.completed.contains(k)).count();
                    reported && (ended || rx.data.len() - rx_before >= done)
                });
                assert!(
                    ok,
                    "op {i}: burst {keys:?} never settled: sender {:?}, receiver {:?}",
                    side_of(&snapshot(log), from, id),
                    to_id.map(|t| side_of(&snapshot(log), to, t))
                );
            }
            Op::Close { conn, by_server } => {
                if conns.is_empty() {
                    continue;
                }
                let l = &conns[conn % conns.len()];
                let (b, id) = if by_server {
                    (server, l.sid.expect("accepted"))
                } else {
                    (&clients[l.client], l.cid)
                };
                if let Err(e) = b.close_active_endpoint(id) {
                    out.errors.push((i, format!("{e:?}")));
                    continue;
                }
                let (client, cid, sid) = (l.client, l.cid, l.sid.expect("accepted"));
                let ok = drive.wait(&mut || {
                    let lg = snapshot(log);
                    side_of(&lg, client, cid).closed.is_some()
                        && side_of(&lg, SERVER, sid).closed.is_some()
                });
                assert!(ok, "op {i}: close not reported on both sides");
            }
        }
    }
    let lg = snapshot(log);
    for l in &conns {
        out.conns.push((
            side_of(&lg, l.client, l.cid),
            l.sid.map(|s| side_of(&lg, SERVER, s)).unwrap_or_default(),
        ));
    }
    out
}

fn on_sim(ops: &[Op], seed: u64) -> Outcome {
    let sim = Sim::with_seed(seed);
    let log: Log = Arc::default();
    let server_host = sim.host("127.0.0.1".parse().unwrap());
    let server = server_host
        .backend(
            BackendConfig::default(),
            Rec {
                node: SERVER,
                log: log.clone(),
            },
        )
        .unwrap();
    let clients: Vec<SimBackend> = (0..CLIENTS)
        .map(|node| {
            // Clients share the server's host, as on loopback.
            server_host
                .backend(
                    BackendConfig::default(),
                    Rec {
                        node,
                        log: log.clone(),
                    },
                )
                .unwrap()
        })
        .collect();
    run(ops, &server, &clients, &log, &mut SimDrive(sim))
}

fn on_tcp(ops: &[Op]) -> Outcome {
    let lp = MioLoop::new().expect("loop");
    let l2 = lp.clone();
    let (tx, rx) = mpsc::channel();
    let runner = thread::spawn(move || {
        l2.run(|| {
            let _ = tx.send(());
        })
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("loop started");
    let log: Log = Arc::default();
    let make = |node| -> TcpBackend {
        TcpProvider::create(
            &lp,
            BackendConfig::default(),
            Rec {
                node,
                log: log.clone(),
            },
        )
        .unwrap()
    };
    let server = make(SERVER);
    let clients: Vec<TcpBackend> = (0..CLIENTS).map(make).collect();
    let out = run(ops, &server, &clients, &log, &mut RealDrive);
    lp.stop();
    runner.join().unwrap();
    out
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("NETIO_DIFF_SEED") {
        return vec![s.trim().parse().expect("NETIO_DIFF_SEED is a u64")];
    }
    let n = std::env::var("NETIO_DIFF_SEEDS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(6u64);
    (1..=n).collect()
}

fn first_difference<T: Debug + PartialEq>(a: &[T], b: &[T]) -> Option<String> {
    (0..a.len().max(b.len())).find_map(|i| {
        (a.get(i) != b.get(i))
            .then(|| format!("at {i}: simulator {:?} / tcp {:?}", a.get(i), b.get(i)))
    })
}

#[test]
fn simulator_tcp_profile_and_tcp_give_the_same_outcome_for_the_same_schedule() {
    for seed in seeds() {
        let ops = schedule(seed);
        let sim = on_sim(&ops, seed);
        let tcp = on_tcp(&ops);
        if sim != tcp {
            let conns = first_difference(&sim.conns, &tcp.conns);
            let errors = first_difference(&sim.errors, &tcp.errors);
            panic!(
                "seed {seed} (replay: NETIO_DIFF_SEED={seed} cargo test -p netio-tcp --test \
                 differential): the providers differ\nconnections: {conns:?}\nerrors: \
                 {errors:?}\nschedule: {ops:#?}"
            );
        }
        let messages: usize = sim
            .conns
            .iter()
            .map(|(c, s)| c.data.len() + s.data.len())
            .sum();
        let closes: Vec<&str> = sim
            .conns
            .iter()
            .flat_map(|(c, s)| [&c.closed, &s.closed])
            .filter_map(|c| c.as_ref().map(|(r, _)| r.as_str()))
            .collect();
        eprintln!(
            "seed {seed}: {} connections, {messages} messages delivered, ends {closes:?}, {} \
             operations refused",
            sim.conns.len(),
            sim.errors.len(),
        );
        assert!(messages > 0, "seed {seed}: the schedule moved no data");
    }
}
