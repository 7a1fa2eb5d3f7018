//! The quantised host route: a GGUF model's whole forward pass on the CPU over its own weight blocks, for any
//! batch of ragged sequences, with no candle op.
//!
//! Why: through candle a quantised step is ~25 tensor ops per layer, each allocating its output, and candle's
//! quantised products have no vector kernel for some formats (Q4_1) and run on one thread (docs/runtime.md,
//! "Routes"). Here every matrix is a [`QMatrix`] in the file's block format (q|k|v and gate|up stacked when their
//! formats agree), the products are `QMatrix::matmul` over all rows of the pass at once (a verification of
//! 8 devices × 5 tokens is one 40-row product per matrix, each weight block read once), attention is the host
//! kernel of `kernels.rs` over the host KV caches, and the output head stays quantised (SmolLM2's tied Q8_0
//! `token_embd` is never expanded to f32). Embedding rows are dequantised per looked-up token.
//!
//! The working buffers live in the model (one set, taken for the pass; a concurrent pass of a clone gets its
//! own), so steps after the first allocate nothing but the logits they hand back.

use super::cache::LayerKv;
use super::weights::{HostRows, with_values};
use super::{KvCache, Model};
use crate::error::Result;
use crate::kernels::{PanelAttention, PanelScratch, Partial, RmsNormRows, SwiGluRows};
use crate::quant::QMatrix;
use candle_core::Tensor;
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// From how much attention work (new positions × keys they attend to, over the pass's sequences) the chunks of
/// the attention are spread over the pool rather than run on the pass's own thread: a decoding step from 256 keys
/// on, or a verification of two positions from 128.
const ATT_PAR_WORK: usize = 256;

/// One product of a layer: a matrix whose output columns land at `offset` of each output row.
#[derive(Debug)]
struct Part {
    m: Arc<QMatrix>,
    offset: usize,
}

/// A layer's stacked projection (q|k|v or gate|up): one matrix when the file's formats agree (and the loader
/// stacked them), otherwise one per run of equal formats, their outputs side by side.
#[derive(Debug)]
struct Stacked {
    parts: Vec<Part>,
    /// Output width (the sum of the parts' rows).
    width: usize,
}

impl Stacked {
    /// The projections `ps` side by side: consecutive rows of one shared matrix that together cover it become
    /// one product; anything else becomes a product of its own.
    fn of(what: &str, ps: &[&HostRows]) -> Result<Stacked> {
        let mut parts: Vec<Part> = Vec::new();
        let mut offset = 0;
        let mut i = 0;
        while i < ps.len() {
            // The longest run from i of consecutive rows of one matrix starting at its first row.
            let mut j = i;
            let mut next = ps[i].first;
            while j < ps.len() && Arc::ptr_eq(&ps[j].m, &ps[i].m) && ps[j].first == next {
                next += ps[j].rows;
                j += 1;
            }
            let m = if ps[i].first == 0 && next == ps[i].m.rows() {
                ps[i].m.clone()
            } else {
                j = i + 1;
                ps[i].matrix(what)?
            };
            let rows = m.rows();
            parts.push(Part { m, offset });
            offset += rows;
            i = j;
        }
        Ok(Stacked { parts, width: offset })
    }

    /// y (n × width) = x (n × cols) · Wᵀ; `tmp` holds a part's output when there are several.
    fn matmul(&self, x: &[f32], n: usize, y: &mut Vec<f32>, tmp: &mut Vec<f32>) {
        resize(y, n * self.width);
        if let [one] = self.parts.as_slice() {
            one.m.matmul(x, n, y);
            return;
        }
        for p in &self.parts {
            let r = p.m.rows();
            resize(tmp, n * r);
            p.m.matmul(x, n, tmp);
            for (dst, src) in y.chunks_exact_mut(self.width).zip(tmp.chunks_exact(r)) {
                dst[p.offset..p.offset + r].copy_from_slice(src);
            }
        }
    }
}

/// One layer's host weights.
#[derive(Debug)]
struct QLayer {
    attn_norm: Vec<f32>,
    /// q|k|v: (dim + 2·kv_dim) outputs.
    qkv: Stacked,
    qkv_bias: Option<Vec<f32>>,
    o: Arc<QMatrix>,
    ffn_norm: Vec<f32>,
    /// gate|up: 2·hidden_dim outputs.
    gate_up: Stacked,
    down: Arc<QMatrix>,
}

