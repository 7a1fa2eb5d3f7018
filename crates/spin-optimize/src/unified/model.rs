//! The unified model's expected goodput: OFDMA draft upload with a per-device payload, batched verification, and
//! one distribution exchange per rejected pair-sending device (UL or DL, Lemma-1 DL powers, equal band split).
//!
//! A round with draft lengths L, payload choice z (z_k = distributions per token) and draft-uplink shares B_k lasts
//! T = max_k L_k (T_k^S + u_k/(B_k r_k)) + T_ver(K) + T_comm(R), with u_k the per-token bits of device k's payload
//! and R the rejected devices that sent pairs. The expectation over the rejection outcomes is an exact enumeration
//! (weights = probabilities) or a sample-average approximation with common random numbers (paper B's samples, so the
//! paper-B special case gives paper B's numbers); both are a list of weighted outcomes in the crate's one engine,
//! which also keeps the rejected sets, T_comm and the incremental evaluation of moves (shared with paper B's SAA).
//! This module adds the uplink (Lemma 3's latency and shares), the closed form of rounds no rejection changes, the
//! bounds of the searches, and the scoring of plans.

use crate::OptimizeError;
use crate::engine::{
    BOUND_MARGIN, CorrectionSetup, DeviceMove, Flips, GoodputEngine, Samples, SetBuf, Totals, Weights,
};
use crate::paper_a::bandwidth::equalised_root;
use crate::paper_b::{ModeScheme, Objective};
use crate::round::plan::{CorrectionPolicy, PlanEstimate, RoundPlan};
use crate::round::scheme::Scheme;
use crate::round::spec::{PayloadPolicy, Round};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_core::expected_accepted;

/// How the expectation over rejection outcomes is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expectation {
    /// Sample average over the round's `saa_samples` outcome samples (seed `seed`), the same samples paper B
    /// draws for the same acceptance rates.
    Saa,
    /// Exact enumeration of every outcome F ∈ {1..L_max + 1}^K (refused above `limit` outcomes).
    Exact {
        /// The most outcomes enumerated.
        limit: u128,
    },
    /// Exact when (L_max + 1)^K ≤ `limit`, otherwise SAA.
    Auto {
        /// The most outcomes enumerated.
        limit: u128,
    },
}

fn outcome_space(k: usize, max_draft_len: u32) -> u128 {
    (0..k).fold(1u128, |acc, _| acc.saturating_mul(u128::from(max_draft_len) + 1))
}

/// Paper B's samples for rates `alpha` (`count` of them, L_max, `seed`), or `drawn` when the caller has drawn
/// exactly those already (the same call of [`Samples::draw`]; checked for its shape, else drawn again), each
/// weighing 1/N. The random-mode coins come from their own stream, and only when `coins` (nothing else reads
/// them).
fn sampled(
    alpha: &[f64],
    count: usize,
    max_draft_len: u32,
    seed: u64,
    coins: bool,
    drawn: Option<&Samples>,
) -> (Samples, Weights) {
    let k_n = alpha.len();
    let first = match drawn {
        Some(samples) if samples.count() == count && samples.devices() == k_n => {
            samples.first_rejections().to_vec()
        }
        _ => Samples::draw(alpha, count, max_draft_len, seed)
            .first_rejections()
            .to_vec(),
    };
    let coin = if coins {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636f_696e_7321);
        (0..k_n * count).map(|_| rng.random_bool(0.5)).collect()
    } else {
        vec![]
    };
    (
        Samples::from_parts(k_n, count, first, coin),
        Weights::Probability(vec![1.0 / count as f64; count]),
    )
}

/// Every outcome F ∈ {1..L_max + 1}^K with its probability (refused above `limit` outcomes).
fn enumerated(alpha: &[f64], max_draft_len: u32, limit: u128) -> Result<(Samples, Weights), OptimizeError> {
    let k_n = alpha.len();
    let size = outcome_space(k_n, max_draft_len);
    if size > limit {
        return Err(OptimizeError::TooLarge {
            field: "devices".into(),
            size,
            limit,
        });
    }
    let count = size as usize;
    let cap = max_draft_len + 1;
    let mut first = vec![0u16; k_n * count];
    let mut weight = vec![0.0; count];
    let mut f = vec![1u32; k_n];
    for (s, w) in weight.iter_mut().enumerate() {
        let mut p = 1.0;
        for k in 0..k_n {
            first[k * count + s] = f[k] as u16;
            let a = alpha[k];
            p *= if f[k] < cap {
                a.powi(f[k] as i32 - 1) * (1.0 - a)
            } else {
                a.powi(max_draft_len as i32)
            };
        }
        *w = p;
        for fk in f.iter_mut() {
            if *fk < cap {
                *fk += 1;
                break;
            }
            *fk = 1;
        }
    }
    Ok((
        Samples::from_parts(k_n, count, first, vec![]),
        Weights::Probability(weight),
    ))
}

/// A point of a search with its per-outcome totals, for cheap evaluation of nearby points.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// L_k per device.
    pub draft_lengths: Vec<u32>,
    /// z_k per device (true = distributions per token).
    pub sends_distributions: Vec<bool>,
    /// The Lemma-3 uplink latency φ(L, z).
    pub uplink_s: f64,
    /// Σ w_k/(φ − β_k) and Σ w_k/(φ − β_k)² over the devices with bits: the Lemma-3 function and its slope at
    /// φ, for the lower bound on φ after a move ([`Evaluator::uplink_floor`]).
    uplink_load: (f64, f64),
    /// ΣN, T_comm and |R| per outcome (and each outcome's rejected set when N·K ≤ [`SET_LIMIT`]), E\[ΣN\] and
    /// E\[T_comm\]; no per-outcome entries for a point in closed form.
    totals: Totals,
    /// The objective value.
    pub value: f64,
}

/// The most N·K for which a state keeps every outcome's rejected set (12 bytes each, 24 MiB at the limit), so that a
/// one-device move rebuilds a flipped outcome's set by one edit instead of a scan of all K devices.
const SET_LIMIT: usize = 1 << 21;

/// One change of a move: device, new length, new payload choice.
pub type Change = (usize, u32, bool);

