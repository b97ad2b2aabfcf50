//! What ONNX Runtime loads, onnx-fuse accepts (spec, ground rules 8 and
//! 10): node lists in any order, domains used without an import, and
//! bodies that reuse the names of their node's outputs.

mod common;

use std::collections::BTreeMap;

use common::build::*;
use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::{AttributeProto, GraphProto, ModelProto, OperatorSetIdProto, BOOL, FLOAT, FUSED_KEY};
use onnx_fuse::{passes, rewrite};

/// How a test reorders node lists.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// Every list reversed: each reader comes before what it reads, the
    /// order that contradicts a sorted list most (a rule that compares
    /// places in the list where it means dependency order fails on it).
    Reversed,
    /// Scrambled by a small LCG: the same seed, the same order.
    Seed(u64),
}

/// Reorders the node list of every graph and body.
fn shuffle(g: &mut GraphProto, order: Order, seed: &mut u64) {
    for node in &mut g.node {
        for body in node.subgraphs_mut() {
            shuffle(body, order, seed);
        }
    }
    if let Order::Reversed = order {
        g.node.reverse();
        return;
    }
    for i in (1..g.node.len()).rev() {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        g.node.swap(i, (*seed >> 33) as usize % (i + 1));
    }
}

fn reordered(model: &ModelProto, order: Order) -> ModelProto {
    let mut model = model.clone();
    let seed = match order {
        Order::Reversed => 0,
        Order::Seed(seed) => seed,
    };
    shuffle(model.graph.as_mut().unwrap(), order, &mut { seed });
    model
}

fn shuffled(model: &ModelProto, seed: u64) -> ModelProto {
    reordered(model, Order::Seed(seed))
}

/// Fused counts per pass, for a target (the default pipeline and complex-mul).
fn counts(model: &ModelProto, target: Target) -> (ModelProto, BTreeMap<&'static str, usize>) {
    let pipeline = passes::pipeline(&["default".into(), "complex-mul".into()], &[]).unwrap();
    let mut fused = model.clone();
    let outcome = rewrite::run_for(&mut fused, &pipeline, target);
    let mut by_pass = BTreeMap::new();
    for f in &outcome.fused {
        *by_pass.entry(f.pass).or_insert(0) += 1;
    }
    (fused, by_pass)
}

/// Fused counts of every pass as a run for `target` gets them: for `ort`
/// at the kernels' opset, as the everyday command tries a model below it
/// (`run::KERNEL_OPSET`; a model the upgrade refuses at its own), for
/// `portable` at the model's own. The output must load (no cycle).
fn counts_as_run(model: &ModelProto, target: Target) -> Result<BTreeMap<&'static str, usize>, String> {
    let every: Vec<String> = passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipeline = passes::pipeline(&every, &[]).unwrap();
    let upgraded = (target == Target::Ort && model.default_opset() < onnx_fuse::run::KERNEL_OPSET)
        .then(|| onnx_fuse::upgrade::upgrade(model, onnx_fuse::run::KERNEL_OPSET).ok())
        .flatten();
    let (mut fused, added) = match upgraded {
        Some((model, upgrade)) => (model, upgrade.added),
        None => (model.clone(), Default::default()),
    };
    let outcome = rewrite::run_upgraded(&mut fused, &pipeline, target, added);
    onnx_fuse::validate::model(&fused).map_err(|e| format!("the output does not load: {e}"))?;
    let mut by_pass = BTreeMap::new();
    for f in &outcome.fused {
        *by_pass.entry(f.pass).or_insert(0) += 1;
    }
    Ok(by_pass)
}

