//! The correction phase of one outcome: its rejected set (a scan of the devices, or one edit of the set before a
//! one-device move) and T_comm of that set under a mode rule (paper B §IV), with the UL delays kept in a lazy
//! table and Proposition 1's bisection decided by SNR ratios where they decide it by far.

use super::GoodputEngine;
use crate::paper_b::reactive::ModeScheme;
use std::sync::atomic::{AtomicU64, Ordering};

/// The relative margin by which an upper bound must fall below a threshold before a search skips the move, and
/// by which the cheap comparisons of the reactive split must be decided before they are trusted: far above the
/// rounding of either side (a few ulps), so a skip or a shortcut never differs from the exact computation.
pub const BOUND_MARGIN: f64 = 1e-9;

/// Up to this many devices an engine keeps every UL delay τ^ul(B/m, g_k) it computes (K² cells, 2 MiB at 512):
/// the optimal split asks for at most two of them per outcome and evaluation, and a lookup is much cheaper than the
/// logarithm of the Shannon rate. The cells are filled when first asked, since a search asks for few of the K².
/// Above it they are computed when asked, so memory stays linear in K.
pub const UL_TABLE_MAX_DEVICES: usize = 512;

/// Marks an entry of the lazy UL-delay table as not computed yet (a NaN pattern no delay takes: the delay of a
/// positive finite gain is a positive number or +∞).
const UNSET: u64 = u64::MAX;

/// τ^ul by (m − 1)·K + position, filled when first asked (see [`UL_TABLE_MAX_DEVICES`]); empty when the engine
/// keeps no table. Atomic cells so that an engine stays `Sync` for parallel callers; a race only computes the
/// same value twice.
#[derive(Debug, Default)]
pub(super) struct UlTable(pub(super) Vec<AtomicU64>);

impl UlTable {
    /// A table of every cell for `devices` devices, none computed yet.
    pub(super) fn unset(devices: usize) -> UlTable {
        UlTable((0..devices * devices).map(|_| AtomicU64::new(UNSET)).collect())
    }
}

impl Clone for UlTable {
    fn clone(&self) -> Self {
        UlTable(
            self.0
                .iter()
                .map(|c| AtomicU64::new(c.load(Ordering::Relaxed)))
                .collect(),
        )
    }
}

/// One outcome's rejected set: positions descending (the weakest device first) and the running sums of 1/g^dl
/// over them from the weakest, as the reactive split needs them (the sum from the i-th device in UL order on).
#[derive(Debug, Default, Clone)]
pub(crate) struct SetBuf {
    pub(crate) set: Vec<u32>,
    pub(crate) sums: Vec<f64>,
}

/// Bit i set iff f\[i\] ≤ cap\[i\] (at most 64 entries, every one below 2^15: F ≤ L_max + 1 ≤ 1001).
///
/// Four 16-bit lanes per step (SWAR): with the lanes' top bits H set in cap, (cap | H) − f keeps lane i's top
/// bit iff f\[i\] ≤ cap\[i\] and never borrows across lanes; one multiplication gathers the four top bits. Hand
/// written because this comparison is the inner loop of every T_comm the searches compute.
pub(super) fn rejection_mask(f: &[u16], cap: &[u16]) -> u64 {
    const HIGH: u64 = 0x8000_8000_8000_8000;
    // Lane bits at 0, 16, 32, 48 → 48, 49, 50, 51 (the other partial products land below 48 or above 63).
    const GATHER: u64 = (1 << 48) | (1 << 33) | (1 << 18) | (1 << 3);
    let pack = |x: &[u16]| x.iter().rev().fold(0u64, |acc, &v| (acc << 16) | u64::from(v));
    let mut mask = 0u64;
    let (f4, f_rest) = f.split_at(f.len() / 4 * 4);
    let (c4, c_rest) = cap.split_at(f4.len());
    for (i, (a, b)) in f4.chunks_exact(4).zip(c4.chunks_exact(4)).enumerate() {
        let top = ((pack(b) | HIGH) - pack(a)) & HIGH;
        mask |= ((top >> 15).wrapping_mul(GATHER) >> 48) << (4 * i);
    }
    for (i, (&a, &b)) in f_rest.iter().zip(c_rest).enumerate() {
        mask |= u64::from(a <= b) << (f4.len() + i);
    }
    mask
}

