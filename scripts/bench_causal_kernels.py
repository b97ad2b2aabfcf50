#!/usr/bin/env python3
"""The causal prompt on ONNX Runtime's kernels (docs/attention-kernel.md,
"The causal prompt"): what each computes, and how long it takes, beside
what onnx-fuse writes today.

One attention layer of the benchmark Llama's shape (16 query heads over 4
KV heads of 64), f32, ONNX Runtime CPU, 2 threads:

  mask       ONNX Attention with the export's additive causal mask (the
             float's lowest above the diagonal), every score computed
  pieces     the same over 8 pieces of the queries, each reading only the
             keys its rows see (what onnx-fuse writes for a long call)
  is_causal  ONNX Attention with is_causal = 1 and no mask
  gqa        com.microsoft.GroupQueryAttention (the builder's kernel), the
             export's mask as its attention_bias
  gqa_nobias the same without a bias: causal by itself, no padding (what
             the builder's model runs)

Exactness against numpy's reference of the export's function: a prompt,
a prompt after a past (the mask aligned to the last key), one token after a
past, and a left-padded batch (its padding as a mask: `gqa` takes it as
attention_bias). Then timings in alternated rounds: medians and per-round
ratios to `pieces` with their spread.

Usage: bench_causal_kernels.py [LENGTH ...] [--rounds N]   (default 512 2048, 7 rounds)
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H, HKV, D, SCALE, PIECES = 16, 4, 64, 0.125, 8
LOWEST = np.finfo(np.float32).min


def session(nodes, inputs, outputs, initializers=(), microsoft=False):
    opsets = [helper.make_opsetid("", 23)] + ([helper.make_opsetid("com.microsoft", 1)] if microsoft else [])
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def i32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.INT32, shape)


QKV = [f32("q", ["b", H, "s", D]), f32("k", ["b", HKV, "t", D]), f32("v", ["b", HKV, "t", D])]
MASKED = session([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], scale=SCALE)], QKV + [f32("m", ["b", 1, "s", "t"])], [f32("y", None)])
CAUSAL = session([helper.make_node("Attention", ["q", "k", "v"], ["y"], scale=SCALE, is_causal=1)], QKV, [f32("y", None)])


def gqa_session(bias):
    """GroupQueryAttention; with `bias`, the export's mask as its attention_bias."""
    inputs = ["q", "k", "v", "pk", "pv", "seqlens_k", "total"] + (["", "", "", "bias"] if bias else [])
    return session(
        [helper.make_node("GroupQueryAttention", inputs, ["y", "present_k", "present_v"], domain="com.microsoft",
                          num_heads=H, kv_num_heads=HKV, scale=SCALE)],
        [f32("q", ["b", "s", H * D]), f32("k", ["b", "s", HKV * D]), f32("v", ["b", "s", HKV * D]),
         f32("pk", ["b", HKV, "p", D]), f32("pv", ["b", HKV, "p", D]), i32("seqlens_k", ["b"]), i32("total", [])]
        + ([f32("bias", ["b", 1, "s", "t"])] if bias else []),
        [f32("y", None), f32("present_k", None), f32("present_v", None)], microsoft=True)


GQA = {True: gqa_session(True), False: gqa_session(False)}


def pieces_session():
    """Attention over PIECES pieces of the queries, piece i reading keys [0, end of piece i)."""
    nodes, outs, init = [], [], {}

    def ints(value):
        name = f"c{len(init)}"
        init[name] = numpy_helper.from_array(np.array(value, np.int64), name)
        return name

    # The pieces' bounds, from the lengths at run time: queries [a, b),
    # keys [0, past + b) (the piece's last row sees no later key).
    nodes += [helper.make_node("Shape", ["q"], ["s"], start=2, end=3),
              helper.make_node("Shape", ["k"], ["t"], start=2, end=3),
              helper.make_node("Sub", ["t", "s"], ["past"]),
              helper.make_node("Add", ["s", ints([PIECES - 1])], ["s_up"]),
              helper.make_node("Div", ["s_up", ints([PIECES])], ["n"])]
    two, three, zero = ints([2]), ints([3]), ints([0])
    for i in range(PIECES):
        a, b, seen = f"a{i}", f"b{i}", f"seen{i}"
        nodes += [helper.make_node("Mul", ["n", ints([i])], [a]),
                  helper.make_node("Mul", ["n", ints([i + 1])], [b]),
                  helper.make_node("Add", ["past", b], [seen])]
        nodes += [helper.make_node("Slice", ["q", a, b, two], [f"q{i}"]),
                  helper.make_node("Slice", ["k", zero, seen, two], [f"k{i}"]),
                  helper.make_node("Slice", ["v", zero, seen, two], [f"v{i}"]),
                  helper.make_node("Slice", ["m", a, b, two], [f"mr{i}"]),
                  helper.make_node("Slice", [f"mr{i}", zero, seen, three], [f"m{i}"]),
                  helper.make_node("Attention", [f"q{i}", f"k{i}", f"v{i}", f"m{i}"], [f"y{i}"], scale=SCALE)]
        outs.append(f"y{i}")
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=2))
    return session(nodes, QKV + [f32("m", ["b", 1, "s", "t"])], [f32("y", None)], init.values())


