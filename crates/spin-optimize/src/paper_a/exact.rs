//! The exact planner: the true integer optimum of (P2) — L_k ∈ {L_min..L_max}, bandwidth by Lemma 3 — by a
//! search over the equalised latency φ with exact knapsack solves. docs/paper-a.md gives the proof; in short:
//!
//! A plan L meets latency φ (φ(L) ≤ φ) exactly when Σ_k c_k(L_k, φ) ≤ B, with c_k(l, φ) = a_k l / (φ − l T_k^S)
//! the bandwidth device k needs to finish l tokens by φ (eq. 31). So V(φ) = max { Σ_k E_k(L_k) : Σ_k c_k ≤ B }, a
//! multiple-choice knapsack, is nondecreasing in φ, and every plan with φ(L) ∈ [a, b] has goodput at most
//! V(b)/(a + T_ver). Intervals whose knapsack relaxation U(b) ≥ V(b) already rules them out are dropped, wide ones
//! are bisected, and in the rest V(b) is solved exactly (depth-first around the Lagrangian maximiser). The plan L_b
//! that attains V(b) is evaluated (a candidate), and no plan with latency in [min(φ(L_b), V(b)/η − T_ver), b]
//! beats the incumbent η afterwards, so the interval shrinks to the part below.
//!
//! Every step is charged to a work budget ([`DEFAULT_WORK_BUDGET`], or [`exact_with_budget`]'s), so the work is
//! bounded for any input; a knapsack that needs more than [`KNAPSACK_NODE_LIMIT`] nodes splits its interval
//! instead. If the queue of intervals empties, the plan is proven optimal; if the budget runs out first, the plan
//! is the best found and the largest bound of the intervals left caps the optimum ([`Optimality::Bounded`]).

use super::bandwidth::{equalised_slack_counted, lemma1_slack, lemma3_bandwidth};
use super::homogeneous::best_common_length;
use super::scenario::{Optimality, Plan, Scenario};
use crate::OptimizeError;
use std::collections::BinaryHeap;

/// Work done by one exact solve (for the closing note of benchmarks and for tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExactStats {
    /// φ-intervals examined.
    pub intervals: usize,
    /// Plans evaluated exactly (root solves).
    pub evaluations: usize,
    /// Nodes of the knapsack depth-first searches.
    pub knapsack_nodes: usize,
    /// Work units spent (see [`DEFAULT_WORK_BUDGET`]); at most the budget plus [`overshoot_bound`] (the steps
    /// taken after the last check of the budget).
    pub work: u64,
}

/// The most work units the exact planner spends beyond its budget: 3·K·n + 1,024·K for K devices and
/// n = L_max − L_min + 1 allowed lengths (at most three scans, or the Homo start, plus five root solves, run between
/// two checks of the budget). The final plan's bandwidth solve and evaluation (≤ 202·K) are not counted.
pub fn overshoot_bound(s: &Scenario) -> u64 {
    let k = s.len() as u64;
    let n = u64::from(s.max_draft_len - s.min_draft_len + 1);
    3 * k * n + 1024 * k
}

/// The exact planner's default work budget, in units of one per-device step: one device's term in a root solve's
/// Newton iteration, one draft length of one device in a price, Lagrangian or knapsack scan, or one knapsack search
/// node. Each unit costs a few nanoseconds, so the default bounds a plan to well under a second on one core
/// (docs/paper-a.md, "Worst-case work", gives the measured worst cases).
pub const DEFAULT_WORK_BUDGET: u64 = 60_000_000;

/// The most nodes one knapsack search may visit before its interval is split instead (a hard knapsack at a wide
/// interval is usually easy on its halves).
pub const KNAPSACK_NODE_LIMIT: u64 = 200_000;

/// A relative margin below which a bound counts as not beating the incumbent: the optimum is exact up to this
/// relative goodput (far below the 1e−9 the tests demand; it only stops endless splitting on exact ties).
const TIE_TOLERANCE: f64 = 1e-13;

/// The fewest nodes a knapsack tried before halving an interval may visit (else one per device).
const SPECULATIVE_NODE_FLOOR: u64 = 16;

struct Solver<'a> {
    s: &'a Scenario,
    /// The smallest length searched: the scenario's L_min, or 0 when devices may draft nothing
    /// ([`exact_with_idle`]).
    lo: u32,
    /// E_k(l) for l = lo + i, row-major by device.
    tokens: Vec<f64>,
    n: usize,
    verify: f64,
    best_tau: f64,
    best: Vec<u32>,
    stats: ExactStats,
    /// a_k·l and l·T_k^S for l = l_min + i, row-major by device (the numerator and the drafting time of c_k).
    hz_s: Vec<f64>,
    draft_s: Vec<f64>,
    /// c_k(l, `cost_at`) = a_k l / (`cost_at` − l T_k^S) (+∞ where drafting alone takes that long), row-major by
    /// device: one branch-free pass per latency serves the price, the Lagrangian, the tangent bound and the knapsack
    /// at that latency, which each recomputed it (bit for bit as `ScenarioDevice::bandwidth_for` does).
    cost: Vec<f64>,
    cost_at: f64,
    /// Scratch for `best_price`: (running-minimum efficiency, bandwidth increment) per step.
    items: Vec<(f64, f64)>,
    /// Scratch for `knapsack`: the options of every flexible device, the flexible devices, and save_after.
    options: Vec<Opt>,
    flexible: Vec<Flex>,
    save_after: Vec<f64>,
    /// Work units the search may spend.
    budget: u64,
    /// K·(L_max − L_min + 1): the cost of one scan over every device's lengths.
    scan: u64,
}

