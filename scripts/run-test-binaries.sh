#!/usr/bin/env bash
# Builds the workspace's test binaries (unit, integration, conformance)
# and runs them JOBS at a time (default 3) instead of one after another as
# `cargo test` does: most of their time is spent waiting (timeouts, peers,
# sleeps), so the machine's cores are mostly idle when they run in a row.
# Each binary runs from its package's directory, as under `cargo test`;
# its output is printed whole when it ends, and the script fails if any
# binary failed. The documentation tests then run through `cargo test
# --doc`.
#
#   bash scripts/run-test-binaries.sh [cargo test options...]
#   JOBS=1 bash scripts/run-test-binaries.sh        # one at a time
#
# Options (e.g. `--locked`) go to both cargo invocations. Environment
# variables (NETIO_REQUIRE_NETNS, ...) reach every binary.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS="${JOBS:-3}"
work="$(mktemp -d -t netio-test-binaries.XXXXXX)"
trap 'rm -rf "$work"' EXIT

# One line per test binary: its package directory, then the executable.
cargo test --workspace "$@" --no-run --message-format=json-render-diagnostics \
    >"$work/build.json"
sed -n '/"profile":{[^}]*"test":true/{
        s/.*"manifest_path":"\([^"]*\)\/Cargo.toml".*"executable":"\([^"]*\)".*/\1 \2/p
    }' "$work/build.json" | sort -u >"$work/binaries"
if [ ! -s "$work/binaries" ]; then
    echo "error: cargo test --no-run listed no test binaries" >&2
    exit 1
fi

# The longest binaries start first, so that none of them is left running
# alone at the end.
{
    grep -E '/(self_test|conformance[a-z0-9_]*|close_race|stream|soak)-[0-9a-f]+$' \
        "$work/binaries" || true
    grep -vE '/(self_test|conformance[a-z0-9_]*|close_race|stream|soak)-[0-9a-f]+$' \
        "$work/binaries" || true
} >"$work/order"
echo "running $(wc -l <"$work/binaries") test binaries, $JOBS at a time"

export work
run_one() {
    local dir="$1" exe="$2" name
    name="$(basename "$exe")"
    local start=$SECONDS rc=0
    (cd "$dir" && "$exe") >"$work/$name.out" 2>&1 || rc=$?
    {
        printf '\n     Running %s (%s, %ds)\n' "${exe#"$PWD"/}" "${dir##*/}" $((SECONDS - start))
        cat "$work/$name.out"
        if [ "$rc" -ne 0 ]; then
            printf 'error: test binary %s failed (exit %d)\n' "$name" "$rc"
        fi
    } >"$work/$name.report"
    # Whole reports, one at a time.
    flock "$work/print.lock" cat "$work/$name.report"
    if [ "$rc" -ne 0 ]; then
        echo "$name" >>"$work/failed"
    fi
    return 0
}
export -f run_one
xargs -a "$work/order" -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"'

printf '\n     Running the documentation tests (cargo test --doc)\n'
doc_rc=0
cargo test --workspace "$@" --doc || doc_rc=$?

if [ -s "$work/failed" ]; then
    # A failing binary's report was printed when it ended, possibly far
    # above; its failures are repeated here so that the end of the log,
    # which is what a truncated log keeps, says which tests failed and why.
    while read -r name; do
        printf '\n     Failures of %s, repeated\n' "$name"
        if grep -q '^failures:$' "$work/$name.out"; then
            sed -n '/^failures:$/,$p' "$work/$name.out" | tail -n 150
        else
            tail -n 60 "$work/$name.out"
        fi
    done <"$work/failed"
    echo "error: failed test binaries: $(tr '\n' ' ' <"$work/failed")" >&2
    exit 1
fi
exit "$doc_rc"
