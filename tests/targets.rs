//! `--target portable`: only operators the model's own opset defines.

mod common;

use common::build::{attr_ints, tensor, Builder, D};
use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::{ModelProto, FLOAT, INT64};
use onnx_fuse::{passes, rewrite};

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
    assert!(outcome.declined.iter().any(|d| d.reason == "needs opset 23 for RMSNormalization (the model imports opset 18)"));
}

#[test]
fn layer_norm_is_portable_from_opset_17() {
    let original = norm_model(17, true);
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(outcome.fused.iter().map(|f| f.op_type.as_str()).collect::<Vec<_>>(), ["LayerNormalization"]);
    verify_here(&original, &fused);
    let (_, outcome) = fuse_for(&load("gpt2_ts_op14.onnx"), Target::Portable);
    assert!(outcome.fused.is_empty(), "{:?}", outcome.fused);
    assert!(outcome.declined.iter().any(|d| d.reason == "needs opset 17 for LayerNormalization (the model imports opset 14)"));
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
        assert!(
            outcome.declined.iter().any(|d| d.reason.contains("portable target")),
            "{name}: says why: {:?}",
            outcome.declined
        );
    }
}

#[test]
fn the_report_names_the_target_and_who_cannot_load_the_ort_output() {
    let (_, ort) = run_with_report("llama_ts_op14.onnx", &["-q"]);
    assert_eq!(ort["target"], "ort");
    let said = ort["not_loaded_by"].as_array().unwrap();
    assert!(said[0].as_str().unwrap().starts_with("OpenVINO and tract"), "{said:?}");
    let (_, portable) = run_with_report("llama_ts_op14.onnx", &["-q", "--target", "portable"]);
    assert_eq!(portable["target"], "portable");
    assert!(portable.get("not_loaded_by").is_none());
}

#[test]
fn an_opset_23_export_gets_onnx_rms_normalization() {
    let original = load("llama_dynamo_op23.onnx");
    let (fused, outcome) = fuse_for(&original, Target::Portable);
    assert_eq!(count_op(&fused, "RMSNormalization"), 5);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization") + count_op(&fused, "AttentionCore"), 0);
    assert_eq!(outcome.fused.len(), 5);
    assert_equivalent(&original, &fused, "llama_dynamo_op23.onnx");
}
