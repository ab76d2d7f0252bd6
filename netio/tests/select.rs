//! Run-time provider selection through the facade.

#![cfg(feature = "sim")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio::{
    AnyLoop, Backend, BackendConfig, Capabilities, ConnError, ConnId, ConnectionParams,
    CreateError, EndpointAddress, Handler, TimerQueue,
};

/// Echoes through `dyn Backend`.
struct Echo;
impl Handler<dyn Backend> for Echo {
    fn on_data(&mut self, b: &dyn Backend, conn: ConnId, data: &[u8]) {
        b.send_data_copy(conn, &[data], &[], 0).unwrap();
    }
}

/// Sends one message when connected, records the echo and stops the loop.
struct Client(Arc<Mutex<Vec<u8>>>, AnyLoop);
impl Handler<dyn Backend> for Client {
    fn on_connection_established(
        &mut self,
        b: &dyn Backend,
        c: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        b.send_data_copy(c, &[b"by name"], &[], 1).unwrap();
    }
    fn on_data(&mut self, _: &dyn Backend, _: ConnId, data: &[u8]) {
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

/// The echoes each connection got, with its handle.
type Echoes = Arc<Mutex<Vec<(ConnId, Vec<u8>)>>>;

/// Each connection sends its own handle's text once established; records
/// what each connection got back and stops the loop once both got their
/// echo.
struct Two {
    got: Echoes,
    lp: AnyLoop,
}
impl Handler<dyn Backend> for Two {
    fn on_connection_established(
        &mut self,
        b: &dyn Backend,
        c: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        b.send_data_copy(c, &[c.to_string().as_bytes()], &[], 1)
            .unwrap();
    }
    fn on_data(&mut self, _: &dyn Backend, c: ConnId, data: &[u8]) {
        let mut got = self.got.lock().unwrap();
        got.push((c, data.to_vec()));
        if got.len() == 2 {
            self.lp.stop();
        }
    }
}

#[test]
fn two_connections_to_one_listener_by_name_are_distinct() {
    let lp = AnyLoop::for_provider("sim").unwrap();
    let server = netio::create_backend("sim", &lp, BackendConfig::default(), Echo).unwrap();
    let params = ConnectionParams::receive(64, 4);
    let listen = server
        .open_listen_endpoint(EndpointAddress::new(lp.local_ip(), 0), params.clone())
        .unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let client = netio::create_backend(
        "sim",
        &lp,
        BackendConfig::default(),
        Two {
            got: got.clone(),
            lp: lp.clone(),
        },
    )
    .unwrap();
    let a = client.open_active_endpoint(listen, params.clone()).unwrap();
    let b = client.open_active_endpoint(listen, params).unwrap();
    assert_ne!(a, b);
    assert_eq!(client.connection_to(listen).unwrap(), a);
    lp.run(|| {});
    let mut got = got.lock().unwrap().clone();
    got.sort();
    let mut want = vec![
        (a, a.to_string().into_bytes()),
        (b, b.to_string().into_bytes()),
    ];
    want.sort();
    // Each echo came back on the connection that sent it, once.
    assert_eq!(got, want);
}

/// Records the timer tokens it gets, with the backend's clock, and stops
/// the loop after the last one.
struct Timers(Arc<Mutex<Vec<(u64, Duration)>>>, AnyLoop);
impl Handler<dyn Backend> for Timers {
    fn on_timer(&mut self, b: &dyn Backend, token: u64) {
        let mut seen = self.0.lock().unwrap();
        seen.push((token, b.now()));
        if token == 3 {
            self.1.stop();
        }
    }
}

#[test]
fn timers_by_name_reach_a_dyn_handler_on_the_virtual_clock() {
    let lp = AnyLoop::for_provider("sim").unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let b = netio::create_backend(
        "sim",
        &lp,
        BackendConfig::default(),
        Timers(seen.clone(), lp.clone()),
    )
    .unwrap();
    let t0 = b.now();
    b.set_timer(Duration::from_millis(30), 3);
    b.set_timer(Duration::from_millis(10), 1);
    b.set_timer(Duration::from_millis(20), 2);
    lp.run(|| {});
    let seen = seen.lock().unwrap();
    let ms = |(t, at): &(u64, Duration)| (*t, (*at - t0).as_millis());
    assert_eq!(
        seen.iter().map(ms).collect::<Vec<_>>(),
        vec![(1, 10), (2, 20), (3, 30)]
    );
    // The same queue, sans-IO, is re-exported for providers.
    let mut q = TimerQueue::new();
    q.push(Duration::from_millis(2), 7);
    assert_eq!(q.pop_due(Duration::from_millis(2)), Some(7));
}

#[test]
fn a_connection_to_an_address_nothing_was_opened_to_is_a_conn_error() {
    let lp = AnyLoop::for_provider("sim").unwrap();
    let b =
        netio::create_backend("sim", &lp, BackendConfig::default(), netio::NoopHandler).unwrap();
    let nowhere = EndpointAddress::new(lp.local_ip(), 9);
    assert!(matches!(
        b.connection_to(nowhere),
        Err(ConnError::NoConnectionTo(a)) if a == nowhere
    ));
    let never = ConnId::new(0, 0);
    assert!(matches!(
        b.pause_receive(never),
        Err(ConnError::UnknownConnection(c)) if c == never
    ));
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
