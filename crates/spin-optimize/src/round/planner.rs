//! The [`Planner`] trait and its implementations: paper A's and paper B's schemes ([`PaperPlanner`]) and the
//! unified planner, each over one [`Round`] and returning one [`RoundPlan`] scored by the unified model.

use super::plan::{CorrectionPolicy, RoundPlan};
use super::scheme::{Family, Scheme};
use super::spec::{PayloadPolicy, Round};
use crate::OptimizeError;
use crate::paper_a;
use crate::paper_b::{self, Objective};
use crate::unified;

/// Runs the paper-A planner of `scheme` on `s`: `fixed` drafts `fixed_draft_len` tokens (the caller chooses and
/// checks it), `paper-alg1` uses `alg1`, `brute-force` enumerates up to [`paper_a::brute::BRUTE_FORCE_LIMIT`]
/// plans. A scheme of another family is an error naming `scheme`, never a silent fallback.
pub fn plan_paper_a(
    scheme: Scheme,
    s: &paper_a::Scenario,
    fixed_draft_len: u32,
    alg1: &paper_a::heterogeneous::Alg1Params,
) -> Result<paper_a::Plan, OptimizeError> {
    match scheme {
        Scheme::Exact => paper_a::exact::exact(s),
        Scheme::PaperAlg1 => paper_a::heterogeneous::paper_alg1(s, alg1),
        Scheme::Homo => paper_a::homogeneous::homo(s),
        Scheme::UniBw => paper_a::baselines::uni_bw(s),
        Scheme::Fixed => paper_a::baselines::fixed(s, fixed_draft_len),
        Scheme::BruteForce => paper_a::brute::brute_force(s, paper_a::brute::BRUTE_FORCE_LIMIT),
        other => Err(OptimizeError::Invalid {
            field: "scheme".into(),
            reason: format!("{other} is not a paper-a scheme"),
        }),
    }
}

/// Runs the paper-B planner of `scheme` (`greedy`, `best`, `uniform`, `comp-only` or `exhaustive`, the last up to
/// [`paper_b::proactive::EXHAUSTIVE_LIMIT`] points) on `ev`'s scenario and samples, under its mode rule and
/// objective. A scheme of another family is an error naming `scheme`, never a silent fallback.
pub fn plan_paper_b(scheme: Scheme, ev: &paper_b::SaaEvaluator) -> Result<paper_b::Plan, OptimizeError> {
    plan_paper_b_until(scheme, ev, None)
}

/// [`plan_paper_b`] with a wall-clock deadline for `best`'s exhaustive step ([`paper_b::proactive::best_until`]);
/// the other schemes are bounded without one and ignore it.
pub fn plan_paper_b_until(
    scheme: Scheme,
    ev: &paper_b::SaaEvaluator,
    deadline: Option<std::time::Instant>,
) -> Result<paper_b::Plan, OptimizeError> {
    use paper_b::proactive;
    Ok(match scheme {
        Scheme::Greedy => proactive::greedy(ev),
        Scheme::Best => proactive::best_until(ev, deadline),
        Scheme::Uniform => proactive::uniform(ev),
        Scheme::CompOnly => proactive::comp_only(ev),
        Scheme::Exhaustive => proactive::exhaustive(ev, proactive::EXHAUSTIVE_LIMIT)?,
        other => {
            return Err(OptimizeError::Invalid {
                field: "scheme".into(),
                reason: format!(
                    "{other} is not a paper-b scheme; expected {}",
                    Scheme::name_list(Scheme::of_family(Family::PaperB))
                ),
            });
        }
    })
}

/// A planner: one round in, one plan out, scored by the unified model ([`unified::score`]).
pub trait Planner {
    /// The scheme this planner implements.
    fn scheme(&self) -> Scheme;
    /// Plans `round`.
    fn plan(&self, round: &Round) -> Result<RoundPlan, OptimizeError>;
}

