//! Issue 13's "feasible input refused" cases: extreme bandwidths and payloads, rounding in the bandwidth sum, and
//! Fixed BW&L's draft length, for every paper-A scheme. Each case was refused before the slack-form root.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_optimize::OptimizeError;
use spin_optimize::paper_a::baselines::{FIXED_DRAFT_LEN, default_fixed_draft_len, fixed, uni_bw};
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
use spin_optimize::paper_a::exact::exact;
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::homogeneous::homo;
use spin_optimize::paper_a::{DeviceSpec, Plan, Scenario, ScenarioSpec};

/// scenarios/examples/paper-a.json.
fn example() -> ScenarioSpec {
    let d = |acceptance, draft_token_s, spectral_efficiency| DeviceSpec {
        acceptance,
        draft_token_s,
        spectral_efficiency,
    };
    ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 31744.0,
        verify_fixed_s: 0.02268,
        verify_per_device_s: 0.01272,
        max_draft_len: 25,
        min_draft_len: 1,
        devices: vec![
            d(0.8582, 0.021, 12.5),
            d(0.7390, 0.019, 9.1),
            d(0.7393, 0.023, 14.2),
            d(0.7126, 0.020, 6.8),
        ],
    }
}

fn all_schemes(s: &Scenario) -> Vec<(&'static str, Result<Plan, OptimizeError>)> {
    let alg1 = Alg1Params {
        phi_points: 20,
        lambda_points: 20,
        lambda_lo_ratio: 1e-6,
    };
    vec![
        ("exact", exact(s)),
        ("paper-alg1", paper_alg1(s, &alg1)),
        ("homo", homo(s)),
        ("uni-bw", uni_bw(s)),
        ("fixed", fixed(s, default_fixed_draft_len(s))),
        ("brute-force", brute_force(s, BRUTE_FORCE_LIMIT)),
    ]
}

/// Every scheme returns a plan that uses at most the band, and the exact planner is the best of them.
fn check_all(spec: &ScenarioSpec, tag: &str) {
    let s = Scenario::new(spec).unwrap_or_else(|e| panic!("{tag}: scenario refused: {e}"));
    let mut best_other = 0.0f64;
    let mut exact_value = None;
    for (name, plan) in all_schemes(&s) {
        let plan = plan.unwrap_or_else(|e| panic!("{tag}: {name} refused a feasible scenario: {e}"));
        let total: f64 = plan.uplink_share_hz.iter().sum();
        assert!(
            total <= s.bandwidth_hz,
            "{tag}: {name} uses {total} Hz of {}",
            s.bandwidth_hz
        );
        assert!(plan.goodput_tokens_per_s.is_finite() && plan.goodput_tokens_per_s > 0.0);
        if name == "exact" {
            exact_value = Some(plan.goodput_tokens_per_s);
        } else if name == "brute-force" {
            let e = exact_value.unwrap_or(0.0);
            let gap = (plan.goodput_tokens_per_s - e).abs() / e;
            assert!(
                gap <= 1e-9,
                "{tag}: exact {e} vs brute force {}",
                plan.goodput_tokens_per_s
            );
        } else {
            best_other = best_other.max(plan.goodput_tokens_per_s);
        }
    }
    let e = exact_value.unwrap_or(0.0);
    assert!(
        e >= best_other * (1.0 - 1e-9),
        "{tag}: exact {e} below another scheme {best_other}"
    );
}

#[test]
fn wide_bands_from_the_issue_are_planned() {
    // 1e13, 1e15 and 1e17 Hz failed while 1e14 and 1e16 worked; sweep every half decade up to 1e20.
    for e in 0..=40 {
        let mut spec = example();
        spec.max_draft_len = 8; // keeps brute force at 8⁴ plans
        spec.bandwidth_hz = 10f64.powf(f64::from(e) / 2.0);
        check_all(&spec, &format!("bandwidth_hz = {:e}", spec.bandwidth_hz));
    }
}

#[test]
fn tiny_payloads_from_the_issue_are_planned() {
    // distribution_bits = 0.001 failed with an argmin "BrentRoot" error.
    for e in -8..=8 {
        let mut spec = example();
        spec.max_draft_len = 8;
        spec.distribution_bits = 10f64.powi(e);
        check_all(
            &spec,
            &format!("distribution_bits = {:e}", spec.distribution_bits),
        );
    }
}

#[test]
fn the_rounding_case_of_the_issue_and_random_band_edges_are_planned() {
    // A K = 4 scenario at B = 185464209.85 Hz was refused with "bandwidths sum to 185464210.23 Hz"; the exact
    // scenario is not in the issue, so draw many K = 4 scenarios at that band and on a log-uniform range of scales.
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    for case in 0..60 {
        let mut spec = example();
        spec.bandwidth_hz = if case < 20 {
            185_464_209.85
        } else {
            10f64.powf(rng.random_range(0.0..20.0))
        };
        spec.distribution_bits = 10f64.powf(rng.random_range(-3.0..6.0));
        spec.max_draft_len = rng.random_range(1..=12);
        for d in &mut spec.devices {
            d.acceptance = rng.random_range(0.05..0.99);
            d.draft_token_s = 10f64.powf(rng.random_range(-4.0..-0.5));
            d.spectral_efficiency = 10f64.powf(rng.random_range(-1.0..1.3));
        }
        check_all(&spec, &format!("case {case}"));
    }
}

#[test]
fn a_plan_a_few_ulps_over_the_band_is_accepted_and_a_real_excess_is_not() {
    let s = Scenario::new(&example()).unwrap();
    let share = s.bandwidth_hz / 4.0;
    let lens = [4, 4, 4, 4];
    assert!(s.evaluate(&lens, &[share * (1.0 + 1e-12); 4]).is_ok());
    let err = s.evaluate(&lens, &[share * (1.0 + 1e-6); 4]).unwrap_err();
    assert!(
        err.to_string().starts_with("infeasible: uplink shares sum to"),
        "{err}"
    );
}

#[test]
fn fixed_takes_its_length_and_never_fails_for_a_short_range() {
    let mut spec = example();
    for max in 1..=12 {
        spec.max_draft_len = max;
        let s = Scenario::new(&spec).unwrap();
        let l = default_fixed_draft_len(&s);
        assert_eq!(l, FIXED_DRAFT_LEN.min(max));
        let plan = fixed(&s, l).unwrap();
        assert!(plan.draft_lengths.iter().all(|&x| x == l));
        for given in 1..=max {
            assert_eq!(fixed(&s, given).unwrap().draft_lengths, vec![given; 4]);
        }
        let err = fixed(&s, max + 1).unwrap_err().to_string();
        assert_eq!(err, format!("fixed_draft_len: {} is outside [1, {max}]", max + 1));
    }
    spec.max_draft_len = 25;
    spec.min_draft_len = 10;
    let s = Scenario::new(&spec).unwrap();
    assert_eq!(default_fixed_draft_len(&s), 10);
    assert!(
        fixed(&s, 0)
            .unwrap_err()
            .to_string()
            .starts_with("fixed_draft_len: 0")
    );
}
