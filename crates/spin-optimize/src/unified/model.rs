//! The unified model's expected goodput: OFDMA draft upload with a per-device payload, batched verification, and
//! one distribution exchange per rejected pair-sending device (UL or DL, Lemma-1 DL powers, equal band split).
//!
//! A round with draft lengths L, payload choice z (z_k = distributions per token) and draft-uplink shares B_k lasts
//! T = max_k L_k (T_k^S + u_k/(B_k r_k)) + T_ver(K) + T_comm(R), with u_k the per-token bits of device k's payload
//! and R the rejected devices that sent pairs. The expectation over the rejection outcomes is an exact enumeration
//! (weights = probabilities) or a sample-average approximation with common random numbers (paper B's samples, so the
//! paper-B special case gives paper B's numbers); both are a list of weighted outcomes here.

use crate::OptimizeError;
use crate::paper_a::bandwidth::equalised_root;
use crate::paper_b::reactive::split_by_bisection;
use crate::paper_b::{Link, ModeScheme, Objective, Samples};
use crate::round::plan::{CorrectionPolicy, Estimate, RoundPlan};
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

/// Weighted outcomes: the first-rejection position F of every device in every outcome, device-major.
#[derive(Debug, Clone)]
struct Outcomes {
    count: usize,
    first: Vec<u16>,
    weight: Vec<f64>,
    /// Random-mode coins (true = UL), device-major; empty unless the correction's modes are random (nothing else
    /// reads them).
    coin: Vec<bool>,
    exact: bool,
}

fn outcome_space(k: usize, max_len: u32) -> u128 {
    (0..k).fold(1u128, |acc, _| acc.saturating_mul(u128::from(max_len) + 1))
}

impl Outcomes {
    /// Paper B's samples for rates `alpha` (`count` of them, L_max, `seed`), or `drawn` when the caller has drawn
    /// exactly those already (the same call of [`Samples::draw`]; checked for its shape, else drawn again).
    fn saa(
        alpha: &[f64],
        count: usize,
        max_len: u32,
        seed: u64,
        coins: bool,
        drawn: Option<&Samples>,
    ) -> Outcomes {
        let k_n = alpha.len();
        let first = match drawn {
            Some(samples) if samples.count() == count && samples.devices() == k_n => {
                samples.first_rejections().to_vec()
            }
            _ => Samples::draw(alpha, count, max_len, seed)
                .first_rejections()
                .to_vec(),
        };
        // The random-mode coins come from their own stream (the samples' coins are private to paper B).
        let coin = if coins {
            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x636f_696e_7321);
            (0..k_n * count).map(|_| rng.random_bool(0.5)).collect()
        } else {
            vec![]
        };
        Outcomes {
            count,
            first,
            weight: vec![1.0 / count as f64; count],
            coin,
            exact: false,
        }
    }

    fn exact(alpha: &[f64], max_len: u32, limit: u128) -> Result<Outcomes, OptimizeError> {
        let k_n = alpha.len();
        let size = outcome_space(k_n, max_len);
        if size > limit {
            return Err(OptimizeError::TooLarge {
                field: "devices".into(),
                size,
                limit,
            });
        }
        let count = size as usize;
        let cap = max_len + 1;
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
                    a.powi(max_len as i32)
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
        Ok(Outcomes {
            count,
            first,
            weight,
            coin: vec![],
            exact: true,
        })
    }
}

/// Σ_s w_s min(F_s, l + 1) over one device's row of F: its expected tokens at draft length `l` (one entry of the
/// token table, or what a scorer without the table computes, the same expression in the same order).
fn token_sum(row: &[u16], weight: &[f64], l: u32) -> f64 {
    let cap = l + 1;
    row.iter()
        .zip(weight)
        .map(|(&f, w)| w * f64::from(u32::from(f).min(cap)))
        .sum()
}

/// A point of a search with its per-outcome totals, for cheap evaluation of nearby points.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    /// L_k per device.
    pub lens: Vec<u32>,
    /// z_k per device (true = distributions per token).
    pub dists: Vec<bool>,
    /// The Lemma-3 uplink latency φ(L, z).
    pub uplink_s: f64,
    /// Σ w_k/(φ − β_k) and Σ w_k/(φ − β_k)² over the devices with bits: the Lemma-3 function and its slope at
    /// φ, for the lower bound on φ after a move ([`Evaluator::uplink_floor`]).
    uplink_load: (f64, f64),
    tokens: Vec<u32>,
    comm: Vec<f64>,
    /// |R| per outcome: the rejected pair senders.
    rejected: Vec<u32>,
    /// Each outcome's rejected set (positions descending in K slots per outcome, the first |R| of them in use)
    /// and the running sums of 1/g^dl that [`Evaluator::scan`] builds, when N·K ≤ [`SET_LIMIT`]; else empty.
    sets: Vec<u32>,
    sums: Vec<f64>,
    token_mean: f64,
    comm_mean: f64,
    /// The objective value.
    pub value: f64,
}

/// The most N·K for which a state keeps every outcome's rejected set (12 bytes each, 24 MiB at the limit), so that a
/// one-device move rebuilds a flipped outcome's set by one edit instead of a scan of all K devices.
const SET_LIMIT: usize = 1 << 21;

/// The relative margin by which a bound must fall below a threshold before [`Evaluator::try_moves_above`] skips
/// the move: far above the rounding of either side, so a skipped move is never one the exact value would keep.
const BOUND_MARGIN: f64 = 1e-9;

/// One change of a move: device, new length, new payload choice.
pub type Change = (usize, u32, bool);

