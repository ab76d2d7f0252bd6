//! Several hosts on a real kernel path: each host is a network namespace
//! the test creates, joined to the first host by a veth pair (host 0 is
//! 10.77.k.1 towards host k, which is 10.77.k.2), with its own event loop
//! running inside it. Connections, messages and closes cross the veth
//! links; taking a link down or dropping a host's packets with `iptables`
//! shows what an application sees of refused, unreachable and silent
//! peers.
//!
//! Needs root, iproute2 (`ip netns`, veth) and, for the dropped-traffic
//! tests, `iptables`; `scripts/test-all.sh` installs them. Where the
//! namespaces cannot be made the tests say so loudly and pass without
//! running; `NETIO_REQUIRE_NETNS=1` (set by the test script) makes that a
//! failure. Nothing outside the test's own namespaces is touched.

mod common;

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnectionParams, EndpointAddress, RefuseReason,
};
use netio_tcp::TcpConfig;

/// Runs `ip` with `args`.
fn ip(args: &[&str]) -> Result<(), String> {
    run("ip", args)
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("running {cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Hosts in namespaces of their own, a star around host 0; every
/// namespace (and with it its veth ends and firewall rules) is deleted on
/// drop, also when the test panics.
struct Hosts {
    names: Vec<String>,
    /// Which 10.77.k.0/24 this set uses for host k (unique per test).
    base: u8,
}

impl Hosts {
    /// `n` hosts (2 or 3), or why they cannot be made here.
    fn create(n: usize) -> Result<Self, String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let mut hosts = Self {
            names: Vec::new(),
            // Distinct subnets for the tests of this process: 10.77.(id*4+k).
            base: u8::try_from(id * 4).map_err(|_| "too many host sets".to_string())?,
        };
        for h in 0..n {
            let name = format!("netio-mh-{pid}-{id}-{h}");
            ip(&["netns", "add", &name])?;
            hosts.names.push(name);
            hosts.exec(h, &["ip", "link", "set", "lo", "up"])?;
        }
        for k in 1..n {
            let (a, b) = (format!("mh{k}a"), format!("mh{k}b"));
            ip(&[
                "link",
                "add",
                &a,
                "netns",
                &hosts.names[0],
                "type",
                "veth",
                "peer",
                "name",
                &b,
                "netns",
                &hosts.names[k],
            ])?;
            let net = hosts.base + k as u8;
            hosts.exec(
                0,
                &["ip", "addr", "add", &format!("10.77.{net}.1/24"), "dev", &a],
            )?;
            hosts.exec(
                k,
                &["ip", "addr", "add", &format!("10.77.{net}.2/24"), "dev", &b],
            )?;
            hosts.exec(0, &["ip", "link", "set", &a, "up"])?;
            hosts.exec(k, &["ip", "link", "set", &b, "up"])?;
        }
        Ok(hosts)
    }

    /// Host 0's address towards host `k`, or host `k`'s own (`k` > 0).
    fn addr(&self, of: usize, towards: usize) -> IpAddr {
        let (k, last) = if of == 0 { (towards, 1) } else { (of, 2) };
        IpAddr::V4(Ipv4Addr::new(10, 77, self.base + k as u8, last))
    }

    /// Runs a command inside host `h`.
    fn exec(&self, h: usize, cmd: &[&str]) -> Result<(), String> {
        let mut args = vec!["netns", "exec", &self.names[h]];
        args.extend_from_slice(cmd);
        ip(&args)
    }

    /// Takes host `k`'s link to host 0 down (`false`) or up, both ends: a
    /// host whose interface is down has no route over it.
    fn link(&self, k: usize, up: bool) {
        let state = if up { "up" } else { "down" };
        self.exec(0, &["ip", "link", "set", &format!("mh{k}a"), state])
            .unwrap();
        self.exec(k, &["ip", "link", "set", &format!("mh{k}b"), state])
            .unwrap();
    }

    /// Host `h` drops (or stops dropping) every packet from `from`.
    fn drop_from(&self, h: usize, from: IpAddr, on: bool) -> Result<(), String> {
        let op = if on { "-A" } else { "-D" };
        self.exec(
            h,
            &[
                "iptables",
                op,
                "INPUT",
                "-s",
                &from.to_string(),
                "-j",
                "DROP",
            ],
        )
    }

    /// A loop running on a thread inside host `h` (sockets its backend
    /// opens on that thread live in the namespace).
    fn start_loop(&self, h: usize) -> Running {
        let path = format!("/var/run/netns/{}", self.names[h]);
        thread::spawn(move || {
            let f = File::open(&path).expect("opening the namespace");
            // SAFETY: setns with a valid namespace descriptor changes only
            // the calling thread's network namespace; no memory is involved.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            // The loop thread started here is in the namespace too.
            Running::start()
        })
        .join()
        .expect("starting a loop in the namespace")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// The hosts, or `None` (after saying why, loudly) where this machine
/// cannot make namespaces and `NETIO_REQUIRE_NETNS` is not `1`.
fn hosts(n: usize) -> Option<Hosts> {
    match Hosts::create(n) {
        Ok(h) => Some(h),
        Err(e) => {
            assert!(
                std::env::var("NETIO_REQUIRE_NETNS").as_deref() != Ok("1"),
                "no network namespaces: {e}"
            );
            eprintln!(
                "SKIPPED: no network namespaces here ({e}); the multi-host tests did not run"
            );
            None
        }
    }
}

/// `true` when `iptables` works in host 0; otherwise says so (or fails
/// under `NETIO_REQUIRE_NETNS=1`).
fn iptables_works(hosts: &Hosts) -> bool {
    match hosts.exec(0, &["iptables", "-S"]) {
        Ok(()) => true,
        Err(e) => {
            assert!(
                std::env::var("NETIO_REQUIRE_NETNS").as_deref() != Ok("1"),
                "iptables does not work in a namespace: {e}"
            );
            eprintln!("SKIPPED: iptables does not work here ({e}); dropped traffic not tested");
            false
        }
    }
}

/// One host's loop and backend.
struct Node {
    rt: Running,
    side: Side,
}

impl Node {
    fn new(hosts: &Hosts, h: usize, config: BackendConfig, tcp: TcpConfig) -> Self {
        let rt = hosts.start_loop(h);
        let side = Side::with(&rt.lp, config, tcp, Recorder::default());
        Self { rt, side }
    }

    /// Listens at `ip` (a port the kernel picks), on the loop thread.
    fn listen(&self, ip: IpAddr) -> EndpointAddress {
        let b = self.side.b.clone();
        self.rt
            .on_loop(move || {
                b.open_listen_endpoint(
                    EndpointAddress::new(ip, 0),
                    ConnectionParams::receive(256, 8),
                )
            })
            .expect("listen")
    }

    /// Starts a connection to `to`, on the loop thread.
    fn connect(&self, to: EndpointAddress) {
        let b = self.side.b.clone();
        self.rt
            .on_loop(move || b.open_active_endpoint(to, ConnectionParams::receive(256, 8)))
            .expect("open_active_endpoint");
    }

    fn established(&self, remote: EndpointAddress) -> bool {
        self.side
            .has(|e| matches!(e, Ev::Established(r, _) if *r == remote))
    }

    /// The remote addresses of the connections established here.
    fn peers(&self) -> Vec<EndpointAddress> {
        self.side
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Established(r, _) => Some(r),
                _ => None,
            })
            .collect()
    }

    fn closed(&self, remote: EndpointAddress) -> Option<CloseReason> {
        self.side.events().into_iter().find_map(|e| match e {
            Ev::Closed(r, why, _) if r == remote => Some(why),
            _ => None,
        })
    }

    fn refused(&self, remote: EndpointAddress) -> Option<RefuseReason> {
        self.side.events().into_iter().find_map(|e| match e {
            Ev::Refused(r, why) if r == remote => Some(why),
            _ => None,
        })
    }

    fn send(&self, remote: EndpointAddress, msg: &[u8], key: u64) {
        let conn = self.side.conn(remote);
        self.side
            .b
            .send_data_copy(conn, &[msg], &[], key)
            .expect("send");
    }

    fn data_from(&self, remote: EndpointAddress) -> Vec<Vec<u8>> {
        self.side
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Ev::Data(r, d) if r == remote => Some(d),
                _ => None,
            })
            .collect()
    }
}

