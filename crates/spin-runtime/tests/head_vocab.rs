//! A draft model with a restricted output head (V_d listed tokens, q = 0 elsewhere): speculative sampling with its
//! real q rows is exact (every draft and accept/reject branch enumerated, against the target's exact distribution),
//! greedy speculation equals greedy decoding token for token, and the draft folder round-trips with its checks.

mod common;

use candle_core::Device;
use common::tiny;
use spin_core::enumerate::{Enumerator, enumerate};
use spin_core::{Dist, verify};
use spin_runtime::drafter::{DistForm, Drafter, device_rng};
use spin_runtime::head_vocab::{HeadVocab, most_frequent};
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::speculative::{self, SpecConfig, Speculator, generate_plain, prob_rows};
use spin_runtime::{Config, Model, RopeStyle};
use std::collections::HashMap;

/// The scored tokens of the restricted draft (of the tiny models' 24).
const HEAD: [u32; 6] = [3, 1, 7, 0, 12, 5];

fn restricted(seed: u64) -> Model {
    let cfg = Config {
        vocab_size: HEAD.len() + 1,
        dim: 16,
        hidden_dim: 32,
        n_layers: 1,
        n_heads: 2,
        n_kv_heads: 1,
        max_seq_len: 96,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Halves,
        qkv_bias: false,
        tied_embeddings: false,
    };
    let w = model::random_tensors(&cfg, 0.6, seed, &Device::Cpu).unwrap();
    model_from_tensors(cfg, w, &Device::Cpu)
        .unwrap()
        .with_head_vocab(HeadVocab::new(HEAD.to_vec(), 24).unwrap())
        .unwrap()
}

/// p(· | ctx) of the target at temperature 1, memoised.
fn p_row(target: &Model, memo: &mut HashMap<Vec<u32>, Vec<f64>>, ctx: &[u32]) -> Vec<f64> {
    memo.entry(ctx.to_vec())
        .or_insert_with(|| {
            let mut c = target.new_cache();
            let l = target.forward(&mut c, ctx).unwrap();
            let t1 = speculative::sampling(1.0).unwrap();
            prob_rows(&l.narrow(0, ctx.len() - 1, 1).unwrap(), &t1).unwrap()[0]
                .iter()
                .map(|&x| x as f64)
                .collect()
        })
        .clone()
}

/// q(· | ctx) as the drafter samples from it (one drafted token, its dense row), memoised.
fn q_row(draft: &Model, memo: &mut HashMap<Vec<u32>, Vec<f64>>, ctx: &[u32]) -> Vec<f64> {
    memo.entry(ctx.to_vec())
        .or_insert_with(|| {
            let t1 = speculative::sampling(1.0).unwrap();
            let mut d = Drafter::new(draft, ctx, ctx.len(), t1, DistForm::Dense, device_rng(0, 0)).unwrap();
            d.draft(1).unwrap();
            d.last_dists()[0].iter().map(|&x| x as f64).collect()
        })
        .clone()
}

#[test]
fn restricted_head_speculative_sampling_is_exact_by_enumeration() {
    let target = tiny(5, 0.6, 2);
    let draft = restricted(6);
    let prefix = vec![1u32, 7, 3];
    let (mut pm, mut qm) = (HashMap::new(), HashMap::new());
    // The draft's rows: zero off the head, positive on it, over the target's whole vocabulary.
    let q0 = q_row(&draft, &mut qm, &prefix);
    assert_eq!(q0.len(), 24);
    for (t, &q) in q0.iter().enumerate() {
        assert_eq!(q > 0.0, HEAD.contains(&(t as u32)), "token {t}: q = {q}");
    }
    for draft_len in 1..=2usize {
        let total = 3;
        // Rounds of at most `draft_len` drafts until `total` tokens are emitted (the last rounds draft fewer).
        let paths = enumerate(|e: &mut Enumerator| {
            let mut ctx = prefix.clone();
            let mut out = Vec::new();
            while out.len() < total {
                let l = draft_len.min(total - out.len() - 1);
                let (mut tokens, mut q_rows) = (Vec::new(), Vec::new());
                let mut c = ctx.clone();
                for _ in 0..l {
                    let q = q_row(&draft, &mut qm, &c);
                    let y = Dist::new(&q).unwrap().sample(e);
                    tokens.push(y);
                    c.push(y);
                    q_rows.push(q);
                }
                let p_rows: Vec<Vec<f64>> = (0..=l)
                    .map(|j| {
                        let mut c = ctx.clone();
                        c.extend(&tokens[..j]);
                        p_row(&target, &mut pm, &c)
                    })
                    .collect();
                let p: Vec<Dist<f64>> = p_rows.iter().map(|r| Dist::new(r).unwrap()).collect();
                let q: Vec<Dist<f64>> = q_rows.iter().map(|r| Dist::new(r).unwrap()).collect();
                let v = verify(&p, &tokens, &q, e).unwrap();
                let mut emitted = tokens[..v.accepted].to_vec();
                emitted.push(v.token);
                ctx.extend(&emitted);
                out.extend(emitted);
            }
            out.truncate(total);
            out
        });
        let mut got: HashMap<Vec<u32>, f64> = HashMap::new();
        for (seq, pr) in paths {
            *got.entry(seq).or_default() += pr;
        }
        // The target's exact distribution of the same sequences; every other sequence has mass 1 − Σ.
        let mut tv = 0.0;
        let mut covered = 0.0;
        for (seq, &pr) in &got {
            let mut ctx = prefix.clone();
            let mut want = 1.0;
            for &t in seq {
                want *= p_row(&target, &mut pm, &ctx)[t as usize];
                ctx.push(t);
            }
            covered += want;
            tv += (pr - want).abs();
        }
        tv = 0.5 * (tv + (1.0 - covered).abs());
        assert!(tv < 1e-5, "draft length {draft_len}: TV {tv:e}");
        // The sequences the draft alone could not propose come out too (the residual covers them).
        assert!(got.keys().any(|s| !HEAD.contains(&s[0])));
    }
}

