//! Small matchers that patterns share: operand order, reductions over the
//! last axis, weights, scalar constants. Each fails with a reason.

use crate::graph::{Check, Graph, IntsArgument, Miss, Stop};
use crate::onnx::{NodeProto, TensorProto, BFLOAT16, DOUBLE, FLOAT, FLOAT16};
use crate::shapes::Dim;
use crate::{candidate, decline, require};

/// The anchor must be a default-domain `op_type` node; anything else is not
/// a candidate at all (and is not reported as declined).
pub fn anchor<'a>(g: &Graph<'a>, index: usize, op_type: &str) -> Check<&'a NodeProto> {
    let node = g.node(index);
    candidate!(node.is(op_type));
    if let Some(why) = g.malformed(index) {
        decline!("malformed: {why}");
    }
    require!(node.input.len() >= 2, "{op_type} has an unexpected arity");
    Ok(node)
}

/// The nodes that, as the anchor does, read its input 0 as their input 0
/// and are default-domain `op_type` nodes with all their inputs, in graph
/// order, the anchor among them: the siblings a pass that takes them over
/// (`Rewrite::taking_over`) groups. Who else reads that value is the
/// driver's to settle.
pub fn siblings(g: &Graph, anchor: usize, op_type: &str) -> Vec<usize> {
    let Some(x) = g.node(anchor).input.first() else { return vec![] };
    let mut found: Vec<usize> = g
        .consumers(x)
        .iter()
        .copied()
        .filter(|&c| g.node(c).is(op_type) && g.malformed(c).is_none() && g.node(c).input.first() == Some(x))
        .collect();
    found.sort_by_key(|&n| g.position(n));
    found.dedup();
    found
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
/// more only where `other`'s rank is proved. A constant is what
/// `Graph::constant` reads (a `Cast` of one too: an exponent written
/// `Cast(2.0 → f16)` is the value the Cast computes).
pub fn scalar(g: &Graph, value: &str, other: &str, what: &str) -> Check<f64> {
    let found = g.constant(value).and_then(|t| Some((t.scalar()?, t.dims.len())));
    let (v, rank) = found.or_decline(|| format!("{what} ({value}) is not a constant with one value"))?;
    let room = g.shapes().rank(other).unwrap_or(1).max(1);
    require!(
        rank <= room,
        "{what} ({value}) has rank {rank}, which would raise the rank of the result (of rank {room})"
    );
    Ok(v)
}

/// `node` is a ReduceMean over the last axis only that keeps it.
pub fn reduce_mean_last_axis(g: &Graph, index: usize) -> Check<()> {
    reduces_last_axis(g, index, "ReduceMean")
}

/// `node` is a reduction `op` (ReduceMean, ReduceMax, …) over the last axis
/// only that keeps it. Axes come from the attribute before opset 18 (13 for
/// ReduceSum) and from the constant second input from then on; absent or
/// empty axes mean all axes (or, with `noop_with_empty_axes`, no
/// reduction), which is not the last axis alone.
pub fn reduces_last_axis(g: &Graph, index: usize, op: &str) -> Check<()> {
    let (axes, last) = kept_reduce_axes(g, index, op)?;
    require!(
        axes.len() == 1 && (axes[0] == -1 || Some(axes[0]) == last),
        "{op} {} reduces axes {axes:?}, not the last axis alone",
        g.node(index).name()
    );
    Ok(())
}

/// `node` is a ReduceMean over the last `k` axes (k ≥ 1, each once, in
/// any order and sign) that keeps them: returns k.
pub fn reduce_mean_last_axes(g: &Graph, index: usize) -> Check<usize> {
    let (axes, last) = kept_reduce_axes(g, index, "ReduceMean")?;
    let rank = last.map(|l| l + 1);
    let k = axes.len() as i64;
    let from_end: Option<Vec<i64>> = axes.iter().map(|&a| if a < 0 { Some(a) } else { rank.map(|r| a - r) }).collect();
    let trailing = from_end.is_some_and(|mut e| {
        e.sort_unstable();
        e.into_iter().eq(-k..0)
    });
    require!(
        k >= 1 && trailing && rank.is_none_or(|r| k <= r),
        "ReduceMean {} reduces axes {axes:?}, not the last axis alone or the last axes",
        g.node(index).name()
    );
    Ok(k as usize)
}

/// The axes a reduction `op` that keeps them reduces, and the index of
/// the last axis of its input where its rank is proved.
fn kept_reduce_axes(g: &Graph, index: usize, op: &str) -> Check<(Vec<i64>, Option<i64>)> {
    let node = g.node(index);
    require!(node.is(op), "{} is not a {op}", node.name());
    require!(node.attr_int("keepdims").unwrap_or(1) == 1, "{op} {} does not keep dims", node.name());
    let axes = match g.reduce_axes(node) {
        IntsArgument::Known(axes) => axes,
        IntsArgument::Absent => vec![],
        IntsArgument::Unknown => {
            decline!("the axes of {op} {} are not a constant", node.name());
        }
    };
    Ok((axes, g.shapes().rank(&node.input[0]).map(|r| r as i64 - 1)))
}

/// True for a value that may be a weight: of one axis at most, leading
/// axes of 1 aside (`[D]`, `[1, 1, D]`), proved.
pub fn is_vector(g: &Graph, value: &str) -> bool {
    g.shapes().shape(value).is_some_and(|s| one_axis(&s))
}

/// At most one axis other than leading axes of 1.
fn one_axis(shape: &[Dim]) -> bool {
    shape.len() <= 1 || shape[..shape.len() - 1].iter().all(|d| d.value() == Some(1))
}

/// What the fused op reads for a weight: the value itself, or a constant
/// made for it (`[D]` from a `[1, …, 1, D]` constant or a one-value one).
pub enum Weight<'a> {
    Value(&'a str),
    Made(Box<TensorProto>),
}

/// A weight (scale or bias) the fused ops apply along the last axis, with
/// `D` the proved last axis of `x` (declared or derived shapes; a constant
/// is read through its dims only), so the primitives broadcast it along
/// that axis alone:
/// - a value of proved shape `[D]` (or no axis where D is proved 1), read as is;
/// - a constant `[1, …, 1, D]` whose rank does not exceed x's: the same
///   values as `[D]`;
/// - a one-value constant of rank at most x's, with D a known number: the
///   fused op gets `[D]` copies of it (its kernels take one value per element).
pub fn weight<'a>(g: &Graph<'a>, value: &'a str, x: &str, what: &str) -> Check<Weight<'a>> {
    let shapes = g.shapes();
    let shape = shapes.shape(value).or_decline(|| format!("the {what} ({value}) has no proved shape"))?;
    let x_shape = shapes.shape(x);
    let last = shapes.last_axis(x);
    let shown = |d: &Option<Dim>| d.as_ref().map_or("unknown".to_string(), Dim::to_string);
    let n = shape.last().cloned().unwrap_or(Dim::known(1));
    require!(one_axis(&shape), "the {what} ({value}) has rank {} and is not [1, …, 1, D]", shape.len());
    let rank_fits = x_shape.as_ref().is_some_and(|s| shape.len() <= s.len());
    if last.as_ref() != Some(&n) {
        // One value for every element of the last axis.
        let one = g.one_value(value).filter(|t| !t.is_external());
        let d = last.as_ref().and_then(Dim::value).filter(|&d| d > 0);
        if let (Some(t), Some(d), true) = (one, d, rank_fits) {
            if let Some(made) = t.scalar().and_then(|v| filled(t.data_type(), d, v)) {
                return Ok(Weight::Made(Box::new(made)));
            }
        }
        decline!("the {what} ({value}) has {n} values but the last axis of {x} is {}", shown(&last));
    }
    if shape.len() <= 1 {
        return Ok(Weight::Value(value));
    }
    require!(rank_fits, "the {what} ({value}) of rank {} may raise the rank of {x}", shape.len());
    let t = g.constant(value).filter(|t| !t.is_external());
    let t = t.or_decline(|| format!("the {what} ({value}) is [1, …, 1, D] but not a constant"))?;
    Ok(Weight::Made(Box::new(TensorProto { dims: vec![t.dims.last().copied().unwrap_or(1)], name: None, ..t.clone() })))
}

/// A weight over the last `k` axes of `x` (k ≥ 2: a LayerNorm over several
/// axes). The kernels read one weight per normalized element, so only
/// these are taken (no other broadcast):
/// - a value whose proved shape is the last k axes of x, read as is;
/// - a constant of that shape after leading axes of 1 (its rank at most
///   x's): the same values, made with the k axes;
/// - a one-value constant of rank at most x's, the k axes known numbers:
///   the op gets copies of it.
pub fn weight_over<'a>(g: &Graph<'a>, value: &'a str, x: &str, k: usize, what: &str) -> Check<Weight<'a>> {
    let shapes = g.shapes();
    let shape = shapes.shape(value).or_decline(|| format!("the {what} ({value}) has no proved shape"))?;
    let x_shape = shapes.shape(x).filter(|s| s.len() >= k);
    let x_shape = x_shape.or_decline(|| format!("the last {k} axes of {x} are not proved"))?;
    let normalized = &x_shape[x_shape.len() - k..];
    let rank_fits = shape.len() <= x_shape.len();
    let lead = shape.len().checked_sub(k).filter(|&lead| shape[lead..] == *normalized);
    let constant = g.constant(value).filter(|t| !t.is_external());
    if let (Some(lead), true) = (lead, rank_fits) {
        if lead == 0 {
            return Ok(Weight::Value(value));
        }
        require!(
            shape[..lead].iter().all(|d| d.value() == Some(1)),
            "the {what} ({value}) widens the last {k} axes of {x}"
        );
        let t = constant.or_decline(|| format!("the {what} ({value}) has leading axes of 1 but is not a constant"))?;
        return Ok(Weight::Made(Box::new(TensorProto { dims: t.dims[lead..].to_vec(), name: None, ..t.clone() })));
    }
    let dims: Option<Vec<i64>> = normalized.iter().map(Dim::value).collect();
    let one = constant.filter(|t| t.numel() == Some(1) && rank_fits).and_then(|t| Some((t.data_type(), t.scalar()?)));
    if let Some(made) = one.zip(dims).and_then(|((elem, v), dims)| filled_shape(elem, &dims, v)) {
        return Ok(Weight::Made(Box::new(made)));
    }
    let shown = |dims: &[Dim]| dims.iter().map(Dim::to_string).collect::<Vec<_>>().join(", ");
    decline!(
        "the {what} ({value}) has shape [{}], not the last {k} axes of {x}, [{}]",
        shown(&shape),
        shown(normalized)
    )
}

/// A scale of ones for a norm of `x` over its last `k` axes, in x's type:
/// none where those axes or the type are not known numbers. (For k = 1 the
/// last axis may be known where the rank is not.)
pub fn ones_over(g: &Graph, x: &str, k: usize) -> Option<TensorProto> {
    let shapes = g.shapes();
    let last_k = shapes.shape(x).filter(|s| s.len() >= k).map(|s| s[s.len() - k..].to_vec());
    let last_k = last_k.or_else(|| shapes.last_axis(x).filter(|_| k == 1).map(|d| vec![d]))?;
    let dims: Vec<i64> = last_k.iter().map(Dim::value).collect::<Option<_>>()?;
    filled_shape(g.elem_type(x)?, &dims, 1.0)
}

/// A `[d]` tensor of float type `elem` holding `v` (exact in that type)
/// `d` times; none for other types or more than 2^20 elements.
pub fn filled(elem: i32, d: i64, v: f64) -> Option<TensorProto> {
    filled_shape(elem, &[d], v)
}

/// A tensor of shape `dims` and float type `elem` holding `v` everywhere;
/// none for other types or more than 2^20 elements.
pub fn filled_shape(elem: i32, dims: &[i64], v: f64) -> Option<TensorProto> {
    const MAX: i64 = 1 << 20;
    let d = dims.iter().try_fold(1i64, |n, &d| n.checked_mul(d).filter(|_| d >= 0))?;
    if !matches!(elem, FLOAT | DOUBLE | FLOAT16 | BFLOAT16) {
        return None;
    }
    let bytes = crate::graph::fold::element_bytes(elem, v)?;
    (d <= MAX).then(|| TensorProto {
        dims: dims.to_vec(),
        data_type: Some(elem),
        raw_data: Some(bytes.repeat(d as usize).into()),
        ..Default::default()
    })
}

/// The `to` type of a Cast node (none where `to` is no type number: a
/// value past i32 is not wrapped into one).
pub fn cast_to(node: &NodeProto) -> Option<i32> {
    node.is("Cast").then(|| node.attr_int("to")).flatten().and_then(|t| i32::try_from(t).ok())
}

// The spellings exporters write one function in. Each recognizer lives
// here once; a pass names the function, not its spellings.

/// `x / r` written as `Div(x, r)`, `Mul(x, Div(1, r))` or
/// `Mul(x, Reciprocal(r))` (either order): `(x, r)`. Any other node is no
/// candidate.
pub fn quotient<'a>(g: &Graph<'a>, node: &'a NodeProto) -> Check<(&'a str, &'a str)> {
    if node.is("Div") && node.input.len() == 2 {
        return Ok((node.input[0].as_str(), node.input[1].as_str()));
    }
    candidate!(node.is("Mul"));
    let inverse = |v: &str| g.produced_by(v, "Reciprocal").is_ok() || g.produced_by(v, "Div").is_ok();
    either_order(node, "1 / r", inverse, |x, inverse| Ok((x, reciprocal(g, inverse)?)))
}

