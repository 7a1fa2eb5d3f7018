//! `multispin plan` on the unified model: any scheme of either paper, or the joint `unified` planner, on a unified
//! scenario (or on a paper-A/paper-B scenario converted to its special case), printed as JSON or a table.

use crate::failure::Failure;
use crate::plan::{Format, ObjectiveArg, PlanArgs};
use crate::scenario::Loaded;
use spin_optimize::paper_b::Objective;
use spin_optimize::round::{Radio, Round, RoundPlan, planner};
use spin_optimize::{paper_a, paper_b};

/// Plans one round of the unified model from any parsed scenario (paper A and paper B become its special cases).
pub fn run(loaded: Loaded, args: &PlanArgs) -> Result<(), Failure> {
    let scheme = args.scheme.0;
    let objective = match args.objective {
        Some(ObjectiveArg::MeanRatio) => Objective::MeanRatio,
        Some(ObjectiveArg::Rate) | None => Objective::Rate,
    };
    let round = match loaded {
        Loaded::Unified(spec) => spec.into_round().map_err(Failure::input)?,
        Loaded::PaperA(a) => {
            let s = paper_a::Scenario::new(&a.spec).map_err(Failure::input)?;
            Round::from_paper_a(&s, Radio::paper_b()).map_err(Failure::input)?
        }
        Loaded::PaperB(spec) => {
            let s = paper_b::Scenario::new(spec).map_err(Failure::input)?;
            Round::from_paper_b(&s).map_err(Failure::input)?
        }
    };
    let plan = planner(scheme, objective).plan(&round).map_err(Failure::input)?;
    match args.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&Output::new(&plan, objective)).map_err(anyhow::Error::from)?
        ),
        Format::Table => print!("{}", table(&round, &plan, objective)),
    }
    Ok(())
}

#[derive(Debug, serde::Serialize)]
struct Output<'a> {
    model: &'static str,
    objective: &'static str,
    goodput_tokens_per_s: f64,
    #[serde(flatten)]
    plan: &'a RoundPlan,
}

impl<'a> Output<'a> {
    fn new(plan: &'a RoundPlan, objective: Objective) -> Self {
        Output {
            model: "unified",
            objective: objective.name(),
            goodput_tokens_per_s: plan.goodput(objective),
            plan,
        }
    }
}

fn table(round: &Round, plan: &RoundPlan, objective: Objective) -> String {
    let mut out = format!(
        "scheme {} objective {} ({} payload policy){}\n",
        plan.scheme,
        objective.name(),
        round.payload.policy.name(),
        if plan.proven_optimal {
            ", proven optimal"
        } else {
            ""
        }
    );
    out.push_str(&format!(
        "goodput {:.3} tokens/s (rate {:.3}, mean ratio {:.3})\n",
        plan.goodput(objective),
        plan.rate_tokens_per_s,
        plan.mean_ratio_tokens_per_s
    ));
    out.push_str(&format!(
        "round: uplink {:.3} ms + verify {:.3} ms + E[comm] {:.3} ms, {:.3} tokens\n",
        plan.uplink_latency_s * 1e3,
        plan.verify_s * 1e3,
        plan.comm_delay_s * 1e3,
        plan.tokens_per_round
    ));
    out.push_str(&format!(
        "{:>6} {:>7} {:>5} {:>13} {:>10}\n",
        "device", "alpha", "L", "payload", "B_k (kHz)"
    ));
    for (k, d) in round.devices.iter().enumerate() {
        out.push_str(&format!(
            "{k:>6} {:>7.4} {:>5} {:>13} {:>10.3}\n",
            d.acceptance,
            plan.draft_lengths[k],
            if plan.sends_distributions[k] {
                "distribution"
            } else {
                "pair"
            },
            plan.uplink_share_hz[k] / 1e3
        ));
    }
    out
}
