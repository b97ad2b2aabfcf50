//! The forms the spec admits beside the plain chains, each beside the
//! near-miss that must not fuse: weights `[1, …, 1, D]` and of one value,
//! `Pow(a, 0.5)` for the root, LayerNorm without beta, masked_fill, a fill
//! reshaped from one value, several additive terms, inference Dropout.

mod common;

use common::build::*;
use common::*;
use onnx_fuse::onnx::{ModelProto, NodeProto, TensorProto, BOOL, DOUBLE, FLOAT, FLOAT16, INT64};

const X: &[i64] = &[2, 3, 4];

fn dims(d: &[i64]) -> Vec<D> {
    d.iter().map(|&n| D::N(n)).collect()
}

/// `x / root(mean(x², -1) + eps) * weight` (opset 14: axes as an attribute),
/// the root written by `root`, optionally centered first (a LayerNorm
/// without beta). Returns the model with input x of shape `x_dims`.
fn norm(x_dims: &[D], weight: onnx_fuse::onnx::TensorProto, root_exponent: Option<f64>, centered: bool) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(x_dims));
    let x = if centered {
        let mean = b.node("ReduceMean", &["x"], vec![attr_ints("axes", &[-1])]);
        b.node("Sub", &["x", &mean], vec![])
    } else {
        "x".to_string()
    };
    let two = b.init("two", tensor(FLOAT, &[], &[2.0]));
    let sq = b.node("Pow", &[&x, &two], vec![]);
    let m = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
    let eps = b.init("eps", tensor(FLOAT, &[], &[1e-5]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = match root_exponent {
        None => b.node("Sqrt", &[&a], vec![]),
        Some(e) => {
            let e = b.init("half", tensor(FLOAT, &[], &[e]));
            b.node("Pow", &[&a, &e], vec![])
        }
    };
    let n = b.node("Div", &[&x, &r], vec![]);
    let w = b.init("weight", weight);
    b.node_to("Mul", &[&n, &w], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(14)
}

fn ramp(n: usize) -> Vec<f64> {
    (0..n).map(|i| 0.5 + i as f64 / 4.0).collect()
}

/// The one fused node of a model, and the model.
fn fused_one(model: &ModelProto, op: &str) -> ModelProto {
    let (fused, outcome) = fuse_model(model, &["layer-norm", "rms-norm"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    assert_eq!(fused.graph.as_ref().unwrap().node.len(), 1);
    assert_eq!(fused.graph.as_ref().unwrap().node[0].op_type(), op);
    assert_equivalent(model, &fused, "forms");
    fused
}

fn declined(model: &ModelProto) -> Vec<String> {
    let (_, outcome) = fuse_model(model, &["layer-norm", "rms-norm"]);
    assert_eq!(outcome.fused.len(), 0, "must not fuse: {:?}", outcome.fused);
    outcome.declined.into_iter().map(|d| d.reason).collect()
}

/// The `[D]` constant the fused node reads as its weight.
fn weight_read(fused: &ModelProto, input: usize) -> onnx_fuse::onnx::TensorProto {
    let g = fused.graph.as_ref().unwrap();
    let name = &g.node[0].input[input];
    g.initializer.iter().find(|t| t.name() == name).unwrap_or_else(|| panic!("no initializer {name}")).clone()
}

#[test]
fn a_weight_of_shape_1_1_d_is_read_as_d() {
    for centered in [false, true] {
        let model = norm(&dims(X), tensor(FLOAT, &[1, 1, 4], &ramp(4)), None, centered);
        let op = if centered { "LayerNormalization" } else { "SimplifiedLayerNormalization" };
        let fused = fused_one(&model, op);
        let w = weight_read(&fused, 1);
        assert_eq!(w.dims, [4]);
        assert_eq!(w.values(), Some(ramp(4)));
        // The [1, 1, 4] initializer nothing reads any more is gone.
        assert_eq!(fused.graph.as_ref().unwrap().initializer.len(), 1);
        // A second run changes nothing.
        let (again, outcome) = fuse_model(&fused, &["default"]);
        assert!(outcome.fused.is_empty() && again == fused);
    }
}

#[test]
fn a_weight_of_shape_2_d_or_of_higher_rank_than_x_is_not() {
    let why = declined(&norm(&dims(X), tensor(FLOAT, &[2, 4], &ramp(8)), None, false));
    assert!(why.iter().any(|r| r.contains("is not proved to have one axis")), "{why:?}");
    let why = declined(&norm(&dims(X), tensor(FLOAT, &[1, 1, 1, 4], &ramp(4)), None, false));
    assert!(why.iter().any(|r| r.contains("may raise the rank of x")), "{why:?}");
}

#[test]
fn a_weight_of_one_value_becomes_d_copies_where_d_is_known() {
    let model = norm(&dims(X), tensor(FLOAT, &[1], &[1.5]), None, false);
    let fused = fused_one(&model, "SimplifiedLayerNormalization");
    let w = weight_read(&fused, 1);
    assert_eq!((w.dims.as_slice(), w.values()), (&[4][..], Some(vec![1.5; 4])));
    // With a symbolic last axis, no [D] constant can be made.
    let x = [D::N(2), D::N(3), sym("d")];
    let why = declined(&norm(&x, tensor(FLOAT, &[1], &[1.5]), None, false));
    assert!(why.iter().any(|r| r.contains("has 1 values but the last axis of x is d")), "{why:?}");
}

/// `norm` with its exponent written `Cast(e as f64 → f32)`, the Cast first
/// in the node list (as dynamo writes it).
fn norm_with_cast_exponent(e: f64) -> ModelProto {
    let mut model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, false);
    let g = model.graph.as_mut().unwrap();
    g.initializer.retain(|t| t.name() != "two");
    let mut b = Builder::default();
    b.init("two_f64", tensor(DOUBLE, &[], &[e]));
    b.node_to("Cast", &["two_f64"], &["two"], vec![attr_int("to", i64::from(FLOAT))]);
    g.node.insert(0, NodeProto { name: Some("exponent_cast".into()), ..b.graph.node.remove(0) });
    g.initializer.extend(b.graph.initializer);
    model
}

#[test]
fn the_exponent_may_be_a_cast_of_a_constant() {
    let fused = fused_one(&norm_with_cast_exponent(2.0), "SimplifiedLayerNormalization");
    assert!(fused_list(&fused.graph.as_ref().unwrap().node[0]).contains(&"Cast exponent_cast"));
    let why = declined(&norm_with_cast_exponent(3.0));
    assert!(why.iter().any(|r| r.contains("the exponent is 3, not 2")), "{why:?}");
}

/// `norm` with its eps written `CastLike(eps, like)` (onnxscript's torchlib
/// writes every literal so: like is the mean), eps of the given type.
fn norm_with_cast_like_eps(elem: i32, like_int: bool) -> ModelProto {
    let mut model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, false);
    model.opset_import[0].version = Some(15);
    let g = model.graph.as_mut().unwrap();
    g.initializer.retain(|t| t.name() != "eps");
    let add = g.node.iter().position(|n| n.op_type() == "Add").unwrap();
    let mean = g.node[add].input[0].clone();
    let mut b = Builder::default();
    b.init("eps_literal", tensor(elem, &[], &[1e-5]));
    b.init("an_int", tensor(INT64, &[], &[1.0]));
    let like = if like_int { "an_int" } else { mean.as_str() };
    b.node_to("CastLike", &["eps_literal", like], &["eps"], vec![]);
    g.node.insert(add, NodeProto { name: Some("eps_cast_like".into()), ..b.graph.node.remove(0) });
    g.initializer.extend(b.graph.initializer);
    model
}

#[test]
fn an_eps_cast_like_the_mean_is_a_constant() {
    // Of the mean's own type, the literal itself; of another, its value
    // rounded to the mean's type.
    for elem in [FLOAT, DOUBLE] {
        let fused = fused_one(&norm_with_cast_like_eps(elem, false), "SimplifiedLayerNormalization");
        let node = &fused.graph.as_ref().unwrap().node[0];
        assert!(fused_list(node).contains(&"CastLike eps_cast_like"), "{:?}", fused_list(node));
        assert_eq!(node.attr_float("epsilon"), Some(1e-5));
    }
    // Cast like an integer, eps is 0 (and not of x's type).
    let why = declined(&norm_with_cast_like_eps(FLOAT, true));
    assert!(why.iter().any(|r| r.contains("is a constant eps")), "{why:?}");
}

/// `norm` with its weight written `CastLike(weight, normalized)` (torchlib:
/// `weight * hidden.to(dtype)`), the weight of the given type.
fn norm_with_cast_like_weight(elem: i32) -> ModelProto {
    let mut model = norm(&dims(X), tensor(elem, &[4], &ramp(4)), None, false);
    model.opset_import[0].version = Some(15);
    let g = model.graph.as_mut().unwrap();
    let mul = g.node.iter().position(|n| n.output[0] == "y").unwrap();
    let normalized = g.node[mul].input[0].clone();
    let mut b = Builder::default();
    b.node_to("CastLike", &["weight", &normalized], &["weight_cast"], vec![]);
    g.node.insert(mul, NodeProto { name: Some("weight_cast_like".into()), ..b.graph.node.remove(0) });
    g.node[mul + 1].input[1] = "weight_cast".into();
    model
}

#[test]
fn a_weight_cast_like_the_normalized_value_is_read_as_the_weight() {
    let fused = fused_one(&norm_with_cast_like_weight(FLOAT), "SimplifiedLayerNormalization");
    let node = &fused.graph.as_ref().unwrap().node[0];
    assert_eq!(node.input[1], "weight");
    assert!(fused_list(node).contains(&"CastLike weight_cast_like"), "{:?}", fused_list(node));
    // Cast like an f32 value, an f64 weight is another tensor: not read.
    let why = declined(&norm_with_cast_like_weight(DOUBLE));
    assert!(!why.is_empty());
}

/// `norm` without its `Add(eps)`: the root of the mean itself.
fn norm_without_eps(centered: bool) -> ModelProto {
    let mut model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, centered);
    let g = model.graph.as_mut().unwrap();
    let add = g.node.iter().position(|n| n.op_type() == "Add" && n.input.iter().any(|i| i == "eps")).unwrap();
    let (mean, sum) = (g.node[add].input[0].clone(), g.node[add].output[0].clone());
    g.node.remove(add);
    g.initializer.retain(|t| t.name() != "eps");
    for input in g.node.iter_mut().flat_map(|n| n.input.iter_mut()).filter(|i| **i == sum) {
        *input = mean.clone();
    }
    model
}

#[test]
fn a_norm_without_eps_has_epsilon_zero() {
    for (centered, op) in [(false, "SimplifiedLayerNormalization"), (true, "LayerNormalization")] {
        let fused = fused_one(&norm_without_eps(centered), op);
        assert_eq!(fused.graph.as_ref().unwrap().node[0].attr_float("epsilon"), Some(0.0), "{op}");
    }
    // Over axis 0 it is no norm over the last axis.
    let mut broken = norm_without_eps(false);
    let g = broken.graph.as_mut().unwrap();
    g.node.iter_mut().find(|n| n.op_type() == "ReduceMean").unwrap().attribute = vec![attr_ints("axes", &[0])];
    let why = declined(&broken);
    assert!(why.iter().any(|r| r.contains("reduces axes [0], not the last axis alone")), "{why:?}");
}

#[test]
fn the_root_may_be_pow_one_half_but_no_other_power() {
    fused_one(&norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), Some(0.5), false), "SimplifiedLayerNormalization");
    let why = declined(&norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), Some(0.4), false));
    assert!(why.iter().any(|r| r.contains("the root's exponent is 0.4")), "{why:?}");
}

