//! Paper A's channel draws: per-device mean gains H̄_k ~ U(lo, hi), Rayleigh block fading H_k = |h_k|² per round,
//! and the uplink spectral efficiency r_k = log₂(1 + p_k H_k / N0) (paper A, eq. 8 and §VI-A3).

use crate::error::{ChannelError, non_negative, positive};
use crate::fading::rayleigh_power_gain;
use crate::rate::spectral_efficiency;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};

/// The uplink channel model of paper A's experiments.
///
/// Paper A states H̄_k ~ U(0.2, 0.5) and N0 = 1e−10 W (a noise *power*, not a density); the transmit power
/// p_k is not given, so it is a named field here (see `scenarios/paper-a.toml` for the chosen value).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PaperAChannel {
    /// Lower end of the uniform law of the mean power gain H̄_k.
    pub mean_gain_lo: f64,
    /// Upper end of the uniform law of the mean power gain H̄_k.
    pub mean_gain_hi: f64,
    /// Noise power N0 over the device's band, in watts (paper A: 1e−10 W).
    pub noise_w: f64,
    /// Transmit power p_k of every device, in watts.
    pub ul_power_w: f64,
}

impl PaperAChannel {
    /// Checks every field: 0 < lo ≤ hi, positive noise and power.
    pub fn validate(&self) -> Result<(), ChannelError> {
        positive("mean_gain_lo", self.mean_gain_lo)?;
        positive("mean_gain_hi", self.mean_gain_hi)?;
        if self.mean_gain_hi < self.mean_gain_lo {
            return Err(ChannelError::Invalid {
                field: "mean_gain_hi",
                reason: format!(
                    "{} is below mean_gain_lo = {}",
                    self.mean_gain_hi, self.mean_gain_lo
                ),
            });
        }
        positive("noise_w", self.noise_w)?;
        non_negative("ul_power_w", self.ul_power_w)?;
        Ok(())
    }

    /// Draws the mean power gains H̄_k ~ U(lo, hi) of `devices` devices (fixed for one realisation).
    pub fn draw_mean_gains<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        devices: usize,
    ) -> Result<Vec<f64>, ChannelError> {
        self.validate()?;
        let span = self.mean_gain_hi - self.mean_gain_lo;
        Ok((0..devices)
            .map(|_| self.mean_gain_lo + span * rng.random::<f64>())
            .collect())
    }

    /// One block-fading round: H_k = |h_k|² with h_k ~ CN(0, H̄_k), returned as spectral efficiencies r_k.
    pub fn draw_spectral_efficiencies<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        mean_gains: &[f64],
    ) -> Result<Vec<f64>, ChannelError> {
        self.validate()?;
        mean_gains
            .iter()
            .map(|&mean| {
                let gain = rayleigh_power_gain(rng, mean)?;
                spectral_efficiency(self.ul_power_w * gain / self.noise_w)
            })
            .collect()
    }

    /// The spectral efficiency at the mean gain, log₂(1 + p H̄ / N0) (used for planning on average channels).
    pub fn mean_spectral_efficiency(&self, mean_gain: f64) -> Result<f64, ChannelError> {
        self.validate()?;
        positive("mean_gain", mean_gain)?;
        spectral_efficiency(self.ul_power_w * mean_gain / self.noise_w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn channel() -> PaperAChannel {
        PaperAChannel {
            mean_gain_lo: 0.2,
            mean_gain_hi: 0.5,
            noise_w: 1e-10,
            ul_power_w: 0.1,
        }
    }

    #[test]
    fn mean_gains_stay_in_range_and_replay() {
        let ch = channel();
        let a = ch
            .draw_mean_gains(&mut ChaCha8Rng::seed_from_u64(3), 500)
            .unwrap();
        let b = ch
            .draw_mean_gains(&mut ChaCha8Rng::seed_from_u64(3), 500)
            .unwrap();
        assert_eq!(a, b);
        assert!(a.iter().all(|&g| (0.2..=0.5).contains(&g)));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((mean - 0.35).abs() < 0.01, "{mean}");
    }

    #[test]
    fn spectral_efficiency_matches_shannon() {
        let ch = channel();
        // p H̄ / N0 = 0.1 · 0.35 / 1e−10 = 3.5e8 → log₂(1 + 3.5e8).
        let r = ch.mean_spectral_efficiency(0.35).unwrap();
        assert!((r - (1.0 + 3.5e8f64).log2()).abs() < 1e-12);
        let draws = ch
            .draw_spectral_efficiencies(&mut ChaCha8Rng::seed_from_u64(9), &[0.3; 64])
            .unwrap();
        assert!(draws.iter().all(|r| r.is_finite() && *r >= 0.0));
    }

    #[test]
    fn invalid_fields_are_named() {
        let mut ch = channel();
        ch.mean_gain_hi = 0.1;
        assert!(ch.validate().unwrap_err().to_string().starts_with("mean_gain_hi"));
        ch = channel();
        ch.noise_w = 0.0;
        assert!(ch.validate().unwrap_err().to_string().starts_with("noise_w"));
    }
}
