//! `scenarios/paper-b.toml`: paper B's reproduction parameters (radio, distribution format, run sizes, model
//! pairs, the sweeps of Figs. 6–11), resolved to SI units except the transmit powers, which stay in dBm because the
//! paper's axes and budgets are stated in dBm (a file may still give them in W).

use super::parse_toml;
use crate::FileError;
use crate::pair::{bandwidth_hz, one_of, one_of_list};
use serde::Deserialize;
use spin_channel::units::Conversion;
use spin_optimize::round::DistributionFormat;

/// Sample counts of one run size.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// N_SAA outcome samples per evaluation.
    pub saa_samples: u32,
    /// Channel/computation/task realisations averaged per point.
    pub drops: u32,
}

/// One draft/target model pair (paper B §VI-A1–2) with our Table I choice.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pair {
    /// Display name.
    pub name: String,
    /// T0 of T_ver = T0 + T1·K in s.
    pub verify_fixed_s: f64,
    /// T1 in s per device.
    pub verify_per_device_s: f64,
    /// Reference drafting latency per token in s.
    pub draft_token_s: f64,
    /// Task names (devices draw one uniformly).
    pub tasks: Vec<String>,
    /// Acceptance rate per task, same order ⟨C⟩.
    pub acceptance: Vec<f64>,
}

/// Fig. 6 budgets (dBm, the unit of the paper's axes; a file may give them in W).
#[derive(Debug, Clone)]
pub struct Fig6 {
    /// P_dl in dBm.
    pub dl_power_dbm: f64,
    /// P_ul in dBm.
    pub ul_power_dbm: f64,
}

/// Figs. 7–8 sweep (dBm, the unit of the paper's axes).
#[derive(Debug, Clone)]
pub struct Fig7 {
    /// Fixed P_ul in dBm ⟨C⟩.
    pub ul_power_dbm: f64,
    /// P_dl points in dBm.
    pub dl_power_dbm: Vec<f64>,
    /// P_dl points of the quick run.
    pub quick_dl_power_dbm: Vec<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig6File {
    dl_power_dbm: Option<f64>,
    dl_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    ul_power_w: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig7File {
    ul_power_dbm: Option<f64>,
    ul_power_w: Option<f64>,
    dl_power_dbm: Option<Vec<f64>>,
    dl_power_w: Option<Vec<f64>>,
    quick_dl_power_dbm: Option<Vec<f64>>,
    quick_dl_power_w: Option<Vec<f64>>,
}

/// Figs. 9–10 sweep.
#[derive(Debug, Clone)]
pub struct Fig9 {
    /// P_dl/P_ul of Fig. 9 and Fig. 10.
    pub ratios: Vec<f64>,
    /// K points.
    pub devices: Vec<usize>,
    /// K points of the quick run.
    pub quick_devices: Vec<usize>,
}

/// Fig. 11 sweep.
#[derive(Debug, Clone)]
pub struct Fig11 {
    /// P_dl/P_ul points.
    pub ratios: Vec<f64>,
    /// Points of the quick run.
    pub quick_ratios: Vec<f64>,
}

/// `[fig9]` as written: the power ratios linear or in dB.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig9File {
    ratios: Option<Vec<f64>>,
    ratios_db: Option<Vec<f64>>,
    devices: Vec<usize>,
    quick_devices: Vec<usize>,
}

/// `[fig11]` as written: the power ratios linear or in dB.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig11File {
    ratios: Option<Vec<f64>>,
    ratios_db: Option<Vec<f64>>,
    quick_ratios: Option<Vec<f64>>,
    quick_ratios_db: Option<Vec<f64>>,
}

