//! An async application under the simulator's chaos runner, written as a
//! user would: tasks on the loop (`AsyncBackend::spawn`), a restart hook
//! that spawns them again, no executor or glue of its own. The
//! application is the `chaos` example's (a producer forwarding numbered
//! records to a collector, with the same planted bug: forgetting a record
//! when its send completes), and the runner finds the bug as it does in
//! the callback version; the fixed application passes the same seeds, and
//! a seed replays exactly.

// The callback application's invariant, records and disks: the same
// application, written the other way.
#[path = "../../netio-sim/examples/chaos/app.rs"]
#[allow(dead_code)]
mod app;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use app::{check, config, params, Ack, Disks, EVERY, PORT, RECORDS};
use netio_async::AsyncBackend;
use netio_core::EndpointAddress;
use netio_sim::chaos::{check_determinism, Chaos, Faults};
use netio_sim::{Sim, SimBackend, SimHost};

const RETRY_AFTER: Duration = Duration::from_millis(10);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Async = Arc<AsyncBackend<SimBackend>>;

/// Stores every record it receives and acknowledges it: one task
/// accepting, one per connection.
fn start_collector(host: &SimHost, stored: Arc<Mutex<BTreeSet<u64>>>) {
    let b: Async = Arc::new(AsyncBackend::new(|h| host.backend(config(), h)).expect("collector"));
    b.listen(EndpointAddress::new(host.ip(), PORT), params())
        .expect("collector listens");
    let me = Arc::clone(&b);
    b.spawn(async move {
        while let Some(conn) = me.accept().await {
            let stored = Arc::clone(&stored);
            me.spawn(async move {
                while let Some(m) = conn.recv().await {
                    let Ok(id) = <[u8; 8]>::try_from(&m[..]).map(u64::from_le_bytes) else {
                        continue;
                    };
                    lock(&stored).insert(id);
                    // Best effort: a lost acknowledgement makes the
                    // producer send the record again.
                    if conn.send(&id.to_le_bytes()).await.is_err() {
                        break;
                    }
                }
            })
            .detach();
        }
    })
    .detach();
}

/// Makes a record every [`EVERY`] and forwards the outbox to the
/// collector, reconnecting whenever the connection ends.
fn start_producer(host: &SimHost, ack: Ack, collector: IpAddr, disks: &Disks) {
    let b: Async = Arc::new(AsyncBackend::new(|h| host.backend(config(), h)).expect("producer"));
    let (me, made, outbox) = (Arc::clone(&b), disks.made.clone(), disks.outbox.clone());
    b.spawn(async move {
        loop {
            if *lock(&made) >= RECORDS {
                return;
            }
            me.sleep(EVERY).await;
            let mut n = lock(&made);
            lock(&outbox).insert(*n);
            *n += 1;
        }
    })
    .detach();
    let (me, outbox) = (Arc::clone(&b), disks.outbox.clone());
    let to = EndpointAddress::new(collector, PORT);
    b.spawn(async move {
        loop {
            let Ok(conn) = me.connect(to, params()).await else {
                me.sleep(RETRY_AFTER).await;
                continue;
            };
            let conn = Arc::new(conn);
            // Acknowledgements, read by a task of their own for this
            // connection's life (dropped with its handle).
            let (reader, acks) = (Arc::clone(&conn), Arc::clone(&outbox));
            let _reader = me.spawn(async move {
                while let Some(m) = reader.recv().await {
                    if let Ok(id) = <[u8; 8]>::try_from(&m[..]).map(u64::from_le_bytes) {
                        lock(&acks).remove(&id);
                    }
                }
            });
            let mut sent = BTreeSet::new();
            'life: while conn.close_reason().is_none() {
                let todo: Vec<u64> = lock(&outbox)
                    .iter()
                    .copied()
                    .filter(|id| !sent.contains(id))
                    .collect();
                for id in todo {
                    if conn.send(&id.to_le_bytes()).await.is_err() {
                        break 'life;
                    }
                    sent.insert(id);
                    if ack == Ack::OnCompletion {
                        lock(&outbox).remove(&id);
                    }
                }
                me.sleep(RETRY_AFTER).await;
            }
            me.sleep(RETRY_AFTER).await;
        }
    })
    .detach();
}

/// The application on `sim`: a collector host and a producer host, each
/// spawning its tasks again after a restart.
fn setup(sim: &Sim, ack: Ack) -> Disks {
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

fn chaos() -> Chaos {
    Chaos::new()
        .runs(20)
        .duration(Duration::from_secs(2))
        .interval(Duration::from_millis(50))
        .settle(Duration::from_secs(10))
        .faults(Faults::ALL)
}

#[test]
fn the_chaos_runner_finds_the_planted_bug_in_an_async_application() {
    if std::env::var_os("NETIO_CHAOS_SEED").is_some() {
        return; // replaying something else
    }
    let failure = chaos()
        .run(|sim| setup(sim, Ack::OnCompletion), check)
        .expect_err("forgetting records on completion loses some under faults");
    assert!(
        failure.message.contains("never reached the collector"),
        "{failure}"
    );
    assert!(!failure.faults.is_empty());
    // The seed alone replays the same run.
    let again = chaos()
        .seed(failure.seed)
        .runs(1)
        .run(|sim| setup(sim, Ack::OnCompletion), check)
        .expect_err("the same seed fails again");
    assert_eq!(again.message, failure.message);
    assert_eq!(again.faults, failure.faults);
}

#[test]
fn the_fixed_async_application_survives_the_same_chaos() {
    let report = chaos().run_or_panic(|sim| setup(sim, Ack::FromCollector), check);
    assert!(report.runs >= 1);
    assert!(report.faults > 10 * report.runs, "{report:?}");
}

#[test]
fn without_faults_the_async_application_loses_nothing() {
    let report = chaos()
        .runs(3)
        .faults(Faults::NONE)
        .run_or_panic(|sim| setup(sim, Ack::OnCompletion), check);
    assert_eq!(report.faults, 0);
}

#[test]
fn the_async_application_is_deterministic_under_chaos() {
    check_determinism(1, |sim| {
        let _disks = setup(sim, Ack::OnCompletion);
        sim.run_for(Duration::from_secs(1));
    })
    .expect("same seed, same trace");
    chaos()
        .runs(1)
        .check_determinism(|sim| setup(sim, Ack::FromCollector))
        .expect("same seed and faults, same trace");
}

#[test]
fn each_chaos_run_frees_the_async_applications_tasks() {
    // The tasks hold their backends, which hold the world: a cycle that
    // only the end of the run (`Sim::shut_down`, called by the runner)
    // breaks. Weak references to what the tasks hold tell.
    let left = Mutex::new(Vec::new());
    let report = chaos().runs(3).run_or_panic(
        |sim| {
            let disks = setup(sim, Ack::FromCollector);
            lock(&left).push(Arc::downgrade(&disks.outbox));
            disks
        },
        check,
    );
    assert_eq!(report.runs, 3);
    let left = left.into_inner().unwrap();
    assert_eq!(left.len(), 3);
    for w in left {
        assert!(w.upgrade().is_none(), "a run's tasks outlived it");
    }
}
