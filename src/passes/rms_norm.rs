//! rms-norm: `x / sqrt(mean(x², axis=-1) + eps) * weight`
//!        → `SimplifiedLayerNormalization(x, weight)`, axis -1, epsilon eps, stash_type 1
//!          (`--target portable`: ONNX's `RMSNormalization`, from opset 23).
//!
//! Forms accepted (docs/fusions.md shows each):
//! - the square as `Pow(x, 2)` or `Mul(x, x)`, the root as `Sqrt(a)` or `Pow(a, 0.5)`;
//! - the division as `Div(x, r)`, `Mul(x, Div(1, r))` or `Mul(x, Reciprocal(r))`;
//! - eps and the weight on either side of their `Add` / `Mul`;
//! - the same `x` reached through equal `Cast`s (T5 casts it once per use);
//! - fp16/bf16 exports that normalize in f32: `Cast(x → f32)` before the
//!   core and `Cast(→ type of x)` before the weight; both casts fold into
//!   the op, which computes in f32 (stash_type 1) and writes the type of x.
//!   Casts fold only where they widen and come back (or are identities):
//!   a chain that narrows in the middle is another function;
//! - the weight a constant or any value of proved shape `[D]`, with D the
//!   proved last axis of x; or a constant `[1, …, 1, D]`, or of one value
//!   with D a known number (the op reads a `[D]` constant made for it).

use crate::graph::{Check, Graph, Relabel, Stop, Target};
use crate::onnx::{type_text, AttributeProto, BFLOAT16, FLOAT, FLOAT16};
use crate::pattern::{self, cast_to, either_order, is_vector, scalar};
use crate::rewrite::{node, Link, Match, Pass, Portable, Rewrite};
use crate::{candidate, decline, no_candidate, require};

pub const PASS: Pass = Pass {
    name: "rms-norm",
    summary: "x / sqrt(mean(x^2) + eps) * weight  ->  SimplifiedLayerNormalization",
    default: true,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: None,
    rule,
};

/// What `--target portable` writes.
const PORTABLE: Portable = Portable { op: "RMSNormalization", since: 23 };

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    // The core's own last node (`Mul(x, Reciprocal(r))`) may look like a
    // weighted norm that declines (x of one axis as its weight).
    weighted(g, index).or_other_form(|| without_weight(g, index))
}

/// `core * weight`, the weight Mul the anchor.
fn weighted(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = pattern::anchor(g, index, "Mul")?;
    pattern::anchor_operands(
        out,
        "a weight of one axis (leading axes of 1 aside)",
        |w| is_vector(g, w),
        |y, weight| {
            let output_cast = g.produced_by(y, "Cast").ok();
            let normalized = output_cast.map_or(y, |c| g.node(c).input[0].as_str());
            let core = last_axis_core(g, normalized)?;
            let (x, or_x) = match output_cast {
                None => (core.x, None),
                Some(cast) => {
                    let to = cast_to(g.node(cast)).unwrap_or_default();
                    require!(g.elem_type(weight) == Some(to), "the weight's type differs from the output Cast's");
                    fold_casts(g, &core, to)?
                }
            };
            let norm = |x: &str| -> Check<Rewrite> {
                let mut m = Match::new(index);
                let weight = pattern::weight(g, weight, x, "weight")?;
                let weight = m.weight_input(g, weight, "weight");
                Ok(m.replace_with(node(op_for(g)?, &[x, &weight], norm_attributes(core.eps, 1))))
            };
            // Where the folded Cast's output is read elsewhere too, the
            // driver takes the norm that reads it.
            // Where neither form can be written, the reason is the one of
            // the norm as the graph reads it (x after its Cast).
            match (norm(x), or_x.map(norm)) {
                (Ok(folded), Some(Ok(plain))) => Ok(folded.or(plain)),
                (Err(_), Some(plain)) => plain,
                (folded, _) => folded,
            }
        },
    )
    .or_if_no_candidate(|| weight_not_a_vector(g, index))
}

