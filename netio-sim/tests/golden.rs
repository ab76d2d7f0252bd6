//! The traces of fixed scenarios, pinned by their fingerprints: a change
//! of the simulator's data structures or speed must not change what a
//! seed does. A change of the model (a new delay, another order of events)
//! changes them on purpose: the new fingerprints are then recorded here,
//! with the reason in the commit.

mod common;

use std::time::Duration;

use common::{connect, full_params, listen, node, rdma, send_buffered, Event, React};
use netio_core::{Backend, BackendConfig};
use netio_sim::{LinkConfig, NicConfig, Sim, SimBackend};

/// A server that echoes every message.
fn echo() -> Option<React<SimBackend>> {
    Some(Box::new(|b: &SimBackend, e: &Event| {
        if let Event::Data { conn, data } = e {
            let _ = b.send_data_copy(*conn, &[data], &[], data.len() as u64);
        }
    }))
}

/// FNV-1a of the trace: a fingerprint that is the same on every machine.
fn fingerprint(trace: &str) -> u64 {
    trace.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Three clients talk to an echo server with buffered and copy sends, over
/// links with latency, jitter and bandwidth and network cards of their
/// own; one client is partitioned away and healed, another is reset
/// mid-stream, the server pauses its receiving from one client for a
/// while and is a slow receiver for a while.
fn scenario(seed: u64, config: BackendConfig, driver_only: bool) -> String {
    let sim = Sim::with_seed(seed);
    sim.set_driver_only(driver_only);
    sim.enable_trace(true);
    let server = node(&sim, config.clone(), echo());
    let addr = listen(&server, full_params(256, 8));
    let clients: Vec<_> = (0..3).map(|_| node(&sim, config.clone(), None)).collect();
    for (i, c) in clients.iter().enumerate() {
        sim.set_link(
            c.host.ip(),
            server.host.ip(),
            LinkConfig {
                latency: Duration::from_micros(2 + i as u64),
                bandwidth_bytes_per_sec: 1_000_000_000 * (i as u64 + 1),
                jitter: Duration::from_nanos(300 * i as u64),
            },
        );
    }
    sim.set_nic(server.host.ip(), NicConfig::symmetric(2_000_000_000));
    let conns: Vec<_> = clients
        .iter()
        .map(|c| connect(&sim, &server, c, addr, full_params(256, 8)))
        .collect();
    for round in 0..40u32 {
        for (i, (c, &(conn, _))) in clients.iter().zip(&conns).enumerate() {
            let msg = vec![i as u8; 10 + (round as usize * 7 + i * 13) % 200];
            if round % 2 == 0 {
                send_buffered(&c.b, conn, &msg, 1000 + u64::from(round));
            } else {
                for k in 0..3u32 {
                    let _ = c.b.send_data_copy(
                        conn,
                        &[&msg],
                        &round.to_le_bytes(),
                        u64::from(round * 4 + k),
                    );
                }
            }
        }
        match round {
            5 => sim.partition(clients[1].host.ip(), server.host.ip()),
            8 => server.b.pause_receive(conns[0].1).unwrap(),
            11 => server.b.resume_receive(conns[0].1).unwrap(),
            12 => sim.heal(clients[1].host.ip(), server.host.ip()),
            15 => sim.reset_connections(clients[2].host.ip(), server.host.ip()),
            20 => sim.slow_receiver(server.host.ip(), Duration::from_micros(3)),
            30 => sim.slow_receiver(server.host.ip(), Duration::ZERO),
            _ => {}
        }
        sim.run_for(Duration::from_micros(7));
    }
    sim.run_until_idle(100_000);
    sim.trace()
}

/// The fingerprints of seeds 1 to 4 under the TCP profile, then under the
/// RDMA profile. (TCP seed 2 changed when the sends a delivery lets into
/// the window came to be reported in that delivery's step, not by an event
/// of their own at the same instant: one `completed` line moved up among
/// the lines of that instant.)
const FINGERPRINTS: [[u64; 4]; 2] = [
    [
        1449902775642032341,
        12743119930122064456,
        18308832118406893394,
        4577201829548359168,
    ],
    [
        11494963427530890891,
        3909502325127950960,
        931283699247935943,
        6250696386335660968,
    ],
];

#[test]
fn fixed_scenarios_give_the_recorded_traces() {
    recorded_traces(false);
}

/// A driver-only world (the echo server's sends made from its callbacks
/// with the world lent to them) runs the very same traces.
#[test]
fn fixed_scenarios_give_the_recorded_traces_in_a_driver_only_world() {
    recorded_traces(true);
}

fn recorded_traces(driver_only: bool) {
    let mut got = [[0u64; 4]; 2];
    for (p, config) in [BackendConfig::default(), rdma()].into_iter().enumerate() {
        for seed in 1..=4u64 {
            let trace = scenario(seed, config.clone(), driver_only);
            for word in [
                "data",
                "completed",
                "closed",
                "partition",
                "heal",
                "slow",
                "pause",
            ] {
                assert!(trace.contains(word), "the trace lacks `{word}`:\n{trace}");
            }
            got[p][seed as usize - 1] = fingerprint(&trace);
        }
    }
    assert_eq!(
        got, FINGERPRINTS,
        "the traces changed (recorded fingerprints on the right, new ones on the left)"
    );
}
