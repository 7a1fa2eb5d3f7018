//! Paper B Figs. 6–11 as tables: each function runs one figure's sweep and returns its rows (no files written).
//!
//! Every point averages `drops` realisations; realisation d of a figure uses the same channels, tasks and drafting
//! speeds at every x value (seeded from the master seed, the figure and d only), so curves are smooth in x.

use super::config::{Config, Pair};
use crate::report::Ctx;
use crate::table::{Cell, Table};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use spin_channel::paper_b::{Drop, PowerBudget};
use spin_channel::units::dbm_to_w;
use spin_optimize::paper_b::proactive;
use spin_optimize::paper_b::reactive::{Link, ModeScheme, split_by_bisection};
use spin_optimize::paper_b::{DeviceSpec, Objective, SaaEvaluator, Scenario, ScenarioSpec};
use spin_optimize::round::{Scheme, plan_paper_b};

/// SplitMix64 finaliser over (seed, figure, index): independent, reproducible streams.
pub fn mix(seed: u64, figure: u64, index: u64) -> u64 {
    let mut z = seed ^ figure.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One realisation: per-device acceptance (task drawn uniformly), drafting latency and channel gain.
#[derive(Debug, Clone)]
pub struct Realisation {
    /// The devices.
    pub devices: Vec<DeviceSpec>,
}

/// Draws `k` devices for `pair` from `seed`: channels first (distance, fading), then task and drafting scale.
pub fn realise(cfg: &Config, pair: &Pair, k: usize, seed: u64) -> anyhow::Result<Realisation> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let channels = Drop::PAPER_B.sample(&mut rng, k)?;
    let devices = channels
        .iter()
        .map(|c| {
            let task = rng.random_range(0..pair.acceptance.len());
            let scale =
                cfg.draft_scale_min + (cfg.draft_scale_max - cfg.draft_scale_min) * rng.random::<f64>();
            DeviceSpec {
                acceptance: pair.acceptance[task],
                draft_token_s: pair.draft_token_s * scale,
                channel_gain: c.channel_gain,
            }
        })
        .collect();
    Ok(Realisation { devices })
}

/// The scenario of one realisation under a power budget.
pub fn scenario(
    cfg: &Config,
    pair: &Pair,
    r: &Realisation,
    budget: PowerBudget,
    saa_samples: u32,
    seed: u64,
) -> anyhow::Result<Scenario> {
    let spec = ScenarioSpec {
        bandwidth_hz: cfg.bandwidth_hz,
        distribution_bits: cfg.distribution_format().distribution_bits(),
        verify_fixed_s: pair.verify_fixed_s,
        verify_per_device_s: pair.verify_per_device_s,
        max_draft_len: cfg.max_draft_len,
        ul_power_w: budget.ul_power_w,
        dl_power_w: budget.dl_power_w,
        noise_psd_server_w_per_hz: cfg.noise_psd_server_w_per_hz,
        noise_psd_device_w_per_hz: cfg.noise_psd_device_w_per_hz,
        saa_samples,
        seed,
        devices: r.devices.clone(),
    };
    Ok(Scenario::new(spec)?)
}

/// Averages per-drop rows (same length) in drop order.
fn average(rows: &[Vec<f64>]) -> Vec<f64> {
    let n = rows.len().max(1) as f64;
    let mut acc = vec![0.0; rows.first().map_or(0, Vec::len)];
    for row in rows {
        for (a, v) in acc.iter_mut().zip(row) {
            *a += v;
        }
    }
    acc.iter().map(|a| a / n).collect()
}

/// Runs `per_drop` for every drop in parallel and averages in drop order; also the 95 % confidence half-width of
/// each average over the drops (NaN with a single drop).
fn over_drops(
    drops: u32,
    per_drop: impl Fn(u64) -> anyhow::Result<Vec<f64>> + Sync + Send,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let rows: Vec<Vec<f64>> = (0..u64::from(drops))
        .into_par_iter()
        .map(per_drop)
        .collect::<anyhow::Result<_>>()?;
    let width = rows.first().map_or(0, Vec::len);
    let ci = (0..width)
        .map(|j| crate::stats::ci95(&rows.iter().map(|r| r[j]).collect::<Vec<_>>()).unwrap_or(f64::NAN))
        .collect();
    Ok((average(&rows), ci))
}

