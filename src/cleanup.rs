//! The exact cleanup that runs after the passes (docs/cleanup.md): what the
//! shapes prove the same on every run becomes a constant, a value computed
//! twice from the same inputs is computed once (spec, ground rule 12), and
//! nodes nothing reads go. Exports compute their Reshape targets from
//! `Shape` nodes at run time, once per layer; ONNX Runtime pays a fixed cost
//! per node, so a decode step of a small decoder spends much of its time on
//! them.
//!
//! Each step is exact by construction:
//!
//! - **Constants.** A value `graph::fold` computes from constants and proved
//!   dims (a `Shape` slice of axes that are numbers, the arithmetic over it)
//!   becomes a `Constant` under the same name; a symbolic axis never does.
//! - **Reshape targets.** A target whose every element the shapes prove is
//!   written as a constant: a number where the element is one, `0` where it
//!   is the Reshape input's own axis at that position (`allowzero` 0: "copy
//!   that axis", which is that axis whether or not it is 0), and `-1` for at
//!   most one element left, where the others are numbers or copies of axes
//!   proved at least 1 and no `-1` is there already.
//! - **Twins.** Of two nodes with the same domain, op, attributes and inputs
//!   (default domain, not random, no body) the first in dependency order
//!   stays and readers of the second read the first (a body that reads it
//!   too, at any depth); not where the second's value is a graph output.
//!   So too an integer shape value (rank 0 or 1) the shapes prove equal,
//!   element by element, to an earlier one: every layer's `Shape(x)[0]` is
//!   the batch.
//! - **Unread nodes** of the default domain go, as do the `Constant`s the
//!   steps above leave unread.
//!
//! Never touched: fused nodes (`transmuter.fused`: counts and provenance
//! keep their meaning), nodes with bodies, nodes of other domains (their
//! effects are not ours to know), graph outputs (their producers stay),
//! names defined twice, malformed nodes. Bodies are cleaned where they are
//! an `If`'s branches outside a fused node; `Loop` and `Scan` bodies, whose
//! values change from one iteration to the next, are left as they are.
//!
//! A model's `If` condition computed from constants and proved shapes alone,
//! and every value it is computed from, stays computed at run time: made a
//! constant, ONNX Runtime inlines the branch it selects at load and infers
//! its shapes anew, and a branch that breaks the spec where the condition
//! hid it (ONNX's own AffineGrid function feeds `Range` 1-element tensors)
//! would then not load, where the original does.
//!
//! Like the passes' proofs, a constant may rest on an equality every run
//! of the model needs (`shapes::required_equalities`): the output computes
//! the same wherever the original runs.

use std::collections::{HashMap, HashSet};

use crate::graph::shapes::{Dim, Shapes};
use crate::graph::{fold, Graph, Scope};
use crate::onnx::{display_name, AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, FUSED_KEY, RUNS_KEY};
use crate::rewrite::unused_name;

/// Ops whose two calls on the same inputs may differ (spec, ground rule
/// 12); `Dropout` in training mode among them.
const RANDOM: &[&str] =
    &["RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"];

/// How many rounds a graph and its bodies are cleaned again (each round
/// finds only what the last one made possible).
const MAX_ROUNDS: usize = 16;

/// What the cleanup did, over every graph (`--report`, `--report-json`'s
/// `cleanup`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Cleanup {
    /// Nodes of the fused model the cleanup removed.
    pub removed: usize,
    /// `Constant` nodes it wrote (values proved the same on every run,
    /// Reshape targets) that are in the output.
    pub added: usize,
    /// Reshape targets computed at run time that are now a constant.
    pub reshape_targets: usize,
    /// Every node removed, in the order removed.
    pub nodes: Vec<Removed>,
}

/// A node the cleanup removed, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    pub op_type: String,
    pub name: String,
    /// `main`, or the path of an `If` branch (as `fused` entries name it).
    pub graph: String,
    /// `constant` (its value is the same on every run: a `Constant` holds
    /// it now), `twin` (an earlier node with the same op, attributes and
    /// inputs computes it), `equal` (a shape value the shapes prove equal,
    /// element by element, to an earlier one, which its readers read now)
    /// or `unread` (nothing reads its value).
    pub why: &'static str,
}

