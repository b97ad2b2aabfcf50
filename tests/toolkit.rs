//! Unit tests of the toolkit's proofs: symbolic shapes and the wire walk.

mod common;

use common::build::{attr_graph, attr_int, attr_ints, attr_string, attr_tensor, sym, tensor, Builder, D};
use onnx_fuse::graph::{Graph, Scope};
use onnx_fuse::onnx::unknown::find_unknown_field;
use onnx_fuse::onnx::{GraphProto, ModelProto, BOOL, FLOAT, FLOAT16, INT64};
use prost::Message;

/// The derived shape of `value` in `b`'s graph at `opset`, as text.
fn shape(b: &Builder, opset: i64, value: &str) -> Option<Vec<String>> {
    let model = b.model(opset);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), opset, &scope);
    let shape = g.shapes().shape(value);
    shape.map(|s| s.iter().map(|d| d.to_string()).collect())
}

fn ints(v: &[i64]) -> onnx_fuse::onnx::TensorProto {
    tensor(INT64, &[v.len() as i64], &v.iter().map(|&x| x as f64).collect::<Vec<_>>())
}

#[test]
fn broadcasting_takes_the_known_dimension_other_than_one() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::Unknown, D::N(1)]));
    let y = b.input("y", FLOAT, Some(&[D::N(4)]));
    let z = b.input("z", FLOAT, Some(&[sym("c"), D::N(1), D::N(1)]));
    let xy = b.node("Add", &[&x, &y], vec![]);
    let xz = b.node("Mul", &[&x, &z], vec![]);
    assert_eq!(shape(&b, 17, &xy).unwrap(), ["b", "x#1", "4"]);
    // b and c are different symbols: the result's axis 0 is its own unknown.
    assert_eq!(shape(&b, 17, &xz).unwrap(), ["mul_2#0", "x#1", "1"]);
}

#[test]
fn reductions_follow_the_opset_rules() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(3), D::N(4)]));
    let axes = b.init("axes", ints(&[-1]));
    let kept = b.node("ReduceMean", &[&x, &axes], vec![]);
    let dropped = b.node("ReduceMean", &[&x, &axes], vec![attr_int("keepdims", 0)]);
    let all = b.node("ReduceMean", &[&x], vec![]);
    let none = b.node("ReduceMean", &[&x], vec![attr_int("noop_with_empty_axes", 1)]);
    assert_eq!(shape(&b, 18, &kept).unwrap(), ["b", "3", "1"]);
    assert_eq!(shape(&b, 18, &dropped).unwrap(), ["b", "3"]);
    assert_eq!(shape(&b, 18, &all).unwrap(), ["1", "1", "1"]);
    assert_eq!(shape(&b, 18, &none).unwrap(), ["b", "3", "4"]);
    // Before opset 18 axes are an attribute; an axes input is not read.
    let mut old = Builder::default();
    let x = old.input("x", FLOAT, Some(&[sym("b"), D::N(3), D::N(4)]));
    let by_attribute = old.node("ReduceMean", &[&x], vec![attr_ints("axes", &[1])]);
    assert_eq!(shape(&old, 13, &by_attribute).unwrap(), ["b", "1", "4"]);
}

#[test]
fn a_reshape_computed_from_shapes_is_proved() {
    // Reshape(x, [0, 0, 2, -1]) and back through Shape → Gather → Concat.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(32)]));
    let target = b.init("target", ints(&[0, 0, 2, -1]));
    let heads = b.node("Reshape", &[&x, &target], vec![]);
    assert_eq!(shape(&b, 17, &heads).unwrap(), ["b", "s", "2", "16"]);
    let s = b.node("Shape", &[&x], vec![]);
    let (i0, i1) = (b.init("i0", tensor(INT64, &[], &[0.0])), b.init("i1", tensor(INT64, &[], &[1.0])));
    let d0 = b.node("Gather", &[&s, &i0], vec![]);
    let d1 = b.node("Gather", &[&s, &i1], vec![]);
    let zero = b.init("zero_axis", ints(&[0]));
    let u0 = b.node("Unsqueeze", &[&d0, &zero], vec![]);
    let u1 = b.node("Unsqueeze", &[&d1, &zero], vec![]);
    let last = b.init("last", ints(&[32]));
    let back_shape = b.node("Concat", &[&u0, &u1, &last], vec![attr_int("axis", 0)]);
    let back = b.node("Reshape", &[&heads, &back_shape], vec![]);
    assert_eq!(shape(&b, 17, &back), shape(&b, 17, &x));
    // An element computed otherwise may be 0 or -1: that axis is unknown.
    let n = b.input("n", INT64, Some(&[D::N(1)]));
    let odd = b.node("Concat", &[&u0, &n, &last], vec![attr_int("axis", 0)]);
    let reshaped = b.node("Reshape", &[&heads, &odd], vec![]);
    assert_eq!(shape(&b, 17, &reshaped).unwrap(), ["b", &format!("{reshaped}#1"), "32"]);
}

#[test]
fn split_transpose_and_unknown_ops() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(96)]));
    b.node_to("Split", &[&x], &["q", "k", "v"], vec![attr_int("axis", 1)]);
    assert_eq!(shape(&b, 17, "k").unwrap(), ["b", "32"]);
    let t = b.node("Transpose", &[&x], vec![attr_ints("perm", &[1, 0, 2])]);
    assert_eq!(shape(&b, 17, &t), None, "a perm of the wrong length proves nothing");
    let unknown = b.node("NoSuchOp", &[&x], vec![]);
    assert_eq!(shape(&b, 17, &unknown), None);
}

/// `num_outputs` (opset 18) over an axis not known to divide: parts of
/// ceil(n/k), the last the rest, as ONNX Runtime splits; concatenated
/// again they are n long, known or not. Before opset 18 equal parts need
/// a divisible axis.
#[test]
fn split_into_num_outputs_parts_adds_back_up_to_the_axis() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(10)]));
    let split = vec![attr_int("axis", 1), attr_int("num_outputs", 3)];
    b.node_to("Split", &[&x], &["p0", "p1", "p2"], split);
    assert_eq!(shape(&b, 18, "p0").unwrap(), ["b", "p0#part", "10"]);
    assert_eq!(shape(&b, 18, "p2").unwrap(), ["b", "s - 2·p0#part", "10"]);
    let whole = b.node("Concat", &["p0", "p1", "p2"], vec![attr_int("axis", 1)]);
    assert_eq!(shape(&b, 18, &whole), shape(&b, 18, &x));
    b.node_to("Split", &[&x], &["c0", "c1", "c2"], vec![attr_int("axis", 2), attr_int("num_outputs", 3)]);
    assert_eq!(shape(&b, 18, "c1").unwrap(), ["b", "s", "4"]);
    assert_eq!(shape(&b, 18, "c2").unwrap(), ["b", "s", "2"]);
    let eight: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
    let eight: Vec<&str> = eight.iter().map(String::as_str).collect();
    b.node_to("Split", &[&x], &eight, vec![attr_int("axis", 2), attr_int("num_outputs", 8)]);
    assert_eq!(shape(&b, 18, "n0"), None, "10 in 8 parts of 2 leaves the last -4");
    b.node_to("Split", &[&x], &["e0", "e1"], vec![attr_int("axis", 1)]);
    assert_eq!(shape(&b, 17, "e0"), None, "halves of an axis not known to be even");
}

#[test]
fn a_slice_with_bounds_computed_at_run_time_keeps_the_axes_it_does_not_slice() {
    // GPT-2's causal mask: the [1, 1, N, N] buffer sliced on axis 2 to
    // lengths known only at run time.
    let mut b = Builder::default();
    b.input("n", INT64, Some(&[D::N(1)]));
    let buffer = b.init("buffer", tensor(FLOAT, &[1, 1, 8, 8], &[0.0; 64]));
    let zero = b.init("zero", ints(&[0]));
    let axis = b.init("axis", ints(&[2]));
    let rows = b.node("Slice", &[&buffer, &zero, "n", &axis], vec![]);
    assert_eq!(shape(&b, 17, &rows).unwrap(), ["1", "1", &format!("{rows}#2"), "8"]);
    // Without axes: the first as many axes as starts has values.
    let first = b.node("Slice", &[&buffer, &zero, "n"], vec![]);
    assert_eq!(shape(&b, 17, &first).unwrap(), [&format!("{first}#0"), "1", "8", "8"]);
    // Axes computed at run time too: nothing is known but the rank.
    let some_axis = b.input("some_axis", INT64, Some(&[D::N(1)]));
    let any = b.node("Slice", &[&buffer, &zero, "n", &some_axis], vec![]);
    assert!(shape(&b, 17, &any).unwrap().iter().all(|d| d.starts_with(&any)));
}

fn append_field(bytes: &mut Vec<u8>, number: u32) {
    bytes.push(((number << 3) | 0) as u8);
    bytes.push(1);
}

#[test]
fn the_wire_walk_finds_unknown_fields_at_any_depth() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(1)]));
    b.node("Relu", &[&x], vec![]);
    let model = b.model(17);
    let clean = model.encode_to_vec();
    assert_eq!(find_unknown_field(&clean), Ok(None));

    let mut top = clean.clone();
    append_field(&mut top, 15);
    let found = find_unknown_field(&top).unwrap().unwrap();
    assert_eq!((found.number, found.message.as_str(), found.path.as_str()), (15, "onnx.ModelProto", "top level"));

    // A field 15 inside the first node: re-encode the node with it appended.
    let mut graph = model.graph.clone().unwrap();
    let mut node_bytes = graph.node[0].encode_to_vec();
    append_field(&mut node_bytes, 15);
    graph.node.clear();
    let mut graph_bytes = graph.encode_to_vec();
    graph_bytes.push((1 << 3) | 2); // GraphProto.node, length-delimited
    graph_bytes.push(node_bytes.len() as u8);
    graph_bytes.extend(&node_bytes);
    let mut nested = ModelProto { graph: None, ..model.clone() }.encode_to_vec();
    nested.push((7 << 3) | 2); // ModelProto.graph
    nested.push(graph_bytes.len() as u8);
    nested.extend(&graph_bytes);
    let found = find_unknown_field(&nested).unwrap().unwrap();
    assert_eq!((found.message.as_str(), found.path.as_str()), ("onnx.NodeProto", "graph.node[0]"));

    // Truncated in the middle of a field: not protobuf.
    assert!(find_unknown_field(&clean[..clean.len() - 1]).is_err());
}

#[test]
fn constants_reached_through_shape_only_ops_are_constants() {
    // dynamo's unoptimized `full([], c)`: Expand(Cast(c, to = its own type), []).
    let mut b = Builder::default();
    let c = b.constant(tensor(FLOAT, &[], &[-3.0e38]));
    let same = b.node("Cast", &[&c], vec![attr_int("to", FLOAT as i64)]);
    let empty = b.init("empty", ints(&[]));
    let full = b.node("Expand", &[&same, &empty], vec![]);
    let ones = b.init("ones", ints(&[1, 1]));
    let raised = b.node("Expand", &[&same, &ones], vec![]);
    let other = b.init("two", ints(&[2]));
    let widened = b.node("Expand", &[&same, &other], vec![]);
    let to_double = b.node("Cast", &[&c], vec![attr_int("to", 11)]);
    let model = b.model(18);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 18, &scope);
    assert_eq!(g.scalar(&full), Some(-3.0e38f32 as f64));
    assert_eq!(g.constant(&full).unwrap().dims, Vec::<i64>::new());
    // Expanding to ones adds leading axes: the rank counts (ground rule 8).
    assert_eq!(g.constant(&raised).unwrap().dims, vec![1, 1]);
    // A real broadcast is not folded.
    assert!(g.constant(&widened).is_none());
    // A change of type is the constant cast (ground rule 4).
    let double = g.constant(&to_double).unwrap();
    assert_eq!((double.data_type(), double.scalar()), (11, Some(-3.0e38f32 as f64)));
}