/// Evaluates plans of one round on one set of outcomes under one correction policy.
#[derive(Debug, Clone)]
pub struct Evaluator {
    k_n: usize,
    acceptance: Vec<f64>,
    draft_token_s: Vec<f64>,
    spectral_efficiency: Vec<f64>,
    distribution_bits: f64,
    pair_bits: f64,
    bandwidth_hz: f64,
    /// T_fix + K·T_lin.
    verify_s: f64,
    /// T_tok: T_ver at lengths L is `verify_s` + T_tok·Σ L_k ([`Evaluator::verify_at`]).
    verify_per_draft_token_s: f64,
    min_draft_len: u32,
    max_draft_len: u32,
    payload: PayloadPolicy,
    policy: CorrectionPolicy,
    /// The weighted outcomes, rejected sets and T_comm (with the tables of moves and bounds, except in an
    /// evaluator that only scores plans: [`Evaluator::for_scoring`]).
    engine: GoodputEngine,
    /// Whether the outcomes are enumerated exactly.
    exact: bool,
    /// Tokens in closed form (Σ E[N_k]) when no device can be rejected and the round sends only distributions.
    closed_tokens: bool,
}

impl Evaluator {
    /// Prepares the outcomes and tables for `round`.
    pub fn new(
        round: &Round,
        expectation: Expectation,
        policy: CorrectionPolicy,
    ) -> Result<Evaluator, OptimizeError> {
        Evaluator::build(round, expectation, policy, true, None)
    }

    /// The evaluator [`score`] uses: the same outcomes (and the same checks and errors) as [`Evaluator::new`],
    /// without the tables that only moves and bounds read (the UL delays, K·(L_max + 1) token sums, the outcome
    /// buckets, the outcome-major copy of F). Scoring a plan reads one entry of each table, so it computes that
    /// entry instead, by the same expression in the same order: the same bits. Private, so that nothing asks it
    /// for a move.
    fn for_scoring(
        round: &Round,
        expectation: Expectation,
        policy: CorrectionPolicy,
        drawn: Option<&Samples>,
    ) -> Result<Evaluator, OptimizeError> {
        Evaluator::build(round, expectation, policy, false, drawn)
    }

    /// `drawn`: the round's samples if the caller holds them ([`sampled`]).
    fn build(
        round: &Round,
        expectation: Expectation,
        policy: CorrectionPolicy,
        tables: bool,
        drawn: Option<&Samples>,
    ) -> Result<Evaluator, OptimizeError> {
        let k_n = round.len();
        // Paper B's size limit, before anything K² is allocated: the UL-delay table holds K² entries and a move
        // scores up to K·(L_max + 1) outcome tables for each of N_SAA samples.
        crate::paper_b::scenario::check::planning_work(
            "unified planning",
            k_n,
            round.max_draft_len,
            round.saa_samples,
            "",
        )?;
        let alpha: Vec<f64> = round.devices.iter().map(|d| d.acceptance).collect();
        let max_draft_len = round.max_draft_len;
        // Random modes draw their coins with the samples, so `auto` samples for them.
        let expectation = match expectation {
            Expectation::Auto { .. } if policy.modes == ModeScheme::Random => Expectation::Saa,
            e => e,
        };
        let coins = policy.modes == ModeScheme::Random;
        let count = round.saa_samples as usize;
        let ((samples, weights), exact) = match expectation {
            Expectation::Saa => (
                sampled(&alpha, count, max_draft_len, round.seed, coins, drawn),
                false,
            ),
            Expectation::Exact { limit } => (enumerated(&alpha, max_draft_len, limit)?, true),
            Expectation::Auto { limit } => {
                if outcome_space(k_n, max_draft_len) <= limit {
                    (enumerated(&alpha, max_draft_len, limit)?, true)
                } else {
                    (
                        sampled(&alpha, count, max_draft_len, round.seed, coins, drawn),
                        false,
                    )
                }
            }
        };
        if exact && policy.modes == ModeScheme::Random {
            return Err(OptimizeError::Invalid {
                field: "correction".into(),
                reason: "random modes need sampled outcomes (their coins are samples), not exact enumeration"
                    .into(),
            });
        }
        if policy.modes == ModeScheme::BruteForce {
            return Err(OptimizeError::Invalid {
                field: "correction".into(),
                reason: "brute-force mode selection is a test reference; optimal is exact (Proposition 1)"
                    .into(),
            });
        }
        let ul_gain: Vec<f64> = round.devices.iter().map(|d| d.uplink_gain).collect();
        let dl_gain: Vec<f64> = round.devices.iter().map(|d| d.downlink_gain).collect();
        let correction = CorrectionSetup {
            link: round.link(),
            modes: policy.modes,
            ul_gain: &ul_gain,
            dl_gain: &dl_gain,
        };
        let engine = GoodputEngine::new(samples, weights, correction, max_draft_len, tables);
        Ok(Evaluator::with_engine(round, policy, engine, exact))
    }

    /// The evaluator of `round` over `engine`.
    fn with_engine(round: &Round, policy: CorrectionPolicy, engine: GoodputEngine, exact: bool) -> Evaluator {
        Evaluator {
            k_n: round.len(),
            acceptance: round.devices.iter().map(|d| d.acceptance).collect(),
            draft_token_s: round.devices.iter().map(|d| d.draft_token_s).collect(),
            spectral_efficiency: round.devices.iter().map(|d| d.spectral_efficiency).collect(),
            distribution_bits: round.payload.distribution_bits,
            pair_bits: round.payload.pair_bits,
            bandwidth_hz: round.bandwidth_hz,
            verify_s: round.verify_s(),
            verify_per_draft_token_s: round.verify_per_draft_token_s,
            min_draft_len: round.min_draft_len,
            max_draft_len: round.max_draft_len,
            payload: round.payload.policy,
            policy,
            engine,
            exact,
            closed_tokens: round.payload.policy == PayloadPolicy::Distribution,
        }
    }

    /// An evaluator without outcomes: enough for uplink latencies and shares, and for the value of a plan under a
    /// `distribution` policy that no rejection can change (tokens in closed form). Private, so that nothing asks
    /// it for an outcome it does not hold.
    fn without_outcomes(round: &Round, policy: CorrectionPolicy) -> Evaluator {
        Evaluator::with_engine(
            round,
            policy,
            GoodputEngine::without_outcomes(round.link(), policy.modes),
            true,
        )
    }

    /// Number of devices K.
    pub fn devices(&self) -> usize {
        self.k_n
    }

    /// The draft-length range of the round.
    pub fn draft_range(&self) -> std::ops::RangeInclusive<u32> {
        self.min_draft_len..=self.max_draft_len
    }

    /// The round's payload policy.
    pub fn payload(&self) -> PayloadPolicy {
        self.payload
    }

    /// Whether the outcomes are enumerated exactly (otherwise sampled).
    pub fn is_exact(&self) -> bool {
        self.exact
    }

    /// Number of outcomes (enumerated or sampled).
    pub fn outcome_count(&self) -> usize {
        self.engine.count()
    }

    /// T_ver(K) in seconds.
    pub fn verify_s(&self) -> f64 {
        self.verify_s
    }

