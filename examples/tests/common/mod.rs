//! Running the example programs from tests: each is bounded by a deadline
//! after which it is killed, and its output is read by threads (a full
//! pipe never stalls it).

// Each test binary uses part of this module.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// How long a program may run.
pub const LIMIT: Duration = Duration::from_secs(30);

/// A spawned program whose stdout lines and stderr are read by threads;
/// killed when dropped unless it was waited for.
pub struct Proc {
    name: &'static str,
    child: Child,
    deadline: Instant,
    lines: Receiver<String>,
    stderr: Receiver<String>,
    stdout_seen: Vec<String>,
}

impl Proc {
    pub fn spawn(name: &'static str, exe: &str, args: &[&str]) -> Self {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {exe}: {e}"));
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let (etx, stderr) = mpsc::channel();
        let mut err = child.stderr.take().unwrap();
        thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            let _ = etx.send(s);
        });
        Self {
            name,
            child,
            deadline: Instant::now() + LIMIT,
            lines,
            stderr,
            stdout_seen: Vec::new(),
        }
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    pub fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let err = self.stderr.recv_timeout(Duration::from_secs(5));
        panic!(
            "{}: {what}\nstdout so far: {:#?}\nstderr: {err:?}",
            self.name, self.stdout_seen
        );
    }

    /// The next line of stdout, before the deadline.
    pub fn next_line(&mut self) -> String {
        match self.lines.recv_timeout(self.left()) {
            Ok(l) => {
                self.stdout_seen.push(l.clone());
                l
            }
            Err(RecvTimeoutError::Timeout) => self.fail("no output before the deadline"),
            Err(RecvTimeoutError::Disconnected) => self.fail("stdout closed early"),
        }
    }

    /// Reads stdout to its end (the program exits) and waits for the exit
    /// status; kills the program if it is not done by the deadline.
    pub fn finish(mut self) -> (ExitStatus, Vec<String>, String) {
        loop {
            match self.lines.recv_timeout(self.left()) {
                Ok(l) => self.stdout_seen.push(l),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => self.fail("did not finish before the deadline"),
            }
        }
        let stderr = match self.stderr.recv_timeout(self.left()) {
            Ok(s) => s,
            Err(_) => self.fail("stderr not closed before the deadline"),
        };
        // stdout and stderr are closed: the program is exiting.
        let status = self.child.wait().unwrap();
        (status, std::mem::take(&mut self.stdout_seen), stderr)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a program to its end and checks that it succeeded.
pub fn run_ok(name: &'static str, exe: &str, args: &[&str]) -> Vec<String> {
    let (status, out, err) = Proc::spawn(name, exe, args).finish();
    assert!(
        status.success(),
        "{name}: {status}\nstdout: {out:#?}\nstderr: {err}"
    );
    out
}

/// The line of `out` that contains `pat`.
pub fn line_with<'a>(out: &'a [String], pat: &str) -> &'a str {
    out.iter()
        .find(|l| l.contains(pat))
        .unwrap_or_else(|| panic!("no line with `{pat}` in {out:#?}"))
}