/// The r of `1 / r`, written as `Div(1, r)` (numerator exactly 1) or
/// `Reciprocal(r)`.
pub fn reciprocal<'a>(g: &Graph<'a>, inverse: &'a str) -> Check<&'a str> {
    if let Ok(r) = g.produced_by(inverse, "Reciprocal") {
        return Ok(g.node(r).input[0].as_str());
    }
    let node = g.node(g.produced_by(inverse, "Div")?);
    let numerator = scalar(g, &node.input[0], &node.input[1], "the numerator of 1 / r")?;
    require!(numerator == 1.0, "the numerator of 1 / r is not exactly 1");
    Ok(node.input[1].as_str())
}

/// The a of `r = √a`, written as `Sqrt(a)` or `Pow(a, 0.5)` (exponent
/// exactly 0.5).
pub fn root<'a>(g: &Graph<'a>, r: &str) -> Check<&'a str> {
    if let Ok(pow) = g.produced_by(r, "Pow") {
        let node = g.node(pow);
        let exponent = scalar(g, &node.input[1], &node.input[0], "the exponent of the root")?;
        require!(exponent == 0.5, "the root's exponent is {exponent}, not 0.5");
        return Ok(node.input[0].as_str());
    }
    // The first step: r is a root (Sqrt, or a Pow above).
    Ok(g.node(g.first_step(r, "Sqrt")?).input[0].as_str())
}

