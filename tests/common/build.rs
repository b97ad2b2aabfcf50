//! Hand-made models for tests: a small graph builder over the ONNX types.

use onnx_fuse::onnx::proto::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
use onnx_fuse::onnx::proto::type_proto::{Tensor, Value as TypeValue};
use onnx_fuse::onnx::proto::TensorShapeProto;
use onnx_fuse::onnx::{
    AttributeProto, AttributeType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TypeProto,
    ValueInfoProto,
};

/// A dimension of a declared shape: a number, a symbol, or nothing known.
#[derive(Debug, Clone, PartialEq)]
pub enum D {
    N(i64),
    S(String),
    Unknown,
}

pub fn sym(name: &str) -> D {
    D::S(name.to_string())
}

/// A tensor value_info; `dims` None declares no shape at all.
pub fn value_info(name: &str, elem: i32, dims: Option<&[D]>) -> ValueInfoProto {
    let shape = dims.map(|dims| TensorShapeProto {
        dim: dims
            .iter()
            .map(|d| Dimension {
                value: match d {
                    D::N(n) => Some(DimValue::DimValue(*n)),
                    D::S(s) => Some(DimValue::DimParam(s.clone())),
                    D::Unknown => None,
                },
                ..Default::default()
            })
            .collect(),
    });
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(TypeValue::TensorType(Tensor { elem_type: Some(elem), shape })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A value's declared element type and dimensions (a number, or none where
/// a symbol or nothing is declared); None where it declares no tensor.
pub fn declared(vi: &ValueInfoProto) -> Option<(i32, Vec<Option<i64>>)> {
    let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else { return None };
    let dims = t.shape.as_ref().map_or(vec![], |s| {
        s.dim.iter().map(|d| if let Some(DimValue::DimValue(n)) = d.value { Some(n) } else { None }).collect()
    });
    Some((t.elem_type(), dims))
}

/// Redeclares a value's shape: numbers stay numbers, anything else is a symbol.
pub fn set_dims(vi: &mut ValueInfoProto, dims: &[&str]) {
    let elem = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(TypeValue::TensorType(t)) => t.elem_type(),
        _ => 1,
    };
    let dims: Vec<D> = dims.iter().map(|d| d.parse().map_or_else(|_| sym(d), D::N)).collect();
    *vi = value_info(vi.name(), elem, Some(&dims));
}

/// A tensor of `elem` type with `values` (written as that type's raw bytes).
pub fn tensor(elem: i32, dims: &[i64], values: &[f64]) -> TensorProto {
    use onnx_fuse::onnx::{BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT64};
    let mut raw = Vec::new();
    for &v in values {
        match elem {
            FLOAT => raw.extend((v as f32).to_le_bytes()),
            FLOAT16 => raw.extend(half::f16::from_f64(v).to_le_bytes()),
            BFLOAT16 => raw.extend(half::bf16::from_f64(v).to_le_bytes()),
            DOUBLE => raw.extend(v.to_le_bytes()),
            INT64 => raw.extend((v as i64).to_le_bytes()),
            BOOL => raw.push(u8::from(v != 0.0)),
            2 /* uint8 */ => raw.push(v as u8),
            6 /* int32 */ => raw.extend((v as i32).to_le_bytes()),
            other => panic!("tensor: element type {other} not supported"),
        }
    }
    TensorProto { dims: dims.to_vec(), data_type: Some(elem), raw_data: Some(raw.into()), ..Default::default() }
}

pub fn attr_int(name: &str, v: i64) -> AttributeProto {
    AttributeProto::int(name, v)
}

pub fn attr_float(name: &str, v: f64) -> AttributeProto {
    AttributeProto::float(name, v as f32)
}

pub fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto::string(name, v)
}

pub fn attr_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

pub fn attr_tensor(name: &str, t: TensorProto) -> AttributeProto {
    AttributeProto::tensor(name, t)
}

pub fn attr_graph(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..Default::default()
    }
}

/// Builds one graph; `model` wraps it.
#[derive(Default, Clone)]
pub struct Builder {
    pub graph: GraphProto,
    count: usize,
}

impl Builder {
    pub fn input(&mut self, name: &str, elem: i32, dims: Option<&[D]>) -> String {
        self.graph.input.push(value_info(name, elem, dims));
        name.to_string()
    }

    pub fn output(&mut self, name: &str, elem: i32, dims: Option<&[D]>) {
        self.graph.output.push(value_info(name, elem, dims));
    }

    /// An initializer named `name`.
    pub fn init(&mut self, name: &str, t: TensorProto) -> String {
        self.graph.initializer.push(TensorProto { name: Some(name.into()), ..t });
        name.to_string()
    }

    /// A `Constant` node holding `t`.
    pub fn constant(&mut self, t: TensorProto) -> String {
        self.node("Constant", &[], vec![attr_tensor("value", t)])
    }

