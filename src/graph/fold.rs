//! What a deterministic op of constants computes (spec, ground rule 4): a
//! small tensor folded as ONNX Runtime computes it, each step rounded to
//! its element type. SDPA exports compute the scale as
//! `Sqrt(Cast(Div(1, Sqrt(Cast(Shape(q)[-1:])))))`: a constant, since the
//! head size is. Only small tensors (shape vectors, scalars) are folded,
//! and only through ops whose result in IEEE arithmetic is exact or
//! correctly rounded (no Pow, Exp, Log: runtimes round those differently).

use super::dim::Dim;
use super::Graph;
use crate::onnx::{TensorProto, BFLOAT16, DOUBLE, FLOAT, FLOAT16, INT32, INT64};

/// What folding asks of the symbolic shapes. `shapes::Shapes` answers,
/// and folds a float constant's arithmetic through `fold` in turn: asked
/// through this trait, the shapes stay the file above this one.
pub trait ShapeFacts {
    /// The shape of `value`, where its rank is known (`Shapes::shape`).
    fn shape(&self, value: &str) -> Option<Vec<Dim>>;
    /// The elements of an integer vector computed from shapes, each where
    /// it is proved (`Shapes::shape_tensor`).
    fn shape_tensor(&self, value: &str) -> Option<Vec<Option<Dim>>>;
}

/// The most elements a folded tensor may have.
pub const SMALL: usize = 64;
/// How many producers deep folding follows a value.
const DEPTH: usize = 24;

/// A folded tensor: its element type, dims, and values (integers exactly,
/// floats as f64 holding the element type's value).
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    pub elem: i32,
    pub dims: Vec<i64>,
    pub values: Vec<f64>,
    /// False where a step is within a unit in the last place of what ONNX
    /// Runtime computes rather than equal to it (`Pow(x, 0.5)`: ONNX
    /// Runtime's power differs from a square root on 0.06% of f32 inputs,
    /// measured): good for a kernel's scale, whose rounding is the
    /// kernel's, not for a value a rule proves things of.
    pub exact: bool,
}

impl Folded {
    /// The one value of a one-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        (self.values.len() == 1).then(|| self.values[0])
    }

    /// The tensor holding these values (little-endian raw data).
    pub fn to_tensor(&self) -> Option<TensorProto> {
        let raw = self.values.iter().map(|&v| element_bytes(self.elem, v)).collect::<Option<Vec<Vec<u8>>>>()?;
        Some(TensorProto {
            data_type: Some(self.elem),
            dims: self.dims.clone(),
            raw_data: Some(raw.concat().into()),
            ..Default::default()
        })
    }
}

/// `v` as one element of type `elem` in a tensor's raw data (rounded to
/// the type: exact for a value `round` gave).
pub fn element_bytes(elem: i32, v: f64) -> Option<Vec<u8>> {
    Some(match elem {
        FLOAT => (v as f32).to_le_bytes().to_vec(),
        DOUBLE => v.to_le_bytes().to_vec(),
        FLOAT16 => half::f16::from_f32(v as f32).to_le_bytes().to_vec(),
        BFLOAT16 => half::bf16::from_f32(v as f32).to_le_bytes().to_vec(),
        INT64 => (v as i64).to_le_bytes().to_vec(),
        INT32 => (v as i32).to_le_bytes().to_vec(),
        _ => return None,
    })
}

/// `Cast(t → to)` of a small constant, as ONNX Runtime computes it (spec,
/// ground rule 4): a constant spelled as a wider type and cast (a double
/// eps cast to float, int32 axes cast to int64) is the constant cast.
pub fn cast_tensor(t: &TensorProto, to: i32) -> Option<TensorProto> {
    cast(from_tensor(t)?, to)?.to_tensor()
}

/// The value of `value`, where it is a constant or folds from constants.
pub fn fold(g: &Graph, shapes: &dyn ShapeFacts, value: &str) -> Option<Folded> {
    fold_at(g, shapes, value, DEPTH)
}

