//! Criterion benchmarks of the networked system (issue: server overhead ≤ 20 µs per device per round at K = 64,
//! model compute excluded; and how many virtual-clock rounds per second `simulate` sustains with 64 tiny devices).
//!
//! `net/protocol_k64`: the server's per-round work on the wire for 64 devices (encode 64 plans, decode and
//! validate 64 paper-A drafts of γ = 4 with packed distributions at V = 512, V_eff = 512, Q = 16, air times, the
//! reactive mode choice for 16 rejected devices, encode 64 verdicts); `net/protocol_pairs_k64` the same for paper B's
//! exchange (pairs up, 8 DL and 8 UL corrections of one distribution each). `net/plan_k64/<scheme>`: the controller's
//! planning for 64 devices (`unified`: the networked server's fast configuration). Both report elements = devices, so criterion's time per element is per device.
//! `net/virtual_rounds_k64`: whole `simulate` runs (server + 64 devices over loopback, tiny random models).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use spin_core::{Dist, SparseDist};
use spin_net::controller::{ControllerConfig, DeviceView, Scheme, VerifyModel, plan_round};
use spin_net::link::{LinkConfig, air_time_s};
use spin_net::proto::{self, DeviceMsg, Identity, Next, ServerMsg};
use spin_net::server::ServerConfig;
use spin_net::sim::{SimDevice, simulate};
use spin_optimize::paper_b::{ModeScheme, reactive};
use spin_runtime::Model;
use spin_runtime::model;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

const K: usize = 64;
const V: usize = 512;

/// A random distribution over all V tokens, kept whole and quantised to Q = 16: what a paper-A draft or a correction
/// carries in these benchmarks.
fn random_dist(rng: &mut ChaCha8Rng) -> SparseDist {
    let w: Vec<f32> = (0..V).map(|_| rng.random::<f32>() + 1e-3).collect();
    SparseDist::truncate(Dist::new(&w).unwrap(), V)
        .unwrap()
        .quantise(16)
        .unwrap()
}

fn draft_bodies(rng: &mut ChaCha8Rng) -> Vec<Vec<u8>> {
    (0..K)
        .map(|_| {
            let dists: Vec<SparseDist> = (0..4).map(|_| random_dist(rng)).collect();
            let tokens: Vec<u32> = dists.iter().map(|d| d.indices()[0]).collect();
            proto::encode(&DeviceMsg::Draft {
                round: 7,
                tokens,
                probs: vec![0.5; 4],
                dists: dists.iter().map(|d| proto::pack(d).unwrap()).collect(),
                draft_s: 0.01,
            })
            .unwrap()
        })
        .collect()
}

/// Encodes the K plans of a round (every device told L = 4 and its share); the bytes written.
fn plan_bytes(sends_distributions: bool) -> usize {
    (0..K)
        .map(|_| {
            let plan = ServerMsg::Plan {
                round: 7,
                draft_len: 4,
                uplink_share_hz: 1e5,
                sends_distributions,
            };
            proto::encode(&plan).unwrap().len()
        })
        .sum()
}

/// Encodes the K verdicts of a round (every device told: two accepted, commit a token); the bytes written.
fn verdict_bytes() -> usize {
    (0..K)
        .map(|_| {
            let v = ServerMsg::Verdict {
                round: 7,
                accepted: 2,
                next: Next::Commit {
                    token: 5,
                    done: false,
                },
            };
            proto::encode(&v).unwrap().len()
        })
        .sum()
}

