//! Busy polling (`LibfabricConfig::max_poll`, on a busy-polling `MioLoop`)
//! carries traffic like interrupt mode does, and a local close there still
//! waits for its sends (whose completion queue only the spin reads).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{listener_and_connector, wait_until, LastConn, Recorder, Running, Seen, Tracked};
use netio_core::mio_loop::{LoopConfig, MioLoop};
use netio_core::{
    Backend, BackendConfig, CloseReason, ConnId, ConnectionParams, EndpointAddress, EventLoop,
    Handler, SendError,
};
use netio_libfabric::{LibfabricBackend, LibfabricConfig};

const PINGS: usize = 200;

#[test]
fn pings_are_answered_with_busy_polling() {
    let lp = MioLoop::with_config(LoopConfig {
        busy_poll: true,
        ..LoopConfig::default()
    })
    .unwrap();
    let runner = lp.clone();
    let thread = std::thread::spawn(move || runner.run(|| {}));
    let rec = Recorder::new(PINGS);
    let lf = LibfabricConfig {
        max_poll: 100,
        ..LibfabricConfig::provider("tcp")
    };
    let b = LibfabricBackend::new(&lp, BackendConfig::default(), lf, rec.clone()).unwrap();
    let params = ConnectionParams::receive(64, 16);
    let listen = b
        .open_listen_endpoint("127.0.0.1:0".parse().unwrap(), params.clone())
        .unwrap();
    rec.greet_port.store(listen.port(), Ordering::SeqCst);
    let conn = b.open_active_endpoint(listen, params).unwrap();
    let ok = wait_until(|| rec.count(|s| *s == Seen::Pong(conn)) == PINGS);
    lp.stop();
    thread.join().unwrap();
    assert!(
        ok,
        "every ping answered: {} of {PINGS}",
        rec.count(|s| *s == Seen::Pong(conn))
    );
}

/// A close report: the keys cancelled, and when it came.
type CloseReport = (Vec<u64>, Instant);

/// Counts what a side of the linger test saw.
#[derive(Clone, Default)]
struct Tally {
    delivered: Arc<AtomicU64>,
    completed: Arc<Mutex<Vec<u64>>>,
    closed: Arc<Mutex<Option<CloseReport>>>,
}

impl Handler<LibfabricBackend> for Tally {
    fn on_connection_closed(
        &mut self,
        _b: &LibfabricBackend,
        _c: ConnId,
        _r: EndpointAddress,
        _why: &CloseReason,
        keys: &[u64],
    ) {
        *self.closed.lock().unwrap() = Some((keys.to_vec(), Instant::now()));
    }

    fn on_data(&mut self, _b: &LibfabricBackend, _c: ConnId, _data: &[u8]) {
        self.delivered.fetch_add(1, Ordering::SeqCst);
    }

    fn on_sends_completed(&mut self, _b: &LibfabricBackend, _c: ConnId, keys: &[u64]) {
        self.completed.lock().unwrap().extend_from_slice(keys);
    }
}

