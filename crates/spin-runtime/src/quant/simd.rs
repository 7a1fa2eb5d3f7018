//! The instruction-set kernels of the quantised products (and the 512-bit scores and weighted sums of the panel
//! attention, `kernels/panels.rs`, whose pulp code is built for eight lanes), and the only module of the workspace
//! that allows `unsafe`: `std::arch` loads and stores of 32 bytes at a time, and calls of `#[target_feature]`
//! functions after `is_x86_feature_detected!` said the CPU has the features. pulp (used by `kernels.rs`) has no VNNI
//! (`vpdpbusd`) operations, which is what the integer dot products need, hence std::arch here.
//!
//! Every routine has a portable twin in plain Rust performing the same arithmetic in the same order (fused
//! multiply-adds included), so the SIMD routines are tested against it bit for bit (`tests` below).
//! Instruction sets, best first: AVX-512 VNNI with AVX-512 BW/VL on 256-bit vectors (`vpdpbusd ymm`, 32 registers),
//! AVX-VNNI, AVX2 + FMA (`vpmaddubsw` + `vpmaddwd`), then the portable code. AMX is never used (it faults in some
//! virtual machines that advertise it).
#![allow(unsafe_code)]

use super::interleave;
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

/// The most activation rows one interleaved tile is applied to at a time (`QMatrix::rows_into`): eight on
/// Intel's cores, six elsewhere. Where 512-bit operations run on full-width units (Intel), groups of eight rows ran
/// 1.04–1.19× as fast as groups of six (Q4_0, Q5_0, the k-quants; Q4_1 and Q8_0 0.94–1.06×: the quant bench, n =
/// 40 and 64); on AMD's Zen 4, which splits them in two halves, groups of six ran 1.05–1.17× as fast as groups of
/// eight (Q4_0, Q4_1, Q5_0, Q8_0 on the 49,152-row heads at 40 and 64 rows): a group of eight rows of Q4_1 keeps
/// 27 vectors live besides its temporaries.
pub(crate) fn il_group_rows() -> usize {
    static ROWS: OnceLock<usize> = OnceLock::new();
    *ROWS.get_or_init(|| if genuine_intel() { 8 } else { 6 })
}

/// Whether the CPU's vendor string is Intel's.
fn genuine_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0 of `cpuid`: the vendor string, on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        [r.ebx, r.edx, r.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e]
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Quantises 32 values to signed codes (|q| ≤ 127, round to nearest, ties to even) and returns their scale
/// `max|x| / 127` (0 for an all-zero block; non-finite inputs give meaningless codes, never a panic).
pub(crate) fn quantise_block(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// The quantised activations of one call: codes, scale per 32 values, and `scale · Σ codes` per 32 and per 16.
pub(crate) struct QuantisedRows<'a> {
    pub q: &'a mut [i8],
    pub d: &'a mut [f32],
    pub xs32: &'a mut [f32],
    /// −8 · Σ codes per 32 values, exactly: Q4_0's offset (twice it Q5_0's, sixteen times Q8_0's), ready to start
    /// the interleaved kernels' integer chains as a broadcast from memory (scaled in the kernel, it took a
    /// general-register product and a broadcast from a general register, an extra vector operation per block
    /// and activation row).
    pub sx32: &'a mut [i32],
    pub xs16: &'a mut [f32],
}

/// Quantises `x` (a whole number of 32-value blocks) block by block, as [`quantise_block`] does.
pub(crate) fn quantise_rows(x: &[f32], out: QuantisedRows<'_>) {
    quantise_rows_with(Isa::best(), x, out);
}

pub(crate) fn quantise_rows_with(isa: Isa, x: &[f32], out: QuantisedRows<'_>) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: every x86 `Isa` but Portable comes from `Isa::available` after AVX2 and FMA were detected.
        unsafe { x86::quantise_rows(x, out) };
        return;
    }
    let _ = isa;
    for (g, (xb, qb)) in x.chunks_exact(32).zip(out.q.chunks_exact_mut(32)).enumerate() {
        let d = quantise_block(xb, qb);
        let lo: i32 = qb[..16].iter().map(|&v| i32::from(v)).sum();
        let hi: i32 = qb[16..].iter().map(|&v| i32::from(v)).sum();
        out.d[g] = d;
        out.xs16[2 * g] = d * lo as f32;
        out.xs16[2 * g + 1] = d * hi as f32;
        out.xs32[g] = d * (lo + hi) as f32;
        out.sx32[g] = -8 * (lo + hi);
    }
}

/// The activations of a k-quant product on the interleaved kernel: codes under one scale per 256 values (the
/// super-block of Q4_K, Q5_K and Q6_K, as ggml's Q8_K), the exact code sums per 32 values, and −32 times those per
/// 16 values (Q6_K's offset term, ready to start its integer chains: a broadcast from memory, where scaling it in
/// the kernel took a general-register product and move per chain, 5–7 % of Q6_K's time).
pub(crate) struct SuperRows<'a> {
    pub q: &'a mut [i8],
    /// One scale per 256 values.
    pub d: &'a mut [f32],
    pub sx32: &'a mut [i32],
    pub o16: &'a mut [i32],
}

/// Quantises `x` (a whole number of 256-value super-blocks) super-block by super-block: scale `max|x| / 127` over
/// the 256 values, codes as [`quantise_block`] makes them under that scale.
pub(crate) fn quantise_super_rows(x: &[f32], out: SuperRows<'_>) {
    quantise_super_rows_with(Isa::best(), x, out);
}

pub(crate) fn quantise_super_rows_with(isa: Isa, x: &[f32], out: SuperRows<'_>) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Portable {
        // SAFETY: every x86 `Isa` but Portable comes from `Isa::available` after AVX2 and FMA were detected.
        unsafe { x86::quantise_super_rows(x, out) };
        return;
    }
    let _ = isa;
    for (s, xs) in x.chunks_exact(256).enumerate() {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q = &mut out.q[256 * s..256 * s + 256];
        for (q, &v) in q.iter_mut().zip(xs) {
            *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        }
        out.d[s] = d;
        for g in 0..8 {
            let sum = |h: usize| q[16 * h..16 * h + 16].iter().map(|&v| i32::from(v)).sum::<i32>();
            let (lo, hi) = (sum(2 * g), sum(2 * g + 1));
            out.sx32[8 * s + g] = lo + hi;
            out.o16[16 * s + 2 * g] = -32 * lo;
            out.o16[16 * s + 2 * g + 1] = -32 * hi;
        }
    }
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
    portable::quant_tile::<false>(p, a, live, out);
}

/// Whether the 512-bit attention kernels ([`panel_scores`], [`panel_values`]) run on this CPU: where the interleaved
/// products do (AVX-512 VNNI) and AVX-512 DQ is there too (detected once).
pub(crate) fn attention512() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        return interleaved() && is_x86_feature_detected!("avx512dq");
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// The attention scores of `kernels/panels.rs` in 512-bit vectors of sixteen keys (two panel blocks): `s[r·nb + b]`
/// (the eight keys of block b against row r) for every row r of `q` (rows of hd scaled query values) and block
/// b < nb of `panels` (nb blocks of hd lane vectors). Each lane is one multiply-add chain over the channels in order
/// from zero, as the eight-lane kernel's, so the same bits (the blocks after those are prefetched: a hint, which
/// names bytes past the panels without reading them). Returns false, writing nothing, where the CPU lacks AVX-512.
///
/// # Panics
/// If the slices are shorter than the shapes say (caller bugs).
pub(crate) fn panel_scores(q: &[f32], hd: usize, panels: &[[f32; 8]], nb: usize, s: &mut [[f32; 8]]) -> bool {
    if !attention512() {
        return false;
    }
    let rows = q.len() / hd.max(1);
    assert!(rows > 0 && q.len() == rows * hd);
    assert!(panels.len() >= nb * hd && s.len() >= rows * nb);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `attention512` holds only where AVX-512 F/BW/VL/DQ/VNNI, AVX2 and FMA were detected; the lengths were
    // checked above.
    unsafe {
        x86::panel_scores(q, rows, hd, panels, nb, s)
    };
    true
}

