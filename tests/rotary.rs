//! The rotary pass: `x·cos + rotate_half(x)·sin` and its interleaved form
//! (GPT-J's `rotate_every_two`) → ONNX `RotaryEmbedding`, the node
//! written, and a near-miss for each precondition.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::{ModelProto, NodeProto, FLOAT, FLOAT16, INT64};
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
    /// No break: heads third, x `[b, s, 4, 8]`, the tables unsqueezed at
    /// axis 2 (the kernel's 3-D input).
    HeadsThird,
    /// No break: the halves are the two parts of a Split of x (`x.chunk(2,
    /// -1)`, ESM's rotate_half), sizes `[4, 4]`.
    Split,
    /// No break: the same Split by `num_outputs` 2 alone.
    SplitInTwo,
    /// The Split's parts turned the other way: Concat(Neg(x₁), x₂).
    SplitTurn,
    /// A Split into `[3, 5]`.
    SplitUneven,
    /// No break: x is f16, its turn computed in f16, both widened to f32
    /// before their products (OLMo 2's f16 export).
    Widened,
    /// No break: the tables 4-D `[1, 1, s, 8]` and no Unsqueeze of rows,
    /// as ESM writes them: its cached `[1, 1, s, 8]` sliced on the
    /// sequence axis to x's length.
    Cached,
    /// The same, the cached table's halves of two values.
    CachedHalves,
    /// No break: x `[b, 4, 3, 8]` and the tables constants `[1, 1, 3, 8]`
    /// (a static export's), each row's halves equal.
    Constant,
    /// The same, one value of the cos table's second halves other.
    ConstantHalves,
}

