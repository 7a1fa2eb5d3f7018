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

use super::reactive::{Link, ModeScheme};
use super::scenario::Scenario;
use crate::OptimizeError;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};

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
        let thresholds = Thresholds::new(alpha, cap);
        let mut first_rejection = vec![0u16; k_n * count];
        let mut ul_coin = vec![false; k_n * count];
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // The generator's output in blocks: `fill_bytes` hands out the same 32-bit words in the same order as the
        // two-word `next_u64` calls of `random::<f64>` and `random_bool` (little-endian pairs), so the same draws.
        let mut block = [0u8; 8 * DRAW_BLOCK];
        let mut words = 0..0;
        let mut next = |rng: &mut ChaCha8Rng| {
            let i = match words.next() {
                Some(i) => i,
                None => {
                    rng.fill_bytes(&mut block);
                    words = 1..DRAW_BLOCK;
                    0
                }
            };
            u64::from_le_bytes(block[8 * i..8 * i + 8].try_into().expect("8 bytes"))
        };
        for s in 0..count {
            for k in 0..k_n {
                // Inverse transform: P(F > j) = α^j, so F = 1 + ⌊ln(1 − u) / ln α⌋ with 1 − u ∈ (0, 1], u the
                // 53-bit float `random::<f64>` makes of one word.
                let u = (next(&mut rng) >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                let x = 1.0 - u;
                let f = thresholds
                    .count(k, x)
                    .unwrap_or_else(|| first_rejection_by_log(x, log_alpha[k], cap));
                first_rejection[k * count + s] = f.min(cap) as u16;
                // `random_bool(0.5)`: true iff the word is below 0.5·2^64.
                ul_coin[k * count + s] = next(&mut rng) < 1 << 63;
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

    /// Number of devices K.
    pub fn devices(&self) -> usize {
        self.devices
    }

    /// Every F, device-major (F of device k in sample s at k·N + s).
    pub(crate) fn first_rejections(&self) -> &[u16] {
        &self.first_rejection
    }
}

/// F = 1 + ⌊ln x / ln α⌋ capped at `cap`, from x = 1 − u ∈ (0, 1] and `log_alpha` = ln α.
fn first_rejection_by_log(x: f64, log_alpha: f64, cap: u32) -> u32 {
    // q ≥ 0 (ln x ≤ 0, ln α < 0), so ⌊q⌋ < cap iff q < cap, and then ⌊q⌋ is the truncation `as` takes (NaN and ∞
    // fail the test and give cap).
    let q = x.ln() / log_alpha;
    if q < f64::from(cap) { 1 + q as u32 } else { cap }
}

/// Words of the generator [`Samples::draw`] takes at a time.
const DRAW_BLOCK: usize = 256;

/// The most draft lengths for which [`Samples::draw`] finds F by comparisons instead of a logarithm.
const THRESHOLD_WIDTH: usize = 16;

/// F by comparisons when γ_max ≤ [`THRESHOLD_WIDTH`]: F = 1 + #{j ∈ 1..cap : x ≤ α^j}, since x ≤ α^j iff
/// ln x / ln α ≥ j. Each α^j is held as two bounds a relative 10⁻⁸ below and above it; when x falls between the
/// two bounds of some j the count is not certain and the caller takes the logarithm, as before. Outside them the
/// computed ln x / ln α (a few ulps off the exact ratio) is on the same side of j as the exact one, as long as
/// |ln α^j| ≤ 460 (α^j ≥ 10⁻²⁰⁰; smaller thresholds are below every x ≥ 2⁻⁵³ anyway and count for no j), so the
/// same F bit for bit. Hand written: at γ_max = 8, 16 vector comparisons cost less than the logarithm and the
/// division they replace (the draw takes about 30 % less time).
struct Thresholds {
    /// 8 or [`THRESHOLD_WIDTH`] (the fewer comparisons that hold cap − 1 thresholds), 0 when γ_max is too large.
    width: usize,
    /// Per device, `width` lower bounds then as many upper bounds (−1 past cap − 1: counts for no x).
    bounds: Vec<f64>,
}

impl Thresholds {
    fn new(alpha: &[f64], cap: u32) -> Self {
        const MARGIN: f64 = 1e-8;
        let width = match cap as usize - 1 {
            0..=8 => 8,
            9..=THRESHOLD_WIDTH => THRESHOLD_WIDTH,
            _ => 0,
        };
        let mut bounds = vec![-1.0; 2 * width * alpha.len()];
        if width > 0 {
            for (row, &a) in bounds.chunks_exact_mut(2 * width).zip(alpha) {
                let mut t = 1.0f64;
                for j in 1..cap as usize {
                    t *= a;
                    if t >= 1e-200 {
                        row[j - 1] = t * (1.0 - MARGIN);
                        row[width + j - 1] = t * (1.0 + MARGIN);
                    }
                }
            }
        }
        Thresholds { width, bounds }
    }

    /// F of device `k` at x = 1 − u when certain.
    #[inline]
    fn count(&self, k: usize, x: f64) -> Option<u32> {
        match self.width {
            8 => self.count_in::<8>(k, x),
            THRESHOLD_WIDTH => self.count_in::<THRESHOLD_WIDTH>(k, x),
            _ => None,
        }
    }

    /// [`Self::count`] at width `W` (fixed, so that the comparisons run as vector instructions).
    #[inline]
    fn count_in<const W: usize>(&self, k: usize, x: f64) -> Option<u32> {
        let lo: &[f64; W] = self.bounds[2 * W * k..2 * W * k + W].try_into().ok()?;
        let hi: &[f64; W] = self.bounds[2 * W * k + W..2 * W * (k + 1)].try_into().ok()?;
        let sure = lo.iter().map(|&t| u32::from(x < t)).sum::<u32>();
        let maybe = hi.iter().map(|&t| u32::from(x <= t)).sum::<u32>();
        (sure == maybe).then_some(1 + sure)
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
    /// |R| per sample: the number of rejected devices.
    rejected: Vec<u32>,
    /// Σ_s T_comm, summed in sample order (the latency sum of the rate objective).
    comm_total: f64,
    /// max_k γ_k T_k^dft and a device attaining it.
    draft: (f64, usize),
    /// The objective value at `gamma`.
    pub value: f64,
}

/// Reusable buffers of [`Evaluator::try_moves_with`] and [`Evaluator::apply_moves`], and what the last try
/// computed, so that applying the move just tried does not compute it again.
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    /// γ by position in `order` of the point being evaluated.
    caps: Vec<u16>,
    /// The rejected set of one sample: positions, descending.
    set: Vec<u32>,
    /// Running sums of 1/g over `set` (from the weakest device), as the reactive split needs them.
    sums: Vec<f64>,
    /// Per sample: whether it flips under the move being tried.
    mark: Vec<bool>,
    /// The last try: its start point, changes, flipped samples (ascending) with their new T_comm and |R|, and
    /// its totals and value.
    from: Vec<u32>,
    changes: Vec<(usize, u32)>,
    flipped: Vec<u32>,
    fresh: Vec<f64>,
    fresh_rejected: Vec<u32>,
    tokens_total: u64,
    comm_total: f64,
    value: f64,
    valid: bool,
}

/// The relative margin by which an upper bound must fall below a threshold before a search skips the move, and
/// by which the cheap comparisons of the reactive split must be decided before they are trusted: far above the
/// rounding of either side (a few ulps), so a skip or a shortcut never differs from the exact computation.
pub const BOUND_MARGIN: f64 = 1e-9;

/// Bit i set iff f\[i\] ≤ cap\[i\] (at most 64 entries, every one below 2^15: F ≤ γ_max + 1 ≤ 1001).
///
/// Four 16-bit lanes per step (SWAR): with the lanes' top bits H set in cap, (cap | H) − f keeps lane i's top
/// bit iff f\[i\] ≤ cap\[i\] and never borrows across lanes; one multiplication gathers the four top bits. Hand
/// written because this comparison is the inner loop of every T_comm the searches compute.
fn rejection_mask(f: &[u16], cap: &[u16]) -> u64 {
    const HIGH: u64 = 0x8000_8000_8000_8000;
    // Lane bits at 0, 16, 32, 48 → 48, 49, 50, 51 (the other partial products land below 48 or above 63).
    const GATHER: u64 = (1 << 48) | (1 << 33) | (1 << 18) | (1 << 3);
    let pack = |x: &[u16]| x.iter().rev().fold(0u64, |acc, &v| (acc << 16) | u64::from(v));
    let mut mask = 0u64;
    let (f4, f_rest) = f.split_at(f.len() / 4 * 4);
    let (c4, c_rest) = cap.split_at(f4.len());
    for (i, (a, b)) in f4.chunks_exact(4).zip(c4.chunks_exact(4)).enumerate() {
        let top = ((pack(b) | HIGH) - pack(a)) & HIGH;
        mask |= ((top >> 15).wrapping_mul(GATHER) >> 48) << (4 * i);
    }
    for (i, (&a, &b)) in f_rest.iter().zip(c_rest).enumerate() {
        mask |= u64::from(a <= b) << (f4.len() + i);
    }
    mask
}

/// Marks an entry of the lazy UL-delay table as not computed yet (a NaN pattern no delay takes: the delay of a
/// positive finite gain is a positive number or +∞).
const UNSET: u64 = u64::MAX;

/// τ^ul by (m − 1)·K + position, filled when first asked (see [`UL_TABLE_MAX_DEVICES`]). Atomic cells so that an
/// evaluator stays `Sync` for parallel callers; a race only computes the same value twice.
#[derive(Debug, Default)]
struct UlTable(Vec<AtomicU64>);

impl Clone for UlTable {
    fn clone(&self) -> Self {
        UlTable(
            self.0
                .iter()
                .map(|c| AtomicU64::new(c.load(Ordering::Relaxed)))
                .collect(),
        )
    }
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
    /// The position of each device in `order`.
    position: Vec<usize>,
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
    /// τ^ul by (m − 1)·K + position when K ≤ [`UL_TABLE_MAX_DEVICES`], else empty and computed when asked: the
    /// same function of the same inputs either way, so the same bits.
    ul_table: UlTable,
    /// 1/P_dl.
    inverse_dl_power: f64,
    /// Whether the reactive split may compare SNRs instead of delays: powers and D within 10^±20, gains and noise
    /// powers N0·b within 10^±60, shares within 10^±30, so that every SNR, delay and intermediate product is a
    /// normal number far from overflow and rounds by a few ulps. Else every comparison uses the delays.
    snr_shortcut: bool,
}

/// Up to this many devices an evaluator keeps every UL delay τ^ul(B/m, g_k) it computes (K² cells, 2 MiB at 512):
/// the optimal split asks for at most two of them per sample and evaluation, and a lookup is much cheaper than the
/// logarithm of the Shannon rate. The cells are filled when first asked, since a search asks for few of the K².
/// Above it they are computed when asked, so memory stays linear in K.
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
        let mut position = vec![0; k_n];
        for (pos, &k) in order.iter().enumerate() {
            position[k] = pos;
        }
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
        let mut by_f = vec![0u32; k_n * n];
        let mut f_start = vec![0u32; k_n * (cap + 2)];
        let mut count = vec![0u32; cap + 2];
        let mut next = vec![0u32; cap + 2];
        for k in 0..k_n {
            let fs = &samples.first_rejection[k * n..(k + 1) * n];
            // Counting sort by F (stable in s).
            count.fill(0);
            for &f in fs {
                count[usize::from(f)] += 1;
            }
            let starts = &mut f_start[k * (cap + 2)..(k + 1) * (cap + 2)];
            let mut acc = 0u32;
            for (f, c) in count.iter().enumerate() {
                starts[f] = acc;
                acc += c;
            }
            next.copy_from_slice(starts);
            let row = &mut by_f[k * n..(k + 1) * n];
            for (s, &f) in fs.iter().enumerate() {
                row[next[usize::from(f)] as usize] = s as u32;
                next[usize::from(f)] += 1;
            }
            for g in 0..cap {
                token_sum[k * cap + g] = count
                    .iter()
                    .enumerate()
                    .map(|(f, &c)| u64::from(c) * f.min(g + 1) as u64)
                    .sum();
            }
        }
        let ul_table = if k_n <= UL_TABLE_MAX_DEVICES {
            UlTable((0..k_n * k_n).map(|_| AtomicU64::new(UNSET)).collect())
        } else {
            UlTable::default()
        };
        let within = |x: f64, decades: f64| x >= 10f64.powf(-decades) && x <= 10f64.powf(decades);
        let shares = [link.bandwidth_hz, link.share_hz(k_n.max(1))];
        let snr_shortcut = [link.ul_power_w, link.dl_power_w, link.distribution_bits]
            .iter()
            .all(|&x| within(x, 20.0))
            && gain.iter().all(|&g| within(g, 60.0))
            && shares.iter().all(|&b| {
                within(b, 30.0)
                    && within(link.noise_psd_server_w_per_hz * b, 60.0)
                    && within(link.noise_psd_device_w_per_hz * b, 60.0)
            });
        Ok(Evaluator {
            inverse_dl_power: 1.0 / link.dl_power_w,
            snr_shortcut,
            link,
            policy,
            objective,
            samples,
            max_draft_len: scenario.max_draft_len,
            verify_s: scenario.verify_s(),
            alpha: scenario.devices.iter().map(|d| d.acceptance).collect(),
            draft_token_s: scenario.devices.iter().map(|d| d.draft_token_s).collect(),
            order,
            position,
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

    /// [`Self::draft_s`] and the first device attaining it (0 when every γ is 0).
    fn draft_argmax(&self, gamma: &[u32]) -> (f64, usize) {
        gamma
            .iter()
            .zip(&self.draft_token_s)
            .enumerate()
            .fold((0.0, 0), |(d, at), (k, (&g, t))| {
                let x = f64::from(g) * t;
                if x > d { (x, k) } else { (d, at) }
            })
    }

    /// τ^ul of the device at position `p` in `order` when `m` devices share the band (see `ul_table`).
    #[inline]
    fn ul(&self, m: usize, p: usize) -> f64 {
        match self.ul_table.0.get((m - 1) * self.order.len() + p) {
            Some(cell) => match cell.load(Ordering::Relaxed) {
                UNSET => self.ul_fill(m, p),
                bits => f64::from_bits(bits),
            },
            None => self.ul_delay(m, p),
        }
    }

    /// [`Self::ul`] the first time a table cell is asked for.
    #[cold]
    fn ul_fill(&self, m: usize, p: usize) -> f64 {
        let v = self.ul_delay(m, p);
        self.ul_table.0[(m - 1) * self.order.len() + p].store(v.to_bits(), Ordering::Relaxed);
        v
    }

    /// τ^ul(B/m, g) of the device at position `p`.
    fn ul_delay(&self, m: usize, p: usize) -> f64 {
        self.link.ul_delay_s(self.link.share_hz(m), self.gain[p])
    }

    /// γ by position in `order`, into `caps`.
    fn caps(&self, gamma: &[u32], caps: &mut Vec<u16>) {
        caps.clear();
        // γ ≤ γ_max ≤ MAX_DRAFT_LEN_LIMIT fits 16 bits, as F does.
        caps.extend(self.order.iter().map(|&k| gamma[k] as u16));
    }

    /// The rejected set of sample `s` at `caps` (positions descending) and the running sums of 1/g over it from
    /// the weakest device, into `set` and `sums`: the additions of the suffix sums the reactive split needs, in the
    /// same order, so the same bits.
    fn scan(&self, s: usize, caps: &[u16], set: &mut Vec<u32>, sums: &mut Vec<f64>) {
        let k_n = self.order.len();
        set.resize(k_n, 0);
        sums.resize(k_n, 0.0);
        let row = &self.by_sample[s * k_n..(s + 1) * k_n];
        let (mut m, mut acc) = (0usize, 0.0f64);
        // 64 positions at a time: a mask of the rejected ones, then only those, from the weakest.
        let mut end = k_n;
        while end > 0 {
            let start = end.saturating_sub(64);
            // Bit 63 − i of `reversed` for position start + i: the lowest set bit is the weakest rejected
            // device left, and clearing it (mask & (mask − 1)) does not wait on a bit count.
            let mut reversed = rejection_mask(&row[start..end], &caps[start..end]).reverse_bits();
            while reversed != 0 {
                let i = 63 - reversed.trailing_zeros() as usize;
                reversed &= reversed - 1;
                let pos = start + i;
                acc += self.inverse_gain[pos];
                set[m] = pos as u32;
                sums[m] = acc;
                m += 1;
            }
            end = start;
        }
        set.truncate(m);
        sums.truncate(m);
    }

    /// T_comm of sample `s` at `caps`, the number of rejected devices corrected in UL mode, and |R|.
    fn comm(&self, s: usize, caps: &[u16], set: &mut Vec<u32>, sums: &mut Vec<f64>) -> (f64, usize, usize) {
        self.scan(s, caps, set, sums);
        let (c, ul) = self.comm_of_set(s, set, sums);
        (c, ul, set.len())
    }

    /// T_comm of sample `s` with rejected set `set` (positions descending) and `sums` (running sums of 1/g from
    /// the weakest), and the number of UL devices.
    fn comm_of_set(&self, s: usize, set: &[u32], sums: &[f64]) -> (f64, usize) {
        let m = set.len();
        if m == 0 {
            return (0.0, 0);
        }
        let b = self.link.share_hz(m);
        // The i-th rejected position in UL-delay order (ascending position).
        let at = |i: usize| set[m - 1 - i] as usize;
        match self.policy {
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                // Σ 1/g over the rejected devices from the i-th in UL order on (0 for i = m).
                let sum_from = |i: usize| if i < m { sums[m - 1 - i] } else { 0.0 };
                let (n_ul, delay) = self.split(m, b, at, sum_from);
                (delay, n_ul)
            }
            ModeScheme::AllUl => (self.ul(m, at(m - 1)), m),
            ModeScheme::AllDl => {
                let inv: f64 = (0..m).map(|i| self.inverse_gain[at(i)]).sum();
                (self.link.dl_delay_s(b, inv), 0)
            }
            ModeScheme::Random => {
                let n = self.samples.count;
                let mut ul_max = 0.0f64;
                let mut inv = 0.0;
                let mut n_ul = 0;
                for p in (0..m).map(at) {
                    if self.samples.ul_coin[self.order[p] * n + s] {
                        ul_max = ul_max.max(self.ul(m, p));
                        n_ul += 1;
                    } else {
                        inv += self.inverse_gain[p];
                    }
                }
                (ul_max.max(self.link.dl_delay_s(b, inv)), n_ul)
            }
        }
    }

    /// [`split_by_bisection`](super::reactive::split_by_bisection) with ul(i) = τ^ul of the i-th device and
    /// dl(n) = τ^dl of Σ 1/g = `sum_from(n)`: the same decisions and result bit for bit, with two logarithms
    /// instead of one per step. τ^ul(n) ≥ τ^dl(n) iff the UL SNR of the n-th device is at most the Lemma-1 DL SNR
    /// of the suffix (both delays are D/(b log₂(1 + SNR)) at the same b), and the SNRs need no logarithm. A
    /// comparison decided by less than [`BOUND_MARGIN`], or any comparison outside the ranges of `snr_shortcut`,
    /// uses the delays themselves, as the bisection does.
    fn split(
        &self,
        m: usize,
        b: f64,
        at: impl Fn(usize) -> usize,
        sum_from: impl Fn(usize) -> f64,
    ) -> (usize, f64) {
        let link = &self.link;
        let tau_ul = |n: usize| if n == 0 { 0.0 } else { self.ul(m, at(n - 1)) };
        let dl = |n: usize| link.dl_delay_s(b, sum_from(n));
        // SNR_ul = P_ul g / (N0_ser b), SNR_dl = P_dl / (N0_dev b S): their ratio by products, no division.
        let ul_per_gain = link.ul_power_w / (link.noise_psd_server_w_per_hz * b);
        let dl_noise = link.noise_psd_device_w_per_hz * b;
        // Whether τ^ul < τ^dl at lo and τ^ul ≥ τ^dl at hi hold for the computed delays: at the start (τ^ul(0) = 0,
        // τ^dl(m) = 0) and after a step the SNRs decided by more than the margin, so that the max below is known
        // without computing the other delay.
        let (mut lo, mut hi) = (0usize, m);
        let (mut lo_sure, mut hi_sure) = (true, true);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let sum = sum_from(mid);
            let ratio = self.gain[at(mid - 1)] * ul_per_gain * (dl_noise * sum) * self.inverse_dl_power;
            let (ul_slower, sure) = if self.snr_shortcut && ratio < 1.0 - BOUND_MARGIN {
                (true, true)
            } else if self.snr_shortcut && ratio > 1.0 + BOUND_MARGIN {
                (false, true)
            } else {
                (tau_ul(mid) >= dl(mid), false)
            };
            if ul_slower {
                hi = mid;
                hi_sure = sure;
            } else {
                lo = mid;
                lo_sure = sure;
            }
        }
        // As in `split_by_bisection`: the best is lo (cost τ^dl) or hi (cost τ^ul). When both costs are those
        // delays, the SNRs of hi's UL device and lo's DL suffix decide which is smaller as in the steps above, and
        // hi's cost is a table lookup: no logarithm for τ^dl(lo) when hi wins.
        if self.snr_shortcut && lo_sure && hi_sure {
            let ratio =
                self.gain[at(hi - 1)] * ul_per_gain * (dl_noise * sum_from(lo)) * self.inverse_dl_power;
            if ratio > 1.0 + BOUND_MARGIN {
                return (hi, tau_ul(hi));
            }
            if ratio < 1.0 - BOUND_MARGIN {
                return (lo, dl(lo));
            }
        }
        let cost_lo = if lo_sure { dl(lo) } else { dl(lo).max(tau_ul(lo)) };
        let cost_hi = if hi_sure {
            tau_ul(hi)
        } else {
            tau_ul(hi).max(dl(hi))
        };
        if cost_hi <= cost_lo {
            (hi, cost_hi)
        } else {
            (lo, cost_lo)
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
        self.state_with(gamma, &mut Scratch::default())
    }

    /// [`Self::state`] with reusable buffers.
    pub fn state_with(&self, gamma: &[u32], scratch: &mut Scratch) -> State {
        self.check(gamma);
        let n = self.samples.count;
        let mut tokens = vec![0u32; n];
        // Device by device over its row of F (contiguous, so the additions run as vector instructions; no rows
        // when N = 0).
        for (&g, fs) in gamma
            .iter()
            .zip(self.samples.first_rejection.chunks_exact(n.max(1)))
        {
            for (t, &f) in tokens.iter_mut().zip(fs) {
                *t += u32::from(f).min(g + 1);
            }
        }
        self.caps(gamma, &mut scratch.caps);
        let mut comm_s = Vec::with_capacity(n);
        let mut rejected = Vec::with_capacity(n);
        for s in 0..n {
            let (c, _, m) = self.comm(s, &scratch.caps, &mut scratch.set, &mut scratch.sums);
            comm_s.push(c);
            rejected.push(m as u32);
        }
        let value = self.reduce(
            self.draft_s(gamma),
            tokens.iter().copied(),
            comm_s.iter().copied(),
        );
        State {
            gamma: gamma.to_vec(),
            tokens_total: tokens.iter().map(|&t| u64::from(t)).sum(),
            tokens,
            comm_total: comm_s.iter().fold(0.0, |acc, c| acc + c),
            draft: self.draft_argmax(gamma),
            comm_s,
            rejected,
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

    /// The objective after changing the draft lengths of `state` by `changes` = [(device, new γ)] (distinct
    /// devices), without a full evaluation: only samples where a changed device switches between rejected and
    /// accepted recompute T_comm. Bit-for-bit equal to [`Self::value`] at the changed point.
    pub fn try_moves(&self, state: &State, changes: &[(usize, u32)]) -> f64 {
        self.try_moves_with(state, changes, &mut Scratch::default())
    }

    /// The samples where a device of `changes` switches between rejected and accepted, ascending, into
    /// `scratch.flipped` (from the samples sorted by F: device k switches on min(g, old) < F ≤ max(g, old)).
    fn mark_flipped(&self, state: &State, changes: &[(usize, u32)], scratch: &mut Scratch) {
        let n = self.samples.count;
        let stride = self.max_draft_len as usize + 3;
        scratch.flipped.clear();
        scratch.mark.resize(n, false);
        // One F value of one device lists its samples ascending (the sort by F is stable in s); more need a sort.
        let mut sorted = changes.len() <= 1;
        for &(k, g) in changes {
            let old = state.gamma[k];
            let (lo, hi) = (g.min(old) as usize, g.max(old) as usize);
            sorted &= hi - lo <= 1;
            let (from, to) = (
                self.f_start[k * stride + lo + 1] as usize,
                self.f_start[k * stride + hi + 1] as usize,
            );
            for &s in &self.by_f[k * n + from..k * n + to] {
                if !scratch.mark[s as usize] {
                    scratch.mark[s as usize] = true;
                    scratch.flipped.push(s);
                }
            }
        }
        if !sorted {
            scratch.flipped.sort_unstable();
        }
        for &s in &scratch.flipped {
            scratch.mark[s as usize] = false;
        }
    }

    /// [`Self::try_moves`] with reusable buffers; remembers what it computed in `scratch` for
    /// [`Self::apply_moves`] of the same move from the same state.
    ///
    /// The token total comes from per-device sums (integers, so exact in any order), T_comm is recomputed only on
    /// the flipped samples, and the latency is summed over all samples in sample order as the full evaluation does,
    /// so the result has the same bits as a full evaluation.
    pub fn try_moves_with(&self, state: &State, changes: &[(usize, u32)], scratch: &mut Scratch) -> f64 {
        let cap = self.max_draft_len as usize + 1;
        let mut gamma = std::mem::take(&mut scratch.from);
        gamma.clear();
        gamma.extend_from_slice(&state.gamma);
        for &(k, g) in changes {
            gamma[k] = g;
        }
        self.check(&gamma);
        self.mark_flipped(state, changes, scratch);
        self.caps(&gamma, &mut scratch.caps);
        scratch.fresh.clear();
        scratch.fresh_rejected.clear();
        for &s in &scratch.flipped {
            let (c, _, m) = self.comm(s as usize, &scratch.caps, &mut scratch.set, &mut scratch.sums);
            scratch.fresh.push(c);
            scratch.fresh_rejected.push(m as u32);
        }
        let mut tok = state.tokens_total;
        for &(k, g) in changes {
            let old = state.gamma[k] as usize;
            tok = tok + self.token_sum[k * cap + g as usize] - self.token_sum[k * cap + old];
        }
        // Per-sample T_comm at the new point: fresh on flipped samples, else the state's.
        let mut lat = 0.0;
        let mut next = 0;
        let flipped = &scratch.flipped;
        let fresh = &scratch.fresh;
        let comm_at = |s: usize, next: &mut usize| {
            if *next < flipped.len() && flipped[*next] as usize == s {
                *next += 1;
                fresh[*next - 1]
            } else {
                state.comm_s[s]
            }
        };
        let draft_s = self.draft_s(&gamma);
        let value = match self.objective {
            Objective::Rate => {
                for s in 0..state.comm_s.len() {
                    lat += comm_at(s, &mut next);
                }
                let nf = self.samples.count as f64;
                (tok as f64 / nf) / (draft_s + self.verify_s + lat / nf)
            }
            Objective::MeanRatio => {
                let mut comm = Vec::with_capacity(state.comm_s.len());
                for s in 0..state.comm_s.len() {
                    comm.push(comm_at(s, &mut next));
                }
                lat = comm.iter().fold(0.0, |acc, c| acc + c);
                let tokens = (0..comm.len()).map(|s| {
                    let mut t = state.tokens[s];
                    for &(k, g) in changes {
                        t = t + self.tokens(k, s, g) - self.tokens(k, s, state.gamma[k]);
                    }
                    t
                });
                self.reduce(draft_s, tokens, comm.into_iter())
            }
        };
        scratch.from = gamma;
        for &(k, _) in changes {
            scratch.from[k] = state.gamma[k];
        }
        scratch.changes.clear();
        scratch.changes.extend_from_slice(changes);
        scratch.tokens_total = tok;
        scratch.comm_total = lat;
        scratch.value = value;
        scratch.valid = true;
        value
    }

    /// Moves `state` by `changes` in place: the state [`Self::state`] gives at the new point, bit for bit, with
    /// only the flipped samples recomputed (none when the last [`Self::try_moves_with`] on `scratch` tried this
    /// move from this state).
    pub fn apply_moves(&self, state: &mut State, changes: &[(usize, u32)], scratch: &mut Scratch) {
        let reuse = scratch.valid && scratch.changes == changes && scratch.from == state.gamma;
        if !reuse {
            self.try_moves_with(state, changes, scratch);
        }
        let n = self.samples.count;
        for &(k, g) in changes {
            let old = state.gamma[k];
            let fs = &self.samples.first_rejection[k * n..(k + 1) * n];
            for (t, &f) in state.tokens.iter_mut().zip(fs) {
                let f = u32::from(f);
                *t = *t + f.min(g + 1) - f.min(old + 1);
            }
            state.gamma[k] = g;
        }
        for (i, &s) in scratch.flipped.iter().enumerate() {
            state.comm_s[s as usize] = scratch.fresh[i];
            state.rejected[s as usize] = scratch.fresh_rejected[i];
        }
        state.tokens_total = scratch.tokens_total;
        state.comm_total = scratch.comm_total;
        state.draft = self.draft_argmax(&state.gamma);
        state.value = scratch.value;
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
    pub fn upper_bound(&self, state: &State, changes: &[(usize, u32)]) -> Option<f64> {
        if self.objective != Objective::Rate {
            return None;
        }
        let alone = changes.iter().filter(|&&(k, g)| g < state.gamma[k]).count() == 1;
        let drop = changes
            .iter()
            .filter(|&&(k, g)| g < state.gamma[k])
            .map(|&(k, g)| self.leave_drop(state, k, g, alone))
            .sum();
        Some(self.bound_after_drop(state, changes, drop))
    }

    /// How much Σ_s T_comm can fall at most on the samples where device `k` leaves the rejected set when its γ
    /// falls to `g`: Σ (T_comm − the floor of [`Self::upper_bound`]), with the (m − 1)/m floor only when `alone`
    /// (the only device that leaves).
    pub fn leave_drop(&self, state: &State, k: usize, g: u32, alone: bool) -> f64 {
        let stride = self.max_draft_len as usize + 3;
        let n = self.samples.count;
        let old = state.gamma[k];
        let scaled = alone && matches!(self.policy, ModeScheme::Optimal | ModeScheme::AllUl);
        let pos = self.position[k];
        let from = self.f_start[k * stride + g as usize + 1] as usize;
        let to = self.f_start[k * stride + old as usize + 1] as usize;
        let mut drop = 0.0;
        for &s in &self.by_f[k * n + from..k * n + to] {
            let (c, m) = (state.comm_s[s as usize], state.rejected[s as usize] as usize);
            let keep = if scaled && m > 1 && self.ul_below(m, pos, c) {
                c * (m - 1) as f64 / m as f64
            } else {
                0.0
            };
            drop += c - keep;
        }
        drop
    }

    /// Whether `self.ul(m, pos) < c`, without the logarithm (or a table cell) when bounds on log₂(1 + SNR) from
    /// its binary exponent e and mantissa 1 + f decide it by far: f ≤ log₂(1 + f) ≤ f + 0.0862 on [0, 1), so
    /// D/(b (e + f)) ≥ τ^ul ≥ D/(b (e + f + 0.0862)). Within the ranges of `snr_shortcut` and for SNR ≥ 10⁻³ every
    /// quantity is a normal number a few ulps from its exact value, far inside the 10⁻⁶ margin; otherwise, or
    /// when c is within the margin of the bounds, the delay itself decides.
    fn ul_below(&self, m: usize, pos: usize, c: f64) -> bool {
        const MARGIN: f64 = 1e-6;
        let link = &self.link;
        // 1/b = m/B; the comparisons below are multiplied out (no division by log₂).
        let per_hz = m as f64 / link.bandwidth_hz;
        let snr = link.ul_power_w * self.gain[pos] * per_hz / link.noise_psd_server_w_per_hz;
        if self.snr_shortcut && snr >= 1e-3 {
            let bits = (1.0 + snr).to_bits();
            let e = ((bits >> 52) & 0x7ff) as f64 - 1023.0;
            let f = f64::from_bits((bits & ((1 << 52) - 1)) | 1f64.to_bits()) - 1.0;
            let per = link.distribution_bits * per_hz;
            if per * (1.0 + MARGIN) < c * (e + f) {
                return true;
            }
            if per > c * (1.0 + MARGIN) * (e + f + 0.0862) {
                return false;
            }
        }
        self.ul(m, pos) < c
    }

    /// The bound of [`Self::upper_bound`] (rate objective) when Σ_s T_comm falls by at most `drop` (from
    /// [`Self::leave_drop`] of the leaving devices).
    pub fn bound_after_drop(&self, state: &State, changes: &[(usize, u32)], drop: f64) -> f64 {
        let cap = self.max_draft_len as usize + 1;
        let mut tok = state.tokens_total;
        for &(k, g) in changes {
            let old = state.gamma[k];
            tok = tok + self.token_sum[k * cap + g as usize] - self.token_sum[k * cap + old as usize];
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
        let floor = (state.comm_total - drop - 1e-12 * state.comm_total).max(0.0);
        let nf = self.samples.count as f64;
        (tok as f64 / nf) / (draft_s + self.verify_s + floor / nf)
    }

    /// Both objectives and the mode statistics of `gamma`.
    pub fn stats(&self, gamma: &[u32]) -> RoundStats {
        self.check(gamma);
        let n = self.samples.count;
        let k_n = self.devices();
        let base = self.draft_s(gamma) + self.verify_s;
        let mut sc = Scratch::default();
        self.caps(gamma, &mut sc.caps);
        let (mut tok, mut lat, mut comm_sum, mut ratio) = (0u64, 0.0, 0.0, 0.0);
        let (mut n_rej, mut n_ul) = (0usize, 0usize);
        for s in 0..n {
            let t: u32 = (0..k_n).map(|k| self.tokens(k, s, gamma[k])).sum();
            let (c, ul, m) = self.comm(s, &sc.caps, &mut sc.set, &mut sc.sums);
            n_rej += m;
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
    use crate::paper_b::reactive::split_by_bisection;
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
    fn draws_by_thresholds_and_blocks_equal_the_floor_of_every_draw() {
        // The draw as written before: ⌊q⌋ by a call to floor, one `random` and one `random_bool` per device.
        let reference = |alpha: &[f64], count: usize, max_draft_len: u32, seed: u64| {
            let cap = max_draft_len + 1;
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut f = vec![0u16; alpha.len() * count];
            let mut coins = vec![false; alpha.len() * count];
            for s in 0..count {
                for (k, a) in alpha.iter().enumerate() {
                    let u: f64 = rng.random();
                    let j = ((1.0 - u).ln() / a.ln()).floor();
                    let v = if j.is_finite() && j < f64::from(cap) {
                        1 + j as u32
                    } else {
                        cap
                    };
                    f[k * count + s] = v.min(cap) as u16;
                    coins[k * count + s] = rng.random_bool(0.5);
                }
            }
            (f, coins)
        };
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        let extremes = [
            1e-300,
            1e-9,
            0.001,
            0.5,
            0.999,
            1.0 - 1e-12,
            1.0 - f64::EPSILON / 2.0,
        ];
        for case in 0..40 {
            let k = rng.random_range(1..6);
            let mut alpha: Vec<f64> = (0..k).map(|_| rng.random_range(0.01..0.999)).collect();
            alpha[0] = extremes[case % extremes.len()];
            let g_max = [1, 3, 8, 20, 200, 999, 15, 16, 17][case % 9];
            for count in [1, 50, 400] {
                let seed = rng.random();
                let got = Samples::draw(&alpha, count, g_max, seed);
                let (f, coins) = reference(&alpha, count, g_max, seed);
                assert_eq!(got.first_rejection, f, "α {alpha:?} γ_max {g_max}");
                assert_eq!(got.ul_coin, coins, "α {alpha:?} γ_max {g_max}");
            }
        }
        let samples = Samples::draw(&[0.5; 3], 20_000, 8, 1);
        assert_eq!(
            (samples.first_rejection, samples.ul_coin),
            reference(&[0.5; 3], 20_000, 8, 1)
        );
    }

    #[test]
    fn thresholds_near_every_power_of_alpha_give_the_logarithms_f() {
        let mut rng = ChaCha8Rng::seed_from_u64(61);
        let mut certain = 0;
        for case in 0..300 {
            let cap = 1 + rng.random_range(1..=THRESHOLD_WIDTH as u32);
            let alpha: Vec<f64> = (0..4)
                .map(|i| match (case + i) % 5 {
                    0 => 1.0 - f64::EPSILON / 2.0,
                    1 => 10f64.powf(rng.random_range(-300.0..-1.0)),
                    _ => rng.random_range(0.001..0.9999),
                })
                .collect();
            let th = Thresholds::new(&alpha, cap);
            for (k, &a) in alpha.iter().enumerate() {
                for j in 0..=cap {
                    let t = a.powi(j as i32);
                    for rel in [0.0, 1e-16, 1e-12, 1e-9, 2e-8, 1e-6, 1e-3] {
                        for x in [t * (1.0 - rel), t * (1.0 + rel), t.next_up(), t.next_down()] {
                            // x = 1 − u for u a multiple of 2⁻⁵³ in [0, 1).
                            let u = ((1.0 - x.clamp(0.0, 1.0)) * (1u64 << 53) as f64).floor();
                            let x = 1.0 - u.min(((1u64 << 53) - 1) as f64) / (1u64 << 53) as f64;
                            let want = first_rejection_by_log(x, a.ln(), cap);
                            if let Some(f) = th.count(k, x) {
                                certain += 1;
                                assert_eq!(f, want, "α {a} cap {cap} x {x}");
                            }
                        }
                    }
                }
            }
        }
        assert!(certain > 10_000, "{certain} certain counts");
        assert_eq!(Thresholds::new(&[0.5], THRESHOLD_WIDTH as u32 + 2).width, 0);
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
            assert!(!tabled.ul_table.0.is_empty());
            let mut computed = tabled.clone();
            computed.ul_table.0.clear();
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
        for policy in SAA_POLICIES {
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
                        ev.value(&moved).to_bits(),
                        "{policy:?} {objective:?} {changes:?} {gamma:?}"
                    );
                }
            }
        }
    }

    /// T_comm as the evaluator computed it before the shortcuts: a scan of all devices in gain order, the
    /// running sums of 1/g built from the weakest, and [`split_by_bisection`] on the UL delays themselves.
    fn reference_comm(ev: &Evaluator, s: usize, gamma: &[u32]) -> f64 {
        let k_n = ev.devices();
        let rejected: Vec<usize> = (0..k_n)
            .filter(|&pos| u32::from(ev.by_sample[s * k_n + pos]) <= gamma[ev.order[pos]])
            .collect();
        let m = rejected.len();
        if m == 0 {
            return 0.0;
        }
        let b = ev.link.share_hz(m);
        let ul = |p: usize| ev.link.ul_delay_s(b, ev.gain[p]);
        match ev.policy {
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                let mut buf = vec![0.0; m + 1];
                for i in (0..m).rev() {
                    buf[i] = buf[i + 1] + ev.inverse_gain[rejected[i]];
                }
                split_by_bisection(m, |i| ul(rejected[i]), |n_dl| ev.link.dl_delay_s(b, buf[n_dl])).1
            }
            ModeScheme::AllUl => ul(rejected[m - 1]),
            ModeScheme::AllDl => {
                let inv: f64 = rejected.iter().map(|&p| ev.inverse_gain[p]).sum();
                ev.link.dl_delay_s(b, inv)
            }
            ModeScheme::Random => {
                let n = ev.samples.count;
                let (mut ul_max, mut inv) = (0.0f64, 0.0);
                for &p in &rejected {
                    if ev.samples.ul_coin[ev.order[p] * n + s] {
                        ul_max = ul_max.max(ul(p));
                    } else {
                        inv += ev.inverse_gain[p];
                    }
                }
                ul_max.max(ev.link.dl_delay_s(b, inv))
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
    fn rejection_masks_equal_the_comparisons() {
        let mut rng = ChaCha8Rng::seed_from_u64(33);
        for len in 0..=64 {
            for _ in 0..20 {
                let top = [2u16, 10, 1001][rng.random_range(0..3)];
                let f: Vec<u16> = (0..len).map(|_| rng.random_range(1..=top)).collect();
                let cap: Vec<u16> = (0..len).map(|_| rng.random_range(0..=top - 1)).collect();
                let want = (0..len).fold(0u64, |m, i| m | (u64::from(f[i] <= cap[i]) << i));
                assert_eq!(rejection_mask(&f, &cap), want, "{f:?} {cap:?}");
            }
        }
    }

    #[test]
    fn comm_equals_the_reference_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        let mut fallbacks = 0;
        for case in 0..24 {
            let k = [1, 2, 5, 17, 40, 64][case % 6];
            let mut sc = spread(&mut rng, k);
            if case % 4 == 3 {
                // A gain outside the SNR shortcut's range: every comparison of the split on the delays.
                let mut spec = sc.spec().clone();
                spec.devices[0].channel_gain = 1e-70;
                sc = Scenario::new(spec).unwrap();
            }
            for policy in SAA_POLICIES {
                let ev = Evaluator::new(&sc, policy, Objective::Rate).unwrap();
                assert_eq!(ev.snr_shortcut, case % 4 != 3);
                let gamma: Vec<u32> = (0..k).map(|_| rng.random_range(0..=sc.max_draft_len)).collect();
                let state = ev.state(&gamma);
                for s in 0..ev.samples.count {
                    let want = reference_comm(&ev, s, &gamma);
                    assert_eq!(
                        state.comm_s[s].to_bits(),
                        want.to_bits(),
                        "case {case} {policy:?} s={s}"
                    );
                }
            }
        }
        // Ties between the SNRs (the fallback) on purpose: two devices, every sample rejected, the DL SNR of
        // the weaker device alone (even cases: a step of the bisection) or of both (odd: the final choice between
        // lo = 0 and hi = 1) equal to the UL SNR of the stronger.
        for case in 0..100 {
            let mut spec = example(2);
            spec.max_draft_len = 1;
            spec.saa_samples = 50;
            spec.seed = rng.random();
            let (g0, g1) = (
                10f64.powf(rng.random_range(-13.0..-11.0)),
                10f64.powf(rng.random_range(-14.0..-13.0)),
            );
            spec.devices[0].channel_gain = g0;
            spec.devices[1].channel_gain = g1;
            spec.devices[0].acceptance = 0.3;
            spec.devices[1].acceptance = 0.3;
            // snr_ul(g0) = P_ul g0/(N0s b) and snr_dl(S) = P_dl/(N0d b Σ_S 1/g) are equal when
            // P_dl = P_ul g0 N0d Σ_S 1/g / N0s.
            let inverse_sum = if case % 2 == 0 {
                1.0 / g1
            } else {
                1.0 / g0 + 1.0 / g1
            };
            spec.dl_power_w = spec.ul_power_w * g0 * spec.noise_psd_device_w_per_hz * inverse_sum
                / spec.noise_psd_server_w_per_hz;
            let sc = Scenario::new(spec).unwrap();
            let ev = Evaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
            let state = ev.state(&[1, 1]);
            for s in 0..ev.samples.count {
                assert_eq!(
                    state.comm_s[s].to_bits(),
                    reference_comm(&ev, s, &[1, 1]).to_bits()
                );
                fallbacks += usize::from(state.rejected[s] == 2);
            }
        }
        assert!(fallbacks > 0, "no sample had both devices rejected");
    }

    #[test]
    fn ul_below_decides_as_the_delay_does() {
        let mut rng = ChaCha8Rng::seed_from_u64(71);
        let mut decided = [0usize; 2];
        for case in 0..40 {
            let k = [2, 9, 40][case % 3];
            let sc = spread(&mut rng, k);
            let ev = Evaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).unwrap();
            for _ in 0..200 {
                let (m, pos) = (rng.random_range(1..=k), rng.random_range(0..k));
                let ul = ev.ul_delay(m, pos);
                let rel = [0.0, 1e-15, 1e-9, 1e-6, 1e-4, 0.01, 0.1, 0.5, 2.0][rng.random_range(0..9)];
                for c in [ul * (1.0 + rel), ul * (1.0 - rel), ul.next_up(), ul.next_down()] {
                    let want = ul < c;
                    assert_eq!(ev.ul_below(m, pos, c), want, "m {m} pos {pos} ul {ul} c {c}");
                    decided[usize::from(want)] += 1;
                }
            }
        }
        assert!(decided[0] > 1000 && decided[1] > 1000, "{decided:?}");
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
                    let ev = Evaluator::new(&sc, policy, objective).unwrap();
                    let gamma: Vec<u32> = (0..k).map(|_| rng.random_range(0..=g_max)).collect();
                    let mut state = ev.state(&gamma);
                    let mut scratch = Scratch::default();
                    for step in 0..30 {
                        // One, two (distinct) or all devices, by ±1 or a jump.
                        let mut changes: Vec<(usize, u32)> = Vec::new();
                        let count = [1, 2, k][step % 3].min(k);
                        for d in rand::seq::index::sample(&mut rng, k, count) {
                            changes.push((d, rng.random_range(0..=g_max)));
                        }
                        let mut moved = state.gamma.clone();
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
                            ev.try_moves_with(&state, &[(0, state.gamma[0])], &mut scratch);
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
