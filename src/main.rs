//! The `onnx-fuse` command: parse arguments, call the library, turn errors
//! into one-line messages and exit codes (0 success, 1 error, 2 usage).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use onnx_fuse::io::{self, ExternalData, LoadOptions};
use onnx_fuse::report::{self, Report};
use onnx_fuse::{passes, rewrite};

const EXAMPLES: &str = "\
Examples:
  onnx-fuse model.onnx -o out.onnx                  fuse with the default passes
  onnx-fuse model.onnx -o out.onnx --report         and list every fused node
  onnx-fuse model.onnx -o out.onnx --passes rms-norm --report-json report.json
  onnx-fuse model.onnx -o out.onnx --explain        also say why candidates did not fuse
  onnx-fuse show out.onnx                           list the fused nodes a model contains
  onnx-fuse --list-passes

Exit codes: 0 success, 1 error (bad input, cannot write), 2 usage.";

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
        model: PathBuf,
        #[arg(long)]
        allow_unknown_fields: bool,
    },
}

#[derive(Args)]
struct FuseArgs {
    /// The ONNX model to read (never modified).
    #[arg(required_unless_present = "list_passes")]
    input: Option<PathBuf>,
    /// Where to write the fused model (written atomically).
    #[arg(short, long, required_unless_present = "list_passes")]
    output: Option<PathBuf>,
    /// Passes to run, in order: names, or `default` for every default pass.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    passes: Vec<String>,
    /// Passes to leave out of the pipeline.
    #[arg(long, value_delimiter = ',')]
    disable: Vec<String>,
    /// List the passes with a one-line description, and exit.
    #[arg(long)]
    list_passes: bool,
    /// Print per pass how many it fused, then every fused node and the nodes it replaced.
    #[arg(long)]
    report: bool,
    /// Write the report as JSON to FILE (schema in docs/report-json.md).
    #[arg(long, value_name = "FILE")]
    report_json: Option<PathBuf>,
    /// Also report, for every candidate that did not fuse, the precondition that failed.
    #[arg(long)]
    explain: bool,
    /// Print nothing but errors.
    #[arg(short, long)]
    quiet: bool,
    /// Read a model with fields this ONNX schema does not define; they are dropped.
    #[arg(long)]
    allow_unknown_fields: bool,
    /// Hard-link external data files into another output directory instead of copying them.
    #[arg(long)]
    link_external_data: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Show {
            model,
            allow_unknown_fields,
        }) => show(
            &model,
            LoadOptions {
                allow_unknown_fields,
            },
        ),
        None => fuse(cli.fuse),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("onnx-fuse: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn fuse(args: FuseArgs) -> Result<()> {
    let pipeline = passes::pipeline(&args.passes, &args.disable)?;
    if args.list_passes {
        for pass in passes::ALL {
            let when = if pass.default {
                "default"
            } else {
                "on request"
            };
            println!("{:<12} {:<11} {}", pass.name, when, pass.summary);
        }
        return Ok(());
    }
    let (input, output) = (
        args.input.expect("required by clap"),
        args.output.expect("required by clap"),
    );
    let progress = Progress::new(args.quiet);

    progress.step(format!("loading {}", input.display()));
    let mut loaded = io::load(
        &input,
        LoadOptions {
            allow_unknown_fields: args.allow_unknown_fields,
        },
    )?;
    progress.step("fusing".into());
    let outcome = rewrite::run(&mut loaded.model, &pipeline);
    let unchanged = outcome.fused.is_empty();
    progress.step(format!("writing {}", output.display()));
    let external = if args.link_external_data {
        ExternalData::HardLink
    } else {
        ExternalData::Copy
    };
    io::save(&loaded, unchanged, &output, external)?;
    progress.finish();

    let report = Report::new(
        input.display().to_string(),
        output.display().to_string(),
        &pipeline,
        outcome,
        args.explain,
    );
    if let Some(path) = &args.report_json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("{}: cannot write the report", path.display()))?;
    }
    if args.report || args.explain {
        print!("{}", report.text());
    }
    if !args.quiet {
        eprintln!("{}", report.summary());
    }
    Ok(())
}

fn show(path: &Path, options: LoadOptions) -> Result<()> {
    let loaded = io::load(path, options)?;
    let fused = report::fused_in(&loaded.model);
    if fused.is_empty() {
        bail!(
            "{}: contains no fused nodes (no `transmuter.fused` metadata)",
            path.display()
        );
    }
    for (op_type, name, replaced) in fused {
        println!("{op_type} {name}");
        for r in replaced {
            println!("    {r}");
        }
    }
    Ok(())
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
        bar.set_style(
            ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
        );
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
