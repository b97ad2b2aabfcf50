#!/usr/bin/env python3
"""The next tools in a user's pipeline accept onnx-fuse's output (issue 56).

Usage: check_pipeline.py BINARY TESTDATA_DIR [--all] [--table FILE.md] [MODEL ...]

For each model (MODEL names are paths relative to TESTDATA_DIR; without
them the CI set below; `--all` takes every export: the top-level *.onnx but
the near-misses nm_*, and the *.onnx of the *_folder exports), the
everyday output (`BINARY IN -o OUT -q`) and the original each go through
ONNX Runtime's quantization tools, as a user runs them:

  int8      quantize_dynamic(IN, OUT)
  pre+int8  quant_pre_process(IN, PRE) (ONNX Runtime's symbolic shape
            inference, ONNX's shape inference, ONNX Runtime's basic
            optimizations), then quantize_dynamic(PRE, OUT)
  int4      MatMulNBitsQuantizer(onnx.load(IN), block_size=32).process()

Where a tool succeeds on the original it must succeed on the output. Where
both succeed, the quantized models and the float original run in ONNX
Runtime on the same random but deterministic inputs
(check_runtimes.make_feeds, seed 0): the quantized output must be as close
to the quantized original as the quantized original is to the float
original (the quantization's own error), with slack:

  max|Fq - Oq| <= SLACK * max|Oq - O| + ATOL     (every graph output)

A failure of the original is a fact about the tool, listed, not a failure
of this check. The check fails (exit 1) where onnx-fuse fails, where a tool
fails on the output only, where the outputs are further apart than allowed,
and where nothing at all was compared, so it never passes quietly.
`--table` writes the per-model results as a Markdown table.
"""
import contextlib
import io
import logging
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import onnx
import onnxruntime as ort
# Imported here, not where used: a tool that cannot be imported must stop
# the check, not count as a tool that refuses the original.
from onnxruntime.quantization import quant_pre_process, quantize_dynamic
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
from onnxruntime.quantization.registry import IntegerOpsRegistry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_runtimes import graph_inputs, is_ids, make_feeds, vocab_size  # noqa: E402

# Decoders and encoders of the three families' forms: Optimum's Llama with
# past (the issue's), a Llama TorchScript export with grouped heads, GPT-2
# with past, BERT from Optimum (the guarded encoder Attention), T5's encoder
# (relative position bias, an RMS norm), Whisper's encoder (unguarded
# Attention at opset 23) and BLOOM with past (AttentionCore viewing its
# scores in a shape computed at run time).
CI_MODELS = (
    "llama_optimum_past.onnx",
    "mistral_sdpa_ts_op17.onnx",
    "gpt2_optimum_past.onnx",
    "bert_optimum.onnx",
    "t5_encoder_ts_op14.onnx",
    "whisper_encoder_dynamo_op23.onnx",
    "bloom_optimum_past.onnx",
)
TOOLS = ("int8", "pre+int8", "int4")
SLACK, ATOL = 2.0, 1e-4
# Sizes (batch, sequence, past) tried in turn until the float original runs
# (as check_runtimes.py: some exports bake a traced length into a Reshape,
# audio encoders need longer inputs).
SIZES = ((2, 5, 3), (1, 1, 3), (2, 7, 3), (1, 7, 3), (2, 64, 3))


def exports(testdata):
    names = sorted(n for n in os.listdir(testdata)
                   if n.endswith(".onnx") and not n.startswith("nm_") and os.path.isfile(os.path.join(testdata, n)))
    for folder in sorted(d for d in os.listdir(testdata) if d.endswith("_folder")):
        names += sorted(f"{folder}/{n}" for n in os.listdir(os.path.join(testdata, folder)) if n.endswith(".onnx"))
    return names


