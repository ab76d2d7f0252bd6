#!/usr/bin/env bash
# Runs the test command's verbs checks one after another inside one guest
# of scripts/verbs-guest.sh (one boot instead of one per check), each
# bounded by its own time limit, every check run even when one before it
# failed. Prints each check's outcome and time at the end; exits 0 when
# all passed, 1 otherwise.
#
#   bash scripts/verbs-guest.sh --timeout 1500 -- bash scripts/verbs-guest-tests.sh \
#       SUITE RDM_SUITE MR_CACHE STREAM EXAMPLES_DIR
#
# SUITE, RDM_SUITE, MR_CACHE and STREAM are the test binaries of
# netio-libfabric's conformance_verbs, conformance_rdm_verbs, mr_cache and
# stream tests (built with the `verbs-conformance` feature); EXAMPLES_DIR
# holds the release `pingpong` and `echo_tcp` programs built with the
# `libfabric` feature (scripts/verbs-examples.sh). NETIO_LF_STREAM_RUNS
# sets the stream tests' runs (default 2 here).
set -uo pipefail
[ $# -eq 5 ] || {
    sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0" >&2
    exit 2
}
[ -n "${NETIO_VERBS_ADDR:-}" ] || {
    echo "verbs-guest-tests: run inside scripts/verbs-guest.sh" >&2
    exit 2
}
SUITE="$1" RDM_SUITE="$2" MR_CACHE="$3" STREAM="$4" EXAMPLES="$5"
HERE="$(cd "$(dirname "$0")" && pwd)"

results=()
failed=0
# check NAME LIMIT CMD...: runs CMD with at most LIMIT seconds.
check() {
    local name="$1" limit="$2" started=$SECONDS status
    shift 2
    printf '\n==> verbs: %s\n' "$name"
    timeout --kill-after=10 "$limit" "$@"
    status=$?
    local took=$((SECONDS - started))
    if [ "$status" = 0 ]; then
        results+=("$(printf '  %4ds  ok      %s' "$took" "$name")")
    else
        failed=1
        [ "$status" = 124 ] && name="$name (over its ${limit} s)"
        results+=("$(printf '  %4ds  FAILED  %s (exit %d)' "$took" "$name" "$status")")
    fi
}

# The conformance suite on verbs connected endpoints, both thread modes.
check "conformance on verbs" 600 "$SUITE" --test-threads=4
# Reliable datagrams over verbs;ofi_rxm on the same device.
check "conformance on verbs;ofi_rxm" 600 "$RDM_SUITE" --test-threads=4
# Domains opened and closed while other threads free memory (libfabric's
# registration cache monitor; tests/mr_cache.rs).
check "registration cache" 300 "$MR_CACHE" --test-threads=1
NETIO_LF_STREAM_RUNS="${NETIO_LF_STREAM_RUNS:-2}" \
    check "streams on verbs and verbs;ofi_rxm" 600 \
    "$STREAM" on_verbs on_rdm_verbs --test-threads=1
check "example programs" 300 bash "$HERE/verbs-examples.sh" "$EXAMPLES"

printf '\n==> verbs checks in the guest\n'
printf '%s\n' "${results[@]}"
exit "$failed"
