//! gelu: the GELU family, each written by exporters as primitives.
//!
//! ```text
//! erf form:      x · 0.5 · (1 + Erf(x / √2))              → com.microsoft.Gelu(x)
//!                (or Erf(x · 1/√2); x = x0 + bias)         → com.microsoft.BiasGelu(x0, bias)
//! tanh form:     0.5 · x · (1 + Tanh(√(2/π) · (x + 0.044715 · x³)))
//!                                                         → com.microsoft.FastGelu(x[, bias])
//! sigmoid form:  x · Sigmoid(α · x), x · Sigmoid(x) (SiLU) → com.microsoft.QuickGelu(x), alpha = α
//! ```
//!
//! The three factors of the first two forms in any order and grouping
//! (`(x · 0.5) · b`, `(x · b) · 0.5`, `x · (0.5 · b)`), every sum and
//! product either way round, `x³` as `Pow(x, 3)` or `x` times a square of x
//! (`pattern::square`), and BLOOM's
//! factored polynomial `√(2/π) · x · (1 + 0.044715 · x · x)`. Each
//! constant (0.5, 1, √2 or 1/√2, √(2/π), 0.044715, the exponent 3) is
//! within 2 units in the last place of its exact value in its own element
//! type, as the spec says; √2 written as 1.41 is another function.
//!
//! A bias folds where `x = Add(x0, bias)` with `bias` a constant of one
//! axis D, the last axis of x (leading axes of 1 aside), and nothing but the
//! GELU reads x. The `com.microsoft` ops are written for f32 and f16, the
//! types ONNX Runtime's CPU provider runs them in (measured: f64 Gelu and
//! BiasGelu fail to load). `--target portable` writes ONNX's `Gelu` (from
//! opset 20; `approximate = "tanh"` for the tanh form, no bias), and leaves
//! the sigmoid form: ONNX has no such op.

use crate::graph::{Check, Graph, Relabel, Stop, Target};
use crate::onnx::{is_default_domain, type_text, AttributeProto, NodeProto, BFLOAT16, FLOAT, FLOAT16};
use crate::pattern::{self, either_order};
use crate::rewrite::{node, Match, Pass, Portable, Rewrite};
use crate::{candidate, no_candidate, require};

pub const PASS: Pass = Pass {
    name: "gelu",
    summary: "x·Φ(x) and x·sigmoid(αx) in their exported forms  ->  Gelu, BiasGelu, FastGelu, QuickGelu",
    default: true,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: None,
    rule,
};

/// What `--target portable` writes.
const PORTABLE: Portable = Portable { op: "Gelu", since: 20 };

const SQRT_2: f64 = std::f64::consts::SQRT_2;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// √(2/π).
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const TANH_CUBIC: f64 = 0.044715;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Erf,
    Tanh,
}

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let top = pattern::anchor(g, index, "Mul")?;
    candidate!(top.input.len() == 2);
    // x · 0.5 · (1 + T(…)): the top Mul and one Mul inside it hold the
    // three factors.
    for factors in products_of_three(g, top) {
        if let Some(found) = three_factors(g, index, factors) {
            return found;
        }
    }
    sigmoid_form(g, index, top)
}

/// The ways a Mul is a product of three factors: `(a · b) · c` or
/// `c · (a · b)`, the inner Mul on either side.
fn products_of_three<'a>(g: &Graph<'a>, mul: &'a NodeProto) -> Vec<[&'a str; 3]> {
    let mut found = Vec::new();
    for (inner, other) in [(&mul.input[0], &mul.input[1]), (&mul.input[1], &mul.input[0])] {
        let Ok(p) = g.produced_by(inner, "Mul") else { continue };
        let node = g.node(p);
        if node.input.len() == 2 {
            found.push([node.input[0].as_str(), node.input[1].as_str(), other.as_str()]);
        }
    }
    found
}

/// The factors `[x, c, rest]` of a product of three: one is x, one a
/// constant, the third anything; none when the product is not of that kind.
fn x_constant_rest<'a>(g: &Graph<'a>, value: &str, x: &str) -> Vec<(&'a str, &'a str)> {
    let Ok(p) = g.produced_by(value, "Mul") else { return vec![] };
    let node = g.node(p);
    if node.input.len() != 2 {
        return vec![];
    }
    let mut found = Vec::new();
    for f in products_of_three(g, node) {
        for (i, j, k) in [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)] {
            if f[i] == x && g.constant(f[j]).is_some() {
                found.push((f[j], f[k]));
            }
        }
    }
    found
}

