#!/usr/bin/env bash
# The Python package's tests (docs/python.md): builds the wheel once with
# `maturin build --release` (maturin from PyPI), installs it into a fresh
# virtual environment with what the tests and the recipes need (all pinned,
# from PyPI), and runs python/tests there with no cargo on PATH, so that the
# suite tests the wheel's own binary and the pip route to ONNX Runtime.
# Usage: scripts/test-python.sh [--prepare | --prepared]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tools=target/py-tools
venv=target/py-test
# A fresh environment with what the tests and the recipes need; CI makes it
# (--prepare) while cargo's tests build, then runs this with --prepared.
prepare() {
  [ -x "$tools/bin/maturin" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install --quiet maturin==1.16.0; }
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet onnxruntime==1.31.1 onnx==1.23.2 numpy==2.4.6 pytest==9.2.0 \
    torch==2.9.1 onnxscript==0.7.2 transformers==4.57.6 optimum==2.1.0 optimum-onnx==0.1.0
}
case "${1:-}" in
  --prepare) prepare; exit 0 ;;
  --prepared) [ -x "$venv/bin/python" ] || { echo "test-python: no $venv: run with --prepare first" >&2; exit 1; } ;;
  "") prepare ;;
  *) echo "usage: scripts/test-python.sh [--prepare | --prepared]" >&2; exit 2 ;;
esac
rm -rf target/wheels
start=$SECONDS
"$tools/bin/maturin" build --release --locked --quiet --out target/wheels
wheel="$(ls target/wheels/onnx_fuse-*.whl)"
echo "test-python: built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) in $((SECONDS - start)) s"
# The wheel with its extras (their packages are there already).
"$venv/bin/pip" install --quiet "$wheel[verify,onnx]"
# PATH without cargo, and without the checkout's ONNX Runtime in the environment.
path="$(tr ':' '\n' <<<"$PATH" | while read -r d; do [ -n "$d" ] && [ ! -x "$d/cargo" ] && echo "$d"; done | paste -sd:)"
run=(env -u VIRTUAL_ENV -u ORT_DYLIB_PATH PATH="$venv/bin:$path")
"${run[@]}" "$venv/bin/python" -c 'import shutil, sys; sys.exit("cargo is on PATH: " + shutil.which("cargo") if shutil.which("cargo") else 0)'
cd "$venv"  # not the checkout: `import onnx_fuse` must be the installed package
"${run[@]}" "$root/$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests"
