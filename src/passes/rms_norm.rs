//! rms-norm: `x / sqrt(mean(x², axis=-1) + eps) * weight`
//!        → `SimplifiedLayerNormalization(x, weight)`, axis -1, epsilon eps, stash_type 1.
//!
//! Forms accepted (docs/fusions.md shows each):
//! - the square as `Pow(x, 2)` or `Mul(x, x)`;
//! - the division as `Div(x, r)`, `Mul(x, Div(1, r))` or `Mul(x, Reciprocal(r))`;
//! - eps and the weight on either side of their `Add` / `Mul`;
//! - the same `x` reached through equal `Cast`s (T5 casts it once per use);
//! - fp16/bf16 exports that normalize in f32: `Cast(x → f32)` before the
//!   core and `Cast(→ type of x)` before the weight; both casts fold into
//!   the op, which computes in f32 (stash_type 1) and writes the type of x.

use crate::graph::{Check, Graph, Miss};
use crate::onnx::{AttributeProto, BFLOAT16, FLOAT, FLOAT16};
use crate::pattern::{self, cast_to, either_order, scalar};
use crate::require;
use crate::rewrite::{node, Match, Pass, Rewrite};

pub const PASS: Pass = Pass {
    name: "rms-norm",
    summary: "x / sqrt(mean(x^2) + eps) * weight  ->  SimplifiedLayerNormalization",
    default: true,
    caution: None,
    rule,
};

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = pattern::anchor(g, index, "Mul")?;
    pattern::anchor_operands(
        out,
        "a constant weight",
        |w| g.constant(w).is_some(),
        |y, weight| {
            let mut m = Match::new(index);
            let output_cast = g.produced_by(y, "Cast").ok();
            let normalized = output_cast.map_or(y, |c| g.node(c).input[0].as_str());
            let core = rms_core(g, &mut m, normalized)?;
            let x = match output_cast {
                None => core.x,
                Some(cast) => {
                    m.take(cast);
                    let to = cast_to(g.node(cast)).unwrap_or_default();
                    require!(g.elem_type(weight) == Some(to), "the weight's type differs from the output Cast's");
                    uncast_input(g, &mut m, core.x, to)?
                }
            };
            pattern::weight(g, weight, x, "weight")?;
            Ok(m.replace_with(node("SimplifiedLayerNormalization", &[x, weight], norm_attributes(core.eps))))
        },
    )
    .or_else(|miss| if miss == Miss::NotAnchor { weight_not_constant(g, index) } else { Err(miss) })
}

/// A Mul with no constant operand is no candidate, unless one operand is
/// the normalized value: then the reason is that the weight is not constant.
fn weight_not_constant(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = g.node(index);
    for (y, weight) in [(&out.input[0], &out.input[1]), (&out.input[1], &out.input[0])] {
        let normalized = g.produced_by(y, "Cast").map_or(y.as_str(), |c| g.node(c).input[0].as_str());
        if rms_core(g, &mut Match::new(index), normalized).is_ok() {
            return Err(Miss::Because(format!("the weight ({weight}) is not a constant")));
        }
    }
    Err(Miss::NotAnchor)
}

/// The attributes both norms are written with: over the last axis, the
/// model's eps, computed in f32.
pub fn norm_attributes(eps: f32) -> Vec<AttributeProto> {
    vec![AttributeProto::int("axis", -1), AttributeProto::float("epsilon", eps), AttributeProto::int("stash_type", 1)]
}

/// The normalization without its weight: `n = x / sqrt(mean(x², -1) + eps)`.
pub struct RmsCore<'a> {
    /// The value normalized (the numerator).
    pub x: &'a str,
    /// eps, exactly as the model stores it (f32, f16 and bf16 all widen to
    /// f32 without rounding).
    pub eps: f32,
}

