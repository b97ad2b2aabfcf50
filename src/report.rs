//! What a run did, for people (`--report`) and for programs (`--report-json`).
//! The JSON schema is documented in docs/report-json.md.

use std::fmt::Write;

use serde::Serialize;

use crate::onnx::{display_name, GraphProto, ModelProto, FUSED_KEY};
use crate::passes::GROUPED_HEADS;
use crate::rewrite::{body_path, Absorbed, Declined, Fused, Outcome, Pass};
use crate::verify::Verified;

#[derive(Debug, Serialize)]
pub struct Report {
    /// Version of the report's JSON layout.
    pub schema: u32,
    pub input: String,
    pub output: String,
    /// What the output may contain (`--target`).
    pub target: crate::graph::Target,
    /// For the `ort` target: known runtimes and checkers that cannot load
    /// what this run wrote, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_loaded_by: Vec<String>,
    /// ONNX Runtime's tools of a user's pipeline (its quantizers and their
    /// symbolic shape inference) that stop on what this run wrote, each
    /// with the command that works instead (measured: docs/pipeline.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_taken_by: Vec<String>,
    /// `--opset N`: the upgrade before the passes, every node it adapted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<crate::upgrade::Upgrade>,
    /// What each pass fused, whether or not a later pass took the node it
    /// wrote into its own (adding a pass never lowers another's count).
    pub passes: Vec<PassCount>,
    /// The fused nodes in the output: `fused`'s length.
    pub total: usize,
    /// The fused nodes in the output.
    pub fused: Vec<Fused>,
    /// Fused nodes a later pass took into its own node (skip-norm's
    /// residual Add joined to a norm): counted for their pass, not in the
    /// output.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub absorbed: Vec<Absorbed>,
    /// What `--opset N` would add (`--target portable`, where candidates
    /// were declined because the model's opset lacks the op): set by the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs_opset: Option<NeedsOpset>,
    /// What the user must know about the output (e.g. runtimes it needs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cautions: Vec<String>,
    /// Filled only with `--explain`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declined: Vec<Declined>,
    /// Filled only with `--verify`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verified>,
    /// What the exact cleanup after the passes removed (absent with
    /// `--no-cleanup`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleanup: Option<crate::cleanup::Cleanup>,
    /// Node counts of every op type the run changed, before and after.
    pub ops: Vec<OpCount>,
    /// `--expect` / `--expect-min` and whether each was met.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expectations: Vec<Checked>,
    /// Whether the output was written (not after a failed verification).
    pub written: bool,
    /// `--external-data`: the file beside the output that holds its weights.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
}

/// How many nodes of one op type (`domain.OpType` outside the default
/// domain) the model had before and after the run, in every graph.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct OpCount {
    pub op_type: String,
    pub before: usize,
    pub after: usize,
}

/// Node counts per op type (`domain.OpType` outside the default domain),
/// over every graph of a model.
pub fn op_counts(model: &ModelProto) -> std::collections::BTreeMap<String, usize> {
    fn walk(g: &GraphProto, counts: &mut std::collections::BTreeMap<String, usize>) {
        for n in &g.node {
            // A guard counts as the kernel it runs; the original ops it
            // keeps for the other inputs are not counted again.
            if let Some(runs) = n.metadata(crate::onnx::RUNS_KEY) {
                *counts.entry(runs.to_string()).or_default() += 1;
                continue;
            }
            let name = if crate::onnx::is_default_domain(n.domain()) {
                n.op_type().to_string()
            } else {
                format!("{}.{}", n.domain(), n.op_type())
            };
            *counts.entry(name).or_default() += 1;
            n.subgraphs().for_each(|b| walk(b, counts));
        }
    }
    let mut counts = Default::default();
    model.graph.iter().for_each(|g| walk(g, &mut counts));
    counts
}

/// The op types whose counts differ between `before` and `after`.
pub fn op_changes(
    before: &std::collections::BTreeMap<String, usize>,
    after: &std::collections::BTreeMap<String, usize>,
) -> Vec<OpCount> {
    let names: std::collections::BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    names
        .into_iter()
        .map(|op| OpCount {
            op_type: op.clone(),
            before: before.get(op).copied().unwrap_or(0),
            after: after.get(op).copied().unwrap_or(0),
        })
        .filter(|c| c.before != c.after)
        .collect()
}

