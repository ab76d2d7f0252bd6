#!/usr/bin/env bash
# Measures the libfabric provider on real verbs (soft-RoCE) against
# libfabric's fi_pingpong and perftest's ib_send_lat / ib_send_bw, in one
# guest run, alternated. Run it inside the guest of scripts/verbs-guest.sh:
#
#   cargo build --release -p netio-perf --features libfabric
#   bash scripts/verbs-guest.sh --timeout 1200 -- bash scripts/verbs-bench.sh target/release
#
# The guest does not inherit the environment: to change RUNS, COUNT,
# RATE_COUNT, BW_COUNT, NETIO_PERF_FLAGS (more netio-perf options for its
# server and client alike, such as --thread-unsafe) or PINGPONG_ONLY (1:
# the round trips only, no rate or bandwidth), pass them through
# `env` inside the guest command
# (`-- env RUNS=3 bash scripts/verbs-bench.sh target/release`). Run it on a
# quiet host: a busy host stalls the emulated CPUs unevenly.
#
# Each of RUNS rounds (default 5) runs, every program busy polling, each as a
# server and a client process on the guest's soft-RoCE address:
#   - netio-perf pingpong 64 B (COUNT round trips, default 10000), then
#     fi_pingpong -p verbs -e msg -S 64 -I COUNT, then ib_send_lat -s 64;
#   - netio-perf rate 64 B (RATE_COUNT messages, default 50000), then
#     ib_send_bw -s 64;
#   - netio-perf bw 64 KiB (BW_COUNT messages, default 2000), copy sends
#     and zero-copy sends (from a registered region, as ib_send_bw sends),
#     then ib_send_bw -s 65536.
# Each program's output is captured whole and parsed after it exits: a
# parser started beside a busy-polling run (a pipe) takes one of the
# guest's two emulated CPUs from it. Prints one line per measurement, then the median of each
# figure over the rounds and the ratios netio / baseline (of the medians,
# and the median and range of the per-round ratios).
#
# Soft-RoCE under software emulation: absolute figures mean little (the
# guest computes 13-15x slower than the host, and a busy host slows it
# further); only the ratios of one run mean anything. The guest's default
# clock is the emulated HPET, where every clock read is a system call and a
# device read: netio's loop and netio-perf's per-round-trip sample read the
# clock, fi_pingpong does not, so for figures closer to real hardware (a
# clock read in user space) boot the guest on TSC:
#   NETIO_GUEST_APPEND="clocksource=tsc tsc=reliable" bash scripts/verbs-guest.sh ...
set -euo pipefail

bin="${1:-target/release}"
addr="${NETIO_VERBS_ADDR:-169.254.77.1}"
dev="${NETIO_VERBS_DOMAIN:-rxe0}"
runs="${RUNS:-5}"
count="${COUNT:-10000}"
rate_count="${RATE_COUNT:-50000}"
bw_count="${BW_COUNT:-2000}"
extra="${NETIO_PERF_FLAGS:-}"
pingpong_only="${PINGPONG_ONLY:-0}"
perf="$bin/netio-perf"
[ -x "$perf" ] || { echo "verbs-bench: no $perf (build netio-perf with --features libfabric)" >&2; exit 2; }
for tool in fi_pingpong ib_send_lat ib_send_bw python3; do
    command -v "$tool" >/dev/null || { echo "verbs-bench: $tool is missing" >&2; exit 2; }
done
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
results="$out/results.txt"
: >"$results"

# Waits until `file` has a line matching `pattern` (bounded: 20 s).
wait_for() {
    local file="$1" pattern="$2" i
    for i in $(seq 1 200); do
        grep -q "$pattern" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "verbs-bench: timed out waiting for '$pattern' in $file:" >&2
    cat "$file" >&2
    return 1
}

# The median figure `key` of netio-perf's JSON on stdin (`mean_rtt_us`:
# the mean round trip, 1e6 / round trips per second).
metric() {
    python3 -c '
import json, sys
key = sys.argv[1]
try:
    doc = json.load(sys.stdin)
except ValueError:
    print("nan"); sys.exit(0)
for result in doc.get("results", []):
    for f in result.get("figures", []):
        if key == "mean_rtt_us" and f["key"] == "round_trips_per_s":
            print(1e6 / f["provider"]["median"]); sys.exit(0)
        if f["key"] == key:
            print(f["provider"]["median"]); sys.exit(0)
print("nan")' "$1"
}

record() {
    # record NAME VALUE UNIT
    echo "$1 $2 $3" | tee -a "$results"
}

port=7100
netio_run() {
    # netio_run ARGS...: one netio-perf client run against a fresh server.
    port=$((port + 1))
    # shellcheck disable=SC2086 # the extra flags are words
    timeout 300 "$perf" --listen "$addr:$port" --provider libfabric --fabric verbs --busy-poll \
        $extra --serve-for 280 >"$out/server.txt" 2>&1 &
    local spid=$!
    wait_for "$out/server.txt" "listening"
    # shellcheck disable=SC2086
    timeout 240 "$perf" "$@" --connect "$addr:$port" --provider libfabric --fabric verbs \
        --busy-poll $extra --runs 1 --json - 2>"$out/client.err" || cat "$out/client.err" >&2
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
}

