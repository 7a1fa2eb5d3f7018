//! Measurements the papers made, on real models: acceptance rate per prompt set (paper A Table I), batched
//! verification latency against K with the affine fit T_fix + K·T_lin (paper A eq. 7, Fig. 5), per-token drafting
//! latency, and empirical goodput against draft length beside the paper-A formula (eq. 13, Fig. 3).

use crate::error::{Result, RuntimeError};
use crate::model::{KvCache, Model};
use crate::speculative::{SpecConfig, Speculator};
use crate::tokenizer::Tokenizer;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use spin_core::SamplingParams;
use std::time::Instant;

/// Cuts `count` prompts from a text file's non-empty lines (chosen with `seed`): the first `words` words of each.
pub fn prompts_from_text(
    text: &str,
    tok: &Tokenizer,
    count: usize,
    words: usize,
    seed: u64,
) -> Result<Vec<Vec<u32>>> {
    let mut lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.split_whitespace().count() > words)
        .collect();
    if lines.len() < count {
        return Err(RuntimeError::invalid(
            "prompts",
            format!(
                "the text has {} lines longer than {words} words, {count} needed",
                lines.len()
            ),
        ));
    }
    lines.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed));
    lines[..count]
        .iter()
        .map(|l| {
            let cut: Vec<&str> = l.split_whitespace().take(words).collect();
            tok.encode(&cut.join(" "), true)
        })
        .collect()
}

/// Per-prompt acceptance rate: the mean of min(1, p(y)/q(y)) over every drafted token of `new_tokens` generated
/// tokens (docs/model.md §1), all prompts run as devices of one speculative batch. After every round, `progress` gets
/// the number of tokens generated so far over all prompts (at most `prompts.len() · new_tokens`).
#[allow(clippy::too_many_arguments)]
pub fn acceptance_per_prompt(
    target: &Model,
    drafter: &Model,
    prompts: &[Vec<u32>],
    draft_len: usize,
    new_tokens: usize,
    params: SamplingParams,
    seed: u64,
    progress: &mut dyn FnMut(usize),
) -> Result<Vec<f64>> {
    let cfg = SpecConfig {
        params,
        max_new_tokens: new_tokens,
        eos: None,
        seed,
    };
    let mut s = Speculator::new(target, drafter, prompts, &vec![draft_len; prompts.len()], cfg)?;
    while s.step()? {
        progress(
            s.devices
                .iter()
                .map(|d| d.generated().len().min(new_tokens))
                .sum(),
        );
    }
    s.devices
        .iter()
        .enumerate()
        .map(|(k, d)| {
            d.alpha.ratio_estimate(1.96)?.map(|e| e.value).ok_or_else(|| {
                RuntimeError::invalid(
                    format!("prompts[{k}]"),
                    "drafted fewer than two tokens: raise new_tokens",
                )
            })
        })
        .collect()
}

