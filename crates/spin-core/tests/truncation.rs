//! What truncation to V_eff entries and Q-bit quantisation cost in exactness, measured exactly (no sampling).
//!
//! For one drafted position the distribution of the emitted token is known in closed form:
//! P(t) = min(p, q_d)(t) + β · r(t), with q_d the distribution the device drafted from, β = Σ max(0, q_d − p) the
//! rejection probability and r the residual the correcting side actually samples. Three schemes:
//! - UL exact: the device drafts from the very compressed q̃ it uploads; r = norm(max(0, p − q̃)) → P = p.
//! - UL mismatched: the device drafts from its full q but uploads q̃; r = norm(max(0, p − q̃)).
//! - DL: the server downloads a compressed p̃; the device draws from r = norm(max(0, p̃ − q)).
//!
//! The first test checks this formula against enumeration of the real `judge` + `correct` code at V = 5; the second
//! prints the table in docs/exactness.md (`cargo test -p spin-core --test truncation -- --nocapture`).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_core::correction::{Mode, Payload, correct};
use spin_core::dist::index_bits;
use spin_core::enumerate::enumerate;
use spin_core::{Dist, Draft, Residual, SparseDist, Truncator, Verdict, judge};

/// The compressed distribution as the receiver sees it: truncated to `v_eff`, quantised to `q_bits` (32 = raw f32).
fn compress(w: &[f64], trunc: &mut Truncator, q_bits: u32) -> SparseDist {
    let s = trunc.truncate(Dist::new(w).unwrap()).unwrap();
    if q_bits == 32 {
        s
    } else {
        s.quantise(q_bits).unwrap()
    }
}

fn dense(s: &SparseDist) -> Vec<f64> {
    let mut d = Vec::new();
    s.write_dense(&mut d);
    let total: f64 = d.iter().map(|&x| f64::from(x)).sum();
    d.iter().map(|&x| f64::from(x) / total).collect()
}

/// P(t) of the first emitted token when drafting from `q_d` and correcting from norm(max(0, a − b)).
fn emitted(p: &[f64], q_d: &[f64], a: &[f64], b: &[f64]) -> Vec<f64> {
    let beta: f64 = q_d.iter().zip(p).map(|(q, p)| (q - p).max(0.0)).sum();
    let (ad, bd) = (Dist::new(a).unwrap(), Dist::new(b).unwrap());
    let r = Residual::new(ad, bd).unwrap();
    let fallback = r.mass() <= 0.0;
    (0..p.len())
        .map(|t| p[t].min(q_d[t]) + beta * if fallback { a[t] } else { r.prob(t) })
        .collect()
}

fn tv(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>() / 2.0
}

fn normalised(w: &[f64]) -> Vec<f64> {
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}

/// The closed form above is what the code does: enumerate `judge` + `correct` for DL with a truncated,
/// quantised p at V = 5 and compare the first-token distribution.
#[test]
fn closed_form_matches_enumerated_code() {
    let p = normalised(&[5.0, 1.0, 3.0, 0.0, 7.0]);
    let q = normalised(&[1.0, 4.0, 2.0, 2.0, 3.0]);
    let (pd, qd) = (Dist::new(&p).unwrap(), Dist::new(&q).unwrap());
    for (v_eff, q_bits) in [(2, 32), (3, 3), (4, 2)] {
        let sent = compress(&p, &mut Truncator::new(v_eff).unwrap(), q_bits);
        let paths = enumerate(|e| {
            let y = qd.sample(e);
            let draft = Draft::from_dists(&[y], &[qd]).unwrap();
            match judge(&[pd, pd], &draft, e).unwrap() {
                Verdict::AllAccepted { .. } => y,
                Verdict::Rejected { .. } => {
                    correct(Mode::Downlink, qd, Payload::sparse(&sent), &mut Vec::new(), e)
                        .unwrap()
                        .token
                }
            }
        });
        let mut got = vec![0.0; 5];
        for (t, pr) in paths {
            got[t as usize] += pr;
        }
        let want = emitted(&p, &q, &dense(&sent), &q);
        assert!(
            tv(&got, &want) < 1e-12,
            "V_eff {v_eff}, Q {q_bits}: {got:?} vs {want:?}"
        );
        assert!(
            tv(&got, &p) > 1e-3,
            "the DL approximation should be visible at V_eff {v_eff}"
        );
    }
}

