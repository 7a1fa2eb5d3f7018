//! Distillation lowers the student's KL divergence from the target, and the saved student loads as a drafter.

use candle_core::Device;
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::train::{DistillConfig, distill};
use spin_runtime::{Config, RopeStyle, llama2c};

fn cfg(dim: usize, n_layers: usize) -> Config {
    Config {
        vocab_size: 20,
        dim,
        hidden_dim: 2 * dim,
        n_layers,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 32,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    }
}

#[test]
fn distillation_reduces_kl_and_saves_a_loadable_drafter() {
    let tc = cfg(32, 2);
    let target = model_from_tensors(
        tc.clone(),
        model::random_tensors(&tc, 1.0, 1, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let dc = DistillConfig {
        student: cfg(16, 1),
        steps: 30,
        batch: 4,
        seq_len: 12,
        learning_rate: 3e-2,
        seed: 3,
    };
    let mut kls = Vec::new();
    let w = distill(&target, &dc, |s| kls.push(s.kl)).unwrap();
    assert_eq!(kls.len(), 30);
    let first: f64 = kls[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = kls[25..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.85 * first, "KL {first} -> {last}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("draft.bin");
    llama2c::write_checkpoint(&p, &dc.student, &w).unwrap();
    let d = llama2c::load_checkpoint(&p, &Device::Cpu).unwrap();
    assert_eq!(d.config(), &dc.student);
    let bad = DistillConfig {
        student: cfg(16, 1),
        steps: 0,
        ..dc.clone()
    };
    assert!(distill(&target, &bad, |_| ()).is_err());
}
