//! Paper A's figures: Fig. 3 (theory vs Monte-Carlo goodput over L), Fig. 4 (Theorem 1's optimum vs T_ver, ϑ,
//! α), Fig. 6 (P2P / Cen / Multi-SPIN), Fig. 7 (schemes vs bandwidth), Fig. 8 (schemes vs K), plus the exact
//! planner against Algorithm 1 on small instances. Parameters come from `scenarios/paper-a.toml`.

use crate::config_file;
use crate::plot::{BarChart, LineChart, Series, bar_chart, line_chart};
use crate::report::{Ctx, Report};
use crate::table::{Cell, Table};
use anyhow::{Context, Result};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::Deserialize;
use spin_channel::paper_a::PaperAChannel;
use spin_channel::units::Conversion;
use spin_optimize::paper_a::bandwidth::lemma1_bandwidth;
use spin_optimize::paper_a::baselines::{CenParams, cen, p2p};
use spin_optimize::paper_a::brute::{BRUTE_FORCE_LIMIT, brute_force};
use spin_optimize::paper_a::exact::exact;
use spin_optimize::paper_a::heterogeneous::{Alg1Params, paper_alg1};
use spin_optimize::paper_a::homogeneous::{continuous_optimum, optimal_uniform_length};
use spin_optimize::paper_a::simulate::simulate_rounds;
use spin_optimize::paper_a::testing::random_scenario;
use spin_optimize::paper_a::{DeviceSpec, Plan, Scenario, ScenarioSpec};
use spin_optimize::round::{Scheme, plan_paper_a};
use std::collections::BTreeMap;
use std::path::PathBuf;

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
    mean_gain_lo: f64,
    mean_gain_hi: f64,
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
    fn cen(&self) -> CenParams {
        CenParams {
            server_draft_fixed_s: self.server_draft_fixed_s,
            server_draft_per_prompt_s: self.server_draft_per_prompt_s,
        }
    }
}

