//! The read-only view of one graph that passes match against.
//!
//! It answers the questions a pattern asks: who produces a value, who
//! consumes it (a subgraph body that names an outer value counts as a
//! consumer, through the node that holds the body), is it a graph output, is
//! it a constant and what is its value, what element type and shape are
//! declared or follow from the ops that produce it. It never changes the
//! graph; `rewrite.rs` does that.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::onnx::{
    proto::tensor_shape_proto::dimension::Value as Dim, proto::type_proto::Value as TypeValue, proto::TensorShapeProto,
    GraphProto, NodeProto, TensorProto, ValueInfoProto, BOOL, FLOAT, INT64,
};

/// Why a pattern did not match at a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// The node is not the kind of node the pattern is anchored on.
    NotAnchor,
    /// The node could be an anchor, but a precondition failed.
    Because(String),
    /// No operand of a commutative node fits the role a pattern needs
    /// (`pattern::either_order`); a reason like `Because`.
    NoOperand(String),
}

pub type Check<T> = Result<T, Miss>;

/// Fails the match with a reason a user can read unless `cond` holds.
#[macro_export]
macro_rules! require {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err($crate::graph::Miss::Because(format!($($why)+)));
        }
    };
}

/// What [`Graph::ints_argument`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntsArgument {
    /// Neither attribute nor input: the op's default applies.
    Absent,
    Known(Vec<i64>),
    /// An input computed at run time.
    Unknown,
}

/// Constants of the enclosing graphs, visible inside a subgraph body.
#[derive(Default, Clone)]
pub struct Scope(HashMap<String, TensorProto>);

pub struct Graph<'a> {
    pub proto: &'a GraphProto,
    /// The default-domain opset of the model.
    pub opset: i64,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    outputs: HashSet<&'a str>,
    /// Names the graph itself defines (inputs, node outputs): they shadow
    /// constants of the enclosing graphs.
    defined: HashSet<&'a str>,
    consts: HashMap<&'a str, Cow<'a, TensorProto>>,
    outer: &'a Scope,
    types: HashMap<&'a str, i32>,
    shapes: HashMap<&'a str, &'a TensorShapeProto>,
    symbolic: crate::shapes::Memo,
}

const NO_CONSUMERS: &[usize] = &[];

