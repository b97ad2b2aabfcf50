//! `--opset N`: every adapter on a hand-made node at its old version,
//! compared with the original through ONNX Runtime at zero tolerance; the
//! refusals, each naming the node and the versions; subgraphs and local
//! functions; untouched nodes byte for byte; the hint a portable run gives.

mod common;

use common::build::{attr_float, attr_graph, attr_int, attr_ints, tensor, value_info, Builder, D};
use common::*;
use onnx_fuse::onnx::{
    AttributeProto, FunctionProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, ValueInfoProto, BOOL, FLOAT,
    INT64,
};
use onnx_fuse::upgrade::{self, Upgrade};
use onnx_fuse::verify;
use prost::Message;

fn dims(d: &[i64]) -> Vec<D> {
    d.iter().map(|&n| D::N(n)).collect()
}

fn attr_string(name: &str, v: &str) -> AttributeProto {
    AttributeProto::string(name, v)
}

/// Upgrades `model` to `to`, proves the result equal to the original in
/// ONNX Runtime at zero tolerance, and returns it with what was done.
fn upgraded(model: &ModelProto, to: i64) -> (ModelProto, Upgrade) {
    let (new, upgrade) = upgrade::upgrade(model, to).unwrap_or_else(|e| panic!("upgrade refused: {e}"));
    assert_eq!(new.opset_import[0].version(), to);
    let dir = tempdir();
    let options = verify::Options { rtol: Some(0.0), atol: Some(0.0), ..Default::default() };
    let v = verify::verify((model, dir.path()), (&new, dir.path()), &options)
        .unwrap_or_else(|e| panic!("verification could not run: {e:#}"));
    assert!(v.passed, "the upgraded model differs:\n{}", v.text());
    (new, upgrade)
}

fn refused(model: &ModelProto, to: i64) -> String {
    match upgrade::upgrade(model, to) {
        Ok(_) => panic!("the upgrade to {to} was not refused"),
        Err(e) => e.to_string(),
    }
}

/// The node computing `output`.
fn producer<'a>(g: &'a GraphProto, output: &str) -> &'a NodeProto {
    g.node.iter().find(|n| n.output.iter().any(|o| o == output)).unwrap_or_else(|| panic!("no node writes {output}"))
}

/// The int64 values of a Constant node's output.
fn constant_ints(g: &GraphProto, value: &str) -> Vec<i64> {
    let node = producer(g, value);
    assert_eq!(node.op_type(), "Constant");
    node.attribute[0].t.as_ref().and_then(|t| t.ints()).expect("int64 constant")
}

fn one_input(b: &mut Builder, shape: &[i64]) -> String {
    b.input("x", FLOAT, Some(&dims(shape)))
}

#[test]
fn reduce_axes_move_to_inputs_and_reduce_all_stays_as_it_is() {
    let mut b = Builder::default();
    let x = one_input(&mut b, &[2, 3, 4]);
    let mean = b.node("ReduceMean", &[&x], vec![attr_ints("axes", &[-1])]);
    let sum = b.node("ReduceSum", &[&x], vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)]);
    let all = b.node("ReduceMax", &[&x], vec![]);
    for (v, d) in [(&mean, vec![2, 3, 1]), (&sum, vec![2, 4]), (&all, vec![1, 1, 1])] {
        b.output(v, FLOAT, Some(&dims(&d)));
    }
    let model = b.model(11);
    let (new, up) = upgraded(&model, 18);
    let g = new.graph.as_ref().unwrap();
    let m = producer(g, &mean);
    assert!(m.attr("axes").is_none());
    assert_eq!(constant_ints(g, &m.input[1]), vec![-1]);
    let s = producer(g, &sum);
    assert_eq!((constant_ints(g, &s.input[1]), s.attr_int("keepdims")), (vec![1], Some(0)));
    // No axes: every axis, in both versions; the node keeps its bytes.
    assert_eq!(producer(g, &all), producer(model.graph.as_ref().unwrap(), &all));
    let ops: Vec<(&str, i64, i64)> =
        up.adapted.iter().map(|a| (a.op_type.as_str(), a.from_version, a.to_version)).collect();
    assert_eq!(ops, [("ReduceMean", 11, 18), ("ReduceSum", 11, 13)]);
    assert_eq!(up.added_nodes, 2);
}

