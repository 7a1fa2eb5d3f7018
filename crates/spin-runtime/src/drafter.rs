//! The device half of speculative decoding: a draft model with its own KV cache and RNG that drafts γ tokens per
//! round (γ given every round) and, where the payload needs them, the truncated and quantised draft distributions
//! as spin-core builds them (docs/model.md §1 "what crosses the air"; docs/system.md).
//!
//! Exactness with a sparse payload: the device samples each drafted token from the very truncated, quantised
//! distribution it sends, and keeps that distribution (dense) as its local q for a downlink correction, so every
//! residual is computed from exactly the two distributions the sampler sees (docs/exactness.md).
//!
//! Cache invariant (as in [`crate::speculative`]): the cache holds every committed token except the newest.

use crate::error::{Result, RuntimeError};
use crate::model::{KvCache, Model};
use crate::probs::{prob_rows, probs_into};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_core::correction::{Mode, Payload, correct};
use spin_core::{Dist, SamplingParams, SparseDist, Truncator};
use std::ops::Deref;
use std::time::{Duration, Instant};

/// The form of the draft distributions a drafter produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DistForm {
    /// Dense V-entry rows (in-process use; nothing is sent).
    #[default]
    Dense,
    /// Top-`v_eff` truncation and `q_bits`-bit quantisation; tokens are sampled from that sparse distribution.
    Sparse {
        /// Entries kept (V_eff, paper A's |V̂|).
        v_eff: usize,
        /// Bits per value (Q, paper A's Q_B).
        q_bits: u32,
    },
}

/// Prompt lookup: a draft step whose sequence (committed and drafted tokens) ends in tokens that occurred before
/// proposes the token that followed their most recent earlier occurrence, the longest such ending of at most
/// `ngram` tokens first (the last `ngram` tokens, else the last `ngram` − 1, … down to the last token alone;
/// measured on SmolLM2 with its distilled draft, 4 down to 1 agreed more often than any one length, docs/runtime.md
/// "Prompt lookup"). Greedy drafting takes that token instead of the model's top one; sampled drafting draws from
/// (1 − `weight`)·q + `weight`·δ_token, q the model's distribution. Either way the token is drawn from the
/// distribution the verifier is given, so speculative sampling stays exact. The search scans the sequence
/// backwards, once per ending length: O(`ngram` · length) comparisons a step, microseconds at a few thousand tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lookup {
    /// The longest ending of the sequence looked up (at least 1; shorter ones are tried after it).
    pub ngram: usize,
    /// The looked-up token's weight λ in a sampled draft's distribution, in (0, 1].
    pub weight: f32,
}

impl Lookup {
    /// Checks the settings; errors name the field.
    pub fn validate(&self) -> Result<()> {
        if self.ngram == 0 {
            return Err(RuntimeError::invalid("lookup.ngram", "must be at least 1"));
        }
        if !(self.weight > 0.0 && self.weight <= 1.0) {
            return Err(RuntimeError::invalid(
                "lookup.weight",
                format!("{} is outside (0, 1]", self.weight),
            ));
        }
        Ok(())
    }
}

/// The token that followed the most recent earlier occurrence of the last `n` tokens of `seq` (None when `n` is
/// 0, the sequence is not longer than `n`, or they did not occur before).
pub fn lookup_next(seq: &[u32], n: usize) -> Option<u32> {
    let len = seq.len();
    if n == 0 || len <= n {
        return None;
    }
    let key = &seq[len - n..];
    (0..len - n)
        .rev()
        .find(|&j| &seq[j..j + n] == key)
        .map(|j| seq[j + n])
}

/// One round's draft: the tokens, q_j(y_j) for each, and (sparse form only) the sparse distributions.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftOut {
    /// y_1..y_γ.
    pub tokens: Vec<u32>,
    /// q_j(y_j): the probability each token had under the distribution it was sampled from.
    pub probs: Vec<f32>,
    /// q_1..q_γ as sent (empty in the dense form).
    pub dists: Vec<SparseDist>,
}

