//! The one error type of the runtime: every loader, model and loop failure names the file, field or tensor at fault.

/// Errors of `spin-runtime`. Messages are lowercase and name the field, tensor or file that is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating-system error.
        source: std::io::Error,
    },
    /// A file is not what its format says it should be (truncated, wrong size, wrong shape, missing tensor).
    #[error("{what}: {reason}")]
    Format {
        /// The file, tensor or header field at fault.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file is larger than the documented limit of its kind (checked before it is read into memory).
    #[error("{path}: larger than the limit of {limit} bytes for a {kind}")]
    TooLarge {
        /// The file.
        path: String,
        /// What the file is (model, tokenizer, config.json).
        kind: &'static str,
        /// The limit in bytes.
        limit: u64,
    },
    /// A weight is NaN or infinite: the model would produce NaN probabilities at the first token.
    #[error("{what}: tensor {tensor}: element {index} is {value} (weights must be finite)")]
    NonFinite {
        /// The file.
        what: String,
        /// The tensor, e.g. `model.layers.0.self_attn.q_proj.weight`.
        tensor: String,
        /// The flat index of the first bad element.
        index: usize,
        /// The bad value.
        value: f32,
    },
    /// A tokenizer does not belong to the model: its vocabulary has another size.
    #[error(
        "tokenizer: {path} holds {tokens} tokens but the model's vocabulary has {vocab_size} (a tokenizer of another model?)"
    )]
    VocabMismatch {
        /// The tokenizer file.
        path: String,
        /// Entries in the tokenizer.
        tokens: usize,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A model file names an architecture this runtime does not implement.
    #[error("architecture: {0:?} is not supported (expected llama or qwen2)")]
    UnknownArchitecture(String),
    /// A parameter or argument is out of its domain.
    #[error("{field}: {reason}")]
    Invalid {
        /// The parameter, e.g. `draft_len[2]`.
        field: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A tensor operation failed inside candle.
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    /// The tokenizer could not encode or decode.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An accept/reject decision or distribution was rejected by spin-core.
    #[error(transparent)]
    Core(#[from] spin_core::CoreError),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, RuntimeError>;

impl RuntimeError {
    /// A format error about `what`.
    pub(crate) fn format(what: impl Into<String>, reason: impl Into<String>) -> Self {
        RuntimeError::Format {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// An invalid-parameter error about `field`.
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        RuntimeError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// An IO error on `path`.
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        RuntimeError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
