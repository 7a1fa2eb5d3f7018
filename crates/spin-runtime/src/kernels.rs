//! Two fused CPU kernels for the transformer's hot path that candle does not offer on the CPU: causal
//! grouped-query attention of a padded batch read straight from host KV caches, and the SwiGLU product silu(g)·u.
//!
//! Hand-written because, for the small per-head matrices of a verification batch, candle's route (copy every
//! cache into a padded tensor, two batched products, an additive mask, a softmax calling scalar `expf`) spends
//! most of its time in copies and per-call overhead. Here no cache is copied or padded, each sequence reads only
//! its own keys, and the exponentials come from a branch-free polynomial. The loops are plain Rust compiled for
//! the best instruction set the CPU offers, chosen at run time by `pulp::Arch::dispatch` (AVX2 and FMA on
//! x86-64-v3, SSE2 otherwise), with no `unsafe` here. Both split their work with rayon (the model calls them
//! from inside the pool).

mod panels;

pub(crate) use panels::{KvPanels, PanelAttention, PanelScratch, Partial};

use candle_core::{CpuStorage, CustomOp1, Layout, Shape};
use rayon::prelude::*;

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op}: expected f32 input")
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: input must be contiguous"),
    }
}

/// What a sequence's cache already holds for one layer: `len` positions of keys and of values, both
/// position-major (len, n_kv_heads, head_dim).
pub(crate) struct Past<'a> {
    pub k: &'a [f32],
    pub len: usize,
    pub v: &'a [f32],
}

impl Past<'_> {
    /// No cached positions.
    pub const EMPTY: Past<'static> = Past {
        k: &[],
        len: 0,
        v: &[],
    };
}

/// Causal grouped-query attention of a padded batch, computed on the host in one pass: scores, prefix mask,
/// softmax and the weighted sum of values for every (sequence, query, head), reading each sequence's cache as it is
/// stored. Replaces a padded copy of every cache, two batched products and a masked softmax per layer.
pub(crate) struct Attention<'a> {
    /// One row per (sequence, position), B·T rows: the n_heads query heads and the n_kv_heads key heads after
    /// RoPE, then the n_kv_heads value heads, head_dim floats each (the q|k|v projection's output as it is).
    pub qkv: &'a [f32],
    /// Per sequence, what its cache held before this pass (empty slices when nothing).
    pub past: &'a [Past<'a>],
    /// Keys visible to query (b, j), cache included: B·T entries, each at most past_b + T.
    pub visible: &'a [usize],
    /// Queries per sequence, T.
    pub queries: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// 1/√head_dim.
    pub scale: f32,
}

/// a·b + c: one fused instruction where the instruction set has one (`F`), a multiply and an add otherwise
/// (`f32::mul_add` without hardware FMA is a slow library call).
#[inline(always)]
pub(crate) fn fmadd<const F: bool>(a: f32, b: f32, c: f32) -> f32 {
    if F { a.mul_add(b, c) } else { a * b + c }
}

/// Whether pulp's instruction set `S` has fused multiply-add (x86-64-v3, and every aarch64 with NEON).
pub(crate) fn has_fma<S: pulp::Simd>() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::any::TypeId::of::<S>() == std::any::TypeId::of::<pulp::x86::V3>()
    }
    #[cfg(target_arch = "aarch64")]
    {
        !S::IS_SCALAR
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}

/// e^x, branch-free so that the loops that call it vectorise.
///
/// Hand-written: `wide::f32x8::exp` handles NaN, infinities and overflow with masks on every call, is not inlined
/// into our loops and picks its instruction set at build time; a profile of a K = 16 verification pass spent a
/// quarter of its time there. Inputs are clamped to [−87, 88] (NaN stays NaN), where e^x is a normal f32 (softmax
/// arguments are ≤ 0 and anything below −87 adds less than 2⁻¹²⁵ to a sum of at least 1). Range reduction
/// x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two parts so that n·ln2 is exact), a degree-6 Taylor polynomial
/// for e^r (truncation below 1.2e−7 relative), and 2ⁿ built in the exponent bits. Tested against f64 to 4e−7
/// relative, with and without fused multiply-add.
#[inline(always)]
pub(crate) fn exp_with<const F: bool>(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer kept in the low mantissa bits
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = fmadd::<F>(x, std::f32::consts::LOG2_E, ROUND);
    let n = t - ROUND;
    let r = fmadd::<F>(-n, LN2_LO, fmadd::<F>(-n, LN2_HI, x));
    let mut p = 1.0 / 720.0;
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = fmadd::<F>(p, r, c);
    }
    // The low bits of t hold n in two's complement around ROUND's bit pattern; n + 127 is the biased exponent.
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    p * f32::from_bits(bits)
}

/// Eight lanes: the rows of a block are processed eight at a time, one row per lane.
type Lanes = [f32; 8];

/// The unnormalised softmax of lane vector `v` of every position (`scores` holds `stride` lane vectors per
/// position): per lane the maximum over positions, then each score replaced by exp(score − maximum); returns the
/// per-lane sums. One function for the block kernel and `OneQuery`, so both do these operations in this order.
#[inline(always)]
fn lane_softmax<const F: bool>(scores: &mut [Lanes], stride: usize, v: usize) -> Lanes {
    let mut m = [f32::NEG_INFINITY; 8];
    for sp in scores.chunks_exact(stride) {
        let x = sp[v];
        for l in 0..8 {
            m[l] = if x[l] > m[l] { x[l] } else { m[l] };
        }
    }
    let mut z = [0f32; 8];
    for sp in scores.chunks_exact_mut(stride) {
        let x = &mut sp[v];
        for l in 0..8 {
            x[l] = exp_with::<F>(x[l] - m[l]);
            z[l] += x[l];
        }
    }
    z
}

/// Buffers of [`Attention::run_serial`], kept by its caller between calls.
#[derive(Debug, Clone)]
pub(crate) struct AttnScratch {
    scratch: Scratch,
    blocks: Vec<f32>,
    arch: pulp::Arch,
}

