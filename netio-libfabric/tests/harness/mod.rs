//! The conformance harness of the libfabric provider, shared by the suite's
//! test binaries (`conformance_tcp`, `conformance_sockets`,
//! `conformance_busy_poll`, the `conformance_rdm_*` binaries and, in the
//! verbs guest, `conformance_verbs`): a [`MioProvider`] per fabric provider
//! and endpoint type (a flavor) for the suite's ready-made
//! [`MioHarness`](netio_conformance::mio::MioHarness), on 127.0.0.1 (on
//! `verbs`, the guest's soft-RoCE address).
//!
//! Reliable-datagram flavors over kernel sockets reset a connection the way
//! the TCP provider's harness does: the kernel's socket-destroy request
//! (`ss -K`, needs root) aborts the control channel's socket and the peer
//! sees a real TCP reset; they partition in a private network namespace.
//! Connected flavors declare `reset` unsupported (libfabric reports a
//! peer's reset as an orderly shutdown), so their harness never resets.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::process::Command;

use netio_conformance::mio::MioProvider;
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{BackendConfig, CreateError, EndpointAddress, Features, Handler};
use netio_libfabric::{EndpointType, LibfabricBackend, LibfabricConfig};

/// Destroys the TCP sockets from `local` to `remote` (`ss -K`).
pub fn reset(local: IpAddr, remote: EndpointAddress) {
    let out = Command::new("ss")
        .args(["-K", "-t", "src", &local.to_string(), "dst"])
        .arg(remote.ip().to_string())
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

/// The address of the verbs device's interface: `NETIO_VERBS_ADDR` (set by
/// `scripts/verbs-guest.sh`), else 127.0.0.1.
pub fn verbs_ip() -> IpAddr {
    std::env::var("NETIO_VERBS_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
        .unwrap_or(Ipv4Addr::LOCALHOST.into())
}

/// A port on `ip` that was just free: nothing listens there, so a connect
/// is refused (the kernel answers with a reset; rdma_cm with a reject).
pub fn refusing_on(ip: IpAddr) -> EndpointAddress {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).expect("binding a probe port");
    EndpointAddress::from(l.local_addr().expect("probe address"))
}

/// `verbs` settings: the device from `NETIO_VERBS_DOMAIN` (if set).
pub fn verbs_config() -> LibfabricConfig {
    verbs_config_for("verbs")
}

/// Settings for fabric provider `name` on the verbs device named by
/// `NETIO_VERBS_DOMAIN` (if set).
pub fn verbs_config_for(name: &str) -> LibfabricConfig {
    LibfabricConfig {
        domain: std::env::var("NETIO_VERBS_DOMAIN")
            .ok()
            .filter(|d| !d.is_empty()),
        ..LibfabricConfig::provider(name)
    }
}

/// The conformance suite on connected endpoints over libfabric's `tcp`
/// with harness flavor `$flavor`, and what libfabric 1.17 `tcp` cannot do
/// (one list for every binary that runs it).
#[allow(unused_macros)] // not every binary runs it
macro_rules! tcp_msg_suite {
    ($flavor:ty) => {
        netio_conformance::suite!(
            netio_conformance::mio::MioHarness<$flavor>,
            unsupported = [
                reset = "libfabric 1.17 tcp reports a connection reset by the peer as an \
                         orderly FI_SHUTDOWN (in-flight operations flushed with FI_ECANCELED), \
                         so this side cannot tell a reset from the peer's close",
                shared_receive_pool = "libfabric endpoints post their own registered receive \
                                       buffers; sharing them needs shared receive contexts, \
                                       not implemented",
                partition = "the suite partitions only to test peer_timeout, which connected \
                             endpoints refuse (see liveness)",
                liveness = "connected endpoints (FI_EP_MSG) refuse BackendConfig::peer_timeout \
                            at creation (CreateError::NotSupported): libfabric 1.17 tcp \
                            endpoints have no keepalive or user timeout, and carry no netio \
                            heartbeat",
                one_local_port = "netio-libfabric has no setting for the source port of its \
                                  connections (the fabric provider picks it), so two \
                                  connections from one local port cannot be made"
            ]
        );
    };
}

macro_rules! flavor {
    ($(#[$m:meta])* $name:ident, $config:expr, $ip:expr, pushes_back = $pb:expr) => {
        flavor!($(#[$m])* $name, $config, $ip, pushes_back = $pb, close_in_accept = true);
    };
    ($(#[$m:meta])* $name:ident, $config:expr, $ip:expr, pushes_back = $pb:expr,
     close_in_accept = $cia:expr) => {
        flavor!($(#[$m])* $name, $config, $ip, pushes_back = $pb, reset = false, netns = false,
                liveness = false, close_in_accept = $cia);
    };
    ($(#[$m:meta])* $name:ident, $config:expr, $ip:expr, pushes_back = $pb:expr,
     reset = $reset:expr, netns = $netns:expr) => {
        flavor!($(#[$m])* $name, $config, $ip, pushes_back = $pb, reset = $reset,
                netns = $netns, liveness = true, close_in_accept = true);
    };
    ($(#[$m:meta])* $name:ident, $config:expr, $ip:expr, pushes_back = $pb:expr,
     reset = $reset:expr, netns = $netns:expr, liveness = $live:expr,
     close_in_accept = $cia:expr) => {
        flavor!($(#[$m])* $name, $config, $ip, pushes_back = $pb, reset = $reset,
                netns = $netns, liveness = $live, close_in_accept = $cia, busy = false);
    };
    ($(#[$m:meta])* $name:ident, $config:expr, $ip:expr, pushes_back = $pb:expr,
     reset = $reset:expr, netns = $netns:expr, liveness = $live:expr,
     close_in_accept = $cia:expr, busy = $busy:expr) => {
        $(#[$m])*
        pub struct $name;
        impl MioProvider for $name {
            type Backend = LibfabricBackend;
            // A busy-polling loop keeps a core busy: one test at a time.
            const ONE_AT_A_TIME: bool = $busy;
            fn loop_config() -> LoopConfig {
                LoopConfig {
                    busy_poll: $busy,
                    ..LoopConfig::default()
                }
            }
            fn features() -> Features {
                if $config.resolved_endpoint() == EndpointType::Rdm {
                    LibfabricBackend::RDM_FEATURES
                } else {
                    LibfabricBackend::FEATURES
                }
            }
            fn create(
                lp: &MioLoop,
                config: BackendConfig,
                handler: Box<dyn Handler<LibfabricBackend>>,
            ) -> Result<LibfabricBackend, CreateError> {
                LibfabricBackend::new(lp, config, $config, handler)
            }
            fn local_ip() -> IpAddr {
                $ip
            }
            fn refusing_address() -> EndpointAddress {
                refusing_on($ip)
            }
            const PUSHES_BACK: bool = $pb;
            const NETNS_PARTITION: bool = $netns;
            const LIVENESS: bool = $live;
            const CLOSE_IN_ACCEPT: bool = $cia;
            fn can_reset() -> bool {
                $reset
            }
            fn reset(local: IpAddr, remote: EndpointAddress) {
                assert!($reset, "this flavor's harness cannot reset connections");
                reset(local, remote)
            }
        }
    };
}

flavor!(
    /// libfabric's `tcp` provider on 127.0.0.1.
    Tcp,
    LibfabricConfig::provider("tcp"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true
);
flavor!(
    /// libfabric's `tcp` provider on 127.0.0.1, on busy-polling loops
    /// (completion queues without a wait fd, read by the spin callback).
    TcpBusyPoll,
    LibfabricConfig::provider("tcp"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = false,
    netns = false,
    liveness = false,
    close_in_accept = true,
    busy = true
);
flavor!(
    /// libfabric's `tcp` provider on 127.0.0.1, on busy-polling loops, the
    /// spin reading an empty queue in 8 rounds
    /// (`LibfabricConfig::spin_rounds`, one round by default on `tcp`), as
    /// it does by default on fabrics whose reads only look at memory.
    TcpBusyPollRounds,
    LibfabricConfig {
        spin_rounds: Some(8),
        ..LibfabricConfig::provider("tcp")
    },
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = false,
    netns = false,
    liveness = false,
    close_in_accept = true,
    busy = true
);
flavor!(
    /// libfabric's `sockets` provider on 127.0.0.1.
    Sockets,
    LibfabricConfig::provider("sockets"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = false,
    close_in_accept = false
);
flavor!(
    /// libfabric's `verbs` provider on the device's interface address.
    Verbs,
    verbs_config(),
    verbs_ip(),
    pushes_back = true
);

/// Reliable-datagram settings for fabric provider `name`.
pub fn rdm_config(name: &str) -> LibfabricConfig {
    LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..LibfabricConfig::provider(name)
    }
}

flavor!(
    /// Reliable datagrams over libfabric's `tcp;ofi_rxm` on 127.0.0.1.
    RdmTcpRxm,
    rdm_config("tcp;ofi_rxm"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true
);
flavor!(
    /// Reliable datagrams over libfabric's `tcp;ofi_rxm` on 127.0.0.1, on
    /// busy-polling loops (a completion queue without a wait fd, read by
    /// the spin callback).
    RdmTcpRxmBusyPoll,
    rdm_config("tcp;ofi_rxm"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true,
    liveness = true,
    close_in_accept = true,
    busy = true
);
flavor!(
    /// Reliable datagrams over libfabric's `shm` (control channels on
    /// 127.0.0.1).
    RdmShm,
    rdm_config("shm"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true
);
flavor!(
    /// Reliable datagrams over libfabric's `shm` on busy-polling loops
    /// (the spin reads the queue in 8 rounds by default there).
    RdmShmBusyPoll,
    rdm_config("shm"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true,
    liveness = true,
    close_in_accept = true,
    busy = true
);
flavor!(
    /// Reliable datagrams over libfabric's `sockets` on 127.0.0.1.
    RdmSockets,
    rdm_config("sockets"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true
);
flavor!(
    /// Reliable datagrams over libfabric's `udp;ofi_rxd` on 127.0.0.1.
    RdmUdpRxd,
    rdm_config("udp;ofi_rxd"),
    Ipv4Addr::LOCALHOST.into(),
    pushes_back = true,
    reset = true,
    netns = true
);
flavor!(
    /// Reliable datagrams over libfabric's `verbs;ofi_rxm` on the verbs
    /// device's interface address (control channels there too).
    RdmVerbsRxm,
    LibfabricConfig {
        endpoint: EndpointType::Rdm,
        ..verbs_config_for("verbs;ofi_rxm")
    },
    verbs_ip(),
    pushes_back = true,
    reset = false,
    netns = false
);
