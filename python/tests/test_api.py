"""onnx_fuse's API: the report, every exception class, folders, ModelProto
in and out, and `python -m onnx_fuse`."""

import base64
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx_fuse

LLAMA = "llama_ts_op14.onnx"


def shown(report):
    """What `show` lists of a fused model: the report's entries without the
    pass and the run's note (neither is in the model), in graph order (the
    report has them in the order made)."""
    return sorted(
        ({k: v for k, v in f.items() if k not in ("pass", "note")} for f in report["fused"]), key=lambda f: f["name"]
    )


def test_the_binary_is_the_wheels_own():
    path = Path(onnx_fuse.binary())
    assert path.parent == Path(sysconfig.get_paths()["scripts"]), path
    # The file pip installed, byte for byte: its hash is the wheel's RECORD entry.
    entries = [f for f in importlib.metadata.files("onnx-fuse") if f.name == "onnx-fuse"]
    assert len(entries) == 1, entries
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
    assert entries[0].hash.mode == "sha256" and entries[0].hash.value == digest
    assert Path(entries[0].locate()).resolve() == path.resolve()
    version = subprocess.run([str(path), "--version"], capture_output=True, text=True).stdout
    assert version == f"onnx-fuse {onnx_fuse.__version__}\n"


def test_python_m_runs_the_binary():
    help = subprocess.run([sys.executable, "-m", "onnx_fuse", "--help"], capture_output=True, text=True)
    assert help.returncode == 0, help.stderr
    assert help.stdout.startswith("Exact fusion passes for ONNX transformer exports\n\nUsage: onnx-fuse ")
    usage = subprocess.run([sys.executable, "-m", "onnx_fuse", "x.onnx", "-o", "y.onnx", "--passes", "nope"],
                           capture_output=True, text=True)
    assert usage.returncode == 2 and 'unknown pass "nope"' in usage.stderr, usage.stderr


def test_verify_uses_this_environments_onnxruntime():
    library = onnx_fuse._onnxruntime_library()
    assert library is not None and Path(library).resolve().is_relative_to(Path(sys.prefix).resolve()), library


