//! The command line: passes, reports, `show`, `verify`, exit codes.

mod common;

use std::fs;

use common::*;

#[test]
fn list_passes_names_each_with_a_description() {
    let r = run(&["--list-passes"]);
    assert!(r.status.success());
    let out = String::from_utf8(r.stdout.clone()).unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["pass", "pipeline", "replaces"], "{out}");
    assert!(out
        .lines()
        .any(|l| l.starts_with("rms-norm") && l.contains("default") && l.contains("SimplifiedLayerNormalization")));
    assert!(out.lines().any(|l| l.starts_with("layer-norm") && l.contains("LayerNormalization")));
}

#[test]
fn usage_errors_exit_2() {
    for args in [vec!["model.onnx"], vec!["--passes", "no-such-pass", "a.onnx", "-o", "b.onnx"], vec!["--bogus"]] {
        let r = run(&args);
        assert_eq!(r.status.code(), Some(2), "{args:?}: {}", stderr(&r));
    }
    let r = run(&["--passes", "no-such-pass", "a.onnx", "-o", "b.onnx"]);
    assert!(stderr(&r).contains("unknown pass \"no-such-pass\""));
}

#[test]
fn contradictory_expectations_and_an_output_of_dash_are_usage_errors() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let model = testdata("llama_ts_op14.onnx");
    let (model, out) = (model.to_str().unwrap(), out.to_str().unwrap());
    let cases: [(&[&str], &str); 4] = [
        (
            &["-o", out, "--expect", "rms-norm=5", "--expect", "rms-norm=4"],
            "--expect rms-norm=5 contradicts --expect rms-norm=4",
        ),
        (&["-o", out, "--expect", "rms-norm=5", "--expect-min", "rms-norm=6"], "contradicts --expect-min rms-norm=6"),
        (
            &["-o", out, "--expect-min", "total=8", "--expect", "total=7"],
            "--expect total=7 contradicts --expect-min total=8",
        ),
        (&["-o", "-"], "-o -: onnx-fuse writes the model to a file, not to standard output"),
    ];
    for (extra, why) in cases {
        let args: Vec<&str> = [model].iter().chain(extra).copied().collect();
        let r = run(&args);
        assert_eq!(r.status.code(), Some(2), "{extra:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(why) && stderr(&r).lines().count() == 1, "{extra:?}: {}", stderr(&r));
        assert!(!std::path::Path::new(out).exists() && !std::path::Path::new("-").exists(), "{extra:?}");
    }
    // Agreeing ones are fine: an exact count at or above a minimum.
    let r = run(&[
        model,
        "-o",
        out,
        "-q",
        "--passes",
        "default,skip-norm",
        "--expect",
        "skip-norm=4",
        "--expect-min",
        "skip-norm=4,total=7",
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    // A count of a pass the pipeline lacks is a usage error that says how to add it.
    let r = run(&[model, "-o", out, "-q", "--expect", "skip-norm=4"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("skip-norm is not a default pass (add --passes default,skip-norm)"), "{}", stderr(&r));
    let r = run(&[model, "-o", out, "-q", "--passes", "rms-norm", "--expect", "attention=2"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("--expect attention=2: attention is not in the pipeline"), "{}", stderr(&r));
}

#[test]
fn verification_options_need_verify_and_a_dim_is_given_once() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let model = testdata("llama_ts_op14.onnx");
    let (model, out) = (model.to_str().unwrap(), out.to_str().unwrap());
    let cases: [(&[&str], &str); 4] = [
        (&["--rtol", "0.1"], "--rtol is an option of --verify, which is not given"),
        (&["--dim", "batch=2"], "--dim is an option of --verify, which is not given"),
        (&["--verify", "--dim", "batch=2", "--dim", "batch=3"], "--dim batch is given twice"),
        (&["--verify", "--dim", "batch=2", "--dim", "batch=2"], "--dim batch is given twice"),
    ];
    for (extra, why) in cases {
        let args: Vec<&str> = [model, "-o", out].iter().chain(extra).copied().collect();
        let r = run(&args);
        assert_eq!(r.status.code(), Some(2), "{extra:?}: {}", stderr(&r));
        assert!(stderr(&r).contains(why) && stderr(&r).lines().count() == 1, "{extra:?}: {}", stderr(&r));
        assert!(!std::path::Path::new(out).exists(), "{extra:?}: nothing written");
    }
    let r = run(&["verify", model, model, "--dim", "seq=4", "--dim", "seq=5"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("--dim seq is given twice"), "{}", stderr(&r));
}

#[test]
fn report_lists_counts_and_replaced_nodes() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let r = run(&[
        testdata("gpt2_ts_op14.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--report",
        "--passes",
        "default,skip-norm",
    ]);
    assert!(r.status.success());
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    // Each of the five LayerNorms reads a residual sum (the embeddings' sum
    // first): skip-norm takes them over; they still count for layer-norm,
    // and the report lists what the output holds.
    assert!(text.contains("layer-norm   5 fused (5 taken into skip-norm nodes)"), "{text}");
    assert!(text.contains("skip-norm    5 fused\n"), "{text}");
    assert!(text.contains("SkipLayerNormalization /model/transformer/h.0/ln_2/SkipLayerNormalization  [skip-norm]"));
    assert!(text.contains("SkipLayerNormalization /model/transformer/h.0/ln_1/SkipLayerNormalization  [skip-norm]"));
    assert!(!text.contains("LayerNormalization /model/transformer/h.0/ln_1/LayerNormalization"), "absorbed: {text}");
    assert!(text.contains("    Sub /model/transformer/h.0/ln_1/Sub"));
    assert!(
        stderr(&r).contains(
            "fused 9 (layer-norm 5 (5 of them with their residual Add: skip-norm 5), rms-norm 0, attention 2, gelu 2, rotary 0)"
        ),
        "{}",
        stderr(&r)
    );
}

#[test]
fn report_json_has_the_documented_fields() {
    // At the model's own opset (the default run upgrades it to 23 first; see below).
    let (r, report) =
        run_with_report("llama_ts_op14.onnx", &["-q", "--verify", "--keep-opset", "--passes", "default,skip-norm"]);
    assert!(r.stderr.is_empty() && r.stdout.is_empty(), "quiet");
    assert_eq!(report["schema"], 1);
    assert_eq!(report["passes"][1]["name"], "rms-norm");
    assert_eq!(report["passes"][1]["fused"], 5, "every RMSNorm counts, those skip-norm took in too");
    assert_eq!(report["passes"][1]["in_output"], 1, "four of five norms read a residual sum");
    assert_eq!(report["passes"][1]["absorbed"]["skip-norm"], 4);
    assert_eq!(report["passes"][2]["name"], "skip-norm");
    assert_eq!(report["passes"][2]["fused"], 4);
    assert_eq!(report["total"], 9);
    assert_eq!(report["absorbed"].as_array().unwrap().len(), 4);
    assert_eq!(report["absorbed"][0]["by"], "skip-norm");
    let first = &report["fused"][0];
    assert_eq!(first["op_type"], "SimplifiedLayerNormalization");
    assert_eq!(first["graph"], "main");
    assert_eq!(first["replaced"][0], "Mul /model/model/layers.0/input_layernorm/Mul_1");
    let v = &report["verification"];
    assert_eq!(v["passed"], true);
    assert_eq!(v["outputs"][0]["name"], "out");
    // One norm, four skip-norms (three of whose sums are read again: two
    // outputs each), two attention cores and two SiLUs.
    assert_eq!(v["nodes"].as_array().unwrap().len(), 12);
    // The worst fused node differs by rounding: more than nothing, within tolerance.
    let worst = v["nodes"][0]["max_abs"].as_f64().unwrap();
    assert!(worst > 0.0 && worst <= 1e-5, "{worst}");
    assert_eq!(v["outputs_decide"], true, "the cleanup changed nodes outside the fused ones: outputs decide too");
    let cleanup = &report["cleanup"];
    let removed = cleanup["removed"].as_u64().unwrap();
    assert!(removed > 0 && cleanup["added"].as_u64().is_some() && cleanup["reshape_targets"].as_u64().is_some());
    assert_eq!(cleanup["nodes"].as_array().unwrap().len() as u64, removed);
    assert!(["constant", "twin", "unread"].contains(&cleanup["nodes"][0]["why"].as_str().unwrap()));
    // Without it, every fused node ran alone and decides.
    let (_, report) = run_with_report(
        "llama_ts_op14.onnx",
        &["-q", "--verify", "--keep-opset", "--passes", "default,skip-norm", "--no-cleanup"],
    );
    assert_eq!(report["verification"]["outputs_decide"], false, "every fused node ran alone");
    assert!(report.get("cleanup").is_none());
    assert_eq!(v["dims"]["batch"], 2);
    assert_eq!(v["outputs"][0]["tolerance"]["rtol"], 1e-4);
}

#[test]
fn explain_says_why_a_candidate_did_not_fuse() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let r = run(&[testdata("nm_rms_exponent3.onnx").to_str().unwrap(), "-o", out.to_str().unwrap(), "--explain"]);
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    assert!(
        text.contains(
            "not fused by rms-norm at /model/model/layers.0/input_layernorm/Mul_1 (main): the exponent is 3, not 2"
        ),
        "{text}"
    );
    // A weight of unproved length: a graph input declared with a symbolic axis.
    let mut model = load("rms_weight_graph_input.onnx");
    let weight = model.graph.as_mut().unwrap().input.iter_mut().find(|i| i.name() == "weight_input").unwrap();
    set_dims(weight, &["hidden"]);
    let input = dir.path().join("weight_symbolic.onnx");
    std::fs::write(&input, prost::Message::encode_to_vec(&model)).unwrap();
    let r = run(&[input.to_str().unwrap(), "-o", out.to_str().unwrap(), "--explain"]);
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    assert!(
        text.contains(
            "at /model/model/layers.0/input_layernorm/Mul_1 (main): the weight (weight_input) has hidden values \
             but the last axis of /model/model/layers.0/input_layernorm/Cast_output_0 is 32"
        ),
        "{text}"
    );
    // Nodes that are no candidate at all (a residual Add, a linear layer's
    // Mul of two computed values) are not listed.
    assert!(!text.contains("no operand of"), "{text}");
}

#[test]
fn explain_lists_only_real_candidates_in_words() {
    // Every export: no anchor that failed its pattern's first step (a bias
    // Add of a MatMul for layer-norm, a Mul of rotary tables or of a graph
    // input for rms-norm, a Div by a constant), and no Rust Option in a reason.
    let dir = tempdir();
    let mut reasons = 0;
    for entry in std::fs::read_dir(testdata("")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "onnx") {
            continue;
        }
        let json = dir.path().join("r.json");
        let out = dir.path().join("o.onnx");
        let args = [path.to_str().unwrap(), "-o", out.to_str().unwrap(), "-q", "--explain"];
        assert!(run(&[&args[..], &["--report-json", json.to_str().unwrap()]].concat()).status.success());
        let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        for d in report["declined"].as_array().into_iter().flatten() {
            let reason = d["reason"].as_str().unwrap();
            reasons += 1;
            // The reasons a first step gives where it is reported at all
            // (the property itself: tests/toolkit.rs, a node with nothing
            // computed before it).
            for first_step in ["is not produced by Sqrt", "is not computed by the graph"] {
                assert!(!reason.contains(first_step), "{}: {d}", path.display());
            }
            assert!(!reason.contains("Some(") && !reason.contains("None"), "{}: {d}", path.display());
        }
    }
    // (38 since the residual norms of GPT-2, BERT and T5 exports fuse: their
    // skip-norm declines are gone.)
    assert!(reasons > 30, "the near-misses explain themselves: {reasons}");
}

#[test]
fn show_reads_back_the_provenance() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    assert!(run(&[
        "-q",
        "--passes",
        "default,skip-norm",
        testdata("gpt2_ts_op14.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap()
    ])
    .status
    .success());
    let r = run(&["show", out.to_str().unwrap()]);
    assert!(r.status.success());
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("LayerNormalization ")).count(), 0);
    assert_eq!(text.lines().filter(|l| l.starts_with("SkipLayerNormalization ")).count(), 5);
    assert!(text.contains("\n    ReduceMean /model/transformer/h.0/ln_1/ReduceMean\n"));
    let none = run(&["show", testdata("gpt2_ts_op14.onnx").to_str().unwrap()]);
    // No fused nodes is an answer, not an error.
    assert_eq!(none.status.code(), Some(0), "{}", stderr(&none));
    let said = String::from_utf8(none.stdout).unwrap();
    assert!(said.ends_with("gpt2_ts_op14.onnx: no fused nodes (no `transmuter.fused` metadata)\n"), "{said}");
}

