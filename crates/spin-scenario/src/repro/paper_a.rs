//! `scenarios/paper-a.toml`: paper A's reproduction parameters (system, channel law, compute jitter, sample counts,
//! the sweeps of Figs. 7 and 8, the two model pairs), resolved to SI units.

use super::parse_toml;
use crate::FileError;
use crate::pair::{bandwidth_hz, one_of, one_of_list};
use serde::Deserialize;
use spin_channel::paper_a::PaperAChannel;
use spin_channel::units::Conversion;
use spin_optimize::paper_a::baselines::CenParams;
use spin_optimize::paper_a::heterogeneous::Alg1Params;
use std::collections::BTreeMap;

/// `scenarios/paper-a.toml`, resolved to SI units.
#[derive(Debug, Clone)]
pub struct Config {
    /// System constants.
    pub system: SystemCfg,
    /// Channel law.
    pub channel: PaperAChannel,
    /// Device compute jitter.
    pub compute: ComputeCfg,
    /// Paper-scale sample counts.
    pub sampling: SamplingCfg,
    /// Fig. 7's bandwidth axis in Hz.
    pub fig7_bandwidth_hz: Vec<f64>,
    /// Fig. 8's device-count axis.
    pub fig8_devices: Vec<usize>,
    /// Quick-configuration overrides.
    pub quick: QuickCfg,
    /// The two model pairs.
    pub pairs: Vec<PairCfg>,
}

/// The file as written: quantities in either unit of a pair.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    system: SystemFile,
    channel: ChannelFile,
    compute: ComputeCfg,
    sampling: SamplingCfg,
    fig7: Fig7File,
    fig8: Fig8File,
    quick: QuickCfg,
    pairs: Vec<PairCfg>,
}

/// `[system]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SystemFile {
    devices: usize,
    bandwidth_hz: Option<f64>,
    bandwidth_mhz: Option<f64>,
    max_draft_len: u32,
    retained_vocab: u32,
    prob_bits: u32,
    fixed_draft_len: u32,
}

/// `[channel]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChannelFile {
    mean_gain_lo: Option<f64>,
    mean_gain_lo_db: Option<f64>,
    mean_gain_hi: Option<f64>,
    mean_gain_hi_db: Option<f64>,
    noise_w: Option<f64>,
    noise_dbm: Option<f64>,
    ul_power_w: Option<f64>,
    ul_power_dbm: Option<f64>,
}

/// `[fig7]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig7File {
    bandwidth_hz: Option<Vec<f64>>,
    bandwidth_mhz: Option<Vec<f64>>,
}

/// `[fig8]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fig8File {
    devices: Vec<usize>,
}

/// `[system]`.
#[derive(Debug, Clone)]
pub struct SystemCfg {
    /// K.
    pub devices: usize,
    /// B in Hz.
    pub bandwidth_hz: f64,
    /// L_max.
    pub max_draft_len: u32,
    /// |V̂|.
    pub retained_vocab: u32,
    /// Q_B.
    pub prob_bits: u32,
    /// Fixed BW&L's L̄.
    pub fixed_draft_len: u32,
}

/// `[compute]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeCfg {
    /// Lower jitter factor of T_k^S.
    pub draft_jitter_lo: f64,
    /// Upper jitter factor.
    pub draft_jitter_hi: f64,
}

/// `[sampling]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingCfg {
    /// Channel/compute realisations.
    pub realisations: usize,
    /// Prompts per device per realisation.
    pub prompts_per_device: usize,
    /// Monte-Carlo rounds per L in Fig. 3.
    pub fig3_rounds: usize,
    /// |Φ|.
    pub alg1_phi_points: usize,
    /// |Λ|.
    pub alg1_lambda_points: usize,
    /// ε_λ / λ_hi.
    pub alg1_lambda_lo_ratio: f64,
}

/// `[quick]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuickCfg {
    /// Realisations in quick mode.
    pub realisations: usize,
    /// Prompts per device in quick mode.
    pub prompts_per_device: usize,
    /// Fig. 3 rounds in quick mode.
    pub fig3_rounds: usize,
    /// |Φ| in quick mode.
    pub alg1_phi_points: usize,
    /// |Λ| in quick mode.
    pub alg1_lambda_points: usize,
}

/// `[[pairs]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairCfg {
    /// Display name.
    pub name: String,
    /// Vocabulary size V.
    pub vocab: u32,
    /// T_fix.
    pub verify_fixed_s: f64,
    /// T_lin.
    pub verify_per_device_s: f64,
    /// T̄^S.
    pub draft_token_s: f64,
    /// Cen-SPIN drafting: fixed part per step.
    pub server_draft_fixed_s: f64,
    /// Cen-SPIN drafting: per prompt per step.
    pub server_draft_per_prompt_s: f64,
    /// Table I acceptance rate per dataset.
    pub acceptance: BTreeMap<String, f64>,
}

