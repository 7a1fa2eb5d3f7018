//! Criterion benchmarks of the quantised host kernels (`spin_runtime::quant`): for each block format, a
//! SmolLM2-shaped layer matrix (1536 × 576, the MLP's down projection read as 576 inputs → 1536 outputs, and
//! 576 × 1536) and the 49,152 × 576 output head, at n = 1, 5, 10, 20, 40 and 64 activation rows, reported in GB/s
//! of weight bytes streamed; plus the machine's stream-read bus (what a decoding step is bounded by).
//!
//! Before criterion runs, a summary prints one line per case with the median time, the weight GB/s and the GMAC/s
//! at 1 thread and on the whole pool, against the measured bus: the table of docs/runtime.md. Random weights (random
//! code bytes, small finite scales): no model file is needed. When the SmolLM2-135M GGUF files are in
//! `$MULTISPIN_CACHE` (or `~/.cache/multispin`; `scripts/fetch-smollm2.sh`), the summary also times every matrix of
//! each file once (what one decoding step or one pass multiplies), and says so when they are absent; the numbers of
//! rows it times are 1 and 40, or the comma-separated list in `QUANT_BENCH_POSITIONS` (e.g. `1,2,3,4,5`).

use criterion::{Criterion, Throughput, criterion_group};
use rand::{RngExt, SeedableRng};
use rayon::prelude::*;
use spin_runtime::quant::{BlockFormat, QMatrix};
use std::hint::black_box;
use std::time::{Duration, Instant};

const FORMATS: [BlockFormat; 9] = [
    BlockFormat::Q4_0,
    BlockFormat::Q4_1,
    BlockFormat::Q5_0,
    BlockFormat::Q5_1,
    BlockFormat::Q8_0,
    BlockFormat::Q4K,
    BlockFormat::Q5K,
    BlockFormat::Q6K,
    BlockFormat::F16,
];

/// (rows, cols) of the benchmarked matrices.
const SHAPES: [(usize, usize); 3] = [(1536, 576), (576, 1536), (49_152, 576)];

const ROWS: [usize; 6] = [1, 5, 10, 20, 40, 64];

