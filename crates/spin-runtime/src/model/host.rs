//! The host path: one sequence and a few new positions through a small dense model, in plain loops over host
//! copies of the weights, with buffers kept in the sequence's cache, on the calling thread.
//!
//! Why: a stories260K step is about 260k multiply-adds, a few microseconds of arithmetic, but through candle
//! it is ~60 tensor ops, each allocating its output and crossing into rayon's pool; per-op dispatch, not
//! arithmetic, set the step's cost (docs/runtime.md, "Host path"). Here a step allocates nothing once the
//! buffers have grown, and no thread is woken. The loops are compiled for the best instruction set at run time
//! through `pulp` (as in `kernels.rs`); the attention is the same kernel as the batched CPU path, run serially.
//!
//! The host path serves only models whose weights fit the bound below, single sequences and inputs of at most
//! [`HOST_MAX_TOKENS`] positions; everything else (batches, prompts, large models whose products want every
//! core) takes the candle route. Tests compare both to 1e-5.

use super::cache::LayerKv;
use super::weights::{transpose_cat_panels, with_values};
use super::{KvCache, Model};
use crate::error::Result;
use crate::kernels::{Attention, HeadLanes, OneQuery, Past, RmsNormRows, SwiGluRows, fmadd, has_fma};
use candle_core::Tensor;

/// Models with more weights than this keep only the candle route: their products are worth every core.
pub(crate) const HOST_MAX_WEIGHTS: usize = 1 << 22;

/// Longest input (new positions of one sequence) the host path takes; longer ones (prompts) go through candle's
/// multi-threaded products.
pub const HOST_MAX_TOKENS: usize = 16;

/// Columns per panel of a host matrix: four AVX2 vectors, the product's widest block (see [`matmul`]).
const PANEL: usize = 32;

/// A layer's weights as host vectors, the same (in, out) matrices as [`Fused`], each cut into column panels of
/// [`PANEL`] columns stored one after the other (`transpose_cat_panels`).
#[derive(Debug)]
struct HostLayer {
    attn_norm: Vec<f32>,
    /// (dim, dim + 2·kv_dim).
    qkv: Vec<f32>,
    qkv_bias: Option<Vec<f32>>,
    /// (dim, dim).
    o: Vec<f32>,
    ffn_norm: Vec<f32>,
    /// (dim, 2·hidden_dim).
    gate_up: Vec<f32>,
    /// (hidden_dim, dim).
    down: Vec<f32>,
}

/// A whole model's weights on the host for [`Model::forward_host`].
#[derive(Debug)]
pub(crate) struct HostWeights {
    /// (vocab, dim).
    embed: Vec<f32>,
    layers: Vec<HostLayer>,
    norm: Vec<f32>,
    /// (dim, vocab), in panels.
    head_t: Vec<f32>,
}

fn host(t: &Tensor) -> Result<Vec<f32>> {
    with_values(t, <[f32]>::to_vec)
}

fn panels(ws: &[&Tensor]) -> Result<Vec<f32>> {
    transpose_cat_panels(ws, PANEL)
}

impl HostWeights {
    /// Host copies of a dense model's weights, transposed to (in, out) straight from the loaded tensors (the one
    /// copy a load makes besides reading the file); `None` when a projection is quantised or the model is larger
    /// than [`HOST_MAX_WEIGHTS`].
    pub(super) fn of(model: &Model) -> Result<Option<HostWeights>> {
        let Some(head) = model.head.dense() else {
            return Ok(None);
        };
        let (vocab, dim) = model.embed.dims()?;
        let mut count = head.weight().elem_count() + vocab * dim;
        let mut dense_layers = Vec::with_capacity(model.layers.len());
        for layer in &model.layers {
            let Some(l) = layer.dense_projections() else {
                return Ok(None);
            };
            count += l.iter().map(|l| l.weight().elem_count()).sum::<usize>();
            dense_layers.push(l);
        }
        if count > HOST_MAX_WEIGHTS {
            return Ok(None);
        }
        let mut layers = Vec::with_capacity(dense_layers.len());
        for (layer, l) in model.layers.iter().zip(dense_layers) {
            let qkv_bias = match (l[0].bias(), l[1].bias(), l[2].bias()) {
                (Some(bq), Some(bk), Some(bv)) => Some([host(bq)?, host(bk)?, host(bv)?].concat()),
                _ => None,
            };
            layers.push(HostLayer {
                attn_norm: host(&layer.attn_norm)?,
                qkv: panels(&[l[0].weight(), l[1].weight(), l[2].weight()])?,
                qkv_bias,
                o: panels(&[l[3].weight()])?,
                ffn_norm: host(&layer.ffn_norm)?,
                gate_up: panels(&[l[4].weight(), l[5].weight()])?,
                down: panels(&[l[6].weight()])?,
            });
        }
        Ok(Some(HostWeights {
            embed: host(&model.embed.dense()?)?,
            layers,
            norm: host(&model.norm)?,
            head_t: panels(&[head.weight()])?,
        }))
    }
}

