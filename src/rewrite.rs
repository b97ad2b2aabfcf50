//! The one place that changes graphs.
//!
//! A pass is a rule: a pure function from a graph view and an anchor node to
//! a [`Rewrite`] (or the reason it does not apply): the replacement and what
//! it reads, never a list of nodes. The driver here derives the nodes it
//! replaces (everything its outputs are computed from, back to what it
//! reads), runs the rules of the pipeline over every graph and subgraph
//! body to a fixed point, keeps matches from overlapping, refuses any match
//! whose inner values escape, and applies the rest: removes the matched
//! nodes, puts the replacement at the anchor's position under the anchor's
//! output name (and the names it takes over), names it uniquely and stamps
//! its provenance (`transmuter.fused`).

use std::collections::{BTreeSet, HashMap, HashSet};

pub use crate::graph::Portable;
use crate::graph::{free_values, values_read_by, Check, ExternalValues, Graph, Miss, Scope, Stop, Target};
use crate::onnx::{
    display_name, AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, FLOAT, FUSED_KEY, INT64, MICROSOFT,
};
use crate::pattern::{cast_to, Weight};
use crate::{decline, require};

/// A fusion pass: a name, what it does, and its rule.
pub struct Pass {
    pub name: &'static str,
    pub summary: &'static str,
    /// In the pipeline `default`. A pass whose output some runtimes cannot
    /// run is only applied when asked for by name.
    pub default: bool,
    /// What a user must know when this pass fused something (reported).
    pub caution: Option<&'static str>,
    /// How a report says what this pass does to the nodes of earlier passes
    /// it takes into its own ("with their residual Add"), if it does.
    pub absorbs: Option<&'static str>,
    /// What it writes for `--target portable`: ONNX's op and the opset
    /// that defines it (`Graph::require_portable`); None where the pass
    /// writes ONNX Runtime's ops only.
    pub portable: Option<Portable>,
    /// For the `ort` target: the opset of a kernel the pass writes where
    /// the model has it (ONNX `Attention`: 23), which a run upgrades to
    /// (`run::kernel_upgrade`).
    pub kernel_opset: Option<i64>,
    pub rule: fn(&Graph, usize) -> Check<Rewrite>,
}

/// What a rule proved: the node that replaces the match, and what it reads.
/// The driver derives which nodes it replaces (`matched_nodes`).
#[derive(Debug, Clone)]
pub struct Rewrite {
    /// The node whose output the replacement takes over.
    pub anchor: usize,
    /// Every matched node, the anchor included: derived by the driver from
    /// the anchor, the replacement's inputs and `kept`.
    pub nodes: BTreeSet<usize>,
    /// The replacement: op, domain, inputs, attributes. The driver sets its
    /// name, its outputs and its metadata.
    pub replacement: NodeProto,
    /// Further outputs of the replacement: (slot, the value of the match it
    /// takes over). Output 0 always takes over the anchor's output.
    pub takes_over: Vec<(usize, String)>,
    /// Outputs the replacement can compute besides: (slot, value). The
    /// driver takes each over where anything outside the match reads it
    /// (or it is a graph output), and drops it otherwise.
    pub offers: Vec<(usize, String)>,
    /// The rewrite to try instead where this one fails the driver's checks
    /// (a value it folds in is read elsewhere): the same replacement
    /// reading less.
    pub fallback: Option<Box<Rewrite>>,
    /// Values the match stops at although the replacement does not read
    /// them: their producers stay for other readers.
    pub kept: Vec<Kept>,
    /// The replacement's place in the node list (set by the driver).
    pub place: usize,
    /// A model-local function the replacement calls (for ops no runtime
    /// has a kernel for): its body is the matched nodes, written by the
    /// driver (`write_function`). The driver adds it once per (domain,
    /// name, overload), with the model's opset imports, imports its domain
    /// and raises the IR version as far as functions need.
    pub function: Option<FunctionProto>,
    /// An operator set the replacement's op comes from, added to the
    /// model's imports when missing (e.g. `com.microsoft` version 1).
    pub import: Option<(&'static str, i64)>,
    /// Constants the replacement reads that the graph does not have yet
    /// (a weight given the shape the fused op takes), each named as the
    /// replacement reads it; the driver makes the names unique.
    pub constants: Vec<TensorProto>,
    /// Chains of readers that, reading the anchor's output one after the
    /// other, continue the pattern (a norm without a scale before a Mul
    /// whose scale the pass did not prove, or a Cast read by such a Mul):
    /// where one does, the rewrite is declined rather than taken in part.
    pub yields_to: Vec<Vec<Link>>,
    /// Nodes the replacement needs computed before it (a guard's
    /// condition), in order. The driver names them, gives their outputs
    /// names no value has, and places them before the replacement; it adds
    /// those that compute, from values that survive, the shape a `Shape`
    /// outside the match read of a value the match removes.
    pub prelude: Vec<NodeProto>,
    /// Each prelude node's place in the node list (set by the driver).
    pub prelude_at: Vec<usize>,
    /// For a replacement that is a guard (`If`): the op it runs where the
    /// guard holds, as reports name the node.
    pub runs: Option<&'static str>,
    /// The opset the replacement's op needs (ONNX `Attention`: 23).
    pub opset: Option<i64>,
    /// What a report says of the replacement besides (why a core is not
    /// the kernel the runtime runs).
    pub note: Option<String>,
    /// Where the replacement computes the anchor's values in another
    /// shape: see `viewed_as`.
    pub view: Option<View>,
}

/// The replacement writes `inner`, and a `Reshape` of it to `dims`
/// (a `Constant` named `shape`) writes the anchor's output (a 3-D
/// `RotaryEmbedding` of heads laid out `[b, s, h, d]`, viewed back as
/// those four axes).
#[derive(Debug, Clone)]
pub struct View {
    pub inner: String,
    pub shape: String,
    pub dims: Vec<i64>,
}

/// The name of a body a rule leaves for the driver to fill with the
/// matched nodes (`original_ops`).
const ORIGINAL: &str = "transmuter.original";

/// A body the driver fills with exactly the nodes the rewrite replaces,
/// in their order, computing the replacement's outputs: the original ops,
/// equal by construction to what was matched (an `If`'s branch for the
/// inputs a kernel computes otherwise).
pub fn original_ops() -> GraphProto {
    GraphProto { name: Some(ORIGINAL.into()), ..Default::default() }
}

/// `If(cond) { then } else { otherwise }`: a kernel's guard.
pub fn guard(cond: &str, then: GraphProto, otherwise: GraphProto) -> NodeProto {
    let branches = vec![AttributeProto::graph("then_branch", then), AttributeProto::graph("else_branch", otherwise)];
    node("If", &[cond], branches)
}

/// A branch of `nodes` whose result is `out`, of element type `elem`.
pub fn branch(name: &str, nodes: Vec<NodeProto>, out: &str, elem: i32) -> GraphProto {
    GraphProto { name: Some(name.into()), node: nodes, output: vec![value_info(out, elem)], ..Default::default() }
}

/// A value a match reads from a node it leaves in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// The value stays when anything outside the match reads it (a
    /// Transpose shared with another reader); otherwise its producer is
    /// matched as usual.
    Shared(String),
    /// The value stays when a node outside the match reads it besides a
    /// `Shape` or `Size` (whose shape is computed anew from values that
    /// survive: `shapes_read_outside`); otherwise its producer is matched.
    BesidesShapes(String),
    /// The value stays when the only readers outside the match read its
    /// shape (`Shape` nodes); any other outside reader makes it escape.
    ForItsShape(String),
}

impl Kept {
    fn value(&self) -> &str {
        match self {
            Kept::Shared(v) | Kept::BesidesShapes(v) | Kept::ForItsShape(v) => v,
        }
    }
}

impl Rewrite {
    pub fn importing(self, domain: &'static str, version: i64) -> Self {
        Rewrite { import: Some((domain, version)), ..self }
    }

    /// The replacement's output `slot` takes over `value`, a value the
    /// rewrite removes that is read elsewhere too.
    pub fn taking_over(mut self, slot: usize, value: &str) -> Self {
        self.takes_over.push((slot, value.to_string()));
        self
    }

    /// The replacement's output `slot` computes `value` too: the driver
    /// takes it over where something outside the match reads it.
    pub fn offering(mut self, slot: usize, value: &str) -> Self {
        self.offers.push((slot, value.to_string()));
        self
    }

    /// Declined where a chain of readers of `chains` reads the anchor's
    /// output (see `yields_to`).
    pub fn yielding_to(self, chains: Vec<Vec<Link>>) -> Self {
        Rewrite { yields_to: chains, ..self }
    }

    /// The replacement's op needs opset `version`.
    pub fn needing_opset(self, version: i64) -> Self {
        Rewrite { opset: Some(version), ..self }
    }

    /// A report says `note` of the replacement.
    pub fn noting(self, note: String) -> Self {
        Rewrite { note: Some(note), ..self }
    }

    /// The replacement is a guard that runs `op` where it holds.
    pub fn running(self, op: &'static str) -> Self {
        Rewrite { runs: Some(op), ..self }
    }

    /// The replacement computes the anchor's values with the same elements
    /// in another shape: it writes `inner` (a new value), and a `Reshape`
    /// to `shape` (int64; 0 copies the axis) gives back the anchor's
    /// output. Both names are made unique by the driver.
    pub fn viewed_as(self, inner: &str, shape: &[i64]) -> Self {
        let view = View { inner: inner.to_string(), shape: format!("{inner}_shape"), dims: shape.to_vec() };
        Rewrite { view: Some(view), ..self }
    }

    /// `nodes` are computed before the replacement (see `prelude`).
    pub fn after(mut self, nodes: Vec<NodeProto>) -> Self {
        self.prelude.extend(nodes);
        self
    }

    /// Every value the rewrite reads from the graph: the replacement's and
    /// the prelude's inputs and what their bodies capture, less what the
    /// prelude and the new constants define. A body of original ops reads
    /// what the matched nodes read, which survives by construction.
    pub fn reads(&self) -> Vec<String> {
        let mut defined: HashSet<&str> = self.constants.iter().map(|t| t.name()).collect();
        defined.extend(self.prelude.iter().flat_map(|n| n.output.iter().map(String::as_str)));
        let mut reads: Vec<String> = Vec::new();
        for node in self.prelude.iter().chain([&self.replacement]) {
            let captured = node.subgraphs().filter(|b| b.name() != ORIGINAL).flat_map(free_values);
            for v in node.input.iter().cloned().chain(captured) {
                if !v.is_empty() && !defined.contains(v.as_str()) && !reads.contains(&v) {
                    reads.push(v);
                }
            }
        }
        reads
    }