impl Config {
    /// Loads the file named by `MULTISPIN_PAPER_A_SCENARIO`, else `scenarios/paper-a.toml` of the workspace.
    pub fn load() -> Result<Self> {
        let path = std::env::var_os("MULTISPIN_PAPER_A_SCENARIO")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join("scenarios")
                    .join("paper-a.toml")
            });
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    /// Parses the file text: strict keys, unit pairs resolved to SI, the channel law checked.
    pub fn parse(text: &str) -> Result<Self> {
        let f: ConfigFile = config_file::parse_toml(text, RENAMED)?;
        let system = SystemCfg {
            devices: f.system.devices,
            bandwidth_hz: config_file::one_of(
                "system.",
                ("bandwidth_hz", f.system.bandwidth_hz),
                ("bandwidth_mhz", f.system.bandwidth_mhz),
                Conversion::MhzToHz,
            )?,
            max_draft_len: f.system.max_draft_len,
            retained_vocab: f.system.retained_vocab,
            prob_bits: f.system.prob_bits,
            fixed_draft_len: f.system.fixed_draft_len,
        };
        let channel = PaperAChannel {
            mean_gain_lo: f.channel.mean_gain_lo,
            mean_gain_hi: f.channel.mean_gain_hi,
            noise_w: config_file::one_of(
                "channel.",
                ("noise_w", f.channel.noise_w),
                ("noise_dbm", f.channel.noise_dbm),
                Conversion::DbmToW,
            )?,
            ul_power_w: config_file::one_of(
                "channel.",
                ("ul_power_w", f.channel.ul_power_w),
                ("ul_power_dbm", f.channel.ul_power_dbm),
                Conversion::DbmToW,
            )?,
        };
        channel.validate().map_err(|e| anyhow::anyhow!("channel.{e}"))?;
        let fig7_bandwidth_hz = config_file::one_of_list(
            "fig7.",
            ("bandwidth_hz", f.fig7.bandwidth_hz.as_deref()),
            ("bandwidth_mhz", f.fig7.bandwidth_mhz.as_deref()),
            Conversion::MhzToHz,
        )?;
        if let Some(b) = fig7_bandwidth_hz.iter().find(|b| !(b.is_finite() && **b > 0.0)) {
            anyhow::bail!("fig7.bandwidth_hz: {b} is not a finite positive bandwidth");
        }
        anyhow::ensure!(
            f.pairs.len() == 2,
            "pairs: expected two [[pairs]], found {}",
            f.pairs.len()
        );
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

    fn realisations(&self, ctx: &Ctx) -> usize {
        if ctx.quick {
            self.quick.realisations
        } else {
            self.sampling.realisations
        }
    }

    fn prompts(&self, ctx: &Ctx) -> usize {
        if ctx.quick {
            self.quick.prompts_per_device
        } else {
            self.sampling.prompts_per_device
        }
    }

    fn alg1(&self, ctx: &Ctx) -> Alg1Params {
        let (p, l) = if ctx.quick {
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

/// A seed for stream `parts` under the master seed (SplitMix64 mixing; order-sensitive).
fn seed_for(master: u64, parts: &[u64]) -> u64 {
    let mut x = master;
    for &p in parts {
        x = x.wrapping_add(p).wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
    }
    x
}

/// One realisation: device compute times and mean gains.
struct Realisation {
    draft_token_s: Vec<f64>,
    mean_gains: Vec<f64>,
}

fn draw_realisation<R: Rng>(
    rng: &mut R,
    cfg: &Config,
    pair: &PairCfg,
    devices: usize,
) -> Result<Realisation> {
    let (lo, hi) = (cfg.compute.draft_jitter_lo, cfg.compute.draft_jitter_hi);
    let draft_token_s = (0..devices)
        .map(|_| pair.draft_token_s * (lo + (hi - lo) * rng.random::<f64>()))
        .collect();
    let mean_gains = cfg.channel.draw_mean_gains(rng, devices)?;
    Ok(Realisation {
        draft_token_s,
        mean_gains,
    })
}

/// Every planning instance of one sweep point: realisations × prompts, each prompt drawing a dataset label per
/// device (uniformly, Table I's α) and one fading block.
fn instances(
    cfg: &Config,
    ctx: &Ctx,
    pair: &PairCfg,
    devices: usize,
    bandwidth_hz: f64,
    stream: u64,
) -> Result<Vec<ScenarioSpec>> {
    let alphas: Vec<f64> = pair.acceptance.values().copied().collect();
    let mut out = Vec::new();
    for r in 0..cfg.realisations(ctx) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[stream, devices as u64, r as u64]));
        let real = draw_realisation(&mut rng, cfg, pair, devices)?;
        for _ in 0..cfg.prompts(ctx) {
            let rates = cfg
                .channel
                .draw_spectral_efficiencies(&mut rng, &real.mean_gains)?;
            let devices = (0..devices)
                .map(|k| DeviceSpec {
                    acceptance: alphas[rng.random_range(0..alphas.len())],
                    draft_token_s: real.draft_token_s[k],
                    spectral_efficiency: rates[k].max(1e-9),
                })
                .collect();
            out.push(ScenarioSpec {
                bandwidth_hz,
                distribution_bits: cfg.bits_per_token(pair),
                verify_fixed_s: pair.verify_fixed_s,
                verify_per_device_s: pair.verify_per_device_s,
                max_draft_len: cfg.system.max_draft_len,
                min_draft_len: 1,
                devices,
            });
        }
    }
    Ok(out)
}

/// The Multi-SPIN schemes compared in Figs. 7 and 8, each with the paper's name for it (the column label).
const SCHEMES: [(Scheme, &str); 5] = [
    (Scheme::Fixed, "Fixed BW&L"),
    (Scheme::UniBw, "Uni-BW"),
    (Scheme::Homo, "Homo"),
    (Scheme::PaperAlg1, "Hete (Alg. 1)"),
    (Scheme::Exact, "Exact (ours)"),
];

/// Runs one scheme of [`SCHEMES`]: selected by the one scheme type, so a label can never pick a planner.
fn run_scheme(cfg: &Config, ctx: &Ctx, scheme: Scheme, s: &Scenario) -> Result<Plan> {
    Ok(plan_paper_a(
        scheme,
        s,
        cfg.system.fixed_draft_len,
        &cfg.alg1(ctx),
    )?)
}

/// Mean goodput of each scheme over the instances (parallel over instances, fixed-order reduction).
fn mean_goodputs(cfg: &Config, ctx: &Ctx, specs: &[ScenarioSpec]) -> Result<Vec<f64>> {
    let per: Vec<Vec<f64>> = specs
        .par_iter()
        .map(|spec| {
            let s = Scenario::new(spec)?;
            SCHEMES
                .iter()
                .map(|&(sch, _)| run_scheme(cfg, ctx, sch, &s).map(|p| p.goodput_tokens_per_s))
                .collect()
        })
        .collect::<Result<_>>()?;
    Ok((0..SCHEMES.len())
        .map(|j| per.iter().map(|v| v[j]).sum::<f64>() / per.len() as f64)
        .collect())
}

