//! ONNX `Attention`, the kernel the attention pass writes for ONNX Runtime
//! from opset 23: the facts of ONNX Runtime's kernel the guard rests on,
//! each pinned by running the kernel (docs/attention-kernel.md), and the
//! guard that keeps the output exact where the kernel differs. Also the
//! fact of its `Pow` that constant folding rests on.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::{AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, BOOL, FLOAT, INT64, RUNS_KEY};
use onnx_fuse::{rewrite, upgrade, verify};

/// A power of two: scaling the transposed key by it scales every score
/// exactly as the kernel's `scale` does (`core_of` computes it from q's
/// head size of 8).
const SCALE: f64 = 0.25;

/// `softmax(q·kᵀ·scale + mask)·v` written out, as an export writes it,
/// with q [b, 4, 3, 8], k and v [b, kv, 3, 8] (kv heads repeated in
/// place when 2; one head, when 1, broadcast by the MatMuls over q's four
/// as multi-query attention writes it), mask [b, 1, 3, 3].
fn core(kv: i64) -> ModelProto {
    core_of(kv, || D::N(3))
}

/// `core(kv)` whose queries and keys are `s()` long (kv 4 where not 3:
/// the repeat's target is written for 3).
fn core_of(kv: i64, s: impl Fn() -> D) -> ModelProto {
    let mut b = Builder::default();
    let shape = |h: i64| [sym("b"), D::N(h), s(), D::N(8)];
    let q = b.input("q", FLOAT, Some(&shape(4)));
    let k = b.input("k", FLOAT, Some(&shape(kv)));
    let v = b.input("v", FLOAT, Some(&shape(kv)));
    let mask = b.input("mask", FLOAT, Some(&[sym("b"), D::N(1), s(), s()]));
    // A cache of no rows yet: the kernel's form reads the cache's Concat.
    let past = [sym("b"), D::N(kv), D::N(0), D::N(8)];
    let (pk, pv) = (b.input("past_k", FLOAT, Some(&past)), b.input("past_v", FLOAT, Some(&past)));
    let k = b.node("Concat", &[&pk, &k], vec![attr_int("axis", 2)]);
    let v = b.node("Concat", &[&pv, &v], vec![attr_int("axis", 2)]);
    let (k, v) = if kv == 4 || kv == 1 {
        (k, v)
    } else {
        let repeat = |b: &mut Builder, x: &str| {
            let axes = b.constant(tensor(INT64, &[1], &[2.0]));
            let u = b.node("Unsqueeze", &[x, &axes], vec![]);
            let shape = b.node("Shape", &[x], vec![]);
            let (start, end) = (b.ints(&[0]), b.ints(&[1]));
            let lead = b.node("Slice", &[&shape, &start, &end], vec![]);
            let spread = b.constant(tensor(INT64, &[4], &[2.0, 2.0, 3.0, 8.0]));
            let target = b.node("Concat", &[&lead, &spread], vec![attr_int("axis", 0)]);
            let e = b.node("Expand", &[&u, &target], vec![]);
            let heads = b.constant(tensor(INT64, &[3], &[4.0, 3.0, 8.0]));
            let to = b.node("Concat", &[&lead, &heads], vec![attr_int("axis", 0)]);
            b.node("Reshape", &[&e, &to], vec![])
        };
        (repeat(&mut b, &k), repeat(&mut b, &v))
    };
    // The transposed key scaled by a value computed at run time from q's
    // head size, 1 / (8 / 2), as GPT-2's export scales it: without grouped
    // heads the kernel is written for a cache where it saves that work on
    // the whole cached key.
    let kt = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 1, 3, 2])]);
    let shape = b.node("Shape", &[&q], vec![]);
    let (from, to, two) = (b.ints(&[3]), b.ints(&[4]), b.ints(&[2]));
    let d = b.node("Slice", &[&shape, &from, &to], vec![]);
    let half = b.node("Div", &[&d, &two], vec![]);
    let half = b.node("Cast", &[&half], vec![attr_int("to", FLOAT as i64)]);
    let c = b.node("Reciprocal", &[&half], vec![]);
    let kt = b.node("Mul", &[&kt, &c], vec![]);
    let s = b.node("MatMul", &[&q, &kt], vec![]);
    let s = b.node("Add", &[&s, &mask], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    b.node_to("MatMul", &[&p, &v], &["out"], vec![]);
    b.output("out", FLOAT, None);
    b.model(23)
}

/// The kernel alone, computing what `core` writes out.
fn kernel(kv: i64) -> ModelProto {
    let mut m = core(kv);
    let g = m.graph.as_mut().unwrap();
    g.node.retain(|n| n.op_type() == "Concat" && n.attribute.iter().any(|a| a.name() == "axis" && a.i() == 2));
    let (k, v) = (g.node[0].output[0].clone(), g.node[1].output[0].clone());
    g.node.push(NodeProto {
        op_type: Some("Attention".into()),
        input: vec!["q".into(), k, v, "mask".into()],
        output: vec!["out".into()],
        attribute: vec![attr_float("scale", SCALE)],
        ..Default::default()
    });
    m
}

/// A deterministic stand-in for random values.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = verify::SplitMix(seed);
    (0..n).map(|_| (rng.uniform() * 2.0 - 1.0) as f32).collect()
}

/// Feeds for `core(kv)` with batch `b` whose mask row 1 of batch 0 is all
/// `fill` (the other rows 0).
fn feeds(dir: &std::path::Path, b: u64, kv: u64, fill: f32) -> std::path::PathBuf {
    feeds_row(dir, b, kv, [fill; 3])
}

/// `feeds` with mask row 1 of batch 0 as given.
fn feeds_row(dir: &std::path::Path, b: u64, kv: u64, row: [f32; 3]) -> std::path::PathBuf {
    let path = dir.join(format!("feeds_{b}_{kv}_{row:?}.npz"));
    let n = |h: u64| (b * h * 3 * 8) as usize;
    let mut mask = vec![0f32; (b * 9) as usize];
    if b > 0 {
        mask[3..6].copy_from_slice(&row);
    }
    npz(
        &path,
        &[
            ("q", vec![b, 4, 3, 8], values(n(4), 1)),
            ("k", vec![b, kv, 3, 8], values(n(kv), 2)),
            ("v", vec![b, kv, 3, 8], values(n(kv), 3)),
            ("mask", vec![b, 1, 3, 3], mask),
            ("past_k", vec![b, kv, 0, 8], vec![]),
            ("past_v", vec![b, kv, 0, 8], vec![]),
        ],
        &[],
    );
    path
}

fn fused(model: &ModelProto) -> ModelProto {
    let mut fused = model.clone();
    let outcome = rewrite::run(&mut fused, &[&onnx_fuse::passes::attention::PASS]);
    assert_eq!(outcome.fused.len(), 1, "the core fuses");
    fused
}

/// The guarded nodes of a model: an `If` that runs `Attention`.
fn guards(model: &ModelProto) -> Vec<&NodeProto> {
    model.graph.iter().flat_map(|g| &g.node).filter(|n| n.metadata(RUNS_KEY) == Some("Attention")).collect()
}

/// The model with each guard replaced by what it runs where it holds (the
/// kernel, unguarded).
fn unguarded(model: &ModelProto) -> ModelProto {
    let mut m = model.clone();
    let g = m.graph.as_mut().unwrap();
    let mut nodes = Vec::new();
    for n in std::mem::take(&mut g.node) {
        match n.metadata(RUNS_KEY) {
            Some(_) => {
                let then = n.attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.clone().unwrap();
                nodes.extend(then.node);
            }
            None => nodes.push(n),
        }
    }
    g.node = nodes;
    m
}

#[test]
fn onnx_runtimes_attention_zeroes_a_row_whose_mask_is_all_lowest_or_minus_infinity() {
    let dir = tempdir();
    for kv in [4, 2] {
        let (core, kernel) = (core(kv), kernel(kv));
        for fill in [f32::MIN, f32::NEG_INFINITY] {
            let v = compare(&core, &kernel, &feeds(dir.path(), 2, kv as u64, fill)).unwrap();
            assert!(!v.passed, "kv {kv}, fill {fill}: the kernel is expected to differ on a fully masked row");
        }
        // A NaN among the lowest is no fully masked row: NaN in both.
        let v = compare(&core, &kernel, &feeds_row(dir.path(), 2, kv as u64, [f32::NAN, f32::MIN, f32::MIN])).unwrap();
        assert!(v.passed, "kv {kv}, NaN and lowest:\n{}", v.text());
        // A row with a finite fill above the lowest, or one visible key, is
        // the written-out core's.
        for fill in [-1e9, -1e30, f32::MIN / 2.0] {
            let v = compare(&core, &kernel, &feeds(dir.path(), 2, kv as u64, fill)).unwrap();
            assert!(v.passed, "kv {kv}, fill {fill}:\n{}", v.text());
        }
    }
}

#[test]
fn onnx_runtimes_attention_refuses_an_empty_batch_the_core_computes() {
    let dir = tempdir();
    let inputs = feeds(dir.path(), 0, 4, 0.0);
    let refused = compare(&core(4), &kernel(4), &inputs);
    assert!(refused.is_err(), "the kernel is expected to refuse a batch of 0");
    let v = compare(&core(4), &fused(&core(4)), &inputs).unwrap();
    assert!(v.passed, "{}", v.text());
}

#[test]
fn the_guard_runs_the_original_ops_where_the_kernel_would_differ() {
    let dir = tempdir();
    for kv in [4, 2] {
        let core = core(kv);
        let fused = fused(&core);
        let guard = guards(&fused);
        assert_eq!(guard.len(), 1, "one guarded kernel");
        assert_eq!(guard[0].op_type(), "If");
        let then = guard[0].attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.as_ref().unwrap();
        let attention = then.node.iter().find(|n| n.op_type() == "Attention").expect("the kernel");
        let lifted = guard[0].attribute.iter().find(|a| a.name() == "else_branch").unwrap().g.as_ref().unwrap();
        // Where a row hides every key, the kernel on the mask with such rows
        // lifted, or else the original ops.
        let inner = lifted.node.last().filter(|n| n.op_type() == "If").expect("the lifted rows' guard");
        let relifted = inner.attribute.iter().find(|a| a.name() == "then_branch").unwrap().g.as_ref().unwrap();
        let lifted_kernel = relifted.node.iter().find(|n| n.op_type() == "Attention").expect("the lifted kernel");
        assert!(lifted_kernel.input[3].ends_with("lifted_mask"), "kv {kv}: {:?}", lifted_kernel.input);
        assert_eq!(lifted_kernel.input[..3], attention.input[..3]);
        let otherwise = inner.attribute.iter().find(|a| a.name() == "else_branch").unwrap().g.as_ref().unwrap();
        let is_cache = |n: &&NodeProto| n.op_type() == "Concat" && n.attr_int("axis") == Some(2);
        assert!(!otherwise.node.iter().any(|n| is_cache(&n)), "kv {kv}: the caches' Concats stay outside the guard");
        let main = &fused.graph.as_ref().unwrap().node;
        let concat = |i: usize| main.iter().filter(is_cache).nth(i).unwrap().output[0].clone();
        assert_eq!(
            attention.input[..3],
            ["q".to_string(), concat(0), concat(1)],
            "kv {kv}: the key and value before their repeat"
        );
        assert!((attention.attr_float("scale").unwrap() - SCALE as f32).abs() == 0.0);
        let ops: Vec<&str> = otherwise.node.iter().map(|n| n.op_type()).filter(|o| *o != "Constant").collect();
        // The key transposed and scaled by 1 / (d / 2), then the core.
        let scaled = ["Transpose", "Shape", "Slice", "Div", "Cast", "Reciprocal", "Mul"];
        assert!(ops.ends_with(&[&scaled[..], &["MatMul", "Add", "Softmax", "MatMul"]].concat()), "kv {kv}: {ops:?}");
        for fill in [f32::MIN, f32::NEG_INFINITY, -1e9, 0.0] {
            let v = compare(&core, &fused, &feeds(dir.path(), 2, kv as u64, fill)).unwrap();
            assert!(v.passed, "kv {kv}, fill {fill}:\n{}", v.text());
        }
    }
}

