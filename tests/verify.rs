//! `--verify`'s verdict rests on what a fusion can be blamed for: each fused
//! node alone, at the tolerance of the type it writes.

mod common;

use common::build::{attr_graph, attr_int, attr_ints, rms_norm, tensor, Builder, D};
use common::*;
use onnx_fuse::onnx::{ModelProto, FLOAT, FLOAT16};
use onnx_fuse::verify;

fn verify_models(original: &ModelProto, fused: &ModelProto) -> verify::Verification {
    let dir = std::env::temp_dir();
    let dir = dir.as_path();
    verify::verify((original, dir), (fused, dir), &verify::Options::default()).unwrap()
}

/// Why `model` cannot be verified against itself (it must not run).
fn cannot_verify(model: &ModelProto) -> String {
    let dir = std::env::temp_dir();
    format!("{:#}", verify::verify((model, &dir), (model, &dir), &verify::Options::default()).unwrap_err())
}

/// An fp16 RMSNorm between f32 inputs and outputs (onnxconverter-common's
/// keep_io_types), the output scaled up in f32.
fn fp16_with_f32_io() -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4), D::N(64)]));
    let h = b.node("Cast", &[&x], vec![attr_int("to", FLOAT16 as i64)]);
    let y = rms_norm(&mut b, &h, FLOAT16, &(0..64).map(|i| 0.5 + i as f64 / 37.0).collect::<Vec<_>>());
    let out = b.node("Cast", &[&y], vec![attr_int("to", FLOAT as i64)]);
    b.output(&out, FLOAT, None);
    b.model(17)
}

#[test]
fn fp16_nodes_are_judged_at_f16_tolerance_when_outputs_are_f32() {
    let original = fp16_with_f32_io();
    let (fused, outcome) = fuse_model(&original, &["default", "skip-norm"]);
    assert_eq!(outcome.fused.len(), 1);
    let v = verify_models(&original, &fused);
    assert!(v.passed, "{}", v.text());
    assert_eq!(v.nodes[0].elem_type, "float16");
    assert!(!v.outputs_decide, "every fused node ran alone");
    // The f32 output differs beyond f32's tolerances: f16 rounding, not an
    // error. Computed from an f16 node, it is judged at f16's.
    let out = &v.outputs[0];
    assert!(out.max_abs > 1e-4 && out.max_rel > 1e-4, "{}", v.text());
    assert!(out.passed && out.tolerance.rtol == 1e-2, "{}", v.text());
}

