//! Safe with the user's files and robust on any input: clashes of paths,
//! special files, symlinks out of the model's folder, interrupted writes,
//! permissions, deep nesting, invalid graphs, misused verify options.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;

use common::build::{attr_graph, attr_int, tensor, value_info, Builder, D};
use common::*;
use onnx_fuse::onnx::{ModelProto, FLOAT, INT64};
use prost::Message;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A copy of the external-data Llama in `dir`; returns the model's path.
fn external_model(dir: &Path) -> std::path::PathBuf {
    for f in ["model.onnx", "model.weights"] {
        fs::copy(testdata("external").join(f), dir.join(f)).unwrap();
    }
    dir.join("model.onnx")
}

fn usage_error(r: &std::process::Output, words: &[&str]) {
    let e = stderr(r);
    assert_eq!(r.status.code(), Some(2), "{e}");
    assert!(e.starts_with("onnx-fuse: usage error: ") && e.lines().count() == 1, "{e}");
    for w in words {
        assert!(e.contains(w), "{w:?} in {e}");
    }
}

#[test]
fn the_output_may_not_be_a_file_the_run_reads() {
    let dir = tempdir();
    let input = external_model(dir.path());
    let weights = dir.path().join("model.weights");
    let before = fs::read(&weights).unwrap();
    // The input's own external data as -o.
    let r = run(&[s(&input), "-o", s(&weights)]);
    usage_error(&r, &["model.weights (-o)", "external data of the input", "are the same file"]);
    // A symlink to it, too.
    let link = dir.path().join("alias.onnx");
    std::os::unix::fs::symlink(&weights, &link).unwrap();
    usage_error(&run(&[s(&input), "-o", s(&link)]), &["are the same file"]);
    assert!(fs::read(&weights).unwrap() == before, "the weights are untouched");
}

#[test]
fn another_models_data_in_the_output_folder_is_not_replaced() {
    let dir = tempdir();
    let input = external_model(dir.path());
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let theirs = out_dir.join("model.weights");
    fs::write(&theirs, b"another model's weights").unwrap();
    let r = run(&[s(&input), "-o", s(&out_dir.join("fused.onnx"))]);
    usage_error(&r, &["model.weights exists and is not the external data of an earlier output"]);
    assert_eq!(fs::read(&theirs).unwrap(), b"another model's weights");
    // An earlier output's own data may be replaced: runs can repeat.
    fs::remove_file(&theirs).unwrap();
    for _ in 0..2 {
        let r = run(&["-q", s(&input), "-o", s(&out_dir.join("fused.onnx"))]);
        assert!(r.status.success(), "{}", stderr(&r));
    }
}

#[test]
fn reports_may_not_name_the_models() {
    let dir = tempdir();
    let input = dir.path().join("model.onnx");
    fs::copy(testdata("llama_ts_op14.onnx"), &input).unwrap();
    let before = fs::read(&input).unwrap();
    let out = dir.path().join("out.onnx");
    usage_error(&run(&[s(&input), "-o", s(&out), "--report-json", s(&input)]), &["(--report-json)", "(the input)"]);
    usage_error(&run(&[s(&input), "-o", s(&out), "--report-json", s(&out)]), &["(--report-json)", "(-o)"]);
    usage_error(&run(&["verify", s(&input), s(&input), "--report-json", s(&input)]), &["(--report-json)"]);
    assert!(fs::read(&input).unwrap() == before && !out.exists());
}

