//! The row-interleaved form of the 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and of Q4_K, Q5_K and
//! Q6_K, in which the AVX-512 kernels read their weights: the same bytes as the file's blocks, reordered (and Q8_0's
//! codes offset by 128), so that one 512-bit vector holds four consecutive codes of each of [`ROWS`] rows and one `vpdpbusd`
//! against four broadcast activation codes advances all of them.
//!
//! Rows go in tiles of [`ROWS`] (the last one padded with zero rows); a tile is its blocks in column order; one
//! tile-block (the b-th block of each of the tile's rows) is, at byte offsets:
//!
//! | part | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 |
//! |---|---|---|---|---|---|
//! | scales `d`, f16, row r at 2r | 0 | 0 | 0 | 0 | 0 |
//! | mins `m`, f16, row r at 2r | – | 32 | – | 32 | – |
//! | fifth bits: per group g a u64 whose bit 4r + i is value 4g + i of row r | – | – | 32 | 64 | – |
//! | codes | 32 | 64 | 96 | 128 | 32 |
//!
//! A Q4_K tile-block (one 256-value super-block of each row) holds the scales `d` (f16, row r at 2r), the mins
//! `dmin` (at 32 + 2r), the twelve packed 6-bit sub-block scale and min bytes, byte k of row r at 64 + 16k + r, and
//! from 256 the codes: per pair p of 32-value sub-blocks eight vectors (vector h, lane r = the file's code bytes
//! 32p + 4h .. 32p + 4h + 4 of row r, whose low nibbles are sub-block 2p's values 4h .. 4h + 4 and high nibbles
//! sub-block 2p + 1's). Its sub-block j has scale `d·sc_j` and offset `−dmin·m_j`, and takes the place of a block
//! in the sums below.
//!
//! A Q5_K tile-block is a Q4_K one (its codes the low four bits) followed, from 2304, by the fifth bits: vector h,
//! lane r = the file's `qh` bytes 4h .. 4h + 4 of row r, whose bit j is the fifth bit of value 4h .. 4h + 4 of
//! sub-block j.
//!
//! A Q6_K tile-block holds `d` (f16, row r at 2r), the sixteen int8 sub-block scales (scale k of row r at
//! 32 + 16k + r), from 288 the low-bit bytes (vector (2h + m)·8 + q, lane r = the file's `ql` bytes
//! 64h + 32m + 4q .. + 4 of row r) and from 2336 the high-bit bytes (vector 8h + q, lane r = `qh` bytes
//! 32h + 4q .. + 4). Chunk c = 4h + i of 32 values takes the low (i < 2) or high nibbles of vectors
//! (2h + i mod 2)·8 + q and bits 2i, 2i + 1 of vectors 8h + q as its fifth and sixth bits; its two 16-value
//! sub-blocks have scales `d·sc` and offsets `−32·d·sc`, applied with the activation sums per 16 values.
//!
//! Codes, in 64-byte vectors of 16 lanes, lane r = row r: Q8_0 has eight vectors, vector g holding values
//! 4g .. 4g + 4 of each row as unsigned bytes `q + 128`; the 4-bit formats have four, vector h holding bytes
//! 4h .. 4h + 4 of each row's 16 code bytes, whose low nibbles are values 4h .. 4h + 4 and high nibbles values
//! 16 + 4h .. 16 + 4h + 4 (the file's nibble order). Every value of a product is then
//! `Σ_b f32(Σ_g codes·x + k·Σ x) · (d_w·d_x)`, the sum over blocks in block order with fused multiply-adds,
//! where the offset (−8·d for Q4_0, −16·d for Q5_0, −128·d for Q8_0) joins the exact integer sum as
//! k = −8, −16, −128; Q4_1 and Q5_1 add `Σ_b m·(d_x·Σ x)` in a second sum: the same operations for one activation
//! row or many, on any number of threads.

use super::BlockFormat;
use super::reference;

/// Weight rows per interleaved tile: one 512-bit lane each.
pub(crate) const ROWS: usize = 16;

/// Whether `format` has an interleaved form.
pub(crate) fn supported(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0
            | BlockFormat::Q4K
            | BlockFormat::Q5K
            | BlockFormat::Q6K
    )
}