/// What the user expects a run to fuse: `PASS=N` exactly or at least.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Expectation {
    /// A pass name, or `total`.
    pub pass: String,
    /// `exact` (--expect) or `min` (--expect-min).
    pub kind: &'static str,
    pub expected: usize,
    /// In a folder run, the one file it is about (`FILE:PASS=N`); else the
    /// folder's totals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// An expectation with what was found.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Checked {
    #[serde(flatten)]
    pub expectation: Expectation,
    pub found: usize,
    pub met: bool,
}

impl Expectation {
    /// Parses `[FILE:]PASS=N`; the pass must be one of `known` or `total`.
    pub fn parse(text: &str, kind: &'static str, known: &[&str]) -> Result<Expectation, String> {
        let (target, n) = text.split_once('=').ok_or_else(|| format!("{text:?}: expected PASS=N"))?;
        let expected = n.trim().parse().map_err(|_| format!("{text:?}: {n:?} is not a count"))?;
        let (file, pass) = match target.rsplit_once(':') {
            Some((file, pass)) => (Some(file.to_string()), pass),
            None => (None, target),
        };
        if pass != "total" && !known.contains(&pass) {
            return Err(format!("{text:?}: no pass is called {pass:?} (known: total, {})", known.join(", ")));
        }
        Ok(Expectation { pass: pass.to_string(), kind, expected, file })
    }

    /// Checks it against per-pass counts and the fused nodes in the output
    /// (`total`).
    pub fn check(&self, counts: &[PassCount], total: usize) -> Checked {
        let found = if self.pass == "total" {
            total
        } else {
            counts.iter().find(|c| c.name == self.pass).map_or(0, |c| c.fused)
        };
        let met = if self.kind == "exact" { found == self.expected } else { found >= self.expected };
        Checked { expectation: self.clone(), found, met }
    }
}

impl Checked {
    /// `rms-norm: expected 5, found 3` (`at least 5` for a minimum).
    pub fn text(&self) -> String {
        let e = &self.expectation;
        let least = if e.kind == "min" { "at least " } else { "" };
        let file = e.file.as_deref().map(|f| format!("{f}: ")).unwrap_or_default();
        format!("{file}{}: expected {least}{}, found {}", e.pass, e.expected, self.found)
    }
}

/// What an upgrade to the opset the declined candidates need would fuse.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct NeedsOpset {
    /// The newest opset any of them needs.
    pub opset: i64,
    /// How many more fusions the run makes with `--opset` that opset
    /// (counted by running the passes on the upgraded model).
    pub candidates: usize,
    /// Why the model cannot be upgraded to it, if it cannot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PassCount {
    pub name: &'static str,
    /// The nodes this pass fused, those a later pass absorbed included.
    pub fused: usize,
    /// Of those, the ones still in the output.
    pub in_output: usize,
    /// Of those, how many each later pass took into its own nodes.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub absorbed: std::collections::BTreeMap<&'static str, usize>,
}

impl PassCount {
    /// `pass`'s count in `fused` (in the output) and `absorbed`.
    pub fn of(pass: &'static str, fused: &[Fused], absorbed: &[Absorbed]) -> Self {
        let in_output = fused.iter().filter(|f| f.pass == pass).count();
        let mut by = std::collections::BTreeMap::new();
        for a in absorbed.iter().filter(|a| a.fused.pass == pass) {
            *by.entry(a.by).or_default() += 1;
        }
        PassCount { name: pass, fused: in_output + by.values().sum::<usize>(), in_output, absorbed: by }
    }

    /// The sum of several (a folder's files).
    pub fn sum<'a>(name: &'static str, counts: impl Iterator<Item = &'a PassCount>) -> Self {
        let mut total = PassCount { name, fused: 0, in_output: 0, absorbed: Default::default() };
        for c in counts.filter(|c| c.name == name) {
            total.fused += c.fused;
            total.in_output += c.in_output;
            for (by, n) in &c.absorbed {
                *total.absorbed.entry(by).or_default() += n;
            }
        }
        total
    }
}

