//! Latency-equalising bandwidth: Lemma 1 (common draft length, eqs. 20–21) and Lemma 3 (per-device lengths,
//! eqs. 31–32). Both reduce to the root of Σ_k w_k / (x − b_k) = B with w_k > 0.
//!
//! The left side falls strictly from +∞ (as x ↓ max b_k) to 0, so the root is unique, and it lies in
//! (max b, max b + Σw/B]: at x = max b + Σw/B every term is at most w_k B/Σw, so the sum is at most B.
//!
//! Everything is solved in the slack y = x − max b, with offsets d_k = max b − b_k ≥ 0: the equation
//! Σ_k w_k/(y + d_k) = B then keeps full relative precision however small y is (a very wide band, a tiny payload),
//! whereas x − b_k formed from x would lose every digit of y below ε·max b. The shares B_k = w_k/(y + d_k) come
//! from the slack as well and are finally scaled to sum to at most B ([`fit_to_budget`]), so a plan built here
//! never exceeds the band by rounding (docs/paper-a.md, "Limits and tolerances").

use super::scenario::Scenario;
use crate::OptimizeError;
use argmin::core::{CostFunction, Error as ArgminError, Executor, State};
use argmin::solver::brent::BrentRoot;

/// The unique slack y > 0 with Σ_k w_k / (y + d_k) = `budget`, d_k = max_j b_j − b_k, returned with max_j b_j
/// (so the root of Σ_k w_k/(x − b_k) = B is x = max b + y). Weights w_k > 0, finite offsets b_k.
///
/// This is the hot path of the exact planner (tens of thousands of solves per plan), so it is written out here
/// rather than routed through argmin's executor: a safeguarded Newton iteration inside the proven bracket
/// (0, Σw/B]. The function is convex and decreasing, so the Newton iterates from the right end approach the root
/// monotonically from the left after the first step; any step that would leave the bracket is replaced by
/// bisection. Converges to a relative step of 1e−15 in y (a dozen iterations on the paper's scenarios; at most
/// 200 in any case).
pub fn equalised_slack<I>(terms: I, budget: f64) -> (f64, f64)
where
    I: Iterator<Item = (f64, f64)> + Clone,
{
    let (max_b, y, _) = equalised_slack_counted(terms, budget);
    (max_b, y)
}

/// [`equalised_slack`] that also returns the number of Newton iterations taken (at most 200), for work accounting.
pub(crate) fn equalised_slack_counted<I>(terms: I, budget: f64) -> (f64, f64, u32)
where
    I: Iterator<Item = (f64, f64)> + Clone,
{
    let (mut max_b, mut sum_w) = (f64::NEG_INFINITY, 0.0);
    for (w, b) in terms.clone() {
        max_b = max_b.max(b);
        sum_w += w;
    }
    let mut lo = 0.0;
    let mut hi = sum_w / budget;
    let mut y = hi;
    for iteration in 1..=200 {
        let (mut g, mut dg) = (-budget, 0.0);
        for (w, b) in terms.clone() {
            let inv = 1.0 / (y + (max_b - b));
            g += w * inv;
            dg -= w * inv * inv;
        }
        if g == 0.0 {
            return (max_b, y, iteration);
        }
        if g > 0.0 {
            lo = y;
        } else {
            hi = y;
        }
        let mut next = y - g / dg;
        if !(next > lo && next < hi && next.is_finite()) {
            next = 0.5 * (lo + hi);
        }
        if (next - y).abs() <= 1e-15 * y || hi - lo <= 4.0 * f64::EPSILON * hi {
            return (max_b, next, iteration);
        }
        y = next;
    }
    (max_b, y, 200)
}

/// The unique x > max b_k with Σ_k w_k / (x − b_k) = `budget` (weights w_k > 0, finite offsets b_k): max b plus
/// the slack of [`equalised_slack`].
pub fn equalised_root<I>(terms: I, budget: f64) -> f64
where
    I: Iterator<Item = (f64, f64)> + Clone,
{
    let (max_b, y) = equalised_slack(terms, budget);
    max_b + y
}

