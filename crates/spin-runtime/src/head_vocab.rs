//! A draft model's restricted output head: the model scores only V_d listed tokens of the target's vocabulary
//! (e.g. its most frequent ones), every other token gets q = 0, and speculative sampling stays exact because the
//! target's residual max(p − q, 0) covers every token the draft cannot propose (docs/runtime.md, "Restricted
//! draft head").
//!
//! The draft model itself is an ordinary [`crate::Model`] over a compact vocabulary of V_d + 1 ids: id j < V_d
//! stands for the target token `ids[j]`, and id V_d ("other") is the input embedding of every unlisted token. Its
//! logit is never used: the rows handed to the sampler are over the target's whole vocabulary, with −∞ at every
//! unlisted token. The [`crate::drafter::Drafter`] maps inputs to compact ids and expands the rows.

use crate::error::{Result, RuntimeError};

/// The map between a target's vocabulary and a restricted draft head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadVocab {
    /// Compact id → target id, for the V_d scored tokens.
    ids: Vec<u32>,
    /// Target id → compact id (V_d for an unlisted token).
    slot: Vec<u32>,
}

impl HeadVocab {
    /// A head over the target tokens `ids` (distinct, each below `full_vocab`, at least one) of a target with
    /// `full_vocab` tokens.
    pub fn new(ids: Vec<u32>, full_vocab: usize) -> Result<Self> {
        if ids.is_empty() {
            return Err(RuntimeError::invalid("head_vocab", "lists no token"));
        }
        if full_vocab > crate::limits::MAX_VOCAB {
            return Err(RuntimeError::invalid(
                "head_vocab",
                format!(
                    "a target vocabulary of {full_vocab} exceeds the limit of {}",
                    crate::limits::MAX_VOCAB
                ),
            ));
        }
        if ids.len() >= full_vocab {
            return Err(RuntimeError::invalid(
                "head_vocab",
                format!(
                    "lists {} tokens of a vocabulary of {full_vocab}: a restricted head lists fewer",
                    ids.len()
                ),
            ));
        }
        let other = ids.len() as u32;
        let mut slot = vec![other; full_vocab];
        for (j, &t) in ids.iter().enumerate() {
            let Some(s) = slot.get_mut(t as usize) else {
                return Err(RuntimeError::invalid(
                    "head_vocab",
                    format!("token {t} is outside the target's vocabulary of {full_vocab}"),
                ));
            };
            if *s != other {
                return Err(RuntimeError::invalid(
                    "head_vocab",
                    format!("token {t} is listed twice"),
                ));
            }
            *s = j as u32;
        }
        Ok(Self { ids, slot })
    }

    /// The scored target tokens, in compact order.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// The target's vocabulary size (the width of the rows the drafter samples from).
    pub fn full_vocab(&self) -> usize {
        self.slot.len()
    }

    /// The draft model's own vocabulary: V_d scored ids and the "other" id.
    pub fn compact_vocab(&self) -> usize {
        self.ids.len() + 1
    }

    /// The compact id of a target token (the "other" id V_d for an unlisted one); an error outside the target's
    /// vocabulary.
    pub fn compact(&self, token: u32) -> Result<u32> {
        self.slot.get(token as usize).copied().ok_or_else(|| {
            RuntimeError::invalid(
                "tokens",
                format!("token {token} is outside the vocabulary of {}", self.full_vocab()),
            )
        })
    }

    /// Appends the compact ids of `tokens` to `out`.
    pub fn map_tokens(&self, tokens: &[u32], out: &mut Vec<u32>) -> Result<()> {
        out.reserve(tokens.len());
        for &t in tokens {
            out.push(self.compact(t)?);
        }
        Ok(())
    }

    /// A row of the draft's logits has compact_vocab entries.
    fn check_row(&self, compact: &[f32]) -> Result<()> {
        if compact.len() == self.compact_vocab() {
            return Ok(());
        }
        Err(RuntimeError::invalid(
            "logits",
            format!(
                "a row of {} entries for a head of {} ids",
                compact.len(),
                self.compact_vocab()
            ),
        ))
    }

    /// Expands one row of the draft's logits (compact_vocab entries) into a row over the target's vocabulary:
    /// each scored token's logit at its target id, −∞ everywhere else (the "other" logit is dropped).
    pub fn expand_logits(&self, compact: &[f32], out: &mut Vec<f32>) -> Result<()> {
        self.check_row(compact)?;
        out.clear();
        out.resize(self.full_vocab(), f32::NEG_INFINITY);
        for (&t, &l) in self.ids.iter().zip(compact) {
            out[t as usize] = l;
        }
        Ok(())
    }

    /// The distribution over the target's vocabulary of one row of the draft's logits (compact_vocab entries)
    /// under `params`: what [`crate::probs::probs_into`] gives for the [`expand_logits`](Self::expand_logits)
    /// row, computed over the scored ids alone (a twelfth of SmolLM2's vocabulary for a head of 4,096) and then
    /// placed at their target ids, every other entry 0. `scratch` holds the compact probabilities between calls.
    pub fn probs_into(
        &self,
        compact: &[f32],
        params: &spin_core::SamplingParams,
        scratch: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        self.check_row(compact)?;
        crate::probs::probs_into(&compact[..self.ids.len()], params, scratch)?;
        out.clear();
        out.resize(self.full_vocab(), 0.0);
        for (&t, &p) in self.ids.iter().zip(scratch.iter()) {
            out[t as usize] = p;
        }
        Ok(())
    }
}

/// The `n` most frequent ids of `counts` (count per target id), ties to the smaller id; ids never seen are not
/// listed, so fewer than `n` may come back.
pub fn most_frequent(counts: &[u64], n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..counts.len() as u32)
        .filter(|&t| counts[t as usize] > 0)
        .collect();
    order.sort_by(|&a, &b| counts[b as usize].cmp(&counts[a as usize]).then(a.cmp(&b)));
    order.truncate(n);
    order
}
