//! The forms each pass accepts, built at random and mutated: every case
//! says what was done to it and whether the mutation keeps the rewrite
//! exact (`Fuse`), breaks it (`NoFuse`), or may go either way (`Either`).

use onnx_fuse::onnx::{ModelProto, BFLOAT16, BOOL, DOUBLE, FLOAT, FLOAT16, INT64};

use crate::common::build::{
    attr_float, attr_graph, attr_int, attr_ints, attr_string, gathered_pairs, sym, tensor, value_info, Builder,
    Gathered, D,
};

/// What the mutations make of the rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Equivalent by construction: refusing it is a refused equivalent.
    Fuse,
    /// Not the same function (or not provable): fusing it is a false fusion.
    NoFuse,
    /// Depends on what a runtime accepts; only ONNX Runtime's verdict counts.
    Either,
}

pub struct Case {
    pub what: Vec<String>,
    pub expect: Expect,
    /// False where the portable target's operator cannot say the form
    /// (its opset aside, which the campaign checks).
    pub portable: bool,
    pub model: ModelProto,
}

/// Cases depend on their seed only.
pub struct Rng(onnx_fuse::verify::SplitMix);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(onnx_fuse::verify::SplitMix(seed ^ 0x5eed_f0f0_1234_abcd))
    }

    fn next(&mut self) -> u64 {
        self.0.next()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.0.uniform() <= p
    }

    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

/// The case being built: its notes and expectation.
struct Ctx {
    what: Vec<String>,
    expect: Expect,
    portable: bool,
    /// Values and initializers a correct rewrite need not remove: another
    /// reader of one, or a second definition of it, changes nothing (a
    /// constant computed for the match, a beta that stays outside it).
    /// A bias a rewrite folds in where it can is aside too: where a second
    /// definition blocks the fold, the driver takes the form that leaves
    /// its Add as it is.
    aside: Vec<String>,
    /// Weights a rewrite can leave outside the match (a LayerNorm's gamma
    /// or beta over a known last axis: LayerNormalization with a scale of
    /// ones, or without its bias, and the Mul or Add after it): a second
    /// definition of one may block the whole fusion or only that part.
    may_stay: Vec<String>,
    /// Of `aside`, values the portable target's operator may read (SDPA's
    /// scales on q and the key, taken into `Attention`'s scale where it
    /// can): a second definition of one may leave that form unprovable.
    portable_reads: Vec<String>,
    /// How many trailing axes the norm's ReduceMeans reduce (a LayerNorm
    /// over several axes), and whether one already reduces one axis more
    /// or fewer (a second such mutant would make the two agree again).
    over: usize,
    axes_mutated: bool,
}

impl Ctx {
    fn new() -> Self {
        Ctx {
            what: vec![],
            expect: Expect::Fuse,
            portable: true,
            aside: vec![],
            may_stay: vec![],
            portable_reads: vec![],
            over: 1,
            axes_mutated: false,
        }
    }

    fn note(&mut self, s: impl Into<String>) {
        self.what.push(s.into());
    }

    /// A form only the ort target's operator computes.
    fn ort_only(&mut self, s: impl Into<String>) {
        self.note(s);
        self.portable = false;
    }

    /// A mutation that makes the rewrite wrong or unprovable.
    fn breaks(&mut self, s: impl Into<String>) {
        self.note(s);
        self.expect = Expect::NoFuse;
    }

    /// A mutation whose effect only a runtime can tell.
    fn unsure(&mut self, s: impl Into<String>) {
        self.note(s);
        if self.expect == Expect::Fuse {
            self.expect = Expect::Either;
        }
    }
}

/// The hidden size the weights have.
const HIDDEN: i64 = 4;

/// x's shape: leading dims at random, the last one as the case decides.
fn x_shape(rng: &mut Rng, c: &mut Ctx, rank: usize) -> (Option<Vec<D>>, D) {
    let mut dims: Vec<D> =
        (0..rank - 1).map(|i| rng.pick(&[D::N(2), D::N(1), sym(["b", "s"][i % 2]), D::Unknown])).collect();
    let last = match rng.below(16) {
        0 => {
            c.note("x's last axis is symbolic");
            sym("d")
        }
        1 => {
            c.note("x's last axis is unknown");
            D::Unknown
        }
        2 => {
            c.note("x's shape is not declared");
            return (None, D::Unknown);
        }
        3 => {
            c.note("x's last axis is 1");
            D::N(1)
        }
        _ => D::N(HIDDEN),
    };
    dims.push(last.clone());
    (Some(dims), last)
}

/// A one-value constant of `elem` type with `rank` axes, as an initializer
/// or a Constant node.
fn one_value(rng: &mut Rng, b: &mut Builder, name: &str, elem: i32, rank: usize, v: f64) -> String {
    let t = tensor(elem, &vec![1; rank], &[v]);
    if rng.chance(0.5) {
        b.init(name, t)
    } else {
        b.constant(t)
    }
}

/// A constant's rank: usually 0 or 1; above x's rank it raises the result's.
fn scalar_rank(rng: &mut Rng, c: &mut Ctx, what: &str, x_rank: Option<usize>) -> usize {
    let rank = rng.pick(&[0, 0, 0, 0, 0, 1, 1, 1, 2, 3, 5]);
    if rank > 1 {
        match x_rank {
            Some(r) if rank <= r => c.note(format!("{what} has rank {rank}")),
            _ => c.breaks(format!("{what} has rank {rank}, more than x's")),
        }
    }
    rank
}

/// A mask over the scores' last two axes: a float input `keep_src` and the
/// bool `keep_src > 0` (true where a key is kept).
fn bool_mask(b: &mut Builder, rank: usize) -> (String, String) {
    let km = b.input("keep_src", FLOAT, Some(&[D::N(1), D::N(1), sym("s"), sym("t")][4 - rank..]));
    let zero = b.init("zero", tensor(FLOAT, &[], &[0.0]));
    let keep = b.node("Greater", &[&km, &zero], vec![]);
    (km, keep)
}

/// `Op(a, b)` with the operands in random order.
fn commuted(rng: &mut Rng, b: &mut Builder, op: &str, x: &str, y: &str) -> String {
    if rng.chance(0.5) {
        b.node(op, &[x, y], vec![])
    } else {
        b.node(op, &[y, x], vec![])
    }
}

/// ReduceMean over the last `c.over` axes (axes as the opset wants them,
/// negative, positive where the rank is declared, in any order), or a mutant.
fn reduce_mean(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    opset: i64,
    x: &str,
    rank: usize,
    declared: bool,
) -> String {
    let k = c.over as i64;
    let mut axes: Option<Vec<i64>> = Some((-k..0).collect());
    if k > 1 {
        let axes = axes.as_mut().expect("axes");
        if rng.chance(0.3) {
            c.note("the last axes in another order");
            axes.reverse();
        }
        if declared && rng.chance(0.3) {
            c.note("the last axes counted from the front");
            axes.iter_mut().for_each(|a| *a += rank as i64);
        }
    }
    match rng.below(24) {
        0 if rank > 1 => {
            c.breaks("ReduceMean over axis 0");
            axes = Some(vec![0]);
        }
        1 if k == 1 => {
            if declared {
                c.note("ReduceMean over axis rank-1");
            } else {
                c.breaks("ReduceMean over axis rank-1, rank unknown");
            }
            axes = Some(vec![rank as i64 - 1]);
        }
        1 if !c.axes_mutated => {
            c.breaks("ReduceMean over fewer axes than the other");
            c.axes_mutated = true;
            axes = Some((1 - k..0).collect());
        }
        2 => {
            if rank == 1 {
                c.breaks("ReduceMean with no axes (all axes; rank 1: the last; refused)");
            } else {
                c.breaks("ReduceMean with no axes (all axes)");
            }
            axes = None;
        }
        3 if rank > c.over && !c.axes_mutated => {
            c.breaks(format!("ReduceMean over {} axes", k + 1));
            c.axes_mutated = true;
            axes = Some((-k - 1..0).collect());
        }
        _ => {}
    }
    let mut attributes = vec![];
    if rng.chance(0.1) {
        c.breaks("ReduceMean keepdims 0");
        attributes.push(attr_int("keepdims", 0));
    }
    if axes.is_none() && opset >= 18 && rng.chance(0.5) {
        c.breaks("ReduceMean noop_with_empty_axes (no reduction)");
        attributes.push(attr_int("noop_with_empty_axes", 1));
    }
    match axes {
        Some(axes) if opset >= 18 => {
            let a =
                b.constant(tensor(INT64, &[axes.len() as i64], &axes.iter().map(|&v| v as f64).collect::<Vec<_>>()));
            b.node("ReduceMean", &[x, &a], attributes)
        }
        Some(axes) => {
            attributes.push(attr_ints("axes", &axes));
            b.node("ReduceMean", &[x], attributes)
        }
        None => b.node("ReduceMean", &[x], attributes),
    }
}

/// `x / sqrt(mean(x²) + eps)` in one of its forms; returns the normalized value.
fn rms_core(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    opset: i64,
    x: &str,
    elem: i32,
    rank: usize,
    declared: bool,
) -> String {
    let x_rank = declared.then_some(rank);
    // The square's copy of x: x itself, or computed again by identical nodes.
    let sx = match rng.below(8) {
        0 => {
            c.note("the square reads Identity(x)");
            b.node("Identity", &[x], vec![])
        }
        1 => {
            c.breaks("the square reads Neg(x)");
            b.node("Neg", &[x], vec![])
        }
        _ => x.to_string(),
    };
    let square = if rng.chance(0.3) {
        c.note("square as Mul(x, x)");
        b.node("Mul", &[&sx, &sx], vec![])
    } else {
        let e_elem = rng.pick(&[elem, elem, INT64]);
        let exponent: f64 = match rng.below(12) {
            0 => {
                c.breaks("exponent 3");
                3.0
            }
            // A value its type holds exactly, other than 2.
            1 if e_elem != INT64 => {
                c.breaks("exponent 2.5");
                2.5
            }
            1 if e_elem == FLOAT => {
                c.breaks("exponent 2.0001");
                2.0001
            }
            _ => 2.0,
        };
        let r = scalar_rank(rng, c, "the exponent", x_rank);
        // dynamo's fp16 exports: `Cast(2.0 → f16)`, for exponents every
        // float type holds exactly (2.0001 is 2 in f16).
        let e = if exponent != 2.0001 && rng.chance(0.15) {
            c.note("the exponent a Cast of a constant");
            let types: &[i32] = if exponent.fract() == 0.0 { &[DOUBLE, FLOAT, INT64] } else { &[DOUBLE, FLOAT] };
            let source = rng.pick(types);
            let from = one_value(rng, b, "exponent_source", source, r, exponent);
            let cast = b.node("Cast", &[&from], vec![attr_int("to", i64::from(elem))]);
            // A constant computed for the match: another reader keeps it.
            c.aside.push(cast.clone());
            cast
        } else {
            one_value(rng, b, "exponent", e_elem, r, exponent)
        };
        b.node("Pow", &[&sx, &e], vec![])
    };
    let mean = reduce_mean(rng, c, b, opset, &square, rank, declared);
    let added = if rng.chance(0.06) {
        c.note("no eps Add (epsilon 0)");
        mean
    } else {
        let eps = if rng.chance(0.08) {
            c.breaks("eps is a graph input");
            b.input("eps_in", elem, Some(&[]))
        } else {
            let r = scalar_rank(rng, c, "eps", x_rank);
            one_value(rng, b, "eps", elem, r, 1e-5)
        };
        commuted(rng, b, "Add", &mean, &eps)
    };
    let root = match rng.below(8) {
        0 => {
            c.note("the root as Pow(a, 0.5)");
            let r = scalar_rank(rng, c, "the root's exponent", x_rank);
            let half = one_value(rng, b, "half", elem, r, 0.5);
            b.node("Pow", &[&added, &half], vec![])
        }
        1 => {
            c.breaks("the root as Pow(a, 0.4)");
            let half = one_value(rng, b, "half", elem, 0, 0.4);
            b.node("Pow", &[&added, &half], vec![])
        }
        _ => b.node("Sqrt", &[&added], vec![]),
    };
    match rng.below(3) {
        0 => b.node("Div", &[x, &root], vec![]),
        1 => {
            let inv = b.node("Reciprocal", &[&root], vec![]);
            commuted(rng, b, "Mul", x, &inv)
        }
        _ => {
            let numerator = if rng.chance(0.1) {
                c.breaks("numerator 2");
                2.0
            } else {
                1.0
            };
            let r = scalar_rank(rng, c, "the numerator", x_rank);
            let one = one_value(rng, b, "one", elem, r, numerator);
            let inv = b.node("Div", &[&one, &root], vec![]);
            commuted(rng, b, "Mul", x, &inv)
        }
    }
}

/// A weight (or gamma, beta) for x's last axis `last`, x of rank
/// `x_rank` where declared.
fn weight(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    name: &str,
    elem: i32,
    last: &D,
    x_rank: Option<usize>,
    bias: bool,
) -> String {
    let v: Vec<f64> = (0..HIDDEN).map(|i| if bias { 0.1 * i as f64 } else { 1.0 + 0.25 * i as f64 }).collect();
    match rng.below(18) {
        0 => {
            let lead = 1 + rng.below(2);
            let dims: Vec<i64> = std::iter::repeat_n(1, lead).chain([HIDDEN]).collect();
            if *last == D::N(HIDDEN) && x_rank.is_some_and(|r| r > lead) {
                c.note(format!("the {name} is {dims:?} (read as [D])"));
            } else {
                c.breaks(format!("the {name} is {dims:?} on x of last axis {last:?}, rank {x_rank:?}"));
            }
            b.init(name, tensor(elem, &dims, &v))
        }
        1 => {
            match last {
                D::N(n) => c.note(format!("the {name} has one value, x's last axis is {n} (read as [{n}] copies)")),
                _ => c.breaks(format!("the {name} has one value on x of last axis {last:?}")),
            }
            b.init(name, tensor(elem, &[1], &[1.5]))
        }
        16 => {
            c.breaks(format!("the {name} is [2, D]"));
            let twice: Vec<f64> = v.iter().chain(&v).copied().collect();
            b.init(name, tensor(elem, &[2, HIDDEN], &twice))
        }
        2 => {
            c.note(format!("the {name} is a graph input [D]"));
            if *last != D::N(HIDDEN) {
                c.breaks(format!("the {name} [D] on x of last axis {last:?}"));
            }
            b.input(name, elem, Some(&[D::N(HIDDEN)]))
        }
        3 => {
            c.note(format!("the {name} is a graph input [d]"));
            if *last != sym("d") {
                c.breaks(format!("the {name} [d] on x of last axis {last:?}"));
            }
            b.input(name, elem, Some(&[sym("d")]))
        }
        4 => {
            c.breaks(format!("the {name} is a graph input without a shape"));
            b.input(name, elem, None)
        }
        _ => {
            if *last != D::N(HIDDEN) {
                c.breaks(format!("the {name} [D] on x of last axis {last:?}"));
            }
            b.init(name, tensor(elem, &[HIDDEN], &v))
        }
    }
}