/// A Cast or CastLike of a small constant is a constant of the cast
/// values, rounded as ONNX Runtime rounds them; what a runtime could
/// compute another way is left a computed value.
#[test]
fn a_cast_of_a_constant_is_the_constant_cast() {
    let mut b = Builder::default();
    let eps = b.init("eps", tensor(11, &[], &[1e-5]));
    let narrowed = b.node("Cast", &[&eps], vec![attr_int("to", FLOAT as i64)]);
    let axes = b.init("axes", tensor(6, &[2], &[0.0, -1.0]));
    let widened = b.node("Cast", &[&axes], vec![attr_int("to", 7)]);
    let x = b.input("x", FLOAT16, None);
    let eps32 = b.init("eps32", tensor(FLOAT, &[], &[1e-5]));
    let like = b.node("CastLike", &[&eps32, &x], vec![]);
    // 1 + 2^-11 + 2^-22 is above the tie between two halves: it rounds up.
    let above = b.init("above", tensor(FLOAT, &[], &[1.0 + 2f64.powi(-11) + 2f64.powi(-22)]));
    let up = b.node("CastLike", &[&above, &x], vec![]);
    // 1 + 2^-11 + 2^-40 rounds up to f16 directly, but to 1 through f32.
    let tie = b.init("tie", tensor(11, &[], &[1.0 + 2f64.powi(-11) + 2f64.powi(-40)]));
    let to_half = b.node("Cast", &[&tie], vec![attr_int("to", FLOAT16 as i64)]);
    let half = b.init("half", tensor(FLOAT, &[], &[0.5]));
    let to_int = b.node("Cast", &[&half], vec![attr_int("to", 7)]);
    let one = b.init("one", ints(&[1]));
    let twice = b.init("twice", ints(&[1, 1]));
    let repeated = b.node("Unsqueeze", &[&one, &twice], vec![]);
    let model = b.model(18);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 18, &scope);
    assert_eq!(g.scalar(&narrowed), Some(f64::from(1e-5f32)));
    assert_eq!(g.constant(&narrowed).unwrap().data_type(), FLOAT);
    assert_eq!(g.constant(&widened).unwrap().ints(), Some(vec![0, -1]));
    assert_eq!(g.constant(&widened).unwrap().data_type(), 7);
    assert_eq!(g.scalar(&like), Some(half::f16::from_f32(1e-5).to_f64()));
    assert_eq!(g.scalar(&up), Some(1.0 + 2f64.powi(-10)));
    assert!(g.constant(&to_half).is_none(), "rounded two ways");
    assert!(g.constant(&to_int).is_none(), "a fraction to an integer");
    // Repeated axes: ONNX Runtime refuses the node, and it is no constant.
    assert!(g.constant(&repeated).is_none());
    assert!(g.shapes().shape(&repeated).is_none());
}

/// onnx-fuse's shapes against ONNX's own inference with data propagation
/// (`testdata/shapes/`, written by `scripts/gen_testdata.sh shapes`): for
/// every value of every export whose rank ONNX knows, onnx-fuse knows the
/// rank too; where ONNX knows the last axis, so does onnx-fuse; and no
/// axis both know as a number differs.
#[test]
fn shapes_know_what_onnx_shape_inference_knows() {
    let mut problems = vec![];
    let mut compared = 0;
    let dir = common::testdata("shapes");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
    files.sort();
    for file in &files {
        let name = file.file_stem().unwrap().to_str().unwrap().replace("__", "/");
        let model = common::load(&name);
        let onnx: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let scope = Scope::default();
        let g = Graph::new(model.graph.as_ref().unwrap(), model.default_opset(), &scope);
        let shapes = g.shapes();
        for (value, dims) in &onnx {
            let dims: Vec<Option<i64>> = dims.as_array().unwrap().iter().map(|d| d.as_i64()).collect();
            compared += 1;
            let Some(ours) = shapes.shape(value) else {
                problems.push(format!("{name} {value}: ONNX knows rank {}, onnx-fuse does not", dims.len()));
                continue;
            };
            if ours.len() != dims.len() {
                problems.push(format!("{name} {value}: rank {} here, {} for ONNX", ours.len(), dims.len()));
                continue;
            }
            for (i, (theirs, ours)) in dims.iter().zip(&ours).enumerate() {
                if let (Some(a), Some(b)) = (theirs, ours.value()) {
                    if *a != b {
                        problems.push(format!("{name} {value}: axis {i} is {b} here, {a} for ONNX"));
                    }
                }
            }
            if let Some(last) = dims.last().copied().flatten() {
                if ours.last().and_then(|d| d.value()) != Some(last) {
                    problems.push(format!("{name} {value}: ONNX knows the last axis is {last}, onnx-fuse does not"));
                }
            }
        }
    }
    assert!(files.len() >= 90 && compared > 30_000, "{} files, {compared} values", files.len());
    assert!(
        problems.is_empty(),
        "{} problems, e.g.:\n{}",
        problems.len(),
        problems[..problems.len().min(12)].join("\n")
    );
}

/// onnx-fuse's shapes against what ONNX Runtime's symbolic shape inference
/// derives (`testdata/shapes/ort/`, written by `scripts/gen_testdata.sh
/// shapes` with the pinned onnxruntime, run as its transformers optimizer
/// runs it, with auto_merge): wherever it gives a value a rank or a number,
/// onnx-fuse knows them too, and no number differs; wherever it gives axes
/// of two values one symbol, onnx-fuse proves them equal. What it only
/// assumed (symbols it made one where they met in a broadcast, which holds
/// only if neither is 1) is counted apart and not held against onnx-fuse;
/// so are exports on which its inference stops. The gaps still open are
/// listed in `GAPS`, each export with its count and why: more problems on
/// one, or any on another, fail.
#[test]
fn shapes_know_what_onnx_runtime_symbolic_inference_knows() {
    use std::collections::{BTreeMap, HashSet};
    /// XLNet's relative positions `x[:, :, 1:]` of an axis of 2·seq are
    /// 2·seq − 1 long only where seq ≥ 1 (for 0 they are 0), which nothing
    /// proves; MPT's ALiBi `alibi[..., 64 − seq:]` is seq long only where
    /// seq ≤ 64 (for 65 it is 1, and broadcasts); a hand-made near-miss
    /// whose declared shapes its ops contradict (onnx-fuse takes declared
    /// numbers as given). LongT5's were 47, its blocks padded by `Pad`s whose
    /// pads torch computes by reshaping, reversing and transposing a small
    /// constant ([-1, 2] pairs), and Reshapes to a block count computed
    /// with `Mod`: shape elements follow both now.
    /// Funnel's were 9, `x[:1]` of a symbolic axis (its class token kept
    /// apart), 1 long only where the axis is not empty (ORT assumes it):
    /// its class mask `torch.ones(seq − 1, seq − 1)` proves seq ≥ 1 (and
    /// the pooled sequence `floor((seq + 1)/2)` is then at least 1); the 2
    /// left are `[:1]` of its token-type matrix pooled by Slices of step
    /// 2, whose lengths the bounds do not follow.
    /// DeBERTa's are ORT's: it gives an If's output the then branch's rank
    /// where the branches' ranks differ, while the condition (decided by
    /// shapes) takes the else branch, whose rank onnx-fuse derives (ONNX
    /// Runtime's run gives (1, 1, 5, 5) for one of the 10 values; ORT's
    /// inference says rank 3). GPT-J's 2 and BLOOM's 2 (with past) are
    /// their causal masks, sized by the attention mask and sliced at the
    /// key's length past + seq: that many long only where the attention
    /// mask is at least as long, which ORT takes as given and nothing
    /// proves (the attention pass compares the two at run time where it
    /// needs them equal).
    const GAPS: &[(&str, usize)] = &[
        ("gptj_optimum_past.onnx", 2),
        ("bloom_optimum_past.onnx", 2),
        ("funnel_ts_op14.onnx", 2),
        ("mpt_ts_op14.onnx", 4),
        ("nm_rms_op18_axes_not_constant.onnx", 4),
        ("nm_rms_op18_no_axes.onnx", 4),
        ("deberta_ts_op14.onnx", 10),
        ("xlnet_ts_op14.onnx", 3),
    ];
    let mut problems = vec![];
    let (mut compared, mut pairs, mut assumed, mut stopped) = (0, 0, 0, 0);
    let dir = common::testdata("shapes/ort");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    for file in &files {
        let name = file.file_stem().unwrap().to_str().unwrap().replace("__", "/");
        let ort: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        if ort.get("failed").is_some() {
            stopped += 1;
            continue;
        }
        // Every symbol (and literal) an assumed merge touched; an expression
        // naming one of them is as unproved.
        let merged: HashSet<String> = ort["assumed"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|set| set.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()))
            .collect();
        let tainted = |symbol: &str| {
            merged.contains(symbol)
                || symbol.split(|c: char| !(c.is_alphanumeric() || c == '_')).any(|t| merged.contains(t))
        };
        let model = common::load(&name);
        let scope = Scope::default();
        let g = Graph::new(model.graph.as_ref().unwrap(), model.default_opset(), &scope);
        let shapes = g.shapes();
        let mut groups: BTreeMap<String, Vec<(String, usize, String)>> = BTreeMap::new();
        for (value, dims) in ort["shapes"].as_object().unwrap() {
            let dims = dims.as_array().unwrap();
            compared += 1;
            let Some(ours) = shapes.shape(value) else {
                problems.push(format!("{name} {value}: ORT knows rank {}, onnx-fuse does not", dims.len()));
                continue;
            };
            if ours.len() != dims.len() {
                problems.push(format!("{name} {value}: rank {} here, {} for ORT", ours.len(), dims.len()));
                continue;
            }
            for (i, (theirs, ours)) in dims.iter().zip(&ours).enumerate() {
                match (theirs.as_i64(), theirs.as_str(), ours.value()) {
                    (Some(n), _, Some(m)) if n != m => {
                        problems.push(format!("{name} {value}: axis {i} is {m} here, {n} for ORT"))
                    }
                    (Some(n), _, None) if tainted(&n.to_string()) => assumed += 1,
                    (Some(n), _, None) => {
                        problems.push(format!("{name} {value}: ORT knows axis {i} is {n}, onnx-fuse has {ours}"))
                    }
                    (None, Some(symbol), _) => {
                        groups.entry(symbol.to_string()).or_default().push((value.clone(), i, ours.to_string()))
                    }
                    _ => {}
                }
            }
        }
        for (symbol, axes) in &groups {
            let (first, rest) = axes.split_first().unwrap();
            if tainted(symbol) {
                assumed += rest.len();
                continue;
            }
            for other in rest {
                pairs += 1;
                if other.2 != first.2 {
                    problems.push(format!(
                        "{name}: ORT gives {} axis {} and {} axis {} one symbol {symbol}; here {} and {}",
                        first.0, first.1, other.0, other.1, first.2, other.2
                    ));
                }
            }
        }
    }
    eprintln!(
        "ORT's symbolic shapes: {} exports ({stopped} where its inference stops), {compared} values, {pairs} \
         pairs of one symbol, {assumed} axes it only assumed, {} problems",
        files.len(),
        problems.len()
    );
    assert!(files.len() >= 90 && compared > 25_000 && pairs > 10_000, "{} files, {compared} values", files.len());
    let of = |export: &str| problems.iter().filter(|p| p.split([' ', ':']).next() == Some(export)).count();
    let exports: HashSet<&str> = problems.iter().filter_map(|p| p.split([' ', ':']).next()).collect();
    let mut over: Vec<String> = exports
        .into_iter()
        .filter(|e| of(e) > GAPS.iter().find(|(g, _)| g == e).map_or(0, |&(_, n)| n))
        .map(|e| format!("{e}: {} problems", of(e)))
        .collect();
    over.sort();
    let examples: Vec<&String> =
        problems.iter().filter(|p| over.iter().any(|o| p.starts_with(o.split(':').next().unwrap()))).take(20).collect();
    assert!(over.is_empty(), "{over:?}, e.g.:\n{examples:#?}");
}

#[test]
fn a_contraction_the_outputs_need_proves_its_axes_equal() {
    // q [b, s, 8] · kᵀ [b, 8, t] · v [b, 7, 8]: the run needs t = 7, so k's
    // declared symbol is 7 wherever it stands; a MatMul no output reads
    // proves nothing (a runtime need not run it).
    let mut b = Builder::default();
    let q = b.input("q", FLOAT, Some(&[sym("b"), sym("s"), D::N(8)]));
    let k = b.input("k", FLOAT, Some(&[sym("b"), sym("t"), D::N(8)]));
    let v = b.input("v", FLOAT, Some(&[sym("b"), D::N(7), D::N(8)]));
    let w = b.input("w", FLOAT, Some(&[sym("b"), sym("s"), D::N(9)]));
    let kt = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 2, 1])]);
    let scores = b.node("MatMul", &[&q, &kt], vec![]);
    let out = b.node("MatMul", &[&scores, &v], vec![]);
    b.output(&out, FLOAT, None);
    assert_eq!(shape(&b, 14, &kt).unwrap(), ["b", "8", "7"]);
    assert_eq!(shape(&b, 14, &k).unwrap(), ["b", "7", "8"]);
    let dead = b.node("MatMul", &[&q, &w], vec![]);
    assert_eq!(shape(&b, 14, &q).unwrap(), ["b", "s", "8"], "{dead} is read by no output");
}

