//! The exact cleanup after the passes (docs/cleanup.md): a value the shapes
//! prove the same on every run becomes a constant, a Reshape target proved
//! element by element a constant with 0 and -1, twins one node, unread
//! nodes gone. One positive and the near-misses of each rule, each model
//! run before and after through ONNX Runtime; and on a real export, the
//! counts and provenance of the passes as they were.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::cleanup::{self, Cleanup};
use onnx_fuse::onnx::{ModelProto, BOOL, FLOAT, FLOAT16, INT32, INT64};

fn dims(d: &[D]) -> Vec<D> {
    d.to_vec()
}

/// Cleans a copy of `model`, proves it equal through ONNX Runtime (graph
/// outputs decide, since the models differ outside any fused node), and
/// returns it with what the cleanup did.
fn cleaned(model: &ModelProto, name: &str) -> (ModelProto, Cleanup) {
    let mut out = model.clone();
    let done = cleanup::clean(&mut out);
    let v = assert_equivalent(model, &out, name);
    assert!(v.outputs.iter().all(|c| c.passed), "{name}: {}", v.text());
    (out, done)
}

fn ops(model: &ModelProto) -> Vec<String> {
    all_nodes(model).iter().map(|n| n.op_type().to_string()).collect()
}

fn reshape_target(model: &ModelProto) -> Option<Vec<i64>> {
    let nodes = all_nodes(model);
    let reshape = nodes.iter().find(|n| n.is("Reshape"))?;
    let producer = nodes.iter().find(|n| n.output.first() == reshape.input.get(1))?;
    if !producer.is("Constant") {
        return None;
    }
    producer.attr("value")?.t.as_ref()?.ints()
}

/// `x [b, s, 8]` reshaped to the target `parts` computes, each part one of
/// `b`, `s` (Gather of Shape(x)), or a number; the Reshape's output is the
/// graph's.
fn reshape_by_parts(x_dims: &[D], parts: &[&str], allowzero: Option<i64>, opset: i64) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&dims(x_dims)));
    let shape = b.node("Shape", &["x"], vec![]);
    let mut pieces = vec![];
    for part in parts {
        let piece = match *part {
            "b" | "s" => {
                let index = b.constant(tensor(INT64, &[], &[if *part == "b" { 0.0 } else { 1.0 }]));
                let scalar = b.node("Gather", &[&shape, &index], vec![attr_int("axis", 0)]);
                let axes = b.ints(&[0]);
                b.node("Unsqueeze", &[&scalar, &axes], vec![])
            }
            number => b.ints(&[number.parse().unwrap()]),
        };
        pieces.push(piece);
    }
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let target = b.node("Concat", &refs, vec![attr_int("axis", 0)]);
    let attrs = allowzero.map(|a| vec![attr_int("allowzero", a)]).unwrap_or_default();
    let y = b.node("Reshape", &["x", &target], attrs);
    b.output(&y, FLOAT, None);
    b.model(opset)
}

#[test]
fn a_reshape_target_of_symbolic_axes_in_place_becomes_zeros() {
    let model = reshape_by_parts(&[sym("b"), sym("s"), D::N(8)], &["b", "s", "2", "4"], None, 17);
    let (out, done) = cleaned(&model, "cleanup_zeros");
    assert_eq!(reshape_target(&out), Some(vec![0, 0, 2, 4]));
    assert_eq!(ops(&out), ["Constant", "Reshape"], "the shape arithmetic is gone");
    assert_eq!(done.reshape_targets, 1);
    assert!(done.nodes.iter().any(|r| r.op_type == "Shape" && r.why == "unread"), "{:?}", done.nodes);
}

#[test]
fn a_reshape_target_whose_axis_sits_elsewhere_is_not_copied() {
    // s at position 0 is not the input's axis 0: 0 would copy b.
    let model = reshape_by_parts(&[sym("b"), sym("s"), D::N(8)], &["s", "b", "8"], None, 17);
    let (out, done) = cleaned(&model, "cleanup_swapped");
    assert_eq!(reshape_target(&out), None, "two elements are neither numbers nor the input's axes");
    assert!(ops(&out).contains(&"Shape".to_string()));
    assert_eq!(done.reshape_targets, 0);
}

#[test]
fn allowzero_keeps_a_symbolic_target() {
    // With allowzero = 1 a 0 is a zero-length axis, never a copy.
    let model = reshape_by_parts(&[sym("b"), sym("s"), D::N(8)], &["b", "s", "2", "4"], Some(1), 17);
    let (out, _) = cleaned(&model, "cleanup_allowzero");
    assert_eq!(reshape_target(&out), None);
}

