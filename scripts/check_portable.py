#!/usr/bin/env python3
"""Checks the portable target and `--opset` upgrades against other runtimes,
for every model in testdata/ (exports and near-misses, top level):

- `--target portable` writes an output that onnx.checker accepts
  (full_check=True) wherever it accepted the input, and that OpenVINO reads
  and compiles wherever it read and compiled the input;
- `--passes none --opset N`, for N in 17, 18, 21 and 23 (from the model's
  own opset on), writes a model ONNX Runtime runs with exactly the
  original's outputs (`onnx-fuse verify --rtol 0 --atol 0`), and that
  onnx.checker and OpenVINO accept wherever they accepted the input;
- `--target portable --opset N --verify`, for the same N, passes its
  verification and is accepted the same way; at 23 it writes at least as
  many norms as `--target ort` does (LayerNormalization and
  RMSNormalization against ONNX Runtime's norms and skip-norms).

A model that ONNX Runtime cannot run on synthesized inputs (some hand-made
near-misses need sizes the tool cannot guess) is checked for loading only,
and said so. Prints a line per model and a closing tally.
Usage: check_portable.py ONNX_FUSE_BINARY TESTDATA_DIR"""

import collections
import os
import subprocess
import sys
import tempfile

import onnx
import openvino as ov

binary, testdata = sys.argv[1:3]
core = ov.Core()
OPSETS = (17, 18, 21, 23)
ORT_NORMS = ("LayerNormalization", "SimplifiedLayerNormalization", "com.microsoft.SkipLayerNormalization",
             "com.microsoft.SkipSimplifiedLayerNormalization")
PORTABLE_NORMS = ("LayerNormalization", "RMSNormalization")


def checker(path):
    try:
        onnx.checker.check_model(path, full_check=True)
        return None
    except Exception as e:  # noqa: BLE001 - any refusal counts
        return str(e).splitlines()[0][:160]


def openvino(path):
    try:
        core.compile_model(core.read_model(path), "CPU")
        return None
    except Exception as e:  # noqa: BLE001
        return str(e).splitlines()[0][:160]


def ops(path):
    """Node counts per op (`domain.Op` outside the default domain), every graph."""
    counts = collections.Counter()

    def walk(graph):
        for n in graph.node:
            counts[f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type] += 1
            for a in n.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else []) + list(a.graphs):
                    walk(g)

    walk(onnx.load(path, load_external_data=False).graph)
    return counts


def opset(path):
    m = onnx.load(path, load_external_data=False)
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 26)


def fuse(*args):
    return subprocess.run([binary, "-q", *args], capture_output=True, text=True)


failures, checked, upgrades = [], 0, 0
with tempfile.TemporaryDirectory() as tmp:
    for name in sorted(os.listdir(testdata)):
        src = os.path.join(testdata, name)
        if not name.endswith(".onnx") or not os.path.isfile(src):
            continue
        accepted = {"onnx.checker": checker(src) is None, "OpenVINO": openvino(src) is None}
        runs = subprocess.run([binary, "verify", src, src], capture_output=True).returncode == 0

        def loads(out, what):
            verdicts = []
            for runtime, check in (("onnx.checker", checker), ("OpenVINO", openvino)):
                refusal = check(out)
                verdicts.append(f"{runtime} {'ok' if refusal is None else 'refuses'}"
                                f"{'' if accepted[runtime] else ' (input refused too)'}")
                if accepted[runtime] and refusal is not None:
                    failures.append(f"{name}: {runtime} accepted the input but refuses {what}: {refusal}")
            return verdicts

        out = os.path.join(tmp, name)
        r = fuse("--target", "portable", src, "-o", out)
        if r.returncode != 0:
            failures.append(f"{name}: onnx-fuse failed: {r.stderr.strip()}")
            continue
        checked += 1
        print(f"{name}: portable: {'; '.join(loads(out, 'the portable output'))}")
        ort_out = os.path.join(tmp, f"ort_{name}")
        fuse(src, "-o", ort_out)
        for n in (n for n in OPSETS if n >= opset(src)):
            out = os.path.join(tmp, f"op{n}_{name}")
            r = fuse("--passes", "none", "--opset", str(n), src, "-o", out)
            if r.returncode != 0:
                failures.append(f"{name}: --opset {n} failed: {r.stderr.strip()}")
                continue
            upgrades += 1
            same = "not run (the original needs sizes given)"
            if runs:
                r = subprocess.run([binary, "verify", "--rtol", "0", "--atol", "0", src, out],
                                   capture_output=True, text=True)
                same = "ORT same" if r.returncode == 0 else "ORT DIFFERS"
                if r.returncode != 0:
                    failures.append(f"{name}: --opset {n}: ONNX Runtime differs: {(r.stdout + r.stderr).strip()[-300:]}")
            print(f"{name}: opset {n}: {same}; {'; '.join(loads(out, f'its upgrade to {n}'))}")
            # The portable fusions on top, verified.
            out = os.path.join(tmp, f"p{n}_{name}")
            r = fuse("--target", "portable", "--opset", str(n), *(["--verify"] if runs else []), src, "-o", out)
            if r.returncode != 0:
                failures.append(f"{name}: --target portable --opset {n}{' --verify' if runs else ''} failed: "
                                f"{r.stderr.strip()}")
                continue
            norms = ""
            if n == 23:
                before, ort, portable = ops(src), ops(ort_out), ops(out)
                norms_ort = sum(ort[o] - before[o] for o in ORT_NORMS)
                norms_portable = sum(portable[o] - before[o] for o in PORTABLE_NORMS)
                if norms_portable < norms_ort:
                    failures.append(f"{name}: portable --opset 23 writes {norms_portable} norms, ort {norms_ort}")
                norms = f", norms {norms_portable} (ort {norms_ort})"
            print(f"{name}: portable --opset {n}: {'verified' if runs else 'not run'}{norms}; "
                  f"{'; '.join(loads(out, f'the portable output at opset {n}'))}")
print(f"check_portable: {checked} models, {upgrades} upgrades, {len(failures)} failures")
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
