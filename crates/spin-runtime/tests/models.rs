//! Loading round-trips through every real file format, padded batches against single sequences, and cache
//! truncation against decoding from scratch, on tiny random-weight models (plus stories260K when the data is there).

// Only the real-model marker of the shared helpers is used here.
#[allow(dead_code)]
mod common;

use candle_core::{Device, Tensor};
use spin_runtime::hf::{self, Arch};
use spin_runtime::llama2c::{self, Llama2cTokenizer};
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::{Config, KvCache, Model, RopeStyle, RuntimeError, gguf};
use std::collections::HashMap;

fn tiny(rope: RopeStyle, qkv_bias: bool, tied: bool) -> Config {
    Config {
        vocab_size: 48,
        dim: 32,
        hidden_dim: 64,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 64,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope,
        qkv_bias,
        tied_embeddings: tied,
    }
}

fn weights(cfg: &Config, seed: u64) -> HashMap<String, Tensor> {
    model::random_tensors(cfg, 0.2, seed, &Device::Cpu).unwrap()
}

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims());
    max_abs(&(a - b).unwrap())
}

/// Logits of `prefix` then `new`, one sequence alone, one token at a time (the plainest reference).
fn stepwise(m: &Model, prefix: &[u32], new: &[u32]) -> Tensor {
    let mut c = m.new_cache();
    for &t in prefix {
        m.forward(&mut c, &[t]).unwrap();
    }
    let rows: Vec<Tensor> = new.iter().map(|&t| m.forward(&mut c, &[t]).unwrap()).collect();
    Tensor::cat(&rows, 0).unwrap()
}

/// One cache per prefix, each filled by a forward pass over its prefix.
fn prefilled(m: &Model, prefixes: &[&[u32]]) -> Vec<KvCache> {
    prefixes
        .iter()
        .map(|p| {
            let mut c = m.new_cache();
            m.forward(&mut c, p).unwrap();
            c
        })
        .collect()
}

#[test]
fn batched_padded_logits_equal_single_sequence_logits() {
    for (rope, fast) in [
        (RopeStyle::Interleaved, true),
        (RopeStyle::Halves, true),
        (RopeStyle::Interleaved, false),
        (RopeStyle::Halves, false),
    ] {
        let cfg = tiny(rope, rope == RopeStyle::Halves, false);
        let mut m = model_from_tensors(cfg.clone(), weights(&cfg, 1), &Device::Cpu).unwrap();
        // The reference (`stepwise`) always takes the default CPU fast path; the batch takes the path under test.
        let reference = m.clone();
        m.set_cpu_fast_path(fast);
        let prefixes: [&[u32]; 4] = [&[1, 5, 9], &[1], &[1, 7, 7, 7, 30, 2, 11], &[1, 4]];
        let news: [&[u32]; 4] = [&[3, 4], &[8, 9, 10, 11, 12], &[40], &[6, 6, 6]];
        let mut caches = prefilled(&m, &prefixes);
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let out = m.forward_batch(&mut refs, &news).unwrap();
        for i in 0..4 {
            assert_eq!(caches[i].is_host(), fast);
            let want = stepwise(&reference, prefixes[i], news[i]);
            let d = max_diff(&out[i], &want);
            assert!(
                d < 1e-5,
                "{rope:?} fast path {fast} sequence {i}: max |diff| = {d}"
            );
            assert_eq!(caches[i].len(), prefixes[i].len() + news[i].len());
        }
    }
}

#[test]
fn thread_groups_of_uneven_size_give_the_same_logits() {
    // Three pool threads and five sequences: the CPU fast path runs groups of 2, 2 and 1 sequences.
    let cfg = tiny(RopeStyle::Interleaved, false, true);
    let m = model_from_tensors(cfg.clone(), weights(&cfg, 5), &Device::Cpu).unwrap();
    let prefixes: [&[u32]; 5] = [&[1, 2], &[1, 9, 9, 9], &[1], &[1, 3, 5, 7, 11, 13], &[1, 40]];
    let news: [&[u32]; 5] = [&[4, 5, 6], &[7], &[8, 8, 8, 8], &[2, 3], &[30, 31, 32]];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let mut caches = prefilled(&m, &prefixes);
    let out = pool.install(|| {
        let mut refs: Vec<_> = caches.iter_mut().collect();
        m.forward_batch(&mut refs, &news).unwrap()
    });
    for i in 0..5 {
        let d = max_diff(&out[i], &stepwise(&m, prefixes[i], news[i]));
        assert!(d < 1e-5, "sequence {i}: max |diff| = {d}");
        assert_eq!(caches[i].len(), prefixes[i].len() + news[i].len());
    }
}

