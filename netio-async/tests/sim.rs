//! The async API on the simulator, driven deterministically: a
//! single-threaded executor runs until every task waits, then virtual time
//! moves on a little, until the scenario is done.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use futures::future::join_all;
use futures::StreamExt;
use netio_async::{ConnectError, SendFailed, HIGH_WATER};
use netio_core::{
    BackendConfig, CloseReason, ConnectionParams, EndpointAddress, NetworkMode, RefuseReason,
};

mod common;
use common::World;

/// Virtual time between two rounds of the executor.
const STEP: Duration = Duration::from_micros(100);

fn msg(i: usize) -> Vec<u8> {
    format!("message {i:04}").into_bytes()
}

fn rdma() -> BackendConfig {
    BackendConfig {
        mode: NetworkMode::Rdma,
        ..BackendConfig::default()
    }
}

#[test]
fn connect_send_and_receive_in_order_with_each_send_resolved_on_completion() {
    let mut w = World::new(1, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) =
        w.pair(BackendConfig::default(), BackendConfig::default(), &params);
    let got = Rc::new(RefCell::new(Vec::new()));
    let sent = Rc::new(RefCell::new(0usize));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.expect("a connection");
        let mut msgs = conn.messages();
        while let Some(m) = msgs.next().await {
            g.borrow_mut().push(m);
        }
    });
    let (s, c2) = (sent.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.expect("connected");
        for i in 0..100 {
            conn.send(&msg(i)).await.expect("completed");
            *s.borrow_mut() += 1;
        }
    });
    assert!(w.run_until(|| got.borrow().len() == 100 && *sent.borrow() == 100));
    assert_eq!(*got.borrow(), (0..100).map(msg).collect::<Vec<_>>());
}

#[test]
fn sends_wait_for_room_instead_of_failing_when_the_queue_is_full() {
    let mut w = World::new(2, STEP);
    let params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(
        rdma(),
        BackendConfig {
            send_queue_depth: 2,
            ..rdma()
        },
        &params,
    );
    let got = Rc::new(RefCell::new(Vec::new()));
    let results = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let (r, c2) = (results.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        let all: Vec<Vec<u8>> = (0..50).map(msg).collect();
        // Fifty sends at once on a queue of two.
        let outcomes = join_all(all.iter().map(|m| conn.send(m))).await;
        r.borrow_mut()
            .extend(outcomes.into_iter().map(|o| o.is_ok()));
    });
    assert!(w.run_until(|| results.borrow().len() == 50 && got.borrow().len() == 50));
    assert!(
        results.borrow().iter().all(|ok| *ok),
        "no send fails for a full queue"
    );
    // join_all polls its futures in order first: they arrive in that order.
    assert_eq!(
        *got.borrow(),
        (0..50).map(msg).collect::<Vec<_>>(),
        "each once, in order"
    );
}

#[test]
fn a_reader_that_falls_behind_pauses_its_peer_and_loses_nothing() {
    let mut w = World::new(3, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let n = HIGH_WATER * 4;
    let completed = Rc::new(RefCell::new(0usize));
    let (c, c2) = (completed.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        let all: Vec<Vec<u8>> = (0..n).map(msg).collect();
        for o in join_all(all.iter().map(|m| async {
            let r = conn.send(m).await;
            *c.borrow_mut() += 1;
            r
        }))
        .await
        {
            o.expect("completed");
        }
    });
    // The server accepts but does not read yet.
    let accepted = Rc::new(RefCell::new(None));
    let (a, s2) = (accepted.clone(), server.clone());
    w.spawn(async move {
        *a.borrow_mut() = s2.accept().await;
    });
    assert!(w.run_until(|| accepted.borrow().is_some()));
    w.sim.run_for(Duration::from_millis(50));
    w.pool.run_until_stalled();
    let stuck = *completed.borrow();
    assert!(
        stuck < n,
        "an unread connection is paused: {stuck} of {n} sends completed (RDMA: on delivery)"
    );
    assert!(stuck >= HIGH_WATER, "the first {HIGH_WATER} were taken in");
    // Now read everything.
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    let conn = accepted.borrow_mut().take().unwrap();
    w.spawn(async move {
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
            if g.borrow().len() == n {
                break;
            }
        }
    });
    assert!(w.run_until(|| got.borrow().len() == n && *completed.borrow() == n));
    assert_eq!(*got.borrow(), (0..n).map(msg).collect::<Vec<_>>());
}