    /// T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k at `draft_lengths`; T_fix + K·T_lin bit for bit when T_tok = 0.
    /// It rises with every L_k, so the bounds that divide by the time at a box's lower corner stay bounds.
    pub fn verify_at(&self, draft_lengths: &[u32]) -> f64 {
        crate::round::spec::verify_with_positions(self.verify_s, self.verify_per_draft_token_s, draft_lengths)
    }

    fn token_bits(&self, dist: bool) -> f64 {
        if dist {
            self.distribution_bits
        } else {
            self.pair_bits
        }
    }

    /// (w_k, β_k) of device k's Lemma 3 term: it needs w/(φ − β) Hz to finish by φ.
    fn term(&self, k: usize, l: u32, dist: bool) -> (f64, f64) {
        let lf = f64::from(l);
        (
            self.token_bits(dist) * lf / self.spectral_efficiency[k],
            lf * self.draft_token_s[k],
        )
    }

    /// The smallest uplink latency φ(L, z) over all shares with Σ B_k ≤ B (Lemma 3 on the devices with bits to
    /// send; a device without bits finishes at L_k T_k^S).
    pub fn uplink_latency_s(&self, draft_lengths: &[u32], sends_distributions: &[bool]) -> f64 {
        let mut floor = 0.0f64;
        let mut any = false;
        for k in 0..self.k_n {
            let (w, b) = self.term(k, draft_lengths[k], sends_distributions[k]);
            if w > 0.0 {
                any = true;
            } else {
                floor = floor.max(b);
            }
        }
        if !any {
            return floor;
        }
        let terms = (0..self.k_n)
            .map(|k| self.term(k, draft_lengths[k], sends_distributions[k]))
            .filter(|&(w, _)| w > 0.0);
        equalised_root(terms, self.bandwidth_hz).max(floor)
    }

    /// Lemma 3 shares B_k = w_k/(φ − β_k) (0 for a device without bits) with their φ.
    pub fn lemma3_shares(&self, draft_lengths: &[u32], sends_distributions: &[bool]) -> (f64, Vec<f64>) {
        let phi = self.uplink_latency_s(draft_lengths, sends_distributions);
        let shares = (0..self.k_n)
            .map(|k| {
                let (w, b) = self.term(k, draft_lengths[k], sends_distributions[k]);
                if w > 0.0 { w / (phi - b) } else { 0.0 }
            })
            .collect();
        (phi, shares)
    }

    /// max_k L_k (T_k^S + u_k/(B_k r_k)) for given shares; errors name `uplink_share_hz`.
    pub fn uplink_latency_with_shares(
        &self,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        shares: &[f64],
    ) -> Result<f64, OptimizeError> {
        if shares.len() != self.k_n {
            return Err(OptimizeError::Invalid {
                field: "uplink_share_hz".into(),
                reason: format!("{} shares for {} devices", shares.len(), self.k_n),
            });
        }
        let mut total = 0.0;
        let mut latency = 0.0f64;
        for k in 0..self.k_n {
            let b = OptimizeError::non_negative("", shares[k])
                .map_err(|e| e.naming(|| format!("uplink_share_hz[{k}]")))?;
            total += b;
            let (w, beta) = self.term(k, draft_lengths[k], sends_distributions[k]);
            let t = if w > 0.0 {
                if b <= 0.0 {
                    return Err(OptimizeError::Invalid {
                        field: format!("uplink_share_hz[{k}]"),
                        reason: "device has bits to send but no bandwidth".into(),
                    });
                }
                beta + w / b
            } else {
                beta
            };
            latency = latency.max(t);
        }
        if total > self.bandwidth_hz * (1.0 + 1e-9) {
            return Err(OptimizeError::Infeasible {
                reason: format!(
                    "uplink shares sum to {total} Hz, above bandwidth_hz = {}",
                    self.bandwidth_hz
                ),
            });
        }
        Ok(latency)
    }

    /// The rejection cap of every device by position in the engine's order, into `caps`: a device is rejected in
    /// an outcome iff its F ≤ cap, with cap = L_k for a pair sender and 0 (never) for a device that sent
    /// distributions.
    fn caps(&self, draft_lengths: &[u32], sends_distributions: &[bool], caps: &mut Vec<u16>) {
        // L ≤ L_max ≤ MAX_DRAFT_LEN_LIMIT fits 16 bits, as F does.
        self.engine.caps(
            |k| {
                if sends_distributions[k] {
                    0
                } else {
                    draft_lengths[k] as u16
                }
            },
            caps,
        );
    }

    /// The engine's form of `changes` from `state`: each device's length and cap before and after, into `moves`.
    fn moves(&self, state: &State, changes: &[Change], moves: &mut Vec<DeviceMove>) {
        let cap = |l: u32, d: bool| if d { 0 } else { l as u16 };
        moves.clear();
        moves.extend(changes.iter().map(|&(k, l, d)| {
            let (l0, d0) = (state.draft_lengths[k], state.sends_distributions[k]);
            DeviceMove {
                device: k,
                len: (l0, l),
                cap: (cap(l0, d0), cap(l, d)),
            }
        }));
    }

    fn rejectable(&self, draft_lengths: &[u32], sends_distributions: &[bool]) -> bool {
        draft_lengths
            .iter()
            .zip(sends_distributions)
            .any(|(&l, &d)| l > 0 && !d)
    }

    fn closed_form_tokens(&self, draft_lengths: &[u32]) -> f64 {
        draft_lengths
            .iter()
            .zip(&self.acceptance)
            .map(|(&l, &a)| expected_accepted(a, l))
            .sum()
    }

    fn token_mean(&self, draft_lengths: &[u32]) -> f64 {
        draft_lengths
            .iter()
            .enumerate()
            .map(|(k, &l)| self.engine.token_entry(k, l))
            .sum()
    }

    fn check(&self, draft_lengths: &[u32], sends_distributions: &[bool]) -> Result<(), OptimizeError> {
        if draft_lengths.len() != self.k_n || sends_distributions.len() != self.k_n {
            return Err(OptimizeError::Invalid {
                field: "draft_lengths".into(),
                reason: format!(
                    "{} lengths and {} payload choices for {} devices",
                    draft_lengths.len(),
                    sends_distributions.len(),
                    self.k_n
                ),
            });
        }
        for (k, &l) in draft_lengths.iter().enumerate() {
            if l > self.max_draft_len {
                return Err(OptimizeError::Invalid {
                    field: format!("draft_lengths[{k}]"),
                    reason: format!("{l} is above max_draft_len = {}", self.max_draft_len),
                });
            }
        }
        Ok(())
    }

