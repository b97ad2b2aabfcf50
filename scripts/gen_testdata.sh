#!/usr/bin/env bash
# Regenerates testdata/ with the exporters pinned below, in a virtual
# environment of its own (.venv, not committed). No weights are downloaded:
# every model is built from a config in gen_testdata.py.
# Usage: scripts/gen_testdata.sh [NAME.onnx ... | complex | near-misses | shapes]  (no argument: everything)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet torch==2.9.1 transformers==4.57.6 optimum==2.1.0 optimum-onnx==0.1.0 \
    onnx==1.23.2 onnxruntime==1.31.1 onnxscript==0.7.2
fi
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$venv/bin/python" "$root/scripts/gen_testdata.py" "$@"
