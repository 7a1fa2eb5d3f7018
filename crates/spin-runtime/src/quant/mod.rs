//! Quantised CPU matrix products of our own, straight on a GGUF file's weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K; F16/F32 too): the decoding step (one activation row) and the verification pass (up to 64 rows) read each
//! weight block from memory once per call, whatever the number of rows.
//!
//! How a product runs: the activations are quantised once per call to signed 8-bit codes with one f32 scale per 32
//! values (finer than, and so at least as accurate as, the Q8_0/Q8_1/Q8_K forms ggml pairs with these formats).
//! On CPUs with AVX-512 VNNI, the quantised formats are held interleaved in tiles of 16 rows (`interleave.rs`),
//! read in place by one `vpdpbusd` per four columns of all 16 rows. Otherwise (and for the float formats) each tile of four weight rows is unpacked once into unsigned byte codes with a scale and
//! an offset per group (`w = s·u + o`, see `reference.rs`), and the tile is applied to every activation row with
//! integer dot products (`vpdpbusd` on AVX-512 VNNI or AVX-VNNI, `vpmaddubsw` on AVX2, plain Rust elsewhere; the
//! instruction set is chosen at run time, see `simd.rs`, the only module of the workspace with `unsafe`). The
//! offsets contribute `o · dx · Σ codes` from per-group sums of the activation codes. Output rows are split over
//! the current rayon pool in whole tiles (or, for 8 activation rows and more on interleaved tiles, the activation
//! rows are, and each part writes straight into the result): every output element is computed by the same
//! instructions in the same order whatever the pool size, so 1 and 2 threads give the same bits.

mod interleave;
mod pages;
mod q8;
mod reference;
mod simd;
pub(crate) use q8::quantise_q8_0;
pub(crate) use simd::{ValueSums, panel_scores, panel_values, prefetch};

use crate::{Result, RuntimeError};
use candle_core::quantized::{GgmlDType, QTensor};
use rayon::prelude::*;
use std::borrow::Cow;
use std::cell::RefCell;

/// A ggml block layout, bit for bit as GGUF files store it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum BlockFormat {
    /// Plain little-endian f32 values.
    F32,
    /// IEEE half-precision values.
    F16,
    /// 32 values: f16 scale, 16 bytes of 4-bit codes (value `(q − 8)·d`).
    Q4_0,
    /// 32 values: f16 scale and min, 16 bytes of 4-bit codes (value `q·d + m`).
    Q4_1,
    /// 32 values: f16 scale, 32 signed bytes.
    Q8_0,
    /// 32 values: f16 scale, 32 fifth bits, 16 bytes of 4-bit codes (value `(q − 16)·d`); llama.cpp's Q4_K_M
    /// files store the matrices whose width is not a multiple of 256 in it.
    Q5_0,
    /// 32 values: f16 scale and min, 32 fifth bits, 16 bytes of 4-bit codes (value `q·d + m`); llama.cpp's Q5_K_M
    /// files store the matrices whose width is not a multiple of 256 in it.
    Q5_1,
    /// 256 values in 8 sub-blocks with 6-bit scales and mins, 4-bit codes.
    Q4K,
    /// 256 values as Q4_K with a fifth bit per code.
    Q5K,
    /// 256 values in 16 sub-blocks with 8-bit scales, 6-bit codes.
    Q6K,
}

impl BlockFormat {
    /// The format of a candle/ggml dtype; `None` for the ones this module does not implement.
    pub fn from_ggml(t: GgmlDType) -> Option<BlockFormat> {
        Some(match t {
            GgmlDType::F32 => BlockFormat::F32,
            GgmlDType::F16 => BlockFormat::F16,
            GgmlDType::Q4_0 => BlockFormat::Q4_0,
            GgmlDType::Q4_1 => BlockFormat::Q4_1,
            GgmlDType::Q8_0 => BlockFormat::Q8_0,
            GgmlDType::Q5_0 => BlockFormat::Q5_0,
            GgmlDType::Q5_1 => BlockFormat::Q5_1,
            GgmlDType::Q4K => BlockFormat::Q4K,
            GgmlDType::Q5K => BlockFormat::Q5K,
            GgmlDType::Q6K => BlockFormat::Q6K,
            _ => return None,
        })
    }

    /// Values per block.
    pub fn block_elems(self) -> usize {
        match self {
            BlockFormat::F32 | BlockFormat::F16 => 1,
            BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q8_0
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1 => 32,
            BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::F32 => 4,
            BlockFormat::F16 => 2,
            BlockFormat::Q4_0 => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q4K => 144,
            BlockFormat::Q5K => 176,
            BlockFormat::Q6K => 210,
        }
    }

    fn is_float(self) -> bool {
        matches!(self, BlockFormat::F32 | BlockFormat::F16)
    }

    /// The k-quants, whose interleaved products take activations with one scale per 256-value super-block.
    pub(crate) fn super_scaled(self) -> bool {
        matches!(self, BlockFormat::Q4K | BlockFormat::Q5K | BlockFormat::Q6K)
    }

    /// Values per offset group of the unpacked form.
    fn group(self) -> usize {
        if self == BlockFormat::Q6K { 16 } else { 32 }
    }
}

