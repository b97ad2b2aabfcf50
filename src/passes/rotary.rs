//! rotary: `x · cos + rotate_half(x) · sin` → ONNX `RotaryEmbedding`
//! (opset 23), which ONNX Runtime runs as one kernel.
//!
//! ```text
//! out  = Add(Mul(x, c), Mul(r, s))      every operand either order
//! r    = Concat(Neg(x₂), x₁, axis −1)   x₁ = x[…, :d/2], x₂ = x[…, d/2:] (Slices of x)
//! c, s = Unsqueeze(cos, 1), Unsqueeze(sin, 1)
//! cos  = g(Concat(f, f, axis −1))       g elementwise, or times one value: each
//!                                       half of cos is the other (every Hugging
//!                                       Face export computes `cat(freqs, freqs)`)
//! → RotaryEmbedding(x, cos[…, :d/2], sin[…, :d/2])
//! ```
//!
//! x is `[b, heads, s, d]`, cos and sin `[b, s, d]` with the same b and s
//! (ONNX Runtime's kernel takes caches of x's batch exactly, measured), d
//! even. The first half of each table is the cache without
//! `position_ids`: the prelude slices it, once per table. Nothing but the
//! rotary's own nodes is replaced; the Unsqueezes of the tables stay while
//! another rotary reads them.

use crate::graph::{Check, Graph};
use crate::onnx::{type_text, AttributeProto, NodeProto, BFLOAT16, FLOAT, FLOAT16};
use crate::pattern;
use crate::rewrite::{ints_constant, node, writing, Kept, Match, Pass, Portable, Rewrite};
use crate::{decline, no_candidate, require};

pub const PASS: Pass = Pass {
    name: "rotary",
    summary: "x·cos + rotate_half(x)·sin  ->  RotaryEmbedding (opset 23)",
    default: true,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: Some(23),
    rule,
};

/// What `--target portable` writes (the same op as for ONNX Runtime).
const PORTABLE: Portable = Portable { op: "RotaryEmbedding", since: 23 };

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let add = pattern::anchor(g, index, "Add")?;
    let (a, b) = (add.input[0].as_str(), add.input[1].as_str());
    // Which product holds rotate_half(x) says which is which.
    let rotated = |v: &str| g.produced_by(v, "Mul").is_ok_and(|m| g.node(m).input.iter().any(|i| half_turn(g, i)));
    let (plain, turned) = match (rotated(a), rotated(b)) {
        (false, true) => (a, b),
        (true, false) => (b, a),
        _ => no_candidate!(),
    };
    let (r, s) = product_with(g, turned, "a rotated half", |v| half_turn(g, v))?;
    let (first, second) = halves_turned(g, r)?;
    let (x1, x2) = (g.node(first).input[0].as_str(), g.node(second).input[0].as_str());
    require!(g.same_value(x1, x2).is_some(), "the halves turned are not of one value");
    let (x, c) = product_with(g, plain, "the value whose halves are turned", |v| g.same_value(v, x1).is_some())?;

    let shapes = g.shapes();
    let elem = g.elem_type(x);
    require!(
        matches!(elem, Some(FLOAT | FLOAT16 | BFLOAT16)),
        "RotaryEmbedding is written for f32, f16 and bf16 (x is {})",
        type_text(elem)
    );
    let sx = shapes.shape(x).filter(|s| s.len() == 4).ok_or_else(|| miss("x is not proved 4-D [b, heads, s, d]"))?;
    let d = sx[3].value().filter(|d| d % 2 == 0 && *d > 0);
    let d = d.ok_or_else(|| miss(&format!("the last axis of x ({}) is not a known even number", sx[3])))?;
    cut(g, first, 0, d / 2, d)?;
    cut(g, second, d / 2, d, d)?;
    // A table [b, s, d] unsqueezed at axis 1 (of x's b, or of 1 where its
    // rows are the same for every sequence of the batch).
    let table = |v: &str, what: &str| -> Check<(String, bool)> {
        let u = g.produced_by(v, "Unsqueeze")?;
        let axes = g.ints_argument(g.node(u), "axes", 1, 13);
        require!(axes == crate::graph::IntsArgument::Known(vec![1]), "the {what} table is not unsqueezed at axis 1");
        let t = g.node(u).input[0].as_str();
        let st = shapes.shape(t).filter(|st| st.len() == 3);
        let batch = st.as_ref().map(|st| &st[0]).filter(|b| **b == sx[0] || b.value() == Some(1));
        let fits = st.as_ref().is_some_and(|st| batch.is_some() && st[1] == sx[2] && st[2].value() == Some(d));
        require!(fits, "the {what} table is not proved [b or 1, s, d] of x's b, s and d");
        require!(g.elem_type(t) == elem, "the {what} table is not of x's type");
        require!(halves_equal(g, t, 16), "the two halves of the {what} table are not proved equal");
        Ok((t.to_string(), batch != Some(&sx[0])))
    };
    let ((cos, cos_one), (sin, sin_one)) = (table(c, "cos")?, table(s, "sin")?);

    let mut m = Match::new(index);
    m.keep(Kept::Shared(c.to_string()));
    m.keep(Kept::Shared(s.to_string()));
    let mut prelude = Vec::new();
    // The first half of a table; repeated over x's batch where it has one
    // row of sequences (ONNX Runtime's kernel takes caches of x's batch).
    let cache = |prelude: &mut Vec<NodeProto>, t: &str, one: bool| -> String {
        let (start, end, axis, half) =
            (format!("{t}/half_start"), format!("{t}/half_end"), format!("{t}/half_axis"), format!("{t}/half"));
        prelude.push(ints_constant(&start, &[0]));
        prelude.push(ints_constant(&end, &[d / 2]));
        prelude.push(ints_constant(&axis, &[-1]));
        prelude.push(writing(&half, node("Slice", &[t, &start, &end, &axis], vec![])));
        if !one {
            return half;
        }
        let (batch, ones, shape, out) =
            (format!("{x}/batch"), format!("{t}/ones"), format!("{x}/batch_shape"), format!("{half}_per_batch"));
        let first = vec![AttributeProto::int("start", 0), AttributeProto::int("end", 1)];
        prelude.push(writing(&batch, node("Shape", &[x], first)));
        prelude.push(ints_constant(&ones, &[1, 1]));
        prelude.push(writing(&shape, node("Concat", &[&batch, &ones], vec![AttributeProto::int("axis", 0)])));
        prelude.push(writing(&out, node("Expand", &[&half, &shape], vec![])));
        out
    };
    let (cos_cache, sin_cache) = (cache(&mut prelude, &cos, cos_one), cache(&mut prelude, &sin, sin_one));
    g.require_opset(23, "RotaryEmbedding")?;
    let rotary = node("RotaryEmbedding", &[x, &cos_cache, &sin_cache], vec![]);
    Ok(m.replace_with(rotary).after(prelude).needing_opset(23))
}

