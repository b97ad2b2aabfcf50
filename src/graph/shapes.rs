//! Symbolic shapes: enough to prove, without running the model, that two
//! shapes are equal when an export computes them at run time
//! (`Shape → Gather → Mul → Unsqueeze → Concat → Reshape`), and to know a
//! value's rank.
//!
//! A dimension is a polynomial in atoms (`dim.rs`). An atom is a size
//! nothing more is known of: a declared symbol (`batch`), or axis i of a
//! graph value (`x#1`). Rules below derive shapes through the ops exports
//! use around attention; where a rule cannot tell a dimension, it becomes
//! an atom of the value itself, which is always true and never equal to
//! anything else. Equal polynomials are equal numbers at run time, so
//! equality of two derived shapes is a proof.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

pub use super::dim::{product, Dim};
use super::{Graph, IntsArgument, Scope};
use crate::onnx::proto::tensor_shape_proto::dimension::Value as DimValue;
use crate::onnx::NodeProto;
use crate::ops;

/// Recursion is cut off here: a proof that needs more is given up (never
/// wrongly made). Shapes are derived in dependency order (producers
/// first, whatever the list's order), so recursion only goes as deep as
/// one node's inputs.
const MAX_DEPTH: usize = 64;

/// The longest expression an atom's name may hold (`floor_of`).
const MAX_NAME: usize = 512;

/// The most elements a shape vector followed element by element may have
/// (a shape's rank, the axes of a Slice): a proved length above it is
/// opaque, never allocated (`Range(0, 2^40, 1)`).
const MAX_ELEMENTS: i64 = 1024;

/// A proved length of at most `MAX_ELEMENTS`, as a count.
fn tracked(n: i64) -> Option<usize> {
    (0..=MAX_ELEMENTS).contains(&n).then_some(n as usize)
}

/// How many times the shapes are derived again with the equalities the
/// last derivation found (each round can only find more).
const MAX_ROUNDS: usize = 4;

/// The shapes of one graph, derived once (in dependency order) and memoized.
#[derive(Default)]
pub struct Memo {
    shapes: RefCell<HashMap<String, Option<Vec<Dim>>>>,
    filled: std::cell::Cell<bool>,
    /// Atoms the run proves equal to another dimension: the model runs only
    /// where they are (`Shapes::required_equalities`).
    facts: RefCell<HashMap<String, Dim>>,
    /// Atoms that stand for `min(e, n)` (`Shapes::min_atom`).
    mins: RefCell<HashMap<String, (Dim, i64)>>,
    /// Atoms that stand for a broadcast no derivation could tell, with the
    /// dimensions that met there (`Shapes::broadcast_axis`).
    broadcasts: RefCell<HashMap<String, Vec<Dim>>>,
    /// Atoms the run proves at least some number (more than 0): an element
    /// of a live `ConstantOfShape` is at least 0, and a live Gather's
    /// constant index is within its axis (`Shapes::required_bounds`).
    lower: RefCell<HashMap<String, i64>>,
    /// Sums and products the run proves equal to a number (`unify`), by
    /// key: ViT's `1 + floor(h/8)·floor(w/8)` patches and class token,
    /// added to 17 position embeddings.
    numbers: RefCell<HashMap<String, i64>>,
    /// The floors `floor_of` named: what each is the floor of, and by what.
    floors: RefCell<HashMap<String, (Dim, i64)>>,
    /// Remainders by a positive number (`Mod`): at least 0, though their
    /// polynomials subtract (`3·floor((seq + 2)/3) − seq`), by key.
    remainders: RefCell<HashSet<String>>,
    /// The merged output shapes of each If (by node), derived together.
    ifs: RefCell<HashMap<usize, Vec<Option<Vec<Dim>>>>>,
    /// Two equalities the run needs contradict: no run succeeds
    /// (`Shapes::vacuous`).
    vacuous: std::cell::Cell<bool>,
}

impl Memo {
    /// Drops every derived shape, to derive them again.
    fn forget_shapes(&self) {
        self.shapes.borrow_mut().clear();
        self.ifs.borrow_mut().clear();
    }
}

/// How deep the views of If branches that shapes derive may nest: 3, the
/// attention kernel's guard over a long call (`If` → `If` → the kernel's
/// pieces with a NaN guard, or the lifted kernel's `If`). A hostile model
/// of nested Ifs costs more the deeper: each view derives its nested Ifs'
/// branches again.
const MAX_BODY_DEPTH: usize = 3;

pub struct Shapes<'g, 'a> {
    g: &'g Graph<'a>,
    memo: &'g Memo,
    depth: RefCell<usize>,
}

impl super::fold::ShapeFacts for Shapes<'_, '_> {
    fn shape(&self, value: &str) -> Option<Vec<Dim>> {
        Shapes::shape(self, value)
    }

    fn shape_tensor(&self, value: &str) -> Option<Vec<Option<Dim>>> {
        Shapes::shape_tensor(self, value)
    }
}

impl<'g, 'a> Shapes<'g, 'a> {
    pub fn new(g: &'g Graph<'a>) -> Self {
        let shapes = Shapes { g, memo: g.shape_memo(), depth: RefCell::new(0) };
        if !shapes.memo.filled.replace(true) {
            let fill = || {
                for node in g.order().iter().map(|&i| g.node(i)) {
                    for out in node.output.iter().filter(|o| !o.is_empty()) {
                        shapes.shape(out);
                    }
                }
            };
            for _ in 0..MAX_ROUNDS {
                fill();
                match shapes.required_equalities() {
                    Some(false) => break,
                    // Derived again: a broadcast of two axes now known equal
                    // is that axis, where it was an atom of its own.
                    Some(true) => shapes.memo.forget_shapes(),
                    // A model no run of which succeeds: whatever it computes
                    // is vacuous, and the shapes are derived as without
                    // the equalities, as the ops alone give them.
                    None => {
                        shapes.memo.vacuous.set(true);
                        shapes.memo.facts.borrow_mut().clear();
                        shapes.memo.numbers.borrow_mut().clear();
                        shapes.memo.lower.borrow_mut().clear();
                        shapes.memo.forget_shapes();
                        fill();
                        break;
                    }
                }
            }
        }
        shapes
    }

    /// Equalities the model needs to run, learned from the nodes every run
    /// executes (those a graph output depends on): a MatMul's or Gemm's
    /// contracted axes, a Concat's other axes, the element counts on both
    /// sides of a Reshape. Each makes an atom another dimension (`unify`);
    /// a fused op then computes the same function wherever the original
    /// runs. Whether a new one was found; none where two of them are
    /// different numbers (no run succeeds).
    fn required_equalities(&self) -> Option<bool> {
        let g = self.g;
        let mut found = false;
        for &i in g.order().iter().rev() {
            let node = g.node(i);
            if !g.is_live(i) || !crate::onnx::is_default_domain(node.domain()) || g.malformed(i).is_some() {
                continue;
            }
            let input = |i: usize| node.input.get(i).filter(|v| !v.is_empty()).and_then(|v| self.shape(v));
            let mut pairs: Vec<(Dim, Dim)> = vec![];
            match node.op_type() {
                "MatMul" => {
                    if let (Some(a), Some(b)) = (input(0), input(1)) {
                        let rows = if b.len() == 1 { b.first() } else { b.len().checked_sub(2).map(|r| &b[r]) };
                        pairs.extend(a.last().cloned().zip(rows.cloned()));
                    }
                }
                // Its input's channels are the weight's, times the groups.
                "Conv" => {
                    let group = node.attr_int("group").unwrap_or(1);
                    if let (Some(x), Some(w)) = (input(0), input(1)) {
                        if let (Some(c), Some(k)) = (x.get(1), w.get(1)) {
                            pairs.extend(k.mul(&Dim::known(group)).map(|k| (c.clone(), k)));
                        }
                    }
                }
                "Gemm" => {
                    if let (Some(a), Some(b)) = (input(0), input(1)) {
                        let trans = |name: &str| node.attr_int(name).unwrap_or(0) == 1;
                        if a.len() == 2 && b.len() == 2 {
                            let k = if trans("transA") { &a[0] } else { &a[1] };
                            let k2 = if trans("transB") { &b[1] } else { &b[0] };
                            pairs.push((k.clone(), k2.clone()));
                        }
                    }
                }
                "Concat" => {
                    let parts: Option<Vec<Vec<Dim>>> = (0..node.input.len()).map(input).collect();
                    let axis = parts.as_ref().and_then(|p| normalize(node.attr_int("axis")?, p.first()?.len()));
                    if let (Some(parts), Some(axis)) = (parts, axis) {
                        if parts.iter().all(|p| p.len() == parts[0].len()) {
                            for p in &parts[1..] {
                                let others = (0..p.len()).filter(|&i| i != axis);
                                pairs.extend(others.map(|i| (parts[0][i].clone(), p[i].clone())));
                            }
                        }
                    }
                }
                "Reshape" => {
                    let out = node.output.first().and_then(|o| self.shape(o));
                    if let (Some(x), Some(out)) = (input(0), out) {
                        pairs.extend(product(&x).zip(product(&out)));
                    }
                }
                op if ops::BROADCASTING.contains(&op) => {
                    if let Some(shapes) = (0..node.input.len()).map(input).collect::<Option<Vec<_>>>() {
                        if !broadcastable(&shapes) {
                            return None;
                        }
                        pairs.extend(self.min_beside_its_e(&shapes));
                        let out = node.output.first().and_then(|o| self.shape(o));
                        pairs.extend(out.as_ref().map(|out| self.broadcasts_met_again(&shapes, out)).unwrap_or_default());
                        pairs.extend(out.map(|out| self.never_one_is_the_result(&shapes, &out)).unwrap_or_default());
                    }
                }
                _ => {}
            }
            for (a, b) in pairs {
                let (a, b) = (self.resolve(a), self.resolve(b));
                if a.value().zip(b.value()).is_some_and(|(a, b)| a != b) {
                    return None;
                }
                found |= self.unify(a, b);
            }
            for (d, least) in self.required_bounds(node) {
                found |= self.raise_bound(&self.resolve(d), least);
            }
        }
        Some(found)
    }

    /// `(d, n)` where node, run, proves `d ≥ n`: each element of a
    /// `ConstantOfShape`'s shape is at least 0 (Funnel's cls mask
    /// `torch.ones(seq − 1, seq − 1)`: seq ≥ 1), and the axis a Gather
    /// takes constant indices from holds each (`pos[-1]`: at least 1).
    fn required_bounds(&self, node: &NodeProto) -> Vec<(Dim, i64)> {
        match node.op_type() {
            "ConstantOfShape" => match self.elements(&node.input[0], 0) {
                Some(e) => e.into_iter().flatten().map(|d| (d, 0)).collect(),
                None => vec![],
            },
            // A Conv fails where its window is longer than its padded
            // input: each spatial axis it gives is at least 1.
            "Conv" => match node.output.first().and_then(|o| self.shape(o)) {
                Some(out) => out.into_iter().skip(2).map(|d| (d, 1)).collect(),
                None => vec![],
            },
            "Gather" => {
                let data = node.input.first().and_then(|v| self.shape(v));
                let indices = node.input.get(1).and_then(|v| self.g.constant(v)).and_then(|t| t.ints());
                let (Some(data), Some(indices)) = (data, indices) else { return vec![] };
                let axis = normalize(node.attr_int("axis").unwrap_or(0), data.len());
                let Some(len) = axis.map(|a| data[a].clone()) else { return vec![] };
                indices.iter().map(|&i| (len.clone(), if i >= 0 { i.saturating_add(1) } else { i.saturating_neg() })).collect()
            }
            _ => vec![],
        }
    }

    /// Records `d ≥ n` where d is `a · atom + c` (a > 0) as a bound on the
    /// atom; whether it raised one.
    fn raise_bound(&self, d: &Dim, n: i64) -> bool {
        let Some((atom, a, c)) = d.linear().filter(|(_, a, _)| *a > 0) else { return false };
        // a · atom ≥ n − c, so atom ≥ ceil((n − c) / a).
        let Some(need) = n.checked_sub(c).map(|m| m.div_euclid(a) + i64::from(m.rem_euclid(a) != 0)) else {
            return false;
        };
        let mut lower = self.memo.lower.borrow_mut();
        match lower.get(atom) {
            Some(&have) if have >= need => false,
            _ if need <= 0 => false,
            _ => {
                lower.insert(atom.to_string(), need);
                true
            }
        }
    }

