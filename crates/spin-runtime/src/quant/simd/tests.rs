//! Every vector routine of `simd.rs` against its portable twin on random blocks, on each instruction set this CPU
//! has: integer lane sums and unpacked codes exactly, the tile products and f32 dots bit for bit.

use super::super::interleave;
use super::super::reference::{self, RowView};
use super::super::{ActView, BlockFormat, PanelView, TILE};
use super::{Isa, portable};
use rand::{RngExt, SeedableRng};

fn rng(seed: u64) -> rand_chacha::ChaCha8Rng {
    rand_chacha::ChaCha8Rng::seed_from_u64(seed)
}

/// A random finite half (magnitude 2⁻⁹…2⁴, either sign) as its bits.
fn half(r: &mut impl RngExt) -> [u8; 2] {
    let exp: u16 = r.random_range(6..19);
    let man: u16 = r.random_range(0..1024);
    let sign: u16 = r.random_range(0..2);
    ((sign << 15) | (exp << 10) | man).to_le_bytes()
}

/// `blocks` random blocks of `format`: random code bytes, random finite f16 scales.
fn random_row(r: &mut impl RngExt, format: BlockFormat, blocks: usize) -> Vec<u8> {
    let bb = format.block_bytes();
    let mut row: Vec<u8> = (0..blocks * bb).map(|_| r.random()).collect();
    let halves: &[usize] = match format {
        BlockFormat::Q4_0 | BlockFormat::Q8_0 | BlockFormat::Q5_0 => &[0],
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
        BlockFormat::F32 | BlockFormat::F16 => &[],
    };
    for b in 0..blocks {
        for &at in halves {
            row[b * bb + at..b * bb + at + 2].copy_from_slice(&half(r));
        }
    }
    row
}

const QUANT: [BlockFormat; 8] = [
    BlockFormat::Q4_0,
    BlockFormat::Q5_0,
    BlockFormat::Q5_1,
    BlockFormat::Q4_1,
    BlockFormat::Q8_0,
    BlockFormat::Q4K,
    BlockFormat::Q5K,
    BlockFormat::Q6K,
];

struct Unpacked {
    u: Vec<u8>,
    s: Vec<f32>,
    sl: Vec<f32>,
    o: Vec<f32>,
}

