//! Property-based tests over generated scenarios for every scheme of both papers: no panic, bounded work, feasible
//! plans, and the brute-force optimum where brute force is small. Case counts are set explicitly so the whole file
//! stays within a few seconds in a debug build.

use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a::baselines::{default_fixed_draft_len, fixed, uni_bw};
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force, search_size};
use spin_optimize::paper_a::exact::{
    DEFAULT_WORK_BUDGET, exact_with_budget, exact_with_stats, overshoot_bound,
};
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::homogeneous::homo;
use spin_optimize::paper_a::{self, Optimality, Plan, Scenario};
use spin_optimize::paper_b::reactive::{self, Mode, ModeScheme};
use spin_optimize::paper_b::scenario::MAX_PLANNING_WORK;
use spin_optimize::paper_b::{self, Objective, SaaEvaluator};
use spin_optimize::round::Scheme;

/// 10^x for x drawn uniformly from `lo..hi`: scales over many decades.
fn decades(lo: f64, hi: f64) -> impl Strategy<Value = f64> {
    (lo..hi).prop_map(|x| 10f64.powf(x))
}

/// A paper-A device: α ∈ (0.02, 0.99), T^S from 0.1 ms to 1 s, r from 0.01 to 100 bit/s/Hz.
fn device_a() -> impl Strategy<Value = paper_a::DeviceSpec> {
    (0.02..0.99f64, decades(-4.0, 0.0), decades(-2.0, 2.0)).prop_map(
        |(acceptance, draft_token_s, spectral_efficiency)| paper_a::DeviceSpec {
            acceptance,
            draft_token_s,
            spectral_efficiency,
        },
    )
}

/// A paper-A scenario with `devices` devices and at most `span` allowed lengths; bands from 1 Hz to 10¹⁸ Hz and
/// payloads from 10⁻³ to 10⁷ bits cover the regimes issue 13 found refused.
fn scenario_a(devices: std::ops::RangeInclusive<usize>, span: u32) -> impl Strategy<Value = Scenario> {
    (
        decades(0.0, 18.0),
        decades(-3.0, 7.0),
        0.0..0.2f64,
        0.0..0.05f64,
        1..=3u32,
        0..span,
        prop::collection::vec(device_a(), devices),
    )
        .prop_map(|(bandwidth_hz, bits, fix, lin, min, extra, devices)| {
            Scenario::new(&paper_a::ScenarioSpec {
                bandwidth_hz,
                distribution_bits: bits,
                verify_fixed_s: fix,
                verify_per_device_s: lin,
                max_draft_len: min + extra,
                min_draft_len: min,
                devices,
            })
        })
        .prop_filter_map("inside the documented limits", Result::ok)
}

/// Checks what every paper-A plan must satisfy and returns its goodput.
fn check_plan(s: &Scenario, name: &str, plan: &Plan) -> Result<f64, TestCaseError> {
    prop_assert_eq!(plan.draft_lengths.len(), s.len(), "{}", name);
    prop_assert!(
        plan.draft_lengths.iter().all(|l| s.draft_range().contains(l)),
        "{}",
        name
    );
    let total: f64 = plan.uplink_share_hz.iter().sum();
    prop_assert!(
        total <= s.bandwidth_hz,
        "{}: {} Hz of {}",
        name,
        total,
        s.bandwidth_hz
    );
    prop_assert!(plan.uplink_share_hz.iter().all(|&b| b > 0.0), "{}", name);
    let (tau, round) = s
        .evaluate(&plan.draft_lengths, &plan.uplink_share_hz)
        .map_err(|e| TestCaseError::fail(format!("{name}: {e}")))?;
    prop_assert_eq!(tau, plan.goodput_tokens_per_s, "{}", name);
    prop_assert_eq!(round, plan.round_latency_s, "{}", name);
    prop_assert!(tau.is_finite() && tau > 0.0, "{}: {}", name, tau);
    Ok(tau)
}