/// The shares B_k = w_k / (y + d_k) at slack `y` (offsets d_k = `max_b` − b_k), scaled by [`fit_to_budget`].
fn shares_at_slack(terms: &[(f64, f64)], max_b: f64, y: f64, budget: f64) -> Vec<f64> {
    let mut shares: Vec<f64> = terms.iter().map(|&(w, b)| w / (y + (max_b - b))).collect();
    fit_to_budget(&mut shares, budget);
    shares
}

/// Scales `shares` down, if needed, so that their floating-point sum is at most `budget`.
///
/// The latency-equalising shares sum to B in exact arithmetic; computed, they may exceed it by a few ulps. A plan
/// must never ask for more than the band, so the shares are multiplied by B/Σ (and, should the rounded sum still
/// exceed B, by 1 − K·ε more, at most a few times). The change is a relative few·K·ε, far below every tolerance
/// the planners compare goodputs with.
pub fn fit_to_budget(shares: &mut [f64], budget: f64) {
    let n = shares.len().max(1) as f64;
    for attempt in 0..8 {
        let total: f64 = shares.iter().sum();
        if total <= budget || total.is_nan() {
            return;
        }
        let shrink = if attempt == 0 {
            budget / total
        } else {
            budget / total * (1.0 - f64::from(attempt) * n * f64::EPSILON)
        };
        for s in shares.iter_mut() {
            *s *= shrink;
        }
    }
}

/// Lemma 1 (eq. 21) in slack form: (max_k T_k^S, y) with ϑ = max_k T_k^S + y.
///
/// Solved with argmin's Brent root finder on the dimensionless form f(u) = Σ_k ω_k/(u + δ_k) − 1 with
/// ω_k = w_k/Σw, δ_k = d_k B/Σw and y = u·Σw/B, u ∈ (0, 1] (argmin's tolerance acts as an absolute one, hence
/// the scaling), and by [`equalised_slack`]'s Newton steps; the one with the smaller residual is kept. One call
/// per scenario, so clarity beats speed here. Brent needs f(u_lo) > 0: the device with the largest T_k^S has
/// δ = 0, so f(u) ≥ ω/u − 1 > 0 at u = ω/2.
pub(crate) fn lemma1_slack(s: &Scenario) -> (f64, f64) {
    let terms: Vec<(f64, f64)> = s
        .devices
        .iter()
        .map(|d| (d.hz_s_per_token, d.draft_token_s))
        .collect();
    let (max_b, newton) = equalised_slack(terms.iter().copied(), s.bandwidth_hz);
    let Some(brent) = brent_slack(&terms, s.bandwidth_hz, max_b) else {
        return (max_b, newton);
    };
    // Both solve the same equation; keep the one with the smaller residual.
    let residual = |y: f64| {
        (terms.iter().map(|&(w, b)| w / (y + (max_b - b))).sum::<f64>() / s.bandwidth_hz - 1.0).abs()
    };
    if residual(brent) < residual(newton) {
        (max_b, brent)
    } else {
        (max_b, newton)
    }
}

/// Lemma 1 (eq. 21): the equalised per-token latency ϑ, root of Σ_k Q_tok / (r_k(ϑ − T_k^S)) = B.
///
/// Infallible on a validated scenario (a root always exists); the `Result` is kept for source compatibility.
pub fn lemma1_latency_s(s: &Scenario) -> Result<f64, OptimizeError> {
    let (max_b, y) = lemma1_slack(s);
    Ok(max_b + y)
}

/// Lemma 1 bandwidths B_k = Q_tok / (r_k(ϑ − T_k^S)) (eq. 20) with their ϑ; the shares sum to at most B.
pub fn lemma1_bandwidth(s: &Scenario) -> Result<(f64, Vec<f64>), OptimizeError> {
    let (max_b, y) = lemma1_slack(s);
    let terms: Vec<(f64, f64)> = s
        .devices
        .iter()
        .map(|d| (d.hz_s_per_token, d.draft_token_s))
        .collect();
    Ok((max_b + y, shares_at_slack(&terms, max_b, y, s.bandwidth_hz)))
}

