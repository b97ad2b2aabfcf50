//! attention: `out = softmax(steps(q · k)) · v`
//!         → `transmuter.AttentionCore(q, k, v, side inputs…)`, overload = the form.
//!
//! Between the two MatMuls an export writes a short chain of steps:
//!
//! ```text
//! s = MatMul(q, k)                 (an Identity or an inference Dropout anywhere on the way is no step)
//!   | com.microsoft.FusedMatMul(q, k, alpha, transB)  not transA → token `fused_matmul`
//!   | Einsum(q, k) | Einsum(k, q)   contracting one head axis, ending (query, key) → token `einsum` / `einsum_kq`
//!                                  (tf2onnx's Keras: `aecd,abcd->acbe` of key, query)
//!     Mul(s, c) | Div(s, c)        c a constant with one value   → `mul` / `div`
//!     Div(s, d) | Mul(s, d)        d computed at run time (SwinV2's per-head scale),
//!                                  its broadcast leaving the scores' shape → input `divisor` / `multiplier`
//!     Mul(Tanh(Div(s, cap)), cap)  soft-capping (Gemma 2), cap a constant with one
//!                                  value, also Mul(s, 1/cap); before any mask → `softcap` / `softcap_mul`
//!     Cast(s, to = float type)                                   → `cast`
//!     Sub(Mul(s, m), Mul(c, Sub(1, m)))  Megatron's mask, m proved to hold only 0 and 1
//!                                  (a Cast of a bool, or a constant), c ≥ 1e4 → input `keep_mask`
//!     Where(keep, s, fill)         fill a constant ≤ -1e4        → input `keep`
//!     Where(hide, fill, s)         masked_fill: the same, inverted → input `hide`
//!     Add(s, mask)                 either order; several in a row → input `mask`, `mask_2`, …
//!     Sub(s, mask)                 a term subtracted (XLNet)      → token `sub`, input `mask`
//!     Sub(s, ReduceMax(s))         over the last axis, kept: the softmax's shift written out
//!                                  (DALLE-pytorch's stable softmax) → `centered`
//!     Max(s, c)                    c a constant with one value (OPT's clamp) → `max`
//!     Reshape(s, shape) … Reshape  a pair that gives back the shape of s → input `scores_shape` where
//!                                  computed at run time from other values
//! p = Softmax(s)                   over the last axis only
//!     Cast(p, to = float type)     (up to two)
//!     Where(IsNaN(p), 0, p)        the SDPA export's NaN guard   → `nan_guard`
//!     Where(hide, 0, p)            the masked_fill's keys zeroed (XSoftmax), by its
//!                                  condition → `zeroed` (`zeroed_kept`: Where(keep, p, 0)), input `hide` / `keep`
//!     Reshape(Reshape(p, a), b)    giving back the shape of p    → `probs_shape`
//! out = MatMul(p, v)
//!   | Einsum(p, v)                 contracting p's last axis with v → token `einsum_v`
//! ```
//!
//! The steps present, in their order, are the form (`mul.add.softmax.cast`):
//! the node's overload. The model-local function it calls is the matched
//! nodes themselves, written by the driver (`rewrite::write_function`), so
//! every runtime runs the same operators as before: q, k, v and the side
//! values computed at run time are its first inputs, other values from
//! outside (a constant the model shares) follow. docs/attention-core.md is
//! the interface for kernel writers.

use crate::graph::fold::values_held;
use crate::graph::{known, Check, Graph, Miss, Relabel, Stop, Target};
use crate::onnx::{FunctionProto, NodeProto, TensorProto, BFLOAT16, DOUBLE, FLOAT, FLOAT16, TRANSMUTER_DOMAIN};
use crate::pattern::{self, cast_to};
use crate::rewrite::{node_in, unused_name, Kept, Match, Pass, Portable, Rewrite};
use crate::shapes::{product, Shapes};
use crate::{candidate, decline, no_candidate, require};

mod kernel;
mod runtimes;

pub const PASS: Pass = Pass {
    name: "attention",
    summary: "softmax(q·k * scale + mask) · v  ->  transmuter.AttentionCore (with a local function)",
    default: true,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: Some(23),
    rule,
};

/// What `--target portable` writes.
const PORTABLE: Portable = Portable { op: "Attention", since: 23 };

/// A fill at most this large gives hidden keys no weight after softmax.
const MAX_FILL: f64 = -1.0e4;

