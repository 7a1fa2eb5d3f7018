//! Paper B's radio setting: the device drop, the uplink/downlink correction rates and the power-budget split.
//!
//! Paper B (§III-C, §VI-A3) shares the band equally among the devices whose drafts were rejected, lets each of
//! them upload at its maximum power (UL mode) or receive a server-powered download (DL mode), and fixes the total
//! power P_tot(K) = P̄_dl + K·P̄_ul, split at a DL-to-UL ratio. Everything here is in SI units.

use crate::error::{ChannelError, positive};
use crate::fading::{PathLoss, rayleigh_power_gain};
use crate::rate::rate_bps;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

/// The bandwidth each rejected device gets when `rejected` devices share `bandwidth_hz` equally (b = B/|R|).
pub fn equal_share_hz(bandwidth_hz: f64, rejected: usize) -> Result<f64, ChannelError> {
    positive("bandwidth_hz", bandwidth_hz)?;
    if rejected == 0 {
        return Err(ChannelError::Invalid {
            field: "rejected",
            reason: "no device shares the band".into(),
        });
    }
    Ok(bandwidth_hz / rejected as f64)
}

/// Uplink rate at maximum power: b·log₂(1 + P_ul·g / (N0_ser·b)) in bit/s (paper B, UL mode).
pub fn ul_rate_bps(
    share_hz: f64,
    ul_power_w: f64,
    gain: f64,
    noise_psd_server_w_per_hz: f64,
) -> Result<f64, ChannelError> {
    positive("ul_power_w", ul_power_w)?;
    rate_bps(share_hz, ul_power_w, gain, noise_psd_server_w_per_hz)
}

/// Downlink rate with server power `power_w` for this device: b·log₂(1 + p·g / (N0_dev·b)) in bit/s (DL mode).
pub fn dl_rate_bps(
    share_hz: f64,
    power_w: f64,
    gain: f64,
    noise_psd_device_w_per_hz: f64,
) -> Result<f64, ChannelError> {
    rate_bps(share_hz, power_w, gain, noise_psd_device_w_per_hz)
}

/// Lemma 1 (paper B): the delay-equalising DL powers p_k = P_dl (1/g_k) / Σ_j 1/g_j, in the order of `gains`.
pub fn lemma1_dl_powers(dl_power_w: f64, gains: &[f64]) -> Vec<f64> {
    let sum: f64 = gains.iter().map(|g| 1.0 / g).sum();
    gains.iter().map(|g| dl_power_w / (g * sum)).collect()
}

/// Lemma 1's common DL SNR P_dl / (N0_dev·b·Σ_j 1/g_j): under [`lemma1_dl_powers`] every device of the DL set sees
/// it (p_k g_k / (N0_dev b) with p_k g_k = P_dl / Σ_j 1/g_j), so τ^dl = D / (b log₂(1 + it)).
pub fn lemma1_dl_snr(
    dl_power_w: f64,
    noise_psd_device_w_per_hz: f64,
    share_hz: f64,
    inverse_gain_sum: f64,
) -> f64 {
    dl_power_w / (noise_psd_device_w_per_hz * share_hz * inverse_gain_sum)
}

/// One device of a paper-B drop.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DroppedDevice {
    /// Distance to the server in metres.
    pub distance_m: f64,
    /// Large-scale (path-loss) power gain at that distance.
    pub mean_gain: f64,
    /// Power gain including one Rayleigh block-fading draw, |h|² with h ~ CN(0, mean_gain).
    pub channel_gain: f64,
}

/// Paper B's drop: distances uniform in [`min_distance_m`, `max_distance_m`], a path-loss model and Rayleigh fading.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Drop {
    /// Nearest distance in metres (paper B: 100 m).
    pub min_distance_m: f64,
    /// Farthest distance in metres (paper B: 500 m).
    pub max_distance_m: f64,
    /// Large-scale model (paper B: −30 dB at 1 m, exponent 3.5).
    pub path_loss: PathLoss,
}

impl Drop {
    /// Paper B §VI-A3: U[100, 500] m with [`PathLoss::PAPER_B`].
    pub const PAPER_B: Drop = Drop {
        min_distance_m: 100.0,
        max_distance_m: 500.0,
        path_loss: PathLoss::PAPER_B,
    };

    /// Draws `count` devices independently (distance, then one fading draw each, in device order).
    pub fn sample<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        count: usize,
    ) -> Result<Vec<DroppedDevice>, ChannelError> {
        positive("min_distance_m", self.min_distance_m)?;
        positive("max_distance_m", self.max_distance_m)?;
        if self.max_distance_m < self.min_distance_m {
            return Err(ChannelError::Invalid {
                field: "max_distance_m",
                reason: format!(
                    "{} is below min_distance_m {}",
                    self.max_distance_m, self.min_distance_m
                ),
            });
        }
        let span = self.max_distance_m - self.min_distance_m;
        (0..count)
            .map(|_| {
                let u: f64 = rng.random();
                let distance_m = self.min_distance_m + span * u;
                let mean_gain = self.path_loss.gain(distance_m)?;
                let channel_gain = rayleigh_power_gain(rng, mean_gain)?;
                Ok(DroppedDevice {
                    distance_m,
                    mean_gain,
                    channel_gain,
                })
            })
            .collect()
    }
}

