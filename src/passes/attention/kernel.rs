//! The kernel runtimes run: ONNX `Attention` (opset 23). A core's steps
//! are read as its arguments once, for both targets (`read`); the `ort`
//! target's lowering (`ort`, below) guards the inputs where ONNX
//! Runtime's kernel computes otherwise, the portable one (`portable`)
//! writes only a call that needs no guard.
//!
//! ```text
//! out = softmax(scale · q·kᵀ + mask) · v          q [b, H, S, d]
//!   q     = Mul(q0, c) | q0                       c a one-value constant: part of the scale
//!   k     = Mul(Transpose(key), c) | Transpose(key)   swapping the last two axes
//!   key   = repeat(k0, n) | k0                    each KV head n times in place (grouped heads)
//!   v     = repeat(v0, n) | v0                    the same n
//!   repeat(x, n) = Reshape(Expand(Unsqueeze(x, 2), [b, kv, n, t, d]), [b, kv·n, t, d])  (or Tile for Expand)
//! → If(ok) { Attention(q0, k0, v0, mask) } else { the original ops }
//! ```
//!
//! An encoder's core (neither cache nor grouped heads) is written in the
//! kernel's 3-D form, reading the `[b, s, h·d]` values its heads are split
//! from and writing the merged output (`merged_heads`). A cache without
//! grouped heads is written where the export scales its transposed key by a
//! value computed at run time (`scaled_by_one_values`); elsewhere ONNX
//! Runtime's own MatMuls are faster, and it stays `AttentionCore`. A `Where` mask is
//! the kernel's boolean mask, the keys kept, where a bound on the scores
//! proves the fill gives hidden keys no weight.
//!
//! `k0` and `v0` are the model's own key and value: with a KV cache, the
//! present values its `Concat`s compute, which stay as they are. ONNX's
//! grouped heads read KV head `h / n` for query head `h`, which is what
//! repeating each head in place computes (torch's `repeat_kv`).
//!
//! ONNX Runtime's kernel computes the core on every input but these
//! (docs/attention-kernel.md, pinned by tests/kernel.rs): a query row whose
//! every mask value is the type's lowest or -inf (zeros, where the core
//! gives the mean of v or NaN), and an empty batch, query, key or head
//! (an error, where the core gives an empty or zero result). The call with
//! such an input runs the original ops instead (`If`), so the output is the
//! original's on every input. A NaN guard after the softmax (SDPA exports:
//! a row of NaN becomes zeros) is kept the same way: where the kernel's
//! result holds a NaN, the original ops run. A long call (a prompt's) runs
//! the kernel over pieces of its queries (`over_query_pieces`), each
//! reading only the keys its rows see where the mask hides the rest (a
//! float mask by its lowest or -inf, a boolean one by false: `keys_seen`).

use std::collections::HashMap;

use super::runtimes::{Speed, ORT_CPU as SPEED, PORTABLE as ANY_RUNTIME};
use super::{Scores, Step, PORTABLE};
use crate::graph::fold::{fold, values_held};
use crate::graph::{Check, Graph, Miss, Stop};
use crate::onnx::{type_text, AttributeProto, GraphProto, NodeProto, TensorProto, DOUBLE, FLOAT, FLOAT16, INT64};
use crate::rewrite::{branch, guard, node, original_ops, reading_instead, writing, Kept, Match, Nodes, Rewrite};
use crate::shapes::{proved_broadcast, Dim, Shapes};
use crate::{decline, require};

/// A core read as ONNX `Attention`'s arguments, alike for both targets
/// (`read`): q and the key's transpose with their one-value scales taken
/// into `scale`, the mask steps in order (each with the number of the
/// scores' Reshapes before it), the soft-cap, and whether a NaN guard
/// follows the softmax. Each target's lowering then takes what its
/// runtimes compute as the core does: `ort` guards the inputs where ONNX
/// Runtime's kernel computes otherwise, `portable` (no runtime's facts
/// known) only a call that needs no guard.
struct Call<'a> {
    elem: i32,
    q: &'a str,
    k: &'a str,
    /// The key is scaled by a value computed at run time (`scaled_by_one_values`).
    key_scaled_at_run_time: bool,
    scale: f64,
    masks: Vec<(Step, usize)>,
    nan_guard: bool,
    softcap: Option<f64>,
    /// The scores' Reshapes where they fold the heads into the batch
    /// (`folding`), else none.
    views: Vec<usize>,
}

/// The element types a lowering's `Attention` is written for, and their
/// names: ONNX Runtime's guard reasons in f32.
type Elems = (&'static [i32], &'static str);
const ORT_ELEMS: Elems = (&[FLOAT], "f32");
const PORTABLE_ELEMS: Elems = (&[FLOAT, FLOAT16, DOUBLE], "f32, f16 and f64");

/// The one reading of a core's steps as ONNX `Attention` (`Call`), for
/// cores of the element types `elems`. A step it does not name is
/// declined (`Step::not_in_attention`). `views`: the scores' Reshapes.
#[allow(clippy::too_many_arguments)]
fn read<'a>(
    g: &Graph<'a>,
    shapes: &Shapes,
    out: &NodeProto,
    [q, k]: [&'a str; 2],
    form: &Scores,
    steps: &[Step],
    views: &[usize],
    elems: Elems,
) -> Check<Call<'a>> {
    match form {
        Scores::MatMul if out.is("MatMul") => {}
        Scores::Fused => decline!("the scores are ONNX Runtime's FusedMatMul, which ONNX's Attention does not read"),
        _ => decline!("the core is written with Einsum, which ONNX's Attention does not read"),
    }
    let (types, named) = elems;
    let elem = g.elem_type(q).filter(|e| types.contains(e));
    let elem =
        elem.or_decline(|| format!("Attention is written for {named} only (q is {})", type_text(g.elem_type(q))))?;
    let mut scale = 1.0;
    let mut masks: Vec<(Step, usize)> = Vec::new();
    let (mut nan_guard, mut softcap, mut viewed) = (false, None, 0);
    for step in steps {
        match step {
            Step::Softmax => {}
            Step::Reshape { .. } => viewed += 1,
            Step::Scale(op, c) => {
                require!(masks.is_empty(), "the mask is added before the scale");
                let c = c.scalar().unwrap_or(f64::NAN);
                scale *= if *op == "Div" { 1.0 / c } else { c };
            }
            Step::Divisor(d) | Step::Multiplier(d) => {
                // A divisor computed from the head size is a constant.
                let divides = matches!(step, Step::Divisor(_));
                let c = fold(g, shapes, d).filter(|c| c.elem == elem && c.dims.len() <= 4).and_then(|c| c.scalar());
                let what = if divides { "divisor" } else { "multiplier" };
                let c = c.or_decline(|| format!("the {what} {d} is computed at run time"))?;
                require!(masks.is_empty(), "the mask is added before the scale");
                scale *= if divides { 1.0 / c } else { c };
            }
            Step::Cast(to) => {
                require!(*to == elem, "a Cast between the MatMuls changes the type Attention computes in")
            }
            Step::Mask(value) => {
                // (s + m1) + m2 is s + (m1 + m2) where m1 or m2 is 0, not
                // elsewhere (`replayed_mask`).
                let added = masks.iter().filter(|(m, _)| matches!(m, Step::Mask(_))).count();
                require!(added < 2, "more than two additive masks");
                require!(g.elem_type(value) == Some(elem), "the mask {value} is not of q's type");
                masks.push((step.clone(), viewed));
            }
            Step::Where { .. } if softcap.is_none() => masks.push((step.clone(), viewed)),
            Step::Where { .. } => decline!("a Where after a soft-cap: Attention caps the scores it masks"),
            Step::Megatron { .. } => decline!("Megatron's mask (s·m − penalty·(1 − m)) is no mask Attention takes"),
            Step::NanGuard => nan_guard = true,
            Step::Softcap(op, by, cap) => {
                // tanh(s / cap) · cap, before any mask (proved when matched).
                let (by, cap) = (by.scalar().unwrap_or(f64::NAN), cap.scalar().unwrap_or(f64::NAN));
                require!(*op == "Div" && by == cap, "the soft-cap multiplies by 1/cap");
                require!((cap as f32).is_normal() && cap > 0.0, "the soft-cap {cap} is no positive f32");
                softcap = Some(cap);
            }
            step => decline!("{}", step.not_in_attention()),
        }
    }
    // One-value scales of q or of the transposed key (SDPA exports scale
    // each by √scale; DistilBERT divides q by √d; ESM scales q twice) are
    // a scale of the scores: in f32, where Attention computes as the core does (an f16
    // product that the core rounds, or overflows, before its MatMul is
    // not handed over).
    let ((q, cq, _), (unscaled_k, ck, computed)) = match elem {
        FLOAT => (scaled_by_one_values(g, shapes, q, elem), scaled_by_one_values(g, shapes, k, elem)),
        _ => ((q, 1.0, false), (k, 1.0, false)),
    };
    scale *= cq * ck;
    // ONNX Runtime refuses an Attention whose scale is not positive.
    require!(
        scale.is_finite() && (scale as f32).is_normal() && scale > 0.0,
        "the scale {scale} is no positive normal f32"
    );
    let key_scaled_at_run_time = ck != 1.0 && computed;
    let views = folding(g, shapes, views, &mut masks)?;
    Ok(Call { elem, q, k: unscaled_k, key_scaled_at_run_time, scale, masks, nan_guard, softcap, views })
}

/// The scores' Reshapes `views` where the first folds the heads into the
/// batch: it reads 3-D scores `[b·h, s, t]` and writes them 4-D (BART's
/// and BLOOM's eager attention). Any other views are a pair that gives the
/// scores back as they were (`reshapes_give_back_shapes`, a softmax over
/// the last axis they keep): the kernel reads past them where each mask
/// added between the two is added alike to the scores themselves (it
/// varies along the last axis alone), and the masks then read the scores
/// (`masks`' counts of views before them become 0).
fn folding(g: &Graph, shapes: &Shapes, views: &[usize], masks: &mut [(Step, usize)]) -> Check<Vec<usize>> {
    let Some(&first) = views.first() else { return Ok(Vec::new()) };
    let view = g.node(first);
    if shapes.rank(&view.input[0]) == Some(3) && shapes.rank(&view.output[0]) == Some(4) {
        return Ok(views.to_vec());
    }
    require!(views.len() == 2, "a Reshape of the scores that neither folds their heads nor is given back");
    // (A view keeps each row of the last axis whole where it keeps its length.)
    let last = |x: &str| shapes.shape(x).and_then(|s| s.last().cloned());
    let rows_kept = last(&view.input[0]).is_some_and(|t| last(&view.output[0]) == Some(t));
    let along_the_last_axis = |step: &Step| match step {
        Step::Mask(m) => shapes.shape(m).is_some_and(|s| s.iter().rev().skip(1).all(|d| d.value() == Some(1))),
        _ => false,
    };
    let alike = masks.iter().all(|(step, viewed)| *viewed != 1 || (rows_kept && along_the_last_axis(step)));
    require!(alike, "a mask added to a view of the scores varies along more than their last axis");
    masks.iter_mut().for_each(|(_, viewed)| *viewed = 0);
    Ok(Vec::new())
}

