//! The `onnx-fuse` command: parse arguments, call the library, turn errors
//! into one-line messages and exit codes (0 success, 1 error, 2 usage,
//! 3 verification failed, 4 an expectation unmet).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use onnx_fuse::io::{self, ExternalData, LoadOptions, Role};
use onnx_fuse::report::{self, Expectation};
use onnx_fuse::run::{self, Settings, Usage, Verdict};
use onnx_fuse::{passes, usage, verify};

/// Writes to standard output, what users pipe: a reader that went away
/// (`| head`) ends the printing, not the run; any other failure (a full
/// disk) is the run's error, in one line.
fn out(text: std::fmt::Arguments) -> Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("cannot write to standard output"))
        }
        _ => Ok(()),
    }
}

/// Writes to standard error; where it is closed or gone there is nowhere
/// to say so, and the exit code still tells.
fn err(text: std::fmt::Arguments) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_fmt(text);
}

macro_rules! outln {
    ($($t:tt)*) => { out(format_args!("{}\n", format_args!($($t)*))) };
}

macro_rules! errln {
    ($($t:tt)*) => { err(format_args!("{}\n", format_args!($($t)*))) };
}

/// `--report-json -`: the JSON report goes to standard output.
fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
}

const EXAMPLES: &str = "\
Examples:
  onnx-fuse model.onnx -o out.onnx                  fuse with the default passes
  onnx-fuse model.onnx -o out.onnx --report         and list every fused node
  onnx-fuse model.onnx -o out.onnx --verify         prove it through ONNX Runtime first
  onnx-fuse verify model.onnx out.onnx              compare any two models the same way
  onnx-fuse model.onnx -o out.onnx --passes rms-norm --report-json report.json
  onnx-fuse model.onnx -o out.onnx --explain        also say why candidates did not fuse
  onnx-fuse show out.onnx                           list the fused nodes a model contains
  onnx-fuse export_dir/ -o fused_dir/               a whole Optimum export folder
  onnx-fuse model.onnx -o out.onnx --expect rms-norm=5,attention=2   a CI guard
  onnx-fuse --list-passes

Exit codes: 0 success, 1 error (bad input, cannot write), 2 usage,
            3 verification failed (the output is then not written),
            4 an --expect/--expect-min not met (the output is written).";

#[derive(Parser)]
#[command(name = "onnx-fuse", version, about = "Exact fusion passes for ONNX transformer exports",
          after_help = EXAMPLES, args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    fuse: FuseArgs,
}

#[derive(Subcommand)]
enum Command {
    /// List the fused nodes a model contains (read from `transmuter.fused`).
    Show {
        /// The model to read (never modified).
        model: PathBuf,
        /// Print the fused nodes as a JSON array (the report's `fused` entries without `pass`).
        #[arg(long)]
        json: bool,
        /// Read a model with fields this ONNX schema does not define.
        #[arg(long)]
        allow_unknown_fields: bool,
    },
    /// Run two models through ONNX Runtime on the same inputs and compare them.
    Verify {
        /// The reference model (its outputs are taken as right).
        original: PathBuf,
        /// The model to check against it, e.g. onnx-fuse's output; its fused nodes are also run alone.
        rewritten: PathBuf,
        #[command(flatten)]
        verify: VerifyArgs,
        /// Write the comparison as JSON to FILE (written atomically; it may not be either model); `-`: standard
        /// output (the text then goes to standard error).
        #[arg(long, value_name = "FILE")]
        report_json: Option<PathBuf>,
        /// Read models with fields this ONNX schema does not define.
        #[arg(long)]
        allow_unknown_fields: bool,
    },
}

#[derive(Args, Clone)]
struct VerifyArgs {
    /// The ONNX Runtime library (else ORT_DYLIB_PATH, the active virtual environment's onnxruntime, the checkout's .ort/lib, python3's onnxruntime, the standard library directories).
    #[arg(long, value_name = "PATH")]
    ort_lib: Option<PathBuf>,
    /// Relative tolerance for every floating-point value compared (default per type: f32 1e-4, f16 1e-2, bf16 4e-2).
    #[arg(long, value_parser = parse_tolerance)]
    rtol: Option<f64>,
    /// Absolute tolerance (default per type: f32 1e-5, f16 1e-3, bf16 1e-2).
    #[arg(long, value_parser = parse_tolerance)]
    atol: Option<f64>,
    /// Seed of the random float inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Value of a symbolic dimension, e.g. --dim batch=1 --dim sequence=16.
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_dim)]
    dim: Vec<(String, i64)>,
    /// An .npz file with arrays named like the model's inputs (others are synthesized).
    #[arg(long, value_name = "FILE")]
    inputs: Option<PathBuf>,
}

