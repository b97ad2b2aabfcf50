#!/usr/bin/env python3
"""Exports the two large models the benchmark needs, with random weights
(no download): a GPT-2-medium-size model in one file (~1.4 GB, opset 14,
decomposed LayerNorms) and a TinyLlama-size 1.1B-parameter Llama with its
weights in external data (~4.4 GB). Usage: bench_models.py OUT_DIR [gpt2]
(gpt2: the first only)."""

import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_testdata import Wrap, use_mask_without_vmap  # noqa: E402


def export(model, kind, path, constant_folding=False, seq=8):
    ids = torch.randint(0, 100, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        torch.onnx.export(Wrap(model.eval(), kind), (ids, mask), path, input_names=["input_ids", "attention_mask"],
                          output_names=["out"], dynamic_axes=axes, opset_version=14, dynamo=False,
                          do_constant_folding=constant_folding)


def main():
    out = sys.argv[1]
    use_mask_without_vmap()
    torch.manual_seed(0)
    gpt2 = os.path.join(out, "gpt2-medium", "model.onnx")
    if not os.path.exists(gpt2):
        os.makedirs(os.path.dirname(gpt2), exist_ok=True)
        cfg = transformers.GPT2Config(n_embd=1024, n_layer=24, n_head=16)
        export(transformers.GPT2LMHeadModel(cfg), "gpt2", gpt2)
    llama = os.path.join(out, "tinyllama", "model.onnx")
    if sys.argv[2:] != ["gpt2"] and not os.path.exists(llama):
        os.makedirs(os.path.dirname(llama), exist_ok=True)
        cfg = transformers.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                                       num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                                       tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
        export(model, "llama", llama)


if __name__ == "__main__":
    main()