#[test]
fn special_files_are_never_replaced() {
    let dir = tempdir();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let model = testdata("llama_ts_op14.onnx");
    usage_error(&run(&[s(&model), "-o", s(&fifo)]), &["fifo (-o) exists and is not a regular file"]);
    assert!(fs::metadata(&fifo).unwrap().file_type().is_fifo());
    usage_error(&run(&[s(&model), "-o", "/dev/null"]), &["/dev/null (-o) exists and is not a regular file"]);
    assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    usage_error(&run(&[s(&model), "-o", s(&dir.path().join("o.onnx")), "--report-json", "/dev/null"]), &["/dev/null"]);
    // A folder without models, or a FIFO, as the input: one line.
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    usage_error(&run(&[s(&empty), "-o", s(&dir.path().join("o"))]), &["the folder holds no .onnx file"]);
    let r = run(&[s(&fifo), "-o", s(&dir.path().join("o.onnx"))]);
    assert!(r.status.code() == Some(1) && stderr(&r).contains("is not a regular file"), "{}", stderr(&r));
}

#[test]
fn external_data_may_not_lead_outside_the_models_folder() {
    let dir = tempdir();
    let inside = dir.path().join("model");
    fs::create_dir(&inside).unwrap();
    let input = external_model(&inside);
    let secret = dir.path().join("secret.weights");
    fs::rename(inside.join("model.weights"), &secret).unwrap();
    std::os::unix::fs::symlink(&secret, inside.join("model.weights")).unwrap();
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let r = run(&[s(&input), "-o", s(&out_dir.join("o.onnx"))]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("leads outside the model's directory"), "{}", stderr(&r));
    assert_eq!(fs::read_dir(&out_dir).unwrap().count(), 0, "nothing copied");
}

/// Runs the tool paused before it commits its output, sends `signal`, and
/// returns its exit status and what is left in the output's folder.
fn interrupted(signal: i32) -> (Option<i32>, Vec<String>) {
    let dir = tempdir();
    let input = external_model(dir.path());
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let mut child = bin()
        .args([s(&input), "-o", s(&out_dir.join("o.onnx"))])
        .env("ONNX_FUSE_TEST_PAUSE_MS", "20000")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&seen).contains("paused before committing") {
        use std::io::Read;
        assert_eq!(err.read(&mut byte).unwrap(), 1, "the tool reached its pause");
        seen.push(byte[0]);
    }
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, signal) };
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    let code = status.code().or(status.signal().map(|s| 128 + s));
    let left = fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    (code, left)
}

#[test]
fn an_interrupted_write_leaves_nothing_behind() {
    for (signal, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143), (libc::SIGKILL, 137)] {
        let (status, left) = interrupted(signal);
        assert_eq!(status, Some(code), "signal {signal}");
        assert!(left.is_empty(), "signal {signal} left {left:?}");
    }
}

#[test]
fn new_files_get_the_umasks_permissions() {
    let dir = tempdir();
    let out = dir.path().join("o.onnx");
    let json = dir.path().join("r.json");
    let mut cmd = bin();
    cmd.args(["-q", s(&testdata("llama_ts_op14.onnx")), "-o", s(&out), "--report-json", s(&json)]);
    // SAFETY: umask is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0o027);
            Ok(())
        });
    }
    assert!(cmd.status().unwrap().success());
    for f in [&out, &json] {
        assert_eq!(fs::metadata(f).unwrap().permissions().mode() & 0o777, 0o640, "{}", f.display());
    }
}

/// A model whose If bodies nest `depth` deep, encoded directly (building it
/// as nested structs would overflow the stack of whoever encodes it).
fn nested_ifs(depth: usize) -> Vec<u8> {
    fn field(number: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        let mut key = (number << 3 | 2) as u64;
        let mut len = payload.len() as u64;
        for v in [&mut key, &mut len] {
            loop {
                let byte = (*v & 0x7f) as u8;
                *v >>= 7;
                out.push(if *v == 0 { byte } else { byte | 0x80 });
                if *v == 0 {
                    break;
                }
            }
        }
        out.extend_from_slice(payload);
        out
    }
    let mut graph = Vec::new();
    for _ in 0..depth {
        let attribute = [field(1, b"then_branch"), vec![0xa0, 0x01, 5], field(6, &graph)].concat();
        let node = [field(4, b"If"), field(5, &attribute)].concat();
        graph = field(1, &node);
    }
    let header = ModelProto { ir_version: Some(8), ..Default::default() }.encode_to_vec();
    [header, field(7, &graph)].concat()
}

