//! The measurement helpers behind `multispin measure`: the affine latency fit against independent references
//! (first-order conditions, squared correlation), the interleaved verification sweep and the acceptance run with
//! their progress reports, and their errors on bad settings.

mod common;

use approx::assert_relative_eq;
use common::tiny;
use spin_runtime::RuntimeError;
use spin_runtime::measure::{self, Uplink};

fn field(e: RuntimeError) -> String {
    match e {
        RuntimeError::Invalid { field, .. } => field,
        other => panic!("expected an invalid-input error, got {other}"),
    }
}

#[test]
fn affine_fit_meets_the_least_squares_conditions_and_r2_is_the_squared_correlation() {
    let exact: Vec<(f64, f64)> = (1..=16).map(|k| (k as f64, 2.5e-4 + 1.1e-4 * k as f64)).collect();
    let f = measure::affine_fit(&exact).unwrap();
    assert_relative_eq!(f.intercept, 2.5e-4, max_relative = 1e-9);
    assert_relative_eq!(f.slope, 1.1e-4, max_relative = 1e-9);
    assert_relative_eq!(f.r2, 1.0, max_relative = 1e-12);

    // Noisy points: the residuals of a least-squares line sum to zero and are orthogonal to x.
    let noisy: Vec<(f64, f64)> = (1..=16)
        .map(|k| {
            let wobble = ((k * 37 % 11) as f64 - 5.0) * 3e-5;
            (k as f64, 2.5e-4 + 1.1e-4 * k as f64 + wobble)
        })
        .collect();
    let f = measure::affine_fit(&noisy).unwrap();
    let res: Vec<f64> = noisy
        .iter()
        .map(|&(x, y)| y - f.intercept - f.slope * x)
        .collect();
    let scale: f64 = noisy.iter().map(|p| p.1.abs()).sum();
    assert!(res.iter().sum::<f64>().abs() < 1e-12 * scale);
    let x_dot: f64 = noisy.iter().zip(&res).map(|(p, r)| p.0 * r).sum();
    assert!(x_dot.abs() < 1e-11 * scale);
    // R² of a one-variable fit is the squared Pearson correlation of x and y.
    let n = noisy.len() as f64;
    let (mx, my) = (
        noisy.iter().map(|p| p.0).sum::<f64>() / n,
        noisy.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxy: f64 = noisy.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = noisy.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let syy: f64 = noisy.iter().map(|p| (p.1 - my).powi(2)).sum();
    assert_relative_eq!(f.r2, sxy * sxy / (sxx * syy), max_relative = 1e-9);
    assert!(f.r2 < 1.0);

    assert_eq!(field(measure::affine_fit(&[(1.0, 2.0)]).unwrap_err()), "points");
    assert_eq!(
        field(measure::affine_fit(&[(3.0, 1.0), (3.0, 2.0)]).unwrap_err()),
        "points"
    );
}

#[test]
fn uplink_payload_and_time_follow_paper_a() {
    // |V̂| = min(1024, V) kept probabilities of 16 bits plus a ⌈log₂ V⌉-bit index each.
    assert_eq!(measure::distribution_bits(512), 512.0 * (16.0 + 9.0));
    assert_eq!(measure::distribution_bits(49_152), 1024.0 * (16.0 + 16.0));
    let up = Uplink {
        bandwidth_hz: 10e6,
        spectral_efficiency: 5.0,
        distribution_bits: 12_800.0,
    };
    // Four devices share 10 MHz: 2.5 MHz each at 5 bit/s/Hz is 12.5 Mbit/s.
    assert_relative_eq!(up.token_s(4), 12_800.0 / 12.5e6, max_relative = 1e-12);
}

#[test]
fn interleaved_sweep_gives_one_median_per_batch_size_and_reports_each_round() {
    let m = tiny(1, 0.5, 2);
    let mut rounds = 0;
    let ks = [1, 3, 2];
    let t = measure::verify_latency_s(&m, &ks, 8, 4, 5, &mut || rounds += 1).unwrap();
    assert_eq!(rounds, 5);
    assert_eq!(t.len(), ks.len());
    assert!(t.iter().all(|&x| x.is_finite() && x > 0.0), "{t:?}");

    let mut none = || {};
    assert_eq!(
        field(measure::verify_latency_s(&m, &[], 8, 4, 5, &mut none).unwrap_err()),
        "ks"
    );
    assert_eq!(
        field(measure::verify_latency_s(&m, &[2, 0], 8, 4, 5, &mut none).unwrap_err()),
        "ks"
    );
    assert_eq!(
        field(measure::verify_latency_s(&m, &[1], 0, 4, 5, &mut none).unwrap_err()),
        "prefix_len, reps"
    );
    assert_eq!(
        field(measure::verify_latency_s(&m, &[1], 8, 4, 0, &mut none).unwrap_err()),
        "prefix_len, reps"
    );
    // 90 cached tokens and 9 new ones exceed max_seq_len 96: an error from the model, not a panic.
    assert!(measure::verify_latency_s(&m, &[2], 90, 8, 1, &mut none).is_err());
}

#[test]
fn acceptance_run_reports_monotone_progress_up_to_every_token() {
    let target = tiny(3, 0.5, 2);
    let drafter = target.first_layers(1).unwrap();
    let prompts = vec![vec![1, 5, 7], vec![1, 9], vec![1, 2, 3, 4]];
    let params = spin_runtime::speculative::sampling(1.0).unwrap();
    let mut seen = Vec::new();
    let alphas = measure::acceptance_per_prompt(&target, &drafter, &prompts, 3, 12, params, 7, &mut |n| {
        seen.push(n)
    })
    .unwrap();
    assert_eq!(alphas.len(), 3);
    assert!(alphas.iter().all(|a| (0.0..=1.0).contains(a)), "{alphas:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_eq!(seen.last().copied(), Some(3 * 12));
}

/// Timings of a sweep K = 1..=16 following T = a + b·K, `reps` per K, each multiplied by 1 + noise(seed).
fn synthetic(
    a: f64,
    b: f64,
    reps: usize,
    noise: impl Fn(usize, usize) -> f64,
) -> (Vec<usize>, Vec<Vec<f64>>) {
    let ks: Vec<usize> = (1..=16).collect();
    let samples = ks
        .iter()
        .map(|&k| {
            (0..reps)
                .map(|r| (a + b * k as f64) * (1.0 + noise(k, r)))
                .collect()
        })
        .collect();
    (ks, samples)
}

#[test]
fn median_and_theil_sen_are_exact_on_exact_data_and_ignore_a_minority_of_outliers() {
    assert_eq!(measure::median(&[3.0, 1.0, 2.0]), 2.0);
    assert_eq!(measure::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    assert!(measure::median(&[]).is_nan());
    let exact: Vec<(f64, f64)> = (1..=16).map(|k| (k as f64, 2.5e-4 + 1.1e-4 * k as f64)).collect();
    let f = measure::theil_sen(&exact).unwrap();
    assert_relative_eq!(f.intercept, 2.5e-4, max_relative = 1e-9);
    assert_relative_eq!(f.slope, 1.1e-4, max_relative = 1e-9);
    assert_relative_eq!(f.r2, 1.0, max_relative = 1e-12);
    // Three of sixteen points doubled (a burst of load): Theil–Sen stays within 2 % of the true line, least
    // squares does not.
    let spiked: Vec<(f64, f64)> = exact
        .iter()
        .map(|&(k, y)| {
            if [3.0, 9.0, 14.0].contains(&k) {
                (k, 2.0 * y)
            } else {
                (k, y)
            }
        })
        .collect();
    let robust = measure::theil_sen(&spiked).unwrap();
    let ols = measure::affine_fit(&spiked).unwrap();
    assert_relative_eq!(robust.slope, 1.1e-4, max_relative = 0.02);
    assert_relative_eq!(robust.intercept, 2.5e-4, max_relative = 0.02);
    assert!((ols.intercept - 2.5e-4).abs() > 0.1 * 2.5e-4, "{ols:?}");
    assert_eq!(
        field(measure::theil_sen(&[(1.0, 1.0), (1.0, 2.0)]).unwrap_err()),
        "points"
    );
    assert_eq!(
        field(measure::theil_sen(&[(1.0, 1.0), (2.0, f64::NAN)]).unwrap_err()),
        "points"
    );
}

#[test]
fn robust_fit_is_exact_without_noise_and_its_intervals_cover_the_truth_with_noise() {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let (a, b) = (3e-4, 4e-5);
    let (ks, exact) = synthetic(a, b, 7, |_, _| 0.0);
    let r = measure::robust_fit(&ks, &exact, 200, &mut rng).unwrap();
    assert_relative_eq!(r.fit.intercept, a, max_relative = 1e-9);
    assert_relative_eq!(r.fit.slope, b, max_relative = 1e-9);
    assert_relative_eq!(r.t_fix.low, a, max_relative = 1e-9);
    assert_relative_eq!(r.t_fix.high, a, max_relative = 1e-9);
    assert_relative_eq!(r.ratio, (a + 16.0 * b) / (a + b), max_relative = 1e-12);
    assert_eq!((r.k_min, r.k_max), (1, 16));
    assert!(r.fixed_cost_resolved());

    // ±5 % deterministic jitter on every timing and a 3× spike on one timing in seven: the intervals hold the
    // true values and T_fix is resolved.
    let noise = |k: usize, rep: usize| {
        let u = ((k * 7919 + rep * 104_729) % 1000) as f64 / 1000.0;
        if (k + rep).is_multiple_of(7) {
            2.0
        } else {
            0.1 * (u - 0.5)
        }
    };
    let (ks, noisy) = synthetic(a, b, 9, noise);
    let r = measure::robust_fit(&ks, &noisy, 1000, &mut rng).unwrap();
    assert!(r.t_fix.contains(a), "{:?}", r.t_fix);
    assert!(r.t_lin.contains(b), "{:?}", r.t_lin);
    assert!(
        r.ratio_interval.contains((a + 16.0 * b) / (a + b)),
        "{:?}",
        r.ratio_interval
    );
    assert!(r.t_fix.low < r.t_fix.high && r.fixed_cost_resolved());

    // No fixed cost at all (T = b·K) and noise: the interval reaches zero, so the fixed cost is not resolved,
    // whatever the sign of the point estimate.
    let (ks, zero) = synthetic(0.0, b, 9, noise);
    let r = measure::robust_fit(&ks, &zero, 1000, &mut rng).unwrap();
    assert!(r.t_fix.low <= 0.0 && r.t_fix.high >= 0.0, "{:?}", r.t_fix);
    assert!(!r.fixed_cost_resolved());
}

#[test]
fn robust_fit_refuses_unusable_samples() {
    use rand::SeedableRng;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let ks = [1usize, 2];
    let e = |s: &[Vec<f64>], n: usize, rng: &mut rand_chacha::ChaCha8Rng| {
        field(measure::robust_fit(&ks, s, n, rng).unwrap_err())
    };
    assert_eq!(e(&[vec![1.0]], 100, &mut rng), "samples");
    assert_eq!(e(&[vec![1.0], vec![]], 100, &mut rng), "samples[1]");
    assert_eq!(e(&[vec![f64::NAN], vec![1.0]], 100, &mut rng), "samples[0]");
    assert_eq!(e(&[vec![1.0], vec![-1.0]], 100, &mut rng), "samples[1]");
    assert_eq!(e(&[vec![1.0], vec![2.0]], 10, &mut rng), "resamples");
}

#[test]
fn sweep_samples_have_one_timing_per_round_and_refuse_oversized_sweeps() {
    let m = tiny(4, 0.1, 2);
    let s = measure::verify_latency_samples(&m, &[1, 3], 4, 2, 3, &mut || {}).unwrap();
    assert_eq!(s.len(), 2);
    assert!(s.iter().all(|t| t.len() == 3 && t.iter().all(|x| *x > 0.0)));
    let too_many =
        measure::verify_latency_samples(&m, &[1, measure::MAX_VERIFY_BATCH + 1], 4, 2, 3, &mut || {});
    assert_eq!(field(too_many.unwrap_err()), "ks");
    // tiny() has 96 positions: 90 + 8 + 1 do not fit (and usize::MAX must not overflow).
    let long = measure::verify_latency_samples(&m, &[1, 2], 90, 8, 3, &mut || {});
    assert_eq!(field(long.unwrap_err()), "prefix_len, draft_len");
    let huge = measure::verify_latency_samples(&m, &[1, 2], 4, usize::MAX, 3, &mut || {});
    assert_eq!(field(huge.unwrap_err()), "prefix_len, draft_len");
}