/// Bytes of one tile-block (ROWS blocks).
pub(crate) fn tile_block_bytes(format: BlockFormat) -> usize {
    ROWS * format.block_bytes()
}

/// Where the codes of a tile-block start.
pub(crate) fn codes_at(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 64,
        BlockFormat::Q5_0 => 96,
        BlockFormat::Q5_1 => 128,
        BlockFormat::Q4K | BlockFormat::Q5K => 256,
        BlockFormat::Q6K => 288,
        _ => 32,
    }
}

/// The byte offset of a block's 4-bit code bytes (or Q8_0's codes) inside the file's block.
fn file_codes_at(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 4,
        BlockFormat::Q5_0 => 6,
        BlockFormat::Q5_1 => 8,
        _ => 2,
    }
}

/// Where a Q5_0 or Q5_1 tile-block's fifth-bit bytes start (after the scales, and Q5_1's mins).
pub(crate) fn fifth_bits_at(format: BlockFormat) -> usize {
    if format == BlockFormat::Q5_1 { 64 } else { 32 }
}

/// The offset of Q4_0, Q5_0 and Q8_0 (−8, −16 and −128 times the block's scale) as a multiple of the
/// activations' `−8 · Σ x` (`Acts::sx`), which joins the block's integer sum that many times (0 for Q4_1 and Q5_1,
/// whose offset is their min).
pub(crate) fn integer_offset(format: BlockFormat) -> i32 {
    match format {
        BlockFormat::Q4_0 => 1,
        BlockFormat::Q5_0 => 2,
        BlockFormat::Q8_0 => 16,
        _ => 0,
    }
}

/// Where a Q5_K tile-block's fifth-bit vectors start (after a Q4_K tile-block's parts).
pub(crate) const Q5K_FIFTH_AT: usize = 2304;

/// Where each byte of row `r`'s block goes in its tile-block: `f(file byte, tile-block byte, xor)` for every byte
/// that moves whole (Q8_0's codes change by 128 on the way, `xor` 0x80); Q5_0's and Q5_1's fifth bits (file bytes
/// 2..6, 4..8) are spread bit by bit instead ([`fifth_bits_to_tile`], [`fifth_bits_from_tile`]).
fn places(format: BlockFormat, r: usize, mut f: impl FnMut(usize, usize, u8)) {
    match format {
        BlockFormat::Q6K => {
            f(208, 2 * r, 0);
            f(209, 2 * r + 1, 0);
            for k in 0..16 {
                f(192 + k, 32 + 16 * k + r, 0);
            }
            for h in 0..2 {
                for q in 0..8 {
                    for i in 0..4 {
                        for m in 0..2 {
                            f(
                                64 * h + 32 * m + 4 * q + i,
                                288 + ((2 * h + m) * 8 + q) * 64 + 4 * r + i,
                                0,
                            );
                        }
                        f(128 + 32 * h + 4 * q + i, 2336 + (8 * h + q) * 64 + 4 * r + i, 0);
                    }
                }
            }
        }
        BlockFormat::Q4K | BlockFormat::Q5K => {
            for j in 0..2 {
                f(j, 2 * r + j, 0);
                f(2 + j, 32 + 2 * r + j, 0);
            }
            for k in 0..12 {
                f(4 + k, 64 + 16 * k + r, 0);
            }
            // Q5_K's fifth bits (file bytes 16..48) sit between the scales and the codes.
            let fc = if format == BlockFormat::Q5K {
                for h in 0..8 {
                    for i in 0..4 {
                        f(16 + 4 * h + i, Q5K_FIFTH_AT + 64 * h + 4 * r + i, 0);
                    }
                }
                48
            } else {
                16
            };
            for p in 0..4 {
                for h in 0..8 {
                    for i in 0..4 {
                        f(fc + 32 * p + 4 * h + i, 256 + 512 * p + 64 * h + 4 * r + i, 0);
                    }
                }
            }
        }
        _ => {
            let (c, fc) = (codes_at(format), file_codes_at(format));
            for j in 0..2 {
                f(j, 2 * r + j, 0);
                if matches!(format, BlockFormat::Q4_1 | BlockFormat::Q5_1) {
                    f(2 + j, 32 + 2 * r + j, 0);
                }
            }
            let (words, flip) = if format == BlockFormat::Q8_0 {
                (8, 0x80)
            } else {
                (4, 0)
            };
            for k in 0..words {
                for i in 0..4 {
                    f(fc + 4 * k + i, c + 64 * k + 4 * r + i, flip);
                }
            }
        }
    }
}

