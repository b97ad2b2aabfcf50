//! The read-only view of one graph that passes match against.
//!
//! It answers the questions a pattern asks: who produces a value, who
//! consumes it (a subgraph body that names an outer value counts as a
//! consumer, through the node that holds the body), is it a graph output, is
//! it a constant and what is its value, what element type and shape are
//! declared or follow from the ops that produce it. It never changes the
//! graph; `rewrite.rs` does that.

mod dim;
pub mod fold;
pub mod shapes;

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use crate::onnx::{
    proto::type_proto::Value as TypeValue, proto::TensorShapeProto, GraphProto, NodeProto, TensorProto, ValueInfoProto,
    BOOL, FLOAT, INT64,
};

/// Why a pattern did not match at a node: the node is no candidate at all
/// (not reported), or a candidate whose precondition failed (reported by
/// `--explain` with the reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// Not the shape of node the pattern starts from.
    NotCandidate,
    /// A candidate, declined: the precondition that failed, for a user.
    Declined(String),
}

pub type Check<T> = Result<T, Miss>;

/// Declines the match with a reason a user can read unless `cond` holds.
#[macro_export]
macro_rules! require {
    ($cond:expr, $($why:tt)+) => {
        if !$cond {
            return Err($crate::graph::Miss::Declined(format!($($why)+)));
        }
    };
}

/// The opset a reason written by `Graph::require_opset` asks for.
pub fn needs_opset(reason: &str) -> Option<i64> {
    reason.strip_prefix("needs opset ")?.split(' ').next()?.parse().ok()
}

/// A number a reason quotes, or `unknown`.
pub fn known<T: std::fmt::Display>(value: Option<T>) -> String {
    value.map_or_else(|| "unknown".to_string(), |v| v.to_string())
}

/// The node is no candidate at all (nothing to report) unless `cond` holds.
#[macro_export]
macro_rules! candidate {
    ($cond:expr) => {
        if !$cond {
            return Err($crate::graph::Miss::NotCandidate);
        }
    };
}

/// Declines the match with a reason a user can read.
#[macro_export]
macro_rules! decline {
    ($($why:tt)+) => {
        return Err($crate::graph::Miss::Declined(format!($($why)+)))
    };
}

/// The anchor is no candidate at all (not reported).
#[macro_export]
macro_rules! no_candidate {
    () => {
        return Err($crate::graph::Miss::NotCandidate)
    };
}

/// How a pattern says where it stopped, beside `require!`, `decline!` and
/// `candidate!`: a missing value declines with a reason, a miss of a
/// sub-pattern becomes no candidate, or the next reading is tried.
pub trait Stop<T> {
    /// Declined with `why` where there is no value.
    fn or_decline(self, why: impl FnOnce() -> String) -> Check<T>;
}

impl<T> Stop<T> for Option<T> {
    fn or_decline(self, why: impl FnOnce() -> String) -> Check<T> {
        self.ok_or_else(|| Miss::Declined(why()))
    }
}

pub trait Relabel<T> {
    /// Any miss of a sub-pattern makes the anchor no candidate at all.
    fn or_no_candidate(self) -> Check<T>;
    /// Where the anchor is no candidate, `other` is tried (a declined
    /// candidate keeps its reason).
    fn or_if_no_candidate(self, other: impl FnOnce() -> Check<T>) -> Check<T>;
    /// Where this form fails, `other` (another form at the same anchor) is
    /// tried; its verdict stands unless it is no candidate either.
    fn or_other_form(self, other: impl FnOnce() -> Check<T>) -> Check<T>;
}

impl<T> Relabel<T> for Check<T> {
    fn or_no_candidate(self) -> Check<T> {
        self.map_err(|_| Miss::NotCandidate)
    }

    fn or_if_no_candidate(self, other: impl FnOnce() -> Check<T>) -> Check<T> {
        match self {
            Err(Miss::NotCandidate) => other(),
            checked => checked,
        }
    }

    fn or_other_form(self, other: impl FnOnce() -> Check<T>) -> Check<T> {
        match self {
            Err(miss) => match other() {
                Err(Miss::NotCandidate) => Err(miss),
                other => other,
            },
            checked => checked,
        }
    }
}

/// What a rewritten model may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// ONNX Runtime's registrations and `transmuter.AttentionCore` with its
    /// model-local function (the seed's design).
    #[default]
    Ort,
    /// Only operators the model's own opset defines.
    Portable,
}

/// An ONNX op a pass writes for the portable target, from opset `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Portable {
    pub op: &'static str,
    pub since: i64,
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

/// What the enclosing graphs make visible inside a subgraph body: their
/// constants, and every name they define that the body could read (a body
/// that defines one of them again truly shadows it: invalid ONNX, and
/// runtimes disagree on which value wins).
#[derive(Default, Clone)]
pub struct Scope {
    constants: HashMap<String, TensorProto>,
    names: HashSet<String>,
    /// Names of `names` the body at hand cannot see (spec, ground rule 8):
    /// the outputs of the node that holds it and of every node that reads
    /// them. A body may define them again (Optimum's merged decoders name
    /// the branch values after the `If`'s outputs).
    hidden: HashSet<String>,
    /// Shapes and element types of the enclosing graphs' values, declared
    /// or derived.
    shapes: HashMap<String, Vec<shapes::Dim>>,
    types: HashMap<String, i32>,
    /// How many views of If branches deep shape derivation is
    /// (`shapes::Shapes::if_output`): it stops at a bound.
    shape_depth: usize,
    /// Small tensors' values kept in external data (`Graph::values_of`).
    external: ExternalValues,
}

