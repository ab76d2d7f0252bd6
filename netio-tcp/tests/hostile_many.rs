//! A thousand connections to one listener at once, in a test binary of its
//! own so that no other test opens or closes descriptors while it counts
//! them.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::raw::require_fd_limit;
use common::{raw, wait_until, Running};
use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, RefuseReason,
};
use netio_tcp::{TcpBackend, TcpConfig, TcpProvider};

/// Connections opened at once.
const N: usize = 1000;
/// Messages each client sends and gets back.
const M: usize = 3;

/// What the handlers of one side saw, over all its connections.
#[derive(Default)]
struct Tally {
    established: AtomicUsize,
    refused: AtomicUsize,
    closed: AtomicUsize,
    data: AtomicUsize,
    completed: AtomicUsize,
    /// Anything unexpected: a wrong message, a refusal, an unexpected close
    /// reason, a cancelled send.
    faults: Mutex<Vec<String>>,
}

impl Tally {
    fn fault(&self, f: String) {
        self.faults.lock().unwrap().push(f);
    }
}

/// The server: echoes every message.
struct Echo(Arc<Tally>);

impl Handler<TcpBackend> for Echo {
    fn on_connection_established(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.0.established.fetch_add(1, Ordering::SeqCst);
    }
    fn on_connection_refused(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        r: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.0.refused.fetch_add(1, Ordering::SeqCst);
        self.0.fault(format!("server: {r} refused: {why}"));
    }
    fn on_connection_closed(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        r: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        if *why != CloseReason::PeerClosed || !keys.is_empty() {
            self.0
                .fault(format!("server: {r} closed: {why}, cancelled {keys:?}"));
        }
        self.0.closed.fetch_add(1, Ordering::SeqCst);
    }
    fn on_data(&mut self, b: &TcpBackend, r: ConnId, d: &[u8]) {
        self.0.data.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = b.send_data_copy(r, &[d], &[], 7) {
            self.0.fault(format!("server: echo to {r}: {e}"));
        }
    }
    fn on_send_completed(&mut self, _: &TcpBackend, _: ConnId, _: u64) {
        self.0.completed.fetch_add(1, Ordering::SeqCst);
    }
}

/// Client `id`: sends its M messages once established, checks the echoes
/// come back in order.
struct Client {
    id: usize,
    next_echo: usize,
    tally: Arc<Tally>,
}

impl Client {
    fn message(&self, j: usize) -> Vec<u8> {
        format!("client {} message {j}", self.id).into_bytes()
    }
}

impl Handler<TcpBackend> for Client {
    fn on_connection_established(
        &mut self,
        b: &TcpBackend,
        r: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.tally.established.fetch_add(1, Ordering::SeqCst);
        for j in 0..M {
            if let Err(e) = b.send_data_copy(r, &[&self.message(j)], &[], j as u64) {
                self.tally
                    .fault(format!("client {}: send {j}: {e}", self.id));
            }
        }
    }
    fn on_connection_refused(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        _: EndpointAddress,
        why: &RefuseReason,
    ) {
        self.tally.refused.fetch_add(1, Ordering::SeqCst);
        self.tally
            .fault(format!("client {} refused: {why}", self.id));
    }
    fn on_connection_closed(
        &mut self,
        _: &TcpBackend,
        _: ConnId,
        _: EndpointAddress,
        why: &CloseReason,
        keys: &[u64],
    ) {
        if *why != CloseReason::Local || !keys.is_empty() {
            self.tally.fault(format!(
                "client {} closed: {why}, cancelled {keys:?}",
                self.id
            ));
        }
        self.tally.closed.fetch_add(1, Ordering::SeqCst);
    }
    fn on_data(&mut self, _: &TcpBackend, _: ConnId, d: &[u8]) {
        if d != self.message(self.next_echo) {
            self.tally.fault(format!(
                "client {}: echo {} is {:?}",
                self.id,
                self.next_echo,
                String::from_utf8_lossy(d)
            ));
        }
        self.next_echo += 1;
        self.tally.data.fetch_add(1, Ordering::SeqCst);
    }
    fn on_send_completed(&mut self, _: &TcpBackend, _: ConnId, _: u64) {
        self.tally.completed.fetch_add(1, Ordering::SeqCst);
    }
}

