//! Reactive correction (paper B §IV): given the rejected devices, choose UL or DL per device and the DL powers.
//!
//! Every rejected device exchanges one distribution of D bits over an equal share b = B/|R| of the band. UL mode
//! runs at the device's maximum power; DL mode shares the server budget P_dl. The communication delay of the round
//! is the slower of the two directions, which run in parallel: T_comm = max(max_{k∈U} τ_k^ul, τ^dl(D)).
//!
//! - Lemma 1: for a DL set D the delay-equalising powers p_k = P_dl (1/g_k) / Σ_{j∈D} 1/g_j are optimal and give
//!   τ^dl(D) = D / (b log₂(1 + P_dl / (N0_dev b Σ_{j∈D} 1/g_j))).
//! - Lemma 2: sorting R by τ^ul ascending, an optimal U is a prefix {1..n}.
//! - Proposition 1: τ^ul(n) rises and τ^dl(n) falls in n; bisect for the crossing and keep the better neighbour.

use crate::OptimizeError;
use rand::{Rng, RngExt};

/// The largest rejected set [`solve`] enumerates exhaustively (2^20 assignments).
pub const BRUTE_FORCE_LIMIT: usize = 20;

/// The radio parameters of the correction step (SI units; validated by the scenario).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// D, bits of one distribution.
    pub distribution_bits: f64,
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// P_ul in W (every device, maximum power).
    pub ul_power_w: f64,
    /// P_dl in W (server budget).
    pub dl_power_w: f64,
    /// N0_ser in W/Hz (uplink receiver noise).
    pub noise_psd_server_w_per_hz: f64,
    /// N0_dev in W/Hz (downlink receiver noise).
    pub noise_psd_device_w_per_hz: f64,
}

impl Link {
    /// The equal share b = B/|R| for `rejected` ≥ 1 devices.
    pub fn share_hz(&self, rejected: usize) -> f64 {
        self.bandwidth_hz / rejected as f64
    }

    /// UL delay at maximum power, τ^ul = D / (b log₂(1 + P_ul g / (N0_ser b))) (paper B, UL mode; the formulas are
    /// `spin_channel::{snr, transfer_time_s}`).
    pub fn ul_delay_s(&self, share_hz: f64, gain: f64) -> f64 {
        let snr = spin_channel::snr(self.ul_power_w, gain, self.noise_psd_server_w_per_hz, share_hz);
        spin_channel::transfer_time_s(self.distribution_bits, share_hz, snr)
    }

    /// The common DL delay of a DL set with Σ 1/g = `inverse_gain_sum` under Lemma 1; 0 for an empty set.
    pub fn dl_delay_s(&self, share_hz: f64, inverse_gain_sum: f64) -> f64 {
        if inverse_gain_sum <= 0.0 {
            return 0.0;
        }
        let snr = spin_channel::paper_b::lemma1_dl_snr(
            self.dl_power_w,
            self.noise_psd_device_w_per_hz,
            share_hz,
            inverse_gain_sum,
        );
        spin_channel::transfer_time_s(self.distribution_bits, share_hz, snr)
    }

    /// The delay of device with `gain` in DL mode with server power `power_w` (any allocation, not only Lemma 1).
    pub fn dl_delay_at_power_s(&self, share_hz: f64, power_w: f64, gain: f64) -> f64 {
        let snr = spin_channel::snr(power_w, gain, self.noise_psd_device_w_per_hz, share_hz);
        spin_channel::transfer_time_s(self.distribution_bits, share_hz, snr)
    }
}

/// Lemma 1: the delay-equalising DL powers p_k = P_dl (1/g_k) / Σ_j 1/g_j, in the order of `gains`
/// (`spin_channel::paper_b::lemma1_dl_powers`).
pub fn dl_powers(dl_power_w: f64, gains: &[f64]) -> Vec<f64> {
    spin_channel::paper_b::lemma1_dl_powers(dl_power_w, gains)
}