#[test]
fn very_deep_nesting_is_one_line_not_a_crash() {
    let dir = tempdir();
    let input = dir.path().join("deep.onnx");
    fs::write(&input, nested_ifs(9000)).unwrap();
    let r = run(&[s(&input), "-o", s(&dir.path().join("o.onnx"))]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("deep.onnx") && stderr(&r).contains("nest more than 100 deep"), "{}", stderr(&r));
    assert_eq!(stderr(&r).lines().count(), 1);
}

#[test]
fn structurally_invalid_models_are_refused() {
    let relu = |b: &mut Builder, input: &str, output: &str| b.node_to("Relu", &[input], &[output], vec![]);
    let mut cases: Vec<(&str, ModelProto, &str)> = vec![];
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    relu(&mut b, "nowhere", "y");
    b.output("y", FLOAT, None);
    cases.push(("undefined", b.model(17), "reads \"nowhere\", which nothing defines"));
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    relu(&mut b, "x", "y");
    relu(&mut b, "x", "y");
    b.output("y", FLOAT, None);
    cases.push(("duplicate", b.model(17), "defines \"y\", which is already defined"));
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    relu(&mut b, "z", "y");
    relu(&mut b, "y", "z");
    b.output("z", FLOAT, None);
    cases.push(("cycle", b.model(17), "depends on its own output (the nodes form a cycle)"));
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    relu(&mut b, "x", "y");
    b.output("y", FLOAT, None);
    let mut no_import = b.model(17);
    no_import.opset_import.clear();
    cases.push(("no-import", no_import, "the model imports no operator set"));
    let mut b = Builder::default();
    b.input("x", FLOAT, Some(&[D::N(2)]));
    b.graph.node.push(onnx_fuse::onnx::NodeProto {
        op_type: Some("Relu".into()),
        domain: Some("my.domain".into()),
        input: vec!["x".into()],
        output: vec!["y".into()],
        ..Default::default()
    });
    b.output("y", FLOAT, None);
    cases.push(("unknown-domain", b.model(17), "is of my.domain, which is not imported"));
    // A body reading the output of the node that holds it.
    let mut body = Builder::default();
    body.node_to("Identity", &["r"], &["out"], vec![]);
    body.output("out", FLOAT, None);
    let mut b = Builder::default();
    b.input("c", onnx_fuse::onnx::BOOL, Some(&[]));
    b.init("w", tensor(FLOAT, &[1], &[1.0]));
    b.node_to(
        "If",
        &["c"],
        &["r"],
        vec![attr_graph("then_branch", body.graph.clone()), attr_graph("else_branch", body.graph)],
    );
    b.graph.output.push(value_info("r", FLOAT, None));
    cases.push(("self-capture", b.model(17), "depends on its own output (the nodes form a cycle)"));
    let dir = tempdir();
    for (name, model, why) in cases {
        let input = dir.path().join(format!("{name}.onnx"));
        fs::write(&input, model.encode_to_vec()).unwrap();
        let out = dir.path().join("o.onnx");
        let r = run(&[s(&input), "-o", s(&out)]);
        let e = stderr(&r);
        assert_eq!(r.status.code(), Some(1), "{name}: {e}");
        assert!(e.contains(&format!("{name}.onnx: invalid model: ")) && e.contains(why), "{name}: {e}");
        assert!(!out.exists(), "{name}");
    }
    // A model truncated exactly at a field boundary decodes, and is refused.
    let good = fs::read(testdata("llama_ts_op14.onnx")).unwrap();
    let model = ModelProto::decode(good.as_slice()).unwrap();
    let mut graph = model.graph.clone().unwrap();
    graph.node.truncate(graph.node.len() / 2);
    let truncated = ModelProto { graph: Some(graph), ..model };
    let input = dir.path().join("truncated.onnx");
    fs::write(&input, truncated.encode_to_vec()).unwrap();
    let r = run(&[s(&input), "-o", s(&dir.path().join("o.onnx"))]);
    assert!(r.status.code() == Some(1) && stderr(&r).contains("invalid model"), "{}", stderr(&r));
}

