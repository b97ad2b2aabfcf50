//! skip-norm: the residual sum fused with the norm it feeds. Real exports
//! (structure, provenance, equivalence through ONNX Runtime), the shapes
//! ONNX Runtime's kernel accepts, and the near-misses that must not fuse.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::{ModelProto, NodeProto, DOUBLE, FLOAT, FLOAT16};

const D4: i64 = 4;

fn dims(d: &[i64]) -> Vec<D> {
    d.iter().map(|&n| D::N(n)).collect()
}

/// `norm(a + b [+ bias])` with the norm an opset-17 `LayerNormalization`
/// (or with `rms` the primitives rms-norm fuses), the sum also read by
/// `also` (`"output"`: a graph output; `"node"`: a Neg that is one).
fn residual(a: &[i64], b_dims: &[i64], bias: Option<&[i64]>, rms: bool, also: Option<&str>, elem: i32) -> ModelProto {
    let mut b = Builder::default();
    b.input("a", elem, Some(&dims(a)));
    b.input("b", elem, Some(&dims(b_dims)));
    let left = match bias {
        Some(shape) => {
            let n: i64 = shape.iter().product();
            let t = b.init("bias", tensor(elem, shape, &(0..n).map(|i| i as f64 / 8.0).collect::<Vec<_>>()));
            b.node("Add", &["a", &t], vec![])
        }
        None => "a".to_string(),
    };
    b.node_to("Add", &[&left, "b"], &["s"], vec![]);
    let y = if rms {
        rms_norm(&mut b, "s", elem, &[0.5, 1.0, 1.5, 2.0])
    } else {
        let gamma = b.init("gamma", tensor(elem, &[D4], &[0.5, 1.0, 1.5, 2.0]));
        let beta = b.init("beta", tensor(elem, &[D4], &[0.1, 0.2, 0.3, 0.4]));
        b.node("LayerNormalization", &["s", &gamma, &beta], vec![attr_int("axis", -1)])
    };
    b.output(&y, elem, None);
    match also {
        Some("output") => b.output("s", elem, None),
        Some(_) => {
            let neg = b.node("Neg", &["s"], vec![]);
            b.output(&neg, elem, None);
        }
        None => {}
    }
    b.model(17)
}

fn skip_nodes(model: &ModelProto) -> Vec<&NodeProto> {
    all_nodes(model).into_iter().filter(|n| n.op_type().starts_with("Skip")).collect()
}

/// Fuses with the default pipeline; the one skip-norm node, proved equal.
fn fused_skip(model: &ModelProto, op: &str) -> ModelProto {
    let (fused, outcome) = fuse_model(model, &["default", "skip-norm"]);
    let skips = skip_nodes(&fused);
    assert_eq!(skips.len(), 1, "{:?}", outcome.declined);
    assert_eq!(skips[0].op_type(), op);
    assert_eq!(skips[0].domain(), "com.microsoft");
    assert_equivalent(model, &fused, "skip_norm");
    fused
}

fn skip_declined(model: &ModelProto) -> Vec<String> {
    let (fused, outcome) = fuse_model(model, &["default", "skip-norm"]);
    assert!(skip_nodes(&fused).is_empty(), "must not fuse");
    outcome.declined.into_iter().filter(|d| d.pass == "skip-norm").map(|d| d.reason).collect()
}

#[test]
fn a_residual_layer_norm_becomes_skip_layer_normalization() {
    let model = residual(&[2, 3, 4], &[2, 3, 4], None, false, None, FLOAT);
    let fused = fused_skip(&model, "SkipLayerNormalization");
    let node = skip_nodes(&fused)[0].clone();
    assert_eq!(node.input, ["a", "b", "gamma", "beta"]);
    assert_eq!(node.output.len(), 1, "the sum is read by the norm alone");
    assert_eq!(node.attr_float("epsilon"), Some(1e-5));
    assert_eq!(fused_list(&node), ["LayerNormalization n1_LayerNormalization", "Add n0_Add"]);
    assert_eq!(fused.graph.as_ref().unwrap().node.len(), 1);
    // A second run changes nothing.
    let (again, outcome) = fuse_model(&fused, &["default", "skip-norm"]);
    assert!(outcome.fused.is_empty());
    assert_eq!(again, fused);
}

#[test]
fn the_sum_read_again_is_output_3() {
    for also in ["output", "node"] {
        let model = residual(&[2, 3, 4], &[2, 3, 4], None, false, Some(also), FLOAT);
        let fused = fused_skip(&model, "SkipLayerNormalization");
        let node = skip_nodes(&fused)[0];
        assert_eq!(node.output.len(), 4);
        assert_eq!(node.output[3], "s", "input_skip_bias_sum takes over the sum");
        assert_eq!(node.output[1..3], ["", ""]);
    }
}

