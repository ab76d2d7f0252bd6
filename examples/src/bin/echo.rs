//! An echo server and client on the deterministic simulator: two virtual
//! hosts, one connection, `COUNT` messages echoed one at a time, then the
//! client closes. Runs in virtual time, so it finishes at once; the same
//! seed prints the same result every run.
//!
//! ```text
//! cargo run -p netio-examples --bin echo [COUNT] [SEED]
//! ```

use std::sync::{Arc, Mutex};
use std::time::Instant;

use netio_core::{Backend, BackendConfig, ConnectionParams, EndpointAddress, EventLoop};
use netio_examples::{EchoClient, EchoReport, EchoServer};
use netio_sim::Sim;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1000);
    let sim = match args.next() {
        Some(seed) => Sim::with_seed(seed.parse()?),
        None => Sim::new(),
    };
    let (server_host, client_host) = (sim.next_host(), sim.next_host());

    let server = server_host.backend(BackendConfig::default(), EchoServer::default())?;
    let params = ConnectionParams::receive(1024, 16).with_buffered(1024, 16);
    let listen =
        server.open_listen_endpoint(EndpointAddress::new(server_host.ip(), 0), params.clone())?;
    println!("server {} listening on {listen}", server_host.ip());

    let report = Arc::new(Mutex::new(EchoReport::default()));
    let client_loop = client_host.event_loop().clone();
    let stopper = client_loop.clone();
    let client = client_host.backend(
        BackendConfig::default(),
        EchoClient::new(count, report.clone(), move || stopper.stop()),
    )?;
    client.open_active_endpoint(listen, params)?;

    let started = Instant::now();
    client_loop.run(|| {});
    let r = report.lock().unwrap().clone();
    println!(
        "client {}: sent {}, echoed back intact {}, mismatched {}, closed: {}",
        client_host.ip(),
        r.sent,
        r.matched,
        r.mismatched,
        r.closed.as_deref().or(r.refused.as_deref()).unwrap_or("no"),
    );
    println!(
        "simulated time {:?} in {:?} of real time (seed {:#x})",
        sim.now(),
        started.elapsed(),
        sim.seed()
    );
    if r.matched != count || r.mismatched != 0 {
        return Err(format!("expected {count} intact echoes").into());
    }
    Ok(())
}
