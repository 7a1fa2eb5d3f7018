//! GGUF files of the Llama and Qwen2 architectures with quantised weights (host matrices for the quantised host
//! route on the CPU, candle's quantised tensors elsewhere), the byte-level BPE tokenizer such files embed, and a
//! writer for tests and exports.

use crate::error::{Result, RuntimeError};
use crate::gguf_header::Scanned;
use crate::model::{Config, Embedding, HostRows, Model, Proj, RopeStyle, WeightSource, check_shape};
use crate::quant::{BlockFormat, QMatrix};
use crate::tokenizer::Tokenizer;
use candle_core::quantized::{QMatMul, QStorage, QTensor, gguf_file};
use candle_core::{Device, Tensor};
use std::path::Path;
use std::sync::Arc;

/// The block formats [`write()`] and [`write_with`] take (candle's ggml types).
pub use candle_core::quantized::GgmlDType;

/// Maps a Hugging Face Llama tensor name (without `.weight`) to its GGUF name.
fn gguf_name(name: &str) -> String {
    if let Some(rest) = name.strip_prefix("model.layers.") {
        let (i, part) = rest.split_once('.').unwrap_or((rest, ""));
        let g = match part {
            "input_layernorm" => "attn_norm",
            "self_attn.q_proj" => "attn_q",
            "self_attn.k_proj" => "attn_k",
            "self_attn.v_proj" => "attn_v",
            "self_attn.o_proj" => "attn_output",
            "post_attention_layernorm" => "ffn_norm",
            "mlp.gate_proj" => "ffn_gate",
            "mlp.up_proj" => "ffn_up",
            "mlp.down_proj" => "ffn_down",
            other => other,
        };
        return format!("blk.{i}.{g}");
    }
    match name {
        "model.embed_tokens" => "token_embd".into(),
        "model.norm" => "output_norm".into(),
        "lm_head" => "output".into(),
        other => other.into(),
    }
}

/// The runs of equal entries of `keys`, in order, each a range of indices; a `None` entry is a run of its own: how
/// the projections read together (q|k|v, gate|up) are stacked into host matrices, one per run of equal formats.
fn stacked_runs<T: PartialEq>(keys: &[Option<T>]) -> Vec<std::ops::Range<usize>> {
    let mut runs: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        match runs.last_mut() {
            Some(r) if k.is_some() && keys[r.start] == *k => r.end = i + 1,
            _ => runs.push(i..i + 1),
        }
    }
    runs
}

struct GgufSource {
    what: String,
    content: gguf_file::Content,
    /// The open file: each tensor is read once, at its offset, straight into its blocks.
    file: std::fs::File,
    file_len: u64,
    device: Device,
    /// Whether projections and the embedding become host matrices in the file's block format (the CPU, where
    /// the quantised host route runs); elsewhere they become candle's quantised tensors on the device.
    host: bool,
    /// Host matrices built ahead of the model's requests ([`GgufSource::gather_ahead`]), by the GGUF names of the
    /// tensors stacked in each; [`GgufSource::host_matrix`] takes its matrix from here when it is one of them.
    ahead: std::sync::Mutex<std::collections::HashMap<Vec<String>, Arc<QMatrix>>>,
}

