//! rotary: `x · cos + turn(x) · sin` → ONNX `RotaryEmbedding` (opset 23),
//! which ONNX Runtime runs as one kernel.
//!
//! ```text
//! out  = Add(Mul(x, c), Mul(r, s))          every operand either order
//! rotate-half (Llama, NeoX):
//!   r    = Concat(Neg(x₂), x₁, axis −1)     x₁ = x[…, :d/2], x₂ = x[…, d/2:] (Slices of x,
//!                                           or the two parts of a Split of x: `x.chunk(2, −1)`)
//!   c    = Unsqueeze(cos, heads axis)       or any 4-D c with a one at the heads axis,
//!                                           cos = c squeezed (ESM's cache sliced to s)
//!   cos  = g(Concat(f, f, axis −1))         g elementwise, times one value, or keeping
//!                                           rows whole: each half of cos is the other
//!                                           (every Hugging Face export computes
//!                                           `cat(freqs, freqs)`); or a constant so
//!   → RotaryEmbedding(x, cos[…, :d/2], sin[…, :d/2])
//! interleaved (GPT-J's rotate_every_two):
//!   r    = Reshape(Concat(Unsqueeze(Neg(x₀), −1), Unsqueeze(xₑ, −1), axis −1))  to x's shape
//!                                           xₑ = x[…, 0::2], x₀ = x[…, 1::2]
//!   c    = Reshape(Tile or Expand(Unsqueeze(cos, heads axis, −1), ×2 on the last axis))
//!                                           `repeat_interleave(cos, 2)`: c[…, 2i + j] = cos[…, i]
//!        | Reshape(Concat(u, u, axis −1))   RoFormer's `stack([cos, cos], −1)`
//!        | a constant of each value twice   cos = every second value
//!        | Unsqueeze(g(p), heads axis)      p each value twice (a repeat above, or torch's
//!                                           general repeat_interleave: `gathered_in_pairs`),
//!                                           cos = every second value of g(p)
//!   → RotaryEmbedding(x, cos, sin, interleaved = 1)
//! halves written apart (GPT-OSS's `_apply_rotary_emb`):
//!   out  = Concat(Sub(Mul(x₁, c), Mul(x₂, s)), Add(Mul(x₂, c), Mul(x₁, s)), axis −1)
//!   c    = Unsqueeze(cos, heads axis)       cos [b or 1, s, d/2]: half a head, the cache
//!   → RotaryEmbedding(x, cos, sin)
//! ```
//!
//! The tables' heads axis says how x is laid out: `[b, heads, s, d]` is
//! the kernel's 4-D input; `[b, s, heads, d]` (GPT-J's heads before their
//! transpose) is its 3-D input with `num_heads`, x viewed as
//! `[b, s, heads · d]` and the result viewed back. cos and sin are
//! `[b, s, d]` (or their halves) with x's b and s, or of one batch row
//! (ONNX Runtime's kernel takes caches of x's batch exactly, measured, so
//! the prelude repeats them), d even. Nothing but the rotary's own nodes
//! is replaced; the tables' Unsqueezes and repeats stay while another
//! rotary reads them.

use crate::graph::fold::values_held;
use crate::graph::shapes::Dim;
use crate::graph::{Check, Graph, IntsArgument, Stop};
use crate::onnx::{type_text, AttributeProto, NodeProto, TensorProto, BFLOAT16, FLOAT, FLOAT16};
use crate::pattern;
use crate::rewrite::{ints_constant, node, writing, Kept, Match, Pass, Portable, Rewrite};
use crate::{candidate, decline, no_candidate, require};

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

/// How x is turned: its two halves, or each pair of neighbours; or its
/// halves each times tables of half a head, written apart.
#[derive(Clone, Copy, PartialEq)]
enum Turn {
    Halves,
    Pairs,
    HalfTables,
}

/// A table the rotary reads: the value whose rows are the cache (`[b or
/// 1, s, d]` for halves, `[b or 1, s, d/2]` for pairs, or a 4-D table
/// whose one at the heads axis is squeezed out), whether it has one batch
/// row, and the axis of x it is broadcast over (x's heads).
struct Table {
    rows: String,
    one: bool,
    heads: usize,
    /// The rows are the 4-D table itself, to be squeezed at `heads`.
    squeezed: bool,
    /// The rows are every second value of the table's last axis (pairs).
    every_second: bool,
}

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let found = match g.node(index).op_type() {
        "Concat" => halves_apart(g, index)?,
        _ => turned(g, index)?,
    };
    rotary(g, index, found)
}

/// A rotary matched, before its shapes are proved: x (its widening read
/// where `widen`), how it is turned, the parts of x cut for it (x₁ or xₑ
/// kept, x₂ or x₀ negated), the value to be proved of x's shape where
/// there is one, and the values c and s multiplied in.
struct Found<'a> {
    x: &'a str,
    widen: bool,
    form: Turn,
    parts: (Part, Part),
    of_x_shape: Option<&'a str>,
    tables: [&'a str; 2],
}