#[test]
fn bytes_that_are_no_model_do_not_suggest_a_flag() {
    let dir = tempdir();
    // Valid protobuf with fields a ModelProto lacks: not a model.
    let mut bytes = vec![];
    for n in [100u8, 101, 102] {
        bytes.extend([n << 3 | 0, 1]);
    }
    let input = dir.path().join("other.pb");
    fs::write(&input, &bytes).unwrap();
    let r = run(&[s(&input), "-o", s(&dir.path().join("o.onnx"))]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("not an ONNX model") && !stderr(&r).contains("--allow-unknown-fields"),
        "{}",
        stderr(&r)
    );
}

#[test]
fn misused_verify_options_are_usage_errors() {
    let dir = tempdir();
    let model = testdata("llama_ts_op14.onnx");
    let out = dir.path().join("o.onnx");
    let base = [s(&model), "-o", s(&out), "--verify"];
    usage_error(&run(&[&base[..], &["--dim", "nosuch=3"]].concat()), &["--dim nosuch", "(it has: batch, seq)"]);
    for bad in ["NaN", "-1", "inf"] {
        let r = run(&[&base[..], &["--rtol", bad]].concat());
        assert_eq!(r.status.code(), Some(2), "--rtol {bad}: {}", stderr(&r));
        let r = run(&[&base[..], &["--atol", bad]].concat());
        assert_eq!(r.status.code(), Some(2), "--atol {bad}");
    }
    // An .npz with an array no input is named like, and a Fortran-ordered one.
    let npz = |name: &str, fortran: bool| -> std::path::PathBuf {
        let path = dir.path().join(format!("{name}-{fortran}.npz"));
        npz_of_ones(&path, &[(name, &[1, 2])], fortran);
        path
    };
    let r = run(&[&base[..], &["--inputs", s(&npz("nosuch", false))]].concat());
    usage_error(&r, &["array \"nosuch\" is named like no input", "input_ids"]);
    let r = run(&[&base[..], &["--inputs", s(&npz("input_ids", true))]].concat());
    usage_error(&r, &["Fortran order"]);
    assert!(!out.exists());
}

/// The smallest zip writer (stored entries) for test .npz files.
struct ZipWriter {
    path: std::path::PathBuf,
    data: Vec<u8>,
    central: Vec<u8>,
    count: u16,
}

/// An .npz of int64 arrays of ones (stored in Fortran order, if so).
fn npz_of_ones(path: &Path, arrays: &[(&str, &[usize])], fortran: bool) {
    let mut zip = zip_writer(path);
    for (name, shape) in arrays {
        let dims: Vec<String> = shape.iter().map(|d| format!("{d}, ")).collect();
        let order = if fortran { "True" } else { "False" };
        let header = format!("{{'descr': '<i8', 'fortran_order': {order}, 'shape': ({}), }}", dims.concat());
        let pad = 64 - (10 + header.len() + 1) % 64;
        let mut npy = Vec::new();
        npy.extend(b"\x93NUMPY\x01\x00");
        npy.extend(((header.len() + pad + 1) as u16).to_le_bytes());
        npy.extend(header.as_bytes());
        npy.extend(std::iter::repeat(b' ').take(pad));
        npy.push(b'\n');
        for _ in 0..shape.iter().product::<usize>() {
            npy.extend(1i64.to_le_bytes());
        }
        zip.add(&format!("{name}.npy"), &npy);
    }
    zip.finish();
}