/// The device-side drafter.
#[derive(Debug, Clone)]
pub struct Drafter<M: Deref<Target = Model>> {
    model: M,
    cache: KvCache,
    rng: ChaCha8Rng,
    tokens: Vec<u32>,
    prompt_len: usize,
    params: SamplingParams,
    form: DistForm,
    truncator: Option<Truncator>,
    /// The last round's drafted tokens and the dense distributions they were sampled from.
    pending: Vec<u32>,
    pending_q: Vec<Vec<f32>>,
    pending_sparse: Vec<SparseDist>,
    scratch: Vec<f32>,
    lookup: Option<Lookup>,
    /// See [`Drafter::set_lookup_stop`] (0: off).
    lookup_stop: usize,
    /// See [`Drafter::set_stop_below`] (None: off).
    gauge: Option<Gauge>,
    /// Draft tokens proposed by the lookup (see [`Lookup`]).
    pub looked_up: usize,
    /// Tokens drafted so far.
    pub drafted: usize,
    /// Wall time spent in draft forwards charged to this drafter (a batched step charges every member).
    pub draft_time: Duration,
}

/// Acceptance-gated draft lengths ([`Drafter::set_stop_below`]): running estimates of how often a round's
/// drafted tokens are accepted, and the smallest estimated chance a token may have to be drafted.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Gauge {
    below: f32,
    /// Estimated chance that a round's first drafted token is accepted.
    first: f32,
    /// Estimated chance that a later drafted token is accepted when the one before it was.
    later: f32,
    /// Whether the last round's draft was ended by this rule (`Drafter::observe` then asks what the next token
    /// would have been).
    cut: bool,
}

impl Gauge {
    /// Rounds (or tokens) the running estimates average over, about: each observation moves an estimate by
    /// 1/`WINDOW` of its distance, so a text that turns repetitive (or stops being so) is followed within a few
    /// dozen tokens.
    const WINDOW: f32 = 16.0;
    /// The estimates before any observation: optimistic, so that a run starts with long drafts and learns.
    const PRIOR: f32 = 0.7;

    fn update(estimate: &mut f32, accepted: bool) {
        *estimate += (f32::from(u8::from(accepted)) - *estimate) / Self::WINDOW;
    }

    /// An estimate the rule holds below its threshold, with nothing to observe, creeps back towards the prior
    /// (1/128 of the distance a cut round), so drafting is tried again after a few dozen rounds.
    fn drift(estimate: &mut f32) {
        *estimate += (Self::PRIOR - *estimate) / 128.0;
    }

    /// The estimated chance that drafted token `j` (0-based) of a round is accepted: every token before it and
    /// it accepted.
    fn chance(&self, j: usize) -> f32 {
        self.first * self.later.powi(j as i32)
    }
}

/// Device k's drafting RNG: the run's seed as key, stream k + 1 (the verifier uses stream 0), so devices and runs
/// with neighbouring seeds never share a random sequence.
pub fn device_rng(seed: u64, k: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(1 + k as u64);
    rng
}

impl<M: Deref<Target = Model>> Drafter<M> {
    /// A drafter continuing `tokens` (of which the first `prompt_len` are the prompt), prefilling every token but
    /// the last; `rng` is its own generator (see [`device_rng`]).
    pub fn new(
        model: M,
        tokens: &[u32],
        prompt_len: usize,
        params: SamplingParams,
        form: DistForm,
        rng: ChaCha8Rng,
    ) -> Result<Self> {
        let mut d = Self::unfilled(model, tokens, prompt_len, params, form, rng)?;
        if tokens.len() > 1 {
            let model = &d.model;
            let fed = model_tokens(model, &tokens[..tokens.len() - 1])?;
            model.forward(&mut d.cache, &fed)?;
        }
        Ok(d)
    }

