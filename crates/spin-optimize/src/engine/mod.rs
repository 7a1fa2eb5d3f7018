//! The one incremental engine of both expected-goodput evaluators, paper B's SAA (`paper_b::saa`) and the
//! unified model (`unified::model`): weighted rejection outcomes, each outcome's rejected set and correction delay
//! T_comm, and a point's per-outcome totals, which a move updates only in the outcomes it flips.
//!
//! A point of either model gives every device a draft length L_k (it emits N_k = min(F_k, L_k + 1) tokens) and a
//! rejection cap (it is rejected and needs an exchange iff F_k ≤ cap_k: cap = L for a device that sent pairs, 0
//! for one that sent distributions, which the server corrects itself). What the models do outside the correction
//! phase (paper B's drafting time, the unified model's OFDMA uplink) reaches the engine as one base latency per
//! point. The models also weigh their outcomes differently ([`Weights`]): paper B counts samples (integer token
//! totals, delays summed in sample order), the unified model weighs them by probability (exact enumeration, or 1/N
//! per sample). The engine keeps each arithmetic as it was, so both evaluators give the numbers they gave with an
//! engine each, bit for bit (`tests/engine_reference.rs`).

mod comm;
mod samples;

pub(crate) use comm::SetBuf;
pub use comm::{BOUND_MARGIN, UL_TABLE_MAX_DEVICES};
pub use samples::Samples;

use crate::OptimizeError;
use crate::paper_b::reactive::{Link, ModeScheme};
use comm::UlTable;

/// What the proactive searches maximise, and what a plan's value is reported under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Objective {
    /// E\[ΣN\] / E\[T\]: long-run throughput in tokens/s (renewal–reward; default).
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

/// How the outcomes are weighted, and so how their totals are summed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Weights {
    /// Paper B's SAA: every sample counts once. Token totals are integers (held exactly in an `f64`), T_comm is
    /// summed in sample order, and both are divided by N.
    Count,
    /// The unified model: outcome s has weight w_s (its probability when enumerated, 1/N when sampled). Totals are
    /// weighted sums; a move updates the T_comm total by the weighted differences in the outcomes it flips.
    Probability(Vec<f64>),
}

/// The tables of moves and bounds (empty in an engine that only scores points).
#[derive(Debug, Clone, Default)]
struct Tables {
    /// Whether they are built.
    built: bool,
    /// F by s·K + position in the device order: the outcomes again, outcome-major, so that finding an outcome's
    /// rejected set reads one contiguous row instead of K strided entries.
    by_outcome: Vec<u16>,
    /// Per device (k·N + i): the outcome indices in order of F, then of s.
    bucket: Vec<u32>,
    /// Per device (k·(L_max + 3) + f): the first i in `bucket`'s row k with F ≥ f, for f ∈ 0..=L_max + 2.
    bucket_start: Vec<u32>,
    /// The expected tokens of device k at draft length l, at k·(L_max + 1) + l: Σ_s min(F_ks, l + 1) under
    /// [`Weights::Count`] (an integer), Σ_s w_s min(F_ks, l + 1) under [`Weights::Probability`].
    tokens: Vec<f64>,
}

/// Outcomes with their weights, the correction link and mode rule, and the device order every rejected set is
/// kept in.
#[derive(Debug, Clone)]
pub(crate) struct GoodputEngine {
    samples: Samples,
    weights: Weights,
    link: Link,
    modes: ModeScheme,
    max_draft_len: u32,
    /// Devices by uplink gain, strongest first (= UL delay ascending at any equal share).
    order: Vec<usize>,
    /// The position of each device in `order`.
    position: Vec<usize>,
    /// g^ul by position in `order`.
    ul_gain: Vec<f64>,
    /// 1/g^dl by position in `order`.
    inverse_dl_gain: Vec<f64>,
    tables: Tables,
    /// τ^ul by (m − 1)·K + position, filled when asked (see [`UL_TABLE_MAX_DEVICES`]); empty without tables.
    ul_table: UlTable,
    /// 1/P_dl.
    inverse_dl_power: f64,
    /// Whether the reactive split may compare SNRs instead of delays: powers and D within 10^±20, gains and noise
    /// powers N0·b within 10^±60, shares within 10^±30, so that every SNR, delay and intermediate product is a
    /// normal number far from overflow and rounds by a few ulps. Else every comparison uses the delays.
    snr_shortcut: bool,
}

