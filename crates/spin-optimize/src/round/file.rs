//! The unified scenario file (`"model": "unified"`, SI units) and its conversion into a [`Round`].

use super::spec::{
    CorrectionSplit, DistributionFormat, Payload, PayloadPolicy, Radio, Round, RoundDevice, RoundSpec,
    full_band_spectral_efficiency,
};
use crate::OptimizeError;
use serde::{Deserialize, Serialize};

/// One device of a unified scenario file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioDevice {
    /// α_k ∈ (0, 1).
    pub acceptance: f64,
    /// T_k^S in seconds per drafted token.
    pub draft_token_s: f64,
    /// g_k^ul, linear power gain device → server.
    pub uplink_gain: f64,
    /// g_k^dl, linear power gain server → device (default: `uplink_gain`, a reciprocal channel).
    #[serde(default)]
    pub downlink_gain: Option<f64>,
    /// r_k of the draft uplink in bit/s/Hz (default: log₂(1 + P_ul g^ul / (N0_ser B)), the full-band SNR).
    #[serde(default)]
    pub spectral_efficiency: Option<f64>,
}

/// A unified scenario file (`"model": "unified"`, SI units). Unknown fields are refused, so a misspelt optional
/// field cannot silently fall back to its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioSpec {
    /// Must be `"unified"` when present.
    #[serde(default)]
    pub model: Option<String>,
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// T_fix of T_ver(K) = T_fix + K·T_lin, seconds.
    pub verify_fixed_s: f64,
    /// T_lin, seconds per device.
    pub verify_per_device_s: f64,
    /// Smallest draft length (default 0).
    #[serde(default)]
    pub min_draft_len: u32,
    /// Largest draft length.
    pub max_draft_len: u32,
    /// P_ul in W.
    pub ul_power_w: f64,
    /// P_dl in W.
    pub dl_power_w: f64,
    /// N0_ser in W/Hz.
    pub noise_psd_server_w_per_hz: f64,
    /// N0_dev in W/Hz.
    pub noise_psd_device_w_per_hz: f64,
    /// `distribution`, `pair` or `choose` (default `choose`).
    #[serde(default = "default_policy")]
    pub payload: PayloadPolicy,
    /// V_eff of an exchanged distribution.
    pub effective_support: u32,
    /// V, the vocabulary size.
    pub vocabulary: u32,
    /// Q, bits per kept probability.
    pub quant_bits: u32,
    /// Charge ⌈log₂V⌉ + Q bits per pair on the draft uplink (default true; false neglects them as paper B).
    #[serde(default = "default_true")]
    pub charge_pairs: bool,
    /// How the correction band is split (default `equal`).
    #[serde(default)]
    pub correction_split: CorrectionSplit,
    /// SAA outcome samples (required: it changes the result, so it is never defaulted silently).
    pub saa_samples: u32,
    /// Seed of the samples (required, like `saa_samples`).
    pub seed: u64,
    /// The devices.
    pub devices: Vec<ScenarioDevice>,
}

fn default_policy() -> PayloadPolicy {
    PayloadPolicy::Choose
}

fn default_true() -> bool {
    true
}

impl ScenarioSpec {
    /// Validates the file and builds the round; every error names its field.
    pub fn into_round(self) -> Result<Round, OptimizeError> {
        if let Some(m) = &self.model
            && m != "unified"
        {
            return Err(OptimizeError::Invalid {
                field: "model".into(),
                reason: format!("{m:?} is not \"unified\""),
            });
        }
        let format = DistributionFormat {
            effective_support: self.effective_support,
            vocabulary: self.vocabulary,
            quant_bits: self.quant_bits,
        };
        format.validate()?;
        OptimizeError::positive("bandwidth_hz", self.bandwidth_hz)?;
        let radio = Radio {
            ul_power_w: OptimizeError::positive("ul_power_w", self.ul_power_w)?,
            dl_power_w: self.dl_power_w,
            noise_psd_server_w_per_hz: OptimizeError::positive(
                "noise_psd_server_w_per_hz",
                self.noise_psd_server_w_per_hz,
            )?,
            noise_psd_device_w_per_hz: self.noise_psd_device_w_per_hz,
        };
        let devices =
            self.devices
                .iter()
                .enumerate()
                .map(|(k, d)| {
                    let uplink_gain =
                        OptimizeError::positive(format!("devices[{k}].uplink_gain"), d.uplink_gain)?;
                    let spectral_efficiency = match d.spectral_efficiency {
                        Some(r) => r,
                        None => full_band_spectral_efficiency(&radio, self.bandwidth_hz, uplink_gain)
                            .map_err(|e| OptimizeError::Invalid {
                                field: format!("devices[{k}].spectral_efficiency"),
                                reason: e.to_string(),
                            })?,
                    };
                    Ok(RoundDevice {
                        acceptance: d.acceptance,
                        draft_token_s: d.draft_token_s,
                        spectral_efficiency,
                        uplink_gain,
                        downlink_gain: d.downlink_gain.unwrap_or(uplink_gain),
                    })
                })
                .collect::<Result<Vec<_>, OptimizeError>>()?;
        Round::new(RoundSpec {
            bandwidth_hz: self.bandwidth_hz,
            verify_fixed_s: self.verify_fixed_s,
            verify_per_device_s: self.verify_per_device_s,
            min_draft_len: self.min_draft_len,
            max_draft_len: self.max_draft_len,
            radio,
            payload: Payload {
                distribution_bits: format.distribution_bits(),
                pair_bits: if self.charge_pairs {
                    format.pair_bits()
                } else {
                    0.0
                },
                policy: self.payload,
            },
            correction_split: self.correction_split,
            saa_samples: self.saa_samples,
            seed: self.seed,
            devices,
        })
    }
}
