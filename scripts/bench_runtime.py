#!/usr/bin/env python3
"""ONNX Runtime (CPU) on BERT-base and GPT-2 (124M) fp32 exports with random
weights (no download): the original, onnx-fuse's output and ONNX Runtime's
transformers optimizer's output, each at ORT_ENABLE_BASIC (ORT's own load-time
fusions off) and ORT_ENABLE_ALL. Prints session load time, run time (median
of 20 runs, batch 1, sequence 128) and the largest difference from the
original's outputs.
Usage: bench_runtime.py ONNX_FUSE_BINARY OUT_DIR"""

import os
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from onnxruntime.transformers import optimizer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_models import export  # noqa: E402
from gen_testdata import use_mask_without_vmap  # noqa: E402

SEQ = 128


def session(path, level):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 2
    started = time.perf_counter()
    s = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return s, time.perf_counter() - started


def measure(path, feeds):
    rows = []
    for name, level in (("BASIC", ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
                        ("ALL", ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        loads = []
        for _ in range(3):
            s, load = session(path, level)
            loads.append(load)
        out = s.run(None, feeds)[0]
        runs = []
        for _ in range(20):
            started = time.perf_counter()
            s.run(None, feeds)
            runs.append(time.perf_counter() - started)
        rows.append((name, statistics.median(loads), statistics.median(runs), out))
    return rows


def main():
    binary, out = sys.argv[1], sys.argv[2]
    use_mask_without_vmap()
    torch.manual_seed(0)
    models = {
        "bert-base": (transformers.BertModel(transformers.BertConfig()), "bert", 12, 768),
        "gpt2": (transformers.GPT2LMHeadModel(transformers.GPT2Config()), "gpt2", 12, 768),
    }
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 1000, (1, SEQ), dtype=np.int64),
             "attention_mask": np.ones((1, SEQ), dtype=np.int64)}
    print("| model | variant | ORT level | session load | run (median of 20) | max diff from the original |")
    print("|---|---|---|---|---|---|")
    for name, (model, kind, heads, hidden) in models.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        original = os.path.join(d, "model.onnx")
        if not os.path.exists(original):
            # (The traced GPT-2 keeps the example's length in a Reshape: trace at SEQ.)
            export(model, kind, original, seq=SEQ)
        fused = os.path.join(d, "fused.onnx")
        subprocess.run([binary, original, "-o", fused, "-q"], check=True)
        theirs = os.path.join(d, "ort_optimizer.onnx")
        if not os.path.exists(theirs):
            opt = optimizer.optimize_model(original, model_type=kind, num_heads=heads, hidden_size=hidden,
                                           opt_level=0, use_gpu=False)
            opt.save_model_to_file(theirs)
        reference = None
        for variant, path in (("original", original), ("onnx-fuse", fused), ("ORT transformers optimizer", theirs)):
            for level, load, run, outputs in measure(path, feeds):
                reference = outputs if reference is None else reference
                diff = float(np.abs(outputs - reference).max())
                print(f"| {name} | {variant} | {level} | {load * 1000:.0f} ms | {run * 1000:.1f} ms | {diff:.2e} |")

if __name__ == "__main__":
    main()