/// A (rows × cols) weight matrix in its file's block format, each row a whole number of blocks: row-major as the
/// file stores it, or, for every quantised format on CPUs with AVX-512 VNNI, the same bytes interleaved in tiles
/// of 16 rows (`interleave.rs`), which is what the kernels read there.
#[derive(Clone, Debug)]
pub struct QMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    data: pages::Shared,
    /// Whether `data` is the interleaved form.
    interleaved: bool,
}

/// Weight rows per tile: each tile is unpacked once and applied to every activation row.
const TILE: usize = 4;

/// Checks `cols % block_elems == 0` and `len == rows · cols / block_elems · block_bytes`.
fn check_shape(what: &str, format: BlockFormat, rows: usize, cols: usize, len: usize) -> Result<()> {
    let be = format.block_elems();
    if cols == 0 || !cols.is_multiple_of(be) {
        return Err(RuntimeError::format(
            what,
            format!("{cols} columns is not a positive multiple of the {format:?} block of {be} values"),
        ));
    }
    let want = rows
        .checked_mul(cols / be)
        .and_then(|b| b.checked_mul(format.block_bytes()));
    if want != Some(len) {
        return Err(RuntimeError::format(
            what,
            format!(
                "{} bytes of {format:?} data for {rows} × {cols} values (expected {})",
                len,
                want.map_or_else(|| "more than fits in memory".to_owned(), |w| w.to_string())
            ),
        ));
    }
    Ok(())
}

impl QMatrix {
    /// Checks `cols % block_elems == 0` and `data.len() == rows · cols / block_elems · block_bytes`; a
    /// [`RuntimeError::Format`] naming `what` otherwise.
    pub fn new(what: &str, format: BlockFormat, rows: usize, cols: usize, data: Vec<u8>) -> Result<QMatrix> {
        check_shape(what, format, rows, cols, data.len())?;
        let interleaved = simd::interleaved() && interleave::supported(format);
        let data = if interleaved {
            pages::Shared::own(interleave::pack(format, rows, cols, &data))
        } else {
            pages::Shared::own(pages::WeightBytes::from_vec(data))
        };
        Ok(QMatrix {
            format,
            rows,
            cols,
            data,
            interleaved,
        })
    }

    /// As [`QMatrix::new`], but the bytes stay in the file's row-major order until [`QMatrix::side_by_side`]
    /// interleaves them straight into the shared buffer (a loader that gathers its matrices so writes each weight
    /// once more, not twice). Usable as it is: the products read either form.
    pub(crate) fn file_order(
        what: &str,
        format: BlockFormat,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<QMatrix> {
        check_shape(what, format, rows, cols, data.len())?;
        Ok(QMatrix {
            format,
            rows,
            cols,
            data: pages::Shared::own(pages::WeightBytes::from_vec(data)),
            interleaved: false,
        })
    }

    /// Whether the bytes are in the file's order where the kernels would read the interleaved form.
    fn interleave_pending(&self) -> bool {
        !self.interleaved && simd::interleaved() && interleave::supported(self.format)
    }

    /// The matrix of a 2-D candle `QTensor` (rows × cols), from its raw block bytes.
    pub fn from_qtensor(what: &str, q: &QTensor) -> Result<QMatrix> {
        let format = BlockFormat::from_ggml(q.dtype()).ok_or_else(|| {
            RuntimeError::format(
                what,
                format!(
                    "block format {:?} is not supported by the host kernels",
                    q.dtype()
                ),
            )
        })?;
        let (rows, cols) = q.shape().dims2().map_err(|_| {
            RuntimeError::format(what, format!("expected a matrix, got shape {:?}", q.shape()))
        })?;
        let data = q.data()?.into_owned();
        QMatrix::new(what, format, rows, cols, data)
    }

    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// The block bytes as the file stores them, row-major (rebuilt from the interleaved form where the matrix
    /// holds that).
    pub fn data(&self) -> Cow<'_, [u8]> {
        self.file_rows(0, self.rows)
    }