#[test]
fn a_cache_s_lengths_are_sums_of_dimensions() {
    // A cache of past rows and seq new ones: concatenated, past + seq rows;
    // the new rows' positions Range(past, past + seq) are seq long; its
    // causal mask, a [64, 64] buffer cut to bias[past : past + seq, :past +
    // seq] and added to the scores, is seq × (past + seq) once the run has
    // proved past + seq ≤ 64 (the key axis broadcasts against the scores').
    let mut b = Builder::default();
    let past = b.input("past", FLOAT, Some(&[sym("batch"), sym("past"), D::N(8)]));
    let x = b.input("x", FLOAT, Some(&[sym("batch"), sym("seq"), D::N(8)]));
    let keys = b.node("Concat", &[&past, &x], vec![attr_int("axis", 1)]);
    assert_eq!(shape(&b, 14, &keys).unwrap(), ["batch", "past + seq", "8"]);
    let (one, zero) = (b.init("one", ints(&[1])), b.init("zero", ints(&[0])));
    let part = |b: &mut Builder, v: &str| {
        let s = b.node("Shape", &[v], vec![]);
        b.node("Gather", &[&s, "one"], vec![attr_int("axis", 0)])
    };
    let (p, total) = (part(&mut b, &past), part(&mut b, &keys));
    let (p0, t0) = (b.node("Squeeze", &[&p], vec![]), b.node("Squeeze", &[&total], vec![]));
    let step = b.init("step", tensor(INT64, &[], &[1.0]));
    let positions = b.node("Range", &[&p0, &t0, &step], vec![]);
    assert_eq!(shape(&b, 14, &positions).unwrap(), ["seq"]);
    let back = b.init("back", tensor(INT64, &[], &[-1.0]));
    let neg = b.node("Neg", &[&t0], vec![]);
    let both_ways = b.node("Range", &[&t0, &neg, &back], vec![]);
    assert_eq!(shape(&b, 14, &both_ways).unwrap(), ["2·past + 2·seq"]);
    // Range(past + seq, past, 1) is empty; Range(seq, past, 1) is not known.
    let empty = b.node("Range", &[&t0, &p0, &step], vec![]);
    assert_eq!(shape(&b, 14, &empty).unwrap(), ["0"]);
    let x_rows = part(&mut b, &x);
    let x0 = b.node("Squeeze", &[&x_rows], vec![]);
    let unknown = b.node("Range", &[&x0, &p0, &step], vec![]);
    assert_eq!(shape(&b, 14, &unknown).unwrap(), [format!("{unknown}#0")]);
    let bias = b.init("bias", tensor(FLOAT, &[64, 64], &vec![0.0; 64 * 64]));
    let axes = b.init("axes", ints(&[0, 1]));
    let starts = b.node("Concat", &[&p, &zero], vec![attr_int("axis", 0)]);
    let ends = b.node("Concat", &[&total, &total], vec![attr_int("axis", 0)]);
    let mask = b.node("Slice", &[&bias, &starts, &ends, &axes], vec![]);
    assert_eq!(shape(&b, 14, &mask).unwrap(), [format!("{mask}#0"), "min(1·$past + 1·$seq, 64)".to_string()]);
    let row = b.init("row", tensor(FLOAT, &[1, 64], &[0.0; 64]));
    let mask_keys = b.node("Slice", &[&row, &zero, &total, &one], vec![]);
    let kt = b.node("Transpose", &[&keys], vec![attr_ints("perm", &[0, 2, 1])]);
    let scores = b.node("MatMul", &[&x, &kt], vec![]);
    let masked = b.node("Add", &[&scores, &mask_keys], vec![]);
    b.output(&masked, FLOAT, None);
    assert_eq!(shape(&b, 14, &mask).unwrap(), ["seq", "past + seq"], "the Add runs");
    let masked = b.node("Add", &[&scores, &mask], vec![]);
    assert_eq!(shape(&b, 14, &masked).unwrap(), ["batch", "seq", "past + seq"]);
}

#[test]
fn a_difference_is_a_dimension_only_where_it_cannot_be_negative() {
    // MPT's ALiBi `alibi[..., 64 - seq:]` is seq long only where seq ≤ 64
    // (for seq = 65 it starts at -1: one column, which broadcasts); a
    // Reshape to seq - 1 is to -1 (inferred) where seq is 0.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("seq"), D::N(8)]));
    let alibi = b.init("alibi", tensor(FLOAT, &[4, 64], &vec![0.0; 4 * 64]));
    let s = b.node("Shape", &[&x], vec![]);
    let (zero, one) = (b.init("zero", ints(&[0])), b.init("one", ints(&[1])));
    let seq = b.node("Gather", &[&s, &zero], vec![attr_int("axis", 0)]);
    let n = b.init("n", ints(&[64]));
    let start = b.node("Sub", &[&n, &seq], vec![]);
    let end = b.init("end", ints(&[i64::MAX]));
    let cut = b.node("Slice", &[&alibi, &start, &end, &one], vec![]);
    let ones = b.input("ones", FLOAT, Some(&[sym("seq"), sym("seq")]));
    let sum = b.node("Add", &[&ones, &cut], vec![]);
    b.output(&sum, FLOAT, None);
    assert_eq!(shape(&b, 14, &cut).unwrap(), ["4".to_string(), format!("{cut}#1")]);
    let less = b.node("Sub", &[&seq, &one], vec![]);
    let target = b.node("Concat", &[&less, &one], vec![attr_int("axis", 0)]);
    let reshaped = b.node("Reshape", &[&x, &target], vec![]);
    assert_eq!(shape(&b, 14, &reshaped).unwrap(), [format!("{reshaped}#0"), "1".to_string()]);
    let more = b.node("Add", &[&seq, &one], vec![]);
    let target = b.node("Concat", &[&more, &one], vec![attr_int("axis", 0)]);
    let reshaped = b.node("Reshape", &[&x, &target], vec![]);
    assert_eq!(shape(&b, 14, &reshaped).unwrap(), ["seq + 1", "1"]);
}

#[test]
fn a_buffer_sliced_to_the_sequence_broadcasts_as_the_sequence() {
    // GPT-2's causal mask and BERT's position ids: buffer[..., :seq] is
    // min(seq, 64) long; beside seq in a broadcast it is seq (it is seq, or
    // 64 < seq and the run fails), and a live broadcast proves it seq.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("batch"), sym("seq"), D::N(32)]));
    let buffer = b.init("buffer", tensor(FLOAT, &[1, 64, 32], &vec![0.0; 64 * 32]));
    let s = b.node("Shape", &[&x], vec![]);
    let one = b.init("one", ints(&[1]));
    let seq = b.node("Gather", &[&s, &one], vec![attr_int("axis", 0)]);
    let (zero, axis) = (b.init("zero", ints(&[0])), b.init("axis", ints(&[1])));
    let cut = b.node("Slice", &[&buffer, &zero, &seq, &axis], vec![]);
    assert_eq!(shape(&b, 14, &cut).unwrap(), ["1", "min(1·$seq, 64)", "32"]);
    let sum = b.node("Add", &[&x, &cut], vec![]);
    assert_eq!(shape(&b, 14, &sum).unwrap(), ["batch", "seq", "32"]);
    b.output(&sum, FLOAT, None);
    assert_eq!(shape(&b, 14, &cut).unwrap(), ["1", "seq", "32"], "the Add runs");
    // The last seq rows of an axis of seq rows (T5's position bias) are the axis.
    let neg = b.node("Neg", &[&seq], vec![]);
    let end = b.init("end", ints(&[i64::MAX]));
    let last = b.node("Slice", &[&x, &neg, &end, &axis], vec![]);
    assert_eq!(shape(&b, 14, &last).unwrap(), ["batch", "seq", "32"]);
    // A buffer of one row may stay 1 beside seq: nothing is proved.
    let mut b1 = Builder::default();
    let x = b1.input("x", FLOAT, Some(&[sym("batch"), sym("seq"), D::N(32)]));
    let row = b1.init("row", tensor(FLOAT, &[1, 1, 32], &vec![0.0; 32]));
    let s = b1.node("Shape", &[&x], vec![]);
    let one = b1.init("one", ints(&[1]));
    let seq = b1.node("Gather", &[&s, &one], vec![attr_int("axis", 0)]);
    let (zero, axis) = (b1.init("zero", ints(&[0])), b1.init("axis", ints(&[1])));
    let cut = b1.node("Slice", &[&row, &zero, &seq, &axis], vec![]);
    let sum = b1.node("Add", &[&x, &cut], vec![]);
    b1.output(&sum, FLOAT, None);
    assert_eq!(shape(&b1, 14, &cut).unwrap(), ["1", "min(1·$seq, 1)", "32"]);
}

#[test]
fn a_broadcast_met_again_by_one_of_its_dimensions_is_that_dimension() {
    // BLOOM with its cache: ALiBi, sized from the mask's declared length a,
    // is added to scores of k keys (s: k, a, or 1 where both are), and the
    // sum again to a mask of k keys, which the product with v proves k. s
    // is then k or 1, and 1 only where k is: s is k.
    let build = |first: &str, live: bool| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("n"), sym(first)]));
        let a = b.input("a", FLOAT, Some(&[sym("n"), sym("a")]));
        let m = b.input("m", FLOAT, Some(&[sym("n"), sym("k")]));
        let v = b.input("v", FLOAT, Some(&[sym("k"), D::N(4)]));
        let s = b.node("Add", &[&x, &a], vec![]);
        let t = b.node("Add", &[&s, &m], vec![]);
        let y = b.node("MatMul", &[&t, &v], vec![]);
        b.output(if live { &y } else { &s }, FLOAT, None);
        (b, s)
    };
    let (b, s) = build("k", true);
    assert_eq!(shape(&b, 14, &s).unwrap(), ["n", "k"]);
    // Near-misses. Scores of j keys: s may be 1 (j = a = 1) beside k keys.
    let (b, s) = build("j", true);
    assert_eq!(shape(&b, 14, &s).unwrap(), ["n", format!("{s}#1").as_str()]);
    // The second Add and the product not run: nothing proves t is k.
    let (b, s) = build("k", false);
    assert_eq!(shape(&b, 14, &s).unwrap(), ["n", format!("{s}#1").as_str()]);
}

#[test]
fn a_broadcast_broadcast_again_with_what_it_was_made_of_is_itself() {
    // SEW-D: the scores' length is an Add of two convolved lengths (j, k:
    // the result is j, k, or 1 where both are), and the mask of length j
    // meets it again: j is the result or 1, so the result stands.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("n"), sym("j")]));
    let y = b.input("y", FLOAT, Some(&[sym("n"), sym("k")]));
    let m = b.input("m", FLOAT, Some(&[D::N(1), sym("j")]));
    let other = b.input("other", FLOAT, Some(&[D::N(1), sym("i")]));
    let s = b.node("Add", &[&x, &y], vec![]);
    let again = b.node("Add", &[&s, &m], vec![]);
    let beside = b.node("Add", &[&s, &other], vec![]);
    assert_eq!(shape(&b, 14, &again).unwrap(), ["n", format!("{s}#1").as_str()]);
    // Near-miss: i is not among what s was made of.
    assert_eq!(shape(&b, 14, &beside).unwrap(), ["n", format!("{beside}#1").as_str()]);
}