/// One step between the two MatMuls.
#[derive(Debug, Clone)]
enum Step {
    Scale(&'static str, TensorProto),
    Divisor(String),
    Multiplier(String),
    /// `Mul(Tanh(op(s, cap_in)), cap)`: op `Div` by cap, or `Mul` by 1/cap.
    Softcap(&'static str, TensorProto, TensorProto),
    /// Megatron's `s·m − penalty·(one − m)`, m of zeros and ones.
    Megatron(String),
    Cast(i32),
    /// `Where(keep, s, fill)`, or with `fill_first` `Where(hide, fill, s)`
    /// (`masked_fill`): the condition names the keys hidden.
    Where {
        keep: String,
        fill: TensorProto,
        fill_first: bool,
    },
    Mask(String),
    /// `s − mask`.
    Subtract(String),
    /// `s − ReduceMax(s)` over the last axis, kept: the shift the softmax
    /// makes itself, written out.
    Centered,
    /// `Max(s, c)`, c a constant with one value: the masked scores clamped
    /// at the float's lowest (OPT's and BART's eager attention before
    /// transformers 4.36, in float16).
    Max,
    Reshape {
        shape: Side,
        allowzero: bool,
    },
    Softmax,
    NanGuard,
    /// `Where(hide, 0, p)`, or with `keep` `Where(keep, p, 0)`: the
    /// probabilities of the keys the mask's Where hides zeroed after the
    /// Softmax (DeBERTa's XSoftmax, SEW-D), the condition proved that
    /// Where's: a row it hides whole becomes zeros.
    Zeroed {
        condition: String,
        keep: bool,
    },
}

impl Step {
    /// The value computed at run time the step reads besides the scores,
    /// and the core's name for it (`after`: the step follows the Softmax).
    fn side_input(&self, after: bool) -> Option<(&str, &'static str)> {
        match self {
            Step::Divisor(d) => Some((d, "divisor")),
            Step::Multiplier(d) => Some((d, "multiplier")),
            Step::Where { keep, fill_first: false, .. } => Some((keep, "keep")),
            Step::Where { keep: hide, .. } => Some((hide, "hide")),
            Step::Zeroed { condition, keep: true } => Some((condition, "keep")),
            Step::Zeroed { condition, .. } => Some((condition, "hide")),
            Step::Mask(d) | Step::Subtract(d) => Some((d, "mask")),
            Step::Megatron(m) => Some((m, "keep_mask")),
            Step::Reshape { shape: Side::Input(d), .. } => {
                Some((d, if after { "probs_shape" } else { "scores_shape" }))
            }
            _ => None,
        }
    }

    /// Why ONNX `Attention` computes no such step, for the one reading of
    /// a core as `Attention` (`kernel::read`, both targets) where it names
    /// the step no other way: a new step is declined until it takes it.
    fn not_in_attention(&self) -> String {
        match self {
            Step::Subtract(d) => format!("a term subtracted ({d}): Attention only adds its mask"),
            step => format!("a step {} of the core: no step ONNX Attention takes", step.token()),
        }
    }

    /// The step's token in the core's form (docs/attention-core.md).
    fn token(&self) -> String {
        let token = match self {
            Step::Scale(op, _) => return op.to_ascii_lowercase(),
            Step::Divisor(_) => "div_input",
            Step::Multiplier(_) => "mul_input",
            Step::Softcap("Div", ..) => "softcap",
            Step::Softcap(..) => "softcap_mul",
            Step::Megatron(_) => "megatron_mask",
            Step::Cast(_) => "cast",
            Step::Where { fill_first: false, .. } => "where",
            Step::Where { .. } => "masked_fill",
            Step::Mask(_) => "add",
            Step::Subtract(_) => "sub",
            Step::Centered => "centered",
            Step::Max => "max",
            Step::Softmax => "softmax",
            Step::NanGuard => "nan_guard",
            Step::Zeroed { keep: true, .. } => "zeroed_kept",
            Step::Zeroed { .. } => "zeroed",
            Step::Reshape { shape, allowzero } => {
                let token = match shape {
                    Side::Constant => "reshape",
                    Side::Input(_) => "reshape_input",
                    Side::Computed => "reshape_computed",
                };
                // allowzero changes what a 0 in the shape means: another form.
                return if *allowzero { format!("{token}_allowzero") } else { token.into() };
            }
        };
        token.into()
    }
}

/// A Reshape's shape.
#[derive(Debug, Clone)]
enum Side {
    Constant,
    Input(String),
    /// Computed from the shapes of the core's own values (DeBERTa views its
    /// scores as `[-1, heads, Shape(s)[-2], Shape(s)[-1]]`): part of the
    /// match.
    Computed,
}

/// The ops of a shape computed from the core's own values: `Shape` of a
/// value of the core, ops that select and regroup its elements, and
/// arithmetic on them.
const SHAPE_OPS: &[&str] =
    &["Shape", "Gather", "Slice", "Squeeze", "Unsqueeze", "Concat", "Cast", "Add", "Sub", "Mul", "Div"];

/// Whether `value` is computed from constants and `Shape`s of the core's
/// values alone (`steps`: the scores and each step's output, in order),
/// one of them at least.
fn computed_from_core_shapes(g: &Graph, value: &str, steps: &[&str]) -> bool {
    fn visit(g: &Graph, value: &str, steps: &[&str], seen: &mut Vec<usize>, reads: &mut bool) -> Option<()> {
        if g.constant(value).is_some() {
            return Some(());
        }
        let p = g.producer(value)?;
        if seen.contains(&p) {
            return Some(());
        }
        let node = g.node(p);
        let ok = SHAPE_OPS.iter().any(|op| node.is(op)) && node.output.len() == 1 && g.malformed(p).is_none();
        if !ok || seen.len() >= 32 {
            return None;
        }
        seen.push(p);
        if node.is("Shape") {
            // Through what computes nothing (an inference Dropout).
            let mut x = node.input.first()?.as_str();
            while !steps.contains(&x) {
                x = g.identity_input(g.producer(x)?)?;
            }
            *reads = true;
            return Some(());
        }
        node.input.iter().try_for_each(|v| visit(g, v, steps, seen, reads))
    }
    let mut reads = false;
    visit(g, value, steps, &mut vec![], &mut reads).is_some() && reads
}

/// How the scores are computed from q and k.
enum Scores {
    MatMul,
    /// `com.microsoft.FusedMatMul(q, k, alpha, transB)`.
    Fused,
    /// An Einsum over one head axis; `key_first` where its first operand
    /// is the key (Keras computes `einsum(key, query)`).
    Einsum {
        key_first: bool,
    },
}

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let shapes = Shapes::new(g);
    if g.target == Target::Ort && g.node(index).is("Reshape") {
        // A kernel that merges its output's heads back grows past its
        // core's product: matched from the Reshape that merges them.
        let Some((out, merge)) = kernel::merged_by(g, index) else { no_candidate!() };
        let core = matched(g, &shapes, out).map_err(|_| Miss::NotCandidate)?;
        return lower(g, &shapes, core, merge);
    }
    let core = matched(g, &shapes, index)?;
    lower(g, &shapes, core, kernel::Merge::default())
}

/// The core whose final product is node `index`.
fn matched<'a>(g: &Graph<'a>, shapes: &Shapes, index: usize) -> Check<Core<'a>> {
    let node = g.node(index);
    candidate!(node.is("MatMul") || (node.is("Einsum") && node.input.len() == 2));
    let out = pattern::anchor(g, index, g.node(index).op_type())?;
    let mut m = Match::new(index);
    let (probs, v) = (out.input[0].as_str(), out.input[1].as_str());

    // Back from the probabilities to the Softmax. A MatMul whose input is
    // not a softmax is no attention core: not a candidate at all. A softmax
    // that is the product's second operand (ConvBERT's dynamic convolution:
    // unfolded values times a softmax over the kernel) is one, declined.
    let walk = || -> Check<(usize, Vec<(usize, Step)>)> {
        let mut after = Vec::new();
        let (mut value, mut walked) = (probs, 0);
        loop {
            let p = g.first_computing(value)?;
            if g.node(p).is("Softmax") {
                return Ok((p, after));
            }
            // At most 16 nodes from the Softmax to the anchor.
            candidate!(after.len() < 6 && walked < 15);
            walked += 1;
            // Identity (unoptimized dynamo exports) and an inference Dropout
            // compute nothing: no step.
            if let Some(input) = g.identity_input(p) {
                value = input;
                continue;
            }
            let (step, input) = match probs_step(g, p) {
                // GPT-OSS's attention sinks: a softmax over the scores and
                // a sink column, the column cut off after it.
                Err(Miss::NotCandidate) if g.node(p).is("Slice") && sliced_from_a_softmax(g, p) => {
                    decline!(
                        "the probabilities are a Slice of the Softmax's output (attention sinks?): no step of the core"
                    )
                }
                step => step?,
            };
            after.push((p, step));
            value = input;
        }
    };
    let (softmax, mut after) = match walk() {
        Err(Miss::NotCandidate) if g.first_computing(v).is_ok_and(|p| g.node(p).is("Softmax")) => {
            decline!("the softmax is the product's second operand (x · softmax), not the first (softmax · v)")
        }
        walked => walked?,
    };
    after.reverse();
    softmax_over_last_axis(g, &shapes, softmax)?;

    let (scores, mut before) = scores_chain(g, shapes, &g.node(softmax).input[0], 0)?;
    let scores_node = g.node(scores);
    let form = match scores_node.op_type() {
        "FusedMatMul" => Scores::Fused,
        "Einsum" => Scores::Einsum { key_first: einsum_scores(&shapes, scores_node)? },
        _ => Scores::MatMul,
    };
    let (a, b) = (scores_node.input[0].as_str(), scores_node.input[1].as_str());
    let (q, k) = if matches!(form, Scores::Einsum { key_first: true }) { (b, a) } else { (a, b) };
    if out.is("Einsum") {
        einsum_with_v(&shapes, out)?;
        // The Reshape pairs are proved against a MatMul's layout of v.
        let reshaped = after.iter().any(|(_, s)| matches!(s, Step::Reshape { .. }));
        require!(!reshaped, "a Reshape of the probabilities before an Einsum with v");
    }
    // Scores whose shape alone is read elsewhere (DistilBERT expands its
    // mask to Shape(scores)) keep their MatMul for that reader; the core
    // computes q·k again (ONNX Runtime merges the two when it inlines).
    m.keep(Kept::ForItsShape(g.node(scores).output[0].clone()));

    let count = |steps: &[(usize, Step)], f: fn(&Step) -> bool| steps.iter().filter(|(_, s)| f(s)).count();
    require!(
        count(&before, |s| matches!(s, Step::Scale(..) | Step::Divisor(_) | Step::Multiplier(_))) <= 1,
        "more than one scale"
    );
    // A scale computed at run time is the kernel's to apply where it
    // leaves the scores' shape as it is (one value, or one per head).
    for (n, step) in &before {
        if let Step::Divisor(d) | Step::Multiplier(d) = step {
            let node = g.node(*n);
            let scores = node.input.iter().find(|i| *i != d).unwrap_or(&node.input[0]);
            let kept = shapes.shape(scores).is_some_and(|s| shapes.shape(&node.output[0]) == Some(s));
            require!(kept, "the scale {d} is not proved to leave the scores' shape as it is");
        }
    }
    require!(count(&before, |s| matches!(s, Step::Where { .. } | Step::Megatron { .. })) <= 1, "more than one Where");
    require!(count(&before, |s| matches!(s, Step::Softcap(..))) <= 1, "more than one soft-cap");
    // Soft-capping bounds the scores before the mask hides keys; after
    // it, hidden keys keep the weight of -cap.
    if let Some(cap) = before.iter().position(|(_, s)| matches!(s, Step::Softcap(..))) {
        let masked = before[..cap]
            .iter()
            .any(|(_, s)| matches!(s, Step::Where { .. } | Step::Mask(_) | Step::Subtract(_) | Step::Megatron { .. }));
        require!(!masked, "the soft-cap is applied after the mask");
    }
    require!(count(&before, |s| matches!(s, Step::Cast(_))) <= 2, "more than two Casts before the Softmax");
    require!(count(&after, |s| matches!(s, Step::Cast(_))) <= 2, "more than two Casts after the Softmax");
    require!(count(&after, |s| matches!(s, Step::NanGuard)) <= 1, "more than one NaN guard");
    require!(count(&after, |s| matches!(s, Step::Zeroed { .. })) <= 1, "more than one Where after the Softmax");
    zeroed_as_hidden(g, shapes, &before, &after)?;
    reshapes_give_back_shapes(g, &shapes, &before, &after, v)?;
    // A Reshape's shape computed from the shapes of the core's own values
    // is part of the match (it would otherwise be computed from nodes the
    // core replaces).
    let values: Vec<&str> = std::iter::once(scores)
        .chain(before.iter().map(|(n, _)| *n))
        .chain([softmax])
        .chain(after.iter().map(|(n, _)| *n))
        .map(|n| g.node(n).output[0].as_str())
        .collect();
    // Step i reads the scores after i steps (the Softmax is one): its
    // shape is computed from those values only, or the graph has a cycle.
    let softmax_at = before.len();
    let positions = (0..softmax_at).chain(softmax_at + 1..);
    for (at, (_, step)) in positions.zip(before.iter_mut().chain(after.iter_mut())) {
        if let Step::Reshape { shape, .. } = step {
            if matches!(shape, Side::Input(value) if computed_from_core_shapes(g, value, &values[..=at])) {
                *shape = Side::Computed;
            }
        }
    }

    // What the core reads besides q and k (v, a mask) is not computed from
    // the steps it replaces: it would compute them twice. (Nor from scores
    // that do not stay: the driver declines a replacement that reads a value
    // computed from a node of its match.)
    let steps_nodes: Vec<usize> = before.iter().map(|(n, _)| *n).chain([softmax]).collect();
    let side = before.iter().chain(&after).filter_map(|(_, step)| step.side_input(false));
    for value in std::iter::once(v).chain(side.map(|(value, _)| value)) {
        let from_steps = steps_nodes.iter().any(|&n| g.computed_from(value, n));
        require!(!from_steps, "{value} is computed from the steps between the two MatMuls");
    }
    // The Reshapes of the scores and probabilities, in step order.
    let views: Vec<usize> =
        before.iter().chain(&after).filter(|(_, s)| matches!(s, Step::Reshape { .. })).map(|(n, _)| *n).collect();
    let steps: Vec<Step> =
        before.into_iter().map(|(_, s)| s).chain([Step::Softmax]).chain(after.into_iter().map(|(_, s)| s)).collect();
    Ok(Core { m, anchor: index, qkv: [q, k, v], scores: form, steps, views })
}

