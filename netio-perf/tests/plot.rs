//! `netio-perf --json` output goes through `scripts/plot-bench.py` and
//! comes out as SVG plots that show the data. python3 is required: without
//! it this test fails, it does not skip.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn json_results_become_svg_plots() {
    let python = Command::new("python3").arg("--version").output();
    assert!(
        python.as_ref().is_ok_and(|o| o.status.success()),
        "python3 is needed to run scripts/plot-bench.py (standard library only) and was not found: {python:?}; install python3"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let dir: PathBuf = std::env::temp_dir().join(format!("netio-perf-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tcp = dir.join("tcp.json");
    let sim = dir.join("sim.json");
    let small = [
        "--sizes", "64,4k", "--count", "100", "--warmup", "5", "--runs", "2",
    ];
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_netio-perf"))
            .args([
                "pingpong",
                "bw",
                "--provider",
                "tcp",
                "--baseline",
                "--json",
            ])
            .arg(&tcp)
            .args(small),
    );
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_netio-perf"))
            .args(["pingpong", "bw", "--provider", "sim", "--json"])
            .arg(&sim)
            .args(small),
    );
    let out = dir.join("plots");
    run_ok(
        Command::new("python3")
            .arg(root.join("scripts/plot-bench.py"))
            .arg("-o")
            .arg(&out)
            .arg(&tcp)
            .arg(&sim),
    );
    for name in ["latency.svg", "bandwidth.svg"] {
        let svg = std::fs::read_to_string(out.join(name))
            .unwrap_or_else(|e| panic!("{name} not written: {e}"));
        assert!(svg.starts_with("<svg"), "{name}");
        for needle in [
            "tcp copy (interrupt)",
            "plain blocking TCP",
            "sim copy",
            "64 B",
            "4 KiB",
        ] {
            assert!(svg.contains(needle), "{name} lacks `{needle}`");
        }
        assert!(svg.contains("<polyline"), "{name} has no line");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
