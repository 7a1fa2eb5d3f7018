//! Criterion benchmarks of the unified planner at K = 20 and K = 200 on paper B's drop (payload chosen per device).

use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_optimize::unified::testing::DropRound;
use spin_optimize::unified::{Options, plan_with_stats};
use std::hint::black_box;

fn unified(c: &mut Criterion) {
    let mut group = c.benchmark_group("unified");
    group.sample_size(10);
    for k in [20usize, 200] {
        let round = DropRound {
            devices: k,
            ..DropRound::default()
        }
        .draw(&mut ChaCha8Rng::seed_from_u64(k as u64))
        .expect("valid round");
        let options = Options::default();
        let (plan, stats) = plan_with_stats(&round, &options).expect("plannable");
        eprintln!(
            "unified K = {k}: {:.2} tokens/s, {} evaluations, {} moves, {} distribution senders",
            plan.rate_tokens_per_s,
            stats.evaluations,
            stats.moves,
            plan.sends_distributions.iter().filter(|&&d| d).count()
        );
        group.bench_function(format!("plan/K={k}"), |b| {
            b.iter(|| plan_with_stats(black_box(&round), &options).expect("plannable"))
        });
    }
    group.finish();
}

criterion_group!(benches, unified);
criterion_main!(benches);
