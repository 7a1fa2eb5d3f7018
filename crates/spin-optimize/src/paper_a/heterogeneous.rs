//! The heterogeneous case (paper A §V): Proposition 1's closed-form draft length (eq. 37) and Algorithm 1, the
//! grid search over (φ, λ) with round-half-up and Lemma 3 bandwidth (eqs. 36, 38, 39; ranges of Appendix G).

use super::bandwidth::lemma3_bandwidth;
use super::scenario::{Plan, Scenario, ScenarioDevice};
use crate::OptimizeError;
use lambert_w::lambert_w0;

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
pub fn continuous_length(d: &ScenarioDevice, latency_s: f64, lambda: f64) -> f64 {
    let beta = -d.acceptance.ln();
    let t = d.draft_token_s;
    let ln_z = beta * latency_s / (2.0 * t) - (2.0 * t).ln()
        + 0.5 * (lambda * d.hz_s_per_token * latency_s * beta * (1.0 - d.acceptance) / d.acceptance).ln();
    latency_s / t - 2.0 / beta * lambert_w0_from_ln(ln_z)
}

/// Grid sizes and the λ floor of Algorithm 1 (the paper gives none of them ⟨C⟩).
#[derive(Debug, Clone, Copy, PartialEq)]
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
            gap * gap / (d.hz_s_per_token * phi_hi) * (-d.acceptance.ln()) * d.acceptance * d.acceptance
                / (1.0 - d.acceptance)
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
///
/// The result is the one the plain grid loop gives (kept as the reference in this module's tests, where the two
/// are compared bit for bit), computed with less work:
/// - L̃ falls in λ (W₀ and ln z rise in λ), so along one φ row each device's rounded length is a non-increasing
///   step function of the λ index. Only the ends of a row, the neighbours of the previous row's steps and bisection
///   points between unequal known values are evaluated; a run between two equal known values is filled.
/// - Every distinct grid plan (consecutive duplicates skipped, as in the paper's loop) gets the upper bound
///   τ ≤ ΣE / (φ_lb + T_ver) from a lower bound φ_lb on Lemma 3's root (see [`lemma3_lower_bound`]); plans are
///   solved in order of falling bound until the bound drops below the incumbent, and ties go to the earlier grid
///   point, which is what the loop's strict `>` keeps.
pub fn paper_alg1(s: &Scenario, params: &Alg1Params) -> Result<Plan, OptimizeError> {
    // Named as a scenario file names them.
    for (field, points) in [
        ("alg1_phi_points", params.phi_points),
        ("alg1_lambda_points", params.lambda_points),
    ] {
        if points == 0 {
            return Err(OptimizeError::Invalid {
                field: field.into(),
                reason: "must be at least 1".into(),
            });
        }
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
            field: "alg1_lambda_lo_ratio".into(),
            value: params.lambda_lo_ratio,
            domain: "(0, 1]",
        });
    }
    let lens = Grid::new(s, params).best_plan()?;
    let (_, bandwidth) = lemma3_bandwidth(s, &lens);
    Plan::evaluated(s, lens, bandwidth)
}

/// A lower bound on Lemma 3's root φ̂ of Σ_k w_k / (φ − b_k) = B (w_k = a_k L_k, b_k = L_k T_k^S): every term is
/// at most B, so φ̂ ≥ b_k + w_k/B; and 1/(φ − b) is convex in b, so by Jensen with weights w_k/Σw,
/// B ≥ Σw / (φ̂ − b̄) with b̄ = Σ w_k b_k / Σw, i.e. φ̂ ≥ b̄ + Σw/B.
pub fn lemma3_lower_bound(s: &Scenario, draft_lengths: &[u32]) -> f64 {
    let budget = s.bandwidth_hz;
    let (mut single, mut sum_w, mut sum_wb) = (0.0f64, 0.0, 0.0);
    for (d, &l) in s.devices.iter().zip(draft_lengths) {
        let lf = f64::from(l);
        let (w, b) = (d.hz_s_per_token * lf, lf * d.draft_token_s);
        single = single.max(b + w / budget);
        sum_w += w;
        sum_wb += w * b;
    }
    if sum_w > 0.0 {
        single.max(sum_wb / sum_w + sum_w / budget)
    } else {
        single
    }
}

/// Relative margin on the upper bound of τ before a plan is skipped: far above the rounding error of the bound
/// and of Lemma 3's root (relative 1e−15), far below any gap that matters.
const BOUND_MARGIN: f64 = 1e-9;