#[test]
fn a_close_fails_the_sends_in_flight_with_its_reason_and_ends_the_peers_stream() {
    let mut w = World::new(4, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let n = HIGH_WATER * 3;
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    let conn_slot = Rc::new(RefCell::new(None));
    let (o, cs, c2) = (outcomes.clone(), conn_slot.clone(), client.clone());
    w.spawn(async move {
        let conn = Rc::new(c2.connect(addr, params).await.unwrap());
        *cs.borrow_mut() = Some(conn.clone());
        let all: Vec<Vec<u8>> = (0..n).map(msg).collect();
        let r = join_all(all.iter().map(|m| conn.send(m))).await;
        *o.borrow_mut() = r;
    });
    // The server does not read: the peer pauses with sends in flight.
    let accepted = Rc::new(RefCell::new(None));
    let (a, s2) = (accepted.clone(), server.clone());
    w.spawn(async move {
        *a.borrow_mut() = s2.accept().await;
    });
    assert!(w.run_until(|| accepted.borrow().is_some() && conn_slot.borrow().is_some()));
    w.sim.run_for(Duration::from_millis(20));
    w.pool.run_until_stalled();
    conn_slot.borrow().as_ref().unwrap().close().unwrap();
    assert!(w.run_until(|| outcomes.borrow().len() == n));
    let ok = outcomes.borrow().iter().filter(|r| r.is_ok()).count();
    let cancelled = outcomes
        .borrow()
        .iter()
        .filter(|r| matches!(r, Err(SendFailed::Cancelled(CloseReason::Local))))
        .count();
    assert_eq!(
        ok + cancelled,
        n,
        "every send completed or cancelled by the close"
    );
    assert!(
        cancelled > 0 && ok > 0,
        "{ok} completed, {cancelled} cancelled"
    );
    // The server reads what arrived before the close, then its stream ends.
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    let conn = accepted.borrow_mut().take().unwrap();
    w.spawn(async move {
        let all: Vec<Vec<u8>> = conn.messages().collect().await;
        *g.borrow_mut() = Some((all, conn.close_reason()));
    });
    assert!(w.run_until(|| got.borrow().is_some()));
    let (all, reason) = got.borrow_mut().take().unwrap();
    assert_eq!(
        all,
        (0..ok).map(msg).collect::<Vec<_>>(),
        "what completed, in order"
    );
    assert_eq!(reason, Some(CloseReason::PeerClosed));
}

#[test]
fn connecting_where_nothing_listens_fails_with_refused() {
    let mut w = World::new(5, STEP);
    let (_server, sip) = w.node(BackendConfig::default());
    let (client, _) = w.node(BackendConfig::default());
    let result = Rc::new(RefCell::new(None));
    let (r, c2) = (result.clone(), client.clone());
    w.spawn(async move {
        let e = c2
            .connect(
                EndpointAddress::new(sip, 4242),
                ConnectionParams::receive(64, 4),
            )
            .await
            .expect_err("nothing listens");
        *r.borrow_mut() = Some(e);
    });
    assert!(w.run_until(|| result.borrow().is_some()));
    assert!(
        matches!(
            result.borrow().as_ref(),
            Some(ConnectError::Refused(RefuseReason::Refused))
        ),
        "{:?}",
        result.borrow()
    );
}

/// An echo scenario: a client sends 30 messages, the server echoes each.
fn echo_trace(seed: u64) -> (String, Vec<Vec<u8>>) {
    let mut w = World::new(seed, STEP);
    w.sim.enable_trace(true);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) =
        w.pair(BackendConfig::default(), BackendConfig::default(), &params);
    let s2 = server.clone();
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            conn.send(&m).await.unwrap();
        }
    });
    let echoed = Rc::new(RefCell::new(Vec::new()));
    let (e, c2) = (echoed.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        for i in 0..30 {
            conn.send(&msg(i)).await.unwrap();
            let m = conn.recv().await.unwrap();
            e.borrow_mut().push(m);
        }
        conn.close().unwrap();
    });
    assert!(w.run_until(|| echoed.borrow().len() == 30));
    w.sim.run_for(Duration::from_millis(10));
    w.pool.run_until_stalled();
    let out = echoed.borrow().clone();
    (w.sim.trace(), out)
}

#[test]
fn an_async_scenario_run_twice_with_one_seed_gives_the_same_trace_byte_for_byte() {
    let (a, echoed) = echo_trace(11);
    let (b, _) = echo_trace(11);
    assert_eq!(echoed, (0..30).map(msg).collect::<Vec<_>>());
    assert!(a.lines().count() > 60, "the trace records the run:\n{a}");
    assert!(a == b, "same seed, same trace");
}

