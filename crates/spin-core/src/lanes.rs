//! The element type of a distribution ([`Weight`]) and the passes over whole rows that every round makes (a row's largest logit, its exponentials, sums and
//! scaling, the validation of a distribution), each compiled for the vector instructions the CPU has, chosen at
//! run time through `pulp` (AVX2 with FMA where present, else the baseline).
//!
//! Each pass is written as plain element-wise code with its sums in fixed lanes, so every instruction set computes
//! the same operations in the same order and the results are the same bits on every machine (tested against the
//! baseline compilation). Rust never fuses a multiply and an add on its own, so enabling FMA does not change them.

use crate::chance::{BLOCK, reduce_lanes};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// The element types a [`Dist`](crate::Dist) can borrow: `f32` (what models produce) and `f64` (references, tests).
pub trait Weight: Copy + PartialOrd + Send + Sync + std::fmt::Debug + sealed::Sealed + 'static {
    /// The size of one dense value on the air, in bits.
    const BITS: u32;
    /// Widens to `f64` (exact for both types).
    fn to_f64(self) -> f64;
    /// The 32 most significant bits of the value's pattern (bit 31 is the sign).
    fn sign_word(self) -> u32;
}

impl Weight for f32 {
    const BITS: u32 = 32;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn sign_word(self) -> u32 {
        self.to_bits()
    }
}

impl Weight for f64 {
    const BITS: u32 = 64;
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn sign_word(self) -> u32 {
        (self.to_bits() >> 32) as u32
    }
}

/// Sum of up to [`BLOCK`] weights in eight lanes, and the OR of their sign words (to detect negative entries
/// with integer operations that vectorise; −0.0 also sets the sign bit and is sorted out on the slow path).
#[inline(always)]
pub(crate) fn lane_sum_signs<W: Weight>(xs: &[W]) -> (f64, u32) {
    let mut acc = [0.0f64; 8];
    let mut sg = [0u32; 8];
    if let Ok(arr) = <&[W; BLOCK]>::try_from(xs) {
        for i in 0..BLOCK / 8 {
            for j in 0..8 {
                let x = arr[i * 8 + j];
                acc[j] += x.to_f64();
                sg[j] |= x.sign_word();
            }
        }
    } else {
        for (k, &x) in xs.iter().enumerate() {
            acc[k % 8] += x.to_f64();
            sg[k % 8] |= x.sign_word();
        }
    }
    (reduce_lanes(acc), sg.iter().fold(0, |a, &b| a | b))
}

#[inline(always)]
pub(crate) fn lane_sum<W: Weight>(xs: &[W]) -> f64 {
    let mut acc = [0.0f64; 8];
    // A full block as a fixed-size array: the same order of additions, with no bounds checks in the loop.
    if let Ok(arr) = <&[W; BLOCK]>::try_from(xs) {
        for i in 0..BLOCK / 8 {
            for j in 0..8 {
                acc[j] += arr[i * 8 + j].to_f64();
            }
        }
        return reduce_lanes(acc);
    }
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for j in 0..8 {
            acc[j] += c[j].to_f64();
        }
    }
    for (j, x) in chunks.remainder().iter().enumerate() {
        acc[j] += x.to_f64();
    }
    reduce_lanes(acc)
}

/// e^x for x ≤ 0 in `f32`, within 3e−7 relative of e^x for x ≥ −87 (tested) and exactly 0 below (−∞ included;
/// e^−87 ≈ 1.6e−38 is near the smallest normal `f32`). Branch-free, so that a loop of it
/// compiles to vector instructions: a row of 49,152 logits takes tens of microseconds where `f64::exp` took 400.
/// The range reduction x = n·ln 2 + r, |r| ≤ ln 2 / 2, splits ln 2 in two parts so r is exact to a few ulp; e^r is
/// a degree-6 Taylor polynomial (its remainder below 2e−9 there); 2^n is built from the exponent bits.
#[inline(always)]
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer in float arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let under = x < -87.0;
    let xc = if under { -87.0 } else { x };
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // t's mantissa holds n (−126 ≤ n ≤ 0) above 1.5·2^23; 2^n's exponent field is n + 127 ∈ [1, 127].
    let n_bits = t.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    if under { 0.0 } else { p * scale }
}

