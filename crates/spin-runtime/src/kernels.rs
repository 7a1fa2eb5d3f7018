//! Two fused CPU kernels for the transformer's hot path that candle does not offer on the CPU: causal
//! grouped-query attention of a padded batch read straight from host KV caches, and the SwiGLU product silu(g)·u.
//!
//! Hand-written because, for the small per-head matrices of a verification batch, candle's route (copy every
//! cache into a padded tensor, two batched products, an additive mask, a softmax calling scalar `expf`) spends
//! most of its time in copies and per-call overhead. Here masked keys are never touched and the exponentials
//! come from a branch-free polynomial. The loops are plain Rust compiled for the best instruction set the CPU
//! offers, chosen at run time by `pulp::Arch::dispatch` (AVX2 and FMA on x86-64-v3, SSE2 otherwise), with no
//! `unsafe` here. Both split their work with rayon (the model calls them from inside the pool).

use candle_core::{CpuStorage, CustomOp2, Layout, Shape};
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

/// e^x, branch-free so that the loops that call it vectorise.
///
/// Hand-written: `wide::f32x8::exp` handles NaN, infinities and overflow with masks on every call, is not inlined
/// into our loops and picks its instruction set at build time; a profile of a K = 16 verification pass spent a
/// quarter of its time there. Inputs are clamped to [−87, 88] (NaN stays NaN), where e^x is a normal f32 (softmax
/// arguments are ≤ 0 and anything below −87 adds less than 2⁻¹²⁵ to a sum of at least 1). Range reduction x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two
/// parts so that n·ln2 is exact), a degree-6 Taylor polynomial for e^r (truncation below 1.2e−7 relative), and
/// 2ⁿ built in the exponent bits. Tested against f64 to 4e−7 relative.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0; // 1.5·2²³: adding it rounds to an integer kept in the low mantissa bits
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // The low bits of t hold n in two's complement around ROUND's bit pattern; n + 127 is the biased exponent.
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    p * f32::from_bits(bits)
}

/// Σ x, eight independent partial sums (a sequential float sum does not vectorise).
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let (chunks, tail) = x.as_chunks::<8>();
    let mut acc = [0f32; 8];
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// Softmax of a row in place; the row is not empty.
#[inline(always)]
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let inv = 1.0 / sum(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// What a sequence's cache already holds for one layer: keys transposed (kv_dim rows of `cap` positions, row
/// g·head_dim + d for channel d of kv head g, the first `len` filled) and values position-major
/// (len, n_kv_heads, head_dim).
pub(crate) struct Past<'a> {
    pub kt: &'a [f32],
    pub cap: usize,
    pub len: usize,
    pub v: &'a [f32],
}

impl Past<'_> {
    /// No cached positions.
    pub const EMPTY: Past<'static> = Past {
        kt: &[],
        cap: 0,
        len: 0,
        v: &[],
    };
}

/// Causal grouped-query attention of a padded batch, computed on the host in one pass: scores, prefix mask,
/// softmax and the weighted sum of values for every (sequence, query, head), reading each sequence's cache as it is
/// stored. Replaces a padded copy of every cache, two batched products and a masked softmax per layer.
pub(crate) struct Attention<'a> {
    /// Queries after RoPE, (B, n_heads, T, head_dim).
    pub q: &'a [f32],
    /// New keys after RoPE, (B, n_kv_heads, T, head_dim).
    pub k: &'a [f32],
    /// New values, (B, T, n_kv_heads, head_dim).
    pub v: &'a [f32],
    /// Per sequence, what its cache held before this pass (empty slices when nothing).
    pub past: Vec<Past<'a>>,
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