fn fold_at(g: &Graph, shapes: &dyn ShapeFacts, value: &str, depth: usize) -> Option<Folded> {
    if let Some(t) = g.constant(value) {
        return from_tensor(t);
    }
    // Integer shape arithmetic, followed element by element by the shapes.
    if let Some(elements) = shapes.shape_tensor(value).filter(|_| g.elem_type(value).is_some_and(is_int)) {
        let values = elements.iter().map(|d| Some(d.as_ref()?.value()? as f64)).collect::<Option<Vec<f64>>>();
        let dims = shapes.shape(value)?.iter().map(|d| d.value()).collect::<Option<Vec<i64>>>();
        if let (Some(values), Some(dims)) = (values, dims) {
            if dims.len() <= 1 && values.len() <= SMALL {
                return Some(Folded { elem: g.elem_type(value)?, dims, values, exact: true });
            }
        }
    }
    let node = g.node(g.producer(value)?);
    if depth == 0 || !crate::onnx::is_default_domain(node.domain()) || node.output.first()? != value {
        return None;
    }
    let input = |i: usize| fold_at(g, shapes, node.input.get(i).filter(|v| !v.is_empty())?, depth - 1);
    let folded = match node.op_type() {
        "Identity" => input(0)?,
        "Dropout" => {
            g.identity_input(g.producer(value)?)?;
            input(0)?
        }
        "Shape" => {
            // The axes read must be numbers; the others may be anything.
            let dims = shapes.shape(node.input.first()?)?;
            let rank = dims.len() as i64;
            let clamp = |i: i64| (if i < 0 { i + rank } else { i }).clamp(0, rank) as usize;
            let (start, end) =
                (clamp(node.attr_int("start").unwrap_or(0)), clamp(node.attr_int("end").unwrap_or(rank)));
            let read = dims.get(start..end.max(start))?;
            let values = read.iter().map(|d| d.value().map(|v| v as f64)).collect::<Option<Vec<f64>>>()?;
            Folded { elem: INT64, dims: vec![values.len() as i64], values, exact: true }
        }
        "Size" => {
            let n = shapes.shape(node.input.first()?)?.iter().try_fold(1i64, |p, d| p.checked_mul(d.value()?))?;
            Folded { elem: INT64, dims: vec![], values: vec![n as f64], exact: true }
        }
        "Cast" => cast(input(0)?, node.attr_int("to")? as i32)?,
        "CastLike" => cast(input(0)?, g.elem_type(node.input.get(1)?)?)?,
        "Neg" => unary(input(0)?, |x| -x)?,
        "ConstantOfShape" => {
            let dims = input(0)?.values.iter().map(|&d| d as i64).collect::<Vec<i64>>();
            let fill = match node.attr("value").and_then(|a| a.t.as_ref()) {
                Some(t) => from_tensor(t)?,
                None => Folded { elem: FLOAT, dims: vec![1], values: vec![0.0], exact: true },
            };
            let n = dims.iter().try_fold(1usize, |p, &d| p.checked_mul(usize::try_from(d).ok()?))?;
            if fill.values.len() != 1 || n > SMALL {
                return None;
            }
            Folded { elem: fill.elem, dims, values: vec![fill.values[0]; n], exact: true }
        }
        // x^2 and x^1 exactly; x^0.5 within a unit in the last place, and
        // exactly in f32 where x is the square of an integer of at most
        // 4096 (ONNX Runtime's pow is the root there: tests/kernel.rs).
        "Pow" => {
            let (x, e) = (input(0)?, input(1)?.scalar()?);
            match e {
                0.5 => {
                    let squares = x.elem == FLOAT && x.values.iter().all(|&v| perfect_square(v, 4096));
                    let exact = x.exact && squares;
                    Folded { exact, ..float_unary(x, f64::sqrt, f32::sqrt)? }
                }
                1.0 => x,
                2.0 => binary(x.clone(), x, |a, b| a * b, |a, b| a * b)?,
                _ => return None,
            }
        }
        "Sqrt" => float_unary(input(0)?, f64::sqrt, f32::sqrt)?,
        "Reciprocal" => float_unary(input(0)?, |x| 1.0 / x, |x| 1.0 / x)?,
        "Add" => binary(input(0)?, input(1)?, |a, b| a + b, |a, b| a + b)?,
        "Sub" => binary(input(0)?, input(1)?, |a, b| a - b, |a, b| a - b)?,
        "Mul" => binary(input(0)?, input(1)?, |a, b| a * b, |a, b| a * b)?,
        "Div" => {
            let (a, b) = (input(0)?, input(1)?);
            // Integer division truncates in ONNX Runtime; by zero it is undefined.
            if is_int(a.elem) && b.values.iter().any(|&x| x == 0.0) {
                return None;
            }
            binary(a, b, |a, b| if b == 0.0 { f64::NAN } else { (a / b).trunc() }, |a, b| a / b)?
        }
        "Unsqueeze" | "Squeeze" | "Reshape" | "Flatten" => {
            let x = input(0)?;
            let dims = shapes.shape(value)?.iter().map(|d| d.value()).collect::<Option<Vec<i64>>>()?;
            (dims.iter().product::<i64>() == x.values.len() as i64).then_some(Folded { dims, ..x })?
        }
        "Gather" => {
            let (data, indices) = (input(0)?, input(1)?);
            if data.dims.len() != 1 || node.attr_int("axis").unwrap_or(0) != 0 || indices.dims.len() > 1 {
                return None;
            }
            let n = data.values.len() as i64;
            let values = indices
                .values
                .iter()
                .map(|&i| {
                    let i = i as i64;
                    let i = if i < 0 { i + n } else { i };
                    (0..n).contains(&i).then(|| data.values[i as usize])
                })
                .collect::<Option<Vec<f64>>>()?;
            Folded { elem: data.elem, dims: indices.dims, values, exact: data.exact && indices.exact }
        }
        "Slice" => {
            let data = input(0)?;
            let (starts, ends, axes, steps) = g.slice_arguments(node)?;
            if data.dims.len() != 1 || starts.len() != 1 || !matches!(axes[..], [0] | [-1]) || steps != [1] {
                return None;
            }
            let n = data.values.len() as i64;
            let clamp = |i: i64| (if i < 0 { i + n } else { i }).clamp(0, n) as usize;
            let (start, end) = (clamp(starts[0]), clamp(ends[0]));
            let values = data.values.get(start..end.max(start))?.to_vec();
            Folded { elem: data.elem, dims: vec![values.len() as i64], values, exact: data.exact }
        }
        "Concat" => {
            let parts = (0..node.input.len()).map(input).collect::<Option<Vec<Folded>>>()?;
            let elem = parts.first()?.elem;
            if parts.iter().any(|p| p.dims.len() != 1 || p.elem != elem) {
                return None;
            }
            let exact = parts.iter().all(|p| p.exact);
            let values: Vec<f64> = parts.into_iter().flat_map(|p| p.values).collect();
            Folded { elem, dims: vec![values.len() as i64], values, exact }
        }
        _ => return None,
    };
    (folded.values.len() <= SMALL).then_some(folded)
}

