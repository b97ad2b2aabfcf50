//! Loss-free loading and writing: byte-identical output when nothing
//! changes, refusal of fields our schema lacks, external data, atomic
//! writes, and one-line errors on bad input.

mod common;

use std::fs;
use std::path::Path;

use common::*;
use onnx_fuse::onnx::ModelProto;
use prost::Message;

fn all_testdata() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(testdata(""))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".onnx"))
        .collect();
    names.sort();
    names.push("external/model.onnx".into());
    names
}

#[test]
fn with_nothing_to_change_the_output_is_byte_identical() {
    let dir = tempdir();
    let every_pass = onnx_fuse::passes::ALL.iter().map(|p| p.name).collect::<Vec<_>>().join(",");
    for name in all_testdata() {
        let out = dir.path().join("out.onnx");
        let (input, output) = (testdata(&name), out.clone());
        let run = run(&["--disable", &every_pass, "-q", input.to_str().unwrap(), "-o", output.to_str().unwrap()]);
        assert!(run.status.success(), "{name}: {}", stderr(&run));
        assert!(fs::read(&out).unwrap() == fs::read(testdata(&name)).unwrap(), "{name}: the bytes differ");
    }
}

#[test]
fn our_schema_reads_and_rewrites_every_export_exactly() {
    // Decoding and re-encoding reproduces the exporters' bytes: no field is
    // lost or reordered, so a rewritten model differs only where it was fused.
    for name in all_testdata() {
        let bytes = fs::read(testdata(&name)).unwrap();
        let model = ModelProto::decode(bytes.as_slice()).unwrap();
        assert!(model.encode_to_vec() == bytes, "{name}: re-encoding changed the bytes");
    }
}

/// A field number no ONNX message defines, appended to a message's bytes.
fn with_unknown_field(bytes: &[u8], number: u32) -> Vec<u8> {
    let mut out = bytes.to_vec();
    prost::encoding::encode_key(number, prost::encoding::WireType::Varint, &mut out);
    prost::encoding::encode_varint(7, &mut out);
    out
}