    /// The file's block bytes of rows `first .. first + count`.
    ///
    /// # Panics
    /// If the rows are not inside the matrix (a caller bug).
    pub fn file_rows(&self, first: usize, count: usize) -> Cow<'_, [u8]> {
        assert!(first + count <= self.rows, "file_rows: rows out of range");
        if self.interleaved {
            return Cow::Owned(interleave::unpack_rows(
                self.format,
                self.cols,
                &self.data,
                first,
                count,
            ));
        }
        let rb = self.row_bytes();
        Cow::Borrowed(&self.data[first * rb..(first + count) * rb])
    }

    fn row_bytes(&self) -> usize {
        self.cols / self.format.block_elems() * self.format.block_bytes()
    }

    fn row(&self, r: usize) -> Cow<'_, [u8]> {
        self.file_rows(r, 1)
    }

    /// The same matrices with their bytes copied side by side into one buffer in transparent huge pages where the
    /// system gives them (`pages.rs` says why: a step streams every weight, and 4 KiB pages cost a page walk per
    /// 4 KiB). Products give the same bits as before; the copies share the buffer, which lives until the last
    /// of them is dropped.
    ///
    /// A matrix still in the file's order where the kernels read the interleaved form (`QMatrix::file_order`)
    /// is interleaved into its stretch of the buffer instead of copied.
    pub fn side_by_side(ms: &[&QMatrix]) -> Vec<QMatrix> {
        let lens: Vec<usize> = ms
            .iter()
            .map(|m| {
                if m.interleave_pending() {
                    interleave::packed_len(m.format, m.rows, m.cols)
                } else {
                    m.data.len()
                }
            })
            .collect();
        let fill = |i: usize, out: &mut [u8]| {
            let m = ms[i];
            if m.interleave_pending() {
                interleave::pack_into(m.format, m.rows, m.cols, &m.data, out);
            } else {
                out.copy_from_slice(&m.data);
            }
        };
        ms.iter()
            .zip(pages::Shared::side_by_side(&lens, fill))
            .map(|(m, data)| QMatrix {
                format: m.format,
                rows: m.rows,
                cols: m.cols,
                data,
                interleaved: m.interleaved || m.interleave_pending(),
            })
            .collect()
    }

    /// Matrices of the shapes `plan` lists built straight into one buffer in huge pages, as
    /// [`QMatrix::side_by_side`] leaves a model's matrices, from the file's row-major blocks: `read(i, first, out)`
    /// writes the bytes of matrix i's rows `first ..` (as many whole rows as `out` holds) and says whether it
    /// could. The rows pass through a buffer of each thread's own, reused for every matrix, and are interleaved
    /// from there into their stretch: a loader that read each matrix into fresh memory first paid a page fault
    /// per 4 KiB of the model and gave all of it back at the end (docs/runtime.md, "Start-up"). Matrix i is
    /// `None` where a read failed or a block's scale is not finite; the caller then reads it the ordinary way,
    /// which names the fault.
    pub(crate) fn gathered(
        plan: &[(BlockFormat, usize, usize)],
        read: impl Fn(usize, usize, &mut [u8]) -> bool + Sync,
    ) -> Vec<Option<QMatrix>> {
        Self::gathered_in_stages(plan, read, STAGE_BYTES)
    }

    /// [`QMatrix::gathered`] with about `stage` bytes of rows read at a time (whole tiles of rows, one at least).
    fn gathered_in_stages(
        plan: &[(BlockFormat, usize, usize)],
        read: impl Fn(usize, usize, &mut [u8]) -> bool + Sync,
        stage: usize,
    ) -> Vec<Option<QMatrix>> {
        use std::sync::atomic::{AtomicBool, Ordering};
        thread_local! {
            static STAGE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        let packed = |f: BlockFormat| simd::interleaved() && interleave::supported(f);
        let row_bytes =
            |&(f, _, cols): &(BlockFormat, usize, usize)| cols / f.block_elems() * f.block_bytes();
        let lens: Vec<usize> = plan
            .iter()
            .map(|p @ &(f, rows, cols)| {
                if packed(f) {
                    interleave::packed_len(f, rows, cols)
                } else {
                    rows * row_bytes(p)
                }
            })
            .collect();
        let good: Vec<AtomicBool> = plan.iter().map(|_| AtomicBool::new(false)).collect();
        let fill = |i: usize, out: &mut [u8]| {
            let (f, rows, cols) = plan[i];
            let rb = row_bytes(&plan[i]);
            // Whole tiles of rows at a time, about `stage` bytes of the file's (one tile at least).
            let step = ((stage / rb.max(1)) / interleave::ROWS).max(1) * interleave::ROWS;
            let tile = interleave::packed_len(f, interleave::ROWS, cols);
            let ok = STAGE.with_borrow_mut(|stage| {
                for first in (0..rows).step_by(step) {
                    let k = step.min(rows - first);
                    stage.resize(k * rb, 0);
                    let bytes = &mut stage[..k * rb];
                    if !read(i, first, bytes) || !reference::scales_finite(f, bytes) {
                        return false;
                    }
                    if packed(f) {
                        let at = first / interleave::ROWS * tile;
                        let len = interleave::packed_len(f, k, cols);
                        interleave::pack_into(f, k, cols, bytes, &mut out[at..at + len]);
                    } else {
                        out[first * rb..(first + k) * rb].copy_from_slice(bytes);
                    }
                }
                true
            });
            good[i].store(ok, Ordering::Relaxed);
        };
        let parts = pages::Shared::side_by_side(&lens, fill);
        plan.iter()
            .zip(parts)
            .zip(&good)
            .map(|((&(format, rows, cols), data), ok)| {
                ok.load(Ordering::Relaxed).then_some(QMatrix {
                    format,
                    rows,
                    cols,
                    data,
                    interleaved: packed(format),
                })
            })
            .collect()
    }

    /// Whether the bytes live in a mapping advised for huge pages ([`QMatrix::side_by_side`]).
    pub fn in_huge_pages(&self) -> bool {
        self.data.is_huge()
    }

    /// Rows of several matrices of one format and width stacked (q|k|v, gate|up); `None` if formats or widths
    /// differ or `parts` is empty.
    pub fn stack(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.format != first.format || p.cols != first.cols)
        {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let whole_tiles = parts[..parts.len() - 1]
            .iter()
            .all(|p| p.rows.is_multiple_of(interleave::ROWS));
        if first.interleaved && whole_tiles {
            // Tiles are independent: the stacked matrix's tiles are the parts' tiles in order.
            let data = pages::Shared::own(pages::WeightBytes::concat(
                &parts.iter().map(|p| &p.data[..]).collect::<Vec<_>>(),
            ));
            return Some(QMatrix {
                format: first.format,
                rows,
                cols: first.cols,
                data,
                interleaved: true,
            });
        }
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        for p in parts {
            data.extend_from_slice(&p.data());
        }
        QMatrix::new("stacked matrix", first.format, rows, first.cols, data).ok()
    }

    /// Dequantises row `r` into `out` (`out.len() == cols`), bit for bit as candle does.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols` (caller bugs, not input).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows && out.len() == self.cols,
            "dequantize_row: row or width out of range"
        );
        reference::dequantize_row(self.format, &self.row(r), out);
    }

    /// The whole matrix in f32, rows × cols, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        if self.cols > 0 {
            let data = self.data();
            let rb = self.row_bytes();
            for (r, y) in out.chunks_exact_mut(self.cols).enumerate() {
                reference::dequantize_row(self.format, &data[r * rb..(r + 1) * rb], y);
            }
        }
        out
    }

    /// Whether every scale (and min) of every block is finite (for F32/F16: every value), without dequantising.
    pub fn scales_finite(&self) -> bool {
        if self.interleaved {
            return interleave::scales_finite(self.format, &self.data);
        }
        reference::scales_finite(self.format, &self.data)
    }

    /// `y (n × rows, row-major) = x (n × cols, row-major) · Wᵀ`, for any n ≥ 1 (n = 0 does nothing). Each weight
    /// block is read from memory once per call for all n rows; output rows are split over the current rayon pool
    /// (on the calling thread when the pool has one thread).
    ///
    /// # Panics
    /// If `x.len() != n · cols` or `y.len() != n · rows` (caller bugs, not input).
    pub fn matmul(&self, x: &[f32], n: usize, y: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "matmul: x must hold n × cols values");
        assert_eq!(y.len(), n * self.rows, "matmul: y must hold n × rows values");
        if n == 0 || self.rows == 0 {
            return;
        }
        with_scratch(&ACTS, |acts| {
            if self.format.is_float() {
                acts.x.clear();
                acts.x.extend_from_slice(x);
            } else if self.interleaved && self.format.super_scaled() {
                acts.quantise_super(x, n, self.cols);
            } else {
                acts.quantise(x, n, self.cols);
            }
            let mut yt_owned = std::mem::take(&mut acts.yt);
            if self.interleaved {
                const R: usize = interleave::ROWS;
                let rows = self.rows;
                if rows.is_multiple_of(R) {
                    self.run_interleaved_into(acts, n, y);
                } else {
                    // Tile by tile, each tile's n runs of 16 outputs; then every run to its row of y.
                    let tiles = rows.div_ceil(R);
                    yt_owned.clear();
                    yt_owned.resize(tiles * R * n, 0.0);
                    self.run_interleaved(acts, n, &mut yt_owned);
                    for (t, tile) in yt_owned.chunks_exact(R * n).enumerate() {
                        let live = (rows - t * R).min(R);
                        for (i, run) in tile.chunks_exact(R).enumerate() {
                            y[i * rows + t * R..][..live].copy_from_slice(&run[..live]);
                        }
                    }
                }
            } else if n == 1 {
                self.run(acts, n, y);
            } else {
                yt_owned.clear();
                yt_owned.resize(n * self.rows, 0.0);
                self.run(acts, n, &mut yt_owned);
                // Transpose in blocks of 16 rows, so that every write fills a run of 64 bytes of y.
                let rows = self.rows;
                for (k, block) in yt_owned.chunks(16 * n).enumerate() {
                    let r0 = 16 * k;
                    let width = block.len() / n;
                    for i in 0..n {
                        let dst = &mut y[i * rows + r0..i * rows + r0 + width];
                        for (j, d) in dst.iter_mut().enumerate() {
                            *d = block[j * n + i];
                        }
                    }
                }
            }
            acts.yt = yt_owned;
        });
    }

    /// Computes `yt` (rows × n, row-major: the transpose of the result) tile by tile over the current pool.
    fn run(&self, acts: &Acts, n: usize, yt: &mut [f32]) {
        self.over_pool(TILE, n, yt, |t0, out| {
            with_scratch(&PANEL, |panel| {
                for (k, out) in out.chunks_mut(TILE * n).enumerate() {
                    let r0 = (t0 + k) * TILE;
                    self.tile(r0, acts, n, panel, out);
                }
            });
        });
    }

    /// The threads of the current pool a product of `n` activation rows is worth splitting over: 1 below about 10
    /// µs of work, where a fork-join would cost more than it saves.
    fn pool_threads(&self, n: usize) -> usize {
        if n * self.rows * self.cols < 1 << 18 {
            1
        } else {
            rayon::current_num_threads()
        }
    }

    /// Splits `out` (`tile_rows · n` values per tile of `tile_rows` weight rows) over the current pool in whole
    /// tiles and calls `work(first tile, its part of out)` on each part; on the calling thread at once where
    /// [`QMatrix::pool_threads`] is 1. Each part is whole tiles, so the split never changes a sum.
    fn over_pool(
        &self,
        tile_rows: usize,
        n: usize,
        out: &mut [f32],
        work: impl Fn(usize, &mut [f32]) + Sync,
    ) {
        let threads = self.pool_threads(n);
        if threads <= 1 {
            work(0, out);
            return;
        }
        let tiles_per_chunk = self.tiles_per_part(tile_rows, threads);
        out.par_chunks_mut(tiles_per_chunk * tile_rows * n)
            .enumerate()
            .for_each(|(c, out)| work(c * tiles_per_chunk, out));
    }

    /// Tiles of `tile_rows` weight rows per part when a product's tiles are split over `threads` threads: several
    /// parts per thread, for balance.
    fn tiles_per_part(&self, tile_rows: usize, threads: usize) -> usize {
        self.rows.div_ceil(tile_rows).div_ceil(threads * 4).max(1)
    }

    /// The bytes of one interleaved tile, and the quantised activations as the tile kernels read them.
    fn il_parts<'a>(&self, acts: &'a Acts) -> (usize, interleave::Acts<'a>) {
        let tile_bytes = self.cols / self.format.block_elems() * interleave::tile_block_bytes(self.format);
        let a = interleave::Acts {
            q: &acts.q,
            d: &acts.d,
            xs: &acts.xs32,
            xs16: &acts.xs16,
            sx: &acts.sx32,
            o16: &acts.o16,
            cols: self.cols,
        };
        (tile_bytes, a)
    }

    /// The products on the interleaved form into `out`, tile after tile, each tile's n activation rows after one
    /// another with 16 outputs each (the rows of the last tile beyond the matrix are padding); tiles are split over
    /// the current pool whole.
    fn run_interleaved(&self, acts: &Acts, n: usize, out: &mut [f32]) {
        const R: usize = interleave::ROWS;
        let (tile_bytes, a) = self.il_parts(acts);
        self.over_pool(R, n, out, |t0, out| {
            for (k, out) in out.chunks_mut(R * n).enumerate() {
                let t = t0 + k;
                let tile = &self.data[t * tile_bytes..(t + 1) * tile_bytes];
                simd::il_tile(self.format, tile, &a, 0..n, out, R);
            }
        });
    }

    /// The products on the interleaved form into `y` (n × rows, row-major; rows a whole number of tiles). One
    /// activation row: the tiles are split over the current pool whole, straight into `y`. Fewer than
    /// `IL_SPLIT_ROWS`: the tiles too, each part copying its columns into place (`tiles_into`). More: the
    /// activation rows are, in groups of at least `IL_SPLIT_ROWS / 2`, each part running every tile, straight into
    /// its rows of `y`. On one thread, every tile against every row in place (`rows_into`). No split changes a sum.
    fn run_interleaved_into(&self, acts: &Acts, n: usize, y: &mut [f32]) {
        if n == 1 {
            self.run_interleaved(acts, 1, y);
            return;
        }
        let threads = self.pool_threads(n);
        if threads <= 1 {
            self.rows_into(acts, 0..n, y);
            return;
        }
        if n < IL_SPLIT_ROWS {
            self.tiles_into(acts, n, threads, y);
            return;
        }
        let per = n.div_ceil(threads.min(n / (IL_SPLIT_ROWS / 2)).max(1));
        y.par_chunks_mut(per * self.rows)
            .enumerate()
            .for_each(|(k, y)| self.rows_into(acts, k * per..(k * per + per).min(n), y));
    }

    /// A few activation rows (fewer than `IL_SPLIT_ROWS`) on `threads` > 1 threads, rows a whole number of tiles:
    /// the tiles are split over the pool as in [`QMatrix::run_interleaved`], and each part writes its columns of
    /// every row of `y` itself, from a buffer of its own, right after computing them (the calling thread used to
    /// copy every 16 outputs into place after the split, alone, in 64-byte pieces). The same sums in the same order.
    fn tiles_into(&self, acts: &Acts, n: usize, threads: usize, y: &mut [f32]) {
        const R: usize = interleave::ROWS;
        let (tile_bytes, a) = self.il_parts(acts);
        let tiles = self.rows / R;
        let per = self.tiles_per_part(R, threads);
        let width = per * R;
        // Part c owns columns c·width .. of every row of y: n disjoint slices.
        let mut parts: Vec<Vec<&mut [f32]>> =
            (0..tiles.div_ceil(per)).map(|_| Vec::with_capacity(n)).collect();
        for row in y.chunks_exact_mut(self.rows) {
            for (part, cols) in parts.iter_mut().zip(row.chunks_mut(width)) {
                part.push(cols);
            }
        }
        parts.par_iter_mut().enumerate().for_each(|(c, part)| {
            with_scratch(&OUT, |buf| {
                let live = part[0].len();
                buf.clear();
                buf.resize(n * live, 0.0);
                for k in 0..live / R {
                    let t = c * per + k;
                    let tile = &self.data[t * tile_bytes..(t + 1) * tile_bytes];
                    simd::il_tile(self.format, tile, &a, 0..n, &mut buf[k * R..], live);
                }
                for (cols, got) in part.iter_mut().zip(buf.chunks_exact(live)) {
                    cols.copy_from_slice(got);
                }
            });
        });
    }

    /// Activation rows `rows` against every tile, into `y` (those rows of the result, row-major). Rows go in
    /// near-equal groups of at most `simd::il_group_rows()`, each group against a run of tiles of about `IL_RUN_BYTES`
    /// before the next group against the same run: a group's activations stay in the L1 data cache beside a tile
    /// (forty rows of a 576-wide matrix did not), the run in L2, and memory streams each weight once.
    fn rows_into(&self, acts: &Acts, rows: std::ops::Range<usize>, y: &mut [f32]) {
        const R: usize = interleave::ROWS;
        let (tile_bytes, a) = self.il_parts(acts);
        let n = rows.len();
        let per_group = n.div_ceil(n.div_ceil(simd::il_group_rows()));
        let run = (IL_RUN_BYTES / tile_bytes).max(1);
        let tiles = self.rows / R;
        for first in (0..tiles).step_by(run) {
            for g0 in (0..n).step_by(per_group) {
                let g = rows.start + g0..rows.start + (g0 + per_group).min(n);
                for t in first..(first + run).min(tiles) {
                    let tile = &self.data[t * tile_bytes..(t + 1) * tile_bytes];
                    simd::il_tile(
                        self.format,
                        tile,
                        &a,
                        g.clone(),
                        &mut y[g0 * self.rows + t * R..],
                        self.rows,
                    );
                }
            }
        }
    }

    /// Rows r0..r0+TILE (fewer at the end) against every activation row, into `out` ((rows in tile) × n).
    fn tile(&self, r0: usize, acts: &Acts, n: usize, panel: &mut Panel, out: &mut [f32]) {
        let live = (self.rows - r0).min(TILE);
        if self.format.is_float() {
            panel.float_rows(self, r0, live);
            simd::float_tile(&panel.f, &acts.x, n, self.cols, out);
            return;
        }
        panel.unpack(self, r0, live);
        let view = PanelView {
            u: &panel.u,
            s: &panel.s,
            sl: &panel.sl,
            o: &panel.o,
            cols: self.cols,
            split: self.format == BlockFormat::Q6K,
            max_code: match self.format {
                BlockFormat::Q8_0 => 255,
                BlockFormat::Q6K => 63,
                BlockFormat::Q5K | BlockFormat::Q5_0 | BlockFormat::Q5_1 => 31,
                _ => 15,
            },
        };
        let act = ActView {
            q: &acts.q,
            d: &acts.d,
            xs: if view.split { &acts.xs16 } else { &acts.xs32 },
            n,
            cols: self.cols,
        };
        simd::quant_tile(&view, &act, live, out);
    }
}

