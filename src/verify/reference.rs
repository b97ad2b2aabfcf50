//! Reference functions for ops the CPU execution provider lacks.
//!
//! ONNX Runtime implements `com.microsoft.ComplexMul` and `ComplexMulConj`
//! on CUDA only. To verify a model containing them on the CPU, the
//! verification copy calls a model-local function instead, in a domain of
//! its own, whose body computes the ops' documented semantics with standard
//! operators (the last axis holds real and imaginary parts):
//!
//! - `ComplexMul(A, B)`:     re = ar·br − ai·bi,  im = ar·bi + ai·br
//! - `ComplexMulConj(A, B)`: re = ar·br + ai·bi,  im = ai·br − ar·bi

use crate::onnx::{
    AttributeProto, AttributeType, FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    INT64,
};

const DOMAIN: &str = "onnx_fuse.reference";
const OPS: [&str; 2] = ["ComplexMul", "ComplexMulConj"];

/// Points every CPU-less op at its reference function and adds the
/// functions; returns the op types it substituted.
pub fn substitute(model: &mut ModelProto) -> Vec<String> {
    let mut used: Vec<String> = Vec::new();
    if let Some(g) = model.graph.as_mut() {
        redirect(g, &mut used);
    }
    if used.is_empty() {
        return used;
    }
    used.sort();
    used.dedup();
    let opset = model.default_opset();
    for op in &used {
        model.functions.push(function(op, opset));
    }
    model.opset_import.push(OperatorSetIdProto { domain: Some(DOMAIN.into()), version: Some(1) });
    // Model-local functions need IR version 8.
    model.ir_version = Some(model.ir_version().max(8));
    used
}

fn redirect(graph: &mut GraphProto, used: &mut Vec<String>) {
    for node in &mut graph.node {
        if node.domain() == "com.microsoft" && OPS.contains(&node.op_type()) {
            node.domain = Some(DOMAIN.into());
            used.push(node.op_type().to_string());
        }
        for body in node.subgraphs_mut() {
            redirect(body, used);
        }
    }
}

fn function(op: &str, opset: i64) -> FunctionProto {
    let n = |op_type: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>| NodeProto {
        op_type: Some(op_type.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    };
    let index = |i: i64| {
        let t = TensorProto { dims: vec![1], data_type: Some(INT64), int64_data: vec![i], ..Default::default() };
        vec![AttributeProto {
            name: Some("value".into()),
            r#type: Some(AttributeType::Tensor as i32),
            t: Some(t),
            ..Default::default()
        }]
    };
    let last = || vec![AttributeProto::int("axis", -1)];
    let (re, im) = if op == "ComplexMul" {
        (n("Sub", &["rr", "ii"], "re", vec![]), n("Add", &["ri", "ir"], "im", vec![]))
    } else {
        (n("Add", &["rr", "ii"], "re", vec![]), n("Sub", &["ir", "ri"], "im", vec![]))
    };
    FunctionProto {
        name: Some(op.into()),
        domain: Some(DOMAIN.into()),
        input: vec!["A".into(), "B".into()],
        output: vec!["C".into()],
        node: vec![
            n("Constant", &[], "i0", index(0)),
            n("Constant", &[], "i1", index(1)),
            n("Gather", &["A", "i0"], "ar", last()),
            n("Gather", &["A", "i1"], "ai", last()),
            n("Gather", &["B", "i0"], "br", last()),
            n("Gather", &["B", "i1"], "bi", last()),
            n("Mul", &["ar", "br"], "rr", vec![]),
            n("Mul", &["ai", "bi"], "ii", vec![]),
            n("Mul", &["ar", "bi"], "ri", vec![]),
            n("Mul", &["ai", "br"], "ir", vec![]),
            re,
            im,
            n("Concat", &["re", "im"], "C", last()),
        ],
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        doc_string: Some(format!("Reference semantics of com.microsoft.{op}, for verification on the CPU.")),
        ..Default::default()
    }
}
