//! rms-norm and layer-norm on real exports: what fuses, the exact structure
//! written, and equivalence through ONNX Runtime.

mod common;

use common::*;
use onnx_fuse::onnx::{ModelProto, NodeProto};

/// The norm passes (skip-norm, later in the default pipeline, takes over
/// residual norms: tests/skip_norm.rs).
const NORMS: &[&str] = &["layer-norm", "rms-norm", "attention"];

/// (model, what each pass of `NORMS` fuses in it (a pass not listed: none), eps)
pub const EXPORTS: &[(&str, &[(&str, usize)], f32)] = &[
    ("llama_ts_op14.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_ts_op12.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_sdpa_ts_op14.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_ts_op17_fp16.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_dynamo_op18.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    // Opset 23 without the exporter's optimizer: axes reshaped from constants, Identity steps.
    ("llama_dynamo_op23.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_optimum.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("llama_optimum_past.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("qwen2_ts_op14.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-5),
    ("qwen2_dynamo_op18_fp16.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-5),
    ("mistral_sdpa_ts_op17.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-5),
    ("gemma_ts_op14.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("gemma_ts_op17_fp16.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("gemma_sdpa_dynamo_op18.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("t5_encoder_ts_op14.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("t5_encoder_ts_op17_fp16.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    // Decoder self- and cross-attention; the cross-attention's position bias is a Constant.
    ("t5_seq2seq_ts_op14.onnx", &[("rms-norm", 12), ("attention", 6)], 1e-6),
    ("t5_optimum_decoder_past.onnx", &[("rms-norm", 7), ("attention", 4)], 1e-6),
    ("gpt2_optimum_past.onnx", &[("attention", 2)], 1e-5),
    ("gpt2_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    ("gpt2_sdpa_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    // From opset 17 (dynamo: 18) the exporters write LayerNormalization themselves.
    ("gpt2_dynamo_op18.onnx", &[("attention", 2)], 1e-5),
    // Unoptimized: the fill and the divisor are `Expand(Cast(constant), [])`.
    ("gpt2_dynamo_op23.onnx", &[("attention", 2)], 1e-5),
    ("vit_dynamo_op23.onnx", &[("attention", 2)], 1e-12),
    ("whisper_encoder_dynamo_op23.onnx", &[("attention", 2)], 1e-5),
    ("bert_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    ("bert_sdpa_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    ("bert_optimum.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    ("roberta_ts_op17.onnx", &[("attention", 2)], 1e-5),
    ("vit_ts_op17.onnx", &[("attention", 2)], 1e-12),
    ("vit_ts_op17_fp16.onnx", &[("attention", 2)], 1e-12),
    ("whisper_encoder_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    ("whisper_encoder_sdpa_ts_op17.onnx", &[("attention", 2)], 1e-5),
    ("trocr_decoder_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    // The fp16 GPT-2 export normalizes in f64: eps is f64, outside the spec.
    ("gpt2_ts_op13_fp16.onnx", &[("attention", 2)], 0.0),
    ("if_branches_rms.onnx", &[("rms-norm", 2)], 1e-6),
    // A weight that is a graph input of declared shape [32] = the last axis of x.
    ("rms_weight_graph_input.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    ("external/model.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    // ALiBi added to the scores, then the mask; a Reshape on each side of the Softmax.
    ("bloom_ts_op14.onnx", &[("layer-norm", 6), ("attention", 2)], 1e-5),
    ("bloom_optimum.onnx", &[("layer-norm", 6), ("attention", 2)], 1e-5),
    // With its cache: ALiBi's keys, sized from the mask's declared length,
    // proved the cache's by the broadcasts they meet (shapes.rs).
    ("bloom_optimum_past.onnx", &[("layer-norm", 6), ("attention", 2)], 1e-5),
    // dynamo: one Reshape of the 3-D scores to 4-D; the exporter writes LayerNormalization.
    ("bloom_dynamo_op18.onnx", &[("attention", 2)], 1e-5),
    // SDPA decomposed by dynamo: the key's transpose folded into the batch.
    ("bert_sdpa_dynamo_op18.onnx", &[("attention", 2)], 1e-12),
    // A relative position bias, then the mask.
    ("mpnet_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    // LayerNorms without bias; MPT also masks with masked_fill.
    ("mpt_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    ("modernbert_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    // LayerNorms with neither weight nor bias: a scale of ones is made.
    ("olmo_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    // Soft-capped scores (tokens softcap): four norms a layer.
    ("gemma2_ts_op18.onnx", &[("rms-norm", 9), ("attention", 2)], 1e-6),
    // Position ids from the mask (CumSum).
    ("opt_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    ("opt_optimum.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-5),
    // masked_fill, whose mask is expanded to Shape(scores): the scores'
    // MatMul stays for that reader.
    ("distilbert_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    // A relative position bias gathered through an If only shapes decide:
    // every residual norm is proved (skip-norm, tests/skip_norm.rs); the
    // scores' views are shaped from the scores' own shapes.
    ("deberta_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-7),
    // Attention written with Einsums, its mask subtracted.
    ("xlnet_ts_op14.onnx", &[("layer-norm", 4), ("attention", 2)], 1e-12),
    // Speech: the sequence convolved and pooled (floor(len / 2) written two
    // ways); the exporter writes LayerNormalization.
    ("sew_ts_op17.onnx", &[("attention", 2)], 1e-5),
    // Speech: a positional Conv one step longer than its input, cut back.
    ("hubert_ts_op17.onnx", &[("attention", 2)], 1e-5),
    // Position embeddings resized to the image's grid.
    ("dinov2_ts_op17.onnx", &[("attention", 2)], 1e-5),
    // The parallel residual: two norms read one sum.
    ("neox_ts_op17.onnx", &[("attention", 2)], 1e-5),
    // GPT-J: its rotary interleaved on the heads before their transpose
    // (tests/rotary.rs); the exporter writes LayerNormalization.
    ("gptj_ts_op17.onnx", &[("attention", 2)], 1e-5),
    ("gptj_optimum_past.onnx", &[("attention", 2)], 1e-5),
    // Interleaved rotaries of tables torch's general repeat_interleave
    // writes (tests/rotary.rs); Cohere's LayerNorm has no bias.
    ("cohere_optimum_past.onnx", &[("layer-norm", 3), ("attention", 2)], 1e-5),
    ("glm_optimum_past.onnx", &[("rms-norm", 5), ("attention", 2)], 1.5625e-7),
    // f16 with the residual stream in f32: each norm's f32 core alone, the
    // Cast to f16 and the weight's Mul after it stay (tests/forms.rs).
    ("llama_optimum_past_fp16.onnx", &[("rms-norm", 5), ("attention", 2)], 1e-6),
    // Each head's q and k normalized over its 8 values on [b, s, h, d]
    // before the heads' Transpose: 4 norms more than Llama's.
    ("qwen3_optimum_past.onnx", &[("rms-norm", 9), ("attention", 2)], 1e-6),
    // Attention sinks: the softmax over the scores and a sink column, cut
    // off after it, is no attention core; its rotary written apart
    // (tests/rotary.rs).
    ("gpt_oss_optimum_past.onnx", &[("rms-norm", 5)], 1e-5),
    // q scaled twice before its product; the exporter writes LayerNormalization.
    ("esm_optimum.onnx", &[("attention", 2)], 1e-5),
    // Relative attention, its scores a sum of three terms: the position
    // term cut from `seq + 7` relative positions (`arange(7, -seq, -1)`,
    // its bounds `pos[0]` and `pos[-1]` of `arange(seq)` cast to float):
    // seq long only where seq is at most 2^24, which a float holds exactly
    // and nothing bounds, so no core fuses (2 of 3 before the bound was
    // held). Pooled blocks (ceil_mode) before the residual norms.
    ("funnel_ts_op14.onnx", &[("layer-norm", 7)], 1e-9),
    // Dynamic convolution beside attention: its `x · softmax` is declined.
    ("convbert_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    // Transient-global attention: cores of Einsums with an ellipsis over
    // blocks of the sequence padded to a multiple of 3 (`(-seq) % 3`);
    // the global tokens' RMSNorms read an Einsum's output.
    ("longt5_ts_op17.onnx", &[("rms-norm", 7), ("attention", 2)], 1e-6),
    // Patches unfolded at a count computed in float (`math.ceil(h / 2)`):
    // the LayerNorms' last axis is proved, their gamma and beta inside.
    ("mobilevit_ts_op14.onnx", &[("layer-norm", 21), ("attention", 9)], 1e-5),
    // Height, width and channels dynamic (as Optimum exports images): the
    // patch count and class token meet the position embeddings.
    ("vit_hw_ts_op14.onnx", &[("layer-norm", 5), ("attention", 2)], 1e-12),
    // Shifted windows over a map padded to whole windows, patches merged.
    ("swin_hw_ts_op14.onnx", &[("layer-norm", 7), ("attention", 2)], 1e-5),
    // LayerNorms over a feature map's (H, W) and over (C, H, W), without weights.
    ("ln_axes_ts_op14.onnx", &[("layer-norm", 2)], 1e-5),
    // torch's nn.MultiheadAttention: heads folded into the batch, never split.
    ("mha_ts_op17.onnx", &[("attention", 2)], 1e-5),
    // Optimum's merged decoder: both branches read the If's output names.
    ("gpt2_optimum_merged_folder/decoder_model_merged.onnx", &[("attention", 4)], 1e-5),
];

fn is_norm(node: &NodeProto) -> bool {
    matches!(node.op_type(), "SimplifiedLayerNormalization" | "LayerNormalization")
}

fn check_attributes(node: &NodeProto, eps: f32, model: &str) {
    assert_eq!(node.domain(), "", "{model}: {} is in the default domain", node.name());
    // Over the last axis, but in the export of norms over several axes.
    let axes: &[i64] = if model == "ln_axes_ts_op14.onnx" { &[-2, -3] } else { &[-1] };
    assert!(node.attr_int("axis").is_some_and(|a| axes.contains(&a)), "{model}: axis");
    assert_eq!(node.attr_int("stash_type"), Some(1), "{model}: stash_type");
    let written = node.attr_float("epsilon").expect("epsilon");
    assert_eq!(written.to_bits(), eps.to_bits(), "{model}: epsilon {written:e} is the model's eps {eps:e} bit for bit");
    assert_eq!(node.attribute.len(), 3, "{model}: exactly axis, epsilon, stash_type");
}

#[test]
fn every_export_fuses_every_norm_and_computes_the_same() {
    for &(name, counts, eps) in EXPORTS {
        let (original, fused, outcome) = fuse_with(name, NORMS);
        let expected = |pass: &str| counts.iter().find(|(p, _)| *p == pass).map_or(0, |&(_, n)| n);
        for pass in NORMS {
            let found = outcome.fused.iter().filter(|f| f.pass == *pass).count();
            assert_eq!(found, expected(pass), "{name}: {pass} count");
        }
        // Each pass's count is the number of its ops written.
        let written = |op: &str| count_op(&fused, op) - count_op(&original, op);
        assert_eq!(
            written("SimplifiedLayerNormalization"),
            expected("rms-norm"),
            "{name}: SimplifiedLayerNormalization"
        );
        assert_eq!(written("LayerNormalization"), expected("layer-norm"), "{name}: LayerNormalization");
        // A core is an AttentionCore, or from opset 23 ONNX's Attention
        // (guarded by an If that counts as it).
        let kernels = all_nodes(&fused)
            .into_iter()
            .filter(|n| n.metadata("transmuter.fused").is_some())
            .filter(|n| n.op_type() == "Attention" || n.metadata("transmuter.runs") == Some("Attention"))
            .count();
        assert_eq!(written("AttentionCore") + kernels, expected("attention"), "{name}: AttentionCore or Attention");
        let total: usize = NORMS.iter().map(|p| expected(p)).sum();
        assert_eq!(outcome.fused.len(), total, "{name}: the report counts every fused node");
        // The lists name every removed node once: their lengths add up to
        // the nodes the rewrite removed.
        // (A guard's bodies hold the original ops again, and its condition
        // is computed by nodes of its own.)
        let live = outside_fused_bodies(&fused);
        let replacements: Vec<&NodeProto> =
            live.iter().copied().filter(|n| n.metadata("transmuter.fused").is_some()).collect();
        let computed: std::collections::HashSet<&String> =
            all_nodes(&original).iter().flat_map(|n| &n.output).collect();
        let added = live
            .iter()
            .filter(|n| n.metadata("transmuter.fused").is_none())
            .filter(|n| n.output.iter().all(|o| !computed.contains(o)))
            .count();
        let listed: usize = replacements.iter().map(|n| fused_list(n).len()).sum();
        assert_eq!(listed, all_nodes(&original).len() + replacements.len() + added - live.len(), "{name}");
        for node in replacements {
            if is_norm(node) {
                check_attributes(node, eps, name);
            }
            let list = fused_list(node);
            for entry in &list {
                let original_node = entry.split_once(' ').map(|(_, n)| n).unwrap();
                assert!(common::node(&original, original_node).is_some(), "{name}: {entry} is a node of the export");
                let kept = live.iter().any(|n| n.name() == original_node);
                assert!(!kept, "{name}: {entry} was removed");
            }
        }
        assert_equivalent(&original, &fused, name);
    }
}

#[test]
fn every_export_in_testdata_has_its_counts_in_the_table() {
    // Near-misses (nm_) and complex-mul's models (tests/complex_mul.rs) aside.
    for entry in std::fs::read_dir(testdata("")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let other = ["nm_", "cmul_", "complex_"].iter().any(|p| name.starts_with(p));
        if name.ends_with(".onnx") && !other {
            assert!(EXPORTS.iter().any(|(e, ..)| *e == name), "{name} is not in EXPORTS");
        }
    }
}

#[test]
fn rms_norm_writes_the_spec_node_with_its_provenance() {
    let (_, fused, _) = fuse_with("llama_ts_op14.onnx", NORMS);
    let scope = "/model/model/layers.0/input_layernorm/";
    let node = common::node(&fused, &format!("{scope}SimplifiedLayerNormalization")).expect("the fused node");
    assert_eq!(node.op_type(), "SimplifiedLayerNormalization");
    // fp32 export: the identity Cast(x → f32) feeds the residual too, so it stays.
    assert_eq!(
        node.input,
        vec![format!("{scope}Cast_output_0"), "model.model.layers.0.input_layernorm.weight".to_string()]
    );
    assert_eq!(node.output, vec![format!("{scope}Mul_1_output_0")], "the anchor's output name is kept");
    assert_provenance(
        node,
        &scope,
        &[
            "Mul Mul_1",
            "Constant Constant",
            "Pow Pow",
            "ReduceMean ReduceMean",
            "Constant Constant_1",
            "Add Add",
            "Sqrt Sqrt",
            "Constant Constant_2",
            "Div Div",
            "Mul Mul",
            "Cast Cast_1",
        ],
    );
}

#[test]
fn fp16_llama_folds_both_casts_into_the_norm() {
    let (_, fused, _) = fuse_norms("llama_ts_op17_fp16.onnx");
    let scope = "/model/model/layers.0/input_layernorm/";
    let node = common::node(&fused, &format!("{scope}SimplifiedLayerNormalization")).unwrap();
    assert_eq!(node.input[0], "/model/model/embed_tokens/Gather_output_0", "reads the f16 value before the Cast");
    let list = fused_list(node);
    assert!(
        list.contains(&format!("Cast {scope}Cast").as_str()) && list.contains(&format!("Cast {scope}Cast_1").as_str())
    );
    assert_eq!(count_op(&fused, "Cast") + 10, count_op(&load("llama_ts_op17_fp16.onnx"), "Cast"));
}

#[test]
fn t5_fp16_twin_casts_of_one_value_are_one_value() {
    let (_, fused, _) = fuse_with("t5_encoder_ts_op17_fp16.onnx", NORMS);
    let node = common::node(&fused, "/model/encoder/block.0/layer.0/layer_norm/SimplifiedLayerNormalization").unwrap();
    assert_eq!(node.input[0], "/model/encoder/shared/Gather_output_0");
    assert_eq!(fused_list(node).iter().filter(|e| e.starts_with("Cast ")).count(), 3);
}

#[test]
fn layer_norm_writes_the_spec_node() {
    let (_, fused, _) = fuse_with("gpt2_ts_op14.onnx", NORMS);
    let scope = "/model/transformer/h.0/ln_1/";
    let node = common::node(&fused, &format!("{scope}LayerNormalization")).expect("the fused node");
    assert_eq!(
        node.input,
        vec![
            "/model/transformer/Add_output_0".to_string(),
            "model.transformer.h.0.ln_1.weight".to_string(),
            "model.transformer.h.0.ln_1.bias".to_string(),
        ]
    );
    assert_provenance(
        node,
        &scope,
        &[
            "Add Add_1",
            "ReduceMean ReduceMean",
            "Sub Sub",
            "Constant Constant",
            "Pow Pow",
            "ReduceMean ReduceMean_1",
            "Constant Constant_1",
            "Add Add",
            "Sqrt Sqrt",
            "Div Div",
            "Mul Mul",
        ],
    );
}

#[test]
fn layer_norm_is_one_node_whichever_pass_runs_first() {
    let original = load("gpt2_ts_op14.onnx");
    let (ln_first, _) = fuse_model(&original, &["layer-norm", "rms-norm"]);
    let (rms_first, outcome) = fuse_model(&original, &["rms-norm", "layer-norm"]);
    for fused in [&ln_first, &rms_first] {
        assert_eq!(count_op(fused, "LayerNormalization"), 5);
        assert_eq!(count_op(fused, "SimplifiedLayerNormalization"), 0);
    }
    // rms-norm did run first: alone it fuses the five, which layer-norm then absorbed.
    let (alone, _) = fuse_model(&original, &["rms-norm"]);
    assert_eq!(count_op(&alone, "SimplifiedLayerNormalization"), 5);
    assert!(outcome.fused.iter().all(|f| f.pass == "layer-norm") && outcome.fused.len() == 5, "{:?}", outcome.fused);
    let names = |m: &ModelProto| -> Vec<Vec<String>> {
        let mut lists: Vec<Vec<String>> = all_nodes(m)
            .iter()
            .filter(|n| n.op_type() == "LayerNormalization")
            .map(|n| {
                let mut l: Vec<String> = fused_list(n).iter().map(|s| s.to_string()).collect();
                l.sort();
                l
            })
            .collect();
        lists.sort();
        lists
    };
    assert_eq!(names(&ln_first), names(&rms_first), "the same original nodes, folded through the SLN");
    assert_equivalent(&original, &rms_first, "gpt2_ts_op14.onnx");
}

/// (near-miss model, the anchor that must survive, SLN count, LN count, the reason --explain gives)
const NEAR_MISSES: &[(&str, &str, usize, usize, &str)] = &[
    // (the attention cores of these models fuse as usual: counted apart)
    ("nm_rms_exponent3.onnx", "/model/model/layers.0/input_layernorm/Mul_1", 4, 0, "the exponent is 3, not 2"),
    ("nm_rms_eps_not_constant.onnx", "/model/model/layers.0/input_layernorm/Mul_1", 4, 0, "is a constant eps"),
    ("nm_rms_axis0.onnx", "/model/model/layers.0/input_layernorm/Mul_1", 4, 0, "reduces axes [0], not the last axis"),
    ("nm_rms_keepdims0.onnx", "/model/model/layers.0/input_layernorm/Mul_1", 4, 0, "does not keep dims"),
    (
        "nm_rms_intermediate_output.onnx",
        "/model/model/layers.0/input_layernorm/Mul_1",
        4,
        0,
        "ReduceMean_output_0 is also a graph output",
    ),
    (
        "nm_rms_numerator2.onnx",
        "/model/model/layers.0/input_layernorm/Mul_1",
        4,
        0,
        "numerator of 1 / r is not exactly 1",
    ),
    (
        "nm_rms_square_of_other_value.onnx",
        "/model/model/layers.0/input_layernorm/Mul_1",
        4,
        0,
        "the square and the numerator read different values",
    ),
    // Equal norm weights share one initializer in torch exports: all five are [2, D].
    (
        "nm_rms_weight_2d.onnx",
        "/model/model/layers.0/input_layernorm/Mul_1",
        0,
        0,
        "not proved to have one axis (leading axes of 1 aside)",
    ),
    ("nm_rms_op18_no_axes.onnx", "node_mul_3", 4, 0, "reduces axes [], not the last axis alone"),
    ("nm_rms_op18_axes_not_constant.onnx", "node_mul_3", 4, 0, "the axes of ReduceMean node_mean are not a constant"),
    ("nm_rms_read_by_subgraph.onnx", "/outer/Mul", 0, 0, "/outer/mean is also read outside the matched nodes"),
    // A broken LayerNorm keeps its Add; its scaled rms core may still fuse.
    ("nm_ln_mean_axis0.onnx", "/model/transformer/h.0/ln_1/Add_1", 1, 4, "reduces axes [0], not the last axis"),
    ("nm_ln_centered_output.onnx", "/model/transformer/h.0/ln_1/Add_1", 1, 4, "Sub_output_0 is also a graph output"),
    (
        "nm_ln_mean_of_other_value.onnx",
        "/model/transformer/h.0/ln_1/Add_1",
        1,
        4,
        "the mean is not of the value it is subtracted from",
    ),
    // The [2, D] beta stays an Add after a LayerNormalization without bias.
    ("nm_ln_beta_2d.onnx", "/model/transformer/h.0/ln_1/Add_1", 0, 5, "the beta (model.transformer.h.0.ln_1.bias"),
];

fn fuse_norms(name: &str) -> (ModelProto, ModelProto, onnx_fuse::rewrite::Outcome) {
    let original = load(name);
    let (fused, outcome) = fuse_model(&original, &["layer-norm", "rms-norm"]);
    (original, fused, outcome)
}

#[test]
fn near_misses_do_not_fuse_and_say_why() {
    for &(name, survivor, rms, ln, reason) in NEAR_MISSES {
        let (_, fused, outcome) = fuse_norms(name);
        assert!(common::node(&fused, survivor).is_some(), "{name}: {survivor} must not be fused away");
        assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), rms, "{name}: SimplifiedLayerNormalization count");
        assert_eq!(count_op(&fused, "LayerNormalization"), ln, "{name}: LayerNormalization count");
        assert_eq!(outcome.fused.len(), rms + ln, "{name}");
        let said: Vec<&str> =
            outcome.declined.iter().filter(|d| d.node == survivor).map(|d| d.reason.as_str()).collect();
        assert!(
            said.iter().any(|r| r.contains(reason)),
            "{name}: {survivor} declined because {reason:?}; said {said:?}"
        );
    }
}

#[test]
fn near_misses_that_run_still_compute_the_same() {
    for name in [
        "nm_rms_exponent3.onnx",
        "nm_rms_numerator2.onnx",
        "nm_rms_square_of_other_value.onnx",
        "nm_ln_mean_axis0.onnx",
        "nm_ln_mean_of_other_value.onnx",
    ] {
        let (original, fused, _) = fuse_with(name, NORMS);
        assert_equivalent(&original, &fused, name);
    }
}

#[test]
fn norms_inside_if_branches_fuse_with_outer_constants() {
    let (_, fused, outcome) = fuse_with("if_branches_rms.onnx", NORMS);
    let mut graphs: Vec<&str> = outcome.fused.iter().map(|f| f.graph.as_str()).collect();
    graphs.sort();
    assert_eq!(graphs, ["main//If.else_branch", "main//If.then_branch"]);
    let then_node = common::node(&fused, "/then/SimplifiedLayerNormalization").unwrap();
    assert_eq!(then_node.input, ["x", "weight"], "x and the weight come from the outer graph");
    let else_node = common::node(&fused, "/else/SimplifiedLayerNormalization").unwrap();
    assert_eq!(else_node.input, ["/else/neg", "weight"]);
}

#[test]
fn a_second_run_changes_nothing() {
    let pipeline = onnx_fuse::passes::pipeline(&["default".into()], &[]).unwrap();
    for &(name, ..) in EXPORTS {
        for target in [onnx_fuse::graph::Target::Ort, onnx_fuse::graph::Target::Portable] {
            let mut once = load(name);
            onnx_fuse::rewrite::run_for(&mut once, &pipeline, target);
            let mut twice = once.clone();
            let outcome = onnx_fuse::rewrite::run_for(&mut twice, &pipeline, target);
            assert!(outcome.fused.is_empty(), "{name} ({target:?}): a second run fused {:?}", outcome.fused);
            assert_eq!(once, twice, "{name} ({target:?})");
        }
    }
}

#[test]
fn a_wrong_rewrite_fails_verification_and_names_the_node() {
    let (original, mut fused, _) = fuse_with("llama_ts_op14.onnx", NORMS);
    let target = "/model/model/layers.1/input_layernorm/SimplifiedLayerNormalization";
    let graph = fused.graph.as_mut().unwrap();
    let node = graph.node.iter_mut().find(|n| n.name() == target).unwrap();
    node.attribute.iter_mut().find(|a| a.name() == "epsilon").unwrap().f = Some(0.5);
    let dir = onnx_fuse::io::parent(&testdata("llama_ts_op14.onnx"));
    let v = onnx_fuse::verify::verify((&original, &dir), (&fused, &dir), &Default::default()).unwrap();
    assert!(!v.passed && !v.outputs[0].passed);
    // Later nodes inherit the error; the first to diverge in graph order is blamed.
    assert_eq!(v.blamed.as_deref(), Some(format!("SimplifiedLayerNormalization {target}").as_str()));
    assert!(v.nodes.iter().find(|c| c.node == v.blamed).is_some_and(|c| !c.passed));
    let earlier = "/model/model/layers.0/input_layernorm/SimplifiedLayerNormalization";
    assert!(v.nodes.iter().find(|c| c.node.as_deref().unwrap().ends_with(earlier)).unwrap().passed);
}

/// The nodes of a model but those in the bodies of fused nodes (where a
/// guard keeps the original ops for the inputs its kernel computes
/// otherwise).
fn outside_fused_bodies(model: &ModelProto) -> Vec<&NodeProto> {
    fn walk<'a>(g: &'a onnx_fuse::onnx::GraphProto, into: &mut Vec<&'a NodeProto>) {
        for n in &g.node {
            into.push(n);
            if n.metadata("transmuter.fused").is_none() {
                n.subgraphs().for_each(|b| walk(b, into));
            }
        }
    }
    let mut nodes = Vec::new();
    model.graph.iter().for_each(|g| walk(g, &mut nodes));
    nodes
}