/// From this many activation rows on, an interleaved product on more than one thread splits the rows (not the
/// tiles) over the pool and writes straight into the result (`run_interleaved_into`); below, the tiles are split
/// and each part copies its columns into place (`tiles_into`), as a worker of a few rows would stream the whole
/// matrix from memory again (a SmolLM2 pass of 2 or 3 positions on 2 threads took 1.14–1.24× as long split by rows;
/// one of 8–12 positions 0.83–0.89× as long).
const IL_SPLIT_ROWS: usize = 8;
/// The bytes of interleaved tiles each group of activation rows runs over before the next group does.
const IL_RUN_BYTES: usize = 256 << 10;

/// Calibration for benchmarks: runs `iters` rounds of independent int8 dot-product instructions of the best
/// instruction set (512-bit `vpdpbusd` where the CPU has AVX-512 VNNI) and returns the multiply-adds done and a
/// checksum; multiply-adds per second on one thread is the integer peak a many-row product is measured against.
pub fn peak_int8_macs(iters: usize) -> (u64, i64) {
    simd::peak_probe(iters)
}

/// [`peak_int8_macs`] in eight chains with `fmas` (0 to 3; more count as 3) 512-bit fused multiply-adds beside every eight 512-bit `vpdpbusd` (one
/// block of 32 values, 16 rows, one activation row in the interleaved kernels), on CPUs with AVX-512 VNNI (None
/// elsewhere): what a block format's float work (scale product, accumulation, minimum term) leaves of the integer
/// peak. Returns the integer multiply-adds done and a checksum.
pub fn peak_int8_macs_with_fmas(iters: usize, fmas: usize) -> Option<(u64, i64)> {
    simd::peak_probe_fma(iters, fmas)
}

