//! One run of the tool: a model file, or an export folder of them. Loads,
//! checks every path before writing, fuses, verifies, writes, and says what
//! happened; `main` only parses arguments and prints.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::io::{self, ExternalData, LoadOptions, Role};
use crate::report::{self, Checked, Expectation, Report};
use crate::rewrite::{self, Pass};
use crate::verify;

use crate::usage::internal_error;
pub use crate::usage::{panic_message, Usage};

/// Debug builds panic on the model named by `ONNX_FUSE_PANIC_ON` (tests of
/// what a bug does to a folder run); release builds have no such hook.
fn fault_for_tests(name: &str) {
    #[cfg(debug_assertions)]
    if std::env::var("ONNX_FUSE_PANIC_ON").is_ok_and(|n| n == name) {
        panic!("a fault injected for tests in {name}");
    }
    let _ = name;
}

fn usage(why: String) -> anyhow::Error {
    Usage(why).into()
}

/// How to run: the same for every file of a folder.
pub struct Settings {
    /// Files the run writes besides models (`--report-json`), checked with them.
    pub reports: Vec<Role>,
    pub pipeline: Vec<&'static Pass>,
    /// What the outputs may contain.
    pub target: crate::graph::Target,
    /// `--opset N`: upgrade the default domain before the passes run.
    pub opset: Option<i64>,
    /// `--keep-opset`: never upgrade the model's opset, not even where the
    /// `ort` target's kernels need it (`KERNEL_OPSET`).
    pub keep_opset: bool,
    pub explain: bool,
    pub load: LoadOptions,
    pub external: ExternalData,
    /// `--external-data`: a model's weights go to a file beside it.
    pub weights_apart: bool,
    /// `--verify`, with its options.
    pub verify: Option<verify::Options>,
    pub expectations: Vec<Expectation>,
    /// The exact cleanup after the passes (`cleanup`; off with
    /// `--no-cleanup`, and where no pass runs).
    pub cleanup: bool,
}

/// How a run ended, worst first when several files are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    /// An `--expect` was not met (exit code 4); the output is written.
    ExpectationUnmet,
    /// `--verify` failed (exit code 3); the output is not written.
    VerificationFailed,
    /// A file could not be read or written (exit code 1).
    Error,
}

impl Report {
    pub fn verdict(&self) -> Verdict {
        if self.verification.as_ref().is_some_and(|v| !v.passed) {
            Verdict::VerificationFailed
        } else if self.expectations.iter().any(|c| !c.met) {
            Verdict::ExpectationUnmet
        } else {
            Verdict::Ok
        }
    }
}

/// Fuses one model file. `progress` hears each step.
pub fn fuse_file(input: &Path, output: &Path, settings: &Settings, progress: &dyn Fn(String)) -> Result<Report> {
    progress(format!("loading {}", input.display()));
    let loaded = io::load(input, settings.load)?;
    // Every file the run will write, against every file it reads or writes.
    let mut writes = io::writes(&loaded, output, settings.weights_apart);
    writes.extend(settings.reports.iter().cloned());
    io::check_run(&io::reads(&loaded), &writes).map_err(usage)?;
    io::check_writable(&writes).map_err(|e| anyhow::anyhow!(e))?;
    if let Some(foreign) = io::foreign_data_files(&loaded, output, settings.weights_apart).first() {
        return Err(usage(format!(
            "{} exists and is not the external data of an earlier output at {}; writing would replace it \
             (remove it, or choose another output directory)",
            foreign.display(),
            output.display()
        )));
    }
    let expectations: Vec<Expectation> = settings.expectations.iter().filter(|e| e.file.is_none()).cloned().collect();
    fuse_loaded(loaded, output, settings, settings.external, &expectations, progress)
}

