//! Weight bytes, and one buffer in transparent huge pages for all the matrices of a model.
//!
//! Why: a decoding step streams every weight once, 90–145 MB for SmolLM2-135M. Through 4 KiB pages that is one TLB
//! entry per 4 KiB, tens of thousands of page walks per step beside the reads; in 2 MiB pages 512× fewer, and a
//! one-thread SmolLM2 step got faster by a sixth to a quarter (docs/runtime.md, "Huge pages"). Linux's usual
//! setting (`/sys/kernel/mm/transparent_hugepage/enabled` = `madvise`) gives huge pages only to memory that asks for
//! them, and only for 2 MiB-aligned stretches that lie whole inside one mapping when they are first touched: a layer's
//! matrix of 0.2–2 MiB mapped on its own would get none. So a loaded model's matrices are copied side by side into
//! one anonymous mapping advised `MADV_HUGEPAGE` ([`Shared`], `QMatrix::side_by_side`). Where the advice is refused
//! (THP compiled out) the mapping holds ordinary pages, and where there is no mapping (another system, or the call
//! fails) the bytes live on the heap: only the speed differs.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A zero-initialised byte buffer of fixed length: on the heap, or an anonymous mapping advised for huge pages.
pub(crate) struct WeightBytes(Inner);

enum Inner {
    Heap(Vec<u8>),
    /// A mapping, and whether it was advised for huge pages.
    #[cfg(target_os = "linux")]
    Mapped(memmap2::MmapMut, bool),
}

/// Buffers under this many bytes stay on the heap: a mapping for each small matrix would cost more than it saves.
const MAPPED_FROM: usize = 64 * 1024;

impl WeightBytes {
    /// `len` zero bytes: on the heap when short, else a mapping of their own (given back to the system when
    /// dropped: a model's matrices are built one by one and then copied into one buffer, and on the heap their
    /// first copies would stay in the allocator's hands).
    pub(crate) fn zeroed(len: usize) -> WeightBytes {
        #[cfg(target_os = "linux")]
        if len >= MAPPED_FROM
            && let Ok(m) = memmap2::MmapMut::map_anon(len)
        {
            return WeightBytes(Inner::Mapped(m, false));
        }
        WeightBytes(Inner::Heap(vec![0; len]))
    }

    /// `len` zero bytes in huge pages where the system gives them (on the heap otherwise).
    pub(crate) fn zeroed_huge(len: usize) -> WeightBytes {
        #[cfg(target_os = "linux")]
        if len > 0
            && let Ok(m) = memmap2::MmapMut::map_anon(len)
        {
            // The advice only changes how the kernel backs the pages; refused, the mapping still holds zeroed
            // bytes in ordinary pages.
            let advised = m.advise(memmap2::Advice::HugePage).is_ok();
            return WeightBytes(Inner::Mapped(m, advised));
        }
        WeightBytes(Inner::Heap(vec![0; len]))
    }

    /// A copy of `bytes` on the heap.
    #[cfg(test)]
    pub(crate) fn copy_of(bytes: &[u8]) -> WeightBytes {
        WeightBytes(Inner::Heap(bytes.to_vec()))
    }

    /// The bytes of `v`, on the heap.
    pub(crate) fn from_vec(v: Vec<u8>) -> WeightBytes {
        WeightBytes(Inner::Heap(v))
    }

    /// The parts one after the other (where [`WeightBytes::zeroed`] puts them).
    pub(crate) fn concat(parts: &[&[u8]]) -> WeightBytes {
        let mut w = WeightBytes::zeroed(parts.iter().map(|p| p.len()).sum());
        let mut at = 0;
        for p in parts {
            w[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        w
    }

    /// Whether the bytes live in a mapping advised for huge pages (not a promise that the kernel found them).
    pub(crate) fn is_huge(&self) -> bool {
        match self.0 {
            Inner::Heap(_) => false,
            #[cfg(target_os = "linux")]
            Inner::Mapped(_, advised) => advised,
        }
    }
}

impl Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped(m, _) => m,
        }
    }
}

impl DerefMut for WeightBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Heap(v) => v,
            #[cfg(target_os = "linux")]
            Inner::Mapped(m, _) => m,
        }
    }
}

impl fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Inner::Heap(_) => "heap",
            #[cfg(target_os = "linux")]
            Inner::Mapped(_, false) => "mapped",
            #[cfg(target_os = "linux")]
            Inner::Mapped(_, true) => "mapped, huge pages",
        };
        write!(f, "WeightBytes({} bytes, {kind})", self.len())
    }
}

