//! Small matchers that patterns share: operand order, reductions over the
//! last axis, weights, scalar constants. Each fails with a reason.

use crate::graph::{Check, Graph, IntsArgument, Miss};
use crate::onnx::NodeProto;
use crate::shapes::Dim;
use crate::{candidate, require};

/// The anchor must be a default-domain `op_type` node; anything else is not
/// a candidate at all (and is not reported as declined).
pub fn anchor<'a>(g: &Graph<'a>, index: usize, op_type: &str) -> Check<&'a NodeProto> {
    let node = g.node(index);
    candidate!(node.is(op_type));
    if let Some(why) = g.malformed(index) {
        return Err(Miss::Declined(format!("malformed: {why}")));
    }
    require!(node.input.len() >= 2, "{op_type} has an unexpected arity");
    Ok(node)
}

/// Splits the two operands of a commutative binary node into `(other,
/// role)`, where `role` is the operand that fits the role (a constant, say),
/// and tries `f` on them; when both operands fit, both orders are tried.
/// Declined with the first order's reason, or because no operand fits.
pub fn either_order<'a, T>(
    node: &'a NodeProto,
    role: &str,
    fits: impl Fn(&str) -> bool,
    mut f: impl FnMut(&'a str, &'a str) -> Check<T>,
) -> Check<T> {
    require!(node.input.len() == 2, "{} {} does not have two operands", node.op_type(), node.name());
    let (a, b) = (node.input[0].as_str(), node.input[1].as_str());
    let mut first_miss = None;
    for (other, fitting) in [(a, b), (b, a)] {
        if fits(fitting) {
            match f(other, fitting) {
                Ok(found) => return Ok(found),
                Err(miss) => {
                    first_miss.get_or_insert(miss);
                }
            }
        }
    }
    Err(first_miss
        .unwrap_or_else(|| Miss::Declined(format!("no operand of {} {} is {role}", node.op_type(), node.name()))))
}

/// `either_order` at the anchor: a node none of whose operands fits the
/// role is no candidate at all (and is not reported as declined).
pub fn anchor_operands<'a, T>(
    node: &'a NodeProto,
    role: &str,
    fits: impl Fn(&str) -> bool,
    f: impl FnMut(&'a str, &'a str) -> Check<T>,
) -> Check<T> {
    candidate!(node.input.iter().any(|v| fits(v)));
    either_order(node, role, fits, f)
}

/// The value of a constant with exactly one element (eps, an exponent, a
/// numerator, a scale, a fill) that takes part in an elementwise op with
/// `other` without changing the result's shape. Broadcasting a one-element
/// tensor can only raise the rank, so its rank must be at most `other`'s:
/// 0 or 1 always (every such op in the patterns reads a value of rank ≥ 1),
/// more only where `other`'s rank is proved.
pub fn scalar(g: &Graph, value: &str, other: &str, what: &str) -> Check<f64> {
    let t = g.constant(value);
    let v = t.and_then(|t| t.scalar());
    let v = v.ok_or_else(|| Miss::Declined(format!("{what} ({value}) is not a constant with one value")))?;
    let rank = t.map_or(0, |t| t.dims.len());
    let room = g.shapes().rank(other).unwrap_or(1).max(1);
    require!(
        rank <= room,
        "{what} ({value}) has rank {rank}, which would raise the rank of the result (of rank {room})"
    );
    Ok(v)
}

/// `node` is a ReduceMean over the last axis only that keeps it.
/// Axes come from the attribute before opset 18 and from the constant second
/// input from opset 18 on; absent or empty axes mean all axes (or, with
/// `noop_with_empty_axes`, no reduction), which is not the last axis alone.
pub fn reduce_mean_last_axis(g: &Graph, index: usize) -> Check<()> {
    let node = g.node(index);
    require!(node.is("ReduceMean"), "{} is not a ReduceMean", node.name());
    require!(node.attr_int("keepdims").unwrap_or(1) == 1, "ReduceMean {} does not keep dims", node.name());
    let axes = match g.reduce_axes(node) {
        IntsArgument::Known(axes) => axes,
        IntsArgument::Absent => vec![],
        IntsArgument::Unknown => {
            return Err(Miss::Declined(format!("the axes of ReduceMean {} are not a constant", node.name())));
        }
    };
    let last = g.shapes().rank(&node.input[0]).map(|r| r as i64 - 1);
    require!(
        axes.len() == 1 && (axes[0] == -1 || Some(axes[0]) == last),
        "ReduceMean {} reduces axes {axes:?}, not the last axis alone",
        node.name()
    );
    Ok(())
}

/// True for a value that may be a weight: rank at most 1, proved.
pub fn is_vector(g: &Graph, value: &str) -> bool {
    g.shapes().rank(value).is_some_and(|r| r <= 1)
}

/// A weight (scale or bias) the fused ops apply along the last axis: a
/// value of proved shape `[D]` where the last axis of `x` is proved to be D
/// (declared or derived shapes; a constant is read through its dims only),
/// so the primitives broadcast it along that axis alone. A weight with no
/// axis is accepted where the last axis of x is proved to be 1.
pub fn weight(g: &Graph, value: &str, x: &str, what: &str) -> Check<()> {
    let shapes = g.shapes();
    let shape =
        shapes.shape(value).ok_or_else(|| Miss::Declined(format!("the {what} ({value}) has no proved shape")))?;
    require!(shape.len() <= 1, "the {what} ({value}) has rank {}, more than 1", shape.len());
    let n = shape.first().cloned().unwrap_or(Dim::known(1));
    let last = shapes.shape(x).and_then(|s| s.last().cloned());
    require!(
        last.as_ref() == Some(&n),
        "the {what} ({value}) has {n} values but the last axis of {x} is {}",
        last.map_or("unknown".to_string(), |d| d.to_string())
    );
    Ok(())
}

/// The `to` type of a Cast node.
pub fn cast_to(node: &NodeProto) -> Option<i32> {
    node.is("Cast").then(|| node.attr_int("to")).flatten().map(|t| t as i32)
}
