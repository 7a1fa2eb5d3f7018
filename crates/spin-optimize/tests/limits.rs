//! Documented size limits of both papers' scenarios: checked before any allocation, each error naming its field,
//! and search-space sizes that never print as u128::MAX.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
use spin_optimize::paper_a::heterogeneous::{ALG1_WORK_LIMIT, Alg1Params, paper_alg1};
use spin_optimize::paper_a::scenario::{MAX_DEVICES, MAX_PLAN_TABLE, MAX_TIME_S};
use spin_optimize::paper_a::{self, Scenario};
use spin_optimize::paper_b::reactive::{self, ModeScheme};
use spin_optimize::paper_b::scenario::MAX_PLANNING_WORK;
use spin_optimize::paper_b::{self, Objective, SaaEvaluator};

fn paper_a_spec(k: usize, max_draft_len: u32) -> paper_a::ScenarioSpec {
    paper_a::ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 34816.0,
        verify_fixed_s: 0.02268,
        verify_per_device_s: 0.01272,
        max_draft_len,
        min_draft_len: 1,
        devices: vec![
            paper_a::DeviceSpec {
                acceptance: 0.8,
                draft_token_s: 0.02,
                spectral_efficiency: 8.0,
            };
            k
        ],
    }
}

fn paper_b_spec(k: usize) -> paper_b::ScenarioSpec {
    paper_b::ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 34816.0,
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: 20,
        ul_power_w: 0.0316,
        dl_power_w: 1.0,
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2e-20,
        saa_samples: 1000,
        seed: 1,
        devices: vec![
            paper_b::DeviceSpec {
                acceptance: 0.8,
                draft_token_s: 0.0152,
                channel_gain: 1e-12,
            };
            k
        ],
    }
}

fn err_a(spec: &paper_a::ScenarioSpec) -> String {
    Scenario::new(spec).unwrap_err().to_string()
}

#[test]
fn paper_a_limits_name_their_field() {
    assert!(Scenario::new(&paper_a_spec(MAX_DEVICES, 25)).is_ok());
    const { assert!(MAX_DEVICES as u64 * 25 <= MAX_PLAN_TABLE) };
    let e = err_a(&paper_a_spec(MAX_DEVICES + 1, 2));
    assert!(
        e.starts_with("devices: 10001 devices are more than the limit"),
        "{e}"
    );
    let e = err_a(&paper_a_spec(5000, 1024));
    assert!(e.starts_with("devices: 5000 devices × 1024 draft lengths"), "{e}");
    const { assert!(5000 * 1024 > MAX_PLAN_TABLE) };
    let e = err_a(&paper_a_spec(2, 1025));
    assert!(e.starts_with("max_draft_len: 1025 is outside [1, 1024]"), "{e}");

    let mut spec = paper_a_spec(3, 25);
    spec.devices[2].draft_token_s = 1e101;
    assert!(err_a(&spec).starts_with("devices[2].draft_token_s: 1e101 s is above the limit"));
    let mut spec = paper_a_spec(3, 25);
    spec.verify_fixed_s = MAX_TIME_S * 10.0;
    assert!(err_a(&spec).starts_with("verify_fixed_s:"));
    // An upload time outside [1e-100, 1e100] s would overflow or underflow the planners' sums.
    // A shared field that puts every device out of range is named, not the first device's spectral efficiency.
    let mut spec = paper_a_spec(3, 25);
    spec.distribution_bits = 1e-300;
    assert!(err_a(&spec).starts_with("bandwidth_hz, distribution_bits: one token takes"));
    let mut spec = paper_a_spec(3, 25);
    spec.bandwidth_hz = 1e308;
    assert!(err_a(&spec).starts_with("bandwidth_hz, distribution_bits: one token takes"));
    let mut spec = paper_a_spec(3, 25);
    spec.devices[1].spectral_efficiency = 1e-300;
    assert!(err_a(&spec).starts_with("devices[1].spectral_efficiency:"));
    let mut spec = paper_a_spec(1, 25);
    spec.bandwidth_hz = 1e308;
    assert!(err_a(&spec).starts_with("bandwidth_hz, distribution_bits, devices[0].spectral_efficiency:"));
}

/// Paper B's times obey paper A's limit: 1e308 s made a round's latency ∞, printed as a `null` latency with
/// exit 0.
#[test]
fn paper_b_times_are_bounded_like_paper_a_s() {
    let err_b = |f: &dyn Fn(&mut paper_b::ScenarioSpec)| {
        let mut spec = paper_b_spec(3);
        f(&mut spec);
        paper_b::Scenario::new(spec).unwrap_err().to_string()
    };
    assert!(paper_b::Scenario::new(paper_b_spec(3)).is_ok());
    let e = err_b(&|s| s.verify_fixed_s = 1e308);
    assert!(
        e.starts_with("verify_fixed_s: 1e308 s is above the limit of 1e100 s"),
        "{e}"
    );
    let e = err_b(&|s| s.verify_per_device_s = MAX_TIME_S * 10.0);
    assert!(
        e.starts_with("verify_per_device_s: 1e101 s is above the limit"),
        "{e}"
    );
    let e = err_b(&|s| s.devices[2].draft_token_s = 1e101);
    assert!(
        e.starts_with("devices[2].draft_token_s: 1e101 s is above the limit"),
        "{e}"
    );
}

