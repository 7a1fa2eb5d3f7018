//! The exact planner's worst-case work: issue 13's slow "ordinary" scenarios finish certified within the default
//! budget, and a budget that runs out yields the best plan found with a rigorous bound, never an error.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
use spin_optimize::paper_a::exact::{
    DEFAULT_WORK_BUDGET, exact_with_budget, exact_with_stats, overshoot_bound,
};
use spin_optimize::paper_a::testing::{ordinary_scenario, ordinary_scenario_with};
use spin_optimize::paper_a::{Optimality, Scenario};

/// The `index`-th scenario of `ordinary_scenario` from `seed`.
fn ordinary(seed: u64, index: usize) -> Scenario {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for _ in 0..index {
        ordinary_scenario(&mut rng);
    }
    ordinary_scenario(&mut rng)
}

#[test]
fn the_slow_ordinary_scenarios_are_certified_within_the_default_budget() {
    // Before the budget these took 1.6·10⁹, 4.5·10⁸ and 2.0·10⁸ knapsack nodes (33 s, 8.5 s, 4.1 s in release).
    for (seed, index, k) in [(3, 31, 36), (4, 15, 39), (4, 194, 29)] {
        let s = ordinary(seed, index);
        assert_eq!(s.len(), k);
        let (plan, stats) = exact_with_stats(&s).unwrap();
        assert!(
            stats.work <= DEFAULT_WORK_BUDGET + overshoot_bound(&s),
            "{stats:?}"
        );
        assert_eq!(
            plan.optimality,
            Optimality::Optimal,
            "seed {seed} #{index}: {stats:?}"
        );
        assert!(stats.knapsack_nodes < 50_000_000, "{stats:?}");
    }
}

#[test]
fn a_spent_budget_returns_the_best_plan_with_a_true_upper_bound() {
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let (mut bounded, mut optimal) = (0, 0);
    for case in 0..40 {
        let k = rng.random_range(2..=4usize);
        let l_max = rng.random_range(2..=9);
        let s = ordinary_scenario_with(&mut rng, k, l_max);
        let truth = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap().goodput_tokens_per_s;
        let budget = rng.random_range(0..12_000u64);
        let (plan, stats) = exact_with_budget(&s, budget).unwrap();
        assert!(
            stats.work <= budget + overshoot_bound(&s),
            "case {case}: {stats:?}"
        );
        assert!(plan.goodput_tokens_per_s <= truth * (1.0 + 1e-9));
        match plan.optimality {
            Optimality::Optimal => {
                optimal += 1;
                assert!(
                    plan.goodput_tokens_per_s >= truth * (1.0 - 1e-9),
                    "case {case}: certified {} below brute force {truth}",
                    plan.goodput_tokens_per_s
                );
            }
            Optimality::Bounded {
                upper_bound_tokens_per_s,
                relative_gap,
            } => {
                bounded += 1;
                assert!(
                    upper_bound_tokens_per_s >= truth * (1.0 - 1e-12),
                    "case {case}: bound {upper_bound_tokens_per_s} below the optimum {truth}"
                );
                let gap = (upper_bound_tokens_per_s - plan.goodput_tokens_per_s) / plan.goodput_tokens_per_s;
                assert!((gap - relative_gap).abs() <= 1e-12 * gap.max(1.0));
                assert!(relative_gap > 0.0);
            }
            Optimality::NoClaim => panic!("case {case}: the exact planner always makes a claim"),
        }
    }
    assert!(
        bounded >= 5 && optimal >= 5,
        "bounded {bounded}, optimal {optimal}"
    );
}

#[test]
fn a_zero_budget_still_plans() {
    let s = ordinary(1, 0);
    let (plan, _) = exact_with_budget(&s, 0).unwrap();
    assert_eq!(plan.draft_lengths.len(), s.len());
    assert!(matches!(plan.optimality, Optimality::Bounded { .. }));
    let total: f64 = plan.uplink_share_hz.iter().sum();
    assert!(total <= s.bandwidth_hz);
}
