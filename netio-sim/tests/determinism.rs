//! Same seed, same run; different seed, different schedule; and virtual
//! time is cheap.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect, full_params, listen, node, send_buffered, Event, React};
use netio_core::{Backend, BackendConfig, EventLoop, Timer};
use netio_sim::{Sim, SimBackend};

/// A server that echoes every message.
fn echo() -> Option<React<SimBackend>> {
    Some(Box::new(|b: &SimBackend, e: &Event| {
        if let Event::Data { conn, data } = e {
            let _ = b.send_data_copy(*conn, &[data], &[], data.len() as u64);
        }
    }))
}

/// Three clients talk to an echo server with buffered and copy sends; one
/// client is partitioned away and healed, another is reset mid-stream.
fn scenario(seed: u64) -> String {
    let sim = Sim::with_seed(seed);
    sim.enable_trace(true);
    let server = node(&sim, BackendConfig::default(), echo());
    let addr = listen(&server, full_params(256, 8));
    let clients: Vec<_> = (0..3)
        .map(|_| node(&sim, BackendConfig::default(), None))
        .collect();
    let conns: Vec<_> = clients
        .iter()
        .map(|c| connect(&sim, &server, c, addr, full_params(256, 8)).0)
        .collect();
    for round in 0..20u32 {
        for (i, (c, &conn)) in clients.iter().zip(&conns).enumerate() {
            let msg = vec![i as u8; 10 + (round as usize * 7 + i * 13) % 200];
            if round % 2 == 0 {
                send_buffered(&c.b, conn, &msg, 1000 + u64::from(round));
            } else {
                let _ =
                    c.b.send_data_copy(conn, &[&msg], &round.to_le_bytes(), u64::from(round));
            }
        }
        if round == 5 {
            sim.partition(clients[1].host.ip(), server.host.ip());
        }
        if round == 12 {
            sim.heal(clients[1].host.ip(), server.host.ip());
        }
        if round == 15 {
            sim.reset_connections(clients[2].host.ip(), server.host.ip());
        }
        sim.run_for(Duration::from_micros(7));
    }
    sim.run_until_idle(100_000);
    sim.trace()
}

#[test]
fn same_seed_gives_identical_trace() {
    let a = scenario(42);
    let b = scenario(42);
    assert!(
        a.lines().count() > 200,
        "the scenario should produce a long trace:\n{a}"
    );
    for word in [
        "established",
        "data conn#",
        "completed",
        "fault partition",
        "fault heal",
        "fault reset",
        "closed",
    ] {
        assert!(a.contains(word), "trace lacks `{word}`");
    }
    if a != b {
        let first = a
            .lines()
            .zip(b.lines())
            .position(|(x, y)| x != y)
            .unwrap_or(0);
        panic!(
            "traces differ from line {first}:\n{}\nvs\n{}",
            a.lines().nth(first).unwrap_or(""),
            b.lines().nth(first).unwrap_or("")
        );
    }
}

#[test]
fn different_seed_gives_different_schedule() {
    let a = scenario(1);
    let b = scenario(2);
    assert_ne!(a, b, "seeds 1 and 2 gave the same schedule");
    // Same events, only their timing and order differ: every message still
    // goes through.
    let count = |t: &str, w: &str| t.lines().filter(|l| l.contains(w)).count();
    assert_eq!(count(&a, "fault"), count(&b, "fault"));
}

#[test]
fn default_seed_is_used_and_reported() {
    let sim = Sim::with_seed(Sim::DEFAULT_SEED);
    assert_eq!(sim.seed(), Sim::DEFAULT_SEED);
    assert_eq!(Sim::with_seed(9).seed(), 9);
}

#[test]
fn simulated_minutes_run_in_well_under_a_second() {
    let sim = Sim::with_seed(3);
    let server = node(&sim, BackendConfig::default(), echo());
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (conn, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    // A client timer sends one message every 10 ms of virtual time.
    let sent = Arc::new(AtomicU64::new(0));
    let (b, n) = (client.b.clone(), sent.clone());
    let timer = client.host.event_loop().timer(move || {
        if b.send_data_copy(conn, &[b"tick"], &[], 0).is_ok() {
            n.fetch_add(1, Ordering::Relaxed);
        }
    });
    timer.start(Duration::from_millis(10));
    let wall = Instant::now();
    sim.run_for(Duration::from_secs(120));
    let took = wall.elapsed();
    drop(timer);
    println!(
        "simulated {:?} in {:?} of real time ({} messages each way)",
        sim.now(),
        took,
        sent.load(Ordering::Relaxed)
    );
    assert!(sim.now() >= Duration::from_secs(60));
    assert_eq!(sent.load(Ordering::Relaxed), 12_000);
    let echoed = client.log.data().len() as u64;
    assert!(
        echoed >= 11_999,
        "echoes arrive within the run: {echoed} of 12000"
    );
}
