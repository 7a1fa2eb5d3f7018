//! Distilling a small draft model from a target with the same tokenizer: the student (a smaller Llama) is trained
//! with AdamW on text sampled from the target, minimising the KL divergence KL(p_target ‖ q_student) at every
//! position, which maximises the expected acceptance Σ_v min(p_v, q_v) only indirectly but is smooth and cheap.
//!
//! For a large target (a GGUF file) the target runs once: [`cache_top_k`] keeps its top-k distributions over fixed
//! token sequences from its batched passes, and a [`HeadStudent`] with a restricted output head
//! (`crate::head_vocab`) is trained on that cache alone.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, KvCache, Model, TensorMap, WeightSource, tensor_shapes};
use crate::speculative::{generate_plain_batch, probs_into, sampling};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rayon::prelude::*;
use std::collections::HashMap;
use std::time::Instant;

/// The learning rate of step `step` (from 0) of `steps` under a cosine schedule: a linear warm-up over the first
/// `steps / 20` steps (at least 1, at most 50) up to `peak`, then a half cosine down to `peak / 10` at the last
/// step.
pub fn cosine_learning_rate(peak: f64, step: usize, steps: usize) -> f64 {
    let warm = (steps / 20).clamp(1, 50);
    if step < warm {
        return peak * (step + 1) as f64 / warm as f64;
    }
    let floor = peak / 10.0;
    let span = steps.saturating_sub(warm + 1).max(1) as f64;
    let t = ((step - warm) as f64 / span).min(1.0);
    floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * t).cos())
}

/// Distillation settings.
#[derive(Debug, Clone)]
pub struct DistillConfig {
    /// The student's shape (vocabulary must match the target's).
    pub student: Config,
    /// Training steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// AdamW learning rate.
    pub learning_rate: f64,
    /// Seed of initialisation and sampling.
    pub seed: u64,
}

/// Progress of one step.
#[derive(Debug, Clone, Copy)]
pub struct StepLog {
    /// Step index.
    pub step: usize,
    /// Mean KL(p ‖ q) per position, in nats.
    pub kl: f64,
    /// Training tokens per second so far.
    pub tokens_per_s: f64,
}