impl<'a> Solver<'a> {
    fn new(s: &'a Scenario, lo: u32, budget: u64) -> Self {
        let n = (s.max_draft_len - lo + 1) as usize;
        let tokens = s
            .devices
            .iter()
            .flat_map(|d| (lo..=s.max_draft_len).map(|l| d.expected_tokens(l)))
            .collect();
        let (mut hz_s, mut draft_s) = (Vec::new(), Vec::new());
        for d in &s.devices {
            for l in lo..=s.max_draft_len {
                let lf = f64::from(l);
                hz_s.push(d.hz_s_per_token * lf);
                draft_s.push(lf * d.draft_token_s);
            }
        }
        let cost = vec![f64::INFINITY; hz_s.len()];
        Self {
            s,
            lo,
            tokens,
            hz_s,
            draft_s,
            cost,
            cost_at: f64::NAN,
            n,
            verify: s.verify_s(),
            best_tau: 0.0,
            best: vec![],
            stats: ExactStats::default(),
            items: Vec::new(),
            options: Vec::new(),
            flexible: Vec::new(),
            save_after: Vec::new(),
            budget,
            scan: (s.len() * n) as u64,
        }
    }

    /// Whether the budget still allows a step.
    fn within_budget(&self) -> bool {
        self.stats.work <= self.budget
    }

    /// Books `units` of work; false once the budget is spent.
    fn charge(&mut self, units: u64) -> bool {
        self.stats.work = self.stats.work.saturating_add(units);
        self.stats.work <= self.budget
    }

    fn e(&self, k: usize, l: u32) -> f64 {
        self.tokens[k * self.n + (l - self.lo) as usize]
    }

    /// Fills `cost` for latency `b` (nothing to do if it holds `b` already).
    fn cost_at(&mut self, b: f64) {
        if self.cost_at.to_bits() == b.to_bits() {
            return;
        }
        self.cost_at = b;
        for ((c, &w), &t) in self.cost.iter_mut().zip(&self.hz_s).zip(&self.draft_s) {
            let slack = b - t;
            // The quotient is formed either way and then selected, so the loop has no branch and vectorises (the
            // same values as dividing only where the slack is positive).
            let quotient = w / slack;
            *c = if slack > 0.0 { quotient } else { f64::INFINITY };
        }
    }

    /// c_k(l, b) at the latency `cost` was filled for.
    fn c(&self, k: usize, l: u32) -> f64 {
        self.cost[k * self.n + (l - self.lo) as usize]
    }

    fn phi(&mut self, lens: &[u32]) -> f64 {
        if self.lo == 0 && lens.iter().all(|&l| l == 0) {
            // Nothing to send: the uplink phase takes no time (Lemma 3 has no term to equalise).
            self.charge(self.s.len() as u64);
            return 0.0;
        }
        // A device drafting nothing adds w = 0 to every sum of the root solve: exact zeros, no effect.
        let terms = self.s.devices.iter().zip(lens).map(|(d, &l)| {
            let lf = f64::from(l);
            (d.hz_s_per_token * lf, lf * d.draft_token_s)
        });
        let (max_b, y, iterations) = equalised_slack_counted(terms, self.s.bandwidth_hz);
        self.charge(u64::from(iterations + 1) * self.s.len() as u64);
        max_b + y
    }