/// Where the graph outputs decide (the models differ outside the fused
/// nodes: here twins the cleanup made one), an
/// f32 output computed from an f16 fused node carries its rounding and is
/// judged at f16's tolerance; one that no fused node computes stays at f32's.
#[test]
fn an_f32_output_computed_from_an_f16_fused_node_is_judged_at_f16_tolerance() {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4), D::N(64)]));
    let h = b.node("Cast", &[&x], vec![attr_int("to", FLOAT16 as i64)]);
    let sq = b.node("Mul", &[&h, &h], vec![]);
    let m = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
    let eps = b.init("eps", tensor(FLOAT16, &[], &[1e-3]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[&h, &r], vec![]);
    let out = b.node("Cast", &[&n], vec![attr_int("to", FLOAT as i64)]);
    b.output(&out, FLOAT, None);
    // Twins outside the norm, which the cleanup makes one: the models
    // differ there, and the graph outputs decide.
    let (neg, twin) = (b.node("Neg", &[&x], vec![]), b.node("Neg", &[&x], vec![]));
    let plain = b.node("Add", &[&neg, &twin], vec![]);
    b.output(&plain, FLOAT, None);
    let original = b.model(17);
    let (mut fused, outcome) = fuse_model(&original, &["rms-norm"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    onnx_fuse::cleanup::clean(&mut fused);
    let v = verify_models(&original, &fused);
    assert!(v.outputs_decide && v.passed, "{}", v.text());
    let (norm, plain) = (&v.outputs[0], &v.outputs[1]);
    assert!(norm.max_abs > 1e-4 && norm.tolerance.rtol == 1e-2, "{}", v.text());
    assert_eq!(plain.tolerance.rtol, 1e-4, "{}", v.text());
}

#[test]
fn a_small_but_real_error_still_fails() {
    let (original, mut fused, _) = fuse("llama_ts_op14.onnx");
    let target = "/model/model/layers.1/post_attention_layernorm/SkipSimplifiedLayerNormalization";
    let node = fused.graph.as_mut().unwrap().node.iter_mut().find(|n| n.name() == target).unwrap();
    // eps 1e-6 → 3e-6: every value moves by a fraction of a percent.
    node.attribute.iter_mut().find(|a| a.name() == "epsilon").unwrap().f = Some(3e-6);
    let dir = onnx_fuse::io::parent(&testdata("llama_ts_op14.onnx"));
    let v = verify::verify((&original, &dir), (&fused, &dir), &Default::default()).unwrap();
    assert!(!v.passed, "{}", v.text());
    assert_eq!(v.blamed.as_deref(), Some(format!("SkipSimplifiedLayerNormalization {target}").as_str()));
    let worst = &v.nodes[0];
    assert!(!worst.passed && worst.max_rel < 0.05, "small per node: {}", v.text());
}

#[test]
fn a_comparison_atol_decided_says_so() {
    // x against x + 1e-6: within atol (1e-5) everywhere, within rtol (1e-4)
    // only where |x| ≥ 0.01.
    let model = |shift: f64| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[D::N(4096)]));
        let c = b.init("c", tensor(FLOAT, &[], &[shift]));
        let y = b.node("Add", &[&x, &c], vec![]);
        b.output(&y, FLOAT, None);
        b.model(17)
    };
    let v = verify_models(&model(0.0), &model(1e-6));
    assert!(v.passed, "{}", v.text());
    let near_zero = v.outputs[0].within_by_atol;
    assert!(near_zero > 0 && near_zero < 200, "about 1% of 4096: {}", v.text());
    assert!(v.text().contains(&format!("; atol decided {near_zero} of 4096 elements")), "{}", v.text());
    // Where rtol alone decides, nothing is said.
    let v = verify_models(&model(0.0), &model(0.0));
    assert_eq!(v.outputs[0].within_by_atol, 0);
    assert!(!v.text().contains("atol decided"), "{}", v.text());
}

