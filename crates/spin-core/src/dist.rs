//! Token distributions: zero-copy validated views over probability slices, logits → probabilities, top-V_eff
//! truncation, Q-bit quantisation and the sparse form that crosses the air (docs/model.md §1).
//!
//! A [`Dist`] borrows `&[f32]` (or `&[f64]`) weights and is validated once: every weight finite and non-negative,
//! the total positive. The distribution it stands for is `w / Σw`; weights need not sum to one, which is what lets
//! quantised integer codes and truncated, unrenormalised entries be used as they are, with renormalisation exact.

use crate::CoreError;
use crate::chance::{Categorical, Chance};

pub use crate::lanes::Weight;
#[cfg(test)]
use crate::lanes::exp_nonpositive;
use crate::lanes::lane_sum;

/// A validated, borrowed token distribution: `weights[i] / total` is the probability of token `i`.
///
/// Construction reads the slice once (≈ memory bandwidth); everything after that is infallible.
///
/// ```
/// use spin_core::Dist;
/// use rand::SeedableRng;
///
/// let probs: Vec<f32> = vec![0.1, 0.0, 0.6, 0.3];
/// let p = Dist::new(&probs)?;
/// assert_eq!(p.len(), 4);
/// assert!((p.prob(2).unwrap() - 0.6).abs() < 1e-7);
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let token = p.sample(&mut rng);
/// assert_ne!(token, 1); // zero-probability tokens are never drawn
/// # Ok::<(), spin_core::CoreError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Dist<'a, W: Weight = f32> {
    weights: &'a [W],
    total: f64,
}

impl<'a, W: Weight> Dist<'a, W> {
    /// Validates `weights` (field name `weights` in errors).
    pub fn new(weights: &'a [W]) -> Result<Self, CoreError> {
        Self::validate(weights).map_err(|reason| CoreError::invalid("weights", reason))
    }

    /// Validates element `index` of a list of distributions named `field`, e.g. `targets[3]` in errors.
    pub fn new_at(weights: &'a [W], field: &'static str, index: usize) -> Result<Self, CoreError> {
        Self::validate(weights).map_err(|reason| CoreError::invalid_at(field, index, reason))
    }

    pub(crate) fn validate(weights: &'a [W]) -> Result<Self, String> {
        if weights.is_empty() {
            return Err("is empty".into());
        }
        if u32::try_from(weights.len()).is_err() {
            return Err(format!("{} entries exceed the u32 token range", weights.len()));
        }
        let (total, signs) = crate::lanes::total_and_signs(weights);
        if !total.is_finite() || signs & 0x8000_0000 != 0 {
            // Slow path: name the offending entry (a set sign bit may only be −0.0, which is a valid zero).
            for (i, w) in weights.iter().enumerate() {
                let x = w.to_f64();
                if !x.is_finite() || x < 0.0 {
                    return Err(format!(
                        "weight {x} at token {i} is not a finite non-negative number"
                    ));
                }
            }
            if !total.is_finite() {
                return Err(format!("total weight {total} is not finite"));
            }
        }
        if total <= 0.0 {
            return Err("total weight is zero".into());
        }
        Ok(Self { weights, total })
    }

    /// A view whose validation was done when `weights` was produced, with `total` computed by [`Dist::validate`]'s
    /// blocked order (only [`ProbRows`] creates these).
    pub(crate) fn from_parts(weights: &'a [W], total: f64) -> Self {
        Self { weights, total }
    }

    /// The vocabulary size V.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// The borrowed weights.
    pub fn weights(&self) -> &'a [W] {
        self.weights
    }

    /// The sum of the weights (the normaliser).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// The probability of `token`, `None` if it is outside the vocabulary.
    #[inline]
    pub fn prob(&self, token: usize) -> Option<f64> {
        self.weights.get(token).map(|w| w.to_f64() / self.total)
    }

    /// Draws a token by the inverse CDF with one uniform (summing in `f64`, no allocation).
    pub fn sample<C: Chance + ?Sized>(&self, chance: &mut C) -> u32 {
        chance.categorical(self) as u32
    }

    /// The normalised probabilities as `f64` (allocates; for references and tests).
    pub fn to_probs(&self) -> Vec<f64> {
        self.weights.iter().map(|w| w.to_f64() / self.total).collect()
    }
}

impl<W: Weight> Categorical for Dist<'_, W> {
    fn len(&self) -> usize {
        self.weights.len()
    }
    #[inline(always)]
    fn weight(&self, i: usize) -> f64 {
        self.weights[i].to_f64()
    }
    #[inline(always)]
    fn block_sum(&self, start: usize, end: usize) -> f64 {
        lane_sum(&self.weights[start..end])
    }
    fn total(&self) -> f64 {
        self.total
    }
}

/// Sampling controls applied to logits identically on the drafting and the verifying side.
///
/// Order: temperature, then top-k, then top-p (nucleus), as common LLM samplers do, then min-p. Greedy decoding is
/// `top_k = 1`.
///
/// Min-p keeps the tokens whose logit is at most `−ln(min_p)` below the largest, i.e. whose probability at
/// temperature 1 is at least `min_p` times the largest one: the rule of llama.cpp's `--min-p`, which it applies to
/// the logits before the temperature, so the kept set does not depend on the temperature. (llama.cpp also cuts
/// top-p before the temperature; here top-p sees the tempered distribution.)
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    min_p: Option<f64>,
}

impl SamplingParams {
    /// Plain sampling at temperature 1 with no filtering.
    pub const PLAIN: Self = Self {
        temperature: 1.0,
        top_k: None,
        top_p: None,
        min_p: None,
    };

    /// Validates temperature ∈ (0, ∞), top_k ≥ 1, top_p ∈ (0, 1].
    pub fn new(temperature: f64, top_k: Option<usize>, top_p: Option<f64>) -> Result<Self, CoreError> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(CoreError::out_of_domain("temperature", temperature, "(0, ∞)"));
        }
        if top_k == Some(0) {
            return Err(CoreError::out_of_domain("top_k", 0.0, "[1, ∞)"));
        }
        if let Some(p) = top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(CoreError::out_of_domain("top_p", p, "(0, 1]"));
        }
        Ok(Self {
            temperature,
            top_k,
            top_p,
            min_p: None,
        })
    }

    /// The same controls with a min-p cut (see [`SamplingParams`]); `min_p` ∈ [0, 1], where 0 cuts nothing and 1
    /// keeps only the tokens tied with the largest logit.
    pub fn with_min_p(self, min_p: f64) -> Result<Self, CoreError> {
        if !(0.0..=1.0).contains(&min_p) {
            return Err(CoreError::out_of_domain("min_p", min_p, "[0, 1]"));
        }
        Ok(Self {
            min_p: (min_p > 0.0).then_some(min_p),
            ..self
        })
    }

    /// The temperature.
    pub fn temperature(&self) -> f64 {
        self.temperature
    }
    /// The top-k cut, if any.
    pub fn top_k(&self) -> Option<usize> {
        self.top_k
    }
    /// The nucleus mass, if any.
    pub fn top_p(&self) -> Option<f64> {
        self.top_p
    }
    /// The min-p ratio, if any.
    pub fn min_p(&self) -> Option<f64> {
        self.min_p
    }
}