    /// `(d, r)` for each operand's axis d of a broadcast that is never 1
    /// (at least 2 by the bounds), r the result's: a broadcast keeps an
    /// axis other than 1 only where it is the result's.
    fn never_one_is_the_result(&self, shapes: &[Vec<Dim>], out: &[Dim]) -> Vec<(Dim, Dim)> {
        let rank = out.len();
        let mut pairs = vec![];
        for (i, r) in out.iter().enumerate() {
            for d in aligned(shapes, rank, i) {
                if d != r && d.value().is_none() && self.least_of(d) >= 2 {
                    pairs.push((d.clone(), r.clone()));
                }
            }
        }
        pairs
    }

    /// `(min(e, n), e)` for each axis of a broadcast where both meet and
    /// n ≥ 2: where e > n the two differ and neither is 1, so the run
    /// fails; every run has min(e, n) = e.
    fn min_beside_its_e(&self, shapes: &[Vec<Dim>]) -> Vec<(Dim, Dim)> {
        let mins = self.memo.mins.borrow();
        let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
        let mut pairs = vec![];
        for i in 0..rank {
            let dims = aligned(shapes, rank, i);
            for d in &dims {
                if let Some((atom, 1)) = d.single_atom() {
                    if let Some((e, _)) = mins.get(atom).filter(|(e, n)| *n >= 2 && dims.contains(&e)) {
                        pairs.push(((*d).clone(), e.clone()));
                    }
                }
            }
        }
        pairs
    }

    /// `(x, w)` for each axis of a broadcast whose result there is w, where
    /// an operand x is itself a broadcast of dimensions (`broadcast_axis`)
    /// one of which is w. An operand is the result or 1, so x is w or 1;
    /// and a broadcast is 1 only where every dimension that met there is
    /// 1, w among them: every run has x = w. (BLOOM: ALiBi, sized from the
    /// mask's declared length, broadcast with the scores' keys, then with
    /// the causal mask's.)
    fn broadcasts_met_again(&self, shapes: &[Vec<Dim>], out: &[Dim]) -> Vec<(Dim, Dim)> {
        let broadcasts = self.memo.broadcasts.borrow();
        let rank = out.len();
        let mut pairs = vec![];
        for (i, w) in out.iter().enumerate() {
            let w = self.resolve(w.clone());
            for x in aligned(shapes, rank, i) {
                let Some((atom, 1)) = x.single_atom() else { continue };
                let met = broadcasts.get(atom).is_some_and(|met| met.iter().any(|d| self.resolve(d.clone()) == w));
                if met {
                    pairs.push((x.clone(), w.clone()));
                }
            }
        }
        pairs
    }

    /// Records `a = b` where one side is `c · atom` and the other a
    /// multiple of c without that atom: the atom then stands for the
    /// quotient. A declared symbol yields to a derived atom's value only
    /// where that is a number or a polynomial of other atoms; two numbers, or
    /// forms no atom can be solved from, teach nothing. True where new.
    fn unify(&self, a: Dim, b: Dim) -> bool {
        let (a, b) = (self.resolve(a), self.resolve(b));
        if a == b {
            return false;
        }
        let solve = |x: &Dim, y: &Dim| -> Option<(String, Dim)> {
            let (atom, coef) = x.single_atom()?;
            if y.atoms().any(|a| a == atom) {
                return None;
            }
            Some((atom.to_string(), y.div(&Dim::known(coef))?))
        };
        // Prefer solving for an atom of the derivation (`value#i`) over a
        // declared symbol (`$seq`), so that declared names stay; then the
        // later name, for determinism.
        let rank = |x: &Dim| x.single_atom().map(|(a, _)| (!a.starts_with('$'), a.to_string()));
        let (first, second) = if rank(&a) >= rank(&b) { (&a, &b) } else { (&b, &a) };
        let Some((atom, value)) = solve(first, second).or_else(|| solve(second, first)) else {
            // A sum or product no atom of which can be solved for, equal
            // to a number: that number wherever it is derived again.
            let (poly, n) = match (a.value(), b.value()) {
                (None, Some(n)) => (a, n),
                (Some(n), None) => (b, n),
                _ => return false,
            };
            return self.memo.numbers.borrow_mut().insert(poly.key(), n).is_none();
        };
        self.memo.facts.borrow_mut().insert(atom, value);
        true
    }

    /// `d` with every atom a fact has solved replaced by its value. A fact
    /// is made only about an atom no fact has solved, equal to a value in
    /// which every atom is unsolved: no atom comes back through its own
    /// value, and substitution ends. An atom whose value would overflow the
    /// coefficient stays as it is.
    fn resolve(&self, d: Dim) -> Dim {
        let facts = self.memo.facts.borrow();
        let mut d = d;
        for _ in 0..=facts.len() {
            if !d.atoms().any(|a| facts.contains_key(a)) {
                break;
            }
            d = d.substitute(|a| facts.get(a).cloned());
        }
        match self.memo.numbers.borrow().get(&d.key()) {
            Some(&n) => Dim::known(n),
            None => d,
        }
    }

    /// An output of an If: what both branches give it, axis by axis, as
    /// ONNX Runtime's symbolic inference merges them. Each branch is derived
    /// in a view of its own, with what it can read from outside; an axis the
    /// branches give different dimensions, or a dimension of atoms of a
    /// branch's own (meaningless outside it), is an atom of the output.
    /// Whichever branch runs, the output has its shape, so what each branch
    /// proves on the way (the equalities its own run needs) holds too. The
    /// outputs of one If are derived together.
    fn if_output(&self, node: &NodeProto, value: &str) -> Option<Vec<Dim>> {
        let holder = self.g.producer(value)?;
        let slot = node.output.iter().position(|o| o == value)?;
        if let Some(merged) = self.memo.ifs.borrow().get(&holder) {
            return merged.get(slot).cloned().flatten();
        }
        // A condition the shapes decide (torch traces `if x.dim() == 2`
        // as an If on `Equal(Shape(Shape(x)), 2)`) runs one branch only.
        let condition = self.scalar(&node.input[0]).and_then(|c| c.value());
        if self.g.outer.shape_depth >= MAX_BODY_DEPTH {
            return None;
        }
        let scope = self.scope_of(holder, node);
        let branch = |taken: bool| match condition {
            Some(c) if (c != 0) != taken => None,
            _ => Some(self.branch_outputs(&scope, node, if taken { "then_branch" } else { "else_branch" })),
        };
        let (then, other) = match (branch(true), branch(false)) {
            (Some(then), Some(other)) => (then, other),
            (Some(one), None) | (None, Some(one)) => (one.clone(), one),
            (None, None) => return None,
        };
        let merged: Vec<Option<Vec<Dim>>> = node
            .output
            .iter()
            .enumerate()
            .map(|(slot, out)| {
                let (Some(Some(a)), Some(Some(b))) = (then.get(slot), other.get(slot)) else { return None };
                let axes = a.iter().zip(b).enumerate().map(|(i, pair)| match pair {
                    (Some(a), Some(b)) if a == b => a.clone(),
                    _ => Dim::atom(format!("{out}#{i}")),
                });
                (a.len() == b.len()).then(|| axes.collect())
            })
            .collect();
        let shape = merged.get(slot).cloned().flatten();
        self.memo.ifs.borrow_mut().insert(holder, merged);
        shape
    }

    /// The output shapes of an If's branch, derived in a view of the body
    /// with what the If's bodies see (`scope`), each dimension made of atoms
    /// known outside the bodies (none for one of the body's own).
    fn branch_outputs(&self, scope: &Scope, node: &NodeProto, branch: &str) -> Vec<Option<Vec<Option<Dim>>>> {
        let Some(body) = node.attribute.iter().find(|a| a.name() == branch).and_then(|a| a.g.as_ref()) else {
            return vec![];
        };
        let outside: HashSet<&str> =
            scope.shapes.values().flatten().flat_map(|d| d.atoms().map(String::as_str)).collect();
        let view = Graph::new(body, self.g.opset, scope);
        let shapes = view.shapes();
        let known_outside = |d: Dim| {
            let known = d.atoms().all(|a| outside.contains(a.as_str()));
            known.then_some(d)
        };
        body.output.iter().map(|o| Some(shapes.shape(o.name())?.into_iter().map(known_outside).collect())).collect()
    }

    /// What the bodies of node `holder` see of this graph: the names they
    /// can read, and the constants, shapes and element types of those they do.
    /// (`Graph::scope_for_subgraphs` gives every value's shape, which are
    /// still being derived here.)
    fn scope_of(&self, holder: usize, node: &NodeProto) -> Scope {
        let g = self.g;
        let hidden = g.hidden_from_bodies_of(holder);
        let own = g.defined.iter().copied().chain(g.consts.keys().copied());
        let visible = own.chain(g.outer.names.iter().map(String::as_str)).filter(|n| !hidden.contains(*n));
        let mut scope = Scope {
            names: visible.map(str::to_string).collect(),
            shape_depth: g.outer.shape_depth + 1,
            ..Scope::default()
        };
        for v in node.subgraphs().flat_map(super::free_values) {
            if let Some(t) = g.constant(&v) {
                scope.constants.insert(v.clone(), t.clone());
            }
            if let Some(shape) = self.shape(&v) {
                scope.shapes.insert(v.clone(), shape);
            }
            if let Some(t) = g.elem_type(&v) {
                scope.types.insert(v, t);
            }
        }
        scope
    }

    pub fn rank(&self, value: &str) -> Option<usize> {
        self.shape(value).map(|s| s.len())
    }

    /// The axes a Slice (opset 10 on) slices, where its bounds are computed
    /// at run time: the constant `axes`, or without them the first as many
    /// axes as `starts` has elements.
    fn sliced_axes(&self, node: &NodeProto) -> Option<Vec<i64>> {
        if self.g.opset < 10 {
            return None;
        }
        match node.input.get(3).filter(|a| !a.is_empty()) {
            Some(axes) => self.g.constant(axes)?.ints(),
            None => {
                let starts = self.shape(node.input.get(1)?)?;
                let n = starts.first().and_then(Dim::value).filter(|_| starts.len() == 1)?;
                Some((0..tracked(n)? as i64).collect())
            }
        }
    }

    /// The last axis of `value`, also where its rank cannot be told: numpy
    /// broadcasting aligns trailing axes, so an operand whose last axis is a
    /// number other than 1 gives the result that axis whatever the other
    /// operands' ranks; an embedding `Gather` keeps the table's last axis
    /// whatever its indices' rank.
    pub fn last_axis(&self, value: &str) -> Option<Dim> {
        self.last_axis_at(value, 0)
    }

    fn last_axis_at(&self, value: &str, depth: usize) -> Option<Dim> {
        if let Some(shape) = self.shape(value) {
            return shape.last().cloned();
        }
        if depth >= MAX_DEPTH {
            return None;
        }
        let g = self.g;
        let node = g.node(g.producer(value)?);
        let last = |i: usize| node.input.get(i).filter(|v| !v.is_empty()).and_then(|v| self.last_axis_at(v, depth + 1));
        if node.output.iter().position(|o| o == value).is_some_and(|i| ops::ms_output_like_first_input(node, i)) {
            return last(0);
        }
        if !crate::onnx::is_default_domain(node.domain()) || node.output.first().map(String::as_str) != Some(value) {
            return None;
        }
        match node.op_type() {
            op if ops::SAME_SHAPE_AS_FIRST_INPUT.contains(&op) => last(0),
            op if ops::BROADCASTING.contains(&op) => {
                (0..node.input.len()).filter_map(last).find(|d| d.value().is_some_and(|n| n != 1))
            }
            "MatMul" => self.rank(&node.input[1]).filter(|&r| r >= 2).and_then(|_| last(1)),
            // The output's last letter is the last axis of each operand whose
            // term ends with it (an ellipsis covers leading axes only); a
            // letter's sizes broadcast, 1 against n.
            "Einsum" => {
                let (terms, output) = node.einsum_terms()?;
                let letter = output.chars().last().filter(char::is_ascii_alphabetic)?;
                let ending = terms.iter().enumerate().filter(|(_, t)| t.ends_with(letter));
                let sizes: Vec<Dim> = ending.map(|(i, _)| last(i)).collect::<Option<_>>()?;
                match sizes.iter().find(|d| d.value() != Some(1)) {
                    Some(d) if sizes.iter().all(|e| e == d || e.value() == Some(1)) => Some(d.clone()),
                    Some(_) => None,
                    None => sizes.first().cloned(),
                }
            }
            "Gather" => {
                let data = self.shape(&node.input[0])?;
                let axis = normalize(node.attr_int("axis").unwrap_or(0), data.len())?;
                (axis + 1 < data.len()).then(|| data[data.len() - 1].clone())
            }
            _ => None,
        }
    }

