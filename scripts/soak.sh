#!/usr/bin/env bash
# Soak: the kill -9 loop of tests/api/crash.rs for 200 cycles (or $1), in release mode.
# CTXD_CRASH_SEED=N replays the kill moments of a failed run, which prints its seed first.
set -euo pipefail
cd "$(dirname "$0")/.."

CTXD_CRASH_CYCLES="${1:-200}" exec cargo test --release --locked --test api crash:: -- --nocapture