impl Cleanup {
    /// Nodes removed per op type, most first (the text report's line).
    pub fn by_op(&self) -> Vec<(String, usize)> {
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in &self.nodes {
            *counts.entry(r.op_type.as_str()).or_default() += 1;
        }
        let mut by_op: Vec<(String, usize)> = counts.into_iter().map(|(op, n)| (op.to_string(), n)).collect();
        by_op.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        by_op
    }

    /// Removed nodes per reason.
    pub fn count(&self, why: &str) -> usize {
        self.nodes.iter().filter(|r| r.why == why).count()
    }

    /// This cleanup after `before` (`prune`'s), as one.
    pub fn after(mut self, before: Cleanup) -> Cleanup {
        self.removed += before.removed;
        self.nodes.splice(0..0, before.nodes);
        self
    }
}

/// Cleans the model's graph and its `If` branches, each to a fixed point.
pub fn clean(model: &mut ModelProto) -> Cleanup {
    let opset = model.default_opset();
    let mut run = Run { opset, cleanup: Cleanup::default(), added: HashSet::new() };
    if let Some(graph) = model.graph.as_mut() {
        run.graph(graph, &Scope::default(), "main");
    }
    run.cleanup.added = run.added.len();
    run.cleanup.removed = run.cleanup.nodes.len();
    run.cleanup
}

/// Removes, before the passes, the default-domain nodes nothing reads
/// (nor a body, nor a graph output) in the main graph: a reader no run
/// executes holds back no fusion (an unread Identity of a scaled q kept
/// BART's cores from the kernel). What it removed is reported with the
/// cleanup's `unread` nodes.
pub fn prune(model: &mut ModelProto) -> Cleanup {
    let mut run = Run { opset: model.default_opset(), cleanup: Cleanup::default(), added: HashSet::new() };
    if let Some(graph) = model.graph.as_mut() {
        run.remove_unread(graph, "main");
    }
    run.cleanup.removed = run.cleanup.nodes.len();
    run.cleanup
}

struct Run {
    opset: i64,
    cleanup: Cleanup,
    /// Names of the Constant nodes the cleanup wrote (with their graph's
    /// path), so that one it removes again is not counted as removed.
    added: HashSet<(String, String)>,
}

/// What one round found in a view of a graph.
#[derive(Default)]
struct Plan {
    /// Nodes whose one output becomes a constant.
    constants: Vec<(usize, TensorProto)>,
    /// Reshapes whose target becomes a constant, under a new name.
    targets: Vec<(usize, String, TensorProto)>,
    /// Twins and values proved equal: the node that goes, the outputs its
    /// readers read instead, and why.
    twins: Vec<(usize, Vec<(String, String)>, &'static str)>,
}

impl Run {
    fn graph(&mut self, graph: &mut GraphProto, outer: &Scope, path: &str) {
        for _ in 0..MAX_ROUNDS {
            let mut changed = self.own_nodes(graph, outer, path);
            let bodies = {
                let g = Graph::new(graph, self.opset, outer);
                crate::rewrite::Bodies::of(&g).of_nodes(graph, |n| {
                    n.is("If") && n.metadata(FUSED_KEY).is_none() && n.metadata(RUNS_KEY).is_none()
                })
            };
            let before = self.cleanup.nodes.len() + self.added.len();
            bodies.walk(graph, path, |body, scope, body_path| self.graph(body, scope, body_path));
            changed |= self.cleanup.nodes.len() + self.added.len() != before;
            if !changed {
                break;
            }
        }
    }

    /// Cleans the graph's own nodes to a fixed point; true when anything changed.
    fn own_nodes(&mut self, graph: &mut GraphProto, outer: &Scope, path: &str) -> bool {
        let mut any = false;
        for _ in 0..MAX_ROUNDS {
            let plan = {
                let g = Graph::new(graph, self.opset, outer);
                // Where no run succeeds, what the shapes prove holds
                // vacuously, and written as constants it can contradict
                // itself where ONNX's own inference reads it (a Reshape
                // proves an axis 7, a broadcast 2): only what needs no
                // shapes is done.
                let vacuous = g.shapes().vacuous();
                let conditions = read_by_conditions(&g);
                let mut plan = Plan::default();
                if !vacuous {
                    plan.constants = constants(&g, &conditions);
                    // A Reshape whose output is itself a constant needs no target.
                    let folded: HashSet<usize> = plan.constants.iter().map(|(i, _)| *i).collect();
                    plan.targets = reshape_targets(&g).into_iter().filter(|(i, ..)| !folded.contains(i)).collect();
                }
                if plan.constants.is_empty() && plan.targets.is_empty() {
                    plan.twins = twins(&g, !vacuous, &conditions);
                }
                plan
            };
            let changed = self.apply(graph, plan, path) | self.remove_unread(graph, path);
            if !changed {
                break;
            }
            any = true;
        }
        any
    }