    /// The symbolic shape of `value`, when its rank can be told.
    pub fn shape(&self, value: &str) -> Option<Vec<Dim>> {
        // Defined twice (`Graph::is_ambiguous`): which definition counts is
        // not proved, but an initializer's shape may be the same in both.
        if self.g.is_ambiguous(value) {
            return self.g.shadowed_shape(value);
        }
        if let Some(known) = self.memo.shapes.borrow().get(value) {
            return known.clone();
        }
        if *self.depth.borrow() >= MAX_DEPTH {
            return None;
        }
        *self.depth.borrow_mut() += 1;
        let shape = self.derive(value).map(|s| s.into_iter().map(|d| self.resolve(d)).collect());
        *self.depth.borrow_mut() -= 1;
        // A result cut short by the depth limit is not the value's shape.
        if shape.is_some() || *self.depth.borrow() == 0 {
            self.memo.shapes.borrow_mut().insert(value.to_string(), shape.clone());
        }
        shape
    }

    fn derive(&self, value: &str) -> Option<Vec<Dim>> {
        let g = self.g;
        if let Some(declared) = g.declared_shape(value) {
            // A declared number stands; a symbol or an unknown axis yields to
            // what the ops prove (spec, ground rule 11: torch names an
            // output's axes `MatMulout_dim_0`, Optimum its caches' sums) but
            // an atom of the value itself, which says nothing.
            let own = |d: &Dim| d.atoms().any(|a| a.starts_with(value) && a[value.len()..].starts_with('#'));
            let from_ops = || self.derive_from_ops(value).filter(|d| d.len() == declared.dim.len());
            let mut once: Option<Option<Vec<Dim>>> = None;
            let mut derived = |i: usize| once.get_or_insert_with(from_ops).as_ref().map(|d| d[i].clone());
            return Some(
                declared
                    .dim
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match &d.value {
                        // A negative number is no size: ONNX Runtime reads it as an
                        // unknown axis (exporters write -1 for one).
                        Some(DimValue::DimValue(n)) if *n >= 0 => Dim::known(*n),
                        Some(DimValue::DimParam(p)) if !p.is_empty() => {
                            derived(i).filter(|d| !own(d)).unwrap_or_else(|| Dim::atom(format!("${p}")))
                        }
                        _ => derived(i).unwrap_or_else(|| Dim::atom(format!("{value}#{i}"))),
                    })
                    .collect(),
            );
        }
        self.derive_from_ops(value)
    }

    /// ONNX `Attention` (opset 23) with 4-D q, k, v: `[b, h, s, dv]`, and
    /// the present key and value, the past and the new rows concatenated.
    fn attention_output(&self, node: &NodeProto, value: &str) -> Option<Vec<Dim>> {
        let input = |i: usize| node.input.get(i).filter(|s| !s.is_empty()).and_then(|v| self.shape(v));
        let (q, k, v) = (input(0)?, input(1)?, input(2)?);
        // The 3-D form, [b, s, h·d] with the heads counted by attributes:
        // its output is [b, s, h·dv], v's last axis where the counts of
        // query and key/value heads are equal.
        if q.len() == 3 && k.len() == 3 && v.len() == 3 {
            let heads = |name: &str| node.attr_int(name);
            let same = heads("q_num_heads").is_some() && heads("q_num_heads") == heads("kv_num_heads");
            let first = node.output.first().map(String::as_str) == Some(value);
            return (same && first).then(|| vec![q[0].clone(), q[1].clone(), v[2].clone()]);
        }
        if q.len() != 4 || k.len() != 4 || v.len() != 4 {
            return None;
        }
        match node.output.iter().position(|o| o == value)? {
            0 => Some(vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()]),
            slot @ (1 | 2) => {
                let new = if slot == 1 { k } else { v };
                let rows = match input(slot + 3) {
                    Some(past) if past.len() == 4 => past[2].add(&new[2])?,
                    Some(_) => return None,
                    None => new[2].clone(),
                };
                Some(vec![new[0].clone(), new[1].clone(), rows, new[3].clone()])
            }
            _ => None,
        }
    }

    /// The shape of `value` from constants and the ops that compute it.
    fn derive_from_ops(&self, value: &str) -> Option<Vec<Dim>> {
        let g = self.g;
        if let Some(t) = g.constant(value) {
            return Some(t.dims.iter().map(|&d| Dim::known(d)).collect());
        }
        if let Some(outer) = g.outer_shape(value) {
            return Some(outer.to_vec());
        }
        let node = g.node(g.producer(value)?);
        let input = |i: usize| node.input.get(i).filter(|s| !s.is_empty()).and_then(|v| self.shape(v));
        if node.output.iter().position(|o| o == value).is_some_and(|i| ops::ms_output_like_first_input(node, i)) {
            return input(0);
        }
        if node.domain() == crate::onnx::TRANSMUTER_DOMAIN && node.op_type() == "AttentionCore" {
            // softmax(q·k with its side values broadcast in) · v; a form with
            // Reshapes regroups axes its inputs do not show.
            // FusedMatMul scores may read k untransposed, Einsums any layout.
            let regrouped = ["reshape", "fused_matmul", "einsum"].iter().any(|t| node.overload().contains(t));
            if regrouped || node.output.first().map(String::as_str) != Some(value) {
                return None;
            }
            let mut scores = self.matmul(value, &input(0)?, &input(1)?)?;
            for i in 3..node.input.len() {
                scores = self.broadcast(value, &[scores, input(i)?]);
            }
            return self.matmul(value, &scores, &input(2)?);
        }
        if node.domain() == crate::onnx::MICROSOFT && node.op_type() == "FusedMatMul" {
            return self.fused_matmul(node, value, input(0)?, input(1)?);
        }
        if !crate::onnx::is_default_domain(node.domain()) {
            return None;
        }
        if node.is("Split") {
            return self.split_part(node, value, input(0)?);
        }
        if node.is("TopK") {
            return self.top_k(node, input(0)?);
        }
        if node.is("If") {
            return self.if_output(node, value);
        }
        if node.is("Attention") {
            return self.attention_output(node, value);
        }
        if node.output.first().map(String::as_str) != Some(value) {
            return None;
        }
        let opaque = |rank: usize| (0..rank).map(|i| Dim::atom(format!("{value}#{i}"))).collect::<Vec<_>>();
        Some(match node.op_type() {
            op if ops::SAME_SHAPE_AS_FIRST_INPUT.contains(&op) => input(0)?,
            op if ops::BROADCASTING.contains(&op) => {
                let shapes: Vec<Vec<Dim>> = (0..node.input.len()).map(input).collect::<Option<_>>()?;
                self.broadcast(value, &shapes)
            }
            "MatMul" => self.matmul(value, &input(0)?, &input(1)?)?,
            "Transpose" => {
                let x = input(0)?;
                let perm: Vec<usize> = match node.attr_ints("perm") {
                    Some(p) => p.iter().map(|&i| usize::try_from(i).ok()).collect::<Option<_>>()?,
                    None => (0..x.len()).rev().collect(),
                };
                if perm.len() != x.len() {
                    return None;
                }
                perm.iter().map(|&i| x.get(i).cloned()).collect::<Option<_>>()?
            }
            "Reshape" => {
                // The rank is the shape's length, even where no element is known.
                let length = || match self.shape(node.input.get(1)?)?.as_slice() {
                    [n] => n.value().and_then(|n| usize::try_from(n).ok()),
                    _ => None,
                };
                let Some(target) = self.shape_tensor(node.input.get(1)?) else {
                    return length().map(opaque);
                };
                // A size below -1, or two -1s, is a Reshape that fails at run
                // time: there is no output shape to tell.
                let known = || target.iter().filter_map(|d| d.as_ref().and_then(Dim::value));
                if known().any(|n| n < -1) || known().filter(|&n| n == -1).count() > 1 {
                    return None;
                }
                let x = input(0);
                let allowzero = node.attr_int("allowzero").unwrap_or(0) == 1;
                // An element computed at run time may be 0 or -1: its axis,
                // and the axis -1 stands for, cannot be told.
                let mut out: Vec<Option<Dim>> = target
                    .iter()
                    .enumerate()
                    .map(|(i, d)| match d.as_ref()?.value() {
                        Some(0) if !allowzero => x.as_ref().and_then(|x| x.get(i).cloned()),
                        Some(-1) => None,
                        _ => d.clone(),
                    })
                    .collect();
                let hole = target.iter().position(|d| d.as_ref().and_then(Dim::value) == Some(-1));
                if let (Some(hole), true) = (hole, target.iter().all(Option::is_some)) {
                    let known: Option<Vec<&Dim>> =
                        out.iter().enumerate().filter(|(i, _)| *i != hole).map(|(_, d)| d.as_ref()).collect();
                    let known = known.and_then(|k| k.into_iter().try_fold(Dim::known(1), |p, d| p.mul(d)));
                    let total = x.as_deref().and_then(product);
                    out[hole] = total.zip(known).and_then(|(t, k)| t.div(&k));
                }
                out.into_iter()
                    .enumerate()
                    .map(|(i, d)| d.unwrap_or_else(|| Dim::atom(format!("{value}#{i}"))))
                    .collect()
            }
            "Unsqueeze" | "Squeeze" => {
                let x = input(0)?;
                let axes = match g.ints_argument(node, "axes", 1, 13) {
                    IntsArgument::Known(axes) => axes,
                    IntsArgument::Absent if node.op_type() == "Squeeze" => {
                        if x.iter().any(|d| d.value().is_none()) {
                            return None;
                        }
                        x.iter().enumerate().filter(|(_, d)| d.value() == Some(1)).map(|(i, _)| i as i64).collect()
                    }
                    _ => return None,
                };
                let rank = if node.op_type() == "Unsqueeze" { x.len() + axes.len() } else { x.len() };
                let axes: Vec<usize> = axes.iter().map(|&a| normalize(a, rank)).collect::<Option<_>>()?;
                // Repeated axes: ONNX Runtime refuses the node.
                if axes.iter().enumerate().any(|(i, a)| axes[..i].contains(a)) {
                    return None;
                }
                if node.op_type() == "Unsqueeze" {
                    let mut rest = x.into_iter();
                    (0..rank)
                        .map(|i| if axes.contains(&i) { Some(Dim::known(1)) } else { rest.next() })
                        .collect::<Option<_>>()?
                } else {
                    x.into_iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d).collect()
                }
            }
            "Gather" => {
                let (data, indices) = (input(0)?, input(1)?);
                let axis = normalize(node.attr_int("axis").unwrap_or(0), data.len())?;
                [&data[..axis], &indices[..], &data[axis + 1..]].concat()
            }
            // The indices' shape with the depth inserted at `axis`.
            "OneHot" => {
                let mut out = input(0)?;
                let axis = normalize(node.attr_int("axis").unwrap_or(-1), out.len() + 1)?;
                let depth = node.input.get(1).and_then(|d| self.scalar(d)).filter(Dim::is_size);
                out.insert(axis, depth.unwrap_or_else(|| Dim::atom(format!("{value}#{axis}"))));
                out
            }
            // The output has the indices' shape (of the data's rank).
            "GatherElements" => {
                let (data, indices) = (input(0)?, input(1)?);
                (data.len() == indices.len()).then_some(indices)?
            }
            // Its axes are its input's elements, each of them, whatever it
            // is computed from: one below 0 fails the node, so where it
            // runs, `seq - 1` is a size (a torch.ones(seq - 1, seq - 1)).
            "ConstantOfShape" => match self.shape(&node.input[0])?.as_slice() {
                [_] => self
                    .elements(&node.input[0], 0)?
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| d.unwrap_or_else(|| Dim::atom(format!("{value}#{i}"))))
                    .collect(),
                _ => return None,
            },
            "Conv" => {
                // Batch, the weight's output channels, then each spatial
                // axis from its size, kernel, pads, stride and dilation
                // where those are numbers.
                // X has W's rank (or the Conv fails): unknown axes of its own
                // where X's shape is not derived.
                let w = input(1)?;
                let x = input(0).unwrap_or_else(|| (0..w.len()).map(|i| Dim::atom(format!("{value}#x{i}"))).collect());
                if x.len() != w.len() || x.len() < 3 {
                    return None;
                }
                let spatial = (2..x.len()).map(|i| {
                    w[i].value()
                        .and_then(|k| conv_length(node, i - 2, x.len() - 2, (&x[i], self.least_of(&x[i])), k, &self.memo.floors))
                        .unwrap_or_else(|| Dim::atom(format!("{value}#{i}")))
                });
                [x[0].clone(), w[0].clone()].into_iter().chain(spatial).collect()
            }
            // Batch and channels kept, each spatial axis as a Conv's of the
            // kernel_shape (with `ceil_mode`, rounded up: `conv_length`).
            "AveragePool" | "MaxPool" | "LpPool" => {
                let x = input(0)?;
                let kernel = node.attr_ints("kernel_shape")?;
                if x.len() < 3 || kernel.len() != x.len() - 2 {
                    return None;
                }
                let spatial = (2..x.len()).map(|i| {
                    conv_length(node, i - 2, x.len() - 2, (&x[i], self.least_of(&x[i])), kernel[i - 2], &self.memo.floors)
                        .unwrap_or_else(|| Dim::atom(format!("{value}#{i}")))
                });
                [x[0].clone(), x[1].clone()].into_iter().chain(spatial).collect()
            }
            "Flatten" => {
                let x = input(0)?;
                let rank = x.len() as i64;
                let axis = node.attr_int("axis").unwrap_or(1);
                let axis = if axis < 0 { axis + rank } else { axis };
                if !(0..=rank).contains(&axis) {
                    return None;
                }
                let part = |dims: &[Dim], i: usize| product(dims).unwrap_or_else(|| Dim::atom(format!("{value}#{i}")));
                vec![part(&x[..axis as usize], 0), part(&x[axis as usize..], 1)]
            }
            "GatherND" => {
                // indices[:-1] + data[batch_dims + indices[-1]:]
                let (data, indices) = (input(0)?, input(1)?);
                let batch = usize::try_from(node.attr_int("batch_dims").unwrap_or(0)).ok()?;
                let depth = usize::try_from(indices.last()?.value()?).ok()?;
                let rest = data.get(batch.checked_add(depth)?..)?;
                [&indices[..indices.len() - 1], rest].concat()
            }
            "Gemm" => {
                let (a, b) = (input(0)?, input(1)?);
                let trans = |name: &str| node.attr_int(name).unwrap_or(0) == 1;
                let ([a0, a1], [b0, b1]) = (<[Dim; 2]>::try_from(a).ok()?, <[Dim; 2]>::try_from(b).ok()?);
                let m = if trans("transA") { a1 } else { a0 };
                let n = if trans("transB") { b0 } else { b1 };
                vec![m, n]
            }
            // A vector, also of a value whose rank is unknown.
            "Shape" => {
                let Some(x) = input(0) else { return Some(opaque(1)) };
                let r = x.len() as i64;
                let clamp = |a: i64| if a < 0 { (a + r).max(0) } else { a.min(r) };
                let (start, end) =
                    (clamp(node.attr_int("start").unwrap_or(0)), clamp(node.attr_int("end").unwrap_or(r)));
                vec![Dim::known((end - start).max(0))]
            }
            "Size" => vec![],
            "Range" => vec![self.range_length(node).unwrap_or_else(|| Dim::atom(format!("{value}#0")))],
            "NonZero" => self.every_index(node).unwrap_or_else(|| opaque(2)),
            "Einsum" => self.einsum(node, value)?,
            "Tile" => {
                let x = input(0)?;
                let repeats = self.shape_tensor(&node.input[1])?;
                // A negative repeat fails at run time.
                if repeats.len() != x.len() || repeats.iter().flatten().any(|r| r.value().is_some_and(|r| r < 0)) {
                    return None;
                }
                x.iter()
                    .zip(repeats)
                    .enumerate()
                    .map(|(i, (d, r))| r.and_then(|r| d.mul(&r)).unwrap_or_else(|| Dim::atom(format!("{value}#{i}"))))
                    .collect()
            }
            "Slice" => {
                let x = input(0)?;
                // Each sliced axis with its length: from its bounds where
                // they are constants; where they are computed at run time,
                // from the elements they are computed from
                // (`runtime_slice_length`), else unknown.
                let sliced: Vec<(usize, Option<Dim>)> = match g.slice_arguments(node) {
                    Some((starts, ends, axes, steps)) => {
                        if starts.len() != ends.len() || axes.len() != starts.len() || steps.len() != starts.len() {
                            return None;
                        }
                        let bounds = starts.iter().zip(&ends).zip(&steps);
                        let lengths = axes.iter().zip(bounds).map(|(&axis, ((&start, &end), &step))| {
                            let axis = normalize(axis, x.len())?;
                            let length = slice_length(&x[axis], start, end, step)
                                .or_else(|| self.bounded_slice_length(&x[axis], start, end, step))
                                .or_else(|| self.cut_length(&node.input[0], &x[axis], start, end, step));
                            Some((axis, length))
                        });
                        lengths.collect::<Option<_>>()?
                    }
                    None => match self.sliced_axes(node) {
                        Some(axes) => {
                            let lengths = axes.iter().enumerate().map(|(i, &axis)| {
                                let axis = normalize(axis, x.len())?;
                                Some((axis, self.runtime_slice_length(node, i, &x[axis])))
                            });
                            lengths.collect::<Option<_>>()?
                        }
                        None => return Some(opaque(x.len())),
                    },
                };
                let mut out = x.clone();
                for (axis, length) in sliced {
                    out[axis] = length.unwrap_or_else(|| Dim::atom(format!("{value}#{axis}")));
                }
                out
            }
            "Concat" => {
                let parts: Vec<Vec<Dim>> = (0..node.input.len()).map(input).collect::<Option<_>>()?;
                let rank = parts.first()?.len();
                let axis = normalize(node.attr_int("axis")?, rank)?;
                if parts.iter().any(|p| p.len() != rank) {
                    return None;
                }
                // The other axes agree in every part (or the model fails):
                // a number any part proves is the axis.
                let mut out: Vec<Dim> = (0..rank)
                    .map(|i| parts.iter().map(|p| &p[i]).find(|d| d.value().is_some()).unwrap_or(&parts[0][i]).clone())
                    .collect();
                let total = parts.iter().try_fold(Dim::known(0), |t, p| t.add(&p[axis]));
                out[axis] = total.unwrap_or_else(|| Dim::atom(format!("{value}#{axis}")));
                out
            }
            op if op.starts_with("Reduce") => {
                let x = input(0)?;
                let keep = node.attr_int("keepdims").unwrap_or(1) == 1;
                let axes: Vec<i64> = match g.reduce_axes(node) {
                    IntsArgument::Known(axes) if !axes.is_empty() => axes,
                    // No axes: every axis, or none with noop_with_empty_axes.
                    IntsArgument::Known(_) | IntsArgument::Absent => {
                        if node.attr_int("noop_with_empty_axes").unwrap_or(0) == 1 {
                            return Some(x);
                        }
                        (0..x.len() as i64).collect()
                    }
                    // Axes computed at run time: only the rank is known, and
                    // only when the reduced axes are kept.
                    IntsArgument::Unknown if keep => return Some(opaque(x.len())),
                    IntsArgument::Unknown => return None,
                };
                let axes: Vec<usize> = axes.iter().map(|&a| normalize(a, x.len())).collect::<Option<_>>()?;
                x.into_iter()
                    .enumerate()
                    .filter_map(|(i, d)| match (axes.contains(&i), keep) {
                        (false, _) => Some(d),
                        (true, true) => Some(Dim::known(1)),
                        (true, false) => None,
                    })
                    .collect()
            }
            "Expand" => {
                // Broadcast of the input with the target shape.
                let target = self.shape_tensor(&node.input[1])?;
                // A negative size fails at run time.
                if target.iter().flatten().any(|d| d.value().is_some_and(|n| n < 0)) {
                    return None;
                }
                let target = target
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| d.unwrap_or_else(|| Dim::atom(format!("{value}#expand{i}"))))
                    .collect();
                self.broadcast(value, &[input(0)?, target])
            }
            "Pad" => {
                // Each padded axis grows by its two pads (negative ones
                // crop): `pads` an attribute before opset 11, an input from
                // it on (computed at run time too: LongT5 pads its blocks
                // to a multiple of their length); `axes` (opset 18) the
                // axes they apply to, else every axis.
                let x = input(0)?;
                let g = self.g;
                let axes: Vec<usize> = match node.input.get(3).filter(|v| !v.is_empty() && g.opset >= 18) {
                    None => (0..x.len()).collect(),
                    Some(a) => match g.constant(a).and_then(|t| t.ints()) {
                        Some(axes) => axes.iter().map(|&a| normalize(a, x.len())).collect::<Option<_>>()?,
                        None => return Some(opaque(x.len())),
                    },
                };
                let pads: Vec<Option<Dim>> = if g.opset < 11 {
                    node.attr_ints("pads")?.iter().map(|&p| Some(Dim::known(p))).collect()
                } else {
                    self.shape_tensor(node.input.get(1).filter(|v| !v.is_empty())?)
                        .unwrap_or_else(|| vec![None; 2 * axes.len()])
                };
                // Repeated axes or pads of another count: the run fails.
                if pads.len() != 2 * axes.len() || axes.iter().enumerate().any(|(i, a)| axes[..i].contains(a)) {
                    return None;
                }
                let mut out = x.clone();
                for (j, &a) in axes.iter().enumerate() {
                    let (begin, end) = (&pads[j], &pads[j + axes.len()]);
                    // An axis grown by pads that add up to no less than 0
                    // is a length; cropped, only where that is proved (a
                    // length that may be negative is none: the run fails).
                    let grown = begin.as_ref().zip(end.as_ref()).and_then(|(b, e)| {
                        let both = b.add(e)?;
                        let grows = both.value().is_some_and(|n| n >= 0) || both.is_size();
                        x[a].add(&both).filter(|d| grows || d.is_size())
                    });
                    out[a] = grown.unwrap_or_else(|| Dim::atom(format!("{value}#{a}")));
                }
                out
            }
            // Given `sizes` (from opset 11, every axis: no `axes`, the
            // default `stretch` policy), the output has those sizes.
            "Resize" if node.input.get(3).is_some_and(|v| !v.is_empty()) => {
                let x = input(0)?;
                let stretched =
                    node.attr("keep_aspect_ratio_policy").is_none_or(|a| a.s.as_deref() == Some(b"stretch"));
                if node.attr("axes").is_some() || !stretched {
                    return Some(opaque(x.len()));
                }
                let sizes = self.shape_tensor(&node.input[3]).filter(|s| s.len() == x.len());
                let Some(sizes) = sizes else { return Some(opaque(x.len())) };
                sizes
                    .into_iter()
                    .enumerate()
                    .map(|(i, d)| d.unwrap_or_else(|| Dim::atom(format!("{value}#{i}"))))
                    .collect()
            }
            _ => return None,
        })
    }

    /// The length the `i`th sliced axis of a Slice keeps where its bounds
    /// are computed at run time, by 1 from a start `s` to an end `e` on an
    /// axis of length `len`: `e - s` where 0 ≤ s ≤ e and e ≤ len or len ≤ e
    /// are proved (a cache's causal mask `bias[..., past : past + seq, :]`),
    /// as for `0 .. len`; from 0, `min(e, len)` where one of the two is a
    /// number of at least 1 and the other a dimension (`min_atom`: GPT-2's
    /// causal mask and BERT's position ids, a buffer sliced to the
    /// sequence's length); the last len elements are the axis.
    fn runtime_slice_length(&self, node: &NodeProto, i: usize, len: &Dim) -> Option<Dim> {
        let at = |k: usize| -> Option<Dim> { self.elements(node.input.get(k)?, 0)?.get(i)?.clone() };
        let step = match node.input.get(4).filter(|s| !s.is_empty()) {
            Some(_) => at(4)?,
            None => Dim::known(1),
        };
        let (start, end) = (at(1)?, at(2)?);
        // Bounds computed from numbers (Llama's rotate_half, `x[..., d // 2:]`).
        if let (Some(s), Some(e), Some(st)) = (start.value(), end.value(), step.value()) {
            return slice_length(len, s, e, st);
        }
        if step.value() != Some(1) {
            return None;
        }
        // The last e elements of an axis of length e, `-e:` (T5's position
        // bias cut to the query length), are the axis. (Where e may be
        // other than len, `-0:` is the whole axis, not min(0, len).)
        let last = start.neg()?;
        if last == *len && (end.value().is_some_and(|e| e >= i64::MAX / 2) || end == *len) {
            return Some(len.clone());
        }
        // Each bound within the axis, or past its end (the end then).
        let within = |b: &Dim| match b.is_size() {
            true if self.proved_at_most(b, len) => Some(b.clone()),
            true if self.proved_at_most(len, b) => Some(len.clone()),
            _ => None,
        };
        if let (Some(s), Some(e)) = (within(&start), within(&end)) {
            if let Some(kept) = e.sub(&s).filter(Dim::is_size) {
                return Some(kept);
            }
        }
        if start.value() != Some(0) {
            return None;
        }
        match (len.value(), end.value()) {
            (Some(n), Some(e)) => Some(Dim::known(slice_count(0, e, 1, n))),
            (None, Some(e)) if e >= i64::MAX / 2 => Some(len.clone()),
            (None, Some(e)) if e >= 1 && len.is_dimension() => Some(self.min_atom(len.clone(), e)),
            (Some(n), None) if n >= 1 && end.is_dimension() => Some(self.min_atom(end, n)),
            _ => None,
        }
    }

    /// `[start : end]` by 1 with a negative end of an axis of symbolic
    /// length `len` of `x`: `len + end - start`, where that is proved never
    /// negative because it is the length of an axis of a value `x` is
    /// computed from (computed in every run that computes `x`, so a size in
    /// each). HuBERT's, wav2vec2's and WavLM's positional Conv pads its
    /// input by 8 on each side with a kernel of 16, one step longer than
    /// its input, and `[:, :, :-1]` cuts it back to the input's length.
    fn cut_length(&self, x: &str, len: &Dim, start: i64, end: i64, step: i64) -> Option<Dim> {
        if step != 1 || start < 0 || end >= 0 || end <= i64::MIN / 2 || len.value().is_some() {
            return None;
        }
        let kept = self.resolve(len.add(&Dim::known(end))?.sub(&Dim::known(start))?);
        self.upstream_length(x, &kept).then_some(kept)
    }

    /// Whether `d` is the length of an axis of `value` or of a value it is
    /// computed from (a few steps up).
    fn upstream_length(&self, value: &str, d: &Dim) -> bool {
        const STEPS: usize = 8;
        const VALUES: usize = 64;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut front = vec![value];
        for _ in 0..STEPS {
            let mut next = vec![];
            for v in front {
                if seen.len() >= VALUES || !seen.insert(v) {
                    continue;
                }
                if self.shape(v).is_some_and(|s| s.contains(d)) {
                    return true;
                }
                if let Some(p) = self.g.producer(v) {
                    next.extend(self.g.node(p).input.iter().filter(|i| !i.is_empty()).map(String::as_str));
                }
            }
            front = next;
        }
        false
    }

    /// An atom for `min(e, n)`, with e a dimension and n ≥ 1, remembered so
    /// that a broadcast with e itself is e (`broadcast`).
    fn min_atom(&self, e: Dim, n: i64) -> Dim {
        let name = min_name(&e, n);
        self.memo.mins.borrow_mut().entry(name.clone()).or_insert((e, n));
        Dim::atom(name)
    }

    /// A size; a remainder by a positive number whatever its polynomial's
    /// signs (LongT5's blocks: `(-seq) % 3` is `3·floor((seq + 2)/3) − seq`,
    /// so `seq ≤ 3·floor((seq + 2)/3)`); or a sum whose atoms' bounds the
    /// run proves make it at least 0 (`seq − 1` where seq ≥ 1).
    fn never_negative(&self, d: &Dim) -> bool {
        d.is_size() || self.memo.remainders.borrow().contains(&d.key()) || self.least_of(d) >= 0
    }

    /// The number a declared symbol is wherever the model runs, where the
    /// equalities every run needs prove one (an image's channels: a Conv's
    /// weight reads 3).
    pub fn proved_symbol(&self, symbol: &str) -> Option<i64> {
        self.resolve(Dim::atom(format!("${symbol}"))).value()
    }

    /// Whether two equalities the model needs to run contradict each other
    /// (a Reshape proves an axis 7, a broadcast 2): no run succeeds.
    pub fn vacuous(&self) -> bool {
        self.memo.vacuous.get()
    }

    /// Whether `a` and `b` are the same number on every run (after the
    /// equalities every run needs).
    pub fn same_dim(&self, a: &Dim, b: &Dim) -> bool {
        self.canonical(a) == self.canonical(b)
    }

    /// `d` as every dimension equal to it on every run is written (after
    /// the equalities every run needs): equal ones are equal `Dim`s.
    pub fn canonical(&self, d: &Dim) -> Dim {
        self.resolve(d.clone())
    }

    /// The least `d` is on any run: a number, or what the run proves of
    /// its atoms (0 for a size nothing more is known of).
    pub fn at_least(&self, d: &Dim) -> i64 {
        self.least_of(&self.resolve(d.clone()))
    }

    /// The least `d` is, its atoms at their least (`least`).
    fn least_of(&self, d: &Dim) -> i64 {
        d.least(|atom| self.least(atom, 0)).unwrap_or(i64::MIN)
    }

    /// The least an atom is: its bound where the run proves one; for a
    /// floor, the floor of the least of what it is the floor of (the
    /// pooled `floor((seq + 1)/2)` is at least 1 where seq is).
    fn least(&self, atom: &str, depth: usize) -> i64 {
        let proved = self.memo.lower.borrow().get(atom).copied().unwrap_or(0);
        let floors = self.memo.floors.borrow();
        let of_floor = match floors.get(atom) {
            Some((p, s)) if depth < MAX_DEPTH => p.least(|a| self.least(a, depth + 1)).map_or(0, |n| n.div_euclid(*s)),
            _ => 0,
        };
        proved.max(of_floor)
    }

    /// `[start : end]` by 1 of an axis of symbolic length `len`, from
    /// `start ≥ 0`, where the bounds the run proves keep it within the axis
    /// (`required_bounds`): to the end (or to `end < 0` from it), what is
    /// left where that is never negative; to `end ≥ start`, `end − start`
    /// where `len ≥ end`. Funnel's class token `x[:, :1]` and the rest
    /// `x[:, 1:]` of a sequence of at least 1 are 1 and `seq − 1` long.
    fn bounded_slice_length(&self, len: &Dim, start: i64, end: i64, step: i64) -> Option<Dim> {
        if step < 1 || start < 0 || len.value().is_some() {
            return None;
        }
        // Every step-th from start to the end (Swin's patch merging,
        // `x[:, 0::2]` and `x[:, 1::2]`): ceil((len − start) / step).
        if step > 1 {
            let left = len.sub(&Dim::known(start))?;
            if end < i64::MAX / 2 || !self.never_negative(&left) {
                return None;
            }
            return floor_of(&left.add(&Dim::known(step - 1))?, step, &self.memo.floors);
        }
        let kept = match end {
            e if e >= i64::MAX / 2 => len.sub(&Dim::known(start))?,
            e if e >= start => {
                let within = self.never_negative(&len.sub(&Dim::known(e))?);
                within.then(|| Dim::known(e - start))?
            }
            e if e < 0 && e > i64::MIN / 2 => len.add(&Dim::known(e))?.sub(&Dim::known(start))?,
            _ => return None,
        };
        self.never_negative(&kept).then_some(kept)
    }

    /// `a ≤ b` in every run: `b - a` is a size, or b is a number n and the
    /// run has proved `min(e, m) = e` (`required_equalities`) for an e of
    /// at least a and an m of at most n.
    fn proved_at_most(&self, a: &Dim, b: &Dim) -> bool {
        if b.sub(a).is_some_and(|d| self.never_negative(&d)) {
            return true;
        }
        let Some(n) = b.value() else { return false };
        let a = self.resolve(a.clone());
        let mins = self.memo.mins.borrow();
        mins.iter().any(|(name, (e, m))| {
            let e = self.resolve(e.clone());
            *m <= n && e.sub(&a).is_some_and(|d| d.is_size()) && self.resolve(Dim::atom(name.clone())) == e
        })
    }

    /// Element `i` of a 1-D value whose length may be unknown, where a
    /// Gather of it runs (so `i` is within it; a negative `i` counts from
    /// the end), through Casts to types that hold sizes: of a `Range` of
    /// whole numbers `start + i·delta` (Funnel's `pos[0]` and `pos[-1]` of
    /// `arange(seq)` are 0 and `seq − 1`); of a `Concat`, the element of
    /// its first part (its last, from the end) where that part has it
    /// (Funnel's pooled positions `cat([-1.0], pos[1:-1:2])[0]` are -1).
    fn element_at(&self, value: &str, i: i64, depth: usize) -> Option<Dim> {
        let g = self.g;
        let node = g.node(g.producer(value)?);
        if !crate::onnx::is_default_domain(node.domain()) || depth >= MAX_DEPTH {
            return None;
        }
        match node.op_type() {
            "Identity" => self.element_at(node.input.first()?, i, depth + 1),
            "Cast" if cast_to(node).is_some_and(crate::onnx::holds_sizes) => {
                held_as(cast_to(node)?, self.element_at(node.input.first()?, i, depth + 1)?)
            }
            "Concat" if node.attr_int("axis").is_some_and(|a| a == 0 || a == -1) => {
                let part = if i >= 0 { node.input.first() } else { node.input.last() }?;
                let known = self.elements(part, depth + 1)?;
                let n = i64::try_from(known.len()).ok()?;
                known.get(usize::try_from(if i >= 0 { i } else { n + i }).ok()?)?.clone()
            }
            "Range" => {
                let start = self.scalar(node.input.first()?)?;
                let delta = g.scalar(node.input.get(2)?);
                let delta = delta.filter(|d| d.fract() == 0.0 && *d != 0.0 && d.abs() < 2f64.powi(31))?;
                let steps = match i {
                    0.. => Dim::known(i),
                    _ => self.range_length(node)?.add(&Dim::known(i))?,
                };
                start.add(&steps.mul(&Dim::known(delta as i64))?)
            }
            _ => None,
        }
    }

    /// `NonZero(x)` of an x of rank 1 or more proved to hold no zero
    /// (`values_held`): the index of every element, `[rank, numel]`
    /// (torch's `repeat_interleave` lists the indices of a mask every
    /// element of which is true).
    fn every_index(&self, node: &crate::onnx::NodeProto) -> Option<Vec<Dim>> {
        let x = node.input.first()?;
        let shape = self.shape(x).filter(|s| !s.is_empty())?;
        let held = super::fold::values_held(self.g, self, x)?;
        if held.iter().any(|&v| v == 0.0) {
            return None;
        }
        let numel = shape.iter().try_fold(Dim::known(1), |n, d| n.mul(d))?;
        Some(vec![Dim::known(shape.len() as i64), numel])
    }

    /// The length of `Range(start, limit, delta)`, max(limit - start, 0)
    /// for a step of 1 or -1: `limit` for the common `Range(0, n, 1)`, `seq`
    /// for a cache's positions `Range(past, past + seq, 1)`; else computed
    /// from numbers.
    fn range_length(&self, node: &crate::onnx::NodeProto) -> Option<Dim> {
        let g = self.g;
        let delta = g.scalar(node.input.get(2)?)?;
        let limit = self.scalar(node.input.get(1)?)?;
        if delta == 1.0 || delta == -1.0 {
            if let Some(start) = self.scalar(node.input.first()?) {
                let span = if delta == 1.0 { limit.sub(&start) } else { start.sub(&limit) }?;
                return match span.value() {
                    Some(n) => Some(Dim::known(n.max(0))),
                    None if span.is_dimension() => Some(span),
                    None => span.neg().filter(Dim::is_dimension).map(|_| Dim::known(0)),
                };
            }
        }
        let start = g.scalar(node.input.first()?)?;
        let limit = limit.value()? as f64;
        let n = ((limit - start) / delta).ceil().max(0.0);
        (n.is_finite() && n < i64::MAX as f64).then(|| Dim::known(n as i64))
    }

    /// An Einsum's output axes, from the letters of an explicit equation
    /// (`bhqd,bhkd->bhqk`), an ellipsis standing for the axes its operand
    /// has beyond its letters, which broadcast across the operands as
    /// numpy's do (`...nd,...ng->...gd`); an equation without `->` is not
    /// read. A letter's sizes broadcast too (1 against n).
    fn einsum(&self, node: &crate::onnx::NodeProto, value: &str) -> Option<Vec<Dim>> {
        let (terms, output) = node.einsum_terms()?;
        if terms.len() != node.input.len() {
            return None;
        }
        /// The letters before and after an ellipsis (all before where none).
        fn parts(term: &str) -> Option<(Vec<char>, Option<Vec<char>>)> {
            let letters = |t: &str| t.chars().all(|c| c.is_ascii_alphabetic()).then(|| t.chars().collect());
            match term.split_once("...") {
                Some((pre, post)) => Some((letters(pre)?, Some(letters(post)?))),
                None => Some((letters(term)?, None)),
            }
        }
        let mut letters: HashMap<char, Vec<Dim>> = HashMap::new();
        let mut ellipses: Vec<Vec<Dim>> = vec![];
        for (term, input) in terms.iter().zip(&node.input) {
            let shape = self.shape(input)?;
            let (pre, post) = parts(term)?;
            let post = post.map(|post| {
                let spanned = shape.len().checked_sub(pre.len() + post.len());
                (post, spanned)
            });
            let (post, spanned) = match post {
                Some((post, Some(n))) => (post, n),
                Some((_, None)) => return None,
                None if shape.len() == pre.len() => (vec![], 0),
                None => return None,
            };
            if term.contains("...") {
                ellipses.push(shape[pre.len()..pre.len() + spanned].to_vec());
            }
            let lettered = pre.iter().zip(&shape).chain(post.iter().zip(&shape[pre.len() + spanned..]));
            for (&letter, d) in lettered {
                letters.entry(letter).or_default().push(d.clone());
            }
        }
        let (pre, post) = parts(&output)?;
        // A letter's sizes meet as in a broadcast.
        let size = |l: &char, i: usize| -> Option<Dim> {
            let sizes: Vec<&Dim> = letters.get(l)?.iter().collect();
            Some(self.broadcast_axis(&sizes, &format!("{value}#{i}")))
        };
        let mut out: Vec<Dim> = pre.iter().enumerate().map(|(i, l)| size(l, i)).collect::<Option<_>>()?;
        if let Some(post) = post {
            out.extend(self.broadcast(&format!("{value}#ellipsis"), &ellipses));
            let at = out.len();
            out.extend(post.iter().enumerate().map(|(i, l)| size(l, at + i)).collect::<Option<Vec<_>>>()?);
        }
        Some(out)
    }

    /// The shape of one output of a Split: sizes given (attribute before
    /// opset 13, input from it on), or equal parts of a divisible axis, or
    /// (`num_outputs`, opset 18, an axis not known to divide) parts of
    /// ceil(n/k), an atom of the Split's where n is no number, the last
    /// the rest: the parts add up to n.
    fn split_part(&self, node: &crate::onnx::NodeProto, value: &str, x: Vec<Dim>) -> Option<Vec<Dim>> {
        let index = node.output.iter().position(|o| o == value)?;
        let axis = normalize(node.attr_int("axis").unwrap_or(0), x.len())?;
        let k = node.output.len() as i64;
        let part = match self.g.ints_argument(node, "split", 1, 13) {
            IntsArgument::Known(sizes) if sizes.len() == node.output.len() => Dim::known(*sizes.get(index)?),
            IntsArgument::Absent if node.attr_int("num_outputs").is_none_or(|n| n == k) => {
                match x[axis].div(&Dim::known(k)) {
                    Some(part) => part,
                    None if node.attr_int("num_outputs").is_some() => {
                        let part = match x[axis].value() {
                            Some(n) => Dim::known(n.checked_add(k - 1)? / k),
                            None => Dim::atom(format!("{}#part", node.output.first()?)),
                        };
                        let rest = x[axis].sub(&part.mul(&Dim::known(k - 1))?)?;
                        // (No run splits a known axis into a negative rest.)
                        if rest.value().is_some_and(|r| r < 0) {
                            return None;
                        }
                        if index + 1 < node.output.len() {
                            part
                        } else {
                            rest
                        }
                    }
                    None => return None,
                }
            }
            _ => return None,
        };
        let mut shape = x;
        shape[axis] = part;
        Some(shape)
    }

    /// The shape of TopK's values and of its indices alike: x's with the
    /// axis K long (K an attribute before opset 10, else a one-element
    /// tensor of a size `shape_tensor` knows; otherwise one unknown size
    /// both outputs share).
    fn top_k(&self, node: &crate::onnx::NodeProto, mut x: Vec<Dim>) -> Option<Vec<Dim>> {
        let axis = normalize(node.attr_int("axis").unwrap_or(-1), x.len())?;
        let k = match self.g.opset {
            opset if opset < 10 => node.attr_int("k").map(Dim::known),
            _ => match self.shape_tensor(node.input.get(1)?).as_deref() {
                Some([Some(k)]) => Some(k.clone()),
                _ => None,
            },
        };
        // (A negative K is no length: the run fails.)
        let k = k.filter(|k| k.value().is_none_or(|n| n >= 0));
        x[axis] = k.unwrap_or_else(|| Dim::atom(format!("{}#k", node.output[0])));
        Some(x)
    }

    /// The elements of a 1-D integer tensor that holds a shape: known where
    /// they are constants or dimensions read by `Shape`, or computed from
    /// those, None where they are computed otherwise (such an element may
    /// even be 0 or -1), or where a difference is not proved to be a size
    /// (`seq - 1` is -1 where seq is 0): proved where it is a number, has
    /// no negative term, or is the length of an axis of a value it is
    /// computed from (`Shape(x)[1]` where x's axis is `floor(n / 2) - 1`).
    pub fn shape_tensor(&self, value: &str) -> Option<Vec<Option<Dim>>> {
        match self.shape(value) {
            Some(shape) if shape.len() != 1 => None,
            _ => self.shape_elements(value),
        }
    }

    /// `shape_tensor`, for a scalar too (one element): the cleanup folds
    /// `Gather(Shape(x), i)` where x's axis i is a number.
    pub fn shape_elements(&self, value: &str) -> Option<Vec<Option<Dim>>> {
        match self.shape(value) {
            Some(shape) if shape.len() > 1 => None,
            _ => Some(
                self.elements(value, 0)?
                    .into_iter()
                    .map(|d| {
                        d.filter(|d| {
                            d.value().is_some() || self.never_negative(d) || self.upstream_length(value, d)
                        })
                    })
                    .collect(),
            ),
        }
    }

    /// The elements of a float tensor of rank 0 or 1 that folds exactly
    /// from constants (`fold`), where each is an integer a Cast keeps.
    fn integral(&self, value: &str) -> Option<Vec<Option<Dim>>> {
        if self.g.elem_type(value).is_none_or(crate::onnx::is_integer) {
            return None;
        }
        let folded = super::fold::fold(self.g, self, value).filter(|f| f.exact && f.dims.len() <= 1)?;
        let whole = |v: f64| (v.fract() == 0.0 && v.abs() < 2f64.powi(53)).then(|| Dim::known(v as i64));
        Some(folded.values.iter().map(|&v| whole(v)).collect())
    }

    /// The value of an integer scalar (or one-element tensor) as a dimension.
    fn scalar(&self, value: &str) -> Option<Dim> {
        if let Some(v) = self.g.scalar(value) {
            return (v.fract() == 0.0 && v.abs() < 2f64.powi(53)).then(|| Dim::known(v as i64));
        }
        match self.elements(value, 0)?.as_slice() {
            [one] => one.clone(),
            _ => None,
        }
    }

    /// The elements of an integer tensor of rank 0 or 1, in order, as
    /// exports compute shapes at run time: `Shape`, its parts (`Gather`,
    /// `Slice`), regrouped (`Concat`, `Unsqueeze`, `Squeeze`, `Reshape`,
    /// `Cast`), and element-wise arithmetic on them (`Add`, `Sub`, `Mul`,
    /// `Div`), `Equal` and `Where` (torch's `expand(-1)` is
    /// `Where(Equal(s, -1), ones, s)`), as ONNX Runtime's symbolic shape
    /// inference evaluates them.
    fn elements(&self, value: &str, depth: usize) -> Option<Vec<Option<Dim>>> {
        let g = self.g;
        if let Some(t) = g.constant(value) {
            return match t.ints() {
                Some(ints) => Some(ints.into_iter().map(|d| Some(Dim::known(d))).collect()),
                // A float's whole numbers (the 2.0 of `math.ceil(h / 2.0) * 2.0`).
                None => self.integral(value),
            };
        }
        let unknown = || -> Option<Vec<Option<Dim>>> {
            match self.shape(value)?.as_slice() {
                [] => Some(vec![None]),
                [n] => Some(vec![None; tracked(n.value()?)?]),
                _ => None,
            }
        };
        let Some(node) = g.producer(value).map(|p| g.node(p)) else { return unknown() };
        if !crate::onnx::is_default_domain(node.domain()) || depth >= MAX_DEPTH {
            return unknown();
        }
        let arg = |i: usize| node.input.get(i).filter(|v| !v.is_empty()).and_then(|v| self.elements(v, depth + 1));
        // Elements are listed in row-major order, so an op that reads them
        // by position along one axis needs that axis to be the only one:
        // of a tensor of 2 or more axes, only the ops below that say so.
        let rows = |i: usize| match self.shape(node.input.get(i)?)?.as_slice() {
            [r, c] => Some((tracked(r.value()?)?, tracked(c.value()?)?)),
            _ => None,
        };
        let of_rank = |v: &str| self.shape(v).map(|s| s.len());
        let positional = ["Concat", "Gather", "Slice", "Add", "Sub", "Mul", "Div", "Mod", "Equal", "Where"];
        if positional.contains(&node.op_type()) && node.input.iter().any(|v| of_rank(v).is_some_and(|r| r >= 2)) {
            return match (node.op_type(), rows(0)) {
                // torch's F.pad turns its pads into ONNX's order as
                // `Reshape(p, [-1, 2])`, reversed by rows, transposed and
                // flattened.
                ("Slice", Some((r, c))) => {
                    let data = arg(0)?;
                    match g.slice_arguments(node)? {
                        (start, end, axes, step) if matches!(axes.as_slice(), [0 | -2]) && data.len() == r * c => {
                            let rows = slice_indices(*start.first()?, *end.first()?, *step.first()?, r as i64);
                            Some(rows.into_iter().flat_map(|i| data[i as usize * c..][..c].to_vec()).collect())
                        }
                        _ => unknown(),
                    }
                }
                _ => unknown(),
            };
        }
        let found = match node.op_type() {
            // A matrix transposed: element (i, j) of r × c moves to (j, i).
            "Transpose" => {
                let (r, c) = rows(0)?;
                let data = arg(0).filter(|d| d.len() == r * c && node.attr_ints("perm").is_none_or(|p| p == [1, 0]))?;
                Some((0..c).flat_map(|j| (0..r).map(move |i| (i, j))).map(|(i, j)| data[i * c + j].clone()).collect())
            }
            "Shape" => {
                let s = self.shape(&node.input[0])?;
                let r = s.len() as i64;
                let clamp = |a: i64| if a < 0 { (a + r).max(0) } else { a.min(r) } as usize;
                let start = clamp(node.attr_int("start").unwrap_or(0));
                let end = clamp(node.attr_int("end").unwrap_or(r));
                s.get(start..end.max(start)).map(|s| s.iter().cloned().map(Some).collect())
            }
            "Concat" if node.attr_int("axis") == Some(0) || node.attr_int("axis") == Some(-1) => {
                (0..node.input.len()).map(arg).collect::<Option<Vec<_>>>().map(|v| v.concat())
            }
            // The same elements under another rank (0 or 1).
            "Unsqueeze" | "Squeeze" | "Reshape" | "Identity" => arg(0),
            // To bool: a known number is true where it is not 0.
            "Cast" if node.attr_int("to") == Some(i64::from(crate::onnx::BOOL)) => {
                elementwise(&[arg(0)?], |e| Some(Dim::known(i64::from(e[0].as_ref()?.value()? != 0))))
            }
            // Sizes keep their values through a Cast to a type that holds
            // them exactly (`held_as`); a narrower one may wrap or round
            // them.
            "Cast" if cast_to(node).is_some_and(crate::onnx::holds_sizes) => {
                let to = cast_to(node).unwrap_or_default();
                let source = arg(0).map(|e| e.into_iter().map(|d| held_as(to, d?)).collect::<Vec<_>>());
                let to_integer = crate::onnx::is_integer(to);
                match source {
                    Some(e) if e.iter().all(Option::is_some) => Some(e),
                    // `int(h / p)`: a float quotient of sizes, truncated;
                    // or a float computed exactly from constants (DINOv2's
                    // grid side, `Cast(Pow(4.0, 0.5))`), integral: a number.
                    _ => to_integer
                        .then(|| self.rounded(&node.input[0], false, depth))
                        .flatten()
                        .or_else(|| self.integral(&node.input[0]))
                        .or(source),
                }
            }
            // `math.ceil(h / p)` and `math.floor(h / p)`; of an integral
            // float (every element known is one), the same elements.
            "Ceil" | "Floor" => match self.rounded(&node.input[0], node.is("Ceil"), depth) {
                Some(e) => Some(e),
                None => arg(0).filter(|e| e.iter().all(Option::is_some)),
            },
            "Gather" if node.attr_int("axis").unwrap_or(0) == 0 => {
                let indices = g.constant(&node.input[1])?.ints()?;
                match arg(0) {
                    Some(data) => indices.iter().map(|&i| data.get(normalize(i, data.len())?).cloned()).collect(),
                    // Of a vector whose length is unknown: its elements
                    // from the end or the start, each where it is known.
                    None if of_rank(&node.input[0]) == Some(1) => {
                        Some(indices.iter().map(|&i| self.element_at(&node.input[0], i, depth + 1)).collect())
                    }
                    None => None,
                }
            }
            "Slice" => {
                let data = arg(0)?;
                let (starts, ends, axes, steps) = g.slice_arguments(node)?;
                match (starts.as_slice(), ends.as_slice(), axes.as_slice(), steps.as_slice()) {
                    ([start], [end], [0 | -1], [step]) => Some(
                        slice_indices(*start, *end, *step, data.len() as i64)
                            .into_iter()
                            .map(|i| data[i as usize].clone())
                            .collect(),
                    ),
                    _ => None,
                }
            }
            "Add" | "Sub" | "Mul" | "Div" | "Equal" => {
                let op = node.op_type();
                let integer = g.elem_type(value).is_some_and(crate::onnx::is_integer);
                // A size divided by a positive number in an integer type
                // is truncated, so rounded down (DINOv2's grid side
                // `height // patch`).
                let rounded_down = |a: &Dim, b: &Dim| {
                    let c = b.value().filter(|&c| c > 0 && op == "Div" && integer && a.value().is_none())?;
                    self.never_negative(a).then(|| floor_of(a, c, &self.memo.floors))?
                };
                // A result the value's type does not hold, it wraps or
                // rounds (a bool's and a type's that holds no size aside).
                let held = |d: Dim| match g.elem_type(value) {
                    Some(elem) if crate::onnx::holds_sizes(elem) => held_as(elem, d),
                    _ => Some(d),
                };
                elementwise(&[arg(0)?, arg(1)?], |e| match e {
                    [Some(a), Some(b)] => held(rounded_down(a, b).or_else(|| arithmetic(op, a, b, integer))?),
                    _ => None,
                })
            }
            // Of integers by a positive number, the remainder with the
            // divisor's sign (fmod 0): a − c·floor(a / c).
            "Mod" if node.attr_int("fmod").unwrap_or(0) == 0 && g.elem_type(value).is_some_and(crate::onnx::is_integer) => {
                elementwise(&[arg(0)?, arg(1)?], |e| match e {
                    [Some(a), Some(c)] => {
                        let c = c.value().filter(|&c| c > 0)?;
                        let rest = a.sub(&floor_of(a, c, &self.memo.floors)?.mul(&Dim::known(c))?)?;
                        self.memo.remainders.borrow_mut().insert(rest.key());
                        Some(rest)
                    }
                    _ => None,
                })
            }
            "ConstantOfShape" => {
                let n = match arg(0)?.as_slice() {
                    [] => 1,
                    [n] => tracked(n.as_ref()?.value()?)?,
                    _ => return unknown(),
                };
                let fill = match node.attr("value").and_then(|a| a.t.as_ref()) {
                    Some(t) => *t.ints()?.first()?,
                    None => 0,
                };
                Some(vec![Some(Dim::known(fill)); n])
            }
            // Of integers: `start + i·delta` for each i below its length.
            "Range" if g.elem_type(value).is_some_and(crate::onnx::is_integer) => {
                let (start, delta) = (self.scalar(node.input.first()?)?.value()?, g.scalar(node.input.get(2)?)?);
                let n = tracked(self.range_length(node)?.value()?)?;
                let delta = Some(delta as i64).filter(|&d| d as f64 == delta && d != 0)?;
                (0..n as i64).map(|i| Some(start.checked_add(i.checked_mul(delta)?).map(Dim::known))).collect()
            }
            // Of every element (no axes, or a vector's one), where there is one.
            "ReduceMax" | "ReduceMin" => {
                let all = node.input.get(1).is_none_or(String::is_empty)
                    && node.attr_ints("axes").is_none()
                    && node.attr_int("noop_with_empty_axes").unwrap_or(0) == 0;
                let known = arg(0)?.into_iter().map(|d| d?.value()).collect::<Option<Vec<i64>>>();
                let known = known.filter(|_| all || of_rank(&node.input[0]).is_some_and(|r| r <= 1))?;
                let reduced = if node.is("ReduceMax") { known.into_iter().max() } else { known.into_iter().min() };
                Some(vec![Some(Dim::known(reduced?))])
            }
            // Of a bool known as 0 or 1.
            "Not" => elementwise(&[arg(0)?], |e| match e[0].as_ref()?.value()? {
                0 => Some(Dim::known(1)),
                1 => Some(Dim::known(0)),
                _ => None,
            }),
            "Neg" => elementwise(&[arg(0)?], |e| e[0].as_ref()?.neg()),
            "Where" => elementwise(&[arg(0)?, arg(1)?, arg(2)?], |e| match e {
                [Some(c), x, y] => match c.value()? {
                    0 => y.clone(),
                    _ => x.clone(),
                },
                _ => None,
            }),
            _ => None,
        };
        found.or_else(unknown)
    }
}