const V: usize = 151_665;

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn softmax(l: &[f64]) -> Vec<f64> {
    let m = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    normalised(&l.iter().map(|x| (x - m).exp()).collect::<Vec<_>>())
}

/// A peaked pair like the benchmark's: Gaussian logits (σ = 2) plus four dominant tokens (about +14), drafter
/// logits = target logits + N(0, 3²) noise.
fn peaked_pair(seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut lp: Vec<f64> = (0..V).map(|_| 2.0 * normal(&mut rng)).collect();
    for _ in 0..4 {
        let i = (rng.next_u64() % V as u64) as usize;
        lp[i] += 14.0 + 2.0 * normal(&mut rng);
    }
    let lq: Vec<f64> = lp.iter().map(|x| x + 3.0 * normal(&mut rng)).collect();
    (softmax(&lp), softmax(&lq))
}

/// A heavy-tailed target, p ∝ rank^−1.2 over a random permutation of the tokens, and a drafter with
/// log q = log p + N(0, 0.8²) noise.
fn zipf_pair(seed: u64) -> (Vec<f64>, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rank: Vec<usize> = (1..=V).collect();
    for i in (1..V).rev() {
        rank.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let lp: Vec<f64> = rank.iter().map(|&r| -1.2 * (r as f64).ln()).collect();
    let lq: Vec<f64> = lp.iter().map(|x| x + 0.8 * normal(&mut rng)).collect();
    (softmax(&lp), softmax(&lq))
}

/// Prints one table (markdown) and checks its invariants.
fn table(name: &str, p: &[f64], q: &[f64]) {
    let alpha: f64 = p.iter().zip(q).map(|(a, b)| a.min(*b)).sum();
    let mut sorted = p.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let tail: f64 = sorted[1024..].iter().sum();
    println!();
    println!("{name}: V = {V}, α = Σ min(p, q) = {alpha:.4}, target mass beyond the top 1024 = {tail:.4}");
    println!();
    println!("| V_eff | Q (bits) | D (bits) | TV UL exact | TV UL mismatched | TV DL |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut last_dl = f64::INFINITY;
    for v_eff in [64, 256, 1024, 4096, 16384] {
        let mut trunc = Truncator::new(v_eff).unwrap();
        for q_bits in [4, 8, 16, 32] {
            let q_sent = dense(&compress(q, &mut trunc, q_bits));
            let p_sent = dense(&compress(p, &mut trunc, q_bits));
            let ul_exact = tv(&emitted(p, &q_sent, p, &q_sent), p);
            let ul_mismatched = tv(&emitted(p, q, p, &q_sent), p);
            let dl = tv(&emitted(p, q, &p_sent, q), p);
            let bits = v_eff as u64 * u64::from(index_bits(V) + q_bits);
            println!("| {v_eff} | {q_bits} | {bits} | {ul_exact:.1e} | {ul_mismatched:.3e} | {dl:.3e} |");
            assert!(
                ul_exact <= 1e-12,
                "UL exact at V_eff {v_eff}, Q {q_bits}: {ul_exact:e}"
            );
            assert!(dl > 0.0 && ul_mismatched > 0.0);
            if q_bits == 32 {
                assert!(dl <= last_dl, "DL TV should not grow with V_eff");
                last_dl = dl;
            }
        }
    }
}

/// One drafted position, TV of the emitted token to the target, exact sums over the vocabulary (Q = 32 means
/// raw `f32` values, no quantisation).
#[test]
fn tv_table_versus_v_eff_and_q() {
    let (p, q) = peaked_pair(2026);
    table("peaked", &p, &q);
    let (p, q) = zipf_pair(2026);
    table("Zipf 1.2", &p, &q);
}