/// The GELU of three factors `x`, `0.5` and `1 + T(…)`, if they are its
/// factors; none when they are no candidate.
fn three_factors(g: &Graph, index: usize, factors: [&str; 3]) -> Option<Check<Rewrite>> {
    let bracket = (0..3).find_map(|i| Some((i, bracket(g, factors[i])?)))?;
    let (b, (form, argument, one)) = bracket;
    let half = (0..3).find(|&i| i != b && g.constant(factors[i]).is_some())?;
    let x = factors[3 - b - half];
    let half = factors[half];
    Some((|| {
        require!(g.constant(x).is_none(), "the value of the GELU ({x}) is a constant");
        // Mul reads two values of one type: x has the 0.5's.
        let elem = elem_of(g, x, half)?;
        near(g, half, x, 0.5, elem, "the factor 0.5")?;
        near(g, one, x, 1.0, elem, "the 1 of 1 + T")?;
        match form {
            Form::Erf => erf_argument(g, argument, x, elem)?,
            Form::Tanh => tanh_argument(g, argument, x, elem)?,
        }
        replace(g, index, form, x, elem)
    })())
}

/// `c + Erf(a)` or `c + Tanh(a)` (either order, c a constant: the 1):
/// the form, a and c.
fn bracket<'a>(g: &Graph<'a>, value: &str) -> Option<(Form, &'a str, &'a str)> {
    let add = g.node(g.produced_by(value, "Add").ok()?);
    either_order(
        add,
        "1",
        |c| g.constant(c).is_some(),
        |t, one| {
            let p = g.computing(t)?;
            let form = match g.node(p).op_type() {
                "Erf" => Form::Erf,
                "Tanh" => Form::Tanh,
                _ => no_candidate!(),
            };
            require!(is_default_domain(g.node(p).domain()), "not ONNX's {}", g.node(p).op_type());
            Ok((form, g.node(p).input[0].as_str(), one))
        },
    )
    .ok()
}

/// The element type of x (or of `like`, which a Mul reads with it): f32,
/// f16 or bf16 (constants are judged in it).
fn elem_of(g: &Graph, x: &str, like: &str) -> Check<i32> {
    let elem = g.elem_type(x).or_else(|| g.elem_type(like));
    require!(
        matches!(elem, Some(FLOAT | FLOAT16 | BFLOAT16)),
        "{x} is not f32, f16 or bf16 (found {})",
        type_text(elem)
    );
    Ok(elem.unwrap_or_default())
}

/// `x / √2` or `x · (1/√2)` (either order).
fn erf_argument(g: &Graph, a: &str, x: &str, elem: i32) -> Check<()> {
    let p = g.computing(a)?;
    let node = g.node(p);
    if node.is("Div") && node.input.len() == 2 {
        require!(node.input[0] == x, "Erf does not read {x} / c");
        return near(g, &node.input[1], x, SQRT_2, elem, "√2");
    }
    require!(node.is("Mul"), "Erf does not read x / √2 or x · (1/√2)");
    either_order(
        node,
        "1/√2",
        |c| g.constant(c).is_some(),
        |v, c| {
            require!(v == x, "Erf does not read {x} · c");
            near(g, c, x, FRAC_1_SQRT_2, elem, "1/√2")
        },
    )
}

