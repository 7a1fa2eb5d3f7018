//! Paper B reproduction parameters, read from `scenarios/paper-b.toml` (or the file named by an environment variable).

use anyhow::{Context, bail};
use serde::Deserialize;
use std::path::PathBuf;

/// Environment variable naming an alternative parameter file (e.g. with measured acceptance rates).
pub const CONFIG_ENV: &str = "MULTISPIN_PAPER_B_CONFIG";

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

/// Fig. 6 budgets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig6 {
    /// P_dl in dBm.
    pub dl_dbm: f64,
    /// P_ul in dBm.
    pub ul_dbm: f64,
}

/// Figs. 7–8 sweep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig7 {
    /// Fixed P_ul in dBm ⟨C⟩.
    pub ul_dbm: f64,
    /// P_dl points in dBm.
    pub dl_dbm: Vec<f64>,
    /// P_dl points of the quick run.
    pub quick_dl_dbm: Vec<f64>,
}

/// Figs. 9–10 sweep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig9 {
    /// P_dl/P_ul of Fig. 9 and Fig. 10.
    pub ratios: Vec<f64>,
    /// K points.
    pub devices: Vec<usize>,
    /// K points of the quick run.
    pub quick_devices: Vec<usize>,
}

/// Fig. 11 sweep.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fig11 {
    /// P_dl/P_ul points.
    pub ratios: Vec<f64>,
    /// Points of the quick run.
    pub quick_ratios: Vec<f64>,
}

/// The whole parameter file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// V_eff.
    pub effective_support: u32,
    /// V.
    pub vocabulary: u32,
    /// Q.
    pub quant_bits: u32,
    /// N0_ser in dBm/Hz.
    pub noise_psd_server_dbm_per_hz: f64,
    /// N0_dev in dBm/Hz.
    pub noise_psd_device_dbm_per_hz: f64,
    /// γ_max.
    pub max_draft_len: u32,
    /// K of Figs. 7, 8, 11 and Fig. 6's rejected set.
    pub devices: usize,
    /// Lower drafting-latency scale.
    pub draft_scale_min: f64,
    /// Upper drafting-latency scale.
    pub draft_scale_max: f64,
    /// P̄_dl in dBm.
    pub reference_dl_dbm: f64,
    /// P̄_ul in dBm.
    pub reference_ul_dbm: f64,
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

impl Config {
    /// The committed parameter file.
    pub fn default_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("scenarios")
            .join("paper-b.toml")
    }

    /// Reads the file named by [`CONFIG_ENV`], else the committed one.
    pub fn load() -> anyhow::Result<(Config, PathBuf)> {
        let path = std::env::var_os(CONFIG_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(Self::default_path);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let cfg = Self::parse(&text).with_context(|| format!("in {}", path.display()))?;
        Ok((cfg, path))
    }

    /// Parses and checks the structure (the numeric domains are checked by the scenario constructors).
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        let cfg: Config = toml::from_str(text)?;
        if cfg.pairs.len() < 2 {
            bail!(
                "pairs: paper B has two model pairs (Figs. 7 and 8), found {}",
                cfg.pairs.len()
            );
        }
        for (i, p) in cfg.pairs.iter().enumerate() {
            if p.tasks.is_empty() || p.tasks.len() != p.acceptance.len() {
                bail!(
                    "pairs[{i}].acceptance: one rate per task is needed ({} tasks)",
                    p.tasks.len()
                );
            }
            if let Some(a) = p.acceptance.iter().find(|a| !(**a > 0.0 && **a < 1.0)) {
                bail!("pairs[{i}].acceptance: {a} is outside (0, 1)");
            }
        }
        if cfg.fig9.ratios.len() < 2 {
            bail!("fig9.ratios: two ratios are needed (Figs. 9 and 10)");
        }
        if !(cfg.draft_scale_min > 0.0 && cfg.draft_scale_max >= cfg.draft_scale_min) {
            bail!("draft_scale_max: need 0 < draft_scale_min ≤ draft_scale_max");
        }
        Ok(cfg)
    }

    /// Sizes for a quick or paper-scale run.
    pub fn size(&self, quick: bool) -> Size {
        if quick { self.quick } else { self.paper }
    }
}