impl Model {
    /// Whether [`Model::forward_host`] can run `n` new tokens on `cache`.
    pub(super) fn host_path_for(&self, cache: &KvCache, n: usize) -> bool {
        self.host.is_some()
            && self.cpu_fast
            && !self.differentiable
            && cache.is_host()
            && (1..=HOST_MAX_TOKENS).contains(&n)
    }

    /// One validated sequence through the host path: leaves the logits (T, vocab) in `cache.host.logits` and
    /// appends the new keys and values. The caller has checked the tokens, the cache's shape and the length.
    pub(super) fn forward_host(&self, cache: &mut KvCache, tokens: &[u32]) {
        let Some(hw) = self.host.as_deref() else {
            return;
        };
        let cfg = &self.cfg;
        let (d, kvd, h, vocab) = (cfg.dim, cfg.kv_dim(), cfg.hidden_dim, cfg.vocab_size);
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
        let w = d + 2 * kvd;
        let t = tokens.len();
        let past = cache.len;
        let eps = cfg.rms_eps as f32;
        let mut buf = std::mem::take(&mut cache.host);
        let arch = pulp::Arch::new();

        buf.x.clear();
        for &tok in tokens {
            buf.x.extend_from_slice(&hw.embed[tok as usize * d..][..d]);
        }
        buf.visible.clear();
        buf.visible.extend((0..t).map(|j| past + j + 1));
        for (li, layer) in hw.layers.iter().enumerate() {
            rms_norm(&buf.x, &layer.attn_norm, eps, &mut buf.xb);
            matmul(arch, &buf.xb, &layer.qkv, w, &mut buf.qkv, false);
            if let Some(bias) = &layer.qkv_bias {
                for row in buf.qkv.chunks_exact_mut(w) {
                    for (y, b) in row.iter_mut().zip(bias) {
                        *y += b;
                    }
                }
            }
            for (j, row) in buf.qkv.chunks_exact_mut(w).enumerate() {
                self.rotate_row(row, past + j);
            }
            let LayerKv::Host { k, v } = &mut cache.layers[li] else {
                return;
            };
            if t == 1 {
                // One query: append the new key and value, bring this layer's head-lane copy up to date, and
                // attend over it with every lane a head (same bits per head as the block kernel, see `OneQuery`).
                k.extend_from_slice(&buf.qkv[d..d + kvd]);
                v.extend_from_slice(&buf.qkv[d + kvd..w]);
                if buf.lanes.len() <= li {
                    buf.lanes.resize_with(li + 1, HeadLanes::default);
                }
                let lanes = &mut buf.lanes[li];
                let done = lanes.len().min(past + 1);
                lanes.truncate(done);
                lanes.extend(&k[done * kvd..], &v[done * kvd..], nh, nkv, hd);
                OneQuery {
                    q: &buf.qkv[..d],
                    kv: lanes,
                    n_heads: nh,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                }
                .run(&mut buf.att, &mut buf.attn);
            } else {
                Attention {
                    qkv: &buf.qkv,
                    past: &[Past { k, len: past, v }],
                    visible: &buf.visible,
                    queries: t,
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: 1.0 / (hd as f32).sqrt(),
                }
                .run_serial(&mut buf.att, &mut buf.attn);
                for row in buf.qkv.chunks_exact(w) {
                    k.extend_from_slice(&row[d..d + kvd]);
                    v.extend_from_slice(&row[d + kvd..]);
                }
            }
            matmul(arch, &buf.att, &layer.o, d, &mut buf.x, true);
            rms_norm(&buf.x, &layer.ffn_norm, eps, &mut buf.xb);
            matmul(arch, &buf.xb, &layer.gate_up, 2 * h, &mut buf.gate_up, false);
            buf.hidden.clear();
            buf.hidden.resize(t * h, 0.0);
            arch.dispatch(SwiGluRows {
                out: &mut buf.hidden,
                gate_up: &buf.gate_up,
                hidden: h,
            });
            matmul(arch, &buf.hidden, &layer.down, d, &mut buf.x, true);
        }
        rms_norm(&buf.x, &hw.norm, eps, &mut buf.xb);
        matmul(arch, &buf.xb, &hw.head_t, vocab, &mut buf.logits, false);
        cache.len += t;
        cache.host = buf;
    }
}

