//! The K-device speculative loop: token-for-token equality with greedy decoding at temperature 0, seeded
//! determinism, and a chi-square test of the generated tokens against their exact distribution at temperature 1.

mod common;

use candle_core::Device;
use common::tiny;
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::speculative::{
    self, Drafting, SpecConfig, Speculator, generate_plain, generate_plain_batch, prob_rows,
};
use spin_runtime::{Config, Model};
use statrs::distribution::{ChiSquared, ContinuousCDF};

fn spec(params: spin_core::SamplingParams, max_new_tokens: usize, seed: u64) -> SpecConfig {
    SpecConfig {
        params,
        max_new_tokens,
        eos: None,
        seed,
    }
}

#[test]
fn greedy_speculation_equals_greedy_decoding_token_for_token() {
    let target = tiny(1, 0.3, 3);
    let other = tiny(2, 0.3, 2);
    let own_layers = target.first_layers(1).unwrap();
    let greedy = speculative::sampling(0.0).unwrap();
    let prompts = vec![vec![1u32, 5, 9], vec![1], vec![1, 7, 7, 7, 3], vec![1, 4]];
    for drafter in [&other, &own_layers, &target] {
        let mut s = Speculator::new(&target, drafter, &prompts, &[0, 2, 5, 3], spec(greedy, 30, 9)).unwrap();
        s.run().unwrap();
        for (k, d) in s.devices.iter().enumerate() {
            let want = generate_plain(&target, &prompts[k], &greedy, 30, None, 0).unwrap();
            assert_eq!(d.generated(), want.as_slice(), "device {k}");
        }
    }
    // With the target as its own drafter every drafted token is accepted.
    let mut s = Speculator::new(&target, &target, &prompts, &[4, 4, 4, 4], spec(greedy, 30, 9)).unwrap();
    s.run().unwrap();
    assert!(
        s.devices.iter().all(|d| d.rounds == 6),
        "30 tokens in rounds of 5"
    );
}