/// Trains a student by distillation from `target`; calls `log` after every step. Returns the student's tensors
/// (Hugging Face names), ready for [`crate::llama2c::write_checkpoint`].
pub fn distill(
    target: &Model,
    cfg: &DistillConfig,
    mut log: impl FnMut(StepLog),
) -> Result<HashMap<String, Tensor>> {
    if cfg.student.vocab_size != target.config().vocab_size {
        return Err(RuntimeError::invalid(
            "student.vocab_size",
            "must equal the target's vocabulary size",
        ));
    }
    if cfg.steps == 0 || cfg.batch == 0 || cfg.seq_len < 2 {
        return Err(RuntimeError::invalid(
            "steps, batch, seq_len",
            "must be positive (seq_len at least 2)",
        ));
    }
    let device = Device::Cpu;
    let init = crate::model::random_tensors(&cfg.student, 0.02, cfg.seed, &device)?;
    let mut vars = Vec::new();
    let mut tensors = HashMap::new();
    for (name, _) in tensor_shapes(&cfg.student) {
        let v = Var::from_tensor(&init[&name])?;
        tensors.insert(name, v.as_tensor().clone());
        vars.push(v);
    }
    let map = TensorMap {
        what: "student".into(),
        tensors: tensors.clone(),
        device: device.clone(),
    };
    let mut student = Model::from_source(cfg.student.clone(), &map as &dyn WeightSource, &device)?;
    student.set_differentiable(true)?;
    let params = ParamsAdamW {
        lr: cfg.learning_rate,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(vars, params)?;
    let t1 = sampling(1.0)?;
    let start = Instant::now();
    let mut seen = 0usize;
    for step in 0..cfg.steps {
        // Text sampled from the target, starting at BOS (id 1 in llama2.c vocabularies).
        // All sequences of the step are sampled together (one batch forward per position).
        let seeds: Vec<u64> = (0..cfg.batch)
            .map(|b| {
                cfg.seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add((step * cfg.batch + b) as u64)
            })
            .collect();
        let bos = vec![vec![1u32]; cfg.batch];
        let mut rows = Vec::with_capacity(cfg.batch * cfg.seq_len);
        for seq in generate_plain_batch(target, &bos, &t1, cfg.seq_len - 1, &seeds)? {
            rows.push(1u32);
            rows.extend(seq);
        }
        let ids = Tensor::from_vec(rows, (cfg.batch, cfg.seq_len), &device)?;
        let p = candle_nn::ops::softmax_last_dim(&target.forward_full(&ids)?)?.detach();
        let log_q = candle_nn::ops::log_softmax(&student.forward_full(&ids)?, D::Minus1)?;
        let log_p = (p.clone() + 1e-12)?.log()?;
        let kl = (p * (log_p - log_q)?)?.sum(D::Minus1)?.mean_all()?;
        opt.backward_step(&kl)?;
        seen += cfg.batch * cfg.seq_len;
        log(StepLog {
            step,
            kl: f64::from(kl.to_dtype(DType::F32)?.to_scalar::<f32>()?),
            tokens_per_s: seen as f64 / start.elapsed().as_secs_f64().max(1e-9),
        });
    }
    Ok(tensors)
}

/// The target's top-k next-token distributions over fixed-length token sequences, cached once from its own
/// batched passes (the host route for a GGUF target), so that training a student never runs the target again.
#[derive(Debug, Clone, PartialEq)]
pub struct TopKCache {
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Entries kept per position.
    pub k: usize,
    /// The sequences, `seq_len` target ids each, row-major.
    pub tokens: Vec<u32>,
    /// Per position, the k most likely target ids (most likely first).
    pub ids: Vec<u32>,
    /// Their probabilities under the target at temperature 1 (not renormalised: they sum to the kept mass).
    pub probs: Vec<f32>,
}

impl TopKCache {
    /// The number of cached sequences.
    pub fn sequences(&self) -> usize {
        self.tokens.len() / self.seq_len.max(1)
    }

    /// Appends another cache of the same sequence length and k (its sequences after this one's).
    pub fn append(&mut self, other: TopKCache) -> Result<()> {
        if other.sequences() > 0 && (other.seq_len, other.k) != (self.seq_len, self.k) {
            return Err(RuntimeError::invalid(
                "top-k cache",
                format!(
                    "appending sequences of {} tokens with k = {} to ones of {} with k = {}",
                    other.seq_len, other.k, self.seq_len, self.k
                ),
            ));
        }
        self.tokens.extend(other.tokens);
        self.ids.extend(other.ids);
        self.probs.extend(other.probs);
        Ok(())
    }

    /// Expected target-token counts: each position adds its kept probabilities to their ids (vocabulary `vocab`),
    /// what a restricted head's most frequent tokens are chosen from.
    pub fn expected_counts(&self, vocab: usize) -> Vec<f64> {
        let mut c = vec![0.0; vocab];
        for (&t, &p) in self.ids.iter().zip(&self.probs) {
            if let Some(x) = c.get_mut(t as usize) {
                *x += f64::from(p);
            }
        }
        c
    }

    /// The cache as bytes, little-endian: `MSTK`, format version 1 (u32), `key` (u64, what the caller says the
    /// cache was built from), `seq_len` and `k` (u32), the token count (u64), then the tokens and ids (u32) and
    /// the probabilities (f32).
    pub fn to_bytes(&self, key: u64) -> Vec<u8> {
        let mut b = Vec::with_capacity(32 + 4 * (self.tokens.len() + 2 * self.ids.len()));
        b.extend_from_slice(CACHE_MAGIC);
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&key.to_le_bytes());
        b.extend_from_slice(&(self.seq_len as u32).to_le_bytes());
        b.extend_from_slice(&(self.k as u32).to_le_bytes());
        b.extend_from_slice(&(self.tokens.len() as u64).to_le_bytes());
        for v in self.tokens.iter().chain(&self.ids) {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.probs {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b
    }

    /// Reads [`TopKCache::to_bytes`]'s format back; a cache built from another `key`, a truncated or padded file,
    /// or a field out of range is an error naming it.
    pub fn from_bytes(b: &[u8], key: u64) -> Result<TopKCache> {
        let bad = |field: &str, why: String| RuntimeError::invalid(format!("top-k cache: {field}"), why);
        let word = |at: usize, n: usize| -> Result<&[u8]> {
            b.get(at..at + n)
                .ok_or_else(|| bad("header", format!("{} bytes end before byte {}", b.len(), at + n)))
        };
        if word(0, 4)? != CACHE_MAGIC {
            return Err(bad("magic", "not a top-k cache (no MSTK)".into()));
        }
        let u32_at = |at| word(at, 4).map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")));
        let u64_at = |at| word(at, 8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")));
        let version = u32_at(4)?;
        if version != 1 {
            return Err(bad("version", format!("{version}, this build reads 1")));
        }
        let got = u64_at(8)?;
        if got != key {
            return Err(bad(
                "key",
                format!("{got:016x}: built from other options or another target than these ({key:016x})"),
            ));
        }
        let (seq_len, k) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let n = usize::try_from(u64_at(24)?).map_err(|_| bad("tokens", "too many".into()))?;
        if seq_len == 0 || k == 0 || n % seq_len != 0 {
            return Err(bad(
                "seq_len",
                format!("{seq_len} (k {k}) does not divide the {n} tokens"),
            ));
        }
        let want = n
            .checked_mul(4 + 8 * k)
            .and_then(|x| x.checked_add(32))
            .ok_or_else(|| bad("tokens", "too many".into()))?;
        if b.len() != want {
            return Err(bad(
                "length",
                format!("{} bytes where {n} tokens with k = {k} take {want}", b.len()),
            ));
        }
        let words = |from: usize, count: usize| {
            b[from..from + 4 * count]
                .chunks_exact(4)
                .map(|w| w.try_into().expect("4 bytes"))
        };
        let tokens: Vec<u32> = words(32, n).map(u32::from_le_bytes).collect();
        let ids: Vec<u32> = words(32 + 4 * n, n * k).map(u32::from_le_bytes).collect();
        let probs: Vec<f32> = words(32 + 4 * n + 4 * n * k, n * k)
            .map(f32::from_le_bytes)
            .collect();
        if let Some(i) = probs.iter().position(|p| !(0.0..=1.0).contains(p)) {
            return Err(bad(
                &format!("probs[{i}]"),
                format!("{} is not in [0, 1]", probs[i]),
            ));
        }
        Ok(TopKCache {
            seq_len,
            k,
            tokens,
            ids,
            probs,
        })
    }
}

const CACHE_MAGIC: &[u8; 4] = b"MSTK";

/// Runs `target` over `seqs` (each exactly `seq_len` tokens), `batch` sequences per pass, and keeps the top `k`
/// probabilities of every position; `log` gets the sequences done after every pass.
pub fn cache_top_k(
    target: &Model,
    seqs: &[Vec<u32>],
    k: usize,
    batch: usize,
    mut log: impl FnMut(usize),
) -> Result<TopKCache> {
    let Some(seq_len) = seqs.first().map(Vec::len) else {
        return Err(RuntimeError::invalid("sequences", "none given"));
    };
    let vocab = target.config().vocab_size;
    if k == 0 || k > vocab || batch == 0 || seq_len == 0 {
        return Err(RuntimeError::invalid(
            "k, batch",
            format!("k must be in [1, {vocab}], batch and the sequence length positive"),
        ));
    }
    if let Some(i) = seqs.iter().position(|s| s.len() != seq_len) {
        return Err(RuntimeError::invalid(
            format!("sequences[{i}]"),
            format!("has {} tokens, not {seq_len}", seqs[i].len()),
        ));
    }
    let mut out = TopKCache {
        seq_len,
        k,
        tokens: seqs.concat(),
        ids: Vec::with_capacity(seqs.len() * seq_len * k),
        probs: Vec::with_capacity(seqs.len() * seq_len * k),
    };
    for (done, chunk) in seqs.chunks(batch).enumerate() {
        let mut caches: Vec<KvCache> = chunk.iter().map(|_| target.new_cache()).collect();
        let mut refs: Vec<&mut KvCache> = caches.iter_mut().collect();
        let ins: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
        let mut failed = None;
        target.forward_batch_rows(&mut refs, &ins, &mut |_, rows| {
            // Rows are independent, and each is computed as alone: the cache is the same on any thread count.
            let kept: Result<Vec<Vec<(u32, f32)>>> = rows
                .par_chunks_exact(vocab)
                .map(|row| top_k_probs(row, k))
                .collect();
            match kept {
                Ok(kept) => {
                    for (t, q) in kept.into_iter().flatten() {
                        out.ids.push(t);
                        out.probs.push(q);
                    }
                }
                Err(e) => failed = Some(e),
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        log((done * batch + chunk.len()).min(seqs.len()));
    }
    Ok(out)
}

/// Continues every prompt to `seq_len` tokens by sampling the target under `params` (sequence b with its own
/// generator seeded by `seeds[b]`: the tokens [`generate_plain_batch`] draws, cut at `seq_len`), and keeps the
/// target's top-`k` distributions (temperature 1) at every position of the results, from the same passes: each
/// prompt's prefill rows and each step's row are the cache's rows, so the text costs no second pass. Every
/// unfinished sequence takes part in every pass; a sequence leaves once it holds `seq_len` tokens and its last
/// position has been scored. Prompts must be non-empty and at most `seq_len` tokens. `log` gets the sequences
/// finished after every pass.
pub fn continue_and_cache(
    target: &Model,
    prompts: &[Vec<u32>],
    params: &spin_core::SamplingParams,
    seq_len: usize,
    k: usize,
    seeds: &[u64],
    mut log: impl FnMut(usize),
) -> Result<TopKCache> {
    use rand::SeedableRng;
    let vocab = target.config().vocab_size;
    if k == 0 || k > vocab || seq_len == 0 {
        return Err(RuntimeError::invalid(
            "k, seq_len",
            format!("k must be in [1, {vocab}] and seq_len positive"),
        ));
    }
    if prompts.len() != seeds.len() {
        return Err(RuntimeError::invalid(
            "seeds",
            format!("{} seeds for {} prompts", seeds.len(), prompts.len()),
        ));
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty() || p.len() > seq_len) {
        return Err(RuntimeError::invalid(
            format!("prompts[{i}]"),
            format!("has {} tokens, not 1 to {seq_len}", prompts[i].len()),
        ));
    }
    let n = prompts.len();
    let mut rngs: Vec<rand_chacha::ChaCha8Rng> = seeds
        .iter()
        .map(|&s| rand_chacha::ChaCha8Rng::seed_from_u64(s))
        .collect();
    let mut caches: Vec<KvCache> = prompts.iter().map(|_| target.new_cache()).collect();
    let mut seqs: Vec<Vec<u32>> = prompts.to_vec();
    // Per sequence, its rows' top-k in position order.
    let mut kept: Vec<Vec<(u32, f32)>> = prompts.iter().map(|_| Vec::with_capacity(seq_len * k)).collect();
    // The inputs of the next pass, per sequence (empty once it is finished).
    let mut inputs: Vec<Vec<u32>> = prompts.to_vec();
    let mut p = Vec::with_capacity(vocab);
    let mut finished = 0;
    while finished < n {
        let active: Vec<usize> = (0..n).filter(|&b| !inputs[b].is_empty()).collect();
        let mut failed = None;
        {
            let mut refs: Vec<&mut KvCache> = caches
                .iter_mut()
                .enumerate()
                .filter(|(b, _)| !inputs[*b].is_empty())
                .map(|(_, c)| c)
                .collect();
            let ins: Vec<&[u32]> = active.iter().map(|&b| inputs[b].as_slice()).collect();
            let mut next: Vec<Option<u32>> = vec![None; active.len()];
            target.forward_batch_rows(&mut refs, &ins, &mut |i, rows| {
                let b = active[i];
                let tops: Result<Vec<Vec<(u32, f32)>>> = rows
                    .par_chunks_exact(vocab)
                    .map(|row| top_k_probs(row, k))
                    .collect();
                let drawn = tops.and_then(|tops| {
                    kept[b].extend(tops.into_iter().flatten());
                    if seqs[b].len() == seq_len {
                        return Ok(None);
                    }
                    probs_into(&rows[rows.len() - vocab..], params, &mut p)?;
                    Ok(Some(spin_core::Dist::new(&p)?.sample(&mut rngs[b])))
                });
                match drawn {
                    Ok(t) => next[i] = t,
                    Err(e) => failed = Some(e),
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
            for (&b, t) in active.iter().zip(next) {
                inputs[b].clear();
                if let Some(t) = t {
                    seqs[b].push(t);
                    inputs[b].push(t);
                }
            }
        }
        finished = inputs.iter().filter(|i| i.is_empty()).count();
        log(finished);
    }
    let mut out = TopKCache {
        seq_len,
        k,
        tokens: Vec::with_capacity(n * seq_len),
        ids: Vec::with_capacity(n * seq_len * k),
        probs: Vec::with_capacity(n * seq_len * k),
    };
    for (s, rows) in seqs.iter().zip(&kept) {
        out.tokens.extend_from_slice(s);
        for &(t, q) in rows {
            out.ids.push(t);
            out.probs.push(q);
        }
    }
    Ok(out)
}

/// The `k` most probable tokens of one row of logits with their softmax probabilities, most probable first (ties
/// to the smaller id). One pass keeps the k largest logits seen so far (a token enters only above the k-th, so
/// after the first few hundred columns almost none does) and sums the exponentials beside it; no per-row
/// allocation of the vocabulary's size.
fn top_k_probs(row: &[f32], k: usize) -> Result<Vec<(u32, f32)>> {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return Err(RuntimeError::invalid("logits", "a row without a finite maximum"));
    }
    // Sum of exponentials in eight f64 partial sums (a fixed order: the same bits on any thread count).
    let mut parts = [0f64; 8];
    let (chunks, tail) = row.as_chunks::<8>();
    for c in chunks {
        for (p, &l) in parts.iter_mut().zip(c) {
            *p += f64::from(crate::kernels::exp_with::<false>(l - m));
        }
    }
    for (p, &l) in parts.iter_mut().zip(tail) {
        *p += f64::from(crate::kernels::exp_with::<false>(l - m));
    }
    let z: f64 = parts.iter().sum();
    if !z.is_finite() {
        return Err(RuntimeError::invalid(
            "logits",
            "a row whose exponentials do not sum to a finite number",
        ));
    }
    // The k best (logit, id), best first: larger logit, then smaller id.
    let mut best: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &l) in row.iter().enumerate() {
        if best.len() == k && l <= best[k - 1].0 {
            continue;
        }
        let at = best.partition_point(|&(b, _)| b >= l);
        best.insert(at, (l, i as u32));
        best.truncate(k);
    }
    Ok(best
        .into_iter()
        .map(|(l, t)| {
            (
                t,
                (f64::from(crate::kernels::exp_with::<false>(l - m)) / z) as f32,
            )
        })
        .collect())
}

/// One training batch for a restricted-head student: compact input ids (B, T), the target's kept probabilities
/// on the head's tokens renormalised per position (B, T, V_d), and each position's weight (1, or 0 where none of
/// the target's kept tokens is on the head).
#[derive(Debug, Clone)]
pub struct HeadBatch {
    ids: Tensor,
    target: Tensor,
    log_target: Tensor,
    weight: Tensor,
    weight_sum: f64,
}

/// `weight` if [`HeadStudent::set_argmax_weight`] takes it (finite and ≥ 0), else an error naming
/// `argmax_weight`: for a caller that checks its options before the long work that precedes training.
pub fn check_argmax_weight(weight: f64) -> Result<f64> {
    if weight.is_finite() && weight >= 0.0 {
        Ok(weight)
    } else {
        Err(RuntimeError::invalid(
            "argmax_weight",
            format!("{weight} is not a finite number ≥ 0"),
        ))
    }
}

/// A student with a restricted head (`crate::head_vocab`), trained by AdamW on the KL divergence from the
/// target's top-k distributions restricted to the head, KL(p̃ ‖ q) with p̃ = p on the head's tokens, renormalised.
pub struct HeadStudent {
    model: Model,
    tensors: HashMap<String, Tensor>,
    opt: AdamW,
    hv: crate::head_vocab::HeadVocab,
    /// Weight of the cross-entropy on the target's most probable head token added to the KL (0: KL alone).
    argmax_weight: f64,
}

impl HeadStudent {
    /// A student of shape `cfg` (its vocabulary the head's compact one) initialised from `seed`.
    pub fn new(cfg: Config, hv: crate::head_vocab::HeadVocab, learning_rate: f64, seed: u64) -> Result<Self> {
        if cfg.vocab_size != hv.compact_vocab() {
            return Err(RuntimeError::invalid(
                "student.vocab_size",
                format!("{} is not the head's {} ids", cfg.vocab_size, hv.compact_vocab()),
            ));
        }
        let init = crate::model::random_tensors(&cfg, 0.02, seed, &Device::Cpu)?;
        Self::from_tensors(cfg, hv, learning_rate, &init, 0)
    }

    /// A student of shape `cfg` (its vocabulary the head's compact one) starting from `init`, which holds every
    /// tensor [`tensor_shapes`] lists for `cfg`, in those shapes (e.g. some of the target's own layers).
    ///
    /// `frozen` > 0 keeps the first `frozen` layers and the embedding (with the head tied to it, or the untied
    /// head too) as `init` gives them: they are constants of the graph, so no gradient is computed for them or
    /// through them, and a step costs their forward pass alone. The layers above them and the final norm learn
    /// to map the frozen layers' output onto the frozen head: a draft that reads features the target's own first
    /// layers computed (what the target learned in pre-training), trained only where it differs.
    pub fn from_tensors(
        cfg: Config,
        hv: crate::head_vocab::HeadVocab,
        learning_rate: f64,
        init: &HashMap<String, Tensor>,
        frozen: usize,
    ) -> Result<Self> {
        if frozen > 0 && frozen >= cfg.n_layers {
            return Err(RuntimeError::invalid(
                "frozen",
                format!(
                    "{frozen} frozen layers leave none of the student's {} to train",
                    cfg.n_layers
                ),
            ));
        }
        let is_frozen = |name: &str| -> bool {
            if frozen == 0 {
                return false;
            }
            if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
                return true;
            }
            name.strip_prefix("model.layers.")
                .and_then(|rest| rest.split('.').next())
                .and_then(|l| l.parse::<usize>().ok())
                .is_some_and(|l| l < frozen)
        };
        if cfg.vocab_size != hv.compact_vocab() {
            return Err(RuntimeError::invalid(
                "student.vocab_size",
                format!("{} is not the head's {} ids", cfg.vocab_size, hv.compact_vocab()),
            ));
        }
        let device = Device::Cpu;
        let mut vars = Vec::new();
        let mut tensors = HashMap::new();
        for (name, shape) in tensor_shapes(&cfg) {
            let Some(t) = init.get(&name) else {
                return Err(RuntimeError::invalid(
                    format!("init.{name}"),
                    "missing from the student's initial tensors",
                ));
            };
            if t.dims() != shape.as_slice() {
                return Err(RuntimeError::invalid(
                    format!("init.{name}"),
                    format!("has shape {:?}, not {shape:?}", t.dims()),
                ));
            }
            let t = t.to_dtype(DType::F32)?.to_device(&device)?;
            if is_frozen(&name) {
                tensors.insert(name, t);
                continue;
            }
            let v = Var::from_tensor(&t)?;
            tensors.insert(name, v.as_tensor().clone());
            vars.push(v);
        }
        let map = TensorMap {
            what: "student".into(),
            tensors: tensors.clone(),
            device: device.clone(),
        };
        let mut model = Model::from_source(cfg, &map as &dyn WeightSource, &device)?;
        model.set_differentiable(true)?;
        let params = ParamsAdamW {
            lr: learning_rate,
            weight_decay: 0.0,
            ..Default::default()
        };
        Ok(Self {
            model,
            tensors,
            opt: AdamW::new(vars, params)?,
            hv,
            argmax_weight: 0.0,
        })
    }

    /// The batch of cached sequences `rows`.
    pub fn batch(&self, cache: &TopKCache, rows: &[usize]) -> Result<HeadBatch> {
        let (t, k, vd) = (cache.seq_len, cache.k, self.hv.ids().len());
        let mut ids = Vec::with_capacity(rows.len() * t);
        let mut target = vec![0f32; rows.len() * t * vd];
        let mut weight = vec![0f32; rows.len() * t];
        for (b, &r) in rows.iter().enumerate() {
            if r >= cache.sequences() {
                return Err(RuntimeError::invalid(
                    "rows",
                    format!("{r} is outside the {} cached sequences", cache.sequences()),
                ));
            }
            self.hv.map_tokens(&cache.tokens[r * t..(r + 1) * t], &mut ids)?;
            for j in 0..t {
                let at = (r * t + j) * k;
                let row = &mut target[(b * t + j) * vd..(b * t + j + 1) * vd];
                let mut kept = 0f32;
                for (&id, &p) in cache.ids[at..at + k].iter().zip(&cache.probs[at..at + k]) {
                    let s = self.hv.compact(id)? as usize;
                    if s < vd {
                        row[s] += p;
                        kept += p;
                    }
                }
                if kept > 0.0 {
                    row.iter_mut().for_each(|x| *x /= kept);
                    weight[b * t + j] = 1.0;
                }
            }
        }
        let device = Device::Cpu;
        let weight_sum = weight.iter().map(|&w| f64::from(w)).sum::<f64>();
        let target = Tensor::from_vec(target, (rows.len(), t, vd), &device)?;
        let log_target = (target.clone() + 1e-12)?.log()?;
        Ok(HeadBatch {
            ids: Tensor::from_vec(ids, (rows.len(), t), &device)?,
            target,
            log_target,
            weight: Tensor::from_vec(weight, (rows.len(), t), &device)?,
            weight_sum,
        })
    }

    /// The training loss and the KL part of it, each the weighted mean over the batch's positions.
    fn losses(&self, b: &HeadBatch) -> Result<(Tensor, Tensor)> {
        let vd = self.hv.ids().len();
        let logits = self.model.forward_full(&b.ids)?.narrow(D::Minus1, 0, vd)?;
        let log_q = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let kl = (&b.target * (&b.log_target - &log_q)?)?.sum(D::Minus1)?;
        let mean =
            |per: Tensor| -> Result<Tensor> { Ok(((per * &b.weight)?.sum_all()? / b.weight_sum.max(1.0))?) };
        if self.argmax_weight == 0.0 {
            let kl = mean(kl)?;
            return Ok((kl.clone(), kl));
        }
        // −log q at the target's most probable head token (a row's ties all count; rows of weight 0 do not).
        let top = b
            .target
            .broadcast_eq(&b.target.max_keepdim(D::Minus1)?)?
            .to_dtype(DType::F32)?;
        let ce = (top * &log_q)?.sum(D::Minus1)?.neg()?;
        let total = (&kl + (ce * self.argmax_weight)?)?;
        Ok((mean(total)?, mean(kl)?))
    }

    /// The mean KL(p̃ ‖ q) over the batch's weighted positions, in nats.
    pub fn kl(&self, b: &HeadBatch) -> Result<f64> {
        Ok(f64::from(self.losses(b)?.1.to_scalar::<f32>()?))
    }

    /// The training loss on the batch: [`HeadStudent::kl`], plus the argmax weight times the mean cross-entropy
    /// at the target's most probable head token.
    pub fn loss(&self, b: &HeadBatch) -> Result<f64> {
        Ok(f64::from(self.losses(b)?.0.to_scalar::<f32>()?))
    }

    /// One AdamW step on the batch's training loss; returns the KL before the step.
    pub fn step(&mut self, b: &HeadBatch) -> Result<f64> {
        let (loss, kl) = self.losses(b)?;
        self.opt.backward_step(&loss)?;
        Ok(f64::from(kl.to_scalar::<f32>()?))
    }

    /// Adds `weight` × the cross-entropy at the target's most probable head token to the training loss (0, the
    /// default: the KL alone). Greedy acceptance asks only that the draft's top token be the target's; the KL
    /// spends the student's capacity on the whole distribution, which sampling at temperature 1 needs.
    pub fn set_argmax_weight(&mut self, weight: f64) -> Result<()> {
        self.argmax_weight = check_argmax_weight(weight)?;
        Ok(())
    }

    /// Sets the learning rate of the following steps (a schedule's value for the next step).
    pub fn set_learning_rate(&mut self, learning_rate: f64) {
        self.opt.set_learning_rate(learning_rate);
    }

    /// The student's tensors (Hugging Face names) as trained so far, for [`crate::hf::write_draft_dir`].
    pub fn tensors(&self) -> &HashMap<String, Tensor> {
        &self.tensors
    }

    /// The restricted head.
    pub fn head_vocab(&self) -> &crate::head_vocab::HeadVocab {
        &self.hv
    }
}

/// The target's tensors a student made of its layers `layers` needs, with their shapes (Hugging Face names, as
/// [`tensor_shapes`] lists them for the target): the embedding, the final norm, an untied output head, and every
/// tensor of those layers.
pub fn layer_tensor_names(target: &Config, layers: &[usize]) -> Vec<(String, Vec<usize>)> {
    let keep: Vec<String> = layers.iter().map(|l| format!("model.layers.{l}.")).collect();
    tensor_shapes(target)
        .into_iter()
        .filter(|(n, _)| !n.starts_with("model.layers.") || keep.iter().any(|k| n.starts_with(k.as_str())))
        .collect()
}

/// A restricted-head student made of some of the target's own layers: target layers `layers` (in that order)
/// become the student's layers 0, 1, …, with the target's width, heads, norms and rope; its input embedding and
/// (tied or not) output head are the target's rows of the head's tokens, and the "other" id's row is the mean of
/// all the target's rows. `target` holds the tensors [`layer_tensor_names`] lists. The student's rope pairs
/// halves (Hugging Face order, what [`crate::hf::write_draft_dir`] stores): query and key rows of a target whose
/// rope pairs neighbours (GGUF Llama files) are reordered to match, so that a student of all the target's layers
/// computes the target's own logits on the head's tokens (tested).
pub fn student_from_layers(
    target_cfg: &Config,
    target: &HashMap<String, Tensor>,
    layers: &[usize],
    hv: &crate::head_vocab::HeadVocab,
) -> Result<(Config, HashMap<String, Tensor>)> {
    if layers.is_empty() {
        return Err(RuntimeError::invalid(
            "layers",
            "name at least one of the target's layers",
        ));
    }
    if let Some(&l) = layers.iter().find(|&&l| l >= target_cfg.n_layers) {
        return Err(RuntimeError::invalid(
            "layers",
            format!(
                "{l} is not a layer of the target (it has {})",
                target_cfg.n_layers
            ),
        ));
    }
    if hv.full_vocab() != target_cfg.vocab_size {
        return Err(RuntimeError::invalid(
            "head_vocab",
            format!(
                "is over {} tokens, the target has {}",
                hv.full_vocab(),
                target_cfg.vocab_size
            ),
        ));
    }
    let cfg = Config {
        vocab_size: hv.compact_vocab(),
        n_layers: layers.len(),
        rope: crate::model::RopeStyle::Halves,
        ..target_cfg.clone()
    };
    let get = |name: &str| {
        target
            .get(name)
            .ok_or_else(|| RuntimeError::invalid(format!("target.{name}"), "missing"))
    };
    // Rows of the head's tokens, then the mean row for "other".
    let rows = |name: &str| -> Result<Tensor> {
        let full = get(name)?.to_dtype(DType::F32)?;
        let ids = Tensor::from_vec(hv.ids().to_vec(), hv.ids().len(), full.device())?;
        let mean = full.mean_keepdim(0)?;
        Ok(Tensor::cat(&[full.index_select(&ids, 0)?, mean], 0)?)
    };
    let head_dim = target_cfg.dim / target_cfg.n_heads;
    let to_halves = |w: &Tensor, heads: usize| -> Result<Tensor> {
        if target_cfg.rope == crate::model::RopeStyle::Halves {
            return Ok(w.clone());
        }
        // Row (h, 2i + j) of a neighbour-paired file is row (h, j·head_dim/2 + i) in halves order.
        let d = w.dim(1)?;
        Ok(w.reshape((heads, head_dim / 2, 2, d))?
            .transpose(1, 2)?
            .reshape((heads * head_dim, d))?
            .contiguous()?)
    };
    let mut out = HashMap::new();
    out.insert(
        "model.embed_tokens.weight".to_string(),
        rows("model.embed_tokens.weight")?,
    );
    if !target_cfg.tied_embeddings {
        out.insert("lm_head.weight".to_string(), rows("lm_head.weight")?);
    }
    out.insert("model.norm.weight".to_string(), get("model.norm.weight")?.clone());
    for (i, &l) in layers.iter().enumerate() {
        let from = format!("model.layers.{l}.");
        for (name, t) in target {
            let Some(part) = name.strip_prefix(&from) else {
                continue;
            };
            let t = match part {
                "self_attn.q_proj.weight" => to_halves(t, target_cfg.n_heads)?,
                "self_attn.k_proj.weight" => to_halves(t, target_cfg.n_kv_heads)?,
                "self_attn.q_proj.bias" | "self_attn.k_proj.bias" if target_cfg.rope != cfg.rope => {
                    return Err(RuntimeError::invalid(
                        format!("target.{name}"),
                        "query/key biases with neighbour-paired rope are not supported",
                    ));
                }
                _ => t.clone(),
            };
            out.insert(format!("model.layers.{i}.{part}"), t);
        }
    }
    for (name, _) in tensor_shapes(&cfg) {
        if !out.contains_key(&name) {
            return Err(RuntimeError::invalid(format!("target.{name}"), "missing"));
        }
    }
    Ok((cfg, out))
}

#[cfg(test)]
mod tests {
    use super::{cosine_learning_rate, top_k_probs};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The one-pass top-k equals sorting the whole softmax (f64) by probability, ties to the smaller id, on rows
    /// with many repeated logits and on rows too short to fill k.
    #[test]
    fn top_k_equals_sorting_every_probability() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for case in 0..200 {
            let vocab = [3, 17, 64, 1000][case % 4];
            // Logits from a small set of values, so that ties are common.
            let row: Vec<f32> = (0..vocab)
                .map(|_| f32::from(rng.random_range(0u8..12)) * 0.75 - 4.0)
                .collect();
            let k = 1 + case % vocab.min(40);
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e: Vec<f64> = row.iter().map(|&l| f64::from(l - m).exp()).collect();
            let z: f64 = e.iter().sum();
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let got = top_k_probs(&row, k).unwrap();
            assert_eq!(got.len(), k);
            for (j, &(t, p)) in got.iter().enumerate() {
                assert_eq!(t as usize, order[j], "case {case}: rank {j}");
                let want = e[order[j]] / z;
                assert!(
                    (f64::from(p) - want).abs() <= 1e-6 * want,
                    "case {case}: {p} against {want}"
                );
            }
        }
        assert!(top_k_probs(&[f32::NEG_INFINITY; 4], 2).is_err());
        assert!(top_k_probs(&[0.0, f32::NAN, 1.0], 2).is_err());
    }

    /// The cosine schedule warms up linearly to the peak, falls monotonically, and ends at a tenth of it.
    #[test]
    fn cosine_schedule_warms_up_then_decays_to_a_tenth() {
        let steps = 400;
        let lr: Vec<f64> = (0..steps).map(|s| cosine_learning_rate(1e-3, s, steps)).collect();
        assert!((lr[0] - 1e-3 / 20.0).abs() < 1e-15);
        assert!((lr[19] - 1e-3).abs() < 1e-15);
        assert!(lr[20..].windows(2).all(|w| w[1] <= w[0]));
        assert!((lr[steps - 1] - 1e-4).abs() < 1e-12, "{}", lr[steps - 1]);
        assert_eq!(cosine_learning_rate(1e-3, 0, 1), 1e-3);
    }
}