/// A rotary as Hugging Face exports write it: x [b, 4, s, 8], the tables
/// [1, s, 8] computed from `freqs` [1, s, 4].
fn rotary_model(broken: Break) -> ModelProto {
    let mut b = Builder::default();
    let heads_third = broken == Break::HeadsThird;
    let constant = matches!(broken, Break::Constant | Break::ConstantHalves);
    let s = if constant { D::N(3) } else { sym("s") };
    let dims = if heads_third { [sym("b"), s, D::N(4), D::N(8)] } else { [sym("b"), D::N(4), s, D::N(8)] };
    let widened = broken == Break::Widened;
    let x = b.input("x", if widened { FLOAT16 } else { FLOAT }, Some(&dims));
    let batch = if broken == Break::Batch { D::N(2) } else { D::N(1) };
    let f = b.input("freqs", FLOAT, Some(&[batch.clone(), sym("s"), D::N(4)]));
    let g = b.input("other", FLOAT, Some(&[batch, sym("s"), D::N(4)]));
    let second = if broken == Break::Halves { g.clone() } else { f.clone() };
    let emb = b.node("Concat", &[&f, &second], vec![attr_int("axis", -1)]);
    let cos = b.node("Cos", &[&emb], vec![]);
    let sin = b.node("Sin", &[&emb], vec![]);
    let heads = b.constant(tensor(INT64, &[1], &[if heads_third { 2.0 } else { 1.0 }]));
    let cached = matches!(broken, Break::Cached | Break::CachedHalves);
    let table = |b: &mut Builder, t: &str| -> String {
        if !cached {
            return b.node("Unsqueeze", &[t, &heads], vec![]);
        }
        // Unsqueeze(t, 0) [1, 1, s, 8], sliced on axis 2 to x's length.
        let (zero, two) = (b.ints(&[0]), b.ints(&[2]));
        let cache = b.node("Unsqueeze", &[t, &zero], vec![]);
        let length = b.node("Shape", &[&x], vec![attr_int("start", 2), attr_int("end", 3)]);
        b.node("Slice", &[&cache, &zero, &length, &two], vec![])
    };
    let (cos, sin) = match broken {
        Break::CachedHalves => {
            let emb = b.node("Concat", &[&f, &g], vec![attr_int("axis", -1)]);
            (b.node("Cos", &[&emb], vec![]), sin)
        }
        _ => (cos, sin),
    };
    let (c, s) = match constant {
        // Rows of 3 positions, [f, f] each, f the position's 4 values.
        true => {
            let table = |b: &mut Builder, of: fn(f64) -> f64, other: bool| {
                let mut values: Vec<f64> = (0..24).map(|i| of(f64::from(i / 8 * 4 + i % 4) * 0.3)).collect();
                if other {
                    values[13] += 0.5;
                }
                b.constant(tensor(FLOAT, &[1, 1, 3, 8], &values))
            };
            (table(&mut b, f64::cos, broken == Break::ConstantHalves), table(&mut b, f64::sin, false))
        }
        false => (table(&mut b, &cos), table(&mut b, &sin)),
    };
    let ints = |b: &mut Builder, v: i64| b.constant(tensor(INT64, &[1], &[v as f64]));
    let (zero, half, end, last) = (ints(&mut b, 0), ints(&mut b, 4), ints(&mut b, i64::MAX), ints(&mut b, -1));
    let cut = if broken == Break::Cut { ints(&mut b, 3) } else { half.clone() };
    let (x1, x2) = match broken {
        Break::Split | Break::SplitTurn | Break::SplitUneven | Break::SplitInTwo => {
            let (first, second) = ("x_first_half".to_string(), "x_second_half".to_string());
            let mut inputs = vec![x.clone()];
            let mut attributes = vec![attr_int("axis", -1)];
            match broken {
                Break::SplitInTwo => attributes.push(attr_int("num_outputs", 2)),
                Break::SplitUneven => inputs.push(b.constant(tensor(INT64, &[2], &[3.0, 5.0]))),
                _ => inputs.push(b.constant(tensor(INT64, &[2], &[4.0, 4.0]))),
            }
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            b.node_to("Split", &inputs, &[&first, &second], attributes);
            if broken == Break::SplitTurn {
                (second, first)
            } else {
                (first, second)
            }
        }
        _ => (b.node("Slice", &[&x, &zero, &cut, &last], vec![]), b.node("Slice", &[&x, &cut, &end, &last], vec![])),
    };
    let neg = b.node("Neg", &[&x2], vec![]);
    let turned = if broken == Break::Turn {
        let neg1 = b.node("Neg", &[&x1], vec![]);
        b.node("Concat", &[&neg1, &x2], vec![attr_int("axis", -1)])
    } else {
        b.node("Concat", &[&neg, &x1], vec![attr_int("axis", -1)])
    };
    let wide = |b: &mut Builder, v: &str| match widened {
        true => b.node("Cast", &[v], vec![attr_int("to", i64::from(FLOAT))]),
        false => v.to_string(),
    };
    let (x, turned) = (wide(&mut b, &x), wide(&mut b, &turned));
    let plain = b.node("Mul", &[&x, &c], vec![]);
    let rotated = b.node("Mul", &[&turned, &s], vec![]);
    b.node_to("Add", &[&plain, &rotated], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(23)
}

/// Which precondition a hand-made interleaved rotary breaks.
#[derive(Clone, Copy, PartialEq)]
enum Pairs {
    None,
    /// Each pair turned as (−xₑ, x₀): the even values negated.
    Turn,
    /// x₀ sliced by 1, not by 2.
    Step,
    /// The tables repeated whole (`[c₀ … c₃, c₀ … c₃]`), not each value twice.
    Whole,
    /// Heads second: x `[b, 4, s, 8]`, the tables broadcast over axis 1.
    HeadsSecond,
    /// The cos table a constant, `Reshape(Constant node, shape)`: what
    /// computes the Reshape's input reads no input.
    ConstantCos,
    /// No break: the rows `[1, s, 1, 4]` (4-D, no Unsqueeze of `[1, s,
    /// 4]`) stacked with themselves, RoFormer's `stack([t, t], -1)`: two
    /// Unsqueezes each with its own axes, a Concat on the last axis.
    Stacked,
    /// The rows stacked with other rows.
    StackedOther,
    /// No break: x `[b, 3, 4, 8]`, the tables constants `[1, 3, 1, 8]`,
    /// each value twice in place (a static export's).
    Constant,
    /// The same, one pair of the cos table's two values.
    ConstantPairs,
    /// No break: the tables torch's general `repeat_interleave(rows, 2,
    /// -1)` as its TorchScript export writes it (Cohere's, GLM's): the
    /// rows' last axis moved first, unsqueezed, expanded, gathered at the
    /// indices of a mask `arange(2) < repeats` every element of which is
    /// true, and moved back last; unsqueezed at the heads axis.
    Gathered,
    /// The same, repeats `[2, 2, 1, 3]` (as many values, not pairs).
    GatheredUneven,
    /// The same, the expanded rows a Concat of the rows and their negation.
    GatheredOther,
}

/// GPT-J's rotary as its TorchScript export writes it: x `[b, s, 4, 8]`
/// (the heads before their transpose), `rotate_every_two(x)` stacked and
/// viewed back, and the tables `repeat_interleave(rows, 2)` of rows `[1,
/// s, 4]`, unsqueezed at the heads axis and at the end, tiled and
/// reshaped to `Shape(tiled)[:3] + [-1]`.
fn interleaved_model(broken: Pairs) -> ModelProto {
    let mut b = Builder::default();
    let heads = if broken == Pairs::HeadsSecond { 1 } else { 2 };
    let dims = if heads == 1 { [sym("b"), D::N(4), sym("s"), D::N(8)] } else { [sym("b"), sym("s"), D::N(4), D::N(8)] };
    let constant = matches!(broken, Pairs::Constant | Pairs::ConstantPairs);
    let dims = match constant {
        true => [sym("b"), D::N(3), D::N(4), D::N(8)],
        false => dims,
    };
    let x = b.input("x", FLOAT, Some(&dims));
    let table = |b: &mut Builder, name: &str| {
        if constant {
            let mut values: Vec<f64> = (0..24).map(|i| f64::from(i / 2) * 0.1).collect();
            if name == "cos" && broken == Pairs::ConstantPairs {
                values[5] += 0.5;
            }
            return b.constant(tensor(FLOAT, &[1, 3, 1, 8], &values));
        }
        if name == "cos" && broken == Pairs::ConstantCos {
            // Each of 4 positions' 4 values twice, as [1, 4, 1, 8].
            let values: Vec<f64> = (0..32).map(|i| f64::from(i / 2) * 0.125).collect();
            let flat = b.constant(tensor(FLOAT, &[32], &values));
            let to = b.ints(&[1, 4, 1, 8]);
            return b.node("Reshape", &[&flat, &to], vec![]);
        }
        if matches!(broken, Pairs::Stacked | Pairs::StackedOther) {
            let rows = b.input(name, FLOAT, Some(&[D::N(1), sym("s"), D::N(1), D::N(4)]));
            let other = match broken {
                Pairs::StackedOther => b.node("Neg", &[&rows], vec![]),
                _ => rows.clone(),
            };
            let (last, last_again) = (b.ints(&[-1]), b.ints(&[-1]));
            let first = b.node("Unsqueeze", &[&rows, &last], vec![]);
            let second = b.node("Unsqueeze", &[&other, &last_again], vec![]);
            let stacked = b.node("Concat", &[&first, &second], vec![attr_int("axis", -1)]);
            let shape = b.ints(&[1, -1, 1, 8]);
            return b.node("Reshape", &[&stacked, &shape], vec![]);
        }
        let rows = b.input(name, FLOAT, Some(&[D::N(1), sym("s"), D::N(4)]));
        let gathered = match broken {
            Pairs::Gathered => Some(Gathered::Pairs),
            Pairs::GatheredUneven => Some(Gathered::Uneven),
            Pairs::GatheredOther => Some(Gathered::Negated),
            _ => None,
        };
        if let Some(how) = gathered {
            let table = gathered_pairs(b, &rows, 4, how);
            let heads_axis = b.ints(&[heads]);
            return b.node("Unsqueeze", &[&table, &heads_axis], vec![]);
        }
        let (axes, reps) =
            if broken == Pairs::Whole { ([heads, 3], [1, 1, 1, 2, 1]) } else { ([heads, 4], [1, 1, 1, 1, 2]) };
        let axes = b.ints(&axes);
        let u = b.node("Unsqueeze", &[&rows, &axes], vec![]);
        let reps = b.ints(&reps);
        let tiled = b.node("Tile", &[&u, &reps], vec![]);
        let shape = b.node("Shape", &[&tiled], vec![]);
        let (zero, three, minus_one) = (b.ints(&[0]), b.ints(&[3]), b.ints(&[-1]));
        let first = b.node("Slice", &[&shape, &zero, &three, &zero], vec![]);
        let to = b.node("Concat", &[&first, &minus_one], vec![attr_int("axis", 0)]);
        b.node("Reshape", &[&tiled, &to], vec![])
    };
    let (c, s) = (table(&mut b, "cos"), table(&mut b, "sin"));
    let (zero, one, end, last, two) = (b.ints(&[0]), b.ints(&[1]), b.ints(&[i64::MAX]), b.ints(&[3]), b.ints(&[2]));
    let step = if broken == Pairs::Step { one.clone() } else { two };
    let even = b.node("Slice", &[&x, &zero, &end, &last, &step], vec![]);
    let odd = b.node("Slice", &[&x, &one, &end, &last, &step], vec![]);
    let (negated, kept) = if broken == Pairs::Turn { (even, odd) } else { (odd, even) };
    let neg = b.node("Neg", &[&negated], vec![]);
    let minus_one = b.ints(&[-1]);
    let first = b.node("Unsqueeze", &[&neg, &minus_one], vec![]);
    let second = b.node("Unsqueeze", &[&kept, &minus_one], vec![]);
    let stacked = b.node("Concat", &[&first, &second], vec![attr_int("axis", -1)]);
    let shape = b.node("Shape", &[&stacked], vec![]);
    let minus_two = b.ints(&[-2]);
    let lead = b.node("Slice", &[&shape, &zero, &minus_two, &zero], vec![]);
    let to = b.node("Concat", &[&lead, &minus_one], vec![attr_int("axis", 0)]);
    let turned = b.node("Reshape", &[&stacked, &to], vec![]);
    let plain = b.node("Mul", &[&x, &c], vec![]);
    let rotated = b.node("Mul", &[&turned, &s], vec![]);
    b.node_to("Add", &[&plain, &rotated], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(23)
}

/// Export `name` upgraded to opset 23 and its rotaries fused, where the
/// pass fuses 4 (q's and k's of both layers): (original, fused).
fn four_rotaries(name: &str) -> (ModelProto, ModelProto) {
    let original = load(name);
    let (mut model, upgrade) = onnx_fuse::upgrade::upgrade(&original, 23).unwrap();
    let outcome = rewrite::run_upgraded(&mut model, &[&rotary::PASS], Default::default(), upgrade.added);
    assert_eq!(outcome.fused.len(), 4, "{name}: q and k of both layers: {:?}", outcome.declined);
    (original, model)
}

/// Each `RotaryEmbedding` of `model`: its name and its integer attributes.
fn rotary_attributes(model: &ModelProto) -> Vec<(&str, Vec<(&str, i64)>)> {
    let rotaries = all_nodes(model).into_iter().filter(|n| n.op_type() == "RotaryEmbedding");
    rotaries.map(|n| (n.name(), integers(n))).collect()
}

/// A node's attributes, each by name with its integer value.
fn integers(node: &NodeProto) -> Vec<(&str, i64)> {
    node.attribute.iter().map(|a| (a.name(), a.i())).collect()
}

fn fuse(model: &ModelProto) -> (ModelProto, rewrite::Outcome) {
    let mut fused = model.clone();
    let outcome = rewrite::run(&mut fused, &[&rotary::PASS]);
    (fused, outcome)
}

/// `model` fused, where the pass fuses exactly one rotary in it.
fn fused_once(model: &ModelProto) -> ModelProto {
    let (fused, outcome) = fuse(model);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    fused
}

#[test]
fn a_rotate_half_rotary_is_one_rotary_embedding() {
    let model = rotary_model(Break::None);
    let fused = fused_once(&model);
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

/// Heads third (`[b, s, h, d]`): the kernel's 3-D input with `num_heads`,
/// viewed back.
#[test]
fn a_rotate_half_rotary_of_heads_third_is_a_3d_rotary_embedding() {
    let model = rotary_model(Break::HeadsThird);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let rotary = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    let attrs = integers(rotary);
    assert_eq!(attrs, [("num_heads", 4)]);
    let back = nodes.iter().find(|n| n.input.contains(&rotary.output[0])).expect("the view back");
    assert_eq!((back.op_type(), back.output[0].as_str()), ("Reshape", "y"));
    assert_equivalent(&model, &fused, "rotary, heads third");
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
    let fused = fused_once(&swapped);
    assert_eq!(all_nodes(&fused).into_iter().find(|n| n.op_type() == "RotaryEmbedding").unwrap().input[0], "x");
    assert_equivalent(&swapped, &fused, "rotary, operands swapped");
}

/// `rotate_half` written with `x.chunk(2, -1)`: the halves are a Split's
/// two parts, by sizes or by `num_outputs`.
#[test]
fn a_rotate_half_of_a_split_into_halves_is_one_rotary_embedding() {
    for broken in [Break::Split, Break::SplitInTwo] {
        let model = rotary_model(broken);
        let fused = fused_once(&model);
        let node = all_nodes(&fused).into_iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
        assert_eq!((node.input[0].as_str(), node.output[0].as_str()), ("x", "y"));
        assert!(node.attribute.is_empty(), "rotate-half, the whole head");
        assert!(fused_list(node).iter().any(|e| e.starts_with("Split ")), "the Split replaced");
        assert_eq!(count_op(&fused, "Split"), 0, "nothing else reads its parts");
        assert_equivalent(&model, &fused, "rotary, halves of a Split");
    }
}

/// ESM's tables: 4-D `[1, 1, s, d]`, its cache sliced on the sequence
/// axis to x's length, no Unsqueeze of rows `[1, s, d]` to look through.
/// A Slice of another axis and an Unsqueeze keep every row whole, so
/// the halves stay equal; the kernel reads the table with its one
/// squeezed out.
#[test]
fn a_rotary_of_4d_tables_reads_their_rows_squeezed() {
    let model = rotary_model(Break::Cached);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let rotary = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    assert_eq!((rotary.input[0].as_str(), rotary.output[0].as_str()), ("x", "y"));
    let squeezes: Vec<_> = nodes.iter().filter(|n| n.op_type() == "Squeeze").collect();
    assert_eq!(squeezes.len(), 2, "cos and sin squeezed at the heads axis");
    assert!(squeezes.iter().all(|n| n.input[0].starts_with("slice_")), "the tables themselves");
    assert_equivalent(&model, &fused, "rotary of 4-D tables");
}

/// A static export's tables: constants `[1, 1, s, d]` whose rows' halves
/// are equal, bit for bit.
#[test]
fn a_rotary_of_constant_tables_whose_halves_are_equal_fuses() {
    let model = rotary_model(Break::Constant);
    let fused = fused_once(&model);
    assert_eq!(count_op(&fused, "Squeeze"), 2, "cos and sin squeezed at the heads axis");
    assert_equivalent(&model, &fused, "rotary of constant tables");
}

/// x in f16, its turn computed in f16 and both widened to f32 before the
/// products: the turn commutes with the widening exactly, so the kernel
/// reads x widened (made anew before it: the model's Cast goes with the
/// product) and computes in f32.
#[test]
fn a_rotary_of_x_widened_before_its_products_reads_x_widened() {
    let model = rotary_model(Break::Widened);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let node = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    let cast = nodes.iter().find(|n| n.output[0] == node.input[0]).expect("what it reads");
    assert_eq!((cast.op_type(), cast.input[0].as_str()), ("Cast", "x"), "x widened anew");
    assert_eq!(cast.attr_int("to"), Some(i64::from(FLOAT)));
    assert_eq!(count_op(&fused, "Cast"), 1, "the model's two Casts go with their products");
    assert_equivalent(&model, &fused, "rotary of x widened");
}

#[test]
fn near_misses_do_not_fuse_and_say_why() {
    for (broken, why) in [
        (Break::SplitTurn, "part 1 is read as half 0 of the last axis"),
        (Break::SplitUneven, "does not cut the last axis of 8 into two halves"),
        (Break::Halves, "the two halves of the cos table are not proved equal"),
        // −x₁ first: the operand read as x₁ is the second half.
        (Break::Turn, "does not cut [0, 4) of the last axis of 8"),
        (Break::Cut, "does not cut [0, 4) of the last axis of 8"),
        (Break::Batch, "is not proved [b or 1, s, d]"),
        (Break::CachedHalves, "the two halves of the cos table are not proved equal"),
        (Break::ConstantHalves, "the two halves of the cos table are not proved equal"),
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
        let (original, model) = four_rotaries(name);
        assert_eq!(count_op(&model, "RotaryEmbedding"), 4, "{name}");
        // One half-table slice per table, shared by every rotary.
        let slices = all_nodes(&model).into_iter().filter(|n| n.op_type() == "Slice" && n.output[0].ends_with("/half"));
        assert_eq!(slices.count(), 2, "{name}: cos and sin sliced once");
        assert_equivalent(&original, &model, name);
    }
}

/// GPT-J's form: each pair (x₂ᵢ, x₂ᵢ₊₁) turned, the tables repeated per
/// pair. Its heads come before their transpose, so the kernel takes x as
/// `[b, s, 4 · 8]` with `num_heads` 4, and a Reshape views the result back.
#[test]
fn an_interleaved_rotary_of_heads_before_their_transpose_is_a_3d_rotary_embedding() {
    let model = interleaved_model(Pairs::None);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let rotary = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    let attrs = integers(rotary);
    assert_eq!(attrs, [("interleaved", 1), ("num_heads", 4)]);
    let producer = |v: &str| *nodes.iter().find(|n| n.output.iter().any(|o| o == v)).unwrap();
    let constant = |v: &str| producer(v).attr("value").and_then(|a| a.t.as_ref()).unwrap().int64_data.clone();
    let merged = producer(&rotary.input[0]);
    assert_eq!((merged.op_type(), merged.input[0].as_str()), ("Reshape", "x"), "x's heads merged");
    assert_eq!(constant(&merged.input[1]), [0, 0, 32]);
    for cache in &rotary.input[1..] {
        assert_eq!(producer(cache).op_type(), "Expand", "rows of one batch repeated over x's");
        assert!(["cos", "sin"].contains(&producer(cache).input[0].as_str()), "the rows themselves are the cache");
    }
    let back = nodes.iter().find(|n| n.input.contains(&rotary.output[0])).expect("the view back");
    assert_eq!((back.op_type(), back.output[0].as_str()), ("Reshape", "y"), "the anchor's output, as heads");
    assert_eq!(constant(&back.input[1]), [0, 0, 4, 8]);
    let list = fused_list(rotary);
    assert!(list[0].starts_with("Add "), "the anchor first: {list:?}");
    for op in ["Mul", "Slice", "Neg", "Unsqueeze", "Concat", "Reshape", "Tile"] {
        assert!(list.iter().any(|e| e.starts_with(op)), "{op} replaced: {list:?}");
    }
    assert_eq!(count_op(&fused, "Tile"), 0, "the tables' repeats go with the rotary");
    assert_equivalent(&model, &fused, "interleaved rotary");
}

/// RoFormer's tables: rows `[1, s, 1, 4]` stacked with themselves on a
/// new last axis (two Unsqueezes, each with its own axes constant) and
/// viewed as `[1, s, 1, 8]`: each value twice, the rows squeezed.
#[test]
fn an_interleaved_rotary_of_rows_stacked_with_themselves_fuses() {
    let model = interleaved_model(Pairs::Stacked);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let rotary = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    let attrs = integers(rotary);
    assert_eq!(attrs, [("interleaved", 1), ("num_heads", 4)]);
    let squeezed: Vec<&str> = nodes.iter().filter(|n| n.op_type() == "Squeeze").map(|n| n.input[0].as_str()).collect();
    assert_eq!(squeezed, ["cos", "sin"], "the rows, squeezed at the heads axis");
    assert_equivalent(&model, &fused, "interleaved rotary, rows stacked");
}

/// A static export's tables: constants `[1, s, 1, d]` of each value twice
/// in place: the rows are every second value.
#[test]
fn an_interleaved_rotary_of_constant_tables_reads_every_second_value() {
    let model = interleaved_model(Pairs::Constant);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let steps =
        nodes.iter().filter(|n| n.op_type() == "Slice" && n.input.len() == 5 && n.output[0].ends_with("/pairs"));
    assert_eq!(steps.count(), 2, "every second value of cos and sin");
    assert_equivalent(&model, &fused, "interleaved rotary of constant tables");
}

/// Heads second (`[b, h, s, d]`): the kernel's 4-D input, no view.
#[test]
fn an_interleaved_rotary_of_heads_second_reads_x_itself() {
    let model = interleaved_model(Pairs::HeadsSecond);
    let fused = fused_once(&model);
    let rotary = all_nodes(&fused).into_iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    assert_eq!((rotary.input[0].as_str(), rotary.output[0].as_str()), ("x", "y"));
    let attrs = integers(rotary);
    assert_eq!(attrs, [("interleaved", 1)]);
    assert_eq!(count_op(&fused, "Reshape"), 0, "no view, and the repeats are gone");
    assert_equivalent(&model, &fused, "interleaved rotary, heads second");
}

/// Cohere's and GLM's tables: torch's general `repeat_interleave` of the
/// rows (`Pairs::Gathered`). The kernel reads every second value of the
/// gathered table.
#[test]
fn an_interleaved_rotary_of_tables_torch_repeats_by_gathering_fuses() {
    let model = interleaved_model(Pairs::Gathered);
    let fused = fused_once(&model);
    let nodes = all_nodes(&fused);
    let rotary = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
    let attrs = integers(rotary);
    assert_eq!(attrs, [("interleaved", 1), ("num_heads", 4)]);
    let steps =
        nodes.iter().filter(|n| n.op_type() == "Slice" && n.input.len() == 5 && n.output[0].ends_with("/pairs"));
    assert_eq!(steps.count(), 2, "every second value of cos and sin");
    assert_eq!(count_op(&fused, "GatherND"), 2, "the tables stay as they are computed");
    assert_equivalent(&model, &fused, "interleaved rotary of gathered tables");
}

#[test]
fn interleaved_near_misses_do_not_fuse_and_say_why() {
    for (broken, why) in [
        // −xₑ first: the value read as xₑ is x₀.
        (Pairs::Turn, "does not cut [0, 8) by 2 of the last axis of 8"),
        (Pairs::Step, "does not cut [0, 8) by 2 of the last axis of 8"),
        (Pairs::Whole, "the cos table is not proved a repeat of each value twice on the last axis"),
        (
            Pairs::StackedOther,
            "the cos table is repeated by Concat, not Tile or Expand (nor a Concat of one value twice)",
        ),
        (Pairs::ConstantPairs, "the cos table is not proved a repeat of each value twice on the last axis"),
        // As many values, but the mask holds zeros: its indices are not
        // proved, nor the table's last axis.
        (Pairs::GatheredUneven, "the cos table is not proved [b or 1, s, d] of x's b, s and d"),
        (Pairs::GatheredOther, "the cos table is not proved a repeat of each value twice on the last axis"),
    ] {
        let model = interleaved_model(broken);
        let (fused, outcome) = fuse(&model);
        assert_eq!(count_op(&fused, "RotaryEmbedding"), 0, "{why}");
        let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(why)), "{why}: {said:?}");
    }
}

/// GPT-J's TorchScript export, and Optimum's with the cache (positions
/// given: rows of x's batch): q's and k's rotary of both layers, on the
/// first 4 of each head's 8 channels.
#[test]
fn gptjs_interleaved_rotaries_become_rotary_embeddings_and_compute_the_same() {
    for name in ["gptj_ts_op17.onnx", "gptj_optimum_past.onnx"] {
        let (original, model) = four_rotaries(name);
        for (rotary, attrs) in rotary_attributes(&model) {
            assert_eq!(attrs, [("interleaved", 1), ("num_heads", 4)], "{name}: {rotary}");
        }
        // The exports compute the tables once for every layer: the repeats
        // of cos and sin go with the last rotary reading them, and the
        // Tiles that gather the positions stay.
        let tiles = (count_op(&original, "Tile"), count_op(&model, "Tile"));
        assert_eq!(tiles.1, tiles.0 - 2, "{name}: each table's repeat goes with its last rotary");
        assert_equivalent(&original, &model, name);
    }
}

/// Cohere's and GLM's Optimum exports with the cache: tables torch's
/// general `repeat_interleave` writes (`Pairs::Gathered`), after cos and
/// sin (Cohere's) or of the rotary half of each head, whose x is cut at
/// the table's length (GLM's): q's and k's rotary of both layers, heads
/// second.
#[test]
fn cohere_and_glm_rotaries_of_gathered_tables_become_rotary_embeddings() {
    for name in ["cohere_optimum_past.onnx", "glm_optimum_past.onnx"] {
        let (original, model) = four_rotaries(name);
        for (rotary, attrs) in rotary_attributes(&model) {
            assert_eq!(attrs, [("interleaved", 1)], "{name}: {rotary}");
        }
        let pairs = all_nodes(&model).into_iter().filter(|n| n.op_type() == "Slice" && n.output[0].ends_with("/pairs"));
        assert_eq!(pairs.count(), 2, "{name}: every second value of cos and sin, cut once for every layer");
        assert_equivalent(&original, &model, name);
    }
}

/// An interleaved rotary whose cos table is `Reshape(Constant node,
/// shape)`: the table is no repeat the pass reads, and the candidate is
/// declined with that reason. (The pass read the first input of the
/// Reshape's producer before its op, and the Constant has none: the run
/// ended in an internal error.)
#[test]
fn an_interleaved_rotary_whose_cos_table_is_a_reshaped_constant_declines() {
    let model = interleaved_model(Pairs::ConstantCos);
    onnx_fuse::validate::model(&model).unwrap();
    let (fused, outcome) = fuse(&model);
    assert_eq!(count_op(&fused, "RotaryEmbedding"), 0);
    let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
    // A constant of 4 positions, where x's are s.
    let why = "the cos table is not proved [b or 1, 1, s, d] or [b or 1, s, 1, d]";
    assert!(said.iter().any(|r| r.contains(why)), "{why}: {said:?}");
    // The command: no internal error, the reason in --explain.
    let dir = tempdir();
    let (input, out) = (dir.path().join("rotary.onnx"), dir.path().join("out.onnx"));
    std::fs::write(&input, prost::Message::encode_to_vec(&model)).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--explain"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(!stderr(&r).contains("internal error"), "{}", stderr(&r));
    assert!(String::from_utf8_lossy(&r.stdout).contains(why), "{}", String::from_utf8_lossy(&r.stdout));
}

/// `model` with its `[1, 1, 3, 8]` constant tables moved into external
/// data, `tables.bin` beside `model.onnx` in `dir` (as torch's dynamo
/// exporter writes a static export's tables): the model's path.
fn with_tables_apart(model: &ModelProto, dir: &std::path::Path) -> std::path::PathBuf {
    use onnx_fuse::onnx::{proto::tensor_proto::DataLocation, StringStringEntryProto};
    let mut model = model.clone();
    let graph = model.graph.as_mut().unwrap();
    let mut data = Vec::new();
    let tables: Vec<usize> = (0..graph.node.len())
        .filter(|&i| {
            graph.node[i].op_type() == "Constant" && graph.node[i].attribute[0].t.as_ref().unwrap().dims.len() == 4
        })
        .collect();
    for &i in tables.iter().rev() {
        let node = graph.node.remove(i);
        let mut t = node.attribute[0].t.clone().unwrap();
        let bytes = t.raw_data.take().unwrap();
        let entry = |key: &str, value: String| StringStringEntryProto { key: Some(key.into()), value: Some(value) };
        t.external_data = vec![
            entry("location", "tables.bin".into()),
            entry("offset", data.len().to_string()),
            entry("length", bytes.len().to_string()),
        ];
        t.data_location = Some(DataLocation::External as i32);
        t.name = Some(node.output[0].clone());
        data.extend_from_slice(&bytes);
        graph.initializer.push(t);
    }
    assert_eq!(tables.len(), 2, "cos and sin");
    std::fs::write(dir.join("tables.bin"), &data).unwrap();
    let path = dir.join("model.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&model)).unwrap();
    path
}

/// A static dynamo export keeps its constant tables in external data
/// (torch writes every initializer there): the proof reads the small ones
/// once, where the model is loaded, and the kernel reads the tables where
/// they are. Their halves differing, the rotary is declined as for tables
/// inside the model.
#[test]
fn constant_tables_in_external_data_are_read_for_the_proof() {
    for (broken, fused) in [(Break::Constant, 1), (Break::ConstantHalves, 0)] {
        let dir = tempdir();
        let input = with_tables_apart(&rotary_model(broken), dir.path());
        let out = dir.path().join("fused.onnx");
        let args = [input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--explain", "--verify"];
        let r = run(&args);
        assert!(r.status.success(), "{}", stderr(&r));
        let model = onnx_fuse::io::load(&out, Default::default()).unwrap().model;
        assert_eq!(count_op(&model, "RotaryEmbedding"), fused);
        let said = String::from_utf8_lossy(&r.stdout);
        if fused == 0 {
            assert!(said.contains("the two halves of the cos table are not proved equal\n"), "{said}");
        }
        let tables = model.graph.unwrap().initializer.into_iter().filter(|t| t.dims.len() == 4);
        assert!(tables.into_iter().all(|t| t.is_external()), "the tables stay in external data");
    }
}

/// Which precondition a hand-made rotary of halves written apart breaks.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Apart {
    None,
    /// No break: every product and the sum the other order round.
    Swapped,
    /// No break: the halves are the two parts of a Split of x.
    Split,
    /// No break: heads third, x `[b, s, 4, 8]`, the tables unsqueezed at axis 2.
    HeadsThird,
    /// The first half `x₂·s − x₁·c`: the other way round.
    Turned,
    /// The second half `x₂·s + x₁·c`: the tables crossed.
    Crossed,
    /// x₁ the second half and x₂ the first.
    HalvesSwapped,
    /// x₂ a half of another value.
    OtherX,
    /// The tables' batch is 2 where x's is b.
    Batch,
}

/// GPT-OSS's rotary as Optimum exports it (`_apply_rotary_emb`): x `[b,
/// 4, s, 8]`, its halves x₁ and x₂, the tables of half a head `[1, s, 4]`
/// unsqueezed at the heads axis, `Concat(x₁·c − x₂·s, x₂·c + x₁·s)`.
fn halves_apart_model(broken: Apart) -> ModelProto {
    let mut b = Builder::default();
    let heads_third = broken == Apart::HeadsThird;
    let dims =
        if heads_third { [sym("b"), sym("s"), D::N(4), D::N(8)] } else { [sym("b"), D::N(4), sym("s"), D::N(8)] };
    let x = b.input("x", FLOAT, Some(&dims));
    let other = b.input("other", FLOAT, Some(&dims));
    let batch = if broken == Apart::Batch { D::N(2) } else { D::N(1) };
    let f = b.input("freqs", FLOAT, Some(&[batch, sym("s"), D::N(4)]));
    let heads = b.ints(&[if heads_third { 2 } else { 1 }]);
    let cos = b.node("Cos", &[&f], vec![]);
    let sin = b.node("Sin", &[&f], vec![]);
    let c = b.node("Unsqueeze", &[&cos, &heads], vec![]);
    let s = b.node("Unsqueeze", &[&sin, &heads], vec![]);
    let (zero, half, end, last) = (b.ints(&[0]), b.ints(&[4]), b.ints(&[i64::MAX]), b.ints(&[-1]));
    let (x1, x2) = if broken == Apart::Split {
        let sizes = b.ints(&[4, 4]);
        b.node_to("Split", &[&x, &sizes], &["x_first_half", "x_second_half"], vec![attr_int("axis", -1)]);
        ("x_first_half".to_string(), "x_second_half".to_string())
    } else {
        let second_of = if broken == Apart::OtherX { &other } else { &x };
        (b.node("Slice", &[&x, &zero, &half, &last], vec![]), b.node("Slice", &[second_of, &half, &end, &last], vec![]))
    };
    let (x1, x2) = if broken == Apart::HalvesSwapped { (x2, x1) } else { (x1, x2) };
    let swapped = broken == Apart::Swapped;
    let mul = |b: &mut Builder, p: &str, q: &str| match swapped {
        true => b.node("Mul", &[q, p], vec![]),
        false => b.node("Mul", &[p, q], vec![]),
    };
    let (x1c, x2s, x2c, x1s) = (mul(&mut b, &x1, &c), mul(&mut b, &x2, &s), mul(&mut b, &x2, &c), mul(&mut b, &x1, &s));
    let first = match broken {
        Apart::Turned => b.node("Sub", &[&x2s, &x1c], vec![]),
        _ => b.node("Sub", &[&x1c, &x2s], vec![]),
    };
    let second = match broken {
        Apart::Crossed => {
            let (x2s, x1c) = (mul(&mut b, &x2, &s), mul(&mut b, &x1, &c));
            b.node("Add", &[&x2s, &x1c], vec![])
        }
        Apart::Swapped => b.node("Add", &[&x1s, &x2c], vec![]),
        _ => b.node("Add", &[&x2c, &x1s], vec![]),
    };
    b.node_to("Concat", &[&first, &second], &["y"], vec![attr_int("axis", -1)]);
    b.output("y", FLOAT, None);
    b.model(23)
}

/// GPT-OSS's form: x's halves each times tables of half a head, written
/// apart. RotaryEmbedding computes just these (`cos·x₁ − sin·x₂`,
/// `sin·x₁ + cos·x₂`) and reads the tables' rows as its caches, whole.
#[test]
fn halves_turned_and_written_apart_are_one_rotary_embedding() {
    for form in [Apart::None, Apart::Swapped, Apart::Split, Apart::HeadsThird] {
        let model = halves_apart_model(form);
        let fused = fused_once(&model);
        let nodes = all_nodes(&fused);
        let node = nodes.iter().find(|n| n.op_type() == "RotaryEmbedding").expect("the op");
        assert_eq!(node.domain(), "", "{form:?}: ONNX's own op");
        if form == Apart::HeadsThird {
            assert_eq!(integers(node), [("num_heads", 4)]);
            let back = nodes.iter().find(|n| n.input.contains(&node.output[0])).expect("the view back");
            assert_eq!((back.op_type(), back.output[0].as_str()), ("Reshape", "y"));
        } else {
            assert!(node.attribute.is_empty(), "{form:?}: halves, the whole head");
            assert_eq!((node.input[0].as_str(), node.output[0].as_str()), ("x", "y"), "{form:?}");
        }
        // The caches: the tables' rows themselves (no half cut), repeated
        // over x's batch.
        for (cache, table) in node.input[1..].iter().zip(["cos_", "sin_"]) {
            let expand = nodes.iter().find(|n| &n.output[0] == cache).unwrap();
            assert_eq!(expand.op_type(), "Expand", "{form:?}");
            assert!(expand.input[0].starts_with(table), "{form:?}: {:?}", expand.input);
        }
        let list = fused_list(node);
        assert!(list[0].starts_with("Concat "), "{form:?}: the anchor first: {list:?}");
        for op in ["Mul", "Sub", "Add", if form == Apart::Split { "Split" } else { "Slice" }] {
            assert!(list.iter().any(|e| e.starts_with(op)), "{form:?}: {op} replaced: {list:?}");
        }
        assert_eq!(count_op(&fused, "Unsqueeze"), 0, "{form:?}: the tables' Unsqueezes go too");
        assert_equivalent(&model, &fused, "rotary, halves written apart");
    }
}

/// GPT-OSS's export by Optimum: q's and k's rotaries of both layers.
#[test]
fn gpt_oss_rotaries_written_apart_become_rotary_embeddings_and_compute_the_same() {
    let name = "gpt_oss_optimum_past.onnx";
    let (original, model) = four_rotaries(name);
    for (name, attributes) in rotary_attributes(&model) {
        assert!(attributes.is_empty(), "{name}: halves, the whole head: {attributes:?}");
    }
    assert_equivalent(&original, &model, name);
}

#[test]
fn halves_written_apart_near_misses_do_not_fuse_and_say_why() {
    let turned = "the products are not x₁·c − x₂·s and x₂·c + x₁·s of x's halves";
    for (broken, why) in [
        // x₂·s − x₁·c reads as x₁·c − x₂·s of x₁ the second half (and
        // the tables the other way round).
        (Apart::Turned, "does not cut [0, 4) of the last axis of 8"),
        (Apart::Crossed, turned),
        (Apart::OtherX, turned),
        (Apart::HalvesSwapped, "does not cut [0, 4) of the last axis of 8"),
        // Broadcast to a batch of 2, the result is not x's shape.
        (Apart::Batch, "the rotated halves are not proved to be put back in x's shape"),
    ] {
        let (fused, outcome) = fuse(&halves_apart_model(broken));
        assert_eq!(count_op(&fused, "RotaryEmbedding"), 0, "{broken:?}");
        let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(why)), "{broken:?}, {why}: {said:?}");
    }
}