    /// Whether a plan carrying `tokens` (Σ_k E_k(L_k)) can beat the incumbent η: it cannot when it does not fit in
    /// the band even at the latency φ' = tokens/η − T_ver where it would only tie (Σ_k c_k(L_k, φ') > B, so
    /// φ(L) > φ'). K divisions instead of a root solve; a margin of 1e−9 on the band keeps rounding on the safe
    /// side (a plan is only skipped when it falls short of η by far more than the tie tolerance).
    fn might_beat(&self, lens: &[u32], tokens: f64) -> bool {
        if self.best_tau <= 0.0 {
            return true;
        }
        let phi = tokens / self.best_tau - self.verify;
        let need: f64 = self
            .s
            .devices
            .iter()
            .zip(lens)
            .map(|(d, &l)| d.bandwidth_for(l, phi))
            .sum();
        need <= self.s.bandwidth_hz * (1.0 + 1e-9)
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
    fn lagrangian(&mut self, b: f64, mu: f64, out: &mut [u32]) -> Option<(f64, f64)> {
        self.cost_at(b);
        let (mut sum_v, mut sum_c) = (0.0, 0.0);
        // `out` holds one slot per device; each device's row of E and c is scanned by position i = l − l_min.
        let rows = self
            .tokens
            .chunks_exact(self.n)
            .zip(self.cost.chunks_exact(self.n));
        for (slot, (e, cost)) in out.iter_mut().zip(rows) {
            let mut i = 0;
            let mut c = cost[0];
            if !finite(c) {
                return None;
            }
            let mut v = e[0] - mu * c;
            while i + 1 < cost.len() {
                let c_next = cost[i + 1];
                if !finite(c_next) {
                    break;
                }
                let v_next = e[i + 1] - mu * c_next;
                if v_next <= v {
                    break;
                }
                (i, c, v) = (i + 1, c_next, v_next);
            }
            *slot = self.lo + i as u32;
            sum_v += v;
            sum_c += c;
        }
        Some((sum_v, sum_c))
    }

    /// The price μ ≥ 0 that minimises the separable bound at `b` (a convex, piecewise-linear function of μ whose
    /// slope is B − Σ c_k at the argmax); `None` if no plan fits by `b`. Device k moves from l to l + 1 at price μ
    /// exactly when every step up to there has efficiency ΔE/Δc > μ (the scan in `lagrangian`), so each step counts
    /// with the running minimum of the efficiencies before it. The optimal μ is the efficiency of the break item:
    /// the first step, taken in order of falling efficiency, that no longer fits in B.
    fn best_price(&mut self, b: f64) -> Option<f64> {
        self.cost_at(b);
        let budget = self.s.bandwidth_hz;
        let mut items = std::mem::take(&mut self.items);
        items.clear();
        let mut base = 0.0;
        let mut feasible = true;
        for (e, cost) in self
            .tokens
            .chunks_exact(self.n)
            .zip(self.cost.chunks_exact(self.n))
        {
            let mut c = cost[0];
            if !finite(c) {
                feasible = false;
                break;
            }
            base += c;
            let mut ratio = f64::INFINITY;
            for i in 1..cost.len() {
                let c_next = cost[i];
                if !finite(c_next) {
                    break;
                }
                let dc = c_next - c;
                let r = (e[i] - e[i - 1]) / dc;
                // A NaN or non-positive efficiency is never taken at μ ≥ 0.
                let positive = r > 0.0; // false for NaN
                if !positive {
                    break;
                }
                // Both positive and not NaN here, so a plain comparison is `min` (without its NaN handling).
                if r < ratio {
                    ratio = r;
                }
                items.push((ratio, dc));
                c = c_next;
            }
        }
        let price = if !feasible || base > budget {
            None
        } else if base + items.iter().map(|&(_, dc)| dc).sum::<f64>() <= budget {
            Some(0.0)
        } else {
            Some(break_ratio(&mut items, budget - base))
        };
        self.items = items;
        price
    }

    /// Exact knapsack at latency `b`: the plan with the largest Σ_k E_k among those with Σ_k c_k(L_k, b) ≤ B and
    /// Σ_k E_k > `theta`, or `None` if there is none. `mu` is any price ≥ 0 (the relaxation's optimal one is
    /// fastest): Σ E_k = Σ v_k + μ Σ c_k ≤ Σ_k max v_k − Σ loss_k + μB, so only plans with Σ loss_k below
    /// U − best are searched, depth-first over the devices whose deviations are cheap enough.
    ///
    /// The depth-first search stops when the work budget is spent; the second value says whether it finished (only
    /// then is the first the knapsack optimum; otherwise it is the best plan found, if any).
    fn knapsack(
        &mut self,
        b: f64,
        mu: f64,
        theta: f64,
        argmax: &[u32],
        node_limit: u64,
    ) -> (Option<(f64, Vec<u32>)>, bool) {
        // Two scans over every device's lengths and the sorts of the options.
        if !self.charge(3 * self.scan) {
            return (None, false);
        }
        self.cost_at(b);
        let budget = self.s.bandwidth_hz;
        let (mut base_e, mut base_c, mut upper) = (0.0, 0.0, mu * budget);
        for (k, &l0) in argmax.iter().enumerate() {
            let (e0, c0) = (self.e(k, l0), self.c(k, l0));
            base_e += e0;
            base_c += c0;
            upper += e0 - mu * c0;
        }
        if upper <= theta {
            return (None, true);
        }
        let room = upper - theta;
        // Every flexible device's options in one buffer (kept between calls: this runs once per interval).
        let mut options = std::mem::take(&mut self.options);
        let mut flexible = std::mem::take(&mut self.flexible);
        options.clear();
        flexible.clear();
        let rows = self
            .tokens
            .chunks_exact(self.n)
            .zip(self.cost.chunks_exact(self.n));
        for (k, (&l0, (erow, crow))) in argmax.iter().zip(rows).enumerate() {
            let i0 = (l0 - self.lo) as usize;
            let (e0, c0) = (erow[i0], crow[i0]);
            let v0 = e0 - mu * c0;
            let start = options.len();
            for (i, (&e, &c)) in erow.iter().zip(crow).enumerate() {
                if !finite(c) {
                    break;
                }
                let loss = (v0 - (e - mu * c)).max(0.0);
                if i != i0 && loss < room {
                    options.push(Opt {
                        loss,
                        l: self.lo + i as u32,
                        de: e - e0,
                        dc: c - c0,
                    });
                }
            }
            if options.len() > start {
                let own = &mut options[start..];
                sort_by_loss(own);
                let save = own.iter().map(|o| -o.dc).fold(0.0f64, f64::max);
                flexible.push(Flex {
                    k,
                    first: own[0].loss,
                    options: start..options.len(),
                    save,
                });
            }
        }
        // By cheapest option, ties in order of k (as the stable sort this replaced left them; the unstable one with
        // the tie-break is the same order, without the stable sort's set-up per call).
        flexible.sort_unstable_by(|x, y| x.first.total_cmp(&y.first).then(x.k.cmp(&y.k)));
        // save_after[i]: the most bandwidth devices i.. can still give back.
        let mut save_after = std::mem::take(&mut self.save_after);
        save_after.clear();
        save_after.resize(flexible.len() + 1, 0.0);
        for i in (0..flexible.len()).rev() {
            save_after[i] = save_after[i + 1] + flexible[i].save;
        }
        let mut search = Knap {
            options: &options,
            flexible: &flexible,
            save_after: &save_after,
            budget,
            upper,
            best_e: theta,
            best: None,
            lens: argmax.to_vec(),
            nodes: 0,
            limit: node_limit.min(self.budget.saturating_sub(self.stats.work)),
            aborted: false,
        };
        search.visit(base_e, base_c);
        search.dfs(0, 0.0, base_e, base_c);
        self.stats.knapsack_nodes += search.nodes as usize;
        self.charge(search.nodes);
        let complete = !search.aborted;
        let found = search.best.map(|l| (search.best_e, l));
        (self.options, self.flexible, self.save_after) = (options, flexible, save_after);
        (found, complete)
    }

    /// Σ_k max_l [E_k(l) − μ c_k(l, b) − w μ |∂c_k/∂φ (l, b)|]: the per-device part of the interval bound whose
    /// latency term is the tangent of c_k at b (c_k is convex and falling in φ). `None` if some device cannot
    /// draft `l_min` by `b`.
    fn penalised_max(&mut self, b: f64, mu: f64, w: f64) -> Option<f64> {
        self.cost_at(b);
        let mut sum = 0.0;
        let n = self.n;
        let rows = self
            .tokens
            .chunks_exact(n)
            .zip(self.cost.chunks_exact(n))
            .zip(self.draft_s.chunks_exact(n));
        for ((e, cost), draft) in rows {
            let value = |i: usize| {
                let slack = b - draft[i];
                if slack > 0.0 {
                    let c = cost[i];
                    Some(e[i] - mu * (c + w * c / slack))
                } else {
                    None
                }
            };
            let mut v = value(0)?;
            for i in 1..n {
                match value(i) {
                    Some(next) if next > v => v = next,
                    _ => break,
                }
            }
            sum += v;
        }
        Some(sum)
    }

    /// Σ_k w_k/(φ − β_k) and Σ_k w_k/(φ − β_k)² for the Lemma 3 terms (w_k, β_k) = (a_k L_k, L_k T_k) of `lens`.
    fn root_sums(&self, lens: &[u32], phi: f64) -> (f64, f64) {
        let (mut g, mut dg) = (0.0, 0.0);
        for (d, &l) in self.s.devices.iter().zip(lens) {
            if l == 0 {
                // No term (w = 0); skipped so that φ = 0 (every device idle) forms no 0·∞.
                continue;
            }
            let lf = f64::from(l);
            let inv = 1.0 / (phi - lf * d.draft_token_s);
            g += d.hz_s_per_token * lf * inv;
            dg += d.hz_s_per_token * lf * inv * inv;
        }
        (g, dg)
    }

    /// ±1 moves on single devices until none improves (a strong starting incumbent). A move is evaluated exactly
    /// only if a cheap bound says it might win: g(x) = Σ_k w_k/(x − β_k) − B is convex and falling, so one Newton
    /// step from the current φ (O(1) from the running sums) lands at or below the new Lemma 3 root, which caps the
    /// moved plan's goodput.
    fn local_search(&mut self) {
        let mut lens = self.best.clone();
        let budget = self.s.bandwidth_hz;
        let mut phi = self.phi(&lens);
        let (mut g_sum, mut dg_sum) = self.root_sums(&lens, phi);
        let mut tokens: f64 = (0..lens.len()).map(|k| self.e(k, lens[k])).sum();
        for _ in 0..64 {
            let before = self.best_tau;
            for k in 0..lens.len() {
                if !self.charge(2) {
                    return;
                }
                for up in [true, false] {
                    let l = lens[k];
                    let next = if up {
                        if l >= self.s.max_draft_len {
                            continue;
                        }
                        l + 1
                    } else {
                        if l <= self.lo {
                            continue;
                        }
                        l - 1
                    };
                    let d = &self.s.devices[k];
                    let (lf, nf) = (f64::from(l), f64::from(next));
                    let slack_new = phi - nf * d.draft_token_s;
                    if slack_new > 0.0 {
                        let inv_old = 1.0 / (phi - lf * d.draft_token_s);
                        let inv_new = 1.0 / slack_new;
                        let (w_old, w_new) = (d.hz_s_per_token * lf, d.hz_s_per_token * nf);
                        let g = g_sum - w_old * inv_old + w_new * inv_new - budget;
                        let dg = dg_sum - w_old * inv_old * inv_old + w_new * inv_new * inv_new;
                        let root_lo = phi + g / dg;
                        let new_tokens = tokens - self.e(k, l) + self.e(k, next);
                        if root_lo + self.verify > 0.0
                            && new_tokens / (root_lo + self.verify) <= self.best_tau * (1.0 - 1e-12)
                        {
                            continue;
                        }
                    }
                    if !self.within_budget() {
                        return;
                    }
                    lens[k] = next;
                    self.offer(&lens);
                    if self.best[k] == next {
                        phi = self.phi(&lens);
                        self.charge(2 * lens.len() as u64);
                        (g_sum, dg_sum) = self.root_sums(&lens, phi);
                        tokens = (0..lens.len()).map(|i| self.e(i, lens[i])).sum();
                    } else {
                        lens[k] = l;
                    }
                }
            }
            if self.best_tau <= before {
                break;
            }
        }
    }
}

/// The efficiency r of the break item: Σ Δc over steps more efficient than r is at most `room`, over steps at least
/// as efficient it exceeds `room` (which the caller guarantees of the whole set). The order of falling efficiency is
/// never built in full: a weighted radix selection on the efficiencies' bit patterns (positive IEEE doubles order
/// as their bits do) buckets the steps by the top 8 bits of their offset from the smallest key, walks the buckets
/// from the most efficient down to the one holding the break, and repeats on that bucket alone; at most 16 steps
/// left are sorted. Hand-written because it is the hot spot of the interval search (it replaced a quickselect whose
/// comparisons mispredicted: about a third of a plan's time at K = 64), and no crate offers a weighted selection.
fn break_ratio(items: &mut [(f64, f64)], mut room: f64) -> f64 {
    let mut len = items.len();
    // The smallest and largest key of the steps left (for the first pass from a scan; later ones from the
    // partition that keeps the break's bucket, which sees every kept key anyway).
    let (mut lo, mut hi) = items.iter().fold((u64::MAX, 0u64), |(lo, hi), &(r, _)| {
        let key = r.to_bits();
        (lo.min(key), hi.max(key))
    });
    loop {
        let slice = &mut items[..len];
        if slice.len() <= 16 {
            slice.sort_unstable_by(|x, y| y.0.total_cmp(&x.0));
            let mut used = 0.0;
            for &(r, dc) in slice.iter() {
                used += dc;
                if used > room {
                    return r;
                }
            }
            // Only rounding in `room` gets here: the least efficient step is the break item.
            return slice.last().map_or(0.0, |&(r, _)| r);
        }
        if lo == hi {
            // Every step left is equally efficient, so the break item has that efficiency.
            return f64::from_bits(lo);
        }
        let shift = (u64::BITS - (hi - lo).leading_zeros()).saturating_sub(8);
        // Below 256 by the choice of `shift`; the mask only tells the compiler so (no bounds check per step).
        let bucket = |r: f64| ((r.to_bits() - lo) >> shift) as usize & 255;
        let mut weight = [0.0f64; 256];
        for &(r, dc) in slice.iter() {
            weight[bucket(r)] += dc;
        }
        let mut j = bucket(f64::from_bits(hi));
        while weight[j] <= room {
            room -= weight[j];
            if j == 0 {
                // Only rounding in `room` gets here: the least efficient step is the break item.
                return f64::from_bits(lo);
            }
            j -= 1;
        }
        // The break lies in bucket j (the lowest key and the highest fall in different buckets, so it is smaller).
        let mut kept = 0;
        let (mut next_lo, mut next_hi) = (u64::MAX, 0u64);
        for i in 0..slice.len() {
            let key = slice[i].0.to_bits();
            if bucket(slice[i].0) == j {
                next_lo = next_lo.min(key);
                next_hi = next_hi.max(key);
                slice.swap(kept, i);
                kept += 1;
            }
        }
        (len, lo, hi) = (kept, next_lo, next_hi);
    }
}

/// Whether a bandwidth c_k(l, b) from [`Solver::cost_at`] is finite. Those are positive quotients or +∞, never
/// NaN or −∞, so one comparison with +∞ decides it (`f64::is_finite` masks and compares, and the scans call this at
/// every step).
#[inline]
fn finite(c: f64) -> bool {
    c < f64::INFINITY
}

/// Sorts a device's options cheapest first, ties in order of l (the order the stable sort this replaced left
/// them in, as they are pushed in order of l). Hand-written insertion sort: a device has at most L_max − L_min
/// options, usually a handful, and the library sorts' set-up per call was most of their cost here (about a tenth
/// of a K = 64 plan).
fn sort_by_loss(options: &mut [Opt]) {
    for i in 1..options.len() {
        let mut j = i;
        while j > 0
            && options[j - 1]
                .loss
                .total_cmp(&options[j].loss)
                .then(options[j - 1].l.cmp(&options[j].l))
                .is_gt()
        {
            options.swap(j - 1, j);
            j -= 1;
        }
    }
}

struct Opt {
    loss: f64,
    l: u32,
    de: f64,
    dc: f64,
}

struct Flex {
    k: usize,
    /// The loss of its cheapest option.
    first: f64,
    /// Its options, cheapest first, in the knapsack's option buffer.
    options: std::ops::Range<usize>,
    /// Largest bandwidth reduction among the options.
    save: f64,
}

struct Knap<'f> {
    options: &'f [Opt],
    flexible: &'f [Flex],
    save_after: &'f [f64],
    budget: f64,
    upper: f64,
    best_e: f64,
    best: Option<Vec<u32>>,
    lens: Vec<u32>,
    nodes: u64,
    /// The most nodes this search may visit (the rest of the work budget).
    limit: u64,
    /// Set when `limit` was reached: the search is incomplete.
    aborted: bool,
}

