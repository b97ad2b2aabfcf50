//! Sizes for the symbols onnx-fuse makes up, where the model does not run at
//! the defaults: a search measured run by run. ONNX Runtime runs a
//! session's nodes in one fixed order and stops at the first that fails.
//! A change of sizes is kept when the run gets further in that order: when
//! it now fails at a node that reads, directly or through others, what the
//! node it failed at before writes (so that node ran), or at a node the
//! change does not reach (which failed before too, so it comes later); it
//! is over when a run succeeds.

use std::collections::{HashMap, HashSet};

use crate::graph::values_read_by;
use crate::onnx::GraphProto;

/// The node an ONNX Runtime run failed at, as its message names it
/// (`… while running Conv node. Name:'/embeddings/Conv' …`).
pub(super) fn failed_node(e: &anyhow::Error) -> Option<String> {
    let text = format!("{e:#}");
    let at = text.find("Name:'")? + "Name:'".len();
    text[at..].split('\'').next().map(str::to_string)
}

/// The main graph's data flow, by node name: each node's reads (its
/// bodies' free values included) taken once.
pub(super) struct Flow<'a> {
    graph: &'a GraphProto,
    by_name: HashMap<&'a str, usize>,
    producer: HashMap<&'a str, usize>,
    reads: Vec<Vec<String>>,
    readers: HashMap<String, Vec<usize>>,
}

impl<'a> Flow<'a> {
    pub(super) fn new(graph: &'a GraphProto) -> Self {
        let (mut by_name, mut producer, mut readers) = (HashMap::new(), HashMap::new(), HashMap::<_, Vec<_>>::new());
        let reads: Vec<Vec<String>> = graph.node.iter().map(values_read_by).collect();
        for (i, n) in graph.node.iter().enumerate() {
            by_name.entry(n.name()).or_insert(i);
            producer.extend(n.output.iter().map(|o| (o.as_str(), i)));
            for r in &reads[i] {
                readers.entry(r.clone()).or_default().push(i);
            }
        }
        Flow { graph, by_name, producer, reads, readers }
    }

    /// Whether a run that failed at node `before` and now, after a change
    /// of the sizes of the inputs `touched`, fails at node `now` got
    /// further in ONNX Runtime's order of execution (fixed for the
    /// session): `now` reads what `before` writes (so `before` ran), or the
    /// change does not reach `now` (it failed before too, after `before`).
    pub(super) fn further(&self, before: &str, now: &str, touched: &HashSet<&str>) -> bool {
        before != now && (self.after(before, now) || self.inputs_of(now).is_disjoint(touched))
    }

    /// Whether node `later` reads what node `earlier` writes, directly or
    /// through others.
    fn after(&self, earlier: &str, later: &str) -> bool {
        let (Some(&from), Some(&to)) = (self.by_name.get(earlier), self.by_name.get(later)) else { return false };
        let (mut seen, mut stack) = (HashSet::from([from]), vec![from]);
        while let Some(i) = stack.pop() {
            for o in &self.graph.node[i].output {
                for &r in self.readers.get(o.as_str()).into_iter().flatten() {
                    if r == to {
                        return true;
                    }
                    if seen.insert(r) {
                        stack.push(r);
                    }
                }
            }
        }
        false
    }

    /// The graph inputs node `name` depends on (every input where the node
    /// is not found).
    pub(super) fn inputs_of(&self, name: &str) -> HashSet<&'a str> {
        let inputs = self.graph.input.iter().map(|i| i.name());
        let Some(&start) = self.by_name.get(name) else { return inputs.collect() };
        let inputs: HashSet<&str> = inputs.collect();
        let (mut found, mut seen, mut stack) = (HashSet::new(), HashSet::from([start]), vec![start]);
        while let Some(i) = stack.pop() {
            for r in &self.reads[i] {
                if let Some(&p) = self.producer.get(r.as_str()) {
                    if seen.insert(p) {
                        stack.push(p);
                    }
                } else if let Some(&input) = inputs.get(r.as_str()) {
                    found.insert(input);
                }
            }
        }
        found
    }
}

/// The changes of sizes the search tries, in order: one symbol at a time,
/// then two symbols of one input together (an image's height and width).
pub(super) fn moves<'s>(unset: &[&'s String], symbols_of: &[(String, Vec<String>)]) -> Vec<Vec<&'s String>> {
    let mut found: Vec<Vec<&String>> = unset.iter().map(|s| vec![*s]).collect();
    for (i, a) in unset.iter().enumerate() {
        for b in &unset[i + 1..] {
            let together = symbols_of.iter().any(|(_, of)| of.contains(a) && of.contains(b));
            if together {
                found.push(vec![*a, *b]);
            }
        }
    }
    found
}