/// `x [b, s, 8]` reshaped to `[b·s, 8]` (or `[b, s·8]` with `merge_tail`),
/// the product computed from Shape(x).
fn merged(merge_tail: bool, x0: D) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[x0, sym("s"), D::N(8)]));
    let shape = b.node("Shape", &["x"], vec![]);
    let i0 = b.constant(tensor(INT64, &[], &[0.0]));
    let i1 = b.constant(tensor(INT64, &[], &[1.0]));
    let i2 = b.constant(tensor(INT64, &[], &[2.0]));
    let d0 = b.node("Gather", &[&shape, &i0], vec![attr_int("axis", 0)]);
    let d1 = b.node("Gather", &[&shape, &i1], vec![attr_int("axis", 0)]);
    let d2 = b.node("Gather", &[&shape, &i2], vec![attr_int("axis", 0)]);
    let axes = b.ints(&[0]);
    let target = if merge_tail {
        let tail = b.node("Mul", &[&d1, &d2], vec![]);
        let u0 = b.node("Unsqueeze", &[&d0, &axes], vec![]);
        let u1 = b.node("Unsqueeze", &[&tail, &axes], vec![]);
        b.node("Concat", &[&u0, &u1], vec![attr_int("axis", 0)])
    } else {
        let head = b.node("Mul", &[&d0, &d1], vec![]);
        let u0 = b.node("Unsqueeze", &[&head, &axes], vec![]);
        let u1 = b.node("Unsqueeze", &[&d2, &axes], vec![]);
        b.node("Concat", &[&u0, &u1], vec![attr_int("axis", 0)])
    };
    let y = b.node("Reshape", &["x", &target], vec![]);
    b.output(&y, FLOAT, None);
    b.model(17)
}

#[test]
fn the_one_symbolic_element_left_becomes_minus_one() {
    let (out, _) = cleaned(&merged(false, sym("b")), "cleanup_minus_one");
    assert_eq!(reshape_target(&out), Some(vec![-1, 8]));
    assert_eq!(ops(&out), ["Constant", "Reshape"]);
}

#[test]
fn minus_one_beside_an_axis_that_may_be_zero_is_not_written() {
    // [0, -1] would fail where b is 0; the original's [0, s·8] does not.
    let (out, _) = cleaned(&merged(true, sym("b")), "cleanup_minus_one_beside_zero");
    assert_eq!(reshape_target(&out), None);
    // With b a number, it is [2, -1].
    let (out, _) = cleaned(&merged(true, D::N(2)), "cleanup_minus_one_beside_number");
    assert_eq!(reshape_target(&out), Some(vec![2, -1]));
}

#[test]
fn a_shape_of_numbered_axes_and_its_arithmetic_fold() {
    // Shape(x)[2] · 2 as a float scale: x's axis 2 is 8 on every run.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(8)]));
    let shape = b.node("Shape", &["x"], vec![]);
    let i1 = b.constant(tensor(INT64, &[], &[1.0]));
    let d = b.node("Gather", &[&shape, &i1], vec![attr_int("axis", 0)]);
    let two = b.constant(tensor(INT64, &[], &[2.0]));
    let twice = b.node("Mul", &[&d, &two], vec![]);
    let f = b.node("Cast", &[&twice], vec![attr_int("to", FLOAT as i64)]);
    let y = b.node("Mul", &["x", &f], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_fold");
    assert_eq!(ops(&out), ["Constant", "Mul"]);
    assert_eq!(done.count("constant"), 3, "Gather, Mul and Cast: {:?}", done.nodes);
    assert_eq!(done.added, 1);
    let c = all_nodes(&out)[0].attr("value").unwrap().t.clone().unwrap();
    assert_eq!(c.values(), Some(vec![16.0]));
}

/// A Reshape whose output is itself proved (`Reshape(Shape(x),
/// Shape(Shape(x)))` of x `[2, 3]`) and whose target is proved too: the
/// Reshape becomes one constant, and no target is written into the node
/// that replaced it (the cleanup wrote one there and ended in an internal
/// error).
#[test]
fn a_reshape_proved_constant_with_a_proved_target_is_one_constant() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    let shape = b.node("Shape", &["x"], vec![]);
    let target = b.node("Shape", &[&shape], vec![]);
    let r = b.node("Reshape", &[&shape, &target], vec![]);
    let y = b.node("Add", &[&r, &r], vec![]);
    b.output(&y, INT64, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_reshape_constant");
    assert_eq!(done.count("constant"), 3, "both Shapes and the Reshape: {:?}", done.nodes);
    assert_eq!(ops(&out), ["Constant", "Add"]);
    let c = all_nodes(&out)[0].attr("value").unwrap().t.clone().unwrap();
    assert_eq!(c.values(), Some(vec![2.0, 3.0]));
}

/// `x · (Shape(x)[0] in f16 <op> 3)` back in f32: ONNX Runtime's CPU
/// computes the f16 arithmetic in f32 and drops the casts around it.
fn half_arithmetic(op: &str) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    let shape = b.node("Shape", &["x"], vec![]);
    let half = b.node("Cast", &[&shape], vec![attr_int("to", FLOAT16 as i64)]);
    let three = b.constant(tensor(FLOAT16, &[], &[3.0]));
    let q = b.node(op, &[&half, &three], vec![]);
    let f = b.node("Cast", &[&q], vec![attr_int("to", FLOAT as i64)]);
    let y = b.node("Mul", &["x", &f], vec![]);
    b.output(&y, FLOAT, None);
    b.model(17)
}

