//! Drop files (`multispin scenario --drop drop.toml`, TOML): a seeded device drop in the units radio engineers use
//! (metres, dB, dBm, dBm/Hz, MHz), resolved to SI units and checked for the scenario model it is to produce. Drawing
//! the devices is the binary's work (with `spin-channel`'s code); this module only reads the file.

use crate::FileError;
use crate::pair::{one_of, optional_one_of};
use crate::reader::toml_with_positions;
use serde::Deserialize;
use spin_channel::PathLoss;
use spin_channel::paper_b::Drop;
use spin_channel::units::Conversion;

/// The most devices a drop may place (the planners have their own limits; this bounds the draw and the output).
pub const MAX_DROP_DEVICES: usize = 100_000;

/// The scenario model a drop produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DropModel {
    /// A paper-A scenario: spectral efficiencies on an equal share of the band.
    PaperA,
    /// A paper-B scenario: channel gains, both radios.
    PaperB,
}

impl DropModel {
    /// The scenario file's `model` value.
    pub fn name(self) -> &'static str {
        match self {
            DropModel::PaperA => "paper-a",
            DropModel::PaperB => "paper-b",
        }
    }
}

/// Small-scale fading of the drawn gains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fading {
    /// One Rayleigh block-fading draw per device.
    Rayleigh,
    /// The path-loss gain itself.
    None,
}

/// One number for every device, or one per device.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PerDevice {
    All(f64),
    Each(Vec<f64>),
}

