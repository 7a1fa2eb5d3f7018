//! Verification of one draft (docs/model.md §1 steps 3–5): sequential acceptance with probability min(1, p/q),
//! residual sampling from norm(max(0, p − q)) at the first rejection, a bonus token from p_{L+1} otherwise.
//!
//! Degenerate cases, chosen deliberately:
//! - q(y) = 0 for a drafted token is an **error** at [`Draft`] construction. A correct drafter never samples a
//!   zero-probability token; seeing one means the device sampled from a different distribution than the one it
//!   reports, which breaks exactness silently if accepted (min(1, p/0) would accept anything).
//! - p(y) ≥ q(y): accepted without drawing (the acceptance probability is exactly 1).
//! - Residual of zero mass: the residual mass Σ max(0, p − q) equals the rejection probability Σ max(0, q − p), so
//!   with p = q a rejection cannot happen. It can only be reached by rounding (p(y)/q(y) one ulp below 1); then
//!   the correction is drawn from p itself, the limit that keeps the output distributed as p.

use crate::CoreError;
use crate::chance::{BLOCK, Categorical, Chance, reduce_lanes};
use crate::dist::{Dist, Weight};

/// The acceptance probability of a drafted token, min(1, p(y)/q(y)) (paper A eq. 10's per-token α; paper B §II).
///
/// `p_y`, `q_y` are normalised probabilities; callers guarantee `q_y > 0`.
#[inline]
pub fn acceptance_probability(p_y: f64, q_y: f64) -> f64 {
    if p_y >= q_y { 1.0 } else { p_y / q_y }
}

/// A drafted sequence as the verifier sees it: tokens y_1..y_L and their draft probabilities q_j(y_j).
///
/// This is what crosses the uplink in paper B (token–probability pairs). Build it with [`Draft::from_dists`] from
/// the distributions the tokens were sampled from, or with [`Draft::new`] from received pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    tokens: Vec<u32>,
    probs: Vec<f64>,
}

impl Draft {
    /// Validates equal lengths and every probability in (0, 1] (see the module note on q(y) = 0).
    pub fn new(tokens: Vec<u32>, probs: Vec<f64>) -> Result<Self, CoreError> {
        if tokens.len() != probs.len() {
            return Err(CoreError::invalid(
                "draft.probs",
                format!("has {} entries for {} tokens", probs.len(), tokens.len()),
            ));
        }
        for (j, &q) in probs.iter().enumerate() {
            if !(q > 0.0 && q <= 1.0) {
                return Err(CoreError::invalid_at(
                    "draft.probs",
                    j,
                    format!("{q} for token {} is outside (0, 1]", tokens[j]),
                ));
            }
        }
        Ok(Self { tokens, probs })
    }

    /// The draft of `tokens`, sampled from `dists[j]` at position j; q_j(y_j) is read from the distributions.
    pub fn from_dists<W: Weight>(tokens: &[u32], dists: &[Dist<'_, W>]) -> Result<Self, CoreError> {
        if tokens.len() != dists.len() {
            return Err(CoreError::invalid(
                "draft.dists",
                format!("has {} distributions for {} tokens", dists.len(), tokens.len()),
            ));
        }
        let mut probs = Vec::with_capacity(tokens.len());
        for (j, (&y, d)) in tokens.iter().zip(dists).enumerate() {
            match d.prob(y as usize) {
                Some(q) if q > 0.0 => probs.push(q),
                Some(_) => {
                    return Err(CoreError::invalid_at(
                        "draft.tokens",
                        j,
                        format!("token {y} has zero draft probability"),
                    ));
                }
                None => {
                    return Err(CoreError::invalid_at(
                        "draft.tokens",
                        j,
                        format!("token {y} is outside the vocabulary of {}", d.len()),
                    ));
                }
            }
        }
        Ok(Self {
            tokens: tokens.to_vec(),
            probs,
        })
    }

    /// The empty draft (L = 0): the round emits one token sampled from the target.
    pub fn empty() -> Self {
        Self {
            tokens: Vec::new(),
            probs: Vec::new(),
        }
    }

    /// The draft length L.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    /// Whether L = 0.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    /// The drafted tokens y_1..y_L.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    /// The draft probabilities q_j(y_j).
    pub fn probs(&self) -> &[f64] {
        &self.probs
    }
}

/// The verifier's decision on one draft before any correction is exchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// All L drafted tokens were accepted; the verifier drew the bonus token from p_{L+1}.
    AllAccepted {
        /// L, the number of accepted drafted tokens.
        accepted: usize,
        /// The bonus token.
        bonus: u32,
    },
    /// The token at `position` (0-based, so `position` tokens were accepted) was rejected; a correction must be
    /// drawn from the residual, which needs p and q of that position on one side (see `correction`).
    Rejected {
        /// The 0-based index of the first rejected drafted token; equals the number accepted.
        position: usize,
    },
}