/// Evaluates plans of one round on one set of outcomes under one correction policy.
#[derive(Debug, Clone)]
pub struct Evaluator {
    k_n: usize,
    alpha: Vec<f64>,
    draft_token_s: Vec<f64>,
    spectral_efficiency: Vec<f64>,
    distribution_bits: f64,
    pair_bits: f64,
    bandwidth_hz: f64,
    verify_s: f64,
    min_len: u32,
    max_len: u32,
    payload: PayloadPolicy,
    policy: CorrectionPolicy,
    link: Link,
    outcomes: Outcomes,
    /// Tokens in closed form (Σ E[N_k]) when no device can be rejected and the round sends only distributions.
    closed_tokens: bool,
    /// Devices by uplink gain, strongest first (= UL delay ascending at any equal share).
    order: Vec<usize>,
    /// The position of each device in `order`.
    position: Vec<usize>,
    /// F by s·K + position in `order`: the outcomes again, outcome-major, so that finding an outcome's rejected
    /// set reads one contiguous row instead of K strided entries (as paper B's evaluator does).
    by_outcome: Vec<u16>,
    /// 1/g^dl by position in `order`.
    inverse_dl_gain: Vec<f64>,
    /// g^ul by position in `order` (what `ul_table` is computed from, and what a scorer without it reads).
    ul_gain: Vec<f64>,
    /// Whether the tables of moves and bounds below (and `by_outcome`) are built: an evaluator that only scores
    /// plans ([`score`]) has none of them and reads the same quantities directly ([`Evaluator::for_scoring`]).
    tables: bool,
    /// τ^ul by (m − 1)·K + position.
    ul_table: Vec<f64>,
    /// Σ_s w_s min(F_ks, l + 1) at [k·(L_max + 1) + l].
    token_table: Vec<f64>,
    /// Outcomes by first-rejection position: bucket_start[k·(L_max + 3) + f] .. [.. + f + 1] in `bucket`.
    bucket_start: Vec<usize>,
    bucket: Vec<u32>,
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
    /// without the tables that only moves and bounds read (K² UL delays, K·(L_max + 1) token sums, the outcome
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

    /// `drawn`: the round's samples if the caller holds them ([`Outcomes::saa`]).
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
        let max_len = round.max_draft_len;
        // Random modes draw their coins with the samples, so `auto` samples for them.
        let expectation = match expectation {
            Expectation::Auto { .. } if policy.modes == ModeScheme::Random => Expectation::Saa,
            e => e,
        };
        let coins = policy.modes == ModeScheme::Random;
        let outcomes = match expectation {
            Expectation::Saa => Outcomes::saa(
                &alpha,
                round.saa_samples as usize,
                max_len,
                round.seed,
                coins,
                drawn,
            ),
            Expectation::Exact { limit } => Outcomes::exact(&alpha, max_len, limit)?,
            Expectation::Auto { limit } => {
                if outcome_space(k_n, max_len) <= limit {
                    Outcomes::exact(&alpha, max_len, limit)?
                } else {
                    Outcomes::saa(
                        &alpha,
                        round.saa_samples as usize,
                        max_len,
                        round.seed,
                        coins,
                        drawn,
                    )
                }
            }
        };
        if outcomes.exact && policy.modes == ModeScheme::Random {
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
        let link = round.link();
        let mut order: Vec<usize> = (0..k_n).collect();
        let ul_gain: Vec<f64> = round.devices.iter().map(|d| d.uplink_gain).collect();
        order.sort_by(|&i, &j| ul_gain[j].total_cmp(&ul_gain[i]).then(i.cmp(&j)));
        let mut position = vec![0; k_n];
        for (pos, &k) in order.iter().enumerate() {
            position[k] = pos;
        }
        let inverse_dl_gain = order
            .iter()
            .map(|&k| 1.0 / round.devices[k].downlink_gain)
            .collect();
        let ul_gain_by_position: Vec<f64> = order.iter().map(|&k| ul_gain[k]).collect();
        let mut ev = Evaluator {
            k_n,
            alpha,
            draft_token_s: round.devices.iter().map(|d| d.draft_token_s).collect(),
            spectral_efficiency: round.devices.iter().map(|d| d.spectral_efficiency).collect(),
            distribution_bits: round.payload.distribution_bits,
            pair_bits: round.payload.pair_bits,
            bandwidth_hz: round.bandwidth_hz,
            verify_s: round.verify_s(),
            min_len: round.min_draft_len,
            max_len,
            payload: round.payload.policy,
            policy,
            link,
            outcomes,
            closed_tokens: round.payload.policy == PayloadPolicy::Distribution,
            order,
            position,
            by_outcome: vec![],
            inverse_dl_gain,
            ul_gain: ul_gain_by_position,
            tables,
            ul_table: vec![],
            token_table: vec![],
            bucket_start: vec![],
            bucket: vec![],
        };
        if tables {
            ev.build_tables();
        }
        Ok(ev)
    }

    /// The tables of moves and bounds: τ^ul for every |R| and device, Σ_s w_s min(F_ks, l + 1) for every device
    /// and length, the outcomes by device and F, and F outcome-major.
    fn build_tables(&mut self) {
        let k_n = self.k_n;
        let max_len = self.max_len;
        let mut ul_table = Vec::with_capacity(k_n * k_n);
        for m in 1..=k_n {
            let b = self.link.share_hz(m);
            ul_table.extend(self.ul_gain.iter().map(|&g| self.link.ul_delay_s(b, g)));
        }
        let outcomes = &self.outcomes;
        let n = outcomes.count;
        let mut by_outcome = vec![0u16; n * k_n];
        for (pos, &k) in self.order.iter().enumerate() {
            for s in 0..n {
                by_outcome[s * k_n + pos] = outcomes.first[k * n + s];
            }
        }
        let width = max_len as usize + 1;
        let mut token_table = vec![0.0; k_n * width];
        let stride = max_len as usize + 3;
        let mut bucket_start = vec![0usize; k_n * stride];
        let mut bucket = Vec::with_capacity(k_n * n);
        for k in 0..k_n {
            let row = &outcomes.first[k * n..(k + 1) * n];
            for l in 0..width {
                token_table[k * width + l] = token_sum(row, &outcomes.weight, l as u32);
            }
            // Counting sort of the outcomes by F ∈ {1..L_max + 1}.
            let mut counts = vec![0usize; stride];
            for &f in row {
                counts[f as usize] += 1;
            }
            let base = bucket.len();
            let mut start = base;
            for f in 0..stride {
                bucket_start[k * stride + f] = start;
                start += counts[f];
            }
            bucket.resize(base + n, 0);
            let mut fill: Vec<usize> = (0..stride).map(|f| bucket_start[k * stride + f]).collect();
            for (s, &f) in row.iter().enumerate() {
                bucket[fill[f as usize]] = s as u32;
                fill[f as usize] += 1;
            }
        }
        self.ul_table = ul_table;
        self.by_outcome = by_outcome;
        self.token_table = token_table;
        self.bucket_start = bucket_start;
        self.bucket = bucket;
    }

