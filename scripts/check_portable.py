#!/usr/bin/env python3
"""Checks the portable target against other runtimes: for every model in
testdata/ (exports and near-misses, top level), `onnx-fuse --target portable`
must write an output that onnx.checker accepts (full_check=True) wherever it
accepted the input, and that OpenVINO reads and compiles wherever it read
and compiled the input. Prints a line per model and a closing tally.
Usage: check_portable.py ONNX_FUSE_BINARY TESTDATA_DIR"""

import os
import subprocess
import sys
import tempfile

import onnx
import openvino as ov

binary, testdata = sys.argv[1:3]
core = ov.Core()


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


failures, checked = [], 0
with tempfile.TemporaryDirectory() as tmp:
    for name in sorted(os.listdir(testdata)):
        src = os.path.join(testdata, name)
        if not name.endswith(".onnx") or not os.path.isfile(src):
            continue
        out = os.path.join(tmp, name)
        r = subprocess.run([binary, "-q", "--target", "portable", src, "-o", out], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"{name}: onnx-fuse failed: {r.stderr.strip()}")
            continue
        checked += 1
        verdicts = []
        for what, check in (("onnx.checker", checker), ("OpenVINO", openvino)):
            before, after = check(src), check(out)
            verdicts.append(f"{what} {'ok' if after is None else 'refuses'}{'' if before is None else ' (input refused too)'}")
            if before is None and after is not None:
                failures.append(f"{name}: {what} accepted the input but refuses the portable output: {after}")
        print(f"{name}: {'; '.join(verdicts)}")
print(f"check_portable: {checked} models, {len(failures)} failures")
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