/// The ONNX `Attention` of the `ort` target for a matched core, guarded
/// where ONNX Runtime's kernel's result could differ; `anchor` is the
/// final MatMul, q, k, v its core's. In four stages: what the kernel reads
/// in place of q, k and v (`operands`), the guard's condition that none
/// of them is empty (`nonempty`), the mask the kernel reads with the
/// guard's conditions that it computes as the core's masks do
/// (`attention_mask`), and the call, guarded, over pieces of a long call's
/// queries, with rows hidden whole lifted where the guard fails.
#[allow(clippy::too_many_arguments)]
pub(super) fn ort(
    g: &Graph,
    shapes: &Shapes,
    anchor: usize,
    [q, k, v]: [&str; 3],
    form: &Scores,
    steps: &[Step],
    views: &[usize],
    merge: Merge,
) -> Check<Rewrite> {
    g.require_opset(23, "Attention")?;
    let call = read(g, shapes, g.node(anchor), [q, k], form, steps, views, ORT_ELEMS)?;
    // Heads folded into the batch (BART's and BLOOM's eager attention):
    // the masks are added to the scores' 4-D view, the first Reshape's,
    // or before it to the folded scores (BLOOM's ALiBi, `in_the_view`).
    let views = call.views.as_slice();
    require!(views.len() <= 2, "{} Reshapes of the scores and probabilities", views.len());
    let at = |s: fn(&Step) -> bool| steps.iter().position(s);
    let first_view = at(|s| matches!(s, Step::Reshape { .. }));
    require!(
        views.is_empty() || first_view < at(|s| matches!(s, Step::Softmax)),
        "a Reshape of the probabilities alone"
    );
    let in_view = |viewed: usize| views.is_empty() || viewed == 1;
    let mut before_view: Vec<usize> = Vec::new();
    for (i, (mask, viewed)) in call.masks.iter().enumerate() {
        if !in_view(*viewed) {
            require!(matches!(mask, Step::Mask(_)), "a Where of the scores outside their 4-D view");
            require!(*viewed == 0, "a mask added to the scores after their 4-D view");
            before_view.push(i);
        }
    }
    let mut masks: Vec<Step> = call.masks.into_iter().map(|(m, _)| m).collect();
    let (elem, scale, nan_guard) = (call.elem, call.scale, call.nan_guard);
    let ops = operands(g, shapes, (anchor, merge), [call.q, call.k, v], call.key_scaled_at_run_time, views, &SPEED)?;

    let a = &g.node(ops.anchor).output[0];
    let (mut prelude, mut then) = (Nodes::new(format!("{a}/")), Nodes::new(format!("{a}/")));
    // A mask added to the folded scores before their view is read in it.
    let mut viewed_shapes: HashMap<String, Vec<Dim>> = HashMap::new();
    for &i in &before_view {
        let Step::Mask(m) = &masks[i] else { continue };
        if let Some((x, shape)) = in_the_view(shapes, m, &ops.sq, &mut prelude)? {
            masks[i] = Step::Mask(x.clone());
            viewed_shapes.insert(x, shape);
        }
    }
    let shape_of = |x: &str| viewed_shapes.get(x).cloned().or_else(|| shapes.shape(x));
    let mut conditions: Vec<String> = nonempty(shapes, &ops, &mut prelude).into_iter().collect();

    let kernel_key = match &ops.key_perm {
        Some(key_perm) => then.op("key", "Transpose", &[ops.key], vec![AttributeProto::ints("perm", key_perm)]),
        None => ops.key.to_string(),
    };
    let mut inputs = vec![ops.q.clone(), kernel_key, ops.value.to_string()];
    // What the match passes through on the way to what the kernel reads
    // stays where something else reads it too (GPT-2's present key reads
    // the key's heads): first where a node besides a `Shape` does (what a
    // `Shape` reads is computed anew, `rewrite::shapes_read_outside`),
    // then, where that fails, where any node does (`Kept`: the driver
    // decides by readers).
    let shared: Vec<String> = [q, k, v]
        .iter()
        .zip([ops.q.as_str(), ops.key, ops.value])
        .flat_map(|(from, to)| between(g, from, to))
        .collect();
    let lifted = if masks.is_empty() {
        None
    } else {
        let nodes = [&mut prelude, &mut then];
        let (mask, lifted) =
            attention_mask(g, shapes, &ops, (elem, scale, nan_guard), &masks, &shape_of, nodes, &mut conditions)?;
        inputs.push(mask);
        lifted
    };
    let mut attributes = vec![AttributeProto::float("scale", scale as f32)];
    if let Some(heads) = ops.merged {
        attributes.extend([int("q_num_heads", heads), int("kv_num_heads", heads)]);
    }
    attributes.extend(call.softcap.map(|cap| AttributeProto::float("softcap", cap as f32)));
    if nan_guard {
        // Where the kernel's result holds a NaN, the original's NaN rows
        // became zeros: the original ops run.
        let y = then.op("attention", "Attention", &refs(&inputs), attributes);
        let sum = then.op("sum", "ReduceSum", &[&y], vec![int("keepdims", 0)]);
        let bad = then.op("has_nan", "IsNaN", &[&sum], vec![]);
        let kept = branch("the kernel's result", vec![writing(a, node("Identity", &[&y], vec![]))], a, elem);
        then.list.push(writing(a, guard(&bad, original_ops(), kept)));
    } else {
        then.list.push(writing(a, node("Attention", &refs(&inputs), attributes)));
    }
    let whole = branch("ONNX Attention", then.list, a, elem);
    // A long call's pieces read only the keys they see where the mask
    // hides the rest: a float mask by its lowest or -inf, a Where's kept
    // keys by false.
    let hiding = match masks.as_slice() {
        [] => None,
        [Step::Where { .. }] => Some(Hiding::NotKept),
        _ => Some(Hiding::Lowest),
    };
    let (of, at) = shapes.input_axis(&ops.sq[2]).unwrap_or((&ops.q, ops.query_axis()));
    let length = query_length(&ops.sq[2], of, at, &mut prelude);
    // The 3-D value's last axis, named to ONNX's shape inference where a
    // piece cuts its keys (`keys_seen`).
    let width = ops.merged.and_then(|_| shapes.shape(ops.value)?.last()?.value());
    let pieces = over_query_pieces(&whole, hiding, width);
    let kernel = match length {
        Length::Long => pieces.clone(),
        _ => whole.clone(),
    };
    // The guard's condition: every condition at once.
    let ok = conditions.split_first().map(|(first, rest)| {
        let mut ok = first.clone();
        for (i, next) in rest.iter().enumerate() {
            let both = if i + 1 == rest.len() { "ok".to_string() } else { format!("ok_{i}") };
            ok = prelude.op(&both, "And", &[&ok, next], vec![]);
        }
        ok
    });
    // Where the guard fails: the kernel with the rows hidden whole lifted,
    // over pieces of a long call (its mask a float mask, a Where's kept
    // keys made one), or the original ops. Where the length is known only
    // at run time, a long call runs the lifted pieces where the guard
    // holds too (`held`), so that it needs no third `If`.
    let lifted_branch = |in_pieces: bool, held: Option<&str>| match &lifted {
        Some(lifted) => {
            let kernel = if in_pieces { over_query_pieces(&whole, Some(Hiding::Lowest), width) } else { whole.clone() };
            hidden_rows_lifted(lifted.clone(), &conditions, &kernel, held, a)
        }
        None => original_ops(),
    };
    let otherwise = lifted_branch(matches!(length, Length::Long), None);
    let long_lifted = match (&length, &ok) {
        (Length::Either(_), Some(ok)) if lifted.is_some() => Some(lifted_branch(true, Some(ok))),
        _ => None,
    };
    let (anchor, n) = (ops.anchor, ops.n);
    let replacement = match (ok, &length) {
        (None, Length::Either(long)) => guard(long, pieces, kernel),
        // No guard at all: the kernel runs whole.
        (None, _) if !nan_guard => {
            let mut nodes = whole.node;
            let attention = nodes.pop().expect("the kernel");
            prelude.list.extend(nodes);
            let prelude = prelude.list;
            return Ok(replace(anchor, attention, shared, |r| grouped(r.after(prelude.clone()).needing_opset(23), n)));
        }
        (None, _) => {
            // Only the NaN guard: the kernel runs before it, unguarded.
            let mut nodes = kernel.node;
            let nan_guard = nodes.pop().expect("the NaN guard");
            prelude.list.extend(nodes);
            nan_guard
        }
        (Some(ok), _) => by_length(&ok, [kernel, pieces], (otherwise, long_lifted), &length, a, &mut prelude),
    };
    let prelude = prelude.list;
    Ok(replace(anchor, replacement, shared, |r| {
        grouped(r.after(prelude.clone()).running("Attention").needing_opset(23), n)
    }))
}

/// What ONNX Runtime's kernel reads in place of a core's q, k and v
/// (`operands`), and where it writes.
struct Operands<'a> {
    /// q `[b, h, s, d]`, or in the 3-D form the `[b, s, h·d]` value its
    /// heads are split from.
    q: String,
    /// The key: `[b, h/n, t, d]` once transposed by `key_perm` (where the
    /// core's Transpose moves other axes too), or merged as q.
    key: &'a str,
    key_perm: Option<Vec<i64>>,
    /// The value, `[b, h/n, t, dv]` or merged.
    value: &'a str,
    /// The node whose output the kernel writes.
    anchor: usize,
    /// Query heads per key and value head.
    n: i64,
    /// The heads, where the kernel reads and writes them merged (the 3-D form).
    merged: Option<i64>,
    /// q's, the key's and the value's shapes, `[b, h, s, d]` each.
    sq: Vec<Dim>,
    sk: Vec<Dim>,
    sv: Vec<Dim>,
    /// The scores' rank: 3 where the core's heads are folded into its
    /// batch and never split (one head of the kernel's 3-D form), else 4.
    rank: usize,
}

impl Operands<'_> {
    /// q's axis of the queries: 2 of `[b, h, s, d]`, 1 of `[b, s, h·d]`.
    fn query_axis(&self) -> i64 {
        if self.merged.is_some() {
            1
        } else {
            2
        }
    }
}

