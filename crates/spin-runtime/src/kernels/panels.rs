//! Attention over key panels, the quantised host route's kernel: the keys of a sequence's layer kept a second
//! time in blocks of eight positions, channel-major, so that one vector of a block holds one channel of eight
//! consecutive keys.
//!
//! Why: the block kernel of `kernels.rs` puts the query rows of one kv head in the vector lanes, which a
//! decoding step of a grouped-query model fills poorly (SmolLM2: 3 query heads per kv head, 3 of 8 lanes) and
//! which needs a broadcast key channel per multiply-add. Here the lanes are keys: a score vector of eight keys is
//! head_dim multiply-adds of a panel vector by a broadcast query channel, each panel vector serving every query
//! head of its kv head; the weighted sum of values puts channels in the lanes, each value vector serving those
//! heads too. Every lane is busy whatever the number of query heads or positions.
//!
//! Each query row gets the same operations in the same order whatever the other rows of the pass and the number of
//! threads: the keys are taken in fixed chunks of [`CHUNK_KEYS`] positions; per chunk, its scores (one multiply-add
//! chain per key over the channels in order), its visible keys (those before its own position; the lanes after
//! them are set to −∞ and their weights to exactly zero), the chunk's maximum, the exponentials and their sums per
//! lane in block order and then across lanes in a fixed tree, and the value sums position by position; then the
//! chunks merged in order and the final multiplication by 1/sum. A position decoded alone therefore gives the same
//! bits as the same position among a verification's rows, which keeps plain and speculative greedy decoding
//! identical (tested).

use super::{Lanes, exp_with, fmadd, has_fma};

/// One layer's keys and values of one sequence again, per kv head, in the layouts the kernel reads: the keys in
/// panels (per block of eight positions, head_dim lane vectors; lane l holds position 8·block + l), the values
/// position-major (head_dim floats a position). Each kv head's keys and values are one contiguous run each, so a
/// head's attention streams two runs of memory; in the cache's position-major rows a head's channels are a third
/// (SmolLM2) of every row, which the prefetchers fetch whole. Lanes past the last position hold zeros or keys of a
/// truncated tail; the kernel never weighs them.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvPanels {
    k: Vec<Vec<Lanes>>,
    v: Vec<Vec<f32>>,
    len: usize,
    head_dim: usize,
}

impl KvPanels {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Forgets every position from `len` on.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        for v in &mut self.v {
            v.truncate(self.len * self.head_dim);
        }
    }

    /// Makes room for `additional` more positions (see `KvCache::reserve`).
    pub fn reserve(&mut self, additional: usize) {
        let (n, hd) = (self.len + additional, self.head_dim);
        for k in &mut self.k {
            k.reserve((n.div_ceil(8) * hd).saturating_sub(k.len()));
        }
        for v in &mut self.v {
            v.reserve((n * hd).saturating_sub(v.len()));
        }
    }

    /// Appends one position per key row of `k` (rows of `k_stride` floats, n_kv_heads · head_dim keys from
    /// `k_offset`) with the value row at the same index of `v` (rows of `v_stride` floats from `v_offset`).
    ///
    /// # Panics
    /// If the rows are fewer in `v` than in `k`, or too short (caller bugs).
    pub fn extend(
        &mut self,
        (k, k_stride, k_offset): (&[f32], usize, usize),
        (v, v_stride, v_offset): (&[f32], usize, usize),
        n_kv_heads: usize,
        head_dim: usize,
    ) {
        let hd = head_dim;
        self.head_dim = hd;
        self.k.resize_with(n_kv_heads, Vec::new);
        self.v.resize_with(n_kv_heads, Vec::new);
        for (krow, vrow) in k.chunks_exact(k_stride).zip(v.chunks_exact(v_stride)) {
            let (b, l) = (self.len / 8, self.len % 8);
            for g in 0..n_kv_heads {
                let kt = &mut self.k[g];
                if kt.len() < (b + 1) * hd {
                    kt.resize((b + 1) * hd, [0.0; 8]);
                }
                for (dst, &x) in kt[b * hd..(b + 1) * hd]
                    .iter_mut()
                    .zip(&krow[k_offset + g * hd..k_offset + (g + 1) * hd])
                {
                    dst[l] = x;
                }
                self.v[g].extend_from_slice(&vrow[v_offset + g * hd..v_offset + (g + 1) * hd]);
            }
            self.len += 1;
        }
    }
}

