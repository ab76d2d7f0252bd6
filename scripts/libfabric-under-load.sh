#!/usr/bin/env bash
# Runs the libfabric conformance suites (tcp and sockets, both thread modes)
# RUNS times in a row, each beside one busy process per core, and counts
# the runs that failed. A failed run's output is kept in $OUT.
#
#   bash scripts/libfabric-under-load.sh [RUNS]     (default 30)
#
# The busy processes are bounded in time (the suite's run time plus a
# margin) and killed when a run ends.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${1:-30}"
OUT="${OUT:-target/libfabric-under-load}"
mkdir -p "$OUT"

cargo test --release --locked -p netio-libfabric \
    --test conformance_tcp --test conformance_sockets --no-run 2>&1 | tail -n 2
bin() {
    cargo test --release --locked -p netio-libfabric --test "$1" --no-run \
        --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1
}
TCP="$(bin conformance_tcp)"
SOCKETS="$(bin conformance_sockets)"
CORES="$(nproc)"

failed=0
for run in $(seq 1 "$RUNS"); do
    busy=()
    for _ in $(seq 1 "$CORES"); do
        timeout 600 sh -c 'while :; do :; done' &
        busy+=("$!")
    done
    ok=1
    for suite in "$TCP" "$SOCKETS"; do
        name="$(basename "$suite")"
        if ! (cd netio-libfabric && "$suite" >"../$OUT/run-$run-$name.log" 2>&1); then
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