/// On a busy-polling loop the completion queues have no wait fd: a
/// connection closed locally with sends the fabric provider still holds is
/// read by the spin callback until they end. Its sends reach the peer once
/// the peer reads again, are reported completed, and the close comes as
/// soon as the last one ended, not at `close_linger` with the rest
/// reported cancelled.
#[test]
fn on_busy_polling_loops_a_local_close_waits_for_its_sends_and_no_longer() {
    const LINGER: Duration = Duration::from_secs(8);
    let (rx_loop, tx_loop) = (Running::start_busy(), Running::start_busy());
    let lf = LibfabricConfig {
        close_linger: LINGER,
        ..LibfabricConfig::provider("tcp")
    };
    let (rx, tx) = (Tally::default(), Tally::default());
    let (rx_conn, tx_conn) = (LastConn::default(), LastConn::default());
    let (receiver, sender) = common::receiver_and_sender(
        &rx_loop.lp,
        &tx_loop.lp,
        lf,
        Tracked::new(rx.clone(), &rx_conn),
        Tracked::new(tx.clone(), &tx_conn),
        ConnectionParams::receive(64 * 1024, 8),
    );
    let (Some(accepted), Some(conn)) = (rx_conn.wait(), tx_conn.wait()) else {
        panic!("both sides established");
    };
    // The receiver stops reading: the sender's messages pile up in the
    // sockets' buffers and then in the fabric provider.
    receiver.pause_receive(accepted).unwrap();
    let payload = vec![7u8; 60 * 1024];
    let mut sent = 0u64;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        match sender.send_data_copy(conn, &[&payload], &[], sent) {
            Ok(()) => sent += 1,
            Err(SendError::NoResources) => break,
            Err(e) => panic!("send {sent}: {e}"),
        }
    }
    // Let the provider write what the sockets take.
    std::thread::sleep(Duration::from_millis(200));
    let in_flight = sent - tx.completed.lock().unwrap().len() as u64;
    assert!(
        in_flight > 0,
        "sends still in flight at the close ({sent} sent, all completed): the test needs some"
    );
    let closed_at = Instant::now();
    sender.close_active_endpoint(conn).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    receiver.resume_receive(accepted).unwrap();
    assert!(
        wait_until(|| tx.closed.lock().unwrap().is_some()),
        "the sender's close reported"
    );
    let (cancelled, when) = tx.closed.lock().unwrap().clone().unwrap();
    let completed = tx.completed.lock().unwrap().clone();
    let took = when - closed_at;
    assert!(
        took < LINGER / 2,
        "the close waited {took:?} (close_linger {LINGER:?}): its sends were not read to their \
         end ({in_flight} in flight at the close; {} completed, {} cancelled in all)",
        completed.len(),
        cancelled.len()
    );
    let mut all: Vec<u64> = completed.iter().chain(&cancelled).copied().collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (0..sent).collect::<Vec<_>>(),
        "every key reported once"
    );
    assert!(
        cancelled.is_empty(),
        "{} of {in_flight} sends in flight at the close reported cancelled, though the peer \
         read again",
        cancelled.len()
    );
    assert!(
        wait_until(|| rx.delivered.load(Ordering::SeqCst) == sent),
        "every completed send delivered: {} of {sent}",
        rx.delivered.load(Ordering::SeqCst)
    );
}

/// What the ordering test's client saw, in order.
#[derive(Clone, Debug, PartialEq)]
enum Order {
    Data(Vec<u8>),
    Completed(Vec<u64>),
}

#[derive(Clone, Default)]
struct OrderLog {
    seen: Arc<Mutex<Vec<Order>>>,
}

impl Handler<LibfabricBackend> for OrderLog {
    fn on_data(&mut self, _b: &LibfabricBackend, _c: ConnId, data: &[u8]) {
        self.seen.lock().unwrap().push(Order::Data(data.to_vec()));
    }

    fn on_sends_completed(&mut self, _b: &LibfabricBackend, _c: ConnId, keys: &[u64]) {
        self.seen
            .lock()
            .unwrap()
            .push(Order::Completed(keys.to_vec()));
    }
}

/// Echoes every message.
struct Echo;

impl Handler<LibfabricBackend> for Echo {
    fn on_data(&mut self, b: &LibfabricBackend, c: ConnId, data: &[u8]) {
        b.send_data_copy(c, &[data], &[], 0).expect("echo");
    }
}

/// A server and a client backend over `tcp`, each on its own busy-polling
/// loop, the client connecting to the server's listener (8 receive
/// buffers of 64 bytes on each side).
struct BusyPair {
    server: LibfabricBackend,
    client: LibfabricBackend,
    // The loops stop when dropped, after the backends.
    _server_loop: Running,
    client_loop: Running,
}

impl BusyPair {
    fn connect(
        server_handler: impl Handler<LibfabricBackend> + 'static,
        client_handler: impl Handler<LibfabricBackend> + 'static,
    ) -> Self {
        let (server_loop, client_loop) = (Running::start_busy(), Running::start_busy());
        let params = ConnectionParams::receive(64, 8);
        let (server, client) = listener_and_connector(
            &server_loop.lp,
            &client_loop.lp,
            LibfabricConfig::provider("tcp"),
            server_handler,
            client_handler,
            params.clone(),
            params,
        );
        Self {
            server,
            client,
            _server_loop: server_loop,
            client_loop,
        }
    }
}