#[test]
fn same_seed_same_text_different_seed_different_text() {
    let target = tiny(3, 0.5, 2);
    let drafter = tiny(4, 0.5, 1);
    let t1 = speculative::sampling(1.0).unwrap();
    let run = |seed| {
        let prompts = vec![vec![1u32, 2], vec![1, 3]];
        let mut s = Speculator::new(&target, &drafter, &prompts, &[3, 1], spec(t1, 25, seed)).unwrap();
        s.run().unwrap();
        s.devices
            .iter()
            .map(|d| d.generated().to_vec())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn batched_drafting_yields_the_per_device_tokens() {
    let target = tiny(3, 0.5, 2);
    let drafter = tiny(4, 0.5, 1);
    let t1 = speculative::sampling(1.0).unwrap();
    let prompts = vec![vec![1u32, 2], vec![1, 3, 5, 7], vec![1], vec![1, 9, 2]];
    let run = |drafting| {
        let mut s = Speculator::new(&target, &drafter, &prompts, &[3, 0, 5, 2], spec(t1, 20, 11)).unwrap();
        s.set_drafting(drafting);
        s.run().unwrap();
        let toks: Vec<Vec<u32>> = s.devices.iter().map(|d| d.generated().to_vec()).collect();
        let drafted: Vec<usize> = s.devices.iter().map(|d| d.drafted).collect();
        (toks, drafted)
    };
    let (batched, per_device) = (run(Drafting::Batched), run(Drafting::PerDevice));
    assert_eq!(batched, per_device);
    assert_eq!(batched.1[1], 0, "a device with γ = 0 drafts nothing");
    assert!(batched.0.iter().all(|t| t.len() == 20));
}

#[test]
fn batched_sampling_yields_the_plain_sampling_tokens() {
    let model = tiny(3, 0.5, 2);
    let t1 = speculative::sampling(1.0).unwrap();
    let prompts = vec![vec![1u32], vec![1, 3, 5], vec![1, 9]];
    let seeds = [4u64, 5, 4];
    let batch = generate_plain_batch(&model, &prompts, &t1, 12, &seeds).unwrap();
    for (b, p) in prompts.iter().enumerate() {
        assert_eq!(
            batch[b],
            generate_plain(&model, p, &t1, 12, None, seeds[b]).unwrap(),
            "sequence {b}"
        );
    }
    // Same seed, different prompt: different text (the generators are not shared).
    assert_ne!(batch[0], batch[2]);
    let e = generate_plain_batch(&model, &prompts, &t1, 3, &[1]).unwrap_err();
    assert!(e.to_string().starts_with("seeds:"), "{e}");
}

#[test]
fn bad_settings_are_errors() {
    let target = tiny(3, 0.5, 2);
    let cfg = Config {
        vocab_size: 30,
        ..target.config().clone()
    };
    let wide = model_from_tensors(
        cfg.clone(),
        model::random_tensors(&cfg, 0.1, 1, &Device::Cpu).unwrap(),
        &Device::Cpu,
    )
    .unwrap();
    let t1 = speculative::sampling(1.0).unwrap();
    let e = Speculator::new(&target, &wide, &[vec![1]], &[2], spec(t1, 5, 1))
        .err()
        .unwrap();
    assert!(e.to_string().starts_with("draft: vocabulary"), "{e}");
    let e = Speculator::new(&target, &target, &[vec![1]], &[2, 3], spec(t1, 5, 1))
        .err()
        .unwrap();
    assert!(e.to_string().starts_with("draft_lens"), "{e}");
    assert!(speculative::sampling(-1.0).is_err());
}

/// Pearson's chi-square p-value of `counts` against probabilities `p`; cells expected below 5 are pooled (in
/// ascending order of expectation) until each pooled cell expects at least 5.
fn chi_square_p(counts: &[u64], p: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let mut cells: Vec<(f64, f64)> = counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| (c as f64, pi * n as f64))
        .collect();
    cells.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (mut merged, mut pool) = (Vec::new(), (0.0, 0.0));
    for (o, e) in cells {
        pool = (pool.0 + o, pool.1 + e);
        if pool.1 >= 5.0 {
            merged.push(pool);
            pool = (0.0, 0.0);
        }
    }
    if let Some(last) = merged.last_mut() {
        *last = (last.0 + pool.0, last.1 + pool.1);
    }
    let stat: f64 = merged.iter().map(|(o, e)| (o - e).powi(2) / e).sum();
    1.0 - ChiSquared::new((merged.len() - 1) as f64).unwrap().cdf(stat)
}

/// Exact distributions of the first and second generated token after `prompt` (enumerating the first token).
fn exact_first_two(
    target: &Model,
    prompt: &[u32],
    params: &spin_core::SamplingParams,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = target.new_cache();
    let l = target.forward(&mut c, prompt).unwrap();
    let p1: Vec<f64> = prob_rows(&l.narrow(0, prompt.len() - 1, 1).unwrap(), params).unwrap()[0]
        .iter()
        .map(|&x| x as f64)
        .collect();
    let v = p1.len();
    let mut caches: Vec<_> = (0..v).map(|_| c.clone()).collect();
    let mut refs: Vec<_> = caches.iter_mut().collect();
    let toks: Vec<[u32; 1]> = (0..v as u32).map(|t| [t]).collect();
    let ins: Vec<&[u32]> = toks.iter().map(|t| t.as_slice()).collect();
    let out = target.forward_batch(&mut refs, &ins).unwrap();
    let mut p2 = vec![0.0; v];
    for (t, l) in out.iter().enumerate() {
        for (x, &q) in p2.iter_mut().zip(&prob_rows(l, params).unwrap()[0]) {
            *x += p1[t] * q as f64;
        }
    }
    (p1, p2)
}

#[test]
fn sampled_speculation_matches_the_target_distribution() {
    let target = tiny(5, 0.6, 2);
    let drafter = tiny(6, 0.6, 1);
    let t1 = speculative::sampling(1.0).unwrap();
    let prompt = vec![1u32, 7, 3];
    let (p1, p2) = exact_first_two(&target, &prompt, &t1);
    let (mut c1, mut c2) = (vec![0u64; 24], vec![0u64; 24]);
    let mut alpha = Vec::new();
    for rep in 0..20u64 {
        let prompts = vec![prompt.clone(); 64];
        let lens: Vec<usize> = (0..64).map(|k| k % 4).collect();
        let mut s = Speculator::new(&target, &drafter, &prompts, &lens, spec(t1, 4, 100 + rep)).unwrap();
        s.run().unwrap();
        for d in &s.devices {
            c1[d.generated()[0] as usize] += 1;
            c2[d.generated()[1] as usize] += 1;
            if let Some(e) = d.alpha.ratio_estimate(1.96).unwrap() {
                alpha.push(e.value);
            }
        }
    }
    // The drafter is a poor match, so the residual path is exercised often.
    let mean_alpha = alpha.iter().sum::<f64>() / alpha.len() as f64;
    assert!(mean_alpha < 0.8, "mean α = {mean_alpha}");
    let (a, b) = (chi_square_p(&c1, &p1), chi_square_p(&c2, &p2));
    assert!(a > 1e-3 && b > 1e-3, "p-values {a}, {b}");
    // The test can fail: the same counts against the drafter's own distribution are rejected.
    let (q1, _) = exact_first_two(&drafter, &prompt, &t1);
    assert!(chi_square_p(&c1, &q1) < 1e-6);
}

fn stories() -> Option<(Model, spin_runtime::llama2c::Llama2cTokenizer)> {
    let Some(d) = std::env::var_os("MULTISPIN_SHARED_DATA") else {
        common::real_model_marker(false);
        return None;
    };
    common::real_model_marker(true);
    let dir = std::path::PathBuf::from(d).join("models/stories260K");
    assert!(
        dir.join("stories260K.bin").is_file(),
        "MULTISPIN_SHARED_DATA is set but stories260K.bin is missing"
    );
    assert!(
        dir.join("tok512.bin").is_file(),
        "MULTISPIN_SHARED_DATA is set but tok512.bin is missing"
    );
    let m = spin_runtime::llama2c::load_checkpoint(&dir.join("stories260K.bin"), &Device::Cpu).unwrap();
    let t = spin_runtime::llama2c::Llama2cTokenizer::load(&dir.join("tok512.bin"), 512).unwrap();
    Some((m, t))
}

#[test]
fn stories260k_speculation_greedy_equality_and_sampling_chi_square() {
    let Some((target, tok)) = stories() else { return };
    let drafter = target.first_layers(2).unwrap();
    let greedy = speculative::sampling(0.0).unwrap();
    let prompts = vec![
        tok.encode("Once upon a time", true),
        tok.encode("The dog", true),
        vec![1],
    ];
    let mut s = Speculator::new(&target, &drafter, &prompts, &[4, 2, 6], spec(greedy, 40, 1)).unwrap();
    s.run().unwrap();
    for (k, d) in s.devices.iter().enumerate() {
        let want = generate_plain(&target, &prompts[k], &greedy, 40, None, 0).unwrap();
        assert_eq!(d.generated(), want.as_slice(), "device {k}");
    }
    let text = tok.decode(&s.devices[2].tokens);
    assert!(
        text.starts_with("Once upon a time, there was a little girl named Lily."),
        "{text:?}"
    );
    // Temperature 1: the first generated token after a fixed prompt follows the target's distribution.
    let t1 = speculative::sampling(1.0).unwrap();
    let prompt = tok.encode("Once upon a time, there was a", true);
    let mut c = target.new_cache();
    let l = target.forward(&mut c, &prompt).unwrap();
    let p: Vec<f64> = prob_rows(&l.narrow(0, prompt.len() - 1, 1).unwrap(), &t1).unwrap()[0]
        .iter()
        .map(|&x| x as f64)
        .collect();
    let mut counts = vec![0u64; 512];
    // 400 devices in two runs: each run drafts in one batch per step and verifies in one batch per round.
    for rep in 0..2u64 {
        let mut s = Speculator::new(
            &target,
            &drafter,
            &vec![prompt.clone(); 200],
            &[3; 200],
            spec(t1, 4, rep),
        )
        .unwrap();
        s.run().unwrap();
        for d in &s.devices {
            counts[d.generated()[0] as usize] += 1;
        }
    }
    let pv = chi_square_p(&counts, &p);
    assert!(pv > 1e-3, "p-value {pv}");
    // The test can fail: the drafter's own distribution is rejected (printed to show the margin).
    let mut c = drafter.new_cache();
    let l = drafter.forward(&mut c, &prompt).unwrap();
    let q: Vec<f64> = prob_rows(&l.narrow(0, prompt.len() - 1, 1).unwrap(), &t1).unwrap()[0]
        .iter()
        .map(|&x| x as f64)
        .collect();
    let pq = chi_square_p(&counts, &q);
    println!("p-value against the target {pv:.3}, against the drafter {pq:.2e}");
    assert!(pq < 1e-6, "p-value against the drafter {pq}");
}

#[test]
fn drafter_and_verifier_with_token_probabilities_and_ul_or_dl_correction_sample_the_target() {
    use spin_runtime::drafter::{DistForm, Drafter, device_rng};
    use spin_runtime::verifier::{Decision, DraftDists, Submission, Verifier, VerifierConfig};
    let target = tiny(5, 0.6, 2);
    let drafter = tiny(6, 0.6, 1);
    let t1 = speculative::sampling(1.0).unwrap();
    let prompt = vec![1u32, 7, 3];
    let (p1, _) = exact_first_two(&target, &prompt, &t1);
    let form = DistForm::Sparse {
        v_eff: 24,
        q_bits: 24,
    };
    let mut counts = vec![0u64; 24];
    let (mut ul, mut dl) = (0, 0);
    for rep in 0..1000u64 {
        let mut v = Verifier::new(
            &target,
            VerifierConfig {
                params: t1,
                max_new_tokens: 3,
                eos: None,
                seed: rep,
            },
        );
        v.add_devices(std::slice::from_ref(&prompt)).unwrap();
        let mut d = Drafter::new(&drafter, &prompt, prompt.len(), t1, form, device_rng(rep, 0)).unwrap();
        let out = d.draft(2).unwrap();
        let sub = Submission {
            device: 0,
            tokens: &out.tokens,
            dists: DraftDists::Probs(&out.probs),
        };
        let (dec, _) = v.verify(&[sub]).unwrap();
        let first = match dec[0] {
            Decision::Done { accepted, token, .. } => {
                d.commit(accepted, token).unwrap();
                if accepted > 0 { out.tokens[0] } else { token }
            }
            Decision::Pending { position } => {
                let token = if rep % 2 == 0 {
                    ul += 1;
                    v.resolve_uplink(0, &d.uplink_q(position, 24, 24).unwrap())
                        .unwrap()
                } else {
                    dl += 1;
                    let t = d
                        .correct_downlink(position, &v.downlink_p(0, 24, 24).unwrap())
                        .unwrap();
                    v.resolve_token(0, t).unwrap();
                    t
                };
                d.commit(position, token).unwrap();
                if position > 0 { out.tokens[0] } else { token }
            }
        };
        assert_eq!(
            d.tokens(),
            v.tokens(0).unwrap(),
            "both halves commit the same text"
        );
        counts[first as usize] += 1;
    }
    assert!(ul > 50 && dl > 50, "{ul} UL and {dl} DL corrections");
    let pv = chi_square_p(&counts, &p1);
    assert!(pv > 1e-3, "p-value {pv}");
    let (q1, _) = exact_first_two(&drafter, &prompt, &t1);
    assert!(chi_square_p(&counts, &q1) < 1e-6, "the test can fail");
}

#[test]
fn one_hot_top1_rows_equal_the_general_sampler() {
    use rand::{RngExt, SeedableRng};
    let greedy = speculative::sampling(0.0).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let mut rows: Vec<Vec<f32>> = (0..50)
        .map(|_| (0..37).map(|_| rng.random::<f32>() * 8.0 - 4.0).collect())
        .collect();
    // Ties (the smaller id wins in both), −∞ entries and a single entry.
    rows.push(vec![1.0, 3.0, 3.0, -2.0]);
    rows.push(vec![f32::NEG_INFINITY, 0.5, f32::NEG_INFINITY, 0.5]);
    rows.push(vec![2.0]);
    for row in &rows {
        let (mut fast, mut general) = (Vec::new(), Vec::new());
        speculative::probs_into(row, &greedy, &mut fast).unwrap();
        spin_core::probs_from_logits(row, &greedy, &mut general).unwrap();
        assert_eq!(fast, general, "{row:?}");
    }
    // Bad rows are errors on the fast path too.
    for bad in [
        vec![],
        vec![1.0, f32::NAN],
        vec![f32::INFINITY],
        vec![f32::NEG_INFINITY; 3],
    ] {
        assert!(
            speculative::probs_into(&bad, &greedy, &mut Vec::new()).is_err(),
            "{bad:?}"
        );
    }
}

/// The end-of-sequence token accepted inside a draft ends the text there, as in plain decoding: with the target as
/// its own draft (every drafted token accepted) and a long draft, the end token falls mid-block, and nothing after
/// it is committed. Before this was checked, the round's remaining drafts and bonus token were kept and decoding
/// went on past the end.
#[test]
fn an_end_token_accepted_inside_a_draft_ends_the_text_there() {
    let target = tiny(11, 1.0, 2);
    let prompt = vec![1u32, 5, 9];
    let free = spin_runtime::decode::greedy(&target, &prompt, 30, None).unwrap();
    // The first token that did not occur before it: the text up to it is what plain decoding gives with it as EOS.
    let at = (2..free.len())
        .find(|&i| !free[..i].contains(&free[i]))
        .expect("a fresh token in 30 greedy ones");
    let eos = free[at];
    let plain = spin_runtime::decode::greedy(&target, &prompt, 30, Some(eos)).unwrap();
    assert_eq!(plain, &free[..=at]);
    for gamma in [3, 5, 8] {
        let cfg = SpecConfig {
            eos: Some(eos),
            ..spec(speculative::sampling(0.0).unwrap(), 30, 0)
        };
        let mut s = Speculator::new(&target, &target, std::slice::from_ref(&prompt), &[gamma], cfg).unwrap();
        s.run().unwrap();
        assert_eq!(
            s.devices[0].generated(),
            plain.as_slice(),
            "γ = {gamma}, EOS {eos} at {at}"
        );
    }
}

/// Prompt lookup: a draft step after a repeated ending proposes what followed it last time. Sampled, the step's
/// distribution is exactly (1 − λ)·q + λ·δ_token with q the model's; greedy, the token replaces the model's top one.
#[test]
fn lookup_mixes_the_looked_up_token_into_the_draft_distribution() {
    use spin_runtime::drafter::{DistForm, Drafter, Lookup, device_rng};
    let drafter = tiny(6, 0.6, 1);
    let t1 = speculative::sampling(1.0).unwrap();
    let greedy = speculative::sampling(0.0).unwrap();
    // "1 7" occurred before, followed by 3; the ending "… 5 1 7" did not, so ngram 3 falls back to the last two.
    let prompt = vec![2u32, 1, 7, 3, 5, 1, 7];
    let lookup = Lookup {
        ngram: 3,
        weight: 0.25,
    };
    let new = |prompt: &[u32], params| {
        Drafter::new(
            &drafter,
            prompt,
            prompt.len(),
            params,
            DistForm::Dense,
            device_rng(4, 0),
        )
        .unwrap()
    };
    let mut plain = new(&prompt, t1);
    plain.draft(1).unwrap();
    let q = plain.last_dists()[0].clone();
    let mut mixed = new(&prompt, t1);
    mixed.set_lookup(Some(lookup)).unwrap();
    let out = mixed.draft(1).unwrap();
    assert_eq!(mixed.looked_up, 1);
    let got = &mixed.last_dists()[0];
    for (i, (&a, &b)) in got.iter().zip(&q).enumerate() {
        let want = 0.75 * b + if i == 3 { 0.25 } else { 0.0 };
        assert!((a - want).abs() < 1e-6, "token {i}: {a} against {want}");
    }
    assert_eq!(out.probs[0], got[out.tokens[0] as usize]);
    // Greedy: the looked-up token, whatever the model's top one.
    let mut g = new(&prompt, greedy);
    g.set_lookup(Some(lookup)).unwrap();
    assert_eq!(g.draft(1).unwrap().tokens, [3]);
    // A huge ngram (a hostile flag) costs what the sequence's length does and proposes the same token.
    let mut huge = new(&prompt, greedy);
    huge.set_lookup(Some(Lookup {
        ngram: usize::MAX,
        weight: 0.25,
    }))
    .unwrap();
    huge.set_lookup_stop(usize::MAX).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(huge.draft(3).unwrap().tokens[0], 3);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // Nothing repeated, nothing looked up.
    let mut none = new(&[1, 2, 3], greedy);
    none.set_lookup(Some(lookup)).unwrap();
    none.draft(1).unwrap();
    assert_eq!(none.looked_up, 0);
    for bad in [
        Lookup {
            ngram: 0,
            weight: 0.5,
        },
        Lookup {
            ngram: 2,
            weight: 0.0,
        },
        Lookup {
            ngram: 2,
            weight: 1.5,
        },
        Lookup {
            ngram: 2,
            weight: f32::NAN,
        },
    ] {
        let e = none.set_lookup(Some(bad)).unwrap_err().to_string();
        assert!(e.contains("lookup."), "{e}");
    }
}

/// A greedy dense draft takes a looked-up token without running the draft model (the model's token would be
/// replaced anyway), and the next step that needs the model feeds every token its cache lacks in one forward:
/// the same tokens and rows as a drafter that started from the committed sequence.
#[test]
fn greedy_looked_up_drafts_skip_the_model_and_catch_up_later() {
    use spin_runtime::drafter::{DistForm, Drafter, Lookup, device_rng};
    let drafter = tiny(6, 0.6, 1);
    let greedy = speculative::sampling(0.0).unwrap();
    let lookup = Some(Lookup {
        ngram: 3,
        weight: 0.5,
    });
    let new = |tokens: &[u32], prompt_len: usize| {
        let mut d = Drafter::new(
            &drafter,
            tokens,
            prompt_len,
            greedy,
            DistForm::Dense,
            device_rng(4, 0),
        )
        .unwrap();
        d.set_lookup(lookup).unwrap();
        d
    };
    let prompt = vec![1u32, 7, 3, 1, 7, 3, 1, 7];
    let mut d = new(&prompt, prompt.len());
    let out = d.draft(3).unwrap();
    assert_eq!(out.tokens, [3, 1, 7]);
    assert_eq!(out.probs, [1.0; 3]);
    assert_eq!(d.looked_up, 3);
    assert_eq!(d.draft_time, std::time::Duration::ZERO, "no draft forward ran");
    for (row, &t) in d.last_dists().iter().zip(&out.tokens) {
        assert_eq!(row.len(), drafter.output_vocab());
        assert!(
            row.iter()
                .enumerate()
                .all(|(i, &p)| p == if i == t as usize { 1.0 } else { 0.0 })
        );
    }
    // Two accepted, then a token never seen before: the lookup has nothing, so the model drafts, after feeding the
    // six tokens its cache lacks.
    d.commit(2, 5).unwrap();
    let lagged = d.draft(2).unwrap();
    assert!(d.draft_time > std::time::Duration::ZERO);
    let mut fresh = new(d.tokens(), prompt.len());
    let want = fresh.draft(2).unwrap();
    assert_eq!(lagged.tokens, want.tokens);
    for (a, b) in d.last_dists().iter().zip(fresh.last_dists()) {
        assert!(a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6));
    }
}

