//! GGUF files of the Llama architecture with quantised weights (candle's quantised matmul), and the byte-level BPE
//! tokenizer such files embed.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, Model, Proj, RopeStyle, WeightSource, check_shape};
use crate::tokenizer::Tokenizer;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use std::path::Path;

/// Maps a Hugging Face Llama tensor name (without `.weight`) to its GGUF name.
fn gguf_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("model.layers.") {
        let (i, part) = rest.split_once('.').unwrap_or((rest, ""));
        let g = match part {
            "input_layernorm" => "attn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "post_attention_layernorm" => "ffn_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            other => other,
        };
        return format!("blk.{i}.{g}");
    }
    match name {
        "model.embed_tokens" => "token_embd".into(),
        "model.norm" => "output_norm".into(),
        "lm_head" => "output".into(),
        other => other.into(),
    }
}

struct GgufSource {
    what: String,
    content: gguf_file::Content,
    bytes: Vec<u8>,
    device: Device,
}

impl GgufSource {
    fn qtensor(&self, name: &str) -> Result<QTensor> {
        self.check_extent(name)?;
        let mut cur = std::io::Cursor::new(self.bytes.as_slice());
        self.content
            .tensor(&mut cur, name, &self.device)
            .map_err(|e| RuntimeError::format(format!("{}: {name}", self.what), e.to_string()))
    }
}

impl GgufSource {
    /// Checks a tensor's shape and byte range before candle reads it: candle reinterprets the raw bytes as blocks
    /// without checks, and an empty tensor (a zero dimension in a corrupt file) hands it a dangling, misaligned
    /// pointer (undefined behaviour, an abort in debug builds; found by the mutation test in tests/parsers.rs).
    fn check_extent(&self, name: &str) -> Result<()> {
        let what = format!("{}: {name}", self.what);
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| RuntimeError::format(&what, "tensor is missing"))?;
        let elems = info
            .shape
            .dims()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                RuntimeError::format(
                    &what,
                    format!("shape {:?} is empty or too large", info.shape.dims()),
                )
            })?;
        let block = info.ggml_dtype.block_size();
        if !elems.is_multiple_of(block) {
            return Err(RuntimeError::format(
                &what,
                format!("{elems} elements are not a whole number of {block}-element blocks"),
            ));
        }
        let end = (elems / block)
            .checked_mul(info.ggml_dtype.type_size())
            .and_then(|n| n.checked_add(usize::try_from(info.offset).ok()?))
            .and_then(|n| n.checked_add(self.content.tensor_data_offset as usize));
        match end {
            Some(end) if end <= self.bytes.len() => Ok(()),
            _ => Err(RuntimeError::format(
                &what,
                format!("extends past the end of the file ({} bytes)", self.bytes.len()),
            )),
        }
    }
}

impl WeightSource for GgufSource {
    fn dense(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let g = format!("{}.weight", gguf_name(name));
        let t = self.qtensor(&g)?.dequantize(&self.device)?;
        check_shape(&format!("{}: {g}", self.what), &t, shape)?;
        crate::load::check_finite_tensor(&self.what, &g, &t)?;
        Ok(t)
    }