    /// `fallback` is tried where this rewrite fails the driver's checks.
    pub fn or(mut self, fallback: Rewrite) -> Self {
        let last = match self.fallback.take() {
            Some(first) => first.or(fallback),
            None => fallback,
        };
        self.fallback = Some(Box::new(last));
        self
    }
}

/// What a rule builds its rewrite on: the anchor, the values it leaves in
/// place, the constants it makes.
pub struct Match {
    anchor: usize,
    kept: Vec<Kept>,
    constants: Vec<TensorProto>,
    prelude: Vec<NodeProto>,
}

impl Match {
    pub fn new(anchor: usize) -> Self {
        Match { anchor, kept: vec![], constants: vec![], prelude: vec![] }
    }

    /// The name the replacement reads a scale of ones over the last `k`
    /// axes of `x` (of float type `elem`) by, for a norm without weight: a
    /// constant (named as `weight_input` names it) where those axes are known numbers, else computed at run
    /// time from x's shape (`ConstantOfShape(Shape(x)[-k:])`, before the
    /// replacement), which multiplies as exactly, where x's rank is proved
    /// at least k. None where it is not, or where the opset has no such ops
    /// for the type (below 10; bf16 below 20).
    pub fn ones_over(&mut self, g: &Graph, x: &str, k: usize, elem: i32, what: &str) -> Option<String> {
        if let Some(ones) = crate::pattern::ones_over(g, x, k) {
            return Some(self.weight_input(g, Weight::Made(Box::new(ones)), what));
        }
        // x of a proved rank: a scalar's norm over "the last axis" runs as
        // primitives, not as the fused op (the fuzzer's x of no declared shape).
        let one = crate::pattern::filled_shape(elem, &[1], 1.0)?;
        let rank = g.shapes().rank(x).filter(|&r| r >= k.max(1));
        if rank.is_none() || g.opset < 10 || (elem == crate::onnx::BFLOAT16 && g.opset < 20) {
            return None;
        }
        let (last, ones) = (format!("{x}/last_axes"), format!("{x}/ones"));
        if g.opset >= 15 {
            self.prelude.push(writing(&last, node("Shape", &[x], vec![AttributeProto::int("start", -(k as i64))])));
        } else {
            let (shape, from, to) = (format!("{x}/shape"), format!("{x}/last_from"), format!("{x}/last_to"));
            self.prelude.push(writing(&shape, node("Shape", &[x], vec![])));
            self.prelude.push(ints_constant(&from, &[-(k as i64)]));
            self.prelude.push(ints_constant(&to, &[i64::MAX]));
            self.prelude.push(writing(&last, node("Slice", &[&shape, &from, &to], vec![])));
        }
        self.prelude
            .push(writing(&ones, node("ConstantOfShape", &[&last], vec![AttributeProto::tensor("value", one)])));
        Some(ones)
    }

    /// The name the replacement reads a weight by: the value itself, or a
    /// new constant (named after the anchor's output and `what`).
    pub fn weight_input(&mut self, g: &Graph, weight: Weight<'_>, what: &str) -> String {
        match weight {
            Weight::Value(v) => v.to_string(),
            Weight::Made(t) => {
                let name = format!("{}_{what}", g.node(self.anchor).output[0]);
                self.constants.push(TensorProto { name: Some(name.clone()), ..*t });
                name
            }
        }
    }

    /// The name the replacement reads a new constant by whose rows are the
    /// `weights`' rows side by side (weights `[K, Nᵢ]` of one type give
    /// `[K, N₁ + …]`): described (`onnx::rows`), its bytes composed where
    /// the model is written. None where a weight's bytes are not in the
    /// model (external data, typed fields) or do not match its dims.
    pub fn side_by_side(&mut self, g: &Graph, weights: &[&TensorProto], what: &str) -> Option<String> {
        fn bytes(w: &TensorProto) -> Option<&bytes::Bytes> {
            let raw = w.raw_data.as_ref().filter(|b| !b.is_empty() && !w.is_external() && w.external_data.is_empty());
            Some((raw?, usize::try_from(w.numel()?).ok()?)).filter(|(b, n)| *n > 0 && b.len() % n == 0).map(|(b, _)| b)
        }
        let first = weights.first()?;
        let (rows, elem) = (*first.dims.first()?, first.data_type);
        let width = bytes(first)?.len() / usize::try_from(first.numel()?).ok()?;
        let mut cols = 0;
        let mut raw = vec![];
        for w in weights {
            let [k, n] = w.dims[..] else { return None };
            let b = bytes(w)?;
            if k != rows || w.data_type != elem || b.len() != usize::try_from(w.numel()?).ok()? * width {
                return None;
            }
            cols += n;
            raw.push(b.clone());
        }
        let bytes = crate::onnx::rows::side_by_side(usize::try_from(rows).ok()?, raw)?;
        let t = TensorProto { dims: vec![rows, cols], data_type: elem, raw_data: Some(bytes), ..Default::default() };
        Some(self.weight_input(g, Weight::Made(Box::new(t)), what))
    }

    /// The node whose output the replacement takes over.
    pub fn anchor(&self) -> usize {
        self.anchor
    }

    /// `nodes` are computed before the replacement (see `Rewrite::prelude`).
    pub fn before(&mut self, nodes: impl IntoIterator<Item = NodeProto>) {
        self.prelude.extend(nodes);
    }

    /// `value` stays (see `Kept`).
    pub fn keep(&mut self, kept: Kept) {
        self.kept.push(kept);
    }

    pub fn replace_with(self, replacement: NodeProto) -> Rewrite {
        Rewrite {
            anchor: self.anchor,
            nodes: BTreeSet::new(),
            replacement,
            takes_over: vec![],
            offers: vec![],
            fallback: None,
            kept: self.kept,
            place: self.anchor,
            function: None,
            import: None,
            constants: self.constants,
            yields_to: Vec::new(),
            prelude: self.prelude,
            prelude_at: vec![],
            runs: None,
            opset: None,
            note: None,
            view: None,
        }
    }

    /// Replaced by ONNX Runtime's `com.microsoft` op `op_type`, the domain
    /// imported at version 1 where the model lacks it.
    pub fn replace_with_microsoft(self, op_type: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> Rewrite {
        self.replace_with(node_in(MICROSOFT, op_type, inputs, attributes)).importing(MICROSOFT, 1)
    }

    /// A replacement that calls a model-local function of its domain, op
    /// type and overload, whose body the driver writes from the matched
    /// nodes (`write_function`). `function` names the inputs the
    /// replacement reads (`input`, one name each) and says what it is
    /// (`doc_string`).
    pub fn replace_with_call(self, replacement: NodeProto, function: FunctionProto) -> Rewrite {
        let function = FunctionProto {
            name: replacement.op_type.clone(),
            domain: replacement.domain.clone(),
            overload: replacement.overload.clone(),
            ..function
        };
        Rewrite { function: Some(function), ..self.replace_with(replacement) }
    }
}

/// The nodes a rewrite replaces, derived from what it computes and reads:
/// every node its outputs depend on, back to the values the replacement
/// reads (and those `kept`), less whatever those values are computed from
/// (it must survive). Constants are left to `absorb_constants`.
/// Also returns the nodes walked on the way (the matched ones and those
/// the inputs are computed from), which the checks of names cover.
fn matched_nodes(g: &Graph, rewrite: &Rewrite) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let outputs = rewrite.takes_over.iter().chain(&rewrite.offers).map(|(_, v)| v.as_str());
    let roots = std::iter::once(rewrite.anchor).chain(outputs.filter_map(|v| g.producer(v))).collect();
    let reads = rewrite.reads();
    let inputs: Vec<&str> = reads.iter().map(String::as_str).collect();
    matched(g, roots, &inputs, &rewrite.kept)
}

fn matched(g: &Graph, roots: Vec<usize>, inputs: &[&str], kept: &[Kept]) -> (BTreeSet<usize>, BTreeSet<usize>) {
    let mut stops: HashSet<&str> = inputs.iter().copied().filter(|v| !v.is_empty()).collect();
    stops.extend(kept.iter().map(Kept::value));
    // A node before the producers of all inputs computed at run time
    // computes nothing from them: it is either what they are computed
    // from, or a side value (a Dropout's ratio) left as it is. An input
    // from outside the graph's nodes may be read anywhere.
    let computed = inputs.iter().filter(|v| !v.is_empty() && g.constant(v).is_none());
    let floor = computed.map(|v| g.producer(v).map(|p| g.position(p))).min().flatten().unwrap_or(0);
    let mut nodes = BTreeSet::new();
    walk_back(g, &mut nodes, roots, &stops, floor);
    // A kept value joins when nothing else needs its producer.
    loop {
        let joining: Vec<&str> = kept.iter().filter(|k| joins(g, &nodes, k)).map(Kept::value).collect();
        if joining.is_empty() {
            break;
        }
        for value in joining {
            stops.remove(value);
            walk_back(g, &mut nodes, g.producer(value).into_iter().collect(), &stops, floor);
        }
    }
    // What the replacement's inputs are computed from survives: walk back
    // from them, no further than the earliest matched node.
    let walked = nodes.clone();
    let earliest = nodes.iter().map(|&n| g.position(n)).min().unwrap_or(0);
    let mut todo: Vec<usize> = inputs.iter().filter_map(|v| g.producer(v)).collect();
    let mut seen = HashSet::new();
    while let Some(n) = todo.pop() {
        if g.position(n) < earliest || !seen.insert(n) {
            continue;
        }
        nodes.remove(&n);
        // A `Shape` reads no value: what it reads of a matched node may be
        // computed from values that survive (`shapes_read_outside`).
        if !reads_only_shape(g, n) {
            todo.extend(values_read_by(g.node(n)).iter().filter_map(|v| g.producer(v)));
        }
    }
    let staying = shape_arithmetic_read_outside(g, &mut nodes);
    (walked.difference(&staying).copied().collect(), nodes)
}

