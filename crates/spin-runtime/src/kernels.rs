//! Two fused CPU kernels for the transformer's hot path that candle does not offer on the CPU: causal
//! grouped-query attention of a padded batch read straight from host KV caches, and the SwiGLU product silu(g)·u.
//!
//! Hand-written because, for the small per-head matrices of a verification batch, candle's route (copy every
//! cache into a padded tensor, two batched products, an additive mask, a softmax calling scalar `expf`) spends
//! most of its time in copies and per-call overhead. Here masked keys are never touched and the exponentials
//! come eight at a time from `wide::f32x8::exp`. Both split their work with rayon (the model calls them from
//! inside the pool).

use candle_core::{CpuStorage, CustomOp2, Layout, Shape};
use rayon::prelude::*;
use wide::f32x8;

fn contiguous<'a>(storage: &'a CpuStorage, layout: &Layout, op: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = storage else {
        candle_core::bail!("{op}: expected f32 input")
    };
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: input must be contiguous"),
    }
}

/// Softmax of a row in place; the row is not empty.
fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m8 = f32x8::splat(max);
    let (chunks, tail) = x.as_chunks_mut::<8>();
    let mut acc = f32x8::ZERO;
    for c in chunks.iter_mut() {
        let e = (f32x8::new(*c) - m8).exp();
        acc += e;
        *c = e.to_array();
    }
    let mut sum = acc.reduce_add();
    for v in tail.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// Keys and values a sequence's cache already holds for one layer, position-major (len, n_kv_heads, head_dim).
pub(crate) struct Past<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// Causal grouped-query attention of a padded batch, computed on the host in one pass: scores, prefix mask,
/// softmax and the weighted sum of values for every (sequence, query, head), reading each sequence's cached keys
/// in place. Replaces a padded copy of every cache, two batched products and a masked softmax per layer.
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
    /// One task per (sequence, kv head): its keys are gathered once, transposed, so that the scores of a query
    /// are `head_dim` vectorised passes over the keys (no horizontal sums), and every query head of the group
    /// reuses them.
    pub fn run(&self) -> Vec<f32> {
        let (t, nh, nkv, hd) = (self.queries, self.n_heads, self.n_kv_heads, self.head_dim);
        let rep = nh / nkv;
        let kvd = nkv * hd;
        let b = self.past.len();
        let blocks: Vec<Vec<f32>> = (0..b * nkv)
            .into_par_iter()
            .map(|task| {
                let (i, g) = (task / nkv, task % nkv);
                let past = &self.past[i];
                let np = past.k.len() / kvd;
                let n_max = (0..t).map(|j| self.visible[i * t + j]).max().unwrap_or(0);
                // Keys transposed (hd, n_max) and values (n_max, hd) of this kv head.
                let mut kt = vec![0f32; hd * n_max];
                let mut vb = vec![0f32; n_max * hd];
                for p in 0..n_max {
                    let (k, v) = if p < np {
                        let o = (p * nkv + g) * hd;
                        (&past.k[o..o + hd], &past.v[o..o + hd])
                    } else {
                        let j = p - np;
                        (
                            &self.k[((i * nkv + g) * t + j) * hd..][..hd],
                            &self.v[((i * t + j) * nkv + g) * hd..][..hd],
                        )
                    };
                    for (d, &x) in k.iter().enumerate() {
                        kt[d * n_max + p] = x;
                    }
                    vb[p * hd..(p + 1) * hd].copy_from_slice(v);
                }
                let mut out = vec![0f32; rep * t * hd];
                let mut scores = vec![0f32; n_max];
                for r in 0..rep {
                    let h = g * rep + r;
                    for j in 0..t {
                        let n = self.visible[i * t + j].min(n_max);
                        let q = &self.q[((i * nh + h) * t + j) * hd..][..hd];
                        let sc = &mut scores[..n];
                        sc.fill(0.0);
                        for (d, &qd) in q.iter().enumerate() {
                            let qd = qd * self.scale;
                            for (s, &k) in sc.iter_mut().zip(&kt[d * n_max..d * n_max + n]) {
                                *s += qd * k;
                            }
                        }
                        softmax_in_place(sc);
                        let o = &mut out[(r * t + j) * hd..][..hd];
                        let (oc, ot) = o.as_chunks_mut::<8>();
                        for (c, oc) in oc.iter_mut().enumerate() {
                            let mut acc = f32x8::ZERO;
                            for (p, &w) in sc.iter().enumerate() {
                                let v = &vb[p * hd + 8 * c..][..8];
                                acc = f32x8::splat(w).mul_add(f32x8::from(v), acc);
                            }
                            *oc = acc.to_array();
                        }
                        let done = hd - ot.len();
                        for (p, &w) in sc.iter().enumerate() {
                            for (o, &x) in ot.iter_mut().zip(&vb[p * hd + done..(p + 1) * hd]) {
                                *o += w * x;
                            }
                        }
                    }
                }
                out
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
        dst.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
            .for_each(|(out, (g, u))| {
                let (gc, gt) = g.as_chunks::<8>();
                let (uc, ut) = u.as_chunks::<8>();
                let (oc, ot) = out.as_chunks_mut::<8>();
                for ((gi, ui), oi) in gc.iter().zip(uc).zip(oc.iter_mut()) {
                    let g8 = f32x8::new(*gi);
                    *oi = (g8 * f32x8::new(*ui) / (f32x8::ONE + (-g8).exp())).to_array();
                }
                for ((gi, ui), oi) in gt.iter().zip(ut).zip(ot.iter_mut()) {
                    *oi = gi * ui / (1.0 + (-gi).exp());
                }
            });
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
        // Sequence 1 has one real token and two padded queries (which still see a prefix of the padded keys).
        let visible: Vec<usize> = (0..b)
            .flat_map(|i| (0..t).map(move |j| past_len[i] + j + 1))
            .collect();
        let att = Attention {
            q: &q,
            k: &k,
            v: &v,
            past: (0..b).map(|i| Past { k: &pk[i], v: &pv[i] }).collect(),
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