/// Spec, ground rule 10: fused counts never depend on the node list's
/// order. Every export, every pass, both targets (`ort` at the kernels'
/// opset, where ONNX `Attention`'s prelude computes shapes anew), each
/// list reversed and scrambled twice.
#[test]
fn shuffled_node_lists_are_accepted_and_fuse_as_the_sorted_ones() {
    let results = in_parallel(&exports(), |name| {
        let model = load(name);
        let (mut compared, mut failed) = (0, vec![]);
        for target in [Target::Ort, Target::Portable] {
            let sorted = counts_as_run(&model, target).unwrap_or_else(|e| panic!("{name} ({target:?}): {e}"));
            for order in [Order::Reversed, Order::Seed(1), Order::Seed(2)] {
                let scrambled = reordered(&model, order);
                let what = format!("{name} ({target:?}) in order {order:?}");
                onnx_fuse::validate::model(&scrambled).unwrap_or_else(|e| panic!("{what}: {e}"));
                match counts_as_run(&scrambled, target) {
                    Ok(found) if found == sorted => compared += sorted.values().sum::<usize>(),
                    Ok(found) => failed.push(format!("{what}: {found:?}, sorted {sorted:?}")),
                    Err(e) => failed.push(format!("{what}: {e}")),
                }
            }
        }
        (compared, failed)
    });
    let failed: Vec<&str> = results.iter().flat_map(|(_, f)| f).map(String::as_str).collect();
    assert!(failed.is_empty(), "{} runs differ from the sorted ones:\n{}", failed.len(), failed.join("\n"));
    let compared: usize = results.iter().map(|(c, _)| c).sum();
    assert!(compared > 1000, "only {compared} fusions compared");
}

#[test]
fn a_shuffled_export_fused_runs_as_the_original_and_keeps_its_order() {
    for name in ["llama_ts_op14.onnx", "gpt2_ts_op14.onnx", "whisper_encoder_ts_op14.onnx"] {
        let scrambled = shuffled(&load(name), 7);
        let (fused, found) = counts(&scrambled, Target::Ort);
        assert!(found.values().sum::<usize>() >= 2, "{name}: {found:?}");
        assert_equivalent(&scrambled, &fused, name);
        // The nodes no replacement touched keep their order in the list.
        let before = &scrambled.graph.as_ref().unwrap().node;
        let kept: Vec<_> =
            fused.graph.as_ref().unwrap().node.iter().filter(|n| n.metadata(FUSED_KEY).is_none()).collect();
        let mut at = before.iter();
        for n in &kept {
            assert!(at.any(|b| b == *n), "{name}: {} moved", n.name());
        }
    }
}

/// `x / sqrt(mean(x², -1) + eps) * w` with the axes as an input (opset ≥ 18).
fn rms_norm_axes_input(b: &mut Builder, x: &str, out: &str) {
    let two = b.init(&format!("{out}_two"), tensor(FLOAT, &[], &[2.0]));
    let axes = b.init(&format!("{out}_axes"), tensor(onnx_fuse::onnx::INT64, &[1], &[-1.0]));
    let sq = b.node("Pow", &[x, &two], vec![]);
    let m = b.node("ReduceMean", &[&sq, &axes], vec![]);
    let eps = b.init(&format!("{out}_eps"), tensor(FLOAT, &[], &[1e-6]));
    let a = b.node("Add", &[&m, &eps], vec![]);
    let r = b.node("Sqrt", &[&a], vec![]);
    let n = b.node("Div", &[x, &r], vec![]);
    let w = b.init(&format!("{out}_w"), tensor(FLOAT, &[4], &[0.5, 1.0, 1.5, 2.0]));
    b.node_to("Mul", &[&n, &w], &[out], vec![]);
}