/// Working buffers of one task of [`PanelAttention`], kept by its caller between calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct PanelScratch {
    /// The scaled queries of the rows in hand, `head_dim` floats each.
    q: Vec<f32>,
    /// Scores, then weights, of the rows in hand: `blocks` lane vectors per row.
    s: Vec<Lanes>,
}

/// Causal grouped-query attention of one sequence's new positions, reading keys and values from [`KvPanels`]
/// (which already hold the new positions), one kv head and chunk of keys per call, then the chunks merged.
pub(crate) struct PanelAttention<'a> {
    /// The sequence's new q|k|v rows after RoPE, `stride` floats each, queries at 0.
    pub rows: &'a [f32],
    pub stride: usize,
    /// Keys and values of every position the queries may see: the cache's and the new ones.
    pub kv: &'a KvPanels,
    /// Keys visible to each new position (its own position + 1).
    pub visible: &'a [usize],
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// 1/√head_dim.
    pub scale: f32,
}

/// Keys per chunk of [`PanelAttention`]: each kv head's keys are taken in chunks of this many positions (a
/// multiple of the eight of a panel), each chunk's softmax kept unnormalised with its own maximum and sum
/// ([`Partial`]) and the chunks merged in order ([`PanelAttention::merge`]). The chunks are the work items a pass
/// spreads over its threads: every key and value is read by one thread once, where splitting a head's channels
/// made both threads compute all its scores. The chunk boundaries are fixed positions, so a row's output depends on
/// its own visible keys only, whatever the other rows and the number of threads.
pub(crate) const CHUNK_KEYS: usize = 128;

/// Query rows per group of [`PanelAttention`] (row i: new position i / rep, query head i % rep of its kv head): the
/// kernel takes a kv head's rows this many at a time, each panel and value vector loaded serving every row of the
/// group (for SmolLM2's 3 heads per kv head, two positions). The groups are also work items of their own
/// ([`PanelAttention::head_chunk`] takes a range of groups): a pass of few positions has only a few kv heads and
/// chunks to spread over its threads, and a group's rows get the same operations alone or beside the others.
pub(crate) const GROUP_ROWS: usize = 6;

/// One kv head's attention over one chunk of keys, per row of a run of its rows (new position j, query head r of
/// the group, row j · rep + r): the largest score (−∞ where the row sees no key of the chunk), the sum of the
/// exponentials of the scores less it, and the exponential-weighted sum of the values (head_dim floats), not yet
/// divided by that sum.
#[derive(Debug, Clone, Default)]
pub(crate) struct Partial {
    /// The kv head's row held first.
    first: usize,
    m: Vec<f32>,
    z: Vec<f32>,
    acc: Vec<f32>,
}

