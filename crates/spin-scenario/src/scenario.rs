//! Scenario files: `"model": "paper-a"` (or no model field), `"paper-b"` or `"unified"`, JSON or TOML, read by the
//! rules of [`crate::reader`] and resolved to the SI specs of `spin-optimize` (docs/cli.md lists the fields).

use crate::FileError;
use crate::pair::{RadioPairs, bandwidth_hz, one_of};
use crate::reader::{Document, Format};
use crate::unified::{UnifiedFile, UnifiedScenario};
use serde::Deserialize;
use spin_channel::units::Conversion;
use spin_optimize::paper_a::heterogeneous::Alg1Params;
use spin_optimize::round::Family;
use spin_optimize::{paper_a, paper_b};

/// A paper-A scenario with the planner settings a file may carry.
#[derive(Debug, Clone)]
pub struct PaperA {
    /// The SI spec.
    pub spec: paper_a::ScenarioSpec,
    /// `fixed_draft_len`, when given.
    pub fixed_draft_len: Option<u32>,
    /// Algorithm 1's grid (documented defaults 100, 100, 1e-6).
    pub alg1: Alg1Params,
}

/// A parsed scenario file.
#[derive(Debug, Clone)]
pub enum Loaded {
    /// `"model": "paper-a"` (or no model field).
    PaperA(PaperA),
    /// `"model": "paper-b"`.
    PaperB(paper_b::ScenarioSpec),
    /// `"model": "unified"` (docs/unified.md).
    Unified(UnifiedScenario),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperADeviceFile {
    acceptance: f64,
    draft_token_s: f64,
    spectral_efficiency: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperAFile {
    #[serde(rename = "model")]
    _model: Option<String>,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    // One name per quantity across both papers; the names paper-A files had before stay accepted.
    #[serde(alias = "bits_per_draft_token")]
    distribution_bits: f64,
    verify_fixed_s: f64,
    #[serde(alias = "verify_per_draft_s")]
    verify_per_device_s: f64,
    max_draft_len: u32,
    min_draft_len: Option<u32>,
    fixed_draft_len: Option<u32>,
    alg1_phi_points: Option<usize>,
    alg1_lambda_points: Option<usize>,
    alg1_lambda_lo_ratio: Option<f64>,
    devices: Vec<PaperADeviceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperBDeviceFile {
    acceptance: f64,
    draft_token_s: f64,
    channel_gain: Option<f64>,
    channel_gain_db: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaperBFile {
    #[serde(rename = "model")]
    _model: String,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    distribution_bits: f64,
    verify_fixed_s: f64,
    verify_per_device_s: f64,
    max_draft_len: u32,
    ul_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    dl_power_w: Option<f64>,
    dl_power_dbm: Option<f64>,
    noise_psd_server_w_per_hz: Option<f64>,
    noise_psd_server_dbm_per_hz: Option<f64>,
    noise_psd_device_w_per_hz: Option<f64>,
    noise_psd_device_dbm_per_hz: Option<f64>,
    saa_samples: u32,
    seed: u64,
    devices: Vec<PaperBDeviceFile>,
}

/// Parses scenario text of any model.
pub fn parse(text: &str, format: Format) -> Result<Loaded, FileError> {
    parse_expecting(text, format, None)
}

/// [`parse`] for a command that takes only `expect` scenarios: a file of another model is refused by its `model`
/// field before its other fields are checked.
pub fn parse_expecting(text: &str, format: Format, expect: Option<Family>) -> Result<Loaded, FileError> {
    let doc = Document::parse(text, format, "scenario")?;
    let model = match doc.top_level_str("model") {
        None => Family::PaperA,
        Some(Ok(s)) if s == "paper-a" => Family::PaperA,
        Some(Ok(s)) if s == "paper-b" => Family::PaperB,
        Some(Ok(s)) if s == "unified" => Family::Unified,
        Some(other) => {
            let found = match other {
                Ok(s) => serde_json::Value::String(s).to_string(),
                Err(json) => json,
            };
            return Err(FileError::new(
                "model",
                format!("expected \"paper-a\", \"paper-b\" or \"unified\", found {found}"),
            ));
        }
    };
    if let Some(want) = expect
        && want != model
    {
        return Err(FileError::new(
            "model",
            format!(
                "this command needs a {} scenario (\"model\": \"{}\"), the file is {}",
                want.name(),
                want.name(),
                model.name()
            ),
        ));
    }
    match model {
        Family::PaperA => paper_a_from(doc.into_struct()?).map(Loaded::PaperA),
        Family::PaperB => paper_b_from(doc.into_struct()?).map(Loaded::PaperB),
        Family::Unified => UnifiedScenario::from_file(doc.into_struct::<UnifiedFile>()?).map(Loaded::Unified),
    }
}

fn paper_a_from(f: PaperAFile) -> Result<PaperA, FileError> {
    let defaults = Alg1Params::default();
    Ok(PaperA {
        spec: paper_a::ScenarioSpec {
            bandwidth_hz: bandwidth_hz("", f.bandwidth_hz, f.bandwidth_mhz)?,
            distribution_bits: f.distribution_bits,
            verify_fixed_s: f.verify_fixed_s,
            verify_per_device_s: f.verify_per_device_s,
            max_draft_len: f.max_draft_len,
            min_draft_len: f.min_draft_len.unwrap_or(1),
            devices: f
                .devices
                .into_iter()
                .map(|d| paper_a::DeviceSpec {
                    acceptance: d.acceptance,
                    draft_token_s: d.draft_token_s,
                    spectral_efficiency: d.spectral_efficiency,
                })
                .collect(),
        },
        fixed_draft_len: f.fixed_draft_len,
        alg1: Alg1Params {
            phi_points: f.alg1_phi_points.unwrap_or(defaults.phi_points),
            lambda_points: f.alg1_lambda_points.unwrap_or(defaults.lambda_points),
            lambda_lo_ratio: f.alg1_lambda_lo_ratio.unwrap_or(defaults.lambda_lo_ratio),
        },
    })
}

fn paper_b_from(f: PaperBFile) -> Result<paper_b::ScenarioSpec, FileError> {
    let devices = f
        .devices
        .into_iter()
        .enumerate()
        .map(|(k, d)| {
            Ok(paper_b::DeviceSpec {
                acceptance: d.acceptance,
                draft_token_s: d.draft_token_s,
                channel_gain: one_of(
                    &format!("devices[{k}]."),
                    ("channel_gain", d.channel_gain),
                    ("channel_gain_db", d.channel_gain_db),
                    Conversion::DbToLinear,
                )?,
            })
        })
        .collect::<Result<Vec<_>, FileError>>()?;
    let bandwidth_hz = bandwidth_hz("", f.bandwidth_hz, f.bandwidth_mhz)?;
    let radio = RadioPairs {
        ul_power: (f.ul_power_w, f.ul_power_dbm),
        dl_power: (f.dl_power_w, f.dl_power_dbm),
        noise_psd_server: (f.noise_psd_server_w_per_hz, f.noise_psd_server_dbm_per_hz),
        noise_psd_device: (f.noise_psd_device_w_per_hz, f.noise_psd_device_dbm_per_hz),
    }
    .resolve()?;
    Ok(paper_b::ScenarioSpec {
        bandwidth_hz,
        distribution_bits: f.distribution_bits,
        verify_fixed_s: f.verify_fixed_s,
        verify_per_device_s: f.verify_per_device_s,
        max_draft_len: f.max_draft_len,
        ul_power_w: radio.ul_power_w,
        dl_power_w: radio.dl_power_w,
        noise_psd_server_w_per_hz: radio.noise_psd_server_w_per_hz,
        noise_psd_device_w_per_hz: radio.noise_psd_device_w_per_hz,
        saa_samples: f.saa_samples,
        seed: f.seed,
        devices,
    })
}