/// The correction side of a round as the engine sees it.
pub(crate) struct CorrectionSetup<'a> {
    /// The correction link (D, B, powers, noise).
    pub link: Link,
    /// The mode rule.
    pub modes: ModeScheme,
    /// g^ul per device.
    pub ul_gain: &'a [f64],
    /// g^dl per device.
    pub dl_gain: &'a [f64],
}

/// One device's part of a move: its draft length and its rejection cap, before and after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DeviceMove {
    pub device: usize,
    pub len: (u32, u32),
    pub cap: (u16, u16),
}

/// A point's per-outcome totals, for cheap evaluation of nearby points.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Totals {
    /// ΣN per outcome.
    pub tokens: Vec<u32>,
    /// T_comm per outcome.
    pub comm: Vec<f64>,
    /// |R| per outcome.
    pub rejected: Vec<u32>,
    /// Each outcome's rejected set (positions descending in K slots per outcome, the first |R| of them in use) and
    /// its running sums of 1/g^dl, when the point keeps them; else empty.
    pub sets: Vec<u32>,
    pub sums: Vec<f64>,
    /// The token total: Σ_s ΣN (an integer) under [`Weights::Count`], E\[ΣN\] under [`Weights::Probability`].
    pub tokens_total: f64,
    /// The T_comm total: Σ_s T_comm in outcome order under [`Weights::Count`], Σ_s w_s T_comm under
    /// [`Weights::Probability`] (updated by the weighted differences after a move).
    pub comm_total: f64,
}

/// Reusable buffers of a move's evaluation, and what the last one computed, so that applying it does not compute
/// it again.
#[derive(Debug, Clone, Default)]
pub(crate) struct Flips {
    /// The outcomes the move flips, in the order they were found (by device, F, then outcome).
    pub flipped: Vec<u32>,
    /// T_comm and |R| after the move in those outcomes, in the same order.
    pub comm: Vec<f64>,
    pub rejected: Vec<u32>,
    /// The totals and value after the move.
    pub tokens_total: f64,
    pub comm_total: f64,
    pub value: f64,
    /// Per outcome: whether it flips (set only during an evaluation), and its T_comm after the move there.
    mark: Vec<bool>,
    by_outcome: Vec<f64>,
    /// One rejected set.
    buf: SetBuf,
}

impl Flips {
    /// Copies what `other`'s last evaluation computed (the flipped outcomes with their T_comm and |R|, and the
    /// totals and value), so that it can be applied after other moves were tried with `other`.
    pub(crate) fn keep(&mut self, other: &Flips) {
        self.flipped.clone_from(&other.flipped);
        self.comm.clone_from(&other.comm);
        self.rejected.clone_from(&other.rejected);
        self.tokens_total = other.tokens_total;
        self.comm_total = other.comm_total;
        self.value = other.value;
    }
}

impl GoodputEngine {
    /// An engine over `samples` (F and the random-mode coins; coins may be empty unless the modes are random)
    /// weighted by `weights`, for draft lengths up to `max_draft_len`. With `tables` it builds what moves and bounds read
    /// (the outcome-major copy of F, the outcomes bucketed by F, the token table and the lazy UL-delay table);
    /// without them it can only evaluate points, computing the same entries where they are read.
    pub(crate) fn new(
        samples: Samples,
        weights: Weights,
        correction: CorrectionSetup<'_>,
        max_draft_len: u32,
        tables: bool,
    ) -> GoodputEngine {
        let CorrectionSetup {
            link,
            modes,
            ul_gain,
            dl_gain,
        } = correction;
        let k_n = ul_gain.len();
        let mut order: Vec<usize> = (0..k_n).collect();
        order.sort_by(|&i, &j| ul_gain[j].total_cmp(&ul_gain[i]).then(i.cmp(&j)));
        let mut position = vec![0; k_n];
        for (pos, &k) in order.iter().enumerate() {
            position[k] = pos;
        }
        let ul_by_position: Vec<f64> = order.iter().map(|&k| ul_gain[k]).collect();
        let inverse_dl_gain = order.iter().map(|&k| 1.0 / dl_gain[k]).collect();
        let within = |x: f64, decades: f64| x >= 10f64.powf(-decades) && x <= 10f64.powf(decades);
        let shares = [link.bandwidth_hz, link.share_hz(k_n.max(1))];
        let snr_shortcut = [link.ul_power_w, link.dl_power_w, link.distribution_bits]
            .iter()
            .all(|&x| within(x, 20.0))
            && ul_gain.iter().chain(dl_gain).all(|&g| within(g, 60.0))
            && shares.iter().all(|&b| {
                within(b, 30.0)
                    && within(link.noise_psd_server_w_per_hz * b, 60.0)
                    && within(link.noise_psd_device_w_per_hz * b, 60.0)
            });
        let mut engine = GoodputEngine {
            samples,
            weights,
            inverse_dl_power: 1.0 / link.dl_power_w,
            link,
            modes,
            max_draft_len,
            order,
            position,
            ul_gain: ul_by_position,
            inverse_dl_gain,
            tables: Tables::default(),
            ul_table: UlTable::default(),
            snr_shortcut,
        };
        if tables {
            engine.build_tables();
        }
        engine
    }

