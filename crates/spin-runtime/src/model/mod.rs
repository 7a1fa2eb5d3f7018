//! A Llama-architecture transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU) that scores every position,
//! keeps a truncatable KV cache per sequence and runs padded batches of sequences of different lengths.
//!
//! The same code serves the drafter, the batched verifier (paper A eq. 7: all K drafts in one pass, shorter ones
//! padded) and distillation training: with `differentiable` set it uses only ops that candle can back-propagate.

//! The folder splits it as candle splits its models: `config` (shape and numerics), `weights` (projections,
//! weight sources, the fused CPU copies), `cache` (per-sequence KV caches and the host path's buffers they keep),
//! `attention` (rotary embeddings and attention), `mlp` (the SwiGLU block), `host` (the single-sequence host path
//! of small dense models, no candle op per step) and `qhost` (the quantised host route: a GGUF model's whole pass
//! over its own weight blocks, for any batch).

mod attention;
mod cache;
mod config;
mod host;
mod mlp;
mod qhost;
mod weights;

pub use cache::KvCache;
pub use config::{Config, RopeStyle};
pub(crate) use weights::HostRows;
pub(crate) use weights::{Embedding, Proj, TensorMap, WeightSource, check_shape};
pub use weights::{model_from_tensors, random_tensors, tensor_shapes, tiny_random_model};

use crate::error::{Result, RuntimeError};
use cache::{GroupPass, HostBuffers, KvUpdate, LayerKv};
use candle_core::{D, Device, Tensor};
use host::HostWeights;
use qhost::QHostWeights;
use rayon::prelude::*;
use weights::{Fused, Layer, rope_tables};

pub use host::HOST_MAX_TOKENS;

/// A loaded transformer. Cheap to clone (tensors are shared).
#[derive(Debug, Clone)]
pub struct Model {
    cfg: Config,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Proj,
    /// The dense output head again, transposed (dim, vocab) and contiguous, for the CPU fast path's candle route
    /// (as `Fused`, built on first use; `None` inside for a quantised head).
    head_t: std::sync::OnceLock<Option<Tensor>>,
    cos: Tensor,
    sin: Tensor,
    /// The same tables on the host, (max_seq_len, head_dim/2) row-major, for the CPU fast path.
    cos_host: Vec<f32>,
    sin_host: Vec<f32>,
    device: Device,
    differentiable: bool,
    cpu_fast: bool,
    /// Host copies of a small dense model's weights for single-sequence steps (`host.rs`); `None` for large or
    /// quantised models, off the CPU and while training.
    host: Option<std::sync::Arc<HostWeights>>,
    /// The quantised host route's weights (`qhost.rs`): a model whose embedding and projections are all host
    /// matrices (a GGUF file on the CPU), not training; `None` otherwise.
    qhost: Option<std::sync::Arc<QHostWeights>>,
    /// Whether passes may take the host path or the quantised host route (see [`Model::set_host_path`]).
    host_on: bool,
    /// A restricted draft head's map to the target's vocabulary (`crate::head_vocab`); `None` for a model that
    /// scores its whole vocabulary.
    head_vocab: Option<std::sync::Arc<crate::head_vocab::HeadVocab>>,
}