    fn proj(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Proj> {
        let base = gguf_name(name);
        let g = format!("{base}.weight");
        let q = self.qtensor(&g)?;
        if q.shape().dims() != [out, inp] {
            return Err(RuntimeError::format(
                format!("{}: {g}", self.what),
                format!("expected shape {:?}, found {:?}", [out, inp], q.shape().dims()),
            ));
        }
        // Quantised blocks carry f16 scales that may be NaN: the matrix is dequantised once to check it (one
        // tensor at a time; the model keeps the quantised form).
        crate::load::check_finite_tensor(&self.what, &g, &q.dequantize(&Device::Cpu)?)?;
        let b = if bias {
            let name = format!("{base}.bias");
            let b = self.qtensor(&name)?.dequantize(&self.device)?;
            crate::load::check_finite_tensor(&self.what, &name, &b)?;
            Some(b)
        } else {
            None
        };
        Ok(Proj::Quant {
            w: QMatMul::from_qtensor(q)?,
            b,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.content
            .tensor_infos
            .contains_key(&format!("{}.weight", gguf_name(name)))
    }
}

fn meta<'a>(c: &'a gguf_file::Content, what: &str, key: &str) -> Result<&'a gguf_file::Value> {
    c.metadata
        .get(key)
        .ok_or_else(|| RuntimeError::format(what, format!("metadata {key} is missing")))
}

fn meta_usize(c: &gguf_file::Content, what: &str, key: &str) -> Result<usize> {
    let v = meta(c, what, key)?;
    let n = v
        .to_u64()
        .or_else(|_| v.to_u32().map(u64::from))
        .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
        .map_err(|e| RuntimeError::format(format!("{what}: {key}"), e.to_string()))?;
    Ok(n as usize)
}

fn meta_f64(c: &gguf_file::Content, what: &str, key: &str, default: f64) -> Result<f64> {
    match c.metadata.get(key) {
        None => Ok(default),
        Some(v) => v
            .to_f32()
            .map(f64::from)
            .or_else(|_| v.to_f64())
            .map_err(|e| RuntimeError::format(format!("{what}: {key}"), e.to_string())),
    }
}

fn read_content(path: &Path) -> Result<(gguf_file::Content, Vec<u8>)> {
    let bytes = crate::load::read_limited(path, crate::load::MAX_MODEL_BYTES, "model")?;
    let content = gguf_file::Content::read(&mut std::io::Cursor::new(bytes.as_slice()))
        .map_err(|e| RuntimeError::format(path.display().to_string(), e.to_string()))?;
    Ok((content, bytes))
}

/// Loads a Llama-architecture GGUF model; quantised matrices stay quantised, norms and embeddings are dequantised.
pub fn load(path: &Path, device: &Device) -> Result<Model> {
    let what = path.display().to_string();
    let (content, bytes) = read_content(path)?;
    let arch = meta(&content, &what, "general.architecture")?
        .to_string()
        .map_err(|e| RuntimeError::format(format!("{what}: general.architecture"), e.to_string()))?
        .clone();
    if arch != "llama" {
        return Err(RuntimeError::UnknownArchitecture(arch));
    }
    let dim = meta_usize(&content, &what, "llama.embedding_length")?;
    let n_heads = meta_usize(&content, &what, "llama.attention.head_count")?;
    let vocab_size = match content.tensor_infos.get("token_embd.weight") {
        Some(info) => match info.shape.dims() {
            [v, _] => *v,
            dims => {
                return Err(RuntimeError::format(
                    format!("{what}: token_embd.weight"),
                    format!("shape {dims:?} is not (vocab, dim)"),
                ));
            }
        },
        None => return Err(RuntimeError::format(&what, "tensor token_embd.weight is missing")),
    };
    let cfg = Config {
        vocab_size,
        dim,
        hidden_dim: meta_usize(&content, &what, "llama.feed_forward_length")?,
        n_layers: meta_usize(&content, &what, "llama.block_count")?,
        n_heads,
        n_kv_heads: meta_usize(&content, &what, "llama.attention.head_count_kv").unwrap_or(n_heads),
        max_seq_len: meta_usize(&content, &what, "llama.context_length")?,
        rms_eps: meta_f64(&content, &what, "llama.attention.layer_norm_rms_epsilon", 1e-5)?,
        rope_theta: meta_f64(&content, &what, "llama.rope.freq_base", 10000.0)?,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: !content.tensor_infos.contains_key("output.weight"),
    };
    cfg.validate()
        .map_err(|e| RuntimeError::format(format!("{what}: metadata"), e.to_string()))?;
    crate::load::check_limits(&cfg, &format!("{what}: metadata"))?;
    let src = GgufSource {
        what,
        content,
        bytes,
        device: device.clone(),
    };
    Model::from_source(cfg, &src, device)
}

/// Builds the tokenizer embedded in a GGUF file (`tokenizer.ggml.model` = `gpt2`: byte-level BPE).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let what = path.display().to_string();
    let (c, _) = read_content(path)?;
    let model = meta(&c, &what, "tokenizer.ggml.model")?
        .to_string()
        .cloned()
        .unwrap_or_default();
    if model != "gpt2" {
        return Err(RuntimeError::format(
            format!("{what}: tokenizer.ggml.model"),
            format!("{model:?} is not supported (expected gpt2)"),
        ));
    }
    let strings = |key: &str| -> Result<Vec<String>> {
        let v = meta(&c, &what, key)?
            .to_vec()
            .map_err(|e| RuntimeError::format(key, e.to_string()))?;
        v.iter()
            .map(|x| {
                x.to_string()
                    .cloned()
                    .map_err(|e| RuntimeError::format(key, e.to_string()))
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    let id = |key: &str| c.metadata.get(key).and_then(|v| v.to_u32().ok());
    let vocab: serde_json::Map<String, serde_json::Value> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), serde_json::Value::from(i as u32)))
        .collect();
    let added: Vec<serde_json::Value> = [
        id("tokenizer.ggml.bos_token_id"),
        id("tokenizer.ggml.eos_token_id"),
    ]
    .into_iter()
    .flatten()
    .filter_map(|i| tokens.get(i as usize).map(|t| (i, t)))
    .map(|(i, t)| {
        serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": true})
    })
    .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges, "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                  "byte_fallback": false},
    });
    let inner: tokenizers::Tokenizer = json
        .to_string()
        .parse()
        .map_err(|e: tokenizers::Error| RuntimeError::Tokenizer(format!("{what}: {e}")))?;
    Ok(Tokenizer::Hf {
        inner: Box::new(inner),
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
    })
}

