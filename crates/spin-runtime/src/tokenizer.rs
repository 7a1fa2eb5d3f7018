//! One tokenizer type over the three formats we read: llama2.c `tok512.bin`, Hugging Face `tokenizer.json`, and the
//! byte-level BPE vocabulary embedded in GGUF files.

use crate::error::{Result, RuntimeError};
use crate::llama2c::Llama2cTokenizer;

/// A tokenizer and its special tokens.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// llama2.c format (SentencePiece-style scores with byte fallback).
    Llama2c(Llama2cTokenizer),
    /// A `tokenizers` pipeline (from tokenizer.json or built from a GGUF vocabulary).
    Hf {
        /// The pipeline.
        inner: Box<tokenizers::Tokenizer>,
        /// Beginning-of-sequence id, if the model uses one.
        bos: Option<u32>,
        /// End-of-sequence id, if known.
        eos: Option<u32>,
    },
}

impl Tokenizer {
    /// Encodes `text`, prepending BOS when `bos` is set and the tokenizer has one.
    pub fn encode(&self, text: &str, bos: bool) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Llama2c(t) => Ok(t.encode(text, bos)),
            Tokenizer::Hf { inner, bos: b, .. } => {
                let enc = inner
                    .encode(text, false)
                    .map_err(|e| RuntimeError::Tokenizer(e.to_string()))?;
                let mut out = Vec::new();
                if let (true, Some(b)) = (bos, b) {
                    out.push(*b);
                }
                out.extend_from_slice(enc.get_ids());
                Ok(out)
            }
        }
    }

    /// Decodes ids to text, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Llama2c(t) => Ok(t.decode(ids)),
            Tokenizer::Hf { inner, .. } => inner
                .decode(ids, true)
                .map_err(|e| RuntimeError::Tokenizer(e.to_string())),
        }
    }

    /// Beginning-of-sequence id, if any.
    pub fn bos(&self) -> Option<u32> {
        match self {
            Tokenizer::Llama2c(_) => Some(Llama2cTokenizer::BOS),
            Tokenizer::Hf { bos, .. } => *bos,
        }
    }

    /// End-of-sequence id, if any.
    pub fn eos(&self) -> Option<u32> {
        match self {
            Tokenizer::Llama2c(_) => Some(Llama2cTokenizer::EOS),
            Tokenizer::Hf { eos, .. } => *eos,
        }
    }

    /// Reads `tokenizer.json`; BOS/EOS are looked up among common names.
    pub fn from_hf_file(path: &std::path::Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| RuntimeError::Tokenizer(format!("{}: {e}", path.display())))?;
        let find = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let bos = find(&["<s>", "<|begin_of_text|>", "<|im_start|>"]);
        let eos = find(&["</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"]);
        Ok(Tokenizer::Hf {
            inner: Box::new(inner),
            bos,
            eos,
        })
    }
}
