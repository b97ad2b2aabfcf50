//! The attention pass: forms, the exact node and function written, near-misses.

mod common;

use common::*;
use onnx_fuse::onnx::{FunctionProto, ModelProto, NodeProto};

fn cores(model: &ModelProto) -> Vec<&NodeProto> {
    all_nodes(model).into_iter().filter(|n| n.op_type() == "AttentionCore").collect()
}

fn function<'a>(model: &'a ModelProto, overload: &str) -> &'a FunctionProto {
    model.functions.iter().find(|f| f.overload() == overload).unwrap_or_else(|| panic!("no function {overload}"))
}

/// (export, the form its cores have)
const FORMS: &[(&str, &str)] = &[
    ("llama_ts_op14.onnx", "mul.add.softmax.cast.cast"),
    ("llama_ts_op12.onnx", "mul.add.softmax.cast.cast"),
    ("llama_dynamo_op18.onnx", "mul.add.softmax"),
    ("llama_sdpa_ts_op14.onnx", "add.softmax.nan_guard"),
    ("llama_optimum_past.onnx", "add.softmax.nan_guard"),
    ("gpt2_ts_op14.onnx", "div_input.cast.where.add.softmax.cast"),
    ("gpt2_dynamo_op18.onnx", "div.where.add.softmax"),
    ("bert_ts_op14.onnx", "div.add.softmax"),
    ("bert_optimum.onnx", "add.softmax"),
    ("t5_encoder_ts_op14.onnx", "add.cast.softmax"),
    ("t5_encoder_ts_op17_fp16.onnx", "add.cast.softmax.cast"),
    ("vit_ts_op17_fp16.onnx", "mul.softmax.cast.cast"),
    ("whisper_encoder_sdpa_ts_op17.onnx", "softmax"),
    ("trocr_decoder_ts_op14.onnx", "reshape_input.add.reshape_input.softmax"),
    ("bloom_ts_op14.onnx", "mul.add.reshape_input.add.softmax.cast.cast.reshape_input"),
    ("mpnet_ts_op14.onnx", "div.add.add.softmax"),
    ("bloom_dynamo_op18.onnx", "mul.add.reshape_allowzero.add.softmax"),
    ("bloom_optimum_past.onnx", "mul.add.reshape_input.add.softmax.cast.cast.reshape_input"),
    ("distilbert_ts_op14.onnx", "masked_fill.softmax"),
    ("mpt_ts_op14.onnx", "mul.add.masked_fill.cast.softmax.cast"),
    ("gemma2_ts_op18.onnx", "mul.softcap.add.softmax.cast.cast"),
    // torch.einsum: a relative position term added, the mask subtracted.
    ("xlnet_ts_op14.onnx", "einsum.add.mul.sub.softmax.einsum_v"),
    // Views of the scores whose shapes are computed from the scores'.
    ("deberta_ts_op14.onnx", "add.reshape_computed.masked_fill.softmax.reshape_computed"),
];

#[test]
fn every_form_is_one_core_with_its_own_function() {
    for &(name, form) in FORMS {
        let (original, fused, _) = fuse(name);
        let found = cores(&fused);
        assert_eq!(found.len(), count_op(&original, "Softmax"), "{name}: every Softmax's core fused");
        for core in &found {
            assert_eq!(core.domain(), "transmuter", "{name}");
            assert_eq!(core.overload(), form, "{name}");
        }
        assert_eq!(fused.functions.len(), 1, "{name}: one function for all cores of one form");
        let f = function(&fused, form);
        assert_eq!((f.domain(), f.name()), ("transmuter", "AttentionCore"));
        assert_eq!(f.opset_import, fused.opset_import, "{name}: the function imports the model's opsets");
        assert!(fused.opset_import.iter().any(|o| o.domain() == "transmuter" && o.version() == 1), "{name}");
        assert_eq!(fused.ir_version(), original.ir_version().max(10), "{name}: overloaded functions need IR 10");
        // The body is the matched nodes: no attribute of the node, every
        // value it reads an input or computed before in it.
        assert!(f.attribute.is_empty() && found.iter().all(|c| c.attribute.is_empty()), "{name}: no attributes");
        let mut known: Vec<&str> = f.input.iter().map(String::as_str).collect();
        for node in &f.node {
            assert!(node.attribute.iter().all(|a| a.ref_attr_name.is_none()), "{name}: no attribute reference");
            assert!(node.input.iter().all(|i| i.is_empty() || known.contains(&i.as_str())), "{name}: {node:?}");
            known.extend(node.output.iter().map(String::as_str));
        }
        assert_eq!(f.output, ["out"], "{name}");
        assert_eq!(f.input.len(), found[0].input.len(), "{name}: one function input per node input");
    }
}