/// `rms-norm 5 (2 of them with their residual Add: skip-norm 2), attention 2`:
/// each pass's count, with what later passes absorbed of it; a pass whose
/// every node is named inside another's parentheses is not listed again.
pub fn counts_text(passes: &[PassCount]) -> String {
    let absorbs = |name: &str| crate::passes::ALL.iter().find(|p| p.name == name).and_then(|p| p.absorbs);
    let absorbs = |name: &str| absorbs(name).unwrap_or("absorbed");
    let named: std::collections::HashMap<&str, usize> = passes.iter().fold(Default::default(), |mut m, p| {
        for (by, n) in &p.absorbed {
            *m.entry(*by).or_default() += n;
        }
        m
    });
    let shown = passes.iter().filter(|p| p.fused == 0 || named.get(p.name).is_none_or(|&n| n < p.fused));
    let text = shown.map(|p| {
        let inner: Vec<String> =
            p.absorbed.iter().map(|(by, n)| format!("{n} of them {}: {by} {n}", absorbs(by))).collect();
        if inner.is_empty() {
            format!("{} {}", p.name, p.fused)
        } else {
            format!("{} {} ({})", p.name, p.fused, inner.join("; "))
        }
    });
    text.collect::<Vec<_>>().join(", ")
}

impl Report {
    pub fn new(input: String, output: String, pipeline: &[&Pass], outcome: Outcome, explain: bool) -> Self {
        let passes = pipeline.iter().map(|p| PassCount::of(p.name, &outcome.fused, &outcome.absorbed)).collect();
        let declined = if explain { outcome.declined } else { Vec::new() };
        let cautions = pipeline
            .iter()
            .filter(|p| outcome.fused.iter().any(|f| f.pass == p.name))
            .filter_map(|p| p.caution.map(|c| format!("{}: {c}", p.name)))
            .collect();
        Report {
            schema: 1,
            input,
            output,
            target: crate::graph::Target::Ort,
            not_loaded_by: Vec::new(),
            not_taken_by: Vec::new(),
            upgrade: None,
            passes,
            total: outcome.fused.len(),
            fused: outcome.fused,
            absorbed: outcome.absorbed,
            needs_opset: None,
            cautions,
            declined,
            verification: None,
            cleanup: None,
            ops: Vec::new(),
            expectations: Vec::new(),
            written: false,
            weights: None,
        }
    }

    /// The summary printed unless `--quiet`: one line, and a warning line
    /// per caution.
    pub fn summary(&self) -> String {
        let upgraded = match &self.upgrade {
            Some(u) if u.from != u.to => format!("opset {} -> {} ({} nodes adapted), ", u.from, u.to, u.adapted.len()),
            _ => String::new(),
        };
        let mut s = format!(
            "{}: {upgraded}fused {} ({}) -> {}",
            self.input,
            self.total,
            counts_text(&self.passes),
            self.output
        );
        if let Some(w) = &self.weights {
            s.push_str(&format!(" (weights in {w})"));
        }
        match &self.needs_opset {
            Some(NeedsOpset { refused: Some(why), opset, .. }) => {
                s.push_str(&format!("; candidates need opset {opset}, and the model cannot be upgraded to it: {why}"))
            }
            Some(n) => {
                let candidates = if n.candidates == 1 { "candidate needs" } else { "candidates need" };
                s.push_str(&format!("; {} {candidates} opset {}: add --opset {}", n.candidates, n.opset, n.opset));
            }
            None => {}
        }
        for c in &self.cautions {
            s.push_str(&format!("\nwarning: {c}"));
        }
        s
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        if let Some(u) = self.upgrade.as_ref().filter(|u| u.from != u.to) {
            let _ = writeln!(
                s,
                "upgraded from opset {} to {}: {} nodes adapted, {} added",
                u.from,
                u.to,
                u.adapted.len(),
                u.added_nodes
            );
            for a in &u.adapted {
                let place = if a.graph == "main" { String::new() } else { format!(" (in {})", a.graph) };
                let _ = writeln!(
                    s,
                    "    {} {}{place}, {} to {}: {}",
                    a.op_type,
                    a.node,
                    a.from_version,
                    a.to_version,
                    a.changes.join("; ")
                );
            }
            s.push('\n');
        }
        for p in &self.passes {
            let absorbed: Vec<String> = p.absorbed.iter().map(|(by, n)| format!("{n} taken into {by} nodes")).collect();
            let absorbed = if absorbed.is_empty() { String::new() } else { format!(" ({})", absorbed.join(", ")) };
            let _ = writeln!(s, "{:<12} {} fused{absorbed}", p.name, p.fused);
        }
        for f in &self.fused {
            let place = if f.graph == "main" { String::new() } else { format!(" (in {})", f.graph) };
            let guard = f
                .guard
                .as_ref()
                .map_or(String::new(), |g| format!(" (guarded by {g}: the original ops run where it fails)"));
            let _ = writeln!(s, "\n{} {}{place}  [{}]{guard}", f.op_type, f.name, f.pass);
            if let Some(note) = &f.note {
                let _ = writeln!(s, "  ({note})");
            }
            for r in &f.replaced {
                let _ = writeln!(s, "    {r}");
            }
        }
        for d in &self.declined {
            let _ = writeln!(s, "\nnot fused by {} at {} ({}): {}", d.pass, d.node, d.graph, d.reason);
        }
        if !self.not_loaded_by.is_empty() {
            let _ = writeln!(s, "\ntarget ort: not loaded by {}", self.not_loaded_by.join("; "));
        }
        if !self.not_taken_by.is_empty() {
            let _ = writeln!(s, "\nnot taken by {}", self.not_taken_by.join("; "));
        }
        if let Some(c) = self.cleanup.as_ref().filter(|c| c.removed > 0 || c.added > 0) {
            let _ = writeln!(
                s,
                "\ncleanup: {} nodes removed ({} constant on every run, {} twins, {} proved equal, {} unread), {} \
                 Constants added ({} Reshape targets)",
                c.removed,
                c.count("constant"),
                c.count("twin"),
                c.count("equal"),
                c.count("unread"),
                c.added,
                c.reshape_targets
            );
            let by_op: Vec<String> = c.by_op().iter().map(|(op, n)| format!("{op} {n}")).collect();
            let _ = writeln!(s, "    {}", by_op.join(", "));
        }
        s.push_str(&ops_table(&self.ops));
        s
    }

