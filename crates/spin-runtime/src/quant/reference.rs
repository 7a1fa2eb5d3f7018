//! The plain scalar reference of every ggml block format: the byte layouts decoded element by element (dequantised
//! in the very order of operations candle uses, so the two agree bit for bit), the per-block scale checks, and the
//! unpacking of a weight row into the uniform "codes, scales, offsets" form that every product kernel reads.
//!
//! Layouts (little-endian, f16 = IEEE half):
//! - Q4_0, 32 values, 18 bytes: `d: f16, qs: [u8; 16]`; value j < 16 is `((qs[j] & 15) - 8)·d`, value j + 16 is
//!   `((qs[j] >> 4) - 8)·d`.
//! - Q4_1, 32 values, 20 bytes: `d: f16, m: f16, qs: [u8; 16]`; nibbles as Q4_0, value `q·d + m`.
//! - Q8_0, 32 values, 34 bytes: `d: f16, qs: [i8; 32]`; value `qs[j]·d`.
//! - Q5_0, 32 values, 22 bytes: `d: f16, qh: u32 (little-endian), qs: [u8; 16]`; nibbles as Q4_0, bit j of `qh`
//!   the fifth bit of value j; value `(q − 16)·d`.
//! - Q4_K, 256 values, 144 bytes: `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]`; eight sub-blocks of 32 with
//!   6-bit scale `sc` and min `m` packed in `scales`; value `d·sc·q − dmin·m`, q the low nibbles of 32 bytes for an
//!   even sub-block and the high nibbles of the same bytes for the next one.
//! - Q5_K, 256 values, 176 bytes: Q4_K plus `qh: [u8; 32]` (before `qs`) giving each value its fifth bit.
//! - Q6_K, 256 values, 210 bytes: `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16`; value `d·sc[e/16]·(q−32)`
//!   with q six bits: four from `ql`, two from `qh`.

use super::BlockFormat;