#[test]
fn a_layer_norm_without_beta_is_layer_normalization_without_bias() {
    let model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, true);
    let fused = fused_one(&model, "LayerNormalization");
    let node = &fused.graph.as_ref().unwrap().node[0];
    assert_eq!(node.input, ["x", "weight"]);
    assert_eq!(fused_list(node).len(), 8, "Mul, Div, Sqrt, Add, ReduceMean, Pow, Sub, ReduceMean");
    // Centered over axis 0: an RMSNorm of the difference at most.
    let mut broken = model.clone();
    let g = broken.graph.as_mut().unwrap();
    g.node[0].attribute = vec![attr_ints("axes", &[0])];
    let (fused, _) = fuse_model(&broken, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "LayerNormalization"), 0);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 1);
}

#[test]
fn a_beta_that_cannot_fold_leaves_its_add_after_the_layer_norm() {
    // `… * gamma + beta` with beta [1, 1, D] computed at run time: the
    // op cannot read it as [D], so the Add stays after a LayerNormalization
    // without bias (the beta's Add is declined and the gamma's Mul is taken).
    let mut model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, true);
    let g = model.graph.as_mut().unwrap();
    let y = g.output[0].name().to_string();
    g.node.last_mut().unwrap().output[0] = "scaled".into();
    g.input.push(value_info("beta", FLOAT, Some(&dims(&[1, 1, 4]))));
    let mut b = Builder::default();
    b.node_to("Add", &["scaled", "beta"], &[&y], vec![]);
    g.node.push(NodeProto { name: Some("beta_add".into()), ..b.graph.node.remove(0) });
    let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let why: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
    assert!(why.iter().any(|r| r.contains("the beta (beta) is [1, …, 1, D] but not a constant")), "{why:?}");
    let ops: Vec<&str> = fused.graph.as_ref().unwrap().node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["LayerNormalization", "Add"]);
    assert_eq!(fused.graph.as_ref().unwrap().node[0].input, ["x", "weight"]);
    assert_equivalent(&model, &fused, "forms");
}

#[test]
fn a_layer_norm_without_gamma_gets_a_scale_of_ones_where_d_is_known() {
    // OLMo: (x - mean) / sqrt(var + eps), nothing after it.
    let mut model = norm(&dims(X), tensor(FLOAT, &[4], &ramp(4)), None, true);
    let g = model.graph.as_mut().unwrap();
    g.node.pop();
    g.initializer.retain(|t| t.name() != "weight");
    let last = g.node.last().unwrap().output[0].clone();
    g.output[0].name = Some(last.clone());
    let fused = fused_one(&model, "LayerNormalization");
    let ones = weight_read(&fused, 1);
    assert_eq!((ones.dims.as_slice(), ones.values()), (&[4][..], Some(vec![1.0; 4])));
    assert_eq!(fused.graph.as_ref().unwrap().node[0].output, [last]);
    // A symbolic last axis: the scale is computed from x's shape at run time.
    let mut symbolic = model.clone();
    symbolic.graph.as_mut().unwrap().input[0] = value_info("x", FLOAT, Some(&[D::N(2), D::N(3), sym("d")]));
    let (fused, outcome) = fuse_model(&symbolic, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "LayerNormalization"), 1, "{:?}", outcome.declined);
    assert_eq!(count_op(&fused, "ConstantOfShape"), 1);
    assert_equivalent(&symbolic, &fused, "forms");
    // x of no declared shape: its rank is not proved, and it stays.
    let mut undeclared = model.clone();
    undeclared.graph.as_mut().unwrap().input[0] = value_info("x", FLOAT, None);
    let why = declined(&undeclared);
    assert!(
        why.iter().any(|r| r.contains("a LayerNorm without gamma") && r.contains("needs its rank proved")),
        "{why:?}"
    );
}

