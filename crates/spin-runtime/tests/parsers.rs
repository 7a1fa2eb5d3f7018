//! Every file parser under hostile input (issue 13): seeded mutation loops over llama2.c checkpoints and
//! tokenizers, GGUF files, `config.json` and `tokenizer.json` (no panic, every failure a typed error), and the
//! llama2.c BPE encoder against the quadratic reference with a work bound on long prompts.

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_runtime::llama2c::{self, Llama2cTokenizer};
use spin_runtime::{Config, RopeStyle, RuntimeError, Tokenizer, gguf, hf, model};

fn tiny_config(vocab: usize) -> Config {
    Config {
        vocab_size: vocab,
        dim: 8,
        hidden_dim: 12,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: 8,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    }
}

fn tokenizer() -> Llama2cTokenizer {
    Llama2cTokenizer::from_pieces(&[
        (" ", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        (" a", -0.5),
        ("ab", -0.1),
        ("ba", -0.3),
    ])
}

/// Applies 1–4 random mutations: a random byte, an extreme 32-bit value, a truncation, an insertion or a splice.
fn mutate<R: Rng>(rng: &mut R, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..rng.random_range(1..5) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..b.len());
        match rng.random_range(0..6) {
            0 => b[at] = rng.random(),
            1 => {
                let extremes = [0i32, -1, 1, i32::MAX, i32::MIN, 1 << 26, 3, 255];
                let x = extremes[rng.random_range(0..extremes.len())].to_le_bytes();
                let at = at - at % 4;
                for (i, v) in x.iter().enumerate() {
                    if at + i < b.len() {
                        b[at + i] = *v;
                    }
                }
            }
            2 => b.truncate(at),
            3 => {
                let n = rng.random_range(1..16);
                let extra: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                b.splice(at..at, extra);
            }
            4 => {
                let from = rng.random_range(0..b.len());
                let len = rng.random_range(0..64).min(b.len() - from);
                let piece = b[from..from + len].to_vec();
                b.splice(at..at, piece);
            }
            _ => {
                b.remove(at);
            }
        }
    }
    b
}

/// Runtime errors must be the typed parse/format kinds, never an opaque failure with an empty message.
fn typed(e: &RuntimeError) {
    let msg = e.to_string();
    assert!(!msg.trim().is_empty());
}

#[test]
fn mutated_llama2c_checkpoints_and_tokenizers_fail_typed() {
    let dir = tempfile::tempdir().unwrap();
    let tok = tokenizer();
    let cfg = tiny_config(tok.vocab_size());
    let w = model::random_tensors(&cfg, 0.3, 1, &Device::Cpu).unwrap();
    let path = dir.path().join("m.bin");
    llama2c::write_checkpoint(&path, &cfg, &w).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(llama2c::load_checkpoint_bytes(&bytes, &Device::Cpu).is_ok());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut ok = 0;
    for _ in 0..1500 {
        let m = mutate(&mut rng, &bytes);
        match llama2c::load_checkpoint_bytes(&m, &Device::Cpu) {
            Ok(model) => {
                ok += 1;
                // A model that loads runs one forward pass without panicking (finite but extreme weights may
                // still overflow to infinite logits, which the sampler refuses with a typed error).
                let mut cache = model.new_cache();
                if let Err(e) = model.forward(&mut cache, &[1]) {
                    typed(&e);
                }
            }
            Err(e) => typed(&e),
        }
    }
    assert!(ok > 0, "no mutation kept a valid checkpoint");
    let tbytes = tok.to_bytes();
    let mut ok = 0;
    for _ in 0..3000 {
        let m = mutate(&mut rng, &tbytes);
        match Llama2cTokenizer::parse(&m, tok.vocab_size(), "tok") {
            Ok(t) => {
                ok += 1;
                let ids = t.encode("ab ba\u{e9}x", true);
                let _ = t.decode(&ids);
            }
            Err(e) => typed(&e),
        }
    }
    assert!(ok > 0);
}