#[test]
fn a_bias_of_one_axis_is_the_bias_input() {
    for bias in [&[4][..], &[1, 1, 4]] {
        let model = residual(&[2, 3, 4], &[2, 3, 4], Some(bias), false, Some("node"), FLOAT);
        let fused = fused_skip(&model, "SkipLayerNormalization");
        let node = skip_nodes(&fused)[0];
        assert_eq!(node.input.len(), 5, "{:?}", node.input);
        assert_eq!(node.input[..4], ["a", "b", "gamma", "beta"]);
        assert_eq!(node.output[3], "s");
    }
}

/// `norm((a + b) + bias)`: the bias added to the sum afterwards, the outer
/// sum read by `also` and the inner one by `inner_also`.
fn bias_after_the_sum(bias: &[i64], also: bool, inner_also: bool) -> ModelProto {
    let mut b = Builder::default();
    b.input("a", FLOAT, Some(&dims(&[2, 3, 4])));
    b.input("b", FLOAT, Some(&dims(&[2, 3, 4])));
    let inner = b.node("Add", &["a", "b"], vec![]);
    let n: i64 = bias.iter().product();
    let t = b.init("bias", tensor(FLOAT, bias, &(0..n).map(|i| i as f64 / 8.0).collect::<Vec<_>>()));
    b.node_to("Add", &[&inner, &t], &["s"], vec![]);
    let y = rms_norm(&mut b, "s", FLOAT, &[0.5, 1.0, 1.5, 2.0]);
    b.output(&y, FLOAT, None);
    if also {
        b.output("s", FLOAT, None);
    }
    if inner_also {
        let neg = b.node("Neg", &[&inner], vec![]);
        b.output(&neg, FLOAT, None);
    }
    b.model(17)
}

#[test]
fn a_bias_added_to_the_sum_afterwards_is_the_bias_input() {
    // onnxscript's form: a + b + bias is the same sum, the outer one is
    // input_skip_bias_sum where the residual stream reads it.
    for also in [false, true] {
        let fused = fused_skip(&bias_after_the_sum(&[4], also, false), "SkipSimplifiedLayerNormalization");
        let node = skip_nodes(&fused)[0];
        assert_eq!(node.input.len(), 4, "{:?}", node.input);
        assert_eq!(node.input[..2], ["a", "b"]);
        assert_eq!(node.output.get(3).map(String::as_str).filter(|o| !o.is_empty()), also.then_some("s"));
    }
    // The inner sum read elsewhere: it would escape, nothing fuses.
    let (fused, _) = fuse_model(&bias_after_the_sum(&[4], true, true), &["default", "skip-norm"]);
    assert!(skip_nodes(&fused).is_empty());
    // A bias of two axes [S, D] is no bias: it is the skip of the inner sum.
    let fused = fused_skip(&bias_after_the_sum(&[3, 4], false, false), "SkipSimplifiedLayerNormalization");
    let node = skip_nodes(&fused)[0];
    assert_eq!(node.input[1], "bias", "{:?}", node.input);
}

#[test]
fn a_bias_of_two_axes_is_no_bias() {
    // [2, D] is not one value per channel: the biased operand is the input.
    let model = residual(&[2, 2, 4], &[2, 2, 4], Some(&[2, 4]), false, None, FLOAT);
    let fused = fused_skip(&model, "SkipLayerNormalization");
    let node = skip_nodes(&fused)[0];
    assert_eq!(node.input.len(), 4, "no bias input: {:?}", node.input);
    assert_ne!(node.input[0], "a");
}

#[test]
fn a_residual_rms_norm_becomes_skip_simplified_layer_normalization() {
    for elem in [FLOAT, FLOAT16] {
        let model = residual(&[2, 3, 4], &[2, 3, 4], None, true, Some("output"), elem);
        let fused = fused_skip(&model, "SkipSimplifiedLayerNormalization");
        let node = skip_nodes(&fused)[0];
        assert_eq!(node.input.len(), 3);
        assert_eq!(node.output[3], "s");
        let eps = if elem == FLOAT { 1e-6 } else { half::f16::from_f64(1e-6).to_f32() };
        assert_eq!(node.attr_float("epsilon"), Some(eps), "eps as the model stores it");
    }
}

