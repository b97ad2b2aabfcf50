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
        assert!(fused_list(node).len() >= 11, "{name}: {:?}", fused_list(node));
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

/// Each must leave the product as it is.
const NEAR_MISSES: &[&str] = &[
    "nm_cmul_swapped_concat.onnx",
    "nm_cmul_wrong_sign.onnx",
    "nm_cmul_last_axis_3.onnx",
    "nm_cmul_index_1d.onnx",
    "nm_cmul_product_output.onnx",
    "nm_cmul_gather_axis0.onnx",
];

#[test]
fn near_misses_do_not_fuse() {
    for name in NEAR_MISSES {
        let original = load(name);
        let (fused, outcome) = fuse_model(&original, &["complex-mul"]);
        assert!(outcome.fused.is_empty(), "{name}: fused {:?}", outcome.fused);
        assert_eq!(fused, original, "{name}: unchanged");
    }
}
