//! `netio_tcp::local_addresses()`: the host's interface addresses, and that
//! each of them can be listened on.
//!
//! Listening binds a socket on the address and sends nothing: no traffic
//! leaves the host. Connections are made over loopback only.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{wait_until, Ev, Running, Side};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_tcp::local_addresses;

#[test]
fn local_addresses_include_127_0_0_1_flagged_as_loopback() {
    let addrs = local_addresses().expect("listing the interfaces");
    let lo = addrs
        .iter()
        .find(|a| a.ip == IpAddr::V4(Ipv4Addr::LOCALHOST))
        .unwrap_or_else(|| panic!("127.0.0.1 is missing from {addrs:?}"));
    assert!(lo.is_loopback, "{lo:?}");
    assert!(!lo.interface.is_empty(), "{lo:?}");
    for a in &addrs {
        assert_eq!(a.is_loopback, a.ip.is_loopback(), "{a:?}");
    }
    // Listed once each.
    for (i, a) in addrs.iter().enumerate() {
        assert!(!addrs[i + 1..].contains(a), "{a:?} listed twice");
    }
}

#[test]
fn every_listed_address_can_be_listened_on() {
    let rt = Running::start();
    let side = Side::new(&rt.lp, BackendConfig::default());
    let addrs = local_addresses().expect("listing the interfaces");
    let mut listened = 0;
    for a in &addrs {
        // IPv6 link-local addresses need the interface's scope id to be
        // bound, which an EndpointAddress cannot carry; local_addresses()
        // leaves them out, and they would be skipped here.
        if let IpAddr::V6(v6) = a.ip {
            if v6.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
        }
        let at = EndpointAddress::new(a.ip, 0);
        let bound = side
            .b
            .open_listen_endpoint(at, ConnectionParams::receive(64, 2))
            .unwrap_or_else(|e| panic!("listening on {} ({}): {e}", a.ip, a.interface));
        assert_eq!(bound.ip(), a.ip);
        assert_ne!(bound.port(), 0);
        side.b.close_listen_endpoint(bound).unwrap();
        listened += 1;
    }
    assert!(listened >= 1, "nothing listened on: {addrs:?}");
}

#[test]
fn a_listed_loopback_address_accepts_connections() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let addrs = local_addresses().expect("listing the interfaces");
    for a in addrs.iter().filter(|a| a.is_loopback) {
        let l = server
            .b
            .open_listen_endpoint(
                EndpointAddress::new(a.ip, 0),
                ConnectionParams::receive(64, 2),
            )
            .unwrap();
        client
            .b
            .open_active_endpoint(l, ConnectionParams::buffered(64, 2))
            .unwrap();
        assert!(
            wait_until(|| client.has(|e| matches!(e, Ev::Established(r, _) if *r == l))),
            "connecting to {l} ({}): {:?}",
            a.interface,
            client.events()
        );
    }
}
