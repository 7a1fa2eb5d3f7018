//! Hugging Face model folders: `config.json` + `*.safetensors` (+ `tokenizer.json`), Llama and Qwen2 architectures.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, Model, RopeStyle, TensorMap};
use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

/// The `config.json` fields we read.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HfConfig {
    /// e.g. `["LlamaForCausalLM"]`.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// e.g. `llama`, `qwen2`.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Model width.
    pub hidden_size: usize,
    /// SwiGLU inner width.
    pub intermediate_size: usize,
    /// Blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (defaults to the query heads).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// The width of one attention head (defaults to `hidden_size / num_attention_heads`); any other width is
    /// refused (the model does not implement it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_theta")]
    pub rope_theta: f64,
    /// Whether the head shares the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// A restricted draft head (`crate::head_vocab`): the target's vocabulary size. The folder's safetensors then
    /// hold `head_vocab`, the V_d scored target ids (U32), and `vocab_size` is V_d + 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multispin_target_vocab_size: Option<usize>,
    /// RoPE scaling (`{"rope_type": "linear", "factor": 4.0}` and others): only none (null, absent or
    /// `rope_type` `default`) is implemented; others are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
    /// Beginning-of-sequence id (a number, a list of numbers or null); checked inside the vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bos_token_id: Option<serde_json::Value>,
    /// End-of-sequence id (a number, a list of numbers or null); checked inside the vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<serde_json::Value>,
    /// The feed-forward activation: `silu` (or its other name `swish`) is the SwiGLU the model implements; any
    /// other is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Llama: biases on the four attention projections, which the model does not implement (refused when true).
    /// Qwen2's q/k/v biases come with its architecture, not with this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Biases on the feed-forward projections: not implemented, refused when true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
    /// Sliding-window attention (Mistral; Qwen2 with `use_sliding_window`): each position sees only the last
    /// `sliding_window` keys. The model attends to every key, which is the same attention while a sequence is no
    /// longer than the window, so the context is capped at the window (a number, or null for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<serde_json::Value>,
    /// Qwen2: whether `sliding_window` applies (false in the released configs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_sliding_window: Option<bool>,
}

fn default_eps() -> f64 {
    1e-6
}

fn default_theta() -> f64 {
    10000.0
}

/// The two architectures we implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama: no projection biases.
    Llama,
    /// Qwen2: biases on q, k and v.
    Qwen2,
}

impl HfConfig {
    /// Which architecture the file names (`architectures[0]`, else `model_type`); unknown ones are an error, and so
    /// is a `model_type` that is unknown or another architecture than `architectures[0]`'s.
    pub fn arch(&self) -> Result<Arch> {
        let of_type = |t: &str| match t {
            "llama" | "mistral" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        };
        let by_type = match self.model_type.as_deref() {
            None => None,
            Some(t) => Some(of_type(t).ok_or_else(|| {
                RuntimeError::invalid(
                    "model_type",
                    format!("{t:?} is not supported (expected llama, mistral or qwen2)"),
                )
            })?),
        };
        let Some(name) = self.architectures.first() else {
            return by_type.ok_or_else(|| RuntimeError::UnknownArchitecture(String::new()));
        };
        let arch = match name.as_str() {
            "LlamaForCausalLM" | "MistralForCausalLM" => Arch::Llama,
            "Qwen2ForCausalLM" => Arch::Qwen2,
            other => match of_type(other) {
                Some(a) => a,
                None => return Err(RuntimeError::UnknownArchitecture(other.to_string())),
            },
        };
        match by_type {
            Some(t) if t != arch => Err(RuntimeError::invalid(
                "model_type",
                format!(
                    "{:?} is another architecture than architectures[0] {name:?}",
                    self.model_type.as_deref().unwrap_or_default()
                ),
            )),
            _ => Ok(arch),
        }
    }