    /// An engine without devices or outcomes, for a model that needs none (uplink latencies, closed forms).
    pub(crate) fn without_outcomes(link: Link, modes: ModeScheme) -> GoodputEngine {
        GoodputEngine {
            samples: Samples::from_parts(0, 0, vec![], vec![]),
            weights: Weights::Probability(vec![]),
            inverse_dl_power: 1.0 / link.dl_power_w,
            link,
            modes,
            max_draft_len: 0,
            order: vec![],
            position: vec![],
            ul_gain: vec![],
            inverse_dl_gain: vec![],
            tables: Tables::default(),
            ul_table: UlTable::default(),
            snr_shortcut: false,
        }
    }

    /// The tables of moves and bounds (see [`Tables`]), and the lazy UL-delay table up to
    /// [`UL_TABLE_MAX_DEVICES`] devices.
    fn build_tables(&mut self) {
        let k_n = self.order.len();
        let n = self.samples.count();
        let first = self.samples.first_rejections();
        let mut by_outcome = vec![0u16; n * k_n];
        for (pos, &k) in self.order.iter().enumerate() {
            for s in 0..n {
                by_outcome[s * k_n + pos] = first[k * n + s];
            }
        }
        let width = self.max_draft_len as usize + 1;
        let stride = width + 2;
        let mut tokens = vec![0.0; k_n * width];
        let mut bucket = vec![0u32; k_n * n];
        let mut bucket_start = vec![0u32; k_n * stride];
        let mut count = vec![0u32; stride];
        let mut next = vec![0u32; stride];
        for k in 0..k_n {
            let row = &first[k * n..(k + 1) * n];
            // Counting sort by F (stable in s).
            count.fill(0);
            for &f in row {
                count[usize::from(f)] += 1;
            }
            let starts = &mut bucket_start[k * stride..(k + 1) * stride];
            let mut acc = 0u32;
            for (f, c) in count.iter().enumerate() {
                starts[f] = acc;
                acc += c;
            }
            next.copy_from_slice(starts);
            let sorted = &mut bucket[k * n..(k + 1) * n];
            for (s, &f) in row.iter().enumerate() {
                sorted[next[usize::from(f)] as usize] = s as u32;
                next[usize::from(f)] += 1;
            }
            for l in 0..width {
                tokens[k * width + l] = match &self.weights {
                    Weights::Count => count
                        .iter()
                        .enumerate()
                        .map(|(f, &c)| u64::from(c) * f.min(l + 1) as u64)
                        .sum::<u64>() as f64,
                    Weights::Probability(w) => token_sum(row, w, l as u32),
                };
            }
        }
        self.tables = Tables {
            built: true,
            by_outcome,
            bucket,
            bucket_start,
            tokens,
        };
        if k_n <= UL_TABLE_MAX_DEVICES {
            self.ul_table = UlTable::unset(k_n);
        }
    }

    /// Number of devices K.
    pub(crate) fn devices(&self) -> usize {
        self.order.len()
    }

    /// Number of outcomes N.
    pub(crate) fn count(&self) -> usize {
        self.samples.count()
    }

