//! complex-mul: complex numbers as a trailing axis of size 2 (real, imag),
//! `a = ar + i·ai`, `b = br + i·bi`:
//!
//! ```text
//! ComplexMul:      re = ar·br − ai·bi    im = ar·bi + ai·br    → com.microsoft.ComplexMul(a, b)
//! ComplexMulConj:  re = ar·br + ai·bi    im = ai·br − ar·bi    → com.microsoft.ComplexMulConj(a, b)
//! out = Concat(Unsqueeze(re, -1), Unsqueeze(im, -1), axis = -1)
//! ```
//!
//! The parts are taken as exporters write them: `Gather(x, 0|1, axis=-1)`
//! with a scalar index, or `Squeeze` of a `Slice`/`Split` part (both then
//! unsqueezed before the Concat); or `Slice`/`Split` parts that keep the
//! axis, concatenated as they are. Mul and Add commute, Sub does not; a and
//! b may be the same tensor. ONNX Runtime has these two ops on CUDA only,
//! so this pass is not in the default pipeline.

use crate::graph::{known, Check, Graph, IntsArgument, Stop, Target};
use crate::onnx::{type_text, FLOAT, FLOAT16};
use crate::pattern;
use crate::rewrite::{Match, Pass, Rewrite};
use crate::shapes::{slice_indices, Shapes};
use crate::{candidate, decline, require};

pub const PASS: Pass = Pass {
    name: "complex-mul",
    summary: "(ar·br − ai·bi, ar·bi + ai·br)  ->  com.microsoft.ComplexMul / ComplexMulConj (CUDA only)",
    default: false,
    caution: Some(
        "com.microsoft.ComplexMul and ComplexMulConj run on ONNX Runtime's CUDA execution provider only: \
         the output does not load on the CPU provider",
    ),
    absorbs: None,
    portable: None,
    kernel_opset: None,
    rule,
};

/// One real or imaginary part: `index` 0 or 1 of the last axis of `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part<'a> {
    of: &'a str,
    index: i64,
}

/// Whether the parts drop the last axis (then re and im are unsqueezed
/// before the Concat) or keep it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Squeezed,
    Kept,
}

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let concat = pattern::anchor(g, index, "Concat")?;
    require!(concat.input.len() == 2, "the Concat has {} inputs, not re and im", concat.input.len());
    let shapes = Shapes::new(g);
    let last_axis = |axis: i64, value: &str| axis == -1 || shapes.rank(value).is_some_and(|r| axis == r as i64 - 1);
    require!(last_axis(concat.attr_int("axis").unwrap_or(0), &concat.output[0]), "the Concat is not on the last axis");
    let unsqueezed = |value: &str| -> Option<usize> {
        let u = g.produced_by(value, "Unsqueeze").ok()?;
        let node = g.node(u);
        let IntsArgument::Known(axes) = g.ints_argument(node, "axes", 1, 13) else { return None };
        (axes.len() == 1 && last_axis(axes[0], &node.output[0])).then_some(u)
    };
    let (re, im, kind) = match (unsqueezed(&concat.input[0]), unsqueezed(&concat.input[1])) {
        (Some(r), Some(i)) => (g.node(r).input[0].as_str(), g.node(i).input[0].as_str(), Kind::Squeezed),
        _ => (concat.input[0].as_str(), concat.input[1].as_str(), Kind::Kept),
    };
    let (re_node, im_node) = (g.node(g.first_computing(re)?), g.node(g.first_computing(im)?));
    let product = |value: &str| -> Check<[Part; 2]> {
        let mul = g.produced_by(value, "Mul")?;
        let node = g.node(mul);
        require!(node.input.len() == 2, "a product has {} operands", node.input.len());
        Ok([part(g, &shapes, &node.input[0], kind)?, part(g, &shapes, &node.input[1], kind)?])
    };
    let same = |x: [Part; 2], y: [Part; 2]| x == y || x == [y[1], y[0]];
    let (op, a, b) = if re_node.is("Sub") && im_node.is("Add") {
        // re = ar·br − ai·bi, im = ar·bi + ai·br; a·b = b·a, so which tensor is
        // a only has to be consistent.
        let cross = product(&im_node.input[0])?;
        let (a, b) = match cross {
            [p, q] if p.index == 0 && q.index == 1 => (p.of, q.of),
            [p, q] if p.index == 1 && q.index == 0 => (q.of, p.of),
            _ => decline!("the imaginary part is not ar·bi + ai·br"),
        };
        require!(same(product(&im_node.input[1])?, [pt(a, 1), pt(b, 0)]), "the imaginary part is not ar·bi + ai·br");
        require!(same(product(&re_node.input[0])?, [pt(a, 0), pt(b, 0)]), "the real part does not start with ar·br");
        require!(same(product(&re_node.input[1])?, [pt(a, 1), pt(b, 1)]), "the real part does not subtract ai·bi");
        ("ComplexMul", a, b)
    } else if re_node.is("Add") && im_node.is("Sub") {
        // im = ai·br − ar·bi: the Sub's order says which tensor is conjugated.
        let first = product(&im_node.input[0])?;
        let (a, b) = match first {
            [p, q] if p.index == 1 && q.index == 0 => (p.of, q.of),
            [p, q] if p.index == 0 && q.index == 1 => (q.of, p.of),
            _ => decline!("the imaginary part is not ai·br − ar·bi"),
        };
        require!(same(product(&im_node.input[1])?, [pt(a, 0), pt(b, 1)]), "the imaginary part is not ai·br − ar·bi");
        let (x, y) = (product(&re_node.input[0])?, product(&re_node.input[1])?);
        let (rr, ii) = ([pt(a, 0), pt(b, 0)], [pt(a, 1), pt(b, 1)]);
        require!((same(x, rr) && same(y, ii)) || (same(x, ii) && same(y, rr)), "the real part is not ar·br + ai·bi");
        ("ComplexMulConj", a, b)
    } else {
        // Parts that are no sum or difference (a cache's Concat): no candidate.
        candidate!([re_node, im_node].iter().all(|n| n.is("Add") || n.is("Sub")));
        decline!(
            "re is {} and im is {}: not a complex product (Sub/Add or Add/Sub)",
            re_node.op_type(),
            im_node.op_type()
        );
    };
    for x in [a, b] {
        let last = shapes.shape(x).and_then(|s| s.last().and_then(|d| d.value()));
        require!(last == Some(2), "the last axis of {x} is not proved to be 2 (found {})", known(last));
        let t = g.elem_type(x);
        require!(
            matches!(t, Some(FLOAT | FLOAT16)),
            "{x} is not f32 or f16 (the kernel's types), found {}",
            type_text(t)
        );
    }
    require!(g.target == Target::Ort, "com.microsoft.{op} is ONNX Runtime's, not in the portable target");
    Ok(Match::new(index).replace_with_microsoft(op, &[a, b], vec![]))
}

