#!/usr/bin/env python3
"""Check whether OpenVINO and tract load and compute onnx-fuse's Attention outputs.

Usage: check_runtimes.py BINARY TESTDATA_DIR OUT_DIR

What it measures (the "Runtime x op" table of docs/targets.md):
for every model in TESTDATA_DIR (the *.onnx files at the top level and the
.onnx files inside *_folder subdirectories; fuzz/, golden/ and external/ are
skipped) it writes two outputs with BINARY:

  ort       BINARY IN -o OUT_DIR/out/NAME.ort.onnx -q
  portable  BINARY IN -o OUT_DIR/out/NAME.portable.onnx --target portable --opset 23 -q

Only outputs that contain an ONNX `Attention` or `RotaryEmbedding` node
(anywhere: the main graph, If/Loop/Scan bodies, local functions) are
checked; the others are only counted. For each checked output and its
original the script runs, on the same inputs:

  ONNX Runtime (CPU)  the reference: the original model's outputs
  OpenVINO            core.read_model + compile_model("CPU",
                      {"INFERENCE_PRECISION_HINT": "f32"})
  tract               tract.onnx().load, set_input_fact for every input to
                      the concrete shape and type fed, into_model,
                      into_runnable (tract 0.23's Python API has no
                      into_optimized: into_runnable always optimizes, and
                      no "unoptimized" runtime is compiled into the wheel)

and reports whether each loads, max |fused - original| within the same
runtime, and max |runtime fused - ONNX Runtime original| as a cross-runtime
sanity value. Differences are taken over positions finite in both;
NaN/inf are counted separately ("nonfinite" notes).

How inputs are made (numpy default_rng(0), fresh for every model, graph
inputs in order): symbolic dims are batch 2, sequence 5, past length 3
(a dim whose name has "past" gets 3; a dim named like "past + sequence" or
"total" gets 8; an `attention_mask` of a model that also takes past
key/values gets 8 on its last axis). If ONNX Runtime cannot run the original
with those, batch 1 sequence 1 is tried instead, then batch 2 and batch 1
with sequence 7 (some exports bake the sequence length 7 they were traced
with into a Reshape), then batch 2 sequence 64 (audio encoders whose
convolutions need more than 7 samples). Integer inputs: *ids*
(not token_type_ids) uniform in [0, min(100, vocab)) where vocab is the row
count of the embedding table the ids index (64 in every testdata model, so
ids up to 99 would be out of range for ONNX Runtime); masks ones; position_ids
arange(past, past + seq) on every batch row; anything else zeros. Floats:
standard normal * 0.5 in the input's type. Bool: True.

Each model gets two feed sets: "ones" (every mask all ones) and "pad" (batch row 0
of every mask left-padded: its first two positions 0). Models without a
mask input run only "ones".

Every model is run twice on each feed set by the same compiled model (in
OpenVINO a fresh compile_model per feed set); the numbers are from the first
run, and a note says where the second run differs.

Every runtime runs in a child process (this script with --worker), so a
crash or hang in one runtime is recorded and does not stop the run.
Full error texts go to OUT_DIR/errors.txt, all numbers to OUT_DIR/results.json.
"""
import glob
import json
import os
import subprocess
import sys
import time

import numpy as np

BATCH, SEQ, PAST = 2, 5, 3
FEEDSETS = ("ones", "pad")
RUNTIMES = ("ort", "ov", "tract")
WORKER_TIMEOUT = 900
KERNEL_OPS = ("Attention", "RotaryEmbedding")


# --------------------------------------------------------------------------
# Models and their outputs

def find_models(testdata):
    skip = {"fuzz", "golden", "external"}
    models = sorted(glob.glob(os.path.join(testdata, "*.onnx")))
    for folder in sorted(glob.glob(os.path.join(testdata, "*_folder"))):
        if os.path.basename(folder) not in skip:
            models += sorted(glob.glob(os.path.join(folder, "*.onnx")))
    return models


def model_tag(testdata, path):
    rel = os.path.relpath(path, testdata)
    return rel[:-len(".onnx")].replace(os.sep, "__")