#[test]
fn torch_expand_of_minus_one_keeps_the_sizes_it_names() {
    // mask.expand(batch, -1, -1, -1): Expand(m, Where(Equal(s, -1), ones, s))
    // with s = [batch, -1, -1, -1]; a dimension is never -1.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("batch"), D::N(7)]));
    let m = b.input("m", FLOAT, Some(&[D::N(1), D::N(1), D::N(7), D::N(7)]));
    let s = b.node("Shape", &[&x], vec![]);
    let zero = b.init("zero", tensor(INT64, &[], &[0.0]));
    let batch = b.node("Gather", &[&s, &zero], vec![attr_int("axis", 0)]);
    let axes = b.init("axes", ints(&[0]));
    let batch = b.node("Unsqueeze", &[&batch, &axes], vec![]);
    let rest = b.init("rest", ints(&[-1, -1, -1]));
    let target = b.node("Concat", &[&batch, &rest], vec![attr_int("axis", 0)]);
    let four = b.init("four", ints(&[4]));
    let ones = b.node("ConstantOfShape", &[&four], vec![attr_tensor("value", tensor(INT64, &[1], &[1.0]))]);
    let minus = b.init("minus", tensor(INT64, &[], &[-1.0]));
    let minus_ones = b.node("Mul", &[&ones, &minus], vec![]);
    let is_minus = b.node("Equal", &[&target, &minus_ones], vec![]);
    let sizes = b.node("Where", &[&is_minus, &ones, &target], vec![]);
    let expanded = b.node("Expand", &[&m, &sizes], vec![]);
    assert_eq!(shape(&b, 14, &expanded).unwrap(), ["batch", "1", "7", "7"]);
}

#[test]
fn a_model_no_run_of_which_succeeds_learns_no_equalities() {
    // t = 7 by one contraction and 9 by another: no run succeeds, and no
    // fact is taken from either.
    let mut b = Builder::default();
    let q = b.input("q", FLOAT, Some(&[sym("t"), D::N(8)]));
    let v7 = b.input("v7", FLOAT, Some(&[D::N(7), D::N(8)]));
    let v9 = b.input("v9", FLOAT, Some(&[D::N(9), D::N(8)]));
    let qt = b.node("Transpose", &[&q], vec![]);
    let a = b.node("MatMul", &[&qt, &v7], vec![]);
    let c = b.node("MatMul", &[&qt, &v9], vec![]);
    b.output(&a, FLOAT, None);
    b.output(&c, FLOAT, None);
    assert_eq!(shape(&b, 14, &q).unwrap(), ["t", "8"]);
}

#[test]
fn position_ids_from_the_mask_keep_their_shape_into_the_embedding() {
    // OPT: positions = CumSum(mask, 1) · mask − 1, then Gather(table, positions).
    let mut b = Builder::default();
    let mask = b.input("mask", INT64, Some(&[sym("batch"), sym("seq")]));
    let one = b.init("one", tensor(INT64, &[], &[1.0]));
    let table = b.init("table", tensor(FLOAT, &[64, 32], &vec![0.0; 64 * 32]));
    let sum = b.node("CumSum", &[&mask, &one], vec![]);
    let masked = b.node("Mul", &[&sum, &mask], vec![]);
    let positions = b.node("Sub", &[&masked, &one], vec![]);
    let embedded = b.node("Gather", &[&table, &positions], vec![]);
    assert_eq!(shape(&b, 14, &embedded).unwrap(), ["batch", "seq", "32"]);
    // Range(0, seq, 1) has seq elements; a Slice to the end keeps an axis.
    let zero = b.init("zero", tensor(INT64, &[], &[0.0]));
    let s = b.node("Shape", &[&mask], vec![]);
    let seq = b.node("Gather", &[&s, &one], vec![attr_int("axis", 0)]);
    let range = b.node("Range", &[&zero, &seq, &one], vec![]);
    assert_eq!(shape(&b, 14, &range).unwrap(), ["seq"]);
    let (starts, ends, axes) = (b.init("st", ints(&[1])), b.init("en", ints(&[i64::MAX])), b.init("ax", ints(&[0])));
    let sliced = b.node("Slice", &[&embedded, &starts, &ends, &axes], vec![]);
    let whole = b.init("st0", ints(&[0]));
    let kept = b.node("Slice", &[&embedded, &whole, &ends, &axes], vec![]);
    let (two, last) = (b.init("two", ints(&[2])), b.init("last", ints(&[-1])));
    let part = b.node("Slice", &[&embedded, &two, &ends, &last], vec![]);
    assert_eq!(shape(&b, 14, &kept).unwrap(), ["batch", "seq", "32"]);
    assert_eq!(shape(&b, 14, &part).unwrap(), ["batch", "seq", "30"]);
    assert_eq!(shape(&b, 14, &sliced).unwrap()[1..], ["seq", "32"], "a symbolic axis sliced from 1 is unknown");
}

#[test]
fn a_declared_symbol_yields_to_a_derived_number() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(64)]));
    let y = b.node("Relu", &[&x], vec![]);
    b.graph.value_info.push(common::build::value_info(&y, FLOAT, Some(&[sym("b"), sym("hidden")])));
    let z = b.node("Relu", &[&x], vec![]);
    b.graph.value_info.push(common::build::value_info(&z, FLOAT, Some(&[D::Unknown, D::Unknown])));
    assert_eq!(shape(&b, 14, &y).unwrap(), ["b", "64"]);
    assert_eq!(shape(&b, 14, &z).unwrap(), ["b", "64"]);
}

#[test]
fn conv_flatten_tile_and_einsum_shapes() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("n"), D::N(3), D::N(16), D::N(15)]));
    let w = b.init("w", tensor(FLOAT, &[8, 3, 4, 3], &vec![0.0; 8 * 3 * 4 * 3]));
    let conv = b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[4, 2]), attr_ints("pads", &[0, 1, 0, 1])]);
    assert_eq!(shape(&b, 17, &conv).unwrap(), ["n", "8", "4", "8"]);
    let flat = b.node("Flatten", &[&conv], vec![attr_int("axis", 2)]);
    assert_eq!(shape(&b, 17, &flat).unwrap(), ["8·n", "32"]);
    let reps = b.init("reps", ints(&[1, 2, 1, 3]));
    let tiled = b.node("Tile", &[&conv, &reps], vec![]);
    assert_eq!(shape(&b, 17, &tiled).unwrap(), ["n", "16", "4", "24"]);
    let q = b.input("q", FLOAT, Some(&[sym("b"), D::N(2), sym("s"), D::N(8)]));
    let k = b.input("k", FLOAT, Some(&[sym("b"), D::N(2), sym("t"), D::N(8)]));
    let scores = b.node("Einsum", &[&q, &k], vec![attr_string("equation", "bhqd,bhkd->bhqk")]);
    assert_eq!(shape(&b, 17, &scores).unwrap(), ["b", "2", "s", "t"]);
    // An ellipsis spans the axes beyond an operand's letters, broadcast
    // across the operands; OneHot inserts its depth.
    let ids = b.input("ids", INT64, Some(&[sym("b"), sym("n")]));
    let depth = b.init("depth", tensor(INT64, &[], &[6.0]));
    let values = b.init("values", tensor(FLOAT, &[2], &[0.0, 1.0]));
    let one_hot = b.node("OneHot", &[&ids, &depth, &values], vec![]);
    assert_eq!(shape(&b, 17, &one_hot).unwrap(), ["b", "n", "6"]);
    let hidden = b.input("hidden", FLOAT, Some(&[D::N(1), sym("b"), sym("n"), D::N(8)]));
    let global = b.node("Einsum", &[&hidden, &one_hot], vec![attr_string("equation", "...nd,...ng->...gd")]);
    assert_eq!(shape(&b, 17, &global).unwrap(), ["1", "b", "6", "8"]);
    let no_arrow = b.node("Einsum", &[&hidden, &one_hot], vec![attr_string("equation", "...nd,...ng")]);
    assert_eq!(shape(&b, 17, &no_arrow), None);
}

#[test]
fn convolved_and_pooled_lengths_of_a_symbolic_length_are_one_dimension() {
    // SEW: a sequence of len frames, convolved (kernel 16, pads 8, stride
    // 2: floor(len / 2) + 1) and cut by one (`[..., :-1]`), and pooled
    // (kernel 2, stride 2: floor((len - 2) / 2) + 1): both floor(len / 2)
    // where len ≥ 2, which the run proves here (a Gather of x's second
    // frame). At len = 1 ONNX Runtime's pool keeps one window
    // (tests/kernel.rs), and the cut none.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(4), sym("len")]));
    let unproved = b.node("AveragePool", &[&x], vec![attr_ints("kernel_shape", &[2]), attr_ints("strides", &[2])]);
    assert_eq!(shape(&b, 17, &unproved).unwrap(), ["b".to_string(), "4".to_string(), format!("{unproved}#2")]);
    let second = b.init("second", tensor(INT64, &[], &[1.0]));
    b.node_to("Gather", &[&x, &second], &["frame"], vec![attr_int("axis", 2)]);
    b.output("frame", FLOAT, None);
    let w = b.init("w", tensor(FLOAT, &[4, 1, 16], &vec![0.0; 64]));
    let conv =
        b.node("Conv", &[&x, &w], vec![attr_ints("pads", &[8, 8]), attr_ints("strides", &[2]), attr_int("group", 4)]);
    assert_eq!(shape(&b, 17, &conv).unwrap(), ["b", "4", "floor((1·$len)/2) + 1"]);
    let (zero, minus_one, axis) =
        (b.init("zero", ints(&[0])), b.init("minus_one", ints(&[-1])), b.init("axis", ints(&[2])));
    let cut = b.node("Slice", &[&conv, &zero, &minus_one, &axis], vec![]);
    let pooled = b.node("AveragePool", &[&x], vec![attr_ints("kernel_shape", &[2]), attr_ints("strides", &[2])]);
    assert_eq!(shape(&b, 17, &cut).unwrap(), shape(&b, 17, &pooled).unwrap());
    let sum = b.node("Add", &[&cut, &pooled], vec![]);
    assert_eq!(shape(&b, 17, &sum).unwrap(), ["b", "4", "floor((1·$len)/2)"]);
    // floor((2·len + 1) / 2) is len; a cut past what the axis may hold is unknown.
    let w2 = b.init("w2", tensor(FLOAT, &[4, 4, 1], &vec![0.0; 16]));
    let doubled = b.node("Concat", &[&x, &x], vec![attr_int("axis", 2)]);
    let halved = b.node("Conv", &[&doubled, &w2], vec![attr_ints("strides", &[2])]);
    assert_eq!(shape(&b, 17, &halved).unwrap(), ["b", "4", "len"]);
    // (`[..., :-2]` is `len − 2` where the run proves len ≥ 2; three past it
    // is not proved.)
    let minus_three = b.init("minus_three", ints(&[-3]));
    let short = b.node("Slice", &[&x, &zero, &minus_three, &axis], vec![]);
    assert_eq!(shape(&b, 17, &short).unwrap(), ["b".to_string(), "4".to_string(), format!("{short}#2")]);
    // A Conv's input has its weight's rank: the output's rank is known where
    // the input's shape is not.
    let unknown = b.input("unknown", FLOAT, None);
    let conv = b.node("Conv", &[&unknown, &w], vec![]);
    assert_eq!(shape(&b, 17, &conv).map(|s| s.len()), Some(3));
}

#[test]
fn a_pool_that_rounds_up_has_the_length_of_the_windows_it_starts() {
    // Funnel's pooled residuals: avg_pool2d(kernel (2, 1), stride (2, 1),
    // ceil_mode) over a symbolic length is ceil(len / 2) = floor((len + 1)
    // / 2); its last window starts inside the input (end pad + stride ≤
    // kernel reach), so the runtimes that drop a window starting in the
    // end's pad drop none (tests/kernel.rs pins ONNX Runtime's lengths).
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(1), sym("len"), D::N(8)]));
    let pool = |b: &mut Builder, kernel: &[i64], strides: &[i64], pads: &[i64]| {
        let mut attributes =
            vec![attr_ints("kernel_shape", kernel), attr_ints("strides", strides), attr_int("ceil_mode", 1)];
        if !pads.is_empty() {
            attributes.push(attr_ints("pads", pads));
        }
        b.node("AveragePool", &[&x], attributes)
    };
    let halved = pool(&mut b, &[2, 1], &[2, 1], &[]);
    assert_eq!(shape(&b, 17, &halved).unwrap(), ["b", "1", "floor((1·$len + 1)/2)", "8"]);
    // The same length written as floor((len + 1) / 2) by a Conv: one dimension.
    let w = b.init("w", tensor(FLOAT, &[1, 1, 2, 1], &[0.0; 2]));
    let conv = b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[2, 1]), attr_ints("pads", &[1, 0, 0, 0])]);
    assert_eq!(shape(&b, 17, &conv).unwrap(), shape(&b, 17, &halved).unwrap());
    // A stride past the kernel's reach: the last window may start in the
    // end's pad (dropped by ONNX Runtime, kept by the formula): unknown.
    let sparse = pool(&mut b, &[2, 1], &[3, 1], &[]);
    assert_eq!(shape(&b, 17, &sparse).unwrap()[2], format!("{sparse}#2"));
    let padded = pool(&mut b, &[2, 1], &[2, 1], &[0, 0, 1, 0]);
    assert_eq!(shape(&b, 17, &padded).unwrap()[2], format!("{padded}#2"));
    // A Conv has no ceil_mode: one written on it changes nothing.
    let w2 = b.init("w2", tensor(FLOAT, &[1, 1, 2, 1], &[0.0; 2]));
    let conv = b.node("Conv", &[&x, &w2], vec![attr_ints("strides", &[2, 1]), attr_int("ceil_mode", 1)]);
    assert_eq!(shape(&b, 17, &conv).unwrap()[2], "floor((1·$len)/2)");
    // A pad at the start moves no window into the end's pad.
    let leading = pool(&mut b, &[3, 1], &[2, 1], &[1, 0, 0, 0]);
    assert_eq!(shape(&b, 17, &leading).unwrap()[2], "floor((1·$len + 1)/2)");
}

