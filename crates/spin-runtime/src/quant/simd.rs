//! The instruction-set kernels of the quantised products, and the only module of the workspace that allows
//! `unsafe`: `std::arch` loads and stores of 32 bytes at a time, and calls of `#[target_feature]` functions after
//! `is_x86_feature_detected!` said the CPU has the features. pulp (used by `kernels.rs`) has no VNNI
//! (`vpdpbusd`) operations, which is what the integer dot products need, hence std::arch here.
//!
//! Every routine has a portable twin in plain Rust performing the same arithmetic in the same order (fused
//! multiply-adds included), so the SIMD routines are tested against it bit for bit (`tests` below).
//! Instruction sets, best first: AVX-512 VNNI with AVX-512 BW/VL on 256-bit vectors (`vpdpbusd ymm`, 32 registers),
//! AVX-VNNI, AVX2 + FMA (`vpmaddubsw` + `vpmaddwd`), then the portable code. AMX is never used (it faults in some
//! virtual machines that advertise it).
#![allow(unsafe_code)]

use super::reference::{self, RowView};
use super::{ActView, BlockFormat, PanelView, TILE};
use std::sync::OnceLock;

/// The instruction set the kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 F/BW/VL/VNNI (256-bit vectors) with AVX2 and FMA.
    Avx512Vnni,
    /// AVX-VNNI with AVX2 and FMA.
    AvxVnni,
    /// AVX2, FMA and F16C.
    Avx2,
    /// Plain Rust.
    Portable,
}

impl Isa {
    /// Every instruction set this CPU can run, best first (the portable code always).
    pub(crate) fn available() -> Vec<Isa> {
        let mut all = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let v3 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if v3
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                all.push(Isa::Avx512Vnni);
            }
            if v3 && is_x86_feature_detected!("avxvnni") {
                all.push(Isa::AvxVnni);
            }
            if v3 {
                all.push(Isa::Avx2);
            }
        }
        all.push(Isa::Portable);
        all
    }

    /// The best instruction set of this CPU (detected once).
    pub(crate) fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| Isa::available()[0])
    }
}

/// Quantises 32 values to signed codes (|q| ≤ 127, round to nearest, ties away) and returns their scale
/// `max|x| / 127` (0 for an all-zero block; non-finite inputs give code 0 or ±127, never a panic).
pub(crate) fn quantise_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// Unpacks one weight row (see [`reference::unpack_row`]), with 256-bit vectors where the CPU has AVX2.
pub(crate) fn unpack_row(format: BlockFormat, row: &[u8], v: RowView<'_>) {
    unpack_row_with(Isa::best(), format, row, v);
}

pub(crate) fn unpack_row_with(isa: Isa, format: BlockFormat, row: &[u8], v: RowView<'_>) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: every x86 `Isa` but Portable is only produced by `Isa::available` after
        // `is_x86_feature_detected!` found AVX2 and F16C on this CPU, the features `x86::unpack_row` enables.
        unsafe { x86::unpack_row(format, row, v) };
        return;
    }
    let _ = isa;
    reference::unpack_row(format, row, v);
}

/// One tile of TILE unpacked weight rows against every activation row: `out[t·n + i]` for t < `live`.
pub(crate) fn quant_tile(p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
    quant_tile_with(Isa::best(), p, a, live, out);
}

pub(crate) fn quant_tile_with(isa: Isa, p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
    debug_assert!(live <= TILE && out.len() >= live * a.n && a.q.len() >= a.n * a.cols && a.cols == p.cols);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: the x86 `Isa` values come only from `Isa::available`, after `is_x86_feature_detected!` found
        // every feature the chosen kernel enables (`x86::quant_tile` calls only the kernel of `isa`).
        unsafe { x86::quant_tile(isa, p, a, live, out) };
        return;
    }
    let _ = isa;
    portable::quant_tile(p, a, live, out);
}

