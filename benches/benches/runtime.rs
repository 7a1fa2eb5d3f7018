//! Criterion benchmarks of the real-model runtime: plain decoding throughput of stories260K, one decode step of
//! the target and of the default distilled draft (target: the draft's step ≤ 20 % of the target's), the host
//! path against the candle route, one host pass of 1–9 positions (what verifying a draft costs in steps), the
//! cost of verifying K = 16 drafts of length 8 in one padded batch relative to K = 1 (paper A eq. 7's
//! T_fix + K·T_lin), and, when the file is there, verification of a memory-bound target (SmolLM2-135M Q4_1
//! dequantised to f32, fetched by scripts/fetch-smollm2.sh) at K = 1 and 8, draft length 4.
//!
//! The stories260K target and the draft are the models committed under models/ (`spin_runtime::embedded`).

use criterion::{Criterion, Throughput, criterion_group};
use spin_runtime::{KvCache, Model};
use std::hint::black_box;
use std::time::Duration;

fn stories() -> Model {
    let device = spin_runtime::select_device().expect("device");
    spin_runtime::embedded::target(&device).expect("embedded stories260K")
}

/// One greedy decode step after `prefix` positions (the cache is cut back to them every time), through
/// `forward_logits`: what a drafter or plain decoding pays per token.
fn step_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    m: &Model,
) {
    let prefix: Vec<u32> = (0..64u32).map(|i| 3 + (i * 7) % 500).collect();
    let mut cache = m.new_cache();
    m.forward(&mut cache, &prefix).expect("prefill");
    let vocab = m.config().vocab_size;
    let mut t = 5u32;
    g.bench_function(name, |b| {
        b.iter(|| {
            cache.truncate(64).expect("truncate");
            let l = m.forward_logits(&mut cache, &[t]).expect("step");
            t = spin_runtime::decode::argmax(&l[l.len() - vocab..]).expect("argmax");
            black_box(t)
        })
    });
}

fn step(c: &mut Criterion) {
    let device = spin_runtime::select_device().expect("device");
    let target = stories();
    let draft = spin_runtime::embedded::draft(&device).expect("embedded draft");
    let mut candle = target.clone();
    candle.set_host_path(false);
    let mut g = c.benchmark_group("runtime/step");
    step_bench(&mut g, "target_stories260k", &target);
    step_bench(&mut g, "draft_2x32", &draft);
    step_bench(&mut g, "target_stories260k_candle_route", &candle);
    g.finish();
}

/// One pass of n new positions of one sequence after 64 (a verification of a draft of length n − 1 by the
/// stories260K target, on the host path): against n = 1 it says what verifying L + 1 positions costs in
/// single steps, the quantity that decides whether speculation can pay (docs/runtime.md).
fn host_positions(c: &mut Criterion) {
    let m = stories();
    let prefix: Vec<u32> = (0..64u32).map(|i| 3 + (i * 7) % 500).collect();
    let mut cache = m.new_cache();
    m.forward(&mut cache, &prefix).expect("prefill");
    let mut g = c.benchmark_group("runtime/target_positions");
    for n in [1usize, 2, 3, 5, 9] {
        let input: Vec<u32> = (0..n as u32).map(|j| 3 + (j * 13) % 500).collect();
        g.bench_function(format!("n{n}"), |b| {
            b.iter(|| {
                cache.truncate(64).expect("truncate");
                black_box(m.forward_logits(&mut cache, &input).expect("pass").len())
            })
        });
    }
    g.finish();
}

/// SmolLM2-135M-Instruct Q4_1 from `$MULTISPIN_CACHE` or `~/.cache/multispin`, dequantised; `None` (with a
/// message) when the file is not there.
fn smollm2() -> Option<Model> {
    let dir = std::env::var_os("MULTISPIN_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/multispin")))?;
    let p = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if !p.is_file() {
        eprintln!(
            "skipping the SmolLM2 benchmark: {} is missing (scripts/fetch-smollm2.sh)",
            p.display()
        );
        return None;
    }
    let device = spin_runtime::select_device().expect("device");
    let m = spin_runtime::load_model(&p, &device).expect("SmolLM2 GGUF");
    Some(m.dequantize().expect("dequantize"))
}

fn verify_memory_bound(c: &mut Criterion) {
    let Some(m) = smollm2() else { return };
    let prefix: Vec<u32> = (0..64u32).map(|i| 3 + (i * 7) % 40000).collect();
    let mut base = m.new_cache();
    m.forward(&mut base, &prefix).expect("prefill");
    let mut g = c.benchmark_group("runtime/smollm2_f32_verify_len4");
    g.sample_size(10);
    for k in [1usize, 8] {
        let drafts: Vec<Vec<u32>> = (0..k)
            .map(|b| (0..5u32).map(|j| 3 + (j * 13 + b as u32) % 40000).collect())
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
    targets = decode, step, host_positions, verify, verify_memory_bound
}

fn main() {
    // SAFETY: the first statement of main, before criterion or candle start any thread.
    #[allow(unsafe_code)]
    let threads = unsafe { spin_runtime::load::fix_cpu_threads() };
    eprintln!("candle CPU threads: {threads}");
    benches();
    Criterion::default().configure_from_args().final_summary();
}
