//! The row-interleaved form of the 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0), in which the AVX-512 kernels
//! read their weights: the same bytes as the file's blocks, reordered (and Q8_0's codes offset by 128), so that one
//! 512-bit vector holds four consecutive codes of each of [`ROWS`] rows and one `vpdpbusd` against four broadcast
//! activation codes advances all of them.
//!
//! Rows go in tiles of [`ROWS`] (the last one padded with zero rows); a tile is its blocks in column order; one
//! tile-block (the b-th block of each of the tile's rows) is, at byte offsets:
//!
//! | part | Q4_0 | Q4_1 | Q5_0 | Q8_0 |
//! |---|---|---|---|---|
//! | scales `d`, f16, row r at 2r | 0 | 0 | 0 | 0 |
//! | mins `m`, f16, row r at 2r | – | 32 | – | – |
//! | fifth bits: per group g a u64 whose bit 4r + i is value 4g + i of row r | – | – | 32 | – |
//! | codes | 32 | 64 | 96 | 32 |
//!
//! Codes, in 64-byte vectors of 16 lanes, lane r = row r: Q8_0 has eight vectors, vector g holding values
//! 4g .. 4g + 4 of each row as unsigned bytes `q + 128`; the 4-bit formats have four, vector h holding bytes
//! 4h .. 4h + 4 of each row's 16 code bytes, whose low nibbles are values 4h .. 4h + 4 and high nibbles values
//! 16 + 4h .. 16 + 4h + 4 (the file's nibble order). Every value of a product is then
//! `Σ_b (f32(Σ_g codes·x) · (d_w·d_x)) + Σ_b o·(d_x·Σ x)`, each sum in block order with fused multiply-adds, and
//! the offset `o` = −8·d (Q4_0), m (Q4_1), −16·d (Q5_0), −128·d (Q8_0): the same operations for one activation row
//! or many, on any number of threads.

use super::BlockFormat;
use super::reference;

/// Weight rows per interleaved tile: one 512-bit lane each.
pub(crate) const ROWS: usize = 16;

/// Whether `format` has an interleaved form.
pub(crate) fn supported(format: BlockFormat) -> bool {
    matches!(
        format,
        BlockFormat::Q4_0 | BlockFormat::Q4_1 | BlockFormat::Q5_0 | BlockFormat::Q8_0
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
        _ => 32,
    }
}

/// The byte offset of a block's 4-bit code bytes (or Q8_0's codes) inside the file's block.
fn file_codes_at(format: BlockFormat) -> usize {
    match format {
        BlockFormat::Q4_1 => 4,
        BlockFormat::Q5_0 => 6,
        _ => 2,
    }
}

/// The offset `o` of a block from its scale and min (see the module docs), in f32 as the kernels compute it.
pub(crate) fn offset(format: BlockFormat, d: f32, m: f32) -> f32 {
    match format {
        BlockFormat::Q4_0 => -8.0 * d,
        BlockFormat::Q4_1 => m,
        BlockFormat::Q5_0 => -16.0 * d,
        _ => -128.0 * d,
    }
}

/// Copies between one file block (`block`) and its row's places in a tile-block (`tile_block`, lane `r`), in
/// the direction `to_tile`; Q8_0's codes change by 128 on the way.
fn copy_block(format: BlockFormat, block: &mut [u8], tile_block: &mut [u8], r: usize, to_tile: bool) {
    let c = codes_at(format);
    let fc = file_codes_at(format);
    let mut pair = |file: std::ops::Range<usize>, tile: usize, flip: u8| {
        let len = file.len();
        let (f, t) = (&mut block[file], &mut tile_block[tile..tile + len]);
        for (f, t) in f.iter_mut().zip(t) {
            if to_tile {
                *t = *f ^ flip;
            } else {
                *f = *t ^ flip;
            }
        }
    };
    pair(0..2, 2 * r, 0);
    if format == BlockFormat::Q4_1 {
        pair(2..4, 32 + 2 * r, 0);
    }
    let (words, flip) = if format == BlockFormat::Q8_0 {
        (8, 0x80)
    } else {
        (4, 0)
    };
    for k in 0..words {
        pair(fc + 4 * k..fc + 4 * k + 4, c + 64 * k + 4 * r, flip);
    }
    if format == BlockFormat::Q5_0 {
        // Fifth bits: value 4g + i of row r is bit 4r + i of group g's mask.
        if to_tile {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            for g in 0..8 {
                let nib = (qh >> (4 * g)) & 0xF;
                let at = 32 + 8 * g + r / 2;
                tile_block[at] |= (nib as u8) << (4 * (r % 2));
            }
        } else {
            let mut qh = 0u32;
            for g in 0..8 {
                let at = 32 + 8 * g + r / 2;
                let nib = (tile_block[at] >> (4 * (r % 2))) & 0xF;
                qh |= u32::from(nib) << (4 * g);
            }
            block[2..6].copy_from_slice(&qh.to_le_bytes());
        }
    }
}