#[test]
fn a_model_changed_outside_the_fused_nodes_is_judged_by_its_outputs() {
    let (original, mut fused, _) = fuse("llama_ts_op14.onnx");
    // A change no fusion made: a weight no fused node reads.
    let g = fused.graph.as_mut().unwrap();
    let fused_reads: Vec<String> =
        g.node.iter().filter(|n| n.metadata("transmuter.fused").is_some()).flat_map(|n| n.input.clone()).collect();
    let w =
        g.initializer.iter_mut().find(|t| t.dims.len() == 2 && !fused_reads.contains(&t.name().to_string())).unwrap();
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

/// A tiny ViT-like model: image sides symbolic, the patch grid fixed by a
/// position table of 9 rows and a Reshape to 3 × 3 patches.
fn patch_grid_model() -> ModelProto {
    let mut b = Builder::default();
    let y = patch_grid(&mut b, D::N(3));
    b.output(&y, FLOAT, None);
    b.model(17)
}

/// The norm of the patch grid of an image with `channels` channels.
fn patch_grid(b: &mut Builder, channels: D) -> String {
    use common::build::sym;
    let x = b.input("pixel_values", FLOAT, Some(&[sym("batch"), channels, sym("height"), sym("width")]));
    let w = b.init("patch_w", tensor(FLOAT, &[8, 3, 4, 4], &vec![0.01; 8 * 3 * 16]));
    let patches = b.node("Conv", &[&x, &w], vec![attr_ints("strides", &[4, 4]), attr_ints("kernel_shape", &[4, 4])]);
    let flat_shape = b.init("flat", tensor(onnx_fuse::onnx::INT64, &[3], &[0.0, 8.0, -1.0]));
    let flat = b.node("Reshape", &[&patches, &flat_shape], vec![]);
    let tokens = b.node("Transpose", &[&flat], vec![attr_ints("perm", &[0, 2, 1])]);
    let grid = b.init("grid", tensor(onnx_fuse::onnx::INT64, &[4], &[0.0, 3.0, 3.0, 8.0]));
    let x = b.node("Reshape", &[&tokens, &grid], vec![]);
    let pos = b.init("pos", tensor(FLOAT, &[9, 8], &(0..72).map(|i| i as f64 / 72.0).collect::<Vec<_>>()));
    let pos_grid = b.init("pos_grid", tensor(onnx_fuse::onnx::INT64, &[4], &[1.0, 3.0, 3.0, 8.0]));
    let pos = b.node("Reshape", &[&pos, &pos_grid], vec![]);
    let x = b.node("Add", &[&x, &pos], vec![]);
    rms_norm(b, &x, FLOAT, &[1.0; 8])
}

#[test]
fn sizes_an_image_needs_together_are_found_run_by_run() {
    // Channels 3 and sides of 12 (3 × 3 patches of 4) for the image, and
    // for a second input a length of 1 or 4 (a table of 4 rows): no one
    // size fits every symbol, and no symbol alone makes the model run.
    // The search keeps each change that gets the run further.
    use common::build::sym;
    let mut b = Builder::default();
    let y = patch_grid(&mut b, sym("num_channels"));
    b.output(&y, FLOAT, None);
    let t = b.input("tokens", FLOAT, Some(&[sym("sequence"), D::N(8)]));
    let table = b.init("table", tensor(FLOAT, &[4, 8], &[0.5; 32]));
    let t = b.node("Add", &[&t, &table], vec![]);
    b.output(&t, FLOAT, None);
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["default"]);
    assert_eq!(outcome.fused.len(), 1);
    let v = verify_models(&original, &fused);
    assert!(v.passed, "{}", v.text());
    assert_eq!((v.dims["num_channels"], v.dims["height"], v.dims["width"]), (3, 12, 12));
    assert!([1, 4].contains(&v.dims["sequence"]), "{:?}", v.dims);
}

