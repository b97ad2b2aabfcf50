//! `--target portable`: only operators the model's own opset defines.

mod common;

use common::build::{attr_int, attr_ints, tensor, Builder, D};
use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::{ModelProto, NodeProto, BFLOAT16, BOOL, FLOAT, FLOAT16, INT64};
use onnx_fuse::{passes, rewrite};

fn nodes(model: &ModelProto) -> impl Iterator<Item = &NodeProto> {
    model.graph.as_ref().unwrap().node.iter()
}

fn fuse_for(model: &ModelProto, target: Target) -> (ModelProto, rewrite::Outcome) {
    let pipeline = passes::pipeline(&["default".to_string()], &[]).unwrap();
    let mut fused = model.clone();
    let outcome = rewrite::run_for(&mut fused, &pipeline, target);
    (fused, outcome)
}

/// `(x - mean) / sqrt(mean((x - mean)²) + eps) * g + b` (LN), or the RMS form,
/// written with axes as the opset wants them.
fn norm_model(opset: i64, layer_norm: bool) -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(3), D::N(8)]));
    let mean = |b: &mut Builder, v: &str| {
        if opset >= 18 {
            let axes = b.init(&format!("{v}_axes"), tensor(INT64, &[1], &[-1.0]));
            b.node("ReduceMean", &[v, &axes], vec![])
        } else {
            b.node("ReduceMean", &[v], vec![attr_ints("axes", &[-1])])
        }
    };
    let centered = if layer_norm {
        let mu = mean(&mut b, &x);
        b.node("Sub", &[&x, &mu], vec![])
    } else {
        x.clone()
    };
    let two = b.init("two", tensor(FLOAT, &[], &[2.0]));
    let sq = b.node("Pow", &[&centered, &two], vec![]);
    let m = mean(&mut b, &sq);
    let eps = b.init("eps", tensor(FLOAT, &[], &[1e-5]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[&centered, &r], vec![]);
    let g = b.init("g", tensor(FLOAT, &[8], &(0..8).map(|i| 1.0 + i as f64 / 8.0).collect::<Vec<_>>()));
    let mut y = b.node("Mul", &[&n, &g], vec![]);
    if layer_norm {
        let beta = b.init("beta", tensor(FLOAT, &[8], &[0.25; 8]));
        y = b.node("Add", &[&y, &beta], vec![]);
    }
    b.output(&y, FLOAT, None);
    b.model(opset)
}

fn verify_here(original: &ModelProto, fused: &ModelProto) {
    let dir = std::env::temp_dir();
    let v = onnx_fuse::verify::verify((original, &dir), (fused, &dir), &Default::default()).unwrap();
    assert!(v.passed, "{}", v.text());
}

#[test]
fn rms_norm_is_onnx_rms_normalization_from_opset_23() {
    let original = norm_model(23, false);
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(outcome.fused.len(), 1);
    let node = all_nodes(&fused).into_iter().find(|n| n.op_type() == "RMSNormalization").expect("RMSNormalization");
    assert_eq!((node.domain(), node.attr_int("axis"), node.attr_int("stash_type")), ("", Some(-1), Some(1)));
    assert_eq!(node.attr_float("epsilon"), Some(1e-5));
    assert!(node.metadata("transmuter.fused").is_some());
    verify_here(&original, &fused);
    // Below opset 23 the portable target has no such operator.
    let (_, outcome) = fuse_for(&norm_model(18, false), Target::Portable);
    assert!(outcome.fused.is_empty());
    assert!(outcome
        .declined
        .iter()
        .any(|d| d.reason == "needs opset 23 for RMSNormalization (the model imports opset 18)"));
}

#[test]
fn layer_norm_is_portable_from_opset_17() {
    let original = norm_model(17, true);
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(outcome.fused.iter().map(|f| f.op_type.as_str()).collect::<Vec<_>>(), ["LayerNormalization"]);
    verify_here(&original, &fused);
    let (_, outcome) = fuse_for(&load("gpt2_ts_op14.onnx"), Target::Portable);
    assert!(outcome.fused.is_empty(), "{:?}", outcome.fused);
    assert!(outcome
        .declined
        .iter()
        .any(|d| d.reason == "needs opset 17 for LayerNormalization (the model imports opset 14)"));
}

