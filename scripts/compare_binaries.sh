#!/usr/bin/env bash
# Compares two onnx-fuse binaries on every testdata export, in each of the
# configurations users run (default, --keep-opset, both targets, --opset 23,
# every pass): the fused counts per pass, the output bytes and the reports
# (with --explain: notes and declined candidates). Prints one
# line per difference and a closing tally; exits 1 where a count differs.
#   scripts/compare_binaries.sh OLD NEW [CONFIG...]
set -uo pipefail
old="$(realpath "$1")"; new="$(realpath "$2")"; shift 2
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=("" "--keep-opset" "--target portable" "--target portable --opset 23" "--passes default,skip-norm,complex-mul,pack-matmul")
cd "$(dirname "$0")/../testdata"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
counts=0; bytes=0; reports=0; runs=0
# The report without the paths it names.
report_of() { python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); [r.pop(k, None) for k in ("input", "output")]; print(json.dumps(r, sort_keys=True))' "$1" 2>/dev/null; }
counts_of() { python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(*("%s=%d" % (p["name"], p["fused"]) for p in r["passes"]))' "$1" 2>/dev/null || echo "exit"; }
while read -r name; do
  for config in "${configs[@]}"; do
    runs=$((runs + 1))
    # shellcheck disable=SC2086
    mkdir -p "$tmp/old" "$tmp/new"
    "$old" "$name" -o "$tmp/old/out.onnx" -q --report-json "$tmp/old.json" --explain $config >/dev/null 2>&1; a=$?
    # shellcheck disable=SC2086
    "$new" "$name" -o "$tmp/new/out.onnx" -q --report-json "$tmp/new.json" --explain $config >/dev/null 2>&1; b=$?
    ca="$a $(counts_of "$tmp/old.json")"; cb="$b $(counts_of "$tmp/new.json")"
    if [ "$ca" != "$cb" ]; then
      counts=$((counts + 1)); echo "COUNTS $name [$config]: $ca -> $cb"
    elif ! diff -rq "$tmp/old" "$tmp/new" >/dev/null; then
      bytes=$((bytes + 1))
      core=$(grep -c AttentionCore "$tmp/new/out.onnx" 2>/dev/null || true)
      echo "BYTES $name [$config]$([ "${core:-0}" != 0 ] && echo ' (AttentionCore)')"
    fi
    if [ "$(report_of "$tmp/old.json")" != "$(report_of "$tmp/new.json")" ]; then
      reports=$((reports + 1)); echo "REPORT $name [$config]"
    fi
    rm -rf "$tmp/old" "$tmp/new" "$tmp"/*.json
  done
done < <(find . -name '*.onnx' -not -path './fuzz/*' -not -path './golden/*' | sed 's|^\./||' | LC_ALL=C sort)
echo "compare_binaries: $runs runs, $counts with other counts, $bytes with other bytes, $reports with other reports (--explain)"
[ "$counts" -eq 0 ]
