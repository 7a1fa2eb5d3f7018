//! `multispin scenario --drop drop.toml`: a paper-A or paper-B scenario (JSON, SI units) from a seeded device drop
//! described in the units radio engineers use (metres, dB, dBm, dBm/Hz, MHz), drawn with `spin-channel`'s code.

use crate::failure::Failure;
use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::json;
use spin_channel::PathLoss;
use spin_channel::paper_b::Drop;
use spin_channel::units::{Conversion, one_of};
use std::path::PathBuf;

/// Arguments of `multispin scenario` (the drop file's fields are documented on `--drop`).
#[derive(Debug, Args)]
pub struct ScenarioArgs {
    /// Drop file (TOML). Every field name carries its unit, and each quantity with two units takes exactly one
    /// of them. Common fields: model ("paper-a" or "paper-b", or --model), seed (or --seed, which wins), devices
    /// (count), acceptance and draft_token_s (one number for every device or a list of `devices` numbers),
    /// min_distance_m and max_distance_m (distances uniform between them), path_loss_exponent, reference_gain_db and
    /// reference_distance_m (gain_dB(d) = reference_gain_db − 10·exponent·log10(d/reference_distance_m)), fading
    /// ("rayleigh": one block-fading draw per device, or "none": the path-loss gain), bandwidth_hz | bandwidth_mhz,
    /// ul_power_w | ul_power_dbm, noise_psd_server_w_per_hz | noise_psd_server_dbm_per_hz, verify_fixed_s,
    /// max_draft_len.
    ///
    /// Both add distribution_bits (bits of one distribution on the air, one per drafted token in paper A) and
    /// verify_per_device_s. Paper A's spectral efficiency is r_k = log2(1 + P_ul·g_k / (N0_server·B/K)) (the SNR
    /// on an equal share of the band). Paper B adds dl_power_w | dl_power_dbm, noise_psd_device_w_per_hz |
    /// noise_psd_device_dbm_per_hz and saa_samples; the scenario's seed is the drop's. Example:
    /// scenarios/examples/drop-paper-b.toml. The scenario JSON goes to stdout.
    #[arg(long, value_name = "FILE.toml")]
    pub drop: PathBuf,
    /// Scenario model; overrides the drop file's `model`.
    #[arg(long, value_enum)]
    pub model: Option<ModelArg>,
    /// Seed of the distance and fading draws; overrides the drop file's `seed`.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
}

/// The two scenario models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelArg {
    /// Draft lengths and uplink bandwidth (paper A).
    PaperA,
    /// Correction modes and draft lengths (paper B).
    PaperB,
}

/// One number for every device, or one per device.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PerDevice {
    All(f64),
    Each(Vec<f64>),
}