impl Default for AttnScratch {
    fn default() -> Self {
        AttnScratch {
            scratch: Scratch::default(),
            blocks: Vec::new(),
            arch: pulp::Arch::new(),
        }
    }
}

/// Scratch space of one attention task, reused across the tasks a rayon job runs.
#[derive(Debug, Clone, Default)]
struct Scratch {
    /// Scaled queries, row-vector-major: `qt[v·head_dim + d]` holds channel d of rows 8v .. 8v + 7.
    qt: Vec<Lanes>,
    /// Scores, then weights, position-major: `s[p·rv + v]` for rows 8v .. 8v + 7.
    s: Vec<Lanes>,
    /// Per row vector, the sum of weights.
    sum: Vec<Lanes>,
}

impl Attention<'_> {
    /// The attention output (B, T, n_heads, head_dim), ready for the output projection.
    ///
    /// One task per (sequence, kv head), holding the rep·T query rows of that kv head. Every step runs across
    /// eight rows at once, one per vector lane: the scores of a key are head_dim multiply-adds of a broadcast key
    /// channel, the softmax statistics are lane-wise, and the weighted sum of values broadcasts value channels.
    /// Keys and values are read where they are stored (cache, then the new q|k|v rows); nothing is gathered or
    /// transposed but the queries.
    pub fn run(&self) -> Vec<f32> {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let b = self.past.len();
        let arch = pulp::Arch::new();
        // Task (i, g) writes its rep·T rows (head-major) to its own chunk; they are interleaved into
        // (B, T, n_heads, head_dim) afterwards.
        let mut blocks = vec![0f32; b * nh * t * hd];
        blocks.par_chunks_mut(rep * t * hd).enumerate().for_each_init(
            Scratch::default,
            |scratch, (task, out)| {
                arch.dispatch(Block {
                    att: self,
                    i: task / nkv,
                    g: task % nkv,
                    out,
                    scratch,
                })
            },
        );
        let mut y = vec![0f32; b * t * nh * hd];
        self.interleave(&blocks, &mut y);
        y
    }

    /// [`Attention::run`] on the calling thread, into `y` (resized to B·T·n_heads·head_dim), with buffers the
    /// caller keeps from one call to the next: no allocation once they have grown, no hand-off to a pool thread
    /// (what a single sequence's step of a small model wants).
    pub fn run_serial(&self, y: &mut Vec<f32>, s: &mut AttnScratch) {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let b = self.past.len();
        s.blocks.clear();
        s.blocks.resize(b * nh * t * hd, 0.0);
        for (task, out) in s.blocks.chunks_exact_mut(rep * t * hd).enumerate() {
            s.arch.dispatch(Block {
                att: self,
                i: task / nkv,
                g: task % nkv,
                out,
                scratch: &mut s.scratch,
            });
        }
        y.clear();
        y.resize(b * t * nh * hd, 0.0);
        self.interleave(&s.blocks, y);
    }

    /// Moves the blocks of rep·T rows per (sequence, kv head) into (B, T, n_heads, head_dim) order.
    fn interleave(&self, blocks: &[f32], y: &mut [f32]) {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        if t == 1 {
            // One query: a block's rep rows are already the heads g·rep .. g·rep + rep − 1 in order.
            copy(y, blocks);
            return;
        }
        for (task, block) in blocks.chunks_exact(rep * t * hd).enumerate() {
            let (i, g) = (task / nkv, task % nkv);
            for (row, src) in block.chunks_exact(hd).enumerate() {
                let (r, j) = (row / t, row % t);
                let dst = ((i * t + j) * nh + g * rep + r) * hd;
                copy(&mut y[dst..dst + hd], src);
            }
        }
    }

    /// The outputs (rep·T rows of head_dim, row r·T + j for query j of the r-th head of the group) of the query
    /// heads that share kv head `g` in sequence `i`.
    #[inline(always)]
    fn block<const F: bool>(&self, i: usize, g: usize, out: &mut [f32], s: &mut Scratch) {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let past = &self.past[i];
        let np = past.len;
        let visible = &self.visible[i * t..(i + 1) * t];
        let n_max = visible.iter().copied().max().unwrap_or(0).min(np + t);
        let rows = rep * t;
        let rv = rows.div_ceil(8);
        let (d, kvd) = (nh * hd, nkv * hd);
        // This sequence's new q|k|v rows (w floats each: queries at 0, keys at d, values at d + kvd) and its cached
        // keys and values, position-major with kvd floats a row.
        let w = d + 2 * kvd;
        let new = &self.qkv[i * t * w..][..t * w];
        let past_k = &past.k[..np * kvd];
        let past_v = &past.v[..np * kvd];

        s.qt.clear();
        s.qt.resize(rv * hd, [0.0; 8]);
        for row in 0..rows {
            let (r, j) = (row / t, row % t);
            let q = &new[j * w + (g * rep + r) * hd..][..hd];
            for (c, &x) in q.iter().enumerate() {
                s.qt[(row / 8) * hd + c][row % 8] = x * self.scale;
            }
        }

        // Scores of every visible key: the cached ones, then the new ones.
        s.s.clear();
        s.s.resize(n_max * rv, [0.0; 8]);
        let n_new = n_max.saturating_sub(np);
        let (s_past, s_new) = s.s.split_at_mut(np.min(n_max) * rv);
        // Four keys at a time (eight independent multiply-add chains, see `scores`), then one at a time.
        // Cached keys are rows of kv_dim with this head at g·hd; new keys sit in rows of w at d + g·hd.
        let segments = [
            (past_k, kvd, g * hd, s_past),
            (&new[..n_new * w], w, d + g * hd, s_new),
        ];
        for (keys, stride, offset, sp) in segments {
            let quads = keys.chunks_exact(4 * stride).zip(sp.chunks_exact_mut(4 * rv));
            let done = keys.len() / (4 * stride);
            for (r, sq) in quads {
                let k: [&[f32]; 4] = std::array::from_fn(|j| &r[j * stride + offset..][..hd]);
                scores::<4, F>(sq, &s.qt, k, rv);
            }
            let rest = keys[done * 4 * stride..].chunks_exact(stride);
            for (r, s1) in rest.zip(sp[done * 4 * rv..].chunks_exact_mut(rv)) {
                scores::<1, F>(s1, &s.qt, [&r[offset..offset + hd]], rv);
            }
        }

        // Causal mask: row r·T + j sees visible[j] keys; only new keys can be hidden.
        let masked = |s: &mut [Lanes], value: f32| {
            for row in 0..rows {
                for p in visible[row % t].min(n_max)..n_max {
                    s[p * rv + row / 8][row % 8] = value;
                }
            }
        };
        masked(&mut s.s, f32::NEG_INFINITY);
        // Per row vector: lane-wise maximum, then exponentials and their sums, each kept in registers.
        s.sum.clear();
        for v in 0..rv {
            let z = lane_softmax::<F>(&mut s.s, rv, v);
            s.sum.push(z);
        }
        // exp clamps −∞ to e⁻⁸⁷; masked keys get exactly zero weight (the sums differ by under 2⁻¹²⁵).
        masked(&mut s.s, 0.0);

        // Weighted sums of values, lanes = rows; value channels are broadcast, eight at a time (fewer in the last
        // group when head_dim is not a multiple of 8).
        let (s_past, s_new) = s.s.split_at(np.min(n_max) * rv);
        let values = |v: usize, d0: usize, width: usize| -> [Lanes; 8] {
            let acc = [[0f32; 8]; 8];
            let acc = weighted::<F>(acc, past_v, kvd, g * hd + d0, width, s_past, rv, v);
            let offset = d + kvd + g * hd + d0;
            weighted::<F>(acc, &new[..n_new * w], w, offset, width, s_new, rv, v)
        };
        for v in 0..rv {
            let inv = s.sum[v].map(|z| 1.0 / z);
            for d0 in (0..hd).step_by(8) {
                let width = (hd - d0).min(8);
                let acc = values(v, d0, width);
                for (l, &inv) in inv.iter().enumerate() {
                    let row = 8 * v + l;
                    if row < rows {
                        for (dd, o) in out[row * hd + d0..][..width].iter_mut().enumerate() {
                            *o = acc[dd][l] * inv;
                        }
                    }
                }
            }
        }
    }
}