/// A LayerNorm of x `[2, 3, 4]` whose first mean reduces `mean_axes` and
/// whose variance reduces `var_axes`, scaled by `gamma` and shifted by
/// `beta` (opset 14: axes as attributes).
fn layer_norm_over(mean_axes: &[i64], var_axes: &[i64], gamma: TensorProto, beta: TensorProto) -> ModelProto {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&dims(X)));
    let mean = b.node("ReduceMean", &["x"], vec![attr_ints("axes", mean_axes)]);
    let d = b.node("Sub", &["x", &mean], vec![]);
    let two = b.init("two", tensor(FLOAT, &[], &[2.0]));
    let sq = b.node("Pow", &[&d, &two], vec![]);
    let var = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", var_axes)]);
    let eps = b.init("eps", tensor(FLOAT, &[], &[1e-5]));
    let a = b.node("Add", &[&var, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[&d, &r], vec![]);
    let gamma = b.init("gamma", gamma);
    let scaled = b.node("Mul", &[&n, &gamma], vec![]);
    let beta = b.init("beta", beta);
    b.node_to("Add", &[&scaled, &beta], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(14)
}

#[test]
fn a_layer_norm_over_the_last_two_axes_is_layer_normalization_with_axis_minus_two() {
    let (hw, n) = (&[3, 4][..], 12);
    for axes in [&[-2, -1][..], &[1, 2], &[-1, 1]] {
        let model = layer_norm_over(axes, axes, tensor(FLOAT, hw, &ramp(n)), tensor(FLOAT, hw, &ramp(n)));
        let fused = fused_one(&model, "LayerNormalization");
        let node = &fused.graph.as_ref().unwrap().node[0];
        assert_eq!(node.attr_int("axis"), Some(-2), "{axes:?}");
        assert_eq!(node.input, ["x", "gamma", "beta"], "{axes:?}");
        assert_eq!(fused_list(node).len(), 9, "{axes:?}");
    }
    // Leading axes of 1 and a one-value gamma: constants of the two axes made for the op.
    let model = layer_norm_over(&[-2, -1], &[-2, -1], tensor(FLOAT, &[1, 3, 4], &ramp(n)), tensor(FLOAT, &[], &[0.5]));
    let fused = fused_one(&model, "LayerNormalization");
    let (gamma, beta) = (weight_read(&fused, 1), weight_read(&fused, 2));
    assert_eq!((gamma.dims.as_slice(), gamma.values()), (hw, Some(ramp(n))));
    assert_eq!((beta.dims.as_slice(), beta.values()), (hw, Some(vec![0.5; n])));
    // Over all three axes.
    let model = layer_norm_over(&[0, 1, 2], &[-3, -2, -1], tensor(FLOAT, X, &ramp(24)), tensor(FLOAT, X, &ramp(24)));
    let fused = fused_one(&model, "LayerNormalization");
    assert_eq!(fused.graph.as_ref().unwrap().node[0].attr_int("axis"), Some(-3));
}

#[test]
fn a_layer_norm_whose_means_reduce_other_axes_or_whose_weights_broadcast_does_not_fuse() {
    let hw = || tensor(FLOAT, &[3, 4], &ramp(12));
    // What stays of the model, equivalent to it, and the reasons given.
    let fuse = |model: &ModelProto| {
        let (fused, outcome) = fuse_model(model, &["layer-norm", "rms-norm"]);
        assert_equivalent(model, &fused, "forms");
        let ops: Vec<String> = fused.graph.as_ref().unwrap().node.iter().map(|n| n.op_type().to_string()).collect();
        (ops, outcome.declined.into_iter().map(|d| d.reason).collect::<Vec<_>>())
    };
    // The two means reduce different trailing axes.
    for (mean, var, why) in [
        (&[-2, -1][..], &[-1][..], "the mean reduces the last 2 axes and the variance the last 1"),
        (&[-1], &[-2, -1], "the mean reduces the last 1 axes and the variance the last 2"),
    ] {
        let (ops, declined) = fuse(&layer_norm_over(mean, var, hw(), hw()));
        assert!(!ops.iter().any(|op| op.contains("LayerNormalization")), "{ops:?}");
        assert!(declined.iter().any(|r| r.contains(why)), "{declined:?}");
    }
    // Axes that are not the trailing ones.
    let (ops, declined) = fuse(&layer_norm_over(&[0, 2], &[0, 2], tensor(FLOAT, &[2, 1, 4], &ramp(8)), hw()));
    assert_eq!(ops.len(), 9, "{ops:?}");
    assert!(declined.iter().any(|r| r.contains("reduces axes [0, 2], not the last axis alone or the last axes")));
    // A gamma of the last axis alone, or a beta of more axes, broadcasts:
    // the kernels read one weight per normalized element, so the weight
    // stays outside the norm.
    let (ops, _) = fuse(&layer_norm_over(&[-2, -1], &[-2, -1], tensor(FLOAT, &[4], &ramp(4)), hw()));
    assert_eq!(ops, ["LayerNormalization", "Mul", "Add"]);
    let (ops, declined) = fuse(&layer_norm_over(&[-2, -1], &[-2, -1], hw(), tensor(FLOAT, &[2, 3, 4], &ramp(24))));
    assert_eq!(ops, ["LayerNormalization", "Add"]);
    assert!(declined.iter().any(|r| r.contains("the beta (beta) widens the last 2 axes of x")), "{declined:?}");
    // An RMSNorm over two axes is no rms-norm (the spec: axis -1 only).
    let mut model = norm(&dims(X), hw(), None, false);
    let g = model.graph.as_mut().unwrap();
    g.node.iter_mut().find(|n| n.op_type() == "ReduceMean").unwrap().attribute = vec![attr_ints("axes", &[-2, -1])];
    assert_eq!(fuse(&model).0.len(), 6);
}

/// onnxscript's RMSNorm without a scale: `x * Reciprocal(Sqrt(mean(x²) + eps))`,
/// the normalized value read by `reader` (a graph output where none).
fn rms_without_weight(x_dims: &[D], reader: Option<(&str, onnx_fuse::onnx::TensorProto)>) -> ModelProto {
    let mut b = Builder::default();
    let n = rms_without_weight_in(&mut b, x_dims);
    let y = match reader {
        None => n,
        Some((op, t)) => {
            let w = b.init("w", t);
            b.node(op, &[&n, &w], vec![])
        }
    };
    b.output(&y, FLOAT, None);
    b.model(14)
}

/// The norm of `rms_without_weight` in `b`, of input x: its output.
fn rms_without_weight_in(b: &mut Builder, x_dims: &[D]) -> String {
    b.input("x", FLOAT, Some(x_dims));
    rms_without_weight_of(b, "x", FLOAT)
}

/// The norm of `rms_without_weight` of the value `x` (of type `elem`) in
/// `b`: its output.
fn rms_without_weight_of(b: &mut Builder, x: &str, elem: i32) -> String {
    let sq = b.node("Mul", &[x, x], vec![]);
    let m = b.node("ReduceMean", &[&sq], vec![attr_ints("axes", &[-1])]);
    let eps = b.init("eps", tensor(elem, &[], &[1e-6]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let inv = b.node("Reciprocal", &[&r], vec![]);
    b.node("Mul", &[x, &inv], vec![])
}

#[test]
fn an_rms_norm_without_weight_gets_a_weight_of_ones_where_d_is_known() {
    let model = rms_without_weight(&dims(X), None);
    let fused = fused_one(&model, "SimplifiedLayerNormalization");
    let node = &fused.graph.as_ref().unwrap().node[0];
    assert_eq!(node.input[0], "x");
    let ones = weight_read(&fused, 1);
    assert_eq!((ones.dims.as_slice(), ones.values()), (&[4][..], Some(vec![1.0; 4])));
    assert_eq!(node.attr_float("epsilon"), Some(1e-6));
    assert_eq!(fused_list(node).len(), 6, "Mul, Mul, ReduceMean, Add, Sqrt, Reciprocal");
    // Written x / r: the Div is the anchor.
    let mut div = rms_without_weight(&dims(X), None);
    let g = div.graph.as_mut().unwrap();
    let last = g.node.len() - 1;
    let r = g.node[last - 1].input[0].clone();
    g.node.remove(last - 1);
    g.node[last - 1] =
        NodeProto { op_type: Some("Div".into()), input: vec!["x".into(), r], ..g.node[last - 1].clone() };
    fused_one(&div, "SimplifiedLayerNormalization");
    // Read by a MatMul, it is still a norm without weight.
    let model = rms_without_weight(&dims(X), Some(("MatMul", tensor(FLOAT, &[4, 4], &ramp(16)))));
    let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 1, "{:?}", outcome.declined);
    assert_equivalent(&model, &fused, "forms");
}

#[test]
fn an_rms_norm_without_weight_whose_rank_is_unknown_or_whose_scale_is_not_proved_does_not_fuse() {
    // A symbolic last axis fuses (tests below); x of no declared shape, of
    // no proved rank, does not.
    let mut undeclared = rms_without_weight(&[D::N(2), D::N(3), sym("d")], None);
    undeclared.graph.as_mut().unwrap().input[0] = value_info("x", FLOAT, None);
    let why = declined(&undeclared);
    assert!(why.iter().any(|r| r.contains("a norm without weight") && r.contains("needs its rank proved")), "{why:?}");
    // A Mul by a [2, D] weight reads it: the weighted form declines it, and
    // the core is not taken alone either.
    let model = rms_without_weight(&dims(X), Some(("Mul", tensor(FLOAT, &[2, 4], &ramp(8)))));
    let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 0, "{:?}", outcome.declined);
    let why = declined(&model);
    assert!(why.iter().any(|r| r.contains("whose pattern did not match")), "{why:?}");
}

/// A norm without weight whose result is cast to f16 and read by no Mul
/// (onnxscript's mixed-precision RMSNorm: f16 in, f32 inside, f16 out) is
/// no weighted norm's start: it fuses, the Cast back stays. Where the
/// Cast is read by a Mul of an unproved weight and x was widened from f16,
/// it is: nothing fuses. Where x is f32 itself (GLM's f16 export keeps its
/// residual in f32), the Cast narrows, no weighted form folds it, and the
/// core fuses alone whatever the weight: the Cast and the Mul stay.
#[test]
fn an_rms_norm_without_weight_cast_back_fuses_where_no_mul_reads_the_cast() {
    let cast_back = |widened: bool, weight: Option<&[i64]>| {
        let mut b = Builder::default();
        let n = if widened {
            b.input("x16", FLOAT16, Some(&dims(X)));
            let x = b.node("Cast", &["x16"], vec![attr_int("to", i64::from(FLOAT))]);
            rms_without_weight_of(&mut b, &x, FLOAT)
        } else {
            rms_without_weight_in(&mut b, &dims(X))
        };
        let mut y = b.node("Cast", &[&n], vec![attr_int("to", i64::from(FLOAT16))]);
        if let Some(w) = weight {
            let values = ramp(w.iter().product::<i64>() as usize);
            let w = b.init("w", tensor(FLOAT16, w, &values));
            y = b.node("Mul", &[&y, &w], vec![]);
        }
        b.output(&y, FLOAT16, None);
        b.model(14)
    };
    for widened in [false, true] {
        let model = cast_back(widened, None);
        let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
        assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 1, "{:?}", outcome.declined);
        assert_eq!(count_op(&fused, "Cast"), 1 + usize::from(widened), "the Cast back stays");
        assert_equivalent(&model, &fused, "forms");
    }
    let model = cast_back(true, Some(&[3, 4]));
    let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 0, "{:?}", outcome.declined);
    assert!(declined(&model).iter().any(|r| r.contains("whose pattern did not match")));
    // The f16 x widened: the weighted form folds both Casts.
    let model = cast_back(true, Some(&[4]));
    let fused = fused_one(&model, "SimplifiedLayerNormalization");
    assert_eq!(count_op(&fused, "Cast") + count_op(&fused, "Mul"), 0);
    // An f32 x narrowed to an f16 core and widened back before an f32
    // weight: no weighted norm folds those Casts (testdata/fuzz/
    // rms_narrowing_casts.onnx), and the f16 core fuses alone.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&dims(X)));
    let h = b.node("Cast", &["x"], vec![attr_int("to", i64::from(FLOAT16))]);
    let n = rms_without_weight_of(&mut b, &h, FLOAT16);
    let n = b.node("Cast", &[&n], vec![attr_int("to", i64::from(FLOAT))]);
    let w = b.init("w", tensor(FLOAT, &[4], &ramp(4)));
    let y = b.node("Mul", &[&n, &w], vec![]);
    b.output(&y, FLOAT, None);
    let model = b.model(14);
    let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
    assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 1, "{:?}", outcome.declined);
    let norm = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "SimplifiedLayerNormalization");
    assert_eq!(norm.unwrap().input[0], h, "the f16 core reads x narrowed");
    assert_eq!((count_op(&fused, "Cast"), count_op(&fused, "Mul")), (2, 1));
    assert_equivalent(&model, &fused, "forms");
    // An f32 x: the core alone, read by the Cast to f16 and the weight's Mul.
    for weight in [&[4][..], &[3, 4]] {
        let model = cast_back(false, Some(weight));
        let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
        assert_eq!(count_op(&fused, "SimplifiedLayerNormalization"), 1, "{:?}", outcome.declined);
        let norm = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "SimplifiedLayerNormalization");
        assert_eq!(norm.unwrap().input[0], "x");
        assert_eq!((count_op(&fused, "Cast"), count_op(&fused, "Mul")), (1, 1), "the Cast and the weight's Mul stay");
        assert_equivalent(&model, &fused, "forms");
    }
}

