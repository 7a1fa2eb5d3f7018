//! Expected sum token goodput by sample-average approximation (paper B §V-B), fast enough to sit inside searches.
//!
//! One set of N_SAA outcome samples ([`Samples`]) is drawn once and reused for every candidate draft-length vector
//! (common random numbers). Per sample and device it holds the position F of the first rejection, geometric with
//! P(F = j) = α^{j−1}(1 − α), capped at γ_max + 1. For any γ_k the outcome is then a cheap function of F:
//! rejected iff F ≤ γ_k, tokens N_k = min(F, γ_k + 1) (accepted prefix plus the correction or bonus token).
//!
//! Round latency ⟨R⟩: T = max_k γ_k T_k^dft + T_ver(K) + T_comm(R), with T_comm the reactive optimum (or a
//! baseline policy) for the rejected set R of the sample. Two objectives ⟨C⟩:
//! - [`Objective::Rate`]: E\[ΣN\] / E\[T\], the long-run tokens per second (renewal–reward); the default.
//! - [`Objective::MeanRatio`]: E[ΣN / T], the mean of the per-round goodput.
//!
//! The samples, rejected sets, T_comm and the incremental evaluation of moves are the crate's one engine, shared
//! with the unified model (every sample counted once, integer token totals, delays summed in sample order); this
//! module adds paper B's side of a round (the drafting time max_k γ_k T_k^dft) and the bounds of its searches.

use super::reactive::ModeScheme;
use super::scenario::Scenario;
use crate::OptimizeError;
use crate::engine::{CorrectionSetup, DeviceMove, Flips, GoodputEngine, Totals, Weights};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use crate::engine::{BOUND_MARGIN, Objective, Samples, UL_TABLE_MAX_DEVICES};

/// Statistics of a draft-length vector over the samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SaaStats {
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
pub struct SaaState {
    /// The draft lengths.
    pub draft_lengths: Vec<u32>,
    /// ΣN, T_comm and |R| per sample, ΣN over all samples and Σ_s T_comm summed in sample order.
    totals: Totals,
    /// max_k γ_k T_k^dft and a device attaining it.
    draft: (f64, usize),
    /// The objective value at `draft_lengths`.
    pub value: f64,
}

/// Reusable buffers of [`SaaEvaluator::try_moves_with`] and [`SaaEvaluator::apply_moves`], and what the last try
/// computed, so that applying the move just tried does not compute it again.
#[derive(Debug, Clone, Default)]
pub struct SaaScratch {
    /// The engine's buffers and what its last try computed.
    flips: Flips,
    /// The caps (γ by position in the engine's device order) of the point being evaluated.
    caps: Vec<u16>,
    /// The last try's move, for the engine.
    moves: Vec<DeviceMove>,
    /// The last try: its start point and changes, and whether `flips` holds it.
    from: Vec<u32>,
    changes: Vec<(usize, u32)>,
    valid: bool,
}

/// Evaluates draft-length vectors of one scenario on one set of samples under one mode policy.
#[derive(Debug, Clone)]
pub struct SaaEvaluator {
    engine: GoodputEngine,
    objective: Objective,
    max_draft_len: u32,
    verify_s: f64,
    acceptance: Vec<f64>,
    draft_token_s: Vec<f64>,
}

impl SaaEvaluator {
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

    /// What [`SaaEvaluator::new`] checks before it draws anything: the planning size of `scenario` and that
    /// `policy` is an SAA policy (not the brute-force reference).
    pub fn check_scenario(scenario: &Scenario, policy: ModeScheme) -> Result<(), OptimizeError> {
        scenario.check_planning_size()?;
        if policy == ModeScheme::BruteForce {
            return Err(OptimizeError::Invalid {
                field: "scheme".into(),
                reason: "brute-force mode selection is a test reference, not an SAA policy (use optimal)"
                    .into(),
            });
        }
        Ok(())
    }