    /// Refuses an activation other than SiLU and projection biases the architecture does not have (the model
    /// would ignore them and compute wrong logits).
    fn check_activation_and_biases(&self, arch: Arch) -> Result<()> {
        if let Some(act) = self.hidden_act.as_deref()
            && act != "silu"
            && act != "swish"
        {
            return Err(RuntimeError::invalid(
                "hidden_act",
                format!("{act:?} is not implemented (the feed-forward is SwiGLU: \"silu\")"),
            ));
        }
        if arch == Arch::Llama && self.attention_bias == Some(true) {
            return Err(RuntimeError::invalid(
                "attention_bias",
                "true: biases on Llama's attention projections are not implemented",
            ));
        }
        if self.mlp_bias == Some(true) {
            return Err(RuntimeError::invalid(
                "mlp_bias",
                "true: biases on the feed-forward projections are not implemented",
            ));
        }
        Ok(())
    }

    /// The attention window that applies (Mistral's `sliding_window`, or Qwen2's when `use_sliding_window` is
    /// true), if any; a window that is not a positive integer is refused.
    fn attention_window(&self, arch: Arch) -> Result<Option<usize>> {
        use serde_json::Value;
        let applies = match arch {
            Arch::Qwen2 => self.use_sliding_window == Some(true),
            Arch::Llama => {
                self.use_sliding_window != Some(false)
                    && (self.model_type.as_deref() == Some("mistral")
                        || self.architectures.first().map(String::as_str) == Some("MistralForCausalLM"))
            }
        };
        match &self.sliding_window {
            None | Some(Value::Null) => Ok(None),
            Some(_) if !applies => Ok(None),
            Some(v) => match v.as_u64() {
                Some(w) if w > 0 => Ok(Some(usize::try_from(w).unwrap_or(usize::MAX))),
                _ => Err(RuntimeError::invalid(
                    "sliding_window",
                    format!("{v} is not a positive number of positions (or null)"),
                )),
            },
        }
    }

