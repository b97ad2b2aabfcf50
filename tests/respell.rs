//! A constant spelled another exact way is the same constant (spec, ground
//! rule 4). Every small constant (at most 64 elements: eps, scales, axes,
//! shapes, fills, small weights) of every testdata export's main graph is
//! written again each of three ways that compute the same values bit for
//! bit:
//! - read through a `Cast` from a wider type (a float as a double, an f16 or
//!   bf16 as a float, an int64 that fits as an int32);
//! - as a `Constant` node (an initializer) or an initializer (a `Constant`);
//! - through an `Identity`;
//! - as `CastLike(c, c)` (onnxscript's literals; from opset 15, so a model
//!   below it is respelled after `--opset 23`);
//! - as `Reshape(Constant node, shape)`, the node holding its values in one
//!   axis (torch's unoptimized exports reshape small constants).
//!
//! Each respelled model runs through every pass on the ONNX Runtime target,
//! as exported and after `--opset 23`; none may panic, and no pass may fuse
//! fewer than it fuses in the export as written.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::{AttributeProto, ModelProto, NodeProto, TensorProto};
use onnx_fuse::{passes, rewrite, upgrade};

#[derive(Debug, Clone, Copy)]
enum Spelling {
    WiderCast,
    ConstantNode,
    Identity,
    CastLikeItself,
    ReshapedConstantNode,
}

impl Spelling {
    /// The opset the spelling's ops need (CastLike is defined from 15).
    fn since(self) -> i64 {
        match self {
            Spelling::CastLikeItself => 15,
            _ => 1,
        }
    }
}

const SMALL: u64 = 64;
const FLOAT: i32 = 1;
const INT32: i32 = 6;
const INT64: i32 = 7;
const FLOAT16: i32 = 10;
const DOUBLE: i32 = 11;
const BFLOAT16: i32 = 16;

/// `t` as a wider type and the type it is cast back to, where the values
/// round-trip exactly.
fn wider(t: &TensorProto) -> Option<TensorProto> {
    let values = t.values()?;
    let raw: Vec<u8> = match t.data_type() {
        FLOAT => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        FLOAT16 | BFLOAT16 => values.iter().flat_map(|&v| (v as f32).to_le_bytes()).collect(),
        INT64 if values.iter().all(|&v| v.abs() <= f64::from(i32::MAX)) => {
            values.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
        }
        _ => return None,
    };
    let elem = match t.data_type() {
        FLOAT => DOUBLE,
        INT64 => INT32,
        _ => FLOAT,
    };
    Some(TensorProto { data_type: Some(elem), dims: t.dims.clone(), raw_data: Some(raw.into()), ..Default::default() })
}

/// `t`'s values in one axis, held by a `Constant` node writing `source`,
/// and the shape that gives them back their dims (an int64 initializer);
/// None for a tensor with an axis of 0 (a Reshape reads a 0 as "keep").
fn flattened(t: &TensorProto, source: &str, name: &str) -> Option<(NodeProto, TensorProto)> {
    if t.dims.contains(&0) {
        return None;
    }
    let flat = TensorProto { name: None, dims: vec![t.numel()? as i64], ..t.clone() };
    let constant = node("Constant", &[], source, vec![AttributeProto::tensor("value", flat)]);
    let shape = TensorProto {
        name: Some(format!("{name}__shape")),
        data_type: Some(INT64),
        dims: vec![t.dims.len() as i64],
        int64_data: t.dims.clone(),
        ..Default::default()
    };
    Some((constant, shape))
}

fn node(op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("respelled_{output}")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    }
}