#[test]
fn a_model_no_size_runs_names_only_the_dims_its_failure_reads_and_how_far_it_got() {
    // The image's branch runs at channels 3 and sides 12, then a Reshape no
    // size satisfies; an unrelated input's symbol is not named.
    use common::build::sym;
    let mut b = Builder::default();
    let y = patch_grid(&mut b, sym("num_channels"));
    let shape = b.init("odd", tensor(onnx_fuse::onnx::INT64, &[2], &[5.0, 7.0]));
    let y = b.node("Reshape", &[&y, &shape], vec![]);
    b.output(&y, FLOAT, None);
    let other = b.input("other", FLOAT, Some(&[sym("other_length")]));
    let other = b.node("Relu", &[&other], vec![]);
    b.output(&other, FLOAT, None);
    let e = cannot_verify(&b.model(17));
    // The channels are the Conv weight's (3), proved, not asked for.
    assert!(e.contains("--dim NAME=VALUE for batch, height, width ("), "{e}");
    assert!(!e.contains("other_length"), "{e}");
    assert!(e.contains("measured: with --dim height=12 --dim width=12 the run gets as far as"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn image_sides_come_from_the_patch_grid_the_graph_fixes() {
    let original = patch_grid_model();
    let (fused, outcome) = fuse_model(&original, &["default", "skip-norm"]);
    assert_eq!(outcome.fused.len(), 1);
    let v = verify_models(&original, &fused);
    assert!(v.passed, "{}", v.text());
    assert_eq!((v.dims["height"], v.dims["width"]), (12, 12), "3 × 3 patches of 4");
}

#[test]
fn sizes_nothing_suggests_are_asked_for_by_name() {
    // Two rows of seq into 5 × 7: no seq runs it.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[common::build::sym("seq"), D::N(2)]));
    let shape = b.init("shape", tensor(onnx_fuse::onnx::INT64, &[2], &[5.0, 7.0]));
    let y = b.node("Reshape", &[&x, &shape], vec![]);
    b.output(&y, FLOAT, None);
    let e = cannot_verify(&b.model(17));
    assert!(e.contains("--dim NAME=VALUE for seq") && e.contains("seq=7"), "{e}");
}

#[test]
fn a_size_the_shapes_prove_is_taken_as_given() {
    // seq elements into 5 × 7: every run has seq = 35, which the shapes
    // prove from the Reshape's element counts; no default or search finds it.
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[common::build::sym("seq")]));
    let shape = b.init("shape", tensor(onnx_fuse::onnx::INT64, &[2], &[5.0, 7.0]));
    let y = b.node("Reshape", &[&x, &shape], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(17);
    let v = verify_models(&model, &model);
    assert!(v.passed, "{}", v.text());
    assert_eq!(v.dims["seq"], 35);
}

#[test]
fn an_einsum_that_onnx_runtime_would_abort_on_is_an_error_not_an_abort() {
    // q declares no shape, so a scalar is fed, where the equation reads 4
    // axes: ONNX Runtime 1.31.1 terminates the process on such an Einsum.
    // Also inside an If's branch, reading q from outside.
    let einsum = |b: &mut Builder| {
        b.node("Einsum", &["q", "k"], vec![common::build::attr_string("equation", "bhse,bhet->bhst")])
    };
    for nested in [false, true] {
        let mut b = Builder::default();
        b.input("q", FLOAT, None);
        b.input("k", FLOAT, Some(&[D::N(1), D::N(2), D::N(4), D::N(3)]));
        let s = if nested {
            let mut body = Builder::default();
            let s = einsum(&mut body);
            body.output(&s, FLOAT, None);
            let body = onnx_fuse::onnx::GraphProto { name: Some("branch".into()), ..body.graph };
            let c = b.input("c", onnx_fuse::onnx::BOOL, Some(&[]));
            let branches = vec![attr_graph("then_branch", body.clone()), attr_graph("else_branch", body)];
            b.node_to("If", &[&c], &["s"], branches);
            "s".to_string()
        } else {
            einsum(&mut b)
        };
        b.output(&s, FLOAT, None);
        let e = cannot_verify(&b.model(14));
        assert!(e.contains("Einsum n0_Einsum reads q of rank 0 where its equation has 4 letters"), "{e}");
    }
}

#[test]
fn integers_of_8_16_and_32_bits_and_u64_are_fed_and_compared() {
    // A quantized model's ops: u8 dequantized, and each other integer type
    // added to itself, an output of each type.
    use onnx_fuse::onnx::DataType;
    let mut b = Builder::default();
    let x = b.input("x", DataType::Uint8 as i32, Some(&[D::N(4)]));
    let (scale, zero) = (b.init("scale", common::build::tensor(FLOAT, &[], &[0.5])), "zero".to_string());
    b.init(&zero, common::build::tensor(DataType::Uint8 as i32, &[], &[3.0]));
    let y = b.node("DequantizeLinear", &[&x, &scale, &zero], vec![]);
    b.output(&y, FLOAT, None);
    for t in [DataType::Int8, DataType::Uint8, DataType::Int16, DataType::Uint16, DataType::Uint32, DataType::Uint64] {
        let name = format!("{t:?}").to_lowercase();
        let x = b.input(&name, t as i32, Some(&[D::N(3)]));
        let y = b.node("Add", &[&x, &x], vec![]);
        b.output(&y, t as i32, None);
    }
    let model = b.model(19);
    let v = verify_models(&model, &model);
    assert!(v.passed, "{:?}", v.outputs);
    assert_eq!(v.outputs.len(), 7, "{:?}", v.outputs);
    // Read from --inputs as the input's type, and only as it.
    let dir = tempdir();
    let feeds = dir.path().join("bytes.npz");
    {
        use npyz::WriterBuilder;
        let mut w = npyz::npz::NpzWriter::create(&feeds).unwrap();
        let mut a = w.array("x", Default::default()).unwrap().default_dtype().shape(&[4]).begin_nd().unwrap();
        a.extend([0u8, 3, 200, 255]).unwrap();
        a.finish().unwrap();
    }
    assert!(compare(&model, &model, &feeds).unwrap().passed);
    npz(&feeds, &[], &[("x", vec![4], vec![0, 3, 200, 255])]);
    let e = format!("{:#}", compare(&model, &model, &feeds).unwrap_err());
    assert!(e.contains("does not match the input's type"), "{e}");
}

/// ONNX's test_if_opt: an `If` whose then-branch returns an absent optional
/// sequence, its else-branch one of a constant.
fn if_optional() -> ModelProto {
    use onnx_fuse::onnx::proto::type_proto;
    use onnx_fuse::onnx::{AttributeProto, AttributeType, GraphProto, TypeProto, ValueInfoProto};
    let tensor_type = TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(FLOAT), shape: None })),
        ..Default::default()
    };
    let sequence = TypeProto {
        value: Some(type_proto::Value::SequenceType(Box::new(type_proto::Sequence {
            elem_type: Some(Box::new(tensor_type)),
        }))),
        ..Default::default()
    };
    let optional = TypeProto {
        value: Some(type_proto::Value::OptionalType(Box::new(type_proto::Optional {
            elem_type: Some(Box::new(sequence.clone())),
        }))),
        ..Default::default()
    };
    let typed =
        |name: &str| ValueInfoProto { name: Some(name.into()), r#type: Some(optional.clone()), ..Default::default() };
    let branch =
        |name: &str, b: Builder, out: &str| GraphProto { name: Some(name.into()), output: vec![typed(out)], ..b.graph };
    let mut then = Builder::default();
    let of_type = AttributeProto {
        name: Some("type".into()),
        r#type: Some(AttributeType::TypeProto as i32),
        tp: Some(sequence),
        ..Default::default()
    };
    then.node_to("Optional", &[], &["absent"], vec![of_type]);
    let mut otherwise = Builder::default();
    let x = otherwise.constant(common::build::tensor(FLOAT, &[2], &[1.0, 2.0]));
    let xs = otherwise.node("SequenceConstruct", &[&x], vec![]);
    otherwise.node_to("Optional", &[&xs], &["present"], vec![]);
    let mut b = Builder::default();
    let c = b.input("c", onnx_fuse::onnx::BOOL, Some(&[]));
    let branches = vec![
        attr_graph("then_branch", branch("then", then, "absent")),
        attr_graph("else_branch", branch("else", otherwise, "present")),
    ];
    b.node_to("If", &[&c], &["sequence"], branches);
    b.graph.output.push(typed("sequence"));
    b.model(16)
}