#[test]
fn unknown_fields_are_refused_unless_the_loss_is_accepted() {
    let dir = tempdir();
    let model = load("llama_ts_op14.onnx");
    // At the top level, and inside the graph's first node.
    let top = with_unknown_field(&model.encode_to_vec(), 99);
    let mut nested_model = model.clone();
    let graph = nested_model.graph.take().unwrap();
    let node_bytes = with_unknown_field(&graph.node[0].encode_to_vec(), 1234);
    let mut graph_bytes = Vec::new();
    prost::encoding::bytes::encode(1, &node_bytes, &mut graph_bytes);
    let mut rest = graph.clone();
    rest.node.remove(0);
    graph_bytes.extend(rest.encode_to_vec());
    let mut nested = nested_model.encode_to_vec();
    prost::encoding::bytes::encode(7, &graph_bytes, &mut nested);

    for (bytes, field) in
        [(top, "field number 99 of onnx.ModelProto"), (nested, "field number 1234 of onnx.NodeProto at graph.node[0]")]
    {
        let input = dir.path().join("unknown.onnx");
        fs::write(&input, &bytes).unwrap();
        let out = dir.path().join(format!("out{}.onnx", field.len()));
        let refused = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert_eq!(refused.status.code(), Some(1));
        let message = stderr(&refused);
        assert!(
            message.contains(field) && message.contains("unknown.onnx") && message.contains("--allow-unknown-fields"),
            "{message}"
        );
        assert_eq!(message.lines().count(), 1, "one line: {message}");
        assert!(!out.exists());
        let accepted = run(&["--allow-unknown-fields", "-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        assert!(accepted.status.success(), "{}", stderr(&accepted));
    }
}

#[test]
fn bad_input_gives_one_line_naming_the_file_and_exit_1() {
    let dir = tempdir();
    let good = fs::read(testdata("gpt2_ts_op14.onnx")).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty.onnx", vec![]),
        ("text.onnx", b"this is not a model\n".to_vec()),
        ("truncated.onnx", good[..good.len() / 2].to_vec()),
        ("random.onnx", (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect()),
    ];
    for (name, bytes) in cases {
        let input = dir.path().join(name);
        fs::write(&input, &bytes).unwrap();
        let out = dir.path().join("out.onnx");
        let r = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        let message = stderr(&r);
        assert_eq!(r.status.code(), Some(1), "{name}: {message}");
        assert!(message.starts_with("onnx-fuse: error: ") && message.contains(name), "{name}: {message}");
        assert_eq!(message.lines().count(), 1, "{name}: {message}");
        assert!(!out.exists(), "{name}: nothing written");
        assert!(fs::read(&input).unwrap() == bytes, "{name}: the input is untouched");
    }
    let missing = run(&[dir.path().join("missing.onnx").to_str().unwrap(), "-o", "x.onnx"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("missing.onnx: cannot open"));
}

#[test]
fn the_input_is_never_the_output() {
    let dir = tempdir();
    let input = dir.path().join("model.onnx");
    fs::copy(testdata("llama_ts_op14.onnx"), &input).unwrap();
    let before = fs::read(&input).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", input.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("(-o) and") && stderr(&r).contains("(the input) are the same file"), "{}", stderr(&r));
    // Another spelling of the same path, and a hard link to it.
    let other = dir.path().join(".").join("model.onnx");
    let r = run(&[input.to_str().unwrap(), "-o", other.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    let link = dir.path().join("link.onnx");
    fs::hard_link(&input, &link).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", link.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2));
    assert!(fs::read(&input).unwrap() == before, "the input is untouched");
}

#[test]
fn writing_leaves_no_partial_files() {
    let dir = tempdir();
    let out = dir.path().join("no-such-dir").join("out.onnx");
    let r = run(&[testdata("llama_ts_op14.onnx").to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("does not exist"));
    // A successful write leaves exactly the output behind.
    let out = dir.path().join("out.onnx");
    let r = run(&["-q", testdata("llama_ts_op14.onnx").to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(r.status.success());
    let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["out.onnx"]);
}

#[test]
fn runs_are_deterministic() {
    let dir = tempdir();
    let (a, b) = (dir.path().join("a.onnx"), dir.path().join("b.onnx"));
    let cases = [
        ("llama_ts_op14.onnx", "ort"),
        ("gpt2_ts_op14.onnx", "ort"),
        ("if_branches_rms.onnx", "ort"),
        ("llama_dynamo_op23.onnx", "portable"),
        ("vit_dynamo_op23.onnx", "portable"),
    ];
    for (name, target) in cases {
        let fuse = |from: &Path, to: &Path| {
            let args = ["-q", "--target", target, from.to_str().unwrap(), "-o", to.to_str().unwrap()];
            assert!(run(&args).status.success(), "{name}");
        };
        fuse(&testdata(name), &a);
        fuse(&testdata(name), &b);
        assert!(fs::read(&a).unwrap() == fs::read(&b).unwrap(), "{name} ({target}): the bytes differ");
        // Fusing the output again writes it back unchanged.
        fuse(&a, &b);
        assert!(fs::read(&a).unwrap() == fs::read(&b).unwrap(), "{name} ({target}): not idempotent");
    }
}

fn external(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("src");
    fs::create_dir(&src).unwrap();
    for f in ["model.onnx", "model.weights"] {
        fs::copy(testdata("external").join(f), src.join(f)).unwrap();
    }
    src.join("model.onnx")
}

#[test]
fn external_data_beside_the_input_is_referenced_not_copied() {
    let dir = tempdir();
    let input = external(dir.path());
    let out = input.with_file_name("fused.onnx");
    let r = run(&["-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    let mut names: Vec<_> = fs::read_dir(input.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["fused.onnx", "model.onnx", "model.weights"]);
    let original = load("external/model.onnx");
    let fused = onnx_fuse::io::load(&out, Default::default()).unwrap().model;
    let norms = count_op(&fused, "SimplifiedLayerNormalization") + count_op(&fused, "SkipSimplifiedLayerNormalization");
    assert_eq!(norms, 5);
    let v = onnx_fuse::verify::verify(
        (&original, &testdata("external")),
        (&fused, input.parent().unwrap()),
        &Default::default(),
    )
    .unwrap();
    assert!(v.passed, "{}", v.text());
}

/// The names created in `dir` while `f` runs (inotify: a file created and
/// removed again is seen too).
fn created_in<T>(dirs: &[&Path], f: impl FnOnce() -> T) -> (T, Vec<String>) {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain inotify calls on a descriptor this function owns.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    assert!(fd >= 0, "inotify");
    for dir in dirs {
        let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        assert!(unsafe { libc::inotify_add_watch(fd, c.as_ptr(), libc::IN_CREATE | libc::IN_MOVED_TO) } >= 0);
    }
    let result = f();
    let (mut names, mut buf) = (Vec::new(), vec![0u8; 1 << 16]);
    loop {
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let mut at = 0;
        while at < n as usize {
            let event = unsafe { &*(buf.as_ptr().add(at) as *const libc::inotify_event) };
            let name = &buf[at + std::mem::size_of::<libc::inotify_event>()..][..event.len as usize];
            names.push(String::from_utf8_lossy(name).trim_end_matches('\0').to_string());
            at += std::mem::size_of::<libc::inotify_event>() + event.len as usize;
        }
    }
    unsafe { libc::close(fd) };
    (result, names)
}

#[test]
fn verification_writes_nothing_beside_the_model_nor_anywhere_else() {
    // ONNX Runtime reads an unnamed scratch file (no kill can leave it
    // behind), and its telemetry, which keeps an event store under
    // ~/.cache, is off.
    let dir = tempdir();
    let input = external(dir.path());
    let (home, tmp, out_dir) = (dir.path().join("home"), dir.path().join("tmp"), dir.path().join("out"));
    for d in [&home, &tmp, &out_dir] {
        fs::create_dir(d).unwrap();
    }
    let out = out_dir.join("fused.onnx");
    let (r, created) = created_in(&[input.parent().unwrap(), &tmp], || {
        bin()
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .env_remove("XDG_CACHE_HOME")
            .env_remove("ORT_DISABLE_TELEMETRY")
            .args(["-q", "--verify", input.to_str().unwrap(), "-o", out.to_str().unwrap()])
            .output()
            .unwrap()
    });
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(created, Vec::<String>::new(), "created beside the model or in TMPDIR");
    assert_eq!(fs::read_dir(&home).unwrap().count(), 0, "something was written under HOME");
    // A model with its weights inside, read by `verify`.
    let model = testdata("llama_ts_op14.onnx");
    let (r, created) = created_in(&[testdata("").as_path(), &tmp], || {
        bin()
            .env("HOME", &home)
            .env("TMPDIR", &tmp)
            .args(["verify", model.to_str().unwrap(), model.to_str().unwrap()])
            .output()
            .unwrap()
    });
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(created, Vec::<String>::new(), "created beside the model or in TMPDIR");
    assert_eq!(fs::read_dir(&home).unwrap().count(), 0, "something was written under HOME");
}

#[test]
fn external_data_is_copied_beside_an_output_elsewhere() {
    let dir = tempdir();
    let input = external(dir.path());
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("fused.onnx");
    let r = run(&["-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    let (copy, source) = (out_dir.join("model.weights"), input.with_file_name("model.weights"));
    assert!(fs::read(&copy).unwrap() == fs::read(&source).unwrap(), "the copy differs");
    use std::os::unix::fs::MetadataExt;
    assert_ne!(fs::metadata(&copy).unwrap().ino(), fs::metadata(&source).unwrap().ino(), "a copy, not a link");
    // Asked for, a hard link.
    let linked = dir.path().join("linked");
    fs::create_dir(&linked).unwrap();
    let r =
        run(&["-q", "--link-external-data", input.to_str().unwrap(), "-o", linked.join("f.onnx").to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(fs::metadata(linked.join("model.weights")).unwrap().ino(), fs::metadata(&source).unwrap().ino());
    // Across filesystems (/dev/shm is a tmpfs) no link can be: a copy.
    let other = tempfile::tempdir_in("/dev/shm").expect("/dev/shm (Linux)");
    assert_ne!(fs::metadata(other.path()).unwrap().dev(), fs::metadata(&source).unwrap().dev(), "another filesystem");
    let out = other.path().join("f.onnx");
    let r = run(&["-q", "--link-external-data", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(fs::read(other.path().join("model.weights")).unwrap() == fs::read(&source).unwrap(), "the copy differs");
}

#[test]
fn missing_or_escaping_external_data_is_refused() {
    let dir = tempdir();
    let input = external(dir.path());
    fs::rename(input.with_file_name("model.weights"), input.with_file_name("moved.weights")).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", dir.path().join("o.onnx").to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("external data location \"model.weights\" is missing"), "{}", stderr(&r));

    for location in ["../model.weights", "/etc/passwd"] {
        let mut model = load("external/model.onnx");
        for t in &mut model.graph.as_mut().unwrap().initializer {
            for e in &mut t.external_data {
                if e.key() == "location" {
                    e.value = Some(location.into());
                }
            }
        }
        let path = dir.path().join("escape.onnx");
        fs::write(&path, model.encode_to_vec()).unwrap();
        let r = run(&[path.to_str().unwrap(), "-o", dir.path().join("o.onnx").to_str().unwrap()]);
        assert_eq!(r.status.code(), Some(1), "{location}");
        assert!(stderr(&r).contains(location) && stderr(&r).contains("escape.onnx"), "{}", stderr(&r));
    }
}

#[test]
fn malformed_nodes_never_crash_the_tool() {
    // Required inputs removed from nodes the passes look at: the graph view
    // hides such nodes from the rules (which read required inputs
    // unchecked), --explain says why, and nothing panics.
    let dir = tempdir();
    let mut model = load("llama_ts_op14.onnx");
    let graph = model.graph.as_mut().unwrap();
    // The last layer's second norm's Sqrt, the final norm's ReduceMean
    // (each read on: a node nothing reads goes before the passes), the last
    // layer's Softmax and a Cast of its attention. (A malformed node on the
    // residual path would leave every later shape unproved; the attention's
    // output shape is still proved, by the Reshape after it.)
    let mut clear = |op: &str, scope: &str| {
        let node = graph.node.iter_mut().find(|n| n.op_type() == op && n.name().starts_with(scope)).unwrap();
        node.input.clear();
        node.output[0].clone()
    };
    clear("Sqrt", "/model/model/layers.1/post_attention_layernorm/");
    clear("ReduceMean", "/model/model/norm/");
    clear("Softmax", "/model/model/layers.1/");
    clear("Cast", "/model/model/layers.1/self_attn/Cast");
    let input = dir.path().join("malformed.onnx");
    fs::write(&input, model.encode_to_vec()).unwrap();
    let out = dir.path().join("out.onnx");
    let r = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--explain", "--passes", "default,skip-norm"]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(!stderr(&r).contains("panicked") && !stderr(&r).contains("internal error"), "{}", stderr(&r));
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    // Each rule that reaches a malformed node says which and why.
    for (pass, op) in [("rms-norm", "Sqrt"), ("layer-norm", "ReduceMean"), ("attention", "Softmax")] {
        let said = text.lines().any(|l| {
            l.starts_with(&format!("not fused by {pass} "))
                && l.contains(&format!("is computed by a malformed node: {op} "))
                && l.ends_with("has 0 of the 1 inputs it requires")
        });
        assert!(said, "{pass} names the malformed {op}: {text}");
    }
    // The other layer still fuses.
    // (skip-norm takes two of the three norms over; the SiLUs fuse too.)
    assert!(
        stderr(&r).contains(
            "(layer-norm 0, rms-norm 3 (2 of them with their residual Add: skip-norm 2), attention 1, gelu 2, rotary"
        ),
        "{}",
        stderr(&r)
    );
}

/// Payloads of the input go to the output inside the kernel
/// (copy_file_range); where it declines, they are written from the map.
/// Either way the output has the same bytes as encoding it in memory.
#[test]
fn kernel_copies_and_plain_writes_give_the_same_bytes() {
    use common::build::{rms_norm, Builder, D};
    use onnx_fuse::onnx::FLOAT;
    // A weight of 64 MiB and a bit: past the sink's buffer, and in two
    // pieces of the output's writeback steps.
    const N: i64 = (1 << 24) + 4099;
    let mut b = Builder::default();
    let x = b.input("x", FLOAT, Some(&[D::N(2), D::N(N)]));
    let y = rms_norm(&mut b, &x, FLOAT, &(0..N).map(|i| (i % 251) as f64 / 7.0).collect::<Vec<_>>());
    b.output(&y, FLOAT, None);
    let dir = tempdir();
    let input = dir.path().join("big.onnx");
    fs::write(&input, b.model(17).encode_to_vec()).unwrap();
    let expected = {
        let (fused, outcome) =
            fuse_model(&onnx_fuse::io::load(&input, Default::default()).unwrap().model, &["default"]);
        assert_eq!(outcome.fused.len(), 1);
        fused.encode_to_vec()
    };
    for (label, fallback) in [("copy_file_range", false), ("write", true)] {
        let out = dir.path().join(format!("{label}.onnx"));
        let mut cmd = bin();
        cmd.args(["-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
        if fallback {
            cmd.env("ONNX_FUSE_NO_COPY_FILE_RANGE", "1");
        }
        let r = cmd.output().unwrap();
        assert!(r.status.success(), "{label}: {}", stderr(&r));
        assert!(fs::read(&out).unwrap() == expected, "{label}: the bytes differ from the in-memory encoding");
    }
}

/// Every node that real exports' patterns are made of, one at a time, with
/// its inputs cut short: no rule panics (rules read required inputs
/// unchecked; the view hides such nodes), wherever the node sits.
#[test]
fn no_node_cut_short_makes_a_rule_panic() {
    let pipeline = onnx_fuse::passes::pipeline(&["default".to_string(), "complex-mul".to_string()], &[]).unwrap();
    for name in ["llama_ts_op14.onnx", "gpt2_ts_op14.onnx", "whisper_encoder_ts_op14.onnx", "cmul_slice_ts_op17.onnx"] {
        let model = load(name);
        let outcome = onnx_fuse::rewrite::run(&mut model.clone(), &pipeline);
        let in_patterns: std::collections::HashSet<&str> = outcome
            .fused
            .iter()
            .flat_map(|f| f.replaced.iter())
            .filter_map(|r| r.split_once(' '))
            .map(|(_, n)| n)
            .collect();
        let nodes = &model.graph.as_ref().unwrap().node;
        let mut cut_count = 0;
        for (index, node) in nodes.iter().enumerate().filter(|(_, n)| in_patterns.contains(n.name())) {
            // The last input removed: for a unary op, its only one.
            let keep = node.input.len().saturating_sub(1);
            let mut cut = model.clone();
            cut.graph.as_mut().unwrap().node[index].input.truncate(keep);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                onnx_fuse::rewrite::run(&mut cut, &pipeline);
            }));
            assert!(ran.is_ok(), "{name}: {} cut to {keep} inputs", node.name());
            cut_count += 1;
        }
        assert!(cut_count > 20, "{name}: {cut_count} cuts");
    }
}

/// The tensors of a model by name: (inside bytes, or (location, offset, length)).
fn placement(model: &ModelProto) -> Vec<(String, Option<usize>, Option<(String, u64, u64)>)> {
    model
        .graph
        .as_ref()
        .unwrap()
        .initializer
        .iter()
        .map(|t| {
            let entry = |key: &str| t.external_data.iter().find(|e| e.key() == key).map(|e| e.value().to_string());
            let external = t.is_external().then(|| {
                let number = |key: &str| entry(key).unwrap().parse::<u64>().unwrap();
                (entry("location").unwrap(), number("offset"), number("length"))
            });
            (t.name().to_string(), t.raw_data.as_ref().map(|d| d.len()), external)
        })
        .collect()
}

#[test]
fn external_data_moves_the_weights_beside_the_output_page_aligned() {
    let dir = tempdir();
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let input = testdata("llama_ts_op14.onnx");
    let (inside, apart) = (dir.path().join("inside.onnx"), out_dir.join("m.onnx"));
    for (out, flag) in [(&inside, None), (&apart, Some("--external-data"))] {
        let mut args = vec!["-q", input.to_str().unwrap(), "-o", out.to_str().unwrap()];
        args.extend(flag);
        let r = run(&args);
        assert!(r.status.success(), "{}", stderr(&r));
    }
    let mut names: Vec<_> = fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["m.onnx", "m.onnx.data"]);
    // Every tensor of 1 KiB or more moved, each to an aligned offset, its
    // bytes those of the output written whole; the small ones stayed.
    let whole = onnx_fuse::io::load(&inside, Default::default()).unwrap().model;
    let fused = onnx_fuse::io::load(&apart, Default::default()).unwrap().model;
    let data = fs::read(out_dir.join("m.onnx.data")).unwrap();
    let bytes: std::collections::HashMap<&str, &[u8]> = whole
        .graph
        .as_ref()
        .unwrap()
        .initializer
        .iter()
        .map(|t| (t.name(), t.raw_data.as_deref().unwrap_or_default()))
        .collect();
    let (mut moved, mut kept) = (0, 0);
    for (name, inside_len, external) in placement(&fused) {
        let original = bytes[name.as_str()];
        match external {
            Some((location, offset, length)) => {
                assert_eq!(location, "m.onnx.data");
                assert!(original.len() >= 1024 && inside_len.is_none(), "{name}");
                let align = if length >= 64 << 10 { 64 << 10 } else { 4 << 10 };
                assert_eq!(offset % align, 0, "{name} at {offset}");
                assert!(&data[offset as usize..][..length as usize] == original, "{name}: other bytes");
                moved += 1;
            }
            None => {
                assert!(original.len() < 1024 && inside_len == Some(original.len()), "{name}");
                kept += 1;
            }
        }
    }
    assert!(moved > 10 && kept > 0, "{moved} moved, {kept} kept");
    // ONNX Runtime reads it: the same function as the original.
    let v = onnx_fuse::verify::verify(
        (&load("llama_ts_op14.onnx"), &testdata("")),
        (&fused, &out_dir),
        &Default::default(),
    )
    .unwrap();
    assert!(v.passed, "{}", v.text());
    // Run again over its own output: the data file is replaced, the same bytes.
    let report = dir.path().join("r.json");
    let r = run(&[
        "--external-data",
        input.to_str().unwrap(),
        "-o",
        apart.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    assert!(fs::read(out_dir.join("m.onnx.data")).unwrap() == data, "not deterministic");
    // The report and the summary say where the weights are.
    let weights = out_dir.join("m.onnx.data").display().to_string();
    let report: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(report["weights"], weights.as_str());
    assert!(stderr(&r).contains(&format!("(weights in {weights})")), "{}", stderr(&r));
}

#[test]
fn external_data_never_replaces_a_file_it_does_not_own() {
    let dir = tempdir();
    let input = testdata("llama_ts_op14.onnx");
    // Another file by the name the weights would take: refused, untouched.
    let foreign = dir.path().join("x.onnx.data");
    fs::write(&foreign, b"somebody's weights").unwrap();
    let out = dir.path().join("x.onnx");
    let r = run(&["-q", "--external-data", input.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("x.onnx.data"), "{}", stderr(&r));
    assert_eq!(fs::read(&foreign).unwrap(), b"somebody's weights");
    assert!(!out.exists());
    // The input itself by that name: refused, untouched.
    let named = dir.path().join("w.onnx.data");
    fs::copy(&input, &named).unwrap();
    let r = run(&["-q", "--external-data", named.to_str().unwrap(), "-o", dir.path().join("w.onnx").to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(fs::read(&named).unwrap() == fs::read(&input).unwrap(), "the input was written");
    // A model with external data of its own keeps its files.
    let src = external(dir.path());
    let out_dir = dir.path().join("out");
    fs::create_dir(&out_dir).unwrap();
    let r = run(&["--external-data", src.to_str().unwrap(), "-o", out_dir.join("e.onnx").to_str().unwrap()]);
    assert!(r.status.success(), "{}", stderr(&r));
    let mut names: Vec<_> = fs::read_dir(&out_dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, ["e.onnx", "model.weights"]);
    // and says so: the flag had nothing to move.
    let said = "warning: --external-data: the model keeps its weights in its own external data (model.weights)";
    assert!(stderr(&r).contains(said), "{}", stderr(&r));
}
