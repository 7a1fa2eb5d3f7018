//! The exact planner: the true integer optimum of (P2) — L_k ∈ {L_min..L_max}, bandwidth by Lemma 3 — by a
//! Lagrangian branch-and-bound over the equalised latency φ. docs/paper-a.md gives the proof; in short:
//!
//! For any plan L with latency φ(L) ∈ [a, b], any price μ ≥ 0 and any target η,
//!
//! Σ_k E_k(L_k) − η(φ(L) + T_ver) ≤ Σ_k [E_k(L_k) − μ c_k(L_k, b)] + μB − η(a + T_ver),
//!
//! where c_k(l, φ) = a_k l / (φ − l T_k^S) is the bandwidth device k needs to finish l tokens by φ (eq. 31).
//! This holds because Σ_k c_k(L_k, φ(L)) = B (eq. 32), c_k falls in φ, and φ(L) ≥ a. The right side separates over
//! devices. So a plan can beat the incumbent goodput η only if its total "loss" against the per-device maxima of
//! v_k(l) = E_k(l) − μ c_k(l, b) stays below the slack S = Σ_k max_l v_k(l) + μB − η(a + T_ver). Intervals with
//! S ≤ 0 hold no better plan; wide intervals are bisected; in narrow ones every plan within the slack is
//! enumerated and evaluated exactly. Every plan better than the final incumbent is therefore evaluated.

use super::bandwidth::{equalised_root, lemma3_bandwidth};
use super::homogeneous::homo;
use super::scenario::{Plan, Scenario};
use crate::OptimizeError;
use std::collections::BinaryHeap;

/// Work done by one exact solve (for the closing note of benchmarks and for tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExactStats {
    /// φ-intervals examined.
    pub intervals: usize,
    /// Plans evaluated exactly (root solves).
    pub evaluations: usize,
}

/// A relative slack below which an interval counts as holding no better plan: the optimum is exact up to this
/// relative goodput (far below the 1e−9 the tests demand; it only stops endless splitting on exact ties).
const TIE_TOLERANCE: f64 = 1e-13;

/// An interval is bisected while its width term η(b − a) exceeds this multiple of its slack; narrower intervals
/// are enumerated. Larger values trade fewer intervals for more enumerated plans.
const WIDTH_FACTOR: f64 = 0.25;

struct Solver<'a> {
    s: &'a Scenario,
    /// E_k(l) for l = l_min + i, row-major by device.
    tokens: Vec<f64>,
    n: usize,
    verify: f64,
    best_tau: f64,
    best: Vec<u32>,
    stats: ExactStats,
}

impl<'a> Solver<'a> {
    fn new(s: &'a Scenario) -> Self {
        let n = (s.max_draft_len - s.min_draft_len + 1) as usize;
        let tokens = s
            .devices
            .iter()
            .flat_map(|d| s.draft_range().map(|l| d.expected_tokens(l)))
            .collect();
        Self {
            s,
            tokens,
            n,
            verify: s.verify_s(),
            best_tau: 0.0,
            best: vec![],
            stats: ExactStats::default(),
        }
    }

    fn e(&self, k: usize, l: u32) -> f64 {
        self.tokens[k * self.n + (l - self.s.min_draft_len) as usize]
    }

    fn phi(&self, lens: &[u32]) -> f64 {
        let terms = self.s.devices.iter().zip(lens).map(|(d, &l)| {
            let lf = f64::from(l);
            (d.hz_s_per_token * lf, lf * d.draft_token_s)
        });
        equalised_root(terms, self.s.bandwidth_hz)
    }

    /// Evaluates a plan exactly (eq. 33) and keeps it if it beats the incumbent.
    fn offer(&mut self, lens: &[u32]) {
        self.stats.evaluations += 1;
        let tokens: f64 = (0..lens.len()).map(|k| self.e(k, lens[k])).sum();
        let tau = tokens / (self.phi(lens) + self.verify);
        if tau > self.best_tau {
            self.best_tau = tau;
            self.best.clear();
            self.best.extend_from_slice(lens);
        }
    }

    /// Per-device argmax of v_k(l) = E_k(l) − μ c_k(l, b) (concave in l, so scanning up to the first decrease
    /// suffices); returns (Σ max v, Σ c at the argmax), or `None` if some device cannot draft `l_min` by `b`.
    fn lagrangian(&self, b: f64, mu: f64, out: &mut [u32]) -> Option<(f64, f64)> {
        let (mut sum_v, mut sum_c) = (0.0, 0.0);
        for (k, d) in self.s.devices.iter().enumerate() {
            let mut l = self.s.min_draft_len;
            let mut c = d.bandwidth_for(l, b);
            if !c.is_finite() {
                return None;
            }
            let mut v = self.e(k, l) - mu * c;
            while l < self.s.max_draft_len {
                let c_next = d.bandwidth_for(l + 1, b);
                if !c_next.is_finite() {
                    break;
                }
                let v_next = self.e(k, l + 1) - mu * c_next;
                if v_next <= v {
                    break;
                }
                (l, c, v) = (l + 1, c_next, v_next);
            }
            out[k] = l;
            sum_v += v;
            sum_c += c;
        }
        Some((sum_v, sum_c))
    }