/// Runs one of the papers' planners on a [`Round`], inside the round's draft-length range and payload policy, and
/// scores its plan with the unified model.
///
/// Paper-A schemes plan L and the draft-uplink shares in paper A's system (no correction phase, L ≥ max(1,
/// `min_draft_len`), and for `exact` sending distributions also L = 0 where the round allows it: a device that
/// drafts nothing), with distributions per token; under `payload: pair` they plan the same way with the pair
/// size as the per-token upload and send pairs (paper A has no distributions to drop, so uncharged pairs,
/// `pair_bits = 0`, leave it nothing to plan: an error naming `payload`). Paper-B schemes plan γ in paper B's
/// system (pairs neglected, the correction's mode rule, equal split) on the round's samples; a γ_k below
/// `min_draft_len` is raised to it; the plan sends pairs over equal draft-uplink shares B/K (paper B allocates
/// none), or, under `payload: distribution`, distributions over Lemma-3 shares. Where the round prices the pass's
/// positions (T_tok > 0), neither paper's planner sees it: their plan's lengths are then capped where that raises
/// its value in the unified model (every scheme but `fixed`; docs/unified.md, "Positions in the pass").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperPlanner {
    /// The scheme to run (a paper-A or paper-B one).
    pub scheme: Scheme,
    /// The objective paper-B schemes maximise and plans are reported under.
    pub objective: Objective,
    /// The correction rule: paper-B schemes plan under its mode rule, and the plan is scored under it.
    pub correction: CorrectionPolicy,
    /// How the plan's value is taken (the unified planner's default: exact up to 4096 outcomes, else SAA).
    pub expectation: unified::Expectation,
    /// The draft length of `fixed`, moved into [max(1, `min_draft_len`), `max_draft_len`] when outside.
    pub fixed_draft_len: u32,
    /// Algorithm 1's grids for `paper-alg1`.
    pub alg1: paper_a::heterogeneous::Alg1Params,
    /// A wall-clock deadline for `best`'s exhaustive step ([`unified::Options::deadline`]); None: none.
    pub deadline: Option<std::time::Instant>,
}

impl PaperPlanner {
    /// `scheme` under `objective` with the unified planner's defaults for the rest: optimal modes, equal split,
    /// exact expectation up to 4096 outcomes, the fixed length [`paper_a::baselines::FIXED_DRAFT_LEN`] and
    /// Algorithm 1's default grids.
    pub fn new(scheme: Scheme, objective: Objective) -> PaperPlanner {
        let options = unified::Options::default();
        PaperPlanner {
            scheme,
            objective,
            correction: options.correction,
            expectation: options.expectation,
            fixed_draft_len: paper_a::baselines::FIXED_DRAFT_LEN,
            alg1: paper_a::heterogeneous::Alg1Params::default(),
            deadline: None,
        }
    }

    /// Paper A's decisions on `round`: draft lengths, shares, payload, and whether paper A proved them optimal in
    /// the unified model too (no correction phase, and the exact planner searched the round's whole range: its
    /// objective is then paper A's). Where the round allows L = 0 and distributions are sent, `exact` searches it
    /// too ([`paper_a::exact::exact_with_idle`]); the other paper-A schemes draft L ≥ 1 as paper A does.
    fn paper_a(&self, round: &Round) -> Result<(Vec<u32>, Vec<f64>, bool, bool), OptimizeError> {
        let policy = round.payload.policy;
        let sends_distributions = policy.allows_distribution();
        let token_bits = if sends_distributions {
            round.payload.distribution_bits
        } else if round.payload.pair_bits > 0.0 {
            round.payload.pair_bits
        } else {
            return Err(OptimizeError::Invalid {
                field: "payload".into(),
                reason: format!(
                    "{} plans the per-token upload of distributions or charged pairs; this round sends only \
                     uncharged pairs (pair_bits = 0): plan it with a paper-b scheme or unified",
                    self.scheme
                ),
            });
        };
        let s = round.to_paper_a_with_token_bits(token_bits)?;
        let fixed = self.fixed_draft_len.clamp(s.min_draft_len, s.max_draft_len);
        // Drafting nothing is searched where paper A's objective is the model's: with distributions per token no
        // rejection is corrected, so the plan's value is paper A's eq. 27. With pairs it is not (paper A does not
        // see the correction phase), and a larger search space in that objective need not score better.
        let idle = self.scheme == Scheme::Exact && round.min_draft_len == 0 && sends_distributions;
        let p = if idle {
            paper_a::exact::exact_with_idle(&s)?
        } else {
            plan_paper_a(self.scheme, &s, fixed, &self.alg1)?
        };
        // Paper A's objective is the model's only without T_tok.
        let proven = policy == PayloadPolicy::Distribution
            && round.verify_per_draft_token_s == 0.0
            && (round.min_draft_len >= 1 || idle)
            && p.optimality == paper_a::Optimality::Optimal;
        Ok((p.draft_lengths, p.uplink_share_hz, sends_distributions, proven))
    }