fn all_a(s: &Scenario) -> Vec<(&'static str, Result<Plan, spin_optimize::OptimizeError>)> {
    let grid = Alg1Params {
        phi_points: 12,
        lambda_points: 12,
        lambda_lo_ratio: 1e-6,
    };
    vec![
        ("paper-alg1", paper_alg1(s, &grid)),
        ("homo", homo(s)),
        ("uni-bw", uni_bw(s)),
        ("fixed", fixed(s, default_fixed_draft_len(s))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Small instances: every scheme plans, exact and brute force agree and are certified, nothing beats them.
    #[test]
    fn paper_a_exact_equals_brute_force_and_bounds_every_scheme(s in scenario_a(1..=4, 6)) {
        prop_assume!(search_size(&s) <= 5_000);
        let (ex, stats) = exact_with_stats(&s).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let bf = brute_force(&s, BRUTE_FORCE_LIMIT).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(stats.work <= DEFAULT_WORK_BUDGET + overshoot_bound(&s));
        prop_assert_eq!(ex.optimality, Optimality::Optimal);
        prop_assert_eq!(bf.optimality, Optimality::Optimal);
        let e = check_plan(&s, "exact", &ex)?;
        let b = check_plan(&s, "brute-force", &bf)?;
        prop_assert!((e - b).abs() <= 1e-9 * b, "exact {} {:?} vs brute force {} {:?}", e, ex.draft_lengths, b, bf.draft_lengths);
        for (name, plan) in all_a(&s) {
            let plan = plan.map_err(|err| TestCaseError::fail(format!("{name}: {err}")))?;
            prop_assert_eq!(plan.optimality, Optimality::NoClaim);
            let v = check_plan(&s, name, &plan)?;
            prop_assert!(v <= b * (1.0 + 1e-9), "{} {} above the optimum {}", name, v, b);
        }
    }

    /// Larger instances: no panic, every plan feasible, exact's work bounded, exact never below another scheme
    /// when certified, its bound never below any plan when not.
    #[test]
    fn paper_a_schemes_plan_feasibly_with_bounded_work(s in scenario_a(1..=24, 25), budget in 0..400_000u64) {
        let (ex, stats) = exact_with_budget(&s, budget).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(stats.work <= budget + overshoot_bound(&s), "{:?}", stats);
        let e = check_plan(&s, "exact", &ex)?;
        let ceiling = match ex.optimality {
            Optimality::Optimal => e,
            Optimality::Bounded { upper_bound_tokens_per_s, relative_gap } => {
                prop_assert!(relative_gap > 0.0 && upper_bound_tokens_per_s > e);
                upper_bound_tokens_per_s
            }
            Optimality::NoClaim => return Err(TestCaseError::fail("exact made no claim")),
        };
        for (name, plan) in all_a(&s) {
            let plan = plan.map_err(|err| TestCaseError::fail(format!("{name}: {err}")))?;
            let v = check_plan(&s, name, &plan)?;
            prop_assert!(v <= ceiling * (1.0 + 1e-9), "{} {} above exact's ceiling {}", name, v, ceiling);
        }
    }

    /// Fixed BW&L takes any length in range and names `fixed_draft_len` for any other.
    #[test]
    fn paper_a_fixed_takes_any_allowed_length(s in scenario_a(1..=6, 12), l in 0..40u32) {
        match fixed(&s, l) {
            Ok(plan) => {
                prop_assert!(s.draft_range().contains(&l));
                check_plan(&s, "fixed", &plan)?;
            }
            Err(e) => {
                prop_assert!(!s.draft_range().contains(&l));
                prop_assert!(e.to_string().starts_with("fixed_draft_len: "), "{}", e);
            }
        }
    }
}

/// A paper-B scenario: up to `devices` devices from paper B's drop range of gains and wide power budgets.
fn scenario_b(
    devices: std::ops::RangeInclusive<usize>,
    max_len: u32,
) -> impl Strategy<Value = paper_b::Scenario> {
    let device = (0.05..0.98f64, decades(-3.0, -1.0), decades(-15.0, -9.0)).prop_map(
        |(acceptance, draft_token_s, channel_gain)| paper_b::DeviceSpec {
            acceptance,
            draft_token_s,
            channel_gain,
        },
    );
    (
        (
            decades(5.0, 8.0),
            decades(3.0, 6.0),
            0.0..0.1f64,
            0.0..0.02f64,
            1..=max_len,
        ),
        (
            decades(-4.0, 0.0),
            decades(-2.0, 2.0),
            decades(-21.0, -19.0),
            decades(-21.0, -19.0),
        ),
        (20..120u32, any::<u64>()),
        prop::collection::vec(device, devices),
    )
        .prop_map(
            |(
                (bandwidth_hz, bits, t0, t1, max_draft_len),
                (ul, dl, n_ser, n_dev),
                (saa_samples, seed),
                devices,
            )| {
                paper_b::Scenario::new(paper_b::ScenarioSpec {
                    bandwidth_hz,
                    distribution_bits: bits,
                    verify_fixed_s: t0 + 1e-3,
                    verify_per_device_s: t1,
                    max_draft_len,
                    ul_power_w: ul,
                    dl_power_w: dl,
                    noise_psd_server_w_per_hz: n_ser,
                    noise_psd_device_w_per_hz: n_dev,
                    saa_samples,
                    seed,
                    devices,
                })
            },
        )
        .prop_filter_map("inside the documented limits", Result::ok)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Every draft scheme on one set of samples: feasible lengths, values that re-evaluate bit for bit, `best` never
    /// below greedy or uniform, exhaustive search the ceiling where it is small.
    #[test]
    fn paper_b_draft_schemes_are_feasible_and_ordered(sc in scenario_b(1..=3, 4), mean_ratio in any::<bool>()) {
        let objective = if mean_ratio { Objective::MeanRatio } else { Objective::Rate };
        let k = sc.device_count() as u128;
        prop_assert!(k * k * (u128::from(sc.max_draft_len) + 1) * u128::from(sc.saa_samples) <= MAX_PLANNING_WORK);
        let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, objective).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut values = Vec::new();
        for scheme in [Scheme::Greedy, Scheme::Best, Scheme::Uniform, Scheme::CompOnly, Scheme::Exhaustive] {
            let plan = spin_optimize::round::plan_paper_b(scheme, &ev).map_err(|e| TestCaseError::fail(format!("{scheme:?}: {e}")))?;
            prop_assert_eq!(plan.draft_lengths.len(), sc.device_count());
            prop_assert!(plan.draft_lengths.iter().all(|&g| g <= sc.max_draft_len));
            prop_assert!(plan.value.is_finite() && plan.value > 0.0, "{:?}: {}", scheme, plan.value);
            prop_assert_eq!(plan.value.to_bits(), ev.value(&plan.draft_lengths).to_bits(), "{:?}", scheme);
            values.push(plan.value);
        }
        let (greedy, best, uniform, comp, exhaustive) = (values[0], values[1], values[2], values[3], values[4]);
        prop_assert!(best >= greedy && best >= uniform, "best {} greedy {} uniform {}", best, greedy, uniform);
        for v in [greedy, best, uniform, comp] {
            prop_assert!(v <= exhaustive, "{} above exhaustive {}", v, exhaustive);
        }
    }

    /// Every mode scheme on random rejected sets: the bisection equals exhaustive search, baselines are never
    /// faster, delays are finite and DL powers respect the budget.
    #[test]
    fn paper_b_mode_schemes_are_feasible_and_optimal_is_optimal(sc in scenario_b(1..=12, 2), seed in any::<u64>()) {
        let link = sc.link();
        let gains: Vec<f64> = sc.devices.iter().map(|d| d.channel_gain).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let opt = reactive::solve(&link, &gains, ModeScheme::Optimal, &mut rng).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let brute = reactive::solve(&link, &gains, ModeScheme::BruteForce, &mut rng).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!((opt.comm_delay_s - brute.comm_delay_s).abs() <= 1e-12 * brute.comm_delay_s);
        for scheme in [ModeScheme::Optimal, ModeScheme::AllUl, ModeScheme::AllDl, ModeScheme::Random, ModeScheme::BruteForce] {
            let c = reactive::solve(&link, &gains, scheme, &mut rng).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(c.modes.len(), gains.len());
            prop_assert!(c.comm_delay_s.is_finite() && c.comm_delay_s > 0.0, "{:?}", scheme);
            prop_assert!(c.comm_delay_s >= opt.comm_delay_s * (1.0 - 1e-12), "{:?}", scheme);
            let power: f64 = c.dl_power_w.iter().sum();
            prop_assert!(power <= sc.dl_power_w * (1.0 + 1e-12));
            for (m, p) in c.modes.iter().zip(&c.dl_power_w) {
                prop_assert_eq!(*m == Mode::Uplink, *p == 0.0);
            }
        }
        for scheme in [ModeScheme::AllUl, ModeScheme::AllDl, ModeScheme::Random] {
            let ev = SaaEvaluator::new(&sc, scheme, Objective::Rate).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let plan = spin_optimize::round::plan_paper_b(Scheme::Greedy, &ev).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(plan.value.is_finite() && plan.value > 0.0);
        }
    }
}