/// `Add(Mul(x, c), Mul(r, s))`, r a turn of x.
fn turned<'a>(g: &Graph<'a>, index: usize) -> Check<Found<'a>> {
    let add = pattern::anchor(g, index, "Add")?;
    let (a, b) = (add.input[0].as_str(), add.input[1].as_str());
    // Which product holds turn(x) says which is which. The turn may be
    // widened from f16 or bf16 to f32 before its product, and x then too
    // (OLMo 2's f16 export multiplies in f32): a turn only moves and
    // negates values, so it commutes with the widening exactly.
    let turned_in = |v: &str| turn(g, v).is_some() || widened(g, v).is_some_and(|w| turn(g, w).is_some());
    let turning = |v: &str| g.produced_by(v, "Mul").is_ok_and(|m| g.node(m).input.iter().any(|i| turned_in(i)));
    let (plain, turned) = match (turning(a), turning(b)) {
        (false, true) => (a, b),
        (true, false) => (b, a),
        _ => no_candidate!(),
    };
    let (r, s) = product_with(g, turned, "a turned x", turned_in)?;
    let (r, widen) = match widened(g, r).filter(|w| turn(g, r).is_none() && turn(g, w).is_some()) {
        Some(w) => (w, true),
        None => (r, false),
    };
    let form = turn(g, r).ok_or(crate::graph::Miss::NotCandidate)?;
    let (kept, negated) = match form {
        Turn::Pairs => pairs_turned(g, r)?,
        _ => halves_turned(g, r)?,
    };
    let (x1, x2) = (g.node(kept.0).input[0].as_str(), g.node(negated.0).input[0].as_str());
    require!(g.same_value(x1, x2).is_some(), "the parts turned are not of one value");
    let of_x = |v: &str| match widen {
        true => widened(g, v).is_some_and(|w| g.same_value(w, x1).is_some()),
        false => g.same_value(v, x1).is_some(),
    };
    let what = if widen {
        "the value whose parts are turned, widened as they are"
    } else {
        "the value whose parts are turned"
    };
    let (x, c) = product_with(g, plain, what, of_x)?;
    // The pairs, stacked [..., d/2, 2], merge back in x's shape.
    let of_x_shape = (form == Turn::Pairs).then_some(r);
    Ok(Found { x, widen, form, parts: (kept, negated), of_x_shape, tables: [c, s] })
}

/// The halves turned and written apart (GPT-OSS's `_apply_rotary_emb`):
/// `Concat(x₁·c − x₂·s, x₂·c + x₁·s, axis −1)`, each product and the sum
/// either order, c and s tables of half a head. RotaryEmbedding computes
/// just these, `cos·x₁ − sin·x₂` and `sin·x₁ + cos·x₂`, and reads such
/// tables as its caches as they are.
fn halves_apart<'a>(g: &Graph<'a>, index: usize) -> Check<Found<'a>> {
    let two = g.node(index).input.len() == 2;
    let read = |i: usize, op: &str| g.node(index).input.get(i).and_then(|v| g.produced_by(v, op).ok());
    let (Some(sub), Some(add)) = (read(0, "Sub"), read(1, "Add")) else { no_candidate!() };
    candidate!(two);
    let concat = pattern::anchor(g, index, "Concat")?;
    let product = |v: &str| -> Option<[&'a str; 2]> {
        let m = g.node(g.produced_by(v, "Mul").ok()?);
        (m.input.len() == 2).then(|| [m.input[0].as_str(), m.input[1].as_str()])
    };
    let (sub, add) = (g.node(sub), g.node(add));
    let [Some(first), Some(second), Some(p), Some(q)] =
        [&sub.input[0], &sub.input[1], &add.input[0], &add.input[1]].map(|v| product(v))
    else {
        no_candidate!()
    };
    let same = |a: &str, b: &str| g.same_value(a, b).is_some();
    let pair = |m: [&str; 2], a: &str, b: &str| (same(m[0], a) && same(m[1], b)) || (same(m[0], b) && same(m[1], a));
    let part = |v: &str| -> Option<(Part, &'a str)> {
        let p = g.produced_by(v, "Slice").or_else(|_| g.produced_by(v, "Split")).ok()?;
        Some(((p, g.node(p).output.iter().position(|o| o == v)?), g.node(p).input.first()?.as_str()))
    };
    // x₁·c and x₂·s, each either order, x₁ and x₂ parts of one x; the
    // sum's products then x₂·c and x₁·s.
    let orders = |[a, b]: [&'a str; 2]| [[a, b], [b, a]];
    let found = orders(first)
        .into_iter()
        .flat_map(|[x1, c]| orders(second).map(move |[x2, s]| [x1, c, x2, s]))
        .find_map(|[x1, c, x2, s]| {
            let ((kept, x), (negated, y)) = (part(x1)?, part(x2)?);
            let sum = (pair(p, x2, c) && pair(q, x1, s)) || (pair(q, x2, c) && pair(p, x1, s));
            (sum && same(x, y)).then_some(Found {
                x,
                widen: false,
                form: Turn::HalfTables,
                parts: (kept, negated),
                of_x_shape: Some(&concat.output[0]),
                tables: [c, s],
            })
        });
    let found = found.or_decline(|| "the products are not x₁·c − x₂·s and x₂·c + x₁·s of x's halves".into())?;
    require!(
        on_last_axis(g, concat.attr_int("axis").unwrap_or(0), &concat.output[0]),
        "the rotated halves are not concatenated on the last axis"
    );
    Ok(found)
}