/// A matched core, one value: its match, the final product (`anchor`),
/// q, k, v, how the scores are computed, the steps between the two
/// products, and the Reshapes of the scores' views.
struct Core<'a> {
    m: Match,
    anchor: usize,
    qkv: [&'a str; 3],
    scores: Scores,
    steps: Vec<Step>,
    views: Vec<usize>,
}

/// What a matched core becomes for the graph's target, decided here
/// alone. `ort`: ONNX `Attention` (`kernel.rs`: guarded where the kernel
/// computes some inputs otherwise, and only where the runtime's measured
/// facts say it gains, `runtimes.rs`) where the opset has it, with
/// `AttentionCore` the driver falls back to; else `AttentionCore`, with
/// the reason it is not the kernel; `merge`, the Reshapes past the
/// product that the kernel's match takes, where the rule is at them.
/// `portable`: ONNX `Attention` where it computes the core exactly, else
/// nothing.
fn lower(g: &Graph, shapes: &Shapes, core: Core, merge: kernel::Merge) -> Check<Rewrite> {
    let Core { m, anchor, qkv: [q, k, v], scores: form, steps, views } = core;
    let out = g.node(anchor);
    match g.target {
        Target::Ort => {
            let rewrite = attention_core(m, [q, k, v], &form, out, &steps);
            // The function calls com.microsoft's FusedMatMul: a function
            // resolves only the domains the model imports (ONNX Runtime
            // resolves an unimported one for nodes of the graph alone).
            let core =
                if matches!(form, Scores::Fused) { rewrite.importing(crate::onnx::MICROSOFT, 1) } else { rewrite };
            // Where the model's opset has ONNX's Attention, the kernel the
            // runtime runs; the core where that is declined.
            let kernel = |merge| kernel::ort(g, shapes, anchor, [q, k, v], &form, &steps, &views, merge);
            let found = kernel(merge);
            // At a Reshape past the product, only what the rule at the
            // product does not find: a kernel that takes that Reshape, or
            // the reason found past it.
            if let Some(r) = merge.last() {
                match &found {
                    Ok(kernel) if kernel.anchor == r => {}
                    Err(Miss::Declined(why))
                        if kernel(kernel::Merge::default()).err() != Some(Miss::Declined(why.clone())) => {}
                    _ => no_candidate!(),
                }
            }
            Ok(match found {
                Ok(kernel) => kernel.or(core),
                // Where the opset has the kernel, a report says why this
                // core is not it.
                Err(Miss::Declined(why)) if g.opset >= 23 => core.noting(format!("not ONNX Attention: {why}")),
                Err(_) => core,
            })
        }
        Target::Portable => kernel::portable(g, shapes, m, [q, k, v], &form, &steps, &views),
    }
}