#[test]
fn a_tokenizer_of_another_vocabulary_is_a_mismatch_not_a_truncation() {
    let bytes = tokenizer().to_bytes();
    let e = Llama2cTokenizer::parse(&bytes, 512, "tok512.bin").unwrap_err();
    assert!(
        matches!(
            e,
            RuntimeError::VocabMismatch {
                tokens: 265,
                vocab_size: 512,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "tokenizer: tok512.bin holds 265 tokens but the model's vocabulary has 512 (a tokenizer of another model?)"
    );
    let e = Llama2cTokenizer::parse(&bytes[..bytes.len() - 1], 265, "t").unwrap_err();
    assert!(e.to_string().contains("truncated in token[264]"), "{e}");
}

#[test]
fn checkpoints_with_non_finite_weights_or_huge_headers_are_refused() {
    let tok = tokenizer();
    let cfg = tiny_config(tok.vocab_size());
    let w = model::random_tensors(&cfg, 0.3, 1, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.bin");
    llama2c::write_checkpoint(&path, &cfg, &w).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for (bad, at) in [(f32::NAN, 5), (f32::INFINITY, 265 * 8 + 2)] {
        let mut b = bytes.clone();
        let o = 28 + 4 * at;
        b[o..o + 4].copy_from_slice(&bad.to_le_bytes());
        let e = llama2c::load_checkpoint_bytes(&b, &Device::Cpu).unwrap_err();
        let RuntimeError::NonFinite { tensor, .. } = &e else {
            panic!("{e}")
        };
        let want = if at == 5 {
            "model.embed_tokens.weight"
        } else {
            "model.layers.0.input_layernorm.weight"
        };
        assert_eq!(tensor, want);
    }
    let mut b = bytes.clone();
    b[24..28].copy_from_slice(&(1i32 << 26).to_le_bytes());
    let e = llama2c::load_checkpoint_bytes(&b, &Device::Cpu).unwrap_err();
    assert!(
        e.to_string().contains("max_seq_len: 67108864 is above the limit"),
        "{e}"
    );
    // The largest header values cannot overflow the size computation.
    let mut b = bytes.clone();
    for i in 0..7 {
        b[4 * i..4 * i + 4].copy_from_slice(&i32::MAX.to_le_bytes());
    }
    assert!(llama2c::load_checkpoint_bytes(&b, &Device::Cpu).is_err());
}

#[test]
fn mutated_gguf_files_fail_typed() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_config(40);
    let mut cfg32 = cfg.clone();
    cfg32.dim = 32;
    cfg32.hidden_dim = 32;
    let w = model::random_tensors(&cfg32, 0.3, 2, &Device::Cpu).unwrap();
    let path = dir.path().join("m.gguf");
    gguf::write(&path, &cfg32, &w, GgmlDType::Q8_0).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(gguf::load(&path, &Device::Cpu).is_ok());
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let m_path = dir.path().join("x.gguf");
    // Mutations only in the header and metadata (the first KiB), where the parser's decisions are.
    let head = bytes.len().min(1024);
    for _ in 0..800 {
        let mut m = mutate(&mut rng, &bytes[..head]);
        m.extend_from_slice(&bytes[head..]);
        std::fs::write(&m_path, &m).unwrap();
        match gguf::load(&m_path, &Device::Cpu) {
            Ok(_) => {}
            Err(e) => typed(&e),
        }
        if let Err(e) = gguf::load_tokenizer(&m_path) {
            typed(&e);
        }
    }
}

/// A GGUF file whose matrix holds an infinite block scale is refused naming that tensor, as is one whose tensor
/// data ends early, and a sound one loads with its host matrices in huge pages: the loader builds its matrices
/// ahead of the model's requests, and a matrix that fails there is read again the ordinary way, which names it.
#[test]
fn gguf_matrices_built_ahead_still_name_a_bad_tensor() {
    use candle_core::quantized::gguf_file;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_config(40);
    cfg.dim = 32;
    cfg.hidden_dim = 64;
    cfg.n_layers = 2;
    let w = model::random_tensors(&cfg, 0.3, 4, &Device::Cpu).unwrap();
    let path = dir.path().join("m.gguf");
    gguf::write(&path, &cfg, &w, GgmlDType::Q8_0).unwrap();
    let good = gguf::load(&path, &Device::Cpu).unwrap();
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists();
    assert_eq!(
        good.host_matrices_in_huge_pages(),
        cfg!(target_os = "linux") && thp
    );
    let bytes = std::fs::read(&path).unwrap();
    let content = gguf_file::Content::read(&mut std::io::Cursor::new(&bytes)).unwrap();
    for name in ["blk.1.attn_v.weight", "blk.0.ffn_up.weight", "token_embd.weight"] {
        let info = &content.tensor_infos[name];
        // The second block's scale (f16 at the block's start) becomes +∞.
        let at = (content.tensor_data_offset + info.offset) as usize + GgmlDType::Q8_0.type_size();
        let mut b = bytes.clone();
        b[at..at + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        let bad = dir.path().join("bad.gguf");
        std::fs::write(&bad, &b).unwrap();
        let e = gguf::load(&bad, &Device::Cpu).unwrap_err();
        assert!(e.to_string().contains(name), "{name}: {e}");
    }
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let e = gguf::load(&cut, &Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("extends past the end of the file"), "{e}");
}

#[test]
fn mutated_hf_config_and_tokenizer_json_fail_typed() {
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false
    })
    .to_string();
    assert!(hf::parse_config(config.as_bytes(), "config.json").is_ok());
    let huge = config.replace("2048", "67108864");
    let e = hf::parse_config(huge.as_bytes(), "config.json").unwrap_err();
    assert!(e.to_string().contains("max_seq_len"), "{e}");
    let tok_json = serde_json::json!({
        "version": "1.0", "added_tokens": [], "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": null,
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3}, "merges": ["a b"], "dropout": null,
                  "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false}
    })
    .to_string();
    let t = Tokenizer::from_hf_bytes(tok_json.as_bytes(), "tokenizer.json").unwrap();
    assert_eq!(t.encode("ab", false).unwrap(), vec![2]);
    // Valid JSON that is not a pipeline says so, instead of reading like a syntax error.
    let other = tok_json.replace("\"BPE\"", "\"Mystery\"");
    let e = Tokenizer::from_hf_bytes(other.as_bytes(), "tokenizer.json").unwrap_err();
    assert!(
        e.to_string().contains("valid JSON, but not a tokenizer pipeline"),
        "{e}"
    );
    assert!(e.to_string().contains("\"Mystery\""), "{e}");
    let e = Tokenizer::from_hf_bytes(b"{\"version\": ", "tokenizer.json").unwrap_err();
    assert!(e.to_string().contains("not valid JSON"), "{e}");
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    for i in 0..2000 {
        if i % 2 == 0 {
            let m = mutate(&mut rng, config.as_bytes());
            if let Err(e) = hf::parse_config(&m, "config.json") {
                typed(&e);
            }
        } else {
            let m = mutate(&mut rng, tok_json.as_bytes());
            match Tokenizer::from_hf_bytes(&m, "tokenizer.json") {
                Ok(t) => {
                    let _ = t.encode("abba", true);
                }
                Err(e) => typed(&e),
            }
        }
    }
}