/// Proposition 1 on a set already sorted by UL delay: `ul(i)` is τ^ul of the i-th device (ascending in i),
/// `dl(n)` is τ^dl of the suffix {n+1..m} (descending in n, 0 at n = m). Returns (n, T_comm(n)) minimising
/// max(τ^ul(n), τ^dl(n)) with τ^ul(0) = 0, by bisection on the sign of Δτ(n) = τ^ul(n) − τ^dl(n).
pub fn split_by_bisection(m: usize, ul: impl Fn(usize) -> f64, dl: impl Fn(usize) -> f64) -> (usize, f64) {
    if m == 0 {
        return (0, 0.0);
    }
    let tau_ul = |n: usize| if n == 0 { 0.0 } else { ul(n - 1) };
    // Δ(0) = −τ^dl(all) < 0 and Δ(m) = τ^ul(m) > 0: find the first n with Δ(n) ≥ 0.
    let (mut lo, mut hi) = (0usize, m);
    // τ^dl and τ^ul at `lo` (τ^ul(0) = 0), and both at `hi` once the loop has moved it there: each delay is a
    // logarithm, and the values kept are the ones computing them again would give.
    let (mut dl_lo, mut ul_lo) = (dl(0), 0.0);
    let mut at_hi = None;
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let dl_mid = dl(mid);
        let ul_mid = tau_ul(mid);
        if ul_mid >= dl_mid {
            hi = mid;
            at_hi = Some((ul_mid, dl_mid));
        } else {
            lo = mid;
            (dl_lo, ul_lo) = (dl_mid, ul_mid);
        }
    }
    // For n ≤ lo the cost is τ^dl(n) (falling); for n ≥ hi it is τ^ul(n) (rising): the best is lo or hi.
    let cost_lo = dl_lo.max(ul_lo);
    let (ul_hi, dl_hi) = at_hi.unwrap_or_else(|| (tau_ul(hi), dl(hi)));
    let cost_hi = ul_hi.max(dl_hi);
    if cost_hi <= cost_lo {
        (hi, cost_hi)
    } else {
        (lo, cost_lo)
    }
}

/// Correction mode of one rejected device: spin-core's one mode type (`Uplink`: the device uploads its draft
/// distribution at maximum power; `Downlink`: the server downloads the target distribution with a share of P_dl).
pub use spin_core::correction::Mode;

/// How the modes are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModeScheme {
    /// Prefix structure and bisection (Proposition 1): optimal.
    Optimal,
    /// Every rejected device uploads.
    AllUl,
    /// Every rejected device downloads, Lemma 1 powers.
    AllDl,
    /// Each rejected device UL or DL with probability ½; Lemma 1 powers among the DL ones.
    Random,
    /// Exhaustive search over all 2^|R| assignments (|R| ≤ 20): the reference for `Optimal`.
    BruteForce,
}

impl ModeScheme {
    /// Parses the command-line name (`optimal`, `all-ul`, `all-dl`, `random`, `brute-force`).
    pub fn parse(name: &str) -> Result<Self, OptimizeError> {
        Ok(match name {
            "optimal" => ModeScheme::Optimal,
            "all-ul" => ModeScheme::AllUl,
            "all-dl" => ModeScheme::AllDl,
            "random" => ModeScheme::Random,
            "brute-force" => ModeScheme::BruteForce,
            other => {
                return Err(OptimizeError::Invalid {
                    field: "scheme".into(),
                    reason: format!(
                        "unknown mode scheme {other:?}; expected optimal, all-ul, all-dl, random or brute-force"
                    ),
                });
            }
        })
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            ModeScheme::Optimal => "optimal",
            ModeScheme::AllUl => "all-ul",
            ModeScheme::AllDl => "all-dl",
            ModeScheme::Random => "random",
            ModeScheme::BruteForce => "brute-force",
        }
    }
}