    /// A plan's place in the round's space: every L_k ≥ `min_draft_len` and every payload one the policy allows.
    fn check_allowed(
        &self,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
    ) -> Result<(), OptimizeError> {
        for (k, (&l, &d)) in draft_lengths.iter().zip(sends_distributions).enumerate() {
            if l < self.min_draft_len {
                return Err(OptimizeError::Invalid {
                    field: format!("draft_lengths[{k}]"),
                    reason: format!("{l} is below min_draft_len = {}", self.min_draft_len),
                });
            }
            let allowed = if d {
                self.payload.allows_distribution()
            } else {
                self.payload.allows_pair()
            };
            if !allowed {
                return Err(OptimizeError::Invalid {
                    field: format!("sends_distributions[{k}]"),
                    reason: format!(
                        "the round's payload policy is {}; device {k} would send {}",
                        self.payload.name(),
                        if d { "distributions" } else { "pairs" }
                    ),
                });
            }
        }
        Ok(())
    }

    /// Full evaluation at Lemma-3 shares, keeping per-outcome totals for [`Evaluator::try_moves`].
    pub fn state(
        &self,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        objective: Objective,
    ) -> Result<State, OptimizeError> {
        self.check(draft_lengths, sends_distributions)?;
        let phi = self.uplink_latency_s(draft_lengths, sends_distributions);
        Ok(self.state_at(draft_lengths, sends_distributions, phi, objective))
    }

    fn state_at(
        &self,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        phi: f64,
        objective: Objective,
    ) -> State {
        let base = phi + self.verify_at(draft_lengths);
        let uplink_load = self.uplink_load(draft_lengths, sends_distributions, phi);
        if self.closed_tokens && !self.rejectable(draft_lengths, sends_distributions) {
            let tokens = self.closed_form_tokens(draft_lengths);
            return State {
                draft_lengths: draft_lengths.to_vec(),
                sends_distributions: sends_distributions.to_vec(),
                uplink_s: phi,
                uplink_load,
                totals: Totals {
                    tokens_total: tokens,
                    ..Totals::default()
                },
                value: tokens / base,
            };
        }
        let mut caps = Vec::new();
        self.caps(draft_lengths, sends_distributions, &mut caps);
        // Only a search moves from a state; a scorer's states keep no sets.
        let keep_sets = self.engine.has_tables() && self.engine.count().saturating_mul(self.k_n) <= SET_LIMIT;
        let (totals, value) = self
            .engine
            .evaluate(draft_lengths, &caps, base, objective, keep_sets);
        State {
            draft_lengths: draft_lengths.to_vec(),
            sends_distributions: sends_distributions.to_vec(),
            uplink_s: phi,
            uplink_load,
            totals,
            value,
        }
    }

    /// The objective after `changes` to `state` (device, new L, new z; each device at most once), at Lemma-3
    /// shares. Only outcomes where a changed device switches between rejected and not rejected recompute T_comm.
    pub fn try_moves(
        &self,
        state: &State,
        changes: &[Change],
        objective: Objective,
        scratch: &mut Scratch,
    ) -> f64 {
        self.try_moves_above(state, changes, objective, f64::NEG_INFINITY, scratch)
            .unwrap_or(f64::NEG_INFINITY)
    }

    /// [`Evaluator::try_moves`] for a caller that only wants the value if it is above `threshold`: `None` when a
    /// cheap upper bound (the exact tokens over lower bounds on φ and E\[T_comm\]; docs/unified.md, "The planner")
    /// shows that it is not, before any T_comm is recomputed. When it returns a value,
    /// that value is the one [`Evaluator::try_moves`] returns, so a search that keeps only values above its
    /// incumbent takes the same steps with or without the bound.
    pub fn try_moves_above(
        &self,
        state: &State,
        changes: &[Change],
        objective: Objective,
        threshold: f64,
        scratch: &mut Scratch,
    ) -> Option<f64> {
        scratch.last_phi = None;
        scratch.draft_lengths.clone_from(&state.draft_lengths);
        scratch.sends_distributions.clone_from(&state.sends_distributions);
        for &(k, l, d) in changes {
            scratch.draft_lengths[k] = l;
            scratch.sends_distributions[k] = d;
        }
        let draft_lengths = std::mem::take(&mut scratch.draft_lengths);
        let sends_distributions = std::mem::take(&mut scratch.sends_distributions);
        let value = self.try_at(
            state,
            changes,
            objective,
            scratch,
            &draft_lengths,
            &sends_distributions,
            threshold,
        );
        scratch.draft_lengths = draft_lengths;
        scratch.sends_distributions = sends_distributions;
        value
    }

    #[allow(clippy::too_many_arguments)]
    fn try_at(
        &self,
        state: &State,
        changes: &[Change],
        objective: Objective,
        scratch: &mut Scratch,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        threshold: f64,
    ) -> Option<f64> {
        let closed_now = self.closed_tokens && !self.rejectable(draft_lengths, sends_distributions);
        if closed_now || state.totals.tokens.is_empty() {
            let phi = self.uplink_latency_s(draft_lengths, sends_distributions);
            if closed_now {
                return Some(self.closed_form_tokens(draft_lengths) / (phi + self.verify_at(draft_lengths)));
            }
            // The state was in closed form: no per-outcome totals to update from.
            return Some(
                self.state_at(draft_lengths, sends_distributions, phi, objective)
                    .value,
            );
        }
        // Under the rate objective the value is E[ΣN] / (φ + T_ver + E[T_comm]): bound it from above with lower
        // bounds on φ (O(1) for one device) and on E[T_comm], then with the exact φ, before any T_comm.
        let below = if objective == Objective::Rate && threshold > 0.0 {
            let mut token_mean = state.totals.tokens_total;
            for &(k, l, _) in changes {
                token_mean +=
                    self.engine.token_entry(k, l) - self.engine.token_entry(k, state.draft_lengths[k]);
            }
            let comm_floor = self.comm_floor(state, changes);
            let verify = self.verify_at(draft_lengths);
            let below =
                move |phi: f64| token_mean / (phi + verify + comm_floor) < threshold * (1.0 - BOUND_MARGIN);
            if let [change] = changes
                && below(self.uplink_floor(state, *change))
            {
                return None;
            }
            Some(below)
        } else {
            None
        };
        let phi = self.uplink_latency_s(draft_lengths, sends_distributions);
        if below.is_some_and(|below| below(phi)) {
            return None;
        }
        Some(self.try_engine(
            state,
            changes,
            objective,
            scratch,
            draft_lengths,
            sends_distributions,
            phi,
        ))
    }

