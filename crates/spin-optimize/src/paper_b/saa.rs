//! Expected sum token goodput by sample-average approximation (paper B §V-B), fast enough to sit inside searches.
//!
//! One set of N_SAA outcome samples is drawn once and reused for every candidate draft-length vector (common random
//! numbers). Per sample and device we store the position F of the first rejection, geometric with
//! P(F = j) = α^{j−1}(1 − α), capped at γ_max + 1. For any γ_k the outcome is then a cheap function of F:
//! rejected iff F ≤ γ_k, tokens N_k = min(F, γ_k + 1) (accepted prefix plus the correction or bonus token).
//!
//! Round latency ⟨R⟩: T = max_k γ_k T_k^dft + T_ver(K) + T_comm(R), with T_comm the reactive optimum (or a
//! baseline policy) for the rejected set R of the sample. Two objectives ⟨C⟩:
//! - [`Objective::Rate`]: E\[ΣN\] / E\[T\], the long-run tokens per second (renewal–reward); the default.
//! - [`Objective::MeanRatio`]: E[ΣN / T], the mean of the per-round goodput.
//!
//! The reactive problem needs the rejected set sorted by UL delay. At a fixed share b, τ^ul falls with the gain,
//! so one order of all devices by gain (descending) sorts every rejected set: no sorting per sample.

use super::reactive::{Link, ModeScheme, split_by_bisection};
use super::scenario::Scenario;
use crate::OptimizeError;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// What the proactive search maximises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// E\[ΣN\] / E\[T\]: long-run throughput in tokens/s (default).
    #[default]
    Rate,
    /// E[ΣN / T]: mean per-round goodput.
    MeanRatio,
}

impl Objective {
    /// Parses `rate` or `mean-ratio`.
    pub fn parse(name: &str) -> Result<Self, OptimizeError> {
        match name {
            "rate" => Ok(Objective::Rate),
            "mean-ratio" => Ok(Objective::MeanRatio),
            other => Err(OptimizeError::Invalid {
                field: "objective".into(),
                reason: format!("unknown objective {other:?}; expected rate or mean-ratio"),
            }),
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Rate => "rate",
            Objective::MeanRatio => "mean-ratio",
        }
    }
}

/// Outcome samples: first-rejection positions and random-mode coins, stored device-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Samples {
    devices: usize,
    count: usize,
    /// F[k·N + s] ∈ {1, …, γ_max + 1}.
    first_rejection: Vec<u16>,
    /// Coin of the random-mode baseline: true = UL, same layout.
    ul_coin: Vec<bool>,
}

impl Samples {
    /// Draws `count` samples for devices with acceptance rates `alpha` (validated, in (0, 1)) from `seed`.
    ///
    /// Draw order is sample-major (for s, for k: one uniform for F, one for the coin), so a sample's outcome does
    /// not depend on how many samples follow it.
    pub fn draw(alpha: &[f64], count: usize, max_draft_len: u32, seed: u64) -> Self {
        let k_n = alpha.len();
        let cap = max_draft_len + 1;
        let log_alpha: Vec<f64> = alpha.iter().map(|a| a.ln()).collect();
        let mut first_rejection = vec![0u16; k_n * count];
        let mut ul_coin = vec![false; k_n * count];
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for s in 0..count {
            for k in 0..k_n {
                // Inverse transform: P(F > j) = α^j, so F = 1 + ⌊ln(1 − u) / ln α⌋ with 1 − u ∈ (0, 1].
                let u: f64 = rng.random();
                let j = ((1.0 - u).ln() / log_alpha[k]).floor();
                let f = if j.is_finite() && j < f64::from(cap) {
                    1 + j as u32
                } else {
                    cap
                };
                first_rejection[k * count + s] = f.min(cap) as u16;
                ul_coin[k * count + s] = rng.random_bool(0.5);
            }
        }
        Samples {
            devices: k_n,
            count,
            first_rejection,
            ul_coin,
        }
    }

