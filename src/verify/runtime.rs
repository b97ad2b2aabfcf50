//! Finding ONNX Runtime's library, loading sessions from unnamed scratch files,
//! running them and reading their outputs back.

use super::*;

pub(super) const HOW_TO_GET_IT: &str =
    "pip install onnxruntime (its wheel ships libonnxruntime.so; onnx-fuse finds it in the active virtual \
     environment or through python3), or pass --ort-lib PATH or set ORT_DYLIB_PATH";

/// Where ONNX Runtime's library is, in order: `--ort-lib`, `ORT_DYLIB_PATH`,
/// the `onnxruntime` package of the active virtual environment
/// (`VIRTUAL_ENV`, `CONDA_PREFIX`), then of the one the binary is installed
/// in (`VENV/bin/onnx-fuse`), the checkout's `.ort/lib`
/// (`scripts/fetch-ort.sh`, for development; gone with the checkout), the
/// `onnxruntime` of the `python3` on PATH, the standard library
/// directories. Not found: the error lists what was tried.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        return existing(path.to_path_buf(), "--ort-lib");
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return existing(PathBuf::from(path), "ORT_DYLIB_PATH");
    }
    let mut tried = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        let Some(prefix) = std::env::var_os(var).filter(|p| !p.is_empty()) else { continue };
        tried.push(format!("{var} ({})", Path::new(&prefix).display()));
        if let Some(found) = environment_package(Path::new(&prefix)) {
            return Ok(found);
        }
    }
    // The environment this binary is installed in, called by its path
    // without activation (`VENV/bin/onnx-fuse`, what `pip install` made).
    let exe = std::env::current_exe().ok();
    if let Some(prefix) = exe.as_deref().and_then(Path::parent).and_then(Path::parent) {
        tried.push(format!("the environment onnx-fuse is installed in ({})", prefix.display()));
        if let Some(found) = environment_package(prefix) {
            return Ok(found);
        }
    }
    let mut fetched = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ort/lib/libonnxruntime.so")];
    if let Some(exe) = exe {
        // target/{debug,release}/onnx-fuse → the checkout's .ort/lib
        fetched.extend(exe.ancestors().skip(1).take(3).map(|dir| dir.join(".ort/lib/libonnxruntime.so")));
    }
    tried.push("the checkout's .ort/lib".into());
    if let Some(found) = fetched.into_iter().find(|p| p.is_file()) {
        return Ok(found);
    }
    tried.push("python3's onnxruntime".into());
    // Asked once per process: starting Python costs a second.
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    if let Some(found) = PYTHON.get_or_init(python_package_library) {
        return Ok(found.clone());
    }
    let standard =
        ["/usr/local/lib", "/usr/lib", "/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"];
    tried.push(standard.join(", "));
    if let Some(found) = standard.iter().map(|d| Path::new(d).join("libonnxruntime.so")).find(|p| p.is_file()) {
        return Ok(found);
    }
    bail!("the ONNX Runtime library (libonnxruntime.so) was not found (tried {}); {HOW_TO_GET_IT}", tried.join("; "))
}

pub(super) fn existing(path: PathBuf, from: &str) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("{}: the ONNX Runtime library named by {from} does not exist; {HOW_TO_GET_IT}", path.display())
    }
}