    fn apply(&mut self, graph: &mut GraphProto, plan: Plan, path: &str) -> bool {
        let changed = !(plan.constants.is_empty() && plan.targets.is_empty() && plan.twins.is_empty());
        let mut taken: HashSet<String> = names_in(graph);
        for (i, t) in plan.constants {
            let old = &graph.node[i];
            self.removed(old, path, "constant");
            let name = unused_name(&format!("{}/Constant", display_name(old)), 1, |n| taken.contains(n));
            taken.insert(name.clone());
            let value = old.output[0].clone();
            self.added.insert((path.to_string(), name.clone()));
            graph.node[i] = constant_node(&name, &value, t);
        }
        // The targets' Constants go just before their Reshapes.
        let mut before: HashMap<usize, NodeProto> = HashMap::new();
        for (i, value, t) in plan.targets {
            let reshape = &graph.node[i];
            let name = unused_name(&format!("{}/Constant", display_name(reshape)), 1, |n| taken.contains(n));
            taken.insert(name.clone());
            self.added.insert((path.to_string(), name.clone()));
            self.cleanup.reshape_targets += 1;
            graph.node[i].input[1] = value.clone();
            before.insert(i, constant_node(&name, &value, t));
        }
        let mut gone: HashSet<usize> = HashSet::new();
        let mut renamed: HashMap<String, String> = HashMap::new();
        for (i, outputs, why) in plan.twins {
            self.removed(&graph.node[i], path, why);
            gone.insert(i);
            renamed.extend(outputs);
        }
        if !before.is_empty() || !gone.is_empty() {
            let old = std::mem::take(&mut graph.node);
            for (i, mut node) in old.into_iter().enumerate() {
                if gone.contains(&i) {
                    continue;
                }
                if let Some(c) = before.remove(&i) {
                    graph.node.push(c);
                }
                read_instead(&mut node, &renamed);
                graph.node.push(node);
            }
            let gone_values: HashSet<&String> = renamed.keys().collect();
            graph.value_info.retain(|vi| !gone_values.contains(&vi.name().to_string()));
        }
        changed
    }

    /// Removes default-domain nodes no node, body or graph output reads,
    /// until none is left; true when any went.
    fn remove_unread(&mut self, graph: &mut GraphProto, path: &str) -> bool {
        let mut read: HashMap<String, usize> = HashMap::new();
        for o in &graph.output {
            *read.entry(o.name().to_string()).or_default() += 1;
        }
        for node in &graph.node {
            for v in crate::graph::values_read_by(node) {
                *read.entry(v).or_default() += 1;
            }
        }
        let removable = |node: &NodeProto, read: &HashMap<String, usize>| {
            crate::onnx::is_default_domain(node.domain())
                && node.metadata(FUSED_KEY).is_none()
                && node.metadata(RUNS_KEY).is_none()
                && node.subgraphs().next().is_none()
                && node.output.iter().any(|o| !o.is_empty())
                && node.output.iter().all(|o| o.is_empty() || read.get(o).is_none_or(|&n| n == 0))
        };
        let mut gone = vec![false; graph.node.len()];
        let mut any = false;
        loop {
            let mut more = false;
            for i in (0..graph.node.len()).rev() {
                if gone[i] || !removable(&graph.node[i], &read) {
                    continue;
                }
                gone[i] = true;
                more = true;
                for v in crate::graph::values_read_by(&graph.node[i]) {
                    if let Some(n) = read.get_mut(&v) {
                        *n -= 1;
                    }
                }
            }
            if !more {
                break;
            }
            any = true;
        }
        if !any {
            return false;
        }
        let old = std::mem::take(&mut graph.node);
        let mut values: HashSet<String> = HashSet::new();
        for (node, gone) in old.into_iter().zip(gone) {
            if !gone {
                graph.node.push(node);
                continue;
            }
            values.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
            // A Constant this cleanup wrote and no longer needs was never the model's.
            if !self.added.remove(&(path.to_string(), node.name().to_string())) || !node.is("Constant") {
                self.removed(&node, path, "unread");
            }
        }
        graph.value_info.retain(|vi| !values.contains(vi.name()));
        true
    }