/// What the kernel reads in place of q, the transposed key `k` (as `read`
/// gives them) and v, for either target (`row`: its runtime's measured
/// facts), proved on shapes to be `[b, h, s, d]`, `[b, h/n, t, d]` and
/// `[b, h/n, t, dv]`. `k = Transpose(x, perm)`, the key `[b, h, d, t]`:
/// Attention reads `[b, h, t, d]`, x itself where the perm only swaps the
/// last two axes. With the heads folded into the batch (a view of the
/// scores, `views`), q, the key and the value are `[b·h, s, d]` merged from
/// `[b, h, s, d]` heads, which the kernel reads, and the 3-D output is
/// split back into them; else a 3-D core is one head of the kernel's 3-D
/// form (`[b, 1, s, d]` in the shapes), where the row takes it. A key and value
/// repeated n times per head in place are grouped heads. `merge`: the
/// Reshapes past the product the rule is at.
#[allow(clippy::too_many_arguments)]
fn operands<'a>(
    g: &Graph<'a>,
    shapes: &Shapes,
    (anchor, merge): (usize, Merge),
    [q, k, v]: [&'a str; 3],
    key_scaled_at_run_time: bool,
    views: &[usize],
    row: &Speed,
) -> Check<Operands<'a>> {
    let q = q.to_string();
    let folded = views.first().map(|&view| &g.node(view).output[0]);
    // (Folded heads with a view of the scores are split where the row
    // does not take the 3-D core as it is.)
    if shapes.rank(&q) == Some(3) && (folded.is_none() || row.batch_heads) {
        require!(
            row.batch_heads,
            "heads folded into the batch and never split ([b·h, s, d]): {} is no faster than the MatMuls it \
             replaces here",
            row.runtime
        );
        let (key, key_perm) = key_before_transpose(g, k, 3)?;
        let [sq, sx, sv] = shapes_of(shapes, [&q, key, v], 3)?;
        let one = |s: Vec<Dim>| [&s[..1], &[Dim::known(1)], &s[1..]].concat();
        let [sq, sk, sv] = [sq, permuted(&sx, key_perm.as_deref()), sv].map(one);
        proved_heads(&sq, &sk, &sv, 1)?;
        return Ok(Operands { q, key, key_perm, value: v, anchor, n: 1, merged: Some(1), sq, sk, sv, rank: 3 });
    }
    let (q, x, key_perm, v, anchor, repeats) = match folded {
        None => match folded_key(g, shapes, k) {
            Some((x, n)) => (q, x, None, v, anchor, n),
            None => {
                let (x, key_perm) = key_before_transpose(g, k, 4)?;
                (q, x, key_perm, v, anchor, None)
            }
        },
        Some(_) => {
            let (x3, key_perm) = key_before_transpose(g, k, 3)?;
            require!(key_perm.is_none(), "the 3-D key's Transpose does not swap its last two axes");
            let unfolded = |x: &str| {
                merged_batch(g, shapes, x).or_decline(|| format!("{x} is not proved to merge [b, h] heads into b·h"))
            };
            let (q, x) = (unfolded(&q)?.to_string(), unfolded(x3)?);
            let (v, anchor) = match (views.len(), shapes.rank(v)) {
                // The probabilities are viewed back: the output splits b·h.
                (2, _) => {
                    let split = split_batch(g, shapes, anchor, merge.split);
                    (unfolded(v)?, split.or_decline(|| "the 3-D output is not split into [b, h] heads alone".into())?)
                }
                // One view (BLOOM via dynamo): the probabilities stay 4-D.
                (_, Some(4)) => (v, anchor),
                _ => decline!("the probabilities' view does not meet a 4-D value"),
            };
            (q, x, None, v, anchor, None)
        }
    };
    let (key, n) = match repeats {
        Some(n) => (x, n),
        None if key_perm.is_none() => repeated(g, shapes, x, 4).unwrap_or((x, 1)),
        None => (x, 1),
    };
    let (value, n_v) = repeated(g, shapes, v, 4).unwrap_or((v, 1));
    // One key and value head that the products broadcast over q's h heads
    // (multi-query attention: Falcon): grouped heads, each query head
    // reading KV head 0 = h / h, as ONNX's Attention reads them; written
    // where the runtime's kernel gains on them (`runtimes.rs`).
    let one_head = |x: &str, perm: Option<&[i64]>| {
        let heads =
            shapes.shape(x).filter(|s| s.len() == 4).and_then(|s| s.get(perm.map_or(1, |p| p[1] as usize))?.value());
        heads == Some(1)
    };
    let h = shapes.shape(&q).filter(|s| s.len() == 4).and_then(|s| s[1].value()).filter(|&h| h > 1);
    let (n, n_v) = match h {
        Some(h)
            if folded.is_none()
                && n == 1
                && n_v == 1
                && one_head(key, key_perm.as_deref())
                && one_head(value, None) =>
        {
            require!(
                row.broadcast_heads,
                "one key and value head that the products broadcast over q's {h} heads (multi-query attention): {} is \
                 slower than the MatMuls it replaces here",
                row.runtime
            );
            (h, h)
        }
        _ => (n, n_v),
    };
    require!(n == n_v, "the key's heads are repeated {n} times and the value's {n_v} times");
    // Where the kernel gains (`runtimes.rs`, the runtime's measured
    // facts): a key and value repeated for grouped heads (copied n times),
    // or read from a cache whose transposed key the export scales by a
    // value it computes at run time, or a cache otherwise where the
    // runtime's row says so; a core without either (an encoder's) where
    // the kernel reads and writes the heads merged, `[b, s, h·d]`, as the
    // model computes them (no Transpose of q, k, v or the output is left),
    // or on 4-D heads where the runtime's row says so.
    let merged = if n > 1 || (kept_whole(g, key) && kept_whole(g, value)) {
        require!(
            n > 1 || key_scaled_at_run_time || row.plain_cache,
            "a cache without grouped heads whose key the export only transposes, or scales by a constant (ONNX \
             Runtime folds both into its MatMul): {} is slower than the MatMuls it replaces here",
            row.runtime
        );
        None
    } else {
        match merged_heads(g, shapes, (anchor, merge.merge), &q, x, key_perm.as_deref(), v) {
            Ok(merged) => Some(merged),
            Err(_) if row.four_d_heads => None,
            Err(miss) => {
                let why = match miss {
                    Miss::Declined(why) => why,
                    Miss::NotCandidate => String::new(),
                };
                decline!(
                    "neither a KV cache nor grouped heads (no Concat(past, new) on axis 2 or graph input read whole, \
                     no heads proved repeated), and {why}: {} on 4-D heads is slower than the MatMuls it \
                     replaces here",
                    row.runtime
                )
            }
        }
    };

    let [sq, sx, sv] = shapes_of(shapes, [&q, key, value], 4)?;
    let sk = permuted(&sx, key_perm.as_deref());
    proved_heads(&sq, &sk, &sv, n)?;
    if let Some(view) = folded {
        let scores = [sq[0].clone(), sq[1].clone(), sq[2].clone(), sk[2].clone()];
        let shape = shapes.shape(view).unwrap_or_default();
        require!(shape == scores, "the scores' view ({}) is not [b, h, s, t] of q and the key", dims(&shape));
    }

    // The 3-D form reads the merged values and writes the merged output
    // (the key's Transpose taken into its split).
    let (anchor, q, key, key_perm, value, merged) = match merged {
        Some(m) => (m.anchor, m.q.to_string(), m.key, None, m.value, Some(m.heads)),
        None => (anchor, q, key, key_perm, value, None),
    };
    Ok(Operands { q, key, key_perm, value, anchor, n, merged, sq, sk, sv, rank: 4 })
}

/// The shapes of q, the key (before its transpose) and the value, each
/// proved of `rank` axes.
fn shapes_of(shapes: &Shapes, values: [&str; 3], rank: usize) -> Check<[Vec<Dim>; 3]> {
    let [Some(sq), Some(sx), Some(sv)] = values.map(|x| shapes.shape(x)) else {
        decline!("the shapes of q, the key and the value are not proved");
    };
    require!(sq.len() == rank && sx.len() == rank && sv.len() == rank, "q, the key and the value are not all {rank}-D");
    Ok([sq, sx, sv])
}

/// `shape` permuted by `perm`, where there is one.
fn permuted(shape: &[Dim], perm: Option<&[i64]>) -> Vec<Dim> {
    match perm {
        Some(p) => p.iter().filter_map(|&p| shape.get(usize::try_from(p).ok()?).cloned()).collect(),
        None => shape.to_vec(),
    }
}

/// That q, the key and the value are `[b, h, s, d]`, `[b, h/n, t, d]` and
/// `[b, h/n, t, dv]` (the kernel broadcasts nothing but grouped heads).
fn proved_heads(sq: &[Dim], sk: &[Dim], sv: &[Dim], n: i64) -> Check<()> {
    require!(sk.len() == 4, "the key's Transpose does not keep its rank");
    require!(
        sq[0] == sk[0] && sk[0] == sv[0],
        "the batch of q, key and v is not proved equal ({}, {}, {})",
        sq[0],
        sk[0],
        sv[0]
    );
    let heads = sk[1].mul(&Dim::known(n));
    require!(
        Some(&sq[1]) == heads.as_ref() && sk[1] == sv[1],
        "the heads of q, key and v ({}, {}, {}) are not proved h, h/{n} and h/{n}",
        sq[1],
        sk[1],
        sv[1]
    );
    require!(
        sk[2] == sv[2],
        "q, the key and the value are not proved to be [b, h, s, d], [b, h/{n}, t, d], [b, h/{n}, t, dv] ({}, {}, {})",
        dims(sq),
        dims(sk),
        dims(sv)
    );
    require!(sq[3] == sk[3], "q's and the key's head sizes are not proved equal ({}, {})", sq[3], sk[3]);
    Ok(())
}

/// The guard's condition that the kernel reads no empty batch, query, key
/// or head (ONNX Runtime's kernel refuses one, where the core gives an
/// empty or zero result), pushed to `prelude` where the shapes do not
/// prove it: q's size covers b, s and d; the key's where its heads or
/// length may be 0 (a cache's length past + s is not where s is not); the
/// value's where its head may be.
fn nonempty(shapes: &Shapes, ops: &Operands, prelude: &mut Nodes) -> Option<String> {
    let Operands { q, key, value, sq, sk, sv, .. } = ops;
    let positive = |d: &Dim| d.value().is_some_and(|n| n > 0);
    let q_checked = !sq.iter().all(positive);
    let t_follows = sk[2].sub(&sq[2]).is_some_and(|extra| extra.is_size()) && (q_checked || positive(&sq[2]));
    let checks = [
        (q.as_str(), q_checked),
        (*key, !(positive(&sk[1]) && (positive(&sk[2]) || t_follows))),
        (*value, !positive(&sv[3])),
    ];
    let empty: Vec<&str> = checks.into_iter().filter(|(_, needed)| *needed).map(|(x, _)| x).collect();
    if empty.is_empty() {
        return None;
    }
    // (Named by the value, or by its place where two values end alike:
    // T5's q/MatMul_output_0 and k/MatMul_output_0.)
    let alike = |x: &str| empty.iter().filter(|y| short(y) == short(x)).count() > 1;
    let sizes: Vec<String> = empty
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let what = if alike(x) { format!("size_{i}_{}", short(x)) } else { format!("size_{}", short(x)) };
            // Read where every layer's guard reads it (`input_as_empty_as`).
            let dims = shapes.shape(x).unwrap_or_default();
            prelude.op(&what, "Size", &[shapes.input_as_empty_as(&dims).unwrap_or(x)], vec![])
        })
        .collect();
    let fewest = match &sizes[..] {
        [one] => one.clone(),
        _ => prelude.op("fewest", "Min", &refs(&sizes), vec![]),
    };
    let zero = prelude.scalar("zero", INT64, 0.0);
    Some(prelude.op("nonempty", "Greater", &[&fewest, &zero], vec![]))
}