    /// Sets the target and what the output `model` meets next: for `ort`,
    /// the known runtimes and checkers that cannot load the ops this run
    /// wrote; for both, ONNX Runtime's tools that stop on them.
    pub fn set_target(&mut self, target: crate::graph::Target, model: &ModelProto) {
        self.target = target;
        self.not_loaded_by.clear();
        self.not_taken_by = not_taken_by(&self.fused, model);
        if target != crate::graph::Target::Ort {
            return;
        }
        let opset = model.default_opset();
        let wrote = |op: &str| self.fused.iter().any(|f| f.op_type == op);
        if wrote("AttentionCore") {
            self.not_loaded_by.push(
                "OpenVINO and tract (transmuter.AttentionCore: a local function in a custom domain; --target portable \
                 writes ONNX Attention for unmasked cores from opset 23 and leaves the others as they are)"
                    .into(),
            );
        }
        // Measured on every testdata output (scripts/check_runtimes.py,
        // docs/targets.md): runtimes other than ONNX Runtime on the guards
        // and kernels this target writes.
        let guards = self.fused.iter().filter(|f| f.guard.is_some()).count();
        if guards > 0 {
            self.not_loaded_by.push(
                "OpenVINO, right only from its second call (an If guard: its first call after compile_model \
                 returns zeros, NaN or other values, also with the original ops in both branches; measured on \
                 2026.4.1)"
                    .into(),
            );
        }
        if guards > 1 {
            self.not_loaded_by.push(
                "tract, where two or more If guards are written (0.23.9 names each \"If\": duplicate node name)".into(),
            );
        }
        if self.fused.iter().any(|f| f.note.as_deref().is_some_and(|n| n.starts_with(GROUPED_HEADS))) {
            self.not_loaded_by.push(
                "OpenVINO, where an Attention's query and key heads differ in number and are not known numbers \
                 when it compiles (2026.4.1: \"Key input shape not compatible\"; known numbers compute the same)"
                    .into(),
            );
        }
        // onnx.checker does not check ops of a domain it does not know:
        // com.microsoft's pass `check_model(full_check=True)` (onnx 1.23.2,
        // measured), so they are no reason here.
        if wrote("QuickGelu") {
            self.not_loaded_by.push("OpenVINO, where a QuickGelu is f16 (measured on 2026.4.1; f32 loads)".into());
        }
        if wrote("SimplifiedLayerNormalization") || (wrote("LayerNormalization") && opset < 17) {
            self.not_loaded_by.push(
                "onnx.checker (SimplifiedLayerNormalization, or LayerNormalization below opset 17: ONNX Runtime's \
                 registrations)"
                    .into(),
            );
        }
    }
}

