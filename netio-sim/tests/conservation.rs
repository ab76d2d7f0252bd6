//! Conservation under random operations and random faults (quickcheck).
//!
//! Three clients and a server exchange messages in all three send modes
//! (buffered, copy, zero-copy), close and reconnect, while connections are
//! reset, partitioned and healed, hosts crash and receivers slow down. A
//! model checks, as events arrive and after everything is closed:
//!
//! - every accepted send ends exactly once: completed or cancelled, never
//!   both, never twice (unless its own host crashed: then it just vanishes);
//! - every delivered message was sent, and is delivered at most once;
//! - messages of one connection arrive in the order they were sent, and
//!   its sends complete in that order (batches included), each with the
//!   caller's key;
//! - between hosts that did not crash, a send is delivered if and only if it
//!   completed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, MemoryRegion, NetworkMode,
};
use netio_sim::{Sim, SimBackend};
use quickcheck::{Arbitrary, Gen, QuickCheck, TestResult};

const CLIENTS: usize = 3;
const SERVER: usize = 0;
/// Keys are the message id with this bit set, whatever the send mode.
const OWN_KEY: u64 = 1 << 40;
/// Zero-copy message slots per region.
const SLOTS: u64 = 256;
const SLOT: usize = 128;

#[derive(Clone, Copy, Debug)]
enum Mode {
    Buffered,
    Copy,
    ZeroCopy,
}

#[derive(Clone, Debug)]
enum Op {
    /// Client `client` sends to the server, or the server to it. The
    /// server echoes a message marked `echo` from inside its handler.
    Send {
        client: usize,
        to_server: bool,
        mode: Mode,
        len: usize,
        echo: bool,
    },
    Close {
        client: usize,
        by_server: bool,
    },
    Reconnect {
        client: usize,
    },
    Run {
        micros: u64,
    },
    Reset {
        client: usize,
    },
    Partition {
        client: usize,
    },
    Heal {
        client: usize,
    },
    /// Host 0 is the server, 1..=3 the clients.
    Crash {
        host: usize,
    },
    Slow {
        host: usize,
        micros: u64,
    },
}

impl Arbitrary for Op {
    fn arbitrary(g: &mut Gen) -> Self {
        let client = usize::from(u8::arbitrary(g)) % CLIENTS;
        let host = usize::from(u8::arbitrary(g)) % (CLIENTS + 1);
        match u8::arbitrary(g) % 100 {
            0..=49 => Op::Send {
                client,
                to_server: bool::arbitrary(g),
                mode: *g
                    .choose(&[Mode::Buffered, Mode::Copy, Mode::ZeroCopy])
                    .expect("non-empty"),
                // Up to 10 + 59 bytes: a few exceed the 64-byte receive
                // buffers and close their connection.
                len: usize::from(u8::arbitrary(g)) % 60,
                echo: bool::arbitrary(g),
            },
            50..=53 => Op::Close {
                client,
                by_server: bool::arbitrary(g),
            },
            54..=60 => Op::Reconnect { client },
            61..=79 => Op::Run {
                micros: u64::from(u16::arbitrary(g)) % 3_000,
            },
            80..=83 => Op::Reset { client },
            84..=87 => Op::Partition { client },
            88..=91 => Op::Heal { client },
            92 => Op::Crash { host },
            _ => Op::Slow {
                host,
                micros: u64::from(u16::arbitrary(g)) % 400,
            },
        }
    }
}

#[derive(Clone, Debug)]
struct Scenario {
    seed: u64,
    /// The TCP profile (`NetworkMode::Tcp`), else the RDMA one.
    tcp: bool,
    ops: Vec<Op>,
}

impl Arbitrary for Scenario {
    fn arbitrary(g: &mut Gen) -> Self {
        Self {
            seed: u64::arbitrary(g),
            tcp: bool::arbitrary(g),
            ops: Vec::arbitrary(g),
        }
    }

    fn shrink(&self) -> Box<dyn Iterator<Item = Self>> {
        let (seed, tcp) = (self.seed, self.tcp);
        Box::new(
            self.ops
                .shrink()
                .map(move |ops| Scenario { seed, tcp, ops }),
        )
    }
}

struct SendRec {
    from: usize,
    to: usize,
    completed: u32,
    cancelled: u32,
    delivered: u32,
}

#[derive(Default)]
struct Model {
    next_id: u64,
    sends: BTreeMap<u64, SendRec>,
    /// (sender node, connection, key) of sends not yet ended.
    outstanding: BTreeMap<(usize, ConnId, u64), u64>,
    /// Last message id delivered on (receiver node, connection).
    last: BTreeMap<(usize, ConnId), u64>,
    /// Last message id completed on (sender node, connection).
    last_done: BTreeMap<(usize, ConnId), u64>,
    /// The server's handle of each client's newest connection.
    server_names: BTreeMap<IpAddr, ConnId>,
    /// Every connection the server has, with the client's address.
    server_conns: BTreeMap<ConnId, IpAddr>,
    ips: Vec<IpAddr>,
    regions: Vec<MemoryRegion>,
    crashed: BTreeSet<usize>,
    errors: Vec<String>,
}

