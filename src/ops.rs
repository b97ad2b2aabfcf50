//! Facts about ONNX operators that the toolkit relies on, in one place.

use crate::onnx::NodeProto;

/// Why a default-domain node lacks what its op cannot run without: an
/// input the op requires (at the model's opset) or an output. Only the ops
/// the toolkit and the passes read are listed; the graph view hides such a
/// node from every rule (`Graph::producer`), so a rule may read the inputs
/// an op requires without checking them.
pub fn malformed(node: &NodeProto, opset: i64) -> Option<String> {
    if !crate::onnx::is_default_domain(node.domain()) || node.is("Constant") {
        return None;
    }
    if node.output.first().is_none_or(|o| o.is_empty()) {
        return Some(format!("{} {} has no output", node.op_type(), node.name()));
    }
    let required = match node.op_type() {
        "Where" => 3,
        "Slice" if opset >= 10 => 3,
        "Unsqueeze" if opset >= 13 => 2,
        "Add"
        | "Sub"
        | "Mul"
        | "Div"
        | "Pow"
        | "MatMul"
        | "Gather"
        | "Reshape"
        | "Expand"
        | "CastLike"
        | "LayerNormalization"
        | "SimplifiedLayerNormalization"
        | "RMSNormalization" => 2,
        "Cast" | "Identity" | "Sqrt" | "Reciprocal" | "Softmax" | "IsNaN" | "Transpose" | "ReduceMean" | "Squeeze"
        | "Sigmoid" | "Erf" | "Tanh" | "Unsqueeze" | "Slice" | "Split" | "Concat" | "Shape" | "ConstantOfShape" => 1,
        _ => 0,
    };
    let present = node.input.iter().take(required).filter(|v| !v.is_empty()).count();
    (present < required)
        .then(|| format!("{} {} has {present} of the {required} inputs it requires", node.op_type(), node.name()))
}

/// Ops that compute the same outputs from the same inputs and attributes
/// (no randomness, no state): two such nodes that agree are one value.
#[rustfmt::skip]
pub const DETERMINISTIC: &[&str] = &[
    "Abs", "Add", "Cast", "CastLike", "Concat", "Cos", "Div", "Equal", "Erf", "Exp", "Expand", "Gather", "Identity",
    "Log", "MatMul", "Mul", "Neg", "Pow", "Reciprocal", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu",
    "Reshape", "Shape", "Sigmoid", "Sin", "Slice", "Softmax", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose",
    "Unsqueeze", "Where",
];

/// Ops whose first output has the element type of their first input.
pub const SAME_TYPE_AS_FIRST_INPUT: &[&str] = &[
    "Abs",
    "Add",
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
    "Mish", "HardSwish", "Clip", "IsInf", "CumSum", "Trilu", "ScatterND", "ScatterElements", "BitwiseNot",
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
    "Or", "Xor", "Max", "Min",
];