impl Knap<'_> {
    fn visit(&mut self, e: f64, c: f64) {
        if c <= self.budget && e > self.best_e {
            self.best_e = e;
            self.best = Some(self.lens.clone());
        }
    }

    fn dfs(&mut self, depth: usize, loss: f64, e: f64, c: f64) {
        self.nodes += 1;
        if self.nodes > self.limit {
            self.aborted = true;
        }
        if self.aborted || depth == self.flexible.len() || c - self.save_after[depth] > self.budget {
            return;
        }
        let flex = &self.flexible[depth];
        let options = &self.options[flex.options.clone()];
        if loss + options[0].loss >= self.upper - self.best_e {
            return;
        }
        self.dfs(depth + 1, loss, e, c);
        let keep = self.lens[flex.k];
        for o in options {
            if self.aborted || loss + o.loss >= self.upper - self.best_e {
                break;
            }
            self.lens[flex.k] = o.l;
            let (e2, c2) = (e + o.de, c + o.dc);
            self.visit(e2, c2);
            self.dfs(depth + 1, loss + o.loss, e2, c2);
        }
        self.lens[flex.k] = keep;
    }
}

#[derive(PartialEq)]
struct Interval {
    key: f64,
    a: f64,
    b: f64,
    /// An upper bound on the goodput of every plan with latency in [a, b] (inherited by sub-intervals).
    bound: f64,
}

