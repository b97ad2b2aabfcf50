"""onnx-fuse from Python: exact fusion passes for ONNX transformer exports.

The functions here run the ``onnx-fuse`` binary this package installed (never
another one on ``PATH``) and return what its JSON report holds
(docs/report-json.md). They read like the command line::

    import onnx_fuse
    report = onnx_fuse.fuse("model.onnx", "out.onnx", verify=True)
    report["passes"], report["total"], report["fused"]

``report["passes"]`` says what each pass fused, those nodes a later pass
took into its own included (``in_output``, ``absorbed``); ``report["total"]``
is the number of fused nodes in the output.

A failed run raises :class:`Error` (exit code 1), :class:`UsageError` (2),
:class:`VerificationFailed` (3) or :class:`ExpectationNotMet` (4), each with
the tool's own one-line message and, where the run wrote one, its report.

Only the standard library is needed. ``onnx`` is needed to pass or return an
``onnx.ModelProto``, ``numpy`` to pass inputs as arrays, and ONNX Runtime
(``pip install onnx-fuse[verify]``) for ``verify``.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:  # pragma: no cover
    import onnx

__all__ = [
    "__version__",
    "fuse",
    "show",
    "verify",
    "binary",
    "Error",
    "UsageError",
    "VerificationFailed",
    "ExpectationNotMet",
]

try:
    __version__ = importlib.metadata.version("onnx-fuse")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover (not installed)
    __version__ = "unknown"

PathLike = Union[str, "os.PathLike[str]"]
Model = Union[PathLike, "onnx.ModelProto"]
Report = Dict[str, Any]


class Error(Exception):
    """onnx-fuse failed: unreadable or invalid input, cannot write, ONNX
    Runtime missing or refusing a model (exit code 1).

    ``message`` is the tool's own line, ``report`` the JSON report where the
    run wrote one (else ``None``), ``exit_code`` the tool's exit code.
    """

    exit_code = 1

    def __init__(self, message: str, report: Optional[Report] = None, stderr: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.report = report
        self.stderr = stderr


class UsageError(Error):
    """Bad arguments: an unknown pass, a path the run would both read and
    write, verification options without ``verify=True`` … (exit code 2)."""

    exit_code = 2


class VerificationFailed(Error):
    """ONNX Runtime found a difference between the original and the fused
    model (exit code 3); ``fuse`` then writes no output."""

    exit_code = 3

    @property
    def verification(self) -> Optional[Report]:
        """The report's ``verification`` object."""
        if self.report is None:
            return None
        return self.report.get("verification", self.report)

    @property
    def failed_nodes(self) -> List[Report]:
        """The fused nodes that differed, each as compared (worst first)."""
        v = self.verification or {}
        return [n for n in v.get("nodes", []) if not n.get("passed", True)]

    @property
    def failed_outputs(self) -> List[Report]:
        """The graph outputs that differed."""
        v = self.verification or {}
        return [o for o in v.get("outputs", []) if not o.get("passed", True)]


class ExpectationNotMet(Error):
    """An ``expect`` or ``expect_min`` count was not met (exit code 4); the
    output is written."""

    exit_code = 4

    @property
    def unmet(self) -> List[Report]:
        """Every expectation not met: ``pass``, ``kind``, ``expected``,
        ``found`` (and ``file`` in a folder)."""
        if self.report is None:
            return []
        return [e for e in self.report.get("expectations", []) if not e.get("met", True)]

    @property
    def expected(self) -> Dict[str, int]:
        """What was expected, by pass (``FILE:PASS`` for one file of a folder)."""
        return {_key(e): e["expected"] for e in self.unmet}

    @property
    def found(self) -> Dict[str, int]:
        """What was found, by pass, for the expectations not met."""
        return {_key(e): e["found"] for e in self.unmet}


_ERRORS = {1: Error, 2: UsageError, 3: VerificationFailed, 4: ExpectationNotMet}


def _key(expectation: Mapping[str, Any]) -> str:
    file = expectation.get("file")
    return f"{file}:{expectation['pass']}" if file else expectation["pass"]


def binary() -> str:
    """The path of the ``onnx-fuse`` binary this package installed.

    It is looked for where pip put the package's scripts: the scripts
    directory of the environment (or user site, or ``--target`` folder) that
    holds this package. A binary elsewhere on ``PATH`` is never used.
    """
    name = "onnx-fuse.exe" if os.name == "nt" else "onnx-fuse"
    package_root = Path(__file__).resolve().parent.parent
    tried = []
    for scheme in sysconfig.get_scheme_names():  # venv, prefix, user, distribution schemes
        paths = sysconfig.get_paths(scheme)
        if package_root in {Path(paths[k]).resolve() for k in ("purelib", "platlib") if k in paths}:
            tried.append(Path(paths["scripts"]) / name)
    tried.append(package_root / "bin" / name)  # pip install --target DIR
    for path in tried:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise Error(
        "onnx-fuse: error: the onnx-fuse binary of this package is missing (looked at "
        + ", ".join(str(p) for p in tried)
        + "); reinstall it: pip install --force-reinstall onnx-fuse"
    )


