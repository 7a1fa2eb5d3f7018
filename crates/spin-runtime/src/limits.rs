//! The limits a model, tokenizer or config file is read under and the checks that enforce them: sizes checked
//! before and while reading, header fields against documented bounds (docs/cli.md "Limits"), weights checked for
//! NaN and ∞. Every loader reads through these, below the dispatch in `load`.

use crate::error::{Result, RuntimeError};
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