impl Eq for Interval {}
impl PartialOrd for Interval {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Interval {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.total_cmp(&other.key)
    }
}

/// The integer optimum of (P2) with its work counters, under [`DEFAULT_WORK_BUDGET`].
pub fn exact_with_stats(s: &Scenario) -> Result<(Plan, ExactStats), OptimizeError> {
    exact_with_budget(s, DEFAULT_WORK_BUDGET)
}

/// The exact planner under a work budget (units of [`DEFAULT_WORK_BUDGET`]).
///
/// Returns the integer optimum of (P2) with [`Optimality::Optimal`] when the search finishes within the budget;
/// otherwise the best plan found with [`Optimality::Bounded`]: a rigorous upper bound on the optimal goodput (the
/// largest bound of the latency intervals not yet ruled out) and the relative gap. Either way the work is at most
/// `work_budget` units plus one step (`ExactStats::work`), and no error is returned for a valid scenario.
pub fn exact_with_budget(s: &Scenario, work_budget: u64) -> Result<(Plan, ExactStats), OptimizeError> {
    solve(s, s.min_draft_len, work_budget)
}

/// The exact planner on (P2) with one more choice per device: L_k = 0, a device that drafts nothing this round. It
/// sends nothing and needs no band, and the target's pass still gives it one token (E[N_k | 0] = 1), so eq. 27
/// extends to it unchanged; the multiple-choice knapsack at each latency gains one option of cost 0. For rounds
/// that allow it (a unified round with `min_draft_len: 0`): L_k ∈ {0..L_max}. The scenario's L_min must be 1 (so
/// that the choices are one range); any other is an error naming `min_draft_len`.
pub fn exact_with_idle(s: &Scenario) -> Result<Plan, OptimizeError> {
    if s.min_draft_len != 1 {
        return Err(OptimizeError::Invalid {
            field: "min_draft_len".into(),
            reason: format!(
                "{} leaves a gap above 0; drafting nothing extends the range 1..=max_draft_len only",
                s.min_draft_len
            ),
        });
    }
    solve(s, 0, DEFAULT_WORK_BUDGET).map(|(plan, _)| plan)
}

