//! The rotary pass: `x·cos + rotate_half(x)·sin` → ONNX `RotaryEmbedding`,
//! the node written, and a near-miss for each precondition.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::{ModelProto, FLOAT, INT64};
use onnx_fuse::passes::rotary;
use onnx_fuse::rewrite;

/// Which precondition a hand-made rotary breaks.
#[derive(Clone, Copy, PartialEq)]
enum Break {
    None,
    /// cos = Cos(Concat(f, g)): its halves differ.
    Halves,
    /// rotate_half writes Concat(x₁, −x₂): the other turn.
    Turn,
    /// x₁ cut at 3 of 8.
    Cut,
    /// The table's batch is 2 where x's is b.
    Batch,
}

/// A rotary as Hugging Face exports write it: x [b, 4, s, 8], the tables
/// [1, s, 8] computed from `freqs` [1, s, 4].
fn rotary_model(broken: Break) -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(4), sym("s"), D::N(8)]));
    let batch = if broken == Break::Batch { D::N(2) } else { D::N(1) };
    let f = b.input("freqs", FLOAT, Some(&[batch.clone(), sym("s"), D::N(4)]));
    let g = b.input("other", FLOAT, Some(&[batch, sym("s"), D::N(4)]));
    let second = if broken == Break::Halves { g } else { f.clone() };
    let emb = b.node("Concat", &[&f, &second], vec![attr_int("axis", -1)]);
    let cos = b.node("Cos", &[&emb], vec![]);
    let sin = b.node("Sin", &[&emb], vec![]);
    let one = b.constant(tensor(INT64, &[1], &[1.0]));
    let c = b.node("Unsqueeze", &[&cos, &one], vec![]);
    let s = b.node("Unsqueeze", &[&sin, &one], vec![]);
    let ints = |b: &mut Builder, v: i64| b.constant(tensor(INT64, &[1], &[v as f64]));
    let (zero, half, end, last) = (ints(&mut b, 0), ints(&mut b, 4), ints(&mut b, i64::MAX), ints(&mut b, -1));
    let cut = if broken == Break::Cut { ints(&mut b, 3) } else { half.clone() };
    let x1 = b.node("Slice", &[&x, &zero, &cut, &last], vec![]);
    let x2 = b.node("Slice", &[&x, &cut, &end, &last], vec![]);
    let neg = b.node("Neg", &[&x2], vec![]);
    let turned = if broken == Break::Turn {
        let neg1 = b.node("Neg", &[&x1], vec![]);
        b.node("Concat", &[&neg1, &x2], vec![attr_int("axis", -1)])
    } else {
        b.node("Concat", &[&neg, &x1], vec![attr_int("axis", -1)])
    };
    let plain = b.node("Mul", &[&x, &c], vec![]);
    let rotated = b.node("Mul", &[&turned, &s], vec![]);
    b.node_to("Add", &[&plain, &rotated], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(23)
}

fn fuse(model: &ModelProto) -> (ModelProto, rewrite::Outcome) {
    let mut fused = model.clone();
    let outcome = rewrite::run(&mut fused, &[&rotary::PASS]);
    (fused, outcome)
}

#[test]
fn a_rotate_half_rotary_is_one_rotary_embedding() {
    let model = rotary_model(Break::None);
    let (fused, outcome) = fuse(&model);
    assert_eq!(outcome.fused.len(), 1);
    let node = all_nodes(&fused).into_iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    assert_eq!(node.domain(), "", "ONNX's own op");
    assert_eq!(node.input[0], "x");
    assert_eq!(node.output, ["y"], "the anchor's output");
    assert!(node.attribute.is_empty(), "rotate-half, the whole head, caches without position_ids");
    // The caches: the first half of each table, repeated over x's batch.
    for cache in &node.input[1..] {
        let expand = all_nodes(&fused).into_iter().find(|n| &n.output[0] == cache).unwrap();
        assert_eq!(expand.op_type(), "Expand", "a table of one batch row is repeated over x's");
    }
    let list = fused_list(node);
    assert!(list[0].starts_with("Add "), "the anchor first: {list:?}");
    for op in ["Mul", "Slice", "Neg", "Concat"] {
        assert!(list.iter().any(|e| e.starts_with(op)), "{op} replaced: {list:?}");
    }
    // The tables' Unsqueezes go too (nothing else reads them); the tables stay.
    assert_eq!(count_op(&fused, "Unsqueeze"), 0);
    assert_eq!(count_op(&fused, "Cos") + count_op(&fused, "Sin"), 2);
    assert_equivalent(&model, &fused, "rotary");
}

/// Every product and the sum either order: the value whose halves are
/// turned is x, whichever operand it is (the table first once made the pass
/// read the table as x and decline).
#[test]
fn operands_in_either_order_fuse() {
    let model = rotary_model(Break::None);
    let mut swapped = model.clone();
    for n in &mut swapped.graph.as_mut().unwrap().node {
        if matches!(n.op_type(), "Mul" | "Add") {
            n.input.reverse();
        }
    }
    let (fused, outcome) = fuse(&swapped);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    assert_eq!(all_nodes(&fused).into_iter().find(|n| n.op_type() == "RotaryEmbedding").unwrap().input[0], "x");
    assert_equivalent(&swapped, &fused, "rotary, operands swapped");
}

#[test]
fn near_misses_do_not_fuse_and_say_why() {
    for (broken, why) in [
        (Break::Halves, "the two halves of the cos table are not proved equal"),
        // −x₁ first: the operand read as x₁ is the second half.
        (Break::Turn, "does not cut [0, 4) of the last axis of 8"),
        (Break::Cut, "does not cut [0, 4) of the last axis of 8"),
        (Break::Batch, "is not proved [b or 1, s, d]"),
    ] {
        let (fused, outcome) = fuse(&rotary_model(broken));
        assert_eq!(count_op(&fused, "RotaryEmbedding"), 0, "{why}");
        let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(why)), "{why}: {said:?}");
    }
}

#[test]
fn exports_rotaries_become_rotary_embeddings_and_compute_the_same() {
    for name in ["llama_optimum_past.onnx", "llama_ts_op14.onnx", "qwen2_ts_op14.onnx", "gemma2_ts_op18.onnx"] {
        let original = load(name);
        let (mut model, upgrade) = onnx_fuse::upgrade::upgrade(&original, 23).unwrap();
        let outcome = rewrite::run_upgraded(&mut model, &[&rotary::PASS], Default::default(), upgrade.added);
        assert_eq!(outcome.fused.len(), 4, "{name}: q and k of both layers");
        assert_eq!(count_op(&model, "RotaryEmbedding"), 4, "{name}");
        // One half-table slice per table, shared by every rotary.
        let slices = all_nodes(&model).into_iter().filter(|n| n.op_type() == "Slice" && n.output[0].ends_with("/half"));
        assert_eq!(slices.count(), 2, "{name}: cos and sin sliced once");
        assert_equivalent(&original, &model, name);
    }
}
