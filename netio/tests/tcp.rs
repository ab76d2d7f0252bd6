//! The TCP provider selected by name through the facade, on 127.0.0.1.

#![cfg(feature = "tcp")]

use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, Instant};

use netio::{
    AnyLoop, Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams,
    EndpointAddress, Handler,
};

const LIMIT: Duration = Duration::from_secs(30);

/// Echoes through `dyn Backend`.
struct Echo;
impl Handler<dyn Backend> for Echo {
    fn on_data(&mut self, b: &dyn Backend, conn: ConnId, data: &[u8]) {
        b.send_data_copy(conn, &[data], &[], 0).unwrap();
    }
}

/// What the client saw, in order.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Established(ConnId, Capabilities),
    Data(Vec<u8>),
    Closed(CloseReason),
}

/// Sends `count` numbered messages one at a time, each after the previous
/// echo, then closes; reports every event on a channel.
struct Client {
    count: u64,
    sent: u64,
    events: Sender<Seen>,
}

impl Client {
    fn next(&mut self, b: &dyn Backend, r: ConnId) {
        if self.sent == self.count {
            b.close_active_endpoint(r).unwrap();
        } else {
            let msg = format!("by name {}", self.sent);
            b.send_data_copy(r, &[msg.as_bytes()], &[], self.sent)
                .unwrap();
            self.sent += 1;
        }
    }
}

impl Handler<dyn Backend> for Client {
    fn on_connection_established(
        &mut self,
        b: &dyn Backend,
        r: ConnId,
        _: EndpointAddress,
        c: Capabilities,
    ) {
        let _ = self.events.send(Seen::Established(r, c));
        self.next(b, r);
    }
    fn on_data(&mut self, b: &dyn Backend, r: ConnId, data: &[u8]) {
        let _ = self.events.send(Seen::Data(data.to_vec()));
        self.next(b, r);
    }
    fn on_connection_closed(
        &mut self,
        _: &dyn Backend,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        _: &[u64],
    ) {
        let _ = self.events.send(Seen::Closed(why.clone()));
    }
}

#[test]
fn tcp_selected_by_name_runs_an_echo_through_dyn_backend() {
    assert!(netio::providers().contains(&"tcp"));
    let lp = AnyLoop::for_provider("tcp").unwrap();
    assert!(matches!(lp, AnyLoop::Mio(_)));
    assert!(lp.local_ip().is_loopback());

    let server: Box<dyn Backend> =
        netio::create_backend("tcp", &lp, BackendConfig::default(), Echo).unwrap();
    let params = ConnectionParams::receive(1024, 4);
    let listen = server
        .open_listen_endpoint(EndpointAddress::new(lp.local_ip(), 0), params.clone())
        .unwrap();
    assert!(listen.ip().is_loopback() && listen.port() != 0);

    let (tx, rx) = mpsc::channel();
    let client = netio::create_backend(
        "tcp",
        &lp,
        BackendConfig::default(),
        Client {
            count: 20,
            sent: 0,
            events: tx,
        },
    )
    .unwrap();

    let runner = lp.clone();
    let loop_thread = thread::spawn(move || runner.run(|| {}));
    let conn = client.open_active_endpoint(listen, params).unwrap();

    let deadline = Instant::now() + LIMIT;
    let mut seen = Vec::new();
    let outcome = loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(e @ Seen::Closed(_)) => {
                seen.push(e);
                break Ok(());
            }
            Ok(e) => seen.push(e),
            Err(e) => break Err(e),
        }
        if seen.len() > 100 {
            break Ok(());
        }
    };
    lp.stop();
    loop_thread.join().unwrap();
    outcome.unwrap_or_else(|e| panic!("{e} after {seen:?}"));

    assert!(
        matches!(seen.first(), Some(Seen::Established(id, c)) if *id == conn && c.receive && c.send_copy),
        "{seen:?}"
    );
    let echoes: Vec<_> = seen[1..seen.len() - 1].iter().collect();
    assert_eq!(echoes.len(), 20, "{seen:?}");
    for (i, e) in echoes.into_iter().enumerate() {
        assert_eq!(e, &Seen::Data(format!("by name {i}").into_bytes()));
    }
    assert_eq!(seen.last(), Some(&Seen::Closed(CloseReason::Local)));
}

#[test]
#[cfg(feature = "sim")]
fn tcp_on_a_simulator_loop_is_refused() {
    let lp = AnyLoop::for_provider("sim").unwrap();
    let r = netio::create_backend("tcp", &lp, BackendConfig::default(), netio::NoopHandler);
    match r {
        Err(netio::CreateError::InvalidConfig(msg)) => assert!(msg.contains("tcp"), "{msg}"),
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    }
}