#[test]
fn the_broadcasts_the_kernel_accepts_fuse() {
    // A skip of [S, D] or [1, S, D] for a 3-D input; the operand with the
    // sum's shape is the input, whichever side it is on; 2-D inputs.
    let cases = [
        (&[2, 3, 4][..], &[3, 4][..], "a"),
        (&[2, 3, 4], &[1, 3, 4], "a"),
        (&[1, 3, 4], &[2, 3, 4], "b"),
        (&[3, 4], &[3, 4], "a"),
    ];
    for (a, b, input) in cases {
        let model = residual(a, b, None, false, None, FLOAT);
        let fused = fused_skip(&model, "SkipLayerNormalization");
        let node = skip_nodes(&fused)[0];
        assert_eq!(node.input[0], input, "{a:?} + {b:?}");
    }
}

#[test]
fn operands_of_other_shapes_do_not_fuse() {
    for (a, b) in [(&[2, 3, 4][..], &[2, 1, 4][..]), (&[2, 3, 4], &[4]), (&[1, 2, 3, 4], &[1, 2, 3, 4]), (&[4], &[4])] {
        let why = skip_declined(&residual(a, b, None, false, None, FLOAT));
        assert!(why.iter().any(|r| r.contains("kernel accepts")), "{a:?} + {b:?}: {why:?}");
    }
    // Symbolic axes that may be 1 on one side only prove nothing.
    let mut m = residual(&[2, 3, 4], &[2, 3, 4], None, false, None, FLOAT);
    set_dims(&mut m.graph.as_mut().unwrap().input[1], &["batch", "s", "4"]);
    let why = skip_declined(&m);
    assert!(why.iter().any(|r| r.contains("kernel accepts")), "{why:?}");
}

#[test]
fn types_the_cpu_kernel_lacks_do_not_fuse() {
    let why = skip_declined(&residual(&[2, 3, 4], &[2, 3, 4], None, false, None, DOUBLE));
    assert!(why.iter().any(|r| r.contains("not f32 or f16")), "{why:?}");
}

#[test]
fn an_intermediate_of_the_norm_read_outside_does_not_fuse() {
    // The sum read elsewhere is allowed (output 3); a value inside the norm
    // is not: layer-norm leaves the primitives, and skip-norm has no norm.
    let mut b = Builder::default();
    b.input("a", FLOAT, Some(&dims(&[2, 3, 4])));
    b.input("b", FLOAT, Some(&dims(&[2, 3, 4])));
    b.node_to("Add", &["a", "b"], &["s"], vec![]);
    let y = rms_norm(&mut b, "s", FLOAT, &[0.5, 1.0, 1.5, 2.0]);
    b.output(&y, FLOAT, None);
    let mean = b.graph.node.iter().find(|n| n.op_type() == "ReduceMean").unwrap().output[0].clone();
    b.output(&mean, FLOAT, None);
    let (fused, _) = fuse_model(&b.model(17), &["default", "skip-norm"]);
    assert!(skip_nodes(&fused).is_empty());
}