def count_kernel_ops(path):
    """Count Attention / RotaryEmbedding (default domain) nodes anywhere, and
    beside them the If and transmuter.AttentionCore nodes (keys "+If", "+AttentionCore")."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    counts = {op: 0 for op in KERNEL_OPS + ("+If", "+AttentionCore")}

    def walk(nodes):
        for node in nodes:
            if node.domain in ("", "ai.onnx") and node.op_type in counts:
                counts[node.op_type] += 1
            if node.domain in ("", "ai.onnx") and node.op_type == "If":
                counts["+If"] += 1
            if node.domain == "transmuter" and node.op_type == "AttentionCore":
                counts["+AttentionCore"] += 1
            for attr in node.attribute:
                if attr.g is not None and attr.HasField("g"):
                    walk(attr.g.node)
                for g in attr.graphs:
                    walk(g.node)

    walk(model.graph.node)
    for fn in model.functions:
        walk(fn.node)
    return {k: v for k, v in counts.items() if v}


def run_fuser(binary, src, dst, target):
    cmd = [binary, src, "-o", dst, "-q"]
    if target == "portable":
        cmd[4:4] = ["--target", "portable", "--opset", "23"]
    if os.path.exists(dst):
        os.remove(dst)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not os.path.exists(dst):
        msg = (proc.stderr or proc.stdout).strip().splitlines()
        return f"exit {proc.returncode}: " + (msg[0] if msg else "(no message)")
    return None


# --------------------------------------------------------------------------
# Inputs

def graph_inputs(path):
    """[(name, numpy dtype, [dim value or dim name])] of the non-initializer inputs."""
    import onnx
    from onnx import helper
    model = onnx.load(path, load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        dims = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(d.dim_value)
            else:
                dims.append(d.dim_param or "?")
        specs.append((inp.name, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)), dims))
    return specs


def vocab_size(path, ids_names, default=100):
    """Rows of the embedding table(s) the ids inputs index (Gather data), else default."""
    import onnx
    model = onnx.load(path, load_external_data=False)
    nodes, rows = [], {}

    def collect(graph):
        for init in graph.initializer:
            rows[init.name] = init.dims[0] if init.dims else None
        for node in graph.node:
            nodes.append(node)
            for attr in node.attribute:
                if attr.HasField("g"):
                    collect(attr.g)
                for g in attr.graphs:
                    collect(g)

    collect(model.graph)
    derived, changed = set(ids_names), True
    while changed:
        changed = False
        for node in nodes:
            if node.op_type in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity",
                                "Transpose", "Expand") and node.input and node.input[0] in derived:
                for out in node.output:
                    if out not in derived:
                        derived.add(out)
                        changed = True
    found = [rows[n.input[0]] for n in nodes if n.op_type == "Gather" and len(n.input) > 1
             and n.input[1] in derived and rows.get(n.input[0])]
    return min(found + [default])


def resolve_dim(dim, input_name, axis, rank, has_past, sizes):
    batch, seq, past = sizes
    if isinstance(dim, int):
        return dim
    p = dim.lower()
    if "+" in p or "total" in p:
        return past + seq
    if "past" in p:
        return past
    if "batch" in p:
        return batch
    if input_name == "attention_mask" and has_past and axis == rank - 1:
        return past + seq  # merged decoders name it "sequence_length"
    return seq


def is_ids(name):
    low = name.lower()
    return "ids" in low and "token_type" not in low and "position" not in low


def make_feeds(specs, sizes, vocab=100):
    """Return {"ones": feed, "pad": feed or None}."""
    rng = np.random.default_rng(0)
    has_past = any(isinstance(d, str) and "past" in d.lower()
                   for _, _, dims in specs for d in dims)
    past = sizes[2] if has_past else 0
    ones, masks = {}, []
    for name, dtype, dims in specs:
        shape = [resolve_dim(d, name, i, len(dims), has_past, sizes) for i, d in enumerate(dims)]
        low = name.lower()
        if dtype == np.bool_:
            arr = np.ones(shape, dtype=bool)
        elif np.issubdtype(dtype, np.integer):
            if "mask" in low:
                arr = np.ones(shape, dtype=dtype)
                masks.append(name)
            elif "position_ids" in low:
                arr = np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(dtype)
            elif is_ids(name):
                arr = rng.integers(0, vocab, size=shape).astype(dtype)
            else:
                arr = np.zeros(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            arr = (rng.standard_normal(shape) * 0.5).astype(dtype)
        else:
            raise ValueError(f"input {name}: unsupported type {dtype}")
        ones[name] = np.array(arr, order="C")  # (ascontiguousarray would make a scalar 1-d)
    feeds = {"ones": ones, "pad": None}
    if masks:
        pad = {k: v.copy() for k, v in ones.items()}
        for name in masks:
            pad[name][0, ..., :2] = 0
        feeds["pad"] = pad
    return feeds


# --------------------------------------------------------------------------
# Workers (run in a child process: `check_runtimes.py --worker RT MODEL IN.npz OUT_PREFIX`)

def first_error(exc):
    text = str(exc).split("Stack backtrace:")[0].strip()
    return f"{type(exc).__name__}: {text}"


def worker(rt, model, feed_file, out_prefix):
    data = np.load(feed_file)
    feeds = {}
    for key in data.files:
        fs, name = key.split("/", 1)
        feeds.setdefault(fs, {})[name] = data[key]
    result = {"stage": None, "error": None, "ran": []}
    import onnx
    graph_outputs = [o.name for o in onnx.load(model, load_external_data=False).graph.output]

    def save(fs, outputs):
        np.savez(f"{out_prefix}.{fs}.npz", **outputs)
        result["ran"].append(fs)

    try:
        if rt == "ort":
            import onnxruntime as ort
            result["stage"] = "load"
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            names = [o.name for o in sess.get_outputs()]
            wanted = {i.name for i in sess.get_inputs()}
            for fs, feed in feeds.items():
                for run in ("", ".2"):
                    result["stage"] = f"run {fs}{run}"
                    outs = sess.run(None, {k: v for k, v in feed.items() if k in wanted})
                    save(fs + run, dict(zip(names, outs)))
        elif rt == "ov":
            import openvino as ov
            core = ov.Core()
            result["stage"] = "read_model"
            m = core.read_model(model)
            for fs, feed in feeds.items():
                # a fresh compile for every feed set: each one's first inference is
                # the first inference of a newly compiled model
                result["stage"] = "compile_model"
                compiled = core.compile_model(m, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
                req = compiled.create_infer_request()
                ov_feed = {}
                for port in compiled.inputs:  # a port can carry several tensor names
                    ov_feed[port] = next(feed[n] for n in port.get_names() if n in feed)
                for run in ("", ".2"):
                    result["stage"] = f"infer {fs}{run}"
                    res = req.infer(ov_feed)
                    outs = {}
                    for i, port in enumerate(compiled.outputs):
                        names = [n for n in graph_outputs if n in port.get_names()]
                        outs[names[0] if names else f"#{i}"] = np.array(res[port])
                    save(fs + run, outs)
        elif rt == "tract":
            import tract
            for fs, feed in feeds.items():
                result["stage"] = "onnx().load"
                im = tract.onnx().load(model)
                in_names = [im.input_name(i) for i in range(im.input_count())]
                # tract keeps the graph's output order; its output names are node names
                out_names = graph_outputs[:im.output_count()]
                result["stage"] = "set_input_fact"
                for i, name in enumerate(in_names):
                    arr = feed[name]
                    dt = {"float32": "f32", "float16": "f16", "float64": "f64", "int64": "i64",
                          "int32": "i32", "bool": "bool"}[str(arr.dtype)]
                    im.set_input_fact(i, ",".join([str(s) for s in arr.shape] + [dt]))
                result["stage"] = "into_model"
                typed = im.into_model()
                result["stage"] = "into_runnable (optimize)"
                runnable = typed.into_runnable()
                for run in ("", ".2"):
                    result["stage"] = f"run {fs}{run}"
                    outs = runnable.run([feed[n] for n in in_names])
                    save(fs + run, {n: t.to_numpy() for n, t in zip(out_names, outs)})
        result["stage"] = "done"
    except BaseException as exc:  # noqa: BLE001 - every failure is a finding
        result["error"] = first_error(exc)
    print("RESULT " + json.dumps(result))


def run_worker(rt, model, feeds, work, tag):
    os.makedirs(work, exist_ok=True)
    feed_file = os.path.join(work, f"{tag}.feeds.npz")
    arrays = {f"{fs}/{k}": v for fs, feed in feeds.items() if feed is not None for k, v in feed.items()}
    np.savez(feed_file, **arrays)
    prefix = os.path.join(work, f"{tag}.{rt}")
    for fs in FEEDSETS:
        for run in ("", ".2"):
            if os.path.exists(f"{prefix}.{fs}{run}.npz"):
                os.remove(f"{prefix}.{fs}{run}.npz")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", rt, model, feed_file, prefix]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"stage": "timeout", "error": f"timeout after {WORKER_TIMEOUT} s", "outs": {}}
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[7:])
    if result is None:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        tail = lines[-1]
        for i, line in enumerate(lines):
            if "panicked at" in line:  # a Rust panic: keep where and why
                tail = " ".join(lines[i:i + 2])
                break
        result = {"stage": "crashed", "error": f"child exit {proc.returncode}: {tail}", "ran": []}
    outs = {}
    for fs in result.get("ran", []):
        with np.load(f"{prefix}.{fs}.npz") as z:
            outs[fs] = {k: z[k] for k in z.files}
    result["outs"] = outs
    return result


# --------------------------------------------------------------------------
# Comparison

def compare(a, b):
    """max |a - b| over outputs both have (positions finite in both), and notes."""
    worst, notes = 0.0, []
    common = [k for k in a if k in b]
    if not common:
        return None, ["no common output names"]
    for k in common:
        x = np.asarray(a[k]).astype(np.float64)
        y = np.asarray(b[k]).astype(np.float64)
        if x.shape != y.shape:
            notes.append(f"{k}: shape {x.shape} vs {y.shape}")
            continue
        fin = np.isfinite(x) & np.isfinite(y)
        if fin.any():
            worst = max(worst, float(np.max(np.abs(x[fin] - y[fin]))))
        bad = int((~fin).sum())
        if bad:
            same = int(((~np.isfinite(x)) & (~np.isfinite(y)) & ((x == y) | (np.isnan(x) & np.isnan(y)))).sum())
            notes.append(f"{k}: nonfinite {int((~np.isfinite(x)).sum())}/{int((~np.isfinite(y)).sum())}"
                         f" ({bad - same} differ)")
    return worst, notes


def fmt(v):
    return "-" if v is None else f"{v:.6g}"


# --------------------------------------------------------------------------

def main(argv):
    if len(argv) >= 2 and argv[1] == "--worker":
        worker(*argv[2:6])
        return 0
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1])
        return 2
    binary, testdata, out_dir = argv[1:4]
    out_models = os.path.join(out_dir, "out")
    work = os.path.join(out_dir, "work")
    os.makedirs(out_models, exist_ok=True)
    import onnxruntime
    import openvino
    import tract
    versions = {"onnxruntime": onnxruntime.__version__, "openvino": openvino.__version__,
                "tract": tract.version()}
    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)

    results, errors, cache = [], [], {}
    without, refused = [], []
    t0 = time.time()

    def runtime_results(path, tag, feeds):
        key = (path, tag)
        if key not in cache:
            cache[key] = {rt: run_worker(rt, path, feeds, work, tag) for rt in RUNTIMES}
        return cache[key]

    for src in find_models(testdata):
        tag = model_tag(testdata, src)
        for target in ("ort", "portable"):
            dst = os.path.join(out_models, f"{tag}.{target}.onnx")
            err = run_fuser(binary, src, dst, target)
            if err:
                refused.append((tag, target, err))
                print(f"{tag} {target}: refused by onnx-fuse: {err}", flush=True)
                continue
            ops = count_kernel_ops(dst)
            if not any(op in ops for op in KERNEL_OPS):
                without.append((tag, target))
                continue
            row = {"model": tag, "target": target, "ops": ops, "notes": []}
            specs = graph_inputs(src)
            vocab = vocab_size(src, [n for n, _, _ in specs if is_ids(n)])
            sizes = (BATCH, SEQ, PAST)
            orig = None
            for attempt in ((BATCH, SEQ, PAST), (1, 1, PAST), (2, 7, PAST), (1, 7, PAST), (2, 64, PAST)):
                sizes = attempt
                feeds = make_feeds(specs, sizes, vocab)
                orig = runtime_results(src, f"{tag}.orig.{sizes[0]}x{sizes[1]}", feeds)
                if orig["ort"]["error"] is None:
                    break
            if orig["ort"]["error"] is not None:
                row["notes"].append("ONNX Runtime cannot run the original at any size tried")
            elif sizes != (BATCH, SEQ, PAST):
                row["notes"].append(f"sizes batch {sizes[0]} seq {sizes[1]}")
            if feeds["pad"] is None:
                row["notes"].append("no mask input: pad not run")
            fused = runtime_results(dst, f"{tag}.{target}.{sizes[0]}x{sizes[1]}", feeds)
            row["sizes"] = sizes
            ref = orig["ort"]["outs"]
            for rt in RUNTIMES:
                row[rt] = {"orig_loads": orig[rt]["error"] is None or orig[rt]["stage"].startswith(("run", "infer")),
                           "fused_loads": fused[rt]["error"] is None or fused[rt]["stage"].startswith(("run", "infer")),
                           "orig_error": orig[rt]["error"], "fused_error": fused[rt]["error"],
                           "orig_stage": orig[rt]["stage"], "fused_stage": fused[rt]["stage"]}
                for which, res in (("orig", orig[rt]), ("fused", fused[rt])):
                    if res["error"]:
                        errors.append(f"{tag} {target} {rt} {which} [{res['stage']}]: {res['error']}")
                for fs in FEEDSETS:
                    f_out = fused[rt]["outs"].get(fs)
                    o_out = orig[rt]["outs"].get(fs)
                    r_out = ref.get(fs)
                    within, n1 = compare(f_out, o_out) if f_out is not None and o_out is not None else (None, [])
                    cross, n2 = compare(f_out, r_out) if f_out is not None and r_out is not None else (None, [])
                    row[rt][fs] = {"within": within, "cross": cross}
                    # the same compiled model run a second time on the same feed
                    for which, res in (("orig", orig[rt]), ("fused", fused[rt])):
                        first, second = res["outs"].get(fs), res["outs"].get(fs + ".2")
                        if first is None or second is None:
                            continue
                        rerun, rn = compare(first, second)
                        rn = [n for n in rn if "(0 differ)" not in n]
                        if rerun or rn:
                            row["notes"].append(f"{rt} {fs} {which}: 2nd inference differs from 1st by "
                                                f"{fmt(rerun)}" + (f" ({'; '.join(rn)})" if rn else ""))
                    f2, o2 = fused[rt]["outs"].get(fs + ".2"), orig[rt]["outs"].get(fs + ".2")
                    if f2 is not None and o2 is not None:
                        w2, _ = compare(f2, o2)
                        c2, _ = compare(f2, ref.get(fs)) if ref.get(fs) is not None else (None, [])
                        row[rt][fs].update({"within_2nd": w2, "cross_2nd": c2})
                        if (w2, c2) != (within, cross):
                            row["notes"].append(f"{rt} {fs} 2nd inference: fused-orig {fmt(w2)} (vs ORT {fmt(c2)})")
                    for n in n1:
                        row["notes"].append(f"{rt} {fs} fused-vs-orig {n}")
                    for n in n2:
                        if rt != "ort":
                            row["notes"].append(f"{rt} {fs} fused-vs-ORT {n}")
            results.append(row)
            print(format_row(row), flush=True)

    summary = (f"summary: {len(results)} outputs with Attention/RotaryEmbedding checked, "
               f"{len(without)} outputs without them, {len(refused)} refused by onnx-fuse; "
               f"OV fused loads {sum(r['ov']['fused_loads'] for r in results)}/{len(results)}, "
               f"tract fused loads {sum(r['tract']['fused_loads'] for r in results)}/{len(results)}; "
               f"{time.time() - t0:.0f} s")
    print(summary)
    with open(os.path.join(out_dir, "errors.txt"), "w") as f:
        f.write("\n\n".join(errors) + "\n")
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"versions": versions, "checked": results, "without_kernel_ops": without,
                   "refused": refused, "summary": summary}, f, indent=1, default=str)
    return 0


def format_row(row):
    def loads(rt):
        o, f = row[rt]["orig_loads"], row[rt]["fused_loads"]
        return f"{'yes' if o else 'NO'}/{'yes' if f else 'NO'}"

    parts = [f"{row['model']} {row['target']} " + ",".join(f"{k}x{v}" for k, v in row["ops"].items())]
    for rt in RUNTIMES:
        d = row[rt]
        nums = " ".join(f"{fs} {fmt(d[fs]['within'])}" + ("" if rt == "ort" else f" (vs ORT {fmt(d[fs]['cross'])})")
                        for fs in FEEDSETS)
        parts.append(f"{rt} loads {loads(rt)} fused-orig {nums}")
    line = " | ".join(parts)
    if row["notes"]:
        line += " | notes: " + "; ".join(row["notes"])
    return line


if __name__ == "__main__":
    sys.exit(main(sys.argv))