    /// Number of samples N.
    pub fn count(&self) -> usize {
        self.count
    }

    /// F of device `k` in sample `s`.
    pub fn first_rejection(&self, k: usize, s: usize) -> u32 {
        u32::from(self.first_rejection[k * self.count + s])
    }
}

/// Statistics of a draft-length vector over the samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RoundStats {
    /// E\[ΣN\] / E\[T\] in tokens/s.
    pub rate_tokens_per_s: f64,
    /// E[ΣN / T] in tokens/s.
    pub mean_ratio_tokens_per_s: f64,
    /// E\[ΣN\] tokens per round.
    pub tokens_per_round: f64,
    /// E\[T\] in seconds.
    pub latency_s: f64,
    /// E\[T_comm\] in seconds.
    pub comm_delay_s: f64,
    /// Fraction of device-rounds with every drafted token accepted.
    pub frac_accepted: f64,
    /// Fraction of device-rounds corrected in UL mode.
    pub frac_ul: f64,
    /// Fraction of device-rounds corrected in DL mode.
    pub frac_dl: f64,
}

/// Per-sample totals of the current point of a search, for cheap evaluation of nearby points.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// The draft lengths.
    pub gamma: Vec<u32>,
    /// ΣN per sample.
    tokens: Vec<u32>,
    /// ΣN over all samples.
    tokens_total: u64,
    /// T_comm per sample.
    comm_s: Vec<f64>,
    /// The objective value at `gamma`.
    pub value: f64,
}

/// Evaluates draft-length vectors of one scenario on one set of samples under one mode policy.
#[derive(Debug, Clone)]
pub struct Evaluator {
    link: Link,
    policy: ModeScheme,
    objective: Objective,
    samples: Samples,
    max_draft_len: u32,
    verify_s: f64,
    alpha: Vec<f64>,
    draft_token_s: Vec<f64>,
    /// Devices by channel gain, strongest first (= UL delay ascending at any share b).
    order: Vec<usize>,
    /// g by position in `order`.
    gain: Vec<f64>,
    /// 1/g by position in `order`.
    inverse_gain: Vec<f64>,
    /// F by s·K + position in `order`: the samples again, sample-major, so that finding a sample's rejected set
    /// reads one contiguous row instead of K strided entries.
    by_sample: Vec<u16>,
    /// Σ_s min(F_ks, g + 1) by k·(γ_max + 1) + g: the tokens device k contributes over all samples at γ_k = g.
    token_sum: Vec<u64>,
    /// Per device (k·N + i): the sample indices in order of F, then of s.
    by_f: Vec<u32>,
    /// Per device (k·(γ_max + 3) + f): the first i in `by_f`'s row k with F ≥ f, for f ∈ 0..=γ_max + 2.
    f_start: Vec<u32>,
    /// τ^ul by (m − 1)·K + position when K ≤ [`UL_TABLE_MAX_DEVICES`] (at most 2 MiB), else empty and computed
    /// when asked: the same function of the same inputs either way, so the same bits.
    ul_table: Vec<f64>,
}

/// Up to this many devices an evaluator tabulates every UL delay τ^ul(B/m, g_k) (K² values, 2 MiB at 512): the
/// optimal split asks for O(log m) of them per sample and evaluation, and a table lookup is much cheaper than the
/// logarithm of the Shannon rate. Above it they are computed when asked, so memory stays linear in K.
pub const UL_TABLE_MAX_DEVICES: usize = 512;

impl Evaluator {
    /// Draws the scenario's `saa_samples` with its `seed` and prepares the tables.
    pub fn new(scenario: &Scenario, policy: ModeScheme, objective: Objective) -> Result<Self, OptimizeError> {
        scenario.check_planning_size()?;
        let alpha: Vec<f64> = scenario.devices.iter().map(|d| d.acceptance).collect();
        let samples = Samples::draw(
            &alpha,
            scenario.saa_samples as usize,
            scenario.max_draft_len,
            scenario.seed,
        );
        Self::with_samples(scenario, policy, objective, samples)
    }