/// Keys of the layout before the scenario-file names, with what replaced them.
const RENAMED: &[(&str, &str)] = &[
    (
        "sampling.bandwidths_mhz",
        "fig7.bandwidth_mhz (or fig7.bandwidth_hz)",
    ),
    ("sampling.device_counts", "fig8.devices"),
    ("channel.power_w", "channel.ul_power_w (or channel.ul_power_dbm)"),
    ("pairs[].verify_per_draft_s", "pairs[].verify_per_device_s"),
];

impl PairCfg {
    /// Cen-SPIN's server drafting costs.
    pub fn cen(&self) -> CenParams {
        CenParams {
            server_draft_fixed_s: self.server_draft_fixed_s,
            server_draft_per_prompt_s: self.server_draft_per_prompt_s,
        }
    }
}

impl Config {
    /// Parses the file text: strict keys, unit pairs resolved to SI, the channel law checked.
    pub fn parse(text: &str) -> Result<Config, FileError> {
        let f: ConfigFile = parse_toml(text, RENAMED)?;
        let system = SystemCfg {
            devices: f.system.devices,
            bandwidth_hz: bandwidth_hz("system.", f.system.bandwidth_hz, f.system.bandwidth_mhz)?,
            max_draft_len: f.system.max_draft_len,
            retained_vocab: f.system.retained_vocab,
            prob_bits: f.system.prob_bits,
            fixed_draft_len: f.system.fixed_draft_len,
        };
        let channel = PaperAChannel {
            mean_gain_lo: one_of(
                "channel.",
                ("mean_gain_lo", f.channel.mean_gain_lo),
                ("mean_gain_lo_db", f.channel.mean_gain_lo_db),
                Conversion::DbToLinear,
            )?,
            mean_gain_hi: one_of(
                "channel.",
                ("mean_gain_hi", f.channel.mean_gain_hi),
                ("mean_gain_hi_db", f.channel.mean_gain_hi_db),
                Conversion::DbToLinear,
            )?,
            noise_w: one_of(
                "channel.",
                ("noise_w", f.channel.noise_w),
                ("noise_dbm", f.channel.noise_dbm),
                Conversion::DbmToW,
            )?,
            ul_power_w: one_of(
                "channel.",
                ("ul_power_w", f.channel.ul_power_w),
                ("ul_power_dbm", f.channel.ul_power_dbm),
                Conversion::DbmToW,
            )?,
        };
        channel
            .validate()
            .map_err(|e| FileError::named(e).within("channel."))?;
        let fig7_bandwidth_hz = one_of_list(
            "fig7.",
            ("bandwidth_hz", f.fig7.bandwidth_hz.as_deref()),
            ("bandwidth_mhz", f.fig7.bandwidth_mhz.as_deref()),
            Conversion::MhzToHz,
        )?;
        if let Some(b) = fig7_bandwidth_hz.iter().find(|b| !(b.is_finite() && **b > 0.0)) {
            return Err(FileError::new(
                "fig7.bandwidth_hz",
                format!("{b} is not a finite positive bandwidth"),
            ));
        }
        if f.pairs.len() != 2 {
            return Err(FileError::new(
                "pairs",
                format!("expected two [[pairs]], found {}", f.pairs.len()),
            ));
        }
        Ok(Config {
            system,
            channel,
            compute: f.compute,
            sampling: f.sampling,
            fig7_bandwidth_hz,
            fig8_devices: f.fig8.devices,
            quick: f.quick,
            pairs: f.pairs,
        })
    }

    /// Q_tok = |V̂|(Q_B + ⌈log₂V⌉) in bits (paper A, eq. 9).
    pub fn bits_per_token(&self, pair: &PairCfg) -> f64 {
        let index_bits = 32 - (pair.vocab - 1).leading_zeros();
        f64::from(self.system.retained_vocab * (self.system.prob_bits + index_bits))
    }

    /// Channel/compute realisations of a quick or paper-scale run.
    pub fn realisations_for(&self, quick: bool) -> usize {
        if quick {
            self.quick.realisations
        } else {
            self.sampling.realisations
        }
    }

    /// Prompts per device of a quick or paper-scale run.
    pub fn prompts_for(&self, quick: bool) -> usize {
        if quick {
            self.quick.prompts_per_device
        } else {
            self.sampling.prompts_per_device
        }
    }

    /// Algorithm 1's grid of a quick or paper-scale run.
    pub fn alg1_for(&self, quick: bool) -> Alg1Params {
        let (p, l) = if quick {
            (self.quick.alg1_phi_points, self.quick.alg1_lambda_points)
        } else {
            (self.sampling.alg1_phi_points, self.sampling.alg1_lambda_points)
        };
        Alg1Params {
            phi_points: p,
            lambda_points: l,
            lambda_lo_ratio: self.sampling.alg1_lambda_lo_ratio,
        }
    }
}