fn unpack(isa: Option<Isa>, format: BlockFormat, row: &[u8], cols: usize) -> Unpacked {
    let split = format == BlockFormat::Q6K;
    let mut p = Unpacked {
        u: vec![0xAA; cols],
        s: vec![f32::NAN; cols / 32],
        sl: vec![f32::NAN; if split { cols / 4 } else { 0 }],
        o: vec![f32::NAN; cols / format.group()],
    };
    let view = RowView {
        u: &mut p.u,
        s: &mut p.s,
        sl: &mut p.sl,
        o: &mut p.o,
    };
    match isa {
        Some(isa) => super::unpack_row_with(isa, format, row, view),
        None => reference::unpack_row(format, row, view),
    }
    p
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn unpacking_agrees_with_the_reference_and_with_the_dequantised_values() {
    let mut r = rng(1);
    for format in QUANT {
        // Past eight blocks for the gathered scales of the 32-value formats, with a tail.
        let blocks = if format.block_elems() == 32 { 19 } else { 3 };
        let cols = blocks * format.block_elems();
        let row = random_row(&mut r, format, blocks);
        let want = unpack(None, format, &row, cols);
        // The uniform form reproduces the values (s·u + o) within f32 rounding of the value.
        let mut deq = vec![0f32; cols];
        reference::dequantize_row(format, &row, &mut deq);
        for (e, &v) in deq.iter().enumerate() {
            let s = if format == BlockFormat::Q6K {
                want.sl[e / 4]
            } else {
                want.s[e / 32]
            };
            let o = want.o[e / format.group()];
            let ours = s * f32::from(want.u[e]) + o;
            assert!(
                (ours - v).abs() <= 1e-6 * (v.abs() + o.abs()) + f32::MIN_POSITIVE,
                "{format:?} element {e}: {ours} vs {v}"
            );
        }
        for isa in Isa::available() {
            let got = unpack(Some(isa), format, &row, cols);
            assert_eq!(got.u, want.u, "{format:?} {isa:?} codes");
            assert_eq!(bits(&got.s), bits(&want.s), "{format:?} {isa:?} scales");
            assert_eq!(bits(&got.sl), bits(&want.sl), "{format:?} {isa:?} lane scales");
            assert_eq!(bits(&got.o), bits(&want.o), "{format:?} {isa:?} offsets");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn integer_lane_sums_are_exact_on_every_instruction_set() {
    let mut r = rng(2);
    for max_code in [15u8, 31, 63, 255] {
        for round in 0..200 {
            let u: Vec<u8> = (0..32)
                .map(|_| {
                    if round == 0 {
                        max_code
                    } else {
                        r.random_range(0..=max_code)
                    }
                })
                .collect();
            let q: Vec<i8> = (0..32)
                .map(|_| match round {
                    0 => 127,
                    1 => -127,
                    _ => r.random_range(-127..=127),
                })
                .collect();
            let want = portable::lanes(&u, &q);
            for isa in Isa::available() {
                if isa == Isa::Portable {
                    continue;
                }
                let got = super::x86::lanes_with(isa, &u, &q, max_code > 127);
                assert_eq!(got, want, "{isa:?}, codes ≤ {max_code}");
            }
        }
    }
}

#[test]
fn tile_products_and_dots_are_bit_identical_on_every_instruction_set() {
    let mut r = rng(3);
    for format in QUANT {
        for (blocks, n, live) in [(1, 1, 4), (2, 3, 2), (1, 9, 3), (3, 6, 1), (5, 5, 4)] {
            let cols = blocks * format.block_elems();
            let split = format == BlockFormat::Q6K;
            let ng = cols / format.group();
            let mut u = vec![0u8; TILE * cols];
            let mut s = vec![0f32; TILE * cols / 32];
            let mut sl = vec![0f32; if split { TILE * cols / 4 } else { 0 }];
            let mut o = vec![0f32; TILE * ng];
            for t in 0..TILE {
                let row = random_row(&mut r, format, blocks);
                let view = RowView {
                    u: &mut u[t * cols..(t + 1) * cols],
                    s: &mut s[t * cols / 32..(t + 1) * cols / 32],
                    sl: if split {
                        &mut sl[t * cols / 4..(t + 1) * cols / 4]
                    } else {
                        &mut sl[..0]
                    },
                    o: &mut o[t * ng..(t + 1) * ng],
                };
                reference::unpack_row(format, &row, view);
            }
            let q: Vec<i8> = (0..n * cols).map(|_| r.random_range(-127..=127)).collect();
            let d: Vec<f32> = (0..n * cols / 32).map(|_| r.random_range(0.0..0.1)).collect();
            let xs: Vec<f32> = (0..n * ng).map(|_| r.random_range(-3.0..3.0)).collect();
            let panel = PanelView {
                u: &u,
                s: &s,
                sl: &sl,
                o: &o,
                cols,
                split,
                max_code: match format {
                    BlockFormat::Q8_0 => 255,
                    BlockFormat::Q6K => 63,
                    BlockFormat::Q5K | BlockFormat::Q5_0 => 31,
                    _ => 15,
                },
            };
            let acts = ActView {
                q: &q,
                d: &d,
                xs: &xs,
                n,
                cols,
            };
            let (mut eight, mut paired) = (vec![f32::NAN; live * n], vec![f32::NAN; live * n]);
            portable::quant_tile::<false>(&panel, &acts, live, &mut eight);
            portable::quant_tile::<true>(&panel, &acts, live, &mut paired);
            // The two summation orders agree up to rounding (random scales span 2⁻⁹…2⁴: sums cancel).
            for (e, p) in eight.iter().zip(&paired) {
                assert!(
                    (e - p).abs() <= 1e-3 * e.abs().max(1.0),
                    "{format:?}: lane orders {e} vs {p}"
                );
            }
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; live * n];
                super::quant_tile_with(isa, &panel, &acts, live, &mut got);
                let want = if isa == Isa::Avx512Vnni { &paired } else { &eight };
                assert_eq!(bits(&got), bits(want), "{format:?} {isa:?} blocks {blocks} n {n}");
            }
        }
    }
    for len in [1, 7, 8, 9, 33, 100] {
        let a: Vec<f32> = (0..len).map(|_| r.random_range(-1.0..1.0)).collect();
        let b: Vec<f32> = (0..len).map(|_| r.random_range(-1.0..1.0)).collect();
        let want = portable::dot_f32(&a, &b);
        let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        assert!((f64::from(want) - plain).abs() < 1e-5, "len {len}");
        for isa in Isa::available() {
            assert_eq!(
                super::dot_f32_with(isa, &a, &b).to_bits(),
                want.to_bits(),
                "{isa:?} len {len}"
            );
        }
    }
}

#[test]
fn activation_quantisation_rounds_to_the_nearest_step_and_keeps_zero_blocks_zero() {
    let mut r = rng(4);
    let x: Vec<f32> = (0..32).map(|_| r.random_range(-2.0..2.0)).collect();
    let mut q = [0i8; 32];
    let d = super::quantise_block(&x, &mut q);
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_eq!(d, amax / 127.0);
    assert!(q.iter().any(|&v| v.abs() == 127));
    for (v, c) in x.iter().zip(q) {
        assert!((v - d * f32::from(c)).abs() <= d / 2.0 * 1.0001, "{v} → {c}");
    }
    let d0 = super::quantise_block(&[0.0; 32], &mut q);
    assert_eq!((d0, q), (0.0, [0i8; 32]));
}

#[test]
fn f16_rows_convert_exactly() {
    let mut r = rng(5);
    for len in [1, 8, 13, 64] {
        let mut bytes: Vec<u8> = (0..2 * len).map(|_| r.random()).collect();
        // A subnormal, an infinity and a NaN among the random halves.
        bytes[0..2].copy_from_slice(&0x0001u16.to_le_bytes());
        if len > 2 {
            bytes[2..4].copy_from_slice(&0xfc00u16.to_le_bytes());
            bytes[4..6].copy_from_slice(&0x7e01u16.to_le_bytes());
        }
        let mut got = vec![0f32; len];
        super::f16_row(&bytes, &mut got);
        let want: Vec<f32> = bytes.chunks_exact(2).map(|h| reference::half_at(h, 0)).collect();
        // Exact for every number; a NaN stays a NaN (F16C quietens signalling NaNs, the scalar code keeps them).
        for (g, w) in got.iter().zip(&want) {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "len {len}: {g} vs {w}"
            );
        }
    }
    assert_eq!(reference::f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(reference::f16_to_f32(0x3c00), 1.0);
    assert_eq!(reference::f16_to_f32(0xfbff), -65504.0);
}

#[test]
fn row_quantisation_is_the_same_on_every_instruction_set() {
    let mut r = rng(6);
    let blocks = 5;
    let mut x: Vec<f32> = (0..32 * blocks).map(|_| r.random_range(-3.0..3.0)).collect();
    x[32..64].fill(0.0); // an all-zero block
    x[70] = 1e-30; // tiny values
    let run = |isa: Option<Isa>| {
        let (mut q, mut d) = (vec![0i8; 32 * blocks], vec![0f32; blocks]);
        let (mut xs32, mut xs16) = (vec![0f32; blocks], vec![0f32; 2 * blocks]);
        let mut sx32 = vec![0i32; blocks];
        let out = super::QuantisedRows {
            q: &mut q,
            d: &mut d,
            xs32: &mut xs32,
            sx32: &mut sx32,
            xs16: &mut xs16,
        };
        match isa {
            Some(isa) => super::quantise_rows_with(isa, &x, out),
            None => super::quantise_rows_with(Isa::Portable, &x, out),
        }
        (q, bits(&d), bits(&xs32), bits(&xs16), sx32)
    };
    let want = run(None);
    assert!(want.0[32..64].iter().all(|&c| c == 0));
    let code_sum = |from: usize, len: usize| {
        want.0[from..from + len]
            .iter()
            .map(|&c| i32::from(c))
            .sum::<i32>()
    };
    for (g, &sum) in want.4.iter().enumerate() {
        assert_eq!(sum, -8 * code_sum(32 * g, 32));
    }
    for isa in Isa::available() {
        assert_eq!(run(Some(isa)), want, "{isa:?}");
    }
}

/// The k-quants' activations (one scale per 256 values): every instruction set gives the portable codes, scales
/// and sums; the scale is max|x| / 127 of its super-block and every code is within half a step of x / d.
#[test]
fn super_block_quantisation_is_the_same_on_every_instruction_set() {
    let mut r = rng(16);
    let supers = 3;
    let mut x: Vec<f32> = (0..256 * supers).map(|_| r.random_range(-3.0..3.0)).collect();
    x[256..512].fill(0.0); // an all-zero super-block
    x[600] = 40.0; // an outlier sets its super-block's scale
    let run = |isa: Isa| {
        let (mut q, mut d) = (vec![0i8; 256 * supers], vec![0f32; supers]);
        let (mut sx32, mut o16) = (vec![0i32; 8 * supers], vec![0i32; 16 * supers]);
        super::quantise_super_rows_with(
            isa,
            &x,
            super::SuperRows {
                q: &mut q,
                d: &mut d,
                sx32: &mut sx32,
                o16: &mut o16,
            },
        );
        (q, bits(&d), sx32, o16)
    };
    let want = run(Isa::Portable);
    let (q, d) = (&want.0, f32::from_bits);
    assert_eq!(d(want.1[2]), 40.0 / 127.0);
    assert!(q[256..512].iter().all(|&c| c == 0) && d(want.1[1]) == 0.0);
    for (k, &v) in x.iter().enumerate() {
        let scale = d(want.1[k / 256]);
        if scale > 0.0 {
            assert!((f32::from(q[k]) - v / scale).abs() <= 0.5 + 1e-4, "value {k}");
        }
    }
    let code_sum = |from: usize, len: usize| q[from..from + len].iter().map(|&c| i32::from(c)).sum::<i32>();
    assert!(want.2.iter().enumerate().all(|(g, &s)| s == code_sum(32 * g, 32)));
    assert!(
        want.3
            .iter()
            .enumerate()
            .all(|(h, &s)| s == -32 * code_sum(16 * h, 16))
    );
    for isa in Isa::available() {
        assert_eq!(run(isa), want, "{isa:?}");
    }
}

/// The interleaved form is a reordering of the file's bytes: packing then unpacking any rows gives them back.
#[test]
fn interleaving_gives_back_the_files_bytes() {
    let mut r = rng(21);
    for format in QUANT.into_iter().filter(|&f| interleave::supported(f)) {
        for (rows, blocks) in [(1, 1), (5, 3), (16, 2), (17, 1), (40, 18)] {
            let cols = blocks * format.block_elems();
            let data: Vec<u8> = (0..rows)
                .flat_map(|_| random_row(&mut r, format, blocks))
                .collect();
            let il = interleave::pack(format, rows, cols, &data);
            assert!(interleave::scales_finite(format, &il));
            assert_eq!(il.len() % interleave::tile_block_bytes(format), 0);
            assert_eq!(
                interleave::unpack_rows(format, cols, &il, 0, rows),
                data,
                "{format:?}"
            );
            let rb = blocks * format.block_bytes();
            let (first, count) = (rows / 3, rows - rows / 3);
            assert_eq!(
                interleave::unpack_rows(format, cols, &il, first, count),
                data[first * rb..].to_vec(),
                "{format:?} rows {first}.."
            );
        }
    }
}

/// Each interleaved row's product equals the dot product of its dequantised values with the dequantised
/// activation codes (up to f32 rounding), and the vector kernel gives the portable kernel's bits, for 1 … 9
/// activation rows (five to eight in one group, more in groups of four and the rest).
#[test]
fn interleaved_tiles_are_exact_and_bit_identical_on_every_instruction_set() {
    let mut r = rng(22);
    for format in QUANT.into_iter().filter(|&f| interleave::supported(f)) {
        for (blocks, n) in [
            (1, 1),
            (2, 4),
            (3, 5),
            (18, 9),
            (48, 2),
            (2, 3),
            (3, 6),
            (5, 7),
            (4, 8),
            (2, 12),
            (2, 13),
            (2, 40),
        ] {
            let cols = blocks * format.block_elems();
            let nch = cols / 32;
            let rows: Vec<Vec<u8>> = (0..interleave::ROWS)
                .map(|_| random_row(&mut r, format, blocks))
                .collect();
            let data: Vec<u8> = rows.concat();
            let tile = interleave::pack(format, interleave::ROWS, cols, &data);
            let q: Vec<i8> = (0..n * cols).map(|_| r.random_range(-127..=127)).collect();
            // One activation scale per 32 values, or per 256 for the k-quants (`BlockFormat::super_scaled`).
            let per = if format.super_scaled() { 256 } else { 32 };
            let d: Vec<f32> = (0..n * cols / per).map(|_| r.random_range(0.0..0.1)).collect();
            let dx = |i: usize, k: usize| f64::from(d[(i * cols + k) / per]);
            let xs: Vec<f32> = (0..n * nch)
                .map(|g| d[32 * g / per] * q[32 * g..32 * g + 32].iter().map(|&v| f32::from(v)).sum::<f32>())
                .collect();
            let xs16: Vec<f32> = (0..2 * n * nch)
                .map(|g| d[16 * g / per] * q[16 * g..16 * g + 16].iter().map(|&v| f32::from(v)).sum::<f32>())
                .collect();
            // Σ codes per 32 under super-block scales, −8 times it under per-32 ones (`Acts::sx`).
            let k = if format.super_scaled() { 1 } else { -8 };
            let sx: Vec<i32> = (0..n * nch)
                .map(|g| k * q[32 * g..32 * g + 32].iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect();
            let o16: Vec<i32> = (0..2 * n * nch)
                .map(|g| -32 * q[16 * g..16 * g + 16].iter().map(|&v| i32::from(v)).sum::<i32>())
                .collect();
            let a = interleave::Acts {
                q: &q,
                d: &d,
                xs: &xs,
                xs16: &xs16,
                sx: &sx,
                o16: &o16,
                cols,
            };
            let mut want = vec![f32::NAN; n * interleave::ROWS];
            interleave::tile_product(format, &tile, &a, 0..n, &mut want, interleave::ROWS);
            for (row, bytes) in rows.iter().enumerate() {
                let mut w = vec![0f32; cols];
                reference::dequantize_row(format, bytes, &mut w);
                for i in 0..n {
                    let exact: f64 = (0..cols)
                        .map(|k| f64::from(w[k]) * f64::from(q[i * cols + k]) * dx(i, k))
                        .sum();
                    let scale: f64 = (0..cols)
                        .map(|k| (f64::from(w[k]) * f64::from(q[i * cols + k]) * dx(i, k)).abs())
                        .sum();
                    let got = f64::from(want[i * interleave::ROWS + row]);
                    assert!(
                        (got - exact).abs() <= 1e-5 * scale.max(1e-30),
                        "{format:?} row {row} act {i}: {got} vs {exact}"
                    );
                }
            }
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; n * interleave::ROWS];
                super::il_tile_with(isa, format, &tile, &a, 0..n, &mut got, interleave::ROWS);
                // With a longer stride each row's outputs land where a row of a wider result goes.
                let stride = 3 * interleave::ROWS + 5;
                let mut wide = vec![f32::NAN; (n - 1) * stride + interleave::ROWS];
                super::il_tile_with(isa, format, &tile, &a, 0..n, &mut wide, stride);
                for c in 0..n {
                    assert_eq!(
                        bits(&wide[c * stride..][..interleave::ROWS]),
                        bits(&want[c * interleave::ROWS..][..interleave::ROWS]),
                        "{format:?} {isa:?} n {n}: stride {stride}, row {c}"
                    );
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{format:?} {isa:?} blocks {blocks} n {n}"
                );
                if n > 1 {
                    let mut last = vec![f32::NAN; interleave::ROWS];
                    super::il_tile_with(isa, format, &tile, &a, n - 1..n, &mut last, interleave::ROWS);
                    assert_eq!(
                        bits(&last),
                        bits(&want[(n - 1) * interleave::ROWS..]),
                        "{format:?} one row"
                    );
                }
            }
        }
    }
}

/// The 512-bit attention kernels against plain fused multiply-add chains in the same order (what the eight-lane
/// kernels of `kernels/panels.rs` compute per lane): bit for bit, for every group size, odd and even block counts,
/// and head widths with channels left over past the last multiple of 64 (those the caller does).
#[test]
fn panel_attention_kernels_are_plain_fused_chains() {
    if !super::attention512() {
        eprintln!("skipped: this CPU has no AVX-512 (the kernels return without writing)");
        assert!(!super::panel_scores(
            &[0.0; 1],
            1,
            &[[0.0; 8]],
            1,
            &mut [[0.0; 8]]
        ));
        return;
    }
    let mut r = rng(41);
    for (rows, nb, hd) in [
        (1, 1, 64),
        (2, 3, 64),
        (3, 4, 64),
        (5, 5, 64),
        (6, 16, 64),
        (7, 9, 64),
        (4, 2, 80),
        (6, 7, 128),
        (15, 6, 64),
    ] {
        let mut f = |n: usize| -> Vec<f32> { (0..n).map(|_| r.random_range(-2.0f32..2.0)).collect() };
        let q = f(rows * hd);
        let panels: Vec<[f32; 8]> = f(nb * hd * 8)
            .chunks_exact(8)
            .map(|c| c.try_into().unwrap())
            .collect();
        let mut s = vec![[f32::NAN; 8]; rows * nb];
        assert!(super::panel_scores(&q, hd, &panels, nb, &mut s));
        for row in 0..rows {
            for b in 0..nb {
                for l in 0..8 {
                    let want =
                        (0..hd).fold(0f32, |acc, c| q[row * hd + c].mul_add(panels[b * hd + c][l], acc));
                    assert_eq!(
                        s[row * nb + b][l].to_bits(),
                        want.to_bits(),
                        "scores {rows}×{nb}×{hd}"
                    );
                }
            }
        }
        let most = nb * 8 - 3;
        let w = f(rows * nb * 8);
        let vals = f(nb * 8 * hd);
        let mut out = vec![f32::NAN; rows * hd];
        let sums = super::ValueSums {
            w: &w,
            nb,
            rows,
            vals: &vals[..most * hd],
            ahead: &vals,
            hd,
            most,
        };
        let done = super::panel_values(&sums, &mut out).unwrap();
        assert_eq!(done, hd / 64 * 64);
        for row in 0..rows {
            for c in 0..hd {
                let got = out[row * hd + c];
                if c >= done {
                    assert!(got.is_nan(), "channel {c} past {done} written");
                    continue;
                }
                let want = (0..most).fold(0f32, |acc, p| w[row * nb * 8 + p].mul_add(vals[p * hd + c], acc));
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "values {rows}×{nb}×{hd}, row {row} channel {c}"
                );
            }
        }
    }
}