/// `libonnxruntime.so*` of the `onnxruntime` package installed under an
/// environment's prefix (`lib/python3.*/site-packages/onnxruntime/capi`).
fn environment_package(prefix: &Path) -> Option<PathBuf> {
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(prefix.join("lib"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")))
        .collect();
    pythons.sort();
    pythons.into_iter().rev().find_map(|python| newest_library(&python.join("site-packages/onnxruntime/capi")))
}

/// The newest `libonnxruntime.so*` in `dir`.
fn newest_library(dir: &Path) -> Option<PathBuf> {
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so")))
        .collect();
    libs.sort();
    libs.pop()
}

pub(super) fn python_package_library() -> Option<PathBuf> {
    let out = std::process::Command::new("python3")
        .args(["-c", "import onnxruntime, os; print(os.path.dirname(onnxruntime.__file__))"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    newest_library(&PathBuf::from(String::from_utf8(out.stdout).ok()?.trim()).join("capi"))
}

/// The one ONNX Runtime environment of this process.
pub(super) fn environment(library: &Path) -> Result<&'static ort::environment::Environment> {
    static ENV: OnceLock<std::result::Result<ort::environment::Environment, String>> = OnceLock::new();
    let env = ENV.get_or_init(|| {
        // ONNX Runtime 1.31.1 opens an event store under ~/.cache as it
        // loads, before telemetry can be turned off through its API; its
        // variable keeps it from starting. A verification writes nothing
        // outside the run's files and sends nothing.
        if std::env::var_os("ORT_DISABLE_TELEMETRY").is_none() {
            std::env::set_var("ORT_DISABLE_TELEMETRY", "1");
        }
        let builder =
            ort::init_from(library).map_err(|e| format!("{}: cannot load ONNX Runtime: {e}", library.display()))?;
        builder
            .with_name("onnx-fuse")
            .with_telemetry(false)
            .build()
            .map_err(|e| format!("cannot start ONNX Runtime: {e}"))
    });
    env.as_ref().map_err(|e| anyhow!("{e}"))
}

/// Runs `model` (its copy, with `probe` exposed as outputs and CPU-less ops
/// replaced by reference functions) on `feeds`; returns every output.
pub(super) fn run(
    env: &ort::environment::Environment,
    model: &ModelProto,
    dir: &Path,
    which: &str,
    probe: &[String],
    feeds: Vec<(String, DynValue)>,
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<HashMap<String, Values>> {
    let mut session = load(env, model, dir, which, probe, reference_ops)?;
    run_session(&mut session, which, feeds)
}

/// A session of `model` (its copy, with `probe` exposed as outputs and
/// CPU-less ops replaced by reference functions).
pub(super) fn load(
    env: &ort::environment::Environment,
    model: &ModelProto,
    dir: &Path,
    which: &str,
    probe: &[String],
    reference_ops: &mut std::collections::BTreeSet<String>,
) -> Result<Session> {
    let mut copy = model.clone();
    expose(&mut copy, probe);
    reference_ops.extend(reference::substitute(&mut copy));
    let folder = dir.to_string_lossy();
    let mut builder = Session::builder(env)
        .map_err(|e| anyhow!("{e}"))?
        .with_optimization_level(GraphOptimizationLevel::Disable)
        // Errors come back in the Result; ONNX Runtime's own log would repeat them.
        .and_then(|b| b.with_log_level(ort::logging::LogLevel::Fatal))
        .and_then(|b| b.with_config_entry("session.model_external_initializers_file_folder_path", folder))
        .map_err(|e| anyhow!("{e}"))?;
    // ONNX Runtime streams the model from an unnamed scratch file (its
    // external data resolves in `folder`, set above), so the process never
    // holds an encoded copy and nothing is written beside the user's model;
    // from memory where the system offers no unnamed file or it cannot be
    // written (a full disk).
    let scratch =
        crate::io::Scratch::unnamed().and_then(|mut s| crate::io::encode_to(&copy, &mut s.file).ok().map(|()| s));
    let loaded = match &scratch {
        // The scratch file's name means nothing to the user.
        Some(s) => builder
            .commit_from_file(&s.path)
            .map_err(|e| e.to_string().replace(&*s.path.to_string_lossy(), "the model")),
        None => builder.commit_from_memory(&crate::io::encode_to_vec(&copy)).map_err(|e| e.to_string()),
    };
    loaded.map_err(|e| anyhow!("ONNX Runtime cannot load the {which} model: {e}"))
}

/// Runs a session on `feeds`; returns every output.
pub(super) fn run_session(
    session: &mut Session,
    which: &str,
    feeds: Vec<(String, DynValue)>,
) -> Result<HashMap<String, Values>> {
    // An output declared other than a tensor (an optional, a sequence, a
    // map) is not compared, and is refused before the run: ONNX Runtime
    // 1.31.1 hands an absent optional value back to the ort crate in a way
    // that crashes the process (ONNX's test_if_opt), where no panic can be
    // caught.
    if let Some(output) = session.outputs().iter().find(|o| !matches!(o.dtype(), ValueType::Tensor { .. })) {
        bail!("a non-tensor output cannot be compared yet (the {which} model's output {})", output.name());
    }
    // The ort crate panics on an output ONNX Runtime returns without a type
    // (an absent optional value, seen from a Loop): an error, not a crash.
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<HashMap<String, Values>> {
        let outputs = session.run(feeds).map_err(|e| anyhow!("ONNX Runtime cannot run the {which} model: {e}"))?;
        let mut values = HashMap::new();
        for (name, value) in outputs.iter() {
            values.insert(name.to_string(), Values::read(&value)?);
        }
        Ok(values)
    }));
    read.unwrap_or_else(|_| {
        bail!("ONNX Runtime returned an output of the {which} model without a type (an absent value)")
    })
}

/// An output read back as f64 (exact for every type compared here).
pub(super) struct Values {
    pub(super) elem_type: i32,
    pub(super) shape: Vec<i64>,
    pub(super) data: Vec<f64>,
}

impl Values {
    pub(super) fn read(value: &ort::value::DynValueRef<'_>) -> Result<Values> {
        let ValueType::Tensor { ty, .. } = value.dtype() else { bail!("a non-tensor output cannot be compared yet") };
        macro_rules! read {
            ($t:ty, $onnx:expr, $conv:expr) => {{
                let (shape, data) = value.try_extract_tensor::<$t>().map_err(|e| anyhow!("{e}"))?;
                // Fallible: a value too large to read back is an error, not an abort.
                let mut read = Vec::new();
                read.try_reserve_exact(data.len())
                    .map_err(|_| anyhow!("a value of {} elements does not fit in memory to be compared", data.len()))?;
                read.extend(data.iter().map($conv));
                Values { elem_type: $onnx as i32, shape: shape.to_vec(), data: read }
            }};
        }
        Ok(match ty {
            TensorElementType::Float32 => read!(f32, DataType::Float, |v| *v as f64),
            TensorElementType::Float16 => read!(half::f16, DataType::Float16, |v| v.to_f64()),
            TensorElementType::Bfloat16 => read!(half::bf16, DataType::Bfloat16, |v| v.to_f64()),
            TensorElementType::Float64 => read!(f64, DataType::Double, |v| *v),
            TensorElementType::Int64 => read!(i64, DataType::Int64, |v| *v as f64),
            TensorElementType::Int32 => read!(i32, DataType::Int32, |v| *v as f64),
            TensorElementType::Bool => read!(bool, DataType::Bool, |v| *v as u8 as f64),
            TensorElementType::Int8 => read!(i8, DataType::Int8, |v| *v as f64),
            TensorElementType::Uint8 => read!(u8, DataType::Uint8, |v| *v as f64),
            TensorElementType::Int16 => read!(i16, DataType::Int16, |v| *v as f64),
            TensorElementType::Uint16 => read!(u16, DataType::Uint16, |v| *v as f64),
            TensorElementType::Uint32 => read!(u32, DataType::Uint32, |v| *v as f64),
            // (Exact below 2^53, as int64 is.)
            TensorElementType::Uint64 => read!(u64, DataType::Uint64, |v| *v as f64),
            other => bail!("outputs of type {other:?} cannot be compared yet"),
        })
    }
}