/// Fuses a loaded model whose paths were checked, and writes it unless
/// verification fails.
fn fuse_loaded(
    mut loaded: io::Loaded,
    output: &Path,
    settings: &Settings,
    external: ExternalData,
    expectations: &[Expectation],
    progress: &dyn Fn(String),
) -> Result<Report> {
    let input = loaded.path.clone();
    if let Some(options) = &settings.verify {
        verify::check_options(&loaded.model, options).map_err(usage)?;
    }
    // The original is kept only to verify against.
    let original = settings.verify.is_some().then(|| loaded.model.clone());
    let before = report::op_counts(&loaded.model);
    let upgrade = match settings.opset {
        Some(to) => {
            progress(format!("upgrading {} to opset {to}", input.display()));
            let (model, upgrade) = crate::upgrade::upgrade(&loaded.model, to).map_err(|e| match e {
                crate::upgrade::Refused::Asked(why) => usage(format!("{}: {why}", input.display())),
                crate::upgrade::Refused::Model(why) => anyhow::anyhow!("{}: {why}", input.display()),
            })?;
            loaded.model = model;
            Some(upgrade)
        }
        None => None,
    };
    // A node nothing reads holds back no fusion: it goes first, with the
    // cleanup (which would remove it after the passes anyway).
    let cleaning = settings.cleanup && !settings.pipeline.is_empty();
    let pruned = cleaning.then(|| crate::cleanup::prune(&mut loaded.model));
    progress(format!("fusing {}", input.display()));
    // For portable, what an upgrade would add is counted on this model.
    let unfused = (settings.target == crate::graph::Target::Portable).then(|| loaded.model.clone());
    // What the proofs may read of small tensors in external data.
    let held = crate::graph::ExternalValues::new(io::external_reader(&loaded));
    let (outcome, upgrade) = match kernel_upgrade(&loaded.model, settings, upgrade.is_some(), &held) {
        Some(KernelTrial::Taken(model, kernel_upgrade, outcome)) => {
            loaded.model = model;
            (outcome, Some(kernel_upgrade))
        }
        trial => {
            let added = upgrade.as_ref().map(|u| u.added.clone()).unwrap_or_default();
            let mut outcome =
                rewrite::run_reading(&mut loaded.model, &settings.pipeline, settings.target, added, &held);
            match &trial {
                Some(KernelTrial::Declined(tried)) => {
                    noted_from_trial(&mut outcome, tried, loaded.model.default_opset())
                }
                Some(KernelTrial::Refused(why)) => noted_refused(&mut outcome, why, loaded.model.default_opset()),
                _ => {}
            }
            (outcome, upgrade)
        }
    };
    let needed = outcome.needed_opset();
    // After the passes, so that their counts and provenance are what they were.
    let cleanup = pruned.map(|pruned| {
        progress(format!("cleaning up {}", input.display()));
        crate::cleanup::clean(&mut loaded.model).after(pruned)
    });
    let unchanged = outcome.fused.is_empty()
        && upgrade.as_ref().is_none_or(|u| u.from == u.to)
        && cleanup.as_ref().is_none_or(|c| c.removed == 0 && c.added == 0);
    let mut report = Report::new(
        input.display().to_string(),
        output.display().to_string(),
        &settings.pipeline,
        outcome,
        settings.explain,
    );
    report.set_target(settings.target, &loaded.model);
    report.upgrade = upgrade;
    report.cleanup = cleanup;
    if let (Some(opset), Some(model)) = (needed, unfused) {
        report.needs_opset = with_opset(model, opset, settings, report.fused.len(), &held);
    }
    report.ops = report::op_changes(&before, &report::op_counts(&loaded.model));
    report.expectations = expectations.iter().map(|e| e.check(&report.passes, report.total)).collect();
    if let (Some(options), Some(original)) = (&settings.verify, &original) {
        progress(format!("verifying {} through ONNX Runtime", input.display()));
        let dir = io::parent(&input);
        let verified = verify::verify_apart((original, &dir), (&loaded.model, &dir), options);
        report.verification = Some(verified.with_context(|| format!("{}: cannot verify", input.display()))?);
    }
    drop(original);
    if report.verdict() != Verdict::VerificationFailed {
        progress(format!("writing {}", output.display()));
        let weights = io::save(&loaded, unchanged, output, external, settings.weights_apart)?;
        report.weights = weights.map(|w| w.display().to_string());
        // A model with external data of its own keeps its files: the flag
        // has nothing to move, and the user learns so.
        // (Its files are looked up only where the flag was given.)
        let own: Vec<String> = if settings.weights_apart && report.weights.is_none() {
            io::external_locations(&loaded.model).into_iter().collect()
        } else {
            vec![]
        };
        if !own.is_empty() {
            report.cautions.push(format!(
                "--external-data: the model keeps its weights in its own external data ({}), as they are",
                own.join(", ")
            ));
        }
        report.written = true;
    }
    Ok(report)
}