/// The largest entry of `row` (−∞ for an empty row) and whether a NaN or +∞ occurs in it.
pub(crate) fn max_and_bad(row: &[f32]) -> (f32, bool) {
    pulp::Arch::new().dispatch(MaxAndBad { row })
}

/// Writes `exp((l − max) · inv_t)` of every logit `l` of `logits` into `out` (as long; [`exp_nonpositive`]).
pub(crate) fn write_exps(logits: &[f32], max: f32, inv_t: f32, out: &mut [f32]) {
    pulp::Arch::new().dispatch(WriteExps {
        logits,
        max,
        inv_t,
        out,
    });
}

/// Overwrites every logit `l` of `row` with `exp((l − max) · inv_t)` ([`write_exps`] in place).
pub(crate) fn exps_in_place(row: &mut [f32], max: f32, inv_t: f32) {
    pulp::Arch::new().dispatch(ExpsInPlace { row, max, inv_t });
}

/// The sum of `w` in `f64`, in eight interleaved lanes added in a fixed order at the end.
pub(crate) fn sum_f64(w: &[f32]) -> f64 {
    pulp::Arch::new().dispatch(SumF64 { w })
}

/// Multiplies every entry of `w` by `inv` in `f64` (rounding back to `f32`) and returns the sum of the results in
/// the blocked order of [`crate::chance::blocked_total`] (what validating them would compute).
pub(crate) fn scale_and_total(w: &mut [f32], inv: f64) -> f64 {
    pulp::Arch::new().dispatch(ScaleAndTotal { w, inv })
}

/// The blocked total of `weights` and the OR of their sign words ([`lane_sum_signs`] over each block, in order).
pub(crate) fn total_and_signs<W: Weight>(weights: &[W]) -> (f64, u32) {
    pulp::Arch::new().dispatch(TotalAndSigns { weights })
}

struct MaxAndBad<'a> {
    row: &'a [f32],
}

impl pulp::WithSimd for MaxAndBad<'_> {
    type Output = (f32, bool);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        const L: usize = 16;
        let (mut max, mut bad) = ([f32::NEG_INFINITY; L], [0u32; L]);
        let mut chunks = self.row.chunks_exact(L);
        for c in &mut chunks {
            for l in 0..L {
                let x = c[l];
                bad[l] |= u32::from(x.is_nan() | (x == f32::INFINITY));
                max[l] = if x > max[l] { x } else { max[l] };
            }
        }
        for (l, &x) in chunks.remainder().iter().enumerate() {
            bad[l] |= u32::from(x.is_nan() | (x == f32::INFINITY));
            max[l] = if x > max[l] { x } else { max[l] };
        }
        let m = max
            .iter()
            .fold(f32::NEG_INFINITY, |a, &x| if x > a { x } else { a });
        (m, bad.iter().any(|&b| b != 0))
    }
}

struct WriteExps<'a> {
    logits: &'a [f32],
    max: f32,
    inv_t: f32,
    out: &'a mut [f32],
}

impl pulp::WithSimd for WriteExps<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let (max, inv_t) = (self.max, self.inv_t);
        for (o, &l) in self.out.iter_mut().zip(self.logits) {
            *o = exp_nonpositive((l - max) * inv_t);
        }
    }
}

struct ExpsInPlace<'a> {
    row: &'a mut [f32],
    max: f32,
    inv_t: f32,
}

impl pulp::WithSimd for ExpsInPlace<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        let (max, inv_t) = (self.max, self.inv_t);
        for x in self.row.iter_mut() {
            *x = exp_nonpositive((*x - max) * inv_t);
        }
    }
}

struct SumF64<'a> {
    w: &'a [f32],
}

impl pulp::WithSimd for SumF64<'_> {
    type Output = f64;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> f64 {
        let mut acc = [0.0f64; 8];
        let mut chunks = self.w.chunks_exact(8);
        for c in &mut chunks {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a += f64::from(x);
            }
        }
        for (a, &x) in acc.iter_mut().zip(chunks.remainder()) {
            *a += f64::from(x);
        }
        ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))
    }
}

struct ScaleAndTotal<'a> {
    w: &'a mut [f32],
    inv: f64,
}