/// Matches the core that ends in the value `n`, adding its nodes to `m`.
pub fn rms_core<'a>(g: &Graph<'a>, m: &mut Match, n: &'a str) -> Check<RmsCore<'a>> {
    let last = g.producer(n).ok_or_else(|| Miss::Because(format!("{n} is not computed by the graph")))?;
    let node = g.node(last);
    let (x, r) = if node.is("Div") && node.input.len() == 2 {
        (node.input[0].as_str(), node.input[1].as_str())
    } else if node.is("Mul") {
        either_order(node, "1 / r", |v| is_reciprocal(g, v), |x, inverse| Ok((x, reciprocal_of(g, m, inverse)?)))?
    } else {
        return Err(Miss::Because(format!("{n} is not x / r, x * (1 / r) or x * Reciprocal(r)")));
    };
    m.take(last);
    let sqrt = m.take(g.produced_by(r, "Sqrt")?);
    let add = m.take(g.produced_by(&g.node(sqrt).input[0], "Add")?);
    let (mean, eps) = either_order(
        g.node(add),
        "a constant eps",
        |e| g.constant(e).is_some(),
        |mean, eps| {
            let mean = g.produced_by(mean, "ReduceMean")?;
            Ok((mean, (eps, scalar(g, eps, "eps")?)))
        },
    )?;
    let (eps, eps_value) = eps;
    let eps_type = g.elem_type(eps).unwrap_or_default();
    require!(matches!(eps_type, FLOAT | FLOAT16 | BFLOAT16), "eps ({eps}) is not f32, f16 or bf16");
    pattern::reduce_mean_last_axis(g, m.take(mean))?;
    let square =
        m.take(g.producer(&g.node(mean).input[0]).ok_or_else(|| Miss::Because("the mean's input is not x²".into()))?);
    let squared = squared_value(g, square)?;
    same_value(g, m, x, squared)?;
    require!(g.elem_type(x).is_none_or(|t| t == eps_type), "eps ({eps}) does not have the element type of x");
    Ok(RmsCore { x, eps: eps_value as f32 })
}

fn is_reciprocal(g: &Graph, value: &str) -> bool {
    g.produced_by(value, "Reciprocal").is_ok() || g.produced_by(value, "Div").is_ok()
}

/// `1 / r` written as `Div(1, r)` (numerator exactly 1) or `Reciprocal(r)`.
fn reciprocal_of<'a>(g: &Graph<'a>, m: &mut Match, inverse: &'a str) -> Check<&'a str> {
    if let Ok(r) = g.produced_by(inverse, "Reciprocal") {
        m.take(r);
        return Ok(g.node(r).input[0].as_str());
    }
    let div = g.produced_by(inverse, "Div")?;
    let node = g.node(div);
    require!(scalar(g, &node.input[0], "the numerator of 1 / r")? == 1.0, "the numerator of 1 / r is not exactly 1");
    m.take(div);
    Ok(node.input[1].as_str())
}

/// The x of `Pow(x, 2)` (exponent exactly 2) or `Mul(x, x)`.
fn squared_value<'a>(g: &Graph<'a>, square: usize) -> Check<&'a str> {
    let node = g.node(square);
    if node.is("Pow") && node.input.len() == 2 {
        let exponent = scalar(g, &node.input[1], "the exponent")?;
        require!(exponent == 2.0, "the exponent is {exponent}, not 2");
        Ok(node.input[0].as_str())
    } else if node.is("Mul") && node.input.len() == 2 && node.input[0] == node.input[1] {
        Ok(node.input[0].as_str())
    } else {
        Err(Miss::Because(format!("{} is not Pow(x, 2) or Mul(x, x)", node.name())))
    }
}

/// The numerator and the squared value must be the same value: the same
/// name, a Cast of the numerator to its own type, or two Casts of one source
/// to one type. A Cast only the square reads joins the match.
fn same_value(g: &Graph, m: &mut Match, numerator: &str, squared: &str) -> Check<()> {
    if numerator == squared {
        return Ok(());
    }
    let cast = g
        .produced_by(squared, "Cast")
        .map_err(|_| Miss::Because("the square and the numerator read different values".into()))?;
    let cast_node = g.node(cast);
    let source = cast_node.input[0].as_str();
    let identity = source == numerator && g.elem_type(numerator).is_some_and(|t| Some(t) == cast_to(cast_node));
    let twin = g
        .produced_by(numerator, "Cast")
        .is_ok_and(|other| g.node(other).input[0] == source && cast_to(g.node(other)) == cast_to(cast_node));
    require!(identity || twin, "the square and the numerator read different values");
    m.take(cast);
    Ok(())
}

/// For the fp16 form: `x` must be `Cast(x0 → f32)` with x0 of type `to`
/// (the op then reads x0 and folds the cast, unless another node reads its
/// output), or already of type `to`.
fn uncast_input<'a>(g: &Graph<'a>, m: &mut Match, x: &'a str, to: i32) -> Check<&'a str> {
    if let Ok(cast) = g.produced_by(x, "Cast") {
        let source = g.node(cast).input[0].as_str();
        // When something else reads the f32 value (fp32 exports pass the
        // identity cast's output on as the residual), the cast stays.
        if g.elem_type(source) == Some(to) && m.only_read_inside(g, x) {
            m.take(cast);
            return Ok(source);
        }
    }
    require!(g.elem_type(x) == Some(to), "cannot prove that the Casts around the norm give back the type of x");
    Ok(x)
}
