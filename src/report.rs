//! What a run did, for people (`--report`) and for programs (`--report-json`).
//! The JSON schema is documented in docs/report-json.md.

use std::fmt::Write;

use serde::Serialize;

use crate::onnx::{GraphProto, ModelProto, FUSED_KEY};
use crate::rewrite::{body_path, display_name, Declined, Fused, Outcome, Pass};
use crate::verify::Verification;

#[derive(Debug, Serialize)]
pub struct Report {
    /// Version of the report's JSON layout.
    pub schema: u32,
    pub input: String,
    pub output: String,
    pub passes: Vec<PassCount>,
    pub fused: Vec<Fused>,
    /// What the user must know about the output (e.g. runtimes it needs).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cautions: Vec<String>,
    /// Filled only with `--explain`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub declined: Vec<Declined>,
    /// Filled only with `--verify`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
}

#[derive(Debug, Serialize)]
pub struct PassCount {
    pub name: &'static str,
    pub fused: usize,
}

impl Report {
    pub fn new(input: String, output: String, pipeline: &[&Pass], outcome: Outcome, explain: bool) -> Self {
        let passes = pipeline
            .iter()
            .map(|p| PassCount { name: p.name, fused: outcome.fused.iter().filter(|f| f.pass == p.name).count() })
            .collect();
        let declined = if explain { outcome.declined } else { Vec::new() };
        let cautions = pipeline
            .iter()
            .filter(|p| outcome.fused.iter().any(|f| f.pass == p.name))
            .filter_map(|p| p.caution.map(|c| format!("{}: {c}", p.name)))
            .collect();
        Report { schema: 1, input, output, passes, fused: outcome.fused, cautions, declined, verification: None }
    }

    /// The summary printed unless `--quiet`: one line, and a warning line
    /// per caution.
    pub fn summary(&self) -> String {
        let counts: Vec<String> = self.passes.iter().map(|p| format!("{} {}", p.name, p.fused)).collect();
        let mut s = format!("{}: fused {} ({}) -> {}", self.input, self.fused.len(), counts.join(", "), self.output);
        for c in &self.cautions {
            s.push_str(&format!("\nwarning: {c}"));
        }
        s
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        for p in &self.passes {
            let _ = writeln!(s, "{:<12} {} fused", p.name, p.fused);
        }
        for f in &self.fused {
            let place = if f.graph == "main" { String::new() } else { format!(" (in {})", f.graph) };
            let _ = writeln!(s, "\n{} {}{place}  [{}]", f.op_type, f.name, f.pass);
            for r in &f.replaced {
                let _ = writeln!(s, "    {r}");
            }
        }
        for d in &self.declined {
            let _ = writeln!(s, "\nnot fused by {} at {} ({}): {}", d.pass, d.node, d.graph, d.reason);
        }
        s
    }
}

/// The fused nodes a model already contains, read back from their
/// `transmuter.fused` entries (for `onnx-fuse show`).
pub fn fused_in(model: &ModelProto) -> Vec<(String, String, Vec<String>)> {
    fn walk(g: &GraphProto, path: &str, found: &mut Vec<(String, String, Vec<String>)>) {
        for node in &g.node {
            if let Some(list) = node.metadata(FUSED_KEY) {
                let name = if path == "main" { node.name().to_string() } else { format!("{path}/{}", node.name()) };
                found.push((node.op_type().to_string(), name, list.split(", ").map(str::to_string).collect()));
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
