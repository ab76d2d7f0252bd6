//! A producer that forwards numbered records to a collector over an
//! unreliable network, and the invariant it must keep: every record ends
//! up stored at the collector. Shared by the `chaos` example and the
//! simulator's chaos tests.
//!
//! The planted bug ([`Ack::OnCompletion`]): the producer forgets a record
//! as soon as its send completes. Under the TCP profile a completion means
//! the bytes were handed to the local kernel, not that the collector has
//! them, so a collector crash or a reset loses records. The fix
//! ([`Ack::FromCollector`]): forget a record only when the collector
//! acknowledges it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use netio_core::{
    Backend, BackendConfig, Capabilities, CloseReason, ConnId, ConnectionParams, EndpointAddress,
    Handler, RefuseReason,
};
use netio_sim::{Sim, SimBackend};

/// The collector's port (it listens there again after a restart).
pub const PORT: u16 = 7000;
/// Records the producer makes, one every [`EVERY`].
pub const RECORDS: u64 = 300;
/// How often the producer makes a record.
pub const EVERY: Duration = Duration::from_millis(5);
const RETRY: u64 = 1;
const PRODUCE: u64 = 2;
const RETRY_AFTER: Duration = Duration::from_millis(10);

/// When the producer forgets a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// When its send completes: the planted bug.
    OnCompletion,
    /// When the collector says it stored it.
    FromCollector,
}

/// Both hosts' backend configuration.
pub fn config() -> BackendConfig {
    BackendConfig {
        // Notice a silent peer within a second.
        peer_timeout: Some(Duration::from_secs(1)),
        ..BackendConfig::default()
    }
}

