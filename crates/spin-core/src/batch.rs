//! Batched verification of K drafts of different lengths against one padded batch of target distributions,
//! the shape a single padded forward pass produces (paper A eq. 7, paper B eq. 16: all K drafts in one pass).
//!
//! The targets are one contiguous `[K, P, V]` row-major buffer (device, position, token), with P ≥ max L_k + 1.
//! Rows are validated lazily, when the acceptance loop reaches them: a device rejected at position r never has
//! its rows after r read, which is what keeps realistic batches well under the cost of reading the whole buffer.
//! Devices are processed in index order, each consuming its random draws in turn, so results replay from a seed.

use crate::CoreError;
use crate::chance::Chance;
use crate::dist::{Dist, ProbRows, Weight};
use crate::verify::{Draft, Outcome, Verdict, check_drafts, finish, judge_with};
use rand::{Rng, SeedableRng};

/// A borrowed `[K, P, V]` buffer of target weights: row (k, j) is p_{j+1} for device k.
///
/// ```
/// use spin_core::{Draft, PaddedTargets, judge_batch};
/// use rand::SeedableRng;
///
/// // K = 2 devices, P = 3 positions, V = 2 tokens; device 0 drafted 2 tokens, device 1 one token.
/// let data: Vec<f32> = vec![0.5, 0.5, 0.9, 0.1, 0.3, 0.7, /* device 1 */ 0.2, 0.8, 0.6, 0.4, 0.0, 0.0];
/// let targets = PaddedTargets::new(&data, 2, 3, 2)?;
/// let drafts = [Draft::new(vec![0, 0], vec![0.5, 0.9])?, Draft::new(vec![1], vec![0.8])?];
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
/// let verdicts = judge_batch(&targets, &drafts, &mut rng)?;
/// // p ≥ q at every drafted position: everything is accepted and a bonus token drawn.
/// assert_eq!(verdicts[0].accepted(), 2);
/// assert_eq!(verdicts[1].accepted(), 1);
/// # Ok::<(), spin_core::CoreError>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PaddedTargets<'a, W: Weight = f32> {
    data: &'a [W],
    batch: usize,
    positions: usize,
    vocab: usize,
    /// Row totals when every row was validated up front ([`PaddedTargets::from_rows`]).
    totals: Option<&'a [f64]>,
}

impl<'a> PaddedTargets<'a, f32> {
    /// Views pre-validated rows (`rows.rows() == batch · positions`): verification then reads a target row in full
    /// only to draw a residual or bonus token, never just to validate it, which roughly halves the bytes a
    /// realistic batch reads.
    pub fn from_rows(rows: &'a ProbRows, batch: usize, positions: usize) -> Result<Self, CoreError> {
        let mut t = Self::new(rows.data(), batch, positions, rows.vocab())?;
        t.totals = Some(rows.totals());
        Ok(t)
    }
}

impl<'a, W: Weight> PaddedTargets<'a, W> {
    /// Checks the shape only (`data.len() == batch · positions · vocab`, all positive); rows are validated on use.
    pub fn new(data: &'a [W], batch: usize, positions: usize, vocab: usize) -> Result<Self, CoreError> {
        for (field, v) in [("batch", batch), ("positions", positions), ("vocab", vocab)] {
            if v == 0 {
                return Err(CoreError::out_of_domain(field, 0.0, "[1, ∞)"));
            }
        }
        let need = batch.checked_mul(positions).and_then(|x| x.checked_mul(vocab));
        if need != Some(data.len()) {
            return Err(CoreError::invalid(
                "targets",
                format!(
                    "has {} values but batch {batch} × positions {positions} × vocab {vocab} needs more or fewer",
                    data.len()
                ),
            ));
        }
        Ok(Self {
            data,
            batch,
            positions,
            vocab,
            totals: None,
        })
    }