fn pt(of: &str, index: i64) -> Part<'_> {
    Part { of, index }
}

/// A real or imaginary part of the kind the Concat implies.
fn part<'a>(g: &Graph<'a>, shapes: &Shapes, value: &'a str, kind: Kind) -> Check<Part<'a>> {
    let p = g.producer(value).or_decline(|| format!("{value} is not a part of a complex tensor"))?;
    let node = g.node(p);
    // ONNX's ops alone: another domain's Squeeze or Split may read nothing.
    require!(crate::onnx::is_default_domain(node.domain()), "{value} is not a part of a complex tensor");
    let last = |x: &str, axis: i64| axis == -1 || shapes.rank(x).is_some_and(|r| axis == r as i64 - 1);
    let found = match (kind, node.op_type()) {
        (Kind::Squeezed, "Gather") => {
            let index = g.constant(&node.input[1]);
            require!(index.is_some_and(|t| t.dims.is_empty()), "the Gather index of {value} is not a scalar");
            require!(
                last(&node.input[0], node.attr_int("axis").unwrap_or(0)),
                "the Gather of {value} is not on the last axis"
            );
            // The axis is proved to have length 2 below, where -1 is 1 and -2 is 0.
            let i = index.and_then(|t| t.scalar()).unwrap_or(f64::NAN);
            require!(matches!(i as i64, -2..=1) && i.fract() == 0.0, "the Gather of {value} takes index {i}");
            pt(&node.input[0], (i as i64).rem_euclid(2))
        }
        (Kind::Squeezed, "Squeeze") => {
            let axes = g.ints_argument(node, "axes", 1, 13);
            let kept = part(g, shapes, &node.input[0], Kind::Kept)?;
            require!(
                matches!(&axes, IntsArgument::Known(a) if a.len() == 1 && last(&node.input[0], a[0])),
                "the Squeeze of {value} is not of the last axis"
            );
            kept
        }
        (Kind::Kept, "Slice") if node.input.len() >= 3 || g.opset < 10 => {
            let (starts, ends, axes, steps) = g
                .slice_arguments(node)
                .or_decline(|| format!("the Slice of {value} has arguments computed at run time"))?;
            require!(
                starts.len() == 1 && ends.len() == 1 && axes.len() == 1 && steps.len() == 1,
                "the Slice of {value} is not of one axis"
            );
            require!(last(&node.input[0], axes[0]), "the Slice of {value} is not on the last axis");
            // The axis is proved to have length 2 below.
            let selected = slice_indices(starts[0], ends[0], steps[0], 2);
            require!(selected.len() == 1, "the Slice of {value} takes {selected:?} of an axis of 2, not one element");
            pt(&node.input[0], selected[0])
        }
        (Kind::Kept, "Split") if node.output.len() == 2 => {
            require!(
                last(&node.input[0], node.attr_int("axis").unwrap_or(0)),
                "the Split of {value} is not on the last axis"
            );
            let sizes = g.ints_argument(node, "split", 1, 13);
            require!(
                sizes == IntsArgument::Absent || sizes == IntsArgument::Known(vec![1, 1]),
                "the Split of {value} is not proved to be into two parts of 1"
            );
            pt(&node.input[0], if node.output[0] == value { 0 } else { 1 })
        }
        _ => decline!("{value} is not a part of a complex tensor"),
    };
    require!(found.index == 0 || found.index == 1, "{value} takes index {} of the last axis", found.index);
    Ok(found)
}

#[cfg(test)]
mod tests {
    use crate::shapes::slice_indices;

    #[test]
    fn slices_of_an_axis_of_two() {
        assert_eq!(slice_indices(0, 1, 1, 2), [0]);
        assert_eq!(slice_indices(1, i64::MAX, 1, 2), [1]);
        assert_eq!(slice_indices(-1, i64::MAX, 1, 2), [1]);
        assert_eq!(slice_indices(-2, -1, 1, 2), [0]);
        assert_eq!(slice_indices(-1, 0, 1, 2), Vec::<i64>::new(), "[-1:0] is empty");
        assert_eq!(slice_indices(0, 2, 1, 2), [0, 1]);
        assert_eq!(slice_indices(1, 0, -1, 2), [1]);
        assert_eq!(slice_indices(-1, i64::MIN, -1, 2), [1, 0]);
        assert_eq!(slice_indices(5, 9, 1, 2), Vec::<i64>::new());
        assert_eq!(slice_indices(0, 2, 2, 2), [0]);
    }
}