# pair SERVER_FLAGS CLIENT_FLAGS PROGRAM ARGS...: PROGRAM ARGS SERVER_FLAGS
# as a server in the background, then PROGRAM ARGS CLIENT_FLAGS ADDRESS as
# its client, whose output is printed; PORT in the flags is a fresh port.
pair() {
    port=$((port + 1))
    local server_flags="${1//PORT/$port}" client_flags="${2//PORT/$port}"
    shift 2
    # shellcheck disable=SC2086 # the flags are words
    timeout 120 "$@" $server_flags >"$out/pair-server.txt" 2>&1 &
    local spid=$!
    sleep 1
    # shellcheck disable=SC2086
    timeout 120 "$@" $client_flags "$addr" 2>&1 || true
    wait "$spid" 2>/dev/null || true
}

for i in $(seq 1 "$runs"); do
    echo "== round $i of $runs"
    txt="$(netio_run pingpong --sizes 64 --count "$count" --warmup 200)"
    rt="$(printf '%s' "$txt" | metric mean_rtt_us)"
    record netio_pingpong_64_rtt_us "$rt" us
    # fi_pingpong: usec/xfer is one transfer; a round trip is two.
    txt="$(pair "-B PORT" "-P PORT" fi_pingpong -p verbs -e msg -d "$dev" -S 64 -I "$count")"
    fi="$(printf '%s\n' "$txt" | awk '$1 ~ /^[0-9]/ { print 2 * $(NF-1) }' | tail -1)"
    record fi_pingpong_64_rtt_us "${fi:-nan}" us
    # ib_send_lat: t_avg is one way; a round trip is two.
    txt="$(pair "-p PORT" "-p PORT" ib_send_lat -d "$dev" -R -s 64 -n "$count")"
    lat="$(printf '%s\n' "$txt" | awk '$1 == 64 && NF >= 6 { print 2 * $6 }' | tail -1)"
    record ib_send_lat_64_rtt_us "${lat:-nan}" us

    [ "$pingpong_only" = 1 ] && continue
    txt="$(netio_run rate --sizes 64 --count "$rate_count" --warmup 2000)"
    rate="$(printf '%s' "$txt" | metric messages_per_s)"
    record netio_rate_64 "$rate" msg/s
    txt="$(pair "-p PORT" "-p PORT" ib_send_bw -d "$dev" -R -s 64 -n "$rate_count")"
    bw64="$(printf '%s\n' "$txt" | awk '$1 == 64 && NF >= 5 { print $5 * 1e6 }' | tail -1)"
    record ib_send_bw_rate_64 "${bw64:-nan}" msg/s

    txt="$(netio_run bw --sizes 64k --count "$bw_count" --warmup 100)"
    bw="$(printf '%s' "$txt" | metric bandwidth)"
    record netio_bw_64k "$bw" B/s
    # Sent from a registered region with no copy, as ib_send_bw sends.
    txt="$(netio_run bw --sizes 64k --mode zero-copy --count "$bw_count" --warmup 100)"
    bwz="$(printf '%s' "$txt" | metric bandwidth)"
    record netio_bw_64k_zero_copy "$bwz" B/s
    txt="$(pair "-p PORT" "-p PORT" ib_send_bw -d "$dev" -R -s 65536 -n "$bw_count")"
    ibw="$(printf '%s\n' "$txt" | awk '$1 == 65536 && NF >= 5 { print $4 * 1e6 }' | tail -1)"
    record ib_send_bw_64k "${ibw:-nan}" B/s
done

python3 - "$results" <<'PY'
import math, statistics, sys
rows = {}
order = []
for line in open(sys.argv[1]):
    name, value, unit = line.split()
    if name not in rows:
        order.append(name)
    rows.setdefault(name, []).append(float(value))
def med(xs):
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else float("nan")
print("\n== medians over the rounds")
for name in order:
    print(f"{name:28} {med(rows[name]):14.4g}   (of {len(rows[name])})")
print("\n== ratios (netio / baseline): of the medians; per-round median [min-max]")
for netio, base, lower_is_better in [
    ("netio_pingpong_64_rtt_us", "fi_pingpong_64_rtt_us", True),
    ("netio_pingpong_64_rtt_us", "ib_send_lat_64_rtt_us", True),
    ("netio_rate_64", "ib_send_bw_rate_64", False),
    ("netio_bw_64k", "ib_send_bw_64k", False),
    ("netio_bw_64k_zero_copy", "ib_send_bw_64k", False),
]:
    a, b = rows.get(netio, []), rows.get(base, [])
    per = [x / y for x, y in zip(a, b) if y and not math.isnan(x) and not math.isnan(y)]
    rng = f"{statistics.median(per):.2f}x [{min(per):.2f}-{max(per):.2f}]" if per else "n/a"
    print(f"{netio} / {base}: {med(a) / med(b):.2f}x; per round {rng}"
          f" ({'lower' if lower_is_better else 'higher'} is better for netio)")
PY