/// The interval search over L_k ∈ {`lo`..L_max} (`lo` is L_min, or 0 below L_min = 1).
fn solve(s: &Scenario, lo: u32, work_budget: u64) -> Result<(Plan, ExactStats), OptimizeError> {
    let mut solver = Solver::new(s, lo, work_budget);
    let k = s.len();
    // Incumbents: the best common length (Homo), a few rounds of exact per-device Lagrangian argmax at the
    // incumbent's (φ, μ), with μ = η / Σ_k a_k L_k / (φ − L_k T_k)² from the stationarity of the Lagrangian in φ,
    // then ±1 moves.
    // Homo's common length (as `homo` picks it, from the solver's own E_k table: the plan and its Lemma 1 shares
    // are not needed, only the lengths).
    let (max_b, y) = lemma1_slack(s);
    let homo_len = best_common_length(s, max_b + y, |l| (0..k).map(|i| solver.e(i, l)).sum());
    // Homo scans every length of every device twice and solves Lemma 1 twice (Newton and Brent, ≤ 200 passes each).
    solver.charge(2 * solver.scan + 400 * k as u64);
    solver.offer(&vec![homo_len; k]);
    if lo == 0 {
        // Every device idle: K tokens in T_ver, the plan that wins when every upload costs more than it brings.
        solver.offer(&vec![0; k]);
    }
    let mut scratch = vec![0u32; k];
    for _ in 0..8 {
        if !solver.charge(2 * solver.scan) {
            break;
        }
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
        if denom.is_nan() || denom <= 0.0 {
            // Every device idle (no Lagrangian slope to take μ from); the searches below start from this plan.
            break;
        }
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
    solver.local_search();
    let lo_lens = vec![lo; k];
    let hi_lens = vec![s.max_draft_len; k];
    let phi_min = if lo == 0 {
        // Every plan but the all-idle one (offered above) has a device k drafting L_k ≥ 1, whose term alone needs
        // w_k/(φ − β_k) ≤ B, so φ ≥ T_k^S + a_k/B: the search starts there, not at the idle plan's φ = 0 (a bound
        // over [0, b] would be loose by the whole uplink phase). Lowered by a relative 1e−12 against rounding.
        s.devices
            .iter()
            .map(|d| d.draft_token_s + d.hz_s_per_token / s.bandwidth_hz)
            .fold(f64::INFINITY, f64::min)
            * (1.0 - 1e-12)
    } else {
        solver.phi(&lo_lens)
    };
    let phi_max = solver.phi(&hi_lens);
    let max_tokens: f64 = (0..k).map(|i| solver.e(i, s.max_draft_len)).sum();
    let verify = solver.verify;
    let mut heap = BinaryHeap::new();
    // Intervals whose knapsack could not be finished and could not be split further.
    let mut open: Vec<Interval> = Vec::new();
    // Every plan has φ(L) ≥ φ(L_min, …) and at most Σ_k E_k(L_max) tokens.
    heap.push(Interval {
        key: f64::INFINITY,
        a: phi_min,
        b: phi_max,
        bound: max_tokens / (phi_min + verify),
    });
    while let Some(interval) = heap.pop() {
        // One interval costs three scans (price, Lagrangian, tangent bound).
        if !solver.charge(3 * solver.scan) {
            heap.push(interval);
            break;
        }
        let Interval { a, b, bound, .. } = interval;
        solver.stats.intervals += 1;
        // No plan with φ ≥ cap can beat the incumbent even with every device at L_max.
        let cap = max_tokens / solver.best_tau - verify;
        if a >= cap {
            continue;
        }
        let b = b.min(cap);
        let Some(mu) = solver.best_price(b) else {
            continue;
        };
        let Some((sum_v, _)) = solver.lagrangian(b, mu, &mut scratch) else {
            continue;
        };
        let upper = sum_v + mu * s.bandwidth_hz;
        // U(b) ≥ V(b) bounds the tokens of every plan in [a, b], whose latency is at least a.
        let bound = bound.min(upper / (a + verify));
        let eta = solver.best_tau;
        let theta = eta * (a + verify) * (1.0 + TIE_TOLERANCE);
        if upper <= theta {
            continue;
        }
        // Tangent bound: for φ(L) ∈ [a, b], Σ E − η(φ + T_ver) ≤ max(at b, at a with the tangent of c_k at b).
        let w = b - a;
        let Some(pen) = solver.penalised_max(b, mu, w) else {
            continue;
        };
        let tie = TIE_TOLERANCE * eta * (a + verify);
        let gap_at_b = upper - eta * (b + verify);
        let gap_width = pen + mu * s.bandwidth_hz - eta * (a + verify);
        if gap_at_b.max(gap_width) <= tie {
            continue;
        }
        // Where the tangent part dominates, halving the interval is the usual next step. The knapsack at b is tried
        // first all the same, on a node limit of one node per device (at least 16): near the incumbent's latency
        // the room U(b) − θ is so small that it finishes in a few nodes and rules out, or shrinks, an interval
        // that bisection would have to halve many times over (issue 11: 30,047 intervals on a K = 8 round before,
        // under 1,000 after; tested below). If it does not finish, the interval is halved as before.
        let halve = (gap_at_b <= tie || gap_width - gap_at_b > gap_at_b) && w > 1e-12 * b;
        let node_limit = if halve {
            (k as u64).max(SPECULATIVE_NODE_FLOOR)
        } else {
            KNAPSACK_NODE_LIMIT
        };
        // The tangent bound also caps the goodput itself: Σ E − η'(φ + T_ver) ≤ 0 for every η' above both parts.
        let bound = bound.min((upper / (b + verify)).max((pen + mu * s.bandwidth_hz) / (a + verify)));
        let argmax = scratch.clone();
        let (found, complete) = solver.knapsack(b, mu, theta, &argmax, node_limit);
        if let Some((e, lens)) = &found
            && solver.might_beat(lens, *e)
        {
            solver.offer(lens);
        }
        let Some((v_b, lens)) = found.filter(|_| complete) else {
            if complete {
                continue;
            }
            // The knapsack at b is hard. Halves are easier (U falls with b, the threshold η(a + T_ver) rises
            // with a), so split while the interval is wide; otherwise leave it open with its bound.
            if w > 1e-12 * b && solver.stats.work <= solver.budget {
                let m = 0.5 * (a + b);
                heap.push(Interval {
                    key: upper - theta,
                    a,
                    b: m,
                    bound,
                });
                heap.push(Interval {
                    key: upper - theta,
                    a: m,
                    b,
                    bound: bound.min(upper / (m + verify)),
                });
            } else {
                open.push(Interval {
                    key: upper - theta,
                    a,
                    b,
                    bound,
                });
            }
            continue;
        };
        // Plans in [φ(L_b), b] carry at most V(b) tokens at latency ≥ φ(L_b); plans in [V(b)/η − T_ver, b] carry
        // at most V(b) at latency ≥ V(b)/η − T_ver. Either way none beats the incumbent.
        let next_b = (solver.phi(&lens) * (1.0 - TIE_TOLERANCE)).min(v_b / solver.best_tau - verify);
        if next_b > a {
            heap.push(Interval {
                key: upper - theta,
                a,
                b: next_b,
                bound,
            });
        }
    }
    // Intervals left open (budget spent) bound what the search did not rule out; those beyond the final cap hold
    // no better plan.
    let cap = max_tokens / solver.best_tau - verify;
    let open_bound = heap
        .iter()
        .chain(&open)
        .filter(|i| i.a < cap)
        .map(|i| i.bound)
        .fold(f64::NEG_INFINITY, f64::max);
    let lens = solver.best.clone();
    let (_, bandwidth) = lemma3_bandwidth(s, &lens);
    let mut plan = Plan::evaluated(s, lens, bandwidth)?;
    let value = plan.goodput_tokens_per_s;
    plan.optimality = if open_bound <= solver.best_tau * (1.0 + TIE_TOLERANCE) {
        Optimality::Optimal
    } else {
        let upper = open_bound.max(value);
        Optimality::Bounded {
            upper_bound_tokens_per_s: upper,
            relative_gap: (upper - value) / value,
        }
    };
    Ok((plan, solver.stats))
}

/// The integer optimum of (P2): L_k ∈ {L_min..L_max}, Lemma 3 bandwidth (exact up to a relative 1e−13), under the
/// default work budget; the plan's `optimality` says whether it is proven optimal or within a stated gap.
pub fn exact(s: &Scenario) -> Result<Plan, OptimizeError> {
    exact_with_stats(s).map(|(plan, _)| plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_a::bandwidth::lemma3_latency_s;
    use crate::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
    use crate::paper_a::heterogeneous::{Alg1Params, paper_alg1};
    use crate::paper_a::testing::random_scenario;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The best plan over L_k ∈ {0..L_max} by enumeration, with its goodput (Lemma 3 latency, eq. 27).
    fn exhaustive_with_idle(s: &Scenario) -> (f64, Vec<u32>) {
        let verify = s.verify_s();
        let mut lens = vec![0u32; s.len()];
        let mut best = (f64::NEG_INFINITY, lens.clone());
        loop {
            let tau = s.expected_tokens_sum(&lens) / (lemma3_latency_s(s, &lens) + verify);
            if tau > best.0 {
                best = (tau, lens.clone());
            }
            let Some(k) = lens.iter().position(|&l| l < s.max_draft_len) else {
                return best;
            };
            lens[k] += 1;
            lens[..k].fill(0);
        }
    }

    #[test]
    fn exact_with_idle_equals_exhaustive_search_over_lengths_from_zero() {
        // Seeded scenarios, half of them on a band so narrow (20–400 kHz) that uploading a distribution per token
        // costs more than it brings for some or all devices: the optimum over {0..L_max} is found (and proven),
        // it is never below the optimum over {1..L_max}, and it drafts nothing on some device in many cases.
        let mut rng = ChaCha8Rng::seed_from_u64(1717);
        let (mut idle_cases, mut all_idle) = (0, 0);
        for case in 0..160 {
            let k = 1 + rng.random_range(0..4usize);
            let l_max = 1 + rng.random_range(0..6u32);
            let mut s = random_scenario(&mut rng, k, l_max);
            if case % 2 == 0 {
                // a_k = Q_tok/r_k does not depend on B, so the scenario stays valid.
                s.bandwidth_hz = rng.random_range(2e4..4e5);
            }
            let with_idle = exact_with_idle(&s).unwrap();
            let (best, best_lens) = exhaustive_with_idle(&s);
            assert_eq!(with_idle.optimality, Optimality::Optimal, "case {case}");
            assert!(
                (with_idle.goodput_tokens_per_s - best).abs() <= 1e-9 * best,
                "case {case}: {} ({:?}) vs exhaustive {best} ({best_lens:?})",
                with_idle.goodput_tokens_per_s,
                with_idle.draft_lengths
            );
            let drafting = exact(&s).unwrap();
            assert!(with_idle.goodput_tokens_per_s >= drafting.goodput_tokens_per_s * (1.0 - 1e-12));
            // Idle devices get no band, the others share all of it.
            for (&l, &b) in with_idle.draft_lengths.iter().zip(&with_idle.uplink_share_hz) {
                assert_eq!(l == 0, b == 0.0, "case {case}: {:?}", with_idle.uplink_share_hz);
            }
            if with_idle.draft_lengths.contains(&0) {
                idle_cases += 1;
                assert!(with_idle.goodput_tokens_per_s > drafting.goodput_tokens_per_s);
            }
            if with_idle.draft_lengths.iter().all(|&l| l == 0) {
                all_idle += 1;
                assert_eq!(with_idle.round_latency_s.to_bits(), s.verify_s().to_bits());
            }
        }
        assert!(idle_cases >= 20 && all_idle >= 5, "{idle_cases} {all_idle}");
        // The extension needs the range to start at 1.
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut s = random_scenario(&mut rng, 2, 4);
        s.min_draft_len = 2;
        let e = exact_with_idle(&s).unwrap_err().to_string();
        assert!(e.starts_with("min_draft_len: "), "{e}");
    }

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
        let total: f64 = plan.uplink_share_hz.iter().sum();
        assert!((total - s.bandwidth_hz).abs() < 1e-9 * s.bandwidth_hz);
    }
    #[test]
    fn break_ratio_matches_a_full_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for case in 0..300 {
            let n = rng.random_range(1..600usize);
            // Few distinct efficiencies in some cases (ties), spread over many magnitudes in others.
            let distinct = rng.random_range(1..=n);
            let levels: Vec<f64> = (0..distinct)
                .map(|_| 10f64.powf(rng.random_range(-9.0..3.0)))
                .collect();
            let mut items: Vec<(f64, f64)> = (0..n)
                .map(|_| (levels[rng.random_range(0..distinct)], rng.random_range(0.1..10.0)))
                .collect();
            let total: f64 = items.iter().map(|i| i.1).sum();
            let room = rng.random_range(0.0..total * 0.999);
            let mut sorted = items.clone();
            sorted.sort_by(|x, y| y.0.total_cmp(&x.0));
            let mut used = 0.0;
            let want = sorted
                .iter()
                .find(|&&(_, dc)| {
                    used += dc;
                    used > room
                })
                .map(|i| i.0)
                .unwrap();
            assert_eq!(break_ratio(&mut items, room), want, "case {case}");
        }
    }

    #[test]
    fn a_round_that_took_thirty_thousand_intervals_is_certified_in_a_few_hundred() {
        // A K = 8 round of the networked server (paper B's drop and fading, 12,800 bits per token): bisection alone
        // needed 30,047 intervals near the optimum's latency; the knapsack tried before halving rules them out.
        let devices = [
            (0.5301309394562679, 0.015490443405528867, 1.5264248815407975),
            (0.7367866162165311, 0.016719370320258244, 1.9497573446475096),
            (0.9443573796167315, 0.016689649047580857, 0.940305786590562),
            (0.47469076139398686, 0.01712002033438904, 0.3170467434653739),
            (0.8814378417171347, 0.016957162190804564, 0.9237622664313729),
            (0.5400683689284228, 0.01644741263910789, 0.32461393188904897),
            (0.92321369314378, 0.016696640692697884, 4.033971814188111),
            (0.6084731526671163, 0.01581958773876428, 0.23067094643382904),
        ];
        let s = Scenario::new(&crate::paper_a::ScenarioSpec {
            bandwidth_hz: 1e7,
            distribution_bits: 12_800.0,
            verify_fixed_s: 0.0428,
            verify_per_device_s: 0.0076,
            max_draft_len: 8,
            min_draft_len: 1,
            devices: devices
                .iter()
                .map(
                    |&(acceptance, draft_token_s, spectral_efficiency)| crate::paper_a::DeviceSpec {
                        acceptance,
                        draft_token_s,
                        spectral_efficiency,
                    },
                )
                .collect(),
        })
        .unwrap();
        let (plan, stats) = exact_with_stats(&s).unwrap();
        assert_eq!(plan.optimality, Optimality::Optimal);
        // 8^8 plans are beyond brute force here; the seeded comparisons above check the optimum itself.
        assert!(stats.intervals < 1_000, "{stats:?}");
    }

    #[test]
    fn exact_equals_exhaustive_search_at_moderate_k() {
        // Eight devices: the knapsack search branches over several devices at once here.
        let mut rng = ChaCha8Rng::seed_from_u64(88);
        for case in 0..3 {
            let s = random_scenario(&mut rng, 8, 5);
            let ex = exact(&s).unwrap();
            let bf = brute_force(&s, BRUTE_FORCE_LIMIT).unwrap();
            let gap = (bf.goodput_tokens_per_s - ex.goodput_tokens_per_s) / bf.goodput_tokens_per_s;
            assert!(
                gap.abs() <= 1e-9,
                "case {case}: exact {:?} vs brute {:?}",
                ex.draft_lengths,
                bf.draft_lengths
            );
        }
    }
}