    /// The engine's evaluation of `changes` from `state` (not in closed form) at uplink latency `phi`.
    #[allow(clippy::too_many_arguments)]
    fn try_engine(
        &self,
        state: &State,
        changes: &[Change],
        objective: Objective,
        scratch: &mut Scratch,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        phi: f64,
    ) -> f64 {
        self.moves(state, changes, &mut scratch.moves);
        self.caps(draft_lengths, sends_distributions, &mut scratch.caps);
        let value = self.engine.try_moves(
            &state.totals,
            &scratch.moves,
            &scratch.caps,
            phi + self.verify_at(draft_lengths),
            objective,
            &mut scratch.flips,
        );
        scratch.last_phi = Some(phi);
        value
    }

    /// Keeps what the last [`Evaluator::try_moves_above`] on `state` with `changes` computed (φ and T_comm in
    /// the outcomes that flip), so that [`Evaluator::apply_moves`] of that move from that state reuses it instead
    /// of computing it again; the same values in the same order, so the state is the same bit for bit. Keeps
    /// nothing when the last try ended at a bound or in closed form.
    pub fn keep_last_try(&self, state: &State, changes: &[Change], scratch: &mut Scratch) {
        let Some(phi) = scratch.last_phi else {
            scratch.kept = None;
            return;
        };
        let mut kept = scratch.kept.take().unwrap_or_default();
        kept.draft_lengths.clone_from(&state.draft_lengths);
        kept.sends_distributions.clone_from(&state.sends_distributions);
        kept.changes.clear();
        kept.changes.extend_from_slice(changes);
        kept.phi = phi;
        kept.flips.keep(&scratch.flips);
        scratch.kept = Some(kept);
    }

    /// (Σ w_k/(φ − β_k), Σ w_k/(φ − β_k)²) over the devices with bits to send.
    fn uplink_load(&self, draft_lengths: &[u32], sends_distributions: &[bool], phi: f64) -> (f64, f64) {
        let (mut load, mut slope) = (0.0, 0.0);
        for k in 0..self.k_n {
            let (w, b) = self.term(k, draft_lengths[k], sends_distributions[k]);
            if w > 0.0 {
                let inv = 1.0 / (phi - b);
                load += w * inv;
                slope += w * inv * inv;
            }
        }
        (load, slope)
    }

    /// A lower bound on φ after one device's change, in O(1) from the state's Lemma-3 load and slope. The
    /// function G(x) = Σ_k w_k/(x − β_k) is convex and falls, and φ' is where the new G' reaches B (or later, for a
    /// device without bits); when G'(φ) > B, φ lies left of φ' and one Newton step from it stays at or below φ'.
    /// Always φ' ≥ β'_k + w'_k/B (device k alone on the whole band) and φ' ≥ β'_k.
    fn uplink_floor(&self, state: &State, (k, l, d): Change) -> f64 {
        let phi = state.uplink_s;
        let (w0, b0) = self.term(k, state.draft_lengths[k], state.sends_distributions[k]);
        let (w1, b1) = self.term(k, l, d);
        let alone = b1 + w1 / self.bandwidth_hz;
        if w1 > 0.0 && b1 >= phi {
            return alone;
        }
        let (load, slope) = state.uplink_load;
        let (mut g, mut dg) = (load, slope);
        if w0 > 0.0 {
            let inv = 1.0 / (phi - b0);
            g -= w0 * inv;
            dg -= w0 * inv * inv;
        }
        if w1 > 0.0 {
            let inv = 1.0 / (phi - b1);
            g += w1 * inv;
            dg += w1 * inv * inv;
        }
        if g > self.bandwidth_hz && dg > 0.0 {
            alone.max(phi + (g - self.bandwidth_hz) / dg)
        } else {
            alone
        }
    }

    /// A lower bound on E\[T_comm\] after `changes`, from per-outcome totals only. A change that only adds
    /// rejections (a pair sender drafting more, or switching to pairs) cannot lower any outcome's T_comm (the
    /// monotonicity the branch and bound uses). When one device k leaves the rejected set R of an outcome
    /// (|R| = m), T_comm(R ∖ {k}) ≥ T_comm(R)·(m − 1)/m under the optimal rule and all-UL whenever k's own UL delay
    /// at B/m is below T_comm(R): k in UL beside the optimal assignment of R ∖ {k} at B/m is feasible for R, and
    /// every delay b/log₂(1 + c/b) form grows at most by m/(m − 1) when the share falls from B/(m − 1) to B/m
    /// (b·log(1 + c/b) is concave and 0 at b = 0). Otherwise the outcome's T_comm is bounded by 0.
    fn comm_floor(&self, state: &State, changes: &[Change]) -> f64 {
        let mut floor = state.totals.comm_total;
        let mut removals = 0;
        for &(k, l, d) in changes {
            let (l0, d0) = (state.draft_lengths[k], state.sends_distributions[k]);
            // Rejected in outcomes with F ≤ cap.
            let (cap0, cap1) = (if d0 { 0 } else { l0 }, if d { 0 } else { l });
            if cap1 >= cap0 {
                continue;
            }
            removals += 1;
            if removals > 1 {
                // Several devices leave: the per-outcome argument covers one; bound by 0 instead.
                return 0.0;
            }
            let scaled = matches!(self.policy.modes, ModeScheme::Optimal | ModeScheme::AllUl);
            let pos = self.engine.position(k);
            for &s in self.engine.flipping(k, cap1 as u16, cap0 as u16) {
                let s = s as usize;
                let (c, m) = (state.totals.comm[s], state.totals.rejected[s] as usize);
                let keep = if scaled && m > 1 && self.engine.ul_below(m, pos, c) {
                    c * (m - 1) as f64 / m as f64
                } else {
                    0.0
                };
                floor -= self.engine.weight(s) * (c - keep);
            }
        }
        floor.max(0.0)
    }