/// A quantised model's weights for the host route, and the pass's working buffers.
#[derive(Debug)]
pub(crate) struct QHostWeights {
    /// (vocab, dim): rows dequantised per looked-up token.
    embed: Arc<QMatrix>,
    layers: Vec<Arc<QLayer>>,
    norm: Vec<f32>,
    /// (vocab, dim), in the file's format.
    head: Arc<QMatrix>,
    buffers: Mutex<QBuffers>,
}

/// The working buffers of one pass over N rows (all sequences' new positions, one after the other).
#[derive(Debug, Default)]
struct QBuffers {
    /// Residual stream (N, dim).
    x: Vec<f32>,
    /// Normed residual (N, dim).
    xb: Vec<f32>,
    /// q|k|v rows (N, dim + 2·kv_dim).
    qkv: Vec<f32>,
    /// Attention output (N, dim).
    att: Vec<f32>,
    /// A product's output before it is added to the residual, or one part of a stacked product.
    tmp: Vec<f32>,
    /// gate|up rows (N, 2·hidden_dim).
    gate_up: Vec<f32>,
    /// SwiGLU product (N, hidden_dim).
    hidden: Vec<f32>,
    /// Logits (N, vocab).
    logits: Vec<f32>,
    /// Keys visible to each row's query.
    visible: Vec<usize>,
    /// The attention's tasks (sequence, kv head, chunk of keys), their partial results, and the merged rows of
    /// one kv head (T, rep, head_dim) before they are spread over `att`.
    /// (sequence, kv head, first and end row group, chunk of keys).
    items: Vec<(usize, usize, usize, usize, usize)>,
    parts: Vec<Partial>,
    block: Vec<f32>,
    /// Scratch of the attention's tasks when they run on the pass's own thread.
    panel: PanelScratch,
}

/// Sets a buffer's length for an output that will be written whole, keeping its capacity (no allocation once it
/// has grown, and no zeroing of what is overwritten anyway).
fn resize(v: &mut Vec<f32>, n: usize) {
    v.truncate(n);
    v.resize(n, 0.0);
}

impl QHostWeights {
    /// The host weights of a model whose embedding and projections are all host matrices (a GGUF file on the
    /// CPU in formats the kernels read); `None` otherwise.
    pub(super) fn of(model: &Model) -> Result<Option<QHostWeights>> {
        let super::weights::Embedding::Host(embed) = &model.embed else {
            return Ok(None);
        };
        let Some(head) = model.head.host() else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        for (li, layer) in model.layers.iter().enumerate() {
            let what = format!("layer {li}");
            let ps: Option<Vec<&HostRows>> = [
                &layer.wq,
                &layer.wk,
                &layer.wv,
                &layer.wo,
                &layer.gate,
                &layer.up,
                &layer.down,
            ]
            .into_iter()
            .map(|p| p.host())
            .collect();
            let Some(ps) = ps else {
                return Ok(None);
            };
            let biases: Vec<Option<&Tensor>> = [&layer.wq, &layer.wk, &layer.wv]
                .into_iter()
                .map(|p| p.bias())
                .collect();
            let qkv_bias = match biases.as_slice() {
                [Some(bq), Some(bk), Some(bv)] => {
                    let mut b = with_values(bq, <[f32]>::to_vec)?;
                    b.extend(with_values(bk, <[f32]>::to_vec)?);
                    b.extend(with_values(bv, <[f32]>::to_vec)?);
                    Some(b)
                }
                _ => None,
            };
            layers.push(Arc::new(QLayer {
                attn_norm: with_values(&layer.attn_norm, <[f32]>::to_vec)?,
                qkv: Stacked::of(&what, &ps[0..3])?,
                qkv_bias,
                o: ps[3].matrix(&what)?,
                ffn_norm: with_values(&layer.ffn_norm, <[f32]>::to_vec)?,
                gate_up: Stacked::of(&what, &ps[4..6])?,
                down: ps[6].matrix(&what)?,
            }));
        }
        Ok(Some(QHostWeights {
            embed: embed.clone(),
            layers,
            norm: with_values(&model.norm, <[f32]>::to_vec)?,
            head: head.matrix("output head")?,
            buffers: Mutex::new(QBuffers::default()),
        }))
    }