/// Writes named tensors (Hugging Face layout) as a Llama GGUF file; matrices are quantised to `dtype`
/// (norms stay f32). For tests and exports. The config must use interleaved RoPE and no biases.
pub fn write(
    path: &Path,
    cfg: &Config,
    tensors: &std::collections::HashMap<String, Tensor>,
    dtype: GgmlDType,
) -> Result<()> {
    if cfg.rope != RopeStyle::Interleaved || cfg.qkv_bias {
        return Err(RuntimeError::invalid(
            "config",
            "GGUF llama holds only interleaved-RoPE Llama without biases",
        ));
    }
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut qs = Vec::new();
    for n in names {
        let t = &tensors[n];
        let base = n.trim_end_matches(".weight");
        let g = format!("{}.weight", gguf_name(base));
        let q = if t.rank() == 2 && t.dim(1)? % dtype.block_size() == 0 {
            QTensor::quantize(t, dtype)?
        } else {
            QTensor::quantize(t, GgmlDType::F32)?
        };
        qs.push((g, q));
    }
    use gguf_file::Value as V;
    let md: Vec<(&str, V)> = vec![
        ("general.architecture", V::String("llama".into())),
        ("llama.embedding_length", V::U32(cfg.dim as u32)),
        ("llama.feed_forward_length", V::U32(cfg.hidden_dim as u32)),
        ("llama.block_count", V::U32(cfg.n_layers as u32)),
        ("llama.attention.head_count", V::U32(cfg.n_heads as u32)),
        ("llama.attention.head_count_kv", V::U32(cfg.n_kv_heads as u32)),
        ("llama.context_length", V::U32(cfg.max_seq_len as u32)),
        (
            "llama.attention.layer_norm_rms_epsilon",
            V::F32(cfg.rms_eps as f32),
        ),
        ("llama.rope.freq_base", V::F32(cfg.rope_theta as f32)),
    ];
    let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).map_err(|e| RuntimeError::io(path, e))?;
    gguf_file::write(&mut f, &md_refs, &t_refs)?;
    Ok(())
}