/// How the proofs read the values of a small tensor the model keeps in
/// external data: a reader made where the model was loaded
/// (`io::external_reader`), which reads each once, when a proof first
/// asks (`Graph::values_of`). No pass copies or writes such a payload.
#[derive(Default, Clone)]
pub struct ExternalValues(Option<std::sync::Arc<dyn Fn(&TensorProto) -> Option<Vec<f64>> + Send + Sync>>);

impl ExternalValues {
    pub fn new(read: impl Fn(&TensorProto) -> Option<Vec<f64>> + Send + Sync + 'static) -> Self {
        ExternalValues(Some(std::sync::Arc::new(read)))
    }

    fn get(&self, t: &TensorProto) -> Option<Vec<f64>> {
        self.0.as_ref().filter(|_| t.is_external()).and_then(|read| read(t))
    }
}

pub struct Graph<'a> {
    pub proto: &'a GraphProto,
    /// The default-domain opset of the model.
    pub opset: i64,
    /// What the output may contain (`--target`).
    pub target: Target,
    /// The model uses the default domain without importing it: `opset` is
    /// the one ONNX Runtime resolves, not one the exporter chose.
    pub opset_implied: bool,
    /// The nodes in dependency order (`node_order`): whatever the list's
    /// order, every derivation and every pass visits producers first.
    order: Vec<usize>,
    /// Each node's place in `order`.
    position: Vec<usize>,
    producer: HashMap<&'a str, usize>,
    consumers: HashMap<&'a str, Vec<usize>>,
    outputs: HashSet<&'a str>,
    /// Names the graph itself defines (inputs, node outputs): they shadow
    /// constants of the enclosing graphs.
    defined: HashSet<&'a str>,
    /// Names defined twice: in this graph and an enclosing one, or by two
    /// nodes of this graph. No match may read or write them.
    ambiguous: HashSet<&'a str>,
    /// Nodes their op does not define so (`ops::malformed`: an input or
    /// output missing, or too many), and why: hidden from rules, which may
    /// then read the positions an op requires unchecked.
    malformed: HashMap<usize, String>,
    /// Nodes a graph output depends on (by index): every run executes them.
    live: Vec<bool>,
    consts: HashMap<&'a str, Cow<'a, TensorProto>>,
    outer: &'a Scope,
    types: HashMap<&'a str, i32>,
    shapes: HashMap<&'a str, &'a TensorShapeProto>,
    symbolic: shapes::Memo,
}

impl Scope {
    /// The scope of a model's main graph, whose small tensors in external
    /// data hold `external`.
    pub fn reading(external: ExternalValues) -> Scope {
        Scope { external, ..Scope::default() }
    }

    /// Sets the names the next body cannot see.
    pub fn hide(&mut self, hidden: HashSet<String>) {
        self.hidden = hidden;
    }

    fn is_visible(&self, name: &str) -> bool {
        self.names.contains(name) && !self.hidden.contains(name)
    }
}

const NO_CONSUMERS: &[usize] = &[];

impl<'a> Graph<'a> {
    pub fn new(proto: &'a GraphProto, opset: i64, outer: &'a Scope) -> Self {
        let mut g = Graph {
            proto,
            opset,
            target: Target::Ort,
            opset_implied: false,
            // A cycle is refused on load; a view of one keeps the list's order.
            order: node_order(&proto.node).unwrap_or_else(|_| (0..proto.node.len()).collect()),
            position: vec![0; proto.node.len()],
            producer: HashMap::new(),
            consumers: HashMap::new(),
            outputs: proto.output.iter().map(|o| o.name()).collect(),
            defined: proto.input.iter().map(|i| i.name()).collect(),
            ambiguous: HashSet::new(),
            malformed: HashMap::new(),
            live: vec![false; proto.node.len()],
            consts: HashMap::new(),
            outer,
            types: HashMap::new(),
            shapes: HashMap::new(),
            symbolic: Default::default(),
        };
        // An initializer that is also a graph input is only a default: the
        // caller may feed another value, so it is not a constant. A name
        // two initializers define is ambiguous (ONNX Runtime takes the
        // last; the spec, ground rule 10, declines what reads it).
        for t in &proto.initializer {
            if !g.defined.contains(t.name()) && g.consts.insert(t.name(), Cow::Borrowed(t)).is_some() {
                g.ambiguous.insert(t.name());
            }
        }
        let own_names = proto.input.iter().map(|i| i.name()).chain(proto.initializer.iter().map(|t| t.name()));
        g.ambiguous.extend(own_names.filter(|n| outer.is_visible(n)));
        for i in std::mem::take(&mut g.order) {
            g.position[i] = g.order.len();
            g.order.push(i);
            let node = &proto.node[i];
            if let Some(why) = crate::ops::malformed(node, opset) {
                g.malformed.insert(i, why);
            }
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                let twice = g.producer.insert(out, i).is_some() || g.defined.contains(out.as_str());
                if twice || g.consts.contains_key(out.as_str()) || outer.is_visible(out) {
                    g.ambiguous.insert(out);
                }
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
            // torch.onnx shares equal initializers through Identity nodes, and
            // its unoptimized exports reshape small constants (axes, exponents).
            if let Some(t) = g.reshaped_constant(node) {
                g.consts.insert(&node.output[0], Cow::Owned(t));
            }
        }
        for list in g.consumers.values_mut() {
            list.sort_unstable();
            list.dedup();
        }
        g.mark_names_bodies_define_again();
        // Readers come after their producers in `order`.
        for k in (0..g.order.len()).rev() {
            let i = g.order[k];
            let outputs = proto.node[i].output.iter().filter(|o| !o.is_empty());
            g.live[i] = outputs
                .into_iter()
                .any(|o| g.outputs.contains(o.as_str()) || g.consumers(o).iter().any(|&c| g.live[c]));
        }
        g.infer_types();
        g.fold_cast_likes();
        g
    }

