//! Seeded unified rounds on paper B's drop, for tests, benchmarks and the reproduction's "beyond the papers" figure.

use crate::OptimizeError;
use crate::round::{
    CorrectionSplit, DistributionFormat, PayloadPolicy, Radio, Round, RoundDevice, RoundSpec, TokenPayload,
    full_band_spectral_efficiency,
};
use rand::{Rng, RngExt};
use spin_channel::paper_b::Drop;

/// The knobs of a drop round; [`DropRound::default`] is paper B's Qwen setting (§VI-A) with pairs charged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropRound {
    /// Number of devices K.
    pub devices: usize,
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// The correction radio.
    pub radio: Radio,
    /// Payload policy of the unified planner.
    pub policy: PayloadPolicy,
    /// The distribution format (D and the pair size via `spin_core`).
    pub format: DistributionFormat,
    /// T_fix, T_lin in seconds.
    pub verify_s: (f64, f64),
    /// Mean drafting time per token T̄^dft in seconds (each device scaled by U[1, 1.15]).
    pub draft_token_s: f64,
    /// Acceptance rates, one drawn uniformly per device.
    pub acceptance: [f64; 4],
    /// Draft lengths L ∈ {min..=max}.
    pub draft_range: (u32, u32),
    /// Outcome samples of the SAA.
    pub saa_samples: u32,
}

impl Default for DropRound {
    fn default() -> Self {
        DropRound {
            devices: 20,
            bandwidth_hz: 1e7,
            radio: Radio::paper_b(),
            policy: PayloadPolicy::Choose,
            format: DistributionFormat::PAPER_B,
            verify_s: (0.0428, 0.0076),
            draft_token_s: 0.0152,
            acceptance: [0.85, 0.82, 0.72, 0.75],
            draft_range: (0, 20),
            saa_samples: 1000,
        }
    }
}

impl DropRound {
    /// Draws one round: distances, Rayleigh fading (the same gain both ways), tasks and drafting speeds.
    pub fn draw<R: Rng + ?Sized>(&self, rng: &mut R) -> Result<Round, OptimizeError> {
        self.format.validate()?;
        let drop = Drop::PAPER_B
            .sample(rng, self.devices)
            .map_err(|e| OptimizeError::Invalid {
                field: "devices".into(),
                reason: e.to_string(),
            })?;
        let devices = drop
            .iter()
            .map(|d| {
                let acceptance = self.acceptance[rng.random_range(0..4)];
                let draft_token_s = self.draft_token_s * rng.random_range(1.0..1.15);
                let r = full_band_spectral_efficiency(&self.radio, self.bandwidth_hz, d.channel_gain)
                    .map_err(|e| OptimizeError::Invalid {
                        field: "radio".into(),
                        reason: e.to_string(),
                    })?;
                Ok(RoundDevice {
                    acceptance,
                    draft_token_s,
                    // A device in deep fade still gets a floor of 1e−3 bit/s/Hz, so every plan stays finite.
                    spectral_efficiency: r.max(1e-3),
                    uplink_gain: d.channel_gain,
                    downlink_gain: d.channel_gain,
                })
            })
            .collect::<Result<Vec<_>, OptimizeError>>()?;
        Round::new(RoundSpec {
            bandwidth_hz: self.bandwidth_hz,
            verify_fixed_s: self.verify_s.0,
            verify_per_device_s: self.verify_s.1,
            verify_per_draft_token_s: 0.0,
            min_draft_len: self.draft_range.0,
            max_draft_len: self.draft_range.1,
            radio: self.radio,
            payload: TokenPayload {
                distribution_bits: self.format.distribution_bits(),
                pair_bits: self.format.pair_bits(),
                policy: self.policy,
            },
            correction_split: CorrectionSplit::Equal,
            saa_samples: self.saa_samples,
            seed: rng.random(),
            devices,
        })
    }
}