    /// The outcomes.
    pub(crate) fn samples(&self) -> &Samples {
        &self.samples
    }

    /// The weight of outcome `s` under [`Weights::Probability`] (1 under [`Weights::Count`]).
    pub(crate) fn weight(&self, s: usize) -> f64 {
        match &self.weights {
            Weights::Count => 1.0,
            Weights::Probability(w) => w[s],
        }
    }

    /// The correction's mode rule.
    pub(crate) fn modes(&self) -> ModeScheme {
        self.modes
    }

    /// The position of device `k` in the order rejected sets are kept in.
    pub(crate) fn position(&self, k: usize) -> usize {
        self.position[k]
    }

    /// Whether the tables of moves and bounds are built.
    pub(crate) fn has_tables(&self) -> bool {
        self.tables.built
    }

    /// N_k of device `k` in outcome `s` at draft length `l`.
    #[inline]
    pub(crate) fn tokens(&self, k: usize, s: usize, l: u32) -> u32 {
        u32::from(self.samples.first_rejections()[k * self.samples.count() + s]).min(l + 1)
    }

    /// One entry of the token table: device `k` at draft length `l` (computed when the engine has no table, by
    /// the same expression).
    pub(crate) fn token_entry(&self, k: usize, l: u32) -> f64 {
        if self.has_tables() {
            return self.tables.tokens[k * (self.max_draft_len as usize + 1) + l as usize];
        }
        let n = self.samples.count();
        let row = &self.samples.first_rejections()[k * n..(k + 1) * n];
        match &self.weights {
            Weights::Count => row
                .iter()
                .map(|&f| u64::from(u32::from(f).min(l + 1)))
                .sum::<u64>() as f64,
            Weights::Probability(w) => token_sum(row, w, l),
        }
    }

    /// The outcomes in which device `k` is rejected at cap `hi` but not at cap `lo` (F ∈ (lo, hi]), in order of F,
    /// then of s.
    pub(crate) fn flipping(&self, k: usize, lo: u16, hi: u16) -> &[u32] {
        let n = self.samples.count();
        let stride = self.max_draft_len as usize + 3;
        let from = self.tables.bucket_start[k * stride + usize::from(lo) + 1] as usize;
        let to = self.tables.bucket_start[k * stride + usize::from(hi) + 1] as usize;
        &self.tables.bucket[k * n + from..k * n + to]
    }

    /// Full evaluation of the point with draft lengths `draft_lengths` (by device) and rejection caps `caps` (by position,
    /// from [`GoodputEngine::caps`]) at base latency `base` (everything but T_comm): its per-outcome totals and its value
    /// under `objective`. The rejected sets are kept when `keep_sets` (for one-device moves to edit).
    pub(crate) fn evaluate(
        &self,
        draft_lengths: &[u32],
        caps: &[u16],
        base: f64,
        objective: Objective,
        keep_sets: bool,
    ) -> (Totals, f64) {
        let n = self.samples.count();
        let k_n = self.devices();
        let first = self.samples.first_rejections();
        let mut tokens = vec![0u32; n];
        // Device by device over its row of F (contiguous, so the additions run as vector instructions; no rows
        // when N = 0).
        for (&l, fs) in draft_lengths.iter().zip(first.chunks_exact(n.max(1))) {
            for (t, &f) in tokens.iter_mut().zip(fs) {
                *t += u32::from(f).min(l + 1);
            }
        }
        let mut comm = vec![0.0; n];
        let mut rejected = vec![0u32; n];
        let mut sets = if keep_sets { vec![0u32; n * k_n] } else { vec![] };
        let mut sums = if keep_sets { vec![0.0; n * k_n] } else { vec![] };
        // A point where no device can be rejected has T_comm = 0 in every outcome: no scan needed.
        if caps.iter().any(|&c| c > 0) {
            let mut buf = SetBuf::default();
            for s in 0..n {
                comm[s] = self.comm(s, caps, &mut buf).0;
                let m = buf.set.len();
                rejected[s] = m as u32;
                if keep_sets {
                    let at = s * k_n;
                    sets[at..at + m].copy_from_slice(&buf.set);
                    sums[at..at + m].copy_from_slice(&buf.sums);
                }
            }
        }
        let (tokens_total, comm_total) = match &self.weights {
            Weights::Count => (
                tokens.iter().map(|&t| u64::from(t)).sum::<u64>() as f64,
                comm.iter().fold(0.0, |acc, c| acc + c),
            ),
            Weights::Probability(w) => (
                draft_lengths
                    .iter()
                    .enumerate()
                    .map(|(k, &l)| self.token_entry(k, l))
                    .sum(),
                comm.iter().zip(w).map(|(c, w)| c * w).sum(),
            ),
        };
        let totals = Totals {
            tokens,
            comm,
            rejected,
            sets,
            sums,
            tokens_total,
            comm_total,
        };
        let value = self.value(&totals, base, objective);
        (totals, value)
    }

