//! Dense f32 rows to Q8_0 blocks, as ggml's reference quantiser writes them (and candle's `QTensor::quantize`, byte
//! for byte): per 32 values, d = max|x| / 127 stored as an f16 (round to nearest even), codes round(x / d) half
//! away from zero. A draft's f32 matrices are quantised at load (`Model::quantize_host`): candle's quantiser
//! rounded each value with a libm call, about 40 ms of CPU in six SmolLM2-draft start-ups; here the rounding is a
//! truncation and a compare, compiled for the CPU's vector instructions.

/// The Q8_0 blocks (34 bytes each: the f16 scale, then 32 signed codes) of `x`, a whole number of 32-value blocks.
pub(crate) fn quantise_q8_0(x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() / 32 * 34];
    pulp::Arch::new().dispatch(Blocks { x, out: &mut out });
    out
}

struct Blocks<'a> {
    x: &'a [f32],
    out: &'a mut [u8],
}

impl pulp::WithSimd for Blocks<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        for (xb, ob) in self.x.chunks_exact(32).zip(self.out.chunks_exact_mut(34)) {
            // The largest |x| in eight lanes, then across them: the maximum of the same values in another order.
            // A NaN compares false and is passed over, as `f32::max` passes it over.
            let mut lanes = [0f32; 8];
            for c in xb.chunks_exact(8) {
                for (m, &v) in lanes.iter_mut().zip(c) {
                    *m = if v.abs() > *m { v.abs() } else { *m };
                }
            }
            let amax = lanes.iter().fold(0f32, |m, &v| if v > m { v } else { m });
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            ob[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
            let mut codes = [0u8; 32];
            // The code's byte without a float-to-integer cast (which compiles to a scalar conversion per value):
            // |v · id| ≤ 127 plus rounding, and an integer r that small plus 1.5 · 2²³ is exact, its low mantissa
            // byte r's two's complement byte. NaN gives 0, as the cast gives it.
            for (q, &v) in codes.iter_mut().zip(xb) {
                let r = round_half_away(v * id);
                let byte = (r + 12_582_912.0).to_bits() as u8;
                *q = if r.is_nan() { 0 } else { byte };
            }
            ob[2..].copy_from_slice(&codes);
        }
    }
}

/// `s.round()` (half away from zero) for any finite `s`: `s − trunc(s)` is exact, so the comparison with one half
/// decides exactly as the rounding does; an integer stays itself.
#[inline(always)]
fn round_half_away(s: f32) -> f32 {
    let t = s.trunc();
    // Branch-free (a select the compiler vectorises): t ± 1 where the dropped fraction is at least one half, t ± 0
    // elsewhere (a signed zero added changes no code).
    t + f32::from(u8::from((s - t).abs() >= 0.5)).copysign(s)
}

/// The f16 nearest to `x` (ties to even), infinite beyond the largest finite f16, NaN kept NaN.
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x0200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        // A subnormal f16 (or zero): the 24-bit significand shifted right by 14 − e, rounded to even.
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let kept = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let up = rem > half || (rem == half && kept & 1 == 1);
        return sign | (kept + u32::from(up)) as u16;
    }
    let kept = man >> 13;
    let rem = man & 0x1fff;
    let mut h = (u32::from(sign) | ((e as u32) << 10)) + kept;
    // A carry out of the mantissa steps the exponent, up to infinity: still the nearest.
    if rem > 0x1000 || (rem == 0x1000 && kept & 1 == 1) {
        h += 1;
    }
    h as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    /// Byte for byte what candle writes, over magnitudes from f16-subnormal scales to overflowing ones, and blocks
    /// whose scaled values are exact halves.
    #[test]
    fn q8_0_blocks_equal_candles() {
        let mut x = Vec::new();
        for (k, scale) in [1e-9f32, 1e-6, 3e-5, 1e-3, 0.07, 1.0, 13.0, 900.0, 5e6, 1e7, 3e7]
            .iter()
            .enumerate()
        {
            for i in 0..32 * 40 {
                let u = ((i * 7919 + k * 104_729) % 10_007) as f32 / 10_007.0 - 0.5;
                x.push(u * scale);
            }
        }
        // max |x| = 127: d = 1, and every value below is an exact half (ties away from zero), or an integer.
        let mut ties: Vec<f32> = (0..31).map(|i| i as f32 - 15.5).collect();
        ties.push(127.0);
        x.extend(&ties);
        x.extend(ties.iter().map(|v| -v));
        x.extend([0.0f32; 32]);
        let cols = 32 * 8;
        let rows = x.len() / cols;
        x.truncate(rows * cols);
        let t = Tensor::from_vec(x.clone(), (rows, cols), &Device::Cpu).unwrap();
        let want = QTensor::quantize(&t, GgmlDType::Q8_0)
            .unwrap()
            .data()
            .unwrap()
            .into_owned();
        assert_eq!(quantise_q8_0(&x), want);
    }

    /// Every f16 conversion is the nearest f16 (ties to the even code), over a sweep of f32 bit patterns.
    #[test]
    fn halves_round_to_nearest_even_like_the_reference_conversion() {
        for bits in (0..u32::MAX)
            .step_by(65_537)
            .chain([0x3380_0000, 0x3300_0000, 0x477f_f000, 0x477f_f001])
        {
            let x = f32::from_bits(bits);
            let h = f32_to_f16(x);
            let back = crate::quant::reference::f16_to_f32(h);
            if x.is_nan() {
                assert!(back.is_nan());
                continue;
            }
            if back.is_infinite() {
                // Beyond the largest f16 and half its last step (65,504 + 16), IEEE rounding gives infinity.
                assert!(x.abs() >= 65_520.0, "{x:e} -> {h:#06x}");
                continue;
            }
            // Nearest: no f16 neighbour is closer (ties to the even code).
            for n in [h.wrapping_sub(1), h.wrapping_add(1)] {
                let other = crate::quant::reference::f16_to_f32(n);
                if other.is_nan() || (n ^ h) & 0x8000 != 0 {
                    continue;
                }
                let (a, b) = (
                    (f64::from(back) - f64::from(x)).abs(),
                    (f64::from(other) - f64::from(x)).abs(),
                );
                assert!(
                    a < b || (a == b && h & 1 == 0),
                    "{x:e} -> {h:#06x}, neighbour {n:#06x}"
                );
            }
        }
    }
}