fn protocol(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let bodies = draft_bodies(&mut rng);
    let link = LinkConfig::paper_b();
    let gains: Vec<f64> = (0..K).map(|k| 1e-12 * (1 + k) as f64).collect();
    let mut g = c.benchmark_group("net");
    g.throughput(Throughput::Elements(K as u64));
    g.bench_function("protocol_k64", |b| {
        b.iter(|| {
            let mut bytes = plan_bytes(true);
            let mut bits = 0u64;
            for (k, body) in bodies.iter().enumerate() {
                let DeviceMsg::Draft { tokens, dists, .. } = proto::decode::<DeviceMsg>(body).unwrap() else {
                    unreachable!()
                };
                let mut device_bits = 0u64;
                for (d, &t) in dists.iter().zip(&tokens) {
                    let d = proto::unpack(d, V as u32).unwrap();
                    // The server's check that each drafted token has mass in its own distribution.
                    assert!(spin_net::server::has_mass(&d, t));
                    device_bits += d.bits_on_air();
                }
                bits += device_bits;
                let r = link.spectral_efficiency(gains[k]).unwrap();
                black_box(air_time_s(device_bits as f64, 1e5, r));
            }
            let rejected = &gains[..16];
            let sol = reactive::solve(
                &link.paper_b_link(12_800.0),
                rejected,
                ModeScheme::Optimal,
                &mut ChaCha8Rng::seed_from_u64(0),
            )
            .unwrap();
            bytes += verdict_bytes();
            black_box((bytes, bits, sol))
        })
    });
    // Paper B's exchange (the `best`, `greedy`, `uniform`, `comp-only` schemes, and `unified`'s pair-senders): 64
    // drafts of γ = 4 (token, probability) pairs, 16 rejections with the reactive mode choice, 8 downloads of a
    // packed p_r and 8 uploads of a q_r to unpack, 64 commits.
    let pair_bodies: Vec<Vec<u8>> = (0..K)
        .map(|k| {
            proto::encode(&DeviceMsg::Draft {
                round: 7,
                tokens: vec![k as u32 % V as u32, 3, 9, 27],
                probs: vec![0.5, 0.25, 0.125, 0.9],
                dists: vec![],
                draft_s: 0.01,
            })
            .unwrap()
        })
        .collect();
    let corr: Vec<SparseDist> = (0..16).map(|_| random_dist(&mut rng)).collect();
    let uploads: Vec<Vec<u8>> = corr[8..]
        .iter()
        .map(|q| {
            proto::encode(&DeviceMsg::Upload {
                round: 7,
                q: proto::pack(q).unwrap(),
            })
            .unwrap()
        })
        .collect();
    g.bench_function("protocol_pairs_k64", |b| {
        b.iter(|| {
            let mut bytes = plan_bytes(false);
            let mut bits = 0u64;
            for (k, body) in pair_bodies.iter().enumerate() {
                let DeviceMsg::Draft { tokens, probs, .. } = proto::decode::<DeviceMsg>(body).unwrap() else {
                    unreachable!()
                };
                // The server's checks of a pair draft.
                assert!(tokens.iter().all(|&t| t < V as u32) && probs.iter().all(|&p| p > 0.0 && p <= 1.0));
                let device_bits = tokens.len() as u64 * (9 + 32);
                bits += device_bits;
                let r = link.spectral_efficiency(gains[k]).unwrap();
                black_box(air_time_s(device_bits as f64, 1e5, r));
            }
            let sol = reactive::solve(
                &link.paper_b_link(12_800.0),
                &gains[..16],
                ModeScheme::Optimal,
                &mut ChaCha8Rng::seed_from_u64(0),
            )
            .unwrap();
            for p in &corr[..8] {
                let v = ServerMsg::Verdict {
                    round: 7,
                    accepted: 1,
                    next: Next::Residual {
                        p: proto::pack(p).unwrap(),
                    },
                };
                bytes += proto::encode(&v).unwrap().len();
            }
            for body in &uploads {
                let DeviceMsg::Upload { q, .. } = proto::decode::<DeviceMsg>(body).unwrap() else {
                    unreachable!()
                };
                bits += proto::unpack(&q, V as u32).unwrap().bits_on_air();
            }
            bytes += verdict_bytes();
            black_box((bytes, bits, sol))
        })
    });
    let views: Vec<DeviceView> = (0..K)
        .map(|k| DeviceView {
            acceptance: 0.5 + 0.4 * (k as f64 / K as f64),
            draft_token_s: 0.015 * (1.0 + 0.15 * (k % 7) as f64 / 7.0),
            gain: gains[k],
            max_draft_len: 100,
        })
        .collect();
    // Fewer samples for the planners: `best` and `unified` take milliseconds to seconds per round at K = 64.
    g.sample_size(10);
    for scheme in [
        "fixed",
        "uni-bw",
        "homo",
        "paper-alg1",
        "exact",
        "uniform",
        "greedy",
        "comp-only",
        "best",
        "unified",
    ] {
        let cfg = ControllerConfig {
            scheme: Scheme::parse_per_round(scheme).unwrap(),
            modes: ModeScheme::Optimal,
            max_draft_len: 8,
            fixed_draft_len: 4,
            distribution_bits: 12_800.0,
            pair_bits: 41.0,
            saa_samples: 200,
            plan_deadline: None,
        };
        g.bench_function(format!("plan_k64/{scheme}"), |b| {
            b.iter(|| {
                black_box(plan_round(&cfg, &link, &views, &VerifyModel::affine(0.0428, 0.0076), 3).unwrap())
            })
        });
        if scheme == "unified" {
            g.bench_function("plan_k8/unified", |b| {
                b.iter(|| {
                    black_box(
                        plan_round(&cfg, &link, &views[..8], &VerifyModel::affine(0.0428, 0.0076), 3)
                            .unwrap(),
                    )
                })
            });
        }
    }
    g.finish();
}

fn tiny(seed: u64, n_layers: usize) -> Model {
    let device = spin_runtime::select_device().unwrap();
    model::tiny_random_model(seed, 0.3, n_layers, &device).unwrap()
}

fn virtual_rounds(c: &mut Criterion) {
    let target = Arc::new(tiny(1, 2));
    let drafter = Arc::new(tiny(2, 1));
    let identity = Identity {
        vocab: 24,
        tokenizer: 0,
        model: 0,
    };
    let devices: Vec<SimDevice> = (0..K)
        .map(|k| SimDevice {
            prompt: vec![1, (k % 23) as u32],
            ..Default::default()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rounds = 8u64;
    let mut g = c.benchmark_group("net");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(rounds));
    g.bench_function("virtual_rounds_k64", |b| {
        b.iter(|| {
            let mut cfg = ServerConfig::new(Scheme::parse_per_round("fixed").unwrap(), identity);
            cfg.max_rounds = Some(rounds);
            cfg.max_new_tokens = 60;
            let (_tx, rx) = tokio::sync::watch::channel(false);
            let out = rt
                .block_on(simulate(
                    target.clone(),
                    drafter.clone(),
                    identity,
                    cfg,
                    &devices,
                    rx,
                    |_| {},
                ))
                .unwrap();
            assert_eq!(out.summary.rounds, rounds);
            black_box(out.summary.tokens)
        })
    });
    g.finish();
}

criterion_group!(benches, protocol, virtual_rounds);
criterion_main!(benches);