    /// As [`Drafter::new`] but with an empty cache (the next draft feeds the whole sequence; batched prefill).
    pub fn unfilled(
        model: M,
        tokens: &[u32],
        prompt_len: usize,
        params: SamplingParams,
        form: DistForm,
        rng: ChaCha8Rng,
    ) -> Result<Self> {
        if tokens.is_empty() {
            return Err(RuntimeError::invalid("prompt", "is empty"));
        }
        if prompt_len == 0 || prompt_len > tokens.len() {
            return Err(RuntimeError::invalid(
                "prompt_len",
                format!("{prompt_len} is outside [1, {}]", tokens.len()),
            ));
        }
        let vocab = model.output_vocab();
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(RuntimeError::invalid(
                "prompt",
                format!("token {t} is outside the vocabulary of {vocab}"),
            ));
        }
        let truncator = match form {
            DistForm::Dense => None,
            DistForm::Sparse { v_eff, q_bits } => {
                if !(1..=24).contains(&q_bits) {
                    return Err(RuntimeError::invalid(
                        "q_bits",
                        format!("{q_bits} is outside [1, 24]"),
                    ));
                }
                if v_eff == 0 || v_eff > vocab {
                    return Err(RuntimeError::invalid(
                        "v_eff",
                        format!("{v_eff} is outside [1, {vocab}]"),
                    ));
                }
                Some(Truncator::new(v_eff)?)
            }
        };
        let cache = model.new_cache();
        Ok(Self {
            model,
            cache,
            rng,
            tokens: tokens.to_vec(),
            prompt_len,
            params,
            form,
            truncator,
            pending: Vec::new(),
            pending_q: Vec::new(),
            pending_sparse: Vec::new(),
            scratch: Vec::new(),
            lookup: None,
            lookup_stop: 0,
            gauge: None,
            looked_up: 0,
            drafted: 0,
            draft_time: Duration::ZERO,
        })
    }

    /// The committed sequence (prompt and generated tokens).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The generated tokens (after the prompt).
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// The prompt length.
    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// The vocabulary the drafter samples over (the target's, also for a restricted draft head).
    pub fn vocab(&self) -> usize {
        self.model.output_vocab()
    }

    /// The distribution form.
    pub fn form(&self) -> DistForm {
        self.form
    }

    /// Turns prompt lookup on (see [`Lookup`]) or off (None, the default); lookup-gated lengths are off again
    /// ([`Drafter::set_lookup_stop`]).
    pub fn set_lookup(&mut self, lookup: Option<Lookup>) -> Result<()> {
        if let Some(l) = &lookup {
            l.validate()?;
        }
        self.lookup = lookup;
        self.lookup_stop = 0;
        Ok(())
    }

    /// Lookup-gated draft lengths, for a caller that verifies drafts of any length up to the one asked (the
    /// in-process loop; a networked device drafts the planned length): with `stop` = m ≥ 1, a round's draft goes
    /// past its first token only while the sequence ends in a repeat of at least m tokens (a lookup of m to
    /// `ngram` tokens finds an earlier occurrence), so the draft length follows how predictable the text is.
    /// Draft tokens from the model alone agree far less often than looked-up ones (docs/runtime.md, "Prompt
    /// lookup"). 0 (the default) drafts every length asked. Needs the lookup on and m ≤ its `ngram`. The stopping
    /// rule sees only the draft's own tokens, so speculative sampling stays exact.
    pub fn set_lookup_stop(&mut self, stop: usize) -> Result<()> {
        if stop > 0 {
            let Some(lk) = self.lookup else {
                return Err(RuntimeError::invalid("lookup.stop", "needs the lookup on"));
            };
            if stop > lk.ngram {
                return Err(RuntimeError::invalid(
                    "lookup.stop",
                    format!("{stop} exceeds the lookup's ngram {}", lk.ngram),
                ));
            }
        }
        self.lookup_stop = stop;
        Ok(())
    }

    /// Acceptance-gated draft lengths, for a caller that verifies drafts of any length up to the one asked (the
    /// in-process loop): with `below` = P > 0, a round's draft ends before a token whose estimated chance of being
    /// accepted is below P. The chance of token j (0-based) is f · l^j, f the running acceptance of a round's
    /// first token and l that of a later token whose predecessor was accepted, each an average over about the
    /// last 16 observations (both start at 0.7). A drafted token costs a verification position and, from the
    /// model, a draft step; it yields a token exactly when it is accepted, so P is what a position costs in
    /// target steps (docs/runtime.md, "Acceptance-gated drafts"). A round whose first token's chance f is below P
    /// drafts nothing (the verification is then a plain step). Where the rule ended a greedy draft that the lookup
    /// would have continued (or started) and every drafted token was accepted, [`Drafter::commit`] checks whether
    /// the looked-up token would have been accepted too, so the estimates keep learning while the rule holds
    /// drafts short; elsewhere the held estimate creeps back towards 0.7 (1/128 of the way a round), so drafting is
    /// tried again. The rule sees only past verdicts and the draft's own tokens, so speculative sampling stays
    /// exact. 0 (the default) turns it off; P must be in [0, 1).
    pub fn set_stop_below(&mut self, below: f32) -> Result<()> {
        if !(0.0..1.0).contains(&below) {
            return Err(RuntimeError::invalid(
                "stop_below",
                format!("{below} is outside [0, 1)"),
            ));
        }
        self.gauge = (below > 0.0).then_some(Gauge {
            below,
            first: Gauge::PRIOR,
            later: Gauge::PRIOR,
            cut: false,
        });
        Ok(())
    }

    /// Whether a round's draft ends before its next step ([`Drafter::set_lookup_stop`] past the first token,
    /// [`Drafter::set_stop_below`]); remembers when the acceptance rule ended it.
    fn stops_here(&mut self) -> bool {
        let j = self.pending.len();
        if let (Some(lk), m) = (self.lookup, self.lookup_stop)
            && m > 0
            && j > 0
            && self.looked_up_token(lk, m).is_none()
        {
            return true;
        }
        match &mut self.gauge {
            Some(g) if g.chance(j) < g.below => {
                g.cut = true;
                true
            }
            _ => false,
        }
    }

    /// Updates the acceptance estimates with a round's verdict (before `commit` changes the sequence).
    fn observe(&mut self, accepted: usize, token: u32) {
        let Some(mut g) = self.gauge else {
            return;
        };
        let drafted = self.pending.len();
        if drafted > 0 {
            Gauge::update(&mut g.first, accepted > 0);
        }
        for j in 1..drafted.min(accepted + 1) {
            Gauge::update(&mut g.later, accepted > j);
        }
        if g.cut && accepted == drafted {
            // The rule ended the draft and all of it was accepted: would the next token have been? A greedy
            // draft's next token is the lookup's where the lookup (and its gate past the first token) proposes one.
            let gate = drafted == 0 || self.lookup_stop == 0;
            let looked = match self.lookup {
                Some(lk) if self.params.top_k() == Some(1) && self.truncator.is_none() => {
                    let open = gate || self.looked_up_token(lk, self.lookup_stop).is_some();
                    open.then(|| self.looked_up_token(lk, 1)).flatten()
                }
                _ => None,
            };
            let estimate = if drafted == 0 { &mut g.first } else { &mut g.later };
            match looked {
                Some(t) => Gauge::update(estimate, t == token),
                None => Gauge::drift(estimate),
            }
        } else if g.cut {
            Gauge::drift(if drafted == 0 { &mut g.first } else { &mut g.later });
        }
        g.cut = false;
        self.gauge = Some(g);
    }

    /// What the lookup proposes after the committed and drafted tokens: the token after the latest earlier
    /// occurrence of their longest ending of `shortest` to `lk.ngram` tokens. Endings as long as the sequence
    /// cannot have occurred before it and are not tried, so a huge `ngram` costs what the sequence's length does.
    fn looked_up_token(&self, lk: Lookup, shortest: usize) -> Option<u32> {
        let mut seq = Vec::with_capacity(self.tokens.len() + self.pending.len());
        seq.extend_from_slice(&self.tokens);
        seq.extend_from_slice(&self.pending);
        let longest = lk.ngram.min(seq.len().saturating_sub(1));
        (shortest..=longest).rev().find_map(|n| lookup_next(&seq, n))
    }

    /// The token a greedy dense draft takes from the lookup at this step without running the model: under top-1
    /// sampling the looked-up token replaces the model's whatever the model says ([`Drafter::with_lookup`]), so
    /// the forward of such a step would only feed the cache, and the next forward feeds every token the cache
    /// lacks in one pass (the cache invariant allows any lag). None where the model's step is needed: sampled
    /// drafts (their distribution mixes the model's in), sparse payloads, no lookup, or nothing looked up.
    fn lookup_only(&self) -> Option<u32> {
        let lk = self.lookup.filter(|_| self.lookup_skips_model())?;
        self.looked_up_token(lk, 1)
            .filter(|&g| (g as usize) < self.vocab())
    }

    /// Whether a looked-up token is drafted without the model ([`Drafter::lookup_only`]): a greedy dense draft
    /// with the lookup on.
    fn lookup_skips_model(&self) -> bool {
        self.lookup.is_some() && self.params.top_k() == Some(1) && self.truncator.is_none()
    }

    /// Drafts `token` from the lookup without the model (see [`Drafter::lookup_only`]): the one-hot row of a
    /// greedy draft, as [`Drafter::with_lookup`] makes it.
    fn push_looked_up(&mut self, token: u32) {
        let mut q = vec![0.0; self.vocab()];
        q[token as usize] = 1.0;
        self.looked_up += 1;
        self.pending.push(token);
        self.pending_q.push(q);
    }

    /// The model's distribution `q` of this step with the looked-up token mixed in (see [`Lookup`]).
    fn with_lookup(&mut self, mut q: Vec<f32>) -> Vec<f32> {
        let Some(lk) = self.lookup else {
            return q;
        };
        // Where a looked-up token skips the model, this step ran the model because `lookup_only` found none, on
        // the same sequence: no second scan.
        if self.lookup_skips_model() {
            return q;
        }
        let Some(g) = self.looked_up_token(lk, 1) else {
            return q;
        };
        let g = g as usize;
        if g >= q.len() {
            return q;
        }
        self.looked_up += 1;
        if self.params.top_k() == Some(1) {
            q.fill(0.0);
            q[g] = 1.0;
        } else {
            let keep = 1.0 - lk.weight;
            for v in &mut q {
                *v *= keep;
            }
            q[g] += lk.weight;
        }
        q
    }

    /// Drafts `gamma` tokens (γ = 0 drafts nothing) with one forward per step.
    pub fn draft(&mut self, gamma: usize) -> Result<DraftOut> {
        let mut one = [&mut *self];
        let mut out = draft_many(&mut one, &[gamma])?;
        Ok(out.remove(0))
    }

    /// The dense distributions the last draft's tokens were sampled from.
    pub fn last_dists(&self) -> &[Vec<f32>] {
        &self.pending_q
    }

    /// The dense local q_r of the last draft at position `r` (what the device uploads in UL mode, dense form).
    pub fn local_q(&self, r: usize) -> Result<&[f32]> {
        self.pending_q
            .get(r)
            .map(Vec::as_slice)
            .ok_or_else(|| RuntimeError::invalid("position", format!("{r} is outside the last draft")))
    }

    /// The sparse q_r sent in UL mode: the distribution the token was sampled from (sparse form), or the dense q_r
    /// truncated to `v_eff` and quantised to `q_bits` (dense form; an approximation unless it keeps all mass).
    pub fn uplink_q(&self, r: usize, v_eff: usize, q_bits: u32) -> Result<SparseDist> {
        if let Some(s) = self.pending_sparse.get(r) {
            return Ok(s.clone());
        }
        let q = self.local_q(r)?;
        Ok(SparseDist::truncate(Dist::new(q)?, v_eff.min(q.len()).max(1))?.quantise(q_bits)?)
    }

    /// DL mode: draws the correction at position `r` from the residual of the received target distribution and the
    /// local q_r (spin-core's [`correct`]).
    pub fn correct_downlink(&mut self, r: usize, received: &SparseDist) -> Result<u32> {
        let q = self
            .pending_q
            .get(r)
            .ok_or_else(|| RuntimeError::invalid("position", format!("{r} is outside the last draft")))?;
        let c = correct(
            Mode::Downlink,
            Dist::new(q)?,
            Payload::sparse(received),
            &mut self.scratch,
            &mut self.rng,
        )?;
        Ok(c.token)
    }

    /// Commits the verdict: the first `accepted` drafted tokens and then `token`; the cache rolls back to the
    /// accepted prefix.
    pub fn commit(&mut self, accepted: usize, token: u32) -> Result<()> {
        if accepted > self.pending.len() {
            return Err(RuntimeError::invalid(
                "accepted",
                format!("{accepted} exceeds the draft length {}", self.pending.len()),
            ));
        }
        if token as usize >= self.vocab() {
            return Err(RuntimeError::invalid(
                "token",
                format!("{token} is outside the vocabulary of {}", self.vocab()),
            ));
        }
        self.observe(accepted, token);
        self.tokens.extend_from_slice(&self.pending[..accepted]);
        self.tokens.push(token);
        let keep = self.cache.len().min(self.tokens.len() - 1);
        self.cache.truncate(keep)?;
        self.pending.clear();
        Ok(())
    }

    /// Discards the last draft (it was dropped for the round): the cache rolls back to the committed tokens.
    pub fn discard(&mut self) -> Result<()> {
        self.pending.clear();
        if let Some(g) = &mut self.gauge {
            g.cut = false;
        }
        let keep = self.cache.len().min(self.tokens.len() - 1);
        self.cache.truncate(keep)?;
        Ok(())
    }

    /// Cuts the committed sequence to `len` tokens (never below the prompt), e.g. at the token budget.
    pub fn cut(&mut self, len: usize) -> Result<()> {
        let len = len.max(self.prompt_len);
        if len < self.tokens.len() {
            self.tokens.truncate(len);
            let keep = self.cache.len().min(len - 1);
            self.cache.truncate(keep)?;
        }
        Ok(())
    }

    /// Samples one token from the step's distribution `q` (prompt lookup mixed in first), in the drafter's form;
    /// returns (token, q(token)).
    fn sample_row(&mut self, q: Vec<f32>) -> Result<(u32, f32)> {
        let q = self.with_lookup(q);
        match self.truncator.as_mut() {
            None => {
                let t = Dist::new(&q)?.sample(&mut self.rng);
                let p = q[t as usize];
                self.pending_q.push(q);
                Ok((t, p))
            }
            Some(tr) => {
                let DistForm::Sparse { q_bits, .. } = self.form else {
                    return Err(RuntimeError::invalid("form", "a truncator without a sparse form"));
                };
                let s = tr.truncate(Dist::new(&q)?)?.quantise(q_bits)?;
                let t = s.sample(&mut self.rng)?;
                let mut dense = Vec::new();
                s.write_dense(&mut dense);
                let total: f32 = dense.iter().sum();
                for v in &mut dense {
                    *v /= total;
                }
                let p = dense[t as usize];
                self.pending_q.push(dense);
                self.pending_sparse.push(s);
                Ok((t, p))
            }
        }
    }
}