    /// The value of a point from its totals, at base latency `base`.
    pub(crate) fn value(&self, totals: &Totals, base: f64, objective: Objective) -> f64 {
        let n = self.samples.count() as f64;
        match (&self.weights, objective) {
            (Weights::Count, Objective::Rate) => (totals.tokens_total / n) / (base + totals.comm_total / n),
            (Weights::Count, Objective::MeanRatio) => {
                let mut acc = 0.0;
                for (&t, &c) in totals.tokens.iter().zip(&totals.comm) {
                    acc += f64::from(t) / (base + c);
                }
                acc / n
            }
            (Weights::Probability(_), Objective::Rate) => totals.tokens_total / (base + totals.comm_total),
            (Weights::Probability(w), Objective::MeanRatio) => totals
                .tokens
                .iter()
                .zip(&totals.comm)
                .zip(w)
                .map(|((&t, &c), w)| w * f64::from(t) / (base + c))
                .sum(),
        }
    }

    /// The outcomes `moves` flip (a device enters or leaves their rejected set: F ∈ (min cap, max cap]), into
    /// `flips.flipped` in the order found, each outcome marked in `flips.mark`.
    fn mark_flipped(&self, moves: &[DeviceMove], flips: &mut Flips) {
        let n = self.samples.count();
        flips.flipped.clear();
        flips.mark.resize(n, false);
        for m in moves {
            let (lo, hi) = (m.cap.0.min(m.cap.1), m.cap.0.max(m.cap.1));
            for &s in self.flipping(m.device, lo, hi) {
                if !flips.mark[s as usize] {
                    flips.mark[s as usize] = true;
                    flips.flipped.push(s);
                }
            }
        }
    }

    /// The rejected set of flipped outcome `s` after `moves` from `from`, into `buf`: one edit of the set `from`
    /// keeps when one device moves, else a scan at `caps` (the caps after the move).
    fn set_after(&self, from: &Totals, moves: &[DeviceMove], s: usize, caps: &[u16], buf: &mut SetBuf) {
        if let [m] = moves
            && !from.sets.is_empty()
        {
            let at = s * self.devices();
            let row = at..at + from.rejected[s] as usize;
            self.edit(
                &from.sets[row.clone()],
                &from.sums[row],
                self.position[m.device] as u32,
                buf,
            );
        } else {
            self.scan(s, caps, buf);
        }
    }