fn msgs(tag: &str, n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{tag}-{i}").into_bytes()).collect()
}

#[test]
fn a_connection_across_two_hosts_carries_messages_both_ways_and_closes_cleanly() {
    let Some(hosts) = hosts(2) else { return };
    let server = Node::new(&hosts, 0, BackendConfig::default(), TcpConfig::default());
    let client = Node::new(&hosts, 1, BackendConfig::default(), TcpConfig::default());
    let addr = server.listen(hosts.addr(0, 1));
    client.connect(addr);
    assert!(
        wait_until(|| client.established(addr)),
        "{:?}",
        client.side.events()
    );
    assert!(
        wait_until(|| server.peers().len() == 1),
        "{:?}",
        server.side.events()
    );
    let peer = server.peers()[0];
    assert_eq!(
        peer.ip(),
        hosts.addr(1, 0),
        "the server sees the client's host address"
    );

    let (up, down) = (msgs("up", 50), msgs("down", 50));
    for (k, m) in up.iter().enumerate() {
        client.send(addr, m, k as u64);
    }
    for (k, m) in down.iter().enumerate() {
        server.send(peer, m, k as u64);
    }
    assert!(wait_until(|| server.data_from(peer).len() == up.len()));
    assert!(wait_until(|| client.data_from(addr).len() == down.len()));
    assert_eq!(server.data_from(peer), up, "exact bytes, in order");
    assert_eq!(client.data_from(addr), down, "exact bytes, in order");

    let conn = client.side.conn(addr);
    client.side.b.close_active_endpoint(conn).unwrap();
    assert!(wait_until(|| server.closed(peer).is_some()));
    assert_eq!(server.closed(peer), Some(CloseReason::PeerClosed));
    // The closer hears of its own close as an event too, not from inside
    // the call.
    assert!(wait_until(|| client.closed(addr).is_some()));
    assert_eq!(client.closed(addr), Some(CloseReason::Local));
}