fn lemma3_terms<'a>(
    s: &'a Scenario,
    draft_lengths: &'a [u32],
) -> impl Iterator<Item = (f64, f64)> + Clone + 'a {
    s.devices.iter().zip(draft_lengths).map(|(d, &l)| {
        let lf = f64::from(l);
        (d.hz_s_per_token * lf, lf * d.draft_token_s)
    })
}

/// Lemma 3 (eq. 32): the equalised multi-access latency φ for draft lengths `draft_lengths`. A device with
/// L_k = 0 has no term (w = 0 adds exact zeros to the root's sums); with every L_k = 0, φ = 0.
pub fn lemma3_latency_s(s: &Scenario, draft_lengths: &[u32]) -> f64 {
    if draft_lengths.iter().all(|&l| l == 0) {
        return 0.0;
    }
    equalised_root(lemma3_terms(s, draft_lengths), s.bandwidth_hz)
}

/// Lemma 3 bandwidths B_k = Q_tok L_k / (r_k(φ − L_k T_k^S)) (eq. 31) with their φ; the shares sum to at most B.
/// A device with L_k = 0 gets no band (B_k = 0); with every L_k = 0, φ = 0.
pub fn lemma3_bandwidth(s: &Scenario, draft_lengths: &[u32]) -> (f64, Vec<f64>) {
    if draft_lengths.iter().all(|&l| l == 0) {
        return (0.0, vec![0.0; draft_lengths.len()]);
    }
    let terms: Vec<(f64, f64)> = lemma3_terms(s, draft_lengths).collect();
    let (max_b, y) = equalised_slack(terms.iter().copied(), s.bandwidth_hz);
    (max_b + y, shares_at_slack(&terms, max_b, y, s.bandwidth_hz))
}

/// f(u) = Σ_k ω_k/(u + δ_k) − 1, the dimensionless Lemma 1 equation.
struct Scaled {
    /// (ω_k, δ_k) per device.
    terms: Vec<(f64, f64)>,
}

impl CostFunction for Scaled {
    type Param = f64;
    type Output = f64;
    fn cost(&self, u: &f64) -> Result<f64, ArgminError> {
        Ok(self.terms.iter().map(|&(w, d)| w / (u + d)).sum::<f64>() - 1.0)
    }
}

/// The Lemma 1 slack by argmin's Brent, or `None` if the scaled problem is degenerate in floating point or the
/// solver reports an error (the Newton slack is then used alone).
fn brent_slack(terms: &[(f64, f64)], budget: f64, max_b: f64) -> Option<f64> {
    let sum_w: f64 = terms.iter().map(|t| t.0).sum();
    let span = sum_w / budget;
    if !(span.is_finite() && span > 0.0) {
        return None;
    }
    let scaled: Vec<(f64, f64)> = terms
        .iter()
        .map(|&(w, b)| (w / sum_w, (max_b - b) / span))
        .collect();
    let u_lo = 0.5
        * scaled
            .iter()
            .filter(|t| t.1 == 0.0)
            .map(|t| t.0)
            .fold(0.0, f64::max);
    let problem = Scaled { terms: scaled };
    if !(u_lo > 0.0 && problem.cost(&u_lo).is_ok_and(|f| f > 0.0)) {
        return None;
    }
    // f(1) ≤ 0 exactly in real arithmetic (= 0 for one device); widen a hair so rounding cannot flip its sign.
    let solver = BrentRoot::new(u_lo, 1.0 + 1e-6, 1e-16);
    let result = Executor::new(problem, solver)
        .configure(|state| state.max_iters(200))
        .run()
        .ok()?;
    let u = *result.state().get_best_param()?;
    (u > 0.0).then_some(u * span)
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
            let terms: Vec<(f64, f64)> = s
                .devices
                .iter()
                .map(|d| (d.hz_s_per_token, d.draft_token_s))
                .collect();
            let max_b = terms.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
            let brent = max_b + brent_slack(&terms, s.bandwidth_hz, max_b).unwrap();
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