/// `softmax(steps(q·k)) · v` with `q, k, v` of shape (2, 2, 3, 3); `steps`
/// writes what comes between the MatMul and the Softmax.
fn core(steps: impl Fn(&mut Builder, String) -> String, after: impl Fn(&mut Builder, String) -> String) -> ModelProto {
    let mut b = Builder::default();
    for v in ["q", "k", "v"] {
        b.input(v, FLOAT, Some(&dims(&[2, 2, 3, 3])));
    }
    b.input("hide", BOOL, Some(&dims(&[2, 1, 1, 3])));
    b.input("bias", FLOAT, Some(&dims(&[1, 2, 3, 3])));
    b.input("mask", FLOAT, Some(&dims(&[2, 1, 1, 3])));
    let s = b.node("MatMul", &["q", "k"], vec![]);
    let s = steps(&mut b, s);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let p = after(&mut b, p);
    b.node_to("MatMul", &[&p, "v"], &["out"], vec![]);
    b.output("out", FLOAT, None);
    b.model(14)
}

/// The scores, read outside the core too by `op` (a graph output).
fn scores_also_read_by(op: &'static str) -> ModelProto {
    core(
        move |b, s| {
            let read = b.node(op, &[&s], vec![]);
            b.output(&read, if op == "Shape" { INT64 } else { FLOAT }, None);
            s
        },
        |_, p| p,
    )
}

fn attention(model: &ModelProto) -> (usize, Vec<String>, ModelProto) {
    let (fused, outcome) = fuse_model(model, &["attention"]);
    (outcome.fused.len(), outcome.declined.into_iter().map(|d| d.reason).collect(), fused)
}

