//! The homogeneous case (paper A §IV): Theorem 1's closed-form draft length (eqs. 22–24) and the Homo baseline
//! (one common L by exhaustive search with Lemma 1 bandwidth).

use super::bandwidth::lemma1_bandwidth;
use super::scenario::{Plan, Scenario};
use crate::OptimizeError;
use lambert_w::lambert_wm1;
use spin_core::expected_accepted;

/// Whether Theorem 1's optimum is interior: T_ver/ϑ > (1 − α)/(α|ln α|) (Appendix A, g(0) > 0).
pub fn is_interior(alpha: f64, verify_s: f64, per_token_s: f64) -> bool {
    verify_s / per_token_s > (1.0 - alpha) / (alpha * -alpha.ln())
}

/// Theorem 1's continuous optimum L̃ = −ln(−W₋₁(−α^{T_ver/ϑ − 1}/e)) / ln α − 1 (eq. 24), or `None` when the
/// optimum is not interior (then goodput falls for every L > 0).
///
/// # Formula
/// Stationarity β(L̃ + t) + 1 = e^{β(L̃+1)} with β = −ln α, t = T_ver/ϑ; u = β(L̃ + t) + 1 > 1 solves
/// (−u)e^{−u} = −α^{t−1}/e, so −u is the lower branch W₋₁.
pub fn continuous_optimum(alpha: f64, verify_s: f64, per_token_s: f64) -> Option<f64> {
    if !is_interior(alpha, verify_s, per_token_s) {
        return None;
    }
    let t = verify_s / per_token_s;
    let ln_alpha = alpha.ln();
    // −α^{t−1}/e = −exp((t − 1) ln α − 1), in (−1/e, 0) because t > 1 whenever the optimum is interior.
    let z = -((t - 1.0) * ln_alpha - 1.0).exp();
    let w = lambert_wm1(z);
    if !w.is_finite() {
        return None;
    }
    Some(-(-w).ln() / ln_alpha - 1.0)
}

/// Theorem 1 goodput τ(L) = K(1 − α^{L+1}) / ((Lϑ + T_ver)(1 − α)) (eq. 19), for `devices` identical devices.
pub fn uniform_goodput(devices: usize, alpha: f64, verify_s: f64, per_token_s: f64, draft_len: u32) -> f64 {
    devices as f64 * expected_accepted(alpha, draft_len) / (f64::from(draft_len) * per_token_s + verify_s)
}

/// Theorem 1's integer optimum in `[l_min, l_max]`: the better of ⌊L̃⌋ and ⌈L̃⌉ after clamping L̃ to the range
/// (goodput is unimodal in L, eq. 23); `l_min` when the optimum is not interior.
pub fn optimal_uniform_length(alpha: f64, verify_s: f64, per_token_s: f64, l_min: u32, l_max: u32) -> u32 {
    let Some(l) = continuous_optimum(alpha, verify_s, per_token_s) else {
        return l_min;
    };
    let l = l.clamp(f64::from(l_min), f64::from(l_max));
    let (lo, hi) = (l.floor() as u32, l.ceil() as u32);
    let tau = |x| uniform_goodput(1, alpha, verify_s, per_token_s, x);
    if tau(hi) > tau(lo) { hi } else { lo }
}

/// Homo baseline (paper A §VI-A4): every device drafts the same L, chosen by exhaustive search over the allowed
/// range, with Lemma 1 bandwidth. With heterogeneous α_k the numerator is Σ_k E[N_k | L]; φ = L·ϑ.
pub fn homo(s: &Scenario) -> Result<Plan, OptimizeError> {
    let (theta, bandwidth) = lemma1_bandwidth(s)?;
    let l = best_common_length(s, theta, |l| s.devices.iter().map(|d| d.expected_tokens(l)).sum());
    Plan::evaluated(s, vec![l; s.len()], bandwidth)
}

/// Homo's common length: the first L of the allowed range with the largest Σ_k E[N_k | L] / (Lϑ + T_ver), where
/// `tokens(L)` is Σ_k E[N_k | L] (the exact planner passes its own table, summed in the same order, so both pick
/// the same L bit for bit) and ϑ = `theta` is Lemma 1's per-token latency.
pub(crate) fn best_common_length(s: &Scenario, theta: f64, tokens: impl Fn(u32) -> f64) -> u32 {
    let verify = s.verify_s();
    let mut best = (f64::NEG_INFINITY, s.min_draft_len);
    for l in s.draft_range() {
        let tau = tokens(l) / (f64::from(l) * theta + verify);
        if tau > best.0 {
            best = (tau, l);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn theorem1_equals_exhaustive_search() {
        let mut checked = 0;
        for ai in 1..60 {
            let alpha = 0.3 + 0.0115 * f64::from(ai);
            for vi in 0..30 {
                let verify = 0.005 + 0.02 * f64::from(vi);
                for pi in 0..20 {
                    let per_token = 0.002 + 0.006 * f64::from(pi);
                    let l_max = 40;
                    let closed = optimal_uniform_length(alpha, verify, per_token, 1, l_max);
                    let brute = (1..=l_max)
                        .max_by(|&a, &b| {
                            uniform_goodput(1, alpha, verify, per_token, a)
                                .total_cmp(&uniform_goodput(1, alpha, verify, per_token, b))
                        })
                        .unwrap();
                    let (tc, tb) = (
                        uniform_goodput(1, alpha, verify, per_token, closed),
                        uniform_goodput(1, alpha, verify, per_token, brute),
                    );
                    assert!(
                        tc >= tb * (1.0 - 1e-12),
                        "α={alpha} T={verify} ϑ={per_token}: {closed} vs {brute}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 59 * 30 * 20);
    }

    #[test]
    fn continuous_optimum_is_stationary() {
        for &(alpha, verify, per_token) in &[(0.8, 0.2, 0.03), (0.95, 0.05, 0.01), (0.7126, 0.277, 0.025)] {
            let l = continuous_optimum(alpha, verify, per_token).unwrap();
            let beta = -f64::ln(alpha);
            let t = verify / per_token;
            let lhs = beta * (l + t) + 1.0;
            let rhs = (beta * (l + 1.0)).exp();
            assert!((lhs - rhs).abs() < 1e-9 * rhs, "{lhs} vs {rhs}");
        }
        // Not interior: cheap verification relative to a slow link.
        assert!(continuous_optimum(0.5, 0.001, 0.5).is_none());
        assert_eq!(optimal_uniform_length(0.5, 0.001, 0.5, 1, 25), 1);
    }
}