impl Verdict {
    /// The number of drafted tokens accepted.
    pub fn accepted(&self) -> usize {
        match *self {
            Verdict::AllAccepted { accepted, .. } => accepted,
            Verdict::Rejected { position } => position,
        }
    }

    /// Whether a correction distribution must cross the air.
    pub fn needs_exchange(&self) -> bool {
        matches!(self, Verdict::Rejected { .. })
    }
}

/// The result of a complete round: the accepted prefix plus one emitted token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Outcome {
    /// The number of drafted tokens accepted (the emitted sequence is `tokens[..accepted]` then `token`).
    pub accepted: usize,
    /// The emitted token: the correction sampled from the residual, or the bonus token.
    pub token: u32,
    /// The 0-based rejected position, `None` when all were accepted.
    pub rejected_at: Option<usize>,
}

impl Outcome {
    /// Tokens emitted by the round, N = accepted + 1 (paper A eq. 10).
    pub fn emitted(&self) -> usize {
        self.accepted + 1
    }
    /// Whether a correction distribution had to be exchanged.
    pub fn needs_exchange(&self) -> bool {
        self.rejected_at.is_some()
    }
}

/// The residual norm(max(0, p − q)) as a [`Categorical`] without allocation (docs/model.md §1 step 4).
///
/// Weights are max(0, p_i − c·q_i) with c = Σp/Σq, i.e. max(0, p_i/Σp − q_i/Σq) scaled by Σp (one multiply per
/// entry fewer; the scale cancels in the normalisation), in `f64`. [`Residual::mass`] is Σ max(0, p − q) of the
/// normalised distributions, which equals their total-variation distance and the rejection probability.
#[derive(Debug, Clone, Copy)]
pub struct Residual<'a, Wp: Weight, Wq: Weight> {
    p: &'a [Wp],
    q: &'a [Wq],
    /// 1/Σp, to report the mass in probability units.
    p_scale: f64,
    /// c = Σp/Σq.
    q_factor: f64,
    /// Σ of the scaled weights (the categorical total).
    raw_mass: f64,
    blocks: Option<&'a [f64]>,
}

impl<'a, Wp: Weight, Wq: Weight> Residual<'a, Wp, Wq> {
    /// One pass over p and q computing the residual mass. Fails only when the vocabularies differ.
    pub fn new(p: Dist<'a, Wp>, q: Dist<'a, Wq>) -> Result<Self, CoreError> {
        let mut r = Self::unscanned(p, q)?;
        r.raw_mass = crate::chance::blocked_total(&r);
        Ok(r)
    }

    /// Like [`Residual::new`], keeping the block sums in `scratch` (reused, grown to ⌈V/64⌉) so that a draw
    /// walks the cached sums and one block instead of making a second pass over p and q.
    pub fn with_scratch(
        p: Dist<'a, Wp>,
        q: Dist<'a, Wq>,
        scratch: &'a mut Vec<f64>,
    ) -> Result<Self, CoreError> {
        let mut r = Self::unscanned(p, q)?;
        scratch.clear();
        let n = r.len();
        let mut mass = 0.0;
        let mut start = 0;
        while start < n {
            let end = (start + BLOCK).min(n);
            let s = r.block_sum(start, end);
            scratch.push(s);
            mass += s;
            start = end;
        }
        r.raw_mass = mass;
        r.blocks = Some(scratch.as_slice());
        Ok(r)
    }

