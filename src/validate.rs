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
//!   an import (`onnx::is_implied_domain`); the model imports at least one
//!   opset, each of a version of at least 1, and its IR version is one
//!   ONNX Runtime reads (1.31.1: up to 13);
//! - no node names an attribute twice;
//! - every tensor of a graph (initializer, `Constant`) has an element type
//!   ONNX defines; one something reads has no negative dimension and
//!   holds as many elements as its shape says (`raw_data` or the typed
//!   field; external data: `tensor_data`). ONNX Runtime drops an
//!   initializer nothing reads before it looks at its data, and loads it.

use std::collections::HashSet;

use crate::onnx::{
    display_name, is_default_domain, DataType, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
};

/// The newest IR version ONNX Runtime 1.31.1 reads (measured: 14 refused).
const MAX_IR_VERSION: i64 = 13;

pub fn model(model: &ModelProto) -> Result<(), String> {
    model_with_files(model, &|_| None)
}

/// The size of an external-data file, by its `location` (None: not known).
pub type FileSize<'a> = &'a dyn Fn(&str) -> Option<u64>;

/// `model`, and every external tensor something reads lies within its
/// file (`file_size`), at an offset that is a size, of the length its
/// shape needs.
pub fn model_with_files(model: &ModelProto, file_size: FileSize) -> Result<(), String> {
    if model.opset_import.is_empty() {
        return Err("the model imports no operator set (opset_import is empty; ONNX Runtime refuses it)".into());
    }
    if let Some(o) = model.opset_import.iter().find(|o| o.version() < 1) {
        return Err(format!("it imports opset {} of {:?}; opset versions start at 1", o.version(), o.domain()));
    }
    if model.ir_version() > MAX_IR_VERSION {
        return Err(format!(
            "its IR version {} is newer than any ONNX Runtime reads (1.31.1: up to {MAX_IR_VERSION})",
            model.ir_version()
        ));
    }
    let imports = domains(&model.opset_import);
    if let Some(g) = &model.graph {
        graph(g, &HashSet::new(), &imports, "the main graph", file_size)?;
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

fn graph(
    g: &GraphProto,
    outer: &HashSet<&str>,
    imports: &HashSet<String>,
    place: &str,
    file_size: FileSize,
) -> Result<(), String> {
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
    let read: HashSet<String> = g
        .node
        .iter()
        .flat_map(crate::graph::values_read_by)
        .chain(g.output.iter().map(|o| o.name().to_string()))
        .collect();
    for t in &g.initializer {
        tensor(t, read.contains(t.name()), &format!("{place}: initializer {:?}", t.name()), file_size)?;
    }
    for node in &g.node {
        let mut names = HashSet::new();
        if let Some(a) = node.attribute.iter().find(|a| !names.insert(a.name())) {
            return Err(format!("{} in {place} names attribute {:?} twice", node_name(node), a.name()));
        }
        for a in &node.attribute {
            let is_read = node.output.iter().any(|o| read.contains(o));
            for t in a.t.iter().chain(&a.tensors) {
                tensor(t, is_read, &format!("{} in {place}: attribute {:?}", node_name(node), a.name()), file_size)?;
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
                graph(body, visible, imports, &inner, file_size)?;
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
    format!("node {} ({})", display_name(node), node.op_type())
}

/// A tensor's element type is one ONNX defines; where something reads it,
/// its dimensions are sizes and its payload holds as many elements as they
/// say (`what` names it in the message).
fn tensor(t: &TensorProto, read: bool, what: &str, file_size: FileSize) -> Result<(), String> {
    let Ok(elem) = DataType::try_from(t.data_type()).map_err(|_| ()).and_then(|d| match d {
        DataType::Undefined => Err(()),
        d => Ok(d),
    }) else {
        return Err(format!("{what} is of element type {}, which ONNX does not define", t.data_type()));
    };
    if !read {
        return Ok(());
    }
    if let Some(d) = t.dims.iter().find(|&&d| d < 0) {
        return Err(format!("{what} has dimension {d}"));
    }
    let Some(n) = t.numel() else { return Err(format!("{what} has more elements than can be counted")) };
    if t.is_external() {
        return external(t, byte_size(elem).and_then(|size| n.checked_mul(size)), what, file_size);
    }
    let (found, needed, held) = match (&t.raw_data, byte_size(elem)) {
        (Some(raw), Some(size)) => (raw.len() as u64, n.checked_mul(size), "bytes of raw_data"),
        (None, _) => match typed_count(t, elem) {
            Some(count) => (count, Some(n), "values in its typed field"),
            None => return Ok(()),
        },
        (Some(_), None) => return Ok(()),
    };
    if needed != Some(found) {
        return Err(format!(
            "{what} has {found} {held}, where its shape {:?} needs {}",
            t.dims,
            needed.unwrap_or(u64::MAX)
        ));
    }
    Ok(())
}

/// An external tensor's `offset` and `length` are sizes, its length is the
/// `needed` bytes (where its type has whole bytes), and both lie within
/// its file where its size is known.
fn external(t: &TensorProto, needed: Option<u64>, what: &str, file_size: FileSize) -> Result<(), String> {
    let entry = |key: &str| t.external_data.iter().find(|e| e.key() == key).map(|e| e.value());
    let number = |key: &str| -> Result<Option<u64>, String> {
        match entry(key) {
            None => Ok(None),
            Some(v) => {
                v.parse::<u64>().map(Some).map_err(|_| format!("{what} has external data {key} {v:?}, not a size"))
            }
        }
    };
    let (offset, length) = (number("offset")?.unwrap_or(0), number("length")?);
    if let (Some(length), Some(needed)) = (length, needed) {
        if length != needed {
            return Err(format!(
                "{what} has external data of length {length}, where its shape {:?} needs {needed}",
                t.dims
            ));
        }
    }
    let Some(size) = entry("location").and_then(file_size) else { return Ok(()) };
    let Some(span) = length.or(needed) else { return Ok(()) };
    if offset.checked_add(span).is_none_or(|end| end > size) {
        return Err(format!(
            "{what} reads bytes {offset}..{} of {:?}, which holds {size}",
            offset.saturating_add(span),
            entry("location").unwrap_or_default()
        ));
    }
    Ok(())
}

/// Bytes per element in `raw_data`, for types of whole bytes.
fn byte_size(elem: DataType) -> Option<u64> {
    use DataType::*;
    Some(match elem {
        Uint8 | Int8 | Bool | Float8e4m3fn | Float8e4m3fnuz | Float8e5m2 | Float8e5m2fnuz | Float8e8m0 => 1,
        Uint16 | Int16 | Float16 | Bfloat16 => 2,
        Float | Int32 | Uint32 => 4,
        Int64 | Uint64 | Double | Complex64 => 8,
        Complex128 => 16,
        _ => return None,
    })
}

/// Elements held in the typed field of `elem` (ONNX's storage rules).
fn typed_count(t: &TensorProto, elem: DataType) -> Option<u64> {
    use DataType::*;
    Some(match elem {
        Float => t.float_data.len(),
        Complex64 => t.float_data.len() / 2,
        Double => t.double_data.len(),
        Complex128 => t.double_data.len() / 2,
        Int64 => t.int64_data.len(),
        Uint32 | Uint64 => t.uint64_data.len(),
        String => t.string_data.len(),
        Int32 | Int16 | Int8 | Uint16 | Uint8 | Bool | Float16 | Bfloat16 | Float8e4m3fn | Float8e4m3fnuz
        | Float8e5m2 | Float8e5m2fnuz | Float8e8m0 => t.int32_data.len(),
        _ => return None,
    } as u64)
}