/// The mask the kernel reads for the core's mask steps `masks` (none
/// empty), as `Attention`'s `attn_mask` of the scores' shape, with the
/// guard's conditions that the kernel computes the core with it (pushed to
/// `conditions`; the nodes before the guard to `prelude`, those of the
/// kernel's branch to `then`): the additive mask, or a Where's condition
/// (handed over as Attention's boolean mask, the keys kept), or, for a
/// Where with an additive mask (GPT-2) or several Wheres, the masks
/// applied to a score of 0 (`replayed_mask`). Also the rows the guard may
/// lift where a row hides every key (`hidden_rows_lifted`). `call`: the
/// core's element type, scale and NaN guard; `shape_of`: the masks'
/// shapes, as the scores' view reads them.
#[allow(clippy::too_many_arguments)]
fn attention_mask(
    g: &Graph,
    shapes: &Shapes,
    ops: &Operands,
    (elem, scale, nan_guard): (i32, f64, bool),
    masks: &[Step],
    shape_of: &dyn Fn(&str) -> Option<Vec<Dim>>,
    [prelude, then]: [&mut Nodes; 2],
    conditions: &mut Vec<String>,
) -> Check<(String, Option<Lifted>)> {
    let Operands { q, key, key_perm, merged, sq, sk, .. } = ops;
    let mask = masks.iter().find_map(|m| match m {
        Step::Mask(value) => Some(value.as_str()),
        _ => None,
    });
    let kept = match masks {
        [Step::Where { keep, fill, fill_first }] => {
            Some((keep.as_str(), fill.scalar().unwrap_or(f64::NAN), *fill_first))
        }
        _ => None,
    };
    let mut lifted: Option<Lifted> = None;
    // The scores' bound: |scale · q·k| ≤ scale · d · max|q| · max|k|.
    let d = sq[3].value().filter(|&d| d > 0);
    let score_bound = |nodes: &mut Nodes, what: &str| -> Check<String> {
        let d = d.or_decline(|| {
            format!("the head size {} is no known number: the bound on the scores {what} needs", sq[3])
        })?;
        let (mq, mk) = (largest(q, "q", nodes), largest(key, "key", nodes));
        let product = nodes.op("largest_qk", "Mul", &[&mq, &mk], vec![]);
        let per = nodes.scalar("scale_times_d", elem, scale * d as f64);
        Ok(nodes.op("score_bound", "Mul", &[&product, &per], vec![]))
    };
    let (mask, sm) = if masks.len() > 1 {
        let (mask, sm, rows) = replayed_mask(shape_of, masks, prelude, conditions, &score_bound)?;
        lifted = rows;
        (mask, sm)
    } else {
        let source = mask.or(kept.map(|(condition, _, _)| condition));
        let source = source.or_decline(|| "no mask among the mask steps".to_string())?;
        let sm = shape_of(source).or_decline(|| format!("the shape of the mask {source} is not proved"))?;
        let mask = match kept {
            None => {
                let visible = visible_rows(g, shapes, source, nan_guard, prelude, conditions)?;
                // Where a row hides every key, the kernel may still run
                // with that row lifted (`hidden_rows_lifted`): the bound
                // on the scores is computed there, where it is needed.
                if let Some(visible) = visible {
                    let mut nodes = Nodes::new(prelude.name(""));
                    if let Ok(bound) = score_bound(&mut nodes, "rows hidden whole") {
                        let (mask, nodes) = (source.to_string(), nodes.list);
                        lifted = Some(Lifted { mask, visible, nodes, bound, rows: Rows::Visible });
                    }
                }
                source.to_string()
            }
            Some((condition, fill, hides)) => {
                let keep = if hides { prelude.op("kept", "Not", &[condition], vec![]) } else { condition.to_string() };
                // A row that keeps no key: the kernel gives zeros, the
                // core the mean of v (a finite fill) or NaN (-inf).
                let every_row = g.constant(condition).is_some_and(|t| every_row_keeps(t, hides));
                let mut visible = None;
                if !every_row {
                    let axes = prelude.ints("last_axis", &[-1]);
                    let flags = prelude.op("kept_flags", "Cast", &[&keep], vec![int("to", i64::from(elem))]);
                    let names = ["row_kept", "least_row_kept", "no", "kept_rows"];
                    let kept_rows = rows_above(&flags, &axes, 0.0, names, prelude);
                    conditions.push(kept_rows.clone());
                    visible = Some((kept_rows, flags));
                }
                // The core replaces a hidden score by the fill, the kernel
                // drops it: the same where every kept score is more than 128
                // above the fill (its weight is then exp(< -128), which f32
                // has as 0, in both), the bound held to half the distance
                // (the rounding of the scores).
                let room = (fill.abs().min(f64::from(f32::MAX)) - 128.0) / 2.0;
                require!(room > 0.0, "the Where fill {fill} leaves the scores no room");
                let bound = score_bound(prelude, "a Where mask")?;
                let limit = prelude.scalar("score_room", elem, room);
                conditions.push(prelude.op("scores_bounded", "Less", &[&bound, &limit], vec![]));
                // A row that keeps no key is the fill throughout, whose
                // softmax (a finite fill) is even: lifted.
                if let Some((visible, flags)) = visible.filter(|_| fill.is_finite()) {
                    let rows = Rows::Kept { flags, zero: prelude.name("no") };
                    lifted = Some(Lifted { mask: keep.clone(), visible, nodes: Vec::new(), bound, rows });
                }
                keep
            }
        };
        (mask, sm)
    };
    // An encoder's masks replayed over every head's scores (DeBERTa's
    // relative terms, MPNet's position bias, with a padding mask): the
    // guard reads that score-sized mask some ten times, which costs
    // what the kernel saves on some runtimes (`runtimes.rs`).
    let per_head = sm.len() == 4 && sm[1].value() != Some(1);
    require!(
        SPEED.replayed_masks || !(merged.is_some() && masks.len() > 1 && per_head),
        "an encoder's masks replayed over every head's scores ({}): the guard costs what the kernel saves",
        dims(&sm)
    );
    let (r, (s, t)) = (sm.len(), (&sq[2], &sk[2]));
    // A cache's mask whose last axis is not proved the key's length
    // (GPT-J's causal mask, sized by the attention mask and sliced at
    // the key's length): the two are compared at run time, and the
    // original ops run where they differ.
    let length_unproved = merged.is_none() && r >= 2 && &sm[r - 1] != t && sm[r - 1].value().is_none();
    require!(
        (2..=4).contains(&r)
            && (&sm[r - 1] == t || length_unproved)
            && (&sm[r - 2] == s || sm[r - 2].value() == Some(1)),
        "the mask's shape ({}) does not end with the scores' ({s}, {t}) or (1, {t})",
        dims(&sm)
    );
    if length_unproved {
        let at = key_perm.as_ref().map_or(2, |p| p[2]);
        let length = prelude.op("mask_length", "Shape", &[&mask], vec![int("start", r as i64 - 1)]);
        let keys = prelude.op("key_length", "Shape", &[key], vec![int("start", at), int("end", at + 1)]);
        conditions.push(prelude.op("mask_length_is_keys", "Equal", &[&length, &keys], vec![]));
    }
    require!(leading_fit(&sm, ops), "the mask's leading axes ({}) are not 1, the batch or the heads", dims(&sm));
    if &sm[r - 2] == s {
        return Ok((mask, lifted));
    }
    // Attention takes a mask of the scores' query axis: the one row
    // broadcast over the queries.
    let at = ops.query_axis();
    let rows = then.op("queries", "Shape", &[q], vec![int("start", at), int("end", at + 1)]);
    let ones = then.ints("ones", &vec![1; r - 2]);
    let one = then.ints("one", &[1]);
    let shape = then.op("mask_shape", "Concat", &[&ones, &rows, &one], vec![int("axis", 0)]);
    Ok((then.op("mask", "Expand", &[&mask, &shape], vec![]), lifted))
}

/// The ONNX `Attention` of `--target portable` (from opset 23), which
/// computes `softmax(scale · Q·Kᵀ) · V` from the key *before* its
/// transpose: a core read as for ONNX Runtime (`read`; f16 and f64 too),
/// where it needs no guard, since no other runtime's kernel facts are
/// known. A 3-D core is one head; one key/value head is broadcast.
///
/// Written for the unmasked core, and for a core whose one additive mask
/// is a constant of finite values above its type's lowest, added after the
/// scale: `Attention` adds it the same way. Any other mask is not handed
/// over, because runtimes disagree on a row whose keys are all masked: the
/// original averages the values (a finite fill) or gives NaN (-inf), ONNX
/// Runtime's `Attention` writes zeros for a row of float lowest or -inf,
/// OpenVINO averages, the spec's errata zeroes it (measured:
/// docs/targets.md).
pub(super) fn portable(
    g: &Graph,
    shapes: &Shapes,
    mut m: Match,
    [q, k, v]: [&str; 3],
    form: &Scores,
    steps: &[Step],
    views: &[usize],
) -> Check<Rewrite> {
    let anchor = m.anchor();
    let Call { elem, q: call_q, k: call_k, key_scaled_at_run_time, scale, masks, nan_guard, softcap, views } =
        read(g, shapes, g.node(anchor), [q, k], form, steps, views, PORTABLE_ELEMS)?;
    require!(!nan_guard, "a NaN guard: Attention does not zero NaN rows");
    require!(softcap.is_none(), "a soft-cap: not handed to Attention's softcap (not measured to round alike)");
    let mut mask = None;
    for (step, viewed) in &masks {
        let value = match step {
            Step::Mask(value) if mask.is_none() => value,
            Step::Mask(_) => decline!("more than one additive mask"),
            _ => decline!("a masked core (Where): {MASK_FILLS}"),
        };
        require!(*viewed == 0, "the mask is added to reshaped scores");
        mask = Some(handed_over_mask(g, value, elem)?);
    }
    let merge = Merge::default();
    let ops = operands(g, shapes, (anchor, merge), [call_q, call_k, v], key_scaled_at_run_time, &views, &ANY_RUNTIME)?;
    let key = match &ops.key_perm {
        // Attention reads the key before its Transpose, transposed anew
        // where that Transpose also moved other axes.
        Some(perm) => {
            let key = format!("{}/key", g.node(anchor).output[0]);
            m.before([writing(&key, node("Transpose", &[ops.key], vec![AttributeProto::ints("perm", perm)]))]);
            key
        }
        None => ops.key.to_string(),
    };
    // What the match passes through on the way to what Attention reads
    // stays where something else reads it too.
    for (from, to) in [q, k, v].into_iter().zip([ops.q.as_str(), ops.key, ops.value]) {
        between(g, from, to).into_iter().for_each(|value| m.keep(Kept::Shared(value)));
    }
    let mut attributes = vec![AttributeProto::float("scale", scale as f32)];
    if let Some(heads) = ops.merged {
        attributes.extend([int("q_num_heads", heads), int("kv_num_heads", heads)]);
    }
    let mut inputs = vec![ops.q.as_str(), &key, ops.value];
    if let Some((value, dims)) = mask {
        // Attention takes a mask of the scores' last two axes exactly.
        let (sm, (s, t)): (Vec<Dim>, _) = (dims.iter().map(|&d| Dim::known(d)).collect(), (&ops.sq[2], &ops.sk[2]));
        let fits = sm.len() >= 2 && sm[sm.len() - 2..] == [s.clone(), t.clone()] && leading_fit(&sm, &ops);
        require!(
            fits,
            "the mask's shape {dims:?} is not the scores' last two axes ({s}, {t}) with leading axes of 1 or theirs"
        );
        inputs.push(value);
    }
    g.require_portable(PORTABLE)?;
    Ok(grouped(m.replace_with(node("Attention", &inputs, attributes)), ops.n))
}

/// What a kernel reads as the key, `[.., t, d]`, where the scores read
/// `k = Transpose(x, perm)` of rank `rank`: `(x, None)` where the perm
/// swaps only the last two axes; else `(x, Some(p))`, x to be transposed by
/// `p`, the perm with its last two axes swapped back (TorchScript splits
/// the heads and transposes the key in one, `[0, 2, 3, 1]`). A perm that is
/// not a permutation of the rank is no key.
fn key_before_transpose<'a>(g: &Graph<'a>, k: &str, rank: usize) -> Check<(&'a str, Option<Vec<i64>>)> {
    let Ok(transpose) = g.produced_by(g.unchanged(k), "Transpose") else {
        decline!("the key {k} is not a Transpose: Attention reads the key before its transpose")
    };
    let perm = g.node(transpose).attr_ints("perm").unwrap_or_default();
    let mut sorted = perm.to_vec();
    sorted.sort_unstable();
    require!(
        rank >= 2 && sorted.iter().copied().eq(0..rank as i64),
        "the key's Transpose has no permutation of its rank ({rank})"
    );
    let key_perm: Vec<i64> = perm[..rank - 2].iter().copied().chain([perm[rank - 1], perm[rank - 2]]).collect();
    let identity = key_perm.iter().enumerate().all(|(i, &p)| p == i as i64);
    Ok((g.node(transpose).input[0].as_str(), (!identity).then_some(key_perm)))
}

/// `value` as a chain of up to four products `Mul(x, c)` (either order)
/// or `Div(x, c)`, each `c` a constant of one value of type `elem` that
/// raises no rank (SDPA exports scale q and the transposed key each by
/// √scale; DistilBERT divides q by √d; ESM scales q twice): x, the
/// product of the factors (1/c for a Div), and whether a factor is
/// computed at run time (GPT-2's `1/√√d` from the key's shape), which
/// ONNX Runtime cannot fold into its MatMul, as it folds a constant
/// scale. A scale of q or k is a scale of the scores, which Attention
/// takes as `scale`.
fn scaled_by_one_values<'a>(g: &Graph<'a>, shapes: &Shapes, value: &'a str, elem: i32) -> (&'a str, f64, bool) {
    let (mut x, mut by, mut at_run_time) = (value, 1.0, false);
    for _ in 0..4 {
        let Ok(op) = g.produced_by(x, "Mul").or_else(|_| g.produced_by(x, "Div")) else { break };
        let node = g.node(op);
        let divides = node.is("Div");
        let one_value = |i: usize| {
            let c = crate::graph::fold::fold(g, shapes, &node.input[i])?;
            let rank = shapes.rank(&node.input[1 - i]).unwrap_or(0);
            (c.elem == elem && c.dims.len() <= rank.max(1)).then(|| c.scalar()).flatten()
        };
        let sides = if divides { 1..2 } else { 0..2 };
        let Some((at, c)) = sides.into_iter().find_map(|i| Some((i, one_value(i)?))) else { break };
        at_run_time |= g.constant(&node.input[at]).is_none();
        by *= if divides { 1.0 / c } else { c };
        x = node.input[1 - at].as_str();
    }
    (x, by, at_run_time)
}

/// Why a mask that may hold the fills exports write is not handed over.
const MASK_FILLS: &str = "ONNX Runtime's Attention zeroes a row whose mask is all float lowest or -inf (the fills \
                          exports write), where this core averages the values or gives NaN; a mask with another \
                          fill would differ from the core wherever a score passes 2^103";

/// An additive mask Attention computes exactly as the core does: an f32
/// constant whose values are all finite and above f32's lowest (ONNX Runtime's `Attention` zeroes a row of lowest or
/// -inf, where the core averages the values or gives NaN). Returns it and
/// its shape.
fn handed_over_mask<'a>(g: &Graph<'a>, value: &'a str, elem: i32) -> Check<(&'a str, Vec<i64>)> {
    let Some(t) = g.constant(value) else {
        decline!("a masked core: its mask is computed at run time; {MASK_FILLS}");
    };
    // In f16 ONNX Runtime's Attention adds and normalizes in f32 where the
    // core rounds every step to f16: a fully masked row of -1e4 comes out
    // uniform from one and not the other (measured). f64 is unmeasured.
    require!(elem == FLOAT, "a constant mask is handed over on f32 scores only (these are {})", type_text(Some(elem)));
    let lowest = f64::from(f32::MIN);
    let values = t.values().or_decline(|| "the mask's values cannot be read".into())?;
    require!(
        values.iter().all(|v| v.is_finite() && *v > lowest),
        "the mask holds -inf, NaN or its type's lowest: ONNX Runtime's Attention zeroes a row of them"
    );
    Ok((value, t.dims.clone()))
}

