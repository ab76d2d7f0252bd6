#!/usr/bin/env bash
# Profiles a 64 B busy-polling round trip on real verbs (soft-RoCE) inside
# the guest of scripts/verbs-guest.sh: netio-perf's server and client, then
# fi_pingpong's, each server under `perf record` (cpu-clock samples) and
# `perf stat` (system calls), and prints where each server's time goes, by
# shared object and by symbol. Run it inside the guest, on a quiet host:
#
#   cargo build --release -p netio-perf --features libfabric
#   NETIO_GUEST_APPEND="clocksource=tsc tsc=reliable" \
#     bash scripts/verbs-guest.sh --timeout 600 -- bash scripts/verbs-profile.sh target/release
#
# COUNT (default 20000) round trips per program. FABRIC (default verbs)
# names another libfabric provider (tcp, on the host's loopback with
# NETIO_VERBS_ADDR=127.0.0.1 and NETIO_VERBS_DOMAIN=lo, to try the script
# out). Under emulation the shares are what counts: which code the
# emulated CPU spends its time in (an atomic instruction, a system call or
# a clock read costs far more there than its share of instructions), not
# the absolute figures.
set -euo pipefail

bin="${1:-target/release}"
addr="${NETIO_VERBS_ADDR:-169.254.77.1}"
dev="${NETIO_VERBS_DOMAIN:-rxe0}"
count="${COUNT:-20000}"
fabric="${FABRIC:-verbs}"
perf_bin="$(command -v perf)" || { echo "verbs-profile: perf is missing" >&2; exit 2; }
[ -x "$bin/netio-perf" ] || { echo "verbs-profile: no $bin/netio-perf" >&2; exit 2; }
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

# report NAME: the shares of the server's samples of NAME.
report() {
    "$perf_bin" report -i "$out/$1.data" --no-children --sort dso --stdio \
        >"$out/$1.dso" 2>/dev/null || true
    "$perf_bin" report -i "$out/$1.data" --no-children --sort dso,sym --stdio \
        >"$out/$1.sym" 2>/dev/null || true
    echo "== $1: by shared object"
    grep -v -e '^#' -e '^$' "$out/$1.dso" | head -n 12 || true
    echo "== $1: by symbol"
    grep -v -e '^#' -e '^$' "$out/$1.sym" | head -n 40 || true
    echo "== $1: system calls of the server while the client ran"
    grep -E 'syscalls|seconds' "$out/$1.stat" || true
    echo "   (threads counted: $(cat "$out/$1.threads"))"
}

# profile NAME PATTERN SERVER... -- CLIENT...: the server under perf
# record, its system calls counted (perf stat on its threads, PATTERN
# finds it)
# while the client runs; the server is stopped when the client ends; the
# client's output is printed.
profile() {
    local name="$1" pattern="$2"
    shift 2
    local server=() client=()
    while [ "$1" != "--" ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    "$perf_bin" record -F 2000 -e cpu-clock -o "$out/$name.data" -- \
        "${server[@]}" >"$out/$name.server" 2>&1 &
    local rpid=$! spid="" i
    # The newest match is the server (perf record's own command line
    # matches too, and it is older).
    sleep 0.5
    for i in $(seq 1 100); do
        spid="$(pgrep -n -f "$pattern" || true)"
        [ -n "$spid" ] && break
        sleep 0.1
    done
    sleep 2
    # Every thread of the server (its loop runs on a thread of its own):
    # `perf stat -p` counted the main thread alone.
    local tids
    tids="$(ls "/proc/$spid/task" | paste -sd, -)"
    echo "$tids" | tr ',' '\n' | wc -l >"$out/$name.threads"
    "$perf_bin" stat -e raw_syscalls:sys_enter -t "$tids" -o "$out/$name.stat" &
    local stat_pid=$!
    timeout 240 "${client[@]}" 2>&1 | tail -5 || true
    kill -INT "$stat_pid" 2>/dev/null || true
    wait "$stat_pid" 2>/dev/null || true
    kill "$spid" 2>/dev/null || true
    wait "$rpid" 2>/dev/null || true
    report "$name"
}

port=7300
port=$((port + 1))
# netio-perf's server is stopped when its client ends (--serve-for bounds it).
profile netio "netio-perf --listen" "$bin/netio-perf" --listen "$addr:$port" --provider libfabric \
    --fabric "$fabric" --busy-poll --serve-for 200 -- \
    "$bin/netio-perf" pingpong --sizes 64 --count "$count" --warmup 200 --connect "$addr:$port" \
    --provider libfabric --fabric "$fabric" --busy-poll --runs 1
port=$((port + 1))
fi=(fi_pingpong -p "$fabric" -e msg -d "$dev" -S 64 -I "$count")
profile fi_pingpong "${fi[*]} -B" "${fi[@]}" -B "$port" -- "${fi[@]}" -P "$port" "$addr"
