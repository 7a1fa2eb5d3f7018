//! llama2.c "v0" checkpoints (with grouped-query attention) and the llama2.c tokenizer format (`tok512.bin`).
//!
//! Checkpoint: 7 little-endian i32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; a
//! negative vocab size means a separate classifier follows), then f32 tensors layer-major by kind, then the RoPE
//! tables (ignored: we recompute them), then the classifier when unshared. Tokenizer: i32 max token length, then per
//! token an f32 merge score, an i32 byte length and the bytes.

use crate::error::{Result, RuntimeError};
use crate::model::{Config, Model, RopeStyle, TensorMap, WeightSource};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

const HEADER_BYTES: usize = 7 * 4;

fn read_i32(b: &[u8], i: usize) -> i32 {
    i32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// Parses the 7-field header; returns the config and whether the classifier is shared.
pub fn parse_header(bytes: &[u8], what: &str) -> Result<Config> {
    if bytes.len() < HEADER_BYTES {
        return Err(RuntimeError::format(
            what,
            format!("truncated: {} bytes, header needs 28", bytes.len()),
        ));
    }
    let names = [
        "dim",
        "hidden_dim",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "vocab_size",
        "seq_len",
    ];
    let mut v = [0usize; 7];
    let mut shared = true;
    for (i, name) in names.iter().enumerate() {
        let x = read_i32(bytes, i);
        let x = if i == 5 && x < 0 {
            shared = false;
            -(x as i64)
        } else {
            x as i64
        };
        if x <= 0 {
            return Err(RuntimeError::format(
                format!("{what}: header.{name}"),
                format!("{x} is not positive"),
            ));
        }
        v[i] = x as usize;
    }
    let cfg = Config {
        dim: v[0],
        hidden_dim: v[1],
        n_layers: v[2],
        n_heads: v[3],
        n_kv_heads: v[4],
        vocab_size: v[5],
        max_seq_len: v[6],
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: shared,
    };
    cfg.validate()
        .map_err(|e| RuntimeError::format(format!("{what}: header"), e.to_string()))?;
    crate::limits::check_limits(&cfg, &format!("{what}: header"))?;
    Ok(cfg)
}

/// The tensors of a v0 file in file order: (name in the Hugging Face layout, per-layer shape, stacked over layers).
fn layout(cfg: &Config) -> Vec<(&'static str, Vec<usize>, bool)> {
    let (d, h, kv, v) = (cfg.dim, cfg.hidden_dim, cfg.kv_dim(), cfg.vocab_size);
    vec![
        ("model.embed_tokens.weight", vec![v, d], false),
        ("input_layernorm.weight", vec![d], true),
        ("self_attn.q_proj.weight", vec![d, d], true),
        ("self_attn.k_proj.weight", vec![kv, d], true),
        ("self_attn.v_proj.weight", vec![kv, d], true),
        ("self_attn.o_proj.weight", vec![d, d], true),
        ("post_attention_layernorm.weight", vec![d], true),
        ("mlp.gate_proj.weight", vec![h, d], true),
        ("mlp.down_proj.weight", vec![d, h], true),
        ("mlp.up_proj.weight", vec![h, d], true),
        ("model.norm.weight", vec![d], false),
    ]
}

/// Floats after the header. Cannot overflow: [`crate::limits::check_limits`] bounds every factor (below 2^47 in all).
fn expected_floats(cfg: &Config) -> usize {
    let body: usize = layout(cfg)
        .iter()
        .map(|(_, s, per_layer)| s.iter().product::<usize>() * if *per_layer { cfg.n_layers } else { 1 })
        .sum();
    let rope = 2 * cfg.max_seq_len * cfg.head_dim() / 2;
    let cls = if cfg.tied_embeddings {
        0
    } else {
        cfg.vocab_size * cfg.dim
    };
    body + rope + cls
}

/// Reads a llama2.c v0 checkpoint into a model on `device`.
///
/// The header is read first: it fixes the file size, which must be at most [`crate::limits::MAX_MODEL_BYTES`] and is
/// checked before the weights are read (a regular file by its metadata, anything else through a bounded read).
pub fn load_checkpoint(path: &Path, device: &Device) -> Result<Model> {
    use std::io::Read;
    let what = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(|e| RuntimeError::io(path, e))?;
    let meta = file.metadata().map_err(|e| RuntimeError::io(path, e))?;
    if meta.is_dir() {
        return Err(RuntimeError::invalid(
            what,
            "is a directory, not a llama2.c checkpoint",
        ));
    }
    let mut header = Vec::with_capacity(HEADER_BYTES);
    (&mut file)
        .take(HEADER_BYTES as u64)
        .read_to_end(&mut header)
        .map_err(|e| RuntimeError::io(path, e))?;
    let cfg = parse_header(&header, &what)?;
    let want = (HEADER_BYTES + 4 * expected_floats(&cfg)) as u64;
    if want > crate::limits::MAX_MODEL_BYTES {
        return Err(RuntimeError::TooLarge {
            path: what,
            kind: "model",
            limit: crate::limits::MAX_MODEL_BYTES,
        });
    }
    if meta.is_file() && meta.len() != want {
        return Err(size_error(&what, meta.len(), want));
    }
    // Each tensor is read straight into its own buffer, which becomes the tensor: one copy from the file, none
    // in between (docs/runtime.md, "Start-up").
    let mut read = |n: usize| -> Result<Vec<f32>> {
        let mut values = vec![0f32; n];
        file.read_exact(bytemuck::cast_slice_mut(&mut values))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => size_error(&what, meta.len().min(want - 1), want),
                _ => RuntimeError::io(path, e),
            })?;
        if cfg!(target_endian = "big") {
            for x in &mut values {
                *x = f32::from_bits(u32::from_le(x.to_bits()));
            }
        }
        Ok(values)
    };
    let map = build_tensors(&cfg, &what, device, &mut read)?;
    // A pipe or device reports no length: anything after the last tensor is an error too.
    let mut extra = [0u8; 1];
    if file.read(&mut extra).map_err(|e| RuntimeError::io(path, e))? != 0 {
        return Err(size_error(&what, want + 1, want));
    }
    Model::from_source(cfg, &map, device)
}

