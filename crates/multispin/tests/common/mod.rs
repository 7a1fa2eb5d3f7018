//! Tiny llama2.c files for the command-line tests: a seven-piece tokenizer and random-weight checkpoints written
//! to a temporary folder, so that `generate`, `measure` and the system commands run on real files in seconds.

use spin_runtime::llama2c::{self, Llama2cTokenizer};
use spin_runtime::{Config, RopeStyle, model};
use std::path::{Path, PathBuf};

/// The tokenizer the tiny models share: byte pieces plus `a`, `b`, `c`, ` `, `ab`, ` a`, `bc`; written to
/// `dir/tok.bin`.
pub fn write_tokenizer(dir: &Path) -> (Llama2cTokenizer, PathBuf) {
    let pieces: Vec<(&str, f32)> = ["a", "b", "c", " ", "ab", " a", "bc"]
        .iter()
        .enumerate()
        .map(|(i, s)| (*s, -(i as f32)))
        .collect();
    let tok = Llama2cTokenizer::from_pieces(&pieces);
    let path = dir.join("tok.bin");
    std::fs::write(&path, tok.to_bytes()).unwrap();
    (tok, path)
}

/// The sizes of a tiny model.
pub struct Dims {
    pub dim: usize,
    pub hidden_dim: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub max_seq_len: usize,
}

/// Writes a random-weight llama2.c checkpoint (standard deviation 0.3, from `seed`) with vocabulary `vocab` to
/// `dir/name`.
pub fn write_model(dir: &Path, name: &str, vocab: usize, d: &Dims, seed: u64) -> PathBuf {
    let cfg = Config {
        vocab_size: vocab,
        dim: d.dim,
        hidden_dim: d.hidden_dim,
        n_layers: d.n_layers,
        n_heads: d.n_heads,
        n_kv_heads: d.n_kv_heads,
        max_seq_len: d.max_seq_len,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let device = spin_runtime::select_device().unwrap();
    let w = model::random_tensors(&cfg, 0.3, seed, &device).unwrap();
    let path = dir.join(name);
    llama2c::write_checkpoint(&path, &cfg, &w).unwrap();
    path
}
