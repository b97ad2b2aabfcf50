//! Small matchers that patterns share: operand order, reductions over the
//! last axis, weights, scalar constants. Each fails with a reason.

use crate::graph::{Check, Graph, Miss};
use crate::onnx::NodeProto;
use crate::require;

/// The anchor must be a default-domain `op_type` node; anything else is not
/// a candidate at all (and is not reported as declined).
pub fn anchor<'a>(g: &Graph<'a>, index: usize, op_type: &str) -> Check<&'a NodeProto> {
    let node = g.node(index);
    if node.is(op_type) && node.input.len() >= 2 && !node.output.is_empty() {
        Ok(node)
    } else if node.is(op_type) {
        Err(Miss::Because(format!("{op_type} has an unexpected arity")))
    } else {
        Err(Miss::NotAnchor)
    }
}

/// Splits the two operands of a commutative binary node into `(other,
/// role)`, where `role` is the operand that fits the role (a constant, say),
/// and tries `f` on them; when both operands fit, both orders are tried.
pub fn either_order<'a, T>(
    node: &'a NodeProto,
    role: &str,
    fits: impl Fn(&str) -> bool,
    mut f: impl FnMut(&'a str, &'a str) -> Check<T>,
) -> Check<T> {
    require!(node.input.len() == 2, "{} {} does not have two operands", node.op_type(), node.name());
    let (a, b) = (node.input[0].as_str(), node.input[1].as_str());
    let mut result = Err(Miss::NoOperand(format!("no operand of {} {} is {role}", node.op_type(), node.name())));
    for (other, fitting) in [(a, b), (b, a)] {
        if fits(fitting) {
            match f(other, fitting) {
                Ok(found) => return Ok(found),
                Err(miss) if matches!(result, Err(Miss::NoOperand(_))) => result = Err(miss),
                Err(_) => {}
            }
        }
    }
    result
}

/// `either_order` at the anchor: a node none of whose operands fits the
/// role is not a candidate at all (and is not reported as declined).
pub fn anchor_operands<'a, T>(
    node: &'a NodeProto,
    role: &str,
    fits: impl Fn(&str) -> bool,
    f: impl FnMut(&'a str, &'a str) -> Check<T>,
) -> Check<T> {
    either_order(node, role, fits, f).map_err(|miss| if let Miss::NoOperand(_) = miss { Miss::NotAnchor } else { miss })
}

/// The value of a constant with exactly one element.
pub fn scalar(g: &Graph, value: &str, what: &str) -> Check<f64> {
    g.scalar(value).ok_or_else(|| Miss::Because(format!("{what} ({value}) is not a constant with one value")))
}

/// `node` is a ReduceMean over the last axis only that keeps it.
/// Axes come from the attribute before opset 18 and from the constant second
/// input from opset 18 on; absent or empty axes mean all axes (or, with
/// `noop_with_empty_axes`, no reduction), which is not the last axis alone.
pub fn reduce_mean_last_axis(g: &Graph, index: usize) -> Check<()> {
    let node = g.node(index);
    require!(node.is("ReduceMean"), "{} is not a ReduceMean", node.name());
    require!(node.attr_int("keepdims").unwrap_or(1) == 1, "ReduceMean {} does not keep dims", node.name());
    let axes = if g.opset < 18 {
        node.attr_ints("axes").map(<[i64]>::to_vec).unwrap_or_default()
    } else {
        match node.input.get(1).filter(|a| !a.is_empty()) {
            None => vec![],
            Some(axes) => g
                .constant(axes)
                .and_then(|t| t.ints())
                .ok_or_else(|| Miss::Because(format!("the axes of ReduceMean {} are not a constant", node.name())))?,
        }
    };
    let last = g.rank(&node.input[0]).map(|r| r as i64 - 1);
    require!(
        axes.len() == 1 && (axes[0] == -1 || Some(axes[0]) == last),
        "ReduceMean {} reduces axes {axes:?}, not the last axis alone",
        node.name()
    );
    Ok(())
}

/// A weight (scale or bias) the fused ops broadcast along the last axis: a
/// constant of rank at most 1, read through its dims only. One element is
/// accepted only where the last axis of `x` is proved to be 1, since the
/// fused kernels want one value per element of that axis.
pub fn weight(g: &Graph, value: &str, x: &str, what: &str) -> Check<()> {
    let t = g.constant(value).ok_or_else(|| Miss::Because(format!("the {what} ({value}) is not a constant")))?;
    require!(t.dims.len() <= 1, "the {what} ({value}) has rank {}, more than 1", t.dims.len());
    let n = t.dims.first().copied().unwrap_or(1);
    match g.last_dim(x) {
        Some(d) => require!(d == n, "the {what} ({value}) has {n} values but the last axis of {x} is {d}"),
        None => require!(n > 1, "the {what} ({value}) has one value and the last axis of {x} is unknown"),
    }
    Ok(())
}

/// The `to` type of a Cast node.
pub fn cast_to(node: &NodeProto) -> Option<i32> {
    node.is("Cast").then(|| node.attr_int("to")).flatten().map(|t| t as i32)
}
