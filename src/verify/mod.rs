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

mod apart;
mod compare;
mod exact;
mod inputs;
mod reference;
mod runtime;
mod search;

pub use apart::{verify_apart, Verified};
use compare::*;
pub use compare::{default_tolerance, Compared, Tolerance};
pub use exact::Exact;
use inputs::*;
pub use inputs::{check_options, SplitMix};
pub use runtime::find_library;
use runtime::*;

use crate::graph::Scope;
use crate::onnx::proto::tensor_shape_proto::dimension::Value as Dim;
use crate::onnx::proto::type_proto::Value as TypeValue;
use crate::onnx::{DataType, ModelProto, NodeProto, ValueInfoProto, BFLOAT16, FLOAT16, FUSED_KEY};

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
    /// Synthesized float inputs hold a special value (NaN, ±∞, the f32
    /// lowest or largest, -1e9) at one element, one input in two, and
    /// booleans are false one time in four: the differential fuzzer's
    /// inputs beyond the finite and masks that hide keys.
    pub specials: bool,
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
                // The original's own values vary from run to run.
                (false, _) if c.unrepeatable.is_some() => "vary",
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
            if let Some(by) = c.rounded {
                let _ = write!(
                    s,
                    "; within tolerance with every f16 value rounded as ONNX defines each op (max abs {by:.3e}): \
                     ONNX Runtime computes chains of f16 ops in f32"
                );
            }
            if let Some(by) = c.unrepeatable {
                let _ = write!(s, "; the original gives other values when run again (max abs {by:.3e}): not judged");
            }
            if c.passed && c.within_by_atol > 0 {
                let _ = write!(s, "; atol decided {} of {} elements", c.within_by_atol, c.elements);
            }
            s.push('\n');
            if let Some(e) = &c.exact {
                let _ = writeln!(s, "       {}", e.text());
            }
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
    for model in [original.0, rewritten.0] {
        model.graph.as_ref().map_or(Ok(()), normal_spreads_positive)?;
    }
    let env = environment(&find_library(options.library.as_deref())?)?;
    let (fused, not_isolated) = fused_nodes(rewritten.0);
    let model_inputs: std::collections::HashSet<&str> =
        original.0.graph.iter().flat_map(|g| g.input.iter().map(|i| i.name())).collect();
    let constants = main_constants(rewritten.0);
    // The original computes every value a fused node reads or writes.
    let computed: std::collections::HashSet<&str> =
        original.0.graph.iter().flat_map(|g| g.node.iter().flat_map(|n| n.output.iter().map(String::as_str))).collect();
    // Each fused node with the new nodes computing its guard, what they
    // read and the original's values they write.
    let preludes: Vec<_> = fused.iter().map(|node| with_prelude(rewritten.0, node, &computed)).collect();
    // What the replaced nodes read: a failed node is run again as those
    // nodes in f64 (`exact`).
    let replaced: Vec<Vec<String>> =
        fused.iter().map(|node| exact::reads(&exact::replaced(original.0, node))).collect();
    let mut probe: Vec<String> = Vec::new();
    for ((_, reads, outputs), replaced) in preludes.iter().zip(&replaced) {
        for v in reads.iter().chain(outputs).chain(replaced) {
            let wanted = computed.contains(v.as_str()) && !constants.contains_key(v.as_str());
            if wanted && !model_inputs.contains(v.as_str()) && !probe.contains(v) {
                probe.push(v.clone());
            }
        }
    }
    let outputs: Vec<&str> = original.0.graph.iter().flat_map(|g| g.output.iter().map(|o| o.name())).collect();
    let kept: Vec<&str> = probe.iter().map(String::as_str).chain(outputs).collect();
    check_kept(original.0, options, &kept, memory_available())
        .map_err(|e| anyhow::Error::new(crate::usage::Usage(e)))?;
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
    // Each fused node is judged at the tolerance of the least precise type
    // its values pass through: what it writes, and what it and the nodes it
    // replaced read. An f16 attention core writing f32 is computed to f16's
    // precision, and ONNX Runtime's CPU provider runs some f16 ops in f32,
    // casting back only where a value is fetched: the original, whose inner
    // values are fetched here, rounds more often than the node alone
    // (Optimum's f16 Qwen3: 8.8e-5 apart, the node the closer to exact
    // arithmetic).
    let passed_through: Vec<Vec<i32>> = preludes
        .iter()
        .zip(&replaced)
        .map(|((_, reads, _), replaced)| {
            reads.iter().chain(replaced).filter_map(|v| a.get(v).map(|x| x.elem_type)).collect()
        })
        .collect();
    let loosest = |types: &mut dyn Iterator<Item = &i32>, written: i32| {
        types.map(|&t| tolerance_for(t)).fold(tolerance_for(written), |x, y| {
            if (y.rtol, y.atol) > (x.rtol, x.atol) {
                y
            } else {
                x
            }
        })
    };
    // A graph output computed from fused nodes carries their rounding: it
    // is judged at the loosest of their tolerances and its own type's (an
    // f16 norm whose result is widened to an f32 output).
    let graph_outputs: Vec<String> =
        original.0.graph.iter().flat_map(|g| g.output.iter().map(|o| o.name().to_string())).collect();
    let body_types = if not_isolated.is_empty() { HashMap::new() } else { fused_types_in_bodies(rewritten.0) };
    let producers: HashMap<&str, usize> = rewritten
        .0
        .graph
        .iter()
        .flat_map(|g| g.node.iter().enumerate().flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i))))
        .collect();
    let mut outputs = Vec::new();
    for name in &graph_outputs {
        let (x, y) = a.get(name).zip(b.get(name)).ok_or_else(|| anyhow!("{name} is not computed by both models"))?;
        let (upstream, holders) = fused_upstream(rewritten.0, &producers, name, &fused);
        let in_bodies = holders.iter().filter_map(|i| body_types.get(i)).flatten();
        let written: Vec<i32> =
            upstream.iter().flat_map(|&i| &fused[i].output).filter_map(|o| a.get(o).map(|v| v.elem_type)).collect();
        let mut types = upstream.iter().flat_map(|&i| &passed_through[i]).chain(&written).chain(in_bodies);
        let tolerance = loosest(&mut types, x.elem_type);
        outputs.push(compare_values(name, None, x, y, tolerance));
    }
    // An output that differs is compared with two more runs of the
    // original, in a new session (a random op's generator starts anew with
    // each session, and goes on from run to run): where either differs
    // too, the original does not repeat itself there, and no comparison
    // can judge the rewrite by it.
    if outputs.iter().any(|c| !c.passed) {
        let which = "original (run again)";
        let mut session = load(env, original.0, original.1, which, &[], &mut reference_ops)?;
        let again =
            [run_session(&mut session, which, feeds(&inputs)?)?, run_session(&mut session, which, feeds(&inputs)?)?];
        for c in outputs.iter_mut().filter(|c| !c.passed) {
            let x = a.get(&c.name);
            let differ =
                again.iter().filter_map(|run| Some(compare_values(&c.name, None, x?, run.get(&c.name)?, c.tolerance)));
            c.unrepeatable = differ.filter(|itself| !itself.passed).map(|itself| itself.max_abs).reduce(f64::max);
        }
    }
    // An output that still differs, of a model with f16 or bf16 values, is
    // compared once more with every such value of both models fetched:
    // ONNX Runtime's CPU provider computes a chain of f16 ops in f32 and
    // rounds only where a value is fetched, so a rewrite that moves a
    // chain's ends (an upgrade's Flatten around an old Softmax) rounds
    // elsewhere than the original did. Fetched, each op's result is
    // rounded as ONNX defines it, in both.
    if outputs.iter().any(|c| !c.passed && c.unrepeatable.is_none()) {
        let (half_a, half_b) = (half_values(original.0), half_values(rewritten.0));
        let kept: Vec<&str> = half_a.iter().map(String::as_str).collect();
        if !half_a.is_empty() && check_kept(original.0, options, &kept, memory_available()).is_ok() {
            let which = ["original (every f16 value rounded)", "rewritten (every f16 value rounded)"];
            // (Where either does not run so, the outputs stand as compared.)
            let x = run(env, original.0, original.1, which[0], &half_a, feeds(&inputs)?, &mut reference_ops);
            let y = run(env, rewritten.0, rewritten.1, which[1], &half_b, feeds(&inputs)?, &mut reference_ops);
            let (x, y) = (x.unwrap_or_default(), y.unwrap_or_default());
            for c in outputs.iter_mut().filter(|c| !c.passed && c.unrepeatable.is_none()) {
                let Some((x, y)) = x.get(&c.name).zip(y.get(&c.name)) else { continue };
                let rounded = compare_values(&c.name, None, x, y, c.tolerance);
                if rounded.passed {
                    (c.passed, c.rounded) = (true, Some(rounded.max_abs));
                }
            }
        }
    }
    // Each fused node alone, on the original's values of its inputs.
    let mut nodes = Vec::new();
    for ((node, passed_through), (isolated, reads, outs)) in fused.iter().zip(&passed_through).zip(preludes) {
        let label = crate::rewrite::provenance_entry(node);
        let alone = isolate(rewritten.0, isolated, &reads, &outs, &a, &constants)?;
        let mut fed = Vec::new();
        for v in reads.iter().filter(|v| !constants.contains_key(v.as_str())) {
            let value = a.get(v).ok_or_else(|| anyhow!("the original does not compute {v}, which {label} reads"))?;
            fed.push(Input::from_values(v, value)?);
        }
        let got =
            run(env, &alone, rewritten.1, &format!("fused node {label} alone"), &[], feeds(&fed)?, &mut reference_ops)?;
        // Every output it has: a skip-norm's sum too.
        for out in &outs {
            let expected = a.get(out).ok_or_else(|| anyhow!("the original does not compute {out}"))?;
            let got = got.get(out).ok_or_else(|| anyhow!("{label} alone did not compute {out}"))?;
            let tolerance = loosest(&mut passed_through.iter(), expected.elem_type);
            let mut c = compare_values(out, Some(label.clone()), expected, got, tolerance);
            if !c.passed {
                c.exact = Some(exact::judge(env, original, node, out, &a, got, &mut reference_ops));
            }
            nodes.push(c);
        }
    }
    let blamed = nodes.iter().find(|c| !c.passed).and_then(|c| c.node.clone());
    nodes.sort_by(|p, q| q.badness.total_cmp(&p.badness));
    // Nodes alone decide only where the rewrite changed nothing else: every
    // other node of the rewritten graph stands in the original as it is.
    let elsewhere = !same_outside_fused(original.0, rewritten.0);
    let outputs_decide = !not_isolated.is_empty() || elsewhere;
    let judged = |c: &&Compared| c.unrepeatable.is_none();
    if outputs_decide && !outputs.is_empty() && !outputs.iter().any(|c| judged(&c)) {
        let names: Vec<&str> = outputs.iter().map(|c| c.name.as_str()).collect();
        bail!(
            "cannot verify: the original gives other values when run again on the same inputs, at every graph output \
             ({}), and the outputs decide here",
            names.join(", ")
        );
    }
    let passed = nodes.iter().all(|c| c.passed) && (!outputs_decide || outputs.iter().filter(judged).all(|c| c.passed));
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
/// the graph itself suggests (`candidate_sizes`) for the symbols onnx-fuse
/// made up: those neither `--dim` nor an array of `--inputs` sets. Returns
/// the inputs, the symbol values used, and the values.
#[allow(clippy::type_complexity)]
fn run_original(
    env: &ort::environment::Environment,
    original: (&ModelProto, &Path),
    options: &Options,
    probe: &[String],
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<(Vec<Input>, BTreeMap<String, i64>, HashMap<String, Values>)> {
    let symbols = input_symbols(original.0);
    let given = given_symbols(original.0, options);
    let unset: Vec<&String> = symbols.iter().filter(|s| !given.contains(*s) && !s.contains('+')).collect();
    // The sizes the model's shapes prove (an image's channels, from its
    // Conv's weight) are taken as given, not searched.
    // Taken only where the inputs they give fit the budget.
    let proved = proved_symbols(original.0, &unset);
    let user = options;
    let with_proved = Options { dims: user.dims.clone().into_iter().chain(proved.clone()).collect(), ..user.clone() };
    let (options, unset) = match check_budget(original.0, &with_proved, memory_available()) {
        Ok(_) => (&with_proved, unset.into_iter().filter(|s| !proved.contains_key(*s)).collect()),
        Err(_) => (user, unset),
    };
    // One session: every try runs it on other input sizes.
    let mut session = load(env, original.0, original.1, "original", probe, reference_ops)?;
    // The outer error is not about sizes (an array of the wrong type): no
    // other sizes are tried for it.
    let mut runs = |o: &Options| -> Result<Result<(Vec<Input>, BTreeMap<String, i64>, HashMap<String, Values>)>> {
        let inputs = synthesize_inputs(original.0, o)?;
        let feeds: Vec<(String, DynValue)> =
            inputs.iter().map(|i| Ok((i.name.clone(), i.to_value()?))).collect::<Result<_>>()?;
        let used = symbols.iter().filter(|s| !s.contains('+')).map(|s| (s.clone(), symbol_value(s, &o.dims))).collect();
        if let Err(e) = einsum_operands_fit(original.0, &inputs) {
            return Ok(Err(e));
        }
        Ok(run_session(&mut session, "original", feeds).map(|values| (inputs, used, values)))
    };
    let first = match runs(options)? {
        Ok(found) => return Ok(found),
        // Nothing made up to vary, and no size of the user's to blame.
        Err(e) if unset.is_empty() && (user.dims.is_empty() || user.inputs.is_some()) => return Err(e),
        Err(e) => e,
    };
    // Every try is within the budget before anything is allocated: a
    // weight axis of 4,096 given to channels, height and width at once
    // would be an image of 256 GiB.
    let graph = original.0.graph.as_ref().ok_or_else(|| anyhow!("the model has no graph"))?;
    let flow = search::Flow::new(graph);
    let by_input = symbols_by_input(original.0);
    let suggested = candidate_sizes(original.0);
    let available = memory_available();
    let fits = |o: &Options| {
        check_budget(original.0, o, available).is_ok() && check_kept(original.0, o, &[], available).is_ok()
    };
    // First, 24 tries at most: one symbol at 0 or 1 (an empty past:
    // Optimum's merged decoders declare the mask as long as the new tokens
    // only), then every symbol but the batch sizes at each size the graph
    // suggests, all at once.
    let mut tries: Vec<Options> = Vec::new();
    for s in &unset {
        for size in [0, 1] {
            let mut o = options.clone();
            o.dims.insert(s.to_string(), size);
            tries.push(o);
        }
    }
    for &size in suggested.iter().filter(|_| !unset.is_empty()) {
        let mut o = options.clone();
        let not_batch = unset.iter().filter(|s| !is_batch(s));
        o.dims.extend(not_batch.map(|s| (s.to_string(), size)));
        tries.push(o);
    }
    for o in tries.iter().filter(|o| fits(o)).take(24) {
        if let Ok(found) = runs(o)? {
            return Ok(found);
        }
    }
    // Then the search: one symbol, or two of one input, at 0, 1 and the
    // sizes the graph suggests (batch sizes at 0 and 1 only); a change is
    // kept where the run gets further.
    let (mut best, mut at, mut runs_left) = (options.clone(), search::failed_node(&first), SEARCH_RUNS);
    let moves = search::moves(&unset, &by_input);
    'search: loop {
        let mut moved = false;
        for change in &moves {
            let batch = change.iter().any(|s| is_batch(s));
            let touched: std::collections::HashSet<&str> = by_input
                .iter()
                .filter(|(_, of)| change.iter().any(|s| of.contains(s)))
                .map(|(i, _)| i.as_str())
                .collect();
            let sizes = [0, 1].into_iter().chain(suggested.iter().copied().filter(|_| !batch));
            for size in sizes {
                let mut o = best.clone();
                o.dims.extend(change.iter().map(|s| (s.to_string(), size)));
                if o.dims == best.dims || !fits(&o) {
                    continue;
                }
                if runs_left == 0 {
                    break 'search;
                }
                runs_left -= 1;
                let e = match runs(&o)? {
                    Ok(found) => return Ok(found),
                    Err(e) => e,
                };
                // An empty tensor runs past nodes that would fail on any
                // other size: 0 is tried, never kept.
                let now = search::failed_node(&e);
                if let (Some(before), Some(now), true) = (&at, now, size > 0) {
                    if flow.further(before, &now, &touched) {
                        (best, at, moved) = (o, Some(now), true);
                        break;
                    }
                }
            }
        }
        if !moved {
            break;
        }
    }
    // ONNX Runtime's message may span lines; the verdict is one.
    let first = crate::usage::one_line(&format!("{first:#}"));
    // Made-up sizes were the problem only if the user's were not: with the
    // user's `--dim` values replaced by onnx-fuse's, does the model run?
    if !user.dims.is_empty() && user.inputs.is_none() {
        let mut o = options.clone();
        o.dims.retain(|k, _| !user.dims.contains_key(k));
        if runs(&o)?.is_ok() {
            let mut gave: Vec<String> = user.dims.iter().map(|(k, v)| format!("--dim {k}={v}")).collect();
            gave.sort();
            bail!("{first}; the model does not run with the sizes given ({}), and runs without them", gave.join(" "));
        }
    }
    // The symbols it needs: those of the inputs the failing node depends on.
    let needed = at.as_deref().map(|node| flow.inputs_of(node));
    let needs = |s: &String| {
        needed
            .as_ref()
            .is_none_or(|inputs| by_input.iter().any(|(i, of)| inputs.contains(i.as_str()) && of.contains(s)))
    };
    let names: Vec<&str> = unset.iter().filter(|s| needs(s)).map(|s| s.as_str()).collect();
    let tried: Vec<String> = names.iter().map(|s| format!("{s}={}", symbol_value(s, &options.dims))).collect();
    let mut closest: Vec<String> = best
        .dims
        .iter()
        .filter(|(k, v)| options.dims.get(*k) != Some(v))
        .map(|(k, v)| format!("--dim {k}={v}"))
        .collect();
    closest.sort();
    let further = match (closest.is_empty(), &at) {
        (false, Some(node)) => format!(" (measured: with {} the run gets as far as {node})", closest.join(" ")),
        _ => String::new(),
    };
    bail!(
        "{first}; the sizes onnx-fuse chose ({}) do not fit the model, nor do the sizes its graph suggests: \
         give the ones it needs with --dim NAME=VALUE for {}{further}",
        tried.join(", "),
        names.join(", ")
    )
}