    /// Paper B's plan of `round`, scored on the samples its planner drew (the round's: the same rates, count,
    /// L_max and seed), so they are drawn once. `comp-only` plans from the round alone (its lengths maximise
    /// Σ E[N_k] over the drafting deadline, which needs no sample; paper B's own SAA value of them is not reported
    /// here), so no SAA evaluator is built for it and the scorer draws the samples; the checks are the evaluator's,
    /// so it refuses what the other schemes refuse.
    fn paper_b(&self, round: &Round) -> Result<RoundPlan, OptimizeError> {
        let k = round.len();
        let s = round.to_paper_b()?;
        let ev;
        let (planned, drawn) = if self.scheme == Scheme::CompOnly {
            paper_b::SaaEvaluator::check_scenario(&s, self.correction.modes)?;
            let acceptance: Vec<f64> = s.devices.iter().map(|d| d.acceptance).collect();
            let draft_token_s: Vec<f64> = s.devices.iter().map(|d| d.draft_token_s).collect();
            let lengths = paper_b::proactive::comp_only_lengths(
                &acceptance,
                &draft_token_s,
                s.verify_s(),
                s.max_draft_len,
            );
            (lengths, None)
        } else {
            ev = paper_b::SaaEvaluator::new(&s, self.correction.modes, self.objective)?;
            (
                plan_paper_b_until(self.scheme, &ev, self.deadline)?.draft_lengths,
                Some(ev.samples()),
            )
        };
        let draft_lengths: Vec<u32> = planned.into_iter().map(|g| g.max(round.min_draft_len)).collect();
        let sends_distributions = !round.payload.policy.allows_pair();
        let shares = if sends_distributions {
            unified::lemma3_shares(round, &draft_lengths, &vec![true; k])?
        } else {
            vec![round.bandwidth_hz / k as f64; k]
        };
        unified::model::score_on(
            round,
            self.expectation,
            self.correction,
            drawn,
            self.scheme,
            &draft_lengths,
            &vec![sends_distributions; k],
            &shares,
            false,
        )
    }
}

impl Planner for PaperPlanner {
    fn scheme(&self) -> Scheme {
        self.scheme
    }

    fn plan(&self, round: &Round) -> Result<RoundPlan, OptimizeError> {
        let k = round.len();
        let (draft_lengths, shares, sends_distributions, proven) = match self.scheme.family() {
            Family::PaperA => self.paper_a(round)?,
            Family::PaperB => return self.capped(round, self.paper_b(round)?),
            Family::Unified => {
                return unified::UnifiedPlanner {
                    options: unified::Options {
                        objective: self.objective,
                        expectation: self.expectation,
                        correction: self.correction,
                        deadline: self.deadline,
                        ..unified::Options::default()
                    },
                }
                .plan(round);
            }
        };
        let plan = unified::score(
            round,
            self.expectation,
            self.correction,
            self.scheme,
            &draft_lengths,
            &vec![sends_distributions; k],
            &shares,
            proven,
        )?;
        self.capped(round, plan)
    }
}