/// The report says where query heads share a key and value head: a
/// runtime may not run that (`passes::GROUPED_HEADS`).
fn grouped(rewrite: Rewrite, n: i64) -> Rewrite {
    if n > 1 {
        rewrite.noting(format!("{} {n} query heads per key and value head", crate::passes::GROUPED_HEADS))
    } else {
        rewrite
    }
}

/// The kernel's rewrite, each finished by `finish`: the values `shared`
/// that the match passes through kept where a node besides a `Shape` reads
/// them elsewhere, or where the driver's checks refuse that, where any
/// node does.
fn replace(anchor: usize, replacement: NodeProto, shared: Vec<String>, finish: impl Fn(Rewrite) -> Rewrite) -> Rewrite {
    let rewrite = |kept: fn(String) -> Kept| {
        let mut m = Match::new(anchor);
        for value in &shared {
            m.keep(kept(value.clone()));
        }
        finish(m.replace_with(NodeProto { output: vec![], ..replacement.clone() }))
    };
    rewrite(Kept::BesidesShapes).or(rewrite(Kept::Shared))
}

/// The values from a core's input `from` back to `to`, what the kernel
/// reads in its place, through the ops the kernel's form looks through
/// (head splits and merges, transposes, repeats, scales); none where `to`
/// is not reached.
fn between(g: &Graph, from: &str, to: &str) -> Vec<String> {
    fn walk(g: &Graph, at: &str, to: &str, depth: usize, path: &mut Vec<String>) -> bool {
        if at == to {
            return true;
        }
        let Some(p) = g.producer(at).filter(|_| depth > 0) else { return false };
        let node = g.node(p);
        // ONNX's ops only (another domain's may take any inputs).
        let data = match node.op_type() {
            _ if !crate::onnx::is_default_domain(node.domain()) => return false,
            "Mul" | "Div" => &node.input[..],
            "Reshape" | "Transpose" | "Expand" | "Tile" | "Unsqueeze" | "Squeeze" | "Identity" => {
                node.input.get(..1).unwrap_or_default()
            }
            _ => return false,
        };
        path.push(at.to_string());
        if data.iter().any(|input| walk(g, input, to, depth - 1, path)) {
            return true;
        }
        path.pop();
        false
    }
    let mut path = Vec::new();
    walk(g, from, to, 12, &mut path);
    path
}

/// A Where with an additive mask (GPT-2's causal `Where` and its padding
/// mask), several Wheres, or two additive masks (MPNet's relative position
/// bias and padding mask), as one float mask: `M`, the mask steps applied
/// to a score of 0, and its shape. A key every Where keeps, and where of
/// two additive masks one is 0, has `M = 0 + m = m` (adding 0 is exact),
/// so the kernel's `s + M` is the core's `s + m`: such a key is kept. At a
/// hidden key `M` is the value the core puts in place of its score (the
/// fill, plus m where the Add comes after), or the sum of the two masks
/// the core adds to it one at a time, and the kernel computes `s + M`
/// there. The two agree where no hidden key gets weight in either: in every row the
/// largest `M` of a kept key, R, is more than 2B + 128 above the largest of
/// a hidden one, H (B the bound on the scores), so every hidden value, H or
/// s + H, is more than 128 below the row's largest kept score, s + R, and
/// its `exp` is 0 in f32 in both; with room for the rounding of values near
/// f32's largest (2^-20 of |R| + |H|) and the bound doubled. The same test
/// fails where a row keeps no key, or only keys whose M is the lowest (the
/// kernel's zeros there), and where R is NaN or infinite; an H of -inf
/// counts as the lowest. With one additive mask at most, such rows may be
/// lifted (`hidden_rows_lifted`): in a row whose largest M is the lowest,
/// a key some Where replaced has the core's value M itself (the same steps
/// from the same fill), and a key none did `s + m`, M being m: the lowest
/// or -inf, as for one additive mask.
fn replayed_mask(
    shape_of: &dyn Fn(&str) -> Option<Vec<Dim>>,
    masks: &[Step],
    prelude: &mut Nodes,
    conditions: &mut Vec<String>,
    score_bound: &dyn Fn(&mut Nodes, &str) -> Check<String>,
) -> Check<(String, Vec<Dim>, Option<Lifted>)> {
    let mut m = prelude.scalar("zero_score", FLOAT, 0.0);
    let mut kept: Option<String> = None;
    let mut read = Vec::new();
    let both = |kept: Option<String>, flag: String, i: usize, prelude: &mut Nodes| match kept {
        None => flag,
        Some(before) => prelude.op(&format!("kept_by_{i}"), "And", &[&before, &flag], vec![]),
    };
    let added: Vec<&str> = masks
        .iter()
        .filter_map(|m| match m {
            Step::Mask(value) => Some(value.as_str()),
            _ => None,
        })
        .collect();
    if let [m1, m2] = added[..] {
        // Where one of the two is 0, the core's (s + m1) + m2 is s + (m1 + m2).
        let zero = prelude.scalar("zero_mask", FLOAT, 0.0);
        let flags: Vec<String> = [m1, m2]
            .iter()
            .enumerate()
            .map(|(i, x)| prelude.op(&format!("mask_{i}_zero"), "Equal", &[x, &zero], vec![]))
            .collect();
        kept = Some(prelude.op("one_mask_added", "Or", &refs(&flags), vec![]));
    }
    for (i, step) in masks.iter().enumerate() {
        let next = format!("mask_{i}");
        m = match step {
            Step::Mask(value) => {
                read.push(value.as_str());
                prelude.op(&next, "Add", &[&m, value], vec![])
            }
            Step::Where { keep, fill, fill_first } => {
                let value = fill.scalar().filter(|f| !f.is_nan()).or_decline(|| "the Where fill is NaN".to_string())?;
                let f = prelude.scalar(&format!("fill_{i}"), FLOAT, value);
                let inputs = if *fill_first { [keep.as_str(), &f, &m] } else { [keep.as_str(), &m, &f] };
                let next = prelude.op(&next, "Where", &inputs, vec![]);
                let flag =
                    if *fill_first { prelude.op(&format!("kept_{i}"), "Not", &[keep], vec![]) } else { keep.clone() };
                kept = Some(both(kept, flag, i, prelude));
                read.push(keep.as_str());
                next
            }
            _ => decline!("a step other than a mask among the masks"),
        };
    }
    let kept = kept.or_decline(|| "neither a Where nor two additive masks among the masks".to_string())?;
    let read_shapes: Vec<Vec<Dim>> = read
        .iter()
        .map(|x| shape_of(x).or_decline(|| format!("the shape of the mask {x} is not proved")))
        .collect::<Check<_>>()?;
    let shape = proved_broadcast(&read_shapes).or_decline(|| {
        let each: Vec<String> = read_shapes.iter().map(|s| dims(s)).collect();
        format!("the masks' shapes ({}) are not proved to broadcast", each.join("; "))
    })?;

    let keepdims = || vec![int("keepdims", 0)];
    // The largest M of a kept key and of a hidden one, per row.
    let lowest = prelude.scalar("lowest", FLOAT, f64::from(f32::MIN));
    let axes = prelude.ints("last_axis", &[-1]);
    let kept_m = prelude.op("kept_mask", "Where", &[&kept, &m, &lowest], vec![]);
    let r = prelude.op("kept_max", "ReduceMax", &[&kept_m, &axes], keepdims());
    let hidden_m = prelude.op("hidden_mask", "Where", &[&kept, &lowest, &m], vec![]);
    let h_read = prelude.op("hidden_max_read", "ReduceMax", &[&hidden_m, &axes], keepdims());
    let h = prelude.op("hidden_max", "Max", &[&h_read, &lowest], vec![]);
    let gap = prelude.op("gap", "Sub", &[&r, &h], vec![]);
    let abs_r = prelude.op("abs_kept_max", "Abs", &[&r], vec![]);
    let abs_h = prelude.op("abs_hidden_max", "Abs", &[&h], vec![]);
    let sizes = prelude.op("magnitudes", "Add", &[&abs_r, &abs_h], vec![]);
    let rounding = prelude.scalar("rounding", FLOAT, 2f64.powi(-20));
    let err = prelude.op("rounding_room", "Mul", &[&sizes, &rounding], vec![]);
    let slack = prelude.op("slack", "Sub", &[&gap, &err], vec![]);
    let least = prelude.op("least_slack", "ReduceMin", &[&slack], keepdims());
    let bound = score_bound(prelude, "a Where with another mask")?;
    let four = prelude.scalar("four", FLOAT, 4.0);
    let twice = prelude.op("bound_times_four", "Mul", &[&bound, &four], vec![]);
    let margin = prelude.scalar("margin", FLOAT, 512.0);
    let need = prelude.op("slack_needed", "Add", &[&twice, &margin], vec![]);
    let ok = prelude.op("hidden_keys_weightless", "Greater", &[&least, &need], vec![]);
    conditions.push(ok.clone());
    let lifted = (added.len() <= 1).then(|| Lifted {
        mask: m.clone(),
        visible: ok,
        nodes: Vec::new(),
        bound: bound.clone(),
        rows: Rows::Room { slack, need },
    });
    Ok((m, shape, lifted))
}

/// A mask `m` added to heads folded into the batch before the scores'
/// view `[b, h, s, t]` (`sq`: q's `[b, h, s, d]`), as the view reads it.
/// One of rank 3 or less whose leading axis is 1 broadcasts over `[b, h]`
/// as over `b·h`: none (it is read as it is). One `[b·h, x, y]` (BLOOM's
/// ALiBi, `[b·h, 1, t]`) is `Reshape(m, [b·h / h, h, x, y])` (a Reshape
/// keeps the elements' order; the sizes read from `m`'s own shape, so an
/// empty batch gives an empty mask), pushed to `prelude`: its name and shape.
fn in_the_view(shapes: &Shapes, m: &str, sq: &[Dim], prelude: &mut Nodes) -> Check<Option<(String, Vec<Dim>)>> {
    let sm = shapes.shape(m).or_decline(|| format!("the shape of the mask {m} is not proved"))?;
    if sm.len() < 3 || (sm.len() == 3 && sm[0].value() == Some(1)) {
        return Ok(None);
    }
    let h = sq[1].value().filter(|&h| h > 0);
    let folded = sm.len() == 3 && sq[0].mul(&sq[1]).as_ref() == Some(&sm[0]);
    let h = h.filter(|_| folded).or_decline(|| {
        format!("the mask {m} ({}) added before the scores' view is not proved [b·h, …] of q's heads", dims(&sm))
    })?;
    let of = |what: &str| format!("{}_{what}", short(m));
    let lead = prelude.op(&of("lead"), "Shape", &[m], vec![int("start", 0), int("end", 1)]);
    let heads = prelude.ints(&of("heads"), &[h]);
    let batch = prelude.op(&of("batch"), "Div", &[&lead, &heads], vec![]);
    let rest = prelude.op(&of("rest"), "Shape", &[m], vec![int("start", 1)]);
    let target = prelude.op(&of("view"), "Concat", &[&batch, &heads, &rest], vec![int("axis", 0)]);
    let x = prelude.op(&of("viewed"), "Reshape", &[m, &target], vec![]);
    Ok(Some((x, vec![sq[0].clone(), sq[1].clone(), sm[1].clone(), sm[2].clone()])))
}

