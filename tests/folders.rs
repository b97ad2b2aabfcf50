//! Export folders in one run, and expectations as a CI guard.

mod common;

use std::fs;
use std::path::Path;

use common::*;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// (file, rms-norm, skip-norm, attention) of a folder report: what each
/// pass fused (the RMSNorms skip-norm then joined to their residual Add
/// included).
fn counts(report: &serde_json::Value) -> Vec<(String, u64, u64, u64)> {
    report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = Path::new(f["input"].as_str().unwrap()).file_name().unwrap().to_string_lossy().into_owned();
            let pass = |p: &str| {
                f["passes"].as_array().unwrap().iter().find(|c| c["name"] == p).unwrap()["fused"].as_u64().unwrap()
            };
            (name, pass("rms-norm"), pass("skip-norm"), pass("attention"))
        })
        .collect()
}

#[test]
fn an_optimum_seq2seq_folder_is_fused_whole() {
    let dir = tempdir();
    let (out, report) = (dir.path().join("fused"), dir.path().join("r.json"));
    let r = run(&[
        "-q",
        "--verify",
        "--passes",
        "default,skip-norm",
        s(&testdata("t5_optimum_folder")),
        "-o",
        s(&out),
        "--report-json",
        s(&report),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let report = json(&report);
    assert_eq!(
        counts(&report),
        [
            // Every residual norm: without a cache, the position bias cut
            // to the query's length (`-seq:`) keeps it (verified above);
            // with a cache too: the new rows' positions, Range(past,
            // past + seq), are seq, and the cache is past + seq long.
            ("decoder_model.onnx".to_string(), 7, 6, 4),
            ("decoder_with_past_model.onnx".to_string(), 7, 6, 4),
            ("encoder_model.onnx".to_string(), 5, 4, 2)
        ]
    );
    assert!(report["files"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["written"] == true && f["verification"]["passed"] == true));
    assert_eq!(report["carried"], serde_json::json!(["config.json", "generation_config.json"]));
    for f in ["config.json", "generation_config.json"] {
        assert!(fs::read(out.join(f)).unwrap() == fs::read(testdata("t5_optimum_folder").join(f)).unwrap(), "{f}");
    }
    let mut names: Vec<String> =
        fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 5, "{names:?}: the models and the carried files, nothing else");
}

#[test]
fn a_merged_decoder_folder_fuses_inside_its_branches() {
    let dir = tempdir();
    let (out, report) = (dir.path().join("fused"), dir.path().join("r.json"));
    let r = run(&[
        "-q",
        "--verify",
        "--passes",
        "default,skip-norm",
        s(&testdata("llama_optimum_merged_folder")),
        "-o",
        s(&out),
        "--report-json",
        s(&report),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let report = json(&report);
    assert_eq!(
        counts(&report),
        [
            ("decoder_model.onnx".to_string(), 5, 4, 2),
            ("decoder_model_merged.onnx".to_string(), 10, 8, 4),
            ("decoder_with_past_model.onnx".to_string(), 5, 4, 2)
        ]
    );
    let merged = &report["files"][1];
    assert!(merged["fused"].as_array().unwrap().iter().all(|f| f["graph"].as_str().unwrap().contains("optimum::if")));
    assert_eq!(merged["verification"]["outputs_decide"], true, "fused nodes inside If branches");
}

#[test]
fn the_input_folder_is_not_the_output() {
    let dir = tempdir();
    let copy = dir.path().join("export");
    fs::create_dir(&copy).unwrap();
    for f in fs::read_dir(testdata("t5_optimum_folder")).unwrap() {
        let f = f.unwrap().path();
        fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let r = run(&[s(&copy), "-o", s(&dir.path().join(".").join("export"))]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("is the input folder"), "{}", stderr(&r));
}

#[test]
fn shared_external_data_stays_shared() {
    let dir = tempdir();
    let export = dir.path().join("export");
    fs::create_dir(&export).unwrap();
    for (from, to) in [("model.onnx", "a.onnx"), ("model.onnx", "b.onnx"), ("model.weights", "model.weights")] {
        fs::copy(testdata("external").join(from), export.join(to)).unwrap();
    }
    let out = dir.path().join("out");
    let r = run(&["-q", s(&export), "-o", s(&out)]);
    assert!(r.status.success(), "{}", stderr(&r));
    let mut names: Vec<String> =
        fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["a.onnx", "b.onnx", "model.weights"], "one data file for both models");
    for m in ["a.onnx", "b.onnx"] {
        let model = onnx_fuse::io::load(&out.join(m), Default::default()).unwrap().model;
        assert_eq!(onnx_fuse::io::external_locations(&model).into_iter().collect::<Vec<_>>(), ["model.weights"]);
    }
    assert!(fs::read(out.join("model.weights")).unwrap() == fs::read(export.join("model.weights")).unwrap());
}

#[test]
fn expectations_guard_the_counts() {
    let dir = tempdir();
    let model = testdata("llama_ts_op14.onnx");
    let out = dir.path().join("out.onnx");
    let json_path = dir.path().join("r.json");
    let go = |extra: &[&str]| {
        let args = [s(&model), "-o", s(&out), "-q", "--report-json", s(&json_path), "--passes", "default,skip-norm"];
        run(&[&args[..], extra].concat())
    };
    let met = go(&["--expect", "rms-norm=5,skip-norm=4,attention=2", "--expect-min", "total=7"]);
    assert_eq!(met.status.code(), Some(0), "{}", stderr(&met));
    let report = json(&json_path);
    assert_eq!(report["expectations"][0]["met"], true);
    assert_eq!(report["expectations"][3]["kind"], "min");
    fs::remove_file(&out).unwrap();
    let unmet = go(&["--expect", "skip-norm=5"]);
    assert_eq!(unmet.status.code(), Some(4), "{}", stderr(&unmet));
    assert_eq!(stderr(&unmet), "onnx-fuse: expectation not met: skip-norm: expected 5, found 4\n");
    assert!(out.exists(), "the output is still written");
    assert_eq!(json(&json_path)["expectations"][0]["found"], 4);
    let unmet = go(&["--expect-min", "total=14"]);
    assert_eq!(unmet.status.code(), Some(4));
    // One norm, four skip-norms, two cores, two SiLUs and four rotaries.
    assert!(stderr(&unmet).contains("total: expected at least 14, found 13"), "{}", stderr(&unmet));
    // A failed verification outranks an unmet expectation.
    let fp16 = testdata("llama_ts_op17_fp16.onnx");
    let r = run(&[
        s(&fp16),
        "-o",
        s(&dir.path().join("f.onnx")),
        "-q",
        "--verify",
        "--rtol",
        "0",
        "--atol",
        "0",
        "--expect",
        "rms-norm=5",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    // Unknown names are usage errors.
    let r = go(&["--expect", "rmsnorm=5"]);
    assert_eq!(r.status.code(), Some(2));
    assert!(stderr(&r).contains("no pass is called \"rmsnorm\""), "{}", stderr(&r));
}

#[test]
fn folder_expectations_check_totals_and_single_files() {
    let dir = tempdir();
    let folder = testdata("t5_optimum_folder");
    let go = |extra: &[&str]| run(&[&[s(&folder), "-o", s(&dir.path().join("out")), "-q"], extra].concat());
    assert_eq!(go(&["--expect", "total=29,encoder_model.onnx:attention=2"]).status.code(), Some(0));
    let json_path = dir.path().join("report.json");
    let r = go(&["--expect", "total=29,decoder_model.onnx:rms-norm=8", "--report-json", s(&json_path)]);
    assert_eq!(r.status.code(), Some(4), "{}", stderr(&r));
    // Said once, and in the folder's JSON expectations too, in the order given.
    assert_eq!(stderr(&r).matches("decoder_model.onnx: rms-norm: expected 8, found 7").count(), 1, "{}", stderr(&r));
    let checked = &json(&json_path)["expectations"];
    assert_eq!(checked[0]["pass"], "total");
    assert_eq!(
        (&checked[1]["file"], &checked[1]["found"], &checked[1]["met"]),
        (&"decoder_model.onnx".into(), &7.into(), &false.into())
    );
    let r = go(&["--expect", "nosuch.onnx:rms-norm=6"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
}

#[test]
fn the_report_ends_with_a_before_after_table() {
    let dir = tempdir();
    let r = run(&[s(&testdata("llama_ts_op14.onnx")), "-o", s(&dir.path().join("o.onnx")), "--report"]);
    let text = String::from_utf8(r.stdout).unwrap();
    let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("op type")).collect();
    let rows: Vec<String> = table.iter().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    // The default run upgrades the model to opset 23 and writes ONNX
    // Attention, each guarded by an If that counts as what it runs.
    for row in ["SimplifiedLayerNormalization 0 5", "Attention 0 2", "Softmax 2 0"] {
        assert!(rows.iter().any(|r| r == row), "{row}: {table:?}");
    }
}

/// A bug that panics on one model of a folder fails that model, reported
/// with its name and exit code 1; the other models are fused and written.
/// (The fault is injected through `ONNX_FUSE_PANIC_ON`, which only debug
/// builds read.)
#[test]
#[cfg(debug_assertions)]
fn a_model_that_panics_fails_alone_and_is_reported() {
    let dir = tempdir();
    let (out, report) = (dir.path().join("fused"), dir.path().join("r.json"));
    let input = testdata("t5_optimum_folder");
    let args = ["-q", "--passes", "default,skip-norm", s(&input), "-o", s(&out), "--report-json", s(&report)];
    let r = bin().args(args).env("ONNX_FUSE_PANIC_ON", "decoder_model.onnx").output().unwrap();
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("decoder_model.onnx") && stderr(&r).contains("internal error"), "{}", stderr(&r));
    let report = json(&report);
    let errors = report["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].to_string().contains("a fault injected for tests"), "{errors:?}");
    let fused: Vec<String> = counts(&report).into_iter().map(|(name, ..)| name).collect();
    assert_eq!(fused, ["decoder_with_past_model.onnx", "encoder_model.onnx"]);
    assert!(out.join("encoder_model.onnx").exists() && !out.join("decoder_model.onnx").exists());
    // The output folder says plainly that it is not a complete export.
    let mark = fs::read_to_string(out.join("ONNX_FUSE_INCOMPLETE")).expect("the folder marked incomplete");
    assert!(mark.contains("not a complete fused export") && mark.contains("decoder_model.onnx"), "{mark}");
    // Fused again without the fault, the folder is complete: no mark.
    let r = bin().args(&args[1..]).output().unwrap();
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(!out.join("ONNX_FUSE_INCOMPLETE").exists());
    // The summary counts what was written and names what was not.
    let r = bin().args(&args[1..]).env("ONNX_FUSE_PANIC_ON", "decoder_model.onnx").output().unwrap();
    assert!(out.join("ONNX_FUSE_INCOMPLETE").exists());
    let said = stderr(&r);
    assert!(
        said.contains("3 models (1 failed, not written: ") && said.contains("decoder_model.onnx), fused"),
        "{said}"
    );
}

#[test]
fn subfolders_are_fused_and_carried_over_and_nothing_is_left_out_unsaid() {
    // transformers.js keeps its models in onnx/; external data may sit in a
    // subfolder beside its model. Special files and links that lead out of
    // the folder, or to a folder, are left alone and listed.
    let dir = tempdir();
    let input = dir.path().join("export");
    fs::create_dir_all(input.join("onnx/deeper")).unwrap();
    fs::copy(testdata("llama_ts_op14.onnx"), input.join("onnx/model.onnx")).unwrap();
    fs::copy(testdata("gpt2_ts_op14.onnx"), input.join("onnx/deeper/gpt2.onnx")).unwrap();
    fs::write(input.join("config.json"), "{}").unwrap();
    fs::write(input.join("onnx/tokenizer.json"), "{}").unwrap();
    fs::create_dir(input.join("data")).unwrap();
    for f in ["model.onnx", "model.weights"] {
        fs::copy(testdata("external").join(f), input.join("data").join(f)).unwrap();
    }
    let outside = dir.path().join("secret.txt");
    fs::write(&outside, "not the export's").unwrap();
    std::os::unix::fs::symlink(&outside, input.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(input.join("onnx"), input.join("loop")).unwrap();
    let fifo = std::ffi::CString::new(input.join("pipe").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let (out, report) = (dir.path().join("fused"), dir.path().join("r.json"));
    let r = run(&[
        s(&input),
        "-o",
        s(&out),
        "--verify",
        "--report-json",
        s(&report),
        "--expect",
        "onnx/model.onnx:rms-norm=5,onnx/deeper/gpt2.onnx:attention=2",
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let said = stderr(&r);
    for left in
        ["leak.txt: a symbolic link leading outside", "loop: a symbolic link to a folder", "pipe: not a regular file"]
    {
        assert!(said.contains(&format!("onnx-fuse: left alone: {left}")), "{left}: {said}");
    }
    let report = json(&report);
    let inputs: Vec<&str> = report["files"].as_array().unwrap().iter().map(|f| f["input"].as_str().unwrap()).collect();
    let expected: Vec<String> = ["data/model.onnx", "onnx/deeper/gpt2.onnx", "onnx/model.onnx"]
        .iter()
        .map(|f| s(&input.join(f)).to_string())
        .collect();
    assert_eq!(inputs, expected);
    assert_eq!(report["carried"], serde_json::json!(["config.json", "data/model.weights", "onnx/tokenizer.json"]));
    assert_eq!(report["skipped"].as_array().unwrap().len(), 3, "{}", report["skipped"]);
    assert!(report["files"].as_array().unwrap().iter().all(|f| f["verification"]["passed"] == true));
    assert!(report["expectations"].as_array().unwrap().iter().all(|e| e["met"] == true));
    // The output tree mirrors the input's, minus what was left alone.
    for f in ["config.json", "onnx/tokenizer.json", "onnx/model.onnx", "onnx/deeper/gpt2.onnx", "data/model.weights"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    for f in ["leak.txt", "loop", "pipe"] {
        assert!(fs::symlink_metadata(out.join(f)).is_err(), "{f}");
    }
    assert_eq!(fs::read(&outside).unwrap(), b"not the export's");
    // The model in data/ still finds its weights beside it.
    let r = run(&["verify", s(&input.join("data/model.onnx")), s(&out.join("data/model.onnx"))]);
    assert!(r.status.success(), "{}", stderr(&r));
    // An output folder inside the input is never walked as input: run twice.
    let (inside, again) = (input.join("fused"), dir.path().join("again.json"));
    for _ in 0..2 {
        let r = run(&[s(&input), "-o", s(&inside), "-q", "--report-json", s(&again)]);
        assert!(r.status.success(), "{}", stderr(&r));
        assert_eq!(json(&again)["files"].as_array().unwrap().len(), 3);
    }
    assert!(json(&again)["skipped"].as_array().unwrap().iter().any(|s| s[0] == "fused"));
    assert!(!inside.join("fused").exists());
}

/// A folder run that is stopped leaves its output folder marked: the mark
/// is written before the first file and removed once every model is
/// written. (Stopped here between the two by a pause a test build reads.)
#[test]
fn a_stopped_folder_run_leaves_its_output_marked_incomplete() {
    let dir = tempdir();
    let out = dir.path().join("fused");
    let input = testdata("t5_optimum_folder");
    let mut child =
        bin().args(["-q", s(&input), "-o", s(&out)]).env("ONNX_FUSE_TEST_PAUSE_MS", "3000").spawn().unwrap();
    let mark = out.join("ONNX_FUSE_INCOMPLETE");
    let started = std::time::Instant::now();
    let marked = || fs::read_to_string(&mark).is_ok_and(|t| t.ends_with('\n'));
    while !marked() && started.elapsed() < std::time::Duration::from_secs(20) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let said = fs::read_to_string(&mark).expect("the mark is written before the first file");
    assert!(said.contains("not a complete fused export"), "{said}");
    // Fused into the same folder again, the run completes and the mark goes.
    let r = run(&["-q", s(&input), "-o", s(&out)]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(!mark.exists());
    // A mark in an input folder is not carried over, and is said so.
    let marked_input = dir.path().join("marked");
    fs::create_dir(&marked_input).unwrap();
    fs::copy(testdata("llama_ts_op14.onnx"), marked_input.join("model.onnx")).unwrap();
    fs::write(marked_input.join("ONNX_FUSE_INCOMPLETE"), "from another run\n").unwrap();
    let again = dir.path().join("again");
    let r = run(&[s(&marked_input), "-o", s(&again)]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(stderr(&r).contains("left alone: ONNX_FUSE_INCOMPLETE"), "{}", stderr(&r));
    assert!(!again.join("ONNX_FUSE_INCOMPLETE").exists() && again.join("model.onnx").exists());
}

/// The mark is written as a regular file of the output folder only: a
/// symbolic link by its name (to a file outside) is not followed, a FIFO
/// does not block the run; either is one clear error, nothing outside
/// touched.
#[test]
fn the_mark_never_follows_a_link_or_blocks_on_a_fifo() {
    let dir = tempdir();
    let input = testdata("t5_optimum_folder");
    let outside = dir.path().join("outside.txt");
    fs::write(&outside, "not onnx-fuse's").unwrap();
    let out = dir.path().join("linked");
    fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(&outside, out.join("ONNX_FUSE_INCOMPLETE")).unwrap();
    let r = run(&["-q", s(&input), "-o", s(&out)]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("ONNX_FUSE_INCOMPLETE: cannot write"), "{}", stderr(&r));
    assert_eq!(fs::read_to_string(&outside).unwrap(), "not onnx-fuse's");
    let out = dir.path().join("fifo");
    fs::create_dir(&out).unwrap();
    let fifo = std::ffi::CString::new(out.join("ONNX_FUSE_INCOMPLETE").to_str().unwrap()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
    let r = run(&["-q", s(&input), "-o", s(&out)]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
}

#[test]
fn with_external_data_each_model_of_a_folder_gets_its_weights_file() {
    let dir = tempdir();
    let out = dir.path().join("fused");
    let export = testdata("llama_optimum_merged_folder");
    let r = run(&["-q", "--external-data", s(&export), "-o", s(&out)]);
    assert!(r.status.success(), "{}", stderr(&r));
    let mut names: Vec<String> =
        fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    let models = ["decoder_model.onnx", "decoder_model_merged.onnx", "decoder_with_past_model.onnx"];
    let mut expected: Vec<String> = models.iter().flat_map(|m| [m.to_string(), format!("{m}.data")]).collect();
    expected.extend(["config.json".to_string(), "generation_config.json".to_string()]);
    expected.sort();
    assert_eq!(names, expected);
    // Read from their files by ONNX Runtime: the originals' function.
    for m in models {
        let fused = onnx_fuse::io::load(&out.join(m), Default::default()).unwrap().model;
        assert_eq!(onnx_fuse::io::external_locations(&fused).into_iter().collect::<Vec<_>>(), [format!("{m}.data")]);
        let original = onnx_fuse::io::load(&export.join(m), Default::default()).unwrap().model;
        let v = onnx_fuse::verify::verify((&original, &export), (&fused, &out), &Default::default()).unwrap();
        assert!(v.passed, "{m}: {}", v.text());
    }
    // A file of the input folder by a weights file's name is carried over,
    // not replaced: that model fails, alone, and says why.
    let copy = dir.path().join("export");
    fs::create_dir(&copy).unwrap();
    for m in models {
        fs::copy(export.join(m), copy.join(m)).unwrap();
    }
    fs::write(copy.join("decoder_model.onnx.data"), b"notes").unwrap();
    let again = dir.path().join("again");
    let r = run(&["-q", "--external-data", s(&copy), "-o", s(&again)]);
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("decoder_model.onnx.data"), "{}", stderr(&r));
    assert_eq!(fs::read(again.join("decoder_model.onnx.data")).unwrap(), b"notes");
    assert!(again.join("decoder_model_merged.onnx.data").exists() && !again.join("decoder_model.onnx").exists());
}