/// A plan with one common draft length and Lemma 1 bandwidth.
fn uniform_plan(s: &Scenario, draft_len: u32) -> std::result::Result<Plan, spin_optimize::OptimizeError> {
    let (_, bandwidth) = lemma1_bandwidth(s)?;
    Plan::evaluated(s, vec![draft_len; s.len()], bandwidth)
}

/// Fig. 3: goodput vs a common L (0..24) on GSM8K, theory (eq. 19 averaged over fading blocks) and empirical
/// (seeded Monte-Carlo rounds with Bernoulli acceptance), with Theorem 1's optimum per pair.
pub fn fig3(cfg: &Config, ctx: &Ctx) -> Result<(Table, Vec<(String, u32)>)> {
    let rounds = if ctx.quick {
        cfg.quick.fig3_rounds
    } else {
        cfg.sampling.fig3_rounds
    };
    let k = cfg.system.devices;
    let mut columns = vec!["draft_len"];
    let names: Vec<String> = cfg
        .pairs
        .iter()
        .flat_map(|p| {
            [
                format!("{}_theory_tok_per_s", p.name),
                format!("{}_empirical_tok_per_s", p.name),
            ]
        })
        .collect();
    columns.extend(names.iter().map(String::as_str));
    let mut table = Table::new(&columns);
    let mut optimum = Vec::new();
    let mut cols: Vec<Vec<f64>> = Vec::new();
    let bar = ctx.progress((cfg.pairs.len() * 25) as u64, "paper A fig 3 (Monte Carlo)");
    for (pi, pair) in cfg.pairs.iter().enumerate() {
        let alpha = pair
            .acceptance
            .get("GSM8K")
            .copied()
            .context("pair lacks a GSM8K acceptance rate")?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[3, pi as u64]));
        let real = draw_realisation(&mut rng, cfg, pair, k)?;
        let base = ScenarioSpec {
            bandwidth_hz: cfg.system.bandwidth_hz,
            distribution_bits: cfg.bits_per_token(pair),
            verify_fixed_s: pair.verify_fixed_s,
            verify_per_device_s: pair.verify_per_device_s,
            max_draft_len: 24,
            min_draft_len: 1,
            devices: real
                .draft_token_s
                .iter()
                .map(|&t| DeviceSpec {
                    acceptance: alpha,
                    draft_token_s: t,
                    spectral_efficiency: 1.0,
                })
                .collect(),
        };
        let verify = pair.verify_fixed_s + k as f64 * pair.verify_per_device_s;
        let results: Vec<(f64, f64)> = (0..=24u32)
            .into_par_iter()
            .map(|l| {
                let out = if l == 0 {
                    // No drafting: every device receives one token from the target model per verification pass.
                    let g = k as f64 / verify;
                    (g, g)
                } else {
                    let mut rng =
                        ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[3, pi as u64, u64::from(l)]));
                    let o = simulate_rounds(&mut rng, &base, &real.mean_gains, &cfg.channel, rounds, |s| {
                        uniform_plan(s, l)
                    })?;
                    (o.mean_formula_goodput, o.empirical_goodput)
                };
                bar.inc(1);
                Ok(out)
            })
            .collect::<Result<_>>()?;
        // Theorem 1 at the mean per-token latency ϑ over the first fading blocks of the simulation's law.
        let mut rng = ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[3, pi as u64, 999]));
        let mut theta = 0.0;
        let blocks = 200;
        for _ in 0..blocks {
            let mut spec = base.clone();
            for (d, r) in spec.devices.iter_mut().zip(
                cfg.channel
                    .draw_spectral_efficiencies(&mut rng, &real.mean_gains)?,
            ) {
                d.spectral_efficiency = r.max(1e-9);
            }
            theta += lemma1_bandwidth(&Scenario::new(&spec)?)?.0 / f64::from(blocks);
        }
        optimum.push((
            pair.name.clone(),
            optimal_uniform_length(alpha, verify, theta, 1, 24),
        ));
        cols.push(results.iter().map(|r| r.0).collect());
        cols.push(results.iter().map(|r| r.1).collect());
    }
    bar.finish_and_clear();
    for l in 0..=24usize {
        let mut row: Vec<Cell> = vec![(l as u32).into()];
        row.extend(cols.iter().map(|c| Cell::from(c[l])));
        table.push(row);
    }
    Ok((table, optimum))
}