/// A matrix's bytes: a buffer of its own, or its stretch of a buffer shared with the other matrices of a model
/// (read-only once shared, so clones share it too).
#[derive(Clone, Debug)]
pub(crate) enum Shared {
    Own(Arc<WeightBytes>),
    Part {
        all: Arc<WeightBytes>,
        start: usize,
        len: usize,
    },
}

/// Where each part starts in a buffer holding them side by side: at multiples of a cache line.
const PART_ALIGN: usize = 64;

impl Shared {
    /// Bytes of their own.
    pub(crate) fn own(w: WeightBytes) -> Shared {
        Shared::Own(Arc::new(w))
    }

    /// Parts of `lens` bytes side by side in one buffer in huge pages, each starting at a multiple of 64 bytes and
    /// written by `fill(i, stretch)` (the stretch of part i, zero bytes when given); one `Shared` per part, in order.
    /// The parts are filled on the threads of the current rayon pool, each by one call: filling (a SmolLM2 file's
    /// matrices interleaved into their tiles, and the kernel clearing each fresh page on its first write) was the
    /// largest share of a start-up's CPU time, on one thread while the other had finished its part of the load.
    pub(crate) fn side_by_side(lens: &[usize], fill: impl Fn(usize, &mut [u8]) + Sync) -> Vec<Shared> {
        use rayon::prelude::*;
        let mut starts = Vec::with_capacity(lens.len());
        let mut end = 0;
        for &len in lens {
            starts.push(end);
            end = (end + len).next_multiple_of(PART_ALIGN);
        }
        let mut all = WeightBytes::zeroed_huge(end);
        // Each part's stretch as a slice of its own (the padding between them left out), then all filled at once.
        let mut stretches: Vec<&mut [u8]> = Vec::with_capacity(lens.len());
        let mut rest: &mut [u8] = &mut all;
        let mut at = 0;
        for (&len, &s) in lens.iter().zip(&starts) {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(s - at);
            let (stretch, tail) = tail.split_at_mut(len);
            stretches.push(stretch);
            rest = tail;
            at = s + len;
        }
        stretches
            .into_par_iter()
            .enumerate()
            .for_each(|(i, stretch)| fill(i, stretch));
        let all = Arc::new(all);
        lens.iter()
            .zip(starts)
            .map(|(&len, start)| Shared::Part {
                all: all.clone(),
                start,
                len,
            })
            .collect()
    }

    /// Whether the bytes live in a mapping advised for huge pages.
    pub(crate) fn is_huge(&self) -> bool {
        match self {
            Shared::Own(w) | Shared::Part { all: w, .. } => w.is_huge(),
        }
    }
}

impl Deref for Shared {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Shared::Own(w) => w,
            Shared::Part { all, start, len } => &all[*start..*start + *len],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, salt: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + salt) as u8).collect()
    }

    #[test]
    fn buffers_hold_what_was_written() {
        for len in [0, 1, 4095, 3 << 20] {
            let src = bytes(len, 3);
            assert_eq!(&WeightBytes::copy_of(&src)[..], &src[..], "len {len}");
            let z = WeightBytes::zeroed(len);
            assert!(z.iter().all(|&b| b == 0) && z.len() == len, "zeroed {len}");
            assert!(!z.is_huge());
            let huge = WeightBytes::zeroed_huge(len);
            assert_eq!(huge.len(), len);
            assert!(huge.iter().all(|&b| b == 0), "zeroed_huge {len}");
            let halves = WeightBytes::concat(&[&src[..len / 2], &src[len / 2..]]);
            assert_eq!(&halves[..], &src[..], "concat of len {len}");
        }
    }

    #[test]
    fn parts_side_by_side_read_back_each_part_at_aligned_starts() {
        let parts: Vec<Vec<u8>> = [0, 1, 63, 64, 65, 100_000, 5]
            .iter()
            .enumerate()
            .map(|(i, &l)| bytes(l, i))
            .collect();
        let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
        let shared = Shared::side_by_side(&lens, |i, out| {
            assert!(out.iter().all(|&b| b == 0), "part {i} given non-zero bytes");
            out.copy_from_slice(&parts[i]);
        });
        assert_eq!(shared.len(), parts.len());
        for (s, p) in shared.iter().zip(&parts) {
            assert_eq!(&s[..], &p[..]);
            if s.is_huge() && !p.is_empty() {
                assert!((s.as_ptr() as usize).is_multiple_of(PART_ALIGN));
            }
            assert_eq!(&s.clone()[..], &p[..]);
        }
    }
}