impl<'a> Shapes<'_, 'a> {
    /// A graph input with an axis of size `d`, and that axis: a kernel's
    /// guard whose conditions on sizes read there rather than a value of
    /// each layer writes the same nodes in every layer, which
    /// `rewrite::share_prelude_nodes` makes one (a decode step computes
    /// them once, not once a layer). Its shape is proved as `d` is (equal
    /// dimensions are equal numbers on every run; a declared symbol is one
    /// dimension wherever it is declared). An input an initializer gives a
    /// default is left out: a feed may replace it in another shape.
    pub fn input_axis(&self, d: &Dim) -> Option<(&'a str, i64)> {
        self.fed_inputs().find_map(|x| Some((x, self.shape(x)?.iter().position(|e| e == d)? as i64)))
    }

    /// A graph input (`input_axis`) empty where a value of shape `dims` is
    /// and nowhere else: the axes of each that are no positive number are
    /// the same dimensions, and a size is 0 where one of them is.
    pub fn input_as_empty_as(&self, dims: &[Dim]) -> Option<&'a str> {
        let unknown = |dims: &[Dim]| -> Option<Vec<Dim>> {
            let mut unknown = vec![];
            for d in dims {
                match d.value() {
                    Some(n) if n > 0 => {}
                    Some(_) => return None,
                    None => unknown.push(d.clone()),
                }
            }
            unknown.sort_by_key(|d| d.to_string());
            unknown.dedup();
            Some(unknown)
        };
        let want = unknown(dims).filter(|u| !u.is_empty())?;
        self.fed_inputs().find(|x| self.shape(x).and_then(|s| unknown(&s)).as_ref() == Some(&want))
    }

    /// The graph's inputs no initializer gives a default.
    fn fed_inputs(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.g.proto.fed_inputs().map(|i| i.name()).filter(|x| !x.is_empty())
    }
}

