//! Run-time provider selection through the facade.

#![cfg(feature = "sim")]

use std::sync::{Arc, Mutex};

use netio::{
    AnyLoop, Backend, BackendConfig, Capabilities, ConnectionParams, CreateError, EndpointAddress,
    Handler,
};

/// Echoes through `dyn Backend`.
struct Echo;
impl Handler<dyn Backend> for Echo {
    fn on_data(&mut self, b: &dyn Backend, remote: EndpointAddress, data: &[u8]) {
        b.send_data_copy(remote, &[data], &[], 0).unwrap();
    }
}

/// Sends one message when connected, records the echo and stops the loop.
struct Client(Arc<Mutex<Vec<u8>>>, AnyLoop);
impl Handler<dyn Backend> for Client {
    fn on_connection_established(&mut self, b: &dyn Backend, r: EndpointAddress, _: Capabilities) {
        b.send_data_copy(r, &[b"by name"], &[], 1).unwrap();
    }
    fn on_data(&mut self, _: &dyn Backend, _: EndpointAddress, data: &[u8]) {
        self.0.lock().unwrap().extend_from_slice(data);
        self.1.stop();
    }
}

#[test]
fn sim_selected_by_name_runs_an_echo_through_dyn_backend() {
    assert!(netio::providers().contains(&"sim"));
    let lp = AnyLoop::for_provider("sim").unwrap();
    let server = netio::create_backend("sim", &lp, BackendConfig::default(), Echo).unwrap();
    let listen = server
        .open_listen_endpoint(
            EndpointAddress::new(lp.local_ip(), 0),
            ConnectionParams::receive(64, 4),
        )
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let client = netio::create_backend(
        "sim",
        &lp,
        BackendConfig::default(),
        Client(got.clone(), lp.clone()),
    )
    .unwrap();
    client
        .open_active_endpoint(listen, ConnectionParams::receive(64, 4))
        .unwrap();
    lp.run(|| {});
    assert_eq!(&*got.lock().unwrap(), b"by name");
}

#[test]
fn unknown_provider_name_is_a_clear_error() {
    let lp = AnyLoop::for_provider("sim").unwrap();
    match netio::create_backend(
        "carrier-pigeon",
        &lp,
        BackendConfig::default(),
        netio::NoopHandler,
    ) {
        Err(CreateError::UnknownProvider(n)) => assert_eq!(n, "carrier-pigeon"),
        other => panic!("expected UnknownProvider, got {:?}", other.map(|_| ())),
    }
    assert!(matches!(
        AnyLoop::for_provider("carrier-pigeon"),
        Err(CreateError::UnknownProvider(_))
    ));
}

#[test]
fn provider_on_the_wrong_loop_kind_is_refused() {
    let lp = AnyLoop::Mio(netio::mio_loop::MioLoop::new().unwrap());
    let r = netio::create_backend("sim", &lp, BackendConfig::default(), netio::NoopHandler);
    assert!(matches!(r, Err(CreateError::InvalidConfig(_))));
}
