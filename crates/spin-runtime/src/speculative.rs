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
    /// Wall time of the draft steps this device took part in (with [`Drafting::Batched`] a step drafts for every
    /// device at once, so this is an upper bound on the device's own drafting time).
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
    drafting: Drafting,
}

/// How the K devices' drafters are run in process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Drafting {
    /// One padded batch forward per draft step over every device still drafting (fast; the default).
    #[default]
    Batched,
    /// One forward per device and step, so each device's `draft_time` is its own single-sequence latency (what
    /// a device drafting alone on its own hardware would take; used by the goodput measurement).
    PerDevice,
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
        for (k, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return Err(RuntimeError::invalid(format!("prompts[{k}]"), "is empty"));
            }
        }
        // Prefill every prompt but its last token, all devices in one padded batch per model.
        let mut target_caches: Vec<KvCache> = prompts.iter().map(|_| target.new_cache()).collect();
        let mut draft_caches: Vec<KvCache> = prompts.iter().map(|_| drafter.new_cache()).collect();
        let long: Vec<usize> = (0..prompts.len()).filter(|&k| prompts[k].len() > 1).collect();
        if !long.is_empty() {
            let refs: Vec<&[u32]> = long
                .iter()
                .map(|&k| &prompts[k][..prompts[k].len() - 1])
                .collect();
            for (model, caches) in [(target, &mut target_caches), (drafter, &mut draft_caches)] {
                let mut cref: Vec<&mut KvCache> = caches
                    .iter_mut()
                    .enumerate()
                    .filter(|(k, _)| prompts[*k].len() > 1)
                    .map(|(_, c)| c)
                    .collect();
                model.forward_batch(&mut cref, &refs)?;
            }
        }
        let caches = target_caches.into_iter().zip(draft_caches);
        for (k, ((p, &l), (target_cache, draft_cache))) in
            prompts.iter().zip(draft_lens).zip(caches).enumerate()
        {
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
            drafting: Drafting::Batched,
        })
    }

    /// Chooses how the devices draft (default [`Drafting::Batched`]); the tokens are the same either way.
    pub fn set_drafting(&mut self, drafting: Drafting) {
        self.drafting = drafting;
    }

    /// Drafts `lens[i]` tokens for device `active[i]`, one drafter forward per device and step
    /// ([`Drafting::PerDevice`]) or one padded batch forward per step over every device still drafting
    /// ([`Drafting::Batched`]). Each device samples from its own RNG in the same order either way. Returns the
    /// tokens and the distributions they were sampled from.
    #[allow(clippy::type_complexity)]
    fn draft_all(&mut self, active: &[usize], lens: &[usize]) -> Result<Vec<(Vec<u32>, Vec<Vec<f32>>)>> {
        let mut out: Vec<(Vec<u32>, Vec<Vec<f32>>)> = lens
            .iter()
            .map(|&l| (Vec::with_capacity(l), Vec::with_capacity(l)))
            .collect();
        let steps = lens.iter().copied().max().unwrap_or(0);
        let groups: Vec<Vec<usize>> = match self.drafting {
            Drafting::Batched => vec![(0..active.len()).collect()],
            Drafting::PerDevice => (0..active.len()).map(|i| vec![i]).collect(),
        };
        for group in &groups {
            for step in 0..steps {
                let members: Vec<usize> = group.iter().copied().filter(|&i| lens[i] > step).collect();
                if members.is_empty() {
                    break;
                }
                self.draft_step(active, &members, &mut out)?;
            }
        }
        for (&k, &l) in active.iter().zip(lens) {
            self.devices[k].drafted += l;
        }
        Ok(out)
    }

    /// One drafting step for `members` (indices into `active`, ascending): a single padded forward feeds what each
    /// drafter cache lacks of tokens ++ drafted-so-far, then each device samples its next token. The step's wall
    /// time is charged to every member (devices draft in parallel on their own hardware).
    #[allow(clippy::type_complexity)]
    fn draft_step(
        &mut self,
        active: &[usize],
        members: &[usize],
        out: &mut [(Vec<u32>, Vec<Vec<f32>>)],
    ) -> Result<()> {
        let start = Instant::now();
        let params = self.cfg.params;
        let inputs: Vec<Vec<u32>> = members
            .iter()
            .map(|&i| {
                let d = &self.devices[active[i]];
                let fed = d.draft_cache.len();
                let ys = &out[i].0;
                let n = d.tokens.len();
                if fed < n {
                    let mut v = d.tokens[fed..].to_vec();
                    v.extend_from_slice(ys);
                    v
                } else {
                    ys[fed - n..].to_vec()
                }
            })
            .collect();
        let logits = {
            let mut wanted = vec![false; self.devices.len()];
            for &i in members {
                wanted[active[i]] = true;
            }
            let mut caches: Vec<&mut KvCache> = self
                .devices
                .iter_mut()
                .zip(&wanted)
                .filter(|(_, w)| **w)
                .map(|(d, _)| &mut d.draft_cache)
                .collect();
            let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
            self.drafter.forward_batch(&mut caches, &refs)?
        };
        for (&i, l) in members.iter().zip(&logits) {
            let last = l.narrow(0, l.dim(0)? - 1, 1)?;
            let q = prob_rows(&last, &params)?.remove(0);
            let d = &mut self.devices[active[i]];
            out[i].0.push(Dist::new(&q)?.sample(&mut d.rng));
            out[i].1.push(q);
        }
        let elapsed = start.elapsed();
        for &i in members {
            self.devices[active[i]].draft_time += elapsed;
        }
        Ok(())
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
        let lens: Vec<usize> = active
            .iter()
            .map(|&k| {
                let remaining = self.cfg.max_new_tokens - self.devices[k].generated().len();
                self.devices[k].draft_len.min(remaining.saturating_sub(1))
            })
            .collect();
        let drafts = self.draft_all(&active, &lens)?;
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

/// Plain sampling of many sequences at once, one padded batch forward per step: sequence b continues `prompts[b]`
/// with its own generator seeded with `seeds[b]`, so it yields the same tokens as
/// `generate_plain(model, &prompts[b], params, max_new_tokens, None, seeds[b])`.
pub fn generate_plain_batch(
    model: &Model,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    max_new_tokens: usize,
    seeds: &[u64],
) -> Result<Vec<Vec<u32>>> {
    if prompts.len() != seeds.len() || prompts.is_empty() {
        return Err(RuntimeError::invalid(
            "seeds",
            format!("{} seeds for {} prompts", seeds.len(), prompts.len()),
        ));
    }
    if let Some(k) = prompts.iter().position(|p| p.is_empty()) {
        return Err(RuntimeError::invalid(format!("prompts[{k}]"), "is empty"));
    }
    let mut rngs: Vec<ChaCha8Rng> = seeds.iter().map(|&s| ChaCha8Rng::seed_from_u64(s)).collect();
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut out: Vec<Vec<u32>> = prompts
        .iter()
        .map(|_| Vec::with_capacity(max_new_tokens))
        .collect();
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    for _ in 0..max_new_tokens {
        let logits = {
            let mut cref: Vec<&mut KvCache> = caches.iter_mut().collect();
            let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
            model.forward_batch(&mut cref, &refs)?
        };
        for (b, l) in logits.iter().enumerate() {
            let last = l.narrow(0, l.dim(0)? - 1, 1)?;
            let p = prob_rows(&last, params)?.remove(0);
            let t = Dist::new(&p)?.sample(&mut rngs[b]);
            out[b].push(t);
            inputs[b] = vec![t];
        }
    }
    Ok(out)
}
