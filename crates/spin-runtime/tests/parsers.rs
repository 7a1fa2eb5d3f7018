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