/// Fig. 4: Theorem 1's optimal common L (continuous and integer) against T_ver, ϑ and α, one varied at a time
/// around T_ver = 277 ms (K = 20, Llama-2), ϑ = 40 ms, α = 0.739 (GSM8K).
pub fn fig4() -> Table {
    let mut table = Table::new(&["varied", "value", "continuous_opt_len", "integer_opt_len"]);
    let (t0, th0, a0) = (0.2771, 0.040, 0.739);
    let mut push = |name: &str, value: f64, t: f64, th: f64, a: f64| {
        let cont = continuous_optimum(a, t, th).unwrap_or(0.0);
        table.push(vec![
            name.into(),
            value.into(),
            cont.into(),
            optimal_uniform_length(a, t, th, 1, 25).into(),
        ]);
    };
    for i in 0..=12 {
        let t = 0.1 + 0.025 * f64::from(i);
        push("verify_s", t, t, th0, a0);
    }
    for i in 0..=12 {
        let th = 0.020 + 0.005 * f64::from(i);
        push("per_token_s", th, t0, th, a0);
    }
    for i in 0..=14 {
        let a = 0.6 + 0.025 * f64::from(i);
        push("acceptance", a, t0, th0, a);
    }
    table
}

/// Fig. 6: P2P-SPIN, Cen-SPIN, Multi-SPIN (Alg. 1) and the exact planner, per pair.
pub fn fig6(cfg: &Config, ctx: &Ctx) -> Result<Table> {
    let mut table = Table::new(&[
        "pair",
        "P2P-SPIN",
        "Cen-SPIN",
        "Multi-SPIN (Alg. 1)",
        "Multi-SPIN exact (ours)",
    ]);
    let bar = ctx.progress(
        (cfg.pairs.len() * cfg.realisations(ctx) * cfg.prompts(ctx)) as u64,
        "paper A fig 6",
    );
    for (pi, pair) in cfg.pairs.iter().enumerate() {
        let specs = instances(
            cfg,
            ctx,
            pair,
            cfg.system.devices,
            cfg.system.bandwidth_hz,
            60 + pi as u64,
        )?;
        let per: Vec<[f64; 4]> = specs
            .par_iter()
            .map(|spec| {
                let s = Scenario::new(spec)?;
                let row = [
                    p2p(&s).goodput_tokens_per_s,
                    cen(&s, &pair.cen())?.goodput_tokens_per_s,
                    paper_alg1(&s, &cfg.alg1(ctx))?.goodput_tokens_per_s,
                    exact(&s)?.goodput_tokens_per_s,
                ];
                bar.inc(1);
                Ok(row)
            })
            .collect::<Result<_>>()?;
        let mean = |j: usize| per.iter().map(|v| v[j]).sum::<f64>() / per.len() as f64;
        table.push(vec![
            pair.name.as_str().into(),
            mean(0).into(),
            mean(1).into(),
            mean(2).into(),
            mean(3).into(),
        ]);
    }
    bar.finish_and_clear();
    Ok(table)
}