/// A LayerNorm's gamma or beta. One that breaks the rewrite leaves the
/// norm to fuse without it (a scale of ones where D is known, no bias),
/// beside its Mul or Add: the same function.
fn norm_weight(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    name: &str,
    elem: i32,
    last: &D,
    x_rank: Option<usize>,
    bias: bool,
) -> String {
    let mut own = Ctx::new();
    let w = weight(rng, &mut own, b, name, elem, last, x_rank, bias);
    for what in own.what {
        c.note(what);
    }
    if own.expect == Expect::NoFuse {
        c.unsure(format!("the {name} does not fold: the norm may fuse without it"));
        c.aside.push(w.clone());
    }
    w
}

/// A gamma or beta of a LayerNorm over the last axes `normalized` of x
/// (known numbers, or none): of exactly those axes, with a leading axis
/// of 1, of one value, or of the last axis alone (which broadcasts: it
/// stays outside the norm, which may fuse without it).
fn weight_over_axes(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    name: &str,
    elem: i32,
    normalized: Option<&[i64]>,
    x_rank: Option<usize>,
) -> String {
    let ramp = |n: i64| (0..n).map(|i| 0.5 + i as f64 / 8.0).collect::<Vec<_>>();
    let Some(dims) = normalized else {
        c.unsure(format!("the {name} over axes of x that are not known numbers"));
        c.aside.push(name.to_string());
        return b.init(name, tensor(elem, &[3, HIDDEN], &ramp(3 * HIDDEN)));
    };
    let n = dims.iter().product();
    match rng.below(6) {
        0 => {
            c.note(format!("the {name} has a leading axis of 1"));
            if x_rank.is_none_or(|r| r <= dims.len()) {
                c.unsure(format!("the {name} raises the rank of x: it may stay outside"));
                c.aside.push(name.to_string());
            }
            b.init(name, tensor(elem, &[&[1], dims].concat(), &ramp(n)))
        }
        1 => {
            c.note(format!("the {name} has one value"));
            let w = one_value(rng, b, name, elem, 0, 0.5);
            c.aside.push(w.clone());
            w
        }
        2 => {
            let last = dims[dims.len() - 1];
            c.unsure(format!("the {name} of the last axis alone broadcasts: it stays outside"));
            c.aside.push(name.to_string());
            b.init(name, tensor(elem, &[last], &ramp(last)))
        }
        _ => b.init(name, tensor(elem, dims, &ramp(n))),
    }
}

/// The values nodes since `before` compute (not Constants: a constant that
/// something else reads too simply stays).
fn computed_since(b: &Builder, before: usize) -> Vec<String> {
    b.graph.node[before..].iter().filter(|n| n.op_type() != "Constant").map(|n| n.output[0].clone()).collect()
}

/// Extra readers of an intermediate value: a graph output, or another node.
fn leak(rng: &mut Rng, c: &mut Ctx, b: &mut Builder, inner: &[String], elem: i32) {
    let inner: Vec<String> = inner.iter().filter(|v| !c.aside.contains(v)).cloned().collect();
    if inner.is_empty() || !rng.chance(0.1) {
        return;
    }
    let v = rng.pick(&inner);
    if rng.chance(0.5) {
        c.breaks(format!("{v} is also a graph output"));
        b.output(&v, elem, None);
    } else {
        c.breaks(format!("{v} is also read by another node"));
        let other = b.node("Neg", &[&v], vec![]);
        b.output(&other, elem, None);
    }
}

/// rms-norm: `x / sqrt(mean(x²) + eps) * weight`, plain or wrapped in Casts.
pub fn rms(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[13i64, 17, 18, 23]);
    let rank = 1 + rng.below(4);
    let (dims, last) = x_shape(rng, &mut c, rank);
    let declared = dims.is_some();
    // fp16 forms: the core in f32 between Casts.
    let cast_form = rng.chance(0.3);
    let (x_elem, core_elem) = if cast_form {
        match rng.below(6) {
            0 => {
                c.note("f32 narrowed to an f16 core");
                (FLOAT, FLOAT16)
            }
            1 => {
                c.breaks("the core computes in f64");
                (FLOAT16, DOUBLE)
            }
            2 => {
                c.note("bf16 widened to f32 and back");
                c.unsure("bf16 (ONNX Runtime's CPU kernels may lack it)");
                (BFLOAT16, FLOAT)
            }
            _ => {
                c.note("f16 widened to f32 and back");
                (FLOAT16, FLOAT)
            }
        }
    } else {
        let e = rng.pick(&[FLOAT, FLOAT, FLOAT, FLOAT16]);
        (e, e)
    };
    let x = b.input("x", x_elem, dims.as_deref());
    let core_in = if cast_form { b.node("Cast", &[&x], vec![attr_int("to", core_elem as i64)]) } else { x.clone() };
    let before = b.graph.node.len();
    let n = rms_core(rng, &mut c, &mut b, opset, &core_in, core_elem, rank, declared);
    let inner = computed_since(&b, before);
    if !cast_form && rng.chance(0.1) {
        // onnxscript's norm without a scale: a weight of ones, a constant
        // where D is a known number, else computed from x's shape at run
        // time (ConstantOfShape from opset 9, of bf16 from 20).
        c.note("no weight");
        if !declared {
            c.breaks("no weight on x of no declared shape");
        } else if !matches!(last, D::N(_)) && core_elem == BFLOAT16 && opset < 20 {
            c.breaks(format!("no weight on x of last axis {last:?} in bf16 before opset 20"));
        }
        b.output(&n, core_elem, None);
        // The norm's own output may be read anywhere.
        c.aside.push(n.clone());
        leak(rng, &mut c, &mut b, &inner, core_elem);
        return finish(rng, c, b, opset, core_elem);
    }
    let mut normalized = n;
    let mut w_elem = core_elem;
    // The core alone: a Cast back that no weighted form folds.
    let mut alone = false;
    if cast_form {
        let to = if rng.chance(0.1) {
            // An identity Cast on the way out: the op reads the core's input.
            c.note("the output Cast is to the core's own type");
            core_elem
        } else {
            if (x_elem, core_elem) == (FLOAT, FLOAT16) {
                // Another function whole: the f16 core fuses alone, with
                // a weight of ones (x's rank proved), whatever the weight.
                c.note("Casts narrow in the middle: f32 → f16 core → f32, the core alone");
                if !declared {
                    c.breaks("the core alone on x of no declared shape");
                }
                // The core's output may be read anywhere: the op writes it.
                c.aside.push(normalized.clone());
                alone = true;
            }
            x_elem
        };
        normalized = b.node("Cast", &[&normalized], vec![attr_int("to", to as i64)]);
        w_elem = to;
    }
    let w = if alone {
        // The weight stays outside the match: what it breaks breaks nothing.
        let mut outside = Ctx::new();
        let w = weight(rng, &mut outside, &mut b, "w", w_elem, &last, declared.then_some(rank), false);
        c.what.extend(outside.what);
        c.aside.extend(outside.aside.into_iter().chain([w.clone()]));
        w
    } else {
        weight(rng, &mut c, &mut b, "w", w_elem, &last, declared.then_some(rank), false)
    };
    let y = commuted(rng, &mut b, "Mul", &normalized, &w);
    b.output(&y, w_elem, None);
    leak(rng, &mut c, &mut b, &inner, core_elem);
    finish(rng, c, b, opset, w_elem)
}

