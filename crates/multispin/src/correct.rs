//! `multispin correct` (filled in by the work that owns it).

use crate::failure::Failure;
use clap::Args;

/// Arguments of `multispin correct`.
#[derive(Debug, Args)]
pub struct CorrectArgs {}

/// Runs `multispin correct`.
pub fn run(_args: &CorrectArgs) -> Result<(), Failure> {
    Err(Failure::Input("correct: not built yet".into()))
}