impl GoodputEngine {
    /// τ^ul of the device at position `p` when `m` devices share the band (see [`UlTable`]).
    #[inline]
    pub(crate) fn ul(&self, m: usize, p: usize) -> f64 {
        match self.ul_table.0.get((m - 1) * self.order.len() + p) {
            Some(cell) => match cell.load(Ordering::Relaxed) {
                UNSET => self.ul_fill(m, p),
                bits => f64::from_bits(bits),
            },
            None => self.ul_delay(m, p),
        }
    }

    /// [`Self::ul`] the first time a table cell is asked for.
    #[cold]
    fn ul_fill(&self, m: usize, p: usize) -> f64 {
        let v = self.ul_delay(m, p);
        self.ul_table.0[(m - 1) * self.order.len() + p].store(v.to_bits(), Ordering::Relaxed);
        v
    }

    /// τ^ul(B/m, g^ul) of the device at position `p`.
    pub(crate) fn ul_delay(&self, m: usize, p: usize) -> f64 {
        self.link.ul_delay_s(self.link.share_hz(m), self.ul_gain[p])
    }

    /// Whether `self.ul(m, pos) < c`, without the logarithm (or a table cell) when bounds on log₂(1 + SNR) from
    /// its binary exponent e and mantissa 1 + f decide it by far: f ≤ log₂(1 + f) ≤ f + 0.0862 on [0, 1), so
    /// D/(b (e + f)) ≥ τ^ul ≥ D/(b (e + f + 0.0862)). Within the ranges of `snr_shortcut` and for SNR ≥ 10⁻³ every
    /// quantity is a normal number a few ulps from its exact value, far inside the 10⁻⁶ margin; otherwise, or
    /// when c is within the margin of the bounds, the delay itself decides.
    pub(crate) fn ul_below(&self, m: usize, pos: usize, c: f64) -> bool {
        const MARGIN: f64 = 1e-6;
        let link = &self.link;
        // 1/b = m/B; the comparisons below are multiplied out (no division by log₂).
        let per_hz = m as f64 / link.bandwidth_hz;
        let snr = link.ul_power_w * self.ul_gain[pos] * per_hz / link.noise_psd_server_w_per_hz;
        if self.snr_shortcut && snr >= 1e-3 {
            let bits = (1.0 + snr).to_bits();
            let e = ((bits >> 52) & 0x7ff) as f64 - 1023.0;
            let f = f64::from_bits((bits & ((1 << 52) - 1)) | 1f64.to_bits()) - 1.0;
            let per = link.distribution_bits * per_hz;
            if per * (1.0 + MARGIN) < c * (e + f) {
                return true;
            }
            if per > c * (1.0 + MARGIN) * (e + f + 0.0862) {
                return false;
            }
        }
        self.ul(m, pos) < c
    }

    /// The rejection caps by position in the device order, into `caps`: `cap(k)` for device k (rejected in an
    /// outcome iff its F ≤ cap).
    pub(crate) fn caps(&self, cap: impl Fn(usize) -> u16, caps: &mut Vec<u16>) {
        caps.clear();
        caps.extend(self.order.iter().map(|&k| cap(k)));
    }

    /// The rejected set of outcome `s` at `caps` and its running sums of 1/g^dl, into `buf`.
    ///
    /// With the outcome-major copy of F: 64 positions at a time, a mask of the rejected ones, then only those,
    /// from the weakest. Without it (an engine that only scores): one branch-free pass from the weakest device to
    /// the strongest over the device-major F (every slot is written, the count only advances on a rejection, and
    /// adding 0.0 leaves a sum unchanged). Both make the same additions in the same order, so the same bits.
    pub(crate) fn scan(&self, s: usize, caps: &[u16], buf: &mut SetBuf) {
        let k_n = self.order.len();
        let SetBuf { set, sums } = buf;
        set.resize(k_n, 0);
        sums.resize(k_n, 0.0);
        let (mut m, mut acc) = (0usize, 0.0f64);
        if self.tables.by_outcome.is_empty() {
            let first = self.samples.first_rejections();
            let n = self.samples.count();
            for pos in (0..k_n).rev() {
                let hit = first[self.order[pos] * n + s] <= caps[pos];
                acc += if hit { self.inverse_dl_gain[pos] } else { 0.0 };
                set[m] = pos as u32;
                sums[m] = acc;
                m += usize::from(hit);
            }
        } else {
            let row = &self.tables.by_outcome[s * k_n..(s + 1) * k_n];
            let mut end = k_n;
            while end > 0 {
                let start = end.saturating_sub(64);
                // Bit 63 − i of `reversed` for position start + i: the lowest set bit is the weakest rejected
                // device left, and clearing it (mask & (mask − 1)) does not wait on a bit count.
                let mut reversed = rejection_mask(&row[start..end], &caps[start..end]).reverse_bits();
                while reversed != 0 {
                    let i = 63 - reversed.trailing_zeros() as usize;
                    reversed &= reversed - 1;
                    let pos = start + i;
                    acc += self.inverse_dl_gain[pos];
                    set[m] = pos as u32;
                    sums[m] = acc;
                    m += 1;
                }
                end = start;
            }
        }
        set.truncate(m);
        sums.truncate(m);
    }