/// One tile of TILE f32 weight rows (`f`, TILE × cols) against n f32 activation rows: `out[t·n + i]`, t < out/n.
pub(crate) fn float_tile(f: &[f32], x: &[f32], n: usize, cols: usize, out: &mut [f32]) {
    float_tile_with(Isa::best(), f, x, n, cols, out);
}

/// Converts a row of little-endian f16 values to f32 (exact), with F16C where the CPU has it.
pub(crate) fn f16_row(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::best() != Isa::Portable {
        // SAFETY: every x86 `Isa` but Portable comes from `Isa::available` after AVX2 and F16C were detected.
        unsafe { x86::f16_row(bytes, out) };
        return;
    }
    for (h, y) in bytes.chunks_exact(2).zip(out) {
        *y = reference::half_at(h, 0);
    }
}

pub(crate) fn float_tile_with(isa: Isa, f: &[f32], x: &[f32], n: usize, cols: usize, out: &mut [f32]) {
    for (t, out) in out.chunks_mut(n).enumerate() {
        let w = &f[t * cols..(t + 1) * cols];
        for (i, y) in out.iter_mut().enumerate() {
            *y = dot_f32_with(isa, w, &x[i * cols..(i + 1) * cols]);
        }
    }
}

/// Σ a·b over 8 running lanes (lane k takes the elements ≡ k mod 8 of the whole 8-blocks), reduced in the fixed
/// order ((0+4)+(2+6)) + ((1+5)+(3+7)), then the tail added in order, every step a fused multiply-add.
pub(crate) fn dot_f32_with(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: every x86 `Isa` but Portable comes from `Isa::available` after AVX2 and FMA were detected.
        return unsafe { x86::dot_f32(a, b) };
    }
    let _ = isa;
    portable::dot_f32(a, b)
}

/// The horizontal sum of 8 lanes in the order of the vector code.
#[inline(always)]
fn hsum8(v: [f32; 8]) -> f32 {
    let s = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
    let s = [s[0] + s[2], s[1] + s[3]];
    s[0] + s[1]
}

/// The portable kernels: the same operations, in the same order, as the vector ones.
mod portable {
    use super::*;

    pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let full = a.len().min(b.len()) / 8 * 8;
        let mut acc = [0f32; 8];
        for (ca, cb) in a[..full].chunks_exact(8).zip(b[..full].chunks_exact(8)) {
            for k in 0..8 {
                acc[k] = ca[k].mul_add(cb[k], acc[k]);
            }
        }
        let mut s = hsum8(acc);
        for (x, y) in a[full..].iter().zip(&b[full..]) {
            s = x.mul_add(*y, s);
        }
        s
    }

    /// The integer lane sums of one 32-value chunk: lane k = Σ_{j<4} u[4k+j]·q[4k+j] (exact).
    pub(crate) fn lanes(u: &[u8], q: &[i8]) -> [i32; 8] {
        let mut l = [0i32; 8];
        for (k, l) in l.iter_mut().enumerate() {
            *l = (0..4)
                .map(|j| i32::from(u[4 * k + j]) * i32::from(q[4 * k + j]))
                .sum();
        }
        l
    }

    pub(super) fn quant_tile(p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
        let (cols, n) = (p.cols, a.n);
        let nch = cols / 32;
        let ng = p.o.len() / TILE;
        for t in 0..live {
            for i in 0..n {
                let mut acc = [0f32; 8];
                for b in 0..nch {
                    let l = lanes(&p.u[t * cols + 32 * b..][..32], &a.q[i * cols + 32 * b..][..32]);
                    let dx = a.d[i * nch + b];
                    for k in 0..8 {
                        let s = if p.split {
                            p.sl[t * cols / 4 + 8 * b + k]
                        } else {
                            p.s[t * nch + b]
                        };
                        acc[k] = (l[k] as f32).mul_add(s * dx, acc[k]);
                    }
                }
                let off = dot_f32(&p.o[t * ng..(t + 1) * ng], &a.xs[i * ng..(i + 1) * ng]);
                out[t * n + i] = hsum8(acc) + off;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Loads 32 bytes.
    #[inline(always)]
    fn load32<T: Copy>(s: &[T]) -> __m256i {
        assert!(std::mem::size_of_val(s) >= 32);
        // SAFETY: `s` holds at least 32 bytes (asserted above); the load is unaligned.
        unsafe { _mm256_loadu_si256(s.as_ptr().cast()) }
    }

    /// Loads 8 floats.
    #[inline(always)]
    fn load8(s: &[f32]) -> __m256 {
        assert!(s.len() >= 8);
        // SAFETY: `s` holds at least 8 floats (asserted above); the load is unaligned.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }

    /// Loads 16 bytes.
    #[inline(always)]
    fn load16(s: &[u8]) -> __m128i {
        assert!(s.len() >= 16);
        // SAFETY: `s` holds at least 16 bytes (asserted above); the load is unaligned.
        unsafe { _mm_loadu_si128(s.as_ptr().cast()) }
    }

    /// Stores 32 bytes.
    #[inline(always)]
    fn store32(s: &mut [u8], v: __m256i) {
        assert!(s.len() >= 32);
        // SAFETY: `s` holds at least 32 writable bytes (asserted above); the store is unaligned.
        unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), v) }
    }

    /// Stores 16 bytes.
    #[inline(always)]
    fn store16(s: &mut [u8], v: __m128i) {
        assert!(s.len() >= 16);
        // SAFETY: `s` holds at least 16 writable bytes (asserted above); the store is unaligned.
        unsafe { _mm_storeu_si128(s.as_mut_ptr().cast(), v) }
    }

    #[inline(always)]
    fn hsum(v: __m256) -> f32 {
        let mut a = [0f32; 8];
        // SAFETY: `a` is 8 writable floats.
        unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
        hsum8(a)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let full = a.len().min(b.len()) / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        for (ca, cb) in a[..full].chunks_exact(8).zip(b[..full].chunks_exact(8)) {
            acc = _mm256_fmadd_ps(load8(ca), load8(cb), acc);
        }
        let mut s = hsum(acc);
        for (x, y) in a[full..].iter().zip(&b[full..]) {
            s = x.mul_add(*y, s);
        }
        s
    }

    /// Lane sums u·q of 32 unsigned codes and 32 signed activation codes, by instruction set.
    pub(crate) trait Dot {
        /// Whether it is exact for codes up to 255 (else up to 127).
        fn lanes(u: __m256i, q: __m256i) -> __m256i;
    }

    pub(crate) struct Vnni512;
    pub(crate) struct VnniAvx;
    pub(crate) struct Maddubs;
    pub(crate) struct Maddubs8;

    impl Dot for Vnni512 {
        #[inline(always)]
        fn lanes(u: __m256i, q: __m256i) -> __m256i {
            // SAFETY: only reached from `tile::<Vnni512, ..>`, whose features (AVX-512 VNNI + VL) the caller
            // detected; the intrinsic has no memory operands.
            unsafe { _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, q) }
        }
    }

    impl Dot for VnniAvx {
        #[inline(always)]
        fn lanes(u: __m256i, q: __m256i) -> __m256i {
            // SAFETY: only reached from `tile::<VnniAvx, ..>`, whose feature (AVX-VNNI) the caller detected.
            unsafe { _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, q) }
        }
    }

    impl Dot for Maddubs {
        /// Exact while codes are ≤ 127 (the i16 pair sums cannot saturate: 2·127·127 < 2¹⁵).
        #[inline(always)]
        fn lanes(u: __m256i, q: __m256i) -> __m256i {
            // SAFETY: only reached from `tile::<Maddubs, ..>` after AVX2 was detected.
            unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1)) }
        }
    }

    impl Dot for Maddubs8 {
        /// Codes up to 255 as `(u − 128)·q + 128·q`, each product pair within i16 (activation codes ≥ −127).
        #[inline(always)]
        fn lanes(u: __m256i, q: __m256i) -> __m256i {
            // SAFETY: only reached from `tile::<Maddubs8, ..>` after AVX2 was detected.
            unsafe {
                let ones = _mm256_set1_epi16(1);
                let ws = _mm256_xor_si256(u, _mm256_set1_epi8(-128));
                let a = _mm256_maddubs_epi16(_mm256_abs_epi8(ws), _mm256_sign_epi8(q, ws));
                let b = _mm256_maddubs_epi16(_mm256_set1_epi8(-128), q);
                _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones))
            }
        }
    }

    /// The register tile: TILE weight rows × C activation rows (i0..i0+C), all chunks, then the offsets.
    // Indexed loops over the const-sized register arrays: LLVM unrolls them and keeps `acc` in registers.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn tile<D: Dot, const C: usize, const SPLIT: bool>(
        p: &PanelView,
        a: &ActView,
        i0: usize,
        live: usize,
        out: &mut [f32],
    ) {
        let (cols, n) = (p.cols, a.n);
        let nch = cols / 32;
        let ng = p.o.len() / TILE;
        // SAFETY (all intrinsics below): register-only operations of AVX2/FMA, which every caller detected.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; TILE];
            for b in 0..nch {
                let mut w = [_mm256_setzero_si256(); TILE];
                let mut sw = [_mm256_setzero_ps(); TILE];
                for t in 0..TILE {
                    w[t] = load32(&p.u[t * cols + 32 * b..][..32]);
                    sw[t] = if SPLIT {
                        load8(&p.sl[t * cols / 4 + 8 * b..][..8])
                    } else {
                        _mm256_set1_ps(p.s[t * nch + b])
                    };
                }
                for c in 0..C {
                    let i = i0 + c;
                    let x = load32(&a.q[i * cols + 32 * b..][..32]);
                    let dx = _mm256_set1_ps(a.d[i * nch + b]);
                    for t in 0..TILE {
                        let l = _mm256_cvtepi32_ps(D::lanes(w[t], x));
                        acc[t][c] = _mm256_fmadd_ps(l, _mm256_mul_ps(sw[t], dx), acc[t][c]);
                    }
                }
            }
            for t in 0..live {
                for c in 0..C {
                    let i = i0 + c;
                    let off = dot_f32(&p.o[t * ng..(t + 1) * ng], &a.xs[i * ng..(i + 1) * ng]);
                    out[t * n + i] = hsum(acc[t][c]) + off;
                }
            }
        }
    }

    macro_rules! kernel {
        ($name:ident, $dot:ty, $c:expr, $features:literal) => {
            #[target_feature(enable = $features)]
            fn $name(p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
                let main = a.n / $c * $c;
                let mut i = 0;
                while i < main {
                    if p.split {
                        tile::<$dot, $c, true>(p, a, i, live, out);
                    } else {
                        tile::<$dot, $c, false>(p, a, i, live, out);
                    }
                    i += $c;
                }
                while i < a.n {
                    if p.split {
                        tile::<$dot, 1, true>(p, a, i, live, out);
                    } else {
                        tile::<$dot, 1, false>(p, a, i, live, out);
                    }
                    i += 1;
                }
            }
        };
    }

    kernel!(
        k_vnni512,
        Vnni512,
        4,
        "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni"
    );
    kernel!(k_vnniavx, VnniAvx, 2, "avx2,fma,avxvnni");
    kernel!(k_avx2, Maddubs, 2, "avx2,fma");
    kernel!(k_avx2_8, Maddubs8, 2, "avx2,fma");

    /// # Safety
    /// The CPU must have the features of `isa` (as `Isa::available` detected them).
    pub(super) unsafe fn quant_tile(isa: Isa, p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
        // SAFETY: the caller guarantees the features of `isa`; each arm calls only the kernel of `isa`.
        unsafe {
            match isa {
                Isa::Avx512Vnni => k_vnni512(p, a, live, out),
                Isa::AvxVnni => k_vnniavx(p, a, live, out),
                _ if p.max_code > 127 => k_avx2_8(p, a, live, out),
                _ => k_avx2(p, a, live, out),
            }
        }
    }

    /// The lane sums of one chunk with dot `D` (for the tests against the portable sums).
    #[cfg(test)]
    pub(crate) fn lanes_with(isa: Isa, u: &[u8], q: &[i8], wide: bool) -> [i32; 8] {
        #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
        fn v512(u: &[u8], q: &[i8]) -> __m256i {
            Vnni512::lanes(load32(u), load32(q))
        }
        #[target_feature(enable = "avx2,fma,avxvnni")]
        fn vavx(u: &[u8], q: &[i8]) -> __m256i {
            VnniAvx::lanes(load32(u), load32(q))
        }
        #[target_feature(enable = "avx2,fma")]
        fn m(u: &[u8], q: &[i8], wide: bool) -> __m256i {
            if wide {
                Maddubs8::lanes(load32(u), load32(q))
            } else {
                Maddubs::lanes(load32(u), load32(q))
            }
        }
        // SAFETY: the tests pass only instruction sets from `Isa::available`.
        let v = unsafe {
            match isa {
                Isa::Avx512Vnni => v512(u, q),
                Isa::AvxVnni => vavx(u, q),
                _ => m(u, q, wide),
            }
        };
        let mut l = [0i32; 8];
        // SAFETY: `l` is 32 writable bytes.
        unsafe { _mm256_storeu_si256(l.as_mut_ptr().cast(), v) };
        l
    }

    /// The f16 at byte `at` of every block of `row` into `out` (F16C, 8 blocks at a time), and, when `scaled` is
    /// not empty, each times `k` into `scaled` (the offsets `−8·d`, `−128·d`, exactly as the reference rounds them).
    #[target_feature(enable = "avx2,f16c")]
    fn block_halves(row: &[u8], bb: usize, at: usize, out: &mut [f32], scaled: &mut [f32], k: f32) {
        let nb = row.len() / bb;
        let full = nb / 8 * 8;
        let mut h = [0u8; 16];
        for b0 in (0..full).step_by(8) {
            for j in 0..8 {
                let p = (b0 + j) * bb + at;
                h[2 * j..2 * j + 2].copy_from_slice(&row[p..p + 2]);
            }
            let d = _mm256_cvtph_ps(load16(&h));
            store8(&mut out[b0..], d);
            if !scaled.is_empty() {
                store8(&mut scaled[b0..], _mm256_mul_ps(d, _mm256_set1_ps(k)));
            }
        }
        for b in full..nb {
            let d = reference::half_at(row, b * bb + at);
            out[b] = d;
            if !scaled.is_empty() {
                scaled[b] = k * d;
            }
        }
    }

    /// Converts f16 bytes to f32 with F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) fn f16_row(bytes: &[u8], out: &mut [f32]) {
        let full = (bytes.len() / 2).min(out.len()) / 8 * 8;
        for k in (0..full).step_by(8) {
            store8(&mut out[k..], _mm256_cvtph_ps(load16(&bytes[2 * k..])));
        }
        for k in full..(bytes.len() / 2).min(out.len()) {
            out[k] = reference::half_at(bytes, 2 * k);
        }
    }

    /// Stores 8 floats.
    #[inline(always)]
    fn store8(s: &mut [f32], v: __m256) {
        assert!(s.len() >= 8);
        // SAFETY: `s` holds at least 8 writable floats (asserted above); the store is unaligned.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
    }

    /// Unpacks one row with AVX2 (Q4_0, Q4_1, Q8_0 and the k-quants' codes; scales as the reference does).
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn unpack_row(format: BlockFormat, row: &[u8], v: RowView<'_>) {
        let bb = format.block_bytes();
        let low = _mm_set1_epi8(0x0F);
        let low32 = _mm256_set1_epi8(0x0F);
        match format {
            BlockFormat::Q4_0 | BlockFormat::Q4_1 => {
                let off = if format == BlockFormat::Q4_0 { 2 } else { 4 };
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let q = load16(&block[off..]);
                    let u = &mut v.u[32 * b..32 * b + 32];
                    store16(&mut u[..16], _mm_and_si128(q, low));
                    store16(&mut u[16..], _mm_and_si128(_mm_srli_epi16(q, 4), low));
                }
                if format == BlockFormat::Q4_0 {
                    block_halves(row, bb, 0, v.s, v.o, -8.0);
                } else {
                    block_halves(row, bb, 0, v.s, &mut [], 0.0);
                    block_halves(row, bb, 2, v.o, &mut [], 0.0);
                }
            }
            BlockFormat::Q8_0 => {
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let q = load32(&block[2..]);
                    store32(&mut v.u[32 * b..], _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                }
                block_halves(row, bb, 0, v.s, v.o, -128.0);
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let (d, min) = (reference::half_at(block, 0), reference::half_at(block, 2));
                    for j in 0..8 {
                        let (sc, m) = reference::scale_min_k4(j, &block[4..16]);
                        v.s[8 * b + j] = d * f32::from(sc);
                        v.o[8 * b + j] = -(min * f32::from(m));
                    }
                    let five = format == BlockFormat::Q5K;
                    let qs = if five { &block[48..] } else { &block[16..] };
                    let qh = if five {
                        load32(&block[16..])
                    } else {
                        _mm256_setzero_si256()
                    };
                    let one = _mm256_set1_epi8(1);
                    for pair in 0..4 {
                        let q = load32(&qs[32 * pair..]);
                        let mut lo = _mm256_and_si256(q, low32);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low32);
                        if five {
                            let sh = _mm_cvtsi32_si128(2 * pair as i32);
                            let h = _mm256_srl_epi16(qh, sh);
                            let b0 = _mm256_slli_epi16(_mm256_and_si256(h, one), 4);
                            let b1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 1), one), 4);
                            lo = _mm256_or_si256(lo, b0);
                            hi = _mm256_or_si256(hi, b1);
                        }
                        store32(&mut v.u[256 * b + 64 * pair..], lo);
                        store32(&mut v.u[256 * b + 64 * pair + 32..], hi);
                    }
                }
            }
            BlockFormat::Q6K => {
                let three = _mm256_set1_epi8(3);
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let d = reference::half_at(block, 208);
                    for k in 0..16 {
                        let s = d * f32::from(block[192 + k] as i8);
                        v.sl[64 * b + 4 * k..64 * b + 4 * k + 4].fill(s);
                        v.o[16 * b + k] = -32.0 * s;
                    }
                    for h in 0..2 {
                        let l0 = load32(&block[64 * h..]);
                        let l1 = load32(&block[64 * h + 32..]);
                        let qh = load32(&block[128 + 32 * h..]);
                        let hb = |s: i32| {
                            let x = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                            _mm256_slli_epi16(_mm256_and_si256(x, three), 4)
                        };
                        let codes = [
                            _mm256_or_si256(_mm256_and_si256(l0, low32), hb(0)),
                            _mm256_or_si256(_mm256_and_si256(l1, low32), hb(2)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low32), hb(4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low32), hb(6)),
                        ];
                        for (qi, c) in codes.into_iter().enumerate() {
                            store32(&mut v.u[256 * b + 128 * h + 32 * qi..], c);
                        }
                    }
                }
            }
            BlockFormat::F32 | BlockFormat::F16 => reference::unpack_row(format, row, v),
        }
    }
}

#[cfg(test)]
mod tests;
