//! pack-matmul: the MatMuls that read one x by constant weights, as one
//! MatMul of the weights side by side (a decoder layer's q, k and v
//! projections; its gate and up):
//!
//! ```text
//! y_i = MatMul(x, W_i)                          W_i: [K, N_i], constants
//!   ->  y = MatMul(x, W)                        W: [K, N_1 + … + N_n], row r of each W_i in turn
//!       y_1, …, y_n = Split(y, [N_1, …, N_n], axis = -1)
//! ```
//!
//! Column j of a product reads x and column j of its weight, nothing else,
//! so each y_i is the function it was. W is written into the model where
//! the weights' bytes are in it (`Match::side_by_side`); where they are not
//! (external data), W is their `Concat`, a constant (ground rule 4) that
//! ONNX Runtime folds where it loads the model. ONNX Runtime computes a
//! decode step's three projections as one faster than as three
//! (docs/benchmarks.md, "Projections side by side").

use crate::graph::{Check, Graph, Portable};
use crate::onnx::{type_text, AttributeProto, NodeProto, TensorProto};
use crate::pattern::{self, Weight};
use crate::rewrite::{ints_constant, node, writing, Match, Pass, Rewrite};
use crate::{candidate, require};

pub const PASS: Pass = Pass {
    name: "pack-matmul",
    summary: "MatMul(x, W1), MatMul(x, W2), …  ->  Split(MatMul(x, W)), W the weights side by side",
    default: false,
    caution: None,
    absorbs: None,
    portable: Some(PORTABLE),
    kernel_opset: None,
    rule,
};

/// Split with its sizes as an input and a negative axis.
const PORTABLE: Portable = Portable { op: "Split", since: 13 };

/// A MatMul's constant weight of two axes and at least one column (of a
/// MatMul that writes its product).
fn weight<'g>(g: &'g Graph, n: &NodeProto) -> Option<&'g TensorProto> {
    if n.output.first().is_none_or(String::is_empty) {
        return None;
    }
    g.constant(n.input.get(1)?).filter(|w| matches!(w.dims[..], [_, cols] if cols > 0))
}

fn rule(g: &Graph, index: usize) -> Check<Rewrite> {
    let anchor = pattern::anchor(g, index, "MatMul")?;
    candidate!(anchor.input.len() == 2);
    let x = anchor.input[0].as_str();
    // Every MatMul of x by a constant 2-D weight, in the graph's order; the
    // first is the anchor, which the others join.
    let mut group: Vec<(usize, &TensorProto)> = g
        .consumers(x)
        .iter()
        .filter_map(|&c| {
            let n = g.node(c);
            // A malformed MatMul is hidden from rules (`Graph::malformed`).
            let read = n.is("MatMul") && g.malformed(c).is_none() && n.input.len() == 2 && n.input[0] == x;
            Some((c, weight(g, n).filter(|_| read)?))
        })
        .collect();
    group.sort_by_key(|&(n, _)| g.position(n));
    group.dedup_by_key(|&mut (n, _)| n);
    candidate!(group.len() >= 2 && group[0].0 == index);
    let (k, elem) = (group[0].1.dims[0], group[0].1.data_type());
    let mut m = Match::new(index);
    let mut sizes = vec![];
    for &(n, w) in &group {
        let (rows, t) = (w.dims[0], w.data_type());
        require!(
            rows == k && t == elem,
            "{} weighs x by {rows} rows of {}, the anchor by {k} of {}",
            g.node(n).name(),
            type_text(Some(t)),
            type_text(Some(elem))
        );
        sizes.push(w.dims[1]);
    }
    let tensors: Vec<&TensorProto> = group.iter().map(|&(_, w)| w).collect();
    g.require_portable(PORTABLE)?;
    let out = &anchor.output[0];
    let (product, split) = (format!("{out}/packed"), format!("{out}/sizes"));
    // The weights side by side, written into the model; where their bytes
    // are elsewhere (external data), their Concat, which the runtime folds.
    let mut prelude = vec![];
    let packed = m.side_by_side(g, &tensors, "packed_weight").unwrap_or_else(|| {
        let (packed, mut weights) = (format!("{out}/packed_weight"), vec![]);
        for (i, &(n, t)) in group.iter().enumerate() {
            // A weight a node computes (a `Constant`, an `Identity`) may
            // come after the anchor in the node list: the Concat reads its
            // tensor, and the node goes with its MatMul where nothing else
            // reads it.
            let w = &g.node(n).input[1];
            weights.push(match g.producer(w) {
                Some(_) => m.weight_input(g, Weight::Made(Box::new(t.clone())), &format!("weight_{i}")),
                None => w.clone(),
            });
        }
        let weights: Vec<&str> = weights.iter().map(String::as_str).collect();
        prelude.push(writing(&packed, node("Concat", &weights, vec![AttributeProto::int("axis", 1)])));
        packed
    });
    prelude.push(writing(&product, node("MatMul", &[x, &packed], vec![])));
    prelude.push(ints_constant(&split, &sizes));
    let parts = node("Split", &[&product, &split], vec![AttributeProto::int("axis", -1)]);
    let mut rewrite = m.replace_with(parts).after(prelude);
    for (slot, &(n, _)) in group.iter().enumerate().skip(1) {
        rewrite = rewrite.taking_over(slot, &g.node(n).output[0]);
    }
    Ok(rewrite)
}