#[test]
fn llama_core_structure_and_provenance() {
    let (_, fused, _) = fuse("llama_ts_op14.onnx");
    let scope = "/model/model/layers.0/self_attn/";
    let core = common::node(&fused, &format!("{scope}AttentionCore")).expect("the core");
    assert_eq!(core.input[0], format!("{scope}Add_output_0"), "q (after rotary)");
    assert_eq!(core.input[1], format!("{scope}Transpose_3_output_0"), "k, already transposed");
    assert_eq!(core.input[3], format!("{scope}Slice_4_output_0"), "the additive mask");
    assert_eq!(core.input.len(), 4, "q, k, v, mask");
    assert_eq!(core.output, [format!("{scope}MatMul_1_output_0")]);
    assert!(core.attribute.is_empty(), "the body holds the constants");
    assert_provenance(
        core,
        &scope,
        &[
            "MatMul MatMul_1",
            "MatMul MatMul",
            "Constant Constant_56",
            "Mul Mul_8",
            "Add Add_2",
            "Softmax Softmax",
            "Cast Cast_4",
            "Cast Cast_5",
        ],
    );
    let f = function(&fused, "mul.add.softmax.cast.cast");
    let ops: Vec<&str> = f.node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Constant", "Mul", "Add", "Softmax", "Cast", "Cast", "MatMul"]);
    assert_eq!(f.input, ["q", "k", "v", "mask"]);
    assert_eq!(f.output, ["out"]);
    let scale = f.node[1].attr("value").and_then(|a| a.t.as_ref()).expect("the scale's Constant");
    assert_eq!(scale.scalar().map(|s| s as f32), Some(1.0 / 8f32.sqrt()), "1/sqrt(head_dim), bit for bit");
    assert_eq!(f.node[5].attr_int("to"), Some(1));
    // Named apart from the graph: the same body serves every layer.
    assert!(f.node.iter().all(|n| n.name.is_none() && n.metadata_props.is_empty()));
    assert_eq!(fused.functions.len(), 1, "both layers call one function");
}

#[test]
fn gpt2_core_takes_the_computed_divisor_and_the_keep_mask_as_inputs() {
    let (_, fused, _) = fuse("gpt2_ts_op14.onnx");
    let core = cores(&fused)[0];
    let f = function(&fused, core.overload());
    assert_eq!(f.input, ["q", "k", "v", "divisor", "keep", "mask"]);
    // GPT-2 fills hidden keys with torch.finfo(float32).min, kept bit for bit.
    let ops: Vec<&str> = f.node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Div", "Cast", "Constant", "Where", "Add", "Softmax", "Cast", "MatMul"]);
    let fill = f.node[3].attr("value").and_then(|a| a.t.as_ref()).expect("the fill's Constant");
    assert_eq!(fill.scalar(), Some(f32::MIN as f64));
    assert_eq!(f.node[4].input, ["keep", "t2", "t3"]);
}

#[test]
fn the_sdpa_nan_guard_is_part_of_the_core() {
    let (_, fused, _) = fuse("llama_sdpa_ts_op14.onnx");
    assert_eq!(count_op(&fused, "IsNaN"), 0);
    let f = function(&fused, "add.softmax.nan_guard");
    let ops: Vec<&str> = f.node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Add", "Softmax", "IsNaN", "Constant", "Where", "MatMul"]);
}

#[test]
fn trocr_reshape_pair_is_proved_with_symbolic_shapes() {
    let (original, fused, _) = fuse("trocr_decoder_ts_op14.onnx");
    let core = cores(&fused)[0];
    assert_eq!(function(&fused, core.overload()).input, ["q", "k", "v", "scores_shape", "mask", "scores_shape_2"]);
    assert_equivalent(&original, &fused, "trocr_decoder_ts_op14.onnx");
}

