//! The types a fused output declares (issue 56): ONNX's shape inference
//! does not know ONNX Runtime's ops, so every value after a fused norm
//! would have no type for the tools that type values by it (ONNX Runtime's
//! quantizers). The driver declares what it proved of them: the element
//! type, the shape where proved, a symbolic axis unnamed (named, ONNX
//! Runtime fuses SkipLayerNormalization itself, slower on its CPU);
//! nothing where the type is unknown; what the export declared stays.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use onnx_fuse::onnx::proto::type_proto::Value as TypeValue;
use onnx_fuse::onnx::{ModelProto, OperatorSetIdProto, ValueInfoProto, FLOAT};

/// `x [batch, seq, 4]` → an RMSNorm the rms-norm pass fuses → `MatMul` by a
/// `[4, 3]` weight → `Relu` → the graph output `out` (declared with no shape).
/// `tail` adds nodes after the MatMul, reading `mm`.
fn norm_then_matmul(tail: impl FnOnce(&mut Builder)) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[sym("batch"), sym("seq"), D::N(4)]));
    let y = rms_norm(&mut b, "x", FLOAT, &[0.5, 1.0, 1.5, 2.0]);
    let w = b.init("w", tensor(FLOAT, &[4, 3], &[0.25; 12]));
    b.node_to("MatMul", &[&y, &w], &["mm"], vec![]);
    b.node_to("Relu", &["mm"], &["out"], vec![]);
    b.output("out", FLOAT, None);
    tail(&mut b);
    b.model(14)
}

/// The declaration of `name` in the main graph's value_info, and how many there are.
fn declarations<'a>(model: &'a ModelProto, name: &str) -> Vec<&'a ValueInfoProto> {
    model.graph.as_ref().unwrap().value_info.iter().filter(|v| v.name() == name).collect()
}

/// (element type, each axis as `Some(Ok(n))`, `Some(Err(symbol))` or None), none without a shape.
fn declared_type(vi: &ValueInfoProto) -> (i32, Option<Vec<Option<Result<i64, String>>>>) {
    let Some(TypeValue::TensorType(t)) = vi.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        panic!("{} declares no tensor", vi.name())
    };
    let dims = t.shape.as_ref().map(|s| {
        s.dim
            .iter()
            .map(|d| match &d.value {
                Some(DimValue::DimValue(n)) => Some(Ok(*n)),
                Some(DimValue::DimParam(p)) => Some(Err(p.clone())),
                None => None,
            })
            .collect()
    });
    (t.elem_type(), dims)
}

fn batch_seq(last: i64) -> Option<Vec<Option<Result<i64, String>>>> {
    Some(vec![None, None, Some(Ok(last))])
}

#[test]
fn a_fused_nodes_output_and_the_values_after_it_declare_their_type_and_proved_shape() {
    let (fused, outcome) = fuse_model(&norm_then_matmul(|_| {}), &["rms-norm"]);
    assert_eq!(outcome.fused.len(), 1);
    let norm = all_nodes(&fused).into_iter().find(|n| n.op_type() == "SimplifiedLayerNormalization").unwrap();
    let y = &norm.output[0];
    // The norm's output: ONNX does not know the op.
    let [vi] = declarations(&fused, y)[..] else { panic!("{y} declared other than once") };
    assert_eq!(declared_type(vi), (FLOAT, batch_seq(4)), "symbolic axes unnamed");
    // The MatMul after it: ONNX reaches it no more without the norm's type.
    let [vi] = declarations(&fused, "mm")[..] else { panic!("mm declared other than once") };
    assert_eq!(declared_type(vi), (FLOAT, batch_seq(3)));
    // A graph output is declared already, and stays as the export declared it.
    assert!(declarations(&fused, "out").is_empty());
    let outputs = &fused.graph.as_ref().unwrap().output;
    assert_eq!(outputs.len(), 1);
    assert_eq!(declared_type(&outputs[0]), (FLOAT, None));
}

#[test]
fn what_the_export_declared_stays_as_it_was() {
    // The export declares mm with symbols of its own: kept, not declared again.
    let mut model = norm_then_matmul(|_| {});
    let export = value_info("mm", FLOAT, Some(&[sym("b"), D::Unknown, D::N(3)]));
    model.graph.as_mut().unwrap().value_info.push(export.clone());
    let (fused, _) = fuse_model(&model, &["rms-norm"]);
    assert_eq!(declarations(&fused, "mm"), vec![&export]);
}

#[test]
fn nothing_is_declared_where_the_type_is_unknown() {
    // A value of an op of a domain onnx-fuse knows nothing of: its type is
    // not proved, so it is not declared (nor guessed from its input).
    let mut model = norm_then_matmul(|b| {
        b.node_to("Mystery", &["mm"], &["secret"], vec![]);
        b.graph.node.last_mut().unwrap().domain = Some("com.example".into());
        b.output("secret", FLOAT, None);
        b.node_to("Neg", &["secret"], &["after_secret"], vec![]);
        b.output("after_secret", FLOAT, None);
    });
    model.opset_import.push(OperatorSetIdProto { domain: Some("com.example".into()), version: Some(1) });
    let (fused, outcome) = fuse_model(&model, &["rms-norm"]);
    assert_eq!(outcome.fused.len(), 1);
    let graph = fused.graph.as_ref().unwrap();
    let names: Vec<&str> = graph.value_info.iter().map(|v| v.name()).collect();
    assert!(!names.contains(&"secret") && !names.contains(&"after_secret"), "declared: {names:?}");
    assert!(names.contains(&"mm"), "declared: {names:?}");
}

#[test]
fn a_model_nothing_was_fused_in_gets_no_declarations() {
    let model = norm_then_matmul(|_| {});
    let (fused, outcome) = fuse_model(&model, &["layer-norm"]);
    assert!(outcome.fused.is_empty());
    assert_eq!(fused, model);
}

/// Every value ONNX's inference cannot reach in a real export's output
/// (after its norms, in ONNX Runtime's op) is declared with its element
/// type; Optimum's Llama with past, the export.
#[test]
fn every_value_after_a_fused_norm_of_an_optimum_llama_is_declared() {
    let (original, fused, _) = fuse_with("llama_optimum_past.onnx", &["default"]);
    let graph = fused.graph.as_ref().unwrap();
    let declared: std::collections::HashMap<&str, &ValueInfoProto> =
        graph.input.iter().chain(&graph.output).chain(&graph.value_info).map(|v| (v.name(), v)).collect();
    // What is computed from a fused norm's output, node by node (the list
    // is in dependency order).
    let mut after: Vec<&str> = Vec::new();
    for node in &graph.node {
        if node.op_type() == "SimplifiedLayerNormalization" || node.input.iter().any(|v| after.contains(&v.as_str())) {
            after.extend(node.output.iter().map(String::as_str));
        }
    }
    assert!(after.len() > 100, "{} values after the first norm", after.len());
    let types: std::collections::HashMap<&str, i32> = original
        .graph
        .as_ref()
        .unwrap()
        .value_info
        .iter()
        .map(|v| (v.name(), declared_type(v).0))
        .collect();
    for value in after.iter().filter(|v| !v.is_empty()) {
        let vi = declared.get(value).unwrap_or_else(|| panic!("{value} is not declared"));
        let (elem, _) = declared_type(vi);
        assert!(elem != 0, "{value} declares no element type");
        if let Some(&t) = types.get(value) {
            assert_eq!(elem, t, "{value}: the export declares another type");
        }
    }
}