#[test]
fn sleep_follows_the_loops_clock_in_virtual_time() {
    let mut w = World::new(6, STEP);
    let (node, _) = w.node(BackendConfig::default());
    let woke = Rc::new(RefCell::new(Vec::new()));
    for (i, ms) in [30u64, 10, 20].into_iter().enumerate() {
        let (wk, n) = (woke.clone(), node.clone());
        w.spawn(async move {
            let t0 = n.now();
            n.sleep(Duration::from_millis(ms)).await;
            wk.borrow_mut().push((i, n.now() - t0));
        });
    }
    let t0 = w.sim.now();
    assert!(w.run_until(|| woke.borrow().len() == 3));
    let order: Vec<usize> = woke.borrow().iter().map(|(i, _)| *i).collect();
    assert_eq!(order, vec![1, 2, 0], "the shortest sleep ends first");
    for (i, slept) in woke.borrow().iter() {
        let ms = [30u64, 10, 20][*i];
        assert!(
            *slept >= Duration::from_millis(ms) && *slept < Duration::from_millis(ms + 1),
            "sleep {i} of {ms} ms took {slept:?} of virtual time"
        );
    }
    assert!(w.sim.now() - t0 < Duration::from_millis(31));
}

#[test]
fn a_send_made_after_a_close_whose_event_has_not_arrived_fails_with_the_close() {
    // The provider lets go of a connection when `close` is called; the
    // close event reaches the async state later, on the loop. A send made
    // (or woken) in between fails with the close's reason, not with the
    // provider's "unknown connection".
    let mut w = World::new(5, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let conn_slot = Rc::new(RefCell::new(None));
    let (cs, c2) = (conn_slot.clone(), client.clone());
    w.spawn(async move {
        *cs.borrow_mut() = Some(Rc::new(c2.connect(addr, params).await.unwrap()));
    });
    let s2 = server.clone();
    w.spawn(async move {
        let _kept = s2.accept().await;
        std::future::pending::<()>().await;
    });
    assert!(w.run_until(|| conn_slot.borrow().is_some()));
    let conn = conn_slot.borrow_mut().take().unwrap();
    conn.close().unwrap();
    assert_eq!(
        conn.close_reason(),
        None,
        "the close event is still to come"
    );
    let outcome = Rc::new(RefCell::new(None));
    let (o, c) = (outcome.clone(), conn.clone());
    w.spawn(async move {
        *o.borrow_mut() = Some(c.send(b"late").await);
    });
    w.pool.run_until_stalled();
    assert!(w.run_until(|| outcome.borrow().is_some()));
    let got = outcome.borrow_mut().take().unwrap();
    assert!(
        matches!(got, Err(SendFailed::Closed(CloseReason::Local))),
        "{got:?}"
    );
}

#[test]
fn closing_a_connection_the_peer_already_closed_is_not_an_error_and_keeps_the_peers_reason() {
    let mut w = World::new(6, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let slots = Rc::new(RefCell::new((None, None)));
    let (s, c2) = (slots.clone(), client.clone());
    w.spawn(async move {
        s.borrow_mut().0 = Some(c2.connect(addr, params).await.unwrap());
    });
    let (s, s2) = (slots.clone(), server.clone());
    w.spawn(async move {
        s.borrow_mut().1 = s2.accept().await;
    });
    assert!(w.run_until(|| {
        let s = slots.borrow();
        s.0.is_some() && s.1.is_some()
    }));
    let (conn, accepted) = {
        let mut s = slots.borrow_mut();
        (s.0.take().unwrap(), s.1.take().unwrap())
    };
    accepted.close().unwrap();
    assert!(w.run_until(|| conn.close_reason().is_some()));
    conn.close().expect("closing a closed connection");
    assert_eq!(conn.close_reason(), Some(CloseReason::PeerClosed));
    accepted.close().expect("a second close");
    assert_eq!(accepted.close_reason(), Some(CloseReason::Local));
}

/// Polls every future of `futs` not yet done, in the order given, once;
/// `done` collects their outputs.
fn poll_each<F: std::future::Future + Unpin>(
    futs: &mut [(usize, F)],
    done: &mut Vec<(usize, F::Output)>,
    cx: &mut std::task::Context<'_>,
) {
    for (i, f) in futs.iter_mut() {
        if done.iter().any(|(j, _)| j == i) {
            continue;
        }
        if let std::task::Poll::Ready(o) = std::pin::Pin::new(f).poll(cx) {
            done.push((*i, o));
        }
    }
}

/// Six sends on a queue of one: polled first in order 0..6, then always in
/// reverse; they still leave, and arrive, in the order 0..6.
#[test]
fn sends_on_one_connection_leave_in_the_order_their_futures_were_first_polled() {
    let mut w = World::new(6, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(
        rdma(),
        BackendConfig {
            send_queue_depth: 1,
            ..rdma()
        },
        &params,
    );
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let outcomes = Rc::new(RefCell::new(Vec::new()));
    let (o, c2) = (outcomes.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        let all: Vec<Vec<u8>> = (0..6).map(msg).collect();
        let mut futs: Vec<(usize, _)> = all
            .iter()
            .enumerate()
            .map(|(i, m)| (i, Box::pin(conn.send(m))))
            .collect();
        let mut done = Vec::new();
        futures::future::poll_fn(|cx| {
            poll_each(&mut futs, &mut done, cx);
            std::task::Poll::Ready(())
        })
        .await;
        futs.reverse();
        futures::future::poll_fn(|cx| {
            poll_each(&mut futs, &mut done, cx);
            if done.len() == 6 {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await;
        o.borrow_mut()
            .extend(done.into_iter().map(|(i, r)| (i, r.is_ok())));
    });
    assert!(w.run_until(|| outcomes.borrow().len() == 6 && got.borrow().len() == 6));
    assert!(outcomes.borrow().iter().all(|(_, ok)| *ok));
    assert_eq!(
        *got.borrow(),
        (0..6).map(msg).collect::<Vec<_>>(),
        "in the order first polled"
    );
}

/// A connection's own high-water mark: with 4, an unread connection
/// pauses its peer long before the default of 64 messages.
#[test]
fn a_connections_own_high_water_mark_pauses_its_peer_at_that_many_unread() {
    let mut w = World::new(7, STEP);
    let params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let n = 200;
    let completed = Rc::new(RefCell::new(0usize));
    let accepted = Rc::new(RefCell::new(None));
    let (a, s2) = (accepted.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        conn.set_high_water(4).unwrap();
        *a.borrow_mut() = Some(conn);
    });
    let (c, c2) = (completed.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        // The server sets its mark meanwhile.
        c2.sleep(Duration::from_millis(5)).await;
        let all: Vec<Vec<u8>> = (0..n).map(msg).collect();
        for o in join_all(all.iter().map(|m| async {
            let r = conn.send(m).await;
            *c.borrow_mut() += 1;
            r
        }))
        .await
        {
            o.expect("completed");
        }
    });
    assert!(w.run_until(|| accepted.borrow().is_some()));
    w.run_for(Duration::from_millis(50));
    let stuck = *completed.borrow();
    assert!(
        (4..HIGH_WATER).contains(&stuck),
        "paused at 4 unread (plus the 4 receive buffers): {stuck} of {n} sends completed"
    );
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    let conn = accepted.borrow_mut().take().unwrap();
    w.spawn(async move {
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
            if g.borrow().len() == n {
                break;
            }
        }
    });
    assert!(w.run_until(|| got.borrow().len() == n && *completed.borrow() == n));
    assert_eq!(*got.borrow(), (0..n).map(msg).collect::<Vec<_>>());
}

/// `pause` holds the peer even with nothing unread (reading does not
/// resume it); `resume` lets everything through, in order.
#[test]
fn an_explicit_pause_holds_the_peer_until_resume_even_with_nothing_unread() {
    let mut w = World::new(8, STEP);
    let params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let n = 100;
    let accepted = Rc::new(RefCell::new(None));
    let (a, s2) = (accepted.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        conn.pause().unwrap();
        *a.borrow_mut() = Some(Rc::new(conn));
    });
    let completed = Rc::new(RefCell::new(0usize));
    let (c, c2) = (completed.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        // The server pauses meanwhile.
        c2.sleep(Duration::from_millis(5)).await;
        let all: Vec<Vec<u8>> = (0..n).map(msg).collect();
        for o in join_all(all.iter().map(|m| async {
            let r = conn.send(m).await;
            *c.borrow_mut() += 1;
            r
        }))
        .await
        {
            o.expect("completed");
        }
    });
    assert!(w.run_until(|| accepted.borrow().is_some()));
    let conn = accepted.borrow().clone().unwrap();
    // A reader that takes whatever comes.
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, rc) = (got.clone(), conn.clone());
    w.spawn(async move {
        while let Some(m) = rc.recv().await {
            g.borrow_mut().push(m);
        }
    });
    w.run_for(Duration::from_millis(50));
    let (stuck, read) = (*completed.borrow(), got.borrow().len());
    assert!(
        stuck < n && read <= stuck,
        "paused by hand: {stuck} of {n} sends completed, {read} read"
    );
    w.run_for(Duration::from_millis(50));
    assert_eq!(
        *completed.borrow(),
        stuck,
        "reading everything did not resume it"
    );
    conn.resume().unwrap();
    assert!(w.run_until(|| got.borrow().len() == n && *completed.borrow() == n));
    assert_eq!(*got.borrow(), (0..n).map(msg).collect::<Vec<_>>());
}