/// Whether `value` is a key or value the model keeps whole from call to
/// call, which the written-out core transposes (or repeats) whole at every
/// step and the kernel reads as it is: a cache, `Concat(past, new)` on the
/// sequence axis (2 of 4), or a graph input (a cross-attention's encoder
/// key and value, passed back in by the caller); also cast to its own
/// type (GPT-J's present key) or scaled by one value before its transpose
/// (SDPA's √scale of the key).
fn kept_whole(g: &Graph, value: &str) -> bool {
    let mut value = g.unchanged(value);
    for _ in 0..2 {
        let Some(node) = g.producer(value).map(|p| g.node(p)) else { break };
        let one_value = |i: usize| node.input.get(i).and_then(|c| g.one_value(c)).is_some();
        let from = match node.op_type() {
            _ if !crate::onnx::is_default_domain(node.domain()) => break,
            "Cast" if crate::pattern::cast_to(node) == g.elem_type(&node.input[0]) => &node.input[0],
            "Mul" | "Div" if one_value(1) => &node.input[0],
            "Mul" if one_value(0) => &node.input[1],
            _ => break,
        };
        value = g.unchanged(from);
    }
    let concat = g.produced_by(value, "Concat");
    let cache = concat.is_ok_and(|c| matches!(g.node(c).attr_int("axis"), Some(2 | -2)) && g.node(c).input.len() == 2);
    cache || g.proto.input.iter().any(|i| i.name() == value)
}

/// A core whose heads are split from `[b, s, h·d]` values and merged back
/// into one: what ONNX's `Attention` reads and writes in its 3-D form.
struct Merged<'a> {
    /// The values q, the key and the value are split from.
    q: &'a str,
    key: &'a str,
    value: &'a str,
    /// The Reshape that merges the output's heads.
    anchor: usize,
    heads: i64,
}

/// The merged form of a core (`Merged`): q and v are
/// `Transpose(Reshape(x, [b, s, h, d]), [0, 2, 1, 3])` of an `x`
/// `[b, s, h·d]`; the key is `x_k`'s heads the same way (the Transpose that
/// swaps its last two axes folded into it: `key_perm` takes the key
/// Transpose's input `x` to `[b, h, t, d]`); and the output is read only by
/// `Reshape(Transpose(out, [0, 2, 1, 3]), [b, s, h·dv])`. Each Reshape is
/// proved on shapes to split or merge the last axis as `[h, d]`, row-major,
/// which is how ONNX's `Attention` splits a 3-D input's heads.
fn merged_heads<'a>(
    g: &Graph<'a>,
    shapes: &Shapes,
    (anchor, merge): (usize, Option<usize>),
    q: &str,
    x: &'a str,
    key_perm: Option<&[i64]>,
    v: &'a str,
) -> Check<Merged<'a>> {
    let not = || Miss::Declined("the heads are not split from and merged into [b, s, h·d] values".into());
    let transposed_heads = |value: &str| -> Option<(&'a str, i64, i64)> {
        let t = g.node(g.produced_by(g.unchanged(value), "Transpose").ok()?);
        require_some(t.attr_ints("perm") == Some(&[0, 2, 1, 3][..]))?;
        split_heads(g, shapes, &t.input[0])
    };
    let (q, h, d) = transposed_heads(q).ok_or_else(not)?;
    let key = match key_perm {
        Some([0, 2, 1, 3]) => split_heads(g, shapes, x),
        None => transposed_heads(x),
        _ => None,
    };
    let (key, hk, dk) = key.ok_or_else(not)?;
    let (value, hv, dv) = transposed_heads(v).ok_or_else(not)?;
    require!(h == hk && h == hv && d == dk, "the heads of q, the key and the value are not split alike");

    // out [b, h, s, dv] → Transpose [b, s, h, dv] → Reshape [b, s, h·dv]
    // (`merge`, the rule's anchor; what else reads them is the driver's to
    // settle). (Through Identity nodes, which dynamo exports write between.)
    let out = &g.node(anchor).output[0];
    let merge = || -> Option<usize> {
        let r = merge?;
        let t = g.produced_by(g.unchanged(g.node(r).input.first()?), "Transpose").ok()?;
        require_some(g.node(t).attr_ints("perm") == Some(&[0, 2, 1, 3][..]))?;
        require_some(g.unchanged(g.node(t).input.first()?) == out)?;
        let (so, sr) = (shapes.shape(out)?, shapes.shape(&g.node(r).output[0])?);
        let merged = so.len() == 4
            && sr.len() == 3
            && sr[0] == so[0]
            && sr[1] == so[2]
            && so[1].value() == Some(h)
            && so[3].value() == Some(dv)
            && sr[2].value() == Some(h * dv);
        merged.then_some(r)
    };
    let anchor = merge().or_decline(|| "the output's heads are not merged into [b, s, h·d] alone".to_string())?;
    Ok(Merged { q, key, value, anchor, heads: h })
}

/// `x3 = Reshape(x4, …)` merging the first two axes of `x4` `[b, h, s, d]`
/// into `[b·h, s, d]` (a Reshape keeps the elements' order): `x4`.
fn merged_batch<'a>(g: &Graph<'a>, shapes: &Shapes, x3: &str) -> Option<&'a str> {
    let reshape = g.node(g.produced_by(g.unchanged(x3), "Reshape").ok()?);
    let x4 = reshape.input.first()?.as_str();
    merges_leading_two(&shapes.shape(x4)?, &shapes.shape(x3)?).then_some(x4)
}

/// Whether `s3` is `s4` `[b, h, x, y]` with its first two axes merged,
/// `[b·h, x, y]`.
fn merges_leading_two(s4: &[Dim], s3: &[Dim]) -> bool {
    s3.len() == 3 && s4.len() == 4 && s4[0].mul(&s4[1]).as_ref() == Some(&s3[0]) && s3[1..] == s4[2..]
}

/// `merge`, the Reshape that reads the 3-D output of `anchor`,
/// `[b·h, s, dv]`, where it splits it into `[b, h, s, dv]` (b and h to be
/// proved q's).
fn split_batch(g: &Graph, shapes: &Shapes, anchor: usize, merge: Option<usize>) -> Option<usize> {
    let (r, out) = (merge?, &g.node(anchor).output[0]);
    require_some(g.unchanged(g.node(r).input.first()?) == out)?;
    merges_leading_two(&shapes.shape(&g.node(r).output[0])?, &shapes.shape(out)?).then_some(r)
}

/// Where a kernel's match grows past its core's product (the rule is at
/// the last of these Reshapes): the Reshape that splits a 3-D output's
/// batch `[b·h]` into `[b, h]` heads, and the one that merges the heads
/// of `[b, s, h, d]` back into `[b, s, h·d]` after their Transpose.
#[derive(Clone, Copy, Default)]
pub(super) struct Merge {
    pub split: Option<usize>,
    pub merge: Option<usize>,
}

impl Merge {
    /// The Reshape the rule is at, if any.
    pub fn last(&self) -> Option<usize> {
        self.merge.or(self.split)
    }
}

/// The product whose heads a Reshape at `r` may split or merge, and how:
/// `r` reads the MatMul (a split), or a Transpose of it (a merge), or a
/// Transpose of a Reshape of it (a split, then a merge), through Identity
/// nodes.
pub(super) fn merged_by(g: &Graph, r: usize) -> Option<(usize, Merge)> {
    let before = |n: usize| Some(g.unchanged(g.node(n).input.first()?));
    let x = before(r)?;
    let Ok(t) = g.produced_by(x, "Transpose") else {
        return Some((g.produced_by(x, "MatMul").ok()?, Merge { split: Some(r), merge: None }));
    };
    let x = before(t)?;
    let split = g.produced_by(x, "Reshape").ok();
    let x = match split {
        Some(s) => before(s)?,
        None => x,
    };
    Some((g.produced_by(x, "MatMul").ok()?, Merge { split, merge: Some(r) }))
}

/// `x4 = Reshape(x, …)` splitting the last axis of `x` `[b, s, h·d]` into
/// `[b, s, h, d]`, h and d known positive numbers: `(x, h, d)`.
fn split_heads<'a>(g: &Graph<'a>, shapes: &Shapes, x4: &str) -> Option<(&'a str, i64, i64)> {
    let reshape = g.node(g.produced_by(x4, "Reshape").ok()?);
    let x = reshape.input.first()?.as_str();
    let (s3, s4) = (shapes.shape(x)?, shapes.shape(x4)?);
    let (h, d) = (s4.get(2)?.value()?, s4.get(3)?.value()?);
    let split = s3.len() == 3
        && s4.len() == 4
        && h > 0
        && d > 0
        && s3[0] == s4[0]
        && s3[1] == s4[1]
        && s3[2].value() == h.checked_mul(d);
    split.then_some((x, h, d))
}

/// The key as torch's SDPA decomposition (dynamo) writes its transpose:
/// `k = Reshape(Transpose(x3, [0, 2, 1]), [b, h, d, t])`, with `x3` `[b·h,
/// t, d]` the key's heads folded into the batch: its kv heads repeated n
/// times in place (`repeated` of rank 3), or a 4-D key `[b, h, t, d]`
/// reshaped (of H heads, its element (i, j, t, d) is x3's (i·H + j, t, d),
/// so k is that key with its last two axes swapped). The key before its transpose, and
/// n where the fold repeats it (where it does not, the caller reads a
/// repeat of the key as for any other).
fn folded_key<'a>(g: &Graph<'a>, shapes: &Shapes, k: &str) -> Option<(&'a str, Option<i64>)> {
    let view = g.node(g.produced_by(g.unchanged(k), "Reshape").ok()?);
    let t = g.node(g.produced_by(g.unchanged(&view.input[0]), "Transpose").ok()?);
    require_some(t.attr_ints("perm") == Some(&[0, 2, 1][..]))?;
    let x3 = t.input.first()?.as_str();
    let (sk, s3) = (shapes.shape(k)?, shapes.shape(x3)?);
    let (x, n) = match repeated(g, shapes, x3, 3) {
        Some((x, n)) => (x, Some(n)),
        None => {
            let x = g.node(g.produced_by(g.unchanged(x3), "Reshape").ok()?).input.first()?.as_str();
            let sx = shapes.shape(x).filter(|sx| sx.len() == 4)?;
            let folded = s3.len() == 3 && sx[0].mul(&sx[1]).as_ref() == Some(&s3[0]) && s3[1..] == sx[2..];
            (folded.then_some(x)?, None)
        }
    };
    let sx = shapes.shape(x)?;
    let heads = sx[1].mul(&Dim::known(n.unwrap_or(1)));
    // The view splits b·h back into [b, h].
    let split = sk.len() == 4
        && s3.len() == 3
        && sk[0] == sx[0]
        && Some(&sk[1]) == heads.as_ref()
        && sk[2] == s3[2]
        && sk[3] == s3[1];
    split.then_some((x, n))
}

/// `x` repeated `n` times per head in place, and n: a Reshape to
/// `[b, kv·n, t, d]` (rank 4), or folded into the batch, `[b·kv·n, t, d]`
/// (rank 3), of `x` `[b, kv, t, d]` unsqueezed at axis 2 and expanded (or
/// tiled) to `[b, kv, n, t, d]`.
fn repeated<'a>(g: &Graph<'a>, shapes: &Shapes, value: &'a str, rank: usize) -> Option<(&'a str, i64)> {
    let reshape = g.node(g.produced_by(value, "Reshape").ok()?);
    let spread = g.node(g.producer(g.unchanged(&reshape.input[0]))?);
    require_some(spread.is("Expand") || spread.is("Tile"))?;
    let unsqueeze = g.node(g.produced_by(g.unchanged(&spread.input[0]), "Unsqueeze").ok()?);
    // The new axis is 2 (of 5): each head's rows are then repeated in place.
    let axes = g.ints_argument(unsqueeze, "axes", 1, 13);
    require_some(matches!(axes, crate::graph::IntsArgument::Known(ref a) if a[..] == [2] || a[..] == [-3]))?;
    if spread.is("Tile") {
        let reps = fold(g, shapes, spread.input.get(1)?)?;
        require_some(reps.values.len() == 5 && reps.values.iter().enumerate().all(|(i, &r)| i == 2 || r == 1.0))?;
    }
    let x = unsqueeze.input.first()?.as_str();
    let (sx, se, sr) = (shapes.shape(x)?, shapes.shape(&spread.output[0])?, shapes.shape(value)?);
    let n = se.get(2)?.value()?;
    // (Read once x is proved 4-D.)
    let merged = || {
        let heads = sx[1].mul(&Dim::known(n));
        match rank {
            4 => sr.len() == 4 && sr[0] == sx[0] && Some(&sr[1]) == heads.as_ref() && sr[2..] == sx[2..],
            _ => {
                let folded = heads.and_then(|h| sx[0].mul(&h));
                sr.len() == 3 && Some(&sr[0]) == folded.as_ref() && sr[1..] == sx[2..]
            }
        }
    };
    let proved = sx.len() == 4
        && se.len() == 5
        && n >= 1
        && se[0] == sx[0]
        && se[1] == sx[1]
        && se[3] == sx[2]
        && se[4] == sx[3]
        && merged()
        && shapes.shape(&unsqueeze.output[0]).is_some_and(|u| u.len() == 5 && u[2].value() == Some(1));
    proved.then_some((x, n))
}