/// One key and value head broadcast by the MatMuls over the query heads
/// (Falcon's multi-query attention) is grouped heads of one KV head: ONNX
/// Runtime's kernel reads it so (pinned against the written-out core, on
/// masks of the lowest, -inf, -1e9 and 0 but where the kernel zeroes a row
/// hidden whole). The kernel is exact there but slower than the MatMuls,
/// which broadcast the head without copying it (runtimes.rs): the core
/// stays AttentionCore and its note says why.
#[test]
fn one_key_head_broadcast_over_the_query_heads_is_grouped_heads_the_kernel_is_slower_on() {
    let dir = tempdir();
    for fill in [-1e9, 0.0] {
        let v = compare(&core(1), &kernel(1), &feeds(dir.path(), 2, 1, fill)).unwrap();
        assert!(v.passed, "fill {fill}:\n{}", v.text());
    }
    let mut fused = core(1);
    let outcome = rewrite::run(&mut fused, &[&onnx_fuse::passes::attention::PASS]);
    assert_eq!(outcome.fused.len(), 1);
    assert!(guards(&fused).is_empty() && kernels(&fused).is_empty(), "no kernel written");
    let note = outcome.fused[0].note.as_deref().unwrap_or_default();
    assert!(note.contains("one key and value head that the products broadcast over q's 4 heads"), "{note}");
    let v = compare(&core(1), &fused, &feeds(dir.path(), 2, 1, f32::MIN)).unwrap();
    assert!(v.passed, "{}", v.text());
}

/// `core(kv)` with every size a known number (batch 1) and a constant
/// mask of one row, `[1, 1, 1, 3]`, that hides no key: nothing for a
/// guard to test.
fn core_unguarded(kv: i64) -> ModelProto {
    let mut b = Builder::default();
    let shape = |h: i64| [D::N(1), D::N(h), D::N(3), D::N(8)];
    let mut m = core(kv);
    let g = m.graph.as_mut().unwrap();
    for input in g.input.iter_mut() {
        let dims = match input.name() {
            "q" => shape(4).to_vec(),
            "k" | "v" => shape(kv).to_vec(),
            _ => vec![D::N(1), D::N(kv), D::N(0), D::N(8)],
        };
        *input = value_info(input.name(), FLOAT, Some(&dims));
    }
    g.input.retain(|i| i.name() != "mask");
    b.init("mask", tensor(FLOAT, &[1, 1, 1, 3], &[0.0, -1.0, 0.5]));
    g.initializer.extend(b.graph.initializer);
    m
}

/// Where nothing needs a guard, the kernel runs unguarded, with the nodes
/// its branch would hold (the one mask row expanded over the queries)
/// before it.
#[test]
fn a_kernel_with_nothing_to_guard_runs_unguarded_with_its_mask_expanded() {
    let dir = tempdir();
    for kv in [4, 2] {
        let core = core_unguarded(kv);
        let fused = fused(&core);
        assert!(guards(&fused).is_empty(), "kv {kv}: no guard");
        let main = &fused.graph.as_ref().unwrap().node;
        let attention = main.iter().find(|n| n.op_type() == "Attention").expect("the kernel, unguarded");
        let expand = main.iter().find(|n| n.op_type() == "Expand" && n.output[0] == attention.input[3]);
        assert!(expand.is_some(), "kv {kv}: the mask row expanded before the kernel");
        let n = |h: u64| (h * 3 * 8) as usize;
        let inputs = dir.path().join(format!("unguarded_{kv}.npz"));
        let (h, kvs) = (vec![1, 4, 3, 8], vec![1, kv as u64, 3, 8]);
        let past = vec![1, kv as u64, 0, 8];
        npz(
            &inputs,
            &[
                ("q", h, values(n(4), 1)),
                ("k", kvs.clone(), values(n(kv as u64), 2)),
                ("v", kvs, values(n(kv as u64), 3)),
                ("past_k", past.clone(), vec![]),
                ("past_v", past, vec![]),
            ],
            &[],
        );
        let v = compare(&core, &fused, &inputs).unwrap();
        assert!(v.passed, "kv {kv}:\n{}", v.text());
    }
}

/// The model with every body of original ops computing its output plus 1:
/// where it still computes the original, no original ops ran.
fn fallback_shifted(model: &ModelProto) -> ModelProto {
    shifted(model, "the original ops of")
}

/// The model with the result of each body whose name holds `name` shifted
/// by 1.
fn shifted(model: &ModelProto, name: &str) -> ModelProto {
    fn shift(g: &mut GraphProto, name: &str) {
        if g.name().contains(name) {
            let out = g.output[0].name().to_string();
            let unshifted = format!("{out}/unshifted");
            for o in g.node.iter_mut().flat_map(|n| n.output.iter_mut()).filter(|o| **o == out) {
                *o = unshifted.clone();
            }
            let one = format!("{out}/one");
            let value = AttributeProto::tensor("value", tensor(FLOAT, &[], &[1.0]));
            g.node.push(NodeProto {
                op_type: Some("Constant".into()),
                output: vec![one.clone()],
                attribute: vec![value],
                ..Default::default()
            });
            g.node.push(NodeProto {
                op_type: Some("Add".into()),
                input: vec![unshifted, one],
                output: vec![out],
                ..Default::default()
            });
        }
        for sub in g.node.iter_mut().flat_map(|n| n.attribute.iter_mut()).filter_map(|a| a.g.as_mut()) {
            shift(sub, name);
        }
    }
    let mut m = model.clone();
    shift(m.graph.as_mut().unwrap(), name);
    m
}

/// How many bodies in `model` have a name that holds `name`.
fn subgraphs_named(model: &ModelProto, name: &str) -> usize {
    fn count(g: &GraphProto, name: &str) -> usize {
        let subs = g.node.iter().flat_map(|n| n.subgraphs());
        usize::from(g.name().contains(name)) + subs.map(|b| count(b, name)).sum::<usize>()
    }
    count(model.graph.as_ref().unwrap(), name)
}

/// `kernel(kv)` reading its mask with every value of the type's lowest
/// made the next float above it.
fn kernel_lifted(kv: i64) -> ModelProto {
    let mut m = kernel(kv);
    let g = m.graph.as_mut().unwrap();
    let mut b = Builder::default();
    let lowest = b.constant(tensor(FLOAT, &[], &[f64::from(f32::MIN)]));
    let above = b.constant(tensor(FLOAT, &[], &[f64::from(f32::from_bits(f32::MIN.to_bits() - 1))]));
    let at = b.node("Equal", &["mask", &lowest], vec![]);
    let lifted = b.node("Where", &[&at, &above, "mask"], vec![]);
    let attention = g.node.len() - 1;
    g.node[attention].input[3] = lifted;
    g.node.splice(attention..attention, b.graph.node);
    m
}

/// The fact the lifted rows rest on, run: a row of the next float above
/// the lowest is, to ONNX Runtime's kernel, a row like any other (no
/// zeros): the softmax of equal values, as the core's row of the lowest
/// is (-inf keys weightless in both), and the same product with v, bit
/// for bit, with scores up to 1e28.
#[test]
fn onnx_runtimes_attention_computes_a_row_of_the_next_float_above_the_lowest_as_the_core_its_row_of_the_lowest() {
    let dir = tempdir();
    for kv in [4, 2] {
        let (core, lifted) = (core(kv), kernel_lifted(kv));
        assert!(same_bits(&core, &lifted, &feeds(dir.path(), 2, kv as u64, f32::MIN)), "kv {kv}");
        let mixed = feeds_row(dir.path(), 2, kv as u64, [f32::MIN, f32::NEG_INFINITY, f32::MIN]);
        assert!(same_bits(&core, &lifted, &mixed), "kv {kv}: the lowest and -inf");
        assert!(!same_bits(&core, &kernel(kv), &feeds(dir.path(), 2, kv as u64, f32::MIN)), "kv {kv}: zeros unlifted");
    }
    for qk in [1e-3, 1.0, 1e6, 1e14] {
        let mut mask = vec![0f32; 18];
        mask[3..6].copy_from_slice(&[f32::MIN; 3]);
        let inputs = scaled_feeds(dir.path().join(format!("lifted_{qk}.npz")), qk, vec![("mask", mask)]);
        assert!(same_bits(&core(4), &kernel_lifted(4), &inputs), "q and k times {qk}");
    }
}

/// Where a row of the additive mask hides every key (a padded query), the
/// guard's second branch lifts the lowest values of such rows and runs
/// the kernel on them: a row of the lowest, or of the lowest and -inf (the
/// core weighs the keys of the lowest alone, and so does the kernel
/// lifted); a row of -inf (the core's NaN) and scores beyond the bound
/// (2^100) run the original ops. Each computes the core bit for bit.
#[test]
fn rows_hidden_whole_run_the_kernel_lifted_and_the_original_ops_only_where_the_lift_is_not_proved() {
    let dir = tempdir();
    for kv in [4, 2] {
        let core = core(kv);
        let fused = fused(&core);
        let lifted = feeds(dir.path(), 2, kv as u64, f32::MIN);
        assert!(same_bits(&core, &fused, &lifted), "kv {kv}: a row of the lowest");
        assert!(runs_the_kernel(&fused, &lifted), "kv {kv}: a row of the lowest runs the kernel");
        let rows = [([f32::NEG_INFINITY; 3], false), ([f32::MIN, f32::NEG_INFINITY, f32::MIN], true)];
        for (row, lifted) in rows {
            let inputs = feeds_row(dir.path(), 2, kv as u64, row);
            assert!(same_bits(&core, &fused, &inputs), "kv {kv}, {row:?}");
            assert_eq!(runs_the_kernel(&fused, &inputs), lifted, "kv {kv}, {row:?}: lifted");
        }
    }
    let mut mask = vec![0f32; 18];
    mask[3..6].copy_from_slice(&[f32::MIN; 3]);
    let fused = fused(&core(4));
    for (qk, runs_kernel) in [(1e14, true), (1e16, false)] {
        let inputs = scaled_feeds(dir.path().join(format!("bound_{qk}.npz")), qk, vec![("mask", mask.clone())]);
        assert!(same_bits(&core(4), &fused, &inputs), "q and k times {qk}");
        assert_eq!(runs_the_kernel(&fused, &inputs), runs_kernel, "q and k times {qk}: the bound 2^100 decides");
    }
}

/// The kernel over q, k, v `[1, 4, s, 8]` (`[1, s, 32]` with `merged`)
/// and mask `[1, 1, s, s]`: whole, or run on each of `pieces` pieces of
/// the queries and concatenated, as `over_query_pieces` writes it.
fn kernel_over(merged: bool, pieces: usize) -> ModelProto {
    let mut b = Builder::default();
    let shape = if merged { vec![D::N(1), sym("s"), D::N(32)] } else { vec![D::N(1), D::N(4), sym("s"), D::N(8)] };
    let (q, k, v) =
        (b.input("q", FLOAT, Some(&shape)), b.input("k", FLOAT, Some(&shape)), b.input("v", FLOAT, Some(&shape)));
    let mask = b.input("mask", FLOAT, Some(&[D::N(1), D::N(1), sym("s"), sym("s")]));
    let mut attributes = vec![attr_float("scale", SCALE)];
    if merged {
        attributes.extend([attr_int("q_num_heads", 4), attr_int("kv_num_heads", 4)]);
    }
    let split = |b: &mut Builder, x: &str| {
        let parts: Vec<String> = (0..pieces).map(|i| format!("{x}_piece_{i}")).collect();
        let attributes = vec![attr_int("axis", -2), attr_int("num_outputs", pieces as i64)];
        b.node_to("Split", &[x], &parts.iter().map(String::as_str).collect::<Vec<_>>(), attributes);
        parts
    };
    let ys: Vec<String> = if pieces > 1 {
        let (qs, masks) = (split(&mut b, &q), split(&mut b, &mask));
        (0..pieces).map(|i| b.node("Attention", &[&qs[i], &k, &v, &masks[i]], attributes.clone())).collect()
    } else {
        vec![b.node("Attention", &[&q, &k, &v, &mask], attributes)]
    };
    let ys: Vec<&str> = ys.iter().map(String::as_str).collect();
    b.node_to("Concat", &ys, &["out"], vec![attr_int("axis", -2)]);
    b.output("out", FLOAT, None);
    b.model(23)
}