/// ONNX Runtime's Python tools (1.31.1, measured on every testdata export:
/// docs/pipeline.md, docs/targets.md) that stop on the `fused` nodes of the
/// output `model`, each with the command that works instead.
fn not_taken_by(fused: &[Fused], model: &ModelProto) -> Vec<String> {
    let mut tools = Vec::new();
    // Both dispatch on the op type alone and read ONNX's Attention as
    // com.microsoft's.
    if fused.iter().any(|f| f.op_type == "Attention") {
        tools.push(
            "ONNX Runtime's symbolic shape inference (run by quant_pre_process and its transformers optimizer), \
             which reads ONNX Attention as com.microsoft's and stops: instead quant_pre_process(in, out, \
             skip_symbolic_shape=True), or fuse with --keep-opset"
                .to_string(),
        );
    }
    if fused.iter().any(|f| f.op_type == "Attention" && f.guard.is_none() && f.graph == "main") {
        tools.push(
            "quantize_dynamic, which writes an ONNX Attention outside a guard as com.microsoft.QAttention, a model \
             ONNX Runtime refuses: instead quantize_dynamic(in, out, op_types_to_quantize=[op for op in \
             IntegerOpsRegistry if op != 'Attention'])"
                .to_string(),
        );
    }
    // The tool infers the call through ONNX's inference of the function,
    // which cannot read a shape computed outside it: new symbols for its
    // output, which it merges with the model's only with auto_merge.
    if model.graph.as_ref().is_some_and(views_at_run_time) {
        tools.push(
            "ONNX Runtime's symbolic shape inference without auto_merge (quant_pre_process's default), where a \
             transmuter.AttentionCore views its scores in a shape computed at run time (BLOOM): it gives the \
             core's output new symbols and stops where they meet the model's: instead quant_pre_process(in, out, \
             auto_merge=True), or skip_symbolic_shape=True"
                .to_string(),
        );
    }
    tools
}

/// Whether an `AttentionCore` of the graph, or of a body in it, reshapes
/// its scores or probabilities to a shape read from outside the core (its
/// form has a `reshape_input` step: docs/attention-core.md).
fn views_at_run_time(graph: &GraphProto) -> bool {
    graph.node.iter().any(|n| {
        let core = n.domain() == crate::onnx::TRANSMUTER_DOMAIN && n.op_type() == "AttentionCore";
        let viewed = n.overload().split('.').any(|t| t.starts_with("reshape_input"));
        (core && viewed) || n.subgraphs().any(views_at_run_time)
    })
}

/// The before/after table of the op types a run changed.
pub fn ops_table(ops: &[OpCount]) -> String {
    let mut s = String::new();
    if ops.is_empty() {
        return s;
    }
    let width = ops.iter().map(|o| o.op_type.len()).max().unwrap_or(0).max(7);
    let _ = writeln!(s, "\n{:<width$}  {:>6}  {:>6}", "op type", "before", "after");
    for o in ops {
        let _ = writeln!(s, "{:<width$}  {:>6}  {:>6}", o.op_type, o.before, o.after);
    }
    s
}

/// A fused node a model contains, read back from its `transmuter.fused`
/// entry (`onnx-fuse show`): the report's `fused` entry without the pass.
#[derive(Debug, Serialize)]
pub struct Found {
    pub op_type: String,
    /// `If` where the node is a guard running `op_type` (see `Fused`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
    pub name: String,
    /// `main`, or `main/<node>.<attribute>` for a subgraph body.
    pub graph: String,
    /// The replaced nodes, as `OpType name`.
    pub replaced: Vec<String>,
}

/// Every fused node of a model, in graph order, bodies after their holder.
pub fn fused_in(model: &ModelProto) -> Vec<Found> {
    fn walk(g: &GraphProto, path: &str, found: &mut Vec<Found>) {
        for node in &g.node {
            if let Some(list) = node.metadata(FUSED_KEY) {
                let runs = node.metadata(crate::onnx::RUNS_KEY);
                found.push(Found {
                    op_type: runs.unwrap_or(node.op_type()).to_string(),
                    guard: runs.map(|_| node.op_type().to_string()),
                    name: node.name().to_string(),
                    graph: path.to_string(),
                    replaced: list.split(", ").map(str::to_string).collect(),
                });
            }
            for a in &node.attribute {
                for (i, body) in a.g.iter().chain(&a.graphs).enumerate() {
                    walk(body, &body_path(path, &display_name(node), a.name(), i), found);
                }
            }
        }
    }
    let mut found = Vec::new();
    if let Some(g) = &model.graph {
        walk(g, "main", &mut found);
    }
    found
}