/// `√(2/π) · (x + 0.044715 · x³)` (every product and sum either way round),
/// or as BLOOM writes it, `√(2/π) · x · (1 + 0.044715 · x · x)`: the same
/// function, the polynomial factored (its rounding is the kernel's).
fn tanh_argument(g: &Graph, a: &str, x: &str, elem: i32) -> Check<()> {
    for (c, bracket) in x_constant_rest(g, a, x) {
        let Ok(add) = g.produced_by(bracket, "Add") else { continue };
        return either_order(
            g.node(add),
            "1",
            |one| g.constant(one).is_some(),
            |square, one| {
                near(g, c, x, SQRT_2_OVER_PI, elem, "√(2/π)")?;
                near(g, one, x, 1.0, elem, "the 1 of 1 + 0.044715 · x²")?;
                let terms = x_constant_rest(g, square, x);
                let (k, _) = terms
                    .iter()
                    .find(|(_, rest)| *rest == x)
                    .or_decline(|| format!("the polynomial's term is not 0.044715 · {x} · {x}"))?;
                near(g, k, x, TANH_CUBIC, elem, "0.044715")
            },
        );
    }
    let scaled = g.node(g.produced_by(a, "Mul")?);
    either_order(
        scaled,
        "√(2/π)",
        |c| g.constant(c).is_some(),
        |sum, c| {
            near(g, c, x, SQRT_2_OVER_PI, elem, "√(2/π)")?;
            let sum = g.node(g.produced_by(sum, "Add")?);
            either_order(
                sum,
                "x",
                |v| v == x,
                |cubic, _| {
                    let cubic = g.node(g.produced_by(cubic, "Mul")?);
                    either_order(
                        cubic,
                        "0.044715",
                        |c| g.constant(c).is_some(),
                        |cube, c| {
                            near(g, c, x, TANH_CUBIC, elem, "0.044715")?;
                            require!(is_cube(g, cube, x), "the cubic term is not {x}³");
                            Ok(())
                        },
                    )
                },
            )
        },
    )
}

/// `Pow(x, 3)`, or `x` times a square of x (`pattern::square`: `x · x`,
/// `Pow(x, 2)`), either way round.
fn is_cube(g: &Graph, value: &str, x: &str) -> bool {
    let Some(p) = g.producer(value) else { return false };
    let node = g.node(p);
    if node.is("Pow") && node.input.len() == 2 && node.input[0] == x {
        // The exponent may have a type of its own (Pow's T1).
        let e = &node.input[1];
        let within = |v: f64| g.elem_type(e).and_then(|t| ulps(t, v, 3.0)).is_some_and(|d| d <= 2);
        return pattern::scalar(g, e, x, "the exponent").is_ok_and(|v| v == 3.0 || within(v));
    }
    let square = |v: &str| g.producer(v).is_some_and(|s| pattern::square(g, s).is_ok_and(|y| y == x));
    node.is("Mul")
        && node.input.len() == 2
        && ((node.input[0] == x && square(&node.input[1])) || (node.input[1] == x && square(&node.input[0])))
}

/// A constant of one value within 2 units in the last place of `exact`,
/// in the element type of x.
fn near(g: &Graph, c: &str, x: &str, exact: f64, elem: i32, what: &str) -> Check<()> {
    let value = pattern::scalar(g, c, x, what)?;
    require!(g.elem_type(c) == Some(elem), "{what} ({c}) does not have the type of {x}");
    let distance = ulps(elem, value, exact);
    require!(
        distance.is_some_and(|d| d <= 2),
        "{what} is written as {}, {} units in the last place from its exact value",
        value as f32,
        distance.map_or("many".to_string(), |d| d.to_string())
    );
    Ok(())
}

/// Units in the last place of `elem` between `value` (stored in `elem`)
/// and `exact` rounded to `elem`.
fn ulps(elem: i32, value: f64, exact: f64) -> Option<u64> {
    // Float bits ordered as integers: the distance counts representable values.
    let ordered = |bits: u64, sign: u64| if bits & sign != 0 { -((bits & !sign) as i64) } else { bits as i64 };
    let key = |v: f64| match elem {
        FLOAT => Some(ordered(u64::from((v as f32).to_bits()), 1 << 31)),
        FLOAT16 => Some(ordered(u64::from(half::f16::from_f64(v).to_bits()), 1 << 15)),
        BFLOAT16 => Some(ordered(u64::from(half::bf16::from_f64(v).to_bits()), 1 << 15)),
        _ => None,
    };
    Some(key(value)?.abs_diff(key(exact)?))
}

