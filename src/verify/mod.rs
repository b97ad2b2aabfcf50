//! Proof through ONNX Runtime: run two models on the same inputs and compare.
//!
//! Both models run on the CPU execution provider with graph optimizations
//! disabled, so the original runs the primitives its exporter wrote (ONNX
//! Runtime would otherwise fuse them itself, and the comparison would prove
//! nothing). The verdict rests on what a fusion can be blamed for: each
//! fused node runs alone, on the original model's own values of its inputs,
//! and its output is compared with the original's value of the same name
//! (every replacement keeps its anchor's output name), at the tolerance of
//! the type it writes. So rounding that accumulates over many layers cannot
//! fail a correct rewrite, and an error is pinned on the node that made it.
//! Graph outputs are compared and reported too; they decide the verdict
//! only where some fused node could not run alone (inside a subgraph body).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Result};
use ort::session::{builder::GraphOptimizationLevel, Session};
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};
use prost::Message;
use serde::Serialize;

mod reference;

use crate::graph::Scope;
use crate::onnx::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::onnx::proto::type_proto::Value as TypeValue;
use crate::onnx::{DataType, ModelProto, NodeProto, ValueInfoProto, FUSED_KEY};

const HOW_TO_GET_IT: &str =
    "run scripts/fetch-ort.sh (it takes libonnxruntime.so from the onnxruntime wheel on PyPI), \
     pass --ort-lib PATH, set ORT_DYLIB_PATH, or pip install onnxruntime";

/// Where ONNX Runtime's library is, in order: `--ort-lib`, `ORT_DYLIB_PATH`,
/// the place `scripts/fetch-ort.sh` puts it, an installed Python package.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return existing(path.to_path_buf(), "--ort-lib");
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return existing(PathBuf::from(path), "ORT_DYLIB_PATH");
    }
    let mut fetched = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ort/lib/libonnxruntime.so")];
    if let Ok(exe) = std::env::current_exe() {
        // target/{debug,release}/onnx-fuse → the checkout's .ort/lib
        fetched.extend(exe.ancestors().skip(1).take(3).map(|dir| dir.join(".ort/lib/libonnxruntime.so")));
    }
    if let Some(found) = fetched.into_iter().find(|p| p.is_file()) {
        return Ok(found);
    }
    if let Some(found) = python_package_library() {
        return Ok(found);
    }
    bail!("the ONNX Runtime library (libonnxruntime.so) was not found; {HOW_TO_GET_IT}")
}

fn existing(path: PathBuf, from: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{}: the ONNX Runtime library named by {from} does not exist; {HOW_TO_GET_IT}", path.display())
    }
}

fn python_package_library() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let capi = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()).join("capi");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(capi)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so")))
        .collect();
    libs.sort();
    libs.pop()
}

/// The one ONNX Runtime environment of this process.
fn environment(library: &Path) -> Result<&'static ort::environment::Environment> {
    static ENV: OnceLock<std::result::Result<ort::environment::Environment, String>> = OnceLock::new();
    let env = ENV.get_or_init(|| {
        let builder =
            ort::init_from(library).map_err(|e| format!("{}: cannot load ONNX Runtime: {e}", library.display()))?;
        builder.with_name("onnx-fuse").build().map_err(|e| format!("cannot start ONNX Runtime: {e}"))
    });
    env.as_ref().map_err(|e| anyhow!("{e}"))
}

/// Tolerances: an element passes when |a - b| <= atol + rtol * |a|.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

/// Defaults per element type; floating-point outputs of fused kernels
/// differ from the primitives only by rounding.
pub fn default_tolerance(elem_type: i32) -> Tolerance {
    match DataType::try_from(elem_type) {
        Ok(DataType::Float16) => Tolerance { rtol: 1e-2, atol: 1e-3 },
        Ok(DataType::Bfloat16) => Tolerance { rtol: 4e-2, atol: 1e-2 },
        Ok(DataType::Double) => Tolerance { rtol: 1e-9, atol: 1e-12 },
        Ok(DataType::Float) => Tolerance { rtol: 1e-4, atol: 1e-5 },
        _ => Tolerance { rtol: 0.0, atol: 0.0 },
    }
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub library: Option<PathBuf>,
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
    pub seed: u64,
    /// Values for symbolic dimensions, by name.
    pub dims: HashMap<String, i64>,
    /// An `.npz` file whose arrays, by input name, replace synthesized inputs.
    pub inputs: Option<PathBuf>,
}