/// A downlink budget and a per-device uplink budget, both in watts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerBudget {
    /// Server (downlink) power budget P_dl in W.
    pub dl_power_w: f64,
    /// Per-device uplink power budget P_ul in W.
    pub ul_power_w: f64,
}

impl PowerBudget {
    /// The total budget P_tot(K) = P̄_dl + K·P̄_ul in W (paper B §VI-C; sums in watts, not dBm).
    pub fn total_w(reference_dl_w: f64, reference_ul_w: f64, devices: usize) -> Result<f64, ChannelError> {
        positive("reference_dl_w", reference_dl_w)?;
        positive("reference_ul_w", reference_ul_w)?;
        Ok(reference_dl_w + devices as f64 * reference_ul_w)
    }

    /// Splits `total_w` so that P_dl/P_ul = `ratio` and P_dl + K·P_ul = `total_w`:
    /// P_ul = P_tot/(ratio + K), P_dl = ratio·P_ul.
    pub fn split(total_w: f64, ratio: f64, devices: usize) -> Result<Self, ChannelError> {
        positive("total_w", total_w)?;
        positive("ratio", ratio)?;
        let ul_power_w = total_w / (ratio + devices as f64);
        Ok(PowerBudget {
            dl_power_w: ratio * ul_power_w,
            ul_power_w,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::{dbm_to_w, linear_to_db};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn equal_share_and_rates() {
        assert_eq!(equal_share_hz(1e7, 4).unwrap(), 2.5e6);
        assert!(
            equal_share_hz(1e7, 0)
                .unwrap_err()
                .to_string()
                .starts_with("rejected")
        );
        // SNR 1 on 1 MHz: 1 Mbit/s both ways.
        assert!((ul_rate_bps(1e6, 1e-3, 1e-10, 1e-19).unwrap() - 1e6).abs() < 1e-6);
        assert!((dl_rate_bps(1e6, 1e-3, 1e-10, 1e-19).unwrap() - 1e6).abs() < 1e-6);
        assert!(
            ul_rate_bps(1e6, 0.0, 1e-10, 1e-19)
                .unwrap_err()
                .to_string()
                .starts_with("ul_power_w")
        );
        assert_eq!(dl_rate_bps(1e6, 0.0, 1e-10, 1e-19).unwrap(), 0.0);
    }

    #[test]
    fn drop_stays_in_range_and_is_seeded() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let devices = Drop::PAPER_B.sample(&mut rng, 2000).unwrap();
        for d in &devices {
            assert!((100.0..=500.0).contains(&d.distance_m));
            let db = linear_to_db(d.mean_gain);
            assert!((-124.5..=-99.9).contains(&db), "{db}");
            assert!(d.channel_gain > 0.0);
        }
        let mean_d = devices.iter().map(|d| d.distance_m).sum::<f64>() / devices.len() as f64;
        assert!((mean_d - 300.0).abs() < 8.0, "{mean_d}");
        let again = Drop::PAPER_B
            .sample(&mut ChaCha8Rng::seed_from_u64(3), 2000)
            .unwrap();
        assert_eq!(devices, again);
        let bad = Drop {
            min_distance_m: 5.0,
            max_distance_m: 1.0,
            ..Drop::PAPER_B
        };
        assert!(
            bad.sample(&mut rng, 1)
                .unwrap_err()
                .to_string()
                .starts_with("max_distance_m")
        );
    }

    #[test]
    fn power_split_meets_ratio_and_total() {
        let total = PowerBudget::total_w(dbm_to_w(30.0), dbm_to_w(15.0), 20).unwrap();
        assert!((total - (1.0 + 20.0 * 0.031_622_776_601_683_79)).abs() < 1e-12);
        for ratio in [1.0, 4.0, 16.0, 64.0] {
            let b = PowerBudget::split(total, ratio, 20).unwrap();
            assert!((b.dl_power_w / b.ul_power_w - ratio).abs() < 1e-12 * ratio);
            assert!((b.dl_power_w + 20.0 * b.ul_power_w - total).abs() < 1e-12 * total);
        }
        assert!(
            PowerBudget::split(total, 0.0, 20)
                .unwrap_err()
                .to_string()
                .starts_with("ratio")
        );
    }

    #[test]
    fn lemma1_powers_spend_the_budget_and_give_every_device_the_common_snr() {
        let gains = [1e-9, 3e-11, 2e-12, 5e-10];
        let (p_dl, n0, b) = (1.0, 2e-20, 2.5e6);
        let powers = lemma1_dl_powers(p_dl, &gains);
        assert!((powers.iter().sum::<f64>() - p_dl).abs() < 1e-12);
        let inv: f64 = gains.iter().map(|g| 1.0 / g).sum();
        let common = lemma1_dl_snr(p_dl, n0, b, inv);
        for (p, g) in powers.iter().zip(gains) {
            let own = crate::rate::snr(*p, g, n0, b);
            assert!((own - common).abs() <= 1e-12 * common, "{own} vs {common}");
        }
    }
}