impl PerDevice {
    fn expand(&self, field: &str, devices: usize) -> Result<Vec<f64>, Failure> {
        match self {
            PerDevice::All(x) => Ok(vec![*x; devices]),
            PerDevice::Each(v) if v.len() == devices => Ok(v.clone()),
            PerDevice::Each(v) => Err(Failure::Input(format!(
                "{field}: {} values for {devices} devices",
                v.len()
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Fading {
    Rayleigh,
    None,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DropFile {
    model: Option<ModelArg>,
    seed: Option<u64>,
    devices: usize,
    acceptance: PerDevice,
    draft_token_s: PerDevice,
    min_distance_m: f64,
    max_distance_m: f64,
    path_loss_exponent: f64,
    reference_gain_db: f64,
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

/// The most devices a drop may place (the planners have their own limits; this bounds the draw and the output).
pub const MAX_DROP_DEVICES: usize = 100_000;

/// Exactly one of a pair (`spin_channel::units::one_of`), and the SI value finite and positive.
fn pair(
    si: Option<f64>,
    alt: Option<f64>,
    names: (&str, &str),
    conversion: Conversion,
) -> Result<f64, Failure> {
    let v = one_of((names.0, si), (names.1, alt), conversion).map_err(|e| Failure::Input(e.to_string()))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(Failure::Input(format!(
            "{}: {} is not a finite positive number",
            names.0,
            crate::number::plain(v)
        )));
    }
    Ok(v)
}

fn need<T>(value: Option<T>, field: &str, model: &str) -> Result<T, Failure> {
    value.ok_or_else(|| Failure::Input(format!("{field}: missing (a {model} scenario needs it)")))
}

fn unused(present: bool, field: &str, model: &str) -> Result<(), Failure> {
    if present {
        return Err(Failure::Input(format!("{field}: not used by a {model} scenario")));
    }
    Ok(())
}

/// Builds the scenario JSON from drop-file text.
pub fn from_text(
    text: &str,
    model: Option<ModelArg>,
    seed: Option<u64>,
) -> Result<serde_json::Value, Failure> {
    let de = toml::Deserializer::parse(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" at {}", crate::failure::line_column(text, s.start)))
            .unwrap_or_default();
        Failure::Input(format!("drop: malformed TOML{at}: {}", e.message().trim()))
    })?;
    let f: DropFile = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let at = e
            .inner()
            .span()
            .map(|s| format!(" ({})", crate::failure::line_column(text, s.start)))
            .unwrap_or_default();
        let inner = e.inner().message().trim().to_string();
        let inner = format!("{}{at}", inner.lines().next().unwrap_or(""));
        let path = if path == "." || path == "?" {
            "drop".to_string()
        } else {
            path
        };
        Failure::Input(format!("{path}: {inner}"))
    })?;
    let model = model
        .or(f.model)
        .ok_or_else(|| Failure::Input("model: missing (give --model or `model` in the drop file)".into()))?;
    let seed = seed
        .or(f.seed)
        .ok_or_else(|| Failure::Input("seed: missing (give --seed or `seed` in the drop file)".into()))?;
    if f.devices == 0 || f.devices > MAX_DROP_DEVICES {
        return Err(Failure::Input(format!(
            "devices: {} is outside 1..={MAX_DROP_DEVICES}",
            f.devices
        )));
    }
    let k = f.devices;
    let acceptance = f.acceptance.expand("acceptance", k)?;
    let draft_token_s = f.draft_token_s.expand("draft_token_s", k)?;
    let bandwidth_hz = pair(
        f.bandwidth_hz,
        f.bandwidth_mhz,
        ("bandwidth_hz", "bandwidth_mhz"),
        Conversion::MhzToHz,
    )?;
    let ul_power_w = pair(
        f.ul_power_w,
        f.ul_power_dbm,
        ("ul_power_w", "ul_power_dbm"),
        Conversion::DbmToW,
    )?;
    let n0_server = pair(
        f.noise_psd_server_w_per_hz,
        f.noise_psd_server_dbm_per_hz,
        ("noise_psd_server_w_per_hz", "noise_psd_server_dbm_per_hz"),
        Conversion::DbmPerHzToWPerHz,
    )?;
    let drop = Drop {
        min_distance_m: f.min_distance_m,
        max_distance_m: f.max_distance_m,
        path_loss: PathLoss {
            gain_at_reference_db: f.reference_gain_db,
            reference_m: f.reference_distance_m,
            exponent: f.path_loss_exponent,
        },
    };
    if !(f.path_loss_exponent.is_finite() && f.path_loss_exponent >= 0.0) {
        return Err(Failure::Input(format!(
            "path_loss_exponent: {} is not a finite number ≥ 0",
            f.path_loss_exponent
        )));
    }
    if !f.reference_gain_db.is_finite() {
        return Err(Failure::Input(format!(
            "reference_gain_db: {} is not finite",
            f.reference_gain_db
        )));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dropped = drop.sample(&mut rng, k).map_err(Failure::input)?;
    let gains: Vec<f64> = dropped
        .iter()
        .map(|d| match f.fading {
            Fading::Rayleigh => d.channel_gain,
            Fading::None => d.mean_gain,
        })
        .collect();
    if let Some(i) = gains.iter().position(|g| !(g.is_finite() && *g > 0.0)) {
        return Err(Failure::Input(format!(
            "reference_gain_db: device {i} gets a power gain of {}, not a finite positive number",
            crate::number::plain(gains[i])
        )));
    }
    match model {
        ModelArg::PaperA => {
            let m = "paper-a";
            unused(f.dl_power_w.is_some() || f.dl_power_dbm.is_some(), "dl_power", m)?;
            unused(
                f.noise_psd_device_w_per_hz.is_some() || f.noise_psd_device_dbm_per_hz.is_some(),
                "noise_psd_device",
                m,
            )?;
            unused(f.saa_samples.is_some(), "saa_samples", m)?;
            // The SNR on an equal share of the band, B/K.
            let share_hz = bandwidth_hz / k as f64;
            let devices = gains
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let snr = spin_channel::snr(ul_power_w, *g, n0_server, share_hz);
                    let r = spin_channel::spectral_efficiency(snr).map_err(Failure::input)?;
                    Ok(json!({
                        "acceptance": acceptance[i],
                        "draft_token_s": draft_token_s[i],
                        "spectral_efficiency": r,
                    }))
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            Ok(json!({
                "model": m,
                "bandwidth_hz": bandwidth_hz,
                "distribution_bits": need(f.distribution_bits, "distribution_bits", m)?,
                "verify_fixed_s": f.verify_fixed_s,
                "verify_per_device_s": need(f.verify_per_device_s, "verify_per_device_s", m)?,
                "max_draft_len": f.max_draft_len,
                "devices": devices,
            }))
        }
        ModelArg::PaperB => {
            let m = "paper-b";
            let dl_power_w = pair(
                f.dl_power_w,
                f.dl_power_dbm,
                ("dl_power_w", "dl_power_dbm"),
                Conversion::DbmToW,
            )?;
            let n0_device = pair(
                f.noise_psd_device_w_per_hz,
                f.noise_psd_device_dbm_per_hz,
                ("noise_psd_device_w_per_hz", "noise_psd_device_dbm_per_hz"),
                Conversion::DbmPerHzToWPerHz,
            )?;
            let devices: Vec<_> = gains
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    json!({
                        "acceptance": acceptance[i],
                        "draft_token_s": draft_token_s[i],
                        "channel_gain": g,
                    })
                })
                .collect();
            Ok(json!({
                "model": m,
                "bandwidth_hz": bandwidth_hz,
                "distribution_bits": need(f.distribution_bits, "distribution_bits", m)?,
                "verify_fixed_s": f.verify_fixed_s,
                "verify_per_device_s": need(f.verify_per_device_s, "verify_per_device_s", m)?,
                "max_draft_len": f.max_draft_len,
                "ul_power_w": ul_power_w,
                "dl_power_w": dl_power_w,
                "noise_psd_server_w_per_hz": n0_server,
                "noise_psd_device_w_per_hz": n0_device,
                "saa_samples": need(f.saa_samples, "saa_samples", m)?,
                "seed": seed,
                "devices": devices,
            }))
        }
    }
}

/// Runs `multispin scenario`.
pub fn run(args: &ScenarioArgs) -> Result<(), Failure> {
    let text = crate::scenario::read_text(&args.drop, "drop")?;
    let value = from_text(&text, args.model, args.seed)?;
    // The scenario must be one that `plan` accepts: parse it back strictly and validate it (catches e.g. an
    // acceptance outside (0, 1)).
    match crate::scenario::parse(&value.to_string(), false)? {
        crate::scenario::Loaded::PaperA(a) => {
            spin_optimize::paper_a::Scenario::new(&a.spec).map_err(Failure::input)?;
        }
        crate::scenario::Loaded::PaperB(b) => {
            spin_optimize::paper_b::Scenario::new(b).map_err(Failure::input)?;
        }
        crate::scenario::Loaded::Unified(_) => {
            return Err(Failure::Runtime(anyhow::anyhow!(
                "a drop never produces a unified scenario"
            )));
        }
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&value).map_err(anyhow::Error::from)?
    );
    Ok(())
}