#[test]
fn nothing_in_a_custom_domain() {
    for name in ["llama_ts_op14.onnx", "gpt2_dynamo_op18.onnx", "cmul_index_ts_op17.onnx"] {
        let original = load(name);
        let pipeline = passes::pipeline(&["default".to_string(), "complex-mul".to_string()], &[]).unwrap();
        let mut fused = original.clone();
        let outcome = rewrite::run_for(&mut fused, &pipeline, Target::Portable);
        assert!(all_nodes(&fused).iter().all(|n| onnx_fuse::onnx::is_default_domain(n.domain())), "{name}");
        assert!(fused.functions.is_empty(), "{name}: no local functions");
        let why = if name.starts_with("cmul") { "portable target" } else { "needs opset " };
        assert!(outcome.declined.iter().any(|d| d.reason.contains(why)), "{name}: says why: {:?}", outcome.declined);
    }
}

#[test]
fn the_report_names_the_target_and_who_cannot_load_the_ort_output() {
    let (_, ort) = run_with_report("llama_ts_op14.onnx", &["-q", "--keep-opset"]);
    assert_eq!(ort["target"], "ort");
    let said = ort["not_loaded_by"].as_array().unwrap();
    assert!(said[0].as_str().unwrap().starts_with("OpenVINO and tract"), "{said:?}");
    // onnx.checker passes com.microsoft ops (a domain it does not check):
    // GPT-2's FastGelu and SkipLayerNormalization are no reason; only the
    // OpenVINO and tract line for its AttentionCore stays.
    let (_, gpt2) = run_with_report("gpt2_ts_op14.onnx", &["-q", "--keep-opset", "--passes", "default,skip-norm"]);
    let said = gpt2["not_loaded_by"].as_array().unwrap();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(said[0].as_str().unwrap().starts_with("OpenVINO and tract"), "{said:?}");
    let (_, portable) = run_with_report("llama_ts_op14.onnx", &["-q", "--target", "portable"]);
    assert_eq!(portable["target"], "portable");
    assert!(portable.get("not_loaded_by").is_none());
}

#[test]
fn the_report_names_onnx_runtimes_tools_that_stop_on_the_output_with_the_command_instead() {
    let said = |report: &serde_json::Value| -> Vec<String> {
        let tools = report.get("not_taken_by").and_then(|t| t.as_array()).cloned().unwrap_or_default();
        tools.iter().map(|t| t.as_str().unwrap().to_string()).collect()
    };
    // ONNX Attention in a guard: the symbolic shape inference reads it as
    // com.microsoft's (docs/pipeline.md).
    let (_, llama) = run_with_report("llama_optimum_past.onnx", &["-q"]);
    let tools = said(&llama);
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert!(tools[0].contains("symbolic shape inference") && tools[0].contains("skip_symbolic_shape=True"));
    // Outside a guard, quantize_dynamic writes it as QAttention too.
    let (_, whisper) = run_with_report("whisper_encoder_dynamo_op23.onnx", &["-q"]);
    let tools = said(&whisper);
    assert_eq!(tools.len(), 2, "{tools:?}");
    assert!(tools[1].starts_with("quantize_dynamic") && tools[1].contains("op_types_to_quantize"), "{tools:?}");
    // An AttentionCore that views its scores in a shape computed at run
    // time (BLOOM): the tool stops without auto_merge.
    let (_, bloom) = run_with_report("bloom_optimum_past.onnx", &["-q"]);
    let tools = said(&bloom);
    assert_eq!(tools.len(), 1, "{tools:?}");
    assert!(tools[0].contains("auto_merge=True"), "{tools:?}");
    // Neither: nothing to say (the cores stay AttentionCore, viewed by
    // constant shapes).
    let (_, kept) = run_with_report("llama_optimum_past.onnx", &["-q", "--keep-opset"]);
    assert!(kept.get("not_taken_by").is_none(), "{kept}");
}

#[test]
fn an_opset_23_export_gets_onnx_rms_normalization() {
    let original = load("llama_dynamo_op23.onnx");
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(count_op(&fused, "RMSNormalization"), 5);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization") + count_op(&fused, "AttentionCore"), 0);
    // Its rotaries of q and k are ONNX's RotaryEmbedding too.
    assert_eq!(count_op(&fused, "RotaryEmbedding"), 4);
    assert_eq!(outcome.fused.len(), 9);
    assert_equivalent(&original, &fused, "llama_dynamo_op23.onnx");
}