impl<'a> Graph<'a> {
    pub fn new(proto: &'a GraphProto, opset: i64, outer: &'a Scope) -> Self {
        let mut g = Graph {
            proto,
            opset,
            producer: HashMap::new(),
            consumers: HashMap::new(),
            outputs: proto.output.iter().map(|o| o.name()).collect(),
            defined: proto.input.iter().map(|i| i.name()).collect(),
            consts: HashMap::new(),
            outer,
            types: HashMap::new(),
            shapes: HashMap::new(),
            symbolic: Default::default(),
        };
        // An initializer that is also a graph input is only a default: the
        // caller may feed another value, so it is not a constant.
        for t in &proto.initializer {
            if !g.defined.contains(t.name()) {
                g.consts.insert(t.name(), Cow::Borrowed(t));
            }
        }
        for (i, node) in proto.node.iter().enumerate() {
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                g.producer.insert(out, i);
                g.defined.insert(out);
            }
            for input in node.input.iter().filter(|v| !v.is_empty()) {
                g.consumers.entry(input).or_default().push(i);
            }
            for free in node.subgraphs().flat_map(free_values) {
                if let Some(name) = g.lookup_name(&free) {
                    g.consumers.entry(name).or_default().push(i);
                }
            }
            if node.is("Constant") {
                if let (Some(out), Some(t)) = (node.output.first(), constant_value(node)) {
                    g.consts.insert(out, t);
                }
            }
            // torch.onnx shares equal initializers through Identity nodes.
            if node.is("Identity") && node.output.len() == 1 {
                if let Some(t) = node.input.first().and_then(|i| g.constant(i)).cloned() {
                    g.consts.insert(&node.output[0], Cow::Owned(t));
                }
            }
        }
        for list in g.consumers.values_mut() {
            list.dedup();
        }
        g.infer_types();
        g
    }

    /// The name as this graph stores it, so the maps can borrow it. Values
    /// of graphs further out are not this graph's to track.
    fn lookup_name(&self, name: &str) -> Option<&'a str> {
        self.defined.get(name).copied().or_else(|| self.consts.get_key_value(name).map(|(k, _)| *k))
    }

    pub fn node(&self, index: usize) -> &'a NodeProto {
        &self.proto.node[index]
    }

    pub fn len(&self) -> usize {
        self.proto.node.len()
    }

    pub fn is_empty(&self) -> bool {
        self.proto.node.is_empty()
    }

    pub fn producer(&self, value: &str) -> Option<usize> {
        self.producer.get(value).copied()
    }

    /// The node producing `value`, if it is a default-domain `op_type`.
    pub fn produced_by(&self, value: &str, op_type: &str) -> Check<usize> {
        match self.producer(value) {
            Some(i) if self.node(i).is(op_type) => Ok(i),
            _ => Err(Miss::Because(format!("{value} is not produced by {op_type}"))),
        }
    }

    /// The nodes reading `value`, including nodes whose subgraph bodies read it.
    pub fn consumers(&self, value: &str) -> &[usize] {
        self.consumers.get(value).map_or(NO_CONSUMERS, Vec::as_slice)
    }

    pub fn is_graph_output(&self, value: &str) -> bool {
        self.outputs.contains(value)
    }

    /// The constant tensor named `value`: an initializer (that is not also an
    /// input), a `Constant` node, or a constant of an enclosing graph that no
    /// name of this graph shadows.
    pub fn constant(&self, value: &str) -> Option<&TensorProto> {
        if let Some(t) = self.consts.get(value) {
            return Some(t);
        }
        if self.defined.contains(value) {
            return None;
        }
        self.outer.0.get(value)
    }

    /// The value of a constant with exactly one element.
    pub fn scalar(&self, value: &str) -> Option<f64> {
        self.constant(value).and_then(TensorProto::scalar)
    }

    /// An int list that older opsets give as an attribute and newer ones as
    /// an input (Unsqueeze/Squeeze/Reduce `axes`, Split `split`).
    pub fn ints_argument(&self, node: &NodeProto, name: &str, input: usize) -> IntsArgument {
        if let Some(ints) = node.attr_ints(name) {
            return IntsArgument::Known(ints.to_vec());
        }
        match node.input.get(input).filter(|s| !s.is_empty()) {
            None => IntsArgument::Absent,
            Some(value) => {
                self.constant(value).and_then(|t| t.ints()).map_or(IntsArgument::Unknown, IntsArgument::Known)
            }
        }
    }

    pub fn elem_type(&self, value: &str) -> Option<i32> {
        self.types.get(value).copied().or_else(|| self.constant(value).map(|t| t.data_type()))
    }

    /// The rank of `value`, from its declared shape or its constant dims.
    pub fn rank(&self, value: &str) -> Option<usize> {
        match self.shapes.get(value) {
            Some(s) => Some(s.dim.len()),
            None => self.constant(value).map(|t| t.dims.len()),
        }
    }

    /// Where `shapes::Shapes` keeps what it derived for this graph.
    pub fn shape_memo(&self) -> &crate::shapes::Memo {
        &self.symbolic
    }

    /// The shape declared for `value` (graph inputs, outputs, value_info).
    pub fn declared_shape(&self, value: &str) -> Option<&'a TensorShapeProto> {
        self.shapes.get(value).copied()
    }

    /// The size of the last axis of `value`, when declared as a number.
    pub fn last_dim(&self, value: &str) -> Option<i64> {
        match self.shapes.get(value) {
            Some(s) => match s.dim.last()?.value {
                Some(Dim::DimValue(d)) => Some(d),
                _ => None,
            },
            None => self.constant(value).and_then(|t| t.dims.last().copied()),
        }
    }

    /// The constants this graph makes visible to its subgraph bodies.
    pub fn scope_for_subgraphs(&self) -> Scope {
        let mut scope = self.outer.clone();
        scope.0.retain(|name, _| !self.defined.contains(name.as_str()));
        for (name, t) in &self.consts {
            scope.0.insert(name.to_string(), t.as_ref().clone());
        }
        scope
    }

    /// Element types: declared ones first, then what simple ops imply
    /// (exports often declare no intermediate types). A value whose type
    /// cannot be proved stays unknown.
    fn infer_types(&mut self) {
        let p = self.proto;
        for vi in p.input.iter().chain(&p.output).chain(&p.value_info) {
            if let Some((elem, shape)) = tensor_type(vi) {
                if elem != 0 {
                    self.types.insert(vi.name(), elem);
                }
                if let Some(shape) = shape {
                    self.shapes.insert(vi.name(), shape);
                }
            }
        }
        for node in &p.node {
            let Some(out) = node.output.first().filter(|o| !o.is_empty()) else {
                continue;
            };
            if self.types.contains_key(out.as_str()) {
                continue;
            }
            let from_input = |i: usize| node.input.get(i).and_then(|v| self.elem_type(v));
            let inferred = if !crate::onnx::is_default_domain(node.domain()) {
                None
            } else {
                match node.op_type() {
                    "Cast" => node.attr_int("to").map(|t| t as i32),
                    "Constant" => self.consts.get(out.as_str()).map(|t| t.data_type()),
                    "CastLike" => from_input(1),
                    "Where" => from_input(1).or_else(|| from_input(2)),
                    "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" => Some(INT64),
                    "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And" | "Or" | "Xor"
                    | "IsNaN" | "IsInf" => Some(BOOL),
                    "ConstantOfShape" => {
                        Some(node.attr("value").and_then(|a| a.t.as_ref()).map_or(FLOAT, |t| t.data_type()))
                    }
                    op if SAME_TYPE_AS_FIRST_INPUT.contains(&op) => from_input(0),
                    _ => None,
                }
            };
            if let Some(t) = inferred {
                self.types.insert(out, t);
            }
        }
    }
}

