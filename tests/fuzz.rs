//! The differential fuzzer: every accepted form of every pass, built at
//! random and mutated (tests/fuzz/forms.rs), is fused; wherever anything
//! fused, original and fused model run through ONNX Runtime on several
//! shapes (dims of 1 included) and seeds. A difference in values, shape or
//! type, or a fused model that fails where the original runs, is a false
//! fusion. `cargo test` runs a fixed budget; `scripts/fuzz.sh --minutes N`
//! a campaign. Failures are written to target/fuzz-failures/; each one
//! found becomes a model in testdata/fuzz/, checked by `regressions`.

mod common;
#[path = "fuzz/forms.rs"]
mod forms;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use forms::{Case, Expect, Rng};
use onnx_fuse::graph::Target;
use onnx_fuse::onnx::ModelProto;
use onnx_fuse::{passes, rewrite, verify};
use prost::Message;

/// Symbol values each fused case runs with, and the seeds of the first.
const SHAPES: &[&[(&str, i64)]] = &[
    &[("b", 2), ("s", 3), ("t", 5), ("d", 4)],
    &[("b", 1), ("s", 1), ("t", 1), ("d", 1)],
    &[("b", 1), ("s", 2), ("t", 1), ("d", 4)],
];
const SEEDS: &[u64] = &[0, 7];
/// Seeds of the first shapes whose float inputs also hold special values
/// (NaN, ±∞, the lowest and largest f32, -1e9: `verify::Options::specials`),
/// for the passes whose replacement is guarded at run time: a guard is
/// where an input beyond the finite can slip through.
const SPECIAL_SEEDS: &[u64] = &[1, 2, 3, 4];
const GUARDED: &[&str] = &["attention"];

#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// The original model does not run on any of the shapes: not a case.
    Invalid,
    NotFused,
    Fused,
    False(String),
}

/// Fuses `model` with `passes` for `target`, cleans it as the everyday
/// command does, and compares through ONNX Runtime. Which model fails decides: where verification cannot run, the
/// original is run alone; if it runs, the fused model is what failed.
fn differential(model: &ModelProto, passes: &[&str], target: Target) -> Verdict {
    let names: Vec<String> = passes.iter().map(|p| p.to_string()).collect();
    let pipeline = passes::pipeline(&names, &[]).expect("known passes");
    let mut fused = model.clone();
    let outcome = rewrite::run_for(&mut fused, &pipeline, target);
    // What the everyday command writes: the cleanup after the passes too.
    onnx_fuse::cleanup::clean(&mut fused);
    let specials = passes.iter().all(|p| GUARDED.contains(p));
    judge(model, (!outcome.fused.is_empty()).then_some(&fused), specials)
}

/// Upgrades `model` to opset `to` (`--opset`), fuses the upgraded model
/// with `passes` for `target`, and compares it with the original whether
/// or not anything fused: the upgrade is proved too. An upgrade refused is
/// an error (every generated op has an adapter).
fn upgraded_differential(model: &ModelProto, to: i64, passes: &[&str], target: Target) -> Result<Verdict, String> {
    let (mut up, _) = onnx_fuse::upgrade::upgrade(model, to).map_err(|e| format!("--opset {to} refused: {e}"))?;
    let names: Vec<String> = passes.iter().map(|p| p.to_string()).collect();
    let outcome = rewrite::run_for(&mut up, &passes::pipeline(&names, &[]).expect("known passes"), target);
    onnx_fuse::cleanup::clean(&mut up);
    Ok(match judge(model, Some(&up), false) {
        Verdict::Fused if outcome.fused.is_empty() => Verdict::NotFused,
        verdict => verdict,
    })
}

/// Whether a model holds a node whose outputs are random (a Dropout given
/// a training mode, the Random ops): two runs of it differ anyway.
fn random(model: &ModelProto) -> bool {
    common::all_nodes(model).iter().any(|n| {
        matches!(
            n.op_type(),
            "RandomNormal" | "RandomNormalLike" | "RandomUniform" | "RandomUniformLike" | "Bernoulli" | "Multinomial"
        ) || (n.op_type() == "Dropout" && n.input.get(2).is_some_and(|t| !t.is_empty()))
    })
}

/// A newer opset to upgrade a case to, chosen by its seed.
fn upgrade_target(model: &ModelProto, seed: u64) -> Option<i64> {
    let newer: Vec<i64> = [17, 18, 21, 23].into_iter().filter(|&v| v > model.default_opset()).collect();
    (!newer.is_empty()).then(|| newer[(seed / 3) as usize % newer.len()])
}