/// Figs. 7 and 8: every scheme over a sweep of bandwidth (MHz) or device count.
fn sweep(cfg: &Config, ctx: &Ctx, by_devices: bool) -> Result<Table> {
    let xs: Vec<f64> = if by_devices {
        cfg.fig8_devices.iter().map(|&k| k as f64).collect()
    } else {
        cfg.fig7_bandwidth_hz.iter().map(|&b| b / 1e6).collect()
    };
    let mut columns = vec!["pair", if by_devices { "devices" } else { "bandwidth_mhz" }];
    columns.extend(SCHEMES.map(|(_, label)| label));
    let mut table = Table::new(&columns);
    let bar = ctx.progress(
        (xs.len() * cfg.pairs.len()) as u64,
        if by_devices {
            "paper A fig 8"
        } else {
            "paper A fig 7"
        },
    );
    for (pi, pair) in cfg.pairs.iter().enumerate() {
        for (i, &x) in xs.iter().enumerate() {
            let (k, b) = if by_devices {
                (cfg.fig8_devices[i], cfg.system.bandwidth_hz)
            } else {
                (cfg.system.devices, cfg.fig7_bandwidth_hz[i])
            };
            let stream = if by_devices { 80 } else { 70 } + pi as u64;
            let specs = instances(cfg, ctx, pair, k, b, stream)?;
            let means = mean_goodputs(cfg, ctx, &specs)?;
            let mut row: Vec<Cell> = vec![pair.name.as_str().into(), x.into()];
            row.extend(means.into_iter().map(Cell::from));
            table.push(row);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(table)
}

/// Fig. 7: schemes against the bandwidth budget.
pub fn fig7(cfg: &Config, ctx: &Ctx) -> Result<Table> {
    sweep(cfg, ctx, false)
}

/// Fig. 8: schemes against the number of devices.
pub fn fig8(cfg: &Config, ctx: &Ctx) -> Result<Table> {
    sweep(cfg, ctx, true)
}

/// Beyond the paper: Algorithm 1 against the exact optimum (= brute force) on random small instances.
pub fn alg1_gap(cfg: &Config, ctx: &Ctx) -> Result<Table> {
    let count: usize = if ctx.quick { 40 } else { 400 };
    let mut table = Table::new(&[
        "devices",
        "instances",
        "alg1_below_optimum",
        "mean_gap_pct",
        "max_gap_pct",
    ]);
    let bar = ctx.progress(3 * count as u64, "paper A alg1 gap");
    for k in [2usize, 3, 4] {
        let gaps: Vec<f64> = (0..count)
            .into_par_iter()
            .map(|i| {
                let mut rng = ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[90, k as u64, i as u64]));
                let s = random_scenario(&mut rng, k, 10);
                let best = brute_force(&s, BRUTE_FORCE_LIMIT)?.goodput_tokens_per_s;
                let ex = exact(&s)?.goodput_tokens_per_s;
                anyhow::ensure!(
                    (best - ex).abs() <= 1e-9 * best,
                    "exact planner differs from brute force"
                );
                let gap = (best - paper_alg1(&s, &cfg.alg1(ctx))?.goodput_tokens_per_s) / best * 100.0;
                bar.inc(1);
                Ok(gap)
            })
            .collect::<Result<_>>()?;
        let below = gaps.iter().filter(|&&g| g > 1e-9).count();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let max = gaps.iter().copied().fold(0.0, f64::max);
        table.push(vec![
            k.into(),
            count.into(),
            below.into(),
            mean.into(),
            max.into(),
        ]);
    }
    bar.finish_and_clear();
    Ok(table)
}

fn series_from(table: &Table, x_col: usize, y_cols: &[usize], filter: Option<(usize, &str)>) -> Vec<Series> {
    let num = |c: &Cell| if let Cell::Num(v) = c { *v } else { f64::NAN };
    y_cols
        .iter()
        .map(|&j| Series {
            label: table.columns[j].clone(),
            points: table
                .rows
                .iter()
                .filter(|r| filter.is_none_or(|(c, v)| matches!(&r[c], Cell::Text(t) if t == v)))
                .map(|r| (num(&r[x_col]), num(&r[j])))
                .collect(),
        })
        .collect()
}

fn value(table: &Table, row: usize, col: usize) -> f64 {
    match &table.rows[row][col] {
        Cell::Num(v) => *v,
        Cell::Text(_) => f64::NAN,
    }
}

