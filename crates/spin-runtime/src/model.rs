//! A Llama-architecture transformer (RMSNorm, RoPE, grouped-query attention, SwiGLU) that scores every position,
//! keeps a truncatable KV cache per sequence and runs padded batches of sequences of different lengths.
//!
//! The same code serves the drafter, the batched verifier (paper A eq. 7: all K drafts in one pass, shorter ones
//! padded) and distillation training: with `differentiable` set it uses only ops that candle can back-propagate.

use crate::error::{Result, RuntimeError};
use crate::kernels::{Attention, Past, SwiGlu};
use candle_core::quantized::QMatMul;
use candle_core::{CpuStorage, D, DType, Device, Module, Storage, Tensor};
use rayon::prelude::*;

/// How rotary embeddings pair the channels of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama2.c checkpoints and GGUF Llama files.
    Interleaved,
    /// First half with second half: Hugging Face Llama and Qwen2 checkpoints.
    Halves,
}

/// The shape and numerics of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Number of tokens in the vocabulary.
    pub vocab_size: usize,
    /// Model (residual) width.
    pub dim: usize,
    /// SwiGLU inner width.
    pub hidden_dim: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when below `n_heads`).
    pub n_kv_heads: usize,
    /// Longest sequence (prompt plus generated tokens) the position tables cover.
    pub max_seq_len: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE channel pairing.
    pub rope: RopeStyle,
    /// Whether q/k/v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Whether the output head shares the token embedding.
    pub tied_embeddings: bool,
}

impl Config {
    /// Checks that every size is positive and the heads divide evenly.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("dim", self.dim),
            ("hidden_dim", self.hidden_dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("max_seq_len", self.max_seq_len),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(RuntimeError::invalid(name, "must be positive"));
            }
        }
        if !self.dim.is_multiple_of(self.n_heads) {
            return Err(RuntimeError::invalid(
                "n_heads",
                format!("{} does not divide dim {}", self.n_heads, self.dim),
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(RuntimeError::invalid(
                "n_kv_heads",
                format!("{} does not divide n_heads {}", self.n_kv_heads, self.n_heads),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(RuntimeError::invalid(
                "dim",
                format!("head size {} is odd", self.head_dim()),
            ));
        }
        if !(self.rms_eps > 0.0 && self.rms_eps.is_finite()) {
            return Err(RuntimeError::invalid(
                "rms_eps",
                format!("{} is not positive", self.rms_eps),
            ));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(RuntimeError::invalid(
                "rope_theta",
                format!("{} is not positive", self.rope_theta),
            ));
        }
        Ok(())
    }

    /// Channels per head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.head_dim() * self.n_kv_heads
    }
}

/// A linear projection y = x Wᵀ (+ b), with dense or quantised weights.
#[derive(Debug, Clone)]
pub(crate) enum Proj {
    Dense(candle_nn::Linear),
    Quant { w: QMatMul, b: Option<Tensor> },
}

impl Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Proj::Dense(l) => l.forward(x)?,
            Proj::Quant { w, b } => {
                let y = w.forward(x)?;
                match b {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
        })
    }
}

/// Where a model's weights come from. Names follow the Hugging Face Llama layout (`model.layers.3.mlp.up_proj`);
/// each source maps them to its own file's names.
pub(crate) trait WeightSource {
    /// A dense f32 tensor `name.weight` of exactly `shape`.
    fn dense(&self, name: &str, shape: &[usize]) -> Result<Tensor>;
    /// A projection `name.weight` of shape (out, inp), with `name.bias` (out) when `bias`.
    fn proj(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Proj>;
    /// Whether `name.weight` exists.
    fn contains(&self, name: &str) -> bool;
}

/// Checks that a tensor read from a file has the expected shape.
pub(crate) fn check_shape(what: &str, t: &Tensor, shape: &[usize]) -> Result<()> {
    if t.dims() != shape {
        return Err(RuntimeError::format(
            what,
            format!("expected shape {:?}, found {:?}", shape, t.dims()),
        ));
    }
    Ok(())
}

#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Tensor,
    wq: Proj,
    wk: Proj,
    wv: Proj,
    wo: Proj,
    ffn_norm: Tensor,
    gate: Proj,
    up: Proj,
    down: Proj,
    /// The dense projections again, fused and transposed for the CPU fast path; `None` for quantised weights,
    /// off the CPU and while training.
    fused: Option<Fused>,
}