#[test]
fn a_server_keeps_the_connections_of_clients_on_two_other_hosts_apart() {
    let Some(hosts) = hosts(3) else { return };
    let server = Node::new(&hosts, 0, BackendConfig::default(), TcpConfig::default());
    let clients =
        [1, 2].map(|h| Node::new(&hosts, h, BackendConfig::default(), TcpConfig::default()));
    let addrs = [1, 2].map(|h| server.listen(hosts.addr(0, h)));
    for (c, a) in clients.iter().zip(addrs) {
        c.connect(a);
    }
    assert!(
        wait_until(|| server.peers().len() == 2),
        "{:?}",
        server.side.events()
    );
    for (i, c) in clients.iter().enumerate() {
        assert!(wait_until(|| c.established(addrs[i])));
        for (k, m) in msgs(&format!("from-{i}"), 20).iter().enumerate() {
            c.send(addrs[i], m, k as u64);
        }
    }
    for (i, h) in [1usize, 2].into_iter().enumerate() {
        let peer = server
            .peers()
            .into_iter()
            .find(|p| p.ip() == hosts.addr(h, 0))
            .expect("a connection from each client host");
        assert!(wait_until(|| server.data_from(peer).len() == 20));
        assert_eq!(
            server.data_from(peer),
            msgs(&format!("from-{i}"), 20),
            "host {h}'s messages, and only them, on its connection"
        );
    }
}

#[test]
fn connecting_to_a_port_where_nothing_listens_on_another_host_is_refused_at_once() {
    let Some(hosts) = hosts(2) else { return };
    let client = Node::new(&hosts, 1, BackendConfig::default(), TcpConfig::default());
    // Port 9 on host 0: its kernel answers the SYN with a reset.
    let nobody = EndpointAddress::new(hosts.addr(0, 1), 9);
    let start = Instant::now();
    client.connect(nobody);
    assert!(
        wait_until(|| client.refused(nobody).is_some()),
        "{:?}",
        client.side.events()
    );
    assert_eq!(client.refused(nobody), Some(RefuseReason::Refused));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "refused by the peer's kernel, not after a timeout: {:?}",
        start.elapsed()
    );
}

