//! The quantised host kernels against candle: every block format dequantised bit for bit as candle does, and the
//! products against candle's dequantise-then-multiply within the error the activation quantisation allows, on
//! odd shapes and with 1- and 2-thread pools (which must agree bit for bit).

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{RngExt, SeedableRng};
use spin_runtime::RuntimeError;
use spin_runtime::quant::{BlockFormat, QMatrix};

const FORMATS: [GgmlDType; 10] = [
    GgmlDType::F32,
    GgmlDType::F16,
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

fn random(rng: &mut impl RngExt, len: usize) -> Vec<f32> {
    (0..len)
        .map(|_| {
            // Mostly small values with a few large ones, as trained weights and activations have.
            let v: f32 = rng.random_range(-1.0..1.0);
            if rng.random_range(0..50) == 0 { v * 8.0 } else { v }
        })
        .collect()
}

/// Random weights quantised by candle, as a QMatrix and as candle's own dequantised f32.
fn weights(rng: &mut impl RngExt, dtype: GgmlDType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
    let w = Tensor::from_vec(random(rng, rows * cols), (rows, cols), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&w, dtype).unwrap();
    let m = QMatrix::from_qtensor("w", &q).unwrap();
    let deq = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    (m, deq)
}

fn block_width(dtype: GgmlDType) -> usize {
    BlockFormat::from_ggml(dtype).unwrap().block_elems().max(32)
}

#[test]
fn dequantize_is_candles_bit_for_bit() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for dtype in FORMATS {
        let cols = 2 * block_width(dtype);
        let (m, deq) = weights(&mut rng, dtype, 3, cols);
        assert_eq!(m.format(), BlockFormat::from_ggml(dtype).unwrap());
        assert_eq!((m.rows(), m.cols()), (3, cols));
        let ours = m.dequantize();
        assert_eq!(ours.len(), deq.len());
        for (k, (a, b)) in ours.iter().zip(&deq).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{dtype:?} element {k}: {a} vs candle {b}"
            );
        }
        let mut row = vec![0f32; cols];
        m.dequantize_row(2, &mut row);
        assert_eq!(row, deq[2 * cols..]);
        assert!(m.scales_finite(), "{dtype:?}");
    }
}

/// x (n × cols) · Wᵀ in f64 with the bound of our error: each activation of block b is quantised with an error of
/// at most max|x_b| / 254 (half a step of max|x_b| / 127), so |y − y_ref| ≤ Σ_b max|x_b|/254 · Σ_{j∈b} |w_j|, plus
/// f32 rounding, below 1e-5 · Σ |w||x| at these widths. The blocks of activations are 32 values, or `act` = 256
/// for the k-quants (one scale per super-block on the interleaved kernel, as ggml's Q8_K; the panels' 32 are
/// within that bound too). f32/f16 weights keep f32 activations: rounding only.
#[allow(clippy::too_many_arguments)]
fn reference(
    w: &[f32],
    x: &[f32],
    n: usize,
    rows: usize,
    cols: usize,
    float: bool,
    act: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; n * rows];
    let mut tol = vec![0f64; n * rows];
    for i in 0..n {
        let xi = &x[i * cols..(i + 1) * cols];
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let mut s = 0f64;
            let mut abs = 0f64;
            let mut quant = 0f64;
            for (wb, xb) in wr.chunks(act).zip(xi.chunks(act)) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                let wabs: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                quant += amax / 254.0 * wabs;
                for (a, b) in wb.iter().zip(xb) {
                    s += *a as f64 * *b as f64;
                    abs += (*a as f64 * *b as f64).abs();
                }
            }
            y[i * rows + r] = s;
            tol[i * rows + r] = if float { 0.0 } else { quant * 1.001 } + 1e-5 * abs + 1e-30;
        }
    }
    (y, tol)
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
}