#[test]
fn truncate_then_redecode_equals_decoding_from_scratch() {
    for host in [true, false] {
        truncate_then_redecode(host);
    }
}

fn truncate_then_redecode(host: bool) {
    let cfg = tiny(RopeStyle::Interleaved, false, true);
    let mut m = model_from_tensors(cfg.clone(), weights(&cfg, 2), &Device::Cpu).unwrap();
    m.set_cpu_fast_path(host);
    let mut c = m.new_cache();
    m.forward(&mut c, &[1, 5, 6, 7]).unwrap();
    m.forward(&mut c, &[20, 21, 22]).unwrap();
    c.truncate(5).unwrap();
    let got = m.forward(&mut c, &[30, 31]).unwrap();
    let want = stepwise(&m, &[1, 5, 6, 7, 20], &[30, 31]);
    assert!(max_diff(&got, &want) < 1e-5);
    c.truncate(0).unwrap();
    let got = m.forward(&mut c, &[1, 2]).unwrap();
    assert!(max_diff(&got, &stepwise(&m, &[], &[1, 2])) < 1e-5);
    let err = c.truncate(9).unwrap_err();
    assert!(err.to_string().starts_with("len:"), "{err}");
}

/// Logits of one sequence fed in the chunks given, then truncated to `keep` and fed `again`, all rows joined.
fn chunked(m: &Model, chunks: &[&[u32]], keep: usize, again: &[u32]) -> Tensor {
    let mut c = m.new_cache();
    let mut rows: Vec<Tensor> = chunks.iter().map(|ch| m.forward(&mut c, ch).unwrap()).collect();
    c.truncate(keep).unwrap();
    rows.push(m.forward(&mut c, again).unwrap());
    Tensor::cat(&rows, 0).unwrap()
}

#[test]
fn host_path_equals_candle_routes() {
    // Every rotary style, with and without q/k/v biases and a separate head; chunks of 1, 3 and 16 positions
    // (the host path) and of 17 (past HOST_MAX_TOKENS: the candle route inside the same sequence).
    let long: Vec<u32> = (0..17).map(|i| (i * 7 + 3) % 48).collect();
    let chunks: [&[u32]; 5] = [
        &[1, 5, 9],
        &[4],
        &long,
        &[7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22],
        &[2],
    ];
    assert_eq!(spin_runtime::model::HOST_MAX_TOKENS, 16);
    // An odd hidden width (63) exercises the products' last odd input row and their narrow column blocks.
    for (rope, bias, tied, hidden) in [
        (RopeStyle::Interleaved, false, true, 64),
        (RopeStyle::Halves, true, false, 63),
        (RopeStyle::Interleaved, true, false, 64),
    ] {
        let cfg = Config {
            hidden_dim: hidden,
            ..tiny(rope, bias, tied)
        };
        let host = model_from_tensors(cfg.clone(), weights(&cfg, 7), &Device::Cpu).unwrap();
        assert!(host.has_host_path());
        let mut fused = host.clone();
        fused.set_host_path(false);
        let mut stock = host.clone();
        stock.set_cpu_fast_path(false);
        let got = chunked(&host, &chunks, 10, &[3, 3]);
        for (name, m) in [("candle fast path", &fused), ("stock path", &stock)] {
            let d = max_diff(&got, &chunked(m, &chunks, 10, &[3, 3]));
            assert!(
                d < 1e-5,
                "{rope:?} bias {bias} tied {tied} vs {name}: max |diff| = {d}"
            );
        }
        // The borrowed rows of forward_logits are the same numbers.
        let mut c = host.new_cache();
        let rows = host.forward_logits(&mut c, &[1, 5, 9]).unwrap().to_vec();
        let mut c2 = fused.new_cache();
        let want = fused.forward_logits(&mut c2, &[1, 5, 9]).unwrap();
        assert_eq!(rows.len(), 3 * cfg.vocab_size);
        let d = rows
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-5, "forward_logits: max |diff| = {d}");
        // Its inputs are checked like forward's.
        let err = host.forward_logits(&mut c, &[48]).unwrap_err();
        assert!(err.to_string().starts_with("tokens[0]:"), "{err}");
        assert_eq!(c.len(), 3);
    }
}