/// Feeds of `s` queries and keys for `kernel_over` and `core_of(4, ..)`
/// (q, k, v [1, 4, s, 8], or [1, s, 32] with `merged`): a causal mask of
/// the lowest, its row `hidden` all the lowest where given.
fn long_feeds(dir: &std::path::Path, s: u64, merged: bool, hidden: Option<u64>) -> std::path::PathBuf {
    let path = dir.join(format!("long_{s}_{merged}_{hidden:?}.npz"));
    npz(&path, &long_arrays(s, merged, hidden, f32::MIN), &[]);
    path
}

/// The arrays of `long_feeds`, the causal mask's hidden keys `fill`.
fn long_arrays(s: u64, merged: bool, hidden: Option<u64>, fill: f32) -> Vec<(&'static str, Vec<u64>, Vec<f32>)> {
    let mut mask = vec![0f32; (s * s) as usize];
    for (i, row) in mask.chunks_mut(s as usize).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            if j > i || Some(i as u64) == hidden {
                *x = fill;
            }
        }
    }
    let shape = if merged { vec![1, s, 32] } else { vec![1, 4, s, 8] };
    let n = (s * 32) as usize;
    let (q, k, v) = (values(n, 1).iter().map(|x| x * 4.0).collect(), values(n, 2), values(n, 3));
    let mut f32s =
        vec![("q", shape.clone(), q), ("k", shape.clone(), k), ("v", shape, v), ("mask", vec![1, 1, s, s], mask)];
    if !merged {
        f32s.extend([("past_k", vec![1, 4, 0, 8], vec![]), ("past_v", vec![1, 4, 0, 8], vec![])]);
    }
    f32s
}

/// The fact the pieces rest on, run: ONNX Runtime's kernel computes each
/// query row alone, so run on pieces of the queries (and of the mask's
/// rows) and concatenated it computes the whole call, bit for bit, where
/// each piece has two rows or more (a call of one query row takes another
/// product, which rounds otherwise: 2 and 3 queries in halves differ by
/// an ulp): 4-D and 3-D (merged heads), in halves and in the pass's 8
/// pieces, even and odd lengths.
#[test]
fn onnx_runtimes_attention_over_pieces_of_the_queries_computes_the_whole_call() {
    let dir = tempdir();
    for merged in [false, true] {
        let whole = kernel_over(merged, 1);
        for (pieces, lengths) in [(2, vec![4, 5, 1031]), (8, vec![16, 64, 1024, 1031, 1100])] {
            let split = kernel_over(merged, pieces);
            for s in lengths {
                let inputs = long_feeds(dir.path(), s, merged, Some(s / 3));
                assert!(same_bits(&whole, &split, &inputs), "merged {merged}, {s} queries in {pieces} pieces");
            }
        }
    }
}

/// ONNX `Attention` of q [1, 4, s, 8] (or [1, s, 32] with `merged`) over
/// keys, values and mask rows [.., t] (with `kept`, the f32 mask cast to
/// a boolean one, the keys kept); with `cut`, over their first `n` keys
/// only (`n` an input, read by both).
fn kernel_over_keys(merged: bool, cut: bool, kept: bool) -> ModelProto {
    let mut b = Builder::default();
    let shape =
        |len: &str| if merged { vec![D::N(1), sym(len), D::N(32)] } else { vec![D::N(1), D::N(4), sym(len), D::N(8)] };
    let q = b.input("q", FLOAT, Some(&shape("s")));
    let (mut k, mut v) = (b.input("k", FLOAT, Some(&shape("t"))), b.input("v", FLOAT, Some(&shape("t"))));
    let mut mask = b.input("mask", FLOAT, Some(&[D::N(1), D::N(1), sym("s"), sym("t")]));
    if kept {
        mask = b.node("Cast", &[&mask], vec![attr_int("to", i64::from(BOOL))]);
    }
    let n = b.input("n", INT64, Some(&[D::N(1)]));
    if cut {
        let (zero, keys, last) = (b.ints(&[0]), b.ints(&[-2]), b.ints(&[-1]));
        k = b.node("Slice", &[&k, &zero, &n, &keys], vec![]);
        v = b.node("Slice", &[&v, &zero, &n, &keys], vec![]);
        mask = b.node("Slice", &[&mask, &zero, &n, &last], vec![]);
    }
    let mut attributes = vec![attr_float("scale", SCALE)];
    if merged {
        attributes.extend([attr_int("q_num_heads", 4), attr_int("kv_num_heads", 4)]);
    }
    b.node_to("Attention", &[&q, &k, &v, &mask], &["out"], attributes);
    b.output("out", FLOAT, None);
    // n read by both, so that both models take the same inputs.
    let zero = b.ints(&[0]);
    let none = b.node("Mul", &[&n, &zero], vec![]);
    b.node_to("Identity", &[&none], &["n_read"], vec![]);
    b.output("n_read", INT64, None);
    b.model(23)
}

/// The fact a long call's pieces that read only the keys they see rest
/// on, run: where a row's mask hides every key from some n on (a causal
/// prompt's rows past their position) by -inf, by the float's lowest, or
/// as a boolean mask's false, ONNX Runtime's kernel over the first n keys
/// computes it bit for bit as over all of them: the pieces of the pass's 8
/// of an even and an odd length, after no cache and a cache of 5 keys, for
/// n from the piece's causal bound to all keys, a row hidden whole
/// included (the kernel's zeros both ways), and a row whose kept keys are
/// the next float above the hidden ones' value (the lowest's: the ulp
/// there, 2^104, is what gives a hidden key no weight); 4-D and 3-D.
#[test]
fn onnx_runtimes_attention_over_the_keys_a_mask_leaves_computes_the_whole_call() {
    let dir = tempdir();
    let next_above = |x: f32| if x == f32::NEG_INFINITY { f32::MIN } else { f32::from_bits(x.to_bits() - 1) };
    // (hidden, kept, the kept value of the row kept just above hidden ones)
    let masks = [
        ("-inf", f32::NEG_INFINITY, 0.0, next_above(f32::NEG_INFINITY)),
        ("lowest", f32::MIN, 0.0, next_above(f32::MIN)),
        ("boolean", 0.0, 1.0, 1.0),
    ];
    for (what, hidden, kept, close) in masks {
        for merged in [false, true] {
            let boolean = what == "boolean";
            let (whole, cut) = (kernel_over_keys(merged, false, boolean), kernel_over_keys(merged, true, boolean));
            for (s, past) in [(1031u64, 0u64), (1024, 5)] {
                let t = s + past;
                let rows = s.div_ceil(8);
                for piece in 0..8 {
                    let (r0, r1) = (piece * rows, ((piece + 1) * rows).min(s));
                    let m = r1 - r0;
                    let mut mask = vec![kept; (m * t) as usize];
                    for (i, row) in mask.chunks_mut(t as usize).enumerate() {
                        let at = past + r0 + i as u64;
                        for (j, x) in row.iter_mut().enumerate() {
                            // Row 0 of the second piece is hidden whole; row
                            // 2 of each keeps keys just above the hidden.
                            if j as u64 > at || (piece == 1 && i == 0) {
                                *x = hidden;
                            } else if i == 2 {
                                *x = close;
                            }
                        }
                    }
                    let qs = if merged { vec![1, m, 32] } else { vec![1, 4, m, 8] };
                    let ks = if merged { vec![1, t, 32] } else { vec![1, 4, t, 8] };
                    let need = past + r1;
                    for n in [need, need + 13, t].into_iter().filter(|&n| n <= t) {
                        let path = dir.path().join(format!("keys_{what}_{merged}_{s}_{piece}_{n}.npz"));
                        let (q, k, v) =
                            (values((m * 32) as usize, 1), values((t * 32) as usize, 2), values((t * 32) as usize, 3));
                        let q = q.iter().map(|x| x * 4.0).collect();
                        npz(
                            &path,
                            &[
                                ("q", qs.clone(), q),
                                ("k", ks.clone(), k),
                                ("v", ks.clone(), v),
                                ("mask", vec![1, 1, m, t], mask.clone()),
                            ],
                            &[("n", vec![1], vec![n as i64])],
                        );
                        assert!(
                            same_bits(&whole, &cut, &path),
                            "{what} mask, merged {merged}, {s} after {past}, piece {piece}, {n} keys"
                        );
                    }
                }
            }
        }
    }
}

/// A long call whose mask hides the keys past each row (by -inf, by the
/// float's lowest, or a Where's boolean kept keys) runs its pieces over the
/// keys they see, each computing the core bit for bit; a NaN or an
/// infinity in a key or value a piece would drop, or a NaN in the mask
/// there, makes it read every key (the core's NaN, not the kernel's finite
/// piece).
#[test]
fn long_causal_calls_read_only_the_keys_each_piece_sees() {
    let dir = tempdir();
    let forms = [
        ("-inf", core_of(4, || sym("s")), f32::NEG_INFINITY),
        ("lowest", core_of(4, || sym("s")), f32::MIN),
        ("Where", where_core_of(|| sym("s"), -1e9, false), f32::MIN),
    ];
    for (form, core, fill) in forms {
        let guarded = fused(&core);
        let pieces = all_nodes(&guarded).into_iter().filter(|n| n.op_type() == "Attention").count();
        let slices = all_nodes(&guarded)
            .into_iter()
            .filter(|n| n.op_type() == "Slice" && n.output[0].contains("/seen_key_"))
            .count();
        assert_eq!(
            (pieces, slices),
            (1 + 8 + 1, 8),
            "{form}: the whole kernel, the lifted kernel's pieces (which a long call runs where the guard holds \
             too) and the lifted kernel"
        );
        let dropping = dropping_one_more(&guarded);
        for s in [1024, 1031] {
            let mut base = long_arrays(s, false, None, fill);
            if form == "Where" {
                kept_keys(&mut base[3].2);
            }
            let last_key = |x: &mut Vec<f32>| x[((s - 1) * 8 + 3) as usize] = f32::NAN;
            let unhidden = if form == "Where" { 1.0 } else { f32::NAN };
            let edits: [(&str, &dyn Fn(&mut Vec<(&str, Vec<u64>, Vec<f32>)>), bool); 5] = [
                ("as it is", &|_| {}, true),
                ("a NaN in the last value", &|a| last_key(&mut a[2].2), false),
                ("a NaN in the last key", &|a| last_key(&mut a[1].2), false),
                ("an infinity in the last value", &|a| a[2].2[((s - 1) * 8) as usize] = f32::INFINITY, false),
                ("a NaN (Where: a kept key) above the first row", &|a| a[3].2[(s - 1) as usize] = unhidden, true),
            ];
            for (what, edit, drops) in edits {
                let mut arrays = base.clone();
                edit(&mut arrays);
                let path = dir.path().join(format!("causal_{form}_{s}_{}.npz", what.replace(' ', "_")));
                npz(&path, &arrays, &[]);
                assert!(same_bits(&core, &guarded, &path), "{form}, {s} queries, {what}: the core's bits");
                // Dropping the last key a piece's last row sees changes it
                // where the pieces drop keys.
                assert_eq!(!same_bits(&core, &dropping, &path), drops, "{form}, {s} queries, {what}: keys dropped");
            }
        }
    }
}

/// An additive mask of `long_arrays` as a Where's kept keys: 1 where it
/// is 0, 0 where it hides a key.
fn kept_keys(mask: &mut [f32]) {
    mask.iter_mut().for_each(|x| *x = if *x == 0.0 { 1.0 } else { 0.0 });
}