#[test]
fn squeeze_unsqueeze_split_slice_and_topk_read_their_ints_as_inputs() {
    let mut b = Builder::default();
    let x = one_input(&mut b, &[2, 1, 6]);
    let sq = b.node("Squeeze", &[&x], vec![attr_ints("axes", &[1])]);
    let un = b.node("Unsqueeze", &[&sq], vec![attr_ints("axes", &[0, 3])]);
    b.node_to("Split", &[&x], &["part_a", "part_b"], vec![attr_int("axis", 2), attr_ints("split", &[2, 4])]);
    b.node_to("Split", &[&x], &["half_a", "half_b"], vec![attr_int("axis", -1)]);
    let sl = b.node(
        "Slice",
        &[&x],
        vec![attr_ints("starts", &[1]), attr_ints("ends", &[i64::MAX]), attr_ints("axes", &[2])],
    );
    b.node_to("TopK", &[&x], &["top_v", "top_i"], vec![attr_int("k", 2)]);
    for (v, d) in [
        (un.as_str(), vec![1, 2, 6, 1]),
        ("part_a", vec![2, 1, 2]),
        ("part_b", vec![2, 1, 4]),
        ("half_a", vec![2, 1, 3]),
        ("half_b", vec![2, 1, 3]),
        (sl.as_str(), vec![2, 1, 5]),
        ("top_v", vec![2, 1, 2]),
    ] {
        b.output(v, FLOAT, Some(&dims(&d)));
    }
    b.output("top_i", INT64, Some(&dims(&[2, 1, 2])));
    let model = b.model(9);
    let (new, up) = upgraded(&model, 23);
    let g = new.graph.as_ref().unwrap();
    assert_eq!(constant_ints(g, &producer(g, &un).input[1]), vec![0, 3]);
    let sized = producer(g, "part_a");
    assert_eq!((constant_ints(g, &sized.input[1]), sized.attr("num_outputs").is_none()), (vec![2, 4], true));
    // Equal parts: Split-18 is told how many.
    let halves = producer(g, "half_a");
    assert_eq!((halves.input.len(), halves.attr_int("num_outputs")), (1, Some(2)));
    let slice = producer(g, &sl);
    let read: Vec<Vec<i64>> = slice.input[1..].iter().map(|v| constant_ints(g, v)).collect();
    assert_eq!(read, [vec![1], vec![i64::MAX], vec![2]]);
    assert_eq!(constant_ints(g, &producer(g, "top_v").input[1]), vec![2]);
    assert_eq!(up.adapted.len(), 6);
    assert!(up.adapted.iter().all(|a| a.to_version > a.from_version));
}

#[test]
fn clip_6_keeps_clamping_infinities_to_its_default_bounds() {
    // Clip-6 without min clamps -inf to -FLT_MAX; Clip-11 without min
    // would leave it: the adapter writes both bounds out.
    let mut b = Builder::default();
    let x = b.constant(tensor(FLOAT, &[5], &[f64::NEG_INFINITY, -1.0, 0.5, 7.0, f64::INFINITY]));
    let only_max = b.node("Clip", &[&x], vec![common::build::attr_float("max", 2.0)]);
    let plain = b.node("Clip", &[&x], vec![]);
    b.output(&only_max, FLOAT, Some(&dims(&[5])));
    b.output(&plain, FLOAT, Some(&dims(&[5])));
    let model = b.model(9);
    let (new, up) = upgraded(&model, 13);
    let g = new.graph.as_ref().unwrap();
    let clip = producer(g, &plain);
    assert_eq!(clip.input.len(), 3);
    let bound = |v: &str| producer(g, v).attribute[0].t.as_ref().and_then(|t| t.scalar()).unwrap();
    assert_eq!((bound(&clip.input[1]), bound(&clip.input[2])), (f64::from(f32::MIN), f64::from(f32::MAX)));
    assert_eq!(up.adapted.len(), 2);
}