/// `send_parts` sends a header and a gather list as one message.
#[test]
fn send_parts_sends_a_header_and_its_parts_as_one_message() {
    let mut w = World::new(9, STEP);
    let params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let sent = Rc::new(RefCell::new(false));
    let (s, c2) = (sent.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        conn.send_parts(b"hdr:", &[b"one,", b"two,", b"three"])
            .await
            .unwrap();
        conn.send_parts(&[], &[]).await.unwrap();
        *s.borrow_mut() = true;
    });
    assert!(w.run_until(|| *sent.borrow() && got.borrow().len() == 2));
    assert_eq!(
        *got.borrow(),
        vec![b"hdr:one,two,three".to_vec(), Vec::new()]
    );
}

#[test]
fn a_batch_larger_than_the_send_queue_arrives_whole_and_in_order_with_nothing_in_between() {
    let mut w = World::new(12, STEP);
    let params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(
        rdma(),
        BackendConfig {
            send_queue_depth: 4,
            ..rdma()
        },
        &params,
    );
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let done = Rc::new(RefCell::new(Vec::new()));
    let (d, c2) = (done.clone(), client.clone());
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        let batch: Vec<Vec<u8>> = (0..100).map(msg).collect();
        let refs: Vec<&[u8]> = batch.iter().map(Vec::as_slice).collect();
        let after = msg(100);
        // The batch is polled first, then a single send that must wait
        // behind all of it although room comes and goes meanwhile.
        let (b, s) = futures::future::join(conn.send_batch(&refs), async {
            let r = conn.send(&after).await;
            d.borrow_mut().push("single");
            r
        })
        .await;
        b.expect("the batch completed");
        s.expect("the single send completed");
        let empty: [&[u8]; 0] = [];
        conn.send_batch(&empty).await.expect("an empty batch");
        d.borrow_mut().push("batch");
    });
    assert!(w.run_until(|| done.borrow().len() == 2 && got.borrow().len() == 101));
    assert_eq!(
        *got.borrow(),
        (0..101).map(msg).collect::<Vec<_>>(),
        "every message once, in order, the single send after the batch"
    );
}

