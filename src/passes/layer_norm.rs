//! layer-norm: `d = x - mean(x, axis=-1)`, `(d / sqrt(mean(d², -1) + eps)) * gamma + beta`
//!          → `LayerNormalization(x, gamma, beta)`, axis -1, epsilon eps, stash_type 1.
//!
//! Without beta (`… * gamma` alone, as Cohere, ModernBERT and MPT write
//! it) the op gets no bias input; without gamma either (OLMo) it gets a
//! `[D]` scale of ones.
//!
//! The normalization of `d` is the rms-norm core, so this pass reuses it
//! (`d` may be computed twice by identical `Sub` nodes, one per use);
//! gamma and beta follow the weight rule (proved shape `[D]`, D the last
//! axis of x, constant or not; or constants `[1, …, 1, D]` or of one value,
//! read as `[D]` constants made for the op);
//! when rms-norm ran first and already turned `… * gamma` into a
//! `SimplifiedLayerNormalization(d, gamma)`, or a `LayerNormalization(x,
//! gamma)` without bias precedes the beta, that node is accepted in its
//! place and its provenance list folds into this one.

use crate::graph::{Check, Graph, Relabel, Stop, Target};
use crate::onnx::{type_text, NodeProto};
use crate::pattern::{self, either_order, is_vector};
use crate::rewrite::{node, Match, Pass, Portable, Rewrite};
use crate::{candidate, decline, no_candidate, require};

use super::rms_norm::{norm_attributes, rms_core};

pub const PASS: Pass = Pass {
    name: "layer-norm",
    summary: "(x - mean(x)) / sqrt(var(x) + eps) * gamma + beta  ->  LayerNormalization",
    default: true,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: None,
    rule,
};

/// What `--target portable` writes.
const PORTABLE: Portable = Portable { op: "LayerNormalization", since: 17 };

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    if g.node(index).is("Mul") || g.node(index).is("Div") {
        return without_beta(g, index).or_if_no_candidate(|| without_gamma(g, index));
    }
    let out = pattern::anchor(g, index, "Add")?;
    pattern::anchor_operands(
        out,
        "a beta of one axis (leading axes of 1 aside)",
        |b| may_be_weight(g, b),
        |scaled, beta| {
            let norm = scaled_norm(g, scaled)?;
            let x = if norm.centered { norm.input } else { centered(g, norm.input, norm.axes)? };
            layer_normalization(g, Match::new(index), x, norm.gamma, Some(beta), norm.eps, norm.axes)
        },
    )
    .or_if_no_candidate(|| beta_not_a_vector(g, index))
}

/// `n(x - mean(x)) * gamma` with no beta after it (Cohere's, ModernBERT's
/// and MPT's norms). Where the core is no normalization of a centered
/// value, the Mul is rms-norm's to judge (or nothing): no candidate here.
/// Where an Add of a beta follows, its match holds this one and the
/// driver takes it instead.
fn without_beta(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = pattern::anchor(g, index, "Mul")?;
    pattern::anchor_operands(
        out,
        "a gamma of one axis (leading axes of 1 aside)",
        |c| may_be_weight(g, c),
        |n, gamma| {
            let core = rms_core(g, n).or_no_candidate()?;
            let x = centered(g, core.x, core.axes).or_no_candidate()?;
            layer_normalization(g, Match::new(index), x, gamma, None, core.eps, core.axes)
        },
    )
}

/// `n(x - mean(x))` alone, with neither gamma nor beta (OLMo's
/// non-parametric LayerNorm): `LayerNormalization(x, ones)`, a `[D]` scale
/// of ones made for it, which multiplies exactly. Where the Mul of a gamma
/// follows, its match holds this one and the driver takes it instead.
fn without_gamma(g: &Graph, index: usize) -> Check<Rewrite> {
    let last = g.node(index);
    candidate!(last.input.len() == 2);
    let n = &last.output[0];
    let core = rms_core(g, n).or_no_candidate()?;
    let x = centered(g, core.x, core.axes).or_no_candidate()?;
    require!(g.elem_type(x) == Some(core.elem_type), "x and eps do not share one element type");
    if g.target == Target::Portable {
        g.require_portable(PORTABLE)?;
    }
    let mut m = Match::new(index);
    let gamma = m.ones_over(g, x, core.axes, core.elem_type, "gamma").or_decline(|| {
        format!("a LayerNorm without gamma: the last axes of {} are no known numbers, and a scale of ones computed at run time needs its rank proved and opset 10 (bf16: 20)", x)
    })?;
    Ok(m.replace_with(node("LayerNormalization", &[x, &gamma], norm_attributes(core.eps, core.axes))))
}

/// The x of `d = Sub(x, ReduceMean(x))` over the last `axes` axes, the
/// axes the variance's mean reduces.
fn centered<'a>(g: &Graph<'a>, d: &'a str, axes: usize) -> Check<&'a str> {
    let sub = g.produced_by(d, "Sub")?;
    let (x, mean) = (g.node(sub).input[0].as_str(), g.node(sub).input[1].as_str());
    let mean = g.produced_by(mean, "ReduceMean")?;
    require!(g.node(mean).input[0] == x, "the mean is not of the value it is subtracted from");
    let centered_over = pattern::reduce_mean_last_axes(g, mean)?;
    require!(
        centered_over == axes,
        "the mean reduces the last {centered_over} axes and the variance the last {axes} (ReduceMean {})",
        g.node(mean).name()
    );
    Ok(x)
}