/// Algorithm 1's grid of one scenario, with the per-device constants of eq. 37 hoisted out of the grid loop (the
/// same floating-point operations in the same order as [`continuous_length`], so the same bits).
struct Grid<'a> {
    s: &'a Scenario,
    phis: Vec<f64>,
    /// ln λ_j before exponentiation (ascending) and λ_j itself.
    ln_lambdas: Vec<f64>,
    lambdas: Vec<f64>,
    /// (n − 1) / (ln λ_max − ln λ_min), or 0 for a one-point or flat grid: turns ln λ into a first guess of its
    /// index in [`Grid::first_above`] with a multiplication.
    guess_scale: f64,
    /// Per device: β = −ln α, ln(2T) and ln β − ln(1 − α) − ln a (the φ-free part of ln λ*, see [`Grid::row`]).
    beta: Vec<f64>,
    ln_two_t: Vec<f64>,
    ln_const: Vec<f64>,
    /// E_k(l) for l = l_min + i, device-major.
    tokens: Vec<f64>,
}

/// A candidate plan ordered as Algorithm 1's pruning visits them: larger bound first, then smaller index.
struct ByBound {
    bound: f64,
    idx: usize,
}

impl Ord for ByBound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bound.total_cmp(&other.bound).then(other.idx.cmp(&self.idx))
    }
}

impl PartialOrd for ByBound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for ByBound {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for ByBound {}

/// Half-width, in units of L̃, of the band around a rounding boundary inside which a grid point is evaluated with
/// eq. 37 itself rather than classified by the threshold: far above the floating-point error of eq. 37 (about
/// 1e−13 here), so outside the band the threshold and the formula round alike.
const ROUNDING_BAND: f64 = 1e-9;

impl<'a> Grid<'a> {
    fn new(s: &'a Scenario, params: &Alg1Params) -> Self {
        let ((phi_lo, phi_hi), (lam_lo, lam_hi)) = search_ranges(s, params);
        let step = |lo: f64, hi: f64, n: usize, i: usize| {
            if n == 1 {
                hi
            } else {
                lo + (hi - lo) * i as f64 / (n - 1) as f64
            }
        };
        let phis = (0..params.phi_points)
            .map(|i| step(phi_lo, phi_hi, params.phi_points, i))
            .collect();
        let ln_lambdas: Vec<f64> = (0..params.lambda_points)
            .map(|j| step(lam_lo.ln(), lam_hi.ln(), params.lambda_points, j))
            .collect();
        let beta: Vec<f64> = s.devices.iter().map(|d| -d.acceptance.ln()).collect();
        let n_l = ln_lambdas.len();
        let (lo, hi) = (ln_lambdas[0], ln_lambdas[n_l - 1]);
        let guess_scale = if n_l > 1 && hi > lo {
            (n_l - 1) as f64 / (hi - lo)
        } else {
            0.0
        };
        Grid {
            s,
            phis,
            guess_scale,
            lambdas: ln_lambdas.iter().map(|l| l.exp()).collect(),
            ln_lambdas,
            ln_const: s
                .devices
                .iter()
                .zip(&beta)
                .map(|(d, b)| b.ln() - (1.0 - d.acceptance).ln() - d.hz_s_per_token.ln())
                .collect(),
            beta,
            ln_two_t: s.devices.iter().map(|d| (2.0 * d.draft_token_s).ln()).collect(),
            tokens: s
                .devices
                .iter()
                .flat_map(|d| s.draft_range().map(|l| d.expected_tokens(l)))
                .collect(),
        }
    }

    /// round(L̃_k(φ, λ_j)) exactly as [`round_length`]`(`[`continuous_length`]`(..))`, term by term.
    fn length(&self, k: usize, phi: f64, j: usize) -> u32 {
        let d = &self.s.devices[k];
        let beta = self.beta[k];
        let head = beta * phi / (2.0 * d.draft_token_s) - self.ln_two_t[k];
        let ln_z = head
            + 0.5
                * (self.lambdas[j] * d.hz_s_per_token * phi * beta * (1.0 - d.acceptance) / d.acceptance)
                    .ln();
        let l = phi / d.draft_token_s - 2.0 / beta * lambert_w0_from_ln(ln_z);
        round_length(l, self.s.min_draft_len, self.s.max_draft_len)
    }