    /// Moves `state` by `changes` in place (the committed form of [`Evaluator::try_moves`]): per-outcome totals
    /// are updated only where they change.
    pub fn apply_moves(
        &self,
        state: &mut State,
        changes: &[Change],
        objective: Objective,
        scratch: &mut Scratch,
    ) {
        let kept = scratch.kept.take().filter(|t| {
            t.changes == changes
                && t.draft_lengths == state.draft_lengths
                && t.sends_distributions == state.sends_distributions
        });
        let mut draft_lengths = state.draft_lengths.clone();
        let mut sends_distributions = state.sends_distributions.clone();
        for &(k, l, d) in changes {
            draft_lengths[k] = l;
            sends_distributions[k] = d;
        }
        let phi = match &kept {
            Some(t) => t.phi,
            None => self.uplink_latency_s(&draft_lengths, &sends_distributions),
        };
        let closed_now = self.closed_tokens && !self.rejectable(&draft_lengths, &sends_distributions);
        if closed_now || state.totals.tokens.is_empty() {
            *state = self.state_at(&draft_lengths, &sends_distributions, phi, objective);
            return;
        }
        let base = phi + self.verify_at(&draft_lengths);
        self.moves(state, changes, &mut scratch.moves);
        self.caps(&draft_lengths, &sends_distributions, &mut scratch.caps);
        match kept {
            Some(mut t) => {
                self.engine
                    .apply(&mut state.totals, &scratch.moves, &scratch.caps, &mut t.flips);
                scratch.kept = Some(t);
            }
            None => {
                self.engine.try_moves(
                    &state.totals,
                    &scratch.moves,
                    &scratch.caps,
                    base,
                    objective,
                    &mut scratch.flips,
                );
                self.engine.apply(
                    &mut state.totals,
                    &scratch.moves,
                    &scratch.caps,
                    &mut scratch.flips,
                );
            }
        }
        state.draft_lengths = draft_lengths;
        state.sends_distributions = sends_distributions;
        state.uplink_s = phi;
        state.uplink_load = self.uplink_load(&state.draft_lengths, &state.sends_distributions, phi);
        state.value = self.engine.value(&state.totals, base, objective);
    }

    /// An upper bound on the objective over the box lo ≤ L ≤ hi at payload choice `sends_distributions`, and the exact value at
    /// `lo`: tokens rise with every L_k in every outcome, and φ and every outcome's T_comm rise with L too (a larger
    /// rejected set has a smaller share per device and a larger Σ 1/g^dl), so N(hi) over T(lo) bounds the box.
    pub fn box_bound(
        &self,
        lo: &[u32],
        hi: &[u32],
        sends_distributions: &[bool],
        objective: Objective,
        scratch: &mut Scratch,
    ) -> (f64, f64) {
        let phi = self.uplink_latency_s(lo, sends_distributions);
        let base = phi + self.verify_at(lo);
        let closed = self.closed_tokens && !self.rejectable(hi, sends_distributions);
        if closed {
            return (
                self.closed_form_tokens(hi) / base,
                self.closed_form_tokens(lo) / base,
            );
        }
        let n = self.engine.count();
        let rejectable = self.rejectable(lo, sends_distributions);
        self.caps(lo, sends_distributions, &mut scratch.caps);
        let caps = &scratch.caps;
        let buf = &mut scratch.set;
        match objective {
            Objective::Rate => {
                let comm_mean: f64 = if rejectable {
                    (0..n)
                        .map(|s| self.engine.weight(s) * self.engine.comm(s, caps, buf).0)
                        .sum()
                } else {
                    0.0
                };
                let d = base + comm_mean;
                (self.token_mean(hi) / d, self.token_mean(lo) / d)
            }
            Objective::MeanRatio => {
                let (mut up, mut at) = (0.0, 0.0);
                for s in 0..n {
                    let c = if rejectable {
                        self.engine.comm(s, caps, buf).0
                    } else {
                        0.0
                    };
                    let (mut t_hi, mut t_lo) = (0u32, 0u32);
                    for k in 0..self.k_n {
                        t_hi += self.engine.tokens(k, s, hi[k]);
                        t_lo += self.engine.tokens(k, s, lo[k]);
                    }
                    let w = self.engine.weight(s) / (base + c);
                    up += w * f64::from(t_hi);
                    at += w * f64::from(t_lo);
                }
                (up, at)
            }
        }
    }

    /// The 95 % half-widths of the two objectives' sample averages at a state (rate by the delta method for the
    /// ratio of means E[ΣN]/E[T], mean ratio from the spread of ΣN/T); `None` below two samples.
    fn ci95(&self, state: &State, base: f64) -> (Option<f64>, Option<f64>) {
        let totals = &state.totals;
        let n = totals.tokens.len();
        if n < 2 || totals.comm.len() != n {
            return (None, None);
        }
        let nf = n as f64;
        let rate = totals.tokens_total / (base + totals.comm_total);
        let t_mean = base + totals.comm_total;
        let residual = |s: usize| f64::from(totals.tokens[s]) - rate * (base + totals.comm[s]);
        let r_mean = (0..n).map(residual).sum::<f64>() / nf;
        let r_var = (0..n).map(|s| (residual(s) - r_mean).powi(2)).sum::<f64>() / (nf - 1.0);
        let ratio = |s: usize| f64::from(totals.tokens[s]) / (base + totals.comm[s]);
        let q_mean = (0..n).map(ratio).sum::<f64>() / nf;
        let q_var = (0..n).map(|s| (ratio(s) - q_mean).powi(2)).sum::<f64>() / (nf - 1.0);
        (
            Some(Z95 * (r_var / nf).sqrt() / t_mean),
            Some(Z95 * (q_var / nf).sqrt()),
        )
    }

    /// Scores a plan with given shares under both objectives (the numbers a [`RoundPlan`] reports), with how they
    /// were taken: exact (enumerated outcomes, or the closed form of a plan no rejection changes), else SAA with
    /// its 95 % intervals.
    pub fn round_plan(
        &self,
        scheme: Scheme,
        draft_lengths: &[u32],
        sends_distributions: &[bool],
        shares: &[f64],
        proven_optimal: bool,
    ) -> Result<RoundPlan, OptimizeError> {
        self.check(draft_lengths, sends_distributions)?;
        self.check_allowed(draft_lengths, sends_distributions)?;
        let uplink = self.uplink_latency_with_shares(draft_lengths, sends_distributions, shares)?;
        // One evaluation serves both objectives: the per-outcome totals do not depend on the objective, only
        // the reduction of them does.
        let closed = self.closed_tokens && !self.rejectable(draft_lengths, sends_distributions);
        let rate = self.state_at(draft_lengths, sends_distributions, uplink, Objective::Rate);
        let verify_s = self.verify_at(draft_lengths);
        let base = uplink + verify_s;
        let mean_ratio = if closed {
            // Closed form: E[ΣN]/T under either objective (no outcome changes T).
            rate.value
        } else {
            self.engine.value(&rate.totals, base, Objective::MeanRatio)
        };
        let estimate = if closed || self.exact {
            PlanEstimate::Exact
        } else {
            let (rate_ci, ratio_ci) = self.ci95(&rate, base);
            PlanEstimate::Saa {
                samples: self.engine.count() as u32,
                rate_ci95_tokens_per_s: rate_ci,
                mean_ratio_ci95_tokens_per_s: ratio_ci,
            }
        };
        Ok(RoundPlan {
            scheme,
            draft_lengths: draft_lengths.to_vec(),
            uplink_share_hz: shares.to_vec(),
            sends_distributions: sends_distributions.to_vec(),
            correction: self.policy,
            rate_tokens_per_s: rate.value,
            mean_ratio_tokens_per_s: mean_ratio,
            tokens_per_round: rate.totals.tokens_total,
            uplink_latency_s: uplink,
            verify_s,
            comm_delay_s: rate.totals.comm_total,
            proven_optimal,
            estimate,
        })
    }
}

