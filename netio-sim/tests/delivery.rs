//! The link model shapes delivery times, and finite receive buffers push
//! back on senders instead of queueing without bound.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect, listen, node, rdma, run_until, Event, React};
use netio_core::{Backend, BackendConfig, ConnectionParams, EventLoop, SendError, Timer};
use netio_sim::{LinkConfig, Sim, SimBackend};

/// Records the virtual time of every event.
fn timed(times: &Arc<Mutex<Vec<(Duration, Event)>>>) -> Option<React<SimBackend>> {
    let t = times.clone();
    Some(Box::new(move |b: &SimBackend, e: &Event| {
        t.lock().unwrap().push((b.sim().now(), e.clone()));
    }))
}

#[test]
fn latency_and_bandwidth_shape_delivery_time() {
    let sim = Sim::with_seed(21);
    let (st, ct) = (Arc::default(), Arc::default());
    let server = node(&sim, rdma(), timed(&st));
    let client = node(&sim, rdma(), timed(&ct));
    let ms = Duration::from_millis(1);
    // 1 ms one way, 1 MB/s: a 1000-byte message occupies the link for 1 ms.
    sim.set_link(
        client.host.ip(),
        server.host.ip(),
        LinkConfig::new(ms, 1_000_000),
    );
    assert_eq!(
        sim.link(server.host.ip(), client.host.ip()).latency,
        ms,
        "both directions"
    );
    let addr = listen(&server, ConnectionParams::receive(2000, 4));
    let t0 = sim.now();
    let (conn, acc) = connect(&sim, &server, &client, addr, ConnectionParams::default());
    // Three-way handshake: the client is established after a round trip,
    // the server one latency later.
    assert_eq!(ct.lock().unwrap()[0].0 - t0, 2 * ms);
    assert_eq!(st.lock().unwrap()[0].0 - t0, 3 * ms);

    let sent_at = sim.now();
    for k in 0..2u64 {
        client
            .b
            .send_data_copy(conn, &[&[k as u8; 1000]], &[], k)
            .unwrap();
    }
    let sl = server.log.clone();
    run_until(&sim, "both messages arrive", || {
        sl.data_from(acc).len() == 2
    });
    let arrivals: Vec<Duration> = st
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, e)| matches!(e, Event::Data { .. }))
        .map(|(t, _)| *t - sent_at)
        .collect();
    // Serialisation (1 ms each, one after the other) plus latency (1 ms).
    assert_eq!(arrivals, vec![2 * ms, 3 * ms]);
    // A send completes when the receiver takes the message.
    let completions: Vec<Duration> = ct
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, e)| matches!(e, Event::Completed { .. }))
        .map(|(t, _)| *t - sent_at)
        .collect();
    assert_eq!(completions, arrivals);

    // A default link: 10 µs plus at most 1 µs of jitter, 10 GB/s.
    let other = node(&sim, rdma(), None);
    let addr2 = listen(&server, ConnectionParams::receive(2000, 64));
    let (conn2, acc2) = connect(&sim, &server, &other, addr2, ConnectionParams::default());
    let before = st.lock().unwrap().len();
    let sent_at = sim.now();
    for k in 0..50u64 {
        other
            .b
            .send_data_copy(conn2, &[&[0; 1000]], &[], k)
            .unwrap();
    }
    run_until(&sim, "the burst arrives", || sl.data_from(acc2).len() == 50);
    let times: Vec<Duration> = st.lock().unwrap()[before..]
        .iter()
        .filter(|(_, e)| matches!(e, Event::Data { .. }))
        .map(|(t, _)| *t - sent_at)
        .collect();
    let tx = Duration::from_nanos(100); // 1000 bytes at 10 GB/s
    for (i, t) in times.iter().enumerate() {
        let earliest = tx * (i as u32 + 1) + Duration::from_micros(10);
        assert!(
            *t >= earliest && *t <= earliest + Duration::from_micros(1),
            "message {i} arrived after {t:?}, expected {earliest:?} + jitter"
        );
    }
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "in order");
}

#[test]
fn backpressure_never_grows_queue_unboundedly() {
    const DEPTH: usize = 8;
    const BUFS: usize = 4;
    let sim = Sim::with_seed(22);
    let server = node(&sim, rdma(), None);
    let client = node(
        &sim,
        BackendConfig {
            send_queue_depth: DEPTH,
            ..rdma()
        },
        None,
    );
    let addr = listen(&server, ConnectionParams::receive(64, 2));
    let (conn, acc) = connect(
        &sim,
        &server,
        &client,
        addr,
        ConnectionParams::buffered(64, BUFS),
    );
    sim.slow_receiver(server.host.ip(), Duration::from_millis(5));
    let recv_bytes = server.b.memory_usage().receive_bytes;

    // A producer that tries 100 copy and 100 buffered sends every
    // millisecond, far more than a receiver holding each of its two buffers
    // for 5 ms can take.
    let accepted = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let max_in_flight = Arc::new(AtomicUsize::new(0));
    let (b, acc_n, ref_n, max_n, log) = (
        client.b.clone(),
        accepted.clone(),
        refused.clone(),
        max_in_flight.clone(),
        client.log.clone(),
    );
    let timer = client.host.event_loop().timer(move || {
        for k in 0..100 {
            match b.send_data_copy(conn, &[b"copy"], &[], k) {
                Ok(()) => acc_n.fetch_add(1, Ordering::Relaxed),
                Err(SendError::NoResources) => ref_n.fetch_add(1, Ordering::Relaxed),
                Err(e) => panic!("{e}"),
            };
            match b.get_buffer(conn).unwrap() {
                Some(mut buf) => {
                    buf.write(b"buffered").unwrap();
                    let key = buf.index();
                    b.send_buffer(conn, buf, key).unwrap();
                    acc_n.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    ref_n.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let in_flight = acc_n.load(Ordering::Relaxed) - log.completed_to(conn).len();
        max_n.fetch_max(in_flight, Ordering::Relaxed);
    });
    timer.start(Duration::from_millis(1));
    sim.run_for(Duration::from_secs(10));
    drop(timer);

    let max = max_in_flight.load(Ordering::Relaxed);
    println!(
        "accepted {}, refused {}, most in flight {max}",
        accepted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed)
    );
    assert!(
        max <= DEPTH + BUFS,
        "in flight {max} exceeds send_queue_depth {DEPTH} + {BUFS} buffers"
    );
    assert!(max >= DEPTH, "the queue did fill up");
    assert!(refused.load(Ordering::Relaxed) > 1_000_000 - 10_000);
    assert_eq!(
        server.b.memory_usage().receive_bytes,
        recv_bytes,
        "receive memory stays at its pool"
    );
    // Two buffers, 5 ms each: 400 messages per second get through.
    let delivered = server.log.data_from(acc).len();
    assert!(
        (3_900..=4_100).contains(&delivered),
        "{delivered} delivered in 10 s"
    );
    // Without the slow receiver, what is in flight drains and nothing is
    // lost.
    sim.slow_receiver(server.host.ip(), Duration::ZERO);
    sim.run_until_idle(100_000);
    assert_eq!(
        client.log.completed_to(conn).len(),
        accepted.load(Ordering::Relaxed)
    );
    assert_eq!(
        server.log.data_from(acc).len(),
        accepted.load(Ordering::Relaxed)
    );
}
