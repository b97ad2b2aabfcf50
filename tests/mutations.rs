//! Malformed nodes in real exports never crash the tool. Every node of
//! every testdata export (bodies included) is broken in each of the ways a
//! hostile or buggy writer breaks one: no outputs (its readers left, or
//! re-pointed to its first input so the model stays loadable), its first or
//! last input dropped, every input emptied, an input added. What the
//! loader's checks refuse is a clear "invalid model"; everything else runs
//! through every pass, both targets, and `--opset 23` then every pass, and
//! none of it may panic.
//!
//! Every node of every export is about 35,000 nodes and 120,000 runs: 40
//! minutes of a release build on two cores. `ONNX_FUSE_MUTATION_STRIDE=N`
//! mutates every Nth node of each export only, from an offset of its own
//! that `ONNX_FUSE_MUTATION_ROUND=r` moves (default: 1, every node, in a
//! release build; 1009 in a debug build, so `cargo test` stays quick; CI
//! runs a release build at 31, its round the commit, so that each commit
//! mutates other nodes); `ONNX_FUSE_MUTATION_EXPORTS=a,b` limits the
//! exports.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::{GraphProto, ModelProto, NodeProto};
use onnx_fuse::{passes, rewrite, upgrade, validate};

#[derive(Debug, Clone, Copy)]
enum Mutation {
    NoOutputs,
    NoOutputsReadersRepointed,
    FirstInputDropped,
    LastInputDropped,
    InputsEmptied,
    InputAdded,
}

const MUTATIONS: &[Mutation] = &[
    Mutation::NoOutputs,
    Mutation::NoOutputsReadersRepointed,
    Mutation::FirstInputDropped,
    Mutation::LastInputDropped,
    Mutation::InputsEmptied,
    Mutation::InputAdded,
];

/// Calls `f` on every graph of `graph`'s tree (bodies of every depth), in
/// a fixed order.
fn each_graph(graph: &mut GraphProto, f: &mut dyn FnMut(&mut GraphProto)) {
    f(graph);
    for node in &mut graph.node {
        for attr in &mut node.attribute {
            if let Some(g) = attr.g.as_mut() {
                each_graph(g, f);
            }
            for g in &mut attr.graphs {
                each_graph(g, f);
            }
        }
    }
}

fn node_count(model: &mut ModelProto) -> usize {
    let mut count = 0;
    each_graph(model.graph.as_mut().unwrap(), &mut |g| count += g.node.len());
    count
}

/// Re-points every reader of `from` in `graph` (bodies and outputs too) to `to`.
fn repoint(graph: &mut GraphProto, from: &[String], to: &str) {
    each_graph(graph, &mut |g| {
        for n in &mut g.node {
            for input in n.input.iter_mut().filter(|i| from.contains(i)) {
                *input = to.to_string();
            }
        }
        for out in g.output.iter_mut().filter(|o| from.iter().any(|f| f == o.name())) {
            out.name = Some(to.to_string());
        }
    });
}

/// The model with its `target`-th node (in `each_graph` order) mutated, or
/// None where the mutation leaves the node as it was.
fn mutated(model: &ModelProto, target: usize, mutation: Mutation) -> Option<ModelProto> {
    let mut model = model.clone();
    let mut seen = 0;
    let mut changed = false;
    let mut repointed: Option<(Vec<String>, String)> = None;
    each_graph(model.graph.as_mut().unwrap(), &mut |g| {
        if target < seen || target >= seen + g.node.len() {
            seen += g.node.len();
            return;
        }
        let len = g.node.len();
        let node: &mut NodeProto = &mut g.node[target - seen];
        seen += len;
        changed = match mutation {
            Mutation::NoOutputs => !std::mem::take(&mut node.output).is_empty(),
            Mutation::NoOutputsReadersRepointed => {
                let to = node.input.iter().find(|i| !i.is_empty()).cloned();
                let outputs = std::mem::take(&mut node.output);
                let any = !outputs.is_empty();
                repointed = to.map(|to| (outputs, to));
                any && repointed.is_some()
            }
            Mutation::FirstInputDropped => {
                !node.input.is_empty() && {
                    node.input.remove(0);
                    true
                }
            }
            Mutation::LastInputDropped => node.input.len() > 1 && node.input.pop().is_some(),
            Mutation::InputsEmptied => {
                let any = node.input.iter().any(|i| !i.is_empty());
                node.input.iter_mut().for_each(String::clear);
                any
            }
            Mutation::InputAdded => {
                let extra = node.input.first().cloned().unwrap_or_default();
                node.input.push(extra);
                true
            }
        };
    });
    if let Some((from, to)) = repointed {
        repoint(model.graph.as_mut().unwrap(), &from, &to);
    }
    changed.then_some(model)
}

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

