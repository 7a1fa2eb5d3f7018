//! Criterion benchmarks of the unified planner at K = 20 and K = 200 on paper B's drop (payload chosen per device),
//! with a worst-case view over several seeded drops at each K (the project reports worst cases, not only medians).

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::round::Round;
use spin_optimize::unified::testing::DropRound;
use spin_optimize::unified::{Options, plan_with_stats};
use std::hint::black_box;
use std::time::Instant;

/// The drops benchmarked per K: the seed K itself (the `plan/K=…` numbers) and three more for the worst case.
const EXTRA_DROPS: [u64; 3] = [1, 2, 3];

fn round(k: usize, seed: u64) -> Round {
    DropRound {
        devices: k,
        ..DropRound::default()
    }
    .draw(&mut ChaCha8Rng::seed_from_u64(seed))
    .expect("valid round")
}

fn unified(c: &mut Criterion) {
    let mut group = c.benchmark_group("unified");
    group.sample_size(10);
    let options = Options::default();
    for k in [20usize, 200] {
        let mut worst = (0.0f64, 0u64);
        for seed in std::iter::once(k as u64).chain(EXTRA_DROPS) {
            let round = round(k, seed);
            let start = Instant::now();
            let (plan, stats) = plan_with_stats(&round, &options).expect("plannable");
            let once_s = start.elapsed().as_secs_f64();
            if once_s > worst.0 {
                worst = (once_s, seed);
            }
            eprintln!(
                "unified K = {k}, drop {seed}: {:.2} tokens/s, {} distribution senders; {} evaluations, {} moves \
                 scored ({} dropped by the bound); one plan {once_s:.3} s",
                plan.rate_tokens_per_s,
                plan.sends_distributions.iter().filter(|&&d| d).count(),
                stats.evaluations,
                stats.moves,
                stats.pruned,
            );
            let id = if seed == k as u64 {
                format!("plan/K={k}")
            } else {
                format!("plan/K={k}/drop={seed}")
            };
            group.bench_function(id, |b| {
                b.iter(|| plan_with_stats(black_box(&round), &options).expect("plannable"))
            });
        }
        eprintln!(
            "unified K = {k}: slowest single plan over {} drops: drop {} at {:.3} s",
            EXTRA_DROPS.len() + 1,
            worst.1,
            worst.0
        );
    }
    group.finish();
}

criterion_group!(benches, unified);
criterion_main!(benches);