fn load(a: &AtomicUsize) -> usize {
    a.load(Ordering::SeqCst)
}

#[test]
fn thousand_connections_exchange_messages_then_close() {
    // Both ends of every connection are in this process, plus margin.
    let needed = (2 * N + 256) as u64;
    require_fd_limit(needed);
    let fds_at_start = raw::open_fds();
    {
        // The server and the clients on loops of their own, so both cores
        // work.
        let server_loop = Running::start();
        let client_loop = Running::start();
        let server_tally = Arc::new(Tally::default());
        let client_tally = Arc::new(Tally::default());
        let small = TcpConfig {
            read_buffer_size: 4096,
            ..TcpConfig::default()
        };
        let params = ConnectionParams::receive(256, 4);
        let server = TcpProvider::create_with(
            &server_loop.lp,
            BackendConfig::default(),
            small.clone(),
            Echo(Arc::clone(&server_tally)),
        )
        .unwrap();
        let listen = server
            .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
            .unwrap();
        // One backend per client: a backend has one active endpoint per
        // remote address.
        let clients: Vec<TcpBackend> = (0..N)
            .map(|id| {
                let client = Client {
                    id,
                    next_echo: 0,
                    tally: Arc::clone(&client_tally),
                };
                TcpProvider::create_with(
                    &client_loop.lp,
                    BackendConfig::default(),
                    small.clone(),
                    client,
                )
                .unwrap()
            })
            .collect();
        let fds_idle = raw::open_fds();

        let mut conns = Vec::new();
        for c in &clients {
            conns.push(c.open_active_endpoint(listen, params.clone()).unwrap());
        }
        let report = |what: &str| {
            format!(
                "{what}: server established {} data {} completed {} closed {}; clients \
                 established {} data {} completed {} closed {}; faults {:?}",
                load(&server_tally.established),
                load(&server_tally.data),
                load(&server_tally.completed),
                load(&server_tally.closed),
                load(&client_tally.established),
                load(&client_tally.data),
                load(&client_tally.completed),
                load(&client_tally.closed),
                server_tally
                    .faults
                    .lock()
                    .unwrap()
                    .iter()
                    .chain(client_tally.faults.lock().unwrap().iter())
                    .take(10)
                    .collect::<Vec<_>>()
            )
        };
        assert!(
            wait_until(|| load(&client_tally.established) == N
                && load(&server_tally.established) == N
                && load(&client_tally.data) == N * M
                && load(&client_tally.completed) == N * M
                && load(&server_tally.completed) == N * M),
            "{}",
            report("exchanging")
        );
        assert_eq!(load(&server_tally.data), N * M, "{}", report("exchanged"));

        for (c, &conn) in clients.iter().zip(&conns) {
            c.close_active_endpoint(conn).unwrap();
        }
        assert!(
            wait_until(|| load(&client_tally.closed) == N && load(&server_tally.closed) == N),
            "{}",
            report("closing")
        );
        // Every socket is let go of once both sides are done, while the
        // backends live on.
        assert!(
            wait_until(|| raw::open_fds() == fds_idle),
            "{} descriptors open, {} before connecting",
            raw::open_fds(),
            fds_idle
        );
        assert!(
            server_tally.faults.lock().unwrap().is_empty(),
            "{}",
            report("done")
        );
        assert!(
            client_tally.faults.lock().unwrap().is_empty(),
            "{}",
            report("done")
        );
        assert_eq!(load(&server_tally.refused) + load(&client_tally.refused), 0);
        assert_eq!(server.queued_send_bytes(), Some(0));
        assert!(server_loop.lp.is_running() && client_loop.lp.is_running());
        server.close_listen_endpoint(listen).unwrap();
        drop(clients);
        drop(server);
    }
    // The loops are gone too: not one descriptor more than at the start.
    assert!(
        wait_until(|| raw::open_fds() == fds_at_start),
        "{} descriptors open, {} at the start",
        raw::open_fds(),
        fds_at_start
    );
}
