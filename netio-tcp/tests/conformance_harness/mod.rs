//! The conformance harness of the TCP provider, shared by the suite's test
//! binaries: `conformance` (127.0.0.1), `conformance_v6` (::1) and
//! `conformance_busy_poll` (127.0.0.1 on busy-polling loops).
//!
//! Each is a [`MioProvider`] for the suite's ready-made
//! [`MioHarness`](netio_conformance::mio::MioHarness): one loop thread per
//! backend, waiting on the wall clock. Connections are reset with the
//! kernel's socket-destroy request (`ss -K`, which needs root), so the peer
//! sees a real TCP reset. Nodes are partitioned in a network namespace of
//! the test's own, on whose loopback interface the harness drops every
//! packet (`MioProvider::NETNS_PARTITION`; needs root too), so a peer really
//! stops answering and the kernel times the connection out.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::process::Command;

use netio_conformance::mio::{MioHarness, MioProvider};
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{BackendConfig, CreateError, EndpointAddress, Features, Handler, Provider};
use netio_tcp::{PortRange, TcpBackend, TcpConfig, TcpProvider};

/// The suite's harness for a flavor.
pub type TcpHarness<F> = MioHarness<F>;

fn create(
    lp: &MioLoop,
    config: BackendConfig,
    handler: Box<dyn Handler<TcpBackend>>,
) -> Result<TcpBackend, CreateError> {
    TcpProvider::create(lp, config, handler)
}

/// A backend whose connections all leave from one local port, free a
/// moment ago (`TcpConfig::connect_ports` with a single port).
fn create_from_one_port(
    lp: &MioLoop,
    config: BackendConfig,
    handler: Box<dyn Handler<TcpBackend>>,
) -> Result<TcpBackend, CreateError> {
    let port = TcpListener::bind(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .and_then(|l| l.local_addr())
        .expect("finding a free port")
        .port();
    let tcp = TcpConfig {
        connect_ports: Some(PortRange::single(port).expect("a port range of one")),
        ..TcpConfig::default()
    };
    TcpBackend::with_tcp_config(lp, config, tcp, handler)
}

/// A port that was just free: nothing listens there, so the kernel answers
/// a connect with a reset (a refusal).
fn refusing(ip: IpAddr) -> EndpointAddress {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).expect("binding a probe port");
    EndpointAddress::from(l.local_addr().expect("probe address"))
}

/// Destroys the TCP socket from `local` to `remote` (`ss -K`): the kernel
/// aborts it and sends the peer a reset.
fn reset(local: IpAddr, remote: EndpointAddress) {
    let host = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("[{a}]"),
    };
    let out = Command::new("ss")
        .args(["-K", "-t", "src", &host(local), "dst", &host(remote.ip())])
        .args(["dport", "=", &remote.port().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running `ss -K` to reset a connection (iproute2): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.lines().count() > 1,
        "`ss -K` did not reset the connection to {remote} (it needs root and a kernel with \
         CONFIG_INET_DIAG_DESTROY): status {}, stdout {text:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

macro_rules! flavor {
    ($(#[$m:meta])* $name:ident, $ip:expr, $busy:expr) => {
        $(#[$m])*
        pub struct $name;
        impl MioProvider for $name {
            type Backend = TcpBackend;
            const ONE_AT_A_TIME: bool = $busy;
            fn features() -> Features {
                TcpBackend::FEATURES
            }
            fn create(
                lp: &MioLoop,
                config: BackendConfig,
                handler: Box<dyn Handler<TcpBackend>>,
            ) -> Result<TcpBackend, CreateError> {
                create(lp, config, handler)
            }
            fn local_ip() -> IpAddr {
                $ip
            }
            fn refusing_address() -> EndpointAddress {
                refusing($ip)
            }
            fn loop_config() -> LoopConfig {
                LoopConfig {
                    busy_poll: $busy,
                    ..LoopConfig::default()
                }
            }
            const NETNS_PARTITION: bool = true;
            const ONE_LOCAL_PORT: bool = true;
            fn create_from_one_port(
                lp: &MioLoop,
                config: BackendConfig,
                handler: Box<dyn Handler<TcpBackend>>,
            ) -> Result<TcpBackend, CreateError> {
                create_from_one_port(lp, config, handler)
            }
            fn can_reset() -> bool {
                true
            }
            fn reset(local: IpAddr, remote: EndpointAddress) {
                reset(local, remote)
            }
        }
    };
}

flavor!(
    /// 127.0.0.1, loops sleeping in epoll.
    V4,
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    false
);
flavor!(
    /// ::1, loops sleeping in epoll.
    V6,
    IpAddr::V6(Ipv6Addr::LOCALHOST),
    false
);
flavor!(
    /// 127.0.0.1, busy-polling loops, one test at a time (each loop keeps
    /// a core busy, and the machines this runs on may have two).
    V4BusyPoll,
    IpAddr::V4(Ipv4Addr::LOCALHOST),
    true
);

/// `true` if a TCP socket can listen on `[::1]:0` on this machine now.
pub fn ipv6_loopback_works() -> bool {
    TcpListener::bind(SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0)).is_ok()
}