impl Shapes<'_, '_> {
    /// `p / c` in a float type, as torch traces `h / c` of a size: the
    /// elements of p, each a size, and c, a whole number of at least 1 (the
    /// divisor of a `Div` that is a constant).
    fn quotient(&self, value: &str, depth: usize) -> Option<(Vec<Dim>, i64)> {
        let g = self.g;
        let node = g.node(g.producer(value)?);
        if !node.is("Div") || g.elem_type(value).is_none_or(crate::onnx::is_integer) {
            return None;
        }
        let c = g.scalar(node.input.get(1)?)?;
        if c.fract() != 0.0 || !(1.0..=f64::from(1 << 24)).contains(&c) {
            return None;
        }
        let p = self.elements(&node.input[0], depth + 1)?.into_iter().collect::<Option<Vec<Dim>>>()?;
        p.iter().all(Dim::is_size).then_some((p, c as i64))
    }

    /// `quotient` rounded up or down. Exact: a float holds these sizes
    /// exactly (`held_as`), and the rounded quotient of two integers
    /// below 2^24 is never the neighbouring integer, as the distance to it
    /// is at least 1/c, more than half a float's step there. For a size,
    /// truncating is rounding down.
    fn rounded(&self, value: &str, up: bool, depth: usize) -> Option<Vec<Option<Dim>>> {
        let (p, c) = self.quotient(value, depth)?;
        let up = if up { c - 1 } else { 0 };
        p.iter().map(|p| Some(floor_of(&p.add(&Dim::known(up))?, c, &self.memo.floors))).collect()
    }