#[test]
fn half_arithmetic_that_rounds_is_not_folded() {
    // 2 / 3 in f16 is 0.6665; ONNX Runtime computes 0.6666667.
    let (out, _) = cleaned(&half_arithmetic("Div"), "cleanup_half_rounds");
    assert!(ops(&out).contains(&"Div".to_string()), "{:?}", ops(&out));
    // 2 · 3 is 6 in f16 too: the same on both roads.
    let (out, _) = cleaned(&half_arithmetic("Mul"), "cleanup_half_exact");
    assert_eq!(ops(&out), ["Constant", "Mul"]);
}

/// `x · Shape(x)[axis]` (as a float), the value that computes it.
fn times_its_axis(b: &mut Builder, x: &str, axis: i64) -> String {
    let shape = b.node("Shape", &[x], vec![]);
    let index = b.constant(tensor(INT64, &[], &[axis as f64]));
    let d = b.node("Gather", &[&shape, &index], vec![attr_int("axis", 0)]);
    let f = b.node("Cast", &[&d], vec![attr_int("to", FLOAT as i64)]);
    b.node("Mul", &[x, &f], vec![])
}

#[test]
fn a_symbolic_axis_never_becomes_a_constant() {
    // Shape(x)[0] is b: whatever the run feeds.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(8)]));
    let y = times_its_axis(&mut b, "x", 0);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_symbolic");
    assert_eq!(out, model, "nothing to clean");
    assert_eq!(done, Cleanup::default());
}

/// `Shape(x + w)[0]` as a float scale, x `[s, 8]` and w `[2, 8]`: where
/// the sum runs, its axis 0 is 2. With `contradicted`, x is also reshaped
/// to `[7, 8]`: no run succeeds (s would be 7, and 7 meets 2).
fn broadcast_to_two(contradicted: bool) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("s"), D::N(8)]));
    let w = b.constant(tensor(FLOAT, &[2, 8], &[0.5; 16]));
    let sum = b.node("Add", &["x", &w], vec![]);
    let y = times_its_axis(&mut b, &sum, 0);
    b.output(&y, FLOAT, None);
    if contradicted {
        let target = b.ints(&[7, 8]);
        let r = b.node("Reshape", &["x", &target], vec![]);
        b.output(&r, FLOAT, None);
    }
    b.model(17)
}

#[test]
fn a_model_no_run_of_which_succeeds_keeps_its_shape_arithmetic() {
    let (out, done) = cleaned(&broadcast_to_two(false), "cleanup_broadcast_to_two");
    assert_eq!(done.count("constant"), 3, "Gather, Cast and Shape's slice fold: {:?}", done.nodes);
    assert!(!ops(&out).contains(&"Shape".to_string()));
    // Written as constants, 2 and the Reshape's 7 would contradict each
    // other where ONNX's own inference reads them (onnx.checker refuses the
    // output); nothing runs this model, so nothing is gained either.
    let model = broadcast_to_two(true);
    let mut out = model.clone();
    let done = cleanup::clean(&mut out);
    assert_eq!(out, model, "{:?}", done.nodes);
    assert_eq!(done, Cleanup::default());
}

