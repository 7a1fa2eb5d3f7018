//! `multispin plan` for a scenarios (filled in by the paper work).

use crate::failure::Failure;
use crate::plan::PlanArgs;

/// Plans one round for a scenario of this model.
pub fn run(_value: serde_json::Value, _args: &PlanArgs) -> Result<(), Failure> {
    Err(Failure::Input("scheme: this planner is not built yet".into()))
}