    /// The rejected set of an outcome after the device at position `p` enters or leaves it, from the set before
    /// (`set`, `sums`, as [`Self::scan`] leaves them): the part after `p` is copied, `p` inserted or dropped, and
    /// the sums from there on are added again in the same order, so the result is bit for bit what a scan of the
    /// new set gives, in O(|R|) copies instead of O(K) tests.
    pub(crate) fn edit(&self, set: &[u32], sums: &[f64], p: u32, buf: &mut SetBuf) {
        let j = set.partition_point(|&q| q > p);
        buf.set.clear();
        buf.sums.clear();
        buf.set.extend_from_slice(&set[..j]);
        buf.sums.extend_from_slice(&sums[..j]);
        let mut acc = if j == 0 { 0.0 } else { sums[j - 1] };
        let tail = if set.get(j) == Some(&p) {
            j + 1
        } else {
            acc += self.inverse_dl_gain[p as usize];
            buf.set.push(p);
            buf.sums.push(acc);
            j
        };
        for &q in &set[tail..] {
            acc += self.inverse_dl_gain[q as usize];
            buf.set.push(q);
            buf.sums.push(acc);
        }
    }

    /// T_comm of outcome `s` at `caps` and the number of devices corrected in UL mode, with `buf` as scratch (it
    /// keeps the rejected set).
    pub(crate) fn comm(&self, s: usize, caps: &[u16], buf: &mut SetBuf) -> (f64, usize) {
        self.scan(s, caps, buf);
        self.comm_of_set(s, &buf.set, &buf.sums)
    }

