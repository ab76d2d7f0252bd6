//! Addresses and ports on virtual hosts.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{connect, full_params, listen, node};
use netio_core::{Backend, BackendConfig, EndpointAddress, OpenListenError};
use netio_sim::Sim;

#[test]
fn next_host_counts_up_from_127_0_0_1_skipping_taken_addresses() {
    let sim = Sim::with_seed(1);
    assert_eq!(sim.next_host().ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
    let taken: IpAddr = "127.0.0.2".parse().unwrap();
    assert_eq!(sim.host(taken).ip(), taken);
    assert_eq!(sim.next_host().ip(), "127.0.0.3".parse::<IpAddr>().unwrap());
    let v6: IpAddr = "fd00::7".parse().unwrap();
    assert_eq!(sim.host(v6).ip(), v6, "any unicast address, IPv6 too");
}

#[test]
#[should_panic(expected = "a host needs a unicast address")]
fn a_host_at_the_unspecified_address_is_refused_with_advice() {
    Sim::with_seed(1).host(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
}

#[test]
fn listening_on_the_unspecified_address_accepts_on_the_host_address() {
    let sim = Sim::with_seed(2);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let any = EndpointAddress::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let bound = server
        .b
        .open_listen_endpoint(any, full_params(64, 2))
        .unwrap();
    assert!(bound.ip().is_unspecified(), "the unspecified IP is kept");
    assert_ne!(bound.port(), 0);
    let target = EndpointAddress::new(server.host.ip(), bound.port());
    connect(&sim, &server, &client, target, full_params(64, 2));
    server.b.close_listen_endpoint(bound).unwrap();
}

#[test]
fn listening_on_a_foreign_address_or_a_taken_port_fails() {
    let sim = Sim::with_seed(3);
    let a = node(&sim, BackendConfig::default(), None);
    let b = node(&sim, BackendConfig::default(), None);
    let foreign = EndpointAddress::new(b.host.ip(), 7000);
    match a.b.open_listen_endpoint(foreign, full_params(64, 2)) {
        Err(e @ OpenListenError::FailedOpenListenEndpoint { .. }) => {
            assert!(e.to_string().contains("is not the address"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A second backend on the same host shares its ports.
    let same_host = a
        .host
        .backend(BackendConfig::default(), netio_core::NoopHandler)
        .unwrap();
    let addr = listen(&a, full_params(64, 2));
    match same_host.open_listen_endpoint(addr, full_params(64, 2)) {
        Err(e @ OpenListenError::FailedOpenListenEndpoint { .. }) => {
            assert!(e.to_string().contains("in use"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ephemeral_ports_follow_the_seed() {
    let ports = |seed| {
        let sim = Sim::with_seed(seed);
        let n = node(&sim, BackendConfig::default(), None);
        (0..5)
            .map(|_| listen(&n, full_params(8, 1)).port())
            .collect::<Vec<_>>()
    };
    assert_eq!(ports(7), ports(7));
    assert_ne!(ports(7), ports(8));
    assert!(ports(7).iter().all(|p| *p >= 49152));
}

#[test]
fn memory_of_a_closed_connection_is_released() {
    let sim = Sim::with_seed(4);
    let server = node(&sim, BackendConfig::default(), None);
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(100, 2));
    let (conn, _) = connect(&sim, &server, &client, addr, full_params(100, 3));
    let used = client.b.memory_usage();
    assert_eq!((used.receive_bytes, used.send_bytes), (300, 300));
    client.b.close_active_endpoint(conn).unwrap();
    sim.run_until_idle(1000);
    let used = client.b.memory_usage();
    assert_eq!((used.receive_bytes, used.send_bytes), (0, 0));
}
