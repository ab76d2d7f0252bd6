//! Probes whether this host can listen on the IPv6 loopback address `::1`,
//! for the TCP conformance suite over IPv6 (`tests/conformance_v6.rs`):
//! that suite is compiled only under `cfg(netio_tcp_ipv6_loopback)`, set
//! here when `[::1]:0` binds. Without it the build says so in a warning,
//! and the test binary says so in an ignored test (and fails when
//! `NETIO_REQUIRE_IPV6=1`). The library itself does not depend on the
//! probe.

use std::net::{Ipv6Addr, TcpListener};

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(netio_tcp_ipv6_loopback)");
    match TcpListener::bind((Ipv6Addr::LOCALHOST, 0)) {
        Ok(_) => println!("cargo::rustc-cfg=netio_tcp_ipv6_loopback"),
        Err(e) => println!(
            "cargo::warning=IPv6 loopback [::1] cannot be listened on here ({e}): \
             the netio-tcp conformance suite over ::1 is not built"
        ),
    }
}