    /// Uses the given samples (drawn for this scenario's devices and γ_max).
    pub fn with_samples(
        scenario: &Scenario,
        policy: ModeScheme,
        objective: Objective,
        samples: Samples,
    ) -> Result<Self, OptimizeError> {
        scenario.check_planning_size()?;
        if policy == ModeScheme::BruteForce {
            return Err(OptimizeError::Invalid {
                field: "scheme".into(),
                reason: "brute-force mode selection is a test reference, not an SAA policy (use optimal)"
                    .into(),
            });
        }
        let k_n = scenario.device_count();
        if samples.devices != k_n {
            return Err(OptimizeError::Invalid {
                field: "samples".into(),
                reason: format!("drawn for {} devices, scenario has {k_n}", samples.devices),
            });
        }
        let link = scenario.link();
        let gains: Vec<f64> = scenario.devices.iter().map(|d| d.channel_gain).collect();
        let mut order: Vec<usize> = (0..k_n).collect();
        order.sort_by(|&i, &j| gains[j].total_cmp(&gains[i]).then(i.cmp(&j)));
        let gain: Vec<f64> = order.iter().map(|&k| gains[k]).collect();
        let inverse_gain = gain.iter().map(|g| 1.0 / g).collect();
        let n = samples.count;
        let mut by_sample = vec![0u16; n * k_n];
        for (pos, &k) in order.iter().enumerate() {
            for s in 0..n {
                by_sample[s * k_n + pos] = samples.first_rejection[k * n + s];
            }
        }
        let cap = scenario.max_draft_len as usize + 1;
        let mut token_sum = vec![0u64; k_n * cap];
        let mut by_f = Vec::with_capacity(k_n * n);
        let mut f_start = vec![0u32; k_n * (cap + 2)];
        for k in 0..k_n {
            let f_of = |s: usize| samples.first_rejection[k * n + s] as usize;
            // Counting sort by F (stable in s).
            let mut count = vec![0u32; cap + 2];
            for s in 0..n {
                count[f_of(s)] += 1;
            }
            let starts = &mut f_start[k * (cap + 2)..(k + 1) * (cap + 2)];
            let mut acc = 0u32;
            for (f, c) in count.iter().enumerate() {
                starts[f] = acc;
                acc += c;
            }
            let mut next = starts.to_vec();
            let row = by_f.len();
            by_f.resize(row + n, 0);
            for s in 0..n {
                let f = f_of(s);
                by_f[row + next[f] as usize] = s as u32;
                next[f] += 1;
            }
            for g in 0..cap {
                token_sum[k * cap + g] = count
                    .iter()
                    .enumerate()
                    .map(|(f, &c)| u64::from(c) * f.min(g + 1) as u64)
                    .sum();
            }
        }
        let mut ul_table = Vec::new();
        if k_n <= UL_TABLE_MAX_DEVICES {
            ul_table.reserve_exact(k_n * k_n);
            for m in 1..=k_n {
                let b = link.share_hz(m);
                ul_table.extend(gain.iter().map(|&g| link.ul_delay_s(b, g)));
            }
        }
        Ok(Evaluator {
            link,
            policy,
            objective,
            samples,
            max_draft_len: scenario.max_draft_len,
            verify_s: scenario.verify_s(),
            alpha: scenario.devices.iter().map(|d| d.acceptance).collect(),
            draft_token_s: scenario.devices.iter().map(|d| d.draft_token_s).collect(),
            order,
            gain,
            inverse_gain,
            by_sample,
            token_sum,
            by_f,
            f_start,
            ul_table,
        })
    }

    /// Number of devices K.
    pub fn devices(&self) -> usize {
        self.draft_token_s.len()
    }

    /// γ_max.
    pub fn max_draft_len(&self) -> u32 {
        self.max_draft_len
    }

    /// α_k per device.
    pub fn alpha(&self) -> &[f64] {
        &self.alpha
    }