/// What [`places`] does for a Q4_0, Q4_1 or Q8_0 block, four bytes at a time: the scale (and min) bytes, then
/// each word of four codes to its row's place in the tile-block's code vector (tested against `places` through
/// `pack`/`unpack_rows` round trips and the products).
fn place_words(format: BlockFormat, r: usize, block: &[u8], dst: &mut [u8]) {
    let (c, fc) = (codes_at(format), file_codes_at(format));
    dst[2 * r..2 * r + 2].copy_from_slice(&block[..2]);
    if format == BlockFormat::Q4_1 {
        dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&block[2..4]);
    }
    let (words, flip) = if format == BlockFormat::Q8_0 {
        (8, 0x8080_8080u32)
    } else {
        (4, 0)
    };
    for k in 0..words {
        let w = u32::from_ne_bytes(block[fc + 4 * k..fc + 4 * k + 4].try_into().expect("four bytes")) ^ flip;
        dst[c + 64 * k + 4 * r..c + 64 * k + 4 * r + 4].copy_from_slice(&w.to_ne_bytes());
    }
}

/// A Q5_0 or Q5_1 block's fifth bits (`qh`) into lane `r` of a tile-block whose fifth-bit bytes start at `at`
/// ([`fifth_bits_at`]): value 4g + i of row r is bit g of byte 4r + i, the byte that sits beside its code in every
/// group's code vector (so the kernel shifts bit g to bit 4 and ors it in, as Q5_K's).
fn fifth_bits_to_tile(qh: u32, tile_block: &mut [u8], at: usize, r: usize) {
    for g in 0..8 {
        for i in 0..4 {
            tile_block[at + 4 * r + i] |= (((qh >> (4 * g + i)) & 1) as u8) << g;
        }
    }
}

/// The inverse of [`fifth_bits_to_tile`]: lane `r`'s fifth bits as the file's `qh`.
fn fifth_bits_from_tile(tile_block: &[u8], at: usize, r: usize) -> u32 {
    (0..32).fold(0u32, |qh, v| {
        let (g, i) = (v / 4, v % 4);
        qh | u32::from((tile_block[at + 4 * r + i] >> g) & 1) << v
    })
}

/// Bytes of the interleaved form of a (rows × cols) matrix of `format`: whole tiles, the last padded with zero rows.
pub(crate) fn packed_len(format: BlockFormat, rows: usize, cols: usize) -> usize {
    rows.div_ceil(ROWS) * (cols / format.block_elems()) * tile_block_bytes(format)
}

/// The interleaved form of a (rows × cols) matrix of `format` given as the file's row-major blocks.
///
/// # Panics
/// If `format` is not [`supported`] or `data` is not rows × cols of it (the caller checked both).
pub(crate) fn pack(format: BlockFormat, rows: usize, cols: usize, data: &[u8]) -> super::pages::WeightBytes {
    let mut out = super::pages::WeightBytes::zeroed(packed_len(format, rows, cols));
    pack_into(format, rows, cols, data, &mut out);
    out
}

/// [`pack`] into `out`, which holds [`packed_len`] zero bytes (where a model's matrices are gathered, the
/// stretch of the shared buffer that the matrix will occupy).
///
/// # Panics
/// As [`pack`], and if `out` is not [`packed_len`] bytes long.
pub(crate) fn pack_into(format: BlockFormat, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) {
    let be = format.block_elems();
    assert!(supported(format) && cols.is_multiple_of(be));
    let (bb, nb) = (format.block_bytes(), cols / be);
    assert_eq!(data.len(), rows * nb * bb);
    assert_eq!(out.len(), packed_len(format, rows, cols));
    let tb = tile_block_bytes(format);
    for row in 0..rows {
        let (t, r) = (row / ROWS, row % ROWS);
        for b in 0..nb {
            let block = &data[(row * nb + b) * bb..][..bb];
            let dst = &mut out[(t * nb + b) * tb..][..tb];
            if matches!(format, BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q8_0) {
                place_words(format, r, block, dst);
                continue;
            }
            places(format, r, |j, at, flip| dst[at] = block[j] ^ flip);
            if matches!(format, BlockFormat::Q5_0 | BlockFormat::Q5_1) {
                let f = reference::q5_qh_at(format);
                let qh = u32::from_le_bytes([block[f], block[f + 1], block[f + 2], block[f + 3]]);
                fifth_bits_to_tile(qh, dst, fifth_bits_at(format), r);
            }
        }
    }
}

