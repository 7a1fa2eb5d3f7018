//! The emulated wireless link, driven by spin-channel: a seeded drop of distances, fresh Rayleigh block fading every
//! round, and the air time of every message as its bits over the rate of that device in that round
//! (docs/system.md §"link emulation" gives each formula with its source equation).

use crate::error::{NetError, Result, number};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use spin_channel::paper_b::Drop;
use spin_channel::{rayleigh_power_gain, snr, spectral_efficiency};
use spin_optimize::paper_b::Link;
use spin_optimize::round::Radio;

/// Radio parameters of a run (SI units).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    /// Total bandwidth B in Hz.
    pub bandwidth_hz: f64,
    /// Device transmit power P_ul in W.
    pub ul_power_w: f64,
    /// Server downlink budget P_dl in W.
    pub dl_power_w: f64,
    /// Noise PSD at the server N0_ser in W/Hz.
    pub noise_psd_server_w_per_hz: f64,
    /// Noise PSD at the devices N0_dev in W/Hz.
    pub noise_psd_device_w_per_hz: f64,
    /// Distances and path loss of the drop.
    pub drop: Drop,
}

impl LinkConfig {
    /// Paper B §VI-A: B = 10 MHz, the radio of `spin_optimize::round::Radio::paper_b` (P_ul = 15 dBm, P_dl =
    /// 30 dBm, N0_ser = −169 dBm/Hz, N0_dev = −167 dBm/Hz), distances U[100, 500] m, −30 dB at 1 m, exponent 3.5.
    pub fn paper_b() -> Self {
        let radio = Radio::paper_b();
        LinkConfig {
            bandwidth_hz: 10e6,
            ul_power_w: radio.ul_power_w,
            dl_power_w: radio.dl_power_w,
            noise_psd_server_w_per_hz: radio.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: radio.noise_psd_device_w_per_hz,
            drop: Drop::PAPER_B,
        }
    }

    /// Checks every field (positive, finite; distances ordered).
    pub fn validate(&self) -> Result<()> {
        for (f, v) in [
            ("bandwidth_hz", self.bandwidth_hz),
            ("ul_power_w", self.ul_power_w),
            ("dl_power_w", self.dl_power_w),
            ("noise_psd_server_w_per_hz", self.noise_psd_server_w_per_hz),
            ("noise_psd_device_w_per_hz", self.noise_psd_device_w_per_hz),
            ("drop.min_distance_m", self.drop.min_distance_m),
            ("drop.max_distance_m", self.drop.max_distance_m),
        ] {
            if !(v > 0.0 && v.is_finite()) {
                return Err(NetError::invalid(
                    f,
                    format!("{} is not a finite number > 0", number(v)),
                ));
            }
        }
        if self.drop.max_distance_m < self.drop.min_distance_m {
            return Err(NetError::invalid(
                "drop.max_distance_m",
                format!(
                    "{} is below drop.min_distance_m",
                    number(self.drop.max_distance_m)
                ),
            ));
        }
        Ok(())
    }

    /// Paper B's link for a payload of `bits` (its delay formulas take D from the link).
    pub fn paper_b_link(&self, bits: f64) -> Link {
        Link {
            distribution_bits: bits,
            bandwidth_hz: self.bandwidth_hz,
            ul_power_w: self.ul_power_w,
            dl_power_w: self.dl_power_w,
            noise_psd_server_w_per_hz: self.noise_psd_server_w_per_hz,
            noise_psd_device_w_per_hz: self.noise_psd_device_w_per_hz,
        }
    }

    /// Paper A's uplink spectral efficiency r = log₂(1 + P_ul g / N0) with N0 = N0_ser·B the noise power over the
    /// band (paper A eq. 8 takes N0 as a power); a device with share b_k then uploads at b_k·r.
    pub fn spectral_efficiency(&self, gain: f64) -> Result<f64> {
        let snr = snr(
            self.ul_power_w,
            gain,
            self.noise_psd_server_w_per_hz,
            self.bandwidth_hz,
        );
        Ok(spectral_efficiency(snr)?)
    }

    /// Large-scale gain at `distance_m`.
    pub fn mean_gain(&self, distance_m: f64) -> Result<f64> {
        Ok(self.drop.path_loss.gain(distance_m)?)
    }

    /// Device k's distance in the seeded drop: uniform in [min, max] from stream k of the drop seed.
    pub fn drop_distance(&self, seed: u64, device: usize) -> f64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6472_6f70);
        rng.set_stream(device as u64);
        let u: f64 = rng.random();
        self.drop.min_distance_m + (self.drop.max_distance_m - self.drop.min_distance_m) * u
    }

    /// The power gains of round `round` for devices with large-scale gains `mean_gains`: one Rayleigh block-fading
    /// draw per device, in device order, from stream `round` of the fading seed (fresh every round, replayable).
    pub fn round_gains(&self, seed: u64, round: u64, mean_gains: &[f64]) -> Result<Vec<f64>> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6661_6465);
        rng.set_stream(round);
        mean_gains
            .iter()
            .map(|&m| Ok(rayleigh_power_gain(&mut rng, m)?))
            .collect()
    }
}

/// Air time of `bits` on a share `share_hz` at spectral efficiency `r` (paper A eq. 26's Q/(B_k r_k) per message).
pub fn air_time_s(bits: f64, share_hz: f64, r: f64) -> f64 {
    if bits <= 0.0 { 0.0 } else { bits / (share_hz * r) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fading_is_fresh_per_round_and_replayable() {
        let l = LinkConfig::paper_b();
        l.validate().unwrap();
        let means = [1e-10, 2e-11, 5e-12];
        let a = l.round_gains(7, 1, &means).unwrap();
        assert_eq!(a, l.round_gains(7, 1, &means).unwrap());
        assert_ne!(a, l.round_gains(7, 2, &means).unwrap());
        let d = l.drop_distance(3, 4);
        assert!((100.0..=500.0).contains(&d));
        // Paper B's UL delay formula equals bits over the Shannon rate of the share.
        let link = l.paper_b_link(34_816.0);
        let b = 1e6;
        let rate = spin_channel::rate_bps(b, l.ul_power_w, 1e-11, l.noise_psd_server_w_per_hz).unwrap();
        assert!((link.ul_delay_s(b, 1e-11) - 34_816.0 / rate).abs() < 1e-12);
        let mut bad = l;
        bad.bandwidth_hz = f64::NAN;
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .starts_with("bandwidth_hz")
        );
    }
}