/// The whole parameter file, resolved: SI units, except the transmit powers, which stay in dBm because the paper's
/// axes and budgets are stated in dBm (a file may still give them in W).
#[derive(Debug, Clone)]
pub struct Config {
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// V_eff.
    pub effective_support: u32,
    /// V.
    pub vocabulary: u32,
    /// Q.
    pub quant_bits: u32,
    /// N0_ser in W/Hz.
    pub noise_psd_server_w_per_hz: f64,
    /// N0_dev in W/Hz.
    pub noise_psd_device_w_per_hz: f64,
    /// γ_max.
    pub max_draft_len: u32,
    /// K of Figs. 7, 8, 11 and Fig. 6's rejected set.
    pub devices: usize,
    /// Lower drafting-latency scale.
    pub draft_scale_min: f64,
    /// Upper drafting-latency scale.
    pub draft_scale_max: f64,
    /// Reference P̄_dl in dBm.
    pub dl_power_dbm: f64,
    /// Reference P̄_ul in dBm.
    pub ul_power_dbm: f64,
    /// Paper-scale sizes.
    pub paper: Size,
    /// Quick sizes.
    pub quick: Size,
    /// Model pairs.
    pub pairs: Vec<Pair>,
    /// Fig. 6.
    pub fig6: Fig6,
    /// Figs. 7–8.
    pub fig7: Fig7,
    /// Figs. 9–10.
    pub fig9: Fig9,
    /// Fig. 11.
    pub fig11: Fig11,
}

/// The file as written: quantities in either unit of a pair.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    effective_support: u32,
    vocabulary: u32,
    quant_bits: u32,
    noise_psd_server_w_per_hz: Option<f64>,
    noise_psd_server_dbm_per_hz: Option<f64>,
    noise_psd_device_w_per_hz: Option<f64>,
    noise_psd_device_dbm_per_hz: Option<f64>,
    max_draft_len: u32,
    devices: usize,
    draft_scale_min: f64,
    draft_scale_max: f64,
    dl_power_dbm: Option<f64>,
    dl_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
    ul_power_w: Option<f64>,
    paper: Size,
    quick: Size,
    pairs: Vec<Pair>,
    fig6: Fig6File,
    fig7: Fig7File,
    fig9: Fig9File,
    fig11: Fig11File,
}

/// Keys of the layout before the scenario-file names, with what replaced them.
const RENAMED: &[(&str, &str)] = &[
    ("reference_dl_dbm", "dl_power_dbm (or dl_power_w)"),
    ("reference_ul_dbm", "ul_power_dbm (or ul_power_w)"),
    ("fig6.dl_dbm", "fig6.dl_power_dbm (or fig6.dl_power_w)"),
    ("fig6.ul_dbm", "fig6.ul_power_dbm (or fig6.ul_power_w)"),
    ("fig7.ul_dbm", "fig7.ul_power_dbm (or fig7.ul_power_w)"),
    ("fig7.dl_dbm", "fig7.dl_power_dbm (or fig7.dl_power_w)"),
    (
        "fig7.quick_dl_dbm",
        "fig7.quick_dl_power_dbm (or fig7.quick_dl_power_w)",
    ),
];

impl Config {
    /// V_eff, V and Q of an exchanged distribution; D = V_eff(⌈log₂V⌉ + Q) comes from spin-core through it.
    pub fn distribution_format(&self) -> DistributionFormat {
        DistributionFormat {
            effective_support: self.effective_support,
            vocabulary: self.vocabulary,
            quant_bits: self.quant_bits,
        }
    }