#[test]
fn a_copy_of_a_constant_stays_a_copy() {
    // As a Constant it would copy the weight's bytes, and only where they
    // are inside the model (docs/cleanup.md).
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    let w = b.constant(tensor(FLOAT, &[2], &[0.5, 2.0]));
    let copy = b.node("Identity", &[&w], vec![]);
    let y = b.node("Mul", &["x", &copy], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_copy");
    assert_eq!(out, model, "{:?}", done.nodes);
}

#[test]
fn an_onnx_rotary_keeps_its_input_shape() {
    // RotaryEmbedding (opset 23) of x [b, 2, s, 8]: Shape(y)[1] is 2.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(2), sym("s"), D::N(8)]));
    b.input("cos", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
    b.input("sin", FLOAT, Some(&[sym("b"), sym("s"), D::N(4)]));
    let y = b.node("RotaryEmbedding", &["x", "cos", "sin"], vec![]);
    let z = times_its_axis(&mut b, &y, 1);
    b.output(&z, FLOAT, None);
    let (out, done) = cleaned(&b.model(23), "cleanup_onnx_rotary");
    assert_eq!(ops(&out), ["RotaryEmbedding", "Constant", "Mul"], "{:?}", done.nodes);
}

#[test]
fn a_value_that_is_a_graph_output_keeps_its_producer() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    b.node_to("Shape", &["x"], &["shape"], vec![]);
    b.output("shape", INT64, None);
    let y = b.node("Neg", &["x"], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, _) = cleaned(&model, "cleanup_output");
    assert_eq!(ops(&out), ["Shape", "Neg"]);
}

/// An If whose then-branch reads the outer value `read` (its else-branch x).
fn if_reading(b: &mut Builder, cond: &str, read: &str, out: &str) {
    let mut then = Builder::default();
    let y = then.node("Add", &["x", read], vec![]);
    then.output(&y, FLOAT, None);
    then.graph.name = Some("then".into());
    let mut other = Builder::default();
    let z = other.node("Identity", &["x"], vec![]);
    other.output(&z, FLOAT, None);
    other.graph.name = Some("else".into());
    b.node_to(
        "If",
        &[cond],
        &[out],
        vec![attr_graph("then_branch", then.graph.clone()), attr_graph("else_branch", other.graph.clone())],
    );
}

#[test]
fn a_value_a_body_reads_stays_defined() {
    // The body reads `scale`: a constant now, under its name.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(2)]));
    b.input("c", BOOL, Some(&[]));
    let shape = b.node("Shape", &["x"], vec![]);
    b.node_to("Cast", &[&shape], &["scale"], vec![attr_int("to", FLOAT as i64)]);
    if_reading(&mut b, "c", "scale", "y");
    b.output("y", FLOAT, None);
    let model = b.model(17);
    let (out, _) = cleaned(&model, "cleanup_body_reads");
    let g = out.graph.as_ref().unwrap();
    let scale = g.node.iter().find(|n| n.output.first().is_some_and(|o| o == "scale")).expect("scale is defined");
    assert!(scale.is("Constant"));
    assert!(!ops(&out).contains(&"Shape".to_string()));
}

#[test]
fn twins_are_computed_once() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(4)]));
    let k = b.init("k", tensor(FLOAT, &[4], &[1.0, 2.0, 3.0, 4.0]));
    let m1 = b.node("Mul", &["x", &k], vec![]);
    let m2 = b.node("Mul", &["x", &k], vec![]);
    let t1 = b.node("Tanh", &[&m1], vec![]);
    let t2 = b.node("Tanh", &[&m2], vec![]);
    let y = b.node("Add", &[&t1, &t2], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_twins");
    assert_eq!(ops(&out), ["Mul", "Tanh", "Add"]);
    assert_eq!(done.count("twin"), 2, "{:?}", done.nodes);
    let add = all_nodes(&out)[2].clone();
    assert_eq!(add.input[0], add.input[1]);
}

#[test]
fn random_twins_stay_two() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
    let r1 = b.node("RandomUniformLike", &["x"], vec![attr_float("high", 0.0), attr_float("low", 0.0)]);
    let r2 = b.node("RandomUniformLike", &["x"], vec![attr_float("high", 0.0), attr_float("low", 0.0)]);
    let y = b.node("Add", &[&r1, &r2], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    // (high = low = 0: the outputs are zeros, so ONNX Runtime can compare them.)
    let (out, _) = cleaned(&model, "cleanup_random");
    assert_eq!(ops(&out), ["RandomUniformLike", "RandomUniformLike", "Add"]);
}