    /// K, the number of devices.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// P, the padded number of positions per device.
    pub fn positions(&self) -> usize {
        self.positions
    }
    /// V, the vocabulary size.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The raw weights of device `k` at position `j` (0-based), `None` outside the shape.
    pub fn row(&self, k: usize, j: usize) -> Option<&'a [W]> {
        if k >= self.batch || j >= self.positions {
            return None;
        }
        let start = (k * self.positions + j) * self.vocab;
        Some(&self.data[start..start + self.vocab])
    }

    /// Validates row (k, j) as a distribution; errors read `targets[k]: position j: …`.
    pub fn dist(&self, k: usize, j: usize) -> Result<Dist<'a, W>, CoreError> {
        let row = self.row(k, j).ok_or_else(|| {
            CoreError::invalid_at(
                "targets",
                k,
                format!("position {j} is beyond the {} padded positions", self.positions),
            )
        })?;
        if let Some(t) = self.totals {
            return Ok(Dist::from_parts(row, t[k * self.positions + j]));
        }
        Dist::validate(row)
            .map_err(|reason| CoreError::invalid_at("targets", k, format!("position {j}: {reason}")))
    }

    fn check_batch(&self, drafts: usize) -> Result<(), CoreError> {
        if drafts != self.batch {
            return Err(CoreError::invalid(
                "drafts",
                format!("has {drafts} drafts for a batch of {}", self.batch),
            ));
        }
        Ok(())
    }

    fn check_len(&self, k: usize, len: usize) -> Result<(), CoreError> {
        if len + 1 > self.positions {
            return Err(CoreError::invalid_at(
                "drafts",
                k,
                format!(
                    "length {len} needs {} positions, the batch has {}",
                    len + 1,
                    self.positions
                ),
            ));
        }
        Ok(())
    }
}

/// Accept/reject decisions for K drafts from token–probability pairs (the server side of paper B), in device order.
pub fn judge_batch<W: Weight, C: Chance + ?Sized>(
    targets: &PaddedTargets<'_, W>,
    drafts: &[Draft],
    chance: &mut C,
) -> Result<Vec<Verdict>, CoreError> {
    targets.check_batch(drafts.len())?;
    let mut out = Vec::with_capacity(drafts.len());
    for (k, d) in drafts.iter().enumerate() {
        targets.check_len(k, d.len())?;
        let (v, _) = judge_with(d.tokens(), |j| d.probs()[j], |j| targets.dist(k, j), chance)?;
        out.push(v);
    }
    Ok(out)
}

/// One device's draft with the distributions its tokens were sampled from.
#[derive(Debug, Clone, Copy)]
pub struct DraftRef<'s, 'a, W: Weight = f32> {
    /// The drafted tokens y_1..y_L.
    pub tokens: &'s [u32],
    /// q_1..q_L, the distributions each token was sampled from.
    pub dists: &'s [Dist<'a, W>],
}

/// Complete rounds for K devices when the verifier also holds each device's q (e.g. UL correction with full
/// distributions, or a simulation): acceptance, then residual or bonus sampling, device by device.
pub fn verify_batch<Wp: Weight, Wq: Weight, C: Chance + ?Sized>(
    targets: &PaddedTargets<'_, Wp>,
    drafts: &[DraftRef<'_, '_, Wq>],
    chance: &mut C,
) -> Result<Vec<Outcome>, CoreError> {
    targets.check_batch(drafts.len())?;
    let mut out = Vec::with_capacity(drafts.len());
    for (k, d) in drafts.iter().enumerate() {
        out.push(verify_device(targets, k, d, chance)?);
    }
    Ok(out)
}

/// One device's complete round within a batch.
fn verify_device<Wp: Weight, Wq: Weight, C: Chance + ?Sized>(
    targets: &PaddedTargets<'_, Wp>,
    k: usize,
    d: &DraftRef<'_, '_, Wq>,
    chance: &mut C,
) -> Result<Outcome, CoreError> {
    targets.check_len(k, d.tokens.len())?;
    check_drafts(d.dists, d.tokens)?;
    let q_of = |j: usize| d.dists[j].prob(d.tokens[j] as usize).unwrap_or(0.0);
    let (verdict, p_r) = judge_with(d.tokens, q_of, |j| targets.dist(k, j), chance)?;
    finish(verdict, p_r, |r| d.dists[r], chance)
}

