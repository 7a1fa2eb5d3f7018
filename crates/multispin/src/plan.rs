//! `multispin plan`: dispatches on the scenario's model to the paper-A or paper-B planner.

use crate::failure::Failure;
use crate::scenario::{self, Model};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// Arguments of `multispin plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Scenario file (JSON, SI units). `"model": "paper-b"` selects paper B; otherwise paper A.
    ///
    /// Paper A fields: bandwidth_hz (Hz), bits_per_draft_token (bit uploaded per drafted token),
    /// verify_fixed_s and verify_per_draft_s (s; T_ver = fixed + K·per_draft), max_draft_len, and devices:
    /// [{acceptance (α in (0, 1)), draft_token_s (s per drafted token), spectral_efficiency (bit/s/Hz)}].
    ///
    /// Paper B fields: bandwidth_hz, distribution_bits (bit per exchanged distribution), verify_fixed_s,
    /// verify_per_device_s, max_draft_len, ul_power_w and dl_power_w (W), noise_psd_server_w_per_hz and
    /// noise_psd_device_w_per_hz (W/Hz), saa_samples, seed, and devices: [{acceptance, draft_token_s,
    /// channel_gain (linear power gain)}]. Examples: scenarios/examples/.
    #[arg(long, value_name = "FILE.json")]
    pub scenario: PathBuf,
    /// Planning scheme. Paper A: exact, paper-alg1, homo, uni-bw, fixed, brute-force.
    /// Paper B: greedy, best, uniform, comp-only, exhaustive. Unified (any scenario): unified; a `"model":
    /// "unified"` scenario takes every scheme (fields: docs/unified.md, example scenarios/examples/unified.json).
    #[arg(long, value_name = "SCHEME")]
    pub scheme: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    pub format: Format,
    /// Paper B objective: `rate` = `E[ΣN]/E[T]` (long-run tokens/s, default) or `mean-ratio` = `E[ΣN/T]`.
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
    // The unified model takes every scheme; the `unified` scheme takes every scenario (docs/unified.md).
    if model == Model::Unified || args.scheme == "unified" {
        return crate::plan_unified::run(model, value, args);
    }
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
        Model::Unified => crate::plan_unified::run(model, value, args),
    }
}
