//! skip-norm: `norm(a + b [+ bias])`
//!          → `com.microsoft.SkipLayerNormalization(a, b, gamma[, beta][, bias])`
//!          | `com.microsoft.SkipSimplifiedLayerNormalization(a, b, gamma[, bias])`
//!
//! The residual sum that feeds a norm, fused with it. The pass reads the
//! norm as `layer-norm` and `rms-norm` write it (and as exporters write it
//! from opset 17): a `LayerNormalization` or `SimplifiedLayerNormalization`
//! over the last axis, computing in f32, whose input is an `Add`. So it
//! composes with them by running after them (docs/fusions.md), and on its
//! own output it finds nothing.
//!
//! - **The sum is read again** (the residual stream): the replacement's
//!   fourth output, `input_skip_bias_sum`, takes over its name. Where the
//!   norm reads the sum through a Cast to its own type (fp32 exports), the
//!   Cast is the same value: it joins, or stays for the residual stream
//!   reading it.
//! - **A bias**: `Add(a0, bias)` (either order) as an operand of the sum,
//!   or added to the sum afterwards (`(a + b) + bias`), with `bias` a
//!   constant of one axis D (leading axes of 1 aside), read by the sum
//!   alone, becomes the bias input (`a0 + bias + b`: the same sum, rounded
//!   in another order).
//! - **Shapes ONNX Runtime's kernel accepts** (measured on 1.31.1): the
//!   input of rank 2 or 3 with the shape of the sum; the skip of the same
//!   shape, or for a 3-D input `[S, D]` or `[1, S, D]` (one row for every
//!   batch); gamma, beta and bias `[D]`. The operand with the sum's shape is
//!   the input; all proved.
//! - **Types**: f32 and f16, the types the CPU provider registers both ops
//!   for (f64 fails to load); every input of one type.

use crate::graph::{Check, Graph, Target};
use crate::onnx::{display_name, is_default_domain, type_text, AttributeProto, FLOAT, FLOAT16};
use crate::pattern::{self, Weight};
use crate::rewrite::{Kept, Match, Pass, Rewrite};
use crate::shapes::{Dim, Shapes};
use crate::{candidate, decline, no_candidate, require};

pub const PASS: Pass = Pass {
    name: "skip-norm",
    summary: "norm(a + b + bias)  ->  com.microsoft.SkipLayerNormalization / SkipSimplifiedLayerNormalization",
    // ONNX Runtime's CPU kernels for both ops are slower than the Add and
    // norm they replace (1.31.1, 2 threads, measured: docs/benchmarks.md);
    // its CUDA provider fuses the pair itself when it loads a model.
    default: false,
    caution: Some(
        "ONNX Runtime's CPU kernels run SkipLayerNormalization and SkipSimplifiedLayerNormalization slower than the \
         Add and norm they replace (1.31.1, 2 threads: docs/benchmarks.md)",
    ),
    absorbs: Some("with their residual Add"),
    portable: None,
    kernel_opset: None,
    rule,
};

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let norm = g.node(index);
    let op = match norm.op_type() {
        "LayerNormalization" => "SkipLayerNormalization",
        "SimplifiedLayerNormalization" => "SkipSimplifiedLayerNormalization",
        _ => no_candidate!(),
    };
    candidate!(is_default_domain(norm.domain()) && g.target == Target::Ort);
    // fp32 exports pass the sum on through a Cast to its own type, which the
    // residual stream reads too: that Cast stays for it where it does.
    let x = norm.input[0].as_str();
    let identity_cast = pattern::identity_cast(g, x);
    let s = identity_cast.unwrap_or(x);
    let sum = g.produced_by(s, "Add").or_else(|_| not_a_sum(g, s))?;
    let shapes = Shapes::new(g);
    let rank = shapes.rank(s);
    let axis = norm.attr_int("axis").unwrap_or(-1);
    require!(
        axis == -1 || rank.is_some_and(|r| axis == r as i64 - 1),
        "the {} is not over the last axis",
        norm.op_type()
    );
    require!(norm.attr_int("stash_type").unwrap_or(1) == 1, "the {} does not compute in f32", norm.op_type());
    let operands = &g.node(sum).input;
    // LayerNormalization's scale has the type of its input (ONNX's T).
    let typed_like_x = (norm.is("LayerNormalization")).then(|| g.elem_type(&norm.input[1])).flatten();
    let elem = g.elem_type(s).or_else(|| g.elem_type(&operands[0])).or_else(|| g.elem_type(&operands[1]));
    let elem = elem.or(typed_like_x);
    require!(
        matches!(elem, Some(FLOAT | FLOAT16)),
        "the sum is not f32 or f16 (the kernel's types), found {}",
        type_text(elem)
    );

    let gamma = norm.input[1].as_str();
    let beta = norm.input.get(2).map(String::as_str).filter(|b| !b.is_empty());
    let d = shapes.last_axis(s);
    for (what, v) in [("gamma", Some(gamma)), ("beta", beta)] {
        let Some(v) = v else { continue };
        require!(
            d.is_some() && shapes.shape(v) == d.clone().map(|d| vec![d]),
            "the {what} ({v}) is not proved to be [D] with D the last axis of the sum"
        );
        require!(g.elem_type(v) == elem, "the {what} ({v}) does not have the sum's element type");
    }

    let epsilon = norm.attr_float("epsilon").unwrap_or(1e-5);
    let skip_norm = |(input, skip, bias): (&str, &str, Option<Weight>)| {
        let mut m = Match::new(index);
        let bias = bias.map(|w| m.weight_input(g, w, "bias"));
        let mut inputs = vec![input, skip, gamma];
        if op == "SkipLayerNormalization" {
            inputs.push(beta.unwrap_or(""));
        }
        inputs.extend(bias.as_deref());
        while inputs.last() == Some(&"") {
            inputs.pop();
        }
        let attributes = vec![AttributeProto::float("epsilon", epsilon)];
        // The identity Cast stays where the residual stream reads it too.
        if identity_cast.is_some() {
            m.keep(Kept::Shared(x.to_string()));
        }
        // Output 3 is the sum, for the residual stream where it reads it.
        m.replace_with_microsoft(op, &inputs, attributes).offering(3, s)
    };
    // The forms in order of preference: the first operand's bias folded,
    // the second's, none (a form that finds no bias to fold is the last).
    // Where a biased operand is read elsewhere too, the driver takes the
    // next form.
    let mut chosen: Option<Rewrite> = None;
    let mut declined = None;
    // A bias added to the sum afterwards, `(a + b) + bias` (onnxscript
    // fuses it): the same sum, the bias input; preferred where it is.
    if let Some((inner, bias)) = pattern::bias_added(g, s) {
        if let Ok((input, skip, None)) = g.produced_by(inner, "Add").and_then(|add| residual(g, &shapes, add, None)) {
            chosen = Some(skip_norm((input, skip, Some(bias))));
        }
    }
    for fold in [Some(0), Some(1), None] {
        match residual(g, &shapes, sum, fold) {
            Ok((_, _, None)) if fold.is_some() => {}
            Ok(form) => {
                let rewrite = skip_norm(form);
                chosen = Some(match chosen {
                    Some(preferred) => preferred.or(rewrite),
                    None => rewrite,
                });
            }
            Err(miss) => {
                declined.get_or_insert(miss);
            }
        }
    }
    chosen.ok_or_else(|| declined.expect("a form was declined"))
}