    /// An evaluator without outcomes or outcome tables: enough for uplink latencies and shares, and for the value
    /// of a plan under a `distribution` policy that no rejection can change (tokens in closed form). Private, so
    /// that nothing asks it for an outcome it does not hold.
    fn without_outcomes(round: &Round, policy: CorrectionPolicy) -> Evaluator {
        Evaluator {
            k_n: round.len(),
            alpha: round.devices.iter().map(|d| d.acceptance).collect(),
            draft_token_s: round.devices.iter().map(|d| d.draft_token_s).collect(),
            spectral_efficiency: round.devices.iter().map(|d| d.spectral_efficiency).collect(),
            distribution_bits: round.payload.distribution_bits,
            pair_bits: round.payload.pair_bits,
            bandwidth_hz: round.bandwidth_hz,
            verify_s: round.verify_s(),
            min_len: round.min_draft_len,
            max_len: round.max_draft_len,
            payload: round.payload.policy,
            policy,
            link: round.link(),
            outcomes: Outcomes {
                count: 0,
                first: vec![],
                weight: vec![],
                coin: vec![],
                exact: true,
            },
            closed_tokens: round.payload.policy == PayloadPolicy::Distribution,
            order: vec![],
            position: vec![],
            by_outcome: vec![],
            inverse_dl_gain: vec![],
            ul_gain: vec![],
            tables: false,
            ul_table: vec![],
            token_table: vec![],
            bucket_start: vec![],
            bucket: vec![],
        }
    }

    /// Number of devices K.
    pub fn devices(&self) -> usize {
        self.k_n
    }

    /// The draft-length range of the round.
    pub fn draft_range(&self) -> std::ops::RangeInclusive<u32> {
        self.min_len..=self.max_len
    }

    /// The round's payload policy.
    pub fn payload(&self) -> PayloadPolicy {
        self.payload
    }

    /// Whether the outcomes are enumerated exactly (otherwise sampled).
    pub fn is_exact(&self) -> bool {
        self.outcomes.exact
    }

    /// Number of outcomes (enumerated or sampled).
    pub fn outcome_count(&self) -> usize {
        self.outcomes.count
    }

