//! The speculative loop for K in-process devices: each drafts γ_k tokens with its own drafter cache, one padded
//! batch forward of the target verifies every draft (paper A eq. 7), spin-core decides acceptance and samples the
//! residual or bonus token (MODEL.md §1 steps 3–5), and both caches roll back to the accepted prefix.
//!
//! Cache invariant: a cache holds every token of its sequence except the newest (the one still to be fed); after
//! a round both caches are truncated to at most `tokens.len() − 1`, and the next forward feeds whatever is missing.

use crate::error::{Result, RuntimeError};
use crate::model::{KvCache, Model};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_core::{
    AlphaEstimator, Dist, DraftRef, PaddedTargets, SamplingParams, probs_from_logits, verify_batch,
};
use std::time::{Duration, Instant};

/// Sampling settings: `temperature = 0` is greedy decoding (top-1, exactly reproducing argmax decoding).
pub fn sampling(temperature: f64) -> Result<SamplingParams> {
    if temperature == 0.0 {
        Ok(SamplingParams::new(1.0, Some(1), None)?)
    } else {
        Ok(SamplingParams::new(temperature, None, None)?)
    }
}

/// Turns logits (n, vocab) into n probability rows under `params`.
pub fn prob_rows(logits: &candle_core::Tensor, params: &SamplingParams) -> Result<Vec<Vec<f32>>> {
    let rows = logits.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
    rows.iter()
        .map(|r| {
            let mut out = Vec::with_capacity(r.len());
            probs_from_logits(r, params, &mut out)?;
            Ok(out)
        })
        .collect()
}

/// One device's running state.
#[derive(Debug, Clone)]
pub struct Device {
    /// Prompt and generated tokens.
    pub tokens: Vec<u32>,
    /// Length of the prompt within `tokens`.
    pub prompt_len: usize,
    /// Draft length γ_k.
    pub draft_len: usize,
    target_cache: KvCache,
    draft_cache: KvCache,
    rng: ChaCha8Rng,
    /// Whether the device has stopped (EOS or token budget).
    pub done: bool,
    /// Acceptance statistics (ratio and count estimators).
    pub alpha: AlphaEstimator,
    /// Rounds run.
    pub rounds: usize,
    /// Time spent drafting.
    pub draft_time: Duration,
    /// Tokens drafted.
    pub drafted: usize,
}

impl Device {
    /// The generated tokens (after the prompt).
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}

/// Settings of a speculative run.
#[derive(Debug, Clone)]
pub struct SpecConfig {
    /// Sampling applied identically to drafter and target.
    pub params: SamplingParams,
    /// Tokens to generate per device.
    pub max_new_tokens: usize,
    /// Stop a device when it emits this token.
    pub eos: Option<u32>,
    /// Seed of every random draw.
    pub seed: u64,
}

/// Timing of one batched verification.
#[derive(Debug, Clone, Copy)]
pub struct RoundStats {
    /// Devices verified together.
    pub batch: usize,
    /// Longest draft in the batch.
    pub max_draft_len: usize,
    /// Wall time of the target's batch forward.
    pub verify_s: f64,
}

/// K devices sharing one verifier.
pub struct Speculator<'m> {
    target: &'m Model,
    drafter: &'m Model,
    cfg: SpecConfig,
    /// The devices, in order.
    pub devices: Vec<Device>,
    verify_rng: ChaCha8Rng,
    /// One entry per verification round.
    pub rounds: Vec<RoundStats>,
}