fn fill_through_reshape(b: &mut Builder, value: f64) -> String {
    let one = b.init(&format!("fill{value}"), tensor(FLOAT, &[], &[value]));
    let shape = b.init(&format!("shape{value}"), tensor(INT64, &[4], &[1.0, 1.0, 1.0, 1.0]));
    b.node("Reshape", &[&one, &shape], vec![])
}

/// Gemma 2's soft-capping `Tanh(s / by) * cap` (`mul`: `s * by`), then the
/// mask when `mask_first` is false, else before it.
fn softcapped(by: f64, cap: f64, mul: bool, mask_first: bool) -> ModelProto {
    core(
        move |b, s| {
            let s = b.node("Mul", &[&s, "scale"], vec![]);
            let add_mask = |b: &mut Builder, s: String| b.node("Add", &[&s, "mask"], vec![]);
            let s = if mask_first { add_mask(b, s) } else { s };
            let by = b.init("by", tensor(FLOAT, &[], &[by]));
            let t = b.node(if mul { "Mul" } else { "Div" }, &[&s, &by], vec![]);
            let t = b.node("Tanh", &[&t], vec![]);
            let cap = b.init("cap", tensor(FLOAT, &[], &[cap]));
            let s = b.node("Mul", &[&cap, &t], vec![]);
            if mask_first {
                s
            } else {
                add_mask(b, s)
            }
        },
        |_, p| p,
    )
}

fn with_scale(mut model: ModelProto) -> ModelProto {
    model
        .graph
        .as_mut()
        .unwrap()
        .initializer
        .push(TensorProto { name: Some("scale".into()), ..tensor(FLOAT, &[], &[0.125]) });
    model
}

#[test]
fn soft_capping_before_the_mask_is_a_step_of_the_core() {
    for (mul, by, form) in [(false, 0.5, "mul.softcap.add.softmax"), (true, 2.0, "mul.softcap_mul.add.softmax")] {
        let model = with_scale(softcapped(by, 0.5, mul, false));
        let (n, why, fused) = attention(&model);
        assert_eq!(n, 1, "{why:?}");
        let node = &fused.graph.as_ref().unwrap().node[0];
        assert_eq!(node.overload(), form);
        assert_eq!(node.input[..4], ["q", "k", "v", "mask"]);
        let ops: Vec<&str> = fused.functions[0].node.iter().map(|n| n.op_type()).collect();
        let capped = ["MatMul", "Mul", if mul { "Mul" } else { "Div" }, "Tanh", "Mul", "Add", "Softmax", "MatMul"];
        assert_eq!(ops.iter().filter(|op| **op != "Constant").copied().collect::<Vec<_>>(), capped);
        assert_equivalent(&model, &fused, "softcap");
    }
    // After the mask, hidden keys would keep the weight of -cap.
    let (n, why, _) = attention(&with_scale(softcapped(0.5, 0.5, false, true)));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("the soft-cap is applied after the mask")), "{why:?}");
    // Divided by one value and multiplied by another: no one cap.
    let (n, why, _) = attention(&with_scale(softcapped(0.5, 0.25, false, false)));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("not one cap")), "{why:?}");
}

/// Megatron's mask on the scores: `s·m − 10000·(1 − m)`, m read from `m`.
fn megatron(m_of: fn(&mut Builder) -> String) -> ModelProto {
    core(
        move |b, s| {
            let m = m_of(b);
            let one = b.init("one", tensor(FLOAT, &[], &[1.0]));
            let penalty = b.init("penalty", tensor(FLOAT, &[], &[10000.0]));
            let kept = b.node("Mul", &[&s, &m], vec![]);
            let hidden = b.node("Sub", &[&one, &m], vec![]);
            let hidden = b.node("Mul", &[&hidden, &penalty], vec![]);
            b.node("Sub", &[&kept, &hidden], vec![])
        },
        |_, p| p,
    )
}

#[test]
fn megatrons_mask_of_zeros_and_ones_is_a_step_of_the_core() {
    let model = megatron(|b| b.node("Cast", &["hide"], vec![attr_int("to", FLOAT as i64)]));
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "megatron_mask.softmax");
    assert_eq!(node.input[..3], ["q", "k", "v"]);
    // The mask m, then the initializers the body reads (constants shared
    // with no node are inputs of the function).
    assert_eq!(node.input[4..], ["one", "penalty"], "the mask m: {:?}", node.input);
    assert_eq!(fused.functions[0].input, ["q", "k", "v", "keep_mask", "input_4", "input_5"]);
    assert_equivalent(&model, &fused, "megatron");
    // m a float input: not proved to hold only 0 and 1.
    let (n, why, _) = attention(&megatron(|_| "mask".to_string()));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("is not proved to hold only 0 and 1")), "{why:?}");
    // m a Where of the constants 0 and 1 (`fold::values_held`, as SDPA's
    // masks of 0 and -inf are read): a step; of 0 and 2, no mask.
    fn selected(b: &mut Builder, kept: f64) -> String {
        let (zero, kept) = (b.init("zero", tensor(FLOAT, &[], &[0.0])), b.init("kept", tensor(FLOAT, &[], &[kept])));
        b.node("Where", &["hide", &zero, &kept], vec![])
    }
    let model = megatron(|b| selected(b, 1.0));
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    assert_equivalent(&model, &fused, "megatron, m a Where of 0 and 1");
    let (n, why, _) = attention(&megatron(|b| selected(b, 2.0)));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("is not proved to hold only 0 and 1")), "{why:?}");
}

/// The softmax's shift written out (DALLE-pytorch's stable softmax): the
/// mask added, then `s − ReduceMax(s)` with the reduction's `attributes`;
/// `shown`, its largest value also a graph output.
fn centered(attributes: fn() -> Vec<onnx_fuse::onnx::AttributeProto>, shown: bool) -> ModelProto {
    core(
        move |b, s| {
            let s = b.node("Add", &[&s, "mask"], vec![]);
            let max = b.node("ReduceMax", &[&s], attributes());
            if shown {
                b.output(&max, FLOAT, None);
            }
            b.node("Sub", &[&s, &max], vec![])
        },
        |_, p| p,
    )
}

#[test]
fn the_row_maximum_subtracted_over_the_last_axis_is_a_step_of_the_core() {
    let last = || vec![attr_ints("axes", &[-1])];
    let model = centered(last, false);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "add.centered.softmax");
    assert_eq!(node.input, ["q", "k", "v", "mask"]);
    let ops: Vec<&str> = fused.functions[0].node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Add", "ReduceMax", "Sub", "Softmax", "MatMul"]);
    assert_equivalent(&model, &fused, "centered");
    // The last axis named by its index, and the largest value read
    // elsewhere too: the same step, the output computes the original.
    let (n, why, _) = attention(&centered(|| vec![attr_ints("axes", &[3])], false));
    assert_eq!(n, 1, "{why:?}");
    let model = centered(last, true);
    let (_, _, fused) = attention(&model);
    assert_equivalent(&model, &fused, "centered, the maximum a graph output");
    // Over another axis, or not kept: no shift the softmax makes.
    let (n, why, _) = attention(&centered(|| vec![attr_ints("axes", &[2])], false));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("ReduceMax") && r.contains("not the last axis alone")), "{why:?}");
    let (n, why, _) = attention(&centered(|| vec![attr_ints("axes", &[-1]), attr_int("keepdims", 0)], false));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("does not keep dims")), "{why:?}");
}