/// z of the two-sided 95 % normal interval.
const Z95: f64 = 1.959_963_984_540_054;

/// The one evaluator of every printed plan: scores `draft_lengths`, `sends_distributions` (true = distributions per token) and the draft
/// uplink `shares` of `round` with the unified model under `policy` and `expectation` ([`Evaluator::round_plan`]).
/// A plan under a `distribution` policy has no correction phase, so its value is exact in closed form and no
/// outcome is drawn or enumerated for it.
#[allow(clippy::too_many_arguments)]
pub fn score(
    round: &Round,
    expectation: Expectation,
    policy: CorrectionPolicy,
    scheme: Scheme,
    draft_lengths: &[u32],
    sends_distributions: &[bool],
    shares: &[f64],
    proven_optimal: bool,
) -> Result<RoundPlan, OptimizeError> {
    score_on(
        round,
        expectation,
        policy,
        None,
        scheme,
        draft_lengths,
        sends_distributions,
        shares,
        proven_optimal,
    )
}

/// [`score`] on the round's outcome samples `drawn` when the caller holds them: paper B's planners draw the same
/// samples ([`Samples::draw`] with the round's acceptance rates, `saa_samples`, `max_draft_len` and `seed`), so they
/// are not drawn twice. Crate-private, since nothing here can check that they were drawn with that seed.
#[allow(clippy::too_many_arguments)]
pub(crate) fn score_on(
    round: &Round,
    expectation: Expectation,
    policy: CorrectionPolicy,
    drawn: Option<&Samples>,
    scheme: Scheme,
    draft_lengths: &[u32],
    sends_distributions: &[bool],
    shares: &[f64],
    proven_optimal: bool,
) -> Result<RoundPlan, OptimizeError> {
    let light = Evaluator::without_outcomes(round, policy);
    if light.closed_tokens
        && sends_distributions.len() == light.k_n
        && !light.rejectable(draft_lengths, sends_distributions)
    {
        return light.round_plan(scheme, draft_lengths, sends_distributions, shares, proven_optimal);
    }
    Evaluator::for_scoring(round, expectation, policy, drawn)?.round_plan(
        scheme,
        draft_lengths,
        sends_distributions,
        shares,
        proven_optimal,
    )
}

/// Lemma 3's draft-uplink shares for `draft_lengths` and `sends_distributions` on `round` (0 for a device without bits to send).
pub fn lemma3_shares(
    round: &Round,
    draft_lengths: &[u32],
    sends_distributions: &[bool],
) -> Result<Vec<f64>, OptimizeError> {
    let ev = Evaluator::without_outcomes(round, CorrectionPolicy::default());
    ev.check(draft_lengths, sends_distributions)?;
    Ok(ev.lemma3_shares(draft_lengths, sends_distributions).1)
}

/// Reusable buffers of [`Evaluator::try_moves`] and [`Evaluator::box_bound`].
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    draft_lengths: Vec<u32>,
    sends_distributions: Vec<bool>,
    /// The engine's form of the move being tried, and the caps after it.
    moves: Vec<DeviceMove>,
    caps: Vec<u16>,
    /// The engine's buffers and what its last try computed.
    flips: Flips,
    /// One rejected set (for [`Evaluator::box_bound`]).
    set: SetBuf,
    /// φ of the last try that computed T_comm (None after a bound or a closed form).
    last_phi: Option<f64>,
    /// A tried move kept for [`Evaluator::apply_moves`].
    kept: Option<Kept>,
}

/// What [`Evaluator::keep_last_try`] keeps: the state's point, the move, φ, and what the engine computed for it
/// (T_comm and |R| in the outcomes that flip, in the order they were computed, and the totals after the move).
#[derive(Debug, Default, Clone)]
struct Kept {
    draft_lengths: Vec<u32>,
    sends_distributions: Vec<bool>,
    changes: Vec<Change>,
    phi: f64,
    flips: Flips,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unified::testing::DropRound;
    use rand::RngExt;

    /// Every number of a scored plan as bits (f64 `==` would let −0.0 and 0.0, or two NaNs, pass as equal).
    fn plan_bits(p: &RoundPlan) -> Vec<u64> {
        let mut bits: Vec<u64> = [
            p.rate_tokens_per_s,
            p.mean_ratio_tokens_per_s,
            p.tokens_per_round,
            p.uplink_latency_s,
            p.verify_s,
            p.comm_delay_s,
        ]
        .iter()
        .map(|x| x.to_bits())
        .collect();
        bits.extend(p.uplink_share_hz.iter().map(|x| x.to_bits()));
        match p.estimate {
            PlanEstimate::Exact => bits.push(0),
            PlanEstimate::Saa {
                samples,
                rate_ci95_tokens_per_s,
                mean_ratio_ci95_tokens_per_s,
            } => {
                bits.push(1 + u64::from(samples));
                for ci in [rate_ci95_tokens_per_s, mean_ratio_ci95_tokens_per_s] {
                    bits.push(ci.map_or(u64::MAX, f64::to_bits));
                }
            }
        }
        bits
    }