    /// MatMul of matrices of rank 2 or more (1-D operands aside): the batch
    /// axes broadcast, then the rows of `a` and the columns of `b`.
    fn matmul(&self, value: &str, a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let batch = self.broadcast(value, &[a[..a.len() - 2].to_vec(), b[..b.len() - 2].to_vec()]);
        Some([batch, vec![a[a.len() - 2].clone(), b[b.len() - 1].clone()]].concat())
    }

    /// ONNX Runtime's `FusedMatMul`: `alpha · A · B` with the last two axes
    /// of A or B swapped where `transA` or `transB` is set (the batch
    /// transposes aside: unknown).
    fn fused_matmul(&self, node: &NodeProto, value: &str, mut a: Vec<Dim>, mut b: Vec<Dim>) -> Option<Vec<Dim>> {
        let set = |name: &str| node.attr_int(name).unwrap_or(0) != 0;
        if set("transBatchA") || set("transBatchB") || a.len() < 2 || b.len() < 2 {
            return None;
        }
        for (x, trans) in [(&mut a, set("transA")), (&mut b, set("transB"))] {
            if trans {
                let n = x.len();
                x.swap(n - 2, n - 1);
            }
        }
        self.matmul(value, &a, &b)
    }

    /// Numpy broadcasting of symbolic shapes: along each axis the dimensions
    /// other than 1 must agree, so a known one other than 1 is the result (a
    /// model that runs has the others equal to it or 1); `min(e, n)` beside
    /// e is e (it is e, or n < e, and then n must be 1); a dimension that
    /// cannot be told becomes an atom of the result.
    fn broadcast(&self, value: &str, shapes: &[Vec<Dim>]) -> Vec<Dim> {
        let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
        (0..rank).map(|i| self.broadcast_axis(&aligned(shapes, rank, i), &format!("{value}#{i}"))).collect()
    }