    /// T_k^dft per device in seconds.
    pub fn draft_token_s(&self) -> &[f64] {
        &self.draft_token_s
    }

    /// T_ver(K) in seconds.
    pub fn verify_s(&self) -> f64 {
        self.verify_s
    }

    /// The samples in use.
    pub fn samples(&self) -> &Samples {
        &self.samples
    }

    /// The objective this evaluator maximises.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// Drafting time of the slowest device, max_k γ_k T_k^dft.
    pub fn draft_s(&self, gamma: &[u32]) -> f64 {
        gamma
            .iter()
            .zip(&self.draft_token_s)
            .map(|(&g, t)| f64::from(g) * t)
            .fold(0.0, f64::max)
    }

    /// T_comm of sample `s` under `gamma`, and the number of rejected devices corrected in UL mode.
    fn comm(&self, s: usize, gamma: &[u32], rejected: &mut Vec<usize>) -> (f64, usize) {
        let n = self.samples.count;
        let k_n = self.order.len();
        rejected.clear();
        let row = &self.by_sample[s * k_n..(s + 1) * k_n];
        for (pos, (&k, &f)) in self.order.iter().zip(row).enumerate() {
            if u32::from(f) <= gamma[k] {
                rejected.push(pos);
            }
        }
        let m = rejected.len();
        if m == 0 {
            return (0.0, 0);
        }
        let b = self.link.share_hz(m);
        // τ^ul of the device at a position in `order` when m devices share the band (see `ul_table`).
        let k_n = self.order.len();
        let table = (!self.ul_table.is_empty()).then(|| &self.ul_table[(m - 1) * k_n..m * k_n]);
        let row = |p: usize| match table {
            Some(t) => t[p],
            None => self.link.ul_delay_s(b, self.gain[p]),
        };
        match self.policy {
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                // Suffix sums of 1/g over the rejected set in UL-delay order (on the stack for small sets).
                let mut suffix = [0.0f64; 64];
                let mut heap;
                let buf: &mut [f64] = if m < 64 {
                    &mut suffix[..=m]
                } else {
                    heap = vec![0.0; m + 1];
                    &mut heap
                };
                buf[m] = 0.0;
                for i in (0..m).rev() {
                    buf[i] = buf[i + 1] + self.inverse_gain[rejected[i]];
                }
                let (n_ul, delay) =
                    split_by_bisection(m, |i| row(rejected[i]), |n_dl| self.link.dl_delay_s(b, buf[n_dl]));
                (delay, n_ul)
            }
            ModeScheme::AllUl => (row(rejected[m - 1]), m),
            ModeScheme::AllDl => {
                let inv: f64 = rejected.iter().map(|&p| self.inverse_gain[p]).sum();
                (self.link.dl_delay_s(b, inv), 0)
            }
            ModeScheme::Random => {
                let mut ul_max = 0.0f64;
                let mut inv = 0.0;
                let mut n_ul = 0;
                for &p in rejected.iter() {
                    if self.samples.ul_coin[self.order[p] * n + s] {
                        ul_max = ul_max.max(row(p));
                        n_ul += 1;
                    } else {
                        inv += self.inverse_gain[p];
                    }
                }
                (ul_max.max(self.link.dl_delay_s(b, inv)), n_ul)
            }
        }
    }

    fn tokens(&self, k: usize, s: usize, gamma_k: u32) -> u32 {
        u32::from(self.samples.first_rejection[k * self.samples.count + s]).min(gamma_k + 1)
    }

    fn check(&self, gamma: &[u32]) {
        debug_assert_eq!(gamma.len(), self.devices());
        debug_assert!(gamma.iter().all(|&g| g <= self.max_draft_len));
    }

    /// Full evaluation of `gamma` (length K, entries ≤ γ_max), keeping per-sample totals for [`Self::try_moves`].
    pub fn state(&self, gamma: &[u32]) -> State {
        self.check(gamma);
        let n = self.samples.count;
        let mut tokens = vec![0u32; n];
        for (k, &g) in gamma.iter().enumerate() {
            for (s, t) in tokens.iter_mut().enumerate() {
                *t += self.tokens(k, s, g);
            }
        }
        let mut rejected = Vec::with_capacity(self.devices());
        let comm_s: Vec<f64> = (0..n).map(|s| self.comm(s, gamma, &mut rejected).0).collect();
        let value = self.reduce(
            self.draft_s(gamma),
            tokens.iter().copied(),
            comm_s.iter().copied(),
        );
        State {
            gamma: gamma.to_vec(),
            tokens_total: tokens.iter().map(|&t| u64::from(t)).sum(),
            tokens,
            comm_s,
            value,
        }
    }

    /// The objective at `gamma`.
    pub fn value(&self, gamma: &[u32]) -> f64 {
        self.state(gamma).value
    }

    fn reduce(
        &self,
        draft_s: f64,
        tokens: impl Iterator<Item = u32>,
        comm: impl Iterator<Item = f64>,
    ) -> f64 {
        let base = draft_s + self.verify_s;
        let n = self.samples.count as f64;
        match self.objective {
            Objective::Rate => {
                let (mut tok, mut lat) = (0u64, 0.0);
                for (t, c) in tokens.zip(comm) {
                    tok += u64::from(t);
                    lat += c;
                }
                (tok as f64 / n) / (base + lat / n)
            }
            Objective::MeanRatio => {
                let mut acc = 0.0;
                for (t, c) in tokens.zip(comm) {
                    acc += f64::from(t) / (base + c);
                }
                acc / n
            }
        }
    }

    /// The objective after changing the draft lengths of `state` by `changes` = [(device, new γ)], without a full
    /// evaluation: only samples where a changed device switches between rejected and accepted recompute T_comm.
    /// Bit-for-bit equal to [`Self::value`] at the changed point.
    pub fn try_moves(&self, state: &State, changes: &[(usize, u32)]) -> f64 {
        let mut gamma = state.gamma.clone();
        for &(k, g) in changes {
            gamma[k] = g;
        }
        self.check(&gamma);
        let distinct = changes.len() == 1 || (changes.len() == 2 && changes[0].0 != changes[1].0);
        if self.objective == Objective::Rate && distinct {
            return self.try_few_moves(state, &gamma, changes);
        }
        let n = self.samples.count;
        let mut rejected = Vec::with_capacity(self.devices());
        let tokens = (0..n).map(|s| {
            let mut t = state.tokens[s];
            for &(k, g) in changes {
                t = t + self.tokens(k, s, g) - self.tokens(k, s, state.gamma[k]);
            }
            t
        });
        let comm = (0..n).map(|s| {
            let flips = changes.iter().any(|&(k, g)| {
                let f = u32::from(self.samples.first_rejection[k * n + s]);
                (f <= g) != (f <= state.gamma[k])
            });
            if flips {
                self.comm(s, &gamma, &mut rejected).0
            } else {
                state.comm_s[s]
            }
        });
        self.reduce(self.draft_s(&gamma), tokens, comm)
    }

    /// [`Self::try_moves`] for one or two devices under the rate objective: the token total from per-device sums
    /// (integers, so exact in any order), T_comm recomputed only on the samples where a changed device switches
    /// between rejected and accepted (found from the samples sorted by F), and the latency summed over all samples
    /// in sample order as [`Self::reduce`] does, so the result has the same bits.
    fn try_few_moves(&self, state: &State, gamma: &[u32], changes: &[(usize, u32)]) -> f64 {
        let n = self.samples.count;
        let cap = self.max_draft_len as usize + 1;
        let mut tok = state.tokens_total;
        let mut flipped: Vec<u32> = Vec::new();
        for &(k, g) in changes {
            let old = state.gamma[k];
            tok = tok + self.token_sum[k * cap + g as usize] - self.token_sum[k * cap + old as usize];
            // The device switches on samples with min(g, old) < F ≤ max(g, old).
            let (lo, hi) = (g.min(old) as usize, g.max(old) as usize);
            let starts = &self.f_start[k * (cap + 2)..(k + 1) * (cap + 2)];
            let (from, to) = (starts[lo + 1] as usize, starts[hi + 1] as usize);
            flipped.extend_from_slice(&self.by_f[k * n + from..k * n + to]);
        }
        flipped.sort_unstable();
        flipped.dedup();
        let mut rejected = Vec::with_capacity(self.devices());
        let fresh: Vec<f64> = flipped
            .iter()
            .map(|&s| self.comm(s as usize, gamma, &mut rejected).0)
            .collect();
        let mut lat = 0.0;
        let mut next = 0;
        for (s, &old) in state.comm_s.iter().enumerate() {
            let c = if next < flipped.len() && flipped[next] as usize == s {
                next += 1;
                fresh[next - 1]
            } else {
                old
            };
            lat += c;
        }
        let nf = n as f64;
        (tok as f64 / nf) / (self.draft_s(gamma) + self.verify_s + lat / nf)
    }

    /// Both objectives and the mode statistics of `gamma`.
    pub fn stats(&self, gamma: &[u32]) -> RoundStats {
        self.check(gamma);
        let n = self.samples.count;
        let k_n = self.devices();
        let base = self.draft_s(gamma) + self.verify_s;
        let mut rejected = Vec::with_capacity(k_n);
        let (mut tok, mut lat, mut comm_sum, mut ratio) = (0u64, 0.0, 0.0, 0.0);
        let (mut n_rej, mut n_ul) = (0usize, 0usize);
        for s in 0..n {
            let t: u32 = (0..k_n).map(|k| self.tokens(k, s, gamma[k])).sum();
            let (c, ul) = self.comm(s, gamma, &mut rejected);
            n_rej += rejected.len();
            n_ul += ul;
            tok += u64::from(t);
            lat += base + c;
            comm_sum += c;
            ratio += f64::from(t) / (base + c);
        }
        let nf = n as f64;
        let dev_rounds = (n * k_n) as f64;
        RoundStats {
            rate_tokens_per_s: tok as f64 / lat,
            mean_ratio_tokens_per_s: ratio / nf,
            tokens_per_round: tok as f64 / nf,
            latency_s: lat / nf,
            comm_delay_s: comm_sum / nf,
            frac_accepted: 1.0 - n_rej as f64 / dev_rounds,
            frac_ul: n_ul as f64 / dev_rounds,
            frac_dl: (n_rej - n_ul) as f64 / dev_rounds,
        }
    }
}