#[test]
fn pad_dropout_batch_norm_and_scatter_take_their_newer_forms() {
    let mut b = Builder::default();
    let x = one_input(&mut b, &[2, 3, 4]);
    let padded =
        b.node("Pad", &[&x], vec![attr_ints("pads", &[0, 1, 0, 0, 2, 1]), common::build::attr_float("value", 1.5)]);
    let reflected = b.node("Pad", &[&x], vec![attr_ints("pads", &[0, 0, 1, 0, 0, 1]), attr_string("mode", "reflect")]);
    let dropped = b.node("Dropout", &[&x], vec![common::build::attr_float("ratio", 0.3)]);
    let scale = b.init("bn_scale", tensor(FLOAT, &[3], &[1.0, 2.0, 0.5]));
    let bias = b.init("bn_bias", tensor(FLOAT, &[3], &[0.0, 1.0, -1.0]));
    let mean = b.init("bn_mean", tensor(FLOAT, &[3], &[0.1, 0.2, 0.3]));
    let var = b.init("bn_var", tensor(FLOAT, &[3], &[1.0, 4.0, 0.25]));
    let normed = b.node("BatchNormalization", &[&x, &scale, &bias, &mean, &var], vec![]);
    let indices = b.init("sc_idx", tensor(INT64, &[2, 1, 1], &[1.0, 3.0]));
    let updates = b.init("sc_upd", tensor(FLOAT, &[2, 1, 1], &[9.0, -9.0]));
    let scattered = b.node("Scatter", &[&x, &indices, &updates], vec![attr_int("axis", 2)]);
    for (v, d) in [(&padded, vec![2, 6, 5]), (&reflected, vec![2, 3, 6]), (&dropped, vec![2, 3, 4])] {
        b.output(v, FLOAT, Some(&dims(&d)));
    }
    b.output(&normed, FLOAT, Some(&dims(&[2, 3, 4])));
    b.output(&scattered, FLOAT, Some(&dims(&[2, 3, 4])));
    let model = b.model(9);
    let (new, up) = upgraded(&model, 23);
    let g = new.graph.as_ref().unwrap();
    let pad = producer(g, &padded);
    assert_eq!(constant_ints(g, &pad.input[1]), vec![0, 1, 0, 0, 2, 1]);
    assert_eq!(producer(g, &pad.input[2]).attribute[0].t.as_ref().and_then(|t| t.scalar()), Some(1.5));
    assert_eq!(producer(g, &reflected).input.len(), 2, "no constant value outside constant mode");
    assert_eq!(producer(g, &dropped).input.len(), 2);
    assert_eq!(producer(g, &scattered).op_type(), "ScatterElements");
    let adapted: Vec<&str> = up.adapted.iter().map(|a| a.op_type.as_str()).collect();
    assert_eq!(adapted, ["Pad", "Pad", "Dropout", "Scatter"]);
}

#[test]
fn softmax_over_a_flattened_input_is_written_as_the_old_computation() {
    let mut b = Builder::default();
    let x = one_input(&mut b, &[2, 3, 4]);
    let flat = b.node("Softmax", &[&x], vec![]); // axis 1 of rank 3: over the 12 values of each row
    let last = b.node("Softmax", &[&x], vec![attr_int("axis", 2)]);
    let log = b.node("LogSoftmax", &[&x], vec![attr_int("axis", 1)]);
    let hard = b.node("Hardmax", &[&x], vec![attr_int("axis", 1)]);
    let unknown = b.input("y", FLOAT, None);
    let unproved = b.node("Softmax", &[&unknown], vec![attr_int("axis", 2)]);
    for v in [&flat, &last, &log, &hard] {
        b.output(v, FLOAT, Some(&dims(&[2, 3, 4])));
    }
    b.output(&unproved, FLOAT, None);
    let model = b.model(12);
    // y has no declared shape: verification needs one.
    let mut runnable = model.clone();
    runnable.graph.as_mut().unwrap().input[1] = value_info("y", FLOAT, Some(&dims(&[2, 3, 4])));
    let (new, up) = upgraded(&runnable, 13);
    let g = new.graph.as_ref().unwrap();
    // Over the last axis: one node, axis -1.
    assert_eq!(producer(g, &last).op_type(), "Softmax");
    assert_eq!(producer(g, &last).attr_int("axis"), Some(-1));
    // Otherwise Flatten, the op over the last axis, Reshape back.
    for v in [&flat, &log, &hard] {
        let reshape = producer(g, v);
        assert_eq!(reshape.op_type(), "Reshape");
        let op = producer(g, &reshape.input[0]);
        assert_eq!(producer(g, &op.input[0]).op_type(), "Flatten");
        assert_eq!(op.attr_int("axis"), Some(-1));
    }
    assert_eq!(up.adapted.len(), 5);
    // Where the rank is not proved, axis 2 may not be the last one.
    let (unshaped, _) = upgrade::upgrade(&model, 13).unwrap();
    assert_eq!(producer(unshaped.graph.as_ref().unwrap(), &unproved).op_type(), "Reshape");
}

#[test]
fn bodies_and_local_functions_are_upgraded_too() {
    let mut body = Builder::default();
    let inner = body.node("ReduceMean", &["x"], vec![attr_ints("axes", &[-1])]);
    body.output(&inner, FLOAT, None);
    let mut other = Builder::default();
    // Axis 1 of x, which the enclosing graph declares [2, 3]: its last axis.
    let softmax = other.node("Softmax", &["x"], vec![attr_int("axis", 1)]);
    other.output(&softmax, FLOAT, None);
    let mut b = Builder::default();
    let x = one_input(&mut b, &[2, 3]);
    let cond = b.input("cond", BOOL, Some(&[]));
    body.graph.name = Some("then".into());
    other.graph.name = Some("else".into());
    let branch =
        b.node("If", &[&cond], vec![attr_graph("then_branch", body.graph), attr_graph("else_branch", other.graph)]);
    b.output(&branch, FLOAT, None);
    b.graph.node.push(NodeProto {
        op_type: Some("SumLast".into()),
        domain: Some("local".into()),
        input: vec![x.clone()],
        output: vec!["summed".into()],
        ..Default::default()
    });
    b.output("summed", FLOAT, None);
    let mut model = b.model(11);
    model.opset_import.push(OperatorSetIdProto { domain: Some("local".into()), version: Some(1) });
    model.functions.push(reduce_sum_function("SumLast", attr_ints("axes", &[-1]), vec![]));
    let (new, up) = upgraded(&model, 18);
    let places: Vec<(&str, &str)> = up.adapted.iter().map(|a| (a.op_type.as_str(), a.graph.as_str())).collect();
    assert_eq!(
        places,
        [
            ("ReduceMean", "main/n0_If.then_branch"),
            ("Softmax", "main/n0_If.else_branch"),
            ("ReduceSum", "function local.SumLast")
        ]
    );
    let g = new.graph.as_ref().unwrap();
    let else_branch = g.node[0].attribute[1].g.as_ref().unwrap();
    assert_eq!(
        (else_branch.node.len(), else_branch.node[0].attr_int("axis")),
        (1, Some(-1)),
        "the rank seen from the body"
    );
    assert_eq!(new.functions[0].opset_import[0].version(), 18);
    assert_eq!(new.functions[0].node.len(), 2, "the axes Constant and the ReduceSum");
}