type Shared = Arc<Mutex<Model>>;

fn lock(m: &Shared) -> std::sync::MutexGuard<'_, Model> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Model {
    /// Sends a fresh message from `node` on `conn` to node `to`; records it
    /// if the backend accepts it.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        node: usize,
        b: &SimBackend,
        conn: ConnId,
        to: usize,
        mode: Mode,
        len: usize,
        echo: bool,
    ) {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = vec![node as u8, u8::from(echo)];
        msg.extend_from_slice(&id.to_le_bytes());
        msg.resize(10 + len, 0xa5);
        // Header: the first two bytes; payload: the rest.
        let (header, payload) = msg.split_at(2);
        let key = OWN_KEY | id;
        let sent = match mode {
            Mode::Buffered => {
                let Ok(Some(mut buf)) = b.get_buffer(conn) else {
                    return;
                };
                if buf.write(&msg).is_err() {
                    return;
                }
                b.send_buffer(conn, buf, key)
            }
            Mode::Copy => b.send_data_copy(conn, &[payload], header, key),
            Mode::ZeroCopy => {
                let region = &self.regions[node];
                let at = (id % SLOTS) as usize * SLOT;
                if region.write(at, payload).is_err() {
                    return; // that slot is still in flight
                }
                let s = region.slice(at, payload.len()).expect("in bounds");
                b.send_data(conn, &[s], header, key)
            }
        };
        if sent.is_err() {
            return;
        }
        self.sends.insert(
            id,
            SendRec {
                from: node,
                to,
                completed: 0,
                cancelled: 0,
                delivered: 0,
            },
        );
        if let Some(old) = self.outstanding.insert((node, conn, key), id) {
            self.errors.push(format!(
                "node {node}: key {key} on {conn} accepted for message {id} while message {old} still holds it"
            ));
        }
    }

    fn end(&mut self, node: usize, conn: ConnId, key: u64, cancelled: bool) {
        let what = if cancelled { "cancelled" } else { "completed" };
        match self.outstanding.remove(&(node, conn, key)) {
            Some(id) => {
                if !cancelled {
                    let last = self.last_done.entry((node, conn)).or_insert(0);
                    if id <= *last {
                        let prev = *last;
                        self.errors.push(format!(
                            "node {node}: message {id} on {conn} completed after message {prev}"
                        ));
                    }
                    *last = id;
                }
                let r = self.sends.get_mut(&id).expect("recorded");
                if cancelled {
                    r.cancelled += 1;
                } else {
                    r.completed += 1;
                }
            }
            None => self.errors.push(format!(
                "node {node}: key {key} on {conn} {what} but no such send is outstanding"
            )),
        }
    }
}

/// The handler of every node: feeds the model.
struct Probe {
    node: usize,
    model: Shared,
}

impl Handler<SimBackend> for Probe {
    fn on_connection_established(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        _: Capabilities,
    ) {
        if self.node == SERVER {
            let mut m = lock(&self.model);
            m.server_names.insert(remote.ip(), conn);
            m.server_conns.insert(conn, remote.ip());
        }
    }

    fn on_connection_closed(
        &mut self,
        _: &SimBackend,
        conn: ConnId,
        remote: EndpointAddress,
        _: &CloseReason,
        keys: &[u64],
    ) {
        let mut m = lock(&self.model);
        for &k in keys {
            m.end(self.node, conn, k, true);
        }
        let node = self.node;
        let left: Vec<u64> = m
            .outstanding
            .keys()
            .filter(|(n, c, _)| *n == node && *c == conn)
            .map(|k| k.2)
            .collect();
        if !left.is_empty() {
            m.errors.push(format!(
                "node {node}: close of {conn} ({remote}) left keys {left:?} neither completed nor cancelled"
            ));
        }
        if node == SERVER {
            m.server_conns.remove(&conn);
            if m.server_names.get(&remote.ip()) == Some(&conn) {
                m.server_names.remove(&remote.ip());
            }
        }
    }

    fn on_sends_completed(&mut self, _: &SimBackend, conn: ConnId, keys: &[u64]) {
        let mut m = lock(&self.model);
        if keys.is_empty() {
            m.errors
                .push(format!("node {}: empty completion batch", self.node));
        }
        for &k in keys {
            m.end(self.node, conn, k, false);
        }
    }

