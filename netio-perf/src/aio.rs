//! `--mode async`: the client written with `netio::aio`, the futures API,
//! as a task on its backend's loop thread (`AsyncBackend::spawn`), the way
//! an application that picks async would write it:
//!
//! - ping-pong: `send(&msg).await`, then `recv_into(&mut buf).await`, per
//!   round trip;
//! - one way: `feed(&msg).await` per message (resolved once the provider
//!   took it; the connection's send queue, as deep as the callback
//!   client's window, bounds what is in flight), `flush().await`, then the
//!   end marker and the receiver's report.
//!
//! The server is the callback server of every mode, echoing with copy
//! sends: what differs from `--mode copy` is the client's API alone.

use std::sync::{mpsc, Arc};
use std::time::Instant;

use netio::aio::{AsyncBackend, AsyncHandler};
use netio::{Backend, BackendConfig, ConnectionParams, EndpointAddress};

use crate::proto::{self, Report, Role};
use crate::provider::{ClientResult, Spec};
use crate::stats::RoundTrips;

/// The client's work: connects to `addr`, sends the set-up message, runs
/// the test of `spec` and returns what it measured. `virtual_time`: the
/// backend's clock is the simulator's (ping-pong samples it too).
pub async fn client<B: Backend + Clone + 'static>(
    ab: Arc<AsyncBackend<B>>,
    spec: Spec,
    addr: EndpointAddress,
    params: ConnectionParams,
    virtual_time: bool,
) -> Result<ClientResult, String> {
    let conn = ab
        .connect(addr, params)
        .await
        .map_err(|e| format!("connecting to {addr} failed: {e}"))?;
    let closed = |what: &str| match conn.close_reason() {
        Some(why) => format!("connection closed before the end ({what}): {why}"),
        None => format!("connection closed before the end ({what})"),
    };
    conn.send(&proto::setup(spec.role(), spec.mode, spec.warmup))
        .await
        .map_err(|e| format!("cannot send the set-up message: {e}"))?;
    let mut msg = Vec::new();
    proto::data_message(&mut msg, spec.size);
    let mut buf = Vec::new();
    let result = match spec.role() {
        Role::Echo => {
            let reserve = spec.count.unwrap_or(1 << 16).min(1 << 22) as usize;
            let mut rt = RoundTrips::new(spec.warmup, reserve);
            let mut vsamples = Vec::with_capacity(if virtual_time { reserve } else { 0 });
            let mut i = 0u64;
            loop {
                proto::set_seq(&mut msg, i);
                let vsent_at = virtual_time.then(|| ab.now());
                conn.send(&msg)
                    .await
                    .map_err(|e| format!("send failed: {e}"))?;
                rt.sent(i);
                if !conn.recv_into(&mut buf).await {
                    return Err(closed("waiting for an echo"));
                }
                if !proto::echo_matches(&buf, spec.size, i, true) {
                    return Err(format!("echo {i} does not match what was sent"));
                }
                if let (true, Some(v0)) = (i >= spec.warmup, vsent_at) {
                    vsamples.push((ab.now() - v0).as_nanos() as u64);
                }
                i += 1;
                let measured = i.saturating_sub(spec.warmup);
                let done = match (spec.count, spec.duration) {
                    (Some(n), _) => measured >= n,
                    (None, Some(d)) => measured > 0 && rt.measured() >= d,
                    (None, None) => true,
                };
                if done {
                    let (samples, elapsed) = rt.finish();
                    break ClientResult::PingPong(samples, vsamples, elapsed);
                }
            }
        }
        Role::Sink => {
            let total = spec.count.map(|n| spec.warmup + n);
            let mut deadline: Option<Instant> = None;
            let mut sent = 0u64;
            loop {
                if total.is_some_and(|t| sent >= t) {
                    break;
                }
                if sent == spec.warmup {
                    if let Some(d) = spec.duration {
                        deadline = Some(Instant::now() + d);
                    }
                }
                // The clock is read once per 256 messages.
                if sent % 256 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                conn.feed(&msg)
                    .await
                    .map_err(|e| format!("send failed: {e}"))?;
                sent += 1;
            }
            conn.flush()
                .await
                .map_err(|e| format!("send failed: {e}"))?;
            conn.send(&proto::end())
                .await
                .map_err(|e| format!("cannot send the end marker: {e}"))?;
            if !conn.recv_into(&mut buf).await {
                return Err(closed("waiting for the receiver's report"));
            }
            match Report::decode(&buf) {
                Some(r) => ClientResult::Sink(r),
                None => return Err("unexpected message from the server".into()),
            }
        }
    };
    let _ = conn.close();
    Ok(result)
}

/// Creates the client's async backend with `make` and runs [`client`] as
/// a task on its loop thread; the outcome goes to `done`.
pub fn spawn_client<B, E>(
    make: impl FnOnce(BackendConfig, AsyncHandler) -> Result<B, E>,
    config: BackendConfig,
    spec: &Spec,
    addr: EndpointAddress,
    params: ConnectionParams,
    virtual_time: bool,
    done: mpsc::Sender<Result<ClientResult, String>>,
) -> Result<(Arc<AsyncBackend<B>>, netio::aio::Task<()>), E>
where
    B: Backend + Clone + 'static,
{
    let ab = Arc::new(AsyncBackend::new(|h| make(config, h))?);
    let work = client(Arc::clone(&ab), spec.clone(), addr, params, virtual_time);
    let task = ab.spawn(async move {
        let _ = done.send(work.await);
    });
    Ok((ab, task))
}
