//! The heterogeneous case (paper A §V): Proposition 1's closed-form draft length (eq. 37) and Algorithm 1, the
//! grid search over (φ, λ) with round-half-up and Lemma 3 bandwidth (eqs. 36, 38, 39; ranges of Appendix G).

use super::bandwidth::lemma3_bandwidth;
use super::scenario::{Device, Plan, Scenario};
use crate::OptimizeError;
use lambert_w::lambert_w0;
use serde::{Deserialize, Serialize};

/// The principal branch W₀ evaluated from ln z, so that z = e^{ln z} never has to be formed.
///
/// For ln z ≤ 30 the `lambert_w` crate's W₀(z) is used directly; above, w solves w + ln w = ln z, found by Newton
/// from w₀ = ln z − ln ln z (the asymptotic expansion), which converges in a few steps because the function is
/// increasing and concave in w.
pub fn lambert_w0_from_ln(ln_z: f64) -> f64 {
    if ln_z <= 30.0 {
        return lambert_w0(ln_z.exp());
    }
    let mut w = ln_z - ln_z.ln();
    for _ in 0..50 {
        let f = w + w.ln() - ln_z;
        let step = f / (1.0 + 1.0 / w);
        w -= step;
        if step.abs() <= 1e-16 * w {
            break;
        }
    }
    w
}

/// Proposition 1's continuous draft length L̃_k(φ, λ) (eq. 37, ⟨R⟩ re-derived from Appendix E's stationarity
/// −α^{L̃+1} ln α / (1 − α) = λ Q_tok φ / (r(φ − L̃T^S)²)).
///
/// # Formula
/// β = −ln α, L̃ = φ/T^S − (2/β)·W₀(z), z = α^{−φ/(2T^S)}/(2T^S) · sqrt(λ Q_tok φ β (1 − α)/(r α)); W₀ is taken
/// from ln z = βφ/(2T^S) − ln(2T^S) + ½ ln(λ Q_tok φ β (1 − α)/(r α)), so φ/T^S ≫ 1 cannot overflow.
pub fn continuous_length(d: &Device, latency_s: f64, lambda: f64) -> f64 {
    let beta = -d.alpha.ln();
    let t = d.draft_token_s;
    let ln_z = beta * latency_s / (2.0 * t) - (2.0 * t).ln()
        + 0.5 * (lambda * d.hz_s_per_token * latency_s * beta * (1.0 - d.alpha) / d.alpha).ln();
    latency_s / t - 2.0 / beta * lambert_w0_from_ln(ln_z)
}

/// Grid sizes and the λ floor of Algorithm 1 (the paper gives none of them ⟨C⟩).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Alg1Params {
    /// |Φ|: points of the φ grid, evenly spaced on [φ_lo, φ_hi] (Appendix G).
    pub phi_points: usize,
    /// |Λ|: points of the λ grid, geometrically spaced on [ε_λ, λ_hi].
    pub lambda_points: usize,
    /// ε_λ as a fraction of λ_hi (Appendix G's "small positive constant", made scale-free).
    pub lambda_lo_ratio: f64,
}

impl Default for Alg1Params {
    /// 100 × 100 points, ε_λ = 1e−6·λ_hi.
    fn default() -> Self {
        Self {
            phi_points: 100,
            lambda_points: 100,
            lambda_lo_ratio: 1e-6,
        }
    }
}

/// Appendix G's search ranges: φ ∈ [max_k(T_k + Q/(B r_k)), max_k(L_max T_k + K Q/(B r_k))] and
/// λ ∈ [ε_λ, max_k r_k(φ_hi − T_k)²/(Q φ_hi) · (−ln α_k) α_k²/(1 − α_k)] (⟨R⟩ λ_hi evaluated at φ = φ_hi: the λ at
/// which every device's L̃ falls to 1).
pub fn search_ranges(s: &Scenario, params: &Alg1Params) -> ((f64, f64), (f64, f64)) {
    let b = s.bandwidth_hz;
    let k = s.len() as f64;
    let l_max = f64::from(s.max_draft_len);
    let phi_lo = s
        .devices
        .iter()
        .map(|d| d.draft_token_s + d.hz_s_per_token / b)
        .fold(0.0, f64::max);
    let phi_hi = s
        .devices
        .iter()
        .map(|d| l_max * d.draft_token_s + k * d.hz_s_per_token / b)
        .fold(0.0, f64::max);
    let lambda_hi = s
        .devices
        .iter()
        .map(|d| {
            let gap = phi_hi - d.draft_token_s;
            gap * gap / (d.hz_s_per_token * phi_hi) * (-d.alpha.ln()) * d.alpha * d.alpha / (1.0 - d.alpha)
        })
        .fold(0.0, f64::max);
    ((phi_lo, phi_hi), (params.lambda_lo_ratio * lambda_hi, lambda_hi))
}

/// Round half up and clamp to the allowed range (eq. 36 with paper A's L_k ∈ {1, …, L_max}; ⟨C⟩ a continuous
/// optimum below the range, NaN included, becomes the smallest allowed length).
pub fn round_length(continuous: f64, l_min: u32, l_max: u32) -> u32 {
    let r = (continuous + 0.5).floor();
    if r.is_nan() || r <= f64::from(l_min) {
        l_min
    } else if r >= f64::from(l_max) {
        l_max
    } else {
        r as u32
    }
}

/// The most (φ, λ, device) evaluations [`paper_alg1`] performs: |Φ|·|Λ|·K (the default grid at K = 10,000 is 10⁸).
pub const ALG1_WORK_LIMIT: u128 = 1_000_000_000;