fn require_some(cond: bool) -> Option<()> {
    cond.then_some(())
}

/// The condition that no row of an additive mask hides every key (its
/// maximum above the type's lowest), pushed where it is not proved: by a
/// constant mask, or by SDPA's masks of 0 and -inf alone before a NaN
/// guard (a row all -inf is zeros in both, the original's NaN turned to 0
/// by its guard, and no value is the finite lowest). The condition's
/// name, where it is pushed.
fn visible_rows(
    g: &Graph,
    shapes: &Shapes,
    mask: &str,
    nan_guard: bool,
    prelude: &mut Nodes,
    conditions: &mut Vec<String>,
) -> Check<Option<String>> {
    if let Some(t) = g.constant(mask) {
        require!(
            every_row_visible(t),
            "the constant mask hides every key of a row: ONNX Runtime's Attention gives zeros there"
        );
        return Ok(None);
    }
    let sdpa = values_held(g, shapes, mask)
        .is_some_and(|v| v.iter().all(|&x| x == f64::NEG_INFINITY || (x.is_finite() && x > f64::from(f32::MIN))));
    if nan_guard && sdpa {
        return Ok(None);
    }
    let axes = prelude.ints("last_axis", &[-1]);
    let names = ["row_max", "least_row_max", "lowest", "visible"];
    let visible = rows_above(mask, &axes, f64::from(f32::MIN), names, prelude);
    conditions.push(visible.clone());
    Ok(Some(visible))
}

/// A mask whose rows the guard tests (the condition `visible`), with the
/// nodes that bound the scores (`bound`), which the kernel needs only
/// where a row hides every key (`hidden_rows_lifted`).
#[derive(Clone)]
struct Lifted {
    mask: String,
    visible: String,
    nodes: Vec<NodeProto>,
    bound: String,
    rows: Rows,
}

/// What the guard requires of a mask's rows, besides those it lifts.
#[derive(Clone)]
enum Rows {
    /// An additive mask: each keeps a key (`visible_rows`).
    Visible,
    /// A replayed mask: each has its room (`replayed_mask`), `slack` per
    /// row against `need`.
    Room { slack: String, need: String },
    /// A Where's kept keys, handed over as a boolean mask: each keeps a key
    /// (`flags`, the keys kept as 1 and 0, `zero` the f32 0). A row that
    /// keeps none is the fill throughout in the core, whatever the scores.
    Kept { flags: String, zero: String },
}

/// The branch that runs where some row of the additive mask hides every
/// key (the padding of a left-padded batch). In a row whose largest value
/// is the type's lowest, every value is the lowest or -inf; the core
/// computes `s + lowest`, which rounds to the lowest for every |s| <
/// 2^103, and -inf: the softmax of equal values over the keys of the
/// lowest, and their mean of v. The kernel gives zeros for such a row, but
/// one whose lowest values are the next float above it it computes as any
/// other: `s + m` rounds to m again (the same binade), -inf stays, the
/// same softmax and the same product with v (measured bit for bit,
/// `tests/kernel.rs`). So where every row either keeps a key or is such a
/// row and has a value of the lowest (a row all -inf is the core's NaN),
/// and the scores are bounded well inside 2^103 (2^100), the kernel runs
/// on the mask with those rows lifted; elsewhere, the original ops. Each
/// other row of a replayed mask needs its room. The conditions of the
/// guard but the rows' hold here too (`others`). Where `held`, the guard's
/// condition, holds, no row is hidden whole and the lifted kernel computes
/// the kernel: it runs there too.
fn hidden_rows_lifted(
    lifted: Lifted,
    others: &[String],
    kernel: &GraphProto,
    held: Option<&str>,
    a: &str,
) -> GraphProto {
    let Lifted { mask, visible, nodes: written, bound, rows } = lifted;
    let mut nodes = Nodes::new(format!("{a}/"));
    nodes.list = written;
    let kept = matches!(rows, Rows::Kept { .. });
    let axes = nodes.name("last_axis");
    let next_above = f32::from_bits(f32::MIN.to_bits() - 1);
    let lift = nodes.scalar("next_above_lowest", FLOAT, f64::from(next_above));
    let mut conditions = Vec::new();
    let lifted_mask = if let Rows::Kept { flags, zero } = &rows {
        // The kept keys as the float mask the kernel makes of them (0 and
        // the lowest), a row that keeps none the next float above.
        let any = nodes.op("row_keeps", "ReduceMax", &[flags, &axes], vec![int("keepdims", 1)]);
        let none = nodes.op("keeps_none", "Equal", &[&any, zero], vec![]);
        let floor = nodes.scalar("lowest_fill", FLOAT, f64::from(f32::MIN));
        let hidden = nodes.op("hidden_value", "Where", &[&none, &lift, &floor], vec![]);
        nodes.op("lifted_mask", "Where", &[&mask, zero, &hidden], vec![])
    } else {
        let lowest = nodes.name("lowest");
        let top = nodes.op("row_top", "ReduceMax", &[&mask, &axes], vec![int("keepdims", 1)]);
        let whole = nodes.op("hidden_whole", "Equal", &[&top, &lowest], vec![]);
        let at_lowest = nodes.op("at_lowest", "Equal", &[&mask, &lowest], vec![]);
        let lifting = nodes.op("lifting", "And", &[&whole, &at_lowest], vec![]);
        let lifted_mask = nodes.op("lifted_mask", "Where", &[&lifting, &lift, &mask], vec![]);
        let (tops, least) = match rows {
            // Every other row keeps a key.
            Rows::Visible => (nodes.op("lifted_tops", "Where", &[&whole, &lift, &top], vec![]), lowest),
            // Every other row has its room.
            Rows::Room { slack, need } => {
                let slack_rows = nodes.op("row_slack", "Unsqueeze", &[&slack, &axes], vec![]);
                let ample = nodes.scalar("ample", FLOAT, f64::INFINITY);
                (nodes.op("lifted_tops", "Where", &[&whole, &ample, &slack_rows], vec![]), need)
            }
            Rows::Kept { .. } => unreachable!("handled above"),
        };
        let fewest = nodes.op("least_lifted_top", "ReduceMin", &[&tops], vec![int("keepdims", 0)]);
        conditions.push(nodes.op("rows_lifted", "Greater", &[&fewest, &least], vec![]));
        lifted_mask
    };
    let bounded = scores_bounded(&bound, ["bound_limit", "bounded"], &mut nodes);
    let mut ok = bounded.clone();
    for (i, c) in others.iter().filter(|c| **c != visible).chain(&conditions).enumerate() {
        ok = nodes.op(&format!("lifted_ok_{i}"), "And", &[&ok, c], vec![]);
    }
    if let Some(held) = held {
        // Where the guard holds, no row is hidden whole: the lifted mask
        // is the mask, and a Where's kept keys made the float mask the
        // kernel makes of them give hidden keys no weight where the scores
        // are bounded.
        let held = if kept { nodes.op("held_bounded", "And", &[held, &bounded], vec![]) } else { held.to_string() };
        ok = nodes.op("lifted_or_held", "Or", &[&ok, &held], vec![]);
    }
    let mut kernel = kernel.clone();
    reading_instead(&mut kernel, &mask, &lifted_mask);
    nodes.list.push(writing(a, guard(&ok, kernel, original_ops())));
    branch("ONNX Attention, rows hidden whole lifted", nodes.list, a, FLOAT)
}

/// The query length from which the kernel runs on pieces of the queries
/// (`over_query_pieces`).
const LONG_QUERIES: i64 = SPEED.long_queries;

/// Whether a call's queries are long (`LONG_QUERIES` or more): known, or
/// a condition computed at run time (`long`, pushed to `prelude`).
enum Length {
    Short,
    Long,
    Either(String),
}

/// The `Length` of the queries `s`, axis `at` of q.
fn query_length(s: &Dim, q: &str, at: i64, prelude: &mut Nodes) -> Length {
    match s.value() {
        Some(s) if s >= LONG_QUERIES => Length::Long,
        Some(_) => Length::Short,
        None => {
            let axis = prelude.op("query_axis", "Shape", &[q], vec![int("start", at), int("end", at + 1)]);
            let length = prelude.op("query_length", "Squeeze", &[&axis], vec![]);
            let least = prelude.scalar("long_from", INT64, (LONG_QUERIES - 1) as f64);
            Length::Either(prelude.op("long", "Greater", &[&length, &least], vec![]))
        }
    }
}

/// `If(ok) { kernel } else { otherwise }`, where the queries may be long
/// or short: the kernel over pieces of long queries (`pieces`)
/// in a second `If` of the first's else branch, so that a short call (a
/// decode step) still runs one `If`. With rows lifted (`long_lifted`, the
/// lifted kernel's pieces where the guard or the lifted guard holds), the
/// second `If` chooses by the length alone: a long call runs
/// `long_lifted`, a short one where the guard fails `otherwise`.
fn by_length(
    ok: &str,
    [kernel, pieces]: [GraphProto; 2],
    (otherwise, long_lifted): (GraphProto, Option<GraphProto>),
    length: &Length,
    a: &str,
    prelude: &mut Nodes,
) -> NodeProto {
    let Length::Either(long) = length else { return guard(ok, kernel, otherwise) };
    let short = prelude.op("short", "Not", &[long], vec![]);
    let ok_short = prelude.op("ok_short", "And", &[ok, &short], vec![]);
    let long_call = match long_lifted {
        Some(lifted) => {
            let choice = guard(long, lifted, otherwise);
            branch("long queries, or the guard failed", vec![writing(a, choice)], a, FLOAT)
        }
        None => {
            let ok_long = prelude.op("ok_long", "And", &[ok, long], vec![]);
            branch("long queries", vec![writing(a, guard(&ok_long, pieces, otherwise))], a, FLOAT)
        }
    };
    guard(&ok_short, kernel, long_call)
}

/// The pieces a long call's queries are run in (`over_query_pieces`).
const QUERY_PIECES: usize = SPEED.query_pieces;

/// The kernel branch with its `Attention` run on each of `QUERY_PIECES`
/// pieces of the queries (axis -2 of q, of the mask and of the output, in
/// both forms the pass writes: `Split` into pieces of ceil(s/8) rows, the
/// last the rest) and the pieces concatenated. Each query row is computed
/// alone, so the pieces compute the whole call (bit for bit where each
/// has two rows or more, pinned by `tests/kernel.rs`). ONNX Runtime's
/// kernel holds the scores of the call it runs: a piece holds an eighth,
/// which fits where a whole call of a long prompt leaves the memory arena
/// no room (docs/attention-kernel.md). Needs s ≥ 64 (no piece empty).
/// With a mask (`hiding`, how it hides a key), each piece reads the keys
/// its rows can see (`keys_seen`; `width`, a 3-D value's last axis).
fn over_query_pieces(kernel: &GraphProto, hiding: Option<Hiding>, width: Option<i64>) -> GraphProto {
    let mut pieces = kernel.clone();
    pieces.name = Some(format!("{}, over pieces of the queries", kernel.name()));
    let at = pieces.node.iter().position(|n| n.is("Attention")).expect("the kernel branch runs Attention");
    let attention = pieces.node.remove(at);
    let y = &attention.output[0];
    let mut nodes = Vec::new();
    let mut split = |x: &str, what: &str| -> Vec<String> {
        let parts: Vec<String> = (0..QUERY_PIECES).map(|i| format!("{y}/{what}_piece_{i}")).collect();
        let mut s = node("Split", &[x], vec![int("axis", -2), int("num_outputs", QUERY_PIECES as i64)]);
        s.output = parts.clone();
        nodes.push(s);
        parts
    };
    let qs = split(&attention.input[0], "q");
    let masks = attention.input.get(3).map(|m| split(m, "mask"));
    let seen =
        masks.as_ref().zip(hiding).map(|(masks, hiding)| keys_seen(&attention, masks, hiding, width, &mut nodes));
    let outs: Vec<String> = (0..QUERY_PIECES).map(|i| format!("{y}/piece_{i}")).collect();
    for (i, (q, out)) in qs.iter().zip(&outs).enumerate() {
        let mut inputs = attention.input.clone();
        inputs[0] = q.clone();
        if let Some(masks) = &masks {
            inputs[3] = masks[i].clone();
        }
        if let Some(seen) = &seen {
            inputs[1..4].clone_from_slice(&seen[i]);
        }
        nodes.push(NodeProto { input: inputs, output: vec![out.clone()], ..attention.clone() });
    }
    nodes.push(writing(y, node("Concat", &refs(&outs), vec![int("axis", -2)])));
    pieces.node.splice(at..at, nodes);
    pieces
}

