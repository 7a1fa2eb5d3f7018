//! Where the weights come from and how they are kept: projections (dense or quantised), the named-tensor
//! source the loaders share, the fused and transposed copies of the CPU fast path, random weights for tests.

use super::{Config, Model};
use crate::error::{Result, RuntimeError};
use crate::quant::{BlockFormat, QMatrix};
use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{CpuStorage, DType, Device, Module, Storage, Tensor};
use std::sync::{Arc, OnceLock};

/// A linear projection y = x Wᵀ (+ b), with dense or quantised weights.
#[derive(Debug, Clone)]
pub(crate) enum Proj {
    Dense(candle_nn::Linear),
    /// candle's quantised matrix (a GGUF file on a GPU, or in a format the host kernels do not read).
    Quant {
        w: QMatMul,
        b: Option<Tensor>,
    },
    /// Rows of a host matrix in the file's block format (a GGUF file on the CPU): the quantised host route
    /// (`qhost.rs`) reads them; the candle route builds candle's form of them on first use.
    Host {
        w: HostRows,
        b: Option<Tensor>,
    },
}

/// The token embedding: a dense tensor, or a host matrix in the file's block format whose rows are dequantised
/// per looked-up token (a GGUF file on the CPU; SmolLM2's Q8_0 `token_embd` would be 113 MB as f32).
#[derive(Debug, Clone)]
pub(crate) enum Embedding {
    Dense(Tensor),
    Host(std::sync::Arc<QMatrix>),
}

impl Embedding {
    /// Rows (vocab) and width (dim).
    pub(super) fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            Embedding::Dense(t) => t.dims2()?,
            Embedding::Host(m) => (m.rows(), m.cols()),
        })
    }

    /// The rows of `ids` (B·T ids) as a (B, T, dim) tensor on `device`.
    pub(super) fn lookup(&self, ids: &Tensor, device: &Device) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        match self {
            Embedding::Dense(e) => Ok(e
                .index_select(&ids.flatten_all()?, 0)?
                .reshape((b, t, e.dim(1)?))?),
            Embedding::Host(m) => {
                let d = m.cols();
                let ids = ids.flatten_all()?.to_vec1::<u32>()?;
                let mut x = vec![0f32; ids.len() * d];
                for (row, &id) in x.chunks_exact_mut(d).zip(&ids) {
                    m.dequantize_row(id as usize, row);
                }
                Ok(Tensor::from_vec(x, (b, t, d), device)?)
            }
        }
    }

    /// The whole embedding as a dense f32 tensor (a copy for a host matrix).
    pub(super) fn dense(&self) -> Result<Tensor> {
        Ok(match self {
            Embedding::Dense(t) => t.clone(),
            Embedding::Host(m) => Tensor::from_vec(m.dequantize(), (m.rows(), m.cols()), &Device::Cpu)?,
        })
    }

    /// The tied output head over this embedding.
    pub(super) fn head(&self) -> Proj {
        match self {
            Embedding::Dense(t) => Proj::Dense(candle_nn::Linear::new(t.clone(), None)),
            Embedding::Host(m) => Proj::Host {
                w: HostRows::whole(m.clone()),
                b: None,
            },
        }
    }
}

impl Proj {
    /// The same projection with dense f32 weights (quantised ones dequantised once).
    pub(super) fn dequantized(&self) -> Result<Proj> {
        Ok(match self {
            Proj::Dense(l) => Proj::Dense(l.clone()),
            Proj::Quant { w, b } => {
                let weight = match w {
                    QMatMul::QTensor(q) => q.dequantize(&q.device())?,
                    QMatMul::Tensor(t) | QMatMul::TensorF16(t) => t.to_dtype(DType::F32)?,
                };
                Proj::Dense(candle_nn::Linear::new(weight, b.clone()))
            }
            Proj::Host { w, b } => Proj::Dense(candle_nn::Linear::new(w.dequantize()?, b.clone())),
        })
    }

    /// The host rows of a projection the quantised host route reads; `None` for others.
    pub(super) fn host(&self) -> Option<&HostRows> {
        match self {
            Proj::Host { w, .. } => Some(w),
            _ => None,
        }
    }