thread_local! {
    /// Where this thread's last panic happened (set by the test's panic hook).
    static LOCATION: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f`, recording what panicked and where.
fn survives(what: &str, f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        let at = LOCATION.with(|l| l.borrow_mut().take()).unwrap_or_default();
        PANICS.lock().unwrap().push(format!("{what}: {at}"));
    }
}

/// Every mutation of every `stride`-th node of `name` from an offset of
/// its own in `round`: (loadable runs, refused).
fn mutate_export(name: &str, (stride, round): (usize, &str), pipeline: &[&rewrite::Pass]) -> (usize, usize) {
    let mut model = load(name);
    let count = node_count(&mut model);
    if std::env::var_os("ONNX_FUSE_MUTATION_PROGRESS").is_some() {
        eprintln!("{name}: {count} nodes, {} panics so far", PANICS.lock().unwrap().len());
    }
    let (mut runs, mut refused) = (0, 0);
    // Each export starts at its own offset in each round, so a stride
    // covers other positions in each (FNV-1a: a multiplier of 31 made
    // every offset at a stride of 31 the last byte's).
    let hash = name
        .bytes()
        .chain(round.bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let offset = (hash % stride as u64) as usize;
    for target in (offset..count).step_by(stride) {
        for &mutation in MUTATIONS {
            let Some(broken) = mutated(&model, target, mutation) else { continue };
            if validate::model(&broken).is_err() {
                refused += 1;
                continue;
            }
            runs += 1;
            let what = |step: &str| format!("{name} node {target} {mutation:?} {step}");
            for (target, label) in [(Target::Ort, "ort"), (Target::Portable, "portable")] {
                survives(&what(label), || {
                    rewrite::run_for(&mut broken.clone(), pipeline, target);
                });
            }
            survives(&what("opset 23"), || {
                if let Ok((mut upgraded, _)) = upgrade::upgrade(&broken, 23) {
                    rewrite::run_for(&mut upgraded, pipeline, Target::Ort);
                }
            });
        }
    }
    (runs, refused)
}

#[test]
fn no_malformed_node_of_any_export_makes_the_tool_panic() {
    let default_stride = if cfg!(debug_assertions) { 1009 } else { 1 };
    let stride: usize =
        std::env::var("ONNX_FUSE_MUTATION_STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(default_stride).max(1);
    let only: Option<Vec<String>> =
        std::env::var("ONNX_FUSE_MUTATION_EXPORTS").ok().map(|s| s.split(',').map(str::to_string).collect());
    let every: Vec<String> = passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipeline = passes::pipeline(&every, &[]).unwrap();
    std::panic::set_hook(Box::new(|info| LOCATION.with(|l| *l.borrow_mut() = Some(info.to_string()))));
    let names: Vec<String> = exports().into_iter().filter(|n| only.as_ref().is_none_or(|o| o.contains(n))).collect();
    let round = std::env::var("ONNX_FUSE_MUTATION_ROUND").unwrap_or_default();
    let done = in_parallel(&names, |name| mutate_export(name, (stride, &round), &pipeline));
    let (runs, refused) = done.into_iter().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    let _ = std::panic::take_hook();
    let panics = PANICS.lock().unwrap();
    eprintln!(
        "mutations: {runs} loadable runs, {refused} refused as invalid, {} panics (round {round:?})",
        panics.len()
    );
    assert!(panics.is_empty(), "{} panics (ONNX_FUSE_MUTATION_ROUND={round:?}):\n{}", panics.len(), panics.join("\n"));
    // Limited to some exports, fewer run.
    assert!(only.is_some() || runs * stride > 50_000, "only {runs} mutated models ran (every {stride}th node)");
}
