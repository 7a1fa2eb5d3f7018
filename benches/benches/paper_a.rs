//! Planner speed for paper A: the exact planner against Algorithm 1 (default 100 × 100 grid) at K = 20 and
//! K = 1000 on seeded random scenarios (targets: exact ≤ 1 ms at K = 20, ≤ 100 ms at K = 1000).

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a::exact::exact;
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::testing::random_scenario;
use std::hint::black_box;

fn planners(c: &mut Criterion) {
    let mut group = c.benchmark_group("paper_a");
    group.sample_size(10);
    for k in [20usize, 1000] {
        let s = random_scenario(&mut ChaCha8Rng::seed_from_u64(k as u64), k, 25);
        group.bench_with_input(BenchmarkId::new("exact", k), &s, |b, s| {
            b.iter(|| exact(black_box(s)))
        });
        let params = Alg1Params::default();
        group.bench_with_input(BenchmarkId::new("paper-alg1", k), &s, |b, s| {
            b.iter(|| paper_alg1(black_box(s), &params))
        });
    }
    group.finish();
}

criterion_group!(benches, planners);
criterion_main!(benches);
