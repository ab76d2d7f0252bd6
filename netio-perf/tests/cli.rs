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
        "--socket-buffers",
        "--plain-write-buffer",
        "--plain-read-buffer",
        "copy-batch",
        "buffered-batch",
        "A B B A",
        "mean",
        "p99.9",
    ] {
        assert!(help.contains(word), "help lacks {word}");
    }
    // fi_pingpong's endpoint type follows the fabric's.
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("`-e msg`, or `-e rdm`"), "{flat}");
    assert!(flat.contains("(shm, tcp;ofi_rxm"), "{flat}");
    assert!(perf(&["--version"]).status.success());
}

/// `--help` states the defaults the program uses: the measured time per
/// test, the warm-ups and the default send modes, as the JSON reports them.
#[test]
fn help_states_the_defaults() {
    let help = text(&perf(&["--help"]).stdout);
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    for needle in [
        "Default: none, runs are timed (--duration)",
        "Default: 0.5 for pingpong (round trips until 0.5 s have passed), 0.6 for bw and rate",
        "Default: 1000 round trips, 16 MiB worth of messages for bw, 100000 messages for rate",
        "Default: copy for pingpong and bw, copy,copy-batch for rate",
        "[default: 5]",
        "Default: not set, the system's default with autotuning, on both sides",
        "Default: 256k for messages below 64 KiB, one frame (the message size + 4) from 64 KiB up",
        "Default: 256k for messages below 64 KiB, 1m from 64 KiB to below 1 MiB, 0 from 1 MiB up",
    ] {
        assert!(flat.contains(needle), "help lacks `{needle}`:\n{help}");
    }
    // The same defaults, as the program applies them (sim: no sockets, a
    // quick run; the settings do not depend on the provider).
    let doc = json_of(&perf(&[
        "--provider",
        "sim",
        "pingpong",
        "rate",
        "bw",
        "--count",
        "20",
        "--warmup",
        "2",
        "--runs",
        "1",
        "--sizes",
        "64",
        "--json",
        "-",
    ]));
    let s = &doc["settings"];
    assert_eq!(
        s["default_duration_s"],
        serde_json::json!({"pingpong": 0.5, "bw": 0.6, "rate": 0.6}),
        "{s}"
    );
    assert_eq!(
        s["default_modes"],
        serde_json::json!({"pingpong": ["copy"], "bw": ["copy"], "rate": ["copy", "copy-batch"]}),
        "{s}"
    );
    assert!(s["plain_read_buffer"].is_null(), "{s}");
    assert!(s["plain_write_buffer"].is_null(), "{s}");
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
    rejects(
        &["--fi-baseline", "--mode", "async"],
        "compared with the callback path",
    );
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
    rejects(&["--sim-profile", "rdma"], "use it with --provider sim");
    rejects(&["--provider", "sim", "--sim-profile", "ib"], "ib");
    rejects(
        &["--listen", "127.0.0.1:0", "--connect", "127.0.0.1:1"],
        "cannot be used with",
    );
    rejects(&["--connect", "not-an-address"], "--connect");
    rejects(
        &["--provider", "sim", "--socket-buffers", "1m"],
        "--socket-buffers",
    );
    rejects(&["--socket-buffers", "1k"], "between 4k");
    rejects(&["--recv-buffers", "0"], "--recv-buffers");
}

#[test]
fn one_receive_buffer_per_connection_serves_ping_pong_and_one_way_tests() {
    for provider in ["sim", "tcp"] {
        let mut args = vec![
            "--provider",
            provider,
            "--json",
            "-",
            "--sizes",
            "4k",
            "--recv-buffers",
            "1",
            "pingpong",
            "bw",
            "rate",
        ];
        args.extend_from_slice(SMALL);
        let doc = json_of(&perf(&args));
        assert_eq!(doc["settings"]["recv_buffers"], 1);
        let rs = results(&doc);
        for test in ["pingpong", "bw", "rate"] {
            assert!(
                rs.iter().any(|r| r["test"] == test),
                "{provider}: no {test} row"
            );
        }
        for r in rs {
            assert_eq!(r["status"], "ok", "{provider}: {r}");
            let notes = r["notes"].to_string();
            assert!(
                notes.contains("receive buffers per connection: 1"),
                "{provider}: {notes}"
            );
        }
    }
}