/// What an attention core carries besides `softmax(q·kᵀ / 8) · v`.
#[derive(Clone, Copy, PartialEq)]
enum Extra {
    Nothing,
    Mask,
    Where,
    Divisor,
    /// The key comes already transposed (a graph input): no Transpose to undo.
    KeyAlreadyTransposed,
    /// The transposed key is also a graph output.
    KeyReadElsewhere,
    /// An additive constant mask of the scores' last two axes holding this
    /// fill in every other key (an ALiBi-like bias elsewhere).
    ConstantMask(f64),
    /// A constant mask of one row, broadcast over the queries.
    ConstantMaskRow,
    /// A constant mask added before the scale.
    ConstantMaskBeforeScale,
    /// A constant mask of two batches on scores of one: the sum broadcasts
    /// the scores to the mask's batch.
    ConstantMaskWiderBatch,
    /// The scores divided by -8: ONNX Runtime refuses a scale that is not positive.
    NegativeDivisor,
    /// q times 0.5 and the transposed key times 0.25 before the MatMul (SDPA exports).
    ScaledQK,
    /// The key and value heads each repeated in place to q's heads
    /// (torch's `repeat_kv`: Unsqueeze, Expand, Reshape) before the products.
    Grouped,
    /// A constant mask `[1, 1, s, t]` whatever the scores' rank.
    ConstantMask4D,
    /// The key's transpose as torch's SDPA decomposition (dynamo) writes
    /// it: folded into the batch, transposed and viewed back,
    /// `Reshape(Transpose(Reshape(key, [-1, t, d]), [0, 2, 1]), [b, h, d, t])`.
    FoldedKey,
    /// The same of the key's heads repeated to q's (`Grouped`): SDPA's
    /// `enable_gqa`.
    FoldedGroupedKey,
    /// Folded and viewed back as `[b, h, d, t]`, but not transposed: the
    /// view reads the key's values in another order.
    FoldedKeyNotTransposed,
}

/// `x` `[b, kv, t, d]` with each head repeated `n` times in place (torch's
/// `repeat_kv`): `Reshape(Expand(Unsqueeze(x, 2), [b, kv, n, t, d]), [b, kv·n, t, d])`.
fn repeated(b: &mut Builder, x: &str, d: &[i64], n: i64) -> String {
    let axes = b.init(&format!("{x}_at_2"), tensor(INT64, &[1], &[2.0]));
    let u = b.node("Unsqueeze", &[x, &axes], vec![]);
    let spread = b.init(&format!("{x}_spread"), tensor(INT64, &[5], &[d[0], d[1], n, d[2], d[3]].map(|x| x as f64)));
    let e = b.node("Expand", &[&u, &spread], vec![]);
    let heads = b.init(&format!("{x}_heads"), tensor(INT64, &[4], &[d[0], d[1] * n, d[2], d[3]].map(|x| x as f64)));
    b.node("Reshape", &[&e, &heads], vec![])
}