/// The reactive decision for one set of rejected devices, in the order the devices were given.
#[derive(Debug, Clone, PartialEq)]
pub struct CorrectionPlan {
    /// UL or DL per device.
    pub modes: Vec<Mode>,
    /// Server power per device in W (0 for UL devices).
    pub dl_power_w: Vec<f64>,
    /// T_comm = max(UL delay, DL delay) in seconds.
    pub comm_delay_s: f64,
    /// The slowest UL delay (0 without UL devices).
    pub ul_delay_s: f64,
    /// The common DL delay (0 without DL devices).
    pub dl_delay_s: f64,
}

/// The cost of an arbitrary assignment (`ul[i]` true = device i uploads), with Lemma 1 powers for the DL set.
pub fn assignment_delay_s(link: &Link, gains: &[f64], ul: &[bool]) -> (f64, f64) {
    let b = link.share_hz(gains.len().max(1));
    let mut ul_max = 0.0f64;
    let mut inv = 0.0;
    for (g, &u) in gains.iter().zip(ul) {
        if u {
            ul_max = ul_max.max(link.ul_delay_s(b, *g));
        } else {
            inv += 1.0 / g;
        }
    }
    (ul_max, link.dl_delay_s(b, inv))
}

fn correction_from(link: &Link, gains: &[f64], ul: Vec<bool>) -> CorrectionPlan {
    let (ul_delay_s, dl_delay_s) = assignment_delay_s(link, gains, &ul);
    let dl_gains: Vec<f64> = gains
        .iter()
        .zip(&ul)
        .filter(|(_, u)| !**u)
        .map(|(g, _)| *g)
        .collect();
    let mut powers = dl_powers(link.dl_power_w, &dl_gains).into_iter();
    let dl_power_w = ul
        .iter()
        .map(|&u| if u { 0.0 } else { powers.next().unwrap_or(0.0) })
        .collect();
    let modes = ul
        .iter()
        .map(|&u| if u { Mode::Uplink } else { Mode::Downlink })
        .collect();
    CorrectionPlan {
        modes,
        dl_power_w,
        comm_delay_s: ul_delay_s.max(dl_delay_s),
        ul_delay_s,
        dl_delay_s,
    }
}

