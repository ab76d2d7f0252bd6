//! The `pingpong` and `echo_tcp` programs select the libfabric provider by
//! name (`--provider libfabric`, the fabric provider with `--fabric`), and
//! an unknown fabric provider is a clear error, not a crash. Built with the
//! `libfabric` feature only (`scripts/test-all.sh` runs it). Every program
//! is killed after a deadline.
#![cfg(feature = "libfabric")]

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const ECHO: &str = env!("CARGO_BIN_EXE_echo_tcp");
const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");

/// Runs `exe` with `args` for at most 60 s; its exit success, stdout and
/// stderr.
fn run(exe: &str, args: &[&str]) -> (bool, String, String) {
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the program starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{exe} {args:?} did not end within 60 s");
        }
        thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn pingpong_runs_over_libfabric_tcp_and_sockets_by_name() {
    for fabric in ["tcp", "sockets"] {
        let (ok, out, err) = run(
            PINGPONG,
            &[
                "--provider",
                "libfabric",
                "--fabric",
                fabric,
                "--count",
                "100",
            ],
        );
        assert!(ok, "{fabric}: {out}{err}");
        assert!(out.contains("over libfabric"), "{fabric}: {out}");
        assert!(
            out.contains("echoes intact 100, mismatched 0"),
            "{fabric}: {out}"
        );
    }
}

#[test]
fn echo_tcp_runs_over_libfabric_by_name() {
    let (ok, out, err) = run(
        ECHO,
        &["--provider", "libfabric", "--count", "50", "--clients", "2"],
    );
    assert!(ok, "{out}{err}");
    assert!(out.contains("echoed back intact 50, mismatched 0"), "{out}");
    assert!(out.contains("failed 0"), "{out}");
}

#[test]
fn an_unknown_fabric_provider_is_a_clear_error() {
    let (ok, out, err) = run(
        PINGPONG,
        &[
            "--provider",
            "libfabric",
            "--fabric",
            "nosuch",
            "--count",
            "10",
        ],
    );
    assert!(!ok, "{out}");
    assert!(
        err.contains("libfabric provider `nosuch`") && err.contains("unknown provider name"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