impl PanelAttention<'_> {
    /// How many chunks of [`CHUNK_KEYS`] the keys visible to any row of the pass make.
    pub fn chunks(&self) -> usize {
        self.visible
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .div_ceil(CHUNK_KEYS)
    }

    /// Query rows of a kv head: new positions × query heads per kv head.
    pub fn head_rows(&self) -> usize {
        self.visible.len() * (self.n_heads / self.n_kv_heads)
    }

    /// How many groups of [`GROUP_ROWS`] a kv head's rows make.
    pub fn groups(&self) -> usize {
        self.head_rows().div_ceil(GROUP_ROWS)
    }

    /// The rows of groups `groups` (a range of group indices below [`PanelAttention::groups`]).
    pub fn group_rows(&self, groups: std::ops::Range<usize>) -> std::ops::Range<usize> {
        let total = self.head_rows();
        (groups.start * GROUP_ROWS).min(total)..(groups.end * GROUP_ROWS).min(total)
    }

    /// Kv head `g`'s rows of groups `groups` over chunk `c` of the keys (positions c · CHUNK_KEYS up to the next
    /// chunk) into `p`, which then holds those rows (the first at 0).
    pub fn head_chunk(
        &self,
        g: usize,
        c: usize,
        groups: std::ops::Range<usize>,
        p: &mut Partial,
        s: &mut PanelScratch,
    ) {
        let rows = self.group_rows(groups);
        p.first = rows.start;
        let rows = rows.len();
        p.m.clear();
        p.m.resize(rows, f32::NEG_INFINITY);
        p.z.clear();
        p.z.resize(rows, 0.0);
        p.acc.clear();
        p.acc.resize(rows * self.head_dim, 0.0);
        pulp::Arch::new().dispatch(HeadTask {
            att: self,
            g,
            k0: c * CHUNK_KEYS,
            rows: p.first..p.first + rows,
            p,
            s,
        });
    }

    /// Merges the partials of chunks 0, 1, … (in that order) of one kv head's rows (the same rows in every
    /// partial, as [`PanelAttention::head_chunk`] left them) into `out` (those rows, head_dim floats each; row i
    /// of the head is new position i / rep, query head i % rep of the kv head, rep = n_heads / n_kv_heads):
    /// per row, the largest of the chunks' maxima M, then Σ e^(m_c − M) · z_c and Σ e^(m_c − M) · acc_c in chunk
    /// order, and the weighted sum times the inverse of the sum. With one chunk this is the plain softmax: the factor
    /// is e⁰ = 1 exactly.
    pub fn merge(&self, parts: &[Partial], out: &mut [f32]) {
        let hd = self.head_dim;
        let rows = parts.first().map_or(0, |p| p.m.len());
        pulp::Arch::new().dispatch(MergeTask { parts, rows, hd, out });
    }

    /// [`PanelAttention::head_chunk`] with fused multiply-adds exactly when `F`; the products in `S`'s vectors
    /// where they hold eight lanes (x86-64-v3), in lane arrays otherwise (the same operations per lane).
    #[inline(always)]
    fn chunk_with<S: pulp::Simd, const F: bool>(
        &self,
        simd: S,
        g: usize,
        k0: usize,
        rows: std::ops::Range<usize>,
        p: &mut Partial,
        s: &mut PanelScratch,
    ) {
        // The rows (position j, head r of the group), position-major, in groups of GROUP_ROWS.
        let mut first = rows.start;
        while first < rows.end {
            let n = (rows.end - first).min(GROUP_ROWS);
            match n {
                6 => self.rows::<S, 6, 2, 2, F>(simd, g, k0, first, p, s),
                5 => self.rows::<S, 5, 2, 2, F>(simd, g, k0, first, p, s),
                4 => self.rows::<S, 4, 2, 2, F>(simd, g, k0, first, p, s),
                3 => self.rows::<S, 3, 3, 4, F>(simd, g, k0, first, p, s),
                2 => self.rows::<S, 2, 3, 4, F>(simd, g, k0, first, p, s),
                _ => self.rows::<S, 1, 3, 4, F>(simd, g, k0, first, p, s),
            }
            first += n;
        }
    }

    /// Rows `first .. first + R` of kv head g (row i: new position i / rep, query head g·rep + i % rep) over the
    /// keys of the chunk from position `k0` into `p` (which holds rows from `p.first`); the scores in blocks of B
    /// panels, the values in V vectors of channels. Rows that see fewer keys than others of their group get weight
    /// exactly zero on the keys they do not see, which leaves their sums unchanged bit for bit (an accumulator that
    /// starts at +0 is never −0); a row that sees none of the chunk keeps m = −∞, z = 0 and zero sums.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn rows<S: pulp::Simd, const R: usize, const B: usize, const V: usize, const F: bool>(
        &self,
        simd: S,
        g: usize,
        k0: usize,
        first: usize,
        p: &mut Partial,
        s: &mut PanelScratch,
    ) {
        let (hd, rep) = (self.head_dim, self.n_heads / self.n_kv_heads);
        // Keys of the chunk each row sees.
        let vis: [usize; R] =
            std::array::from_fn(|i| self.visible[(first + i) / rep].saturating_sub(k0).min(CHUNK_KEYS));
        let most = vis.iter().copied().max().unwrap_or(0);
        if most == 0 {
            return;
        }
        let nb = most.div_ceil(8);
        let b0 = k0 / 8;
        s.q.clear();
        for i in 0..R {
            let (j, h) = ((first + i) / rep, g * rep + (first + i) % rep);
            let q = &self.rows[j * self.stride + h * hd..][..hd];
            s.q.extend(q.iter().map(|&x| x * self.scale));
        }
        s.s.clear();
        s.s.resize(R * nb, [0.0; 8]);
        // Scores: B blocks of eight keys at a time against the R rows (B·R accumulator vectors).
        let panel = |b: usize| &self.kv.k[g][(b0 + b) * hd..][..hd];
        // The panels from block b on (what the prefetches ahead of block b read; empty past the head's keys).
        let after = |b: usize| self.kv.k[g].get((b0 + b) * hd..).unwrap_or(&[]);
        let wide = F && S::F32_LANES == 8;
        // Where the CPU has AVX-512, two panel blocks (sixteen keys) a 512-bit vector (the same chains per lane).
        let fast = wide
            && crate::quant::panel_scores(&s.q, hd, &self.kv.k[g][b0 * hd..(b0 + nb) * hd], nb, &mut s.s);
        let mut b = if fast { nb } else { 0 };
        while b + B <= nb {
            let pn: [&[Lanes]; B] = std::array::from_fn(|i| panel(b + i));
            if wide {
                scores_wide::<S, R, B>(simd, &s.q, pn, after(b + B), &mut s.s, nb, b);
            } else {
                scores::<R, B, F>(&s.q, pn, &mut s.s, nb, b);
            }
            b += B;
        }
        while b < nb {
            if wide {
                scores_wide::<S, R, 1>(simd, &s.q, [panel(b)], after(b + 1), &mut s.s, nb, b);
            } else {
                scores::<R, 1, F>(&s.q, [panel(b)], &mut s.s, nb, b);
            }
            b += 1;
        }
        // Per row: hide the keys at and after its `vis`, exponentials with per-lane sums in block order.
        for r in 0..R {
            let sr: &mut [f32] = bytemuck::cast_slice_mut(&mut s.s[r * nb..(r + 1) * nb]);
            if vis[r] == 0 {
                sr.fill(0.0);
                continue;
            }
            for x in &mut sr[vis[r]..] {
                *x = f32::NEG_INFINITY;
            }
            let sr: &mut [Lanes] = bytemuck::cast_slice_mut(sr);
            let mut m = [f32::NEG_INFINITY; 8];
            for x in sr.iter() {
                for l in 0..8 {
                    m[l] = if x[l] > m[l] { x[l] } else { m[l] };
                }
            }
            let m = m.into_iter().fold(f32::NEG_INFINITY, f32::max);
            for x in sr.iter_mut() {
                for v in x.iter_mut() {
                    *v = exp_with::<F>(*v - m);
                }
            }
            // exp clamps −∞ to e⁻⁸⁷: the hidden keys get exactly zero weight before anything is summed.
            let flat: &mut [f32] = bytemuck::cast_slice_mut(sr);
            for x in &mut flat[vis[r]..] {
                *x = 0.0;
            }
            let mut z = [0f32; 8];
            for x in sr.iter() {
                for l in 0..8 {
                    z[l] += x[l];
                }
            }
            p.m[first - p.first + r] = m;
            p.z[first - p.first + r] = ((z[0] + z[1]) + (z[2] + z[3])) + ((z[4] + z[5]) + (z[6] + z[7]));
        }
        // Weighted sums of values: channels in lanes, V vectors at a time, positions in order.
        let value = Values {
            rows: &self.kv.v[g][k0 * hd..(k0 + most) * hd],
            hd,
            ahead: &self.kv.v[g][k0 * hd..],
        };
        let out = &mut p.acc[(first - p.first) * hd..(first - p.first + R) * hd];
        let mut c0 = 0;
        let sums = crate::quant::ValueSums {
            w: bytemuck::cast_slice(&s.s[..R * nb]),
            nb,
            rows: R,
            vals: value.rows,
            ahead: value.ahead,
            hd,
            most,
        };
        let done = if wide {
            crate::quant::panel_values(&sums, out)
        } else {
            None
        };
        if let Some(done) = done {
            // Two rows at a time over four 512-bit vectors of channels (the same chains per lane).
            c0 = done;
        } else if wide {
            // One row at a time over eight vectors of channels (a whole 64-wide head): each sweep reads whole value
            // rows in order, which the prefetchers follow, and eight accumulators stay in registers.
            while c0 + 64 <= hd {
                for r in 0..R {
                    values_wide::<S, 1, 8>(
                        simd,
                        r == 0,
                        &s.s[r * nb..],
                        nb,
                        &value,
                        c0,
                        &mut out[r * hd..],
                        hd,
                    );
                }
                c0 += 64;
            }
        }
        while c0 + 8 * V <= hd {
            if wide {
                values_wide::<S, R, V>(simd, false, &s.s, nb, &value, c0, out, hd);
            } else {
                values::<R, V, F>(&s.s, nb, &value, c0, out, hd);
            }
            c0 += 8 * V;
        }
        while c0 + 8 <= hd {
            if wide {
                values_wide::<S, R, 1>(simd, false, &s.s, nb, &value, c0, out, hd);
            } else {
                values::<R, 1, F>(&s.s, nb, &value, c0, out, hd);
            }
            c0 += 8;
        }
        // A head_dim that is not a multiple of eight: the last channels one at a time, in the same order (the
        // fused multiply-add of each lane, so the same bits as in a vector).
        for c in c0..hd {
            let mut acc = [0f32; R];
            value.each(|q, row| {
                let x = row[c];
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = fmadd::<F>(s.s[r * nb + q / 8][q % 8], x, *a);
                }
            });
            for (r, a) in acc.iter().enumerate() {
                out[r * hd + c] = *a;
            }
        }
    }
}