/// Chooses modes and DL powers for the rejected devices with channel `gains` (validated, > 0).
///
/// `rng` is used by [`ModeScheme::Random`] only. An empty set costs nothing. [`ModeScheme::BruteForce`] refuses
/// sets larger than [`BRUTE_FORCE_LIMIT`].
pub fn solve<R: Rng + ?Sized>(
    link: &Link,
    gains: &[f64],
    scheme: ModeScheme,
    rng: &mut R,
) -> Result<CorrectionPlan, OptimizeError> {
    let m = gains.len();
    if m == 0 {
        return Ok(CorrectionPlan {
            modes: vec![],
            dl_power_w: vec![],
            comm_delay_s: 0.0,
            ul_delay_s: 0.0,
            dl_delay_s: 0.0,
        });
    }
    let ul = match scheme {
        ModeScheme::AllUl => vec![true; m],
        ModeScheme::AllDl => vec![false; m],
        ModeScheme::Random => (0..m).map(|_| rng.random_bool(0.5)).collect(),
        ModeScheme::Optimal => {
            let b = link.share_hz(m);
            let ul_delay: Vec<f64> = gains.iter().map(|&g| link.ul_delay_s(b, g)).collect();
            let mut order: Vec<usize> = (0..m).collect();
            order.sort_by(|&i, &j| ul_delay[i].total_cmp(&ul_delay[j]).then(i.cmp(&j)));
            let mut suffix = vec![0.0; m + 1];
            for i in (0..m).rev() {
                suffix[i] = suffix[i + 1] + 1.0 / gains[order[i]];
            }
            let (n, _) = split_by_bisection(m, |i| ul_delay[order[i]], |n| link.dl_delay_s(b, suffix[n]));
            let mut ul = vec![false; m];
            for &i in &order[..n] {
                ul[i] = true;
            }
            ul
        }
        ModeScheme::BruteForce => {
            if m > BRUTE_FORCE_LIMIT {
                return Err(OptimizeError::TooLarge {
                    field: "rejected".into(),
                    size: u32::try_from(m)
                        .ok()
                        .and_then(|m| 1u128.checked_shl(m))
                        .unwrap_or(u128::MAX),
                    limit: 1u128 << BRUTE_FORCE_LIMIT,
                });
            }
            let b = link.share_hz(m);
            let ul_delay: Vec<f64> = gains.iter().map(|&g| link.ul_delay_s(b, g)).collect();
            let inv: Vec<f64> = gains.iter().map(|g| 1.0 / g).collect();
            let mut best = (f64::INFINITY, 0u32);
            for mask in 0..(1u32 << m) {
                let mut ul_max = 0.0f64;
                let mut s = 0.0;
                for i in 0..m {
                    if mask >> i & 1 == 1 {
                        ul_max = ul_max.max(ul_delay[i]);
                    } else {
                        s += inv[i];
                    }
                }
                let cost = ul_max.max(link.dl_delay_s(b, s));
                if cost < best.0 {
                    best = (cost, mask);
                }
            }
            (0..m).map(|i| best.1 >> i & 1 == 1).collect()
        }
    };
    Ok(correction_from(link, gains, ul))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn paper_link(dl_power_w: f64, ul_power_w: f64) -> Link {
        Link {
            distribution_bits: 34_816.0,
            bandwidth_hz: 1e7,
            ul_power_w,
            dl_power_w,
            noise_psd_server_w_per_hz: 1.26e-20,
            noise_psd_device_w_per_hz: 2.0e-20,
        }
    }

    /// Gains of paper B's drop: U[100, 500] m, −30 dB at 1 m, exponent 3.5, Rayleigh fading.
    fn drop_gains(rng: &mut ChaCha8Rng, m: usize) -> Vec<f64> {
        spin_channel::paper_b::Drop::PAPER_B
            .sample(rng, m)
            .unwrap()
            .into_iter()
            .map(|d| d.channel_gain)
            .collect()
    }

    #[test]
    fn lemma1_powers_sum_and_equalise() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for m in 1..=12 {
            let link = paper_link(10f64.powf(rng.random_range(-1.0..1.5)), 0.0316);
            let gains = drop_gains(&mut rng, m);
            let p = dl_powers(link.dl_power_w, &gains);
            let sum: f64 = p.iter().sum();
            assert!((sum - link.dl_power_w).abs() <= 1e-12 * link.dl_power_w);
            let b = link.share_hz(m);
            let inv: f64 = gains.iter().map(|g| 1.0 / g).sum();
            let common = link.dl_delay_s(b, inv);
            for (pk, g) in p.iter().zip(&gains) {
                let own = link.dl_delay_at_power_s(b, *pk, *g);
                assert!((own - common).abs() <= 1e-9 * common, "{own} vs {common}");
            }
            // Moving power between two devices makes the slower one slower (equalisation is max-min optimal).
            if m >= 2 {
                let mut q = p.clone();
                q[0] *= 0.9;
                q[1] += p[0] * 0.1;
                assert!(link.dl_delay_at_power_s(b, q[0], gains[0]) > common);
            }
        }
    }

    #[test]
    fn bisection_equals_exhaustive_search() {
        let mut rng = ChaCha8Rng::seed_from_u64(2024);
        let mut uses_both = 0;
        for case in 0..600 {
            let m = 1 + case % 12;
            // Budgets from 0 to 40 dBm (DL) and 0 to 25 dBm (UL) cover UL-heavy and DL-heavy optima.
            let link = paper_link(
                1e-3 * 10f64.powf(rng.random_range(0.0..4.0)),
                1e-3 * 10f64.powf(rng.random_range(0.0..2.5)),
            );
            let gains = drop_gains(&mut rng, m);
            let opt = solve(&link, &gains, ModeScheme::Optimal, &mut rng).unwrap();
            let brute = solve(&link, &gains, ModeScheme::BruteForce, &mut rng).unwrap();
            assert!(
                (opt.comm_delay_s - brute.comm_delay_s).abs() <= 1e-12 * brute.comm_delay_s,
                "case {case}: bisection {} vs exhaustive {}",
                opt.comm_delay_s,
                brute.comm_delay_s
            );
            if opt.modes.contains(&Mode::Uplink) && opt.modes.contains(&Mode::Downlink) {
                uses_both += 1;
            }
            // The baselines can only be slower.
            for scheme in [ModeScheme::AllUl, ModeScheme::AllDl, ModeScheme::Random] {
                let c = solve(&link, &gains, scheme, &mut rng).unwrap();
                assert!(c.comm_delay_s >= opt.comm_delay_s * (1.0 - 1e-12));
            }
        }
        assert!(
            uses_both > 100,
            "only {uses_both} mixed optima: the test would not exercise the split"
        );
    }

    #[test]
    fn split_uses_prefix_of_best_uplinks_and_reports_powers() {
        let link = paper_link(1.0, 0.0316);
        let gains = [1e-11, 1e-14, 3e-12, 5e-15];
        let c = solve(
            &link,
            &gains,
            ModeScheme::Optimal,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        // Whatever the split, a UL device never has a weaker channel than a DL device.
        let min_ul = gains
            .iter()
            .zip(&c.modes)
            .filter(|(_, m)| **m == Mode::Uplink)
            .map(|(g, _)| *g)
            .fold(f64::INFINITY, f64::min);
        let max_dl = gains
            .iter()
            .zip(&c.modes)
            .filter(|(_, m)| **m == Mode::Downlink)
            .map(|(g, _)| *g)
            .fold(0.0, f64::max);
        assert!(min_ul >= max_dl);
        let total: f64 = c.dl_power_w.iter().sum();
        assert!(c.modes.contains(&Mode::Downlink) && (total - 1.0).abs() < 1e-12);
        for (m, p) in c.modes.iter().zip(&c.dl_power_w) {
            assert_eq!(*m == Mode::Uplink, *p == 0.0);
        }
        assert_eq!(c.comm_delay_s, c.ul_delay_s.max(c.dl_delay_s));
    }

    #[test]
    fn modes_are_spin_cores() {
        // One mode type: the planner's decision is the runtime's `spin_core::Mode` (its names in files and output
        // are spin-core's, tested there).
        let m: spin_core::Mode = Mode::Uplink;
        assert_eq!(m.sender(), spin_core::correction::Side::Device);
    }

    #[test]
    fn empty_set_and_limits() {
        let link = paper_link(1.0, 0.0316);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let c = solve(&link, &[], ModeScheme::Optimal, &mut rng).unwrap();
        assert_eq!(c.comm_delay_s, 0.0);
        let big = vec![1e-12; 21];
        let err = solve(&link, &big, ModeScheme::BruteForce, &mut rng).unwrap_err();
        assert!(err.to_string().starts_with("rejected:"), "{err}");
        assert!(
            ModeScheme::parse("sideways")
                .unwrap_err()
                .to_string()
                .starts_with("scheme:")
        );
        for s in [
            ModeScheme::Optimal,
            ModeScheme::AllUl,
            ModeScheme::AllDl,
            ModeScheme::Random,
            ModeScheme::BruteForce,
        ] {
            assert_eq!(ModeScheme::parse(s.name()).unwrap(), s);
        }
    }

    #[test]
    fn all_dl_single_device_matches_closed_form() {
        // One device, SNR = P g / (N0 b) = 1 → rate = b bit/s → delay D / b.
        let link = Link {
            distribution_bits: 1e6,
            bandwidth_hz: 1e6,
            ul_power_w: 1.0,
            dl_power_w: 1e-3,
            noise_psd_server_w_per_hz: 1.0,
            noise_psd_device_w_per_hz: 1e-19,
        };
        let c = solve(
            &link,
            &[1e-10],
            ModeScheme::AllDl,
            &mut ChaCha8Rng::seed_from_u64(0),
        )
        .unwrap();
        assert!((c.comm_delay_s - 1.0).abs() < 1e-12);
        assert!((c.dl_power_w[0] - 1e-3).abs() < 1e-18);
    }
}
