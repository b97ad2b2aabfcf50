//! Facts about ONNX operators that the toolkit relies on, in one place.

use crate::onnx::NodeProto;

mod arity;

/// How many inputs and outputs a node of one op version may have, and
/// which positions must name a value (bit i: position i). A node outside
/// these is one ONNX Runtime refuses to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arity {
    pub inputs: (u32, u32),
    pub required_inputs: u32,
    pub outputs: (u32, u32),
    pub required_outputs: u32,
}

/// ONNX Runtime's own operators that onnx-fuse reads or writes, outside
/// ONNX's schemas: (domain, op, arity), from ONNX Runtime's contrib-op
/// schemas (`onnxruntime/core/graph/contrib_ops`), and onnx-fuse's own
/// `transmuter.AttentionCore` (q, k, v, then the side values it adds).
#[rustfmt::skip]
const CONTRIB: &[(&str, &str, Arity)] = &[
    ("com.microsoft", "SkipLayerNormalization", Arity { inputs: (3, 5), required_inputs: 0x7, outputs: (1, 4), required_outputs: 0x1 }),
    ("com.microsoft", "SkipSimplifiedLayerNormalization", Arity { inputs: (3, 4), required_inputs: 0x7, outputs: (1, 4), required_outputs: 0x1 }),
    ("com.microsoft", "Gelu", Arity { inputs: (1, 1), required_inputs: 0x1, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "FastGelu", Arity { inputs: (1, 2), required_inputs: 0x1, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "BiasGelu", Arity { inputs: (2, 2), required_inputs: 0x3, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "QuickGelu", Arity { inputs: (1, 1), required_inputs: 0x1, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "FusedMatMul", Arity { inputs: (2, 2), required_inputs: 0x3, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "ComplexMul", Arity { inputs: (2, 2), required_inputs: 0x3, outputs: (1, 1), required_outputs: 0x1 }),
    ("com.microsoft", "ComplexMulConj", Arity { inputs: (2, 2), required_inputs: 0x3, outputs: (1, 1), required_outputs: 0x1 }),
    // Registered by ONNX Runtime in the default domain, at version 1.
    ("", "SimplifiedLayerNormalization", Arity { inputs: (2, 2), required_inputs: 0x3, outputs: (1, 2), required_outputs: 0x1 }),
    ("", "LayerNormalization", Arity { inputs: (2, 3), required_inputs: 0x3, outputs: (1, 3), required_outputs: 0x1 }),
    (crate::onnx::TRANSMUTER_DOMAIN, "AttentionCore", Arity { inputs: (3, u32::MAX), required_inputs: 0x7, outputs: (1, 1), required_outputs: 0x1 }),
];

/// The arity of `op` in `domain` at the model's default-domain `opset`:
/// ONNX's newest version of it up to `opset`, else ONNX Runtime's own
/// registration; None for an op neither defines (nothing reads it).
pub fn arity(domain: &str, op: &str, opset: i64) -> Option<Arity> {
    let default = crate::onnx::is_default_domain(domain);
    let onnx = default.then(|| {
        // The table is sorted by name, then version: the versions of `op`
        // up to `opset` end just before the first entry past them.
        let table = arity::DEFAULT_DOMAIN;
        let end = table.partition_point(|&(name, since, _)| name < op || (name == op && since <= opset));
        end.checked_sub(1).map(|i| table[i]).filter(|&(name, _, _)| name == op).map(|(_, _, a)| a)
    });
    onnx.flatten().or_else(|| {
        let domain = if default { "" } else { domain };
        CONTRIB.iter().find(|(d, name, _)| *d == domain && *name == op).map(|(_, _, a)| *a)
    })
}

/// True where ONNX's own shape inference (`onnx.shape_inference`) knows
/// `op` at the model's default-domain `opset`: an op of ONNX's schemas from
/// that opset on. ONNX Runtime's ops registered in the default domain
/// (`SimplifiedLayerNormalization`, `LayerNormalization` below 17) and
/// every other domain's are unknown to it: the values they compute, and
/// those computed from them, get no type there.
pub fn onnx_infers(domain: &str, op: &str, opset: i64) -> bool {
    crate::onnx::is_default_domain(domain) && arity::DEFAULT_DOMAIN.iter().any(|&(name, since, _)| name == op && since <= opset)
}

/// Why a node is not one its op defines: too few or too many inputs or
/// outputs, or an empty name where the op requires a value (at the
/// model's default-domain opset). ONNX Runtime refuses such a node; the
/// graph view hides it from every rule and derivation (`Graph::producer`,
/// the anchors the driver offers), so a rule may read any position its op
/// requires without checking it. An op no table knows is never malformed:
/// no rule reads it.
pub fn malformed(node: &NodeProto, opset: i64) -> Option<String> {
    let arity = arity(node.domain(), node.op_type(), opset)?;
    let check = |values: &[String], (min, max): (u32, u32), required: u32, kind: &str| {
        let what = || format!("{} {}", node.op_type(), node.name());
        let wanted = required.count_ones();
        let present = (0..values.len().min(32)).filter(|&i| required & (1 << i) != 0 && !values[i].is_empty()).count();
        if present < wanted as usize {
            return Some(match (kind, present, wanted) {
                ("output", 0, 1) => format!("{} has no output", what()),
                _ => format!("{} has {present} of the {wanted} {kind}s it requires", what()),
            });
        }
        let n = values.len();
        (n < min as usize || n > max as usize).then(|| {
            let range = match (min, max) {
                (min, u32::MAX) => format!("at least {min}"),
                (min, max) if min == max => format!("{min}"),
                (min, max) => format!("{min} to {max}"),
            };
            format!("{} has {n} {kind}s where its op takes {range}", what())
        })
    };
    check(&node.input, arity.inputs, arity.required_inputs, "input")
        .or_else(|| check(&node.output, arity.outputs, arity.required_outputs, "output"))
}

/// Ops that compute the same outputs from the same inputs and attributes
/// (no randomness, no state): two such nodes that agree are one value.
#[rustfmt::skip]
pub const DETERMINISTIC: &[&str] = &[
    "Abs", "Add", "And", "Cast", "CastLike", "Ceil", "Clip", "Concat", "ConstantOfShape", "Cos", "Div", "Equal", "Erf",
    "Exp", "Expand", "Flatten", "Floor", "Gather", "Greater", "GreaterOrEqual", "Identity", "IsInf", "IsNaN", "Less",
    "LessOrEqual", "Log", "MatMul", "Max", "Min", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "Range", "Reciprocal",
    "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape", "Round", "Shape", "Sigmoid", "Sign", "Sin",
    "Size", "Slice", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh", "Tile", "Transpose", "Trilu", "Unsqueeze", "Where",
    "Xor",
];

/// Ops whose first output has the element type of their first input.
pub const SAME_TYPE_AS_FIRST_INPUT: &[&str] = &[
    "Abs",
    "Add",
    "Attention",
    "AveragePool",
    "BatchNormalization",
    "Ceil",
    "Clip",
    "Concat",
    "Conv",
    "ConvTranspose",
    "Cos",
    "CumSum",
    "Div",
    "Dropout",
    "Einsum",
    "Elu",
    "Erf",
    "Exp",
    "Expand",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "GatherND",
    "Gelu",
    "Gemm",
    "GlobalAveragePool",
    "HardSigmoid",
    "HardSwish",
    "Identity",
    "InstanceNormalization",
    "LayerNormalization",
    "LeakyRelu",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "MaxPool",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "PRelu",
    "Pad",
    "Pow",
    "Range",
    "Reciprocal",
    "ReduceL2",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Relu",
    "Reshape",
    "Resize",
    "RotaryEmbedding",
    "Round",
    "ScatterElements",
    "ScatterND",
    "Selu",
    "Sigmoid",
    "Sign",
    "Sin",
    "Slice",
    "Softmax",
    "Softplus",
    "Split",
    "Sqrt",
    "Squeeze",
    "Sub",
    "Sum",
    "Tanh",
    "Tile",
    "Transpose",
    "Trilu",
    "Unsqueeze",
];

/// Ops whose first output has the shape of their first input.
#[rustfmt::skip]
pub const SAME_SHAPE_AS_FIRST_INPUT: &[&str] = &[
    "Cast", "Softmax", "LogSoftmax", "Relu", "Neg", "Sqrt", "Reciprocal", "Exp", "Erf", "Tanh", "Sigmoid", "IsNaN",
    "Not", "Identity", "Dropout", "LayerNormalization", "SimplifiedLayerNormalization", "CastLike", "Cos", "Sin",
    "Abs", "Log", "Floor", "Ceil", "Round", "Sign", "Gelu", "Softplus", "HardSigmoid", "LeakyRelu", "Elu", "Selu",
    "Mish", "HardSwish", "Clip", "IsInf", "CumSum", "Trilu", "ScatterND", "ScatterElements", "BitwiseNot", "EyeLike",
    "Tan", "Atan", "Acos", "Asin", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Softsign", "ThresholdedRelu", "Shrink",
    "Celu", "Hardmax", "LpNormalization", "MeanVarianceNormalization", "InstanceNormalization", "GroupNormalization",
    "RMSNormalization", "BatchNormalization", "PRelu", "RotaryEmbedding",
];

/// True when output `index` of a `com.microsoft` op onnx-fuse writes has
/// the shape and element type of the op's first input: the GELU family's
/// output, a skip-norm's output and its sum (output 3; its mean and
/// inverse standard deviation, which onnx-fuse never uses, differ).
pub fn ms_output_like_first_input(node: &NodeProto, index: usize) -> bool {
    let skip = matches!(node.op_type(), "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization");
    let gelu = matches!(node.op_type(), "Gelu" | "FastGelu" | "BiasGelu" | "QuickGelu");
    node.domain() == "com.microsoft" && ((skip && (index == 0 || index == 3)) || (gelu && index == 0))
}

/// Elementwise ops whose inputs broadcast (numpy rules) to the output.
#[rustfmt::skip]
pub const BROADCASTING: &[&str] = &[
    "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And",
    "Or", "Xor", "Max", "Min", "Mod", "Sum", "Mean", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
];

#[cfg(test)]
mod tests {
    /// `arity` finds an op's versions by binary search.
    #[test]
    fn the_default_domain_table_is_sorted_by_name_then_version() {
        for pair in super::arity::DEFAULT_DOMAIN.windows(2) {
            let ((a, va, _), (b, vb, _)) = (pair[0], pair[1]);
            assert!((a, va) < (b, vb), "{a}-{va} before {b}-{vb}");
        }
        let add = |opset| super::arity("", "Add", opset).map(|a| a.inputs);
        assert_eq!((add(0), add(1), add(26)), (None, Some((2, 2)), Some((2, 2))));
        assert!(super::arity("", "Zzz", 26).is_none() && super::arity("", "Abs", 26).is_some());
    }
}

/// How far a Conv's or pool's window reaches along one axis:
/// dilation·(kernel − 1) + 1 (none where that overflows).
pub fn window_reach(dilation: i64, kernel: i64) -> Option<i64> {
    dilation.checked_mul(kernel.checked_sub(1)?)?.checked_add(1)
}

/// Rounded up (`ceil_mode`), a pool's last window may start in the end's
/// pad, which ONNX Runtime drops (and ONNX from opset 19, MaxPool 22;
/// `tests/kernel.rs`). None can where the end's pad plus the stride is at
/// most the window's reach: then every runtime and every version keeps the
/// same windows.
pub fn windows_start_inside(stride: i64, reach: i64, end_pad: i64) -> bool {
    stride > 0 && end_pad.checked_add(stride).is_some_and(|end| end <= reach)
}
