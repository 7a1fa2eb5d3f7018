//! Helpers shared by the runtime's integration tests.

use candle_core::Device;
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::{Config, Model, RopeStyle};

/// A random-weight model small enough for exact enumeration: vocabulary 24, width 32, 4 query and 2 key/value
/// heads, at most 96 positions; weights drawn with standard deviation `std` from `seed`.
pub fn tiny(seed: u64, std: f64, n_layers: usize) -> Model {
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
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    model_from_tensors(
        cfg.clone(),
        model::random_tensors(&cfg, std, seed, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap()
}
