//! Online estimation of a device's acceptance rate α from realised rounds, with confidence intervals.
//!
//! Two estimators (docs/model.md §1, paper A Table I's "mean of min(1, p/q) over drafted tokens"):
//! - **ratio**: the mean of a_j = min(1, p_j(y_j)/q_j(y_j)) over drafted tokens. Since E_{y∼q}[min(1, p/q)] =
//!   Σ_v min(p_v, q_v), each a_j is an unbiased draw of that position's acceptance probability, and it uses every
//!   drafted token, also those after a rejection. Interval: normal approximation, mean ± z·s/√n (s the sample
//!   standard deviation, Welford's update); it is not cut to [0, 1].
//! - **count**: accepted / (accepted + rejections), the maximum-likelihood estimate under i.i.d. acceptance
//!   (likelihood α^A (1 − α)^R, rounds that accept everything being right-censored geometric observations).
//!   Interval: Wilson score interval on A successes in A + R trials, which stays inside [0, 1].

use crate::CoreError;
use crate::dist::{Dist, Weight};
use crate::verify::{Draft, Outcome, acceptance_probability};

/// The two-sided 95 % standard-normal quantile.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// A point estimate with a confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The point estimate of α.
    pub value: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
    /// The number of observations behind it (tokens for the ratio estimator, Bernoulli trials for the count one).
    pub samples: u64,
}

/// Running acceptance statistics of one device.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AlphaEstimator {
    n: u64,
    mean: f64,
    m2: f64,
    accepted: u64,
    rejected: u64,
}

fn check_z(z: f64) -> Result<(), CoreError> {
    if z > 0.0 && z.is_finite() {
        Ok(())
    } else {
        Err(CoreError::out_of_domain("z", z, "(0, ∞)"))
    }
}

impl AlphaEstimator {
    /// An estimator with no observations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one acceptance probability a = min(1, p(y)/q(y)) ∈ [0, 1].
    pub fn record_acceptance(&mut self, a: f64) -> Result<(), CoreError> {
        if !(0.0..=1.0).contains(&a) {
            return Err(CoreError::out_of_domain("acceptance", a, "[0, 1]"));
        }
        self.n += 1;
        let d = a - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (a - self.mean);
        Ok(())
    }