/// SwinV2's learned scale: the scores times `Exp(Clip(logit_scale))`, a
/// value of shape `dims` computed at run time.
fn per_head_scale(dims: &'static [i64]) -> ModelProto {
    core(
        move |b, s| {
            let n: i64 = dims.iter().product();
            let logit = b.init("logit_scale", tensor(FLOAT, dims, &(0..n).map(|i| 0.1 * i as f64).collect::<Vec<_>>()));
            let max = b.init("max", tensor(FLOAT, &[], &[4.6]));
            let clipped = b.node("Min", &[&logit, &max], vec![]);
            let scale = b.node("Exp", &[&clipped], vec![]);
            b.node("Mul", &[&scale, &s], vec![])
        },
        |_, p| p,
    )
}

#[test]
fn a_per_head_scale_computed_at_run_time_is_an_input_of_the_core() {
    let model = per_head_scale(&[1, 2, 1, 1]);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "mul_input.softmax");
    assert_eq!(node.input.len(), 4, "q, k, v, the multiplier: {:?}", node.input);
    assert_equivalent(&model, &fused, "swinv2");
    // A scale whose broadcast widens the scores (a leading axis of 3).
    let (n, why, _) = attention(&per_head_scale(&[3, 1, 1, 1, 1]));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("not proved to leave the scores' shape as it is")), "{why:?}");
}

/// `softmax(FusedMatMul(q, key, alpha, transB = 1) + mask) · v`, with the
/// key untransposed; `trans_a` sets transA as well.
fn fused_matmul_scores(trans_a: bool) -> ModelProto {
    let mut b = Builder::default();
    for v in ["q", "key", "v"] {
        b.input(v, FLOAT, Some(&dims(&[2, 2, 3, 3])));
    }
    b.input("mask", FLOAT, Some(&dims(&[2, 1, 1, 3])));
    let mut attributes = vec![attr_float("alpha", 0.35), attr_int("transB", 1)];
    if trans_a {
        attributes.push(attr_int("transA", 1));
    }
    let s = fused_matmul(&mut b, attributes);
    let s = b.node("Add", &[&s, "mask"], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    b.node_to("MatMul", &[&p, "v"], &["out"], vec![]);
    b.output("out", FLOAT, None);
    importing_microsoft(b.model(14))
}

/// `com.microsoft.FusedMatMul(q, key)` with `attributes`.
fn fused_matmul(b: &mut Builder, attributes: Vec<onnx_fuse::onnx::AttributeProto>) -> String {
    let s = b.node("FusedMatMul", &["q", "key"], attributes);
    b.graph.node.last_mut().unwrap().domain = Some("com.microsoft".into());
    s
}

/// `model` importing ONNX Runtime's domain, for its ops.
fn importing_microsoft(mut model: ModelProto) -> ModelProto {
    model
        .opset_import
        .push(onnx_fuse::onnx::OperatorSetIdProto { domain: Some("com.microsoft".into()), version: Some(1) });
    model
}

#[test]
fn fused_matmul_scores_with_their_alpha_are_a_core() {
    let model = fused_matmul_scores(false);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "fused_matmul.add.softmax");
    assert_eq!(node.input, ["q", "key", "v", "mask"]);
    let scores = &fused.functions[0].node[0];
    assert_eq!((scores.domain(), scores.op_type()), ("com.microsoft", "FusedMatMul"));
    assert_eq!((scores.attr_float("alpha"), scores.attr_int("transB")), (Some(0.35), Some(1)));
    assert_equivalent(&model, &fused, "fused_matmul");
    // transA: q transposed, not the core's q·k.
    let (n, why, _) = attention(&fused_matmul_scores(true));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("transposes q (transA)")), "{why:?}");
}

/// yobx's local attention once its scores are fused: `FusedMatMul(q, key,
/// alpha, transB = 1)` plus a boolean mask made additive,
/// `Where(mask, 0, -inf)`, and the NaN guard of rows the mask hides
/// whole, `Where(IsNaN(p), 0, p)`, before the product with v.
#[test]
fn a_masked_fused_matmul_core_with_its_nan_guard_is_a_core() {
    let mut b = Builder::default();
    for v in ["q", "key", "v"] {
        b.input(v, FLOAT, Some(&dims(&[2, 2, 3, 3])));
    }
    b.input("mask", BOOL, Some(&dims(&[2, 1, 3, 3])));
    let s = fused_matmul(&mut b, vec![attr_float("alpha", 0.35), attr_int("transB", 1)]);
    let zero = b.init("zero", tensor(FLOAT, &[1], &[0.0]));
    let hidden = b.init("minus_infinity", tensor(FLOAT, &[1], &[f64::NEG_INFINITY]));
    let bias = b.node("Where", &["mask", &zero, &hidden], vec![]);
    let s = b.node("Add", &[&s, &bias], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let nan = b.node("IsNaN", &[&p], vec![]);
    let p = b.node("Where", &[&nan, &zero, &p], vec![]);
    b.node_to("MatMul", &[&p, "v"], &["out"], vec![]);
    b.output("out", FLOAT, None);
    let model = importing_microsoft(b.model(18));
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "fused_matmul.add.softmax.nan_guard");
    assert_eq!(fused.functions[0].node[0].attr_float("alpha"), Some(0.35));
    assert_equivalent(&model, &fused, "masked fused_matmul");
}

/// Keras's attention as tf2onnx writes it: `einsum(key, query)` over the
/// head axis into (batch, heads, query, key), scaled and masked, the
/// probabilities' `Einsum` with the value back to (batch, query, heads,
/// head size).
fn einsum_core(scores_equation: &str, out_equation: &str, value: &[i64]) -> ModelProto {
    let equation = |e: &str| attr_string("equation", e);
    let mut b = Builder::default();
    b.input("query", FLOAT, Some(&dims(&[2, 3, 2, 4])));
    b.input("key", FLOAT, Some(&dims(&[2, 5, 2, 4])));
    b.input("value", FLOAT, Some(&dims(value)));
    b.input("mask", FLOAT, Some(&dims(&[2, 1, 1, 5])));
    let s = b.node("Einsum", &["key", "query"], vec![equation(scores_equation)]);
    let scale = b.init("scale", tensor(FLOAT, &[], &[0.5]));
    let s = b.node("Mul", &[&s, &scale], vec![]);
    let s = b.node("Add", &[&s, "mask"], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    b.node_to("Einsum", &[&p, "value"], &["out"], vec![equation(out_equation)]);
    b.output("out", FLOAT, None);
    b.model(14)
}

/// The equations of the Einsums of the core's function, in order.
fn einsum_equations(fused: &ModelProto) -> Vec<String> {
    let einsums = fused.functions[0].node.iter().filter(|n| n.op_type() == "Einsum");
    einsums.map(|n| String::from_utf8(n.attr("equation").unwrap().s.clone().unwrap().to_vec()).unwrap()).collect()
}

#[test]
fn a_core_written_with_einsums_is_a_core() {
    let model = einsum_core("aecd,abcd->acbe", "acbe,aecd->abcd", &[2, 5, 2, 4]);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "einsum_kq.mul.add.softmax.einsum_v");
    assert_eq!(node.input[..4], ["query", "key", "value", "mask"], "q, k, v in the core's order");
    assert_eq!(einsum_equations(&fused), ["aecd,abcd->acbe", "acbe,aecd->abcd"]);
    assert_equivalent(&model, &fused, "einsum");
    // Contracting a sequence axis (the key's), or a probabilities' Einsum
    // that keeps their last axis: no attention core.
    // A head of v of another size than the key's: the letter would broadcast.
    for (scores, out, value, why) in [
        ("aecd,abcd->acbd", "acbe,aecd->abcd", &[2, 4, 2, 4], "does not contract one head axis of q and k"),
        ("aecd,abcd->acbe", "acbe,abcd->aecd", &[2, 5, 2, 4], "does not contract the probabilities' last axis alone"),
        ("aecd,abcd->acbe", "acbe,aecd->abcd", &[2, 5, 1, 4], "operands give c the axes 2 and 1, not proved equal"),
    ] {
        let (n, declined, _) = attention(&einsum_core(scores, out, value));
        assert_eq!(n, 0, "{scores} {out}");
        assert!(declined.iter().any(|r| r.contains(why)), "{scores} {out}: {declined:?}");
    }
}

