//! Application logic shared by the example programs, written once against
//! the `netio-core` traits so it runs on every provider.

use std::sync::{Arc, Mutex};

use netio_core::{Backend, Capabilities, CloseReason, EndpointAddress, Handler, SendError};

/// Sends `data` to `remote` by copy when the connection can, otherwise
/// through a pool buffer.
pub fn send<B: Backend + ?Sized>(
    b: &B,
    remote: EndpointAddress,
    data: &[u8],
    key: u64,
) -> Result<(), SendError> {
    match b.send_data_copy(remote, &[data], &[], key) {
        Err(SendError::NotSupported(_)) => {}
        other => return other,
    }
    let Some(mut buf) = b
        .get_buffer(remote)
        .map_err(|e| SendError::Failed(e.into()))?
    else {
        return Err(SendError::NoResources);
    };
    buf.write(data).map_err(|e| SendError::Failed(e.into()))?;
    b.send_buffer(remote, buf)
}

/// Echoes every message back to its sender.
#[derive(Debug, Default)]
pub struct EchoServer {
    /// Messages echoed so far.
    pub echoed: u64,
}

impl<B: Backend + ?Sized> Handler<B> for EchoServer {
    fn on_data(&mut self, b: &B, remote: EndpointAddress, data: &[u8]) {
        match send(b, remote, data, self.echoed) {
            Ok(()) => self.echoed += 1,
            Err(e) => eprintln!("echo server: cannot echo to {remote}: {e}"),
        }
    }
}

/// What the echo client saw, shared with the program that runs it.
#[derive(Debug, Default, Clone)]
pub struct EchoReport {
    /// Messages sent.
    pub sent: u64,
    /// Echoes received that matched what was sent, in order.
    pub matched: u64,
    /// Echoes that did not match.
    pub mismatched: u64,
    /// Why the connection closed, once it did.
    pub closed: Option<String>,
    /// Why connecting failed, if it did.
    pub refused: Option<String>,
}

/// Sends `count` numbered messages, one at a time, checks each echo, then
/// closes the connection and calls `done`.
pub struct EchoClient {
    count: u64,
    report: Arc<Mutex<EchoReport>>,
    done: Box<dyn FnMut() + Send>,
}

impl EchoClient {
    /// A client that sends `count` messages and calls `done` at the end.
    pub fn new(
        count: u64,
        report: Arc<Mutex<EchoReport>>,
        done: impl FnMut() + Send + 'static,
    ) -> Self {
        Self {
            count,
            report,
            done: Box::new(done),
        }
    }

    fn message(i: u64) -> Vec<u8> {
        format!("message {i}").into_bytes()
    }

    fn next<B: Backend + ?Sized>(&mut self, b: &B, remote: EndpointAddress) {
        let mut r = self.report.lock().unwrap();
        if r.sent == self.count {
            drop(r);
            if let Err(e) = b.close_active_endpoint(remote) {
                eprintln!("echo client: close failed: {e}");
            }
            return;
        }
        match send(b, remote, &Self::message(r.sent), r.sent) {
            Ok(()) => r.sent += 1,
            Err(e) => {
                eprintln!("echo client: send failed: {e}");
                let _ = b.close_active_endpoint(remote);
            }
        }
    }
}

impl<B: Backend + ?Sized> Handler<B> for EchoClient {
    fn on_connection_established(&mut self, b: &B, remote: EndpointAddress, _: Capabilities) {
        self.next(b, remote);
    }

    fn on_connection_refused(
        &mut self,
        _: &B,
        _: EndpointAddress,
        reason: &netio_core::RefuseReason,
    ) {
        self.report.lock().unwrap().refused = Some(reason.to_string());
        (self.done)();
    }

    fn on_data(&mut self, b: &B, remote: EndpointAddress, data: &[u8]) {
        {
            let mut r = self.report.lock().unwrap();
            let expected = Self::message(r.matched + r.mismatched);
            if data == expected.as_slice() {
                r.matched += 1;
            } else {
                r.mismatched += 1;
            }
        }
        self.next(b, remote);
    }

    fn on_connection_closed(&mut self, _: &B, _: EndpointAddress, why: &CloseReason, _: &[u64]) {
        self.report.lock().unwrap().closed = Some(why.to_string());
        (self.done)();
    }
}