/// Shape arithmetic the match walked through (a head split's sizes) that a
/// node outside the match reads too stays for it (GPT-2's present key is
/// reshaped by the same sizes): the matched nodes it is computed from stay
/// with it, where each of them is shape arithmetic too, down to `Shape`s
/// of values that survive. Those nodes compute what they computed, from
/// the same values; nothing else changes. Otherwise the escape is declined.
fn shape_arithmetic_read_outside(g: &Graph, nodes: &mut BTreeSet<usize>) -> BTreeSet<usize> {
    let mut stays = BTreeSet::new();
    let arithmetic = |n: usize| shape_arithmetic(g, n);
    loop {
        let read_outside = |n: usize| {
            g.node(n).output.iter().any(|o| g.is_graph_output(o) || g.consumers(o).iter().any(|c| !nodes.contains(c)))
        };
        let mut staying = None;
        for &n in nodes.iter().filter(|&&n| arithmetic(n) && read_outside(n)) {
            // n and what it is computed from inside the match.
            let mut closure = BTreeSet::new();
            let mut todo = vec![n];
            let mut ok = true;
            while let Some(m) = todo.pop() {
                if !closure.insert(m) {
                    continue;
                }
                if !arithmetic(m) {
                    ok = false;
                    break;
                }
                let inside =
                    values_read_by(g.node(m)).into_iter().filter_map(|v| g.producer(&v)).filter(|p| nodes.contains(p));
                if reads_only_shape(g, m) {
                    // The shape of a value the match removes is no value that survives.
                    if inside.count() > 0 {
                        ok = false;
                        break;
                    }
                } else {
                    todo.extend(inside);
                }
            }
            if ok {
                staying = Some(closure);
                break;
            }
        }
        let Some(closure) = staying else { return stays };
        for n in closure {
            nodes.remove(&n);
            stays.insert(n);
        }
    }
}

/// Whether node `n` is int64 arithmetic on shapes: a `Shape` or `Size`, or
/// an op that selects, regroups or computes with their values.
fn shape_arithmetic(g: &Graph, n: usize) -> bool {
    let node = g.node(n);
    let ops =
        ["Shape", "Size", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Add", "Sub", "Mul", "Div"];
    crate::onnx::is_default_domain(node.domain())
        && ops.contains(&node.op_type())
        && node.output.iter().all(|o| g.elem_type(o) == Some(crate::onnx::INT64))
}

/// Whether a kept value's producer joins the match: it is reached, and no
/// reader outside the match needs it.
fn joins(g: &Graph, nodes: &BTreeSet<usize>, kept: &Kept) -> bool {
    let value = kept.value();
    let Some(p) = g.producer(value) else { return false };
    let readers = g.consumers(value);
    if nodes.contains(&p) || !readers.iter().any(|c| nodes.contains(c)) {
        return false;
    }
    let outside = || readers.iter().filter(|c| !nodes.contains(c));
    match kept {
        Kept::Shared(_) => !g.is_graph_output(value) && outside().next().is_none(),
        Kept::BesidesShapes(_) => outside().all(|&c| g.node(c).is("Shape") || g.node(c).is("Size")),
        Kept::ForItsShape(_) => {
            g.is_graph_output(value) || outside().next().is_none() || !outside().all(|&c| g.node(c).is("Shape"))
        }
    }
}

/// Adds `from` and every node they depend on to `nodes`, through values
/// that are neither `stops` nor constants, down to position `floor`.
/// A `Shape` (or `Size`) depends on no value, only on its shape: what it
/// reads joins through another reader, or stays (a hidden state whose
/// shape sizes a Reshape of the match).
fn walk_back(g: &Graph, nodes: &mut BTreeSet<usize>, from: Vec<usize>, stops: &HashSet<&str>, floor: usize) {
    let mut todo = from;
    while let Some(n) = todo.pop() {
        if g.position(n) < floor || !nodes.insert(n) || reads_only_shape(g, n) {
            continue;
        }
        for value in g.node(n).input.iter().filter(|v| !v.is_empty() && !stops.contains(v.as_str())) {
            if g.constant(value).is_none() {
                todo.extend(g.producer(value).filter(|p| !nodes.contains(p)));
            }
        }
    }
}

/// Builds a replacement node in the default domain.
pub fn node(op_type: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op_type.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        attribute: attributes,
        ..Default::default()
    }
}

/// Builds a replacement node in `domain` (`transmuter`, say).
pub fn node_in(domain: &str, op_type: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> NodeProto {
    NodeProto { domain: Some(domain.into()), ..node(op_type, inputs, attributes) }
}

/// `n` writing its one output as `name` (the nodes a replacement adds
/// before itself).
pub fn writing(name: &str, n: NodeProto) -> NodeProto {
    NodeProto { output: vec![name.to_string()], ..n }
}

/// Nodes a rewrite writes around its replacement (a guard's conditions, a
/// branch's steps), each named by what it computes after a prefix (the
/// value replaced and a `/`, say).
pub struct Nodes {
    prefix: String,
    pub list: Vec<NodeProto>,
}

impl Nodes {
    pub fn new(prefix: String) -> Nodes {
        Nodes { prefix, list: Vec::new() }
    }

    /// The name of `what`.
    pub fn name(&self, what: &str) -> String {
        format!("{}{what}", self.prefix)
    }

    /// `op(inputs)`, written as `what`: its name.
    pub fn op(&mut self, what: &str, op: &str, inputs: &[&str], attributes: Vec<AttributeProto>) -> String {
        let name = self.name(what);
        self.list.push(writing(&name, node(op, inputs, attributes)));
        name
    }

    /// A `Constant` of one value of `elem` (`FLOAT` or `INT64`), written as
    /// `what`: its name.
    pub fn scalar(&mut self, what: &str, elem: i32, value: f64) -> String {
        let t = match elem {
            INT64 => TensorProto { data_type: Some(INT64), int64_data: vec![value as i64], ..Default::default() },
            _ => TensorProto { data_type: Some(FLOAT), float_data: vec![value as f32], ..Default::default() },
        };
        let name = self.name(what);
        self.list.push(writing(&name, node("Constant", &[], vec![AttributeProto::tensor("value", t)])));
        name
    }

    /// A `Constant` of the 1-D int64 `values`, written as `what`: its name.
    pub fn ints(&mut self, what: &str, values: &[i64]) -> String {
        let name = self.name(what);
        self.list.push(ints_constant(&name, values));
        name
    }
}

/// The body's nodes, and the bodies written with them, read `to` where
/// they read `from` (bodies of original ops keep reading the graph's
/// values): the same nodes over another input.
pub fn reading_instead(body: &mut GraphProto, from: &str, to: &str) {
    let rename = |v: &mut String| {
        if v == from {
            *v = to.to_string();
        }
    };
    body.node.iter_mut().for_each(|n| rename_in_node(n, &rename));
}

/// A `Constant` node writing the 1-D int64 tensor `values` as `name`.
pub fn ints_constant(name: &str, values: &[i64]) -> NodeProto {
    let t = TensorProto {
        data_type: Some(INT64),
        dims: vec![values.len() as i64],
        int64_data: values.to_vec(),
        ..Default::default()
    };
    writing(name, node("Constant", &[], vec![AttributeProto::tensor("value", t)]))
}

/// One replacement the pipeline made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fused {
    pub pass: &'static str,
    pub op_type: String,
    pub name: String,
    /// Where the node is: `main`, or the path of a subgraph body.
    pub graph: String,
    /// The original nodes it stands for, as in its `transmuter.fused` value.
    pub replaced: Vec<String>,
    /// `If` where the node is a guard: `op_type` (ONNX `Attention`) runs
    /// where the guard holds, the original ops elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
    /// The opset its op needs (23 for ONNX `Attention`), where that is newer
    /// than the passes otherwise need.
    #[serde(skip)]
    pub opset: Option<i64>,
    /// What the report says of it besides (why an attention core is not
    /// ONNX `Attention`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A replacement a later pass took into its own node (skip-norm's residual
/// Add joined to a norm): it counts for the pass that made it, but is no
/// longer in the output.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Absorbed {
    #[serde(flatten)]
    pub fused: Fused,
    /// The node that took it in, and the pass that wrote that node.
    pub into: String,
    pub by: &'static str,
}