/// The rotary `found` at node `index`, its shapes proved.
fn rotary(g: &Graph, index: usize, found: Found) -> Check<Rewrite> {
    let Found { x, widen, form, parts: (kept, negated), of_x_shape, tables: [c, s] } = found;
    let shapes = g.shapes();
    let elem = g.elem_type(x);
    require!(
        matches!(elem, Some(FLOAT | FLOAT16 | BFLOAT16)),
        "RotaryEmbedding is written for f32, f16 and bf16 (x is {})",
        type_text(elem)
    );
    let sx = shapes.shape(x).filter(|s| s.len() == 4).ok_or_else(|| miss("x is not proved 4-D"))?;
    let d = sx[3].value().filter(|d| d % 2 == 0 && *d > 0);
    let d = d.ok_or_else(|| miss(&format!("the last axis of x ({}) is not a known even number", sx[3])))?;
    match form {
        Turn::Pairs => {
            cut(g, kept.0, 0, d, d, 2)?;
            cut(g, negated.0, 1, d, d, 2)?;
        }
        _ => {
            half(g, kept, 0, d)?;
            half(g, negated, 1, d)?;
        }
    }
    if let Some(v) = of_x_shape {
        let what = if form == Turn::Pairs {
            "turned pairs are not proved to be viewed"
        } else {
            "rotated halves are not proved to be put back"
        };
        require!(shapes.shape(v).as_ref() == Some(&sx), "the {what} in x's shape");
    }
    let table = |v: &str, what: &str| -> Check<Table> {
        let t = match form {
            Turn::Pairs => repeated_table(g, v, what, &sx, d)?,
            _ => proved_table(g, v, what, &sx, d, form)?,
        };
        require!(g.elem_type(&t.rows) == elem, "the {what} table is not of x's type");
        Ok(t)
    };
    let (cos, sin) = (table(c, "cos")?, table(s, "sin")?);
    require!(cos.heads == sin.heads, "the cos and sin tables are broadcast over different axes of x");
    // Heads third: the kernel's 3-D input, which needs their number.
    let h = match cos.heads {
        1 => None,
        _ => Some(sx[2].value().ok_or_else(|| miss(&format!("the heads of x ({}) are not a known number", sx[2])))?),
    };

    let mut m = Match::new(index);
    // A table's repeat or Unsqueeze stays where something else reads it
    // (a table the kernel reads itself stays as it is).
    for (value, table) in [(c, &cos), (s, &sin)] {
        if table.rows != value {
            m.keep(Kept::Shared(value.to_string()));
        }
    }
    let mut prelude = Vec::new();
    // Widened, the kernel reads x's widening made anew before it (the
    // model's Cast goes with the product that reads it), and x's batch is
    // read at the value widened.
    let (x_read, x_source) = match widened(g, x).filter(|_| widen) {
        Some(source) => {
            let wide = format!("{source}/widened");
            prelude.push(writing(&wide, node("Cast", &[source], vec![AttributeProto::int("to", i64::from(FLOAT))])));
            (wide, source)
        }
        None => (x.to_string(), x),
    };
    // The cache of a table: its rows (the first half of them for halves);
    // repeated over x's batch where it has one row of sequences (ONNX
    // Runtime's kernel takes caches of x's batch).
    let cache = |prelude: &mut Vec<NodeProto>, t: &Table| -> String {
        let rows = if t.squeezed {
            let (axes, rows) = (format!("{}/heads_axis", t.rows), format!("{}/rows", t.rows));
            prelude.push(ints_constant(&axes, &[t.heads as i64]));
            prelude.push(writing(&rows, node("Squeeze", &[&t.rows, &axes], vec![])));
            rows
        } else {
            t.rows.clone()
        };
        // The first of the last axis's halves, or every second value:
        // `{rows}/{what}`.
        let cut = |prelude: &mut Vec<NodeProto>, rows: &str, what: &str, end: i64, step: Option<i64>| {
            let at = |part: &str| format!("{rows}/{what}{part}");
            let mut inputs = vec![rows.to_string(), at("_start"), at("_end"), at("_axis")];
            prelude.push(ints_constant(&inputs[1], &[0]));
            prelude.push(ints_constant(&inputs[2], &[end]));
            prelude.push(ints_constant(&inputs[3], &[-1]));
            if let Some(step) = step {
                inputs.push(at("_step"));
                prelude.push(ints_constant(&inputs[4], &[step]));
            }
            let inputs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            prelude.push(writing(&at(""), node("Slice", &inputs, vec![])));
            at("")
        };
        let rows = match form {
            Turn::Pairs if t.every_second => cut(prelude, &rows, "pairs", d, Some(2)),
            Turn::Pairs | Turn::HalfTables => rows,
            Turn::Halves => cut(prelude, &rows, "half", d / 2, None),
        };
        if !t.one {
            return rows;
        }
        let (batch, ones, shape, out) =
            (format!("{x}/batch"), format!("{}/ones", t.rows), format!("{x}/batch_shape"), format!("{rows}_per_batch"));
        let first = vec![AttributeProto::int("start", 0), AttributeProto::int("end", 1)];
        prelude.push(writing(&batch, node("Shape", &[x_source], first)));
        prelude.push(ints_constant(&ones, &[1, 1]));
        prelude.push(writing(&shape, node("Concat", &[&batch, &ones], vec![AttributeProto::int("axis", 0)])));
        prelude.push(writing(&out, node("Expand", &[&rows, &shape], vec![])));
        out
    };
    let (cos_cache, sin_cache) = (cache(&mut prelude, &cos), cache(&mut prelude, &sin));
    g.require_opset(23, "RotaryEmbedding")?;
    let mut attributes = Vec::new();
    if form == Turn::Pairs {
        attributes.push(AttributeProto::int("interleaved", 1));
    }
    let Some(h) = h else {
        let rotary = node("RotaryEmbedding", &[&x_read, &cos_cache, &sin_cache], attributes);
        return Ok(m.replace_with(rotary).after(prelude).needing_opset(23));
    };
    // x's last two axes merged, the result viewed back.
    let (shape, merged) = (format!("{x}/merged_heads_shape"), format!("{x}/merged_heads"));
    prelude.push(ints_constant(&shape, &[0, 0, h * d]));
    prelude.push(writing(&merged, node("Reshape", &[&x_read, &shape], vec![])));
    attributes.push(AttributeProto::int("num_heads", h));
    let rotary = node("RotaryEmbedding", &[&merged, &cos_cache, &sin_cache], attributes);
    let inner = format!("{}/merged_heads", g.node(index).output[0]);
    Ok(m.replace_with(rotary).after(prelude).needing_opset(23).viewed_as(&inner, &[0, 0, h, d]))
}