    /// One axis of a broadcast (`broadcast`): the dimensions that meet
    /// there give it, or it is the atom `unknown`.
    fn broadcast_axis(&self, dims: &[&Dim], unknown: &str) -> Dim {
        let mins = self.memo.mins.borrow();
        let beside_its_e = |d: &Dim| match d.single_atom() {
            Some((atom, 1)) => mins.get(atom).is_some_and(|(e, _)| dims.contains(&e)),
            _ => false,
        };
        let not_one: Vec<&Dim> = dims.iter().copied().filter(|d| d.value() != Some(1) && !beside_its_e(d)).collect();
        let mut known: Vec<i64> = not_one.iter().filter_map(|d| d.value()).collect();
        known.sort_unstable();
        known.dedup();
        // A broadcast met again by what it was made of: each of those is
        // it or 1 (a model that runs), so it is the result. (SEW-D: the
        // scores' length, an Add of two convolved lengths, beside the
        // mask's, one of them.)
        let broadcasts = self.memo.broadcasts.borrow();
        let made_of_the_rest = not_one.iter().find(|d| {
            let met = d.single_atom().filter(|(_, c)| *c == 1).and_then(|(atom, _)| broadcasts.get(atom));
            let resolved = |x: &Dim| self.resolve(x.clone());
            met.is_some_and(|met| not_one.iter().all(|x| x == *d || met.iter().any(|m| resolved(m) == resolved(x))))
        });
        match (not_one.split_first(), known.as_slice()) {
            (None, _) => Dim::known(1),
            (Some((first, rest)), _) if rest.iter().all(|d| d == first) => (*first).clone(),
            (_, [n]) => Dim::known(*n),
            _ if made_of_the_rest.is_some() => made_of_the_rest.map(|d| (*d).clone()).unwrap_or(Dim::known(1)),
            _ => {
                drop(broadcasts);
                let met = dims.iter().map(|&d| d.clone()).collect();
                self.memo.broadcasts.borrow_mut().insert(unknown.to_string(), met);
                Dim::atom(unknown.to_string())
            }
        }
    }
}