/// out = x / √(mean(x²) + eps) · w, row by row (rows of w.len()): [`RmsNormRows`].
fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut Vec<f32>) {
    pulp::Arch::new().dispatch(RmsNormRows { x, w, eps, out });
}

/// y (T, out) = x (T, in) · w (in, out), or y += x · w with `accumulate`; `in` is w.len() / out, and w is stored
/// in column panels of [`PANEL`] columns (see [`HostLayer`]).
fn matmul(arch: pulp::Arch, x: &[f32], w: &[f32], out: usize, y: &mut Vec<f32>, accumulate: bool) {
    let inp = w.len() / out;
    let rows = x.len() / inp;
    if !accumulate {
        y.clear();
        y.resize(rows * out, 0.0);
    }
    arch.dispatch(MatMul { x, w, y, inp, out });
}

/// [`matmul`]'s loops, compiled for the instruction set `pulp` picks (a struct, not a closure, as `Block` in
/// `kernels.rs` explains).
struct MatMul<'a> {
    x: &'a [f32],
    w: &'a [f32],
    y: &'a mut [f32],
    inp: usize,
    out: usize,
}

impl pulp::WithSimd for MatMul<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        if has_fma::<S>() {
            self.run::<S, true>(simd)
        } else {
            self.run::<S, false>(simd)
        }
    }
}

impl MatMul<'_> {
    /// Per panel of w and row of x: a full panel of four vectors (AVX2) walks its contiguous rows with eight
    /// accumulators held in vector registers over the whole input width (no load or store of y inside); other
    /// panels go by blocks of four vectors, single vectors and single columns. The accumulators are pulp vectors,
    /// not `[f32; N]` arrays: LLVM kept such arrays on the stack, so every multiply-add loaded and stored its
    /// accumulator (measured: the product ran at about a quarter of the arithmetic rate). Every route applies the
    /// same operations in the same order to a column, so a row's bits do not depend on the route or on the other
    /// rows.
    #[inline(always)]
    fn run<S: pulp::Simd, const F: bool>(self, simd: S) {
        let (inp, out) = (self.inp, self.out);
        let lanes = S::F32_LANES;
        // Panels outside, rows inside: a panel (a few kB) is read from memory once per pass and then serves every
        // row from the L1 cache, so a pass over several positions does not stream the weights once per position.
        for (j, w) in self.w.chunks(PANEL * inp).enumerate() {
            let pw = w.len() / inp;
            for (x, y) in self.x.chunks_exact(inp).zip(self.y.chunks_exact_mut(out)) {
                let y = &mut y[j * PANEL..][..pw];
                if pw == 4 * lanes {
                    panel_columns::<S, 4, F>(simd, x, w, y);
                    continue;
                }
                let mut o0 = 0;
                while o0 + 4 * lanes <= pw {
                    vector_columns::<S, 4, F>(simd, x, w, pw, o0, &mut y[o0..o0 + 4 * lanes]);
                    o0 += 4 * lanes;
                }
                while o0 + lanes <= pw {
                    vector_columns::<S, 1, F>(simd, x, w, pw, o0, &mut y[o0..o0 + lanes]);
                    o0 += lanes;
                }
                while o0 < pw {
                    columns::<1, F>(x, w, pw, o0, &mut y[o0..o0 + 1]);
                    o0 += 1;
                }
            }
        }
    }
}

/// a·b + c on vectors: fused where the instruction set has FMA (`F`), a multiply and an add otherwise; the one
/// definition both column kernels use, so they round alike.
#[inline(always)]
fn fma_lanes<S: pulp::Simd, const F: bool>(simd: S, a: S::f32s, b: S::f32s, c: S::f32s) -> S::f32s {
    if F {
        simd.mul_add_e_f32s(a, b, c)
    } else {
        simd.add_f32s(simd.mul_f32s(a, b), c)
    }
}