PIECES_SESSION = pieces_session()


def case(rng, batch, s, past, pad=0):
    """q, k, v, the export's mask [b, 1, s, past + s] (causal, aligned to the last key, the first `pad` keys of row 0 hidden)."""
    t = past + s
    q = rng.standard_normal((batch, H, s, D)).astype(np.float32)
    k = rng.standard_normal((batch, HKV, t, D)).astype(np.float32)
    v = rng.standard_normal((batch, HKV, t, D)).astype(np.float32)
    m = np.broadcast_to(np.triu(np.full((s, t), LOWEST, np.float32), k=past + 1), (batch, 1, s, t)).copy()
    m[0, :, :, :pad] = LOWEST
    return q, k, v, m


def reference(q, k, v, m):
    """The export's function, in f32 as the export computes it: a row that sees no key is the mean of v."""
    n = H // HKV
    s = (q @ np.repeat(k, n, 1).transpose(0, 1, 3, 2)) * np.float32(SCALE) + m
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ np.repeat(v, n, 1)


def gqa(q, k, v, m, past, bias=True):
    b, _, s, _ = q.shape
    merge = lambda x: x.transpose(0, 2, 1, 3).reshape(b, x.shape[2], -1)
    feeds = dict(q=merge(q), k=merge(k[:, :, past:]), v=merge(v[:, :, past:]), pk=k[:, :, :past], pv=v[:, :, :past],
                 seqlens_k=np.full(b, past + s - 1, np.int32), total=np.array(past + s, np.int32))
    y = GQA[bias].run(["y"], dict(feeds, bias=m) if bias else feeds)[0]
    return y.reshape(b, s, H, D).transpose(0, 2, 1, 3)


def kernels(q, k, v, m, past):
    return {
        "mask": lambda: MASKED.run(None, dict(q=q, k=k, v=v, m=m))[0],
        "pieces": lambda: PIECES_SESSION.run(None, dict(q=q, k=k, v=v, m=m))[0],
        "is_causal": lambda: CAUSAL.run(None, dict(q=q, k=k, v=v))[0],
        "gqa": lambda: gqa(q, k, v, m, past),
        "gqa_nobias": lambda: gqa(q, k, v, m, past, bias=False),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("lengths", nargs="*", type=int, default=[512, 2048])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"ONNX Runtime {ort.__version__}; largest difference from the export's function:")
    for what, (batch, s, past, pad) in {
        "prompt of 16": (1, 16, 0, 0),
        "16 after a past of 8": (1, 16, 8, 0),
        "one token after a past of 24": (1, 1, 24, 0),
        "left-padded batch (3 of 16 pads)": (2, 16, 0, 3),
    }.items():
        q, k, v, m = case(rng, batch, s, past, pad)
        want = reference(q, k, v, m)
        # Rows that see a key, and rows that see none (the first `pad` rows of row 0's batch).
        seen = (m > LOWEST).any(-1, keepdims=True)
        errors = []
        for name, run in kernels(q, k, v, m, past).items():
            if name == "pieces" and s < PIECES:
                continue  # written for a long call only
            try:
                error = np.abs(run() - want)
                hidden = f" (rows seeing no key {np.where(seen, 0, error).max():.1e})" if not seen.all() else ""
                errors.append(f"{name} {np.where(seen, error, 0).max():.1e}{hidden}")
            except Exception as e:  # noqa: BLE001 (a kernel that refuses the input is a finding)
                errors.append(f"{name} refused ({str(e).splitlines()[0][:60]})")
        print(f"  {what}: " + ", ".join(errors))
    for s in args.lengths:
        q, k, v, m = case(rng, 1, s, 0)
        runs = kernels(q, k, v, m, 0)
        times = {name: [] for name in runs}
        for r in range(args.rounds):
            order = list(runs)[r % len(runs):] + list(runs)[:r % len(runs)]
            for name in order:
                start = time.perf_counter()
                runs[name]()
                times[name].append(time.perf_counter() - start)
        base = np.array(times["pieces"])
        print(f"prompt of {s}, {args.rounds} alternated rounds (median ms; per-round ratio to pieces: median [min, max]):")
        for name, t in times.items():
            ratio = np.array(t) / base
            print(f"  {name:10s} {1e3 * np.median(t):8.1f} ms   {np.median(ratio):.2f} [{ratio.min():.2f}, {ratio.max():.2f}]")


if __name__ == "__main__":
    main()
