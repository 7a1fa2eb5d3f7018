//! Criterion benchmarks of paper B's solvers: reactive mode selection (|R| = 20, 1000), greedy draft control, and
//! the networked controller's per-round planning at K = 64 (`paper_b_plan_k64/<part>`: the inputs of the `net`
//! bench's `plan_k64/<scheme>`, split into drawing the samples, the evaluator and each scheme's search).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use spin_channel::paper_b::Drop;
use spin_optimize::paper_b::proactive::{best, comp_only, greedy};
use spin_optimize::paper_b::reactive::{Link, ModeScheme, solve};
use spin_optimize::paper_b::{DeviceSpec, Objective, SaaEvaluator, Samples, Scenario, ScenarioSpec};
use std::hint::black_box;

fn gains(count: usize, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Drop::PAPER_B
        .sample(&mut rng, count)
        .expect("valid drop")
        .into_iter()
        .map(|d| d.channel_gain)
        .collect()
}

fn paper_link() -> Link {
    Link {
        distribution_bits: 34_816.0,
        bandwidth_hz: 1e7,
        ul_power_w: 0.0316,
        dl_power_w: 1.0,
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2.0e-20,
    }
}

fn paper_scenario(k: usize) -> Scenario {
    let g = gains(k, 1);
    let spec = ScenarioSpec {
        bandwidth_hz: 1e7,
        distribution_bits: 34_816.0,
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: 20,
        ul_power_w: 0.0316,
        dl_power_w: 1.0,
        noise_psd_server_w_per_hz: 1.26e-20,
        noise_psd_device_w_per_hz: 2.0e-20,
        saa_samples: 1000,
        seed: 7,
        devices: (0..k)
            .map(|i| DeviceSpec {
                acceptance: [0.85, 0.8, 0.7, 0.72][i % 4],
                draft_token_s: 0.0152 * (1.0 + 0.15 * (i as f64 / k as f64)),
                channel_gain: g[i],
            })
            .collect(),
    };
    Scenario::new(spec).expect("valid scenario")
}

fn reactive(c: &mut Criterion) {
    let link = paper_link();
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for m in [20usize, 1000] {
        let g = gains(m, 2);
        c.bench_function(&format!("paper_b_reactive_optimal_r{m}"), |b| {
            b.iter(|| solve(&link, black_box(&g), ModeScheme::Optimal, &mut rng).expect("solvable"))
        });
    }
}

fn proactive(c: &mut Criterion) {
    let sc = paper_scenario(20);
    let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate).expect("valid evaluator");
    c.bench_function("paper_b_greedy_k20_g20_n1000", |b| {
        b.iter(|| greedy(black_box(&ev)))
    });
    let mut group = c.benchmark_group("paper_b_best");
    group.sample_size(10);
    group.bench_function("k20_g20_n1000", |b| b.iter(|| best(black_box(&ev))));
    group.finish();
    c.bench_function("paper_b_saa_setup_k20_n1000", |b| {
        b.iter(|| SaaEvaluator::new(black_box(&sc), ModeScheme::Optimal, Objective::Rate).expect("valid"))
    });
}

/// The scenario `spin-net`'s controller builds for the `net` bench's `plan_k64` (64 devices, α from 0.5 to 0.9,
/// gains 10⁻¹²·(1 + k), paper B's link at 15/30 dBm, 12 800-bit payloads, γ_max = 8, 200 SAA samples, seed 3).
fn net_scenario() -> Scenario {
    let k = 64;
    let dbm = spin_channel::units::dbm_to_w;
    Scenario::new(ScenarioSpec {
        bandwidth_hz: 10e6,
        distribution_bits: 12_800.0,
        verify_fixed_s: 0.0428,
        verify_per_device_s: 0.0076,
        max_draft_len: 8,
        ul_power_w: dbm(15.0),
        dl_power_w: dbm(30.0),
        noise_psd_server_w_per_hz: dbm(-169.0),
        noise_psd_device_w_per_hz: dbm(-167.0),
        saa_samples: 200,
        seed: 3,
        devices: (0..k)
            .map(|i| DeviceSpec {
                acceptance: 0.5 + 0.4 * (i as f64 / k as f64),
                draft_token_s: 0.015 * (1.0 + 0.15 * (i % 7) as f64 / 7.0),
                channel_gain: 1e-12 * (1 + i) as f64,
            })
            .collect(),
    })
    .expect("valid scenario")
}

fn plan_k64(c: &mut Criterion) {
    let sc = net_scenario();
    let alpha: Vec<f64> = sc.devices.iter().map(|d| d.acceptance).collect();
    let mut group = c.benchmark_group("paper_b_plan_k64");
    group.throughput(Throughput::Elements(64));
    group.bench_function("samples", |b| {
        b.iter(|| Samples::draw(black_box(&alpha), 200, 8, 3))
    });
    let new = || SaaEvaluator::new(black_box(&sc), ModeScheme::Optimal, Objective::Rate).expect("valid");
    group.bench_function("evaluator", |b| b.iter(new));
    group.bench_function("greedy", |b| b.iter(|| greedy(&new())));
    group.bench_function("comp-only", |b| b.iter(|| comp_only(&new())));
    group.bench_function("best", |b| b.iter(|| best(&new())));
    group.finish();
}

criterion_group!(benches, reactive, proactive, plan_k64);
criterion_main!(benches);
