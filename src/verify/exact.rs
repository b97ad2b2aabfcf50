//! Why a fused node differs: which of it and the nodes it replaced is
//! closer to exact arithmetic. The replaced nodes, read from the original
//! model by the fused node's `transmuter.fused` list, run again in ONNX
//! Runtime with every floating-point value promoted to f64 (inputs,
//! constants, Cast targets), on the same inputs; both the original's
//! values and the fused node's are compared with that.

use super::*;

/// How far the original nodes and the fused node are from the same
/// computation in f64, on the same inputs (max absolute difference).
#[derive(Debug, Clone, Serialize)]
pub struct Exact {
    /// max |original - exact|, or None where exact arithmetic could not be
    /// computed (`problem` says why).
    pub original: Option<f64>,
    /// max |fused - exact|.
    pub fused: Option<f64>,
    /// `fused` (the fused node is further from exact arithmetic), `original`,
    /// or `unknown`.
    pub further: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// What is known about the fused op's kernel computing differently, and
    /// how to keep the unfused form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

/// Kernels known to compute differently from the primitives they replace
/// (op type, what they do, the pass that writes them).
const KNOWN_KERNELS: &[(&str, &str, &str)] = &[(
    "SkipLayerNormalization",
    "ONNX Runtime's CPU SkipLayerNormalization computes the variance in one pass (E[x²] − E[x]², in f32), \
     which loses precision where the sum has a large mean",
    "skip-norm",
)];

impl Exact {
    /// One line: the verdict, and the kernel's note.
    pub fn text(&self) -> String {
        let e = |v: Option<f64>| v.map_or_else(|| "unknown".to_string(), |v| format!("{v:.1e}"));
        let mut s = match (self.further, &self.problem) {
            ("fused", _) => format!(
                "the fused node is further from exact arithmetic than the nodes it replaces (original {}, fused {})",
                e(self.original),
                e(self.fused)
            ),
            ("original", _) => format!(
                "the fused node is closer to exact arithmetic than the nodes it replaces (original {}, fused {})",
                e(self.original),
                e(self.fused)
            ),
            (_, Some(why)) => format!("exact arithmetic could not be computed: {why}"),
            _ => "exact arithmetic could not be computed".into(),
        };
        if let Some(k) = &self.kernel {
            s.push_str("; ");
            s.push_str(k);
        }
        s
    }
}

/// The note for a fused op whose kernel is known to compute differently.
fn kernel_note(op_type: &str) -> Option<String> {
    KNOWN_KERNELS
        .iter()
        .find(|(op, _, _)| *op == op_type)
        .map(|(_, what, pass)| format!("{what}; --disable {pass} keeps the unfused form"))
}

/// The main graph's nodes a fused node replaced, by its provenance list.
pub(super) fn replaced<'a>(original: &'a ModelProto, fused: &NodeProto) -> Vec<&'a NodeProto> {
    let Some(list) = fused.metadata(FUSED_KEY) else { return vec![] };
    let entries: std::collections::HashSet<&str> = list.split(", ").collect();
    let nodes = original.graph.iter().flat_map(|g| &g.node);
    nodes.filter(|n| entries.contains(crate::rewrite::provenance_entry(n).as_str())).collect()
}

/// The values `nodes` read that none of them computes.
pub(super) fn reads(nodes: &[&NodeProto]) -> Vec<String> {
    let made: std::collections::HashSet<&str> =
        nodes.iter().flat_map(|n| &n.output).filter(|o| !o.is_empty()).map(String::as_str).collect();
    let mut read: Vec<String> = Vec::new();
    for v in nodes.iter().flat_map(|n| &n.input) {
        if !v.is_empty() && !made.contains(v.as_str()) && !read.contains(v) {
            read.push(v.clone());
        }
    }
    read
}

fn is_float(elem_type: i32) -> bool {
    matches!(DataType::try_from(elem_type), Ok(DataType::Float | DataType::Float16 | DataType::Bfloat16))
}

/// An f64 tensor of `dims` holding `values`.
fn f64_tensor(dims: Vec<i64>, values: Vec<f64>) -> crate::onnx::TensorProto {
    crate::onnx::TensorProto {
        dims,
        data_type: Some(DataType::Double as i32),
        double_data: values,
        ..Default::default()
    }
}

/// A constant with its floating-point values in f64.
fn promoted(t: &crate::onnx::TensorProto) -> Result<crate::onnx::TensorProto> {
    if !is_float(t.data_type()) {
        return Ok(t.clone());
    }
    let values = t.values().ok_or_else(|| anyhow!("constant {} cannot be read in f64", t.name()))?;
    Ok(crate::onnx::TensorProto { name: t.name.clone(), ..f64_tensor(t.dims.clone(), values) })
}

