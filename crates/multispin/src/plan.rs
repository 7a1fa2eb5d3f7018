//! `multispin plan`: dispatches on the scenario's model to the paper-A or paper-B planner.

use crate::failure::Failure;
use crate::plan_args::PlanArgs;
use crate::scenario::{self, Loaded};
use spin_optimize::round::{Family, Scheme};

/// Runs `multispin plan`.
pub fn run(args: &PlanArgs) -> Result<(), Failure> {
    let loaded = scenario::load(&args.scenario)?;
    // The `unified` scheme takes every scenario; the unified model takes every scheme (docs/unified.md).
    let scheme = args.scheme.0;
    if scheme == Scheme::Unified {
        return crate::plan_unified::run(loaded, args);
    }
    match loaded {
        Loaded::Unified(spec) => crate::plan_unified::run(Loaded::Unified(spec), args),
        Loaded::PaperA(value) => {
            if args.objective.is_some() {
                return Err(Failure::Input(
                    "--objective: only paper-b scenarios take an objective".into(),
                ));
            }
            if scheme.family() == Family::PaperB {
                return Err(Failure::Input(format!(
                    "--scheme: {scheme} is a paper-b scheme; paper-a scenarios take {}",
                    Scheme::name_list(Scheme::of_family(Family::PaperA))
                )));
            }
            crate::plan_a::run(value, args)
        }
        Loaded::PaperB(value) => {
            if scheme.family() != Family::PaperB {
                return Err(Failure::Input(format!(
                    "--scheme: {scheme} is a paper-a scheme; paper-b scenarios take {}",
                    Scheme::name_list(Scheme::of_family(Family::PaperB))
                )));
            }
            if args.fixed_draft_len.is_some() {
                return Err(Failure::Input(
                    "--fixed-draft-len: only paper-a scenarios with --scheme fixed take it".into(),
                ));
            }
            crate::plan_b::run(value, args)
        }
    }
}
