//! Running out of file descriptors, in a test binary of its own: it lowers
//! this process's limit of open files, which would break any test running
//! beside it.

mod common;

use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use common::{raw, wait_until, Ev, Running, Side};
use netio_core::{
    Backend, BackendConfig, ConnectionParams, EndpointAddress, OpenActiveError, OpenListenError,
};
use netio_tcp::wire::{Handshake, HANDSHAKE_LEN};

fn get_nofile() -> libc::rlimit {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives
    // on this stack frame.
    let r = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(r, 0, "getrlimit: {}", std::io::Error::last_os_error());
    lim
}

fn set_nofile(lim: libc::rlimit) {
    // SAFETY: setrlimit only reads the struct it is given.
    let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(r, 0, "setrlimit: {}", std::io::Error::last_os_error());
}

/// The CPU time this process has used (user and system, all threads),
/// from /proc/self/stat, opened once: reading it needs no new descriptor.
struct CpuClock(File);

impl CpuClock {
    fn new() -> Self {
        Self(File::open("/proc/self/stat").unwrap())
    }

    /// In clock ticks of 10 ms (USER_HZ is 100 on Linux).
    fn now(&mut self) -> Duration {
        self.0.seek(SeekFrom::Start(0)).unwrap();
        let mut stat = String::new();
        self.0.read_to_string(&mut stat).unwrap();
        cpu_ticks(&stat)
    }
}

fn cpu_ticks(stat: &str) -> Duration {
    // The fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// One message from `from` to `to` (the name of `to`'s end on `from`).
fn exchange(from: &Side, to: &Side, remote: EndpointAddress, msg: &[u8], key: u64) {
    from.b
        .send_data_copy(from.conn(remote), &[msg], &[], key)
        .unwrap();
    assert!(
        wait_until(|| to.data().iter().any(|d| d == msg)),
        "{:?}",
        to.events()
    );
    assert!(wait_until(|| from.has(|e| *e == Ev::Completed(remote, key))));
}

#[test]
fn running_out_of_file_descriptors_gives_a_clear_error() {
    let rt = Running::start();
    let server = Side::new(&rt.lp, BackendConfig::default());
    let client = Side::new(&rt.lp, BackendConfig::default());
    let params = ConnectionParams::receive(256, 4);
    let (listen, _) = common::connect(
        &server,
        &client,
        EndpointAddress::localhost(0),
        params.clone(),
        params.clone(),
    );
    // A second listener, to connect to once descriptors are back.
    let later = server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
        .unwrap();

    let mut cpu_clock = CpuClock::new();
    // Lower the limit a little above what is open, and use up the rest.
    let original = get_nofile();
    let limit = (raw::open_fds() + 32) as libc::rlim_t;
    assert!(limit <= original.rlim_cur, "already close to the limit");
    set_nofile(libc::rlimit {
        rlim_cur: limit,
        rlim_max: original.rlim_max,
    });
    let mut hoard = Vec::new();
    let mut exhausted = false;
    for _ in 0..10_000 {
        match File::open("/dev/null") {
            Ok(f) => hoard.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => {
                exhausted = true;
                break;
            }
            Err(e) => panic!("opening /dev/null: {e}"),
        }
    }
    assert!(exhausted, "the lowered limit was reached");

    // A peer connects (with this process's last descriptor); the listener
    // has none left to accept it with, so it waits in the backlog.
    hoard.pop();
    let mut peer = raw::connect_with_handshake(listen, 0);
    let peer_name = EndpointAddress::from(peer.local_addr().unwrap());

    // Opening endpoints fails clearly, as retryable.
    match server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params.clone())
    {
        Err(e @ OpenListenError::NoResources { .. }) => {
            assert!(e.is_retryable());
            assert!(e.to_string().contains("no resources"), "{e}");
        }
        other => panic!("listening without descriptors: {other:?}"),
    }
    match client.b.open_active_endpoint(later, params.clone()) {
        Err(e @ OpenActiveError::NoResources { .. }) => assert!(e.is_retryable(), "{e}"),
        other => panic!("connecting without descriptors: {other:?}"),
    }

    // The established connection does not need new descriptors.
    let name_on_server = server.first_remote().unwrap();
    exchange(&client, &server, listen, b"while out of descriptors", 1);
    exchange(&server, &client, name_on_server, b"still answering", 2);

    // The loop does not spin on the failing accept: over half a second of
    // wall time (a measurement window, not a wait for a condition) the
    // process uses well under half a core.
    let (cpu0, wall0) = (cpu_clock.now(), Instant::now());
    std::thread::sleep(Duration::from_millis(500));
    let (cpu, wall) = (cpu_clock.now() - cpu0, wall0.elapsed());
    assert!(cpu < wall / 2, "{cpu:?} of CPU in {wall:?}");
    // The peer was not answered: it was not accepted.
    peer.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(
        peer.read(&mut b).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "not accepted yet"
    );
    peer.set_nonblocking(false).unwrap();

    // Descriptors are back: the waiting peer is accepted without any new
    // connection arriving, and everything opens again.
    drop(hoard);
    set_nofile(original);
    assert_eq!(
        raw::read_n(&mut peer, HANDSHAKE_LEN),
        Handshake::new(256).encode()
    );
    assert!(wait_until(
        || server.has(|e| matches!(e, Ev::Established(r, _) if *r == peer_name))
    ));
    peer.write_all(&raw::data_frame(b"accepted at last"))
        .unwrap();
    assert!(wait_until(|| server.has(
        |e| *e == Ev::Data(peer_name, b"accepted at last".to_vec())
    )));

    client
        .b
        .open_active_endpoint(later, params.clone())
        .expect("the failed attempt left nothing behind");
    assert!(wait_until(
        || client.has(|e| matches!(e, Ev::Established(r, _) if *r == later))
    ));
    exchange(&client, &server, later, b"to the second listener", 3);
    server
        .b
        .open_listen_endpoint(EndpointAddress::localhost(0), params)
        .expect("listening again");
    assert!(!server.has(|e| matches!(e, Ev::Closed(..) | Ev::Refused(..))));
    assert!(!client.has(|e| matches!(e, Ev::Closed(..) | Ev::Refused(..))));
    assert!(rt.lp.is_running(), "no callback panicked out of the loop");
}