impl PaperPlanner {
    /// Where the round prices the positions of the pass (T_tok > 0, which neither paper's model has), the paper's
    /// plan with every L_k capped at the common cap c ∈ [`min_draft_len`, max L_k) whose value (under the planner's
    /// objective) is highest, if one beats the uncapped plan; payloads kept, shares Lemma 3's again for a plan
    /// that sends distributions only, else kept (paper B's B/K). `fixed` keeps its length: that length is what the
    /// baseline is about. With T_tok = 0 the plan is returned as it is. Past the planner's deadline no further cap is
    /// scored (the best so far stands), from the longest cap down, so the caps tried first are the smallest changes.
    fn capped(&self, round: &Round, plan: RoundPlan) -> Result<RoundPlan, OptimizeError> {
        if round.verify_per_draft_token_s == 0.0 || self.scheme == Scheme::Fixed {
            return Ok(plan);
        }
        let top = plan.draft_lengths.iter().copied().max().unwrap_or(0);
        let all_distributions = plan.sends_distributions.iter().all(|&d| d);
        let mut best: Option<RoundPlan> = None;
        for cap in (round.min_draft_len..top).rev() {
            if self.deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                break;
            }
            let lengths: Vec<u32> = plan.draft_lengths.iter().map(|&l| l.min(cap)).collect();
            let shares = if all_distributions {
                unified::lemma3_shares(round, &lengths, &plan.sends_distributions)?
            } else {
                plan.uplink_share_hz.clone()
            };
            let p = unified::score(
                round,
                self.expectation,
                self.correction,
                self.scheme,
                &lengths,
                &plan.sends_distributions,
                &shares,
                false,
            )?;
            let bar = best.as_ref().unwrap_or(&plan).goodput(self.objective);
            if p.goodput(self.objective) > bar {
                best = Some(p);
            }
        }
        Ok(best.unwrap_or(plan))
    }
}

impl Planner for unified::UnifiedPlanner {
    fn scheme(&self) -> Scheme {
        Scheme::Unified
    }

    fn plan(&self, round: &Round) -> Result<RoundPlan, OptimizeError> {
        unified::plan(round, &self.options)
    }
}

