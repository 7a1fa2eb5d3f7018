//! Project tasks: `cargo xtask reproduce` regenerates every figure of both papers as CSV + SVG with a report;
//! `cargo xtask distill` trains a draft model.

mod distill;
mod paper_a;
mod paper_a_report;
mod paper_b;
mod plot;
mod report;
mod stats;
mod table;
mod unified;

use anyhow::Context;
use clap::{Parser, Subcommand};
use report::{Ctx, Report};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// multispin project tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Regenerate the figures of paper A (Figs. 3, 4, 6, 7, 8), paper B (Figs. 6–11) and the unified model
    /// ("beyond the papers") as CSV + SVG and write REPORT.md beside them. Paper-scale sample counts by default.
    Reproduce {
        /// Small sample counts (a smoke run in seconds; numbers are noisier than the paper-scale run).
        #[arg(long)]
        quick: bool,
        /// Master seed of every random draw (channels, acceptance outcomes).
        #[arg(long, default_value_t = 2026)]
        seed: u64,
        /// Output folder.
        #[arg(long, default_value = "target/reproduce")]
        out: PathBuf,
        /// Only this paper's figures (`unified`: only the "beyond the papers" section).
        #[arg(long, value_parser = ["a", "b", "unified"])]
        only: Option<String>,
    },
    /// Train a draft model for a llama2.c target by distillation (runs the spin-runtime `distill` example in
    /// release mode; `--help` lists its options).
    Distill(distill::DistillArgs),
}

fn main() -> ExitCode {
    // `cargo xtask distill -- --help` (the form that passes options through to the example) is the same as
    // `cargo xtask distill --help`: the options are parsed here.
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "distill") && argv.get(2).is_some_and(|a| a == "--") {
        argv.remove(2);
    }
    match Cli::parse_from(argv).task {
        Task::Distill(args) => distill::run(&args),
        Task::Reproduce {
            quick,
            seed,
            out,
            only,
        } => match reproduce(quick, seed, out, only) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // One line of causes, no backtrace: the message names what failed.
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        },
    }
}

/// `cargo xtask reproduce`.
fn reproduce(quick: bool, seed: u64, out: PathBuf, only: Option<String>) -> anyhow::Result<()> {
    let ctx = Ctx {
        out_dir: out,
        quick,
        seed,
    };
    std::fs::create_dir_all(&ctx.out_dir).with_context(|| format!("creating {}", ctx.out_dir.display()))?;
    let mut report = Report::default();
    let start = Instant::now();
    if only.is_none() || only.as_deref() == Some("a") {
        paper_a_report::reproduce(&ctx, &mut report).context("paper A figures")?;
    }
    if only.is_none() || only.as_deref() == Some("b") {
        paper_b::reproduce(&ctx, &mut report).context("paper B figures")?;
    }
    if only.is_none() || only.as_deref() == Some("unified") {
        unified::reproduce(&ctx, &mut report).context("beyond the papers (unified)")?;
    }
    let mut command = String::from("cargo xtask reproduce");
    if quick {
        command.push_str(" --quick");
    }
    if seed != 2026 {
        command.push_str(&format!(" --seed {seed}"));
    }
    if let Some(o) = &only {
        command.push_str(&format!(" --only {o}"));
    }
    let path = ctx.path("REPORT.md");
    report.write(&ctx, &command, &path)?;
    eprintln!(
        "wrote {} and the figures beside it in {:.1} s",
        path.display(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