/// llama2.c's encoder as written there: rescan every pair after each merge (the reference, O(n²)).
fn reference_encode(tok: &Llama2cTokenizer, pieces: &[Vec<u8>], scores: &[f32], text: &str) -> Vec<u32> {
    let lookup = |b: &[u8]| pieces.iter().position(|p| p == b).map(|i| i as u32);
    let mut ids: Vec<u32> = Vec::new();
    if text.is_empty() {
        return ids;
    }
    if let Some(s) = lookup(b" ") {
        ids.push(s);
    }
    for ch in text.chars() {
        let mut buf = [0u8; 4];
        let s = ch.encode_utf8(&mut buf).as_bytes();
        match lookup(s) {
            Some(id) => ids.push(id),
            None => ids.extend(s.iter().map(|&b| u32::from(b) + 3)),
        }
    }
    loop {
        let mut best: Option<(f32, usize, u32)> = None;
        for i in 0..ids.len().saturating_sub(1) {
            let mut joined = pieces[ids[i] as usize].clone();
            joined.extend_from_slice(&pieces[ids[i + 1] as usize]);
            if let Some(id) = lookup(&joined) {
                let score = scores[id as usize];
                if best.is_none_or(|(s, _, _)| score > s) {
                    best = Some((score, i, id));
                }
            }
        }
        match best {
            Some((_, i, id)) => {
                ids[i] = id;
                ids.remove(i + 1);
            }
            None => break,
        }
    }
    let _ = tok;
    ids
}

#[test]
fn the_heap_encoder_matches_the_quadratic_reference_and_is_near_linear() {
    let extra: Vec<(&str, f32)> = vec![
        (" ", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        (" a", -0.5),
        ("ab", -0.1),
        ("ba", -0.1),
        ("abc", -0.2),
        ("bab", -0.05),
        ("aa", -0.1),
        ("aaaa", 0.3),
        ("cc", -3.0),
    ];
    let tok = Llama2cTokenizer::from_pieces(&extra);
    let bytes = tok.to_bytes();
    // Recover pieces and scores from the serialised form for the reference.
    let (mut pieces, mut scores, mut at) = (Vec::new(), Vec::new(), 4);
    while at < bytes.len() {
        scores.push(f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()));
        let len = i32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap()) as usize;
        pieces.push(bytes[at + 8..at + 8 + len].to_vec());
        at += 8 + len;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let alphabet = ['a', 'b', 'c', ' ', 'é', 'x'];
    for _ in 0..300 {
        let n = rng.random_range(0..40);
        let text: String = (0..n)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        let want = reference_encode(&tok, &pieces, &scores, &text);
        let got = tok.encode(&text, false);
        assert_eq!(got, want, "{text:?}");
    }
    // Work bound, not a timer: at most 3 pair lookups per initial symbol, whatever the length (the quadratic
    // encoder rescans every remaining pair after each merge).
    for n in [1_000, 30_000] {
        let text: String = (0..n).map(|_| alphabet[rng.random_range(0..4)]).collect();
        let (ids, lookups) = tok.encode_counting(&text, true);
        assert!(lookups <= 3 * (n + 1), "{n} characters took {lookups} lookups");
        assert!(ids.len() > 1);
    }
}

/// GGUF files taken apart and put back together, to build the hostile files of the tests below from a sound one.
mod raw {
    /// One tensor info: name, dimensions (innermost first), ggml type code, offset in the data.
    #[derive(Clone)]
    pub struct Info {
        pub name: String,
        pub dims: Vec<u64>,
        pub dtype: u32,
        pub offset: u64,
    }

    /// A GGUF file: metadata entries (key, value type, value bytes), tensor infos and the tensor data.
    #[derive(Clone)]
    pub struct Gguf {
        pub kvs: Vec<(String, u32, Vec<u8>)>,
        pub infos: Vec<Info>,
        pub data: Vec<u8>,
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
    }

    /// Where the value of type `t` at `at` ends.
    fn skip(b: &[u8], at: usize, t: u32) -> usize {
        match t {
            8 => at + 8 + u64_at(b, at) as usize,
            9 => {
                let (et, n) = (u32_at(b, at), u64_at(b, at + 4));
                (0..n).fold(at + 12, |at, _| skip(b, at, et))
            }
            _ => at + [1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8][t as usize],
        }
    }

    fn string(b: &[u8], at: usize) -> (String, usize) {
        let n = u64_at(b, at) as usize;
        (
            String::from_utf8(b[at + 8..at + 8 + n].to_vec()).unwrap(),
            at + 8 + n,
        )
    }

    /// Takes apart a sound file (data aligned to 32 bytes).
    pub fn split(b: &[u8]) -> Gguf {
        let (n_tensors, n_kvs) = (u64_at(b, 8), u64_at(b, 16));
        let mut at = 24;
        let mut kvs = Vec::new();
        for _ in 0..n_kvs {
            let (key, next) = string(b, at);
            let t = u32_at(b, next);
            let end = skip(b, next + 4, t);
            kvs.push((key, t, b[next + 4..end].to_vec()));
            at = end;
        }
        let mut infos = Vec::new();
        for _ in 0..n_tensors {
            let (name, next) = string(b, at);
            let n_dims = u32_at(b, next) as usize;
            let dims = (0..n_dims).map(|i| u64_at(b, next + 4 + 8 * i)).collect();
            at = next + 4 + 8 * n_dims;
            infos.push(Info {
                name,
                dims,
                dtype: u32_at(b, at),
                offset: u64_at(b, at + 4),
            });
            at += 12;
        }
        let data = b[at.div_ceil(32) * 32..].to_vec();
        Gguf { kvs, infos, data }
    }