#[test]
fn the_dim_hint_appears_only_where_made_up_sizes_were_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.onnx");
    let go = |model: &str, extra: &[&str]| {
        let model = testdata(model);
        let r = run(&[&[s(&model), "-o", s(&out), "-q", "--verify"], extra].concat());
        assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
        stderr(&r)
    };
    // Shapes taken from --inputs: the user's arrays, not onnx-fuse's sizes.
    let npz = dir.path().join("seq5.npz");
    npz_of_ones(&npz, &[("input_ids", &[2, 5]), ("attention_mask", &[2, 5])], false);
    let said = go("llama_ts_op14.onnx", &["--inputs", s(&npz)]);
    assert!(said.contains("cannot be reshaped") && !said.contains("--dim"), "{said}");
    // An array of the wrong type: nothing about sizes.
    let said = go("llama_ts_op14.onnx", &["--inputs", s(&testdata("llama_inputs_int32.npz"))]);
    assert!(said.contains("does not match the input's type") && !said.contains("--dim"), "{said}");
    // The user's own size: said so, and no advice to give sizes.
    let said = go("gpt2_ts_op14.onnx", &["--dim", "batch=0"]);
    assert!(
        said.ends_with("the model does not run with the sizes given (--dim batch=0), and runs without them\n"),
        "{said}"
    );
    assert!(!said.contains("NAME=VALUE"), "{said}");
}

fn zip_writer(path: &Path) -> ZipWriter {
    ZipWriter { path: path.to_path_buf(), data: vec![], central: vec![], count: 0 }
}