/// When one completion-queue read of a busy-polling loop finds a message
/// and the completion of an earlier send of the same connection, the
/// message is handed to `on_data` first and the completion reported after
/// it: a reply sent from `on_data` does not wait for that report (the
/// contract orders completions among themselves, not against messages).
/// The client's loop is held in a posted closure while its ping goes out
/// (`tcp` writes it and queues its completion inside the send) and the
/// echo lands, so that its first read after the hold finds both.
#[test]
fn a_message_found_with_a_completion_is_handed_over_before_the_completion_is_reported() {
    let (log, client_conn) = (OrderLog::default(), LastConn::default());
    let pair = BusyPair::connect(Echo, Tracked::new(log.clone(), &client_conn));
    let (client_loop, client) = (&pair.client_loop, &pair.client);
    let conn = client_conn.wait().expect("the client established");
    for round in 0..3u64 {
        log.seen.lock().unwrap().clear();
        let (held, release) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (h, r) = (Arc::clone(&held), Arc::clone(&release));
        client_loop.lp.post(move || {
            h.store(1, Ordering::SeqCst);
            let started = Instant::now();
            while r.load(Ordering::SeqCst) == 0 && started.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(
            wait_until(|| held.load(Ordering::SeqCst) == 1),
            "the client's loop held"
        );
        let key = 100 + round;
        client
            .send_data_copy(conn, &[b"ping"], &[], key)
            .expect("ping");
        // The echo lands meanwhile (the server polls busily).
        std::thread::sleep(Duration::from_millis(200));
        release.store(1, Ordering::SeqCst);
        assert!(
            wait_until(|| log.seen.lock().unwrap().len() == 2),
            "round {round}: the echo and the completion reported: {:?}",
            log.seen.lock().unwrap()
        );
        assert_eq!(
            *log.seen.lock().unwrap(),
            vec![Order::Data(b"ping".to_vec()), Order::Completed(vec![key])],
            "round {round}: the message first, then the completion"
        );
    }
}

/// Records every message and pauses its connection from `on_data` once it
/// has `pause_at` of them.
#[derive(Clone, Default)]
struct PauseAt {
    pause_at: usize,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Handler<LibfabricBackend> for PauseAt {
    fn on_data(&mut self, b: &LibfabricBackend, c: ConnId, data: &[u8]) {
        let mut seen = self.seen.lock().unwrap();
        seen.push(data.to_vec());
        if seen.len() == self.pause_at {
            b.pause_receive(c).expect("pausing from on_data");
        }
    }
}

/// On a busy-polling loop a message that a read finds alone goes from the
/// read to `on_data` without being held or queued; a handler that pauses
/// its connection from that call gets nothing more until it resumes, and
/// then every later message, in order (each sent on its own, so that each
/// read finds one).
#[test]
fn on_busy_polling_loops_a_pause_from_on_data_of_a_lone_message_holds_the_next_ones_until_resume() {
    let server_log = PauseAt {
        pause_at: 1,
        ..PauseAt::default()
    };
    let client_log = OrderLog::default();
    let (server_conn, client_conn) = (LastConn::default(), LastConn::default());
    let pair = BusyPair::connect(
        Tracked::new(server_log.clone(), &server_conn),
        Tracked::new(client_log.clone(), &client_conn),
    );
    let (server, client) = (&pair.server, &pair.client);
    let (Some(conn), Some(server_conn)) = (client_conn.wait(), server_conn.wait()) else {
        panic!("both sides established");
    };
    for i in 0..6u8 {
        client
            .send_data_copy(conn, &[&[i; 16]], &[], u64::from(i))
            .expect("send");
        // Each message on its own: the server's reads find them one by one.
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        wait_until(|| client_log.seen.lock().unwrap().len() == 6),
        "every send completed: {:?}",
        client_log.seen.lock().unwrap()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        *server_log.seen.lock().unwrap(),
        vec![vec![0u8; 16]],
        "nothing delivered after the pause from on_data"
    );
    server.resume_receive(server_conn).expect("resuming");
    assert!(
        wait_until(|| server_log.seen.lock().unwrap().len() == 6),
        "every message delivered after the resume: {:?}",
        server_log.seen.lock().unwrap().len()
    );
    let expected: Vec<Vec<u8>> = (0..6u8).map(|i| vec![i; 16]).collect();
    assert_eq!(
        *server_log.seen.lock().unwrap(),
        expected,
        "in the order sent"
    );
}