    /// A string's bytes with its length.
    pub fn s(x: &str) -> Vec<u8> {
        [(x.len() as u64).to_le_bytes().to_vec(), x.as_bytes().to_vec()].concat()
    }

    impl Gguf {
        /// The file of GGUF version `version`, its data aligned to `alignment` bytes.
        pub fn join(&self, version: u32, alignment: usize) -> Vec<u8> {
            let mut b = b"GGUF".to_vec();
            b.extend_from_slice(&version.to_le_bytes());
            b.extend_from_slice(&(self.infos.len() as u64).to_le_bytes());
            b.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
            for (k, t, v) in &self.kvs {
                b.extend(s(k));
                b.extend_from_slice(&t.to_le_bytes());
                b.extend_from_slice(v);
            }
            for t in &self.infos {
                b.extend(s(&t.name));
                b.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
                for d in &t.dims {
                    b.extend_from_slice(&d.to_le_bytes());
                }
                b.extend_from_slice(&t.dtype.to_le_bytes());
                b.extend_from_slice(&t.offset.to_le_bytes());
            }
            b.resize(b.len().div_ceil(alignment) * alignment, 0);
            b.extend_from_slice(&self.data);
            b
        }

        /// The file as written (version 3, 32-byte alignment).
        pub fn bytes(&self) -> Vec<u8> {
            self.join(3, 32)
        }

        /// The index of tensor `name`.
        pub fn info(&self, name: &str) -> usize {
            self.infos.iter().position(|t| t.name == name).unwrap()
        }

        /// The same file with metadata entry `key` added (or replaced, where it exists).
        pub fn with(&self, key: &str, t: u32, v: Vec<u8>) -> Gguf {
            let mut g = self.clone();
            g.kvs.retain(|kv| kv.0 != key);
            g.kvs.push((key.to_string(), t, v));
            g
        }
    }
}

/// A small sound GGUF model (Q8_0 matrices, f32 norms) with a 40-token vocabulary, taken apart, and its vocabulary.
fn sound_gguf(dir: &std::path::Path) -> raw::Gguf {
    let mut cfg = tiny_config(40);
    cfg.dim = 32;
    cfg.hidden_dim = 32;
    let w = model::random_tensors(&cfg, 0.3, 5, &Device::Cpu).unwrap();
    let vocab = gguf::GgufVocab {
        tokens: (0..40).map(|i| format!("t{i}")).collect(),
        bos: Some(1),
        eos: Some(2),
        ..Default::default()
    };
    let opts = gguf::WriteOptions {
        dtype: GgmlDType::Q8_0,
        overrides: &[],
        vocab: Some(&vocab),
        head_vocab: None,
    };
    let path = dir.join("sound.gguf");
    gguf::write_with(&path, &cfg, &w, &opts).unwrap();
    raw::split(&std::fs::read(&path).unwrap())
}

/// The error loading `bytes` as a GGUF model gives (it must fail), as text.
fn gguf_error(dir: &std::path::Path, bytes: &[u8]) -> String {
    let path = dir.join("bad.gguf");
    std::fs::write(&path, bytes).unwrap();
    match gguf::load(&path, &Device::Cpu) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

fn assert_has(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "expected {p:?} in {e:?}");
    }
}

/// The split and joined sound file is the file written, and loads, with its tokenizer; a version 2 file too.
#[test]
fn the_raw_gguf_helper_rebuilds_the_file_it_took_apart() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let written = std::fs::read(dir.path().join("sound.gguf")).unwrap();
    assert_eq!(g.join(2, 32), written);
    let path = dir.path().join("v3.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    gguf::load(&path, &Device::Cpu).unwrap();
    gguf::load_tokenizer(&path).unwrap();
}

/// A file cut short names what was being read when it ended (the header, a metadata entry by key, a tensor info
/// by index and name, a tensor's data by name) and says it is truncated, with the file's length and the bytes needed.
#[test]
fn a_truncated_gguf_names_what_was_being_read_and_the_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let b = g.bytes();
    let e = gguf_error(dir.path(), &b[..16]);
    assert_has(
        &e,
        &["header: the file is truncated: it ends at byte 16, reading this needs bytes 16..24"],
    );
    // Inside the value of the metadata entry after the vocabulary.
    let entry = |(k, _, v): &(String, u32, Vec<u8>)| 8 + k.len() + 4 + v.len();
    let k = g
        .kvs
        .iter()
        .position(|kv| kv.0 == "tokenizer.ggml.bos_token_id")
        .unwrap();
    let key = &g.kvs[k].0;
    let at = 24 + g.kvs[..k].iter().map(entry).sum::<usize>() + 8 + key.len() + 4 + 1;
    let e = gguf_error(dir.path(), &b[..at]);
    assert_has(
        &e,
        &[&format!(
            "metadata {key}: the file is truncated: it ends at byte {at}, reading this needs bytes {}..{}",
            at - 1,
            at + 3
        )],
    );
    // A file too short for the entries its header counts.
    let e = gguf_error(dir.path(), &b[..40]);
    assert_has(
        &e,
        &[
            "metadata entries need at least",
            "the file has 40 (truncated, or corrupt counts)",
        ],
    );
    // Inside the third tensor info, after its name.
    let headers: usize = g.kvs.iter().map(entry).sum();
    let infos: usize = g.infos[..2]
        .iter()
        .map(|t| 8 + t.name.len() + 4 + 8 * t.dims.len() + 12)
        .sum();
    let at = 24 + headers + infos + 8 + g.infos[2].name.len() + 2;
    let e = gguf_error(dir.path(), &b[..at]);
    assert_has(
        &e,
        &[&format!(
            "tensor info 2 ({}): the file is truncated",
            g.infos[2].name
        )],
    );
    // Inside the data of the last tensor in the file.
    let last = g.infos.iter().max_by_key(|t| t.offset).unwrap();
    let e = gguf_error(dir.path(), &b[..b.len() - 1]);
    assert_has(
        &e,
        &[
            &format!("tensor {}: data of", last.name),
            &format!(
                "past the end of the file ({} bytes): the file is truncated",
                b.len() - 1
            ),
        ],
    );
}