#[test]
fn a_cut_back_to_a_length_it_was_computed_from_is_that_length() {
    // HuBERT's positional Conv (kernel 16, pads 8) is one step longer than
    // its input, of length len - 2 here (a kernel of 3 before it): cut by
    // one, it is len - 2 again, proved a size because the Conv's input has
    // that length. Cut by two, len - 3 is no length anything upstream has
    // (for len = 2 the cut is empty): unknown. A Shape of the input reads
    // len - 2 as an element, for the same reason.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(4), sym("len")]));
    let w3 = b.init("w3", tensor(FLOAT, &[4, 4, 3], &vec![0.0; 48]));
    let shorter = b.node("Conv", &[&x, &w3], vec![]);
    assert_eq!(shape(&b, 17, &shorter).unwrap(), ["b", "4", "len - 2"]);
    let w16 = b.init("w16", tensor(FLOAT, &[4, 1, 16], &vec![0.0; 64]));
    let conv = b.node("Conv", &[&shorter, &w16], vec![attr_ints("pads", &[8, 8]), attr_int("group", 4)]);
    assert_eq!(shape(&b, 17, &conv).unwrap(), ["b", "4", "len - 1"]);
    let (zero, axis) = (b.init("zero", ints(&[0])), b.init("axis", ints(&[2])));
    let (minus_one, minus_two) = (b.init("minus_one", ints(&[-1])), b.init("minus_two", ints(&[-2])));
    let cut = b.node("Slice", &[&conv, &zero, &minus_one, &axis], vec![]);
    assert_eq!(shape(&b, 17, &cut).unwrap(), ["b", "4", "len - 2"]);
    let sum = b.node("Add", &[&cut, &shorter], vec![]);
    assert_eq!(shape(&b, 17, &sum).unwrap(), ["b", "4", "len - 2"]);
    let too_short = b.node("Slice", &[&conv, &zero, &minus_two, &axis], vec![]);
    assert_eq!(shape(&b, 17, &too_short).unwrap()[2], format!("{too_short}#2"));
    let of_x = b.node("Slice", &[&x, &zero, &minus_two, &axis], vec![]);
    assert_eq!(shape(&b, 17, &of_x).unwrap()[2], format!("{of_x}#2"), "len - 2 is computed from x, not x's");
    let dims = b.node("Shape", &[&shorter], vec![]);
    let target = b.node("Concat", &[&dims, &minus_one], vec![attr_int("axis", 0)]);
    let reshaped = b.node("Reshape", &[&shorter, &target], vec![]);
    assert_eq!(shape(&b, 17, &reshaped).unwrap(), ["b", "4", "len - 2", "1"]);
}

#[test]
fn a_grid_side_computed_as_a_root_and_a_resize_to_sizes_have_their_numbers() {
    // DINOv2 reshapes its position embeddings [1, 4, 32] to a grid of side
    // Cast(Pow(4.0, 0.5)), ONNX Runtime's root of a perfect square (pinned
    // in tests/kernel.rs), and resizes it to the image's grid by sizes.
    // Pow(5.0, 0.5) is no integer, Pow(4.0, 0.5) in f64 no measured fact:
    // neither side is a number.
    let mut b = Builder::default();
    let table = b.init("table", tensor(FLOAT, &[1, 4, 32], &vec![0.0; 128]));
    let side = |b: &mut Builder, elem: i32, square: f64| {
        let (x, half) = (b.constant(tensor(elem, &[], &[square])), b.constant(tensor(elem, &[], &[0.5])));
        let root = b.node("Pow", &[&x, &half], vec![]);
        let side = b.node("Cast", &[&root], vec![attr_int("to", 7)]);
        let zero = b.init(&format!("zero_{elem}_{square}"), ints(&[0]));
        b.node("Unsqueeze", &[&side, &zero], vec![])
    };
    let grid = |b: &mut Builder, s: &str| {
        let (one, d) = (b.init(&format!("one_{s}"), ints(&[1])), b.init(&format!("d_{s}"), ints(&[32])));
        let target = b.node("Concat", &[&one, s, s, &d], vec![attr_int("axis", 0)]);
        b.node("Reshape", &[&table, &target], vec![])
    };
    let s = side(&mut b, FLOAT, 4.0);
    let square = grid(&mut b, &s);
    assert_eq!(shape(&b, 17, &square).unwrap(), ["1", "2", "2", "32"]);
    for (elem, x) in [(FLOAT, 5.0), (11, 4.0)] {
        let s = side(&mut b, elem, x);
        let other = grid(&mut b, &s);
        assert_eq!(shape(&b, 17, &other).unwrap()[1], format!("{other}#1"), "Pow({x}, 0.5) of type {elem}");
    }
    let image = b.input("image", FLOAT, Some(&[sym("b"), D::N(3), sym("h"), D::N(16)]));
    let dims = b.node("Shape", &[&image], vec![]);
    let (start, end, zero) = (b.init("start", ints(&[2])), b.init("end", ints(&[4])), b.init("zero", ints(&[0])));
    let hw = b.node("Slice", &[&dims, &start, &end, &zero], vec![]);
    let lead = b.init("lead", ints(&[1, 32]));
    let sizes = b.node("Concat", &[&lead, &hw], vec![attr_int("axis", 0)]);
    let perm = b.node("Transpose", &[&square], vec![attr_ints("perm", &[0, 3, 1, 2])]);
    let resized = b.node("Resize", &[&perm, "", "", &sizes], vec![attr_string("mode", "cubic")]);
    assert_eq!(shape(&b, 18, &resized).unwrap(), ["1", "32", "h", "16"]);
    let kept = b.node("Resize", &[&perm, "", "", &sizes], vec![attr_string("keep_aspect_ratio_policy", "not_larger")]);
    assert_eq!(shape(&b, 18, &kept).unwrap()[2], format!("{kept}#2"), "not stretched: not the sizes");
}

/// An If branch computing its one output from the outer `x` with `build`.
fn branch(name: &str, build: impl Fn(&mut Builder) -> String) -> GraphProto {
    let mut body = Builder::default();
    let y = build(&mut body);
    body.output(&y, FLOAT, None);
    GraphProto { name: Some(name.into()), ..body.graph }
}

#[test]
fn an_if_output_has_what_both_branches_give_it_or_what_the_branch_its_condition_takes_gives() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(4)]));
    let c = b.input("c", BOOL, Some(&[]));
    let same = branch("same", |g| g.node("Neg", &["x"], vec![]));
    let wider = branch("wider", |g| {
        let reps = g.init("reps", ints(&[1, 2]));
        g.node("Tile", &["x", &reps], vec![])
    });
    let unsqueezed = branch("unsqueezed", |g| {
        let axes = g.init("axes", ints(&[0]));
        g.node("Unsqueeze", &["x", &axes], vec![])
    });
    // Both branches name their NonZero alike: its atoms mean nothing outside.
    let own = branch("own", |g| g.node("NonZero", &["x"], vec![]));
    // Not(Shape(x)[1] == 4): false on every run.
    let s = b.node("Shape", &["x"], vec![]);
    let one = b.init("one", tensor(INT64, &[], &[1.0]));
    let four = b.init("four", tensor(INT64, &[], &[4.0]));
    let d = b.node("Gather", &[&s, &one], vec![]);
    let is_four = b.node("Equal", &[&d, &four], vec![]);
    let not_four = b.node("Not", &[&is_four], vec![]);
    let cases = [
        ("both", &c, &same, &same, Some(vec!["b", "4"])),
        ("differ", &c, &same, &wider, Some(vec!["b", "differ#1"])),
        ("ranks", &c, &same, &unsqueezed, None),
        ("own", &c, &own, &own, Some(vec!["own#0", "own#1"])),
        ("else_taken", &not_four, &unsqueezed, &same, Some(vec!["b", "4"])),
        ("then_taken", &is_four, &unsqueezed, &same, Some(vec!["1", "b", "4"])),
    ];
    for (out, cond, then, other, _) in &cases {
        let branches = vec![attr_graph("then_branch", (*then).clone()), attr_graph("else_branch", (*other).clone())];
        b.node_to("If", &[cond], &[out], branches);
    }
    for (out, _, _, _, expected) in cases {
        assert_eq!(shape(&b, 14, out), expected.map(|e| e.iter().map(|d| d.to_string()).collect()), "{out}");
    }
}

#[test]
fn fused_matmul_and_gather_elements_shapes() {
    let mut b = Builder::default();
    let q = b.input("q", FLOAT, Some(&[sym("b"), D::N(2), sym("s"), D::N(8)]));
    let k = b.input("k", FLOAT, Some(&[sym("b"), D::N(2), sym("t"), D::N(8)]));
    let scores = b.node("FusedMatMul", &[&q, &k], vec![attr_int("transB", 1)]);
    b.graph.node.last_mut().unwrap().domain = Some("com.microsoft".into());
    assert_eq!(shape(&b, 17, &scores).unwrap(), ["b", "2", "s", "t"]);
    let batch = b.node("FusedMatMul", &[&q, &k], vec![attr_int("transB", 1), attr_int("transBatchA", 1)]);
    b.graph.node.last_mut().unwrap().domain = Some("com.microsoft".into());
    assert_eq!(shape(&b, 17, &batch), None);
    let data = b.input("data", FLOAT, Some(&[sym("b"), sym("s"), D::N(16)]));
    let index = b.input("index", INT64, Some(&[sym("b"), sym("s"), sym("s")]));
    let gathered = b.node("GatherElements", &[&data, &index], vec![attr_int("axis", -1)]);
    assert_eq!(shape(&b, 17, &gathered).unwrap(), ["b", "s", "s"]);
}

#[test]
fn a_last_axis_is_known_where_the_rank_is_not() {
    // An embedding Gather over indices of unknown rank, added to a value of
    // unknown rank: the table's last axis is the sum's.
    let mut b = Builder::default();
    let ids = b.input("ids", INT64, None);
    let other = b.input("other", FLOAT, None);
    let table = b.init("table", tensor(FLOAT, &[64, 32], &vec![0.0; 64 * 32]));
    let embedded = b.node("Gather", &[&table, &ids], vec![]);
    let sum = b.node("Add", &[&other, &embedded], vec![]);
    let cast = b.node("Cast", &[&sum], vec![attr_int("to", FLOAT as i64)]);
    let unknown = b.node("Add", &[&other, &ids], vec![]);
    let model = b.model(14);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 14, &scope);
    let shapes = g.shapes();
    assert_eq!(shapes.rank(&sum), None);
    for v in [&embedded, &sum, &cast] {
        assert_eq!(shapes.last_axis(v).and_then(|d| d.value()), Some(32), "{v}");
    }
    assert_eq!(shapes.last_axis(&unknown), None);

    // LongT5's global tokens: Einsum("...nd,...ng->...gd", hidden, one_hot)
    // ends with d, hidden's last axis, whatever the ellipsis covers; a Mod
    // broadcasts. Where d's sizes differ (and neither is 1), none is told.
    let mut b = Builder::default();
    let hidden = b.input("hidden", FLOAT, Some(&[sym("b"), sym("n"), D::N(32)]));
    let one_hot = b.input("one_hot", FLOAT, None);
    let global = b.node("Einsum", &[&hidden, &one_hot], vec![attr_string("equation", "...nd,...ng->...gd")]);
    let wide = b.input("wide", FLOAT, Some(&[sym("b"), sym("n"), D::N(16)]));
    let clash = b.node("Einsum", &[&hidden, &wide], vec![attr_string("equation", "...nd,...nd->...d")]);
    let m = b.node("Mod", &[&hidden, &one_hot], vec![]);
    let model = b.model(14);
    let g = Graph::new(model.graph.as_ref().unwrap(), 14, &scope);
    let shapes = g.shapes();
    assert_eq!(shapes.last_axis(&global).and_then(|d| d.value()), Some(32));
    assert_eq!(shapes.last_axis(&clash).and_then(|d| d.value()), None);
    assert_eq!(shapes.last_axis(&m).and_then(|d| d.value()), Some(32));
}

