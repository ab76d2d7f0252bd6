//! `--fi-baseline`: the libfabric provider's ping-pong alternated with
//! libfabric's own `fi_pingpong`, on a tiny count. Built only with the
//! `libfabric` feature:
//!
//! ```sh
//! cargo test -p netio-perf --features libfabric --test fi_baseline
//! ```
//!
//! The comparison skips (saying why) when `fi_pingpong` is not on PATH
//! (Debian/Ubuntu package `libfabric-bin`); the failure cases run
//! stand-in scripts named `fi_pingpong` and need no libfabric utilities.
//! No speed is checked: only that both figures and their ratio are
//! reported, and that failures are.
#![cfg(feature = "libfabric")]

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `netio-perf pingpong --provider libfabric --fi-baseline` on 200 round
/// trips, one run, and `extra`; `path`: the PATH it sees.
fn fi_run(extra: &[&str], path: Option<OsString>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_netio-perf"));
    c.args([
        "pingpong",
        "--provider",
        "libfabric",
        "--fi-baseline",
        "--sizes",
        "64",
        "--count",
        "200",
        "--warmup",
        "20",
        "--runs",
        "2",
    ])
    .args(extra);
    if let Some(p) = path {
        c.env("PATH", p);
    }
    c.output().expect("netio-perf starts")
}

fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("netio-perf-fi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A directory holding an executable `fi_pingpong` shell script with
/// `body`, and the PATH that finds it first.
fn stand_in(name: &str, body: &str) -> (PathBuf, OsString) {
    use std::os::unix::fs::PermissionsExt;
    let d = temp_dir(name);
    let f = d.join("fi_pingpong");
    std::fs::write(&f, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut dirs = vec![d.clone()];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    (d, std::env::join_paths(dirs).unwrap())
}

#[test]
fn libfabric_against_fi_pingpong() {
    if on_path("fi_pingpong").is_none() {
        eprintln!(
            "skipped: fi_pingpong is not on PATH (Debian/Ubuntu: apt-get install libfabric-bin)"
        );
        return;
    }
    let dir = temp_dir("run");
    let json = dir.join("fi.json");
    let out = fi_run(&["--timeout", "60", "--json", json.to_str().unwrap()], None);
    let table = text(&out.stdout);
    assert!(
        out.status.success(),
        "failed:\n{table}\n{}",
        text(&out.stderr)
    );
    for needle in [
        "pingpong 64 B, copy",
        "busy-polling loops",
        "fi_pingpong",
        "2 × usec/xfer",
        "fi_pingpong -p tcp -e msg -S 64 -I 200",
        // netio's server runs in a second process, as fi_pingpong's does.
        "server in a second one (`netio-perf --listen`",
        "netio-perf's server runs as `netio-perf --listen` in a second process",
        // One receive buffer per side, as fi_pingpong posts, by default.
        "receive buffers per connection: 1 on each side (fi_pingpong: 1;",
    ] {
        assert!(table.contains(needle), "table lacks `{needle}`:\n{table}");
    }
    // Both figures and the ratio on one line.
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with("mean round trip"))
        .unwrap_or_else(|| panic!("no mean round trip:\n{table}"));
    assert_eq!(line.matches(" µs").count(), 2, "{line}");
    assert!(line.contains('×'), "{line}");
    let rt = table
        .lines()
        .find(|l| l.trim_start().starts_with("round trips"))
        .unwrap();
    assert_eq!(rt.matches("/s").count(), 2, "{rt}");
    assert!(rt.contains('×'), "{rt}");

    let doc: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["baseline"], "fi_pingpong");
    assert_eq!(doc["busy_poll"], true);
    assert_eq!(doc["settings"]["fi_pingpong"]["fabric_provider"], "tcp");
    let row = &doc["results"][0];
    assert_eq!(row["status"], "ok", "{row}");
    let figs = row["figures"].as_array().unwrap();
    for key in ["mean_rtt", "round_trips_per_s", "pingpong_bytes_per_s"] {
        let f = figs
            .iter()
            .find(|f| f["key"] == key)
            .unwrap_or_else(|| panic!("no {key}: {row}"));
        for side in ["provider", "baseline", "ratio"] {
            let runs = f[side]["runs"].as_array().unwrap();
            assert_eq!(runs.len(), 2, "{key} {side}: {f}");
            assert!(
                runs.iter().all(|r| r.as_f64().unwrap() > 0.0),
                "{key} {side}: {f}"
            );
        }
    }
    // Pairs in the order A B B A; the mean round trip is the headline.
    assert_eq!(
        row["run_order"],
        serde_json::json!(["provider", "baseline", "baseline", "provider"]),
        "{row}"
    );
    assert_eq!(row["headline"], "mean_rtt", "{row}");
    // netio-perf's own percentiles have no fi_pingpong counterpart.
    let median = figs.iter().find(|f| f["key"] == "median_rtt").unwrap();
    assert!(median["baseline"].is_null(), "{median}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_fi_pingpong_the_error_names_the_package() {
    let empty = temp_dir("empty");
    let out = fi_run(&[], Some(empty.clone().into_os_string()));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("fi_pingpong") && err.contains("libfabric-bin"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn a_failing_fi_pingpong_is_reported_with_its_error_output() {
    let (dir, path) = stand_in(
        "fail",
        "echo '[error] stand-in: no fabric here' >&2\nexit 3",
    );
    let out = fi_run(&["--timeout", "60"], Some(path));
    let table = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        table.contains("FAILED: fi_pingpong run 1")
            && table.contains("exit status: 3")
            && table.contains("[error] stand-in: no fabric here"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_hanging_fi_pingpong_is_killed_after_the_time_limit() {
    let (dir, path) = stand_in("hang", "exec sleep 60");
    let start = std::time::Instant::now();
    // The limit applies to netio's own run too, which comes first: long
    // enough for it on a loaded machine, well short of the stand-in's
    // 60 s.
    let out = fi_run(&["--timeout", "10"], Some(path));
    let table = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        table.contains("FAILED: fi_pingpong run 1") && table.contains("killed"),
        "{table}"
    );
    assert!(start.elapsed().as_secs() < 45, "took {:?}", start.elapsed());
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

/// The names of netio's `shm` endpoint files in `/dev/shm` whose process
/// is gone (`netio-<pid>-…`).
fn orphaned_shm_files() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.strip_prefix("netio-")
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok())
                .is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect()
}

/// On `shm`, each run's server process (`netio-perf --listen`) is stopped
/// with SIGTERM, so that libfabric removes its endpoint's file from
/// `/dev/shm`; killed outright, every run left one behind (several MiB of
/// shared memory each, for good).
#[test]
fn a_run_on_shm_leaves_no_endpoint_file_of_its_server_behind() {
    if on_path("fi_pingpong").is_none() {
        eprintln!(
            "skipped: fi_pingpong is not on PATH (Debian/Ubuntu: apt-get install libfabric-bin)"
        );
        return;
    }
    let before = orphaned_shm_files();
    let out = fi_run(&["--fabric", "shm", "--timeout", "60"], None);
    assert!(
        out.status.success(),
        "failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let left: Vec<String> = orphaned_shm_files()
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    assert!(
        left.is_empty(),
        "files of processes gone, left in /dev/shm by the run: {left:?}"
    );
}
