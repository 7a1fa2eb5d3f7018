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
    assert_eq!(measure::bits_per_draft_token(512), 512.0 * (16.0 + 9.0));
    assert_eq!(measure::bits_per_draft_token(49_152), 1024.0 * (16.0 + 16.0));
    let up = Uplink {
        bandwidth_hz: 10e6,
        spectral_efficiency: 5.0,
        bits_per_draft_token: 12_800.0,
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