/// [`PanelAttention::merge`] compiled for the instruction set `pulp` picks, with fused multiply-adds where the
/// chunks' kernels have them.
struct MergeTask<'a, 'b> {
    parts: &'a [Partial],
    rows: usize,
    hd: usize,
    out: &'b mut [f32],
}

impl pulp::WithSimd for MergeTask<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _: S) {
        if has_fma::<S>() {
            merge_with::<true>(self.parts, self.rows, self.hd, self.out);
        } else {
            merge_with::<false>(self.parts, self.rows, self.hd, self.out);
        }
    }
}

/// [`PanelAttention::merge`] with fused multiply-adds exactly when `F`.
#[inline(always)]
fn merge_with<const F: bool>(parts: &[Partial], rows: usize, hd: usize, out: &mut [f32]) {
    for r in 0..rows {
        let big = parts.iter().map(|p| p.m[r]).fold(f32::NEG_INFINITY, f32::max);
        // The row's output is its accumulator: the weighted sums first, then times the inverse of their weight.
        let acc = &mut out[r * hd..(r + 1) * hd];
        acc.fill(0.0);
        let mut z = 0f32;
        for p in parts {
            if p.m[r] == f32::NEG_INFINITY {
                continue;
            }
            let f = exp_with::<F>(p.m[r] - big);
            z = fmadd::<F>(f, p.z[r], z);
            for (a, &x) in acc.iter_mut().zip(&p.acc[r * hd..(r + 1) * hd]) {
                *a = fmadd::<F>(f, x, *a);
            }
        }
        let inv = 1.0 / z;
        for a in acc.iter_mut() {
            *a *= inv;
        }
    }
}

