#!/usr/bin/env bash
# Runs the example programs over libfabric `verbs` as separate server and
# client processes, on the soft-RoCE device of scripts/verbs-guest.sh's
# guest (NETIO_VERBS_ADDR). Exits non-zero if a client fails.
#
#   bash scripts/verbs-guest.sh -- bash scripts/verbs-examples.sh target/release
set -euo pipefail
BIN="${1:?the folder of the pingpong and echo_tcp programs}"
ADDR="${NETIO_VERBS_ADDR:?run inside scripts/verbs-guest.sh}"
OUT="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$OUT"' EXIT

# Starts "$@" as a server listening on $ADDR, prints the address it bound.
serve() {
    local log="$OUT/$1.log"
    "$BIN/$1" --provider libfabric --fabric verbs --listen "$ADDR:0" "${@:2}" >"$log" 2>&1 &
    for _ in $(seq 1 150); do
        if grep -qo "$ADDR:[0-9]*" "$log"; then
            grep -o "$ADDR:[0-9]*" "$log" | head -n 1
            return
        fi
        sleep 0.2
    done
    echo "the $1 server did not start:" >&2
    cat "$log" >&2
    return 1
}

addr="$(serve pingpong --count 1000)"
"$BIN/pingpong" --provider libfabric --fabric verbs --connect "$addr" --count 1000 --size 64
wait

addr="$(serve echo_tcp --clients 1 --count 1000)"
"$BIN/echo_tcp" --provider libfabric --fabric verbs --connect "$addr" --count 1000
wait
echo "the example programs ran over verbs"
