//! `--verify`'s verdict rests on what a fusion can be blamed for: each fused
//! node alone, at the tolerance of the type it writes.

mod common;

use common::build::{attr_int, attr_ints, tensor, Builder, D};
use common::*;
use onnx_fuse::onnx::{ModelProto, FLOAT, FLOAT16};
use onnx_fuse::verify;

fn verify_models(original: &ModelProto, fused: &ModelProto) -> verify::Verification {
    let dir = std::path::Path::new(".");
    verify::verify((original, dir), (fused, dir), &verify::Options::default()).unwrap()
}

/// An fp16 RMSNorm between f32 inputs and outputs (onnxconverter-common's
/// keep_io_types), the output scaled up in f32.
fn fp16_with_f32_io() -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4), D::N(64)]));
    let h = b.node("Cast", &[&x], vec![attr_int("to", FLOAT16 as i64)]);
    let two = b.init("two", tensor(FLOAT16, &[], &[2.0]));
    let sq = b.node("Pow", &[&h, &two], vec![]);
    let m = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
    let eps = b.init("eps", tensor(FLOAT16, &[], &[1e-5]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[&h, &r], vec![]);
    let w: Vec<f64> = (0..64).map(|i| 0.5 + i as f64 / 37.0).collect();
    let w = b.init("w", tensor(FLOAT16, &[64], &w));
    let y = b.node("Mul", &[&n, &w], vec![]);
    let out = b.node("Cast", &[&y], vec![attr_int("to", FLOAT as i64)]);
    b.output(&out, FLOAT, None);
    b.model(17)
}

#[test]
fn fp16_nodes_are_judged_at_f16_tolerance_when_outputs_are_f32() {
    let original = fp16_with_f32_io();
    let (fused, outcome) = fuse_model(&original, &["default"]);
    assert_eq!(outcome.fused.len(), 1);
    let v = verify_models(&original, &fused);
    assert!(v.passed, "{}", v.text());
    assert_eq!(v.nodes[0].elem_type, "float16");
    assert!(!v.outputs_decide, "every fused node ran alone");
    // By f32 tolerances the f32 output differs: f16 rounding, not an error.
    assert!(!v.outputs[0].passed, "{}", v.text());
}

#[test]
fn a_small_but_real_error_still_fails() {
    let (original, mut fused, _) = fuse("llama_ts_op14.onnx");
    let target = "/model/model/layers.1/post_attention_layernorm/SimplifiedLayerNormalization";
    let node = fused.graph.as_mut().unwrap().node.iter_mut().find(|n| n.name() == target).unwrap();
    // eps 1e-6 → 3e-6: every value moves by a fraction of a percent.
    node.attribute.iter_mut().find(|a| a.name() == "epsilon").unwrap().f = Some(3e-6);
    let dir = onnx_fuse::io::parent(&testdata("llama_ts_op14.onnx"));
    let v = verify::verify((&original, &dir), (&fused, &dir), &Default::default()).unwrap();
    assert!(!v.passed, "{}", v.text());
    assert_eq!(v.blamed.as_deref(), Some(format!("SimplifiedLayerNormalization {target}").as_str()));
    let worst = &v.nodes[0];
    assert!(!worst.passed && worst.max_rel < 0.05, "small per node: {}", v.text());
}

#[test]
fn a_model_changed_outside_the_fused_nodes_is_judged_by_its_outputs() {
    let (original, mut fused, _) = fuse("llama_ts_op14.onnx");
    // A change no fusion made: a weight no fused node reads.
    let g = fused.graph.as_mut().unwrap();
    let fused_reads: Vec<String> =
        g.node.iter().filter(|n| n.metadata("transmuter.fused").is_some()).flat_map(|n| n.input.clone()).collect();
    let w = g.initializer.iter_mut().find(|t| t.dims.len() == 2 && !fused_reads.contains(&t.name().to_string())).unwrap();
    let mut raw = w.raw_data.clone().unwrap().to_vec();
    raw[3] ^= 0x40;
    w.raw_data = Some(raw.into());
    let v = verify_models_in_testdata(&original, &fused);
    assert!(v.outputs_decide && !v.passed, "{}", v.text());
}

fn verify_models_in_testdata(original: &ModelProto, fused: &ModelProto) -> verify::Verification {
    let dir = onnx_fuse::io::parent(&testdata("llama_ts_op14.onnx"));
    verify::verify((original, &dir), (fused, &dir), &Default::default()).unwrap()
}