/// A local function `local.NAME(a) -> s` at opset 11 whose body is one
/// ReduceSum with `axes`; `attributes` are the function's own.
fn reduce_sum_function(name: &str, axes: AttributeProto, attributes: Vec<String>) -> FunctionProto {
    FunctionProto {
        name: Some(name.into()),
        domain: Some("local".into()),
        input: vec!["a".into()],
        output: vec!["s".into()],
        attribute: attributes,
        node: vec![NodeProto {
            op_type: Some("ReduceSum".into()),
            input: vec!["a".into()],
            output: vec!["s".into()],
            attribute: vec![axes],
            ..Default::default()
        }],
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(11) }],
        ..Default::default()
    }
}

fn single(op: &str, inputs: &[&str], outputs: &[&str], attributes: Vec<AttributeProto>, opset: i64) -> ModelProto {
    let mut b = Builder::default();
    for i in inputs.iter().filter(|i| !i.is_empty()) {
        b.input(i, FLOAT, Some(&dims(&[1, 2, 4, 4])));
    }
    b.node_to(op, inputs, outputs, attributes);
    for o in outputs {
        b.output(o, FLOAT, None);
    }
    b.model(opset)
}

#[test]
fn an_upgrade_with_no_exact_adapter_is_refused_naming_the_node_and_versions() {
    let cases = [
        (single("Resize", &["x", "s"], &["y"], vec![], 10), 13, "Resize n0_Resize (main), version 10 to 11"),
        (single("Upsample", &["x", "s"], &["y"], vec![], 9), 13, "Upsample n0_Upsample (main), version 9 to 10"),
        (
            single("GroupNormalization", &["x", "s", "b"], &["y"], vec![attr_int("num_groups", 2)], 18),
            21,
            "GroupNormalization n0_GroupNormalization (main), version 18 to 21",
        ),
        (
            single("BatchNormalization", &["x", "s", "b", "m", "v"], &["y", "rm", "rv", "sm", "sv"], vec![], 9),
            15,
            "version 9 to 14: it has training outputs",
        ),
        (single("Dropout", &["x"], &["y", "mask"], vec![], 7), 12, "version 7 to 10: its mask output changes type"),
        (
            single("ConvTranspose", &["x", "w"], &["y"], vec![attr_string("auto_pad", "SAME_UPPER")], 9),
            11,
            "auto_pad SAME_*",
        ),
        (
            single(
                "MaxPool",
                &["x"],
                &["y"],
                vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[1, 3]), attr_int("ceil_mode", 1)],
                10,
            ),
            22,
            "ceil_mode 1",
        ),
        (single("Gelu", &["x"], &["y"], vec![], 14), 20, "Gelu n0_Gelu (main) is no ONNX operator at opset 14"),
    ];
    for (model, to, says) in cases {
        let e = refused(&model, to);
        assert!(e.starts_with(&format!("cannot upgrade to opset {to}: ")) && e.contains(says), "{e}");
    }
    // Rounded up where no window can start in the end's pad (stride at
    // most the kernel's reach): the same windows at every version.
    for strides in [[2, 2], [1, 2]] {
        let attributes =
            vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &strides), attr_int("ceil_mode", 1)];
        assert!(upgrade::upgrade(&single("MaxPool", &["x"], &["y"], attributes, 10), 22).is_ok(), "{strides:?}");
    }
    // An attribute of another type than the version defines.
    let e = refused(&single("ReduceSum", &["x"], &["y"], vec![attr_int("axes", 1)], 11), 13);
    assert!(
        e.contains("ReduceSum n0_ReduceSum (main), version 11 to 13: its attribute axes is not of type INTS"),
        "{e}"
    );
    // A function body's attribute taken from its caller is not known.
    let mut model = single("Relu", &["x"], &["y"], vec![], 11);
    let by_reference =
        AttributeProto { name: Some("axes".into()), ref_attr_name: Some("dims".into()), ..Default::default() };
    model.functions.push(reduce_sum_function("Sum", by_reference, vec!["dims".into()]));
    let e = refused(&model, 13);
    assert!(
        e.contains("(function local.Sum), version 11 to 13: its attribute axes is the function's attribute dims"),
        "{e}"
    );
    let e = refused(&single("Relu", &["x"], &["y"], vec![], 14), 13);
    assert!(e.contains("never downgrades"), "{e}");
    let e = refused(&single("Relu", &["x"], &["y"], vec![], 6), 13);
    assert!(e.contains("upgrades start from opset 7"), "{e}");
}

