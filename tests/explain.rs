//! Every candidate explained (issue 38): over every testdata export, each
//! norm, attention core and residual norm that stays in the output has a
//! declined entry of its pass, which `--explain` prints and the JSON report
//! lists. Candidates are found here by their structure, not by the passes:
//! a variance mean (`ReduceMean` of a square), a `Softmax` a product reads
//! (through ops that move, cut or cast values), and a fused
//! norm whose input is computed by an `Add` (through Casts or not) or is
//! the sum another norm's kernel computed.

mod common;

use std::collections::{HashMap, HashSet};

use common::{exports, fuse_with, load};
use onnx_fuse::onnx::{GraphProto, NodeProto};
use onnx_fuse::rewrite::Declined;

/// How far downstream of a candidate's first node its pass's anchor lies
/// (a norm's weight and bias, a core's last MatMul and its Transpose).
const REACH: usize = 16;

struct Index<'a> {
    producer: HashMap<&'a str, &'a NodeProto>,
    readers: HashMap<&'a str, Vec<&'a NodeProto>>,
}

impl<'a> Index<'a> {
    fn new(g: &'a GraphProto) -> Self {
        let mut producer = HashMap::new();
        let mut readers: HashMap<&str, Vec<&NodeProto>> = HashMap::new();
        for n in &g.node {
            for o in &n.output {
                producer.insert(o.as_str(), n);
            }
            for i in &n.input {
                readers.entry(i.as_str()).or_default().push(n);
            }
        }
        Index { producer, readers }
    }

    /// The names of the nodes at most `REACH` steps downstream of `node`,
    /// itself included.
    fn downstream(&self, node: &'a NodeProto) -> HashSet<&'a str> {
        let mut seen = HashSet::from([node.name()]);
        let mut front = vec![node];
        for _ in 0..REACH {
            let mut next = vec![];
            for n in front {
                for o in &n.output {
                    for r in self.readers.get(o.as_str()).into_iter().flatten() {
                        if seen.insert(r.name()) {
                            next.push(*r);
                        }
                    }
                }
            }
            front = next;
        }
        seen
    }

    /// Whether a MatMul or an Einsum reads `node`'s output, through ops
    /// that only move, cut or cast values (a MoE router's softmax, whose
    /// weights a ScatterElements spreads, is no attention's).
    fn read_by_a_product(&self, node: &'a NodeProto) -> bool {
        const MOVES: &[&str] = &["Cast", "Reshape", "Transpose", "Slice", "Where", "Identity", "Dropout"];
        let mut front = vec![node];
        for _ in 0..REACH {
            let mut next = vec![];
            for n in front {
                for r in n.output.iter().flat_map(|o| self.readers.get(o.as_str()).into_iter().flatten()) {
                    if matches!(r.op_type(), "MatMul" | "Einsum") {
                        return true;
                    }
                    if MOVES.contains(&r.op_type()) {
                        next.push(*r);
                    }
                }
            }
            front = next;
        }
        false
    }

    /// The node computing `value` through any Casts, if it is `op`.
    fn through_casts(&self, value: &str, op: &str) -> Option<&'a NodeProto> {
        let mut n = *self.producer.get(value)?;
        while n.op_type() == "Cast" {
            n = *self.producer.get(n.input[0].as_str())?;
        }
        (n.op_type() == op).then_some(n)
    }
}

/// `ReduceMean(v²)`: the variance or mean square of a norm.
fn variance_mean(index: &Index, n: &NodeProto) -> bool {
    n.op_type() == "ReduceMean"
        && index.producer.get(n.input[0].as_str()).is_some_and(|p| {
            p.op_type() == "Pow" || (p.op_type() == "Mul" && p.input.len() == 2 && p.input[0] == p.input[1])
        })
}

/// How many candidates of one export stay in the output, and those of them
/// without a reason.
fn unexplained(name: &str) -> (usize, Vec<String>) {
    let original = load(name);
    let (_, fused, outcome) = fuse_with(name, &["default", "skip-norm"]);
    let (before, after) = (original.graph.as_ref().unwrap(), fused.graph.as_ref().unwrap());
    let (index, index_after) = (Index::new(before), Index::new(after));
    let main: Vec<&Declined> = outcome.declined.iter().filter(|d| d.graph == "main").collect();
    let declined_by = |passes: &[&str], nodes: &HashSet<&str>| {
        main.iter().any(|d| passes.contains(&d.pass) && nodes.contains(d.node.as_str()))
    };
    let stays = |n: &NodeProto| n.output.iter().any(|o| index_after.producer.contains_key(o.as_str()));
    let (mut stayed, mut missing) = (0, vec![]);
    for n in &before.node {
        let passes: &[&str] = if variance_mean(&index, n) {
            &["layer-norm", "rms-norm"]
        } else if n.op_type() == "Softmax" && index.read_by_a_product(n) {
            &["attention"]
        } else {
            continue;
        };
        if !stays(n) {
            continue;
        }
        stayed += 1;
        if !declined_by(passes, &index.downstream(n)) {
            missing.push(format!("{} {} ({})", passes.join(" or "), n.name(), n.op_type()));
        }
    }
    for n in &after.node {
        let norm = matches!(n.op_type(), "LayerNormalization" | "SimplifiedLayerNormalization");
        if !norm || n.input.is_empty() {
            continue;
        }
        // A sum another norm's kernel took (its output 3) counts too.
        let taken = index_after
            .producer
            .get(n.input[0].as_str())
            .is_some_and(|p| p.op_type().starts_with("Skip") && p.output.get(3).is_some_and(|o| *o == n.input[0]));
        let of_a_sum = taken || index_after.through_casts(&n.input[0], "Add").is_some();
        if norm && n.domain().is_empty() && of_a_sum {
            stayed += 1;
            if !declined_by(&["skip-norm"], &HashSet::from([n.name()])) {
                missing.push(format!("skip-norm {} (a norm of a sum)", n.name()));
            }
        }
    }
    (stayed, missing)
}

#[test]
fn every_candidate_that_stays_has_its_reason() {
    let mut missing = vec![];
    let mut stayed = 0;
    for name in exports() {
        let (here, found) = unexplained(&name);
        stayed += here;
        missing.extend(found.into_iter().map(|m| format!("{name}: {m}")));
    }
    eprintln!("{stayed} candidates stay unfused, {} of them without a reason", missing.len());
    // The near-misses alone leave dozens: a test that found none would prove nothing.
    assert!(stayed >= 20, "only {stayed} candidates stay unfused in testdata");
    assert!(
        missing.is_empty(),
        "{} of {stayed} candidates left without a reason:\n{}",
        missing.len(),
        missing.join("\n")
    );
}