#[test]
fn an_output_other_than_a_tensor_is_refused_before_onnx_runtime_runs() {
    // ONNX Runtime 1.31.1 returns the absent optional in a way that crashed
    // the process (a segmentation fault, where the run fed c = true).
    let e = cannot_verify(&if_optional());
    assert!(e.contains("a non-tensor output cannot be compared yet (the original model's output sequence)"), "{e}");
}

/// `LayerNormalization(a + 1000 + b)`: a residual stream with a large mean.
fn residual_with_a_large_mean() -> ModelProto {
    let mut b = Builder::default();
    let a = b.input("a", FLOAT, Some(&[D::N(2), D::N(3), D::N(64)]));
    let y = b.input("b", FLOAT, Some(&[D::N(2), D::N(3), D::N(64)]));
    let offset = b.init("offset", tensor(FLOAT, &[], &[1000.0]));
    let big = b.node("Add", &[&a, &offset], vec![]);
    let sum = b.node("Add", &[&big, &y], vec![]);
    let gamma = b.init("gamma", tensor(FLOAT, &[64], &(0..64).map(|i| 0.5 + i as f64 / 42.0).collect::<Vec<_>>()));
    let beta = b.init("beta", tensor(FLOAT, &[64], &(0..64).map(|i| i as f64 / 160.0).collect::<Vec<_>>()));
    let out = b.node("LayerNormalization", &[&sum, &gamma, &beta], vec![attr_int("axis", -1)]);
    b.output(&out, FLOAT, None);
    b.model(17)
}