#[test]
fn self_drafts_and_training_keep_the_host_path_consistent() {
    let cfg = tiny(RopeStyle::Interleaved, false, false);
    let m = model_from_tensors(cfg.clone(), weights(&cfg, 8), &Device::Cpu).unwrap();
    let mut draft = m.first_layers(1).unwrap();
    assert!(draft.has_host_path());
    let seq = [1u32, 9, 8, 7];
    let got = stepwise(&draft, &[], &seq);
    draft.set_host_path(false);
    assert!(max_diff(&got, &stepwise(&draft, &[], &seq)) < 1e-5);
    let mut t = m.clone();
    t.set_differentiable(true).unwrap();
    assert!(!t.has_host_path());
    t.set_differentiable(false).unwrap();
    assert!(t.has_host_path());
}

#[test]
fn differentiable_path_equals_fused_path_and_cached_path() {
    for rope in [RopeStyle::Interleaved, RopeStyle::Halves] {
        let cfg = tiny(rope, false, false);
        let mut m = model_from_tensors(cfg.clone(), weights(&cfg, 3), &Device::Cpu).unwrap();
        let seq = [1u32, 9, 8, 7, 6, 5];
        let ids = Tensor::new(&[seq], &Device::Cpu).unwrap();
        let fused = m.forward_full(&ids).unwrap().squeeze(0).unwrap();
        m.set_differentiable(true).unwrap();
        let plain = m.forward_full(&ids).unwrap().squeeze(0).unwrap();
        assert!(max_diff(&fused, &plain) < 1e-5, "{rope:?}");
        m.set_differentiable(false).unwrap();
        assert!(max_diff(&fused, &stepwise(&m, &[], &seq)) < 1e-5, "{rope:?}");
    }
}

#[test]
fn fused_projections_follow_weights_updated_while_training() {
    // Weights held in variables, as the distillation trains them: after an update in differentiable mode (a
    // projection, a bias and the untied output head) and a switch back, the fast path (fused and transposed
    // copies) and the stock path (the variables themselves) must agree, and
    // both must differ from the logits before the update.
    let cfg = tiny(RopeStyle::Interleaved, true, false);
    let vars: HashMap<String, candle_core::Var> = weights(&cfg, 4)
        .into_iter()
        .map(|(n, t)| (n, candle_core::Var::from_tensor(&t).unwrap()))
        .collect();
    let tensors = vars
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    let mut m = model_from_tensors(cfg.clone(), tensors, &Device::Cpu).unwrap();
    let seq = [1u32, 5, 9, 2];
    let before = stepwise(&m, &[], &seq);
    m.set_differentiable(true).unwrap();
    let w = &vars["model.layers.1.mlp.up_proj.weight"];
    w.set(&(w.as_tensor() * 1.5).unwrap()).unwrap();
    let b = &vars["model.layers.0.self_attn.k_proj.bias"];
    b.set(&(b.as_tensor() + 0.25).unwrap()).unwrap();
    let h = &vars["lm_head.weight"];
    h.set(&(h.as_tensor() * 0.5).unwrap()).unwrap();
    m.set_differentiable(false).unwrap();
    let fast = stepwise(&m, &[], &seq);
    m.set_cpu_fast_path(false);
    let stock = stepwise(&m, &[], &seq);
    assert!(max_diff(&fast, &stock) < 1e-5);
    assert!(max_diff(&fast, &before) > 1e-3);
}

#[test]
fn bad_inputs_are_errors_naming_the_field() {
    let cfg = tiny(RopeStyle::Interleaved, false, true);
    let m = model_from_tensors(cfg.clone(), weights(&cfg, 4), &Device::Cpu).unwrap();
    let mut c = m.new_cache();
    let e = m.forward(&mut c, &[1, 99]).unwrap_err();
    assert!(
        e.to_string().contains("tokens[0]") && e.to_string().contains("99"),
        "{e}"
    );
    let e = m.forward(&mut c, &[]).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    // A cache of another model, and host and device layouts mixed in one batch.
    let mut other = m.first_layers(1).unwrap().new_cache();
    let e = m.forward(&mut other, &[1]).unwrap_err();
    assert!(e.to_string().starts_with("caches[0]"), "{e}");
    let mut dev_model = m.clone();
    dev_model.set_cpu_fast_path(false);
    let (mut h, mut d) = (m.new_cache(), dev_model.new_cache());
    let e = m.forward_batch(&mut [&mut h, &mut d], &[&[1], &[1]]).unwrap_err();
    assert!(
        e.to_string().starts_with("caches[1]") && e.to_string().contains("mixes"),
        "{e}"
    );
    let long = vec![1u32; 65];
    assert!(
        m.forward(&mut c, &long)
            .unwrap_err()
            .to_string()
            .contains("max_seq_len")
    );
    assert!(
        m.first_layers(3)
            .unwrap_err()
            .to_string()
            .starts_with("self_draft_layers")
    );
    let mut bad = cfg.clone();
    bad.n_kv_heads = 3;
    assert!(bad.validate().unwrap_err().to_string().starts_with("n_kv_heads"));
}