#[test]
fn the_cli_refuses_an_upgrade_in_whole_and_writes_nothing() {
    let dir = tempdir();
    let mut model = single("Resize", &["x", "s"], &["y"], vec![], 10);
    // An adaptable node beside the refused one: nothing is upgraded in part.
    let g = model.graph.as_mut().unwrap();
    g.node.push(NodeProto {
        op_type: Some("ReduceSum".into()),
        input: vec!["x".into()],
        output: vec!["r".into()],
        attribute: vec![attr_ints("axes", &[1])],
        ..Default::default()
    });
    g.output.push(value_info("r", FLOAT, None));
    let (input, output) = (dir.path().join("m.onnx"), dir.path().join("out.onnx"));
    std::fs::write(&input, model.encode_to_vec()).unwrap();
    let r = run(&["--opset", "13", input.to_str().unwrap(), "-o", output.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    let said = stderr(&r);
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(said.contains("m.onnx: cannot upgrade to opset 13: Resize n0_Resize (main), version 10 to 11"), "{said}");
    assert!(!output.exists());
    for (args, says) in [(vec!["--opset", "27"], "runs opsets 1 to 26"), (vec!["--opset", "9"], "never downgrades")] {
        let r = run(&[&args[..], &[input.to_str().unwrap(), "-o", output.to_str().unwrap()]].concat());
        assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
        assert!(stderr(&r).contains(says), "{}", stderr(&r));
    }
}

#[test]
fn untouched_nodes_keep_their_bytes() {
    for name in ["llama_ts_op12.onnx", "bert_ts_op14.onnx", "t5_seq2seq_ts_op14.onnx"] {
        let model = load(name);
        let (new, up) = upgrade::upgrade(&model, 23).unwrap();
        let (old, new) = (model.graph.as_ref().unwrap(), new.graph.as_ref().unwrap());
        let adapted: std::collections::HashSet<&str> = up.adapted.iter().map(|a| a.node.as_str()).collect();
        let kept: Vec<Vec<u8>> =
            old.node.iter().filter(|n| !adapted.contains(n.name())).map(|n| n.encode_to_vec()).collect();
        let added = new.node.len() - old.node.len();
        assert_eq!(added, up.added_nodes, "{name}");
        let unchanged: Vec<Vec<u8>> = new
            .node
            .iter()
            .filter(|n| !adapted.contains(n.name()) && !(n.op_type() == "Constant" && n.name().ends_with("_axes")))
            .map(|n| n.encode_to_vec())
            .collect();
        assert_eq!(kept, unchanged, "{name}");
        assert_eq!((old.initializer.len(), &old.input, &old.output), (new.initializer.len(), &new.input, &new.output));
    }
}

#[test]
fn portable_says_which_candidates_need_an_upgrade_and_fuses_them_with_it() {
    let (r, report) = run_with_report("llama_ts_op14.onnx", &["--target", "portable"]);
    // Five RMSNorms and four rotaries.
    assert!(stderr(&r).contains("; 9 candidates need opset 23: add --opset 23"), "{}", stderr(&r));
    assert_eq!(report["needs_opset"], serde_json::json!({"candidates": 9, "opset": 23}));
    assert_eq!(report["fused"].as_array().unwrap().len(), 0);
    let (r, report) = run_with_report("llama_ts_op14.onnx", &["--target", "portable", "--opset", "23", "--verify"]);
    let said = stderr(&r);
    assert!(said.contains("opset 14 -> 23 (5 nodes adapted), fused 9") && !said.contains("need opset"), "{said}");
    assert!(report.get("needs_opset").is_none());
    assert_eq!((report["upgrade"]["from"].as_i64(), report["upgrade"]["to"].as_i64()), (Some(14), Some(23)));
    assert_eq!(report["upgrade"]["adapted"].as_array().unwrap().len(), 5);
    assert_eq!(report["verification"]["passed"], true);
    let ops: Vec<&str> = report["fused"].as_array().unwrap().iter().map(|f| f["op_type"].as_str().unwrap()).collect();
    assert_eq!(ops.iter().filter(|o| **o == "RMSNormalization").count(), 5);
    assert_eq!(ops.iter().filter(|o| **o == "RotaryEmbedding").count(), 4);
    // Counted by running the passes on the upgraded model: a LayerNorm that
    // layer-norm (opset 17) and rms-norm (23, its inner core) both declined
    // is one fusion.
    let (r, report) = run_with_report("bert_ts_op14.onnx", &["--target", "portable"]);
    assert!(stderr(&r).contains("; 7 candidates need opset 23: add --opset 23"), "{}", stderr(&r));
    let (_, upgraded) = run_with_report("bert_ts_op14.onnx", &["--target", "portable", "--opset", "23"]);
    assert_eq!(report["needs_opset"]["candidates"], upgraded["fused"].as_array().unwrap().len());
    // The ort target fuses as usual at the upgraded opset.
    let (_, plain) = run_with_report("llama_ts_op14.onnx", &[]);
    let (_, up) = run_with_report("llama_ts_op14.onnx", &["--opset", "23"]);
    assert_eq!(plain["passes"], up["passes"]);
}

#[test]
fn where_the_everyday_command_keeps_the_opset_each_core_says_why_it_is_not_the_kernel() {
    // GPT-2's dynamo export writes its cores on 4-D heads without a cache,
    // where the kernel gains nothing: no core would be ONNX Attention at
    // opset 23, so the model keeps its opset 18, and each core says what
    // the trial there found.
    let (_, report) = run_with_report("gpt2_dynamo_op18.onnx", &["-q"]);
    assert!(report.get("upgrade").is_none_or(|u| u.is_null()), "{}", report["upgrade"]);
    let cores: Vec<&serde_json::Value> =
        report["fused"].as_array().unwrap().iter().filter(|f| f["pass"] == "attention").collect();
    assert_eq!(cores.len(), 2);
    for core in cores {
        assert_eq!(core["op_type"], "AttentionCore");
        assert_eq!(
            core["note"],
            "not ONNX Attention (tried at opset 23; the model keeps opset 18): neither a KV cache nor grouped \
             heads (no Concat(past, new) on axis 2 or graph input read whole, no heads proved repeated), and the \
             output's heads are not merged into [b, s, h·d] alone: ONNX Runtime's Attention on \
             4-D heads is slower than the MatMuls it replaces here"
        );
    }
    // Upgraded, the cores are the kernel and no such note is left; kept
    // by --keep-opset, no trial is made and nothing is said.
    let (_, upgraded) = run_with_report("llama_ts_op14.onnx", &["-q"]);
    let (_, kept) = run_with_report("gpt2_ts_op14.onnx", &["-q", "--keep-opset"]);
    for report in [&upgraded, &kept] {
        let notes: Vec<&str> = report["fused"].as_array().unwrap().iter().filter_map(|f| f["note"].as_str()).collect();
        assert!(notes.iter().all(|n| !n.starts_with("not ONNX Attention")), "{notes:?}");
    }
    // The Llama's kernels share key and value heads: the report says so,
    // and that OpenVINO does not compile such a kernel whose head counts
    // it does not know (scripts/check_runtimes.py, docs/targets.md).
    let kernels: Vec<&serde_json::Value> =
        upgraded["fused"].as_array().unwrap().iter().filter(|f| f["op_type"] == "Attention").collect();
    assert_eq!(kernels.len(), 2);
    assert!(kernels.iter().all(|f| f["note"] == "grouped heads: 2 query heads per key and value head"));
    let not_loaded: Vec<&str> =
        upgraded["not_loaded_by"].as_array().unwrap().iter().map(|r| r.as_str().unwrap()).collect();
    assert!(not_loaded.iter().any(|r| r.contains("Key input shape not compatible")), "{not_loaded:?}");
    assert!(not_loaded.iter().any(|r| r.starts_with("tract, where two or more If guards")), "{not_loaded:?}");
    assert!(kept["not_loaded_by"].as_array().unwrap().iter().all(|r| !r.as_str().unwrap().contains("If guard")));
}

#[test]
fn a_hint_whose_upgrade_is_refused_says_why() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&dims(&[1, 4, 4, 8])));
    let n = common::build::rms_norm(&mut b, &x, FLOAT, &[1.0; 8]);
    b.output(&n, FLOAT, None);
    // Rounded up with a stride past the kernel: a window may start in the
    // end's pad, which MaxPool-22 drops.
    let strided = vec![attr_ints("kernel_shape", &[2, 2]), attr_ints("strides", &[3, 3]), attr_int("ceil_mode", 1)];
    let pooled = b.node("MaxPool", &[&x], strided);
    b.output(&pooled, FLOAT, None);
    let dir = tempdir();
    let (input, output, json) = (dir.path().join("m.onnx"), dir.path().join("o.onnx"), dir.path().join("r.json"));
    std::fs::write(&input, b.model(14).encode_to_vec()).unwrap();
    let r = run(&[
        "--target",
        "portable",
        input.to_str().unwrap(),
        "-o",
        output.to_str().unwrap(),
        "--report-json",
        json.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let said = stderr(&r);
    assert!(
        said.contains(
            "; candidates need opset 23, and the model cannot be upgraded to it: cannot upgrade to opset 23: MaxPool"
        ),
        "{said}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(
        (report["needs_opset"]["opset"].as_i64(), report["needs_opset"]["candidates"].as_i64()),
        (Some(23), Some(0))
    );
    assert!(report["needs_opset"]["refused"].as_str().unwrap().contains("ceil_mode 1"));
}

/// Ground rule 6 under `--opset`: a fused node's provenance names nodes of
/// the exported model only, never a `Constant` (or Flatten/Reshape) the
/// upgrade added; an adapted node keeps its name and stands for its
/// original. Every export, every pass, both targets.
#[test]
fn provenance_after_an_upgrade_names_only_exported_nodes() {
    let every: Vec<String> = onnx_fuse::passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipeline = onnx_fuse::passes::pipeline(&every, &[]).unwrap();
    let mut lists = 0;
    for name in exports() {
        let model = load(&name);
        let exported: std::collections::HashSet<String> =
            all_nodes(&model).iter().map(|n| n.name().to_string()).collect();
        let (up, upgrade) = upgrade::upgrade(&model, 23).unwrap();
        for target in [onnx_fuse::graph::Target::Ort, onnx_fuse::graph::Target::Portable] {
            let mut fused = up.clone();
            let outcome = onnx_fuse::rewrite::run_upgraded(&mut fused, &pipeline, target, upgrade.added.clone());
            for f in outcome.fused.iter().chain(outcome.absorbed.iter().map(|a| &a.fused)) {
                for entry in &f.replaced {
                    let (_, node) = entry.split_once(' ').unwrap();
                    assert!(
                        exported.contains(node),
                        "{name}: {} {} names {entry}, not in the export",
                        f.op_type,
                        f.name
                    );
                }
                lists += 1;
            }
        }
    }
    assert!(lists > 300, "{lists} provenance lists");
}

/// A node outside its op's arity that an adapter would rewrite has no
/// version-N form: the upgrade is refused naming it, never a panic; one no
/// change reaches keeps its bytes.
#[test]
fn a_malformed_node_is_refused_not_adapted() {
    let softmax = single("Softmax", &[], &["y"], vec![attr_int("axis", 1)], 11);
    let said = refused(&softmax, 13);
    assert!(said.contains("Softmax") && said.contains("malformed (Softmax"), "{said}");
    let reduce = single("ReduceMean", &["x", "extra"], &["y"], vec![attr_ints("axes", &[-1])], 11);
    let said = refused(&reduce, 18);
    assert!(said.contains("malformed (ReduceMean") && said.contains("has 2 inputs where its op takes 1"), "{said}");
    let relu = single("Relu", &["x", "extra"], &["y"], vec![], 11);
    let (up, _) = upgrade::upgrade(&relu, 13).unwrap();
    assert_eq!(up.graph, relu.graph, "no change reaches Relu between 11 and 13");
}

/// Whether ONNX Runtime loads and runs `model` (on inputs of its own).
fn onnx_runtime_runs(model: &ModelProto) -> Result<(), String> {
    let dir = std::env::temp_dir();
    let (a, b) = ((model, dir.as_path()), (model, dir.as_path()));
    verify::verify(a, b, &verify::Options::default()).map(|_| ()).map_err(|e| format!("{e:#}"))
}

/// The versions the upgrade refuses because the pinned ONNX Runtime's CPU
/// provider has no kernel for them (src/upgrade/changes.rs), each with a
/// node ONNX Runtime runs at opset 21 (some random ops made certain: a
/// range of 0, probabilities 0, one logit): the kernel fact (at
/// opset 22 it does not load) and the refusal. When a release of ONNX
/// Runtime adds one, this test fails and the refusal goes.
#[test]
fn versions_onnx_runtime_cannot_run_are_not_written() {
    type Build = fn(&mut Builder, &str);
    let cases: [(&str, Build); 9] = [
        ("RandomUniformLike", |b, x| {
            b.node_to("RandomUniformLike", &[x], &["y"], vec![attr_float("low", 0.0), attr_float("high", 0.0)])
        }),
        ("RandomNormalLike", |b, x| b.node_to("RandomNormalLike", &[x], &["y"], vec![])),
        ("RandomUniform", |b, _| {
            let attributes = vec![attr_ints("shape", &[2, 3]), attr_float("low", 0.0), attr_float("high", 0.0)];
            b.node_to("RandomUniform", &[], &["y"], attributes)
        }),
        ("RandomNormal", |b, _| b.node_to("RandomNormal", &[], &["y"], vec![attr_ints("shape", &[2, 3])])),
        ("Bernoulli", |b, _| b.node_to("Bernoulli", &["never"], &["y"], vec![])),
        ("Multinomial", |b, _| b.node_to("Multinomial", &["one_logit"], &["y"], vec![])),
        ("RoiAlign", |b, x| b.node_to("RoiAlign", &[x, "rois", "batch_indices"], &["y"], vec![])),
        ("MaxRoiPool", |b, x| b.node_to("MaxRoiPool", &[x, "rois5"], &["y"], vec![attr_ints("pooled_shape", &[2, 2])])),
        ("GlobalLpPool", |b, x| b.node_to("GlobalLpPool", &[x], &["y"], vec![])),
    ];
    for (op, build) in cases {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&dims(&[1, 1, 4, 4])));
        b.init("never", tensor(FLOAT, &[2, 3], &[0.0; 6]));
        b.init("one_logit", tensor(FLOAT, &[1, 3], &[0.0, -1e30, -1e30]));
        b.init("rois", tensor(FLOAT, &[1, 4], &[0.0, 0.0, 2.0, 2.0]));
        b.init("batch_indices", tensor(INT64, &[1], &[0.0]));
        b.init("rois5", tensor(FLOAT, &[1, 5], &[0.0, 0.0, 0.0, 2.0, 2.0]));
        build(&mut b, &x);
        b.graph.output.push(ValueInfoProto { name: Some("y".into()), ..Default::default() });
        let mut model = b.model(21);
        model.ir_version = Some(10);
        // (The random ones run, and differ from run to run.)
        let ran = onnx_runtime_runs(&model).map_or_else(|e| e.contains("gives other values when run again"), |()| true);
        assert!(ran, "{op} at opset 21: {:?}", onnx_runtime_runs(&model));
        let mut at_22 = model.clone();
        at_22.opset_import[0].version = Some(22);
        let e = onnx_runtime_runs(&at_22).expect_err(op);
        assert!(e.contains("Could not find an implementation"), "{op}: {e}");
        let e = refused(&model, 23);
        assert!(e.contains(&format!("{op} ")) && e.contains("has no kernel for this version"), "{e}");
    }
}