/// `v` is `k²` for an integer `0 ≤ k ≤ max`.
fn perfect_square(v: f64, max: u32) -> bool {
    let k = v.sqrt().round();
    k <= f64::from(max) && k * k == v
}

fn from_tensor(t: &TensorProto) -> Option<Folded> {
    if t.is_external() || t.numel()? as usize > SMALL {
        return None;
    }
    let elem = t.data_type();
    let values = if is_int(elem) { t.ints()?.into_iter().map(|i| i as f64).collect() } else { t.values()? };
    matches!(elem, FLOAT | FLOAT16 | BFLOAT16 | DOUBLE | INT64 | INT32).then_some(Folded {
        elem,
        dims: t.dims.clone(),
        values,
        exact: true,
    })
}

fn is_int(elem: i32) -> bool {
    matches!(elem, INT64 | INT32)
}

/// `x` rounded to element type `elem` (integers only where exact).
fn round(x: f64, elem: i32) -> Option<f64> {
    Some(match elem {
        FLOAT => f64::from(x as f32),
        DOUBLE => x,
        // A runtime may narrow a double or an integer to a half type through
        // f32 (rounding twice) or not: only values f32 holds are folded, which
        // both roads round alike. (`half`'s own f64 conversion is one road
        // on some machines and the other elsewhere.)
        FLOAT16 | BFLOAT16 if f64::from(x as f32) != x && !x.is_nan() => return None,
        FLOAT16 => half::f16::from_f32(x as f32).to_f64(),
        BFLOAT16 => half::bf16::from_f32(x as f32).to_f64(),
        INT64 if x.fract() == 0.0 && x.abs() < 2f64.powi(53) => x,
        INT32 if x.fract() == 0.0 && x.abs() <= f64::from(i32::MAX) => x,
        _ => return None,
    })
}

