//! The networked system end to end on tiny random-weight models over loopback: greedy text per device equals plain
//! greedy decoding (paper A and paper B exchanges), bits on the air equal spin-core's payload sizes, the virtual
//! clock replays byte for byte, and the fault cases (disconnect and resume, stragglers, hostile frames).

use futures_util::SinkExt;
use spin_net::controller::Scheme;
use spin_net::proto::{self, DeviceMsg, Identity, MAGIC, PROTOCOL_VERSION, ServerMsg};
use spin_net::server::{RoundTrace, ServerConfig};
use spin_net::sim::{SimDevice, simulate};
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::speculative::{generate_plain, sampling};
use spin_runtime::{Config, Model, RopeStyle};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

fn tiny(seed: u64, std: f64, n_layers: usize) -> Model {
    let cfg = Config {
        vocab_size: 24,
        dim: 32,
        hidden_dim: 48,
        n_layers,
        n_heads: 4,
        n_kv_heads: 2,
        max_seq_len: 96,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    let device = spin_runtime::select_device().unwrap();
    model_from_tensors(
        cfg.clone(),
        model::random_tensors(&cfg, std, seed, &device).unwrap(),
        &device,
    )
    .unwrap()
}

fn identity(m: &Model) -> Identity {
    Identity {
        vocab: m.config().vocab_size as u32,
        tokenizer: 7,
        model: 0,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![vec![1, 5, 9], vec![1], vec![1, 7, 7, 7, 3], vec![1, 4]]
}

fn run(
    target: &Arc<Model>,
    drafter: &Arc<Model>,
    cfg: ServerConfig,
    devices: &[SimDevice],
) -> (spin_net::sim::SimOutcome, Vec<RoundTrace>) {
    let rt = runtime();
    let (_tx, rx) = watch::channel(false);
    let mut traces = Vec::new();
    let out = rt
        .block_on(simulate(
            target.clone(),
            drafter.clone(),
            identity(drafter),
            cfg,
            devices,
            rx,
            |t| traces.push(t.clone()),
        ))
        .unwrap();
    (out, traces)
}

fn sim_devices() -> Vec<SimDevice> {
    prompts()
        .into_iter()
        .map(|prompt| SimDevice {
            prompt,
            ..Default::default()
        })
        .collect()
}

#[test]
fn greedy_text_over_the_network_equals_plain_decoding_in_both_exchanges() {
    let target = Arc::new(tiny(1, 0.3, 3));
    let drafter = Arc::new(tiny(2, 0.3, 2));
    let greedy = sampling(0.0).unwrap();
    for scheme in ["exact", "fixed", "best", "greedy"] {
        let mut cfg = ServerConfig::new(Scheme::parse(scheme).unwrap(), identity(&target));
        cfg.max_new_tokens = 20;
        cfg.max_draft_len = 5;
        cfg.saa_samples = 32;
        let (out, traces) = run(&target, &drafter, cfg, &sim_devices());
        for (k, p) in prompts().iter().enumerate() {
            let want = generate_plain(&target, p, &greedy, 20, None, 0).unwrap();
            assert_eq!(
                out.summary.devices[k].generated, want,
                "{scheme}: device {k} (server)"
            );
            let rep = out.devices[k].as_ref().unwrap();
            assert_eq!(rep.generated(), want.as_slice(), "{scheme}: device {k} (device)");
        }
        assert_eq!(out.summary.tokens, 80);
        assert_eq!(traces.iter().map(|t| t.tokens).sum::<u64>(), 80, "{scheme}");
        assert!(out.summary.elapsed_s > 0.0);
    }
}
