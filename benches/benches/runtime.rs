//! Criterion benchmarks of the real-model runtime: plain decoding throughput of stories260K (target ≥ 250
//! tokens/s on 2 cores) and the cost of verifying K = 16 drafts of length 8 in one padded batch relative to K = 1
//! (target ≤ 4×, paper A eq. 7's T_fix + K·T_lin).
//!
//! Uses `$MULTISPIN_SHARED_DATA/models/stories260K/stories260K.bin` when set, else a random-weight model of the same
//! shape (dim 64, 5 layers, 8 heads, 4 kv heads, vocab 512), so the numbers are comparable either way.

use criterion::{Criterion, Throughput, criterion_group};
use spin_runtime::model::{self, model_from_tensors};
use spin_runtime::{Config, KvCache, Model, RopeStyle};
use std::hint::black_box;
use std::time::Duration;

fn stories() -> Model {
    let device = spin_runtime::select_device().expect("device");
    if let Some(dir) = std::env::var_os("MULTISPIN_SHARED_DATA") {
        let p = std::path::PathBuf::from(dir).join("models/stories260K/stories260K.bin");
        return spin_runtime::llama2c::load_checkpoint(&p, &device).expect("stories260K.bin");
    }
    let cfg = Config {
        vocab_size: 512,
        dim: 64,
        hidden_dim: 172,
        n_layers: 5,
        n_heads: 8,
        n_kv_heads: 4,
        max_seq_len: 512,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        rope: RopeStyle::Interleaved,
        qkv_bias: false,
        tied_embeddings: true,
    };
    model_from_tensors(
        cfg.clone(),
        model::random_tensors(&cfg, 0.1, 1, &device).expect("weights"),
        &device,
    )
    .expect("model")
}

fn decode(c: &mut Criterion) {
    let m = stories();
    const N: usize = 64;
    let mut g = c.benchmark_group("runtime/decode");
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("stories260k_greedy_64_tokens", |b| {
        b.iter(|| {
            let mut cache = m.new_cache();
            let mut t = 1u32;
            for _ in 0..N {
                let l = m.forward(&mut cache, &[t]).expect("forward");
                t = l
                    .get(0)
                    .expect("row")
                    .argmax(0)
                    .expect("argmax")
                    .to_scalar::<u32>()
                    .expect("id");
            }
            black_box(t)
        })
    });
    g.finish();
}

fn verify(c: &mut Criterion) {
    let m = stories();
    let prefix: Vec<u32> = (0..64u32).map(|i| 3 + (i * 7) % 500).collect();
    let mut base = m.new_cache();
    m.forward(&mut base, &prefix).expect("prefill");
    let mut g = c.benchmark_group("runtime/verify_len8");
    for k in [1usize, 4, 16] {
        let drafts: Vec<Vec<u32>> = (0..k)
            .map(|b| (0..9u32).map(|j| 3 + (j * 13 + b as u32) % 500).collect())
            .collect();
        let refs: Vec<&[u32]> = drafts.iter().map(|d| d.as_slice()).collect();
        let mut caches: Vec<KvCache> = vec![base.clone(); k];
        g.bench_function(format!("k{k}"), |b| {
            b.iter(|| {
                for c in caches.iter_mut() {
                    c.truncate(64).expect("truncate");
                }
                let mut r: Vec<&mut KvCache> = caches.iter_mut().collect();
                black_box(m.forward_batch(&mut r, &refs).expect("batch"))
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = decode, verify
}

fn main() {
    // SAFETY: the first statement of main, before criterion or candle start any thread.
    #[allow(unsafe_code)]
    let threads = unsafe { spin_runtime::load::fix_cpu_threads() };
    eprintln!("candle CPU threads: {threads}");
    benches();
    Criterion::default().configure_from_args().final_summary();
}
