#!/usr/bin/env bash
# The differential fuzzer's long campaign: builds every accepted form of
# every pass at random, mutates it, fuses it, and runs original and fused
# model through ONNX Runtime (tests/fuzz.rs). Prints the tally per pass;
# exits non-zero on any false fusion (the models land in
# target/tmp/fuzz-failures/; move each into testdata/fuzz/ as a regression).
# Usage: scripts/fuzz.sh [--minutes N] [--seed S] [--all-passes]
#   (default 5 minutes, seed from the clock; --all-passes: every case with
#   every pass at once, where only false fusions count)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=5
seed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --all-passes) export FUZZ_ALL_PASSES=1; shift ;;
    *) echo "usage: scripts/fuzz.sh [--minutes N] [--seed S] [--all-passes]" >&2; exit 2 ;;
  esac
done
scripts/fetch-ort.sh >/dev/null
export FUZZ_SECONDS=$(( minutes * 60 ))
[ -n "$seed" ] && export FUZZ_SEED="$seed"
exec cargo test --release --test fuzz campaign_until_deadline -- --ignored --nocapture