/// A proved length far beyond any shape's rank is not followed element by
/// element: `Range(0, 2^40, 1)`'s length fed to `ConstantOfShape`, and as a
/// Slice's `starts`, once made the process allocate 2^40 elements and abort.
#[test]
fn a_huge_proved_length_is_opaque_not_allocated() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4)]));
    let (start, limit, delta) = (
        b.init("r0", tensor(INT64, &[], &[0.0])),
        b.init("r1", tensor(INT64, &[], &[2f64.powi(40)])),
        b.init("r2", tensor(INT64, &[], &[1.0])),
    );
    let range = b.node("Range", &[&start, &limit, &delta], vec![]);
    let length = b.node("Shape", &[&range], vec![]);
    let filled = b.node("ConstantOfShape", &[&length], vec![]);
    let sliced = b.node("Slice", &[&x, &range, &range], vec![]);
    let model = b.model(18);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 18, &scope);
    let shapes = g.shapes();
    assert_eq!(shapes.shape(&range).unwrap()[0].value(), Some(1 << 40));
    assert!(shapes.shape_tensor(&filled).is_none());
    assert!(shapes.shape_tensor(&range).is_none());
    assert_eq!(shapes.rank(&sliced), Some(1));
}

#[test]
fn extreme_integers_in_shape_arguments_give_unknown_shapes_not_panics() {
    // Debug builds check integer overflow: every value here must derive
    // without one (an overflow means "unknown").
    let extremes = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX];
    let mut derived = 0;
    for &a in &extremes {
        for &c in &extremes {
            let mut b = Builder::default();
            let x = b.input("x", FLOAT, Some(&[D::N(i64::MAX / 2), D::N(3), sym("s")]));
            let target = b.init("target", ints(&[a, c, -1]));
            let reshaped = b.node("Reshape", &[&x, &target], vec![]);
            let (starts, ends, axes, steps) = (
                b.init("st", ints(&[a])),
                b.init("en", ints(&[c])),
                b.init("ax", ints(&[0])),
                b.init("sp", ints(&[c])),
            );
            let sliced = b.node("Slice", &[&x, &starts, &ends, &axes, &steps], vec![]);
            let shape_of = b.node("Shape", &[&x], vec![]);
            let sliced_shape = b.node("Slice", &[&shape_of, &starts, &ends, &axes, &steps], vec![]);
            let expand_to = b.init("to", ints(&[a, c, 2]));
            let expanded = b.node("Expand", &[&x, &expand_to], vec![]);
            let reps = b.init("reps", ints(&[a, c, 2]));
            let tiled = b.node("Tile", &[&x, &reps], vec![]);
            let (start, limit, delta) = (
                b.init("r0", tensor(INT64, &[], &[a as f64])),
                b.init("r1", tensor(INT64, &[], &[c as f64])),
                b.init("r2", tensor(INT64, &[], &[c as f64])),
            );
            let range = b.node("Range", &[&start, &limit, &delta], vec![]);
            let small = b.init("small", tensor(FLOAT, &[2], &[1.0, 2.0]));
            let small_target = b.init("small_target", ints(&[a, c, -1]));
            let reshaped_constant = b.node("Reshape", &[&small, &small_target], vec![]);
            let conv_w = b.init("w", tensor(FLOAT, &[1, 1, 1], &[1.0]));
            let conv = b.node("Conv", &[&x, &conv_w], vec![attr_ints("strides", &[c]), attr_ints("pads", &[a, c])]);
            let flat = b.node("Flatten", &[&tiled], vec![attr_int("axis", 2)]);
            let by_sliced_shape = b.node("Reshape", &[&x, &sliced_shape], vec![]);
            let values =
                [&reshaped, &sliced, &sliced_shape, &expanded, &tiled, &range, &reshaped_constant, &conv, &flat];
            for v in values.into_iter().chain([&by_sliced_shape]) {
                // Unknown, or sizes a tensor can have: an overflow that
                // wrapped would show as a negative size.
                for d in shape(&b, 18, v).into_iter().flatten() {
                    assert!(d.parse::<i64>().is_err() || !d.starts_with('-'), "{v} ({a}, {c}): a size of {d}");
                }
                derived += 1;
            }
        }
    }
    assert_eq!(derived, 7 * 7 * 10, "every value of every pair of extremes derived");
}

/// A node none of whose inputs is computed by the graph fails every
/// pattern at its first step, so no pass lists it as a declined candidate
/// (`--explain` names only real candidates): every op the passes anchor on
/// or start from, alone, with operands of x's shape or `[D]` constants.
#[test]
fn a_node_with_nothing_computed_before_it_is_no_candidate_of_any_pass() {
    let all: Vec<&str> = onnx_fuse::passes::ALL.iter().map(|p| p.name).collect();
    let ops = [
        "Mul",
        "Add",
        "Div",
        "Sub",
        "MatMul",
        "Pow",
        "Sqrt",
        "Softmax",
        "Tanh",
        "Erf",
        "Sigmoid",
        "Concat",
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "Where",
        "Cast",
    ];
    for op in ops {
        for with_vector in [false, true] {
            let mut b = Builder::default();
            b.input("x", FLOAT, Some(&[D::N(2), D::N(3), D::N(4)]));
            b.input("y", FLOAT, Some(&[D::N(2), D::N(3), D::N(4)]));
            let other = if with_vector { b.init("w", tensor(FLOAT, &[4], &[0.5, 1.0, 1.5, 2.0])) } else { "y".into() };
            let (inputs, attributes): (Vec<&str>, _) = match op {
                "Sqrt" | "Softmax" | "Tanh" | "Erf" | "Sigmoid" => (vec!["x"], vec![]),
                "Cast" => (vec!["x"], vec![attr_int("to", i64::from(FLOAT))]),
                "Concat" => (vec!["x", "y"], vec![attr_int("axis", -1)]),
                "Where" => (vec!["x", "x", &other], vec![]),
                "LayerNormalization" | "SimplifiedLayerNormalization" => (vec!["x", &other], vec![]),
                _ => (vec!["x", &other], vec![]),
            };
            let out = b.node(op, &inputs, attributes);
            b.output(&out, FLOAT, None);
            let (_, outcome) = common::fuse_model(&b.model(17), &all);
            let listed: Vec<_> = outcome.declined.iter().map(|d| format!("{}: {}", d.pass, d.reason)).collect();
            assert!(listed.is_empty(), "{op} alone (a [D] operand: {with_vector}): {listed:?}");
        }
    }
}

#[test]
fn torchs_pads_reordered_through_a_matrix_pad_the_axes_they_name() {
    // torch's F.pad(x, (0, 0, 0, p)) at opset 11+ (LongT5's blocks, Swin's
    // windows): the pads in torch's order, last axis first, `Reshape` to
    // [-1, 2], reversed by rows, transposed and flattened into ONNX's
    // [begins…, ends…]; p computed at run time (here len - 2, of a Conv).
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(4), sym("len")]));
    let w = b.init("w", tensor(FLOAT, &[4, 4, 3], &[0.0; 48]));
    let shorter = b.node("Conv", &[&x, &w], vec![]);
    let lengths = b.node("Shape", &[&shorter], vec![]);
    let last = b.init("last", ints(&[2]));
    let p = b.node("Gather", &[&lengths, &last], vec![attr_int("axis", 0)]);
    let (three, two) = (b.init("three", ints(&[0, 0, 0])), b.init("two", ints(&[0, 0])));
    let torch_order = b.node("Concat", &[&three, &p, &two], vec![attr_int("axis", 0)]);
    let pairs = b.init("pairs", ints(&[-1, 2]));
    let matrix = b.node("Reshape", &[&torch_order, &pairs], vec![]);
    let (start, end, axis, step) = (
        b.init("s", ints(&[-1])),
        b.init("e", ints(&[i64::MIN + 1])),
        b.init("a", ints(&[0])),
        b.init("st", ints(&[-1])),
    );
    let reversed = b.node("Slice", &[&matrix, &start, &end, &axis, &step], vec![]);
    let transposed = b.node("Transpose", &[&reversed], vec![attr_ints("perm", &[1, 0])]);
    let flat_shape = b.init("flat", ints(&[-1]));
    let pads = b.node("Reshape", &[&transposed, &flat_shape], vec![]);
    // torch's (0, 0, 0, p, 0, 0): the last axis unpadded, the middle one
    // (4 long) padded by p at its end. Read by rows that is
    // [0, 0 | 0, p | 0, 0], reversed by rows the same, transposed: begins
    // (0, 0, 0), ends (0, p, 0).
    let padded = b.node("Pad", &[&shorter, &pads], vec![]);
    assert_eq!(shape(&b, 17, &padded).unwrap(), ["b", "len + 2", "len - 2"]);
    // Constant pads; a crop is a length only where proved one.
    let grow = b.init("grow", ints(&[0, 0, 1, 0, 0, 1]));
    let grown = b.node("Pad", &[&x, &grow], vec![]);
    assert_eq!(shape(&b, 17, &grown).unwrap(), ["b", "4", "len + 2"]);
    let crop = b.init("crop", ints(&[0, -1, -1, 0, 0, 0]));
    let cropped = b.node("Pad", &[&x, &crop], vec![]);
    assert_eq!(shape(&b, 17, &cropped).unwrap(), ["b".to_string(), "3".to_string(), format!("{cropped}#2")]);
    // Before opset 11 the pads are an attribute; from 18 `axes` names the axes padded.
    let old = b.node("Pad", &[&x], vec![attr_ints("pads", &[0, 0, 2, 0, 0, 0])]);
    assert_eq!(shape(&b, 10, &old).unwrap(), ["b", "4", "len + 2"]);
    let (two_pads, last_axis) = (b.init("two_pads", ints(&[3, 0])), b.init("last_axis", ints(&[-1])));
    let on_axes = b.node("Pad", &[&x, &two_pads, "", &last_axis], vec![]);
    assert_eq!(shape(&b, 18, &on_axes).unwrap(), ["b", "4", "len + 3"]);
    // Flattened without the transpose the order differs: the reversal is
    // of rows, not of elements, so (0, p) stays (0, p) within its row.
    let flat_rows = b.node("Reshape", &[&reversed, &flat_shape], vec![]);
    let model = b.model(17);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 17, &scope);
    let elements = |v: &str| -> Vec<String> {
        g.shapes().shape_tensor(v).unwrap().iter().map(|d| d.as_ref().map_or("?".into(), |d| d.to_string())).collect()
    };
    assert_eq!(elements(&flat_rows), ["0", "0", "0", "len - 2", "0", "0"]);
    assert_eq!(elements(&pads), ["0", "0", "0", "0", "len - 2", "0"]);
}

/// `torch.ones(seq - 1, seq - 1)` padded by one row and column (Funnel's
/// cls mask): a ConstantOfShape's axes are its input's elements, whatever
/// they are computed from, since one below 0 fails the node; the same
/// element as a Reshape's target may be 0 or -1 there and stays unknown.
#[test]
fn a_constant_of_shape_has_the_axes_its_elements_compute() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(8)]));
    let s = b.node("Shape", &[&x], vec![]);
    let i1 = b.init("i1", tensor(INT64, &[], &[1.0]));
    let seq = b.node("Gather", &[&s, &i1], vec![]);
    let one = b.init("one", tensor(INT64, &[], &[1.0]));
    let less = b.node("Sub", &[&seq, &one], vec![]);
    let zero = b.init("zero_axis", ints(&[0]));
    let side = b.node("Unsqueeze", &[&less, &zero], vec![]);
    let dims = b.node("Concat", &[&side, &side], vec![attr_int("axis", 0)]);
    let ones = b.node("ConstantOfShape", &[&dims], vec![]);
    assert_eq!(shape(&b, 17, &ones).unwrap(), ["s - 1", "s - 1"]);
    let pads = b.init("pads", ints(&[1, 1, 0, 0]));
    let padded = b.node("Pad", &[&ones, &pads], vec![]);
    assert_eq!(shape(&b, 17, &padded).unwrap(), ["s", "s"]);
    let square = b.node("Reshape", &[&x, &dims], vec![]);
    assert_eq!(shape(&b, 17, &square).unwrap(), [format!("{square}#0"), format!("{square}#1")]);
}