/// The model with each piece of a long call that drops keys dropping one
/// more: the last its last row sees. Where it computes otherwise than
/// the model, some piece dropped keys.
fn dropping_one_more(model: &ModelProto) -> ModelProto {
    fn drop(g: &mut GraphProto) {
        let mut nodes = Vec::new();
        for mut n in std::mem::take(&mut g.node) {
            for sub in n.attribute.iter_mut().filter_map(|a| a.g.as_mut()) {
                drop(sub);
            }
            if n.output[0].contains("/seen_keys_read_") {
                let (one, fewer) = (format!("{}/one", n.output[0]), format!("{}/one_fewer", n.output[0]));
                let value = AttributeProto::tensor("value", tensor(INT64, &[1], &[1.0]));
                let constant = Some("Constant".into());
                nodes.push(NodeProto {
                    op_type: constant,
                    output: vec![one.clone()],
                    attribute: vec![value],
                    ..Default::default()
                });
                let sub = Some("Sub".into());
                nodes.push(NodeProto {
                    op_type: sub,
                    input: vec![n.input[1].clone(), one],
                    output: vec![fewer.clone()],
                    ..Default::default()
                });
                n.input[1] = fewer;
            }
            nodes.push(n);
        }
        g.node = nodes;
    }
    let mut m = model.clone();
    drop(m.graph.as_mut().unwrap());
    m
}

/// The kernel branch that runs the pieces, its result shifted by 1: where
/// the fused model computes otherwise than with it, the pieces ran.
fn pieces_shifted(model: &ModelProto) -> ModelProto {
    shifted(model, "over pieces of the queries")
}

/// A long call (1,024 queries or more, known only at run time) runs the
/// kernel on pieces of its queries, a shorter one the whole kernel in one
/// `If` (a decode step's); a call with a row hidden whole runs the kernel
/// lifted, over pieces where it is long. Each computes the core bit for
/// bit.
#[test]
fn long_calls_run_the_kernel_over_pieces_of_their_queries() {
    let dir = tempdir();
    let forms: [(&str, ModelProto, &dyn Fn(&mut Vec<f32>)); 2] = [
        ("additive", core_of(4, || sym("s")), &|_| {}),
        ("Where", where_core_of(|| sym("s"), -1e9, false), &|m| kept_keys(m)),
    ];
    for (form, core, mask) in forms {
        let guarded = fused(&core);
        let calls =
            [(1023, None, false), (1024, None, true), (1031, Some(0), true), (100, Some(0), false), (1, None, false)];
        for (s, hidden, long) in calls {
            let mut arrays = long_arrays(s, false, hidden, f32::MIN);
            mask(&mut arrays[3].2);
            let inputs = dir.path().join(format!("long_{form}_{s}_{hidden:?}.npz"));
            npz(&inputs, &arrays, &[]);
            let what = format!("{form}, {s} queries, row {hidden:?} hidden");
            assert!(same_bits(&core, &guarded, &inputs), "{what}");
            assert!(runs_the_kernel(&guarded, &inputs), "{what}: the kernel runs");
            assert_eq!(!same_bits(&guarded, &pieces_shifted(&guarded), &inputs), long, "{what}: over pieces");
        }
    }
    let guarded = fused(&core_of(4, || sym("s")));
    // A decode step's call is one If, its kernel the whole.
    assert_eq!(kernels(&guarded).len(), 1);
    // Queries of a known length need no second If: short, the kernel is
    // whole; long, it is the pieces (the kernel's and the lifted kernel's).
    for (s, pieces) in [(1023, 0), (1024, 2)] {
        let known = fused(&core_of(4, || D::N(s)));
        let within = |name: &str| subgraphs_named(&known, name);
        assert_eq!(within("over pieces of the queries"), pieces, "{s} queries");
        assert_eq!(within("long queries"), 0, "{s} queries");
    }
}

#[test]
fn a_second_run_leaves_the_guards_original_ops_as_they_are() {
    let once = fused(&core(2));
    let mut twice = once.clone();
    let outcome = rewrite::run(&mut twice, &[&onnx_fuse::passes::attention::PASS]);
    assert!(outcome.fused.is_empty());
    assert_eq!(once, twice);
}

/// `name`'s export and the same upgraded to opset 23 and fused by
/// `passes`.
fn fused_at_23(name: &str, passes: &str) -> (ModelProto, ModelProto) {
    let original = load(name);
    let fused = upgraded_and_fused(&original, passes);
    (original, fused)
}

/// `original` upgraded to opset 23 and fused by `passes`.
fn upgraded_and_fused(original: &ModelProto, passes: &str) -> ModelProto {
    let (mut fused, upgrade) = upgrade::upgrade(original, 23).unwrap();
    let pipeline = onnx_fuse::passes::pipeline(&[passes.into()], &[]).unwrap();
    rewrite::run_upgraded(&mut fused, &pipeline, Default::default(), upgrade.added);
    fused
}

/// Token feeds of two rows of 7 (`input_ids`, `attention_mask`).
fn token_feeds(dir: &std::path::Path, mask: [i64; 14]) -> std::path::PathBuf {
    let inputs = dir.join(format!("tokens_{mask:?}.npz"));
    let ids: Vec<i64> = (0..14).map(|i| (i * 7 + 3) % 64).collect();
    npz(&inputs, &[], &[("input_ids", vec![2, 7], ids), ("attention_mask", vec![2, 7], mask.to_vec())]);
    inputs
}

/// The nodes of the `If`s' kernel branches that are `Attention`.
fn kernels(model: &ModelProto) -> Vec<NodeProto> {
    guards(model)
        .iter()
        .flat_map(|g| g.attribute.iter().filter(|a| a.name() == "then_branch"))
        .flat_map(|a| a.g.as_ref().unwrap().node.iter().filter(|n| n.op_type() == "Attention").cloned())
        .collect()
}

/// On `inputs` the fused model computes the original, and the feed reaches
/// rows where the kernel computes otherwise: unguarded, it differs (`why`
/// it is expected to; the kernel gives zeros there).
fn the_guard_decides(original: &ModelProto, fused: &ModelProto, inputs: &std::path::Path, why: &str) {
    let v = compare(original, fused, inputs).unwrap();
    assert!(v.passed, "{}", v.text());
    let v = compare(original, &unguarded(fused), inputs).unwrap();
    assert!(!v.passed, "{why}: the kernel gives zeros there");
}

/// Whether `fused` runs the kernel on every call of `inputs`: it computes
/// what it computes with its original ops shifted by 1, bit for bit.
fn runs_the_kernel(fused: &ModelProto, inputs: &std::path::Path) -> bool {
    same_bits(fused, &fallback_shifted(fused), inputs)
}

/// A left-padded batch: the first row's first three tokens are padding,
/// so their query rows see no key at all in an eager export's mask.
#[test]
fn left_padded_batches_compute_what_the_export_computes() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let (original, fused) = fused_at_23("llama_ts_op14.onnx", "default");
    assert_eq!(kernels(&fused).len(), 2);
    the_guard_decides(
        &original,
        &fused,
        &inputs,
        "the left-padded rows are expected to be fully masked in this export",
    );
    // Those rows are the lowest throughout: the kernel runs them lifted.
    assert!(runs_the_kernel(&fused, &inputs), "the padded batch runs the kernel");
}

/// `softmax(Where(keep, q·kᵀ·scale, fill))·v` (or masked_fill's
/// `Where(hide, fill, s)` with `hides`), q [b, 4, 3, 8], a cache's key and
/// value [b, 4, 3, 8]; the condition is the f32 input `mask` of 0 and 1
/// cast to bool ([b, 1, 3, 3]).
fn where_core(fill: f64, hides: bool) -> ModelProto {
    where_core_of(|| D::N(3), fill, hides)
}

/// `where_core` whose queries and keys are `s()` long.
fn where_core_of(s: impl Fn() -> D, fill: f64, hides: bool) -> ModelProto {
    let mut m = core_of(4, s);
    let g = m.graph.as_mut().unwrap();
    let add = g.node.iter().position(|n| n.op_type() == "Add").unwrap();
    let scores = g.node[add].input[0].clone();
    let out = g.node[add].output[0].clone();
    let mut b = Builder::default();
    let condition = b.node("Cast", &["mask"], vec![attr_int("to", 9)]);
    let fill = b.constant(tensor(FLOAT, &[], &[fill]));
    let inputs = if hides { [condition.as_str(), &fill, &scores] } else { [condition.as_str(), &scores, &fill] };
    b.node_to("Where", &inputs, &[&out], vec![]);
    g.node.splice(add..=add, b.graph.node);
    m
}

/// The kernel alone with the Where's kept keys as its boolean mask.
fn where_kernel(hides: bool) -> ModelProto {
    let mut m = kernel(4);
    let g = m.graph.as_mut().unwrap();
    let mut b = Builder::default();
    let keep = b.node("Cast", &["mask"], vec![attr_int("to", 9)]);
    let keep = if hides { b.node("Not", &[&keep], vec![]) } else { keep };
    let attention = g.node.len() - 1;
    g.node[attention].input[3] = keep;
    g.node.splice(attention..attention, b.graph.node);
    m
}

/// Feeds for `where_core`: q and k times `qk`, mask row 1 of batch 0 as
/// `row` (1 keeps a key), every other row keeping all keys but its last.
fn where_feeds(dir: &std::path::Path, qk: f32, row: [f32; 3], hides: bool) -> std::path::PathBuf {
    scaled_feeds(dir.join(format!("where_{qk}_{row:?}_{hides}.npz")), qk, vec![("mask", where_mask(row, hides))])
}

/// The mask of `where_feeds`.
fn where_mask(row: [f32; 3], hides: bool) -> Vec<f32> {
    let (keep, hide) = if hides { (0.0, 1.0) } else { (1.0, 0.0) };
    let mut mask: Vec<f32> = (0..18).map(|i| if i % 3 == 2 { hide } else { keep }).collect();
    mask[3..6].copy_from_slice(&row.map(|x| if hides { 1.0 - x } else { x }));
    mask
}

/// Feeds of batch 2 and 4 heads (no past) with q and k times `qk`, and
/// `masks` of `[2, 1, 3, 3]`.
fn scaled_feeds(path: std::path::PathBuf, qk: f32, masks: Vec<(&str, Vec<f32>)>) -> std::path::PathBuf {
    npz(&path, &scaled_arrays(qk, masks), &[]);
    path
}

/// The arrays of `scaled_feeds`.
fn scaled_arrays(qk: f32, masks: Vec<(&str, Vec<f32>)>) -> Vec<(&str, Vec<u64>, Vec<f32>)> {
    let n = 2 * 4 * 3 * 8;
    let scaled = |seed: u64, by: f32| values(n, seed).into_iter().map(|x| x * by).collect::<Vec<f32>>();
    let mut arrays = vec![
        ("q", vec![2, 4, 3, 8], scaled(1, qk)),
        ("k", vec![2, 4, 3, 8], scaled(2, qk)),
        ("v", vec![2, 4, 3, 8], scaled(3, 1.0)),
        ("past_k", vec![2, 4, 0, 8], vec![]),
        ("past_v", vec![2, 4, 0, 8], vec![]),
    ];
    arrays.extend(masks.into_iter().map(|(name, data)| (name, vec![2, 1, 3, 3], data)));
    arrays
}

