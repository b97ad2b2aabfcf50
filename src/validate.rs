//! The structural rules ONNX Runtime loads a model by, checked on every
//! model loaded: a model that breaks one is refused with its first
//! violation, rather than rewritten and written out (spec, ground rule 10:
//! what ONNX Runtime loads, onnx-fuse accepts).
//!
//! - every value a node or graph output reads is defined somewhere: a
//!   graph input, an initializer, a node's output, or a value of an
//!   enclosing graph. The node list may be in any order (ONNX Runtime sorts
//!   it), but the nodes must form no cycle, counting what bodies capture;
//! - no graph defines a value twice, but for constants (spec, ground rule
//!   10): a name that only initializers and `Constant` nodes define is
//!   accepted, as ONNX Runtime accepts it (it warns and uses the last one);
//!   the graph view marks it ambiguous, so no match reads it;
//! - every node's domain is imported, or one ONNX Runtime resolves without
//!   an import (`onnx::is_implied_domain`); the model imports at least one opset.

use std::collections::HashSet;

use crate::onnx::{is_default_domain, GraphProto, ModelProto, NodeProto, OperatorSetIdProto};

pub fn model(model: &ModelProto) -> Result<(), String> {
    if model.opset_import.is_empty() {
        return Err("the model imports no operator set (opset_import is empty; ONNX Runtime refuses it)".into());
    }
    let imports = domains(&model.opset_import);
    if let Some(g) = &model.graph {
        graph(g, &HashSet::new(), &imports, "the main graph")?;
    }
    for f in &model.functions {
        let mut defined: HashSet<&str> = f.input.iter().map(String::as_str).collect();
        let imports = domains(&f.opset_import);
        let place = format!("function {}.{}", f.domain(), f.name());
        defined.extend(f.node.iter().flat_map(|n| &n.output).filter(|o| !o.is_empty()).map(String::as_str));
        for node in &f.node {
            check_node(node, &defined, &HashSet::new(), &imports, &place)?;
        }
        acyclic(&f.node, &place)?;
        for out in &f.output {
            if !defined.contains(out.as_str()) {
                return Err(format!("{place} returns {out:?}, which nothing in it defines"));
            }
        }
    }
    Ok(())
}

fn domains(imports: &[OperatorSetIdProto]) -> HashSet<String> {
    imports.iter().map(|o| if is_default_domain(o.domain()) { String::new() } else { o.domain().to_string() }).collect()
}

fn graph(g: &GraphProto, outer: &HashSet<&str>, imports: &HashSet<String>, place: &str) -> Result<(), String> {
    let mut defined: HashSet<&str> = HashSet::new();
    let inputs: HashSet<&str> = g.input.iter().map(|i| i.name()).collect();
    let twice = |name: &str| format!("{place} defines {name:?} twice");
    for name in g.input.iter().map(|i| i.name()) {
        if !defined.insert(name) {
            return Err(twice(name));
        }
    }
    // Names only initializers and Constant nodes define: ONNX Runtime
    // takes every one of them as an initializer and the last one wins.
    let mut constants: HashSet<&str> = HashSet::new();
    let initializers = g.initializer.iter().map(|t| t.name());
    let sparse = g.sparse_initializer.iter().filter_map(|s| s.values.as_ref()).map(|t| t.name());
    for name in initializers.chain(sparse) {
        // An initializer may give a graph input its default value.
        if !defined.insert(name) && !inputs.contains(name) && !constants.contains(name) {
            return Err(twice(name));
        }
        if !inputs.contains(name) {
            constants.insert(name);
        }
    }
    for node in &g.node {
        for out in node.output.iter().filter(|o| !o.is_empty()) {
            let constant = node.is("Constant");
            if !defined.insert(out) && !(constant && constants.contains(out.as_str())) {
                return Err(format!("{} in {place} defines {out:?}, which is already defined", node_name(node)));
            }
            if constant {
                constants.insert(out);
            }
        }
    }
    // Bodies see every value of the enclosing graphs; one they read that
    // depends on their own node is a cycle, found below (the union is
    // built only for nodes that hold a body).
    let mut visible: Option<HashSet<&str>> = None;
    for node in &g.node {
        check_node(node, &defined, outer, imports, place)?;
        for a in &node.attribute {
            for (i, body) in a.g.iter().chain(&a.graphs).enumerate() {
                let visible = visible.get_or_insert_with(|| outer.union(&defined).copied().collect());
                let inner = format!("the body {}[{i}] of node {}", a.name(), node_name(node));
                graph(body, visible, imports, &inner)?;
            }
        }
    }
    acyclic(&g.node, place)?;
    for out in g.output.iter().map(|o| o.name()) {
        if !defined.contains(out) && !outer.contains(out) {
            return Err(format!("{place} has output {out:?}, which nothing defines"));
        }
    }
    Ok(())
}

/// The nodes form no cycle (in any list order), counting what bodies capture.
fn acyclic(nodes: &[NodeProto], place: &str) -> Result<(), String> {
    match crate::graph::node_order(nodes) {
        Ok(_) => Ok(()),
        Err(i) => {
            Err(format!("{} in {place} depends on its own output (the nodes form a cycle)", node_name(&nodes[i])))
        }
    }
}

fn check_node(
    node: &NodeProto,
    defined: &HashSet<&str>,
    outer: &HashSet<&str>,
    imports: &HashSet<String>,
    place: &str,
) -> Result<(), String> {
    let domain = if is_default_domain(node.domain()) { "" } else { node.domain() };
    if !imports.contains(domain) && !crate::onnx::is_implied_domain(domain) {
        let shown = if domain.is_empty() { "the default domain" } else { domain };
        return Err(format!("{} in {place} is of {shown}, which is not imported (opset_import)", node_name(node)));
    }
    for input in node.input.iter().filter(|i| !i.is_empty()) {
        if !defined.contains(input.as_str()) && !outer.contains(input.as_str()) {
            return Err(format!("{} in {place} reads {input:?}, which nothing defines", node_name(node)));
        }
    }
    Ok(())
}

fn node_name(node: &NodeProto) -> String {
    format!("node {} ({})", crate::rewrite::display_name(node), node.op_type())
}
