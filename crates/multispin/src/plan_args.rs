//! The arguments of `multispin plan` (and the output format `correct` shares): the dispatcher in `plan.rs` and its
//! handlers `plan_{a,b,unified}.rs` all read them from here.

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};
use spin_optimize::paper_b::Objective;
use spin_optimize::round::Scheme;
use std::path::PathBuf;

/// Arguments of `multispin plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Scenario file: JSON, or TOML when the name ends in `.toml`. `"model": "paper-b"` selects paper B;
    /// otherwise paper A. Unknown fields, duplicate keys and missing fields are errors naming the field. `a | b`
    /// below: give exactly one of the pair (the second in the units radio engineers use).
    ///
    /// Paper A fields: bandwidth_hz | bandwidth_mhz, distribution_bits (bit uploaded per drafted token),
    /// verify_fixed_s and verify_per_device_s (s; T_ver = fixed + K·per_device), max_draft_len, devices:
    /// [{acceptance (α in (0, 1)), draft_token_s (s per drafted token), spectral_efficiency (bit/s/Hz)}];
    /// optional: min_draft_len (default 1), fixed_draft_len (see --fixed-draft-len), alg1_phi_points and
    /// alg1_lambda_points (default 100), alg1_lambda_lo_ratio (default 1e-6).
    ///
    /// Paper B fields: bandwidth_hz | bandwidth_mhz, distribution_bits (bit per exchanged distribution),
    /// verify_fixed_s, verify_per_device_s, max_draft_len, ul_power_w | ul_power_dbm, dl_power_w | dl_power_dbm,
    /// noise_psd_server_w_per_hz | noise_psd_server_dbm_per_hz, noise_psd_device_w_per_hz |
    /// noise_psd_device_dbm_per_hz, saa_samples, seed, devices: [{acceptance, draft_token_s, channel_gain |
    /// channel_gain_db (power gain)}]. Examples: scenarios/examples/ (and `multispin scenario --drop`).
    #[arg(long, value_name = "FILE")]
    pub scenario: PathBuf,
    /// Planning scheme. Paper A: exact, paper-alg1, homo, uni-bw, fixed, brute-force.
    /// Paper B: greedy, best, uniform, comp-only, exhaustive.
    #[arg(long, value_enum, value_name = "SCHEME")]
    pub scheme: SchemeArg,
    /// Draft length of every device under `--scheme fixed` (paper A). Default: the scenario's `fixed_draft_len`,
    /// else 8, lowered to the scenario's `max_draft_len` when that is smaller (the output's draft_lengths show
    /// the value used). An explicit value outside [min_draft_len, max_draft_len] is an error.
    #[arg(long, value_name = "L")]
    pub fixed_draft_len: Option<u32>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    pub format: OutputFormat,
    /// Paper B objective (default rate).
    #[arg(long, value_enum, value_name = "OBJECTIVE")]
    pub objective: Option<ObjectiveArg>,
}

/// A planning scheme on the command line: `spin_optimize::round::Scheme`, which owns the names and the help
/// lines, wrapped so that clap lists it as values (spin-optimize does not depend on clap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemeArg(pub Scheme);

/// Every scheme as a command-line value, in the order of `Scheme::ALL`.
const SCHEME_ARGS: [SchemeArg; Scheme::ALL.len()] = {
    let mut out = [SchemeArg(Scheme::Exact); Scheme::ALL.len()];
    let mut i = 0;
    while i < out.len() {
        out[i] = SchemeArg(Scheme::ALL[i]);
        i += 1;
    }
    out
};

impl ValueEnum for SchemeArg {
    fn value_variants<'a>() -> &'a [Self] {
        &SCHEME_ARGS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.0.name()).help(self.0.help()))
    }
}

/// The paper-B objectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectiveArg {
    /// `E[ΣN]/E[T]`: long-run tokens per second.
    Rate,
    /// `E[ΣN/T]`: mean per-round goodput.
    MeanRatio,
}

/// How `plan` prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One JSON object.
    Json,
    /// A human-readable table.
    Table,
}

impl PlanArgs {
    /// The objective: `--objective`, else the rate.
    pub fn objective(&self) -> Objective {
        match self.objective {
            Some(ObjectiveArg::MeanRatio) => Objective::MeanRatio,
            Some(ObjectiveArg::Rate) | None => Objective::Rate,
        }
    }
}