/// The axis of x's heads and of its sequence a table `[.., ..]` with a
/// one at `heads` is broadcast over: heads second (`[b, h, s, d]`) or
/// third (`[b, s, h, d]`).
fn sequence_axis(heads: usize) -> usize {
    3 - heads
}

/// Whether a table's rows `[B, S, k]` are of x's batch (or one row) and
/// sequence, and their last axis `k`: Some(one row) where they are.
fn rows_fit(rows: &[Dim], sx: &[Dim], heads: usize, k: i64) -> Option<bool> {
    let [b, s, last] = rows else { return None };
    let batch = *b == sx[0] || b.value() == Some(1);
    (batch && *s == sx[sequence_axis(heads)] && last.value() == Some(k)).then_some(*b != sx[0])
}

/// A table whose rows are proved alike as `form` turns x (`rows_proved`:
/// each half the other, or each value twice in place): `Unsqueeze(t,
/// heads axis)` with t `[b or 1, s, d]`, its rows t; or any other 4-D
/// table `[b or 1, 1, s, d]` or `[b or 1, s, 1, d]` (ESM slices its cached
/// `[1, 1, max, d]` to the sequence), its rows the table with the one
/// squeezed out. The kernel reads the first half of rows of halves, every
/// second value of rows of pairs.
fn proved_table(g: &Graph, v: &str, what: &str, sx: &[Dim], d: i64, form: Turn) -> Check<Table> {
    let shapes = g.shapes();
    let unsqueezed = g.produced_by(v, "Unsqueeze").ok().and_then(|u| {
        let heads = match g.ints_argument(g.node(u), "axes", 1, 13) {
            IntsArgument::Known(axes) if axes == [1] || axes == [2] => axes[0] as usize,
            _ => return None,
        };
        Some((g.node(u).input[0].as_str(), heads))
    });
    // (Tables of half a head are the caches themselves.)
    let (k, last) = if form == Turn::HalfTables { (d / 2, "d/2") } else { (d, "d") };
    let (rows, heads, squeezed) = match unsqueezed {
        Some((t, heads)) => (t, heads, false),
        None => (v, heads_of(shapes.shape(v), sx, k).map_or(1, |(heads, _)| heads), true),
    };
    let one = without_heads(shapes.shape(rows), squeezed, heads).and_then(|rows| rows_fit(&rows, sx, heads, k));
    let one =
        one.ok_or_else(|| miss(&format!("the {what} table is not proved [b or 1, s, {last}] of x's b, s and d")))?;
    let (proved, unread) = (|| rows_proved(g, rows, form, 16), unread(g, rows));
    match form {
        Turn::Halves => require!(proved(), "the two halves of the {what} table are not proved equal{unread}"),
        Turn::Pairs => {
            require!(proved(), "the {what} table is not proved a repeat of each value twice on the last axis{unread}")
        }
        Turn::HalfTables => {}
    }
    Ok(Table { rows: rows.to_string(), one, heads, squeezed, every_second: form == Turn::Pairs })
}