    /// `partition_point(|v| v < x)` on the ascending ln λ grid (`v <= x` when `inclusive`), started from the guess
    /// that the grid's even spacing gives.
    fn first_above(&self, x: f64, inclusive: bool) -> usize {
        let lnl = &self.ln_lambdas;
        let n = lnl.len();
        let below = |v: f64| if inclusive { v <= x } else { v < x };
        // Only a first guess: the walks below make the answer exact whatever it is (NaN and −∞ cast to 0).
        let mut g = (((x - lnl[0]) * self.guess_scale) as usize).min(n);
        while g > 0 && !below(lnl[g - 1]) {
            g -= 1;
        }
        while g < n && below(lnl[g]) {
            g += 1;
        }
        g
    }

    /// Row φ of device `k` into `out` (one entry per λ_j).
    ///
    /// The rounded length is l_min + #{m ∈ (l_min, l_max] : L̃ ≥ m − ½}, and L̃ falls in λ, so L̃(λ) ≥ L exactly
    /// when λ ≤ λ*(L), the λ at which L is stationary (Appendix E's condition solved for λ):
    /// ln λ*(L) = (L + 1) ln α + ln β − ln(1 − α) + 2 ln(φ − L T) − ln a − ln φ. Near a threshold, where rounding
    /// of eq. 37 in floating point could go either way, the point is evaluated with eq. 37 itself: the band is
    /// [`ROUNDING_BAND`] in L̃, converted to ln λ with the slope |dL̃/d ln λ| = W/((1 + W)β), W = β(φ − L T)/(2T)
    /// at the threshold. A row whose thresholds are not strictly decreasing is evaluated point by point. Returns the
    /// number of points evaluated with eq. 37.
    fn row(&self, k: usize, phi: f64, ln_phi: f64, out: &mut [u32], exact: &mut [bool]) -> usize {
        let d = &self.s.devices[k];
        let (beta, t) = (self.beta[k], d.draft_token_s);
        let (l_min, l_max) = (self.s.min_draft_len, self.s.max_draft_len);
        let lnl = &self.ln_lambdas;
        exact.fill(false);
        let mut thresholds = [f64::NEG_INFINITY; 64];
        let levels = (l_max - l_min) as usize;
        let mut all_exact = levels > thresholds.len();
        let mut prev = f64::INFINITY;
        for (i, m) in (l_min + 1..=l_max).enumerate().take(thresholds.len()) {
            let l = f64::from(m) - 0.5;
            let slack = phi - l * t;
            if slack.abs() <= 1e-9 * phi {
                all_exact = true;
                break;
            }
            if slack < 0.0 {
                // L̃ < φ/T always: this level and every higher one are never reached.
                break;
            }
            let th = -(l + 1.0) * beta + self.ln_const[k] + 2.0 * slack.ln() - ln_phi;
            if th.is_nan() || th >= prev {
                all_exact = true;
                break;
            }
            prev = th;
            thresholds[i] = th;
            let w = beta * slack / (2.0 * t);
            let slope = w / ((1.0 + w) * beta);
            let band = 1e-8 * (1.0 + th.abs()) + 2.0 * ROUNDING_BAND / slope;
            if !band.is_finite() {
                all_exact = true;
                break;
            }
            if th + band < lnl[0] {
                // This threshold and every later (lower) one lie below the whole λ grid: none counts anywhere.
                break;
            }
            if th - band <= lnl[lnl.len() - 1] {
                let from = self.first_above(th - band, false);
                let to = self.first_above(th + band, true);
                exact[from..to].fill(true);
            }
        }
        if all_exact {
            for (j, o) in out.iter_mut().enumerate() {
                *o = self.length(k, phi, j);
            }
            return out.len();
        }
        let thresholds = &thresholds[..levels.min(64)];
        // count_j = #{i : thresholds[i] ≥ ln λ_j} = #{i : j < J_i} with J_i = first_above(thresholds[i], true), and
        // the J_i fall with i (unset thresholds are −∞, J = 0): the run with count c is [J_c, J_{c−1}), J_{−1} = n.
        // Fill the runs, then overwrite the points near a rounding boundary with eq. 37.
        let mut end = out.len();
        for c in 0..=thresholds.len() {
            let start = if c < thresholds.len() {
                self.first_above(thresholds[c], true).min(end)
            } else {
                0
            };
            out[start..end].fill(l_min + c as u32);
            end = start;
            if end == 0 {
                break;
            }
        }
        let mut evaluated = 0;
        for (j, (o, &e)) in out.iter_mut().zip(exact.iter()).enumerate() {
            if e {
                *o = self.length(k, phi, j);
                evaluated += 1;
            }
        }
        evaluated
    }

