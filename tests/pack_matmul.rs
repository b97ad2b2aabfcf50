//! The pack-matmul pass: the MatMuls of one x by constant weights become
//! one MatMul of the weights side by side and a Split; what else reads x
//! stays as it was.

mod common;

use common::build::{sym, tensor, Builder, D};
use common::*;
use onnx_fuse::io;
use onnx_fuse::onnx::{rows, GraphProto, ModelProto, TensorProto, FLOAT, INT64};
use prost::Message;

/// The values of initializer `name`.
fn values(model: &ModelProto, name: &str) -> Vec<f64> {
    let g: &GraphProto = model.graph.as_ref().unwrap();
    g.initializer.iter().find(|t| t.name() == name).and_then(TensorProto::values).expect("an initializer")
}

/// Row r of the result is row r of each weight `[4, nᵢ]` in turn.
fn rows_side_by_side(model: &ModelProto, weights: &[String]) -> Vec<f64> {
    let parts: Vec<Vec<f64>> = weights.iter().map(|w| values(model, w)).collect();
    (0..4).flat_map(|r| parts.iter().flat_map(move |p| p[r * p.len() / 4..(r + 1) * p.len() / 4].to_vec())).collect()
}

/// x: [b, 3, 4]; each weight [4, n] of distinct values.
fn projections(b: &mut Builder, columns: &[i64]) -> (String, Vec<String>, Vec<String>) {
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(3), D::N(4)]));
    let (mut weights, mut outputs) = (vec![], vec![]);
    for (i, &n) in columns.iter().enumerate() {
        let values: Vec<f64> = (0..4 * n).map(|j| ((i as i64 * 5 + j * 3) % 13) as f64 / 8.0 - 0.7).collect();
        let w = b.init(&format!("w{i}"), tensor(FLOAT, &[4, n], &values));
        let y = b.node("MatMul", &[&x, &w], vec![]);
        b.output(&y, FLOAT, None);
        weights.push(w);
        outputs.push(y);
    }
    (x, weights, outputs)
}

#[test]
fn a_layers_projections_become_one_matmul_of_the_weights_side_by_side() {
    let mut b = Builder::default();
    let (x, weights, outputs) = projections(&mut b, &[4, 2, 2]);
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["pack-matmul"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let g = fused.graph.as_ref().unwrap();
    let split = g.node.iter().find(|n| n.op_type() == "Split").expect("a Split");
    assert_eq!(split.output, outputs, "each product keeps its name");
    assert_eq!(split.attr_int("axis"), Some(-1));
    assert_provenance(split, "", &["MatMul n0_MatMul", "MatMul n1_MatMul", "MatMul n2_MatMul"]);
    let producer = |v: &str| g.node.iter().find(|n| n.output.iter().any(|o| o == v)).unwrap();
    let sizes = producer(&split.input[1]);
    let t = sizes.attribute[0].t.as_ref().unwrap();
    assert_eq!((t.data_type(), &t.int64_data[..]), (INT64, &[4, 2, 2][..]));
    let product = producer(&split.input[0]);
    assert_eq!(product.op_type(), "MatMul");
    assert_eq!(product.input[0], x);
    assert_eq!(count_op(&fused, "MatMul"), 1);
    let packed = g.initializer.iter().find(|t| t.name() == product.input[1]).expect("the packed weight");
    assert_eq!((packed.dims.as_slice(), packed.data_type()), (&[4, 8][..], FLOAT));
    assert_eq!(values(&fused, &product.input[1]), rows_side_by_side(&original, &weights));
    assert_eq!(g.initializer.len(), 1, "the weights nothing reads any more are dropped");
    assert_equivalent(&original, &fused, "projections");
}

/// Only MatMuls of x by a constant 2-D weight join: one by a graph input,
/// by an initializer an input overrides, by a batched weight, or with x
/// on the right is left as it was; a group of one is no candidate.
#[test]
fn a_weight_no_constant_of_two_axes_stays_outside_the_group() {
    let mut b = Builder::default();
    let (x, weights, outputs) = projections(&mut b, &[3, 2]);
    let input = b.input("wi", FLOAT, Some(&[D::N(4), D::N(2)]));
    let by_input = b.node("MatMul", &[&x, &input], vec![]);
    let overridden = b.init("wo", tensor(FLOAT, &[4, 1], &[0.5, -1.0, 2.0, 0.25]));
    b.input(&overridden, FLOAT, Some(&[D::N(4), D::N(1)]));
    let by_overridden = b.node("MatMul", &[&x, &overridden], vec![]);
    let batched = b.init("wb", tensor(FLOAT, &[1, 4, 1], &[0.5, -1.0, 2.0, 0.25]));
    let by_batched = b.node("MatMul", &[&x, &batched], vec![]);
    for y in [&by_input, &by_overridden, &by_batched] {
        b.output(y, FLOAT, None);
    }
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["pack-matmul"]);
    assert_eq!(outcome.fused.len(), 1);
    let split = all_nodes(&fused).into_iter().find(|n| n.op_type() == "Split").unwrap();
    assert_eq!(split.output, outputs);
    let product = all_nodes(&fused).into_iter().find(|n| n.output.contains(&split.input[0])).unwrap();
    assert_eq!(values(&fused, &product.input[1]), rows_side_by_side(&original, &weights), "the two constants, no other");
    assert_eq!(count_op(&fused, "MatMul"), 4, "the packed one and the three left alone");
    assert_equivalent(&original, &fused, "projections");

    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4)]));
    let w = b.init("w", tensor(FLOAT, &[4, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]));
    let square = b.init("s", tensor(FLOAT, &[4, 4], &[0.5; 16]));
    let (y, z) = (b.node("MatMul", &[&x, &w], vec![]), b.node("MatMul", &[&square, &x], vec![]));
    b.output(&y, FLOAT, None);
    b.output(&z, FLOAT, None);
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["pack-matmul"]);
    assert!(outcome.fused.is_empty() && outcome.declined.is_empty(), "{:?}", outcome.declined);
    assert_eq!(fused, original);
}