/// The facts of ONNX Runtime's `Attention` with a boolean mask that the
/// Where form's guard rests on: where every kept score is more than 128
/// above the fill, the kernel computes the Where core (a hidden key gets
/// no weight in either); with scores beyond
/// the fill, or a row that keeps no key (the kernel gives zeros), it does
/// not. The guarded output is the core's on every one of these, and
/// computes a row that keeps no key by the kernel, lifted.
#[test]
fn onnx_runtimes_attention_with_the_kept_keys_is_a_where_core_while_scores_stay_above_the_fill() {
    let dir = tempdir();
    let some = [1.0, 1.0, 0.0];
    for hides in [false, true] {
        for fill in [f64::from(f32::MIN), -1e9, -1e4] {
            let (core, kernel) = (where_core(fill, hides), where_kernel(hides));
            let fused = fused(&core);
            assert_eq!(guards(&fused).len(), 1, "fill {fill}: a guarded kernel");
            let v = compare(&core, &kernel, &where_feeds(dir.path(), 1.0, some, hides)).unwrap();
            assert!(v.passed, "fill {fill}, hides {hides}:\n{}", v.text());
            let none = compare(&core, &kernel, &where_feeds(dir.path(), 1.0, [0.0; 3], hides)).unwrap();
            assert!(!none.passed, "fill {fill}: a row that keeps no key is expected to differ");
            let huge = where_feeds(dir.path(), 1e3, some, hides);
            if fill == -1e4 {
                let beyond = compare(&core, &kernel, &huge).unwrap();
                assert!(!beyond.passed, "scores beyond the fill -1e4 are expected to differ");
            }
            for feeds in
                [where_feeds(dir.path(), 1.0, some, hides), where_feeds(dir.path(), 1.0, [0.0; 3], hides), huge]
            {
                let v = compare(&core, &fused, &feeds).unwrap();
                assert!(v.passed, "guarded, fill {fill}, hides {hides}:\n{}", v.text());
            }
            // A row that keeps no key is the fill throughout in the core:
            // the guard lifts it (the kept keys as a float mask), bit for bit.
            let none = where_feeds(dir.path(), 1.0, [0.0; 3], hides);
            assert!(runs_the_kernel(&fused, &none), "fill {fill}, hides {hides}: lifted");
            assert!(same_bits(&core, &fused, &none), "fill {fill}, hides {hides}: lifted, bit for bit");
        }
    }
    // A fill of -inf: such a row is the core's NaN, not lifted.
    let core = where_core(f64::NEG_INFINITY, false);
    let fused = fused(&core);
    let none = where_feeds(dir.path(), 1.0, [0.0; 3], false);
    assert!(!runs_the_kernel(&fused, &none), "a fill of -inf: the original ops run");
    let v = compare(&core, &fused, &none).unwrap();
    assert!(v.passed, "a fill of -inf:\n{}", v.text());
}

/// A NaN in a key the Where hides: the core replaces its score by the fill
/// (no NaN), the kernel's result is NaN. The guard's bound on the scores
/// reads max|k|, which ONNX Runtime's `ReduceMax` computes passing over a
/// NaN that is not the first value (a false fusion before): the bound adds
/// 0 · Σk, and the original ops run.
#[test]
fn a_nan_in_a_key_the_where_hides_runs_the_original_ops() {
    let dir = tempdir();
    let some = [1.0, 1.0, 0.0];
    let feeds = where_feeds(dir.path(), 1.0, some, false);
    let (core, kernel) = (where_core(-1e9, false), where_kernel(false));
    let fused = fused(&core);
    // Key 2 is hidden in every row of batch 0; its element 1 of head 0
    // (not the first value of k) becomes NaN.
    let mut arrays = scaled_arrays(1.0, vec![("mask", where_mask(some, false))]);
    arrays[1].2[2 * 8 + 1] = f32::NAN;
    let with_nan = dir.path().join("nan_key.npz");
    npz(&with_nan, &arrays, &[]);
    let v = compare(&core, &kernel, &with_nan).unwrap();
    assert!(!v.passed, "the kernel alone is expected to give NaN for a NaN key it drops");
    let v = compare(&core, &fused, &with_nan).unwrap();
    assert!(v.passed, "guarded:\n{}", v.text());
    assert!(!runs_the_kernel(&fused, &with_nan), "the original ops run");
    assert!(runs_the_kernel(&fused, &feeds), "without the NaN the kernel runs");
}

/// An encoder's cores (BERT: no cache, no grouped heads) become the 3-D
/// `Attention`, reading the projections `[b, s, h·d]` the heads are split
/// from and writing the merged output, guarded as the 4-D form is: a batch
/// row padded whole masks every key of its queries, where ONNX Runtime's
/// kernel gives zeros (pinned here for the 3-D form too: unguarded, it
/// differs) and the export the mean of v; the mask there is the lowest
/// throughout, so the kernel runs it lifted.
#[test]
fn encoder_cores_read_and_write_merged_heads_and_a_row_padded_whole_runs_the_kernel_lifted() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]);
    let (original, fused) = fused_at_23("bert_ts_op14.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    let projections: Vec<String> = ["query", "key", "value"]
        .iter()
        .map(|p| format!("/model/encoder/layer.0/attention/self/{p}/Add_output_0"))
        .collect();
    assert_eq!(kernels[0].input[..3], projections[..], "the kernel reads the projections, not their heads");
    assert_eq!((kernels[0].attr_int("q_num_heads"), kernels[0].attr_int("kv_num_heads")), (Some(4), Some(4)));
    assert_eq!(guards(&fused)[0].output, ["/model/encoder/layer.0/attention/self/Reshape_3_output_0"], "merged");
    let main = &fused.graph.as_ref().unwrap().node;
    assert!(!main.iter().any(|n| n.op_type() == "Transpose"), "no head is transposed outside the guard");
    the_guard_decides(&original, &fused, &inputs, "a row padded whole is expected to be fully masked");
    assert!(runs_the_kernel(&fused, &inputs), "the row padded whole is lifted");
}

/// ESM scales q twice before its product (by 1/√d, then by the eager
/// path's scaling of 1) and the transposed key once (by 1): each is a
/// scale of the scores, so its encoder's cores are the merged 3-D kernel,
/// reading the projections, with the product of the scales; a row padded
/// whole runs it lifted.
#[test]
fn q_scaled_twice_is_read_before_both_scales() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0]);
    let (original, fused) = fused_at_23("esm_optimum.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    let projections = ["query", "key", "value"].map(|p| format!("/encoder/layer.0/attention/self/{p}/Add_output_0"));
    assert_eq!(kernels[0].input[..3], projections[..], "the kernel reads the projections, not their scaled heads");
    assert_eq!(kernels[0].attr_float("scale"), Some((1.0 / 8f64.sqrt()) as f32), "1/√8 · 1 · 1");
    the_guard_decides(&original, &fused, &inputs, "a row padded whole is expected to be fully masked");
    assert!(runs_the_kernel(&fused, &inputs), "the row padded whole is lifted");
}

/// A cache without grouped heads whose key the export only transposes:
/// T5's decoder with past, its self-attention's cache and its
/// cross-attention's encoder key and value, which the caller passes back
/// in. ONNX Runtime folds that transpose into its MatMul, and its
/// `Attention` is slower than the MatMuls (docs/benchmarks.md): the cores
/// stay `AttentionCore`, and the report says why.
#[test]
fn a_cache_without_grouped_heads_whose_key_is_only_transposed_stays_attention_core() {
    let original = load("t5_optimum_decoder_past.onnx");
    let (mut fused, upgrade) = upgrade::upgrade(&original, 23).unwrap();
    let outcome =
        rewrite::run_upgraded(&mut fused, &[&onnx_fuse::passes::attention::PASS], Default::default(), upgrade.added);
    assert!(kernels(&fused).is_empty(), "no core runs the kernel");
    assert_eq!(outcome.fused.len(), 4, "self- and cross-attention of both layers");
    for f in &outcome.fused {
        assert_eq!(f.op_type, "AttentionCore");
        let note = f.note.as_deref().unwrap_or_default();
        assert!(note.contains("whose key the export only transposes"), "{note}");
    }
    let dir = std::path::Path::new(".");
    let v = verify::verify((&original, dir), (&fused, dir), &verify::Options::default()).unwrap();
    assert!(v.passed, "{}", v.text());
}

/// DistilBERT hides padded keys by `masked_fill` (a Where of the float
/// lowest): its cores become the 3-D `Attention` with the kept keys as a
/// boolean mask, and a row padded whole (the fill throughout in the core)
/// runs the kernel on the kept keys as a float mask, that row lifted.
#[test]
fn a_masked_fill_encoder_hands_its_kept_keys_over_and_a_row_padded_whole_runs_it_lifted() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0]);
    let (original, fused) = fused_at_23("distilbert_ts_op14.onnx", "attention");
    assert_eq!(kernels(&fused).len(), 2);
    let main = &fused.graph.as_ref().unwrap().node;
    assert!(main.iter().any(|n| n.op_type() == "Not"), "masked_fill names the hidden keys: the kernel takes the kept");
    the_guard_decides(&original, &fused, &inputs, "a row padded whole is expected to keep no key");
    assert!(runs_the_kernel(&fused, &inputs), "the row padded whole is lifted");
}

/// GPT-2 hides future keys by a `Where` of the float lowest and padded
/// keys by an additive mask: the kernel takes one float mask, the two
/// applied to a score of 0, and a left-padded batch (whose padding rows
/// keep no key, their values the lowest and -inf) runs the kernel lifted.
#[test]
fn a_where_with_an_additive_mask_is_one_float_mask_and_a_left_padded_batch_runs_it_lifted() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let (original, fused) = fused_at_23("gpt2_ts_op14.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    let wheres: Vec<&NodeProto> =
        original.graph.as_ref().unwrap().node.iter().filter(|n| n.op_type() == "Where").collect();
    for k in &kernels {
        assert_eq!(k.input.len(), 4, "one mask");
        assert!(!wheres.iter().any(|w| w.input[0] == k.input[3]), "the mask is not the Where's condition alone");
    }
    the_guard_decides(&original, &fused, &inputs, "the left-padded rows are expected to keep no key");
    assert!(runs_the_kernel(&fused, &inputs), "the padding rows are lifted");
}