    /// A `Constant` node holding the 1-D int64 tensor `values`.
    pub fn ints(&mut self, values: &[i64]) -> String {
        let f: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        self.constant(tensor(onnx_fuse::onnx::INT64, &[values.len() as i64], &f))
    }

    /// A default-domain node with one fresh output, returned.
    pub fn node(&mut self, op: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> String {
        self.count += 1;
        let out = format!("{}_{}", op.to_lowercase(), self.count);
        self.node_to(op, inputs, &[&out], attributes);
        out
    }

    pub fn node_to(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<AttributeProto>) {
        self.graph.node.push(NodeProto {
            op_type: Some(op.into()),
            name: Some(format!("n{}_{op}", self.graph.node.len())),
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            attribute: attributes,
            ..Default::default()
        });
    }

    pub fn model(&self, opset: i64) -> ModelProto {
        ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
            producer_name: Some("onnx-fuse tests".into()),
            graph: Some(GraphProto { name: Some("g".into()), ..self.graph.clone() }),
            ..Default::default()
        }
    }
}

/// The plain RMSNorm an export writes, `x / sqrt(mean(x², -1) + eps) * weight`,
/// in `elem` (opset < 18: axes as an attribute); returns its output.
pub fn rms_norm(b: &mut Builder, x: &str, elem: i32, weight: &[f64]) -> String {
    let two = b.init(&format!("{x}_two"), tensor(elem, &[], &[2.0]));
    let sq = b.node("Pow", &[x, &two], vec![]);
    let m = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
    let eps = b.init(&format!("{x}_eps"), tensor(elem, &[], &[1e-6]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[x, &r], vec![]);
    let w = b.init(&format!("{x}_weight"), tensor(elem, &[weight.len() as i64], weight));
    b.node("Mul", &[&n, &w], vec![])
}

/// How `gathered_pairs` repeats: every value twice (torch's
/// `repeat_interleave(rows, 2, -1)`), or the near-misses: uneven repeats
/// (as many values, not pairs), or pairs of a value and its negation.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Gathered {
    Pairs,
    Uneven,
    Negated,
}

/// torch's general `repeat_interleave(rows, 2, -1)` of rows `[b, s, n]` as
/// its TorchScript export writes it (Cohere's and GLM's rotary tables):
/// the last axis moved first, unsqueezed, expanded to the most repeats,
/// gathered at the indices (NonZero) of the mask `arange(max(repeats)) <
/// repeats` and moved back last, `[b, s, 2n]`. The repeats are a
/// ConstantOfShape of 2 over the rows' last axis; `Uneven`: `[1, 3, 2, 2]`
/// cut to n (as many values); `Negated`: the expanded rows a Concat of the
/// rows and their negation.
pub fn gathered_pairs(b: &mut Builder, rows: &str, n: usize, how: Gathered) -> String {
    use onnx_fuse::onnx::INT64;
    let repeats = match how {
        Gathered::Uneven => b.ints(&[1, 3, 2, 2][..n]),
        _ => {
            let shape = b.node("Shape", &[rows], vec![attr_int("start", 2)]);
            let two = tensor(INT64, &[1], &[2.0]);
            b.node("ConstantOfShape", &[&shape], vec![attr_tensor("value", two)])
        }
    };
    let first = b.node("Transpose", &[rows], vec![attr_ints("perm", &[2, 1, 0])]);
    let one = b.ints(&[1]);
    let u = b.node("Unsqueeze", &[&first, &one], vec![]);
    let data = if how == Gathered::Negated {
        let negated = b.node("Neg", &[&first], vec![]);
        let one_again = b.ints(&[1]);
        let v = b.node("Unsqueeze", &[&negated, &one_again], vec![]);
        b.node("Concat", &[&u, &v], vec![attr_int("axis", 1)])
    } else {
        let to = b.ints(&[1, if how == Gathered::Uneven { 3 } else { 2 }, 1, 1]);
        b.node("Expand", &[&u, &to], vec![])
    };
    let most = b.node("ReduceMax", &[&repeats], vec![attr_int("keepdims", 0)]);
    let (zero, step) = (b.constant(tensor(INT64, &[], &[0.0])), b.constant(tensor(INT64, &[], &[1.0])));
    let range = b.node("Range", &[&zero, &most, &step], vec![]);
    let last = b.ints(&[1]);
    let column = b.node("Unsqueeze", &[&repeats, &last], vec![]);
    let mask = b.node("Less", &[&range, &column], vec![]);
    let indices = b.node("NonZero", &[&mask], vec![]);
    let listed = b.node("Transpose", &[&indices], vec![attr_ints("perm", &[1, 0])]);
    let gathered = b.node("GatherND", &[&data, &listed], vec![]);
    b.node("Transpose", &[&gathered], vec![attr_ints("perm", &[2, 1, 0])])
}
