//! `--opset N`: the model's default domain upgraded to version N, every
//! node in its version-N form, computing the same function.
//!
//! A node whose op did not change between the two versions (or changed
//! only in ways that keep its meaning: `changes.rs`) keeps its bytes; a
//! node crossing a change gets its adapter (attributes that became inputs
//! are written as `Constant`s before it). Where a node has no exact
//! adapter the whole upgrade is refused, naming the node: a model is
//! never upgraded in part. Subgraph bodies and model-local functions are
//! upgraded with the graph. Never downgrades.

mod changes;
pub mod history;

use std::collections::HashSet;

use crate::graph::{Graph, Scope};
use crate::onnx::{
    display_name, AttributeProto, AttributeType, FunctionProto, GraphProto, ModelProto, NodeProto, TensorProto,
    ValueInfoProto,
};
use crate::rewrite::Bodies;

pub use history::MAX_OPSET;

/// The oldest opset an upgrade starts from: the changes before 7 (legacy
/// broadcasting, `is_test`, `consumed_inputs`) are not reviewed.
pub const MIN_FROM: i64 = 7;

/// What an upgrade did (reported).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Upgrade {
    pub from: i64,
    pub to: i64,
    /// Every node whose bytes changed (nodes added for it aside).
    pub adapted: Vec<Adapted>,
    /// Nodes the adapters added (the constants that became inputs, and the
    /// Flatten/Shape/Reshape of a softmax over a flattened input).
    pub added_nodes: usize,
    /// The names of those nodes: the export never had them, so no fused
    /// node's provenance names them (`rewrite::run_upgraded`).
    #[serde(skip)]
    pub added: HashSet<String>,
}

/// One adapted node.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Adapted {
    pub op_type: String,
    pub node: String,
    /// `main`, a subgraph body's path, or `function DOMAIN.NAME`.
    pub graph: String,
    pub from_version: i64,
    pub to_version: i64,
    /// What each adapter did, oldest change first.
    pub changes: Vec<String>,
}

/// The version of `op`'s definition a model at `opset` uses, if ONNX
/// defines the op there.
pub fn defined(op: &str, opset: i64) -> Option<i64> {
    let (_, versions) = history::VERSIONS.iter().find(|(name, _)| *name == op)?;
    versions.iter().copied().take_while(|&v| v <= opset).last()
}

/// ONNX Runtime's own operators in the default domain, which it runs at
/// every opset: left as they are. (Its `LayerNormalization` below opset 17
/// is the kernel ONNX's LayerNormalization-17 runs on, same attributes and
/// outputs.)
const RUNTIME_OPS: &[&str] = &["SimplifiedLayerNormalization", "LayerNormalization"];

/// The IR version of the ONNX release that introduced each opset (onnx's
/// `helper.VERSION_TABLE`): an upgraded model is raised to it, never lowered.
fn ir_version_for(opset: i64) -> i64 {
    match opset {
        ..=8 => 3,
        9 => 4,
        10 => 5,
        11 => 6,
        12..=14 => 7,
        15..=18 => 8,
        19 | 20 => 9,
        21 | 22 => 10,
        23 => 11,
        24 => 12,
        _ => 13,
    }
}

/// Why a model was not upgraded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// How the tool was asked: a downgrade, or an opset past `MAX_OPSET`.
    Asked(String),
    /// The model: a node without an exact adapter (the first, and how many more).
    Model(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Asked(why) | Refused::Model(why) => f.write_str(why),
        }
    }
}

/// `model` upgraded to opset `to`, and what was done; or why it cannot be.
pub fn upgrade(model: &ModelProto, to: i64) -> Result<(ModelProto, Upgrade), Refused> {
    let from = model.default_opset();
    if to > MAX_OPSET {
        return Err(Refused::Asked(format!(
            "opset {to} is beyond the newest the pinned ONNX Runtime runs ({MAX_OPSET})"
        )));
    }
    if to < from {
        return Err(Refused::Asked(format!(
            "the model imports opset {from}, newer than {to}: onnx-fuse never downgrades"
        )));
    }
    let mut upgrade = Upgrade { from, to, adapted: vec![], added_nodes: 0, added: HashSet::new() };
    let mut model = model.clone();
    if to == from {
        return Ok((model, upgrade));
    }
    if from < MIN_FROM {
        return Err(Refused::Model(format!("the model imports opset {from}; upgrades start from opset {MIN_FROM}")));
    }
    let mut run = Run { to, names: all_names(&model), refused: vec![], upgrade: &mut upgrade };
    if let Some(graph) = model.graph.as_mut() {
        run.graph(graph, from, &Scope::default(), "main");
    }
    for function in &mut model.functions {
        run.function(function);
    }
    if let Some(first) = run.refused.first() {
        let more = match run.refused.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more node{})", if n == 1 { "" } else { "s" }),
        };
        return Err(Refused::Model(format!("cannot upgrade to opset {to}: {first}{more}")));
    }
    for import in model.opset_import.iter_mut().filter(|o| crate::onnx::is_default_domain(o.domain())) {
        import.version = Some(to);
    }
    model.ir_version = Some(model.ir_version().max(ir_version_for(to)));
    Ok((model, upgrade))
}

