//! Picks the loader from the path: a folder is a Hugging Face model, `*.gguf` is GGUF, anything else llama2.c v0.

use crate::error::{Result, RuntimeError};
use crate::llama2c::Llama2cTokenizer;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use candle_core::Device;
use std::path::Path;

/// The device to run on: the first CUDA GPU when built with `cuda` and one is present, else the CPU.
pub fn select_device() -> Result<Device> {
    #[cfg(feature = "cuda")]
    {
        Ok(Device::cuda_if_available(0)?)
    }
    #[cfg(not(feature = "cuda"))]
    {
        Ok(Device::Cpu)
    }
}

/// Fixes candle's CPU thread counts once for the process (call it first thing in `main`). Both variables are set
/// only when unset, so a user's choice is kept; returns the values in force as `RAYON_NUM_THREADS=…
/// CANDLE_NUM_THREADS=…`.
///
/// - `RAYON_NUM_THREADS` (threads of a matrix product) := the available parallelism. candle 0.11 asks for this
///   count on every CPU matmul and, when the variable is unset (and the cores are alike), re-reads
///   `/proc/cpuinfo` each time: ≈ 0.15 ms per product measured on the 2-core development machine, more than a
///   whole stories260K projection costs.
/// - `CANDLE_NUM_THREADS` (candle's element-wise and quantised-matmul pool) := 1. That pool engages only above
///   64k elements and its caller spins in a barrier until the workers finish; on the shared 2-core machine this
///   made the K = 16 verification 2–3× slower (the attention-mask addition crosses the threshold). The cost: GGUF
///   quantised products run on one thread unless the variable is set.
///
/// # Safety
///
/// It calls `std::env::set_var`: no other thread may exist while it runs.
#[allow(unsafe_code)]
pub unsafe fn fix_cpu_threads() -> String {
    let cores = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .to_string();
    let mut out = Vec::with_capacity(2);
    for (var, default) in [("RAYON_NUM_THREADS", cores.as_str()), ("CANDLE_NUM_THREADS", "1")] {
        let set = std::env::var(var)
            .ok()
            .filter(|v| v.parse::<usize>().is_ok_and(|n| n > 0));
        let value = match set {
            Some(v) => v,
            None => {
                // SAFETY: the caller guarantees that no other thread exists, so nothing reads the environment
                // concurrently.
                unsafe { std::env::set_var(var, default) };
                default.to_string()
            }
        };
        out.push(format!("{var}={value}"));
    }
    out.join(" ")
}

/// Loads a model, choosing the format from the path.
pub fn load_model(path: &Path, device: &Device) -> Result<Model> {
    if path.is_dir() {
        crate::hf::load_dir(path, device)
    } else if path.extension().is_some_and(|e| e == "gguf") {
        crate::gguf::load(path, device)
    } else {
        crate::llama2c::load_checkpoint(path, device)
    }
}

/// Loads the tokenizer for `model_path`: `tokenizer` if given (`*.json` Hugging Face, else llama2.c format of
/// `vocab_size` entries), else `tokenizer.json` inside a model folder or the vocabulary inside a GGUF file.
pub fn load_tokenizer(tokenizer: Option<&Path>, model_path: &Path, vocab_size: usize) -> Result<Tokenizer> {
    match tokenizer {
        Some(p) if p.extension().is_some_and(|e| e == "json") => Tokenizer::from_hf_file(p),
        Some(p) if p.extension().is_some_and(|e| e == "gguf") => crate::gguf::load_tokenizer(p),
        Some(p) => Ok(Tokenizer::Llama2c(Llama2cTokenizer::load(p, vocab_size)?)),
        None if model_path.is_dir() => Tokenizer::from_hf_file(&model_path.join("tokenizer.json")),
        None if model_path.extension().is_some_and(|e| e == "gguf") => {
            crate::gguf::load_tokenizer(model_path)
        }
        None => Err(RuntimeError::invalid(
            "tokenizer",
            format!(
                "{} has no embedded tokenizer: pass --tokenizer",
                model_path.display()
            ),
        )),
    }
}