/// The opset of the kernels the `ort` target writes where a model has it:
/// ONNX `Attention` (ONNX Runtime 1.23 and newer run it as one kernel).
pub const KERNEL_OPSET: i64 = 23;

/// The everyday command gets the kernels (docs/targets.md): for the `ort`
/// target, a model below `KERNEL_OPSET` that no `--opset` or `--keep-opset`
/// governs is upgraded exactly to it where the passes then write a kernel
/// that needs it: `Taken` with the upgraded model, the upgrade and what the
/// passes did. `Declined` with what they did at that opset where no pass
/// wrote such a kernel (the cores then stay `AttentionCore`, as at the
/// model's own opset, and the report says why each is not the kernel);
/// `Refused` with why where the model has no exact upgrade to it; None
/// where no trial was made.
enum KernelTrial {
    Taken(crate::onnx::ModelProto, crate::upgrade::Upgrade, rewrite::Outcome),
    Declined(rewrite::Outcome),
    Refused(String),
}

fn kernel_upgrade(
    model: &crate::onnx::ModelProto,
    settings: &Settings,
    upgraded: bool,
    held: &crate::graph::ExternalValues,
) -> Option<KernelTrial> {
    let from = model.default_opset();
    let wanted = settings.target == crate::graph::Target::Ort
        && !upgraded
        && !settings.keep_opset
        && from < KERNEL_OPSET
        && settings.pipeline.iter().any(|p| p.kernel_opset.is_some());
    if !wanted {
        return None;
    }
    let (mut model, upgrade) = match crate::upgrade::upgrade(model, KERNEL_OPSET) {
        Ok(upgraded) => upgraded,
        Err(why) => return Some(KernelTrial::Refused(why.to_string())),
    };
    let outcome = rewrite::run_reading(&mut model, &settings.pipeline, settings.target, upgrade.added.clone(), held);
    let needs = outcome.fused.iter().any(|f| f.opset.is_some_and(|o| o > from));
    Some(if needs { KernelTrial::Taken(model, upgrade, outcome) } else { KernelTrial::Declined(outcome) })
}

/// Where the trial at `KERNEL_OPSET` was not taken, each fused node of
/// `outcome` that the trial fused with a note (why an attention core is not
/// ONNX `Attention`) gets that note, saying where it was tried; `opset` is
/// the one the model keeps.
fn noted_from_trial(outcome: &mut rewrite::Outcome, trial: &rewrite::Outcome, opset: i64) {
    for f in outcome.fused.iter_mut().filter(|f| f.note.is_none()) {
        let tried = trial.fused.iter().find(|t| t.name == f.name && t.graph == f.graph && t.pass == f.pass);
        if let Some(why) = tried.and_then(|t| t.note.as_deref()?.strip_prefix("not ONNX Attention: ")) {
            f.note = Some(format!(
                "not ONNX Attention (tried at opset {KERNEL_OPSET}; the model keeps opset {opset}): {why}"
            ));
        }
    }
}

/// Where the model has no exact upgrade to `KERNEL_OPSET`, each attention
/// core says so (`why`, the upgrade's refusal); `opset` is the one the
/// model keeps.
fn noted_refused(outcome: &mut rewrite::Outcome, why: &str, opset: i64) {
    let cores = outcome.fused.iter_mut().filter(|f| f.note.is_none() && f.op_type == "AttentionCore");
    for f in cores {
        f.note = Some(format!("not ONNX Attention (the model keeps opset {opset}): {why}"));
    }
}

/// What `--opset opset` would add to a run that fused `fused` nodes of
/// `model`: the passes run again on it upgraded, so the count is what the
/// user gets (a candidate two passes declined counts once, one a later
/// check declines not at all); or why it cannot be upgraded.
fn with_opset(
    mut model: crate::onnx::ModelProto,
    opset: i64,
    settings: &Settings,
    fused: usize,
    held: &crate::graph::ExternalValues,
) -> Option<report::NeedsOpset> {
    match crate::upgrade::upgrade(&model, opset) {
        Ok((upgraded, _)) => {
            model = upgraded;
            let added = std::collections::HashSet::new();
            let outcome = rewrite::run_reading(&mut model, &settings.pipeline, settings.target, added, held);
            let more = outcome.fused.len().saturating_sub(fused);
            (more > 0).then_some(report::NeedsOpset { opset, candidates: more, refused: None })
        }
        Err(why) => Some(report::NeedsOpset { opset, candidates: 0, refused: Some(why.to_string()) }),
    }
}