def first_line(exc):
    text = str(exc).strip().splitlines()
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" (at {os.path.basename(where.filename)}:{where.lineno} {where.name})" if where else ""
    # Long enough to hold the op a refusal names (ONNX Runtime names the node's inputs first).
    return f"{type(exc).__name__}: {text[0][:800] if text else ''}{at}"


# ONNX Runtime 1.31.1's tools know `Attention` only as com.microsoft's:
# both dispatch on the op type alone, whatever the domain. Where the output
# holds ONNX's own `Attention` (opset 23) and a tool fails for that reason
# alone, the command docs/targets.md gives instead must work, and is the one
# compared:
# - quant_pre_process: its symbolic shape inference asserts in
#   `_infer_Attention` (ONNX Attention's third input, v, is no bias of rank
#   1): skip_symbolic_shape=True (ONNX's own inference and the optimizer run);
# - quantize_dynamic: rewrites an ONNX `Attention` of the main graph into a
#   com.microsoft `QAttention` that ONNX Runtime refuses to load:
#   op_types_to_quantize without "Attention" (after the pre-processing too).
# And where a transmuter.AttentionCore views its scores in a shape computed
# at run time (BLOOM), the symbolic shape inference gives the core's output
# new symbols (ONNX's inference of the function cannot read that shape) and,
# without auto_merge, stops where they meet the model's: auto_merge=True.
# Each: the tool, what its error names, what the output holds, the command.
WORKAROUNDS = [
    ("pre+int8", ("_infer_Attention", "QAttention"), "onnx_attention",
     "quant_pre_process(..., skip_symbolic_shape=True), "
     "then quantize_dynamic(..., op_types_to_quantize=[every default op but Attention])"),
    ("int8", ("QAttention",), "onnx_attention",
     "quantize_dynamic(..., op_types_to_quantize=[every default op but Attention])"),
    ("pre+int8", ("Incomplete symbolic shape inference",), "views_at_run_time",
     "quant_pre_process(..., auto_merge=True)"),
]


def holds(path, what):
    """Whether the model holds ONNX's Attention ("onnx_attention"), or an
    AttentionCore whose form reshapes to a shape read from outside it
    ("views_at_run_time"), in any graph."""
    def found(n):
        if what == "onnx_attention":
            return n.op_type == "Attention" and n.domain in ("", "ai.onnx")
        return n.op_type == "AttentionCore" and any(t.startswith("reshape_input") for t in n.overload.split("."))

    def walk(graph):
        return any(found(n) or any(walk(a.g) for a in n.attribute if a.HasField("g")) for n in graph.node)
    return walk(onnx.load(path, load_external_data=False).graph)


def quantize(tool, src, dst, workaround=None):
    """Runs one tool (as docs/targets.md says instead, with `workaround`:
    what the output holds that the tool stops on); returns None or the
    first line of its error."""
    attention = workaround == "onnx_attention"
    int8 = {"op_types_to_quantize": [op for op in IntegerOpsRegistry if op != "Attention"]} if attention else {}
    try:
        # The quantizers log every node and print warnings; only the verdict counts.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            if tool == "int8":
                quantize_dynamic(src, dst, **int8)
            elif tool == "pre+int8":
                pre = dst + ".pre.onnx"
                quant_pre_process(src, pre, skip_symbolic_shape=attention,
                                  auto_merge=workaround == "views_at_run_time")
                quantize_dynamic(pre, dst, **int8)
            else:
                q = MatMulNBitsQuantizer(onnx.load(src), block_size=32, is_symmetric=True)
                q.process()
                q.model.save_model_to_file(dst, use_external_data_format=False)
        return None
    except Exception as e:  # noqa: BLE001 - every refusal is a finding
        return first_line(e)


def session(path):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 4  # the sizes tried first may not fit: only the verdict counts
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run(sess, feed):
    wanted = {i.name for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, {k: v for k, v in feed.items() if k in wanted})))


