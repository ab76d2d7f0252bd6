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

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet

step "loom models (netio-core, --cfg loom)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}" RUSTFLAGS="--cfg loom" \
    CARGO_TARGET_DIR=target/loom \
    cargo test -p netio-core --lib --release --locked -- loom

step "cargo test --workspace"
cargo test --workspace --locked