/// The planner of `scheme`: the unified planner with `options`, or a [`PaperPlanner`] that takes the objective,
/// the correction rule and the expectation from `options` and drafts `fixed_draft_len` tokens under `fixed`.
pub fn planner(scheme: Scheme, options: &unified::Options, fixed_draft_len: u32) -> Box<dyn Planner> {
    match scheme {
        Scheme::Unified => Box::new(unified::UnifiedPlanner { options: *options }),
        _ => Box::new(PaperPlanner {
            scheme,
            objective: options.objective,
            correction: options.correction,
            expectation: options.expectation,
            fixed_draft_len,
            alg1: paper_a::heterogeneous::Alg1Params::default(),
            deadline: options.deadline,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unified::testing::DropRound;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn paper_b_plans_scored_on_their_planners_samples_are_scored_as_by_drawing_them_again() {
        // Paper B's planners hand their samples to the scorer instead of having them drawn twice: every printed
        // number is the bits `unified::score` gives the same plan drawing them itself.
        let mut rng = ChaCha8Rng::seed_from_u64(64);
        for (i, policy) in [
            PayloadPolicy::Pair,
            PayloadPolicy::Choose,
            PayloadPolicy::Distribution,
        ]
        .into_iter()
        .enumerate()
        {
            let round = DropRound {
                devices: 10 + i,
                draft_range: (i as u32, 8),
                saa_samples: 120,
                policy,
                ..DropRound::default()
            }
            .draw(&mut rng)
            .unwrap();
            for scheme in Scheme::PER_ROUND
                .into_iter()
                .filter(|s| s.family() == Family::PaperB)
            {
                let planner = PaperPlanner::new(scheme, Objective::Rate);
                let p = planner.plan(&round).unwrap();
                let again = unified::score(
                    &round,
                    planner.expectation,
                    planner.correction,
                    scheme,
                    &p.draft_lengths,
                    &p.sends_distributions,
                    &p.uplink_share_hz,
                    false,
                )
                .unwrap();
                assert!(
                    matches!(p.estimate, crate::round::PlanEstimate::Saa { samples: 120, .. })
                        || policy == PayloadPolicy::Distribution
                );
                let bits = |q: &RoundPlan| {
                    [
                        q.rate_tokens_per_s,
                        q.mean_ratio_tokens_per_s,
                        q.tokens_per_round,
                        q.uplink_latency_s,
                        q.comm_delay_s,
                    ]
                    .map(f64::to_bits)
                };
                assert_eq!(bits(&p), bits(&again), "{scheme} {policy:?}");
                assert_eq!(p.estimate, again.estimate, "{scheme} {policy:?}");
            }
        }
    }

    #[test]
    fn comp_only_plans_without_an_saa_evaluator_and_refuses_what_the_others_refuse() {
        let mut rng = ChaCha8Rng::seed_from_u64(65);
        let round = DropRound {
            devices: 12,
            draft_range: (0, 8),
            saa_samples: 90,
            ..DropRound::default()
        }
        .draw(&mut rng)
        .unwrap();
        // The lengths are the ones paper B's comp-only plan takes on its evaluator.
        let ev = paper_b::SaaEvaluator::new(
            &round.to_paper_b().unwrap(),
            paper_b::ModeScheme::Optimal,
            Objective::Rate,
        )
        .unwrap();
        let want = plan_paper_b(Scheme::CompOnly, &ev).unwrap();
        let got = PaperPlanner::new(Scheme::CompOnly, Objective::Rate)
            .plan(&round)
            .unwrap();
        assert_eq!(got.draft_lengths, want.draft_lengths);
        // A mode rule no SAA evaluator takes is refused alike.
        for scheme in [Scheme::CompOnly, Scheme::Greedy] {
            let planner = PaperPlanner {
                correction: CorrectionPolicy {
                    modes: paper_b::ModeScheme::BruteForce,
                    ..CorrectionPolicy::default()
                },
                ..PaperPlanner::new(scheme, Objective::Rate)
            };
            assert_eq!(
                planner.plan(&round).unwrap_err().to_string(),
                "scheme: brute-force mode selection is a test reference, not an SAA policy (use optimal)"
            );
        }
    }

    #[test]
    fn plan_paper_b_refuses_other_papers_schemes_and_too_large_exhaustive_searches() {
        // Any paper-B scenario: the crate's example with fewer samples.
        let spec = |k: usize| paper_b::ScenarioSpec {
            saa_samples: 50,
            ..paper_b::scenario::tests::example(k)
        };
        let sc = paper_b::Scenario::new(spec(1)).unwrap();
        let ev = paper_b::SaaEvaluator::new(&sc, paper_b::ModeScheme::Optimal, Objective::Rate).unwrap();
        for scheme in Scheme::ALL {
            let r = plan_paper_b(scheme, &ev);
            assert_eq!(r.is_ok(), scheme.family() == Family::PaperB, "{scheme}");
            if let Err(e) = r {
                assert_eq!(
                    e.to_string(),
                    format!(
                        "scheme: {scheme} is not a paper-b scheme; expected greedy, best, uniform, comp-only or \
                         exhaustive"
                    )
                );
            }
        }
        let sc = paper_b::Scenario::new(spec(8)).unwrap();
        let ev = paper_b::SaaEvaluator::new(&sc, paper_b::ModeScheme::Optimal, Objective::Rate).unwrap();
        let err = plan_paper_b(Scheme::Exhaustive, &ev).unwrap_err();
        assert!(err.to_string().starts_with("devices:"), "{err}");
    }

    #[test]
    fn plan_paper_a_refuses_other_papers_schemes() {
        let s = paper_a::Scenario::new(&paper_a::ScenarioSpec {
            bandwidth_hz: 1e6,
            distribution_bits: 1000.0,
            verify_fixed_s: 0.02,
            verify_per_device_s: 0.002,
            max_draft_len: 4,
            min_draft_len: 1,
            devices: vec![paper_a::DeviceSpec {
                acceptance: 0.8,
                draft_token_s: 0.01,
                spectral_efficiency: 2.0,
            }],
        })
        .unwrap();
        let alg1 = paper_a::heterogeneous::Alg1Params::default();
        for scheme in Scheme::ALL {
            let r = plan_paper_a(scheme, &s, 2, &alg1);
            assert_eq!(r.is_ok(), scheme.family() == Family::PaperA, "{scheme}");
            if let Err(e) = r {
                assert_eq!(e.to_string(), format!("scheme: {scheme} is not a paper-a scheme"));
            }
        }
    }
}
