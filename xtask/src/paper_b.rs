//! Paper B figures (placeholder until the paper-B reproduction lands; the owner replaces this file).

use crate::report::{Ctx, Report};

/// Regenerates paper B's figures.
pub fn reproduce(_ctx: &Ctx, _report: &mut Report) -> anyhow::Result<()> {
    Ok(())
}