    /// The price μ ≥ 0 that minimises the separable bound at `b` (a convex, piecewise-linear function of μ whose
    /// slope is B − Σ c_k at the argmax), found by bisection on that slope; `None` if no plan fits by `b`.
    fn best_price(&self, b: f64, scratch: &mut [u32]) -> Option<f64> {
        let budget = self.s.bandwidth_hz;
        let (_, c0) = self.lagrangian(b, 0.0, scratch)?;
        if c0 <= budget {
            return Some(0.0);
        }
        // Above the largest first-increment ratio every device sits at l_min.
        let l0 = self.s.min_draft_len;
        let mut hi = 0.0f64;
        for (k, d) in self.s.devices.iter().enumerate() {
            if l0 < self.s.max_draft_len {
                let dc = d.bandwidth_for(l0 + 1, b) - d.bandwidth_for(l0, b);
                if dc.is_finite() {
                    hi = hi.max((self.e(k, l0 + 1) - self.e(k, l0)) / dc);
                }
            }
        }
        hi *= 2.0;
        let (_, c_hi) = self.lagrangian(b, hi, scratch)?;
        if c_hi > budget {
            return None;
        }
        let mut lo = hi * 1e-12;
        for _ in 0..48 {
            let mid = (lo * hi).sqrt();
            let (_, c) = self.lagrangian(b, mid, scratch)?;
            if c > budget {
                lo = mid;
            } else {
                hi = mid;
            }
            if hi <= lo * (1.0 + 1e-9) {
                break;
            }
        }
        Some(hi)
    }

    /// Enumerates every plan whose loss against the per-device maxima at (b, μ) stays below the slack, evaluating
    /// each. The slack shrinks as the incumbent improves.
    fn enumerate(&mut self, a: f64, b: f64, mu: f64, sum_v: f64, argmax: &[u32]) {
        let budget = self.s.bandwidth_hz;
        let base = sum_v + mu * budget;
        let denom = a + self.verify;
        let s0 = base - self.best_tau * denom;
        if s0 <= 0.0 {
            return;
        }
        // Candidate values per device: (loss, l) with loss < slack, ascending.
        let mut flexible: Vec<(usize, Vec<(f64, u32)>)> = Vec::new();
        for (k, d) in self.s.devices.iter().enumerate() {
            let v_star = self.e(k, argmax[k]) - mu * d.bandwidth_for(argmax[k], b);
            let mut cands = Vec::new();
            for l in self.s.draft_range() {
                let c = d.bandwidth_for(l, b);
                if !c.is_finite() {
                    break;
                }
                let loss = (v_star - (self.e(k, l) - mu * c)).max(0.0);
                if l != argmax[k] && loss < s0 {
                    cands.push((loss, l));
                }
            }
            if !cands.is_empty() {
                cands.sort_by(|x, y| x.0.total_cmp(&y.0));
                flexible.push((k, cands));
            }
        }
        flexible.sort_by(|x, y| x.1[0].0.total_cmp(&y.1[0].0));
        let mut lens = argmax.to_vec();
        self.offer(&lens);
        self.dfs(&flexible, 0, 0.0, &mut lens, (base, denom));
    }

    fn dfs(
        &mut self,
        flexible: &[(usize, Vec<(f64, u32)>)],
        depth: usize,
        loss: f64,
        lens: &mut Vec<u32>,
        slack: (f64, f64),
    ) {
        let remaining = |best: f64| slack.0 - best * slack.1;
        if depth == flexible.len() {
            return;
        }
        // Devices are ordered by their cheapest deviation, so once even that overshoots, deeper ones do too.
        let (k, cands) = &flexible[depth];
        if loss + cands[0].0 >= remaining(self.best_tau) {
            return;
        }
        // Keep this device at its argmax and vary the later ones.
        self.dfs(flexible, depth + 1, loss, lens, slack);
        let keep = lens[*k];
        for &(dl, l) in cands {
            if loss + dl >= remaining(self.best_tau) {
                break;
            }
            lens[*k] = l;
            self.offer(lens);
            self.dfs(flexible, depth + 1, loss + dl, lens, slack);
        }
        lens[*k] = keep;
    }
}

#[derive(PartialEq)]
struct Interval {
    slack: f64,
    a: f64,
    b: f64,
}

impl Eq for Interval {}
impl PartialOrd for Interval {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Interval {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.slack.total_cmp(&other.slack)
    }
}