/// Regenerates paper A's figures as CSV + SVG and adds one report section per figure.
pub fn reproduce(ctx: &Ctx, report: &mut Report) -> Result<()> {
    let cfg = Config::load()?;
    let names: Vec<String> = cfg.pairs.iter().map(|p| p.name.clone()).collect();

    let (t3, opt) = ctx.timed("paper A fig 3", || fig3(&cfg, ctx))?;
    t3.write_csv(&ctx.path("paper_a_fig3.csv"))?;
    let series = series_from(&t3, 0, &(1..t3.columns.len()).collect::<Vec<_>>(), None);
    line_chart(
        &ctx.path("paper_a_fig3.svg"),
        &LineChart {
            title: "Paper A Fig. 3: goodput vs draft length (GSM8K)",
            x_label: "draft length L",
            y_label: "goodput (tokens/s)",
            series: &series,
        },
    )?;
    let argmax = |col: usize| {
        (0..t3.rows.len())
            .max_by(|&a, &b| value(&t3, a, col).total_cmp(&value(&t3, b, col)))
            .unwrap_or(0)
    };
    let mut body = format!(
        "Common draft length with Lemma 1 bandwidth, K = {}, every device on GSM8K. *Theory* is eq. 19 averaged over \
         fading blocks; *empirical* is a seeded Monte-Carlo run ({} rounds per L, Bernoulli acceptance, fresh Rayleigh \
         fading each round) measured as total tokens / total time.\n\n",
        cfg.system.devices,
        if ctx.quick {
            cfg.quick.fig3_rounds
        } else {
            cfg.sampling.fig3_rounds
        }
    );
    for (i, (name, l_star)) in opt.iter().enumerate() {
        let (ct, ce) = (1 + 2 * i, 2 + 2 * i);
        body.push_str(&format!(
            "- {name}: theory peaks at L = {} ({:.1} tok/s), empirical at L = {} ({:.1} tok/s); Theorem 1 at the mean ϑ gives L* = {l_star}.\n",
            argmax(ct), value(&t3, argmax(ct), ct), argmax(ce), value(&t3, argmax(ce), ce)
        ));
    }
    body.push_str(
        "\nPaper: Llama-2 peaks near 130–140 tok/s and Qwen3.5 near 200 tok/s with the derived optimum on the peak. \
         Our curves show the same unimodal shape and the optimum on the peak. The empirical rate sits slightly below \
         the averaged formula because a ratio of sums weights slow (deep-fade) rounds more than a mean of ratios; \
         the absolute level depends on the unstated device latency and transmit power (scenarios/paper-a.toml).\n\n",
    );
    body.push_str(&t3.to_markdown(4));
    report.section("Paper A, Fig. 3: theory vs simulation", body);

    let t4 = ctx.timed("paper A fig 4", fig4);
    t4.write_csv(&ctx.path("paper_a_fig4.csv"))?;
    for (varied, label) in [
        ("verify_s", "verification latency T_ver (s)"),
        ("per_token_s", "per-token latency ϑ (s)"),
        ("acceptance", "acceptance rate α"),
    ] {
        let s = series_from(&t4, 1, &[2, 3], Some((0, varied)));
        line_chart(
            &ctx.path(&format!("paper_a_fig4_{varied}.svg")),
            &LineChart {
                title: "Paper A Fig. 4: Theorem 1 optimum",
                x_label: label,
                y_label: "optimal draft length",
                series: &s,
            },
        )?;
    }
    report.section(
        "Paper A, Fig. 4: optimal common draft length",
        format!(
            "Theorem 1 (eq. 24, lower Lambert-W branch) around T_ver = 277 ms, ϑ = 40 ms, α = 0.739. As in the paper, \
             the optimum grows with T_ver, falls with ϑ and grows quickly as α → 1 (paper: 2–7 over T_ver 100–400 ms, \
             7→2 over ϑ 20–80 ms, 4→14 over α 0.6–0.95; the paper's fixed values are not printed, so the levels differ \
             slightly while the trends match).\n\n{}",
            t4.to_markdown(4)
        ),
    );

    let t6 = ctx.timed("paper A fig 6", || fig6(&cfg, ctx))?;
    t6.write_csv(&ctx.path("paper_a_fig6.csv"))?;
    let categories: Vec<String> = names.clone();
    let groups: Vec<(String, Vec<f64>)> = (1..t6.columns.len())
        .map(|j| {
            (
                t6.columns[j].clone(),
                (0..t6.rows.len()).map(|r| value(&t6, r, j)).collect(),
            )
        })
        .collect();
    bar_chart(
        &ctx.path("paper_a_fig6.svg"),
        &BarChart {
            title: "Paper A Fig. 6: protocols",
            y_label: "goodput (tokens/s)",
            categories: &categories,
            groups: &groups,
        },
    )?;
    let mut body = String::from(
        "K = 20, B = 10 MHz, mean over realisations × prompts.\n\n| pair | ours: Multi-SPIN | paper | ours: × Cen-SPIN | paper | ours: × P2P | paper | exact / Alg. 1 |\n|---|---|---|---|---|---|---|---|\n",
    );
    let paper = [("≈145", "≈2.5×", "≈4.6×"), ("≈153", "≈3×", "—")];
    for (r, name) in names.iter().enumerate().take(t6.rows.len()) {
        let (p2, cn, m, ex) = (
            value(&t6, r, 1),
            value(&t6, r, 2),
            value(&t6, r, 3),
            value(&t6, r, 4),
        );
        let (pm, pc, pp) = paper.get(r).copied().unwrap_or(("—", "—", "—"));
        body.push_str(&format!(
            "| {} | {m:.1} | {pm} | {:.2}× | {pc} | {:.2}× | {pp} | {:.4} |\n",
            name,
            m / cn,
            m / p2,
            ex / m
        ));
    }
    body.push_str(
        "\nThe Multi-SPIN level and the P2P ratio follow from the chosen device latency and transmit power; the \
         Cen-SPIN ratio follows from the chosen server drafting cost (unbatched drafting). All three are ⟨C⟩ \
         choices documented in scenarios/paper-a.toml, calibrated on the Llama-2 pair only; the Qwen3.5 numbers are \
         then predictions. The exact planner's gain over Algorithm 1 is small at this scale because rounding errors \
         average out over 20 devices.\n\n",
    );
    body.push_str(&t6.to_markdown(4));
    report.section("Paper A, Fig. 6: P2P-SPIN, Cen-SPIN and Multi-SPIN", body);

    for (fig, table, x_label, file, paper_note) in [
        (
            "7",
            ctx.timed("paper A fig 7", || fig7(&cfg, ctx))?,
            "bandwidth budget (MHz)",
            "paper_a_fig7",
            "Paper: Hete beats Fixed BW&L by ≈88% at 5 MHz for both pairs, the gap narrows with B, Uni-BW lies above Homo.",
        ),
        (
            "8",
            ctx.timed("paper A fig 8", || fig8(&cfg, ctx))?,
            "number of devices K",
            "paper_a_fig8",
            "Paper: Hete's gain over Fixed BW&L grows from ≈21% (small K) to ≈67% at K = 24 for Llama-2 and from ≈29% to >80% for Qwen3.5.",
        ),
    ] {
        table.write_csv(&ctx.path(&format!("{file}.csv")))?;
        for name in &names {
            let s = series_from(
                &table,
                1,
                &(2..table.columns.len()).collect::<Vec<_>>(),
                Some((0, name)),
            );
            line_chart(
                &ctx.path(&format!("{file}_{}.svg", name.replace('.', "_"))),
                &LineChart {
                    title: &format!("Paper A Fig. {fig}: {name}"),
                    x_label,
                    y_label: "goodput (tokens/s)",
                    series: &s,
                },
            )?;
        }
        let mut body = format!(
            "{paper_note}\n\nOurs (gain of Hete (Alg. 1) and of the exact planner over Fixed BW&L):\n\n"
        );
        for (r, row) in table.rows.iter().enumerate() {
            let name = match &row[0] {
                Cell::Text(t) => t.clone(),
                Cell::Num(_) => String::new(),
            };
            let (fx, hete, ex) = (value(&table, r, 2), value(&table, r, 5), value(&table, r, 6));
            body.push_str(&format!(
                "- {name}, x = {}: Hete +{:.1}%, exact +{:.1}%, Uni-BW {} Homo\n",
                value(&table, r, 1),
                (hete / fx - 1.0) * 100.0,
                (ex / fx - 1.0) * 100.0,
                if value(&table, r, 3) >= value(&table, r, 4) {
                    "≥"
                } else {
                    "<"
                }
            ));
        }
        body.push_str(
            "\nDifferences from the paper come from the unstated device latency, transmit power and Algorithm 1 grid; \
             the ordering of the schemes and the trend of the gap are the reproducible findings.\n\n",
        );
        body.push_str(&table.to_markdown(4));
        report.section(&format!("Paper A, Fig. {fig}: control schemes"), body);
    }

    let tg = ctx.timed("paper A alg1 gap", || alg1_gap(&cfg, ctx))?;
    tg.write_csv(&ctx.path("paper_a_alg1_gap.csv"))?;
    report.section(
        "Paper A, beyond the paper: Algorithm 1 vs the exact optimum",
        format!(
            "Random small instances (L_max = 10, wide parameter ranges), where brute force is feasible; the exact \
             planner matched brute force on every instance. Rounding Proposition 1's continuous optimum is not always \
             the integer optimum:\n\n{}",
            tg.to_markdown(4)
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> (Config, Ctx) {
        let ctx = Ctx {
            out_dir: std::env::temp_dir(),
            quick: true,
            seed: 2026,
        };
        (Config::load().unwrap(), ctx)
    }

    /// The reproduction configs are as strict as the scenario files: a misspelt key is an error naming its path,
    /// not a silently ignored line (issue 13).
    #[test]
    fn misspelt_config_keys_are_refused_by_name() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper-a.toml");
        let text = std::fs::read_to_string(path).unwrap();
        assert!(Config::parse(&text).is_ok());
        let bad = text.replacen("bandwidth_hz =", "bandwith_hz =", 1);
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(
            err.starts_with("system.bandwith_hz: unknown field `bandwith_hz`"),
            "{err}"
        );
        let bad = text.replacen("fig3_rounds = 4000", "fig3_rounds = \"many\"", 1);
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(err.starts_with("sampling.fig3_rounds: invalid type"), "{err}");
        let b = std::fs::read_to_string(crate::paper_b::config::Config::default_path()).unwrap();
        assert!(crate::paper_b::config::Config::parse(&b).is_ok());
        let bad_b = format!("unknown_key = 1\n{b}");
        let err = crate::paper_b::config::Config::parse(&bad_b)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown_key"), "{err}");
    }

    /// The unit pairs of the scenario files: the engineering unit gives the same SI config; both or neither is an
    /// error naming the pair; keys of the older layout name their replacement.
    #[test]
    fn config_units_follow_the_scenario_rules() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scenarios/paper-a.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let si = Config::parse(&text).unwrap();
        let eng = text
            .replacen("bandwidth_hz = 1.0e7", "bandwidth_mhz = 10", 1)
            .replacen("noise_w = 1.0e-10", "noise_dbm = -70", 1)
            .replacen(
                "bandwidth_mhz = [5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0]",
                "bandwidth_hz = [5e6, 7.5e6, 10e6, 12.5e6, 15e6, 17.5e6, 20e6]",
                1,
            );
        let eng = Config::parse(&eng).unwrap();
        assert_eq!(eng.system.bandwidth_hz, si.system.bandwidth_hz);
        assert!((eng.channel.noise_w / si.channel.noise_w - 1.0).abs() < 1e-12);
        assert_eq!(eng.fig7_bandwidth_hz, si.fig7_bandwidth_hz);
        let both = text.replacen(
            "bandwidth_hz = 1.0e7",
            "bandwidth_hz = 1.0e7\nbandwidth_mhz = 10",
            1,
        );
        let err = format!("{:#}", Config::parse(&both).unwrap_err());
        assert!(
            err.starts_with("system.bandwidth_hz, system.bandwidth_mhz: give exactly one of the pair"),
            "{err}"
        );
        let neither = text.replacen("ul_power_w = 2.0e-8", "", 1);
        let err = format!("{:#}", Config::parse(&neither).unwrap_err());
        assert!(
            err.starts_with("channel.ul_power_w, channel.ul_power_dbm: missing"),
            "{err}"
        );
        let old = text.replacen("ul_power_w = 2.0e-8", "power_w = 2.0e-8", 1);
        let err = format!("{:#}", Config::parse(&old).unwrap_err());
        assert!(
            err.starts_with("channel.power_w: renamed to channel.ul_power_w"),
            "{err}"
        );
        // A key inside the array of pairs: the second pair carries the old name.
        let at = text
            .rfind("verify_per_device_s")
            .expect("the config names verify_per_device_s");
        let old = format!(
            "{}verify_per_draft_s{}",
            &text[..at],
            &text[at + "verify_per_device_s".len()..]
        );
        let err = format!("{:#}", Config::parse(&old).unwrap_err());
        assert!(
            err.starts_with("pairs[].verify_per_draft_s: renamed to pairs[].verify_per_device_s"),
            "{err}"
        );
        let bad = text.replacen("bandwidth_mhz = [5.0,", "bandwidth_mhz = [1e308,", 1);
        let err = format!("{:#}", Config::parse(&bad).unwrap_err());
        assert!(
            err.starts_with("fig7.bandwidth_mhz[0]: 1e308 converts to inf"),
            "{err}"
        );
    }

    #[test]
    fn paper_a_fig3_quick() {
        let (cfg, ctx) = quick();
        let (t, opt) = fig3(&cfg, &ctx).unwrap();
        insta::assert_snapshot!("paper_a_fig3", format!("{opt:?}\n{}", t.render(4)));
    }

    #[test]
    fn paper_a_fig4() {
        insta::assert_snapshot!("paper_a_fig4", super::fig4().render(4));
    }

    #[test]
    fn paper_a_fig6_quick() {
        let (cfg, ctx) = quick();
        insta::assert_snapshot!("paper_a_fig6", fig6(&cfg, &ctx).unwrap().render(4));
    }

    #[test]
    fn paper_a_fig7_and_fig8_quick() {
        let (mut cfg, ctx) = quick();
        // Debug-build budget: a smaller system than the paper's K = 20 keeps this test to seconds.
        cfg.system.devices = 8;
        cfg.fig7_bandwidth_hz = vec![5e6, 20e6];
        cfg.fig8_devices = vec![4, 8];
        insta::assert_snapshot!("paper_a_fig7", fig7(&cfg, &ctx).unwrap().render(4));
        insta::assert_snapshot!("paper_a_fig8", fig8(&cfg, &ctx).unwrap().render(4));
    }

    #[test]
    fn q_tok_matches_the_paper() {
        let (cfg, _) = quick();
        assert_eq!(cfg.bits_per_token(&cfg.pairs[0]), 31744.0);
        assert_eq!(cfg.bits_per_token(&cfg.pairs[1]), 34816.0);
    }
}