/// An Einsum's terms as attention writes them: two operands, letters
/// only, none twice in a term. An ellipsis (LongT5's `...qhd,...khd->...hqk`)
/// stands for as many axes in each operand and the output, each read as a
/// letter of its own (`einsum_axes_agree` then proves the operands' equal:
/// ONNX broadcasts an ellipsis, and the core is not written where it would).
fn einsum_letters(shapes: &Shapes, node: &NodeProto) -> Check<(Vec<char>, Vec<char>, Vec<char>)> {
    let terms = node.einsum_terms().filter(|(inputs, _)| inputs.len() == 2 && node.input.len() == 2);
    let (inputs, output) = terms.or_decline(|| format!("Einsum {} is not an equation of two operands", node.name()))?;
    let named: Vec<char> = inputs.iter().chain([&output]).flat_map(|t| t.chars()).collect();
    let spare: Vec<char> = ('A'..='Z').chain('a'..='z').filter(|c| !named.contains(c)).collect();
    // The axes an operand's ellipsis stands for: its rank less its letters.
    let spanned = |i: usize| -> Option<usize> {
        let letters = inputs[i].replacen("...", "", 1).chars().count();
        shapes.rank(&node.input[i])?.checked_sub(letters)
    };
    let span = match (inputs[0].contains("..."), inputs[1].contains("..."), output.contains("...")) {
        (false, false, false) => Some(0),
        (true, true, true) => spanned(0).filter(|&n| Some(n) == spanned(1) && n <= spare.len()),
        _ => None,
    };
    let letters = |t: &str| -> Option<Vec<char>> {
        let ellipsis: String = spare[..span?].iter().collect();
        let chars: Vec<char> = t.replacen("...", &ellipsis, 1).chars().collect();
        let distinct = chars.iter().enumerate().all(|(i, c)| c.is_ascii_alphabetic() && !chars[..i].contains(c));
        distinct.then_some(chars)
    };
    let parsed = letters(&inputs[0]).zip(letters(&inputs[1])).zip(letters(&output));
    let why = || format!("Einsum {} has a repeated letter, or an ellipsis of axes not proved alike", node.name());
    let ((x, y), out) = parsed.or_decline(why)?;
    Ok((x, y, out))
}

/// Einsum scores: one letter contracted (in both operands, not in the
/// output), every other letter of both operands in the output, the
/// batch letters (all but the last two of the output) in both, and the
/// output ending with the query axis of one operand and the key axis of the
/// other. True where the first operand is the key.
fn einsum_scores(shapes: &Shapes, node: &NodeProto) -> Check<bool> {
    let (x, y, s) = einsum_letters(shapes, node)?;
    let n = s.len();
    require!(n >= 2, "the Einsum of the scores has fewer than two output axes");
    let contracted: Vec<char> = x.iter().copied().filter(|c| !s.contains(c)).collect();
    let one_head_axis = matches!(contracted[..], [d] if y.contains(&d) && y.iter().all(|c| *c == d || s.contains(c)));
    let batch = s[..n - 2].iter().all(|c| x.contains(c) && y.contains(c));
    require!(one_head_axis && batch, "the Einsum of the scores does not contract one head axis of q and k");
    einsum_axes_agree(shapes, node, &x, &y)?;
    let (query, key) = (s[n - 2], s[n - 1]);
    let only = |t: &[char], c: char, not: char| t.contains(&c) && !t.contains(&not);
    if only(&x, query, key) && only(&y, key, query) {
        Ok(false)
    } else if only(&x, key, query) && only(&y, query, key) {
        Ok(true)
    } else {
        decline!(
            "the Einsum of the scores does not end with the query axis of one operand and the key axis of the other"
        )
    }
}