/// A random matrix of `format`: random code bytes, every f16 scale and min set to small finite values.
fn random_matrix(format: BlockFormat, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let bb = format.block_bytes();
    let blocks = rows * cols / format.block_elems();
    let mut data: Vec<u8> = (0..blocks * bb).map(|_| rng.random()).collect();
    let halves: &[usize] = match format {
        BlockFormat::Q4_0 | BlockFormat::Q8_0 | BlockFormat::Q5_0 | BlockFormat::F16 => &[0],
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
        BlockFormat::F32 => &[],
    };
    for b in 0..blocks {
        for &at in halves {
            // f16 in [2^-8, 2^-7): exponent 7, random mantissa and sign.
            let h: u16 = (u16::from(rng.random::<bool>()) << 15) | (7 << 10) | rng.random_range(0..1024);
            data[b * bb + at..b * bb + at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    QMatrix::new("bench", format, rows, cols, data).expect("consistent sizes")
}

fn activations(n: usize, cols: usize) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    (0..n * cols).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// Median seconds of `f` over enough runs to fill about `budget`.
fn median_secs(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    f();
    let once = start.elapsed().as_secs_f64().max(1e-7);
    let runs = ((budget.as_secs_f64() / once) as usize).clamp(5, 2000);
    let mut t: Vec<f64> = (0..runs)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[runs / 2]
}

/// Nanoseconds this thread has run on a CPU (Linux `schedstat`), if the kernel says: on a shared machine the
/// wall time of a single-threaded call includes the time other processes held the core.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

/// Mean CPU seconds of `f` on this thread over `runs` calls (None where the platform does not tell; the
/// counter is coarse, hence one reading around all the runs).
fn mean_cpu_secs(runs: usize, mut f: impl FnMut()) -> Option<f64> {
    f();
    let s = thread_cpu_ns()?;
    for _ in 0..runs {
        f();
    }
    Some((thread_cpu_ns()? - s) as f64 * 1e-9 / runs as f64)
}

const BUS_BYTES: usize = 256 << 20;

/// Reads `data` once (summing 8 independent u64 lanes so that the loop is bound by memory, not by additions).
fn stream_read(data: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in data.chunks_exact(8) {
        for k in 0..8 {
            acc[k] = acc[k].wrapping_add(c[k]);
        }
    }
    acc.iter().fold(0, |a, b| a.wrapping_add(*b))
}

fn stream_read_par(data: &[u64]) -> u64 {
    data.par_chunks(1 << 16)
        .map(stream_read)
        .reduce(|| 0, u64::wrapping_add)
}

/// `BUS_BYTES` of counting u64s in an anonymous mapping advised for transparent huge pages (as a loaded model's
/// weights are held, `QMatrix::side_by_side`); `None` where the system refuses.
fn huge_pages_data() -> Option<memmap2::MmapMut> {
    let mut m = memmap2::MmapMut::map_anon(BUS_BYTES).ok()?;
    m.advise(memmap2::Advice::HugePage).ok()?;
    for (i, c) in m.chunks_exact_mut(8).enumerate() {
        c.copy_from_slice(&(i as u64).to_le_bytes());
    }
    Some(m)
}

/// The stream-read bus in GB/s: one thread (wall), one thread per CPU second, the whole pool; in 4 KiB pages
/// (a `Vec`) and, where the system gives them, in huge pages.
fn bus() -> [(f64, f64, f64); 2] {
    let measure = |data: &[u64]| {
        let one = median_secs(Duration::from_secs(2), || {
            black_box(stream_read(black_box(data)));
        });
        let all = median_secs(Duration::from_secs(2), || {
            black_box(stream_read_par(black_box(data)));
        });
        let cpu = mean_cpu_secs(5, || {
            black_box(stream_read(black_box(data)));
        });
        (
            BUS_BYTES as f64 / one / 1e9,
            cpu.map_or(f64::NAN, |c| BUS_BYTES as f64 / c / 1e9),
            BUS_BYTES as f64 / all / 1e9,
        )
    };
    let small: Vec<u64> = (0..BUS_BYTES as u64 / 8).collect();
    let four_k = measure(&small);
    drop(small);
    let huge = huge_pages_data().map_or((f64::NAN, f64::NAN, f64::NAN), |m| {
        measure(bytemuck::cast_slice(&m[..]))
    });
    [four_k, huge]
}

fn summary() {
    let threads = rayon::current_num_threads();
    for ((bus1, bus_cpu, bus_all), pages) in bus().into_iter().zip(["4 KiB pages", "huge pages"]) {
        println!(
            "quant summary: stream-read bus in {pages} {bus1:.1} GB/s on 1 thread (wall), {bus_cpu:.1} GB/s per CPU second, {bus_all:.1} GB/s on {threads} threads"
        );
    }
    let iters = 20_000_000;
    let start = Instant::now();
    let (macs, check) = spin_runtime::quant::peak_int8_macs(iters);
    let peak = macs as f64 / start.elapsed().as_secs_f64() / 1e9;
    let c0 = thread_cpu_ns();
    black_box(spin_runtime::quant::peak_int8_macs(iters));
    let peak_cpu = c0
        .zip(thread_cpu_ns())
        .map_or(f64::NAN, |(a, b)| macs as f64 / ((b - a) as f64 * 1e-9) / 1e9);
    println!(
        "quant summary: {}; int8 peak {peak:.0} GMAC/s on 1 thread (wall), {peak_cpu:.0} GMAC/s per CPU second (checksum {check})",
        spin_runtime::quant::instruction_set()
    );
    // The float work beside the integer products: each block of a 16-row tile against one activation row is
    // eight vpdpbusd, then a scale product and an accumulating multiply-add (and a minimum term for Q4_1/Q5_1).
    for fmas in 0..=3 {
        let start = Instant::now();
        if let Some((m, check)) = spin_runtime::quant::peak_int8_macs_with_fmas(iters, fmas) {
            let rate = m as f64 / start.elapsed().as_secs_f64() / 1e9;
            println!(
                "quant summary: int8 peak with {fmas} 512-bit FMA per 8 vpdpbusd: {rate:.0} GMAC/s, {:.2} of the peak (checksum {check})",
                rate / peak
            );
        }
    }
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    println!(
        "quant summary: format rows×cols n | wall ms (1 t) GB/s GMAC/s | cpu ms (1 t) GB/s GMAC/s | wall ms ({threads} t) GB/s GMAC/s"
    );
    let only = std::env::var("QUANT_BENCH_FORMATS").unwrap_or_default();
    for format in FORMATS {
        if !only.is_empty() && !only.split(',').any(|f| f == format!("{format:?}")) {
            continue;
        }
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            if !cols.is_multiple_of(format.block_elems()) {
                continue; // 576 columns are not whole 256-value k-quant blocks (llama.cpp stores those otherwise)
            }
            if std::env::var("QUANT_BENCH_ROWS").is_ok_and(|r| r != rows.to_string()) {
                continue;
            }
            let m = random_matrix(format, rows, cols, s as u64);
            let bytes = m.data().len() as f64;
            for n in ROWS {
                let x = activations(n, cols);
                let mut y = vec![0f32; n * rows];
                let budget = Duration::from_millis(300);
                let t1 = one.install(|| median_secs(budget, || m.matmul(black_box(&x), n, &mut y)));
                let runs = ((0.3 / t1) as usize).clamp(5, 5000);
                let c1 = one.install(|| mean_cpu_secs(runs, || m.matmul(black_box(&x), n, &mut y)));
                let c1 = c1.map_or_else(
                    || "n/a".to_owned(),
                    |c| {
                        format!(
                            "{:.3} {:.1} {:.1}",
                            c * 1e3,
                            bytes / c / 1e9,
                            (n * rows * cols) as f64 / c / 1e9
                        )
                    },
                );
                let tp = median_secs(budget, || m.matmul(black_box(&x), n, &mut y));
                let macs = (n * rows * cols) as f64;
                println!(
                    "quant summary: {format:?} {rows}×{cols} {n} | {:.3} {:.1} {:.1} | {c1} | {:.3} {:.1} {:.1}",
                    t1 * 1e3,
                    bytes / t1 / 1e9,
                    macs / t1 / 1e9,
                    tp * 1e3,
                    bytes / tp / 1e9,
                    macs / tp / 1e9
                );
            }
        }
    }
}

/// Every matrix of each SmolLM2 file in the cache, multiplied once at n = 1 and n = 40 (the output head is the
/// tied `token_embd`): the products of one decoding step and of one 40-position pass.
fn real_models() {
    let Some(dir) = std::env::var_os("MULTISPIN_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/multispin")))
    else {
        return;
    };
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");
    for quant in ["Q4_0", "Q4_1", "Q8_0", "Q4_K_M", "Q5_K_M"] {
        let path = dir.join(format!("SmolLM2-135M-Instruct.{quant}.gguf"));
        let Ok(mut f) = std::fs::File::open(&path) else {
            println!(
                "quant summary: skipping SmolLM2 {quant}: {} is missing (scripts/fetch-smollm2.sh)",
                path.display()
            );
            continue;
        };
        let content = candle_core::quantized::gguf_file::Content::read(&mut f).expect("GGUF header");
        let mut names: Vec<&String> = content.tensor_infos.keys().collect();
        names.sort();
        let (mut mats, mut skipped) = (Vec::new(), Vec::new());
        for name in names {
            let info = &content.tensor_infos[name];
            if info.shape.dims().len() != 2 {
                continue;
            }
            let q = content
                .tensor(&mut f, name, &candle_core::Device::Cpu)
                .expect("tensor");
            match QMatrix::from_qtensor(name, &q) {
                Ok(m) => mats.push(m),
                Err(_) => skipped.push(format!("{name} ({:?})", info.ggml_dtype)),
            }
        }
        // Side by side in one buffer in huge pages, as a loaded model holds them.
        let mats = QMatrix::side_by_side(&mats.iter().collect::<Vec<_>>());
        let huge = mats.iter().all(QMatrix::in_huge_pages);
        let bytes: usize = mats.iter().map(|m| m.data().len()).sum();
        let mut formats: Vec<String> = mats.iter().map(|m| format!("{:?}", m.format())).collect();
        formats.sort();
        formats.dedup();
        let mats = &mats;
        let step = |n: usize| {
            let xs: Vec<Vec<f32>> = mats.iter().map(|m| activations(n, m.cols())).collect();
            let mut ys: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; n * m.rows()]).collect();
            move || {
                for ((m, x), y) in mats.iter().zip(&xs).zip(ys.iter_mut()) {
                    m.matmul(black_box(x), n, y);
                }
            }
        };
        let budget = Duration::from_millis(1500);
        let mut line = format!(
            "quant summary: SmolLM2 {quant}: {} matrices ({}), {:.1} MB{}",
            mats.len(),
            formats.join(", "),
            bytes as f64 / 1e6,
            if huge {
                " in huge pages"
            } else {
                " (huge pages refused)"
            }
        );
        let positions: Vec<usize> = std::env::var("QUANT_BENCH_POSITIONS")
            .ok()
            .map(|v| {
                v.split(',')
                    .map(|n| match n.trim().parse::<usize>() {
                        Ok(n) if n > 0 => n,
                        _ => panic!("QUANT_BENCH_POSITIONS: {n:?} is not a row count ≥ 1 (e.g. 1,2,3,4,5)"),
                    })
                    .collect()
            })
            .unwrap_or_else(|| vec![1, 40]);
        for &n in &positions {
            let mut run = step(n);
            let t1 = one.install(|| median_secs(budget, &mut run));
            let c1 = one.install(|| mean_cpu_secs(((1.0 / t1) as usize).clamp(5, 500), &mut run));
            let tp = median_secs(budget, &mut run);
            line += &format!(
                "; n = {n}: {:.2} ms wall (1 t), {} ms CPU (1 t), {:.2} ms wall ({} t)",
                t1 * 1e3,
                c1.map_or_else(|| "n/a".to_owned(), |c| format!("{:.2}", c * 1e3)),
                tp * 1e3,
                rayon::current_num_threads()
            );
        }
        if !skipped.is_empty() {
            line += &format!("; not supported: {}", skipped.join(", "));
        }
        println!("{line}");
    }
}