/// BART's eager attention (TrOCR's decoder) folds the heads into the batch:
/// q, k and v are `[b·h, s, d]`, the scores viewed as `[b, h, s, t]` for
/// the mask and back. The kernel reads the projections the heads are
/// merged from and writes the merged output, and a left-padded row (whose
/// padding queries see no key, the mask the lowest throughout) runs the
/// kernel lifted.
#[test]
fn heads_folded_into_the_batch_become_the_kernel_and_a_left_padded_batch_runs_it_lifted() {
    let dir = tempdir();
    let inputs = token_feeds(dir.path(), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let (original, fused) = fused_at_23("trocr_decoder_ts_op14.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    let layer = "/model/decoder/layers.0/self_attn";
    let projections = [
        format!("{layer}/Mul_output_0"),
        format!("{layer}/k_proj/Add_output_0"),
        format!("{layer}/v_proj/Add_output_0"),
    ];
    assert_eq!(kernels[0].input[..3], projections[..], "the kernel reads the projections, not their folded heads");
    assert_eq!((kernels[0].attr_int("q_num_heads"), kernels[0].attr_float("scale")), (Some(4), Some(1.0)));
    assert_eq!(guards(&fused)[0].output, [format!("{layer}/Reshape_9_output_0")], "the merged output");
    the_guard_decides(&original, &fused, &inputs, "the left-padded rows are expected to see no key");
    assert!(runs_the_kernel(&fused, &inputs), "the left-padded rows are lifted");
}

/// A view of the folded scores whose leading axes are not q's `[b, h]`
/// (here `[h, b]`) adds the mask elsewhere than the kernel would: the core
/// stays, as the export computes it.
#[test]
fn a_view_of_the_scores_that_is_not_qs_batch_and_heads_stays_the_core() {
    let mut model = load("trocr_decoder_ts_op14.onnx");
    let g = model.graph.as_mut().unwrap();
    for layer in 0..2 {
        let view = format!("/model/decoder/layers.{layer}/self_attn/Concat_6");
        let concat = g.node.iter_mut().find(|n| n.name() == view).unwrap();
        concat.input.swap(0, 1);
    }
    // (One row: the export's mask [b, 1, s, t] broadcasts over [h, b, s, t].)
    let dir = tempdir();
    let inputs = dir.path().join("one_row.npz");
    npz(&inputs, &[], &[("input_ids", vec![1, 7], (3..10).collect()), ("attention_mask", vec![1, 7], vec![1; 7])]);
    let fused = upgraded_and_fused(&model, "attention");
    assert!(kernels(&fused).is_empty(), "no kernel");
    let cores = fused.graph.as_ref().unwrap().node.iter().filter(|n| n.op_type() == "AttentionCore").count();
    assert_eq!(cores, 2, "the cores stay");
    let v = compare(&model, &fused, &inputs).unwrap();
    assert!(v.passed, "{}", v.text());
}

/// `Where(keep, s, fill) + mask`, the core of `core(4)` with a Where of the
/// f32 input `keep` (0 or 1, cast to bool) before its additive mask.
fn where_add_core(fill: f64) -> ModelProto {
    let mut m = core(4);
    let g = m.graph.as_mut().unwrap();
    g.input.push(value_info("keep", FLOAT, Some(&[sym("b"), D::N(1), D::N(3), D::N(3)])));
    let add = g.node.iter().position(|n| n.op_type() == "Add").unwrap();
    let scores = g.node[add].input[0].clone();
    let mut b = Builder::default();
    let condition = b.node("Cast", &["keep"], vec![attr_int("to", 9)]);
    let fill = b.constant(tensor(FLOAT, &[], &[fill]));
    let hidden = b.node("Where", &[&condition, &scores, &fill], vec![]);
    g.node[add].input[0] = hidden;
    g.node.splice(add..add, b.graph.node);
    m
}

/// Feeds for `where_add_core`: q and k times `qk`; `keep` hides the last
/// key of every row, and row 1 of batch 0 keeps `kept`; the additive mask
/// is 0 but for `masked` at row 2 of batch 1 (every key).
fn where_add_feeds(dir: &std::path::Path, qk: f32, kept: [f32; 3], masked: f32) -> std::path::PathBuf {
    let mut keep: Vec<f32> = (0..18).map(|i| if i % 3 == 2 { 0.0 } else { 1.0 }).collect();
    keep[3..6].copy_from_slice(&kept);
    let mut mask = vec![0f32; 18];
    mask[15..18].copy_from_slice(&[masked; 3]);
    let path = dir.join(format!("where_add_{qk}_{kept:?}_{masked}.npz"));
    scaled_feeds(path, qk, vec![("mask", mask), ("keep", keep)])
}

/// The facts the one float mask of a Where and an additive mask rests on,
/// each run: where the scores stay within the room the masks leave, the
/// kernel given the masks applied to a score of 0 computes the core; with
/// scores beyond a fill of -1e4, or a row that keeps no key, or an additive
/// mask of the lowest over a whole row, it does not. A row whose values
/// are all the lowest or -inf the guard lifts (a row masked whole by the
/// lowest; one that keeps no key under a fill of the lowest), elsewhere
/// the original ops run. The guarded output is the core's on all of them.
#[test]
fn a_where_and_an_additive_mask_computed_by_the_kernel_agree_while_hidden_keys_get_no_weight() {
    let dir = tempdir();
    let some = [1.0, 1.0, 0.0];
    let lowest = f32::MIN;
    for fill in [f64::from(f32::MIN), -1e9, -1e4] {
        let core = where_add_core(fill);
        let fused = fused(&core);
        assert_eq!(guards(&fused).len(), 1, "fill {fill}: a guarded kernel");
        let kernel = unguarded(&fused);
        let agree = where_add_feeds(dir.path(), 1.0, some, 0.0);
        let v = compare(&core, &kernel, &agree).unwrap();
        assert!(v.passed, "fill {fill}: the kernel alone computes the core here:\n{}", v.text());
        let cases = [
            ("a row that keeps no key", where_add_feeds(dir.path(), 1.0, [0.0; 3], 0.0)),
            ("a row masked whole by the lowest", where_add_feeds(dir.path(), 1.0, some, lowest)),
            ("scores beyond the fill", where_add_feeds(dir.path(), 1e3, some, 0.0)),
        ];
        for (what, feeds) in &cases {
            // (A row that keeps no key under a fill of -1e9: every score
            // plus -1e9 rounds to -1e9, and the kernel's weights are even,
            // as the core's are.)
            let differs = match *what {
                "scores beyond the fill" => fill == -1e4,
                "a row that keeps no key" => fill != -1e9,
                _ => true,
            };
            if differs {
                let alone = compare(&core, &kernel, feeds).unwrap();
                assert!(!alone.passed, "fill {fill}, {what}: the kernel alone is expected to differ");
            }
            let v = compare(&core, &fused, feeds).unwrap();
            assert!(v.passed, "guarded, fill {fill}, {what}:\n{}", v.text());
            let (lifted, kernel) = match *what {
                "a row that keeps no key" => (fill == f64::from(lowest), fill == f64::from(lowest)),
                "a row masked whole by the lowest" => (true, true),
                _ => (false, fill != -1e4),
            };
            assert_eq!(runs_the_kernel(&fused, feeds), kernel, "fill {fill}, {what}: the kernel runs");
            if lifted {
                assert!(same_bits(&core, &fused, feeds), "fill {fill}, {what}: lifted, bit for bit");
            }
        }
    }
}

/// `s + bias + mask`, the core of `core(4)` with a second additive mask, the
/// f32 input `bias`, added before it (MPNet's relative position bias and
/// padding mask).
fn two_masks_core() -> ModelProto {
    let mut m = core(4);
    let g = m.graph.as_mut().unwrap();
    g.input.push(value_info("bias", FLOAT, Some(&[sym("b"), D::N(1), D::N(3), D::N(3)])));
    let add = g.node.iter().position(|n| n.op_type() == "Add").unwrap();
    let mut b = Builder::default();
    let biased = b.node("Add", &[&g.node[add].input[0], "bias"], vec![]);
    g.node[add].input[0] = biased;
    g.node.splice(add..add, b.graph.node);
    m
}

/// Feeds for `two_masks_core`: a bias of random values, 0 at `zero_bias`
/// (an index of the 18); the mask 0 but row 1 of batch 0, `row`.
fn two_masks_feeds(dir: &std::path::Path, row: [f32; 3], bias_row: Option<[f32; 3]>) -> std::path::PathBuf {
    let mut bias: Vec<f32> = values(18, 7).into_iter().map(|x| 3.0 * x).collect();
    if let Some(r) = bias_row {
        bias[3..6].copy_from_slice(&r);
    }
    let mut mask = vec![0f32; 18];
    mask[3..6].copy_from_slice(&row);
    let path = dir.join(format!("two_masks_{row:?}_{bias_row:?}.npz"));
    scaled_feeds(path, 1.0, vec![("mask", mask), ("bias", bias)])
}

/// Runs both models on `inputs` and says whether every output is the same, bit for bit.
fn same_bits(original: &ModelProto, other: &ModelProto, inputs: &std::path::Path) -> bool {
    let options =
        verify::Options { inputs: Some(inputs.to_path_buf()), rtol: Some(0.0), atol: Some(0.0), ..Default::default() };
    let here = std::path::Path::new(".");
    let v = verify::verify((original, here), (other, here), &options).unwrap();
    v.passed && v.outputs.iter().all(|c| c.passed)
}

/// The facts two additive masks handed over as one rest on, each run: where
/// at every key one of the two is 0 or the key gets no weight, the kernel
/// given their sum computes the core (adding 0 is exact: `M` is the one
/// mask the core adds). Where
/// neither is 0 at a key with weight (a bias of 1e8 and a mask of -1e8: the
/// core's (s + 1e8) - 1e8 loses s, the kernel's s + 0 keeps it), or a row's
/// mask is the lowest throughout (the kernel's zeros), it does not, and the
/// guard runs the original ops there.
#[test]
fn two_additive_masks_computed_by_the_kernel_agree_where_one_is_zero_and_hidden_keys_get_no_weight() {
    let dir = tempdir();
    let core = two_masks_core();
    let fused = fused(&core);
    assert_eq!(guards(&fused).len(), 1, "a guarded kernel");
    let kernel = unguarded(&fused);
    assert_eq!(kernels(&fused)[0].input.len(), 4, "one mask");
    for fill in [f32::MIN, -1e9] {
        // (Within the kernel's rounding of s + M: ONNX Runtime adds the
        // mask to the scaled product in one step, as with one mask.)
        let agree = two_masks_feeds(dir.path(), [0.0, fill, 0.0], None);
        let v = compare(&core, &kernel, &agree).unwrap();
        assert!(v.passed, "fill {fill}: the kernel alone computes the core:\n{}", v.text());
        let v = compare(&core, &fused, &agree).unwrap();
        assert!(v.passed, "fill {fill}: and the guarded output:\n{}", v.text());
    }
    let cases = [
        ("neither mask 0 at a key with weight", two_masks_feeds(dir.path(), [-1e8, 0.0, 0.0], Some([1e8, 0.5, 0.5]))),
        ("a row of the lowest", two_masks_feeds(dir.path(), [f32::MIN; 3], Some([0.25, 0.5, 0.75]))),
    ];
    for (what, feeds) in &cases {
        let alone = compare(&core, &kernel, feeds).unwrap();
        assert!(!alone.passed, "{what}: the kernel alone is expected to differ");
        assert!(same_bits(&core, &fused, feeds), "guarded, {what}: the original ops run");
    }
}

/// An encoder's core whose masks are replayed over every head's scores
/// (MPNet: its relative position bias and padding mask; DeBERTa: its
/// relative terms, `[b·h, s, t]` added to the folded scores before their
/// view, read in the view, and its `masked_fill`) reaches every check of
/// the kernel but the last: the guard would read a score-sized mask some
/// ten times, which costs what the kernel saves (measured), so the core
/// stays `AttentionCore` and computes the export.
#[test]
fn encoder_masks_replayed_over_every_head_stay_the_core() {
    for name in ["mpnet_ts_op14.onnx", "deberta_ts_op14.onnx"] {
        let (original, fused) = fused_at_23(name, "attention");
        assert!(kernels(&fused).is_empty(), "{name}: no kernel");
        let main = &fused.graph.as_ref().unwrap().node;
        assert_eq!(main.iter().filter(|n| n.op_type() == "AttentionCore").count(), 2, "{name}: the cores stay");
        let dir = tempdir();
        let inputs = token_feeds(dir.path(), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
        let v = compare(&original, &fused, &inputs).unwrap();
        assert!(v.passed, "{name}: {}", v.text());
    }
}

/// torch's SDPA decomposition of grouped heads (Gemma's dynamo export)
/// repeats the key's heads in place, folds them into the batch, transposes
/// and views them back as `[b, h, d, t]`: the kernel reads the key before
/// its repeat, with `kv_num_heads`, and computes the export.
#[test]
fn a_key_repeated_folded_and_viewed_back_is_read_before_its_repeat() {
    let (original, fused) = fused_at_23("gemma_sdpa_dynamo_op18.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    for k in &kernels {
        assert_eq!((k.attr_int("q_num_heads"), k.attr_int("kv_num_heads")), (None, None), "4-D heads");
        let key = original.graph.as_ref().unwrap().node.iter().find(|n| n.output.first() == Some(&k.input[1]));
        assert!(key.is_some_and(|n| n.op_type() != "Reshape"), "the key before its repeat: {:?}", k.input[1]);
    }
    let dir = std::path::Path::new(".");
    let v = verify::verify((&original, dir), (&fused, dir), &verify::Options::default()).unwrap();
    assert!(v.passed, "{}", v.text());
}

/// torch's dynamo decomposition of SDPA transposes any 4-D key folded into
/// the batch and viewed back (`Reshape(Transpose(Reshape(k, [-1, t, d]),
/// [0, 2, 1]), [b, h, d, t])`): BERT's encoder cores are the kernel,
/// reading the key before its fold, and compute the export on a
/// left-padded row (the export's shapes are static, `[1, 7]`).
#[test]
fn a_key_folded_transposed_and_viewed_back_is_read_before_its_fold() {
    let (original, fused) = fused_at_23("bert_sdpa_dynamo_op18.onnx", "attention");
    let kernels = kernels(&fused);
    assert_eq!(kernels.len(), 2);
    let nodes = &original.graph.as_ref().unwrap().node;
    for k in &kernels {
        let key = nodes.iter().find(|n| n.output.first() == Some(&k.input[1])).expect("the key's producer");
        assert!(key.op_type() != "Reshape", "the key before its fold: {:?} of {}", k.input[1], key.op_type());
    }
    let dir = tempdir();
    let inputs = dir.path().join("left_padded.npz");
    let ids: Vec<i64> = (0..7).map(|i| (i * 7 + 3) % 64).collect();
    npz(&inputs, &[], &[("input_ids", vec![1, 7], ids), ("attention_mask", vec![1, 7], vec![0, 0, 1, 1, 1, 1, 1])]);
    let v = compare(&original, &fused, &inputs).unwrap();
    assert!(v.passed, "{}", v.text());
}

/// The one fact of ONNX Runtime's `Pow` the folding rests on
/// (`graph/fold.rs`): `Pow(x, 0.5)` in f32 is the square root exactly where
/// x is the square of an integer of at most 4096 (DINOv2's position grid,
/// `Cast(Pow(4.0, 0.5) → int64)`), against `Sqrt`, which IEEE rounds
/// correctly; elsewhere the two differ (0.06% of f32 inputs), and folding
/// keeps such a power inexact. A scalar base runs the same kernel.
#[test]
fn onnx_runtimes_pow_of_a_half_is_the_root_of_a_perfect_square() {
    let dir = tempdir();
    for squares in [(0..=4096u64).map(|k| (k * k) as f32).collect::<Vec<f32>>(), vec![4.0]] {
        let dims: Vec<D> = if squares.len() == 1 { vec![] } else { vec![D::N(squares.len() as i64)] };
        let model = |root: bool| {
            let mut b = Builder::default();
            let x = b.input("x", FLOAT, Some(&dims));
            if root {
                b.node_to("Sqrt", &[&x], &["y"], vec![]);
            } else {
                let half = b.constant(tensor(FLOAT, &[], &[0.5]));
                b.node_to("Pow", &[&x, &half], &["y"], vec![]);
            }
            b.output("y", FLOAT, None);
            b.model(17)
        };
        let path = dir.path().join(format!("squares_{}.npz", squares.len()));
        let shape = if squares.len() == 1 { vec![] } else { vec![squares.len() as u64] };
        npz(&path, &[("x", shape, squares)], &[]);
        assert!(same_bits(&model(true), &model(false), &path), "Pow(x, 0.5) is the root of every square");
    }
    // And the difference elsewhere, so the comparison is not blind.
    let near: Vec<f32> = (1..=4096u32).map(|k| (k * k + 1) as f32 * 1.37).collect();
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(near.len() as i64)]));
    let half = b.constant(tensor(FLOAT, &[], &[0.5]));
    b.node_to("Pow", &[&x, &half], &["y"], vec![]);
    b.output("y", FLOAT, None);
    let pow = b.model(17);
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(near.len() as i64)]));
    b.node_to("Sqrt", &[&x], &["y"], vec![]);
    b.output("y", FLOAT, None);
    let sqrt = b.model(17);
    let path = dir.path().join("near.npz");
    npz(&path, &[("x", vec![near.len() as u64], near)], &[]);
    let options = verify::Options { inputs: Some(path), rtol: Some(0.0), atol: Some(0.0), ..Default::default() };
    let here = std::path::Path::new(".");
    let v = verify::verify((&sqrt, here), (&pow, here), &options).unwrap();
    assert!(!v.passed, "Pow(x, 0.5) was expected to differ from Sqrt somewhere off the squares");
}

