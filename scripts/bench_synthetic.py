#!/usr/bin/env python3
"""A 1.6 GB single-file model for the benchmark that needs only onnx and
numpy (no exporter): 24 layers of a decomposed RMSNorm, a 4096 x 4096
MatMul and a residual Add, f32, opset 14, x of shape [batch, seq, 4096].
Usage: bench_synthetic.py OUT.onnx [LAYERS]"""

import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

D = 4096
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 24
rng = np.random.default_rng(0)
nodes, inits, x = [], [], "x"
for i in range(layers):
    p = f"/layers.{i}/"
    inits += [
        numpy_helper.from_array(np.array(2.0, np.float32), p + "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), p + "eps"),
        numpy_helper.from_array((1 + 0.01 * rng.standard_normal(D)).astype(np.float32), p + "weight"),
        numpy_helper.from_array((rng.standard_normal((D, D)) / 64).astype(np.float32), p + "W"),
    ]
    op = lambda t, i, o, **a: helper.make_node(t, i, [p + o], name=p + t + "_" + o, **a)  # noqa: E731
    nodes += [
        op("Pow", [x, p + "two"], "sq"),
        op("ReduceMean", [p + "sq"], "mean", axes=[-1]),
        op("Add", [p + "mean", p + "eps"], "var"),
        op("Sqrt", [p + "var"], "rms"),
        op("Div", [x, p + "rms"], "normed"),
        op("Mul", [p + "normed", p + "weight"], "scaled"),
        op("MatMul", [p + "scaled", p + "W"], "proj"),
        op("Add", [x, p + "proj"], "residual"),
    ]
    x = p + "residual"
graph = helper.make_graph(
    nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D])],
    [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
model.ir_version = 8
onnx.save(model, sys.argv[1])