/// MobileViT unfolds its feature map into patches of `math.ceil(h / 2) * 2`
/// rows, traced as float arithmetic on the map's sizes: `Cast(h → f32)`,
/// `Div(2.0)`, `Ceil`, `Mul(2.0)`, `Cast(→ i64)`, `Div(2)`. A number below
/// 2^24 divided by a whole number and rounded is exact, so where h and w
/// are numbers the patch count is one number wherever it is computed, and
/// two Reshapes to it agree (the -1 of the second one is the channels).
/// Where they are symbolic, nothing is derived: a float holds a size only
/// up to 2^24, and nothing bounds h.
#[test]
fn a_size_divided_by_a_whole_number_and_rounded_is_a_floor() {
    for (h, w) in [(D::N(8), D::N(10)), (sym("h"), sym("w"))] {
        let numbers = h == D::N(8);
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(8), h, w]));
        let s = b.node("Shape", &[&x], vec![]);
        let axis = |b: &mut Builder, i: i64| {
            let index = b.init(&format!("axis{i}"), tensor(INT64, &[], &[i as f64]));
            b.node("Gather", &[&s, &index], vec![])
        };
        let (h, w) = (axis(&mut b, 2), axis(&mut b, 3));
        let two = b.init("two", tensor(FLOAT, &[], &[2.0]));
        let two_i = b.init("two_i", tensor(INT64, &[], &[2.0]));
        let zero = b.init("zero_axis", ints(&[0]));
        // float(n) / divisor, rounded by `round` ("Ceil", "Floor" or a Cast's
        // truncation), as an int64 element.
        let rounded = |b: &mut Builder, n: &str, divisor: &str, round: &str| {
            let f = b.node("Cast", &[n], vec![attr_int("to", FLOAT as i64)]);
            let q = b.node("Div", &[&f, divisor], vec![]);
            let r = if round == "Cast" { q } else { b.node(round, &[&q], vec![]) };
            let i = b.node("Cast", &[&r], vec![attr_int("to", INT64 as i64)]);
            b.node("Unsqueeze", &[&i, &zero], vec![])
        };
        let up = rounded(&mut b, &h, &two, "Ceil");
        let three = b.init("three", tensor(FLOAT, &[], &[3.0]));
        let down = rounded(&mut b, &w, &three, "Floor");
        let truncated = rounded(&mut b, &w, &three, "Cast");
        let dims = b.node("Concat", &[&up, &down, &truncated], vec![attr_int("axis", 0)]);
        let ones = b.node("ConstantOfShape", &[&dims], vec![]);
        let expected =
            if numbers { ["4", "3", "3"].map(String::from) } else { [0, 1, 2].map(|i| format!("{ones}#{i}")) };
        assert_eq!(shape(&b, 17, &ones).unwrap(), expected);

        // MobileViT's patch count, n = ceil(h / 2) · 2 / 2 rows by ceil(w / 2)
        // columns, read by two Reshapes.
        let side = |b: &mut Builder, n: &str| {
            let f = b.node("Cast", &[n], vec![attr_int("to", FLOAT as i64)]);
            let q = b.node("Div", &[&f, &two], vec![]);
            let c = b.node("Ceil", &[&q], vec![]);
            let m = b.node("Mul", &[&c, &two], vec![]);
            let i = b.node("Cast", &[&m], vec![attr_int("to", INT64 as i64)]);
            b.node("Div", &[&i, &two_i], vec![])
        };
        let (rows, cols) = (side(&mut b, &h), side(&mut b, &w));
        let patches = b.node("Mul", &[&rows, &cols], vec![]);
        let patches = b.node("Unsqueeze", &[&patches, &zero], vec![]);
        let batch = axis(&mut b, 0);
        let four_i = b.init("four_i", tensor(INT64, &[], &[4.0]));
        let batches = b.node("Mul", &[&batch, &four_i], vec![]);
        let batches = b.node("Unsqueeze", &[&batches, &zero], vec![]);
        let batch = b.node("Unsqueeze", &[&batch, &zero], vec![]);
        let channels = b.init("channels", ints(&[8]));
        let four = b.init("four", ints(&[4]));
        let first = b.node("Concat", &[&batch, &channels, &patches, &four], vec![attr_int("axis", 0)]);
        let unfolded = b.node("Reshape", &[&x, &first], vec![]);
        let perm = b.node("Transpose", &[&unfolded], vec![attr_ints("perm", &[0, 3, 2, 1])]);
        let rest = b.init("rest", ints(&[-1]));
        let second = b.node("Concat", &[&batches, &patches, &rest], vec![attr_int("axis", 0)]);
        let again = b.node("Reshape", &[&perm, &second], vec![]);
        if numbers {
            assert_eq!(shape(&b, 17, &again).unwrap(), ["4·b", "20", "8"]);
            continue;
        }
        assert_ne!(shape(&b, 17, &again).unwrap()[1], "floor((1·$h + 1)/2)·floor((1·$w + 1)/2)");

        // Near-misses: a divisor that is no whole number, one computed at run
        // time, and a difference that may be negative are not followed.
        let half = b.init("two_and_a_half", tensor(FLOAT, &[], &[2.5]));
        let not_whole = rounded(&mut b, &h, &half, "Ceil");
        let wf = b.node("Cast", &[&w], vec![attr_int("to", FLOAT as i64)]);
        let computed = rounded(&mut b, &h, &wf, "Ceil");
        let ten = b.init("ten", tensor(INT64, &[], &[10.0]));
        let less = b.node("Sub", &[&h, &ten], vec![]);
        let negative = rounded(&mut b, &less, &two, "Floor");
        for near in [not_whole, computed, negative] {
            let ones = b.node("ConstantOfShape", &[&near], vec![]);
            assert_eq!(shape(&b, 17, &ones).unwrap(), [format!("{ones}#0")], "{near}");
        }
    }
}

/// LongT5 pads its sequence to whole blocks of 3 by `(-seq) % 3` (`Mod`,
/// fmod 0: the divisor's sign), `3·floor((seq + 2)/3)` rows, and cuts its
/// attention output back with `[:, :seq]`: the remainder is never negative,
/// so the cut is seq long, and the block count `rows / 3` is one dimension.
#[test]
fn a_remainder_pads_to_whole_blocks_and_the_cut_back_is_the_sequence() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
    let shape_x = b.node("Shape", &[&x], vec![]);
    let one = b.init("one", tensor(INT64, &[], &[1.0]));
    let seq = b.node("Gather", &[&shape_x, &one], vec![]);
    let minus = b.node("Neg", &[&seq], vec![]);
    let three = b.init("three", tensor(INT64, &[], &[3.0]));
    let zero = b.init("zero_axis", ints(&[0]));
    let padded = |b: &mut Builder, divisor: &str, fmod: i64| {
        let r = b.node("Mod", &[&minus, divisor], vec![attr_int("fmod", fmod)]);
        let r = b.node("Unsqueeze", &[&r, &zero], vec![]);
        let before = b.init(&format!("before_{fmod}_{divisor}"), ints(&[0, 0, 0, 0]));
        let after = b.init(&format!("after_{fmod}_{divisor}"), ints(&[0]));
        let pads = b.node("Concat", &[&before, &r, &after], vec![attr_int("axis", 0)]);
        b.node("Pad", &[&x, &pads], vec![])
    };
    let blocks = padded(&mut b, &three, 0);
    let rows = "3·floor((1·$s + 2)/3)";
    assert_eq!(shape(&b, 17, &blocks).unwrap(), ["b", rows, "4"]);
    let starts = b.init("starts", ints(&[0]));
    let axes = b.init("axes", ints(&[1]));
    let end = b.node("Unsqueeze", &[&seq, &zero], vec![]);
    let cut = b.node("Slice", &[&blocks, &starts, &end, &axes], vec![]);
    assert_eq!(shape(&b, 17, &cut).unwrap(), ["b", "s", "4"]);

    // Near-misses: a remainder with the dividend's sign (fmod 1: negative
    // here) and one by a negative divisor pad by what may be a crop; a cut
    // one row longer than the sequence is not the sequence.
    let minus_three = b.init("minus_three", tensor(INT64, &[], &[-3.0]));
    for near in [padded(&mut b, &three, 1), padded(&mut b, &minus_three, 0)] {
        assert_eq!(shape(&b, 17, &near).unwrap()[1], format!("{near}#1"));
    }
    let longer = b.node("Add", &[&seq, &one], vec![]);
    let longer = b.node("Unsqueeze", &[&longer, &zero], vec![]);
    let long_cut = b.node("Slice", &[&blocks, &starts, &longer, &axes], vec![]);
    assert_ne!(shape(&b, 17, &long_cut).unwrap()[1], "s");
}

/// Funnel's relative positions `arange(max_dist, min_dist - 1, -1)`: their
/// bounds are elements of vectors whose length is the sequence's, `pos[0]`
/// and `pos[-1]` of `pos = arange(seq)` (0 and seq − 1, where the Gather
/// runs) and the head of `cat([-1], pos[1:-1])` (-1), so there are
/// `seq + 8` of them. Funnel casts `pos` to float, which holds seq − 1
/// only up to 2^24 and nothing bounds it: there, nothing is derived.
#[test]
fn an_element_of_a_vector_of_unknown_length_is_known_from_its_ends() {
    for elem in [INT64, FLOAT] {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
        let shape_x = b.node("Shape", &[&x], vec![]);
        let index = |b: &mut Builder, i: i64| b.init(&format!("index{i}"), tensor(INT64, &[], &[i as f64]));
        let (one, zero, last) = (index(&mut b, 1), index(&mut b, 0), index(&mut b, -1));
        let seq = b.node("Gather", &[&shape_x, &one], vec![]);
        let range = b.node("Range", &[&zero, &seq, &one], vec![]);
        let pos = b.node("Cast", &[&range], vec![attr_int("to", elem as i64)]);
        let first_pos = b.node("Gather", &[&pos, &zero], vec![]);
        let last_pos = b.node("Gather", &[&pos, &last], vec![]);
        let (starts, ends, axes) =
            (b.init("starts", ints(&[1])), b.init("ends", ints(&[-1])), b.init("axes", ints(&[0])));
        let inner = b.node("Slice", &[&pos, &starts, &ends, &axes], vec![]);
        let cls = b.init("cls", tensor(elem, &[1], &[-1.0]));
        let pooled = b.node("Concat", &[&cls, &inner], vec![attr_int("axis", 0)]);
        let head = b.node("Gather", &[&pooled, &zero], vec![]);
        let (eight, unit) = (b.init("eight", tensor(elem, &[], &[8.0])), b.init("unit", tensor(elem, &[], &[1.0])));
        let shift = b.node("Sub", &[&head, &first_pos], vec![]);
        let start = b.node("Add", &[&shift, &eight], vec![]);
        let start = b.node("Cast", &[&start], vec![attr_int("to", INT64 as i64)]);
        let span = b.node("Sub", &[&head, &last_pos], vec![]);
        let limit = b.node("Sub", &[&span, &unit], vec![]);
        let limit = b.node("Cast", &[&limit], vec![attr_int("to", INT64 as i64)]);
        let relative = b.node("Range", &[&start, &limit, &last], vec![]);
        let expected = if elem == INT64 { "s + 8".to_string() } else { format!("{relative}#0") };
        assert_eq!(shape(&b, 17, &relative).unwrap(), [expected], "element type {elem}");
        if elem == FLOAT {
            continue;
        }
        let float = |b: &mut Builder, name: &str, v: f64| b.init(name, tensor(FLOAT, &[], &[v]));

        // Near-misses: an element past the Concat's known head (it is inner's
        // first, which this rule does not follow through a Slice), and the
        // last element of a Range by a step that is no whole number.
        let second = b.node("Gather", &[&pooled, &one], vec![]);
        let beyond = b.node("Range", &[&zero, &second, &one], vec![]);
        assert_eq!(shape(&b, 17, &beyond).unwrap(), [format!("{beyond}#0")]);
        let half = float(&mut b, "half", 0.5);
        let zero_f = float(&mut b, "zero_f", 0.0);
        let seq_f = b.node("Cast", &[&seq], vec![attr_int("to", FLOAT as i64)]);
        let halves = b.node("Range", &[&zero_f, &seq_f, &half], vec![]);
        let halves_last = b.node("Gather", &[&halves, &last], vec![]);
        let halves_last = b.node("Cast", &[&halves_last], vec![attr_int("to", INT64 as i64)]);
        let from_halves = b.node("Range", &[&zero, &halves_last, &one], vec![]);
        assert_eq!(shape(&b, 17, &from_halves).unwrap(), [format!("{from_halves}#0")]);

        // The shape of a value of unknown rank is a vector.
        let y = b.input("y", FLOAT, None);
        let shape_y = b.node("Shape", &[&y], vec![]);
        assert_eq!(shape(&b, 17, &shape_y).unwrap(), [format!("{shape_y}#0")]);
    }
}

