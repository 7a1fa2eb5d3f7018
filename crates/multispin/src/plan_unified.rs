//! `multispin plan` on the unified model: any scheme of either paper, or the joint `unified` planner, on a unified
//! scenario (or on a paper-A/paper-B scenario converted to its special case), printed as JSON or a table.

use crate::failure::Failure;
use crate::plan_args::{OutputFormat, PlanArgs};
use crate::plan_output::UnifiedPlanOutput;
use crate::scenario::Loaded;
use spin_optimize::paper_a::baselines::FIXED_DRAFT_LEN;
use spin_optimize::paper_b::Objective;
use spin_optimize::round::{PlanEstimate, Radio, Round, RoundPlan, Scheme, planner};
use spin_optimize::{paper_a, paper_b, unified};

/// Plans one round of the unified model from any parsed scenario (paper A and paper B become its special cases).
pub fn run(loaded: Loaded, args: &PlanArgs) -> Result<(), Failure> {
    let scheme = args.scheme.0;
    let objective = args.objective();
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
    let options = unified::Options {
        objective,
        ..unified::Options::default()
    };
    let fixed_len = fixed_draft_len(&round, scheme, args.fixed_draft_len)?;
    let plan = planner(scheme, &options, fixed_len)
        .plan(&round)
        .map_err(Failure::input)?;
    match args.format {
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&UnifiedPlanOutput::new(&plan, objective))
                .map_err(anyhow::Error::from)?
        ),
        OutputFormat::Table => print!("{}", table(&round, &plan, objective)),
    }
    Ok(())
}

/// The length of `fixed`: `--fixed-draft-len` (only with `--scheme fixed`, inside [max(1, min_draft_len),
/// max_draft_len], paper A's range on this round), else [`FIXED_DRAFT_LEN`] moved into that range.
fn fixed_draft_len(round: &Round, scheme: Scheme, flag: Option<u32>) -> Result<u32, Failure> {
    let Some(l) = flag else {
        return Ok(FIXED_DRAFT_LEN);
    };
    if scheme != Scheme::Fixed {
        return Err(Failure::Input(
            "--fixed-draft-len: only --scheme fixed takes it".into(),
        ));
    }
    let (lo, hi) = (round.min_draft_len.max(1), round.max_draft_len);
    if !(lo..=hi).contains(&l) {
        return Err(Failure::Input(format!(
            "--fixed-draft-len: {l} is outside [max(1, min_draft_len), max_draft_len] = [{lo}, {hi}]"
        )));
    }
    Ok(l)
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
    out.push_str(&match plan.estimate {
        PlanEstimate::Exact => "expectation: exact\n".to_string(),
        PlanEstimate::Saa { samples, .. } => match plan.estimate.ci95(objective) {
            Some(ci) => {
                format!("expectation: SAA estimate over {samples} samples, 95 % CI ± {ci:.3} tokens/s\n")
            }
            None => format!("expectation: SAA estimate over {samples} sample (no interval)\n"),
        },
    });
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
