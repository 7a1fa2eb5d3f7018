//! Real drafters and a batched verifier on candle: Llama-family models from llama2.c, Hugging Face and GGUF files,
//! truncatable KV caches, padded batch verification, the K-device speculative loop and its measurements.
//!
//! This is the only crate of the workspace that depends on candle and the only one with a `cuda` feature (off by
//! default). Every accept/reject decision is delegated to `spin-core`.

pub mod decode;
pub mod drafter;
pub mod embedded;
pub mod error;
pub mod gguf;
mod gguf_header;
pub mod head_vocab;
pub mod hf;
mod kernels;
pub mod limits;
pub mod llama2c;
pub mod load;
pub mod measure;
pub mod model;
pub mod probs;
pub mod quant;
pub mod speculative;
pub mod tokenizer;
pub mod train;
pub mod verifier;

pub use error::{Result, RuntimeError};
pub use load::{load_model, load_tokenizer, select_device};
pub use model::{Config, KvCache, Model, RopeStyle};
pub use tokenizer::Tokenizer;
