//! `cargo xtask distill`: trains a draft model for a llama2.c target by running the spin-runtime `distill` example
//! in release mode, so that xtask itself never depends on candle.

use anyhow::{Context, bail};
use std::process::Command;

/// Runs `cargo run --release -p spin-runtime --example distill -- <args>` and fails if it fails.
pub fn run(args: &[String]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args([
            "run",
            "--release",
            "-p",
            "spin-runtime",
            "--example",
            "distill",
            "--",
        ])
        .args(args)
        .status()
        .context("starting cargo for the distill example")?;
    if !status.success() {
        bail!("distill example failed with {status}");
    }
    Ok(())
}
