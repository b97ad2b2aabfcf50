//! Every pass's output, byte for byte: every testdata export (and every
//! fuzz regression) fused by the first four passes, by every pass, both
//! targets, by every pass after `--opset 23`, and the default passes'
//! output after the cleanup (`docs/cleanup.md`), each output's hash held
//! against `testdata/golden/outputs.txt`. A change to the driver or the
//! toolkit that is not meant to change what a pass writes must keep every
//! line; one that is, rewrites the file (`ONNX_FUSE_BLESS=1`) and the diff
//! shows which outputs changed. An output is hashed as `io` encodes it
//! (a payload pack-matmul describes composed: `onnx::rows`).

mod common;

use common::*;
use onnx_fuse::graph::Target;
use onnx_fuse::{io, passes, rewrite, upgrade};

const FIRST_FOUR: &[&str] = &["layer-norm", "rms-norm", "attention", "complex-mul"];
const MANIFEST: &str = "golden/outputs.txt";

/// FNV-1a, 64 bits: stable across Rust versions, unlike `DefaultHasher`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn outputs() -> String {
    let mut names = exports();
    let mut fuzz: Vec<String> = std::fs::read_dir(testdata("fuzz"))
        .unwrap()
        .map(|e| format!("fuzz/{}", e.unwrap().file_name().into_string().unwrap()))
        .collect();
    fuzz.sort();
    names.extend(fuzz);
    let first_four: Vec<String> = FIRST_FOUR.iter().map(|s| s.to_string()).collect();
    let every: Vec<String> = passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipelines =
        [("", passes::pipeline(&first_four, &[]).unwrap()), ("every-pass ", passes::pipeline(&every, &[]).unwrap())];
    let mut lines = String::new();
    for name in names {
        let model = load(&name);
        let upgraded = upgrade::upgrade(&model, 23);
        for (prefix, pipeline) in &pipelines {
            for (target, label) in [(Target::Ort, "ort"), (Target::Portable, "portable")] {
                let mut fused = model.clone();
                let outcome = rewrite::run_for(&mut fused, pipeline, target);
                lines += &format!(
                    "{name} {prefix}{label} fused={} {:016x}\n",
                    outcome.fused.len(),
                    fnv(&io::encode_to_vec(&fused))
                );
            }
        }
        // What the cleanup after the passes makes of the default passes'
        // output (docs/cleanup.md).
        let mut cleaned = model.clone();
        rewrite::run_for(&mut cleaned, &passes::pipeline(&["default".to_string()], &[]).unwrap(), Target::Ort);
        let removed = onnx_fuse::cleanup::clean(&mut cleaned).removed;
        lines += &format!("{name} default ort cleaned removed={removed} {:016x}\n", fnv(&io::encode_to_vec(&cleaned)));
        let (_, every_pass) = &pipelines[1];
        for (target, label) in [(Target::Ort, "ort"), (Target::Portable, "portable")] {
            match &upgraded {
                Ok((model, upgrade)) => {
                    let mut fused = model.clone();
                    let outcome = rewrite::run_upgraded(&mut fused, every_pass, target, upgrade.added.clone());
                    let hash = fnv(&io::encode_to_vec(&fused));
                    lines += &format!("{name} every-pass opset-23 {label} fused={} {hash:016x}\n", outcome.fused.len());
                }
                Err(why) => {
                    lines += &format!(
                        "{name} every-pass opset-23 {label} refused {:016x}\n",
                        fnv(why.to_string().as_bytes())
                    )
                }
            }
        }
    }
    lines
}

#[test]
fn every_output_is_byte_identical_to_the_manifest() {
    let found = outputs();
    let path = testdata(MANIFEST);
    if std::env::var_os("ONNX_FUSE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &found).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).expect("testdata/golden/outputs.txt (ONNX_FUSE_BLESS=1 writes it)");
    let changed: Vec<String> = expected
        .lines()
        .zip(found.lines())
        .filter(|(e, f)| e != f)
        .map(|(e, f)| format!("expected {e}\n   found {f}"))
        .collect();
    assert!(
        changed.is_empty() && expected.lines().count() == found.lines().count(),
        "{} outputs changed ({} lines expected, {} found):\n{}",
        changed.len(),
        expected.lines().count(),
        found.lines().count(),
        changed.join("\n")
    );
}

/// The same input gives the same bytes on every run: nothing a pass or
/// the driver writes follows a hash map's order (a guard's captured
/// values once did, and two runs wrote two models). Decoders with a cache
/// at opset 23 write the most (guards, preludes, shared rotary tables),
/// each fused eight times in this process, whose maps each take their own
/// random keys.
#[test]
fn every_run_writes_the_same_bytes() {
    let every: Vec<String> = passes::ALL.iter().map(|p| p.name.to_string()).collect();
    let pipeline = passes::pipeline(&every, &[]).unwrap();
    let cached: Vec<String> = exports().into_iter().filter(|n| n.contains("past") || n.contains("merged")).collect();
    assert!(cached.len() >= 4, "{cached:?}");
    for name in cached {
        let (model, upgrade) = upgrade::upgrade(&load(&name), 23).unwrap();
        let hashes: std::collections::BTreeSet<u64> = (0..8)
            .map(|_| {
                let mut fused = model.clone();
                rewrite::run_upgraded(&mut fused, &pipeline, Target::Ort, upgrade.added.clone());
                fnv(&io::encode_to_vec(&fused))
            })
            .collect();
        assert_eq!(hashes.len(), 1, "{name}: {} different outputs in 8 runs", hashes.len());
    }
}
