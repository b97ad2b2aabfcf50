#!/usr/bin/env bash
# Puts ONNX Runtime's shared library where onnx-fuse looks for it first:
# .ort/lib/libonnxruntime.so (beside this repository's Cargo.toml).
# It comes from the `onnxruntime` wheel on PyPI; nothing else is downloaded.
# Usage: scripts/fetch-ort.sh [VERSION]   (default 1.31.1)
set -euo pipefail
version="${1:-1.31.1}"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.ort/lib"
if [ -f "$dest/libonnxruntime.so.$version" ]; then
  echo "ONNX Runtime $version already in $dest"
  exit 0
fi
python=$(command -v python3 || command -v python) || { echo "fetch-ort: python3 with pip is needed" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$python" -m pip download --quiet --no-deps --only-binary=:all: "onnxruntime==$version" -d "$tmp"
wheel=$(ls "$tmp"/onnxruntime-*.whl)
mkdir -p "$dest"
"$python" - "$wheel" "$dest" "$version" <<'PY'
import sys, zipfile, os
wheel, dest, version = sys.argv[1:]
name = f"onnxruntime/capi/libonnxruntime.so.{version}"
with zipfile.ZipFile(wheel) as z:
    with z.open(name) as src, open(os.path.join(dest, os.path.basename(name)), "wb") as out:
        out.write(src.read())
PY
ln -sf "libonnxruntime.so.$version" "$dest/libonnxruntime.so"
echo "ONNX Runtime $version in $dest"