    fn on_data(&mut self, b: &SimBackend, conn: ConnId, data: &[u8]) {
        let mut m = lock(&self.model);
        let node = self.node;
        if data.len() < 10 {
            m.errors
                .push(format!("node {node}: short message {data:?} on {conn}"));
            return;
        }
        let from = usize::from(data[0]);
        let id = u64::from_le_bytes(data[2..10].try_into().expect("8 bytes"));
        match m.sends.get_mut(&id) {
            Some(r) if r.from == from && r.to == node => {
                r.delivered += 1;
                if r.delivered > 1 {
                    m.errors
                        .push(format!("node {node}: message {id} delivered twice"));
                }
            }
            _ => m.errors.push(format!(
                "node {node}: message {id} from node {from} delivered but never sent to it"
            )),
        }
        let last = m.last.entry((node, conn)).or_insert(0);
        if id <= *last {
            let prev = *last;
            m.errors.push(format!(
                "node {node}: message {id} on {conn} after message {prev}: out of order"
            ));
        } else {
            *last = id;
        }
        if node == SERVER && data[1] == 1 {
            m.send(SERVER, b, conn, from, Mode::Copy, data.len() - 10, false);
        }
    }
}

static RUNS: AtomicUsize = AtomicUsize::new(0);
static OPS: AtomicUsize = AtomicUsize::new(0);
static DELIVERED: AtomicUsize = AtomicUsize::new(0);
static CANCELLED: AtomicUsize = AtomicUsize::new(0);
static COMPLETED: AtomicUsize = AtomicUsize::new(0);

fn params(region: &MemoryRegion) -> ConnectionParams {
    ConnectionParams::receive(64, 3)
        .with_buffered(64, 3)
        .with_zero_copy(region.clone())
}

fn conserves(s: Scenario) -> TestResult {
    RUNS.fetch_add(1, Ordering::Relaxed);
    OPS.fetch_add(s.ops.len(), Ordering::Relaxed);
    let sim = Sim::with_seed(s.seed);
    let model: Shared = Arc::default();
    let mut backends = Vec::new();
    for node in 0..=CLIENTS {
        let host = sim.next_host();
        let config = BackendConfig {
            send_queue_depth: 4,
            mode: if s.tcp {
                NetworkMode::Tcp
            } else {
                NetworkMode::Rdma
            },
            ..BackendConfig::default()
        };
        let b = host
            .backend(
                config,
                Probe {
                    node,
                    model: model.clone(),
                },
            )
            .expect("backend");
        let mut m = lock(&model);
        m.ips.push(host.ip());
        m.regions.push(MemoryRegion::new(SLOTS as usize * SLOT));
        backends.push(b);
    }
    let ips = lock(&model).ips.clone();
    let server_region = lock(&model).regions[SERVER].clone();
    let listen = backends[SERVER]
        .open_listen_endpoint(EndpointAddress::new(ips[SERVER], 0), params(&server_region))
        .expect("listen");
    let client_params = |c: usize| params(&lock(&model).regions[c + 1]);
    // Every connection each client opened; the newest is the one it uses.
    let mut client_conns: Vec<Vec<ConnId>> = (0..CLIENTS)
        .map(|c| {
            vec![backends[c + 1]
                .open_active_endpoint(listen, client_params(c))
                .expect("connect")]
        })
        .collect();
    sim.run_for(Duration::from_millis(1));

    for op in &s.ops {
        match *op {
            Op::Send {
                client,
                to_server,
                mode,
                len,
                echo,
            } => {
                let mut m = lock(&model);
                if to_server {
                    let conn = *client_conns[client].last().expect("one at least");
                    m.send(
                        client + 1,
                        &backends[client + 1],
                        conn,
                        SERVER,
                        mode,
                        len,
                        echo,
                    );
                } else if let Some(&conn) = m.server_names.get(&ips[client + 1]) {
                    m.send(
                        SERVER,
                        &backends[SERVER],
                        conn,
                        client + 1,
                        mode,
                        len,
                        false,
                    );
                }
            }
            Op::Close { client, by_server } => {
                if by_server {
                    let name = lock(&model).server_names.get(&ips[client + 1]).copied();
                    if let Some(name) = name {
                        let _ = backends[SERVER].close_active_endpoint(name);
                    }
                } else {
                    let conn = *client_conns[client].last().expect("one at least");
                    let _ = backends[client + 1].close_active_endpoint(conn);
                }
            }
            Op::Reconnect { client } => {
                // A second connection to the same listener is a distinct
                // connection; the old one stays open until closed.
                if let Ok(conn) =
                    backends[client + 1].open_active_endpoint(listen, client_params(client))
                {
                    client_conns[client].push(conn);
                }
            }
            Op::Run { micros } => sim.run_for(Duration::from_micros(micros)),
            Op::Reset { client } => sim.reset_connections(ips[client + 1], ips[SERVER]),
            Op::Partition { client } => sim.partition(ips[client + 1], ips[SERVER]),
            Op::Heal { client } => sim.heal(ips[client + 1], ips[SERVER]),
            Op::Crash { host } => {
                lock(&model).crashed.insert(host);
                sim.crash(ips[host]);
            }
            Op::Slow { host, micros } => {
                sim.slow_receiver(ips[host], Duration::from_micros(micros))
            }
        }
    }

    // Drain: heal, speed up, close everything, run until nothing is left.
    for c in 0..CLIENTS {
        sim.heal(ips[c + 1], ips[SERVER]);
    }
    for &ip in &ips {
        sim.slow_receiver(ip, Duration::ZERO);
    }
    sim.run_for(Duration::from_millis(100));
    for c in 0..CLIENTS {
        for &conn in &client_conns[c] {
            let _ = backends[c + 1].close_active_endpoint(conn);
        }
    }
    let names: Vec<ConnId> = lock(&model).server_conns.keys().copied().collect();
    for name in names {
        let _ = backends[SERVER].close_active_endpoint(name);
    }
    let steps = sim.run_until_idle(1_000_000);
    let mut errors = Vec::new();
    if steps == 1_000_000 {
        errors.push("the world did not become idle".to_string());
    }

    let m = lock(&model);
    errors.extend(m.errors.iter().cloned());
    for ((node, conn, key), id) in &m.outstanding {
        if !m.crashed.contains(node) {
            errors.push(format!(
                "node {node}: message {id} (key {key} on {conn}) never completed nor cancelled"
            ));
        }
    }
    for (id, r) in &m.sends {
        if r.completed + r.cancelled > 1 {
            errors.push(format!(
                "message {id}: completed {} and cancelled {} times",
                r.completed, r.cancelled
            ));
        }
        let intact = !m.crashed.contains(&r.from) && !m.crashed.contains(&r.to);
        // RDMA: a send completes when the receiver has it. TCP: when its
        // bytes left, so a completed send may be lost with the receiver,
        // but nothing cancelled is ever delivered.
        let wrong = if s.tcp {
            r.delivered > r.completed
        } else {
            intact && r.delivered != r.completed
        };
        if wrong {
            errors.push(format!(
                "message {id} from node {} to node {}: delivered {} times, completed {} times",
                r.from, r.to, r.delivered, r.completed
            ));
        }
        DELIVERED.fetch_add(r.delivered as usize, Ordering::Relaxed);
        CANCELLED.fetch_add(r.cancelled as usize, Ordering::Relaxed);
        COMPLETED.fetch_add(r.completed as usize, Ordering::Relaxed);
    }
    if errors.is_empty() {
        TestResult::passed()
    } else {
        errors.truncate(10);
        TestResult::error(errors.join("\n"))
    }
}

