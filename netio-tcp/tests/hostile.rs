//! The backend against hostile and faulty peers on plain std sockets
//! (127.0.0.1 only): each case ends with a clear error or close reason at
//! the handler, no panic, and a second, well-behaved connection on the same
//! backend that still exchanges messages afterwards.

mod common;

use std::io::Write;

use common::raw;
use common::{wait_until, Ev, Recorder, Running, Side};
use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress};
use netio_tcp::wire::{DataPrefix, Handshake};
use netio_tcp::TcpConfig;

/// A listening backend with a well-behaved client connected to it.
struct Bench {
    #[allow(dead_code)]
    rt: Running,
    server: Side,
    client: Side,
    /// The server's listen address.
    listen: EndpointAddress,
    /// The well-behaved client's name on the server.
    good: EndpointAddress,
    /// Keys of the checks made so far on the good connection.
    next_key: u64,
}

impl Bench {
    fn new(tcp: TcpConfig, params: ConnectionParams) -> Self {
        Self::with(BackendConfig::default(), tcp, params, Recorder::default())
    }

    fn with(
        config: BackendConfig,
        tcp: TcpConfig,
        params: ConnectionParams,
        rec: Recorder,
    ) -> Self {
        let rt = Running::start();
        let server = Side::with(&rt.lp, config, tcp, rec);
        let client = Side::new(&rt.lp, BackendConfig::default());
        let (listen, good) = common::connect(
            &server,
            &client,
            EndpointAddress::localhost(0),
            params,
            ConnectionParams::receive(1024, 4),
        );
        Self {
            rt,
            server,
            client,
            listen,
            good,
            next_key: 1000,
        }
    }

    /// A round trip on the well-behaved connection: a message each way,
    /// both sends completed and delivered.
    fn good_connection_still_works(&mut self) {
        let key = self.next_key;
        self.next_key += 1;
        let (listen, good) = (self.listen, self.good);
        let ping = format!("ping {key}").into_bytes();
        let pong = format!("pong {key}").into_bytes();
        self.client
            .b
            .send_data_copy(listen, &[&ping], &[], key)
            .expect("the good client sends");
        assert!(
            wait_until(|| self.server.has(|e| *e == Ev::Data(good, ping.clone()))),
            "the server got the good client's message: {:?}",
            self.server.events()
        );
        self.server
            .b
            .send_data_copy(good, &[&pong], &[], key)
            .expect("the server answers the good client");
        assert!(
            wait_until(|| self.client.has(|e| *e == Ev::Data(listen, pong.clone()))),
            "the good client got the answer: {:?}",
            self.client.events()
        );
        assert!(wait_until(|| self
            .client
            .has(|e| *e == Ev::Completed(listen, key))
            && self.server.has(|e| *e == Ev::Completed(good, key))));
    }

    /// The server's events about connections other than the good one.
    fn hostile_events(&self) -> Vec<Ev> {
        let good = self.good;
        self.server
            .events()
            .into_iter()
            .filter(|e| match e {
                Ev::Established(r, _)
                | Ev::Refused(r, _)
                | Ev::Closed(r, _, _)
                | Ev::Data(r, _)
                | Ev::Completed(r, _) => *r != good,
            })
            .collect()
    }
}

#[test]
fn a_large_message_in_the_same_read_as_the_handshake_is_delivered() {
    let mut bench = Bench::new(TcpConfig::default(), ConnectionParams::receive(100_000, 4));
    let msg: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut out = Handshake::new(100_000).encode().to_vec();
    out.extend_from_slice(DataPrefix::new(&[], msg.len()).unwrap().as_bytes());
    out.extend_from_slice(&msg);
    let mut peer = raw::connect(bench.listen);
    peer.write_all(&out).unwrap();
    assert!(
        wait_until(|| bench
            .hostile_events()
            .iter()
            .any(|e| matches!(e, Ev::Data(_, d) if *d == msg))),
        "{:?}",
        bench.hostile_events()
    );
    assert!(!bench
        .hostile_events()
        .iter()
        .any(|e| matches!(e, Ev::Closed(..))));
    bench.good_connection_still_works();
}