#[test]
fn a_twin_that_is_a_graph_output_stays_and_one_a_body_reads_goes() {
    // n2 is a graph output: it keeps its producer. The then-branch reads
    // n3 by name: it reads n1 now, and n3's node goes.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    b.input("c", BOOL, Some(&[]));
    let n1 = b.node("Neg", &["x"], vec![]);
    b.node_to("Neg", &["x"], &["n2"], vec![]);
    b.node_to("Neg", &["x"], &["n3"], vec![]);
    let y = b.node("Add", &[&n1, "n3"], vec![]);
    if_reading(&mut b, "c", "n3", "z");
    b.output(&y, FLOAT, None);
    b.output("n2", FLOAT, None);
    b.output("z", FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_twin_escapes");
    assert_eq!(count_op(&out, "Neg"), 2, "{:?}", done.nodes);
    assert_eq!(done.count("twin"), 1, "{:?}", done.nodes);
    let read = all_nodes(&out).into_iter().find(|n| n.is("Add") && n.input[0] == "x").expect("the branch's Add");
    assert_eq!(read.input[1], n1, "the branch reads the kept twin");
}

#[test]
fn a_twin_a_body_would_hide_stays() {
    // The then-branch defines a value named as the kept twin n1 (ONNX
    // Runtime refuses such a model: names are assigned once): read there,
    // n1 would be the branch's own, so n3, which it reads, stays.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3)]));
    b.input("c", BOOL, Some(&[]));
    b.node_to("Neg", &["x"], &["n1"], vec![]);
    b.node_to("Neg", &["x"], &["n3"], vec![]);
    let mut then = Builder::default();
    then.node_to("Abs", &["x"], &["n1"], vec![]);
    let t = then.node("Add", &["n1", "n3"], vec![]);
    then.output(&t, FLOAT, None);
    let mut other = Builder::default();
    let e = other.node("Identity", &["x"], vec![]);
    other.output(&e, FLOAT, None);
    b.node_to(
        "If",
        &["c"],
        &["z"],
        vec![attr_graph("then_branch", then.graph.clone()), attr_graph("else_branch", other.graph.clone())],
    );
    let y = b.node("Add", &["n1", "z"], vec![]);
    b.output(&y, FLOAT, None);
    let mut out = b.model(17);
    let done = cleanup::clean(&mut out);
    assert_eq!(count_op(&out, "Neg"), 2, "{:?}", done.nodes);
}

#[test]
fn unread_nodes_go_but_not_another_domains() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
    let dead = b.node("Neg", &["x"], vec![]);
    let _deader = b.node("Exp", &[&dead], vec![]);
    b.graph.node.push(onnx_fuse::onnx::NodeProto {
        op_type: Some("Gelu".into()),
        domain: Some("com.microsoft".into()),
        name: Some("unread_gelu".into()),
        input: vec!["x".into()],
        output: vec!["g".into()],
        ..Default::default()
    });
    let y = b.node("Tanh", &["x"], vec![]);
    b.output(&y, FLOAT, None);
    let mut model = b.model(17);
    model
        .opset_import
        .push(onnx_fuse::onnx::OperatorSetIdProto { domain: Some("com.microsoft".into()), version: Some(1) });
    let (out, done) = cleaned(&model, "cleanup_unread");
    assert_eq!(ops(&out), ["Gelu", "Tanh"]);
    assert_eq!(done.count("unread"), 2);
}