/// The verdict on `model` and what was fused of it (`None`: nothing).
fn judge(model: &ModelProto, fused: Option<&ModelProto>, specials: bool) -> Verdict {
    let dir = std::env::temp_dir();
    let dir = dir.as_path();
    let original_runs = |options: &verify::Options| verify::verify((model, dir), (model, dir), options).is_ok();
    let Some(fused) = fused else {
        // Still a case only if the original runs.
        let ran =
            SHAPES.iter().any(|dims| original_runs(&verify::Options { dims: to_map(dims), ..Default::default() }));
        return if ran { Verdict::NotFused } else { Verdict::Invalid };
    };
    let mut ran = false;
    let mut runs: Vec<(&[(&str, i64)], u64, bool)> = Vec::new();
    for (i, dims) in SHAPES.iter().enumerate() {
        runs.extend((if i == 0 { SEEDS } else { &SEEDS[..1] }).iter().map(|&seed| (*dims, seed, false)));
    }
    if specials {
        runs.extend(SPECIAL_SEEDS.iter().map(|&seed| (SHAPES[0], seed, true)));
    }
    for (dims, seed, specials) in runs {
        let options = verify::Options { dims: to_map(dims), seed, specials, ..Default::default() };
        let special = if specials { " with special values" } else { "" };
        match verify::verify((model, dir), (fused, dir), &options) {
            // Tiny models accumulate no rounding: the outputs must agree too.
            Ok(v) if v.passed && v.outputs.iter().all(|c| c.passed) => ran = true,
            Ok(v) => return Verdict::False(format!("dims {dims:?} seed {seed}{special}: {}", v.text())),
            Err(e) if original_runs(&options) => {
                return Verdict::False(format!("dims {dims:?}: the original runs, the fused model fails: {e:#}"));
            }
            // The original does not run on these shapes.
            Err(_) => {}
        }
    }
    if ran {
        Verdict::Fused
    } else {
        Verdict::Invalid
    }
}

/// Every pass at once, those on request included: the passes' interactions.
fn all_passes() -> Vec<&'static str> {
    passes::ALL.iter().map(|p| p.name).collect()
}