#[test]
fn restricted_head_greedy_speculation_equals_greedy_decoding() {
    let target = tiny(1, 0.3, 3);
    let draft = restricted(2);
    let greedy = speculative::sampling(0.0).unwrap();
    let prompts = vec![vec![1u32, 5, 9], vec![1], vec![1, 7, 7, 7, 3], vec![1, 4]];
    let cfg = SpecConfig {
        params: greedy,
        max_new_tokens: 30,
        eos: None,
        seed: 9,
    };
    // Several devices (batched draft steps) and one (the single-sequence step).
    let mut s = Speculator::new(&target, &draft, &prompts, &[1, 2, 5, 3], cfg.clone()).unwrap();
    s.run().unwrap();
    for (k, d) in s.devices.iter().enumerate() {
        let want = generate_plain(&target, &prompts[k], &greedy, 30, None, 0).unwrap();
        assert_eq!(d.generated(), want.as_slice(), "device {k}");
    }
    let mut one = Speculator::new(&target, &draft, &prompts[2..3], &[4], cfg).unwrap();
    one.run().unwrap();
    let want = generate_plain(&target, &prompts[2], &greedy, 30, None, 0).unwrap();
    assert_eq!(one.devices[0].generated(), want.as_slice());
}

#[test]
fn restricted_draft_folder_round_trips_and_bad_heads_are_errors() {
    let draft = restricted(3);
    let dir = tempfile::tempdir().unwrap();
    let cfg = draft.config().clone();
    let w = model::random_tensors(&cfg, 0.6, 3, &Device::Cpu).unwrap();
    let hv = draft.head_vocab().unwrap().clone();
    spin_runtime::hf::write_draft_dir(dir.path(), &cfg, &w, &hv).unwrap();
    let back = spin_runtime::load_model(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(back.head_vocab(), Some(&hv));
    assert_eq!(back.output_vocab(), 24);
    let ctx = [1u32, 12, 3, 9];
    let mut qm = (HashMap::new(), HashMap::new());
    assert_eq!(q_row(&draft, &mut qm.0, &ctx), q_row(&back, &mut qm.1, &ctx));
    // Bad heads.
    assert!(HeadVocab::new(vec![], 24).is_err());
    assert!(HeadVocab::new(vec![1, 1], 24).is_err());
    let e = HeadVocab::new(vec![1, 24], 24).unwrap_err().to_string();
    assert!(e.contains("head_vocab") && e.contains("24"), "{e}");
    assert!(HeadVocab::new((0..24).collect(), 24).is_err());
    // A target vocabulary past the limit is refused before anything its size is allocated (a file may say 2³²).
    let e = HeadVocab::new(vec![1], u32::MAX as usize)
        .unwrap_err()
        .to_string();
    assert!(e.contains("exceeds the limit"), "{e}");
    let huge = tempfile::tempdir().unwrap();
    spin_runtime::hf::write_draft_dir(huge.path(), &cfg, &w, &hv).unwrap();
    let p = huge.path().join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(
        &p,
        text.replace(
            "\"multispin_target_vocab_size\": 24",
            "\"multispin_target_vocab_size\": 1000000000000",
        ),
    )
    .unwrap();
    let e = spin_runtime::load_model(huge.path(), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("multispin_target_vocab_size: 1000000000000 exceeds"),
        "{e}"
    );
    let hv5 = HeadVocab::new(vec![1, 2, 3, 4, 5], 24).unwrap();
    let e = tiny(1, 0.3, 1).with_head_vocab(hv5).unwrap_err().to_string();
    assert!(e.contains("head_vocab"), "{e}");
    // A token outside the target's vocabulary is an error, not an "other".
    assert!(hv.compact(24).is_err());
    assert_eq!(hv.compact(23).unwrap(), HEAD.len() as u32);
    assert_eq!(hv.compact(12).unwrap(), 4);
    // A folder whose config names a target vocabulary without the ids tensor is refused.
    let plain = tempfile::tempdir().unwrap();
    spin_runtime::hf::write_dir(plain.path(), &cfg, spin_runtime::hf::Arch::Llama, &w).unwrap();
    let p = plain.path().join("config.json");
    let text = std::fs::read_to_string(&p).unwrap();
    std::fs::write(&p, text.replacen('{', "{\"multispin_target_vocab_size\": 24,", 1)).unwrap();
    let e = spin_runtime::load_model(plain.path(), &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("head_vocab"), "{e}");
    // The draft cannot serve a target of another vocabulary.
    let big = tiny(1, 0.3, 1);
    let other_cfg = Config {
        vocab_size: 30,
        ..big.config().clone()
    };
    let other = model_from_tensors(
        other_cfg.clone(),
        model::random_tensors(&other_cfg, 0.3, 1, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let greedy = speculative::sampling(0.0).unwrap();
    let spec = SpecConfig {
        params: greedy,
        max_new_tokens: 3,
        eos: None,
        seed: 0,
    };
    assert!(Speculator::new(&other, &draft, &[vec![1]], &[2], spec).is_err());
}

/// A restricted draft folder written as GGUF (`gguf::write_from_dir`: Q8_0 matrices, query and key rows reordered
/// to neighbour pairs, the head's map in the metadata) loads with the same head and computes the distributions the
/// folder quantised to Q8_0 at load computes (within rounding: attention sums its channels in another order); a
/// file with half of the head's metadata, or ids that do not match its vocabulary, is refused naming the key.
#[test]
fn restricted_draft_folder_as_gguf_keeps_its_head_and_its_distributions() {
    use candle_core::quantized::gguf_file;
    use spin_runtime::gguf::{self, GgmlDType, HEAD_FULL_VOCAB_KEY, HEAD_IDS_KEY};
    // `restricted`'s shape, wide enough for Q8_0 blocks.
    let cfg = Config {
        dim: 64,
        hidden_dim: 64,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        tied_embeddings: true,
        ..restricted(0).config().clone()
    };
    let w = model::random_tensors(&cfg, 0.3, 8, &Device::Cpu).unwrap();
    let hv = HeadVocab::new(HEAD.to_vec(), 24).unwrap();
    let dir = tempfile::tempdir().unwrap();
    spin_runtime::hf::write_draft_dir(dir.path(), &cfg, &w, &hv).unwrap();
    let path = dir.path().join("draft.gguf");
    gguf::write_from_dir(dir.path(), &path, GgmlDType::Q8_0).unwrap();
    let folder = spin_runtime::load_model(dir.path(), &Device::Cpu)
        .unwrap()
        .quantize_host(spin_runtime::quant::BlockFormat::Q8_0)
        .unwrap();
    let file = spin_runtime::load_model(&path, &Device::Cpu).unwrap();
    assert_eq!(file.head_vocab(), Some(&hv));
    assert_eq!(file.output_vocab(), 24);
    assert!(!file.is_dense());
    for ctx in [&[1u32, 12, 3, 9][..], &[5, 5, 0, 7, 3, 1, 12, 23, 2, 4, 6]] {
        let mut qm = (HashMap::new(), HashMap::new());
        let (a, b) = (q_row(&folder, &mut qm.0, ctx), q_row(&file, &mut qm.1, ctx));
        for (t, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= 1e-5, "token {t} after {ctx:?}: {x} against {y}");
        }
    }
    // Half of the head's metadata, or ids that do not fit the vocabulary, are refused naming the key.
    let bytes = std::fs::read(&path).unwrap();
    let mut reader = std::io::Cursor::new(&bytes);
    let content = gguf_file::Content::read(&mut reader).unwrap();
    let tensors: Vec<(String, candle_core::quantized::QTensor)> = content
        .tensor_infos
        .keys()
        .map(|n| (n.clone(), content.tensor(&mut reader, n, &Device::Cpu).unwrap()))
        .collect();
    let rewrite = |edit: &dyn Fn(&mut HashMap<String, gguf_file::Value>)| {
        let mut md = content.metadata.clone();
        edit(&mut md);
        let md_refs: Vec<(&str, &gguf_file::Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let t_refs: Vec<(&str, &candle_core::quantized::QTensor)> =
            tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let bad = dir.path().join("bad.gguf");
        gguf_file::write(&mut std::fs::File::create(&bad).unwrap(), &md_refs, &t_refs).unwrap();
        spin_runtime::load_model(&bad, &Device::Cpu)
            .unwrap_err()
            .to_string()
    };
    let e = rewrite(&|md| {
        md.remove(HEAD_FULL_VOCAB_KEY);
    });
    assert!(e.contains(HEAD_FULL_VOCAB_KEY), "{e}");
    let e = rewrite(&|md| {
        md.insert(
            HEAD_IDS_KEY.into(),
            gguf_file::Value::Array(HEAD[..5].iter().map(|&i| gguf_file::Value::U32(i)).collect()),
        );
    });
    assert!(e.contains(HEAD_IDS_KEY) && e.contains("token_embd"), "{e}");
    let e = rewrite(&|md| {
        md.insert(HEAD_FULL_VOCAB_KEY.into(), gguf_file::Value::U32(10));
    });
    assert!(e.contains(HEAD_IDS_KEY), "{e}");
}

#[test]
fn most_frequent_orders_by_count_then_id() {
    assert_eq!(most_frequent(&[3, 0, 5, 3, 1], 3), vec![2, 0, 3]);
    assert_eq!(most_frequent(&[0, 2, 0], 5), vec![1]);
}

/// The compact route to a restricted head's distribution gives, to rounding, the distribution of the expanded row
/// (scored logits at their target ids, −∞ elsewhere) under every sampling control.
#[test]
fn compact_probabilities_equal_those_of_the_expanded_row() {
    let hv = HeadVocab::new(HEAD.to_vec(), 24).unwrap();
    let compact: Vec<f32> = [0.3f32, -1.2, 2.5, 0.31, -0.4, 1.7, 9.0].to_vec();
    let mut full = Vec::new();
    hv.expand_logits(&compact, &mut full).unwrap();
    let controls = [
        spin_core::SamplingParams::new(1.0, None, None).unwrap(),
        spin_core::SamplingParams::new(0.7, Some(3), None).unwrap(),
        spin_core::SamplingParams::new(1.3, None, Some(0.8)).unwrap(),
        spin_core::SamplingParams::new(1.0, None, None)
            .unwrap()
            .with_min_p(0.2)
            .unwrap(),
        spin_core::SamplingParams::new(1.0, Some(1), None).unwrap(),
    ];
    let (mut scratch, mut got, mut want) = (Vec::new(), Vec::new(), Vec::new());
    for params in controls {
        hv.probs_into(&compact, &params, &mut scratch, &mut got).unwrap();
        spin_runtime::probs::probs_into(&full, &params, &mut want).unwrap();
        assert_eq!(got.len(), 24);
        for (t, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-6, "{params:?}, token {t}: {g} against {w}");
        }
        // The "other" logit (the largest here) never gets mass.
        assert!(
            got.iter()
                .enumerate()
                .all(|(t, &p)| HEAD.contains(&(t as u32)) || p == 0.0)
        );
    }
    let params = spin_core::SamplingParams::new(1.0, None, None).unwrap();
    assert!(
        hv.probs_into(&compact[..6], &params, &mut scratch, &mut got)
            .is_err()
    );
}

/// A restricted draft cannot stand for the target: its logits are over its compact ids, so plain decoding would
/// read them as token ids and verification would judge the wrong tokens. Plain decoding, the speculative loop and
/// the verifier refuse it before any pass, naming the model and why.
#[test]
fn a_restricted_draft_cannot_stand_for_the_target() {
    let draft = restricted(4);
    let greedy = speculative::sampling(0.0).unwrap();
    let why = "restricted output head (it scores 6 of the 24 tokens) cannot be the target";
    let e = generate_plain(&draft, &[1, 3], &greedy, 2, None, 0)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("model: ") && e.contains(why), "{e}");
    let e = speculative::generate_plain_batch(&draft, &[vec![1, 3]], &greedy, 2, &[0])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("model: ") && e.contains(why), "{e}");
    let spec = SpecConfig {
        params: greedy,
        max_new_tokens: 2,
        eos: None,
        seed: 0,
    };
    let e = Speculator::new(&draft, &draft, &[vec![1, 3]], &[2], spec)
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("target: ") && e.contains(why), "{e}");
    let mut v = spin_runtime::verifier::Verifier::new(
        &draft,
        spin_runtime::verifier::VerifierConfig {
            params: greedy,
            max_new_tokens: 2,
            eos: None,
            seed: 0,
        },
    );
    let e = v.add_devices(&[vec![1, 3]]).unwrap_err().to_string();
    assert!(e.starts_with("target: ") && e.contains(why), "{e}");
    // The draft's own check passes a model of a whole vocabulary.
    tiny(1, 0.3, 1).check_full_head("target").unwrap();
}