/// Mean and sample standard deviation.
pub fn mean_std(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = if xs.len() > 1 {
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Median wall time in seconds of a padded batch verification for every K in `ks`: the medians of
/// [`verify_latency_samples`].
pub fn verify_latency_s(
    model: &Model,
    ks: &[usize],
    prefix_len: usize,
    draft_len: usize,
    reps: usize,
    progress: &mut dyn FnMut(),
) -> Result<Vec<f64>> {
    let samples = verify_latency_samples(model, ks, prefix_len, draft_len, reps, progress)?;
    Ok(samples.iter().map(|t| median(t)).collect())
}

/// Largest batch a verification sweep accepts: K sequences of up to max_seq_len positions each hold a KV cache,
/// so the bound is checked before anything is allocated.
pub const MAX_VERIFY_BATCH: usize = 4096;

/// Every timed pass of a padded batch verification, in seconds: `out[i][r]` is round r's time for K = `ks[i]`,
/// K sequences of `prefix_len` tokens each scoring `draft_len + 1` new positions (paper A eq. 7).
///
/// The K values are interleaved: each of the `reps` rounds times one pass of every K, starting from a different
/// K each round, so that a machine whose speed drifts during the sweep (other load, clock changes) moves every K
/// alike instead of bending the fit. One untimed pass of every K comes first (it grows the caches' capacity and
/// warms the allocator and the thread pool). `progress` is called after each timed round.
pub fn verify_latency_samples(
    model: &Model,
    ks: &[usize],
    prefix_len: usize,
    draft_len: usize,
    reps: usize,
    progress: &mut dyn FnMut(),
) -> Result<Vec<Vec<f64>>> {
    if ks.is_empty() || ks.contains(&0) {
        return Err(RuntimeError::invalid(
            "ks",
            "must be a non-empty list of positive batch sizes",
        ));
    }
    if let Some(&k) = ks.iter().find(|&&k| k > MAX_VERIFY_BATCH) {
        return Err(RuntimeError::invalid(
            "ks",
            format!("batch {k} exceeds the limit of {MAX_VERIFY_BATCH}"),
        ));
    }
    if prefix_len == 0 || reps == 0 {
        return Err(RuntimeError::invalid("prefix_len, reps", "must be positive"));
    }
    let max_seq = model.config().max_seq_len;
    if prefix_len.saturating_add(draft_len).saturating_add(1) > max_seq {
        return Err(RuntimeError::invalid(
            "prefix_len, draft_len",
            format!("{prefix_len} + {draft_len} + 1 positions exceed the model's max_seq_len {max_seq}"),
        ));
    }
    let vocab = model.config().vocab_size;
    let prefix: Vec<u32> = (0..prefix_len).map(|i| filler(i * 7, vocab)).collect();
    let mut base = model.new_cache();
    model.forward(&mut base, &prefix)?;
    let max_k = ks.iter().copied().max().unwrap_or(1);
    let drafts: Vec<Vec<u32>> = (0..max_k)
        .map(|b| (0..=draft_len).map(|j| filler(j * 13 + b * 5, vocab)).collect())
        .collect();
    let refs: Vec<&[u32]> = drafts.iter().map(|d| d.as_slice()).collect();
    // Batch K uses the first K caches; every pass starts from the prefix alone.
    let mut caches: Vec<KvCache> = vec![base; max_k];
    let mut pass = |k: usize| -> Result<f64> {
        for c in caches[..k].iter_mut() {
            c.truncate(prefix_len)?;
        }
        let mut cref: Vec<&mut KvCache> = caches[..k].iter_mut().collect();
        let start = Instant::now();
        let out = model.forward_batch(&mut cref, &refs[..k])?;
        // Pull the logits to the host as the verifier must, so lazy devices are timed in full.
        for o in &out {
            let _ = o.sum_all()?.to_scalar::<f32>()?;
        }
        Ok(start.elapsed().as_secs_f64())
    };
    for &k in ks {
        pass(k)?;
    }
    let mut times = vec![Vec::with_capacity(reps); ks.len()];
    for rep in 0..reps {
        for i in (0..ks.len()).map(|i| (i + rep) % ks.len()) {
            times[i].push(pass(ks[i])?);
        }
        progress();
    }
    Ok(times)
}

/// The median of `xs` (the mean of the two middle values for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// The Theil–Sen line through `points`: the slope is the median of the slopes between every pair of points with
/// distinct x, the intercept the median of y − slope·x. A third of the points can be arbitrarily wrong without
/// moving it far (a least-squares line follows a single outlier). R² is that of this line against the points.
pub fn theil_sen(points: &[(f64, f64)]) -> Result<AffineFit> {
    let mut slopes = Vec::with_capacity(points.len() * points.len().saturating_sub(1) / 2);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() || points.iter().any(|p| !(p.0.is_finite() && p.1.is_finite())) {
        return Err(RuntimeError::invalid(
            "points",
            "a Theil–Sen fit needs two distinct finite x values and finite y",
        ));
    }
    let slope = median(&slopes);
    let residuals: Vec<f64> = points.iter().map(|p| p.1 - slope * p.0).collect();
    let intercept = median(&residuals);
    let my = points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64;
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    Ok(AffineFit { intercept, slope, r2 })
}

/// A two-sided interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower end.
    pub low: f64,
    /// Upper end.
    pub high: f64,
}

impl Interval {
    /// Whether `x` lies in [low, high].
    pub fn contains(&self, x: f64) -> bool {
        self.low <= x && x <= self.high
    }
}

/// The verification-latency model T_ver(K) = T_fix + K·T_lin (paper A eq. 7) fitted robustly, with bootstrap
/// intervals.
#[derive(Debug, Clone, PartialEq)]
pub struct RobustFit {
    /// Theil–Sen line through the per-K medians.
    pub fit: AffineFit,
    /// 95 % percentile-bootstrap interval of T_fix (s).
    pub t_fix: Interval,
    /// 95 % percentile-bootstrap interval of T_lin (s).
    pub t_lin: Interval,
    /// Smallest and largest K of the sweep.
    pub k_min: usize,
    /// Largest K.
    pub k_max: usize,
    /// Measured cost ratio median T(k_max) / median T(k_min).
    pub ratio: f64,
    /// Its 95 % percentile-bootstrap interval.
    pub ratio_interval: Interval,
}

impl RobustFit {
    /// Whether the fixed cost is resolved: its whole interval lies above zero. When it is not, T_fix must not be
    /// reported as a value (a negative fixed cost is physically impossible; it means the data cannot separate
    /// T_fix from K·T_lin).
    pub fn fixed_cost_resolved(&self) -> bool {
        self.t_fix.low > 0.0
    }
}

/// Bootstrap resamples used by [`robust_fit`] by default.
pub const BOOTSTRAP_RESAMPLES: usize = 1000;

/// Fits T_ver(K) = T_fix + K·T_lin to per-K samples (`samples[i]` are the timings of K = `ks[i]`, as
/// [`verify_latency_samples`] returns them): the Theil–Sen line through the per-K medians, and 95 %
/// percentile intervals from `resamples` bootstrap resamples (each resamples every K's timings with replacement,
/// then takes medians and the Theil–Sen line again). The ratio is between the largest and the smallest K's medians.
pub fn robust_fit(
    ks: &[usize],
    samples: &[Vec<f64>],
    resamples: usize,
    rng: &mut impl rand::Rng,
) -> Result<RobustFit> {
    use rand::RngExt;
    if ks.len() != samples.len() || ks.len() < 2 {
        return Err(RuntimeError::invalid(
            "samples",
            format!(
                "{} sample lists for {} batch sizes (two or more needed)",
                samples.len(),
                ks.len()
            ),
        ));
    }
    if let Some(i) = samples
        .iter()
        .position(|s| s.is_empty() || s.iter().any(|t| !(t.is_finite() && *t >= 0.0)))
    {
        return Err(RuntimeError::invalid(
            format!("samples[{i}]"),
            "must be a non-empty list of finite non-negative times",
        ));
    }
    if resamples < 40 {
        return Err(RuntimeError::invalid(
            "resamples",
            format!("{resamples} is too few for a 95 % interval (40 or more)"),
        ));
    }
    let lo = (0..ks.len()).min_by_key(|&i| ks[i]).unwrap_or(0);
    let hi = (0..ks.len()).max_by_key(|&i| ks[i]).unwrap_or(0);
    let fit_of = |medians: &[f64]| -> Result<(AffineFit, f64)> {
        let pts: Vec<(f64, f64)> = ks.iter().zip(medians).map(|(&k, &t)| (k as f64, t)).collect();
        Ok((theil_sen(&pts)?, medians[hi] / medians[lo]))
    };
    let medians: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let (fit, ratio) = fit_of(&medians)?;
    let (mut fix, mut lin, mut rat) = (
        Vec::with_capacity(resamples),
        Vec::with_capacity(resamples),
        Vec::with_capacity(resamples),
    );
    let mut draw = Vec::new();
    let mut boot = vec![0.0; ks.len()];
    for _ in 0..resamples {
        for (m, s) in boot.iter_mut().zip(samples) {
            draw.clear();
            draw.extend((0..s.len()).map(|_| s[rng.random_range(0..s.len())]));
            *m = median(&draw);
        }
        let (f, r) = fit_of(&boot)?;
        fix.push(f.intercept);
        lin.push(f.slope);
        rat.push(r);
    }
    Ok(RobustFit {
        fit,
        t_fix: percentile_interval(&mut fix),
        t_lin: percentile_interval(&mut lin),
        k_min: ks[lo],
        k_max: ks[hi],
        ratio,
        ratio_interval: percentile_interval(&mut rat),
    })
}

/// The 2.5 % and 97.5 % order statistics of `xs` (sorted in place; at least one value).
fn percentile_interval(xs: &mut [f64]) -> Interval {
    xs.sort_by(f64::total_cmp);
    let at = |q: f64| xs[((q * (xs.len() - 1) as f64).round() as usize).min(xs.len() - 1)];
    Interval {
        low: at(0.025),
        high: at(0.975),
    }
}

/// A token id for synthetic timing inputs: `i` folded into the vocabulary, above the three ids llama-style
/// tokenizers reserve (unknown, begin, end) when the vocabulary is large enough to leave any.
fn filler(i: usize, vocab: usize) -> u32 {
    let reserved = if vocab > 3 { 3 } else { 0 };
    (reserved + i % (vocab - reserved).max(1)) as u32
}

/// Median per-token drafting latency (s): one-token decode steps after `prefix_len` tokens.
pub fn draft_token_latency_s(model: &Model, prefix_len: usize, tokens: usize) -> Result<f64> {
    let vocab = model.config().vocab_size;
    let prefix: Vec<u32> = (0..prefix_len.max(1)).map(|i| filler(i * 7, vocab)).collect();
    let mut cache = model.new_cache();
    model.forward(&mut cache, &prefix)?;
    let mut times = Vec::with_capacity(tokens);
    for i in 0..tokens {
        let start = Instant::now();
        let l = model.forward(&mut cache, &[filler(i * 11, vocab)])?;
        let _ = l.sum_all()?.to_scalar::<f32>()?;
        times.push(start.elapsed().as_secs_f64());
    }
    if times.is_empty() {
        return Err(RuntimeError::invalid("tokens", "must be positive"));
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Least-squares fit y = a + b·x with its coefficient of determination R².
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffineFit {
    /// Intercept (T_fix).
    pub intercept: f64,
    /// Slope (T_lin).
    pub slope: f64,
    /// R² = 1 − SS_res / SS_tot.
    pub r2: f64,
}

/// Fits y = a + b·x by ordinary least squares (at least two distinct x).
pub fn affine_fit(points: &[(f64, f64)]) -> Result<AffineFit> {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return Err(RuntimeError::invalid(
            "points",
            "an affine fit needs two distinct x values",
        ));
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let ss_res: f64 = points
        .iter()
        .map(|p| (p.1 - intercept - slope * p.0).powi(2))
        .sum();
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
    Ok(AffineFit { intercept, slope, r2 })
}

/// The uplink model of the goodput measurement: equal bandwidth split, paper A's per-token payload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Uplink {
    /// Total bandwidth B in Hz.
    pub bandwidth_hz: f64,
    /// Spectral efficiency r in bit/s/Hz, the same for every device.
    pub spectral_efficiency: f64,
    /// Q_tok: bits per drafted token.
    pub distribution_bits: f64,
}

impl Uplink {
    /// Seconds to upload one drafted token when K devices share the band equally: Q_tok / ((B/K)·r).
    pub fn token_s(&self, k: usize) -> f64 {
        self.distribution_bits / (self.bandwidth_hz / k as f64 * self.spectral_efficiency)
    }
}

/// Q_tok = |V̂|(Q_B + ⌈log₂V⌉) with |V̂| = min(1024, V), Q_B = 16 (paper A §VI-A), from spin-core's one
/// payload-size formula (`spin_core::dist::payload_bits`).
pub fn distribution_bits(vocab: usize) -> f64 {
    spin_core::dist::payload_bits(vocab.min(1024), vocab, 16) as f64
}

/// One point of the goodput curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GoodputPoint {
    /// Common draft length L.
    pub draft_len: usize,
    /// Empirical sum goodput: emitted tokens over modelled round time (tokens/s).
    pub empirical_tok_s: f64,
    /// Paper-A formula K·E[N|L] / (L·ϑ + T_ver) with the measured α (tokens/s).
    pub formula_tok_s: f64,
    /// Measured acceptance rate (ratio estimator, mean over devices).
    pub alpha: f64,
}

/// Empirical goodput for K devices with real models at draft length L: each round costs
/// L·(measured per-token draft time + modelled upload time) + measured batch verification time; the formula uses
/// the measured α, ϑ = draft + upload time per token and the fitted T_ver (paper A eq. 13 / Theorem 1).
#[allow(clippy::too_many_arguments)]
pub fn goodput(
    target: &Model,
    drafter: &Model,
    prompts: &[Vec<u32>],
    draft_len: usize,
    new_tokens: usize,
    params: SamplingParams,
    uplink: &Uplink,
    verify: &AffineFit,
    seed: u64,
) -> Result<GoodputPoint> {
    let k = prompts.len();
    let cfg = SpecConfig {
        params,
        max_new_tokens: new_tokens,
        eos: None,
        seed,
    };
    let mut s = Speculator::new(target, drafter, prompts, &vec![draft_len; k], cfg)?;
    // Each device's draft time must be its own single-sequence latency, as on its own hardware.
    s.set_drafting(crate::speculative::Drafting::PerDevice);
    let mut round_time = 0.0;
    let up = uplink.token_s(k);
    loop {
        let before: Vec<(f64, usize)> = s
            .devices
            .iter()
            .map(|d| (d.draft_time.as_secs_f64(), d.drafted))
            .collect();
        if !s.step()? {
            break;
        }
        let round = s.rounds.last().map_or(0.0, |r| r.verify_s);
        let slowest = s
            .devices
            .iter()
            .zip(&before)
            .map(|(d, (t0, n0))| (d.draft_time.as_secs_f64() - t0) + (d.drafted - n0) as f64 * up)
            .fold(0.0, f64::max);
        round_time += slowest + round;
    }
    let emitted: usize = s.devices.iter().map(|d| d.generated().len()).sum();
    let alphas: Vec<f64> = s
        .devices
        .iter()
        .filter_map(|d| d.alpha.ratio_estimate(1.96).ok().flatten().map(|e| e.value))
        .collect();
    let alpha = if alphas.is_empty() {
        f64::NAN
    } else {
        mean_std(&alphas).0
    };
    let drafted: usize = s.devices.iter().map(|d| d.drafted).sum();
    let draft_s: f64 = s.devices.iter().map(|d| d.draft_time.as_secs_f64()).sum();
    let theta = if drafted > 0 {
        draft_s / drafted as f64 + up
    } else {
        up
    };
    let t_ver = verify.intercept + verify.slope * k as f64;
    let formula = if alpha.is_nan() {
        k as f64 / t_ver
    } else {
        k as f64 * spin_core::expected_accepted(alpha, draft_len as u32) / (draft_len as f64 * theta + t_ver)
    };
    Ok(GoodputPoint {
        draft_len,
        empirical_tok_s: emitted as f64 / round_time,
        formula_tok_s: formula,
        alpha,
    })
}