/// The axes of a letter both operands of an Einsum have are proved equal:
/// ONNX defines no broadcasting of a letter (only of an ellipsis), and
/// ONNX Runtime's kernel broadcasts one of 1 against another only where it
/// comes second (measured: an output of 1 head where its shape inference
/// says 2), so the core is not written where it would.
fn einsum_axes_agree(shapes: &Shapes, node: &NodeProto, x: &[char], y: &[char]) -> Check<()> {
    let (sx, sy) = (shapes.shape(&node.input[0]), shapes.shape(&node.input[1]));
    let (Some(sx), Some(sy)) = (sx.filter(|s| s.len() == x.len()), sy.filter(|s| s.len() == y.len())) else {
        decline!("the shapes of Einsum {}'s operands are not proved", node.name());
    };
    for (i, letter) in x.iter().enumerate() {
        if let Some(j) = y.iter().position(|c| c == letter) {
            require!(
                sx[i] == sy[j],
                "Einsum {}'s operands give {letter} the axes {} and {}, not proved equal",
                node.name(),
                sx[i],
                sy[j]
            );
        }
    }
    Ok(())
}

/// The probabilities' Einsum with v: it contracts their last axis (the
/// key) with v, and keeps every other letter.
fn einsum_with_v(shapes: &Shapes, node: &NodeProto) -> Check<()> {
    let (p, v, out) = einsum_letters(shapes, node)?;
    let key = p.last().copied();
    let dropped: Vec<char> = p.iter().chain(&v).copied().filter(|c| !out.contains(c)).collect();
    let contracts_key = key.is_some_and(|k| v.contains(&k) && dropped.iter().all(|&c| c == k));
    let query_kept = p.len() >= 2 && !v.contains(&p[p.len() - 2]);
    require!(contracts_key && query_kept, "the Einsum with v does not contract the probabilities' last axis alone");
    einsum_axes_agree(shapes, node, &p, &v)
}

fn is_float(to: Option<i32>) -> bool {
    matches!(to, Some(FLOAT | FLOAT16 | BFLOAT16 | DOUBLE))
}

/// A step after the Softmax, and the value it reads.
fn probs_step<'a>(g: &Graph<'a>, p: usize) -> Check<(Step, &'a str)> {
    let node = g.node(p);
    if node.is("Cast") {
        require!(is_float(cast_to(node)), "the Cast after the Softmax is not to a float type");
        return Ok((Step::Cast(cast_to(node).unwrap_or_default()), &node.input[0]));
    }
    if node.is("Reshape") && node.input.len() == 2 {
        return Ok((reshape(g, node), &node.input[0]));
    }
    if node.is("Where") && node.input.len() == 3 {
        // Where(hide, 0, p) or Where(keep, p, 0), the condition no IsNaN:
        // the hidden keys' probabilities zeroed (proved the mask's own
        // condition in `zeroed_as_hidden`).
        if g.produced_by(&node.input[0], "IsNaN").is_err() {
            let Some(zero_at) = (1..3).find(|&i| g.constant(&node.input[i]).is_some()) else { no_candidate!() };
            let read = &node.input[3 - zero_at];
            let zero = pattern::scalar(g, &node.input[zero_at], read, "the zeroing Where's value")?;
            require!(zero == 0.0, "the Where after the Softmax writes {zero}, not 0");
            return Ok((Step::Zeroed { condition: node.input[0].clone(), keep: zero_at == 2 }, read));
        }
        // Where(IsNaN(p), 0, p): rows that were all -inf become zeros.
        let guarded = node.input[2].as_str();
        let isnan = g.produced_by(&node.input[0], "IsNaN").or_no_candidate()?;
        candidate!(g.node(isnan).input[0] == guarded);
        require!(
            pattern::scalar(g, &node.input[1], guarded, "the NaN guard's value")? == 0.0,
            "the NaN guard does not write 0"
        );
        return Ok((Step::NanGuard, guarded));
    }
    no_candidate!()
}

/// Whether Slice `p` reads a Softmax's output (through up to two Casts).
fn sliced_from_a_softmax(g: &Graph, p: usize) -> bool {
    let mut value = g.node(p).input.first().map(String::as_str);
    for _ in 0..3 {
        let Some(n) = value.and_then(|v| g.computing(v).ok()).map(|n| g.node(n)) else { return false };
        match n.op_type() {
            "Softmax" => return true,
            "Cast" => value = n.input.first().map(String::as_str),
            _ => return false,
        }
    }
    false
}

fn reshape(g: &Graph, node: &NodeProto) -> Step {
    let shape = match g.constant(&node.input[1]) {
        Some(_) => Side::Constant,
        None => Side::Input(node.input[1].clone()),
    };
    Step::Reshape { shape, allowzero: node.attr_int("allowzero").unwrap_or(0) == 1 }
}

/// Softmax normalizes the last axis alone. From opset 13 `axis` is that
/// axis; before, Softmax flattens from `axis` (default 1), which is the same
/// only when `axis` is the last one.
fn softmax_over_last_axis(g: &Graph, shapes: &Shapes, softmax: usize) -> Check<()> {
    let node = g.node(softmax);
    // The default axis changed at opset 13: a model that does not import
    // the default domain does not say which one it was written for.
    require!(
        node.attr("axis").is_some() || !g.opset_implied,
        "the model does not import the default domain: ONNX Runtime reads the Softmax at opset {} (axis -1), \
         other runtimes and older opsets flatten from axis 1",
        g.opset
    );
    let axis = node.attr_int("axis").unwrap_or(if g.opset >= 13 { -1 } else { 1 });
    if axis == -1 {
        return Ok(());
    }
    let rank = shapes.rank(&node.input[0]);
    require!(
        rank.is_some_and(|r| axis == r as i64 - 1),
        "the Softmax is over axis {axis}, not provably the last axis (rank {}, opset {})",
        known(rank),
        g.opset
    );
    Ok(())
}