/// [`vector_columns`] for a whole panel of exactly K vectors a row: the same arithmetic in the same order, with the
/// panel read as rows of K vectors (no offsets, no bounds checks inside the loop).
#[inline(always)]
fn panel_columns<S: pulp::Simd, const K: usize, const F: bool>(simd: S, x: &[f32], w: &[f32], y: &mut [f32]) {
    let fma = |a, b, c| fma_lanes::<S, F>(simd, a, b, c);
    let zero = simd.splat_f32s(0.0);
    let mut even = [zero; K];
    let mut odd = [zero; K];
    let (rows, _) = bytemuck::cast_slice::<f32, S::f32s>(w).as_chunks::<K>();
    let (row_pairs, last_row) = rows.as_chunks::<2>();
    let (pairs, last) = x.as_chunks::<2>();
    for (&[a, b], [r0, r1]) in pairs.iter().zip(row_pairs) {
        let (a, b) = (simd.splat_f32s(a), simd.splat_f32s(b));
        for k in 0..K {
            even[k] = fma(a, r0[k], even[k]);
            odd[k] = fma(b, r1[k], odd[k]);
        }
    }
    if let (Some(&a), Some(r)) = (last.first(), last_row.first()) {
        let a = simd.splat_f32s(a);
        for (e, &r) in even.iter_mut().zip(r) {
            *e = fma(a, r, *e);
        }
    }
    let dst: &mut [S::f32s] = bytemuck::cast_slice_mut(y);
    for ((d, e), o) in dst.iter_mut().zip(even).zip(odd) {
        *d = simd.add_f32s(*d, simd.add_f32s(e, o));
    }
}

/// y[c] += Σ_i x[i] · w[i·out + o0 + c] for the K·lanes columns from o0, in K vectors. The same arithmetic, in
/// the same order, as [`columns`] (two input rows per step into two sets of accumulators, `y += even + odd`), so
/// every route through the host product gives the same bits. The rows of w are walked as pairs of whole rows and
/// each step's segments are cut once as vectors of known count: indexing `w` by computed offsets left about six
/// bounds checks per vector load in the loop (measured: five times the instructions of the multiply-adds).
#[inline(always)]
fn vector_columns<S: pulp::Simd, const K: usize, const F: bool>(
    simd: S,
    x: &[f32],
    w: &[f32],
    out: usize,
    o0: usize,
    y: &mut [f32],
) {
    let width = K * S::F32_LANES;
    let segment = |row: &[f32]| -> [S::f32s; K] {
        let v: &[S::f32s] = bytemuck::cast_slice(&row[o0..o0 + width]);
        std::array::from_fn(|k| v[k])
    };
    let fma = |a, b, c| fma_lanes::<S, F>(simd, a, b, c);
    let zero = simd.splat_f32s(0.0);
    let mut even = [zero; K];
    let mut odd = [zero; K];
    let (pairs, last) = x.as_chunks::<2>();
    let mut rows = w.chunks_exact(out);
    for &[a, b] in pairs {
        let (Some(r0), Some(r1)) = (rows.next(), rows.next()) else {
            break;
        };
        let (a, b) = (simd.splat_f32s(a), simd.splat_f32s(b));
        let (r0, r1) = (segment(r0), segment(r1));
        for k in 0..K {
            even[k] = fma(a, r0[k], even[k]);
            odd[k] = fma(b, r1[k], odd[k]);
        }
    }
    if let (Some(&a), Some(r)) = (last.first(), rows.next()) {
        let (a, r) = (simd.splat_f32s(a), segment(r));
        for (e, r) in even.iter_mut().zip(r) {
            *e = fma(a, r, *e);
        }
    }
    let dst: &mut [S::f32s] = bytemuck::cast_slice_mut(&mut y[..width]);
    for ((d, e), o) in dst.iter_mut().zip(even).zip(odd) {
        *d = simd.add_f32s(*d, simd.add_f32s(e, o));
    }
}

/// y[c] += Σ_i x[i] · w[i·out + o0 + c] for c < N. Two input rows per step into two sets of accumulators, so
/// that 2·N/8 multiply-add chains run side by side instead of waiting on each other's latency.
#[inline(always)]
fn columns<const N: usize, const F: bool>(x: &[f32], w: &[f32], out: usize, o0: usize, y: &mut [f32]) {
    let mut even = [0f32; N];
    let mut odd = [0f32; N];
    let pairs = x.len() / 2;
    for i in 0..pairs {
        let (a, b) = (x[2 * i], x[2 * i + 1]);
        let r0: &[f32; N] = w[2 * i * out + o0..][..N].try_into().expect("N columns");
        let r1: &[f32; N] = w[(2 * i + 1) * out + o0..][..N].try_into().expect("N columns");
        for c in 0..N {
            even[c] = fmadd::<F>(a, r0[c], even[c]);
            odd[c] = fmadd::<F>(b, r1[c], odd[c]);
        }
    }
    if x.len() % 2 == 1 {
        let i = x.len() - 1;
        let r: &[f32; N] = w[i * out + o0..][..N].try_into().expect("N columns");
        for c in 0..N {
            even[c] = fmadd::<F>(x[i], r[c], even[c]);
        }
    }
    for ((y, e), o) in y.iter_mut().zip(even).zip(odd) {
        *y += e + o;
    }
}
