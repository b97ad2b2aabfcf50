#!/usr/bin/env bash
# Speed and memory of onnx-fuse on large models, beside `cp` of the same files.
#
#   scripts/bench.sh [BENCH_DIR]      (default: /tmp/onnx-fuse-bench)
#
# Makes (once, with scripts/bench_models.py and the testdata environment)
# a GPT-2-medium-size export in one file and a TinyLlama-size (1.1B
# parameters) export with external data, then reports wall time and peak
# RSS (GNU time) as the median of 5 runs (BENCH_ROUNDS), page cache warm,
# dirty pages flushed before each run, commands that write the same
# amount measured in rotation. onnx-fuse syncs what it writes before renaming
# it into place (a crash must not leave a half-written model), so cp is
# measured with an fsync (or sync) too.
#   1. GPT-2 medium: onnx-fuse vs cp of the file
#   2. TinyLlama, output beside the input (its weights are referenced)
#   3. TinyLlama, output in another directory vs cp -r of its folder
#   4. a synthetic 1.6 GB one-file model (scripts/bench_synthetic.py, onnx and
#      numpy only): onnx-fuse and onnx-fuse --verify
# With --synthetic only case 4 runs (no exporter environment needed: python3
# with onnx and numpy); with --gpt2 only case 1. BENCH_BASELINE=BINARY adds
# another onnx-fuse binary (an earlier commit's) to case 1's rotation.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
synthetic_only=false
gpt2_only=false
if [ "${1:-}" = "--synthetic" ]; then synthetic_only=true; shift; fi
if [ "${1:-}" = "--gpt2" ]; then gpt2_only=true; shift; fi
bench="${1:-/tmp/onnx-fuse-bench}"
mkdir -p "$bench"
if $gpt2_only && [ ! -f "$bench/gpt2-medium/model.onnx" ]; then
  HF_HUB_OFFLINE=1 "$root/.venv/bin/python" "$root/scripts/bench_models.py" "$bench" gpt2
fi
if ! $synthetic_only && ! $gpt2_only && { [ ! -f "$bench/gpt2-medium/model.onnx" ] || [ ! -f "$bench/tinyllama/model.onnx" ]; }; then
  venv="$root/.venv"
  [ -x "$venv/bin/python" ] || "$root/scripts/gen_testdata.sh" --help >/dev/null 2>&1 || true
  HF_HUB_OFFLINE=1 "$venv/bin/python" "$root/scripts/bench_models.py" "$bench"
fi
(cd "$root" && cargo build --release --quiet)
fuse="$root/target/release/onnx-fuse"

