//! The netio-rs conformance suite on TCP over 127.0.0.1, in both thread
//! modes. `conformance_v6` runs it over ::1, `conformance_busy_poll` on
//! busy-polling loops; the harness is in `conformance_harness`.
//!
//! The suite's liveness behaviour partitions two backends in a network
//! namespace of the test's own (`MioProvider::NETNS_PARTITION`), which needs
//! root; the tests below pin how the harness makes and leaves it.

mod conformance_harness;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread;

pub use conformance_harness::{TcpHarness, V4};
use netio_conformance::Harness;

netio_conformance::suite!(crate::TcpHarness<crate::V4>);

/// The network namespace of the calling thread.
fn netns() -> PathBuf {
    std::fs::read_link("/proc/thread-self/ns/net").expect("reading /proc/thread-self/ns/net")
}

/// `Harness::isolate` moves the test's thread (and the threads it starts
/// afterwards) into a network namespace of its own, with a working
/// loopback and nothing of the host's; other threads stay where they are;
/// dropping the harness brings the thread back.
#[test]
fn isolate_gives_the_test_thread_a_private_loopback_until_the_harness_is_dropped() {
    let host = netns();
    let outside = TcpListener::bind("127.0.0.1:0").unwrap();
    let outside_addr = outside.local_addr().unwrap();
    let bystander = thread::spawn(netns);

    let mut h = TcpHarness::<V4>::setup();
    h.isolate();
    let private = netns();
    assert_ne!(
        private, host,
        "isolate moved the thread to another namespace"
    );
    assert_eq!(
        thread::spawn(netns).join().unwrap(),
        private,
        "threads started afterwards (the loop threads) share it"
    );
    assert_eq!(
        bystander.join().unwrap(),
        host,
        "a thread started before stays in the host's namespace"
    );
    // Loopback works inside, and the host's sockets are not there.
    let inside = TcpListener::bind("127.0.0.1:0").expect("lo is up in the private namespace");
    TcpStream::connect(inside.local_addr().unwrap()).expect("connecting over the private lo");
    assert!(
        TcpStream::connect(outside_addr).is_err(),
        "the host's listener {outside_addr} is not reachable from the private namespace"
    );
    drop(h);
    assert_eq!(
        netns(),
        host,
        "dropping the harness returns to the host's namespace"
    );
    TcpStream::connect(outside_addr).expect("the host's listener again");
}

/// Without the privilege to make a namespace, `Harness::isolate` fails the
/// test (a partition test must not pass without partitioning).
#[test]
#[should_panic(expected = "could not be made: unshare(CLONE_NEWNET)")]
fn isolate_without_cap_sys_admin_fails_loudly() {
    drop_cap_sys_admin();
    let mut h = TcpHarness::<V4>::setup();
    h.isolate();
}

/// Removes `CAP_SYS_ADMIN` from the calling thread's effective capabilities
/// (capabilities are per thread; libtest ends this one with the test).
fn drop_cap_sys_admin() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    const CAP_SYS_ADMIN: u32 = 21;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: a version-3 header and two data structs, as capget(2)
    // expects; pid 0 is the calling thread.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", std::io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_SYS_ADMIN);
    // SAFETY: as above; capset(2) only reads them and changes only the
    // calling thread's capabilities.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", std::io::Error::last_os_error());
}
