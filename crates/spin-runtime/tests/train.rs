//! Distillation lowers the student's KL divergence from the target, and the saved student loads as a drafter.

use candle_core::Device;
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::train::{DistillConfig, distill};
use spin_runtime::{Config, RopeStyle, llama2c};

fn cfg(dim: usize, n_layers: usize) -> Config {
    Config {
        vocab_size: 20,
        dim,
        hidden_dim: 2 * dim,
        n_layers,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 32,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    }
}

#[test]
fn distillation_reduces_kl_and_saves_a_loadable_drafter() {
    let tc = cfg(32, 2);
    let target = model_from_tensors(
        tc.clone(),
        model::random_tensors(&tc, 1.0, 1, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let dc = DistillConfig {
        student: cfg(16, 1),
        steps: 30,
        batch: 4,
        seq_len: 12,
        learning_rate: 3e-2,
        seed: 3,
    };
    let mut kls = Vec::new();
    let w = distill(&target, &dc, |s| kls.push(s.kl)).unwrap();
    assert_eq!(kls.len(), 30);
    let first: f64 = kls[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = kls[25..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.85 * first, "KL {first} -> {last}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("draft.bin");
    llama2c::write_checkpoint(&p, &dc.student, &w).unwrap();
    let d = llama2c::load_checkpoint(&p, &Device::Cpu).unwrap();
    assert_eq!(d.config(), &dc.student);
    let bad = DistillConfig {
        student: cfg(16, 1),
        steps: 0,
        ..dc.clone()
    };
    assert!(distill(&target, &bad, |_| ()).is_err());
}

#[test]
fn top_k_cache_and_one_restricted_head_step_lowers_the_kl_on_a_fixed_batch() {
    use spin_runtime::head_vocab::{HeadVocab, most_frequent};
    use spin_runtime::train::{HeadStudent, TopKCache, cache_top_k};
    let tc = cfg(32, 1);
    let target = model_from_tensors(
        tc.clone(),
        model::random_tensors(&tc, 1.0, 1, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let seqs: Vec<Vec<u32>> = (0..6u32)
        .map(|s| (0..10).map(|j| (s * 7 + j * 3) % 20).collect())
        .collect();
    let mut seen = Vec::new();
    let cache = cache_top_k(&target, &seqs, 5, 4, |n| seen.push(n)).unwrap();
    assert_eq!(seen, vec![4, 6]);
    assert_eq!((cache.sequences(), cache.ids.len()), (6, 6 * 10 * 5));
    // The kept probabilities are the target's own, most likely first.
    let mut c = target.new_cache();
    let l = target.forward(&mut c, &seqs[2]).unwrap();
    let p = candle_nn::ops::softmax_last_dim(&l)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let at = (2 * 10 + 4) * 5;
    let mut sorted = p[4].clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    for j in 0..5 {
        assert!((cache.probs[at + j] - p[4][cache.ids[at + j] as usize]).abs() < 1e-5);
        assert!((cache.probs[at + j] - sorted[j]).abs() < 1e-5);
    }
    let counts: Vec<u64> = cache
        .expected_counts(20)
        .iter()
        .map(|&x| (x * 1000.0) as u64)
        .collect();
    let hv = HeadVocab::new(most_frequent(&counts, 8), 20).unwrap();
    let student_cfg = Config {
        vocab_size: 9,
        rope: RopeStyle::Halves,
        ..cfg(16, 1)
    };
    let mut s = HeadStudent::new(student_cfg.clone(), hv.clone(), 1e-2, 3).unwrap();
    let batch = s.batch(&cache, &[0, 3, 5]).unwrap();
    let before = s.kl(&batch).unwrap();
    assert_eq!(s.step(&batch).unwrap(), before);
    let after = s.kl(&batch).unwrap();
    assert!(after < before, "KL {before} -> {after}");
    // With the cross-entropy at the target's top token added, the loss exceeds the KL by that term (≥ 0, and > 0
    // for a student that is not sure of every top token), the step lowers the loss and still reports the KL; a
    // negative or non-finite weight is refused by name.
    let mut g = HeadStudent::new(student_cfg.clone(), hv.clone(), 1e-2, 3).unwrap();
    assert_eq!(g.loss(&batch).unwrap(), g.kl(&batch).unwrap());
    g.set_argmax_weight(0.5).unwrap();
    let (loss0, kl0) = (g.loss(&batch).unwrap(), g.kl(&batch).unwrap());
    assert_eq!(kl0, before);
    assert!(loss0 > kl0, "loss {loss0}, KL {kl0}");
    assert_eq!(g.step(&batch).unwrap(), kl0);
    let loss1 = g.loss(&batch).unwrap();
    assert!(loss1 < loss0, "loss {loss0} -> {loss1}");
    for bad in [-0.1, f64::NAN, f64::INFINITY] {
        let e = g.set_argmax_weight(bad).unwrap_err().to_string();
        assert!(e.contains("argmax_weight"), "{e}");
        assert!(spin_runtime::train::check_argmax_weight(bad).is_err());
    }
    assert_eq!(spin_runtime::train::check_argmax_weight(0.5).unwrap(), 0.5);
    // The trained student saves and loads as a restricted draft.
    let dir = tempfile::tempdir().unwrap();
    spin_runtime::hf::write_draft_dir(dir.path(), &student_cfg, s.tensors(), &hv).unwrap();
    let d = spin_runtime::load_model(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(d.output_vocab(), 20);
    // The cache survives a round trip through its file format, under its key only; damaged files are refused
    // by field.
    let bytes = cache.to_bytes(42);
    assert_eq!(TopKCache::from_bytes(&bytes, 42).unwrap(), cache);
    let msg = |b: &[u8], key| TopKCache::from_bytes(b, key).unwrap_err().to_string();
    assert!(msg(&bytes, 43).contains("key"), "{}", msg(&bytes, 43));
    assert!(msg(&bytes[..bytes.len() - 1], 42).contains("length"));
    assert!(msg(&bytes[..10], 42).contains("header"));
    assert!(msg(b"GGUF0000", 42).contains("magic"));
    let mut bad = bytes.clone();
    let last = bad.len() - 4;
    bad[last..].copy_from_slice(&2.0f32.to_le_bytes());
    assert!(msg(&bad, 42).contains("probs["), "{}", msg(&bad, 42));
    // Bad inputs are errors.
    assert!(s.batch(&cache, &[6]).is_err());
    assert!(cache_top_k(&target, &seqs, 0, 4, |_| ()).is_err());
    assert!(cache_top_k(&target, &[vec![1, 2], vec![3]], 2, 4, |_| ()).is_err());
    assert!(HeadStudent::new(cfg(16, 1), hv, 1e-2, 3).is_err());
}

/// A student made of all the target's layers computes the target's logits on the head's tokens (the rope
/// reordering of query and key rows included: the target pairs neighbours, the student halves); one made of fewer
/// layers is a different model; bad layer lists are refused by name.
#[test]
fn a_student_of_the_targets_own_layers_starts_where_the_target_is() {
    use spin_runtime::head_vocab::HeadVocab;
    use spin_runtime::train::{HeadStudent, layer_tensor_names, student_from_layers};
    let mut tc = cfg(32, 3);
    tc.tied_embeddings = false;
    let tensors = model::random_tensors(&tc, 0.5, 7, &Device::Cpu).unwrap();
    let target = model_from_tensors(tc.clone(), tensors.clone(), &Device::Cpu).unwrap();
    let hv = HeadVocab::new(vec![3, 0, 17, 5, 9, 12], tc.vocab_size).unwrap();
    let need: std::collections::HashMap<_, _> = layer_tensor_names(&tc, &[0, 1, 2])
        .into_iter()
        .map(|(n, _)| (n.clone(), tensors[&n].clone()))
        .collect();
    assert_eq!(need.len(), tensors.len());
    let tokens = [3u32, 17, 5, 9, 0, 12, 3];
    let mut compact = Vec::new();
    hv.map_tokens(&tokens, &mut compact).unwrap();
    let ids = candle_core::Tensor::new(&tokens[..], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let cids = candle_core::Tensor::new(&compact[..], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want = target
        .forward_full(&ids)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    let logits_of = |layers: &[usize]| {
        let names = layer_tensor_names(&tc, layers);
        let sub = names
            .iter()
            .map(|(n, _)| (n.clone(), tensors[n].clone()))
            .collect();
        let (sc, st) = student_from_layers(&tc, &sub, layers, &hv).unwrap();
        assert_eq!(sc.rope, RopeStyle::Halves);
        assert_eq!(sc.n_layers, layers.len());
        // The training wrapper accepts exactly these tensors.
        HeadStudent::from_tensors(sc.clone(), hv.clone(), 1e-3, &st, 0).unwrap();
        let s = model_from_tensors(sc, st, &Device::Cpu).unwrap();
        s.forward_full(&cids)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
    };
    let got = logits_of(&[0, 1, 2]);
    let mut worst = 0f32;
    for (w, g) in want.iter().zip(&got) {
        for (j, &t) in hv.ids().iter().enumerate() {
            worst = worst.max((w[t as usize] - g[j]).abs());
        }
    }
    assert!(
        worst < 1e-4,
        "student of all layers differs from the target by {worst}"
    );
    let fewer = logits_of(&[0, 2]);
    let diff: f32 = fewer
        .iter()
        .flatten()
        .zip(got.iter().flatten())
        .map(|(a, b)| (a - b).abs())
        .sum();
    assert!(diff > 1e-2, "dropping a layer changed nothing ({diff})");
    let err = student_from_layers(&tc, &need, &[0, 3], &hv)
        .unwrap_err()
        .to_string();
    assert!(err.contains("layers") && err.contains('3'), "{err}");
    let err = student_from_layers(&tc, &need, &[], &hv).unwrap_err().to_string();
    assert!(err.contains("layers"), "{err}");
}

/// A student whose first layers, embedding and head are frozen (`from_tensors(…, frozen)`) trains its upper
/// layers and final norm alone: the frozen tensors keep their bits through steps, the others move, the KL on a
/// fixed batch falls, and freezing every layer is refused by name.
#[test]
fn a_student_with_frozen_lower_layers_trains_only_the_layers_above() {
    use spin_runtime::head_vocab::{HeadVocab, most_frequent};
    use spin_runtime::train::{HeadStudent, cache_top_k, layer_tensor_names, student_from_layers};
    let mut tc = cfg(32, 3);
    tc.tied_embeddings = false;
    let tensors = model::random_tensors(&tc, 0.5, 11, &Device::Cpu).unwrap();
    let target = model_from_tensors(tc.clone(), tensors.clone(), &Device::Cpu).unwrap();
    let seqs: Vec<Vec<u32>> = (0..6u32)
        .map(|s| (0..10).map(|j| (s * 5 + j * 7) % 20).collect())
        .collect();
    let cache = cache_top_k(&target, &seqs, 6, 4, |_| ()).unwrap();
    let counts: Vec<u64> = cache
        .expected_counts(20)
        .iter()
        .map(|&x| (x * 1000.0) as u64)
        .collect();
    let hv = HeadVocab::new(most_frequent(&counts, 12), 20).unwrap();
    let names = layer_tensor_names(&tc, &[0, 1, 2]);
    let sub: std::collections::HashMap<_, _> = names
        .iter()
        .map(|(n, _)| (n.clone(), tensors[n].clone()))
        .collect();
    let (sc, st) = student_from_layers(&tc, &sub, &[0, 1, 2], &hv).unwrap();
    let err = HeadStudent::from_tensors(sc.clone(), hv.clone(), 1e-2, &st, 3)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("frozen"), "{err}");
    let mut s = HeadStudent::from_tensors(sc.clone(), hv.clone(), 1e-2, &st, 2).unwrap();
    let batch = s.batch(&cache, &[0, 2, 4, 5]).unwrap();
    let before = s.kl(&batch).unwrap();
    for _ in 0..3 {
        s.step(&batch).unwrap();
    }
    let after = s.kl(&batch).unwrap();
    assert!(after < before, "KL {before} -> {after}");
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let (mut kept, mut moved) = (0, 0);
    for (name, t) in s.tensors() {
        let frozen = name == "model.embed_tokens.weight"
            || name == "lm_head.weight"
            || name.starts_with("model.layers.0.")
            || name.starts_with("model.layers.1.");
        let same = bits(t) == bits(&st[name]);
        if frozen {
            assert!(same, "{name} is frozen but changed");
            kept += 1;
        } else if !same {
            moved += 1;
        }
    }
    assert!(kept >= 2 + 2 * 9, "{kept} frozen tensors");
    // Every matrix of layer 2 and the final norm learn (a norm of a layer whose output the loss cannot see
    // would not, but here every one of them can).
    assert!(moved >= 9, "{moved} trained tensors moved");
}