    /// The same weights with only the first `n` layers (a self-speculation drafter), with buffers of its own.
    pub(super) fn first_layers(&self, n: usize) -> QHostWeights {
        QHostWeights {
            embed: self.embed.clone(),
            layers: self.layers[..n.min(self.layers.len())].to_vec(),
            norm: self.norm.clone(),
            head: self.head.clone(),
            buffers: Mutex::new(QBuffers::default()),
        }
    }
}

impl Model {
    /// Whether a pass over `caches` takes the quantised host route.
    pub(super) fn qhost_for(&self, caches: &[&KvCache]) -> bool {
        self.qhost.is_some()
            && self.host_on
            && self.cpu_fast
            && !self.differentiable
            && caches.iter().all(|c| c.is_host())
    }

    /// One validated batch through the quantised host route: calls `out` with every sequence's logits
    /// (tokens[b].len() × vocab, row-major) and extends every cache. The caller has checked the tokens, the
    /// caches' shapes and lengths ([`Model::check_inputs`]); nothing after that check can fail, so the caches are
    /// extended layer by layer as the pass goes.
    pub(super) fn forward_qhost(
        &self,
        caches: &mut [&mut KvCache],
        tokens: &[&[u32]],
        out: &mut dyn FnMut(usize, &[f32]),
    ) {
        let Some(hw) = self.qhost.as_deref() else {
            return;
        };
        // A clone of this model running a pass on another thread holds the buffers: this pass gets its own.
        let mut fresh = None;
        let mut guard = hw.buffers.try_lock().ok();
        let buf: &mut QBuffers = match guard.as_deref_mut() {
            Some(b) => b,
            None => fresh.get_or_insert_with(QBuffers::default),
        };
        // On a worker of the pool: the products' parallel loops then start without a hand-off per product.
        super::in_worker(|| with_helpers_awake(|| self.qhost_pass(hw, buf, caches, tokens)));
        let vocab = self.cfg.vocab_size;
        let mut row = 0;
        for (b, s) in tokens.iter().enumerate() {
            out(b, &buf.logits[row * vocab..(row + s.len()) * vocab]);
            row += s.len();
        }
    }

