//! The `pingpong` and `echo_tcp` programs select the libfabric provider by
//! name (`--provider libfabric`, the fabric provider with `--fabric`), and
//! an unknown fabric provider is a clear error, not a crash. Built with the
//! `libfabric` feature only (`scripts/test-all.sh` runs it). Every program
//! is killed after a deadline (`common::Proc`).
#![cfg(feature = "libfabric")]

mod common;
use common::{run_ok, Proc};

const ECHO: &str = env!("CARGO_BIN_EXE_echo_tcp");
const PINGPONG: &str = env!("CARGO_BIN_EXE_pingpong");

/// All of `out` as one text.
fn text(out: &[String]) -> String {
    out.join("\n")
}

#[test]
fn pingpong_runs_over_libfabric_tcp_and_sockets_by_name() {
    for fabric in ["tcp", "sockets"] {
        let args = ["--provider", "libfabric", "--fabric", fabric];
        let out = text(&run_ok(
            "pingpong",
            PINGPONG,
            &[&args[..], &["--count", "100"]].concat(),
        ));
        assert!(out.contains("over libfabric"), "{fabric}: {out}");
        assert!(
            out.contains("echoes intact 100, mismatched 0"),
            "{fabric}: {out}"
        );
    }
}

#[test]
fn echo_tcp_runs_over_libfabric_by_name() {
    let out = text(&run_ok(
        "echo_tcp",
        ECHO,
        &["--provider", "libfabric", "--count", "50"],
    ));
    assert!(out.contains("echoed back intact 50, mismatched 0"), "{out}");
    assert!(
        out.contains("1 connection(s), 1 closed, echoed 50, failed 0"),
        "{out}"
    );
}

#[test]
fn an_unknown_fabric_provider_is_a_clear_error() {
    let args = [
        "--provider",
        "libfabric",
        "--fabric",
        "nosuch",
        "--count",
        "10",
    ];
    let (status, out, err) = Proc::spawn("pingpong", PINGPONG, &args).finish();
    assert!(!status.success(), "{out:#?}");
    assert!(
        err.contains("libfabric provider `nosuch`") && err.contains("unknown provider name"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
