"""An encoder's attention core alone, as exported and as each one-kernel form
ONNX Runtime runs (docs/benchmarks.md, "Kernels measured against what they
replace"): BERT-base heads (12 of 64), batch 1, a key-padding mask
[b, 1, 1, t] of 0 and float lowest, ONNX Runtime CPU, 2 threads,
ORT_ENABLE_ALL. Each round runs every form in turn (best of 3 calls); the
ratio is the median of the same rounds' ratios to the export.

    .venv/bin/python scripts/bench_attention_forms.py [TOKENS ...] [--rounds N]

Forms:
  export  Reshape/Transpose of q, k, v; MatMul, Div, Add, Softmax, MatMul;
          Transpose/Reshape of the output (what BERT exports write)
  att3    ONNX Attention (opset 23) in its 3-D form: reads q, k, v as
          [b, s, h*d] and writes the output merged (what onnx-fuse writes)
  att4    ONNX Attention on the 4-D heads, with the export's transposes
  mha     com.microsoft.MultiHeadAttention on [b, s, h*d]
Each form's output on a random feed and on a fully masked row is compared
with the export's (att3 and att4 give zeros there, hence onnx-fuse's guard).
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

H, D = 12, 64
HD = H * D


def model(nodes, inits):
    inputs = [h.make_tensor_value_info(x, T.FLOAT, ["b", "s", HD]) for x in "qkv"]
    inputs.append(h.make_tensor_value_info("mask", T.FLOAT, ["b", 1, 1, "s"]))
    g = h.make_graph(nodes, "core", inputs, [h.make_tensor_value_info("out", T.FLOAT, None)], inits)
    opsets = [h.make_opsetid("", 23), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(g, opset_imports=opsets, ir_version=10)


def ints(name, values):
    return h.make_tensor(name, T.INT64, [len(values)], values)


# The mask broadcast over the queries: [b, 1, s, t] (the kernels take the query axis exactly).
EXPAND = [
    h.make_node("Shape", ["q"], ["q_shape"], start=1, end=2),
    h.make_node("Concat", ["one", "one", "q_shape", "one"], ["mask_shape"], axis=0),
    h.make_node("Expand", ["mask", "mask_shape"], ["rows"]),
]
HEADS = [ints("heads", [0, 0, H, D]), ints("merged", [0, 0, HD]), ints("one", [1])]


def split(perms):
    nodes = []
    for x, perm in zip("qkv", perms):
        nodes.append(h.make_node("Reshape", [x, "heads"], [x + "4"]))
        nodes.append(h.make_node("Transpose", [x + "4"], [x + "t"], perm=perm))
    return nodes


def merge(y):
    return [
        h.make_node("Transpose", [y], ["yt"], perm=[0, 2, 1, 3]),
        h.make_node("Reshape", ["yt", "merged"], ["out"]),
    ]


def forms():
    core = [
        h.make_node("MatMul", ["qt", "kt"], ["s0"]),
        h.make_node("Div", ["s0", "c"], ["s1"]),
        h.make_node("Add", ["s1", "mask"], ["s2"]),
        h.make_node("Softmax", ["s2"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "vt"], ["y"]),
    ]
    export = split([[0, 2, 1, 3], [0, 2, 3, 1], [0, 2, 1, 3]]) + core + merge("y")
    att3 = EXPAND + [h.make_node("Attention", ["q", "k", "v", "rows"], ["out"], q_num_heads=H, kv_num_heads=H, scale=1 / 8)]
    att4 = EXPAND + split([[0, 2, 1, 3]] * 3)
    att4 += [h.make_node("Attention", ["qt", "kt", "vt", "rows"], ["y"], scale=1 / 8)] + merge("y")
    mha = EXPAND + [
        h.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "rows"], ["out"], domain="com.microsoft", num_heads=H, scale=1 / 8)
    ]
    return {
        "export": model(export, HEADS + [h.make_tensor("c", T.FLOAT, [], [8.0])]),
        "att3": model(att3, HEADS),
        "att4": model(att4, HEADS),
        "mha": model(mha, HEADS),
    }


def session(m):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.log_severity_level = 3
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("tokens", nargs="*", type=int, default=[1, 16, 128, 512])
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args()
    sessions = {name: session(m) for name, m in forms().items()}
    rng = np.random.default_rng(0)
    lowest = np.finfo(np.float32).min
    for s in a.tokens:
        feed = {x: rng.standard_normal((1, s, HD), dtype=np.float32) for x in "qkv"}
        feed["mask"] = np.zeros((1, 1, 1, s), np.float32)
        feed["mask"][..., s - s // 4 :] = lowest
        masked = dict(feed, mask=np.full((1, 1, 1, s), lowest, np.float32))
        ref = {k: sessions["export"].run(None, f)[0] for k, f in (("feed", feed), ("masked", masked))}
        times = {name: [] for name in sessions}
        for _ in range(a.rounds):
            for name, sess in sessions.items():
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    sess.run(None, feed)
                    best = min(best, time.perf_counter() - t)
                times[name].append(best)
        for name, sess in sessions.items():
            diff = {k: float(np.abs(sess.run(None, f)[0] - ref[k]).max()) for k, f in (("feed", feed), ("masked", masked))}
            ratio = np.median(np.array(times[name]) / np.array(times["export"]))
            print(
                f"tokens {s:5d}  {name:6s}  {1000 * np.median(times[name]):8.3f} ms  "
                f"{ratio:.2f}x the export  max diff {diff['feed']:.1e}, fully masked row {diff['masked']:.1e}"
            )


if __name__ == "__main__":
    main()
