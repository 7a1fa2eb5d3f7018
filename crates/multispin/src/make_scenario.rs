//! `multispin scenario --drop drop.toml`: a paper-A or paper-B scenario (JSON, SI units) from a seeded device drop
//! described in the units radio engineers use (metres, dB, dBm, dBm/Hz, MHz), drawn with `spin-channel`'s code.

use crate::failure::Failure;
use crate::number::plain;
use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use spin_channel::ChannelError;
use spin_scenario::drop::{DropModel, Fading};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelArg {
    /// Draft lengths and uplink bandwidth (paper A).
    PaperA,
    /// Correction modes and draft lengths (paper B).
    PaperB,
}

impl From<ModelArg> for DropModel {
    fn from(m: ModelArg) -> DropModel {
        match m {
            ModelArg::PaperA => DropModel::PaperA,
            ModelArg::PaperB => DropModel::PaperB,
        }
    }
}

/// The drop's numbers that go into the scenario as written must be finite: JSON has no NaN or ∞ (they would be
/// written as `null` and read back as "invalid type: null"), so each is named here by the drop file's field.
fn finite_as_written(d: &spin_scenario::drop::DropSpec) -> Result<(), Failure> {
    let not_finite = |field: &str, v: f64, device: Option<usize>| {
        let which = device.map_or(String::new(), |i| format!(" (device {i})"));
        Failure::Input(format!("{field}: {}{which} is not a finite number", plain(v)))
    };
    for (field, v) in [
        ("distribution_bits", d.distribution_bits),
        ("verify_fixed_s", d.verify_fixed_s),
        ("verify_per_device_s", d.verify_per_device_s),
    ] {
        if !v.is_finite() {
            return Err(not_finite(field, v, None));
        }
    }
    for (field, values) in [("acceptance", &d.acceptance), ("draft_token_s", &d.draft_token_s)] {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(not_finite(field, values[i], Some(i)));
        }
    }
    Ok(())
}

/// The drop file's fields a device's path-loss gain is computed from, named together when that gain is out of
/// range (none of them alone need be).
const PATH_LOSS_FIELDS: &str =
    "reference_gain_db, reference_distance_m, path_loss_exponent, min_distance_m, max_distance_m";

/// A drawing error named by the drop file's fields: `spin-channel` names its path-loss model's own field
/// (`reference_m`) and the mean gain it derives (`mean_gain`), neither of which a drop file writes.
fn drawing_error(e: ChannelError) -> Failure {
    match e {
        ChannelError::OutOfDomain {
            field: "reference_m",
            value,
            domain,
        } => Failure::Input(format!(
            "reference_distance_m: {} is outside {domain}",
            plain(value)
        )),
        ChannelError::OutOfDomain {
            field: "mean_gain",
            value,
            ..
        } => Failure::Input(format!(
            "{PATH_LOSS_FIELDS}: the path loss gives a device a mean power gain of {}, not a finite positive number",
            plain(value)
        )),
        e => Failure::input(e),
    }
}

/// Builds the scenario JSON from drop-file text.
pub fn from_text(
    text: &str,
    model: Option<ModelArg>,
    seed: Option<u64>,
) -> Result<serde_json::Value, Failure> {
    let d = spin_scenario::drop::parse(text, model.map(DropModel::from), seed).map_err(Failure::input)?;
    finite_as_written(&d)?;
    let k = d.devices;
    let mut rng = ChaCha8Rng::seed_from_u64(d.seed);
    let dropped = d.drop.sample(&mut rng, k).map_err(drawing_error)?;
    let gains: Vec<f64> = dropped
        .iter()
        .map(|x| match d.fading {
            Fading::Rayleigh => x.channel_gain,
            Fading::None => x.mean_gain,
        })
        .collect();
    if let Some(i) = gains.iter().position(|g| !(g.is_finite() && *g > 0.0)) {
        return Err(Failure::Input(format!(
            "{PATH_LOSS_FIELDS}: device {i} gets a power gain of {}, not a finite positive number",
            plain(gains[i])
        )));
    }
    match d.paper_b {
        None => {
            // The SNR on an equal share of the band, B/K.
            let share_hz = d.bandwidth_hz / k as f64;
            let devices = gains
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let snr = spin_channel::snr(d.ul_power_w, *g, d.noise_psd_server_w_per_hz, share_hz);
                    let r = spin_channel::spectral_efficiency(snr).map_err(Failure::input)?;
                    Ok(json!({
                        "acceptance": d.acceptance[i],
                        "draft_token_s": d.draft_token_s[i],
                        "spectral_efficiency": r,
                    }))
                })
                .collect::<Result<Vec<_>, Failure>>()?;
            Ok(json!({
                "model": d.model.name(),
                "bandwidth_hz": d.bandwidth_hz,
                "distribution_bits": d.distribution_bits,
                "verify_fixed_s": d.verify_fixed_s,
                "verify_per_device_s": d.verify_per_device_s,
                "max_draft_len": d.max_draft_len,
                "devices": devices,
            }))
        }
        Some(b) => {
            let devices: Vec<_> = gains
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    json!({
                        "acceptance": d.acceptance[i],
                        "draft_token_s": d.draft_token_s[i],
                        "channel_gain": g,
                    })
                })
                .collect();
            Ok(json!({
                "model": d.model.name(),
                "bandwidth_hz": d.bandwidth_hz,
                "distribution_bits": d.distribution_bits,
                "verify_fixed_s": d.verify_fixed_s,
                "verify_per_device_s": d.verify_per_device_s,
                "max_draft_len": d.max_draft_len,
                "ul_power_w": d.ul_power_w,
                "dl_power_w": b.dl_power_w,
                "noise_psd_server_w_per_hz": d.noise_psd_server_w_per_hz,
                "noise_psd_device_w_per_hz": b.noise_psd_device_w_per_hz,
                "saa_samples": b.saa_samples,
                "seed": d.seed,
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
    match spin_scenario::parse(&value.to_string(), spin_scenario::Format::Json).map_err(Failure::input)? {
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
