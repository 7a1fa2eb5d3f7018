//! Paper B's outcome samples (§V-B): per sample and device the position F of the first rejection, geometric with
//! P(F = j) = α^{j−1}(1 − α) and capped at L_max + 1, and a random-mode coin, drawn once from a seed and shared
//! by every candidate plan (common random numbers). Both evaluators read them: paper B's SAA directly, the unified
//! model as its sampled outcomes.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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
    /// Draws `count` samples for devices with acceptance rates `acceptance` (validated, in (0, 1)) from `seed`.
    ///
    /// Draw order is sample-major (for s, for k: one uniform for F, one for the coin), so a sample's outcome does
    /// not depend on how many samples follow it.
    pub fn draw(acceptance: &[f64], count: usize, max_draft_len: u32, seed: u64) -> Self {
        let k_n = acceptance.len();
        let cap = max_draft_len + 1;
        let log_alpha: Vec<f64> = acceptance.iter().map(|a| a.ln()).collect();
        let thresholds = Thresholds::new(acceptance, cap);
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

    /// Outcomes given directly: `first_rejection` device-major as [`Samples::draw`] stores it, and `ul_coin` in
    /// the same layout, or empty where nothing reads the coins (the unified model's enumerated outcomes, or its
    /// samples, whose coins come from their own stream).
    pub(crate) fn from_parts(
        devices: usize,
        count: usize,
        first_rejection: Vec<u16>,
        ul_coin: Vec<bool>,
    ) -> Samples {
        debug_assert_eq!(first_rejection.len(), devices * count);
        debug_assert!(ul_coin.is_empty() || ul_coin.len() == devices * count);
        Samples {
            devices,
            count,
            first_rejection,
            ul_coin,
        }
    }

    /// The random-mode coin of device `k` in sample `s` (true = UL).
    pub(crate) fn ul_coin(&self, k: usize, s: usize) -> bool {
        self.ul_coin[k * self.count + s]
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::RngExt;

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
}