# one run of a command under GNU time: "wall system rss_kb user"
once() {
  sync  # start every run with no dirty pages from the one before
  sleep 1  # and let the disk settle (discards of removed outputs)
  "$@" >/dev/null 2>"$bench/time.err" || { cat "$bench/time.err"; exit 1; }
  python3 - "$bench/time.err" <<'PY'
import sys
t = open(sys.argv[1]).read().splitlines()
get = lambda key: next(l.rsplit(" ", 1)[1] for l in t if key in l)
wall = sum(float(p) * 60 ** i for i, p in enumerate(reversed(get("Elapsed (wall clock)").split(":"))))
print(wall, get("System time (seconds)"), get("Maximum resident"), get("User time (seconds)"))
PY
}
# median wall seconds, user and system seconds and peak RSS (MB) of runs of a command
report() {
  python3 - "$@" <<'PY'
import sys, statistics
label, runs = sys.argv[1], [r.split() for r in sys.argv[2:]]
med = lambda i: statistics.median(float(r[i]) for r in runs)
print(f"{label:<44} {med(0):8.2f} s  (user {med(3):5.2f} s, system {med(1):5.2f} s)  {med(2) / 1024:8.1f} MB  [{len(runs)} runs]")
PY
}
rounds="${BENCH_ROUNDS:-5}"
measure() {
  local label="$1"; shift
  local runs=()
  for _ in $(seq "$rounds"); do runs+=("$(once "$@")"); done
  report "$label" "${runs[@]}"
}
# Commands measured in rotation: the next writer of gigabytes pays for the
# previous one's writeback, so each round starts with another command.
# Before every run CLEANUP removes the outputs (outside the timing).
#   measure_rotating CLEANUP LABEL1 CMD1 LABEL2 CMD2 ...
measure_rotating() {
  local cleanup="$1"; shift
  local labels=() cmds=() runs=() n r k i
  while [ $# -gt 0 ]; do labels+=("$1"); cmds+=("$2"); runs+=(""); shift 2; done
  n=${#cmds[@]}
  for r in $(seq 0 $((rounds - 1))); do
    for k in $(seq 0 $((n - 1))); do
      i=$(( (k + r) % n ))
      sh -c "$cleanup"
      runs[i]+="$(once "${T[@]}" sh -c "${cmds[i]}");"
    done
  done
  sh -c "$cleanup"
  for i in $(seq 0 $((n - 1))); do
    IFS=';' read -ra each <<< "${runs[i]%;}"
    report "${labels[i]}" "${each[@]}"
  done
}
T=(/usr/bin/time -v)
size() { du -sb "$1" | awk '{printf "%.2f GB", $1/1e9}'; }

synthetic() {
  [ -f "$bench/synthetic.onnx" ] || python3 "$root/scripts/bench_synthetic.py" "$bench/synthetic.onnx"
  echo "Synthetic, one file: 24 RMSNorms ($(size "$bench/synthetic.onnx"))"
  cat "$bench/synthetic.onnx" >/dev/null
  measure_rotating "rm -f '$bench/cp.onnx' '$bench/fused.onnx'" \
    "  cp + fsync" "cp '$bench/synthetic.onnx' '$bench/cp.onnx' && sync '$bench/cp.onnx'" \
    "  onnx-fuse" "'$fuse' -q '$bench/synthetic.onnx' -o '$bench/fused.onnx'"
  measure "  onnx-fuse --verify (batch 2, seq 16)" "${T[@]}" "$fuse" -q --verify --dim seq=16 "$bench/synthetic.onnx" -o "$bench/fused.onnx"
  rm -f "$bench/cp.onnx" "$bench/fused.onnx"
  # An export folder of two such models and a config, against cp -r.
  mkdir -p "$bench/folder"
  for m in encoder_model decoder_model; do [ -f "$bench/folder/$m.onnx" ] || cp "$bench/synthetic.onnx" "$bench/folder/$m.onnx"; done
  echo '{"model_type": "synthetic"}' > "$bench/folder/config.json"
  echo "Synthetic export folder: two models and a config ($(size "$bench/folder"))"
  cat "$bench"/folder/* >/dev/null
  measure_rotating "rm -rf '$bench/cp' '$bench/out'" \
    "  cp -r + sync" "cp -r '$bench/folder' '$bench/cp' && sync" \
    "  onnx-fuse FOLDER -o OUT" "'$fuse' -q '$bench/folder' -o '$bench/out'"
}
if $synthetic_only; then synthetic; exit 0; fi

echo "GPT-2 medium, one file ($(size "$bench/gpt2-medium/model.onnx"))"
cat "$bench/gpt2-medium/model.onnx" >/dev/null
baseline=()
if [ -n "${BENCH_BASELINE:-}" ]; then
  baseline=("  onnx-fuse $(basename "$BENCH_BASELINE") (baseline)" "'$BENCH_BASELINE' -q '$bench/gpt2-medium/model.onnx' -o '$bench/base.onnx'")
fi
measure_rotating "rm -f '$bench/cp.onnx' '$bench/fused.onnx' '$bench/base.onnx'" \
  "  cp + fsync" "cp '$bench/gpt2-medium/model.onnx' '$bench/cp.onnx' && sync '$bench/cp.onnx'" \
  "  onnx-fuse" "'$fuse' -q '$bench/gpt2-medium/model.onnx' -o '$bench/fused.onnx'" \
  "${baseline[@]}"
"$fuse" "$bench/gpt2-medium/model.onnx" -o "$bench/fused.onnx" 2>&1 | sed 's/^/  /'
rm -f "$bench/cp.onnx" "$bench/fused.onnx"
if $gpt2_only; then exit 0; fi

echo "TinyLlama 1.1B, external data ($(size "$bench/tinyllama"))"
cat "$bench"/tinyllama/* >/dev/null
measure "  onnx-fuse, output beside the input" "${T[@]}" "$fuse" -q "$bench/tinyllama/model.onnx" -o "$bench/tinyllama/fused.onnx"
rm -f "$bench/tinyllama/fused.onnx"
measure_rotating "rm -rf '$bench/cp' '$bench/out' && mkdir '$bench/out'" \
  "  cp -r of the folder + sync" "cp -r '$bench/tinyllama' '$bench/cp' && sync" \
  "  onnx-fuse, output in another directory" "'$fuse' -q '$bench/tinyllama/model.onnx' -o '$bench/out/fused.onnx'"
mkdir -p "$bench/out"
"$fuse" "$bench/tinyllama/model.onnx" -o "$bench/out/fused.onnx" 2>&1 | sed 's/^/  /'
rm -rf "$bench/cp" "$bench/out"
synthetic