#[test]
fn a_default_domain_used_without_an_import_is_read_at_the_opset_onnx_runtime_resolves() {
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3), D::N(4)]));
    rms_norm_axes_input(&mut b, "x", "y");
    b.output("y", FLOAT, None);
    let mut model = b.model(18);
    model.opset_import = vec![OperatorSetIdProto { domain: Some("com.microsoft".into()), version: Some(1) }];
    onnx_fuse::validate::model(&model).unwrap();
    let (fused, found) = counts(&model, Target::Ort);
    assert_eq!(found.get("rms-norm"), Some(&1));
    assert_equivalent(&model, &fused, "acceptance");

    // Softmax's default axis depends on the opset the model does not name.
    for (axis, fuses) in [(None, false), (Some(-1), true)] {
        let mut b = Builder::default();
        for v in ["q", "k", "v"] {
            b.input(v, FLOAT, Some(&[D::N(2), D::N(3), D::N(3)]));
        }
        let s = b.node("MatMul", &["q", "k"], vec![]);
        let p = b.node("Softmax", &[&s], axis.map(|a| attr_int("axis", a)).into_iter().collect());
        b.node_to("MatMul", &[&p, "v"], &["out"], vec![]);
        b.output("out", FLOAT, None);
        let mut model = b.model(18);
        model.opset_import = vec![OperatorSetIdProto { domain: Some("com.microsoft".into()), version: Some(1) }];
        let (fused, outcome) = fuse_model(&model, &["attention"]);
        assert_eq!(outcome.fused.len(), usize::from(fuses), "axis {axis:?}: {:?}", outcome.declined);
        if fuses {
            assert_equivalent(&model, &fused, "acceptance");
        } else {
            let reason = &outcome.declined[0].reason;
            assert!(reason.contains("does not import the default domain"), "{reason}");
        }
    }
}

/// An `If` whose branches each compute an RMSNorm into the `If`'s own
/// output names, as Optimum's merged decoders write them.
fn merged_decoder_like(norm_out: &str) -> ModelProto {
    let branch = |scale: &str| {
        let mut body = Builder::default();
        let xs = body.node("Mul", &["x", scale], vec![]);
        rms_norm_axes_input(&mut body, &xs, norm_out);
        if norm_out != "present" {
            body.node_to("Identity", &[norm_out], &["present"], vec![]);
        }
        body.output("present", FLOAT, None);
        GraphProto { name: Some(format!("branch_{scale}")), ..body.graph }
    };
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(3), D::N(4)]));
    b.input("c", BOOL, Some(&[]));
    b.init("s", tensor(FLOAT, &[], &[3.0]));
    b.init("t", tensor(FLOAT, &[], &[-2.0]));
    b.node_to(
        "If",
        &["c"],
        &["present"],
        vec![attr_graph("then_branch", branch("s")), attr_graph("else_branch", branch("t"))],
    );
    b.node_to("Neg", &["present"], &["y"], vec![]);
    b.output("y", FLOAT, None);
    b.model(18)
}

#[test]
fn branches_may_reuse_the_names_of_their_node_outputs() {
    // The branch value `present` is the If's own output name: not visible
    // inside the branches (and each branch is a scope of its own), so no
    // shadowing, whether the norm writes it or an Identity after it.
    for norm_out in ["present", "normed"] {
        let model = merged_decoder_like(norm_out);
        onnx_fuse::validate::model(&model).unwrap();
        let (fused, outcome) = fuse_model(&model, &["rms-norm"]);
        assert_eq!(outcome.fused.len(), 2, "{norm_out}: {:?}", outcome.declined);
        assert_equivalent(&model, &fused, "acceptance");
    }
}

#[test]
fn a_body_that_redefines_a_visible_outer_name_is_not_fused() {
    // The branches define `y`, which the graph computes outside the If and
    // the branches could read: true shadowing.
    let mut model = merged_decoder_like("y2");
    let g = model.graph.as_mut().unwrap();
    for node in g.node.iter_mut() {
        for body in node.subgraphs_mut() {
            for n in body.node.iter_mut() {
                for o in n.output.iter_mut().chain(n.input.iter_mut()) {
                    if o == "y2" {
                        *o = "shadowed".into();
                    }
                }
            }
        }
    }
    g.node.insert(
        0,
        onnx_fuse::onnx::NodeProto {
            op_type: Some("Identity".into()),
            input: vec!["x".into()],
            output: vec!["shadowed".into()],
            ..Default::default()
        },
    );
    g.output.push(value_info("shadowed", FLOAT, None));
    let (_, outcome) = fuse_model(&model, &["rms-norm"]);
    assert_eq!(outcome.fused.len(), 0);
    let shadowed = outcome.declined.iter().filter(|d| d.reason.contains("shadowed is defined in two scopes"));
    assert_eq!(shadowed.count(), 2, "{:?}", outcome.declined);
}