    /// The grid's best plan: the first grid point (φ-major) with the largest τ.
    fn best_plan(&self) -> Result<Vec<u32>, OptimizeError> {
        let s = self.s;
        let (k_n, n_l) = (s.len(), self.lambdas.len());
        let verify = s.verify_s();
        let n_tok = (s.max_draft_len - s.min_draft_len + 1) as usize;
        let mut rows = vec![0u32; k_n * n_l];
        let mut exact = vec![false; n_l];
        // Per device and length: (b + w/B, w, w·b) of Lemma 3's terms w = a L, b = L T.
        let bound_terms: Vec<(f64, f64, f64)> = s
            .devices
            .iter()
            .flat_map(|d| {
                s.draft_range().map(move |l| {
                    let lf = f64::from(l);
                    let (w, b) = (d.hz_s_per_token * lf, lf * d.draft_token_s);
                    (b + w / s.bandwidth_hz, w, w * b)
                })
            })
            .collect();
        // Distinct consecutive plans in grid order: lengths (flat), Σ E_k and the bound on τ.
        let mut plans: Vec<u32> = Vec::new();
        let mut bounds: Vec<(f64, f64)> = Vec::new();
        let mut lens = vec![0u32; k_n];
        let mut changed = vec![false; n_l];
        for &phi in &self.phis {
            let ln_phi = phi.ln();
            for k in 0..k_n {
                self.row(k, phi, ln_phi, &mut rows[k * n_l..(k + 1) * n_l], &mut exact);
            }
            // changed[j]: some device's length differs between λ_{j−1} and λ_j (one contiguous pass per device).
            changed.fill(false);
            for row in rows.chunks_exact(n_l) {
                for (c, w) in changed[1..].iter_mut().zip(row.windows(2)) {
                    *c |= w[0] != w[1];
                }
            }
            for j in 0..n_l {
                // The plan at λ_{j−1} was pushed or equals the last one pushed; an unchanged plan is skipped below
                // anyway, so skip it without gathering it.
                if j > 0 && !changed[j] {
                    continue;
                }
                for (k, l) in lens.iter_mut().enumerate() {
                    *l = rows[k * n_l + j];
                }
                if plans.len() >= k_n && plans[plans.len() - k_n..] == lens[..] {
                    continue;
                }
                // The same sum, in the same order, as `Scenario::expected_tokens_sum`.
                let tokens: f64 = lens
                    .iter()
                    .enumerate()
                    .map(|(k, &l)| self.tokens[k * n_tok + (l - s.min_draft_len) as usize])
                    .sum();
                // `lemma3_lower_bound` from per-level tables.
                let (mut single, mut sum_w, mut sum_wb) = (0.0f64, 0.0, 0.0);
                for (k, &l) in lens.iter().enumerate() {
                    let (sg, w, wb) = bound_terms[k * n_tok + (l - s.min_draft_len) as usize];
                    single = single.max(sg);
                    sum_w += w;
                    sum_wb += wb;
                }
                let lower = single.max(sum_wb / sum_w + sum_w / s.bandwidth_hz);
                bounds.push((tokens, tokens / (lower + verify)));
                plans.extend_from_slice(&lens);
            }
        }
        let solve = |idx: usize| {
            let plan = &plans[idx * k_n..(idx + 1) * k_n];
            bounds[idx].0 / (super::bandwidth::lemma3_latency_s(s, plan) + verify)
        };
        // The plan with the largest bound first, then every plan whose bound can still beat the incumbent.
        let Some(first) =
            (0..bounds.len()).max_by(|&a, &b| bounds[a].1.total_cmp(&bounds[b].1).then(b.cmp(&a)))
        else {
            return Err(OptimizeError::Infeasible {
                reason: "algorithm 1 grid is empty".into(),
            });
        };
        let mut best = (solve(first), first);
        let order: Vec<usize> = (0..bounds.len())
            .filter(|&i| i != first && bounds[i].1 * (1.0 + BOUND_MARGIN) >= best.0)
            .collect();
        // Visited in the order of a sort by (bound descending, index ascending), but popped from a heap: the loop
        // usually stops after a few candidates, so a full sort would mostly order plans that are never solved.
        let mut heap: std::collections::BinaryHeap<ByBound> = order
            .into_iter()
            .map(|i| ByBound {
                bound: bounds[i].1,
                idx: i,
            })
            .collect();
        while let Some(ByBound { idx, .. }) = heap.pop() {
            if bounds[idx].1 * (1.0 + BOUND_MARGIN) < best.0 {
                break;
            }
            let tau = solve(idx);
            if tau > best.0 || (tau == best.0 && idx < best.1) {
                best = (tau, idx);
            }
        }
        Ok(plans[best.1 * k_n..(best.1 + 1) * k_n].to_vec())
    }
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
                    let lhs = -d.acceptance.powf(l + 1.0) * d.acceptance.ln() / (1.0 - d.acceptance);
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