#[test]
fn recv_into_reads_each_message_into_one_buffer_and_ends_with_the_connection() {
    let mut w = World::new(14, STEP);
    let params = ConnectionParams::receive(64, 8);
    let (server, client, addr) = w.pair(rdma(), rdma(), &params);
    let got = Rc::new(RefCell::new(Vec::new()));
    let ended = Rc::new(RefCell::new(false));
    let (g, e, s2) = (got.clone(), ended.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        let mut buf = Vec::new();
        while conn.recv_into(&mut buf).await {
            g.borrow_mut().push(buf.clone());
        }
        *e.borrow_mut() = true;
    });
    let c2 = client.clone();
    let sizes = [5usize, 0, 64, 1, 17];
    w.spawn(async move {
        let conn = c2.connect(addr, params).await.unwrap();
        for (i, n) in sizes.iter().enumerate() {
            conn.send(&vec![i as u8; *n]).await.unwrap();
        }
        conn.close().unwrap();
    });
    assert!(w.run_until(|| *ended.borrow()));
    let want: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, n)| vec![i as u8; *n])
        .collect();
    assert_eq!(*got.borrow(), want);
}

#[test]
fn send_region_sends_a_header_and_region_slices_as_one_message_without_a_copy() {
    use netio_core::MemoryRegion;
    let mut w = World::new(13, STEP);
    let region = MemoryRegion::new(64);
    region.write(0, b"zero-copy:alpha,beta").unwrap();
    let server_params = ConnectionParams::receive(64, 4);
    let (server, client, addr) = w.pair(rdma(), rdma(), &server_params);
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let outcome = Rc::new(RefCell::new(Vec::new()));
    let (o, c2, r) = (outcome.clone(), client.clone(), region.clone());
    w.spawn(async move {
        let with_region = ConnectionParams::receive(64, 4).with_zero_copy(r.clone());
        let conn = c2.connect(addr, with_region).await.unwrap();
        let slices = [r.slice(10, 6).unwrap(), r.slice(16, 4).unwrap()];
        let first = conn.send_region(b"hdr:", &slices).await;
        o.borrow_mut().push(first);
        // A slice outside the region is refused and nothing is sent.
        let outside = MemoryRegion::new(8).slice(0, 8).unwrap();
        let second = conn.send_region(&[], std::slice::from_ref(&outside)).await;
        o.borrow_mut().push(second);
        // Without a region on the connection, too.
        let plain = c2
            .connect(addr, ConnectionParams::receive(64, 4))
            .await
            .unwrap();
        let third = plain.send_region(&[], &slices[..1]).await;
        o.borrow_mut().push(third);
        conn.send(b"after").await.unwrap();
    });
    assert!(w.run_until(|| got.borrow().len() == 2));
    w.run_for(Duration::from_millis(10));
    assert_eq!(
        *got.borrow(),
        vec![b"hdr:alpha,beta".to_vec(), b"after".to_vec()]
    );
    let outcome = outcome.borrow();
    assert!(
        outcome[0].is_ok(),
        "resolved on completion: {:?}",
        outcome[0]
    );
    assert!(
        matches!(
            outcome[1],
            Err(SendFailed::Refused(netio_core::SendError::OutsideRegion))
        ),
        "{:?}",
        outcome[1]
    );
    assert!(
        matches!(
            outcome[2],
            Err(SendFailed::Refused(netio_core::SendError::NotSupported(_)))
        ),
        "{:?}",
        outcome[2]
    );
}

