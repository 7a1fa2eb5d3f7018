//! llama2.c "v0" checkpoints (with grouped-query attention) and the llama2.c tokenizer format (`tok512.bin`).
//!
//! Checkpoint: 7 little-endian i32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
//! negative vocab size means a separate classifier follows), then f32 tensors layer-major by kind, then the RoPE
//! tables (ignored: we recompute them), then the classifier when unshared. Tokenizer: i32 max token length, then per
//! token an f32 merge score, an i32 byte length and the bytes.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, Model, RopeStyle, TensorMap, WeightSource};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

const HEADER_BYTES: usize = 7 * 4;

fn read_i32(b: &[u8], i: usize) -> i32 {
    i32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Parses the 7-field header; returns the config and whether the classifier is shared.
pub fn parse_header(bytes: &[u8], what: &str) -> Result<Config> {
    if bytes.len() < HEADER_BYTES {
        return Err(RuntimeError::format(
            what,
            format!("truncated: {} bytes, header needs 28", bytes.len()),
        ));
    }
    let names = [
        "dim",
        "hidden_dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "vocab_size",
        "seq_len",
    ];
    let mut v = [0usize; 7];
    let mut shared = true;
    for (i, name) in names.iter().enumerate() {
        let x = read_i32(bytes, i);
        let x = if i == 5 && x < 0 {
            shared = false;
            -(x as i64)
        } else {
            x as i64
        };
        if x <= 0 {
            return Err(RuntimeError::format(
                format!("{what}: header.{name}"),
                format!("{x} is not positive"),
            ));
        }
        v[i] = x as usize;
    }
    let cfg = Config {
        dim: v[0],
        hidden_dim: v[1],
        n_layers: v[2],
        n_heads: v[3],
        n_kv_heads: v[4],
        vocab_size: v[5],
        max_seq_len: v[6],
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: shared,
    };
    cfg.validate()
        .map_err(|e| RuntimeError::format(format!("{what}: header"), e.to_string()))?;
    Ok(cfg)
}

/// The tensors of a v0 file in file order: (name in the Hugging Face layout, per-layer shape, stacked over layers).
fn layout(cfg: &Config) -> Vec<(&'static str, Vec<usize>, bool)> {
    let (d, h, kv, v) = (cfg.dim, cfg.hidden_dim, cfg.kv_dim(), cfg.vocab_size);
    vec![
        ("model.embed_tokens.weight", vec![v, d], false),
        ("input_layernorm.weight", vec![d], true),
        ("self_attn.q_proj.weight", vec![d, d], true),
        ("self_attn.k_proj.weight", vec![kv, d], true),
        ("self_attn.v_proj.weight", vec![kv, d], true),
        ("self_attn.o_proj.weight", vec![d, d], true),
        ("post_attention_layernorm.weight", vec![d], true),
        ("mlp.gate_proj.weight", vec![h, d], true),
        ("mlp.down_proj.weight", vec![d, h], true),
        ("mlp.up_proj.weight", vec![h, d], true),
        ("model.norm.weight", vec![d], false),
    ]
}

fn expected_floats(cfg: &Config) -> usize {
    let body: usize = layout(cfg)
        .iter()
        .map(|(_, s, per_layer)| s.iter().product::<usize>() * if *per_layer { cfg.n_layers } else { 1 })
        .sum();
    let rope = 2 * cfg.max_seq_len * cfg.head_dim() / 2;
    let cls = if cfg.tied_embeddings {
        0
    } else {
        cfg.vocab_size * cfg.dim
    };
    body + rope + cls
}

/// Reads a llama2.c v0 checkpoint into a model on `device`.
pub fn load_checkpoint(path: &Path, device: &Device) -> Result<Model> {
    let bytes = std::fs::read(path).map_err(|e| RuntimeError::io(path, e))?;
    let what = path.display().to_string();
    let (cfg, map) = parse_checkpoint(&bytes, &what, device)?;
    Model::from_source(cfg, &map, device)
}

/// Parses checkpoint bytes into a config and named tensors.
pub(crate) fn parse_checkpoint(bytes: &[u8], what: &str, device: &Device) -> Result<(Config, TensorMap)> {
    let cfg = parse_header(bytes, what)?;
    let want = HEADER_BYTES + 4 * expected_floats(&cfg);
    if bytes.len() != want {
        let kind = if bytes.len() < want {
            "truncated"
        } else {
            "trailing bytes"
        };
        return Err(RuntimeError::format(
            what,
            format!("{kind}: {} bytes, the header implies {want}", bytes.len()),
        ));
    }
    let floats: Vec<f32> = bytes[HEADER_BYTES..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut off = 0usize;
    let mut tensors = HashMap::new();
    let mut take = |shape: &[usize]| -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let t = Tensor::from_slice(&floats[off..off + n], shape, device)?;
        off += n;
        Ok(t)
    };
    for (name, shape, per_layer) in layout(&cfg) {
        if per_layer {
            for i in 0..cfg.n_layers {
                tensors.insert(format!("model.layers.{i}.{name}"), take(&shape)?);
            }
        } else {
            tensors.insert(name.to_string(), take(&shape)?);
        }
    }
    let _rope = take(&[2 * cfg.max_seq_len * cfg.head_dim() / 2])?;
    if !cfg.tied_embeddings {
        tensors.insert("lm_head.weight".to_string(), take(&[cfg.vocab_size, cfg.dim])?);
    }
    Ok((
        cfg,
        TensorMap {
            what: what.to_string(),
            tensors,
            device: device.clone(),
        },
    ))
}

/// Writes named tensors (Hugging Face layout, as from [`crate::model::random_tensors`] or training) as a v0
/// checkpoint. The config must use interleaved RoPE, no biases, θ = 10000.
pub fn write_checkpoint(path: &Path, cfg: &Config, tensors: &HashMap<String, Tensor>) -> Result<()> {
    if cfg.rope != RopeStyle::Interleaved || cfg.qkv_bias || cfg.rope_theta != 10000.0 {
        return Err(RuntimeError::invalid(
            "config",
            "llama2.c v0 holds only interleaved-RoPE Llama without biases",
        ));
    }
    let map = TensorMap {
        what: "tensors".into(),
        tensors: tensors.clone(),
        device: Device::Cpu,
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + 4 * expected_floats(cfg));
    let vocab = if cfg.tied_embeddings {
        cfg.vocab_size as i32
    } else {
        -(cfg.vocab_size as i32)
    };
    for x in [cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads].map(|x| x as i32) {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&vocab.to_le_bytes());
    out.extend_from_slice(&(cfg.max_seq_len as i32).to_le_bytes());
    let mut push = |t: Tensor| -> Result<()> {
        for x in t.flatten_all()?.to_vec1::<f32>()? {
            out.extend_from_slice(&x.to_le_bytes());
        }
        Ok(())
    };
    for (name, shape, per_layer) in layout(cfg) {
        let base = name.trim_end_matches(".weight");
        if per_layer {
            for i in 0..cfg.n_layers {
                push(map.dense(&format!("model.layers.{i}.{base}"), &shape)?)?;
            }
        } else {
            push(map.dense(base, &shape)?)?;
        }
    }
    let half = cfg.head_dim() / 2;
    let mut re = Vec::with_capacity(cfg.max_seq_len * half);
    let mut im = Vec::with_capacity(cfg.max_seq_len * half);
    for p in 0..cfg.max_seq_len {
        for i in 0..half {
            let a = p as f64 * cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64);
            re.push(a.cos() as f32);
            im.push(a.sin() as f32);
        }
    }
    push(Tensor::new(re, &Device::Cpu)?)?;
    push(Tensor::new(im, &Device::Cpu)?)?;
    if !cfg.tied_embeddings {
        push(map.dense("lm_head", &[cfg.vocab_size, cfg.dim])?)?;
    }
    std::fs::write(path, out).map_err(|e| RuntimeError::io(path, e))
}