/// Orders tokens by weight, largest first, ties by smaller index: the one deterministic order used for every cut.
#[inline]
fn by_weight_desc<W: Weight>(w: &[W]) -> impl Fn(&u32, &u32) -> std::cmp::Ordering + '_ {
    move |&a, &b| {
        let (x, y) = (w[a as usize].to_f64(), w[b as usize].to_f64());
        y.total_cmp(&x).then(a.cmp(&b))
    }
}

/// Writes `softmax(logits / T)` with top-k, top-p and min-p applied into `out` (normalised, `f32`).
///
/// `-∞` logits are allowed (masked tokens); NaN and `+∞` are errors. Ties at a cut are broken by the smaller
/// token id, so both sides keep the same set. Top-p keeps the smallest prefix (in that order) whose mass reaches
/// `top_p`. Allocates a scratch index vector only when top-k or top-p is set.
///
/// ```
/// use spin_core::{SamplingParams, probs_from_logits};
/// let params = SamplingParams::new(0.5, Some(2), None)?;
/// let mut probs = Vec::new();
/// probs_from_logits(&[1.0, 3.0, 2.0, f32::NEG_INFINITY], &params, &mut probs)?;
/// assert_eq!(probs[0], 0.0); // cut by top-2
/// assert!((probs[1] - 0.880_797).abs() < 1e-5); // e^{2}/(e^{2}+1) at T = 0.5
/// # Ok::<(), spin_core::CoreError>(())
/// ```
pub fn probs_from_logits(
    logits: &[f32],
    params: &SamplingParams,
    out: &mut Vec<f32>,
) -> Result<(), CoreError> {
    out.clear();
    push_probs(logits, params, out)?;
    Ok(())
}

/// Appends the row [`probs_from_logits`] writes to `out` and returns its total ([`write_probs`]).
fn push_probs(logits: &[f32], params: &SamplingParams, out: &mut Vec<f32>) -> Result<f64, CoreError> {
    let start = out.len();
    out.resize(start + logits.len(), 0.0);
    write_probs(logits, params, &mut out[start..])
}

/// Writes the row [`probs_from_logits`] writes into `row` (as long as `logits`) and returns its total in the
/// blocked order of [`Dist`]'s validation (the row is finite and non-negative with its largest entry positive by
/// construction, so it needs no validating pass). Each pass over the row runs in the CPU's vector instructions
/// (`crate::lanes`).
fn write_probs(logits: &[f32], params: &SamplingParams, row: &mut [f32]) -> Result<f64, CoreError> {
    let (max, inv_t) = largest_logit(logits, params)?;
    crate::lanes::write_exps(logits, max, inv_t, row);
    cut_and_normalise(logits, max, params, row)
}

/// [`write_probs`] with the logits in `row` itself, overwritten by the probabilities (the same values). Min-p
/// compares the logits after the exponentials are written, so with min-p the row's logits are copied first.
fn probs_in_place(row: &mut [f32], params: &SamplingParams) -> Result<f64, CoreError> {
    if params.min_p.is_some() {
        let logits = row.to_vec();
        return write_probs(&logits, params, row);
    }
    let (max, inv_t) = largest_logit(row, params)?;
    crate::lanes::exps_in_place(row, max, inv_t);
    cut_and_normalise(&[], max, params, row)
}

/// The largest logit of a row (after checking every entry) and 1/T as the exponentials take it.
fn largest_logit(logits: &[f32], params: &SamplingParams) -> Result<(f32, f32), CoreError> {
    if logits.is_empty() {
        return Err(CoreError::invalid("logits", "is empty"));
    }
    // One branch-free pass; the entry to blame is looked for only when there is one.
    let (max, bad) = crate::lanes::max_and_bad(logits);
    if bad {
        let (i, l) = logits
            .iter()
            .enumerate()
            .find(|(_, l)| l.is_nan() || **l == f32::INFINITY)
            .map(|(i, &l)| (i, l))
            .unwrap_or((0, f32::NAN));
        return Err(CoreError::invalid(
            "logits",
            format!("{l} at token {i} is not a number below +∞"),
        ));
    }
    if max == f32::NEG_INFINITY {
        return Err(CoreError::invalid("logits", "every entry is -∞"));
    }
    // 1/T in f32, at most f32::MAX: finite, so the largest logit's exponent is 0·(1/T) = 0 however small T is
    // (below 3e−39 the quotient would be +∞ and that product NaN).
    let inv_t = (1.0 / params.temperature).min(f64::from(f32::MAX)) as f32;
    Ok((max, inv_t))
}

/// The cuts of `params` on a row of exponentials, then its normalisation; returns its blocked total. `logits` (the
/// row's, for min-p) is read only when `params` has min-p.
fn cut_and_normalise(
    logits: &[f32],
    max: f32,
    params: &SamplingParams,
    row: &mut [f32],
) -> Result<f64, CoreError> {
    let n = row.len();
    if params.top_k.is_some_and(|k| k < n) || params.top_p.is_some_and(|p| p < 1.0) {
        let k = params.top_k.unwrap_or(n).min(n);
        let mut idx: Vec<u32> = (0..n as u32).collect();
        {
            let cmp = by_weight_desc(&*row);
            if k < idx.len() {
                idx.select_nth_unstable_by(k - 1, &cmp);
                idx.truncate(k);
            }
            idx.sort_unstable_by(&cmp);
        }
        let mut keep = idx.len();
        if let Some(top_p) = params.top_p {
            let total: f64 = idx.iter().map(|&i| f64::from(row[i as usize])).sum();
            let mut cum = 0.0;
            for (n, &i) in idx.iter().enumerate() {
                cum += f64::from(row[i as usize]) / total;
                if cum >= top_p {
                    keep = n + 1;
                    break;
                }
            }
        }
        let mut kept = vec![false; row.len()];
        for &i in &idx[..keep] {
            kept[i as usize] = true;
        }
        for (w, k) in row.iter_mut().zip(&kept) {
            if !k {
                *w = 0.0;
            }
        }
    }
    if let Some(min_p) = params.min_p {
        // On the logits, as llama.cpp cuts (before the temperature); the largest logit always stays.
        let floor = f64::from(max) + min_p.ln();
        for (w, &l) in row.iter_mut().zip(logits) {
            if f64::from(l) < floor {
                *w = 0.0;
            }
        }
    }
    let total = crate::lanes::sum_f64(row);
    Ok(crate::lanes::scale_and_total(row, 1.0 / total))
}