impl PerDevice {
    fn expand(&self, field: &str, devices: usize) -> Result<Vec<f64>, FileError> {
        match self {
            PerDevice::All(x) => Ok(vec![*x; devices]),
            PerDevice::Each(v) if v.len() == devices => Ok(v.clone()),
            PerDevice::Each(v) => Err(FileError::new(
                field,
                format!("{} values for {devices} devices", v.len()),
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DropFile {
    model: Option<DropModel>,
    seed: Option<u64>,
    devices: usize,
    acceptance: PerDevice,
    draft_token_s: PerDevice,
    min_distance_m: f64,
    max_distance_m: f64,
    path_loss_exponent: f64,
    reference_gain_db: Option<f64>,
    reference_gain: Option<f64>,
    reference_distance_m: f64,
    fading: Fading,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    ul_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    noise_psd_server_w_per_hz: Option<f64>,
    noise_psd_server_dbm_per_hz: Option<f64>,
    verify_fixed_s: f64,
    max_draft_len: u32,
    // Both papers, one name each (paper A's older names are aliases).
    #[serde(alias = "bits_per_draft_token")]
    distribution_bits: Option<f64>,
    #[serde(alias = "verify_per_draft_s")]
    verify_per_device_s: Option<f64>,
    // Paper B only.
    dl_power_w: Option<f64>,
    dl_power_dbm: Option<f64>,
    noise_psd_device_w_per_hz: Option<f64>,
    noise_psd_device_dbm_per_hz: Option<f64>,
    saa_samples: Option<u32>,
}

/// What only a paper-B drop has.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaperBRadio {
    /// P_dl in W.
    pub dl_power_w: f64,
    /// N0_dev in W/Hz.
    pub noise_psd_device_w_per_hz: f64,
    /// SAA outcome samples of the scenario.
    pub saa_samples: u32,
}

/// A drop file resolved to SI units, its model and seed chosen, its per-device lists expanded to `devices` values.
#[derive(Debug, Clone, PartialEq)]
pub struct DropSpec {
    /// The scenario model to produce.
    pub model: DropModel,
    /// Seed of the distance and fading draws (paper B's scenario seed too).
    pub seed: u64,
    /// K, in 1..=[`MAX_DROP_DEVICES`].
    pub devices: usize,
    /// α_k per device.
    pub acceptance: Vec<f64>,
    /// T_k^S per device, seconds.
    pub draft_token_s: Vec<f64>,
    /// Distances and path loss.
    pub drop: Drop,
    /// Fading of the drawn gains.
    pub fading: Fading,
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// P_ul in W.
    pub ul_power_w: f64,
    /// N0_ser in W/Hz.
    pub noise_psd_server_w_per_hz: f64,
    /// T_fix, seconds.
    pub verify_fixed_s: f64,
    /// L_max.
    pub max_draft_len: u32,
    /// D, bits of one distribution on the air.
    pub distribution_bits: f64,
    /// T_lin, seconds per device.
    pub verify_per_device_s: f64,
    /// Paper B's downlink and samples (`None` for paper A).
    pub paper_b: Option<PaperBRadio>,
}

/// Exactly one of a pair (when `required`; at most one otherwise), and the SI value finite and positive.
fn positive_pair(
    si: Option<f64>,
    alt: Option<f64>,
    names: (&str, &str),
    conversion: Conversion,
) -> Result<Option<f64>, FileError> {
    let v = optional_one_of("", (names.0, si), (names.1, alt), conversion)?;
    if let Some(v) = v
        && !(v.is_finite() && v > 0.0)
    {
        return Err(FileError::new(
            names.0,
            format!("{v} is not a finite positive number"),
        ));
    }
    Ok(v)
}

fn required(value: Option<f64>, names: (&str, &str)) -> Result<f64, FileError> {
    value.ok_or_else(|| {
        FileError::new(
            format!("{}, {}", names.0, names.1),
            "missing (give exactly one of the pair)",
        )
    })
}

fn need<T>(value: Option<T>, field: &str, model: DropModel) -> Result<T, FileError> {
    value.ok_or_else(|| FileError::new(field, format!("missing (a {} scenario needs it)", model.name())))
}

fn unused(present: bool, field: &str, model: DropModel) -> Result<(), FileError> {
    if present {
        return Err(FileError::new(
            field,
            format!("not used by a {} scenario", model.name()),
        ));
    }
    Ok(())
}

/// Parses drop-file text; `model` and `seed`, when given, override the file's (command-line flags).
pub fn parse(text: &str, model: Option<DropModel>, seed: Option<u64>) -> Result<DropSpec, FileError> {
    let f: DropFile = toml_with_positions(text, "drop")?;
    let model = model
        .or(f.model)
        .ok_or_else(|| FileError::new("model", "missing (give --model or `model` in the drop file)"))?;
    let seed = seed
        .or(f.seed)
        .ok_or_else(|| FileError::new("seed", "missing (give --seed or `seed` in the drop file)"))?;
    if f.devices == 0 || f.devices > MAX_DROP_DEVICES {
        return Err(FileError::new(
            "devices",
            format!("{} is outside 1..={MAX_DROP_DEVICES}", f.devices),
        ));
    }
    let k = f.devices;
    let acceptance = f.acceptance.expand("acceptance", k)?;
    let draft_token_s = f.draft_token_s.expand("draft_token_s", k)?;
    let names = ("bandwidth_hz", "bandwidth_mhz");
    let bandwidth_hz = required(
        positive_pair(f.bandwidth_hz, f.bandwidth_mhz, names, Conversion::MhzToHz)?,
        names,
    )?;
    let names = ("ul_power_w", "ul_power_dbm");
    let ul_power_w = required(
        positive_pair(f.ul_power_w, f.ul_power_dbm, names, Conversion::DbmToW)?,
        names,
    )?;
    let names = ("noise_psd_server_w_per_hz", "noise_psd_server_dbm_per_hz");
    let noise_psd_server_w_per_hz = required(
        positive_pair(
            f.noise_psd_server_w_per_hz,
            f.noise_psd_server_dbm_per_hz,
            names,
            Conversion::DbmPerHzToWPerHz,
        )?,
        names,
    )?;
    if !(f.path_loss_exponent.is_finite() && f.path_loss_exponent >= 0.0) {
        return Err(FileError::new(
            "path_loss_exponent",
            format!("{} is not a finite number ≥ 0", f.path_loss_exponent),
        ));
    }
    // The path-loss law is in dB; a linear gain converts to it.
    let reference_gain_db = one_of(
        "",
        ("reference_gain_db", f.reference_gain_db),
        ("reference_gain", f.reference_gain),
        Conversion::LinearToDb,
    )?;
    if !reference_gain_db.is_finite() {
        return Err(FileError::new(
            "reference_gain_db",
            format!("{reference_gain_db} is not finite"),
        ));
    }
    let paper_b = match model {
        DropModel::PaperA => {
            unused(
                f.dl_power_w.is_some() || f.dl_power_dbm.is_some(),
                "dl_power",
                model,
            )?;
            unused(
                f.noise_psd_device_w_per_hz.is_some() || f.noise_psd_device_dbm_per_hz.is_some(),
                "noise_psd_device",
                model,
            )?;
            unused(f.saa_samples.is_some(), "saa_samples", model)?;
            None
        }
        DropModel::PaperB => {
            let names = ("dl_power_w", "dl_power_dbm");
            let dl_power_w = required(
                positive_pair(f.dl_power_w, f.dl_power_dbm, names, Conversion::DbmToW)?,
                names,
            )?;
            let names = ("noise_psd_device_w_per_hz", "noise_psd_device_dbm_per_hz");
            let noise_psd_device_w_per_hz = required(
                positive_pair(
                    f.noise_psd_device_w_per_hz,
                    f.noise_psd_device_dbm_per_hz,
                    names,
                    Conversion::DbmPerHzToWPerHz,
                )?,
                names,
            )?;
            Some(PaperBRadio {
                dl_power_w,
                noise_psd_device_w_per_hz,
                saa_samples: need(f.saa_samples, "saa_samples", model)?,
            })
        }
    };
    Ok(DropSpec {
        model,
        seed,
        devices: k,
        acceptance,
        draft_token_s,
        drop: Drop {
            min_distance_m: f.min_distance_m,
            max_distance_m: f.max_distance_m,
            path_loss: PathLoss {
                gain_at_reference_db: reference_gain_db,
                reference_m: f.reference_distance_m,
                exponent: f.path_loss_exponent,
            },
        },
        fading: f.fading,
        bandwidth_hz,
        ul_power_w,
        noise_psd_server_w_per_hz,
        verify_fixed_s: f.verify_fixed_s,
        max_draft_len: f.max_draft_len,
        distribution_bits: need(f.distribution_bits, "distribution_bits", model)?,
        verify_per_device_s: need(f.verify_per_device_s, "verify_per_device_s", model)?,
        paper_b,
    })
}