/// An anchor candidate a rule looked at and turned down.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Declined {
    pub pass: &'static str,
    pub node: String,
    pub graph: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Outcome {
    /// The fused nodes in the output.
    pub fused: Vec<Fused>,
    /// Fused nodes a later pass took into its own (not in the output).
    pub absorbed: Vec<Absorbed>,
    pub declined: Vec<Declined>,
    /// The model's functions, then those rewrites call, in the order first
    /// needed: a rewrite may only call a function whose body is its own.
    functions: Vec<FunctionProto>,
    /// Operator sets rewrites need imported.
    imports: Vec<(&'static str, i64)>,
    /// Nodes the export never had (added by `--opset`'s adapters): a
    /// replacement's provenance does not name them.
    unexported: HashSet<String>,
}

impl Outcome {
    /// The newest opset a candidate was declined for lacking (reasons of
    /// `Graph::require_opset`).
    pub fn needed_opset(&self) -> Option<i64> {
        self.declined.iter().filter_map(|d| crate::graph::needs_opset(&d.reason)).max()
    }
}

/// Runs `passes` over the model's graph and every subgraph body, each graph
/// to a fixed point, for the `ort` target.
pub fn run(model: &mut ModelProto, passes: &[&Pass]) -> Outcome {
    run_for(model, passes, Target::Ort)
}

/// `run` for a target: what the passes may write.
pub fn run_for(model: &mut ModelProto, passes: &[&Pass], target: Target) -> Outcome {
    run_upgraded(model, passes, target, HashSet::new())
}

/// `run_for` on a model `--opset` upgraded: `added` names the nodes the
/// upgrade added, which no provenance list names (ground rule 6: a list
/// names the original nodes of the exported model; an adapted node keeps
/// its name and stands for its original).
pub fn run_upgraded(model: &mut ModelProto, passes: &[&Pass], target: Target, added: HashSet<String>) -> Outcome {
    run_reading(model, passes, target, added, &ExternalValues::default())
}

/// `run_upgraded` where `external` holds the values of the model's small
/// tensors in external data, read where it was loaded
/// (`io::external_reader`), for the proofs that read values.
pub fn run_reading(
    model: &mut ModelProto,
    passes: &[&Pass],
    target: Target,
    added: HashSet<String>,
    external: &ExternalValues,
) -> Outcome {
    let opset = model.default_opset();
    let mut outcome = Outcome { functions: model.functions.clone(), unexported: added, ..Default::default() };
    let context = Context { opset, opset_implied: model.imported_default_opset().is_none(), target };
    if let Some(graph) = model.graph.as_mut() {
        run_graph(graph, context, &Scope::reading(external.clone()), passes, "main", &mut outcome);
        // A model nothing was fused in is written back as it was.
        if !outcome.fused.is_empty() || !outcome.absorbed.is_empty() {
            declare_types(graph, context, &Scope::default(), &HashSet::new());
        }
    }
    for (domain, version) in std::mem::take(&mut outcome.imports) {
        if !model.opset_import.iter().any(|o| o.domain() == domain) {
            model.opset_import.push(OperatorSetIdProto { domain: Some(domain.into()), version: Some(version) });
        }
    }
    add_functions(model, std::mem::take(&mut outcome.functions));
    outcome
}

/// Declares the element type, and the shape where proved
/// (`Graph::declaration`), of the values ONNX's shape inference cannot
/// reach in the fused graph: the outputs of every node ONNX does not know
/// (ONNX Runtime's ops, `transmuter`'s; `ops::onnx_infers`) and of every
/// node after one, in `graph` and its bodies; and the outputs of every
/// fused node. Tools that type values by ONNX's inference (ONNX
/// Runtime's quantizers) then see the types they see in the export. What
/// the export declared is kept as it was (ground rule 9); a value whose
/// type is not proved is not declared. `unreached` names the values of
/// enclosing graphs ONNX cannot reach.
fn declare_types(graph: &mut GraphProto, context: Context, outer: &Scope, unreached: &HashSet<String>) {
    let (declarations, unreached, bodies) = {
        let g = context.view(graph, outer);
        let declared: HashSet<&str> = (graph.input.iter().chain(&graph.output).chain(&graph.value_info))
            .map(|v| v.name())
            .chain(graph.initializer.iter().map(|t| t.name()))
            .collect();
        let mut unreached = unreached.clone();
        let mut declarations = Vec::new();
        for node in g.order().iter().map(|&i| g.node(i)) {
            let opaque = !crate::ops::onnx_infers(node.domain(), node.op_type(), context.opset)
                || values_read_by(node).iter().any(|v| unreached.contains(v));
            let fused = node.metadata(FUSED_KEY).is_some();
            for out in node.output.iter().filter(|o| !o.is_empty()) {
                if opaque {
                    unreached.insert(out.clone());
                }
                if (opaque || fused) && !declared.contains(out.as_str()) {
                    declarations.extend(g.declaration(out));
                }
            }
        }
        (declarations, unreached, Bodies::of(&g))
    };
    bodies.walk(graph, "", |body, scope, _| declare_types(body, context, scope, &unreached));
    graph.value_info.extend(declarations);
}

/// Adds the functions replacements call, once each, with the model's opset
/// imports (plus their own domain), and raises the IR version to what local
/// functions need: 8, or 10 when they are overloaded. Never lowers it.
fn add_functions(model: &mut ModelProto, functions: Vec<FunctionProto>) {
    for function in functions {
        if model.functions.iter().any(|f| same_signature(f, &function)) {
            continue;
        }
        if !model.opset_import.iter().any(|o| o.domain() == function.domain()) {
            model.opset_import.push(OperatorSetIdProto { domain: Some(function.domain().into()), version: Some(1) });
        }
        let needed = if function.overload().is_empty() { 8 } else { 10 };
        model.ir_version = Some(model.ir_version().max(needed));
        model.functions.push(function);
    }
    // Functions see the opset imports of the finished model. ONNX Runtime
    // resolves a function body's default-domain ops only through an import
    // spelled "" (a model may spell it "ai.onnx"; the two are one domain).
    let mut imports: Vec<OperatorSetIdProto> = Vec::new();
    for import in &model.opset_import {
        let spelled =
            (import.domain() == "ai.onnx").then(|| OperatorSetIdProto { domain: Some(String::new()), ..*import });
        let import = spelled.as_ref().unwrap_or(import);
        if !imports.iter().any(|o| o.domain() == import.domain()) {
            imports.push(import.clone());
        }
    }
    // A model that uses the default domain without importing it runs at
    // the opset ONNX Runtime resolves; the bodies are written for that one.
    if !imports.iter().any(|o| o.domain().is_empty()) {
        imports.push(OperatorSetIdProto { domain: Some(String::new()), version: Some(model.default_opset()) });
    }
    for f in model.functions.iter_mut().filter(|f| f.domain() == crate::onnx::TRANSMUTER_DOMAIN) {
        f.opset_import = imports.clone();
    }
}

/// Functions are identified by domain, name and overload.
fn same_signature(a: &FunctionProto, b: &FunctionProto) -> bool {
    (a.domain(), a.name(), a.overload()) == (b.domain(), b.name(), b.overload())
}

/// A function's identity is its body: the same signature must mean the same
/// inputs, outputs, attributes and nodes.
fn same_body(a: &FunctionProto, b: &FunctionProto) -> bool {
    (&a.input, &a.output, &a.attribute, &a.attribute_proto, &a.node)
        == (&b.input, &b.output, &b.attribute, &b.attribute_proto, &b.node)
}

/// What every graph of one run shares.
#[derive(Clone, Copy)]
struct Context {
    opset: i64,
    opset_implied: bool,
    target: Target,
}

impl Context {
    fn view<'a>(&self, graph: &'a GraphProto, outer: &'a Scope) -> Graph<'a> {
        let mut g = Graph::new(graph, self.opset, outer);
        g.target = self.target;
        g.opset_implied = self.opset_implied;
        g
    }
}

fn run_graph(
    graph: &mut GraphProto,
    context: Context,
    outer: &Scope,
    passes: &[&Pass],
    path: &str,
    outcome: &mut Outcome,
) {
    // Bodies first: what they stop reading may free an outer match. Once
    // the outer graph changed, the bodies again: a name it no longer has
    // shadows nothing in them any more, so a second run finds nothing new.
    let has_bodies = graph.node.iter().any(|n| n.subgraphs().next().is_some());
    loop {
        if has_bodies {
            run_bodies(graph, context, outer, passes, path, outcome);
        }
        if !fixed_point(graph, context, outer, passes, path, outcome) || !has_bodies {
            break;
        }
        // The bodies' reasons are recorded anew.
        let inside = format!("{path}/");
        outcome.declined.retain(|d| !d.graph.starts_with(&inside));
    }
}

/// Runs the passes in every body of `graph`, each with what the graph
/// makes visible to it.
fn run_bodies(
    graph: &mut GraphProto,
    context: Context,
    outer: &Scope,
    passes: &[&Pass],
    path: &str,
    outcome: &mut Outcome,
) {
    // The bodies of a fused node are its own (the original ops a guard
    // runs): no pass rewrites them, so a second run changes nothing.
    let bodies = Bodies::of(&context.view(graph, outer)).of_nodes(graph, |n| n.metadata(FUSED_KEY).is_none());
    bodies.walk(graph, path, |body, scope, body_path| run_graph(body, context, scope, passes, body_path, outcome));
}

/// Replaces node i of `graph` with `nodes[i]` where that is given: the
/// node's new form with the nodes it needs before and after it (`--opset`'s
/// adapters: a Constant for an attribute that became an input, say), each
/// other node kept as it is, in place. Nodes with bodies are never replaced.
pub fn replace_in_place(graph: &mut GraphProto, nodes: Vec<Option<(Vec<NodeProto>, NodeProto, Vec<NodeProto>)>>) {
    let old = std::mem::take(&mut graph.node);
    for (node, new) in old.into_iter().zip(nodes) {
        match new {
            None => graph.node.push(node),
            Some((before, replacement, after)) => {
                debug_assert!(node.subgraphs().next().is_none(), "no node with bodies is replaced in place");
                graph.node.extend(before);
                graph.node.push(replacement);
                graph.node.extend(after);
            }
        }
    }
}

/// The one walk over the bodies of a graph's nodes (`If` branches, `Loop`
/// and `Scan` bodies), shared by the driver and `--opset`: each body with
/// what it sees of the graphs around it and its path in reports.
pub struct Bodies {
    scope: Scope,
    /// For each node that holds bodies, the names its bodies cannot see.
    hidden: Vec<(usize, HashSet<String>)>,
}

impl Bodies {
    /// What the bodies of the view's nodes see (derived only where a node
    /// holds one).
    pub fn of(g: &Graph) -> Bodies {
        let holders: Vec<usize> = (0..g.proto.node.len()).filter(|&i| g.node(i).subgraphs().next().is_some()).collect();
        let scope = if holders.is_empty() { Scope::default() } else { g.scope_for_subgraphs() };
        Bodies { scope, hidden: holders.into_iter().map(|i| (i, g.hidden_from_bodies_of(i))).collect() }
    }

    /// Only the bodies of the nodes of `graph` (the graph `of` was given a
    /// view of) that `keep` accepts.
    pub fn of_nodes(mut self, graph: &GraphProto, keep: impl Fn(&NodeProto) -> bool) -> Bodies {
        self.hidden.retain(|(holder, _)| keep(&graph.node[*holder]));
        self
    }

    /// Calls `visit(body, its scope, its path)` for every body of `graph`,
    /// the graph `of` was given a view of.
    pub fn walk(self, graph: &mut GraphProto, path: &str, mut visit: impl FnMut(&mut GraphProto, &Scope, &str)) {
        let Bodies { mut scope, hidden } = self;
        for (i, names) in hidden {
            scope.hide(names);
            let node = &mut graph.node[i];
            let holder = display_name(node);
            for attribute in node.attribute.iter_mut() {
                let name = attribute.name().to_string();
                for (k, body) in attribute.g.iter_mut().chain(attribute.graphs.iter_mut()).enumerate() {
                    visit(body, &scope, &body_path(path, &holder, &name, k));
                }
            }
        }
    }
}

/// Runs the passes over `graph` itself until none matches; true when
/// anything was fused.
fn fixed_point(
    graph: &mut GraphProto,
    context: Context,
    outer: &Scope,
    passes: &[&Pass],
    path: &str,
    outcome: &mut Outcome,
) -> bool {
    let mut any = false;
    loop {
        // Each round records this graph's reasons anew: a later round, or
        // a later call once the bodies ran again, only repeats them.
        outcome.declined.retain(|d| d.graph != path);
        let mut changed = false;
        let mut next = 0;
        while next < passes.len() {
            // One view serves the passes in turn until one changes the graph.
            let (pass, rewrites) = {
                let view = context.view(graph, outer);
                loop {
                    let pass = passes[next];
                    next += 1;
                    let rewrites = find(&view, pass, path, &outcome.functions, &mut outcome.declined);
                    if !rewrites.is_empty() || next == passes.len() {
                        break (pass, rewrites);
                    }
                }
            };
            if !rewrites.is_empty() {
                for function in rewrites.iter().filter_map(|r| r.function.as_ref()) {
                    if !outcome.functions.iter().any(|f| same_signature(f, function)) {
                        outcome.functions.push(function.clone());
                    }
                }
                outcome.imports.extend(rewrites.iter().filter_map(|r| r.import));
                apply(graph, rewrites, pass.name, path, outcome);
                changed = true;
            }
        }
        if !changed {
            return any;
        }
        any = true;
    }
}

/// Every non-overlapping match of `pass`, anchors in dependency order.
fn find(g: &Graph, pass: &Pass, path: &str, functions: &[FunctionProto], declined: &mut Vec<Declined>) -> Vec<Rewrite> {
    let mut claimed = HashSet::new();
    let mut new_names = HashSet::new();
    let mut found: Vec<Rewrite> = Vec::new();
    for &anchor in g.order() {
        // A rule reads the positions an op requires without checking them:
        // a node that lacks one is never an anchor, and the view hides it
        // as a producer (`Graph::malformed`).
        if claimed.contains(&anchor) || g.malformed(anchor).is_some() {
            continue;
        }
        let checked = (pass.rule)(g, anchor).and_then(|rewrite| {
            let earlier: Vec<&FunctionProto> =
                functions.iter().chain(found.iter().filter_map(|r| r.function.as_ref())).collect();
            settle(g, rewrite, &earlier)
        });
        match checked {
            // A match that holds every earlier match it meets replaces them
            // (a LayerNorm's beta Add after the Mul of its gamma); one that
            // meets an earlier match only in part is left.
            Ok(mut rewrite) if found_within(&found, &claimed, &rewrite) => {
                found.retain(|earlier| earlier.nodes.is_disjoint(&rewrite.nodes));
                claimed.extend(rewrite.nodes.iter().copied());
                rewrite.place = placement(g, &rewrite);
                rewrite.prelude_at = prelude_placement(g, &rewrite);
                found.push(rewrite);
            }
            Ok(_) => {}
            Err(Miss::NotCandidate) => {}
            Err(Miss::Declined(reason)) => declined.push(Declined {
                pass: pass.name,
                node: display_name(g.node(anchor)),
                graph: path.to_string(),
                reason,
            }),
        }
    }
    for rewrite in &mut found {
        name_new_values(g, rewrite, &mut new_names);
    }
    found
}

/// True where every earlier match that shares a node with `rewrite` lies
/// within it.
fn found_within(found: &[Rewrite], claimed: &HashSet<usize>, rewrite: &Rewrite) -> bool {
    rewrite.nodes.iter().all(|n| !claimed.contains(n))
        || found
            .iter()
            .all(|earlier| earlier.nodes.is_disjoint(&rewrite.nodes) || earlier.nodes.is_subset(&rewrite.nodes))
}

/// The rewrite with the nodes it replaces derived and the outputs it offers
/// settled, once it passes every check; else its fallback, settled the
/// same way (the last one's reason is given when none passes).
fn settle(g: &Graph, mut rewrite: Rewrite, functions: &[&FunctionProto]) -> Check<Rewrite> {
    let fallback = rewrite.fallback.take();
    // What a kernel's note names, where the checks refuse it.
    let kernel = rewrite.opset.map(|_| {
        let op = rewrite.runs.unwrap_or(rewrite.replacement.op_type());
        match rewrite.replacement.domain() {
            d if crate::onnx::is_default_domain(d) => format!("ONNX {op}"),
            d => format!("{d}.{op}"),
        }
    });
    let checked = (|| {
        read_constants_at_their_source(g, &mut rewrite);
        let (walked, nodes) = matched_nodes(g, &rewrite);
        rewrite.nodes = nodes;
        absorb_constants(g, &mut rewrite);
        // An offered output is taken over where the match does not hold all
        // its readers.
        for (slot, value) in std::mem::take(&mut rewrite.offers) {
            let outside = g.consumers(&value).iter().any(|c| !rewrite.nodes.contains(c));
            if g.is_graph_output(&value) || outside {
                rewrite.takes_over.push((slot, value));
            }
        }
        shapes_read_outside(g, &mut rewrite);
        check_nothing_escapes(g, &rewrite)?;
        check_yields(g, &rewrite)?;
        check_computed_once(g, &rewrite, &walked)?;
        check_unambiguous(g, &rewrite, &walked.union(&rewrite.nodes).copied().collect())?;
        write_function(g, &mut rewrite, functions)?;
        fill_original_ops(g, &mut rewrite)?;
        Ok(rewrite)
    })();
    match (checked, fallback) {
        // A kernel the checks refuse says why where its fallback is taken.
        (Err(Miss::Declined(why)), Some(fallback)) => {
            let settled = settle(g, *fallback, functions)?;
            // The core a kernel falls back to says why it is not the kernel.
            Ok(match kernel {
                Some(op) if settled.opset.is_none() && settled.note.is_none() => {
                    settled.noting(format!("not {op}: {why}"))
                }
                _ => settled,
            })
        }
        (Err(_), Some(fallback)) => settle(g, *fallback, functions),
        (checked, _) => checked,
    }
}

/// Gives the values a rewrite adds (its constants, what its prelude and
/// the bodies it wrote compute) names no value of the graph, of an
/// enclosing graph or of another rewrite has (`base`, `base_1`, …), and
/// has its nodes read them by those names. Values the prelude computes in
/// place of a `Shape` of the graph keep their names.
fn name_new_values(g: &Graph, rewrite: &mut Rewrite, taken: &mut HashSet<String>) {
    let keep: HashSet<String> = rewrite.nodes.iter().flat_map(|&n| g.node(n).output.iter().cloned()).collect();
    let mut new: Vec<String> = rewrite.constants.iter().map(|t| t.name().to_string()).collect();
    new.extend(rewrite.prelude.iter().flat_map(|n| n.output.iter().cloned()).filter(|o| !keep.contains(o)));
    for body in rewrite.replacement.subgraphs().filter(|b| b.name() != ORIGINAL) {
        defined_by_nodes(body, &mut new);
    }
    new.extend(rewrite.view.iter().flat_map(|v| [v.inner.clone(), v.shape.clone()]));
    let mut renamed: HashMap<String, String> = HashMap::new();
    for base in
        new.into_iter().filter(|v| !v.is_empty() && !keep.contains(v) && !rewrite.replacement.output.contains(v))
    {
        let name = unused_name(&base, 1, |n| g.is_name_taken(n) || taken.contains(n));
        taken.insert(name.clone());
        renamed.insert(base, name);
    }
    if renamed.is_empty() {
        return;
    }
    let rename = |v: &mut String| {
        if let Some(to) = renamed.get(v.as_str()) {
            *v = to.clone();
        }
    };
    for t in &mut rewrite.constants {
        let mut name = t.name().to_string();
        rename(&mut name);
        t.name = Some(name);
    }
    for node in rewrite.prelude.iter_mut().chain([&mut rewrite.replacement]) {
        rename_in_node(node, &rename);
    }
    if let Some(view) = &mut rewrite.view {
        rename(&mut view.inner);
        rename(&mut view.shape);
    }
}

/// Every value the nodes of `body` compute, at any depth, but in bodies of
/// original ops.
fn defined_by_nodes(body: &GraphProto, into: &mut Vec<String>) {
    for node in &body.node {
        into.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
        for sub in node.subgraphs().filter(|b| b.name() != ORIGINAL) {
            defined_by_nodes(sub, into);
        }
    }
}

/// Renames the values a node reads and writes, and those of the bodies
/// written with it (bodies of original ops keep the graph's names).
fn rename_in_node(node: &mut NodeProto, rename: &impl Fn(&mut String)) {
    node.input.iter_mut().chain(node.output.iter_mut()).for_each(rename);
    for body in node.subgraphs_mut().filter(|b| b.name() != ORIGINAL) {
        body.node.iter_mut().for_each(|n| rename_in_node(n, rename));
        for out in &mut body.output {
            let mut name = out.name().to_string();
            rename(&mut name);
            out.name = Some(name);
        }
    }
}

/// Whether node `n` reads only the shape of its input (`Shape`, `Size`).
fn reads_only_shape(g: &Graph, n: usize) -> bool {
    let node = g.node(n);
    (node.is("Shape") || node.is("Size")) && crate::onnx::is_default_domain(node.domain()) && node.input.len() == 1
}

/// A value the match removes that nodes outside it read only through
/// `Shape` (a mask cut to `Shape(key)[2]`, where the key is a value the
/// match repeats): where each axis read is a number or proved equal to an
/// axis of a value that survives (one the rewrite reads, or a graph input)
/// and is computed before that `Shape`, the `Shape` joins the match and the
/// prelude computes what it read from those values. Otherwise nothing
/// changes, and the escape is declined.
fn shapes_read_outside(g: &Graph, rewrite: &mut Rewrite) {
    let reads = rewrite.reads();
    let mut sources: Vec<&str> = reads.iter().map(String::as_str).collect();
    sources.extend(g.proto.input.iter().map(|i| i.name()));
    let shapes = g.shapes();
    let matched: Vec<usize> = rewrite.nodes.iter().copied().collect();
    for n in matched {
        for value in g.node(n).output.iter().filter(|o| !o.is_empty()) {
            let outside: Vec<usize> =
                g.consumers(value).iter().copied().filter(|c| !rewrite.nodes.contains(c)).collect();
            let all_shapes = outside.iter().all(|&c| reads_only_shape(g, c) && g.node(c).is("Shape"));
            if outside.is_empty()
                || !all_shapes
                || g.is_graph_output(value)
                || value == &g.node(rewrite.anchor).output[0]
            {
                continue;
            }
            let Some(dims) = shapes.shape(value) else { continue };
            let computed: Option<Vec<Vec<NodeProto>>> =
                outside.iter().map(|&s| shape_from_survivors(g, &shapes, &sources, &dims, s)).collect();
            if let Some(computed) = computed {
                rewrite.nodes.extend(outside);
                rewrite.prelude.extend(computed.into_iter().flatten());
            }
        }
    }
}

/// The nodes computing what `Shape` node `s` reads of a value of shape
/// `dims`, each axis a number or an axis of one of `sources` computed
/// before `s`; the last one writes `s`'s output.
fn shape_from_survivors(
    g: &Graph,
    shapes: &crate::shapes::Shapes,
    sources: &[&str],
    dims: &[crate::shapes::Dim],
    s: usize,
) -> Option<Vec<NodeProto>> {
    let shape = g.node(s);
    let rank = dims.len() as i64;
    let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
    let start = clamp(shape.attr_int("start").unwrap_or(0));
    let end = clamp(shape.attr_int("end").unwrap_or(rank));
    let out = &shape.output[0];
    // Before `s` in dependency order, not in the list (which may be in any
    // order, spec ground rule 10): a value computed from `s`'s output would
    // make a cycle. A malformed node's output has no place to compare.
    let before = |v: &str| {
        g.producer(v).is_none_or(|p| g.position(p) < g.position(s))
            && g.computed_by_malformed(v).is_none()
            && !g.is_ambiguous(v)
    };
    let int64s = |name: &str, values: Vec<i64>| {
        let t = TensorProto {
            data_type: Some(crate::onnx::INT64),
            dims: vec![values.len() as i64],
            int64_data: values,
            ..Default::default()
        };
        NodeProto {
            output: vec![name.to_string()],
            ..node_in("", "Constant", &[], vec![AttributeProto::tensor("value", t)])
        }
    };
    let mut nodes = Vec::new();
    let mut parts = Vec::new();
    for (i, dim) in dims.iter().enumerate().take(end).skip(start) {
        let part = format!("{out}_axis{i}");
        match dim.value() {
            Some(n) => nodes.push(int64s(&part, vec![n])),
            None => {
                let (x, j) = sources.iter().filter(|x| before(x)).find_map(|x| {
                    let j = shapes.shape(x)?.iter().position(|d| d == dim)?;
                    Some((*x, j as i64))
                })?;
                if g.opset >= 15 {
                    let slice = vec![AttributeProto::int("start", j), AttributeProto::int("end", j + 1)];
                    nodes.push(NodeProto { output: vec![part.clone()], ..node("Shape", &[x], slice) });
                } else {
                    let (whole, at) = (format!("{part}_of"), format!("{part}_at"));
                    nodes.push(NodeProto { output: vec![whole.clone()], ..node("Shape", &[x], vec![]) });
                    nodes.push(int64s(&at, vec![j]));
                    let gather = node("Gather", &[&whole, &at], vec![AttributeProto::int("axis", 0)]);
                    nodes.push(NodeProto { output: vec![part.clone()], ..gather });
                }
            }
        }
        parts.push(part);
    }
    match parts.len() {
        0 => nodes.push(int64s(out, vec![])),
        1 => nodes.last_mut()?.output = vec![out.clone()],
        _ => {
            let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
            let concat = node("Concat", &parts, vec![AttributeProto::int("axis", 0)]);
            nodes.push(NodeProto { output: vec![out.clone()], ..concat });
        }
    }
    Some(nodes)
}

/// The matched nodes and the `extra` ones in graph order, less those whose
/// outputs the prelude now computes (a `Shape` of a removed value).
fn in_order<'g>(g: &Graph<'g>, rewrite: &Rewrite, extra: &[usize]) -> Vec<&'g NodeProto> {
    let by_prelude: HashSet<&str> = rewrite.prelude.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    let mut order: Vec<usize> = rewrite.nodes.iter().chain(extra).copied().collect();
    order.sort_by_key(|&n| g.position(n));
    order.dedup();
    order.into_iter().map(|n| g.node(n)).filter(|n| !n.output.iter().any(|o| by_prelude.contains(o.as_str()))).collect()
}