/// Owned rows of `f32` probabilities (e.g. a padded batch `[K, P, V]` flattened), each validated once when built,
/// so views of them ([`ProbRows::row`], [`crate::PaddedTargets::from_rows`]) cost nothing more to take.
///
/// Built from logits, each row is written straight into the owned buffer and is valid by construction (finite,
/// non-negative, its largest entry positive); its total comes from the pass that normalises it, in the blocked
/// order validation uses. Verification then reads a whole row only where it must (residual or bonus draws), not
/// to check it.
///
/// ```
/// use spin_core::{ProbRows, SamplingParams};
/// let logits = [0.0f32, 0.0, 1.0, f32::NEG_INFINITY, /* row 1 */ 2.0, 0.0, 0.0, 0.0];
/// let rows = ProbRows::from_logits(&logits, 4, &SamplingParams::PLAIN)?;
/// assert_eq!(rows.rows(), 2);
/// assert_eq!(rows.row(0).unwrap().prob(3), Some(0.0));
/// # Ok::<(), spin_core::CoreError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ProbRows {
    data: Vec<f32>,
    totals: Vec<f64>,
    vocab: usize,
}

impl ProbRows {
    /// Validates every row of `data` (length a multiple of `vocab`); errors read `rows[i]: …`.
    pub fn from_probs(data: Vec<f32>, vocab: usize) -> Result<Self, CoreError> {
        if vocab == 0 || data.is_empty() || !data.len().is_multiple_of(vocab) {
            return Err(CoreError::invalid(
                "rows",
                format!(
                    "{} values are not a positive multiple of vocab {vocab}",
                    data.len()
                ),
            ));
        }
        let mut totals = Vec::with_capacity(data.len() / vocab);
        for (i, row) in data.chunks_exact(vocab).enumerate() {
            let d = Dist::validate(row).map_err(|reason| CoreError::invalid_at("rows", i, reason))?;
            totals.push(d.total());
        }
        Ok(Self { data, totals, vocab })
    }

    /// Applies [`probs_from_logits`] to every row of `logits` (length a multiple of `vocab`).
    pub fn from_logits(logits: &[f32], vocab: usize, params: &SamplingParams) -> Result<Self, CoreError> {
        if vocab == 0 || logits.is_empty() || !logits.len().is_multiple_of(vocab) {
            return Err(CoreError::invalid(
                "logits",
                format!(
                    "{} values are not a positive multiple of vocab {vocab}",
                    logits.len()
                ),
            ));
        }
        let mut data = Vec::with_capacity(logits.len());
        let mut totals = Vec::with_capacity(logits.len() / vocab);
        for (i, l) in logits.chunks_exact(vocab).enumerate() {
            let total = push_probs(l, params, &mut data)
                .map_err(|e| CoreError::invalid_at("logits", i, e.to_string()))?;
            totals.push(total);
        }
        Ok(Self { data, totals, vocab })
    }

    /// [`ProbRows::from_logits`] for a padded batch `[batch, positions, vocab]` (device, position, token) whose
    /// device k fills its first `lens[k]` positions (1 ≤ `lens[k]` ≤ `positions`): those rows are turned into
    /// probabilities in place (the buffer becomes the rows', no second one is allocated), and every padding row
    /// becomes the one-hot row of token 0 without its logits being read (batched
    /// verification never reads a padding row; it keeps the padded shape for [`crate::PaddedTargets::from_rows`]).
    /// Errors name the first bad row as `logits[i]`, i = k · positions + j. The rows are shared out in contiguous
    /// runs over `threads` scoped threads (1: this thread alone); each row is the same whatever the count.
    ///
    /// ```
    /// use spin_core::{ProbRows, SamplingParams};
    /// // Two devices, two positions, V = 2; device 1's second row is padding (its logits are never read).
    /// let logits = [0.0f32, 0.0, 1.0, 1.0, /* device 1 */ 5.0, 5.0, f32::NAN, f32::NAN];
    /// let rows = ProbRows::from_padded_logits(logits.to_vec(), 2, 2, 2, &[2, 1], &SamplingParams::PLAIN, 1)?;
    /// assert_eq!(rows.row(2).unwrap().prob(1), Some(0.5));
    /// assert_eq!(rows.row(3).unwrap().prob(0), Some(1.0));
    /// # Ok::<(), spin_core::CoreError>(())
    /// ```
    pub fn from_padded_logits(
        logits: Vec<f32>,
        batch: usize,
        positions: usize,
        vocab: usize,
        lens: &[usize],
        params: &SamplingParams,
        threads: usize,
    ) -> Result<Self, CoreError> {
        for (field, v) in [
            ("batch", batch),
            ("positions", positions),
            ("vocab", vocab),
            ("threads", threads),
        ] {
            if v == 0 {
                return Err(CoreError::out_of_domain(field, 0.0, "[1, ∞)"));
            }
        }
        if batch.checked_mul(positions).and_then(|x| x.checked_mul(vocab)) != Some(logits.len()) {
            return Err(CoreError::invalid(
                "logits",
                format!(
                    "has {} values but batch {batch} × positions {positions} × vocab {vocab} needs more or fewer",
                    logits.len()
                ),
            ));
        }
        if lens.len() != batch {
            return Err(CoreError::invalid(
                "lens",
                format!("has {} lengths for a batch of {batch}", lens.len()),
            ));
        }
        if let Some(k) = lens.iter().position(|&n| n == 0 || n > positions) {
            return Err(CoreError::invalid_at(
                "lens",
                k,
                format!("{} is outside [1, {positions}]", lens[k]),
            ));
        }
        let rows = batch * positions;
        let mut data = logits;
        let mut totals = vec![0.0f64; rows];
        // Rows `first..` in place, their totals into `totals`.
        let fill = |first: usize, data: &mut [f32], totals: &mut [f64]| -> Result<(), CoreError> {
            for (r, (row, total)) in data.chunks_exact_mut(vocab).zip(totals.iter_mut()).enumerate() {
                let i = first + r;
                *total = if i % positions < lens[i / positions] {
                    probs_in_place(row, params)
                        .map_err(|e| CoreError::invalid_at("logits", i, e.to_string()))?
                } else {
                    row.fill(0.0);
                    row[0] = 1.0;
                    1.0
                };
            }
            Ok(())
        };
        let per = rows.div_ceil(threads.min(rows));
        if per == rows {
            fill(0, &mut data, &mut totals)?;
        } else {
            std::thread::scope(|scope| {
                let mut parts = data
                    .chunks_mut(per * vocab)
                    .zip(totals.chunks_mut(per))
                    .enumerate();
                let (_, (d0, t0)) = parts.next().expect("at least one run of rows");
                let handles: Vec<_> = parts
                    .map(|(c, (d, t))| scope.spawn(move || fill(c * per, d, t)))
                    .collect();
                // The first bad row in row order: this thread's run first, then the others' in order.
                let mut result = fill(0, d0, t0);
                for h in handles {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err(CoreError::invalid("logits", "a worker thread failed")));
                    result = result.and(r);
                }
                result
            })?;
        }
        Ok(Self { data, totals, vocab })
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.totals.len()
    }
    /// The vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// All rows, flattened.
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    /// The row totals, in the blocked summation order the samplers use.
    pub fn totals(&self) -> &[f64] {
        &self.totals
    }
    /// Row `i` as a distribution (no pass over the data), `None` past the end.
    pub fn row(&self, i: usize) -> Option<Dist<'_, f32>> {
        let total = *self.totals.get(i)?;
        Some(Dist::from_parts(
            &self.data[i * self.vocab..(i + 1) * self.vocab],
            total,
        ))
    }
}