/// Split takes its sizes as an input from opset 13; below, the group is
/// declined for the opset, which `--opset 13` gives.
#[test]
fn below_opset_13_the_group_waits_for_an_upgrade() {
    let mut b = Builder::default();
    projections(&mut b, &[2, 2]);
    assert_declined(&b.model(12), "needs opset 13 for Split (the model imports opset 12)");
}

/// The model comes out as it went in, declined for `reason` alone.
fn assert_declined(original: &ModelProto, reason: &str) {
    let (fused, outcome) = fuse_model(original, &["pack-matmul"]);
    assert!(outcome.fused.is_empty());
    assert_eq!(&fused, original);
    let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
    assert_eq!(said, [reason]);
}

/// A decoder export: each layer's q, k and v, and its gate and up, as one
/// MatMul each; the model computes the same, and a second run finds
/// nothing more to pack.
#[test]
fn a_decoder_packs_two_groups_a_layer() {
    let name = "llama_optimum_past.onnx";
    let (original, fused, outcome) = fuse_with(name, &["default", "pack-matmul"]);
    let packed: Vec<_> = outcome.fused.iter().filter(|f| f.pass == "pack-matmul").collect();
    let layers = outcome.fused.iter().filter(|f| f.pass == "attention").count();
    assert!(layers > 0);
    assert_eq!(packed.len(), 2 * layers, "{packed:?}");
    for f in &packed {
        assert!(f.replaced.len() == 3 || f.replaced.len() == 2, "{f:?}");
    }
    assert_equivalent(&original, &fused, name);
    let (_, again) = fuse_model(&fused, &["default", "pack-matmul"]);
    assert!(again.fused.is_empty(), "{:?}", again.fused);
}

/// A weight a `Constant` node holds, written just before its MatMul and so
/// after the anchor: its rows join the packed weight, the node goes with
/// the match, and the node list stays sorted (ONNX Runtime requires it in
/// a body).
#[test]
fn weights_held_by_constant_nodes_after_the_anchor_keep_the_list_sorted() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
    let mut outputs = vec![];
    for i in 0..3 {
        let values: Vec<f64> = (0..8).map(|j| (i * 8 + j) as f64 / 10.0).collect();
        let w = b.constant(tensor(FLOAT, &[4, 2], &values));
        let y = b.node("MatMul", &[&x, &w], vec![]);
        let r = b.node("Relu", &[&y], vec![]);
        b.output(&r, FLOAT, None);
        outputs.push(y);
    }
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["pack-matmul"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let g = fused.graph.as_ref().unwrap();
    assert_eq!(count_op(&fused, "Constant"), 1, "the sizes; the weights are one initializer now");
    assert_eq!(g.initializer.len(), 1);
    let mut defined: Vec<&str> = g.input.iter().map(|i| i.name()).collect();
    defined.extend(g.initializer.iter().map(|t| t.name()));
    for n in &g.node {
        for i in &n.input {
            assert!(defined.contains(&i.as_str()), "{} reads {i} before it is computed", n.name());
        }
        defined.extend(n.output.iter().map(String::as_str));
    }
    let split = g.node.iter().find(|n| n.op_type() == "Split").unwrap();
    assert_eq!(split.output, outputs);
    assert_equivalent(&original, &fused, "projections");
}