#[test]
fn connecting_over_a_link_that_is_down_is_unreachable() {
    let Some(hosts) = hosts(2) else { return };
    let server = Node::new(&hosts, 0, BackendConfig::default(), TcpConfig::default());
    let client = Node::new(&hosts, 1, BackendConfig::default(), TcpConfig::default());
    let addr = server.listen(hosts.addr(0, 1));
    // Without carrier the client's host has no route to the server's.
    hosts.link(1, false);
    client.connect(addr);
    assert!(
        wait_until(|| client.refused(addr).is_some()),
        "{:?}",
        client.side.events()
    );
    assert_eq!(client.refused(addr), Some(RefuseReason::Unreachable));
    assert!(server.peers().is_empty());

    // Up again: the next attempt connects.
    hosts.link(1, true);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client.established(addr) && Instant::now() < deadline {
        client.connect(addr);
        let t = Instant::now();
        while !client.established(addr) && t.elapsed() < Duration::from_secs(2) {
            thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(client.established(addr), "{:?}", client.side.events());
}

#[test]
fn a_connection_attempt_whose_packets_are_dropped_is_unreachable_after_the_handshake_timeout() {
    let Some(hosts) = hosts(2) else { return };
    if !iptables_works(&hosts) {
        return;
    }
    let server = Node::new(&hosts, 0, BackendConfig::default(), TcpConfig::default());
    let tcp = TcpConfig {
        handshake_timeout: Duration::from_secs(1),
        ..TcpConfig::default()
    };
    let client = Node::new(&hosts, 1, BackendConfig::default(), tcp);
    let addr = server.listen(hosts.addr(0, 1));
    hosts.drop_from(0, hosts.addr(1, 0), true).unwrap();
    let start = Instant::now();
    client.connect(addr);
    assert!(
        wait_until(|| client.refused(addr).is_some()),
        "{:?}",
        client.side.events()
    );
    assert_eq!(client.refused(addr), Some(RefuseReason::Unreachable));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "given up after the handshake timeout (1 s), not before: {took:?}"
    );
    assert!(server.peers().is_empty());
}

#[test]
fn a_peer_whose_packets_are_dropped_times_out_on_both_sides_and_a_new_connection_works_after() {
    let Some(hosts) = hosts(2) else { return };
    if !iptables_works(&hosts) {
        return;
    }
    let config = BackendConfig {
        peer_timeout: Some(Duration::from_secs(1)),
        ..BackendConfig::default()
    };
    let server = Node::new(&hosts, 0, config.clone(), TcpConfig::default());
    let client = Node::new(&hosts, 1, config, TcpConfig::default());
    let addr = server.listen(hosts.addr(0, 1));
    client.connect(addr);
    assert!(wait_until(|| client.established(addr)));
    assert!(wait_until(|| server.peers().len() == 1));
    let peer = server.peers()[0];
    client.send(addr, b"before", 1);
    assert!(wait_until(|| server.data_from(peer).len() == 1));

    // Each host drops what the other sends: the client's data goes
    // unacknowledged (TCP_USER_TIMEOUT), the idle server's keepalive
    // probes go unanswered.
    hosts.drop_from(0, hosts.addr(1, 0), true).unwrap();
    hosts.drop_from(1, hosts.addr(0, 1), true).unwrap();
    let start = Instant::now();
    client.send(addr, b"lost", 2);
    let both = || client.closed(addr).is_some() && server.closed(peer).is_some();
    while !both() && start.elapsed() < Duration::from_secs(15) {
        thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        client.closed(addr),
        Some(CloseReason::TimedOut),
        "client after {:?}: {:?}",
        start.elapsed(),
        client.side.events()
    );
    assert_eq!(
        server.closed(peer),
        Some(CloseReason::TimedOut),
        "server after {:?}: {:?}",
        start.elapsed(),
        server.side.events()
    );

    // The rules lifted, a new connection carries messages again.
    hosts.drop_from(0, hosts.addr(1, 0), false).unwrap();
    hosts.drop_from(1, hosts.addr(0, 1), false).unwrap();
    let before = server.peers().len();
    client.connect(addr);
    assert!(wait_until(|| server.peers().len() == before + 1));
    let again = *server.peers().last().unwrap();
    assert!(wait_until(|| client
        .side
        .has(|e| matches!(e, Ev::Established(r, _) if *r == addr))
        && client.side.count(
            |e| matches!(e, Ev::Established(r, _) if *r == addr)
        ) == 2));
    client.send(addr, b"after", 3);
    assert!(wait_until(
        || server.data_from(again) == vec![b"after".to_vec()]
    ));
}
