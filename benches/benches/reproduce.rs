//! The kernels that set the wall time of `cargo xtask reproduce` (found by profiling it): Algorithm 1's grid and
//! the exact planner on one paper-A instance, Fig. 3's Monte-Carlo rounds, and paper B's SAA evaluator with the
//! greedy and `best` draft searches of one drop. Instances follow scenarios/paper-a.toml and paper-b.toml.

use criterion::{Criterion, criterion_group, criterion_main};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_channel::paper_a::PaperAChannel;
use spin_channel::paper_b::Drop;
use spin_channel::units::{dbm_per_hz_to_w_per_hz, dbm_to_w};
use spin_optimize::paper_a::bandwidth::lemma1_bandwidth;
use spin_optimize::paper_a::exact::exact;
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::simulate::simulate_rounds;
use spin_optimize::paper_a::{self, Plan};
use spin_optimize::paper_b::proactive::{best, greedy};
use spin_optimize::paper_b::reactive::ModeScheme;
use spin_optimize::paper_b::{self, Objective, SaaEvaluator};
use std::hint::black_box;

/// Paper A's channel law (scenarios/paper-a.toml).
const CHANNEL: PaperAChannel = PaperAChannel {
    mean_gain_lo: 0.2,
    mean_gain_hi: 0.5,
    noise_w: 1e-10,
    ul_power_w: 2e-8,
};

/// One paper-A planning instance: K = 20, B = 10 MHz, Llama-2 pair, one fading block; and its mean gains.
fn paper_a_instance() -> (paper_a::ScenarioSpec, Vec<f64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mean_gains = CHANNEL.draw_mean_gains(&mut rng, 20).expect("valid channel");
    let rates = CHANNEL
        .draw_spectral_efficiencies(&mut rng, &mean_gains)
        .expect("valid channel");
    let alphas = [0.8582, 0.7390, 0.7393, 0.7126];
    let spec = paper_a::ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 31_744.0,
        verify_fixed_s: 0.02268,
        verify_per_device_s: 0.01272,
        max_draft_len: 25,
        min_draft_len: 1,
        devices: rates
            .iter()
            .map(|&r| paper_a::DeviceSpec {
                acceptance: alphas[rng.random_range(0..alphas.len())],
                draft_token_s: 0.020 * rng.random_range(0.85..1.15),
                spectral_efficiency: r.max(1e-9),
            })
            .collect(),
    };
    (spec, mean_gains)
}

fn paper_a_kernels(c: &mut Criterion) {
    let (spec, mean_gains) = paper_a_instance();
    let s = paper_a::Scenario::new(&spec).expect("valid scenario");
    let mut group = c.benchmark_group("reproduce_paper_a");
    group.sample_size(20);
    let params = Alg1Params::default();
    group.bench_function("alg1_k20_grid100x100", |b| {
        b.iter(|| paper_alg1(black_box(&s), &params).expect("plan"))
    });
    group.bench_function("exact_k20", |b| b.iter(|| exact(black_box(&s)).expect("plan")));
    // Fig. 3: 100 of its 4000 rounds per draft length (fresh fading, Lemma 1 bandwidth, Bernoulli acceptance).
    group.bench_function("fig3_rounds100_k20_l8", |b| {
        b.iter(|| {
            let mut rng = ChaCha8Rng::seed_from_u64(3);
            simulate_rounds(&mut rng, &spec, &mean_gains, &CHANNEL, 100, |sc| {
                let (_, bw) = lemma1_bandwidth(sc)?;
                Plan::evaluated(sc, vec![8; sc.len()], bw)
            })
            .expect("simulation")
        })
    });
    group.finish();
}

/// One paper-B drop of Fig. 7: K = 20, γ_max = 20, N_SAA = 1000, P_dl = 30 dBm, P_ul = 15 dBm.
fn paper_b_instance() -> paper_b::Scenario {
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let drop = Drop::PAPER_B.sample(&mut rng, 20).expect("valid drop");
    let alphas = [0.85, 0.82, 0.72, 0.75];
    let spec = paper_b::ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 1024.0 * (18.0 + 16.0),
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: 20,
        ul_power_w: dbm_to_w(15.0),
        dl_power_w: 1.0,
        noise_psd_server_w_per_hz: dbm_per_hz_to_w_per_hz(-169.0),
        noise_psd_device_w_per_hz: dbm_per_hz_to_w_per_hz(-167.0),
        saa_samples: 1000,
        seed: 7,
        devices: drop
            .iter()
            .map(|d| paper_b::DeviceSpec {
                acceptance: alphas[rng.random_range(0..alphas.len())],
                draft_token_s: 0.0152 * rng.random_range(1.0..1.15),
                channel_gain: d.channel_gain,
            })
            .collect(),
    };
    paper_b::Scenario::new(spec).expect("valid scenario")
}

fn paper_b_kernels(c: &mut Criterion) {
    let sc = paper_b_instance();
    let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).expect("valid evaluator");
    let mut group = c.benchmark_group("reproduce_paper_b");
    group.sample_size(10);
    group.bench_function("evaluator_k20_n1000", |b| {
        b.iter(|| SaaEvaluator::new(black_box(&sc), ModeScheme::Optimal, Objective::Rate).expect("valid"))
    });
    group.bench_function("greedy_k20_g20_n1000", |b| b.iter(|| greedy(black_box(&ev))));
    group.bench_function("best_k20_g20_n1000", |b| b.iter(|| best(black_box(&ev))));
    group.finish();
}

criterion_group!(benches, paper_a_kernels, paper_b_kernels);
criterion_main!(benches);