fn cast(x: Folded, to: i32) -> Option<Folded> {
    // Integers read as f64 are exact only below 2^53.
    if is_int(x.elem) && x.values.iter().any(|v| v.abs() >= 2f64.powi(53)) {
        return None;
    }
    let values = x.values.iter().map(|&v| round(v, to)).collect::<Option<Vec<f64>>>()?;
    if is_int(to) && x.values.iter().any(|v| v.fract() != 0.0) {
        return None;
    }
    let exact = x.exact && kept_in_half(to, &x.values, &values);
    Some(Folded { elem: to, values, exact, ..x })
}

fn unary(x: Folded, f: impl Fn(f64) -> f64) -> Option<Folded> {
    let computed: Vec<f64> = x.values.iter().map(|&v| f(v)).collect();
    let values = computed.iter().map(|&v| round(v, x.elem)).collect::<Option<Vec<f64>>>()?;
    let exact = x.exact && kept_in_half(x.elem, &computed, &values);
    Some(Folded { values, exact, ..x })
}

/// Whether rounding `computed` to `elem` gave `rounded` back unchanged
/// where `elem` is f16 or bf16. ONNX Runtime's CPU has no half kernel for
/// most arithmetic: it computes a chain of such ops in f32 and drops the
/// casts between them (the Cast to f16 before them too), so a value its
/// half type rounds is within a unit in the last place of what it
/// computes, not equal to it (`Cast(2) / 3` in f16 is 0.6665, ONNX
/// Runtime's 0.6666667).
fn kept_in_half(elem: i32, computed: &[f64], rounded: &[f64]) -> bool {
    !matches!(elem, FLOAT16 | BFLOAT16)
        || computed.iter().zip(rounded).all(|(c, r)| c == r || (c.is_nan() && r.is_nan()))
}

/// A float op computed in the element type's own arithmetic: f64 for
/// doubles, f32 for f32 and narrower types (rounded once more to f16 or
/// bf16, which is exact for these correctly rounded ops: 24 ≥ 2·11 + 2).
fn float_unary(x: Folded, f64_op: impl Fn(f64) -> f64, f32_op: impl Fn(f32) -> f32) -> Option<Folded> {
    if is_int(x.elem) {
        return None;
    }
    let elem = x.elem;
    unary(x, |v| if elem == DOUBLE { f64_op(v) } else { f64::from(f32_op(v as f32)) })
}

/// An elementwise op of two tensors of one type, where one has one element
/// or both have the same dims.
fn binary(a: Folded, b: Folded, f64_op: impl Fn(f64, f64) -> f64, f32_op: impl Fn(f32, f32) -> f32) -> Option<Folded> {
    if a.elem != b.elem {
        return None;
    }
    let elem = a.elem;
    let op = |x: f64, y: f64| match elem {
        DOUBLE => f64_op(x, y),
        INT64 | INT32 => f64_op(x, y),
        _ => f64::from(f32_op(x as f32, y as f32)),
    };
    let (dims, values): (Vec<i64>, Vec<f64>) = if a.values.len() == 1 && b.dims.len() >= a.dims.len() {
        (b.dims.clone(), b.values.iter().map(|&y| op(a.values[0], y)).collect())
    } else if b.values.len() == 1 && a.dims.len() >= b.dims.len() {
        (a.dims.clone(), a.values.iter().map(|&x| op(x, b.values[0])).collect())
    } else if a.dims == b.dims {
        (a.dims.clone(), a.values.iter().zip(&b.values).map(|(&x, &y)| op(x, y)).collect())
    } else {
        return None;
    };
    let rounded = values.iter().map(|&v| round(v, elem)).collect::<Option<Vec<f64>>>()?;
    let exact = a.exact && b.exact && kept_in_half(elem, &values, &rounded);
    Some(Folded { elem, dims, values: rounded, exact })
}

/// Starts, ends, axes and steps of a Slice, as `Graph::slice_arguments`
/// reads them, each input folded where computed from constants (a half
/// of the last axis written `Shape(x)[-1] // 2`).
pub fn slice_arguments(g: &Graph, shapes: &dyn ShapeFacts, node: &crate::onnx::NodeProto) -> Option<[Vec<i64>; 4]> {
    if g.opset < 10 {
        let (starts, ends, axes, steps) = g.slice_arguments(node)?;
        return Some([starts, ends, axes, steps]);
    }
    let ints = |i: usize| -> Option<Option<Vec<i64>>> {
        match node.input.get(i).filter(|v| !v.is_empty()) {
            None => Some(None),
            Some(v) => {
                let f = fold(g, shapes, v).filter(|f| is_int(f.elem) && f.exact)?;
                Some(Some(f.values.iter().map(|&x| x as i64).collect()))
            }
        }
    };
    let (starts, ends) = (ints(1)??, ints(2)??);
    let axes = ints(3)?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = ints(4)?.unwrap_or_else(|| vec![1; starts.len()]);
    Some([starts, ends, axes, steps])
}