/// The values the replacement computes, by slot: the anchor's output
/// first, then those it takes over.
fn outputs_by_slot<'r>(g: &Graph<'r>, rewrite: &'r Rewrite) -> Vec<&'r str> {
    let mut slots: Vec<(usize, &str)> = rewrite.takes_over.iter().map(|(slot, v)| (*slot, v.as_str())).collect();
    slots.push((0, &g.node(rewrite.anchor).output[0]));
    slots.sort();
    slots.into_iter().map(|(_, v)| v).collect()
}

/// Fills each body of original ops in the replacement (at any depth) with
/// the matched nodes, in their order, computing the replacement's outputs
/// under their names (the outputs of the node that holds a body are not
/// visible inside it, so the names are free there). A `Shape` the prelude
/// now computes stays out. The outputs' element types must be known.
fn fill_original_ops(g: &Graph, rewrite: &mut Rewrite) -> Check<()> {
    fn has_original(node: &NodeProto) -> bool {
        node.subgraphs().any(|b| b.name() == ORIGINAL || b.node.iter().any(has_original))
    }
    if !has_original(&rewrite.replacement) {
        return Ok(());
    }
    let nodes: Vec<NodeProto> = in_order(g, rewrite, &[]).into_iter().cloned().collect();
    let mut outputs = Vec::new();
    for value in outputs_by_slot(g, rewrite) {
        let elem = g.elem_type(value).or_decline(|| format!("the type of {value} is not known"))?;
        outputs.push(value_info(value, elem));
    }
    let body = GraphProto {
        name: Some(format!("the original ops of {}", display_name(g.node(rewrite.anchor)))),
        node: nodes,
        output: outputs,
        ..Default::default()
    };
    fn fill(node: &mut NodeProto, body: &GraphProto) {
        for sub in node.subgraphs_mut() {
            if sub.name() == ORIGINAL {
                *sub = body.clone();
            } else {
                sub.node.iter_mut().for_each(|n| fill(n, body));
            }
        }
    }
    fill(&mut rewrite.replacement, &body);
    Ok(())
}