    fn qhost_pass(
        &self,
        hw: &QHostWeights,
        buf: &mut QBuffers,
        caches: &mut [&mut KvCache],
        tokens: &[&[u32]],
    ) {
        let cfg = &self.cfg;
        let (d, kvd, h, vocab) = (cfg.dim, cfg.kv_dim(), cfg.hidden_dim, cfg.vocab_size);
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
        let w = d + 2 * kvd;
        let eps = cfg.rms_eps as f32;
        let n: usize = tokens.iter().map(|s| s.len()).sum();
        let arch = pulp::Arch::new();
        let scale = 1.0 / (hd as f32).sqrt();

        // Embedding rows, dequantised per token.
        resize(&mut buf.x, n * d);
        for (row, &tok) in buf
            .x
            .chunks_exact_mut(d)
            .zip(tokens.iter().flat_map(|s| s.iter()))
        {
            hw.embed.dequantize_row(tok as usize, row);
        }
        // Positions and visibility: row j of sequence i sits at past_i + j and sees past_i + j + 1 keys.
        buf.visible.clear();
        for (c, s) in caches.iter().zip(tokens) {
            buf.visible.extend((0..s.len()).map(|j| c.len + j + 1));
        }
        let starts: Vec<usize> = tokens
            .iter()
            .scan(0, |at, s| {
                let first = *at;
                *at += s.len();
                Some(first)
            })
            .collect();

        for (li, layer) in hw.layers.iter().enumerate() {
            rms_norm(&buf.x, &layer.attn_norm, eps, &mut buf.xb);
            layer.qkv.matmul(&buf.xb, n, &mut buf.qkv, &mut buf.tmp);
            if let Some(bias) = &layer.qkv_bias {
                for row in buf.qkv.chunks_exact_mut(w) {
                    for (y, b) in row.iter_mut().zip(bias) {
                        *y += b;
                    }
                }
            }
            for (row, &vis) in buf.qkv.chunks_exact_mut(w).zip(&buf.visible) {
                self.rotate_row(row, vis - 1);
            }
            // Each cache's panels for this layer: what the cache holds, then the pass's new keys and values.
            for (i, c) in caches.iter_mut().enumerate() {
                let KvCache {
                    layers, host, len, ..
                } = &mut **c;
                let LayerKv::Host { k, v } = &layers[li] else {
                    continue;
                };
                if host.panels.len() <= li {
                    host.panels.resize_with(li + 1, Default::default);
                }
                let panels = &mut host.panels[li];
                panels.truncate(*len);
                let done = panels.len();
                let cached = done * kvd..*len * kvd;
                panels.extend((&k[cached.clone()], kvd, 0), (&v[cached], kvd, 0), nkv, hd);
                let (first, t) = (starts[i], tokens[i].len());
                let rows = &buf.qkv[first * w..(first + t) * w];
                panels.extend((rows, w, d), (rows, w, d + kvd), nkv, hd);
            }
            // Attention: every (sequence, kv head, run of row groups, chunk of keys) is one task over its own cache
            // (`PanelAttention::head_chunk`), then each run's chunks are merged in order into the sequence's rows.
            {
                let qkv = &buf.qkv;
                let visible = &buf.visible;
                let rep = nh / nkv;
                let atts: Vec<Option<PanelAttention<'_>>> = caches
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        if !matches!(c.layers[li], LayerKv::Host { .. }) {
                            return None;
                        }
                        let (first, t) = (starts[i], tokens[i].len());
                        Some(PanelAttention {
                            rows: &qkv[first * w..(first + t) * w],
                            stride: w,
                            kv: &c.host.panels[li],
                            visible: &visible[first..first + t],
                            n_heads: nh,
                            n_kv_heads: nkv,
                            head_dim: hd,
                            scale,
                        })
                    })
                    .collect();
                let work: usize = atts.iter().flatten().map(|a| a.visible.len() * a.kv.len()).sum();
                let spread = rayon::current_num_threads() > 1 && work >= ATT_PAR_WORK;
                // Spread over the pool, every group of rows is an item of its own (a pass of five positions has
                // three kv heads' worth of work, which two threads share unevenly in three items); on one thread
                // a head's groups go in one item. The same operations per row either way.
                buf.items.clear();
                for (i, att) in atts.iter().enumerate() {
                    if let Some(att) = att {
                        let (chunks, groups) = (att.chunks(), att.groups());
                        let per = if spread { 1 } else { groups.max(1) };
                        for g in 0..nkv {
                            for k0 in (0..groups).step_by(per) {
                                let k1 = (k0 + per).min(groups);
                                buf.items.extend((0..chunks).map(|c| (i, g, k0, k1, c)));
                            }
                        }
                    }
                }
                if buf.parts.len() < buf.items.len() {
                    buf.parts.resize_with(buf.items.len(), Default::default);
                }
                let items = &buf.items;
                let parts = &mut buf.parts[..items.len()];
                let task = |&(i, g, k0, k1, c): &(usize, usize, usize, usize, usize),
                            p: &mut Partial,
                            s: &mut PanelScratch| {
                    if let Some(att) = &atts[i] {
                        att.head_chunk(g, c, k0..k1, p, s);
                    }
                };
                if spread && items.len() > 1 {
                    parts
                        .par_iter_mut()
                        .zip(items.par_iter())
                        .for_each_init(PanelScratch::default, |s, (p, it)| task(it, p, s));
                } else {
                    for (p, it) in parts.iter_mut().zip(items) {
                        task(it, p, &mut buf.panel);
                    }
                }
                // Merge each run of a head's rows over its chunks (consecutive items) and spread those rows (of
                // the head's (T, rep, head_dim)) over the pass's attention output (N, n_heads, head_dim).
                resize(&mut buf.att, n * d);
                let mut at = 0;
                while at < items.len() {
                    let (i, g, k0, k1, _) = items[at];
                    let end = at
                        + items[at..]
                            .iter()
                            .take_while(|&&(j, h, l0, l1, _)| (j, h, l0, l1) == (i, g, k0, k1))
                            .count();
                    let att = atts[i].as_ref().expect("items only for host layers");
                    let first = starts[i];
                    let rows = att.group_rows(k0..k1);
                    resize(&mut buf.block, rows.len() * hd);
                    att.merge(&parts[at..end], &mut buf.block);
                    for (row, o) in rows.zip(buf.block.chunks_exact(hd)) {
                        let (j, r) = (row / rep, row % rep);
                        let to = ((first + j) * nh + g * rep + r) * hd;
                        buf.att[to..to + hd].copy_from_slice(o);
                    }
                    at = end;
                }
            }
            // The new keys and values go to the caches (nothing below can fail).
            for (i, c) in caches.iter_mut().enumerate() {
                let LayerKv::Host { k, v } = &mut c.layers[li] else {
                    continue;
                };
                let (first, t) = (starts[i], tokens[i].len());
                for row in buf.qkv[first * w..(first + t) * w].chunks_exact(w) {
                    k.extend_from_slice(&row[d..d + kvd]);
                    v.extend_from_slice(&row[d + kvd..]);
                }
            }
            resize(&mut buf.tmp, n * d);
            layer.o.matmul(&buf.att, n, &mut buf.tmp);
            add(&mut buf.x, &buf.tmp);
            rms_norm(&buf.x, &layer.ffn_norm, eps, &mut buf.xb);
            layer.gate_up.matmul(&buf.xb, n, &mut buf.gate_up, &mut buf.tmp);
            resize(&mut buf.hidden, n * h);
            arch.dispatch(SwiGluRows {
                out: &mut buf.hidden,
                gate_up: &buf.gate_up,
                hidden: h,
            });
            resize(&mut buf.tmp, n * d);
            layer.down.matmul(&buf.hidden, n, &mut buf.tmp);
            add(&mut buf.x, &buf.tmp);
        }
        rms_norm(&buf.x, &hw.norm, eps, &mut buf.xb);
        resize(&mut buf.logits, n * vocab);
        hw.head.matmul(&buf.xb, n, &mut buf.logits);
        for (c, s) in caches.iter_mut().zip(tokens) {
            c.len += s.len();
        }
    }
}