/// Appends a `<name>_ci95` column for each of `names` to `columns`.
fn with_ci(columns: &[&str], names: &[&str]) -> Vec<String> {
    columns
        .iter()
        .map(|c| (*c).to_owned())
        .chain(names.iter().map(|n| format!("{n}_ci95")))
        .collect()
}

fn gain_pct(new: f64, base: f64) -> f64 {
    100.0 * (new / base - 1.0)
}

/// Fig. 6: UL delay, DL delay and their max versus the number n of UL devices, every device rejected, one drop.
/// Returns the table and the (bisection n, exhaustive n) pair as a check.
pub fn fig6(cfg: &Config, ctx: &Ctx) -> anyhow::Result<(Table, usize, f64, f64)> {
    let pair = &cfg.pairs[0];
    let r = realise(cfg, pair, cfg.devices, mix(ctx.seed, 6, 0))?;
    let budget = PowerBudget {
        dl_power_w: dbm_to_w(cfg.fig6.dl_power_dbm),
        ul_power_w: dbm_to_w(cfg.fig6.ul_power_dbm),
    };
    let sc = scenario(cfg, pair, &r, budget, 1, 0)?;
    let link: Link = sc.link();
    let m = r.devices.len();
    let b = link.share_hz(m);
    let mut gains: Vec<f64> = r.devices.iter().map(|d| d.channel_gain).collect();
    gains.sort_by(|a, b| b.total_cmp(a));
    let ul: Vec<f64> = gains.iter().map(|&g| link.ul_delay_s(b, g)).collect();
    let mut suffix = vec![0.0; m + 1];
    for i in (0..m).rev() {
        suffix[i] = suffix[i + 1] + 1.0 / gains[i];
    }
    let mut t = Table::new(&["n_ul", "ul_delay_ms", "dl_delay_ms", "comm_delay_ms"]);
    for n in 0..=m {
        let u = if n == 0 { 0.0 } else { ul[n - 1] };
        let d = link.dl_delay_s(b, suffix[n]);
        t.push(vec![
            Cell::from(n),
            Cell::from(1e3 * u),
            Cell::from(1e3 * d),
            Cell::from(1e3 * u.max(d)),
        ]);
    }
    let (n_star, best) = split_by_bisection(m, |i| ul[i], |n| link.dl_delay_s(b, suffix[n]));
    let brute = spin_optimize::paper_b::reactive::solve(
        &link,
        &gains,
        ModeScheme::BruteForce,
        &mut ChaCha8Rng::seed_from_u64(0),
    )?;
    Ok((t, n_star, best, brute.comm_delay_s))
}

/// Figs. 7–8: goodput, mean draft length and device states versus P_dl for `pair`, greedy and best.
pub fn fig7(cfg: &Config, ctx: &Ctx, pair_index: usize) -> anyhow::Result<Table> {
    let pair = &cfg.pairs[pair_index];
    let size = cfg.size(ctx.quick);
    let points = if ctx.quick {
        &cfg.fig7.quick_dl_power_dbm
    } else {
        &cfg.fig7.dl_power_dbm
    };
    let figure = 7 + pair_index as u64;
    let averaged = [
        "greedy_tok_s",
        "best_tok_s",
        "greedy_mean_len",
        "best_mean_len",
        "greedy_accepted",
        "greedy_ul",
        "greedy_dl",
        "best_accepted",
        "best_ul",
        "best_dl",
    ];
    let columns = with_ci(
        &[
            "p_dl_dbm",
            "greedy_tok_s",
            "best_tok_s",
            "best_gain_pct",
            "greedy_mean_len",
            "best_mean_len",
            "greedy_accepted",
            "greedy_ul",
            "greedy_dl",
            "best_accepted",
            "best_ul",
            "best_dl",
        ],
        &averaged,
    );
    let mut t = Table::new(&columns.iter().map(String::as_str).collect::<Vec<_>>());
    let bar = ctx.progress(points.len() as u64, &format!("paper B fig {figure}"));
    for &dl_dbm in points {
        let budget = PowerBudget {
            dl_power_w: dbm_to_w(dl_dbm),
            ul_power_w: dbm_to_w(cfg.fig7.ul_power_dbm),
        };
        let (avg, ci) = over_drops(size.drops, |d| {
            let r = realise(cfg, pair, cfg.devices, mix(ctx.seed, figure, d))?;
            let sc = scenario(
                cfg,
                pair,
                &r,
                budget,
                size.saa_samples,
                mix(ctx.seed, figure + 100, d),
            )?;
            let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate)?;
            let mut row = Vec::new();
            let greedy = plan_paper_b(Scheme::Greedy, &ev)?;
            // `best` from the three plans already made on these samples (the plan `Scheme::Best` makes).
            let best = proactive::best_from(
                &ev,
                greedy.clone(),
                plan_paper_b(Scheme::Uniform, &ev)?,
                plan_paper_b(Scheme::CompOnly, &ev)?,
            );
            let plans = [greedy, best];
            row.extend(plans.iter().map(|p| p.value));
            row.extend(plans.iter().map(|p| p.mean_draft_len()));
            for p in &plans {
                let st = ev.stats(&p.draft_lengths);
                row.extend([st.frac_accepted, st.frac_ul, st.frac_dl]);
            }
            Ok(row)
        })?;
        let mut cells = vec![Cell::from(dl_dbm), Cell::from(avg[0]), Cell::from(avg[1])];
        cells.push(Cell::from(gain_pct(avg[1], avg[0])));
        cells.extend(avg[2..].iter().map(|&v| Cell::from(v)));
        cells.extend(ci.iter().map(|&v| Cell::from(v)));
        t.push(cells);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(t)
}