/// [`verify_batch`] on `threads` worker threads (scoped, no pool), for when reading the target rows is the cost.
///
/// Each device gets its own generator `R::seed_from_u64(s_k)`, with the seeds s_0..s_{K−1} drawn from `rng` in
/// device order before any work starts; so the outcomes depend on `rng` only, never on `threads` or scheduling
/// (but they are a different stream from [`verify_batch`] with the same `rng`). Device k goes to thread
/// k mod `threads`.
///
/// ```
/// use spin_core::{Dist, DraftRef, PaddedTargets, verify_batch_parallel};
/// use rand::SeedableRng;
/// use rand_chacha::ChaCha8Rng;
///
/// let data = vec![0.25f32; 3 * 2 * 4]; // K = 3, P = 2, V = 4, all uniform
/// let targets = PaddedTargets::new(&data, 3, 2, 4)?;
/// let q = [0.25f32; 4];
/// let qd = [Dist::new(&q)?];
/// let drafts = [DraftRef { tokens: &[1], dists: &qd }; 3];
/// let one = verify_batch_parallel(&targets, &drafts, &mut ChaCha8Rng::seed_from_u64(7), 1)?;
/// let two = verify_batch_parallel(&targets, &drafts, &mut ChaCha8Rng::seed_from_u64(7), 2)?;
/// assert_eq!(one, two);
/// assert!(one.iter().all(|o| o.accepted == 1)); // p = q: always accepted
/// # Ok::<(), spin_core::CoreError>(())
/// ```
pub fn verify_batch_parallel<Wp: Weight, Wq: Weight, R: Rng + SeedableRng>(
    targets: &PaddedTargets<'_, Wp>,
    drafts: &[DraftRef<'_, '_, Wq>],
    rng: &mut R,
    threads: usize,
) -> Result<Vec<Outcome>, CoreError> {
    if threads == 0 {
        return Err(CoreError::out_of_domain("threads", 0.0, "[1, ∞)"));
    }
    targets.check_batch(drafts.len())?;
    let seeds: Vec<u64> = drafts.iter().map(|_| rng.next_u64()).collect();
    let one = |k: usize| verify_device(targets, k, &drafts[k], &mut R::seed_from_u64(seeds[k]));
    let threads = threads.min(drafts.len());
    if threads <= 1 {
        return (0..drafts.len()).map(one).collect();
    }
    let mut slots: Vec<Option<Result<Outcome, CoreError>>> = vec![None; drafts.len()];
    std::thread::scope(|s| {
        let one = &one;
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    (t..drafts.len())
                        .step_by(threads)
                        .map(|k| (k, one(k)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for w in workers {
            match w.join() {
                Ok(results) => {
                    for (k, r) in results {
                        slots[k] = Some(r);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    slots
        .into_iter()
        .enumerate()
        .map(|(k, r)| {
            r.unwrap_or_else(|| {
                Err(CoreError::invalid_at(
                    "drafts",
                    k,
                    "no worker produced an outcome",
                ))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;

    /// One draft per token list, each drafted from the first `tokens.len()` of `qd`.
    fn draft_refs<'s, 'a>(tokens: &'s [Vec<u32>], qd: &'s [Dist<'a>]) -> Vec<DraftRef<'s, 'a>> {
        tokens
            .iter()
            .map(|t| DraftRef {
                tokens: t,
                dists: &qd[..t.len()],
            })
            .collect()
    }

    #[test]
    fn shape_and_length_errors() {
        let data = vec![0.5f32; 12];
        assert!(PaddedTargets::new(&data, 2, 3, 3).is_err());
        assert_eq!(
            PaddedTargets::new(&data, 0, 3, 4).unwrap_err().to_string(),
            "batch: 0 is outside [1, ∞)"
        );
        let t = PaddedTargets::new(&data, 2, 3, 2).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let long = Draft::new(vec![0, 0, 0], vec![0.5; 3]).unwrap();
        let e = judge_batch(&t, &[Draft::empty(), long], &mut rng).unwrap_err();
        assert_eq!(
            e.to_string(),
            "drafts[1]: length 3 needs 4 positions, the batch has 3"
        );
        assert!(judge_batch(&t, &[Draft::empty()], &mut rng).is_err());
    }

    #[test]
    fn parallel_batch_is_per_device_seeded_and_thread_independent() {
        // K = 5 devices, V = 3, drafts of lengths 0..=4 with q far from p, so rejections happen.
        let (k_n, p_n, v) = (5, 5, 3);
        let mut data = Vec::new();
        for r in 0..k_n * p_n {
            data.extend([1.0 + (r % 3) as f32, 2.0, 0.5 + (r % 2) as f32]);
        }
        let targets = PaddedTargets::new(&data, k_n, p_n, v).unwrap();
        let q = [0.6f32, 0.1, 0.3];
        let qd = [Dist::new(&q).unwrap(); 4];
        let tokens: Vec<Vec<u32>> = (0..k_n).map(|k| (0..k as u32).map(|j| j % 3).collect()).collect();
        let drafts = draft_refs(&tokens, &qd);
        for seed in 0..20 {
            let base =
                verify_batch_parallel(&targets, &drafts, &mut ChaCha8Rng::seed_from_u64(seed), 1).unwrap();
            for threads in 2..=6 {
                let out =
                    verify_batch_parallel(&targets, &drafts, &mut ChaCha8Rng::seed_from_u64(seed), threads);
                assert_eq!(out.unwrap(), base, "seed {seed}, {threads} threads");
            }
            // Device k's outcome is `verify` of its own rows with its own generator.
            let mut master = ChaCha8Rng::seed_from_u64(seed);
            for (k, d) in drafts.iter().enumerate() {
                let mut r = ChaCha8Rng::seed_from_u64(master.next_u64());
                let p: Vec<Dist> = (0..=d.tokens.len())
                    .map(|j| targets.dist(k, j).unwrap())
                    .collect();
                assert_eq!(crate::verify(&p, d.tokens, d.dists, &mut r).unwrap(), base[k]);
            }
        }
        assert!(verify_batch_parallel(&targets, &drafts, &mut ChaCha8Rng::seed_from_u64(0), 0).is_err());
    }

    #[test]
    fn prevalidated_rows_give_identical_outcomes() {
        let (k_n, p_n, v) = (3, 3, 4);
        let data: Vec<f32> = (0..k_n * p_n * v).map(|i| ((i * 7) % 5) as f32 + 0.5).collect();
        let rows = ProbRows::from_probs(data.clone(), v).unwrap();
        let lazy = PaddedTargets::new(&data, k_n, p_n, v).unwrap();
        let eager = PaddedTargets::from_rows(&rows, k_n, p_n).unwrap();
        let q = [0.4f32, 0.3, 0.2, 0.1];
        let qd = [Dist::new(&q).unwrap(); 2];
        let tokens = [vec![0u32, 1], vec![2], vec![]];
        let drafts = draft_refs(&tokens, &qd);
        for seed in 0..50 {
            let a = verify_batch(&lazy, &drafts, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            let b = verify_batch(&eager, &drafts, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            assert_eq!(a, b);
        }
        assert!(PaddedTargets::from_rows(&rows, 2, 3).is_err());
        let e = ProbRows::from_probs(vec![1.0, 0.0, 0.0, 0.0], 2).unwrap_err();
        assert_eq!(e.to_string(), "rows[1]: total weight is zero");
        assert!(ProbRows::from_probs(vec![1.0; 5], 2).is_err());
        let from_logits = ProbRows::from_logits(
            &[0.0, f32::NEG_INFINITY, 1.0, 1.0],
            2,
            &crate::SamplingParams::PLAIN,
        );
        let r = from_logits.unwrap();
        assert_eq!(
            (r.row(0).unwrap().prob(0), r.row(1).unwrap().prob(1)),
            (Some(1.0), Some(0.5))
        );
        assert!(r.row(2).is_none());
        assert!(ProbRows::from_logits(&[f32::NAN, 0.0], 2, &crate::SamplingParams::PLAIN).is_err());
    }

    #[test]
    fn padding_rows_are_never_read() {
        // Device 0 drafts one token; its padded rows hold zeros (invalid as distributions) and must not be touched.
        let mut data = vec![0.0f32; 2 * 4 * 2];
        data[..4].copy_from_slice(&[0.5, 0.5, 0.25, 0.75]);
        data[8..].copy_from_slice(&[0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]);
        let t = PaddedTargets::new(&data, 2, 4, 2).unwrap();
        let drafts = [
            Draft::new(vec![1], vec![0.5]).unwrap(),
            Draft::new(vec![0, 1, 0], vec![0.5; 3]).unwrap(),
        ];
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let v = judge_batch(&t, &drafts, &mut rng).unwrap();
        assert_eq!(v[0].accepted(), 1);
        assert_eq!(v[1].accepted(), 3);
        // A zero row that is reached is reported with device and position.
        let drafts = [Draft::new(vec![1, 1], vec![0.5, 0.5]).unwrap(), Draft::empty()];
        let e = judge_batch(&t, &drafts, &mut rng).unwrap_err();
        assert_eq!(e.to_string(), "targets[0]: position 2: total weight is zero");
    }
}
