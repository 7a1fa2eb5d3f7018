//! Per-sequence KV caches that a rejection can truncate: host vectors on the CPU fast path, device tensors
//! elsewhere, and the updates a forward pass commits to them only once it has succeeded.

use super::Model;
use crate::error::{Result, RuntimeError};
use crate::kernels::{AttnScratch, HeadLanes, KvPanels};
use candle_core::{DType, Tensor};

/// The keys and values one sequence has seen, per layer.
#[derive(Debug, Clone)]
pub struct KvCache {
    pub(super) layers: Vec<LayerKv>,
    pub(super) len: usize,
    pub(super) kv_dim: usize,
    /// Buffers of the host path's steps for this sequence (empty until it takes one).
    pub(super) host: HostBuffers,
}

/// One layer of a [`KvCache`].
#[derive(Debug, Clone)]
pub(super) enum LayerKv {
    /// Host vectors of keys and values, both position-major `(len, n_kv_heads, head_dim)`: appending copies only
    /// the new rows, truncating only shortens.
    Host { k: Vec<f32>, v: Vec<f32> },
    /// Device tensors `(n_kv_heads, len, head_dim)`, `None` while empty.
    Device(Option<(Tensor, Tensor)>),
}

/// A group's per-sequence logits and its cache updates per layer and sequence.
pub(super) type GroupPass = (Vec<Tensor>, Vec<Vec<KvUpdate>>);

/// What one forward pass adds to one sequence's cache layer, committed only after the whole pass succeeds.
pub(super) enum KvUpdate {
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

    /// Makes room for `additional` more positions in the host vectors (keys, values and the quantised route's key
    /// panels), so that a pass appending them moves nothing. A cache that grows step by step gets this room by
    /// doubling; a fresh copy of a cache (`clone` allocates exactly what is held) would otherwise copy every layer
    /// on its next pass, which is what `multispin measure pass-cost` must not time.
    pub fn reserve(&mut self, additional: usize) {
        for entry in &mut self.layers {
            if let LayerKv::Host { k, v } = entry {
                k.reserve(additional * self.kv_dim);
                v.reserve(additional * self.kv_dim);
            }
        }
        for p in &mut self.host.panels {
            p.reserve(additional);
        }
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
        self.host.truncate(len);
        self.len = len;
        Ok(())
    }
}

/// The new rows each sequence appends to a host cache layer, position-major, cut from the rotated q|k|v rows
/// (B·T rows of d + 2·kv_dim: queries, keys, values); sequence i keeps its first `lens[i]` positions.
pub(super) fn host_rows(rows: &[f32], lens: &[usize], t: usize, d: usize, kvd: usize) -> Vec<KvUpdate> {
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

impl Model {
    /// The padded keys and values of layer `li` for device caches, with tensor ops (per sequence: concatenate,
    /// pad, then stack): sequence i's keys are [its cache | its new tokens | zeros up to `s_len`]. `k` and `v` are
    /// the new keys and values (B, nkv, T, hd), contiguous. Returns K transposed (B, nkv, hd, S), V (B, nkv, S, hd)
    /// and the extended caches.
    pub(super) fn device_keys(
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

/// The working buffers of a host step, kept in the sequence's [`KvCache`] so that steps after the first
/// allocate nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostBuffers {
    /// Residual stream (T, dim).
    pub(super) x: Vec<f32>,
    /// Normed residual (T, dim).
    pub(super) xb: Vec<f32>,
    /// q|k|v rows (T, dim + 2·kv_dim).
    pub(super) qkv: Vec<f32>,
    /// Attention output (T, dim).
    pub(super) att: Vec<f32>,
    /// gate|up rows (T, 2·hidden_dim).
    pub(super) gate_up: Vec<f32>,
    /// SwiGLU product (T, hidden_dim).
    pub(super) hidden: Vec<f32>,
    /// Logits (T, vocab).
    pub(super) logits: Vec<f32>,
    /// Keys visible to each query.
    pub(super) visible: Vec<usize>,
    pub(super) attn: AttnScratch,
    /// Per layer, the cache's keys and values again in the layout of one-token steps ([`HeadLanes`]), extended
    /// from the cache when such a step needs them and cut when the cache is truncated.
    pub(super) lanes: Vec<HeadLanes>,
    /// Per layer, the cache's keys and values again in the per-head layouts the quantised host route's attention
    /// reads ([`KvPanels`]), extended from the cache as a pass needs them and cut when the cache is truncated.
    pub(super) panels: Vec<KvPanels>,
}

impl HostBuffers {
    /// Forgets the other layouts' positions from `len` on (the cache was truncated to `len`).
    pub(super) fn truncate(&mut self, len: usize) {
        for l in &mut self.lanes {
            l.truncate(len);
        }
        for p in &mut self.panels {
            p.truncate(len);
        }
    }
}