/// DeBERTa views its 3-D scores as `[-1, heads, Shape(s)[-2], Shape(s)[-1]]`
/// for the mask and the probabilities back as `[-1, Shape(p)[-2],
/// Shape(p)[-1]]`: shapes computed from the core's own values, which the
/// body computes too (from its own values: they are part of the match).
/// Where a node of that computation is read elsewhere, it cannot go with
/// the core.
#[test]
fn reshape_shapes_computed_from_the_cores_values_are_computed_in_the_body() {
    let (original, fused, _) = fuse("deberta_ts_op14.onnx");
    let core = cores(&fused)[0];
    let f = function(&fused, core.overload());
    assert_eq!(f.input, ["q", "k", "v", "mask", "hide"], "the position bias and the mask: no shape input");
    let reads = |op: &str| f.node.iter().filter(|n| n.op_type() == op).count();
    assert_eq!((reads("Shape"), reads("Reshape")), (4, 2));
    assert_equivalent(&original, &fused, "deberta_ts_op14.onnx");

    let mut shared = original.clone();
    let g = shared.graph.as_mut().unwrap();
    let concat = g.node.iter().find(|n| n.name() == "/model/encoder/layer.0/attention/self/Concat_12").unwrap();
    let out = onnx_fuse::onnx::ValueInfoProto { name: Some(concat.output[0].clone()), ..Default::default() };
    g.output.push(out);
    let (fused, outcome) = fuse_model(&shared, &["attention"]);
    assert_eq!(cores(&fused).len(), 1, "the other layer's core");
    let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
    assert!(said.iter().any(|r| r.contains("Concat_12_output_0 is also a graph output")), "{said:?}");
}

/// (near-miss, cores that still fuse (other layers), the anchor that must survive, the reason --explain gives)
const NEAR_MISSES: &[(&str, usize, &str, &str)] = &[
    (
        "nm_attn_fill_minus100.onnx",
        1,
        "/model/transformer/h.0/attn/MatMul_1",
        "the Where fill is -100, not at most -1e4",
    ),
    (
        "nm_attn_scale_2_values.onnx",
        1,
        "/model/model/layers.0/self_attn/MatMul_1",
        "the Mul scale (/model/model/layers.0/self_attn/Constant_56_output_0) is not a constant with one value",
    ),
    (
        "nm_attn_scores_output.onnx",
        1,
        "/model/model/layers.0/self_attn/MatMul_1",
        "Mul_8_output_0 is also a graph output",
    ),
    (
        "nm_attn_probs_second_consumer.onnx",
        1,
        "/model/model/layers.0/self_attn/MatMul_1",
        "Softmax_output_0 is also read outside the matched nodes",
    ),
    (
        "nm_attn_softmax_axis1_op12.onnx",
        1,
        "/model/model/layers.0/self_attn/MatMul_1",
        "the Softmax is over axis 1, not provably the last axis",
    ),
    (
        "nm_attn_reshape_not_back.onnx",
        1,
        "/model/decoder/layers.0/self_attn/MatMul_1",
        "the Reshape pair around the scores is not proved to give back its shape",
    ),
];

#[test]
fn near_misses_do_not_fuse_and_say_why() {
    for &(name, fused_cores, survivor, reason) in NEAR_MISSES {
        let original = load(name);
        let (fused, outcome) = fuse_model(&original, &["attention"]);
        assert_eq!(cores(&fused).len(), fused_cores, "{name}");
        assert!(common::node(&fused, survivor).is_some(), "{name}: {survivor} must not be fused away");
        let said: Vec<&str> =
            outcome.declined.iter().filter(|d| d.node == survivor).map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(reason)), "{name}: declined because {reason:?}; said {said:?}");
    }
}

#[test]
fn near_misses_that_run_still_compute_the_same() {
    for name in ["nm_attn_fill_minus100.onnx", "nm_attn_scores_output.onnx", "nm_attn_probs_second_consumer.onnx"] {
        let (original, fused, _) = fuse(name);
        assert_equivalent(&original, &fused, name);
    }
}

