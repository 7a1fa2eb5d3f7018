//! Latency-equalising bandwidth: Lemma 1 (common draft length, eqs. 20–21) and Lemma 3 (per-device lengths,
//! eqs. 31–32). Both reduce to the root of Σ_k w_k / (x − b_k) = B with w_k > 0.
//!
//! The left side falls strictly from +∞ (as x ↓ max b_k) to 0, so the root is unique, and it lies in
//! (max b, max b + Σw/B]: at x = max b + Σw/B every term is at most w_k B/Σw, so the sum is at most B.

use super::scenario::Scenario;
use crate::OptimizeError;
use argmin::core::{CostFunction, Error as ArgminError, Executor, State};
use argmin::solver::brent::BrentRoot;

/// The unique x > max b_k with Σ_k w_k / (x − b_k) = `budget` (weights w_k > 0, finite offsets b_k).
///
/// This is the hot path of the exact planner (tens of thousands of solves per plan), so it is written out here
/// rather than routed through argmin's executor: a safeguarded Newton iteration inside the proven bracket
/// (max b, max b + Σw/B]. The function is convex and decreasing, so after at most one step from the right the
/// Newton iterates approach the root monotonically from the left; any step that would leave the bracket is
/// replaced by bisection. Converges to a relative step of 1e-15 (a dozen iterations on the paper's scenarios).
pub fn equalised_root<I>(terms: I, budget: f64) -> f64
where
    I: Iterator<Item = (f64, f64)> + Clone,
{
    let (mut max_b, mut sum_w) = (f64::NEG_INFINITY, 0.0);
    for (w, b) in terms.clone() {
        max_b = max_b.max(b);
        sum_w += w;
    }
    let mut lo = max_b;
    let mut hi = max_b + sum_w / budget;
    let mut x = hi;
    for _ in 0..200 {
        let (mut g, mut dg) = (-budget, 0.0);
        for (w, b) in terms.clone() {
            let inv = 1.0 / (x - b);
            g += w * inv;
            dg -= w * inv * inv;
        }
        if g == 0.0 {
            return x;
        }
        if g > 0.0 {
            lo = x;
        } else {
            hi = x;
        }
        let mut next = x - g / dg;
        if !(next > lo && next < hi && next.is_finite()) {
            next = 0.5 * (lo + hi);
        }
        if (next - x).abs() <= 1e-15 * x.abs().max(f64::MIN_POSITIVE)
            || hi - lo <= 4.0 * f64::EPSILON * hi.abs()
        {
            return next;
        }
        x = next;
    }
    x
}

/// Lemma 1 (eq. 21): the equalised per-token latency ϑ, root of Σ_k Q_tok / (r_k(ϑ − T_k^S)) = B.
///
/// Solved with argmin's Brent root finder on the dimensionless form f(u) = Σ_k w_k / (B(x(u) − b_k)) − 1,
/// x(u) = max b + u·Σw/B, u ∈ (0, 1] (argmin's tolerance acts as an absolute one, hence the scaling), then
/// polished by [`equalised_root`]'s Newton steps. One call per scenario, so clarity beats speed here.
pub fn lemma1_latency_s(s: &Scenario) -> Result<f64, OptimizeError> {
    let terms: Vec<(f64, f64)> = s
        .devices
        .iter()
        .map(|d| (d.hz_s_per_token, d.draft_token_s))
        .collect();
    let brent = brent_root(&terms, s.bandwidth_hz)?;
    let newton = equalised_root(terms.iter().copied(), s.bandwidth_hz);
    // Both solve the same equation; keep the one with the smaller residual.
    let residual = |x: f64| (terms.iter().map(|&(w, b)| w / (x - b)).sum::<f64>() - s.bandwidth_hz).abs();
    Ok(if residual(brent) < residual(newton) {
        brent
    } else {
        newton
    })
}

/// Lemma 1 bandwidths B_k = Q_tok / (r_k(ϑ − T_k^S)) (eq. 20) with their ϑ.
pub fn lemma1_bandwidth(s: &Scenario) -> Result<(f64, Vec<f64>), OptimizeError> {
    let theta = lemma1_latency_s(s)?;
    Ok((
        theta,
        s.devices.iter().map(|d| d.bandwidth_for(1, theta)).collect(),
    ))
}

/// Lemma 3 (eq. 32): the equalised multi-access latency φ for draft lengths `draft_lengths`.
pub fn lemma3_latency_s(s: &Scenario, draft_lengths: &[u32]) -> f64 {
    let terms = s.devices.iter().zip(draft_lengths).map(|(d, &l)| {
        let lf = f64::from(l);
        (d.hz_s_per_token * lf, lf * d.draft_token_s)
    });
    equalised_root(terms, s.bandwidth_hz)
}