    fn unscanned(p: Dist<'a, Wp>, q: Dist<'a, Wq>) -> Result<Self, CoreError> {
        if p.len() != q.len() {
            return Err(CoreError::invalid(
                "q",
                format!("has {} entries but the target has {}", q.len(), p.len()),
            ));
        }
        Ok(Self {
            p: p.weights(),
            q: q.weights(),
            p_scale: 1.0 / p.total(),
            q_factor: p.total() / q.total(),
            raw_mass: 0.0,
            blocks: None,
        })
    }

    /// Σ max(0, p − q) ∈ [0, 1].
    pub fn mass(&self) -> f64 {
        self.raw_mass * self.p_scale
    }

    /// The normalised residual probability of `token` (0 when the mass is 0 or the token is out of range).
    pub fn prob(&self, token: usize) -> f64 {
        if token >= self.p.len() || self.raw_mass <= 0.0 {
            0.0
        } else {
            self.weight(token) / self.raw_mass
        }
    }
}

impl<Wp: Weight, Wq: Weight> Categorical for Residual<'_, Wp, Wq> {
    fn len(&self) -> usize {
        self.p.len()
    }
    #[inline(always)]
    fn weight(&self, i: usize) -> f64 {
        positive_part(self.p[i].to_f64() - self.q[i].to_f64() * self.q_factor)
    }
    #[inline(always)]
    fn block_sum(&self, start: usize, end: usize) -> f64 {
        let c = self.q_factor;
        let (p, q) = (&self.p[start..end], &self.q[start..end]);
        debug_assert!(p.len() <= BLOCK);
        let mut acc = [0.0f64; 8];
        // Full blocks as fixed-size arrays: the same order of additions, with no bounds checks in the loop.
        if let (Ok(x), Ok(y)) = (<&[Wp; BLOCK]>::try_from(p), <&[Wq; BLOCK]>::try_from(q)) {
            for i in 0..BLOCK / 8 {
                for j in 0..8 {
                    acc[j] += positive_part(x[i * 8 + j].to_f64() - y[i * 8 + j].to_f64() * c);
                }
            }
            return reduce_lanes(acc);
        }
        let mut pc = p.chunks_exact(8);
        let mut qc = q.chunks_exact(8);
        for (x, y) in (&mut pc).zip(&mut qc) {
            for j in 0..8 {
                acc[j] += positive_part(x[j].to_f64() - y[j].to_f64() * c);
            }
        }
        for (j, (x, y)) in pc.remainder().iter().zip(qc.remainder()).enumerate() {
            acc[j] += positive_part(x.to_f64() - y.to_f64() * c);
        }
        reduce_lanes(acc)
    }
    fn total(&self) -> f64 {
        self.raw_mass
    }
    fn cached_block_sums(&self) -> Option<&[f64]> {
        self.blocks
    }
}