/// An interleaved table: `repeat_interleave(rows, 2)` on the last axis,
/// broadcast over x's heads, as exporters write it:
/// `Reshape(Tile(u, [1, 1, 1, 1, 2]))`, `Reshape(Expand(u, …))` or
/// `Reshape(Concat(u, u, axis −1))`, u the rows `[b or 1, s, d/2]` (or a
/// 4-D value with a one at the heads axis) unsqueezed to `[.., .., .., d/2,
/// 1]` with a one at the heads axis. The Reshape merges the last two axes:
/// c[…, 2i + j] = rows[…, i]. Or a constant whose every value is repeated
/// twice in place: its rows are every second value.
fn repeated_table(g: &Graph, v: &str, what: &str, sx: &[Dim], d: i64) -> Check<Table> {
    let shapes = g.shapes();
    // A constant table (a static export's) whose every value is repeated
    // twice in place: its rows are every second value.
    if let Some(t) = g.constant(v) {
        let st = Some(t.dims.iter().map(|&n| Dim::known(n)).collect());
        let (heads, one) = heads_of(st, sx, d)
            .ok_or_else(|| miss(&format!("the {what} table is not proved [b or 1, 1, s, d] or [b or 1, s, 1, d]")))?;
        let pairs = rows_alike(g, t, |row| row.chunks(2).all(|pair| pair[0] == pair[1]));
        require!(pairs, "the {what} table is not proved a repeat of each value twice on the last axis{}", unread(g, v));
        return Ok(Table { rows: v.to_string(), one, heads, squeezed: true, every_second: true });
    }
    // Otherwise than a Reshape of a repeat, the rows are proved alike
    // through whatever computes them (`rows_proved`).
    let repeat = g.produced_by(v, "Reshape").ok().and_then(|r| Some((r, g.computing(&g.node(r).input[0]).ok()?)));
    let Some((reshape, step)) =
        repeat.filter(|&(_, step)| ["Tile", "Expand", "Concat"].contains(&g.node(step).op_type()))
    else {
        return proved_table(g, v, what, sx, d, Turn::Pairs);
    };
    let repeated = g.node(reshape).input[0].as_str();
    let step = g.node(step);
    // Tiled, expanded, or stacked with themselves (RoFormer's `stack([t,
    // t], -1)`); its op first: another producer may read nothing (a
    // constant table, `Reshape(Constant)`).
    let stacked = step.is("Concat")
        && step.input.len() == 2
        && on_last_axis(g, step.attr_int("axis").unwrap_or(0), repeated)
        && g.same_value(&step.input[0], &step.input[1]).is_some();
    require!(
        step.is("Tile") || step.is("Expand") || stacked,
        "the {what} table is repeated by {}, not Tile or Expand (nor a Concat of one value twice)",
        step.op_type()
    );
    let u = step.input[0].as_str();
    let (st, sr, su) = (shapes.shape(v), shapes.shape(repeated), shapes.shape(u));
    let (Some(st), Some(sr), Some(su)) = (st, sr, su) else {
        decline!("the shapes of the {what} table's repeat are not proved")
    };
    let heads = match (&st[..], st.len()) {
        (t, 4) if t[1].value() == Some(1) => 1,
        (t, 4) if t[2].value() == Some(1) => 2,
        _ => decline!("the {what} table is not proved [b or 1, 1, s, d] or [b or 1, s, 1, d]"),
    };
    // u [.., .., .., d/2, 1] → repeated [.., .., .., d/2, 2] → c [.., .., .., d].
    let pairs = su.len() == 5
        && sr.len() == 5
        && su[..4] == sr[..4]
        && su[..3] == st[..3]
        && su[3].value() == Some(d / 2)
        && su[4].value() == Some(1)
        && sr[4].value() == Some(2)
        && st[3].value() == Some(d);
    require!(pairs, "the {what} table is not proved a repeat of each value twice on the last axis");
    if step.is("Tile") {
        let reps = g.constant(&step.input[1]).and_then(|t| t.ints());
        require!(reps.as_deref() == Some(&[1, 1, 1, 1, 2]), "the {what} table's Tile repeats more than its last axis");
    }
    // Unsqueezes only add axes of one: the rows are u's values in order,
    // down to rank 3, or to a 4-D table computed otherwise whose one at
    // the heads axis is squeezed out (RoFormer's half of its positions).
    let mut rows = u;
    while shapes.rank(rows) != Some(3) {
        match g.produced_by(rows, "Unsqueeze") {
            Ok(p) => rows = g.node(p).input[0].as_str(),
            Err(_) if shapes.rank(rows) == Some(4) => break,
            Err(miss) => return Err(miss),
        }
    }
    let squeezed = shapes.rank(rows) == Some(4);
    let one = without_heads(shapes.shape(rows), squeezed, heads).and_then(|r| rows_fit(&r, sx, heads, d / 2));
    let one =
        one.ok_or_else(|| miss(&format!("the {what} table's rows are not proved [b or 1, s, d/2] of x's b, s and d")))?;
    Ok(Table { rows: rows.to_string(), one, heads, squeezed, every_second: false })
}

/// A table's rows' shape: `shape` itself, or where `squeezed` the 4-D
/// shape with its one at the heads axis removed.
fn without_heads(shape: Option<Vec<Dim>>, squeezed: bool, heads: usize) -> Option<Vec<Dim>> {
    let mut rows = shape?;
    let one_at_heads = !squeezed || (rows.len() == 4 && rows.remove(heads).value() == Some(1));
    one_at_heads.then_some(rows)
}