impl<'m> Speculator<'m> {
    /// Sets up devices with their prompts and draft lengths; prompts are prefilled into both caches.
    pub fn new(
        target: &'m Model,
        drafter: &'m Model,
        prompts: &[Vec<u32>],
        draft_lens: &[usize],
        cfg: SpecConfig,
    ) -> Result<Self> {
        if target.config().vocab_size != drafter.config().vocab_size {
            return Err(RuntimeError::invalid(
                "draft",
                format!(
                    "vocabulary of {} differs from the target's {}",
                    drafter.config().vocab_size,
                    target.config().vocab_size
                ),
            ));
        }
        if prompts.len() != draft_lens.len() || prompts.is_empty() {
            return Err(RuntimeError::invalid(
                "draft_lens",
                format!("{} draft lengths for {} prompts", draft_lens.len(), prompts.len()),
            ));
        }
        let mut devices = Vec::with_capacity(prompts.len());
        for (k, (p, &l)) in prompts.iter().zip(draft_lens).enumerate() {
            if p.is_empty() {
                return Err(RuntimeError::invalid(format!("prompts[{k}]"), "is empty"));
            }
            let mut target_cache = target.new_cache();
            let mut draft_cache = drafter.new_cache();
            if p.len() > 1 {
                target.forward(&mut target_cache, &p[..p.len() - 1])?;
                drafter.forward(&mut draft_cache, &p[..p.len() - 1])?;
            }
            devices.push(Device {
                tokens: p.clone(),
                prompt_len: p.len(),
                draft_len: l,
                target_cache,
                draft_cache,
                rng: device_rng(cfg.seed, k),
                done: cfg.max_new_tokens == 0,
                alpha: AlphaEstimator::new(),
                rounds: 0,
                draft_time: Duration::ZERO,
                drafted: 0,
            });
        }
        let verify_rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        Ok(Speculator {
            target,
            drafter,
            cfg,
            devices,
            verify_rng,
            rounds: Vec::new(),
        })
    }