/// The name of the instruction set the kernels run with on this CPU (for reports).
pub fn instruction_set() -> &'static str {
    match simd::Isa::best() {
        simd::Isa::Avx512Vnni => "AVX-512 VNNI (512-bit vpdpbusd)",
        simd::Isa::AvxVnni => "AVX-VNNI (256-bit vpdpbusd)",
        simd::Isa::Avx2 => "AVX2 (vpmaddubsw)",
        simd::Isa::Portable => "portable Rust",
    }
}

/// The unpacked form of one weight tile, read by the kernels.
pub(crate) struct PanelView<'a> {
    /// TILE rows of `cols` codes.
    pub u: &'a [u8],
    /// TILE rows of cols/32 scales (not split).
    pub s: &'a [f32],
    /// TILE rows of cols/4 lane scales (split, Q6_K).
    pub sl: &'a [f32],
    /// TILE rows of offsets, one per group (cols/32, or cols/16 when split).
    pub o: &'a [f32],
    pub cols: usize,
    /// Whether scales are given per 4-value lane (`sl`) rather than per 32 values (`s`).
    pub split: bool,
    /// The largest code of the format (AVX2's `vpmaddubsw` is exact only up to 127).
    pub max_code: u8,
}

/// The quantised activations of one call, read by the kernels.
pub(crate) struct ActView<'a> {
    /// n rows of `cols` signed codes.
    pub q: &'a [i8],
    /// n rows of cols/32 scales.
    pub d: &'a [f32],
    /// n rows of `scale · Σ codes` per offset group (32 values, or 16 when the panel is split).
    pub xs: &'a [f32],
    pub n: usize,
    pub cols: usize,
}