struct Run<'u> {
    to: i64,
    /// Every name the model uses: new values are named apart from them.
    names: HashSet<String>,
    refused: Vec<String>,
    upgrade: &'u mut Upgrade,
}

impl Run<'_> {
    /// Upgrades `graph` (at opset `from`) and its bodies.
    fn graph(&mut self, graph: &mut GraphProto, from: i64, outer: &Scope, path: &str) {
        let view = Graph::new(graph, from, outer);
        let rewritten: Vec<Option<Rewritten>> =
            graph.node.iter().map(|node| self.node(&view, node, from, path)).collect();
        let bodies = Bodies::of(&view);
        drop(view);
        bodies.walk(graph, path, |body, scope, body_path| self.graph(body, from, scope, body_path));
        if rewritten.iter().all(Option::is_none) {
            return;
        }
        for (before, _, after) in rewritten.iter().flatten() {
            self.upgrade.added_nodes += before.len() + after.len();
            self.upgrade.added.extend(before.iter().chain(after).map(|n| n.name().to_string()));
        }
        crate::rewrite::replace_in_place(graph, rewritten);
    }

    /// Upgrades a model-local function's body from the opset it imports.
    fn function(&mut self, function: &mut FunctionProto) {
        let Some(from) =
            function.opset_import.iter().find(|o| crate::onnx::is_default_domain(o.domain())).map(|o| o.version())
        else {
            return;
        };
        let path = format!("function {}.{}", function.domain(), function.name());
        if from > self.to {
            self.refused.push(format!("{path} imports opset {from}, newer than {}", self.to));
            return;
        }
        if from < MIN_FROM {
            self.refused.push(format!("{path} imports opset {from}; upgrades start from opset {MIN_FROM}"));
            return;
        }
        let value = |name: &String| ValueInfoProto { name: Some(name.clone()), ..Default::default() };
        let mut body = GraphProto {
            node: std::mem::take(&mut function.node),
            input: function.input.iter().map(value).collect(),
            output: function.output.iter().map(value).collect(),
            ..Default::default()
        };
        self.graph(&mut body, from, &Scope::default(), &path);
        function.node = body.node;
        for import in function.opset_import.iter_mut().filter(|o| crate::onnx::is_default_domain(o.domain())) {
            import.version = Some(self.to);
        }
    }

    /// The node's version-`to` form where it differs (None: its bytes stay).
    fn node(&mut self, g: &Graph, node: &NodeProto, from: i64, path: &str) -> Option<Rewritten> {
        if !crate::onnx::is_default_domain(node.domain()) {
            return None;
        }
        let op = node.op_type();
        let name = display_name(node);
        let Some(old) = defined(op, from) else {
            if !RUNTIME_OPS.contains(&op) {
                self.refused.push(format!("{op} {name} ({path}) is no ONNX operator at opset {from}"));
            }
            return None;
        };
        let new = defined(op, self.to).unwrap_or(old);
        let crossed: Vec<i64> = history_of(op).iter().copied().filter(|&v| v > old && v <= new).collect();
        let mut site = Site { node: node.clone(), before: vec![], after: vec![], g, names: &mut self.names };
        let mut notes = Vec::new();
        // An attribute a function body takes from its caller is not known
        // here: no adapter or check can read it.
        let referenced = node.attribute.iter().find(|a| !a.ref_attr_name().is_empty());
        if let (Some(a), true) = (referenced, crossed.iter().any(|&v| changes::change(op, v).is_some())) {
            let why = format!("its attribute {} is the function's attribute {}", a.name(), a.ref_attr_name());
            self.refused.push(format!("{op} {name} ({path}), version {old} to {new}: {why}"));
            return None;
        }
        // Adapters read the positions an op requires: a node outside its
        // arity has no version-`to` form to write.
        let changes = crossed.iter().any(|&v| changes::change(op, v).is_some());
        if let Some(why) = crate::ops::malformed(node, from).filter(|_| changes) {
            self.refused.push(format!("{op} {name} ({path}), version {old} to {new}: malformed ({why})"));
            return None;
        }
        for version in crossed {
            let outcome = match changes::change(op, version) {
                None => Ok(None),
                Some(changes::Change::Check(check)) => check(&site).map(|()| None),
                Some(changes::Change::Adapt(adapt)) => adapt(&mut site).map(Some),
                Some(changes::Change::Refused(why)) => Err(why.to_string()),
            };
            match outcome {
                Ok(note) => notes.extend(note),
                Err(why) => {
                    self.refused.push(format!("{op} {name} ({path}), version {old} to {version}: {why}"));
                    return None;
                }
            }
        }
        if site.node == *node && site.before.is_empty() && site.after.is_empty() {
            return None;
        }
        self.upgrade.adapted.push(Adapted {
            op_type: op.to_string(),
            node: name,
            graph: path.to_string(),
            from_version: old,
            to_version: defined(site.node.op_type(), self.to).unwrap_or(new),
            changes: notes,
        });
        Some((site.before, site.node, site.after))
    }
}