/// The core alone, `x / sqrt(mean(x²) + eps)` with no scale after it (a
/// norm without a weight): the op gets a `[D]` weight of ones, which
/// multiplies exactly, where D and the type are known numbers. Where a Mul
/// (or a Cast that `fold_casts` folds, read by one) reads it, the norm is
/// the weighted form's to fuse whole, or to leave whole where its weight
/// is not proved; a Cast that no Mul reads (an f16 norm without weight
/// cast back), or one that narrows an f32 core of an f32 x (GLM's f16
/// export keeps its residual in f32), is no weight's.
fn without_weight(g: &Graph, index: usize) -> Check<Rewrite> {
    let last = g.node(index);
    candidate!(last.is("Div") || last.is("Mul"));
    let core = last_axis_core(g, &last.output[0]).or_no_candidate()?;
    let mut m = Match::new(index);
    let weight = m.ones_over(g, core.x, 1, core.elem_type, "weight").or_decline(|| {
        format!("a norm without weight: the last axes of {} are no known numbers, and a scale of ones computed at run time needs its rank proved and opset 10 (bf16: 20)", core.x)
    })?;
    Ok(m.replace_with(node(op_for(g)?, &[core.x, &weight], norm_attributes(core.eps, 1)))
        .yielding_to(vec![vec![Link::Op("Mul")], vec![Link::CastTo(folded_casts(g, &core)), Link::Op("Mul")]]))
}

/// The types a Cast between the core and its weight may cast to where the
/// weighted form folds it (`fold_casts`): the core's own type, and the type
/// an f32 core's x was widened from.
fn folded_casts(g: &Graph, core: &RmsCore) -> Vec<i32> {
    let mut types = vec![core.elem_type];
    types.extend([FLOAT16, BFLOAT16].into_iter().filter(|&to| to != core.elem_type && fold_casts(g, core, to).is_ok()));
    types
}

/// The op the target allows: ONNX Runtime's `SimplifiedLayerNormalization`
/// (any opset), or ONNX's own `RMSNormalization` (from opset 23), which
/// computes the same with the same attributes.
fn op_for(g: &Graph) -> Check<&'static str> {
    match g.target {
        Target::Ort => Ok("SimplifiedLayerNormalization"),
        Target::Portable => {
            g.require_portable(PORTABLE)?;
            Ok("RMSNormalization")
        }
    }
}

/// A Mul with no operand of rank ≤ 1 is no candidate, unless one operand is
/// the normalized value: then the reason is the weight's shape.
fn weight_not_a_vector(g: &Graph, index: usize) -> Check<Rewrite> {
    let out = g.node(index);
    for (y, weight) in [(&out.input[0], &out.input[1]), (&out.input[1], &out.input[0])] {
        let normalized = g.produced_by(y, "Cast").map_or(y.as_str(), |c| g.node(c).input[0].as_str());
        if last_axis_core(g, normalized).is_ok() {
            decline!("the weight ({weight}) is not proved to have one axis (leading axes of 1 aside)");
        }
    }
    no_candidate!()
}

/// The attributes both norms are written with: over the last `axes` axes
/// (`axis = -axes`), the model's eps, computed in f32.
pub fn norm_attributes(eps: f32, axes: usize) -> Vec<AttributeProto> {
    let axis = AttributeProto::int("axis", -(axes as i64));
    vec![axis, AttributeProto::float("epsilon", eps), AttributeProto::int("stash_type", 1)]
}

/// The core over the last axis alone, the one this pass fuses.
fn last_axis_core<'a>(g: &Graph<'a>, n: &'a str) -> Check<RmsCore<'a>> {
    let core = rms_core(g, n)?;
    if core.axes != 1 {
        pattern::reduce_mean_last_axis(g, core.mean)?;
    }
    Ok(core)
}

/// The normalization without its weight: `n = x / sqrt(mean(x², axes) + eps)`
/// over the last `axes` axes.
pub struct RmsCore<'a> {
    /// The value normalized (the numerator).
    pub x: &'a str,
    /// eps, exactly as the model stores it (f32, f16 and bf16 all widen to
    /// f32 without rounding).
    pub eps: f32,
    /// The element type the core computes in: eps's (an Add takes one type).
    pub elem_type: i32,
    /// How many trailing axes the mean reduces, and the ReduceMean.
    pub axes: usize,
    pub mean: usize,
}

