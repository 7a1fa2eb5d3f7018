//! `multispin plan`: dispatches on the scenario's model to the paper-A or paper-B planner.

use crate::failure::Failure;
use crate::scenario::{self, Model};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Arguments of `multispin plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Scenario file (JSON, SI units). `"model": "paper-b"` selects paper B; otherwise paper A.
    #[arg(long, value_name = "FILE.json")]
    pub scenario: PathBuf,
    /// Planning scheme. Paper A: exact, paper-alg1, homo, uni-bw, fixed, brute-force.
    /// Paper B: greedy, best, uniform, comp-only, exhaustive.
    #[arg(long, value_name = "SCHEME")]
    pub scheme: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// Paper B objective: `rate` = E[ΣN]/E[T] (long-run tokens/s, default) or `mean-ratio` = E[ΣN/T].
    #[arg(long, value_name = "OBJECTIVE")]
    pub objective: Option<String>,
}

/// How `plan` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One JSON object.
    Json,
    /// A human-readable table.
    Table,
}

/// Runs `multispin plan`.
pub fn run(args: &PlanArgs) -> Result<(), Failure> {
    let (model, value) = scenario::read(&args.scenario)?;
    match model {
        Model::PaperA => {
            if args.objective.is_some() {
                return Err(Failure::Input(
                    "objective: only paper-b scenarios take an objective".into(),
                ));
            }
            crate::plan_a::run(value, args)
        }
        Model::PaperB => crate::plan_b::run(value, args),
    }
}