    /// Records min(1, p_j(y_j)/q_j(y_j)) for every drafted token of `draft` (`targets` as for [`crate::judge`]).
    pub fn record_draft<W: Weight>(
        &mut self,
        targets: &[Dist<'_, W>],
        draft: &Draft,
    ) -> Result<(), CoreError> {
        crate::verify::check_targets(targets.len(), draft.len())?;
        for (j, (&y, &q)) in draft.tokens().iter().zip(draft.probs()).enumerate() {
            let p = targets[j].prob(y as usize).ok_or_else(|| {
                CoreError::invalid_at("draft.tokens", j, format!("token {y} is outside the vocabulary"))
            })?;
            self.record_acceptance(acceptance_probability(p, q))?;
        }
        Ok(())
    }

    /// Records a round's counts: `accepted` of `draft_len` tokens, a rejection iff `accepted < draft_len`.
    pub fn record_round(&mut self, accepted: usize, draft_len: usize) -> Result<(), CoreError> {
        if accepted > draft_len {
            return Err(CoreError::invalid(
                "accepted",
                format!("{accepted} exceeds the draft length {draft_len}"),
            ));
        }
        self.accepted += accepted as u64;
        self.rejected += u64::from(accepted < draft_len);
        Ok(())
    }

    /// Records a verified round's counts.
    pub fn record_outcome(&mut self, outcome: &Outcome, draft_len: usize) -> Result<(), CoreError> {
        if outcome.rejected_at.is_some() == (outcome.accepted == draft_len) {
            return Err(CoreError::invalid(
                "outcome",
                format!(
                    "accepted {} of {draft_len} contradicts rejected_at {:?}",
                    outcome.accepted, outcome.rejected_at
                ),
            ));
        }
        self.record_round(outcome.accepted, draft_len)
    }

    /// Tokens recorded by the ratio estimator.
    pub fn ratio_samples(&self) -> u64 {
        self.n
    }

    /// Bernoulli trials (accepted + rejected) recorded by the count estimator.
    pub fn count_trials(&self) -> u64 {
        self.accepted + self.rejected
    }

    /// The ratio estimator with a normal-approximation interval at quantile `z`; `None` below two samples.
    pub fn ratio_estimate(&self, z: f64) -> Result<Option<Estimate>, CoreError> {
        check_z(z)?;
        if self.n < 2 {
            return Ok(None);
        }
        let var = self.m2 / (self.n - 1) as f64;
        let half = z * (var / self.n as f64).sqrt();
        Ok(Some(Estimate {
            value: self.mean,
            low: self.mean - half,
            high: self.mean + half,
            samples: self.n,
        }))
    }

    /// The count (geometric MLE) estimator with a Wilson score interval at quantile `z`; `None` with no trials.
    pub fn count_estimate(&self, z: f64) -> Result<Option<Estimate>, CoreError> {
        check_z(z)?;
        let n = self.count_trials();
        if n == 0 {
            return Ok(None);
        }
        let (nf, phat) = (n as f64, self.accepted as f64 / n as f64);
        let z2 = z * z;
        let centre = (phat + z2 / (2.0 * nf)) / (1.0 + z2 / nf);
        let half = z / (1.0 + z2 / nf) * (phat * (1.0 - phat) / nf + z2 / (4.0 * nf * nf)).sqrt();
        Ok(Some(Estimate {
            value: phat,
            low: centre - half,
            high: centre + half,
            samples: n,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chance::Chance;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn wilson_matches_a_published_value() {
        // 8 successes in 10 trials at 95 %: Wilson interval (0.4902, 0.9433), the textbook closed form.
        // Rounds: 6 of 10 accepted (one rejection), 2 of 4 (one rejection) → 8 accepted, 2 rejections.
        let mut e = AlphaEstimator::new();
        e.record_round(6, 10).unwrap();
        e.record_round(2, 4).unwrap();
        e.record_round(0, 0).unwrap();
        let est = e.count_estimate(Z_95).unwrap().unwrap();
        assert_eq!(est.samples, 10);
        assert!(
            (est.low - 0.4902).abs() < 1e-4 && (est.high - 0.9433).abs() < 1e-4,
            "{est:?}"
        );
    }

    #[test]
    fn validation() {
        let mut e = AlphaEstimator::new();
        assert_eq!(
            e.record_acceptance(1.5).unwrap_err().to_string(),
            "acceptance: 1.5 is outside [0, 1]"
        );
        assert!(e.record_round(3, 2).is_err());
        assert!(e.ratio_estimate(0.0).is_err());
        assert_eq!(e.ratio_estimate(Z_95).unwrap(), None);
        assert_eq!(e.count_estimate(Z_95).unwrap(), None);
        let bad = Outcome {
            accepted: 2,
            token: 0,
            rejected_at: Some(2),
        };
        assert!(e.record_outcome(&bad, 2).is_err());
    }

    #[test]
    fn count_interval_covers_about_95_percent() {
        // Simulated rounds with i.i.d. acceptance α = 0.7, L = 5, 60 rounds per experiment, 400 experiments.
        let alpha = 0.7;
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut covered = 0;
        for _ in 0..400 {
            let mut e = AlphaEstimator::new();
            for _ in 0..60 {
                let mut acc = 0;
                while acc < 5 && rng.bernoulli(alpha) {
                    acc += 1;
                }
                e.record_round(acc, 5).unwrap();
            }
            let est = e.count_estimate(Z_95).unwrap().unwrap();
            covered += usize::from(est.low <= alpha && alpha <= est.high);
        }
        assert!((360..=392).contains(&covered), "coverage {covered}/400");
    }

    #[test]
    fn ratio_estimator_is_unbiased_for_sum_of_minima() {
        // E_{y~q}[min(1, p/q)] = Σ min(p, q) = 0.2 + 0.3 + 0.1 = 0.6.
        let p = [0.2f64, 0.7, 0.1];
        let q = [0.5f64, 0.3, 0.2];
        let (pd, qd) = (Dist::new(&p).unwrap(), Dist::new(&q).unwrap());
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let mut e = AlphaEstimator::new();
        for _ in 0..20_000 {
            let y = qd.sample(&mut rng);
            let draft = Draft::from_dists(&[y], &[qd]).unwrap();
            e.record_draft(&[pd, pd], &draft).unwrap();
        }
        let est = e.ratio_estimate(Z_95).unwrap().unwrap();
        assert!(est.low < 0.6 && 0.6 < est.high, "{est:?}");
        assert!(est.high - est.low < 0.02);
    }
}
