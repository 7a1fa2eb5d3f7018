//! Criterion benchmarks of spin-core's hot paths at V = 151,665 (the speed targets): one verification step
//! with residual sampling, top-1024 truncation, and a K = 20 × L = 8 padded batch at realistic acceptance.
//!
//! Throughput is reported as bytes of probability rows read, next to a plain streaming read of the batch buffer
//! (`core/memory_read`), which stands for the machine's attainable memory bandwidth.

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_core::{
    Dist, DraftRef, PaddedTargets, ProbRows, Truncator, sample_residual, verify_batch, verify_batch_parallel,
};
use std::hint::black_box;
use std::time::Duration;

/// Qwen-family vocabulary size (docs/model.md §1).
const V: usize = 151_665;
const K: usize = 20;
const L: usize = 8;
/// Distinct (p, q) pairs; batch rows are copies of these, so every row is its own memory.
const POOL: usize = 8;

fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let u2 = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn softmax(logits: &[f64]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| (x / s) as f32).collect()
}

/// An LLM-like target p (Gaussian logits plus a few dominant tokens) and a drafter q whose logits are p's plus
/// Gaussian noise of standard deviation `noise`; noise 1.0 gives α = Σ min(p, q) ≈ 0.8.
fn pair(rng: &mut ChaCha8Rng, noise: f64) -> (Vec<f32>, Vec<f32>) {
    let mut lp: Vec<f64> = (0..V).map(|_| 2.0 * normal(rng)).collect();
    for _ in 0..4 {
        let i = (rng.next_u64() % V as u64) as usize;
        lp[i] += 14.0 + 2.0 * normal(rng);
    }
    let lq: Vec<f64> = lp.iter().map(|x| x + noise * normal(rng)).collect();
    (softmax(&lp), softmax(&lq))
}

fn alpha(p: &[f32], q: &[f32]) -> f64 {
    p.iter()
        .zip(q)
        .map(|(&x, &y)| f64::from(x).min(f64::from(y)))
        .sum()
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
}

fn single(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (p, q) = pair(&mut rng, 1.0);
    let row_bytes = (V * 4) as u64;
    let mut g = c.benchmark_group("core");

    g.throughput(Throughput::Bytes(row_bytes));
    g.bench_function("dist_new", |b| {
        b.iter(|| Dist::new(black_box(&p)).map(|d| d.total()))
    });

    // One rejected position: validate p and q, then draw from norm(max(0, p − q)).
    g.throughput(Throughput::Bytes(2 * row_bytes));
    g.bench_function("verify_step_residual", |b| {
        b.iter(|| {
            let (pd, qd) = (Dist::new(black_box(&p))?, Dist::new(black_box(&q))?);
            sample_residual(pd, qd, &mut rng)
        })
    });
    let (pd, qd) = (Dist::new(&p).expect("valid p"), Dist::new(&q).expect("valid q"));
    g.bench_function("sample_residual", |b| {
        b.iter(|| sample_residual(black_box(pd), black_box(qd), &mut rng))
    });

    g.throughput(Throughput::Bytes(row_bytes));
    g.bench_function("sample_dense", |b| b.iter(|| black_box(pd).sample(&mut rng)));
    let mut truncator = Truncator::new(1024).expect("valid V_eff");
    g.bench_function("truncate_top1024", |b| {
        b.iter(|| truncator.truncate(black_box(pd)).map(|s| s.kept()))
    });
    g.finish();
}