/// Algorithm 1 (paper A §V-D): for each (φ, λ) on the grid, L = round(L̃(φ, λ)) (eqs. 36–37), φ̂ from Lemma 3,
/// keep the best τ (eq. 33); bandwidth by eq. 39 at the winner.
pub fn paper_alg1(s: &Scenario, params: &Alg1Params) -> Result<Plan, OptimizeError> {
    if params.phi_points == 0 || params.lambda_points == 0 {
        return Err(OptimizeError::Invalid {
            field: "phi_points".into(),
            reason: "grid sizes must be at least 1".into(),
        });
    }
    let work = (params.phi_points as u128) * (params.lambda_points as u128) * (s.len() as u128);
    if work > ALG1_WORK_LIMIT {
        return Err(OptimizeError::Invalid {
            field: "alg1_phi_points".into(),
            reason: format!(
                "alg1_phi_points × alg1_lambda_points × devices = {work} exceeds the limit of {ALG1_WORK_LIMIT}"
            ),
        });
    }
    if !(params.lambda_lo_ratio > 0.0 && params.lambda_lo_ratio <= 1.0) {
        return Err(OptimizeError::OutOfDomain {
            field: "lambda_lo_ratio".into(),
            value: params.lambda_lo_ratio,
            domain: "(0, 1]",
        });
    }
    let ((phi_lo, phi_hi), (lam_lo, lam_hi)) = search_ranges(s, params);
    let verify = s.verify_s();
    let step = |lo: f64, hi: f64, n: usize, i: usize| {
        if n == 1 {
            hi
        } else {
            lo + (hi - lo) * i as f64 / (n - 1) as f64
        }
    };
    let mut lens = vec![s.min_draft_len; s.len()];
    let mut last: Option<Vec<u32>> = None;
    let mut best: Option<(f64, Vec<u32>)> = None;
    for i in 0..params.phi_points {
        let phi = step(phi_lo, phi_hi, params.phi_points, i);
        for j in 0..params.lambda_points {
            let lambda = (step(lam_lo.ln(), lam_hi.ln(), params.lambda_points, j)).exp();
            for (l, d) in lens.iter_mut().zip(&s.devices) {
                *l = round_length(
                    continuous_length(d, phi, lambda),
                    s.min_draft_len,
                    s.max_draft_len,
                );
            }
            if last.as_deref() == Some(&lens[..]) {
                continue;
            }
            let phi_hat = super::bandwidth::lemma3_latency_s(s, &lens);
            let tokens = s.expected_tokens_sum(&lens);
            let tau = tokens / (phi_hat + verify);
            if best.as_ref().is_none_or(|b| tau > b.0) {
                best = Some((tau, lens.clone()));
            }
            last = Some(lens.clone());
        }
    }
    let (_, lens) = best.ok_or_else(|| OptimizeError::Infeasible {
        reason: "algorithm 1 grid is empty".into(),
    })?;
    let (_, bandwidth) = lemma3_bandwidth(s, &lens);
    Plan::evaluated(s, lens, bandwidth)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::testing::random_scenario;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn w0_from_log_matches_direct_and_asymptotic_regimes() {
        for &z in &[1e-6, 0.3, 1.0, std::f64::consts::E, 50.0, 1e10] {
            let w = lambert_w0_from_ln(f64::ln(z));
            assert!((w * w.exp() - z).abs() < 1e-12 * z, "z={z}");
        }
        for &ln_z in &[31.0, 100.0, 1e4, 1e8] {
            let w = lambert_w0_from_ln(ln_z);
            assert!((w + w.ln() - ln_z).abs() < 1e-12 * ln_z, "ln z={ln_z}");
        }
    }

    #[test]
    fn proposition1_satisfies_stationarity() {
        // Check the closed form against the KKT condition of Appendix E, including φ/T ≫ 1 (no overflow).
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        let s = random_scenario(&mut rng, 40, 25);
        for d in &s.devices {
            for &phi in &[0.05, 0.3, 2.0, 40.0] {
                for &lambda in &[1e-9, 1e-6, 1e-3] {
                    let l = continuous_length(d, phi, lambda);
                    assert!(l.is_finite());
                    let y = phi - l * d.draft_token_s;
                    assert!(y > 0.0);
                    let lhs = -d.alpha.powf(l + 1.0) * d.alpha.ln() / (1.0 - d.alpha);
                    let rhs = lambda * d.hz_s_per_token * phi / (y * y);
                    assert!(
                        (lhs - rhs).abs() <= 1e-8 * rhs.max(1e-300),
                        "φ={phi} λ={lambda}: {lhs} vs {rhs}"
                    );
                }
            }
        }
    }

    #[test]
    fn rounding_is_half_up_and_clamped() {
        assert_eq!(round_length(2.5, 1, 25), 3);
        assert_eq!(round_length(2.49, 1, 25), 2);
        assert_eq!(round_length(-4.0, 1, 25), 1);
        assert_eq!(round_length(f64::NAN, 1, 25), 1);
        assert_eq!(round_length(99.0, 1, 25), 25);
    }

    #[test]
    fn algorithm1_returns_a_consistent_plan() {
        let mut rng = ChaCha8Rng::seed_from_u64(23);
        let s = random_scenario(&mut rng, 8, 25);
        let plan = paper_alg1(
            &s,
            &Alg1Params {
                phi_points: 30,
                lambda_points: 30,
                lambda_lo_ratio: 1e-6,
            },
        )
        .unwrap();
        assert!(plan.goodput_tokens_per_s > 0.0);
        let total: f64 = plan.bandwidth_hz.iter().sum();
        assert!((total - s.bandwidth_hz).abs() < 1e-9 * s.bandwidth_hz);
        assert!(
            paper_alg1(
                &s,
                &Alg1Params {
                    phi_points: 0,
                    ..Alg1Params::default()
                }
            )
            .is_err()
        );
    }
}