/// The value rows a query weighs, in position order: one kv head's, head_dim floats each.
struct Values<'a> {
    rows: &'a [f32],
    hd: usize,
    /// The head's values from the first of `rows` on, past them too (what prefetches may reach ahead).
    ahead: &'a [f32],
}

impl Values<'_> {
    /// Calls `f(position, row)` for every visible position in order.
    #[inline(always)]
    fn each(&self, mut f: impl FnMut(usize, &[f32])) {
        for (p, row) in self.rows.chunks_exact(self.hd).enumerate() {
            f(p, row);
        }
    }
}

/// s[r·nb + b + i] = the scores of the eight keys of block b + i against row r: one multiply-add chain per lane
/// over the channels in order.
#[inline(always)]
fn scores<const R: usize, const B: usize, const F: bool>(
    q: &[f32],
    panels: [&[Lanes]; B],
    s: &mut [Lanes],
    nb: usize,
    b: usize,
) {
    let hd = panels[0].len();
    let panels = panels.map(|p| &p[..hd]);
    let mut acc = [[[0f32; 8]; B]; R];
    for c in 0..hd {
        let k: [Lanes; B] = std::array::from_fn(|i| panels[i][c]);
        for r in 0..R {
            let x = q[r * hd + c];
            for i in 0..B {
                for l in 0..8 {
                    acc[r][i][l] = fmadd::<F>(x, k[i][l], acc[r][i][l]);
                }
            }
        }
    }
    for r in 0..R {
        for i in 0..B {
            s[r * nb + b + i] = acc[r][i];
        }
    }
}