fn miss(why: &str) -> crate::graph::Miss {
    crate::graph::Miss::Declined(why.to_string())
}

/// `a · b` where `first(a)` (`what` a is): (a, b), either order.
fn product_with<'a>(g: &Graph<'a>, value: &str, what: &str, first: impl Fn(&str) -> bool) -> Check<(&'a str, &'a str)> {
    let mul = g.node(g.produced_by(value, "Mul")?);
    let (a, b) = (mul.input[0].as_str(), mul.input[1].as_str());
    match (first(a), first(b)) {
        (true, _) => Ok((a, b)),
        (_, true) => Ok((b, a)),
        _ => decline!("Mul {} reads not {what}", mul.name()),
    }
}

/// Whether `value` is `Concat(Neg(…), …)` on the last axis: a half turn.
fn half_turn(g: &Graph, value: &str) -> bool {
    g.produced_by(value, "Concat").is_ok_and(|c| {
        let concat = g.node(c);
        concat.input.len() == 2 && g.produced_by(&concat.input[0], "Neg").is_ok()
    })
}

/// `Concat(Neg(x₂), x₁, axis −1)`: the Slices computing x₁ and x₂.
fn halves_turned(g: &Graph, r: &str) -> Check<(usize, usize)> {
    let concat = g.node(g.produced_by(r, "Concat")?);
    let rank = g.shapes().rank(r);
    let axis = concat.attr_int("axis").unwrap_or(0);
    require!(
        axis == -1 || rank.is_some_and(|n| axis == n as i64 - 1),
        "the half turn is not concatenated on the last axis"
    );
    let neg = g.node(g.produced_by(&concat.input[0], "Neg")?);
    Ok((g.produced_by(&concat.input[1], "Slice")?, g.produced_by(&neg.input[0], "Slice")?))
}

/// Slice `slice` cuts `[from, to)` of the last axis (of `d`) and nothing
/// else: one axis, the last (−1 or 3 of 4), step 1; an end at or past d
/// is d.
fn cut(g: &Graph, slice: usize, from: i64, to: i64, d: i64) -> Check<()> {
    let node = g.node(slice);
    let [starts, ends, axes, steps] = crate::graph::fold::slice_arguments(g, &g.shapes(), node)
        .ok_or_else(|| miss(&format!("Slice {} cuts where its arguments are computed at run time", node.name())))?;
    let end_fits = |e: i64| if to == d { e >= d } else { e == to };
    let fits = matches!((&starts[..], &ends[..], &axes[..], &steps[..]), ([s], [e], [-1 | 3], [1]) if *s == from && end_fits(*e));
    require!(fits, "Slice {} does not cut [{from}, {to}) of the last axis of {d}", node.name());
    Ok(())
}

/// Whether each half of the last axis of `value` is the other: a Concat of
/// a value with itself on the last axis, through elementwise ops (and
/// products with one value).
fn halves_equal(g: &Graph, value: &str, depth: usize) -> bool {
    let Some(p) = g.producer(value) else { return false };
    let node = g.node(p);
    if depth == 0 || !crate::onnx::is_default_domain(node.domain()) || node.output.len() != 1 {
        return false;
    }
    const UNARY: &[&str] = &[
        "Cos",
        "Sin",
        "Cast",
        "Identity",
        "Neg",
        "Abs",
        "Exp",
        "Sqrt",
        "Reciprocal",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Floor",
        "Ceil",
        "Round",
        "Sign",
    ];
    if let Some(x) = g.identity_input(p) {
        return halves_equal(g, x, depth - 1);
    }
    match node.op_type() {
        op if UNARY.contains(&op) && node.input.len() == 1 => halves_equal(g, &node.input[0], depth - 1),
        "Mul" | "Div" | "Add" | "Sub" if node.input.len() == 2 => {
            let one_value = |v: &str| g.constant(v).is_some_and(|t| t.numel() == Some(1));
            (one_value(&node.input[1]) && halves_equal(g, &node.input[0], depth - 1))
                || (node.is("Mul") || node.is("Add"))
                    && one_value(&node.input[0])
                    && halves_equal(g, &node.input[1], depth - 1)
        }
        "Concat" if node.input.len() == 2 => {
            let rank = g.shapes().rank(value);
            let axis = node.attr_int("axis").unwrap_or(0);
            let last = axis == -1 || rank.is_some_and(|n| axis == n as i64 - 1);
            last && g.same_value(&node.input[0], &node.input[1]).is_some()
        }
        _ => false,
    }
}
