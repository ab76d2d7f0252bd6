//! Handler timers, wakes, posts and the clock run on virtual time and stay
//! deterministic.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, full_params, listen, node, Event, React};
use netio_core::{Backend, BackendConfig, EventLoop};
use netio_sim::{Sim, SimBackend};

#[test]
fn set_timer_fires_exactly_at_now_plus_delay_in_the_order_set() {
    let sim = Sim::with_seed(51);
    let at = Arc::new(Mutex::new(Vec::new()));
    let a2 = at.clone();
    let react: React<SimBackend> = Box::new(move |b, e| {
        if let Event::Timer(t) = e {
            a2.lock().unwrap().push((*t, b.now()));
        }
    });
    let n = node(&sim, BackendConfig::default(), Some(react));
    sim.run_for(Duration::from_millis(5));
    let t0 = n.b.now();
    assert_eq!(t0, sim.now());
    assert_eq!(n.host.event_loop().now(), t0);
    let ms = Duration::from_millis(1);
    n.b.set_timer(3 * ms, 1);
    n.b.set_timer(ms, 2);
    n.b.set_timer(3 * ms, 3);
    n.b.set_timer(3 * ms, 4);
    n.b.set_timer(Duration::ZERO, 5);
    assert!(n.log.is_empty(), "never from inside the call");
    sim.run_for(Duration::from_secs(1));
    assert_eq!(
        *at.lock().unwrap(),
        vec![
            (5, t0),
            (2, t0 + ms),
            (1, t0 + 3 * ms),
            (3, t0 + 3 * ms),
            (4, t0 + 3 * ms)
        ],
        "once each, exactly on time, equal deadlines in the order set"
    );
}

#[test]
fn wake_runs_once_per_call_from_any_thread_never_inside_the_call() {
    let sim = Sim::with_seed(52);
    let n = node(&sim, BackendConfig::default(), None);
    n.b.wake(1);
    n.b.wake(1);
    assert!(n.log.is_empty());
    let b = n.b.clone();
    std::thread::spawn(move || b.wake(2)).join().unwrap();
    let t = sim.now();
    sim.run_until_idle(100);
    assert_eq!(
        n.log.events(),
        vec![Event::Wake(1), Event::Wake(1), Event::Wake(2)]
    );
    assert_eq!(sim.now(), t, "wakes run at the current virtual time");
}

#[test]
fn post_runs_on_the_loop_at_the_current_time_not_inside_the_call() {
    let sim = Sim::with_seed(53);
    let host = sim.next_host();
    let lp = host.event_loop().clone();
    let ran = Arc::new(Mutex::new(Vec::new()));
    for i in 0..3 {
        let (r, l) = (ran.clone(), lp.clone());
        lp.post(move || r.lock().unwrap().push((i, l.on_loop_thread(), l.now())));
    }
    assert!(ran.lock().unwrap().is_empty());
    let t = sim.now();
    assert_eq!(sim.run_until_idle(100), 3);
    let mut got = ran.lock().unwrap().clone();
    got.sort_by_key(|x| x.0);
    assert_eq!(got, vec![(0, true, t), (1, true, t), (2, true, t)]);
    // A paused loop holds posts back.
    sim.pause_loop(host.ip());
    let r = ran.clone();
    lp.post(move || r.lock().unwrap().push((9, true, Duration::ZERO)));
    sim.run_until_idle(100);
    assert_eq!(ran.lock().unwrap().len(), 3);
    sim.resume_loop(host.ip());
    sim.run_until_idle(100);
    assert_eq!(ran.lock().unwrap().len(), 4);
}

/// A ping-pong driven by handler timers and wakes, traced.
fn timed_scenario(seed: u64) -> String {
    let sim = Sim::with_seed(seed);
    sim.enable_trace(true);
    let server = node(
        &sim,
        BackendConfig::default(),
        Some(Box::new(|b: &SimBackend, e: &Event| match e {
            Event::Data { conn, .. } => {
                b.set_timer(Duration::from_micros(7), conn.to_u64());
            }
            Event::Timer(t) => {
                let _ = b.send_data_copy(netio_core::ConnId::from_u64(*t), &[b"pong"], &[], *t);
                b.wake(*t);
            }
            _ => {}
        })),
    );
    let client = node(&sim, BackendConfig::default(), None);
    let addr = listen(&server, full_params(64, 4));
    let (c, _) = connect(&sim, &server, &client, addr, full_params(64, 4));
    for i in 0..20u64 {
        client.b.send_data_copy(c, &[b"ping"], &[], i).unwrap();
        client.b.set_timer(Duration::from_micros(i % 5), 100 + i);
        client.b.wake(200 + i);
        sim.run_for(Duration::from_micros(3));
    }
    sim.run_until_idle(100_000);
    sim.trace()
}

#[test]
fn traces_with_timers_and_wakes_are_identical_for_one_seed() {
    let a = timed_scenario(7);
    assert!(a.contains("on_timer") && a.contains("on_wake") && a.contains("set_timer"));
    assert_eq!(a, timed_scenario(7));
    assert_ne!(a, timed_scenario(8));
}
