//! The provider's server in a process of its own, for `--fi-baseline`:
//! `fi_pingpong` runs its server and client as two processes, so netio's
//! side of the comparison does too. The child is this program with
//! `--listen 127.0.0.1:0` and the run's provider, fabric, loop and
//! receive-buffer settings; its first output line names the address it
//! listens on. The child is stopped when the value is dropped, and bounded
//! by `--serve-for` should this process die without dropping it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use netio::EndpointAddress;

/// A running `netio-perf --listen` child.
pub struct ServerProc {
    child: Child,
    addr: EndpointAddress,
}

/// What the child serves.
pub struct ServerArgs<'a> {
    /// `--provider`.
    pub provider: &'a str,
    /// The largest message (`--sizes`).
    pub max_size: usize,
    /// `--recv-buffers`.
    pub recv_buffers: usize,
    /// `--busy-poll`.
    pub busy_poll: bool,
    /// `--thread-unsafe`.
    pub thread_unsafe: bool,
    /// The child stops serving after this long (`--serve-for`).
    pub serve_for: Duration,
    /// How long to wait for it to listen.
    pub start_timeout: Duration,
}

impl ServerProc {
    /// Starts the child and waits until it listens. The fabric provider
    /// and domain reach it through the environment it inherits
    /// (`NETIO_LIBFABRIC_PROVIDER`, set from `--fabric`).
    pub fn start(a: &ServerArgs<'_>) -> Result<Self, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find this program to start its server: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.args(["--listen", "127.0.0.1:0", "--provider", a.provider])
            .args(["--sizes", &a.max_size.to_string()])
            .args(["--recv-buffers", &a.recv_buffers.to_string()])
            .args(["--serve-for", &format!("{}", a.serve_for.as_secs_f64())]);
        if a.busy_poll {
            cmd.arg("--busy-poll");
        }
        if a.thread_unsafe {
            cmd.arg("--thread-unsafe");
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the server process: {e}"))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut out = BufReader::new(stdout);
            let mut first = String::new();
            let _ = out.read_line(&mut first);
            let _ = tx.send(first);
            // Keep reading: a closed pipe would make the child's next
            // line of output fail (and `println!` panic).
            let _ = std::io::copy(&mut out, &mut std::io::sink());
        });
        let err_text = thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stderr), &mut text);
            text
        });
        let fail = |mut child: Child, what: String| -> String {
            let _ = child.kill();
            let _ = child.wait();
            let text = err_text.join().unwrap_or_default();
            let last: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = last[last.len().saturating_sub(6)..].join(" | ");
            if tail.is_empty() {
                what
            } else {
                format!("{what}; its error output: {tail}")
            }
        };
        let line = match rx.recv_timeout(a.start_timeout) {
            Ok(l) => l,
            Err(_) => {
                return Err(fail(
                    child,
                    format!(
                        "the server process did not listen within {:?}",
                        a.start_timeout
                    ),
                ))
            }
        };
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .and_then(|w| w.parse::<std::net::SocketAddr>().ok());
        match addr {
            Some(addr) => Ok(Self {
                child,
                addr: addr.into(),
            }),
            None => Err(fail(
                child,
                format!(
                    "the server process did not say where it listens (its output: {:?})",
                    line.trim_end()
                ),
            )),
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> EndpointAddress {
        self.addr
    }
}

impl Drop for ServerProc {
    /// Stops the child with SIGTERM (then SIGKILL): killed outright, it
    /// would leave its `shm` endpoint's file in `/dev/shm`.
    fn drop(&mut self) {
        crate::stop::stop(&mut self.child, crate::stop::GRACE);
    }
}