/// ⌈log₂ V⌉: the bits of one token index on the air (docs/model.md §1), at least 1.
pub fn index_bits(vocab: usize) -> u32 {
    if vocab <= 2 {
        1
    } else {
        usize::BITS - (vocab - 1).leading_zeros()
    }
}

/// Bits of one (token index, value) pair on the air: ⌈log₂V⌉ + Q (docs/model.md §1). Paper B's (token,
/// probability) pair with a Q-bit probability, and one entry of a sparse distribution.
pub fn pair_bits(vocab: usize, value_bits: u32) -> u32 {
    index_bits(vocab) + value_bits
}

/// D = V_eff·(⌈log₂V⌉ + Q) bits: a distribution of `kept` = V_eff entries of a V-token vocabulary with Q-bit values
/// (docs/model.md §1; paper A's Q_tok, paper B's D). The one payload-size formula of the workspace: the planners'
/// scenario sizes, the wire format and [`SparseDist::bits_on_air`] all call it.
pub fn payload_bits(kept: usize, vocab: usize, value_bits: u32) -> u64 {
    kept as u64 * u64::from(pair_bits(vocab, value_bits))
}

/// A sparse distribution as sent over the air: `V_eff` (index, value) pairs out of a vocabulary of `V`.
///
/// Values are unnormalised: the distribution is `values / Σ values` on the kept indices and zero elsewhere,
/// so the receiver's renormalisation is exact. After [`SparseDist::quantise`] the values are the integer
/// codes `0..2^Q` (held exactly in `f32` for Q ≤ 24). Entries are ordered by value, largest first.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseDist {
    vocab: usize,
    indices: Vec<u32>,
    values: Vec<f32>,
    value_bits: u32,
}

impl SparseDist {
    /// Keeps the `v_eff` most probable tokens of `dist` (ties: smaller token id), see [`Truncator`].
    pub fn truncate<W: Weight>(dist: Dist<'_, W>, v_eff: usize) -> Result<Self, CoreError> {
        Truncator::new(v_eff)?.truncate(dist)
    }

    /// Quantises the kept values to `q_bits` ∈ [1, 24] bits relative to the largest one:
    /// code_i = round(v_i / v_max · (2^Q − 1)) (round half away from zero). The largest code is 2^Q − 1 > 0,
    /// so the result is always a valid distribution; entries whose code is 0 stay on the air but carry no mass.
    pub fn quantise(&self, q_bits: u32) -> Result<Self, CoreError> {
        if !(1..=24).contains(&q_bits) {
            return Err(CoreError::out_of_domain("q_bits", f64::from(q_bits), "[1, 24]"));
        }
        let max = self.values.iter().fold(0.0f64, |m, &v| m.max(f64::from(v)));
        let scale = f64::from((1u32 << q_bits) - 1) / max;
        let values = self
            .values
            .iter()
            .map(|&v| (f64::from(v) * scale).round() as f32)
            .collect();
        Ok(Self {
            vocab: self.vocab,
            indices: self.indices.clone(),
            values,
            value_bits: q_bits,
        })
    }

    /// Rebuilds a quantised distribution from what went on the air: `indices` and their integer `codes` at
    /// `q_bits` bits, entries ordered by code, largest first (as [`SparseDist::quantise`] leaves them), without
    /// re-sorting. Checks 1 ≤ Q ≤ 24, 1 ≤ V_eff ≤ V, equal lengths, every index < V and distinct, every code an
    /// integer in [0, 2^Q − 1], the order, and a non-zero code; linear in V_eff (plus V/64 words for the
    /// distinctness check), so a receiver pays no sort per distribution.
    pub fn from_codes(
        vocab: usize,
        indices: Vec<u32>,
        codes: Vec<f32>,
        q_bits: u32,
    ) -> Result<Self, CoreError> {
        if !(1..=24).contains(&q_bits) {
            return Err(CoreError::out_of_domain("q_bits", f64::from(q_bits), "[1, 24]"));
        }
        if indices.is_empty() || indices.len() > vocab {
            return Err(CoreError::invalid(
                "indices",
                format!("{} entries for a vocabulary of {vocab}", indices.len()),
            ));
        }
        if codes.len() != indices.len() {
            return Err(CoreError::invalid(
                "codes",
                format!("{} codes for {} indices", codes.len(), indices.len()),
            ));
        }
        let full = ((1u32 << q_bits) - 1) as f32;
        // Branch-free passes first (they vectorise); the slow scans below only run to name a failure.
        // The integer test vectorises (the saturating f32 → u32 cast did not, and cost spin-net's server about a
        // sixth of its per-draft time): below 2^23, adding and subtracting 2^23 rounds to the nearest integer, so it
        // leaves only integers unchanged; from 2^23 on every f32 is an integer.
        const TWO_23: f32 = 8_388_608.0;
        let valid = |c: f32| (0.0..=full).contains(&c) & ((c >= TWO_23) | ((c + TWO_23) - TWO_23 == c));
        let codes_ok = codes.iter().fold(true, |ok, &c| ok & valid(c))
            && codes.windows(2).fold(true, |ok, w| ok & (w[0] >= w[1]));
        if !codes_ok {
            let mut prev = f32::INFINITY;
            for (j, &c) in codes.iter().enumerate() {
                if !valid(c) {
                    return Err(CoreError::invalid_at(
                        "codes",
                        j,
                        format!("{c} is not an integer in [0, {full}]"),
                    ));
                }
                if c > prev {
                    return Err(CoreError::invalid_at(
                        "codes",
                        j,
                        format!("{c} follows the smaller {prev} (entries go largest first)"),
                    ));
                }
                prev = c;
            }
        }
        if codes[0] <= 0.0 {
            return Err(CoreError::invalid("codes", "every code is zero"));
        }
        let largest = indices.iter().fold(0u32, |m, &i| m.max(i)) as usize;
        if largest >= vocab
            && let Some(j) = indices.iter().position(|&i| i as usize >= vocab)
        {
            return Err(CoreError::invalid_at(
                "indices",
                j,
                format!("{} is outside the vocabulary of {vocab}", indices[j]),
            ));
        }
        let mut seen = vec![0u64; vocab.div_ceil(64)];
        let mut twice = 0u64;
        for &i in &indices {
            let (w, b) = (i as usize / 64, 1u64 << (i % 64));
            twice |= seen[w] & b;
            seen[w] |= b;
        }
        if twice != 0 {
            seen.iter_mut().for_each(|w| *w = 0);
            for (j, &i) in indices.iter().enumerate() {
                let (w, b) = (i as usize / 64, 1u64 << (i % 64));
                if seen[w] & b != 0 {
                    return Err(CoreError::invalid_at("indices", j, format!("{i} appears twice")));
                }
                seen[w] |= b;
            }
        }
        Ok(Self {
            vocab,
            indices,
            values: codes,
            value_bits: q_bits,
        })
    }

