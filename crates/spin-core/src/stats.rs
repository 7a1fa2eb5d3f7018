//! Acceptance statistics of speculative decoding under i.i.d. acceptance (paper A, eqs. 10–12).
//!
//! With per-token acceptance rate α and draft length L, a round emits N ∈ {1, …, L+1} tokens:
//! P(N = ℓ) = α^{ℓ−1}(1−α) for ℓ ≤ L and P(N = L+1) = α^L; E[N | L] = Σ_{ℓ=0}^{L} α^ℓ.

use crate::CoreError;
use serde::{Deserialize, Serialize};

/// A validated per-token acceptance rate α ∈ (0, 1).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct AcceptanceRate(f64);

impl AcceptanceRate {
    /// Validates α ∈ (0, 1) (open interval; NaN rejected).
    pub fn new(alpha: f64) -> Result<Self, CoreError> {
        if alpha > 0.0 && alpha < 1.0 {
            Ok(Self(alpha))
        } else {
            Err(CoreError::OutOfDomain {
                field: "acceptance",
                value: alpha,
                domain: "(0, 1)",
            })
        }
    }

    /// The rate as a plain number.
    pub fn get(self) -> f64 {
        self.0
    }

    /// E[N | L] for this rate, see [`expected_accepted`].
    pub fn expected_tokens(self, draft_len: u32) -> f64 {
        expected_accepted(self.0, draft_len)
    }
}

impl TryFrom<f64> for AcceptanceRate {
    type Error = CoreError;
    fn try_from(value: f64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<AcceptanceRate> for f64 {
    fn from(value: AcceptanceRate) -> Self {
        value.0
    }
}

/// Expected number of tokens emitted by one round, E[N | L] = (1 − α^{L+1}) / (1 − α) (paper A, eq. 12).
///
/// # Formula
/// Σ_{ℓ=0}^{L} α^ℓ; evaluated as the finite sum's closed form with `powi`, and as L + 1 when α = 1.
/// Callers pass a validated α (see [`AcceptanceRate`]); α ∈ [0, 1] is assumed here.
pub fn expected_accepted(alpha: f64, draft_len: u32) -> f64 {
    if alpha >= 1.0 {
        return f64::from(draft_len) + 1.0;
    }
    // -expm1(ln α · (L+1)) / (1 − α) keeps full precision when α is close to 1.
    if alpha <= 0.0 {
        return 1.0;
    }
    let n = f64::from(draft_len) + 1.0;
    -f64::exp_m1(alpha.ln() * n) / (1.0 - alpha)
}

/// The probability mass function of N: element ℓ−1 is P(N = ℓ) for ℓ = 1..=L+1 (paper A, eq. 10).
pub fn accepted_pmf(alpha: f64, draft_len: u32) -> Vec<f64> {
    let l = draft_len as usize;
    let mut pmf = Vec::with_capacity(l + 1);
    let mut pow = 1.0;
    for _ in 0..l {
        pmf.push(pow * (1.0 - alpha));
        pow *= alpha;
    }
    pmf.push(pow);
    pmf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectation_matches_pmf_mean() {
        for &alpha in &[0.05, 0.3, 0.7126, 0.9, 0.965, 0.999_999] {
            for l in 0..30 {
                let pmf = accepted_pmf(alpha, l);
                let total: f64 = pmf.iter().sum();
                assert!((total - 1.0).abs() < 1e-12, "pmf mass {total}");
                let mean: f64 = pmf.iter().enumerate().map(|(i, p)| (i as f64 + 1.0) * p).sum();
                let closed = expected_accepted(alpha, l);
                assert!(
                    (mean - closed).abs() <= 1e-9 * closed,
                    "α={alpha} L={l}: {mean} vs {closed}"
                );
            }
        }
    }

    #[test]
    fn limits() {
        assert_eq!(expected_accepted(0.8, 0), 1.0);
        assert_eq!(expected_accepted(1.0, 7), 8.0);
        assert!((expected_accepted(1.0 - 1e-12, 7) - 8.0).abs() < 1e-9);
    }

    #[test]
    fn rate_validation_names_the_field() {
        for bad in [0.0, 1.0, -0.1, 1.5, f64::NAN] {
            let err = AcceptanceRate::new(bad).unwrap_err();
            assert!(err.to_string().starts_with("acceptance:"), "{err}");
        }
        assert_eq!(AcceptanceRate::new(0.5).unwrap().get(), 0.5);
    }
}