impl Attention<'_> {
    /// The attention output (B, T, n_heads, head_dim), ready for the output projection.
    ///
    /// One task per (sequence, kv head): its keys are laid out transposed once, so that the scores of a query are
    /// `head_dim` vectorised passes over the keys (no horizontal sums), and every query head of the group reuses
    /// them.
    pub fn run(&self) -> Vec<f32> {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let b = self.past.len();
        let arch = pulp::Arch::new();
        let blocks: Vec<Vec<f32>> = (0..b * nkv)
            .into_par_iter()
            .map(|task| {
                arch.dispatch(Block {
                    att: self,
                    i: task / nkv,
                    g: task % nkv,
                })
            })
            .collect();
        let mut y = vec![0f32; b * t * nh * hd];
        for (task, block) in blocks.iter().enumerate() {
            let (i, g) = (task / nkv, task % nkv);
            for r in 0..rep {
                for j in 0..t {
                    let dst = ((i * t + j) * nh + g * rep + r) * hd;
                    y[dst..dst + hd].copy_from_slice(&block[(r * t + j) * hd..][..hd]);
                }
            }
        }
        y
    }

    /// The outputs (rep·T, head_dim) of the query heads that share kv head `g` in sequence `i`.
    #[inline(always)]
    fn block(&self, i: usize, g: usize) -> Vec<f32> {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let past = &self.past[i];
        let np = past.len;
        let n_max = (0..t).map(|j| self.visible[i * t + j]).max().unwrap_or(0);
        // Keys transposed (hd, stride) with rows padded to whole blocks of 32: the cached part is a copy of
        // contiguous rows, only the new keys are transposed here. Values are read in place.
        let stride = n_max.div_ceil(32) * 32;
        let mut kt = vec![0f32; hd * stride];
        for (d, row) in kt.chunks_exact_mut(stride).enumerate() {
            row[..np].copy_from_slice(&past.kt[(g * hd + d) * past.cap..][..np]);
            for (j, x) in row[np..n_max].iter_mut().enumerate() {
                *x = self.k[((i * nkv + g) * t + j) * hd + d];
            }
        }
        // Offset of the value of key p in `past.v` (p < np) or `self.v`.
        let voff = |p: usize| {
            if p < np {
                (p * nkv + g) * hd
            } else {
                ((i * t + p - np) * nkv + g) * hd
            }
        };
        let vsrc = |p: usize| if p < np { past.v } else { self.v };
        // With hd a multiple of 8, every value row starts on a chunk boundary of its slice.
        let (pchunks, _) = past.v.as_chunks::<8>();
        let (nchunks, _) = self.v.as_chunks::<8>();
        let vchunk = |p: usize, c: usize| {
            if p < np {
                &pchunks[voff(p) / 8 + c]
            } else {
                &nchunks[voff(p) / 8 + c]
            }
        };
        let (kt_blocks, _) = kt.as_chunks::<32>();
        let blocks_per_row = stride / 32;
        let mut out = vec![0f32; rep * t * hd];
        let mut scores = vec![0f32; stride];
        for r in 0..rep {
            let h = g * rep + r;
            for j in 0..t {
                let n = self.visible[i * t + j].min(n_max);
                let q = &self.q[((i * nh + h) * t + j) * hd..][..hd];
                // Scores 32 keys at a time, kept in registers across the head_dim products.
                let (sblocks, _) = scores.as_chunks_mut::<32>();
                for (c, sb) in sblocks.iter_mut().enumerate().take(n.div_ceil(32)) {
                    let mut acc = [0f32; 32];
                    for (d, &qd) in q.iter().enumerate() {
                        let kb = &kt_blocks[d * blocks_per_row + c];
                        for (a, &k) in acc.iter_mut().zip(kb) {
                            *a += qd * k;
                        }
                    }
                    for (s, a) in sb.iter_mut().zip(acc) {
                        *s = a * self.scale;
                    }
                }
                let sc = &mut scores[..n];
                softmax_in_place(sc);
                let o = &mut out[(r * t + j) * hd..][..hd];
                if hd.is_multiple_of(8) {
                    // Eight channels at a time, four independent sums over the keys (for latency).
                    let (oc, _) = o.as_chunks_mut::<8>();
                    for (c, oc) in oc.iter_mut().enumerate() {
                        let mut acc = [[0f32; 8]; 4];
                        let (quads, rest) = sc.as_chunks::<4>();
                        for (pq, ws) in quads.iter().enumerate() {
                            for (u, (&w, acc)) in ws.iter().zip(acc.iter_mut()).enumerate() {
                                let v = vchunk(4 * pq + u, c);
                                for (a, &x) in acc.iter_mut().zip(v) {
                                    *a += w * x;
                                }
                            }
                        }
                        for (u, &w) in rest.iter().enumerate() {
                            let v = vchunk(4 * quads.len() + u, c);
                            for (a, &x) in acc[0].iter_mut().zip(v) {
                                *a += w * x;
                            }
                        }
                        for (l, o) in oc.iter_mut().enumerate() {
                            *o = (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]);
                        }
                    }
                } else {
                    for (p, &w) in sc.iter().enumerate() {
                        for (o, &x) in o.iter_mut().zip(&vsrc(p)[voff(p)..voff(p) + hd]) {
                            *o += w * x;
                        }
                    }
                }
            }
        }
        out
    }
}

/// One (sequence, kv head) block of [`Attention::run`], compiled for the instruction set `pulp` picks. (A struct
/// rather than a closure: a closure reaches `dispatch` through a `FnOnce` shim that is not inlined, and the loops
/// then stay at the baseline instruction set.)
struct Block<'a, 'b> {
    att: &'a Attention<'b>,
    i: usize,
    g: usize,
}

impl pulp::WithSimd for Block<'_, '_> {
    type Output = Vec<f32>;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Vec<f32> {
        self.att.block(self.i, self.g)
    }
}

/// A chunk of [`SiluMul`], dispatched like [`Block`].
struct SiluRows<'a> {
    out: &'a mut [f32],
    g: &'a [f32],
    u: &'a [f32],
}