/// An operand that may be gamma or beta: of one axis (leading axes of 1
/// aside), or a constant of more (a LayerNorm over several axes).
fn may_be_weight(g: &Graph, value: &str) -> bool {
    is_vector(g, value) || g.constant(value).is_some_and(|t| t.dims.len() >= 2)
}

/// `LayerNormalization(x, gamma[, beta])`, once gamma and beta are proved
/// weights of x in x's element type, where the target has the op.
fn layer_normalization<'a>(
    g: &Graph<'a>,
    mut m: Match,
    x: &'a str,
    gamma: &'a str,
    beta: Option<&'a str>,
    eps: f32,
    axes: usize,
) -> Check<Rewrite> {
    let weight = |value: &'a str, what: &str| match axes {
        1 => pattern::weight(g, value, x, what),
        _ => pattern::weight_over(g, value, x, axes, what),
    };
    let gamma_weight = weight(gamma, "gamma")?;
    let beta_weight = beta.map(|beta| weight(beta, "beta")).transpose()?;
    let gamma_type = g.elem_type(gamma);
    require!(
        beta.is_none_or(|b| g.elem_type(b) == gamma_type) && g.elem_type(x).is_none_or(|t| Some(t) == gamma_type),
        "x, gamma and beta do not share one element type"
    );
    // ONNX defines LayerNormalization from opset 17; below, only ONNX
    // Runtime's registration runs it.
    if g.target == Target::Portable {
        g.require_portable(PORTABLE)?;
    }
    let mut inputs = vec![x.to_string(), m.weight_input(g, gamma_weight, "gamma")];
    inputs.extend(beta_weight.map(|b| m.weight_input(g, b, "beta")));
    let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
    Ok(m.replace_with(node("LayerNormalization", &inputs, norm_attributes(eps, axes))))
}

/// An Add with no operand of rank ≤ 1 is no candidate, unless one operand
/// is the scaled norm: then the reason is beta's shape. (A fused norm read
/// by a residual Add, whose other operand is no constant, is no candidate
/// either.)
fn beta_not_a_vector(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = g.node(index);
    for (scaled, beta) in [(&out.input[0], &out.input[1]), (&out.input[1], &out.input[0])] {
        let primitives = g.producer(scaled).is_some_and(|p| g.node(p).is("Mul"));
        if (primitives || g.constant(beta).is_some()) && scaled_norm(g, scaled).is_ok() {
            decline!("the beta ({beta}) is not proved to have one axis (leading axes of 1 aside)");
        }
    }
    no_candidate!()
}

/// `n(d) * gamma`: the primitives, the `SimplifiedLayerNormalization` (or
/// `RMSNormalization`) rms-norm writes for them, or a `LayerNormalization`
/// without a bias (which is already centered: the beta folds into it).
struct Scaled<'a> {
    /// d, or x when `centered`.
    input: &'a str,
    centered: bool,
    gamma: &'a str,
    eps: f32,
    /// The trailing axes normalized.
    axes: usize,
}

fn scaled_norm<'a>(g: &Graph<'a>, scaled: &'a str) -> Check<Scaled<'a>> {
    let p = g.first_computing(scaled)?;
    let node = g.node(p);
    let fused = ["SimplifiedLayerNormalization", "RMSNormalization", "LayerNormalization"];
    if fused.iter().any(|op| node.is(op)) && node.input.len() == 2 {
        // As rms-norm or this pass writes it (either target): the last
        // axis (this pass: the last few), in f32.
        let axis = node.attr_int("axis").unwrap_or(-1);
        let rank = g.shapes().rank(&node.input[0]).map(|r| r as i64);
        let axes = if axis < 0 { Some(-axis) } else { rank.map(|r| r - axis).filter(|&k| k >= 1) };
        let axes = axes.or_decline(|| format!("the {} is not over the last axes", node.op_type()))?;
        require!(node.attr_int("stash_type").unwrap_or(1) == 1, "the {} does not compute in f32", node.op_type());
        let eps = node.attr_float("epsilon").unwrap_or(1e-5);
        let centered = node.is("LayerNormalization");
        let input = &node.input[0];
        return Ok(Scaled { input, centered, gamma: &node.input[1], eps, axes: axes as usize });
    }
    candidate!(node.is("Mul")); // n * gamma
    either_order(
        node,
        "a gamma of one axis (leading axes of 1 aside)",
        |c| may_be_weight(g, c),
        |n, gamma| {
            if let Ok(cast) = g.produced_by(n, "Cast") {
                return cast_wrapped(g, g.node(cast));
            }
            let core = rms_core(g, n)?;
            Ok(Scaled { input: core.x, centered: false, gamma, eps: core.eps, axes: core.axes })
        },
    )
}

/// `Cast(n(d)) * gamma`: a norm computed in another type than gamma's (an
/// fp16 export's LayerNorm computed in f32 or f64, cast back before its
/// gamma). Not matched: the reason is the core's where it has one, else
/// the Casts. Anything else before the Cast is no candidate.
fn cast_wrapped<'a>(g: &Graph<'a>, cast: &NodeProto) -> Check<Scaled<'a>> {
    let core = rms_core(g, &cast.input[0])?;
    decline!(
        "the norm is computed in {} and cast to {} before gamma: this pass matches a LayerNorm computed in the \
         type of its x, gamma and beta",
        type_text(Some(core.elem_type)),
        type_text(pattern::cast_to(cast))
    )
}