impl GgufSource {
    /// A tensor's info and the byte range it occupies in the file, checked before anything is read: candle
    /// reinterprets raw bytes as blocks without checks, and an empty tensor (a zero dimension in a corrupt file)
    /// would hand it a dangling, misaligned pointer (found by the mutation test in tests/parsers.rs).
    fn extent(&self, name: &str) -> Result<(&gguf_file::TensorInfo, u64, usize)> {
        let what = format!("{}: {name}", self.what);
        let info = self
            .content
            .tensor_infos
            .get(name)
            .ok_or_else(|| RuntimeError::format(&what, "tensor is missing"))?;
        let elems = info
            .shape
            .dims()
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                RuntimeError::format(
                    &what,
                    format!("shape {:?} is empty or too large", info.shape.dims()),
                )
            })?;
        let block = info.ggml_dtype.block_size();
        if !elems.is_multiple_of(block) {
            return Err(RuntimeError::format(
                &what,
                format!("{elems} elements are not a whole number of {block}-element blocks"),
            ));
        }
        let len = (elems / block).checked_mul(info.ggml_dtype.type_size());
        let start = info.offset.checked_add(self.content.tensor_data_offset);
        match (len, start) {
            (Some(len), Some(start))
                if start
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= self.file_len) =>
            {
                Ok((info, start, len))
            }
            _ => Err(RuntimeError::format(
                &what,
                format!("extends past the end of the file ({} bytes)", self.file_len),
            )),
        }
    }

    /// Appends tensor `name`'s bytes to `buf` (one read at its offset) and returns its info.
    fn read_into(&self, name: &str, buf: &mut Vec<u8>) -> Result<&gguf_file::TensorInfo> {
        use std::io::{Read, Seek};
        let (info, start, len) = self.extent(name)?;
        let io = |e| RuntimeError::format(format!("{}: {name}", self.what), format!("cannot read: {e}"));
        let mut f = &self.file;
        f.seek(std::io::SeekFrom::Start(start)).map_err(io)?;
        buf.reserve(len);
        let got = f.take(len as u64).read_to_end(buf).map_err(io)?;
        if got != len {
            return Err(RuntimeError::format(
                format!("{}: {name}", self.what),
                format!("{got} of {len} bytes could be read"),
            ));
        }
        Ok(info)
    }

    /// Builds every host matrix the model will ask for straight into one buffer in huge pages
    /// ([`QMatrix::gathered`], read at the tensors' offsets on the threads of the current rayon pool), in the
    /// order a pass reads them: per block the runs of equal formats in q|k|v (stacked as [`WeightSource::projs`]
    /// stacks them), the output projection, gate|up, the down projection; then an untied head and the
    /// embedding. The model's loader then finds them built, and the gathering after it finds them in huge pages
    /// already. Only a head start: a tensor whose read or scales fail here, or a request for another grouping, is
    /// read the ordinary way when the model asks for it (which reports the fault by name).
    #[cfg(unix)]
    fn gather_ahead(&self, n_layers: usize) {
        use std::os::unix::fs::FileExt;
        // A 2-D tensor in a host format: its extent in the file, rows and columns.
        let matrix = |g: &str| {
            let (info, start, _) = self.extent(g).ok()?;
            let format = BlockFormat::from_ggml(info.ggml_dtype)?;
            match *info.shape.dims() {
                [rows, cols] => Some((format, start, rows, cols)),
                _ => None,
            }
        };
        type Group = (Vec<String>, Vec<(u64, usize)>, (BlockFormat, usize, usize));
        let mut groups: Vec<Group> = Vec::new();
        // Stacked as `projs` stacks them (a run of equal formats; the widths agree in a model the loader accepts).
        let mut runs = |names: &[String]| {
            let found: Vec<_> = names.iter().map(|g| matrix(g)).collect();
            let keys: Vec<_> = found
                .iter()
                .map(|m| m.map(|(format, _, _, cols)| (format, cols)))
                .collect();
            for run in stacked_runs(&keys) {
                let Some((format, cols)) = keys[run.start] else {
                    continue;
                };
                let tensors: Vec<(u64, usize)> = found[run.clone()]
                    .iter()
                    .flatten()
                    .map(|&(_, start, rows, _)| (start, rows))
                    .collect();
                let rows = tensors.iter().map(|t| t.1).sum();
                groups.push((names[run].to_vec(), tensors, (format, rows, cols)));
            }
        };
        let weight = |hf: &str| format!("{}.weight", gguf_name(hf));
        for i in 0..n_layers {
            let part = |x: &str| weight(&format!("model.layers.{i}.{x}"));
            runs(&[
                part("self_attn.q_proj"),
                part("self_attn.k_proj"),
                part("self_attn.v_proj"),
            ]);
            runs(&[part("self_attn.o_proj")]);
            runs(&[part("mlp.gate_proj"), part("mlp.up_proj")]);
            runs(&[part("mlp.down_proj")]);
        }
        runs(&[weight("lm_head")]);
        runs(&[weight("model.embed_tokens")]);
        let plan: Vec<(BlockFormat, usize, usize)> = groups.iter().map(|g| g.2).collect();
        // Rows `first ..` of group i: from each stacked tensor the rows that fall in the range.
        let read = |i: usize, first: usize, out: &mut [u8]| {
            let (_, tensors, (format, _, cols)) = &groups[i];
            let rb = cols / format.block_elems() * format.block_bytes();
            let (mut row, mut at, end) = (0, 0, first + out.len() / rb);
            for &(start, rows) in tensors {
                let (lo, hi) = (first.max(row), end.min(row + rows));
                if lo < hi {
                    let len = (hi - lo) * rb;
                    let from = start + ((lo - row) * rb) as u64;
                    if self.file.read_exact_at(&mut out[at..at + len], from).is_err() {
                        return false;
                    }
                    at += len;
                }
                row += rows;
            }
            at == out.len()
        };
        let built = QMatrix::gathered(&plan, read);
        let mut ahead = self
            .ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for ((names, _, _), m) in groups.into_iter().zip(built) {
            if let Some(m) = m {
                ahead.insert(names, Arc::new(m));
            }
        }
    }

    /// Elsewhere the model's requests read the file one by one.
    #[cfg(not(unix))]
    fn gather_ahead(&self, _: usize) {}

    /// Tensor `name` as candle's quantised tensor on the device.
    fn qtensor(&self, name: &str) -> Result<QTensor> {
        let mut bytes = Vec::new();
        let info = self.read_into(name, &mut bytes)?;
        qtensor_from_bytes(&format!("{}: {name}", self.what), info, &bytes, &self.device)
    }

    /// Fails naming `name` when a block of it holds a NaN or infinite value: the dequantised tensor is searched
    /// for the first one (only on this failure path; loading checks `QMatrix::scales_finite` instead).
    fn name_non_finite(&self, name: &str) -> RuntimeError {
        let found = self
            .qtensor(name)
            .and_then(|q| Ok(q.dequantize(&Device::Cpu)?))
            .and_then(|t| crate::limits::check_finite_tensor(&self.what, name, &t));
        match found {
            Err(e) => e,
            Ok(()) => RuntimeError::format(
                format!("{}: {name}", self.what),
                "a block scale is NaN or infinite",
            ),
        }
    }

    /// The weight of `name` (HF layout, without `.weight`) after checking it is (out, inp); returns its GGUF name.
    fn checked_matrix(&self, name: &str, out: usize, inp: usize) -> Result<String> {
        let g = format!("{}.weight", gguf_name(name));
        let (info, _, _) = self.extent(&g)?;
        if info.shape.dims() != [out, inp] {
            return Err(RuntimeError::format(
                format!("{}: {g}", self.what),
                format!("expected shape {:?}, found {:?}", [out, inp], info.shape.dims()),
            ));
        }
        Ok(g)
    }

    /// The tensors `names` (each (rows_i, cols), one block format) read into one host matrix, rows stacked.
    fn host_matrix(
        &self,
        names: &[(String, usize)],
        cols: usize,
        format: BlockFormat,
    ) -> Result<Arc<QMatrix>> {
        let key: Vec<String> = names.iter().map(|(g, _)| g.clone()).collect();
        let built = self
            .ahead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&key);
        if let Some(m) = built {
            return Ok(m);
        }
        let rows: usize = names.iter().map(|(_, r)| r).sum();
        let mut bytes = Vec::new();
        for (g, _) in names {
            self.read_into(g, &mut bytes)?;
        }
        let what = format!("{}: {}", self.what, names[0].0);
        // In the file's order: the model gathers its matrices into one buffer next, interleaving them there.
        let m = QMatrix::file_order(&what, format, rows, cols, bytes)?;
        if !m.scales_finite() {
            // Name the tensor (and the element) that holds the bad value.
            for (g, _) in names {
                let e = self.name_non_finite(g);
                if matches!(e, RuntimeError::NonFinite { .. }) {
                    return Err(e);
                }
            }
            return Err(RuntimeError::format(what, "a block scale is NaN or infinite"));
        }
        Ok(Arc::new(m))
    }
}

/// A candle quantised tensor on `device` from a tensor's raw bytes.
fn qtensor_from_bytes(
    what: &str,
    info: &gguf_file::TensorInfo,
    bytes: &[u8],
    device: &Device,
) -> Result<QTensor> {
    // candle reinterprets the bytes as blocks and asserts their alignment (at most that of an f32); a `Vec<u8>`
    // from the system allocator is aligned far beyond it, so this only guards the assertion.
    if !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(RuntimeError::format(
            what,
            "tensor bytes are misaligned in memory",
        ));
    }
    let storage = QStorage::from_data(std::borrow::Cow::Borrowed(bytes), device, info.ggml_dtype)
        .map_err(|e| RuntimeError::format(what, e.to_string()))?;
    QTensor::new(storage, info.shape.dims().to_vec()).map_err(|e| RuntimeError::format(what, e.to_string()))
}

impl WeightSource for GgufSource {
    fn dense(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let g = format!("{}.weight", gguf_name(name));
        self.dense_named(&g, shape)
    }

