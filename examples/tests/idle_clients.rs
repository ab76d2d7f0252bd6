//! The `echo_tcp` server's memory with 2,000 idle clients: its listener's
//! connections share one receive pool (`tcp::server_params`), so the
//! server stays small however many clients wait. A test binary of its own:
//! it holds thousands of descriptors, and raises its open-file limit by
//! running itself again under `ulimit -n` when the limit is too low.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use netio_core::EndpointAddress;
use netio_tcp::wire::{DataPrefix, Handshake, HANDSHAKE_LEN};

mod common;
use common::Proc;

const ECHO: &str = env!("CARGO_BIN_EXE_echo_tcp");

/// Idle clients.
const CLIENTS: usize = 2000;
/// The server's resident memory must stay below this.
const MAX_RSS_KIB: u64 = 64 * 1024;
/// Descriptors each side needs: the connections, and margin.
const FDS: u64 = CLIENTS as u64 + 512;
/// Set in the copy of this test run under a raised limit.
const RAISED: &str = "NETIO_EXAMPLES_FD_LIMIT_RAISED";

/// A field of `/proc/<pid>/status`, in KiB (`VmRSS`, `VmHWM`).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The soft and hard limits of open files of this process.
fn fd_limits() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc/self/limits");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let mut n = line["Max open files".len()..]
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(u64::MAX));
    (n.next().unwrap_or(0), n.next().unwrap_or(0))
}

/// A client that has sent its handshake.
fn client(addr: EndpointAddress, i: usize) -> TcpStream {
    let end = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match TcpStream::connect_timeout(&addr.socket_addr(), Duration::from_secs(5)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < end => {
                eprintln!("client {i}: {e}, again");
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("client {i}: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&Handshake::new(1 << 16).encode()).unwrap();
    s
}

/// Reads the server's handshake on `s`.
fn handshake(s: &mut TcpStream, i: usize) {
    let mut got = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut got)
        .unwrap_or_else(|e| panic!("client {i}: no handshake: {e}"));
    assert_eq!(got[..4], *b"NTIO", "client {i}");
}

/// Sends message `i` on `s` and reads back the echo.
fn round_trip(s: &mut TcpStream, i: usize) {
    let msg = format!("client {i}");
    let prefix = DataPrefix::new(&[], msg.len()).unwrap();
    let mut frame = prefix.as_bytes().to_vec();
    frame.extend_from_slice(msg.as_bytes());
    s.write_all(&frame).unwrap();
    let mut echo = vec![0u8; frame.len()];
    s.read_exact(&mut echo)
        .unwrap_or_else(|e| panic!("client {i}: no echo: {e}"));
    assert_eq!(echo, frame, "client {i}");
}

#[test]
fn echo_tcp_holds_2000_idle_clients_in_under_64_mib() {
    let (soft, hard) = fd_limits();
    if soft < FDS {
        assert!(
            std::env::var_os(RAISED).is_none(),
            "the limit of open files is still {soft}"
        );
        if hard < FDS {
            eprintln!(
                "SKIPPED: the hard limit of open files ({hard}) is below the {FDS} this test \
                 needs (raise it with `ulimit -Hn`)"
            );
            return;
        }
        // This test again, in a process (and a server) with the limit
        // raised: the standard library cannot raise it in place.
        let exe = std::env::current_exe().unwrap();
        let status = Command::new("sh")
            .args(["-c", &format!("ulimit -n {FDS} && exec \"$0\" \"$@\"")])
            .arg(exe)
            .args([
                "--exact",
                "echo_tcp_holds_2000_idle_clients_in_under_64_mib",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(RAISED, "1")
            .status()
            .unwrap();
        assert!(status.success(), "under `ulimit -n {FDS}`: {status}");
        return;
    }
    let clients = CLIENTS.to_string();
    let mut server = Proc::spawn(
        "echo_tcp",
        ECHO,
        &[
            "--listen",
            "127.0.0.1:0",
            "--clients",
            &clients,
            "--timeout",
            "60",
        ],
    );
    let first = server.next_line();
    let addr: EndpointAddress = first
        .strip_prefix("listening on ")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    let pid = server.id();
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..CLIENTS).map(|i| client(addr, i)).collect();
    for (i, s) in socks.iter_mut().enumerate() {
        handshake(s, i);
    }
    let connected = started.elapsed();
    // The server read each client's handshake right after accepting it
    // (it was waiting in the socket): every client is established, and
    // idle.
    std::thread::sleep(Duration::from_millis(500));
    let rss = status_kib(pid, "VmRSS");
    let peak = status_kib(pid, "VmHWM");
    // The server serves every client.
    for (i, s) in socks.iter_mut().enumerate() {
        round_trip(s, i);
    }
    eprintln!(
        "echo_tcp with {CLIENTS} idle clients (connected in {connected:?}): VmRSS {rss} KiB \
         ({} KiB per client), peak {peak} KiB; after one echo each: VmRSS {} KiB",
        rss / CLIENTS as u64,
        status_kib(pid, "VmRSS")
    );
    assert!(
        rss < MAX_RSS_KIB,
        "echo_tcp holds {rss} KiB with {CLIENTS} idle clients"
    );
    drop(socks);
    let (status, out, err) = server.finish();
    assert!(status.success(), "{status}\n{out:#?}\n{err}");
    let line = common::line_with(&out, "server:");
    assert!(
        line.contains(&format!("{CLIENTS} connection(s), {CLIENTS} closed"))
            && line.contains("failed 0"),
        "{line}"
    );
}
