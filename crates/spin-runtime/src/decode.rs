//! Plain greedy decoding without a tensor, a sort or an allocation per token: what `generate` at temperature 0
//! with no drafter needs, and the baseline every speculative run is compared with (docs/runtime.md).
//!
//! It yields the same tokens as `speculative::generate_plain` at temperature 0 (top-1 sampling keeps the first
//! largest logit, as [`argmax`] does; tested), but reads each step's logits from the cache's own buffer
//! ([`Model::forward_logits`]) and takes the maximum in one pass instead of building a distribution.

use crate::error::{Result, RuntimeError};
use crate::model::Model;

/// The index of the first largest entry of `row`; an error naming `logits` when the row is empty or holds NaN or
/// +∞ (as `spin_core::probs_from_logits` refuses them).
pub fn argmax(row: &[f32]) -> Result<u32> {
    let mut best = 0usize;
    let mut max = f32::NEG_INFINITY;
    let mut bad = false;
    for (i, &x) in row.iter().enumerate() {
        bad |= x.is_nan() || x == f32::INFINITY;
        if x > max {
            max = x;
            best = i;
        }
    }
    if row.is_empty() || bad || max == f32::NEG_INFINITY {
        return Err(RuntimeError::invalid(
            "logits",
            "need a finite largest entry (empty, NaN, +∞ or all −∞)",
        ));
    }
    Ok(best as u32)
}

/// Greedy decoding of up to `max_new_tokens` tokens after `prompt`, stopping after `eos` when given.
pub fn greedy(model: &Model, prompt: &[u32], max_new_tokens: usize, eos: Option<u32>) -> Result<Vec<u32>> {
    greedy_with(model, prompt, max_new_tokens, eos, &mut |_| true)
}

/// [`greedy`], calling `on_token` with the tokens generated so far after each one (to stream them); it returns
/// whether to go on.
pub fn greedy_with(
    model: &Model,
    prompt: &[u32],
    max_new_tokens: usize,
    eos: Option<u32>,
    on_token: &mut dyn FnMut(&[u32]) -> bool,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(RuntimeError::invalid("prompt", "is empty"));
    }
    let vocab = model.config().vocab_size;
    let mut cache = model.new_cache();
    let mut out: Vec<u32> = Vec::with_capacity(max_new_tokens);
    for i in 0..max_new_tokens {
        // The prompt first, then the newest token alone.
        let input = if i == 0 { prompt } else { &out[i - 1..] };
        let logits = model.forward_logits(&mut cache, input)?;
        let t = argmax(&logits[logits.len() - vocab..])?;
        out.push(t);
        if !on_token(&out) || Some(t) == eos {
            break;
        }
    }
    Ok(out)
}
