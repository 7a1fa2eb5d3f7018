//! Paper A's figures: Fig. 3 (theory vs Monte-Carlo goodput over L), Fig. 4 (Theorem 1's optimum vs T_ver, ϑ,
//! α), Fig. 6 (P2P / Cen / Multi-SPIN), Fig. 7 (schemes vs bandwidth), Fig. 8 (schemes vs K), plus the exact
//! planner against Algorithm 1 on small instances. Parameters come from `scenarios/paper-a.toml`.

use crate::plot::{Axis, BarFigure, Figure, Join, Marker, Series, label};
use crate::report::Ctx;
use crate::stats;
use crate::table::{Cell, Table};
use anyhow::{Context, Result};
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use spin_optimize::paper_a::bandwidth::lemma1_bandwidth;
use spin_optimize::paper_a::baselines::{cen, p2p};
use spin_optimize::paper_a::heterogeneous::Alg1Params;
use spin_optimize::paper_a::homogeneous::{continuous_optimum, optimal_uniform_length};
use spin_optimize::paper_a::simulate::simulate_rounds;
use spin_optimize::paper_a::testing::random_scenario;
use spin_optimize::paper_a::{DeviceSpec, Plan, Scenario, ScenarioSpec};
use spin_optimize::round::{Scheme, plan_paper_a};
use std::path::PathBuf;

pub use spin_scenario::repro::paper_a::{Config, PairCfg};

/// Reading `scenarios/paper-a.toml` (or the file of `MULTISPIN_PAPER_A_SCENARIO`) and choosing the sizes of a
/// quick or paper-scale run; the format itself is `spin_scenario::repro::paper_a`.
pub(crate) trait ConfigRun: Sized {
    /// Loads the file named by `MULTISPIN_PAPER_A_SCENARIO`, else `scenarios/paper-a.toml` of the workspace.
    fn load() -> Result<Self>;
    /// Channel/compute realisations of this run.
    fn realisations(&self, ctx: &Ctx) -> usize;
    /// Prompts per device of this run.
    fn prompts(&self, ctx: &Ctx) -> usize;
    /// Algorithm 1's grid of this run.
    fn alg1(&self, ctx: &Ctx) -> Alg1Params;
}