#[test]
fn llama2c_checkpoint_round_trip_tied_and_untied() {
    let dir = tempfile::tempdir().unwrap();
    for tied in [true, false] {
        let cfg = tiny(RopeStyle::Interleaved, false, tied);
        let w = weights(&cfg, 5);
        let reference = model_from_tensors(cfg.clone(), w.clone(), &Device::Cpu).unwrap();
        let path = dir.path().join(format!("m{tied}.bin"));
        llama2c::write_checkpoint(&path, &cfg, &w).unwrap();
        let loaded = llama2c::load_checkpoint(&path, &Device::Cpu).unwrap();
        assert_eq!(loaded.config(), &cfg);
        let seq = [1u32, 3, 5, 7];
        assert_eq!(
            max_diff(&stepwise(&reference, &[], &seq), &stepwise(&loaded, &[], &seq)),
            0.0
        );
        // Truncated and over-long files are named errors.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 4]).unwrap();
        let e = llama2c::load_checkpoint(&path, &Device::Cpu).unwrap_err();
        assert!(
            matches!(e, RuntimeError::Format { .. }) && e.to_string().contains("truncated"),
            "{e}"
        );
        std::fs::write(&path, [&bytes[..], &[0u8; 4]].concat()).unwrap();
        assert!(
            llama2c::load_checkpoint(&path, &Device::Cpu)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
        std::fs::write(&path, &bytes[..10]).unwrap();
        assert!(
            llama2c::load_checkpoint(&path, &Device::Cpu)
                .unwrap_err()
                .to_string()
                .contains("header")
        );
    }
    let mut bad = (3i32..10).flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    bad[0..4].copy_from_slice(&0i32.to_le_bytes());
    let e = llama2c::parse_header(&bad, "x.bin").unwrap_err();
    assert!(e.to_string().contains("header.dim"), "{e}");
}

#[test]
fn hugging_face_round_trip_llama_and_qwen2() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, bias, tied) in [(Arch::Llama, false, true), (Arch::Qwen2, true, false)] {
        let cfg = tiny(RopeStyle::Halves, bias, tied);
        let w = weights(&cfg, 6);
        let reference = model_from_tensors(cfg.clone(), w.clone(), &Device::Cpu).unwrap();
        let d = dir.path().join(format!("{arch:?}"));
        hf::write_dir(&d, &cfg, arch, &w).unwrap();
        let loaded = spin_runtime::load_model(&d, &Device::Cpu).unwrap();
        assert_eq!(loaded.config(), &cfg);
        let seq = [2u32, 4, 6, 8, 10];
        assert_eq!(
            max_diff(&stepwise(&reference, &[], &seq), &stepwise(&loaded, &[], &seq)),
            0.0
        );
    }
    // Unknown architecture, a missing tensor and a wrong shape.
    let cfg = tiny(RopeStyle::Halves, false, true);
    let d = dir.path().join("bad");
    let mut w = weights(&cfg, 7);
    hf::write_dir(&d, &cfg, Arch::Llama, &w).unwrap();
    let text = std::fs::read_to_string(d.join("config.json")).unwrap();
    std::fs::write(
        d.join("config.json"),
        text.replace("LlamaForCausalLM", "GPT2LMHeadModel"),
    )
    .unwrap();
    let e = spin_runtime::load_model(&d, &Device::Cpu).unwrap_err();
    assert!(matches!(e, RuntimeError::UnknownArchitecture(_)), "{e}");
    w.remove("model.norm.weight");
    hf::write_dir(&d, &cfg, Arch::Llama, &w).unwrap();
    let e = spin_runtime::load_model(&d, &Device::Cpu).unwrap_err();
    assert!(e.to_string().contains("model.norm.weight is missing"), "{e}");
    w.insert(
        "model.norm.weight".into(),
        Tensor::ones(31, candle_core::DType::F32, &Device::Cpu).unwrap(),
    );
    hf::write_dir(&d, &cfg, Arch::Llama, &w).unwrap();
    let e = spin_runtime::load_model(&d, &Device::Cpu).unwrap_err();
    assert!(
        e.to_string().contains("model.norm.weight: expected shape [32]"),
        "{e}"
    );
}