/// An unknown block type names its tensor and code; an unknown metadata type or array element type its key; an
/// unsupported version says which versions are read.
#[test]
fn unknown_gguf_types_and_versions_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let mut t = g.clone();
    let i = t.info("blk.0.ffn_up.weight");
    t.infos[i].dtype = 99;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &["tensor blk.0.ffn_up.weight: ggml type 99 is not a block type this build reads"],
    );
    t.infos[i].dtype = 23;
    assert_has(&gguf_error(dir.path(), &t.bytes()), &["ggml type 23 (IQ4_XS)"]);
    let array = [99u32.to_le_bytes().to_vec(), 0u64.to_le_bytes().to_vec()].concat();
    let e = gguf_error(dir.path(), &g.with("x.list", 9, array).bytes());
    assert_has(&e, &["metadata x.list: array of unknown value type 99"]);
    let e = gguf_error(dir.path(), &g.with("x.odd", 13, vec![0; 8]).bytes());
    assert_has(&e, &["metadata x.odd: unknown value type 13"]);
    let e = gguf_error(dir.path(), &g.with("x.flag", 7, vec![2]).bytes());
    assert_has(&e, &["metadata x.flag: boolean value 2"]);
    for v in [1u32, 4, 0x0300_0000] {
        let e = gguf_error(dir.path(), &g.join(v, 32));
        assert_has(
            &e,
            &[&format!(
                "GGUF version {v} is not supported (versions 2 and 3 are read"
            )],
        );
    }
    let mut b = g.bytes();
    b[..4].copy_from_slice(b"FUGG");
    assert_has(&gguf_error(dir.path(), &b), &["not a GGUF file"]);
}

/// A key or a tensor name that appears twice is refused by name (the parser would keep one of the two silently).
#[test]
fn duplicate_gguf_keys_and_tensor_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let mut d = g.clone();
    d.kvs
        .push(("llama.block_count".into(), 4, 5u32.to_le_bytes().to_vec()));
    let e = gguf_error(dir.path(), &d.bytes());
    assert_has(&e, &["metadata llama.block_count: the key appears twice"]);
    let mut d = g.clone();
    let i = d.info("blk.0.attn_q.weight");
    d.infos.push(d.infos[i].clone());
    let e = gguf_error(dir.path(), &d.bytes());
    assert_has(&e, &["tensor blk.0.attn_q.weight: the name appears twice"]);
}

/// `general.alignment` must be a u32 (the parser ignores other types and reads the data at the default
/// alignment); a sound u32 alignment other than 32 is read.
#[test]
fn a_non_u32_alignment_is_refused_naming_the_key_and_its_type() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let e = gguf_error(dir.path(), &g.with("general.alignment", 8, raw::s("64")).bytes());
    assert_has(
        &e,
        &["general.alignment: stored as string (type 8), must be a u32"],
    );
    let e = gguf_error(
        dir.path(),
        &g.with("general.alignment", 10, 32u64.to_le_bytes().to_vec())
            .bytes(),
    );
    assert_has(&e, &["general.alignment: stored as u64 (type 10), must be a u32"]);
    // Offsets that are multiples of 64, data aligned to 64: loads.
    let mut a = g.with("general.alignment", 4, 64u32.to_le_bytes().to_vec());
    let mut data = Vec::new();
    for t in &mut a.infos {
        let at = t.offset as usize;
        let len = g
            .infos
            .iter()
            .map(|u| u.offset as usize)
            .filter(|&o| o > at)
            .min()
            .unwrap_or(g.data.len())
            - at;
        t.offset = data.len() as u64;
        data.extend_from_slice(&g.data[at..at + len]);
        data.resize(data.len().div_ceil(64) * 64, 0);
    }
    a.data = data;
    let path = dir.path().join("a64.gguf");
    std::fs::write(&path, a.join(3, 64)).unwrap();
    gguf::load(&path, &Device::Cpu).unwrap();
}