/// A folder run: every `.onnx` file in the folder and its subfolders fused,
/// every other file carried over, one report.
#[derive(Debug, serde::Serialize)]
pub struct FolderReport {
    pub schema: u32,
    pub input: String,
    pub output: String,
    /// One report per model, in file-name order.
    pub files: Vec<Report>,
    /// Models that could not be fused: file name and error.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<(String, String)>,
    /// Other files carried over unchanged (cloned or copied), relative to the folder.
    pub carried: Vec<String>,
    /// What the folder holds but the run left alone, and why (special files,
    /// symbolic links to folders or out of the folder).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<(String, String)>,
    /// Fused nodes per pass over all files (as each file's `passes`).
    pub totals: Vec<report::PassCount>,
    /// The fused nodes in the outputs, over all files.
    pub total: usize,
    /// The folder's expectations (totals, or `FILE:PASS=N`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expectations: Vec<Checked>,
}

impl FolderReport {
    pub fn verdict(&self) -> Verdict {
        let files = self.files.iter().map(Report::verdict);
        let own = if self.expectations.iter().any(|c| !c.met) { Verdict::ExpectationUnmet } else { Verdict::Ok };
        let errors = if self.errors.is_empty() { Verdict::Ok } else { Verdict::Error };
        files.chain([own, errors]).max().unwrap_or(Verdict::Ok)
    }

    pub fn summary(&self) -> String {
        // The counts are of the models written; a model that failed is named.
        let failed = match self.errors.len() {
            0 => String::new(),
            n => format!(
                " ({n} failed, not written: {})",
                self.errors.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>().join(", ")
            ),
        };
        format!(
            "{}: {} models{failed}, fused {} ({}), {} other files carried over -> {}",
            self.input,
            self.files.len() + self.errors.len(),
            self.total,
            report::counts_text(&self.totals),
            self.carried.len(),
            self.output
        )
    }
}

/// What an export folder holds, at any depth: models (`.onnx` files), other
/// files, subfolders (parents first), and what is left alone, with why.
#[derive(Default)]
struct Listing {
    models: Vec<PathBuf>,
    others: Vec<PathBuf>,
    folders: Vec<PathBuf>,
    skipped: Vec<(String, String)>,
}

/// Walks `input`: subfolders are entered (transformers.js keeps its models
/// in `onnx/`, some exporters their external data in a subfolder); a
/// symbolic link is followed only to a regular file inside the folder;
/// special files, and the output folder where it lies inside, are left
/// alone. Nothing is left out without being listed.
fn list_folder(input: &Path, output: &Path) -> Result<Listing> {
    let root = std::fs::canonicalize(input).with_context(|| format!("{}: cannot read the folder", input.display()))?;
    let output = std::fs::canonicalize(output).ok();
    let mut listing = Listing::default();
    let mut pending = vec![input.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let read = |e: std::io::Error| anyhow::anyhow!("{}: cannot read the folder: {e}", dir.display());
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(read)? {
            paths.push(entry.map_err(read)?.path());
        }
        paths.sort();
        for path in paths {
            let link = std::fs::symlink_metadata(&path).with_context(|| format!("{}: cannot stat", path.display()))?;
            let mut skip = |why: &str| listing.skipped.push((relative(input, &path), why.to_string()));
            if link.file_type().is_symlink() {
                match std::fs::canonicalize(&path) {
                    Err(_) => {
                        skip("a symbolic link to nothing");
                        continue;
                    }
                    Ok(to) if to.is_dir() => {
                        skip("a symbolic link to a folder (not followed)");
                        continue;
                    }
                    Ok(to) if !to.starts_with(&root) => {
                        skip("a symbolic link leading outside the folder");
                        continue;
                    }
                    Ok(_) => {}
                }
            }
            let meta = std::fs::metadata(&path).with_context(|| format!("{}: cannot stat", path.display()))?;
            if meta.is_dir() && output.is_some() && std::fs::canonicalize(&path).ok() == output {
                skip("the output folder (-o)");
            } else if meta.is_dir() {
                listing.folders.push(path.clone());
                pending.push(path);
            } else if !meta.is_file() {
                skip("not a regular file (a FIFO, socket or device)");
            } else if dir == input && path.file_name().is_some_and(|n| n == INCOMPLETE) {
                skip("the mark of an onnx-fuse folder run that did not finish (not carried over)");
            } else if path.extension().is_some_and(|e| e == "onnx") {
                listing.models.push(path);
            } else {
                listing.others.push(path);
            }
        }
    }
    listing.models.sort();
    listing.others.sort();
    listing.folders.sort();
    listing.skipped.sort();
    Ok(listing)
}