/// The heads axis (1, else 2) at which a 4-D table of `shape` has a one
/// and rows that fit x's (`rows_fit`, their last axis `k`), and whether
/// it has one batch row.
fn heads_of(shape: Option<Vec<Dim>>, sx: &[Dim], k: i64) -> Option<(usize, bool)> {
    [1, 2].into_iter().find_map(|h| Some((h, rows_fit(&without_heads(shape.clone(), true, h)?, sx, h, k)?)))
}

/// Why a constant table's values were not read, where they were not: in
/// external data, and not among the small tensors read there
/// (`Graph::values_of`).
fn unread(g: &Graph, table: &str) -> &'static str {
    match g.constant(table).filter(|t| t.is_external() && g.values_of(t).is_none()) {
        Some(_) => " (a constant in external data, too large to read for the proof or not readable)",
        None => "",
    }
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

/// How `value` turns x, if it is a turn.
fn turn(g: &Graph, value: &str) -> Option<Turn> {
    if half_turn(g, value) {
        return Some(Turn::Halves);
    }
    let stacked = g.produced_by(value, "Reshape").and_then(|r| g.produced_by(&g.node(r).input[0], "Concat"));
    let first_negated = stacked.is_ok_and(|c| {
        let concat = g.node(c);
        let unsqueezed = g.produced_by(&concat.input[0], "Unsqueeze");
        concat.input.len() == 2 && unsqueezed.is_ok_and(|u| g.produced_by(&g.node(u).input[0], "Neg").is_ok())
    });
    first_negated.then_some(Turn::Pairs)
}

/// `value` as `Cast(w)` widening f16 or bf16 to f32, which is exact: w.
fn widened<'a>(g: &Graph<'a>, value: &str) -> Option<&'a str> {
    let cast = g.node(g.produced_by(value, "Cast").ok()?);
    let w = cast.input[0].as_str();
    let exact = matches!(g.elem_type(w), Some(FLOAT16 | BFLOAT16)) && pattern::cast_to(cast) == Some(FLOAT);
    exact.then_some(w)
}

/// Whether `value` is `Concat(Neg(…), …)`: a half turn.
fn half_turn(g: &Graph, value: &str) -> bool {
    g.produced_by(value, "Concat").is_ok_and(|c| {
        let concat = g.node(c);
        concat.input.len() == 2 && g.produced_by(&concat.input[0], "Neg").is_ok()
    })
}

/// Whether `axis` of `node` is the last axis of `value`.
fn on_last_axis(g: &Graph, axis: i64, value: &str) -> bool {
    axis == -1 || g.shapes().rank(value).is_some_and(|n| axis == n as i64 - 1)
}

/// A part of x cut by a node and the node's output that is the part:
/// a Slice's, or one of a Split's.
type Part = (usize, usize);

/// `Concat(Neg(x₂), x₁, axis −1)`: the parts x₁ and x₂, each a Slice of x
/// or one of the two parts of a Split of x (`x.chunk(2, -1)`, as ESM's
/// `rotate_half` writes it).
fn halves_turned(g: &Graph, r: &str) -> Check<(Part, Part)> {
    let concat = g.node(g.produced_by(r, "Concat")?);
    require!(concat.input.len() == 2, "the half turn is no Concat of two parts");
    require!(
        on_last_axis(g, concat.attr_int("axis").unwrap_or(0), r),
        "the half turn is not concatenated on the last axis"
    );
    let neg = g.node(g.produced_by(&concat.input[0], "Neg")?);
    let part = |v: &str| -> Check<Part> {
        let p = g.produced_by(v, "Slice").or_else(|_| g.produced_by(v, "Split"));
        let p = p.map_err(|_| miss(&format!("{v} is not cut from x by a Slice or a Split")))?;
        Ok((p, g.node(p).output.iter().position(|o| o == v).unwrap_or_default()))
    };
    Ok((part(&concat.input[1])?, part(&neg.input[0])?))
}

/// Part `(node, output)` is half `i` of the last axis of x (of `d`):
/// `[i·d/2, (i+1)·d/2)`, cut by a Slice (`cut`), or output i of a Split
/// of the last axis into two parts proved d/2 long each (a Split keeps
/// the axis's order).
fn half(g: &Graph, (p, output): Part, i: i64, d: i64) -> Check<()> {
    let node = g.node(p);
    if node.is("Slice") {
        return cut(g, p, i * d / 2, (i + 1) * d / 2, d, 1);
    }
    let halves = node.output.len() == 2
        && on_last_axis(g, node.attr_int("axis").unwrap_or(0), &node.input[0])
        && node.output.iter().all(|o| g.shapes().shape(o).and_then(|s| s.last()?.value()) == Some(d / 2));
    require!(halves, "Split {} does not cut the last axis of {d} into two halves", node.name());
    require!(output as i64 == i, "Split {}'s part {output} is read as half {i} of the last axis", node.name());
    Ok(())
}