#[test]
fn matmul_matches_candle_within_the_quantisation_bound_and_threads_agree() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
    let (one, two) = (pool(1), pool(2));
    for dtype in FORMATS {
        let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16);
        let bw = block_width(dtype);
        for (rows, cols) in [(1, bw), (7, bw), (13, 3 * bw)] {
            let (m, w) = weights(&mut rng, dtype, rows, cols);
            for n in [1, 2, 3, 5, 17, 40, 64] {
                let x = random(&mut rng, n * cols);
                let (want, tol) = reference(&w, &x, n, rows, cols, float, bw);
                let mut y1 = vec![0f32; n * rows];
                let mut y2 = vec![f32::NAN; n * rows];
                one.install(|| m.matmul(&x, n, &mut y1));
                two.install(|| m.matmul(&x, n, &mut y2));
                for k in 0..n * rows {
                    let err = (y1[k] as f64 - want[k]).abs();
                    assert!(
                        err <= tol[k],
                        "{dtype:?} {rows}×{cols}, n = {n}, y[{k}] = {} against {} (error {err:e} > {:e})",
                        y1[k],
                        want[k],
                        tol[k]
                    );
                    assert_eq!(
                        y1[k].to_bits(),
                        y2[k].to_bits(),
                        "{dtype:?} n = {n}: 1 and 2 threads differ at {k}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_row_gets_the_same_bits_alone_and_in_any_batch() {
    // What makes plain and speculative greedy decoding agree: an activation row's products do not depend on
    // the other rows of the call.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(6);
    for dtype in FORMATS {
        let cols = 3 * block_width(dtype);
        let (m, _) = weights(&mut rng, dtype, 9, cols);
        // Groups of four rows and a last group of one, two or three (the kernels' row groups).
        for n in [2, 3, 5, 6, 7] {
            let x = random(&mut rng, n * cols);
            let mut all = vec![0f32; n * 9];
            m.matmul(&x, n, &mut all);
            for i in 0..n {
                let mut one = vec![0f32; 9];
                m.matmul(&x[i * cols..(i + 1) * cols], 1, &mut one);
                let same = one
                    .iter()
                    .zip(&all[i * 9..(i + 1) * 9])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype:?}: row {i} alone differs from row {i} of a batch of {n}"
                );
            }
        }
    }
}

#[test]
fn the_head_split_over_many_tiles_gives_the_same_bits_on_any_pool() {
    // Enough rows for several chunks per thread, and a last tile of fewer rows.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let (m, _) = weights(&mut rng, GgmlDType::Q8_0, 203, 64);
    let x = random(&mut rng, 5 * 64);
    let run = |threads| {
        let mut y = vec![0f32; 5 * 203];
        pool(threads).install(|| m.matmul(&x, 5, &mut y));
        y
    };
    let base = run(1);
    for threads in [2, 3] {
        assert!(
            base.iter()
                .zip(run(threads))
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }
}

#[test]
fn whole_tile_matrices_write_straight_into_the_result_with_the_same_bits_on_any_pool() {
    // Row counts that fill tiles of 16 (every SmolLM2 matrix does) take the path that writes into y directly:
    // on one thread for any n, on more threads by splitting the activation rows from 8 rows on, and below that by
    // splitting the tiles, each part writing its columns of every row; 1024 Q8_0 and Q4_0 rows make two runs of
    // tiles for each group of at most eight activation rows, and products large enough to go to the pool at n = 2.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let pools = [pool(1), pool(2), pool(3)];
    let cases = FORMATS
        .iter()
        .map(|&d| (d, 96))
        .chain([(GgmlDType::Q8_0, 1024), (GgmlDType::Q4_0, 1024)]);
    for (dtype, rows) in cases {
        let float = matches!(dtype, GgmlDType::F32 | GgmlDType::F16);
        let (cols, bw) = (256, block_width(dtype));
        let (m, w) = weights(&mut rng, dtype, rows, cols);
        for n in [1, 2, 5, 8, 9, 16, 17, 40] {
            let x = random(&mut rng, n * cols);
            let (want, tol) = reference(&w, &x, n, rows, cols, float, bw);
            let ys: Vec<Vec<f32>> = pools
                .iter()
                .map(|p| {
                    let mut y = vec![f32::NAN; n * rows];
                    p.install(|| m.matmul(&x, n, &mut y));
                    y
                })
                .collect();
            for k in 0..n * rows {
                let err = (ys[0][k] as f64 - want[k]).abs();
                assert!(
                    err <= tol[k],
                    "{dtype:?} {rows} rows, n = {n}, y[{k}]: error {err:e} > {:e}",
                    tol[k]
                );
                for (t, y) in ys.iter().enumerate().skip(1) {
                    assert_eq!(
                        y[k].to_bits(),
                        ys[0][k].to_bits(),
                        "{dtype:?} n = {n}: pool {t} differs at {k}"
                    );
                }
            }
            // The last row alone, as a decoding step computes it, gets the bits it got in the batch.
            let mut last = vec![0f32; rows];
            m.matmul(&x[(n - 1) * cols..], 1, &mut last);
            assert!(
                last.iter()
                    .zip(&ys[0][(n - 1) * rows..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype:?} n = {n}: the last row alone differs from the batch"
            );
        }
    }
}

#[test]
fn stack_concatenates_rows_of_one_format_and_width() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let (a, wa) = weights(&mut rng, GgmlDType::Q4_1, 3, 64);
    let (b, wb) = weights(&mut rng, GgmlDType::Q4_1, 5, 64);
    let s = QMatrix::stack(&[&a, &b]).unwrap();
    assert_eq!((s.rows(), s.cols(), s.format()), (8, 64, BlockFormat::Q4_1));
    assert_eq!(s.dequantize(), [wa, wb].concat());
    let (c, _) = weights(&mut rng, GgmlDType::Q4_0, 3, 64);
    let (d, _) = weights(&mut rng, GgmlDType::Q4_1, 3, 96);
    assert!(QMatrix::stack(&[&a, &c]).is_none(), "formats differ");
    assert!(QMatrix::stack(&[&a, &d]).is_none(), "widths differ");
    assert!(QMatrix::stack(&[]).is_none());
}

#[test]
fn new_rejects_wrong_lengths_and_widths_naming_the_tensor() {
    let bad_len = QMatrix::new(
        "blk.0.attn_q.weight",
        BlockFormat::Q4_0,
        2,
        64,
        vec![0; 4 * 18 - 1],
    )
    .unwrap_err();
    assert!(
        matches!(&bad_len, RuntimeError::Format { what, .. } if what == "blk.0.attn_q.weight"),
        "{bad_len}"
    );
    assert!(bad_len.to_string().contains("71 bytes"), "{bad_len}");
    let bad_cols = QMatrix::new("t", BlockFormat::Q4K, 1, 32, vec![0; 144]).unwrap_err();
    assert!(matches!(bad_cols, RuntimeError::Format { .. }), "{bad_cols}");
    let zero = QMatrix::new("t", BlockFormat::Q8_0, 1, 0, vec![]).unwrap_err();
    assert!(matches!(zero, RuntimeError::Format { .. }), "{zero}");
    assert!(QMatrix::new("t", BlockFormat::Q4_0, 2, 64, vec![0; 4 * 18]).is_ok());
    let huge = QMatrix::new("t", BlockFormat::Q8_0, usize::MAX, 64, vec![]).unwrap_err();
    assert!(huge.to_string().contains("more than fits"), "{huge}");
}

#[test]
fn scales_finite_finds_a_nan_or_infinite_scale_or_min() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    // (format, byte offset of a scale inside a block, block bytes)
    for (dtype, at) in [
        (GgmlDType::Q4_0, 0),
        (GgmlDType::Q4_1, 2),
        (GgmlDType::Q8_0, 0),
        (GgmlDType::Q5_0, 0),
        (GgmlDType::Q5_1, 2),
        (GgmlDType::Q4K, 0),
        (GgmlDType::Q5K, 2),
        (GgmlDType::Q6K, 208),
        (GgmlDType::F16, 0),
        (GgmlDType::F32, 0),
    ] {
        let cols = 2 * block_width(dtype);
        let (m, _) = weights(&mut rng, dtype, 2, cols);
        assert!(m.scales_finite());
        let f = m.format();
        let mut data = m.dequantize_bytes_for_test();
        // Poison the second block of the second row.
        let block = (cols / f.block_elems()) + 1;
        let pos = block * f.block_bytes() + at;
        if f == BlockFormat::F32 {
            data[pos..pos + 4].copy_from_slice(&f32::NAN.to_le_bytes());
        } else {
            data[pos..pos + 2].copy_from_slice(&0x7c00u16.to_le_bytes()); // +∞ in f16
        }
        let bad = QMatrix::new("t", f, 2, cols, data).unwrap();
        assert!(!bad.scales_finite(), "{dtype:?}");
    }
}

trait Bytes {
    fn dequantize_bytes_for_test(&self) -> Vec<u8>;
}

impl Bytes for QMatrix {
    fn dequantize_bytes_for_test(&self) -> Vec<u8> {
        self.data().to_vec()
    }
}

/// The probe of the integer peak with float work beside it runs what it says: eight 512-bit `vpdpbusd` of 64
/// multiply-adds per iteration (3 × 5 summed four at a time into each of 16 lanes: 60 per lane), on AVX-512 VNNI;
/// None on other CPUs.
#[test]
fn peak_probe_with_fmas_counts_its_multiply_adds() {
    let vnni = spin_runtime::quant::instruction_set().starts_with("AVX-512");
    for fmas in 0..=4 {
        match spin_runtime::quant::peak_int8_macs_with_fmas(1000, fmas) {
            Some((macs, check)) => {
                assert!(vnni);
                assert_eq!(macs, 1000 * 8 * 64, "{fmas} FMA");
                if fmas == 0 {
                    assert_eq!(check, 1000 * 8 * 16 * 60);
                }
            }
            None => assert!(!vnni, "{fmas} FMA: no probe on an AVX-512 VNNI CPU"),
        }
    }
}
