//! The facade selects the libfabric provider by name (feature `libfabric`;
//! `cargo test -p netio --features libfabric`).
#![cfg(feature = "libfabric")]

use netio::{AnyLoop, BackendConfig, ConnectionParams, EndpointAddress, NoopHandler};

#[test]
fn libfabric_is_selected_by_name_and_listens() {
    assert!(netio::providers().contains(&"libfabric"));
    let lp = AnyLoop::for_provider("libfabric").expect("a loop for libfabric");
    let b = netio::create_backend("libfabric", &lp, BackendConfig::default(), NoopHandler)
        .expect("a libfabric backend");
    let bound = b
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(64, 2),
        )
        .expect("listening on 127.0.0.1");
    assert_ne!(bound.port(), 0, "the bound port is returned");
}