/// Figs. 9–10: goodput of the mode-selection schemes versus K at P_dl/P_ul = `ratio` under P_tot(K); draft lengths
/// by greedy under each scheme's own reactive policy, plus the best search with optimal modes.
pub fn fig9(cfg: &Config, ctx: &Ctx, ratio: f64, figure: u64) -> anyhow::Result<Table> {
    let pair = &cfg.pairs[0];
    let size = cfg.size(ctx.quick);
    let points = if ctx.quick {
        &cfg.fig9.quick_devices
    } else {
        &cfg.fig9.devices
    };
    let averaged = [
        "optimal_tok_s",
        "all_ul_tok_s",
        "all_dl_tok_s",
        "random_tok_s",
        "best_tok_s",
    ];
    let columns = with_ci(
        &[
            "devices",
            "p_dl_w",
            "p_ul_w",
            "optimal_tok_s",
            "all_ul_tok_s",
            "all_dl_tok_s",
            "random_tok_s",
            "best_tok_s",
            "best_gain_pct",
        ],
        &averaged,
    );
    let mut t = Table::new(&columns.iter().map(String::as_str).collect::<Vec<_>>());
    let bar = ctx.progress(points.len() as u64, &format!("paper B fig {figure}"));
    for &k in points {
        let total = PowerBudget::total_w(dbm_to_w(cfg.dl_power_dbm), dbm_to_w(cfg.ul_power_dbm), k)?;
        let budget = PowerBudget::split(total, ratio, k)?;
        let (avg, ci) = over_drops(size.drops, |d| {
            let r = realise(cfg, pair, k, mix(ctx.seed, figure, d))?;
            let sc = scenario(
                cfg,
                pair,
                &r,
                budget,
                size.saa_samples,
                mix(ctx.seed, figure + 100, d),
            )?;
            let mut row = Vec::new();
            let optimal = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate)?;
            let greedy = plan_paper_b(Scheme::Greedy, &optimal)?;
            row.push(greedy.value);
            for policy in [ModeScheme::AllUl, ModeScheme::AllDl, ModeScheme::Random] {
                let ev = SaaEvaluator::new(&sc, policy, Objective::Rate)?;
                row.push(plan_paper_b(Scheme::Greedy, &ev)?.value);
            }
            let (u, c) = (
                plan_paper_b(Scheme::Uniform, &optimal)?,
                plan_paper_b(Scheme::CompOnly, &optimal)?,
            );
            row.push(proactive::best_from(&optimal, greedy, u, c).value);
            Ok(row)
        })?;
        let mut cells = vec![
            Cell::from(k),
            Cell::from(budget.dl_power_w),
            Cell::from(budget.ul_power_w),
        ];
        cells.extend(avg.iter().map(|&v| Cell::from(v)));
        cells.push(Cell::from(gain_pct(avg[4], avg[0])));
        cells.extend(ci.iter().map(|&v| Cell::from(v)));
        t.push(cells);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(t)
}