/// The llama2.c BPE tokenizer: scored pieces, byte fallback tokens `<0xXX>` at ids 3..=258, BOS 1, EOS 2.
#[derive(Debug, Clone)]
pub struct Llama2cTokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    lookup: HashMap<Vec<u8>, u32>,
    max_len: usize,
}

impl Llama2cTokenizer {
    /// BOS id.
    pub const BOS: u32 = 1;
    /// EOS id.
    pub const EOS: u32 = 2;

    /// Reads a tokenizer file holding exactly `vocab_size` entries.
    pub fn load(path: &Path, vocab_size: usize) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| RuntimeError::io(path, e))?;
        Self::parse(&bytes, vocab_size, &path.display().to_string())
    }

    /// Parses tokenizer bytes.
    pub fn parse(bytes: &[u8], vocab_size: usize, what: &str) -> Result<Self> {
        let trunc =
            |at: usize| RuntimeError::format(what, format!("truncated at byte {at} ({} bytes)", bytes.len()));
        if bytes.len() < 4 {
            return Err(trunc(0));
        }
        let max_len = read_i32(bytes, 0);
        if max_len <= 0 {
            return Err(RuntimeError::format(
                format!("{what}: max_token_length"),
                format!("{max_len} is not positive"),
            ));
        }
        let mut at = 4usize;
        let mut pieces = Vec::with_capacity(vocab_size);
        let mut scores = Vec::with_capacity(vocab_size);
        for i in 0..vocab_size {
            if at + 8 > bytes.len() {
                return Err(trunc(at));
            }
            let score = f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            let len = i32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
            at += 8;
            if len < 0 || len > max_len {
                return Err(RuntimeError::format(
                    format!("{what}: token[{i}].length"),
                    format!("{len} is outside 0..={max_len}"),
                ));
            }
            let len = len as usize;
            if at + len > bytes.len() {
                return Err(trunc(at));
            }
            pieces.push(bytes[at..at + len].to_vec());
            scores.push(score);
            at += len;
        }
        if at != bytes.len() {
            return Err(RuntimeError::format(
                what,
                format!("{} trailing bytes after {vocab_size} tokens", bytes.len() - at),
            ));
        }
        let lookup = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        Ok(Llama2cTokenizer {
            pieces,
            scores,
            lookup,
            max_len: max_len as usize,
        })
    }

    /// Serialises the tokenizer in the llama2.c format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = (self.max_len as i32).to_le_bytes().to_vec();
        for (p, s) in self.pieces.iter().zip(&self.scores) {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&(p.len() as i32).to_le_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Encodes text: optional BOS, a dummy leading space, code points (or their bytes as fallback tokens), then
    /// greedy merges of the adjacent pair with the highest score.
    pub fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        let mut out = Vec::new();
        if bos {
            out.push(Self::BOS);
        }
        if text.is_empty() {
            return out;
        }
        let mut ids: Vec<u32> = Vec::new();
        if let Some(&space) = self.lookup.get(b" ".as_slice()) {
            ids.push(space);
        }
        for ch in text.chars() {
            let mut buf = [0u8; 4];
            let s = ch.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(s) {
                Some(&id) => ids.push(id),
                None => ids.extend(s.iter().map(|&b| b as u32 + 3)),
            }
        }
        loop {
            let mut best: Option<(f32, usize, u32)> = None;
            for i in 0..ids.len().saturating_sub(1) {
                let mut joined = self.pieces[ids[i] as usize].clone();
                joined.extend_from_slice(&self.pieces[ids[i + 1] as usize]);
                if let Some(&id) = self.lookup.get(&joined) {
                    let score = self.scores[id as usize];
                    if best.is_none_or(|(s, _, _)| score > s) {
                        best = Some((score, i, id));
                    }
                }
            }
            match best {
                Some((_, i, id)) => {
                    ids[i] = id;
                    ids.remove(i + 1);
                }
                None => break,
            }
        }
        out.extend(ids);
        out
    }

    /// Decodes ids to text: special tokens are dropped, `<0xXX>` become raw bytes, a leading space after BOS (or at
    /// the start) is stripped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut prev = Self::BOS;
        for &id in ids {
            let Some(piece) = self.pieces.get(id as usize) else {
                continue;
            };
            if id < 3 {
                prev = id;
                continue;
            }
            if (3..259).contains(&id) && piece.len() == 6 && piece.starts_with(b"<0x") {
                bytes.push((id - 3) as u8);
            } else if prev == Self::BOS && piece.first() == Some(&b' ') {
                bytes.extend_from_slice(&piece[1..]);
            } else {
                bytes.extend_from_slice(piece);
            }
            prev = id;
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A tokenizer with the byte-fallback layout and the given extra pieces (for tests).
    pub fn from_pieces(extra: &[(&str, f32)]) -> Self {
        let mut pieces: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec(), b"</s>".to_vec()];
        let mut scores = vec![0.0f32; 3];
        for b in 0..=255u8 {
            pieces.push(format!("<0x{b:02X}>").into_bytes());
            scores.push(0.0);
        }
        for (p, s) in extra {
            pieces.push(p.as_bytes().to_vec());
            scores.push(*s);
        }
        let max_len = pieces.iter().map(|p| p.len()).max().unwrap_or(1);
        let lookup = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.clone(), i as u32))
            .collect();
        Llama2cTokenizer {
            pieces,
            scores,
            lookup,
            max_len,
        }
    }
}