/// One sequence's cached keys and values laid out for a single query over all heads at once: per position, per
/// vector v of eight query heads and per channel c, lane l holds channel c of the key (value) head that query head
/// 8v + l reads (grouped-query heads repeat their kv head). Kept next to the position-major cache and extended from
/// it, so that a one-token step fills all eight lanes with real heads (the block kernel above has one lane per
/// query row of one kv head: for one query, rep of eight lanes).
#[derive(Debug, Clone, Default)]
pub(crate) struct HeadLanes {
    k: Vec<Lanes>,
    v: Vec<Lanes>,
    /// Lane vectors per position: head_dim · ⌈n_heads/8⌉ (0 while empty).
    per: usize,
}

impl HeadLanes {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.k.len().checked_div(self.per).unwrap_or(0)
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.per);
        self.v.truncate(len * self.per);
    }

    /// Appends positions from position-major key and value rows (n_kv_heads · head_dim floats a position).
    pub fn extend(&mut self, k: &[f32], v: &[f32], n_heads: usize, n_kv_heads: usize, head_dim: usize) {
        let (hv, kvd, rep) = (n_heads.div_ceil(8), n_kv_heads * head_dim, n_heads / n_kv_heads);
        self.per = head_dim * hv;
        // Per lane vector, where each lane's kv head starts in a cache row (`None` past the last head).
        let starts: Vec<[Option<usize>; 8]> = (0..hv)
            .map(|vi| {
                std::array::from_fn(|l| (8 * vi + l < n_heads).then_some((8 * vi + l) / rep * head_dim))
            })
            .collect();
        for (src, dst) in [(k, &mut self.k), (v, &mut self.v)] {
            for row in src.chunks_exact(kvd) {
                let base = dst.len();
                dst.resize(base + self.per, [0.0; 8]);
                for (out, starts) in dst[base..].chunks_exact_mut(head_dim).zip(&starts) {
                    for (l, s) in starts.iter().enumerate() {
                        if let Some(s) = *s {
                            for (o, &x) in out.iter_mut().zip(&row[s..s + head_dim]) {
                                o[l] = x;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Attention of one new query of one sequence over every head at once, reading keys and values from
/// [`HeadLanes`] (which already holds the new position): lanes are query heads, so a position's scores over all
/// heads are head_dim multiply-adds of whole vectors, one exponential vector and head_dim multiply-adds for the
/// values.
///
/// Per head, every operation is the one [`Attention`]'s block kernel applies to that head's row, in the same order:
/// the scaled query, the score as even and odd channel chains added at the end, the running maximum, e^(s − m)
/// summed position by position, the value sums position by position and the final multiplication by 1/sum. A
/// query computed alone (a decoding step) therefore gives the same bits as the same query computed among others
/// (verification of several positions), which keeps plain and speculative greedy decoding identical (tested).
pub(crate) struct OneQuery<'a> {
    /// The query heads after RoPE, n_heads · head_dim floats.
    pub q: &'a [f32],
    pub kv: &'a HeadLanes,
    pub n_heads: usize,
    pub head_dim: usize,
    /// 1/√head_dim.
    pub scale: f32,
}

impl OneQuery<'_> {
    /// The attention output (n_heads, head_dim) into `y`, with the caller's buffers.
    pub fn run(&self, y: &mut Vec<f32>, s: &mut AttnScratch) {
        y.clear();
        y.resize(self.n_heads * self.head_dim, 0.0);
        let arch = s.arch;
        arch.dispatch(OneQueryTask {
            att: self,
            out: y,
            scratch: &mut s.scratch,
        });
    }

    /// The kernel in vectors of `S` (a lane vector of eight heads is 8 / S::F32_LANES of them), with fused
    /// multiply-adds exactly when `F` (the block kernel's choice for the instruction set `pulp` picked). Written
    /// with `pulp`'s vector types rather than lane arrays: left to LLVM, the constant-length array loops of the
    /// value sums were unrolled into scalar code.
    #[inline(always)]
    fn block<S: pulp::Simd, const F: bool>(&self, simd: S, out: &mut [f32], s: &mut Scratch) {
        let (nh, hd) = (self.n_heads, self.head_dim);
        let hv = nh.div_ceil(8);
        let per = hd * hv;
        let n = self.kv.len();
        let lanes = S::F32_LANES;
        let m = 8 / lanes;
        if per == 0 || n == 0 || m * lanes != 8 {
            return;
        }
        let fma = |a: S::f32s, b: S::f32s, c: S::f32s| {
            if F {
                simd.mul_add_f32s(a, b, c)
            } else {
                simd.add_f32s(simd.mul_f32s(a, b), c)
            }
        };
        let zero = simd.splat_f32s(0.0);
        s.qt.clear();
        s.qt.resize(per, [0.0; 8]);
        for (h, q) in self.q.chunks_exact(hd).take(nh).enumerate() {
            for (c, &x) in q.iter().enumerate() {
                s.qt[(h / 8) * hd + c][h % 8] = x * self.scale;
            }
        }
        // Scores, as `scores` computes them for one key: even and odd channels in two chains, added at the end.
        s.s.clear();
        s.s.resize(n * hv, [0.0; 8]);
        let qt = &s.qt[..per];
        let eight = hd == 8 && hv == 1 && m == 1;
        if eight {
            // Eight heads of eight channels in one vector each (stories260K's shape): the same chains with the
            // channel loop unrolled and the query kept in registers.
            let q = vectors::<S>(qt);
            let q: [S::f32s; 8] = std::array::from_fn(|c| q[c]);
            let (keys, _) = self.kv.k.as_chunks::<8>();
            for (kp, sv) in keys.iter().zip(s.s.iter_mut()) {
                let k = vectors::<S>(kp);
                let (mut even, mut odd) = (zero, zero);
                for p in 0..4 {
                    even = fma(k[2 * p], q[2 * p], even);
                    odd = fma(k[2 * p + 1], q[2 * p + 1], odd);
                }
                let sv: &mut [S::f32s] = bytemuck::cast_slice_mut(std::slice::from_mut(sv));
                sv[0] = simd.add_f32s(even, odd);
            }
        }
        let general = if eight { 0 } else { n };
        for (kp, sp) in self
            .kv
            .k
            .chunks_exact(per)
            .zip(s.s.chunks_exact_mut(hv))
            .take(general)
        {
            for ((kv, qv), sv) in kp.chunks_exact(hd).zip(qt.chunks_exact(hd)).zip(sp) {
                let (kv, qv) = (vectors::<S>(kv), vectors::<S>(qv));
                let sv: &mut [S::f32s] = bytemuck::cast_slice_mut(std::slice::from_mut(sv));
                for (j, o) in sv.iter_mut().enumerate() {
                    let (mut even, mut odd) = (zero, zero);
                    for (k2, q2) in kv.chunks_exact(2 * m).zip(qv.chunks_exact(2 * m)) {
                        even = fma(k2[j], q2[j], even);
                        odd = fma(k2[m + j], q2[m + j], odd);
                    }
                    *o = simd.add_f32s(even, odd);
                }
            }
        }
        // Per lane vector: maximum, exponentials and their sum, the weighted values, then 1/sum.
        for v in 0..hv {
            let z = lane_softmax::<F>(&mut s.s, hv, v);
            let inv = z.map(|z| 1.0 / z);
            for d0 in (0..hd).step_by(8) {
                let width = (hd - d0).min(8);
                for j in 0..m {
                    let mut acc = [zero; 8];
                    let rows = self.kv.v.chunks_exact(per).zip(s.s.chunks_exact(hv));
                    if width == 8 {
                        for (vp, sp) in rows {
                            let w = vectors::<S>(std::slice::from_ref(&sp[v]))[j];
                            let x = vectors::<S>(&vp[v * hd + d0..][..8]);
                            for (dd, a) in acc.iter_mut().enumerate() {
                                *a = fma(x[dd * m + j], w, *a);
                            }
                        }
                    } else {
                        for (vp, sp) in rows {
                            let w = vectors::<S>(std::slice::from_ref(&sp[v]))[j];
                            let x = vectors::<S>(&vp[v * hd + d0..][..width]);
                            for (dd, a) in acc.iter_mut().enumerate().take(width) {
                                *a = fma(x[dd * m + j], w, *a);
                            }
                        }
                    }
                    for (dd, a) in acc.iter().enumerate().take(width) {
                        let a: &[f32] = bytemuck::cast_slice(std::slice::from_ref(a));
                        for (l, &a) in a.iter().enumerate() {
                            let lane = j * lanes + l;
                            let h = 8 * v + lane;
                            if h < nh {
                                out[h * hd + d0 + dd] = a * inv[lane];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Lane vectors as vectors of the instruction set `S` (8 / S::F32_LANES per lane vector).
#[inline(always)]
fn vectors<S: pulp::Simd>(x: &[Lanes]) -> &[S::f32s] {
    bytemuck::cast_slice(x)
}

/// [`OneQuery`] compiled for the instruction set `pulp` picks, as [`Block`].
struct OneQueryTask<'a, 'b, 'c> {
    att: &'a OneQuery<'b>,
    out: &'c mut [f32],
    scratch: &'c mut Scratch,
}

impl pulp::WithSimd for OneQueryTask<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        // An instruction set whose vectors do not divide a lane vector of eight runs in scalars, keeping the block
        // kernel's choice of fused multiply-adds for it.
        match (8 % S::F32_LANES == 0, has_fma::<S>()) {
            (true, true) => self.att.block::<S, true>(simd, self.out, self.scratch),
            (true, false) => self.att.block::<S, false>(simd, self.out, self.scratch),
            (false, true) => self
                .att
                .block::<pulp::Scalar, true>(pulp::Scalar, self.out, self.scratch),
            (false, false) => self
                .att
                .block::<pulp::Scalar, false>(pulp::Scalar, self.out, self.scratch),
        }
    }
}

/// acc[dd][l] += Σ_p values[p][offset + dd] · s[p·rv + v][l] over the positions of `values` (rows of `stride`
/// floats) for dd < width: the weighted sum of `width` value channels for the eight rows of lane vector v. The
/// accumulators travel by value so that they stay in registers.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn weighted<const F: bool>(
    mut acc: [Lanes; 8],
    values: &[f32],
    stride: usize,
    offset: usize,
    width: usize,
    s: &[Lanes],
    rv: usize,
    v: usize,
) -> [Lanes; 8] {
    let rows = values.chunks_exact(stride).zip(s.chunks_exact(rv));
    if width == 8 {
        for (row, sp) in rows {
            let x: &Lanes = row[offset..offset + 8].try_into().expect("eight channels");
            let w = sp[v];
            for dd in 0..8 {
                for l in 0..8 {
                    acc[dd][l] = fmadd::<F>(x[dd], w[l], acc[dd][l]);
                }
            }
        }
    } else {
        for (row, sp) in rows {
            let w = sp[v];
            for (acc, &x) in acc.iter_mut().zip(&row[offset..offset + width]) {
                for l in 0..8 {
                    acc[l] = fmadd::<F>(x, w[l], acc[l]);
                }
            }
        }
    }
    acc
}

/// s[j·rv + v] = Σ_d keys[j][d] · qt[v·head_dim + d] for every row vector v: the scores of N consecutive keys
/// against all rows. Even and odd channels go to separate accumulators, 2·N independent multiply-add chains of
/// head_dim/2 steps each (one chain per key would leave the multiply-add units waiting on each other's latency).
#[inline(always)]
fn scores<const N: usize, const F: bool>(s: &mut [Lanes], qt: &[Lanes], keys: [&[f32]; N], rv: usize) {
    let hd = keys[0].len();
    let keys = keys.map(|k| &k[..hd]);
    for (v, qv) in qt.chunks_exact(hd).enumerate().take(rv) {
        let mut even = [[0f32; 8]; N];
        let mut odd = [[0f32; 8]; N];
        for (p, q) in qv.chunks_exact(2).enumerate() {
            for j in 0..N {
                let (k0, k1) = (keys[j][2 * p], keys[j][2 * p + 1]);
                for l in 0..8 {
                    even[j][l] = fmadd::<F>(k0, q[0][l], even[j][l]);
                    odd[j][l] = fmadd::<F>(k1, q[1][l], odd[j][l]);
                }
            }
        }
        for j in 0..N {
            for l in 0..8 {
                s[j * rv + v][l] = even[j][l] + odd[j][l];
            }
        }
    }
}

/// dst = src for short rows: eight floats at a time as fixed-size moves (a plain slice copy of eight floats
/// becomes a `memcpy` call).
#[inline(always)]
fn copy(dst: &mut [f32], src: &[f32]) {
    let (dc, dt) = dst.as_chunks_mut::<8>();
    let (sc, st) = src.as_chunks::<8>();
    for (d, s) in dc.iter_mut().zip(sc) {
        *d = *s;
    }
    for (d, s) in dt.iter_mut().zip(st) {
        *d = *s;
    }
}

/// One (sequence, kv head) block of [`Attention::run`], compiled for the instruction set `pulp` picks. (A struct
/// rather than a closure: a closure reaches `dispatch` through a `FnOnce` shim that is not inlined, and the loops
/// then stay at the baseline instruction set.)
struct Block<'a, 'b, 'c> {
    att: &'a Attention<'b>,
    i: usize,
    g: usize,
    out: &'c mut [f32],
    scratch: &'c mut Scratch,
}

impl pulp::WithSimd for Block<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        if has_fma::<S>() {
            self.att.block::<true>(self.i, self.g, self.out, self.scratch)
        } else {
            self.att.block::<false>(self.i, self.g, self.out, self.scratch)
        }
    }
}

/// Rows of [`SwiGlu`], dispatched like [`Block`].
pub(crate) struct SwiGluRows<'a> {
    pub out: &'a mut [f32],
    pub gate_up: &'a [f32],
    pub hidden: usize,
}

impl pulp::WithSimd for SwiGluRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        if has_fma::<S>() {
            self.run::<true>()
        } else {
            self.run::<false>()
        }
    }
}

impl SwiGluRows<'_> {
    #[inline(always)]
    fn run<const F: bool>(self) {
        let h = self.hidden;
        for (out, gu) in self.out.chunks_exact_mut(h).zip(self.gate_up.chunks_exact(2 * h)) {
            let (g, u) = gu.split_at(h);
            for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
                *o = g * u / (1.0 + exp_with::<F>(-g));
            }
        }
    }
}

/// RMSNorm of rows of `w.len()` values: `out = x / √(mean(x²) + eps) · w` row by row, `out` resized to `x`'s
/// length. Each square is rounded to f32 and summed in f64, in eight lanes (value i into lane i mod 8, the lanes
/// then added pairwise); the mean is rounded to f32 and the rest is f32, as ggml's CPU RMSNorm does (it sums the
/// same f32 squares in one double, which any order matches but for a last-bit tie in 2⁻²⁹ of the sum). A plain
/// f32 iterator sum was one chain of 576 dependent additions: five rows of 576 took 2.16 µs, now 0.98 µs (a
/// standalone timing, AVX2), twice a layer for every position of a pass.
pub(crate) struct RmsNormRows<'a> {
    pub x: &'a [f32],
    pub w: &'a [f32],
    pub eps: f32,
    pub out: &'a mut Vec<f32>,
}