def fuse(
    model: Model,
    output: Optional[PathLike] = None,
    *,
    passes: Union[None, str, Sequence[str]] = None,
    disable: Union[str, Sequence[str]] = (),
    target: str = "ort",
    opset: Optional[int] = None,
    verify: bool = False,
    expect: Optional[Mapping[str, int]] = None,
    expect_min: Optional[Mapping[str, int]] = None,
    dims: Optional[Mapping[str, int]] = None,
    inputs: Union[None, PathLike, Mapping[str, Any]] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    seed: Optional[int] = None,
    ort_lib: Optional[PathLike] = None,
    explain: bool = False,
    allow_unknown_fields: bool = False,
    link_external_data: bool = False,
    external_data: bool = False,
    cleanup: bool = True,
    return_model: bool = False,
) -> Union[Report, Tuple["onnx.ModelProto", Report]]:
    """Fuse ``model`` into ``output`` and return the JSON report.

    ``model`` is an ``.onnx`` file, an export folder (every ``.onnx`` file in
    it, subfolders included, each fused into the same place under ``output``,
    which is then a folder, and the report the folder's),
    or an ``onnx.ModelProto``. The arguments are the command line's:
    ``passes`` (names, or ``"default"``; ``None`` runs the default pipeline),
    ``disable``, ``target`` (``"ort"`` or ``"portable"``), ``opset`` (upgrade
    the default domain to that opset first, exactly, or raise), ``verify`` (prove
    the rewrite through ONNX Runtime before writing), ``expect`` and
    ``expect_min`` (``{"rms-norm": 5}``; ``"total"`` for the sum, and
    ``"FILE:PASS"`` for one file of a folder), and for verification ``dims``
    (``{"batch": 1}``), ``inputs`` (an ``.npz`` path, or arrays by input
    name), ``rtol``, ``atol``, ``seed`` and ``ort_lib``. ``cleanup=False`` is
    ``--no-cleanup``: no exact cleanup after the passes (docs/cleanup.md).

    With ``return_model=True`` the result is ``(fused_model, report)``, the
    model loaded with its external data; ``output`` may then be omitted, and
    the model is written to a temporary folder that is removed afterwards.
    """
    if output is None and not return_model:
        raise UsageError("onnx-fuse: usage error: fuse needs an output path (or return_model=True)")
    with tempfile.TemporaryDirectory(prefix="onnx-fuse-") as scratch:
        scratch_dir = Path(scratch)
        source = _model_path(model, scratch_dir / "in")
        if return_model and source.is_dir():
            raise UsageError("onnx-fuse: usage error: return_model=True is for one model, not a folder")
        if output is None:
            (scratch_dir / "out").mkdir()
            output = scratch_dir / "out" / "model.onnx"
        args = [str(source), "-o", str(output)]
        if passes is not None:
            args += ["--passes", _names(passes)]
        if disable:
            args += ["--disable", _names(disable)]
        args += ["--target", target]
        if opset is not None:
            args += ["--opset", str(_whole(opset, "opset"))]
        for flag, counts in (("--expect", expect), ("--expect-min", expect_min)):
            if counts:
                args += [flag, ",".join(f"{k}={_whole(v, flag)}" for k, v in counts.items())]
        if explain:
            args.append("--explain")
        if allow_unknown_fields:
            args.append("--allow-unknown-fields")
        if link_external_data:
            args.append("--link-external-data")
        if external_data:
            args.append("--external-data")
        if not cleanup:
            args.append("--no-cleanup")
        if verify:
            args.append("--verify")
        args += _verify_args(dims, inputs, rtol, atol, seed, ort_lib, scratch_dir)
        report = _run(args, scratch_dir, verify)
        if not return_model:
            return report
        import onnx

        return onnx.load(str(output)), report


def verify(
    original: Model,
    rewritten: Model,
    *,
    dims: Optional[Mapping[str, int]] = None,
    inputs: Union[None, PathLike, Mapping[str, Any]] = None,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    seed: Optional[int] = None,
    ort_lib: Optional[PathLike] = None,
    allow_unknown_fields: bool = False,
) -> Report:
    """Run two models through ONNX Runtime on the same inputs and compare
    them (``onnx-fuse verify``); return the report's ``verification`` object.

    The fused nodes of ``rewritten`` are also run alone. A difference raises
    :class:`VerificationFailed`, whose ``report`` is that object.
    """
    with tempfile.TemporaryDirectory(prefix="onnx-fuse-") as scratch:
        scratch_dir = Path(scratch)
        a = _model_path(original, scratch_dir / "original")
        b = _model_path(rewritten, scratch_dir / "rewritten")
        args = ["verify", str(a), str(b)]
        if allow_unknown_fields:
            args.append("--allow-unknown-fields")
        args += _verify_args(dims, inputs, rtol, atol, seed, ort_lib, scratch_dir)
        return _run(args, scratch_dir, True, quiet=False)