def feeds_for(path):
    """Inputs the float original runs with, and its outputs on them."""
    specs = graph_inputs(path)
    vocab = vocab_size(path, [n for n, _, _ in specs if is_ids(n)])
    sess = session(path)
    last = None
    for sizes in SIZES:
        feed = make_feeds(specs, sizes, vocab)["ones"]
        try:
            return feed, run(sess, feed)
        except Exception as e:  # noqa: BLE001 - try the next sizes
            last = e
    raise RuntimeError(f"the original runs on none of the sizes tried: {first_line(last)}")


def max_diff(a, b):
    """Largest |a - b| over every output both have; inf where one is not finite where the other is."""
    worst = 0.0
    for name in a.keys() & b.keys():
        x, y = np.asarray(a[name], dtype=np.float64), np.asarray(b[name], dtype=np.float64)
        if x.shape != y.shape or (np.isfinite(x) != np.isfinite(y)).any():
            return float("inf")
        both = np.isfinite(x)
        if both.any():
            worst = max(worst, float(np.abs(x[both] - y[both]).max()))
    return worst


def inferred_types(path):
    """{(body path, value): element type} as ONNX's shape inference types
    them (what the quantizers read), and the values nodes compute."""
    model = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False))
    types, computed = {}, set()

    def walk(graph, where):
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[(where, vi.name)] = vi.type.tensor_type.elem_type
        for n in graph.node:
            computed.update((where, o) for o in n.output if o)
            for a in n.attribute:
                if a.HasField("g"):
                    walk(a.g, f"{where}/{n.name}.{a.name}")
    walk(model.graph, "")
    return types, computed


def check(binary, testdata, name, tmp):
    """One model: {"fuse": error or None, tool: result}, and the failures."""
    src = os.path.join(testdata, name)
    tag = name.replace("/", "__")[:-len(".onnx")]
    out = os.path.join(tmp, f"{tag}.fused.onnx")
    r = subprocess.run([binary, src, "-o", out, "-q"], capture_output=True, text=True)
    if r.returncode != 0:
        return {"fuse": (r.stderr or r.stdout).strip()[:200]}, [f"{name}: onnx-fuse failed: {r.stderr.strip()}"]
    result, failures = {"fuse": None}, []
    # ONNX's inference types every value of the output it types in the
    # export, and alike: the types onnx-fuse declares where it cannot reach.
    (before, _), (after, computed) = inferred_types(src), inferred_types(out)
    untyped = sorted(v for k, v in before.keys() & computed if (k, v) not in after)
    other = sorted(v for k, v in before.keys() & after.keys() if before[(k, v)] != after[(k, v)])
    result["untyped"] = len(untyped)
    if untyped or other:
        failures.append(f"{name}: ONNX's shape inference types {len(untyped)} values of the export but not of the "
                        f"output (first {untyped[:3]}), {len(other)} otherwise (first {other[:3]})")
    try:
        feed, float_outputs = feeds_for(src)
    except Exception as e:  # noqa: BLE001
        feed, float_outputs = None, None
        result["runs"] = first_line(e)
    for tool in TOOLS:
        paths = {which: os.path.join(tmp, f"{tag}.{which}.{tool}.onnx") for which in ("original", "output")}
        errors = {"original": quantize(tool, src, paths["original"]), "output": quantize(tool, out, paths["output"])}
        cell = {"original": errors["original"], "output": errors["output"]}
        result[tool] = cell
        # A model a quantizer wrote that does not run is its failure; where
        # no inputs could be made, that it loads is all that is checked.
        def run_quantized(path):
            """(its outputs, None), or (None, why it does not run)."""
            try:
                return (run(session(path), feed) if feed is not None else session(path) and None), None
            except Exception as e:  # noqa: BLE001
                return None, f"writes a model that does not run: {first_line(e)}"

        quantized = fused = None
        if errors["original"] is None:
            quantized, errors["original"] = run_quantized(paths["original"])
            cell["original"] = errors["original"] or cell["original"]
        if errors["output"] is None:
            fused, errors["output"] = run_quantized(paths["output"])
            cell["output"] = errors["output"] or cell["output"]
        if errors["original"] is not None:
            continue
        known = next((w for w in WORKAROUNDS if w[0] == tool and errors["output"]
                      and any(k in errors["output"] for k in w[1]) and holds(out, w[2])), None)
        if known:
            # ONNX Runtime's tool stops on what the output holds: the documented command instead.
            cell["instead"] = known[3]
            errors["output"] = cell["workaround"] = quantize(tool, out, paths["output"], workaround=known[2])
            if errors["output"] is None:
                fused, errors["output"] = run_quantized(paths["output"])
                cell["workaround"] = errors["output"] or cell["workaround"]
        if errors["output"] is not None:
            failures.append(f"{name}: {tool} succeeds on the original but fails on the output: {errors['output']}")
            continue
        if feed is None:
            continue
        own, ours = max_diff(quantized, float_outputs), max_diff(fused, quantized)
        cell["quantization"], cell["fused"] = own, ours
        if not ours <= SLACK * own + ATOL:
            failures.append(f"{name}: {tool}: the quantized output is {ours:.3g} from the quantized original, "
                            f"whose own quantization error is {own:.3g} (allowed {SLACK} x that + {ATOL})")
    return result, failures