    /// Drafts `len` tokens for device `k`; returns the tokens and the distributions they were sampled from.
    fn draft(&mut self, k: usize, len: usize) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
        let drafter = self.drafter;
        let params = self.cfg.params;
        let d = &mut self.devices[k];
        let start = Instant::now();
        let mut ys = Vec::with_capacity(len);
        let mut qs = Vec::with_capacity(len);
        for _ in 0..len {
            // Feed whatever the cache lacks of tokens ++ ys (one token after the first step).
            let fed = d.draft_cache.len();
            let full: Vec<u32> = d.tokens.iter().chain(&ys).copied().collect();
            let logits = drafter.forward(&mut d.draft_cache, &full[fed..])?;
            let last = logits.get(logits.dim(0)? - 1)?.unsqueeze(0)?;
            let q = prob_rows(&last, &params)?.remove(0);
            ys.push(Dist::new(&q)?.sample(&mut d.rng));
            qs.push(q);
        }
        d.draft_time += start.elapsed();
        d.drafted += len;
        Ok((ys, qs))
    }

    /// One round for every unfinished device: draft, verify in one batch, accept/resample, roll back.
    /// Returns false once every device is done.
    pub fn step(&mut self) -> Result<bool> {
        let active: Vec<usize> = (0..self.devices.len())
            .filter(|&k| !self.devices[k].done)
            .collect();
        if active.is_empty() {
            return Ok(false);
        }
        let mut drafts = Vec::with_capacity(active.len());
        for &k in &active {
            let remaining = self.cfg.max_new_tokens - self.devices[k].generated().len();
            let len = self.devices[k].draft_len.min(remaining.saturating_sub(1));
            drafts.push(self.draft(k, len)?);
        }
        // Target inputs: the unfed tail of each sequence, then its draft.
        let inputs: Vec<Vec<u32>> = active
            .iter()
            .zip(&drafts)
            .map(|(&k, (ys, _))| {
                let d = &self.devices[k];
                let mut v = d.tokens[d.target_cache.len()..].to_vec();
                v.extend_from_slice(ys);
                v
            })
            .collect();
        let start = Instant::now();
        let logits = {
            let mut caches: Vec<&mut KvCache> = Vec::with_capacity(active.len());
            for (k, d) in self.devices.iter_mut().enumerate() {
                if active.contains(&k) {
                    caches.push(&mut d.target_cache);
                }
            }
            let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
            self.target.forward_batch(&mut caches, &refs)?
        };
        let verify_s = start.elapsed().as_secs_f64();
        let vocab = self.target.config().vocab_size;
        let positions = drafts.iter().map(|(ys, _)| ys.len()).max().unwrap_or(0) + 1;
        let mut flat = vec![0f32; active.len() * positions * vocab];
        for (i, ((ys, _), l)) in drafts.iter().zip(&logits).enumerate() {
            let n = l.dim(0)?;
            let rows = prob_rows(&l.narrow(0, n - ys.len() - 1, ys.len() + 1)?, &self.cfg.params)?;
            for (j, r) in rows.iter().enumerate() {
                let at = (i * positions + j) * vocab;
                flat[at..at + vocab].copy_from_slice(r);
            }
        }
        let targets = PaddedTargets::new(&flat, active.len(), positions, vocab)?;
        let q_dists: Vec<Vec<Dist<'_>>> = drafts
            .iter()
            .map(|(_, qs)| {
                qs.iter()
                    .map(|q| Dist::new(q))
                    .collect::<std::result::Result<Vec<_>, _>>()
            })
            .collect::<std::result::Result<_, _>>()?;
        let refs: Vec<DraftRef<'_, '_>> = drafts
            .iter()
            .zip(&q_dists)
            .map(|((ys, _), qd)| DraftRef {
                tokens: ys,
                dists: qd,
            })
            .collect();
        let outcomes = verify_batch(&targets, &refs, &mut self.verify_rng)?;
        for (i, (&k, out)) in active.iter().zip(&outcomes).enumerate() {
            let (ys, _) = &drafts[i];
            let p_rows: Vec<Dist<'_>> = (0..=ys.len())
                .map(|j| targets.dist(i, j))
                .collect::<std::result::Result<_, _>>()?;
            let draft = spin_core::Draft::from_dists(ys, &q_dists[i])?;
            let d = &mut self.devices[k];
            d.alpha.record_draft(&p_rows, &draft)?;
            d.alpha.record_outcome(out, ys.len())?;
            d.tokens.extend_from_slice(&ys[..out.accepted]);
            d.tokens.push(out.token);
            d.rounds += 1;
            let keep = d.tokens.len() - 1;
            let t_len = d.target_cache.len().min(keep);
            d.target_cache.truncate(t_len)?;
            let q_len = d.draft_cache.len().min(keep);
            d.draft_cache.truncate(q_len)?;
            let generated = d.tokens.len() - d.prompt_len;
            if generated >= self.cfg.max_new_tokens || Some(out.token) == self.cfg.eos {
                d.tokens
                    .truncate(d.prompt_len + generated.min(self.cfg.max_new_tokens));
                d.done = true;
            }
        }
        self.rounds.push(RoundStats {
            batch: active.len(),
            max_draft_len: positions - 1,
            verify_s,
        });
        Ok(true)
    }

    /// Runs rounds until every device is done.
    pub fn run(&mut self) -> Result<()> {
        while self.step()? {}
        Ok(())
    }
}

/// Device k's drafting RNG: the run's seed as key, stream k + 1 (the verifier uses stream 0), so devices and runs
/// with neighbouring seeds never share a random sequence.
fn device_rng(seed: u64, k: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1 + k as u64);
    rng
}

/// Plain autoregressive decoding from `prompt` (the reference the speculative output must match in distribution,
/// and token for token at temperature 0).
pub fn generate_plain(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    max_new_tokens: usize,
    eos: Option<u32>,
    seed: u64,
) -> Result<Vec<u32>> {
    if prompt.is_empty() {
        return Err(RuntimeError::invalid("prompt", "is empty"));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cache = model.new_cache();
    let mut tokens = prompt.to_vec();
    let mut input = prompt.to_vec();
    for _ in 0..max_new_tokens {
        let logits = model.forward(&mut cache, &input)?;
        let last = logits.get(logits.dim(0)? - 1)?.unsqueeze(0)?;
        let p = prob_rows(&last, params)?.remove(0);
        let t = Dist::new(&p)?.sample(&mut rng);
        tokens.push(t);
        input = vec![t];
        if Some(t) == eos {
            break;
        }
    }
    Ok(tokens[prompt.len()..].to_vec())
}
