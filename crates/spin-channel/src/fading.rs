//! Large-scale path loss and small-scale Rayleigh block fading (power gains, not amplitudes).

use crate::error::{ChannelError, positive};
use crate::units::db_to_linear;
use rand::{Rng, RngExt};
use serde::{Deserialize, Serialize};
use statrs::distribution::Exp;

/// Log-distance path loss: gain_dB(d) = `gain_at_reference_db` − 10·`exponent`·log₁₀(d / `reference_m`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PathLoss {
    /// Gain at the reference distance in dB (paper B: −30 dB at 1 m).
    pub gain_at_reference_db: f64,
    /// Reference distance in metres.
    pub reference_m: f64,
    /// Path-loss exponent (paper B: 3.5).
    pub exponent: f64,
}

impl PathLoss {
    /// Paper B's model: −30 dB at 1 m, exponent 3.5.
    pub const PAPER_B: PathLoss = PathLoss {
        gain_at_reference_db: -30.0,
        reference_m: 1.0,
        exponent: 3.5,
    };

    /// The linear average power gain at `distance_m` metres.
    pub fn gain(&self, distance_m: f64) -> Result<f64, ChannelError> {
        positive("distance_m", distance_m)?;
        positive("reference_m", self.reference_m)?;
        let db = self.gain_at_reference_db - 10.0 * self.exponent * (distance_m / self.reference_m).log10();
        Ok(db_to_linear(db))
    }
}

/// One Rayleigh block-fading power gain |h|² with h ~ CN(0, `mean_gain`): exponential with the given mean.
pub fn rayleigh_power_gain<R: Rng + ?Sized>(rng: &mut R, mean_gain: f64) -> Result<f64, ChannelError> {
    positive("mean_gain", mean_gain)?;
    let exp = Exp::new(1.0 / mean_gain).map_err(|e| ChannelError::Invalid {
        field: "mean_gain",
        reason: e.to_string(),
    })?;
    Ok(rng.sample(exp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn path_loss_reference_points() {
        let pl = PathLoss::PAPER_B;
        assert!((pl.gain(1.0).unwrap() - 1e-3).abs() < 1e-18);
        // 100 m: −30 − 70 = −100 dB.
        assert!((pl.gain(100.0).unwrap() / 1e-10 - 1.0).abs() < 1e-12);
        assert!(pl.gain(-1.0).unwrap_err().to_string().starts_with("distance_m"));
    }

    #[test]
    fn rayleigh_mean_and_tail() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let n = 200_000;
        let mean = 0.35;
        let draws: Vec<f64> = (0..n)
            .map(|_| rayleigh_power_gain(&mut rng, mean).unwrap())
            .collect();
        let m = draws.iter().sum::<f64>() / n as f64;
        assert!((m - mean).abs() < 0.01 * mean, "sample mean {m}");
        // P(|h|² > mean) = e^{-1}.
        let tail = draws.iter().filter(|&&x| x > mean).count() as f64 / n as f64;
        assert!((tail - (-1f64).exp()).abs() < 0.005, "tail {tail}");
        assert!(rayleigh_power_gain(&mut rng, f64::NAN).is_err());
    }
}
