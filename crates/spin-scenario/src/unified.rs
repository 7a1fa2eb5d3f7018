//! Unified scenario files (`"model": "unified"`, docs/unified.md): the file as written, every quantity in either
//! unit of its pair, resolved to SI units in [`UnifiedScenario`] and validated into a `spin_optimize::round::Round`.

use crate::FileError;
use crate::pair::{RadioPairs, bandwidth_hz, one_of, optional_one_of};
use serde::Deserialize;
use spin_channel::units::Conversion;
use spin_optimize::OptimizeError;
use spin_optimize::round::{
    CorrectionSplit, DistributionFormat, PayloadPolicy, Radio, Round, RoundDevice, RoundSpec, TokenPayload,
    full_band_spectral_efficiency,
};

/// `payload` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum PayloadFile {
    Distribution,
    Pair,
    Choose,
}

/// `correction_split` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum CorrectionSplitFile {
    #[default]
    Equal,
}

/// One device as written.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeviceFile {
    acceptance: f64,
    draft_token_s: f64,
    uplink_gain: Option<f64>,
    uplink_gain_db: Option<f64>,
    downlink_gain: Option<f64>,
    downlink_gain_db: Option<f64>,
    spectral_efficiency: Option<f64>,
}

/// A unified scenario file as written. Unknown fields are refused, so a misspelt optional field cannot silently
/// fall back to its default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnifiedFile {
    #[serde(rename = "model")]
    _model: Option<String>,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    verify_fixed_s: f64,
    verify_per_device_s: f64,
    #[serde(default)]
    verify_per_draft_token_s: f64,
    #[serde(default)]
    min_draft_len: u32,
    max_draft_len: u32,
    ul_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    dl_power_w: Option<f64>,
    dl_power_dbm: Option<f64>,
    noise_psd_server_w_per_hz: Option<f64>,
    noise_psd_server_dbm_per_hz: Option<f64>,
    noise_psd_device_w_per_hz: Option<f64>,
    noise_psd_device_dbm_per_hz: Option<f64>,
    payload: Option<PayloadFile>,
    effective_support: u32,
    vocabulary: u32,
    quant_bits: u32,
    charge_pairs: Option<bool>,
    #[serde(default)]
    correction_split: CorrectionSplitFile,
    // Required: they change the result, so they are never defaulted silently.
    saa_samples: u32,
    seed: u64,
    devices: Vec<DeviceFile>,
}

/// One device of a unified scenario, SI units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnifiedDevice {
    /// α_k ∈ (0, 1).
    pub acceptance: f64,
    /// T_k^S in seconds per drafted token.
    pub draft_token_s: f64,
    /// g_k^ul, linear power gain device → server.
    pub uplink_gain: f64,
    /// g_k^dl, linear power gain server → device (`None`: the uplink gain, a reciprocal channel).
    pub downlink_gain: Option<f64>,
    /// r_k of the draft uplink in bit/s/Hz (`None`: log₂(1 + P_ul g^ul / (N0_ser B)), the full-band SNR).
    pub spectral_efficiency: Option<f64>,
}

/// A unified scenario resolved to SI units (unvalidated; [`UnifiedScenario::into_round`] checks it).
#[derive(Debug, Clone, PartialEq)]
pub struct UnifiedScenario {
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// T_fix of T_ver(K) = T_fix + K·T_lin, seconds.
    pub verify_fixed_s: f64,
    /// T_lin, seconds per device.
    pub verify_per_device_s: f64,
    /// T_tok, seconds per drafted token in the batch: T_ver(K, L) = T_fix + K·T_lin + T_tok·Σ L_k (default 0, the
    /// papers' model).
    pub verify_per_draft_token_s: f64,
    /// Smallest draft length (default 0).
    pub min_draft_len: u32,
    /// Largest draft length.
    pub max_draft_len: u32,
    /// P_ul, P_dl, N0_ser, N0_dev.
    pub radio: Radio,
    /// Which per-token payloads the planner may use (default `choose`).
    pub payload: PayloadPolicy,
    /// V_eff, V and Q of an exchanged distribution.
    pub format: DistributionFormat,
    /// Charge ⌈log₂V⌉ + Q bits per pair on the draft uplink (default true; false neglects them as paper B).
    pub charge_pairs: bool,
    /// How the correction band is split (default `equal`).
    pub correction_split: CorrectionSplit,
    /// SAA outcome samples.
    pub saa_samples: u32,
    /// Seed of the samples.
    pub seed: u64,
    /// The devices.
    pub devices: Vec<UnifiedDevice>,
}