/// Whether ONNX Runtime computes the same outputs from `a` and `b` with
/// the symbol `len` at `len`.
fn same_at_len(a: &ModelProto, b: &ModelProto, len: i64) -> bool {
    let options = verify::Options { dims: [("len".to_string(), len)].into(), ..Default::default() };
    let here = std::path::Path::new(".");
    verify::verify((a, here), (b, here), &options).unwrap().outputs.iter().all(|c| c.passed)
}

/// The fact of ONNX Runtime's pools the shape rule for `ceil_mode` rests on
/// (`graph/shapes.rs`, `conv_length`): rounded up, a pool's length is
/// floor((len + pads - reach + stride - 1) / stride) + 1 where the end's pad
/// plus the stride is at most the kernel's reach (Funnel's kernel 2, stride
/// 2: ceil(len / 2), the length of a Conv of kernel 2, stride 2 and one
/// leading pad); past that, ONNX Runtime drops a window that would start in
/// the end's pad, and the formula is wrong (kernel 2, stride 3, len 3: one
/// window, not two), which is why the rule declines there.
#[test]
fn onnx_runtimes_pools_rounded_up_start_every_window_inside() {
    let lengths = |pool: (i64, i64), conv: (i64, i64, i64), len: i64| {
        let model = |is_pool: bool| {
            let mut b = Builder::default();
            let x = b.input("x", FLOAT, Some(&[D::N(1), D::N(1), sym("len"), D::N(2)]));
            let y = if is_pool {
                let (k, s) = pool;
                let attributes =
                    vec![attr_ints("kernel_shape", &[k, 1]), attr_ints("strides", &[s, 1]), attr_int("ceil_mode", 1)];
                b.node("AveragePool", &[&x], attributes)
            } else {
                let (k, s, lead) = conv;
                let w = b.init("w", tensor(FLOAT, &[1, 1, k, 1], &vec![0.5; k as usize]));
                b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[s, 1]), attr_ints("pads", &[lead, 0, 0, 0])])
            };
            b.node_to("Shape", &[&y], &["n"], vec![]);
            b.output("n", INT64, None);
            b.model(17)
        };
        same_at_len(&model(true), &model(false), len)
    };
    for len in 1..=9 {
        assert!(lengths((2, 2), (2, 2, 1), len), "kernel 2, stride 2, len {len}: ceil(len / 2)");
        // The formula's length where the stride passes the reach: kept only
        // where no window starts in the end's pad.
        assert_eq!(lengths((2, 3), (2, 3, 2), len), len % 3 != 0, "kernel 2, stride 3, len {len}");
    }
}

/// A pool's window longer than its input (no ceil_mode): ONNX Runtime
/// truncates the negative quotient, `(len − kernel) / stride + 1`, and
/// keeps one window where the floor would give none (kernel 2 over one
/// element: 1, not floor(1 / 2) = 0), so the floor is a pool's length only
/// where the input is proved at least its window (shapes.rs). A Conv fails
/// there.
#[test]
fn onnx_runtimes_pools_keep_one_window_over_an_input_shorter_than_it_where_a_conv_fails() {
    let shape_is = |len: i64, expected: i64| {
        let model = |pool: bool| {
            let mut b = Builder::default();
            let x = b.input("x", FLOAT, Some(&[D::N(1), D::N(1), sym("len")]));
            if pool {
                let attributes = vec![attr_ints("kernel_shape", &[2]), attr_ints("strides", &[2])];
                let y = b.node("AveragePool", &[&x], attributes);
                b.node_to("Shape", &[&y], &["n"], vec![]);
            } else {
                let n = b.init("expected", tensor(INT64, &[3], &[1.0, 1.0, expected as f64]));
                b.node_to("Identity", &[&n], &["n"], vec![]);
            }
            b.output("n", INT64, None);
            b.model(17)
        };
        same_at_len(&model(true), &model(false), len)
    };
    assert!(shape_is(1, 1), "kernel 2 over one element: one window");
    assert!(!shape_is(1, 0), "not floor(1 / 2)");
    for len in 2..=9 {
        assert!(shape_is(len, len / 2), "kernel 2, stride 2, len {len}: floor(len / 2)");
    }
    // A Conv fails there instead, and on an empty axis whatever its
    // kernel: each axis a Conv gives is at least 1 (shapes.rs's bounds).
    let conv_runs = |kernel: i64, len: i64| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[D::N(1), D::N(1), sym("len")]));
        let w = b.init("w", tensor(FLOAT, &[1, 1, kernel], &vec![0.5; kernel as usize]));
        let y = b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[kernel])]);
        b.output(&y, FLOAT, None);
        let model = b.model(17);
        let options = verify::Options { dims: [("len".to_string(), len)].into(), ..Default::default() };
        let here = std::path::Path::new(".");
        verify::verify((&model, here), (&model, here), &options).is_ok()
    };
    assert!(!conv_runs(2, 1) && !conv_runs(1, 0), "a Conv over less than its window fails");
    assert!(conv_runs(2, 2) && conv_runs(1, 1));
}

/// `core(4)` whose mask's last axis is a length of its own, `m`, not
/// proved the key's (GPT-J's causal mask is sized by the attention mask
/// and sliced at the key's length); feeds of mask `[1, 1, 3, m]`.
fn core_of_mask_length() -> ModelProto {
    let mut m = core(4);
    let g = m.graph.as_mut().unwrap();
    set_dims(g.input.iter_mut().find(|i| i.name() == "mask").unwrap(), &["b", "1", "3", "m"]);
    m
}

fn mask_length_feeds(dir: &std::path::Path, m: u64) -> std::path::PathBuf {
    let path = dir.join(format!("mask_length_{m}.npz"));
    let n = (4 * 3 * 8) as usize;
    let f32s = [
        ("q", vec![1, 4, 3, 8], values(n, 1)),
        ("k", vec![1, 4, 3, 8], values(n, 2)),
        ("v", vec![1, 4, 3, 8], values(n, 3)),
        ("mask", vec![1, 1, 3, m], values((3 * m) as usize, 4)),
        ("past_k", vec![1, 4, 0, 8], vec![]),
        ("past_v", vec![1, 4, 0, 8], vec![]),
    ];
    npz(&path, &f32s, &[]);
    path
}

/// A mask of one key column broadcasts over the keys in the core; ONNX
/// Runtime's kernel takes a mask of the keys' length only (it refuses one
/// column, measured), so the guard compares the mask's length with the
/// key's at run time: the kernel where they are equal, the original ops
/// where not.
#[test]
fn a_mask_whose_length_is_not_proved_the_keys_is_compared_with_them_at_run_time() {
    let dir = tempdir();
    let core = core_of_mask_length();
    let fused = fused(&core);
    assert_eq!(guards(&fused).len(), 1, "one guarded kernel");
    let compared = fused.graph.as_ref().unwrap().node.iter().find(|n| n.output[0].ends_with("/mask_length_is_keys"));
    assert_eq!(compared.map(|n| n.op_type()), Some("Equal"), "the lengths compared before the guard");
    let (same, one) = (mask_length_feeds(dir.path(), 3), mask_length_feeds(dir.path(), 1));
    let v = compare(&core, &fused, &same).unwrap();
    assert!(v.passed, "{}", v.text());
    assert!(runs_the_kernel(&fused, &same), "a mask of the keys' length runs the kernel");
    let v = compare(&core, &fused, &one).unwrap();
    assert!(v.passed, "{}", v.text());
    assert!(!runs_the_kernel(&fused, &one), "a mask of one column runs the original ops");
    assert!(
        compare(&core, &unguarded(&fused), &one).is_err_and(|e| format!("{e:#}").contains("mask")),
        "ONNX Runtime's kernel is expected to refuse a mask of one key column"
    );
}