/// Weights of other rows than the anchor's cannot all multiply x (the
/// model fails where that MatMul runs): declined, with the weights named.
#[test]
fn weights_of_other_rows_are_declined() {
    let mut b = Builder::default();
    let (x, _, _) = projections(&mut b, &[2, 2]);
    let short = b.init("short", tensor(FLOAT, &[3, 2], &[1.0; 6]));
    b.node("MatMul", &[&x, &short], vec![]);
    assert_declined(&b.model(17), "n2_MatMul weighs x by 3 rows of float, the anchor by 4 of float");
}

/// Weights whose bytes are not in the model as raw data (typed fields here;
/// external data in a large model) are read through their Concat, which
/// ONNX Runtime folds where it loads the model.
#[test]
fn weights_not_held_as_raw_bytes_are_packed_by_their_concat() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("b"), D::N(4)]));
    let mut outputs = vec![];
    for (i, n) in [3i64, 2].into_iter().enumerate() {
        let values: Vec<f32> = (0..4 * n).map(|j| (i as i64 * 4 + j) as f32 / 8.0).collect();
        let t = TensorProto { dims: vec![4, n], data_type: Some(FLOAT), float_data: values, ..Default::default() };
        let w = b.init(&format!("w{i}"), t);
        let y = b.node("MatMul", &[&x, &w], vec![]);
        b.output(&y, FLOAT, None);
        outputs.push(y);
    }
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["pack-matmul"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let concat = all_nodes(&fused).into_iter().find(|n| n.op_type() == "Concat").expect("a Concat");
    assert_eq!((concat.input.as_slice(), concat.attr_int("axis")), (&["w0".to_string(), "w1".to_string()][..], Some(1)));
    assert_eq!(fused.graph.as_ref().unwrap().initializer.len(), 2);
    assert_equivalent(&original, &fused, "projections");
}

/// Weights read from a file: the packed weight is described while the
/// rule matches (nothing is copied then) and composed where the model is
/// written, row by row from the input, inside the model and with
/// `--external-data` alike.
#[test]
fn a_packed_weight_of_weights_in_a_file_is_written_as_their_rows() {
    let mut b = Builder::default();
    let (_, weights, _) = projections(&mut b, &[1024, 512, 256]);
    let original = b.model(17);
    let want = rows_side_by_side(&original, &weights);
    let dir = tempdir();
    let input = dir.path().join("in.onnx");
    std::fs::write(&input, original.encode_to_vec()).unwrap();
    let loaded = io::load(&input, Default::default()).unwrap().model;
    let (fused, outcome) = fuse_model(&loaded, &["pack-matmul"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let packed = &fused.graph.as_ref().unwrap().initializer[0];
    assert!(rows::described(packed.raw_data.as_deref().unwrap()), "described, not copied");
    assert_eq!(packed.values().unwrap(), want);
    assert_equivalent(&original, &fused, "projections");
    for apart in [false, true] {
        let out = dir.path().join(format!("out_{apart}.onnx"));
        let mut args = vec![input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--passes", "pack-matmul", "-q"];
        if apart {
            args.push("--external-data");
        }
        let ran = run(&args);
        assert!(ran.status.success(), "{}", stderr(&ran));
        let written = io::load(&out, Default::default()).unwrap().model;
        let t = &written.graph.as_ref().unwrap().initializer[0];
        let bytes = if apart {
            let entry = |key: &str| t.external_data.iter().find(|e| e.key() == key).unwrap().value().parse().unwrap();
            let (offset, length): (usize, usize) = (entry("offset"), entry("length"));
            std::fs::read(dir.path().join(format!("out_{apart}.onnx.data"))).unwrap()[offset..offset + length].to_vec()
        } else {
            t.raw_data.as_deref().unwrap().to_vec()
        };
        let f32s = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()));
        assert_eq!(f32s.map(f64::from).collect::<Vec<f64>>(), want, "--external-data: {apart}");
    }
}
