//! `--lookup` and `--lookup-weight` of `generate`, `device` and `simulate`: prompt lookup while drafting.

use crate::failure::Failure;
use spin_runtime::drafter::Lookup;

/// Prompt lookup while drafting (`spin_runtime::drafter::Lookup`).
#[derive(Debug, Clone, clap::Args)]
pub struct LookupArgs {
    /// Prompt lookup while drafting: where the text ends in tokens that occurred before (the last N, else N − 1, …
    /// down to the last one), the draft proposes the token that followed them last time (greedy: instead of the
    /// draft model's; sampled: mixed into its distribution with weight --lookup-weight). 0 turns it off. The
    /// output distribution stays exact; only how often the draft agrees changes.
    #[arg(allow_hyphen_values = true, long, default_value_t = 0, value_name = "N")]
    pub lookup: usize,
    /// The looked-up token's weight λ in a sampled draft's distribution, in (0, 1] (default 0.5; only with
    /// --lookup N).
    #[arg(allow_hyphen_values = true, long)]
    pub lookup_weight: Option<f64>,
}

/// λ without `--lookup-weight`.
const DEFAULT_LOOKUP_WEIGHT: f64 = 0.5;

impl LookupArgs {
    /// The lookup the flags ask for (None with `--lookup 0`); a weight outside (0, 1], or one without a lookup, is
    /// an input error naming `--lookup-weight`.
    pub fn lookup(&self) -> Result<Option<Lookup>, Failure> {
        if self.lookup == 0 {
            if self.lookup_weight.is_some() {
                return Err(Failure::Input("--lookup-weight: needs --lookup N".into()));
            }
            return Ok(None);
        }
        // Checked as written before the drafter's f32: 1e-50 is above 0 as written but 0 in f32.
        let weight = self.lookup_weight.unwrap_or(DEFAULT_LOOKUP_WEIGHT);
        let shown = crate::number::plain(weight);
        if !(weight > 0.0 && weight <= 1.0) {
            return Err(Failure::Input(format!(
                "--lookup-weight: {shown} is outside (0, 1]"
            )));
        }
        let l = Lookup {
            ngram: self.lookup,
            weight: weight as f32,
        };
        l.validate().map_err(|_| {
            Failure::Input(format!(
                "--lookup-weight: {shown} is 0 in single precision, outside (0, 1]"
            ))
        })?;
        Ok(Some(l))
    }
}