/// Matches the core that ends in the value `n`.
pub fn rms_core<'a>(g: &Graph<'a>, n: &'a str) -> Check<RmsCore<'a>> {
    let (x, r) = pattern::quotient(g, g.node(g.first_computing(n)?))?;
    let radicand = pattern::root(g, r)?;
    let (mean, eps, eps_value, eps_type) = match g.produced_by(radicand, "ReduceMean") {
        // No eps Add: epsilon 0, in the type of x.
        Ok(mean) => {
            let elem = g.elem_type(x);
            require!(
                matches!(elem, Some(FLOAT | FLOAT16 | BFLOAT16)),
                "a norm without eps: {x} is not known to be f32, f16 or bf16"
            );
            (mean, "0", 0.0, elem.unwrap_or_default())
        }
        Err(_) => {
            let add = g.produced_by(radicand, "Add")?;
            let (mean, (eps, eps_value)) = either_order(
                g.node(add),
                "a constant eps",
                |e| g.constant(e).is_some(),
                |mean, eps| {
                    let mean_node = g.produced_by(mean, "ReduceMean")?;
                    Ok((mean_node, (eps, scalar(g, eps, mean, "eps")?)))
                },
            )?;
            (mean, eps, eps_value, g.elem_type(eps).unwrap_or_default())
        }
    };
    require!(
        matches!(eps_type, FLOAT | FLOAT16 | BFLOAT16),
        "eps ({eps}) is not f32, f16 or bf16: the norm computes in {}",
        type_text((eps_type != 0).then_some(eps_type))
    );
    let axes = pattern::reduce_mean_last_axes(g, mean)?;
    let square = g.producer(&g.node(mean).input[0]).or_decline(|| "the mean's input is not x²".into())?;
    same_value(g, x, pattern::square(g, square)?)?;
    require!(g.elem_type(x).is_none_or(|t| t == eps_type), "eps ({eps}) does not have the element type of x");
    Ok(RmsCore { x, eps: eps_value as f32, elem_type: eps_type, axes, mean })
}

/// The numerator and the squared value must be the same value: the same
/// name, outputs of identical nodes (T5 casts x once per use, Megatron
/// writes `Sub(x, mean)` twice), or a Cast of the numerator to its own
/// type. The nodes that compute the square's copy are replaced with the rest.
fn same_value(g: &Graph, numerator: &str, squared: &str) -> Check<()> {
    let same = g.same_value(numerator, squared).is_some() || pattern::identity_cast(g, squared) == Some(numerator);
    require!(same, "the square and the numerator read different values");
    Ok(())
}

/// The input the fused op reads when the core is wrapped in Casts, ending
/// in `Cast(→ to)` before the weight. Casts fold only where they widen and
/// come back, `x0 (f16|bf16) → Cast(f32) → core → Cast(→ type of x0)`, or
/// are identities (a Cast to the type a value already has); a chain that
/// narrows in the middle computes another function and is left alone.
/// Returns the input to read, and the one to read instead where the driver
/// finds the folded Cast's output read elsewhere too.
fn fold_casts<'a>(g: &Graph<'a>, core: &RmsCore<'a>, to: i32) -> Check<(&'a str, Option<&'a str>)> {
    if to == core.elem_type {
        // Identity Casts on the way out; the one on the way in folds only
        // when it is an identity too and nothing else reads its output (fp32
        // exports pass it on as the residual).
        let identity = pattern::identity_cast(g, core.x);
        return Ok(identity.map_or((core.x, None), |source| (source, Some(core.x))));
    }
    let source = g.produced_by(core.x, "Cast").ok().map(|c| g.node(c).input[0].as_str());
    require!(
        core.elem_type == FLOAT && matches!(to, FLOAT16 | BFLOAT16),
        "the Casts around the norm do not widen to f32 and come back (the core computes in type {}, the output is cast to {to})",
        core.elem_type
    );
    let Some(source) = source else {
        decline!("the f32 core does not read x widened from the output's type");
    };
    require!(g.elem_type(source) == Some(to), "the f32 core does not read x widened from the output's type");
    // The widened x must be read by the norm alone: the driver declines it
    // where it is read outside.
    Ok((source, None))
}
