//! The netio-rs conformance suite on TCP over the IPv6 loopback address
//! `::1`, in both thread modes.
//!
//! The suite is compiled only where `::1` could be listened on when this
//! crate was built (the build script sets `cfg(netio_tcp_ipv6_loopback)`);
//! its tests are then named `ipv6::conformance::…`. Otherwise the binary
//! holds one ignored test, `conformance_over_ipv6_loopback_not_built`,
//! whose reason shows in the test output and whose count shows in the
//! summary. `ipv6_loopback_matches_the_build` always runs: it fails when
//! `NETIO_REQUIRE_IPV6=1` is set and the suite was not built, and when the
//! build's probe no longer matches the machine (a stale build: rebuild with
//! `cargo clean -p netio-tcp`).

mod conformance_harness;

use conformance_harness::ipv6_loopback_works;

/// The environment variable that makes a missing IPv6 suite a failure.
const REQUIRE: &str = "NETIO_REQUIRE_IPV6";

#[cfg(netio_tcp_ipv6_loopback)]
mod ipv6 {
    netio_conformance::suite!(
        crate::conformance_harness::TcpHarness<crate::conformance_harness::V6>
    );
}

#[cfg(not(netio_tcp_ipv6_loopback))]
#[test]
#[ignore = "IPv6 loopback ::1 could not be listened on when netio-tcp was built: \
            the conformance suite over ::1 was not built (NETIO_REQUIRE_IPV6=1 makes that a failure)"]
fn conformance_over_ipv6_loopback_not_built() {}

#[test]
fn ipv6_loopback_matches_the_build() {
    let built = cfg!(netio_tcp_ipv6_loopback);
    let works = ipv6_loopback_works();
    let required = std::env::var(REQUIRE).is_ok_and(|v| v == "1");
    assert!(
        !required || built,
        "{REQUIRE}=1 but the conformance suite over ::1 was not built: \
         [::1] could not be listened on when netio-tcp was built (now: {})",
        if works { "it can" } else { "it still cannot" }
    );
    assert_eq!(
        built,
        works,
        "the build found [::1] {} but now it {}: rebuild (cargo clean -p netio-tcp) \
         so the suite over ::1 matches this machine",
        if built { "usable" } else { "unusable" },
        if works {
            "can be listened on"
        } else {
            "cannot be listened on"
        }
    );
}