/// The name of the atom for `min(e, n)`.
fn min_name(e: &Dim, n: i64) -> String {
    format!("min({}, {n})", e.key())
}

/// Axis `i` of a broadcast to `rank` axes: each operand's dimension there
/// (trailing axes aligned), operands too short to reach it left out.
fn aligned(shapes: &[Vec<Dim>], rank: usize, i: usize) -> Vec<&Dim> {
    shapes.iter().filter_map(|s| (i + s.len()).checked_sub(rank).map(|j| &s[j])).collect()
}

/// The shape these shapes broadcast to (numpy's rule), where each axis is
/// proved: its dimensions other than 1 equal (none: 1).
pub fn proved_broadcast(shapes: &[Vec<Dim>]) -> Option<Vec<Dim>> {
    let rank = shapes.iter().map(Vec::len).max()?;
    (0..rank)
        .map(|i| {
            let mut not_one = aligned(shapes, rank, i).into_iter().filter(|d| d.value() != Some(1));
            let axis = not_one.next().cloned().unwrap_or(Dim::known(1));
            not_one.all(|d| *d == axis).then_some(axis)
        })
        .collect()
}

/// False where two operands of a broadcast meet on an axis with different
/// numbers other than 1: no run succeeds.
fn broadcastable(shapes: &[Vec<Dim>]) -> bool {
    let rank = shapes.iter().map(Vec::len).max().unwrap_or(0);
    (0..rank).all(|i| {
        let mut known = aligned(shapes, rank, i).into_iter().filter_map(Dim::value).filter(|&n| n != 1);
        let first = known.next();
        known.all(|n| Some(n) == first)
    })
}

/// The elements of a numpy broadcast of 1-D (or one-element) operands,
/// each computed by `f` from the operands' elements at its place.
fn elementwise(args: &[Vec<Option<Dim>>], f: impl Fn(&[Option<Dim>]) -> Option<Dim>) -> Option<Vec<Option<Dim>>> {
    let n = args.iter().map(Vec::len).max()?;
    if args.iter().any(|a| a.len() != n && a.len() != 1) {
        return None;
    }
    Some(
        (0..n)
            .map(|i| f(&args.iter().map(|a| a[if a.len() == 1 { 0 } else { i }].clone()).collect::<Vec<_>>()))
            .collect(),
    )
}

/// One element of `a op b` where it can be told: sums, differences and
/// products of polynomials, a quotient where it is exact (or, of numbers
/// in an integer type, truncated, as ONNX Runtime's division is); for
/// `Equal`, 1 or 0 where equal polynomials, or two different numbers, or a
/// dimension (never negative) and a negative number decide it.
fn arithmetic(op: &str, a: &Dim, b: &Dim, integer: bool) -> Option<Dim> {
    let (x, y) = (a.value(), b.value());
    match op {
        "Mul" => a.mul(b),
        "Div" => match (x, y) {
            (Some(x), Some(y)) if integer || x.checked_rem(y)? == 0 => x.checked_div(y).map(Dim::known),
            _ => a.div(b),
        },
        "Add" => a.add(b),
        "Sub" => a.sub(b),
        "Equal" => {
            let unequal = matches!((x, y), (Some(x), Some(y)) if x != y)
                || (a.is_dimension() && y.is_some_and(|y| y < 0))
                || (b.is_dimension() && x.is_some_and(|x| x < 0));
            if a == b {
                Some(Dim::known(1))
            } else if unequal {
                Some(Dim::known(0))
            } else {
                None
            }
        }
        _ => None,
    }
}

/// The indices `Slice(start, end, step)` selects from an axis of `len`,
/// by ONNX's rules: negative values count from the end, then starts and
/// ends are clamped (to [0, len] for a positive step, [-1, len-1] for a
/// negative one). A step of 0 is invalid and selects nothing here.
pub fn slice_indices(start: i64, end: i64, step: i64, len: i64) -> Vec<i64> {
    if step == 0 {
        return vec![];
    }
    let resolve = |v: i64| if v < 0 { v.saturating_add(len) } else { v };
    let (lo, hi) = if step > 0 { (0, len) } else { (-1, len - 1) };
    let (mut i, end) = (resolve(start).clamp(lo, hi), resolve(end).clamp(lo, hi));
    let mut out = Vec::new();
    while (step > 0 && i < end) || (step < 0 && i > end) {
        out.push(i);
        // Past the end of i64 is past the end of the axis.
        let Some(next) = i.checked_add(step) else { break };
        i = next;
    }
    out
}

/// A Conv's or pool's output spatial axis `i` (of `n`) from the input's
/// length and the kernel's (a number): `auto_pad` SAME_* gives
/// ceil(len / stride); otherwise floor((len + pads - reach) / stride) + 1,
/// reach = dilation·(k-1) + 1. A pool's `ceil_mode` rounds up instead,
/// floor((len + pads - reach + stride - 1) / stride) + 1, where the end's
/// pad plus the stride is at most the reach: then the last window starts
/// inside the input or its leading pad, and runtimes that drop a window
/// starting in the trailing pad (ONNX Runtime, torch) drop none. A length
/// that is no number gives a polynomial (stride 1) or `floor_of` one; a
/// Conv's run where it is not at least 1 fails, and a pool's floor holds
/// only where `least`, the least the input's length is, reaches its window
/// (below).
fn conv_length(
    node: &crate::onnx::NodeProto,
    i: usize,
    n: usize,
    (len, least): (&Dim, i64),
    kernel: i64,
    floors: &Floors,
) -> Option<Dim> {
    let at = |name: &str, default: i64| node.attr_ints(name).map_or(Some(default), |v| v.get(i).copied());
    let (stride, dilation) = (at("strides", 1)?, at("dilations", 1)?);
    if stride <= 0 || dilation <= 0 || kernel <= 0 || len.value().is_some_and(|l| l <= 0) {
        return None;
    }
    if let Some(k) = node.attr_ints("kernel_shape") {
        if k.get(i) != Some(&kernel) {
            return None;
        }
    }
    let auto_pad = node.attr("auto_pad").and_then(|a| a.s.as_deref()).unwrap_or(b"NOTSET");
    // Only the pools round up; a Conv ignores an attribute of that name.
    let ceil = !node.is("Conv") && node.attr_int("ceil_mode").unwrap_or(0) != 0;
    // floor((len + c) / stride) + plus
    let (c, plus) = match auto_pad {
        b"SAME_UPPER" | b"SAME_LOWER" if !ceil => (stride - 1, 0),
        b"NOTSET" | b"VALID" => {
            let (pads, tail) = match (auto_pad, node.attr_ints("pads")) {
                (b"VALID", _) | (_, None) => (0, 0),
                (_, Some(p)) if p.len() == 2 * n => (p[i].checked_add(p[i + n])?, p[i + n]),
                _ => return None,
            };
            let reach = ops::window_reach(dilation, kernel)?;
            let c = pads.checked_sub(reach)?;
            match ceil {
                // A pool's window longer than its padded input: ONNX
                // Runtime truncates the negative quotient and keeps one
                // window (kernel 2 over 1 element: 1, not 0), where a
                // Conv fails; the floor holds where the run proves the
                // input at least the window.
                false if !node.is("Conv") && least.saturating_add(c) < 0 => return None,
                false => (c, 1),
                true if ops::windows_start_inside(stride, reach, tail) => (c.checked_add(stride - 1)?, 1),
                true => return None,
            }
        }
        _ => return None,
    };
    let out = floor_of(&len.add(&Dim::known(c))?, stride, floors)?.add(&Dim::known(plus))?;
    (out.value().is_none_or(|o| o > 0)).then_some(out)
}

/// A shape element as a tensor of type `elem` holds it on every run (a
/// Cast to `elem`, arithmetic in it): a number within the type's exact
/// range (not below 0 for an unsigned type), or a symbolic one only where
/// the type holds every size (int64; uint64 for a size). A float holds a
/// size only up to 2^24 and int32 up to 2^31 − 1, and nothing bounds a
/// symbolic size: the Cast of `a·b` to float differs from it where
/// `a = b = 4097` (an empty tensor has such axes).
fn held_as(elem: i32, d: Dim) -> Option<Dim> {
    let bound = crate::onnx::exact_up_to(elem)?;
    let unsigned = matches!(elem, crate::onnx::UINT32 | crate::onnx::UINT64);
    let held = match d.value() {
        Some(n) => n.checked_abs().is_some_and(|m| m <= bound) && !(unsigned && n < 0),
        None => bound == i64::MAX && (!unsigned || d.is_size()),
    };
    held.then_some(d)
}

/// The type a Cast casts to (none where `to` is no type number).
fn cast_to(node: &NodeProto) -> Option<i32> {
    node.attr_int("to").and_then(|t| i32::try_from(t).ok())
}

/// The floors named so far, by name: what each is the floor of, and by what.
type Floors = RefCell<HashMap<String, (Dim, i64)>>;

/// `floor(p / s)` for s ≥ 1: computed for a number; for a polynomial, its
/// terms divisible by s divided, and the rest an atom `floor((rest)/s)`
/// with a constant in [0, s) (its multiples of s taken out), so that one
/// length written two ways (SEW's pooled and convolved sequences) is one
/// dimension.
fn floor_of(p: &Dim, s: i64, floors: &Floors) -> Option<Dim> {
    if s == 1 {
        return Some(p.clone());
    }
    if let Some(v) = p.value() {
        return Some(Dim::known(v.div_euclid(s)));
    }
    let (whole, rest) = p.split_divisible(s)?;
    let constant = rest.value_of_constant();
    let (q, r) = (constant.div_euclid(s), constant.rem_euclid(s));
    let atoms = rest.sub(&Dim::known(constant))?.add(&Dim::known(r))?;
    // An atom is a size: the floor of what cannot be negative. Its name
    // holds what it is the floor of, so a hostile chain of strided Convs
    // would grow names without bound: past a length, it is unknown.
    let floor = match atoms.value() {
        Some(_) => Dim::known(0),
        None if atoms.is_dimension() => {
            let inner = atoms.key();
            let name = (inner.len() <= MAX_NAME).then(|| format!("floor(({inner})/{s})"))?;
            floors.borrow_mut().entry(name.clone()).or_insert((atoms, s));
            Dim::atom(name)
        }
        // Of r − D, D a dimension: −ceil((D − r) / s), the floor of
        // D − r + s − 1 negated (torch's `(-len) % block`).
        None => {
            let d = atoms.neg()?;
            if !d.add(&Dim::known(r))?.is_dimension() {
                return None;
            }
            floor_of(&d.add(&Dim::known(s - 1))?, s, floors)?.neg()?
        }
    };
    whole.add(&floor)?.add(&Dim::known(q))
}

/// How many indices `slice_indices` selects, without listing them.
fn slice_count(start: i64, end: i64, step: i64, len: i64) -> i64 {
    if step == 0 {
        return 0;
    }
    let resolve = |v: i64| if v < 0 { v.saturating_add(len) } else { v };
    let (lo, hi) = if step > 0 { (0, len) } else { (-1, len - 1) };
    let (start, end) = (i128::from(resolve(start).clamp(lo, hi)), i128::from(resolve(end).clamp(lo, hi)));
    let (span, step) = if step > 0 { (end - start, i128::from(step)) } else { (start - end, -i128::from(step)) };
    if span <= 0 {
        0
    } else {
        ((span + step - 1) / step) as i64
    }
}

/// The length `Slice(start, end, step)` leaves of an axis of length `len`:
/// computed where `len` is a number; for a dimension, by 1 from a start of
/// at least 0 to the end (an end at or past i64::MAX / 2, as exporters
/// write "to the end") or to an end counted from it.
fn slice_length(len: &Dim, start: i64, end: i64, step: i64) -> Option<Dim> {
    if let Some(n) = len.value() {
        return Some(Dim::known(slice_count(start, end, step, n)));
    }
    // By 1 from s ≥ 0 to the end, or to e < 0 from it (`[..., :-1]`):
    // len - s or len + e - s, where that cannot be negative.
    let end = match end {
        _ if step != 1 || start < 0 => return None,
        e if e >= i64::MAX / 2 => len.clone(),
        e if e < 0 && e > i64::MIN / 2 => len.add(&Dim::known(e))?,
        _ => return None,
    };
    end.sub(&Dim::known(start)).filter(Dim::is_size)
}

fn normalize(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}