fn attention_model(opset: i64, elem: i32, [q, key, v]: [&[i64]; 3], extra: Extra) -> ModelProto {
    let dims = |d: &[i64]| d.iter().map(|&n| D::N(n)).collect::<Vec<_>>();
    let mut b = Builder::default();
    let q_in = b.input("q", elem, Some(&dims(q)));
    let rank = key.len();
    let mut swapped = key.to_vec();
    swapped.swap(rank - 1, rank - 2);
    let k = if extra == Extra::KeyAlreadyTransposed {
        b.input("k", elem, Some(&dims(&swapped)))
    } else {
        let mut key_in = b.input("key", elem, Some(&dims(key)));
        if matches!(extra, Extra::Grouped | Extra::FoldedGroupedKey) {
            key_in = repeated(&mut b, &key_in, key, q[1] / key[1]);
        }
        if matches!(extra, Extra::FoldedKey | Extra::FoldedGroupedKey | Extra::FoldedKeyNotTransposed) {
            let (t, d) = (key[2] as f64, key[3] as f64);
            let folded = b.init("key_folded", tensor(INT64, &[3], &[-1.0, t, d]));
            let x3 = b.node("Reshape", &[&key_in, &folded], vec![]);
            let perm: &[i64] = if extra == Extra::FoldedKeyNotTransposed { &[0, 1, 2] } else { &[0, 2, 1] };
            let turned = b.node("Transpose", &[&x3], vec![attr_ints("perm", perm)]);
            let viewed = b.init("key_viewed", tensor(INT64, &[4], &[key[0] as f64, q[1] as f64, d, t]));
            b.node("Reshape", &[&turned, &viewed], vec![])
        } else {
            let perm: Vec<i64> = (0..rank as i64 - 2).chain([rank as i64 - 1, rank as i64 - 2]).collect();
            b.node("Transpose", &[&key_in], vec![attr_ints("perm", &perm)])
        }
    };
    let mut v_in = b.input("v", elem, Some(&dims(v)));
    if matches!(extra, Extra::Grouped | Extra::FoldedGroupedKey) {
        v_in = repeated(&mut b, &v_in, v, q[1] / v[1]);
    }
    let (q_in, k) = if extra == Extra::ScaledQK {
        let (half, quarter) =
            (b.init("half", tensor(elem, &[], &[0.5])), b.init("quarter", tensor(elem, &[], &[0.25])));
        (b.node("Mul", &[&q_in, &half], vec![]), b.node("Mul", &[&quarter, &k], vec![]))
    } else {
        (q_in, k)
    };
    let mut s = b.node("MatMul", &[&q_in, &k], vec![]);
    let (sq, t) = (q[rank - 2], key[rank - 2]);
    let constant_mask = |b: &mut Builder, rows: i64, fill: f64| {
        let values: Vec<f64> = (0..rows * t).map(|i| if i % 2 == 1 { fill } else { -0.25 * (i % t) as f64 }).collect();
        b.init("bias_mask", tensor(elem, &[1, 1, rows, t][4 - rank..], &values))
    };
    if extra == Extra::ConstantMaskBeforeScale {
        let mask = constant_mask(&mut b, sq, -1e9);
        s = b.node("Add", &[&s, &mask], vec![]);
    }
    let divisor = match extra {
        Extra::Divisor => b.input("d", elem, Some(&[])),
        Extra::NegativeDivisor => b.init("eight", tensor(elem, &[], &[-8.0])),
        _ => b.init("eight", tensor(elem, &[], &[8.0])),
    };
    s = b.node("Div", &[&s, &divisor], vec![]);
    if let Extra::ConstantMask(fill) = extra {
        let mask = constant_mask(&mut b, sq, fill);
        s = b.node("Add", &[&mask, &s], vec![]);
    }
    if extra == Extra::ConstantMaskWiderBatch {
        let values: Vec<f64> = (0..2 * sq * t).map(|i| -0.5 * (i % 3) as f64).collect();
        let mask = b.init("bias_mask", tensor(elem, &[2, 1, sq, t], &values));
        s = b.node("Add", &[&s, &mask], vec![]);
    }
    if extra == Extra::ConstantMask4D {
        let values: Vec<f64> = (0..sq * t).map(|i| -0.25 * (i % t) as f64).collect();
        let mask = b.init("bias_mask", tensor(elem, &[1, 1, sq, t], &values));
        s = b.node("Add", &[&s, &mask], vec![]);
    }
    if extra == Extra::ConstantMaskRow {
        let mask = constant_mask(&mut b, 1, -1e9);
        s = b.node("Add", &[&s, &mask], vec![]);
    }
    if extra == Extra::Mask {
        let mask = b.input("mask", elem, Some(&dims(&[1, 1, sq, t][4 - rank..])));
        s = b.node("Add", &[&s, &mask], vec![]);
    }
    if extra == Extra::Where {
        let keep = b.input("keep", BOOL, Some(&dims(&[1, 1, sq, t][4 - rank..])));
        let fill = b.init("fill", tensor(elem, &[], &[-3.0e38]));
        s = b.node("Where", &[&keep, &s, &fill], vec![]);
    }
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let out = b.node("MatMul", &[&p, &v_in], vec![]);
    b.output(&out, elem, None);
    if extra == Extra::KeyReadElsewhere {
        b.output(&k, elem, None);
    }
    b.model(opset)
}