/// The exact objective by enumerating every verification outcome (tiny instances only; the SAA reference).
///
/// Enumerates F_k ∈ {1, …, γ_k + 1} per device with P(F = j) = α^{j−1}(1 − α) for j ≤ γ_k and α^{γ_k} for
/// "all accepted"; refuses more than `limit` outcome combinations and the random-mode policy.
pub fn exact_value(
    scenario: &Scenario,
    gamma: &[u32],
    policy: ModeScheme,
    objective: Objective,
    limit: u128,
) -> Result<f64, OptimizeError> {
    if policy == ModeScheme::Random || gamma.len() != scenario.device_count() {
        return Err(OptimizeError::Invalid {
            field: "policy".into(),
            reason: "exact enumeration needs a deterministic policy and one γ per device".into(),
        });
    }
    let size = gamma
        .iter()
        .fold(1u128, |acc, &g| acc.saturating_mul(u128::from(g) + 1));
    if size > limit {
        return Err(OptimizeError::TooLarge {
            field: "draft_lengths".into(),
            size,
            limit,
        });
    }
    let link = scenario.link();
    let k_n = gamma.len();
    let draft = gamma
        .iter()
        .zip(&scenario.devices)
        .map(|(&g, d)| f64::from(g) * d.draft_token_s)
        .fold(0.0, f64::max);
    let base = draft + scenario.verify_s();
    let mut f = vec![1u32; k_n];
    let (mut e_tokens, mut e_latency, mut e_ratio) = (0.0, 0.0, 0.0);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    loop {
        let mut p = 1.0;
        let mut tokens = 0u32;
        let mut gains = Vec::new();
        for k in 0..k_n {
            let a = scenario.devices[k].acceptance;
            if f[k] <= gamma[k] {
                p *= a.powi(f[k] as i32 - 1) * (1.0 - a);
                gains.push(scenario.devices[k].channel_gain);
            } else {
                p *= a.powi(gamma[k] as i32);
            }
            tokens += f[k];
        }
        let comm = super::reactive::solve(&link, &gains, policy, &mut rng)?.comm_delay_s;
        e_tokens += p * f64::from(tokens);
        e_latency += p * (base + comm);
        e_ratio += p * f64::from(tokens) / (base + comm);
        // Odometer over F_k ∈ 1..=γ_k + 1.
        let mut k = 0;
        while k < k_n {
            if f[k] <= gamma[k] {
                f[k] += 1;
                break;
            }
            f[k] = 1;
            k += 1;
        }
        if k == k_n {
            break;
        }
    }
    Ok(match objective {
        Objective::Rate => e_tokens / e_latency,
        Objective::MeanRatio => e_ratio,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::paper_b::scenario::tests::example;
    use rand::{RngExt, SeedableRng};

    #[test]
    fn first_rejection_is_geometric() {
        let alpha = [0.3, 0.8, 0.95];
        let samples = Samples::draw(&alpha, 40_000, 20, 5);
        for (k, &a) in alpha.iter().enumerate() {
            let mean_tokens_at_3 = (0..samples.count())
                .map(|s| samples.first_rejection(k, s).min(4))
                .sum::<u32>() as f64
                / 40_000.0;
            let exact = spin_core::expected_accepted(a, 3);
            assert!(
                (mean_tokens_at_3 - exact).abs() < 0.02 * exact,
                "α={a}: {mean_tokens_at_3} vs {exact}"
            );
            let p1 = (0..samples.count())
                .filter(|&s| samples.first_rejection(k, s) == 1)
                .count() as f64
                / 40_000.0;
            assert!((p1 - (1.0 - a)).abs() < 0.01, "α={a}: P(F=1) {p1}");
        }
        assert_eq!(samples, Samples::draw(&alpha, 40_000, 20, 5));
    }

    #[test]
    fn saa_agrees_with_exact_enumeration_on_tiny_cases() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for case in 0..12 {
            let k = 1 + case % 3;
            let mut spec = example(k);
            spec.max_draft_len = 3;
            spec.saa_samples = 40_000;
            spec.seed = case as u64;
            // Weak channels make communication matter: scale gains around the UL/DL balance point.
            for d in &mut spec.devices {
                d.channel_gain *= 10f64.powf(rng.random_range(-1.0..1.0));
            }
            let sc = Scenario::new(spec).unwrap();
            let gamma: Vec<u32> = (0..k).map(|_| rng.random_range(0..=3)).collect();
            for policy in [ModeScheme::Optimal, ModeScheme::AllUl, ModeScheme::AllDl] {
                for objective in [Objective::Rate, Objective::MeanRatio] {
                    let exact = exact_value(&sc, &gamma, policy, objective, 1 << 20).unwrap();
                    let saa = Evaluator::new(&sc, policy, objective).unwrap().value(&gamma);
                    assert!(
                        (saa - exact).abs() < 0.01 * exact,
                        "case {case} γ={gamma:?} {policy:?} {objective:?}: SAA {saa} vs exact {exact}"
                    );
                }
            }
        }
    }

    #[test]
    fn exact_enumeration_matches_closed_form_without_communication() {
        // With γ = 0 nobody is rejected: exactly K tokens per T_ver.
        let sc = Scenario::new(example(3)).unwrap();
        let v = exact_value(&sc, &[0, 0, 0], ModeScheme::Optimal, Objective::Rate, 1000).unwrap();
        assert!((v - 3.0 / sc.verify_s()).abs() < 1e-12);
        let ev = Evaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        assert!((ev.value(&[0, 0, 0]) - 3.0 / sc.verify_s()).abs() < 1e-12);
        let err = exact_value(&sc, &[20, 20, 20], ModeScheme::Optimal, Objective::Rate, 1000).unwrap_err();
        assert!(err.to_string().starts_with("draft_lengths:"));
    }

    #[test]
    fn ul_delays_from_the_table_and_computed_agree_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut spec = example(12);
        for d in &mut spec.devices {
            d.channel_gain = 10f64.powf(rng.random_range(-13.0..-10.0));
        }
        let sc = Scenario::new(spec).unwrap();
        for policy in [ModeScheme::Optimal, ModeScheme::AllUl, ModeScheme::Random] {
            let tabled = Evaluator::new(&sc, policy, Objective::Rate).unwrap();
            assert!(!tabled.ul_table.is_empty());
            let mut computed = tabled.clone();
            computed.ul_table.clear();
            for _ in 0..20 {
                let gamma: Vec<u32> = (0..12).map(|_| rng.random_range(0..=sc.max_draft_len)).collect();
                assert_eq!(tabled.value(&gamma).to_bits(), computed.value(&gamma).to_bits());
                assert_eq!(tabled.stats(&gamma), computed.stats(&gamma));
            }
        }
    }

    #[test]
    fn incremental_moves_equal_full_evaluation() {
        let sc = Scenario::new(example(12)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for policy in [
            ModeScheme::Optimal,
            ModeScheme::AllUl,
            ModeScheme::AllDl,
            ModeScheme::Random,
        ] {
            for objective in [Objective::Rate, Objective::MeanRatio] {
                let ev = Evaluator::new(&sc, policy, objective).unwrap();
                let gamma: Vec<u32> = (0..12).map(|_| rng.random_range(0..=20)).collect();
                let state = ev.state(&gamma);
                // One or two changes take the sparse path under the rate objective, three the general one.
                for _ in 0..80 {
                    let changes: Vec<(usize, u32)> = (0..rng.random_range(1..=3))
                        .map(|_| (rng.random_range(0..12), rng.random_range(0..=20)))
                        .collect();
                    let mut moved = gamma.clone();
                    for &(k, g) in &changes {
                        moved[k] = g;
                    }
                    // Repeated devices: the last change wins in both paths only if unique; keep unique ones.
                    let mut seen = std::collections::HashSet::new();
                    if !changes.iter().all(|(k, _)| seen.insert(*k)) {
                        continue;
                    }
                    assert_eq!(
                        ev.try_moves(&state, &changes).to_bits(),
                        ev.value(&moved).to_bits()
                    );
                }
            }
        }
    }

    #[test]
    fn stats_are_consistent() {
        let sc = Scenario::new(example(8)).unwrap();
        let ev = Evaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        let gamma = vec![4; 8];
        let st = ev.stats(&gamma);
        assert!((st.rate_tokens_per_s - ev.value(&gamma)).abs() < 1e-9 * st.rate_tokens_per_s);
        assert!((st.frac_accepted + st.frac_ul + st.frac_dl - 1.0).abs() < 1e-12);
        assert!(
            (st.rate_tokens_per_s - st.tokens_per_round / st.latency_s).abs() < 1e-9 * st.rate_tokens_per_s
        );
        let mr = Evaluator::new(&sc, ModeScheme::Optimal, Objective::MeanRatio).unwrap();
        assert!((st.mean_ratio_tokens_per_s - mr.value(&gamma)).abs() < 1e-9 * st.mean_ratio_tokens_per_s);
        assert!(
            Objective::parse("speed")
                .unwrap_err()
                .to_string()
                .starts_with("objective:")
        );
    }
}
