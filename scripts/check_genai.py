#!/usr/bin/env python3
"""onnxruntime-genai generates the same tokens from onnx-fuse's output as
from the export (issue 56).

Usage: check_genai.py BINARY MODEL.onnx [MODEL.onnx ...] [--tokens N]
           [--long N] [--type T] [--heads N] [--hidden N]

Each MODEL is a decoder export with a KV cache in Optimum's form: inputs
input_ids, attention_mask and position_ids where the export has them,
past_key_values.%d.key/value; outputs logits, present.%d.key/value (past
and present separate, the past axis growing). For each, the everyday
output (`BINARY MODEL -o OUT -q`) is written to a temporary folder, and
the export and the output each get a folder with the same
genai_config.json, the one a user writes for the export:

  model.type                  T (--type, default llama: onnxruntime-genai's
                              decoder with a key and a value per layer; its
                              gpt2 type does not run Optimum's GPT-2)
  model.vocab_size            the last axis of logits
  model.context_length        the longer prompt + N
  model.decoder.filename      model.onnx
  model.decoder.inputs,       the names above (attention_mask and
  outputs                     position_ids only where the export has them)
  num_hidden_layers           the number of past_key_values.%d.key inputs
  num_key_value_heads,        axes 1 and 3 of past_key_values.0.key
  head_size
  hidden_size                 --hidden, else the width of the embedding
                              table (a Gather's initializer of vocab rows)
  num_attention_heads         --heads, else hidden_size / head_size
  eos_token_id                [] (no token stops generation)
  search.past_present_share_buffer  false (the builder writes true for its
                              own model; an export's present is a new tensor
                              one step longer than its past)

onnxruntime-genai then generates N tokens (--tokens, default 32) greedily
after each of two prompts of random ids (seed 0), 6 tokens and --long
tokens (default 24: the testdata decoders have 64 positions), from token
ids (no tokenizer). The check fails (exit 1) where onnx-fuse fails, where
no config can be read from the export, where either model does not load or
run, and where the two generate other tokens. It prints one line per model:
`check_genai: MODEL: K tokens equal` (K over both prompts, with the largest
|logits of the output - logits of the export| over all steps), or
`FAIL MODEL: ...`.

Needs onnxruntime-genai (it brings the onnxruntime it runs on) and onnx.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime_genai as og


def dims(value):
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]


def config_of(path, args, context):
    """The genai_config.json the export at path needs, its values read from
    its inputs, outputs and embedding table."""
    model = onnx.load(path, load_external_data=False)
    inputs = {i.name: dims(i) for i in model.graph.input}
    outputs = {o.name: dims(o) for o in model.graph.output}
    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    if layers == 0 or "logits" not in outputs:
        raise ValueError("not a decoder with past_key_values.%d.key inputs and a logits output")
    _, kv_heads, _, head_size = inputs["past_key_values.0.key"]
    vocab = outputs["logits"][-1]
    hidden = args.hidden
    if hidden is None:
        tables = {t.name: list(t.dims) for t in model.graph.initializer}
        hidden = next(tables[n.input[0]][1] for n in model.graph.node
                      if n.op_type == "Gather" and len(tables.get(n.input[0], ())) == 2 and tables[n.input[0]][0] == vocab)
    heads = args.heads or hidden // head_size
    if not all(isinstance(v, int) and v > 0 for v in (kv_heads, head_size, vocab, hidden)):
        raise ValueError(f"sizes not all fixed: kv heads {kv_heads}, head size {head_size}, vocab {vocab}, hidden {hidden}")
    names = {"input_ids": "input_ids", "past_key_names": "past_key_values.%d.key",
             "past_value_names": "past_key_values.%d.value"}
    for name in ("attention_mask", "position_ids"):
        if name in inputs:
            names[name] = name
    decoder = {
        "filename": "model.onnx",
        "head_size": head_size,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "inputs": names,
        "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
    }
    return {
        "model": {"type": args.type, "vocab_size": vocab, "context_length": context,
                  "bos_token_id": 1, "eos_token_id": [], "pad_token_id": 0, "decoder": decoder},
        "search": {"do_sample": False, "max_length": context, "past_present_share_buffer": False},
    }


def generate(folder, prompt, tokens):
    """Greedy: the new token ids and the logits of each step."""
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    logits = []
    while not generator.is_done():
        logits.append(np.array(generator.get_logits()))
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(prompt):]], logits


def check(binary, path, args, work):
    """One line of the report: the tokens equal, or the first failure."""
    rng = np.random.default_rng(0)
    folders = {kind: os.path.join(work, kind) for kind in ("export", "fused")}
    for folder in folders.values():
        os.makedirs(folder)
    os.symlink(os.path.abspath(path), os.path.join(folders["export"], "model.onnx"))
    r = subprocess.run([binary, path, "-o", os.path.join(folders["fused"], "model.onnx"), "-q"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        return f"FAIL {path}: onnx-fuse exited {r.returncode}: {r.stderr.strip()[:300]}"
    try:
        config = config_of(path, args, max(6, args.long) + args.tokens)
    except (ValueError, KeyError, StopIteration) as e:
        return f"FAIL {path}: no genai_config.json: {e!r}"
    for folder in folders.values():
        with open(os.path.join(folder, "genai_config.json"), "w") as f:
            json.dump(config, f, indent=2)
    vocab = config["model"]["vocab_size"]
    prompts = [rng.integers(0, vocab, n).tolist() for n in (6, args.long)]
    equal, gap = 0, 0.0
    for prompt in prompts:
        runs = {}
        for kind, folder in folders.items():
            try:
                runs[kind] = generate(folder, prompt, args.tokens)
            except Exception as e:  # the runtime's error, as a line of the report
                return f"FAIL {path}: {kind} does not run in onnxruntime-genai: {str(e).strip()[:300]}"
        (a, la), (b, lb) = runs["export"], runs["fused"]
        steps = min(len(la), len(lb))
        gap = max([gap] + [float(np.abs(la[i] - lb[i]).max()) for i in range(steps)])
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return (f"FAIL {path}: prompt of {len(prompt)}: token {at} differs "
                    f"(export {a[at:at + 4]}, fused {b[at:at + 4]}), max |logits gap| {gap:.3g}")
        equal += len(a)
    return f"check_genai: {path}: {equal} tokens equal (max |logits gap| {gap:.2g})"


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("binary")
    p.add_argument("models", nargs="+")
    p.add_argument("--tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--long", type=int, default=24, help="length of the second prompt")
    p.add_argument("--type", default="llama", help="onnxruntime-genai's model type")
    p.add_argument("--heads", type=int, help="attention heads (default hidden / head size)")
    p.add_argument("--hidden", type=int, help="hidden size (default the embedding table's width)")
    args = p.parse_args(argv)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(args.models):
            line = check(args.binary, path, args, os.path.join(tmp, str(i)))
            print(line, flush=True)
            failed |= line.startswith("FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