/// Every export that takes token ids and an attention mask, run through
/// the everyday command (upgraded to opset 23, the kernel where it is
/// exact), computes what the export computes on a left-padded batch: two
/// rows, the first padded by 3 tokens, after a cache of 3 where it takes
/// one (an eager export's padding queries then see no key at all); the
/// cleanup after the passes changes no output bit. Exports
/// the original cannot run on a batch of two (near-misses whose weights fix
/// the batch) are named and left out.
#[test]
fn every_export_computes_a_left_padded_batch_as_the_export() {
    let dir = tempdir();
    let checked = in_parallel(&exports(), |name| -> Option<(String, Result<(), String>)> {
        let original = load(name);
        let graph = original.graph.as_ref().unwrap();
        let weights: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name()).collect();
        let inputs: Vec<_> = graph.input.iter().filter(|i| !weights.contains(i.name())).collect();
        let names: Vec<&str> = inputs.iter().map(|i| i.name()).collect();
        if !names.contains(&"input_ids") || !names.contains(&"attention_mask") {
            return None;
        }
        let past = if names.iter().any(|n| n.starts_with("past")) { 3u64 } else { 0 };
        let dims = |i: &onnx_fuse::onnx::ValueInfoProto| -> Vec<Option<u64>> {
            declared(i).map_or(vec![], |(_, d)| d.iter().map(|d| d.map(|n| n as u64)).collect())
        };
        let ids = inputs.iter().find(|i| i.name() == "input_ids").unwrap();
        let (batch, seq) = match dims(ids).as_slice() {
            [b, s] => (b.unwrap_or(2), s.unwrap_or(7)),
            _ => return None,
        };
        let (mut f32s, mut i64s) = (Vec::new(), Vec::new());
        for i in &inputs {
            let n = i.name();
            match n {
                "input_ids" => {
                    i64s.push((n, vec![batch, seq], (0..batch * seq).map(|k| (k * 7 + 3) as i64 % 29 + 3).collect()))
                }
                "attention_mask" => {
                    let t = past + seq;
                    i64s.push((n, vec![batch, t], (0..batch * t).map(|k| i64::from(k >= 3)).collect()))
                }
                "position_ids" => {
                    i64s.push((n, vec![batch, seq], (0..batch * seq).map(|k| (past + k % seq) as i64).collect()))
                }
                "token_type_ids" => i64s.push((n, vec![batch, seq], vec![0; (batch * seq) as usize])),
                _ if n.starts_with("past") && declared(i).is_some_and(|(elem, _)| elem == FLOAT) => {
                    let shape: Vec<u64> = dims(i)
                        .iter()
                        .enumerate()
                        .map(|(axis, d)| match axis {
                            0 => batch,
                            2 => past,
                            _ => d.unwrap_or(2),
                        })
                        .collect();
                    let count = shape.iter().product::<u64>() as usize;
                    f32s.push((n, shape, values(count, 5)));
                }
                // (A merged decoder's `use_cache_branch`: its two models
                // are exports of their own here.)
                _ => return Some((name.to_string(), Err(format!("skip: it takes {n}")))),
            }
        }
        let feeds = dir.path().join(format!("{}.npz", name.replace('/', "_")));
        npz(&feeds, &f32s, &i64s);
        // The everyday command, and without its cleanup: the fused nodes
        // judged against the export (each alone), the cleanup against the
        // fused model (every output the same, bit for bit).
        let everyday = |extra: &[&str], suffix: &str| -> Result<onnx_fuse::onnx::ModelProto, String> {
            let folder = dir.path().join(suffix);
            let _ = std::fs::create_dir(&folder);
            let out = folder.join(format!("{}.onnx", name.replace('/', "_")));
            let run = run(&[&[testdata(name).to_str().unwrap(), "-o", out.to_str().unwrap()], extra].concat());
            if !run.status.success() {
                return Err(format!("the everyday command failed: {}", stderr(&run)));
            }
            Ok(onnx_fuse::io::load(&out, Default::default()).unwrap().model)
        };
        let (fused, cleaned) = match (everyday(&["--no-cleanup"], "fused"), everyday(&[], "cleaned")) {
            (Ok(f), Ok(c)) => (f, c),
            (Err(e), _) | (_, Err(e)) => return Some((name.to_string(), Err(e))),
        };
        let options = verify::Options { inputs: Some(feeds), ..Default::default() };
        let here = testdata(name);
        let folders = (here.parent().unwrap(), dir.path());
        // Bit for bit, but for half types: ONNX Runtime's CPU provider
        // computes some f16 ops in f32 and keeps a value in f32 between
        // them or not by who else reads it, so a Shape fewer reading an
        // f16 value changes its rounding (measured on llama_ts_op17_fp16:
        // every value the same where all are graph outputs, the output
        // 2.4e-4 apart where not); within the type's tolerance there.
        let half = |c: &verify::Compared| c.elem_type == "float16" || c.elem_type == "bfloat16";
        let exact =
            |v: &verify::Verification| v.passed && v.outputs.iter().all(|c| c.passed && (c.max_abs == 0.0 || half(c)));
        // Both as plain models (no node marked fused): their outputs decide.
        let plain = |m: &onnx_fuse::onnx::ModelProto| {
            let mut m = m.clone();
            fn strip(g: &mut onnx_fuse::onnx::GraphProto) {
                for n in &mut g.node {
                    n.metadata_props.retain(|p| p.key() != onnx_fuse::onnx::FUSED_KEY);
                    n.subgraphs_mut().for_each(strip);
                }
            }
            m.graph.iter_mut().for_each(strip);
            m
        };
        Some((
            name.to_string(),
            match verify::verify((&original, folders.0), (&fused, &folders.1.join("fused")), &options) {
                Ok(v) if v.passed => match verify::verify(
                    (&plain(&fused), &folders.1.join("fused")),
                    (&plain(&cleaned), &folders.1.join("cleaned")),
                    &options,
                ) {
                    Ok(v) if exact(&v) => Ok(()),
                    Ok(v) => Err(format!("the cleanup changed an output:\n{}", v.text())),
                    Err(e) => Err(format!("{e:#}")),
                },
                Ok(v) => Err(v.text()),
                Err(e) if format!("{e:#}").contains("cannot run the original") => {
                    Err("skip: the original does not run a batch of two".into())
                }
                Err(e) => Err(format!("{e:#}")),
            },
        ))
    });
    let checked: Vec<_> = checked.into_iter().flatten().collect();
    let skip = |r: &Result<(), String>| r.as_ref().is_err_and(|e| e.starts_with("skip"));
    let skipped: Vec<String> =
        checked.iter().filter(|(_, r)| skip(r)).map(|(n, r)| format!("{n} ({})", r.as_ref().unwrap_err())).collect();
    let failed: Vec<String> = checked
        .iter()
        .filter(|(_, r)| r.is_err() && !skip(r))
        .map(|(n, r)| format!("{n}: {}", r.as_ref().unwrap_err()))
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
    let ran = checked.len() - skipped.len();
    eprintln!("left-padded batches: {ran} exports compute the export's outputs; left out: {skipped:?}");
    // Each family with a cache and grouped heads is among them.
    for name in ["llama_optimum_past.onnx", "gpt2_optimum_past.onnx", "llama_ts_op14.onnx", "gptj_optimum_past.onnx"] {
        assert!(checked.iter().any(|(n, r)| n == name && r.is_ok()), "{name} is checked");
    }
}

/// A decoder's guards read the sizes they test from a graph input where
/// one has them (q's batch and query length are input_ids'), so that every
/// layer's condition is the same nodes, computed once a step; and the
/// `Shape`s of the mask's length that the match computes anew from the
/// same input stay, each under the name its readers read (what the output
/// computes, on left-padded batches after a cache too, is
/// `every_export_computes_a_left_padded_batch_as_the_export`'s).
#[test]
fn every_layers_guard_reads_its_sizes_from_one_graph_input() {
    for name in ["llama_optimum_past.onnx", "llama_ts_op14.onnx"] {
        let (_, fused) = fused_at_23(name, "default");
        let g = fused.graph.as_ref().unwrap();
        let sizes: Vec<&NodeProto> = g.node.iter().filter(|n| n.op_type() == "Size").collect();
        assert_eq!(sizes.len(), 1, "{name}: one Size for every layer's guard");
        assert_eq!(sizes[0].input, ["input_ids"], "{name}");
        // (The eager export's guards also test each layer's slice of the mask.)
        let conditions: std::collections::HashSet<&str> = guards(&fused).iter().map(|n| n.input[0].as_str()).collect();
        let expected = if name == "llama_optimum_past.onnx" { 1 } else { 2 };
        assert_eq!((guards(&fused).len(), conditions.len()), (2, expected), "{name}: two layers' guards");
        onnx_fuse::validate::model(&fused).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// `core(4)` with its scores viewed as `view` and back to `[b, 4, 3, 3]`,
/// the pair around the softmax (`around_softmax`) or before it, and the
/// input `m` of shape `m_dims` added to the view.
fn viewed_core(view: &[f64], around_softmax: bool, m_dims: &[i64]) -> ModelProto {
    let mut model = core(4);
    let g = model.graph.as_mut().unwrap();
    let dims: Vec<D> = m_dims.iter().map(|&d| D::N(d)).collect();
    g.input.push(value_info("m", FLOAT, Some(&dims)));
    g.initializer.push(TensorProto { name: Some("view_shape".into()), ..tensor(INT64, &[view.len() as i64], view) });
    g.initializer.push(TensorProto { name: Some("back_shape".into()), ..tensor(INT64, &[4], &[-1.0, 4.0, 3.0, 3.0]) });
    let softmax = g.node.iter().position(|n| n.op_type() == "Softmax").unwrap();
    let scores = g.node[softmax].input[0].clone();
    let probabilities = g.node[softmax].output[0].clone();
    let reshape = |input: &str, shape: &str, output: &str| NodeProto {
        op_type: Some("Reshape".into()),
        name: Some(output.into()),
        input: vec![input.into(), shape.into()],
        output: vec![output.into()],
        ..Default::default()
    };
    let add = NodeProto {
        op_type: Some("Add".into()),
        name: Some("view_masked".into()),
        input: vec!["view".into(), "m".into()],
        output: vec!["view_masked".into()],
        ..Default::default()
    };
    if around_softmax {
        g.node[softmax].input[0] = "view_masked".into();
        g.node[softmax].output[0] = "viewed_probabilities".into();
        let back = reshape("viewed_probabilities", "back_shape", &probabilities);
        let nodes = [reshape(&scores, "view_shape", "view"), add, g.node[softmax].clone(), back];
        g.node.splice(softmax..softmax + 1, nodes);
    } else {
        g.node[softmax].input[0] = "view_back".into();
        let nodes = [reshape(&scores, "view_shape", "view"), add, reshape("view_masked", "back_shape", "view_back")];
        g.node.splice(softmax..softmax, nodes);
    }
    model
}

/// Scores viewed as rows of their last axis around the softmax (and a
/// mask varying along that axis alone added to the view) are the scores
/// themselves to the kernel: it is written, and computes the core. Viewed
/// so that the rows of the last axis are cut, a mask of the view's last
/// axis is added elsewhere than to the scores' keys: the core stays
/// AttentionCore.
#[test]
fn scores_viewed_by_rows_and_back_are_the_kernels_and_a_view_that_cuts_the_rows_stays_the_core() {
    let dir = tempdir();
    let feeds = |m_dims: &[i64]| {
        let n: i64 = m_dims.iter().product();
        let m: Vec<f32> = values(n as usize, 7).into_iter().map(|x| x * 4.0).collect();
        let mut arrays = scaled_arrays(1.0, vec![("mask", vec![0.0; 18])]);
        arrays.push(("m", m_dims.iter().map(|&d| d as u64).collect(), m));
        let path = dir.path().join(format!("viewed_{m_dims:?}.npz"));
        npz(&path, &arrays, &[]);
        path
    };
    for (around, m_dims) in [(true, vec![1, 3]), (false, vec![3])] {
        let model = viewed_core(&[-1.0, 3.0], around, &m_dims);
        let fused = fused(&model);
        assert_eq!(guards(&fused).len(), 1, "around the softmax {around}: the kernel is written");
        let v = compare(&model, &fused, &feeds(&m_dims)).unwrap();
        assert!(v.passed, "{}", v.text());
    }
    // [b, 4, 3, 3] viewed as [3b, 3, 4]: a mask of 4 values per row of the
    // view falls across the keys of different queries.
    let model = viewed_core(&[-1.0, 3.0, 4.0], false, &[4]);
    let fused = fused(&model);
    assert!(guards(&fused).is_empty(), "no kernel");
    let cores = fused.graph.as_ref().unwrap().node.iter().filter(|n| n.op_type() == "AttentionCore").count();
    assert_eq!(cores, 1, "the core stays");
    let v = compare(&model, &fused, &feeds(&[4])).unwrap();
    assert!(v.passed, "{}", v.text());
}