    /// The bias, if any.
    pub(super) fn bias(&self) -> Option<&Tensor> {
        match self {
            Proj::Dense(l) => l.bias(),
            Proj::Quant { b, .. } | Proj::Host { b, .. } => b.as_ref(),
        }
    }

    pub(super) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Proj::Dense(l) => l.forward(x)?,
            Proj::Quant { w, b } => {
                let y = w.forward(x)?;
                match b {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
            Proj::Host { w, b } => {
                let y = w.qmatmul()?.forward(x)?;
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
    /// Projections of one input width meant to be stacked (q|k|v, gate|up): `(name, out)` each, in order. A
    /// source may read them into one host matrix when their formats agree (GGUF on the CPU).
    fn projs(&self, parts: &[(&str, usize)], inp: usize, bias: bool) -> Result<Vec<Proj>> {
        parts
            .iter()
            .map(|&(name, out)| self.proj(name, out, inp, bias))
            .collect()
    }
    /// The token embedding `name.weight` of `shape` (vocab, dim); dense unless the source keeps host matrices.
    fn embedding(&self, name: &str, shape: &[usize]) -> Result<Embedding> {
        Ok(Embedding::Dense(self.dense(name, shape)?))
    }
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
pub(crate) struct Layer {
    pub(crate) attn_norm: Tensor,
    pub(crate) wq: Proj,
    pub(crate) wk: Proj,
    pub(crate) wv: Proj,
    pub(crate) wo: Proj,
    pub(crate) ffn_norm: Tensor,
    pub(crate) gate: Proj,
    pub(crate) up: Proj,
    pub(crate) down: Proj,
    /// The dense projections again, fused and transposed for the CPU fast path's candle route, built on first
    /// use (a decode that stays on the host path never needs them); holds `None` for quantised weights. Emptied
    /// when the weights change (training).
    pub(crate) fused: std::sync::OnceLock<Option<Fused>>,
}

impl Layer {
    /// The seven projections in the order a pass applies them.
    pub(crate) fn projs(&self) -> [&Proj; 7] {
        [
            &self.wq, &self.wk, &self.wv, &self.wo, &self.gate, &self.up, &self.down,
        ]
    }

    /// The seven projections, mutably, in the same order.
    pub(crate) fn projs_mut(&mut self) -> [&mut Proj; 7] {
        [
            &mut self.wq,
            &mut self.wk,
            &mut self.wv,
            &mut self.wo,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

impl Proj {
    /// The dense layer, or `None` for a quantised projection.
    pub(super) fn dense(&self) -> Option<candle_nn::Linear> {
        match self {
            Proj::Dense(l) => Some(l.clone()),
            Proj::Quant { .. } | Proj::Host { .. } => None,
        }
    }
}

impl Layer {
    /// q, k, v, o, gate, up, down as dense layers, in that order; `None` when any of them is quantised.
    pub(super) fn dense_projections(&self) -> Option<Vec<candle_nn::Linear>> {
        [
            &self.wq, &self.wk, &self.wv, &self.wo, &self.gate, &self.up, &self.down,
        ]
        .into_iter()
        .map(Proj::dense)
        .collect()
    }
}

/// One layer's dense projections as (in, out) contiguous matrices, q|k|v side by side and gate|up side by side:
/// two products instead of five for them, and the matrix multiply reads the weights in the order it wants
/// instead of repacking a transposed (out, in) matrix on every call (20–30 % of a product's time at 72 rows).
#[derive(Debug, Clone)]
pub(crate) struct Fused {
    /// (dim, dim + 2·kv_dim).
    pub(crate) qkv: Tensor,
    /// (dim + 2·kv_dim), with `qkv_bias`.
    pub(crate) qkv_bias: Option<Tensor>,
    /// (dim, dim).
    pub(crate) o: Tensor,
    /// (dim, 2·hidden_dim).
    pub(crate) gate_up: Tensor,
    /// (hidden_dim, dim).
    pub(crate) down: Tensor,
}

impl Fused {
    /// `None` when any projection is quantised.
    pub(super) fn of(layer: &Layer) -> Result<Option<Fused>> {
        let Some(l) = layer.dense_projections() else {
            return Ok(None);
        };
        let t = |w: &[&Tensor]| transpose_cat(w);
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

/// Runs `f` on a tensor's values as f32 without copying them when they are contiguous f32 on the CPU (the weights
/// of a loaded model), on a copy otherwise.
pub(crate) fn with_values<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    {
        let (storage, layout) = t.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) = (&*storage, layout.contiguous_offsets()) {
            return Ok(f(&v[a..b]));
        }
    }
    Ok(f(&t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
}

/// The (out, in) matrices `ws` stacked along out and transposed: one contiguous (in, Σ out) matrix.
/// Hand-written because candle's transposing copy goes element by element through a strided index, which made it
/// the largest cost of loading a small model (a few milliseconds of a process that should start in a few); here
/// each source row is read once and written as a column, in tiles that stay in cache.
pub(super) fn transpose_cat(ws: &[&Tensor]) -> Result<Tensor> {
    let inp = ws[0].dim(1)?;
    let out = transpose_cat_host(ws)?;
    let total = out.len() / inp.max(1);
    Ok(Tensor::from_vec(out, (inp, total), ws[0].device())?)
}

/// [`transpose_cat`] into a host vector, read straight from the tensors' storage (the only copy made).
pub(super) fn transpose_cat_host(ws: &[&Tensor]) -> Result<Vec<f32>> {
    transpose_cat_panels(ws, usize::MAX)
}

/// The (in, Σ out) matrix of [`transpose_cat_host`] cut into column panels of `panel` columns (the last one
/// narrower), each stored whole, one after the other: panel j holds rows 0..in of columns panel·j .. panel·j + w,
/// row-major with w floats a row. With `panel` ≥ Σ out this is [`transpose_cat_host`]'s layout; narrower panels
/// let a product walk each panel as one sequential stream (the host path's products, `host.rs`).
pub(super) fn transpose_cat_panels(ws: &[&Tensor], panel: usize) -> Result<Vec<f32>> {
    let inp = ws[0].dim(1)?;
    let mut rows = Vec::with_capacity(ws.len());
    for w in ws {
        let (r, cols) = w.dims2()?;
        if cols != inp {
            return Err(RuntimeError::invalid(
                "weights",
                format!("cannot stack a ({r}, {cols}) matrix beside width {inp}"),
            ));
        }
        rows.push(r);
    }
    // Values that are not contiguous f32 on the CPU are copied first; the others are read in place.
    let copies: Vec<Option<Vec<f32>>> = ws
        .iter()
        .map(|w| {
            if cpu_f32_range(w).is_some() {
                Ok(None)
            } else {
                Ok(Some(w.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?))
            }
        })
        .collect::<Result<_>>()?;
    let guards: Vec<_> = ws.iter().map(|w| w.storage_and_layout()).collect();
    let mut srcs: Vec<&[f32]> = Vec::with_capacity(ws.len());
    for ((w, copy), (storage, _)) in ws.iter().zip(&copies).zip(&guards) {
        let src = match (copy, &**storage, cpu_f32_range(w)) {
            (Some(c), _, _) => c.as_slice(),
            (None, Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => &v[a..b],
            _ => return Err(RuntimeError::invalid("weights", "storage changed while reading")),
        };
        srcs.push(src);
    }
    let total: usize = rows.iter().sum();
    // Channel c of (stacked) output column g goes to base[g] + c·width[g]: its panel's start, then row c of
    // that panel (computed once per column).
    let panel = panel.clamp(1, total.max(1));
    let place: Vec<(usize, usize)> = (0..total)
        .map(|g| {
            let start = g / panel * panel;
            (start * inp + g - start, panel.min(total - start))
        })
        .collect();
    let at = |c: usize, g: usize| {
        let (base, width) = place[g];
        base + c * width
    };
    // Transposed in 8 × 8 blocks held in registers: eight source rows are read contiguously and written as
    // columns, with the source bounds checked once per block row. The ragged edges (fewer than eight rows or
    // columns left) go value by value.
    const B: usize = 8;
    let mut out = vec![0f32; inp * total];
    let mut first = 0;
    for (src, &r) in srcs.iter().zip(&rows) {
        for i0 in (0..r).step_by(B) {
            let i1 = (i0 + B).min(r);
            for c0 in (0..inp).step_by(B) {
                let c1 = (c0 + B).min(inp);
                if i1 - i0 == B && c1 - c0 == B {
                    let mut block = [[0f32; B]; B];
                    for (k, row) in block.iter_mut().enumerate() {
                        row.copy_from_slice(&src[(i0 + k) * inp + c0..][..B]);
                    }
                    // The eight columns are consecutive in memory unless a panel ends between them.
                    let g = first + i0;
                    let together = place[g + B - 1].0 == place[g].0 + B - 1;
                    for c in 0..B {
                        if together {
                            let dst = &mut out[at(c0 + c, g)..][..B];
                            for (d, row) in dst.iter_mut().zip(&block) {
                                *d = row[c];
                            }
                        } else {
                            for (k, row) in block.iter().enumerate() {
                                out[at(c0 + c, g + k)] = row[c];
                            }
                        }
                    }
                } else {
                    for i in i0..i1 {
                        for c in c0..c1 {
                            out[at(c, first + i)] = src[i * inp + c];
                        }
                    }
                }
            }
        }
        first += r;
    }
    Ok(out)
}

/// The element range of a contiguous f32 CPU tensor within its storage; `None` for anything else.
fn cpu_f32_range(t: &Tensor) -> Option<(usize, usize)> {
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(CpuStorage::F32(_)) => layout.contiguous_offsets(),
        _ => None,
    }
}

/// cos/sin of position·θ^(−2i/head_dim) for every position and pair index i, (max_seq_len, head_dim/2) row-major.
pub(super) fn rope_tables(cfg: &Config) -> (Vec<f32>, Vec<f32>) {
    let half = cfg.head_dim() / 2;
    let mut cos = Vec::with_capacity(cfg.max_seq_len * half);
    let mut sin = Vec::with_capacity(cfg.max_seq_len * half);
    // The frequencies once, not once per position: the same values, without max_seq_len·half calls of powf.
    let freqs: Vec<f64> = (0..half)
        .map(|i| cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64))
        .collect();
    for p in 0..cfg.max_seq_len {
        for &freq in &freqs {
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

/// A random-weight model small enough for exact enumeration, the one the tests and benchmarks share: vocabulary 24,
/// width 32, hidden 48, 4 query and 2 key/value heads, at most 96 positions, tied embeddings; `n_layers` layers with
/// weights drawn by [`random_tensors`] with standard deviation `std` from `seed`, on `device`.
pub fn tiny_random_model(seed: u64, std: f64, n_layers: usize, device: &Device) -> Result<Model> {
    let cfg = Config {
        vocab_size: 24,
        dim: 32,
        hidden_dim: 48,
        n_layers,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 96,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: super::RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let tensors = random_tensors(&cfg, std, seed, device)?;
    model_from_tensors(cfg, tensors, device)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The blocked transpose against candle's own transposing copy, on shapes whose rows and columns are not
    /// multiples of the block (ragged edges), on a strided view (copied first) and on stacked matrices.
    #[test]
    fn transpose_cat_host_equals_candle_transpose_and_cat() -> Result<()> {
        let dev = Device::Cpu;
        let matrix = |r: usize, c: usize, salt: usize| -> Result<Tensor> {
            let v: Vec<f32> = (0..r * c).map(|i| (i * 31 + salt) as f32 * 0.25 - 7.0).collect();
            Ok(Tensor::from_vec(v, (r, c), &dev)?)
        };
        for (rows, inp) in [(1, 1), (8, 8), (13, 21), (5, 21), (16, 3), (9, 64)] {
            let a = matrix(rows, inp, 1)?;
            let b = matrix(rows + 3, inp, 2)?;
            let wide = matrix(inp, rows + 2, 3)?.t()?; // a (rows + 2, inp) view with strides: copied first
            let got = transpose_cat_host(&[&a, &b, &wide])?;
            let want = Tensor::cat(&[&a, &b, &wide.contiguous()?], 0)?
                .t()?
                .contiguous()?
                .flatten_all()?
                .to_vec1::<f32>()?;
            assert_eq!(got, want, "rows {rows}, in {inp}");
            // Panels of 8 columns (and a narrower last one): each panel is the same columns of `want`.
            let total = got.len() / inp;
            let panels = transpose_cat_panels(&[&a, &b, &wide], 8)?;
            let mut start = 0;
            for c0 in (0..total).step_by(8) {
                let w = (total - c0).min(8);
                for c in 0..inp {
                    assert_eq!(
                        panels[start + c * w..][..w],
                        want[c * total + c0..][..w],
                        "rows {rows}, in {inp}, panel at {c0}, row {c}"
                    );
                }
                start += w * inp;
            }
            assert_eq!(start, panels.len());
        }
        Ok(())
    }
}

/// The ggml type of a block format (the inverse of `BlockFormat::from_ggml`).
pub(crate) fn ggml_of(f: BlockFormat) -> GgmlDType {
    match f {
        BlockFormat::F32 => GgmlDType::F32,
        BlockFormat::F16 => GgmlDType::F16,
        BlockFormat::Q4_0 => GgmlDType::Q4_0,
        BlockFormat::Q4_1 => GgmlDType::Q4_1,
        BlockFormat::Q5_0 => GgmlDType::Q5_0,
        BlockFormat::Q5_1 => GgmlDType::Q5_1,
        BlockFormat::Q8_0 => GgmlDType::Q8_0,
        BlockFormat::Q4K => GgmlDType::Q4K,
        BlockFormat::Q5K => GgmlDType::Q5K,
        BlockFormat::Q6K => GgmlDType::Q6K,
    }
}

impl Model {
    /// Every host matrix of the model once, however many projections share it, in the order a pass reads them:
    /// the layers' projections, the output head, the embedding.
    fn host_matrices(&self) -> Vec<Arc<QMatrix>> {
        let projs = self.layers.iter().flat_map(|l| l.projs()).chain([&self.head]);
        let embed = match &self.embed {
            Embedding::Host(m) => Some(m),
            Embedding::Dense(_) => None,
        };
        let mut unique: Vec<Arc<QMatrix>> = Vec::new();
        for m in projs.filter_map(|p| p.host()).map(|h| &h.m).chain(embed) {
            if !unique.iter().any(|u| Arc::ptr_eq(u, m)) {
                unique.push(m.clone());
            }
        }
        unique
    }

    /// Whether the model has host matrices and all of them sit in a mapping advised for huge pages
    /// (`gather_host_matrices`; false where the system refused the advice).
    pub fn host_matrices_in_huge_pages(&self) -> bool {
        let ms = self.host_matrices();
        !ms.is_empty() && ms.iter().all(|m| m.in_huge_pages())
    }

    /// Copies every host matrix of the model (`host_matrices`) side by side into one buffer in huge pages
    /// (`QMatrix::side_by_side`), in the order a pass reads them, and points the projections at the copies. The
    /// old buffers are freed as the last reference to each goes. A GGUF file's matrices arrive in such a buffer
    /// already (the loader builds them there, `QMatrix::gathered`) and are left where they are; ones that arrive in
    /// the file's order are interleaved on the way (one write of each weight at load, not two).
    pub(super) fn gather_host_matrices(&mut self) {
        let unique = self.host_matrices();
        if unique.is_empty() || unique.iter().all(|m| m.in_huge_pages()) {
            return;
        }
        let refs: Vec<&QMatrix> = unique.iter().map(|m| &**m).collect();
        let copies: Vec<Arc<QMatrix>> = QMatrix::side_by_side(&refs).into_iter().map(Arc::new).collect();
        let copy_of = |m: &Arc<QMatrix>| -> Arc<QMatrix> {
            let i = unique.iter().position(|u| Arc::ptr_eq(u, m));
            // Every host matrix is in `unique`.
            i.map_or_else(|| m.clone(), |i| copies[i].clone())
        };
        let re = |p: &mut Proj| {
            if let Proj::Host { w, .. } = p {
                *w = w.on(copy_of(&w.m));
            }
        };
        for layer in &mut self.layers {
            for p in layer.projs_mut() {
                re(p);
            }
        }
        re(&mut self.head);
        if let Embedding::Host(m) = &mut self.embed {
            *m = copy_of(m);
        }
    }
}

/// Rows `first .. first + rows` of a host matrix that may be shared with the projections stacked beside it
/// (q|k|v, gate|up): what a quantised projection of a GGUF model on the CPU holds.
#[derive(Debug, Clone)]
pub(crate) struct HostRows {
    pub(crate) m: Arc<QMatrix>,
    pub(crate) first: usize,
    pub(crate) rows: usize,
    /// The same rows as candle's quantised matrix, for the candle route (built on first use: a model that stays
    /// on the host route never holds a second copy of its weights).
    candle: Arc<OnceLock<QMatMul>>,
}

impl HostRows {
    /// All rows of `m`.
    pub(crate) fn whole(m: Arc<QMatrix>) -> HostRows {
        let rows = m.rows();
        HostRows::part(m, 0, rows)
    }

    /// Rows `first .. first + rows` of `m` (the caller keeps them inside `m`).
    pub(crate) fn part(m: Arc<QMatrix>, first: usize, rows: usize) -> HostRows {
        HostRows {
            m,
            first,
            rows,
            candle: Arc::new(OnceLock::new()),
        }
    }

    /// Input width.
    pub(crate) fn cols(&self) -> usize {
        self.m.cols()
    }

    /// The same rows of `m`, a copy of this matrix (candle's form of them is rebuilt on first use).
    fn on(&self, m: Arc<QMatrix>) -> HostRows {
        HostRows::part(m, self.first, self.rows)
    }

    /// The block bytes of these rows as the file stores them.
    fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        self.m.file_rows(self.first, self.rows)
    }

    /// Whether these rows are the whole matrix.
    fn is_whole(&self) -> bool {
        self.first == 0 && self.rows == self.m.rows()
    }

    /// These rows as a matrix of their own (shared when they are the whole matrix, copied otherwise).
    pub(super) fn matrix(&self, what: &str) -> Result<Arc<QMatrix>> {
        if self.is_whole() {
            return Ok(self.m.clone());
        }
        let m = QMatrix::new(
            what,
            self.m.format(),
            self.rows,
            self.cols(),
            self.bytes().to_vec(),
        )?;
        Ok(Arc::new(m))
    }

    /// The rows as candle's quantised matrix on the CPU, built on first use.
    pub(crate) fn qmatmul(&self) -> Result<&QMatMul> {
        if self.candle.get().is_none() {
            let bytes = self.bytes();
            // candle reinterprets the bytes as blocks and asserts their alignment (at most that of an f32); a
            // `Vec<u8>` from the system allocator is aligned far beyond it, so this only guards the assertion.
            if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) {
                return Err(RuntimeError::invalid(
                    "weights",
                    "host matrix bytes are misaligned",
                ));
            }
            let storage = QStorage::from_data(bytes, &Device::Cpu, ggml_of(self.m.format()))?;
            let q = QTensor::new(storage, (self.rows, self.cols()))?;
            // Two threads may both build it; one result is kept, both are the same.
            let _ = self.candle.set(QMatMul::from_qtensor(q)?);
        }
        self.candle
            .get()
            .ok_or_else(|| RuntimeError::invalid("weights", "candle matrix missing"))
    }

    /// The rows dequantised to a dense (rows, cols) f32 tensor on the CPU.
    pub(crate) fn dequantize(&self) -> Result<Tensor> {
        let cols = self.cols();
        let mut out = vec![0f32; self.rows * cols];
        for (r, row) in out.chunks_exact_mut(cols).enumerate() {
            self.m.dequantize_row(self.first + r, row);
        }
        Ok(Tensor::from_vec(out, (self.rows, cols), &Device::Cpu)?)
    }
}