/// The op for the form and target, with a bias folded in where the form's
/// op takes one.
fn replace(g: &Graph, index: usize, form: Form, x: &str, elem: i32) -> Check<Rewrite> {
    let m = Match::new(index);
    has_an_axis(g, x)?;
    if g.target == Target::Portable {
        g.require_portable(PORTABLE)?;
        let approximate = if form == Form::Tanh { "tanh" } else { "none" };
        let attributes = vec![AttributeProto::string("approximate", approximate)];
        return Ok(m.replace_with(node("Gelu", &[x], attributes)));
    }
    require!(elem != BFLOAT16, "ONNX Runtime's CPU provider has no bf16 GELU kernels");
    let op = |mut m: Match, bias: Option<(&str, pattern::Weight)>| {
        let (op, inputs): (&str, Vec<String>) = match (form, bias) {
            (Form::Erf, None) => ("Gelu", vec![x.to_string()]),
            (Form::Erf, Some((x0, bias))) => ("BiasGelu", vec![x0.to_string(), m.weight_input(g, bias, "bias")]),
            (Form::Tanh, None) => ("FastGelu", vec![x.to_string()]),
            (Form::Tanh, Some((x0, bias))) => ("FastGelu", vec![x0.to_string(), m.weight_input(g, bias, "bias")]),
        };
        let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        m.replace_with_microsoft(op, &inputs, vec![])
    };
    // With the bias folded in; where x is read elsewhere too, the driver
    // takes the form that reads x.
    Ok(match folded_bias(g, x) {
        Some(bias) => op(m, Some(bias)).or(op(Match::new(index), None)),
        None => op(m, None),
    })
}

/// `x = Add(x0, bias)`, bias a constant of one axis D (the last axis of x):
/// `(x0, bias)`.
fn folded_bias<'a>(g: &Graph<'a>, x: &'a str) -> Option<(&'a str, pattern::Weight<'a>)> {
    let (x0, bias) = pattern::bias_added(g, x)?;
    // The sum's shape is x0's, and its type (ONNX Runtime's kernels take one).
    let same_shape = g.shapes().shape(x0).is_some() && g.shapes().shape(x0) == g.shapes().shape(x);
    (same_shape && g.elem_type(x0).is_some() && g.elem_type(x0) == g.elem_type(x)).then_some((x0, bias))
}

/// `x · Sigmoid(α · x)` or `x · Sigmoid(x)`, either order.
fn sigmoid_form(g: &Graph, index: usize, top: &NodeProto) -> Check<Rewrite> {
    let sigmoid_of = |v: &str| g.produced_by(v, "Sigmoid").ok();
    candidate!(top.input.iter().any(|v| sigmoid_of(v).is_some()));
    either_order(
        top,
        "a Sigmoid",
        |v| sigmoid_of(v).is_some(),
        |x, s| {
            let y = g.node(sigmoid_of(s).expect("a Sigmoid, checked")).input[0].as_str();
            let alpha = if y == x {
                1.0
            } else {
                let scaled = g.produced_by(y, "Mul").or_no_candidate()?;
                let node = g.node(scaled);
                candidate!(node.input.len() == 2 && node.input.iter().any(|v| v == x));
                let c = if node.input[0] == x { &node.input[1] } else { &node.input[0] };
                candidate!(g.constant(c).is_some());
                pattern::scalar(g, c, x, "α")?
            };
            let elem = g.elem_type(x);
            require!(
                matches!(elem, Some(FLOAT | FLOAT16)),
                "{x} is not f32 or f16 (the kernel's types), found {}",
                type_text(elem)
            );
            require!(g.target == Target::Ort, "ONNX has no x·sigmoid(αx) op (QuickGelu is ONNX Runtime's)");
            has_an_axis(g, x)?;
            require!((alpha as f32).is_finite(), "α ({alpha}) is no finite f32");
            let attributes = vec![AttributeProto::float("alpha", alpha as f32)];
            Ok(Match::new(index).replace_with_microsoft("QuickGelu", &[x], attributes))
        },
    )
}

/// ONNX Runtime's GELU kernels (its own and ONNX's Gelu) write a scalar
/// as `[1]` (measured): x must be proved to have an axis.
fn has_an_axis(g: &Graph, x: &str) -> Check<()> {
    let shapes = g.shapes();
    let proved = shapes.rank(x).map_or(shapes.last_axis(x).is_some(), |r| r >= 1);
    require!(proved, "{x} is not proved to have an axis (ONNX Runtime's kernels make a scalar [1])");
    Ok(())
}