/// Writes the body of the function the replacement calls
/// (`Match::replace_with_call`): the matched nodes in graph order, and the
/// producer of a kept value they read where it reads only the
/// replacement's inputs and writes none (scores that stay for a `Shape`
/// are computed again, but where the replacement reads them as well). Equal to what it replaced by construction. Its values are named
/// apart from the graph's: the inputs the rule named first, then every
/// other value from outside in the order the body reads them (`input_N`),
/// the outputs `out`, `out_N` by slot, the rest `t0`, `t1`, … in order;
/// node names, doc strings and metadata are dropped. A function of the
/// same body is called again; another body of the rule's overload takes
/// the first free `_2`, `_3`, … (a function's identity is its body).
fn write_function(g: &Graph, rewrite: &mut Rewrite, earlier: &[&FunctionProto]) -> Check<()> {
    let Some(mut function) = rewrite.function.take() else { return Ok(()) };
    let declared: HashSet<&str> = rewrite.replacement.input.iter().map(String::as_str).collect();
    let recomputed: Vec<usize> = rewrite
        .kept
        .iter()
        .filter_map(|k| g.producer(k.value()))
        .filter(|p| !rewrite.nodes.contains(p))
        .filter(|&p| g.node(p).input.iter().all(|v| v.is_empty() || declared.contains(v.as_str())))
        .filter(|&p| !g.node(p).output.iter().any(|o| declared.contains(o.as_str())))
        .filter(|&p| g.node(p).output.iter().any(|o| g.consumers(o).iter().any(|c| rewrite.nodes.contains(c))))
        .collect();
    let nodes = in_order(g, rewrite, &recomputed);
    require!(
        nodes.iter().all(|n| n.subgraphs().next().is_none()),
        "the match holds a node with a body, which a function cannot take over"
    );
    let mut names: HashMap<&str, String> = HashMap::new();
    let mut inputs: Vec<String> = Vec::new();
    for (value, name) in rewrite.replacement.input.iter().zip(&function.input) {
        names.entry(value.as_str()).or_insert_with(|| name.clone());
        inputs.push(value.clone());
    }
    let produced: HashSet<&str> = nodes.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    for value in nodes.iter().flat_map(|n| n.input.iter()) {
        if !value.is_empty() && !produced.contains(value.as_str()) && !names.contains_key(value.as_str()) {
            let name = format!("input_{}", function.input.len());
            names.insert(value, name.clone());
            function.input.push(name);
            inputs.push(value.clone());
        }
    }
    function.output.clear();
    for (slot, value) in outputs_by_slot(g, rewrite).into_iter().enumerate() {
        let name = if slot == 0 { "out".to_string() } else { format!("out_{slot}") };
        names.insert(value, name.clone());
        function.output.push(name);
    }
    let mut values = 0;
    for value in nodes.iter().flat_map(|n| n.output.iter()).filter(|o| !o.is_empty()) {
        names.entry(value.as_str()).or_insert_with(|| {
            values += 1;
            format!("t{}", values - 1)
        });
    }
    function.node = nodes
        .into_iter()
        .map(|n| {
            let mut n = NodeProto { name: None, doc_string: None, metadata_props: vec![], ..n.clone() };
            n.input
                .iter_mut()
                .chain(n.output.iter_mut())
                .filter(|v| !v.is_empty())
                .for_each(|v| *v = names[v.as_str()].clone());
            n
        })
        .collect();
    let kin = |f: &&&FunctionProto| (f.domain(), f.name()) == (function.domain(), function.name());
    let overload = match earlier.iter().filter(kin).find(|f| same_body(f, &function)) {
        Some(same) => same.overload().to_string(),
        None => {
            let taken = |o: &str| earlier.iter().filter(kin).any(|f| f.overload() == o);
            unused_name(function.overload(), 2, taken)
        }
    };
    function.overload = Some(overload.clone());
    rewrite.replacement.overload = Some(overload);
    rewrite.replacement.input = inputs;
    rewrite.function = Some(function);
    Ok(())
}