/// Each tensor's data is checked at load against the alignment, the other tensors and the file's end, naming the
/// tensor (these read garbage and failed later, naming an element as NaN or nothing at all).
#[test]
fn gguf_tensor_offsets_are_checked_against_alignment_overlap_and_the_file_size() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let i = g.info("blk.0.ffn_down.weight");
    let mut t = g.clone();
    t.infos[i].offset += 1;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &[
            "tensor blk.0.ffn_down.weight: data offset",
            "is not a multiple of the alignment 32",
        ],
    );
    let j = g.info("blk.0.ffn_up.weight");
    let mut t = g.clone();
    t.infos[i].offset = t.infos[j].offset;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &["overlaps tensor", "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"],
    );
    let mut t = g.clone();
    t.infos[i].offset = g.data.len() as u64;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &[
            "tensor blk.0.ffn_down.weight: data of",
            "extends past the end of the file",
        ],
    );
    let mut t = g.clone();
    t.infos[i].offset = u64::MAX - 31;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &[
            "tensor blk.0.ffn_down.weight: data of",
            "extends past the end of the file",
        ],
    );
    // A row that is not whole blocks of its type.
    let mut t = g.clone();
    t.infos[i].dims[0] = 16;
    let e = gguf_error(dir.path(), &t.bytes());
    assert_has(
        &e,
        &["tensor blk.0.ffn_down.weight: rows of 16 elements are not whole Q8_0 blocks of 32"],
    );
}

/// BOS and EOS ids outside the vocabulary, or not integers, are refused when the tokenizer is read, naming the key.
#[test]
fn gguf_bos_and_eos_outside_the_vocabulary_are_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let path = dir.path().join("tok.gguf");
    for (key, t, v, want) in [
        (
            "tokenizer.ggml.eos_token_id",
            4,
            40u32.to_le_bytes().to_vec(),
            "40 is outside the vocabulary of 40 tokens",
        ),
        (
            "tokenizer.ggml.bos_token_id",
            4,
            u32::MAX.to_le_bytes().to_vec(),
            "4294967295 is outside the vocabulary",
        ),
        (
            "tokenizer.ggml.eos_token_id",
            5,
            (-1i32).to_le_bytes().to_vec(),
            "stored as I32, must be a token id",
        ),
    ] {
        std::fs::write(&path, g.with(key, t, v).bytes()).unwrap();
        let e = gguf::load_tokenizer(&path).unwrap_err().to_string();
        assert_has(&e, &[&format!("{key}: {want}")]);
    }
    // The largest id and another integer type are read.
    std::fs::write(
        &path,
        g.with("tokenizer.ggml.eos_token_id", 10, 39u64.to_le_bytes().to_vec())
            .bytes(),
    )
    .unwrap();
    assert_eq!(gguf::load_tokenizer(&path).unwrap().eos(), Some(39));
}

/// `tokenizer.ggml.token_type` holds one i32 per token: an array of another length, or an entry of another type,
/// is refused naming the key (such an entry used to count as a normal token, whatever the file meant).
#[test]
fn gguf_token_types_of_another_type_or_count_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let path = dir.path().join("types.gguf");
    // A GGUF array: element type, count, elements.
    let array = |elem: u32, n: u64, bytes_each: &dyn Fn(usize) -> Vec<u8>| {
        let mut v = elem.to_le_bytes().to_vec();
        v.extend_from_slice(&n.to_le_bytes());
        for i in 0..n as usize {
            v.extend_from_slice(&bytes_each(i));
        }
        v
    };
    let normal_or_control = |i: usize| (if i < 3 { 3i32 } else { 1 }).to_le_bytes().to_vec();
    std::fs::write(
        &path,
        g.with("tokenizer.ggml.token_type", 9, array(5, 40, &normal_or_control))
            .bytes(),
    )
    .unwrap();
    gguf::load_tokenizer(&path).unwrap();
    for (v, want) in [
        (
            array(5, 39, &normal_or_control),
            "tokenizer.ggml.token_type: 39 entries for 40 tokens",
        ),
        (
            array(0, 40, &|_| vec![1u8]),
            "tokenizer.ggml.token_type[0]: stored as U8, must be an i32 token type",
        ),
    ] {
        std::fs::write(&path, g.with("tokenizer.ggml.token_type", 9, v).bytes()).unwrap();
        let e = gguf::load_tokenizer(&path).unwrap_err().to_string();
        assert_has(&e, &[want]);
    }
}

/// RoPE settings the model does not implement are refused naming the key (the model would ignore them and compute
/// wrong logits); the ones it implements (a rotary dimension of the head width, no scaling) load.
#[test]
fn gguf_rope_settings_the_model_does_not_implement_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let u32v = |x: u32| x.to_le_bytes().to_vec();
    let f32v = |x: f32| x.to_le_bytes().to_vec();
    // head width 32 / 2 heads = 16.
    let refused = [
        (
            "llama.rope.dimension_count",
            4,
            u32v(15),
            "15 is not the head width 16",
        ),
        (
            "llama.attention.key_length",
            4,
            u32v(32),
            "32 is not the head width 16",
        ),
        (
            "llama.rope.dimension_count",
            8,
            raw::s("16"),
            "stored as String, must be an integer",
        ),
        (
            "llama.rope.scaling.type",
            8,
            raw::s("yarn"),
            "\"yarn\" RoPE scaling is not implemented",
        ),
        (
            "llama.rope.scaling.factor",
            6,
            f32v(4.0),
            "4: RoPE scaling is not implemented",
        ),
        (
            "llama.rope.scale_linear",
            6,
            f32v(2.0),
            "2: RoPE scaling is not implemented",
        ),
    ];
    for (key, t, v, want) in refused {
        let e = gguf_error(dir.path(), &g.with(key, t, v).bytes());
        assert_has(&e, &[&format!("{key}: {want}")]);
    }
    let path = dir.path().join("rope.gguf");
    let sound = g
        .with("llama.rope.dimension_count", 4, u32v(16))
        .with("llama.rope.scaling.type", 8, raw::s("linear"))
        .with("llama.rope.scaling.factor", 6, f32v(1.0));
    std::fs::write(&path, sound.bytes()).unwrap();
    gguf::load(&path, &Device::Cpu).unwrap();
    // Llama 3's frequency factors, a tensor of their own.
    let mut r = g.clone();
    r.infos.push(raw::Info {
        name: "rope_freqs.weight".into(),
        dims: vec![8],
        dtype: 0,
        offset: r.data.len() as u64,
    });
    r.data.extend_from_slice(&[0; 32]);
    assert_has(
        &gguf_error(dir.path(), &r.bytes()),
        &["rope_freqs.weight: RoPE frequency factors"],
    );
}

