//! Picks the loader from the path: a folder is a Hugging Face model, `*.gguf` is GGUF, anything else llama2.c v0.

use crate::error::{Result, RuntimeError};
use crate::llama2c::Llama2cTokenizer;
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use candle_core::Device;
use std::io::Read;
use std::path::Path;

/// The largest model file read (llama2.c, GGUF, each safetensors file): 64 GiB.
pub const MAX_MODEL_BYTES: u64 = 64 << 30;
/// The largest tokenizer file read (llama2.c `.bin` or `tokenizer.json`): 128 MiB (the largest public
/// `tokenizer.json` files are around 35 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 128 << 20;
/// The largest `config.json` read: 1 MiB.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The longest context a model header may declare (2^18 = 262,144 positions; Llama 3.1 declares 131,072).
pub const MAX_SEQ_LEN: usize = 1 << 18;
/// The largest RoPE table a header may imply: max_seq_len · head_dim ≤ 2^25 (128 MiB of f32 per copy).
pub const MAX_ROPE_ENTRIES: usize = 1 << 25;
/// The largest vocabulary a header may declare (2^20; public models stay below 2^18).
pub const MAX_VOCAB: usize = 1 << 20;
/// The largest width (dim) and SwiGLU inner width (hidden_dim) a header may declare.
pub const MAX_WIDTH: usize = 1 << 18;
/// The most layers and heads a header may declare.
pub const MAX_LAYERS: usize = 1 << 12;

/// Reads a whole file of at most `limit` bytes. The limit is checked before reading (from the metadata of a
/// regular file) and while reading (through `take(limit + 1)`: `/dev/zero` or a pipe reports length 0).
pub fn read_limited(path: &Path, limit: u64, kind: &'static str) -> Result<Vec<u8>> {
    let file = std::fs::File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let meta = file.metadata().map_err(|e| RuntimeError::io(path, e))?;
    if meta.is_dir() {
        return Err(RuntimeError::invalid(
            path.display().to_string(),
            format!("is a directory, not a {kind} file"),
        ));
    }
    let too_large = || RuntimeError::TooLarge {
        path: path.display().to_string(),
        kind,
        limit,
    };
    if meta.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| RuntimeError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Checks a model header against the documented limits (after `Config::validate`), so that no header can ask for
/// unbounded work or memory: tensors must also be present in the file, but the RoPE tables and KV caches are
/// sized by the header alone.
pub fn check_limits(cfg: &crate::Config, what: &str) -> Result<()> {
    let checks = [
        ("max_seq_len", cfg.max_seq_len, MAX_SEQ_LEN),
        ("vocab_size", cfg.vocab_size, MAX_VOCAB),
        ("dim", cfg.dim, MAX_WIDTH),
        ("hidden_dim", cfg.hidden_dim, MAX_WIDTH),
        ("n_layers", cfg.n_layers, MAX_LAYERS),
        ("n_heads", cfg.n_heads, MAX_LAYERS),
        ("n_kv_heads", cfg.n_kv_heads, MAX_LAYERS),
    ];
    for (field, value, limit) in checks {
        if value > limit {
            return Err(RuntimeError::format(
                format!("{what}: {field}"),
                format!("{value} is above the limit of {limit}"),
            ));
        }
    }
    // Both factors are below 2^18 here, so the product cannot overflow.
    let rope = cfg.max_seq_len * cfg.head_dim();
    if rope > MAX_ROPE_ENTRIES {
        return Err(RuntimeError::format(
            format!("{what}: max_seq_len"),
            format!(
                "{} positions × head size {} = {rope} RoPE entries, above the limit of {MAX_ROPE_ENTRIES}",
                cfg.max_seq_len,
                cfg.head_dim()
            ),
        ));
    }
    Ok(())
}

/// Fails on the first NaN or infinite element of `values`, naming the tensor.
pub(crate) fn check_finite(what: &str, tensor: &str, values: &[f32]) -> Result<()> {
    // Fast pass first: x·0 is ±0 for a finite x and NaN otherwise, so sixteen running sums stay zero exactly when
    // every value is finite; the loop has no branch and vectorises (a per-element `is_finite` search cost more
    // than the rest of loading a small model). The search below runs only to name the first bad value.
    const LANES: usize = 16;
    let mut sums = [0f32; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (s, &x) in sums.iter_mut().zip(chunk) {
            *s += x * 0.0;
        }
    }
    if sums.iter().chain(tail).all(|x| x.is_finite()) {
        return Ok(());
    }
    match values.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(index) => Err(RuntimeError::NonFinite {
            what: what.to_string(),
            tensor: tensor.to_string(),
            index,
            value: values[index],
        }),
    }
}

/// [`check_finite`] on a tensor of any float dtype (converted to f32 on the host one tensor at a time).
pub(crate) fn check_finite_tensor(what: &str, tensor: &str, t: &candle_core::Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Ok(());
    }
    let v = t
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    check_finite(what, tensor, &v)
}

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

/// Fixes the process's CPU threads once, at start-up (call it first thing in `main`), and returns what is in force
/// as `threads=N CANDLE_NUM_THREADS=…`.
///
/// - Our own products (the quantised kernels, the host route's attention) and candle's matrix products run on
///   rayon's global pool, built here with `threads` workers: the argument (`--threads`), else `RAYON_NUM_THREADS`
///   when it holds a positive number, else the available parallelism (both cores of the development machine).
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
    if threads == Some(0) {
        return Err(RuntimeError::invalid("threads", "must be at least 1"));
    }
    let from_env = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0);
    let n = threads
        .or(from_env)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorised pass must not miss a bad value anywhere: in a full chunk, in the ragged tail, first or last,
    /// and it must name the first one.
    #[test]
    fn check_finite_finds_the_first_bad_value_anywhere() {
        for n in [0, 1, 15, 16, 17, 40, 100] {
            let ok = vec![1.5f32; n];
            assert!(check_finite("m", "t", &ok).is_ok(), "n {n}");
            for at in 0..n {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut v = ok.clone();
                    v[at] = bad;
                    if at + 1 < n {
                        v[n - 1] = f32::NAN; // a later bad value must not be the one reported
                    }
                    match check_finite("m", "t", &v) {
                        Err(RuntimeError::NonFinite { index, .. }) => assert_eq!(index, at, "n {n}"),
                        other => panic!("n {n}, at {at}: {other:?}"),
                    }
                }
            }
        }
        // Huge finite values stay finite under x·0.
        assert!(check_finite("m", "t", &[f32::MAX, -f32::MAX, f32::MIN_POSITIVE]).is_ok());
    }
}