/// A model may spell the default domain `ai.onnx`: the fused model still
/// loads, since function bodies import it as ONNX Runtime resolves it.
#[test]
fn a_model_that_spells_the_default_domain_ai_onnx_still_loads() {
    let mut original = load("llama_ts_op14.onnx");
    for import in original.opset_import.iter_mut().filter(|o| o.domain().is_empty()) {
        import.domain = Some("ai.onnx".into());
    }
    let (fused, outcome) = fuse_model(&original, &["default", "skip-norm"]);
    let count = |pass: &str| outcome.fused.iter().filter(|f| f.pass == pass).count();
    assert_eq!(
        (count("rms-norm"), count("skip-norm"), count("attention")),
        (1, 4, 2),
        "four norms read a residual sum"
    );
    assert_equivalent(&original, &fused, "llama_ts_op14.onnx");
}

/// A Reshape's allowzero changes what its body computes: another form,
/// another function, never one shared with the plain form.
#[test]
fn allowzero_is_part_of_the_form() {
    let mut original = load("trocr_decoder_ts_op14.onnx");
    let g = original.graph.as_mut().unwrap();
    let scope = "/model/decoder/layers.0/self_attn/";
    let mut changed = 0;
    for node in g.node.iter_mut().filter(|n| n.op_type() == "Reshape" && n.name().starts_with(scope)) {
        for a in node.attribute.iter_mut().filter(|a| a.name() == "allowzero") {
            a.i = Some(1);
            changed += 1;
        }
    }
    assert!(changed > 0);
    let (fused, outcome) = fuse_model(&original, &["attention"]);
    assert_eq!(outcome.fused.len(), 2);
    let mut forms: Vec<&str> = cores(&fused).iter().map(|c| c.overload()).collect();
    forms.sort();
    assert_eq!(
        forms,
        ["reshape_input.add.reshape_input.softmax", "reshape_input_allowzero.add.reshape_input_allowzero.softmax"]
    );
    assert_eq!(fused.functions.len(), 2, "one function per form");
    assert_equivalent(&original, &fused, "trocr_decoder_ts_op14.onnx");
}

/// GPT-2 as ONNX Runtime's own test models write it: the causal mask
/// sliced from a table of zeros and ones (`bias[:, :, ns - nd : ns, :ns]`,
/// sized from `Shape(scores)`), applied as `s·m − 1e4·(1 − m)` or through
/// a Cast to bool and a `Where`. Sliced, cast or reshaped, the table still
/// holds only 0 and 1; a table with a 2 in it is a near-miss.
fn gpt2_sliced_mask(where_form: bool, table: &[f64]) -> ModelProto {
    use common::build::*;
    use onnx_fuse::onnx::{BOOL, FLOAT, INT64};
    let mut b = Builder::default();
    let x = |n: &str| [sym("b"), D::N(2), sym(n), D::N(4)];
    let q = b.input("q", FLOAT, Some(&x("s")));
    let k = b.input("k", FLOAT, Some(&x("t")));
    let v = b.input("v", FLOAT, Some(&x("t")));
    let kt = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 1, 3, 2])]);
    let w0 = b.node("MatMul", &[&q, &kt], vec![]);
    let two = b.init("sqrt_d", tensor(FLOAT, &[], &[2.0]));
    let w = b.node("Div", &[&w0, &two], vec![]);
    let ints = |b: &mut Builder, v: &[i64]| {
        let f: Vec<f64> = v.iter().map(|&i| i as f64).collect();
        b.init(&format!("ints_{v:?}"), tensor(INT64, &[v.len() as i64], &f))
    };
    let shape = b.node("Shape", &[&w], vec![]);
    let (i2, i3) = (b.init("i2", tensor(INT64, &[], &[2.0])), b.init("i3", tensor(INT64, &[], &[3.0])));
    let nd = b.node("Gather", &[&shape, &i2], vec![attr_int("axis", 0)]);
    let ns = b.node("Gather", &[&shape, &i3], vec![attr_int("axis", 0)]);
    let start = b.node("Sub", &[&ns, &nd], vec![]);
    let axis0 = ints(&mut b, &[0]);
    let start = b.node("Unsqueeze", &[&start, &axis0], vec![]);
    let end = b.node("Unsqueeze", &[&ns, &axis0], vec![]);
    let elem = if where_form {
        2 /* uint8 */
    } else {
        FLOAT
    };
    let bias = b.init("bias", tensor(elem, &[1, 1, 4, 4], table));
    let (a2, a3) = (ints(&mut b, &[2]), ints(&mut b, &[3]));
    let rows = b.node("Slice", &[&bias, &start, &end, &a2], vec![]);
    let mask = b.node("Slice", &[&rows, &axis0, &end, &a3], vec![]);
    let s = if where_form {
        let keep = b.node("Cast", &[&mask], vec![attr_int("to", BOOL as i64)]);
        let fill = b.init("fill", tensor(FLOAT, &[], &[-1e4]));
        b.node("Where", &[&keep, &w, &fill], vec![])
    } else {
        let kept = b.node("Mul", &[&w, &mask], vec![]);
        let one = b.init("one", tensor(FLOAT, &[], &[1.0]));
        let hidden = b.node("Sub", &[&one, &mask], vec![]);
        let penalty = b.init("penalty", tensor(FLOAT, &[], &[1e4]));
        let p = b.node("Mul", &[&penalty, &hidden], vec![]);
        b.node("Sub", &[&kept, &p], vec![])
    };
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    b.node_to("MatMul", &[&p, &v], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(13)
}