/// The interleaved form of a (rows × cols) matrix of `format` given as the file's row-major blocks.
///
/// # Panics
/// If `format` is not [`supported`] or `data` is not rows × cols of it (the caller checked both).
pub(crate) fn pack(format: BlockFormat, rows: usize, cols: usize, data: &[u8]) -> Vec<u8> {
    assert!(supported(format) && cols.is_multiple_of(32));
    let (bb, nb) = (format.block_bytes(), cols / 32);
    assert_eq!(data.len(), rows * nb * bb);
    let tb = tile_block_bytes(format);
    let tiles = rows.div_ceil(ROWS);
    let mut out = vec![0u8; tiles * nb * tb];
    let mut block = vec![0u8; bb];
    for row in 0..rows {
        let (t, r) = (row / ROWS, row % ROWS);
        for b in 0..nb {
            block.copy_from_slice(&data[(row * nb + b) * bb..][..bb]);
            copy_block(format, &mut block, &mut out[(t * nb + b) * tb..][..tb], r, true);
        }
    }
    out
}

/// The file's bytes of rows `first .. first + count` from the interleaved form (the inverse of [`pack`]).
pub(crate) fn unpack_rows(
    format: BlockFormat,
    cols: usize,
    il: &[u8],
    first: usize,
    count: usize,
) -> Vec<u8> {
    let (bb, nb) = (format.block_bytes(), cols / 32);
    let tb = tile_block_bytes(format);
    let mut out = vec![0u8; count * nb * bb];
    let mut tile_block = vec![0u8; tb];
    for (k, row) in (first..first + count).enumerate() {
        let (t, r) = (row / ROWS, row % ROWS);
        for b in 0..nb {
            tile_block.copy_from_slice(&il[(t * nb + b) * tb..][..tb]);
            copy_block(
                format,
                &mut out[(k * nb + b) * bb..][..bb],
                &mut tile_block,
                r,
                false,
            );
        }
    }
    out
}

/// Whether every scale (and Q4_1 min) of the interleaved form is finite (padding rows have zero scales).
pub(crate) fn scales_finite(format: BlockFormat, il: &[u8]) -> bool {
    let halves = if format == BlockFormat::Q4_1 { 32 } else { 16 };
    il.chunks_exact(tile_block_bytes(format))
        .all(|tb| (0..halves).all(|h| reference::half_at(tb, 2 * h).is_finite()))
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
        if format == BlockFormat::Q5_0 {
            let bit = 4 * r + i;
            if tile_block[32 + 8 * g + bit / 8] >> (bit % 8) & 1 == 1 {
                u |= 0x10;
            }
        }
        u
    })
}

/// The quantised activation rows a tile is applied to: codes, one scale per 32 values, `scale · Σ codes` per 32.
pub(crate) struct Acts<'a> {
    pub q: &'a [i8],
    pub d: &'a [f32],
    pub xs: &'a [f32],
    pub cols: usize,
}

/// The portable product of one tile (`tile`: its `cols/32` tile-blocks) with activation rows `rows`:
/// `out[c · ROWS + r]` for c < rows.len(); the arithmetic and its order are those of the vector kernel.
pub(crate) fn tile_product(
    format: BlockFormat,
    tile: &[u8],
    a: &Acts,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
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
                let m = if format == BlockFormat::Q4_1 {
                    reference::half_at(block, 32 + 2 * r)
                } else {
                    0.0
                };
                let mut isum = 0i32;
                for g in 0..8 {
                    let u = codes(format, block, r, g);
                    for k in 0..4 {
                        isum += i32::from(u[k]) * i32::from(x[4 * g + k]);
                    }
                }
                acc[r] = (isum as f32).mul_add(d * dx, acc[r]);
                off[r] = offset(format, d, m).mul_add(xs, off[r]);
            }
        }
        for r in 0..ROWS {
            out[c * ROWS + r] = acc[r] + off[r];
        }
    }
}