/// The kernel's input and skip, and a bias folded into the sum (that of
/// operand `fold`, where it has one): the operands of the sum, in the order
/// whose shapes the kernel accepts.
fn residual<'a>(
    g: &Graph<'a>,
    shapes: &Shapes,
    sum: usize,
    fold: Option<usize>,
) -> Check<(&'a str, &'a str, Option<Weight<'a>>)> {
    let node = g.node(sum);
    let s = node.output[0].as_str();
    let (a, b) = (node.input[0].as_str(), node.input[1].as_str());
    // A bias added to operand `fold` first.
    let biased = |v: &'a str| fold.is_some_and(|i| node.input[i] == v).then(|| pattern::bias_added(g, v)).flatten();
    let (a, b, bias) = match (biased(a), biased(b)) {
        (Some((a0, bias)), _) => (a0, b, Some(bias)),
        (None, Some((b0, bias))) => (b0, a, Some(bias)),
        (None, None) => (a, b, None),
    };
    let sum_shape = shapes.shape(s);
    let accepts = |input: &str, skip: &str| kernel_accepts(shapes.shape(input), shapes.shape(skip), &sum_shape);
    if accepts(a, b) {
        Ok((a, b, bias))
    } else if accepts(b, a) {
        Ok((b, a, bias))
    } else {
        decline!(
            "the shapes of {a} and {b} are not proved to be ones the kernel accepts (the same shape of rank 2 or \
             3, or a 3-D input and a skip of [S, D] or [1, S, D])"
        )
    }
}

/// ONNX Runtime's shape rule for SkipLayerNormalization's input and skip,
/// where the input must also have the sum's shape (the kernel's output has
/// the input's shape).
fn kernel_accepts(input: Option<Vec<Dim>>, skip: Option<Vec<Dim>>, sum: &Option<Vec<Dim>>) -> bool {
    let (Some(input), Some(skip)) = (input, skip) else { return false };
    if sum.as_ref() != Some(&input) || !matches!(input.len(), 2 | 3) {
        return false;
    }
    let rows = &input[input.len() - 2..];
    skip == input
        || (input.len() == 3 && (skip == rows || (skip.len() == 3 && skip[0] == Dim::known(1) && skip[1..] == *rows)))
}

/// The reason a norm that reads no Add directly is still a candidate the
/// kernel cannot take, or no candidate:
/// - it reads a sum another norm's kernel took (GPT-NeoX's parallel
///   residual: the next layer's two norms read one sum), as that kernel's
///   output 3, `input_skip_bias_sum`: one kernel per sum;
/// - it reads a sum through Casts that change its type (fp16 exports that
///   normalize in f32: `Add` in f16, `Cast` to f32, the norm): the kernel
///   adds in the type of its input, so it would either add in f32 what the
///   model rounds to f16 first, or normalize in f16 what the model
///   normalizes in f32.
fn not_a_sum(g: &Graph, s: &str) -> Check<usize> {
    let producer = g.producer(s).map(|p| g.node(p));
    let skip = producer.filter(|n| {
        n.domain() == crate::onnx::MICROSOFT
            && n.op_type().starts_with("Skip")
            && n.output.get(3).is_some_and(|o| o == s)
    });
    if let Some(skip) = skip {
        decline!(
            "its sum {s} is computed by {} for its own norm: one residual sum joins one kernel",
            display_name(skip)
        );
    }
    let mut value = s;
    while let Ok(cast) = g.produced_by(value, "Cast") {
        value = g.node(cast).input[0].as_str();
    }
    candidate!(value != s && g.produced_by(value, "Add").is_ok());
    decline!(
        "the norm reads the sum {value} ({}) through a Cast to {}: the kernel adds in the type it normalizes in",
        type_text(g.elem_type(value)),
        type_text(g.elem_type(s))
    )
}