/// IEEE half-precision bits to f32 (exact: every half is an f32).
#[inline]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h >> 15) << 31;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x3ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal half: normalise the mantissa into an f32 normal.
            let shift = man.leading_zeros() - 21; // man has at most 10 significant bits
            let man = (man << shift) & 0x3ff;
            sign | ((127 - 15 + 1 - shift) << 23) | (man << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

#[inline]
pub(crate) fn half_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Whether the f16 at byte `at` of `b` is finite: its exponent bits are not all ones (what `half_at(b, at)
/// .is_finite()` says, without converting; the load-time check reads every block's scales, and the conversion
/// was a twentieth of a SmolLM2 start-up's CPU time).
#[inline]
pub(crate) fn half_finite_at(b: &[u8], at: usize) -> bool {
    u16::from_le_bytes([b[at], b[at + 1]]) & 0x7C00 != 0x7C00
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block's 12 packed scale bytes.
#[inline]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The six-bit code (0..64) of element `e` (0..256) of a Q6_K block.
#[inline]
pub(crate) fn q6k_code(block: &[u8], e: usize) -> u8 {
    let (ql, qh) = (&block[..128], &block[128..192]);
    let (h, rem) = (e / 128, e % 128);
    let (qi, l) = (rem / 32, rem % 32);
    let byte = ql[64 * h + l + (qi & 1) * 32];
    let low = if qi < 2 { byte & 0xF } else { byte >> 4 };
    let high = (qh[32 * h + l] >> (2 * qi)) & 3;
    low | (high << 4)
}

/// The five-bit code (0..32) of element `j` (0..32) of a Q5_0 block.
#[inline]
pub(crate) fn q5_0_code(block: &[u8], j: usize) -> u8 {
    q5_code(&block[q5_qh_at(BlockFormat::Q5_0)..], j)
}

/// The five-bit code (0..32) of value `j` of a Q5_1 block.
#[inline]
pub(crate) fn q5_1_code(block: &[u8], j: usize) -> u8 {
    q5_code(&block[q5_qh_at(BlockFormat::Q5_1)..], j)
}

/// Where a Q5_0 or Q5_1 block's fifth bits (`qh`, 4 bytes, the 16 code bytes after them) start: after the f16
/// scale, and Q5_1's f16 min.
pub(crate) fn q5_qh_at(format: BlockFormat) -> usize {
    if format == BlockFormat::Q5_1 { 4 } else { 2 }
}

/// The five-bit code of value `j` from a Q5_0/Q5_1 block's fifth bits (`qh`, 4 bytes) and the 16 code bytes after.
#[inline]
fn q5_code(qh_then_codes: &[u8], j: usize) -> u8 {
    let b = qh_then_codes;
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let byte = b[4 + j % 16];
    let low = if j < 16 { byte & 0xF } else { byte >> 4 };
    low | ((((qh >> j) & 1) as u8) << 4)
}

/// The five-bit code (0..32) of element `e` (0..256) of a Q5_K block.
#[inline]
pub(crate) fn q5k_code(block: &[u8], e: usize) -> u8 {
    let (qh, qs) = (&block[16..48], &block[48..176]);
    let (pair, rem) = (e / 64, e % 64);
    let (hi, l) = (rem / 32, rem % 32);
    let byte = qs[32 * pair + l];
    let low = if hi == 0 { byte & 0xF } else { byte >> 4 };
    let bit = (qh[l] >> (2 * pair + hi)) & 1;
    low | (bit << 4)
}

/// The four-bit code (0..16) of element `e` (0..256) of a Q4_K block.
#[inline]
pub(crate) fn q4k_code(block: &[u8], e: usize) -> u8 {
    let qs = &block[16..144];
    let (pair, rem) = (e / 64, e % 64);
    let byte = qs[32 * pair + rem % 32];
    if rem < 32 { byte & 0xF } else { byte >> 4 }
}

/// Dequantises one row (`row` holds whole blocks of `format`) into `out`, in candle's order of operations.
pub(crate) fn dequantize_row(format: BlockFormat, row: &[u8], out: &mut [f32]) {
    let be = format.block_elems();
    let bb = format.block_bytes();
    for (block, y) in row.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
        match format {
            BlockFormat::F32 => y[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
            BlockFormat::F16 => y[0] = half_at(block, 0),
            BlockFormat::Q4_0 => {
                let d = half_at(block, 0);
                for j in 0..16 {
                    let x0 = i16::from(block[2 + j] & 0x0F) - 8;
                    let x1 = i16::from(block[2 + j] >> 4) - 8;
                    y[j] = f32::from(x0) * d;
                    y[j + 16] = f32::from(x1) * d;
                }
            }
            BlockFormat::Q4_1 => {
                let (d, m) = (half_at(block, 0), half_at(block, 2));
                for j in 0..16 {
                    y[j] = f32::from(block[4 + j] & 0x0F) * d + m;
                    y[j + 16] = f32::from(block[4 + j] >> 4) * d + m;
                }
            }
            BlockFormat::Q8_0 => {
                let d = half_at(block, 0);
                for j in 0..32 {
                    y[j] = f32::from(block[2 + j] as i8) * d;
                }
            }
            BlockFormat::Q5_0 => {
                let d = half_at(block, 0);
                for (j, y) in y.iter_mut().enumerate() {
                    *y = (i32::from(q5_0_code(block, j)) - 16) as f32 * d;
                }
            }
            BlockFormat::Q5_1 => {
                let (d, m) = (half_at(block, 0), half_at(block, 2));
                for (j, y) in y.iter_mut().enumerate() {
                    *y = f32::from(q5_1_code(block, j)) * d + m;
                }
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let (d, min) = (half_at(block, 0), half_at(block, 2));
                let scales = &block[4..16];
                for (j, y) in y.chunks_exact_mut(32).enumerate() {
                    let (sc, m) = scale_min_k4(j, scales);
                    let (dl, ml) = (d * f32::from(sc), min * f32::from(m));
                    for (l, y) in y.iter_mut().enumerate() {
                        let e = 32 * j + l;
                        *y = if format == BlockFormat::Q4K {
                            dl * f32::from(q4k_code(block, e)) - ml
                        } else {
                            let code = q5k_code(block, e);
                            let to_add = if code & 16 != 0 { 16f32 } else { 0f32 };
                            dl * (f32::from(code & 15) + to_add) - ml
                        };
                    }
                }
            }
            BlockFormat::Q6K => {
                let d = half_at(block, 208);
                for (e, y) in y.iter_mut().enumerate() {
                    let sc = block[192 + e / 16] as i8;
                    let q = q6k_code(block, e) as i8 - 32;
                    *y = d * f32::from(sc) * f32::from(q);
                }
            }
        }
    }
}

/// Whether every scale (and min) of every block of `data` is finite; for F32/F16, every value.
pub(crate) fn scales_finite(format: BlockFormat, data: &[u8]) -> bool {
    let bb = format.block_bytes();
    let offsets: &[usize] = match format {
        BlockFormat::F32 => {
            return data
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite());
        }
        BlockFormat::F16 | BlockFormat::Q4_0 | BlockFormat::Q8_0 | BlockFormat::Q5_0 => &[0],
        BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
        BlockFormat::Q6K => &[208],
    };
    data.chunks_exact(bb)
        .all(|b| offsets.iter().all(|&at| half_finite_at(b, at)))
}

/// One weight row in the uniform form of the product kernels: value e is `s·u[e] + o` with `u` an unsigned code
/// and (s, o) constant over a group of 32 values (16 for Q6_K, where `s` is then given per 4-value lane).
pub(crate) struct RowView<'a> {
    /// Codes, one per value.
    pub u: &'a mut [u8],
    /// Scale per 32 values (all formats but Q6_K).
    pub s: &'a mut [f32],
    /// Scale per 4 values (Q6_K only; empty otherwise).
    pub sl: &'a mut [f32],
    /// Offset per group (32 values; 16 for Q6_K).
    pub o: &'a mut [f32],
}

/// Unpacks one row of a quantised format into `v` (scalar reference; the SIMD unpackers must agree exactly).
pub(crate) fn unpack_row(format: BlockFormat, row: &[u8], v: RowView<'_>) {
    let bb = format.block_bytes();
    for (b, block) in row.chunks_exact(bb).enumerate() {
        match format {
            BlockFormat::F32 | BlockFormat::F16 => unreachable_format(),
            BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
                let d = half_at(block, 0);
                let (off, o) = if format == BlockFormat::Q4_0 {
                    (2, -8.0 * d)
                } else {
                    (4, half_at(block, 2))
                };
                let u = &mut v.u[32 * b..32 * b + 32];
                for j in 0..16 {
                    u[j] = block[off + j] & 0x0F;
                    u[j + 16] = block[off + j] >> 4;
                }
                v.s[b] = d;
                v.o[b] = o;
            }
            BlockFormat::Q5_0 => {
                let d = half_at(block, 0);
                for j in 0..32 {
                    v.u[32 * b + j] = q5_0_code(block, j);
                }
                v.s[b] = d;
                v.o[b] = -16.0 * d;
            }
            BlockFormat::Q5_1 => {
                for j in 0..32 {
                    v.u[32 * b + j] = q5_1_code(block, j);
                }
                v.s[b] = half_at(block, 0);
                v.o[b] = half_at(block, 2);
            }
            BlockFormat::Q8_0 => {
                let d = half_at(block, 0);
                for j in 0..32 {
                    v.u[32 * b + j] = block[2 + j] ^ 0x80;
                }
                v.s[b] = d;
                v.o[b] = -128.0 * d;
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                let (d, min) = (half_at(block, 0), half_at(block, 2));
                for j in 0..8 {
                    let (sc, m) = scale_min_k4(j, &block[4..16]);
                    v.s[8 * b + j] = d * f32::from(sc);
                    v.o[8 * b + j] = -(min * f32::from(m));
                }
                for e in 0..256 {
                    v.u[256 * b + e] = if format == BlockFormat::Q4K {
                        q4k_code(block, e)
                    } else {
                        q5k_code(block, e)
                    };
                }
            }
            BlockFormat::Q6K => {
                let d = half_at(block, 208);
                for k in 0..16 {
                    let s = d * f32::from(block[192 + k] as i8);
                    v.sl[64 * b + 4 * k..64 * b + 4 * k + 4].fill(s);
                    v.o[16 * b + k] = -32.0 * s;
                }
                for e in 0..256 {
                    v.u[256 * b + e] = q6k_code(block, e);
                }
            }
        }
    }
}

fn unreachable_format() {
    debug_assert!(false, "float formats have no codes to unpack");
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bit_check_of_a_half_agrees_with_its_conversion_for_every_pattern() {
        for bits in 0..=u16::MAX {
            let b = bits.to_le_bytes();
            assert_eq!(
                super::half_finite_at(&b, 0),
                super::half_at(&b, 0).is_finite(),
                "{bits:#06x}"
            );
        }
    }
}