#[test]
fn algorithm1_grid_is_bounded() {
    let s = Scenario::new(&paper_a_spec(10, 25)).unwrap();
    let params = Alg1Params {
        phi_points: 1_000_000,
        lambda_points: 1_000,
        lambda_lo_ratio: 1e-6,
    };
    const { assert!(1_000_000u128 * 1_000 * 10 > ALG1_WORK_LIMIT) };
    let e = paper_alg1(&s, &params).unwrap_err().to_string();
    assert!(
        e.starts_with("alg1_phi_points: alg1_phi_points × alg1_lambda_points × devices"),
        "{e}"
    );
    // An empty grid is named by the field a scenario file gives it in.
    for (phi_points, lambda_points, field) in [(0, 100, "alg1_phi_points"), (100, 0, "alg1_lambda_points")] {
        let params = Alg1Params {
            phi_points,
            lambda_points,
            lambda_lo_ratio: 1e-6,
        };
        let e = paper_alg1(&s, &params).unwrap_err().to_string();
        assert_eq!(e, format!("{field}: must be at least 1"));
    }
    let params = Alg1Params {
        lambda_lo_ratio: 0.0,
        ..Alg1Params::default()
    };
    let e = paper_alg1(&s, &params).unwrap_err().to_string();
    assert!(e.starts_with("alg1_lambda_lo_ratio: "), "{e}");
}

#[test]
fn search_sizes_never_print_as_u128_max() {
    let s = Scenario::new(&paper_a_spec(40, 25)).unwrap();
    let e = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap_err().to_string();
    assert!(!e.contains(&u128::MAX.to_string()), "{e}");
    // 25^40 ≈ 8.3e55 saturates u128.
    assert_eq!(
        e,
        "devices: search space of more than 3.4e38 points exceeds the limit of 2000000"
    );
    let s = Scenario::new(&paper_a_spec(5, 25)).unwrap();
    let e = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap_err().to_string();
    assert_eq!(
        e,
        "devices: search space of 9765625 points exceeds the limit of 2000000"
    );

    let sc = paper_b::Scenario::new(paper_b_spec(4)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for (m, printed) in [
        (21, "2097152"),
        (127, "170141183460469231731687303715884105728"),
        (128, "more than 3.4e38"),
        (500, "more than 3.4e38"),
    ] {
        let e = reactive::solve(&sc.link(), &vec![1e-12; m], ModeScheme::BruteForce, &mut rng)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("rejected: search space of {printed} points exceeds the limit of 1048576")
        );
    }
}

#[test]
fn paper_b_planning_at_a_hundred_thousand_devices_is_refused_before_allocating() {
    // K = 10⁵ used to allocate 8·K² = 80 GB and abort. Reactive correction still accepts the scenario.
    let sc = paper_b::Scenario::new(paper_b_spec(100_000)).unwrap();
    let e = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("devices: 100000 devices are more than proactive planning accepts"),
        "{e}"
    );
    assert!(e.contains(&MAX_PLANNING_WORK.to_string()), "{e}");
    let e = paper_b::Scenario::new(paper_b_spec(100_001))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("devices: 100001 devices are more than the limit"),
        "{e}"
    );
    let c = reactive::solve(
        &sc.link(),
        &vec![1e-12; 100_000],
        ModeScheme::Optimal,
        &mut ChaCha8Rng::seed_from_u64(0),
    )
    .unwrap();
    assert_eq!(c.modes.len(), 100_000);

    // The work limit: K²·(γ_max + 1)·N_SAA.
    let sc = paper_b::Scenario::new(paper_b_spec(300)).unwrap();
    let e = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate)
        .unwrap_err()
        .to_string();
    const { assert!(300u128 * 300 * 21 * 1000 > MAX_PLANNING_WORK) };
    assert!(
        e.starts_with("saa_samples: devices² × (max_draft_len + 1) × saa_samples"),
        "{e}"
    );
    let sc = paper_b::Scenario::new(paper_b_spec(20)).unwrap();
    assert!(SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).is_ok());
}

#[test]
fn paper_b_planning_memory_is_linear_in_devices() {
    // The evaluator used to tabulate K² UL delays and refuse K > 2000. Now only the work limit bounds K: 5000
    // devices with γ_max = 1 and 10 samples (5000² × 2 × 10 = 5·10⁸ sample visits) are accepted and evaluated
    // (the on-the-fly UL delays equal the old table's entries by construction: the same function, the same inputs).
    let mut spec = paper_b_spec(5000);
    spec.max_draft_len = 1;
    spec.saa_samples = 10;
    for (k, d) in spec.devices.iter_mut().enumerate() {
        d.channel_gain = 1e-12 * (1.0 + (k % 7) as f64);
    }
    let sc = paper_b::Scenario::new(spec).unwrap();
    let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
    let draft_lengths = vec![1u32; 5000];
    let v = ev.value(&draft_lengths);
    assert!(v.is_finite() && v > 0.0, "{v}");
    // K alone past the limit is named as `devices`, even with one sample.
    let mut spec = paper_b_spec(30_000);
    spec.saa_samples = 1;
    let e = SaaEvaluator::new(
        &paper_b::Scenario::new(spec).unwrap(),
        ModeScheme::Optimal,
        Objective::Rate,
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("devices: 30000 devices"), "{e}");
}