/// Acceptance-gated draft lengths: greedy speculation still equals greedy decoding token for token and sampled
/// speculation still draws the target's distribution (chi-square of the first two tokens), and with a draft that
/// agrees with the target less often than the rule's threshold, rounds draft fewer tokens than the length asked,
/// many of them none (below one drafted token a round).
#[test]
fn acceptance_gated_drafts_stay_exact_and_shorten_poor_drafts() {
    let target = tiny(5, 0.6, 2);
    let drafter = tiny(6, 0.6, 1);
    let greedy = speculative::sampling(0.0).unwrap();
    let t1 = speculative::sampling(1.0).unwrap();
    let prompts = vec![vec![1u32, 7, 3, 1, 7], vec![1, 4, 4, 4], vec![1, 2, 3, 4, 5]];
    let mut per_round = Vec::new();
    for below in [0.0, 0.6] {
        let mut s = Speculator::new(&target, &drafter, &prompts, &[6, 6, 6], spec(greedy, 40, 9)).unwrap();
        s.set_stop_below(below).unwrap();
        s.run().unwrap();
        for (k, d) in s.devices.iter().enumerate() {
            let want = generate_plain(&target, &prompts[k], &greedy, 40, None, 0).unwrap();
            assert_eq!(d.generated(), want.as_slice(), "below {below}, device {k}");
        }
        let drafted: usize = s.devices.iter().map(|d| d.drafted).sum();
        let rounds: usize = s.devices.iter().map(|d| d.rounds).sum();
        let accepted: f64 = s
            .devices
            .iter()
            .map(|d| d.alpha.ratio_estimate(1.96).unwrap().unwrap().value)
            .sum();
        per_round.push((drafted as f64 / rounds as f64, accepted / 3.0));
    }
    // With the lookup too (whose continuations the rule checks after the fact where it cut a draft short).
    let mut s = Speculator::new(&target, &drafter, &prompts, &[6, 6, 6], spec(greedy, 40, 9)).unwrap();
    let lookup = spin_runtime::drafter::Lookup {
        ngram: 3,
        weight: 0.5,
    };
    s.set_lookup(Some(lookup), 0).unwrap();
    s.set_stop_below(0.6).unwrap();
    s.run().unwrap();
    for (k, d) in s.devices.iter().enumerate() {
        let want = generate_plain(&target, &prompts[k], &greedy, 40, None, 0).unwrap();
        assert_eq!(d.generated(), want.as_slice(), "with the lookup, device {k}");
    }
    let ((full, alpha), (gated, _)) = (per_round[0], per_round[1]);
    assert!(alpha < 0.6, "the pair agrees too often for this test: {alpha}");
    assert!(
        full > 5.0 && gated < 0.9,
        "{gated} against {full} drafted a round"
    );
    // Sampled: the first two tokens keep their exact distributions.
    let prompt = vec![1u32, 7, 3, 1, 7];
    let (p1, p2) = exact_first_two(&target, &prompt, &t1);
    let (mut c1, mut c2) = (vec![0u64; 24], vec![0u64; 24]);
    for rep in 0..20u64 {
        let prompts = vec![prompt.clone(); 64];
        let mut s = Speculator::new(&target, &drafter, &prompts, &[3; 64], spec(t1, 2, 700 + rep)).unwrap();
        s.set_stop_below(0.5).unwrap();
        s.run().unwrap();
        for d in &s.devices {
            c1[d.generated()[0] as usize] += 1;
            c2[d.generated()[1] as usize] += 1;
        }
    }
    let (a, b) = (chi_square_p(&c1, &p1), chi_square_p(&c2, &p2));
    assert!(a > 1e-3 && b > 1e-3, "p-values {a}, {b}");
    let mut s = Speculator::new(&target, &drafter, &prompts, &[3, 2, 6], spec(greedy, 4, 9)).unwrap();
    for bad in [1.0, -0.1, f32::NAN] {
        let e = s.set_stop_below(bad).unwrap_err().to_string();
        assert!(e.contains("stop_below"), "{e}");
    }
}

