//! Project tasks: `cargo xtask reproduce` regenerates every paper figure; `cargo xtask distill` trains a draft model.

fn main() {}