    #[test]
    fn scoring_without_the_move_tables_gives_the_same_bits_as_the_full_evaluator() {
        // `score` builds no move tables and evaluates a plan once for both objectives; the full evaluator reads
        // its tables, and its two states (one per objective) are how plans were scored before. Seeded rounds
        // under every payload policy, mode rule and expectation, plans at Lemma-3 and at equal shares: the same
        // printed numbers, bit for bit.
        let mut rng = ChaCha8Rng::seed_from_u64(2323);
        let mut plans = 0;
        for round_no in 0..24 {
            let policy = [
                PayloadPolicy::Pair,
                PayloadPolicy::Choose,
                PayloadPolicy::Distribution,
            ][round_no % 3];
            let devices = [1, 3, 7, 12][round_no % 4];
            let l_min = [0, 0, 1, 2][(round_no / 4) % 4];
            let round = DropRound {
                devices,
                draft_range: (l_min, 6),
                saa_samples: [1, 2, 150][round_no % 3] + 60 * (round_no as u32 % 2),
                policy,
                ..DropRound::default()
            }
            .draw(&mut rng)
            .unwrap();
            for modes in [
                ModeScheme::Optimal,
                ModeScheme::AllUl,
                ModeScheme::AllDl,
                ModeScheme::Random,
            ] {
                let correction = CorrectionPolicy {
                    modes,
                    ..CorrectionPolicy::default()
                };
                for expectation in [
                    Expectation::Saa,
                    Expectation::Auto { limit: 4096 },
                    Expectation::Exact { limit: 4096 },
                ] {
                    let (Ok(full), Ok(light)) = (
                        Evaluator::new(&round, expectation, correction),
                        Evaluator::for_scoring(&round, expectation, correction, None),
                    ) else {
                        // Refused alike (random modes enumerated, too many outcomes), with the same message.
                        assert_eq!(
                            Evaluator::new(&round, expectation, correction).unwrap_err(),
                            Evaluator::for_scoring(&round, expectation, correction, None).unwrap_err()
                        );
                        continue;
                    };
                    assert!(full.engine.has_tables() && !light.engine.has_tables());
                    for _ in 0..6 {
                        let draft_lengths: Vec<u32> =
                            (0..devices).map(|_| rng.random_range(l_min..=6)).collect();
                        let sends_distributions: Vec<bool> = (0..devices)
                            .map(|_| match policy {
                                PayloadPolicy::Pair => false,
                                PayloadPolicy::Distribution => true,
                                PayloadPolicy::Choose => rng.random_bool(0.4),
                            })
                            .collect();
                        let equal = vec![round.bandwidth_hz / devices as f64; devices];
                        let (_, lemma3) = full.lemma3_shares(&draft_lengths, &sends_distributions);
                        for shares in [equal, lemma3] {
                            let scheme = Scheme::Fixed;
                            let a = full
                                .round_plan(scheme, &draft_lengths, &sends_distributions, &shares, false)
                                .unwrap();
                            let b = light
                                .round_plan(scheme, &draft_lengths, &sends_distributions, &shares, false)
                                .unwrap();
                            let c = score(
                                &round,
                                expectation,
                                correction,
                                scheme,
                                &draft_lengths,
                                &sends_distributions,
                                &shares,
                                false,
                            )
                            .unwrap();
                            assert_eq!(
                                plan_bits(&a),
                                plan_bits(&b),
                                "{modes:?} {expectation:?} {draft_lengths:?}"
                            );
                            assert_eq!(
                                plan_bits(&a),
                                plan_bits(&c),
                                "{modes:?} {expectation:?} {draft_lengths:?}"
                            );
                            // The two states of the full evaluator, one per objective.
                            let uplink = a.uplink_latency_s;
                            let rate =
                                full.state_at(&draft_lengths, &sends_distributions, uplink, Objective::Rate);
                            let ratio = full.state_at(
                                &draft_lengths,
                                &sends_distributions,
                                uplink,
                                Objective::MeanRatio,
                            );
                            assert_eq!(a.rate_tokens_per_s.to_bits(), rate.value.to_bits());
                            assert_eq!(a.mean_ratio_tokens_per_s.to_bits(), ratio.value.to_bits());
                            assert_eq!(a.tokens_per_round.to_bits(), ratio.totals.tokens_total.to_bits());
                            assert_eq!(a.comm_delay_s.to_bits(), ratio.totals.comm_total.to_bits());
                            // What moves read of a state is the same from both evaluators.
                            let light_rate =
                                light.state_at(&draft_lengths, &sends_distributions, uplink, Objective::Rate);
                            assert_eq!(
                                (&rate.totals.tokens, &rate.totals.rejected),
                                (&light_rate.totals.tokens, &light_rate.totals.rejected)
                            );
                            assert!(
                                rate.totals.comm.iter().map(|x| x.to_bits()).eq(light_rate
                                    .totals
                                    .comm
                                    .iter()
                                    .map(|x| x.to_bits()))
                            );
                            plans += 1;
                        }
                    }
                }
            }
        }
        assert!(plans > 1000, "{plans}");
    }

    #[test]
    fn one_device_edits_of_kept_sets_equal_scans_bit_for_bit() {
        // A state keeps each outcome's rejected set so that a one-device move edits it instead of scanning all K
        // devices; without the sets (N·K above SET_LIMIT) the same moves scan. Both must give the same bits.
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let round = DropRound {
            devices: 9,
            draft_range: (0, 12),
            saa_samples: 300,
            ..DropRound::default()
        }
        .draw(&mut rng)
        .unwrap();
        let mut scratch = Scratch::default();
        for modes in [
            ModeScheme::Optimal,
            ModeScheme::AllUl,
            ModeScheme::AllDl,
            ModeScheme::Random,
        ] {
            let policy = CorrectionPolicy {
                modes,
                ..CorrectionPolicy::default()
            };
            let ev = Evaluator::new(&round, Expectation::Saa, policy).unwrap();
            for objective in [Objective::Rate, Objective::MeanRatio] {
                for _ in 0..25 {
                    let draft_lengths: Vec<u32> = (0..9).map(|_| rng.random_range(0..=12)).collect();
                    let sends_distributions: Vec<bool> = (0..9).map(|_| rng.random_bool(0.3)).collect();
                    let with_sets = ev.state(&draft_lengths, &sends_distributions, objective).unwrap();
                    assert!(!with_sets.totals.sets.is_empty());
                    let mut without = with_sets.clone();
                    without.totals.sets.clear();
                    without.totals.sums.clear();
                    let change = [(
                        rng.random_range(0..9),
                        rng.random_range(0..=12),
                        rng.random_bool(0.3),
                    )];
                    let a = ev.try_moves(&with_sets, &change, objective, &mut scratch);
                    let b = ev.try_moves(&without, &change, objective, &mut scratch);
                    assert_eq!(a.to_bits(), b.to_bits(), "{modes:?} {change:?}");
                    let (mut x, mut y) = (with_sets.clone(), without.clone());
                    ev.apply_moves(&mut x, &change, objective, &mut scratch);
                    ev.apply_moves(&mut y, &change, objective, &mut scratch);
                    assert_eq!(x.value.to_bits(), y.value.to_bits());
                    assert_eq!(
                        (&x.totals.comm, &x.totals.rejected),
                        (&y.totals.comm, &y.totals.rejected)
                    );
                    // The edited sets are the sets a fresh evaluation scans.
                    let fresh = ev
                        .state(&x.draft_lengths, &x.sends_distributions, objective)
                        .unwrap();
                    for s in 0..ev.outcome_count() {
                        let (at, m) = (s * ev.devices(), x.totals.rejected[s] as usize);
                        assert_eq!(x.totals.sets[at..at + m], fresh.totals.sets[at..at + m]);
                        assert_eq!(x.totals.sums[at..at + m], fresh.totals.sums[at..at + m]);
                    }
                }
            }
        }
    }
}