    /// `CastLike(c, like)` of a constant c is c cast to like's type
    /// (onnxscript's torchlib writes every literal so: an eps
    /// `CastLike(1e-5, mean)`): c itself where the types agree, else c cast
    /// as `Cast` is (`reshaped_constant`). Known only once the types are;
    /// in the same walk in dependency order, what `reshaped_constant`
    /// computes from such a constant (dynamo's `Reshape(CastLike(c, c),
    /// shape)`) is one too.
    fn fold_cast_likes(&mut self) {
        let proto = self.proto;
        for &i in &self.order {
            let node = &proto.node[i];
            let Some(out) = node.output.first() else { continue };
            if !node.is("CastLike") {
                if !self.consts.contains_key(out.as_str()) {
                    if let Some(t) = self.reshaped_constant(node) {
                        self.types.entry(out).or_insert(t.data_type());
                        self.consts.insert(out, Cow::Owned(t));
                    }
                }
                continue;
            }
            let [c, like] = node.input.as_slice() else { continue };
            if self.malformed.contains_key(&i) || self.ambiguous.contains(out.as_str()) {
                continue;
            }
            let own = self.consts.get(c.as_str()).filter(|_| !self.ambiguous.contains(c.as_str())).cloned();
            let outer = || (!self.defined.contains(c.as_str())).then(|| self.outer.constants.get(c)).flatten();
            let Some(t) = own.or_else(|| outer().map(Cow::Borrowed)) else { continue };
            let Some(to) = self.elem_type(like) else { continue };
            let small = !t.is_external() && t.numel().is_some_and(|n| n <= fold::SMALL as u64);
            let cast = if to == t.data_type() {
                Some(t)
            } else {
                small.then(|| fold::cast_tensor(&t, to)).flatten().map(Cow::Owned)
            };
            if let Some(t) = cast {
                self.types.insert(out, t.data_type());
                self.consts.insert(out, t);
            }
        }
    }

    /// Spec, ground rules 4 and 8: a body (at any depth) that defines again
    /// a name of this graph it could read (as an input, an initializer of
    /// its own or a node output) shadows it, and runtimes disagree on which
    /// value its readers get. The body's own view declines what touches
    /// the name; this one does too, since a match here that removes or
    /// rewrites the value may change what the body reads.
    fn mark_names_bodies_define_again(&mut self) {
        let proto = self.proto;
        for (holder, node) in proto.node.iter().enumerate() {
            if node.subgraphs().next().is_none() {
                continue;
            }
            let hidden = self.hidden_from_bodies_of(holder);
            let mut again = Vec::new();
            for body in node.subgraphs() {
                names_defined_in(body, &mut |name| {
                    if let Some(name) = self.lookup_name(name) {
                        if !hidden.contains(name) {
                            again.push(name);
                        }
                    }
                });
            }
            self.ambiguous.extend(again);
        }
    }

    /// Whether a graph output depends on node `index`, so that every run of
    /// the graph executes it.
    pub fn is_live(&self, index: usize) -> bool {
        self.live[index]
    }

