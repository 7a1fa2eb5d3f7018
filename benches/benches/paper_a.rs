//! Planner speed for paper A: the exact planner against Algorithm 1 (default 100 × 100 grid) at K = 20 and
//! K = 1000 on seeded random scenarios (targets: exact ≤ 1 ms at K = 20, ≤ 100 ms at K = 1000), and the exact
//! planner's worst case: a sweep over thousands of seeded "ordinary" scenarios (issue 13's generator) at
//! K = 10 … 1000 prints max, p99 and median of time and work per K once, then criterion times the worst instance
//! (most work units) found at each K.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::paper_a::exact::{DEFAULT_WORK_BUDGET, exact, exact_with_stats};
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::testing::{ordinary_scenario_with, random_scenario};
use spin_optimize::paper_a::{Optimality, Scenario};
use std::hint::black_box;
use std::time::Instant;

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

/// Device counts of the worst-case sweep and the number of scenarios drawn at each (7,700 in all; fewer at large
/// K, where one plan takes tens of milliseconds).
const SWEEP: [(usize, usize); 7] = [
    (10, 2000),
    (20, 2000),
    (50, 1500),
    (100, 1000),
    (200, 600),
    (500, 400),
    (1000, 200),
];

/// The value at quantile `q` of sorted `v` (nearest rank).
fn quantile<T: Copy>(v: &[T], q: f64) -> T {
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn worst_case(c: &mut Criterion) {
    let mut group = c.benchmark_group("paper_a_exact_worst");
    group.sample_size(10);
    println!(
        "exact planner over seeded ordinary scenarios (L_max = 25, work budget {DEFAULT_WORK_BUDGET} units):"
    );
    println!(
        "{:>5} {:>6} {:>10} {:>10} {:>10} {:>11} {:>11} {:>11} {:>8} {:>9}",
        "K",
        "n",
        "median ms",
        "p99 ms",
        "max ms",
        "median work",
        "p99 work",
        "max work",
        "bounded",
        "max gap"
    );
    for (k, count) in SWEEP {
        let mut rng = ChaCha8Rng::seed_from_u64(0x5eed_0000 + k as u64);
        let mut times = Vec::with_capacity(count);
        let mut works = Vec::with_capacity(count);
        let (mut bounded, mut max_gap) = (0usize, 0.0f64);
        let mut worst: Option<(u64, Scenario)> = None;
        for _ in 0..count {
            let s = ordinary_scenario_with(&mut rng, k, 25);
            let start = Instant::now();
            let (plan, stats) = exact_with_stats(&s).unwrap_or_else(|e| unreachable!("valid scenario: {e}"));
            times.push(start.elapsed().as_secs_f64() * 1e3);
            works.push(stats.work);
            if let Optimality::Bounded { relative_gap, .. } = plan.optimality {
                bounded += 1;
                max_gap = max_gap.max(relative_gap);
            }
            if worst.as_ref().is_none_or(|w| stats.work > w.0) {
                worst = Some((stats.work, s));
            }
        }
        times.sort_by(f64::total_cmp);
        works.sort_unstable();
        println!(
            "{k:>5} {count:>6} {:>10.3} {:>10.3} {:>10.3} {:>11} {:>11} {:>11} {bounded:>8} {max_gap:>9.2e}",
            quantile(&times, 0.5),
            quantile(&times, 0.99),
            quantile(&times, 1.0),
            quantile(&works, 0.5),
            quantile(&works, 0.99),
            quantile(&works, 1.0),
        );
        if let Some((_, s)) = worst {
            group.bench_with_input(BenchmarkId::new("exact-worst", k), &s, |b, s| {
                b.iter(|| exact(black_box(s)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, planners, worst_case);
criterion_main!(benches);