/// The x of node `square`, written as `Pow(x, 2)` (exponent exactly 2),
/// `Mul(x, x)`, or `Mul(x, x')` with x' computed again by twins of x's
/// nodes (`Graph::same_value`).
pub fn square<'a>(g: &Graph<'a>, square: usize) -> Check<&'a str> {
    let node = g.node(square);
    if node.is("Pow") && node.input.len() == 2 {
        let exponent = scalar(g, &node.input[1], &node.input[0], "the exponent")?;
        require!(exponent == 2.0, "the exponent is {exponent}, not 2");
        Ok(node.input[0].as_str())
    } else if node.is("Mul") && node.input.len() == 2 {
        require!(
            g.same_value(&node.input[0], &node.input[1]).is_some(),
            "{} is a product of two values, not x²",
            node.name()
        );
        Ok(node.input[0].as_str())
    } else {
        decline!("{} is not Pow(x, 2) or Mul(x, x)", node.name())
    }
}

/// The source of `value = Cast(source)` where the Cast is to the type
/// source is known to have: a Cast that computes nothing.
pub fn identity_cast<'a>(g: &Graph<'a>, value: &str) -> Option<&'a str> {
    let cast = g.node(g.produced_by(value, "Cast").ok()?);
    let source = cast.input[0].as_str();
    (g.elem_type(source).is_some() && g.elem_type(source) == cast_to(cast)).then_some(source)
}

/// `value = Add(x0, bias)` with bias a constant of one axis that is a
/// weight of x0 (`weight`: one value per element of x0's last axis, which
/// cannot raise its rank), either order: `(x0, bias)`, the bias as the
/// fused op reads it.
pub fn bias_added<'a>(g: &Graph<'a>, value: &str) -> Option<(&'a str, Weight<'a>)> {
    let add = g.node(g.produced_by(value, "Add").ok()?);
    let constant_vector = |c: &str| g.constant(c).is_some() && is_vector(g, c);
    either_order(add, "a bias", constant_vector, |x0, bias| Ok((x0, weight(g, bias, x0, "bias")?))).ok()
}
