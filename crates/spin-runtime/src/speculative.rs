//! The speculative loop for K in-process devices, composed of the two halves the networked system runs apart: each
//! device's [`Drafter`] drafts γ_k tokens with its own cache, one [`Verifier`] batch forward of the target checks
//! every draft (paper A eq. 7), spin-core decides acceptance and samples the residual or bonus token (docs/model.md §1
//! steps 3–5), and both caches roll back to the accepted prefix.
//!
//! Cache invariant: a cache holds every token of its sequence except the newest (the one still to be fed); after
//! a round both caches are truncated to at most `tokens.len() − 1`, and the next forward feeds whatever is missing.

use crate::drafter::{DistForm, Drafter, Lookup, device_rng, draft_many};
use crate::error::{Result, RuntimeError};
use crate::model::{KvCache, Model};
pub use crate::probs::{prob_rows, probs_into, sampling};
use crate::verifier::{Decision, DraftDists, Submission, Verifier, VerifierConfig};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_core::{AlphaEstimator, Dist, SamplingParams};
use std::time::Duration;

/// One device's running state (a view the loop refreshes after every round).
#[derive(Debug, Clone)]
pub struct Device {
    /// Prompt and generated tokens.
    pub tokens: Vec<u32>,
    /// Length of the prompt within `tokens`.
    pub prompt_len: usize,
    /// Draft length γ_k.
    pub draft_len: usize,
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

/// K in-process devices sharing one verifier: a composition of K [`Drafter`]s (device side) and one
/// [`Verifier`] (server side) with nothing on the air, every draft going up with its dense distributions.
pub struct Speculator<'m> {
    verifier: Verifier<&'m Model>,
    drafters: Vec<Drafter<&'m Model>>,
    /// The devices, in order.
    pub devices: Vec<Device>,
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
    /// Sets up devices with their prompts and draft lengths; prompts are prefilled into the target's caches (the
    /// drafters' caches fill on their first draft step, all devices in one batch).
    pub fn new(
        target: &'m Model,
        drafter: &'m Model,
        prompts: &[Vec<u32>],
        draft_lens: &[usize],
        cfg: SpecConfig,
    ) -> Result<Self> {
        target.check_full_head("target")?;
        if target.config().vocab_size != drafter.output_vocab() {
            return Err(RuntimeError::invalid(
                "draft",
                format!(
                    "vocabulary of {} differs from the target's {}",
                    drafter.output_vocab(),
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
        let mut verifier = Verifier::new(
            target,
            VerifierConfig {
                params: cfg.params,
                max_new_tokens: cfg.max_new_tokens,
                eos: cfg.eos,
                seed: cfg.seed,
            },
        );
        verifier.add_devices(prompts)?;
        let drafters = prompts
            .iter()
            .enumerate()
            .map(|(k, p)| {
                Drafter::unfilled(
                    drafter,
                    p,
                    p.len(),
                    cfg.params,
                    DistForm::Dense,
                    device_rng(cfg.seed, k),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let devices = prompts
            .iter()
            .zip(draft_lens)
            .map(|(p, &l)| Device {
                tokens: p.clone(),
                prompt_len: p.len(),
                draft_len: l,
                done: cfg.max_new_tokens == 0,
                alpha: AlphaEstimator::new(),
                rounds: 0,
                draft_time: Duration::ZERO,
                drafted: 0,
            })
            .collect();
        Ok(Speculator {
            verifier,
            drafters,
            devices,
            rounds: Vec::new(),
            drafting: Drafting::Batched,
        })
    }

    /// Chooses how the devices draft (default [`Drafting::Batched`]); the tokens are the same either way.
    pub fn set_drafting(&mut self, drafting: Drafting) {
        self.drafting = drafting;
    }

    /// Turns prompt lookup on for every device's drafter (see [`Lookup`]), or off (None, the default), with
    /// lookup-gated draft lengths when `stop` ≥ 1 ([`Drafter::set_lookup_stop`]: a device's draft length is then
    /// at most its `draft_len`).
    pub fn set_lookup(&mut self, lookup: Option<Lookup>, stop: usize) -> Result<()> {
        for d in &mut self.drafters {
            d.set_lookup(lookup)?;
            d.set_lookup_stop(stop)?;
        }
        Ok(())
    }

    /// Acceptance-gated draft lengths for every device's drafter ([`Drafter::set_stop_below`]: a device's draft
    /// length is then at most its `draft_len`); 0 turns them off.
    pub fn set_stop_below(&mut self, below: f32) -> Result<()> {
        for d in &mut self.drafters {
            d.set_stop_below(below)?;
        }
        Ok(())
    }

    /// Draft tokens the lookup proposed, per device.
    pub fn looked_up(&self) -> Vec<usize> {
        self.drafters.iter().map(|d| d.looked_up).collect()
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
            .map(|&k| Ok(self.devices[k].draft_len.min(self.verifier.max_draft_len(k)?)))
            .collect::<Result<_>>()?;
        let drafts = {
            let mut wanted = vec![false; self.drafters.len()];
            for &k in &active {
                wanted[k] = true;
            }
            let mut refs: Vec<&mut Drafter<&'m Model>> = self
                .drafters
                .iter_mut()
                .zip(&wanted)
                .filter(|(_, w)| **w)
                .map(|(d, _)| d)
                .collect();
            match self.drafting {
                Drafting::Batched => draft_many(&mut refs, &lens)?,
                Drafting::PerDevice => {
                    let mut out = Vec::with_capacity(refs.len());
                    for (d, &l) in refs.iter_mut().zip(&lens) {
                        out.push(d.draft(l)?);
                    }
                    out
                }
            }
        };
        let subs: Vec<Submission<'_>> = active
            .iter()
            .zip(&drafts)
            .map(|(&k, d)| Submission {
                device: k,
                tokens: &d.tokens,
                dists: DraftDists::Dense(self.drafters[k].last_dists()),
            })
            .collect();
        let (decisions, verify_s) = self.verifier.verify(&subs)?;
        for (&k, dec) in active.iter().zip(&decisions) {
            let Decision::Done { accepted, token, .. } = *dec else {
                return Err(RuntimeError::invalid(
                    "decision",
                    "a dense draft left a correction pending",
                ));
            };
            let drafter = &mut self.drafters[k];
            drafter.commit(accepted, token)?;
            let tokens = self.verifier.tokens(k)?;
            drafter.cut(tokens.len())?;
            let d = &mut self.devices[k];
            d.tokens.clear();
            d.tokens.extend_from_slice(tokens);
            d.done = self.verifier.is_done(k)?;
            d.alpha = self.verifier.alpha(k)?.clone();
            d.rounds = self.verifier.rounds(k)?;
            d.drafted = drafter.drafted;
            d.draft_time = drafter.draft_time;
        }
        self.rounds.push(RoundStats {
            batch: active.len(),
            max_draft_len: lens.iter().copied().max().unwrap_or(0),
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
    generate_plain_with(model, prompt, params, max_new_tokens, eos, seed, &mut |_| true)
}

/// [`generate_plain`], calling `on_token` with the tokens generated so far after each one (to stream them); it
/// returns whether to go on. Each step's logits are read from the cache's own buffer
/// ([`Model::forward_logits`]), the same values `generate_plain` turns into probabilities.
pub fn generate_plain_with(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    max_new_tokens: usize,
    eos: Option<u32>,
    seed: u64,
    on_token: &mut dyn FnMut(&[u32]) -> bool,
) -> Result<Vec<u32>> {
    model.check_full_head("model")?;
    if prompt.is_empty() {
        return Err(RuntimeError::invalid("prompt", "is empty"));
    }
    let vocab = model.config().vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cache = model.new_cache();
    let mut tokens = prompt.to_vec();
    let mut p = Vec::with_capacity(vocab);
    for i in 0..max_new_tokens {
        let input = if i == 0 {
            prompt
        } else {
            &tokens[tokens.len() - 1..]
        };
        let logits = model.forward_logits(&mut cache, input)?;
        probs_into(&logits[logits.len() - vocab..], params, &mut p)?;
        let t = Dist::new(&p)?.sample(&mut rng);
        tokens.push(t);
        if !on_token(&tokens[prompt.len()..]) || Some(t) == eos {
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
    model.check_full_head("model")?;
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
    let vocab = model.config().vocab_size;
    let mut p = Vec::with_capacity(vocab);
    let mut failed = None;
    for _ in 0..max_new_tokens {
        let mut cref: Vec<&mut KvCache> = caches.iter_mut().collect();
        let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
        let mut next = vec![0u32; prompts.len()];
        // Each sequence's last row, as `generate_plain` reads it (the same probabilities, the same draw).
        model.forward_batch_rows(&mut cref, &refs, &mut |b, rows| {
            let last = &rows[rows.len() - vocab..];
            match probs_into(last, params, &mut p).and_then(|()| Ok(Dist::new(&p)?.sample(&mut rngs[b]))) {
                Ok(t) => next[b] = t,
                Err(e) => failed = Some(e),
            }
        })?;
        if let Some(e) = failed.take() {
            return Err(e);
        }
        for (b, t) in next.into_iter().enumerate() {
            out[b].push(t);
            inputs[b] = vec![t];
        }
    }
    Ok(out)
}