/// Back from the Softmax's input to the MatMul of q and k, through the
/// steps the spec allows. An Add is tried both ways round: which operand is
/// the scores is what leads back to the MatMul.
fn scores_chain<'a>(
    g: &Graph<'a>,
    shapes: &Shapes,
    value: &'a str,
    depth: usize,
) -> Check<(usize, Vec<(usize, Step)>)> {
    require!(depth < 12, "no MatMul within 12 steps before the Softmax");
    let p = g.computing(value)?;
    let node = g.node(p);
    let step = |steps: Check<(usize, Vec<(usize, Step)>)>, s: Step| {
        steps.map(|(mm, mut list)| {
            list.push((p, s));
            (mm, list)
        })
    };
    // An Identity or an inference Dropout computes nothing: no step.
    if let Some(input) = g.identity_input(p) {
        return scores_chain(g, shapes, input, depth + 1);
    }
    let binary = node.input.len() == 2;
    // The scores through either operand, the other the step's (an added
    // mask, a run-time multiplier). Where neither leads back to the
    // MatMul, the miss told is that of an operand a node computes: a
    // graph input or a constant leads nowhere, and its miss would hide
    // where the other's path broke.
    let either = |make: fn(String) -> Step| {
        let through = |[x, other]: [&'a String; 2]| step(scores_chain(g, shapes, x, depth + 1), make(other.clone()));
        let [a, b] = [&node.input[0], &node.input[1]];
        through([a, b]).or_else(|first| {
            let told_second = g.producer(a).is_none() && g.producer(b).is_some();
            through([b, a]).map_err(|second| if told_second { second } else { first })
        })
    };
    match node.op_type() {
        _ if node.domain() == crate::onnx::MICROSOFT && node.op_type() == "FusedMatMul" && binary => {
            let trans = |a: &str| node.attr_int(a).unwrap_or(0) != 0;
            require!(!trans("transA"), "the FusedMatMul of the scores transposes q (transA)");
            require!(
                !trans("transBatchA") && !trans("transBatchB"),
                "the FusedMatMul of the scores transposes batches"
            );
            return Ok((p, vec![]));
        }
        _ if !crate::onnx::is_default_domain(node.domain()) => {}
        "MatMul" | "Einsum" if binary => return Ok((p, vec![])),
        "Mul" if binary => {
            if let Some((scores, cap)) = softcap(g, node)? {
                return step(scores_chain(g, shapes, scores, depth + 1), cap);
            }
            // Neither operand a constant: a scale computed at run time
            // (SwinV2's Exp(Clip(logit_scale)) per head); the scores are
            // the operand that leads back to the MatMul.
            if node.input.iter().all(|i| g.constant(i).is_none()) {
                return either(Step::Multiplier);
            }
            // The scale is the constant operand (either order).
            let (s, c) = if g.constant(&node.input[1]).is_some() { (0, 1) } else { (1, 0) };
            pattern::scalar(g, &node.input[c], &node.input[s], "the Mul scale")?;
            let scale = g.constant(&node.input[c]).expect("a constant, proved above");
            let found =
                step(scores_chain(g, shapes, &node.input[s], depth + 1), Step::Scale("Mul", Clone::clone(scale)));
            return found;
        }
        "Div" if binary => {
            let divisor = &node.input[1];
            let s = match g.constant(divisor) {
                Some(t) => {
                    pattern::scalar(g, divisor, &node.input[0], "the Div scale")?;
                    Step::Scale("Div", Clone::clone(t))
                }
                None => Step::Divisor(divisor.clone()),
            };
            return step(scores_chain(g, shapes, &node.input[0], depth + 1), s);
        }
        "Cast" => {
            require!(is_float(cast_to(node)), "the Cast before the Softmax is not to a float type");
            let s = Step::Cast(cast_to(node).unwrap_or_default());
            return step(scores_chain(g, shapes, &node.input[0], depth + 1), s);
        }
        "Max" if binary => {
            let (s, c) = if g.constant(&node.input[1]).is_some() { (0, 1) } else { (1, 0) };
            let bound = pattern::scalar(g, &node.input[c], &node.input[s], "the Max's bound")?;
            // At most a fill: a key the mask hides stays hidden.
            require!(bound <= MAX_FILL, "the Max's bound is {bound}, not at most -1e4: hidden keys would keep weight");
            return step(scores_chain(g, shapes, &node.input[s], depth + 1), Step::Max);
        }
        "Where" if node.input.len() == 3 => {
            // The fill is the constant branch: Where(keep, s, fill), or
            // masked_fill's Where(hide, fill, s).
            let (x, y) = (&node.input[1], &node.input[2]);
            require!(
                g.constant(x).is_some() || g.constant(y).is_some(),
                "neither branch of the Where {} ({x}, {y}) is a constant fill",
                node.name()
            );
            let fill_first = g.constant(&node.input[1]).is_some() && g.constant(&node.input[2]).is_none();
            let (scores, fill) =
                if fill_first { (&node.input[2], &node.input[1]) } else { (&node.input[1], &node.input[2]) };
            let value = pattern::scalar(g, fill, scores, "the Where fill")?;
            require!(value <= MAX_FILL, "the Where fill is {value}, not at most -1e4: hidden keys would keep weight");
            let fill = Clone::clone(g.constant(fill).expect("a constant, proved above"));
            let s = Step::Where { keep: node.input[0].clone(), fill, fill_first };
            return step(scores_chain(g, shapes, scores, depth + 1), s);
        }
        "Add" if binary => return either(Step::Mask),
        "Reshape" if binary => {
            return step(scores_chain(g, shapes, &node.input[0], depth + 1), reshape(g, node));
        }
        "Sub" if binary => {
            // Megatron's s·m − c·(1 − m): its penalty is a Mul of 1 − m, and
            // the scores a Mul too (Funnel's s − c·(1 − m) is a term
            // subtracted, below).
            let penalty = g.produced_by(&node.input[1], "Mul").ok().map(|p| g.node(p));
            let product = g.produced_by(&node.input[0], "Mul").is_ok();
            if product && penalty.is_some_and(|p| p.input.iter().any(|i| g.produced_by(i, "Sub").is_ok())) {
                let (scores, megatron) = megatron_mask(g, shapes, node)?;
                return step(scores_chain(g, shapes, scores, depth + 1), megatron);
            }
            // The row's largest score subtracted (a stable softmax written out).
            if let Ok(max) = g.produced_by(&node.input[1], "ReduceMax") {
                if g.node(max).input.first() == Some(&node.input[0]) {
                    pattern::reduces_last_axis(g, max, "ReduceMax")?;
                    return step(scores_chain(g, shapes, &node.input[0], depth + 1), Step::Centered);
                }
            }
            // A term subtracted (XLNet: `score − 1e30 · mask`).
            return step(scores_chain(g, shapes, &node.input[0], depth + 1), Step::Subtract(node.input[1].clone()));
        }
        _ => {}
    }
    decline!("{} {} is not a step of the attention core", node.op_type(), node.name())
}

/// `Mul(Tanh(t), cap)` (either order) with `t = Div(s, cap)` or
/// `Mul(s, 1/cap)` (either order), cap a constant with one value: Gemma 2's
/// soft-capping, and the scores it reads. None where the Mul reads no Tanh.
fn softcap<'a>(g: &Graph<'a>, node: &'a NodeProto) -> Check<Option<(&'a str, Step)>> {
    let tanh_at = (0..2).find(|&i| g.produced_by(&node.input[i], "Tanh").is_ok());
    let Some(t) = tanh_at else { return Ok(None) };
    let cap = &node.input[1 - t];
    let tanh = g.node(g.produced_by(&node.input[t], "Tanh")?);
    let cap_value = pattern::scalar(g, cap, &tanh.input[0], "the soft-cap")?;
    let inner = g.node(g.computing(&tanh.input[0])?);
    require!(
        crate::onnx::is_default_domain(inner.domain())
            && inner.input.len() == 2
            && (inner.is("Div") || inner.is("Mul")),
        "the soft-cap's Tanh does not read the scores divided by the cap"
    );
    let (scores, by) = match inner.op_type() {
        "Div" => (&inner.input[0], &inner.input[1]),
        _ if g.constant(&inner.input[1]).is_some() => (&inner.input[0], &inner.input[1]),
        _ => (&inner.input[1], &inner.input[0]),
    };
    let by_value = pattern::scalar(g, by, scores, "the soft-cap's divisor")?;
    let matches = match inner.op_type() {
        "Div" => by_value == cap_value,
        // 1/cap rounded to the constant's type: within 2 units in its last place.
        _ => ((by_value * cap_value) - 1.0).abs() <= 2.0 * ulp_of_one(g.elem_type(by)),
    };
    require!(matches, "the soft-cap divides by {by_value} and multiplies by {cap_value}: not one cap");
    require!(cap_value.is_finite() && cap_value > 0.0, "the soft-cap {cap_value} is not a positive number");
    let constant = |v: &str| Clone::clone(g.constant(v).expect("a constant, proved above"));
    let op = if inner.is("Div") { "Div" } else { "Mul" };
    Ok(Some((scores.as_str(), Step::Softcap(op, constant(by), constant(cap)))))
}