/// `Reshape(Concat(Unsqueeze(Neg(x₀), −1), Unsqueeze(xₑ, −1), axis −1))`,
/// each pair (−x₀, xₑ) stacked on a new last axis: the Slices computing
/// xₑ and x₀. That the Reshape merges the last two axes back is the
/// caller's to prove (x's shape).
fn pairs_turned(g: &Graph, r: &str) -> Check<(Part, Part)> {
    let stack = g.node(g.produced_by(r, "Reshape")?).input[0].as_str();
    let concat = g.node(g.produced_by(stack, "Concat")?);
    require!(concat.input.len() == 2, "the pairs are no Concat of two parts");
    require!(
        on_last_axis(g, concat.attr_int("axis").unwrap_or(0), stack),
        "the pairs are not stacked on the last axis"
    );
    let part = |v: &str| -> Check<&str> {
        let u = g.node(g.produced_by(v, "Unsqueeze")?);
        let last = match g.ints_argument(u, "axes", 1, 13) {
            IntsArgument::Known(axes) => matches!(axes[..], [a] if on_last_axis(g, a, v)),
            _ => false,
        };
        require!(last, "the pairs are not stacked on a new last axis");
        Ok(u.input[0].as_str())
    };
    let neg = g.node(g.produced_by(part(&concat.input[0])?, "Neg")?);
    Ok(((g.produced_by(part(&concat.input[1])?, "Slice")?, 0), (g.produced_by(&neg.input[0], "Slice")?, 0)))
}

/// Slice `slice` cuts `[from, to)` of the last axis (of `d`) by `step`
/// and nothing else: one axis, the last (−1 or 3 of 4); an end at or past
/// d is d.
fn cut(g: &Graph, slice: usize, from: i64, to: i64, d: i64, step: i64) -> Check<()> {
    let node = g.node(slice);
    let [starts, ends, axes, steps] = crate::graph::fold::slice_arguments(g, &g.shapes(), node)
        .ok_or_else(|| miss(&format!("Slice {} cuts where its arguments are computed at run time", node.name())))?;
    let end_fits = |e: i64| if to == d { e >= d } else { e == to };
    let fits = matches!((&starts[..], &ends[..], &axes[..], &steps[..]),
        ([s], [e], [-1 | 3], [k]) if *s == from && end_fits(*e) && *k == step);
    let by = if step == 1 { String::new() } else { format!(" by {step}") };
    require!(fits, "Slice {} does not cut [{from}, {to}){by} of the last axis of {d}", node.name());
    Ok(())
}

/// Whether the rows (the last axis) of `value` are alike as `form` turns
/// x: each half the other, or each value twice in place. Each half the
/// other: a Concat of a value with itself on the last axis. Each value
/// twice: a repeat merged back (`repeated_in_place`), or torch's general
/// `repeat_interleave` (`gathered_in_pairs`). Either through elementwise
/// ops (and products with one value) and ops that keep rows whole
/// (`keeps_rows`), or a constant whose rows are so (a static export's
/// table).
fn rows_proved(g: &Graph, value: &str, form: Turn, depth: usize) -> bool {
    if let Some(t) = g.constant(value) {
        return match form {
            Turn::Halves => rows_alike(g, t, |row| row[..row.len() / 2] == row[row.len() / 2..]),
            Turn::Pairs => rows_alike(g, t, |row| row.chunks(2).all(|pair| pair[0] == pair[1])),
            Turn::HalfTables => true,
        };
    }
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
        return rows_proved(g, x, form, depth - 1);
    }
    match (node.op_type(), form) {
        (op, _) if UNARY.contains(&op) && node.input.len() == 1 => rows_proved(g, &node.input[0], form, depth - 1),
        ("Mul" | "Div" | "Add" | "Sub", _) if node.input.len() == 2 => {
            let one_value = |v: &str| g.one_value(v).is_some();
            (one_value(&node.input[1]) && rows_proved(g, &node.input[0], form, depth - 1))
                || (node.is("Mul") || node.is("Add"))
                    && one_value(&node.input[0])
                    && rows_proved(g, &node.input[1], form, depth - 1)
        }
        ("Concat", Turn::Halves) if node.input.len() == 2 => {
            on_last_axis(g, node.attr_int("axis").unwrap_or(0), value)
                && g.same_value(&node.input[0], &node.input[1]).is_some()
        }
        _ if keeps_rows(g, p) => rows_proved(g, &node.input[0], form, depth - 1),
        ("Reshape" | "Flatten", Turn::Pairs) => repeated_in_place(g, node),
        ("Transpose", Turn::Pairs) => gathered_in_pairs(g, node),
        _ => false,
    }
}

