//! Helpers the integration tests share: test models, running the passes
//! and the binary, and proving equivalence through ONNX Runtime.
#![allow(dead_code)]

pub mod build;
#[allow(unused_imports)]
pub use build::set_dims;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use onnx_fuse::io::{self, LoadOptions};
use onnx_fuse::onnx::{ModelProto, NodeProto, FUSED_KEY};
use onnx_fuse::rewrite::{self, Outcome};
use onnx_fuse::verify::{self, Verification};
use onnx_fuse::{onnx, passes};

pub fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

/// Every `.onnx` in testdata and its folders.
pub fn exports() -> Vec<String> {
    let mut names = vec![];
    for entry in std::fs::read_dir(testdata("")).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().into_string().unwrap();
        if name.ends_with(".onnx") {
            names.push(name);
        } else if entry.path().is_dir() && name != "fuzz" {
            for inner in std::fs::read_dir(entry.path()).unwrap() {
                let inner = inner.unwrap().file_name().into_string().unwrap();
                if inner.ends_with(".onnx") {
                    names.push(format!("{name}/{inner}"));
                }
            }
        }
    }
    names.sort();
    names
}

/// `each` on every name, on as many threads as the machine has cores; the
/// results in no particular order.
pub fn in_parallel<T: Send>(names: &[String], each: impl Fn(&str) -> T + Sync) -> Vec<T> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(name) = names.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                        done.push(each(name));
                    }
                    done
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    })
}

pub fn load(name: &str) -> ModelProto {
    io::load(&testdata(name), LoadOptions::default()).unwrap_or_else(|e| panic!("{e:#}")).model
}

/// Runs the named passes (`default` allowed) on a model in memory.
pub fn fuse_model(model: &ModelProto, names: &[&str]) -> (ModelProto, Outcome) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let pipeline = passes::pipeline(&names, &[]).expect("known passes");
    let mut fused = model.clone();
    let outcome = rewrite::run(&mut fused, &pipeline);
    (fused, outcome)
}

/// The default pipeline and skip-norm (on request since onnx-fuse 19;
/// most tests were written with it in the default pipeline).
pub fn fuse(name: &str) -> (ModelProto, ModelProto, Outcome) {
    fuse_with(name, &["default", "skip-norm"])
}

/// `fuse` with the named passes.
pub fn fuse_with(name: &str, passes: &[&str]) -> (ModelProto, ModelProto, Outcome) {
    let original = load(name);
    let (fused, outcome) = fuse_model(&original, passes);
    (original, fused, outcome)
}

/// Every node of the main graph and of every subgraph body.
pub fn all_nodes(model: &ModelProto) -> Vec<&NodeProto> {
    fn walk<'a>(g: &'a onnx::GraphProto, out: &mut Vec<&'a NodeProto>) {
        for n in &g.node {
            out.push(n);
            for body in n.subgraphs() {
                walk(body, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(model.graph.as_ref().unwrap(), &mut out);
    out
}

pub fn count_op(model: &ModelProto, op: &str) -> usize {
    all_nodes(model).iter().filter(|n| n.op_type() == op).count()
}

pub fn node<'a>(model: &'a ModelProto, name: &str) -> Option<&'a NodeProto> {
    all_nodes(model).into_iter().find(|n| n.name() == name)
}

pub fn fused_list(node: &NodeProto) -> Vec<&str> {
    node.metadata(FUSED_KEY).expect("a transmuter.fused entry").split(", ").collect()
}

/// Asserts a node's `transmuter.fused` value: `entries` are `OpType name`
/// with the name relative to `scope`.
pub fn assert_provenance(node: &NodeProto, scope: &str, entries: &[&str]) {
    let expected: Vec<String> = entries.iter().map(|e| e.replacen(' ', &format!(" {scope}"), 1)).collect();
    assert_eq!(node.metadata(FUSED_KEY), Some(expected.join(", ").as_str()), "{}", node.name());
}

/// Proves `fused` computes what `original` does, through ONNX Runtime.
pub fn assert_equivalent(original: &ModelProto, fused: &ModelProto, name: &str) -> Verification {
    let dir = io::parent(&testdata(name));
    let v = verify::verify((original, &dir), (fused, &dir), &verify::Options::default())
        .unwrap_or_else(|e| panic!("{name}: verification could not run: {e:#}"));
    assert!(v.passed, "{name}: the fused model differs:\n{}", v.text());
    v
}

/// An `.npz` of f32 and i64 arrays, for `--inputs`.
pub fn npz(path: &std::path::Path, f32s: &[(&str, Vec<u64>, Vec<f32>)], i64s: &[(&str, Vec<u64>, Vec<i64>)]) {
    use npyz::WriterBuilder;
    let mut w = npyz::npz::NpzWriter::create(path).unwrap();
    for (name, shape, data) in f32s {
        let mut a = w.array(name, Default::default()).unwrap().default_dtype().shape(shape).begin_nd().unwrap();
        a.extend(data.iter().copied()).unwrap();
        a.finish().unwrap();
    }
    for (name, shape, data) in i64s {
        let mut a = w.array(name, Default::default()).unwrap().default_dtype().shape(shape).begin_nd().unwrap();
        a.extend(data.iter().copied()).unwrap();
        a.finish().unwrap();
    }
}

/// Runs both models on the arrays of `inputs` and compares them.
pub fn compare(
    original: &ModelProto,
    other: &ModelProto,
    inputs: &std::path::Path,
) -> anyhow::Result<verify::Verification> {
    let options = verify::Options { inputs: Some(inputs.to_path_buf()), ..Default::default() };
    let dir = std::path::Path::new(".");
    verify::verify((original, dir), (other, dir), &options)
}

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onnx-fuse"))
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("the binary runs")
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs the binary on a testdata model with `args`, the output and a JSON
/// report going to a temporary directory; asserts success and returns the
/// run and the report.
pub fn run_with_report(model: &str, args: &[&str]) -> (Output, serde_json::Value) {
    let dir = tempdir();
    let (input, out, json) = (testdata(model), dir.path().join("out.onnx"), dir.path().join("report.json"));
    let files = [input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", json.to_str().unwrap()];
    let r = run(&[args, &files[..]].concat());
    assert!(r.status.success(), "{model}: {}", stderr(&r));
    let report = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    (r, report)
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}