    /// T_comm of outcome `s` with rejected set `set` (positions descending) and `sums` (running sums of 1/g^dl
    /// from the weakest), and the number of UL devices.
    pub(crate) fn comm_of_set(&self, s: usize, set: &[u32], sums: &[f64]) -> (f64, usize) {
        let m = set.len();
        if m == 0 {
            return (0.0, 0);
        }
        let b = self.link.share_hz(m);
        // The i-th rejected position in UL-delay order (ascending position).
        let at = |i: usize| set[m - 1 - i] as usize;
        match self.modes {
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                // Lemma 2 holds with separate DL gains: for a largest UL delay t, putting every device with
                // τ^ul ≤ t in UL only shrinks Σ 1/g^dl of the rest, so an optimal UL set is a prefix in UL order.
                // Σ 1/g^dl over the rejected devices from the i-th in UL order on (0 for i = m).
                let sum_from = |i: usize| if i < m { sums[m - 1 - i] } else { 0.0 };
                let (n_ul, delay) = self.split(m, b, at, sum_from);
                (delay, n_ul)
            }
            ModeScheme::AllUl => (self.ul(m, at(m - 1)), m),
            ModeScheme::AllDl => {
                let inv: f64 = (0..m).map(|i| self.inverse_dl_gain[at(i)]).sum();
                (self.link.dl_delay_s(b, inv), 0)
            }
            ModeScheme::Random => {
                let mut ul_max = 0.0f64;
                let mut inv = 0.0;
                let mut n_ul = 0;
                for p in (0..m).map(at) {
                    if self.samples.ul_coin(self.order[p], s) {
                        ul_max = ul_max.max(self.ul(m, p));
                        n_ul += 1;
                    } else {
                        inv += self.inverse_dl_gain[p];
                    }
                }
                (ul_max.max(self.link.dl_delay_s(b, inv)), n_ul)
            }
        }
    }

    /// [`split_by_bisection`](crate::paper_b::reactive::split_by_bisection) with ul(i) = τ^ul of the i-th device
    /// and dl(n) = τ^dl of Σ 1/g^dl = `sum_from(n)`: the same decisions and result bit for bit, with two logarithms
    /// instead of one per step. τ^ul(n) ≥ τ^dl(n) iff the UL SNR of the n-th device is at most the Lemma-1 DL SNR
    /// of the suffix (both delays are D/(b log₂(1 + SNR)) at the same b), and the SNRs need no logarithm. A
    /// comparison decided by less than [`BOUND_MARGIN`], or any comparison outside the ranges of `snr_shortcut`,
    /// uses the delays themselves, as the bisection does.
    fn split(
        &self,
        m: usize,
        b: f64,
        at: impl Fn(usize) -> usize,
        sum_from: impl Fn(usize) -> f64,
    ) -> (usize, f64) {
        let link = &self.link;
        let tau_ul = |n: usize| if n == 0 { 0.0 } else { self.ul(m, at(n - 1)) };
        let dl = |n: usize| link.dl_delay_s(b, sum_from(n));
        // SNR_ul = P_ul g^ul / (N0_ser b), SNR_dl = P_dl / (N0_dev b S): their ratio by products, no division.
        let ul_per_gain = link.ul_power_w / (link.noise_psd_server_w_per_hz * b);
        let dl_noise = link.noise_psd_device_w_per_hz * b;
        // Whether τ^ul < τ^dl at lo and τ^ul ≥ τ^dl at hi hold for the computed delays: at the start (τ^ul(0) = 0,
        // τ^dl(m) = 0) and after a step the SNRs decided by more than the margin, so that the max below is known
        // without computing the other delay.
        let (mut lo, mut hi) = (0usize, m);
        let (mut lo_sure, mut hi_sure) = (true, true);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let sum = sum_from(mid);
            let ratio = self.ul_gain[at(mid - 1)] * ul_per_gain * (dl_noise * sum) * self.inverse_dl_power;
            let (ul_slower, sure) = if self.snr_shortcut && ratio < 1.0 - BOUND_MARGIN {
                (true, true)
            } else if self.snr_shortcut && ratio > 1.0 + BOUND_MARGIN {
                (false, true)
            } else {
                (tau_ul(mid) >= dl(mid), false)
            };
            if ul_slower {
                hi = mid;
                hi_sure = sure;
            } else {
                lo = mid;
                lo_sure = sure;
            }
        }
        // As in `split_by_bisection`: the best is lo (cost τ^dl) or hi (cost τ^ul). When both costs are those
        // delays, the SNRs of hi's UL device and lo's DL suffix decide which is smaller as in the steps above, and
        // hi's cost is a table lookup: no logarithm for τ^dl(lo) when hi wins.
        if self.snr_shortcut && lo_sure && hi_sure {
            let ratio =
                self.ul_gain[at(hi - 1)] * ul_per_gain * (dl_noise * sum_from(lo)) * self.inverse_dl_power;
            if ratio > 1.0 + BOUND_MARGIN {
                return (hi, tau_ul(hi));
            }
            if ratio < 1.0 - BOUND_MARGIN {
                return (lo, dl(lo));
            }
        }
        let cost_lo = if lo_sure { dl(lo) } else { dl(lo).max(tau_ul(lo)) };
        let cost_hi = if hi_sure {
            tau_ul(hi)
        } else {
            tau_ul(hi).max(dl(hi))
        };
        if cost_hi <= cost_lo {
            (hi, cost_hi)
        } else {
            (lo, cost_lo)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{CorrectionSetup, Samples, Weights};
    use crate::paper_b::reactive::{Link, split_by_bisection};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Every mode rule an engine evaluates.
    const MODES: [ModeScheme; 4] = [
        ModeScheme::Optimal,
        ModeScheme::AllUl,
        ModeScheme::AllDl,
        ModeScheme::Random,
    ];

    /// Paper B's correction link at the given powers.
    fn link(ul_power_w: f64, dl_power_w: f64) -> Link {
        Link {
            distribution_bits: 34_816.0,
            bandwidth_hz: 1e7,
            ul_power_w,
            dl_power_w,
            noise_psd_server_w_per_hz: 1.26e-20,
            noise_psd_device_w_per_hz: 2.0e-20,
        }
    }

    /// An engine with gains and powers spread over many decades, so that the UL and DL SNRs of the reactive split
    /// come close (the shortcut's fallback) and far apart; separate UL and DL gains when `separate` (the unified
    /// model's), the same ones otherwise (paper B's); with `outside`, device 0's UL gain is outside the SNR
    /// shortcut's range (every comparison of the split then uses the delays).
    fn spread(
        rng: &mut ChaCha8Rng,
        k: usize,
        modes: ModeScheme,
        (separate, tables, outside): (bool, bool, bool),
    ) -> GoodputEngine {
        let max_draft_len = rng.random_range(1..=8);
        let alpha: Vec<f64> = (0..k).map(|_| rng.random_range(0.2..0.97)).collect();
        let samples = Samples::draw(&alpha, rng.random_range(20..=120), max_draft_len, rng.random());
        let mut ul_gain: Vec<f64> = (0..k)
            .map(|_| 10f64.powf(rng.random_range(-15.0..-9.0)))
            .collect();
        let dl_gain: Vec<f64> = if separate {
            (0..k)
                .map(|_| 10f64.powf(rng.random_range(-15.0..-9.0)))
                .collect()
        } else {
            ul_gain.clone()
        };
        if outside {
            ul_gain[0] = 1e-70;
        }
        let link = link(
            10f64.powf(rng.random_range(-3.0..0.0)),
            10f64.powf(rng.random_range(-3.0..1.0)),
        );
        let correction = CorrectionSetup {
            link,
            modes,
            ul_gain: &ul_gain,
            dl_gain: &dl_gain,
        };
        GoodputEngine::new(samples, Weights::Count, correction, max_draft_len, tables)
    }

    /// T_comm as paper B's evaluator computed it before the shortcuts: a scan of all devices in gain order, the
    /// running sums of 1/g^dl built from the weakest, and [`split_by_bisection`] on the UL delays themselves.
    fn reference_comm(e: &GoodputEngine, s: usize, caps: &[u16]) -> f64 {
        let (k_n, n) = (e.devices(), e.count());
        let first = e.samples.first_rejections();
        let rejected: Vec<usize> = (0..k_n)
            .filter(|&pos| first[e.order[pos] * n + s] <= caps[pos])
            .collect();
        let m = rejected.len();
        if m == 0 {
            return 0.0;
        }
        let b = e.link.share_hz(m);
        let ul = |p: usize| e.link.ul_delay_s(b, e.ul_gain[p]);
        match e.modes {
            ModeScheme::Optimal | ModeScheme::BruteForce => {
                let mut buf = vec![0.0; m + 1];
                for i in (0..m).rev() {
                    buf[i] = buf[i + 1] + e.inverse_dl_gain[rejected[i]];
                }
                split_by_bisection(m, |i| ul(rejected[i]), |n_dl| e.link.dl_delay_s(b, buf[n_dl])).1
            }
            ModeScheme::AllUl => ul(rejected[m - 1]),
            ModeScheme::AllDl => {
                let inv: f64 = rejected.iter().map(|&p| e.inverse_dl_gain[p]).sum();
                e.link.dl_delay_s(b, inv)
            }
            ModeScheme::Random => {
                let (mut ul_max, mut inv) = (0.0f64, 0.0);
                for &p in &rejected {
                    if e.samples.ul_coin(e.order[p], s) {
                        ul_max = ul_max.max(ul(p));
                    } else {
                        inv += e.inverse_dl_gain[p];
                    }
                }
                ul_max.max(e.link.dl_delay_s(b, inv))
            }
        }
    }

    /// Random caps within the engine's range, by position.
    fn random_caps(rng: &mut ChaCha8Rng, e: &GoodputEngine) -> Vec<u16> {
        (0..e.devices())
            .map(|_| rng.random_range(0..=e.max_draft_len as u16))
            .collect()
    }

    #[test]
    fn comm_equals_the_reference_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        for case in 0..48 {
            let k = [1, 2, 5, 17, 40, 64][case % 6];
            for modes in MODES {
                let outside = case % 4 == 3;
                let e = spread(&mut rng, k, modes, (case % 2 == 1, case % 3 != 2, outside));
                assert_eq!(e.snr_shortcut, !outside);
                let caps = random_caps(&mut rng, &e);
                let mut buf = SetBuf::default();
                for s in 0..e.count() {
                    let want = reference_comm(&e, s, &caps);
                    let got = e.comm(s, &caps, &mut buf).0;
                    assert_eq!(got.to_bits(), want.to_bits(), "case {case} {modes:?} s={s}");
                }
            }
        }
    }

    #[test]
    fn near_ties_between_the_snrs_fall_back_to_the_delays_and_equal_the_reference() {
        // Two devices, every sample rejected, the DL SNR of the weaker device alone (even cases: a step of the
        // bisection) or of both (odd: the final choice between lo = 0 and hi = 1) equal to the UL SNR of the
        // stronger; the DL gains equal the UL gains (paper B) or are scaled by a factor the DL power undoes.
        let mut rng = ChaCha8Rng::seed_from_u64(32);
        let mut both = 0;
        for case in 0..200 {
            let (g0, g1) = (
                10f64.powf(rng.random_range(-13.0..-11.0)),
                10f64.powf(rng.random_range(-14.0..-13.0)),
            );
            let scale = if case % 4 < 2 {
                1.0
            } else {
                10f64.powf(rng.random_range(-1.0..1.0))
            };
            let dl_gain = [g0 * scale, g1 * scale];
            let inverse_sum = if case % 2 == 0 {
                1.0 / dl_gain[1]
            } else {
                1.0 / dl_gain[0] + 1.0 / dl_gain[1]
            };
            // snr_ul(g0) = P_ul g0/(N0s b) and snr_dl(S) = P_dl/(N0d b S) are equal when
            // P_dl = P_ul g0 N0d S / N0s.
            let ul_power_w = 0.0316;
            let mut l = link(ul_power_w, 1.0);
            l.dl_power_w =
                ul_power_w * g0 * l.noise_psd_device_w_per_hz * inverse_sum / l.noise_psd_server_w_per_hz;
            let samples = Samples::draw(&[0.3, 0.3], 50, 1, rng.random());
            let correction = CorrectionSetup {
                link: l,
                modes: ModeScheme::Optimal,
                ul_gain: &[g0, g1],
                dl_gain: &dl_gain,
            };
            let e = GoodputEngine::new(samples, Weights::Count, correction, 1, case % 3 != 0);
            let mut buf = SetBuf::default();
            for s in 0..e.count() {
                let got = e.comm(s, &[1, 1], &mut buf).0;
                assert_eq!(got.to_bits(), reference_comm(&e, s, &[1, 1]).to_bits());
                both += usize::from(buf.set.len() == 2);
            }
        }
        assert!(both > 0, "no sample had both devices rejected");
    }

    #[test]
    fn ul_delays_from_the_table_and_computed_agree_bit_for_bit() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for modes in [ModeScheme::Optimal, ModeScheme::AllUl, ModeScheme::Random] {
            let tabled = spread(&mut rng, 12, modes, (true, true, false));
            assert!(!tabled.ul_table.0.is_empty());
            let mut computed = tabled.clone();
            computed.ul_table.0.clear();
            let mut buf = SetBuf::default();
            for _ in 0..20 {
                let caps = random_caps(&mut rng, &tabled);
                for s in 0..tabled.count() {
                    assert_eq!(
                        tabled.comm(s, &caps, &mut buf),
                        computed.comm(s, &caps, &mut buf),
                        "{modes:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ul_below_decides_as_the_delay_does() {
        let mut rng = ChaCha8Rng::seed_from_u64(71);
        let mut decided = [0usize; 2];
        for case in 0..40 {
            let k = [2, 9, 40][case % 3];
            let e = spread(&mut rng, k, ModeScheme::Optimal, (case % 2 == 1, true, false));
            for _ in 0..200 {
                let (m, pos) = (rng.random_range(1..=k), rng.random_range(0..k));
                let ul = e.ul_delay(m, pos);
                let rel = [0.0, 1e-15, 1e-9, 1e-6, 1e-4, 0.01, 0.1, 0.5, 2.0][rng.random_range(0..9)];
                for c in [ul * (1.0 + rel), ul * (1.0 - rel), ul.next_up(), ul.next_down()] {
                    let want = ul < c;
                    assert_eq!(e.ul_below(m, pos, c), want, "m {m} pos {pos} ul {ul} c {c}");
                    decided[usize::from(want)] += 1;
                }
            }
        }
        assert!(decided[0] > 1000 && decided[1] > 1000, "{decided:?}");
    }

    #[test]
    fn rejection_masks_equal_the_comparisons() {
        let mut rng = ChaCha8Rng::seed_from_u64(33);
        for len in 0..=64 {
            for _ in 0..20 {
                let top = [2u16, 10, 1001][rng.random_range(0..3)];
                let f: Vec<u16> = (0..len).map(|_| rng.random_range(1..=top)).collect();
                let cap: Vec<u16> = (0..len).map(|_| rng.random_range(0..=top - 1)).collect();
                let want = (0..len).fold(0u64, |m, i| m | (u64::from(f[i] <= cap[i]) << i));
                assert_eq!(rejection_mask(&f, &cap), want, "{f:?} {cap:?}");
            }
        }
    }
}
