//! The server half of speculative decoding: the target model with one KV cache per device, one padded batch forward
//! over the drafts of a round (paper A eq. 7), and spin-core's accept / residual / bonus decisions, with the
//! correction done on the side the caller chooses (UL: the device's q_r came up; DL: the target's p_r goes down and
//! the device reports its draw). docs/model.md §1 steps 2–5; docs/system.md.
//!
//! The verifier is the authority on every device's committed text: it applies the token budget and EOS and tells
//! the caller when a device is finished.

use crate::error::{Result, RuntimeError};
use crate::model::{KvCache, Model};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_core::correction::{Mode, Payload, correct};
use spin_core::{
    AlphaEstimator, Dist, Draft, DraftRef, PaddedTargets, SamplingParams, SparseDist, Verdict, judge,
    verify_batch,
};
use std::ops::Deref;
use std::time::Instant;

/// Target probability rows a thread must have to be worth starting ([`Verifier::verify`]).
const ROWS_PER_THREAD: usize = 3;

/// Settings of a verifier.
#[derive(Debug, Clone, Copy)]
pub struct VerifierConfig {
    /// Sampling applied to the target (must match the drafters').
    pub params: SamplingParams,
    /// Tokens to generate per device.
    pub max_new_tokens: usize,
    /// A device stops when it emits this token.
    pub eos: Option<u32>,
    /// Seed of the verifier's random draws (stream 0 of the run's seed).
    pub seed: u64,
}

/// The distributions that came with a draft.
#[derive(Debug, Clone, Copy)]
pub enum DraftDists<'a> {
    /// Dense q_j rows (in process): the round completes at once, correction included.
    Dense(&'a [Vec<f32>]),
    /// Sparse q_j as sent (paper A's payload): the round completes at once, correction included.
    Sparse(&'a [SparseDist]),
    /// Only q_j(y_j) per token (paper B): a rejection leaves a correction pending.
    Probs(&'a [f32]),
}

/// One device's draft in a round.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    /// The device index (from [`Verifier::add_devices`]).
    pub device: usize,
    /// y_1..y_γ.
    pub tokens: &'a [u32],
    /// What came with the tokens.
    pub dists: DraftDists<'a>,
}

/// The verdict on one submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The round is complete: `accepted` drafted tokens and then `token` are committed.
    Done {
        /// Drafted tokens accepted.
        accepted: usize,
        /// The residual or bonus token.
        token: u32,
        /// Whether the first drafted token was rejected (a correction was drawn, on the server).
        rejected: bool,
    },
    /// Rejected at `position` with only token probabilities known: a UL or DL correction must follow.
    Pending {
        /// The rejected position r (= the accepted count).
        position: usize,
    },
}

struct Pending {
    drafted: Vec<u32>,
    position: usize,
    p: Vec<f32>,
}

struct Slot {
    tokens: Vec<u32>,
    prompt_len: usize,
    cache: KvCache,
    done: bool,
    pending: Option<Pending>,
    alpha: AlphaEstimator,
    rounds: usize,
}

/// The server-side verifier.
pub struct Verifier<M: Deref<Target = Model>> {
    model: M,
    cfg: VerifierConfig,
    slots: Vec<Slot>,
    rng: ChaCha8Rng,
    scratch: Vec<f32>,
    /// Under top-1 sampling, leave a rejected pair draft pending for a distribution exchange (the papers' paper-B
    /// exchange) instead of correcting it at once ([`Verifier::set_pair_exchange`]).
    pair_exchange: bool,
    /// Tests: judge every round in general, so that the greedy judge can be checked against it.
    #[cfg(test)]
    general_only: bool,
}

impl<M: Deref<Target = Model>> Verifier<M> {
    /// A verifier with no devices; its RNG is stream 0 of `cfg.seed`.
    pub fn new(model: M, cfg: VerifierConfig) -> Self {
        Self {
            model,
            cfg,
            slots: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            scratch: Vec::new(),
            pair_exchange: false,
            #[cfg(test)]
            general_only: false,
        }
    }