impl UnifiedScenario {
    /// Resolves the unit pairs of the file; errors name the pair (`devices[2].uplink_gain, devices[2].uplink_gain_db: …`).
    pub(crate) fn from_file(f: UnifiedFile) -> Result<UnifiedScenario, FileError> {
        let devices = f
            .devices
            .iter()
            .enumerate()
            .map(|(k, d)| {
                let prefix = format!("devices[{k}].");
                Ok(UnifiedDevice {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    uplink_gain: one_of(
                        &prefix,
                        ("uplink_gain", d.uplink_gain),
                        ("uplink_gain_db", d.uplink_gain_db),
                        Conversion::DbToLinear,
                    )?,
                    downlink_gain: optional_one_of(
                        &prefix,
                        ("downlink_gain", d.downlink_gain),
                        ("downlink_gain_db", d.downlink_gain_db),
                        Conversion::DbToLinear,
                    )?,
                    spectral_efficiency: d.spectral_efficiency,
                })
            })
            .collect::<Result<Vec<_>, FileError>>()?;
        Ok(UnifiedScenario {
            bandwidth_hz: bandwidth_hz("", f.bandwidth_hz, f.bandwidth_mhz)?,
            verify_fixed_s: f.verify_fixed_s,
            verify_per_device_s: f.verify_per_device_s,
            verify_per_draft_token_s: f.verify_per_draft_token_s,
            min_draft_len: f.min_draft_len,
            max_draft_len: f.max_draft_len,
            radio: RadioPairs {
                ul_power: (f.ul_power_w, f.ul_power_dbm),
                dl_power: (f.dl_power_w, f.dl_power_dbm),
                noise_psd_server: (f.noise_psd_server_w_per_hz, f.noise_psd_server_dbm_per_hz),
                noise_psd_device: (f.noise_psd_device_w_per_hz, f.noise_psd_device_dbm_per_hz),
            }
            .resolve()?,
            payload: match f.payload.unwrap_or(PayloadFile::Choose) {
                PayloadFile::Distribution => PayloadPolicy::Distribution,
                PayloadFile::Pair => PayloadPolicy::Pair,
                PayloadFile::Choose => PayloadPolicy::Choose,
            },
            format: DistributionFormat {
                effective_support: f.effective_support,
                vocabulary: f.vocabulary,
                quant_bits: f.quant_bits,
            },
            charge_pairs: f.charge_pairs.unwrap_or(true),
            correction_split: match f.correction_split {
                CorrectionSplitFile::Equal => CorrectionSplit::Equal,
            },
            saa_samples: f.saa_samples,
            seed: f.seed,
            devices,
        })
    }

    /// Validates the scenario and builds the round; every error names its field.
    pub fn into_round(self) -> Result<Round, OptimizeError> {
        let format = self.format;
        format.validate()?;
        OptimizeError::positive("bandwidth_hz", self.bandwidth_hz)?;
        OptimizeError::positive("ul_power_w", self.radio.ul_power_w)?;
        OptimizeError::positive("noise_psd_server_w_per_hz", self.radio.noise_psd_server_w_per_hz)?;
        let radio = self.radio;
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
            verify_per_draft_token_s: self.verify_per_draft_token_s,
            min_draft_len: self.min_draft_len,
            max_draft_len: self.max_draft_len,
            radio,
            payload: TokenPayload {
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