#[test]
fn gguf_round_trip_with_quantised_matmul() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny(RopeStyle::Interleaved, false, false);
    let w = weights(&cfg, 8);
    let path = dir.path().join("m.gguf");
    gguf::write(&path, &cfg, &w, GgmlDType::Q8_0).unwrap();
    let loaded = spin_runtime::load_model(&path, &Device::Cpu).unwrap();
    assert_eq!(loaded.config().n_kv_heads, 2);
    assert_eq!(loaded.config().vocab_size, 48);
    // Reference: the same quantise-dequantise round trip applied to every matrix, run densely.
    let deq: HashMap<String, Tensor> = w
        .iter()
        .map(|(k, t)| {
            let t = if t.rank() == 2 {
                QTensor::quantize(t, GgmlDType::Q8_0)
                    .unwrap()
                    .dequantize(&Device::Cpu)
                    .unwrap()
            } else {
                t.clone()
            };
            (k.clone(), t)
        })
        .collect();
    let reference = model_from_tensors(cfg.clone(), deq, &Device::Cpu).unwrap();
    let seq = [1u32, 2, 3, 40, 41];
    let want = stepwise(&reference, &[], &seq);
    let d = max_diff(&want, &stepwise(&loaded, &[], &seq));
    let scale = max_abs(&want);
    // The quantised kernel also quantises activations to 8 bits: close, not bit-equal.
    assert!(d < 0.1 * scale, "max |diff| = {d}, max |logit| = {scale}");
    // Unquantised (f32) GGUF tensors load bit-exactly.
    gguf::write(&path, &cfg, &w, GgmlDType::F32).unwrap();
    let exact = spin_runtime::load_model(&path, &Device::Cpu).unwrap();
    let plain = model_from_tensors(cfg.clone(), w.clone(), &Device::Cpu).unwrap();
    assert!(max_diff(&stepwise(&plain, &[], &seq), &stepwise(&exact, &[], &seq)) < 1e-5);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    assert!(spin_runtime::load_model(&path, &Device::Cpu).is_err());
}

#[test]
fn llama2c_tokenizer_round_trip_and_merges() {
    let tok =
        Llama2cTokenizer::from_pieces(&[(" ", -1.0), ("a", -2.0), ("b", -2.0), (" a", -0.5), ("ab", -0.1)]);
    let bytes = tok.to_bytes();
    let tok = Llama2cTokenizer::parse(&bytes, tok.vocab_size(), "tok").unwrap();
    let ids = tok.encode("ab a", true);
    // " " + "a" + "b" + " " + "a": "ab" (score −0.1) merges first, then both " a" pairs cannot since " ab" is
    // absent, so the space before the last a merges into " a".
    let space = 259;
    assert_eq!(ids, vec![1, space, 263, 262]);
    assert_eq!(tok.decode(&ids), "ab a");
    // Characters outside the vocabulary fall back to their UTF-8 bytes.
    let ids = tok.encode("é", false);
    assert_eq!(ids, vec![space, 0xC3 + 3, 0xA9 + 3]);
    assert_eq!(tok.decode(&ids), "é");
    let e = Llama2cTokenizer::parse(&bytes[..bytes.len() - 1], tok.vocab_size(), "tok").unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
}

fn shared_data() -> Option<std::path::PathBuf> {
    match std::env::var_os("MULTISPIN_SHARED_DATA") {
        None => {
            common::real_model_marker(false);
            None
        }
        Some(d) => {
            common::real_model_marker(true);
            let dir = std::path::PathBuf::from(d).join("models/stories260K");
            for f in ["stories260K.bin", "tok512.bin"] {
                assert!(
                    dir.join(f).is_file(),
                    "MULTISPIN_SHARED_DATA is set but {} is missing",
                    f
                );
            }
            Some(dir)
        }
    }
}