/// Fig. 11: goodput of the draft-length control schemes versus P_dl/P_ul at K under P_tot(K), optimal modes.
pub fn fig11(cfg: &Config, ctx: &Ctx) -> anyhow::Result<Table> {
    let pair = &cfg.pairs[0];
    let size = cfg.size(ctx.quick);
    let points = if ctx.quick {
        &cfg.fig11.quick_ratios
    } else {
        &cfg.fig11.ratios
    };
    let k = cfg.devices;
    let total = PowerBudget::total_w(dbm_to_w(cfg.dl_power_dbm), dbm_to_w(cfg.ul_power_dbm), k)?;
    let averaged = ["greedy_tok_s", "best_tok_s", "uniform_tok_s", "comp_only_tok_s"];
    let columns = with_ci(
        &[
            "ratio",
            "greedy_tok_s",
            "best_tok_s",
            "uniform_tok_s",
            "comp_only_tok_s",
            "best_gain_pct",
        ],
        &averaged,
    );
    let mut t = Table::new(&columns.iter().map(String::as_str).collect::<Vec<_>>());
    let bar = ctx.progress(points.len() as u64, "paper B fig 11");
    for &ratio in points {
        let budget = PowerBudget::split(total, ratio, k)?;
        let (avg, ci) = over_drops(size.drops, |d| {
            let r = realise(cfg, pair, k, mix(ctx.seed, 11, d))?;
            let sc = scenario(cfg, pair, &r, budget, size.saa_samples, mix(ctx.seed, 111, d))?;
            let ev = SaaEvaluator::new(&sc, ModeScheme::Optimal, Objective::Rate)?;
            let (g, u, c) = (
                plan_paper_b(Scheme::Greedy, &ev)?,
                plan_paper_b(Scheme::Uniform, &ev)?,
                plan_paper_b(Scheme::CompOnly, &ev)?,
            );
            let (gv, uv, cv) = (g.value, u.value, c.value);
            Ok(vec![gv, proactive::best_from(&ev, g, u, c).value, uv, cv])
        })?;
        let mut cells = vec![Cell::from(ratio)];
        cells.extend(avg.iter().map(|&v| Cell::from(v)));
        cells.push(Cell::from(gain_pct(avg[1], avg[0])));
        cells.extend(ci.iter().map(|&v| Cell::from(v)));
        t.push(cells);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(t)
}

/// The unstated parameters of paper B varied by [`sensitivity`], one at a time: (name, offset on every acceptance
/// rate of Table I, UL power of Figs. 7–8 in dBm; `None` keeps the configured value).
pub const SENSITIVITY: [(&str, f64, Option<f64>); 5] = [
    ("calibrated (scenarios/paper-b.toml)", 0.0, None),
    ("Table I α − 0.05", -0.05, None),
    ("Table I α + 0.05", 0.05, None),
    ("P_ul = 10 dBm", 0.0, Some(10.0)),
    ("P_ul = 20 dBm", 0.0, Some(20.0)),
];

/// Fig. 7's headline numbers (the Qwen pair at P_dl = 20 and 40 dBm: greedy, `best` and its gain) under each
/// [`SENSITIVITY`] variant, on the figure's own random streams.
pub fn sensitivity(cfg: &Config, ctx: &Ctx) -> anyhow::Result<Table> {
    let mut t = Table::new(&[
        "variant",
        "greedy_20dbm_tok_s",
        "best_20dbm_tok_s",
        "best_gain_20dbm_pct",
        "greedy_40dbm_tok_s",
        "best_gain_40dbm_pct",
    ]);
    for &(name, da, ul) in &SENSITIVITY {
        let mut c = cfg.clone();
        c.fig7.dl_power_dbm = vec![20.0, 40.0];
        c.fig7.quick_dl_power_dbm = vec![20.0, 40.0];
        if let Some(p) = ul {
            c.fig7.ul_power_dbm = p;
        }
        for a in &mut c.pairs[0].acceptance {
            *a = (*a + da).clamp(0.01, 0.99);
        }
        let f = fig7(&c, ctx, 0)?;
        let (g, b, gain) = (
            f.values("greedy_tok_s"),
            f.values("best_tok_s"),
            f.values("best_gain_pct"),
        );
        t.push(vec![
            Cell::from(name),
            Cell::from(g[0]),
            Cell::from(b[0]),
            Cell::from(gain[0]),
            Cell::from(g[1]),
            Cell::from(gain[1]),
        ]);
    }
    Ok(t)
}