    fn proj(&self, name: &str, out: usize, inp: usize, bias: bool) -> Result<Proj> {
        let mut ps = self.projs(&[(name, out)], inp, bias)?;
        ps.pop()
            .ok_or_else(|| RuntimeError::format(&self.what, format!("{name}: no projection")))
    }

    fn projs(&self, parts: &[(&str, usize)], inp: usize, bias: bool) -> Result<Vec<Proj>> {
        let mut names = Vec::with_capacity(parts.len());
        for &(name, out) in parts {
            names.push((self.checked_matrix(name, out, inp)?, out));
        }
        let mut biases = Vec::with_capacity(parts.len());
        for &(name, out) in parts {
            biases.push(if bias {
                Some(self.dense_named(&format!("{}.bias", gguf_name(name)), &[out])?)
            } else {
                None
            });
        }
        let formats: Vec<Option<BlockFormat>> = names
            .iter()
            .map(|(g, _)| Ok(BlockFormat::from_ggml(self.extent(g)?.0.ggml_dtype).filter(|_| self.host)))
            .collect::<Result<_>>()?;
        let mut out = Vec::with_capacity(parts.len());
        for run in stacked_runs(&formats) {
            let Some(format) = formats[run.start] else {
                // candle's quantised tensor on the device; its blocks are checked once, dequantised.
                let (g, _) = &names[run.start];
                let q = self.qtensor(g)?;
                crate::limits::check_finite_tensor(&self.what, g, &q.dequantize(&Device::Cpu)?)?;
                out.push(Proj::Quant {
                    w: QMatMul::from_qtensor(q)?,
                    b: biases[run.start].take(),
                });
                continue;
            };
            // A run of equal formats is read into one host matrix (q|k|v, gate|up stacked at load).
            let m = self.host_matrix(&names[run.clone()], inp, format)?;
            let mut first = 0;
            for k in run {
                let rows = names[k].1;
                out.push(Proj::Host {
                    w: HostRows::part(m.clone(), first, rows),
                    b: biases[k].take(),
                });
                first += rows;
            }
        }
        Ok(out)
    }

    fn embedding(&self, name: &str, shape: &[usize]) -> Result<Embedding> {
        let g = format!("{}.weight", gguf_name(name));
        let (info, _, _) = self.extent(&g)?;
        let format = BlockFormat::from_ggml(info.ggml_dtype).filter(|_| self.host);
        match (format, shape) {
            (Some(format), &[vocab, dim]) => {
                if info.shape.dims() != shape {
                    return Err(RuntimeError::format(
                        format!("{}: {g}", self.what),
                        format!("expected shape {:?}, found {:?}", shape, info.shape.dims()),
                    ));
                }
                let m = self.host_matrix(&[(g, vocab)], dim, format)?;
                Ok(Embedding::Host(m))
            }
            _ => Ok(Embedding::Dense(self.dense_named(&g, shape)?)),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.content
            .tensor_infos
            .contains_key(&format!("{}.weight", gguf_name(name)))
    }
}

impl GgufSource {
    /// The GGUF tensor `g` dequantised to a dense f32 tensor of exactly `shape`, checked finite.
    fn dense_named(&self, g: &str, shape: &[usize]) -> Result<Tensor> {
        let t = self.qtensor(g)?.dequantize(&self.device)?;
        check_shape(&format!("{}: {g}", self.what), &t, shape)?;
        crate::limits::check_finite_tensor(&self.what, g, &t)?;
        Ok(t)
    }
}

fn meta<'a>(c: &'a gguf_file::Content, what: &str, key: &str) -> Result<&'a gguf_file::Value> {
    c.metadata
        .get(key)
        .ok_or_else(|| RuntimeError::format(what, format!("metadata {key} is missing")))
}

/// A count from the metadata: an integer of any width, not negative. A negative number, or a value of another
/// type (a bool, a float, a string), is an error naming the key (candle's `to_u64` would read `true` as 1).
fn meta_usize(c: &gguf_file::Content, what: &str, key: &str) -> Result<usize> {
    count_value(meta(c, what, key)?, what, key)
}

/// [`meta_usize`] for a key that may be absent: `default` then; present, it is read as strictly.
fn meta_usize_or(c: &gguf_file::Content, what: &str, key: &str, default: usize) -> Result<usize> {
    match c.metadata.get(key) {
        None => Ok(default),
        Some(v) => count_value(v, what, key),
    }
}

fn count_value(v: &gguf_file::Value, what: &str, key: &str) -> Result<usize> {
    use gguf_file::Value as V;
    let bad = |why: String| RuntimeError::format(format!("{what}: {key}"), why);
    if let Some(n) = meta_int(v) {
        return usize::try_from(n).map_err(|_| bad(format!("{n} does not fit this machine's addresses")));
    }
    match *v {
        V::I8(x) => Err(bad(format!("{x} is negative, must be a count"))),
        V::I16(x) => Err(bad(format!("{x} is negative, must be a count"))),
        V::I32(x) => Err(bad(format!("{x} is negative, must be a count"))),
        V::I64(x) => Err(bad(format!("{x} is negative, must be a count"))),
        _ => Err(bad(format!(
            "stored as {:?}, must be a non-negative integer",
            v.value_type()
        ))),
    }
}