/// The model with every small constant of its main graph respelled; None
/// where there is none to respell.
fn respelled(model: &ModelProto, spelling: Spelling) -> Option<ModelProto> {
    let mut model = model.clone();
    let g = model.graph.as_mut().unwrap();
    let inputs: Vec<String> = g.input.iter().map(|i| i.name().to_string()).collect();
    let mut front = Vec::new();
    let mut kept = Vec::new();
    for t in std::mem::take(&mut g.initializer) {
        let small = !t.is_external() && t.numel().is_some_and(|n| n <= SMALL) && !inputs.contains(&t.name().into());
        if !small {
            kept.push(t);
            continue;
        }
        let name = t.name().to_string();
        let source = format!("{name}__respelled");
        match spelling {
            Spelling::WiderCast => match wider(&t) {
                Some(w) => {
                    kept.push(TensorProto { name: Some(source.clone()), ..w });
                    front.push(node("Cast", &[&source], &name, vec![AttributeProto::int("to", t.data_type().into())]));
                }
                None => kept.push(t),
            },
            Spelling::ConstantNode => front.push(node(
                "Constant",
                &[],
                &name,
                vec![AttributeProto::tensor("value", TensorProto { name: None, ..t })],
            )),
            Spelling::Identity => {
                kept.push(TensorProto { name: Some(source.clone()), ..t });
                front.push(node("Identity", &[&source], &name, vec![]));
            }
            Spelling::CastLikeItself => {
                kept.push(TensorProto { name: Some(source.clone()), ..t });
                front.push(node("CastLike", &[&source, &source], &name, vec![]));
            }
            Spelling::ReshapedConstantNode => match flattened(&t, &source, &name) {
                Some((constant, shape)) => {
                    front.push(constant);
                    front.push(node("Reshape", &[&source, shape.name()], &name, vec![]));
                    kept.push(shape);
                }
                None => kept.push(t),
            },
        }
    }
    g.initializer = kept;
    // Constant nodes: as initializers, or read through the new spelling.
    for n in std::mem::take(&mut g.node) {
        let value = n.attribute.first().filter(|a| a.name() == "value").and_then(|a| a.t.as_ref());
        let t = value
            .filter(|t| n.op_type() == "Constant" && n.attribute.len() == 1 && t.numel().is_some_and(|k| k <= SMALL));
        let (Some(t), Some(name)) = (t.cloned(), n.output.first().cloned()) else {
            g.node.push(n);
            continue;
        };
        let source = format!("{name}__respelled");
        match spelling {
            Spelling::WiderCast => match wider(&t) {
                Some(w) => {
                    g.node.push(node("Constant", &[], &source, vec![AttributeProto::tensor("value", w)]));
                    g.node.push(node("Cast", &[&source], &name, vec![AttributeProto::int("to", t.data_type().into())]));
                }
                None => g.node.push(n),
            },
            Spelling::ConstantNode => g.initializer.push(TensorProto { name: Some(name), ..t }),
            Spelling::Identity => {
                g.node.push(NodeProto { output: vec![source.clone()], ..n });
                g.node.push(node("Identity", &[&source], &name, vec![]));
            }
            Spelling::CastLikeItself => {
                g.node.push(NodeProto { output: vec![source.clone()], ..n });
                g.node.push(node("CastLike", &[&source, &source], &name, vec![]));
            }
            Spelling::ReshapedConstantNode => match flattened(&t, &source, &name) {
                Some((constant, shape)) => {
                    g.node.push(constant);
                    g.node.push(node("Reshape", &[&source, shape.name()], &name, vec![]));
                    g.initializer.push(shape);
                }
                None => g.node.push(n),
            },
        }
    }
    let changed = !front.is_empty() || g.node.iter().any(|n| n.name().starts_with("respelled_"));
    front.append(&mut g.node);
    g.node = front;
    changed.then_some(model)
}

const AT_23: &str = " at opset 23";

/// Fused nodes per pass, as exported and after `--opset 23` (only after
/// it where `upgraded` says the model is already the upgrade's output,
/// with the nodes the upgrade added).
fn counts(
    model: &ModelProto,
    pipeline: &[&rewrite::Pass],
    upgraded: Option<&HashSet<String>>,
) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    let mut count = |outcome: rewrite::Outcome, suffix: &str| {
        for f in outcome.fused {
            *counts.entry(format!("{}{suffix}", f.pass)).or_insert(0) += 1;
        }
    };
    if let Some(added) = upgraded {
        count(rewrite::run_upgraded(&mut model.clone(), pipeline, Target::Ort, added.clone()), AT_23);
        return counts;
    }
    count(rewrite::run_for(&mut model.clone(), pipeline, Target::Ort), "");
    if let Ok((mut upgraded, up)) = upgrade::upgrade(model, 23) {
        count(rewrite::run_upgraded(&mut upgraded, pipeline, Target::Ort, up.added), AT_23);
    }
    counts
}

/// Every respelling of `name` that panics or fuses less, and how many ran.
/// A spelling whose ops the export's opset lacks respells it after
/// `--opset 23`, and is compared there.
fn respell_export(name: &str, pipeline: &[&rewrite::Pass]) -> (Vec<String>, usize) {
    let model = load(name);
    let before = counts(&model, pipeline, None);
    let upgraded = upgrade::upgrade(&model, 23).ok();
    let (mut failures, mut runs) = (Vec::new(), 0);
    for spelling in [
        Spelling::WiderCast,
        Spelling::ConstantNode,
        Spelling::Identity,
        Spelling::CastLikeItself,
        Spelling::ReshapedConstantNode,
    ] {
        let (source, added) = match &upgraded {
            _ if model.default_opset() >= spelling.since() => (&model, None),
            Some((upgraded, up)) => (upgraded, Some(&up.added)),
            None => continue,
        };
        let Some(respelled) = respelled(source, spelling) else { continue };
        runs += 1;
        let Ok(after) = catch_unwind(AssertUnwindSafe(|| counts(&respelled, pipeline, added))) else {
            failures.push(format!("{name} {spelling:?}: panicked"));
            continue;
        };
        for (pass, &n) in before.iter().filter(|(pass, _)| added.is_none() || pass.ends_with(AT_23)) {
            let m = after.get(pass).copied().unwrap_or(0);
            if m < n {
                failures.push(format!("{name} {spelling:?}: {pass} fused {m}, {n} as exported"));
            }
        }
    }
    (failures, runs)
}

#[test]
fn a_constant_respelled_fuses_as_the_constant() {
    let every: Vec<String> = passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipeline = passes::pipeline(&every, &[]).unwrap();
    let names = exports();
    let done = in_parallel(&names, |name| respell_export(name, &pipeline));
    let runs: usize = done.iter().map(|(_, r)| r).sum();
    let failures: Vec<String> = done.into_iter().flat_map(|(f, _)| f).collect();
    assert!(runs > 350, "only {runs} respelled models");
    assert!(failures.is_empty(), "{} of {runs} respelled models:\n{}", failures.len(), failures.join("\n"));
}