impl ZipWriter {
    fn add(&mut self, name: &str, content: &[u8]) {
        let crc = crc32(content);
        let offset = self.data.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend(0u16.to_le_bytes()); // flags
            v.extend(0u16.to_le_bytes()); // stored
            v.extend(0u32.to_le_bytes()); // time, date
            v.extend(crc.to_le_bytes());
            v.extend((content.len() as u32).to_le_bytes());
            v.extend((content.len() as u32).to_le_bytes());
            v.extend((name.len() as u16).to_le_bytes());
            v.extend(0u16.to_le_bytes());
        };
        self.data.extend(0x0403_4b50u32.to_le_bytes());
        self.data.extend(20u16.to_le_bytes());
        common(&mut self.data);
        self.data.extend(name.as_bytes());
        self.data.extend(content);
        self.central.extend(0x0201_4b50u32.to_le_bytes());
        self.central.extend(20u16.to_le_bytes());
        self.central.extend(20u16.to_le_bytes());
        common(&mut self.central);
        self.central.extend([0u8; 6]); // comment length, disk, internal attributes
        self.central.extend(0u32.to_le_bytes()); // external attrs
        self.central.extend(offset.to_le_bytes());
        self.central.extend(name.as_bytes());
        self.count += 1;
    }

    fn finish(self) {
        let mut out = self.data.clone();
        let start = out.len() as u32;
        out.extend(&self.central);
        out.extend(0x0605_4b50u32.to_le_bytes());
        out.extend([0u8; 4]);
        out.extend(self.count.to_le_bytes());
        out.extend(self.count.to_le_bytes());
        out.extend((self.central.len() as u32).to_le_bytes());
        out.extend(start.to_le_bytes());
        out.extend(0u16.to_le_bytes());
        fs::write(&self.path, out).unwrap();
    }
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// What ONNX Runtime refuses on load is refused with its first violation,
/// never rewritten (measured on 1.31.1): an IR version it does not read,
/// an opset below 1, an undefined element type, a repeated attribute,
/// and, in a tensor something reads, a negative dimension or a payload of
/// another length than its shape says, external data included. An
/// initializer nothing reads ONNX Runtime drops before it looks at its
/// data, and loads the model: so does onnx-fuse.
#[test]
fn models_onnx_runtime_refuses_on_load_are_refused() {
    // y = x · w (w an initializer of 4 floats), then Softmax.
    let base = || {
        let mut b = Builder::default();
        b.input("x", FLOAT, Some(&[D::N(2), D::N(4)]));
        b.init("w", tensor(FLOAT, &[4], &[1.0, 2.0, 3.0, 4.0]));
        b.node_to("Mul", &["x", "w"], &["y"], vec![]);
        b.node_to("Softmax", &["y"], &["z"], vec![attr_int("axis", -1)]);
        b.output("z", FLOAT, None);
        b.model(17)
    };
    fn w(m: &mut ModelProto) -> &mut onnx_fuse::onnx::TensorProto {
        &mut m.graph.as_mut().unwrap().initializer[0]
    }
    let unused = |m: &mut ModelProto| {
        let mut t = m.graph.as_ref().unwrap().initializer[0].clone();
        t.name = Some("unused".into());
        m.graph.as_mut().unwrap().initializer.push(t);
    };
    type Edit = Box<dyn Fn(&mut ModelProto)>;
    let refused: Vec<(&str, Edit, &str)> = vec![
        ("ir99", Box::new(|m| m.ir_version = Some(99)), "IR version 99 is newer than any ONNX Runtime reads"),
        ("opset-3", Box::new(|m| m.opset_import[0].version = Some(-3)), "imports opset -3"),
        ("dtype999", Box::new(move |m| w(m).data_type = Some(999)), "is of element type 999"),
        ("negative-dim", Box::new(move |m| w(m).dims = vec![-4]), "has dimension -4"),
        (
            "short-raw",
            Box::new(move |m| {
                let t = w(m);
                t.raw_data = Some(t.raw_data.as_ref().unwrap()[..14].to_vec().into());
            }),
            "has 14 bytes of raw_data, where its shape [4] needs 16",
        ),
        (
            "repeated-attribute",
            Box::new(|m| {
                let n = &mut m.graph.as_mut().unwrap().node[1];
                n.attribute.push(n.attribute[0].clone());
            }),
            "names attribute \"axis\" twice",
        ),
        (
            "unused-dtype999",
            Box::new(move |m| {
                unused(m);
                m.graph.as_mut().unwrap().initializer[1].data_type = Some(999);
            }),
            "\"unused\" is of element type 999",
        ),
    ];
    let loads: Vec<(&str, Edit)> = vec![
        (
            "unused-short-raw",
            Box::new(move |m| {
                unused(m);
                let t = &mut m.graph.as_mut().unwrap().initializer[1];
                t.raw_data = Some(t.raw_data.as_ref().unwrap()[..14].to_vec().into());
            }),
        ),
        (
            "unused-negative-dim",
            Box::new(move |m| {
                unused(m);
                m.graph.as_mut().unwrap().initializer[1].dims = vec![-4];
            }),
        ),
        ("ir13", Box::new(|m| m.ir_version = Some(13))),
    ];
    let dir = tempdir();
    let out = dir.path().join("o.onnx");
    for (name, edit, why) in refused {
        let mut model = base();
        edit(&mut model);
        let input = dir.path().join(format!("{name}.onnx"));
        fs::write(&input, model.encode_to_vec()).unwrap();
        let r = run(&[s(&input), "-o", s(&out)]);
        let e = stderr(&r);
        assert_eq!(r.status.code(), Some(1), "{name}: {e}");
        assert!(e.contains(&format!("{name}.onnx: invalid model: ")) && e.contains(why), "{name}: {e}");
        assert!(!out.exists(), "{name}");
    }
    for (name, edit) in loads {
        let mut model = base();
        edit(&mut model);
        let input = dir.path().join(format!("{name}.onnx"));
        fs::write(&input, model.encode_to_vec()).unwrap();
        let r = run(&[s(&input), "-o", s(&out)]);
        assert!(r.status.success(), "{name}: {}", stderr(&r));
        fs::remove_file(&out).unwrap();
    }
    // External data: truncated, empty, at an offset past its end or below
    // zero, of a length its shape does not need.
    let external = |edit: &dyn Fn(&mut Vec<onnx_fuse::onnx::StringStringEntryProto>, &Path)| {
        let src = dir.path().join("ext");
        fs::create_dir_all(&src).unwrap();
        fs::copy(testdata("external/model.weights"), src.join("model.weights")).unwrap();
        let mut model = load("external/model.onnx");
        let t = model.graph.as_mut().unwrap().initializer.iter_mut().find(|t| t.is_external()).unwrap();
        edit(&mut t.external_data, &src);
        let input = src.join("model.onnx");
        fs::write(&input, model.encode_to_vec()).unwrap();
        run(&[s(&input), "-o", s(&out)])
    };
    let set = |entries: &mut Vec<onnx_fuse::onnx::StringStringEntryProto>, key: &str, value: &str| {
        entries.retain(|e| e.key() != key);
        entries.push(onnx_fuse::onnx::StringStringEntryProto::new(key, value.to_string()));
    };
    let size = fs::metadata(testdata("external/model.weights")).unwrap().len();
    let cases: Vec<(&str, Box<dyn Fn(&mut Vec<_>, &Path)>, &str)> = vec![
        (
            "truncated",
            Box::new(move |_, dir| {
                fs::File::options().write(true).open(dir.join("model.weights")).unwrap().set_len(size / 2).unwrap()
            }),
            "which holds",
        ),
        ("empty", Box::new(|_, dir| fs::write(dir.join("model.weights"), b"").unwrap()), "which holds 0"),
        ("past-the-end", Box::new(move |e, _| set(e, "offset", &(size + 1).to_string())), "which holds"),
        ("negative-offset", Box::new(move |e, _| set(e, "offset", "-100")), "offset \"-100\", not a size"),
        (
            "length-2^62",
            Box::new(move |e, _| set(e, "length", &(1u64 << 62).to_string())),
            "external data of length 4611686018427387904",
        ),
    ];
    for (name, edit, why) in cases {
        let r = external(&*edit);
        let e = stderr(&r);
        assert_eq!(r.status.code(), Some(1), "{name}: {e}");
        assert!(e.contains("invalid model: ") && e.contains(why), "{name}: {e}");
        assert!(!out.exists(), "{name}");
    }
}