/// The file's bytes of rows `first .. first + count` from the interleaved form (the inverse of [`pack`]).
pub(crate) fn unpack_rows(
    format: BlockFormat,
    cols: usize,
    il: &[u8],
    first: usize,
    count: usize,
) -> Vec<u8> {
    let (bb, nb) = (format.block_bytes(), cols / format.block_elems());
    let tb = tile_block_bytes(format);
    let mut out = vec![0u8; count * nb * bb];
    for (k, row) in (first..first + count).enumerate() {
        let (t, r) = (row / ROWS, row % ROWS);
        for b in 0..nb {
            let src = &il[(t * nb + b) * tb..][..tb];
            let block = &mut out[(k * nb + b) * bb..][..bb];
            places(format, r, |j, at, flip| block[j] = src[at] ^ flip);
            if matches!(format, BlockFormat::Q5_0 | BlockFormat::Q5_1) {
                let f = reference::q5_qh_at(format);
                let qh = fifth_bits_from_tile(src, fifth_bits_at(format), r);
                block[f..f + 4].copy_from_slice(&qh.to_le_bytes());
            }
        }
    }
    out
}

/// Whether every scale (and Q4_1 min) of the interleaved form is finite (padding rows have zero scales).
pub(crate) fn scales_finite(format: BlockFormat, il: &[u8]) -> bool {
    if format == BlockFormat::Q6K {
        return il
            .chunks_exact(tile_block_bytes(format))
            .all(|tb| (0..16).all(|h| reference::half_finite_at(tb, 2 * h)));
    }
    let halves = if matches!(
        format,
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K
    ) {
        32
    } else {
        16
    };
    il.chunks_exact(tile_block_bytes(format))
        .all(|tb| (0..halves).all(|h| reference::half_finite_at(tb, 2 * h)))
}

/// The unsigned codes of group `g` (values 4g .. 4g + 4) of lane `r` of a tile-block.
fn codes(format: BlockFormat, tile_block: &[u8], r: usize, g: usize) -> [u8; 4] {
    let c = codes_at(format);
    if format == BlockFormat::Q8_0 {
        let at = c + 64 * g + 4 * r;
        return [0, 1, 2, 3].map(|i| tile_block[at + i]);
    }
    let at = c + 64 * (g % 4) + 4 * r;
    [0, 1, 2, 3].map(|i| {
        let byte = tile_block[at + i];
        let mut u = if g < 4 { byte & 0x0F } else { byte >> 4 };
        if matches!(format, BlockFormat::Q5_0 | BlockFormat::Q5_1)
            && tile_block[fifth_bits_at(format) + 4 * r + i] >> g & 1 == 1
        {
            u |= 0x10;
        }
        u
    })
}

/// The quantised activation rows a tile is applied to: codes, one scale per 32 values, `scale · Σ codes` per 32.
pub(crate) struct Acts<'a> {
    pub q: &'a [i8],
    /// The codes' scales: one per 32 values, or per 256 for the k-quants ([`BlockFormat::super_scaled`]), whose
    /// products then need neither `xs` nor `xs16`.
    pub d: &'a [f32],
    pub xs: &'a [f32],
    /// `scale · Σ codes` per 16 values (Q6_K's sub-blocks).
    pub xs16: &'a [f32],
    /// Per-32 activations: −8 · Σ codes per 32 values, exactly (the offsets of Q4_0, Q5_0 and Q8_0 join the
    /// integer sums, [`integer_offset`]); activations per super-block ([`BlockFormat::super_scaled`]): Σ codes per
    /// 32 values, exactly (the k-quants' mins meet them in integers).
    pub sx: &'a [i32],
    /// −32 · Σ codes per 16 values, exactly (Q6_K's offset joins its sub-blocks' integer sums; k-quants only).
    pub o16: &'a [i32],
    pub cols: usize,
}

