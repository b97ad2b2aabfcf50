#!/usr/bin/env bash
# What users gain where they run the model (docs/benchmarks.md, "Run time"):
# ONNX Runtime 1.31.1 CPU, 2 threads, ORT_ENABLE_ALL, on
#   - the export (Optimum, past and present separate),
#   - onnx-fuse's output of it (the everyday command, no flag),
#   - the onnxruntime-genai model builder's output of the same random weights
#     (decoders; run as the export's inputs and outputs are: past and present
#     separate),
# for a Llama with grouped heads (hidden 1,024, 8 layers, 16 heads, 4 KV
# heads), GPT-2 (124M) and BERT-base (and, when asked for by name,
# tinyllama: TinyLlama's shape, 1.1B, 22 layers, 32 heads over 4 KV heads,
# an export with external data). Decode is one token after a past of
# 128 to 4,096; prefill 128 and 2,048 tokens (BERT: 128 and 512), with peak
# memory. Models are measured in alternation, ratios from the same rounds.
#
#   scripts/bench_decode.sh [BENCH_DIR] [KIND ...]   (default: /tmp/onnx-fuse-decode; kinds llama gpt2 bert; also tinyllama)
#
# Makes, once: the models (scripts/bench_decode_models.py, in .venv:
# torch, transformers, optimum, as scripts/gen_testdata.sh pins them) and the
# builder's model (target/genai: onnxruntime-genai with the transformers it
# needs, from PyPI; it builds from the save_pretrained folder, nothing from a
# hub). BENCH_ROUNDS sets the rounds (default 7), BENCH_BINARY another
# onnx-fuse binary.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bench="${1:-/tmp/onnx-fuse-decode}"
rounds="${BENCH_ROUNDS:-7}"
mkdir -p "$bench"
venv="$root/.venv"
[ -x "$venv/bin/python" ] || "$root/scripts/gen_testdata.sh" --help >/dev/null 2>&1 || true
kinds="${*:2}"
# tinyllama only when asked for by name: 4.4 GB of weights, five copies on disk
# (hf, export, fused, fused-apart, builder), 14 GB of memory to export.
extra=""; case " $kinds " in *" tinyllama "*) extra=tinyllama ;; esac
HF_HUB_OFFLINE=1 "$venv/bin/python" "$root/scripts/bench_decode_models.py" "$bench" llama gpt2 bert $extra
genai="$root/target/genai"
if [ ! -x "$genai/bin/python" ]; then
  python3 -m venv "$genai"
  "$genai/bin/pip" install --quiet onnxruntime-genai onnx-ir transformers torch==2.9.1 numpy
fi
for kind in llama $extra; do
  if [ ! -f "$bench/$kind/builder/model.onnx" ]; then
    HF_HUB_OFFLINE=1 "$genai/bin/python" -m onnxruntime_genai.models.builder -i "$bench/$kind/hf" \
      -o "$bench/$kind/builder" -p fp32 -e cpu -c "$bench/genai-cache"
  fi
done
"$genai/bin/pip" list 2>/dev/null | grep -i "^onnxruntime-genai " | sed 's/^/builder: /'
fuse="${BENCH_BINARY:-$root/target/release/onnx-fuse}"
[ -n "${BENCH_BINARY:-}" ] || (cd "$root" && cargo build --release --quiet)
for kind in llama gpt2 bert $extra; do
  rm -rf "$bench/$kind/fused" "$bench/$kind/fused-apart"
  "$fuse" "$bench/$kind/export" -o "$bench/$kind/fused" -q
  # The same with its weights beside it (--external-data): what ONNX
  # Runtime maps rather than copies (peak memory).
  "$fuse" "$bench/$kind/export" -o "$bench/$kind/fused-apart" -q --external-data
done
run() { "$venv/bin/python" "$root/scripts/bench_decode.py" "$bench" "$@" --rounds "$rounds" --memory; }
case " ${kinds:-llama gpt2 bert} " in *" llama "*) run llama --past 128,1024,2048,4096 --prefill 128,2048 --models export,fused,fused-apart,builder ;; esac
# GPT-2 has 4,096 positions: a past of 4,096 leaves none for the new token.
case " ${kinds:-llama gpt2 bert} " in *" gpt2 "*) run gpt2 --past 128,1024,2048 --prefill 128,2048 --models export,fused ;; esac
case " ${kinds:-llama gpt2 bert} " in *" bert "*) run bert --past "" --prefill 128,512 --models export,fused ;; esac
# tinyllama's export keeps its weights apart already: fused-apart is fused.
case " $kinds " in *" tinyllama "*) run tinyllama --past 128,1024,2048,4096 --prefill 128,2048 --models export,fused,builder ;; esac