#[test]
fn random_operations_and_faults_conserve_messages() {
    QuickCheck::new()
        .rng(Gen::new(300))
        .tests(200)
        .max_tests(200)
        .quickcheck(conserves as fn(Scenario) -> TestResult);
    let (d, c, k) = (
        DELIVERED.load(Ordering::Relaxed),
        COMPLETED.load(Ordering::Relaxed),
        CANCELLED.load(Ordering::Relaxed),
    );
    println!(
        "{} scenarios, {} operations: {d} delivered, {c} completed, {k} cancelled",
        RUNS.load(Ordering::Relaxed),
        OPS.load(Ordering::Relaxed)
    );
    assert!(d > 1000 && k > 100, "the scenarios exercise too little");
}

#[test]
fn a_fixed_scenario_conserves_messages() {
    // A hand-written schedule touching every operation, for a quick and
    // reproducible check.
    let mut ops = Vec::new();
    for i in 0..40 {
        ops.push(Op::Send {
            client: i % CLIENTS,
            to_server: i % 3 != 0,
            mode: [Mode::Buffered, Mode::Copy, Mode::ZeroCopy][i % 3],
            len: (i * 7) % 60,
            echo: i % 2 == 0,
        });
        ops.push(match i {
            5 => Op::Partition { client: 1 },
            9 => Op::Slow {
                host: 0,
                micros: 200,
            },
            14 => Op::Heal { client: 1 },
            18 => Op::Reset { client: 2 },
            20 => Op::Reconnect { client: 2 },
            25 => Op::Close {
                client: 0,
                by_server: true,
            },
            27 => Op::Reconnect { client: 0 },
            33 => Op::Crash { host: 3 },
            _ => Op::Run { micros: 15 },
        });
    }
    for tcp in [false, true] {
        let r = conserves(Scenario {
            seed: 5,
            tcp,
            ops: ops.clone(),
        });
        assert!(!r.is_failure(), "tcp={tcp}: {r:?}");
    }
}