/// The values `value` can hold, each once, where a few are proved: a
/// constant's values, or an exactly folded tensor's; 0 and 1 of a Cast of
/// a bool; both of `Where(c, a, b)` of one-value `a` and `b`; what ops
/// that only move or repeat elements make of such a value, or a Cast that
/// keeps them (to its own type; 0 and 1 to any); all of a Concat's
/// (GPT-2's causal mask sliced from its `bias` table, SDPA's masks of 0
/// and -inf); a ConstantOfShape's fill, of any size; a comparison's
/// results of every pair of its inputs' values (torch's repeat_interleave
/// compares `arange(r)` with repeats all r: every element true).
pub fn values_held(g: &Graph, shapes: &dyn ShapeFacts, value: &str) -> Option<Vec<f64>> {
    values_held_at(g, shapes, value, 16)
}

fn values_held_at(g: &Graph, shapes: &dyn ShapeFacts, value: &str, depth: usize) -> Option<Vec<f64>> {
    /// Ops whose output holds only elements of their first input.
    const MOVES: &[&str] =
        &["Slice", "Gather", "Reshape", "Squeeze", "Unsqueeze", "Expand", "Transpose", "Tile", "Flatten", "Identity"];
    let distinct = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.dedup_by(|a, b| a.to_bits() == b.to_bits());
        Some(v)
    };
    let constant = g.constant(value).and_then(TensorProto::values);
    if let Some(values) = constant.or_else(|| fold(g, shapes, value).filter(|c| c.exact).map(|c| c.values)) {
        return distinct(values);
    }
    let node = g.node(g.producer(value)?);
    if depth == 0 || !crate::onnx::is_default_domain(node.domain()) || node.input.is_empty() {
        return None;
    }
    let input = |i: usize| values_held_at(g, shapes, node.input.get(i)?, depth - 1);
    match node.op_type() {
        "Where" if node.input.len() == 3 => {
            let (a, b) = (fold(g, shapes, &node.input[1])?, fold(g, shapes, &node.input[2])?);
            (a.exact && b.exact).then_some(())?;
            distinct(vec![a.scalar()?, b.scalar()?])
        }
        "Cast" if g.elem_type(&node.input[0]) == Some(crate::onnx::BOOL) => Some(vec![0.0, 1.0]),
        "Cast" => {
            let values = input(0)?;
            let same = g.elem_type(&node.input[0]).is_some_and(|t| Some(t) == g.elem_type(value));
            let kept = same || values.iter().all(|&x| x == 0.0 || x == 1.0);
            kept.then_some(values)
        }
        "Concat" => distinct((0..node.input.len()).map(input).collect::<Option<Vec<_>>>()?.concat()),
        "ConstantOfShape" => match node.attr("value").and_then(|a| a.t.as_ref()) {
            Some(t) => distinct(t.values().filter(|v| v.len() == 1)?),
            None => Some(vec![0.0]),
        },
        "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" | "Equal" if node.input.len() == 2 => {
            let (a, b) = (input(0)?, input(1)?);
            // Integers beyond 2^53 are not held exactly as f64.
            let exact = matches!(g.elem_type(&node.input[0]), Some(FLOAT | DOUBLE | FLOAT16 | BFLOAT16))
                || a.iter().chain(&b).all(|v| v.abs() < 2f64.powi(53));
            (exact && a.len() * b.len() <= SMALL * SMALL).then_some(())?;
            let compare = |x: f64, y: f64| match node.op_type() {
                "Less" => x < y,
                "LessOrEqual" => x <= y,
                "Greater" => x > y,
                "GreaterOrEqual" => x >= y,
                _ => x == y,
            };
            distinct(a.iter().flat_map(|&x| b.iter().map(move |&y| f64::from(u8::from(compare(x, y))))).collect())
        }
        op if MOVES.contains(&op) => input(0),
        _ => None,
    }
}