/// ONNX Runtime aborts the process on a normal distribution of spread 0:
/// `--verify` refuses the model with an error before any session.
#[test]
fn a_normal_distribution_of_no_spread_is_refused_before_onnx_runtime_aborts() {
    for scale in [0.0, -1.0] {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&dims(&[2, 3])));
        b.node_to("RandomNormalLike", &[&x], &["y"], vec![attr_float("scale", scale)]);
        b.output("y", FLOAT, None);
        let e = onnx_runtime_runs(&b.model(17)).expect_err("refused");
        assert!(e.contains("has scale") && e.contains("ONNX Runtime aborts"), "{e}");
    }
}

/// A model the upgrade to opset 23 is refused for keeps its opset, its
/// cores `AttentionCore`, each saying why: it loads where the original
/// does (a RandomUniformLike-22 would not).
#[test]
fn where_the_kernel_upgrade_is_refused_each_core_says_why() {
    let mut model = load("llama_ts_op14.onnx");
    let g = model.graph.as_mut().unwrap();
    let ids = g.input[0].name().to_string();
    g.node.push(NodeProto {
        op_type: Some("RandomUniformLike".into()),
        name: Some("noise".into()),
        input: vec![ids],
        output: vec!["noise".into()],
        attribute: vec![attr_int("dtype", FLOAT as i64)],
        ..Default::default()
    });
    g.output.push(ValueInfoProto { name: Some("noise".into()), ..Default::default() });
    let dir = tempdir();
    let (input, out, json) = (dir.path().join("in.onnx"), dir.path().join("out.onnx"), dir.path().join("r.json"));
    std::fs::write(&input, model.encode_to_vec()).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", json.to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cores: Vec<&serde_json::Value> =
        report["fused"].as_array().unwrap().iter().filter(|f| f["pass"] == "attention").collect();
    assert_eq!(cores.len(), 2);
    for core in cores {
        assert_eq!(core["op_type"], "AttentionCore");
        let note = core["note"].as_str().unwrap();
        assert!(
            note.starts_with("not ONNX Attention (the model keeps opset 14): cannot upgrade to opset 23: ")
                && note.contains("RandomUniformLike noise (main), version 1 to 22")
                && note.contains("has no kernel for this version"),
            "{note}"
        );
    }
    let written = onnx_fuse::io::load(&out, Default::default()).unwrap().model;
    assert_eq!(written.default_opset(), 14);
}