    /// The vocabulary size V.
    pub fn vocab(&self) -> usize {
        self.vocab
    }
    /// The kept token ids, most probable first.
    pub fn indices(&self) -> &[u32] {
        &self.indices
    }
    /// The kept unnormalised values (codes after quantisation), aligned with [`SparseDist::indices`].
    pub fn values(&self) -> &[f32] {
        &self.values
    }
    /// V_eff, the number of entries on the air.
    pub fn kept(&self) -> usize {
        self.indices.len()
    }
    /// Bits per value on the air: Q after quantisation, 32 for raw `f32` values.
    pub fn value_bits(&self) -> u32 {
        self.value_bits
    }

    /// The exact payload size D = V_eff · (⌈log₂V⌉ + Q) bits (docs/model.md §1; paper B's D, paper A's Q_tok).
    ///
    /// ```
    /// # use spin_core::dist::index_bits;
    /// assert_eq!(index_bits(151_665), 18);
    /// assert_eq!(1024 * (18 + 16), 34_816); // what a 1024-entry, 16-bit SparseDist reports at V = 151,665
    /// ```
    pub fn bits_on_air(&self) -> u64 {
        payload_bits(self.indices.len(), self.vocab, self.value_bits)
    }

    /// Writes the dense weights (zeros off the kept set) into `out`, resized to V; reuse `out` to avoid allocation.
    pub fn write_dense(&self, out: &mut Vec<f32>) {
        out.clear();
        out.resize(self.vocab, 0.0);
        for (&i, &v) in self.indices.iter().zip(&self.values) {
            out[i as usize] = v;
        }
    }

    /// The kept values as a distribution over positions `0..kept()` (map back with [`SparseDist::indices`]).
    pub fn values_dist(&self) -> Result<Dist<'_, f32>, CoreError> {
        Dist::new(&self.values)
    }

    /// Draws a token from this very distribution, as a device must when it sends it (the UL-exact scheme).
    pub fn sample<C: Chance + ?Sized>(&self, chance: &mut C) -> Result<u32, CoreError> {
        let d = self.values_dist()?;
        Ok(self.indices[d.sample(chance) as usize])
    }

    /// The probability of `token` after renormalisation (0 off the kept set), `None` outside the vocabulary.
    pub fn prob(&self, token: usize) -> Option<f64> {
        if token >= self.vocab {
            return None;
        }
        let total: f64 = self.values.iter().map(|&v| f64::from(v)).sum();
        Some(
            self.indices
                .iter()
                .position(|&i| i as usize == token)
                .map_or(0.0, |k| f64::from(self.values[k]) / total),
        )
    }
}

/// Top-V_eff truncation with a reusable scratch histogram (no allocation per call beyond the V_eff-entry result).
///
/// Selection is a one-pass radix pre-selection followed by an exact sort of a few candidates: non-negative `f32`
/// values order like their bit patterns, so a histogram of the top 16 bits (sign, exponent, 7 mantissa bits)
/// finds the bucket holding the V_eff-th largest weight; every weight in or above that bucket is a candidate
/// (V_eff plus the rest of that bucket, typically a few more), and only the candidates are sorted by
/// (weight descending, token ascending). `f64` weights are bucketed by their `f32` rounding, which is monotone,
/// and compared exactly in the sort.
#[derive(Debug, Clone)]
pub struct Truncator {
    v_eff: usize,
    histogram: Vec<u32>,
}

/// The bucket of a non-negative weight: the top 16 bits of its `f32` pattern (zero, including −0, is bucket 0).
#[inline(always)]
fn bucket<W: Weight>(x: W) -> usize {
    let v = x.to_f64() as f32;
    if v > 0.0 { (v.to_bits() >> 16) as usize } else { 0 }
}

impl Truncator {
    /// Validates `v_eff ≥ 1`.
    pub fn new(v_eff: usize) -> Result<Self, CoreError> {
        if v_eff == 0 {
            return Err(CoreError::out_of_domain("v_eff", 0.0, "[1, V]"));
        }
        Ok(Self {
            v_eff,
            histogram: Vec::new(),
        })
    }

    /// The number of entries kept.
    pub fn v_eff(&self) -> usize {
        self.v_eff
    }

    /// Keeps the min(V_eff, V) most probable tokens of `dist` (ties: smaller token id), values as `f32`.
    pub fn truncate<W: Weight>(&mut self, dist: Dist<'_, W>) -> Result<SparseDist, CoreError> {
        let w = dist.weights();
        let v = w.len();
        let keep = self.v_eff.min(v);
        // Small vocabularies: sorting everything is cheaper than clearing the 2^16-bucket histogram.
        let mut indices: Vec<u32> = if keep == v || v <= 4096 {
            (0..v as u32).collect()
        } else {
            self.histogram.clear();
            self.histogram.resize(1 << 16, 0);
            for &x in w {
                self.histogram[bucket(x)] += 1;
            }
            let mut cum = 0usize;
            let mut cut = self.histogram.len() - 1;
            loop {
                cum += self.histogram[cut] as usize;
                if cum >= keep || cut == 0 {
                    break;
                }
                cut -= 1;
            }
            if cut == 0 {
                // Fewer than `keep` entries above the lowest bucket (a one-hot row of greedy drafting, a restricted
                // head's row): the zeros make up the rest, and they need no sort. In the full order (weight
                // descending by `total_cmp`, then id) every positive entry comes first, then +0 by id, then −0 by id.
                let mut c: Vec<u32> = (0..v as u32).filter(|&i| w[i as usize].to_f64() > 0.0).collect();
                c.sort_unstable_by(by_weight_desc(w));
                for negative in [false, true] {
                    let zeros = (0..v as u32).filter(|&i| {
                        let x = w[i as usize].to_f64();
                        x == 0.0 && x.is_sign_negative() == negative
                    });
                    c.extend(zeros.take(keep.saturating_sub(c.len())));
                }
                c.truncate(keep);
                return self.finish(w, c);
            }
            let mut c = Vec::with_capacity(cum);
            c.extend(
                (0..v as u32)
                    .zip(w)
                    .filter(|&(_, &x)| bucket(x) >= cut)
                    .map(|(i, _)| i),
            );
            c
        };
        indices.sort_unstable_by(by_weight_desc(w));
        indices.truncate(keep);
        self.finish(w, indices)
    }