impl ConfigRun for Config {
    fn load() -> Result<Self> {
        let path = std::env::var_os("MULTISPIN_PAPER_A_SCENARIO")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join("scenarios")
                    .join("paper-a.toml")
            });
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        Config::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    fn realisations(&self, ctx: &Ctx) -> usize {
        self.realisations_for(ctx.quick)
    }

    fn prompts(&self, ctx: &Ctx) -> usize {
        self.prompts_for(ctx.quick)
    }

    fn alg1(&self, ctx: &Ctx) -> Alg1Params {
        self.alg1_for(ctx.quick)
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

/// Mean goodput of each scheme over the instances (parallel over instances, fixed-order reduction), and the 95 %
/// confidence half-width of each mean over the realisations (instances are stored realisation by realisation).
fn mean_goodputs(cfg: &Config, ctx: &Ctx, specs: &[ScenarioSpec]) -> Result<(Vec<f64>, Vec<Option<f64>>)> {
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
    let means = (0..SCHEMES.len())
        .map(|j| per.iter().map(|v| v[j]).sum::<f64>() / per.len() as f64)
        .collect();
    let cis = (0..SCHEMES.len())
        .map(|j| {
            let column: Vec<f64> = per.iter().map(|v| v[j]).collect();
            stats::ci95(&stats::chunk_means(&column, cfg.prompts(ctx)))
        })
        .collect();
    Ok((means, cis))
}

/// A confidence half-width as a table cell (NaN when there is a single realisation).
fn ci_cell(ci: Option<f64>) -> Cell {
    Cell::from(ci.unwrap_or(f64::NAN))
}

/// A plan with one common draft length and Lemma 1 bandwidth.
fn uniform_plan(s: &Scenario, draft_len: u32) -> std::result::Result<Plan, spin_optimize::OptimizeError> {
    let (_, bandwidth) = lemma1_bandwidth(s)?;
    Plan::evaluated(s, vec![draft_len; s.len()], bandwidth)
}

/// Batches of Fig. 3's Monte-Carlo rounds per draft length (the batch-means confidence interval).
pub const FIG3_BATCHES: usize = 10;

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
    let mut names: Vec<String> = cfg
        .pairs
        .iter()
        .flat_map(|p| {
            [
                format!("{}_theory_tok_per_s", p.name),
                format!("{}_empirical_tok_per_s", p.name),
            ]
        })
        .collect();
    let ci_names: Vec<String> = names.iter().map(|n| format!("{n}_ci95")).collect();
    names.extend(ci_names);
    columns.extend(names.iter().map(String::as_str));
    let mut table = Table::new(&columns);
    let mut optimum = Vec::new();
    let mut cols: Vec<Vec<f64>> = Vec::new();
    let mut ci_cols: Vec<Vec<f64>> = Vec::new();
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
        let results: Vec<(f64, f64, f64, f64)> = (0..=24u32)
            .into_par_iter()
            .map(|l| {
                let out = if l == 0 {
                    // No drafting: every device receives one token from the target model per verification pass.
                    let g = k as f64 / verify;
                    (g, g, 0.0, 0.0)
                } else {
                    let mut rng =
                        ChaCha8Rng::seed_from_u64(seed_for(ctx.seed, &[3, pi as u64, u64::from(l)]));
                    // The rounds run in FIG3_BATCHES consecutive batches on the one stream (the same draws as one
                    // run); the batches' spread gives the confidence intervals (batch means).
                    let (mut tokens, mut time, mut formula) = (0u64, 0.0, 0.0);
                    let (mut batch_rate, mut batch_formula) = (Vec::new(), Vec::new());
                    for b in 0..FIG3_BATCHES {
                        let n = rounds * (b + 1) / FIG3_BATCHES - rounds * b / FIG3_BATCHES;
                        let o = simulate_rounds(&mut rng, &base, &real.mean_gains, &cfg.channel, n, |s| {
                            uniform_plan(s, l)
                        })?;
                        tokens += o.tokens;
                        time += o.time_s;
                        formula += o.mean_formula_goodput * n as f64;
                        batch_rate.push(o.empirical_goodput);
                        batch_formula.push(o.mean_formula_goodput);
                    }
                    (
                        formula / rounds as f64,
                        tokens as f64 / time,
                        stats::ci95(&batch_formula).unwrap_or(f64::NAN),
                        stats::ci95(&batch_rate).unwrap_or(f64::NAN),
                    )
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
        ci_cols.push(results.iter().map(|r| r.2).collect());
        ci_cols.push(results.iter().map(|r| r.3).collect());
    }
    cols.extend(ci_cols);
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
        "P2P-SPIN_ci95",
        "Cen-SPIN_ci95",
        "Multi-SPIN (Alg. 1)_ci95",
        "Multi-SPIN exact (ours)_ci95",
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
                    run_scheme(cfg, ctx, Scheme::PaperAlg1, &s)?.goodput_tokens_per_s,
                    run_scheme(cfg, ctx, Scheme::Exact, &s)?.goodput_tokens_per_s,
                ];
                bar.inc(1);
                Ok(row)
            })
            .collect::<Result<_>>()?;
        let mean = |j: usize| per.iter().map(|v| v[j]).sum::<f64>() / per.len() as f64;
        let ci = |j: usize| {
            let column: Vec<f64> = per.iter().map(|v| v[j]).collect();
            ci_cell(stats::ci95(&stats::chunk_means(&column, cfg.prompts(ctx))))
        };
        table.push(vec![
            pair.name.as_str().into(),
            mean(0).into(),
            mean(1).into(),
            mean(2).into(),
            mean(3).into(),
            ci(0),
            ci(1),
            ci(2),
            ci(3),
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
    let ci_names: Vec<String> = SCHEMES.iter().map(|(_, l)| format!("{l}_ci95")).collect();
    columns.extend(ci_names.iter().map(String::as_str));
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
            let (means, cis) = mean_goodputs(cfg, ctx, &specs)?;
            let mut row: Vec<Cell> = vec![pair.name.as_str().into(), x.into()];
            row.extend(means.into_iter().map(Cell::from));
            row.extend(cis.into_iter().map(ci_cell));
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
                let best = run_scheme(cfg, ctx, Scheme::BruteForce, &s)?.goodput_tokens_per_s;
                let ex = run_scheme(cfg, ctx, Scheme::Exact, &s)?.goodput_tokens_per_s;
                anyhow::ensure!(
                    (best - ex).abs() <= 1e-9 * best,
                    "exact planner differs from brute force"
                );
                let gap =
                    (best - run_scheme(cfg, ctx, Scheme::PaperAlg1, &s)?.goodput_tokens_per_s) / best * 100.0;
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

/// The unstated parameters varied by [`sensitivity`], one at a time around the calibrated values: (name, device
/// drafting latency factor on T̄^S, uplink power offset in dB on p_k, factor on the Cen-SPIN server drafting cost).
pub const SENSITIVITY: [(&str, f64, f64, f64); 7] = [
    ("calibrated (scenarios/paper-a.toml)", 1.0, 0.0, 1.0),
    ("T̄^S × 0.5", 0.5, 0.0, 1.0),
    ("T̄^S × 2", 2.0, 0.0, 1.0),
    ("p_k − 6 dB", 1.0, -6.0, 1.0),
    ("p_k + 6 dB", 1.0, 6.0, 1.0),
    ("Cen-SPIN drafting cost × 0.5", 1.0, 0.0, 0.5),
    ("Cen-SPIN drafting cost × 2", 1.0, 0.0, 2.0),
];

/// Realisations × prompts per device of each sensitivity point (paper scale; quick: 1 × 2).
const SENSITIVITY_SAMPLES: (usize, usize) = (2, 10);

/// The headline numbers of Figs. 6–8 under each [`SENSITIVITY`] variant (the same random streams in every variant,
/// fewer samples than the figures): Multi-SPIN (exact) goodput and its ratios to Cen-SPIN and P2P-SPIN at K = 20,
/// 10 MHz; the gain of the exact planner over Fixed BW&L at 5 MHz (Fig. 7) and at K = 4 and K = 24 (Fig. 8); and
/// Uni-BW's goodput relative to Homo at 5 MHz.
pub fn sensitivity(cfg: &Config, ctx: &Ctx) -> Result<Table> {
    let mut table = Table::new(&[
        "pair",
        "variant",
        "multi_spin_tok_s",
        "x_cen_spin",
        "x_p2p_spin",
        "fig7_gain_5mhz_pct",
        "uni_bw_vs_homo_5mhz_pct",
        "fig8_gain_k4_pct",
        "fig8_gain_k24_pct",
    ]);
    let mut c = cfg.clone();
    let (r, p) = if ctx.quick { (1, 2) } else { SENSITIVITY_SAMPLES };
    c.sampling.realisations = r;
    c.sampling.prompts_per_device = p;
    c.quick.realisations = r;
    c.quick.prompts_per_device = p;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let bar = ctx.progress(
        (cfg.pairs.len() * SENSITIVITY.len()) as u64,
        "paper A sensitivity",
    );
    for (pi, base_pair) in cfg.pairs.iter().enumerate() {
        for &(name, draft, power_db, cen) in &SENSITIVITY {
            let mut v = c.clone();
            v.channel.ul_power_w = cfg.channel.ul_power_w * spin_channel::units::db_to_linear(power_db);
            let mut pair = base_pair.clone();
            pair.draft_token_s *= draft;
            pair.server_draft_fixed_s *= cen;
            pair.server_draft_per_prompt_s *= cen;
            let plan =
                |s: &Scenario, sch: Scheme| run_scheme(&v, ctx, sch, s).map(|p| p.goodput_tokens_per_s);
            let specs = instances(
                &v,
                ctx,
                &pair,
                v.system.devices,
                v.system.bandwidth_hz,
                60 + pi as u64,
            )?;
            let f6: Vec<[f64; 3]> = specs
                .par_iter()
                .map(|spec| {
                    let s = Scenario::new(spec)?;
                    Ok([
                        run_scheme(&v, ctx, Scheme::Exact, &s)?.goodput_tokens_per_s,
                        cen_goodput(&s, &pair)?,
                        p2p(&s).goodput_tokens_per_s,
                    ])
                })
                .collect::<Result<_>>()?;
            let m = mean(&f6.iter().map(|x| x[0]).collect::<Vec<_>>());
            let cn = mean(&f6.iter().map(|x| x[1]).collect::<Vec<_>>());
            let pp = mean(&f6.iter().map(|x| x[2]).collect::<Vec<_>>());
            let gains = |k: usize, b: f64, stream: u64| -> Result<[f64; 4]> {
                let specs = instances(&v, ctx, &pair, k, b, stream)?;
                let per: Vec<[f64; 4]> = specs
                    .par_iter()
                    .map(|spec| {
                        let s = Scenario::new(spec)?;
                        Ok([
                            plan(&s, Scheme::Fixed)?,
                            plan(&s, Scheme::UniBw)?,
                            plan(&s, Scheme::Homo)?,
                            plan(&s, Scheme::Exact)?,
                        ])
                    })
                    .collect::<Result<_>>()?;
                Ok([0, 1, 2, 3].map(|j| mean(&per.iter().map(|x| x[j]).collect::<Vec<_>>())))
            };
            let g7 = gains(v.system.devices, 5e6, 70 + pi as u64)?;
            let g4 = gains(4, v.system.bandwidth_hz, 80 + pi as u64)?;
            let g24 = gains(24, v.system.bandwidth_hz, 80 + pi as u64)?;
            let pct = |a: f64, b: f64| 100.0 * (a / b - 1.0);
            table.push(vec![
                pair.name.as_str().into(),
                name.into(),
                m.into(),
                (m / cn).into(),
                (m / pp).into(),
                pct(g7[3], g7[0]).into(),
                pct(g7[1], g7[2]).into(),
                pct(g4[3], g4[0]).into(),
                pct(g24[3], g24[0]).into(),
            ]);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(table)
}

fn cen_goodput(s: &Scenario, pair: &PairCfg) -> Result<f64> {
    Ok(cen(s, &pair.cen())?.goodput_tokens_per_s)
}

/// Fig. 4's paper ranges (2→7 over T_ver 0.1–0.4 s, 7→2 over ϑ 20–80 ms, 4→14 over α 0.6–0.95) against Theorem 1:
/// for each sweep, the pair of held-fixed values nearest (relative distance) to ours (T_ver = 277 ms, ϑ = 40 ms,
/// α = 0.739) under which Theorem 1 gives the paper's two end points, found on a grid; `None` when no grid point
/// does. The pairs are (α, ϑ) for the T_ver sweep, (α, T_ver) for the ϑ sweep and (T_ver, ϑ) for the α sweep.
pub fn fig4_fixed_values() -> [Option<(f64, f64)>; 3] {
    let l = |a: f64, t: f64, th: f64| optimal_uniform_length(a, t, th, 1, 25);
    let alphas: Vec<f64> = (0..=70).map(|i| 0.6 + 0.005 * f64::from(i)).collect();
    let thetas: Vec<f64> = (10..=160).map(|i| f64::from(i) * 5e-4).collect();
    let tvers: Vec<f64> = (10..=400).map(|i| f64::from(i) * 5e-3).collect();
    let nearest = |xs: &[f64], ys: &[f64], x0: f64, y0: f64, hit: &dyn Fn(f64, f64) -> bool| {
        let mut best: Option<(f64, (f64, f64))> = None;
        for &x in xs {
            for &y in ys {
                if hit(x, y) {
                    let d = ((x - x0) / x0).abs() + ((y - y0) / y0).abs();
                    if best.is_none_or(|(b, _)| d < b) {
                        best = Some((d, (x, y)));
                    }
                }
            }
        }
        best.map(|b| b.1)
    };
    [
        nearest(&alphas, &thetas, 0.739, 0.040, &|a, th| {
            l(a, 0.1, th) == 2 && l(a, 0.4, th) == 7
        }),
        nearest(&alphas, &tvers, 0.739, 0.2771, &|a, t| {
            l(a, t, 0.02) == 7 && l(a, t, 0.08) == 2
        }),
        nearest(&tvers, &thetas, 0.2771, 0.040, &|t, th| {
            l(0.6, t, th) == 4 && l(0.95, t, th) == 14
        }),
    ]
}

/// A series from column `y` of `table` against column `x` (rows where column `filter.0` is the text `filter.1`),
/// with the confidence interval from column `y_ci95` when the table has it.
fn series_of(table: &Table, x: usize, y: usize, filter: Option<(usize, &str)>, name: String) -> Series {
    let num = |c: &Cell| if let Cell::Num(v) = c { *v } else { f64::NAN };
    let ci = table.col(&format!("{}_ci95", table.columns[y]));
    Series::lines(
        name,
        table
            .rows
            .iter()
            .filter(|r| filter.is_none_or(|(c, v)| matches!(&r[c], Cell::Text(t) if t == v)))
            .map(|r| {
                let h = ci.map(|c| num(&r[c])).filter(|h| h.is_finite());
                (num(&r[x]), num(&r[y]), h)
            }),
    )
}

/// Fig. 3's figure: theory and Monte Carlo per pair with intervals, Theorem 1's L* marked.
pub fn fig3_figure(t3: &Table, pairs: &[String], opt: &[(String, u32)]) -> Result<Figure> {
    let mut f = Figure::new(
        "Paper A Fig. 3: goodput versus a common draft length (GSM8K, K = 20, 10 MHz)",
        "draft length L (tokens)",
        "sum token goodput (tokens/s)",
    );
    f.x_axis = Axis::Integer;
    f.ci_note = format!(
        "Error bars: 95 % confidence intervals from {FIG3_BATCHES} consecutive batches of each point's rounds \
         (batch means, Student t), for one device drop."
    );
    for p in pairs {
        for (kind, col) in [
            ("theory", "theory_tok_per_s"),
            ("empirical", "empirical_tok_per_s"),
        ] {
            let j = t3
                .col(&format!("{p}_{col}"))
                .with_context(|| format!("fig 3 has no column {p}_{col}"))?;
            f.series
                .push(series_of(t3, 0, j, None, format!("{p}: {}", label(kind)?)));
        }
    }
    for (name, l) in opt {
        f.markers.push(Marker {
            x: f64::from(*l),
            label: format!("L* = {l} ({name}, Theorem 1)"),
        });
    }
    Ok(f)
}

/// Fig. 4's three figures (T_ver, ϑ, α varied): the continuous optimum as a line, the integer one as steps.
pub fn fig4_figures(t4: &Table) -> Result<Vec<(String, Figure)>> {
    let mut out = Vec::new();
    for (varied, x_label) in [
        ("verify_s", "verification latency T_ver (s)"),
        ("per_token_s", "per-token latency ϑ (s)"),
        ("acceptance", "acceptance rate α"),
    ] {
        let mut f = Figure::new(
            format!(
                "Paper A Fig. 4: Theorem 1's optimum versus {}",
                x_label.split(" (").next().unwrap_or(x_label)
            ),
            x_label,
            "optimal common draft length (tokens)",
        );
        f.y_axis = Axis::Integer;
        for (j, key) in [(2, "continuous_opt_len"), (3, "integer_opt_len")] {
            let mut s = series_of(t4, 1, j, Some((0, varied)), label(key)?.to_owned());
            if key == "integer_opt_len" {
                s.join = Join::Steps;
            }
            f.series.push(s);
        }
        f.notes.push(
            "The integer optimum changes half-way between samples in the drawing; the table gives the samples.".into(),
        );
        out.push((format!("paper_a_fig4_{varied}.svg"), f));
    }
    Ok(out)
}

/// Fig. 6's bar chart with intervals.
pub fn fig6_figure(t6: &Table, names: &[String]) -> Result<BarFigure> {
    let mut groups = Vec::new();
    for j in 1..=4 {
        let key = &t6.columns[j];
        let ci = t6.values(&format!("{key}_ci95"));
        let v = t6.values(key);
        groups.push((
            label(key)?.to_owned(),
            v.iter()
                .zip(&ci)
                .map(|(&m, &h)| (m, Some(h).filter(|h| h.is_finite())))
                .collect(),
        ));
    }
    Ok(BarFigure {
        title: "Paper A Fig. 6: P2P-SPIN, Cen-SPIN and Multi-SPIN (K = 20, B = 10 MHz)".into(),
        x_label: "model pair (target / draft)".into(),
        y_label: "sum token goodput (tokens/s)".into(),
        categories: names.to_vec(),
        groups,
        notes: vec![],
    })
}

/// Figs. 7 and 8: one figure per pair, every scheme with its interval.
pub fn sweep_figures(fig: &str, table: &Table, names: &[String]) -> Result<Vec<(String, Figure)>> {
    let (x_label, x_axis, file) = if fig == "7" {
        ("uplink bandwidth budget B (MHz)", Axis::Linear, "paper_a_fig7")
    } else {
        ("number of devices K", Axis::Integer, "paper_a_fig8")
    };
    let mut out = Vec::new();
    for name in names {
        let mut f = Figure::new(
            format!(
                "Paper A Fig. {fig}: control schemes versus {} ({name})",
                if fig == "7" { "bandwidth" } else { "K" }
            ),
            x_label,
            "sum token goodput (tokens/s)",
        );
        f.x_axis = x_axis;
        for (j, (_, key)) in SCHEMES.iter().enumerate() {
            f.series.push(series_of(
                table,
                1,
                2 + j,
                Some((0, name)),
                label(key)?.to_owned(),
            ));
        }
        out.push((format!("{file}_{}.svg", name.replace('.', "_")), f));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::testing::{checked, checked_bars};

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
    fn paper_a_fig3_quick() {
        let (cfg, ctx) = quick();
        let (t, opt) = fig3(&cfg, &ctx).unwrap();
        insta::assert_snapshot!("paper_a_fig3", format!("{opt:?}\n{}", t.render(4)));
        let names: Vec<String> = cfg.pairs.iter().map(|p| p.name.clone()).collect();
        let f = fig3_figure(&t, &names, &opt).unwrap();
        insta::assert_snapshot!("paper_a_fig3_figure", checked("fig3.svg", &f));
    }

    #[test]
    fn paper_a_fig4() {
        let t = super::fig4();
        insta::assert_snapshot!("paper_a_fig4", t.render(4));
        let figs = fig4_figures(&t).unwrap();
        let text: Vec<String> = figs.iter().map(|(file, f)| checked(file, f)).collect();
        insta::assert_snapshot!("paper_a_fig4_figures", text.join("\n"));
        assert!(
            figs.iter()
                .all(|(_, f)| f.series[1].join == Join::Steps && f.y_axis == Axis::Integer)
        );
    }

    #[test]
    fn paper_a_fig6_quick() {
        let (cfg, ctx) = quick();
        let t = fig6(&cfg, &ctx).unwrap();
        insta::assert_snapshot!("paper_a_fig6", t.render(4));
        let names: Vec<String> = cfg.pairs.iter().map(|p| p.name.clone()).collect();
        let f = fig6_figure(&t, &names).unwrap();
        insta::assert_snapshot!("paper_a_fig6_figure", checked_bars("fig6.svg", &f));
    }

    #[test]
    fn paper_a_fig7_and_fig8_quick() {
        let (mut cfg, ctx) = quick();
        // Debug-build budget: a smaller system than the paper's K = 20 keeps this test to seconds.
        cfg.system.devices = 8;
        cfg.fig7_bandwidth_hz = vec![5e6, 20e6];
        cfg.fig8_devices = vec![4, 8];
        let names: Vec<String> = cfg.pairs.iter().map(|p| p.name.clone()).collect();
        for (fig, t) in [("7", fig7(&cfg, &ctx).unwrap()), ("8", fig8(&cfg, &ctx).unwrap())] {
            insta::assert_snapshot!(format!("paper_a_fig{fig}"), t.render(4));
            let figs = sweep_figures(fig, &t, &names).unwrap();
            let text: Vec<String> = figs.iter().map(|(file, f)| checked(file, f)).collect();
            insta::assert_snapshot!(format!("paper_a_fig{fig}_figures"), text.join("\n"));
        }
    }

    #[test]
    fn sensitivity_rows_cover_every_variant_and_pair() {
        let (mut cfg, ctx) = quick();
        cfg.system.devices = 6;
        let t = sensitivity(&cfg, &ctx).unwrap();
        assert_eq!(t.rows.len(), SENSITIVITY.len() * cfg.pairs.len());
        // A slower drafter makes Multi-SPIN slower: the variants do reach the model.
        let m = t.values("multi_spin_tok_s");
        assert!(m[2] < m[0] && m[0] < m[1], "{m:?}");
        let [v, th, a] = fig4_fixed_values();
        let (alpha, theta) = v.unwrap();
        assert_eq!(optimal_uniform_length(alpha, 0.4, theta, 1, 25), 7);
        assert_eq!(optimal_uniform_length(alpha, 0.1, theta, 1, 25), 2);
        assert!(th.is_some(), "{th:?} {a:?}");
    }

    #[test]
    fn q_tok_matches_the_paper() {
        let (cfg, _) = quick();
        assert_eq!(cfg.bits_per_token(&cfg.pairs[0]), 31744.0);
        assert_eq!(cfg.bits_per_token(&cfg.pairs[1]), 34816.0);
    }
}