fn bench_quant(c: &mut Criterion) {
    if std::env::var_os("QUANT_BENCH_NO_SUMMARY").is_none() {
        real_models();
        summary();
    }
    let mut g = c.benchmark_group("quant");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(700));
    let data: Vec<u64> = (0..BUS_BYTES as u64 / 8).collect();
    g.throughput(Throughput::Bytes(BUS_BYTES as u64));
    g.bench_function("stream_read_1t", |b| {
        b.iter(|| black_box(stream_read(black_box(&data))))
    });
    g.bench_function("stream_read_pool", |b| {
        b.iter(|| black_box(stream_read_par(black_box(&data))))
    });
    drop(data);
    for format in FORMATS {
        for (s, &(rows, cols)) in SHAPES.iter().enumerate() {
            if !cols.is_multiple_of(format.block_elems()) {
                continue; // 576 columns are not whole 256-value k-quant blocks (llama.cpp stores those otherwise)
            }
            let m = random_matrix(format, rows, cols, s as u64);
            g.throughput(Throughput::Bytes(m.data().len() as u64));
            for n in ROWS {
                let x = activations(n, cols);
                let mut y = vec![0f32; n * rows];
                g.bench_function(format!("{format:?}_{rows}x{cols}_n{n}"), |b| {
                    b.iter(|| m.matmul(black_box(&x), n, &mut y))
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench_quant);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
