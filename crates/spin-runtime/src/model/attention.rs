//! Rotary embeddings and attention: the host rows the CPU kernel reads, and the stock candle route a GPU runs.

use super::cache::{KvUpdate, LayerKv, host_rows};
use super::weights::{Fused, Layer};
use super::{Model, Pass, RopeStyle};
use crate::error::Result;
use crate::kernels::{Attention, Past};
use candle_core::{CpuStorage, D, Storage, Tensor};

impl Model {
    /// A copy of q|k|v rows (one row of d + 2·kv_dim per position, position `pos[row]`) with the query and key
    /// heads rotated the way [`Model::rope`] rotates tensors; the values are copied as they are. Hand-written
    /// because the rows are already on the host for the attention kernel: candle's rotary ops would need q and k
    /// cut out, transposed and copied into tensors of their own first.
    pub(super) fn rope_rows(&self, src: &[f32], pos: &[u32]) -> Vec<f32> {
        let w = self.cfg.dim + 2 * self.cfg.kv_dim();
        let mut rows = Vec::with_capacity(src.len());
        for (row, &p) in src.chunks_exact(w).zip(pos) {
            // Copy a row and rotate it while it is in cache: one pass over the data.
            let start = rows.len();
            rows.extend_from_slice(row);
            self.rotate_row(&mut rows[start..], p as usize);
        }
        rows
    }

    /// Rotates, in place, the query and key heads at the front of one q|k|v row (position `p`); the values after
    /// them are left as they are.
    pub(super) fn rotate_row(&self, row: &mut [f32], p: usize) {
        let (hd, heads) = (self.cfg.head_dim(), self.cfg.n_heads + self.cfg.n_kv_heads);
        let half = hd / 2;
        let at = p * half;
        let (cos, sin) = (&self.cos_host[at..at + half], &self.sin_host[at..at + half]);
        for head in row[..heads * hd].chunks_exact_mut(hd) {
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

    /// The attention of one layer over the normed input `hn` (B, T, dim): q|k|v projections, rotary embeddings,
    /// causal grouped-query attention against the caches. Returns the heads' output (B, T, dim), before the
    /// output projection, and the layer's cache updates (one per sequence) when the pass has caches.
    pub(super) fn attention(
        &self,
        pass: &Pass<'_>,
        li: usize,
        layer: &Layer,
        fw: Option<&Fused>,
        hn: &Tensor,
    ) -> Result<(Tensor, Option<Vec<KvUpdate>>)> {
        let cfg = &self.cfg;
        let Pass {
            b,
            t,
            pos,
            visible,
            s_len,
            caches,
            mask,
            tables,
            ..
        } = *pass;
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim());
        let scale = 1.0 / (hd as f64).sqrt();
        let (d, kvd) = (cfg.dim, cfg.kv_dim());
        let m = b * t;
        let mut update = None;
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
                            &layer.wq.forward(hn)?,
                            &layer.wk.forward(hn)?,
                            &layer.wv.forward(hn)?,
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
                    past: &past,
                    visible,
                    queries: t,
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                    scale: scale as f32,
                }
                .run();
                if let Some((_, lens)) = &caches {
                    update = Some(host_rows(&rows, lens, t, d, kvd));
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
                        layer.wq.forward(hn)?,
                        layer.wk.forward(hn)?,
                        layer.wv.forward(hn)?,
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
                        update = Some(updates);
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
        Ok((y, update))
    }
}