impl pulp::WithSimd for ScaleAndTotal<'_> {
    type Output = f64;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> f64 {
        let inv = self.inv;
        let mut total = 0.0;
        for block in self.w.chunks_mut(BLOCK) {
            for x in block.iter_mut() {
                *x = (f64::from(*x) * inv) as f32;
            }
            total += lane_sum(block);
        }
        total
    }
}

struct TotalAndSigns<'a, W: Weight> {
    weights: &'a [W],
}

impl<W: Weight> pulp::WithSimd for TotalAndSigns<'_, W> {
    type Output = (f64, u32);

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) -> Self::Output {
        let (mut total, mut signs) = (0.0, 0u32);
        for block in self.weights.chunks(BLOCK) {
            let (s, g) = lane_sum_signs(block);
            total += s;
            signs |= g;
        }
        (total, signs)
    }
}

/// Uniforms in [0, 1) with 24 random bits from a xorshift64 generator seeded with `seed` (non-zero): the
/// deterministic rows of this crate's tests.
#[cfg(test)]
pub(crate) fn test_uniforms(seed: u64) -> impl FnMut() -> f32 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pulp::WithSimd;

    /// Rows of every length up to two blocks and a vocabulary's, with −∞, ±0, tiny and huge logits.
    fn rows() -> Vec<Vec<f32>> {
        let mut next = test_uniforms(0x9e37_79b9_7f4a_7c15);
        let mut out = Vec::new();
        for n in (1..=2 * BLOCK + 3).chain([1000, 49_152, 49_157]) {
            let mut r: Vec<f32> = (0..n).map(|_| next() * 60.0 - 40.0).collect();
            if n > 5 {
                r[n / 3] = f32::NEG_INFINITY;
                r[n / 2] = -0.0;
                r[n - 2] = 1e-30;
                r[n / 5] = -200.0;
            }
            out.push(r);
        }
        out
    }

    /// Every pass gives the same bits dispatched (the best instruction set here) as compiled for the baseline.
    #[test]
    fn dispatched_passes_equal_the_baseline_bit_for_bit() {
        let scalar = pulp::Scalar::new();
        for row in rows() {
            let (m, bad) = max_and_bad(&row);
            let (m0, bad0) = MaxAndBad { row: &row }.with_simd(scalar);
            assert_eq!((m.to_bits(), bad), (m0.to_bits(), bad0), "len {}", row.len());
            let (mut e, mut e0) = (vec![0.0; row.len()], vec![0.0; row.len()]);
            write_exps(&row, m, 0.7, &mut e);
            WriteExps {
                logits: &row,
                max: m,
                inv_t: 0.7,
                out: &mut e0,
            }
            .with_simd(scalar);
            assert_eq!(bits(&e), bits(&e0));
            let mut inplace = row.clone();
            exps_in_place(&mut inplace, m, 0.7);
            assert_eq!(bits(&inplace), bits(&e));
            assert_eq!(
                sum_f64(&e).to_bits(),
                SumF64 { w: &e }.with_simd(scalar).to_bits()
            );
            let (mut s, mut s0) = (e.clone(), e.clone());
            let t = scale_and_total(&mut s, 1.0 / 3.0);
            let t0 = ScaleAndTotal {
                w: &mut s0,
                inv: 1.0 / 3.0,
            }
            .with_simd(scalar);
            assert_eq!((bits(&s), t.to_bits()), (bits(&s0), t0.to_bits()));
            let (tt, g) = total_and_signs(&row);
            let (tt0, g0) = TotalAndSigns { weights: &row }.with_simd(scalar);
            assert_eq!((tt.to_bits(), g), (tt0.to_bits(), g0));
            // The scaled row's total is what validating it computes.
            let wide: Vec<f64> = s.iter().map(|&x| f64::from(x)).collect();
            assert_eq!(t.to_bits(), total_and_signs(&s).0.to_bits());
            assert_eq!(
                total_and_signs(&wide).0.to_bits(),
                TotalAndSigns { weights: &wide[..] }.with_simd(scalar).0.to_bits()
            );
        }
        let (m, bad) = max_and_bad(&[1.0, f32::NAN, 2.0]);
        assert!(bad && m == 2.0);
        assert!(max_and_bad(&[f32::INFINITY]).1);
        assert_eq!(max_and_bad(&[]), (f32::NEG_INFINITY, false));
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