/// Lemma 3 bandwidths B_k = Q_tok L_k / (r_k(φ − L_k T_k^S)) (eq. 31) with their φ.
pub fn lemma3_bandwidth(s: &Scenario, draft_lengths: &[u32]) -> (f64, Vec<f64>) {
    let phi = lemma3_latency_s(s, draft_lengths);
    (
        phi,
        s.devices
            .iter()
            .zip(draft_lengths)
            .map(|(d, &l)| d.bandwidth_for(l, phi))
            .collect(),
    )
}

struct Scaled<'a> {
    terms: &'a [(f64, f64)],
    budget: f64,
    max_b: f64,
    span: f64,
}

impl CostFunction for Scaled<'_> {
    type Param = f64;
    type Output = f64;
    fn cost(&self, u: &f64) -> Result<f64, ArgminError> {
        let x = self.max_b + u * self.span;
        Ok(self
            .terms
            .iter()
            .map(|&(w, b)| w / (self.budget * (x - b)))
            .sum::<f64>()
            - 1.0)
    }
}

fn brent_root(terms: &[(f64, f64)], budget: f64) -> Result<f64, OptimizeError> {
    let max_b = terms.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
    let span = terms.iter().map(|t| t.0).sum::<f64>() / budget;
    let problem = Scaled {
        terms,
        budget,
        max_b,
        span,
    };
    // f(1) ≤ 0 by the bracket argument; f(u) → +∞ as u ↓ 0, so a tiny u has f > 0 unless the root is closer.
    let mut u_lo = 1e-3;
    while problem.cost(&u_lo).unwrap_or(f64::NAN) <= 0.0 && u_lo > 1e-300 {
        u_lo *= 1e-3;
    }
    // f(1) ≤ 0 exactly in real arithmetic (= 0 for one device); widen a hair so rounding cannot flip its sign.
    let solver = BrentRoot::new(u_lo, 1.0 + 1e-6, 1e-16);
    let result = Executor::new(problem, solver)
        .configure(|state| state.max_iters(200))
        .run()
        .map_err(|e| OptimizeError::Infeasible {
            reason: format!("lemma 1 root: {e}"),
        })?;
    let u = *result
        .state()
        .get_best_param()
        .ok_or_else(|| OptimizeError::Infeasible {
            reason: "lemma 1 root: brent returned no point".into(),
        })?;
    Ok(max_b + u * span)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::testing::random_scenario;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn residual(s: &Scenario, lens: &[u32], phi: f64) -> f64 {
        let sum: f64 = s
            .devices
            .iter()
            .zip(lens)
            .map(|(d, &l)| d.bandwidth_for(l, phi))
            .sum();
        (sum - s.bandwidth_hz).abs() / s.bandwidth_hz
    }

    #[test]
    fn lemma3_root_satisfies_bandwidth_equation() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for _ in 0..300 {
            let k = 1 + (rand::RngExt::random::<u32>(&mut rng) % 30) as usize;
            let s = random_scenario(&mut rng, k, 25);
            let lens: Vec<u32> = (0..s.len()).map(|k| 1 + (k as u32 * 7) % 25).collect();
            let (phi, b) = lemma3_bandwidth(&s, &lens);
            assert!(
                residual(&s, &lens, phi) < 1e-9,
                "residual {}",
                residual(&s, &lens, phi)
            );
            let max_lt = s
                .devices
                .iter()
                .zip(&lens)
                .map(|(d, &l)| f64::from(l) * d.draft_token_s)
                .fold(0.0, f64::max);
            assert!(phi > max_lt);
            // Every device finishes exactly at φ (eq. 31 equalises latencies).
            for ((d, &l), &bk) in s.devices.iter().zip(&lens).zip(&b) {
                let t = f64::from(l) * (d.draft_token_s + d.hz_s_per_token / bk);
                assert!((t - phi).abs() < 1e-12 * phi);
            }
        }
    }

    #[test]
    fn lemma1_brent_and_newton_agree() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for _ in 0..100 {
            let s = random_scenario(&mut rng, 20, 25);
            let theta = lemma1_latency_s(&s).unwrap();
            let ones = vec![1; s.len()];
            assert!(residual(&s, &ones, theta) < 1e-9);
            let brent = brent_root(
                &s.devices
                    .iter()
                    .map(|d| (d.hz_s_per_token, d.draft_token_s))
                    .collect::<Vec<_>>(),
                s.bandwidth_hz,
            )
            .unwrap();
            assert!((brent - theta).abs() < 1e-9 * theta, "{brent} vs {theta}");
            // With a common L, Lemma 3's φ is L·ϑ.
            let fives = vec![5; s.len()];
            assert!((lemma3_latency_s(&s, &fives) - 5.0 * theta).abs() < 1e-9 * theta);
        }
    }

    #[test]
    fn single_device_closed_form() {
        // One device: φ = L (T + a / B).
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let s = random_scenario(&mut rng, 1, 25);
        let d = s.devices[0];
        let phi = lemma3_latency_s(&s, &[7]);
        let expect = 7.0 * (d.draft_token_s + d.hz_s_per_token / s.bandwidth_hz);
        assert!((phi - expect).abs() < 1e-13 * expect);
    }
}