/// A `config.json` is refused naming the key when its `model_type` is unsupported or another architecture than
/// `architectures`, when its activation is not SiLU or it asks for projection biases the architecture lacks, when
/// its sliding window is not a positive count (a window that applies caps the context), when it asks for RoPE
/// scaling, when a BOS or EOS id lies outside the vocabulary, when its
/// `head_dim` is not `hidden_size / num_attention_heads` (the only head width implemented), and when it declares an
/// untied head that no safetensors file holds.
#[test]
fn hf_configs_the_model_would_misread_are_refused_naming_the_key() {
    let base = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 6,
        "max_position_embeddings": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": [2, 5], "rope_scaling": null
    });
    use serde_json::json;
    // The base config edited by `edit`, parsed; `parse` sets one key.
    let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut c = base.clone();
        edit(&mut c);
        hf::parse_config(c.to_string().as_bytes(), "config.json").map_err(|e| e.to_string())
    };
    let parse = |key: &str, value: serde_json::Value| edited(&|c| c[key] = value.clone());
    parse("rope_scaling", json!(null)).unwrap();
    parse("rope_scaling", json!({"rope_type": "default"})).unwrap();
    parse("model_type", json!("mistral")).unwrap();
    parse("head_dim", json!(4)).unwrap();
    parse("head_dim", json!(null)).unwrap();
    for (key, value) in [
        ("hidden_act", json!("silu")),
        ("hidden_act", json!("swish")),
        ("attention_bias", json!(false)),
        ("mlp_bias", json!(false)),
        ("sliding_window", json!(null)),
        // A Llama config's window is not read (Hugging Face's Llama has none).
        ("sliding_window", json!(4)),
    ] {
        let cfg = parse(key, value).unwrap();
        assert_eq!(cfg.max_seq_len, 8, "{key}");
    }
    // A window shorter than the context caps it: full attention is the windowed one up to the window.
    let mistral = |w: serde_json::Value| {
        move |c: &mut serde_json::Value| {
            c["architectures"] = json!(["MistralForCausalLM"]);
            c["model_type"] = json!("mistral");
            c["sliding_window"] = w.clone();
        }
    };
    assert_eq!(edited(&mistral(json!(5))).unwrap().max_seq_len, 5);
    assert_eq!(edited(&mistral(json!(4096))).unwrap().max_seq_len, 8);
    assert_eq!(edited(&mistral(json!(null))).unwrap().max_seq_len, 8);
    let qwen = |use_it: bool| {
        move |c: &mut serde_json::Value| {
            c["architectures"] = json!(["Qwen2ForCausalLM"]);
            c["model_type"] = json!("qwen2");
            c["sliding_window"] = json!(3);
            c["use_sliding_window"] = json!(use_it);
        }
    };
    assert_eq!(edited(&qwen(false)).unwrap().max_seq_len, 8);
    assert_eq!(edited(&qwen(true)).unwrap().max_seq_len, 3);
    let e = edited(&mistral(json!(0))).unwrap_err();
    assert!(e.contains("sliding_window: 0 is not a positive number"), "{e}");
    let e = edited(&mistral(json!("wide"))).unwrap_err();
    assert!(
        e.contains("sliding_window: \"wide\" is not a positive number"),
        "{e}"
    );
    let refused = [
        (
            "hidden_act",
            json!("gelu"),
            "hidden_act: \"gelu\" is not implemented",
        ),
        (
            "attention_bias",
            json!(true),
            "attention_bias: true: biases on Llama's attention projections are not implemented",
        ),
        (
            "mlp_bias",
            json!(true),
            "mlp_bias: true: biases on the feed-forward projections are not implemented",
        ),
        (
            "model_type",
            json!("gpt2"),
            "model_type: \"gpt2\" is not supported",
        ),
        (
            "model_type",
            json!("qwen2"),
            "model_type: \"qwen2\" is another architecture",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "yarn", "factor": 4.0}),
            "rope_scaling: \"yarn\" scaling is not implemented",
        ),
        (
            "rope_scaling",
            json!({"type": "linear", "factor": 2.0}),
            "rope_scaling: \"linear\" scaling is not implemented",
        ),
        (
            "eos_token_id",
            json!([2, 6]),
            "eos_token_id: 6 is outside the vocabulary of 6",
        ),
        ("bos_token_id", json!(-1), "bos_token_id: -1 is not a token id"),
        (
            "head_dim",
            json!(8),
            "head_dim: 8 is not hidden_size / num_attention_heads = 4: other head widths are not implemented",
        ),
    ];
    for (key, value, want) in refused {
        let e = parse(key, value).unwrap_err();
        assert!(e.contains(want), "expected {want:?} in {e:?}");
    }
    // An untied head that no file holds.
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_config(6);
    let w = model::random_tensors(&cfg, 0.3, 6, &Device::Cpu).unwrap();
    hf::write_dir(dir.path(), &cfg, hf::Arch::Llama, &w).unwrap();
    hf::load_dir(dir.path(), &Device::Cpu).unwrap();
    let path = dir.path().join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    c["tie_word_embeddings"] = false.into();
    std::fs::write(&path, c.to_string()).unwrap();
    let e = hf::load_dir(dir.path(), &Device::Cpu).unwrap_err().to_string();
    assert_has(
        &e,
        &["tie_word_embeddings is false (or absent) but no safetensors file holds lm_head.weight"],
    );
}