/// out[r·hd + c0 + 8v + l] = Σ_{p < vis} w_r[p] · value(p)[c0 + 8v + l] for V vectors of channels (unnormalised:
/// [`PanelAttention::merge`] divides by the sum of the weights).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn values<const R: usize, const V: usize, const F: bool>(
    w: &[Lanes],
    nb: usize,
    value: &Values<'_>,
    c0: usize,
    out: &mut [f32],
    hd: usize,
) {
    let mut acc = [[[0f32; 8]; V]; R];
    value.each(|p, row| {
        let row = &row[c0..c0 + 8 * V];
        let wp: [f32; R] = std::array::from_fn(|r| w[r * nb + p / 8][p % 8]);
        for v in 0..V {
            let x: &Lanes = row[8 * v..8 * v + 8].try_into().expect("eight channels");
            for r in 0..R {
                for l in 0..8 {
                    acc[r][v][l] = fmadd::<F>(wp[r], x[l], acc[r][v][l]);
                }
            }
        }
    });
    for r in 0..R {
        for v in 0..V {
            for l in 0..8 {
                out[r * hd + c0 + 8 * v + l] = acc[r][v][l];
            }
        }
    }
}

/// [`scores`] in vectors of eight lanes with fused multiply-adds (`S::F32_LANES == 8`): the same operations per
/// lane, with the accumulators held in registers (LLVM keeps lane arrays of this size on the stack).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_wide<S: pulp::Simd, const R: usize, const B: usize>(
    simd: S,
    q: &[f32],
    panels: [&[Lanes]; B],
    ahead: &[Lanes],
    s: &mut [Lanes],
    nb: usize,
    b: usize,
) {
    let hd = panels[0].len();
    let panels: [&[S::f32s]; B] = panels.map(|p| bytemuck::cast_slice(&p[..hd]));
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; B]; R];
    for c in 0..hd {
        if c % 2 == 0 {
            // The next group's panels, a cache line (two channel vectors) of each per two channels: the keys come
            // from memory (a pass streams the weights between two uses of them), and the prefetchers alone fetch
            // them at a third of the bus.
            for i in 0..B {
                crate::quant::prefetch(ahead, i * hd + c);
            }
        }
        let k: [S::f32s; B] = std::array::from_fn(|i| panels[i][c]);
        for r in 0..R {
            let x = simd.splat_f32s(q[r * hd + c]);
            for i in 0..B {
                acc[r][i] = simd.mul_add_f32s(x, k[i], acc[r][i]);
            }
        }
    }
    for r in 0..R {
        let dst: &mut [S::f32s] = bytemuck::cast_slice_mut(&mut s[r * nb + b..r * nb + b + B]);
        dst.copy_from_slice(&acc[r]);
    }
}

/// [`values`] in vectors of eight lanes with fused multiply-adds (`S::F32_LANES == 8`).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn values_wide<S: pulp::Simd, const R: usize, const V: usize>(
    simd: S,
    prefetch_ahead: bool,
    w: &[Lanes],
    nb: usize,
    value: &Values<'_>,
    c0: usize,
    out: &mut [f32],
    hd: usize,
) {
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; V]; R];
    let mut wr: [&[f32]; R] = [&[]; R];
    for (r, x) in wr.iter_mut().enumerate() {
        // Row r's weights as one run of floats (lane l of block b is position 8·b + l).
        *x = bytemuck::cast_slice(&w[r * nb..(r + 1) * nb]);
    }
    // Plain loops, no closures: a closure left out of line would not inherit the caller's target features, and
    // every vector operation in it would become a call.
    let (rows, hd_v) = (value.rows, value.hd);
    let mut p = 0;
    let mut at = 0;
    while at + hd_v <= rows.len() {
        if prefetch_ahead {
            // Sixteen positions ahead, each line of the value row this sweep reads (the first of a group's rows
            // reads them from memory; the others find them in cache).
            let mut l = 0;
            while l < 8 * V {
                crate::quant::prefetch(value.ahead, at + 16 * hd_v + c0 + l);
                l += 16;
            }
        }
        let row: &[S::f32s] = bytemuck::cast_slice(&rows[at + c0..at + c0 + 8 * V]);
        let mut x = [zero; V];
        x.copy_from_slice(&row[..V]);
        // One broadcast weight at a time, used at once: R·V accumulators, V value vectors and one weight stay in
        // the vector registers (all R weights first spilled the accumulators to the stack).
        for r in 0..R {
            let wp = simd.splat_f32s(wr[r][p]);
            for v in 0..V {
                acc[r][v] = simd.mul_add_f32s(wp, x[v], acc[r][v]);
            }
        }
        p += 1;
        at += hd_v;
    }
    for r in 0..R {
        let dst: &mut [S::f32s] = bytemuck::cast_slice_mut(&mut out[r * hd + c0..r * hd + c0 + 8 * V]);
        dst.copy_from_slice(&acc[r]);
    }
}