/// The integer optimum of (P2) with its work counters.
pub fn exact_with_stats(s: &Scenario) -> Result<(Plan, ExactStats), OptimizeError> {
    let mut solver = Solver::new(s);
    let k = s.len();
    // Incumbents: the best common length (Homo), then a few rounds of exact per-device Lagrangian argmax at the
    // incumbent's (φ, μ), with μ = η / Σ_k a_k L_k / (φ − L_k T_k)² from the stationarity of the Lagrangian in φ.
    let homo_plan = homo(s)?;
    solver.offer(&homo_plan.draft_lengths);
    let mut scratch = vec![0u32; k];
    for _ in 0..8 {
        let lens = solver.best.clone();
        let phi = solver.phi(&lens);
        let denom: f64 = s
            .devices
            .iter()
            .zip(&lens)
            .map(|(d, &l)| {
                let slack = phi - f64::from(l) * d.draft_token_s;
                d.hz_s_per_token * f64::from(l) / (slack * slack)
            })
            .sum();
        let mu = solver.best_tau / denom;
        let before = solver.best_tau;
        if solver.lagrangian(phi, mu, &mut scratch).is_some() {
            let cand = scratch.clone();
            solver.offer(&cand);
        }
        if solver.best_tau <= before {
            break;
        }
    }
    let lo_lens = vec![s.min_draft_len; k];
    let hi_lens = vec![s.max_draft_len; k];
    let phi_min = solver.phi(&lo_lens);
    let phi_max = solver.phi(&hi_lens);
    let max_tokens: f64 = (0..k).map(|i| solver.e(i, s.max_draft_len)).sum();
    let mut heap = BinaryHeap::new();
    heap.push(Interval {
        slack: f64::INFINITY,
        a: phi_min,
        b: phi_max,
    });
    while let Some(Interval { a, b, .. }) = heap.pop() {
        solver.stats.intervals += 1;
        // No plan with φ ≥ cap can beat the incumbent even with every device at L_max.
        let cap = max_tokens / solver.best_tau - solver.verify;
        if a >= cap {
            continue;
        }
        let b = b.min(cap);
        let Some(mu) = solver.best_price(b, &mut scratch) else {
            continue;
        };
        let Some((sum_v, _)) = solver.lagrangian(b, mu, &mut scratch) else {
            continue;
        };
        let argmax = scratch.clone();
        // The Lagrangian argmax is a plan in its own right: offering it tightens the incumbent early.
        solver.offer(&argmax);
        let scale = solver.best_tau * (a + solver.verify);
        let slack = sum_v + mu * s.bandwidth_hz - scale;
        if slack <= TIE_TOLERANCE * scale {
            continue;
        }
        let width_cost = solver.best_tau * (b - a);
        if width_cost > WIDTH_FACTOR * slack && b - a > 1e-12 * b {
            let m = 0.5 * (a + b);
            heap.push(Interval { slack, a, b: m });
            heap.push(Interval { slack, a: m, b });
            continue;
        }
        solver.enumerate(a, b, mu, sum_v, &argmax);
    }
    let lens = solver.best.clone();
    let (_, bandwidth) = lemma3_bandwidth(s, &lens);
    Ok((Plan::evaluated(s, lens, bandwidth)?, solver.stats))
}

/// The integer optimum of (P2): L_k ∈ {L_min..L_max}, Lemma 3 bandwidth (exact up to a relative 1e−13).
pub fn exact(s: &Scenario) -> Result<Plan, OptimizeError> {
    exact_with_stats(s).map(|(plan, _)| plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
    use crate::paper_a::heterogeneous::{Alg1Params, paper_alg1};
    use crate::paper_a::testing::random_scenario;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn exact_equals_exhaustive_search_on_seeded_instances() {
        let mut rng = ChaCha8Rng::seed_from_u64(2024);
        let mut worst = 0.0f64;
        for case in 0..240 {
            let k = 1 + rng.random_range(0..4usize);
            let l_max = 2 + rng.random_range(0..9u32);
            let s = random_scenario(&mut rng, k, l_max);
            let ex = exact(&s).unwrap();
            let bf = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap();
            let gap = (bf.goodput_tokens_per_s - ex.goodput_tokens_per_s) / bf.goodput_tokens_per_s;
            worst = worst.max(gap.abs());
            assert!(
                gap.abs() <= 1e-9,
                "case {case}: exact {:?} vs brute {:?}",
                ex.draft_lengths,
                bf.draft_lengths
            );
        }
        assert!(worst <= 1e-9);
    }

    #[test]
    fn exact_is_never_below_algorithm1() {
        let mut rng = ChaCha8Rng::seed_from_u64(77);
        let params = Alg1Params {
            phi_points: 40,
            lambda_points: 40,
            lambda_lo_ratio: 1e-6,
        };
        for _ in 0..30 {
            let s = random_scenario(&mut rng, 12, 25);
            let ex = exact(&s).unwrap();
            let alg = paper_alg1(&s, &params).unwrap();
            assert!(ex.goodput_tokens_per_s >= alg.goodput_tokens_per_s * (1.0 - 1e-12));
        }
    }

    #[test]
    fn exact_handles_many_devices() {
        let mut rng = ChaCha8Rng::seed_from_u64(1000);
        let s = random_scenario(&mut rng, 12, 25);
        let (plan, stats) = exact_with_stats(&s).unwrap();
        assert_eq!(plan.draft_lengths.len(), 12);
        assert!(stats.evaluations < 200_000, "{stats:?}");
        let total: f64 = plan.bandwidth_hz.iter().sum();
        assert!((total - s.bandwidth_hz).abs() < 1e-9 * s.bandwidth_hz);
    }
}