#[test]
fn loop_bodies_are_left_as_they_are() {
    // A body whose values change per iteration is not cleaned (a twin in it stays).
    let mut body = Builder::default();
    body.input("i", INT64, Some(&[]));
    body.input("cond_in", BOOL, Some(&[]));
    body.input("acc", FLOAT, Some(&[D::N(2)]));
    let n1 = body.node("Neg", &["acc"], vec![]);
    let n2 = body.node("Neg", &["acc"], vec![]);
    let s = body.node("Add", &[&n1, &n2], vec![]);
    let c = body.node("Identity", &["cond_in"], vec![]);
    body.output(&c, BOOL, None);
    body.output(&s, FLOAT, None);
    body.graph.name = Some("body".into());
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    let trips = b.constant(tensor(INT64, &[], &[3.0]));
    let go = b.constant(tensor(BOOL, &[], &[1.0]));
    b.node_to("Loop", &[&trips, &go, "x"], &["y"], vec![attr_graph("body", body.graph.clone())]);
    b.output("y", FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_loop");
    assert_eq!(count_op(&out, "Neg"), 2);
    assert_eq!(done, Cleanup::default());
}

#[test]
fn a_second_cleanup_finds_nothing() {
    let model = reshape_by_parts(&[sym("b"), sym("s"), D::N(8)], &["b", "s", "2", "4"], None, 17);
    let mut once = model.clone();
    cleanup::clean(&mut once);
    let mut twice = once.clone();
    assert_eq!(cleanup::clean(&mut twice), Cleanup::default());
    assert_eq!(once, twice);
}

/// The everyday command on a Llama decoder: the passes' counts and
/// provenance as without the cleanup, fewer nodes, the removed ones
/// reported; run on its own output, nothing more to do.
#[test]
fn on_a_decoder_counts_and_provenance_keep_their_meaning() {
    let model = "llama_optimum_past.onnx";
    let (_, with) = run_with_report(model, &[]);
    let (_, without) = run_with_report(model, &["--no-cleanup"]);
    assert_eq!(with["passes"], without["passes"]);
    assert_eq!(with["fused"], without["fused"]);
    assert_eq!(with["total"], without["total"]);
    assert!(without.get("cleanup").is_none());
    let removed = with["cleanup"]["removed"].as_u64().unwrap();
    assert!(removed >= 50, "{}", with["cleanup"]);
    assert_eq!(with["cleanup"]["nodes"].as_array().unwrap().len() as u64, removed);
    let count = |r: &serde_json::Value, op: &str| {
        r["ops"].as_array().unwrap().iter().find(|o| o["op_type"] == op).map_or(0, |o| o["after"].as_u64().unwrap())
    };
    assert!(count(&with, "Shape") < count(&without, "Shape"));
    assert!(count(&with, "Unsqueeze") < count(&without, "Unsqueeze"));

    let dir = tempdir();
    let (first, second) = (dir.path().join("first.onnx"), dir.path().join("second.onnx"));
    let r = run(&[testdata(model).to_str().unwrap(), "-o", first.to_str().unwrap(), "--verify"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let json = dir.path().join("again.json");
    let r = run(&[first.to_str().unwrap(), "-o", second.to_str().unwrap(), "--report-json", json.to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    let again: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(again["cleanup"]["removed"], 0);
    assert_eq!(std::fs::read(&first).unwrap(), std::fs::read(&second).unwrap());
}

#[test]
fn the_text_report_shows_the_nodes_removed() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let r = run(&[testdata("llama_optimum_past.onnx").to_str().unwrap(), "-o", out.to_str().unwrap(), "--report"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let text = String::from_utf8_lossy(&r.stdout);
    let line = text.lines().find(|l| l.starts_with("cleanup: ")).expect("a cleanup line");
    assert!(line.contains("nodes removed"), "{line}");
}

/// `x [b, 8]` and `y [<y0>, 4]`, each reshaped to `[its axis 0, 2, -1]`
/// computed from its own Shape, and y's axis 0 read twice more (a twin of
/// the node that goes).
fn two_batches(y0: D) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(8)]));
    b.input("y", FLOAT, Some(&[y0, D::N(4)]));
    let mut outs = vec![];
    for (v, twice) in [("x", false), ("y", true)] {
        let shape = b.node("Shape", &[v], vec![]);
        let i0 = b.constant(tensor(INT64, &[], &[0.0]));
        let d = b.node("Gather", &[&shape, &i0], vec![attr_int("axis", 0)]);
        let axes = b.ints(&[0]);
        let u = b.node("Unsqueeze", &[&d, &axes], vec![]);
        let rest = b.ints(&[2, -1]);
        let target = b.node("Concat", &[&u, &rest], vec![attr_int("axis", 0)]);
        // A Cast of the batch as a float scale, so the value has readers
        // besides the Reshape's target.
        let f = b.node("Cast", &[&d], vec![attr_int("to", FLOAT as i64)]);
        let scaled = b.node("Mul", &[v, &f], vec![]);
        outs.push(b.node("Reshape", &[&scaled, &target], vec![]));
        if twice {
            let again = b.node("Gather", &[&shape, &i0], vec![attr_int("axis", 0)]);
            let f2 = b.node("Cast", &[&again], vec![attr_int("to", FLOAT as i64)]);
            outs.push(b.node("Mul", &[v, &f2], vec![]));
        }
    }
    for o in &outs {
        b.output(o, FLOAT, None);
    }
    b.model(17)
}

#[test]
fn shape_values_proved_equal_are_one_value() {
    // y's axis 0 is b too: y's Gather (and its twin) read x's.
    let mut model = two_batches(sym("b"));
    let (out, done) = cleaned(&model, "cleanup_equal");
    assert_eq!(count_op(&out, "Shape"), 1, "{:?}", done.nodes);
    assert!(done.count("equal") >= 1, "{:?}", done.nodes);
    // Every value read is defined (the twin of the node that went reads what it did).
    let g = out.graph.as_ref().unwrap();
    let defined: Vec<&String> =
        g.node.iter().flat_map(|n| &n.output).chain(g.input.iter().map(|i| i.name.as_ref().unwrap())).collect();
    assert!(g.node.iter().flat_map(|n| &n.input).all(|i| defined.contains(&i)));
    // Declared other symbols: two batches, nothing shared.
    model = two_batches(sym("c"));
    let (out, done) = cleaned(&model, "cleanup_not_equal");
    assert_eq!(count_op(&out, "Shape"), 2, "{:?}", done.nodes);
    assert_eq!(done.count("equal"), 0);
}

#[test]
fn an_if_branch_is_cleaned_with_what_it_sees_outside() {
    // The then-branch reshapes x by a target it computes from Shape(x)
    // (x's axis 1 a number outside): the target becomes a constant there,
    // and its twin Neg nodes one.
    let mut then = Builder::default();
    let shape = then.node("Shape", &["x"], vec![]);
    let i1 = then.constant(tensor(INT64, &[], &[1.0]));
    let d = then.node("Gather", &[&shape, &i1], vec![attr_int("axis", 0)]);
    let axes = then.ints(&[0]);
    let u = then.node("Unsqueeze", &[&d, &axes], vec![]);
    let minus = then.ints(&[-1]);
    let target = then.node("Concat", &[&minus, &u], vec![attr_int("axis", 0)]);
    let r = then.node("Reshape", &["x", &target], vec![]);
    let n1 = then.node("Neg", &[&r], vec![]);
    let n2 = then.node("Neg", &[&r], vec![]);
    let y = then.node("Add", &[&n1, &n2], vec![]);
    then.output(&y, FLOAT, None);
    then.graph.name = Some("then".into());
    let mut other = Builder::default();
    let z = other.node("Identity", &["x"], vec![]);
    other.output(&z, FLOAT, None);
    other.graph.name = Some("else".into());
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("b"), D::N(8)]));
    b.input("c", BOOL, Some(&[]));
    b.node_to(
        "If",
        &["c"],
        &["y"],
        vec![attr_graph("then_branch", then.graph.clone()), attr_graph("else_branch", other.graph.clone())],
    );
    b.output("y", FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_if_branch");
    assert!(done.nodes.iter().all(|r| r.graph.starts_with("main/")), "{:?}", done.nodes);
    assert_eq!(count_op(&out, "Shape"), 0, "{:?}", done.nodes);
    assert_eq!(count_op(&out, "Neg"), 1);
    assert_eq!(reshape_target(&out), Some(vec![-1, 8]));
}