#[test]
fn a_run_on_its_own_output_changes_nothing_whatever_the_first_run_removed() {
    // The outer RMSNorm's Sqrt output is named again inside the branch
    // (true shadowing, spec ground rules 4 and 8): no match may touch the
    // name, in the branch or outside it, so the outer norm is declined
    // too; the other outer norm is fused, and a second run finds nothing.
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
    b.input("c", BOOL, Some(&[]));
    let y = rms_norm(&mut b, "x", FLOAT, &[1.0, 2.0, 3.0, 4.0]);
    let outer_sqrt = b.graph.node.iter().find(|n| n.op_type() == "Sqrt").unwrap().output[0].clone();
    let mut body = Builder::default();
    let neg = body.node("Neg", &["x"], vec![]);
    let z = rms_norm(&mut body, &neg, FLOAT, &[1.0, 0.5, 0.25, 2.0]);
    let inner_sqrt = body.graph.node.iter().find(|n| n.op_type() == "Sqrt").unwrap().output[0].clone();
    assert_ne!(inner_sqrt, outer_sqrt);
    for n in body.graph.node.iter_mut() {
        for v in n.input.iter_mut().chain(n.output.iter_mut()) {
            if *v == inner_sqrt {
                *v = outer_sqrt.clone();
            }
        }
    }
    body.output(&z, FLOAT, None);
    let body = GraphProto { name: Some("branch".into()), ..body.graph };
    b.node_to("If", &["c"], &["r"], vec![attr_graph("then_branch", body.clone()), attr_graph("else_branch", body)]);
    let other = b.node("Neg", &["x"], vec![]);
    let unshadowed = rms_norm(&mut b, &other, FLOAT, &[2.0, 2.0, 3.0, 4.0]);
    b.output(&y, FLOAT, None);
    b.output(&unshadowed, FLOAT, None);
    b.output("r", FLOAT, None);
    let model = b.model(14);
    let (once, outcome) = fuse_model(&model, &["default"]);
    assert_eq!(outcome.fused.len(), 1, "{:?}", outcome.declined);
    let shadowed = format!("{outer_sqrt} is defined in two scopes");
    assert_eq!(outcome.declined.iter().filter(|d| d.reason.contains(&shadowed)).count(), 3, "{:?}", outcome.declined);
    let (twice, outcome) = fuse_model(&once, &["default"]);
    assert!(outcome.fused.is_empty(), "a second run fused {:?}", outcome.fused);
    assert_eq!(once, twice);
}

#[test]
fn a_body_initializer_named_like_an_outer_value_is_shadowing() {
    // Spec, ground rule 4: the branch's own initializer is named like the
    // outer norm's Sqrt output, which the branch could read. Which value
    // the branch's Add reads is what runtimes disagree on, so the outer
    // norm, whose fusion would remove the outer value, is declined; an
    // initializer named like a value the branch cannot see (the If's own
    // output) shadows nothing.
    for (named_like_sqrt, fused) in [(true, 0), (false, 1)] {
        let mut b = Builder::default();
        b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
        b.input("c", BOOL, Some(&[]));
        let y = rms_norm(&mut b, "x", FLOAT, &[1.0, 2.0, 3.0, 4.0]);
        let sqrt = b.graph.node.iter().find(|n| n.op_type() == "Sqrt").unwrap().output[0].clone();
        let name = if named_like_sqrt { sqrt.clone() } else { "r".to_string() };
        let mut body = Builder::default();
        let own = body.init(&name, tensor(FLOAT, &[2, 1], &[0.5, 0.25]));
        let z = body.node("Add", &["x", &own], vec![]);
        body.output(&z, FLOAT, None);
        let body = GraphProto { name: Some("branch".into()), ..body.graph };
        b.node_to("If", &["c"], &["r"], vec![attr_graph("then_branch", body.clone()), attr_graph("else_branch", body)]);
        b.output(&y, FLOAT, None);
        b.output("r", FLOAT, None);
        let model = b.model(14);
        onnx_fuse::validate::model(&model).unwrap();
        let (_, outcome) = fuse_model(&model, &["rms-norm"]);
        assert_eq!(outcome.fused.len(), fused, "{name}: {:?}", outcome.declined);
        if named_like_sqrt {
            let why = format!("{sqrt} is defined in two scopes");
            assert!(outcome.declined.iter().any(|d| d.reason.contains(&why)), "{:?}", outcome.declined);
        }
    }
}