/// One layer's dense projections as (in, out) contiguous matrices, q|k|v side by side and gate|up side by side:
/// two products instead of five for them, and the matrix multiply reads the weights in the order it wants
/// instead of repacking a transposed (out, in) matrix on every call (20–30 % of a product's time at 72 rows).
#[derive(Debug, Clone)]
struct Fused {
    /// (dim, dim + 2·kv_dim).
    qkv: Tensor,
    /// (dim + 2·kv_dim), with `qkv_bias`.
    qkv_bias: Option<Tensor>,
    /// (dim, dim).
    o: Tensor,
    /// (dim, 2·hidden_dim).
    gate_up: Tensor,
    /// (hidden_dim, dim).
    down: Tensor,
}

impl Fused {
    /// `None` when any projection is quantised.
    fn of(layer: &Layer) -> Result<Option<Fused>> {
        let dense = |p: &Proj| match p {
            Proj::Dense(l) => Some(l.clone()),
            Proj::Quant { .. } => None,
        };
        let all = [
            &layer.wq,
            &layer.wk,
            &layer.wv,
            &layer.wo,
            &layer.gate,
            &layer.up,
            &layer.down,
        ];
        let Some(l) = all.into_iter().map(dense).collect::<Option<Vec<_>>>() else {
            return Ok(None);
        };
        let t = |w: &[&Tensor]| -> Result<Tensor> { Ok(Tensor::cat(w, 0)?.t()?.contiguous()?) };
        let qkv_bias = match (l[0].bias(), l[1].bias(), l[2].bias()) {
            (Some(bq), Some(bk), Some(bv)) => Some(Tensor::cat(&[bq, bk, bv], 0)?),
            _ => None,
        };
        Ok(Some(Fused {
            qkv: t(&[l[0].weight(), l[1].weight(), l[2].weight()])?,
            qkv_bias,
            o: t(&[l[3].weight()])?,
            gate_up: t(&[l[4].weight(), l[5].weight()])?,
            down: t(&[l[6].weight()])?,
        }))
    }
}

/// A loaded transformer. Cheap to clone (tensors are shared).
#[derive(Debug, Clone)]
pub struct Model {
    cfg: Config,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    head: Proj,
    /// The dense output head again, transposed (dim, vocab) and contiguous, for the CPU fast path (as `Fused`).
    head_t: Option<Tensor>,
    cos: Tensor,
    sin: Tensor,
    /// The same tables on the host, (max_seq_len, head_dim/2) row-major, for the CPU fast path.
    cos_host: Vec<f32>,
    sin_host: Vec<f32>,
    device: Device,
    differentiable: bool,
    cpu_fast: bool,
}

/// The keys and values one sequence has seen, per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    kv_dim: usize,
}

/// One layer of a [`KvCache`].
#[derive(Debug, Clone)]
enum LayerKv {
    /// Host vectors of keys and values, both position-major `(len, n_kv_heads, head_dim)`: appending copies only
    /// the new rows, truncating only shortens.
    Host { k: Vec<f32>, v: Vec<f32> },
    /// Device tensors `(n_kv_heads, len, head_dim)`, `None` while empty.
    Device(Option<(Tensor, Tensor)>),
}

/// A group's per-sequence logits and its cache updates per layer and sequence.
type GroupPass = (Vec<Tensor>, Vec<Vec<KvUpdate>>);

/// What one forward pass adds to one sequence's cache layer, committed only after the whole pass succeeds.
enum KvUpdate {
    /// Position-major rows to append to a host layer.
    Append(Vec<f32>, Vec<f32>),
    /// The extended device tensors that replace a device layer.
    Replace(Tensor, Tensor),
}

impl KvCache {
    /// Number of positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the cache lives in host vectors (see [`Model::set_cpu_fast_path`]).
    pub fn is_host(&self) -> bool {
        matches!(self.layers.first(), Some(LayerKv::Host { .. }))
    }

