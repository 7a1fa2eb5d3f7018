//! The JSON forms of plans that `multispin plan --format json` prints: spin-optimize's plan types know nothing of
//! serialisation, so their output forms live here, at the edge, with every enum written by its command-line name
//! (`scheme`, the correction's `modes` and `split`, the estimate's `expectation`, paper A's optimality `status`).

use serde::Serialize;
use spin_optimize::paper_a::Optimality;
use spin_optimize::paper_b::Objective;
use spin_optimize::round::{PlanEstimate, RoundPlan};

/// A unified-model plan: the model and objective, the goodput under that objective, then the plan's fields by
/// the names [`RoundPlan`] gives them, in its order.
#[derive(Debug, Serialize)]
pub struct UnifiedPlanOutput<'a> {
    model: &'static str,
    objective: &'static str,
    goodput_tokens_per_s: f64,
    scheme: &'static str,
    draft_lengths: &'a [u32],
    uplink_share_hz: &'a [f64],
    sends_distributions: &'a [bool],
    correction: CorrectionOutput,
    rate_tokens_per_s: f64,
    mean_ratio_tokens_per_s: f64,
    tokens_per_round: f64,
    uplink_latency_s: f64,
    verify_s: f64,
    comm_delay_s: f64,
    proven_optimal: bool,
    estimate: EstimateOutput,
}

/// The correction rule: the mode rule and the band split, by name.
#[derive(Debug, Serialize)]
struct CorrectionOutput {
    modes: &'static str,
    split: &'static str,
}

/// How the plan's numbers were taken (`{"expectation": "exact"}`, or `"saa"` with its samples and intervals).
#[derive(Debug, Serialize)]
#[serde(tag = "expectation", rename_all = "kebab-case")]
enum EstimateOutput {
    Exact,
    Saa {
        samples: u32,
        rate_ci95_tokens_per_s: Option<f64>,
        mean_ratio_ci95_tokens_per_s: Option<f64>,
    },
}

impl<'a> UnifiedPlanOutput<'a> {
    /// The output form of `plan` reported under `objective`.
    pub fn new(plan: &'a RoundPlan, objective: Objective) -> Self {
        UnifiedPlanOutput {
            model: "unified",
            objective: objective.name(),
            goodput_tokens_per_s: plan.goodput(objective),
            scheme: plan.scheme.name(),
            draft_lengths: &plan.draft_lengths,
            uplink_share_hz: &plan.uplink_share_hz,
            sends_distributions: &plan.sends_distributions,
            correction: CorrectionOutput {
                modes: plan.correction.modes.name(),
                split: plan.correction.split.name(),
            },
            rate_tokens_per_s: plan.rate_tokens_per_s,
            mean_ratio_tokens_per_s: plan.mean_ratio_tokens_per_s,
            tokens_per_round: plan.tokens_per_round,
            uplink_latency_s: plan.uplink_latency_s,
            verify_s: plan.verify_s,
            comm_delay_s: plan.comm_delay_s,
            proven_optimal: plan.proven_optimal,
            estimate: match plan.estimate {
                PlanEstimate::Exact => EstimateOutput::Exact,
                PlanEstimate::Saa {
                    samples,
                    rate_ci95_tokens_per_s,
                    mean_ratio_ci95_tokens_per_s,
                } => EstimateOutput::Saa {
                    samples,
                    rate_ci95_tokens_per_s,
                    mean_ratio_ci95_tokens_per_s,
                },
            },
        }
    }
}

/// What paper A's planner proved about its plan (`{"status": "optimal"}`, `"bounded"` with the bound and the gap,
/// or `"no-claim"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "kebab-case")]
pub enum OptimalityOutput {
    /// Proven optimal.
    Optimal,
    /// The work budget ran out: the optimum is at most the bound.
    Bounded {
        /// A rigorous upper bound on the optimum in tokens/s.
        upper_bound_tokens_per_s: f64,
        /// (upper bound − goodput) / goodput.
        relative_gap: f64,
    },
    /// A heuristic or baseline.
    NoClaim,
}

impl From<Optimality> for OptimalityOutput {
    fn from(o: Optimality) -> Self {
        match o {
            Optimality::Optimal => OptimalityOutput::Optimal,
            Optimality::Bounded {
                upper_bound_tokens_per_s,
                relative_gap,
            } => OptimalityOutput::Bounded {
                upper_bound_tokens_per_s,
                relative_gap,
            },
            Optimality::NoClaim => OptimalityOutput::NoClaim,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spin_optimize::paper_b::ModeScheme;
    use spin_optimize::round::{CorrectionPolicy, CorrectionSplit, Scheme};

    fn plan(estimate: PlanEstimate) -> RoundPlan {
        RoundPlan {
            scheme: Scheme::CompOnly,
            draft_lengths: vec![2, 0],
            uplink_share_hz: vec![1.5e6, 0.0],
            sends_distributions: vec![false, true],
            correction: CorrectionPolicy {
                modes: ModeScheme::AllUl,
                split: CorrectionSplit::Equal,
            },
            rate_tokens_per_s: 12.5,
            mean_ratio_tokens_per_s: 12.25,
            tokens_per_round: 3.0,
            uplink_latency_s: 0.01,
            verify_s: 0.05,
            comm_delay_s: 0.2,
            proven_optimal: false,
            estimate,
        }
    }

    #[test]
    fn a_unified_plan_prints_every_field_by_its_names_in_the_plans_order() {
        let saa = plan(PlanEstimate::Saa {
            samples: 200,
            rate_ci95_tokens_per_s: Some(0.5),
            mean_ratio_ci95_tokens_per_s: None,
        });
        let json = serde_json::to_string(&UnifiedPlanOutput::new(&saa, Objective::MeanRatio)).unwrap();
        assert_eq!(
            json,
            r#"{"model":"unified","objective":"mean-ratio","goodput_tokens_per_s":12.25,"scheme":"comp-only","draft_lengths":[2,0],"uplink_share_hz":[1500000.0,0.0],"sends_distributions":[false,true],"correction":{"modes":"all-ul","split":"equal"},"rate_tokens_per_s":12.5,"mean_ratio_tokens_per_s":12.25,"tokens_per_round":3.0,"uplink_latency_s":0.01,"verify_s":0.05,"comm_delay_s":0.2,"proven_optimal":false,"estimate":{"expectation":"saa","samples":200,"rate_ci95_tokens_per_s":0.5,"mean_ratio_ci95_tokens_per_s":null}}"#
        );
        let exact = plan(PlanEstimate::Exact);
        let json = serde_json::to_string(&UnifiedPlanOutput::new(&exact, Objective::Rate)).unwrap();
        assert!(
            json.ends_with(r#""proven_optimal":false,"estimate":{"expectation":"exact"}}"#),
            "{json}"
        );
    }

    #[test]
    fn paper_a_optimality_prints_its_status_and_numbers() {
        let json = |o: Optimality| serde_json::to_string(&OptimalityOutput::from(o)).unwrap();
        assert_eq!(json(Optimality::Optimal), r#"{"status":"optimal"}"#);
        assert_eq!(json(Optimality::NoClaim), r#"{"status":"no-claim"}"#);
        assert_eq!(
            json(Optimality::Bounded {
                upper_bound_tokens_per_s: 80.5,
                relative_gap: 0.25
            }),
            r#"{"status":"bounded","upper_bound_tokens_per_s":80.5,"relative_gap":0.25}"#
        );
    }
}