    /// Refuses RoPE scaling (the model would ignore it and compute wrong logits) and BOS/EOS ids outside the
    /// vocabulary (the target's, for a restricted draft head).
    fn check_rope_and_ids(&self) -> Result<()> {
        use serde_json::Value;
        match &self.rope_scaling {
            None | Some(Value::Null) => {}
            Some(v) => {
                let kind = v
                    .get("rope_type")
                    .or_else(|| v.get("type"))
                    .and_then(Value::as_str);
                if kind != Some("default") {
                    return Err(RuntimeError::invalid(
                        "rope_scaling",
                        format!(
                            "{} scaling is not implemented (only null, or rope_type \"default\")",
                            kind.map_or_else(|| "this".to_string(), |k| format!("{k:?}"))
                        ),
                    ));
                }
            }
        }
        let vocab = self.multispin_target_vocab_size.unwrap_or(self.vocab_size);
        for (key, v) in [
            ("bos_token_id", &self.bos_token_id),
            ("eos_token_id", &self.eos_token_id),
        ] {
            let ids = match v {
                None | Some(Value::Null) => continue,
                Some(Value::Array(xs)) => xs.iter().collect(),
                Some(x) => vec![x],
            };
            for id in ids {
                match id.as_u64() {
                    Some(n) if n < vocab as u64 => {}
                    Some(n) => {
                        return Err(RuntimeError::invalid(
                            key,
                            format!("{n} is outside the vocabulary of {vocab} tokens"),
                        ));
                    }
                    None => {
                        return Err(RuntimeError::invalid(key, format!("{id} is not a token id")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Our model configuration.
    pub fn to_config(&self) -> Result<Config> {
        let arch = self.arch()?;
        self.check_activation_and_biases(arch)?;
        let window = self.attention_window(arch)?;
        let cfg = Config {
            vocab_size: self.vocab_size,
            dim: self.hidden_size,
            hidden_dim: self.intermediate_size,
            n_layers: self.num_hidden_layers,
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_key_value_heads.unwrap_or(self.num_attention_heads),
            // Full attention equals the windowed one up to the window's length.
            max_seq_len: window.map_or(self.max_position_embeddings, |w| {
                w.min(self.max_position_embeddings)
            }),
            rms_eps: self.rms_norm_eps,
            rope_theta: self.rope_theta,
            rope: RopeStyle::Halves,
            qkv_bias: arch == Arch::Qwen2,
            tied_embeddings: self.tie_word_embeddings,
        };
        cfg.validate()
            .map_err(|e| RuntimeError::format("config.json", e.to_string()))?;
        crate::limits::check_limits(&cfg, "config.json")?;
        if let Some(h) = self.head_dim
            && h != cfg.head_dim()
        {
            return Err(RuntimeError::invalid(
                "head_dim",
                format!(
                    "{h} is not hidden_size / num_attention_heads = {}: other head widths are not implemented",
                    cfg.head_dim()
                ),
            ));
        }
        self.check_rope_and_ids()?;
        Ok(cfg)
    }
}

/// Parses the bytes of a `config.json` into our configuration (validated and within the limits of
/// [`crate::limits::check_limits`]); `what` names the file in errors.
pub fn parse_config(bytes: &[u8], what: &str) -> Result<Config> {
    let hf: HfConfig =
        serde_json::from_slice(bytes).map_err(|e| RuntimeError::format(what, e.to_string()))?;
    hf.to_config()
}

/// Loads a model folder (`config.json` and every `*.safetensors` in it).
pub fn load_dir(dir: &Path, device: &Device) -> Result<Model> {
    let (cfg, tensors, head) = read_dir(dir)?;
    let map = TensorMap {
        what: dir.display().to_string(),
        tensors,
        device: device.clone(),
    };
    let model = Model::from_source(cfg, &map, device)?;
    match head {
        None => Ok(model),
        Some(hv) => model
            .with_head_vocab(hv)
            .map_err(|e| RuntimeError::format(dir.display().to_string(), e.to_string())),
    }
}

/// A model folder's configuration, its tensors (on the CPU, each checked finite) and, for a restricted draft
/// head, the head's map: what [`load_dir`] builds a model from, and what `crate::gguf::write_from_dir` writes as GGUF.
pub fn read_dir(
    dir: &Path,
) -> Result<(
    Config,
    HashMap<String, Tensor>,
    Option<crate::head_vocab::HeadVocab>,
)> {
    let cfg_path = dir.join("config.json");
    let what = cfg_path.display().to_string();
    let bytes = crate::limits::read_limited(&cfg_path, crate::limits::MAX_CONFIG_BYTES, "config.json")?;
    let hf: HfConfig =
        serde_json::from_slice(&bytes).map_err(|e| RuntimeError::format(&what, e.to_string()))?;
    let cfg = hf.to_config()?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| RuntimeError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(RuntimeError::format(
            dir.display().to_string(),
            "no *.safetensors file",
        ));
    }
    let mut tensors = HashMap::new();
    let mut head_ids = None;
    for f in &files {
        let bytes = crate::limits::read_limited(f, crate::limits::MAX_MODEL_BYTES, "model")?;
        let mut part = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| RuntimeError::format(f.display().to_string(), e.to_string()))?;
        if let Some(ids) = part.remove(HEAD_VOCAB_TENSOR) {
            let ids = ids
                .to_dtype(candle_core::DType::U32)
                .and_then(|t| t.flatten_all()?.to_vec1::<u32>());
            head_ids = Some(ids.map_err(|e| {
                RuntimeError::format(format!("{}: {HEAD_VOCAB_TENSOR}", f.display()), e.to_string())
            })?);
        }
        for (name, t) in &part {
            crate::limits::check_finite_tensor(&f.display().to_string(), name, t)?;
        }
        tensors.extend(part);
    }
    // An untied head must be in the files: the model would otherwise fall back to the embedding.
    if !cfg.tied_embeddings && !tensors.contains_key("lm_head.weight") {
        return Err(RuntimeError::format(
            what,
            "tie_word_embeddings is false (or absent) but no safetensors file holds lm_head.weight",
        ));
    }
    match (hf.multispin_target_vocab_size, head_ids) {
        (None, None) => Ok((cfg, tensors, None)),
        (Some(full), _) if full > crate::limits::MAX_VOCAB => Err(RuntimeError::format(
            dir.join("config.json").display().to_string(),
            format!(
                "multispin_target_vocab_size: {full} exceeds the vocabulary limit of {}",
                crate::limits::MAX_VOCAB
            ),
        )),
        (Some(full), Some(ids)) => {
            let hv = crate::head_vocab::HeadVocab::new(ids, full)
                .map_err(|e| RuntimeError::format(dir.display().to_string(), e.to_string()))?;
            Ok((cfg, tensors, Some(hv)))
        }
        (Some(_), None) => Err(RuntimeError::format(
            dir.display().to_string(),
            format!(
                "config.json names a target vocabulary but no safetensors file holds {HEAD_VOCAB_TENSOR}"
            ),
        )),
        (None, Some(_)) => Err(RuntimeError::format(
            what,
            format!(
                "a safetensors file holds {HEAD_VOCAB_TENSOR} but multispin_target_vocab_size is missing"
            ),
        )),
    }
}

/// The tensor of a restricted draft head's scored target ids in a model folder's safetensors.
pub const HEAD_VOCAB_TENSOR: &str = "head_vocab";

/// Writes a model folder for a draft with a restricted head (`crate::head_vocab`): [`write_dir`]'s files with the
/// head's target ids as the [`HEAD_VOCAB_TENSOR`] tensor and the target's vocabulary size in `config.json`.
/// `cfg.vocab_size` must be the head's compact vocabulary.
pub fn write_draft_dir(
    dir: &Path,
    cfg: &Config,
    tensors: &HashMap<String, Tensor>,
    hv: &crate::head_vocab::HeadVocab,
) -> Result<()> {
    if cfg.vocab_size != hv.compact_vocab() {
        return Err(RuntimeError::invalid(
            "vocab_size",
            format!("{} is not the head's {} ids", cfg.vocab_size, hv.compact_vocab()),
        ));
    }
    if cfg.rope != RopeStyle::Halves || cfg.qkv_bias {
        return Err(RuntimeError::invalid(
            "config",
            "a model folder's Llama uses half-split RoPE and no biases",
        ));
    }
    let mut all = tensors.clone();
    all.insert(
        HEAD_VOCAB_TENSOR.into(),
        Tensor::from_slice(hv.ids(), hv.ids().len(), &Device::Cpu)?,
    );
    write_folder(dir, cfg, Arch::Llama, &all, Some(hv.full_vocab()))
}

/// Writes a model folder: `config.json` from `cfg` and one `model.safetensors` (for tests and exports).
pub fn write_dir(dir: &Path, cfg: &Config, arch: Arch, tensors: &HashMap<String, Tensor>) -> Result<()> {
    write_folder(dir, cfg, arch, tensors, None)
}

fn write_folder(
    dir: &Path,
    cfg: &Config,
    arch: Arch,
    tensors: &HashMap<String, Tensor>,
    target_vocab: Option<usize>,
) -> Result<()> {
    let hf = HfConfig {
        architectures: vec![match arch {
            Arch::Llama => "LlamaForCausalLM".into(),
            Arch::Qwen2 => "Qwen2ForCausalLM".into(),
        }],
        model_type: Some(match arch {
            Arch::Llama => "llama".into(),
            Arch::Qwen2 => "qwen2".into(),
        }),
        hidden_size: cfg.dim,
        intermediate_size: cfg.hidden_dim,
        num_hidden_layers: cfg.n_layers,
        num_attention_heads: cfg.n_heads,
        num_key_value_heads: Some(cfg.n_kv_heads),
        head_dim: Some(cfg.head_dim()),
        vocab_size: cfg.vocab_size,
        max_position_embeddings: cfg.max_seq_len,
        rms_norm_eps: cfg.rms_eps,
        rope_theta: cfg.rope_theta,
        tie_word_embeddings: cfg.tied_embeddings,
        multispin_target_vocab_size: target_vocab,
        rope_scaling: None,
        bos_token_id: None,
        eos_token_id: None,
        hidden_act: Some("silu".into()),
        attention_bias: None,
        mlp_bias: None,
        sliding_window: None,
        use_sliding_window: None,
    };
    std::fs::create_dir_all(dir).map_err(|e| RuntimeError::io(dir, e))?;
    let p = dir.join("config.json");
    let json =
        serde_json::to_string_pretty(&hf).map_err(|e| RuntimeError::format("config.json", e.to_string()))?;
    std::fs::write(&p, json).map_err(|e| RuntimeError::io(&p, e))?;
    candle_core::safetensors::save(tensors, dir.join("model.safetensors"))?;
    Ok(())
}