#[test]
fn a_failed_node_is_judged_against_exact_arithmetic_and_a_known_kernel_is_named() {
    let dir = tempdir();
    let input = dir.path().join("large_mean.onnx");
    std::fs::write(&input, prost::Message::encode_to_vec(&residual_with_a_large_mean())).unwrap();
    let out = dir.path().join("out.onnx");
    let json = dir.path().join("r.json");
    let args = [
        input.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--verify",
        "--report-json",
        json.to_str().unwrap(),
        "--passes",
        "default,skip-norm",
    ];
    let r = run(&args);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    let said = format!("{}{}", String::from_utf8_lossy(&r.stdout), stderr(&r));
    assert!(said.contains("FAIL node SkipLayerNormalization"), "{said}");
    assert!(
        said.contains("the fused node is further from exact arithmetic than the nodes it replaces (original "),
        "{said}"
    );
    assert!(said.contains("SkipLayerNormalization computes the variance in one pass"), "{said}");
    assert!(said.contains("--disable skip-norm keeps the unfused form"), "{said}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let node = &report["verification"]["nodes"][0];
    let exact = &node["exact"];
    assert_eq!(exact["further"], "fused", "{node}");
    let (original, fused) = (exact["original"].as_f64().unwrap(), exact["fused"].as_f64().unwrap());
    // Both are measured, and the fused kernel is the one further off: the
    // original LayerNormalization is itself off by rounding.
    assert!(0.0 < original && original < fused && fused <= node["max_abs"].as_f64().unwrap() + original, "{node}");
    assert!(!out.exists(), "nothing written");
    // The option the message names keeps the unfused form, which verifies.
    let r = run(&[&args[..], &["--disable", "skip-norm"]].concat());
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    // A node that passes is not judged.
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(report["verification"]["nodes"].as_array().unwrap().iter().all(|n| n.get("exact").is_none()));
}

/// The sizes a graph suggests are tried within the memory budget: a weight
/// axis of 4,096 given to channels, height and width at once would be an
/// image of 256 GiB (CLIP's and SigLIP's exports grew to 23 GB and were
/// killed). Such a try is skipped before anything is allocated, and a
/// smaller suggestion that fits is taken (3: the Conv's input channels).
#[test]
fn sizes_tried_beyond_the_memory_budget_are_skipped() {
    use common::build::sym;
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[sym("batch"), sym("channels"), sym("height"), sym("width")]));
    let w = b.init("w", tensor(FLOAT, &[8, 3, 2, 2], &vec![0.01; 96]));
    let y = b.node("Conv", &[&x, &w], vec![]);
    let table = b.init("table", tensor(FLOAT, &[4096, 2], &vec![0.5; 8192]));
    let first = b.init("first", tensor(onnx_fuse::onnx::INT64, &[1], &[0.0]));
    let row = b.node("Gather", &[&table, &first], vec![]);
    b.output(&y, FLOAT, None);
    b.output(&row, FLOAT, None);
    let model = b.model(17);
    let dir = std::env::temp_dir();
    let v = verify::verify((&model, dir.as_path()), (&model, dir.as_path()), &Default::default()).unwrap();
    assert!(v.passed, "{}", v.text());
    assert_eq!(v.dims["channels"], 3, "{:?}", v.dims);
}