/// Funnel keeps its class token apart, `x[:, :1]` and `x[:, 1:]`, and
/// builds its class mask as `torch.ones(seq − 1, seq − 1)`: a run of that
/// `ConstantOfShape` has seq ≥ 1, so the two parts are 1 and `seq − 1`
/// long, and together the sequence again. A Gather's constant index is
/// within its axis the same way (`pos[-1]`).
#[test]
fn a_bound_every_run_needs_keeps_a_slice_within_its_axis() {
    let model = |live: bool, gather: bool| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
        let shape_x = b.node("Shape", &[&x], vec![]);
        let one = b.init("one", tensor(INT64, &[], &[1.0]));
        let seq = b.node("Gather", &[&shape_x, &one], vec![]);
        let axes = b.init("axes", ints(&[1]));
        let (zero, first, end) = (b.init("zero", ints(&[0])), b.init("first", ints(&[1])), b.init("end", ints(&[i64::MAX])));
        let head = b.node("Slice", &[&x, &zero, &first, &axes], vec![]);
        let rest = b.node("Slice", &[&x, &first, &end, &axes], vec![]);
        let whole = b.node("Concat", &[&head, &rest], vec![attr_int("axis", 1)]);
        b.node_to("Identity", &[&whole], &["out"], vec![]);
        b.output("out", FLOAT, None);
        if gather {
            let minus_one = b.init("minus_one", tensor(INT64, &[], &[-1.0]));
            b.node_to("Gather", &[&x, &minus_one], &["last"], vec![attr_int("axis", 1)]);
        } else {
            let less = b.node("Sub", &[&seq, &one], vec![]);
            let axis0 = b.init("axis0", ints(&[0]));
            let side = b.node("Unsqueeze", &[&less, &axis0], vec![]);
            let dims = b.node("Concat", &[&side, &side], vec![attr_int("axis", 0)]);
            b.node_to("ConstantOfShape", &[&dims], &["last"], vec![]);
        }
        if live {
            b.output("last", FLOAT, None);
        }
        (shape(&b, 17, &head).unwrap(), shape(&b, 17, &rest).unwrap(), shape(&b, 17, &whole).unwrap())
    };
    for gather in [false, true] {
        let (head, rest, whole) = model(true, gather);
        assert_eq!((head[1].as_str(), rest[1].as_str(), whole[1].as_str()), ("1", "s - 1", "s"), "gather {gather}");
        // Near-miss: no output depends on the node, so a run may skip it
        // and prove nothing; `x[:, :1]` of an empty sequence is empty.
        let (head, _, whole) = model(false, gather);
        assert_ne!(head[1], "1", "gather {gather}");
        assert_ne!(whole[1], "s", "gather {gather}");
    }

    // A floor follows its argument's bound: `(s + 1) // 2` (Funnel's
    // pooled length, in integers) of a sequence of at least 1 is at least
    // 1, so its first element is one long.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
    let shape_x = b.node("Shape", &[&x], vec![]);
    let one = b.init("one", tensor(INT64, &[], &[1.0]));
    let seq = b.node("Gather", &[&shape_x, &one], vec![]);
    let minus_one = b.init("minus_one", tensor(INT64, &[], &[-1.0]));
    b.node_to("Gather", &[&x, &minus_one], &["last"], vec![attr_int("axis", 1)]);
    b.output("last", FLOAT, None);
    let more = b.node("Add", &[&seq, &one], vec![]);
    let two = b.init("two", tensor(INT64, &[], &[2.0]));
    let half = b.node("Div", &[&more, &two], vec![]);
    let axis0 = b.init("axis0", ints(&[0]));
    let half = b.node("Unsqueeze", &[&half, &axis0], vec![]);
    let pooled = b.node("ConstantOfShape", &[&half], vec![]);
    let (zero, first) = (b.init("zero", ints(&[0])), b.init("first", ints(&[1])));
    let head = b.node("Slice", &[&pooled, &zero, &first, &axis0], vec![]);
    b.node_to("Identity", &[&head], &["out"], vec![]);
    b.output("out", FLOAT, None);
    assert_eq!(shape(&b, 17, &pooled).unwrap(), ["floor((1·$s + 1)/2)"]);
    assert_eq!(shape(&b, 17, &head).unwrap(), ["1"]);
}

/// Images with height, width and channels dynamic, as Optimum exports
/// them: the channels are the patch Conv's weight's (3); the patch count
/// `floor(h/8)·floor(w/8)` is at least 1 (a Conv fails where its window
/// is longer than its input), so with the class token it is never 1, and
/// added to 5 position embeddings it is 5. A size divided by a number in
/// an integer type is a floor (DINOv2's `h // 8`); every second row of an
/// axis (Swin's `x[:, 0::2]`) is its ceiling half.
#[test]
fn an_axis_that_is_never_one_is_what_its_broadcast_gives() {
    let build = |class_token: bool| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("b"), sym("c"), sym("h"), sym("w")]));
        let w = b.init("w", tensor(FLOAT, &[4, 3, 8, 8], &vec![0.01; 4 * 3 * 64]));
        let patches = b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[8, 8])]);
        let flat = b.init("flat", ints(&[0, 4, -1]));
        let flat = b.node("Reshape", &[&patches, &flat], vec![]);
        let tokens = b.node("Transpose", &[&flat], vec![attr_ints("perm", &[0, 2, 1])]);
        let tokens = if class_token {
            let cls = b.init("cls", tensor(FLOAT, &[1, 1, 4], &[0.5; 4]));
            let s = b.node("Shape", &[&x], vec![]);
            let (zero, one) = (b.init("zero", ints(&[0])), b.init("one", ints(&[1])));
            let batch = b.node("Slice", &[&s, &zero, &one], vec![]);
            let rest = b.init("rest", ints(&[1, 4]));
            let to = b.node("Concat", &[&batch, &rest], vec![attr_int("axis", 0)]);
            let cls = b.node("Expand", &[&cls, &to], vec![]);
            b.node("Concat", &[&cls, &tokens], vec![attr_int("axis", 1)])
        } else {
            tokens
        };
        let pos = b.init("pos", tensor(FLOAT, &[1, 5, 4], &[0.25; 20]));
        let sum = b.node("Add", &[&tokens, &pos], vec![]);
        b.output(&sum, FLOAT, None);
        (shape(&b, 17, &x).unwrap(), shape(&b, 17, &tokens).unwrap())
    };
    let (x, tokens) = build(true);
    assert_eq!(x[1], "3", "the Conv's weight reads 3 channels");
    assert_eq!(tokens, ["b", "5", "4"]);
    // Near-miss: the patches alone may be 1 (an image of 8 × 8), which
    // broadcasts to 5.
    let (_, tokens) = build(false);
    assert_ne!(tokens[1], "5");

    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(3), sym("h"), sym("w")]));
    let s = b.node("Shape", &[&x], vec![]);
    let two = b.init("two", tensor(INT64, &[], &[2.0]));
    let h = b.node("Gather", &[&s, &two], vec![]);
    let eight = b.init("eight", tensor(INT64, &[], &[8.0]));
    let side = b.node("Div", &[&h, &eight], vec![]);
    let ten = b.init("ten", tensor(INT64, &[], &[10.0]));
    let less = b.node("Sub", &[&h, &ten], vec![]);
    let below = b.node("Div", &[&less, &eight], vec![]);
    let axis0 = b.init("axis0", ints(&[0]));
    let as_shape = |b: &mut Builder, v: &str| {
        let v = b.node("Unsqueeze", &[v, &axis0], vec![]);
        b.node("ConstantOfShape", &[&v], vec![])
    };
    let grid = as_shape(&mut b, &side);
    assert_eq!(shape(&b, 17, &grid).unwrap(), ["floor((1·$h)/8)"]);
    // Near-miss: a difference that may be negative truncates upwards.
    let under = as_shape(&mut b, &below);
    assert_eq!(shape(&b, 17, &under).unwrap(), [format!("{under}#0")]);
    let (start, end, axes, step) =
        (b.init("start", ints(&[0])), b.init("end", ints(&[i64::MAX])), b.init("axes", ints(&[2])), b.init("step", ints(&[2])));
    let even = b.node("Slice", &[&x, &start, &end, &axes, &step], vec![]);
    assert_eq!(shape(&b, 17, &even).unwrap()[2], "floor((1·$h + 1)/2)");
    // Near-miss: from the second row, where h may be 0.
    let second = b.init("second", ints(&[1]));
    let odd = b.node("Slice", &[&x, &second, &end, &axes, &step], vec![]);
    assert_eq!(shape(&b, 17, &odd).unwrap()[2], format!("{odd}#2"));
}

/// Two constants of one type, shape and values are one value (TorchScript
/// writes an axes constant per use), and so are the nodes that read them
/// alike; 0 and -0 differ, as do types and shapes.
#[test]
fn constants_of_equal_bits_are_one_value() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    let (axes, again) = (b.constant(ints(&[-1])), b.constant(ints(&[-1])));
    let (u, twin) = (b.node("Unsqueeze", &[&x, &axes], vec![]), b.node("Unsqueeze", &[&x, &again], vec![]));
    let zero = b.constant(tensor(FLOAT, &[1], &[0.0]));
    let minus_zero = b.constant(tensor(FLOAT, &[1], &[-0.0]));
    let other_type = b.constant(tensor(FLOAT16, &[1], &[0.0]));
    let other_shape = b.constant(tensor(FLOAT, &[1, 1], &[0.0]));
    let zero_again = b.constant(tensor(FLOAT, &[1], &[0.0]));
    // Two int64 values one f64 cannot tell apart.
    let large = |v: i64| onnx_fuse::onnx::TensorProto {
        dims: vec![1],
        data_type: Some(INT64),
        int64_data: vec![v],
        ..Default::default()
    };
    let (top, below) = (b.constant(large(i64::MAX)), b.constant(large(i64::MAX - 1)));
    let model = b.model(18);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 18, &scope);
    assert!(g.same_value(&axes, &again).is_some());
    assert!(g.same_value(&u, &twin).is_some(), "Unsqueezes of x by equal axes");
    assert!(g.same_value(&zero, &zero_again).is_some());
    assert!(g.same_value(&top, &below).is_none(), "2^63 - 1 and 2^63 - 2");
    for other in [&minus_zero, &other_type, &other_shape] {
        assert!(g.same_value(&zero, other).is_none(), "{other}");
    }
}

/// Logic, comparisons and the other pure ops are one value where they read
/// one value alike (an XSoftmax computes its mask's `Not` twice); ops that
/// draw at random are not.
#[test]
fn pure_ops_that_read_one_value_alike_are_one_value() {
    let mut b = Builder::default();
    let keep = b.input("keep", BOOL, Some(&[D::N(2), D::N(3)]));
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    let (hide, again) = (b.node("Not", &[&keep], vec![]), b.node("Not", &[&keep], vec![]));
    let (less, less_again) = (b.node("Less", &[&x, &x], vec![]), b.node("Less", &[&x, &x], vec![]));
    let (both, both_again) = (b.node("And", &[&hide, &less], vec![]), b.node("And", &[&again, &less_again], vec![]));
    let (r, r_again) = (b.node("RandomUniformLike", &[&x], vec![]), b.node("RandomUniformLike", &[&x], vec![]));
    let model = b.model(18);
    let scope = Scope::default();
    let g = Graph::new(model.graph.as_ref().unwrap(), 18, &scope);
    assert!(g.same_value(&hide, &again).is_some());
    assert!(g.same_value(&both, &both_again).is_some(), "And of twins");
    assert!(g.same_value(&r, &r_again).is_none(), "two draws");
}