/// Runs `f` (on a worker of the pool) while every other worker of the pool polls for work instead of sleeping.
///
/// A pass hands each of its ~120 products to the pool; a worker that finds nothing to do goes to sleep within
/// tens of microseconds, and waking it again (a futex and, in a virtual machine, an interrupt to another virtual
/// CPU) took longer than a layer's product: on the 2-core VM of docs/runtime.md the second thread then joined most
/// products late or not at all. Here the other workers each run a task that takes any pending job of the pool
/// (`rayon::yield_now`) until `f` returns, so a product's second half starts within a poll. They spin only for the
/// length of the pass, and the flag that ends them is set when `f` returns or unwinds.
///
/// Between polls that find nothing a poller gives its core away (`sched_yield`): when another program holds one of
/// the cores, a poller and the pass's own thread can share the other, and a poller that only spun would take
/// half of it from the thread doing the work (SmolLM2 Q4_1, 2 threads, a compile on the other core: 1.30× the
/// tokens/s of spinning; on a quiet machine 1.02× [0.93–1.09], docs/runtime.md).
///
/// One pass at a time gets pollers (`POLLING`); a pass that starts while another has them runs as before. With two
/// polled passes at once, each pass's thread could, while it waits for a stolen product, pick up the other's poller
/// and stay under it while that poller waits for the other pass, which is buried the same way: a deadlock. With one,
/// a poller waits only for its own pass, and everything stacked above that pass's frame is a job that finishes.
/// The pollers are spawned before `f` pushes any job, so a thief takes them first (rayon steals the oldest job).
fn with_helpers_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use std::sync::atomic::{AtomicBool, Ordering};
    static POLLING: AtomicBool = AtomicBool::new(false);
    struct SetOnDrop<'a>(&'a AtomicBool, bool);
    impl Drop for SetOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(self.1, Ordering::Release);
        }
    }
    let others = rayon::current_num_threads().saturating_sub(1);
    if others == 0
        || POLLING
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return f();
    }
    let _release = SetOnDrop(&POLLING, false);
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        for _ in 0..others {
            s.spawn(|_| {
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        let _set = SetOnDrop(&done, true);
        f()
    })
}

/// x += y, element by element.
fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// out = x / √(mean(x²) + eps) · w, row by row (rows of w.len()): [`RmsNormRows`].
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    pulp::Arch::new().dispatch(RmsNormRows { x, w, eps, out });
}