impl pulp::WithSimd for RmsNormRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        self.run()
    }
}

impl RmsNormRows<'_> {
    #[inline(always)]
    fn run(self) {
        let Self { x, w, eps, out } = self;
        let d = w.len();
        out.clear();
        out.resize(x.len(), 0.0);
        if d == 0 {
            return;
        }
        for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let mean = (sum_squares(row) / d as f64) as f32;
            let inv = 1.0 / (mean + eps).sqrt();
            for ((o, &v), &g) in o.iter_mut().zip(row).zip(w) {
                *o = v * inv * g;
            }
        }
    }
}

/// Σ v² over `row`, each square rounded to f32, summed in f64 in eight lanes (see [`RmsNormRows`]).
#[inline(always)]
pub(crate) fn sum_squares(row: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += (v * v) as f64;
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += (v * v) as f64;
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// The first largest entry of a row and whether the row holds a NaN or +∞ ([`crate::probs::argmax`]'s search):
/// one pass of sixteen-lane maxima per chunk of 512 entries, which the compiler vectorises under the CPU's
/// instruction set, keeps the first chunk whose maximum is larger than every earlier chunk's; a scan of that chunk
/// then finds the first entry equal to it. The same index as a scalar loop that keeps the first strictly larger
/// entry (ties go to the smaller index), in 5.8 µs on a 49,152-token row where that loop's compare-and-branch
/// per entry took 66 µs (docs/runtime.md, "Greedy verdicts, one-copy loads and GGUF drafts").
pub(crate) struct FirstMax<'a> {
    pub row: &'a [f32],
}

