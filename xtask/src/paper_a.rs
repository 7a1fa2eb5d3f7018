//! Paper A figures (placeholder until the paper-A reproduction lands; the owner replaces this file).

use crate::report::{Ctx, Report};

/// Regenerates paper A's figures.
pub fn reproduce(_ctx: &Ctx, _report: &mut Report) -> anyhow::Result<()> {
    Ok(())
}