#[test]
fn show_json_lists_the_reports_fused_entries() {
    let dir = tempdir();
    let (out, json) = (dir.path().join("out.onnx"), dir.path().join("r.json"));
    let model = testdata("if_branches_rms.onnx");
    let args = ["-q", model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", json.to_str().unwrap()];
    assert!(run(&args).status.success());
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let r = run(&["show", out.to_str().unwrap(), "--json"]);
    assert!(r.status.success(), "{}", stderr(&r));
    let shown: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let mut expected: Vec<serde_json::Value> = report["fused"].as_array().unwrap().clone();
    expected.iter_mut().for_each(|f| drop(f.as_object_mut().unwrap().remove("pass")));
    let (mut expected, mut shown) = (expected, shown.as_array().unwrap().clone());
    let key = |f: &serde_json::Value| (f["graph"].to_string(), f["name"].to_string());
    expected.sort_by_key(key);
    shown.sort_by_key(key);
    assert!(shown.len() >= 2 && shown.iter().any(|f| f["graph"] != "main"), "{shown:?}");
    assert_eq!(shown, expected);
    let none = run(&["show", model.to_str().unwrap(), "--json"]);
    assert_eq!((none.status.code(), String::from_utf8(none.stdout).unwrap()), (Some(0), "[]\n".to_string()));
}

#[test]
fn a_failed_verification_exits_3_and_writes_nothing() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    // Zero tolerance: the fp16 kernels round differently from the primitives.
    let r = run(&[
        "--verify",
        "--rtol",
        "0",
        "--atol",
        "0",
        testdata("llama_ts_op17_fp16.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", stderr(&r));
    assert!(stderr(&r).contains("verification FAILED") && stderr(&r).contains("not written"));
    assert!(!out.exists());
}

#[test]
fn verify_compares_any_two_models() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    assert!(run(&[
        "-q",
        "--passes",
        "default,skip-norm",
        testdata("bert_optimum.onnx").to_str().unwrap(),
        "-o",
        out.to_str().unwrap()
    ])
    .status
    .success());
    let json = dir.path().join("verify.json");
    let r = run(&[
        "verify",
        testdata("bert_optimum.onnx").to_str().unwrap(),
        out.to_str().unwrap(),
        "--dim",
        "batch_size=3",
        "--report-json",
        json.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", stderr(&r));
    let text = String::from_utf8(r.stdout.clone()).unwrap();
    assert!(text.starts_with("verification passed"), "{text}");
    assert!(text.contains("input_ids [3, 7]"), "{text}");
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let nodes: Vec<&str> = report["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    let first = "SkipLayerNormalization /encoder/layer.0/attention/output/LayerNorm/SkipLayerNormalization";
    assert!(nodes.contains(&first), "{nodes:?}");
    assert_eq!(nodes.len(), 9, "1 LayerNorm, 4 skip-norms, 2 attention cores and 2 GELUs, each run alone");
}

#[test]
fn a_missing_runtime_library_is_a_clear_error() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let model = testdata("llama_ts_op14.onnx");
    let r = run(&[
        "--verify",
        "--ort-lib",
        "/nonexistent/libonnxruntime.so",
        model.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains("pip install onnxruntime"), "{}", stderr(&r));
    // An active virtual environment comes before the checkout's library:
    // the (fake) one found there is the one loaded.
    let venv = dir.path().join("venv");
    let capi = venv.join("lib/python3.12/site-packages/onnxruntime/capi");
    fs::create_dir_all(&capi).unwrap();
    fs::write(capi.join("libonnxruntime.so.1.99.0"), "not a library").unwrap();
    let r = bin()
        .env_remove("ORT_DYLIB_PATH")
        .env("VIRTUAL_ENV", &venv)
        .args(["--verify", model.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains(&capi.join("libonnxruntime.so.1.99.0").display().to_string()), "{}", stderr(&r));
    // Without activation, the environment the binary is installed in
    // (`VENV/bin/onnx-fuse`, as CI scripts call it) comes next.
    let installed = dir.path().join("installed");
    let capi = installed.join("lib/python3.11/site-packages/onnxruntime/capi");
    fs::create_dir_all(&capi).unwrap();
    fs::create_dir_all(installed.join("bin")).unwrap();
    fs::write(capi.join("libonnxruntime.so.1.98.0"), "not a library").unwrap();
    let exe = installed.join("bin/onnx-fuse");
    fs::copy(env!("CARGO_BIN_EXE_onnx-fuse"), &exe).unwrap();
    let r = std::process::Command::new(&exe)
        .env_remove("ORT_DYLIB_PATH")
        .env_remove("VIRTUAL_ENV")
        .env_remove("CONDA_PREFIX")
        .args(["--verify", model.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(stderr(&r).contains(&capi.join("libonnxruntime.so.1.98.0").display().to_string()), "{}", stderr(&r));
    let not_a_library = dir.path().join("libonnxruntime.so");
    fs::write(&not_a_library, "not a library").unwrap();
    let r = bin()
        .env("ORT_DYLIB_PATH", &not_a_library)
        .args(["--verify", model.to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    assert!(stderr(&r).contains("cannot load ONNX Runtime"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn ops_the_cpu_lacks_are_verified_through_reference_functions() {
    for op in ["ComplexMul", "ComplexMulConj"] {
        let decomposed = testdata(&format!("complex_{op}_decomposed.onnx"));
        let fused = testdata(&format!("complex_{op}_op.onnx"));
        let r = run(&["verify", decomposed.to_str().unwrap(), fused.to_str().unwrap()]);
        let text = String::from_utf8(r.stdout.clone()).unwrap();
        assert!(r.status.success(), "{op}: {text}{}", stderr(&r));
        assert!(
            text.contains(&format!("computed by reference functions (the CPU provider lacks them): {op}")),
            "{text}"
        );
    }
    // The product against the conjugate product: the reference function really computes.
    let r = run(&[
        "verify",
        testdata("complex_ComplexMul_decomposed.onnx").to_str().unwrap(),
        testdata("complex_ComplexMulConj_op.onnx").to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(3));
}

#[test]
fn inputs_can_come_from_an_npz_file() {
    let inputs = testdata("llama_inputs.npz");
    let (_, report) = run_with_report("llama_ts_op14.onnx", &["-q", "--verify", "--inputs", inputs.to_str().unwrap()]);
    assert_eq!(report["verification"]["inputs"]["input_ids"], serde_json::json!([1, 7]));
    let dir = tempdir();
    let model = testdata("llama_ts_op14.onnx");
    let r = run(&[
        "--verify",
        "--inputs",
        testdata("llama_inputs_int32.npz").to_str().unwrap(),
        model.to_str().unwrap(),
        "-o",
        dir.path().join("o2.onnx").to_str().unwrap(),
    ]);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        stderr(&r).contains("llama_inputs_int32.npz: array input_ids: its dtype '<i4' does not match"),
        "{}",
        stderr(&r)
    );
}

#[test]
fn an_npz_with_no_array_is_a_usage_error() {
    let dir = tempdir();
    // An empty zip archive: its end-of-central-directory record alone.
    let empty = dir.path().join("empty.npz");
    let mut bytes = b"PK\x05\x06".to_vec();
    bytes.extend([0u8; 18]);
    std::fs::write(&empty, bytes).unwrap();
    let model = testdata("llama_ts_op14.onnx");
    let out = dir.path().join("o.onnx");
    let r =
        run(&["--verify", "--inputs", empty.to_str().unwrap(), model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    assert!(stderr(&r).contains("empty.npz: the .npz holds no array"), "{}", stderr(&r));
    assert!(!out.exists());
}

#[test]
fn verify_sizes_beyond_the_memory_are_a_usage_error_naming_the_input() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let model = testdata("gpt2_ts_op14.onnx");
    let r = run(&[model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--verify", "--dim", "batch=100000000000"]);
    assert_eq!(r.status.code(), Some(2), "{}", stderr(&r));
    let said = stderr(&r);
    assert!(said.contains("input input_ids would be int64[100000000000, 7] (5.6 TB), more than a quarter"), "{said}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(!out.exists());
}

#[test]
fn an_unwritable_report_is_refused_before_anything_is_written() {
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let model = testdata("llama_ts_op14.onnx");
    let not_a_folder = dir.path().join("file");
    std::fs::write(&not_a_folder, "x").unwrap();
    for (report, problem) in
        [(dir.path().join("missing/r.json"), "does not exist"), (not_a_folder.join("r.json"), "is not a folder")]
    {
        let r = run(&[model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", report.to_str().unwrap()]);
        assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
        let said = stderr(&r);
        assert!(
            said.contains(&format!(
                "(--report-json): cannot write: its folder {} {problem}",
                report.parent().unwrap().display()
            )),
            "{said}"
        );
        assert_eq!(said.matches(report.to_str().unwrap()).count(), 1, "{said}");
        assert!(!out.exists(), "nothing is written");
        // The same for a folder run, and for verify's report.
        let folder = testdata("t5_optimum_folder");
        let fused = dir.path().join("fused");
        let r =
            run(&[folder.to_str().unwrap(), "-o", fused.to_str().unwrap(), "--report-json", report.to_str().unwrap()]);
        assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
        assert!(!fused.exists(), "the output folder is not even made");
        let r = run(&[
            "verify",
            model.to_str().unwrap(),
            model.to_str().unwrap(),
            "--report-json",
            report.to_str().unwrap(),
        ]);
        assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
        assert!(stderr(&r).contains(problem), "{}", stderr(&r));
    }
}

/// A guard written against the version before skip-norm and gelu (13fdc48;
/// its counts in testdata/golden/counts_before_skip_norm.txt, written by
/// scripts/counts_of.sh) holds today on every testdata export: adding a
/// pass never lowers another pass's count.
#[test]
fn expectations_written_before_skip_norm_and_gelu_still_hold() {
    let known: Vec<&str> = onnx_fuse::passes::ALL.iter().map(|p| p.name).collect();
    let pipeline = onnx_fuse::passes::pipeline(&["default".to_string()], &[]).unwrap();
    let old = fs::read_to_string(testdata("golden/counts_before_skip_norm.txt")).unwrap();
    let mut checked = 0;
    for line in old.lines() {
        let (name, counts) = line.split_once(' ').unwrap();
        let mut model = load(name);
        let outcome = onnx_fuse::rewrite::run(&mut model, &pipeline);
        let report = onnx_fuse::report::Report::new(name.into(), "out.onnx".into(), &pipeline, outcome, false);
        for expected in counts.split(' ') {
            let e = onnx_fuse::report::Expectation::parse(expected, "exact", &known).unwrap();
            let c = e.check(&report.passes, report.total);
            assert!(c.met, "{name}: --expect {expected} written before skip-norm: {}", c.text());
            checked += 1;
        }
    }
    assert_eq!(checked, 306, "every pass of every export that version fused");
    // The guard, through the command line.
    let dir = tempdir();
    let out = dir.path().join("out.onnx");
    let t5 = testdata("t5_encoder_ts_op14.onnx");
    let r = run(&[t5.to_str().unwrap(), "-o", out.to_str().unwrap(), "--expect", "rms-norm=5,attention=2"]);
    assert_eq!(r.status.code(), Some(0), "{}", stderr(&r));
    assert!(stderr(&r).contains("fused 7 (layer-norm 0, rms-norm 5, attention 2, gelu 0, rotary 0)"), "{}", stderr(&r));
}

/// What users pipe: a reader that goes away (`| head -1`) ends the printing,
/// not the run (exit 0, the model written, no panic); a closed standard
/// error changes nothing; a full standard output is one clear error, exit 1.
#[test]
fn closed_and_full_output_streams_are_no_crash() {
    use std::process::Stdio;
    let dir = tempdir();
    let model = testdata("llama_ts_op14.onnx");
    let out = dir.path().join("out.onnx");
    let args = [model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report", "--explain"];
    for closed in ["stdout", "stderr"] {
        std::fs::remove_file(&out).ok();
        let mut cmd = bin();
        cmd.args(args);
        // The reading end is dropped at once: every write meets a closed pipe.
        if closed == "stdout" {
            cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        } else {
            cmd.stderr(Stdio::piped()).stdout(Stdio::null());
        }
        let mut child = cmd.spawn().unwrap();
        drop(child.stdout.take());
        drop(child.stderr.take());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{closed} closed");
        assert!(out.exists(), "{closed} closed: the model is written");
    }
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full (Linux)");
    let r = bin().args(args).stdout(full).output().unwrap();
    assert_eq!(r.status.code(), Some(1), "{}", stderr(&r));
    let said = stderr(&r);
    assert!(
        said.contains("onnx-fuse: error: cannot write to standard output") && !said.contains("internal error"),
        "{said}"
    );
}

/// `--report-json -` prints the JSON report to standard output (and writes
/// no file named `-`); with `--report` or `--explain`, which print there
/// too, it is a usage error.
#[test]
fn a_json_report_of_dash_goes_to_standard_output() {
    let dir = tempdir();
    let model = testdata("llama_ts_op14.onnx");
    let out = dir.path().join("out.onnx");
    let args = [model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--report-json", "-"];
    let r = bin().args(args).current_dir(dir.path()).output().unwrap();
    assert!(r.status.success(), "{}", stderr(&r));
    let report: serde_json::Value = serde_json::from_slice(&r.stdout).expect("JSON on standard output");
    assert!(!report["fused"].as_array().unwrap().is_empty());
    assert!(!dir.path().join("-").exists());
    for flag in ["--report", "--explain"] {
        let r = bin().args(args).arg(flag).current_dir(dir.path()).output().unwrap();
        assert_eq!(r.status.code(), Some(2), "{flag}: {}", stderr(&r));
        assert!(stderr(&r).contains(&format!("--report-json - and {flag} would both print")), "{}", stderr(&r));
    }
}