thread_local! {
    /// Block sums of the residual being drawn, reused across calls on this thread (no allocation once warm).
    static RESIDUAL_BLOCKS: std::cell::RefCell<Vec<f64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// max(0, d) as a plain select (vectorises; `f64::max`'s NaN rules do not, and no NaN reaches here).
#[inline(always)]
fn positive_part(d: f64) -> f64 {
    if d > 0.0 { d } else { 0.0 }
}

/// Draws the correction token from norm(max(0, p − q)), or from p when the residual has no mass (module note).
///
/// One pass over p and q computes the residual's block sums (kept in a per-thread buffer, so no allocation once
/// warm); the inverse-CDF walk with one uniform then reads the cached sums and a single block.
pub fn sample_residual<Wp: Weight, Wq: Weight, C: Chance + ?Sized>(
    p: Dist<'_, Wp>,
    q: Dist<'_, Wq>,
    chance: &mut C,
) -> Result<u32, CoreError> {
    RESIDUAL_BLOCKS.with_borrow_mut(|scratch| {
        let r = Residual::with_scratch(p, q, scratch)?;
        Ok(if r.mass() > 0.0 {
            chance.categorical(&r) as u32
        } else {
            p.sample(chance)
        })
    })
}

/// The acceptance loop shared by all entry points. `target(j)` yields p_j (validated lazily, so rows after a
/// rejection are never read). Returns the verdict and, on rejection, p at the rejected position.
pub(crate) fn judge_with<'a, W: Weight, C: Chance + ?Sized>(
    tokens: &[u32],
    q_of: impl Fn(usize) -> f64,
    mut target: impl FnMut(usize) -> Result<Dist<'a, W>, CoreError>,
    chance: &mut C,
) -> Result<(Verdict, Option<Dist<'a, W>>), CoreError> {
    for (j, &y) in tokens.iter().enumerate() {
        let p = target(j)?;
        let p_y = p.prob(y as usize).ok_or_else(|| {
            CoreError::invalid_at(
                "draft.tokens",
                j,
                format!("token {y} is outside the vocabulary of {}", p.len()),
            )
        })?;
        let a = acceptance_probability(p_y, q_of(j));
        if a < 1.0 && !chance.bernoulli(a) {
            return Ok((Verdict::Rejected { position: j }, Some(p)));
        }
    }
    let p = target(tokens.len())?;
    Ok((
        Verdict::AllAccepted {
            accepted: tokens.len(),
            bonus: p.sample(chance),
        },
        None,
    ))
}