#[test]
fn an_einsum_core_with_an_ellipsis_is_a_core() {
    // LongT5's spelling: the leading axes as an ellipsis, each read as a
    // letter of its own, so that the operands' are proved alike.
    let (scores, out) = ("...ecd,...bcd->...cbe", "...cbe,...ecd->...bcd");
    let model = einsum_core(scores, out, &[2, 5, 2, 4]);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    assert_eq!(einsum_equations(&fused), [scores, out]);
    assert_equivalent(&model, &fused, "einsum with an ellipsis");
    // Near-misses: an ellipsis the operands give axes of other sizes (ONNX
    // broadcasts an ellipsis), or one operand's alone.
    for (scores, out, value, why) in [
        (scores, out, &[1, 5, 2, 4], "operands give A the axes 2 and 1, not proved equal"),
        ("...ecd,abcd->...cbe", out, &[2, 5, 2, 4], "an ellipsis of axes not proved alike"),
    ] {
        let (n, declined, _) = attention(&einsum_core(scores, out, value));
        assert_eq!(n, 0, "{scores} {out}");
        assert!(declined.iter().any(|r| r.contains(why)), "{scores} {out}: {declined:?}");
    }
}

#[test]
fn a_penalty_of_one_minus_the_mask_subtracted_from_the_scores_is_a_term_subtracted() {
    // Funnel: `s − 1e6 · (1 − m)`, the scores not multiplied by m (that
    // would be Megatron's mask): the core subtracts the term as it is.
    let model = core(
        |b, s| {
            let one = b.init("one", tensor(FLOAT, &[], &[1.0]));
            let big = b.init("big", tensor(FLOAT, &[], &[1.0e6]));
            let hidden = b.node("Sub", &[&one, "mask"], vec![]);
            let penalty = b.node("Mul", &[&big, &hidden], vec![]);
            b.node("Sub", &[&s, &penalty], vec![])
        },
        |_, p| p,
    );
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "sub.softmax");
    assert_equivalent(&model, &fused, "a penalty subtracted");
}

#[test]
fn a_term_subtracted_from_the_scores_is_a_step_and_one_they_are_subtracted_from_is_not() {
    // XLNet: `score - 1e30 * mask`.
    let model = core(|b, s| b.node("Sub", &[&s, "mask"], vec![]), |_, p| p);
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "sub.softmax");
    assert_eq!(node.input, ["q", "k", "v", "mask"]);
    assert_equivalent(&model, &fused, "sub");
    let (n, why, _) = attention(&core(|b, s| b.node("Sub", &["mask", &s], vec![]), |_, p| p));
    assert_eq!(n, 0, "mask − scores is no step");
    assert!(why.iter().any(|r| r.contains("mask is not computed by the graph")), "{why:?}");
}

/// OPT's and BART's eager attention before transformers 4.36 clamp the
/// masked scores at the float's lowest, `Max(s + mask, lowest)`: a step of
/// the core (written in three places: its `Step`, its token, its matcher),
/// in the function as matched; no translator to ONNX `Attention` takes it.
#[test]
fn scores_clamped_by_a_max_are_a_step_of_the_core() {
    let clamped = |bound: Option<f64>| {
        core(
            move |b, s| {
                let s = b.node("Add", &[&s, "mask"], vec![]);
                let bound = match bound {
                    Some(c) => b.constant(tensor(FLOAT, &[], &[c])),
                    None => "bias".to_string(),
                };
                b.node("Max", &[&s, &bound], vec![])
            },
            |_, p| p,
        )
    };
    let model = clamped(Some(f32::MIN as f64));
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = fused.graph.as_ref().unwrap().node.iter().find(|n| n.op_type() == "AttentionCore").unwrap();
    assert_eq!(node.overload(), "add.max.softmax");
    assert_eq!(node.input, ["q", "k", "v", "mask"]);
    let ops: Vec<&str> = fused.functions[0].node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Add", "Constant", "Max", "Softmax", "MatMul"]);
    assert_equivalent(&model, &fused, "max");
    // A bound computed at run time (here a tensor of the scores' shape) is
    // no one-value constant: no step.
    let (n, why, _) = attention(&clamped(None));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("the Max's bound")), "{why:?}");
    // A bound above a fill would give hidden keys weight again.
    let (n, why, _) = attention(&clamped(Some(-100.0)));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("not at most -1e4")), "{why:?}");
    // Where the opset has ONNX's Attention, the kernel does not take it.
    let mut at_23 = model.clone();
    at_23.opset_import.iter_mut().filter(|o| o.domain().is_empty()).for_each(|o| o.version = Some(23));
    let (_, outcome) = fuse_model(&at_23, &["attention"]);
    let note = outcome.fused[0].note.clone().unwrap_or_default();
    assert!(note.contains("a step max of the core: no step ONNX Attention takes"), "{note}");
}

/// SDPA's decomposition with a cache, the key scaled by √scale before its
/// transpose (experimental-experiment's MHA test), and also cast to its
/// own type first (GPT-J's present key): the key is the cache, read whole,
/// and the note says so (it said "neither a KV cache nor grouped heads");
/// the core equals the original.
#[test]
fn a_cache_scaled_before_its_transpose_is_a_cache() {
    for cast in [false, true] {
        cache_scaled_before_its_transpose(cast);
    }
}

fn cache_scaled_before_its_transpose(cast: bool) {
    let mut b = Builder::default();
    for (name, seq) in [("keys", "s"), ("values", "s"), ("past_keys", "p"), ("past_values", "p")] {
        b.input(name, FLOAT, Some(&[sym("b"), D::N(2), sym(seq), D::N(4)]));
    }
    b.input("query", FLOAT, Some(&[sym("b"), D::N(2), sym("s"), D::N(4)]));
    let mut key = b.node("Concat", &["past_keys", "keys"], vec![attr_int("axis", -2)]);
    if cast {
        key = b.node("Cast", &[&key], vec![attr_int("to", i64::from(FLOAT))]);
    }
    let value = b.node("Concat", &["past_values", "values"], vec![attr_int("axis", -2)]);
    let root = b.init("root_scale", tensor(FLOAT, &[1], &[0.5f64.sqrt()]));
    let q = b.node("Mul", &["query", &root], vec![]);
    let k = b.node("Mul", &[&key, &root], vec![]);
    let k = b.node("Transpose", &[&k], vec![attr_ints("perm", &[0, 1, 3, 2])]);
    let s = b.node("MatMul", &[&q, &k], vec![]);
    let p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    let out = b.node("MatMul", &[&p, &value], vec![]);
    for v in [&out, &key, &value] {
        b.output(v, FLOAT, None);
    }
    let model = b.model(23);
    let (fused, outcome) = fuse_model(&model, &["attention"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let note = outcome.fused[0].note.clone().unwrap_or_default();
    assert!(note.contains("a cache without grouped heads whose key the export only transposes, or scales"), "{note}");
    assert_equivalent(&model, &fused, "forms");
}

#[test]
fn masked_fill_with_a_reshaped_fill_is_a_core() {
    let model = core(
        |b, s| {
            let fill = fill_through_reshape(b, -3.4e38);
            b.node("Where", &["hide", &fill, &s], vec![])
        },
        |_, p| p,
    );
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = &fused.graph.as_ref().unwrap().node[0];
    assert_eq!(node.overload(), "masked_fill.softmax");
    assert_eq!(node.input[..4], ["q", "k", "v", "hide"]);
    let f = fused.functions.iter().find(|f| f.overload() == "masked_fill.softmax").unwrap();
    // The fill and its Reshape's shape are initializers: inputs after the mask.
    assert_eq!(f.input, ["q", "k", "v", "hide", "input_4", "input_5"]);
    assert_equivalent(&model, &fused, "forms");
    // A fill of -100 (through a Reshape too) leaves hidden keys weight.
    let model = core(
        |b, s| {
            let fill = fill_through_reshape(b, -100.0);
            b.node("Where", &["hide", &fill, &s], vec![])
        },
        |_, p| p,
    );
    let (n, why, _) = attention(&model);
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("the Where fill is -100, not at most -1e4")), "{why:?}");
    // A fill computed at run time, `Cast(mask)`: the reason names both
    // branches (it named the scores as the fill before, issue 39).
    let model = core(
        |b, s| {
            let fill = b.node("Cast", &["mask"], vec![attr_int("to", FLOAT as i64)]);
            b.node("Where", &["hide", &fill, &s], vec![])
        },
        |_, p| p,
    );
    let (n, why, _) = attention(&model);
    assert_eq!(n, 0);
    assert!(
        why.iter().any(|r| r.contains("neither branch of the Where") && r.contains("is a constant fill")),
        "{why:?}"
    );
}