    fn removed(&mut self, node: &NodeProto, path: &str, why: &'static str) {
        let op_type = if crate::onnx::is_default_domain(node.domain()) {
            node.op_type().to_string()
        } else {
            format!("{}.{}", node.domain(), node.op_type())
        };
        self.cleanup.nodes.push(Removed { op_type, name: display_name(node), graph: path.to_string(), why });
    }
}

/// Whether the cleanup may rewrite node `i` of the view at all.
fn ours(g: &Graph, i: usize) -> bool {
    let node = g.node(i);
    crate::onnx::is_default_domain(node.domain())
        && g.malformed(i).is_none()
        && node.subgraphs().next().is_none()
        && node.metadata(FUSED_KEY).is_none()
        && node.metadata(RUNS_KEY).is_none()
        && !node.output.iter().any(|o| g.is_ambiguous(o))
}

/// Nodes whose one value is the same on every run, with that value: what
/// `fold` computes exactly, in the type and shape the shapes prove for it.
fn constants(g: &Graph, conditions: &HashSet<String>) -> Vec<(usize, TensorProto)> {
    let shapes = g.shapes();
    let mut found = vec![];
    for &i in g.order() {
        let node = g.node(i);
        let [value] = node.output.as_slice() else { continue };
        // A copy computes nothing: as a Constant it would only copy a
        // weight's bytes, and only where they are inside the model (a
        // model's output would depend on where its weights are stored).
        let copy = g.identity_input(i).is_some();
        let condition = conditions.contains(value);
        if !ours(g, i) || node.is("Constant") || copy || value.is_empty() || g.is_graph_output(value) || condition {
            continue;
        }
        let Some(folded) = fold::fold(g, &Scalars(&shapes), value).filter(|f| f.exact) else { continue };
        let proved: Option<Vec<i64>> = shapes.shape(value).and_then(|s| s.iter().map(Dim::value).collect());
        let typed = g.elem_type(value).is_none_or(|t| t == folded.elem);
        if proved.as_ref() != Some(&folded.dims) || !typed {
            continue;
        }
        if let Some(t) = folded.to_tensor() {
            found.push((i, t));
        }
    }
    found
}

/// The shapes as `fold` asks them, scalars computed from shapes included.
struct Scalars<'s, 'g, 'a>(&'s Shapes<'g, 'a>);

impl fold::ShapeFacts for Scalars<'_, '_, '_> {
    fn shape(&self, value: &str) -> Option<Vec<Dim>> {
        self.0.shape(value)
    }

    fn shape_tensor(&self, value: &str) -> Option<Vec<Option<Dim>>> {
        self.0.shape_elements(value)
    }
}

/// Reshapes whose target, computed at run time, is proved element by
/// element: the target as a constant (module doc).
fn reshape_targets(g: &Graph) -> Vec<(usize, String, TensorProto)> {
    let shapes = g.shapes();
    let mut found = vec![];
    // A new name no graph around or inside defines (it would shadow).
    let inside = names_in(g.proto);
    let mut taken: HashSet<String> = HashSet::new();
    for &i in g.order() {
        let node = g.node(i);
        if !ours(g, i) || !node.is("Reshape") || g.opset < 5 {
            continue;
        }
        let (Some(x), Some(target)) = (node.input.first(), node.input.get(1)) else { continue };
        if g.constant(target).is_some() || g.is_ambiguous(target) {
            continue;
        }
        let Some(elements) = shapes.shape_tensor(target).and_then(|e| e.into_iter().collect::<Option<Vec<Dim>>>())
        else {
            continue;
        };
        let allowzero = node.attr_int("allowzero").unwrap_or(0) != 0;
        let input = shapes.shape(x);
        let copies = |k: usize, d: &Dim| {
            !allowzero && input.as_ref().and_then(|s| s.get(k)).is_some_and(|a| shapes.same_dim(a, d))
        };
        // Each element: a number, a copy of the input's axis, or the one hole.
        let mut written: Vec<Option<i64>> = vec![];
        for (k, d) in elements.iter().enumerate() {
            written.push(d.value().or_else(|| copies(k, d).then_some(0)));
        }
        let holes: Vec<usize> = (0..written.len()).filter(|&k| written[k].is_none()).collect();
        match holes.as_slice() {
            [] => {}
            [hole] => {
                // -1 is the one element left where the others are never 0.
                let others_positive = (0..written.len()).filter(|k| k != hole).all(|k| match written[k] {
                    Some(0) => input.as_ref().is_some_and(|s| shapes.at_least(&s[k]) >= 1),
                    Some(n) => n >= 1,
                    None => false,
                });
                if !others_positive {
                    continue;
                }
                written[*hole] = Some(-1);
            }
            _ => continue,
        }
        let values: Vec<i64> = written.into_iter().map(|v| v.expect("every element written")).collect();
        // A known 0 read as "copy" where allowzero is 0 is written as it was.
        let t = TensorProto {
            data_type: Some(crate::onnx::INT64),
            dims: vec![values.len() as i64],
            raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()),
            ..Default::default()
        };
        let base = format!("{}/shape", node.output.first().map_or("", String::as_str));
        let name = unused_name(&base, 1, |n| g.is_name_taken(n) || inside.contains(n) || taken.contains(n));
        taken.insert(name.clone());
        found.push((i, name, t));
    }
    found
}