#[test]
fn feed_resolves_once_the_send_is_made_and_flush_once_every_send_completed() {
    let mut w = World::new(14, STEP);
    let params = ConnectionParams::receive(64, 16);
    let (server, client, addr) = w.pair(
        BackendConfig::default(),
        BackendConfig {
            send_queue_depth: 4,
            ..BackendConfig::default()
        },
        &params,
    );
    let got = Rc::new(RefCell::new(Vec::new()));
    let (g, s2) = (got.clone(), server.clone());
    w.spawn(async move {
        let conn = s2.accept().await.unwrap();
        while let Some(m) = conn.recv().await {
            g.borrow_mut().push(m);
        }
    });
    let conn = Rc::new(RefCell::new(None));
    let (cn, c2) = (conn.clone(), client.clone());
    w.spawn(async move {
        *cn.borrow_mut() = Some(c2.connect(addr, params).await.unwrap());
    });
    assert!(w.run_until(|| conn.borrow().is_some()));
    let conn = Rc::new(conn.borrow_mut().take().unwrap());
    let progress = Rc::new(RefCell::new(Vec::new()));
    let (p, c) = (progress.clone(), conn.clone());
    w.spawn(async move {
        // Three fit the queue: made at once, no completion awaited.
        for i in 0..3 {
            c.feed(&msg(i)).await.unwrap();
        }
        p.borrow_mut().push("fed 3");
        c.flush().await.unwrap();
        p.borrow_mut().push("flushed 3");
        // More than the queue holds: each waits for room in turn.
        for i in 3..100 {
            c.feed(&msg(i)).await.unwrap();
        }
        c.send(&msg(100)).await.unwrap();
        c.flush().await.unwrap();
        p.borrow_mut().push("flushed all");
    });
    w.pool.run_until_stalled();
    assert_eq!(
        *progress.borrow(),
        vec!["fed 3"],
        "fed without virtual time passing; their completions not yet in"
    );
    assert!(w.run_until(|| progress.borrow().len() == 3));
    assert_eq!(*got.borrow(), (0..=100).map(msg).collect::<Vec<_>>());
    // Nothing in flight: flush resolves at once.
    let c = conn.clone();
    let again = Rc::new(RefCell::new(None));
    let a = again.clone();
    w.spawn(async move {
        *a.borrow_mut() = Some(c.flush().await);
    });
    w.pool.run_until_stalled();
    assert!(matches!(*again.borrow(), Some(Ok(()))));
}