fn batch(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let pool: Vec<(Vec<f32>, Vec<f32>)> = (0..POOL).map(|_| pair(&mut rng, 1.0)).collect();
    let mean_alpha = pool.iter().map(|(p, q)| alpha(p, q)).sum::<f64>() / POOL as f64;
    eprintln!("core/batch: mean α of the pool = {mean_alpha:.3}");
    let positions = L + 1;
    let mut data = vec![0.0f32; K * positions * V];
    let mut q_rows: Vec<Vec<f32>> = Vec::with_capacity(K * L);
    let mut tokens = vec![vec![0u32; L]; K];
    for k in 0..K {
        for j in 0..positions {
            let (p, q) = &pool[(k * positions + j) % POOL];
            data[(k * positions + j) * V..][..V].copy_from_slice(p);
            if j < L {
                tokens[k][j] = Dist::new(q).expect("valid q").sample(&mut rng);
                q_rows.push(q.clone());
            }
        }
    }
    let targets = PaddedTargets::new(&data, K, positions, V).expect("valid shape");
    let q_dists: Vec<Dist> = q_rows.iter().map(|r| Dist::new(r).expect("valid q")).collect();
    let drafts: Vec<DraftRef> = (0..K)
        .map(|k| DraftRef {
            tokens: &tokens[k],
            dists: &q_dists[k * L..(k + 1) * L],
        })
        .collect();

    // Bytes of probability one call reads, on average over seeds: p rows up to the rejection (or the bonus row),
    // plus the q row at each rejection.
    let runs = 50;
    // With pre-validated rows only the rows of the residual (p and q) or the bonus (p) are read in full.
    let (mut rows, mut full_rows) = (0usize, 0usize);
    for _ in 0..runs {
        for o in verify_batch(&targets, &drafts, &mut rng).expect("valid batch") {
            rows += o.accepted + 1 + usize::from(o.needs_exchange());
            full_rows += 1 + usize::from(o.needs_exchange());
        }
    }
    let full_bytes = (full_rows * V * 4 / runs) as u64;
    let bytes = (rows * V * 4 / runs) as u64;
    eprintln!(
        "core/batch: {:.1} rows of V read per call on average",
        rows as f64 / runs as f64
    );

    let mut g = c.benchmark_group("core");
    g.throughput(Throughput::Bytes(bytes));
    g.bench_function("batch_k20_l8", |b| {
        b.iter_batched(
            || ChaCha8Rng::seed_from_u64(rng.next_u64()),
            |mut r| verify_batch(black_box(&targets), black_box(&drafts), &mut r),
            BatchSize::SmallInput,
        )
    });
    // Rows validated when produced (`ProbRows`): a target row is read in full only for a residual or bonus draw.
    let prob_rows = ProbRows::from_probs(data.clone(), V).expect("valid rows");
    let prevalidated = PaddedTargets::from_rows(&prob_rows, K, positions).expect("valid shape");
    g.throughput(Throughput::Bytes(full_bytes));
    g.bench_function("batch_k20_l8_prevalidated", |b| {
        b.iter_batched(
            || ChaCha8Rng::seed_from_u64(rng.next_u64()),
            |mut r| verify_batch(black_box(&prevalidated), black_box(&drafts), &mut r),
            BatchSize::SmallInput,
        )
    });
    g.throughput(Throughput::Bytes(bytes));
    // The same batch on every available core (2 on the reference machine), per-device generators.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    g.bench_function("batch_k20_l8_parallel", |b| {
        b.iter_batched(
            || ChaCha8Rng::seed_from_u64(rng.next_u64()),
            |mut r| verify_batch_parallel(black_box(&targets), black_box(&drafts), &mut r, threads),
            BatchSize::SmallInput,
        )
    });
    // The attainable streaming read: an f64 sum of the whole 109 MB buffer (larger than any cache).
    g.throughput(Throughput::Bytes((data.len() * 4) as u64));
    g.bench_function("memory_read", |b| {
        b.iter(|| {
            let mut acc = [0.0f64; 8];
            for c in black_box(&data).chunks_exact(8) {
                for j in 0..8 {
                    acc[j] += f64::from(c[j]);
                }
            }
            acc.iter().sum::<f64>()
        })
    });
    g.finish();
}

criterion_group! { name = benches; config = config(); targets = single, batch }
criterion_main!(benches);