#[test]
fn attention_is_onnx_attention_from_opset_23() {
    // (q, key, v) shapes: heads in axis 1, folded into the batch (3-D), one shared key/value head.
    let cases: [(&str, [&[i64]; 3], Extra); 10] = [
        ("4-D", [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::Nothing),
        ("constant finite mask", [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::ConstantMask(-1e9)),
        ("constant mask, fill -1e4", [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::ConstantMask(-1e4)),
        ("constant mask, 3-D", [&[8, 5, 8], &[8, 6, 8], &[8, 6, 8]], Extra::ConstantMask(-3e38)),
        ("3-D", [&[8, 5, 8], &[8, 6, 8], &[8, 6, 8]], Extra::Nothing),
        ("one key/value head", [&[2, 4, 5, 8], &[2, 1, 6, 8], &[2, 1, 6, 3]], Extra::Nothing),
        ("key read elsewhere", [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::KeyReadElsewhere),
        // Attention reads the heads before their repeat: grouped heads.
        ("grouped heads", [&[2, 4, 5, 8], &[2, 2, 6, 8], &[2, 2, 6, 8]], Extra::Grouped),
        ("key folded, transposed, viewed back", [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::FoldedKey),
        (
            "grouped key folded, transposed, viewed back",
            [&[2, 4, 5, 8], &[2, 2, 6, 8], &[2, 2, 6, 8]],
            Extra::FoldedGroupedKey,
        ),
    ];
    for (what, shapes, extra) in cases {
        let original = attention_model(23, FLOAT, shapes, extra);
        let (fused, outcome) = fuse_for(&original, Target::Portable);
        assert_eq!(outcome.fused.len(), 1, "{what}: {:?}", outcome.declined);
        let node = all_nodes(&fused).into_iter().find(|n| n.op_type() == "Attention").expect("Attention");
        let mut inputs = vec!["q".to_string(), "key".into(), "v".into()];
        if matches!(extra, Extra::ConstantMask(_)) {
            inputs.push("bias_mask".into()); // handed over as it is: every row computes what the core does
        }
        assert_eq!((node.domain(), node.input.as_slice()), ("", &inputs[..]), "{what}");
        assert_eq!(node.attr_float("scale"), Some(0.125), "{what}: 1/8");
        let heads = (node.attr_int("q_num_heads"), node.attr_int("kv_num_heads"));
        assert_eq!(heads, if shapes[0].len() == 3 { (Some(1), Some(1)) } else { (None, None) }, "{what}");
        let transpose_kept = extra == Extra::KeyReadElsewhere;
        assert_eq!(count_op(&fused, "Transpose"), usize::from(transpose_kept), "{what}");
        let repeats = if matches!(extra, Extra::Grouped | Extra::FoldedGroupedKey) { 6 } else { 0 };
        let folds = if matches!(extra, Extra::FoldedKey | Extra::FoldedGroupedKey) { 2 } else { 0 };
        let removed = if transpose_kept { 4 } else { 5 } + usize::from(inputs.len() == 4) + repeats + folds;
        assert_eq!(fused_list(node).len(), removed, "{what}: {:?}", fused_list(node));
        assert!(fused.functions.is_empty());
        verify_here(&original, &fused);
    }
}

/// SDPA's `enable_gqa` as torch's dynamo decomposition writes it: the
/// key's heads repeated, folded into the batch, transposed and viewed
/// back. For ONNX Runtime too the kernel reads the key before its repeat
/// and its fold, with 2 query heads per key head (the row takes grouped
/// heads), and computes the original.
#[test]
fn a_grouped_key_folded_and_viewed_back_is_the_kernel_for_onnx_runtime() {
    let original = attention_model(23, FLOAT, [&[2, 4, 5, 8], &[2, 2, 6, 8], &[2, 2, 6, 8]], Extra::FoldedGroupedKey);
    let (fused, outcome) = fuse_for(&original, Target::Ort);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let kernel = all_nodes(&fused).into_iter().find(|n| n.op_type() == "Attention").expect("Attention");
    assert_eq!(kernel.input[..3], ["q", "key", "v"], "the key and value before their repeats");
    assert_eq!(count_op(&fused, "Expand"), 0, "the repeats go with the core");
    verify_here(&original, &fused);
}

/// (what, opset, element type, shapes of q, key and v, extra, the reason given)
type NearMiss<'a> = (&'a str, i64, i32, [&'a [i64]; 3], Extra, &'a str);

#[test]
fn attention_that_onnx_attention_does_not_compute_stays_for_portable() {
    let four: [&[i64]; 3] = [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]];
    let cases: [NearMiss; 17] = [
        ("negative scale", 23, FLOAT, four, Extra::NegativeDivisor, "the scale -0.125 is no positive normal f32"),
        ("opset 22", 22, FLOAT, four, Extra::Nothing, "needs opset 23 for Attention (the model imports opset 22)"),
        ("additive mask", 23, FLOAT, four, Extra::Mask, "a masked core: its mask is computed at run time"),
        ("constant mask of lowest", 23, FLOAT, four, Extra::ConstantMask(f64::from(f32::MIN)), "its type's lowest"),
        ("constant mask of -inf", 23, FLOAT, four, Extra::ConstantMask(f64::NEG_INFINITY), "holds -inf"),
        ("constant mask of one row", 23, FLOAT, four, Extra::ConstantMaskRow, "the mask's shape [1, 1, 1, 6]"),
        ("mask before the scale", 23, FLOAT, four, Extra::ConstantMaskBeforeScale, "added before the scale"),
        (
            "constant mask in f16",
            23,
            FLOAT16,
            four,
            Extra::ConstantMask(-1e4),
            "on f32 scores only (these are float16)",
        ),
        (
            "mask of a wider batch",
            23,
            FLOAT,
            [&[1, 4, 5, 8], &[1, 4, 6, 8], &[1, 4, 6, 8]],
            Extra::ConstantMaskWiderBatch,
            "the mask's shape [2, 1, 5, 6]",
        ),
        ("bool keep", 23, FLOAT, four, Extra::Where, "a masked core"),
        // The sum of 3-D scores and a 4-D mask is 4-D: Attention's 3-D output is not.
        (
            "4-D mask on 3-D scores",
            23,
            FLOAT,
            [&[8, 5, 8], &[8, 6, 8], &[8, 6, 8]],
            Extra::ConstantMask4D,
            "the mask's shape [1, 1, 5, 6]",
        ),
        ("divisor computed", 23, FLOAT, four, Extra::Divisor, "the divisor d is computed at run time"),
        ("key already transposed", 23, FLOAT, four, Extra::KeyAlreadyTransposed, "the key k is not a Transpose"),
        ("key folded, not transposed", 23, FLOAT, four, Extra::FoldedKeyNotTransposed, "is not a Transpose"),
        ("bf16", 23, BFLOAT16, four, Extra::Nothing, "f32, f16 and f64 only"),
        // MatMul broadcasts one q head over four key heads; Attention cannot.
        (
            "q heads 1, key heads 4",
            23,
            FLOAT,
            [&[2, 1, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]],
            Extra::Nothing,
            "the heads of q, key and v (1, 4, 4)",
        ),
        (
            "batch broadcast",
            23,
            FLOAT,
            [&[2, 4, 5, 8], &[1, 4, 6, 8], &[1, 4, 6, 8]],
            Extra::Nothing,
            "the batch of q, key and v is not proved equal (2, 1, 1)",
        ),
    ];
    for (what, opset, elem, shapes, extra, reason) in cases {
        let original = attention_model(opset, elem, shapes, extra);
        let (fused, outcome) = fuse_for(&original, Target::Portable);
        assert!(outcome.fused.is_empty(), "{what}: must not fuse");
        assert_eq!(fused, original, "{what}: unchanged");
        assert!(outcome.declined.iter().any(|d| d.reason.contains(reason)), "{what}: {:?}", outcome.declined);
        // The same core is an AttentionCore for ONNX Runtime: only ONNX's Attention cannot say it.
        let (_, ort) = fuse_for(&original, Target::Ort);
        assert_eq!(ort.fused.len(), 1, "{what}: the ort target fuses it");
    }
}

#[test]
fn a_scale_of_q_and_of_the_key_is_the_scale_attention_takes() {
    let original = attention_model(23, FLOAT, [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::ScaledQK);
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let node = all_nodes(&fused).into_iter().find(|n| n.op_type() == "Attention").expect("Attention");
    assert_eq!(node.input, ["q", "key", "v"]);
    assert_eq!(node.attr_float("scale"), Some(0.5 * 0.25 / 8.0));
    assert_eq!(count_op(&fused, "Mul"), 0, "both scales went with the core");
    verify_here(&original, &fused);
    // In f16 the core rounds (or overflows) q·0.5 before its MatMul: not handed over.
    let half = attention_model(23, FLOAT16, [&[2, 4, 5, 8], &[2, 4, 6, 8], &[2, 4, 6, 8]], Extra::ScaledQK);
    let (_, outcome) = fuse_for(&half, Target::Portable);
    assert!(outcome.fused.is_empty(), "f16: {:?}", outcome.fused);
}

#[test]
fn unmasked_opset_23_exports_get_onnx_attention() {
    for name in ["vit_dynamo_op23.onnx", "whisper_encoder_dynamo_op23.onnx"] {
        let original = load(name);
        let (fused, outcome) = fuse_for(&original, Target::Portable);
        assert_eq!((count_op(&fused, "Attention"), outcome.fused.len()), (2, 2), "{name}");
        assert_eq!(count_op(&fused, "Softmax"), 0, "{name}");
        assert_equivalent(&original, &fused, name);
    }
    // TorchScript splits the key's heads and transposes it in one
    // Transpose, [0, 2, 3, 1]: Attention reads the key transposed by
    // [0, 2, 1, 3] instead, a new Transpose of the same input (ViT, DINOv2,
    // HuBERT, SEW and Whisper encoders; OpenVINO and tract compute them
    // the same too, docs/targets.md). The SDPA export also scales q and
    // the transposed key before the MatMul: part of the scale.
    for name in
        ["vit_ts_op17.onnx", "dinov2_ts_op17.onnx", "whisper_encoder_ts_op14.onnx", "whisper_encoder_sdpa_ts_op17.onnx"]
    {
        let (original, _) = onnx_fuse::upgrade::upgrade(&load(name), 23).unwrap();
        let (fused, outcome) = fuse_for(&original, Target::Portable);
        let attentions: Vec<&NodeProto> = nodes(&fused).filter(|n| n.op_type() == "Attention").collect();
        assert_eq!(
            (attentions.len(), outcome.fused.iter().filter(|f| f.pass == "attention").count()),
            (2, 2),
            "{name}"
        );
        for a in attentions {
            let key = nodes(&fused).find(|n| n.output.contains(&a.input[1])).expect("the key's producer");
            assert_eq!((key.op_type(), key.attr_ints("perm")), ("Transpose", Some(&[0, 2, 1, 3][..])), "{name}");
            let x = nodes(&original).find(|n| n.output.contains(&key.input[0])).expect("the key's heads");
            assert_eq!(x.op_type(), "Reshape", "{name}: the heads split, not transposed");
        }
        let swapped = |m: &ModelProto| nodes(m).filter(|n| n.attr_ints("perm") == Some(&[0, 2, 3, 1][..])).count();
        assert_eq!(swapped(&fused) + 2, swapped(&original), "{name}: each key's Transpose went with its core");
        assert_equivalent(&original, &fused, name);
    }
    // torch's nn.MultiheadAttention keeps its heads folded into the batch
    // ([b·h, s, d], no view of the scores): one head of the 3-D form.
    let (original, _) = onnx_fuse::upgrade::upgrade(&load("mha_ts_op17.onnx"), 23).unwrap();
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    let attentions: Vec<&NodeProto> = nodes(&fused).filter(|n| n.op_type() == "Attention").collect();
    assert_eq!((attentions.len(), outcome.fused.len()), (2, 2), "{:?}", outcome.declined);
    for a in attentions {
        assert_eq!((a.attr_int("q_num_heads"), a.attr_int("kv_num_heads")), (Some(1), Some(1)));
    }
    assert_equivalent(&original, &fused, "mha_ts_op17.onnx");
    // ONNX Runtime's row does not take that form (runtimes.rs, batch_heads): the core stays, saying why.
    let (fused, outcome) = fuse_for(&original, Target::Ort);
    assert_eq!((count_op(&fused, "AttentionCore"), count_op(&fused, "Attention")), (2, 0));
    let why = "heads folded into the batch and never split";
    assert!(outcome.fused.iter().all(|f| f.note.as_deref().is_some_and(|n| n.contains(why))), "{:?}", outcome.fused);
    // Masked cores stay as they are, saying why.
    for name in ["llama_dynamo_op23.onnx", "gpt2_dynamo_op23.onnx"] {
        let (fused, outcome) = fuse_for(&load(name), Target::Portable);
        assert_eq!(count_op(&fused, "Attention"), 0, "{name}");
        assert_eq!(outcome.declined.iter().filter(|d| d.reason.starts_with("a masked core")).count(), 2, "{name}");
    }
}