/// Megatron's mask `Sub(Mul(s, m), Mul(c, Sub(1, m)))` (each Mul either
/// order): where m is 1 the scores, where it is 0 the fill −c. It hides keys
/// only where m is proved to hold nothing but 0 and 1 (`values_held`: a
/// Cast of a bool, a constant of zeros and ones) and c ≥ 1e4. Returns the
/// scores.
fn megatron_mask<'a>(g: &Graph<'a>, shapes: &Shapes, node: &'a NodeProto) -> Check<(&'a str, Step)> {
    let product = g.node(g.produced_by(&node.input[0], "Mul")?);
    let penalty = g.node(g.produced_by(&node.input[1], "Mul")?);
    // The penalty: a constant times (1 - m).
    let (c, complement) = if g.constant(&penalty.input[0]).is_some() {
        (&penalty.input[0], &penalty.input[1])
    } else {
        (&penalty.input[1], &penalty.input[0])
    };
    let complement = g.node(g.produced_by(complement, "Sub")?);
    let (one, m) = (&complement.input[0], complement.input[1].as_str());
    let scores = match (product.input[0].as_str(), product.input[1].as_str()) {
        (s, x) | (x, s) if x == m && s != m => s,
        _ => decline!("the scores are not multiplied by the mask that 1 − m reads"),
    };
    require!(pattern::scalar(g, one, m, "the mask's complement")? == 1.0, "the complement is not 1 − m");
    let c_value = pattern::scalar(g, c, scores, "the mask's penalty")?;
    require!(c_value >= -MAX_FILL, "the penalty is {c_value}, not at least 1e4: hidden keys would keep weight");
    let zeros_and_ones = values_held(g, shapes, m).is_some_and(|v| v.iter().all(|&x| x == 0.0 || x == 1.0));
    require!(zeros_and_ones, "the mask {m} is not proved to hold only 0 and 1");
    Ok((scores, Step::Megatron(m.to_string())))
}

/// The relative spacing of floats near 1 in an element type.
fn ulp_of_one(elem: Option<i32>) -> f64 {
    match elem {
        Some(FLOAT16) => 2f64.powi(-10),
        Some(BFLOAT16) => 2f64.powi(-7),
        Some(DOUBLE) => 2f64.powi(-52),
        _ => 2f64.powi(-23),
    }
}