/// Ground rule 10: a value that several `Constant` nodes define (or an
/// initializer and a `Constant`, or two initializers) loads in ONNX Runtime,
/// which warns and takes the last; onnx-fuse accepts the model, and no
/// match reads the value: it is no constant, shape or type to a rule
/// (which definition a runtime takes is not proved), and the driver
/// declines any match that touches it. Any other value defined twice is
/// still refused (tests/safety.rs).
#[test]
fn a_value_several_constants_define_is_accepted_and_not_read_by_a_match() {
    let eps = || AttributeProto::tensor("value", tensor(FLOAT, &[], &[1e-6]));
    let norm = |twice: &str| {
        let mut b = Builder::default();
        b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
        let two = b.init("two", tensor(FLOAT, &[], &[2.0]));
        let axes = b.init("axes", tensor(onnx_fuse::onnx::INT64, &[1], &[-1.0]));
        let sq = b.node("Pow", &["x", &two], vec![]);
        let m = b.node("ReduceMean", &[&sq, &axes], vec![]);
        match twice {
            "constants" => {
                b.node_to("Constant", &[], &["eps"], vec![eps()]);
                b.node_to("Constant", &[], &["eps"], vec![eps()]);
            }
            "initializer and constant" => {
                b.init("eps", tensor(FLOAT, &[], &[1e-6]));
                b.node_to("Constant", &[], &["eps"], vec![eps()]);
            }
            "initializers" => {
                b.init("eps", tensor(FLOAT, &[], &[1e-6]));
                b.init("eps", tensor(FLOAT, &[], &[1e-6]));
            }
            _ => b.node_to("Constant", &[], &["eps"], vec![eps()]),
        }
        let a = b.node("Add", &[&m, "eps"], vec![]);
        let r = b.node("Sqrt", &[&a], vec![]);
        let n = b.node("Div", &["x", &r], vec![]);
        let w = b.init("w", tensor(FLOAT, &[4], &[0.5, 1.0, 1.5, 2.0]));
        b.node_to("Mul", &[&n, &w], &["y"], vec![]);
        b.output("y", FLOAT, None);
        b.model(18)
    };
    let (_, once) = fuse_model(&norm("once"), &["default"]);
    assert_eq!(once.fused.len(), 1, "{:?}", once.declined);
    for twice in ["constants", "initializer and constant", "initializers"] {
        let model = norm(twice);
        assert_eq!(onnx_fuse::validate::model(&model), Ok(()), "{twice}: ONNX Runtime loads it");
        let (fused, outcome) = fuse_model(&model, &["default"]);
        assert!(outcome.fused.is_empty(), "{twice}: a match read the value defined twice");
        // The value is no constant to a rule: which definition a runtime
        // takes is not proved.
        let reasons: Vec<&str> = outcome.declined.iter().map(|d| d.reason.as_str()).collect();
        assert!(
            reasons.len() == 1
                && reasons[0].starts_with("no operand of Add ")
                && reasons[0].ends_with(" is a constant eps"),
            "{twice}: {reasons:?}"
        );
        assert_eq!(fused, model, "{twice}: written as it was");
        // ONNX Runtime runs it (warning of the second definition).
        assert_equivalent(&model, &fused, twice);
    }
}