/// layer-norm: `(x - mean(x)) / sqrt(mean((x - mean(x))²) + eps) * gamma + beta`.
pub fn layer_norm(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[13i64, 16, 18, 23]);
    let rank = 1 + rng.below(4);
    let (mut dims, last) = x_shape(rng, &mut c, rank);
    if rank >= 2 && rng.chance(0.2) {
        c.note("over the last two axes");
        c.over = 2;
        if let Some(dims) = dims.as_mut() {
            dims[rank - 2] = rng.pick(&[D::N(3), D::N(3), D::N(1), sym("s")]);
        }
    }
    // The normalized axes as numbers: what a scale of ones needs.
    let normalized: Option<Vec<i64>> = dims
        .as_ref()
        .and_then(|dims| dims[rank - c.over..].iter().map(|d| if let D::N(n) = d { Some(*n) } else { None }).collect());
    let declared = dims.is_some();
    let elem = rng.pick(&[FLOAT, FLOAT, FLOAT16]);
    let x = b.input("x", elem, dims.as_deref());
    let before = b.graph.node.len();
    let mean_of = if rng.chance(0.08) {
        c.breaks("the mean is of another value");
        b.node("Neg", &[&x], vec![])
    } else {
        x.clone()
    };
    let mu = reduce_mean(rng, &mut c, &mut b, opset, &mean_of, rank, declared);
    let d = b.node("Sub", &[&x, &mu], vec![]);
    // Exporters write the centered value once per use: the core's square may
    // read an identical second Sub.
    let n = if rng.chance(0.3) {
        c.note("the square reads a twin Sub");
        let twin = b.node("Sub", &[&x, &mu], vec![]);
        let sq = b.node("Mul", &[&twin, &twin], vec![]);
        let m = reduce_mean(rng, &mut c, &mut b, opset, &sq, rank, declared);
        let eps = one_value(rng, &mut b, "eps", elem, 0, 1e-5);
        let a = b.node("Add", &[&m, &eps], vec![]);
        let r = b.node("Sqrt", &[&a], vec![]);
        b.node("Div", &[&d, &r], vec![])
    } else {
        rms_core(rng, &mut c, &mut b, opset, &d, elem, rank, declared)
    };
    let inner = computed_since(&b, before);
    let x_rank = declared.then_some(rank);
    if declared {
        // Read elsewhere too, the normalized value still fuses as
        // LayerNormalization with a scale of ones (a constant, or computed
        // at run time where the axes are no known numbers), its Mul and Add
        // after it.
        c.aside.push(n.clone());
    }
    if rng.chance(0.1) {
        // OLMo: neither gamma nor beta; a scale of ones, a constant where
        // the axes are known numbers, else computed at run time from x's
        // shape, which needs x's rank proved.
        c.note("neither gamma nor beta");
        if !declared {
            c.breaks("no gamma on x of no declared shape");
        }
        b.output(&n, elem, None);
        leak(rng, &mut c, &mut b, &inner, elem);
        return finish(rng, c, b, opset, elem);
    }
    let weight = |rng: &mut Rng, c: &mut Ctx, b: &mut Builder, name: &str, bias: bool| match c.over {
        1 => norm_weight(rng, c, b, name, elem, &last, x_rank, bias),
        _ => weight_over_axes(rng, c, b, name, elem, normalized.as_deref(), x_rank),
    };
    let gamma = weight(rng, &mut c, &mut b, "gamma", false);
    if declared {
        c.may_stay.push(gamma.clone());
    }
    let g = commuted(rng, &mut b, "Mul", &n, &gamma);
    let y = if rng.chance(0.15) {
        c.note("no beta (Cohere, ModernBERT)");
        g
    } else {
        let beta = weight(rng, &mut c, &mut b, "beta", true);
        c.may_stay.push(beta.clone());
        if c.aside.contains(&gamma) {
            // Past a gamma that stays outside, the beta does too.
            c.aside.push(beta.clone());
        }
        commuted(rng, &mut b, "Add", &g, &beta)
    };
    b.output(&y, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// attention: `softmax(q·k [scale] [cast] [where] [+ mask]) [cast] · v`.
pub fn attention(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[12i64, 14, 18, 23]);
    let elem = rng.pick(&[FLOAT, FLOAT, FLOAT16]);
    let four = rng.chance(0.7);
    let e = D::N(HIDDEN);
    // MatMul broadcasts heads and batch; ONNX's Attention only shares one key/value head.
    let (mut q_heads, mut kv_heads, mut kv_batch) = (D::N(2), D::N(2), sym("b"));
    match rng.below(10) {
        0 if four => {
            c.note("one key/value head");
            kv_heads = D::N(1);
        }
        1 if four => {
            c.ort_only("one q head over two key heads");
            q_heads = D::N(1);
        }
        2 => {
            c.ort_only("key/value batch 1, broadcast");
            kv_batch = D::N(1);
        }
        _ => {}
    }
    let (qd, kd, vd) = if four {
        (
            vec![sym("b"), q_heads, sym("s"), e.clone()],
            vec![kv_batch.clone(), kv_heads.clone(), e.clone(), sym("t")],
            vec![kv_batch, kv_heads, sym("t"), e.clone()],
        )
    } else {
        (
            vec![sym("b"), sym("s"), e.clone()],
            vec![kv_batch.clone(), e.clone(), sym("t")],
            vec![kv_batch, sym("t"), e.clone()],
        )
    };
    let rank = qd.len();
    let declare = rng.chance(0.85);
    if !declare {
        c.ort_only("shapes undeclared");
    }
    let q = b.input("q", elem, declare.then_some(&qd[..]));
    // The key transposed in the graph (ONNX's Attention reads it before), or an input already transposed.
    let k = if rng.chance(0.6) {
        let mut perm: Vec<i64> = (0..rank as i64).collect();
        perm.swap(rank - 1, rank - 2);
        if four && rng.chance(0.1) {
            // Portable reads the key transposed by the same perm with its
            // last two axes swapped back (a new Transpose).
            c.note("the key's Transpose also swaps batch and heads");
            perm.swap(0, 1);
        }
        let key_dims: Vec<D> = perm.iter().map(|&j| kd[j as usize].clone()).collect();
        let key = b.input("key", elem, declare.then_some(&key_dims[..]));
        let k = b.node("Transpose", &[&key], vec![attr_ints("perm", &perm)]);
        if rng.chance(0.1) {
            c.note("the transposed key is also a graph output");
            b.output(&k, elem, None);
        }
        k
    } else {
        c.ort_only("the key is an input, already transposed");
        b.input("k", elem, declare.then_some(&kd[..]))
    };
    let v = b.input("v", elem, declare.then_some(&vd[..]));
    let before = b.graph.node.len();
    let einsums = rng.chance(0.1) && elem == FLOAT;
    let out_einsum = einsums && rng.chance(0.7);
    // The Einsums' batch letters, or an ellipsis for them (LongT5).
    let batch = if einsums && rng.chance(0.3) {
        c.note("the Einsums' batch axes are an ellipsis");
        "..."
    } else if four {
        "bh"
    } else {
        "b"
    };
    let mut s = if !einsums && rng.chance(0.1) && elem == FLOAT {
        // ONNX Runtime's FusedMatMul(q, k, alpha): the scale inside the
        // product (an ONNX Runtime optimizer's output, fused again).
        c.ort_only("the scores are com.microsoft.FusedMatMul");
        let mut attributes = vec![attr_float("alpha", 0.5)];
        if rng.chance(0.15) {
            c.breaks("the FusedMatMul transposes q and k");
            attributes.extend([attr_int("transA", 1), attr_int("transB", 1)]);
        }
        let s = b.node("FusedMatMul", &[&q, &k], attributes);
        b.graph.node.last_mut().expect("the FusedMatMul").domain = Some("com.microsoft".into());
        s
    } else if einsums {
        // tf2onnx: q·k as an Einsum over the head axis (Keras: of key, query).
        c.ort_only("the scores are an Einsum");
        if qd[..rank - 2] != kd[..rank - 2] {
            // ONNX Runtime's kernel broadcasts a letter in one operand order only.
            c.unsure("an Einsum letter broadcast between q and k");
        }
        let output = if rng.chance(0.1) {
            c.breaks("the scores' Einsum keeps the head axis and sums the key's sequence alone");
            format!("{batch}se")
        } else {
            format!("{batch}st")
        };
        let (qt, kt) = (format!("{batch}se"), format!("{batch}et"));
        if rng.chance(0.5) {
            c.note("the Einsum reads the key first");
            b.node("Einsum", &[&k, &q], vec![attr_string("equation", &format!("{kt},{qt}->{output}"))])
        } else {
            b.node("Einsum", &[&q, &k], vec![attr_string("equation", &format!("{qt},{kt}->{output}"))])
        }
    } else {
        b.node("MatMul", &[&q, &k], vec![])
    };
    let mut s_elem = elem;
    let scores = s.clone();
    let shape_read = rng.chance(0.06);
    if shape_read {
        // DistilBERT: the mask expanded to Shape(scores); the MatMul stays.
        c.note("the scores' shape is read elsewhere");
        let shape = b.node("Shape", &[&scores], vec![]);
        b.output(&shape, INT64, None);
        c.aside.push(shape);
    }
    if rng.chance(0.7) {
        if rng.chance(0.08) {
            c.breaks("the scale has two values");
            let t = b.init("scale", tensor(elem, &[2], &[0.5, 0.5]));
            s = b.node("Mul", &[&s, &t], vec![]);
        } else if rng.chance(0.15) {
            c.ort_only("a run-time divisor");
            let d = b.input("divisor", elem, Some(&[]));
            s = b.node("Div", &[&s, &d], vec![]);
        } else if rng.chance(0.1) {
            // SwinV2: the scores times a learned scale per head.
            c.ort_only("a run-time multiplier per head");
            let dims: Vec<D> = if rng.chance(0.15) {
                c.breaks("the run-time multiplier widens the scores");
                [D::N(3)].into_iter().chain(std::iter::repeat_n(D::N(1), rank)).collect()
            } else {
                std::iter::repeat_n(D::N(1), rank).collect()
            };
            let d = b.input("multiplier", elem, Some(&dims));
            s = commuted(rng, &mut b, "Mul", &s, &d);
        } else {
            let op = rng.pick(&["Mul", "Div"]);
            let r = scalar_rank(rng, &mut c, "the scale", declare.then_some(rank));
            let t = one_value(rng, &mut b, "scale", elem, r, 0.5);
            s = if op == "Mul" { commuted(rng, &mut b, "Mul", &s, &t) } else { b.node("Div", &[&s, &t], vec![]) };
        }
    }
    if rng.chance(0.15) {
        // Gemma 2: Tanh(s / cap) * cap (or s * 1/cap), before any mask.
        c.ort_only("soft-capped");
        let cap = 2.0;
        let (op, by) = if rng.chance(0.5) { ("Div", cap) } else { ("Mul", 1.0 / cap) };
        let by = if rng.chance(0.1) {
            c.breaks("the soft-cap divides by another value than it multiplies by");
            by * 2.0
        } else {
            by
        };
        let by = one_value(rng, &mut b, "cap_in", elem, 0, by);
        let t = b.node(op, &[&s, &by], vec![]);
        let t = b.node("Tanh", &[&t], vec![]);
        let r = scalar_rank(rng, &mut c, "the cap", declare.then_some(rank));
        let cap = one_value(rng, &mut b, "cap", elem, r, cap);
        s = commuted(rng, &mut b, "Mul", &t, &cap);
    }
    if rng.chance(0.3) && elem == FLOAT16 {
        c.ort_only("scores cast to f32");
        s = b.node("Cast", &[&s], vec![attr_int("to", FLOAT as i64)]);
        s_elem = FLOAT;
    }
    let megatron = rng.chance(0.1);
    // The Where mask's condition, where there is one, and its hide (masked_fill).
    let mut masked_by: Option<(String, Option<String>)> = None;
    if rng.chance(0.3) && !megatron {
        let fill = if rng.chance(0.2) {
            c.breaks("fill -100");
            -100.0
        } else {
            -1.0e9_f64.max(if s_elem == FLOAT16 { -65504.0 } else { -1e9 })
        };
        c.ort_only("a Where mask");
        let (_, keep) = bool_mask(&mut b, rank);
        let f = if rng.chance(0.3) {
            // The fill as one value reshaped (an exporter's torch.tensor(fill)).
            c.note("the fill reshaped from one value");
            let one = one_value(rng, &mut b, "fill", s_elem, 0, fill);
            let ones = b.init("fill_shape", tensor(INT64, &[rank as i64], &vec![1.0; rank]));
            let reshaped = b.node("Reshape", &[&one, &ones], vec![]);
            c.aside.push(reshaped.clone());
            reshaped
        } else {
            let r = scalar_rank(rng, &mut c, "the fill", declare.then_some(rank));
            one_value(rng, &mut b, "fill", s_elem, r, fill)
        };
        // The condition is a side input: other readers change nothing.
        c.aside.push(keep.clone());
        s = if rng.chance(0.4) {
            c.note("masked_fill: Where(hide, fill, scores)");
            let hide = b.node("Not", &[&keep], vec![]);
            c.aside.push(hide.clone());
            masked_by = Some((keep.clone(), Some(hide.clone())));
            b.node("Where", &[&hide, &f, &s], vec![])
        } else {
            masked_by = Some((keep.clone(), None));
            b.node("Where", &[&keep, &s, &f], vec![])
        };
    }
    if megatron {
        // Megatron: s·m − 10000·(1 − m), m a Cast of the bool mask.
        c.ort_only("Megatron's s·m − 10000·(1 − m)");
        let (km, keep) = bool_mask(&mut b, rank);
        let m = if rng.chance(0.15) {
            c.breaks("Megatron's m is not proved to hold only 0 and 1");
            b.node("Cast", &[&km], vec![attr_int("to", s_elem as i64)])
        } else {
            b.node("Cast", &[&keep], vec![attr_int("to", s_elem as i64)])
        };
        // m is a side input, keep_mask: other readers change nothing.
        c.aside.extend([keep, m.clone()]);
        let one = one_value(rng, &mut b, "one", s_elem, 0, 1.0);
        let penalty = one_value(rng, &mut b, "penalty", s_elem, 0, 10000.0);
        let kept = commuted(rng, &mut b, "Mul", &s, &m);
        let hidden = b.node("Sub", &[&one, &m], vec![]);
        let hidden = commuted(rng, &mut b, "Mul", &hidden, &penalty);
        s = b.node("Sub", &[&kept, &hidden], vec![]);
    }
    // Additive terms: a position bias, ALiBi, the mask, in a row.
    for i in 0..[0, 1, 1, 2][rng.below(4)] {
        if rng.chance(0.08) {
            if shape_read {
                // The MatMul stays for its Shape reader: the core may read it.
                c.ort_only("the mask is the scores themselves, whose MatMul stays");
            } else if opset >= 23 {
                // ONNX's Attention may take them as its mask, their MatMul
                // staying to compute them (the kernel computes q·k again).
                c.unsure("the mask is the scores themselves: the kernel may read them");
            } else {
                c.breaks("the mask is the scores themselves");
            }
            s = b.node("Add", &[&s, &scores], vec![]);
        } else {
            c.ort_only(format!("additive term {i}"));
            let lead = if i == 0 { D::N(1) } else { D::N(2) };
            if einsums && out_einsum && !four && i == 1 {
                // The probabilities' batch of 2 against v's symbolic batch:
                // an Einsum letter not proved equal, which the core refuses.
                c.unsure("a term of batch 2 before an Einsum with v");
            }
            let m = b.input(&format!("m{i}"), s_elem, Some(&[D::N(1), lead, sym("s"), sym("t")][4 - rank..]));
            s = match rng.below(8) {
                // XLNet: `score - 1e30 * mask`.
                0 => {
                    c.note(format!("term {i} subtracted from the scores"));
                    b.node("Sub", &[&s, &m], vec![])
                }
                1 => {
                    c.breaks(format!("the scores subtracted from term {i}"));
                    b.node("Sub", &[&m, &s], vec![])
                }
                _ => commuted(rng, &mut b, "Add", &s, &m),
            };
        }
    }
    if declare && rng.chance(0.06) {
        // The scores viewed as rows of their last axis and back, a term
        // of that axis alone added to the view: the term of the scores.
        let lead: &[D] = if rng.chance(0.5) { &[D::N(1)] } else { &[] };
        c.ort_only(format!("a term of [{}t] added to the scores viewed as [-1, last axis]", "1, ".repeat(lead.len())));
        let shape = b.node("Shape", &[&s], vec![]);
        let (rows, start, end) = (b.ints(&[-1]), b.ints(&[-1]), b.ints(&[i64::MAX]));
        let last = b.node("Slice", &[&shape, &start, &end], vec![]);
        let view = b.node("Concat", &[&rows, &last], vec![attr_int("axis", 0)]);
        let viewed = b.node("Reshape", &[&s, &view], vec![]);
        let term = b.input("m_view", s_elem, Some(&[lead, &[sym("t")]].concat()));
        let added = commuted(rng, &mut b, "Add", &viewed, &term);
        s = b.node("Reshape", &[&added, &shape], vec![]);
    }
    // OPT's and BART's eager attention (before transformers 4.36) clamp the
    // masked scores at the float's lowest.
    match rng.below(12) {
        0 => {
            // No step ONNX Attention takes: the portable target writes nothing.
            c.ort_only("the scores clamped by a Max of one value");
            let lowest = if s_elem == FLOAT16 { -65504.0 } else { f64::from(f32::MIN) };
            let bound = one_value(rng, &mut b, "clamp", s_elem, 0, lowest);
            s = commuted(rng, &mut b, "Max", &s, &bound);
        }
        1 if rng.chance(0.5) => {
            c.breaks("the scores clamped by a Max of -100, above a fill");
            let bound = one_value(rng, &mut b, "clamp", s_elem, 0, -100.0);
            s = commuted(rng, &mut b, "Max", &s, &bound);
        }
        1 => {
            c.breaks("the scores clamped by a Max of a value computed at run time");
            let bound = b.input("clamp_src", s_elem, Some(&[D::N(1), D::N(1), sym("s"), sym("t")][4 - rank..]));
            s = commuted(rng, &mut b, "Max", &s, &bound);
        }
        _ => {}
    }
    let axis = match rng.below(8) {
        0 => {
            if opset < 13 {
                if declare {
                    c.note("Softmax axis rank-1 before opset 13");
                } else {
                    c.breaks("Softmax axis rank-1 before opset 13, rank unproved");
                }
            } else if !declare {
                c.breaks("Softmax axis rank-1, rank unproved");
            }
            Some(rank as i64 - 1)
        }
        1 => {
            c.breaks("Softmax over axis 1");
            Some(1)
        }
        2 => Some(-1),
        _ if opset < 13 => {
            c.breaks("Softmax with the default axis before opset 13 (axis 1)");
            None
        }
        _ => None,
    };
    let mut p = b.node("Softmax", &[&s], axis.map(|a| vec![attr_int("axis", a)]).unwrap_or_default());
    if s_elem != elem {
        p = b.node("Cast", &[&p], vec![attr_int("to", elem as i64)]);
    }
    if rng.chance(0.2) {
        c.ort_only("NaN guard");
        let nan = b.node("IsNaN", &[&p], vec![]);
        let r = scalar_rank(rng, &mut c, "the NaN guard's 0", declare.then_some(rank));
        let z = one_value(rng, &mut b, "nan_zero", elem, r, 0.0);
        p = b.node("Where", &[&nan, &z, &p], vec![]);
    }
    if let Some((keep, hide)) = masked_by.filter(|_| rng.chance(0.3)) {
        // DeBERTa's XSoftmax: the keys the mask hides zeroed after the
        // Softmax, by its condition (the same value or computed again).
        let r = scalar_rank(rng, &mut c, "the zeroing Where's 0", declare.then_some(rank));
        let z = one_value(rng, &mut b, "zeroed", elem, r, 0.0);
        let crossed = rng.chance(0.15);
        let hides = hide.is_some() != crossed;
        if crossed {
            c.breaks("the probabilities zeroed where the mask keeps keys");
        } else {
            c.ort_only("the hidden keys' probabilities zeroed after the Softmax");
        }
        let condition = match hide {
            Some(hide) if rng.chance(0.5) => hide,
            Some(_) => b.node("Not", &[&keep], vec![]),
            None if rng.chance(0.5) => keep,
            None => b.node("Identity", &[&keep], vec![]),
        };
        c.aside.push(condition.clone());
        p = if hides {
            b.node("Where", &[&condition, &z, &p], vec![])
        } else {
            b.node("Where", &[&condition, &p, &z], vec![])
        };
    }
    match rng.below(10) {
        0 => {
            c.note("an inference Dropout after the Softmax");
            p = if opset >= 12 && rng.chance(0.5) {
                let ratio = b.init("ratio", tensor(FLOAT, &[], &[0.5]));
                let training = b.init("training", tensor(BOOL, &[], &[0.0]));
                b.node("Dropout", &[&p, &ratio, &training], vec![])
            } else {
                b.node("Dropout", &[&p], vec![])
            };
        }
        1 if opset >= 12 => {
            c.breaks("a Dropout in training mode");
            let ratio = b.init("ratio", tensor(FLOAT, &[], &[0.5]));
            let training = b.init("training", tensor(BOOL, &[], &[1.0]));
            p = b.node("Dropout", &[&p, &ratio, &training], vec![]);
        }
        _ => {}
    }
    if declare && !out_einsum && rng.chance(0.1) {
        // DeBERTa: a view of the probabilities and back, the shapes
        // computed from theirs (copied into the core's body).
        // (ONNX's Attention reads the pair as what it is proved to be: no
        // change of the probabilities.)
        c.note("the probabilities viewed as [-1, last axis] and back, shapes from Shape(p)");
        // Where the view's constants are defined again, the core reads the
        // shape computed outside, its Shape(p) from q's and v's shapes.
        c.aside.extend(["view_rows", "view_start", "view_end"].map(String::from));
        let shape = b.node("Shape", &[&p], vec![]);
        let (rows, start, end) = (
            b.init("view_rows", tensor(INT64, &[1], &[-1.0])),
            b.init("view_start", tensor(INT64, &[1], &[-1.0])),
            b.init("view_end", tensor(INT64, &[1], &[i64::MAX as f64])),
        );
        let last = b.node("Slice", &[&shape, &start, &end], vec![]);
        let view = b.node("Concat", &[&rows, &last], vec![attr_int("axis", 0)]);
        let viewed = b.node("Reshape", &[&p, &view], vec![]);
        let back = if rng.chance(0.15) {
            c.breaks("the view reshaped to [last axis, -1], not back");
            b.node("Concat", &[&last, &rows], vec![attr_int("axis", 0)])
        } else {
            b.node("Shape", &[&p], vec![])
        };
        p = b.node("Reshape", &[&viewed, &back], vec![]);
    }
    let inner = computed_since(&b, before);
    let out = if rng.chance(0.05) {
        c.breaks("MatMul(p, p)");
        b.node("MatMul", &[&p, &p], vec![])
    } else if out_einsum {
        c.note("the output is an Einsum of p and v");
        let equation = if rng.chance(0.1) {
            c.breaks("the Einsum with v contracts the queries");
            format!("{batch}st,{batch}se->{batch}te")
        } else {
            format!("{batch}st,{batch}te->{batch}se")
        };
        b.node("Einsum", &[&p, &v], vec![attr_string("equation", &equation)])
    } else {
        b.node("MatMul", &[&p, &v], vec![])
    };
    b.output(&out, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// complex-mul: the product of complex numbers held in a last axis of 2.
pub fn complex_mul(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[13i64, 17, 18]);
    let elem = rng.pick(&[FLOAT, FLOAT, FLOAT16]);
    let last = match rng.below(10) {
        0 => {
            c.breaks("the last axis is 3");
            D::N(3)
        }
        1 => {
            c.breaks("the last axis is symbolic");
            sym("d")
        }
        _ => D::N(2),
    };
    let a = b.input("a", elem, Some(&[sym("b"), D::N(3), last.clone()]));
    let same = rng.chance(0.15);
    let bb = if same {
        c.note("a and b are one tensor");
        a.clone()
    } else {
        b.input("bb", elem, Some(&[sym("b"), D::N(3), last.clone()]))
    };
    let kept = rng.chance(0.4);
    // Parts: Gather with a scalar index (squeezed) or Slice (kept).
    let mut part = |b: &mut Builder, c: &mut Ctx, x: &str, i: i64| -> String {
        if kept {
            let (start, end, step) = match (i, rng.below(8)) {
                (0, 0) => (-2, -1, 1),
                (1, 0) => (-1, i64::MAX, 1),
                (1, 1) => {
                    c.breaks("a part is the empty slice [-1:0]");
                    (-1, 0, 1)
                }
                (0, 1) => (1, 0, -1),
                (_, 2) => {
                    c.breaks("a part takes two elements");
                    (0, 2, 1)
                }
                _ => (i, i + 1, 1),
            };
            if (i, start, step) == (0, 1, -1) {
                c.breaks("a part reversed from 1 (selects index 1 as the real part)");
            }
            let t = |v: i64| tensor(INT64, &[1], &[v as f64]);
            let (s, e, ax, st) = (b.constant(t(start)), b.constant(t(end)), b.constant(t(-1)), b.constant(t(step)));
            b.node("Slice", &[x, &s, &e, &ax, &st], vec![])
        } else {
            let index = match rng.below(8) {
                0 => {
                    c.note("a negative Gather index");
                    i - 2
                }
                1 => {
                    c.breaks("a Gather index of shape [1]");
                    let idx = b.constant(tensor(INT64, &[1], &[i as f64]));
                    return b.node("Gather", &[x, &idx], vec![attr_int("axis", -1)]);
                }
                _ => i,
            };
            let idx = b.constant(tensor(INT64, &[], &[index as f64]));
            let axis = if rng.chance(0.05) {
                c.breaks("a Gather on axis 0");
                0
            } else {
                rng.pick(&[-1, 2])
            };
            b.node("Gather", &[x, &idx], vec![attr_int("axis", axis)])
        }
    };
    let (ar, ai, br, bi) = (
        part(&mut b, &mut c, &a, 0),
        part(&mut b, &mut c, &a, 1),
        part(&mut b, &mut c, &bb, 0),
        part(&mut b, &mut c, &bb, 1),
    );
    let conj = rng.chance(0.4);
    let rr = commuted(rng, &mut b, "Mul", &ar, &br);
    let ii = commuted(rng, &mut b, "Mul", &ai, &bi);
    let ri = commuted(rng, &mut b, "Mul", &ar, &bi);
    let ir = commuted(rng, &mut b, "Mul", &ai, &br);
    let (re, im) = if conj {
        c.note("conjugate product");
        let re = commuted(rng, &mut b, "Add", &rr, &ii);
        (re, b.node("Sub", &[&ir, &ri], vec![]))
    } else {
        let re = b.node("Sub", &[&rr, &ii], vec![]);
        if rng.chance(0.08) {
            c.breaks("im = ar·bi − ai·br");
            (re, b.node("Sub", &[&ri, &ir], vec![]))
        } else {
            (re, commuted(rng, &mut b, "Add", &ri, &ir))
        }
    };
    let inner = vec![rr.clone(), re.clone()];
    let (re, im) = if kept {
        (re, im)
    } else {
        let axes = |b: &mut Builder| b.constant(tensor(INT64, &[1], &[-1.0]));
        let (x1, x2) = (axes(&mut b), axes(&mut b));
        (b.node("Unsqueeze", &[&re, &x1], vec![]), b.node("Unsqueeze", &[&im, &x2], vec![]))
    };
    let out = if rng.chance(0.06) {
        c.breaks("real and imaginary parts swapped");
        b.node("Concat", &[&im, &re], vec![attr_int("axis", -1)])
    } else {
        b.node("Concat", &[&re, &im], vec![attr_int("axis", -1)])
    };
    b.output(&out, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// Places the graph in an If or Loop body at random (with a shadowing
/// mutation), and wraps it as a model.
fn finish(rng: &mut Rng, mut c: Ctx, b: Builder, opset: i64, elem: i32) -> Case {
    let model = match rng.below(10) {
        0 => {
            c.note("inside an If's then branch");
            nest_in_if(rng, &mut c, b, opset, elem)
        }
        1 => {
            c.note("inside a Loop's body (one trip)");
            nest_in_loop(rng, &mut c, b, opset, elem)
        }
        _ => b.model(opset),
    };
    let mut model = model;
    if rng.chance(0.1) {
        extreme_integers(rng, &mut c, model.graph.as_mut().expect("a graph"));
    }
    if rng.chance(0.3) {
        // Ground rule 10: the order of a node list carries no meaning.
        c.note("node lists shuffled");
        shuffle(rng, model.graph.as_mut().expect("a graph"));
    }
    Case { what: c.what, expect: c.expect, portable: c.portable, model }
}

/// Integers at the edges of i64 where shapes are computed (issue 21): one
/// element of a Reshape, Slice, Expand, Range, Squeeze/Unsqueeze or Split
/// integer constant, or a Slice of a graph input read as a further output.
/// Shape derivation must not panic or wrap on them; whether anything fuses
/// is then ONNX Runtime's verdict. (Values that make ONNX Runtime allocate
/// by them, a Range of 2^62 elements, are not written.)
fn extreme_integers(rng: &mut Rng, c: &mut Ctx, g: &mut onnx_fuse::onnx::GraphProto) {
    const ANY: &[i64] =
        &[i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1, 1 << 62, -(1 << 62), 1 << 31, -(1 << 31), -2, -1, 0];
    const NOT_ALLOCATING: &[i64] = &[i64::MIN, i64::MIN + 1, -(1 << 62), -(1 << 31), -2, 0, 1];
    // (op, input, extremes) where a constant may stand.
    let slots: &[(&str, usize, &[i64])] = &[
        ("Reshape", 1, ANY),
        ("Slice", 1, ANY),
        ("Slice", 2, ANY),
        ("Slice", 3, ANY),
        ("Slice", 4, ANY),
        ("Expand", 1, NOT_ALLOCATING),
        ("Range", 2, &[i64::MAX, i64::MIN, 1 << 62, -(1 << 62)]),
        ("Squeeze", 1, ANY),
        ("Unsqueeze", 1, ANY),
        ("Split", 1, ANY),
    ];
    let mut found = Vec::new();
    for node in &g.node {
        for &(op, slot, values) in slots {
            if node.op_type() == op {
                if let Some(name) = node.input.get(slot).filter(|n| !n.is_empty()) {
                    let int64 = |t: &onnx_fuse::onnx::TensorProto| {
                        t.data_type() == INT64 && t.ints().is_some_and(|v| !v.is_empty())
                    };
                    if g.initializer.iter().any(|t| t.name() == name && int64(t)) {
                        found.push((op, name.clone(), values));
                    }
                }
            }
        }
    }
    c.unsure("an extreme integer");
    if found.is_empty() || rng.chance(0.4) {
        // A Slice of the first graph input, read by a new graph output.
        let Some(x) = g.input.first().map(|i| i.name().to_string()) else { return };
        let pick = |rng: &mut Rng| rng.pick(ANY);
        let values = [
            pick(rng),
            pick(rng),
            rng.pick(&[0, -1, i64::MIN, i64::MAX]),
            rng.pick(&[1, -1, i64::MAX, i64::MIN, 1 << 62]),
        ];
        let names: Vec<String> = ["starts", "ends", "axes", "steps"].iter().map(|n| format!("extreme_{n}")).collect();
        for (name, v) in names.iter().zip(values) {
            g.initializer.push(int64s(name, &[v]));
        }
        let out = "extreme_slice".to_string();
        let mut inputs = vec![x];
        inputs.extend(names);
        g.node.push(onnx_fuse::onnx::NodeProto {
            op_type: Some("Slice".into()),
            name: Some("extreme_Slice".into()),
            input: inputs,
            output: vec![out.clone()],
            ..Default::default()
        });
        g.output.push(onnx_fuse::onnx::ValueInfoProto { name: Some(out), ..Default::default() });
        c.note(format!("a Slice of the input by {values:?}"));
        return;
    }
    let (op, name, values) = found[rng.below(found.len())].clone();
    let tensor = g.initializer.iter_mut().find(|t| t.name() == name).expect("found above");
    let mut ints = tensor.ints().expect("found above");
    let at = rng.below(ints.len());
    ints[at] = rng.pick(values);
    let dims = tensor.dims.clone();
    *tensor = onnx_fuse::onnx::TensorProto { dims, ..int64s(&name, &ints) };
    c.note(format!("{op} constant {name} set to {ints:?}"));
}

/// An int64 tensor of exactly these values (`tensor` goes through f64).
fn int64s(name: &str, values: &[i64]) -> onnx_fuse::onnx::TensorProto {
    onnx_fuse::onnx::TensorProto {
        name: Some(name.into()),
        dims: vec![values.len() as i64],
        data_type: Some(INT64),
        raw_data: Some(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into()),
        ..Default::default()
    }
}

/// Permutes the node list of a graph and of every body in it.
fn shuffle(rng: &mut Rng, g: &mut onnx_fuse::onnx::GraphProto) {
    for node in &mut g.node {
        for body in node.subgraphs_mut() {
            shuffle(rng, body);
        }
    }
    for i in (1..g.node.len()).rev() {
        let j = rng.below(i + 1);
        g.node.swap(i, j);
    }
}

/// A body's initializer that gives an outer value's name a second
/// definition (invalid ONNX, which runtimes read differently): nothing that
/// touches the name may fuse.
fn maybe_shadow(rng: &mut Rng, c: &mut Ctx, outer: &Builder, body: &mut onnx_fuse::onnx::GraphProto, what: &str) {
    // Every initializer but `zero` (read outside the match) is read by it.
    let shadowed: Vec<_> = outer.graph.initializer.iter().filter(|t| t.name() != "zero").cloned().collect();
    if !shadowed.is_empty() && rng.chance(0.3) {
        let t = rng.pick(&shadowed);
        if c.portable_reads.iter().any(|a| a == t.name()) {
            // (The portable form may leave that scale outside: either way.)
            c.unsure(format!("the {what} defines {} again (a value the portable form may read)", t.name()));
        } else if c.aside.iter().any(|a| a == t.name()) {
            c.note(format!("the {what} defines {} again (shadowing a value outside the match)", t.name()));
        } else if c.may_stay.iter().any(|a| a == t.name()) {
            c.unsure(format!("the {what} defines {} again (a weight the rewrite can leave outside)", t.name()));
        } else {
            c.breaks(format!("the {what} defines {} again (shadowing)", t.name()));
        }
        body.initializer.push(t);
    }
}

/// The nodes go into the body of a Loop that runs once; inputs and
/// initializers stay outside, read from the body; each output comes back
/// as a scan output (with a leading axis of 1).
fn nest_in_loop(rng: &mut Rng, c: &mut Ctx, b: Builder, opset: i64, elem: i32) -> ModelProto {
    let mut outer = Builder::default();
    outer.graph.input = b.graph.input.clone();
    outer.graph.initializer = b.graph.initializer.clone();
    let mut body = b.graph.clone();
    body.input = vec![value_info("loop_iter", INT64, Some(&[])), value_info("loop_cond", BOOL, Some(&[]))];
    body.initializer.clear();
    body.name = Some("loop_body".into());
    maybe_shadow(rng, c, &outer, &mut body, "loop body");
    body.node.push(onnx_fuse::onnx::NodeProto {
        op_type: Some("Identity".into()),
        input: vec!["loop_cond".into()],
        output: vec!["loop_cond_out".into()],
        ..Default::default()
    });
    body.output.insert(0, value_info("loop_cond_out", BOOL, Some(&[])));
    let names: Vec<String> = (0..body.output.len() - 1).map(|i| format!("result_{i}")).collect();
    let trips = outer.init("trips", tensor(INT64, &[], &[1.0]));
    let outputs: Vec<&str> = names.iter().map(String::as_str).collect();
    outer.node_to("Loop", &[&trips, ""], &outputs, vec![attr_graph("body", body)]);
    for name in &names {
        outer.output(name, elem, None);
    }
    outer.model(opset)
}

/// The nodes go into the then branch of an If (the else branch passes the
/// first input on); inputs and initializers stay outside, read from the body.
fn nest_in_if(rng: &mut Rng, c: &mut Ctx, b: Builder, opset: i64, elem: i32) -> ModelProto {
    let mut outer = Builder::default();
    outer.graph.input = b.graph.input.clone();
    outer.graph.initializer = b.graph.initializer.clone();
    let mut body = b.graph.clone();
    body.input.clear();
    body.initializer.clear();
    body.name = Some("then".into());
    maybe_shadow(rng, c, &outer, &mut body, "branch");
    let first_input = outer.graph.input[0].name().to_string();
    let mut other = onnx_fuse::onnx::GraphProto { name: Some("else".into()), ..Default::default() };
    let mut results = Vec::new();
    for (i, o) in body.output.iter().enumerate() {
        let name = format!("else_{i}");
        other.node.push(onnx_fuse::onnx::NodeProto {
            op_type: Some("Identity".into()),
            input: vec![first_input.clone()],
            output: vec![name.clone()],
            ..Default::default()
        });
        other.output.push(value_info(&name, elem, None));
        results.push((format!("result_{i}"), o.clone()));
    }
    let cond = outer.input("cond", BOOL, Some(&[]));
    let names: Vec<&str> = results.iter().map(|(n, _)| n.as_str()).collect();
    outer.node_to("If", &[&cond], &names, vec![attr_graph("then_branch", body), attr_graph("else_branch", other)]);
    for (name, _) in &results {
        outer.output(name, elem, None);
    }
    outer.model(opset)
}

/// A constant of `elem` near `exact`: exact (rounded to `elem`), a unit or
/// two in the last place off (the same constant), or off by more.
fn near_constant(
    rng: &mut Rng,
    c: &mut Ctx,
    b: &mut Builder,
    name: &str,
    elem: i32,
    exact: f64,
    rank: usize,
) -> String {
    let step = |v: f64, n: i32| -> f64 {
        match elem {
            FLOAT16 => half::f16::from_bits(half::f16::from_f64(v).to_bits().wrapping_add_signed(n as i16)).to_f64(),
            _ => f32::from_bits((v as f32).to_bits().wrapping_add_signed(n)) as f64,
        }
    };
    let v = match rng.below(12) {
        0 => {
            c.note(format!("{name} 2 ulp off"));
            step(exact, rng.pick(&[-2, 2]))
        }
        1 => {
            c.breaks(format!("{name} 3 ulp off"));
            step(exact, rng.pick(&[-3, 3]))
        }
        2 => {
            c.breaks(format!("{name} written with three digits"));
            (exact * 100.0).round() / 100.0 + if exact == 0.5 || exact == 1.0 { 0.01 } else { 0.0 }
        }
        _ => exact,
    };
    if rank > 0 && v == exact && rng.chance(0.5) {
        c.note(format!("{name} has rank {rank}"));
    }
    one_value(rng, b, name, elem, rank, v)
}

/// The element type of a case whose op ONNX Runtime runs in f32 and f16
/// only: mostly f32, sometimes f16, sometimes f64 (which must not fuse).
fn kernel_elem(rng: &mut Rng, c: &mut Ctx) -> i32 {
    match rng.below(8) {
        0 => {
            c.note("f16");
            FLOAT16
        }
        1 => {
            c.breaks("f64 (ONNX Runtime has no kernel)");
            DOUBLE
        }
        _ => FLOAT,
    }
}

/// gelu: the erf, tanh and sigmoid forms in every grouping, with or
/// without a bias folded in.
pub fn gelu(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[13i64, 17, 20]);
    let rank = 1 + rng.below(4);
    let (dims, last) = x_shape(rng, &mut c, rank);
    let elem = kernel_elem(rng, &mut c);
    let x0 = b.input("x0", elem, dims.as_deref());
    let before = b.graph.node.len();
    let mut x_rank = dims.as_ref().map(|d| d.len());
    let x = if rng.chance(0.3) {
        let (shape, note) = match rng.below(4) {
            0 => (vec![2, HIDDEN], "a bias of [2, D]: an Add the op reads"),
            1 => (vec![1, HIDDEN], "a bias of [1, D]"),
            _ => (vec![HIDDEN], "a bias of [D]"),
        };
        c.note(note);
        x_rank = x_rank.map(|r| r.max(shape.len()));
        if shape[0] == 2 || last != D::N(HIDDEN) || x_rank != dims.as_ref().map(|d| d.len()) {
            // Not folded: the op reads the sum, which may broadcast.
            c.unsure("the bias is not one value per channel of x");
        }
        c.aside.push("bias".into());
        let bias = b.init(
            "bias",
            tensor(elem, &shape, &(0..shape.iter().product::<i64>()).map(|i| i as f64 / 16.0).collect::<Vec<_>>()),
        );
        let sum = commuted(rng, &mut b, "Add", &x0, &bias);
        c.aside.push(sum.clone());
        sum
    } else {
        x0.clone()
    };
    if dims.is_none() && x == x0 {
        c.breaks("x may be a scalar (the kernels make it [1])");
    }
    let rank_of = |rng: &mut Rng, c: &mut Ctx, what: &str| scalar_rank(rng, c, what, x_rank);
    let form = rng.below(3);
    if form == 2 {
        // x · Sigmoid(α · x): a bias stays an Add.
        c.ort_only("the sigmoid form");
        c.aside.push("bias".into());
        let y = if rng.chance(0.5) {
            c.note("SiLU");
            x.clone()
        } else {
            let r = rank_of(rng, &mut c, "α");
            let alpha = one_value(rng, &mut b, "alpha", elem, r, 1.702);
            commuted(rng, &mut b, "Mul", &x, &alpha)
        };
        let s = b.node("Sigmoid", &[&y], vec![]);
        let other = if rng.chance(0.08) {
            c.breaks("Sigmoid(x) times another value");
            b.node("Neg", &[&x], vec![])
        } else {
            x.clone()
        };
        let inner = computed_since(&b, before);
        let out = commuted(rng, &mut b, "Mul", &other, &s);
        b.output(&out, elem, None);
        leak(rng, &mut c, &mut b, &inner, elem);
        return finish(rng, c, b, opset, elem);
    }
    let arg_of = if rng.chance(0.06) {
        c.breaks("the inner function reads another value");
        b.node("Neg", &[&x], vec![])
    } else {
        x.clone()
    };
    let t = if form == 0 {
        let r = rank_of(rng, &mut c, "√2");
        let a = if rng.chance(0.5) {
            let root = near_constant(rng, &mut c, &mut b, "√2", elem, std::f64::consts::SQRT_2, r);
            b.node("Div", &[&arg_of, &root], vec![])
        } else {
            let inv = near_constant(rng, &mut c, &mut b, "1/√2", elem, std::f64::consts::FRAC_1_SQRT_2, r);
            commuted(rng, &mut b, "Mul", &arg_of, &inv)
        };
        b.node("Erf", &[&a], vec![])
    } else if rng.chance(0.25) {
        // BLOOM: √(2/π) · x · (1 + 0.044715 · x · x)
        c.note("the polynomial factored (BLOOM)");
        let k = near_constant(rng, &mut c, &mut b, "0.044715", elem, 0.044715, 0);
        let kx = commuted(rng, &mut b, "Mul", &arg_of, &k);
        let kxx = commuted(rng, &mut b, "Mul", &kx, &arg_of);
        let one = near_constant(rng, &mut c, &mut b, "1 of the polynomial", elem, 1.0, 0);
        let poly = commuted(rng, &mut b, "Add", &kxx, &one);
        let r = rank_of(rng, &mut c, "√(2/π)");
        let s = near_constant(rng, &mut c, &mut b, "√(2/π)", elem, 0.7978845608028654, r);
        let sx = commuted(rng, &mut b, "Mul", &arg_of, &s);
        let a = commuted(rng, &mut b, "Mul", &sx, &poly);
        b.node("Tanh", &[&a], vec![])
    } else {
        let cube = match rng.below(3) {
            0 => {
                let three = if rng.chance(0.05) {
                    c.breaks("x to the power 2");
                    one_value(rng, &mut b, "three", elem, 0, 2.0)
                } else {
                    one_value(rng, &mut b, "three", elem, 0, 3.0)
                };
                b.node("Pow", &[&arg_of, &three], vec![])
            }
            1 => {
                let sq = if rng.chance(0.3) {
                    c.note("x³ as Pow(x, 2) · x");
                    let two = one_value(rng, &mut b, "two", elem, 0, 2.0);
                    b.node("Pow", &[&arg_of, &two], vec![])
                } else {
                    c.note("x³ as (x · x) · x");
                    b.node("Mul", &[&arg_of, &arg_of], vec![])
                };
                commuted(rng, &mut b, "Mul", &sq, &arg_of)
            }
            _ => {
                c.note("x³ as Pow(x, 3) with x read twice");
                let three = one_value(rng, &mut b, "three", elem, 0, 3.0);
                b.node("Pow", &[&arg_of, &three], vec![])
            }
        };
        let k = near_constant(rng, &mut c, &mut b, "0.044715", elem, 0.044715, 0);
        let kc = commuted(rng, &mut b, "Mul", &cube, &k);
        let sum = commuted(rng, &mut b, "Add", &arg_of, &kc);
        let r = rank_of(rng, &mut c, "√(2/π)");
        let s = near_constant(rng, &mut c, &mut b, "√(2/π)", elem, 0.7978845608028654, r);
        let a = commuted(rng, &mut b, "Mul", &sum, &s);
        b.node("Tanh", &[&a], vec![])
    };
    let one = near_constant(rng, &mut c, &mut b, "1", elem, 1.0, 0);
    let bracket = commuted(rng, &mut b, "Add", &t, &one);
    let r = rank_of(rng, &mut c, "0.5");
    let half = near_constant(rng, &mut c, &mut b, "0.5", elem, 0.5, r);
    let mut inner = computed_since(&b, before);
    let y = match rng.below(3) {
        0 => {
            let xh = commuted(rng, &mut b, "Mul", &x, &half);
            commuted(rng, &mut b, "Mul", &xh, &bracket)
        }
        1 => {
            let xb = commuted(rng, &mut b, "Mul", &x, &bracket);
            commuted(rng, &mut b, "Mul", &xb, &half)
        }
        _ => {
            let hb = commuted(rng, &mut b, "Mul", &half, &bracket);
            commuted(rng, &mut b, "Mul", &x, &hb)
        }
    };
    if opset < 20 {
        c.portable = false;
    }
    // The product inside the three factors is inner too.
    inner.extend(computed_since(&b, before).into_iter().filter(|v| *v != y));
    b.output(&y, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// skip-norm: `norm(a + b [+ bias])`, the norm as exporters write it from
/// opset 17 (`LayerNormalization`) or as ONNX Runtime registers it
/// (`SimplifiedLayerNormalization`), shapes as the kernel takes them or not.
/// `a`'s rows as a decoder's new rows in its cache: `Concat(past, a)` cut
/// from past's length to the cache's, `keys[:, past : past + seq]` (a
/// skip-norm input of seq rows only where sums of dimensions are proved),
/// or a mutant that keeps other rows.
fn cache_rows(rng: &mut Rng, c: &mut Ctx, b: &mut Builder, a: &str, elem: i32) -> String {
    let past = b.input("past", elem, Some(&[sym("b"), sym("t"), D::N(HIDDEN)]));
    let keys = b.node("Concat", &[&past, a], vec![attr_int("axis", 1)]);
    let rows = |b: &mut Builder, v: &str| b.node("Shape", &[v], vec![attr_int("start", 1), attr_int("end", 2)]);
    let (start, end) = match rng.below(4) {
        0 => {
            c.note("a cache's new rows, keys[:, past : past + seq]");
            (rows(b, &past), rows(b, &keys))
        }
        1 => {
            c.note("a cache's new rows, to an end past the cache's");
            let (total, one) = (rows(b, &keys), b.init("cache_one", tensor(INT64, &[1], &[1.0])));
            (rows(b, &past), b.node("Add", &[&total, &one], vec![]))
        }
        2 => {
            c.breaks("a cache's rows from seq on (past of them)");
            (rows(b, a), rows(b, &keys))
        }
        _ => {
            c.breaks("a cache's rows from past to seq");
            (rows(b, &past), rows(b, a))
        }
    };
    let axes = b.init("cache_axes", tensor(INT64, &[1], &[1.0]));
    b.node("Slice", &[&keys, &start, &end, &axes], vec![])
}

pub fn skip_norm(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    c.ort_only("skip-norm");
    let opset = rng.pick(&[17i64, 18]);
    let elem = kernel_elem(rng, &mut c);
    let d = D::N(HIDDEN);
    let (a_dims, b_dims): (Option<Vec<D>>, Option<Vec<D>>) = match rng.below(12) {
        0 => {
            c.note("the skip is [S, D]");
            (Some(vec![sym("b"), sym("s"), d.clone()]), Some(vec![sym("s"), d.clone()]))
        }
        1 => {
            c.note("the skip is [1, S, D]");
            (Some(vec![D::N(2), sym("s"), d.clone()]), Some(vec![D::N(1), sym("s"), d.clone()]))
        }
        2 => {
            c.breaks("the skip is [B, 1, D]");
            (Some(vec![D::N(2), D::N(3), d.clone()]), Some(vec![D::N(2), D::N(1), d.clone()]))
        }
        3 => {
            c.breaks("rank 4");
            (Some(vec![D::N(1), D::N(2), D::N(3), d.clone()]), Some(vec![D::N(1), D::N(2), D::N(3), d.clone()]))
        }
        4 => {
            c.breaks("the operands' axes are other symbols");
            (Some(vec![sym("b"), sym("s"), d.clone()]), Some(vec![sym("b"), sym("t"), d.clone()]))
        }
        5 => {
            c.breaks("shapes not declared");
            (None, None)
        }
        6 => {
            c.note("2-D");
            (Some(vec![sym("s"), d.clone()]), Some(vec![sym("s"), d.clone()]))
        }
        _ => (Some(vec![sym("b"), sym("s"), d.clone()]), Some(vec![sym("b"), sym("s"), d.clone()])),
    };
    let a = b.input("a", elem, a_dims.as_deref());
    let skip = b.input("skip", elem, b_dims.as_deref());
    let a = if a_dims.as_ref().is_some_and(|d| d.len() == 3) && a_dims == b_dims && rng.chance(0.2) {
        cache_rows(rng, &mut c, &mut b, &a, elem)
    } else {
        a
    };
    let before = b.graph.node.len();
    let left = if rng.chance(0.3) {
        let (shape, note) = match rng.below(4) {
            0 => (vec![2, HIDDEN], "a bias of [2, D]: no bias"),
            1 => (vec![1, 1, HIDDEN], "a bias of [1, 1, D]"),
            _ => (vec![HIDDEN], "a bias of [D]"),
        };
        c.note(note);
        if shape[0] == 2 {
            c.unsure("a [2, D] term broadcasts the input");
        }
        // A bias folds where it cannot raise the input's rank; otherwise,
        // or where the fold is blocked, its Add is the input, and the bias
        // stays outside the match.
        c.aside.push("bias".into());
        let n: i64 = shape.iter().product();
        let bias = b.init("bias", tensor(elem, &shape, &(0..n).map(|i| i as f64 / 16.0).collect::<Vec<_>>()));
        let biased = commuted(rng, &mut b, "Add", &a, &bias);
        c.aside.push(biased.clone());
        biased
    } else {
        a.clone()
    };
    let mut s = commuted(rng, &mut b, "Add", &left, &skip);
    if left == a && d == D::N(HIDDEN) && rng.chance(0.15) {
        // onnxscript's form: the bias added to the sum afterwards.
        c.note("a bias of [D] added to the sum afterwards");
        // Defined again, it blocks the fold, and the norm then reads a sum
        // of the stream and a bias, which no kernel takes.
        c.may_stay.push("bias".into());
        let bias = b.init("bias", tensor(elem, &[HIDDEN], &(0..HIDDEN).map(|i| i as f64 / 16.0).collect::<Vec<_>>()));
        s = commuted(rng, &mut b, "Add", &s, &bias);
    }
    c.aside.push(s.clone());
    let x = if rng.chance(0.15) {
        c.note("an identity Cast between the sum and the norm");
        let cast = b.node("Cast", &[&s], vec![attr_int("to", elem as i64)]);
        c.aside.push(cast.clone());
        cast
    } else {
        s.clone()
    };
    let w: Vec<f64> = (0..HIDDEN).map(|i| 1.0 + 0.25 * i as f64).collect();
    let gamma = if rng.chance(0.05) {
        c.unsure("gamma of [1, D]");
        b.init("gamma", tensor(elem, &[1, HIDDEN], &w))
    } else {
        b.init("gamma", tensor(elem, &[HIDDEN], &w))
    };
    let eps = rng.pick(&[1e-5, 1e-6, 1e-12]);
    let mut attrs = vec![attr_float("epsilon", eps)];
    if rng.chance(0.05) {
        c.breaks("stash_type 0");
        attrs.push(attr_int("stash_type", 0));
    }
    if rng.chance(0.05) {
        c.breaks("axis 0");
        attrs.push(attr_int("axis", 0));
    }
    let inner = computed_since(&b, before);
    let y = if rng.chance(0.5) {
        c.note("SimplifiedLayerNormalization");
        b.node("SimplifiedLayerNormalization", &[&x, &gamma], attrs)
    } else if rng.chance(0.3) || elem == FLOAT16 {
        // (ONNX Runtime's f16 LayerNormalization rounds before it adds a
        // beta, the f16 kernel of SkipLayerNormalization once at the end:
        // near zero they differ by more than f16's tolerance, measured.)
        c.note("no beta");
        b.node("LayerNormalization", &[&x, &gamma], attrs)
    } else {
        let beta = b.init("beta", tensor(elem, &[HIDDEN], &[0.1, 0.2, 0.3, 0.4]));
        b.node("LayerNormalization", &[&x, &gamma, &beta], attrs)
    };
    b.output(&y, elem, None);
    match rng.below(4) {
        0 => {
            c.note("the sum is a graph output");
            b.output(&s, elem, None);
        }
        1 => {
            c.note("the sum is read again");
            let r = b.node("Neg", &[&s], vec![]);
            b.output(&r, elem, None);
        }
        _ => {}
    }
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// attention as decoders write it, the form the kernel (ONNX `Attention`,
/// opset 23) takes: the key and value from a KV cache `Concat(past, new)`
/// or repeated in place for grouped heads (torch's repeat_kv, shapes
/// computed at run time as exports compute them), the SDPA scale on q and
/// the key or a scale of the scores, a mask `Where(keep, 0, fill)` of
/// boolean inputs whose rows are often all hidden (a key length of 1), and
/// a NaN guard. Mutations: heads repeated in another order, the cache
/// concatenated on the head axis, a repeat the key and value do not share,
/// a fill that leaves hidden keys weight.
pub fn decoder_attention(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[14i64, 18, 23, 23]);
    let elem = FLOAT;
    let kv = rng.pick(&[1i64, 2]);
    let n = rng.pick(&[1i64, 2, 2]);
    let heads = kv * n;
    let d = D::N(HIDDEN);
    let cache = rng.chance(0.6);
    let new_len = if cache { sym("s") } else { sym("t") };
    // An encoder's core: the heads split from [b, s, h·d] projections and
    // merged back (the kernel's 3-D form reads and writes those).
    let merged = !cache && n == 1 && rng.chance(0.5);
    let mut key_split_transposed = false;
    if merged {
        c.note("heads split from [b, s, h·d] and merged back");
        key_split_transposed = rng.chance(0.5);
    }
    let split = |b: &mut Builder, c: &mut Ctx, rng: &mut Rng, name: &str, len: D, perm: &[i64]| -> String {
        let x = b.input(name, elem, Some(&[sym("b"), len, D::N(heads * HIDDEN)]));
        let shape = b.node("Shape", &[&x], vec![]);
        let (zero, two) = (b.ints(&[0]), b.ints(&[2]));
        let lead = b.node("Slice", &[&shape, &zero, &two], vec![]);
        if heads > 1 && rng.chance(0.1) {
            // [b, s, d, h] brought to [b, h, s, d]: the same shapes, the
            // elements of another head.
            c.note(format!("{name}'s heads split as [d, h]"));
            let dh = b.ints(&[HIDDEN, heads]);
            let target = b.node("Concat", &[&lead, &dh], vec![attr_int("axis", 0)]);
            let r = b.node("Reshape", &[&x, &target], vec![]);
            let perm: Vec<i64> = if perm == [0, 2, 3, 1] {
                // The kernel's 3-D form declines it; --target portable reads
                // the key transposed by [0, 3, 1, 2] (a new Transpose).
                c.unsure("the key's Transpose [0, 3, 2, 1]");
                vec![0, 3, 2, 1]
            } else {
                vec![0, 3, 1, 2]
            };
            return b.node("Transpose", &[&r], vec![attr_ints("perm", &perm)]);
        }
        let hd = b.ints(&[heads, HIDDEN]);
        let target = b.node("Concat", &[&lead, &hd], vec![attr_int("axis", 0)]);
        let r = b.node("Reshape", &[&x, &target], vec![]);
        let t = b.node("Transpose", &[&r], vec![attr_ints("perm", perm)]);
        if rng.chance(0.2) {
            c.note(format!("an Identity after {name}'s heads (dynamo)"));
            return b.node("Identity", &[&t], vec![]);
        }
        t
    };
    let q = if merged {
        split(&mut b, &mut c, rng, "q", sym("s"), &[0, 2, 1, 3])
    } else {
        b.input("q", elem, Some(&[sym("b"), D::N(heads), sym("s"), d.clone()]))
    };
    let source = |b: &mut Builder, c: &mut Ctx, rng: &mut Rng, name: &str| -> String {
        if merged {
            let perm: &[i64] = if name == "key" && key_split_transposed { &[0, 2, 3, 1] } else { &[0, 2, 1, 3] };
            return split(b, c, rng, name, new_len.clone(), perm);
        }
        let x = b.input(name, elem, Some(&[sym("b"), D::N(kv), new_len.clone(), d.clone()]));
        if !cache {
            return x;
        }
        let past = b.input(&format!("past_{name}"), elem, Some(&[sym("b"), D::N(kv), sym("t"), d.clone()]));
        b.node("Concat", &[&past, &x], vec![attr_int("axis", 2)])
    };
    let (mut key, mut value) = (source(&mut b, &mut c, rng, "key"), source(&mut b, &mut c, rng, "value"));
    if cache && rng.chance(0.08) {
        c.unsure("the key's cache concatenated on the head axis");
        let past = b.input("past_key_heads", elem, Some(&[sym("b"), D::N(kv), sym("s"), d.clone()]));
        let new = b.input("key_heads", elem, Some(&[sym("b"), D::N(kv), sym("s"), d.clone()]));
        key = b.node("Concat", &[&past, &new], vec![attr_int("axis", 1)]);
    }
    // Multi-query attention (Falcon): one KV head the products broadcast
    // over the query heads, no repeat written.
    let broadcast = kv == 1 && n > 1 && !merged && rng.chance(0.25);
    if broadcast {
        c.note("one KV head broadcast by the products over the query heads");
    }
    if n > 1 && !broadcast {
        let repeat = |b: &mut Builder, c: &mut Ctx, rng: &mut Rng, x: &str, times: i64| -> String {
            let shape = b.node("Shape", &[x], vec![]);
            let (zero, two, four) = (b.ints(&[0]), b.ints(&[2]), b.ints(&[4]));
            let lead = b.node("Slice", &[&shape, &zero, &two], vec![]);
            let rows = b.node("Slice", &[&shape, &two, &four], vec![]);
            let copies = b.ints(&[times]);
            let merged_heads = b.ints(&[-1]);
            let one = b.ints(&[1]);
            let batch = b.node("Slice", &[&shape, &zero, &one], vec![]);
            match rng.below(12) {
                0 if kv > 1 => {
                    c.unsure("heads repeated whole (h0, h1, h0, h1): a Tile of the head axis");
                    let reps = b.ints(&[1, times, 1, 1]);
                    b.node("Tile", &[x, &reps], vec![])
                }
                1 if kv > 1 => {
                    c.unsure("heads repeated whole: the new axis before the heads");
                    let heads = b.ints(&[kv]);
                    let u = b.node("Unsqueeze", &[x, &one], vec![]);
                    let target = b.node("Concat", &[&batch, &copies, &heads, &rows], vec![attr_int("axis", 0)]);
                    let e = b.node("Expand", &[&u, &target], vec![]);
                    let to = b.node("Concat", &[&batch, &merged_heads, &rows], vec![attr_int("axis", 0)]);
                    b.node("Reshape", &[&e, &to], vec![])
                }
                k => {
                    let u = b.node("Unsqueeze", &[x, &two], vec![]);
                    let e = if k % 3 == 0 {
                        c.note("the repeat as a Tile of the new axis");
                        let reps = b.ints(&[1, 1, times, 1, 1]);
                        b.node("Tile", &[&u, &reps], vec![])
                    } else {
                        let target = b.node("Concat", &[&lead, &copies, &rows], vec![attr_int("axis", 0)]);
                        b.node("Expand", &[&u, &target], vec![])
                    };
                    let to = b.node("Concat", &[&batch, &merged_heads, &rows], vec![attr_int("axis", 0)]);
                    b.node("Reshape", &[&e, &to], vec![])
                }
            }
        };
        // (ONNX's Attention reads the key and value before the repeat, as
        // grouped heads, for both targets.)
        c.note("grouped heads repeated in place");
        key = repeat(&mut b, &mut c, rng, &key, n);
        value = repeat(&mut b, &mut c, rng, &value, n);
    }
    // The scale: SDPA's √scale on q and the transposed key, or on the scores.
    let sdpa = rng.chance(0.5);
    if sdpa {
        // f32 here: portable takes it into Attention's scale too.
        c.note("SDPA's scale on q and the key");
    }
    let (q, s_scale) = if sdpa {
        let rank = rng.pick(&[0, 1]);
        let c_q = one_value(rng, &mut b, "sqrt_scale_q", elem, rank, 0.7071067811865476);
        let q = b.node("Mul", &[&q, &c_q], vec![]);
        if rng.chance(0.3) {
            c.note("q scaled a second time (ESM)");
            let again = one_value(rng, &mut b, "second_scale_q", elem, rank, 1.0);
            (b.node("Mul", &[&q, &again], vec![]), None)
        } else {
            (q, None)
        }
    } else {
        (q, Some(one_value(rng, &mut b, "scale", elem, 0, 0.5)))
    };
    // BART's and BLOOM's eager attention: q, k and v with their heads
    // folded into the batch, [b·h, s, d], the scores viewed as
    // [b, h, s, t] for the mask and back (before or after the softmax),
    // the output split back into the heads.
    let folded = !broadcast && !key_split_transposed && rng.chance(0.25);
    let q4 = q.clone();
    let fold = |b: &mut Builder, x: &str| -> String {
        let shape = b.node("Shape", &[x], vec![]);
        let (zero, one, two, four) = (b.ints(&[0]), b.ints(&[1]), b.ints(&[2]), b.ints(&[4]));
        let batch = b.node("Slice", &[&shape, &zero, &one], vec![]);
        let heads = b.node("Slice", &[&shape, &one, &two], vec![]);
        let rows = b.node("Slice", &[&shape, &two, &four], vec![]);
        let bh = b.node("Mul", &[&batch, &heads], vec![]);
        let target = b.node("Concat", &[&bh, &rows], vec![attr_int("axis", 0)]);
        b.node("Reshape", &[x, &target], vec![])
    };
    // [b·h, s, y] viewed as q's [b, h, s] and the last axis of `last`
    // (axis `at`), the sizes read from values before the core as BART's
    // export reads them.
    let unfold = |b: &mut Builder, x: &str, last: &str, at: i64| -> String {
        let (heads, rows) = (b.node("Shape", &[&q4], vec![]), b.node("Shape", &[last], vec![]));
        let (zero, three, from, to) = (b.ints(&[0]), b.ints(&[3]), b.ints(&[at]), b.ints(&[at + 1]));
        let lead = b.node("Slice", &[&heads, &zero, &three], vec![]);
        let rest = b.node("Slice", &[&rows, &from, &to], vec![]);
        let target = b.node("Concat", &[&lead, &rest], vec![attr_int("axis", 0)]);
        b.node("Reshape", &[x, &target], vec![])
    };
    let (key4, value4) = (key.clone(), value.clone());
    let (q, value) = if folded {
        c.note("heads folded into the batch, the scores viewed as [b, h, s, t]");
        (fold(&mut b, &q), fold(&mut b, &value))
    } else {
        (q, value)
    };
    // torch's SDPA decomposition of grouped heads (dynamo): the key's
    // repeat folded into the batch, transposed, and viewed back.
    let spread = (n > 1 && !folded && !key_split_transposed && rng.chance(0.3))
        .then(|| {
            b.graph.node.iter().find(|r| r.op_type() == "Reshape" && r.output[0] == key).map(|r| r.input[0].clone())
        })
        .flatten();
    // The same of the 4-D key, repeated or not (SDPA's decomposition of
    // any 4-D key, and of `enable_gqa`'s repeat).
    let spread = match spread {
        None if !folded && !key_split_transposed && rng.chance(0.15) => {
            c.note("the 4-D key folded into the batch, transposed and viewed back (SDPA's decomposition)");
            Some(key.clone())
        }
        spread => {
            if spread.is_some() {
                c.note("the repeated key folded into the batch, transposed and viewed back (SDPA's decomposition)");
            }
            spread
        }
    };
    let mut k = if key_split_transposed {
        key.clone()
    } else if folded {
        let k3 = fold(&mut b, &key);
        b.node("Transpose", &[&k3], vec![attr_ints("perm", &[0, 2, 1])])
    } else if let Some(e) = spread {
        // (Both targets read the key before its repeat: one translator.)
        let shape = b.node("Shape", &[&key], vec![]);
        let at: Vec<String> = (0..5).map(|i| b.ints(&[i])).collect();
        let axis = |b: &mut Builder, i: usize| b.node("Slice", &[&shape, &at[i], &at[i + 1]], vec![]);
        let (batch, heads, rows, width) = (axis(&mut b, 0), axis(&mut b, 1), axis(&mut b, 2), axis(&mut b, 3));
        let bh = b.node("Mul", &[&batch, &heads], vec![]);
        let folded_shape = b.node("Concat", &[&bh, &rows, &width], vec![attr_int("axis", 0)]);
        let x3 = b.node("Reshape", &[&e, &folded_shape], vec![]);
        let t = b.node("Transpose", &[&x3], vec![attr_ints("perm", &[0, 2, 1])]);
        let view = b.node("Concat", &[&batch, &heads, &width, &rows], vec![attr_int("axis", 0)]);
        b.node("Reshape", &[&t, &view], vec![])
    } else {
        b.node("Transpose", &[&key], vec![attr_ints("perm", &[0, 1, 3, 2])])
    };
    if sdpa {
        let c_k = one_value(rng, &mut b, "sqrt_scale_k", elem, 0, 0.7071067811865476);
        k = b.node("Mul", &[&k, &c_k], vec![]);
    }
    // The mask, computed before the core (which reads it as an input).
    let mut mask = None;
    let mut replaced: Option<(String, String, bool)> = None;
    let mut add_after = false;
    if rng.chance(0.8) {
        let keys = if cache { vec![sym("t"), sym("s")] } else { vec![sym("t")] };
        let parts: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, len)| b.input(&format!("keep_{i}"), BOOL, Some(&[sym("b"), D::N(1), sym("s"), len.clone()])))
            .collect();
        let keep = if parts.len() == 1 {
            parts[0].clone()
        } else {
            b.node("Concat", &[&parts[0], &parts[1]], vec![attr_int("axis", -1)])
        };
        let fill = match rng.below(6) {
            0 => -1e9,
            1 => f64::NEG_INFINITY,
            2 if rng.chance(0.3) => {
                c.unsure("a fill of -100: hidden keys keep weight");
                -100.0
            }
            _ => f64::from(f32::MIN),
        };
        let hidden = one_value(rng, &mut b, "hidden", elem, 0, fill);
        if rng.chance(0.4) {
            // The mask replaces the hidden scores (masked_fill names them).
            if fill > -1e4 {
                c.breaks("a Where fill above -1e4");
            }
            let hides = rng.chance(0.5);
            c.ort_only(format!("scores Where, fill {fill}{}", if hides { ", masked_fill" } else { "" }));
            let condition = if hides { b.node("Not", &[&keep], vec![]) } else { keep };
            replaced = Some((condition, hidden, hides));
            if rng.chance(0.5) {
                // GPT-2: the causal Where and an additive padding mask, the
                // Add before or after it (the kernel takes both as one mask).
                let pad = b.input("pad", BOOL, Some(&[sym("b"), D::N(1), D::N(1), keys[0].clone()]));
                let pad = if cache {
                    let recent = b.input("pad_recent", BOOL, Some(&[sym("b"), D::N(1), D::N(1), sym("s")]));
                    b.node("Concat", &[&pad, &recent], vec![attr_int("axis", -1)])
                } else {
                    pad
                };
                let pad_fill = [f64::from(f32::MIN), -1e9, f64::NEG_INFINITY][rng.below(3)];
                let zero = one_value(rng, &mut b, "pad_visible", elem, 0, 0.0);
                let hidden = one_value(rng, &mut b, "pad_hidden", elem, 0, pad_fill);
                c.aside.extend(["pad_visible", "pad_hidden"].map(String::from));
                add_after = rng.chance(0.7);
                c.ort_only(format!("and an additive mask, {}", if add_after { "after" } else { "before" }));
                mask = Some(b.node("Where", &[&pad, &zero, &hidden], vec![]));
            }
        } else {
            c.ort_only(format!("mask Where(keep, 0, {fill})"));
            let zero = one_value(rng, &mut b, "visible", elem, 0, 0.0);
            mask = Some(b.node("Where", &[&keep, &zero, &hidden], vec![]));
        }
    }
    // What the core reads is computed by now: a second definition of one
    // of its constants, or another reader of the q and key it reads, leaves
    // the core as it is (the kernel falls back to it).
    c.aside.extend(["visible", "sqrt_scale_q", "second_scale_q", "sqrt_scale_k"].map(String::from));
    c.portable_reads.extend(["sqrt_scale_q", "second_scale_q", "sqrt_scale_k"].map(String::from));
    if replaced.is_none() {
        // (A fill the core's own Where reads is the core's.)
        c.aside.push("hidden".into());
    }
    // A second additive term before the mask (MPNet's relative position
    // bias): the kernel takes the two as one, where one of them is 0.
    let bias = (mask.is_some() && rng.chance(0.3)).then(|| {
        c.ort_only("a position bias added before the mask");
        let per_batch = rng.chance(0.5);
        let lead = if per_batch { sym("b") } else { D::N(1) };
        let bias = b.input("bias", elem, Some(&[lead.clone(), D::N(heads), sym("s"), sym("t")]));
        let bias = if cache {
            let recent = b.input("bias_recent", elem, Some(&[lead, D::N(heads), sym("s"), sym("s")]));
            b.node("Concat", &[&bias, &recent], vec![attr_int("axis", -1)])
        } else {
            bias
        };
        // DeBERTa: [b·h, s, t] added to the folded scores before their view.
        let folded_too = folded && per_batch && rng.chance(0.5);
        if folded_too {
            c.note("the bias added to the folded scores before their view");
        }
        (if folded_too { fold(&mut b, &bias) } else { bias }, folded_too)
    });
    let before = b.graph.node.len();
    let mut s = b.node("MatMul", &[&q, &k], vec![]);
    if let Some(scale) = s_scale {
        s = commuted(rng, &mut b, "Mul", &s, &scale);
    }
    if let Some((bias, true)) = &bias {
        s = commuted(rng, &mut b, "Add", &s, bias);
    }
    let scores3 = s.clone();
    let back_after_softmax = folded && rng.chance(0.4);
    if folded {
        s = unfold(&mut b, &s, &key4, 2);
    }
    if let Some((bias, false)) = &bias {
        s = commuted(rng, &mut b, "Add", &s, bias);
    }
    if let Some(mask) = mask.as_ref().filter(|_| !add_after) {
        s = commuted(rng, &mut b, "Add", &s, mask);
    }
    if let Some((condition, fill, hides)) = replaced {
        let inputs = if hides { [&condition, &fill, &s] } else { [&condition, &s, &fill] };
        s = b.node("Where", &inputs.map(String::as_str), vec![]);
    }
    if let Some(mask) = mask.as_ref().filter(|_| add_after) {
        s = commuted(rng, &mut b, "Add", &s, mask);
    }
    let back = |b: &mut Builder, x: &str| -> String {
        let shape = b.node("Shape", &[&scores3], vec![]);
        b.node("Reshape", &[x, &shape], vec![])
    };
    if folded && !back_after_softmax {
        s = back(&mut b, &s);
    }
    let mut p = b.node("Softmax", &[&s], vec![attr_int("axis", -1)]);
    if back_after_softmax {
        c.note("the probabilities viewed back");
        p = back(&mut b, &p);
    }
    if rng.chance(0.5) {
        c.ort_only("NaN guard");
        let nan = b.node("IsNaN", &[&p], vec![]);
        let z = one_value(rng, &mut b, "nan_zero", elem, 0, 0.0);
        p = b.node("Where", &[&nan, &z, &p], vec![]);
    }
    let inner = computed_since(&b, before);
    let mut out = b.node("MatMul", &[&p, &value], vec![]);
    if folded {
        out = unfold(&mut b, &out, &value4, 3);
    }
    if merged && rng.chance(0.8) {
        let perm: &[i64] = if heads > 1 && rng.chance(0.1) {
            c.note("the output merged as [d, h]");
            &[0, 2, 3, 1]
        } else {
            &[0, 2, 1, 3]
        };
        let mut t = b.node("Transpose", &[&out], vec![attr_ints("perm", perm)]);
        if rng.chance(0.2) {
            c.note("an Identity after the output's Transpose (dynamo)");
            t = b.node("Identity", &[&t], vec![]);
        }
        if rng.chance(0.1) {
            c.note("the output's Transpose is also a graph output");
            b.output(&t, elem, None);
        }
        let shape = b.node("Shape", &[&t], vec![]);
        let (zero, two) = (b.ints(&[0]), b.ints(&[2]));
        let lead = b.node("Slice", &[&shape, &zero, &two], vec![]);
        let width = b.ints(&[heads * HIDDEN]);
        let target = b.node("Concat", &[&lead, &width], vec![attr_int("axis", 0)]);
        out = b.node("Reshape", &[&t, &target], vec![]);
    }
    b.output(&out, elem, None);
    if cache {
        // The present values are the model's outputs.
        b.output(&key_present(&b), elem, None);
    }
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// The first cache Concat's output (the present key).
fn key_present(b: &Builder) -> String {
    let concat = b.graph.node.iter().find(|n| n.op_type() == "Concat" && n.attribute.iter().any(|a| a.i() == 2));
    concat.map(|n| n.output[0].clone()).unwrap_or_default()
}

/// The interleaved rotary (GPT-J's `rotate_every_two`): each pair of x
/// turned, `Reshape(Concat(Unsqueeze(−x₀), Unsqueeze(xₑ)))`, the tables
/// `repeat_interleave(rows, 2)` of rows `[b or 1, s, d/2]` as the
/// TorchScript (nested Unsqueezes, Tile, a Reshape to `Shape(…)[:3] + [-1]`)
/// and dynamo (one Unsqueeze, Expand, constant sizes) exports write them,
/// broadcast over x's heads second or third; every operand either order.
pub fn interleaved_rotary(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[18i64, 23, 23]);
    if opset < 23 {
        c.unsure("opset 18: RotaryEmbedding is written from 23 (after an upgrade)");
    }
    let elem = kernel_elem(rng, &mut c);
    let d = rng.pick(&[4i64, 8]);
    let last = if rng.chance(0.08) {
        c.breaks("x's last axis is symbolic");
        sym("d")
    } else {
        D::N(d)
    };
    let heads = if rng.chance(0.5) {
        c.note("heads third ([b, s, h, d]): the 3-D kernel");
        2
    } else {
        1
    };
    let heads_dim = match rng.chance(0.08) {
        true if heads == 2 => {
            c.breaks("x's heads are symbolic: the 3-D kernel needs their number");
            sym("h")
        }
        true => {
            c.note("x's heads are symbolic");
            sym("h")
        }
        false => D::N(2),
    };
    let dims = if heads == 2 { [sym("b"), sym("s"), heads_dim, last] } else { [sym("b"), heads_dim, sym("s"), last] };
    let x = b.input("x", elem, Some(&dims));
    let batch = match rng.below(8) {
        0 => {
            c.note("rows of x's batch");
            sym("b")
        }
        1 => {
            c.unsure("rows of batch 2 where x's is b");
            D::N(2)
        }
        _ => D::N(1),
    };
    let whole = rng.chance(0.08);
    if whole {
        c.breaks("the tables repeated whole, not each value twice");
    }
    let torchscript = rng.chance(0.5);
    let ints = |b: &mut Builder, v: &[i64]| b.ints(v);
    let table = |b: &mut Builder, c: &mut Ctx, rng: &mut Rng, name: &str| -> String {
        let rows = b.input(name, elem, Some(&[batch.clone(), sym("s"), D::N(d / 2)]));
        if !whole && rng.chance(0.2) {
            return gathered_table(b, c, rng, &rows, name, heads, d);
        }
        let new_axis = if whole { 3 } else { 4 };
        let unsqueezed = |b: &mut Builder| {
            if torchscript {
                let (first, second) = (ints(b, &[heads]), ints(b, &[new_axis]));
                let u = b.node("Unsqueeze", &[&rows, &first], vec![]);
                b.node("Unsqueeze", &[&u, &second], vec![])
            } else {
                let axes = ints(b, &[heads, new_axis]);
                b.node("Unsqueeze", &[&rows, &axes], vec![])
            }
        };
        let u = unsqueezed(b);
        let mut reps = vec![1i64; 5];
        reps[new_axis as usize] = 2;
        let repeated = if !whole && rng.chance(0.2) {
            // RoFormer's `stack([rows, rows], -1)`: the rows unsqueezed
            // at the end twice, each with its own axes, concatenated.
            c.note(format!("the {name} rows stacked with themselves"));
            let twin = unsqueezed(b);
            b.node("Concat", &[&u, &twin], vec![attr_int("axis", rng.pick(&[-1, 4]))])
        } else if rng.chance(0.5) {
            c.note(format!("the {name} rows tiled"));
            let reps = ints(b, &reps);
            b.node("Tile", &[&u, &reps], vec![])
        } else {
            c.note(format!("the {name} rows expanded"));
            let shape = ints(b, &reps);
            b.node("Expand", &[&u, &shape], vec![])
        };
        let to = if torchscript { leading_then_merged(b, &repeated, 3) } else { ints(b, &[0, 0, 0, -1]) };
        b.node("Reshape", &[&repeated, &to], vec![])
    };
    let cos = table(&mut b, &mut c, rng, "cos");
    let sin = table(&mut b, &mut c, rng, "sin");
    let before = b.graph.node.len();
    let step = if rng.chance(0.08) {
        c.breaks("the odd values sliced by 1");
        1
    } else {
        2
    };
    let end = if rng.chance(0.5) { i64::MAX } else { d };
    let (zero, one, end, axis) = (ints(&mut b, &[0]), ints(&mut b, &[1]), ints(&mut b, &[end]), ints(&mut b, &[-1]));
    let (two, by) = (ints(&mut b, &[2]), ints(&mut b, &[step]));
    let even = b.node("Slice", &[&x, &zero, &end, &axis, &two], vec![]);
    let odd = b.node("Slice", &[&x, &one, &end, &axis, &by], vec![]);
    let (negated, kept) = if rng.chance(0.08) {
        c.breaks("each pair turned as (−xₑ, x₀)");
        (even, odd)
    } else {
        (odd, even)
    };
    let neg = b.node("Neg", &[&negated], vec![]);
    let new_last = ints(&mut b, &[rng.pick(&[-1, 4])]);
    let first = b.node("Unsqueeze", &[&neg, &new_last], vec![]);
    let second = b.node("Unsqueeze", &[&kept, &new_last], vec![]);
    let stacked = b.node("Concat", &[&first, &second], vec![attr_int("axis", rng.pick(&[-1, 4]))]);
    let to = if torchscript { leading_then_merged(&mut b, &stacked, -2) } else { ints(&mut b, &[0, 0, 0, -1]) };
    let turned = b.node("Reshape", &[&stacked, &to], vec![]);
    rotary_sum(rng, c, b, [&x, &cos, &turned, &sin], before, opset, elem)
}

/// The rows repeated by torch's general `repeat_interleave` (Cohere's and
/// GLM's tables, `gathered_pairs`), unsqueezed at the heads axis; broken:
/// uneven repeats (as many values), or pairs of a value and its negation.
fn gathered_table(b: &mut Builder, c: &mut Ctx, rng: &mut Rng, rows: &str, name: &str, heads: i64, d: i64) -> String {
    c.note(format!("the {name} rows repeated by gathering (torch's general repeat_interleave)"));
    let how = if rng.chance(0.08) {
        c.breaks(format!("the {name} rows repeated unevenly (as many values)"));
        Gathered::Uneven
    } else if rng.chance(0.08) {
        c.breaks(format!("the {name} rows gathered in pairs of a value and its negation"));
        Gathered::Negated
    } else {
        Gathered::Pairs
    };
    let table = gathered_pairs(b, rows, (d / 2) as usize, how);
    let heads_axis = b.ints(&[heads]);
    b.node("Unsqueeze", &[&table, &heads_axis], vec![])
}

/// `x·cos + turned·sin`, every operand either order, as the case's output;
/// what was computed since `before` may get another reader.
fn rotary_sum(
    rng: &mut Rng,
    mut c: Ctx,
    mut b: Builder,
    [x, cos, turned, sin]: [&str; 4],
    before: usize,
    opset: i64,
    elem: i32,
) -> Case {
    let plain = commuted(rng, &mut b, "Mul", x, cos);
    let rotated = commuted(rng, &mut b, "Mul", turned, sin);
    let inner = computed_since(&b, before);
    let out = commuted(rng, &mut b, "Add", &plain, &rotated);
    b.output(&out, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// The sizes `Shape(v)[:end] + [-1]`: a Reshape target merging v's axes
/// from `end` on, as TorchScript exports compute it.
fn leading_then_merged(b: &mut Builder, v: &str, end: i64) -> String {
    let shape = b.node("Shape", &[v], vec![]);
    let (zero, end, minus_one) = (b.ints(&[0]), b.ints(&[end]), b.ints(&[-1]));
    let lead = b.node("Slice", &[&shape, &zero, &end, &zero], vec![]);
    b.node("Concat", &[&lead, &minus_one], vec![attr_int("axis", 0)])
}

/// A rotary's x, `[b, 2, s, d]` or heads third `[b, s, 2, d]` (the 3-D
/// kernel), d 4 or 8 (symbolic now and then: no kernel), and the batch
/// of its tables: one row, x's, or 2 (unsure).
struct RotaryX {
    x: String,
    dims: [D; 4],
    d: i64,
    heads_third: bool,
    batch: D,
}

/// The opset (18 or 23), the element type and the x of a rotary case.
fn rotary_x(rng: &mut Rng, c: &mut Ctx, b: &mut Builder) -> (i64, i32, RotaryX) {
    let opset = rng.pick(&[18i64, 18, 23, 23]);
    if opset < 23 {
        c.unsure("opset 18: RotaryEmbedding is written from 23 (after an upgrade)");
    }
    let elem = kernel_elem(rng, c);
    let d = rng.pick(&[4i64, 8]);
    let last = match rng.below(12) {
        0 => {
            c.breaks("x's last axis is symbolic");
            sym("d")
        }
        _ => D::N(d),
    };
    let heads_third = rng.chance(0.3);
    let dims = if heads_third {
        c.note("heads third ([b, s, h, d]): the 3-D kernel");
        [sym("b"), sym("s"), D::N(2), last]
    } else {
        [sym("b"), D::N(2), sym("s"), last]
    };
    let x = b.input("x", elem, Some(&dims));
    let batch = match rng.below(8) {
        0 => {
            c.note("tables of x's batch");
            sym("b")
        }
        1 => {
            c.unsure("tables of batch 2 where x's is b");
            D::N(2)
        }
        _ => D::N(1),
    };
    (opset, elem, RotaryX { x, dims, d, heads_third, batch })
}

/// The tables cos and sin unsqueezed at x's heads axis `heads` (1 or 2),
/// now and then at the other one (unsure).
fn at_heads_axis(rng: &mut Rng, c: &mut Ctx, b: &mut Builder, heads: i64, [cos, sin]: [&str; 2]) -> (String, String) {
    let at = if rng.chance(0.08) {
        c.unsure("the tables unsqueezed at the other heads axis");
        3 - heads
    } else {
        heads
    };
    let axis = b.constant(tensor(INT64, &[1], &[at as f64]));
    (b.node("Unsqueeze", &[cos, &axis], vec![]), b.node("Unsqueeze", &[sin, &axis], vec![]))
}

/// rotary: `x·cos + rotate_half(x)·sin` with tables `[b or 1, s, d]`
/// unsqueezed at x's heads axis (second, or third: the 3-D kernel), each
/// the `cat(freqs, freqs)` of Hugging Face's exports through elementwise
/// steps; every operand either order.
pub fn rotary(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let (opset, elem, RotaryX { x, d, heads_third, batch, .. }) = rotary_x(rng, &mut c, &mut b);
    // OLMo 2's f16 export: x and its turn widened to f32 before the
    // products, the tables f32.
    let widen = elem == FLOAT16 && rng.chance(0.4);
    let tables = if widen {
        c.note("x and its turn widened to f32 before the products");
        FLOAT
    } else {
        elem
    };
    let freqs = b.input("freqs", tables, Some(&[batch.clone(), sym("s"), D::N(d / 2)]));
    let other = if rng.chance(0.08) {
        c.breaks("the table's halves differ");
        b.input("other", tables, Some(&[batch, sym("s"), D::N(d / 2)]))
    } else {
        freqs.clone()
    };
    let emb = b.node("Concat", &[&freqs, &other], vec![attr_int("axis", rng.pick(&[-1, 2]))]);
    let table = |b: &mut Builder, c: &mut Ctx, rng: &mut Rng, op: &str| -> String {
        let mut t = b.node(op, &[&emb], vec![]);
        if rng.chance(0.2) {
            c.note(format!("the {op} table scaled by one value"));
            let rank = rng.pick(&[0, 1]);
            let k = one_value(rng, b, &format!("scaling_{op}"), tables, rank, 0.75);
            t = commuted(rng, b, "Mul", &t, &k);
        }
        t
    };
    let cos = table(&mut b, &mut c, rng, "Cos");
    let sin = if rng.chance(0.05) {
        c.note("the sin table is the cos table");
        cos.clone()
    } else {
        table(&mut b, &mut c, rng, "Sin")
    };
    let ints = |b: &mut Builder, v: i64| b.constant(tensor(INT64, &[1], &[v as f64]));
    let heads = if heads_third { 2 } else { 1 };
    let (cos, sin) = at_heads_axis(rng, &mut c, &mut b, heads, [&cos, &sin]);
    // ESM's tables: the 4-D table sliced on the sequence axis to x's
    // length (a Slice of another axis keeps its rows whole).
    let (cos, sin) = if rng.chance(0.2) {
        c.note("the 4-D tables sliced on the sequence axis to x's length");
        let sequence = 3 - heads;
        let (zero, axis) = (b.ints(&[0]), b.ints(&[sequence]));
        let length = b.node("Shape", &[&x], vec![attr_int("start", sequence), attr_int("end", sequence + 1)]);
        let cut = |b: &mut Builder, t: &str| b.node("Slice", &[t, &zero, &length, &axis], vec![]);
        (cut(&mut b, &cos), cut(&mut b, &sin))
    } else {
        (cos, sin)
    };
    let before = b.graph.node.len();
    let half = if rng.chance(0.08) {
        c.breaks("the halves cut one early");
        d / 2 - 1
    } else {
        d / 2
    };
    let end = if rng.chance(0.5) { i64::MAX } else { d };
    let (zero, cut, end, last) = (ints(&mut b, 0), ints(&mut b, half), ints(&mut b, end), ints(&mut b, -1));
    let (x1, x2) = if rng.chance(0.25) {
        // `x.chunk(2, -1)` (ESM's rotate_half): the two parts of a Split.
        let parts = ["x_first_half".to_string(), "x_second_half".to_string()];
        let mut attributes = vec![attr_int("axis", rng.pick(&[-1, 3]))];
        let sizes = if half == d / 2 && rng.chance(0.5) {
            c.note("the halves a Split in two (num_outputs)");
            attributes.push(attr_int("num_outputs", 2));
            vec![x.clone()]
        } else {
            c.note("the halves a Split by sizes");
            vec![x.clone(), b.ints(&[half, d - half])]
        };
        let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
        b.node_to("Split", &sizes, &[&parts[0], &parts[1]], attributes);
        let [x1, x2] = parts;
        (x1, x2)
    } else {
        (b.node("Slice", &[&x, &zero, &cut, &last], vec![]), b.node("Slice", &[&x, &cut, &end, &last], vec![]))
    };
    let turned = if rng.chance(0.08) {
        c.breaks("the other turn: Concat(−x₁, x₂)");
        let neg = b.node("Neg", &[&x1], vec![]);
        b.node("Concat", &[&neg, &x2], vec![attr_int("axis", -1)])
    } else {
        let neg = b.node("Neg", &[&x2], vec![]);
        b.node("Concat", &[&neg, &x1], vec![attr_int("axis", rng.pick(&[-1, 3]))])
    };
    let (x, turned) = match widen {
        true => {
            let to = || vec![attr_int("to", i64::from(FLOAT))];
            (b.node("Cast", &[&x], to()), b.node("Cast", &[&turned], to()))
        }
        false => (x, turned),
    };
    rotary_sum(rng, c, b, [&x, &cos, &turned, &sin], before, opset, tables)
}

/// rotary with the halves turned and written apart (GPT-OSS's
/// `_apply_rotary_emb`): `Concat(x₁·c − x₂·s, x₂·c + x₁·s)`, the tables
/// `[b or 1, s, d/2]` unsqueezed at x's heads axis; every product and the
/// sum either order.
pub fn rotary_apart(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let (opset, elem, RotaryX { x, dims, d, heads_third, batch }) = rotary_x(rng, &mut c, &mut b);
    let freqs = b.input("freqs", elem, Some(&[batch, sym("s"), D::N(d / 2)]));
    let cos = b.node("Cos", &[&freqs], vec![]);
    let one_table = rng.chance(0.05);
    let sin = if one_table {
        c.note("the sin table is the cos table");
        cos.clone()
    } else {
        b.node("Sin", &[&freqs], vec![])
    };
    let (cos, sin) = at_heads_axis(rng, &mut c, &mut b, if heads_third { 2 } else { 1 }, [&cos, &sin]);
    let before = b.graph.node.len();
    let half = if rng.chance(0.06) {
        c.breaks("the halves cut one early");
        d / 2 - 1
    } else {
        d / 2
    };
    let (x1, x2) = if rng.chance(0.25) {
        c.note("the halves a Split by sizes");
        let parts = ["x_first_half".to_string(), "x_second_half".to_string()];
        let sizes = b.ints(&[half, d - half]);
        b.node_to("Split", &[&x, &sizes], &[&parts[0], &parts[1]], vec![attr_int("axis", rng.pick(&[-1, 3]))]);
        let [x1, x2] = parts;
        (x1, x2)
    } else {
        let second_of = if rng.chance(0.06) {
            c.breaks("x₂ a half of another value");
            b.input("other", elem, Some(&dims))
        } else {
            x.clone()
        };
        let (zero, cut, end, last) = (b.ints(&[0]), b.ints(&[half]), b.ints(&[i64::MAX]), b.ints(&[-1]));
        (b.node("Slice", &[&x, &zero, &cut, &last], vec![]), b.node("Slice", &[&second_of, &cut, &end, &last], vec![]))
    };
    // The halves swapped and the first half turned the other way is the
    // rotary of the tables swapped (sin for cos); either alone, or with
    // the second half's tables crossed, is none.
    let (swapped, turned, crossed) = (rng.chance(0.06), rng.chance(0.06), rng.chance(0.06) && !one_table);
    match (swapped, turned, crossed) {
        (true, true, false) => c.note("the halves swapped and the first half turned: sin and cos swapped"),
        (false, false, false) => {}
        _ => c.breaks(format!("halves swapped {swapped}, first half turned {turned}, second half crossed {crossed}")),
    }
    let (x1, x2) = if swapped { (x2, x1) } else { (x1, x2) };
    let x1c = commuted(rng, &mut b, "Mul", &x1, &cos);
    let x2s = commuted(rng, &mut b, "Mul", &x2, &sin);
    let first = match turned {
        true => b.node("Sub", &[&x2s, &x1c], vec![]),
        false => b.node("Sub", &[&x1c, &x2s], vec![]),
    };
    let (c2, s1) = if crossed { (sin.clone(), cos.clone()) } else { (cos.clone(), sin.clone()) };
    let x2c = commuted(rng, &mut b, "Mul", &x2, &c2);
    let x1s = commuted(rng, &mut b, "Mul", &x1, &s1);
    let second = commuted(rng, &mut b, "Add", &x2c, &x1s);
    let inner = computed_since(&b, before);
    let out = b.node("Concat", &[&first, &second], vec![attr_int("axis", rng.pick(&[-1, 3]))]);
    b.output(&out, elem, None);
    leak(rng, &mut c, &mut b, &inner, elem);
    finish(rng, c, b, opset, elem)
}

/// pack-matmul: MatMuls of one x by constant weights of its last axis's
/// rows, each read as it was. Members that are no constant weight (an
/// input, a weight of other rows or rank, x as the right operand) stay
/// outside the group; a group of one is no candidate.
pub fn pack_matmul(rng: &mut Rng) -> Case {
    let mut c = Ctx::new();
    let mut b = Builder::default();
    let opset = rng.pick(&[13i64, 17, 18, 23]);
    let elem = rng.pick(&[FLOAT, FLOAT, FLOAT16]);
    let rank = 1 + rng.below(3);
    let lead: Vec<D> = [sym("b"), D::N(3)].into_iter().take(rank - 1).collect();
    let dims: Vec<D> = lead.iter().cloned().chain([D::N(HIDDEN)]).collect();
    let x = b.input("x", elem, Some(&dims));
    let mut members = 0;
    let mut inner = vec![];
    for i in 0..2 + rng.below(3) {
        let cols = 1 + rng.below(5) as i64;
        let values: Vec<f64> = (0..HIDDEN * cols).map(|j| ((i as i64 * 7 + j) % 11) as f64 / 4.0 - 1.0).collect();
        let w = match rng.below(10) {
            0 => {
                c.note(format!("weight {i} is a graph input"));
                b.input(&format!("w{i}"), elem, Some(&[D::N(HIDDEN), D::N(cols)]))
            }
            1 => {
                c.note(format!("weight {i} is an initializer a graph input overrides"));
                let w = b.init(&format!("w{i}"), tensor(elem, &[HIDDEN, cols], &values));
                b.input(&w, elem, Some(&[D::N(HIDDEN), D::N(cols)]))
            }
            2 => {
                c.note(format!("weight {i} is batched, [1, K, N]"));
                b.init(&format!("w{i}"), tensor(elem, &[1, HIDDEN, cols], &values))
            }
            3 => {
                c.note(format!("weight {i} is a Constant node"));
                members += 1;
                b.constant(tensor(elem, &[HIDDEN, cols], &values))
            }
            _ => {
                members += 1;
                b.init(&format!("w{i}"), tensor(elem, &[HIDDEN, cols], &values))
            }
        };
        // A weight defined again in a body leaves the group, which may
        // still have two.
        c.may_stay.push(w.clone());
        let y = b.node("MatMul", &[&x, &w], vec![]);
        inner.push(y.clone());
        let out = if rng.chance(0.3) { b.node("Relu", &[&y], vec![]) } else { y };
        b.output(&out, elem, None);
    }
    if rank == 1 && rng.chance(0.2) {
        c.note("x is also the right operand of a MatMul");
        let square = b.init("square", tensor(elem, &[HIDDEN, HIDDEN], &[0.5; (HIDDEN * HIDDEN) as usize]));
        c.aside.push(square.clone());
        let y = b.node("MatMul", &[&square, &x], vec![]);
        b.output(&y, elem, None);
    }
    if members < 2 {
        c.breaks(format!("{members} MatMul of x by a constant 2-D weight"));
    }
    // A product read elsewhere too is taken over, not left out.
    if rng.chance(0.1) {
        let v = rng.pick(&inner);
        c.note(format!("{v} is also read by another node"));
        let other = b.node("Neg", &[&v], vec![]);
        b.output(&other, elem, None);
    }
    finish(rng, c, b, opset, elem)
}
