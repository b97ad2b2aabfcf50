#!/usr/bin/env python3
"""Loads an export folder and its fused copy with Optimum's ORTModel classes
and checks that both generate the same tokens (greedy): the fused folder is
a drop-in replacement. Run with the testdata environment (.venv, see
gen_testdata.sh):  .venv/bin/python scripts/check_optimum_folder.py ORIGINAL FUSED
Exits non-zero on any difference or load failure."""

import json
import os
import sys

import numpy as np
import torch
from optimum.onnxruntime import ORTModelForCausalLM, ORTModelForSeq2SeqLM

original, fused = sys.argv[1:3]
config = json.load(open(os.path.join(original, "config.json")))
seq2seq = config.get("is_encoder_decoder", False)
cls = ORTModelForSeq2SeqLM if seq2seq else ORTModelForCausalLM
files = sorted(f for f in os.listdir(original) if f.endswith(".onnx"))
kwargs = {}
if not seq2seq:
    # A folder with decoder_model_merged.onnx: load that one.
    merged = "decoder_model_merged.onnx" in files
    kwargs = dict(file_name="decoder_model_merged.onnx" if merged else files[0], use_cache=True, use_io_binding=False)
ids = torch.tensor([[3, 14, 15, 9, 2, 6]])
outputs = []
for folder in (original, fused):
    model = cls.from_pretrained(folder, **kwargs)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    outputs.append(out.numpy())
    print(f"{folder}: loaded by {cls.__name__}, generated {out.numpy().tolist()}")
if not np.array_equal(*outputs):
    sys.exit("the fused folder generates other tokens")
print("same tokens")