/// Runs the search may take, each on inputs within the budget.
const SEARCH_RUNS: usize = 256;

/// ONNX Runtime (1.31.1, measured) aborts the process, rather than failing
/// the run, on an Einsum whose operand has another number of axes than its
/// term has letters (a scalar fed for an input whose shape the model does
/// not declare, say). Such a run is refused with an error instead, as the
/// failed run it would be.
fn einsum_operands_fit(model: &ModelProto, inputs: &[Input]) -> Result<()> {
    use crate::onnx::proto::tensor_shape_proto::Dimension;
    let Some(graph) = model.graph.as_ref().filter(|g| has_einsum(g)) else { return Ok(()) };
    // The graph with its inputs declared at the shapes fed.
    let mut fed = graph.clone();
    for input in inputs {
        let declared = fed.input.iter_mut().find(|v| v.name() == input.name).and_then(|v| v.r#type.as_mut());
        if let Some(TypeValue::TensorType(t)) = declared.and_then(|t| t.value.as_mut()) {
            let dim = input.shape.iter().map(|&d| Dimension { value: Some(Dim::DimValue(d)), ..Default::default() });
            t.shape = Some(crate::onnx::proto::TensorShapeProto { dim: dim.collect() });
        }
    }
    einsums_fit(&fed, model.default_opset(), &crate::graph::Scope::default())
}

/// ONNX Runtime (1.31.1, measured) aborts the process on a `RandomNormal`
/// or `RandomNormalLike` whose `scale` is not above 0 (its C++ library's
/// normal distribution asserts a positive spread). Such a model is refused
/// with an error before any session is made.
fn normal_spreads_positive(graph: &crate::onnx::GraphProto) -> Result<()> {
    for node in &graph.node {
        node.subgraphs().try_for_each(normal_spreads_positive)?;
        let random = node.is("RandomNormal") || node.is("RandomNormalLike");
        let scale = node.attr_float("scale").unwrap_or(1.0);
        if random && crate::onnx::is_default_domain(node.domain()) && !(scale > 0.0) {
            bail!(
                "{} {} has scale {scale}, and ONNX Runtime aborts on a normal distribution whose spread is not above 0",
                node.op_type(),
                node.name()
            );
        }
    }
    Ok(())
}

fn has_einsum(g: &crate::onnx::GraphProto) -> bool {
    g.node.iter().any(|n| n.is("Einsum") || n.subgraphs().any(has_einsum))
}

/// `einsum_operands_fit` in `graph` and its bodies, each with what the
/// graphs around it make visible.
fn einsums_fit(graph: &crate::onnx::GraphProto, opset: i64, outer: &crate::graph::Scope) -> Result<()> {
    let view = crate::graph::Graph::new(graph, opset, outer);
    let shapes = view.shapes();
    for (i, node) in graph.node.iter().enumerate() {
        if node.subgraphs().next().is_some() {
            let mut scope = view.scope_for_subgraphs();
            scope.hide(view.hidden_from_bodies_of(i));
            node.subgraphs().try_for_each(|body| einsums_fit(body, opset, &scope))?;
        }
        let Some((terms, _)) = node.einsum_terms().filter(|_| node.is("Einsum")) else { continue };
        for (term, operand) in terms.iter().zip(&node.input).filter(|(t, _)| !t.contains('.')) {
            let letters = term.chars().count();
            if let Some(rank) = shapes.rank(operand).filter(|&r| r != letters) {
                bail!(
                    "Einsum {} reads {operand} of rank {rank} where its equation has {letters} letters (ONNX Runtime \
                     aborts on it; give the inputs' shapes with --inputs)",
                    node.name()
                );
            }
        }
    }
    Ok(())
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
    // A node computing only values the original does not have (a guard's
    // condition) changes nothing the original computes: a node reading it
    // is a fused node or stands in the original with other inputs.
    let computed: std::collections::HashSet<&str> =
        a.node.iter().flat_map(|n| n.output.iter().map(String::as_str)).collect();
    let new = |n: &NodeProto| n.output.iter().all(|o| !computed.contains(o.as_str()));
    // A node reading what a fused node writes and the original does not (the
    // Reshape viewing a 3-D rotary back as heads) is part of that fused node.
    let by_fused: std::collections::HashSet<&str> = b
        .node
        .iter()
        .filter(|f| f.metadata(FUSED_KEY).is_some())
        .flat_map(|f| f.output.iter().map(String::as_str))
        .filter(|o| !computed.contains(o))
        .collect();
    let fused_view = |n: &NodeProto| n.input.iter().any(|v| by_fused.contains(v.as_str()));
    let outside = |n: &&NodeProto| n.metadata(FUSED_KEY).is_none() && !new(n) && !fused_view(n);
    // An initializer of a name the original does not use at all (a norm's
    // weight of ones) changes nothing it computes: a node outside reading
    // it stands in the original with other inputs.
    let used = |name: &str| computed.contains(name) || a.input.iter().any(|i| i.name() == name);
    let kept = |t: &crate::onnx::TensorProto| match initializers.get(t.name()) {
        Some(o) => *o == t,
        None => !used(t.name()),
    };
    b.node.iter().filter(outside).all(|n| nodes.contains(&n.encode_to_vec())) && b.initializer.iter().all(kept)
}

/// The fused nodes of `fused` (main graph) that the value `out` of the
/// main graph is computed from, by their places in `fused`, and the nodes
/// holding bodies that it is computed from, by their places in the graph
/// (`producers`: the main graph's node computing each value).
fn fused_upstream(
    model: &ModelProto,
    producers: &HashMap<&str, usize>,
    out: &str,
    fused: &[&NodeProto],
) -> (Vec<usize>, Vec<usize>) {
    let Some(g) = &model.graph else { return (vec![], vec![]) };
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::from([out.to_string()]);
    let (mut todo, mut found, mut holders) = (vec![out.to_string()], Vec::new(), Vec::new());
    while let Some(v) = todo.pop() {
        let Some(&i) = producers.get(v.as_str()) else { continue };
        let n = &g.node[i];
        if let Some(f) = fused.iter().position(|f| std::ptr::eq(*f, n)) {
            found.push(f);
        }
        if n.subgraphs().next().is_some() {
            holders.push(i);
        }
        for r in crate::graph::values_read_by(n) {
            if seen.insert(r.clone()) {
                todo.push(r);
            }
        }
    }
    (found, holders)
}

/// For each node of the main graph that holds bodies with fused nodes, the
/// element types those fused nodes read and write (as far as known).
fn fused_types_in_bodies(model: &ModelProto) -> HashMap<usize, Vec<i32>> {
    let mut types = HashMap::new();
    let Some(g) = &model.graph else { return types };
    let outer = Scope::default();
    let view = crate::graph::Graph::new(g, model.default_opset(), &outer);
    for (i, node) in g.node.iter().enumerate().filter(|(_, n)| n.subgraphs().next().is_some()) {
        let mut scope = view.scope_for_subgraphs();
        scope.hide(view.hidden_from_bodies_of(i));
        let mut found = Vec::new();
        node.subgraphs().for_each(|body| fused_types_in(body, model.default_opset(), &scope, &mut found));
        if !found.is_empty() {
            types.insert(i, found);
        }
    }
    types
}

/// The element types the fused nodes of `graph` and its bodies read and
/// write, where known.
fn fused_types_in(graph: &crate::onnx::GraphProto, opset: i64, outer: &Scope, types: &mut Vec<i32>) {
    let view = crate::graph::Graph::new(graph, opset, outer);
    for (i, node) in graph.node.iter().enumerate() {
        if node.metadata(FUSED_KEY).is_some() {
            types.extend(node.input.iter().chain(&node.output).filter_map(|v| view.elem_type(v)));
        }
        if node.subgraphs().next().is_some() {
            let mut scope = view.scope_for_subgraphs();
            scope.hide(view.hidden_from_bodies_of(i));
            node.subgraphs().for_each(|body| fused_types_in(body, opset, &scope, types));
        }
    }
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

/// A fused node with the nodes of the rewritten graph that compute what it
/// reads and the original does not (the condition of a guard), and those
/// that turn an output the original does not compute into one it does
/// (the Reshape that views a 3-D rotary back as heads), in order; the
/// values they read from the original (inputs, and what bodies capture);
/// and the outputs to compare.
fn with_prelude(
    model: &ModelProto,
    node: &NodeProto,
    computed: &std::collections::HashSet<&str>,
) -> (Vec<NodeProto>, Vec<String>, Vec<String>) {
    let producers: HashMap<&str, &NodeProto> = model
        .graph
        .iter()
        .flat_map(|g| g.node.iter().flat_map(|n| n.output.iter().map(move |o| (o.as_str(), n))))
        .collect();
    let mut nodes = vec![node.clone()];
    let mut reads: Vec<String> = Vec::new();
    let mut at = 0;
    while at < nodes.len() {
        for v in crate::graph::values_read_by(&nodes[at]) {
            let made_here = nodes.iter().any(|n| n.output.contains(&v));
            if made_here || reads.contains(&v) {
                continue;
            }
            match producers.get(v.as_str()).filter(|_| !computed.contains(v.as_str())) {
                Some(p) => nodes.push((*p).clone()),
                None => reads.push(v),
            }
        }
        at += 1;
    }
    nodes.reverse();
    let mut outputs = Vec::new();
    for out in node.output.iter().filter(|o| !o.is_empty()) {
        if computed.contains(out.as_str()) {
            outputs.push(out.clone());
            continue;
        }
        for view in model.graph.iter().flat_map(|g| &g.node).filter(|n| n.input.contains(out)) {
            for v in view.input.iter().filter(|v| *v != out) {
                if !reads.contains(v) {
                    reads.push(v.clone());
                }
            }
            outputs.extend(view.output.iter().filter(|o| computed.contains(o.as_str())).cloned());
            nodes.push(view.clone());
        }
    }
    (nodes, reads, outputs)
}

/// A model of `nodes` alone (a fused node and what computes its guard)
/// computing `outputs`: the values they read become graph inputs (typed as
/// the original's values), or initializers where constant, with the
/// rewritten model's opsets and functions.
fn isolate(
    model: &ModelProto,
    nodes: Vec<NodeProto>,
    reads: &[String],
    outputs: &[String],
    values: &HashMap<String, Values>,
    constants: &HashMap<&str, crate::onnx::TensorProto>,
) -> Result<ModelProto> {
    use crate::onnx::{GraphProto, TensorProto};
    let mut graph = GraphProto { name: Some("fused node alone".into()), node: nodes, ..Default::default() };
    for v in reads.iter().filter(|v| !v.is_empty()) {
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
    for out in outputs {
        let elem = values.get(out).map_or(0, |v| v.elem_type);
        graph.output.push(tensor_info(out, elem, None));
    }
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

/// The values the main graph's nodes compute in f16 or bf16, but its
/// outputs.
fn half_values(model: &ModelProto) -> Vec<String> {
    let Some(graph) = model.graph.as_ref() else { return vec![] };
    let scope = Scope::default();
    let view = crate::graph::Graph::new(graph, model.default_opset(), &scope);
    let half = |v: &&String| {
        !v.is_empty() && matches!(view.elem_type(v), Some(FLOAT16 | BFLOAT16)) && !view.is_graph_output(v)
    };
    graph.node.iter().flat_map(|n| n.output.iter().filter(half)).cloned().collect()
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