    /// The value a constant was folded from where it is the same tensor
    /// under another name: the input of an `Identity`, or of a `Cast` or
    /// `CastLike` to its own type.
    pub fn same_constant_as(&self, value: &str) -> Option<&'a str> {
        let node = self.node(self.producer(value)?);
        let source = node.input.first()?;
        let t = self.constant(source)?;
        let same = match node.op_type() {
            "Identity" => true,
            "Cast" => node.attr_int("to") == Some(i64::from(t.data_type())),
            "CastLike" => self.elem_type(node.input.get(1)?) == Some(t.data_type()),
            _ => false,
        };
        (same && crate::onnx::is_default_domain(node.domain()) && self.constant(value).is_some()).then_some(source)
    }

    /// The value of `Identity` (or a `Cast` to its own type) of a constant,
    /// or of `Reshape`, `Squeeze`, `Unsqueeze` or `Expand` to ones of a
    /// small one (the same values under new dims), when every argument is a
    /// constant.
    fn reshaped_constant(&self, node: &NodeProto) -> Option<TensorProto> {
        const SMALL: u64 = fold::SMALL as u64;
        if node.output.len() != 1 || !crate::onnx::is_default_domain(node.domain()) {
            return None;
        }
        let t = self.constant(node.input.first()?)?;
        let same_type_cast = node.is("Cast") && node.attr_int("to") == Some(i64::from(t.data_type()));
        if node.op_type() == "Identity" || same_type_cast {
            // Shares the tensor (its bytes are not copied), whatever its size.
            return Some(t.clone());
        }
        if t.is_external() || t.numel()? > SMALL {
            return None;
        }
        if node.is("Cast") {
            return fold::cast_tensor(t, i32::try_from(node.attr_int("to")?).ok()?);
        }
        let n = t.numel()? as i64;
        let dims: Vec<i64> = match node.op_type() {
            "Reshape" => {
                let target = self.constant(node.input.get(1)?)?.ints()?;
                let allowzero = node.attr_int("allowzero").unwrap_or(0) == 1;
                let mut dims: Vec<i64> = target
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| if d == 0 && !allowzero { t.dims.get(i).copied().unwrap_or(-2) } else { d })
                    .collect();
                if dims.iter().any(|&d| d < -1) || dims.iter().filter(|&&d| d == -1).count() > 1 {
                    return None;
                }
                let known = dims.iter().filter(|&&d| d != -1).try_fold(1i64, |p, &d| p.checked_mul(d))?;
                if let Some(hole) = dims.iter().position(|&d| d == -1) {
                    if known == 0 || n % known != 0 {
                        return None;
                    }
                    dims[hole] = n / known;
                }
                dims
            }
            "Squeeze" | "Unsqueeze" => {
                let IntsArgument::Known(axes) = self.ints_argument(node, "axes", 1, 13) else { return None };
                let squeeze = node.op_type() == "Squeeze";
                let rank = if squeeze { t.dims.len() } else { t.dims.len() + axes.len() } as i64;
                let mut axes: Vec<i64> = axes.iter().map(|&a| if a < 0 { a + rank } else { a }).collect();
                axes.sort_unstable();
                // Repeated axes: ONNX Runtime refuses the node.
                if axes.iter().any(|&a| a < 0 || a >= rank) || axes.windows(2).any(|w| w[0] == w[1]) {
                    return None;
                }
                if squeeze {
                    let dims = t.dims.iter().enumerate().filter(|(i, _)| !axes.contains(&(*i as i64))).map(|(_, &d)| d);
                    dims.collect()
                } else {
                    let mut dims = t.dims.clone();
                    for a in axes {
                        dims.insert(a as usize, 1);
                    }
                    dims
                }
            }
            "Expand" => {
                // A target shape of ones only adds leading axes of 1
                // (dynamo's `full([], c)` is `Expand(c, [])`).
                let target = self.constant(node.input.get(1)?)?.ints()?;
                if target.iter().any(|&d| d != 1) {
                    return None;
                }
                let leading = target.len().saturating_sub(t.dims.len());
                std::iter::repeat_n(1, leading).chain(t.dims.iter().copied()).collect()
            }
            _ => return None,
        };
        let t = TensorProto { dims, name: None, ..t.clone() };
        (t.numel()? == n as u64).then_some(t)
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

    /// The input of a node that computes its first input unchanged: an
    /// `Identity`, or a `Dropout` in inference mode (from opset 12 without
    /// `training_mode` or with a constant false one; from 7 to 11 always;
    /// before 7 with `is_test` set).
    pub fn identity_input(&self, index: usize) -> Option<&'a str> {
        let node = self.node(index);
        let x = node.input.first().filter(|x| !x.is_empty())?.as_str();
        let inference = match node.op_type() {
            "Identity" => node.input.len() == 1,
            "Dropout" if self.opset >= 12 => match node.input.get(2).filter(|t| !t.is_empty()) {
                None => true,
                Some(training) => self.scalar(training) == Some(0.0),
            },
            "Dropout" => self.opset >= 7 || node.attr_int("is_test") == Some(1),
            _ => false,
        };
        (inference && crate::onnx::is_default_domain(node.domain()) && !self.malformed.contains_key(&index))
            .then_some(x)
    }

    /// The value `value` is computed from unchanged, through Identity and
    /// inference Dropout nodes (`identity_input`), which compute nothing.
    pub fn unchanged<'s>(&'s self, mut value: &'s str) -> &'s str {
        while let Some(input) = self.producer(value).and_then(|p| self.identity_input(p)) {
            value = input;
        }
        value
    }

    /// The node indices in dependency order: producers before readers.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// True when `value` is computed from the outputs of node `from`, their
    /// values and not only their shape (`Shape` and `Size` read no value).
    pub fn computed_from(&self, value: &str, from: usize) -> bool {
        let floor = self.position(from);
        let mut todo: Vec<usize> = self.producer(value).into_iter().collect();
        let mut seen = HashSet::new();
        while let Some(n) = todo.pop() {
            if n == from {
                return true;
            }
            let shape_only = self.node(n).is("Shape") || self.node(n).is("Size");
            if self.position(n) < floor || shape_only || !seen.insert(n) {
                continue;
            }
            todo.extend(values_read_by(self.node(n)).iter().filter_map(|v| self.producer(v)));
        }
        false
    }

    /// Where node `index` comes in `order`: a node's producers come before it.
    pub fn position(&self, index: usize) -> usize {
        self.position[index]
    }

    pub fn is_empty(&self) -> bool {
        self.proto.node.is_empty()
    }

    /// The node computing `value`; none for a malformed node (what it
    /// computes is not known).
    pub fn producer(&self, value: &str) -> Option<usize> {
        self.producer.get(value).copied().filter(|p| !self.malformed.contains_key(p))
    }

    /// Why node `index` is malformed (`ops::malformed`), if it is.
    pub fn malformed(&self, index: usize) -> Option<&str> {
        self.malformed.get(&index).map(String::as_str)
    }

    /// The reason to give when `value` is computed by a malformed node.
    pub fn computed_by_malformed(&self, value: &str) -> Option<String> {
        let why = self.producer.get(value).and_then(|p| self.malformed(*p))?;
        Some(format!("{value} is computed by a malformed node: {why}"))
    }

    /// The node computing `value`, or why a rule has none to read.
    pub fn computing(&self, value: &str) -> Check<usize> {
        self.producer(value).ok_or_else(|| {
            Miss::Declined(
                self.computed_by_malformed(value).unwrap_or_else(|| format!("{value} is not computed by the graph")),
            )
        })
    }

    /// The node producing `value`, if it is a default-domain `op_type`.
    pub fn produced_by(&self, value: &str, op_type: &str) -> Check<usize> {
        match self.producer(value) {
            Some(i) if self.node(i).is(op_type) => Ok(i),
            _ => Err(Miss::Declined(
                self.computed_by_malformed(value).unwrap_or_else(|| format!("{value} is not produced by {op_type}")),
            )),
        }
    }

    /// `produced_by` at a pattern's first step: where no `op_type` computes
    /// `value`, the anchor is no candidate at all, unless a malformed node
    /// hides what computes it (then that is the reason).
    pub fn first_step(&self, value: &str, op_type: &str) -> Check<usize> {
        self.produced_by(value, op_type).map_err(|miss| self.at_first_step(value, miss))
    }

    /// `computing` at a pattern's first step: a value from outside (a graph
    /// input, an enclosing graph's value) makes no candidate.
    pub fn first_computing(&self, value: &str) -> Check<usize> {
        self.computing(value).map_err(|miss| self.at_first_step(value, miss))
    }

    fn at_first_step(&self, value: &str, miss: Miss) -> Miss {
        if self.computed_by_malformed(value).is_some() {
            miss
        } else {
            Miss::NotCandidate
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
        // Defined twice: which definition a runtime takes is not proved.
        if self.ambiguous.contains(value) {
            return None;
        }
        if let Some(t) = self.consts.get(value) {
            return Some(t);
        }
        if self.defined.contains(value) {
            return None;
        }
        self.outer.constants.get(value)
    }

    /// True for a name this graph or an enclosing one uses for a value.
    pub fn is_name_taken(&self, name: &str) -> bool {
        self.defined.contains(name) || self.consts.contains_key(name) || self.outer.names.contains(name)
    }

    /// The values of the constant `t`, also where they are in external data
    /// and small (`ExternalValues`).
    pub fn values_of(&self, t: &TensorProto) -> Option<Vec<f64>> {
        t.values().or_else(|| self.outer.external.get(t))
    }

    /// The constant named `value` where it holds one value (a scale, a
    /// fill, a step's factor).
    pub fn one_value(&self, value: &str) -> Option<&TensorProto> {
        self.constant(value).filter(|t| t.numel() == Some(1))
    }

    /// True for a name defined twice (in this graph and an enclosing one,
    /// or twice in this graph): which value a reader gets is not defined.
    pub fn is_ambiguous(&self, value: &str) -> bool {
        self.ambiguous.contains(value)
    }

    /// An ambiguous name this graph defines once, as an initializer (a body
    /// defines it again, or it shadows an outer value): whichever definition
    /// a runtime takes, the tensor read has this initializer's shape and
    /// type where the outer value, if one is visible, has them too
    /// (`shadowed_shape`, `elem_type`).
    fn shadowed_initializer(&self, value: &str) -> Option<&'a TensorProto> {
        let mut own = self.proto.initializer.iter().filter(|t| t.name() == value);
        let (t, None) = (own.next()?, own.next()) else { return None };
        let input = self.proto.input.iter().any(|i| i.name() == value);
        (!input && self.producer(value).is_none()).then_some(t)
    }

    /// The shape of an ambiguous initializer that every definition a
    /// runtime may take shares.
    pub fn shadowed_shape(&self, value: &str) -> Option<Vec<shapes::Dim>> {
        let t = self.shadowed_initializer(value)?;
        let dims: Vec<shapes::Dim> = t.dims.iter().map(|&d| shapes::Dim::known(d)).collect();
        let agrees = !self.outer.is_visible(value) || self.outer.shapes.get(value) == Some(&dims);
        agrees.then_some(dims)
    }

    /// Declines a candidate whose op the target has only from opset
    /// `version` on (read back by `needs_opset`). A rule checks this last,
    /// so that the opset is all the candidate lacks.
    pub fn require_opset(&self, version: i64, op: &str) -> Check<()> {
        require!(self.opset >= version, "needs opset {version} for {op} (the model imports opset {})", self.opset);
        Ok(())
    }

    /// The model's opset defines the op a pass writes for the portable target.
    pub fn require_portable(&self, portable: Portable) -> Check<()> {
        self.require_opset(portable.since, portable.op)
    }

    /// The value of a constant with exactly one element.
    pub fn scalar(&self, value: &str) -> Option<f64> {
        self.constant(value).and_then(TensorProto::scalar)
    }

    /// An int list that older opsets give as an attribute and newer ones as
    /// an input (Unsqueeze/Squeeze/Reduce `axes`, Split `split`): the
    /// attribute before opset `from`, the input `input` from it on. A form
    /// the node's opset does not define counts as computed at run time.
    pub fn ints_argument(&self, node: &NodeProto, name: &str, input: usize, from: i64) -> IntsArgument {
        let input = node.input.get(input).filter(|s| !s.is_empty());
        let attribute = node.attr_ints(name);
        if self.opset < from {
            return match (attribute, input) {
                (_, Some(_)) => IntsArgument::Unknown,
                (Some(ints), None) => IntsArgument::Known(ints.to_vec()),
                (None, None) => IntsArgument::Absent,
            };
        }
        match (attribute, input) {
            (Some(_), _) => IntsArgument::Unknown,
            (None, None) => IntsArgument::Absent,
            (None, Some(value)) => {
                self.constant(value).and_then(|t| t.ints()).map_or(IntsArgument::Unknown, IntsArgument::Known)
            }
        }
    }

    /// Starts, ends, axes and steps of a Slice: attributes before opset 10,
    /// constant inputs from it on (absent axes: 0, 1, …; absent steps: 1).
    /// None where any is computed at run time.
    pub fn slice_arguments(&self, node: &NodeProto) -> Option<(Vec<i64>, Vec<i64>, Vec<i64>, Vec<i64>)> {
        if self.opset < 10 {
            let attr = |name: &str| node.attr_ints(name).map(<[i64]>::to_vec);
            let (starts, ends) = (attr("starts")?, attr("ends")?);
            let axes = attr("axes").unwrap_or_else(|| (0..starts.len() as i64).collect());
            let steps = vec![1; starts.len()];
            return (node.input.len() == 1).then_some((starts, ends, axes, steps));
        }
        let int = |i: usize| -> Option<Option<Vec<i64>>> {
            match node.input.get(i).filter(|s| !s.is_empty()) {
                None => Some(None),
                Some(value) => Some(Some(self.constant(value)?.ints()?)),
            }
        };
        let (starts, ends) = (int(1)??, int(2)??);
        let axes = int(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = int(4)?.unwrap_or_else(|| vec![1; starts.len()]);
        Some((starts, ends, axes, steps))
    }

    /// The `axes` of a Reduce op: an input from opset 13 for ReduceSum and
    /// from 18 for the others, an attribute before.
    pub fn reduce_axes(&self, node: &NodeProto) -> IntsArgument {
        self.ints_argument(node, "axes", 1, if node.op_type() == "ReduceSum" { 13 } else { 18 })
    }

    /// Whether `a` and `b` are provably one value: the same name, or outputs
    /// of identical deterministic nodes (same op, attributes and output
    /// position) whose inputs are in turn one value, or `Identity` (or an
    /// inference `Dropout`) of such a value. Exporters write e.g.
    /// `Sub(x, mean)` or `Cast(x)` once per use. Returns the nodes that
    /// compute `b` apart from `a` (none when the names are equal).
    pub fn same_value(&self, a: &str, b: &str) -> Option<Vec<usize>> {
        self.twins(a, b, 4)
    }

    fn twins(&self, a: &str, b: &str, depth: usize) -> Option<Vec<usize>> {
        if a == b {
            return Some(vec![]);
        }
        if depth == 0 || self.is_ambiguous(a) || self.is_ambiguous(b) {
            return None;
        }
        // Identity(v) (or an inference Dropout of v) is v.
        if let Some((p, v)) = self.producer(b).and_then(|p| Some((p, self.identity_input(p)?))) {
            let mut nodes = self.twins(a, v, depth - 1)?;
            nodes.push(p);
            return Some(nodes);
        }
        // Two small constants of one type, shape and payload (bit for bit:
        // 0 is not -0), each written for its use (TorchScript's axes).
        if let (Some(x), Some(y)) = (self.constant(a), self.constant(b)) {
            let small = x.numel().is_some_and(|n| n <= 4096);
            return (small && x.same_content(y)).then(Vec::new);
        }
        let (pa, pb) = (self.producer(a)?, self.producer(b)?);
        let (na, nb) = (self.node(pa), self.node(pb));
        let position = |n: &NodeProto, v: &str| n.output.iter().position(|o| o == v);
        let identical = na.op_type() == nb.op_type()
            && crate::onnx::is_default_domain(na.domain())
            && crate::onnx::is_default_domain(nb.domain())
            && crate::ops::DETERMINISTIC.contains(&na.op_type())
            && na.attribute == nb.attribute
            && na.input.len() == nb.input.len()
            && position(na, a) == position(nb, b);
        if !identical {
            return None;
        }
        let mut nodes = vec![pb];
        for (x, y) in na.input.iter().zip(&nb.input) {
            nodes.extend(self.twins(x, y, depth - 1)?);
        }
        Some(nodes)
    }

    pub fn elem_type(&self, value: &str) -> Option<i32> {
        if self.ambiguous.contains(value) {
            let t = self.shadowed_initializer(value)?.data_type();
            let agrees = !self.outer.is_visible(value) || self.outer.types.get(value) == Some(&t);
            return agrees.then_some(t);
        }
        let own = self.types.get(value).copied().or_else(|| self.constant(value).map(|t| t.data_type()));
        own.or_else(|| (!self.defined.contains(value)).then(|| self.outer.types.get(value).copied()).flatten())
    }

    /// `value` declared as this view knows it: its element type, and its
    /// shape where the rank is proved, each axis a number or left unnamed
    /// (a symbolic axis, even a declared symbol: named, ONNX Runtime proves
    /// two values' shapes equal and fuses each residual Add and its
    /// LayerNormalization into its CPU SkipLayerNormalization, which the
    /// skip-norm pass leaves to a request for being slower: BERT-base 1.07×
    /// at 512 tokens, docs/pipeline.md). None where the element type is
    /// not proved: nothing is declared that is not known.
    pub fn declaration(&self, value: &str) -> Option<ValueInfoProto> {
        use crate::onnx::proto::tensor_shape_proto::{dimension::Value as DimValue, Dimension};
        use crate::onnx::proto::type_proto::Tensor;
        let elem = self.elem_type(value)?;
        let axis = |d: &shapes::Dim| Dimension {
            value: d.value().filter(|&n| n >= 0).map(DimValue::DimValue),
            ..Default::default()
        };
        let shape = self.shapes().shape(value).map(|dims| TensorShapeProto { dim: dims.iter().map(axis).collect() });
        Some(ValueInfoProto {
            name: Some(value.to_string()),
            r#type: Some(crate::onnx::TypeProto {
                value: Some(TypeValue::TensorType(Tensor { elem_type: Some(elem), shape })),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// Where `shapes::Shapes` keeps what it derived for this graph.
    pub fn shape_memo(&self) -> &shapes::Memo {
        &self.symbolic
    }

    /// The shape declared for `value` (graph inputs, outputs, value_info).
    pub fn declared_shape(&self, value: &str) -> Option<&'a TensorShapeProto> {
        self.shapes.get(value).copied()
    }

    /// Symbolic shapes of this graph's values (derived once, memoized).
    pub fn shapes(&self) -> shapes::Shapes<'_, 'a> {
        shapes::Shapes::new(self)
    }

    /// The names a body of node `holder` cannot see: the outputs of
    /// `holder` and of every node that depends on them (reading one from
    /// the body would be a cycle).
    pub fn hidden_from_bodies_of(&self, holder: usize) -> HashSet<String> {
        let mut hidden = HashSet::new();
        let mut todo = vec![holder];
        let mut seen = HashSet::from([holder]);
        while let Some(n) = todo.pop() {
            for out in self.node(n).output.iter().filter(|o| !o.is_empty()) {
                hidden.insert(out.clone());
                todo.extend(self.consumers(out).iter().copied().filter(|&c| seen.insert(c)));
            }
        }
        hidden
    }

    /// What this graph makes visible to its subgraph bodies; `hidden` is
    /// then set per holder (`hidden_from_bodies_of`).
    pub fn scope_for_subgraphs(&self) -> Scope {
        let mut scope = self.outer.clone();
        let hidden = std::mem::take(&mut scope.hidden);
        scope.names.retain(|n| !hidden.contains(n));
        scope.constants.retain(|name, _| !self.defined.contains(name.as_str()));
        for (name, t) in &self.consts {
            scope.constants.insert(name.to_string(), t.as_ref().clone());
        }
        let initializers = self.proto.initializer.iter().map(|t| t.name());
        let own: Vec<&str> = self.defined.iter().copied().chain(initializers).collect();
        let shapes = self.shapes();
        for name in &own {
            match shapes.shape(name) {
                Some(shape) => scope.shapes.insert(name.to_string(), shape),
                None => scope.shapes.remove(*name),
            };
            match self.elem_type(name) {
                Some(t) => scope.types.insert(name.to_string(), t),
                None => scope.types.remove(*name),
            };
        }
        scope.names.extend(own.into_iter().map(str::to_string));
        scope
    }

    /// The shape an enclosing graph knows for `value`, when this graph does
    /// not define the name itself.
    pub fn outer_shape(&self, value: &str) -> Option<&[shapes::Dim]> {
        if self.defined.contains(value) || self.consts.contains_key(value) {
            return None;
        }
        self.outer.shapes.get(value).map(Vec::as_slice)
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
        for node in self.order.iter().map(|&i| &p.node[i]) {
            // The sum a skip-norm takes over has its input's type, as its output.
            if let (Some(sum), Some(t)) = (node.output.get(3), node.input.first().and_then(|v| self.elem_type(v))) {
                if !sum.is_empty() && crate::ops::ms_output_like_first_input(node, 3) {
                    self.types.entry(sum).or_insert(t);
                }
            }
            let Some(out) = node.output.first().filter(|o| !o.is_empty()) else {
                continue;
            };
            if self.types.contains_key(out.as_str()) {
                continue;
            }
            let from_input = |i: usize| node.input.get(i).and_then(|v| self.elem_type(v));
            let inferred = if crate::ops::ms_output_like_first_input(node, 0) {
                from_input(0)
            } else if node.domain() == crate::onnx::TRANSMUTER_DOMAIN && node.op_type() == "AttentionCore" {
                // softmax(…) · v: a MatMul, in v's type.
                from_input(2)
            } else if !crate::onnx::is_default_domain(node.domain()) {
                None
            } else {
                match node.op_type() {
                    "Cast" => node.attr_int("to").map(|t| t as i32),
                    // Y has the scale's type (V), which may differ from X's.
                    "SimplifiedLayerNormalization" | "RMSNormalization" => from_input(1),
                    // What both branches declare (the branches onnx-fuse writes declare their outputs).
                    "If" => node
                        .subgraphs()
                        .map(|b| b.output.first().and_then(tensor_type).map(|(t, _)| t))
                        .reduce(|a, b| if a == b { a } else { None })
                        .flatten()
                        .filter(|&t| t != 0),
                    "Constant" => self.consts.get(out.as_str()).map(|t| t.data_type()),
                    "CastLike" => from_input(1),
                    "Where" => from_input(1).or_else(|| from_input(2)),
                    "Shape" | "Size" | "NonZero" | "ArgMax" | "ArgMin" => Some(INT64),
                    "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "Not" | "And" | "Or" | "Xor"
                    | "IsNaN" | "IsInf" => Some(BOOL),
                    "ConstantOfShape" => {
                        Some(node.attr("value").and_then(|a| a.t.as_ref()).map_or(FLOAT, |t| t.data_type()))
                    }
                    op if crate::ops::SAME_TYPE_AS_FIRST_INPUT.contains(&op) => from_input(0),
                    _ => None,
                }
            };
            // Split's every output is a part of its input.
            let parts = if node.is("Split") { node.output.len() } else { 1 };
            for out in node.output.iter().take(parts).filter(|o| !o.is_empty()) {
                if let Some(t) = inferred {
                    self.types.entry(out).or_insert(t);
                }
            }
        }
    }
}

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

/// The values a node reads: its inputs and what its bodies capture.
pub fn values_read_by(node: &NodeProto) -> Vec<String> {
    let mut values: Vec<String> = node.input.iter().filter(|v| !v.is_empty()).cloned().collect();
    values.extend(node.subgraphs().flat_map(free_values));
    values
}

/// Calls `f` with every name a body defines, at any depth: its inputs,
/// initializers and node outputs.
fn names_defined_in<'a>(body: &'a GraphProto, f: &mut impl FnMut(&'a str)) {
    body.input.iter().for_each(|i| f(i.name()));
    body.initializer.iter().for_each(|t| f(t.name()));
    body.sparse_initializer.iter().filter_map(|s| s.values.as_ref()).for_each(|t| f(t.name()));
    for node in &body.node {
        node.output.iter().filter(|o| !o.is_empty()).for_each(|o| f(o));
        for sub in node.subgraphs() {
            names_defined_in(sub, f);
        }
    }
}

/// Names a graph body reads but does not define (at any depth): the values
/// of enclosing graphs it captures.
pub fn free_values(body: &GraphProto) -> Vec<String> {
    let mut defined = HashSet::new();
    names_defined_in(body, &mut |name| {
        defined.insert(name);
    });
    // In the order first read, so that what is derived from them is the
    // same on every run.
    let mut seen = HashSet::new();
    let mut free = Vec::new();
    names_read_in(body, &mut |name| {
        if !defined.contains(name) && seen.insert(name) {
            free.push(name.to_string());
        }
    });
    free
}

/// Calls `f` with every name a body reads, at any depth: node inputs and
/// graph outputs.
fn names_read_in<'a>(body: &'a GraphProto, f: &mut impl FnMut(&'a str)) {
    for node in &body.node {
        node.input.iter().filter(|i| !i.is_empty()).for_each(|i| f(i));
        for sub in node.subgraphs() {
            names_read_in(sub, f);
        }
    }
    body.output.iter().for_each(|o| f(o.name()));
}

/// The indices of `nodes` in an order in which each comes after every node
/// of the list whose output it reads, as an input or through what its
/// bodies capture (spec, ground rule 10: the list's own order means nothing).
/// Of the nodes ready at each step the earliest in the list goes first, so
/// a list already in order keeps it. On a cycle, the index of a node on it.
pub fn node_order(nodes: &[NodeProto]) -> Result<Vec<usize>, usize> {
    let mut producer: HashMap<&str, usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            producer.entry(out).or_insert(i);
        }
    }
    // What each node reads from the other nodes, once per producer.
    let mut reads: Vec<Vec<usize>> = Vec::with_capacity(nodes.len());
    for node in nodes {
        let captured: Vec<String> = node.subgraphs().flat_map(free_values).collect();
        let names = node.input.iter().map(String::as_str).chain(captured.iter().map(String::as_str));
        let mut from: Vec<usize> = names.filter_map(|v| producer.get(v).copied()).collect();
        from.sort_unstable();
        from.dedup();
        reads.push(from);
    }
    let mut waiting: Vec<usize> = reads.iter().map(Vec::len).collect();
    let mut readers: Vec<Vec<usize>> = vec![vec![]; nodes.len()];
    for (i, from) in reads.iter().enumerate() {
        for &p in from {
            readers[p].push(i);
        }
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<usize>> =
        (0..nodes.len()).filter(|&i| waiting[i] == 0).map(std::cmp::Reverse).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(std::cmp::Reverse(i)) = ready.pop() {
        order.push(i);
        for &r in &readers[i] {
            waiting[r] -= 1;
            if waiting[r] == 0 {
                ready.push(std::cmp::Reverse(r));
            }
        }
    }
    if order.len() == nodes.len() {
        return Ok(order);
    }
    // Every node left waits on another left: walking back from one of
    // them, through what it waits on, comes round to a node twice.
    let mut seen = HashSet::new();
    let mut at = (0..nodes.len()).find(|&i| waiting[i] > 0).expect("a node left");
    while seen.insert(at) {
        at = *reads[at].iter().find(|&&p| waiting[p] > 0).expect("a node left waits on another");
    }
    Err(at)
}