/// A model whose output `noisy` is a Dropout in training mode (ONNX
/// Runtime's generator goes on from run to run and session to session)
/// and whose output `clean` is `-x - x`, with the two Negs written as
/// twins where `twins`, else as one: the two models differ outside any
/// fused node, so their outputs decide.
fn with_dropout(twins: bool, clean: bool) -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(4), D::N(64)]));
    let ratio = b.init("ratio", tensor(FLOAT, &[], &[0.5]));
    let training = b.init("training", tensor(onnx_fuse::onnx::BOOL, &[], &[1.0]));
    b.node_to("Dropout", &[&x, &ratio, &training], &["noisy"], vec![]);
    b.output("noisy", FLOAT, None);
    if clean {
        let n = b.node("Neg", &[&x], vec![]);
        let m = if twins { b.node("Neg", &[&x], vec![]) } else { n.clone() };
        b.node_to("Add", &[&n, &m], &["clean"], vec![]);
        b.output("clean", FLOAT, None);
    }
    b.model(17)
}

/// An output the original itself computes otherwise when run again is
/// not judged ("vary"); the others are, and decide. Where every output
/// varies, nothing can be judged: no verdict, an error.
#[test]
fn an_output_the_original_does_not_repeat_is_not_judged() {
    let v = verify_models(&with_dropout(true, true), &with_dropout(false, true));
    assert!(v.outputs_decide, "{}", v.text());
    let noisy = &v.outputs[0];
    assert!(!noisy.passed && noisy.unrepeatable.is_some_and(|by| by > 0.0), "{}", v.text());
    assert!(v.outputs[1].passed && v.outputs[1].unrepeatable.is_none(), "{}", v.text());
    assert!(v.passed, "{}", v.text());
    assert!(v.text().contains("  vary output noisy: "), "{}", v.text());
    assert!(v.text().contains("the original gives other values when run again"), "{}", v.text());
    // The output that repeats still fails where it differs.
    let mut wrong = with_dropout(false, true);
    let add = wrong.graph.as_mut().unwrap().node.iter_mut().find(|n| n.op_type() == "Add").unwrap();
    add.op_type = Some("Sub".into());
    let v = verify_models(&with_dropout(true, true), &wrong);
    assert!(!v.passed && !v.outputs[1].passed && v.outputs[1].unrepeatable.is_none(), "{}", v.text());
    // Nothing but a varying output to decide by.
    let dir = std::env::temp_dir();
    let (original, other) = (with_dropout(true, false), with_dropout(false, false));
    let mut other_noisy = other.clone();
    other_noisy.graph.as_mut().unwrap().node[0].name = Some("renamed".into());
    let err = verify::verify((&original, &dir), (&other_noisy, &dir), &verify::Options::default());
    let err = format!("{:#}", err.expect_err("no output to judge by"));
    assert!(err.contains("cannot verify: the original gives other values when run again"), "{err}");
}