#[test]
fn exports_fuse_their_residual_norms() {
    // (export, op, fused count): every residual norm whose shapes the
    // analysis proves; the first norm of a decoder reads no sum. GPT-2's
    // and BERT's embedding sums and their attention outputs (whose lengths
    // the causal mask's and position ids' Slices to the sequence, the
    // mask's expand(-1) and the contractions prove) are all fused, as ONNX
    // Runtime's optimizer fuses them.
    for (name, op, count) in [
        ("bert_optimum.onnx", "SkipLayerNormalization", 5),
        ("bert_ts_op14.onnx", "SkipLayerNormalization", 5),
        ("gpt2_ts_op14.onnx", "SkipLayerNormalization", 5),
        ("gpt2_dynamo_op18.onnx", "SkipLayerNormalization", 5),
        ("llama_ts_op14.onnx", "SkipSimplifiedLayerNormalization", 4),
        ("llama_ts_op17_fp16.onnx", "SkipSimplifiedLayerNormalization", 4),
        ("vit_ts_op17.onnx", "SkipLayerNormalization", 5),
        ("t5_encoder_ts_op14.onnx", "SkipSimplifiedLayerNormalization", 4),
        // The attention output's shape through the relative position bias:
        // a GatherElements, and an If whose condition the shapes decide.
        ("deberta_ts_op14.onnx", "SkipLayerNormalization", 5),
        // The attention output of Einsums.
        ("xlnet_ts_op14.onnx", "SkipLayerNormalization", 4),
        // A cache's lengths: past + seq, its new rows' positions
        // Range(past, past + seq).
        ("gpt2_optimum_past.onnx", "SkipLayerNormalization", 5),
        ("t5_optimum_decoder_past.onnx", "SkipSimplifiedLayerNormalization", 6),
        // A convolved and a pooled sequence of one length, floor(len / 2).
        ("sew_ts_op17.onnx", "SkipLayerNormalization", 4),
        // The first norm's sum: a positional Conv one step longer than its
        // input, cut back to the input's length (`[:, :, :-1]`) and
        // transposed; the attention's Reshape reads that length by Shape.
        ("hubert_ts_op17.onnx", "SkipLayerNormalization", 5),
        // The first norm's sum: position embeddings `[1, 1 + n, D]` resized
        // to the grid (`Resize` to sizes, the grid's side `Cast(Pow(4.0,
        // 0.5))`), the skip of the class token and patches `[B, 1 + n, D]`.
        ("dinov2_ts_op17.onnx", "SkipLayerNormalization", 5),
        // The parallel residual: the second norm of one sum stays (its
        // reason: tests/skip_norm.rs), reading the first's output 3.
        ("neox_ts_op17.onnx", "SkipLayerNormalization", 2),
        // Each block after the first starts from a sequence pooled with
        // ceil_mode (kernel 2, stride 2: ceil(len / 2)); every residual
        // norm reads a sum of that length.
        ("funnel_ts_op14.onnx", "SkipLayerNormalization", 6),
        // The sums' skip is the unfolded patches, `[4·batch, n, 16]`, n the
        // patch count `math.ceil(h / 2)` times `math.ceil(w / 2)` computed
        // in float: exact only where h and w are at most 2^24, which
        // nothing bounds, so 3 of the 18 sums are not proved alike.
        ("mobilevit_ts_op14.onnx", "SkipLayerNormalization", 15),
        // The attention output is cut from blocks of the sequence padded
        // by `(-seq) % 3`: `[:, :seq]` of `3·floor((seq + 2)/3)` rows is
        // seq long, as the remainder is never negative (2 of 4 before).
        ("longt5_ts_op17.onnx", "SkipSimplifiedLayerNormalization", 4),
        // Height, width and channels dynamic: the first sum is the class
        // token and floor(h/8)·floor(w/8) patches, never 1 long (a Conv's
        // output is at least 1 long), added to 5 position embeddings, so 5.
        ("vit_hw_ts_op14.onnx", "SkipLayerNormalization", 5),
        // The second stage's first sum reads the merged patches
        // (`x[:, 0::2]`: ceil(len / 2)) of a map padded to whole windows.
        ("swin_hw_ts_op14.onnx", "SkipLayerNormalization", 3),
    ] {
        let (original, fused, outcome) = fuse(name);
        let skips = skip_nodes(&fused);
        assert_eq!(skips.len(), count, "{name}: {:?}", outcome.declined);
        assert!(skips.iter().all(|n| n.op_type() == op && n.domain() == "com.microsoft"), "{name}");
        let v = assert_equivalent(&original, &fused, name);
        // Every output of every skip node was compared on its own.
        let compared = v.nodes.iter().filter(|c| c.node.as_deref().is_some_and(|n| n.starts_with("Skip"))).count();
        let outputs: usize = skips.iter().map(|n| n.output.iter().filter(|o| !o.is_empty()).count()).sum();
        assert_eq!(compared, outputs, "{name}");
    }
}

/// Gemma's fp16 export adds the residual in f16 and normalizes in f32
/// (`Cast` between): the kernel adds in the type it normalizes in, so the
/// norm stays, with its reason (it had none, issue 38).
#[test]
fn a_sum_widened_before_its_norm_is_declined_with_its_reason() {
    let reasons = skip_declined(&common::load("gemma_ts_op17_fp16.onnx"));
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    for reason in reasons {
        assert!(reason.contains("(float16) through a Cast to float: the kernel adds in the type"), "{reason}");
    }
}

/// GPT-NeoX's parallel residual: the next layer's two norms read one sum.
/// One kernel takes it and offers it as output 3; the other norm reads that
/// and says why it stays (it had no reason, issue 38).
#[test]
fn a_sum_two_norms_read_joins_one_kernel_and_the_other_says_why() {
    let (fused, outcome) = fuse_model(&common::load("neox_ts_op17.onnx"), &["default", "skip-norm"]);
    let norm = common::node(&fused, "/model/gpt_neox/layers.1/post_attention_layernorm/LayerNormalization").unwrap();
    let skip = common::node(&fused, "/model/gpt_neox/layers.1/input_layernorm/SkipLayerNormalization").unwrap();
    assert_eq!(norm.input[0], skip.output[3]);
    let reasons: Vec<&str> = outcome
        .declined
        .iter()
        .filter(|d| d.pass == "skip-norm" && d.node == norm.name())
        .map(|d| d.reason.as_str())
        .collect();
    assert_eq!(reasons.len(), 1, "{:?}", outcome.declined);
    assert!(reasons[0].ends_with("for its own norm: one residual sum joins one kernel"), "{}", reasons[0]);
}