/// ONNX Runtime's kernels end the process on some inputs a model does not
/// define (`Div` of int64's lowest by -1 raises SIGFPE; a Longformer export
/// at sizes it was not traced for did so in the wild): `--verify` runs them
/// in a process of its own, so the run ends with one line naming the file
/// and the signal, exit 1, and nothing written.
#[test]
fn a_runtime_that_ends_its_process_fails_the_verification_not_the_tool() {
    let dir = tempdir();
    let mut b = Builder::default();
    let x = b.input("x", INT64, Some(&[D::N(2)]));
    let minus_one = b.init("minus_one", tensor(INT64, &[], &[-1.0]));
    let y = b.node("Div", &[&x, &minus_one], vec![]);
    b.output(&y, INT64, Some(&[D::N(2)]));
    let model = dir.path().join("div.onnx");
    fs::write(&model, b.model(17).encode_to_vec()).unwrap();
    let inputs = dir.path().join("lowest.npz");
    npz(&inputs, &[], &[("x", vec![2], vec![i64::MIN, 3])]);
    let out = dir.path().join("out.onnx");
    let r = run(&[s(&model), "-o", s(&out), "--verify", "--inputs", s(&inputs)]);
    let e = stderr(&r);
    assert_eq!(r.status.code(), Some(1), "{e}");
    assert!(e.starts_with("onnx-fuse: error: ") && e.lines().count() == 1, "{e}");
    for w in [s(&model), "ended with signal 8 (SIGFPE", "lowest.npz"] {
        assert!(e.contains(w), "{w:?} in {e}");
    }
    assert!(!out.exists());
    // The verify subcommand alike.
    let r = run(&["verify", s(&model), s(&model), "--inputs", s(&inputs)]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("signal 8 (SIGFPE"), "{}", stderr(&r));
    // Inputs it computes on verify as before.
    npz(&inputs, &[], &[("x", vec![2], vec![-6, 3])]);
    let r = run(&[s(&model), "-o", s(&out), "--verify", "--inputs", s(&inputs)]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(stderr(&r).contains("verification passed"), "{}", stderr(&r));
}