impl Model {
    /// Builds a model from a weight source; every tensor's shape is checked against `cfg`.
    pub(crate) fn from_source(cfg: Config, src: &dyn WeightSource, device: &Device) -> Result<Self> {
        cfg.validate()?;
        let (d, h, kv) = (cfg.dim, cfg.hidden_dim, cfg.kv_dim());
        let embed = src.embedding("model.embed_tokens", &[cfg.vocab_size, d])?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = format!("model.layers.{i}");
            let (q, k, v) = (
                format!("{p}.self_attn.q_proj"),
                format!("{p}.self_attn.k_proj"),
                format!("{p}.self_attn.v_proj"),
            );
            let [wq, wk, wv]: [Proj; 3] = src
                .projs(&[(&q, d), (&k, kv), (&v, kv)], d, cfg.qkv_bias)?
                .try_into()
                .map_err(|_| RuntimeError::invalid("weights", "q|k|v: not three projections"))?;
            let (g, u) = (format!("{p}.mlp.gate_proj"), format!("{p}.mlp.up_proj"));
            let [gate, up]: [Proj; 2] = src
                .projs(&[(&g, h), (&u, h)], d, false)?
                .try_into()
                .map_err(|_| RuntimeError::invalid("weights", "gate|up: not two projections"))?;
            layers.push(Layer {
                attn_norm: src.dense(&format!("{p}.input_layernorm"), &[d])?,
                wq,
                wk,
                wv,
                wo: src.proj(&format!("{p}.self_attn.o_proj"), d, d, false)?,
                ffn_norm: src.dense(&format!("{p}.post_attention_layernorm"), &[d])?,
                gate,
                up,
                down: src.proj(&format!("{p}.mlp.down_proj"), d, h, false)?,
                fused: std::sync::OnceLock::new(),
            });
        }
        let norm = src.dense("model.norm", &[d])?;
        let head = if cfg.tied_embeddings || !src.contains("lm_head") {
            embed.head()
        } else {
            src.proj("lm_head", cfg.vocab_size, d, false)?
        };
        let (cos_host, sin_host) = rope_tables(&cfg);
        let half = cfg.head_dim() / 2;
        let cos = Tensor::from_vec(cos_host.clone(), (cfg.max_seq_len, half), device)?;
        let sin = Tensor::from_vec(sin_host.clone(), (cfg.max_seq_len, half), device)?;
        let mut model = Model {
            cfg,
            embed,
            layers,
            norm,
            head,
            head_t: std::sync::OnceLock::new(),
            cos,
            sin,
            cos_host,
            sin_host,
            device: device.clone(),
            differentiable: false,
            cpu_fast: device.is_cpu(),
            host: None,
            qhost: None,
            host_on: true,
            head_vocab: None,
        };
        model.gather_host_matrices();
        model.rebuild_fused()?;
        Ok(model)
    }

    /// Forgets the fused projections and the transposed output head (rebuilt on first use from the weights as
    /// they then are) and builds (on the CPU, for inference) or drops (elsewhere, and while training) the host
    /// copies of a small model.
    fn rebuild_fused(&mut self) -> Result<()> {
        let want = self.device.is_cpu() && !self.differentiable;
        for layer in &mut self.layers {
            layer.fused = std::sync::OnceLock::new();
        }
        self.head_t = std::sync::OnceLock::new();
        self.host = if want {
            HostWeights::of(self)?.map(std::sync::Arc::new)
        } else {
            None
        };
        self.qhost = if want {
            QHostWeights::of(self)?.map(std::sync::Arc::new)
        } else {
            None
        };
        Ok(())
    }

    /// A layer's fused projections for the CPU fast path, built on first use; `None` for quantised weights, off
    /// the CPU and while training.
    fn fused_of<'a>(&self, layer: &'a Layer) -> Result<Option<&'a Fused>> {
        if !self.device.is_cpu() || self.differentiable {
            return Ok(None);
        }
        if layer.fused.get().is_none() {
            // Two threads may both build it; one result is kept, both are the same.
            let _ = layer.fused.set(Fused::of(layer)?);
        }
        Ok(layer.fused.get().and_then(Option::as_ref))
    }

    /// The transposed output head for the CPU fast path, built on first use; `None` for a quantised head, off the
    /// CPU and while training.
    fn head_t(&self) -> Result<Option<&Tensor>> {
        if !self.device.is_cpu() || self.differentiable {
            return Ok(None);
        }
        if self.head_t.get().is_none() {
            let t = match &self.head {
                Proj::Dense(l) => Some(weights::transpose_cat(&[l.weight()])?),
                Proj::Quant { .. } | Proj::Host { .. } => None,
            };
            let _ = self.head_t.set(t);
        }
        Ok(self.head_t.get().and_then(Option::as_ref))
    }

    /// Use only back-propagatable ops (for training); slower than the fused inference kernels. Switching on
    /// drops the fused copies of the projections (training updates the originals); switching off rebuilds them
    /// from the weights as they then are.
    pub fn set_differentiable(&mut self, on: bool) -> Result<()> {
        self.differentiable = on;
        self.rebuild_fused()
    }

    /// The same model with every quantised projection dequantised to dense f32 (a GGUF file's Q4/Q8 matrices):
    /// four to eight times the weight memory, and on the CPU the fused and transposed copies (and, for small
    /// models, the host path) that dense weights get. This is how a memory-bound target is measured on the CPU
    /// (`multispin measure verify-latency --dequantize`, docs/runtime.md). Dense models come back unchanged.
    pub fn dequantize(&self) -> Result<Model> {
        let mut m = self.clone();
        for layer in &mut m.layers {
            for p in [
                &mut layer.wq,
                &mut layer.wk,
                &mut layer.wv,
                &mut layer.wo,
                &mut layer.gate,
                &mut layer.up,
                &mut layer.down,
            ] {
                *p = p.dequantized()?;
            }
        }
        m.head = m.head.dequantized()?;
        m.rebuild_fused()?;
        Ok(m)
    }

    /// The same model with its embedding, output head and every projection without a bias quantised to `format`
    /// (candle's quantiser, the one llama.cpp's formats define) and held as host matrices, so that on the CPU
    /// every pass takes the quantised host route: how a small dense draft (a model folder of f32 weights) is run
    /// at a fraction of its f32 bytes per step (`multispin generate --draft-format q8_0`). Matrices already
    /// quantised stay as they are. Fails, naming the matrix, where a width is not a whole number of `format`'s
    /// blocks or the model is not on the CPU. The logits differ from the dense model's by the quantisation: a
    /// draft's q changes, never the exactness of speculative sampling, which holds for any q.
    pub fn quantize_host(&self, format: crate::quant::BlockFormat) -> Result<Model> {
        use candle_core::quantized::QTensor;
        if !self.device.is_cpu() {
            return Err(RuntimeError::invalid("device", "host matrices live on the CPU"));
        }
        use candle_core::quantized::GgmlDType;
        let ggml = match format {
            crate::quant::BlockFormat::Q8_0 => GgmlDType::Q8_0,
            crate::quant::BlockFormat::Q4_0 => GgmlDType::Q4_0,
            crate::quant::BlockFormat::Q4_1 => GgmlDType::Q4_1,
            other => {
                return Err(RuntimeError::invalid(
                    "format",
                    format!("{other:?}: a draft is quantised to Q8_0, Q4_0 or Q4_1"),
                ));
            }
        };
        let to_host = |what: &str, w: &Tensor| -> Result<std::sync::Arc<crate::quant::QMatrix>> {
            let (rows, cols) = w.dims2()?;
            if !cols.is_multiple_of(format.block_elems()) {
                return Err(RuntimeError::invalid(
                    what,
                    format!(
                        "{cols} columns is not a whole number of {format:?} blocks of {}",
                        format.block_elems()
                    ),
                ));
            }
            let w = w.to_dtype(candle_core::DType::F32)?.contiguous()?;
            let bytes = if format == crate::quant::BlockFormat::Q8_0 {
                // The same bytes as candle's quantiser, without a libm call per value (`quant::q8`).
                weights::with_values(&w, crate::quant::quantise_q8_0)?
            } else {
                QTensor::quantize(&w, ggml)?.data()?.into_owned()
            };
            Ok(std::sync::Arc::new(crate::quant::QMatrix::new(
                what, format, rows, cols, bytes,
            )?))
        };
        let proj = |what: &str, p: &weights::Proj| -> Result<weights::Proj> {
            Ok(match p {
                weights::Proj::Dense(l) if l.bias().is_none() => weights::Proj::Host {
                    w: weights::HostRows::whole(to_host(what, l.weight())?),
                    b: None,
                },
                other => other.clone(),
            })
        };
        let mut m = self.clone();
        for (i, layer) in m.layers.iter_mut().enumerate() {
            for (name, p) in [
                ("q_proj", &mut layer.wq),
                ("k_proj", &mut layer.wk),
                ("v_proj", &mut layer.wv),
                ("o_proj", &mut layer.wo),
                ("gate_proj", &mut layer.gate),
                ("up_proj", &mut layer.up),
                ("down_proj", &mut layer.down),
            ] {
                *p = proj(&format!("model.layers.{i}.{name}"), p)?;
            }
        }
        let tied = self.cfg.tied_embeddings;
        if let Embedding::Dense(e) = &self.embed {
            m.embed = Embedding::Host(to_host("model.embed_tokens", e)?);
        }
        m.head = if tied {
            m.embed.head()
        } else {
            proj("lm_head", &self.head)?
        };
        m.gather_host_matrices();
        m.rebuild_fused()?;
        Ok(m)
    }

    /// Whether every projection holds dense weights (no quantised matrix).
    pub fn is_dense(&self) -> bool {
        let dense = |p: &Proj| matches!(p, Proj::Dense(_));
        dense(&self.head)
            && self.layers.iter().all(|l| {
                [&l.wq, &l.wk, &l.wv, &l.wo, &l.gate, &l.up, &l.down]
                    .into_iter()
                    .all(dense)
            })
    }

    /// Use the CPU fast path (the default for CPU models): caches in host vectors, fused kernels for attention
    /// and the SwiGLU product, and the fused q|k|v and gate|up projections and transposed output head of dense
    /// models. Off (the default elsewhere), caches are device tensors and every step is a stock candle op, the
    /// path a GPU runs; both give the same logits to rounding. The kernels run on the CPU only, so on other
    /// devices this switches only the cache layout. Caches made before a switch keep their layout, and one batch
    /// may not mix the two.
    pub fn set_cpu_fast_path(&mut self, on: bool) {
        self.cpu_fast = on;
    }

    /// Let passes take the quantised host route of a GGUF model (any batch) and single-sequence steps of up to
    /// [`HOST_MAX_TOKENS`] new positions of a small dense model take the host path (the default):
    /// plain loops over host copies of the weights, no candle op, no allocation once a cache's buffers have grown,
    /// no other thread. The host path serves dense models of up to about four million weights on the CPU fast
    /// path; their batches and longer inputs, and larger dense models, take the candle route. Off, every pass takes
    /// the candle route (what the tests compare both with).
    pub fn set_host_path(&mut self, on: bool) {
        self.host_on = on;
    }

    /// Whether this model has the host path at all (a small dense model on the CPU, not training).
    pub fn has_host_path(&self) -> bool {
        self.host.is_some()
    }

    /// Whether this model has the quantised host route (`qhost.rs`): a GGUF model on the CPU whose matrices are
    /// all in formats the host kernels read, not training. With it (and [`Model::set_host_path`] on, the
    /// default) every pass of any batch runs on the host over the file's blocks; off, passes take the candle route.
    pub fn has_quantised_host_route(&self) -> bool {
        self.qhost.is_some()
    }

    /// The same model as a restricted draft head over a target's vocabulary: its own vocabulary must be the
    /// head's compact one (V_d scored ids and "other"); see `crate::head_vocab`.
    pub fn with_head_vocab(mut self, hv: crate::head_vocab::HeadVocab) -> Result<Model> {
        if hv.compact_vocab() != self.cfg.vocab_size {
            return Err(RuntimeError::invalid(
                "head_vocab",
                format!(
                    "lists {} tokens but the model's vocabulary has {} (the listed ones and one \"other\")",
                    hv.ids().len(),
                    self.cfg.vocab_size
                ),
            ));
        }
        self.head_vocab = Some(std::sync::Arc::new(hv));
        Ok(self)
    }

    /// The restricted draft head's map, if this model has one.
    pub fn head_vocab(&self) -> Option<&crate::head_vocab::HeadVocab> {
        self.head_vocab.as_deref()
    }

    /// Refuses this model where a whole vocabulary's logits are needed (a target verifying drafts, plain decoding):
    /// a restricted draft head scores only its V_d tokens, in compact ids that are not the tokens' own, so it can
    /// draft but not stand for the target. `role` names the model in the error.
    pub fn check_full_head(&self, role: &str) -> Result<()> {
        match &self.head_vocab {
            None => Ok(()),
            Some(h) => Err(RuntimeError::invalid(
                role,
                format!(
                    "a draft with a restricted output head (it scores {} of the {} tokens) cannot be the target: \
                     it drafts for a target of that vocabulary",
                    h.ids().len(),
                    h.full_vocab()
                ),
            )),
        }
    }

    /// The vocabulary a drafter with this model samples over: the target's for a restricted head, else the model's.
    pub fn output_vocab(&self) -> usize {
        self.head_vocab
            .as_ref()
            .map_or(self.cfg.vocab_size, |h| h.full_vocab())
    }

    /// The model's configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// A self-speculation drafter: the first `n_layers` blocks of this model with its own final norm and head.
    pub fn first_layers(&self, n_layers: usize) -> Result<Model> {
        if n_layers == 0 || n_layers > self.cfg.n_layers {
            return Err(RuntimeError::invalid(
                "self_draft_layers",
                format!("{n_layers} is outside 1..={}", self.cfg.n_layers),
            ));
        }
        let mut m = self.clone();
        m.layers.truncate(n_layers);
        m.cfg.n_layers = n_layers;
        // The host copies hold every layer: rebuild them for the kept ones.
        if m.host.is_some() {
            m.host = HostWeights::of(&m)?.map(std::sync::Arc::new);
        }
        if let Some(q) = &m.qhost {
            m.qhost = Some(std::sync::Arc::new(q.first_layers(n_layers)));
        }
        Ok(m)
    }

    /// An empty cache for one sequence.
    pub fn new_cache(&self) -> KvCache {
        let layer = if self.cpu_fast {
            LayerKv::Host {
                k: Vec::new(),
                v: Vec::new(),
            }
        } else {
            LayerKv::Device(None)
        };
        KvCache {
            layers: vec![layer; self.cfg.n_layers],
            len: 0,
            kv_dim: self.cfg.kv_dim(),
            host: HostBuffers::default(),
        }
    }

    /// Feeds `tokens` after what `cache` holds; returns logits (tokens.len(), vocab) for every new position and
    /// appends the new keys and values to the cache.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor> {
        let mut out = self.forward_batch(&mut [cache], &[tokens])?;
        Ok(out.remove(0))
    }

    /// As [`Model::forward`], but the logits of every new position come back as host rows (tokens.len() × vocab,
    /// row-major) borrowed from the cache's own buffer: on the host path a step then allocates nothing. Other
    /// passes copy the candle route's logits into the same buffer.
    pub fn forward_logits<'c>(&self, cache: &'c mut KvCache, tokens: &[u32]) -> Result<&'c [f32]> {
        if self.host_on && self.host_path_for(cache, tokens.len()) {
            self.check_inputs(&[&*cache], &[tokens])?;
            self.forward_host(cache, tokens);
        } else if self.qhost_for(&[&*cache]) {
            self.check_inputs(&[&*cache], &[tokens])?;
            let mut rows = std::mem::take(&mut cache.host.logits);
            self.forward_qhost(&mut [&mut *cache], &[tokens], &mut |_, l| {
                rows.clear();
                rows.extend_from_slice(l);
            });
            cache.host.logits = rows;
        } else {
            let logits = self.forward(cache, tokens)?;
            let rows = logits.flatten_all()?.to_vec1::<f32>()?;
            cache.host.logits = rows;
        }
        Ok(&cache.host.logits)
    }

    /// One padded pass over many sequences (paper A eq. 7: all drafts verified together). Sequence b continues
    /// from its own cache with its own new tokens; shorter inputs are padded, and the mask lets every real query
    /// see exactly its own prefix. Returns per-sequence logits `(tokens[b].len(), vocab)` and extends every cache.
    pub fn forward_batch(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Vec<Tensor>> {
        if let ([cache], [toks]) = (&mut *caches, tokens)
            && self.host_on
            && self.host_path_for(cache, toks.len())
        {
            self.check_inputs(&[&**cache], tokens)?;
            self.forward_host(cache, toks);
            let shape = (toks.len(), self.cfg.vocab_size);
            return Ok(vec![Tensor::from_slice(&cache.host.logits, shape, &self.device)?]);
        }
        let shared: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        if self.qhost_for(&shared) {
            self.check_inputs(&shared, tokens)?;
            let mut out = Vec::with_capacity(tokens.len());
            let mut err = None;
            self.forward_qhost(caches, tokens, &mut |b, l| match Tensor::from_slice(
                l,
                (tokens[b].len(), self.cfg.vocab_size),
                &self.device,
            ) {
                Ok(t) => out.push(t),
                Err(e) => err = Some(e),
            });
            return match err {
                Some(e) => Err(e.into()),
                None => Ok(out),
            };
        }
        in_worker(|| self.forward_batch_here(caches, tokens))
    }

    /// As [`Model::forward_batch`], but each sequence's logits come to `out(b, rows)` as host rows
    /// (`tokens[b].len()` × vocab, row-major), in sequence order: on the quantised host route straight from the
    /// pass's own buffer (no tensor, no copy), elsewhere copied out of the candle route's tensors. For callers that
    /// read every row of many sequences (distillation caches, batched decoding, verification).
    pub fn forward_batch_rows(
        &self,
        caches: &mut [&mut KvCache],
        tokens: &[&[u32]],
        out: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<()> {
        let shared: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        if self.qhost_for(&shared) {
            self.check_inputs(&shared, tokens)?;
            self.forward_qhost(caches, tokens, out);
            return Ok(());
        }
        for (b, l) in self.forward_batch(caches, tokens)?.iter().enumerate() {
            out(
                b,
                &l.to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?,
            );
        }
        Ok(())
    }

    /// Checks a batch's inputs: one token list per cache, none empty, every token in the vocabulary, caches of
    /// this model's shape and of one layout, no sequence past `max_seq_len`.
    fn check_inputs(&self, caches: &[&KvCache], tokens: &[&[u32]]) -> Result<()> {
        if caches.len() != tokens.len() || tokens.is_empty() {
            return Err(RuntimeError::invalid(
                "tokens",
                format!("{} token lists for {} caches", tokens.len(), caches.len()),
            ));
        }
        for (i, s) in tokens.iter().enumerate() {
            if s.is_empty() {
                return Err(RuntimeError::invalid(format!("tokens[{i}]"), "is empty"));
            }
            if let Some(&bad) = s.iter().find(|&&x| x as usize >= self.cfg.vocab_size) {
                return Err(RuntimeError::invalid(
                    format!("tokens[{i}]"),
                    format!("token {bad} is outside the vocabulary of {}", self.cfg.vocab_size),
                ));
            }
            let c = &caches[i];
            if c.layers.len() != self.cfg.n_layers || c.kv_dim != self.cfg.kv_dim() {
                return Err(RuntimeError::invalid(
                    format!("caches[{i}]"),
                    format!(
                        "belongs to a model of {} layers and key width {}, not {} and {}",
                        c.layers.len(),
                        c.kv_dim,
                        self.cfg.n_layers,
                        self.cfg.kv_dim()
                    ),
                ));
            }
            if c.is_host() != caches[0].is_host() {
                return Err(RuntimeError::invalid(
                    format!("caches[{i}]"),
                    "mixes host and device cache layouts in one batch",
                ));
            }
            let end = caches[i].len + s.len();
            if end > self.cfg.max_seq_len {
                return Err(RuntimeError::invalid(
                    format!("tokens[{i}]"),
                    format!(
                        "sequence of {end} positions exceeds max_seq_len {}",
                        self.cfg.max_seq_len
                    ),
                ));
            }
        }
        Ok(())
    }

    fn forward_batch_here(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Vec<Tensor>> {
        let shared: Vec<&KvCache> = caches.iter().map(|c| &**c).collect();
        self.check_inputs(&shared, tokens)?;
        let b = tokens.len();
        // On the CPU fast path with more than one thread, the batch is cut into one group of sequences per
        // thread and each group runs the whole forward pass: one synchronisation per pass instead of one per op.
        let threads = rayon::current_num_threads();
        let groups = if b >= 2 && threads >= 2 && caches[0].is_host() && self.device.is_cpu() {
            threads.min(b)
        } else {
            1
        };
        let size = b.div_ceil(groups);
        let results: Vec<Result<GroupPass>> = caches
            .par_chunks(size)
            .zip(tokens.par_chunks(size))
            .map(|(c, tk)| self.forward_group(c, tk))
            .collect();
        let mut out = Vec::with_capacity(b);
        let mut updates: Vec<Vec<KvUpdate>> = Vec::with_capacity(b);
        for r in results {
            let (logits, per_layer) = r?;
            out.extend(logits);
            // Transpose (layer, sequence) into (sequence, layer).
            let first = updates.len();
            for per_seq in per_layer {
                for (i, u) in per_seq.into_iter().enumerate() {
                    if updates.len() <= first + i {
                        updates.push(Vec::with_capacity(self.cfg.n_layers));
                    }
                    updates[first + i].push(u);
                }
            }
        }
        // Commit the extended caches only once the whole pass has succeeded.
        for ((cache, per_layer), s) in caches.iter_mut().zip(updates).zip(tokens) {
            for (slot, update) in cache.layers.iter_mut().zip(per_layer) {
                match update {
                    // `run` makes host rows only for host layers (checked above: one layout per batch).
                    KvUpdate::Append(nk, nv) => {
                        if let LayerKv::Host { k, v } = slot {
                            k.extend_from_slice(&nk);
                            v.extend_from_slice(&nv);
                        }
                    }
                    KvUpdate::Replace(k, v) => *slot = LayerKv::Device(Some((k, v))),
                }
            }
            cache.len += s.len();
        }
        Ok(out)
    }

    /// One padded pass over a group of validated sequences; returns their logits and, per layer and sequence,
    /// the cache updates, without applying them.
    fn forward_group(&self, caches: &[&mut KvCache], tokens: &[&[u32]]) -> Result<GroupPass> {
        let b = tokens.len();
        let t = tokens.iter().map(|s| s.len()).max().unwrap_or(0);
        let past: Vec<usize> = caches.iter().map(|c| c.len).collect();
        let s_len = past.iter().max().copied().unwrap_or(0) + t;
        let mut ids = Vec::with_capacity(b * t);
        let mut pos = Vec::with_capacity(b * t);
        // Keys: cache at [0, past), new tokens at [past, past + t), zero padding after; query j sees a prefix.
        let mut visible = Vec::with_capacity(b * t);
        for (i, s) in tokens.iter().enumerate() {
            for j in 0..t {
                ids.push(s.get(j).copied().unwrap_or(0));
                pos.push(if j < s.len() { (past[i] + j) as u32 } else { 0 });
                visible.push(past[i] + j + 1);
            }
        }
        let ids = Tensor::from_vec(ids, (b, t), &self.device)?;
        let lens: Vec<usize> = tokens.iter().map(|s| s.len()).collect();
        let (logits, new_caches) = self.run(&ids, &pos, &visible, s_len, Some((caches, &lens)))?;
        let mut out = Vec::with_capacity(b);
        for (i, &n) in lens.iter().enumerate() {
            out.push(logits.get(i)?.narrow(0, 0, n)?);
        }
        Ok((out, new_caches))
    }

    /// Logits (B, T, vocab) for a batch of equal-length sequences from position 0, with no cache (training).
    pub fn forward_full(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if t > self.cfg.max_seq_len {
            return Err(RuntimeError::invalid(
                "ids",
                format!("{t} positions exceed max_seq_len"),
            ));
        }
        let pos: Vec<u32> = (0..b).flat_map(|_| 0..t as u32).collect();
        let visible: Vec<usize> = (0..b).flat_map(|_| 1..=t).collect();
        in_worker(|| Ok(self.run(ids, &pos, &visible, t, None)?.0))
    }

    fn rms(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let eps = self.cfg.rms_eps;
        if self.differentiable {
            let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
            Ok(x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(w)?)
        } else {
            Ok(candle_nn::ops::rms_norm(&x.contiguous()?, w, eps as f32)?)
        }
    }

    /// The transformer body over keys of length `s_len`. With caches, sequence i's keys are laid out as
    /// [its cache | its `lens[i]` new tokens | zeros up to `s_len`]; query j of sequence i attends to the first
    /// `visible[i·T + j]` keys only. Returns logits (B, T, vocab) and, per layer and sequence, the cache update.
    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        ids: &Tensor,
        pos: &[u32],
        visible: &[usize],
        s_len: usize,
        caches: Option<(&[&mut KvCache], &[usize])>,
    ) -> Result<(Tensor, Vec<Vec<KvUpdate>>)> {
        let cfg = &self.cfg;
        let (b, t) = ids.dims2()?;
        let hd = cfg.head_dim();
        // CPU inference takes the fused host kernels; elsewhere (and for training, which needs gradients) stock
        // candle ops with an additive mask. With caches, their layout decides: host caches feed the host kernel.
        let fused = self.cpu_fast && self.device.is_cpu() && !self.differentiable;
        let host_attention = match &caches {
            Some((caches, _)) => caches[0].is_host(),
            None => fused,
        };
        let mask = if host_attention || visible.iter().all(|&n| n >= s_len) {
            None
        } else {
            let m: Vec<f32> = visible
                .iter()
                .flat_map(|&n| (0..s_len).map(move |k| if k < n { 0f32 } else { f32::NEG_INFINITY }))
                .collect();
            Some(Tensor::from_vec(m, (b, 1, t, s_len), &self.device)?)
        };
        let mut x = self.embed.lookup(ids, &self.device)?;
        // The stock path rotates q and k with tensor ops; the host kernel rotates its own rows (`rope_rows`).
        let tables = if host_attention {
            None
        } else {
            let pos = Tensor::from_slice(pos, b * t, &self.device)?;
            Some((
                self.cos.index_select(&pos, 0)?.reshape((b, t, hd / 2))?,
                self.sin.index_select(&pos, 0)?.reshape((b, t, hd / 2))?,
            ))
        };
        let pass = Pass {
            b,
            t,
            pos,
            visible,
            s_len,
            caches,
            mask: mask.as_ref(),
            tables: tables.as_ref(),
        };
        let mut new_caches = Vec::with_capacity(self.layers.len());
        let (d, m) = (cfg.dim, b * t);
        for (li, layer) in self.layers.iter().enumerate() {
            let hn = self.rms(&x, &layer.attn_norm)?;
            let fw = if fused { self.fused_of(layer)? } else { None };
            let (y, update) = self.attention(&pass, li, layer, fw, &hn)?;
            new_caches.extend(update);
            x = match fw {
                Some(f) => (x + y.reshape((m, d))?.matmul(&f.o)?.reshape((b, t, d))?)?,
                None => (x + layer.wo.forward(&y)?)?,
            };
            let hn = self.rms(&x, &layer.ffn_norm)?;
            x = (x + self.mlp(layer, fused, fw, &hn)?)?;
        }
        let x = self.rms(&x, &self.norm)?;
        let head_t = if fused { self.head_t()? } else { None };
        let logits = match head_t {
            Some(w) => x.reshape((m, d))?.matmul(w)?.reshape((b, t, cfg.vocab_size))?,
            _ => self.head.forward(&x)?,
        };
        Ok((logits, new_caches))
    }
}

/// What every layer of one pass shares: the batch shape, positions, visibility, the caches and the precomputed
/// mask and rotary tables of the stock route.
#[derive(Clone, Copy)]
struct Pass<'a> {
    b: usize,
    t: usize,
    pos: &'a [u32],
    visible: &'a [usize],
    s_len: usize,
    caches: Option<(&'a [&'a mut KvCache], &'a [usize])>,
    /// The stock route's additive mask (B, 1, T, S), `None` when nothing is hidden or on the host kernel.
    mask: Option<&'a Tensor>,
    /// The stock route's cos/sin (B, T, head_dim/2) at each position; `None` on the host kernel.
    tables: Option<&'a (Tensor, Tensor)>,
}

/// Runs `f` on a worker of rayon's global pool. candle's CPU kernels split rows with rayon; called from a thread
/// outside the pool, each of the ~25 ops per layer would hand its work to a pool thread and sleep until woken
/// (a futex round trip per op, a fifth of a small model's forward time); inside the pool they run in place.
fn in_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}
