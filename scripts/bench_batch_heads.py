"""A core whose heads are folded into its batch and never split (`[b·h, s,
d]` throughout, no view of the scores), as exported and as ONNX `Attention`'s
3-D form with one head (what `--target portable` writes; `runtimes.rs`'s
`batch_heads`): 2 sequences of 16 heads of 64, no mask, ONNX Runtime CPU,
2 threads, ORT_ENABLE_ALL. Each round runs both forms in turn (best of 10
calls each); the ratio is the median of the rounds' ratios to the export.

    .venv/bin/python scripts/bench_batch_heads.py [--rounds N]

Forms:
  export  Transpose(key, [0, 2, 1]), MatMul, Mul(scale), Softmax, MatMul
  att3    Attention(q, key, v, scale, q_num_heads = kv_num_heads = 1), unguarded
Each form's output is compared with the export's on the same feed.
"""

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

BH, D = 32, 64
POINTS = [("decode, past 128", 1, 128), ("decode, past 1,024", 1, 1024), ("prompt 128", 128, 128),
          ("prompt 512", 512, 512)]


def model(nodes, inits=()):
    inputs = [h.make_tensor_value_info(x, T.FLOAT, [BH, s, D]) for x, s in (("q", "s"), ("key", "t"), ("v", "t"))]
    g = h.make_graph(nodes, "core", inputs, [h.make_tensor_value_info("out", T.FLOAT, None)], list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", 23)], ir_version=10)


SCALE = 1 / 8
FORMS = {
    "export": model([
        h.make_node("Transpose", ["key"], ["k"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "k"], ["s"]),
        h.make_node("Mul", ["s", "scale"], ["scaled"]),
        h.make_node("Softmax", ["scaled"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["out"]),
    ], [h.make_tensor("scale", T.FLOAT, [], [SCALE])]),
    "att3": model([h.make_node("Attention", ["q", "key", "v"], ["out"], scale=SCALE, q_num_heads=1, kv_num_heads=1)]),
}


def session(m):
    o = ort.SessionOptions()
    o.intra_op_num_threads = 2
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


def best(sess, feed, calls=10):
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    sessions = {name: session(m) for name, m in FORMS.items()}
    rng = np.random.default_rng(0)
    print("| point | export | att3 | att3 / export (median of rounds) [range] | max difference |")
    print("|---|---|---|---|---|")
    for what, s, t in POINTS:
        feed = {"q": rng.standard_normal((BH, s, D), np.float32), "key": rng.standard_normal((BH, t, D), np.float32),
                "v": rng.standard_normal((BH, t, D), np.float32)}
        outs = {n: x.run(None, feed)[0] for n, x in sessions.items()}
        diff = float(np.abs(outs["att3"] - outs["export"]).max())
        rounds = []
        for r in range(args.rounds):
            order = list(sessions) if r % 2 == 0 else list(reversed(sessions))
            rounds.append({n: best(sessions[n], feed) for n in order})
        ratios = sorted(x["att3"] / x["export"] for x in rounds)
        med = lambda n: float(np.median([x[n] for x in rounds])) * 1e6  # noqa: E731
        print(f"| {what} | {med('export'):.0f} µs | {med('att3'):.0f} µs | {np.median(ratios):.2f} "
              f"[{ratios[0]:.2f}, {ratios[-1]:.2f}] | {diff:.1e} |")


if __name__ == "__main__":
    main()