    /// Whether, under top-1 sampling, a rejected draft of (token, probability) pairs waits for a distribution
    /// exchange ([`Decision::Pending`]) as at any other temperature; off (the default), it is corrected at once with
    /// the target's token, which is what the exchange would give (see `judge_pairs`).
    pub fn set_pair_exchange(&mut self, on: bool) {
        self.pair_exchange = on;
    }

    /// The target's vocabulary size.
    pub fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    /// The settings.
    pub fn config(&self) -> &VerifierConfig {
        &self.cfg
    }

    /// Adds devices with their prompts, prefilling every prompt but its last token in one padded batch; returns
    /// the index of the first new device. A model with a restricted draft head is refused as the target
    /// ([`Model::check_full_head`]).
    pub fn add_devices(&mut self, prompts: &[Vec<u32>]) -> Result<usize> {
        self.model.check_full_head("target")?;
        let first = self.slots.len();
        let vocab = self.vocab();
        for (k, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(RuntimeError::invalid(format!("prompts[{k}]"), "is empty"));
            }
            if let Some(t) = p.iter().find(|&&t| t as usize >= vocab) {
                return Err(RuntimeError::invalid(
                    format!("prompts[{k}]"),
                    format!("token {t} is outside the vocabulary of {vocab}"),
                ));
            }
        }
        let mut caches: Vec<KvCache> = prompts.iter().map(|_| self.model.new_cache()).collect();
        let long: Vec<usize> = (0..prompts.len()).filter(|&k| prompts[k].len() > 1).collect();
        if !long.is_empty() {
            let refs: Vec<&[u32]> = long
                .iter()
                .map(|&k| &prompts[k][..prompts[k].len() - 1])
                .collect();
            let mut cref: Vec<&mut KvCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(k, _)| prompts[*k].len() > 1)
                .map(|(_, c)| c)
                .collect();
            self.model.forward_batch(&mut cref, &refs)?;
        }
        for (p, cache) in prompts.iter().zip(caches) {
            self.slots.push(Slot {
                tokens: p.clone(),
                prompt_len: p.len(),
                cache,
                done: self.cfg.max_new_tokens == 0,
                pending: None,
                alpha: AlphaEstimator::new(),
                rounds: 0,
            });
        }
        Ok(first)
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no device was added.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slot(&self, device: usize) -> Result<&Slot> {
        self.slots.get(device).ok_or_else(|| {
            RuntimeError::invalid("device", format!("{device} is not a device of this verifier"))
        })
    }

    fn slot_mut(&mut self, device: usize) -> Result<&mut Slot> {
        self.slots.get_mut(device).ok_or_else(|| {
            RuntimeError::invalid("device", format!("{device} is not a device of this verifier"))
        })
    }

    /// Device `device`'s committed sequence (prompt and generated tokens).
    pub fn tokens(&self, device: usize) -> Result<&[u32]> {
        Ok(&self.slot(device)?.tokens)
    }

    /// The prompt length of `device`.
    pub fn prompt_len(&self, device: usize) -> Result<usize> {
        Ok(self.slot(device)?.prompt_len)
    }

    /// The generated tokens of `device`.
    pub fn generated(&self, device: usize) -> Result<&[u32]> {
        let s = self.slot(device)?;
        Ok(&s.tokens[s.prompt_len..])
    }

    /// Whether `device` has finished (token budget or EOS).
    pub fn is_done(&self, device: usize) -> Result<bool> {
        Ok(self.slot(device)?.done)
    }

    /// Whether `device` waits for a correction.
    pub fn is_pending(&self, device: usize) -> Result<bool> {
        Ok(self.slot(device)?.pending.is_some())
    }

    /// Verified rounds of `device`.
    pub fn rounds(&self, device: usize) -> Result<usize> {
        Ok(self.slot(device)?.rounds)
    }

    /// The acceptance statistics the server gathered for `device`.
    pub fn alpha(&self, device: usize) -> Result<&AlphaEstimator> {
        Ok(&self.slot(device)?.alpha)
    }

    /// The longest useful draft of `device`: one token below what its budget has left (the round adds one token of
    /// its own), 0 when done.
    pub fn max_draft_len(&self, device: usize) -> Result<usize> {
        let s = self.slot(device)?;
        if s.done {
            return Ok(0);
        }
        let generated = s.tokens.len() - s.prompt_len;
        Ok(self
            .cfg
            .max_new_tokens
            .saturating_sub(generated)
            .saturating_sub(1))
    }

    /// Verifies a round's drafts in one padded batch forward. Returns a decision per submission (same order) and the
    /// wall time of the forward pass in seconds.
    pub fn verify(&mut self, subs: &[Submission<'_>]) -> Result<(Vec<Decision>, f64)> {
        if subs.is_empty() {
            return Ok((Vec::new(), 0.0));
        }
        let vocab = self.vocab();
        self.check_submissions(subs)?;
        let positions = subs.iter().map(|s| s.tokens.len()).max().unwrap_or(0) + 1;
        let (flat, verify_s) = self.target_pass(subs, positions)?;
        let mut decisions = match self.judge_greedy(subs, &flat, positions)? {
            Some(d) => d,
            None => {
                // The target's rows as probabilities, each made once, straight into its place, with its total
                // (so no reader validates it again); a padded batch's padding rows are not computed.
                let lens: Vec<usize> = subs.iter().map(|s| s.tokens.len() + 1).collect();
                // A row takes tens of microseconds at this vocabulary size: a batch of several shares them out
                // over the pool's cores (each row the same bits on any count), a round of one or two rows does
                // not pay for a thread.
                let rows_n: usize = lens.iter().sum();
                let threads = if rows_n >= ROWS_PER_THREAD * 2 {
                    rayon::current_num_threads().clamp(1, rows_n / ROWS_PER_THREAD)
                } else {
                    1
                };
                let rows = spin_core::ProbRows::from_padded_logits(
                    flat,
                    subs.len(),
                    positions,
                    vocab,
                    &lens,
                    &self.cfg.params,
                    threads,
                )?;
                let targets = PaddedTargets::from_rows(&rows, subs.len(), positions)?;
                let mut decisions: Vec<Option<Decision>> = vec![None; subs.len()];
                self.judge_with_distributions(subs, rows.data(), &targets, &mut decisions)?;
                self.judge_pairs(subs, &targets, &mut decisions)?;
                decisions.into_iter().flatten().collect()
            }
        };
        for (s, d) in subs.iter().zip(decisions.iter_mut()) {
            let upto = match *d {
                Decision::Done { accepted, .. } => accepted,
                Decision::Pending { position } => position,
            };
            // An accepted drafted token that ends the sequence ends the round there, as it ends plain decoding:
            // what the drafts and the round's own token hold after it is never committed (nor corrected).
            if let Some(i) = self
                .cfg
                .eos
                .and_then(|e| s.tokens[..upto].iter().position(|&t| t == e))
            {
                if matches!(d, Decision::Pending { .. }) {
                    self.slot_mut(s.device)?.pending = None;
                }
                *d = Decision::Done {
                    accepted: i,
                    token: s.tokens[i],
                    rejected: false,
                };
            }
            if let Decision::Done { accepted, token, .. } = *d {
                self.commit(s.device, &s.tokens[..accepted], token)?;
            }
        }
        Ok((decisions, verify_s))
    }

    /// Every submission names a distinct device that may draft, tokens inside the vocabulary, one distribution
    /// per token of the vocabulary's size, and fits the context.
    fn check_submissions(&self, subs: &[Submission<'_>]) -> Result<()> {
        let vocab = self.vocab();
        let mut seen = vec![false; self.slots.len()];
        for (i, s) in subs.iter().enumerate() {
            let slot = self.slot(s.device)?;
            if std::mem::replace(&mut seen[s.device], true) {
                return Err(RuntimeError::invalid(
                    format!("submissions[{i}].device"),
                    format!("device {} appears twice", s.device),
                ));
            }
            if slot.done || slot.pending.is_some() {
                return Err(RuntimeError::invalid(
                    format!("submissions[{i}].device"),
                    format!("device {} is finished or waits for a correction", s.device),
                ));
            }
            if let Some(t) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(RuntimeError::invalid(
                    format!("submissions[{i}].tokens"),
                    format!("token {t} is outside the vocabulary of {vocab}"),
                ));
            }
            let n = match s.dists {
                DraftDists::Dense(d) => {
                    if let Some(r) = d.iter().find(|r| r.len() != vocab) {
                        return Err(RuntimeError::invalid(
                            format!("submissions[{i}].dists"),
                            format!("a row has {} entries for a vocabulary of {vocab}", r.len()),
                        ));
                    }
                    d.len()
                }
                DraftDists::Sparse(d) => {
                    if let Some(r) = d.iter().find(|r| r.vocab() != vocab) {
                        return Err(RuntimeError::invalid(
                            format!("submissions[{i}].dists"),
                            format!(
                                "a distribution over {} tokens for a vocabulary of {vocab}",
                                r.vocab()
                            ),
                        ));
                    }
                    d.len()
                }
                DraftDists::Probs(p) => p.len(),
            };
            if n != s.tokens.len() {
                return Err(RuntimeError::invalid(
                    format!("submissions[{i}].dists"),
                    format!("{n} distributions for {} tokens", s.tokens.len()),
                ));
            }
            let room = self.model.config().max_seq_len;
            if slot.tokens.len() + s.tokens.len() > room {
                return Err(RuntimeError::invalid(
                    format!("submissions[{i}].tokens"),
                    format!(
                        "{} committed and {} drafted tokens exceed the context of {room}",
                        slot.tokens.len(),
                        s.tokens.len()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The target's batched forward pass over every submission (the unfed tail of its sequence, then its draft):
    /// the logits of each submission's last `g + 1` positions (the rows its draft is judged on), padded to
    /// `positions` rows per submission, (submissions, positions, vocab) row-major, and the pass's wall time in
    /// seconds. The rows come from the pass's own buffer (`Model::forward_batch_rows`), one copy.
    fn target_pass(&mut self, subs: &[Submission<'_>], positions: usize) -> Result<(Vec<f32>, f64)> {
        let vocab = self.vocab();
        // Target inputs: the unfed tail of each sequence, then its draft.
        let inputs: Vec<Vec<u32>> = subs
            .iter()
            .map(|s| {
                let slot = &self.slots[s.device];
                let mut v = slot.tokens[slot.cache.len()..].to_vec();
                v.extend_from_slice(s.tokens);
                v
            })
            .collect();
        let mut flat = vec![0f32; subs.len() * positions * vocab];
        let start = Instant::now();
        {
            let mut order: Vec<(usize, usize)> =
                subs.iter().enumerate().map(|(i, s)| (s.device, i)).collect();
            order.sort_unstable();
            let mut caches: Vec<Option<&mut KvCache>> = (0..subs.len()).map(|_| None).collect();
            let mut it = order.iter().peekable();
            for (k, slot) in self.slots.iter_mut().enumerate() {
                if let Some(&&(dev, i)) = it.peek()
                    && dev == k
                {
                    caches[i] = Some(&mut slot.cache);
                    it.next();
                }
            }
            let mut caches: Vec<&mut KvCache> = caches.into_iter().flatten().collect();
            let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
            self.model
                .forward_batch_rows(&mut caches, &refs, &mut |i, rows| {
                    let g = subs[i].tokens.len();
                    let last = &rows[rows.len() - (g + 1) * vocab..];
                    flat[i * positions * vocab..][..last.len()].copy_from_slice(last);
                })?;
        }
        Ok((flat, start.elapsed().as_secs_f64()))
    }

    /// Greedy verification (top-1 sampling, e.g. temperature 0) of in-process drafts, straight from the logits:
    /// the target's distribution at each position is one-hot at its first largest logit (what `probs_into`
    /// writes), so a drafted token is accepted exactly when it is that token, the first one that is not is
    /// replaced by it, and a draft accepted whole gets the next position's. These are the decisions (and the
    /// acceptance records: min(1, p(y)/q(y)) is 1 or 0) the general judge reaches on the one-hot rows, without
    /// writing a probability row per position or drawing a number. `None` (judge in general) unless sampling is
    /// top-1 and every submission carries dense draft rows that give each drafted token a positive probability.
    fn judge_greedy(
        &mut self,
        subs: &[Submission<'_>],
        flat: &[f32],
        positions: usize,
    ) -> Result<Option<Vec<Decision>>> {
        #[cfg(test)]
        if self.general_only {
            return Ok(None);
        }
        if self.cfg.params.top_k() != Some(1) {
            return Ok(None);
        }
        for s in subs {
            let DraftDists::Dense(q) = s.dists else {
                return Ok(None);
            };
            // `check_submissions` has made each draft one row per token, each row the vocabulary's length.
            if !s
                .tokens
                .iter()
                .zip(q)
                .all(|(&y, row)| row[y as usize] > 0.0 && row[y as usize] <= 1.0)
            {
                return Ok(None);
            }
        }
        let vocab = self.vocab();
        let mut decisions = Vec::with_capacity(subs.len());
        for (i, s) in subs.iter().enumerate() {
            let best = |j: usize| crate::probs::argmax(&flat[(i * positions + j) * vocab..][..vocab]);
            let slot = &mut self.slots[s.device];
            // The first drafted token that is not the target's top one, and the target's top one there.
            let mut first_rejected = None;
            for (j, &y) in s.tokens.iter().enumerate() {
                let top = best(j)?;
                slot.alpha.record_acceptance(if top == y { 1.0 } else { 0.0 })?;
                if top != y && first_rejected.is_none() {
                    first_rejected = Some((j, top));
                }
            }
            let (at, token) = match first_rejected {
                Some(r) => r,
                None => (s.tokens.len(), best(s.tokens.len())?),
            };
            slot.alpha.record_round(at, s.tokens.len())?;
            decisions.push(Decision::Done {
                accepted: at,
                token,
                rejected: first_rejected.is_some(),
            });
        }
        Ok(Some(decisions))
    }

    /// The submissions that carry distributions (dense, or sparse expanded and renormalised), judged in one batch
    /// in their order (the in-process loop's stream); every one is decided.
    fn judge_with_distributions(
        &mut self,
        subs: &[Submission<'_>],
        flat: &[f32],
        targets: &PaddedTargets<'_>,
        decisions: &mut [Option<Decision>],
    ) -> Result<()> {
        let vocab = self.vocab();
        let positions = targets.positions();
        // Dense forms of every submission that carries distributions (sparse ones expanded and renormalised).
        let mut dense: Vec<Vec<Vec<f32>>> = vec![Vec::new(); subs.len()];
        for (i, s) in subs.iter().enumerate() {
            if let DraftDists::Sparse(d) = s.dists {
                dense[i] = d
                    .iter()
                    .map(|sd| {
                        let mut v = Vec::new();
                        sd.write_dense(&mut v);
                        v
                    })
                    .collect();
            }
        }
        let with_dists: Vec<usize> = (0..subs.len())
            .filter(|&i| !matches!(subs[i].dists, DraftDists::Probs(_)))
            .collect();
        if !with_dists.is_empty() {
            // One batch over the submissions with distributions, in their order (the in-process loop's stream).
            let rows_of = |i: usize| -> &[Vec<f32>] {
                match subs[i].dists {
                    DraftDists::Dense(d) => d,
                    _ => &dense[i],
                }
            };
            let q_dists: Vec<Vec<Dist<'_>>> = with_dists
                .iter()
                .map(|&i| {
                    rows_of(i)
                        .iter()
                        .map(|q| Dist::new(q))
                        .collect::<std::result::Result<_, _>>()
                })
                .collect::<std::result::Result<_, _>>()?;
            // Every submission carries distributions (the usual case): the batch is the whole one, no copy.
            let mut sub_flat = Vec::new();
            let sub_targets = if with_dists.len() == subs.len() {
                *targets
            } else {
                sub_flat.reserve(with_dists.len() * positions * vocab);
                for &i in &with_dists {
                    sub_flat.extend_from_slice(&flat[i * positions * vocab..(i + 1) * positions * vocab]);
                }
                PaddedTargets::new(&sub_flat, with_dists.len(), positions, vocab)?
            };
            let refs: Vec<DraftRef<'_, '_>> = with_dists
                .iter()
                .zip(&q_dists)
                .map(|(&i, qd)| DraftRef {
                    tokens: subs[i].tokens,
                    dists: qd,
                })
                .collect();
            let outcomes = verify_batch(&sub_targets, &refs, &mut self.rng)?;
            for ((&i, out), qd) in with_dists.iter().zip(&outcomes).zip(&q_dists) {
                let s = &subs[i];
                let p_rows: Vec<Dist<'_>> = (0..=s.tokens.len())
                    .map(|j| targets.dist(i, j))
                    .collect::<std::result::Result<_, _>>()?;
                let draft = Draft::from_dists(s.tokens, qd)?;
                let slot = &mut self.slots[s.device];
                slot.alpha.record_draft(&p_rows, &draft)?;
                slot.alpha.record_outcome(out, s.tokens.len())?;
                decisions[i] = Some(Decision::Done {
                    accepted: out.accepted,
                    token: out.token,
                    rejected: out.rejected_at.is_some(),
                });
            }
        }
        Ok(())
    }

    /// The submissions that carry (token, probability) pairs only, judged one by one; a rejection leaves the
    /// device waiting for its correction, except under top-1 sampling (temperature 0) without `pair_exchange`: there
    /// the target's p at the rejected position is one-hot at its token a, so the residual (p − q)⁺ is a's mass
    /// alone whatever the draft's q, and the correction is a, decided here with no exchange.
    fn judge_pairs(
        &mut self,
        subs: &[Submission<'_>],
        targets: &PaddedTargets<'_>,
        decisions: &mut [Option<Decision>],
    ) -> Result<()> {
        let top1 = self.cfg.params.top_k() == Some(1) && !self.pair_exchange;
        for (i, s) in subs.iter().enumerate() {
            let DraftDists::Probs(probs) = s.dists else {
                continue;
            };
            let p_rows: Vec<Dist<'_>> = (0..=s.tokens.len())
                .map(|j| targets.dist(i, j))
                .collect::<std::result::Result<_, _>>()?;
            let draft = Draft::new(s.tokens.to_vec(), probs.iter().map(|&q| f64::from(q)).collect())?;
            let verdict = judge(&p_rows, &draft, &mut self.rng)?;
            let slot = &mut self.slots[s.device];
            slot.alpha.record_draft(&p_rows, &draft)?;
            slot.alpha.record_round(verdict.accepted(), s.tokens.len())?;
            decisions[i] = Some(match verdict {
                Verdict::AllAccepted { accepted, bonus } => Decision::Done {
                    accepted,
                    token: bonus,
                    rejected: false,
                },
                Verdict::Rejected { position } if top1 => Decision::Done {
                    accepted: position,
                    token: crate::probs::argmax(p_rows[position].weights())?,
                    rejected: true,
                },
                Verdict::Rejected { position } => {
                    slot.pending = Some(Pending {
                        drafted: s.tokens.to_vec(),
                        position,
                        p: p_rows[position].weights().to_vec(),
                    });
                    Decision::Pending { position }
                }
            });
        }
        Ok(())
    }

    /// The target's p_r of a pending device, truncated to `v_eff` and quantised to `q_bits` (the DL payload).
    pub fn downlink_p(&self, device: usize, v_eff: usize, q_bits: u32) -> Result<SparseDist> {
        let p = self.pending_of(device)?;
        let v_eff = v_eff.min(p.p.len()).max(1);
        Ok(SparseDist::truncate(Dist::new(&p.p)?, v_eff)?.quantise(q_bits)?)
    }

    fn pending_of(&self, device: usize) -> Result<&Pending> {
        self.slot(device)?
            .pending
            .as_ref()
            .ok_or_else(|| RuntimeError::invalid("device", format!("{device} has no pending correction")))
    }

    /// UL mode: draws the correction from p_r and the uploaded q_r, commits it and returns the token.
    pub fn resolve_uplink(&mut self, device: usize, q: &SparseDist) -> Result<u32> {
        let vocab = self.vocab();
        if q.vocab() != vocab {
            return Err(RuntimeError::invalid(
                "q",
                format!(
                    "a distribution over {} tokens for a vocabulary of {vocab}",
                    q.vocab()
                ),
            ));
        }
        let slot = self.slots.get_mut(device).ok_or_else(|| {
            RuntimeError::invalid("device", format!("{device} is not a device of this verifier"))
        })?;
        let p = slot
            .pending
            .take()
            .ok_or_else(|| RuntimeError::invalid("device", format!("{device} has no pending correction")))?;
        let c = match correct(
            Mode::Uplink,
            Dist::new(&p.p)?,
            Payload::sparse(q),
            &mut self.scratch,
            &mut self.rng,
        ) {
            Ok(c) => c,
            Err(e) => {
                slot.pending = Some(p);
                return Err(e.into());
            }
        };
        self.commit(device, &p.drafted[..p.position], c.token)?;
        Ok(c.token)
    }

    /// DL mode: commits the correction token the device drew from the downloaded p_r.
    pub fn resolve_token(&mut self, device: usize, token: u32) -> Result<()> {
        let vocab = self.vocab();
        if token as usize >= vocab {
            return Err(RuntimeError::invalid(
                "token",
                format!("{token} is outside the vocabulary of {vocab}"),
            ));
        }
        let p =
            self.slot_mut(device)?.pending.take().ok_or_else(|| {
                RuntimeError::invalid("device", format!("{device} has no pending correction"))
            })?;
        self.commit(device, &p.drafted[..p.position], token)
    }

    /// Drops a pending correction (the device left mid-round): the round commits nothing for it, and the cache rolls
    /// back to the committed tokens.
    pub fn abandon(&mut self, device: usize) -> Result<()> {
        let slot = self.slot_mut(device)?;
        slot.pending = None;
        let keep = slot.cache.len().min(slot.tokens.len() - 1);
        slot.cache.truncate(keep)?;
        Ok(())
    }

    /// Frees `device`'s key-value cache (its session ended before it finished: the device left, or never came back
    /// within the resume window). Its committed tokens stay readable; any pending correction is dropped, and a later
    /// round for it would re-run its context from scratch (a server does not plan one).
    pub fn release(&mut self, device: usize) -> Result<()> {
        let cache = self.model.new_cache();
        let slot = self.slot_mut(device)?;
        slot.pending = None;
        slot.cache = cache;
        Ok(())
    }

    fn commit(&mut self, device: usize, accepted: &[u32], token: u32) -> Result<()> {
        let (max_new, eos) = (self.cfg.max_new_tokens, self.cfg.eos);
        let slot = self.slot_mut(device)?;
        slot.tokens.extend_from_slice(accepted);
        slot.tokens.push(token);
        slot.rounds += 1;
        let keep = slot.cache.len().min(slot.tokens.len() - 1);
        slot.cache.truncate(keep)?;
        let generated = slot.tokens.len() - slot.prompt_len;
        if generated >= max_new || Some(token) == eos {
            slot.tokens.truncate(slot.prompt_len + generated.min(max_new));
            let keep = slot.cache.len().min(slot.tokens.len().saturating_sub(1));
            slot.cache.truncate(keep)?;
            slot.done = true;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drafter::{DistForm, Drafter, device_rng};
    use crate::model::tiny_random_model;
    use candle_core::Device;

    /// At top-1 sampling the greedy judge reaches the general judge's decisions and acceptance records, round by
    /// round, with drafts that are often rejected, sometimes accepted whole, and end at the token budget; the same
    /// drafts sent as (token, probability) pairs are decided at once as well, with the same decisions.
    #[test]
    fn the_greedy_judge_decides_as_the_general_one() {
        let dev = Device::Cpu;
        let target = tiny_random_model(11, 0.4, 2, &dev).unwrap();
        let greedy = crate::probs::sampling(0.0).unwrap();
        let prompt = vec![1u32, 6, 2];
        let mut rounds = 0;
        for (seed, draft_len) in [(12, 3), (13, 1), (14, 5)] {
            let draft = tiny_random_model(seed, 0.4, 1, &dev).unwrap();
            for model in [&draft, &target] {
                let cfg = VerifierConfig {
                    params: greedy,
                    max_new_tokens: 40,
                    eos: None,
                    seed: 3,
                };
                let mut fast = Verifier::new(&target, cfg);
                let mut general = Verifier::new(&target, cfg);
                general.general_only = true;
                // The same drafts as (token, probability) pairs only: decided at once too, no correction pending.
                let mut pairs = Verifier::new(&target, cfg);
                fast.add_devices(std::slice::from_ref(&prompt)).unwrap();
                general.add_devices(std::slice::from_ref(&prompt)).unwrap();
                pairs.add_devices(std::slice::from_ref(&prompt)).unwrap();
                let mut d = Drafter::new(
                    model,
                    &prompt,
                    prompt.len(),
                    greedy,
                    DistForm::Dense,
                    device_rng(5, 0),
                )
                .unwrap();
                while !fast.is_done(0).unwrap() {
                    let len = draft_len.min(fast.max_draft_len(0).unwrap());
                    let out = d.draft(len).unwrap();
                    let sub = Submission {
                        device: 0,
                        tokens: &out.tokens,
                        dists: DraftDists::Dense(d.last_dists()),
                    };
                    let (a, _) = fast.verify(std::slice::from_ref(&sub)).unwrap();
                    let (b, _) = general.verify(std::slice::from_ref(&sub)).unwrap();
                    assert_eq!(a, b, "round {rounds}");
                    let sub_pairs = Submission {
                        device: 0,
                        tokens: &out.tokens,
                        dists: DraftDists::Probs(&out.probs),
                    };
                    let (c, _) = pairs.verify(std::slice::from_ref(&sub_pairs)).unwrap();
                    assert_eq!(a, c, "pairs, round {rounds}");
                    assert_eq!(fast.tokens(0).unwrap(), pairs.tokens(0).unwrap());
                    assert_eq!(
                        fast.alpha(0).unwrap(),
                        general.alpha(0).unwrap(),
                        "round {rounds}"
                    );
                    assert_eq!(fast.tokens(0).unwrap(), general.tokens(0).unwrap());
                    let Decision::Done { accepted, token, .. } = a[0] else {
                        panic!("a dense draft is decided at once");
                    };
                    d.commit(accepted, token).unwrap();
                    d.cut(fast.tokens(0).unwrap().len()).unwrap();
                    rounds += 1;
                }
                assert!(general.is_done(0).unwrap());
            }
        }
        assert!(rounds > 20, "{rounds} rounds");
    }
}