/// The portable product of one tile (`tile`: its `cols/32` tile-blocks) with activation rows `rows`:
/// `out[c · stride + r]` for c < rows.len(); the arithmetic and its order are those of the vector kernel.
pub(crate) fn tile_product(
    format: BlockFormat,
    tile: &[u8],
    a: &Acts,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    if matches!(format, BlockFormat::Q4K | BlockFormat::Q5K) {
        tile_product_k4(format, tile, a, rows, out, stride);
        return;
    }
    if format == BlockFormat::Q6K {
        tile_product_q6k(tile, a, rows, out, stride);
        return;
    }
    let nb = a.cols / 32;
    let tb = tile_block_bytes(format);
    for (c, i) in rows.enumerate() {
        let mut acc = [0f32; ROWS];
        let mut off = [0f32; ROWS];
        for b in 0..nb {
            let block = &tile[b * tb..][..tb];
            let (dx, xs) = (a.d[i * nb + b], a.xs[i * nb + b]);
            let x = &a.q[i * a.cols + 32 * b..][..32];
            for r in 0..ROWS {
                let d = reference::half_at(block, 2 * r);
                let with_min = matches!(format, BlockFormat::Q4_1 | BlockFormat::Q5_1);
                let m = if with_min {
                    reference::half_at(block, 32 + 2 * r)
                } else {
                    0.0
                };
                let mut isum = integer_offset(format) * a.sx[i * nb + b];
                for g in 0..8 {
                    let u = codes(format, block, r, g);
                    for k in 0..4 {
                        isum += i32::from(u[k]) * i32::from(x[4 * g + k]);
                    }
                }
                acc[r] = (isum as f32).mul_add(d * dx, acc[r]);
                if with_min {
                    off[r] = m.mul_add(xs, off[r]);
                }
            }
        }
        for r in 0..ROWS {
            out[c * stride + r] = acc[r] + off[r];
        }
    }
}

/// [`tile_product`] for Q4_K and Q5_K: each 32-value sub-block in the place of a block.
fn tile_product_k4(
    format: BlockFormat,
    tile: &[u8],
    a: &Acts,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    let (nsb, nch) = (a.cols / 256, a.cols / 32);
    let tb = tile_block_bytes(format);
    for (c, i) in rows.enumerate() {
        let mut acc = [0f32; ROWS];
        for b in 0..nsb {
            let block = &tile[b * tb..][..tb];
            let dx = a.d[i * nsb + b];
            for r in 0..ROWS {
                let packed: [u8; 12] = std::array::from_fn(|k| block[64 + 16 * k + r]);
                let d = reference::half_at(block, 2 * r);
                let dmin = reference::half_at(block, 32 + 2 * r);
                // Σ_j sc_j · (codes · x)_j in floats, Σ_j m_j · Σ x_j exactly, then the super-block's scales.
                let (mut t, mut mins) = (0f32, 0i32);
                for j in 0..8 {
                    let (sc, m) = reference::scale_min_k4(j, &packed);
                    let x = &a.q[i * a.cols + 256 * b + 32 * j..][..32];
                    let (p, high) = (j / 2, j % 2 == 1);
                    let mut isum = 0i32;
                    for h in 0..8 {
                        for k in 0..4 {
                            let byte = block[256 + 512 * p + 64 * h + 4 * r + k];
                            let mut u = if high { byte >> 4 } else { byte & 0x0F };
                            if format == BlockFormat::Q5K {
                                u |= ((block[Q5K_FIFTH_AT + 64 * h + 4 * r + k] >> j) & 1) << 4;
                            }
                            isum += i32::from(u) * i32::from(x[4 * h + k]);
                        }
                    }
                    t = if j == 0 {
                        isum as f32 * f32::from(sc)
                    } else {
                        (isum as f32).mul_add(f32::from(sc), t)
                    };
                    mins += i32::from(m) * a.sx[i * nch + 8 * b + j];
                }
                acc[r] = t.mul_add(d * dx, acc[r]);
                acc[r] = (-(mins as f32)).mul_add(dmin * dx, acc[r]);
            }
        }
        for r in 0..ROWS {
            out[c * stride + r] = acc[r];
        }
    }
}