impl pulp::WithSimd for SiluRows<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        for ((o, &g), &u) in self.out.iter_mut().zip(self.g).zip(self.u) {
            *o = g * u / (1.0 + exp(-g));
        }
    }
}

/// silu(g) · u = g·u / (1 + e^(−g)), elementwise over two contiguous tensors of one shape.
pub(crate) struct SiluMul;

impl CustomOp2 for SiluMul {
    fn name(&self) -> &'static str {
        "silu-mul"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let g = contiguous(s1, l1, self.name())?;
        let u = contiguous(s2, l2, self.name())?;
        if l1.shape() != l2.shape() {
            candle_core::bail!("silu-mul: shapes {:?} and {:?} differ", l1.shape(), l2.shape());
        }
        let mut dst = vec![0f32; g.len()];
        const CHUNK: usize = 4096;
        let arch = pulp::Arch::new();
        dst.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(out, (g, u))| arch.dispatch(SiluRows { out, g, u }));
        Ok((CpuStorage::F32(dst), l1.shape().clone()))
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

    #[test]
    fn attention_equals_explicit_reference_with_caches_and_padding() {
        // 2 sequences, 3 queries each, 4 query heads over 2 kv heads, head_dim 12 (a tail after 8 lanes).
        let (b, t, nh, nkv, hd) = (2usize, 3usize, 4usize, 2usize, 12usize);
        let val = |i: usize, salt: usize| (((i * 31 + salt * 17) % 97) as f32 - 48.0) / 40.0;
        let q: Vec<f32> = (0..b * nh * t * hd).map(|i| val(i, 1)).collect();
        let k: Vec<f32> = (0..b * nkv * t * hd).map(|i| val(i, 2)).collect();
        let v: Vec<f32> = (0..b * t * nkv * hd).map(|i| val(i, 3)).collect();
        let past_len = [5usize, 0];
        let pk: Vec<Vec<f32>> = past_len
            .iter()
            .map(|&n| (0..n * nkv * hd).map(|i| val(i, 4)).collect())
            .collect();
        let pv: Vec<Vec<f32>> = past_len
            .iter()
            .map(|&n| (0..n * nkv * hd).map(|i| val(i, 5)).collect())
            .collect();
        // The cached keys as the cache stores them: transposed, with spare capacity.
        let caps = [8usize, 0];
        let pkt: Vec<Vec<f32>> = (0..b)
            .map(|i| {
                let mut kt = vec![f32::NAN; nkv * hd * caps[i]];
                for p in 0..past_len[i] {
                    for c in 0..nkv * hd {
                        kt[c * caps[i] + p] = pk[i][p * nkv * hd + c];
                    }
                }
                kt
            })
            .collect();
        // Sequence 1 has one real token and two padded queries (which still see a prefix of the padded keys).
        let visible: Vec<usize> = (0..b)
            .flat_map(|i| (0..t).map(move |j| past_len[i] + j + 1))
            .collect();
        let att = Attention {
            q: &q,
            k: &k,
            v: &v,
            past: (0..b)
                .map(|i| Past {
                    kt: &pkt[i],
                    cap: caps[i],
                    len: past_len[i],
                    v: &pv[i],
                })
                .collect(),
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
                        keys.push(k[((i * nkv + g) * t + jj) * hd..][..hd].to_vec());
                        vals.push(v[((i * t + jj) * nkv + g) * hd..][..hd].to_vec());
                    }
                    let qv = &q[((i * nh + h) * t + j) * hd..][..hd];
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
    fn exp_is_accurate_and_saturates() {
        let mut worst = 0f64;
        for i in 0..=200_000 {
            let x = -87.0 + 175.0 * i as f64 / 200_000.0;
            let got = exp(x as f32) as f64;
            let want = (x as f32 as f64).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 4e-7, "max relative error {worst}");
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(-1e4) > 0.0 && exp(-1e4) < 1e-37);
        assert!(exp(1e4).is_finite());
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn silu_mul_equals_the_formula() {
        let n = 8 * 700 + 5;
        let g: Vec<f32> = (0..n).map(|i| ((i * 13 % 97) as f32 - 48.0) / 6.0).collect();
        let u: Vec<f32> = (0..n).map(|i| ((i * 7 % 31) as f32 - 15.0) / 5.0).collect();
        let gt = Tensor::from_vec(g.clone(), n, &Device::Cpu).unwrap();
        let ut = Tensor::from_vec(u.clone(), n, &Device::Cpu).unwrap();
        let got = gt
            .apply_op2_no_bwd(&ut, &SiluMul)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        for i in 0..n {
            let (gi, ui) = (g[i] as f64, u[i] as f64);
            let want = gi * ui / (1.0 + (-gi).exp());
            assert!(
                (got[i] as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{i}: {} vs {want}",
                got[i]
            );
        }
        let short = Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(gt.apply_op2_no_bwd(&short, &SiluMul).is_err());
    }
}