/// Accept/reject decisions for one draft when the verifier has only token–probability pairs (paper B's uplink).
///
/// `targets` holds p_1..p_{L+1} (at least L + 1 distributions). On rejection the caller exchanges a distribution
/// and draws the correction with [`crate::correction::correct`].
pub fn judge<W: Weight, C: Chance + ?Sized>(
    targets: &[Dist<'_, W>],
    draft: &Draft,
    chance: &mut C,
) -> Result<Verdict, CoreError> {
    check_targets(targets.len(), draft.len())?;
    Ok(judge_with(draft.tokens(), |j| draft.probs()[j], |j| Ok(targets[j]), chance)?.0)
}

/// A complete round when one side holds both p and q (the server with uploaded draft distributions, or a
/// simulation): acceptance, then residual or bonus sampling.
///
/// ```
/// use spin_core::{Dist, verify};
/// use rand::SeedableRng;
///
/// let p_rows: [[f32; 3]; 3] = [[0.2, 0.5, 0.3], [0.6, 0.2, 0.2], [0.1, 0.1, 0.8]];
/// let q_rows: [[f32; 3]; 2] = [[0.4, 0.4, 0.2], [0.3, 0.3, 0.4]];
/// let p: Vec<Dist> = p_rows.iter().map(|r| Dist::new(r)).collect::<Result<_, _>>()?;
/// let q: Vec<Dist> = q_rows.iter().map(|r| Dist::new(r)).collect::<Result<_, _>>()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
/// let out = verify(&p, &[1, 2], &q, &mut rng)?;
/// assert!(out.accepted <= 2 && out.emitted() == out.accepted + 1);
/// # Ok::<(), spin_core::CoreError>(())
/// ```
pub fn verify<Wp: Weight, Wq: Weight, C: Chance + ?Sized>(
    targets: &[Dist<'_, Wp>],
    tokens: &[u32],
    drafts: &[Dist<'_, Wq>],
    chance: &mut C,
) -> Result<Outcome, CoreError> {
    check_targets(targets.len(), tokens.len())?;
    check_drafts(drafts, tokens)?;
    let q_of = |j: usize| drafts[j].prob(tokens[j] as usize).unwrap_or(0.0);
    let (verdict, p_r) = judge_with(tokens, q_of, |j| Ok(targets[j]), chance)?;
    finish(verdict, p_r, |r| drafts[r], chance)
}

/// Turns a verdict into an outcome, drawing the correction from the residual at the rejected position.
pub(crate) fn finish<'a, Wp: Weight, Wq: Weight, C: Chance + ?Sized>(
    verdict: Verdict,
    p_r: Option<Dist<'a, Wp>>,
    q_at: impl FnOnce(usize) -> Dist<'a, Wq>,
    chance: &mut C,
) -> Result<Outcome, CoreError> {
    Ok(match (verdict, p_r) {
        (Verdict::AllAccepted { accepted, bonus }, _) => Outcome {
            accepted,
            token: bonus,
            rejected_at: None,
        },
        (Verdict::Rejected { position }, Some(p)) => {
            let token = sample_residual(p, q_at(position), chance)?;
            Outcome {
                accepted: position,
                token,
                rejected_at: Some(position),
            }
        }
        (Verdict::Rejected { .. }, None) => {
            return Err(CoreError::invalid(
                "targets",
                "rejection without a target distribution",
            ));
        }
    })
}

pub(crate) fn check_targets(targets: usize, draft_len: usize) -> Result<(), CoreError> {
    if targets < draft_len + 1 {
        return Err(CoreError::invalid(
            "targets",
            format!(
                "has {targets} distributions but a draft of length {draft_len} needs {}",
                draft_len + 1
            ),
        ));
    }
    Ok(())
}

pub(crate) fn check_drafts<W: Weight>(drafts: &[Dist<'_, W>], tokens: &[u32]) -> Result<(), CoreError> {
    if drafts.len() != tokens.len() {
        return Err(CoreError::invalid(
            "drafts",
            format!("has {} distributions for {} tokens", drafts.len(), tokens.len()),
        ));
    }
    for (j, (d, &y)) in drafts.iter().zip(tokens).enumerate() {
        if !d.prob(y as usize).is_some_and(|q| q > 0.0) {
            return Err(CoreError::invalid_at(
                "drafts",
                j,
                format!("drafted token {y} has no positive probability in its draft distribution"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn zero_draft_probability_is_an_error() {
        let e = Draft::new(vec![3, 4], vec![0.5, 0.0]).unwrap_err();
        assert_eq!(e.to_string(), "draft.probs[1]: 0 for token 4 is outside (0, 1]");
        let q = [0.5f32, 0.5, 0.0];
        let d = Dist::new(&q).unwrap();
        let e = Draft::from_dists(&[2], &[d]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "draft.tokens[0]: token 2 has zero draft probability"
        );
        assert!(Draft::from_dists(&[7], &[d]).is_err());
    }

    #[test]
    fn shape_errors_name_the_field() {
        let p = [0.5f32, 0.5];
        let d = Dist::new(&p).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let draft = Draft::from_dists(&[0, 1], &[d, d]).unwrap();
        let e = judge(&[d, d], &draft, &mut rng).unwrap_err();
        assert!(e.to_string().starts_with("targets:"), "{e}");
        let e = verify(&[d, d, d], &[0, 1], &[d], &mut rng).unwrap_err();
        assert!(e.to_string().starts_with("drafts:"), "{e}");
    }

    #[test]
    fn p_equal_q_always_accepts() {
        let p = [0.1f32, 0.2, 0.3, 0.4];
        let d = Dist::new(&p).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..200 {
            let out = verify(&[d, d, d], &[3, 0], &[d, d], &mut rng).unwrap();
            assert_eq!(out.accepted, 2);
            assert!(!out.needs_exchange());
        }
        assert_eq!(Residual::new(d, d).unwrap().mass(), 0.0);
    }

    #[test]
    fn zero_mass_residual_falls_back_to_target() {
        // p = q: the residual is empty; a forced rejection path still returns a token of positive p.
        let p = [0.0f32, 0.5, 0.5];
        let d = Dist::new(&p).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for _ in 0..100 {
            assert_ne!(sample_residual(d, d, &mut rng).unwrap(), 0);
        }
    }

    #[test]
    fn residual_support_and_mass() {
        let p = [0.5f64, 0.3, 0.2];
        let q = [0.2f64, 0.3, 0.5];
        let r = Residual::new(Dist::new(&p).unwrap(), Dist::new(&q).unwrap()).unwrap();
        assert!((r.mass() - 0.3).abs() < 1e-15);
        assert_eq!(r.prob(0), 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for _ in 0..100 {
            assert_eq!(
                sample_residual(Dist::new(&p).unwrap(), Dist::new(&q).unwrap(), &mut rng).unwrap(),
                0
            );
        }
    }
}
