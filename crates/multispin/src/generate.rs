//! `multispin generate` (filled in by the work that owns it).

use crate::failure::Failure;
use clap::Args;

/// Arguments of `multispin generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {}

/// Runs `multispin generate`.
pub fn run(_args: &GenerateArgs) -> Result<(), Failure> {
    Err(Failure::Input("generate: not built yet".into()))
}