/// The six-bit code of value 4g + k of chunk c (of 32 values) of lane r of a Q6_K tile-block.
fn q6k_code(tile_block: &[u8], r: usize, c: usize, g: usize, k: usize) -> u8 {
    let (h, i) = (c / 4, c % 4);
    let low = tile_block[288 + ((2 * h + i % 2) * 8 + g) * 64 + 4 * r + k];
    let low = if i < 2 { low & 0x0F } else { low >> 4 };
    let high = (tile_block[2336 + (8 * h + g) * 64 + 4 * r + k] >> (2 * i)) & 3;
    low | (high << 4)
}

/// [`tile_product`] for Q6_K: per chunk of 32 values, its two 16-value sub-blocks in order.
fn tile_product_q6k(tile: &[u8], a: &Acts, rows: std::ops::Range<usize>, out: &mut [f32], stride: usize) {
    let (nsb, nch) = (a.cols / 256, a.cols / 32);
    let tb = tile_block_bytes(BlockFormat::Q6K);
    for (c, i) in rows.enumerate() {
        let mut acc = [0f32; ROWS];
        for b in 0..nsb {
            let block = &tile[b * tb..][..tb];
            let dx = a.d[i * nsb + b];
            for r in 0..ROWS {
                // Σ over the 16 sub-blocks of sc · Σ (u − 32)·x in floats (the offset of −32 in the integer sums,
                // as the vector kernel starts its chains), then the super-block's scale.
                let mut t = 0f32;
                for j in 0..8 {
                    let ch = 8 * b + j;
                    let x = &a.q[i * a.cols + 32 * ch..][..32];
                    let o16 = &a.o16[2 * (i * nch + ch)..][..2];
                    let mut isum = [o16[0], o16[1]];
                    for g in 0..8 {
                        for k in 0..4 {
                            let u = q6k_code(block, r, j, g, k);
                            isum[g / 4] += i32::from(u) * i32::from(x[4 * g + k]);
                        }
                    }
                    let sc = [0, 1].map(|half| f32::from(block[32 + 16 * (2 * j + half) + r] as i8));
                    t = if j == 0 {
                        isum[0] as f32 * sc[0]
                    } else {
                        (isum[0] as f32).mul_add(sc[0], t)
                    };
                    t = (isum[1] as f32).mul_add(sc[1], t);
                }
                acc[r] = t.mul_add(reference::half_at(block, 2 * r) * dx, acc[r]);
            }
        }
        for r in 0..ROWS {
            out[c * stride + r] = acc[r];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pack`'s word moves put every byte where `places` says, and `unpack_rows` (which follows `places` byte by
    /// byte) gives the file's bytes back, for row counts that fill tiles and ones that do not.
    #[test]
    fn word_moves_match_the_byte_map_and_unpack_back() {
        for format in [BlockFormat::Q4_0, BlockFormat::Q4_1, BlockFormat::Q8_0] {
            for (rows, cols) in [(16, 64), (7, 32), (33, 96)] {
                let nb = cols / format.block_elems();
                let data: Vec<u8> = (0..rows * nb * format.block_bytes())
                    .map(|i| (i * 131 + 7) as u8)
                    .collect();
                let packed = pack(format, rows, cols, &data);
                let tb = tile_block_bytes(format);
                let mut by_bytes = vec![0u8; rows.div_ceil(ROWS) * nb * tb];
                for row in 0..rows {
                    for b in 0..nb {
                        let block = &data[(row * nb + b) * format.block_bytes()..][..format.block_bytes()];
                        let dst = &mut by_bytes[((row / ROWS) * nb + b) * tb..][..tb];
                        places(format, row % ROWS, |j, at, flip| dst[at] = block[j] ^ flip);
                    }
                }
                assert_eq!(&packed[..], &by_bytes[..], "{format:?} {rows}×{cols}");
                assert_eq!(
                    unpack_rows(format, cols, &packed, 0, rows),
                    data,
                    "{format:?} {rows}×{cols}"
                );
            }
        }
    }
}
