//! Seeded Monte Carlo at V = 1000: the real samplers (driven by ChaCha8) against their target distributions with
//! Pearson's chi-square test (statrs). Each test has a negative control that the same test must reject.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_core::{Dist, DraftRef, PaddedTargets, Residual, sample_residual, verify, verify_batch};
use statrs::distribution::{ChiSquared, ContinuousCDF};

const V: usize = 1000;

/// LLM-like weights: softmax of Gaussian logits with a few dominant tokens; about 5 % of tokens masked to zero.
fn llm_like(rng: &mut ChaCha8Rng) -> Vec<f64> {
    (0..V)
        .map(|i| {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let g = -(-(u.max(1e-300)).ln()).ln(); // Gumbel(0, 1)
            if rng.next_u32().is_multiple_of(20) {
                0.0
            } else {
                (1.5 * g + if i % 97 == 0 { 4.0 } else { 0.0 }).exp()
            }
        })
        .collect()
}

fn normalised(w: &[f64]) -> Vec<f64> {
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}

/// The p-value of Pearson's statistic; bins with expected count below 5 are pooled into one bin, and a draw of a
/// token of probability zero gives 0.
fn chi_square_p(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut bins) = (0.0, 0usize);
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (&o, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if p == 0.0 && o > 0 {
            return 0.0; // a token the hypothesis forbids: reject outright
        }
        if e < 5.0 {
            pooled_o += o as f64;
            pooled_e += e;
        } else {
            stat += (o as f64 - e).powi(2) / e;
            bins += 1;
        }
    }
    if pooled_e > 0.0 {
        stat += (pooled_o - pooled_e).powi(2) / pooled_e;
        bins += 1;
    }
    ChiSquared::new((bins - 1) as f64).unwrap().sf(stat)
}

/// A target/drafter pair with α = Σ min(p, q) well inside (0, 1).
fn pair(seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let p = llm_like(&mut rng);
    let q: Vec<f64> = p
        .iter()
        .zip(llm_like(&mut rng))
        .map(|(&a, b)| {
            if rng.next_u32().is_multiple_of(50) {
                0.0
            } else {
                0.4 * a + 0.6 * b
            }
        })
        .collect();
    (p, q)
}

#[test]
fn dense_sampling_matches_p() {
    let (p, q) = pair(1);
    let d = Dist::new(&p).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let mut counts = vec![0u64; V];
    for _ in 0..100_000 {
        counts[d.sample(&mut rng) as usize] += 1;
    }
    let pv = chi_square_p(&counts, &normalised(&p));
    assert!(pv > 1e-3, "p-value {pv}");
    // Negative control: the same counts are not distributed as q.
    assert!(chi_square_p(&counts, &normalised(&q)) < 1e-9);
}

#[test]
fn residual_sampling_matches_the_residual() {
    let (p, q) = pair(2);
    let (pd, qd) = (Dist::new(&p).unwrap(), Dist::new(&q).unwrap());
    let r = Residual::new(pd, qd).unwrap();
    assert!(r.mass() > 0.05 && r.mass() < 0.95, "mass {}", r.mass());
    let probs: Vec<f64> = (0..V).map(|i| r.prob(i)).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut counts = vec![0u64; V];
    for _ in 0..100_000 {
        counts[sample_residual(pd, qd, &mut rng).unwrap() as usize] += 1;
    }
    let pv = chi_square_p(&counts, &probs);
    assert!(pv > 1e-3, "p-value {pv}");
    assert!(chi_square_p(&counts, &normalised(&p)) < 1e-9);
}

/// The first emitted token of a round with L = 3 (draft, accept/reject, residual or later tokens) is distributed
/// as p_1; q differs per position, p_2..p_4 are other targets.
#[test]
fn first_emitted_token_matches_target() {
    let pairs: Vec<(Vec<f64>, Vec<f64>)> = (0..4).map(|s| pair(20 + s)).collect();
    let p: Vec<Dist<f64>> = pairs.iter().map(|(p, _)| Dist::new(p).unwrap()).collect();
    let q: Vec<Dist<f64>> = pairs[..3].iter().map(|(_, q)| Dist::new(q).unwrap()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let mut counts = vec![0u64; V];
    let mut naive = vec![0u64; V];
    for _ in 0..40_000 {
        let tokens: Vec<u32> = q.iter().map(|d| d.sample(&mut rng)).collect();
        let out = verify(&p, &tokens, &q, &mut rng).unwrap();
        let first = if out.accepted > 0 { tokens[0] } else { out.token };
        counts[first as usize] += 1;
        naive[tokens[0] as usize] += 1;
    }
    let target = normalised(&pairs[0].0);
    let pv = chi_square_p(&counts, &target);
    assert!(pv > 1e-3, "p-value {pv}");
    // Negative control: the unverified draft is far from p.
    assert!(chi_square_p(&naive, &target) < 1e-9);
}

/// Batched: four devices with different drafts and lengths 0..=3 from one padded f32 buffer; each device's first
/// emitted token follows its own p_1.
#[test]
fn batched_first_tokens_match_targets() {
    const K: usize = 4;
    const P: usize = 4;
    let pairs: Vec<(Vec<f64>, Vec<f64>)> = (0..K * P).map(|s| pair(40 + s as u64)).collect();
    let mut data = vec![0.0f32; K * P * V];
    for (r, (p, _)) in pairs.iter().enumerate() {
        for (d, &x) in data[r * V..(r + 1) * V].iter_mut().zip(p) {
            *d = x as f32;
        }
    }
    let targets = PaddedTargets::new(&data, K, P, V).unwrap();
    let q: Vec<Dist<f64>> = pairs.iter().map(|(_, q)| Dist::new(q).unwrap()).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut counts = vec![vec![0u64; V]; K];
    let mut tokens = vec![Vec::new(); K];
    for _ in 0..15_000 {
        for (k, t) in tokens.iter_mut().enumerate() {
            t.clear();
            t.extend((0..k).map(|j| q[k * P + j].sample(&mut rng)));
        }
        let drafts: Vec<DraftRef<f64>> = (0..K)
            .map(|k| DraftRef {
                tokens: &tokens[k],
                dists: &q[k * P..k * P + k],
            })
            .collect();
        for (k, out) in verify_batch(&targets, &drafts, &mut rng)
            .unwrap()
            .iter()
            .enumerate()
        {
            let first = if out.accepted > 0 { tokens[k][0] } else { out.token };
            counts[k][first as usize] += 1;
        }
    }
    for (k, c) in counts.iter().enumerate() {
        // The reference is the f32 row the batch holds, renormalised in f64.
        let row: Vec<f64> = data[k * P * V..][..V].iter().map(|&x| f64::from(x)).collect();
        let pv = chi_square_p(c, &normalised(&row));
        assert!(pv > 1e-3, "device {k}: p-value {pv}");
    }
    assert!(chi_square_p(&counts[1], &normalised(&pairs[P].1)) < 1e-9);
}