def cell_text(cell):
    def verdict(err):
        return "ok" if err is None else "**fails**"
    text = f"{verdict(cell['original'])} / {verdict(cell['output'])}"
    if "instead" in cell:
        text += f", instead: {verdict(cell['workaround'])}"
    if "fused" in cell:
        text += f" ({cell['fused']:.2g} vs {cell['quantization']:.2g})"
    return text


def main(argv):
    logging.disable(logging.WARNING)
    args = [a for a in argv if not a.startswith("--")]
    table = next((argv[i + 1] for i, a in enumerate(argv) if a == "--table"), None)
    args = [a for a in args if a != table]
    table = table and os.path.abspath(table)
    binary, testdata, models = os.path.abspath(args[0]), os.path.abspath(args[1]), args[2:]
    if "--all" in argv:
        models = exports(testdata)
    models = models or list(CI_MODELS)
    failures, rows, compared = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        # quant_pre_process writes its temporaries (a model, external data
        # under random names) into the working folder: the checkout's, else.
        os.chdir(tmp)
        for name in models:
            if not os.path.isfile(os.path.join(testdata, name)):
                failures.append(f"{name}: no such model in {testdata}")
                continue
            result, failed = check(binary, testdata, name, tmp)
            failures += failed
            compared += sum("fused" in result.get(t, {}) for t in TOOLS)
            rows.append((name, result))
            cells = "; ".join(f"{t} {cell_text(result[t])}" for t in TOOLS if t in result)
            print(f"{name}: {cells or 'onnx-fuse failed'}{'; ' + result['runs'] if 'runs' in result else ''}",
                  flush=True)
            for t in TOOLS:
                for which in ("original", "output"):
                    err = result.get(t, {}).get(which)
                    if err:
                        print(f"  {t} {which}: {err[:300]}")
            for f in os.listdir(tmp):  # the quantized copies of this model are done with
                os.remove(os.path.join(tmp, f))
        os.chdir("/")
    if table:
        with open(table, "w") as f:
            f.write("| model | " + " | ".join(TOOLS) + " |\n|---|" + "---|" * len(TOOLS) + "\n")
            for name, result in rows:
                f.write(f"| `{name}` | " + " | ".join(cell_text(result[t]) if t in result else "onnx-fuse failed"
                                                    for t in TOOLS) + " |\n")
    if compared == 0:
        failures.append("no quantized model was compared: nothing was checked")
    print(f"check_pipeline: {len(rows)} models, {compared} quantized pairs compared, {len(failures)} failures")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