/// `Cast(Cast(a·b → t) → int64) − a·b` of `x [a, b, n]`: a float holds a
/// size only up to 2^24 and int32 up to 2^31 − 1, so the two differ where
/// `a = b = 4097` (float: -1, not 0) or `a = b = 65536` (int32 wraps to 0:
/// -2^32), which an empty x may have; neither the shapes nor the cleanup
/// may take one for the other.
#[test]
fn a_size_through_a_float_cast_is_not_the_size() {
    for (to, side) in [(FLOAT, 4097), (INT32, 65536)] {
        let mut b = Builder::default();
        b.input("x", FLOAT, Some(&[sym("a"), sym("b"), sym("n")]));
        let shape = b.node("Shape", &["x"], vec![]);
        let at = |b: &mut Builder, i: f64| {
            let i = b.constant(tensor(INT64, &[], &[i]));
            b.node("Gather", &[&shape, &i], vec![attr_int("axis", 0)])
        };
        let (a, c) = (at(&mut b, 0.0), at(&mut b, 1.0));
        let size = b.node("Mul", &[&a, &c], vec![]);
        let cast = b.node("Cast", &[&size], vec![attr_int("to", to as i64)]);
        let back = b.node("Cast", &[&cast], vec![attr_int("to", INT64 as i64)]);
        let d = b.node("Sub", &[&back, &size], vec![]);
        b.output(&d, INT64, None);
        let model = b.model(17);
        let (out, done) = cleaned(&model, "cleanup_lossy_cast");
        assert_eq!((done.count("equal"), done.count("constant")), (0, 0), "to {to}: {:?}", done.nodes);
        assert_eq!(ops(&out), ops(&model));
        let dir = tempdir();
        let feeds = dir.path().join("wide_and_empty.npz");
        npz(&feeds, &[("x", vec![side, side, 0], vec![])], &[]);
        let v = compare(&model, &out, &feeds).unwrap();
        assert!(v.passed, "to {to}: {}", v.text());
    }
}