#[test]
fn stories260k_greedy_from_bos_tells_of_lily() {
    let Some(dir) = shared_data() else { return };
    let m = llama2c::load_checkpoint(&dir.join("stories260K.bin"), &Device::Cpu).unwrap();
    assert_eq!(
        (m.config().n_heads, m.config().n_kv_heads, m.config().dim),
        (8, 4, 64)
    );
    let tok = Llama2cTokenizer::load(&dir.join("tok512.bin"), 512).unwrap();
    let mut c = m.new_cache();
    let mut ids = vec![Llama2cTokenizer::BOS];
    let mut logits = m.forward(&mut c, &ids).unwrap();
    for _ in 0..24 {
        let next = logits
            .get(logits.dim(0).unwrap() - 1)
            .unwrap()
            .argmax(0)
            .unwrap()
            .to_scalar::<u32>()
            .unwrap();
        ids.push(next);
        logits = m.forward(&mut c, &[next]).unwrap();
    }
    let text = tok.decode(&ids);
    assert!(
        text.starts_with("Once upon a time, there was a little girl named Lily."),
        "{text:?}"
    );
    // The candle route gives the same logits along the way (host path on for `m`, off here).
    let mut candle = m.clone();
    candle.set_host_path(false);
    let d = max_diff(
        &stepwise(&m, &[], &ids[..20]),
        &stepwise(&candle, &[], &ids[..20]),
    );
    assert!(d < 1e-4, "stories260K host vs candle: max |diff| = {d}");
    let enc = tok.encode("Once upon a time, there was a little girl named Lily.", true);
    assert_eq!(
        tok.decode(&enc),
        "Once upon a time, there was a little girl named Lily."
    );
}

#[test]
fn greedy_decoding_equals_top1_sampling_and_argmax_keeps_the_first_maximum() {
    use spin_runtime::{decode, speculative};
    assert_eq!(decode::argmax(&[0.5, 2.0, -1.0, 2.0]).unwrap(), 1);
    assert_eq!(decode::argmax(&[f32::NEG_INFINITY, -3.0]).unwrap(), 1);
    for bad in [&[][..], &[1.0, f32::NAN], &[f32::INFINITY], &[f32::NEG_INFINITY]] {
        let e = decode::argmax(bad).unwrap_err();
        assert!(e.to_string().starts_with("logits:"), "{e}");
    }
    let cfg = tiny(RopeStyle::Interleaved, false, false);
    let m = model_from_tensors(cfg.clone(), weights(&cfg, 9), &Device::Cpu).unwrap();
    let params = speculative::sampling(0.0).unwrap();
    // A prompt longer than HOST_MAX_TOKENS (the candle route first), then host steps; an EOS that occurs stops both.
    let prompt: Vec<u32> = (0..20).map(|i| (i * 5 + 1) % 48).collect();
    let want = speculative::generate_plain(&m, &prompt, &params, 40, None, 0).unwrap();
    assert_eq!(decode::greedy(&m, &prompt, 40, None).unwrap(), want);
    let eos = want[7];
    let stop = speculative::generate_plain(&m, &prompt, &params, 40, Some(eos), 0).unwrap();
    assert_eq!(decode::greedy(&m, &prompt, 40, Some(eos)).unwrap(), stop);
    assert!(stop.len() <= 8);
    assert_eq!(
        decode::greedy(&m, &[], 4, None).unwrap_err().to_string(),
        "prompt: is empty"
    );
    let Some(dir) = shared_data() else { return };
    let s = llama2c::load_checkpoint(&dir.join("stories260K.bin"), &Device::Cpu).unwrap();
    let p = [1u32, 403, 407, 261, 378];
    let want = speculative::generate_plain(&s, &p, &params, 60, None, 0).unwrap();
    assert_eq!(decode::greedy(&s, &p, 60, None).unwrap(), want);
}

#[test]
fn embedded_models_load_and_share_the_tokenizer() {
    use spin_runtime::embedded;
    let t = embedded::target(&Device::Cpu).unwrap();
    let d = embedded::draft(&Device::Cpu).unwrap();
    let tok = embedded::tokenizer().unwrap();
    assert_eq!(
        (t.config().dim, t.config().n_layers, t.config().vocab_size),
        (64, 5, 512)
    );
    assert_eq!(
        (d.config().dim, d.config().n_layers, d.config().vocab_size),
        (32, 2, 512)
    );
    assert!(t.has_host_path() && d.has_host_path());
    assert_eq!(tok.vocab_size(), 512);
    // The committed target is the shared one, byte for byte, when the shared data is there.
    let Some(dir) = shared_data() else { return };
    assert_eq!(
        std::fs::read(dir.join("stories260K.bin")).unwrap(),
        embedded::TARGET
    );
    assert_eq!(
        std::fs::read(dir.join("tok512.bin")).unwrap(),
        embedded::TOKENIZER
    );
}