/// A node's new form: the nodes before it, the node, the nodes after it.
type Rewritten = (Vec<NodeProto>, NodeProto, Vec<NodeProto>);

fn history_of(op: &str) -> &'static [i64] {
    history::VERSIONS.iter().find(|(name, _)| *name == op).map_or(&[], |(_, v)| v)
}

/// A node being adapted: its new form, the nodes to insert before and
/// after it, and what the graph knows about its inputs (at the old opset).
pub struct Site<'g, 'a> {
    pub node: NodeProto,
    pub before: Vec<NodeProto>,
    pub after: Vec<NodeProto>,
    g: &'g Graph<'a>,
    names: &'g mut HashSet<String>,
}

impl Site<'_, '_> {
    /// Removes an attribute and returns it, if it has the type `kind`
    /// (an attribute of another type is a node its version does not
    /// define: refused).
    fn take(&mut self, name: &str, kind: AttributeType) -> Result<Option<AttributeProto>, String> {
        let Some(i) = self.node.attribute.iter().position(|a| a.name() == name) else { return Ok(None) };
        let a = &self.node.attribute[i];
        if a.r#type.is_some_and(|t| t != kind as i32) {
            return Err(format!("its attribute {name} is not of type {}", kind.as_str_name()));
        }
        Ok(Some(self.node.attribute.remove(i)))
    }

    pub fn take_ints(&mut self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self.take(name, AttributeType::Ints)?.map(|a| a.ints))
    }

    pub fn take_int(&mut self, name: &str) -> Result<Option<i64>, String> {
        Ok(self.take(name, AttributeType::Int)?.map(|a| a.i()))
    }

    pub fn take_float(&mut self, name: &str) -> Result<Option<f32>, String> {
        Ok(self.take(name, AttributeType::Float)?.map(|a| a.f()))
    }

    pub fn string_attr(&self, name: &str) -> Option<String> {
        self.node.attr(name).map(|a| String::from_utf8_lossy(a.s()).to_string())
    }

    /// A constant written by a `Constant` node before the node, read as its input `slot`.
    pub fn set_input(&mut self, slot: usize, value: TensorProto, what: &str) {
        let base = self.node.output.first().cloned().unwrap_or_default();
        let name = self.fresh(&base, what);
        let mut constant = crate::rewrite::node("Constant", &[], vec![AttributeProto::tensor("value", value)]);
        constant.output = vec![name.clone()];
        constant.name = Some(name.clone());
        self.before.push(constant);
        if self.node.input.len() <= slot {
            self.node.input.resize(slot + 1, String::new());
        }
        self.node.input[slot] = name;
    }

    /// A name no value of the model has: `BASE_WHAT`, or with a suffix.
    pub fn fresh(&mut self, base: &str, what: &str) -> String {
        let name = crate::rewrite::unused_name(&format!("{base}_{what}"), 1, |n| self.names.contains(n));
        self.names.insert(name.clone());
        name
    }

    /// The element type of the node's input `slot`, as the graph knows it.
    pub fn elem_type(&self, slot: usize) -> Option<i32> {
        self.node.input.get(slot).and_then(|v| self.g.elem_type(v))
    }

    /// The proved rank of the node's input `slot`.
    pub fn rank(&self, slot: usize) -> Option<usize> {
        self.node.input.get(slot).and_then(|v| self.g.shapes().rank(v))
    }
}

/// Every name a model's graphs and functions use, at any depth.
fn all_names(model: &ModelProto) -> HashSet<String> {
    fn nodes(list: &[NodeProto], names: &mut HashSet<String>) {
        for n in list {
            names.extend(n.input.iter().chain(&n.output).filter(|v| !v.is_empty()).cloned());
            names.extend(n.name.clone());
            n.subgraphs().for_each(|b| graph(b, names));
        }
    }
    fn graph(g: &GraphProto, names: &mut HashSet<String>) {
        let infos = g.input.iter().chain(&g.output).chain(&g.value_info);
        names.extend(infos.map(|v| v.name().to_string()));
        names.extend(g.initializer.iter().map(|t| t.name().to_string()));
        names.extend(g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()).map(|t| t.name().to_string()));
        nodes(&g.node, names);
    }
    let mut names = HashSet::new();
    model.graph.iter().for_each(|g| graph(g, &mut names));
    for f in &model.functions {
        names.extend(f.input.iter().chain(&f.output).cloned());
        nodes(&f.node, &mut names);
    }
    names
}