/// The comparison of one value (a graph output or a fused node's output).
#[derive(Debug, Clone, Serialize)]
pub struct Compared {
    pub name: String,
    /// For a fused node: its op type and name in the rewritten model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub elem_type: String,
    pub elements: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    pub tolerance: Tolerance,
    pub passed: bool,
    /// Why it failed when not by size (shape, NaN positions, type).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// max over elements of |a - b| / (atol + rtol |a|): above 1 fails.
    #[serde(skip)]
    pub badness: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verification {
    pub passed: bool,
    /// How the verdict was reached, in words.
    pub method: String,
    pub inputs: BTreeMap<String, Vec<i64>>,
    /// The value each symbolic dimension of the inputs had.
    pub dims: BTreeMap<String, i64>,
    pub outputs: Vec<Compared>,
    /// Whether graph outputs decide the verdict (some fused node could not
    /// run alone); otherwise they are reported only.
    pub outputs_decide: bool,
    /// Fused nodes, each run alone, worst first.
    pub nodes: Vec<Compared>,
    /// Fused nodes inside subgraph bodies, which cannot run alone.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_isolated: Vec<String>,
    /// The first fused node in graph order whose output differs: nodes
    /// after it inherit its error, so this is where to look.
    pub blamed: Option<String>,
    /// Ops the CPU provider lacks, computed in the verification copies by a
    /// reference function of their documented semantics.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reference_ops: Vec<String>,
    pub seconds: f64,
}

impl Verification {
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let verdict = if self.passed { "passed" } else { "FAILED" };
        let _ =
            writeln!(s, "verification {verdict} ({:.2} s, ONNX Runtime CPU, graph optimizations off)", self.seconds);
        let _ = writeln!(s, "  method: {}", self.method);
        if !self.not_isolated.is_empty() {
            let _ = writeln!(
                s,
                "  fused nodes in subgraph bodies (judged by the graph outputs): {}",
                self.not_isolated.len()
            );
        }
        let shapes: Vec<String> = self.inputs.iter().map(|(n, s)| format!("{n} {s:?}")).collect();
        let _ = writeln!(s, "  inputs: {}", shapes.join(", "));
        if !self.reference_ops.is_empty() {
            let _ = writeln!(
                s,
                "  computed by reference functions (the CPU provider lacks them): {}",
                self.reference_ops.join(", ")
            );
        }
        if let Some(node) = &self.blamed {
            let _ = writeln!(s, "  first fused node to differ (in graph order): {node}");
        }
        for c in self.outputs.iter().chain(self.nodes.iter().take(if self.passed { 3 } else { 10 })) {
            let what = c.node.as_deref().map_or_else(|| format!("output {}", c.name), |n| format!("node {n} alone"));
            let mark = match (c.passed, c.node.is_some() || self.outputs_decide) {
                (true, _) => "ok  ",
                (false, true) => "FAIL",
                // Reported only: every fused node agreed on its own.
                (false, false) => "diff",
            };
            let _ = write!(
                s,
                "  {mark} {what}: max abs {:.3e}, max rel {:.3e} ({}, rtol {:.0e}, atol {:.0e})",
                c.max_abs, c.max_rel, c.elem_type, c.tolerance.rtol, c.tolerance.atol
            );
            if let Some(p) = &c.problem {
                let _ = write!(s, ", {p}");
            }
            s.push('\n');
        }
        if self.nodes.len() > 3 && self.passed {
            let _ = writeln!(s, "  ... and {} more fused nodes within tolerance", self.nodes.len() - 3);
        }
        s
    }
}