/// How a mask hides a key from a row, as a piece of a long call tests it
/// (`keys_seen`).
#[derive(Clone, Copy)]
enum Hiding {
    /// A float mask: the type's lowest or -inf.
    Lowest,
    /// A Where's kept keys, a boolean mask: false.
    NotKept,
}

/// The key, value and mask each piece of a long call reads (`masks`, the
/// pieces of the mask, which hides a key as `hiding` says): the keys up to
/// the last its rows can see. Piece i's rows are queries up to
/// `end_i = min((i+1)·ceil(S/8), S)`; in a causal prompt of S queries
/// after T − S keys of a cache, no row of the piece sees a key from
/// `T − S + end_i` on. Where the piece's mask hides every such key
/// (checked at run time, a NaN failing it) and every score and value is
/// finite (q, the key and the value bounded: `scale · D · max|q| · max|k|
/// < 2^100`, D q's last axis, and max|v| finite), each of those keys has
/// the weight 0 in the whole call and adds exactly nothing: its `s + m` is
/// −∞, or the lowest (|s| < 2^103 rounds away; a boolean mask's hidden key
/// is one of the two in the kernel), while every row the kernel computes
/// as the core keeps a key above the lowest by 2^104 at least (the ulp
/// there), so `exp` of the difference is 0. ONNX Runtime's kernel over the
/// keys before them computes the piece bit for bit (pinned by
/// `tests/kernel.rs`), with about half the work of a causal prompt's
/// scores. Elsewhere the piece reads every key. The first dropped key is
/// held within [1, T − 1], so that a piece reads a key and the region
/// tested is never empty.
fn keys_seen(
    attention: &NodeProto,
    masks: &[String],
    hiding: Hiding,
    width: Option<i64>,
    nodes: &mut Vec<NodeProto>,
) -> Vec<[String; 3]> {
    let y = &attention.output[0];
    let mut seen = Nodes::new(format!("{y}/seen_"));
    let (q, key, value) = (&attention.input[0], &attention.input[1], &attention.input[2]);
    // S, T and the first key no row of each piece sees, [8].
    let s = seen.op("queries", "Shape", &[q], vec![int("start", -2), int("end", -1)]);
    let t = seen.op("keys", "Shape", &[key], vec![int("start", -2), int("end", -1)]);
    let (one, pieces) = (seen.ints("one", &[1]), QUERY_PIECES as i64);
    let (spare, count) = (seen.ints("spare", &[pieces - 1]), seen.ints("piece_count", &[pieces]));
    let rounded = seen.op("queries_rounded_up", "Add", &[&s, &spare], vec![]);
    let rows = seen.op("piece_rows", "Div", &[&rounded, &count], vec![]);
    let nth = seen.ints("nth_piece", &(1..=pieces).collect::<Vec<_>>());
    let reach = seen.op("piece_reach", "Mul", &[&nth, &rows], vec![]);
    let ends = seen.op("piece_ends", "Min", &[&reach, &s], vec![]);
    let past = seen.op("cached_keys", "Sub", &[&t, &s], vec![]);
    let unseen = seen.op("first_unseen", "Add", &[&ends, &past], vec![]);
    let last = seen.op("last_key", "Sub", &[&t, &one], vec![]);
    let below_last = seen.op("first_unseen_below_last", "Min", &[&unseen, &last], vec![]);
    let firsts = seen.op("first_dropped", "Max", &[&below_last, &one], vec![]);
    // Every score and value finite.
    let (lq, lk, lv) = (largest(q, "q", &mut seen), largest(key, "key", &mut seen), largest(value, "value", &mut seen));
    let axis = seen.op("q_last_axis", "Shape", &[q], vec![int("start", -1)]);
    let d = seen.op("q_last_axis_f32", "Cast", &[&axis], vec![int("to", i64::from(FLOAT))]);
    let qk = seen.op("largest_qk", "Mul", &[&lq, &lk], vec![]);
    let per = seen.op("largest_qk_d", "Mul", &[&qk, &d], vec![]);
    let scale = seen.scalar("scale", FLOAT, f64::from(attention.attr_float("scale").unwrap_or(f32::NAN)));
    let bound = seen.op("score_bound", "Mul", &[&per, &scale], vec![]);
    let bounded = scores_bounded(&bound, ["bound_limit", "scores_bounded"], &mut seen);
    let infinity = seen.scalar("infinity", FLOAT, f64::INFINITY);
    let finite_v = seen.op("values_finite", "Less", &[&lv, &infinity], vec![]);
    let finite = seen.op("finite", "And", &[&bounded, &finite_v], vec![]);
    let lowest = seen.scalar("lowest", FLOAT, f64::from(f32::MIN));
    let one_f32 = seen.scalar("one_f32", FLOAT, 1.0);
    let (zero, to_end) = (seen.ints("zero", &[0]), seen.ints("to_end", &[i64::MAX]));
    let (key_axis, mask_axis) = (seen.ints("key_axis", &[-2]), seen.ints("mask_axis", &[-1]));
    let read = masks
        .iter()
        .enumerate()
        .map(|(i, mask)| {
            let at = |what: &str| format!("{what}_{i}");
            let (from, to) =
                (seen.ints(&at("piece_index"), &[i as i64]), seen.ints(&at("next_piece_index"), &[i as i64 + 1]));
            let first = seen.op(&at("first_dropped"), "Slice", &[&firsts, &from, &to], vec![]);
            let region = seen.op(&at("dropped_mask"), "Slice", &[mask, &first, &to_end, &mask_axis], vec![]);
            let hidden = match hiding {
                Hiding::Lowest => seen.op(&at("dropped_hidden"), "LessOrEqual", &[&region, &lowest], vec![]),
                Hiding::NotKept => seen.op(&at("dropped_hidden"), "Not", &[&region], vec![]),
            };
            let flags = seen.op(&at("dropped_hidden_f32"), "Cast", &[&hidden], vec![int("to", i64::from(FLOAT))]);
            let fewest = seen.op(&at("fewest_hidden"), "ReduceMin", &[&flags], vec![int("keepdims", 0)]);
            let all = seen.op(&at("all_hidden"), "Equal", &[&fewest, &one_f32], vec![]);
            let ok = seen.op(&at("drop"), "And", &[&all, &finite], vec![]);
            let n = seen.op(&at("keys_read"), "Where", &[&ok, &first, &t], vec![]);
            let k = seen.op(&at("key"), "Slice", &[key, &zero, &n, &key_axis], vec![]);
            let mut v = seen.op(&at("value"), "Slice", &[value, &zero, &n, &key_axis], vec![]);
            if let Some(width) = width {
                // ONNX's shape inference of a 3-D Attention takes its
                // output's last axis from the value's, which a Slice of
                // run-time bounds leaves unknown: it then infers 0, and
                // ONNX Runtime warns on every call. The view names it.
                let shape = seen.ints(&at("value_shape"), &[0, -1, width]);
                v = seen.op(&at("value_viewed"), "Reshape", &[&v, &shape], vec![]);
            }
            let m = seen.op(&at("mask"), "Slice", &[mask, &zero, &n, &mask_axis], vec![]);
            [k, v, m]
        })
        .collect();
    nodes.append(&mut seen.list);
    read
}

/// The condition `bound < 2^100` on a bound of the scores (named
/// `[limit, ok]`): every score is finite and well inside 2^103, below which
/// `s + lowest` rounds to the lowest and `s − ∞` is −∞
/// (`hidden_rows_lifted`, `keys_seen`).
fn scores_bounded(bound: &str, [limit, ok]: [&str; 2], nodes: &mut Nodes) -> String {
    let limit = nodes.scalar(limit, FLOAT, 2f64.powi(100));
    nodes.op(ok, "Less", &[bound, &limit], vec![])
}

/// The largest |x| of the f32 `x` (named for `of`), NaN where x holds a
/// NaN: ONNX Runtime's `ReduceMax` passes over a NaN that is not the
/// first value (measured on 1.31.1), a sum does not, so 0 · Σx
/// is added (NaN too where x holds an infinity or its sum overflows).
/// A test `largest < limit` then fails on all of these.
fn largest(x: &str, of: &str, nodes: &mut Nodes) -> String {
    let abs = nodes.op(&format!("abs_{of}"), "Abs", &[x], vec![]);
    let max = nodes.op(&format!("max_abs_{of}"), "ReduceMax", &[&abs], vec![int("keepdims", 0)]);
    let sum = nodes.op(&format!("sum_{of}"), "ReduceSum", &[x], vec![int("keepdims", 0)]);
    let zero = nodes.scalar(&format!("zero_{of}"), FLOAT, 0.0);
    let none = nodes.op(&format!("sum_times_zero_{of}"), "Mul", &[&sum, &zero], vec![]);
    nodes.op(&format!("largest_{of}"), "Add", &[&max, &none], vec![])
}

/// The condition that every row (along `axes`, the last) of the f32 `x`
/// has a value above `floor`: `ReduceMin(ReduceMax(x, axes)) > floor`,
/// its nodes pushed to `prelude`, named the rows' maxima, their least, the
/// floor and the condition.
fn rows_above(x: &str, axes: &str, floor: f64, names: [&str; 4], prelude: &mut Nodes) -> String {
    let [rows, fewest, floor_value, ok] = names;
    let rows = prelude.op(rows, "ReduceMax", &[x, axes], vec![int("keepdims", 0)]);
    let fewest = prelude.op(fewest, "ReduceMin", &[&rows], vec![int("keepdims", 0)]);
    let floor_value = prelude.scalar(floor_value, FLOAT, floor);
    prelude.op(ok, "Greater", &[&fewest, &floor_value], vec![])
}

/// Whether every row (last axis) of a constant Where condition keeps a key
/// (holds a true, or with `hides` a false).
fn every_row_keeps(t: &TensorProto, hides: bool) -> bool {
    let (Some(values), Some(&last)) = (t.values(), t.dims.last()) else { return false };
    last > 0 && values.chunks(last as usize).all(|row| row.iter().any(|&x| (x != 0.0) != hides))
}

/// A mask axis that broadcasts as ONNX Runtime's kernel reads it: 1, or
/// the scores' own.
fn fits(axis: &Dim, scores: &Dim) -> bool {
    axis.value() == Some(1) || axis == scores
}

/// Whether a mask of shape `sm` (2-D at least) broadcasts over the scores'
/// leading axes as Attention reads it: each of its axes before the last
/// two is 1 or the scores' (the heads, then the batch), and it has no
/// more axes than the scores.
fn leading_fit(sm: &[Dim], ops: &Operands) -> bool {
    match sm {
        [b, h, _, _] => ops.rank == 4 && fits(b, &ops.sq[0]) && fits(h, &ops.sq[1]),
        [h, _, _] => fits(h, &ops.sq[1]),
        other => other.len() == 2,
    }
}

/// Whether every row (last axis) of a constant mask has a value above its
/// type's lowest (and is no NaN-free row of lowest and -inf).
fn every_row_visible(t: &TensorProto) -> bool {
    let (Some(values), Some(&last)) = (t.values(), t.dims.last()) else { return false };
    let lowest = f64::from(f32::MIN);
    last > 0 && values.chunks(last as usize).all(|row| row.iter().any(|&x| x.is_nan() || x > lowest))
}

fn int(name: &str, value: i64) -> AttributeProto {
    AttributeProto::int(name, value)
}

fn refs(values: &[String]) -> Vec<&str> {
    values.iter().map(String::as_str).collect()
}

/// A value's name, shortened to its last path segment for derived names.
fn short(value: &str) -> &str {
    value.rsplit('/').next().unwrap_or(value)
}

fn dims(shape: &[Dim]) -> String {
    shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}
