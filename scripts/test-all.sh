#!/usr/bin/env bash
# Runs every check and test of the workspace, as CI does.
#
#   bash scripts/test-all.sh
#
# Steps: formatting, clippy (warnings are errors), the whole test suite
# (unit, integration, conformance on every provider, property tests), the
# loom models of the shared-state pieces, and the docs (warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."

# Every test binary's output also goes to a log, from which the closing
# line counts the tests: `N passed, N failed, N ignored` (also when a step
# fails, with the step named), and how long each step took.
log="$(mktemp -t netio-test-all.XXXXXX)"
current="setting up"
started=$SECONDS
step_started=$SECONDS
timings=""
step() {
    timings+="$(printf '  %4ds  %s' $((SECONDS - step_started)) "$current")"$'\n'
    current="$*"
    step_started=$SECONDS
    printf '\n==> %s   (at %ds)\n' "$*" $((SECONDS - started))
}
summary() {
    local status=$?
    timings+="$(printf '  %4ds  %s' $((SECONDS - step_started)) "$current")"$'\n'
    local counts
    counts="$(awk '/^test result:/ {
            for (i = 1; i < NF; i++) {
                if ($(i + 1) ~ /^passed/) p += $i
                if ($(i + 1) ~ /^failed/) f += $i
                if ($(i + 1) ~ /^ignored/) g += $i
            }
        } END { printf "%d passed, %d failed, %d ignored", p, f, g }' "$log")"
    printf '\n==> time per step\n%s' "$timings"
    if [ "$status" -eq 0 ]; then
        printf '==> all steps passed in %ds: %s\n' $((SECONDS - started)) "$counts"
    else
        printf '==> FAILED in step "%s" (exit %d) after %ds: %s\n' \
            "$current" "$status" $((SECONDS - started)) "$counts"
    fi
    rm -f "$log"
}
trap summary EXIT
# run CMD...: runs a test command, its output also kept for the summary.
run() {
    "$@" 2>&1 | tee -a "$log"
}

# The TCP conformance suite resets connections with `ss -K` (iproute2).
if ! command -v ss >/dev/null 2>&1; then
    step "installing iproute2 (ss) for the TCP conformance suite's resets"
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq iproute2
    else
        echo "error: 'ss' (iproute2) is missing and cannot be installed here (needs root and apt-get)" >&2
        exit 1
    fi
fi

# The multi-host tests (netio-tcp/tests/multihost.rs) drop a namespace's
# traffic with iptables.
if ! command -v iptables >/dev/null 2>&1; then
    step "installing iptables for the multi-host tests"
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq iptables
    else
        echo "error: 'iptables' is missing and cannot be installed here (needs root and apt-get)" >&2
        exit 1
    fi
fi

# netio-libfabric-sys links the system libfabric (>= 1.17), found with
# pkg-config; its tests use the tcp and sockets providers on 127.0.0.1.
if ! pkg-config --exists 'libfabric >= 1.17' 2>/dev/null; then
    step "installing libfabric-dev, libfabric-bin and pkg-config for netio-libfabric-sys"
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && apt-get install -y -qq libfabric-dev libfabric-bin pkg-config
    else
        echo "error: libfabric >= 1.17 (pkg-config 'libfabric') is missing and cannot be installed here (needs root and apt-get)" >&2
        exit 1
    fi
    if ! pkg-config --exists 'libfabric >= 1.17'; then
        echo "error: libfabric >= 1.17 is still not found by pkg-config after installing libfabric-dev" >&2
        exit 1
    fi
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

# The event loop's models (posting, stop, timers, signals) run with three
# preemptions (about 11 s here); the buffer pool's and free list's, which
# take over a minute at three, with two.
step "loom models (netio-core, --cfg loom)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg loom" \
    CARGO_TARGET_DIR=target/loom \
    run cargo test -p netio-core --lib --release --locked -- mio_loop::
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" RUSTFLAGS="--cfg loom" \
    CARGO_TARGET_DIR=target/loom \
    run cargo test -p netio-core --lib --release --locked -- loom --skip mio_loop::

# What `cargo test --workspace` runs, three test binaries at a time
# (scripts/run-test-binaries.sh), then the documentation tests.
step "cargo test --workspace (test binaries three at a time)"
NETIO_REQUIRE_NETNS=1 run bash scripts/run-test-binaries.sh --locked

# The facade and the example programs select libfabric by name only when
# built with their `libfabric` feature, which the workspace run leaves off.
step "libfabric through the facade and the example programs (feature libfabric)"
cargo clippy --locked -p netio -p netio-examples -p netio-perf \
    --features netio/libfabric,netio-examples/libfabric,netio-perf/libfabric \
    --all-targets -- -D warnings
run cargo test --locked -p netio --features libfabric --test libfabric
run cargo test --locked -p netio-examples --features libfabric --test libfabric
run cargo test --locked -p netio-perf --features libfabric --test fi_baseline

# Real verbs: the conformance suite (both thread modes, on verbs and on
# reliable datagrams over verbs;ofi_rxm), the stream tests (on both)
# and the example programs on libfabric `verbs` over soft-RoCE, inside an
# emulated guest that scripts/verbs-guest.sh boots (it installs qemu, the
# kernel and the RDMA user-space packages when they are missing). Test
# binaries are built here and run in the guest, all in one boot.
step "libfabric verbs on soft-RoCE in an emulated guest"
cargo clippy --locked -p netio-libfabric --features verbs-conformance --all-targets -- -D warnings
# Release builds: the emulated guest runs them in about half the time of
# debug builds.
verbs_bins="$(cargo test --release --locked -p netio-libfabric --features verbs-conformance \
    --test conformance_verbs --test conformance_rdm_verbs --test stream --test mr_cache --no-run \
    --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p')"
verbs_suite="$(printf '%s\n' "$verbs_bins" | grep '/conformance_verbs-')"
verbs_rdm_suite="$(printf '%s\n' "$verbs_bins" | grep '/conformance_rdm_verbs-')"
verbs_stream="$(printf '%s\n' "$verbs_bins" | grep '/stream-')"
verbs_mr_cache="$(printf '%s\n' "$verbs_bins" | grep '/mr_cache-')"
cargo build --locked --release -p netio-examples --features libfabric --bin pingpong --bin echo_tcp
# One guest boot runs them all (scripts/verbs-guest-tests.sh says what
# each check is and its time limit).
guest_started=$SECONDS
NETIO_LF_STREAM_RUNS="${NETIO_LF_STREAM_RUNS_VERBS:-2}" \
    run bash scripts/verbs-guest.sh --timeout 2400 -- bash scripts/verbs-guest-tests.sh \
    "$verbs_suite" "$verbs_rdm_suite" "$verbs_mr_cache" "$verbs_stream" target/release
printf '==> the guest took %ds, boot included\n' $((SECONDS - guest_started))
