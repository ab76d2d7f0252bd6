//! The async API under tokio: an echo server and a client as tokio tasks
//! on a multi-threaded runtime, over TCP on 127.0.0.1. The provider's own
//! loop runs on a thread of its own; tokio only polls the futures.
//!
//! ```text
//! cargo run -p netio-async --example tokio_echo
//! ```

use std::thread;
use std::time::Duration;

use netio_async::AsyncBackend;
use netio_core::mio_loop::MioLoop;
use netio_core::{BackendConfig, ConnectionParams, EndpointAddress, EventLoop, Provider};
use netio_tcp::TcpProvider;

fn main() {
    let lp = MioLoop::new().expect("loop");
    let runner = lp.clone();
    let loop_thread = thread::spawn(move || runner.run(|| {}));

    let server = AsyncBackend::new(|h| TcpProvider::create(&lp, BackendConfig::default(), h))
        .expect("server backend");
    let client = AsyncBackend::new(|h| TcpProvider::create(&lp, BackendConfig::default(), h))
        .expect("client backend");
    let params = ConnectionParams::receive(1024, 16);
    let addr = server
        .listen(EndpointAddress::localhost(0), params.clone())
        .expect("listen");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("tokio runtime");
    let echoed = rt.block_on(async move {
        let echo = tokio::spawn(async move {
            let conn = server.accept().await.expect("accepted");
            let mut n = 0;
            while let Some(m) = conn.recv().await {
                conn.send(&m).await.expect("echo completed");
                n += 1;
            }
            n
        });
        let conn = client.connect(addr, params).await.expect("connected");
        for i in 0..100u32 {
            let msg = format!("ping {i}");
            conn.send(msg.as_bytes()).await.expect("completed");
            let back = tokio::time::timeout(Duration::from_secs(10), conn.recv())
                .await
                .expect("an echo within 10 s")
                .expect("connection open");
            assert_eq!(back, msg.as_bytes());
        }
        conn.close().expect("close");
        echo.await.expect("echo task")
    });
    println!("tokio: {echoed} messages echoed over TCP through netio-async");
    lp.stop();
    let _ = loop_thread.join();
    assert_eq!(echoed, 100);
}