/// `Reshape(r)` (or a Flatten) to a last axis of even length, of r whose
/// last axis holds each value twice: r `[…, 2]` a Tile or an Expand of
/// u `[…, 1]`, or `Concat(u, u)` on that axis. The reshape keeps the
/// elements' order, so each pair of its rows is one value of u.
fn repeated_in_place(g: &Graph, reshape: &NodeProto) -> bool {
    let shapes = g.shapes();
    let last = |v: &str| shapes.shape(v).and_then(|s| s.last()?.value());
    let Some(step) = reshape.input.first().and_then(|r| g.computing(r).ok()).map(|p| g.node(p)) else { return false };
    let Some(u) = step.input.first() else { return false };
    let twice = match step.op_type() {
        "Tile" | "Expand" => true,
        "Concat" => {
            step.input.len() == 2
                && on_last_axis(g, step.attr_int("axis").unwrap_or(0), u)
                && g.same_value(&step.input[0], &step.input[1]).is_some()
        }
        _ => false,
    };
    twice
        && last(u) == Some(1)
        && last(&reshape.input[0]) == Some(2)
        && last(&reshape.output[0]).is_some_and(|n| n % 2 == 0)
}

/// torch's general `repeat_interleave(t, 2, dim)`, as its TorchScript
/// export writes it: `Transpose(GatherND(Expand(Unsqueeze(t′, 1)),
/// Transpose(NonZero(m))), perm)`, t′ t with `dim` moved first, m `[n, 2]`
/// (`arange(2) < repeats`) proved to hold no zero. NonZero lists every
/// index of m in row-major order, (i, j) as row 2i + j, and the gathered
/// row 2i + j is t′'s row i (the Expand only repeats the Unsqueeze's one):
/// rows 2i and 2i + 1 are alike, and the Transpose, whose `perm` ends in
/// 0, makes them the pairs of the last axis.
fn gathered_in_pairs(g: &Graph, transpose: &NodeProto) -> bool {
    let shapes = g.shapes();
    let first_last = transpose.attr_ints("perm").is_none_or(|p| p.last() == Some(&0));
    let Ok(gather) = g.produced_by(&transpose.input[0], "GatherND").map(|p| g.node(p)) else { return false };
    let (data, indices) = (gather.input[0].as_str(), gather.input.get(1).map_or("", String::as_str));
    let listed = g
        .produced_by(indices, "Transpose")
        .ok()
        .map(|t| g.node(t))
        .filter(|t| t.attr_ints("perm").is_none_or(|p| p == [1, 0]) && shapes.rank(&t.input[0]) == Some(2));
    let mask = listed.and_then(|t| Some(g.node(g.produced_by(&t.input[0], "NonZero").ok()?).input[0].as_str()));
    let every_pair = mask.is_some_and(|m| {
        let pairs = shapes.shape(m).is_some_and(|s| s.len() == 2 && s[1].value() == Some(2));
        pairs && values_held(g, &shapes, m).is_some_and(|held| held.iter().all(|&v| v != 0.0))
    });
    let expanded = g.produced_by(data, "Expand").map_or(data, |e| g.node(e).input[0].as_str());
    let one_at_1 = g
        .produced_by(expanded, "Unsqueeze")
        .is_ok_and(|u| matches!(g.ints_argument(g.node(u), "axes", 1, 13), IntsArgument::Known(axes) if axes == [1]));
    let same_rank = shapes.rank(expanded).is_some() && shapes.rank(expanded) == shapes.rank(data);
    first_last && gather.attr_int("batch_dims").unwrap_or(0) == 0 && every_pair && one_at_1 && same_rank
}

/// Whether every row (last axis, of even length) of a small constant is
/// `alike`, on its values' bits.
fn rows_alike(g: &Graph, t: &TensorProto, alike: impl Fn(&[u64]) -> bool) -> bool {
    let Some(&last) = t.dims.last() else { return false };
    let small = t.numel().is_some_and(|n| n <= 1 << 20);
    let Some(values) = g.values_of(t).filter(|_| small && last > 0 && last % 2 == 0) else { return false };
    let bits: Vec<u64> = values.iter().map(|v| v.to_bits()).collect();
    bits.chunks(last as usize).all(alike)
}

/// Whether node `p` computes each row of its output (its last axis) as a
/// row of its first input, whole and in order: a Reshape, Unsqueeze,
/// Squeeze or Expand whose input and output have one last axis (a
/// reshape keeps the elements' order; an expand repeats whole rows), a
/// Slice whose axes are constants other than the last, a Gather on
/// another axis.
fn keeps_rows(g: &Graph, p: usize) -> bool {
    let node = g.node(p);
    let shapes = g.shapes();
    let (Some(x), Some(out)) = (node.input.first(), node.output.first()) else { return false };
    let last = |v: &str| shapes.shape(v).and_then(|s| s.last()?.value());
    let rank = |v: &str| shapes.rank(v).map(|r| r as i64);
    match node.op_type() {
        "Reshape" | "Unsqueeze" | "Squeeze" | "Expand" => last(x).is_some() && last(x) == last(out),
        "Slice" if g.opset >= 10 => {
            let axes = node.input.get(3).and_then(|a| g.constant(a)).and_then(|t| t.ints());
            let rank = rank(x);
            axes.zip(rank).is_some_and(|(axes, r)| !axes.is_empty() && axes.iter().all(|&a| a != -1 && a != r - 1))
        }
        "Gather" => {
            let axis = node.attr_int("axis").unwrap_or(0);
            rank(x).is_some_and(|r| axis != -1 && axis != r - 1 && (-r..r).contains(&axis))
        }
        _ => false,
    }
}