/// Twins (spec, ground rule 12), found in dependency order with the
/// readers of earlier twins already reading their first: the node that
/// goes and, per output, the value its readers read instead; with the
/// shapes, values proved equal too.
fn twins(
    g: &Graph,
    with_shapes: bool,
    conditions: &HashSet<String>,
) -> Vec<(usize, Vec<(String, String)>, &'static str)> {
    let shapes = g.shapes();
    // Per computation, the values its first node's readers read (its own
    // outputs, or the earlier value it proved equal to).
    let mut first: HashMap<Vec<u8>, Vec<String>> = HashMap::new();
    let mut equal: HashMap<(i32, Vec<i64>, Vec<Dim>), String> = HashMap::new();
    let mut renamed: HashMap<String, String> = HashMap::new();
    let mut found = vec![];
    for &i in g.order() {
        let node = g.node(i);
        if !ours(g, i) || RANDOM.contains(&node.op_type()) || node.output.iter().all(|o| o.is_empty()) {
            continue;
        }
        let inputs: Vec<String> =
            node.input.iter().map(|v| renamed.get(v).cloned().unwrap_or_else(|| v.clone())).collect();
        // Its values must be free to take another name: a graph output's
        // is not. A body that reads one reads the kept value instead
        // (`apply`; a name a body defines again is no node's here: `ours`).
        let escapes = node.output.iter().any(|o| !o.is_empty() && g.is_graph_output(o));
        let key = computation(node, inputs);
        if let Some(kept) = first.get(&key) {
            if escapes {
                continue;
            }
            let outputs: Vec<(String, String)> = node
                .output
                .iter()
                .zip(kept)
                .filter(|(o, _)| !o.is_empty())
                .map(|(o, k)| (o.clone(), k.clone()))
                .collect();
            renamed.extend(outputs.iter().cloned());
            found.push((i, outputs, "twin"));
            continue;
        }
        first.insert(key.clone(), node.output.clone());
        if !with_shapes {
            continue;
        }
        // A shape value the shapes prove equal, element by element, to an
        // earlier one (layer after layer's `Shape(x)[0]`, the batch).
        let key_of_computation = key;
        let Some(key) = proved_value(g, &shapes, node) else { continue };
        match equal.get(&key) {
            Some(kept) if !escapes && !conditions.contains(&node.output[0]) => {
                let outputs = vec![(node.output[0].clone(), kept.clone())];
                first.insert(key_of_computation, vec![kept.clone()]);
                renamed.extend(outputs.iter().cloned());
                found.push((i, outputs, "equal"));
            }
            Some(_) => {}
            None => {
                equal.insert(key, node.output[0].clone());
            }
        }
    }
    found
}