/// `--mode async` runs the client as a task of the async API, and its
/// baseline is the same provider's callback path: every test, on the
/// simulator and over TCP (thread-safe and thread-unsafe backends), each
/// row with figures of both sides and their ratios. On the simulator the
/// modelled link is the same for both, so the virtual figures agree within
/// 1 % (the async client also waits for its send's completion).
#[test]
fn async_mode_runs_every_test_with_the_callback_path_as_its_baseline() {
    for extra in [
        &["--provider", "sim"][..],
        &["--provider", "tcp"],
        &["--provider", "tcp", "--thread-unsafe", "--busy-poll"],
    ] {
        let mut args = vec![
            "pingpong",
            "bw",
            "rate",
            "--mode",
            "async",
            "--baseline",
            "--sizes",
            "64,4k",
            "--json",
            "-",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(SMALL);
        let doc = json_of(&perf(&args));
        let rs = results(&doc);
        assert_eq!(rs.len(), 6, "{extra:?}: {rs:?}");
        for r in rs {
            assert_eq!(r["status"], "ok", "{extra:?}: {r}");
            assert_eq!(r["mode"], "async", "{r}");
            assert_eq!(r["row_baseline"], "callbacks", "{r}");
            assert_eq!(
                r["run_order"],
                serde_json::json!(["provider", "baseline", "baseline", "provider"]),
                "{r}"
            );
            let head = &r["figures"][0];
            assert_eq!(head["key"], r["headline"], "{r}");
            assert_eq!(head["ratio"]["runs"].as_array().unwrap().len(), 2, "{r}");
            assert!(head["ratio"]["median"].as_f64().unwrap() > 0.0, "{r}");
            if extra[1] == "sim" {
                for f in r["figures"].as_array().unwrap() {
                    if f["unit"].as_str().unwrap().contains("virtual") {
                        let ratio = f["ratio"]["median"].as_f64().unwrap();
                        assert!((ratio - 1.0).abs() < 0.01, "{f}");
                    }
                }
            }
            let notes = r["notes"].as_array().unwrap();
            assert!(
                notes
                    .iter()
                    .any(|n| n.as_str().unwrap().contains("ratio = async/callbacks")),
                "{r}"
            );
        }
    }
    // The table names the baseline of each async row.
    let mut args = vec!["pingpong", "--mode", "copy,async", "--baseline"];
    args.extend_from_slice(SMALL);
    let out = perf(&args);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{table}\n{}", text(&out.stderr));
    let async_row = table.split("pingpong 64 B, async").nth(1).expect(&table);
    assert!(async_row.contains("callbacks"), "{table}");
    let copy_row = table.split("pingpong 64 B, copy").nth(1).expect(&table);
    let copy_row = copy_row.split("pingpong 64 B, async").next().unwrap();
    assert!(copy_row.contains("plain TCP"), "{table}");
}

/// The virtual-time message rate of a 64 B `rate` run on the simulator
/// under `profile`, and the run's layout line.
fn sim_rate(profile: &str) -> (f64, String) {
    let args = [
        "rate",
        "--provider",
        "sim",
        "--sim-profile",
        profile,
        "--json",
        "-",
        "--mode",
        "copy",
        // More messages than the client keeps in flight (1,024), so that
        // when a send completes matters.
        "--count",
        "5000",
        "--warmup",
        "10",
        "--runs",
        "1",
    ];
    let doc = json_of(&perf(&args));
    let rate = &results(&doc)[0];
    let virtual_rate = rate["figures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["unit"] == "per_virtual_s")
        .map(|f| f["provider"]["median"].as_f64().unwrap())
        .expect("a virtual-time rate");
    let layout = doc["layout"].as_str().unwrap().to_string();
    (virtual_rate, layout)
}

#[test]
fn the_simulators_profile_is_chosen_with_sim_profile() {
    let (tcp, tcp_layout) = sim_rate("tcp");
    let (rdma, rdma_layout) = sim_rate("rdma");
    assert!(tcp_layout.contains("TCP"), "{tcp_layout}");
    assert!(rdma_layout.contains("RDMA"), "{rdma_layout}");
    // The same seed and sends: only the profile differs, and under it a
    // send completes (freeing its slot of the window) only on delivery,
    // so the same window carries fewer messages per virtual second.
    assert!(
        rdma < tcp,
        "rdma {rdma} against tcp {tcp} messages per virtual s"
    );
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
        "rate 64 B, copy (per message: send_data_copy)",
        "plain TCP reads into a 256 KiB buffer and writes each frame to a 256 KiB BufWriter",
        "rate 64 B, copy-batch (batch: send_copy_batch",
        "conns, 10 connections",
        "mean round trip",
        "median round trip",
        "p99 round trip",
        "p99.9 round trip",
        "A B B A",
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
    // The mean is the headline: first in the table too.
    let mean = table.find("mean round trip").unwrap();
    assert!(mean < table.find("median round trip").unwrap(), "{table}");
    for r in results(&doc) {
        assert_eq!(r["status"], "ok", "{r}");
        if r["test"] != "conns" {
            assert_eq!(
                r["run_order"],
                serde_json::json!(["provider", "baseline", "baseline", "provider"]),
                "{r}"
            );
            for f in r["figures"].as_array().unwrap() {
                assert_eq!(f["baseline"]["runs"].as_array().unwrap().len(), 2, "{f}");
                if f["better"] == "neither" {
                    assert!(f["ratio"].is_null(), "{f}");
                } else {
                    assert_eq!(f["ratio"]["runs"].as_array().unwrap().len(), 2, "{f}");
                }
            }
        }
    }
    // Round trips: mean (the headline), median and tails, on both sides.
    let pp = results(&doc)
        .iter()
        .find(|r| r["test"] == "pingpong")
        .unwrap();
    assert_eq!(pp["headline"], "mean_rtt", "{pp}");
    let figs = pp["figures"].as_array().unwrap();
    assert_eq!(figs[0]["key"], "mean_rtt", "{pp}");
    for key in ["mean_rtt", "median_rtt", "p99_rtt", "p999_rtt"] {
        let f = figs.iter().find(|f| f["key"] == key).expect(key);
        assert!(f["provider"]["median"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["baseline"]["median"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["ratio"]["median"].as_f64().unwrap() > 0.0, "{f}");
    }
    // Per-message and batch rate rows are told apart.
    let rate_modes: Vec<_> = results(&doc)
        .iter()
        .filter(|r| r["test"] == "rate")
        .map(|r| (r["mode"].clone(), r["mode_description"].clone()))
        .collect();
    assert_eq!(rate_modes.len(), 4, "{rate_modes:?}");
    assert!(rate_modes
        .iter()
        .any(|(m, d)| m == "copy" && d.as_str().unwrap().starts_with("per message")));
    assert!(rate_modes
        .iter()
        .any(|(m, d)| m == "copy-batch" && d.as_str().unwrap().starts_with("batch")));
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
        "buffered,buffered-batch,zero-copy,copy,copy-batch",
        "--json",
        "-",
    ];
    args.extend_from_slice(SMALL);
    let doc = json_of(&perf(&args));
    assert_eq!(doc["busy_poll"], true);
    assert_eq!(doc["baseline"], "plain busy-polling TCP");
    let rs = results(&doc);
    assert_eq!(rs.len(), 10);
    for mode in ["buffered", "zero-copy", "copy"] {
        for test in ["pingpong", "rate"] {
            assert!(
                rs.iter()
                    .any(|r| r["mode"] == mode && r["test"] == test && r["status"] == "ok"),
                "{mode} {test}"
            );
        }
    }
    for mode in ["buffered-batch", "copy-batch"] {
        let row = |test| {
            rs.iter()
                .find(|r| r["mode"] == mode && r["test"] == test)
                .unwrap()
        };
        assert_eq!(row("rate")["status"], "ok", "{}", row("rate"));
        // Ping-pong sends one message at a time: no batch row.
        assert_eq!(row("pingpong")["status"], "unsupported");
        assert!(row("pingpong")["message"]
            .as_str()
            .unwrap()
            .contains("one-way"));
    }
}

/// Without --count or --duration, runs are timed: every run measures at
/// least half a second (one-way: the sender sends for 0.6 s; the
/// receiver's span starts when the first measured message arrives, so it
/// is checked with room for that message's way). No speed is checked.
#[test]
fn default_runs_are_timed() {
    let doc = json_of(&perf(&[
        "pingpong",
        "rate",
        "--baseline",
        "--mode",
        "copy",
        "--runs",
        "1",
        "--json",
        "-",
    ]));
    for r in results(&doc) {
        assert_eq!(r["status"], "ok", "{r}");
        assert_eq!(r["run_order"], serde_json::json!(["provider", "baseline"]));
        let m = r["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["key"] == "measured_s")
            .unwrap_or_else(|| panic!("no measured time: {r}"));
        let least = if r["test"] == "pingpong" { 0.5 } else { 0.45 };
        for side in ["provider", "baseline"] {
            let s = m[side]["median"].as_f64().unwrap();
            assert!(s >= least, "{side} measured {s} s: {r}");
        }
    }
}

/// Three pairs: A B, B A, A B.
#[test]
fn runs_alternate_a_b_b_a() {
    let doc = json_of(&perf(&[
        "pingpong",
        "--baseline",
        "--count",
        "50",
        "--warmup",
        "5",
        "--runs",
        "3",
        "--socket-buffers",
        "256k",
        "--json",
        "-",
    ]));
    let r = &results(&doc)[0];
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(
        r["run_order"],
        serde_json::json!(["provider", "baseline", "baseline", "provider", "provider", "baseline"])
    );
    assert_eq!(doc["settings"]["socket_buffers"], 256 * 1024);
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

/// A `--listen` server in one process serves a `--connect` client in
/// another; `extra` goes to both.
fn listen_and_connect(extra: &[&str]) {
    use std::io::{BufRead, BufReader};
    let mut server = Command::new(env!("CARGO_BIN_EXE_netio-perf"))
        .args(["--listen", "127.0.0.1:0", "--serve-for", "30"])
        .args(extra)
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
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    let out = perf(&args);
    let _ = server.kill();
    let _ = server.wait();
    let doc = json_of(&out);
    assert!(results(&doc).iter().all(|r| r["status"] == "ok"), "{doc}");
}

#[test]
fn two_processes_listen_and_connect() {
    listen_and_connect(&[]);
}

/// `--thread-unsafe` applies to a `--listen` server too (as it does to
/// the second process of `--fi-baseline`).
#[test]
fn two_processes_listen_and_connect_in_thread_unsafe_mode() {
    listen_and_connect(&["--thread-unsafe"]);
}