impl VerifyArgs {
    /// The verification options given, by flag, where they change anything.
    fn given(&self) -> Vec<&'static str> {
        let flags = [
            (self.ort_lib.is_some(), "--ort-lib"),
            (self.rtol.is_some(), "--rtol"),
            (self.atol.is_some(), "--atol"),
            (self.seed != 0, "--seed"),
            (!self.dim.is_empty(), "--dim"),
            (self.inputs.is_some(), "--inputs"),
        ];
        flags.into_iter().filter(|(given, _)| *given).map(|(_, flag)| flag).collect()
    }

    /// A `--dim` given twice is a usage error, even with one value.
    fn check_dims(&self) -> Result<(), Usage> {
        for (i, (name, _)) in self.dim.iter().enumerate() {
            if self.dim[..i].iter().any(|(earlier, _)| earlier == name) {
                return Err(Usage(format!("--dim {name} is given twice")));
            }
        }
        Ok(())
    }

    fn options(&self) -> verify::Options {
        verify::Options {
            library: self.ort_lib.clone(),
            rtol: self.rtol,
            atol: self.atol,
            seed: self.seed,
            dims: self.dim.iter().cloned().collect(),
            inputs: self.inputs.clone(),
            specials: false,
        }
    }
}

fn parse_tolerance(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("a tolerance is a finite number ≥ 0, not {s}"));
    }
    Ok(v)
}

fn parse_dim(s: &str) -> Result<(String, i64), String> {
    let (name, value) = s.split_once('=').ok_or("expected NAME=VALUE")?;
    let value: i64 = value.parse().map_err(|_| format!("{value:?} is not a whole number"))?;
    if value < 0 {
        return Err("a dimension cannot be negative".into());
    }
    Ok((name.to_string(), value))
}

#[derive(Args)]
struct FuseArgs {
    /// The ONNX model to read (never modified), or an export folder: every .onnx file in it, subfolders
    /// included, fused into the same place in the output folder; other files carried over.
    #[arg(required_unless_present = "list_passes")]
    input: Option<PathBuf>,
    /// Where to write the fused model (written atomically); for a folder, the output folder.
    #[arg(short, long, required_unless_present = "list_passes")]
    output: Option<PathBuf>,
    /// Passes to run, in order: names, `default` for every default pass, or `none` (with --opset: only upgrade).
    /// Beside `default`, every pass takes its place in --list-passes' order (`default,skip-norm`).
    #[arg(long, value_delimiter = ',', default_value = "default")]
    passes: Vec<String>,
    /// Passes to leave out of the pipeline.
    #[arg(long, value_delimiter = ',')]
    disable: Vec<String>,
    /// What the output may contain: `ort` (ONNX Runtime's ops and transmuter.AttentionCore with its
    /// function) or `portable` (only operators the model's own opset defines; see docs/targets.md).
    #[arg(long, value_enum, default_value = "ort")]
    target: TargetArg,
    /// Upgrade the model's default domain to opset N before fusing, every node in its version-N form
    /// (exact adapters only; refused, naming the node, where none exists; never a downgrade; N at most
    /// 26, the newest the pinned ONNX Runtime runs). See docs/targets.md.
    #[arg(long, value_name = "N", value_parser = parse_opset)]
    opset: Option<i64>,
    /// Never upgrade the model's opset. By default a model below opset 23 is upgraded exactly to it
    /// where the attention pass then writes ONNX Attention, which ONNX Runtime 1.23 and newer run as
    /// one kernel; with this flag its cores stay transmuter.AttentionCore (docs/targets.md).
    #[arg(long, conflicts_with = "opset")]
    keep_opset: bool,
    /// Leave out the exact cleanup after the passes: values the shapes prove the same on every run
    /// made constant, twins computed once, unread nodes removed (docs/cleanup.md).
    #[arg(long)]
    no_cleanup: bool,
    /// List the passes with a one-line description, and exit.
    #[arg(long)]
    list_passes: bool,
    /// Print per pass how many it fused, then every fused node and the nodes it replaced.
    #[arg(long)]
    report: bool,
    /// Write the report as JSON to FILE (schema in docs/report-json.md); `-`: standard output.
    #[arg(long, value_name = "FILE")]
    report_json: Option<PathBuf>,
    /// Also report, for every candidate that did not fuse, the precondition that failed.
    #[arg(long)]
    explain: bool,
    /// Exact counts the run must fuse: PASS=N (a pass of --list-passes, or total); in a folder,
    /// the folder's totals, or FILE:PASS=N for one file. Unmet: exit code 4, the output still written.
    #[arg(long, value_delimiter = ',', value_name = "PASS=N")]
    expect: Vec<String>,
    /// Lower bounds the run must fuse, as --expect.
    #[arg(long, value_delimiter = ',', value_name = "PASS=N")]
    expect_min: Vec<String>,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
    /// Read a model with fields this ONNX schema does not define; they are dropped.
    #[arg(long)]
    allow_unknown_fields: bool,
    /// Hard-link external data files into another output directory instead of copying them
    /// (instant, but the files are shared, and onnx.load refuses hard-linked data; see the README);
    /// across filesystems, where no link can be, they are copied.
    #[arg(long)]
    link_external_data: bool,
    /// Write the output's weights (every initializer of 1 KiB or more) to OUTPUT.data beside it,
    /// page-aligned, so that ONNX Runtime maps them at load instead of copying them: peak memory
    /// falls by about the weights' size (docs/benchmarks.md). A model that keeps external data of
    /// its own keeps its files.
    #[arg(long)]
    external_data: bool,
    /// Before writing, run the original and the fused model through ONNX Runtime and compare them.
    #[arg(long)]
    verify: bool,
    #[command(flatten)]
    verify_args: VerifyArgs,
}