    /// T_ver(K) in seconds.
    pub fn verify_s(&self) -> f64 {
        self.verify_s
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
    pub fn uplink_latency_s(&self, lens: &[u32], dists: &[bool]) -> f64 {
        let mut floor = 0.0f64;
        let mut any = false;
        for k in 0..self.k_n {
            let (w, b) = self.term(k, lens[k], dists[k]);
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
            .map(|k| self.term(k, lens[k], dists[k]))
            .filter(|&(w, _)| w > 0.0);
        equalised_root(terms, self.bandwidth_hz).max(floor)
    }

    /// Lemma 3 shares B_k = w_k/(φ − β_k) (0 for a device without bits) with their φ.
    pub fn lemma3_shares(&self, lens: &[u32], dists: &[bool]) -> (f64, Vec<f64>) {
        let phi = self.uplink_latency_s(lens, dists);
        let shares = (0..self.k_n)
            .map(|k| {
                let (w, b) = self.term(k, lens[k], dists[k]);
                if w > 0.0 { w / (phi - b) } else { 0.0 }
            })
            .collect();
        (phi, shares)
    }

    /// max_k L_k (T_k^S + u_k/(B_k r_k)) for given shares; errors name `uplink_share_hz`.
    pub fn uplink_latency_with_shares(
        &self,
        lens: &[u32],
        dists: &[bool],
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
            let (w, beta) = self.term(k, lens[k], dists[k]);
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

    /// The rejection cap of every device by position in `order`: a device is rejected in an outcome iff its
    /// F ≤ cap, with cap = L_k for a pair sender and 0 (never) for a device that sent distributions.
    fn caps(&self, lens: &[u32], dists: &[bool], caps: &mut Vec<u32>) {
        caps.clear();
        caps.extend(self.order.iter().map(|&k| if dists[k] { 0 } else { lens[k] }));
    }

    fn tokens(&self, k: usize, s: usize, l: u32) -> u32 {
        u32::from(self.outcomes.first[k * self.outcomes.count + s]).min(l + 1)
    }

    /// T_comm of outcome `s` and the number of UL devices, with `buf` as scratch (which keeps the rejected
    /// positions and their sums); `caps` from [`Evaluator::caps`].
    fn comm(&self, s: usize, caps: &[u32], buf: &mut CommBuf) -> (f64, usize) {
        self.scan(s, caps, buf);
        self.comm_from(s, &buf.rejected[..buf.len], &buf.suffix[..buf.len])
    }

    /// The rejected set of outcome `s` and its sums of 1/g^dl, into `buf`. One pass from the weakest device to
    /// the strongest (branch-free: every position is written, the count only advances on a rejection), so the
    /// sums are built from the back with the additions of a suffix sum (adding 0.0 leaves a sum unchanged).
    fn scan(&self, s: usize, caps: &[u32], buf: &mut CommBuf) {
        let CommBuf {
            rejected,
            suffix,
            len,
        } = buf;
        let k_n = self.k_n;
        rejected.resize(k_n, 0);
        suffix.resize(k_n, 0.0);
        let (mut m, mut acc) = (0usize, 0.0f64);
        let mut step = |pos: usize, f: u16| {
            let hit = u32::from(f) <= caps[pos];
            acc += if hit { self.inverse_dl_gain[pos] } else { 0.0 };
            rejected[m] = pos as u32;
            suffix[m] = acc;
            m += usize::from(hit);
        };
        if self.tables {
            let row = &self.by_outcome[s * k_n..(s + 1) * k_n];
            for pos in (0..k_n).rev() {
                step(pos, row[pos]);
            }
        } else {
            // The same F read from the device-major outcomes (a scorer scans each outcome once or twice).
            let n = self.outcomes.count;
            for pos in (0..k_n).rev() {
                step(pos, self.outcomes.first[self.order[pos] * n + s]);
            }
        }
        *len = m;
    }

    /// The rejected set of an outcome after one device (at position `p`) enters or leaves it, from the set
    /// before (`rejected`, `suffix`: positions descending and their running sums, as [`Evaluator::scan`] leaves
    /// them): the part after `p` is copied, `p` inserted or dropped, and the sums from there on are added again in
    /// the same order, so the result is bit for bit what a scan of the new set gives, in O(|R|) copies instead of
    /// O(K) tests.
    fn edit(&self, rejected: &[u32], suffix: &[f64], p: u32, buf: &mut CommBuf) {
        let j = rejected.partition_point(|&q| q > p);
        buf.rejected.clear();
        buf.suffix.clear();
        buf.rejected.extend_from_slice(&rejected[..j]);
        buf.suffix.extend_from_slice(&suffix[..j]);
        let mut acc = if j == 0 { 0.0 } else { suffix[j - 1] };
        let tail = if rejected.get(j) == Some(&p) {
            j + 1
        } else {
            acc += self.inverse_dl_gain[p as usize];
            buf.rejected.push(p);
            buf.suffix.push(acc);
            j
        };
        for &q in &rejected[tail..] {
            acc += self.inverse_dl_gain[q as usize];
            buf.rejected.push(q);
            buf.suffix.push(acc);
        }
        buf.len = buf.rejected.len();
    }

    /// T_comm of outcome `s` with rejected set `rejected` (positions descending) and `suffix` (their running
    /// sums of 1/g^dl from the weakest), and the number of UL devices.
    fn comm_from(&self, s: usize, rejected: &[u32], suffix: &[f64]) -> (f64, usize) {
        let m = rejected.len();
        if m == 0 {
            return (0.0, 0);
        }
        let k_n = self.k_n;
        let b = self.link.share_hz(m);
        if self.tables {
            let row = &self.ul_table[(m - 1) * k_n..m * k_n];
            self.comm_with(s, rejected, suffix, b, |p| row[p])
        } else {
            // The table's entries computed where they are read, from the same arguments.
            self.comm_with(s, rejected, suffix, b, |p| {
                self.link.ul_delay_s(b, self.ul_gain[p])
            })
        }
    }

    /// [`Evaluator::comm_from`] at share `b` = B/|R|, with `ul(p)` the UL delay of the device at position `p` at
    /// that share.
    fn comm_with(
        &self,
        s: usize,
        rejected: &[u32],
        suffix: &[f64],
        b: f64,
        ul: impl Fn(usize) -> f64,
    ) -> (f64, usize) {
        let m = rejected.len();
        // The rejected positions ascending: the i-th is rejected[m − 1 − i], the sum of 1/g^dl from it on is
        // suffix[m − 1 − i].
        let at = |i: usize| rejected[m - 1 - i] as usize;
        match self.policy.modes {
            ModeScheme::AllUl => (ul(at(m - 1)), m),
            ModeScheme::AllDl => {
                let inv: f64 = (0..m).map(|i| self.inverse_dl_gain[at(i)]).sum();
                (self.link.dl_delay_s(b, inv), 0)
            }
            ModeScheme::Random => {
                let (mut ul_max, mut inv, mut n_ul) = (0.0f64, 0.0, 0);
                for p in (0..m).map(at) {
                    if self.outcomes.coin[self.order[p] * self.outcomes.count + s] {
                        ul_max = ul_max.max(ul(p));
                        n_ul += 1;
                    } else {
                        inv += self.inverse_dl_gain[p];
                    }
                }
                (ul_max.max(self.link.dl_delay_s(b, inv)), n_ul)
            }
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                // Lemma 2 holds with separate DL gains: for a largest UL delay t, putting every device with
                // τ^ul ≤ t in UL only shrinks Σ 1/g^dl of the rest, so an optimal UL set is a prefix in UL order.
                let suffix_from = |n_dl: usize| if n_dl < m { suffix[m - 1 - n_dl] } else { 0.0 };
                let (n_ul, delay) = split_by_bisection(
                    m,
                    |i| ul(at(i)),
                    |n_dl| self.link.dl_delay_s(b, suffix_from(n_dl)),
                );
                (delay, n_ul)
            }
        }
    }

    /// T_comm of flipped outcome `s` after `changes` from `state`: from the state's rejected set by one edit when
    /// one device changes and the state keeps its sets, else by a scan with `caps` of the new point. `buf` then
    /// holds the new set.
    fn comm_after(
        &self,
        state: &State,
        changes: &[Change],
        s: usize,
        caps: &[u32],
        buf: &mut CommBuf,
    ) -> (f64, usize) {
        self.set_after(state, changes, s, caps, buf);
        self.comm_from(s, &buf.rejected[..buf.len], &buf.suffix[..buf.len])
    }

    /// The rejected set of outcome `s` after `changes` from `state`, into `buf` (see [`Evaluator::comm_after`]).
    fn set_after(&self, state: &State, changes: &[Change], s: usize, caps: &[u32], buf: &mut CommBuf) {
        if let [(k, _, _)] = changes
            && !state.sets.is_empty()
        {
            let at = s * self.k_n;
            let row = at..at + state.rejected[s] as usize;
            self.edit(
                &state.sets[row.clone()],
                &state.sums[row],
                self.position[*k] as u32,
                buf,
            );
        } else {
            self.scan(s, caps, buf);
        }
    }

    /// Stores `buf`'s rejected set as outcome `s`'s in `state` (when the state keeps sets).
    fn store_set(&self, state: &mut State, s: usize, buf: &CommBuf) {
        if !state.sets.is_empty() {
            let at = s * self.k_n;
            state.sets[at..at + buf.len].copy_from_slice(&buf.rejected[..buf.len]);
            state.sums[at..at + buf.len].copy_from_slice(&buf.suffix[..buf.len]);
        }
        state.rejected[s] = buf.len as u32;
    }

    fn rejectable(&self, lens: &[u32], dists: &[bool]) -> bool {
        lens.iter().zip(dists).any(|(&l, &d)| l > 0 && !d)
    }

    fn closed_form_tokens(&self, lens: &[u32]) -> f64 {
        lens.iter()
            .zip(&self.alpha)
            .map(|(&l, &a)| expected_accepted(a, l))
            .sum()
    }

    fn token_mean(&self, lens: &[u32]) -> f64 {
        let w = self.max_len as usize + 1;
        let n = self.outcomes.count;
        lens.iter()
            .enumerate()
            .map(|(k, &l)| {
                if self.tables {
                    self.token_table[k * w + l as usize]
                } else {
                    token_sum(&self.outcomes.first[k * n..(k + 1) * n], &self.outcomes.weight, l)
                }
            })
            .sum()
    }

    fn check(&self, lens: &[u32], dists: &[bool]) -> Result<(), OptimizeError> {
        if lens.len() != self.k_n || dists.len() != self.k_n {
            return Err(OptimizeError::Invalid {
                field: "draft_lengths".into(),
                reason: format!(
                    "{} lengths and {} payload choices for {} devices",
                    lens.len(),
                    dists.len(),
                    self.k_n
                ),
            });
        }
        for (k, &l) in lens.iter().enumerate() {
            if l > self.max_len {
                return Err(OptimizeError::Invalid {
                    field: format!("draft_lengths[{k}]"),
                    reason: format!("{l} is above max_draft_len = {}", self.max_len),
                });
            }
        }
        Ok(())
    }

    /// A plan's place in the round's space: every L_k ≥ `min_draft_len` and every payload one the policy allows.
    fn check_allowed(&self, lens: &[u32], dists: &[bool]) -> Result<(), OptimizeError> {
        for (k, (&l, &d)) in lens.iter().zip(dists).enumerate() {
            if l < self.min_len {
                return Err(OptimizeError::Invalid {
                    field: format!("draft_lengths[{k}]"),
                    reason: format!("{l} is below min_draft_len = {}", self.min_len),
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
    pub fn state(&self, lens: &[u32], dists: &[bool], objective: Objective) -> Result<State, OptimizeError> {
        self.check(lens, dists)?;
        let phi = self.uplink_latency_s(lens, dists);
        Ok(self.state_at(lens, dists, phi, objective))
    }

    fn state_at(&self, lens: &[u32], dists: &[bool], phi: f64, objective: Objective) -> State {
        let n = self.outcomes.count;
        let closed = self.closed_tokens && !self.rejectable(lens, dists);
        let base = phi + self.verify_s;
        if closed {
            let tokens = self.closed_form_tokens(lens);
            return State {
                lens: lens.to_vec(),
                dists: dists.to_vec(),
                uplink_s: phi,
                uplink_load: self.uplink_load(lens, dists, phi),
                tokens: vec![],
                comm: vec![],
                rejected: vec![],
                sets: vec![],
                sums: vec![],
                token_mean: tokens,
                comm_mean: 0.0,
                value: tokens / base,
            };
        }
        let mut tokens = vec![0u32; n];
        for (k, &l) in lens.iter().enumerate() {
            let row = &self.outcomes.first[k * n..(k + 1) * n];
            for (t, &f) in tokens.iter_mut().zip(row) {
                *t += u32::from(f).min(l + 1);
            }
        }
        let mut comm = vec![0.0; n];
        let mut rejected = vec![0u32; n];
        // Only a search moves from a state; a scorer's states keep no sets.
        let keep_sets = self.tables && n.saturating_mul(self.k_n) <= SET_LIMIT;
        let mut sets = if keep_sets {
            vec![0u32; n * self.k_n]
        } else {
            vec![]
        };
        let mut sums = if keep_sets {
            vec![0.0; n * self.k_n]
        } else {
            vec![]
        };
        if self.rejectable(lens, dists) {
            let mut buf = CommBuf::default();
            let mut caps = Vec::new();
            self.caps(lens, dists, &mut caps);
            for s in 0..n {
                comm[s] = self.comm(s, &caps, &mut buf).0;
                let m = buf.len;
                rejected[s] = m as u32;
                if keep_sets {
                    let at = s * self.k_n;
                    sets[at..at + m].copy_from_slice(&buf.rejected[..m]);
                    sums[at..at + m].copy_from_slice(&buf.suffix[..m]);
                }
            }
        }
        let token_mean = self.token_mean(lens);
        let comm_mean: f64 = comm.iter().zip(&self.outcomes.weight).map(|(c, w)| c * w).sum();
        let value = self.reduce(
            objective,
            base,
            token_mean,
            comm_mean,
            tokens.iter().copied(),
            comm.iter().copied(),
        );
        State {
            lens: lens.to_vec(),
            dists: dists.to_vec(),
            uplink_s: phi,
            uplink_load: self.uplink_load(lens, dists, phi),
            tokens,
            comm,
            rejected,
            sets,
            sums,
            token_mean,
            comm_mean,
            value,
        }
    }

    fn reduce(
        &self,
        objective: Objective,
        base: f64,
        token_mean: f64,
        comm_mean: f64,
        tokens: impl Iterator<Item = u32>,
        comm: impl Iterator<Item = f64>,
    ) -> f64 {
        match objective {
            Objective::Rate => token_mean / (base + comm_mean),
            Objective::MeanRatio => tokens
                .zip(comm)
                .zip(&self.outcomes.weight)
                .map(|((t, c), w)| w * f64::from(t) / (base + c))
                .sum(),
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
        scratch.lens.clone_from(&state.lens);
        scratch.dists.clone_from(&state.dists);
        for &(k, l, d) in changes {
            scratch.lens[k] = l;
            scratch.dists[k] = d;
        }
        let lens = std::mem::take(&mut scratch.lens);
        let dists = std::mem::take(&mut scratch.dists);
        let value = self.try_at(state, changes, objective, scratch, &lens, &dists, threshold);
        scratch.lens = lens;
        scratch.dists = dists;
        value
    }

    #[allow(clippy::too_many_arguments)]
    fn try_at(
        &self,
        state: &State,
        changes: &[Change],
        objective: Objective,
        scratch: &mut Scratch,
        lens: &[u32],
        dists: &[bool],
        threshold: f64,
    ) -> Option<f64> {
        let closed_now = self.closed_tokens && !self.rejectable(lens, dists);
        if closed_now || state.tokens.is_empty() {
            let phi = self.uplink_latency_s(lens, dists);
            if closed_now {
                return Some(self.closed_form_tokens(lens) / (phi + self.verify_s));
            }
            // The state was in closed form: no per-outcome totals to update from.
            return Some(self.state_at(lens, dists, phi, objective).value);
        }
        let n = self.outcomes.count;
        let width = self.max_len as usize + 1;
        let mut token_mean = state.token_mean;
        for &(k, l, _) in changes {
            token_mean += self.token_table[k * width + l as usize]
                - self.token_table[k * width + state.lens[k] as usize];
        }
        // Under the rate objective the value is token_mean / (φ + T_ver + E[T_comm]): bound it from above with
        // lower bounds on φ (O(1) for one device) and on E[T_comm], then with the exact φ, before any T_comm.
        let bounded = objective == Objective::Rate && threshold > 0.0;
        let comm_floor = if bounded {
            self.comm_floor(state, changes)
        } else {
            0.0
        };
        let below =
            |phi: f64| token_mean / (phi + self.verify_s + comm_floor) < threshold * (1.0 - BOUND_MARGIN);
        if bounded
            && let [change] = changes
            && below(self.uplink_floor(state, *change))
        {
            return None;
        }
        let phi = self.uplink_latency_s(lens, dists);
        if bounded && below(phi) {
            return None;
        }
        let base = phi + self.verify_s;
        self.mark_flipped(state, changes, scratch);
        let mut comm_mean = state.comm_mean;
        scratch.comm_values.resize(n, 0.0);
        scratch.count_values.resize(n, 0);
        self.caps(lens, dists, &mut scratch.caps);
        let mut rejected = std::mem::take(&mut scratch.rejected);
        for &s in &scratch.flipped {
            let c = self.comm_after(state, changes, s, &scratch.caps, &mut rejected).0;
            comm_mean += self.outcomes.weight[s] * (c - state.comm[s]);
            scratch.comm_values[s] = c;
            scratch.count_values[s] = rejected.len as u32;
        }
        scratch.rejected = rejected;
        scratch.last_phi = Some(phi);
        let value = match objective {
            Objective::Rate => token_mean / (base + comm_mean),
            Objective::MeanRatio => {
                let mut acc = 0.0;
                for s in 0..n {
                    let mut t = state.tokens[s];
                    for &(k, l, _) in changes {
                        t = t + self.tokens(k, s, l) - self.tokens(k, s, state.lens[k]);
                    }
                    let c = if scratch.mark[s] {
                        scratch.comm_values[s]
                    } else {
                        state.comm[s]
                    };
                    acc += self.outcomes.weight[s] * f64::from(t) / (base + c);
                }
                acc
            }
        };
        for &s in &scratch.flipped {
            scratch.mark[s] = false;
        }
        Some(value)
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
        kept.lens.clone_from(&state.lens);
        kept.dists.clone_from(&state.dists);
        kept.changes.clear();
        kept.changes.extend_from_slice(changes);
        kept.phi = phi;
        kept.flipped.clone_from(&scratch.flipped);
        kept.comm.clear();
        kept.comm
            .extend(scratch.flipped.iter().map(|&s| scratch.comm_values[s]));
        kept.counts.clear();
        kept.counts
            .extend(scratch.flipped.iter().map(|&s| scratch.count_values[s]));
        scratch.kept = Some(kept);
    }

    /// (Σ w_k/(φ − β_k), Σ w_k/(φ − β_k)²) over the devices with bits to send.
    fn uplink_load(&self, lens: &[u32], dists: &[bool], phi: f64) -> (f64, f64) {
        let (mut load, mut slope) = (0.0, 0.0);
        for k in 0..self.k_n {
            let (w, b) = self.term(k, lens[k], dists[k]);
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
        let (w0, b0) = self.term(k, state.lens[k], state.dists[k]);
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
        let stride = self.max_len as usize + 3;
        let mut floor = state.comm_mean;
        let mut removals = 0;
        for &(k, l, d) in changes {
            let (l0, d0) = (state.lens[k], state.dists[k]);
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
            let pos = self.position[k];
            let from = self.bucket_start[k * stride + cap1 as usize + 1];
            let to = self.bucket_start[k * stride + cap0 as usize + 1];
            for &s in &self.bucket[from..to] {
                let s = s as usize;
                let (c, m) = (state.comm[s], state.rejected[s] as usize);
                let keep = if scaled && m > 1 && self.ul_table[(m - 1) * self.k_n + pos] < c {
                    c * (m - 1) as f64 / m as f64
                } else {
                    0.0
                };
                floor -= self.outcomes.weight[s] * (c - keep);
            }
        }
        floor.max(0.0)
    }

    /// Collects in `scratch.flipped` the outcomes whose rejected set changes under `changes`.
    fn mark_flipped(&self, state: &State, changes: &[Change], scratch: &mut Scratch) {
        let n = self.outcomes.count;
        let stride = self.max_len as usize + 3;
        scratch.flipped.clear();
        scratch.mark.resize(n, false);
        for &(k, l, d) in changes {
            let (l0, d0) = (state.lens[k], state.dists[k]);
            let (lo_f, hi_f) = if d0 == d {
                if d || l == l0 {
                    continue;
                }
                (l.min(l0) + 1, l.max(l0))
            } else {
                (1, if d0 { l } else { l0 })
            };
            if lo_f > hi_f {
                continue;
            }
            let from = self.bucket_start[k * stride + lo_f as usize];
            let to = self.bucket_start[k * stride + hi_f as usize + 1];
            for &s in &self.bucket[from..to] {
                let s = s as usize;
                if !scratch.mark[s] {
                    scratch.mark[s] = true;
                    scratch.flipped.push(s);
                }
            }
        }
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
        let kept = scratch
            .kept
            .take()
            .filter(|t| t.changes == changes && t.lens == state.lens && t.dists == state.dists);
        let mut lens = state.lens.clone();
        let mut dists = state.dists.clone();
        for &(k, l, d) in changes {
            lens[k] = l;
            dists[k] = d;
        }
        let phi = match &kept {
            Some(t) => t.phi,
            None => self.uplink_latency_s(&lens, &dists),
        };
        let closed_now = self.closed_tokens && !self.rejectable(&lens, &dists);
        if closed_now || state.tokens.is_empty() {
            *state = self.state_at(&lens, &dists, phi, objective);
            return;
        }
        let n = self.outcomes.count;
        let width = self.max_len as usize + 1;
        for &(k, l, _) in changes {
            let l0 = state.lens[k];
            if l != l0 {
                state.token_mean +=
                    self.token_table[k * width + l as usize] - self.token_table[k * width + l0 as usize];
                for (s, t) in state.tokens.iter_mut().enumerate() {
                    *t = *t + self.tokens(k, s, l) - self.tokens(k, s, l0);
                }
            }
        }
        let mut buf = std::mem::take(&mut scratch.rejected);
        self.caps(&lens, &dists, &mut scratch.caps);
        if let Some(t) = kept {
            for ((&s, &c), &m) in t.flipped.iter().zip(&t.comm).zip(&t.counts) {
                state.comm_mean += self.outcomes.weight[s] * (c - state.comm[s]);
                state.comm[s] = c;
                if state.sets.is_empty() {
                    state.rejected[s] = m;
                } else {
                    // The kept values spare T_comm; the new set still has to be stored.
                    self.set_after(state, changes, s, &scratch.caps, &mut buf);
                    debug_assert_eq!(buf.len as u32, m);
                    self.store_set(state, s, &buf);
                }
            }
            scratch.kept = Some(t);
        } else {
            self.mark_flipped(state, changes, scratch);
            for &s in &scratch.flipped {
                let c = self.comm_after(state, changes, s, &scratch.caps, &mut buf).0;
                state.comm_mean += self.outcomes.weight[s] * (c - state.comm[s]);
                state.comm[s] = c;
                self.store_set(state, s, &buf);
                scratch.mark[s] = false;
            }
        }
        scratch.rejected = buf;
        debug_assert_eq!(state.tokens.len(), n);
        state.lens = lens;
        state.dists = dists;
        state.uplink_s = phi;
        state.uplink_load = self.uplink_load(&state.lens, &state.dists, phi);
        let base = phi + self.verify_s;
        state.value = self.reduce(
            objective,
            base,
            state.token_mean,
            state.comm_mean,
            state.tokens.iter().copied(),
            state.comm.iter().copied(),
        );
    }

    /// An upper bound on the objective over the box lo ≤ L ≤ hi at payload choice `dists`, and the exact value at
    /// `lo`: tokens rise with every L_k in every outcome, and φ and every outcome's T_comm rise with L too (a larger
    /// rejected set has a smaller share per device and a larger Σ 1/g^dl), so N(hi) over T(lo) bounds the box.
    pub fn box_bound(
        &self,
        lo: &[u32],
        hi: &[u32],
        dists: &[bool],
        objective: Objective,
        scratch: &mut Scratch,
    ) -> (f64, f64) {
        let phi = self.uplink_latency_s(lo, dists);
        let base = phi + self.verify_s;
        let closed = self.closed_tokens && !self.rejectable(hi, dists);
        if closed {
            return (
                self.closed_form_tokens(hi) / base,
                self.closed_form_tokens(lo) / base,
            );
        }
        let n = self.outcomes.count;
        let rejectable = self.rejectable(lo, dists);
        self.caps(lo, dists, &mut scratch.caps);
        let caps = &scratch.caps;
        let mut rejected = std::mem::take(&mut scratch.rejected);
        let result = match objective {
            Objective::Rate => {
                let comm_mean: f64 = if rejectable {
                    (0..n)
                        .map(|s| self.outcomes.weight[s] * self.comm(s, caps, &mut rejected).0)
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
                        self.comm(s, caps, &mut rejected).0
                    } else {
                        0.0
                    };
                    let (mut t_hi, mut t_lo) = (0u32, 0u32);
                    for k in 0..self.k_n {
                        t_hi += self.tokens(k, s, hi[k]);
                        t_lo += self.tokens(k, s, lo[k]);
                    }
                    let w = self.outcomes.weight[s] / (base + c);
                    up += w * f64::from(t_hi);
                    at += w * f64::from(t_lo);
                }
                (up, at)
            }
        };
        scratch.rejected = rejected;
        result
    }

    /// The 95 % half-widths of the two objectives' sample averages at a state (rate by the delta method for the
    /// ratio of means E[ΣN]/E[T], mean ratio from the spread of ΣN/T); `None` below two samples.
    fn ci95(&self, state: &State, base: f64) -> (Option<f64>, Option<f64>) {
        let n = state.tokens.len();
        if n < 2 || state.comm.len() != n {
            return (None, None);
        }
        let nf = n as f64;
        let rate = state.token_mean / (base + state.comm_mean);
        let t_mean = base + state.comm_mean;
        let residual = |s: usize| f64::from(state.tokens[s]) - rate * (base + state.comm[s]);
        let r_mean = (0..n).map(residual).sum::<f64>() / nf;
        let r_var = (0..n).map(|s| (residual(s) - r_mean).powi(2)).sum::<f64>() / (nf - 1.0);
        let ratio = |s: usize| f64::from(state.tokens[s]) / (base + state.comm[s]);
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
        lens: &[u32],
        dists: &[bool],
        shares: &[f64],
        proven_optimal: bool,
    ) -> Result<RoundPlan, OptimizeError> {
        self.check(lens, dists)?;
        self.check_allowed(lens, dists)?;
        let uplink = self.uplink_latency_with_shares(lens, dists, shares)?;
        // One evaluation serves both objectives: the per-outcome totals do not depend on the objective, only
        // the reduction of them does.
        let closed = self.closed_tokens && !self.rejectable(lens, dists);
        let rate = self.state_at(lens, dists, uplink, Objective::Rate);
        let mean_ratio = if closed {
            // Closed form: E[ΣN]/T under either objective (no outcome changes T).
            rate.value
        } else {
            self.reduce(
                Objective::MeanRatio,
                uplink + self.verify_s,
                rate.token_mean,
                rate.comm_mean,
                rate.tokens.iter().copied(),
                rate.comm.iter().copied(),
            )
        };
        let estimate = if closed || self.outcomes.exact {
            Estimate::Exact
        } else {
            let (rate_ci, ratio_ci) = self.ci95(&rate, uplink + self.verify_s);
            Estimate::Saa {
                samples: self.outcomes.count as u32,
                rate_ci95_tokens_per_s: rate_ci,
                mean_ratio_ci95_tokens_per_s: ratio_ci,
            }
        };
        Ok(RoundPlan {
            scheme,
            draft_lengths: lens.to_vec(),
            uplink_share_hz: shares.to_vec(),
            sends_distributions: dists.to_vec(),
            correction: self.policy,
            rate_tokens_per_s: rate.value,
            mean_ratio_tokens_per_s: mean_ratio,
            tokens_per_round: rate.token_mean,
            uplink_latency_s: uplink,
            verify_s: self.verify_s,
            comm_delay_s: rate.comm_mean,
            proven_optimal,
            estimate,
        })
    }
}

/// z of the two-sided 95 % normal interval.
const Z95: f64 = 1.959_963_984_540_054;

/// The one evaluator of every printed plan: scores `lens`, `dists` (true = distributions per token) and the draft
/// uplink `shares` of `round` with the unified model under `policy` and `expectation` ([`Evaluator::round_plan`]).
/// A plan under a `distribution` policy has no correction phase, so its value is exact in closed form and no
/// outcome is drawn or enumerated for it.
#[allow(clippy::too_many_arguments)]
pub fn score(
    round: &Round,
    expectation: Expectation,
    policy: CorrectionPolicy,
    scheme: Scheme,
    lens: &[u32],
    dists: &[bool],
    shares: &[f64],
    proven_optimal: bool,
) -> Result<RoundPlan, OptimizeError> {
    score_on(
        round,
        expectation,
        policy,
        None,
        scheme,
        lens,
        dists,
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
    lens: &[u32],
    dists: &[bool],
    shares: &[f64],
    proven_optimal: bool,
) -> Result<RoundPlan, OptimizeError> {
    let light = Evaluator::without_outcomes(round, policy);
    if light.closed_tokens && dists.len() == light.k_n && !light.rejectable(lens, dists) {
        return light.round_plan(scheme, lens, dists, shares, proven_optimal);
    }
    Evaluator::for_scoring(round, expectation, policy, drawn)?.round_plan(
        scheme,
        lens,
        dists,
        shares,
        proven_optimal,
    )
}

/// Lemma 3's draft-uplink shares for `lens` and `dists` on `round` (0 for a device without bits to send).
pub fn lemma3_shares(round: &Round, lens: &[u32], dists: &[bool]) -> Result<Vec<f64>, OptimizeError> {
    let ev = Evaluator::without_outcomes(round, CorrectionPolicy::default());
    ev.check(lens, dists)?;
    Ok(ev.lemma3_shares(lens, dists).1)
}

/// Reusable buffers of [`Evaluator::try_moves`] and [`Evaluator::box_bound`].
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    lens: Vec<u32>,
    dists: Vec<bool>,
    flipped: Vec<usize>,
    mark: Vec<bool>,
    comm_values: Vec<f64>,
    count_values: Vec<u32>,
    caps: Vec<u32>,
    rejected: CommBuf,
    /// φ of the last try that computed T_comm (None after a bound or a closed form).
    last_phi: Option<f64>,
    /// A tried move kept for [`Evaluator::apply_moves`].
    kept: Option<Kept>,
}

/// What [`Evaluator::keep_last_try`] keeps: the state's point, the move, φ, and T_comm and |R| in the outcomes that
/// flip, in the order they were computed.
#[derive(Debug, Default, Clone)]
struct Kept {
    lens: Vec<u32>,
    dists: Vec<bool>,
    changes: Vec<Change>,
    phi: f64,
    flipped: Vec<usize>,
    comm: Vec<f64>,
    counts: Vec<u32>,
}

/// Buffers of one T_comm evaluation: the rejected positions and the suffix sums of 1/g^dl (both from the
/// weakest device down, K long; the first `len` are the rejected set).
#[derive(Debug, Default, Clone)]
struct CommBuf {
    rejected: Vec<u32>,
    suffix: Vec<f64>,
    len: usize,
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
            Estimate::Exact => bits.push(0),
            Estimate::Saa {
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
                    assert!(full.tables && !light.tables && light.ul_table.is_empty());
                    for _ in 0..6 {
                        let lens: Vec<u32> = (0..devices).map(|_| rng.random_range(l_min..=6)).collect();
                        let dists: Vec<bool> = (0..devices)
                            .map(|_| match policy {
                                PayloadPolicy::Pair => false,
                                PayloadPolicy::Distribution => true,
                                PayloadPolicy::Choose => rng.random_bool(0.4),
                            })
                            .collect();
                        let equal = vec![round.bandwidth_hz / devices as f64; devices];
                        let (_, lemma3) = full.lemma3_shares(&lens, &dists);
                        for shares in [equal, lemma3] {
                            let scheme = Scheme::Fixed;
                            let a = full.round_plan(scheme, &lens, &dists, &shares, false).unwrap();
                            let b = light.round_plan(scheme, &lens, &dists, &shares, false).unwrap();
                            let c = score(
                                &round,
                                expectation,
                                correction,
                                scheme,
                                &lens,
                                &dists,
                                &shares,
                                false,
                            )
                            .unwrap();
                            assert_eq!(plan_bits(&a), plan_bits(&b), "{modes:?} {expectation:?} {lens:?}");
                            assert_eq!(plan_bits(&a), plan_bits(&c), "{modes:?} {expectation:?} {lens:?}");
                            // The two states of the full evaluator, one per objective.
                            let uplink = a.uplink_latency_s;
                            let rate = full.state_at(&lens, &dists, uplink, Objective::Rate);
                            let ratio = full.state_at(&lens, &dists, uplink, Objective::MeanRatio);
                            assert_eq!(a.rate_tokens_per_s.to_bits(), rate.value.to_bits());
                            assert_eq!(a.mean_ratio_tokens_per_s.to_bits(), ratio.value.to_bits());
                            assert_eq!(a.tokens_per_round.to_bits(), ratio.token_mean.to_bits());
                            assert_eq!(a.comm_delay_s.to_bits(), ratio.comm_mean.to_bits());
                            // What moves read of a state is the same from both evaluators.
                            let light_rate = light.state_at(&lens, &dists, uplink, Objective::Rate);
                            assert_eq!(
                                (&rate.tokens, &rate.rejected),
                                (&light_rate.tokens, &light_rate.rejected)
                            );
                            assert!(
                                rate.comm
                                    .iter()
                                    .map(|x| x.to_bits())
                                    .eq(light_rate.comm.iter().map(|x| x.to_bits()))
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
                    let lens: Vec<u32> = (0..9).map(|_| rng.random_range(0..=12)).collect();
                    let dists: Vec<bool> = (0..9).map(|_| rng.random_bool(0.3)).collect();
                    let with_sets = ev.state(&lens, &dists, objective).unwrap();
                    assert!(!with_sets.sets.is_empty());
                    let mut without = with_sets.clone();
                    without.sets.clear();
                    without.sums.clear();
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
                    assert_eq!((&x.comm, &x.rejected), (&y.comm, &y.rejected));
                    // The edited sets are the sets a fresh evaluation scans.
                    let fresh = ev.state(&x.lens, &x.dists, objective).unwrap();
                    for s in 0..ev.outcome_count() {
                        let (at, m) = (s * ev.devices(), x.rejected[s] as usize);
                        assert_eq!(x.sets[at..at + m], fresh.sets[at..at + m]);
                        assert_eq!(x.sums[at..at + m], fresh.sums[at..at + m]);
                    }
                }
            }
        }
    }
}