    /// Uses the given samples (drawn for this scenario's devices and γ_max).
    pub fn with_samples(
        scenario: &Scenario,
        policy: ModeScheme,
        objective: Objective,
        samples: Samples,
    ) -> Result<Self, OptimizeError> {
        Self::check_scenario(scenario, policy)?;
        let k_n = scenario.device_count();
        if samples.devices() != k_n {
            return Err(OptimizeError::Invalid {
                field: "samples".into(),
                reason: format!("drawn for {} devices, scenario has {k_n}", samples.devices()),
            });
        }
        let gains: Vec<f64> = scenario.devices.iter().map(|d| d.channel_gain).collect();
        let correction = CorrectionSetup {
            link: scenario.link(),
            modes: policy,
            ul_gain: &gains,
            dl_gain: &gains,
        };
        Ok(SaaEvaluator {
            engine: GoodputEngine::new(samples, Weights::Count, correction, scenario.max_draft_len, true),
            objective,
            max_draft_len: scenario.max_draft_len,
            verify_s: scenario.verify_s(),
            acceptance: scenario.devices.iter().map(|d| d.acceptance).collect(),
            draft_token_s: scenario.devices.iter().map(|d| d.draft_token_s).collect(),
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
    pub fn acceptance(&self) -> &[f64] {
        &self.acceptance
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
        self.engine.samples()
    }

    /// The objective this evaluator maximises.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// Drafting time of the slowest device, max_k γ_k T_k^dft.
    pub fn draft_s(&self, draft_lengths: &[u32]) -> f64 {
        draft_lengths
            .iter()
            .zip(&self.draft_token_s)
            .map(|(&g, t)| f64::from(g) * t)
            .fold(0.0, f64::max)
    }

    /// [`Self::draft_s`] and the first device attaining it (0 when every γ is 0).
    fn draft_argmax(&self, draft_lengths: &[u32]) -> (f64, usize) {
        draft_lengths
            .iter()
            .zip(&self.draft_token_s)
            .enumerate()
            .fold((0.0, 0), |(d, at), (k, (&g, t))| {
                let x = f64::from(g) * t;
                if x > d { (x, k) } else { (d, at) }
            })
    }

    /// γ by position in the engine's device order, into `caps`: a device is rejected in a sample iff F ≤ γ.
    fn caps(&self, draft_lengths: &[u32], caps: &mut Vec<u16>) {
        // γ ≤ γ_max ≤ MAX_DRAFT_LEN_LIMIT fits 16 bits, as F does.
        self.engine.caps(|k| draft_lengths[k] as u16, caps);
    }

    fn check(&self, draft_lengths: &[u32]) {
        debug_assert_eq!(draft_lengths.len(), self.devices());
        debug_assert!(draft_lengths.iter().all(|&g| g <= self.max_draft_len));
    }

    /// Full evaluation of `draft_lengths` (length K, entries ≤ γ_max), keeping per-sample totals for [`Self::try_moves`].
    pub fn state(&self, draft_lengths: &[u32]) -> SaaState {
        self.state_with(draft_lengths, &mut SaaScratch::default())
    }

    /// [`Self::state`] with reusable buffers.
    pub fn state_with(&self, draft_lengths: &[u32], scratch: &mut SaaScratch) -> SaaState {
        self.check(draft_lengths);
        self.caps(draft_lengths, &mut scratch.caps);
        let base = self.draft_s(draft_lengths) + self.verify_s;
        let (totals, value) = self
            .engine
            .evaluate(draft_lengths, &scratch.caps, base, self.objective, false);
        SaaState {
            draft_lengths: draft_lengths.to_vec(),
            totals,
            draft: self.draft_argmax(draft_lengths),
            value,
        }
    }

    /// The objective at `draft_lengths`.
    pub fn value(&self, draft_lengths: &[u32]) -> f64 {
        self.state(draft_lengths).value
    }

    /// The objective after changing the draft lengths of `state` by `changes` = [(device, new γ)] (distinct
    /// devices), without a full evaluation: only samples where a changed device switches between rejected and
    /// accepted recompute T_comm. Bit-for-bit equal to [`Self::value`] at the changed point.
    pub fn try_moves(&self, state: &SaaState, changes: &[(usize, u32)]) -> f64 {
        self.try_moves_with(state, changes, &mut SaaScratch::default())
    }

    /// [`Self::try_moves`] with reusable buffers; remembers what it computed in `scratch` for
    /// [`Self::apply_moves`] of the same move from the same state.
    ///
    /// The token total comes from per-device sums (integers, so exact in any order), T_comm is recomputed only on
    /// the flipped samples, and the latency is summed over all samples in sample order as the full evaluation does,
    /// so the result has the same bits as a full evaluation.
    pub fn try_moves_with(
        &self,
        state: &SaaState,
        changes: &[(usize, u32)],
        scratch: &mut SaaScratch,
    ) -> f64 {
        let mut draft_lengths = std::mem::take(&mut scratch.from);
        draft_lengths.clear();
        draft_lengths.extend_from_slice(&state.draft_lengths);
        scratch.moves.clear();
        for &(k, g) in changes {
            let old = state.draft_lengths[k];
            draft_lengths[k] = g;
            scratch.moves.push(DeviceMove {
                device: k,
                len: (old, g),
                cap: (old as u16, g as u16),
            });
        }
        self.check(&draft_lengths);
        self.caps(&draft_lengths, &mut scratch.caps);
        let base = self.draft_s(&draft_lengths) + self.verify_s;
        let value = self.engine.try_moves(
            &state.totals,
            &scratch.moves,
            &scratch.caps,
            base,
            self.objective,
            &mut scratch.flips,
        );
        scratch.from = draft_lengths;
        for &(k, _) in changes {
            scratch.from[k] = state.draft_lengths[k];
        }
        scratch.changes.clear();
        scratch.changes.extend_from_slice(changes);
        scratch.valid = true;
        value
    }

    /// Moves `state` by `changes` in place: the state [`Self::state`] gives at the new point, bit for bit, with
    /// only the flipped samples recomputed (none when the last [`Self::try_moves_with`] on `scratch` tried this
    /// move from this state).
    pub fn apply_moves(&self, state: &mut SaaState, changes: &[(usize, u32)], scratch: &mut SaaScratch) {
        let reuse = scratch.valid && scratch.changes == changes && scratch.from == state.draft_lengths;
        if !reuse {
            self.try_moves_with(state, changes, scratch);
        }
        self.engine.apply(
            &mut state.totals,
            &scratch.moves,
            &scratch.caps,
            &mut scratch.flips,
        );
        for &(k, g) in changes {
            state.draft_lengths[k] = g;
        }
        state.draft = self.draft_argmax(&state.draft_lengths);
        state.value = scratch.flips.value;
        scratch.valid = false;
    }

    /// An upper bound on the rate objective after `changes` (distinct devices) from `state`, at O(1) cost per
    /// device that gains rejections and O(flipped samples) per device that loses them; `None` under the
    /// mean-ratio objective.
    ///
    /// Tokens and drafting time are exact. T_comm never falls when devices join a sample's rejected set (fewer
    /// hertz each, one more device to serve: every policy's delay rises), so only a device that leaves lowers it:
    /// with |R| = m, T_comm(R ∖ {k}) ≥ T_comm(R)·(m − 1)/m under the optimal rule and all-UL whenever k's own UL
    /// delay at B/m is below T_comm(R) (k in UL beside R ∖ {k}'s assignment is feasible for R, and every delay of
    /// the form D/(b log₂(1 + c/b)) grows by at most m/(m − 1) when the share falls from B/(m − 1) to B/m, as
    /// b log(1 + c/b) is concave and 0 at b = 0); otherwise it is bounded by 0. With two or more leaving devices
    /// the flipped samples of all of them are bounded by 0.
    pub fn upper_bound(&self, state: &SaaState, changes: &[(usize, u32)]) -> Option<f64> {
        if self.objective != Objective::Rate {
            return None;
        }
        let alone = changes
            .iter()
            .filter(|&&(k, g)| g < state.draft_lengths[k])
            .count()
            == 1;
        let drop = changes
            .iter()
            .filter(|&&(k, g)| g < state.draft_lengths[k])
            .map(|&(k, g)| self.leave_drop(state, k, g, alone))
            .sum();
        Some(self.bound_after_drop(state, changes, drop))
    }

    /// How much Σ_s T_comm can fall at most on the samples where device `k` leaves the rejected set when its γ
    /// falls to `g`: Σ (T_comm − the floor of [`Self::upper_bound`]), with the (m − 1)/m floor only when `alone`
    /// (the only device that leaves).
    pub fn leave_drop(&self, state: &SaaState, k: usize, g: u32, alone: bool) -> f64 {
        let old = state.draft_lengths[k];
        let scaled = alone && matches!(self.engine.modes(), ModeScheme::Optimal | ModeScheme::AllUl);
        let pos = self.engine.position(k);
        let mut drop = 0.0;
        for &s in self.engine.flipping(k, g as u16, old as u16) {
            let (c, m) = (
                state.totals.comm[s as usize],
                state.totals.rejected[s as usize] as usize,
            );
            let keep = if scaled && m > 1 && self.engine.ul_below(m, pos, c) {
                c * (m - 1) as f64 / m as f64
            } else {
                0.0
            };
            drop += c - keep;
        }
        drop
    }

    /// The bound of [`Self::upper_bound`] (rate objective) when Σ_s T_comm falls by at most `drop` (from
    /// [`Self::leave_drop`] of the leaving devices).
    pub fn bound_after_drop(&self, state: &SaaState, changes: &[(usize, u32)], drop: f64) -> f64 {
        let mut tok = state.totals.tokens_total;
        for &(k, g) in changes {
            let old = state.draft_lengths[k];
            tok += self.engine.token_entry(k, g) - self.engine.token_entry(k, old);
        }
        // A lower bound on the drafting time at the new point (so an upper bound on the value): the changed devices
        // at their new lengths, and the state's slowest device unless it changed.
        let mut draft_s = 0.0f64;
        for &(k, g) in changes {
            draft_s = draft_s.max(f64::from(g) * self.draft_token_s[k]);
        }
        if !changes.iter().any(|c| c.0 == state.draft.1) {
            draft_s = draft_s.max(state.draft.0);
        }
        // The floor is a difference of sums: take off far more than its rounding before trusting it.
        let comm_total = state.totals.comm_total;
        let floor = (comm_total - drop - 1e-12 * comm_total).max(0.0);
        let nf = self.engine.count() as f64;
        (tok / nf) / (draft_s + self.verify_s + floor / nf)
    }

    /// Both objectives and the mode statistics of `draft_lengths`.
    pub fn stats(&self, draft_lengths: &[u32]) -> SaaStats {
        self.check(draft_lengths);
        let n = self.engine.count();
        let k_n = self.devices();
        let base = self.draft_s(draft_lengths) + self.verify_s;
        let mut sc = SaaScratch::default();
        self.caps(draft_lengths, &mut sc.caps);
        let mut buf = Default::default();
        let (mut tok, mut lat, mut comm_sum, mut ratio) = (0u64, 0.0, 0.0, 0.0);
        let (mut n_rej, mut n_ul) = (0usize, 0usize);
        for s in 0..n {
            let t: u32 = (0..k_n).map(|k| self.engine.tokens(k, s, draft_lengths[k])).sum();
            let (c, ul) = self.engine.comm(s, &sc.caps, &mut buf);
            n_rej += buf.set.len();
            n_ul += ul;
            tok += u64::from(t);
            lat += base + c;
            comm_sum += c;
            ratio += f64::from(t) / (base + c);
        }
        let nf = n as f64;
        let dev_rounds = (n * k_n) as f64;
        SaaStats {
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
    draft_lengths: &[u32],
    policy: ModeScheme,
    objective: Objective,
    limit: u128,
) -> Result<f64, OptimizeError> {
    if policy == ModeScheme::Random || draft_lengths.len() != scenario.device_count() {
        return Err(OptimizeError::Invalid {
            field: "policy".into(),
            reason: "exact enumeration needs a deterministic policy and one γ per device".into(),
        });
    }
    let size = draft_lengths
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
    let k_n = draft_lengths.len();
    let draft = draft_lengths
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
            if f[k] <= draft_lengths[k] {
                p *= a.powi(f[k] as i32 - 1) * (1.0 - a);
                gains.push(scenario.devices[k].channel_gain);
            } else {
                p *= a.powi(draft_lengths[k] as i32);
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
            if f[k] <= draft_lengths[k] {
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

    /// Every mode policy an SAA evaluator accepts.
    const SAA_POLICIES: [ModeScheme; 4] = [
        ModeScheme::Optimal,
        ModeScheme::AllUl,
        ModeScheme::AllDl,
        ModeScheme::Random,
    ];

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
            let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(0..=3)).collect();
            for policy in [ModeScheme::Optimal, ModeScheme::AllUl, ModeScheme::AllDl] {
                for objective in [Objective::Rate, Objective::MeanRatio] {
                    let exact = exact_value(&sc, &draft_lengths, policy, objective, 1 << 20).unwrap();
                    let saa = SaaEvaluator::new(&sc, policy, objective)
                        .unwrap()
                        .value(&draft_lengths);
                    assert!(
                        (saa - exact).abs() < 0.01 * exact,
                        "case {case} γ={draft_lengths:?} {policy:?} {objective:?}: SAA {saa} vs exact {exact}"
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
        let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        assert!((ev.value(&[0, 0, 0]) - 3.0 / sc.verify_s()).abs() < 1e-12);
        let err = exact_value(&sc, &[20, 20, 20], ModeScheme::Optimal, Objective::Rate, 1000).unwrap_err();
        assert!(err.to_string().starts_with("draft_lengths:"));
    }

    #[test]
    fn incremental_moves_equal_full_evaluation() {
        let sc = Scenario::new(example(12)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for policy in SAA_POLICIES {
            for objective in [Objective::Rate, Objective::MeanRatio] {
                let ev = SaaEvaluator::new(&sc, policy, objective).unwrap();
                let draft_lengths: Vec<u32> = (0..12).map(|_| rng.random_range(0..=20)).collect();
                let state = ev.state(&draft_lengths);
                // One or two changes take the sparse path under the rate objective, three the general one.
                for _ in 0..80 {
                    let changes: Vec<(usize, u32)> = (0..rng.random_range(1..=3))
                        .map(|_| (rng.random_range(0..12), rng.random_range(0..=20)))
                        .collect();
                    let mut moved = draft_lengths.clone();
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
                        ev.value(&moved).to_bits(),
                        "{policy:?} {objective:?} {changes:?} {draft_lengths:?}"
                    );
                }
            }
        }
    }

    /// A scenario with gains and powers spread over many decades, so that the UL and DL SNRs of the reactive
    /// split come close (the shortcut's fallback) and far apart.
    fn spread(rng: &mut ChaCha8Rng, k: usize) -> Scenario {
        let mut spec = example(k);
        spec.max_draft_len = rng.random_range(1..=8);
        spec.saa_samples = rng.random_range(20..=120);
        spec.seed = rng.random();
        spec.dl_power_w = 10f64.powf(rng.random_range(-3.0..1.0));
        spec.ul_power_w = 10f64.powf(rng.random_range(-3.0..0.0));
        for d in &mut spec.devices {
            d.acceptance = rng.random_range(0.2..0.97);
            d.channel_gain = 10f64.powf(rng.random_range(-15.0..-9.0));
        }
        Scenario::new(spec).unwrap()
    }

    #[test]
    fn applied_moves_equal_full_evaluation_and_bounds_hold() {
        let mut rng = ChaCha8Rng::seed_from_u64(32);
        for case in 0..12 {
            let k = [3, 9, 30][case % 3];
            let sc = spread(&mut rng, k);
            let g_max = sc.max_draft_len;
            for policy in SAA_POLICIES {
                for objective in [Objective::Rate, Objective::MeanRatio] {
                    let ev = SaaEvaluator::new(&sc, policy, objective).unwrap();
                    let draft_lengths: Vec<u32> = (0..k).map(|_| rng.random_range(0..=g_max)).collect();
                    let mut state = ev.state(&draft_lengths);
                    let mut scratch = SaaScratch::default();
                    for step in 0..30 {
                        // One, two (distinct) or all devices, by ±1 or a jump.
                        let mut changes: Vec<(usize, u32)> = Vec::new();
                        let count = [1, 2, k][step % 3].min(k);
                        for d in rand::seq::index::sample(&mut rng, k, count) {
                            changes.push((d, rng.random_range(0..=g_max)));
                        }
                        let mut moved = state.draft_lengths.clone();
                        for &(d, g) in &changes {
                            moved[d] = g;
                        }
                        let full = ev.state(&moved);
                        let v = ev.try_moves_with(&state, &changes, &mut scratch);
                        assert_eq!(
                            v.to_bits(),
                            full.value.to_bits(),
                            "case {case} {policy:?} {objective:?}"
                        );
                        if let Some(bound) = ev.upper_bound(&state, &changes) {
                            assert!(bound >= v * (1.0 - 1e-12), "bound {bound} below {v} ({policy:?})");
                        } else {
                            assert_eq!(objective, Objective::MeanRatio);
                        }
                        // Every other step applies without the try just made (a stale or fresh scratch).
                        if step % 2 == 1 {
                            ev.try_moves_with(&state, &[(0, state.draft_lengths[0])], &mut scratch);
                        }
                        ev.apply_moves(&mut state, &changes, &mut scratch);
                        assert_eq!(state, full, "case {case} step {step} {policy:?} {objective:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn stats_are_consistent() {
        let sc = Scenario::new(example(8)).unwrap();
        let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
        let draft_lengths = vec![4; 8];
        let st = ev.stats(&draft_lengths);
        assert!((st.rate_tokens_per_s - ev.value(&draft_lengths)).abs() < 1e-9 * st.rate_tokens_per_s);
        assert!((st.frac_accepted + st.frac_ul + st.frac_dl - 1.0).abs() < 1e-12);
        assert!(
            (st.rate_tokens_per_s - st.tokens_per_round / st.latency_s).abs() < 1e-9 * st.rate_tokens_per_s
        );
        let mr = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::MeanRatio).unwrap();
        assert!(
            (st.mean_ratio_tokens_per_s - mr.value(&draft_lengths)).abs() < 1e-9 * st.mean_ratio_tokens_per_s
        );
        assert!(
            Objective::parse("speed")
                .unwrap_err()
                .to_string()
                .starts_with("objective:")
        );
    }
}