/// A tensor value of element type `elem` and no declared shape.
pub fn value_info(name: &str, elem: i32) -> crate::onnx::ValueInfoProto {
    use crate::onnx::proto::type_proto::{Tensor, Value};
    crate::onnx::ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(crate::onnx::TypeProto {
            value: Some(Value::TensorType(Tensor { elem_type: Some(elem), shape: None })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A constant the replacement would read as `CastLike(c, like)` of a value
/// computed at run time (a weight cast like the normalized value, which the
/// match computes) is read as c itself: the CastLike then feeds only the
/// match and goes with it (`absorb_constants`).
fn read_constants_at_their_source(g: &Graph, rewrite: &mut Rewrite) {
    for input in rewrite.replacement.input.iter_mut() {
        let Some(node) = g.producer(input).map(|p| g.node(p)) else { continue };
        let like_computed = node.input.get(1).is_some_and(|like| g.constant(like).is_none());
        if node.is("CastLike") && like_computed {
            if let Some(source) = g.same_constant_as(input) {
                *input = source.to_string();
            }
        }
    }
}

/// Nodes that compute a constant (`Constant`, or a shape-only op of
/// constants: `Graph::constant`) and feed only the match become part of
/// it, and so do the constants they read in turn: once the match is
/// replaced nothing would read them (unless the replacement itself does,
/// e.g. a constant mask of an attention core).
fn absorb_constants(g: &Graph, rewrite: &mut Rewrite) {
    let reads = rewrite.reads();
    let mut todo: Vec<usize> = rewrite.nodes.iter().copied().collect();
    while let Some(n) = todo.pop() {
        for value in &g.node(n).input {
            let Some(p) = g.producer(value) else { continue };
            if !rewrite.nodes.contains(&p)
                && g.constant(value).is_some()
                && g.node(p).subgraphs().next().is_none()
                && !g.is_graph_output(value)
                && !reads.iter().any(|i| i == value)
                && g.consumers(value).iter().all(|c| rewrite.nodes.contains(c))
                && g.node(p).output.iter().all(|o| o == value || o.is_empty())
            {
                rewrite.nodes.insert(p);
                todo.push(p);
            }
        }
    }
}

/// Spec, ground rule 2: no value made inside the match, other than the
/// anchor's output, is read outside it; a value a replacement output takes
/// over may be.
fn check_nothing_escapes(g: &Graph, rewrite: &Rewrite) -> Check<()> {
    let anchor = g.node(rewrite.anchor);
    require!(
        rewrite.nodes.contains(&rewrite.anchor),
        "the replacement reads a value computed from the anchor {}",
        display_name(anchor)
    );
    let by_prelude = |v: &str| rewrite.prelude.iter().any(|n| n.output.iter().any(|o| o == v));
    let taken_over = |v: &str| v == anchor.output[0] || rewrite.takes_over.iter().any(|(_, t)| t == v) || by_prelude(v);
    for (_, value) in &rewrite.takes_over {
        let made_inside = g.producer(value).is_some_and(|p| rewrite.nodes.contains(&p));
        require!(made_inside, "the replacement would take over {value}, which the rewrite does not remove");
    }
    for &n in &rewrite.nodes {
        for value in g.node(n).output.iter().filter(|o| !o.is_empty() && !taken_over(o)) {
            if n == rewrite.anchor {
                require!(unused(g, value), "the anchor {} has more than one used output", display_name(anchor));
            }
            require!(!g.is_graph_output(value), "{value} is also a graph output");
            require!(
                g.consumers(value).iter().all(|c| rewrite.nodes.contains(c)),
                "{value} is also read outside the matched nodes"
            );
        }
    }
    Ok(())
}

/// A reader in a chain a rewrite yields to (`Rewrite::yields_to`): a node
/// of an op, or a `Cast` to one of the element types that continue the
/// pattern (a Cast to another type is no step of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    Op(&'static str),
    CastTo(Vec<i32>),
}

impl Link {
    fn is(&self, node: &NodeProto) -> bool {
        match self {
            Link::Op(op) => node.is(op),
            Link::CastTo(types) => cast_to(node).is_some_and(|to| types.contains(&to)),
        }
    }
}

/// A rewrite that yields to a chain of ops reading its anchor's output (a
/// weight Mul the pass did not prove, or a Cast on the way to one) is not
/// taken in part.
fn check_yields(g: &Graph, rewrite: &Rewrite) -> Check<()> {
    /// The first node of a chain of `links` that reads `value`, each
    /// reading the one before it.
    fn read_by<'g>(g: &'g Graph, value: &str, links: &[Link]) -> Option<&'g NodeProto> {
        let (first, rest) = links.split_first()?;
        g.consumers(value).iter().map(|&c| g.node(c)).find(|c| {
            first.is(c)
                && c.input.iter().any(|i| i == value)
                && (rest.is_empty() || read_by(g, &c.output[0], rest).is_some())
        })
    }
    let out = &g.node(rewrite.anchor).output[0];
    if let Some(reader) = rewrite.yields_to.iter().find_map(|chain| read_by(g, out, chain)) {
        decline!("its output is read by {}, whose pattern did not match", display_name(reader));
    }
    Ok(())
}

/// A replacement reads values the match leaves as they were. Where one is
/// computed from a node the match reached (a step of the chain, scores
/// that do not stay), that node survives and the replacement would compute
/// again what it replaces.
fn check_computed_once(g: &Graph, rewrite: &Rewrite, walked: &BTreeSet<usize>) -> Check<()> {
    // Shape arithmetic that survives, down to `Shape`s of values that
    // survive, computes what it computed from them: no work done twice
    // (MPNet's position bias is expanded by the sizes of the hidden state
    // that layer 0's head split reads too).
    let sizes_of_survivors = |n: usize| {
        shape_arithmetic(g, n)
            && (!reads_only_shape(g, n)
                || values_read_by(g.node(n)).iter().filter_map(|v| g.producer(v)).all(|p| !rewrite.nodes.contains(&p)))
    };
    let survivor = walked.iter().find(|&&n| !rewrite.nodes.contains(&n) && !sizes_of_survivors(n));
    let Some(&n) = survivor else { return Ok(()) };
    let reads = rewrite.reads();
    let read = reads.iter().find(|v| !v.is_empty() && g.computed_from(v, n));
    Err(Miss::Declined(format!(
        "{} is computed from {}, a node of the match the replacement would compute again",
        read.map_or("what the replacement reads", String::as_str),
        display_name(g.node(n))
    )))
}

/// Spec, ground rule 8: a name defined in two scopes (or twice) makes a
/// match unprovable, since runtimes disagree on which value it names.
fn check_unambiguous(g: &Graph, rewrite: &Rewrite, walked: &BTreeSet<usize>) -> Check<()> {
    // A rule's prelude names one computation once: a name written twice
    // is written by nodes that compute the same, as `share_prelude_nodes`
    // finds them (the same op, attributes and inputs, inputs shared first).
    let mut written: HashMap<&str, Vec<u8>> = HashMap::new();
    let mut first: HashMap<Vec<u8>, &[String]> = HashMap::new();
    let mut same: HashMap<&str, &str> = HashMap::new();
    for n in &rewrite.prelude {
        let inputs = n.input.iter().map(|v| same.get(v.as_str()).map_or(v.clone(), |s| s.to_string())).collect();
        let key = computation(&NodeProto { input: inputs, ..n.clone() });
        for out in n.output.iter().filter(|o| !o.is_empty()) {
            let earlier = written.entry(out.as_str()).or_insert_with(|| key.clone());
            require!(*earlier == key, "the replacement's prelude computes {out} two ways");
        }
        match first.get(&key) {
            Some(outputs) => same.extend(n.output.iter().zip(outputs.iter()).map(|(o, f)| (o.as_str(), f.as_str()))),
            None => {
                first.insert(key, &n.output);
            }
        }
    }
    let nodes = walked.iter().map(|&n| g.node(n));
    let reads = rewrite.reads();
    let names = nodes.flat_map(|n| n.input.iter().chain(&n.output)).chain(&reads);
    let added = |v: &str| rewrite.constants.iter().any(|t| t.name() == v);
    for name in names.filter(|v| !v.is_empty() && !added(v)) {
        require!(!g.is_ambiguous(name), "{name} is defined in two scopes or twice (invalid ONNX; runtimes disagree)");
    }
    Ok(())
}

fn unused(g: &Graph, value: &str) -> bool {
    g.consumers(value).is_empty() && !g.is_graph_output(value)
}

/// How provenance lists and reports name a node: `OpType name`, or for an
/// unnamed node `OpType <first output>` (output names are unique in a graph).
pub fn provenance_entry(node: &NodeProto) -> String {
    format!("{} {}", node.op_type(), display_name(node))
}

/// Where a subgraph body is: `main/If_0.then_branch`, with `[i]` for the
/// i-th graph of a graph-list attribute. Reports and `show` use the same.
pub fn body_path(path: &str, holder: &str, attribute: &str, index: usize) -> String {
    let index = if index > 0 { format!("[{index}]") } else { String::new() };
    format!("{path}/{holder}.{attribute}{index}")
}

/// The provenance of a rewrite: the anchor first, then the other nodes in
/// graph order; a node that is itself a replacement stands for its list.
fn provenance(graph: &GraphProto, rewrite: &Rewrite, unexported: &HashSet<String>) -> Vec<String> {
    let order = std::iter::once(rewrite.anchor).chain(rewrite.nodes.iter().copied().filter(|&n| n != rewrite.anchor));
    order
        .flat_map(|n| {
            let node = &graph.node[n];
            match node.metadata(FUSED_KEY) {
                Some(list) => list.split(", ").map(str::to_string).collect(),
                None if unexported.contains(node.name()) => vec![],
                None => vec![provenance_entry(node)],
            }
        })
        .collect()
}

fn apply(graph: &mut GraphProto, mut rewrites: Vec<Rewrite>, pass: &'static str, path: &str, outcome: &mut Outcome) {
    take_dead_kept_nodes(graph, &mut rewrites);
    share_prelude_nodes(graph, &mut rewrites);
    let mut names: HashSet<String> = graph.node.iter().map(|n| n.name().to_string()).collect();
    let mut removed_values = HashSet::new();
    let mut read_by_removed = HashSet::new();
    // At each place: prelude nodes, then a replacement placed before a
    // reader, then one anchored there.
    let mut replacement_at: HashMap<usize, Vec<(u8, NodeProto)>> = HashMap::new();
    let mut removed = HashSet::new();
    for rewrite in rewrites {
        let anchor = &graph.node[rewrite.anchor];
        let replaced = provenance(graph, &rewrite, &outcome.unexported);
        let mut node = rewrite.replacement.clone();
        node.name = Some(unique_name(&mut names, anchor.name(), node.op_type()));
        node.output = vec![anchor.output[0].clone()];
        for (slot, value) in &rewrite.takes_over {
            if node.output.len() <= *slot {
                node.output.resize(slot + 1, String::new());
            }
            node.output[*slot] = value.clone();
        }
        node.metadata_props = anchor.metadata_props.iter().filter(|p| p.key() != FUSED_KEY).cloned().collect();
        node.metadata_props.push(StringStringEntryProto::new(FUSED_KEY, replaced.join(", ")));
        if let Some(op) = rewrite.runs {
            node.metadata_props.push(StringStringEntryProto::new(crate::onnx::RUNS_KEY, op.to_string()));
        }
        outcome.fused.push(Fused {
            pass,
            op_type: rewrite.runs.unwrap_or(node.op_type()).to_string(),
            name: node.name().to_string(),
            graph: path.to_string(),
            replaced,
            guard: rewrite.runs.map(|_| node.op_type().to_string()),
            opset: rewrite.opset,
            note: rewrite.note.clone(),
        });
        for &n in &rewrite.nodes {
            let old = &graph.node[n];
            // A replacement absorbed into this one is no longer in the
            // output, but still counts for the pass that made it.
            if old.metadata(FUSED_KEY).is_some() {
                let at = outcome.fused.iter().position(|f| f.graph == path && f.name == old.name());
                if let Some(fused) = at.map(|i| outcome.fused.remove(i)) {
                    outcome.absorbed.push(Absorbed { fused, into: node.name().to_string(), by: pass });
                }
            }
            let by_prelude = |o: &String| rewrite.prelude.iter().any(|p| p.output.contains(o));
            removed_values.extend(old.output.iter().filter(|o| !node.output.contains(o) && !by_prelude(o)).cloned());
            read_by_removed.extend(old.input.iter().cloned());
        }
        graph.initializer.extend(rewrite.constants);
        removed.extend(rewrite.nodes);
        // The replacement writes its own shape; a Reshape gives the anchor's.
        let view = rewrite.view.map(|view| {
            let mut shape = ints_constant(&view.shape, &view.dims);
            shape.name = Some(unique_name(&mut names, anchor.name(), "Constant"));
            let mut back = self::node("Reshape", &[&view.inner, &view.shape], vec![]);
            back.name = Some(unique_name(&mut names, anchor.name(), "Reshape"));
            back.output = vec![std::mem::replace(&mut node.output[0], view.inner)];
            [shape, back]
        });
        for (mut before, at) in rewrite.prelude.into_iter().zip(rewrite.prelude_at) {
            before.name = Some(unique_name(&mut names, anchor.name(), before.op_type()));
            replacement_at.entry(at).or_default().push((0, before));
        }
        let slot = replacement_at.entry(rewrite.place).or_default();
        let rank = if rewrite.place == rewrite.anchor { 2 } else { 1 };
        slot.extend([(rank, node)].into_iter().chain(view.into_iter().flatten().map(|n| (rank, n))));
        slot.sort_by_key(|(rank, _)| *rank);
    }
    let old = std::mem::take(&mut graph.node);
    let mut kept = Vec::with_capacity(old.len());
    for (i, n) in old.into_iter().enumerate() {
        kept.extend(replacement_at.remove(&i).into_iter().flatten().map(|(_, node)| node));
        if !removed.contains(&i) {
            kept.push(n);
        }
    }
    graph.node = kept;
    // What the removed nodes leave behind: type annotations of values that
    // no longer exist, and initializers nothing reads any more.
    graph.value_info.retain(|vi| !removed_values.contains(vi.name()));
    let still_read = values_read(graph);
    let inputs: HashSet<String> = graph.input.iter().map(|i| i.name().to_string()).collect();
    graph
        .initializer
        .retain(|t| !read_by_removed.contains(t.name()) || still_read.contains(t.name()) || inputs.contains(t.name()));
}

/// Where in the node list the replacement goes: at the anchor, or before
/// an earlier reader of a value it takes over (a sorted list stays
/// sorted), where everything it reads is computed before that.
fn placement(g: &Graph, rewrite: &Rewrite) -> usize {
    let outside = |v: &String| g.consumers(v).iter().copied().filter(|c| !rewrite.nodes.contains(c));
    let first_reader = rewrite.takes_over.iter().flat_map(|(_, v)| outside(v)).min();
    let last_input = rewrite.reads().iter().filter_map(|v| g.producer(v)).max();
    match first_reader {
        Some(r) if r < rewrite.anchor && last_input.is_none_or(|p| p < r) => r,
        _ => rewrite.anchor,
    }
}

/// A node a rewrite left in place for other readers (`Kept::Shared`) that
/// no node reads once the rewrites are applied (the cos table's Unsqueeze
/// that the rotaries of q and k both read) goes too, with the last rewrite
/// that kept it: its provenance names it.
fn take_dead_kept_nodes(graph: &GraphProto, rewrites: &mut [Rewrite]) {
    let removed: HashSet<usize> = rewrites.iter().flat_map(|r| r.nodes.iter().copied()).collect();
    let kept: HashSet<&str> = rewrites
        .iter()
        .flat_map(|r| &r.kept)
        .filter_map(|k| match k {
            Kept::Shared(v) | Kept::BesidesShapes(v) => Some(v.as_str()),
            Kept::ForItsShape(_) => None,
        })
        .collect();
    if kept.is_empty() {
        return;
    }
    // What the graph's outputs and the replacements read stays.
    let mut read: HashSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
    read.extend(rewrites.iter().flat_map(Rewrite::reads));
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, node) in graph.node.iter().enumerate() {
        let captured: Vec<String> = node.subgraphs().flat_map(free_values).collect();
        for v in node.input.iter().map(String::as_str).chain(captured.iter().map(String::as_str)) {
            if let Some(&name) = kept.get(v) {
                readers.entry(name).or_default().push(i);
            }
        }
    }
    let mut last_keeper: HashMap<usize, usize> = HashMap::new();
    for (r, rewrite) in rewrites.iter().enumerate() {
        for kept in &rewrite.kept {
            let Kept::Shared(value) = kept else { continue };
            let Some(p) = graph.node.iter().position(|n| n.output.iter().any(|o| o == value)) else { continue };
            let node = &graph.node[p];
            let dead = !removed.contains(&p)
                && node.output.len() == 1
                && node.subgraphs().next().is_none()
                && crate::ops::DETERMINISTIC.contains(&node.op_type())
                && !read.contains(value.as_str())
                && readers.get(value.as_str()).is_some_and(|rs| rs.iter().all(|r| removed.contains(r)));
            let later = |at: &usize| rewrites[*at].anchor < rewrite.anchor;
            if dead && last_keeper.get(&p).is_none_or(later) {
                last_keeper.insert(p, r);
            }
        }
    }
    // With what only it computed from, as a match takes everything back to
    // what survives (a table's repeat and the Constants of its axes): a
    // node goes once every reader of its outputs has gone.
    let mut producer: HashMap<&str, usize> = HashMap::new();
    let mut readers: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, node) in graph.node.iter().enumerate() {
        producer.extend(node.output.iter().map(|o| (o.as_str(), i)));
        let captured: Vec<String> = node.subgraphs().flat_map(free_values).collect();
        for v in node.input.iter().chain(&captured) {
            readers.entry(v.clone()).or_default().push(i);
        }
    }
    let mut gone: HashSet<usize> = removed.clone();
    gone.extend(last_keeper.keys().copied());
    let mut todo: Vec<(usize, usize)> = last_keeper.into_iter().collect();
    todo.sort_unstable();
    while let Some((p, r)) = todo.pop() {
        rewrites[r].nodes.insert(p);
        for input in &graph.node[p].input {
            let Some(&c) = producer.get(input.as_str()) else { continue };
            let node = &graph.node[c];
            let dead = |o: &String| {
                !read.contains(o.as_str()) && readers.get(o).is_none_or(|rs| rs.iter().all(|i| gone.contains(i)))
            };
            let plain = crate::onnx::is_default_domain(node.domain()) && node.subgraphs().next().is_none();
            if !gone.contains(&c) && plain && node.output.iter().all(dead) {
                gone.insert(c);
                todo.push((c, r));
            }
        }
    }
}