#[test]
fn gpt2s_mask_sliced_from_its_table_by_the_scores_shape_fuses() {
    let causal: Vec<f64> = (0..16).map(|i| f64::from(u8::from(i % 4 <= i / 4))).collect();
    let mut with_a_two = causal.clone();
    with_a_two[5] = 2.0;
    for where_form in [false, true] {
        let original = gpt2_sliced_mask(where_form, &causal);
        let (fused, outcome) = fuse_model(&original, &["attention"]);
        assert_eq!(outcome.fused.len(), 1, "where {where_form}: {:?}", outcome.declined);
        // The mask's size now comes from q and k, which survive.
        assert!(all_nodes(&fused).iter().all(|n| n.op_type() != "MatMul" || n.input[0] != "q"));
        assert_equivalent(&original, &fused, "gpt2 sliced mask");
    }
    // Only the product form reads the mask's values (Where reads it as bool).
    let (fused, outcome) = fuse_model(&gpt2_sliced_mask(false, &with_a_two), &["attention"]);
    assert_eq!(cores(&fused).len(), 0, "a table holding 2 is no 0/1 mask");
    assert!(
        outcome.declined.iter().any(|d| d.reason.contains("not proved to hold only 0 and 1")),
        "{:?}",
        outcome.declined
    );
}

/// Where neither operand of the scores' `Add` leads back to the product,
/// the reason told is where the path broke, not that the mask (a graph
/// input, tried first) is computed by no node.
#[test]
fn a_declined_add_tells_where_the_scores_path_broke() {
    use common::build::*;
    use onnx_fuse::onnx::FLOAT;
    let mut b = Builder::default();
    let x = |n: &str| [D::N(1), D::N(2), sym(n), D::N(4)];
    let q = b.input("q", FLOAT, Some(&x("s")));
    let k = b.input("k", FLOAT, Some(&x("t")));
    let v = b.input("v", FLOAT, Some(&x("t")));
    let m = b.input("m", FLOAT, Some(&[D::N(1), D::N(1), sym("s"), sym("t")]));
    let kt = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 1, 3, 2])]);
    let w = b.node("MatMul", &[&q, &kt], vec![]);
    let odd = b.node("Abs", &[&w], vec![]);
    let s = b.node("Add", &[&m, &odd], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    b.node_to("MatMul", &[&p, &v], &["y"], vec![]);
    b.output("y", FLOAT, None);
    let (fused, outcome) = fuse_model(&b.model(17), &["attention"]);
    assert!(cores(&fused).is_empty());
    let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
    assert!(said.iter().any(|r| r.contains("Abs") && r.contains("is not a step of the attention core")), "{said:?}");
    assert!(said.iter().all(|r| !r.contains("not computed by the graph")), "{said:?}");
}

