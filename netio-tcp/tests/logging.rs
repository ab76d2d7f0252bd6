//! The backend's log events (`tracing`, target `netio_tcp`): connection
//! lifecycle at debug level, admission-limit refusals and protocol errors
//! as warnings. A test binary of its own: it installs a global subscriber
//! that records every event.

mod common;

use std::fmt;
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use common::{connect, raw, wait_until, Running, Side};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_tcp::TcpConfig;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every event of target `netio_tcp`: its level and its message.
struct Collect(Mutex<Vec<(Level, String)>>);

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for &'static Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        if event.metadata().target().starts_with("netio_tcp") {
            let mut m = Message(String::new());
            event.record(&mut m);
            self.0
                .lock()
                .unwrap()
                .push((*event.metadata().level(), m.0));
        }
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn events() -> &'static Collect {
    static C: OnceLock<&'static Collect> = OnceLock::new();
    C.get_or_init(|| {
        let c: &'static Collect = Box::leak(Box::new(Collect(Mutex::new(Vec::new()))));
        tracing::subscriber::set_global_default(c).expect("the only subscriber");
        c
    })
}

fn seen(level: Level, text: &str) -> bool {
    events()
        .0
        .lock()
        .unwrap()
        .iter()
        .any(|(l, m)| *l == level && m.contains(text))
}

#[test]
fn lifecycle_admission_refusals_and_protocol_errors_are_logged() {
    let _ = events();
    let rt = Running::start();
    // Lifecycle: established and closed, at debug level.
    let server = Side::with(
        &rt.lp,
        BackendConfig::default(),
        TcpConfig {
            max_connections_per_listener: 1,
            ..TcpConfig::default()
        },
        common::Recorder::default(),
    );
    let client = Side::new(&rt.lp, BackendConfig::default());
    let params = ConnectionParams::receive(1024, 2);
    let (addr, _) = connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params.clone(),
        params,
    );
    assert!(seen(Level::DEBUG, "connection established"));
    // A second connection to the full listener: refused, with a warning.
    let _extra = raw::connect(addr);
    assert!(wait_until(|| server.b.refused_connections() == 1));
    assert!(seen(Level::WARN, "refused by admission limits"));
    // A protocol violation by a peer: a warning with the reason.
    let other = Side::new(&rt.lp, BackendConfig::default());
    let l2 = other
        .b
        .open_listen_endpoint(
            EndpointAddress::localhost(0),
            ConnectionParams::receive(1024, 2),
        )
        .unwrap();
    let mut bad = raw::connect_with_handshake(l2, 1024);
    bad.write_all(&raw::frame_header(9, 0)).unwrap();
    assert!(wait_until(|| seen(Level::WARN, "connection closed")));
    client.b.close_active_endpoint(client.conn(addr)).unwrap();
    assert!(wait_until(|| seen(Level::DEBUG, "connection closed")));
}