    /// The sparse distribution of the kept `indices` (in order) of `w`.
    fn finish<W: Weight>(&self, w: &[W], indices: Vec<u32>) -> Result<SparseDist, CoreError> {
        let v = w.len();
        let values: Vec<f32> = indices.iter().map(|&i| w[i as usize].to_f64() as f32).collect();
        if !values.iter().any(|&x| x > 0.0) {
            return Err(CoreError::invalid(
                "dist",
                "the kept entries have zero mass in f32",
            ));
        }
        Ok(SparseDist {
            vocab: v,
            indices,
            values,
            value_bits: 32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorisable e^x against `f64::exp`: relative error below 3e−7 (2.5 `f32::EPSILON`) on a dense grid
    /// of [−87, 0] and on the values near 0 where probabilities live, exactly 1 at 0 and exactly 0 below −87 (−∞
    /// included).
    #[test]
    fn exp_nonpositive_is_within_3e_7_of_exp() {
        let mut worst = 0.0f64;
        let mut check = |x: f32| {
            let want = f64::from(x).exp();
            let got = f64::from(exp_nonpositive(x));
            worst = worst.max((got - want).abs() / want);
        };
        for i in 0..=870_000 {
            check(-(i as f32) * 1e-4);
        }
        for i in 0..10_000 {
            check(-(i as f32) * 1e-7);
        }
        assert!(worst < 3e-7, "worst relative error {worst:e}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        for x in [-87.001, -100.0, -1e30, f32::NEG_INFINITY] {
            assert_eq!(exp_nonpositive(x), 0.0, "{x}");
        }
    }

    /// Rows built in place (no validating pass, totals from the normalising pass) equal the rows
    /// `probs_from_logits` writes, validated afterwards: the same bits and the same totals, under every cut.
    #[test]
    fn rows_built_in_place_equal_validated_ones() {
        let mut next = crate::lanes::test_uniforms(0x0123_4567_89ab_cdef);
        let settings = [
            SamplingParams::PLAIN,
            SamplingParams::new(0.7, None, None).unwrap(),
            SamplingParams::new(1.0, Some(40), None).unwrap(),
            SamplingParams::new(1.3, None, Some(0.9)).unwrap(),
            SamplingParams::new(1.0, None, None)
                .unwrap()
                .with_min_p(0.05)
                .unwrap(),
        ];
        for vocab in [1usize, 7, 64, 65, 1000, 49_152] {
            let logits: Vec<f32> = (0..3 * vocab)
                .map(|i| {
                    if i % 97 == 5 {
                        f32::NEG_INFINITY
                    } else {
                        next() * 30.0 - 15.0
                    }
                })
                .collect();
            let logits: Vec<f32> = logits
                .chunks(vocab)
                .flat_map(|r| {
                    let mut r = r.to_vec();
                    if r.iter().all(|x| *x == f32::NEG_INFINITY) {
                        r[0] = 0.0;
                    }
                    r
                })
                .collect();
            for params in &settings {
                let rows = ProbRows::from_logits(&logits, vocab, params).unwrap();
                let mut want = Vec::new();
                let mut row = Vec::new();
                for l in logits.chunks(vocab) {
                    probs_from_logits(l, params, &mut row).unwrap();
                    want.extend_from_slice(&row);
                }
                let checked = ProbRows::from_probs(want, vocab).unwrap();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(rows.data()),
                    bits(checked.data()),
                    "vocab {vocab}, {params:?}"
                );
                let totals = |t: &[f64]| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    totals(rows.totals()),
                    totals(checked.totals()),
                    "vocab {vocab}, {params:?}"
                );
            }
        }
        // A padded batch: real rows as from_logits makes them, padding rows one-hot at 0 whatever their logits.
        let logits: Vec<f32> = (0..3 * 4 * 70).map(|i| ((i * 37) % 23) as f32 * 0.3).collect();
        let mut padded_logits = logits.clone();
        padded_logits[(4 + 3) * 70 + 5] = f32::NAN; // device 1, position 3: padding
        // Three devices of four positions over 70 tokens.
        let padded = |logits: &[f32], lens: &[usize], params: &SamplingParams, threads: usize| {
            ProbRows::from_padded_logits(logits.to_vec(), 3, 4, 70, lens, params, threads)
        };
        let rows = padded(&padded_logits, &[4, 3, 1], &settings[1], 1).unwrap();
        for threads in [2, 3, 5, 12, 40] {
            let again = padded(&padded_logits, &[4, 3, 1], &settings[1], threads);
            assert_eq!(again.unwrap(), rows, "{threads} threads");
        }
        let full = ProbRows::from_logits(&logits, 70, &settings[1]).unwrap();
        for i in 0..12 {
            let real = i % 4 < [4, 3, 1][i / 4];
            let got = rows.row(i).unwrap();
            if real {
                assert_eq!(got.weights(), full.row(i).unwrap().weights(), "row {i}");
                assert_eq!(got.total().to_bits(), full.row(i).unwrap().total().to_bits());
            } else {
                assert_eq!((got.prob(0), got.total()), (Some(1.0), 1.0), "row {i}");
                assert_eq!(Dist::new(got.weights()).unwrap().total(), 1.0);
            }
        }
        for params in &settings {
            let every = padded(&logits, &[4, 4, 4], params, 2).unwrap();
            assert_eq!(
                every,
                ProbRows::from_logits(&logits, 70, params).unwrap(),
                "{params:?}"
            );
        }
        for (lens, field) in [
            (&[4, 3][..], "lens"),
            (&[4, 0, 1][..], "lens[1]"),
            (&[4, 5, 1][..], "lens[1]"),
        ] {
            let e = padded(&logits, lens, &settings[0], 2).unwrap_err();
            assert!(e.to_string().starts_with(field), "{e}");
        }
        let e =
            ProbRows::from_padded_logits(logits.clone(), 3, 4, 71, &[1, 1, 1], &settings[0], 1).unwrap_err();
        assert!(e.to_string().starts_with("logits"), "{e}");
        for threads in [1, 2, 3, 12] {
            let mut bad = padded_logits.clone();
            bad[9 * 70 + 1] = f32::INFINITY; // device 2, position 1: padding, never read
            bad[2 * 70] = f32::NAN; // device 0, position 2: the first bad row
            let e = padded(&bad, &[4, 4, 1], &settings[0], threads).unwrap_err();
            assert!(e.to_string().starts_with("logits[2]"), "{threads} threads: {e}");
            let e = padded(&padded_logits, &[4, 4, 1], &settings[0], threads).unwrap_err();
            assert!(e.to_string().starts_with("logits[7]"), "{threads} threads: {e}");
        }
        let e = padded(&logits, &[1, 1, 1], &settings[0], 0).unwrap_err();
        assert!(e.to_string().starts_with("threads"), "{e}");
        let e = ProbRows::from_logits(&[0.0, 1.0, f32::NAN, 0.0], 2, &SamplingParams::PLAIN).unwrap_err();
        assert_eq!(
            e.to_string(),
            "logits[1]: logits: NaN at token 0 is not a number below +∞"
        );
    }

    /// Rows from logits against the same softmax in `f64` throughout: the exponent (l − max)/T is formed in `f32`,
    /// so a probability e^x/Z is off by at most about |x|·2^−24 relative from that, besides the exponential's own
    /// 3e−7: under 1e−6 for probabilities above e^−14 ≈ 1e−6 of the largest, under 1e−5 for any.
    #[test]
    fn probabilities_from_logits_match_an_f64_softmax() {
        let mut next = crate::lanes::test_uniforms(0x2545_f491_4f6c_dd1d);
        // The tiniest temperatures: every largest logit shares the mass, the rest get exactly 0.
        for t in [1e-30, 1e-300] {
            let params = SamplingParams::new(t, None, None).unwrap();
            let mut got = Vec::new();
            probs_from_logits(
                &[1.0, 3.0, 3.0, 2.999_999_8, f32::NEG_INFINITY],
                &params,
                &mut got,
            )
            .unwrap();
            assert_eq!(got, [0.0, 0.5, 0.5, 0.0, 0.0], "T = {t}");
        }
        for (case, t) in [1.0, 0.7, 2.0, 0.05].into_iter().enumerate() {
            let logits: Vec<f32> = (0..5000)
                .map(|i| {
                    if i % 7 == 3 {
                        f32::NEG_INFINITY
                    } else {
                        30.0 * next() - 15.0
                    }
                })
                .collect();
            let params = SamplingParams::new(t, None, None).unwrap();
            let mut got = Vec::new();
            probs_from_logits(&logits, &params, &mut got).unwrap();
            let max = logits.iter().fold(f64::NEG_INFINITY, |a, &l| a.max(f64::from(l)));
            let w: Vec<f64> = logits.iter().map(|&l| ((f64::from(l) - max) / t).exp()).collect();
            let total: f64 = w.iter().sum();
            for (i, ((&g, &e), &l)) in got.iter().zip(&w).zip(&logits).enumerate() {
                let want = e / total;
                let x = (f64::from(l) - max) / t;
                if x < -87.0 {
                    assert_eq!(g, 0.0, "case {case}, token {i}");
                } else {
                    let bound = 4e-7 + 1.2e-7 * x.abs();
                    assert!(
                        (f64::from(g) - want).abs() <= bound * want,
                        "case {case}, token {i}: {g} against {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn validation_names_the_problem() {
        let e = Dist::new(&[0.5f32, -0.1]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "weights: weight -0.10000000149011612 at token 1 is not a finite non-negative number"
        );
        let e = Dist::new_at(&[0.0f64, 0.0], "targets", 3).unwrap_err();
        assert_eq!(e.to_string(), "targets[3]: total weight is zero");
        assert!(
            Dist::new(&[f32::NAN, 1.0])
                .unwrap_err()
                .to_string()
                .contains("token 0")
        );
        assert!(Dist::new(&[f64::INFINITY]).is_err());
        assert!(Dist::<f32>::new(&[]).is_err());
        // −0.0 sets the sign bit but is a valid zero weight; a negative entry in a later full block is found.
        assert_eq!(Dist::new(&[-0.0f32, 1.0]).unwrap().prob(0), Some(0.0));
        let mut w = vec![1.0f64; 200];
        w[130] = -1e-300;
        assert!(Dist::new(&w).unwrap_err().to_string().contains("token 130"));
    }

    #[test]
    fn total_and_probabilities() {
        let w: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        let d = Dist::new(&w).unwrap();
        let exact: f64 = w.iter().map(|&x| f64::from(x)).sum();
        assert_eq!(d.total(), exact);
        assert_eq!(d.prob(1000), None);
        assert!((d.to_probs().iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn logits_temperature_top_k_top_p() {
        let mut out = Vec::new();
        probs_from_logits(&[0.0, (2.0f32).ln(), 0.0], &SamplingParams::PLAIN, &mut out).unwrap();
        assert!((out[1] - 0.5).abs() < 1e-7 && (out[0] - 0.25).abs() < 1e-7);
        // Ties at the top-k cut keep the smaller token id.
        let params = SamplingParams::new(1.0, Some(2), None).unwrap();
        probs_from_logits(&[1.0, 2.0, 1.0, 0.0], &params, &mut out).unwrap();
        assert_eq!(out[2], 0.0);
        assert!(out[0] > 0.0 && out[1] > 0.0);
        // Top-p: masses 0.5, 0.25, 0.125, 0.125; top_p = 0.7 keeps the first two.
        let l: Vec<f32> = [0.5f32, 0.25, 0.125, 0.125].iter().map(|p| p.ln()).collect();
        let params = SamplingParams::new(1.0, None, Some(0.7)).unwrap();
        probs_from_logits(&l, &params, &mut out).unwrap();
        assert!((out[0] - 2.0 / 3.0).abs() < 1e-6 && out[2] == 0.0 && out[3] == 0.0);
        assert!(probs_from_logits(&[f32::NAN], &SamplingParams::PLAIN, &mut out).is_err());
        assert!(probs_from_logits(&[f32::NEG_INFINITY], &SamplingParams::PLAIN, &mut out).is_err());
        assert_eq!(
            SamplingParams::new(0.0, None, None).unwrap_err().to_string(),
            "temperature: 0 is outside (0, ∞)"
        );
        assert!(SamplingParams::new(1.0, Some(0), None).is_err());
        assert!(SamplingParams::new(1.0, None, Some(1.5)).is_err());
    }

    /// Min-p against its definition (keep p_i ≥ min_p · p_max at temperature 1, renormalise), at several
    /// temperatures (the kept set must not change with them), combined with top-k, and its domain checks.
    #[test]
    fn min_p_keeps_tokens_within_the_ratio_of_the_largest() {
        let probs = [0.4f64, 0.3, 0.15, 0.1, 0.05];
        let l: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let mut out = Vec::new();
        for t in [0.5, 1.0, 2.0] {
            // min_p = 0.3: the floor is 0.12, so 0.4, 0.3 and 0.15 stay.
            let params = SamplingParams::new(t, None, None)
                .unwrap()
                .with_min_p(0.3)
                .unwrap();
            assert_eq!(params.min_p(), Some(0.3));
            probs_from_logits(&l, &params, &mut out).unwrap();
            let kept: Vec<f64> = probs[..3].iter().map(|p| p.powf(1.0 / t)).collect();
            let z: f64 = kept.iter().sum();
            for (i, &o) in out.iter().enumerate() {
                let want = if i < 3 { kept[i] / z } else { 0.0 };
                assert!(
                    (f64::from(o) - want).abs() < 1e-6,
                    "T {t}, token {i}: {o} vs {want}"
                );
            }
        }
        // With top-k = 2 the tighter cut wins; min_p = 1 keeps only the tokens tied with the largest.
        let params = SamplingParams::new(1.0, Some(2), None)
            .unwrap()
            .with_min_p(0.3)
            .unwrap();
        probs_from_logits(&l, &params, &mut out).unwrap();
        assert!(out[2] == 0.0 && out[1] > 0.0);
        let params = SamplingParams::PLAIN.with_min_p(1.0).unwrap();
        probs_from_logits(&[1.0, 3.0, 3.0, 2.0], &params, &mut out).unwrap();
        assert_eq!(out, [0.0, 0.5, 0.5, 0.0]);
        // 0 cuts nothing (and is stored as no cut); outside [0, 1] or NaN is refused, naming min_p.
        assert_eq!(
            SamplingParams::PLAIN.with_min_p(0.0).unwrap(),
            SamplingParams::PLAIN
        );
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = SamplingParams::PLAIN.with_min_p(bad).unwrap_err().to_string();
            assert!(e.starts_with("min_p:"), "{e}");
        }
    }

    #[test]
    fn truncation_matches_full_sort() {
        // Many ties, to exercise the tie rule against a brute-force sort; then rows that are mostly zeros (one-hot,
        // a few hundred entries, subnormal entries in the lowest bucket, −0 among the zeros).
        let ties: Vec<f32> = (0..5000u32).map(|i| ((i * 7919) % 97) as f32).collect();
        let mut one_hot = vec![0f32; 49_152];
        one_hot[31_337] = 1.0;
        let mut sparse = vec![0f32; 49_152];
        for i in 0..300u32 {
            sparse[((i * 7919) % 49_152) as usize] = ((i % 13) + 1) as f32;
        }
        sparse[17] = 1e-42;
        sparse[40_000] = 3e-41;
        sparse[5] = -0.0;
        sparse[9] = -0.0;
        for w in [ties, one_hot, sparse] {
            let d = Dist::new(&w).unwrap();
            let v = w.len();
            for v_eff in [1, 10, 97, 299, 300, 301, 303, 1024, 5000, 6000] {
                let s = SparseDist::truncate(d, v_eff).unwrap();
                let mut all: Vec<u32> = (0..v as u32).collect();
                all.sort_by(by_weight_desc(&w));
                all.truncate(v_eff.min(v));
                assert_eq!(s.indices(), &all[..], "V {v}, v_eff {v_eff}");
                let values: Vec<f32> = all.iter().map(|&i| w[i as usize]).collect();
                assert_eq!(s.values(), &values[..], "V {v}, v_eff {v_eff}");
            }
        }
    }

    #[test]
    fn quantisation_and_size() {
        let w = [0.5f32, 0.3, 0.2, 0.0];
        let s = SparseDist::truncate(Dist::new(&w).unwrap(), 3).unwrap();
        assert_eq!(s.indices(), &[0, 1, 2]);
        assert_eq!(s.bits_on_air(), 3 * (2 + 32));
        let q = s.quantise(4).unwrap();
        assert_eq!(q.values(), &[15.0, 9.0, 6.0]);
        assert_eq!(q.bits_on_air(), 3 * (2 + 4));
        assert!((q.prob(1).unwrap() - 0.3).abs() < 1e-12 && q.prob(3) == Some(0.0) && q.prob(4).is_none());
        let mut dense = Vec::new();
        q.write_dense(&mut dense);
        assert_eq!(dense, vec![15.0, 9.0, 6.0, 0.0]);
        assert!(s.quantise(0).is_err() && s.quantise(25).is_err());
        assert_eq!(index_bits(151_665), 18);
        assert_eq!(index_bits(2), 1);
        assert_eq!(index_bits(5), 3);
        assert_eq!(index_bits(1024), 10);
        // Paper B's D (V_eff = 1024, V = 151,665, Q = 16) and the edges of ⌈log₂V⌉ (moved from spin-channel's
        // `paper_b::distribution_bits`, which this replaces).
        assert_eq!(payload_bits(1024, 151_665, 16), 34_816);
        assert_eq!(pair_bits(151_665, 16), 34);
        assert_eq!(payload_bits(1, 1024, 0), 10);
        assert_eq!(payload_bits(1, 1025, 0), 11);
        assert_eq!(payload_bits(3, 4, 4), q.bits_on_air());
    }

    #[test]
    fn from_codes_rebuilds_a_quantised_distribution_and_refuses_bad_parts() {
        let w: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 + 0.5).collect();
        let q = SparseDist::truncate(Dist::new(&w).unwrap(), 40)
            .unwrap()
            .quantise(7)
            .unwrap();
        let back = SparseDist::from_codes(300, q.indices().to_vec(), q.values().to_vec(), 7).unwrap();
        assert_eq!(back, q);
        let bad =
            |i: Vec<u32>, c: Vec<f32>, b: u32| SparseDist::from_codes(4, i, c, b).unwrap_err().to_string();
        assert!(bad(vec![0, 1], vec![3.0, 1.0], 0).starts_with("q_bits"));
        assert!(bad(vec![], vec![], 2).starts_with("indices"));
        assert!(bad(vec![0, 1], vec![3.0], 2).starts_with("codes"));
        assert!(bad(vec![0, 1], vec![4.0, 1.0], 2).starts_with("codes[0]"));
        assert!(bad(vec![0, 1], vec![1.5, 1.0], 2).starts_with("codes[0]"));
        // The integer test on both sides of 2^23 (where f32 stops holding fractions) and at Q = 24's largest code.
        let full = 16_777_215.0;
        for (c, ok) in [
            (8_388_609.0, true),
            (8_388_608.0, true),
            (8_388_607.5, false),
            (4_194_303.5, false),
        ] {
            let r = SparseDist::from_codes(4, vec![0, 1], vec![full, c], 24);
            assert_eq!(r.is_ok(), ok, "{c}");
        }
        assert!(bad(vec![0, 1], vec![1.0, 3.0], 2).contains("largest first"));
        assert!(bad(vec![0, 1], vec![0.0, 0.0], 2).contains("every code is zero"));
        assert!(bad(vec![0, 4], vec![3.0, 1.0], 2).starts_with("indices[1]"));
        assert!(bad(vec![2, 2], vec![3.0, 1.0], 2).contains("appears twice"));
    }

    #[test]
    fn repeated_indices_are_named_at_their_first_repeat() {
        use rand::{RngExt, SeedableRng};
        use rand_chacha::ChaCha8Rng;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        // Vocabularies on both sides of a 64-bit word, so repeats fall in the same word and in different ones.
        for round in 0..600 {
            let vocab = [3usize, 64, 65, 700, 17, 4096, 1][round % 7];
            let n = rng.random_range(1..=vocab.min(40));
            let mut ids: Vec<u32> = (0..vocab as u32).collect();
            for j in 0..n {
                let pick = rng.random_range(j..vocab);
                ids.swap(j, pick);
            }
            ids.truncate(n);
            let repeat = n > 1 && rng.random_bool(0.5);
            if repeat {
                let (from, to) = (rng.random_range(0..n), rng.random_range(0..n));
                if from != to {
                    ids[to] = ids[from];
                }
            }
            // The first entry (in order) whose id appeared before: what the error must name.
            let first_repeat = (0..n).find(|&j| ids[..j].contains(&ids[j]));
            let codes = vec![1.0f32; n];
            match (SparseDist::from_codes(vocab, ids.clone(), codes, 4), first_repeat) {
                (Ok(_), None) => {}
                (Err(e), Some(j)) => {
                    assert_eq!(
                        e.to_string(),
                        format!("indices[{j}]: {} appears twice", ids[j]),
                        "{ids:?}"
                    )
                }
                (r, want) => panic!("{ids:?}: got {r:?}, want a repeat at {want:?}"),
            }
        }
    }
}