/// Both hosts' connection parameters.
pub fn params() -> ConnectionParams {
    ConnectionParams::receive(64, 16)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What survives a crash: the producer's outbox and the collector's store
/// (think of them as files on disk).
#[derive(Clone, Default)]
pub struct Disks {
    /// How many records the producer made so far.
    pub made: Arc<Mutex<u64>>,
    /// Records the producer still has to get through.
    pub outbox: Arc<Mutex<BTreeSet<u64>>>,
    /// Records the collector stored.
    pub stored: Arc<Mutex<BTreeSet<u64>>>,
}

/// Stores every record and acknowledges it.
struct Collector {
    stored: Arc<Mutex<BTreeSet<u64>>>,
}

impl Handler<SimBackend> for Collector {
    fn on_data(&mut self, b: &SimBackend, conn: ConnId, data: &[u8]) {
        let Ok(id) = <[u8; 8]>::try_from(data).map(u64::from_le_bytes) else {
            return;
        };
        lock(&self.stored).insert(id);
        // Best effort: a lost acknowledgement makes the producer send the
        // record again, which the store shrugs off.
        let _ = b.send_data_copy(conn, &[&id.to_le_bytes()], &[], id);
    }
}

/// Sends what is in the outbox, reconnecting whenever the connection ends.
struct Producer {
    ack: Ack,
    collector: EndpointAddress,
    made: Arc<Mutex<u64>>,
    outbox: Arc<Mutex<BTreeSet<u64>>>,
    conn: Option<ConnId>,
    /// Records sent on the current connection and not yet forgotten.
    in_flight: BTreeSet<u64>,
}

impl Producer {
    fn connect(&mut self, b: &SimBackend) {
        self.in_flight.clear();
        self.conn = b.open_active_endpoint(self.collector, params()).ok();
        if self.conn.is_none() {
            b.set_timer(RETRY_AFTER, RETRY);
        }
    }

    /// Sends every outbox record not yet on the wire of this connection.
    fn pump(&mut self, b: &SimBackend, conn: ConnId) {
        let todo: Vec<u64> = lock(&self.outbox)
            .iter()
            .copied()
            .filter(|id| !self.in_flight.contains(id))
            .collect();
        for id in todo {
            if b.send_data_copy(conn, &[&id.to_le_bytes()], &[], id)
                .is_err()
            {
                b.set_timer(RETRY_AFTER, RETRY); // queue full: later
                return;
            }
            self.in_flight.insert(id);
        }
    }

    fn lost(&mut self, b: &SimBackend, conn: ConnId) {
        if self.conn == Some(conn) {
            self.conn = None;
            self.in_flight.clear();
            b.set_timer(RETRY_AFTER, RETRY);
        }
    }
}

impl Handler<SimBackend> for Producer {
    fn on_connection_established(
        &mut self,
        b: &SimBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: Capabilities,
    ) {
        self.pump(b, conn);
    }

    fn on_connection_refused(
        &mut self,
        b: &SimBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: &RefuseReason,
    ) {
        self.lost(b, conn);
    }

    fn on_connection_closed(
        &mut self,
        b: &SimBackend,
        conn: ConnId,
        _: EndpointAddress,
        _: &CloseReason,
        _: &[u64],
    ) {
        self.lost(b, conn);
    }

    fn on_sends_completed(&mut self, _: &SimBackend, _: ConnId, keys: &[u64]) {
        if self.ack == Ack::OnCompletion {
            let mut outbox = lock(&self.outbox);
            for id in keys {
                outbox.remove(id);
            }
        }
    }

    fn on_data(&mut self, _: &SimBackend, _: ConnId, data: &[u8]) {
        if let Ok(id) = <[u8; 8]>::try_from(data).map(u64::from_le_bytes) {
            lock(&self.outbox).remove(&id);
            self.in_flight.remove(&id);
        }
    }

    fn on_timer(&mut self, b: &SimBackend, token: u64) {
        if token == PRODUCE {
            let mut made = lock(&self.made);
            lock(&self.outbox).insert(*made);
            *made += 1;
            if *made < RECORDS {
                b.set_timer(EVERY, PRODUCE);
            }
            drop(made);
            if let Some(conn) = self.conn {
                self.pump(b, conn);
            }
            return;
        }
        match self.conn {
            None => self.connect(b),
            Some(conn) => self.pump(b, conn),
        }
    }
}

fn start_collector(host: &netio_sim::SimHost, stored: Arc<Mutex<BTreeSet<u64>>>) {
    let b = host
        .backend(config(), Collector { stored })
        .expect("collector backend");
    b.open_listen_endpoint(EndpointAddress::new(host.ip(), PORT), params())
        .expect("collector listens");
}

fn start_producer(host: &netio_sim::SimHost, ack: Ack, collector: IpAddr, disks: &Disks) {
    let b = host
        .backend(
            config(),
            Producer {
                ack,
                collector: EndpointAddress::new(collector, PORT),
                made: disks.made.clone(),
                outbox: disks.outbox.clone(),
                conn: None,
                in_flight: BTreeSet::new(),
            },
        )
        .expect("producer backend");
    // Start from the loop, like every later attempt.
    b.set_timer(Duration::ZERO, RETRY);
    if *lock(&disks.made) < RECORDS {
        b.set_timer(EVERY, PRODUCE);
    }
}

/// Builds the application on `sim`: a collector host and a producer host
/// that makes a record every [`EVERY`], each restarting itself after a
/// crash.
pub fn setup(sim: &Sim, ack: Ack) -> Disks {
    let disks = Disks::default();
    let (collector, producer) = (sim.next_host(), sim.next_host());
    let cip = collector.ip();
    start_collector(&collector, disks.stored.clone());
    let stored = disks.stored.clone();
    collector.on_restart(move |h| start_collector(h, stored.clone()));
    start_producer(&producer, ack, cip, &disks);
    let d = disks.clone();
    producer.on_restart(move |h| start_producer(h, ack, cip, &d));
    disks
}

/// The invariant: every record is stored at the collector.
pub fn check(_: &Sim, disks: &mut Disks) -> Result<(), String> {
    let made = *lock(&disks.made);
    if made != RECORDS {
        return Err(format!("the producer made {made} of {RECORDS} records"));
    }
    let stored = lock(&disks.stored);
    let missing: Vec<u64> = (0..RECORDS).filter(|id| !stored.contains(id)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {RECORDS} records never reached the collector (first: {:?}); the producer \
             still holds {} in its outbox",
            missing.len(),
            &missing[..missing.len().min(5)],
            lock(&disks.outbox).len()
        ))
    }
}
