//! `multispin measure` (filled in by the work that owns it).

use crate::failure::Failure;
use clap::Args;

/// Arguments of `multispin measure`.
#[derive(Debug, Args)]
pub struct MeasureArgs {}

/// Runs `multispin measure`.
pub fn run(_args: &MeasureArgs) -> Result<(), Failure> {
    Err(Failure::Input("measure: not built yet".into()))
}