/// Per-thread reusable buffers, so that a decoding step allocates nothing after the first call.
#[derive(Default)]
struct Acts {
    q: Vec<i8>,
    d: Vec<f32>,
    xs32: Vec<f32>,
    sx32: Vec<i32>,
    xs16: Vec<f32>,
    o16: Vec<i32>,
    x: Vec<f32>,
    yt: Vec<f32>,
}

impl Acts {
    /// Quantises x (n × cols) to signed codes with one scale per 32 values (round to nearest, |q| ≤ 127).
    fn quantise(&mut self, x: &[f32], n: usize, cols: usize) {
        let groups = n * cols / 32;
        self.q.resize(n * cols, 0);
        self.d.resize(groups, 0.0);
        self.xs32.resize(groups, 0.0);
        self.sx32.resize(groups, 0);
        self.xs16.resize(2 * groups, 0.0);
        simd::quantise_rows(
            x,
            simd::QuantisedRows {
                q: &mut self.q,
                d: &mut self.d,
                xs32: &mut self.xs32,
                sx32: &mut self.sx32,
                xs16: &mut self.xs16,
            },
        );
    }

    /// Quantises x (n × cols, cols a multiple of 256) for a k-quant product on the interleaved kernel: one scale
    /// per 256 values in `d`, exact code sums per 32 in `sx32`, −32 times those per 16 in `o16` (`xs32` and `xs16` unused).
    fn quantise_super(&mut self, x: &[f32], n: usize, cols: usize) {
        let values = n * cols;
        self.q.resize(values, 0);
        self.d.resize(values / 256, 0.0);
        self.sx32.resize(values / 32, 0);
        self.o16.resize(values / 16, 0);
        simd::quantise_super_rows(
            x,
            simd::SuperRows {
                q: &mut self.q,
                d: &mut self.d,
                sx32: &mut self.sx32,
                o16: &mut self.o16,
            },
        );
    }
}

