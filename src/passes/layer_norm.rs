//! layer-norm: `d = x - mean(x, axis=-1)`, `(d / sqrt(mean(d², -1) + eps)) * gamma + beta`
//!          → `LayerNormalization(x, gamma, beta)`, axis -1, epsilon eps, stash_type 1.
//!
//! The normalization of `d` is the rms-norm core, so this pass reuses it
//! (`d` may be computed twice by identical `Sub` nodes, one per use);
//! gamma and beta follow the weight rule (proved shape `[D]`, D the last
//! axis of x, constant or not);
//! when rms-norm ran first and already turned `… * gamma` into a
//! `SimplifiedLayerNormalization(d, gamma)`, that node is accepted in its
//! place and its provenance list folds into this one.

use crate::graph::{Check, Graph, Miss, Target};
use crate::pattern::{self, either_order, is_vector};
use crate::require;
use crate::rewrite::{node, Match, Pass, Rewrite};

use super::rms_norm::{norm_attributes, rms_core};

pub const PASS: Pass = Pass {
    name: "layer-norm",
    summary: "(x - mean(x)) / sqrt(var(x) + eps) * gamma + beta  ->  LayerNormalization",
    default: true,
    caution: None,
    rule,
};

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = pattern::anchor(g, index, "Add")?;
    pattern::anchor_operands(
        out,
        "a beta of rank at most 1",
        |b| is_vector(g, b),
        |scaled, beta| {
            let mut m = Match::new(index);
            let (d, gamma, eps) = scaled_norm(g, &mut m, scaled)?;
            let sub = m.take(g.produced_by(d, "Sub")?);
            let (x, mean) = (g.node(sub).input[0].as_str(), g.node(sub).input[1].as_str());
            let mean = m.take(g.produced_by(mean, "ReduceMean")?);
            require!(g.node(mean).input[0] == x, "the mean is not of the value it is subtracted from");
            pattern::reduce_mean_last_axis(g, mean)?;
            pattern::weight(g, gamma, x, "gamma")?;
            pattern::weight(g, beta, x, "beta")?;
            let types = [g.elem_type(gamma), g.elem_type(beta)];
            require!(
                types[0] == types[1] && g.elem_type(x).is_none_or(|t| Some(t) == types[0]),
                "x, gamma and beta do not share one element type"
            );
            // ONNX defines LayerNormalization from opset 17; below, only
            // ONNX Runtime's registration runs it.
            require!(
                g.target == Target::Ort || g.opset >= 17,
                "needs opset 17 for LayerNormalization (the model imports opset {})",
                g.opset
            );
            Ok(m.replace_with(node("LayerNormalization", &[x, gamma, beta], norm_attributes(eps))))
        },
    )
    .or_else(|miss| if miss == Miss::NotCandidate { beta_not_a_vector(g, index) } else { Err(miss) })
}

/// An Add with no operand of rank ≤ 1 is no candidate, unless one operand
/// is the scaled norm: then the reason is beta's shape.
fn beta_not_a_vector(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = g.node(index);
    for (scaled, beta) in [(&out.input[0], &out.input[1]), (&out.input[1], &out.input[0])] {
        if scaled_norm(g, &mut Match::new(index), scaled).is_ok() {
            return Err(Miss::Declined(format!("the beta ({beta}) is not proved to have rank at most 1")));
        }
    }
    Err(Miss::NotCandidate)
}

/// `n(d) * gamma` as primitives, or as the `SimplifiedLayerNormalization`
/// rms-norm writes for it. Returns d, gamma and eps.
fn scaled_norm<'a>(g: &Graph<'a>, m: &mut Match, scaled: &'a str) -> Check<(&'a str, &'a str, f32)> {
    let p = g.computing(scaled)?;
    let node = g.node(p);
    if (node.is("SimplifiedLayerNormalization") || node.is("RMSNormalization")) && node.input.len() == 2 {
        // As rms-norm writes it (either target): the last axis, in f32.
        require!(node.attr_int("axis").unwrap_or(-1) == -1, "the {} is not over the last axis", node.op_type());
        require!(node.attr_int("stash_type").unwrap_or(1) == 1, "the {} does not compute in f32", node.op_type());
        m.take(p);
        return Ok((&node.input[0], &node.input[1], node.attr_float("epsilon").unwrap_or(1e-5)));
    }
    require!(node.is("Mul"), "{scaled} is not n * gamma");
    m.take(p);
    either_order(
        node,
        "a gamma of rank at most 1",
        |c| is_vector(g, c),
        |n, gamma| {
            let mut inner = Match::new(p);
            let core = rms_core(g, &mut inner, n)?;
            m.absorb(inner);
            Ok((core.x, gamma, core.eps))
        },
    )
}