    /// Forgets every position from `len` on (after a rejection); `len` may not exceed the current length.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            return Err(RuntimeError::invalid(
                "len",
                format!("cannot truncate a cache of {} positions to {len}", self.len),
            ));
        }
        if len == self.len {
            return Ok(());
        }
        for entry in &mut self.layers {
            match entry {
                LayerKv::Host { k, v } => {
                    k.truncate(len * self.kv_dim);
                    v.truncate(len * self.kv_dim);
                }
                LayerKv::Device(slot) => {
                    if len == 0 {
                        *slot = None;
                    } else if let Some((k, v)) = slot {
                        *k = k.narrow(1, 0, len)?;
                        *v = v.narrow(1, 0, len)?;
                    }
                }
            }
        }
        self.len = len;
        Ok(())
    }
}

impl Model {
    /// Builds a model from a weight source; every tensor's shape is checked against `cfg`.
    pub(crate) fn from_source(cfg: Config, src: &dyn WeightSource, device: &Device) -> Result<Self> {
        cfg.validate()?;
        let (d, h, kv) = (cfg.dim, cfg.hidden_dim, cfg.kv_dim());
        let embed = src.dense("model.embed_tokens", &[cfg.vocab_size, d])?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = format!("model.layers.{i}");
            layers.push(Layer {
                attn_norm: src.dense(&format!("{p}.input_layernorm"), &[d])?,
                wq: src.proj(&format!("{p}.self_attn.q_proj"), d, d, cfg.qkv_bias)?,
                wk: src.proj(&format!("{p}.self_attn.k_proj"), kv, d, cfg.qkv_bias)?,
                wv: src.proj(&format!("{p}.self_attn.v_proj"), kv, d, cfg.qkv_bias)?,
                wo: src.proj(&format!("{p}.self_attn.o_proj"), d, d, false)?,
                ffn_norm: src.dense(&format!("{p}.post_attention_layernorm"), &[d])?,
                gate: src.proj(&format!("{p}.mlp.gate_proj"), h, d, false)?,
                up: src.proj(&format!("{p}.mlp.up_proj"), h, d, false)?,
                down: src.proj(&format!("{p}.mlp.down_proj"), d, h, false)?,
                fused: None,
            });
        }
        let norm = src.dense("model.norm", &[d])?;
        let head = if cfg.tied_embeddings || !src.contains("lm_head") {
            Proj::Dense(candle_nn::Linear::new(embed.clone(), None))
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
            head_t: None,
            cos,
            sin,
            cos_host,
            sin_host,
            device: device.clone(),
            differentiable: false,
            cpu_fast: device.is_cpu(),
        };
        model.rebuild_fused()?;
        Ok(model)
    }

    /// Builds (on the CPU, for inference) or drops (elsewhere, and while training) the fused projections and the
    /// transposed output head.
    fn rebuild_fused(&mut self) -> Result<()> {
        let want = self.device.is_cpu() && !self.differentiable;
        for layer in &mut self.layers {
            layer.fused = if want { Fused::of(layer)? } else { None };
        }
        self.head_t = match &self.head {
            Proj::Dense(l) if want => Some(l.weight().t()?.contiguous()?),
            _ => None,
        };
        Ok(())
    }

    /// Use only back-propagatable ops (for training); slower than the fused inference kernels. Switching on
    /// drops the fused copies of the projections (training updates the originals); switching off rebuilds them
    /// from the weights as they then are.
    pub fn set_differentiable(&mut self, on: bool) -> Result<()> {
        self.differentiable = on;
        self.rebuild_fused()
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
        }
    }

    /// Feeds `tokens` after what `cache` holds; returns logits (tokens.len(), vocab) for every new position and
    /// appends the new keys and values to the cache.
    pub fn forward(&self, cache: &mut KvCache, tokens: &[u32]) -> Result<Tensor> {
        let mut out = self.forward_batch(&mut [cache], &[tokens])?;
        Ok(out.remove(0))
    }

    /// One padded pass over many sequences (paper A eq. 7: all drafts verified together). Sequence b continues
    /// from its own cache with its own new tokens; shorter inputs are padded, and the mask lets every real query
    /// see exactly its own prefix. Returns per-sequence logits `(tokens[b].len(), vocab)` and extends every cache.
    pub fn forward_batch(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Vec<Tensor>> {
        in_worker(|| self.forward_batch_here(caches, tokens))
    }

    fn forward_batch_here(&self, caches: &mut [&mut KvCache], tokens: &[&[u32]]) -> Result<Vec<Tensor>> {
        if caches.len() != tokens.len() || tokens.is_empty() {
            return Err(RuntimeError::invalid(
                "tokens",
                format!("{} token lists for {} caches", tokens.len(), caches.len()),
            ));
        }
        let b = tokens.len();
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

    /// A copy of q|k|v rows (one row of d + 2·kv_dim per position, position `pos[row]`) with the query and key
    /// heads rotated the way [`Model::rope`] rotates tensors; the values are copied as they are. Hand-written
    /// because the rows are already on the host for the attention kernel: candle's rotary ops would need q and k
    /// cut out, transposed and copied into tensors of their own first.
    fn rope_rows(&self, src: &[f32], pos: &[u32]) -> Vec<f32> {
        let (hd, heads) = (self.cfg.head_dim(), self.cfg.n_heads + self.cfg.n_kv_heads);
        let half = hd / 2;
        let w = self.cfg.dim + 2 * self.cfg.kv_dim();
        let mut rows = Vec::with_capacity(src.len());
        for (row, &p) in src.chunks_exact(w).zip(pos) {
            // Copy a row and rotate it while it is in cache: one pass over the data.
            let start = rows.len();
            rows.extend_from_slice(row);
            let at = p as usize * half;
            let (cos, sin) = (&self.cos_host[at..at + half], &self.sin_host[at..at + half]);
            for head in rows[start..start + heads * hd].chunks_exact_mut(hd) {
                match self.cfg.rope {
                    RopeStyle::Interleaved => {
                        for ((pair, &c), &s) in head.chunks_exact_mut(2).zip(cos).zip(sin) {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * c - b * s;
                            pair[1] = a * s + b * c;
                        }
                    }
                    RopeStyle::Halves => {
                        let (x0, x1) = head.split_at_mut(half);
                        for (((a, b), &c), &s) in x0.iter_mut().zip(x1.iter_mut()).zip(cos).zip(sin) {
                            let (u, v) = (*a, *b);
                            *a = u * c - v * s;
                            *b = u * s + v * c;
                        }
                    }
                }
            }
        }
        rows
    }

    /// Rotates q or k (B, heads, T, head_dim) by per-token angles cos/sin (B, T, head_dim/2).
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let x = x.contiguous()?;
        if !self.differentiable {
            return Ok(match self.cfg.rope {
                RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(&x, cos, sin)?,
                RopeStyle::Halves => candle_nn::rotary_emb::rope(&x, cos, sin)?,
            });
        }
        let (b, h, t, hd) = x.dims4()?;
        let cos = cos.unsqueeze(1)?;
        let sin = sin.unsqueeze(1)?;
        let (x0, x1) = match self.cfg.rope {
            RopeStyle::Interleaved => {
                let x = x.reshape((b, h, t, hd / 2, 2))?;
                (x.narrow(4, 0, 1)?.squeeze(4)?, x.narrow(4, 1, 1)?.squeeze(4)?)
            }
            RopeStyle::Halves => (x.narrow(3, 0, hd / 2)?, x.narrow(3, hd / 2, hd / 2)?),
        };
        let r0 = (x0.broadcast_mul(&cos)? - x1.broadcast_mul(&sin)?)?;
        let r1 = (x0.broadcast_mul(&sin)? + x1.broadcast_mul(&cos)?)?;
        Ok(match self.cfg.rope {
            RopeStyle::Interleaved => Tensor::stack(&[&r0, &r1], 4)?.reshape((b, h, t, hd))?,
            RopeStyle::Halves => Tensor::cat(&[&r0, &r1], 3)?,
        })
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
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
        let scale = 1.0 / (hd as f64).sqrt();
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
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, cfg.dim))?;
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
        let mut new_caches = Vec::with_capacity(self.layers.len());
        let (d, kvd) = (cfg.dim, cfg.kv_dim());
        let m = b * t;
        for (li, layer) in self.layers.iter().enumerate() {
            let hn = self.rms(&x, &layer.attn_norm)?;
            let fw = if fused { layer.fused.as_ref() } else { None };
            let qkv = match fw {
                Some(f) => {
                    let qkv = hn.reshape((m, d))?.matmul(&f.qkv)?;
                    Some(match &f.qkv_bias {
                        Some(bias) => qkv.broadcast_add(bias)?,
                        None => qkv,
                    })
                }
                None => None,
            };
            let y = match &tables {
                None => {
                    // Rows q|k|v of every position, copied to the host once and rotated on the way, then read
                    // by the kernel where they lie; the new keys and values go to the caches from the same rows.
                    let qkv = match qkv {
                        Some(qkv) => qkv,
                        None => Tensor::cat(
                            &[
                                &layer.wq.forward(&hn)?,
                                &layer.wk.forward(&hn)?,
                                &layer.wv.forward(&hn)?,
                            ],
                            D::Minus1,
                        )?
                        .reshape((m, d + 2 * kvd))?,
                    };
                    // Read in place when the rows already sit in host memory (a CPU model), else fetched first.
                    let host = {
                        let (storage, layout) = qkv.storage_and_layout();
                        match (&*storage, layout.contiguous_offsets()) {
                            (Storage::Cpu(CpuStorage::F32(data)), Some((a, z))) => {
                                Some(self.rope_rows(&data[a..z], pos))
                            }
                            _ => None,
                        }
                    };
                    let rows = match host {
                        Some(rows) => rows,
                        None => self.rope_rows(&qkv.flatten_all()?.to_vec1::<f32>()?, pos),
                    };
                    let past: Vec<Past> = match &caches {
                        Some((caches, _)) => caches
                            .iter()
                            .map(|c| match &c.layers[li] {
                                LayerKv::Host { k, v } => Past { k, len: c.len, v },
                                LayerKv::Device(_) => Past::EMPTY,
                            })
                            .collect(),
                        None => (0..b).map(|_| Past::EMPTY).collect(),
                    };
                    let y = Attention {
                        qkv: &rows,
                        past,
                        visible,
                        queries: t,
                        n_heads: nh,
                        n_kv_heads: nkv,
                        head_dim: hd,
                        scale: scale as f32,
                    }
                    .run();
                    if let Some((_, lens)) = &caches {
                        new_caches.push(host_rows(&rows, lens, t, d, kvd));
                    }
                    Tensor::from_vec(y, (b, t, cfg.dim), &self.device)?
                }
                Some((cos, sin)) => {
                    let (q, k, v) = match &qkv {
                        Some(qkv) => (
                            qkv.narrow(1, 0, d)?,
                            qkv.narrow(1, d, kvd)?,
                            qkv.narrow(1, d + kvd, kvd)?,
                        ),
                        None => (
                            layer.wq.forward(&hn)?,
                            layer.wk.forward(&hn)?,
                            layer.wv.forward(&hn)?,
                        ),
                    };
                    let q = self.rope(&q.reshape((b, t, nh, hd))?.transpose(1, 2)?, cos, sin)?;
                    let k = self.rope(&k.reshape((b, t, nkv, hd))?.transpose(1, 2)?, cos, sin)?;
                    let v = v.reshape((b, t, nkv, hd))?.transpose(1, 2)?.contiguous()?;
                    // Keys transposed (B, nkv, hd, S) and values (B, nkv, S, hd), both contiguous.
                    let (k_t, v_all) = match &caches {
                        None => (k.t()?.contiguous()?, v),
                        Some((caches, lens)) => {
                            let (k_t, v_all, updates) = self.device_keys(&k, &v, caches, lens, li, s_len)?;
                            new_caches.push(updates);
                            (k_t, v_all)
                        }
                    };
                    // Query heads g·rep .. g·rep + rep − 1 all read kv head g: grouping them as rep·t rows of kv
                    // head g makes one product per kv head, with no repeated copy of the keys and values. The
                    // 1/√d scale is applied to the queries, a tensor s_len/hd times smaller than the scores.
                    let rep = nh / nkv;
                    let att = (q * scale)?.reshape((b, nkv, rep * t, hd))?.matmul(&k_t)?;
                    let att = match &mask {
                        Some(m) => att
                            .reshape((b, nkv, rep, t, s_len))?
                            .broadcast_add(&m.unsqueeze(2)?)?
                            .reshape((b, nkv, rep * t, s_len))?,
                        None => att,
                    };
                    let att = if self.differentiable {
                        candle_nn::ops::softmax(&att, D::Minus1)?
                    } else {
                        candle_nn::ops::softmax_last_dim(&att)?
                    };
                    att.matmul(&v_all)?
                        .reshape((b, nh, t, hd))?
                        .transpose(1, 2)?
                        .reshape((b, t, cfg.dim))?
                }
            };
            x = match fw {
                Some(f) => (x + y.reshape((m, d))?.matmul(&f.o)?.reshape((b, t, d))?)?,
                None => (x + layer.wo.forward(&y)?)?,
            };
            let hn = self.rms(&x, &layer.ffn_norm)?;
            x = match fw {
                Some(f) => {
                    let ff = hn
                        .reshape((m, d))?
                        .matmul(&f.gate_up)?
                        .apply_op1_no_bwd(&SwiGlu)?;
                    (x + ff.matmul(&f.down)?.reshape((b, t, d))?)?
                }
                None => {
                    let (g, u) = (layer.gate.forward(&hn)?, layer.up.forward(&hn)?);
                    let ff = if fused {
                        Tensor::cat(&[&g, &u], D::Minus1)?.apply_op1_no_bwd(&SwiGlu)?
                    } else {
                        (g.silu()? * u)?
                    };
                    (x + layer.down.forward(&ff)?)?
                }
            };
        }
        let x = self.rms(&x, &self.norm)?;
        let logits = match &self.head_t {
            Some(w) if fused => x.reshape((m, d))?.matmul(w)?.reshape((b, t, cfg.vocab_size))?,
            _ => self.head.forward(&x)?,
        };
        Ok((logits, new_caches))
    }

    /// The padded keys and values of layer `li` for device caches, with tensor ops (per sequence: concatenate,
    /// pad, then stack): sequence i's keys are [its cache | its new tokens | zeros up to `s_len`]. `k` and `v` are
    /// the new keys and values (B, nkv, T, hd), contiguous. Returns K transposed (B, nkv, hd, S), V (B, nkv, S, hd)
    /// and the extended caches.
    fn device_keys(
        &self,
        k: &Tensor,
        v: &Tensor,
        caches: &[&mut KvCache],
        lens: &[usize],
        li: usize,
        s_len: usize,
    ) -> Result<(Tensor, Tensor, Vec<KvUpdate>)> {
        let (b, nkv, _, hd) = k.dims4()?;
        let mut ks = Vec::with_capacity(b);
        let mut vs = Vec::with_capacity(b);
        let mut updates = Vec::with_capacity(b);
        for (i, cache) in caches.iter().enumerate() {
            let k_new = k.get(i)?.narrow(1, 0, lens[i])?;
            let v_new = v.get(i)?.narrow(1, 0, lens[i])?;
            let (kc, vc) = match &cache.layers[li] {
                LayerKv::Device(Some((kc, vc))) => {
                    (Tensor::cat(&[kc, &k_new], 1)?, Tensor::cat(&[vc, &v_new], 1)?)
                }
                _ => (k_new.contiguous()?, v_new.contiguous()?),
            };
            let pad = s_len - cache.len - lens[i];
            if pad > 0 {
                let z = Tensor::zeros((nkv, pad, hd), DType::F32, &self.device)?;
                ks.push(Tensor::cat(&[&kc, &z], 1)?);
                vs.push(Tensor::cat(&[&vc, &z], 1)?);
            } else {
                ks.push(kc.clone());
                vs.push(vc.clone());
            }
            updates.push(KvUpdate::Replace(kc, vc));
        }
        let (k_all, v_all) = if b == 1 {
            (ks[0].unsqueeze(0)?, vs[0].unsqueeze(0)?)
        } else {
            (Tensor::stack(&ks, 0)?, Tensor::stack(&vs, 0)?)
        };
        Ok((k_all.t()?.contiguous()?, v_all.contiguous()?, updates))
    }
}