/// `--opset N`: a whole number up to the newest opset the pinned ONNX Runtime runs.
fn parse_opset(text: &str) -> Result<i64, String> {
    let n: i64 = text.parse().map_err(|_| format!("{text:?} is not an opset number"))?;
    let max = onnx_fuse::upgrade::MAX_OPSET;
    if !(1..=max).contains(&n) {
        return Err(format!("opset {n}: the pinned ONNX Runtime (1.31.1) runs opsets 1 to {max}"));
    }
    Ok(n)
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TargetArg {
    Ort,
    Portable,
}

/// What a run ends with besides errors.
enum Done {
    Ok,
    VerificationFailed,
    ExpectationUnmet,
}

impl From<Verdict> for Done {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Ok => Done::Ok,
            Verdict::ExpectationUnmet => Done::ExpectationUnmet,
            // (A folder whose files failed to load ends as an error before this.)
            Verdict::VerificationFailed | Verdict::Error => Done::VerificationFailed,
        }
    }
}

fn main() -> ExitCode {
    // First, before any thread: an interrupted run removes its temporary files.
    io::cleanup_on_signals();
    let cli = Cli::parse();
    // No input may make the tool panic; should a bug still do it, the user
    // gets one line and exit code 1, not a backtrace: the hook stays silent
    // and remembers the message for the line below.
    std::panic::set_hook(Box::new(|info| {
        let message = onnx_fuse::run::panic_message(info.payload());
        let place = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = format!("{message}{place}"));
    }));
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(code) => code,
        Err(_) => {
            let message = LAST_PANIC.with(|p| p.borrow().clone());
            errln!("onnx-fuse: internal error: {message} (please report it with the model that caused it)");
            ExitCode::from(1)
        }
    }
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn run(cli: Cli) -> ExitCode {
    let result = match cli.command {
        Some(Command::Show { model, json, allow_unknown_fields }) => {
            show(&model, json, LoadOptions { allow_unknown_fields })
        }
        Some(Command::Verify { original, rewritten, verify, report_json, allow_unknown_fields }) => {
            compare(&original, &rewritten, &verify, report_json.as_deref(), LoadOptions { allow_unknown_fields })
        }
        None => fuse(cli.fuse),
    };
    match result {
        Ok(Done::Ok) => ExitCode::SUCCESS,
        Ok(Done::VerificationFailed) => ExitCode::from(3),
        Ok(Done::ExpectationUnmet) => ExitCode::from(4),
        Err(e) if e.is::<Usage>() => {
            errln!("onnx-fuse: usage error: {}", usage::one_line(&format!("{e:#}")));
            ExitCode::from(2)
        }
        Err(e) => {
            errln!("onnx-fuse: error: {}", usage::one_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

/// Two expectations of one pass (and file) that no count meets together:
/// two different exact counts, or a minimum above an exact count.
fn check_expectations_agree(expectations: &[Expectation]) -> Result<(), Usage> {
    let flag = |e: &Expectation| {
        let file = e.file.as_deref().map(|f| format!("{f}:")).unwrap_or_default();
        let dash = if e.kind == "min" { "-min" } else { "" };
        format!("--expect{dash} {file}{}={}", e.pass, e.expected)
    };
    for (i, e) in expectations.iter().enumerate() {
        for f in expectations[..i].iter().filter(|f| (&f.pass, &f.file) == (&e.pass, &e.file)) {
            let exact_below =
                |exact: &Expectation, other: &Expectation| exact.kind == "exact" && exact.expected < other.expected;
            let clash = (e.kind == "exact" && f.kind == "exact" && e.expected != f.expected)
                || (f.kind == "min" && exact_below(e, f))
                || (e.kind == "min" && exact_below(f, e));
            if clash {
                return Err(Usage(format!("{} contradicts {}: no count meets both", flag(f), flag(e))));
            }
        }
    }
    Ok(())
}

fn fuse(args: FuseArgs) -> Result<Done> {
    let pipeline = passes::pipeline(&args.passes, &args.disable).map_err(|e| Usage(e.to_string()))?;
    if args.list_passes {
        outln!("{:<12} {:<11} {}", "pass", "pipeline", "replaces")?;
        for pass in passes::ALL {
            let when = if pass.default { "default" } else { "on request" };
            outln!("{:<12} {:<11} {}", pass.name, when, pass.summary)?;
        }
        return Ok(Done::Ok);
    }
    let (input, output) = (args.input.expect("required by clap"), args.output.expect("required by clap"));
    let known: Vec<&str> = passes::ALL.iter().map(|p| p.name).collect();
    let mut expectations = Vec::new();
    for (list, kind) in [(&args.expect, "exact"), (&args.expect_min, "min")] {
        for text in list {
            expectations.push(
                Expectation::parse(text, kind, &known)
                    .map_err(|e| Usage(format!("--expect{}: {e}", if kind == "min" { "-min" } else { "" })))?,
            );
        }
    }
    check_expectations_agree(&expectations)?;
    // A count the pipeline cannot make is a mistake in the command, not a
    // run that fused too little.
    if let Some(e) = expectations.iter().find(|e| e.pass != "total" && !pipeline.iter().any(|p| p.name == e.pass)) {
        let why = match passes::ALL.iter().find(|p| p.name == e.pass) {
            Some(p) if !p.default && args.passes == ["default"] => {
                format!("{} is not a default pass (add --passes default,{})", p.name, p.name)
            }
            _ => format!("{} is not in the pipeline", e.pass),
        };
        return Err(Usage(format!("--expect {}={}: {why}", e.pass, e.expected)).into());
    }
    if output.as_os_str() == "-" {
        // A model is written atomically to a file; standard output is none.
        return Err(Usage("-o -: onnx-fuse writes the model to a file, not to standard output".into()).into());
    }
    let folder = input.is_dir();
    if !folder {
        if let Some(e) = expectations.iter().find(|e| e.file.is_some()) {
            return Err(Usage(format!(
                "--expect {}:{}: FILE:PASS=N is for folders",
                e.file.as_deref().unwrap_or(""),
                e.pass
            ))
            .into());
        }
    }
    if args.report_json.as_deref().is_some_and(is_stdout) && (args.report || args.explain) {
        let flag = if args.report { "--report" } else { "--explain" };
        return Err(Usage(format!("--report-json - and {flag} would both print to standard output")).into());
    }
    if let (false, [flag, ..]) = (args.verify, args.verify_args.given().as_slice()) {
        return Err(Usage(format!("{flag} is an option of --verify, which is not given")).into());
    }
    args.verify_args.check_dims()?;
    let settings = Settings {
        reports: args.report_json.iter().filter(|j| !is_stdout(j)).map(|j| Role::new(j, "--report-json")).collect(),
        pipeline,
        target: match args.target {
            TargetArg::Ort => onnx_fuse::graph::Target::Ort,
            TargetArg::Portable => onnx_fuse::graph::Target::Portable,
        },
        opset: args.opset,
        keep_opset: args.keep_opset,
        explain: args.explain,
        load: LoadOptions { allow_unknown_fields: args.allow_unknown_fields },
        external: if args.link_external_data { ExternalData::HardLink } else { ExternalData::Copy },
        weights_apart: args.external_data,
        verify: args.verify.then(|| args.verify_args.options()),
        expectations,
        cleanup: !args.no_cleanup,
    };
    let progress = Progress::new(args.quiet);
    let step = |message: String| progress.step(message);
    if folder {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let result = run::fuse_folder(&input, &output, &settings, workers, &step);
        progress.finish();
        let report = result?;
        write_json(args.report_json.as_deref(), &report)?;
        for file in &report.files {
            print_file(file, args.report, args.explain, args.quiet)?;
        }
        for (file, error) in &report.errors {
            errln!("onnx-fuse: error: {file}: {}", usage::one_line(error));
        }
        if !args.quiet {
            for (file, why) in &report.skipped {
                errln!("onnx-fuse: left alone: {file}: {why}");
            }
        }
        // (A file's own expectations were printed with the file.)
        for c in report.expectations.iter().filter(|c| !c.met && c.expectation.file.is_none()) {
            errln!("onnx-fuse: expectation not met: {}", c.text());
        }
        if !args.quiet {
            errln!("{}", report.summary());
        }
        return match report.verdict() {
            Verdict::Error => {
                Err(anyhow::anyhow!("{}: {} of its models could not be fused", input.display(), report.errors.len()))
            }
            v => Ok(v.into()),
        };
    }
    let result = run::fuse_file(&input, &output, &settings, &step);
    progress.finish();
    let report = result?;
    write_json(args.report_json.as_deref(), &report)?;
    print_file(&report, args.report, args.explain, args.quiet)?;
    Ok(report.verdict().into())
}

/// Prints one file's report, verification, unmet expectations and summary.
fn print_file(report: &report::Report, full: bool, explain: bool, quiet: bool) -> Result<()> {
    if full || explain {
        out(format_args!("{}", report.text()))?;
    }
    if let Some(v) = &report.verification {
        if !quiet || !v.passed {
            err(format_args!("{}", v.text()));
        }
    }
    if report.verdict() == Verdict::VerificationFailed {
        errln!("onnx-fuse: verification failed: {} not written", report.output);
        return Ok(());
    }
    for c in report.expectations.iter().filter(|c| !c.met) {
        errln!("onnx-fuse: expectation not met: {}", c.text());
    }
    if !quiet {
        errln!("{}", report.summary());
    }
    Ok(())
}

fn compare(a: &Path, b: &Path, args: &VerifyArgs, json: Option<&Path>, options: LoadOptions) -> Result<Done> {
    let (original, rewritten) = (io::load(a, options)?, io::load(b, options)?);
    let reads: Vec<Role> = io::reads(&original).into_iter().chain(io::reads(&rewritten)).collect();
    let writes: Vec<Role> = json.iter().filter(|j| !is_stdout(j)).map(|j| Role::new(j, "--report-json")).collect();
    io::check_run(&reads, &writes).map_err(Usage)?;
    io::check_writable(&writes).map_err(|e| anyhow::anyhow!(e))?;
    args.check_dims()?;
    verify::check_options(&original.model, &args.options()).map_err(Usage)?;
    let progress = Progress::new(false);
    progress.step("verifying through ONNX Runtime".into());
    let v = verify::verify_apart((&original.model, &io::parent(a)), (&rewritten.model, &io::parent(b)), &args.options())
        .with_context(|| format!("cannot verify {} against {}", b.display(), a.display()))?;
    progress.finish();
    write_json(json, &v)?;
    // With the JSON on standard output, the text goes beside the progress.
    if json.is_some_and(is_stdout) {
        err(format_args!("{}", v.text()));
    } else {
        out(format_args!("{}", v.text()))?;
    }
    Ok(if v.passed { Done::Ok } else { Done::VerificationFailed })
}

fn write_json(path: Option<&Path>, value: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(value)? + "\n";
        if is_stdout(path) {
            return out(format_args!("{json}"));
        }
        // (Its folder was checked before anything was written; what fails now is said once.)
        io::write_atomically(path, &json).context("--report-json")?;
    }
    Ok(())
}

fn show(path: &Path, json: bool, options: LoadOptions) -> Result<Done> {
    let loaded = io::load(path, options)?;
    let fused = report::fused_in(&loaded.model);
    if json {
        outln!("{}", serde_json::to_string_pretty(&fused)?)?;
        return Ok(Done::Ok);
    }
    if fused.is_empty() {
        // Not an error: a model onnx-fuse fused nothing in (or never saw).
        outln!("{}: no fused nodes (no `transmuter.fused` metadata)", path.display())?;
        return Ok(Done::Ok);
    }
    for f in fused {
        let name = if f.graph == "main" { f.name } else { format!("{}/{}", f.graph, f.name) };
        outln!("{} {name}", f.op_type)?;
        for r in f.replaced {
            outln!("    {r}")?;
        }
    }
    Ok(Done::Ok)
}

/// A spinner on stderr, drawn only when stderr is a terminal and the run is
/// not quiet; it appears only for work that takes longer than a moment.
struct Progress(Option<ProgressBar>);

impl Progress {
    fn new(quiet: bool) -> Self {
        let target = ProgressDrawTarget::stderr();
        if quiet || target.is_hidden() {
            return Progress(None);
        }
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"));
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress(Some(bar))
    }

    fn step(&self, message: String) {
        if let Some(bar) = &self.0 {
            bar.set_message(message);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}