/// The weights and values of [`panel_values`]: `rows` rows of weights, `nb` blocks of eight positions each (`w`,
/// row r's weight of position p at r·nb·8 + p), and the values of the first `most` positions, `hd` floats each
/// (`vals`); `ahead`, the values from the first position on, past `most` too (what is prefetched sixteen positions
/// ahead).
pub(crate) struct ValueSums<'a> {
    pub w: &'a [f32],
    pub nb: usize,
    pub rows: usize,
    pub vals: &'a [f32],
    pub ahead: &'a [f32],
    pub hd: usize,
    pub most: usize,
}

/// The exponential-weighted sums of values of `kernels/panels.rs` in 512-bit vectors, two rows at a time:
/// `out[r·hd + c] = Σ_{p < most} w[r·nb·8 + p] · vals[p·hd + c]` for channels c below the largest multiple of 64 in
/// hd (returned; the caller does the rest), positions in order from zero per lane, as the eight-lane kernel's, so
/// the same bits. Returns None, writing nothing, where the CPU lacks AVX-512.
///
/// # Panics
/// If the slices are shorter than the shapes say (caller bugs).
pub(crate) fn panel_values(v: &ValueSums<'_>, out: &mut [f32]) -> Option<usize> {
    if !attention512() {
        return None;
    }
    assert!(v.w.len() >= v.rows * v.nb * 8 && v.most <= v.nb * 8);
    assert!(v.vals.len() >= v.most * v.hd && out.len() >= v.rows * v.hd);
    #[cfg(target_arch = "x86_64")]
    {
        let done = v.hd / 64 * 64;
        // SAFETY: as in `panel_scores`.
        unsafe { x86::panel_values(v, done, out) };
        Some(done)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Whether the interleaved kernel ([`il_tile`]) runs vectorised on this CPU (AVX-512 VNNI); elsewhere the
/// matrices keep the file's layout and the panel kernels.
pub(crate) fn interleaved() -> bool {
    Isa::best() == Isa::Avx512Vnni
}

/// One interleaved tile (`tile`: its cols/32 tile-blocks, see `interleave.rs`) against activation rows `rows`:
/// `out[c · stride + r]` (r < ROWS ≤ stride) for the c-th of them. Vectorised where [`interleaved`] holds, the portable
/// `interleave::tile_product` (the same arithmetic in the same order, so the same bits) elsewhere.
///
/// # Panics
/// If the lengths disagree (caller bugs).
pub(crate) fn il_tile(
    format: BlockFormat,
    tile: &[u8],
    a: &interleave::Acts,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    il_tile_with(Isa::best(), format, tile, a, rows, out, stride);
}

pub(crate) fn il_tile_with(
    isa: Isa,
    format: BlockFormat,
    tile: &[u8],
    a: &interleave::Acts,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
    stride: usize,
) {
    let (nb, be) = (a.cols / 32, format.block_elems());
    assert!(interleave::supported(format) && a.cols.is_multiple_of(be));
    assert!(tile.len() >= a.cols / be * interleave::tile_block_bytes(format));
    assert!(a.q.len() >= rows.end * a.cols && a.sx.len() >= rows.end * nb);
    if format.super_scaled() {
        assert!(a.d.len() >= rows.end * (a.cols / 256) && a.o16.len() >= 2 * rows.end * nb);
    } else {
        assert!(
            a.d.len() >= rows.end * nb && a.xs.len() >= rows.end * nb && a.xs16.len() >= 2 * rows.end * nb
        );
    }
    assert!(
        stride >= interleave::ROWS
            && (rows.is_empty() || out.len() >= (rows.len() - 1) * stride + interleave::ROWS)
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni {
        // SAFETY: `Isa::Avx512Vnni` comes only from `Isa::available`, after AVX-512 F/BW/VL/VNNI, AVX2, FMA and
        // F16C were detected, the features `x86::il512` enables; the lengths it relies on are asserted above.
        unsafe { x86::il512(format, tile, a, rows, out, stride) };
        return;
    }
    let _ = isa;
    interleave::tile_product(format, tile, a, rows, out, stride);
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

/// The machine's integer peak for the benches: `iters` rounds of 12 independent `vpdpbusd` on 512-bit vectors
/// (64 multiply-adds each; 256-bit VNNI or AVX2 `vpmaddubsw` pairs on the other instruction sets, the portable
/// loop elsewhere). Returns the multiply-adds done and a checksum that keeps the loop alive.
pub(crate) fn peak_probe(iters: usize) -> (u64, i64) {
    #[cfg(target_arch = "x86_64")]
    if Isa::best() == Isa::Avx512Vnni {
        // SAFETY: `Isa::best` is Avx512Vnni only after AVX-512 F/BW/VL/VNNI were detected.
        return unsafe { x86::peak512(iters) };
    }
    let (u, q) = ([3u8; 32], [5i8; 32]);
    let mut s = 0i64;
    for _ in 0..iters {
        s += portable::lanes(std::hint::black_box(&u), &q)
            .iter()
            .map(|&v| i64::from(v))
            .sum::<i64>();
    }
    (iters as u64 * 32, s)
}

/// Eight chains of [`peak_probe`] with `fmas` (0 to 3; more count as 3) fused multiply-adds beside every eight `vpdpbusd`, on AVX-512 VNNI only
/// (None elsewhere): whether the float work of a block format's kernel shares the integer product's execution
/// ports. Returns the integer multiply-adds done and a checksum.
pub(crate) fn peak_probe_fma(iters: usize, fmas: usize) -> Option<(u64, i64)> {
    #[cfg(target_arch = "x86_64")]
    if Isa::best() == Isa::Avx512Vnni {
        // SAFETY: `Isa::best` is Avx512Vnni only after AVX-512 F/BW/VL/VNNI were detected (FMA with them).
        return Some(unsafe {
            match fmas {
                0 => x86::peak512_fma::<0>(iters),
                1 => x86::peak512_fma::<1>(iters),
                2 => x86::peak512_fma::<2>(iters),
                _ => x86::peak512_fma::<3>(iters),
            }
        });
    }
    let _ = (iters, fmas);
    None
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

    /// `PAIR`: the lane order of the 512-bit kernel (even chunks in lanes 0–7, odd ones in 8–15, added
    /// lane-wise at the end); otherwise 8 lanes for every chunk.
    pub(super) fn quant_tile<const PAIR: bool>(p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
        let (cols, n) = (p.cols, a.n);
        let nch = cols / 32;
        let ng = p.o.len() / TILE;
        for t in 0..live {
            for i in 0..n {
                let mut acc2 = [[0f32; 8]; 2];
                for b in 0..nch {
                    let acc = &mut acc2[if PAIR { b % 2 } else { 0 }];
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
                let acc: [f32; 8] = if PAIR {
                    std::array::from_fn(|k| acc2[0][k] + acc2[1][k])
                } else {
                    acc2[0]
                };
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

    /// Quantises whole 32-value blocks: the same codes and scales as the portable code (max is exact; the
    /// conversion rounds to nearest even, as `round_ties_even`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn quantise_rows(x: &[f32], out: QuantisedRows<'_>) {
        let blocks = x.len() / 32;
        assert!(out.q.len() >= 32 * blocks && out.d.len() >= blocks);
        assert!(out.xs32.len() >= blocks && out.xs16.len() >= 2 * blocks && out.sx32.len() >= blocks);
        for g in 0..blocks {
            let xb = &x[32 * g..32 * g + 32];
            let d = abs_max(xb) / 127.0;
            let (lo, hi) = codes32(xb, d, &mut out.q[32 * g..32 * g + 32]);
            out.d[g] = d;
            out.xs16[2 * g] = d * lo as f32;
            out.xs16[2 * g + 1] = d * hi as f32;
            out.xs32[g] = d * (lo + hi) as f32;
            out.sx32[g] = -8 * (lo + hi);
        }
    }

    /// [`super::quantise_super_rows`]: the same codes, scales and sums as the portable code.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn quantise_super_rows(x: &[f32], out: SuperRows<'_>) {
        let supers = x.len() / 256;
        assert!(out.q.len() >= 256 * supers && out.d.len() >= supers);
        assert!(out.sx32.len() >= 8 * supers && out.o16.len() >= 16 * supers);
        for s in 0..supers {
            let xs = &x[256 * s..256 * s + 256];
            let d = abs_max(xs) / 127.0;
            for g in 0..8 {
                let at = 256 * s + 32 * g;
                let (lo, hi) = codes32(&xs[32 * g..32 * g + 32], d, &mut out.q[at..at + 32]);
                out.o16[16 * s + 2 * g] = -32 * lo;
                out.o16[16 * s + 2 * g + 1] = -32 * hi;
                out.sx32[8 * s + g] = lo + hi;
            }
            out.d[s] = d;
        }
    }

    /// The largest |x| of a whole number of 8-value groups (exact: a maximum, in any order), reduced across the
    /// lanes in registers: through a stored vector, the eight scalar reloads waited on the store (a quantiser of
    /// five 576-wide rows took 2.1 µs, most of it there).
    #[inline(always)]
    fn abs_max(x: &[f32]) -> f32 {
        // SAFETY: register operations of AVX, which every caller (an `avx2` target-feature function) enables;
        // `load8` checks its length.
        unsafe {
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
            let mut m = _mm256_setzero_ps();
            for k in 0..x.len() / 8 {
                m = _mm256_max_ps(m, _mm256_and_ps(load8(&x[8 * k..]), abs));
            }
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps::<0x55>(h, h)))
        }
    }

    /// The codes of 32 values under scale `d` (round to nearest even, saturated to i8 as the portable clamp) into
    /// `q`, and the sums of the first and the last 16 codes.
    #[inline(always)]
    fn codes32(xb: &[f32], d: f32, q: &mut [i8]) -> (i32, i32) {
        // SAFETY: register operations of AVX2, which every caller (an `avx2` target-feature function) enables;
        // `load8` and `store32_i8` check their lengths.
        unsafe {
            let id = _mm256_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
            let v = [
                load8(&xb[..8]),
                load8(&xb[8..16]),
                load8(&xb[16..24]),
                load8(&xb[24..32]),
            ];
            let r = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
            let packed = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
            store32_i8(
                q,
                _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)),
            );
            (
                hsum_i32(_mm256_add_epi32(r[0], r[1])),
                hsum_i32(_mm256_add_epi32(r[2], r[3])),
            )
        }
    }

    /// The sum of the eight lanes (exact in any order), in registers (see [`abs_max`]).
    #[inline(always)]
    fn hsum_i32(v: __m256i) -> i32 {
        // SAFETY: register operations of AVX2, which every caller (an `avx2` target-feature function) enables.
        unsafe {
            let h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let h = _mm_add_epi32(h, _mm_shuffle_epi32::<0b01_00_11_10>(h));
            _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32::<0b10_11_00_01>(h)))
        }
    }

    /// Stores 32 signed bytes.
    #[inline(always)]
    fn store32_i8(s: &mut [i8], v: __m256i) {
        assert!(s.len() >= 32);
        // SAFETY: `s` holds at least 32 writable bytes (asserted above); the store is unaligned.
        unsafe { _mm256_storeu_si256(s.as_mut_ptr().cast(), v) }
    }

    /// Lane sums u·q of 32 unsigned codes and 32 signed activation codes, by instruction set.
    pub(crate) trait Dot {
        /// Whether it is exact for codes up to 255 (else up to 127).
        fn lanes(u: __m256i, q: __m256i) -> __m256i;
    }

    /// 256-bit `vpdpbusd` of AVX-512 VL (the tests' lane check; the products use the 512-bit form in `tile512`).
    #[cfg(test)]
    pub(crate) struct Vnni512;
    pub(crate) struct VnniAvx;
    pub(crate) struct Maddubs;
    pub(crate) struct Maddubs8;

    #[cfg(test)]
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
        // Every offset read below is inside these bounds (one check per tile instead of one per load).
        assert!(cols.is_multiple_of(32) && a.cols == cols && i0 + C <= n);
        assert!(p.u.len() >= TILE * cols && a.q.len() >= n * cols && a.d.len() >= n * nch);
        assert!(if SPLIT {
            p.sl.len() >= TILE * cols / 4
        } else {
            p.s.len() >= TILE * nch
        });
        let (up, qp, dp, sp, slp) = (
            p.u.as_ptr(),
            a.q.as_ptr(),
            a.d.as_ptr(),
            p.s.as_ptr(),
            p.sl.as_ptr(),
        );
        // SAFETY: the pointers are read at offsets t·cols + 32·b + [0, 32) (< TILE·cols), (i0 + c)·cols + 32·b +
        // [0, 32) (< n·cols), (i0 + c)·nch + b (< n·nch), t·nch + b (< TILE·nch) and t·cols/4 + 8·b + [0, 8)
        // (< TILE·cols/4) for t < TILE, c < C, b < nch, all within the lengths asserted above; loads are
        // unaligned; the other intrinsics are register operations of AVX2/FMA, which every caller detected.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); C]; TILE];
            for b in 0..nch {
                let mut w = [_mm256_setzero_si256(); TILE];
                let mut sw = [_mm256_setzero_ps(); TILE];
                for t in 0..TILE {
                    w[t] = _mm256_loadu_si256(up.add(t * cols + 32 * b).cast());
                    sw[t] = if SPLIT {
                        _mm256_loadu_ps(slp.add(t * cols / 4 + 8 * b))
                    } else {
                        _mm256_set1_ps(*sp.add(t * nch + b))
                    };
                }
                for c in 0..C {
                    let i = i0 + c;
                    let x = _mm256_loadu_si256(qp.add(i * cols + 32 * b).cast());
                    let dx = _mm256_set1_ps(*dp.add(i * nch + b));
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

    /// [`tile`] on 512-bit vectors: two chunks per instruction (chunk 2j in lanes 0–7, chunk 2j + 1 in lanes
    /// 8–15; an odd last chunk in lanes 0–7 with zero codes above), the two halves added lane-wise at the end;
    /// the order of `portable::quant_tile::<true>`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn tile512<const C: usize, const SPLIT: bool>(
        p: &PanelView,
        a: &ActView,
        i0: usize,
        live: usize,
        out: &mut [f32],
    ) {
        let (cols, n) = (p.cols, a.n);
        let nch = cols / 32;
        let ng = p.o.len() / TILE;
        assert!(cols.is_multiple_of(32) && a.cols == cols && i0 + C <= n);
        assert!(p.u.len() >= TILE * cols && a.q.len() >= n * cols && a.d.len() >= n * nch);
        assert!(if SPLIT {
            p.sl.len() >= TILE * cols / 4
        } else {
            p.s.len() >= TILE * nch
        });
        let (up, qp, dp, sp, slp) = (
            p.u.as_ptr(),
            a.q.as_ptr(),
            a.d.as_ptr(),
            p.s.as_ptr(),
            p.sl.as_ptr(),
        );
        // SAFETY: as in `tile`: every offset is below the lengths asserted above. Full 64-byte loads read chunks
        // b, b + 1 < nch of one row; the odd last chunk is read with a 32-byte mask (masked bytes are not
        // accessed); scalar pairs are read at b, b + 1 < nch of one row. AVX-512 F/BW/VL/VNNI are enabled by the
        // only caller, `k_vnni512`, which runs after they were detected.
        unsafe {
            let idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
            let pair = |ptr: *const f32| {
                _mm512_permutexvar_ps(
                    idx,
                    _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(ptr.cast()))),
                )
            };
            let mut acc = [[_mm512_setzero_ps(); C]; TILE];
            let mut b = 0;
            while b < nch {
                let two = b + 1 < nch;
                let mut w = [_mm512_setzero_si512(); TILE];
                let mut sw = [_mm512_setzero_ps(); TILE];
                for t in 0..TILE {
                    let at = up.add(t * cols + 32 * b);
                    w[t] = if two {
                        _mm512_loadu_si512(at.cast())
                    } else {
                        _mm512_maskz_loadu_epi8(0xFFFF_FFFF, at.cast())
                    };
                    sw[t] = if SPLIT {
                        if two {
                            _mm512_loadu_ps(slp.add(t * cols / 4 + 8 * b))
                        } else {
                            _mm512_maskz_loadu_ps(0x00FF, slp.add(t * cols / 4 + 8 * b))
                        }
                    } else if two {
                        pair(sp.add(t * nch + b))
                    } else {
                        _mm512_set1_ps(*sp.add(t * nch + b))
                    };
                }
                for c in 0..C {
                    let i = i0 + c;
                    let at = qp.add(i * cols + 32 * b);
                    let (x, dx) = if two {
                        (_mm512_loadu_si512(at.cast()), pair(dp.add(i * nch + b)))
                    } else {
                        (
                            _mm512_maskz_loadu_epi8(0xFFFF_FFFF, at.cast()),
                            _mm512_set1_ps(*dp.add(i * nch + b)),
                        )
                    };
                    for t in 0..TILE {
                        let l = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[t], x));
                        acc[t][c] = _mm512_fmadd_ps(l, _mm512_mul_ps(sw[t], dx), acc[t][c]);
                    }
                }
                b += 2;
            }
            for t in 0..live {
                for c in 0..C {
                    let i = i0 + c;
                    let v = acc[t][c];
                    let lo = _mm512_castps512_ps256(v);
                    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
                    let off = dot_f32(&p.o[t * ng..(t + 1) * ng], &a.xs[i * ng..(i + 1) * ng]);
                    out[t * n + i] = hsum(_mm256_add_ps(lo, hi)) + off;
                }
            }
        }
    }

    // The formats of the interleaved kernel as const parameters: one copy of its loop per format.
    const Q4_0: u8 = 0;
    const Q4_1: u8 = 1;
    const Q5_0: u8 = 2;
    const Q8_0: u8 = 3;
    const Q4K: u8 = 4;
    const Q6K: u8 = 5;
    const Q5K: u8 = 6;
    const Q5_1: u8 = 7;

    /// [`super::il_tile`] on AVX-512 VNNI: activation rows in groups of four, then one at a time.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) fn il512(
        format: BlockFormat,
        tile: &[u8],
        a: &interleave::Acts,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        // Five to eight rows (a verification of 4 to 7 drafted tokens) go through a tile in one group
        // (`il512_wide`), every format: with no closures left in the k-quants' groups, one group of five ran Q4_K
        // at 1.13, Q5_K at 1.27 and Q6_K at 1.20 of a group of four and one of the rest (the quant bench, n = 5).
        if (5..=8).contains(&rows.len()) {
            il512_wide(format, tile, a, rows, out, stride);
            return;
        }
        match format {
            BlockFormat::Q4_0 => il_rows::<Q4_0>(tile, a, rows, out, stride),
            BlockFormat::Q4_1 => il_rows::<Q4_1>(tile, a, rows, out, stride),
            BlockFormat::Q5_0 => il_rows::<Q5_0>(tile, a, rows, out, stride),
            BlockFormat::Q5_1 => il_rows::<Q5_1>(tile, a, rows, out, stride),
            BlockFormat::Q8_0 => il_rows::<Q8_0>(tile, a, rows, out, stride),
            BlockFormat::Q4K => il_rows::<Q4K>(tile, a, rows, out, stride),
            BlockFormat::Q5K => il_rows::<Q5K>(tile, a, rows, out, stride),
            BlockFormat::Q6K => il_rows::<Q6K>(tile, a, rows, out, stride),
            _ => unreachable!("il512 runs only on interleaved formats"),
        }
    }

    /// Five to eight activation rows of a tile in one group: as a group of four and one of the rest, the second
    /// would load and unpack the tile's codes and scales again for one to four rows. A
    /// function of its own, never inlined, so that [`il512`]'s code for the other formats is compiled as it was:
    /// inlined there, the wider groups made the inliner leave the k-quants' closures out of line (now plain loops,
    /// see `il_group_k4`), and a Q4_K_M step took twice as long.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    #[inline(never)]
    fn il512_wide(
        format: BlockFormat,
        tile: &[u8],
        a: &interleave::Acts,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        let i0 = rows.start;
        match (format, rows.len()) {
            (BlockFormat::Q4_0, 5) => il_group::<Q4_0, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q4_0, 6) => il_group::<Q4_0, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q4_0, 7) => il_group::<Q4_0, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q4_0, 8) => il_group::<Q4_0, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q4_1, 5) => il_group::<Q4_1, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q4_1, 6) => il_group::<Q4_1, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q4_1, 7) => il_group::<Q4_1, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q4_1, 8) => il_group::<Q4_1, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q5_0, 5) => il_group::<Q5_0, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q5_0, 6) => il_group::<Q5_0, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q5_0, 7) => il_group::<Q5_0, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q5_0, 8) => il_group::<Q5_0, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q5_1, 5) => il_group::<Q5_1, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q5_1, 6) => il_group::<Q5_1, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q5_1, 7) => il_group::<Q5_1, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q5_1, 8) => il_group::<Q5_1, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q8_0, 5) => il_group::<Q8_0, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q8_0, 6) => il_group::<Q8_0, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q8_0, 7) => il_group::<Q8_0, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q8_0, 8) => il_group::<Q8_0, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q4K, 5) => il_group_k4::<Q4K, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q4K, 6) => il_group_k4::<Q4K, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q4K, 7) => il_group_k4::<Q4K, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q4K, 8) => il_group_k4::<Q4K, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q5K, 5) => il_group_k4::<Q5K, 5>(tile, a, i0, out, stride),
            (BlockFormat::Q5K, 6) => il_group_k4::<Q5K, 6>(tile, a, i0, out, stride),
            (BlockFormat::Q5K, 7) => il_group_k4::<Q5K, 7>(tile, a, i0, out, stride),
            (BlockFormat::Q5K, 8) => il_group_k4::<Q5K, 8>(tile, a, i0, out, stride),
            (BlockFormat::Q6K, 5) => il_group_q6k::<5>(tile, a, i0, out, stride),
            (BlockFormat::Q6K, 6) => il_group_q6k::<6>(tile, a, i0, out, stride),
            (BlockFormat::Q6K, 7) => il_group_q6k::<7>(tile, a, i0, out, stride),
            (BlockFormat::Q6K, 8) => il_group_q6k::<8>(tile, a, i0, out, stride),
            _ => unreachable!("il512_wide runs only on 5 to 8 rows of the 32-value block formats"),
        }
    }

    #[inline(always)]
    fn il_rows<const F: u8>(
        tile: &[u8],
        a: &interleave::Acts,
        rows: std::ops::Range<usize>,
        out: &mut [f32],
        stride: usize,
    ) {
        let (start, n) = (rows.start, rows.len());
        let main = n / 4 * 4;
        let mut c = 0;
        while c < main {
            il_group_any::<F, 4>(tile, a, start + c, &mut out[c * stride..], stride);
            c += 4;
        }
        // The last one to three rows go in one group too: each extra pass over the tile would unpack its codes
        // and scales again (a pass of 2 or 3 positions, the usual verification, is all remainder).
        match n - main {
            3 => il_group_any::<F, 3>(tile, a, start + c, &mut out[c * stride..], stride),
            2 => il_group_any::<F, 2>(tile, a, start + c, &mut out[c * stride..], stride),
            1 => il_group_any::<F, 1>(tile, a, start + c, &mut out[c * stride..], stride),
            _ => {}
        }
    }

    #[inline(always)]
    fn il_group_any<const F: u8, const C: usize>(
        tile: &[u8],
        a: &interleave::Acts,
        i0: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        if F == Q4K || F == Q5K {
            il_group_k4::<F, C>(tile, a, i0, out, stride);
        } else if F == Q6K {
            il_group_q6k::<C>(tile, a, i0, out, stride);
        } else {
            il_group::<F, C>(tile, a, i0, out, stride);
        }
    }

    /// [`super::panel_scores`].
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn panel_scores(
        q: &[f32],
        rows: usize,
        hd: usize,
        panels: &[[f32; 8]],
        nb: usize,
        s: &mut [[f32; 8]],
    ) {
        let mut r = 0;
        while r < rows {
            match rows - r {
                1 => scores_rows::<1>(q, r, hd, panels, nb, s),
                2 => scores_rows::<2>(q, r, hd, panels, nb, s),
                3 => scores_rows::<3>(q, r, hd, panels, nb, s),
                4 => scores_rows::<4>(q, r, hd, panels, nb, s),
                5 => scores_rows::<5>(q, r, hd, panels, nb, s),
                _ => scores_rows::<6>(q, r, hd, panels, nb, s),
            }
            r += 6;
        }
    }

    /// Rows r0 .. r0 + R of [`panel_scores`], four blocks (two 512-bit vectors of sixteen keys) at a time.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn scores_rows<const R: usize>(
        q: &[f32],
        r0: usize,
        hd: usize,
        panels: &[[f32; 8]],
        nb: usize,
        s: &mut [[f32; 8]],
    ) {
        // SAFETY: query reads at (r0 + r)·hd + c with r0 + r < rows, c < hd (q holds rows·hd); panel reads at
        // (b·hd + c)·8 + [0, 8) with b < nb (panels hold nb·hd lane vectors); stores to s at (r0 + r)·nb + b, b < nb
        // (s holds rows·nb); prefetches name any address and never fault.
        unsafe {
            let (qb, pb) = (q.as_ptr(), panels.as_ptr().cast::<f32>());
            let sp = s.as_mut_ptr().cast::<f32>();
            // Macros, not closures: a closure left out of line would not inherit the target features.
            macro_rules! two {
                ($b:expr, $c:expr) => {
                    _mm512_insertf32x8::<1>(
                        _mm512_castps256_ps512(_mm256_loadu_ps(pb.add(($b * hd + $c) * 8))),
                        _mm256_loadu_ps(pb.add((($b + 1) * hd + $c) * 8)),
                    )
                };
            }
            macro_rules! store2 {
                ($r:expr, $b:expr, $v:expr) => {{
                    let v = $v;
                    _mm256_storeu_ps(sp.add(((r0 + $r) * nb + $b) * 8), _mm512_castps512_ps256(v));
                    _mm256_storeu_ps(
                        sp.add(((r0 + $r) * nb + $b + 1) * 8),
                        _mm512_extractf32x8_ps::<1>(v),
                    );
                }};
            }
            let mut b = 0;
            while b + 4 <= nb {
                let mut acc = [[_mm512_setzero_ps(); 2]; R];
                for c in 0..hd {
                    if c % 2 == 0 {
                        // The next four blocks' panels, a line (two channels) of each per two channels.
                        for i in 4..8 {
                            _mm_prefetch::<_MM_HINT_T0>(pb.wrapping_add(((b + i) * hd + c) * 8).cast());
                        }
                    }
                    let (k0, k1) = (two!(b, c), two!(b + 2, c));
                    for r in 0..R {
                        let x = _mm512_set1_ps(*qb.add((r0 + r) * hd + c));
                        acc[r][0] = _mm512_fmadd_ps(x, k0, acc[r][0]);
                        acc[r][1] = _mm512_fmadd_ps(x, k1, acc[r][1]);
                    }
                }
                for r in 0..R {
                    store2!(r, b, acc[r][0]);
                    store2!(r, b + 2, acc[r][1]);
                }
                b += 4;
            }
            if b + 2 <= nb {
                let mut acc = [_mm512_setzero_ps(); R];
                for c in 0..hd {
                    let k0 = two!(b, c);
                    for r in 0..R {
                        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(*qb.add((r0 + r) * hd + c)), k0, acc[r]);
                    }
                }
                for r in 0..R {
                    store2!(r, b, acc[r]);
                }
                b += 2;
            }
            if b < nb {
                let mut acc = [_mm256_setzero_ps(); R];
                for c in 0..hd {
                    let k0 = _mm256_loadu_ps(pb.add((b * hd + c) * 8));
                    for r in 0..R {
                        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(*qb.add((r0 + r) * hd + c)), k0, acc[r]);
                    }
                }
                for r in 0..R {
                    _mm256_storeu_ps(sp.add(((r0 + r) * nb + b) * 8), acc[r]);
                }
            }
        }
    }

    /// [`super::panel_values`] for channels below `done` (a multiple of 64).
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512dq")]
    pub(super) fn panel_values(v: &ValueSums<'_>, done: usize, out: &mut [f32]) {
        let mut r = 0;
        while r < v.rows {
            if v.rows - r >= 2 {
                values_rows::<2>(v, r, done, out);
                r += 2;
            } else {
                values_rows::<1>(v, r, done, out);
                r += 1;
            }
        }
    }

    /// Rows r0 .. r0 + R of [`panel_values`], 64 channels (four vectors) at a time.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    fn values_rows<const R: usize>(v: &ValueSums<'_>, r0: usize, done: usize, out: &mut [f32]) {
        let (w, nb, vals, ahead, hd, most) = (v.w, v.nb, v.vals, v.ahead, v.hd, v.most);
        // SAFETY: weight reads at (r0 + r)·nb·8 + p with r0 + r < rows and p < most ≤ nb·8 (w holds rows·nb·8);
        // value reads at p·hd + c0 + [0, 64) with p < most, c0 + 64 ≤ done ≤ hd (vals holds most·hd); stores at
        // (r0 + r)·hd + c0 + [0, 64) < rows·hd (out's length, checked by the caller); prefetches never fault.
        unsafe {
            let (wp, vp, ap, op) = (w.as_ptr(), vals.as_ptr(), ahead.as_ptr(), out.as_mut_ptr());
            let mut c0 = 0;
            while c0 < done {
                let mut acc = [[_mm512_setzero_ps(); 4]; R];
                for p in 0..most {
                    if r0 == 0 {
                        // Sixteen positions ahead, each line of the value row this sweep reads.
                        for l in 0..4 {
                            _mm_prefetch::<_MM_HINT_T0>(ap.wrapping_add((p + 16) * hd + c0 + 16 * l).cast());
                        }
                    }
                    let x = [
                        _mm512_loadu_ps(vp.add(p * hd + c0)),
                        _mm512_loadu_ps(vp.add(p * hd + c0 + 16)),
                        _mm512_loadu_ps(vp.add(p * hd + c0 + 32)),
                        _mm512_loadu_ps(vp.add(p * hd + c0 + 48)),
                    ];
                    for r in 0..R {
                        let wr = _mm512_set1_ps(*wp.add((r0 + r) * nb * 8 + p));
                        for v in 0..4 {
                            acc[r][v] = _mm512_fmadd_ps(wr, x[v], acc[r][v]);
                        }
                    }
                }
                for r in 0..R {
                    for v in 0..4 {
                        _mm512_storeu_ps(op.add((r0 + r) * hd + c0 + 16 * v), acc[r][v]);
                    }
                }
                c0 += 64;
            }
        }
    }

    /// How far ahead of the tile-block being read the kernels ask for the weights, in bytes. The hardware
    /// prefetchers did not keep the stream ahead: in a profile of a 5-position pass the kernel's time sat on the
    /// first use of each loaded tile-block, and asking for the bytes 4 KiB ahead cut passes of 1 and 5 positions on
    /// one thread by 1.3-1.8x on an Intel Xeon (`measure pass-cost`, 1, 2, 4, 6, 8, 16 and 32 KiB alternating; 4
    /// to 8 were best, 32 worse again; into L1 better than into L2: docs/runtime.md, "Weights 4 KiB ahead").
    const AHEAD: usize = 4096;

    /// Asks for the cache lines of `bytes` bytes from `p + AHEAD` (a hint: no result depends on it).
    #[inline(always)]
    fn prefetch_ahead(p: *const u8, bytes: usize) {
        let mut l = 0;
        while l < bytes {
            // SAFETY: `prefetcht0` reads nothing architecturally and never faults, whatever the address; the
            // address is formed with `wrapping_add`, which is defined for any offset (beyond the matrix's last
            // tile it names bytes the kernel never reads).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD + l).cast()) };
            l += 64;
        }
    }

    /// One tile against activation rows i0 .. i0 + C, into `out[c · stride + r]`.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn il_group<const F: u8, const C: usize>(
        tile: &[u8],
        a: &interleave::Acts,
        i0: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let format = match F {
            Q4_0 => BlockFormat::Q4_0,
            Q4_1 => BlockFormat::Q4_1,
            Q5_0 => BlockFormat::Q5_0,
            Q5_1 => BlockFormat::Q5_1,
            _ => BlockFormat::Q8_0,
        };
        let (cols, nb) = (a.cols, a.cols / 32);
        let tb = interleave::tile_block_bytes(format);
        let ca = interleave::codes_at(format);
        // Every read below is inside these bounds (checked once per group, not per load).
        assert!(tile.len() >= nb * tb && a.q.len() >= (i0 + C) * cols);
        assert!(
            a.d.len() >= (i0 + C) * nb
                && a.xs.len() >= (i0 + C) * nb
                && stride >= 16
                && out.len() >= (C - 1) * stride + 16
        );
        assert!(a.sx.len() >= (i0 + C) * nb);
        let (tp, qp, dp, xp, sxp) = (
            tile.as_ptr(),
            a.q.as_ptr(),
            a.d.as_ptr(),
            a.xs.as_ptr(),
            a.sx.as_ptr(),
        );
        // The offset of Q4_0, Q5_0 and Q8_0 is a whole multiple of the scale: it joins the integer sum.
        // The parts of a tile-block (`interleave.rs`: scales 32 bytes at 0, mins 32 at 32, fifth-bit bytes 64 at
        // 32 (Q5_0) or 64 (Q5_1), codes 256 or 512 at `ca`) end by tb.
        // SAFETY: tile reads at b·tb + [0, tb) < nb·tb; activation reads at (i0 + c)·cols + 32·b + [0, 32) and
        // (i0 + c)·nb + b, stores at c·stride + [0, 16), c < C: inside the lengths asserted above; unaligned loads and
        // stores; `il512`, the only caller, enables the features after they were detected.
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            let mut acc = [_mm512_setzero_ps(); C];
            let mut off = [_mm512_setzero_ps(); C];
            for b in 0..nb {
                let p = tp.add(b * tb);
                prefetch_ahead(p, tb);
                let s = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
                let mins = if F == Q4_1 || F == Q5_1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast()))
                } else {
                    _mm512_setzero_ps()
                };
                let cp = p.add(ca);
                let mut w = [_mm512_setzero_si512(); 8];
                if F == Q8_0 {
                    for g in 0..8 {
                        w[g] = _mm512_loadu_si512(cp.add(64 * g).cast());
                    }
                } else {
                    for h in 0..4 {
                        let v = _mm512_loadu_si512(cp.add(64 * h).cast());
                        w[h] = _mm512_and_si512(v, nib);
                        w[h + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib);
                    }
                    if F == Q5_0 || F == Q5_1 {
                        // Bit g of each fifth-bit byte into group g's codes.
                        let f = _mm512_loadu_si512(p.add(interleave::fifth_bits_at(format)).cast());
                        for g in 0..8 {
                            w[g] = with_fifth_bit(w[g], f, g);
                        }
                    }
                }
                for c in 0..C {
                    let i = i0 + c;
                    // −8 · Σ codes, broadcast from memory: Q4_0's offset on the even chain, Q5_0's on both.
                    // Q8_0's, sixteen times it, is scaled in a general register and broadcast from there: a
                    // vector shift of the broadcast ran Q8_0 at 0.92–0.95 of that (the quant bench, n = 5 to 64).
                    let o = sxp.add(i * nb + b);
                    let zero = _mm512_setzero_si512();
                    let (even, odd) = match F {
                        Q4_0 => (_mm512_set1_epi32(*o), zero),
                        Q5_0 => (_mm512_set1_epi32(*o), _mm512_set1_epi32(*o)),
                        Q8_0 => (_mm512_set1_epi32(16 * *o), zero),
                        _ => (zero, zero),
                    };
                    let isum = block_sum(even, odd, &w, qp.add(i * cols + 32 * b));
                    let sdx = _mm512_mul_ps(s, _mm512_set1_ps(*dp.add(i * nb + b)));
                    acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sdx, acc[c]);
                    if F == Q4_1 || F == Q5_1 {
                        off[c] = _mm512_fmadd_ps(mins, _mm512_set1_ps(*xp.add(i * nb + b)), off[c]);
                    }
                }
            }
            for c in 0..C {
                _mm512_storeu_ps(out.as_mut_ptr().add(c * stride), _mm512_add_ps(acc[c], off[c]));
            }
        }
    }

    /// The integer sums of one 32-value block in all 16 lanes: `vpdpbusd` of each group's codes `w[g]` with
    /// activation codes 4g .. 4g + 4 at `xq` broadcast, in two chains (the even groups' from `even`, the odd ones'
    /// from `odd`: where a format's offset starts them) added at the end (integer sums: exact in any order).
    ///
    /// # Safety
    /// `xq` points to 32 readable activation codes; the caller enables AVX-512 F and VNNI.
    #[inline(always)]
    unsafe fn block_sum(even: __m512i, odd: __m512i, w: &[__m512i; 8], xq: *const i8) -> __m512i {
        // SAFETY: the reads are at xq + [0, 32), which the caller guarantees readable; they are unaligned; the
        // rest are register operations of the features the caller enabled.
        unsafe {
            // Four activation codes as one i32 (a plain read: an intrinsic inside a closure would not inherit the
            // caller's target features, and would become a call wherever the inliner left the closure out).
            let x4 = |g: usize| xq.add(4 * g).cast::<i32>().read_unaligned();
            let mut even = _mm512_dpbusd_epi32(even, w[0], _mm512_set1_epi32(x4(0)));
            let mut odd = _mm512_dpbusd_epi32(odd, w[1], _mm512_set1_epi32(x4(1)));
            for g in (2..8).step_by(2) {
                even = _mm512_dpbusd_epi32(even, w[g], _mm512_set1_epi32(x4(g)));
                odd = _mm512_dpbusd_epi32(odd, w[g + 1], _mm512_set1_epi32(x4(g + 1)));
            }
            _mm512_add_epi32(even, odd)
        }
    }

    /// Codes below 16 (`codes`) with bit `bit` of every byte of `bits` as their fifth bit (16): the bit shifted to
    /// bit 4 by a 16-bit shift (the 0x10 mask drops what crossed from the neighbouring byte) and or-ed in by one
    /// ternary logic op, A | (B & C). Q5_0's and Q5_1's fifth-bit bytes hold group g's bit in bit g, Q5_K's
    /// sub-block j's in bit j.
    ///
    /// # Safety
    /// The caller enables AVX-512 F and BW.
    #[inline(always)]
    unsafe fn with_fifth_bit(codes: __m512i, bits: __m512i, bit: usize) -> __m512i {
        // SAFETY: register operations of the features the caller enabled.
        unsafe {
            let at4 = match bit {
                0 => _mm512_slli_epi16::<4>(bits),
                1 => _mm512_slli_epi16::<3>(bits),
                2 => _mm512_slli_epi16::<2>(bits),
                3 => _mm512_slli_epi16::<1>(bits),
                4 => bits,
                5 => _mm512_srli_epi16::<1>(bits),
                6 => _mm512_srli_epi16::<2>(bits),
                _ => _mm512_srli_epi16::<3>(bits),
            };
            _mm512_ternarylogic_epi32::<0xF8>(codes, at4, _mm512_set1_epi8(16))
        }
    }

    /// [`il_group`] for Q4_K and Q5_K, on activations with one scale per super-block (`Acts::d`, per 256 values):
    /// per super-block the 6-bit sub-block scales and mins of the 16 rows are unpacked in 128-bit vectors (byte k
    /// of every row together); each 32-value sub-block's integer sums go under its scale into one float sum per
    /// row, the mins meet the activations' exact code sums in integers (`vpmaddwd`, two sub-blocks a lane), and
    /// the super-block's `d · dx` and `dmin · dx` are applied once: twelve float operations per row and
    /// super-block beside 64 `vpdpbusd`, where scales per 32 values needed 24. Q5_K's fifth bits are added to
    /// the codes (16 where bit j of the fifth-bit byte is set).
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn il_group_k4<const F: u8, const C: usize>(
        tile: &[u8],
        a: &interleave::Acts,
        i0: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let (cols, nch, nsb) = (a.cols, a.cols / 32, a.cols / 256);
        let format = if F == Q5K {
            BlockFormat::Q5K
        } else {
            BlockFormat::Q4K
        };
        let tb = interleave::tile_block_bytes(format);
        assert!(tile.len() >= nsb * tb && a.q.len() >= (i0 + C) * cols);
        assert!(
            a.d.len() >= (i0 + C) * nsb
                && a.sx.len() >= (i0 + C) * nch
                && stride >= 16
                && out.len() >= (C - 1) * stride + 16
        );
        let (tp, qp, dp, sp) = (tile.as_ptr(), a.q.as_ptr(), a.d.as_ptr(), a.sx.as_ptr());
        // A tile-block: scales 32 bytes at 0, mins 32 at 32, twelve 16-byte scale vectors at 64, codes 2048 at 256,
        // for Q5_K the fifth bits 512 at 2304.
        // SAFETY: tile reads at b·tb + [0, tb) < nsb·tb (tb = 2304, Q5_K 2816); activation reads at (i0 + c)·cols +
        // 256·b + 32·j + [0, 32), (i0 + c)·nsb + b and (i0 + c)·nch + 8·b + [0, 8), stores at c·stride + [0, 16),
        // b < nsb, j < 8, c < C: inside the lengths asserted above; unaligned loads and stores; `il512`, the only
        // caller, enables the features after detecting them.
        unsafe {
            let nib = _mm512_set1_epi8(0x0F);
            let (m63, m15, m3) = (_mm_set1_epi8(63), _mm_set1_epi8(15), _mm_set1_epi8(3));
            let mut acc = [_mm512_setzero_ps(); C];
            for b in 0..nsb {
                let p = tp.add(b * tb);
                // No closures here or below: a closure does not inherit the caller's target features, and when the
                // inliner left one out of line its intrinsics became calls (a Q4_K_M step took twice as long).
                let mut t = [_mm512_setzero_ps(); C];
                // Lane r: m_{2k} of row r in its low 16 bits, m_{2k+1} in its high ones.
                let mut mins = [_mm512_setzero_si512(); 4];
                for j in 0..8 {
                    // An eighth of the tile-block ahead per sub-block: spread, not a burst of 36-44 lines.
                    prefetch_ahead(p.wrapping_add(j * tb / 8), tb / 8);
                    // `reference::scale_min_k4` on 16 rows at once (byte shifts as masked 16-bit ones).
                    let qv = |k: usize| p.add(64 + 16 * k).cast::<__m128i>();
                    let (sc, m) = if j < 4 {
                        (
                            _mm_and_si128(_mm_loadu_si128(qv(j)), m63),
                            _mm_and_si128(_mm_loadu_si128(qv(j + 4)), m63),
                        )
                    } else {
                        let (lo, hi, mh) = (
                            _mm_loadu_si128(qv(j - 4)),
                            _mm_loadu_si128(qv(j + 4)),
                            _mm_loadu_si128(qv(j)),
                        );
                        (
                            _mm_or_si128(
                                _mm_and_si128(hi, m15),
                                _mm_slli_epi16::<4>(_mm_and_si128(_mm_srli_epi16::<6>(lo), m3)),
                            ),
                            _mm_or_si128(
                                _mm_and_si128(_mm_srli_epi16::<4>(hi), m15),
                                _mm_slli_epi16::<4>(_mm_and_si128(_mm_srli_epi16::<6>(mh), m3)),
                            ),
                        )
                    };
                    let s = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc));
                    let m = _mm512_cvtepu8_epi32(m);
                    mins[j / 2] = if j % 2 == 0 {
                        m
                    } else {
                        _mm512_or_si512(mins[j / 2], _mm512_slli_epi32::<16>(m))
                    };
                    let cp = p.add(256 + 512 * (j / 2));
                    let mut w = [_mm512_setzero_si512(); 8];
                    for (h, w) in w.iter_mut().enumerate() {
                        let v = _mm512_loadu_si512(cp.add(64 * h).cast());
                        *w = if j % 2 == 0 {
                            _mm512_and_si512(v, nib)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(v), nib)
                        };
                        if F == Q5K {
                            // Bit j of each fifth-bit byte into the codes.
                            let fifth = _mm512_loadu_si512(p.add(interleave::Q5K_FIFTH_AT + 64 * h).cast());
                            *w = with_fifth_bit(*w, fifth, j);
                        }
                    }
                    for c in 0..C {
                        let i = i0 + c;
                        let zero = _mm512_setzero_si512();
                        let isum = block_sum(zero, zero, &w, qp.add(i * cols + 256 * b + 32 * j));
                        t[c] = if j == 0 {
                            _mm512_mul_ps(_mm512_cvtepi32_ps(isum), s)
                        } else {
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), s, t[c])
                        };
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32).cast()));
                for c in 0..C {
                    let i = i0 + c;
                    // The activations' code sums of sub-blocks 2k and 2k + 1 as two i16 (|Σ| ≤ 32 · 127).
                    let sx = sp.add(i * nch + 8 * b);
                    let mut mi = _mm512_setzero_si512();
                    for k in 0..4 {
                        let pair = (*sx.add(2 * k) & 0xFFFF) | (*sx.add(2 * k + 1) << 16);
                        mi = _mm512_add_epi32(mi, _mm512_madd_epi16(mins[k], _mm512_set1_epi32(pair)));
                    }
                    let dx = _mm512_set1_ps(*dp.add(i * nsb + b));
                    acc[c] = _mm512_fmadd_ps(t[c], _mm512_mul_ps(d, dx), acc[c]);
                    acc[c] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(dmin, dx), acc[c]);
                }
            }
            for c in 0..C {
                _mm512_storeu_ps(out.as_mut_ptr().add(c * stride), acc[c]);
            }
        }
    }

    /// [`il_group`] for Q6_K, on activations with one scale per super-block (`Acts::d`, per 256 values): per
    /// chunk of 32 values the six-bit codes of 16 rows are put together from the low and high bit vectors in
    /// registers; each 16-value sub-block's integer sum (its offset of −32 included) goes under its int8 scale
    /// into one float sum per row, and the super-block's `d · dx` is applied once.
    #[allow(clippy::needless_range_loop)]
    #[inline(always)]
    fn il_group_q6k<const C: usize>(
        tile: &[u8],
        a: &interleave::Acts,
        i0: usize,
        out: &mut [f32],
        stride: usize,
    ) {
        let (cols, nch, nsb) = (a.cols, a.cols / 32, a.cols / 256);
        let tb = interleave::tile_block_bytes(BlockFormat::Q6K);
        assert!(tile.len() >= nsb * tb && a.q.len() >= (i0 + C) * cols);
        assert!(
            a.d.len() >= (i0 + C) * nsb
                && a.o16.len() >= 2 * (i0 + C) * nch
                && stride >= 16
                && out.len() >= (C - 1) * stride + 16
        );
        let (tp, qp, dp, op) = (tile.as_ptr(), a.q.as_ptr(), a.d.as_ptr(), a.o16.as_ptr());
        // A tile-block: scales 32 bytes at 0, sixteen 16-byte scale vectors at 32, low bits 2048 at 288, high 1024
        // at 2336.
        // SAFETY: tile reads at b·tb + [0, tb) < nsb·tb (tb = 3360); activation reads at (i0 + c)·cols + 32·ch +
        // [0, 32), (i0 + c)·nsb + b and 2·((i0 + c)·nch + ch) + [0, 2), stores at c·stride + [0, 16), ch < nch,
        // b < nsb, c < C: inside the asserted lengths; unaligned; `il512`, the only caller, enables the detected
        // features.
        unsafe {
            let (nib, top) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x30));
            let mut acc = [_mm512_setzero_ps(); C];
            for b in 0..nsb {
                let p = tp.add(b * tb);
                let mut t = [_mm512_setzero_ps(); C];
                for j in 0..8 {
                    prefetch_ahead(p.wrapping_add(j * tb / 8), tb / 8);
                    let (h, i) = (j / 4, j % 4);
                    let lp = p.add(288 + (2 * h + i % 2) * 8 * 64);
                    let hp = p.add(2336 + 8 * h * 64);
                    // Plain loops, no closures (see `il_group_k4`).
                    let mut w = [_mm512_setzero_si512(); 8];
                    for (g, w) in w.iter_mut().enumerate() {
                        let l = _mm512_loadu_si512(lp.add(64 * g).cast());
                        let low = if i < 2 {
                            _mm512_and_si512(l, nib)
                        } else {
                            _mm512_and_si512(_mm512_srli_epi16::<4>(l), nib)
                        };
                        let q = _mm512_loadu_si512(hp.add(64 * g).cast());
                        // Bits 2i, 2i + 1 of each byte to bits 4, 5 (16-bit shifts; the mask drops what crossed
                        // from the neighbouring byte).
                        let high = match i {
                            0 => _mm512_slli_epi16::<4>(q),
                            1 => _mm512_slli_epi16::<2>(q),
                            2 => q,
                            _ => _mm512_srli_epi16::<2>(q),
                        };
                        *w = _mm512_or_si512(low, _mm512_and_si512(high, top));
                    }
                    let mut sub = [_mm512_setzero_ps(); 2];
                    for (k, sub) in sub.iter_mut().enumerate() {
                        let sc = _mm_loadu_si128(p.add(32 + 16 * (2 * j + k)).cast());
                        *sub = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc));
                    }
                    let [sa, sb] = sub;
                    let ch = 8 * b + j;
                    for c in 0..C {
                        let ix = i0 + c;
                        let xq = qp.add(ix * cols + 32 * ch);
                        // Four activation codes as one i32 (a plain read: no intrinsic inside a closure).
                        let x4 = |g: usize| xq.add(4 * g).cast::<i32>().read_unaligned();
                        // The codes' offset of −32 is a whole multiple of the sub-block's scale: it starts each
                        // integer chain as −32 · Σ codes (`o16`, a broadcast from memory), so no float work is
                        // spent on it.
                        let o = op.add(2 * (ix * nch + ch));
                        let mut ia =
                            _mm512_dpbusd_epi32(_mm512_set1_epi32(*o), w[0], _mm512_set1_epi32(x4(0)));
                        let mut ib =
                            _mm512_dpbusd_epi32(_mm512_set1_epi32(*o.add(1)), w[4], _mm512_set1_epi32(x4(4)));
                        for g in 1..4 {
                            ia = _mm512_dpbusd_epi32(ia, w[g], _mm512_set1_epi32(x4(g)));
                            ib = _mm512_dpbusd_epi32(ib, w[g + 4], _mm512_set1_epi32(x4(g + 4)));
                        }
                        t[c] = if j == 0 {
                            _mm512_mul_ps(_mm512_cvtepi32_ps(ia), sa)
                        } else {
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), sa, t[c])
                        };
                        t[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib), sb, t[c]);
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
                for c in 0..C {
                    let dx = _mm512_set1_ps(*dp.add((i0 + c) * nsb + b));
                    acc[c] = _mm512_fmadd_ps(t[c], _mm512_mul_ps(d, dx), acc[c]);
                }
            }
            for c in 0..C {
                _mm512_storeu_ps(out.as_mut_ptr().add(c * stride), acc[c]);
            }
        }
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) fn peak512(iters: usize) -> (u64, i64) {
        let u = _mm512_set1_epi8(3);
        let q = _mm512_set1_epi8(std::hint::black_box(5));
        let mut acc = [_mm512_setzero_si512(); 12];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_dpbusd_epi32(*a, u, q);
            }
        }
        let mut s = _mm512_setzero_si512();
        for a in acc {
            s = _mm512_add_epi32(s, a);
        }
        (iters as u64 * 12 * 64, i64::from(_mm512_reduce_add_epi32(s)))
    }

    /// Eight independent `vpdpbusd` chains (one 32-value block of a 16-row tile against one activation row) with
    /// `fmas` independent 512-bit fused multiply-add chains beside them (0 to 3: a block format's scale product,
    /// its accumulation and Q4_1's or Q5_1's minimum term), per iteration.
    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    pub(super) fn peak512_fma<const K: usize>(iters: usize) -> (u64, i64) {
        let u = _mm512_set1_epi8(3);
        let q = _mm512_set1_epi8(std::hint::black_box(5));
        let (a, b) = (
            _mm512_set1_ps(1.000_000_1),
            _mm512_set1_ps(std::hint::black_box(1e-7)),
        );
        let mut acc = [_mm512_setzero_si512(); 8];
        let mut f = [_mm512_set1_ps(1.0); K];
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, u, q);
            }
            for x in f.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        let mut s = _mm512_setzero_si512();
        for x in acc {
            s = _mm512_add_epi32(s, x);
        }
        let t: f32 = f.iter().map(|&x| _mm512_reduce_add_ps(x)).sum();
        (
            iters as u64 * 8 * 64,
            i64::from(_mm512_reduce_add_epi32(s)) + t as i64,
        )
    }

    #[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")]
    fn k_vnni512(p: &PanelView, a: &ActView, live: usize, out: &mut [f32]) {
        let main = a.n / 4 * 4;
        let mut i = 0;
        while i < main {
            if p.split {
                tile512::<4, true>(p, a, i, live, out);
            } else {
                tile512::<4, false>(p, a, i, live, out);
            }
            i += 4;
        }
        while i < a.n {
            if p.split {
                tile512::<1, true>(p, a, i, live, out);
            } else {
                tile512::<1, false>(p, a, i, live, out);
            }
            i += 1;
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

    /// The scale `d` (the f16 at byte 0 of every block of `row`) into `s`, and into `o` either `k·d` (`Some(k)`:
    /// the offsets `−8·d`, `−128·d`, rounded as the reference does) or the f16 at byte 2 (`None`: Q4_1's min).
    /// Eight blocks at a time: one gather of their first four bytes, one shuffle, two `vcvtph2ps`.
    #[target_feature(enable = "avx2,f16c")]
    fn block_scales(row: &[u8], bb: usize, s: &mut [f32], o: &mut [f32], k: Option<f32>) {
        let nb = row.len() / bb;
        assert!(bb >= 4 && s.len() >= nb && o.len() >= nb);
        let full = nb / 8 * 8;
        let step = _mm256_mullo_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(bb as i32),
        );
        // Per 128-bit lane: the low halves of the four dwords, then their high halves.
        let split = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10,
            11, 14, 15,
        );
        for b0 in (0..full).step_by(8) {
            let idx = _mm256_add_epi32(step, _mm256_set1_epi32((b0 * bb) as i32));
            // SAFETY: the eight dwords read start at (b0 + j)·bb for j < 8 and end by (b0 + 7)·bb + 4 ≤
            // (b0 + 8)·bb ≤ nb·bb ≤ row.len() (bb ≥ 4, asserted); gathers have no alignment requirement.
            let g = unsafe { _mm256_i32gather_epi32::<1>(row.as_ptr().cast(), idx) };
            let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(g, split));
            let d = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
            store8(&mut s[b0..], d);
            match k {
                Some(k) => store8(&mut o[b0..], _mm256_mul_ps(_mm256_set1_ps(k), d)),
                None => store8(&mut o[b0..], _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(p))),
            }
        }
        for b in full..nb {
            let d = half(row, b * bb);
            s[b] = d;
            o[b] = match k {
                Some(k) => k * d,
                None => half(row, b * bb + 2),
            };
        }
    }

    /// One f16 (F16C).
    #[inline(always)]
    fn half(block: &[u8], at: usize) -> f32 {
        let h = u16::from_le_bytes([block[at], block[at + 1]]);
        // SAFETY: register-only F16C/SSE2 operations; only called from functions that enable F16C.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h)))) }
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
                    block_scales(row, bb, v.s, v.o, Some(-8.0));
                } else {
                    block_scales(row, bb, v.s, v.o, None);
                }
            }
            BlockFormat::Q8_0 => {
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let q = load32(&block[2..]);
                    store32(&mut v.u[32 * b..], _mm256_xor_si256(q, _mm256_set1_epi8(-128)));
                }
                block_scales(row, bb, v.s, v.o, Some(-128.0));
            }
            BlockFormat::Q4K | BlockFormat::Q5K => {
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let (d, min) = (half(block, 0), half(block, 2));
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
                    let d = half(block, 208);
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
            BlockFormat::Q5_0 | BlockFormat::Q5_1 => {
                let at = reference::q5_qh_at(format);
                for (b, block) in row.chunks_exact(bb).enumerate() {
                    let q = load16(&block[at + 4..]);
                    let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
                    // The 32 fifth bits as bytes 0/16: broadcast qh, pick bit j of it in byte j.
                    let bits = _mm256_set1_epi32(qh as i32);
                    let spread = _mm256_shuffle_epi8(
                        bits,
                        _mm256_setr_epi8(
                            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                            3, 3, 3, 3, 3,
                        ),
                    );
                    let mask = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                    let hi = _mm256_and_si256(
                        _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask),
                        _mm256_set1_epi8(16),
                    );
                    let lo =
                        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
                    store32(&mut v.u[32 * b..], _mm256_or_si256(lo, hi));
                }
                let k = (format == BlockFormat::Q5_0).then_some(-16.0);
                block_scales(row, bb, v.s, v.o, k);
            }
            BlockFormat::F32 | BlockFormat::F16 => reference::unpack_row(format, row, v),
        }
    }
}

#[cfg(test)]
mod tests;

/// Asks the CPU to bring the cache line holding `s[at]` into its nearest cache ahead of a read (`prefetcht0`): a
/// hint, with no effect on any result; nothing happens when `at` is outside `s`, or off x86-64.
#[inline(always)]
pub(crate) fn prefetch<T>(s: &[T], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = s.get(at) {
        // SAFETY: `x` is a reference into `s`, so the address is valid; a prefetch reads nothing architecturally,
        // cannot fault and needs only SSE, which every x86-64 CPU has.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>((x as *const T).cast())
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, at);
}