/// Ops whose first output has the element type of their first input.
const SAME_TYPE_AS_FIRST_INPUT: &[&str] = &[
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

fn tensor_type(vi: &ValueInfoProto) -> Option<(i32, Option<&TensorShapeProto>)> {
    match vi.r#type.as_ref()?.value.as_ref()? {
        TypeValue::TensorType(t) => Some((t.elem_type(), t.shape.as_ref())),
        _ => None,
    }
}

/// The tensor a `Constant` node produces, for every numeric `value*` form.
fn constant_value(node: &NodeProto) -> Option<Cow<'_, TensorProto>> {
    let a = node.attribute.first()?;
    let made = |data_type: i32, dims: Vec<i64>| TensorProto { data_type: Some(data_type), dims, ..Default::default() };
    Some(match a.name() {
        "value" => Cow::Borrowed(a.t.as_ref()?),
        "value_float" => Cow::Owned(TensorProto { float_data: vec![a.f()], ..made(FLOAT, vec![]) }),
        "value_floats" => {
            Cow::Owned(TensorProto { float_data: a.floats.clone(), ..made(FLOAT, vec![a.floats.len() as i64]) })
        }
        "value_int" => Cow::Owned(TensorProto { int64_data: vec![a.i()], ..made(INT64, vec![]) }),
        "value_ints" => {
            Cow::Owned(TensorProto { int64_data: a.ints.clone(), ..made(INT64, vec![a.ints.len() as i64]) })
        }
        _ => return None,
    })
}

/// Names a graph body reads but does not define (at any depth): the values
/// of enclosing graphs it captures.
pub fn free_values(body: &GraphProto) -> HashSet<String> {
    let mut used = HashSet::new();
    let mut defined = HashSet::new();
    fn walk(g: &GraphProto, used: &mut HashSet<String>, defined: &mut HashSet<String>) {
        defined.extend(g.input.iter().map(|i| i.name().to_string()));
        defined.extend(g.initializer.iter().map(|t| t.name().to_string()));
        defined.extend(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()).map(|t| t.name().to_string()));
        for node in &g.node {
            used.extend(node.input.iter().filter(|i| !i.is_empty()).cloned());
            defined.extend(node.output.iter().cloned());
            for sub in node.subgraphs() {
                walk(sub, used, defined);
            }
        }
        used.extend(g.output.iter().map(|o| o.name().to_string()));
    }
    walk(body, &mut used, &mut defined);
    used.retain(|u| !defined.contains(u));
    used
}