#[derive(Default)]
struct Panel {
    u: Vec<u8>,
    s: Vec<f32>,
    sl: Vec<f32>,
    o: Vec<f32>,
    f: Vec<f32>,
}

impl Panel {
    /// Unpacks rows r0..r0+live of `m` (zero rows after them, up to TILE).
    fn unpack(&mut self, m: &QMatrix, r0: usize, live: usize) {
        let cols = m.cols;
        let split = m.format == BlockFormat::Q6K;
        let groups = cols / m.format.group();
        self.u.resize(TILE * cols, 0);
        self.s.resize(TILE * cols / 32, 0.0);
        self.sl.resize(if split { TILE * cols / 4 } else { 0 }, 0.0);
        self.o.resize(TILE * groups, 0.0);
        for t in 0..TILE {
            let u = &mut self.u[t * cols..(t + 1) * cols];
            let s = &mut self.s[t * cols / 32..(t + 1) * cols / 32];
            let sl = if split {
                &mut self.sl[t * cols / 4..(t + 1) * cols / 4]
            } else {
                &mut self.sl[..0]
            };
            let o = &mut self.o[t * groups..(t + 1) * groups];
            if t < live {
                simd::unpack_row(m.format, &m.row(r0 + t), reference::RowView { u, s, sl, o });
            } else {
                u.fill(0);
                s.fill(0.0);
                sl.fill(0.0);
                o.fill(0.0);
            }
        }
    }

    /// Rows r0..r0+live of a float matrix as f32 (zeros after them, up to TILE).
    fn float_rows(&mut self, m: &QMatrix, r0: usize, live: usize) {
        let cols = m.cols;
        self.f.resize(TILE * cols, 0.0);
        for t in 0..TILE {
            let f = &mut self.f[t * cols..(t + 1) * cols];
            if t < live && m.format == BlockFormat::F16 {
                simd::f16_row(&m.row(r0 + t), f);
            } else if t < live {
                reference::dequantize_row(m.format, &m.row(r0 + t), f);
            } else {
                f.fill(0.0);
            }
        }
    }
}

thread_local! {
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    static OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer, or on a fresh one if it is in use (a product nested in another's wait).
fn with_scratch<T: Default, R>(
    key: &'static std::thread::LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut T::default()),
    })
}