#[test]
fn scores_whose_shape_alone_is_read_elsewhere_keep_their_matmul() {
    let model = scores_also_read_by("Shape");
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let ops: Vec<&str> = fused.graph.as_ref().unwrap().node.iter().map(|n| n.op_type()).collect();
    assert_eq!(ops, ["MatMul", "Shape", "AttentionCore"], "the MatMul stays for the Shape");
    let core = &fused.graph.as_ref().unwrap().node[2];
    assert_eq!(fused_list(core), ["MatMul n3_MatMul", "Softmax n2_Softmax"], "the kept MatMul n0 is not listed");
    assert_equivalent(&model, &fused, "forms");
    // Any other reader needs the scores' values: no core.
    let (n, why, _) = attention(&scores_also_read_by("Neg"));
    assert_eq!(n, 0);
    assert!(why.iter().any(|r| r.contains("is also read outside the matched nodes")), "{why:?}");
}

#[test]
fn a_mask_computed_from_the_scores_is_no_core() {
    // s + (-s): the mask needs the scores' values, so their MatMul would
    // stay beside a core that computes q·k again.
    let model = core(
        |b, s| {
            let minus = b.node("Neg", &[&s], vec![]);
            b.node("Add", &[&s, &minus], vec![])
        },
        |_, p| p,
    );
    let (n, why, _) = attention(&model);
    assert_eq!(n, 0);
    let expected = "is computed from n0_MatMul, a node of the match the replacement would compute again";
    assert!(why.iter().any(|r| r.contains(expected)), "{why:?}");
}

#[test]
fn several_additive_terms_are_inputs_in_their_order() {
    let model = core(
        |b, s| {
            let s = b.node("Add", &[&s, "bias"], vec![]);
            b.node("Add", &["mask", &s], vec![])
        },
        |_, p| p,
    );
    let (n, why, fused) = attention(&model);
    assert_eq!(n, 1, "{why:?}");
    let node = &fused.graph.as_ref().unwrap().node[0];
    assert_eq!(node.overload(), "add.add.softmax");
    assert_eq!(node.input, ["q", "k", "v", "bias", "mask"]);
    let f = fused.functions.iter().find(|f| f.overload() == "add.add.softmax").unwrap();
    assert_eq!(f.input, ["q", "k", "v", "mask", "mask_2"]);
    assert_equivalent(&model, &fused, "forms");
}

#[test]
fn an_inference_dropout_is_no_step_and_a_training_one_no_core() {
    let dropout = |training: Option<f64>| {
        move |b: &mut Builder, p: String| {
            let ratio = b.init("ratio", tensor(FLOAT, &[], &[0.5]));
            match training {
                None => b.node("Dropout", &[&p, &ratio], vec![]),
                Some(t) => {
                    let t = b.init("training", tensor(BOOL, &[], &[t]));
                    b.node("Dropout", &[&p, &ratio, &t], vec![])
                }
            }
        }
    };
    for training in [None, Some(0.0)] {
        let model = core(|_, s| s, dropout(training));
        let (n, why, fused) = attention(&model);
        assert_eq!(n, 1, "{training:?}: {why:?}");
        assert_eq!(fused.graph.as_ref().unwrap().node[0].overload(), "softmax");
        assert_equivalent(&model, &fused, "forms");
    }
    let (n, _, _) = attention(&core(|_, s| s, dropout(Some(1.0))));
    assert_eq!(n, 0, "a Dropout in training mode is random");
}

/// onnxscript's norm without a scale, `x · Reciprocal(Sqrt(mean(x²) + eps))`,
/// over a last axis no number is known of: its scale of ones is computed
/// from x's shape at run time (`ConstantOfShape(Shape(x)[-1:])`; before
/// opset 15 through a Slice), and the centered form becomes a LayerNorm the
/// same way. Where x's rank is not proved (a scalar's "last axis" runs as
/// primitives, not as the op), it stays, with its reason.
#[test]
fn a_norm_without_weight_over_a_symbolic_axis_gets_ones_computed_at_run_time() {
    let weightless = |opset: i64, declared: Option<&[D]>, centered: bool| {
        let mut b = Builder::default();
        b.input("x", FLOAT, declared);
        let x = if centered {
            let mean = b.node("ReduceMean", &["x"], vec![attr_ints("axes", &[-1])]);
            b.node("Sub", &["x", &mean], vec![])
        } else {
            "x".to_string()
        };
        let square = b.node("Mul", &[&x, &x], vec![]);
        let mean = b.node("ReduceMean", &[&square], vec![attr_ints("axes", &[-1])]);
        let eps = b.init("eps", tensor(FLOAT, &[], &[1e-6]));
        let sum = b.node("Add", &[&mean, &eps], vec![]);
        let root = b.node("Sqrt", &[&sum], vec![]);
        let inverse = b.node("Reciprocal", &[&root], vec![]);
        b.node_to("Mul", &[&x, &inverse], &["y"], vec![]);
        b.output("y", FLOAT, None);
        b.model(opset)
    };
    let symbolic = [sym("b"), sym("s"), sym("d")];
    for (opset, centered, op) in [
        (14, false, "SimplifiedLayerNormalization"),
        (17, false, "SimplifiedLayerNormalization"),
        (17, true, "LayerNormalization"),
    ] {
        let model = weightless(opset, Some(&symbolic), centered);
        let (fused, outcome) = fuse_model(&model, &["layer-norm", "rms-norm"]);
        assert_eq!(outcome.fused.len(), 1, "opset {opset}: {:?}", outcome.declined);
        let nodes = &fused.graph.as_ref().unwrap().node;
        let ops: Vec<&str> = nodes.iter().map(|n| n.op_type()).collect();
        let ones = if opset >= 15 {
            vec!["Shape", "ConstantOfShape", op]
        } else {
            vec!["Shape", "Constant", "Constant", "Slice", "ConstantOfShape", op]
        };
        assert_eq!(ops, ones, "opset {opset}");
        let norm = nodes.last().unwrap();
        assert_eq!(norm.input[1], nodes[nodes.len() - 2].output[0], "the scale is the ones");
        assert_eq!(norm.attr_int("axis"), Some(-1));
        assert_equivalent(&model, &fused, "forms");
    }
    let why = declined(&weightless(17, None, false));
    assert!(why.iter().any(|r| r.contains("needs its rank proved")), "{why:?}");
}
