#!/usr/bin/env python3
"""What users gain where they run the model: ONNX Runtime (CPU, 2 threads,
ORT_ENABLE_ALL) on the export, onnx-fuse's output and the onnxruntime-genai
model builder's output of the same random weights (scripts/bench_decode.sh
makes them). Decode is one token after a past of P; prefill is S tokens
after no past. Models are measured in alternation, round by round, each
round starting with the next model, and each ratio is the median of the
ratios of the same rounds, with their lowest and highest (the spread): a
JSON line per point, then the table of them all. Peak memory is
each model's own process's peak RSS (ru_maxrss) over a load and a prefill.

Usage: bench_decode.py DIR MODEL_KIND [--rounds N] [--past P,P] [--prefill S,S]
                       [--models M,M] [--batch B --left-pad P] [--calls C]
  DIR/KIND/{export,fused,fused-apart,fused-before,builder}/model.onnx
  (fused-before: another onnx-fuse's output, to compare with)"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

THREADS = 2
HEAD_SIZE = 64  # of every model scripts/bench_decode_models.py makes
PAUSE = 0.2  # seconds between models: ONNX Runtime's idle threads spin for a while
CALLS = 3  # calls per model per round (--calls)


def session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def feeds(sess, past, seq, rng, batch=1, pad=0):
    """Inputs for one call: `seq` new tokens after a past of `past`, `batch`
    rows, the first left-padded by `pad` tokens (its mask 0 there)."""
    out = {}
    for i in sess.get_inputs():
        name = i.name
        if name == "input_ids":
            out[name] = rng.integers(3, 1000, (batch, seq), dtype=np.int64)
        elif name == "attention_mask":
            out[name] = np.ones((batch, past + seq), dtype=np.int64)
            out[name][0, :pad] = 0
        elif name == "position_ids":
            out[name] = np.repeat(np.arange(past, past + seq, dtype=np.int64)[None, :], batch, axis=0)
        elif name == "token_type_ids":
            out[name] = np.zeros((batch, seq), dtype=np.int64)
        elif name.startswith("past_key_values"):
            # [batch, kv heads, past, head size]; the builder leaves the head size symbolic.
            dims = [batch, i.shape[1], past, i.shape[3] if isinstance(i.shape[3], int) else HEAD_SIZE]
            out[name] = rng.standard_normal(dims).astype(np.float32) * 0.5
        else:
            raise SystemExit(f"{name}: an input this benchmark does not know")
    return out


def timed(sess, feed):
    start = time.perf_counter()
    sess.run(None, feed)
    return time.perf_counter() - start


def memory(path, past, seq):
    """Peak RSS (MiB) of a process that loads `path` and runs one call: its
    VmHWM (ru_maxrss would carry over the parent's peak across exec)."""
    code = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import bench_decode as b; "
        "s = b.session(sys.argv[2]); s.run(None, b.feeds(s, int(sys.argv[3]), int(sys.argv[4]), "
        "np.random.default_rng(0))); "
        "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, here, path, str(past), str(seq)], check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("kind")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--past", default="128,1024,2048,4096")
    p.add_argument("--prefill", default="128,2048")
    p.add_argument("--memory", action="store_true", help="also peak RSS of prefill, each model in its own process")
    p.add_argument("--models", default="export,fused,builder")
    p.add_argument("--batch", type=int, default=1, help="rows per call")
    p.add_argument("--left-pad", type=int, default=0, help="padding tokens on the left of the first row")
    p.add_argument("--calls", type=int, default=CALLS, help="calls per model per round (the best counts)")
    a = p.parse_args()
    paths = {m: os.path.join(a.dir, a.kind, m, "model.onnx") for m in a.models.split(",")}
    paths = {m: path for m, path in paths.items() if os.path.exists(path)}
    points = [("decode", int(x), 1) for x in a.past.split(",") if x] + \
             [("prefill", 0, int(x)) for x in a.prefill.split(",") if x]
    # Peak memory first, each model alone: the timing sessions below hold
    # every model at once (a 1.1B model's three sessions at a prefill of
    # 2,048 leave too little of 24 GiB for another process).
    peaks = {seq: {m: memory(path, past, seq) for m, path in paths.items()}
             for what, past, seq in points if a.memory and what == "prefill"}
    sessions = {m: session(path) for m, path in paths.items()}
    rows = []
    for what, past, seq in points:
        fed = {m: feeds(s, past, seq, np.random.default_rng(0), a.batch, a.left_pad) for m, s in sessions.items()}
        for m, s in sessions.items():  # warm-up
            s.run(None, fed[m])
        times = {m: [] for m in sessions}
        names = list(sessions)
        for r in range(a.rounds):
            # Each round starts with the next model: a model's place in the
            # round moved its time by up to 10% (measured), so no model
            # keeps one place.
            for m in names[r % len(names):] + names[:r % len(names)]:
                # The last session's threads stop spinning first, and this
                # one's caches are warm: the best of a few calls.
                time.sleep(PAUSE)
                times[m].append(min(timed(sessions[m], fed[m]) for _ in range(a.calls)))
        row = {"what": what, "past": past, "tokens": seq, "batch": a.batch, "left_pad": a.left_pad,
               "ms": {m: 1000 * statistics.median(t) for m, t in times.items()}}
        pairs = [("fused", "export"), ("fused", "builder"), ("fused-apart", "builder"), ("builder", "export"),
                 ("fused", "fused-before"), ("fused-before", "export")]
        for x, y in pairs:
            if x in times and y in times:
                ratios = [u / v for u, v in zip(times[x], times[y])]
                row[f"{x}/{y}"] = statistics.median(ratios)
                # The spread of the same rounds' ratios: the lowest and highest.
                row[f"{x}/{y} spread"] = [min(ratios), max(ratios)]
        if seq in peaks and what == "prefill":
            row["peak_mib"] = peaks[seq]
        rows.append(row)
        print(json.dumps(row), flush=True)
    table(rows, [f"{x}/{y}" for x, y in pairs if x in sessions and y in sessions])


def table(rows, pairs):
    """The rows as the table docs/benchmarks.md shows: each point's median
    time per model, and each ratio's median over the rounds with its spread."""
    models = list(rows[0]["ms"]) if rows else []
    print("\n| point | " + " | ".join(f"{m} (ms)" for m in models) + " | " + " | ".join(pairs) + " |")
    print("|---" * (1 + len(models) + len(pairs)) + "|")
    for row in rows:
        point = f"decode, past {row['past']:,}" if row["what"] == "decode" else f"prefill {row['tokens']:,}"
        ms = [f"{row['ms'][m]:.1f}" for m in models]
        ratios = [f"{row[p]:.2f} [{row[p + ' spread'][0]:.2f}, {row[p + ' spread'][1]:.2f}]" for p in pairs]
        print(f"| {point} | " + " | ".join(ms + ratios) + " |")


if __name__ == "__main__":
    main()