def show(model: Model, *, allow_unknown_fields: bool = False) -> List[Report]:
    """The fused nodes a model contains, read from their ``transmuter.fused``
    entries: ``op_type``, ``name``, ``graph`` and ``replaced`` each, as the
    report's ``fused`` entries (without ``pass``). No fused nodes: ``[]``."""
    with tempfile.TemporaryDirectory(prefix="onnx-fuse-") as scratch:
        path = _model_path(model, Path(scratch) / "model")
        args = ["show", str(path), "--json"]
        if allow_unknown_fields:
            args.append("--allow-unknown-fields")
        done = _call(args, needs_runtime=False)
        _raise_for(done, None)
        return json.loads(done.stdout)


def _model_path(model: Model, folder: Path) -> Path:
    """A path for ``model``: itself, or a ModelProto saved into ``folder``
    (with external data once it is too large for one protobuf)."""
    if isinstance(model, (str, os.PathLike)):
        return Path(model)
    if type(model).__name__ != "ModelProto":
        raise TypeError(f"a model is a path or an onnx.ModelProto, not {type(model).__name__}")
    import onnx

    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    large = model.ByteSize() > 2**31 - 2**20 if hasattr(model, "ByteSize") else False
    onnx.save_model(model, str(path), save_as_external_data=large, location="model.onnx_data")
    return path


def _verify_args(
    dims: Optional[Mapping[str, int]],
    inputs: Union[None, PathLike, Mapping[str, Any]],
    rtol: Optional[float],
    atol: Optional[float],
    seed: Optional[int],
    ort_lib: Optional[PathLike],
    scratch: Path,
) -> List[str]:
    args: List[str] = []
    for name, value in (dims or {}).items():
        args += ["--dim", f"{name}={_whole(value, '--dim')}"]
    if inputs is not None:
        if isinstance(inputs, (str, os.PathLike)):
            args += ["--inputs", str(inputs)]
        else:
            import numpy

            path = scratch / "inputs.npz"
            numpy.savez(str(path), **{k: numpy.asarray(v) for k, v in inputs.items()})
            args += ["--inputs", str(path)]
    for flag, value in (("--rtol", rtol), ("--atol", atol), ("--seed", seed)):
        if value is not None:
            args += [flag, str(value)]
    if ort_lib is not None:
        args += ["--ort-lib", str(ort_lib)]
    return args


def _names(names: Union[str, Sequence[str]]) -> str:
    return names if isinstance(names, str) else ",".join(names)


def _whole(value: Any, flag: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"onnx-fuse: usage error: {flag} takes whole numbers, not {value!r}")
    return value


def _run(args: List[str], scratch: Path, needs_runtime: bool, quiet: bool = True) -> Report:
    """Run the binary with a JSON report in ``scratch``; return the report or
    raise the error its exit code means."""
    path = scratch / "report.json"
    # `verify` prints its comparison, and nothing else; `-q` is a fuse option.
    done = _call(args + (["-q"] if quiet else []) + ["--report-json", str(path)], needs_runtime)
    report = json.loads(path.read_text()) if path.is_file() else None
    _raise_for(done, report)
    if report is None:
        raise Error(f"onnx-fuse: error: the run wrote no report ({done.stderr.strip()})", None, done.stderr)
    return report


def _call(args: List[str], needs_runtime: bool) -> "subprocess.CompletedProcess[str]":
    env = os.environ.copy()
    if needs_runtime and "ORT_DYLIB_PATH" not in env and "--ort-lib" not in args:
        library = _onnxruntime_library()
        if library is not None:
            env["ORT_DYLIB_PATH"] = library
    return subprocess.run([binary()] + args, capture_output=True, text=True, env=env, check=False)


def _onnxruntime_library() -> Optional[str]:
    """The ``libonnxruntime`` of the ``onnxruntime`` package this interpreter
    imports, found without importing it (an unactivated virtual environment
    is not in ``VIRTUAL_ENV``, so the binary would not look there)."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        capi = Path(location) / "capi"
        for pattern in ("libonnxruntime.so*", "libonnxruntime*.dylib", "onnxruntime.dll"):
            for candidate in sorted(capi.glob(pattern)):
                if candidate.is_file():
                    return str(candidate)
    return None


def _raise_for(done: "subprocess.CompletedProcess[str]", report: Optional[Report]) -> None:
    if done.returncode == 0:
        return
    lines = [line for line in done.stderr.splitlines() if line.startswith("onnx-fuse: ")]
    if not lines and done.returncode == 3:
        lines = [line for line in done.stdout.splitlines() if "FAILED" in line][:1]
    message = "; ".join(lines) or done.stderr.strip() or f"onnx-fuse exited with code {done.returncode}"
    kind = _ERRORS.get(done.returncode, Error)
    raise kind(message, report, done.stderr)