/// DeBERTa's XSoftmax (SEW-D): `masked_fill(s, hide, lowest)`, the
/// softmax, then `masked_fill(p, hide, 0)`, the second condition computed
/// again alike. A row hidden whole is zeros, not the mean of v; the step
/// is the core's where its condition is the mask's, read alike, and
/// declined otherwise.
fn xsoftmax(zeroing: &str) -> ModelProto {
    use common::build::*;
    use onnx_fuse::onnx::{BOOL, FLOAT};
    let mut b = Builder::default();
    let x = |n: &str| [D::N(1), D::N(2), sym(n), D::N(4)];
    let q = b.input("q", FLOAT, Some(&x("s")));
    let k = b.input("k", FLOAT, Some(&x("t")));
    let v = b.input("v", FLOAT, Some(&x("t")));
    let m = b.input("m", FLOAT, Some(&[D::N(1), D::N(1), D::N(1), sym("t")]));
    let other = b.input("other", FLOAT, Some(&[D::N(1), D::N(1), D::N(1), sym("t")]));
    let kt = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 1, 3, 2])]);
    let w = b.node("MatMul", &[&q, &kt], vec![]);
    let hide = b.node("Cast", &[&m], vec![attr_int("to", BOOL as i64)]);
    let lowest = b.init("lowest", tensor(FLOAT, &[], &[f64::from(f32::MIN)]));
    let mut s = b.node("Where", &[&hide, &lowest, &w], vec![]);
    if zeroing == "viewed" {
        // The scores viewed as rows of their last axis, a term added, and
        // back (the pair between the two Wheres gives back the shape).
        let shape = b.node("Shape", &[&s], vec![]);
        let (rows, start, end) = (b.ints(&[-1]), b.ints(&[-1]), b.ints(&[i64::MAX]));
        let last = b.node("Slice", &[&shape, &start, &end], vec![]);
        let view = b.node("Concat", &[&rows, &last], vec![attr_int("axis", 0)]);
        let viewed = b.node("Reshape", &[&s, &view], vec![]);
        let term = b.input("term", FLOAT, Some(&[sym("t")]));
        let added = b.node("Add", &[&viewed, &term], vec![]);
        s = b.node("Reshape", &[&added, &shape], vec![]);
    }
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let zero = b.init("zero", tensor(FLOAT, &[], &[0.0]));
    let half = b.init("half", tensor(FLOAT, &[], &[0.5]));
    let again = b.node("Cast", &[&m], vec![attr_int("to", BOOL as i64)]);
    let elsewhere = b.node("Cast", &[&other], vec![attr_int("to", BOOL as i64)]);
    let zeroed = match zeroing {
        "again" => b.node("Where", &[&again, &zero, &p], vec![]),
        "same" | "viewed" => b.node("Where", &[&hide, &zero, &p], vec![]),
        "elsewhere" => b.node("Where", &[&elsewhere, &zero, &p], vec![]),
        "visible" => b.node("Where", &[&hide, &p, &zero], vec![]),
        "half" => b.node("Where", &[&hide, &half, &p], vec![]),
        _ => unreachable!(),
    };
    b.node_to("MatMul", &[&zeroed, &v], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(17)
}

#[test]
fn xsoftmax_zeroing_the_hidden_keys_after_the_softmax_fuses() {
    for (zeroing, form) in [
        ("again", "masked_fill.softmax.zeroed"),
        ("same", "masked_fill.softmax.zeroed"),
        ("viewed", "masked_fill.reshape_computed.add.reshape_computed.softmax.zeroed"),
    ] {
        let original = xsoftmax(zeroing);
        let (fused, outcome) = fuse_model(&original, &["attention"]);
        assert_eq!(cores(&fused).len(), 1, "{zeroing}: {:?}", outcome.declined);
        assert_eq!(cores(&fused)[0].overload(), form);
        assert_equivalent(&original, &fused, zeroing);
    }
    for (zeroing, reason) in [
        ("elsewhere", "not by the mask's condition"),
        ("visible", "not by the mask's condition"),
        ("half", "writes 0.5, not 0"),
    ] {
        let (fused, outcome) = fuse_model(&xsoftmax(zeroing), &["attention"]);
        assert!(cores(&fused).is_empty(), "{zeroing}");
        let said: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(said.iter().any(|r| r.contains(reason)), "{zeroing}: {said:?}");
    }
}
