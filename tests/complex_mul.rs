//! The complex-mul pass: every exporter form, the node written, near-misses,
//! and proof on the CPU through the reference functions.

mod common;

use common::*;

/// (export, op written, its inputs)
const FORMS: &[(&str, &str, [&str; 2])] = &[
    ("cmul_index_ts_op17.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_index_dynamo_op18.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_index_conj_ts_op17.onnx", "ComplexMulConj", ["a", "b"]),
    ("cmul_index_fp16_ts_op17.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_unbind_ts_op17.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_unbind_dynamo_op18.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_unbind_conj_ts_op17.onnx", "ComplexMulConj", ["a", "b"]),
    ("cmul_slice_ts_op17.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_slice_dynamo_op18.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_slice_conj_ts_op17.onnx", "ComplexMulConj", ["a", "b"]),
    ("cmul_split_ts_op17.onnx", "ComplexMul", ["a", "b"]),
    ("cmul_split_conj_ts_op17.onnx", "ComplexMulConj", ["a", "b"]),
    ("cmul_rotary_ts_op17.onnx", "ComplexMul", ["/Reshape_output_0", "freqs"]),
    ("complex_ComplexMul_decomposed.onnx", "ComplexMul", ["A", "B"]),
    ("complex_ComplexMulConj_decomposed.onnx", "ComplexMulConj", ["A", "B"]),
];

#[test]
fn every_form_becomes_one_node_and_computes_the_same() {
    for &(name, op, inputs) in FORMS {
        let original = load(name);
        let (fused, outcome) = fuse_model(&original, &["default", "complex-mul"]);
        assert_eq!(outcome.fused.len(), 1, "{name}");
        let node =
            all_nodes(&fused).into_iter().find(|n| n.op_type() == op).unwrap_or_else(|| panic!("{name}: no {op}"));
        assert_eq!(node.domain(), "com.microsoft", "{name}");
        assert_eq!(node.input, inputs, "{name}");
        assert!(node.attribute.is_empty(), "{name}");
        assert!(fused.opset_import.iter().any(|o| o.domain() == "com.microsoft" && o.version() == 1), "{name}");
        // Every node the rewrite removed is listed, and nothing else.
        let removed = all_nodes(&original).len() + 1 - all_nodes(&fused).len();
        assert_eq!(fused_list(node).len(), removed, "{name}: {:?}", fused_list(node));
        let v = assert_equivalent(&original, &fused, name);
        assert_eq!(v.reference_ops, [op], "{name}: verified through the reference function");
    }
}

#[test]
fn not_in_the_default_pipeline() {
    let (_, fused, outcome) = fuse("cmul_index_ts_op17.onnx");
    assert!(outcome.fused.is_empty());
    assert_eq!(count_op(&fused, "ComplexMul"), 0);
    let listed = String::from_utf8(run(&["--list-passes"]).stdout).unwrap();
    assert!(listed.lines().any(|l| l.starts_with("complex-mul") && l.contains("on request") && l.contains("CUDA")));
}

#[test]
fn the_report_warns_that_the_output_needs_cuda() {
    let (r, report) = run_with_report("cmul_split_ts_op17.onnx", &["--passes", "default,complex-mul"]);
    assert!(stderr(&r).contains("warning: complex-mul:") && stderr(&r).contains("CUDA execution provider only"));
    assert!(report["cautions"][0].as_str().unwrap().contains("CUDA"));
}

/// Each must leave the product as it is, for the reason --explain gives.
const NEAR_MISSES: &[(&str, &str)] = &[
    ("nm_cmul_swapped_concat.onnx", "the imaginary part is not ai·br − ar·bi"),
    ("nm_cmul_wrong_sign.onnx", "re is Sub and im is Sub: not a complex product"),
    ("nm_cmul_last_axis_3.onnx", "the last axis of a is not proved to be 2 (found 3)"),
    ("nm_cmul_index_1d.onnx", "the Gather index of /Gather_output_0 is not a scalar"),
    ("nm_cmul_product_output.onnx", "/Mul_output_0 is also a graph output"),
    ("nm_cmul_gather_axis0.onnx", "the Gather of /Gather_output_0 is not on the last axis"),
];

#[test]
fn near_misses_do_not_fuse_and_say_why() {
    for &(name, reason) in NEAR_MISSES {
        let original = load(name);
        let (fused, outcome) = fuse_model(&original, &["complex-mul"]);
        assert!(outcome.fused.is_empty(), "{name}: fused {:?}", outcome.fused);
        assert_eq!(fused, original, "{name}: unchanged");
        let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(reason)), "{name}: declined because {reason:?}; said {said:?}");
    }
}

/// The kernels take f32 and f16: the same product in f64 or bf16 is left alone.
#[test]
fn other_element_types_do_not_fuse() {
    use common::build::{attr_int, sym, tensor, Builder, D};
    for elem in [onnx_fuse::onnx::DOUBLE, onnx_fuse::onnx::BFLOAT16] {
        let mut b = Builder::default();
        let dims = [sym("b"), D::N(2)];
        let (a, c) = (b.input("a", elem, Some(&dims)), b.input("c", elem, Some(&dims)));
        let part = |b: &mut Builder, x: &str, i: f64| {
            let index = b.constant(tensor(onnx_fuse::onnx::INT64, &[], &[i]));
            b.node("Gather", &[x, &index], vec![attr_int("axis", -1)])
        };
        let (ar, ai, cr, ci) =
            (part(&mut b, &a, 0.0), part(&mut b, &a, 1.0), part(&mut b, &c, 0.0), part(&mut b, &c, 1.0));
        let (rr, ii) = (b.node("Mul", &[&ar, &cr], vec![]), b.node("Mul", &[&ai, &ci], vec![]));
        let (ri, ir) = (b.node("Mul", &[&ar, &ci], vec![]), b.node("Mul", &[&ai, &cr], vec![]));
        let (re, im) = (b.node("Sub", &[&rr, &ii], vec![]), b.node("Add", &[&ri, &ir], vec![]));
        let axes = b.constant(tensor(onnx_fuse::onnx::INT64, &[1], &[-1.0]));
        let (re, im) = (b.node("Unsqueeze", &[&re, &axes], vec![]), b.node("Unsqueeze", &[&im, &axes], vec![]));
        let out = b.node("Concat", &[&re, &im], vec![attr_int("axis", -1)]);
        b.output(&out, elem, None);
        let (_, outcome) = fuse_model(&b.model(17), &["complex-mul"]);
        assert!(outcome.fused.is_empty(), "type {elem}");
        assert!(
            outcome.declined.iter().any(|d| d.reason.contains("is not f32 or f16")),
            "type {elem}: {:?}",
            outcome.declined
        );
    }
}