/// The new rows each sequence appends to a host cache layer, position-major, cut from the rotated q|k|v rows
/// (B·T rows of d + 2·kv_dim: queries, keys, values); sequence i keeps its first `lens[i]` positions.
fn host_rows(rows: &[f32], lens: &[usize], t: usize, d: usize, kvd: usize) -> Vec<KvUpdate> {
    let w = d + 2 * kvd;
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut nk = Vec::with_capacity(n * kvd);
            let mut nv = Vec::with_capacity(n * kvd);
            for row in rows[i * t * w..].chunks_exact(w).take(n) {
                nk.extend_from_slice(&row[d..d + kvd]);
                nv.extend_from_slice(&row[d + kvd..]);
            }
            KvUpdate::Append(nk, nv)
        })
        .collect()
}

/// Runs `f` on a worker of rayon's global pool. candle's CPU kernels split rows with rayon; called from a thread
/// outside the pool, each of the ~25 ops per layer would hand its work to a pool thread and sleep until woken
/// (a futex round trip per op, a fifth of a small model's forward time); inside the pool they run in place.
fn in_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// cos/sin of position·θ^(−2i/head_dim) for every position and pair index i, (max_seq_len, head_dim/2) row-major.
fn rope_tables(cfg: &Config) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim() / 2;
    let mut cos = Vec::with_capacity(cfg.max_seq_len * half);
    let mut sin = Vec::with_capacity(cfg.max_seq_len * half);
    for p in 0..cfg.max_seq_len {
        for i in 0..half {
            let freq = cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64);
            let a = p as f64 * freq;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

/// A weight source over named dense tensors (safetensors files, llama2.c checkpoints, trained variables).
pub(crate) struct TensorMap {
    pub(crate) what: String,
    pub(crate) tensors: std::collections::HashMap<String, Tensor>,
    pub(crate) device: Device,
}

impl TensorMap {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| RuntimeError::format(&self.what, format!("tensor {name} is missing")))?;
        check_shape(&format!("{}: {name}", self.what), t, shape)?;
        Ok(t.to_dtype(DType::F32)?.to_device(&self.device)?)
    }
}