/// A path of the input folder as reports name it: relative to the folder.
fn relative(input: &Path, path: &Path) -> String {
    path.strip_prefix(input).unwrap_or(path).to_string_lossy().into_owned()
}

/// The file a folder run keeps in its output folder while the folder is
/// not a complete fused export: from before the first file is written
/// until every model is written (kept, naming them, where one was not).
pub const INCOMPLETE: &str = "ONNX_FUSE_INCOMPLETE";

/// Writes the mark as a regular file of the output folder: never through a
/// symbolic link (`O_NOFOLLOW`), never blocking on a FIFO (`O_NONBLOCK`),
/// nothing but a regular file written.
fn write_mark(path: &Path, why: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    file.set_len(0)?;
    file.write_all(format!("{why}\n").as_bytes())
}

/// In a folder, where `--external-data` gives a model a weights file: that
/// the file is no file of the input and none another run placed (a file
/// carried over from the input folder by that name included).
fn weights_file_free(loaded: &io::Loaded, output: &Path, settings: &Settings) -> Result<()> {
    let Some(path) = io::weights_file(loaded, output, settings.weights_apart) else { return Ok(()) };
    io::check_run(&io::reads(loaded), &[Role::new(&path, "the weights of the output")]).map_err(anyhow::Error::msg)?;
    if io::foreign_data_files(loaded, output, true).contains(&path) {
        anyhow::bail!(
            "{} exists and is not the external data of an earlier output at {}; --external-data would replace it",
            path.display(),
            output.display()
        );
    }
    Ok(())
}