/// A declared axis of a negative number (exporters write -1 for an unknown
/// one; ONNX Runtime runs it at any size) is no size: `Shape(x)[0]` stays
/// computed at run time, where the cleanup once folded it to -1 (ONNX
/// Runtime's test model embed_layer_norm_format8 then no longer loaded).
#[test]
fn a_negative_declared_axis_is_unknown_not_a_size() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(-1), D::N(4)]));
    let shape = b.node("Shape", &["x"], vec![]);
    let i0 = b.constant(tensor(INT64, &[], &[0.0]));
    let n = b.node("Gather", &[&shape, &i0], vec![attr_int("axis", 0)]);
    let f = b.node("Cast", &[&n], vec![attr_int("to", FLOAT as i64)]);
    let y = b.node("Mul", &["x", &f], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_negative_axis");
    assert_eq!(ops(&out), ["Shape", "Constant", "Gather", "Cast", "Mul"], "{:?}", done.nodes);
    assert_eq!(done.count("constant"), 0, "{:?}", done.nodes);
}

#[test]
fn an_if_condition_stays_computed_at_run_time() {
    // Size(x) is proved 4, the constant `four` too: made one, the condition
    // would be a constant, and ONNX Runtime would inline the branch at load
    // and infer its shapes anew (ONNX's AffineGrid function then fails to
    // load, its Range fed 1-element tensors the condition hid).
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(2)]));
    let size = b.node("Size", &["x"], vec![]);
    let four = b.constant(tensor(INT64, &[], &[4.0]));
    let c = b.node("Equal", &[&size, &four], vec![]);
    if_reading(&mut b, &c, "x", "y");
    b.output("y", FLOAT, None);
    // The same Size read elsewhere only (not by a condition) is folded, and
    // so is one a condition reads beside x's values (a kernel guard's: it
    // is never a constant).
    let other = b.node("Size", &["x"], vec![]);
    let f = b.node("Cast", &[&other], vec![attr_int("to", FLOAT as i64)]);
    let z = b.node("Mul", &["x", &f], vec![]);
    b.output(&z, FLOAT, None);
    let total = b.node("ReduceSum", &["x"], vec![attr_int("keepdims", 0)]);
    let count = b.node("Size", &["x"], vec![]);
    let count = b.node("Cast", &[&count], vec![attr_int("to", FLOAT as i64)]);
    let guard = b.node("Less", &[&total, &count], vec![]);
    if_reading(&mut b, &guard, "x", "y2");
    b.output("y2", FLOAT, None);
    let model = b.model(17);
    let (out, done) = cleaned(&model, "cleanup_if_condition");
    let g = out.graph.as_ref().unwrap();
    let equal = g.node.iter().find(|n| n.is("Equal")).expect("the condition is computed");
    let read = g.node.iter().find(|n| n.output.first() == equal.input.first()).expect("its first operand's node");
    assert!(read.is("Size"), "{:?}", done.nodes);
    assert_eq!(g.node.iter().filter(|n| n.is("Size")).count(), 1, "{:?}", done.nodes);
}

#[test]
fn a_node_nothing_reads_holds_back_no_fusion() {
    // An RMSNorm whose mean an Identity nothing reads also reads (as
    // onnxscript's test models and BART's cores have them): the node goes
    // before the passes, with the cleanup, and the norm fuses; with
    // --no-cleanup it stays, and the norm is declined.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
    let y = rms_norm(&mut b, &x, FLOAT, &[1.0, 2.0, 3.0, 4.0]);
    b.output(&y, FLOAT, None);
    let mean = b.graph.node.iter().find(|n| n.is("ReduceMean")).unwrap().output[0].clone();
    b.node("Identity", &[&mean], vec![]);
    let dir = tempdir();
    let (input, out) = (dir.path().join("dead.onnx"), dir.path().join("out.onnx"));
    std::fs::write(&input, prost::Message::encode_to_vec(&b.model(17))).unwrap();
    let json = dir.path().join("report.json");
    let fused = |extra: &[&str]| {
        let files = [input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", json.to_str().unwrap()];
        let r = run(&[&files[..], extra].concat());
        assert!(r.status.success(), "{}", stderr(&r));
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let rms = report["passes"].as_array().unwrap().iter().find(|p| p["name"] == "rms-norm").unwrap().clone();
        (rms["fused"].as_u64().unwrap(), report["cleanup"].clone())
    };
    let (n, cleanup) = fused(&[]);
    assert_eq!(n, 1, "{cleanup}");
    let unread = cleanup["nodes"].as_array().unwrap().iter().filter(|r| r["op_type"] == "Identity").count();
    assert_eq!(unread, 1, "{cleanup}");
    assert_eq!(cleanup["nodes"][0]["why"], "unread", "{cleanup}");
    assert_eq!(fused(&["--no-cleanup"]).0, 0);
}