    /// The paper's loop as written (every grid point evaluated, consecutive duplicates skipped): the reference
    /// that the faster [`paper_alg1`] must reproduce bit for bit.
    fn reference_alg1(s: &Scenario, params: &Alg1Params) -> Plan {
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
                let phi_hat = crate::paper_a::bandwidth::lemma3_latency_s(s, &lens);
                let tau = s.expected_tokens_sum(&lens) / (phi_hat + verify);
                if best.as_ref().is_none_or(|b| tau > b.0) {
                    best = Some((tau, lens.clone()));
                }
                last = Some(lens.clone());
            }
        }
        let (_, lens) = best.unwrap();
        let (_, bandwidth) = lemma3_bandwidth(s, &lens);
        Plan::evaluated(s, lens, bandwidth).unwrap()
    }

    #[test]
    fn fast_grid_equals_the_plain_loop_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for case in 0..60 {
            let k = [1, 2, 3, 5, 8, 20][case % 6];
            let l_max = [10, 25, 40][case % 3];
            let s = random_scenario(&mut rng, k, l_max);
            let (p, l) = [(100, 100), (25, 25), (7, 60), (1, 1), (60, 1)][case % 5];
            let params = Alg1Params {
                phi_points: p,
                lambda_points: l,
                lambda_lo_ratio: [1e-6, 1e-3, 1.0][case % 3],
            };
            let fast = paper_alg1(&s, &params).unwrap();
            let slow = reference_alg1(&s, &params);
            assert_eq!(fast.draft_lengths, slow.draft_lengths, "case {case}");
            assert_eq!(
                fast.goodput_tokens_per_s.to_bits(),
                slow.goodput_tokens_per_s.to_bits(),
                "case {case}"
            );
        }
    }

    #[test]
    fn threshold_rows_equal_eq37_at_every_grid_point() {
        let mut rng = ChaCha8Rng::seed_from_u64(33);
        for case in 0..40 {
            let s = random_scenario(&mut rng, 1 + case % 20, [10, 25, 40][case % 3]);
            let params = Alg1Params {
                phi_points: 40,
                lambda_points: 100,
                lambda_lo_ratio: [1e-6, 1e-2][case % 2],
            };
            let grid = Grid::new(&s, &params);
            let n = params.lambda_points;
            let (mut out, mut exact) = (vec![0; n], vec![false; n]);
            let (mut evaluated, mut points) = (0, 0);
            for &phi in &grid.phis {
                for (k, d) in s.devices.iter().enumerate() {
                    evaluated += grid.row(k, phi, phi.ln(), &mut out, &mut exact);
                    points += n;
                    for (j, &got) in out.iter().enumerate() {
                        let lambda = grid.lambdas[j];
                        let want = round_length(
                            continuous_length(d, phi, lambda),
                            s.min_draft_len,
                            s.max_draft_len,
                        );
                        assert_eq!(got, want, "case {case} φ={phi} device {k} λ_{j}");
                    }
                }
            }
            // The thresholds, not eq. 37, classify almost every point (else this test would check nothing new).
            assert!(
                evaluated * 100 < points,
                "case {case}: {evaluated} of {points} points evaluated"
            );
        }
    }

    #[test]
    fn lemma3_lower_bound_is_below_the_root() {
        let mut rng = ChaCha8Rng::seed_from_u64(32);
        for case in 0..200 {
            let k = 1 + case % 20;
            let s = random_scenario(&mut rng, k, 25);
            let lens: Vec<u32> = (0..k).map(|i| 1 + ((case * 7 + i * 13) % 25) as u32).collect();
            let lb = lemma3_lower_bound(&s, &lens);
            let root = crate::paper_a::bandwidth::lemma3_latency_s(&s, &lens);
            assert!(lb <= root * (1.0 + 1e-15), "case {case}: {lb} > {root}");
            // The Jensen bound is tight when every device has the same offset.
            assert!(lb > 0.5 * root, "case {case}: {lb} far below {root}");
        }
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
        let total: f64 = plan.uplink_share_hz.iter().sum();
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