/// Fuses an export folder into `output` (created if missing): the models in
/// parallel, up to `workers` at once, each file committed atomically.
pub fn fuse_folder(
    input: &Path,
    output: &Path,
    settings: &Settings,
    workers: usize,
    progress: &(dyn Fn(String) + Sync),
) -> Result<FolderReport> {
    let Listing { models, others, folders, skipped } = list_folder(input, output)?;
    if models.is_empty() {
        return Err(usage(format!("{}: the folder holds no .onnx file", input.display())));
    }
    for e in &settings.expectations {
        if let Some(file) = &e.file {
            if !models.iter().any(|m| relative(input, m) == *file) {
                return Err(usage(format!("--expect {file}:{}: the folder has no model {file}", e.pass)));
            }
        }
    }
    if std::fs::canonicalize(input).ok() == std::fs::canonicalize(output).ok() {
        return Err(usage(format!("{} (-o) is the input folder; choose another", output.display())));
    }
    // The reports' folders, and the output folder's own, before it is made.
    let mut first = settings.reports.clone();
    first.push(Role::new(output, "-o"));
    io::check_writable(&first).map_err(|e| anyhow::anyhow!(e))?;
    if !output.exists() {
        std::fs::create_dir(output).with_context(|| format!("{}: cannot create the folder", output.display()))?;
    }
    let out_meta = std::fs::metadata(output).with_context(|| format!("{}: cannot stat", output.display()))?;
    if !out_meta.is_dir() {
        return Err(usage(format!("{} (-o) is not a folder; a folder's output is a folder", output.display())));
    }
    // Every file written, against every file read and written; subfolders
    // are made in the output folder as the input has them.
    let target = |p: &Path| output.join(relative(input, p));
    let reads: Vec<Role> = models.iter().chain(&others).map(|p| Role::new(p, "a file of the input folder")).collect();
    let mut writes: Vec<Role> = models.iter().chain(&others).map(|p| Role::new(target(p), "a file of -o")).collect();
    writes.extend(settings.reports.iter().cloned());
    io::check_run(&reads, &writes).map_err(usage)?;
    // (Files of subfolders go into folders the run makes in the output folder.)
    let into_existing: Vec<Role> =
        writes.iter().filter(|w| !folders.iter().any(|f| w.path.starts_with(target(f)))).cloned().collect();
    io::check_writable(&into_existing).map_err(|e| anyhow::anyhow!(e))?;
    for folder in &folders {
        let made = target(folder);
        if !made.is_dir() {
            std::fs::create_dir(&made).with_context(|| format!("{}: cannot create the folder", made.display()))?;
        }
    }
    // Marked incomplete until every model is written: a kill, a failed or
    // unverified model leaves the mark (docs/README: what a CI step checks).
    let mark = output.join(INCOMPLETE);
    let marking = |why: &str| write_mark(&mark, why).with_context(|| format!("{}: cannot write", mark.display()));
    marking(&format!(
        "onnx-fuse is fusing {} into this folder; while this file is here, the folder is not a complete fused \
         export (a run that was stopped leaves it)",
        input.display()
    ))?;
    // Other files first (external data among them): models refer to them.
    let mut carried = Vec::new();
    for path in &others {
        progress(format!("carrying over {}", path.display()));
        io::carry_over(path, &target(path), settings.external)?;
        carried.push(relative(input, path));
    }
    // The data files are in place now: the models only write themselves.
    let queue = std::sync::Mutex::new(models.iter());
    let results: Vec<(PathBuf, Result<Report>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers.clamp(1, models.len()))
            .map(|_| {
                scope.spawn(|| -> Vec<(PathBuf, Result<Report>)> {
                    let mut done = Vec::new();
                    loop {
                        let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                        let Some(path) = next else { break };
                        let name = relative(input, path);
                        let expectations: Vec<Expectation> = settings
                            .expectations
                            .iter()
                            .filter(|e| e.file.as_deref() == Some(name.as_str()))
                            .cloned()
                            .collect();
                        // A bug that panics on one model fails that model, reported
                        // like any error; the other models go on.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            fault_for_tests(&name);
                            io::load(path, settings.load).and_then(|loaded| {
                                weights_file_free(&loaded, &target(path), settings)?;
                                fuse_loaded(
                                    loaded,
                                    &target(path),
                                    settings,
                                    ExternalData::InPlace,
                                    &expectations,
                                    progress,
                                )
                            })
                        }))
                        .unwrap_or_else(|payload| Err(internal_error(payload.as_ref())));
                        done.push((path.clone(), result));
                    }
                    done
                })
            })
            .collect();
        // A worker that died anyway takes the run down with it (main's one
        // line, exit 1): never a model silently missing from the report.
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|payload| std::panic::resume_unwind(payload)))
            .collect()
    });
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for (path, result) in results {
        match result {
            Ok(report) => files.push(report),
            Err(e) if e.is::<Usage>() => return Err(e),
            Err(e) => errors.push((path.display().to_string(), format!("{e:#}"))),
        }
    }
    files.sort_by(|a, b| a.input.cmp(&b.input));
    errors.sort();
    let unwritten: Vec<String> = errors
        .iter()
        .map(|(f, _)| f.clone())
        .chain(files.iter().filter(|f| f.verdict() == Verdict::VerificationFailed).map(|f| f.input.clone()))
        .collect();
    if unwritten.is_empty() {
        std::fs::remove_file(&mark).with_context(|| format!("{}: cannot remove", mark.display()))?;
    } else {
        marking(&format!(
            "onnx-fuse did not write every model of {} into this folder: the folder is not a complete fused \
             export; not written: {}",
            input.display(),
            unwritten.join(", ")
        ))?;
    }
    let totals: Vec<report::PassCount> = settings
        .pipeline
        .iter()
        .map(|p| report::PassCount::sum(p.name, files.iter().flat_map(|f| &f.passes)))
        .collect();
    let total = files.iter().map(|f| f.total).sum();
    // In the order given: the totals' checks, and each file's own (made
    // with that file's report; none for a file that failed).
    let expectations = settings
        .expectations
        .iter()
        .filter_map(|e| match &e.file {
            None => Some(e.check(&totals, total)),
            Some(_) => files.iter().flat_map(|f| &f.expectations).find(|c| &c.expectation == e).cloned(),
        })
        .collect();
    Ok(FolderReport {
        schema: 1,
        input: input.display().to_string(),
        output: output.display().to_string(),
        files,
        errors,
        carried,
        skipped,
        totals,
        total,
        expectations,
    })
}