/// `node` computing in f64: Cast targets, constant values.
fn promoted_node(node: &NodeProto) -> Result<NodeProto> {
    let mut node = node.clone();
    for a in &mut node.attribute {
        match (node.op_type.as_deref(), a.name()) {
            (Some("Cast"), "to") if a.i.is_some_and(is_float_i64) => a.i = Some(DataType::Double as i64),
            (Some("Constant"), "value_float") => {
                *a = crate::onnx::AttributeProto::tensor("value", f64_tensor(vec![], vec![a.f() as f64]));
            }
            (Some("Constant"), "value_floats") => {
                let v: Vec<f64> = a.floats.iter().map(|&f| f as f64).collect();
                *a = crate::onnx::AttributeProto::tensor("value", f64_tensor(vec![v.len() as i64], v));
            }
            (Some("Constant" | "ConstantOfShape"), "value") => {
                if let Some(t) = a.t.as_ref() {
                    a.t = Some(promoted(t)?);
                }
            }
            _ => {}
        }
    }
    Ok(node)
}

fn is_float_i64(t: i64) -> bool {
    i32::try_from(t).is_ok_and(is_float)
}

/// The replaced nodes of `fused` as a model computing in f64, and what to
/// feed it: the original's values of what they read, promoted.
fn exact_model(
    original: &ModelProto,
    fused: &NodeProto,
    values: &HashMap<String, Values>,
) -> Result<(ModelProto, Vec<Input>)> {
    use crate::onnx::GraphProto;
    let nodes = replaced(original, fused);
    if nodes.is_empty() {
        bail!("the nodes it replaced are not in the original's main graph");
    }
    let main = original.graph.as_ref().ok_or_else(|| anyhow!("the original has no graph"))?;
    let mut graph = GraphProto { name: Some("replaced nodes in f64".into()), ..Default::default() };
    let mut feeds = Vec::new();
    for v in reads(&nodes) {
        if let Some(t) = main.initializer.iter().find(|t| t.name() == v) {
            graph.initializer.push(promoted(t)?);
        } else if let Some(c) = main.node.iter().find(|n| n.is("Constant") && n.output.first() == Some(&v)) {
            graph.node.push(promoted_node(c)?);
        } else {
            let value = values.get(&v).ok_or_else(|| anyhow!("the original's value of {v} was not kept"))?;
            let value = if is_float(value.elem_type) {
                Values { elem_type: DataType::Double as i32, shape: value.shape.clone(), data: value.data.clone() }
            } else {
                Values { elem_type: value.elem_type, shape: value.shape.clone(), data: value.data.clone() }
            };
            graph.input.push(tensor_info(&v, value.elem_type, Some(&value.shape)));
            feeds.push(Input::from_values(&v, &value)?);
        }
    }
    for n in &nodes {
        graph.node.push(promoted_node(n)?);
    }
    for out in fused.output.iter().filter(|o| !o.is_empty()) {
        graph.output.push(ValueInfoProto { name: Some(out.clone()), ..Default::default() });
    }
    let model = ModelProto {
        ir_version: original.ir_version,
        opset_import: original.opset_import.clone(),
        functions: original.functions.clone(),
        graph: Some(graph),
        ..Default::default()
    };
    Ok((model, feeds))
}

fn max_abs(a: &Values, exact: &Values) -> Option<f64> {
    (a.shape == exact.shape).then(|| {
        a.data
            .iter()
            .zip(&exact.data)
            .filter(|(x, e)| !x.is_nan() && !e.is_nan())
            .map(|(x, e)| (x - e).abs())
            .fold(0.0, f64::max)
    })
}

/// Where `fused` (of op type `op_type`) differs on output `out`: the
/// original's and the fused node's distance from exact arithmetic.
#[allow(clippy::too_many_arguments)]
pub(super) fn judge(
    env: &ort::environment::Environment,
    original: (&ModelProto, &Path),
    fused: &NodeProto,
    out: &str,
    values: &HashMap<String, Values>,
    got: &Values,
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Exact {
    let kernel = kernel_note(fused.op_type());
    let computed = exact_model(original.0, fused, values).and_then(|(model, feeds)| {
        let feeds: Vec<(String, DynValue)> =
            feeds.iter().map(|i| Ok((i.name.clone(), i.to_value()?))).collect::<Result<_>>()?;
        let exact = run(env, &model, original.1, "exact (f64)", &[], feeds, reference_ops)?;
        exact.into_iter().find(|(name, _)| name == out).map(|(_, v)| v).ok_or_else(|| anyhow!("{out} not computed"))
    });
    let unknown =
        |why: String| Exact { original: None, fused: None, further: "unknown", problem: Some(why), kernel: None };
    let exact = match computed {
        Ok(exact) => exact,
        Err(e) => return Exact { kernel, ..unknown(format!("{e:#}")) },
    };
    let original_err = values.get(out).and_then(|a| max_abs(a, &exact));
    let fused_err = max_abs(got, &exact);
    let further = match (original_err, fused_err) {
        (Some(o), Some(f)) if f > o => "fused",
        (Some(_), Some(_)) => "original",
        _ => "unknown",
    };
    Exact { original: original_err, fused: fused_err, further, problem: None, kernel }
}