/// Reshapes come in pairs that give back the shape they started from:
/// both before the softmax (3-D heads folded into the batch, reshaped to
/// 4-D around the mask), both after it, or one on each side (BLOOM: the
/// scores reshaped to 4-D for the mask, the probabilities back to 3-D), where
/// the softmax's last axis must be the last axis it started from; or one
/// alone that only regroups the axes before the last two. Proved
/// with symbolic shapes, since exports compute these shapes at run time.
/// The last Reshape feeds the final MatMul through steps that keep its
/// shape, so its last axis is v's second to last (a run where they differ
/// fails in both models): that pins a `-1` the mask's broadcast hides.
fn reshapes_give_back_shapes(
    g: &Graph,
    shapes: &Shapes,
    before: &[(usize, Step)],
    after: &[(usize, Step)],
    v: &str,
) -> Check<()> {
    let reshapes = |steps: &[(usize, Step)]| -> Vec<usize> {
        steps.iter().filter(|(_, s)| matches!(s, Step::Reshape { .. })).map(|(n, _)| *n).collect()
    };
    let last_reshape = after.iter().rev().find(|(_, s)| matches!(s, Step::Reshape { .. })).map(|(n, _)| *n);
    let gives_back = |first: usize, second: usize, what: &str| -> Check<()> {
        let start = shapes.shape(&g.node(first).input[0]);
        let mut end = shapes.shape(&g.node(second).output[0]);
        let contracted = shapes.shape(v).filter(|v| v.len() >= 2).map(|v| v[v.len() - 2].clone());
        if let (Some(end), Some(k), true) = (end.as_mut(), contracted, last_reshape == Some(second)) {
            if let Some(last) = end.last_mut() {
                *last = k;
            }
        }
        require!(
            start.is_some() && start == end,
            "the Reshape pair around the {what} is not proved to give back its shape"
        );
        Ok(())
    };
    match (reshapes(before).as_slice(), reshapes(after).as_slice()) {
        ([first], [second]) => {
            gives_back(*first, *second, "softmax")?;
            let last = |v: &str| shapes.shape(v).and_then(|s| s.last().cloned());
            let (start, view) = (last(&g.node(*first).input[0]), last(&g.node(*first).output[0]));
            require!(
                start.is_some() && start == view,
                "the Reshape before the softmax is not proved to keep the last axis"
            );
            Ok(())
        }
        ([one], []) | ([], [one]) => {
            // A lone view that regroups only the axes before the last two
            // (BLOOM via dynamo: 3-D scores, then 4-D against a 4-D v).
            let (start, view) = (shapes.shape(&g.node(*one).input[0]), shapes.shape(&g.node(*one).output[0]));
            let regroups = start.zip(view).is_some_and(|(start, view)| {
                let (n, m) = (start.len(), view.len());
                n >= 2
                    && m >= 2
                    && start[n - 2..] == view[m - 2..]
                    && product(&start[..n - 2]).is_some_and(|p| Some(p) == product(&view[..m - 2]))
            });
            require!(regroups, "the Reshape around the softmax is not proved to regroup only the leading axes");
            Ok(())
        }
        (b, a) => {
            for (pair, what) in [(b, "scores"), (a, "probabilities")] {
                match pair {
                    [] => {}
                    [first, second] => gives_back(*first, *second, what)?,
                    _ => decline!("{} Reshapes around the {what}, not a pair", pair.len()),
                }
            }
            Ok(())
        }
    }
}

/// A `Zeroed` step after the Softmax zeroes the keys the mask's Where
/// before it hides, no other: its condition is that Where's (the same
/// value, or computed alike, `Graph::same_value`), read the same way
/// (hide, or keep), on the same view of the scores: no Reshape between
/// the two, or both on the scores' own shape (the Reshapes before each a
/// whole number of pairs, each giving back the shape it viewed,
/// `reshapes_give_back_shapes`), or what it zeroes proved of the shape
/// the mask's Where wrote. Hidden keys have no weight already (the fill is
/// at most -1e4), so it changes only a row hidden whole: zeros, not the
/// mean of v.
fn zeroed_as_hidden(g: &Graph, shapes: &Shapes, before: &[(usize, Step)], after: &[(usize, Step)]) -> Check<()> {
    let zeroed = after.iter().enumerate().find_map(|(i, (_, s))| match s {
        Step::Zeroed { condition, keep } => Some((i, condition, keep)),
        _ => None,
    });
    let Some((at, condition, keep)) = zeroed else { return Ok(()) };
    let masked = before.iter().enumerate().rev().find_map(|(i, (_, s))| match s {
        Step::Where { keep: hide, fill_first, .. } => Some((i, hide, fill_first)),
        _ => None,
    });
    let (masked, hide, fill_first) =
        masked.or_decline(|| "a Where zeroes the probabilities, and no Where masks the scores".into())?;
    require!(
        g.same_value(hide, condition).is_some() && *fill_first != *keep,
        "the Where after the Softmax zeroes by {condition}, not by the mask's condition {hide} read alike"
    );
    let views = |steps: &[(usize, Step)]| steps.iter().filter(|(_, s)| matches!(s, Step::Reshape { .. })).count();
    let zeroing = g.node(after[at].0);
    let read = &zeroing.input[if *keep { 1 } else { 2 }];
    let masked_shape = shapes.shape(&g.node(before[masked].0).output[0]);
    let between = views(&before[masked..]) + views(&after[..at]);
    require!(
        between == 0
            || (views(&before[..masked]) % 2 == 0 && between % 2 == 0)
            || (masked_shape.is_some() && shapes.shape(read) == masked_shape),
        "a Reshape between the mask's Where and the Where that zeroes the probabilities, the shapes they read not proved equal"
    );
    Ok(())
}

/// The AttentionCore node of the form: q, k, v and the side values the
/// steps read, named for the function whose body the driver writes from
/// the match.
fn attention_core(m: Match, [q, k, v]: [&str; 3], scores: &Scores, out: &NodeProto, steps: &[Step]) -> Rewrite {
    let first = match scores {
        Scores::MatMul => None,
        Scores::Fused => Some("fused_matmul"),
        Scores::Einsum { key_first: true } => Some("einsum_kq"),
        Scores::Einsum { key_first: false } => Some("einsum"),
    };
    let tokens = steps.iter().map(Step::token);
    let last = out.is("Einsum").then_some("einsum_v");
    let form: Vec<String> = first.into_iter().map(String::from).chain(tokens).chain(last.map(String::from)).collect();
    let form = form.join(".");
    let (mut inputs, mut names) = (vec![q, k, v], vec!["q".to_string(), "k".into(), "v".into()]);
    let softmax = steps.iter().position(|s| matches!(s, Step::Softmax));
    for (i, step) in steps.iter().enumerate() {
        if let Some((value, role)) = step.side_input(softmax.is_some_and(|at| i > at)) {
            names.push(unused_name(role, 2, |n| names.iter().any(|taken| taken == n)));
            inputs.push(value);
        }
    }
    let node =
        NodeProto { overload: Some(form.clone()), ..node_in(TRANSMUTER_DOMAIN, "AttentionCore", &inputs, vec![]) };
    let function = FunctionProto {
        input: names,
        doc_string: Some(format!(
            "The attention core of form {form}: exactly the operators it replaced. See onnx-fuse's docs/attention-core.md."
        )),
        ..Default::default()
    };
    m.replace_with_call(node, function)
}