/// Entries per chunk of [`FirstMax`].
const MAX_CHUNK: usize = 512;

impl pulp::WithSimd for FirstMax<'_> {
    /// (index, value) of the first largest entry (value −∞ for an empty or all −∞ row), and whether a NaN or +∞
    /// occurs.
    type Output = ((usize, f32), bool);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        const L: usize = 16;
        let mut bad = [false; L];
        let (mut max, mut at) = (f32::NEG_INFINITY, 0);
        for (c, chunk) in self.row.chunks(MAX_CHUNK).enumerate() {
            let mut m = [f32::NEG_INFINITY; L];
            let mut lanes = chunk.chunks_exact(L);
            for v in &mut lanes {
                for l in 0..L {
                    let x = v[l];
                    bad[l] |= x.is_nan() | (x == f32::INFINITY);
                    m[l] = if x > m[l] { x } else { m[l] };
                }
            }
            for (l, &x) in lanes.remainder().iter().enumerate() {
                bad[l] |= x.is_nan() | (x == f32::INFINITY);
                m[l] = if x > m[l] { x } else { m[l] };
            }
            let cm = m
                .iter()
                .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
            if cm > max {
                (max, at) = (cm, c);
            }
        }
        let bad = bad.iter().any(|&b| b);
        let chunk = self.row.chunks(MAX_CHUNK).nth(at).unwrap_or(&[]);
        let first = chunk
            .iter()
            .position(|&x| x == max)
            .map_or(0, |i| at * MAX_CHUNK + i);
        ((first, max), bad)
    }
}

