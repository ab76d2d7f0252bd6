//! The program runs, parses its options, rejects bad input with clear
//! errors and reports every test on every provider, on small counts. No
//! speed figure is checked: only that figures are reported.

use std::process::{Command, Output};

use serde_json::Value;

fn perf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netio-perf"))
        .args(args)
        .output()
        .expect("netio-perf starts")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs and expects a usage error mentioning `needle`.
fn rejects(args: &[&str], needle: &str) {
    let out = perf(args);
    let err = text(&out.stderr);
    assert!(
        !out.status.success(),
        "{args:?} succeeded: {}",
        text(&out.stdout)
    );
    assert!(
        err.contains(needle),
        "{args:?}: expected `{needle}` in stderr, got: {err}"
    );
}

/// Small counts: every run takes milliseconds.
const SMALL: &[&str] = &[
    "--count",
    "200",
    "--warmup",
    "10",
    "--runs",
    "2",
    "--connections",
    "10",
];

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "failed: {}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("--json - prints valid JSON")
}

fn results(doc: &Value) -> &Vec<Value> {
    doc["results"].as_array().expect("results")
}

#[test]
fn help_and_version() {
    let out = perf(&["--help"]);
    assert!(out.status.success());
    let help = text(&out.stdout);
    for word in [
        "pingpong",
        "--baseline",
        "--fi-baseline",
        "fi_pingpong",
        "--sizes",
        "--busy-poll",
        "--json",
    ] {
        assert!(help.contains(word), "help lacks {word}");
    }
    assert!(perf(&["--version"]).status.success());
}

#[test]
fn bad_input_is_rejected_clearly() {
    rejects(&["--sizes", "64,abc"], "invalid size `abc`");
    rejects(&["--sizes", "0"], "at least 1 byte");
    rejects(&["--sizes", "1g"], "invalid size");
    rejects(&["--count", "0"], "--count");
    rejects(&["--runs", "0"], "--runs");
    rejects(&["--duration", "0"], "above 0");
    rejects(&["--count", "5", "--duration", "1"], "cannot be used with");
    rejects(&["nosuchtest"], "nosuchtest");
    rejects(&["--mode", "async"], "not available in this version");
    rejects(&["--mode", "fast"], "fast");
    if !cfg!(feature = "libfabric") {
        rejects(&["--provider", "libfabric"], "not built in");
    }
    rejects(&["--fi-baseline"], "--provider libfabric");
    rejects(&["--fabric", "verbs"], "use it with --provider libfabric");
    rejects(
        &["--provider", "libfabric", "--fi-baseline", "bw"],
        "ping-pong only",
    );
    rejects(
        &["--provider", "libfabric", "--fi-baseline", "--baseline"],
        "cannot be used with",
    );
    rejects(
        &[
            "--provider",
            "libfabric",
            "--fi-baseline",
            "--duration",
            "1",
        ],
        "cannot be used with",
    );
    rejects(&["--provider", "nope"], "unknown provider `nope`");
    rejects(&["--provider", "sim", "--busy-poll"], "virtual time");
    rejects(
        &["--listen", "127.0.0.1:0", "--connect", "127.0.0.1:1"],
        "cannot be used with",
    );
    rejects(&["--connect", "not-an-address"], "--connect");
}

#[test]
fn every_test_on_the_simulator() {
    let mut args = vec!["--provider", "sim", "--json", "-", "--sizes", "64,4k"];
    args.extend_from_slice(SMALL);
    let doc = json_of(&perf(&args));
    assert_eq!(doc["provider"], "sim");
    assert!(doc["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert!(doc["command_line"].as_array().unwrap().len() > 1);
    let rs = results(&doc);
    for test in ["pingpong", "bw", "rate", "conns"] {
        let rows: Vec<_> = rs.iter().filter(|r| r["test"] == test).collect();
        assert!(!rows.is_empty(), "no {test} row");
        for r in rows {
            assert_eq!(r["status"], "ok", "{r}");
            let figs = r["figures"].as_array().unwrap();
            assert!(!figs.is_empty(), "{r}");
            for f in figs {
                assert_eq!(f["provider"]["runs"].as_array().unwrap().len(), 2, "{f}");
                assert!(f["unit"].is_string());
                assert!(f["baseline"].is_null());
            }
        }
    }
    // Virtual time is labelled as such.
    let rate = rs.iter().find(|r| r["test"] == "rate").unwrap();
    let units: Vec<_> = rate["figures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["unit"].as_str().unwrap().to_string())
        .collect();
    assert!(units.contains(&"per_virtual_s".to_string()), "{units:?}");
}

#[test]
fn every_test_over_tcp_with_the_baseline() {
    let dir = std::env::temp_dir().join(format!("netio-perf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tcp.json");
    let mut args = vec![
        "--provider",
        "tcp",
        "--baseline",
        "--sizes",
        "64,4k",
        "--json",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(SMALL);
    let out = perf(&args);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{table}\n{}", text(&out.stderr));
    for needle in [
        "pingpong 64 B, copy",
        "bw 4 KiB, copy",
        "rate 64 B, copy",
        "conns, 10 connections",
        "median round trip",
        "plain TCP",
        "µs",
        "GB/s",
        "×",
        "KiB",
    ] {
        assert!(table.contains(needle), "table lacks `{needle}`:\n{table}");
    }
    let doc: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(doc["baseline"], "plain blocking TCP");
    for r in results(&doc) {
        assert_eq!(r["status"], "ok", "{r}");
        if r["test"] != "conns" {
            for f in r["figures"].as_array().unwrap() {
                assert_eq!(f["baseline"]["runs"].as_array().unwrap().len(), 2, "{f}");
                assert_eq!(f["ratio"]["runs"].as_array().unwrap().len(), 2, "{f}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_send_mode_busy_polling() {
    let mut args = vec![
        "pingpong",
        "rate",
        "--busy-poll",
        "--baseline",
        "--mode",
        "buffered,zero-copy,copy",
        "--json",
        "-",
    ];
    args.extend_from_slice(SMALL);
    let doc = json_of(&perf(&args));
    assert_eq!(doc["busy_poll"], true);
    assert_eq!(doc["baseline"], "plain busy-polling TCP");
    let rs = results(&doc);
    assert_eq!(rs.len(), 6);
    for mode in ["buffered", "zero-copy", "copy"] {
        assert!(rs.iter().any(|r| r["mode"] == mode && r["status"] == "ok"));
    }
}

#[test]
fn duration_instead_of_count() {
    let doc = json_of(&perf(&[
        "pingpong",
        "bw",
        "--sizes",
        "1k",
        "--duration",
        "0.05",
        "--warmup",
        "5",
        "--runs",
        "1",
        "--json",
        "-",
    ]));
    assert_eq!(results(&doc).len(), 2);
    assert!(results(&doc).iter().all(|r| r["status"] == "ok"));
}

#[test]
fn two_processes_listen_and_connect() {
    use std::io::{BufRead, BufReader};
    let mut server = Command::new(env!("CARGO_BIN_EXE_netio-perf"))
        .args(["--listen", "127.0.0.1:0", "--serve-for", "30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .find(|w| w.starts_with("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no address in {line}"))
        .to_string();
    let out = perf(&[
        "pingpong",
        "bw",
        "--connect",
        &addr,
        "--sizes",
        "64",
        "--count",
        "100",
        "--warmup",
        "5",
        "--runs",
        "1",
        "--json",
        "-",
    ]);
    let _ = server.kill();
    let _ = server.wait();
    let doc = json_of(&out);
    assert!(results(&doc).iter().all(|r| r["status"] == "ok"), "{doc}");
}