/// With prompt lookup on, with and without lookup-gated draft lengths, greedy speculation still equals greedy
/// decoding token for token, and sampled speculation still draws the target's distribution (chi-square of the
/// first two tokens against their exact distributions), on prompts whose repeats make the lookup fire.
#[test]
fn speculation_with_lookup_stays_exact() {
    use spin_runtime::drafter::Lookup;
    let target = tiny(5, 0.6, 2);
    let drafter = tiny(6, 0.6, 1);
    let lookup = Some(Lookup {
        ngram: 4,
        weight: 0.5,
    });
    let greedy = speculative::sampling(0.0).unwrap();
    let t1 = speculative::sampling(1.0).unwrap();
    let prompts = vec![vec![1u32, 7, 3, 1, 7], vec![1, 4, 4, 4], vec![1, 2, 3, 4, 5]];
    let prompt = vec![1u32, 7, 3, 1, 7];
    let (p1, p2) = exact_first_two(&target, &prompt, &t1);
    let mut full_per_round = None;
    for stop in [0, 2] {
        let mut s = Speculator::new(&target, &drafter, &prompts, &[3, 2, 6], spec(greedy, 40, 9)).unwrap();
        s.set_lookup(lookup, stop).unwrap();
        s.run().unwrap();
        for (k, d) in s.devices.iter().enumerate() {
            let want = generate_plain(&target, &prompts[k], &greedy, 40, None, 0).unwrap();
            assert_eq!(d.generated(), want.as_slice(), "stop {stop}, device {k}");
        }
        assert!(s.looked_up().iter().all(|&n| n > 0), "{:?}", s.looked_up());
        // The gate drafts fewer tokens per round than the full lengths.
        let per_round: f64 = s.devices.iter().map(|d| d.drafted as f64 / d.rounds as f64).sum();
        match full_per_round {
            None => full_per_round = Some(per_round),
            Some(full) => assert!(per_round < 0.9 * full, "stop {stop}: {per_round} against {full}"),
        }
        let (mut c1, mut c2) = (vec![0u64; 24], vec![0u64; 24]);
        let mut looked = 0;
        for rep in 0..20u64 {
            let prompts = vec![prompt.clone(); 64];
            let lens: Vec<usize> = (0..64).map(|k| 1 + k % 3).collect();
            let mut s = Speculator::new(&target, &drafter, &prompts, &lens, spec(t1, 2, 300 + rep)).unwrap();
            s.set_lookup(lookup, stop).unwrap();
            s.run().unwrap();
            looked += s.looked_up().iter().sum::<usize>();
            for d in &s.devices {
                c1[d.generated()[0] as usize] += 1;
                c2[d.generated()[1] as usize] += 1;
            }
        }
        assert!(looked > 1000, "stop {stop}: the lookup fired {looked} times");
        let (a, b) = (chi_square_p(&c1, &p1), chi_square_p(&c2, &p2));
        assert!(a > 1e-3 && b > 1e-3, "stop {stop}: p-values {a}, {b}");
        // The test can fail: the looked-up token (3) is far likelier in a draft than under the target.
        let mut skewed = p1.clone();
        skewed[3] += 0.3;
        let total: f64 = skewed.iter().sum();
        skewed.iter_mut().for_each(|x| *x /= total);
        assert!(chi_square_p(&c1, &skewed) < 1e-6);
    }
    // The gate needs the lookup, and a repeat no longer than it looks up.
    let mut s = Speculator::new(&target, &drafter, &prompts, &[3, 2, 6], spec(greedy, 4, 9)).unwrap();
    assert!(
        s.set_lookup(None, 2)
            .unwrap_err()
            .to_string()
            .contains("lookup.stop")
    );
    assert!(
        s.set_lookup(lookup, 5)
            .unwrap_err()
            .to_string()
            .contains("lookup.stop")
    );
}