/// A count in the metadata (a width, a layer or head count, the context) must be a non-negative integer: a
/// negative one, or a bool (which candle would read as 0 or 1), a float or a string, is refused naming the key,
/// where a negative I32 used to become 0 and `true` a count of 1. Any integer type holding a sound count loads,
/// and an absent `head_count_kv` is the query heads' count.
#[test]
fn gguf_counts_that_are_negative_or_not_integers_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let refused = [
        (
            "llama.context_length",
            5,
            (-8i32).to_le_bytes().to_vec(),
            "-8 is negative, must be a count",
        ),
        (
            "llama.block_count",
            11,
            (-1i64).to_le_bytes().to_vec(),
            "-1 is negative, must be a count",
        ),
        (
            "llama.block_count",
            7,
            vec![1u8],
            "stored as Bool, must be a non-negative integer",
        ),
        (
            "llama.attention.head_count_kv",
            7,
            vec![1u8],
            "stored as Bool, must be a non-negative integer",
        ),
        (
            "llama.embedding_length",
            6,
            32f32.to_le_bytes().to_vec(),
            "stored as F32, must be a non-negative integer",
        ),
    ];
    for (key, t, v, want) in refused {
        let e = gguf_error(dir.path(), &g.with(key, t, v).bytes());
        assert_has(&e, &[&format!("{key}: {want}")]);
    }
    let path = dir.path().join("counts.gguf");
    let sound = g
        .with("llama.context_length", 5, 8i32.to_le_bytes().to_vec())
        .with("llama.block_count", 0, vec![1u8])
        .with("llama.embedding_length", 11, 32i64.to_le_bytes().to_vec());
    std::fs::write(&path, sound.bytes()).unwrap();
    let m = gguf::load(&path, &Device::Cpu).unwrap();
    assert_eq!(
        (m.config().max_seq_len, m.config().n_layers, m.config().dim),
        (8, 1, 32)
    );
    let mut no_kv = g.clone();
    no_kv.kvs.retain(|kv| kv.0 != "llama.attention.head_count_kv");
    std::fs::write(&path, no_kv.bytes()).unwrap();
    let e = gguf::load(&path, &Device::Cpu).unwrap_err().to_string();
    // Two key/value heads (the query heads') do not match the file's key projection of one.
    assert_has(&e, &["attn_k"]);
}

/// `Tokenizer::id_space`, what a model paired with a tokenizer must accept: a llama2.c tokenizer's entries, a GGUF
/// vocabulary's tokens, one more than a `tokenizer.json`'s largest id (not its count: ids need not be contiguous),
/// and never less than BOS or EOS + 1.
#[test]
fn tokenizers_name_the_ids_they_can_produce() {
    assert_eq!(
        Tokenizer::Llama2c(tokenizer()).id_space(),
        tokenizer().vocab_size()
    );
    let dir = tempfile::tempdir().unwrap();
    sound_gguf(dir.path());
    let gguf_tok = gguf::load_tokenizer(&dir.path().join("sound.gguf")).unwrap();
    assert_eq!(gguf_tok.id_space(), 40);
    let json = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "a": 1, "</s>": 70}, "unk_token": "<unk>"}
    });
    let tok = Tokenizer::from_hf_bytes(json.to_string().as_bytes(), "tokenizer.json").unwrap();
    assert_eq!((tok.id_space(), tok.eos()), (71, Some(70)));
    let Tokenizer::Hf { inner, .. } = tok else {
        panic!("not a pipeline")
    };
    let past = Tokenizer::Hf {
        inner,
        bos: Some(90),
        eos: None,
        add_bos: true,
        chat_template: None,
        id_space: 71,
    };
    assert_eq!(past.id_space(), 91);
}

/// An id no token spells (a model's vocabulary may be larger than its tokenizer's) decodes as U+FFFD, the
/// replacement character, in both tokenizer families, instead of vanishing from the text; spelled ids around it
/// decode as they would alone.
#[test]
fn ids_no_token_spells_decode_as_the_replacement_character() {
    let dir = tempfile::tempdir().unwrap();
    let g = sound_gguf(dir.path());
    let path = dir.path().join("tok.gguf");
    std::fs::write(&path, g.bytes()).unwrap();
    let hf = gguf::load_tokenizer(&path).unwrap();
    let alone = hf.decode(&[5, 6]).unwrap();
    assert!(!alone.contains('\u{FFFD}'), "{alone:?}");
    let with_gap = hf.decode(&[5, 40, 1000, 6]).unwrap();
    let want: String = {
        let (a, b) = (hf.decode(&[5]).unwrap(), hf.decode(&[6]).unwrap());
        format!("{a}\u{FFFD}\u{FFFD}{b}")
    };
    assert_eq!(with_gap, want);
    let l2c = spin_runtime::Tokenizer::Llama2c(spin_runtime::llama2c::Llama2cTokenizer::from_pieces(&[(
        "ab", 0.0,
    )]));
    assert_eq!(l2c.decode(&[259, 5000, 259]).unwrap(), "ab\u{FFFD}ab");
    assert_eq!(l2c.decode(&[259, 259]).unwrap(), "abab");
}