    /// The value after `moves` (distinct devices) from the point with totals `from`, whose caps after the move
    /// are `caps` (by position), at base latency `base`: T_comm is recomputed only in the outcomes the move flips,
    /// and the totals are updated as a full evaluation would sum them (bit for bit: under [`Weights::Count`] the
    /// T_comm total is summed again in outcome order; under [`Weights::Probability`] it is the update that applying
    /// the move makes). `flips` keeps what it computed for [`GoodputEngine::apply`].
    pub(crate) fn try_moves(
        &self,
        from: &Totals,
        moves: &[DeviceMove],
        caps: &[u16],
        base: f64,
        objective: Objective,
        flips: &mut Flips,
    ) -> f64 {
        let n = self.samples.count();
        self.mark_flipped(moves, flips);
        flips.by_outcome.resize(n, 0.0);
        flips.comm.clear();
        flips.rejected.clear();
        let mut buf = std::mem::take(&mut flips.buf);
        let mut comm_total = from.comm_total;
        for &s in &flips.flipped {
            let s = s as usize;
            self.set_after(from, moves, s, caps, &mut buf);
            let c = self.comm_of_set(s, &buf.set, &buf.sums).0;
            if let Weights::Probability(w) = &self.weights {
                comm_total += w[s] * (c - from.comm[s]);
            }
            flips.by_outcome[s] = c;
            flips.comm.push(c);
            flips.rejected.push(buf.set.len() as u32);
        }
        flips.buf = buf;
        let mut tokens_total = from.tokens_total;
        for m in moves {
            tokens_total += self.token_entry(m.device, m.len.1) - self.token_entry(m.device, m.len.0);
        }
        let mark = &flips.mark;
        let after = |s: usize| {
            if mark[s] {
                flips.by_outcome[s]
            } else {
                from.comm[s]
            }
        };
        let tokens_after = |s: usize| {
            let mut t = from.tokens[s];
            for m in moves {
                t = t + self.tokens(m.device, s, m.len.1) - self.tokens(m.device, s, m.len.0);
            }
            t
        };
        let nf = n as f64;
        let value = match (&self.weights, objective) {
            (Weights::Count, Objective::Rate) => {
                comm_total = 0.0;
                for s in 0..n {
                    comm_total += after(s);
                }
                (tokens_total / nf) / (base + comm_total / nf)
            }
            (Weights::Count, Objective::MeanRatio) => {
                comm_total = 0.0;
                let mut acc = 0.0;
                for s in 0..n {
                    let c = after(s);
                    comm_total += c;
                    acc += f64::from(tokens_after(s)) / (base + c);
                }
                acc / nf
            }
            (Weights::Probability(_), Objective::Rate) => tokens_total / (base + comm_total),
            (Weights::Probability(w), Objective::MeanRatio) => {
                let mut acc = 0.0;
                for (s, w) in w.iter().enumerate() {
                    acc += w * f64::from(tokens_after(s)) / (base + after(s));
                }
                acc
            }
        };
        for &s in &flips.flipped {
            flips.mark[s as usize] = false;
        }
        flips.tokens_total = tokens_total;
        flips.comm_total = comm_total;
        flips.value = value;
        value
    }

    /// Moves the point with totals `totals` by `moves`, from what [`GoodputEngine::try_moves`] of the same move from the
    /// same point left in `flips` (`caps` are the caps after the move, for the sets a point keeps): the totals a
    /// full evaluation gives at the new point, bit for bit, with only the flipped outcomes written.
    pub(crate) fn apply(&self, totals: &mut Totals, moves: &[DeviceMove], caps: &[u16], flips: &mut Flips) {
        for m in moves {
            let (old, new) = m.len;
            if new != old {
                let n = self.samples.count();
                let fs = &self.samples.first_rejections()[m.device * n..(m.device + 1) * n];
                for (t, &f) in totals.tokens.iter_mut().zip(fs) {
                    let f = u32::from(f);
                    *t = *t + f.min(new + 1) - f.min(old + 1);
                }
            }
        }
        let mut buf = std::mem::take(&mut flips.buf);
        for ((&s, &c), &r) in flips.flipped.iter().zip(&flips.comm).zip(&flips.rejected) {
            let s = s as usize;
            totals.comm[s] = c;
            if totals.sets.is_empty() {
                totals.rejected[s] = r;
            } else {
                // The kept values spare T_comm; the new set still has to be stored (from the set before, which
                // this outcome has not overwritten yet).
                self.set_after(totals, moves, s, caps, &mut buf);
                debug_assert_eq!(buf.set.len() as u32, r);
                let at = s * self.devices();
                totals.sets[at..at + buf.set.len()].copy_from_slice(&buf.set);
                totals.sums[at..at + buf.set.len()].copy_from_slice(&buf.sums);
                totals.rejected[s] = r;
            }
        }
        flips.buf = buf;
        totals.tokens_total = flips.tokens_total;
        totals.comm_total = flips.comm_total;
    }
}

/// Σ_s w_s min(F_s, l + 1) over one device's row of F: its expected tokens at draft length `l` (one entry of the
/// token table, or what an engine without the table computes, the same expression in the same order).
fn token_sum(row: &[u16], weight: &[f64], l: u32) -> f64 {
    let cap = l + 1;
    row.iter()
        .zip(weight)
        .map(|(&f, w)| w * f64::from(u32::from(f).min(cap)))
        .sum()
}