/// The values the condition of one of the model's `If`s (not a fused
/// node's guard) is computed from in this graph (the condition of an `If`
/// in a body counted where it is read from here), where they are constants
/// and shapes the shapes prove numbers alone: a condition the same on every
/// run, which stays computed at run time (module doc). A condition that reads an input's values (a kernel
/// guard's, of the mask) or an axis not proved a number (a guard's query
/// length) is never a constant: what it is computed from is cleaned as
/// anything else.
fn read_by_conditions(g: &Graph) -> HashSet<String> {
    let (mut conditions, mut bodies) = (vec![], vec![g.proto]);
    while let Some(body) = bodies.pop() {
        // (A fused node's guard is the passes': its branches are ONNX's.)
        let models = |node: &&NodeProto| node.metadata(FUSED_KEY).is_none() && node.metadata(RUNS_KEY).is_none();
        for node in body.node.iter().filter(models) {
            if node.is("If") {
                conditions.extend(node.input.first().cloned());
            }
            bodies.extend(node.subgraphs());
        }
    }
    let shapes = g.shapes();
    let proved = |x: &str| shapes.shape(x).is_some_and(|s| s.iter().all(|d| d.value().is_some()));
    let mut protected = HashSet::new();
    for condition in conditions {
        let (mut todo, mut seen, mut varies) = (vec![condition], HashSet::new(), false);
        while let Some(value) = todo.pop() {
            if !seen.insert(value.clone()) {
                continue;
            }
            match g.producer(&value) {
                // A Shape or Size reads its input's shape alone.
                Some(p) if g.node(p).is("Shape") || g.node(p).is("Size") => {
                    varies |= !g.node(p).input.first().is_some_and(|x| proved(x));
                }
                Some(p) => todo.extend(g.node(p).input.iter().filter(|i| !i.is_empty()).cloned()),
                None => varies |= g.constant(&value).is_none(),
            }
        }
        if !varies {
            protected.extend(seen);
        }
    }
    protected
}

/// A node's one integer value of rank 0 or 1 and known length, every
/// element of which the shapes prove: its type, dims and the elements as
/// every dimension equal to them is written.
fn proved_value(g: &Graph, shapes: &Shapes, node: &NodeProto) -> Option<(i32, Vec<i64>, Vec<Dim>)> {
    let [value] = node.output.as_slice() else { return None };
    let elem = g.elem_type(value).filter(|&t| t == crate::onnx::INT64 || t == crate::onnx::INT32)?;
    let dims: Vec<i64> = shapes.shape(value)?.iter().map(Dim::value).collect::<Option<_>>()?;
    if dims.len() > 1 {
        return None;
    }
    let elements: Vec<Dim> = shapes.shape_elements(value)?.into_iter().collect::<Option<_>>()?;
    (elements.len() as i64 == dims.iter().product::<i64>())
        .then(|| (elem, dims, elements.iter().map(|d| shapes.canonical(d)).collect()))
}

/// What a node computes, as bytes: domain, op, attributes, its inputs (as
/// read after earlier twins), and which outputs it writes.
fn computation(node: &NodeProto, inputs: Vec<String>) -> Vec<u8> {
    let written: Vec<String> = node.output.iter().map(|o| if o.is_empty() { "" } else { "+" }.to_string()).collect();
    prost::Message::encode_to_vec(&NodeProto {
        input: inputs,
        output: written,
        name: None,
        doc_string: None,
        metadata_props: vec![],
        ..node.clone()
    })
}

/// The node, and its bodies at any depth, read `renamed[v]` where they
/// read `v` (a name no body defines again: `twins`).
fn read_instead(node: &mut NodeProto, renamed: &HashMap<String, String>) {
    let rename = |v: &mut String| {
        if let Some(to) = renamed.get(v.as_str()) {
            *v = to.clone();
        }
    };
    node.input.iter_mut().for_each(rename);
    for body in node.subgraphs_mut() {
        body.node.iter_mut().for_each(|n| read_instead(n, renamed));
        for out in &mut body.output {
            let mut name = out.name().to_string();
            rename(&mut name);
            out.name = Some(name);
        }
    }
}

fn constant_node(name: &str, value: &str, t: TensorProto) -> NodeProto {
    NodeProto {
        op_type: Some("Constant".into()),
        name: Some(name.into()),
        output: vec![value.into()],
        attribute: vec![AttributeProto::tensor("value", t)],
        ..Default::default()
    }
}

/// Every name the graph and the bodies inside it use, for nodes and values.
fn names_in(graph: &GraphProto) -> HashSet<String> {
    let mut names: HashSet<String> = HashSet::new();
    for node in &graph.node {
        names.insert(node.name().to_string());
        names.extend(node.output.iter().cloned());
        names.extend(node.input.iter().cloned());
        node.subgraphs().for_each(|b| names.extend(names_in(b)));
    }
    names.extend(graph.input.iter().map(|i| i.name().to_string()));
    names.extend(graph.initializer.iter().map(|t| t.name().to_string()));
    names
}