    /// Parses and checks the structure (the numeric domains are checked by the scenario constructors).
    pub fn parse(text: &str) -> Result<Config, FileError> {
        let f: ConfigFile = parse_toml(text, RENAMED)?;
        let dbm = Conversion::WToDbm;
        let cfg = Config {
            bandwidth_hz: bandwidth_hz("", f.bandwidth_hz, f.bandwidth_mhz)?,
            effective_support: f.effective_support,
            vocabulary: f.vocabulary,
            quant_bits: f.quant_bits,
            noise_psd_server_w_per_hz: one_of(
                "",
                ("noise_psd_server_w_per_hz", f.noise_psd_server_w_per_hz),
                ("noise_psd_server_dbm_per_hz", f.noise_psd_server_dbm_per_hz),
                Conversion::DbmPerHzToWPerHz,
            )?,
            noise_psd_device_w_per_hz: one_of(
                "",
                ("noise_psd_device_w_per_hz", f.noise_psd_device_w_per_hz),
                ("noise_psd_device_dbm_per_hz", f.noise_psd_device_dbm_per_hz),
                Conversion::DbmPerHzToWPerHz,
            )?,
            max_draft_len: f.max_draft_len,
            devices: f.devices,
            draft_scale_min: f.draft_scale_min,
            draft_scale_max: f.draft_scale_max,
            dl_power_dbm: one_of(
                "",
                ("dl_power_dbm", f.dl_power_dbm),
                ("dl_power_w", f.dl_power_w),
                dbm,
            )?,
            ul_power_dbm: one_of(
                "",
                ("ul_power_dbm", f.ul_power_dbm),
                ("ul_power_w", f.ul_power_w),
                dbm,
            )?,
            paper: f.paper,
            quick: f.quick,
            pairs: f.pairs,
            fig6: Fig6 {
                dl_power_dbm: one_of(
                    "fig6.",
                    ("dl_power_dbm", f.fig6.dl_power_dbm),
                    ("dl_power_w", f.fig6.dl_power_w),
                    dbm,
                )?,
                ul_power_dbm: one_of(
                    "fig6.",
                    ("ul_power_dbm", f.fig6.ul_power_dbm),
                    ("ul_power_w", f.fig6.ul_power_w),
                    dbm,
                )?,
            },
            fig7: Fig7 {
                ul_power_dbm: one_of(
                    "fig7.",
                    ("ul_power_dbm", f.fig7.ul_power_dbm),
                    ("ul_power_w", f.fig7.ul_power_w),
                    dbm,
                )?,
                dl_power_dbm: one_of_list(
                    "fig7.",
                    ("dl_power_dbm", f.fig7.dl_power_dbm.as_deref()),
                    ("dl_power_w", f.fig7.dl_power_w.as_deref()),
                    dbm,
                )?,
                quick_dl_power_dbm: one_of_list(
                    "fig7.",
                    ("quick_dl_power_dbm", f.fig7.quick_dl_power_dbm.as_deref()),
                    ("quick_dl_power_w", f.fig7.quick_dl_power_w.as_deref()),
                    dbm,
                )?,
            },
            fig9: Fig9 {
                ratios: one_of_list(
                    "fig9.",
                    ("ratios", f.fig9.ratios.as_deref()),
                    ("ratios_db", f.fig9.ratios_db.as_deref()),
                    Conversion::DbToLinear,
                )?,
                devices: f.fig9.devices,
                quick_devices: f.fig9.quick_devices,
            },
            fig11: Fig11 {
                ratios: one_of_list(
                    "fig11.",
                    ("ratios", f.fig11.ratios.as_deref()),
                    ("ratios_db", f.fig11.ratios_db.as_deref()),
                    Conversion::DbToLinear,
                )?,
                quick_ratios: one_of_list(
                    "fig11.",
                    ("quick_ratios", f.fig11.quick_ratios.as_deref()),
                    ("quick_ratios_db", f.fig11.quick_ratios_db.as_deref()),
                    Conversion::DbToLinear,
                )?,
            },
        };
        // The distribution's format is checked here, before the report prints ⌈log₂V⌉ or a figure sizes D.
        cfg.distribution_format().validate()?;
        if cfg.pairs.len() < 2 {
            return Err(FileError::new(
                "pairs",
                format!(
                    "paper B has two model pairs (Figs. 7 and 8), found {}",
                    cfg.pairs.len()
                ),
            ));
        }
        for (i, p) in cfg.pairs.iter().enumerate() {
            if p.tasks.is_empty() || p.tasks.len() != p.acceptance.len() {
                return Err(FileError::new(
                    format!("pairs[{i}].acceptance"),
                    format!("one rate per task is needed ({} tasks)", p.tasks.len()),
                ));
            }
            if let Some(a) = p.acceptance.iter().find(|a| !(**a > 0.0 && **a < 1.0)) {
                return Err(FileError::new(
                    format!("pairs[{i}].acceptance"),
                    format!("{a} is outside (0, 1)"),
                ));
            }
        }
        if cfg.fig9.ratios.len() < 2 {
            return Err(FileError::new(
                "fig9.ratios",
                "two ratios are needed (Figs. 9 and 10)",
            ));
        }
        if !(cfg.draft_scale_min > 0.0 && cfg.draft_scale_max >= cfg.draft_scale_min) {
            return Err(FileError::new(
                "draft_scale_max",
                "need 0 < draft_scale_min ≤ draft_scale_max",
            ));
        }
        Ok(cfg)
    }

    /// Sizes for a quick or paper-scale run.
    pub fn size(&self, quick: bool) -> Size {
        if quick { self.quick } else { self.paper }
    }
}