/// The SwiGLU product silu(g) · u = g·u / (1 + e^(−g)) of a contiguous tensor (.., 2·hidden) whose last axis
/// holds the gate g then the up projection u; the result is (.., hidden).
pub(crate) struct SwiGlu;

impl CustomOp1 for SwiGlu {
    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let gate_up = contiguous(storage, layout, self.name())?;
        let mut dims = layout.dims().to_vec();
        let last = dims.last_mut().filter(|n| **n > 0 && n.is_multiple_of(2));
        let Some(last) = last else {
            candle_core::bail!(
                "swiglu: last axis of {:?} is not a positive even length",
                layout.dims()
            )
        };
        *last /= 2;
        let hidden = *last;
        let mut dst = vec![0f32; gate_up.len() / 2];
        let rows = 4096usize.div_ceil(hidden);
        let arch = pulp::Arch::new();
        dst.par_chunks_mut(rows * hidden)
            .zip(gate_up.par_chunks(2 * rows * hidden))
            .for_each(|(out, gate_up)| arch.dispatch(SwiGluRows { out, gate_up, hidden }));
        Ok((CpuStorage::F32(dst), Shape::from(dims)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Straightforward attention in f64 over explicit key and value lists, for comparison.
    fn reference(q: &[f32], keys: &[Vec<f32>], vals: &[Vec<f32>], scale: f64) -> Vec<f64> {
        let s: Vec<f64> = keys
            .iter()
            .map(|k| scale * q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>())
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let mut out = vec![0f64; q.len()];
        for (x, v) in s.iter().zip(vals) {
            for (o, vv) in out.iter_mut().zip(v) {
                *o += (x - m).exp() / z * *vv as f64;
            }
        }
        out
    }

    /// The first largest entry found by the chunked search equals a scalar loop's on rows with many ties (values
    /// rounded to a few levels), lengths around the chunk and lane sizes, and NaN or ±∞ placed anywhere; under the
    /// CPU's instruction set and pulp's scalar fallback alike.
    #[test]
    fn first_max_matches_a_scalar_search() {
        fn reference(row: &[f32]) -> ((usize, f32), bool) {
            let (mut best, mut max, mut bad) = (0, f32::NEG_INFINITY, false);
            for (i, &x) in row.iter().enumerate() {
                bad |= x.is_nan() || x == f32::INFINITY;
                if x > max {
                    (best, max) = (i, x);
                }
            }
            ((best, max), bad)
        }
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in [0, 1, 2, 15, 16, 17, 511, 512, 513, 1024, 1500, 4097, 49_152] {
            for trial in 0..40 {
                let levels = 1 + (next() % 6) as u32;
                let mut row: Vec<f32> = (0..len)
                    .map(|_| (next() % u64::from(levels)) as f32 - 2.0)
                    .collect();
                if len > 0 {
                    let i = (next() % len as u64) as usize;
                    match trial % 8 {
                        0 => row[i] = f32::NAN,
                        1 => row[i] = f32::INFINITY,
                        2 => row.fill(f32::NEG_INFINITY),
                        3 => row[i] = f32::NEG_INFINITY,
                        _ => {}
                    }
                }
                let want = reference(&row);
                for got in [
                    pulp::Arch::new().dispatch(FirstMax { row: &row }),
                    pulp::WithSimd::with_simd(FirstMax { row: &row }, pulp::Scalar::new()),
                ] {
                    assert_eq!(got.1, want.1, "length {len}, trial {trial}: NaN/+inf flag");
                    if !want.1 {
                        assert_eq!(got.0, want.0, "length {len}, trial {trial}");
                    }
                }
            }
        }
    }

    #[test]
    fn attention_equals_explicit_reference_with_caches_and_padding() {
        // head_dim 12 (a last group of four value channels), 8 and 16 (one and two full groups of eight); 6, 18
        // and 20 query rows per kv head (one or three lane vectors, the last partly padding); caches empty, and of
        // 5, 13, 17, 40 and 70 keys (whole groups of four keys plus a remainder), before 3 to 9 new keys.
        check_attention(3, 4, 2, 12, &[5, 0]);
        check_attention(9, 8, 4, 8, &[70, 13]);
        check_attention(5, 4, 1, 16, &[0, 17, 40]);
    }

    fn check_attention(t: usize, nh: usize, nkv: usize, hd: usize, past_len: &[usize]) {
        let b = past_len.len();
        let val = |i: usize, salt: usize| (((i * 31 + salt * 17) % 97) as f32 - 48.0) / 40.0;
        // q|k|v rows of w floats per (sequence, position).
        let (d, kvd) = (nh * hd, nkv * hd);
        let w = d + 2 * kvd;
        let rows: Vec<f32> = (0..b * t * w).map(|i| val(i, 1)).collect();
        let at = |i: usize, j: usize, offset: usize| &rows[(i * t + j) * w + offset..][..hd];
        // Caches with three rows of NaN after their length, which must never be read.
        let cache = |n: usize, salt: usize| -> Vec<f32> {
            (0..(n + 3) * nkv * hd)
                .map(|i| if i < n * nkv * hd { val(i, salt) } else { f32::NAN })
                .collect()
        };
        let pk: Vec<Vec<f32>> = past_len.iter().map(|&n| cache(n, 4)).collect();
        let pv: Vec<Vec<f32>> = past_len.iter().map(|&n| cache(n, 5)).collect();
        // Query j of a sequence sees its cache and the new keys up to its own.
        let visible: Vec<usize> = (0..b)
            .flat_map(|i| (0..t).map(move |j| past_len[i] + j + 1))
            .collect();
        let att = Attention {
            qkv: &rows,
            past: &(0..b)
                .map(|i| Past {
                    k: &pk[i],
                    len: past_len[i],
                    v: &pv[i],
                })
                .collect::<Vec<_>>(),
            visible: &visible,
            queries: t,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 0.3,
        };
        let y = att.run();
        for i in 0..b {
            for j in 0..t {
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let mut keys = Vec::new();
                    let mut vals = Vec::new();
                    for p in 0..past_len[i] {
                        keys.push(pk[i][(p * nkv + g) * hd..][..hd].to_vec());
                        vals.push(pv[i][(p * nkv + g) * hd..][..hd].to_vec());
                    }
                    for jj in 0..=j {
                        keys.push(at(i, jj, d + g * hd).to_vec());
                        vals.push(at(i, jj, d + kvd + g * hd).to_vec());
                    }
                    let qv = at(i, j, h * hd);
                    let want = reference(qv, &keys, &vals, 0.3);
                    let got = &y[((i * t + j) * nh + h) * hd..][..hd];
                    for (a, w) in got.iter().zip(&want) {
                        assert!(
                            (*a as f64 - w).abs() < 1e-5,
                            "seq {i} query {j} head {h}: {a} vs {w}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn one_query_gives_the_block_kernels_bits_for_every_row() {
        // stories260K's shape (8 heads over 4 kv heads of 8 channels); half-empty lane vectors (4 heads); two
        // lane vectors and a last group of four value channels (12 heads of 12); 16 channels (two value groups);
        // multi-query attention (one kv head).
        check_one_query(8, 4, 8, 13, 5);
        check_one_query(4, 2, 8, 0, 6);
        check_one_query(12, 4, 12, 7, 4);
        check_one_query(6, 3, 16, 21, 3);
        check_one_query(8, 1, 8, 2, 9);
        // Two lane vectors of four-channel heads (as many lanes per position as stories260K's shape).
        check_one_query(16, 4, 4, 5, 3);
    }

    /// Runs T queries through the block kernel (one pass, as verification does) and each query j alone through
    /// [`OneQuery`] over the cache plus new keys 0..=j (as decoding does), and compares every float's bits.
    fn check_one_query(nh: usize, nkv: usize, hd: usize, past: usize, t: usize) {
        let val = |i: usize, salt: usize| (((i * 37 + salt * 11) % 101) as f32 - 50.0) / 23.0;
        let (d, kvd) = (nh * hd, nkv * hd);
        let w = d + 2 * kvd;
        let rows: Vec<f32> = (0..t * w).map(|i| val(i, 2)).collect();
        let pk: Vec<f32> = (0..past * kvd).map(|i| val(i, 3)).collect();
        let pv: Vec<f32> = (0..past * kvd).map(|i| val(i, 7)).collect();
        let visible: Vec<usize> = (0..t).map(|j| past + j + 1).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let att = Attention {
            qkv: &rows,
            past: &[Past {
                k: &pk,
                len: past,
                v: &pv,
            }],
            visible: &visible,
            queries: t,
            n_heads: nh,
            n_kv_heads: nkv,
            head_dim: hd,
            scale,
        };
        let mut many = Vec::new();
        att.run_serial(&mut many, &mut AttnScratch::default());
        // The same pass without fused multiply-adds (what an instruction set without them runs).
        let rep = nh / nkv;
        let mut blocks = vec![0f32; nh * t * hd];
        for (g, out) in blocks.chunks_exact_mut(rep * t * hd).enumerate() {
            att.block::<false>(0, g, out, &mut Scratch::default());
        }
        let mut many_plain = vec![0f32; t * d];
        att.interleave(&blocks, &mut many_plain);
        let mut lanes = HeadLanes::default();
        lanes.extend(&pk, &pv, nh, nkv, hd);
        let mut scratch = AttnScratch::default();
        let mut one = Vec::new();
        for j in 0..t {
            let row = &rows[j * w..][..w];
            lanes.extend(&row[d..d + kvd], &row[d + kvd..], nh, nkv, hd);
            assert_eq!(lanes.len(), past + j + 1);
            let query = OneQuery {
                q: &row[..d],
                kv: &lanes,
                n_heads: nh,
                head_dim: hd,
                scale,
            };
            query.run(&mut one, &mut scratch);
            let mut one_plain = vec![0f32; d];
            query.block::<pulp::Scalar, false>(pulp::Scalar, &mut one_plain, &mut Scratch::default());
            for (route, got, want) in [("dispatched", &one, &many), ("unfused", &one_plain, &many_plain)] {
                let want = &want[j * d..][..d];
                for (c, (a, b)) in got.iter().zip(want).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{route}: {nh} heads over {nkv}, head_dim {hd}, past {past}, query {j}, float {c}: {a} vs {b}"
                    );
                }
            }
        }
        // Truncating forgets positions as the cache does: the last query again over a re-extended copy.
        lanes.truncate(past);
        assert_eq!(lanes.len(), past);
        let new: Vec<&[f32]> = rows.chunks_exact(w).collect();
        for row in &new {
            lanes.extend(&row[d..d + kvd], &row[d + kvd..], nh, nkv, hd);
        }
        let last = one.clone();
        OneQuery {
            q: &new[t - 1][..d],
            kv: &lanes,
            n_heads: nh,
            head_dim: hd,
            scale,
        }
        .run(&mut one, &mut scratch);
        assert_eq!(one, last);
    }

    #[test]
    fn exp_is_accurate_and_saturates() {
        for (fused, exp) in [
            (false, exp_with::<false> as fn(f32) -> f32),
            (true, exp_with::<true>),
        ] {
            let mut worst = 0f64;
            for i in 0..=200_000 {
                let x = -87.0 + 175.0 * i as f64 / 200_000.0;
                let got = exp(x as f32) as f64;
                let want = (x as f32 as f64).exp();
                worst = worst.max((got - want).abs() / want);
            }
            assert!(worst < 4e-7, "fused {fused}: max relative error {worst}");
            assert_eq!(exp(0.0), 1.0);
            assert!(exp(-1e4) > 0.0 && exp(-1e4) < 1e-37);
            assert!(exp(1e4).is_finite());
            assert!(exp(f32::NAN).is_nan());
        }
    }

    #[test]
    fn swiglu_equals_the_formula() {
        // 9 rows of hidden 701: row chunks of 6 rows, and a tail after the last multiple of 8 in every row.
        let (rows, h) = (9usize, 701usize);
        let gu: Vec<f32> = (0..rows * 2 * h)
            .map(|i| ((i * 13 % 97) as f32 - 48.0) / 6.0)
            .collect();
        let t = Tensor::from_vec(gu.clone(), (rows, 2 * h), &Device::Cpu).unwrap();
        let got = t.apply_op1_no_bwd(&SwiGlu).unwrap();
        assert_eq!(got.dims(), &[rows, h]);
        let got = got.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        for r in 0..rows {
            for j in 0..h {
                let (g, u) = (gu[r * 2 * h + j] as f64, gu[r * 2 * h + h + j] as f64);
                let want = g * u / (1.0 + (-g).exp());
                let a = got[r * h + j] as f64;
                assert!(
                    (a - want).abs() <= 1e-6 * want.abs().max(1.0),
                    "{r},{j}: {a} vs {want}"
                );
            }
        }
        let odd = Tensor::zeros((2, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(odd.apply_op1_no_bwd(&SwiGlu).is_err());
    }

    #[test]
    fn rms_norm_rows_match_an_f64_reference() {
        // Widths with and without a tail after the last sixteen, one value alone, and SmolLM2's 576.
        for d in [1usize, 7, 16, 17, 33, 576, 577] {
            let rows = 3;
            let x: Vec<f32> = (0..rows * d)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let w: Vec<f32> = (0..d).map(|i| 0.5 + (i % 5) as f32 / 4.0).collect();
            let mut out = vec![9.0; 2];
            pulp::Arch::new().dispatch(RmsNormRows {
                x: &x,
                w: &w,
                eps: 1e-5,
                out: &mut out,
            });
            assert_eq!(out.len(), x.len());
            for r in 0..rows {
                let row = &x[r * d..(r + 1) * d];
                // ggml's order: each f32 square into one f64 running sum.
                let ss: f64 = row.iter().map(|&v| (v * v) as f64).sum();
                let lanes = sum_squares(row);
                assert!((lanes - ss).abs() <= 1e-12 * ss, "width {d}: {lanes} vs {ss}");
                let inv = 1.0 / (ss / d as f64 + 1e-5).sqrt();
                for j in 0..d {
                    let want = row[j] as f64 * inv * w[j] as f64;
                    let got = out[r * d + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * want.abs().max(1e-3),
                        "width {d}, {r},{j}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