/// [`PanelAttention::head_chunk`] compiled for the instruction set `pulp` picks (a struct rather than a closure,
/// as `kernels::Block`).
struct HeadTask<'a, 'b, 'c> {
    att: &'a PanelAttention<'b>,
    g: usize,
    k0: usize,
    rows: std::ops::Range<usize>,
    p: &'c mut Partial,
    s: &'c mut PanelScratch,
}

impl pulp::WithSimd for HeadTask<'_, '_, '_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        if has_fma::<S>() {
            self.att
                .chunk_with::<S, true>(simd, self.g, self.k0, self.rows, self.p, self.s);
        } else {
            self.att
                .chunk_with::<S, false>(simd, self.g, self.k0, self.rows, self.p, self.s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// A sequence: `past` cached positions and `t` new q|k|v rows, with the panels built as the route builds them
    /// (the cache's keys, then the new rows' keys), after a longer tail was appended and truncated away.
    struct Case {
        nh: usize,
        nkv: usize,
        hd: usize,
        past: usize,
        t: usize,
        past_k: Vec<f32>,
        past_v: Vec<f32>,
        rows: Vec<f32>,
    }

    impl Case {
        fn new(rng: &mut ChaCha8Rng, (nh, nkv, hd): (usize, usize, usize), past: usize, t: usize) -> Case {
            let kvd = nkv * hd;
            let w = nh * hd + 2 * kvd;
            let mut r = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect() };
            Case {
                nh,
                nkv,
                hd,
                past,
                t,
                past_k: r(past * kvd),
                past_v: r(past * kvd),
                rows: r(t * w),
            }
        }

        fn w(&self) -> usize {
            self.nh * self.hd + 2 * self.nkv * self.hd
        }

        /// The kernel's output (T, n_heads, head_dim).
        fn run(&self) -> Vec<f32> {
            let (kvd, w, d) = (self.nkv * self.hd, self.w(), self.nh * self.hd);
            let (nkv, hd) = (self.nkv, self.hd);
            let mut kv = KvPanels::default();
            // A stale tail: keys and values of positions that a rejection then dropped.
            kv.extend((&self.past_k, kvd, 0), (&self.past_v, kvd, 0), nkv, hd);
            let stale = vec![7.5; 11 * kvd];
            kv.extend((&stale, kvd, 0), (&stale, kvd, 0), nkv, hd);
            kv.truncate(self.past);
            kv.extend((&self.rows, w, d), (&self.rows, w, d + kvd), nkv, hd);
            self.attend(&kv)
        }

        /// Every kv head over `kv`, its chunks computed last to first, spread into (T, n_heads, head_dim).
        fn attend(&self, kv: &KvPanels) -> Vec<f32> {
            let d = self.nh * self.hd;
            let visible: Vec<usize> = (0..self.t).map(|j| self.past + j + 1).collect();
            let att = PanelAttention {
                rows: &self.rows,
                stride: self.w(),
                kv,
                visible: &visible,
                n_heads: self.nh,
                n_kv_heads: self.nkv,
                head_dim: self.hd,
                scale: 1.0 / (self.hd as f32).sqrt(),
            };
            let rep = self.nh / self.nkv;
            let mut y = vec![0f32; self.t * d];
            let mut s = PanelScratch::default();
            for g in 0..self.nkv {
                let mut block = vec![f32::NAN; self.t * rep * self.hd];
                // The chunks in reverse order, each with a fresh partial: the order tasks run in is free.
                // Every group on its own, the last first, then all the groups in one call: the same bits.
                for k in (0..att.groups()).rev().chain([usize::MAX]) {
                    let groups = if k == usize::MAX {
                        0..att.groups()
                    } else {
                        k..k + 1
                    };
                    let rows = att.group_rows(groups.clone());
                    let mut parts: Vec<Partial> = (0..att.chunks()).map(|_| Partial::default()).collect();
                    for (c, p) in parts.iter_mut().enumerate().rev() {
                        att.head_chunk(g, c, groups.clone(), p, &mut s);
                    }
                    let mut got = vec![f32::NAN; rows.len() * self.hd];
                    att.merge(&parts, &mut got);
                    let here = &mut block[rows.start * self.hd..rows.end * self.hd];
                    if k != usize::MAX {
                        here.copy_from_slice(&got);
                    } else {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(here), bits(&got), "groups alone and together");
                    }
                }
                for (i, o) in block.chunks_exact(self.hd).enumerate() {
                    let (j, r) = (i / rep, i % rep);
                    let at = (j * self.nh + g * rep + r) * self.hd;
                    y[at..at + self.hd].copy_from_slice(o);
                }
            }
            y
        }

        /// Causal attention in f64, the plain way.
        fn reference(&self) -> Vec<f64> {
            let (kvd, w, d) = (self.nkv * self.hd, self.w(), self.nh * self.hd);
            let rep = self.nh / self.nkv;
            let key = |p: usize| -> &[f32] {
                if p < self.past {
                    &self.past_k[p * kvd..][..kvd]
                } else {
                    &self.rows[(p - self.past) * w + d..][..kvd]
                }
            };
            let val = |p: usize| -> &[f32] {
                if p < self.past {
                    &self.past_v[p * kvd..][..kvd]
                } else {
                    &self.rows[(p - self.past) * w + d + kvd..][..kvd]
                }
            };
            let scale = 1.0 / (self.hd as f64).sqrt();
            let mut y = vec![0f64; self.t * d];
            for j in 0..self.t {
                for h in 0..self.nh {
                    let g = h / rep;
                    let q = &self.rows[j * w + h * self.hd..][..self.hd];
                    let n = self.past + j + 1;
                    let s: Vec<f64> = (0..n)
                        .map(|p| {
                            let k = &key(p)[g * self.hd..][..self.hd];
                            q.iter()
                                .zip(k)
                                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for c in 0..self.hd {
                        y[(j * self.nh + h) * self.hd + c] = (0..n)
                            .map(|p| e[p] * f64::from(val(p)[g * self.hd + c]))
                            .sum::<f64>()
                            / z;
                    }
                }
            }
            y
        }
    }

    const SHAPES: [(usize, usize, usize); 5] = [(9, 3, 64), (8, 4, 8), (4, 4, 12), (14, 2, 64), (6, 1, 16)];

    /// The kernel against plain f64 attention, for every head grouping, head widths that are and are not
    /// multiples of eight, caches of 0 to 300 positions (partial blocks; one, two and three chunks of keys, new
    /// positions on both sides of a chunk's end), 1 to 6 new positions, and a truncated stale tail in the panels.
    #[test]
    fn panel_attention_matches_plain_attention() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for shape in SHAPES {
            for past in [0, 1, 7, 8, 9, 41, 125, 128, 300] {
                for t in [1, 2, 5, 6] {
                    let c = Case::new(&mut rng, shape, past, t);
                    let (got, want) = (c.run(), c.reference());
                    let top = want.iter().fold(0f64, |a, &b| a.max(b.abs()));
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            (f64::from(g) - w).abs() <= 2e-6 * top.max(1.0),
                            "{shape:?} past {past} t {t}: output {i} is {g}, plain attention {w}"
                        );
                    }
                }
            }
        }
    }

    /// A new position among several gets the bits it gets decoded alone with the earlier positions cached.
    #[test]
    fn a_position_alone_gets_the_bits_it_gets_in_a_pass() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        for shape in SHAPES {
            let (nh, nkv, hd) = shape;
            let (kvd, d) = (nkv * hd, nh * hd);
            let w = d + 2 * kvd;
            for past in [0, 5, 8, 23, 124, 253] {
                let t = 6;
                let all = Case::new(&mut rng, shape, past, t);
                let together = all.run();
                for j in 0..t {
                    // Position past + j alone: the pass's earlier new rows are in the cache now.
                    let mut alone = Case {
                        past: past + j,
                        t: 1,
                        past_k: all.past_k.clone(),
                        past_v: all.past_v.clone(),
                        rows: all.rows[j * w..(j + 1) * w].to_vec(),
                        ..all
                    };
                    for row in all.rows[..j * w].chunks_exact(w) {
                        alone.past_k.extend_from_slice(&row[d..d + kvd]);
                        alone.past_v.extend_from_slice(&row[d + kvd..]);
                    }
                    let y = alone.run();
                    let want = &together[j * d..(j + 1) * d];
                    assert!(
                        y.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{shape:?} past {past}: position {j} alone differs from the pass"
                    );
                }
            }
        }
    }
}
