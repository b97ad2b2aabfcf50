//! Passes independent of each other (issue 39): leaving a pass out of the
//! pipeline (`--disable`) never lowers another pass's count, on every
//! testdata export, both targets. The exception is the one the passes are
//! built on: skip-norm reads the norms layer-norm and rms-norm write, so
//! without them it finds only the norms the export already had.

mod common;

use std::collections::BTreeMap;

use common::{exports, in_parallel};
use onnx_fuse::graph::Target;
use onnx_fuse::{passes, report, rewrite};

/// What `pass` is built on: leaving one of these out may lower its count.
fn builds_on(pass: &str) -> &'static [&'static str] {
    match pass {
        "skip-norm" => &["layer-norm", "rms-norm"],
        _ => &[],
    }
}

/// Each pass's count when `names` run on the export for `target`.
fn counts(name: &str, names: &[&str], target: Target) -> BTreeMap<&'static str, usize> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let pipeline = passes::pipeline(&names, &[]).expect("known passes");
    let mut model = common::load(name);
    let outcome = rewrite::run_for(&mut model, &pipeline, target);
    let report = report::Report::new(name.into(), "out.onnx".into(), &pipeline, outcome, false);
    report.passes.iter().map(|p| (p.name, p.fused)).collect()
}

/// The passes whose count fell when one pass was left out, for one export.
fn lowered(name: &str) -> (usize, Vec<String>) {
    let every: Vec<&str> = passes::ALL.iter().map(|p| p.name).collect();
    let (mut runs, mut found) = (0, vec![]);
    for target in [Target::Ort, Target::Portable] {
        let all = counts(name, &every, target);
        for left_out in &every {
            let rest: Vec<&str> = every.iter().copied().filter(|p| p != left_out).collect();
            let without = counts(name, &rest, target);
            runs += 1;
            for (pass, &n) in &without {
                let before = all[pass];
                if n < before && !builds_on(pass).contains(left_out) {
                    found.push(format!("{name} ({target:?}): without {left_out}, {pass} fuses {n}, not {before}"));
                }
            }
        }
    }
    (runs, found)
}

#[test]
fn leaving_a_pass_out_never_lowers_another_pass_count() {
    let names = exports();
    let done = in_parallel(&names, lowered);
    let runs: usize = done.iter().map(|(r, _)| r).sum();
    let found: Vec<String> = done.into_iter().flat_map(|(_, f)| f).collect();
    assert!(runs > 1000, "only {runs} pipelines");
    assert!(found.is_empty(), "{} counts lowered:\n{}", found.len(), found.join("\n"));
}