/// Bytes of the file's rows staged at a time by [`QMatrix::gathered`].
const STAGE_BYTES: usize = 256 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    /// Random bytes of a (rows × cols) matrix of `format` whose f16 scales (and mins) are small finite values.
    fn blocks(format: BlockFormat, rows: usize, cols: usize, salt: usize) -> Vec<u8> {
        let (bb, nb) = (format.block_bytes(), cols / format.block_elems());
        let mut data: Vec<u8> = (0..rows * nb * bb)
            .map(|i| ((i * 131 + salt * 17 + 7) % 251) as u8)
            .collect();
        // An f16 of exponent field 0b01100 (about 1/8 .. 1/4): the second byte of every half is 0x30.
        for (i, b) in data.iter_mut().enumerate() {
            if i % 2 == 1 {
                *b = 0x30 | (*b & 0x03);
            }
        }
        data
    }

    /// The file bytes of a (rows × cols) matrix of `format`: [`blocks`], or counting halves for F16.
    fn file_bytes(format: BlockFormat, rows: usize, cols: usize, salt: usize) -> Vec<u8> {
        if format == BlockFormat::F16 {
            (0..rows * cols)
                .flat_map(|k| (0x3000u16 + k as u16).to_le_bytes())
                .collect()
        } else {
            blocks(format, rows, cols, salt)
        }
    }

    /// `b` holds what `a` holds: the same stored bytes, the same file bytes, the same product bits over three rows.
    fn same_matrix(a: &QMatrix, b: &QMatrix, what: &str) {
        let (rows, cols) = (a.rows, a.cols);
        assert_eq!(&a.data[..], &b.data[..], "{what}: the stored bytes");
        assert_eq!(a.data(), b.data(), "{what}: the file's bytes");
        let x: Vec<f32> = (0..3 * cols)
            .map(|k| ((k * 37 % 19) as f32 - 9.0) / 7.0)
            .collect();
        let (mut ya, mut yb) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
        a.matmul(&x, 3, &mut ya);
        b.matmul(&x, 3, &mut yb);
        assert_eq!(
            ya.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            yb.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{what}: the products"
        );
    }

    /// Matrices built straight into the shared buffer from staged file rows hold what one interleaved at once
    /// holds (the same form, file bytes and product bits), whether the rows come in one stage or in stages of a
    /// tile (row counts that are and are not whole tiles); a failed read or a non-finite scale leaves that matrix
    /// out and the others built.
    #[test]
    fn matrices_gathered_from_staged_rows_equal_ones_built_at_once() {
        let plan = [
            (BlockFormat::Q4_1, 50, 64),
            (BlockFormat::Q8_0, 32, 96),
            (BlockFormat::Q6K, 17, 256),
            (BlockFormat::Q4_0, 7, 32),
            (BlockFormat::F16, 5, 8),
            (BlockFormat::Q4_0, 40, 32),
            (BlockFormat::Q8_0, 16, 32),
        ];
        let mut files: Vec<Vec<u8>> = plan
            .iter()
            .enumerate()
            .map(|(i, &(format, rows, cols))| file_bytes(format, rows, cols, i))
            .collect();
        // Matrix 5's reads fail from row 16 on; matrix 6 has an infinite scale (f16 0x7c00) in its last row.
        let last = files[6].len() - BlockFormat::Q8_0.block_bytes();
        files[6][last..last + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        let read = |i: usize, first: usize, out: &mut [u8]| {
            let (format, _, cols) = plan[i];
            let rb = cols / format.block_elems() * format.block_bytes();
            if i == 5 && first + out.len() / rb > 16 {
                return false;
            }
            out.copy_from_slice(&files[i][first * rb..first * rb + out.len()]);
            true
        };
        for stage in [1, STAGE_BYTES] {
            let built = QMatrix::gathered_in_stages(&plan, read, stage);
            assert!(built[5].is_none() && built[6].is_none(), "stage {stage}");
            for (i, m) in built.iter().enumerate().take(5) {
                let (format, rows, cols) = plan[i];
                let m = m.as_ref().expect("built");
                let now = QMatrix::new("now", format, rows, cols, files[i].clone()).unwrap();
                assert_eq!(m.interleaved, now.interleaved, "{format:?}");
                same_matrix(&now, m, &format!("{format:?}, stage {stage}"));
            }
        }
    }

    /// A matrix kept in the file's order and gathered later holds, after the gathering, what one interleaved at
    /// once holds (the same form, the same file bytes back, the same product bits); gathered beside matrices that
    /// were interleaved already and ones with no interleaved form.
    #[test]
    fn file_order_matrices_are_interleaved_where_they_are_gathered() {
        let shapes = [
            (BlockFormat::Q4_1, 33, 64),
            (BlockFormat::Q8_0, 16, 96),
            (BlockFormat::Q4_0, 7, 32),
            (BlockFormat::Q4K, 20, 256),
            (BlockFormat::F16, 5, 8),
        ];
        let mut now = Vec::new();
        let mut later = Vec::new();
        for (i, &(format, rows, cols)) in shapes.iter().enumerate() {
            let data = file_bytes(format, rows, cols, i);
            now.push(QMatrix::new("now", format, rows, cols, data.clone()).unwrap());
            // Every other one gathered after being interleaved already.
            later.push(if i % 2 == 0 {
                QMatrix::file_order("later", format, rows, cols, data).unwrap()
            } else {
                QMatrix::new("later", format, rows, cols, data).unwrap()
            });
        }
        let refs: Vec<&QMatrix> = later.iter().collect();
        let gathered = QMatrix::side_by_side(&refs);
        for ((a, b), (format, _, _)) in now.iter().zip(&gathered).zip(shapes) {
            assert_eq!(a.interleaved, b.interleaved, "{format:?}");
            same_matrix(a, b, &format!("{format:?}"));
            assert!(b.scales_finite());
        }
        // The file-order matrix is usable before it is gathered too: the same product as the interleaved one
        // within rounding (the two forms sum in different orders).
        let (format, rows, cols) = shapes[0];
        let x: Vec<f32> = (0..cols).map(|k| (k % 5) as f32 - 2.0).collect();
        let (mut ya, mut yb) = (vec![0f32; rows], vec![0f32; rows]);
        now[0].matmul(&x, 1, &mut ya);
        later[0].matmul(&x, 1, &mut yb);
        for (p, q) in ya.iter().zip(&yb) {
            assert!(
                (p - q).abs() <= 1e-3 * (1.0 + p.abs()),
                "{format:?}: {p} against {q}"
            );
        }
    }
}