fn to_map(dims: &[(&str, i64)]) -> HashMap<String, i64> {
    dims.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

type Generator = fn(&mut Rng) -> Case;
const GENERATORS: &[(&str, Generator)] = &[
    ("rms-norm", forms::rms),
    ("layer-norm", forms::layer_norm),
    ("attention", forms::attention),
    ("complex-mul", forms::complex_mul),
    ("skip-norm", forms::skip_norm),
    ("gelu", forms::gelu),
    // The label before a colon is the pass.
    ("attention:decoder", forms::decoder_attention),
    ("rotary", forms::rotary),
    ("rotary:interleaved", forms::interleaved_rotary),
    ("rotary:apart", forms::rotary_apart),
    ("pack-matmul", forms::pack_matmul),
];

/// A new pass cannot be left out of the campaign: every pass has a form.
#[test]
fn every_pass_has_a_generator() {
    for pass in passes::ALL {
        assert!(
            GENERATORS.iter().any(|(label, _)| label.split(':').next() == Some(pass.name)),
            "{} has no generator",
            pass.name
        );
    }
}

#[derive(Default, Debug)]
struct Tally {
    generated: usize,
    invalid: usize,
    fused: usize,
    /// Of `fused`, cases for the portable target.
    fused_portable: usize,
    false_fusions: usize,
    refused_equivalents: usize,
    fused_unexpectedly: usize,
    /// Cases also run with every pass at once.
    all_passes: usize,
    /// Cases also run upgraded to a newer opset (`--opset`), and of them
    /// those where something fused after the upgrade.
    upgraded: usize,
    upgraded_fused: usize,
}

/// Runs cases `first..` of every generator until `budget` cases each or the
/// deadline; returns the tally per pass and the failures.
fn campaign(seed: u64, budget: usize, deadline: Option<Instant>) -> (BTreeMap<&'static str, Tally>, Vec<String>) {
    let mut tallies: BTreeMap<&'static str, Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut refused: BTreeMap<String, usize> = BTreeMap::new();
    let every_pass = all_passes();
    let all_passes = std::env::var_os("FUZZ_ALL_PASSES").is_some();
    let trace = std::env::var_os("FUZZ_TRACE").is_some();
    for i in 0..budget {
        if deadline.is_some_and(|d| Instant::now() > d) {
            break;
        }
        for &(label, generate) in GENERATORS {
            let case_seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
            let mut case = generate(&mut Rng::new(case_seed ^ hash(label)));
            let pass = label.split(':').next().unwrap_or(label);
            if trace {
                // A case that aborts the process (ONNX Runtime can) is the
                // last one written.
                eprintln!("case {pass} {case_seed}: {}", case.what.join("; "));
                let last = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-last-case.onnx");
                std::fs::write(last, prost::Message::encode_to_vec(&case.model)).unwrap();
            }
            // One case in four for the portable target: only what the opset defines.
            let target = if case_seed % 4 == 0 { Target::Portable } else { Target::Ort };
            if target == Target::Portable {
                let opset = case.model.default_opset();
                case.what.push("target portable".into());
                // The pass's own portable op, from the opset that defines it.
                let portable = passes::ALL.iter().find(|p| p.name == pass).and_then(|p| p.portable);
                let allowed = case.portable && portable.is_some_and(|p| opset >= p.since);
                if !allowed {
                    case.expect = Expect::NoFuse;
                }
            }
            let tally = tallies.entry(label).or_default();
            tally.generated += 1;
            // One case in three also upgraded to a newer opset before its
            // pass runs (the forms are written at old opsets: attribute
            // axes, old Softmax, Split with attributes): original against
            // upgraded and fused (with every pass under FUZZ_ALL_PASSES).
            // Only a false result counts, since an upgraded form may rightly
            // fuse where the old one could not.
            let upgrade = upgrade_target(&case.model, case_seed).filter(|_| case_seed % 3 == 1 && !random(&case.model));
            if let Some(to) = upgrade {
                tally.upgraded += 1;
                let passes: &[&str] = if all_passes { &every_pass } else { &[pass] };
                match upgraded_differential(&case.model, to, passes, target) {
                    Ok(Verdict::False(why)) => {
                        tally.false_fusions += 1;
                        failures.push(save_failure(pass, case_seed, &case, &format!("upgraded to {to}: {why}")));
                    }
                    Ok(verdict) => tally.upgraded_fused += usize::from(verdict == Verdict::Fused),
                    Err(why) => failures.push(save_failure(pass, case_seed, &case, &why)),
                }
            }
            // Every pass at once (FUZZ_ALL_PASSES=1: every case; else one in
            // five, besides its own pass): only a false fusion counts there,
            // since another pass may take what this one expects.
            if all_passes || case_seed % 5 == 2 {
                let verdict = differential(&case.model, &every_pass, target);
                tally.all_passes += 1;
                if let Verdict::False(why) = &verdict {
                    tally.false_fusions += 1;
                    failures.push(save_failure(pass, case_seed, &case, &format!("with every pass: {why}")));
                }
                if all_passes {
                    tally.invalid += usize::from(verdict == Verdict::Invalid);
                    tally.fused += usize::from(verdict == Verdict::Fused);
                    continue;
                }
            }
            let verdict = differential(&case.model, &[pass], target);
            let what = case.what.join("; ");
            match (&verdict, case.expect) {
                (Verdict::Invalid, _) => tally.invalid += 1,
                (Verdict::False(why), _) => {
                    tally.false_fusions += 1;
                    failures.push(save_failure(pass, case_seed, &case, &why));
                }
                (Verdict::Fused, Expect::NoFuse) => {
                    tally.fused += 1;
                    tally.fused_unexpectedly += 1;
                    failures.push(save_failure(pass, case_seed, &case, "fused a mutant that is not equivalent"));
                }
                (Verdict::Fused, _) => {
                    tally.fused += 1;
                    tally.fused_portable += usize::from(target == Target::Portable);
                }
                (Verdict::NotFused, Expect::Fuse) => {
                    tally.refused_equivalents += 1;
                    if std::env::var_os("FUZZ_SAVE_REFUSED").is_some() {
                        save_failure(pass, case_seed, &case, "refused");
                    }
                    *refused.entry(format!("{pass}: [{what}]")).or_default() += 1;
                }
                (Verdict::NotFused, _) => {}
            }
        }
    }
    if std::env::var_os("FUZZ_SHOW_REFUSED").is_some() {
        for (what, n) in &refused {
            eprintln!("refused equivalent ×{n}: {what}");
        }
    }
    (tallies, failures)
}

fn hash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Writes a failing case to target/fuzz-failures/ and says where.
fn save_failure(pass: &str, seed: u64, case: &Case, why: &str) -> String {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{pass}-{seed}.onnx"));
    let mut model = case.model.clone();
    model.doc_string = Some(format!("pass {pass}; {}", case.what.join("; ")));
    std::fs::write(&path, model.encode_to_vec()).unwrap();
    format!("{pass} case {seed} [{}] ({}): {why}", case.what.join("; "), path.display())
}

fn print(tallies: &BTreeMap<&'static str, Tally>, seconds: f64) {
    eprintln!(
        "pass          generated  invalid    fused (portable)  false  unexpected  refused-equivalent  all-passes  upgraded (fused)  ({seconds:.0} s)"
    );
    for (pass, t) in tallies {
        eprintln!(
            "{pass:<12} {:>10} {:>8} {:>8} {:>10} {:>6} {:>11} {:>19} {:>11} {:>9} {:>8}",
            t.generated,
            t.invalid,
            t.fused,
            t.fused_portable,
            t.false_fusions,
            t.fused_unexpectedly,
            t.refused_equivalents,
            t.all_passes,
            t.upgraded,
            t.upgraded_fused
        );
    }
}

#[test]
fn no_false_fusion_in_a_fixed_budget() {
    let started = Instant::now();
    let (tallies, failures) = campaign(1, 100, None);
    print(&tallies, started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    for (pass, t) in &tallies {
        assert!(t.fused > 0, "{pass}: the budget fused something");
        assert!(t.upgraded_fused > 0, "{pass}: the budget fused something after an upgrade");
    }
}

/// A campaign: FUZZ_SECONDS (default 60) from FUZZ_SEED (default: the time).
#[test]
#[ignore = "a long campaign: scripts/fuzz.sh"]
fn campaign_until_deadline() {
    let seconds: u64 = std::env::var("FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs());
    eprintln!("fuzz campaign: seed {seed}, {seconds} s");
    let started = Instant::now();
    let (tallies, failures) = campaign(seed, usize::MAX, Some(started + Duration::from_secs(seconds)));
    print(&tallies, started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Every false fusion the fuzzer ever found, kept as a model: none may fuse
/// falsely again, for either target, with its pass or with every pass. The
/// model's doc_string names the pass; `expect: fused` holds for `ort` (the
/// portable target may lack the op at the model's opset), `expect: not
/// fused` for both.
#[test]
fn regressions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/fuzz");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let model = ModelProto::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
        let pass = model.doc_string().strip_prefix("pass ").and_then(|s| s.split(';').next()).unwrap().to_string();
        let expect_fused = model.doc_string().contains("expect: fused");
        for target in [Target::Ort, Target::Portable] {
            let verdict = differential(&model, &[&pass], target);
            let at = format!("{} ({target:?})", path.display());
            assert!(!matches!(verdict, Verdict::False(_) | Verdict::Invalid), "{at}: {verdict:?}");
            if target == Target::Ort || !expect_fused {
                assert_eq!(verdict == Verdict::Fused, expect_fused, "{at}: {verdict:?}");
            }
            let verdict = differential(&model, &all_passes(), target);
            assert!(!matches!(verdict, Verdict::False(_)), "{at}, every pass: {verdict:?}");
        }
        checked += 1;
    }
    assert!(checked > 0, "testdata/fuzz holds the regression models");
}

/// Which model fails decides, not what a message says: an original that
/// fails in a node whose name says "rewritten model" is no false fusion,
/// and a fused model that fails where the original runs is one.
#[test]
fn the_model_that_fails_decides() {
    use common::build::{sym, tensor, Builder};
    use onnx_fuse::onnx::{FLOAT, INT64};
    let model = |shape: f64, name: &str| {
        let mut b = Builder::default();
        let x = b.input("x", FLOAT, Some(&[sym("b"), sym("s")]));
        let to = b.init("to", tensor(INT64, &[1], &[shape]));
        let y = b.node("Reshape", &[&x, &to], vec![]);
        let mut m = b.model(17);
        let g = m.graph.as_mut().unwrap();
        g.node[0].name = Some(name.into());
        g.output.push(onnx_fuse::onnx::ValueInfoProto { name: Some(y), ..Default::default() });
        m
    };
    // Reshape to 7 elements: no shape of SHAPES has them.
    let broken = model(7.0, "the rewritten model");
    assert_eq!(judge(&broken, Some(&broken), false), Verdict::Invalid);
    let (runs, fails) = (model(-1.0, "flatten"), model(7.0, "flatten"));
    assert!(matches!(judge(&runs, Some(&fails), false), Verdict::False(_)));
    assert_eq!(judge(&runs, Some(&runs), false), Verdict::Fused);
}
