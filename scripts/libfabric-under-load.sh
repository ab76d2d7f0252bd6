#!/usr/bin/env bash
# Runs the libfabric conformance suites (connected endpoints on tcp and
# sockets, reliable datagrams on tcp;ofi_rxm, shm, sockets and udp;ofi_rxd;
# both thread modes) RUNS times in a row, each beside one busy process per
# core, and counts the runs that failed. A failed run's output is kept in
# $OUT.
#
#   bash scripts/libfabric-under-load.sh [RUNS]     (default 30)
#   SUITES="conformance_tcp conformance_rdm_shm" bash scripts/libfabric-under-load.sh 10
#
# The busy processes are bounded in time (the suite's run time plus a
# margin) and killed when a run ends.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${1:-30}"
OUT="${OUT:-target/libfabric-under-load}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

SUITES="${SUITES:-conformance_tcp conformance_sockets conformance_rdm_tcp_rxm conformance_rdm_shm conformance_rdm_sockets conformance_rdm_udp_rxd}"
bin() {
    cargo test --release --locked -p netio-libfabric --test "$1" --no-run \
        --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
# The binaries are copied aside, so that a build during the series cannot
# change what it runs.
mkdir -p "$OUT/bin"
BINS=()
for suite in $SUITES; do
    b="$(bin "$suite")"
    [ -n "$b" ] || { echo "no test binary for $suite" >&2; exit 2; }
    cp "$b" "$OUT/bin/$suite"
    BINS+=("$OUT/bin/$suite")
done
CORES="$(nproc)"
# A test the watchdog finds stuck leaves every thread's stack here (when
# gdb is installed).
export NETIO_CONFORMANCE_STACKS="$OUT/stacks"
mkdir -p "$NETIO_CONFORMANCE_STACKS"

failed=0
for run in $(seq 1 "$RUNS"); do
    busy=()
    for _ in $(seq 1 "$CORES"); do
        timeout 1800 sh -c 'while :; do :; done' &
        busy+=("$!")
    done
    ok=1
    for suite in "${BINS[@]}"; do
        name="$(basename "$suite")"
        if ! (cd netio-libfabric && "$suite" >"$OUT/run-$run-$name.log" 2>&1); then
            ok=0
        fi
    done
    kill "${busy[@]}" 2>/dev/null || true
    wait "${busy[@]}" 2>/dev/null || true
    if [ "$ok" = 1 ]; then
        rm -f "$OUT"/run-"$run"-*.log
        echo "run $run: passed"
    else
        failed=$((failed + 1))
        echo "run $run: FAILED (logs in $OUT/run-$run-*.log)"
    fi
done
echo "$((RUNS - failed)) of $RUNS runs passed under load ($CORES busy processes)"
[ "$failed" = 0 ]