/// What a node computes, as bytes: its op, attributes and inputs (its
/// name and outputs aside). Two prelude nodes of one key are one node.
fn computation(node: &NodeProto) -> Vec<u8> {
    prost::Message::encode_to_vec(&NodeProto { name: None, output: vec![], ..node.clone() })
}

/// Prelude nodes that compute the same (the same op, attributes and
/// inputs, as two rotaries slicing one cos table do) are one node: the
/// first, placed where the earliest of them goes. A node that writes a
/// value the graph already has (a `Shape` outside the match computed
/// anew, `shapes_read_outside`) stays: nodes outside the rewrite read that
/// name.
fn share_prelude_nodes(graph: &GraphProto, rewrites: &mut [Rewrite]) {
    let existing: HashSet<&str> = graph.node.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    // The first node computing each (op, attributes, inputs): its rewrite and place in that prelude.
    let mut first: HashMap<Vec<u8>, (usize, usize)> = HashMap::new();
    let mut renamed: HashMap<String, String> = HashMap::new();
    for r in 0..rewrites.len() {
        let prelude = std::mem::take(&mut rewrites[r].prelude);
        let places = std::mem::take(&mut rewrites[r].prelude_at);
        for (mut node, at) in prelude.into_iter().zip(places) {
            for v in &mut node.input {
                if let Some(to) = renamed.get(v.as_str()) {
                    *v = to.clone();
                }
            }
            let key = computation(&node);
            // Passes write no random op (spec, ground rule 12).
            let shareable =
                node.subgraphs().next().is_none() && !node.output.iter().any(|o| existing.contains(o.as_str()));
            if let Some(&(owner, i)) = first.get(&key).filter(|_| shareable) {
                for (dup, out) in node.output.iter().zip(rewrites[owner].prelude[i].output.clone()) {
                    renamed.insert(dup.clone(), out);
                }
                let place = &mut rewrites[owner].prelude_at[i];
                *place = (*place).min(at);
                continue;
            }
            first.insert(key, (r, rewrites[r].prelude.len()));
            rewrites[r].prelude.push(node);
            rewrites[r].prelude_at.push(at);
        }
        rename_in_node(&mut rewrites[r].replacement, &|v: &mut String| {
            if let Some(to) = renamed.get(v.as_str()) {
                *v = to.clone();
            }
        });
    }
}

/// Where each prelude node goes: before the replacement, or before the
/// first node outside the match (or later prelude node) reading what it
/// computes, whichever comes first.
fn prelude_placement(g: &Graph, rewrite: &Rewrite) -> Vec<usize> {
    let mut at = vec![rewrite.place; rewrite.prelude.len()];
    for i in (0..rewrite.prelude.len()).rev() {
        for out in &rewrite.prelude[i].output {
            let outside = g.consumers(out).iter().copied().filter(|c| !rewrite.nodes.contains(c));
            let later =
                (i + 1..rewrite.prelude.len()).filter(|&j| rewrite.prelude[j].input.contains(out)).map(|j| at[j]);
            at[i] = outside.chain(later).fold(at[i], usize::min);
        }
    }
    at
}

/// Every value something in the graph reads: node inputs, subgraph bodies'
/// captures, graph outputs.
fn values_read(graph: &GraphProto) -> HashSet<String> {
    let mut read: HashSet<String> = graph.output.iter().map(|o| o.name().to_string()).collect();
    for node in &graph.node {
        read.extend(node.input.iter().cloned());
        for body in node.subgraphs() {
            read.extend(free_values(body));
        }
    }
    read
}

/// `scope/OpType` after the anchor's name scope (`/model/layers.0/norm/`),
/// with a numeric suffix when taken; just `OpType` for an unscoped anchor.
fn unique_name(names: &mut HashSet<String>, anchor: &str, op_type: &str) -> String {
    let scope = anchor.rfind('/').map_or("", |i| &anchor[..=i]);
    let name = unused_name(&format!("{scope}{op_type}"), 1, |n| names.contains(n));
    names.insert(name.clone());
    name
}

/// `base`, or `base_{first}`, `base_{first + 1}`, … : the first that
/// `taken` does not claim. The one search for a new name.
pub fn unused_name(base: &str, first: usize, taken: impl Fn(&str) -> bool) -> String {
    std::iter::once(base.to_string())
        .chain((first..).map(|i| format!("{base}_{i}")))
        .find(|n| !taken(n))
        .expect("an unused suffix exists")
}
