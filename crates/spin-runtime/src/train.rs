//! Distilling a small draft model from a target with the same tokenizer: the student (a smaller Llama) is trained
//! with AdamW on text sampled from the target, minimising the KL divergence KL(p_target ‖ q_student) at every
//! position, which maximises the expected acceptance Σ_v min(p_v, q_v) only indirectly but is smooth and cheap.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, Model, TensorMap, WeightSource, tensor_shapes};
use crate::speculative::{generate_plain_batch, sampling};
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use std::collections::HashMap;
use std::time::Instant;

/// Distillation settings.
#[derive(Debug, Clone)]
pub struct DistillConfig {
    /// The student's shape (vocabulary must match the target's).
    pub student: Config,
    /// Training steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// AdamW learning rate.
    pub learning_rate: f64,
    /// Seed of initialisation and sampling.
    pub seed: u64,
}

/// Progress of one step.
#[derive(Debug, Clone, Copy)]
pub struct StepLog {
    /// Step index.
    pub step: usize,
    /// Mean KL(p ‖ q) per position, in nats.
    pub kl: f64,
    /// Training tokens per second so far.
    pub tokens_per_s: f64,
}

/// Trains a student by distillation from `target`; calls `log` after every step. Returns the student's tensors
/// (Hugging Face names), ready for [`crate::llama2c::write_checkpoint`].
pub fn distill(
    target: &Model,
    cfg: &DistillConfig,
    mut log: impl FnMut(StepLog),
) -> Result<HashMap<String, Tensor>> {
    if cfg.student.vocab_size != target.config().vocab_size {
        return Err(RuntimeError::invalid(
            "student.vocab_size",
            "must equal the target's vocabulary size",
        ));
    }
    if cfg.steps == 0 || cfg.batch == 0 || cfg.seq_len < 2 {
        return Err(RuntimeError::invalid(
            "steps, batch, seq_len",
            "must be positive (seq_len at least 2)",
        ));
    }
    let device = Device::Cpu;
    let init = crate::model::random_tensors(&cfg.student, 0.02, cfg.seed, &device)?;
    let mut vars = Vec::new();
    let mut tensors = HashMap::new();
    for (name, _) in tensor_shapes(&cfg.student) {
        let v = Var::from_tensor(&init[&name])?;
        tensors.insert(name, v.as_tensor().clone());
        vars.push(v);
    }
    let map = TensorMap {
        what: "student".into(),
        tensors: tensors.clone(),
        device: device.clone(),
    };
    let mut student = Model::from_source(cfg.student.clone(), &map as &dyn WeightSource, &device)?;
    student.set_differentiable(true)?;
    let params = ParamsAdamW {
        lr: cfg.learning_rate,
        weight_decay: 0.0,
        ..Default::default()
    };
    let mut opt = AdamW::new(vars, params)?;
    let t1 = sampling(1.0)?;
    let start = Instant::now();
    let mut seen = 0usize;
    for step in 0..cfg.steps {
        // Text sampled from the target, starting at BOS (id 1 in llama2.c vocabularies).
        // All sequences of the step are sampled together (one batch forward per position).
        let seeds: Vec<u64> = (0..cfg.batch)
            .map(|b| {
                cfg.seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add((step * cfg.batch + b) as u64)
            })
            .collect();
        let bos = vec![vec![1u32]; cfg.batch];
        let mut rows = Vec::with_capacity(cfg.batch * cfg.seq_len);
        for seq in generate_plain_batch(target, &bos, &t1, cfg.seq_len - 1, &seeds)? {
            rows.push(1u32);
            rows.extend(seq);
        }
        let ids = Tensor::from_vec(rows, (cfg.batch, cfg.seq_len), &device)?;
        let p = candle_nn::ops::softmax_last_dim(&target.forward_full(&ids)?)?.detach();
        let log_q = candle_nn::ops::log_softmax(&student.forward_full(&ids)?, D::Minus1)?;
        let log_p = (p.clone() + 1e-12)?.log()?;
        let kl = (p * (log_p - log_q)?)?.sum(D::Minus1)?.mean_all()?;
        opt.backward_step(&kl)?;
        seen += cfg.batch * cfg.seq_len;
        log(StepLog {
            step,
            kl: f64::from(kl.to_dtype(DType::F32)?.to_scalar::<f32>()?),
            tokens_per_s: seen as f64 / start.elapsed().as_secs_f64().max(1e-9),
        });
    }
    Ok(tensors)
}