/// Loads a llama2.c v0 checkpoint held in memory (e.g. embedded with `include_bytes!`); errors name it `checkpoint`.
pub fn load_checkpoint_bytes(bytes: &[u8], device: &Device) -> Result<Model> {
    from_bytes(bytes, "checkpoint", device)
}

fn from_bytes(bytes: &[u8], what: &str, device: &Device) -> Result<Model> {
    let (cfg, map) = parse_checkpoint(bytes, what, device)?;
    Model::from_source(cfg, &map, device)
}

fn size_error(what: &str, found: u64, want: u64) -> RuntimeError {
    let kind = if found < want {
        "truncated"
    } else {
        "trailing bytes"
    };
    RuntimeError::format(what, format!("{kind}: {found} bytes, the header implies {want}"))
}

/// Parses checkpoint bytes into a config and named tensors: each tensor's floats are decoded once, into the
/// buffer the tensor then owns.
pub(crate) fn parse_checkpoint(bytes: &[u8], what: &str, device: &Device) -> Result<(Config, TensorMap)> {
    let cfg = parse_header(bytes, what)?;
    let want = HEADER_BYTES + 4 * expected_floats(&cfg);
    if bytes.len() != want {
        return Err(size_error(what, bytes.len() as u64, want as u64));
    }
    let mut at = HEADER_BYTES;
    let mut read = |n: usize| -> Result<Vec<f32>> {
        let values = bytes[at..at + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        at += 4 * n;
        Ok(values)
    };
    let map = build_tensors(&cfg, what, device, &mut read)?;
    Ok((cfg, map))
}

/// The named tensors of a v0 checkpoint whose header `cfg` has been read, taking each tensor's floats (in file
/// order) from `read`; the RoPE tables are read and dropped (the model recomputes them).
fn build_tensors(
    cfg: &Config,
    what: &str,
    device: &Device,
    read: &mut dyn FnMut(usize) -> Result<Vec<f32>>,
) -> Result<TensorMap> {
    let mut tensors = HashMap::new();
    // Every weight must be finite: a NaN would only surface as NaN probabilities at the first token.
    let take =
        |read: &mut dyn FnMut(usize) -> Result<Vec<f32>>, name: &str, shape: &[usize]| -> Result<Tensor> {
            let values = read(shape.iter().product())?;
            crate::limits::check_finite(what, name, &values)?;
            Ok(Tensor::from_vec(values, shape, device)?)
        };
    for (name, shape, per_layer) in layout(cfg) {
        if per_layer {
            for i in 0..cfg.n_layers {
                let full = format!("model.layers.{i}.{name}");
                let t = take(read, &full, &shape)?;
                tensors.insert(full, t);
            }
        } else {
            tensors.insert(name.to_string(), take(read, name, &shape)?);
        }
    }
    // The RoPE tables (not checked): the model recomputes them.
    drop(read(2 * cfg.max_seq_len * cfg.head_dim() / 2)?);
    if !cfg.tied_embeddings {
        tensors.insert(
            "lm_head.weight".to_string(),
            take(read, "lm_head.weight", &[cfg.vocab_size, cfg.dim])?,
        );
    }
    Ok(TensorMap {
        what: what.to_string(),
        tensors,
        device: device.clone(),
    })
}

/// Writes named tensors (Hugging Face layout, as from [`crate::model::random_tensors`] or training) as a v0
/// checkpoint. The config must use interleaved RoPE, no biases, θ = 10000.
pub fn write_checkpoint(path: &Path, cfg: &Config, tensors: &HashMap<String, Tensor>) -> Result<()> {
    if cfg.rope != RopeStyle::Interleaved || cfg.qkv_bias || cfg.rope_theta != 10000.0 {
        return Err(RuntimeError::invalid(
            "config",
            "llama2.c v0 holds only interleaved-RoPE Llama without biases",
        ));
    }
    let map = TensorMap {
        what: "tensors".into(),
        tensors: tensors.clone(),
        device: Device::Cpu,
    };
    let mut out = Vec::with_capacity(HEADER_BYTES + 4 * expected_floats(cfg));
    let vocab = if cfg.tied_embeddings {
        cfg.vocab_size as i32
    } else {
        -(cfg.vocab_size as i32)
    };
    for x in [cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads].map(|x| x as i32) {
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&vocab.to_le_bytes());
    out.extend_from_slice(&(cfg.max_seq_len as i32).to_le_bytes());
    let mut push = |t: Tensor| -> Result<()> {
        for x in t.flatten_all()?.to_vec1::<f32>()? {
            out.extend_from_slice(&x.to_le_bytes());
        }
        Ok(())
    };
    for (name, shape, per_layer) in layout(cfg) {
        let base = name.trim_end_matches(".weight");
        if per_layer {
            for i in 0..cfg.n_layers {
                push(map.dense(&format!("model.layers.{i}.{base}"), &shape)?)?;
            }
        } else {
            push(map.dense(base, &shape)?)?;
        }
    }
    let half = cfg.head_dim() / 2;
    let mut re = Vec::with_capacity(cfg.max_seq_len * half);
    let mut im = Vec::with_capacity(cfg.max_seq_len * half);
    for p in 0..cfg.max_seq_len {
        for i in 0..half {
            let a = p as f64 * cfg.rope_theta.powf(-2.0 * i as f64 / cfg.head_dim() as f64);
            re.push(a.cos() as f32);
            im.push(a.sin() as f32);
        }
    }
    push(Tensor::new(re, &Device::Cpu)?)?;
    push(Tensor::new(im, &Device::Cpu)?)?;
    if !cfg.tied_embeddings {
        push(map.dense("lm_head", &[cfg.vocab_size, cfg.dim])?)?;
    }
    std::fs::write(path, out).map_err(|e| RuntimeError::io(path, e))
}

/// The llama2.c BPE tokenizer: scored pieces, byte fallback tokens `<0xXX>` at ids 3..=258, BOS 1, EOS 2.
#[derive(Debug, Clone)]
pub struct Llama2cTokenizer {
    pieces: Vec<Vec<u8>>,
    scores: Vec<f32>,
    lookup: HashMap<Vec<u8>, u32>,
    max_len: usize,
}

impl Llama2cTokenizer {
    /// BOS id.
    pub const BOS: u32 = 1;
    /// EOS id.
    pub const EOS: u32 = 2;

    /// The fewest entries a tokenizer may hold: `<unk>`, `<s>`, `</s>` and the 256 byte tokens `<0xXX>` that the
    /// encoder falls back to (ids 3..=258).
    pub const MIN_VOCAB: usize = 259;

    /// Reads a tokenizer file holding exactly `vocab_size` entries (at most
    /// [`crate::limits::MAX_TOKENIZER_BYTES`] bytes, checked before reading).
    pub fn load(path: &Path, vocab_size: usize) -> Result<Self> {
        let bytes = crate::limits::read_limited(path, crate::limits::MAX_TOKENIZER_BYTES, "tokenizer")?;
        Self::parse(&bytes, vocab_size, &path.display().to_string())
    }

    /// Parses tokenizer bytes. The entries are self-delimiting, so the file is read to its end first: a file with
    /// another number of entries than `vocab_size` is a [`RuntimeError::VocabMismatch`] (a tokenizer of another
    /// model), not a truncation.
    pub fn parse(bytes: &[u8], vocab_size: usize, what: &str) -> Result<Self> {
        let trunc = |at: usize, i: usize| {
            RuntimeError::format(
                what,
                format!("truncated in token[{i}] at byte {at} ({} bytes)", bytes.len()),
            )
        };
        if bytes.len() < 4 {
            return Err(RuntimeError::format(
                what,
                format!("truncated: {} bytes, the header needs 4", bytes.len()),
            ));
        }
        let max_len = read_i32(bytes, 0);
        if max_len <= 0 {
            return Err(RuntimeError::format(
                format!("{what}: max_token_length"),
                format!("{max_len} is not positive"),
            ));
        }
        let mut at = 4usize;
        let mut pieces = Vec::new();
        let mut scores = Vec::new();
        while at < bytes.len() {
            let i = pieces.len();
            if at + 8 > bytes.len() {
                return Err(trunc(at, i));
            }
            let score = f32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
            let len = i32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
            if score.is_nan() {
                return Err(RuntimeError::format(
                    format!("{what}: token[{i}].score"),
                    "is NaN",
                ));
            }
            at += 8;
            if len < 0 || len > max_len {
                return Err(RuntimeError::format(
                    format!("{what}: token[{i}].length"),
                    format!("{len} is outside 0..={max_len}"),
                ));
            }
            let len = len as usize;
            if at + len > bytes.len() {
                return Err(trunc(at, i));
            }
            pieces.push(bytes[at..at + len].to_vec());
            scores.push(score);
            at += len;
        }
        if pieces.len() != vocab_size {
            return Err(RuntimeError::VocabMismatch {
                path: what.to_string(),
                tokens: pieces.len(),
                vocab_size,
            });
        }
        if pieces.len() < Self::MIN_VOCAB {
            return Err(RuntimeError::format(
                what,
                format!(
                    "{} tokens, fewer than the {} of the special and byte-fallback tokens",
                    pieces.len(),
                    Self::MIN_VOCAB
                ),
            ));
        }
        Ok(Self::build(pieces, scores))
    }

    fn build(pieces: Vec<Vec<u8>>, scores: Vec<f32>) -> Self {
        let max_len = pieces.iter().map(Vec::len).max().unwrap_or(1).max(1);
        // On duplicate pieces the lowest id wins (llama2.c's sorted lookup finds one of them; ours is fixed).
        let mut lookup = HashMap::with_capacity(pieces.len());
        for (i, p) in pieces.iter().enumerate() {
            lookup.entry(p.clone()).or_insert(i as u32);
        }
        Llama2cTokenizer {
            pieces,
            scores,
            lookup,
            max_len,
        }
    }

    /// A lower bound on the tokens of `encode(text, bos)`, computed without encoding: no token is longer than the
    /// longest piece.
    pub fn min_tokens(&self, text: &str, bos: bool) -> usize {
        usize::from(bos) + text.len().div_ceil(self.max_len)
    }

    /// Serialises the tokenizer in the llama2.c format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = (self.max_len as i32).to_le_bytes().to_vec();
        for (p, s) in self.pieces.iter().zip(&self.scores) {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&(p.len() as i32).to_le_bytes());
            out.extend_from_slice(p);
        }
        out
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// Encodes text: optional BOS, a dummy leading space, code points (or their bytes as fallback tokens), then
    /// greedy merges of the adjacent pair with the highest score (the leftmost among equal scores), as llama2.c.
    pub fn encode(&self, text: &str, bos: bool) -> Vec<u32> {
        self.encode_counting(text, bos).0
    }

    /// [`Self::encode`], also returning the number of pair lookups it made: at most 3 per initial symbol
    /// (one per initial pair, two per merge), so encoding is O(n log n) in the text length.
    ///
    /// llama2.c rescans every pair after each merge (O(n²): 30k characters took 41 s). Here the symbols form a
    /// linked list and the candidate merges a max-heap ordered by (score, leftmost position); a popped candidate
    /// whose two symbols changed or are no longer adjacent is stale and skipped. Hand-written because the merge
    /// order must be exactly llama2.c's, which no BPE crate reproduces for this scored format.
    pub fn encode_counting(&self, text: &str, bos: bool) -> (Vec<u32>, usize) {
        use std::cmp::Ordering;
        use std::collections::BinaryHeap;

        #[derive(PartialEq)]
        struct Candidate {
            score: f32,
            left: usize,
            left_id: u32,
            right_id: u32,
            merged: u32,
        }
        impl Eq for Candidate {}
        impl Ord for Candidate {
            fn cmp(&self, other: &Self) -> Ordering {
                self.score
                    .total_cmp(&other.score)
                    .then_with(|| other.left.cmp(&self.left))
            }
        }
        impl PartialOrd for Candidate {
            fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
                Some(self.cmp(other))
            }
        }

        let mut out = Vec::new();
        if bos {
            out.push(Self::BOS);
        }
        if text.is_empty() {
            return (out, 0);
        }
        let mut ids: Vec<u32> = Vec::with_capacity(text.len() + 1);
        if let Some(&space) = self.lookup.get(b" ".as_slice()) {
            ids.push(space);
        }
        for ch in text.chars() {
            let mut buf = [0u8; 4];
            let s = ch.encode_utf8(&mut buf).as_bytes();
            match self.lookup.get(s) {
                Some(&id) => ids.push(id),
                None => ids.extend(s.iter().map(|&b| u32::from(b) + 3)),
            }
        }
        let n = ids.len();
        const NONE: usize = usize::MAX;
        let mut prev: Vec<usize> = (0..n).map(|i| i.checked_sub(1).unwrap_or(NONE)).collect();
        let mut next: Vec<usize> = (1..=n).map(|i| if i < n { i } else { NONE }).collect();
        let mut heap = BinaryHeap::with_capacity(n);
        let mut lookups = 0usize;
        let mut joined = Vec::with_capacity(2 * self.max_len);
        let mut candidate = |ids: &[u32], left: usize, right: usize, heap: &mut BinaryHeap<Candidate>| {
            lookups += 1;
            let (a, b) = (ids[left], ids[right]);
            joined.clear();
            joined.extend_from_slice(self.piece(a));
            joined.extend_from_slice(self.piece(b));
            if let Some(&merged) = self.lookup.get(&joined) {
                heap.push(Candidate {
                    score: self.scores[merged as usize],
                    left,
                    left_id: a,
                    right_id: b,
                    merged,
                });
            }
        };
        for i in 0..n.saturating_sub(1) {
            candidate(&ids, i, i + 1, &mut heap);
        }
        while let Some(c) = heap.pop() {
            let right = next[c.left];
            // Merged symbols are unlinked (no `next` points to them), so `c.left` alive is implied when its
            // successor still carries the right id and it still carries the left one.
            if right == NONE || ids[c.left] != c.left_id || ids[right] != c.right_id || prev[right] != c.left
            {
                continue;
            }
            ids[c.left] = c.merged;
            next[c.left] = next[right];
            if next[right] != NONE {
                prev[next[right]] = c.left;
            }
            // The merged-away symbol can never match again.
            prev[right] = NONE;
            next[right] = NONE;
            ids[right] = u32::MAX;
            if prev[c.left] != NONE {
                candidate(&ids, prev[c.left], c.left, &mut heap);
            }
            if next[c.left] != NONE {
                candidate(&ids, c.left, next[c.left], &mut heap);
            }
        }
        let mut i = 0;
        while i != NONE {
            out.push(ids[i]);
            i = next[i];
        }
        (out, lookups)
    }

    /// The bytes of token `id` (empty for an id outside the vocabulary).
    fn piece(&self, id: u32) -> &[u8] {
        self.pieces.get(id as usize).map_or(&[], Vec::as_slice)
    }

    /// Decodes ids to text: special tokens are dropped, `<0xXX>` become raw bytes, a leading space after BOS (or at
    /// the start) is stripped.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut prev = Self::BOS;
        for &id in ids {
            let Some(piece) = self.pieces.get(id as usize) else {
                continue;
            };
            if id < 3 {
                prev = id;
                continue;
            }
            if (3..259).contains(&id) && piece.len() == 6 && piece.starts_with(b"<0x") {
                bytes.push((id - 3) as u8);
            } else if prev == Self::BOS && piece.first() == Some(&b' ') {
                bytes.extend_from_slice(&piece[1..]);
            } else {
                bytes.extend_from_slice(piece);
            }
            prev = id;
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A tokenizer with the byte-fallback layout and the given extra pieces (for tests).
    pub fn from_pieces(extra: &[(&str, f32)]) -> Self {
        let mut pieces: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec(), b"</s>".to_vec()];
        let mut scores = vec![0.0f32; 3];
        for b in 0..=255u8 {
            pieces.push(format!("<0x{b:02X}>").into_bytes());
            scores.push(0.0);
        }
        for (p, s) in extra {
            pieces.push(p.as_bytes().to_vec());
            scores.push(*s);
        }
        Self::build(pieces, scores)
    }
}