/// The ids the draft model is fed for the target tokens `tokens`: the same ids, or the compact ids of a
/// restricted draft head (`crate::head_vocab`).
fn model_tokens(model: &Model, tokens: &[u32]) -> Result<Vec<u32>> {
    match model.head_vocab() {
        None => Ok(tokens.to_vec()),
        Some(hv) => {
            let mut out = Vec::with_capacity(tokens.len());
            hv.map_tokens(tokens, &mut out)?;
            Ok(out)
        }
    }
}

/// Drafts `lens[i]` tokens for `drafters[i]` (all on the same model), one padded batch forward per step over the
/// drafters still drafting; each samples from its own RNG, so the tokens equal those of one-by-one drafting.
/// The step's wall time is charged to every member (devices draft in parallel on their own hardware).
pub fn draft_many<M: Deref<Target = Model>>(
    drafters: &mut [&mut Drafter<M>],
    lens: &[usize],
) -> Result<Vec<DraftOut>> {
    if drafters.len() != lens.len() {
        return Err(RuntimeError::invalid(
            "lens",
            format!("{} lengths for {} drafters", lens.len(), drafters.len()),
        ));
    }
    for d in drafters.iter_mut() {
        d.pending.clear();
        d.pending_q.clear();
        d.pending_sparse.clear();
    }
    let steps = lens.iter().copied().max().unwrap_or(0);
    let mut stopped = vec![false; drafters.len()];
    for step in 0..steps {
        for (i, d) in drafters.iter_mut().enumerate() {
            stopped[i] = stopped[i] || (lens[i] > step && d.stops_here());
        }
        let mut members: Vec<usize> = (0..drafters.len())
            .filter(|&i| lens[i] > step && !stopped[i])
            .collect();
        if members.is_empty() {
            break;
        }
        // Greedy drafts whose token comes from the lookup skip the model this step.
        members.retain(|&i| match drafters[i].lookup_only() {
            Some(g) => {
                drafters[i].push_looked_up(g);
                false
            }
            None => true,
        });
        if members.is_empty() {
            continue;
        }
        let start = Instant::now();
        let inputs: Vec<Vec<u32>> = members
            .iter()
            .map(|&i| {
                let d = &drafters[i];
                let fed = d.cache.len();
                let n = d.tokens.len();
                let v = if fed < n {
                    let mut v = d.tokens[fed..].to_vec();
                    v.extend_from_slice(&d.pending);
                    v
                } else {
                    d.pending[fed - n..].to_vec()
                };
                model_tokens(&d.model, &v)
            })
            .collect::<Result<_>>()?;
        if let [i] = members[..] {
            // One drafter: its logits rows straight from its cache's buffer (no tensor on the host path).
            let d = &mut *drafters[i];
            let vocab = d.model.config().vocab_size;
            let mut q = Vec::with_capacity(d.model.output_vocab());
            let rows = d.model.forward_logits(&mut d.cache, &inputs[0])?;
            let row = &rows[rows.len() - vocab..];
            match d.model.head_vocab() {
                None => probs_into(row, &d.params, &mut q)?,
                Some(hv) => hv.probs_into(row, &d.params, &mut d.scratch, &mut q)?,
            }
            let (t, _) = d.sample_row(q)?;
            d.pending.push(t);
        } else {
            let logits = {
                let mut wanted = vec![false; drafters.len()];
                for &i in &members {
                    wanted[i] = true;
                }
                let mut model: Option<&Model> = None;
                let mut caches: Vec<&mut KvCache> = Vec::with_capacity(members.len());
                for (d, _) in drafters.iter_mut().zip(&wanted).filter(|(_, w)| **w) {
                    let Drafter { model: m, cache, .. } = &mut **d;
                    model.get_or_insert(&**m);
                    caches.push(cache);
                }
                let refs: Vec<&[u32]> = inputs.iter().map(|v| v.as_slice()).collect();
                match model {
                    Some(m) => m.forward_batch(&mut caches, &refs)?,
                    None => Vec::new(),
                }
            };
            for (&i, l) in members.iter().zip(&logits) {
                let last = l.narrow(0, l.dim(0)? - 1, 1)?;
                let d = &mut drafters[i];
                let q = match d.model.head_vocab() {
                    None => prob_rows(&last, &d.params)?.remove(0),
                    Some(hv) => {
                        let compact = last.flatten_all()?.to_vec1::<f32>()?;
                        let mut q = Vec::with_capacity(hv.full_vocab());
                        hv.probs_into(&compact, &d.params, &mut d.scratch, &mut q)?;
                        q
                    }
                };
                let (t, _) = d.sample_row(q)?;
                d.pending.push(t);
            }
        }
        let elapsed = start.elapsed();
        for &i in &members {
            drafters[i].draft_time += elapsed;
        }
    }
    let mut out = Vec::with_capacity(drafters.len());
    for d in drafters.iter_mut() {
        d.drafted += d.pending.len();
        let probs = d
            .pending
            .iter()
            .zip(&d.pending_q)
            .map(|(&t, q)| q[t as usize])
            .collect();
        out.push(DraftOut {
            tokens: d.pending.clone(),
            probs,
            dists: d.pending_sparse.clone(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::lookup_next;

    #[test]
    fn lookup_finds_the_most_recent_earlier_occurrence() {
        // "1 2" occurs at 0 (followed by 3) and at 4 (followed by 9): the later one wins.
        let seq = [1, 2, 3, 7, 1, 2, 9, 5, 1, 2];
        assert_eq!(lookup_next(&seq, 2), Some(9));
        assert_eq!(lookup_next(&seq, 1), Some(9));
        // "5 1 2" never occurred before the end; the ending itself is not an earlier occurrence.
        assert_eq!(lookup_next(&seq, 3), None);
        assert_eq!(
            lookup_next(&[4, 4, 4], 2),
            Some(4),
            "overlapping occurrences count"
        );
        assert_eq!(lookup_next(&[4, 4], 2), None);
        assert_eq!(lookup_next(&seq, 0), None);
        assert_eq!(lookup_next(&[], 1), None);
    }
}