impl WeightSource for TensorMap {
    fn dense(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        self.get(&format!("{name}.weight"), shape)
    }

    fn proj(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Proj> {
        let w = self.get(&format!("{name}.weight"), &[out, inp])?;
        let b = if bias {
            Some(self.get(&format!("{name}.bias"), &[out])?)
        } else {
            None
        };
        Ok(Proj::Dense(candle_nn::Linear::new(w, b)))
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(&format!("{name}.weight"))
    }
}

/// Builds a model from named tensors in the Hugging Face Llama layout.
pub fn model_from_tensors(
    cfg: Config,
    tensors: std::collections::HashMap<String, Tensor>,
    device: &Device,
) -> Result<Model> {
    let map = TensorMap {
        what: "tensors".into(),
        tensors,
        device: device.clone(),
    };
    Model::from_source(cfg, &map, device)
}

/// The names and shapes of every tensor a model of `cfg` needs, in the Hugging Face Llama layout.
pub fn tensor_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, h, kv, v) = (cfg.dim, cfg.hidden_dim, cfg.kv_dim(), cfg.vocab_size);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, d])];
    for i in 0..cfg.n_layers {
        let p = format!("model.layers.{i}");
        out.push((format!("{p}.input_layernorm.weight"), vec![d]));
        for (n, o) in [("q_proj", d), ("k_proj", kv), ("v_proj", kv)] {
            out.push((format!("{p}.self_attn.{n}.weight"), vec![o, d]));
            if cfg.qkv_bias {
                out.push((format!("{p}.self_attn.{n}.bias"), vec![o]));
            }
        }
        out.push((format!("{p}.self_attn.o_proj.weight"), vec![d, d]));
        out.push((format!("{p}.post_attention_layernorm.weight"), vec![d]));
        out.push((format!("{p}.mlp.gate_proj.weight"), vec![h, d]));
        out.push((format!("{p}.mlp.up_proj.weight"), vec![h, d]));
        out.push((format!("{p}.mlp.down_proj.weight"), vec![d, h]));
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !cfg.tied_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, d]));
    }
    out
}

/// Random weights for tests and for initialising training: N(0, std²) matrices, norms at 1, biases small.
pub fn random_tensors(
    cfg: &Config,
    std: f64,
    seed: u64,
    device: &Device,
) -> Result<std::collections::HashMap<String, Tensor>> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut out = std::collections::HashMap::new();
    for (name, shape) in tensor_shapes(cfg) {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            (0..n).map(|_| 1.0 + 0.1 * (rng.random::<f32>() - 0.5)).collect()
        } else {
            // Sum of uniforms: a cheap near-normal with the requested spread.
            (0..n)
                .map(|_| {
                    let u: f64 = (0..3).map(|_| rng.random::<f64>() - 0.5).sum();
                    (u * 2.0 * std) as f32
                })
                .collect()
        };
        out.insert(name, Tensor::from_vec(data, shape, device)?);
    }
    Ok(out)
}
