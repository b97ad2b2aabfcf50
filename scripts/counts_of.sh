#!/usr/bin/env bash
# Prints what a given onnx-fuse binary's default pipeline fuses per pass on
# every testdata export, one line per model: `NAME pass=N pass=N ...`.
# testdata/golden/counts_before_skip_norm.txt was written so, by the binary
# of 13fdc48 (the last commit before the skip-norm and gelu passes, whose
# default pipeline was layer-norm, rms-norm and attention):
#   git worktree add /tmp/old 13fdc48 && cargo build --release --manifest-path /tmp/old/Cargo.toml
#   scripts/counts_of.sh /tmp/old/target/release/onnx-fuse > testdata/golden/counts_before_skip_norm.txt
set -euo pipefail
bin="$(realpath "$1")"
cd "$(dirname "$0")/../testdata"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
find . -name '*.onnx' -not -path './fuzz/*' | sed 's|^\./||' | LC_ALL=C sort | while read -r name; do
  "$bin" "$name" -o "$tmp/out.onnx" -q --report-json "$tmp/r.json" || { echo "$name: exit $?" >&2; continue; }
  python3 -c 'import json, sys; r = json.load(open(sys.argv[2])); print(sys.argv[1], *("%s=%d" % (p["name"], p["fused"]) for p in r["passes"]))' "$name" "$tmp/r.json"
  rm -f "$tmp/out.onnx" "$tmp"/*.onnx_data
done