/// An integer metadata value of any width, if it is one and not negative.
fn meta_int(v: &gguf_file::Value) -> Option<u64> {
    use gguf_file::Value as V;
    match *v {
        V::U8(x) => Some(x.into()),
        V::U16(x) => Some(x.into()),
        V::U32(x) => Some(x.into()),
        V::U64(x) => Some(x),
        V::I8(x) => u64::try_from(x).ok(),
        V::I16(x) => u64::try_from(x).ok(),
        V::I32(x) => u64::try_from(x).ok(),
        V::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

/// Refuses the RoPE settings the model does not implement, which it would otherwise ignore and compute wrong logits
/// with: a rotary dimension, key or value length other than the head width (`prefix` is the architecture's key
/// prefix), any scaling (a type other than none or linear, a factor other than 1) and Llama 3's frequency factors.
fn check_rope(c: &gguf_file::Content, what: &str, prefix: &str, head_dim: usize) -> Result<()> {
    let bad = |key: &str, why: String| RuntimeError::format(format!("{what}: {key}"), why);
    for k in [
        "rope.dimension_count",
        "attention.key_length",
        "attention.value_length",
    ] {
        let key = format!("{prefix}.{k}");
        match c.metadata.get(&key).map(|v| (v, meta_int(v))) {
            None => {}
            Some((_, Some(n))) if n == head_dim as u64 => {}
            Some((_, Some(n))) => {
                return Err(bad(
                    &key,
                    format!(
                        "{n} is not the head width {head_dim} (embedding_length / attention.head_count): other \
                         widths are not implemented"
                    ),
                ));
            }
            Some((v, None)) => {
                return Err(bad(
                    &key,
                    format!("stored as {:?}, must be an integer", v.value_type()),
                ));
            }
        }
    }
    let key = format!("{prefix}.rope.scaling.type");
    match c.metadata.get(&key) {
        None => {}
        Some(gguf_file::Value::String(t)) if t == "none" || t == "linear" => {}
        Some(gguf_file::Value::String(t)) => {
            return Err(bad(
                &key,
                format!("{t:?} RoPE scaling is not implemented (none, or linear by a factor of 1)"),
            ));
        }
        Some(v) => {
            return Err(bad(
                &key,
                format!("stored as {:?}, must be a string", v.value_type()),
            ));
        }
    }
    for k in ["rope.scaling.factor", "rope.scale_linear"] {
        let key = format!("{prefix}.{k}");
        let Some(v) = c.metadata.get(&key) else {
            continue;
        };
        let f = v
            .to_f32()
            .map(f64::from)
            .or_else(|_| v.to_f64())
            .map_err(|_| bad(&key, format!("stored as {:?}, must be a float", v.value_type())))?;
        // llama.cpp reads 0 as no scaling.
        if f != 0.0 && f != 1.0 {
            return Err(bad(
                &key,
                format!("{f}: RoPE scaling is not implemented (only a factor of 1)"),
            ));
        }
    }
    if c.tensor_infos.contains_key("rope_freqs.weight") {
        return Err(bad(
            "rope_freqs.weight",
            "RoPE frequency factors (Llama 3's scaling) are not implemented".into(),
        ));
    }
    Ok(())
}

fn meta_f64(c: &gguf_file::Content, what: &str, key: &str, default: f64) -> Result<f64> {
    match c.metadata.get(key) {
        None => Ok(default),
        Some(v) => v
            .to_f32()
            .map(f64::from)
            .or_else(|_| v.to_f64())
            .map_err(|e| RuntimeError::format(format!("{what}: {key}"), e.to_string())),
    }
}

/// Reads a GGUF file's header (metadata and tensor infos) without reading its tensors; returns it with the open
/// file and its length. The file must be a regular file of at most [`crate::limits::MAX_MODEL_BYTES`].
fn read_header(path: &Path) -> Result<(gguf_file::Content, std::fs::File, u64)> {
    use std::io::{Read, Seek};
    let what = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let meta = file.metadata().map_err(|e| RuntimeError::io(path, e))?;
    if !meta.is_file() {
        return Err(RuntimeError::invalid(&what, "is not a regular file"));
    }
    let limit = crate::limits::MAX_MODEL_BYTES;
    if meta.len() > limit {
        return Err(RuntimeError::TooLarge {
            path: what,
            kind: "model",
            limit,
        });
    }
    // The header is parsed from memory: candle's parser asks for the stream position before every string (a
    // system call per token and merge when reading a file). A header longer than the first bytes read is read
    // again from four times as many, up to the whole file. It is scanned first (`gguf_header`): candle's parser
    // neither names what is wrong with a bad header nor checks the tensors' offsets.
    let mut want = HEADER_BYTES.min(meta.len());
    loop {
        let mut head = Vec::new();
        (&file)
            .take(want)
            .read_to_end(&mut head)
            .map_err(|e| RuntimeError::io(path, e))?;
        // A file that shrank while being read ends where the reading did.
        let len = if (head.len() as u64) < want {
            head.len() as u64
        } else {
            meta.len()
        };
        match crate::gguf_header::scan(&head, len) {
            Err(reason) => return Err(RuntimeError::format(&what, reason)),
            Ok(Scanned::More) => want = want.saturating_mul(4).min(meta.len()),
            Ok(Scanned::Sound) => {
                return match gguf_file::Content::read(&mut std::io::Cursor::new(head.as_slice())) {
                    Ok(content) => Ok((content, file, meta.len())),
                    Err(e) => Err(RuntimeError::format(&what, e.to_string())),
                };
            }
        }
        (&file)
            .seek(std::io::SeekFrom::Start(0))
            .map_err(|e| RuntimeError::io(path, e))?;
    }
}

/// The bytes first read for a GGUF header (SmolLM2's, with its 49,152 tokens and 48,900 merges, is about 1.7 MB).
const HEADER_BYTES: u64 = 4 << 20;

/// The architectures read: GGUF `general.architecture` and how it differs from Llama.
struct Arch {
    /// Metadata key prefix (`llama.block_count`, `qwen2.block_count`).
    prefix: &'static str,
    rope: RopeStyle,
    /// q/k/v biases (Qwen2).
    qkv_bias: bool,
    /// RoPE base when the file does not say.
    default_theta: f64,
}

fn arch_of(name: &str) -> Option<Arch> {
    match name {
        // llama.cpp's converter permutes Llama's q and k rows so that adjacent pairs rotate together.
        "llama" => Some(Arch {
            prefix: "llama",
            rope: RopeStyle::Interleaved,
            qkv_bias: false,
            default_theta: 10000.0,
        }),
        // Qwen2 keeps the Hugging Face layout (NeoX RoPE: first half with second half) and has q/k/v biases.
        "qwen2" => Some(Arch {
            prefix: "qwen2",
            rope: RopeStyle::Halves,
            qkv_bias: true,
            default_theta: 1e6,
        }),
        _ => None,
    }
}

/// Loads a Llama- or Qwen2-architecture GGUF model. On the CPU, matrices in the formats the host kernels read
/// (F32, F16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) are read straight into host matrices, q|k|v and gate|up each
/// into one when their formats agree, and the embedding and a tied output head stay in the file's format: the
/// quantised host route (docs/runtime.md). Elsewhere (a GPU), and for other formats, they become candle's
/// quantised tensors. Norms and biases are dequantised to f32. The header is read first, then each tensor once at
/// its offset (checked against the file's length first); every block's scales are checked finite.
pub fn load(path: &Path, device: &Device) -> Result<Model> {
    let (cfg, src) = open(path, device)?;
    let head = head_vocab(&src.content, &src.what, cfg.vocab_size)?;
    if src.host {
        src.gather_ahead(cfg.n_layers);
    }
    let model = Model::from_source(cfg, &src, device)?;
    match head {
        None => Ok(model),
        Some(hv) => model
            .with_head_vocab(hv)
            .map_err(|e| RuntimeError::format(format!("{}: {HEAD_IDS_KEY}", src.what), e.to_string())),
    }
}

/// A restricted draft head's map from the file's metadata ([`HEAD_IDS_KEY`], [`HEAD_FULL_VOCAB_KEY`]; both or
/// neither), checked against the model's vocabulary of `vocab` (the head's ids and "other").
fn head_vocab(
    c: &gguf_file::Content,
    what: &str,
    vocab: usize,
) -> Result<Option<crate::head_vocab::HeadVocab>> {
    let bad = |key: &str, why: String| RuntimeError::format(format!("{what}: {key}"), why);
    let (ids, full) = match (c.metadata.get(HEAD_IDS_KEY), c.metadata.get(HEAD_FULL_VOCAB_KEY)) {
        (None, None) => return Ok(None),
        (Some(ids), Some(full)) => (ids, full),
        (Some(_), None) => {
            return Err(bad(
                HEAD_FULL_VOCAB_KEY,
                "is missing beside the head's ids".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(bad(
                HEAD_IDS_KEY,
                "is missing beside the target's vocabulary".into(),
            ));
        }
    };
    let full = full
        .to_u32()
        .map_err(|e| bad(HEAD_FULL_VOCAB_KEY, e.to_string()))? as usize;
    if full > crate::limits::MAX_VOCAB {
        return Err(bad(
            HEAD_FULL_VOCAB_KEY,
            format!(
                "{full} exceeds the vocabulary limit of {}",
                crate::limits::MAX_VOCAB
            ),
        ));
    }
    let ids: Vec<u32> = ids
        .to_vec()
        .map_err(|e| bad(HEAD_IDS_KEY, e.to_string()))?
        .iter()
        .map(|v| v.to_u32().map_err(|e| bad(HEAD_IDS_KEY, e.to_string())))
        .collect::<Result<_>>()?;
    let hv = crate::head_vocab::HeadVocab::new(ids, full).map_err(|e| bad(HEAD_IDS_KEY, e.to_string()))?;
    if hv.compact_vocab() != vocab {
        return Err(bad(
            HEAD_IDS_KEY,
            format!(
                "{} ids and \"other\" for a vocabulary of {vocab} (token_embd.weight's rows)",
                hv.ids().len()
            ),
        ));
    }
    Ok(Some(hv))
}

/// Writes the model in the Hugging Face folder `dir` ([`crate::hf::read_dir`]: a restricted draft head's map
/// too) as a GGUF file with its matrices quantised to `dtype`, which [`load`] reads back: a Llama folder
/// (halves-paired RoPE, no biases) as GGUF `llama`, its query and key rows reordered to neighbour pairs as
/// llama.cpp's converter reorders them; a Qwen2 folder as `qwen2`. A draft stored so starts in a few
/// milliseconds, where a folder of f32 weights is read, copied and quantised at every start (docs/runtime.md,
/// "Start-up").
pub fn write_from_dir(dir: &Path, out: &Path, dtype: GgmlDType) -> Result<()> {
    let (mut cfg, mut tensors, head) = crate::hf::read_dir(dir)?;
    if !cfg.qkv_bias {
        let hd = cfg.head_dim();
        for i in 0..cfg.n_layers {
            for (part, heads) in [("q_proj", cfg.n_heads), ("k_proj", cfg.n_kv_heads)] {
                let name = format!("model.layers.{i}.self_attn.{part}.weight");
                let w = tensors.get(&name).ok_or_else(|| {
                    RuntimeError::format(dir.display().to_string(), format!("{name} is missing"))
                })?;
                // Row (h, j·hd/2 + i) in halves order is row (h, 2i + j) with neighbours paired.
                let d = w.dim(1)?;
                let paired = w
                    .reshape((heads, 2, hd / 2, d))?
                    .transpose(1, 2)?
                    .reshape((heads * hd, d))?
                    .contiguous()?;
                tensors.insert(name, paired);
            }
        }
        cfg.rope = RopeStyle::Interleaved;
    }
    let opts = WriteOptions {
        dtype,
        overrides: &[],
        vocab: None,
        head_vocab: head.as_ref(),
    };
    write_with(out, &cfg, &tensors, &opts)
}

/// The tensors `names` of a GGUF model (Hugging Face names as [`crate::model::tensor_shapes`] lists them, with
/// their shapes) dequantised to dense f32 tensors on the CPU, each checked finite, and the file's configuration:
/// what a draft initialised from some of the target's own layers starts from (`cargo xtask distill
/// --init-layers`). Query and key rows come back in the file's order, the one its [`Config::rope`] expects.
pub fn dense_tensors(
    path: &Path,
    names: &[(String, Vec<usize>)],
) -> Result<(Config, std::collections::HashMap<String, Tensor>)> {
    let (cfg, mut src) = open(path, &Device::Cpu)?;
    src.host = false;
    let mut out = std::collections::HashMap::with_capacity(names.len());
    for (name, shape) in names {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        out.insert(name.clone(), src.dense(stem, shape)?);
    }
    Ok((cfg, out))
}

/// A GGUF file's configuration (from its metadata, validated and checked against the limits) and its tensors'
/// source.
fn open(path: &Path, device: &Device) -> Result<(Config, GgufSource)> {
    let what = path.display().to_string();
    let (content, file, file_len) = read_header(path)?;
    let name = meta(&content, &what, "general.architecture")?
        .to_string()
        .map_err(|e| RuntimeError::format(format!("{what}: general.architecture"), e.to_string()))?
        .clone();
    let Some(arch) = arch_of(&name) else {
        return Err(RuntimeError::UnknownArchitecture(name));
    };
    let key = |k: &str| format!("{}.{k}", arch.prefix);
    let dim = meta_usize(&content, &what, &key("embedding_length"))?;
    let n_heads = meta_usize(&content, &what, &key("attention.head_count"))?;
    let vocab_size = match content.tensor_infos.get("token_embd.weight") {
        Some(info) => match info.shape.dims() {
            [v, _] => *v,
            dims => {
                return Err(RuntimeError::format(
                    format!("{what}: token_embd.weight"),
                    format!("shape {dims:?} is not (vocab, dim)"),
                ));
            }
        },
        None => return Err(RuntimeError::format(&what, "tensor token_embd.weight is missing")),
    };
    let cfg = Config {
        vocab_size,
        dim,
        hidden_dim: meta_usize(&content, &what, &key("feed_forward_length"))?,
        n_layers: meta_usize(&content, &what, &key("block_count"))?,
        n_heads,
        n_kv_heads: meta_usize_or(&content, &what, &key("attention.head_count_kv"), n_heads)?,
        max_seq_len: meta_usize(&content, &what, &key("context_length"))?,
        rms_eps: meta_f64(&content, &what, &key("attention.layer_norm_rms_epsilon"), 1e-5)?,
        rope_theta: meta_f64(&content, &what, &key("rope.freq_base"), arch.default_theta)?,
        rope: arch.rope,
        qkv_bias: arch.qkv_bias,
        tied_embeddings: !content.tensor_infos.contains_key("output.weight"),
    };
    cfg.validate()
        .map_err(|e| RuntimeError::format(format!("{what}: metadata"), e.to_string()))?;
    crate::limits::check_limits(&cfg, &format!("{what}: metadata"))?;
    check_rope(&content, &what, arch.prefix, cfg.head_dim())?;
    let src = GgufSource {
        what,
        content,
        file,
        file_len,
        device: device.clone(),
        host: device.is_cpu(),
        ahead: Default::default(),
    };
    Ok((cfg, src))
}

/// Whether llama.cpp prepends BOS for a byte-level BPE vocabulary whose file does not say
/// (`tokenizer.ggml.add_bos_token` absent): only for the pre-tokenizers it marks so (Llama 3 and its relatives,
/// Tekken, Chameleon); SmolLM2, Qwen2 and GPT-2 style vocabularies start without one.
fn bpe_adds_bos(pre: &str) -> bool {
    matches!(
        pre,
        "llama3"
            | "llama-v3"
            | "llama-bpe"
            | "falcon3"
            | "falcon-h1"
            | "pixtral"
            | "midm-2.0"
            | "lfm2"
            | "jina-v5-nano"
            | "tekken"
            | "chameleon"
    )
}

/// Builds the tokenizer embedded in a GGUF file (`tokenizer.ggml.model` = `gpt2`: byte-level BPE).
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let what = path.display().to_string();
    let (mut c, _, _) = read_header(path)?;
    let model = meta(&c, &what, "tokenizer.ggml.model")?
        .to_string()
        .cloned()
        .unwrap_or_default();
    if model != "gpt2" {
        return Err(RuntimeError::format(
            format!("{what}: tokenizer.ggml.model"),
            format!("{model:?} is not supported (expected gpt2)"),
        ));
    }
    // The two string arrays are taken out of the parsed header rather than copied (98,000 strings for SmolLM2).
    let mut strings = |key: &str| -> Result<Vec<String>> {
        use gguf_file::Value as V;
        let v = c
            .metadata
            .remove(key)
            .ok_or_else(|| RuntimeError::format(&what, format!("metadata {key} is missing")))?;
        let V::Array(items) = v else {
            return Err(RuntimeError::format(key, format!("not an array: {v:?}")));
        };
        items
            .into_iter()
            .map(|x| match x {
                V::String(s) => Ok(s),
                other => Err(RuntimeError::format(key, format!("not a string: {other:?}"))),
            })
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let merges = strings("tokenizer.ggml.merges")?;
    // BOS and EOS must be tokens of the vocabulary (a later lookup would fail mid-generation, or never match).
    let n_tokens = tokens.len();
    let id = |key: &str| -> Result<Option<u32>> {
        let Some(v) = c.metadata.get(key) else {
            return Ok(None);
        };
        let bad = |why: String| RuntimeError::format(format!("{what}: {key}"), why);
        match meta_int(v) {
            Some(n) if n < n_tokens as u64 => Ok(Some(n as u32)),
            Some(n) => Err(bad(format!(
                "{n} is outside the vocabulary of {n_tokens} tokens (tokenizer.ggml.tokens)"
            ))),
            None => Err(bad(format!("stored as {:?}, must be a token id", v.value_type()))),
        }
    };
    // Token types (llama.cpp's): 3 control, 4 user-defined. Control tokens are special (matched whole in the
    // text, e.g. `<|im_start|>` of a rendered chat template, and left out when decoding); user-defined ones are
    // matched whole too. BOS and EOS are special whatever the file says.
    // One i32 per token: an entry of another type, or an array of another length, would have marked the wrong
    // tokens special (each such entry used to count as a normal token).
    let types: Vec<i64> = match c.metadata.get("tokenizer.ggml.token_type") {
        Some(v) => {
            let key = format!("{what}: tokenizer.ggml.token_type");
            let xs = v
                .to_vec()
                .map_err(|e| RuntimeError::format(&key, e.to_string()))?;
            if xs.len() != n_tokens {
                return Err(RuntimeError::format(
                    &key,
                    format!(
                        "{} entries for {n_tokens} tokens (tokenizer.ggml.tokens)",
                        xs.len()
                    ),
                ));
            }
            xs.iter()
                .enumerate()
                .map(|(i, x)| {
                    x.to_i32().map(i64::from).map_err(|_| {
                        RuntimeError::format(
                            format!("{key}[{i}]"),
                            format!("stored as {:?}, must be an i32 token type", x.value_type()),
                        )
                    })
                })
                .collect::<Result<_>>()?
        }
        None => Vec::new(),
    };
    let (bos, eos) = (
        id("tokenizer.ggml.bos_token_id")?,
        id("tokenizer.ggml.eos_token_id")?,
    );
    let inner = byte_level_bpe(tokens, merges, &types, bos, eos)
        .map_err(|e| RuntimeError::Tokenizer(format!("{what}: {e}")))?;
    let pre = c
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(|v| v.to_string().ok())
        .cloned()
        .unwrap_or_default();
    let add_bos = match c.metadata.get("tokenizer.ggml.add_bos_token") {
        Some(v) => v.to_bool().map_err(|e| {
            RuntimeError::format(format!("{what}: tokenizer.ggml.add_bos_token"), e.to_string())
        })?,
        None => bpe_adds_bos(&pre),
    };
    let chat_template = match c.metadata.get("tokenizer.chat_template") {
        Some(v) => Some(
            v.to_string()
                .map_err(|e| RuntimeError::format(format!("{what}: tokenizer.chat_template"), e.to_string()))?
                .clone(),
        ),
        None => None,
    };
    Ok(Tokenizer::Hf {
        inner: Box::new(inner),
        bos,
        eos,
        add_bos,
        chat_template,
        // Token i of `tokenizer.ggml.tokens` has id i.
        id_space: n_tokens,
    })
}

/// The byte-level BPE tokenizer of a GGUF vocabulary (GPT-2's pre-tokenizer and decoder, no normaliser), built
/// from the token strings and merges directly: what Hugging Face's `tokenizer.json` of the same vocabulary loads
/// to, in about a third of the time a JSON round trip takes (SmolLM2's 49,152 tokens and 48,900 merges). Merges
/// are "a b" (lines starting `#version` skipped); control tokens (type 3), BOS and EOS become special added
/// tokens, user-defined ones (type 4) added tokens, all matched whole and never normalised.
fn byte_level_bpe(
    tokens: Vec<String>,
    merges: Vec<String>,
    types: &[i64],
    bos: Option<u32>,
    eos: Option<u32>,
) -> std::result::Result<tokenizers::Tokenizer, String> {
    use tokenizers::models::bpe::{BPE, Merges, Vocab};
    use tokenizers::{AddedToken, decoders, pre_tokenizers};
    // The tokens matched whole, before the vocabulary takes the strings over.
    let (mut special, mut user) = (Vec::new(), Vec::new());
    for (i, t) in tokens.iter().enumerate() {
        let i = i as u32;
        let kind = types.get(i as usize).copied().unwrap_or(1);
        let is_special = kind == 3 || Some(i) == bos || Some(i) == eos;
        if is_special || kind == 4 {
            let added = AddedToken::from(t.clone(), is_special)
                .single_word(false)
                .lstrip(false)
                .rstrip(false)
                .normalized(false);
            if is_special {
                special.push(added)
            } else {
                user.push(added)
            }
        }
    }
    let vocab: Vocab = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i as u32))
        .collect();
    let mut pairs: Merges = Vec::with_capacity(merges.len());
    for (rank, line) in merges
        .into_iter()
        .filter(|l| !l.starts_with("#version"))
        .enumerate()
    {
        // "a b": a keeps the line's buffer, b gets its own.
        let two = line.find(' ').filter(|&sp| !line[sp + 1..].contains(' '));
        match two {
            Some(sp) => {
                let mut a = line;
                let b = a.split_off(sp + 1);
                a.truncate(sp);
                pairs.push((a, b));
            }
            None => {
                return Err(format!(
                    "tokenizer.ggml.merges: merge {rank} ({line:?}) is not two tokens"
                ));
            }
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .build()
        .map_err(|e| e.to_string())?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let byte_level = || pre_tokenizers::byte_level::ByteLevel::new(false, true, true);
    tok.with_pre_tokenizer(Some(byte_level()));
    tok.with_decoder(Some(decoders::byte_level::ByteLevel::new(false, true, true)));
    tok.add_special_tokens(special).map_err(|e| e.to_string())?;
    tok.add_tokens(user).map_err(|e| e.to_string())?;
    Ok(tok)
}

/// A vocabulary to embed in a written GGUF file (`tokenizer.ggml.*`, byte-level BPE), for tests and exports.
#[derive(Debug, Clone, Default)]
pub struct GgufVocab {
    /// Token strings in the byte-level alphabet (`Ġ` for a space), id = index.
    pub tokens: Vec<String>,
    /// llama.cpp token types per token (1 normal, 3 control, 4 user-defined); empty: all normal.
    pub token_types: Vec<i32>,
    /// Merges, `"a b"` each.
    pub merges: Vec<String>,
    /// BOS id.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; `None` leaves the key out.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.pre`.
    pub pre: Option<String>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

/// How [`write_with`] writes a file.
#[derive(Debug, Clone)]
pub struct WriteOptions<'a> {
    /// The block format of every matrix whose width is a whole number of its blocks (others, and vectors, are
    /// written as f32).
    pub dtype: GgmlDType,
    /// Per-tensor formats instead of `dtype`: a Hugging Face name ending (`v_proj.weight`) and its format.
    pub overrides: &'a [(&'a str, GgmlDType)],
    /// A vocabulary to embed.
    pub vocab: Option<&'a GgufVocab>,
    /// A restricted draft head's map (`crate::head_vocab`), written as the metadata [`HEAD_IDS_KEY`] and
    /// [`HEAD_FULL_VOCAB_KEY`]; the model's vocabulary is then the head's compact one.
    pub head_vocab: Option<&'a crate::head_vocab::HeadVocab>,
}

/// GGUF metadata of a restricted draft head: the target ids the head scores (u32 array, in the head's order).
pub const HEAD_IDS_KEY: &str = "multispin.head_vocab.ids";
/// GGUF metadata of a restricted draft head: the target's vocabulary size (u32).
pub const HEAD_FULL_VOCAB_KEY: &str = "multispin.head_vocab.full_vocab";

/// Writes named tensors (Hugging Face layout) as a GGUF file: `llama` for an interleaved-RoPE model without
/// biases, `qwen2` for a halves-RoPE model with q/k/v biases (the only two layouts the loader reads); matrices
/// are quantised to `dtype` (norms stay f32). For tests and exports.
pub fn write(
    path: &Path,
    cfg: &Config,
    tensors: &std::collections::HashMap<String, Tensor>,
    dtype: GgmlDType,
) -> Result<()> {
    let opts = WriteOptions {
        head_vocab: None,
        dtype,
        overrides: &[],
        vocab: None,
    };
    write_with(path, cfg, tensors, &opts)
}

/// [`write()`] with per-tensor formats and an embedded vocabulary.
pub fn write_with(
    path: &Path,
    cfg: &Config,
    tensors: &std::collections::HashMap<String, Tensor>,
    opts: &WriteOptions<'_>,
) -> Result<()> {
    let arch = match (cfg.rope, cfg.qkv_bias) {
        (RopeStyle::Interleaved, false) => "llama",
        (RopeStyle::Halves, true) => "qwen2",
        _ => {
            return Err(RuntimeError::invalid(
                "config",
                "GGUF holds interleaved-RoPE Llama without biases (llama) or halves-RoPE with q/k/v biases (qwen2)",
            ));
        }
    };
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let mut qs = Vec::new();
    for n in names {
        let t = &tensors[n];
        let (base, suffix) = match n.strip_suffix(".weight") {
            Some(b) => (b, "weight"),
            None => match n.strip_suffix(".bias") {
                Some(b) => (b, "bias"),
                None => (n.as_str(), "weight"),
            },
        };
        let g = format!("{}.{suffix}", gguf_name(base));
        let dtype = opts
            .overrides
            .iter()
            .find(|(end, _)| n.ends_with(end))
            .map_or(opts.dtype, |&(_, d)| d);
        let q = if t.rank() == 2 && t.dim(1)? % dtype.block_size() == 0 {
            QTensor::quantize(t, dtype)?
        } else {
            QTensor::quantize(t, GgmlDType::F32)?
        };
        qs.push((g, q));
    }
    use gguf_file::Value as V;
    let k = |key: &str| format!("{arch}.{key}");
    let mut md: Vec<(String, V)> = vec![
        ("general.architecture".into(), V::String(arch.into())),
        (k("embedding_length"), V::U32(cfg.dim as u32)),
        (k("feed_forward_length"), V::U32(cfg.hidden_dim as u32)),
        (k("block_count"), V::U32(cfg.n_layers as u32)),
        (k("attention.head_count"), V::U32(cfg.n_heads as u32)),
        (k("attention.head_count_kv"), V::U32(cfg.n_kv_heads as u32)),
        (k("context_length"), V::U32(cfg.max_seq_len as u32)),
        (k("attention.layer_norm_rms_epsilon"), V::F32(cfg.rms_eps as f32)),
        (k("rope.freq_base"), V::F32(cfg.rope_theta as f32)),
    ];
    if let Some(v) = opts.vocab {
        let strings = |xs: &[String]| V::Array(xs.iter().map(|x| V::String(x.clone())).collect());
        md.push(("tokenizer.ggml.model".into(), V::String("gpt2".into())));
        md.push(("tokenizer.ggml.tokens".into(), strings(&v.tokens)));
        md.push(("tokenizer.ggml.merges".into(), strings(&v.merges)));
        if !v.token_types.is_empty() {
            let types = v.token_types.iter().map(|&t| V::I32(t)).collect();
            md.push(("tokenizer.ggml.token_type".into(), V::Array(types)));
        }
        if let Some(b) = v.bos {
            md.push(("tokenizer.ggml.bos_token_id".into(), V::U32(b)));
        }
        if let Some(e) = v.eos {
            md.push(("tokenizer.ggml.eos_token_id".into(), V::U32(e)));
        }
        if let Some(a) = v.add_bos {
            md.push(("tokenizer.ggml.add_bos_token".into(), V::Bool(a)));
        }
        if let Some(p) = &v.pre {
            md.push(("tokenizer.ggml.pre".into(), V::String(p.clone())));
        }
        if let Some(t) = &v.chat_template {
            md.push(("tokenizer.chat_template".into(), V::String(t.clone())));
        }
    }
    if let Some(hv) = opts.head_vocab {
        if cfg.vocab_size != hv.compact_vocab() {
            return Err(RuntimeError::invalid(
                "vocab_size",
                format!("{} is not the head's {} ids", cfg.vocab_size, hv.compact_vocab()),
            ));
        }
        md.push((
            HEAD_IDS_KEY.into(),
            V::Array(hv.ids().iter().map(|&i| V::U32(i)).collect()),
        ));
        md.push((HEAD_FULL_VOCAB_KEY.into(), V::U32(hv.full_vocab() as u32)));
    }
    let md_refs: Vec<(&str, &V)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = qs.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).map_err(|e| RuntimeError::io(path, e))?;
    gguf_file::write(&mut f, &md_refs, &t_refs)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{byte_level_bpe, stacked_runs};

    /// Runs of equal formats stack together; a missing or other-route entry (None) stands alone and ends a run.
    #[test]
    fn stacked_runs_group_equal_neighbours_only() {
        assert_eq!(stacked_runs(&[Some(1), Some(1), Some(1)]), vec![0..3]);
        assert_eq!(stacked_runs(&[Some(1), Some(1), Some(2)]), vec![0..2, 2..3]);
        assert_eq!(stacked_runs(&[Some(1), Some(2), Some(1)]), vec![0..1, 1..2, 2..3]);
        assert_eq!(stacked_runs::<u8>(&[None, None]), vec![0..1, 1..2]);
        assert_eq!(stacked_runs(&[Some(1), None, Some(1)]), vec![0..1, 1..2, 2..3]);
        assert_eq!(stacked_runs::<u8>(&[]), Vec::<std::ops::Range<usize>>::new());
    }

    /// The tokenizer.json a GGUF vocabulary stands for (Hugging Face's byte-level BPE), loaded by the tokenizers
    /// crate's own parser: the reference the direct build must equal.
    fn from_json(tokens: &[String], merges: &[String], types: &[i64]) -> tokenizers::Tokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), serde_json::Value::from(i as u32)))
            .collect();
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| types[*i] == 3 || types[*i] == 4)
            .map(|(i, t)| {
                serde_json::json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                                   "rstrip": false, "normalized": false, "special": types[i] == 3})
            })
            .collect();
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        serde_json::json!({
            "version": "1.0", "added_tokens": added, "normalizer": null, "pre_tokenizer": byte_level,
            "post_processor": null, "decoder": byte_level,
            "model": {"type": "BPE", "vocab": vocab, "merges": merges, "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                      "byte_fallback": false},
        })
        .to_string()
        .parse()
        .unwrap()
    }

    #[test]
    fn the_direct_build_tokenizes_and_decodes_as_the_json_route() {
        // Every byte of the byte-level alphabet, merges building words and spaced words, a control token and a
        // user-defined one.
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort_unstable();
        let mut tokens: Vec<String> = alphabet.iter().map(char::to_string).collect();
        let merges: Vec<String> = [
            "h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "r l", "Ġwo rl", "Ġworl d", "Ċ Ċ",
        ]
        .iter()
        .map(|m| (*m).to_owned())
        .collect();
        for m in &merges {
            tokens.push(m.replace(' ', ""));
        }
        tokens.extend(["<|im_start|>".to_owned(), "<user-word>".to_owned()]);
        let mut types = vec![1i64; tokens.len()];
        let n = types.len();
        types[n - 2] = 3;
        types[n - 1] = 4;
        let direct = byte_level_bpe(tokens.clone(), merges.clone(), &types, None, None).unwrap();
        let reference = from_json(&tokens, &merges, &types);
        for text in [
            "hello world",
            "hello  world\n\nhello",
            "<|im_start|>user\nhello<user-word> wörld 😀",
            "   ",
            "",
        ] {
            let a = direct.encode(text, false).unwrap();
            let b = reference.encode(text, false).unwrap();
            assert_eq!(a.get_ids(), b.get_ids(), "{text:?}");
            assert_eq!(
                direct.decode(a.get_ids(), true).unwrap(),
                reference.decode(b.get_ids(), true).unwrap(),
                "{text:?}"
            );
        }
        // The merges and added tokens took: whole words, the control token matched whole.
        let ids = direct.encode("<|im_start|>hello world", false).unwrap();
        assert_eq!(ids.get_ids(), [266, 259, 264], "<|im_start|>, hello, Ġworld");
        // A merge that is not two tokens names the key.
        let e = byte_level_bpe(tokens.clone(), vec!["h e l".to_owned()], &types, None, None).unwrap_err();
        assert!(e.contains("tokenizer.ggml.merges"), "{e}");
    }
}