def test_the_installed_binary_verifies_without_activation(testdata, tmp_path):
    """CI scripts call `VENV/bin/onnx-fuse` (or `VENV/bin/python -m onnx_fuse`)
    by path, the environment not activated: the binary still finds this
    environment's onnxruntime, and nothing else offers one."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "ORT_DYLIB_PATH")}
    env["PATH"] = str(tmp_path)  # no python3 on PATH whose onnxruntime could be found instead
    for command in ([onnx_fuse.binary()], [sys.executable, "-m", "onnx_fuse"]):
        out = tmp_path / "out.onnx"
        run = subprocess.run(command + [str(testdata(LLAMA)), "-o", str(out), "--verify", "-q"],
                             capture_output=True, text=True, env=env, cwd=tmp_path)
        assert run.returncode == 0, (command, run.stderr)
        assert out.exists()
        out.unlink()


def test_fuse_returns_the_report_and_prints_nothing(testdata, tmp_path, capfd):
    out = tmp_path / "out.onnx"
    report = onnx_fuse.fuse(testdata(LLAMA), out)
    assert capfd.readouterr() == ("", "")
    counts = {p["name"]: p["fused"] for p in report["passes"]}
    # The default pipeline (skip-norm is on request): the model is upgraded
    # to opset 23 for its attention and rotary kernels.
    assert counts == {"layer-norm": 0, "rms-norm": 5, "attention": 2, "gelu": 2, "rotary": 4}
    assert {p["name"]: p["in_output"] for p in report["passes"]}["rms-norm"] == 5
    assert report["written"] is True and report["output"] == str(out) and "verification" not in report
    assert len(report["fused"]) == 13 == report["total"]
    assert (report["upgrade"]["from"], report["upgrade"]["to"]) == (14, 23)
    # A pass's count is what it fused, also where skip-norm (asked for) took it in.
    report = onnx_fuse.fuse(testdata(LLAMA), out, passes=["default", "skip-norm"])
    counts = {p["name"]: p["fused"] for p in report["passes"]}
    assert counts == {"layer-norm": 0, "rms-norm": 5, "skip-norm": 4, "attention": 2, "gelu": 2, "rotary": 4}
    assert [a["by"] for a in report["absorbed"]] == ["skip-norm"] * 4
    # show reads the same entries back from the written model.
    assert sorted(onnx_fuse.show(out), key=lambda f: f["name"]) == shown(report)
    assert onnx_fuse.show(testdata(LLAMA)) == []


def test_options_reach_the_command_line(testdata, tmp_path):
    out = tmp_path / "out.onnx"
    report = onnx_fuse.fuse(testdata(LLAMA), out, passes=["rms-norm"], explain=True)
    assert [p["name"] for p in report["passes"]] == ["rms-norm"]
    report = onnx_fuse.fuse(testdata(LLAMA), out, disable="gelu,attention,skip-norm", target="portable")
    assert [p["name"] for p in report["passes"]] == ["layer-norm", "rms-norm", "rotary"]
    assert report["target"] == "portable"
    assert report["needs_opset"] == {"candidates": 9, "opset": 23}
    report = onnx_fuse.fuse(testdata(LLAMA), out, target="portable", opset=23, verify=True)
    assert (report["upgrade"]["from"], report["upgrade"]["to"]) == (14, 23) and "needs_opset" not in report
    assert sorted(f["op_type"] for f in report["fused"]) == ["RMSNormalization"] * 5 + ["RotaryEmbedding"] * 4
    assert report["verification"]["passed"] is True
    report = onnx_fuse.fuse(testdata(LLAMA), tmp_path / "apart.onnx", external_data=True)
    assert report["weights"] == str(tmp_path / "apart.onnx.data")
    whole = onnx_fuse.fuse(testdata(LLAMA), tmp_path / "whole.onnx")
    assert "weights" not in whole
    apart = (tmp_path / "apart.onnx").stat().st_size
    assert apart + 64 * 1024 < (tmp_path / "whole.onnx").stat().st_size <= apart + (tmp_path / "apart.onnx.data").stat().st_size


def test_verify_with_dims_and_arrays(testdata, tmp_path):
    out = tmp_path / "out.onnx"
    report = onnx_fuse.fuse(testdata(LLAMA), out, verify=True, dims={"batch": 1, "seq": 7},
                            expect_min={"rms-norm": 1, "total": 5})
    assert report["verification"]["passed"] is True
    assert report["verification"]["inputs"]["input_ids"] == [1, 7]
    assert all(e["met"] for e in report["expectations"])
    ids = np.arange(14, dtype=np.int64).reshape(2, 7)
    report = onnx_fuse.fuse(testdata(LLAMA), out, verify=True, seed=3,
                            inputs={"input_ids": ids, "attention_mask": np.ones_like(ids)})
    assert report["verification"]["inputs"]["input_ids"] == [2, 7]
    check = onnx_fuse.verify(testdata(LLAMA), out)
    assert check["passed"] is True and check["nodes"]


def test_error_on_bad_input(testdata, tmp_path):
    with pytest.raises(onnx_fuse.Error) as e:
        onnx_fuse.fuse(testdata("MANIFEST.json"), tmp_path / "out.onnx")
    assert type(e.value) is onnx_fuse.Error and e.value.exit_code == 1
    assert e.value.message.startswith("onnx-fuse: error: ") and "not an ONNX model" in str(e.value)
    assert "\n" not in e.value.message and e.value.report is None
    assert not (tmp_path / "out.onnx").exists()


def test_usage_errors(testdata, tmp_path):
    for kwargs, said in [
        (dict(passes="nope"), 'unknown pass "nope"'),
        (dict(rtol=0.1), "--rtol is an option of --verify"),
        (dict(expect={"rms-norm": 1}, expect_min={"rms-norm": 2}), "contradicts"),
        (dict(opset=12), "never downgrades"),
        (dict(opset=27), "runs opsets 1 to 26"),
    ]:
        with pytest.raises(onnx_fuse.UsageError) as e:
            onnx_fuse.fuse(testdata(LLAMA), tmp_path / "out.onnx", **kwargs)
        assert e.value.exit_code == 2 and said in e.value.message, (kwargs, e.value.message)
    with pytest.raises(onnx_fuse.UsageError):
        onnx_fuse.fuse(testdata(LLAMA))  # no output, no return_model
    assert issubclass(onnx_fuse.UsageError, onnx_fuse.Error)


def test_verification_failed_carries_the_failing_nodes(testdata, tmp_path):
    out = tmp_path / "out.onnx"
    # Zero tolerance: the fp16 kernels round differently from the primitives.
    with pytest.raises(onnx_fuse.VerificationFailed) as e:
        onnx_fuse.fuse(testdata("llama_ts_op17_fp16.onnx"), out, verify=True, rtol=0, atol=0)
    assert e.value.exit_code == 3 and "not written" in e.value.message
    assert e.value.report["written"] is False and e.value.verification["passed"] is False
    assert e.value.failed_nodes and all(not n["passed"] for n in e.value.failed_nodes)
    assert {n["node"] for n in e.value.failed_nodes} <= {f"{f['op_type']} {f['name']}" for f in e.value.report["fused"]}
    assert not out.exists()


def test_verify_raises_on_a_different_model(testdata, tmp_path):
    model = onnx.load(str(testdata(LLAMA)))
    weight = next(t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims)
    values = onnx.numpy_helper.to_array(weight) + 1
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    with pytest.raises(onnx_fuse.VerificationFailed) as e:
        onnx_fuse.verify(testdata(LLAMA), model)
    assert e.value.verification["passed"] is False and e.value.failed_outputs


def test_expectation_not_met_says_what_and_writes(testdata, tmp_path):
    out = tmp_path / "out.onnx"
    with pytest.raises(onnx_fuse.ExpectationNotMet) as e:
        onnx_fuse.fuse(testdata(LLAMA), out, expect={"rms-norm": 9, "attention": 2})
    assert e.value.exit_code == 4 and e.value.message == "onnx-fuse: expectation not met: rms-norm: expected 9, found 5"
    assert e.value.expected == {"rms-norm": 9} and e.value.found == {"rms-norm": 5}
    assert out.exists() and e.value.report["written"] is True


def test_folders(testdata, tmp_path):
    out = tmp_path / "fused"
    report = onnx_fuse.fuse(testdata("t5_optimum_folder"), out, expect={"encoder_model.onnx:attention": 2})
    assert [f["input"].rsplit("/", 1)[-1] for f in report["files"]] == [
        "decoder_model.onnx", "decoder_with_past_model.onnx", "encoder_model.onnx"]
    assert report["carried"] == ["config.json", "generation_config.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in testdata("t5_optimum_folder").iterdir())
    with pytest.raises(onnx_fuse.ExpectationNotMet) as e:
        onnx_fuse.fuse(testdata("t5_optimum_folder"), tmp_path / "again", expect={"encoder_model.onnx:attention": 7})
    assert e.value.expected == {"encoder_model.onnx:attention": 7} and e.value.found == {"encoder_model.onnx:attention": 2}
    with pytest.raises(onnx_fuse.UsageError):
        onnx_fuse.fuse(testdata("t5_optimum_folder"), return_model=True)


def test_model_proto_in_and_out(testdata, tmp_path):
    original = onnx.load(str(testdata(LLAMA)))
    fused, report = onnx_fuse.fuse(original, return_model=True, verify=True)
    assert isinstance(fused, onnx.ModelProto) and report["verification"]["passed"]
    assert sum(n.op_type == "SimplifiedLayerNormalization" for n in fused.graph.node) == 5
    assert sorted(onnx_fuse.show(fused), key=lambda f: f["name"]) == shown(report)
    # Written too, when an output is given.
    _, report = onnx_fuse.fuse(original, tmp_path / "out.onnx", return_model=True)
    assert (tmp_path / "out.onnx").exists() and report["output"] == str(tmp_path / "out.onnx")


def test_model_proto_with_external_data(testdata, tmp_path):
    # The fused model comes back with its external data loaded, and no file stays behind.
    fused, report = onnx_fuse.fuse(testdata("external/model.onnx"), return_model=True)
    assert report["written"] and os.path.basename(report["output"]) == "model.onnx"
    assert not Path(report["output"]).exists()
    external = [t for t in fused.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external == [] and any(t.raw_data for t in fused.graph.initializer)
    # And a ModelProto holding that data goes in whole.
    loaded = onnx.load(str(testdata("external/model.onnx")))
    again, _ = onnx_fuse.fuse(loaded, return_model=True)
    assert again.graph.node == fused.graph.node


def test_not_a_model():
    with pytest.raises(TypeError):
        onnx_fuse.fuse(42, "out.onnx")
