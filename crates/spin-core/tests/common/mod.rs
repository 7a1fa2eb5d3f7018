//! Shared fixtures for the exactness tests: small context-dependent "models" and total-variation helpers.
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// A toy autoregressive model: the next-token weights depend on the whole prefix through a seeded generator.
/// About one entry in four is zero, so supports of p and q differ.
#[derive(Clone, Copy)]
pub struct Toy {
    pub vocab: usize,
    pub seed: u64,
}

impl Toy {
    pub fn weights(&self, prefix: &[u32]) -> Vec<f64> {
        let mut h = self.seed ^ 0x9e37_79b9_7f4a_7c15;
        for &t in prefix {
            h = (h ^ u64::from(t) ^ 0x5bd1_e995)
                .wrapping_mul(0x1000_0000_01b3)
                .rotate_left(17);
        }
        h = h.wrapping_add(prefix.len() as u64);
        let mut rng = ChaCha8Rng::seed_from_u64(h);
        let mut w: Vec<f64> = (0..self.vocab)
            .map(|_| {
                if rng.next_u32() % 4 == 0 {
                    0.0
                } else {
                    (rng.next_u32() % 1000 + 1) as f64
                }
            })
            .collect();
        if w.iter().all(|&x| x == 0.0) {
            w[(h % self.vocab as u64) as usize] = 1.0;
        }
        w
    }

    /// Normalised probabilities of the next token.
    pub fn probs(&self, prefix: &[u32]) -> Vec<f64> {
        let w = self.weights(prefix);
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    }

    /// P(the next `n` tokens are `seq`) under direct autoregressive sampling.
    pub fn sequence_prob(&self, prefix: &[u32], seq: &[u32]) -> f64 {
        let mut ctx = prefix.to_vec();
        let mut prob = 1.0;
        for &t in seq {
            prob *= self.probs(&ctx)[t as usize];
            ctx.push(t);
        }
        prob
    }
}

/// Total-variation distance between an enumerated distribution over sequences and direct sampling from `target`.
pub fn tv_to_target(paths: &[(Vec<u32>, f64)], target: &Toy, prefix: &[u32], len: usize) -> f64 {
    let mut merged: HashMap<Vec<u32>, f64> = HashMap::new();
    let mut mass = 0.0;
    for (s, p) in paths {
        assert_eq!(s.len(), len, "path emitted {} tokens, expected {len}", s.len());
        *merged.entry(s.clone()).or_default() += p;
        mass += p;
    }
    assert!((mass - 1.0).abs() < 1e-12, "enumerated mass {mass}");
    let mut tv = 0.0;
    let mut seq = vec![0u32; len];
    let total = target.vocab.pow(len as u32);
    for code in 0..total {
        let mut c = code;
        for t in seq.iter_mut() {
            *t = (c % target.vocab) as u32;
            c /= target.vocab;
        }
        let want = target.sequence_prob(prefix, &seq);
        let got = merged.get(&seq).copied().unwrap_or(0.0);
        tv += (want - got).abs();
    }
    tv / 2.0
}
