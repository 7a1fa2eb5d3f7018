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
        /// Whether a prompt starts with BOS (a GGUF file's `tokenizer.ggml.add_bos_token`, see
        /// `gguf::load_tokenizer`; true for `tokenizer.json` files, which prepend the BOS they name).
        add_bos: bool,
        /// The file's chat template (a GGUF file's `tokenizer.chat_template`, Jinja), if any.
        chat_template: Option<String>,
        /// One more than the largest id the pipeline has a token for (added tokens included): see
        /// [`Tokenizer::id_space`].
        id_space: usize,
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

    /// Decodes ids to text, skipping special tokens. An id no token of this tokenizer spells (a model's vocabulary
    /// may be larger than its tokenizer's: Hugging Face models pad theirs) becomes U+FFFD, the replacement
    /// character, where both formats' decoders would drop it without a trace.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        if ids.iter().all(|&id| self.spells(id)) {
            return self.decode_spelled(ids);
        }
        let known: Vec<bool> = ids.iter().map(|&id| self.spells(id)).collect();
        let (mut out, mut at) = (String::new(), 0);
        for run in known.chunk_by(|a, b| a == b) {
            let part = &ids[at..at + run.len()];
            if run[0] {
                out.push_str(&self.decode_spelled(part)?);
            } else {
                out.extend(std::iter::repeat_n(char::REPLACEMENT_CHARACTER, part.len()));
            }
            at += run.len();
        }
        Ok(out)
    }

    /// Whether a token of this tokenizer has id `id`.
    fn spells(&self, id: u32) -> bool {
        match self {
            Tokenizer::Llama2c(t) => (id as usize) < t.vocab_size(),
            Tokenizer::Hf { inner, .. } => inner.id_to_token(id).is_some(),
        }
    }

    fn decode_spelled(&self, ids: &[u32]) -> Result<String> {
        match self {
            Tokenizer::Llama2c(t) => Ok(t.decode(ids)),
            Tokenizer::Hf { inner, .. } => inner
                .decode(ids, true)
                .map_err(|e| RuntimeError::Tokenizer(e.to_string())),
        }
    }

    /// Whether a prompt starts with BOS by the model's own convention: always for llama2.c tokenizers (as run.c
    /// does), as the file says for GGUF vocabularies (`tokenizer.ggml.add_bos_token`, else llama.cpp's default for
    /// the tokenizer type), and whenever a `tokenizer.json` names a BOS token.
    pub fn add_bos(&self) -> bool {
        match self {
            Tokenizer::Llama2c(_) => true,
            Tokenizer::Hf { bos, add_bos, .. } => *add_bos && bos.is_some(),
        }
    }

    /// [`Tokenizer::encode`] with BOS as [`Tokenizer::add_bos`] says: how a user's prompt is encoded.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, self.add_bos())
    }

    /// The chat template the model file carries (Jinja source), if any.
    pub fn chat_template(&self) -> Option<&str> {
        match self {
            Tokenizer::Llama2c(_) => None,
            Tokenizer::Hf { chat_template, .. } => chat_template.as_deref(),
        }
    }

    /// The text of token `id` as the vocabulary spells it (special tokens included), if it exists.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Llama2c(t) => Some(t.decode(&[id])),
            Tokenizer::Hf { inner, .. } => inner.id_to_token(id),
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

    /// The ids the tokenizer can produce or name: one more than the largest of its token ids, BOS and EOS. A model
    /// it is paired with must accept and emit every one of them (its vocabulary, `Model::output_vocab`, at least
    /// this large), or a prompt fails mid-generation; a model's vocabulary may be larger (embedding rows padded
    /// past the tokenizer's tokens).
    pub fn id_space(&self) -> usize {
        let (ids, bos, eos) = match self {
            Tokenizer::Llama2c(t) => (t.vocab_size(), Llama2cTokenizer::BOS, Llama2cTokenizer::EOS),
            Tokenizer::Hf {
                id_space, bos, eos, ..
            } => (*id_space, bos.unwrap_or(0), eos.unwrap_or(0)),
        };
        ids.max(bos as usize + 1).max(eos as usize + 1)
    }

    /// A lower bound on the tokens of `encode(text, bos)`, computed without encoding (to refuse a prompt that
    /// cannot fit a context before paying for its tokenisation). Exact-format bound for llama2.c (no token is
    /// longer than the longest piece); for `tokenizers` pipelines, whose normalisers may shorten the text, only BOS.
    pub fn min_tokens(&self, text: &str, bos: bool) -> usize {
        match self {
            Tokenizer::Llama2c(t) => t.min_tokens(text, bos),
            Tokenizer::Hf { bos: b, .. } => usize::from(bos && b.is_some()),
        }
    }

    /// Reads `tokenizer.json` (at most [`crate::limits::MAX_TOKENIZER_BYTES`], checked before reading); BOS/EOS are
    /// looked up among common names.
    pub fn from_hf_file(path: &std::path::Path) -> Result<Self> {
        let bytes = crate::limits::read_limited(path, crate::limits::MAX_TOKENIZER_BYTES, "tokenizer")?;
        Self::from_hf_bytes(&bytes, &path.display().to_string())
    }

    /// Parses the bytes of a `tokenizer.json`. Syntax errors are reported as such (with line and column); a file
    /// that is valid JSON but that the `tokenizers` library cannot build says so and names its model type, rather
    /// than the library's serde message ("data did not match any variant …"), which reads like a syntax error.
    pub fn from_hf_bytes(bytes: &[u8], what: &str) -> Result<Self> {
        let value: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| RuntimeError::format(what, format!("not valid JSON: {e}")))?;
        let model_type = value
            .get("model")
            .and_then(|m| m.get("type"))
            .and_then(|t| t.as_str())
            .unwrap_or("unnamed")
            .to_string();
        let inner: tokenizers::Tokenizer = serde_json::from_value(value).map_err(|e| {
            RuntimeError::format(
                what,
                format!(
                    "valid JSON, but not a tokenizer pipeline this build of the tokenizers library can load \
                     (model type {model_type:?}): {e}"
                ),
            )
        })?;
        let find = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let bos = find(&["<s>", "<|begin_of_text|>", "<|im_start|>"]);
        let eos = find(&["</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>"]);
        // The largest id, not the count: a file's ids need not be contiguous.
        let id_space = inner
            .get_vocab(true)
            .into_values()
            .max()
            .map_or(0, |m| m as usize + 1);
        Ok(Tokenizer::Hf {
            inner: Box::new(inner),
            add_bos: bos.is_some(),
            bos,
            eos,
            chat_template: None,
            id_space,
        })
    }
}
