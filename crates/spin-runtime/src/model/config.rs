//! The shape and numerics of a Llama-family model ([`Config`]) and how its rotary embeddings pair channels.

use crate::error::{Result, RuntimeError};

/// How rotary embeddings pair the channels of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (2i, 2i+1): llama2.c checkpoints and GGUF Llama files.
    Interleaved,
    /// First half with second half: Hugging Face Llama and Qwen2 checkpoints.
    Halves,
}

/// The shape and numerics of a Llama-family model.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Number of tokens in the vocabulary.
    pub vocab_size: usize,
    /// Model (residual) width.
    pub dim: usize,
    /// SwiGLU inner width.
    pub hidden_dim: usize,
    /// Number of transformer blocks.
    pub n_layers: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (grouped-query attention when below `n_heads`).
    pub n_kv_heads: usize,
    /// Longest sequence (prompt plus generated tokens) the position tables cover.
    pub max_seq_len: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f64,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// RoPE channel pairing.
    pub rope: RopeStyle,
    /// Whether q/k/v projections carry biases (Qwen2).
    pub qkv_bias: bool,
    /// Whether the output head shares the token embedding.
    pub tied_embeddings: bool,
}

impl Config {
    /// Checks that every size is positive and the heads divide evenly.
    pub fn validate(&self) -> Result<()> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("dim", self.dim),
            ("hidden_dim", self.hidden_dim),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("max_seq_len", self.max_seq_len),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(RuntimeError::invalid(name, "must be positive"));
            }
        }
        if !self.dim.is_multiple_of(self.n_heads) {
            return Err(RuntimeError::invalid(
                "n_heads",
                format!("{} does not divide dim {}", self.n_heads, self.dim),
            ));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(RuntimeError::invalid(
                "n_kv_heads",
                format!("{} does not divide n_heads {}", self.n_kv_heads, self.n_heads),
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(RuntimeError::invalid(
                "dim",
                format!("head size {} is odd", self.head_dim()),
            ));
        }
        if !(self.rms_eps > 0.0 && self.rms_eps.is_finite()) {
            return Err(RuntimeError::invalid(
                "rms_eps",
                format!("{} is not positive", self.rms_eps),
            ));
        }
        if !(self.rope_theta > 0.0 && self.rope_theta.is_finite()) {
            return Err(RuntimeError::invalid(
                "rope_theta",
                format!("{} is not positive", self.rope_theta),
            ));
        }
        Ok(())
    }

    /// Channels per head.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Width of the key/value projections.
    pub fn kv_dim(&self) -> usize {
        self.head_dim() * self.n_kv_heads
    }
}