/// A fused node is judged at the tolerance of the least precise type its
/// values pass through: an attention core whose scores are an f16 product
/// (q and k f16) but which writes f32 (cast before the softmax, v f32) is
/// judged as f16 (Optimum's f16 Qwen3 and Phi-3 with past: ONNX Runtime
/// rounded the original's fetched values otherwise, 8.8e-5 apart at f32
/// tolerance, the node the closer to exact arithmetic).
#[test]
fn a_node_is_judged_at_the_least_precise_type_its_values_pass_through() {
    let mut b = Builder::default();
    let dims = [D::N(2), D::N(2), D::N(3), D::N(8)];
    let q = b.input("q", FLOAT16, Some(&dims));
    let k = b.input("k", FLOAT16, Some(&[D::N(2), D::N(2), D::N(8), D::N(3)]));
    let v = b.input("v", FLOAT, Some(&dims));
    let s = b.node("MatMul", &[&q, &k], vec![]);
    let s = b.node("Cast", &[&s], vec![attr_int("to", FLOAT as i64)]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let out = b.node("MatMul", &[&p, &v], vec![]);
    b.output(&out, FLOAT, None);
    let original = b.model(17);
    let (fused, outcome) = fuse_model(&original, &["attention"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let v = verify_models(&original, &fused);
    assert!(v.passed, "{}", v.text());
    assert_eq!(v.nodes[0].elem_type, "float", "it writes f32");
    assert_eq!((v.nodes[0].tolerance.rtol, v.nodes[0].tolerance.atol), (1e-2, 1e-3), "{}", v.text());
    // The graph output, computed from it, carries its rounding: judged at
    // the node's tolerance, not only its own type's.
    assert_eq!(v.outputs[0].tolerance.rtol, 1e-2);
}

/// f16 logits near 100 (f16's step there is 1/16), `Max(lowest, 3x + 100)`
/// as a masked score is clamped, their softmax and its product with v;
/// `copied`: an Identity between the logits and the softmax, `scale` the
/// factor of x.
fn f16_softmax_chain(copied: bool, scale: f64) -> ModelProto {
    let mut b = Builder::default();
    let x = b.input("x", FLOAT16, Some(&[D::N(4), D::N(32)]));
    let v = b.input("v", FLOAT16, Some(&[D::N(32), D::N(8)]));
    let s = b.init("s", tensor(FLOAT16, &[], &[scale]));
    let c = b.init("c", tensor(FLOAT16, &[], &[-100.0]));
    let lowest = b.init("lowest", tensor(FLOAT16, &[], &[-65504.0]));
    let scaled = b.node("Mul", &[&x, &s], vec![]);
    let shifted = b.node("Sub", &[&scaled, &c], vec![]);
    let mut logits = b.node("Max", &[&lowest, &shifted], vec![]);
    if copied {
        logits = b.node("Identity", &[&logits], vec![]);
    }
    let p = b.node("Softmax", &[&logits], vec![attr_int("axis", -1)]);
    b.node_to("MatMul", &[&p, &v], &["y"], vec![]);
    b.output("y", FLOAT16, None);
    b.model(17)
}

#[test]
fn an_f16_output_is_judged_again_with_every_f16_value_rounded() {
    // ONNX Runtime 1.31.1's CPU provider computes the Sub, Max and Softmax
    // as one chain in f32 (measured) and rounds only its result; the
    // Identity has an f16 kernel, so there the logits are rounded to f16
    // first, as ONNX defines the Max: the output moves by much more than
    // f16's tolerance. With every f16 value fetched both round each op's
    // result, and agree.
    let v = verify_models(&f16_softmax_chain(false, 3.0), &f16_softmax_chain(true, 3.0));
    assert!(v.outputs_decide && v.passed, "{}", v.text());
    let out = &v.outputs[0];
    assert!(out.max_abs > 2e-3 && out.rounded.is_some_and(|by| by < 1e-3), "{}", v.text());
    assert!(v.text().contains("within tolerance with every f16 value rounded"), "{}", v.text());
    // A real difference still fails, rounded or not.
    let v = verify_models(&f16_softmax_chain(false, 3.0), &f16_softmax_chain(true, 3.1));
    assert!(!v.passed && v.outputs[0].rounded.is_none(), "{}", v.text());
}

#[test]
fn a_new_initializer_the_original_never_names_leaves_the_nodes_alone_to_decide() {
    // The f16 core of an f32 x, taken alone, reads a weight of ones the
    // original does not have; nothing else outside it changed. The graph
    // outputs are reported, the nodes alone decide.
    let (original, fused, _) = fuse_with("fuzz/rms_narrowing_casts.onnx", &["rms-norm"]);
    let names = |m: &ModelProto| -> Vec<String> {
        m.graph.as_ref().unwrap().initializer.iter().map(|t| t.name().to_string()).collect()
    };
    let before = names(&original);
    assert!(names(&fused).iter().any(|n| !before.contains(n)), "a new initializer: {:?}", names(&fused));
    let v = verify_models(&original, &fused);
    assert!(v.passed && !v.outputs_decide && !v.outputs.is_empty(), "{}", v.text());
    // An initializer the original has, changed: the outputs decide.
    let mut changed = fused.clone();
    let w = changed.graph.as_mut().unwrap().initializer.iter_mut().find(|t| t.name() == "w").unwrap();
    w.raw_data = None;
    w.float_data = vec![2.0; w.dims.iter().product::<i64>() as usize];
    let v = verify_models(&original, &changed);
    assert!(v.outputs_decide && !v.passed, "{}", v.text());
}
