//! Plain greedy decoding without a tensor, a sort or an allocation per token: what `generate` at temperature 0
//! with no drafter needs, and the baseline every speculative run is compared with (docs/runtime.md).
//!
//! It yields the same tokens as `speculative::generate_plain` at temperature 0 (top-1 sampling keeps the first
//! largest logit, as [`argmax`] does; tested), but reads each step's logits from the cache's own buffer
//! ([`Model::forward_logits`]) and takes the maximum in one pass instead of building a distribution.

use crate::error::{Result, RuntimeError};
use crate::model::Model;
pub use crate::probs::argmax;
use crate::probs::probs_into;

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

/// Plain decoding of several prompts at once, one pass per step over every unfinished sequence (ragged: each
/// feeds its prompt first, then its newest token): up to `max_new_tokens` tokens each, a sequence stopping after
/// `eos`. Greedy when `params` is `None`, else sampled under `params` with sequence b's own generator seeded with
/// `seed` — so sequence b gets exactly the tokens [`greedy`] (or `speculative::generate_plain` with `seed`) gives
/// its prompt alone: every row of a pass gets the operations a row alone gets.
pub fn plain_batch(
    model: &Model,
    prompts: &[Vec<u32>],
    params: Option<&spin_core::SamplingParams>,
    max_new_tokens: usize,
    eos: Option<u32>,
    seed: u64,
) -> Result<Vec<Vec<u32>>> {
    use rand::SeedableRng;
    if prompts.is_empty() {
        return Err(RuntimeError::invalid("prompts", "none given"));
    }
    if let Some(k) = prompts.iter().position(|p| p.is_empty()) {
        return Err(RuntimeError::invalid(format!("prompts[{k}]"), "is empty"));
    }
    let vocab = model.config().vocab_size;
    let mut caches: Vec<crate::model::KvCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut rngs: Vec<rand_chacha::ChaCha8Rng> = prompts
        .iter()
        .map(|_| rand_chacha::ChaCha8Rng::seed_from_u64(seed))
        .collect();
    let mut out: Vec<Vec<u32>> = prompts
        .iter()
        .map(|_| Vec::with_capacity(max_new_tokens))
        .collect();
    let mut done = vec![max_new_tokens == 0; prompts.len()];
    let mut probs = Vec::with_capacity(vocab);
    while let Some(first) = done.iter().position(|d| !d) {
        let active: Vec<usize> = (first..prompts.len()).filter(|&b| !done[b]).collect();
        let inputs: Vec<&[u32]> = active
            .iter()
            .map(|&b| match out[b].last() {
                None => prompts[b].as_slice(),
                Some(_) => &out[b][out[b].len() - 1..],
            })
            .collect();
        let logits = {
            let mut refs: Vec<&mut crate::model::KvCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(b, _)| !done[*b])
                .map(|(_, c)| c)
                .collect();
            model.forward_batch(&mut refs, &inputs)?
        };
        for (&b, l) in active.iter().zip(&logits) {
            let n = l.dim(0)?;
            let row = l.narrow(0, n - 1, 1)?.flatten_all()?.to_vec1::<f32>()?;
            let t = match params {
                None => argmax(&row)?,
                Some(p) => {
                    probs_into(&row, p, &mut probs)?;
                    spin_core::Dist::new(&probs)?.sample(&mut rngs[b])
                }
            };
            out[b].push(t);
            done[b] = Some(t) == eos || out[b].len() == max_new_tokens;
        }
    }
    Ok(out)
}