/// Compares `original` and `rewritten` (whose directories resolve their
/// external data). Fused nodes are those of `rewritten` carrying a
/// `transmuter.fused` entry.
pub fn verify(
    original: (&ModelProto, &Path),
    rewritten: (&ModelProto, &Path),
    options: &Options,
) -> Result<Verification> {
    let started = std::time::Instant::now();
    let env = environment(&find_library(options.library.as_deref())?)?;
    let (fused, not_isolated) = fused_nodes(rewritten.0);
    let model_inputs: std::collections::HashSet<&str> =
        original.0.graph.iter().flat_map(|g| g.input.iter().map(|i| i.name())).collect();
    let constants = main_constants(rewritten.0);
    // The original computes every value a fused node reads or writes.
    let computed: std::collections::HashSet<&str> =
        original.0.graph.iter().flat_map(|g| g.node.iter().flat_map(|n| n.output.iter().map(String::as_str))).collect();
    let mut probe: Vec<String> = Vec::new();
    for node in &fused {
        for v in node.input.iter().chain(&node.output[..1]) {
            let wanted = computed.contains(v.as_str()) && !constants.contains_key(v.as_str());
            if wanted && !model_inputs.contains(v.as_str()) && !probe.contains(v) {
                probe.push(v.clone());
            }
        }
    }
    let mut reference_ops = std::collections::BTreeSet::new();
    let feeds = |inputs: &[Input]| -> Result<Vec<(String, DynValue)>> {
        inputs.iter().map(|i| Ok((i.name.clone(), i.to_value()?))).collect()
    };
    let (inputs, dims, mut a) = run_original(env, original, options, &probe, &mut reference_ops)?;
    let b = run(env, rewritten.0, rewritten.1, "rewritten", &[], feeds(&inputs)?, &mut reference_ops)?;
    for i in &inputs {
        a.entry(i.name.clone()).or_insert_with(|| i.values());
    }
    let tolerance_for = |elem_type: i32| {
        let t = default_tolerance(elem_type);
        Tolerance { rtol: options.rtol.unwrap_or(t.rtol), atol: options.atol.unwrap_or(t.atol) }
    };
    let graph_outputs: Vec<String> =
        original.0.graph.iter().flat_map(|g| g.output.iter().map(|o| o.name().to_string())).collect();
    let mut outputs = Vec::new();
    for name in &graph_outputs {
        let (x, y) = a.get(name).zip(b.get(name)).ok_or_else(|| anyhow!("{name} is not computed by both models"))?;
        outputs.push(compare_values(name, None, x, y, tolerance_for(x.elem_type)));
    }
    // Each fused node alone, on the original's values of its inputs.
    let mut nodes = Vec::new();
    for node in &fused {
        let out = &node.output[0];
        let label = crate::rewrite::provenance_entry(node);
        let expected = a.get(out).ok_or_else(|| anyhow!("the original does not compute {out}"))?;
        let alone = isolate(rewritten.0, node, &a, &constants)?;
        let mut fed = Vec::new();
        for v in node.input.iter().filter(|v| !v.is_empty() && !constants.contains_key(v.as_str())) {
            let value = a.get(v).ok_or_else(|| anyhow!("the original does not compute {v}, which {label} reads"))?;
            fed.push(Input::from_values(v, value)?);
        }
        let got =
            run(env, &alone, rewritten.1, &format!("fused node {label} alone"), &[], feeds(&fed)?, &mut reference_ops)?;
        let got = got.get(out).ok_or_else(|| anyhow!("{label} alone did not compute {out}"))?;
        nodes.push(compare_values(out, Some(label), expected, got, tolerance_for(expected.elem_type)));
    }
    let blamed = nodes.iter().find(|c| !c.passed).and_then(|c| c.node.clone());
    nodes.sort_by(|p, q| q.badness.total_cmp(&p.badness));
    // Nodes alone decide only where the rewrite changed nothing else: every
    // other node of the rewritten graph stands in the original as it is.
    let elsewhere = !same_outside_fused(original.0, rewritten.0);
    let outputs_decide = !not_isolated.is_empty() || elsewhere;
    let passed = nodes.iter().all(|c| c.passed) && (!outputs_decide || outputs.iter().all(|c| c.passed));
    Ok(Verification {
        passed,
        method: if elsewhere {
            "every fused node alone, on the original's values of its inputs; graph outputs too, since the models \
             differ outside the fused nodes"
                .into()
        } else if outputs_decide {
            "every fused node of the main graph alone, on the original's values of its inputs; graph outputs too, \
             since fused nodes inside subgraph bodies cannot run alone"
                .into()
        } else {
            "every fused node alone, on the original's values of its inputs; graph outputs reported".into()
        },
        inputs: inputs.iter().map(|i| (i.name.clone(), i.shape.clone())).collect(),
        dims,
        outputs,
        outputs_decide,
        nodes,
        not_isolated,
        blamed,
        reference_ops: reference_ops.into_iter().collect(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Runs the original (with `probe` exposed) on inputs synthesized with the
/// symbols' default values, or, when it cannot run on those, with the sizes
/// the graph itself suggests (`candidate_sizes`) for the symbols the user
/// did not set. Returns the inputs, the symbol values used, and the values.
#[allow(clippy::type_complexity)]
fn run_original(
    env: &ort::environment::Environment,
    original: (&ModelProto, &Path),
    options: &Options,
    probe: &[String],
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<(Vec<Input>, BTreeMap<String, i64>, HashMap<String, Values>)> {
    let symbols = input_symbols(original.0);
    let unset: Vec<&String> = symbols.iter().filter(|s| !options.dims.contains_key(*s) && !s.contains('+')).collect();
    // One session: every try runs it on other input sizes.
    let mut session = load(env, original.0, original.1, "original", probe, reference_ops)?;
    let mut runs = |o: &Options| -> Result<(Vec<Input>, BTreeMap<String, i64>, HashMap<String, Values>)> {
        let inputs = synthesize_inputs(original.0, o)?;
        let feeds: Vec<(String, DynValue)> =
            inputs.iter().map(|i| Ok((i.name.clone(), i.to_value()?))).collect::<Result<_>>()?;
        let values = run_session(&mut session, "original", feeds)?;
        let used = symbols.iter().filter(|s| !s.contains('+')).map(|s| (s.clone(), symbol_value(s, &o.dims))).collect();
        Ok((inputs, used, values))
    };
    let first = match runs(options) {
        Ok(found) => return Ok(found),
        Err(e) if unset.is_empty() => return Err(e),
        Err(e) => e,
    };
    // One symbol at 0 or 1 (an empty past: Optimum's merged decoders declare
    // the mask as long as the new tokens only), then the sizes the graph
    // suggests for every symbol but the batch size at once.
    let mut tries: Vec<Options> = Vec::new();
    for s in &unset {
        for size in [0, 1] {
            let mut o = options.clone();
            o.dims.insert(s.to_string(), size);
            tries.push(o);
        }
    }
    for size in candidate_sizes(original.0) {
        let mut o = options.clone();
        o.dims
            .extend(unset.iter().filter(|s| !s.to_ascii_lowercase().contains("batch")).map(|s| (s.to_string(), size)));
        tries.push(o);
    }
    for o in tries.iter().take(24) {
        if let Ok(found) = runs(o) {
            return Ok(found);
        }
    }
    let tried: Vec<String> = unset.iter().map(|s| format!("{s}={}", symbol_value(s, &options.dims))).collect();
    let names: Vec<&str> = unset.iter().map(|s| s.as_str()).collect();
    bail!(
        "{first:#}; the sizes onnx-fuse chose ({}) do not fit the model, nor do the sizes its graph suggests: \
         give the ones it needs with --dim NAME=VALUE for {}",
        tried.join(", "),
        names.join(", ")
    )
}

/// The symbolic dimensions of the inputs the model is fed (not those an
/// initializer gives a default).
fn input_symbols(model: &ModelProto) -> Vec<String> {
    let mut found = Vec::new();
    let Some(graph) = &model.graph else { return found };
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    for vi in graph.input.iter().filter(|i| !initializers.contains(i.name())) {
        if let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            for d in t.shape.iter().flat_map(|s| &s.dim) {
                if let Some(Dim::DimParam(p)) = &d.value {
                    if !found.contains(p) {
                        found.push(p.clone());
                    }
                }
            }
        }
    }
    found
}

/// Sizes a symbolic dimension may need, from what the graph proves: image
/// sides whose patch grid a position table fixes (a Conv of stride s
/// applied to the image, and a table of n = k² or k² + 1 rows: side k·s),
/// the sizes written into constant Reshape/Expand/ConstantOfShape/Tile
/// shapes, then the sizes of the weights' axes.
fn candidate_sizes(model: &ModelProto) -> Vec<i64> {
    let Some(g) = &model.graph else { return vec![] };
    let dims: std::collections::BTreeSet<i64> =
        g.initializer.iter().flat_map(|t| t.dims.iter().copied()).filter(|&d| d > 1 && d <= 4096).collect();
    let strides: std::collections::BTreeSet<i64> = g
        .node
        .iter()
        .filter(|n| n.is("Conv"))
        .filter_map(|n| n.attr_ints("strides").and_then(|s| s.first().copied()))
        .filter(|&s| s > 1)
        .collect();
    // Sizes written into shapes: an export traced at one length may have
    // kept it in a Reshape or Expand target.
    let constants = main_constants(model);
    let mut shaped = std::collections::BTreeSet::new();
    for n in g.node.iter().filter(|n| n.is("Reshape") || n.is("Expand") || n.is("ConstantOfShape") || n.is("Tile")) {
        let shape = if n.is("ConstantOfShape") { n.input.first() } else { n.input.get(1) };
        if let Some(ints) = shape.and_then(|v| constants.get(v.as_str())).and_then(|t| t.ints()) {
            shaped.extend(ints.into_iter().filter(|&d| d > 1 && d <= 4096));
        }
    }
    let mut sizes = Vec::new();
    for &n in &dims {
        for rows in [n, n - 1] {
            let k = (rows as f64).sqrt().round() as i64;
            if k > 1 && k * k == rows {
                sizes.extend(strides.iter().map(|s| k * s));
            }
        }
    }
    sizes.extend(shaped.iter());
    sizes.extend(dims.iter().rev());
    let mut seen = std::collections::HashSet::new();
    sizes.retain(|s| seen.insert(*s));
    sizes
}

/// Runs `model` (its copy, with `probe` exposed as outputs and CPU-less ops
/// replaced by reference functions) on `feeds`; returns every output.
fn run(
    env: &ort::environment::Environment,
    model: &ModelProto,
    dir: &Path,
    which: &str,
    probe: &[String],
    feeds: Vec<(String, DynValue)>,
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<HashMap<String, Values>> {
    let mut session = load(env, model, dir, which, probe, reference_ops)?;
    run_session(&mut session, which, feeds)
}

/// A session of `model` (its copy, with `probe` exposed as outputs and
/// CPU-less ops replaced by reference functions).
fn load(
    env: &ort::environment::Environment,
    model: &ModelProto,
    dir: &Path,
    which: &str,
    probe: &[String],
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<Session> {
    let mut copy = model.clone();
    expose(&mut copy, probe);
    reference_ops.extend(reference::substitute(&mut copy));
    let folder = dir.to_string_lossy();
    let mut builder = Session::builder(env)
        .map_err(|e| anyhow!("{e}"))?
        .with_optimization_level(GraphOptimizationLevel::Disable)
        // Errors come back in the Result; ONNX Runtime's own log would repeat them.
        .and_then(|b| b.with_log_level(ort::logging::LogLevel::Fatal))
        .and_then(|b| b.with_config_entry("session.model_external_initializers_file_folder_path", folder))
        .map_err(|e| anyhow!("{e}"))?;
    // ONNX Runtime reads the model from a scratch file beside it (where its
    // external data resolves), so the process never holds an encoded copy;
    // from memory only where the folder cannot take the file.
    let scratch =
        crate::io::Scratch::new_in(dir).and_then(|mut s| crate::io::encode_to(&copy, &mut s.file).map(|()| s)).ok();
    let loaded = match &scratch {
        Some(s) => builder.commit_from_file(&s.path),
        None => builder.commit_from_memory(&copy.encode_to_vec()),
    };
    loaded.map_err(|e| anyhow!("ONNX Runtime cannot load the {which} model: {e}"))
}

/// Runs a session on `feeds`; returns every output.
fn run_session(session: &mut Session, which: &str, feeds: Vec<(String, DynValue)>) -> Result<HashMap<String, Values>> {
    let outputs = session.run(feeds).map_err(|e| anyhow!("ONNX Runtime cannot run the {which} model: {e}"))?;
    let mut values = HashMap::new();
    for (name, value) in outputs.iter() {
        values.insert(name.to_string(), Values::read(&value)?);
    }
    Ok(values)
}

/// Whether `rewritten` is `original` with some subgraphs replaced by fused
/// nodes and nothing else changed: the same inputs and outputs, every node
/// without a `transmuter.fused` entry also a node of the original, every
/// initializer one of the original's.
fn same_outside_fused(original: &ModelProto, rewritten: &ModelProto) -> bool {
    let (Some(a), Some(b)) = (&original.graph, &rewritten.graph) else { return false };
    if a.input != b.input || a.output != b.output {
        return false;
    }
    let nodes: std::collections::HashSet<Vec<u8>> = a.node.iter().map(|n| n.encode_to_vec()).collect();
    let initializers: HashMap<&str, &crate::onnx::TensorProto> = a.initializer.iter().map(|t| (t.name(), t)).collect();
    b.node.iter().filter(|n| n.metadata(FUSED_KEY).is_none()).all(|n| nodes.contains(&n.encode_to_vec()))
        && b.initializer.iter().all(|t| initializers.get(t.name()).is_some_and(|o| *o == t))
}

/// The fused nodes of the main graph, and the names of those in subgraph
/// bodies (which cannot run alone: their inputs are not outputs of anything
/// ONNX Runtime returns).
fn fused_nodes(model: &ModelProto) -> (Vec<&NodeProto>, Vec<String>) {
    let Some(g) = &model.graph else { return (vec![], vec![]) };
    let main = g.node.iter().filter(|n| n.metadata(FUSED_KEY).is_some() && !n.output.is_empty()).collect();
    let mut inner = Vec::new();
    fn walk(g: &crate::onnx::GraphProto, inner: &mut Vec<String>) {
        for n in &g.node {
            for body in n.subgraphs() {
                for m in &body.node {
                    if m.metadata(FUSED_KEY).is_some() {
                        inner.push(crate::rewrite::provenance_entry(m));
                    }
                }
                walk(body, inner);
            }
        }
    }
    walk(g, &mut inner);
    (main, inner)
}

/// The main graph's constants: initializers and `Constant` node outputs.
fn main_constants(model: &ModelProto) -> HashMap<&str, crate::onnx::TensorProto> {
    let Some(g) = &model.graph else { return HashMap::new() };
    let inputs: std::collections::HashSet<&str> = g.input.iter().map(|i| i.name()).collect();
    let mut found: HashMap<&str, crate::onnx::TensorProto> =
        g.initializer.iter().filter(|t| !inputs.contains(t.name())).map(|t| (t.name(), t.clone())).collect();
    for n in g.node.iter().filter(|n| n.is("Constant") && n.output.len() == 1) {
        if let Some(t) = n.attr("value").and_then(|a| a.t.as_ref()) {
            found.insert(&n.output[0], t.clone());
        }
    }
    found
}

/// A model of `node` alone: its computed inputs become graph inputs (typed
/// as the original's values), its constant inputs initializers, with the
/// rewritten model's opsets and functions.
fn isolate(
    model: &ModelProto,
    node: &NodeProto,
    values: &HashMap<String, Values>,
    constants: &HashMap<&str, crate::onnx::TensorProto>,
) -> Result<ModelProto> {
    use crate::onnx::{GraphProto, TensorProto};
    let mut graph =
        GraphProto { name: Some("fused node alone".into()), node: vec![node.clone()], ..Default::default() };
    for v in node.input.iter().filter(|v| !v.is_empty()) {
        if graph.input.iter().any(|i| i.name() == v) || graph.initializer.iter().any(|t| t.name() == v) {
            continue;
        }
        match constants.get(v.as_str()) {
            Some(t) => graph.initializer.push(TensorProto { name: Some(v.clone()), ..t.clone() }),
            None => {
                let value = values.get(v).ok_or_else(|| anyhow!("the original does not compute {v}"))?;
                graph.input.push(tensor_info(v, value.elem_type, Some(&value.shape)));
            }
        }
    }
    let out = &node.output[0];
    let elem = values.get(out).map_or(0, |v| v.elem_type);
    graph.output.push(tensor_info(out, elem, None));
    Ok(ModelProto {
        ir_version: model.ir_version,
        opset_import: model.opset_import.clone(),
        functions: model.functions.clone(),
        graph: Some(graph),
        ..Default::default()
    })
}

fn tensor_info(name: &str, elem_type: i32, shape: Option<&[i64]>) -> ValueInfoProto {
    use crate::onnx::proto::tensor_shape_proto::Dimension;
    use crate::onnx::proto::type_proto::Tensor;
    use crate::onnx::proto::TensorShapeProto;
    let shape = shape.map(|s| TensorShapeProto {
        dim: s.iter().map(|&d| Dimension { value: Some(Dim::DimValue(d)), ..Default::default() }).collect(),
    });
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(crate::onnx::TypeProto {
            value: Some(TypeValue::TensorType(Tensor { elem_type: Some(elem_type), shape })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Makes values graph outputs so a session returns them.
fn expose(model: &mut ModelProto, values: &[String]) {
    let Some(g) = model.graph.as_mut() else { return };
    for v in values {
        if !g.output.iter().any(|o| o.name() == v) {
            g.output.push(ValueInfoProto { name: Some(v.clone()), ..Default::default() });
        }
    }
}

/// One input tensor, synthesized.
struct Input {
    name: String,
    shape: Vec<i64>,
    data: Data,
}

enum Data {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

impl Input {
    /// An input fed with a value the original computed.
    fn from_values(name: &str, v: &Values) -> Result<Input> {
        let data = match DataType::try_from(v.elem_type) {
            Ok(DataType::Float) => Data::F32(v.data.iter().map(|&x| x as f32).collect()),
            Ok(DataType::Float16) => Data::F16(v.data.iter().map(|&x| half::f16::from_f64(x)).collect()),
            Ok(DataType::Bfloat16) => Data::Bf16(v.data.iter().map(|&x| half::bf16::from_f64(x)).collect()),
            Ok(DataType::Double) => Data::F64(v.data.clone()),
            Ok(DataType::Int64) => Data::I64(v.data.iter().map(|&x| x as i64).collect()),
            Ok(DataType::Int32) => Data::I32(v.data.iter().map(|&x| x as i32).collect()),
            Ok(DataType::Bool) => Data::Bool(v.data.iter().map(|&x| x != 0.0).collect()),
            _ => bail!("{name} has an element type onnx-fuse cannot feed back ({})", v.elem_type),
        };
        Ok(Input { name: name.to_string(), shape: v.shape.clone(), data })
    }

    /// The input as the values a run returns.
    fn values(&self) -> Values {
        let (elem_type, data): (DataType, Vec<f64>) = match &self.data {
            Data::F32(v) => (DataType::Float, v.iter().map(|&x| x as f64).collect()),
            Data::F16(v) => (DataType::Float16, v.iter().map(|x| x.to_f64()).collect()),
            Data::Bf16(v) => (DataType::Bfloat16, v.iter().map(|x| x.to_f64()).collect()),
            Data::F64(v) => (DataType::Double, v.clone()),
            Data::I64(v) => (DataType::Int64, v.iter().map(|&x| x as f64).collect()),
            Data::I32(v) => (DataType::Int32, v.iter().map(|&x| x as f64).collect()),
            Data::Bool(v) => (DataType::Bool, v.iter().map(|&x| f64::from(u8::from(x))).collect()),
        };
        Values { elem_type: elem_type as i32, shape: self.shape.clone(), data }
    }

    fn to_value(&self) -> Result<DynValue> {
        let shape = self.shape.clone();
        let value = match &self.data {
            Data::F32(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::F16(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::Bf16(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::F64(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::I64(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::I32(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
            Data::Bool(v) => Tensor::from_array((shape, v.clone())).map(|t| t.into_dyn()),
        };
        value.map_err(|e| anyhow!("cannot make input {}: {e}", self.name))
    }
}

/// Checks what a user asked of the inputs against the model, before any
/// run: every `--dim` names a symbolic dimension of an input, every array
/// of `--inputs` is named like an input and stored in C order. The error is
/// the user's to fix (a usage error).
pub fn check_options(model: &ModelProto, options: &Options) -> std::result::Result<(), String> {
    let graph = model.graph.as_ref().ok_or("the model has no graph")?;
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let inputs: Vec<&ValueInfoProto> = graph.input.iter().filter(|i| !initializers.contains(i.name())).collect();
    let mut symbols = std::collections::BTreeSet::new();
    for p in input_symbols(model) {
        symbols.extend(p.split('+').map(|t| t.trim().to_string()).filter(|t| t.parse::<i64>().is_err()));
        symbols.insert(p);
    }
    for name in options.dims.keys() {
        if !symbols.contains(name) {
            let known: Vec<&str> = symbols.iter().map(String::as_str).collect();
            return Err(format!(
                "--dim {name}: no input of the model has a dimension of that name (it has: {})",
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            ));
        }
    }
    if let Some(path) = &options.inputs {
        let mut archive =
            npyz::npz::NpzArchive::open(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        let names: Vec<String> = archive.array_names().map(str::to_string).collect();
        for name in names {
            if !inputs.iter().any(|i| i.name() == name) {
                let known: Vec<&str> = inputs.iter().map(|i| i.name()).collect();
                return Err(format!(
                    "{}: array {name:?} is named like no input of the model (its inputs: {})",
                    path.display(),
                    known.join(", ")
                ));
            }
            let array = archive.by_name(&name).map_err(|e| format!("{}: array {name:?}: {e}", path.display()))?;
            if array.is_some_and(|a| a.order() == npyz::Order::Fortran) {
                return Err(format!(
                    "{}: array {name:?} is stored in Fortran order; save it in C order (numpy.ascontiguousarray)",
                    path.display()
                ));
            }
        }
    }
    Ok(())
}

/// The value of a symbolic dimension: given by `--dim`, or the default for
/// its name; a sum such as `past_sequence_length + 1` (Optimum writes these)
/// adds up its terms.
fn symbol_value(symbol: &str, given: &HashMap<String, i64>) -> i64 {
    if let Some(&v) = given.get(symbol) {
        return v;
    }
    if symbol.contains('+') {
        return symbol.split('+').map(|t| t.trim()).map(|t| t.parse().unwrap_or_else(|_| symbol_value(t, given))).sum();
    }
    default_dim(symbol)
}

/// A symbol's value when the user gave none: sequence-like names get a
/// length that exercises masks and softmax, everything else a small size.
fn default_dim(symbol: &str) -> i64 {
    let s = symbol.to_ascii_lowercase();
    if s.contains("batch") {
        2
    } else if s.contains("past") {
        3
    } else {
        7
    }
}

/// Inputs from the declared graph inputs: token ids within the vocabulary
/// the embedding that reads them implies, attention masks of ones, position
/// ids counting up, token type ids of zero, floats uniform in [-1, 1) from
/// a fixed seed.
fn synthesize_inputs(model: &ModelProto, options: &Options) -> Result<Vec<Input>> {
    let graph = model.graph.as_ref().ok_or_else(|| anyhow!("the model has no graph"))?;
    let initializers: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let mut rng = SplitMix(options.seed ^ 0x6f6e_6e78_6675_7365);
    let mut given = match &options.inputs {
        Some(path) => Some(
            npyz::npz::NpzArchive::open(path)
                .map_err(|e| anyhow!("{}: cannot read the inputs: {e}", path.display()))?,
        ),
        None => None,
    };
    let mut inputs = Vec::new();
    for vi in graph.input.iter().filter(|i| !initializers.contains(i.name())) {
        let name = vi.name().to_string();
        let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
            bail!("input {name} is not a tensor; onnx-fuse can only feed tensors");
        };
        if let Some(archive) = given.as_mut() {
            let path = options.inputs.as_deref().unwrap_or(Path::new(""));
            if let Some(input) =
                read_npz(archive, &name, t.elem_type()).map_err(|e| anyhow!("{}: array {name}: {e}", path.display()))?
            {
                inputs.push(input);
                continue;
            }
        }
        let shape: Vec<i64> = t.shape.as_ref().map_or(vec![], |s| {
            s.dim
                .iter()
                .map(|d| match &d.value {
                    Some(Dim::DimValue(v)) => *v,
                    Some(Dim::DimParam(p)) => symbol_value(p, &options.dims),
                    None => 1,
                })
                .collect()
        });
        let n = shape.iter().product::<i64>().max(0) as usize;
        let lower = name.to_ascii_lowercase();
        let ints = |rng: &mut SplitMix| -> Vec<i64> {
            if lower.contains("mask") {
                vec![1; n]
            } else if lower.contains("position") {
                let last = *shape.last().unwrap_or(&1) as usize;
                (0..n).map(|i| (i % last.max(1)) as i64).collect()
            } else if lower.contains("type") {
                vec![0; n]
            } else {
                let vocab = vocabulary(&view, vi.name()).unwrap_or(2);
                (0..n).map(|_| (rng.next() % vocab as u64) as i64).collect()
            }
        };
        let mut floats = |n: usize| -> Vec<f64> { (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect() };
        let data = match DataType::try_from(t.elem_type()) {
            Ok(DataType::Float) => Data::F32(floats(n).into_iter().map(|v| v as f32).collect()),
            Ok(DataType::Float16) => Data::F16(floats(n).into_iter().map(half::f16::from_f64).collect()),
            Ok(DataType::Bfloat16) => Data::Bf16(floats(n).into_iter().map(half::bf16::from_f64).collect()),
            Ok(DataType::Double) => Data::F64(floats(n)),
            Ok(DataType::Int64) => Data::I64(ints(&mut rng)),
            Ok(DataType::Int32) => Data::I32(ints(&mut rng).into_iter().map(|v| v as i32).collect()),
            Ok(DataType::Bool) => Data::Bool(vec![true; n]),
            _ => bail!("input {name} has an element type onnx-fuse cannot synthesize ({})", t.elem_type()),
        };
        inputs.push(Input { name, shape, data });
    }
    Ok(inputs)
}

/// The array named like an input, read as the input's element type.
fn read_npz(
    archive: &mut npyz::npz::NpzArchive<std::io::BufReader<std::fs::File>>,
    name: &str,
    elem_type: i32,
) -> Result<Option<Input>> {
    let Some(array) = archive.by_name(name)? else { return Ok(None) };
    let shape: Vec<i64> = array.shape().iter().map(|&d| d as i64).collect();
    let dtype = array.dtype().descr();
    let wrong = |e: std::io::Error| {
        anyhow!("its dtype {dtype} does not match the input's type ({}): {e}", type_name(elem_type))
    };
    let data = match DataType::try_from(elem_type) {
        Ok(DataType::Float) => Data::F32(array.into_vec().map_err(wrong)?),
        Ok(DataType::Float16) => Data::F16(array.into_vec().map_err(wrong)?),
        Ok(DataType::Double) => Data::F64(array.into_vec().map_err(wrong)?),
        Ok(DataType::Int64) => Data::I64(array.into_vec().map_err(wrong)?),
        Ok(DataType::Int32) => Data::I32(array.into_vec().map_err(wrong)?),
        Ok(DataType::Bool) => Data::Bool(array.into_vec().map_err(wrong)?),
        _ => bail!("inputs of type {} cannot be read from .npz", type_name(elem_type)),
    };
    Ok(Some(Input { name: name.to_string(), shape, data }))
}

/// The row count of the first embedding table (`Gather` data) this input indexes.
fn vocabulary(view: &crate::graph::Graph, input: &str) -> Option<i64> {
    view.consumers(input).iter().find_map(|&c| {
        let node = view.node(c);
        (node.is("Gather") && node.input.get(1).is_some_and(|i| i == input))
            .then(|| view.constant(&node.input[0]).and_then(|t| t.dims.first().copied()))
            .flatten()
            .filter(|&rows| rows > 0)
    })
}

/// A small deterministic generator (SplitMix64), so inputs depend on the
/// seed only (the fuzzer's cases too).
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// An output read back as f64 (exact for every type compared here).
struct Values {
    elem_type: i32,
    shape: Vec<i64>,
    data: Vec<f64>,
}

impl Values {
    fn read(value: &ort::value::DynValueRef<'_>) -> Result<Values> {
        let ValueType::Tensor { ty, .. } = value.dtype() else { bail!("a non-tensor output cannot be compared yet") };
        macro_rules! read {
            ($t:ty, $onnx:expr, $conv:expr) => {{
                let (shape, data) = value.try_extract_tensor::<$t>().map_err(|e| anyhow!("{e}"))?;
                Values { elem_type: $onnx as i32, shape: shape.to_vec(), data: data.iter().map($conv).collect() }
            }};
        }
        Ok(match ty {
            TensorElementType::Float32 => read!(f32, DataType::Float, |v| *v as f64),
            TensorElementType::Float16 => read!(half::f16, DataType::Float16, |v| v.to_f64()),
            TensorElementType::Bfloat16 => read!(half::bf16, DataType::Bfloat16, |v| v.to_f64()),
            TensorElementType::Float64 => read!(f64, DataType::Double, |v| *v),
            TensorElementType::Int64 => read!(i64, DataType::Int64, |v| *v as f64),
            TensorElementType::Int32 => read!(i32, DataType::Int32, |v| *v as f64),
            TensorElementType::Bool => read!(bool, DataType::Bool, |v| *v as u8 as f64),
            other => bail!("outputs of type {other:?} cannot be compared yet"),
        })
    }
}

fn type_name(elem_type: i32) -> String {
    DataType::try_from(elem_type).map_or_else(|_| elem_type.to_string(), |t| t.as_str_name().to_ascii_lowercase())
}

fn compare_values(name: &str, node: Option<String>, a: &Values, b: &Values, tolerance: Tolerance) -> Compared {
    let mut c = Compared {
        name: name.to_string(),
        node,
        elem_type: type_name(a.elem_type),
        elements: a.data.len(),
        max_abs: 0.0,
        max_rel: 0.0,
        tolerance,
        passed: true,
        problem: None,
        badness: 0.0,
    };
    let fail = |mut c: Compared, why: String| {
        c.passed = false;
        c.problem = Some(why);
        c.badness = f64::INFINITY;
        c
    };
    if a.elem_type != b.elem_type {
        return fail(c, format!("types differ ({} vs {})", type_name(a.elem_type), type_name(b.elem_type)));
    }
    if a.shape != b.shape {
        return fail(c, format!("shapes differ ({:?} vs {:?})", a.shape, b.shape));
    }
    let mut nan_mismatch = 0usize;
    for (&x, &y) in a.data.iter().zip(&b.data) {
        if x.is_nan() || y.is_nan() {
            nan_mismatch += usize::from(x.is_nan() != y.is_nan());
            continue;
        }
        if x == y {
            continue; // equal infinities too
        }
        let abs = (x - y).abs();
        c.max_abs = c.max_abs.max(abs);
        c.max_rel = c.max_rel.max(abs / x.abs().max(f64::MIN_POSITIVE));
        let allowed = tolerance.atol + tolerance.rtol * x.abs();
        c.badness = c.badness.max(if allowed > 0.0 { abs / allowed } else { f64::INFINITY });
    }
    if nan_mismatch > 0 {
        return fail(c, format!("NaN at {nan_mismatch} positions in one model only"));
    }
    c.passed = c.badness <= 1.0;
    c
}
