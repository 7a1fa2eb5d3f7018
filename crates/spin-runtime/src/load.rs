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

/// The most worker threads the pool is built with (the `threads` argument of [`set_up_threads`] or
/// `RAYON_NUM_THREADS`): thousands of polling workers on a few cores took tens of seconds for two tokens.
pub const MAX_THREADS: usize = 256;

/// The thread count `RAYON_NUM_THREADS` holds: None when unset or empty, an error naming it when it is not a
/// count from 1 to [`MAX_THREADS`].
fn env_threads() -> Result<Option<usize>> {
    let Some(v) = std::env::var_os("RAYON_NUM_THREADS").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.to_str().and_then(|s| s.trim().parse::<usize>().ok()) {
        Some(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
        _ => Err(RuntimeError::invalid(
            "RAYON_NUM_THREADS",
            format!("{v:?} is not a thread count from 1 to {MAX_THREADS}"),
        )),
    }
}

/// Fixes the process's CPU threads once, at start-up (call it first thing in `main`), and returns what is in force
/// as `threads=N CANDLE_NUM_THREADS=…`.
///
/// - Our own products (the quantised kernels, the host route's attention) and candle's matrix products run on
///   rayon's global pool, built here with `threads` workers: the argument (`--threads`), else `RAYON_NUM_THREADS`
///   when set, else the available parallelism (both cores of the development machine). Either count must be
///   from 1 to [`MAX_THREADS`] (an error names the argument or the variable); the available parallelism is
///   capped there.
///   `RAYON_NUM_THREADS` is then set to the same count: candle 0.11 asks for it on every CPU matmul and, when the
///   variable is unset (and the cores are alike), re-reads `/proc/cpuinfo` each time (≈ 0.15 ms per product,
///   measured on the 2-core development machine, more than a whole stories260K projection costs).
/// - `CANDLE_NUM_THREADS` (candle's element-wise and quantised-matmul pool) := 1 unless set. That pool engages only
///   above 64k elements and its caller spins in a barrier until the workers finish; on the shared 2-core machine
///   this made the K = 16 verification 2–3× slower (the attention-mask addition crosses the threshold). Quantised
///   GGUF models on the CPU do not use candle's quantised products (they take the host route, `model/qhost.rs`),
///   so nothing of ours is held to one thread by it.
///
/// A pool built before (a second call in one process, or a test harness) is kept: the string then reports the
/// count of the pool in force.
///
/// # Safety
///
/// It calls `std::env::set_var`: no other thread may exist while it runs.
#[allow(unsafe_code)]
pub unsafe fn set_up_threads(threads: Option<usize>) -> Result<String> {
    let n = match threads {
        Some(0) => return Err(RuntimeError::invalid("threads", "must be at least 1")),
        Some(n) if n > MAX_THREADS => {
            return Err(RuntimeError::invalid(
                "threads",
                format!("{n} exceeds {MAX_THREADS}"),
            ));
        }
        Some(n) => n,
        None => match env_threads()? {
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS)),
        },
    };
    // SAFETY: the caller guarantees that no other thread exists, so nothing reads the environment concurrently.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", n.to_string()) };
    let candle = match std::env::var("CANDLE_NUM_THREADS")
        .ok()
        .filter(|v| v.parse::<usize>().is_ok_and(|n| n > 0))
    {
        Some(v) => v,
        None => {
            // SAFETY: as above.
            unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
            "1".to_string()
        }
    };
    // An error here means a global pool exists already; it is kept (see above).
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(format!(
        "threads={} CANDLE_NUM_THREADS={candle}",
        rayon::current_num_threads()
    ))
}

/// [`set_up_threads`] with the default count (`RAYON_NUM_THREADS`, else the available parallelism), for programs
/// without a `--threads` flag (benches, examples).
///
/// # Safety
///
/// As [`set_up_threads`]: no other thread may exist while it runs.
#[allow(unsafe_code)]
pub unsafe fn fix_cpu_threads() -> String {
    // SAFETY: forwarded from the caller.
    match unsafe { set_up_threads(None) } {
        Ok(s) => s,
        Err(e) => e.to_string(),
    }
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
/// A llama2.c tokenizer whose entry count differs from `vocab_size` is a [`RuntimeError::VocabMismatch`].
pub fn load_tokenizer(tokenizer: Option<&Path>, model_path: &Path, vocab_size: usize) -> Result<Tokenizer> {
    match tokenizer {
        Some(p) if p.extension().is_some_and(|e| e == "json") => Tokenizer::from_hf_file(p),
        Some(p) if p.extension().is_some_and(|e| e == "gguf") => crate::gguf::load_tokenizer(p),
        Some(p) => Ok(Tokenizer::Llama2c(Llama2cTokenizer::load(p, vocab_size)?)),
        None if model_path.is_dir() => {
            let file = model_path.join("tokenizer.json");
            if !file.exists() {
                // A restricted-head draft folder is written without one: it speaks its target's tokens.
                return Err(RuntimeError::invalid(
                    "tokenizer",
                    format!(
                        "{} holds no tokenizer.json: pass --tokenizer (a draft folder takes its target's, e.g. the \
                         target's GGUF)",
                        model_path.display()
                    ),
                ));
            }
            Tokenizer::from_hf_file(&file)
        }
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
