//! "Beyond the papers": the unified controller against paper-A-only and paper-B-only control on one unified round
//! model, across bandwidth and DL/UL power ratio (CSV + SVG and a REPORT.md section; docs/unified.md).

use crate::plot::{Axis, Figure};
use crate::report::{Ctx, Report};
use crate::table::{Cell, Table};
use anyhow::Context;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use spin_channel::paper_b::PowerBudget;
use spin_channel::units::mhz_to_hz;
use spin_optimize::paper_b::Objective;
use spin_optimize::round::{PaperPlanner, PayloadPolicy, Planner, Radio, Round, Scheme};
use spin_optimize::unified::testing::DropRound;
use spin_optimize::unified::{Options, plan_with_paper_b_best};

/// The controllers compared, by column name (legend labels in `plot::label`).
const CONTROLLERS: [&str; 4] = ["paper_a", "paper_b", "unified_pair", "unified"];

struct Size {
    devices: usize,
    drops: usize,
    saa_samples: u32,
}

fn size(quick: bool) -> Size {
    if quick {
        Size {
            devices: 6,
            drops: 1,
            saa_samples: 100,
        }
    } else {
        Size {
            devices: 20,
            drops: 5,
            saa_samples: 1000,
        }
    }
}

/// Goodput (rate objective) of the four controllers on one round.
fn controllers(round: &Round) -> anyhow::Result<[f64; 4]> {
    let rate = |p: spin_optimize::round::RoundPlan| p.rate_tokens_per_s;
    // Paper A's controller as the paper has it, every device drafting (L ≥ 1). These rounds allow L = 0, where
    // the exact planner also weighs a device drafting nothing; on this drop no device drafting at all (K tokens
    // per T_ver: 102.7 tokens/s at K = 20) is above paper A's mean goodput at every bandwidth swept (55.8 to
    // 91.5 tokens/s from 1 to 50 MHz), so that column would show batched decoding without drafts, not paper A.
    let mut drafting = round.spec().clone();
    drafting.min_draft_len = drafting.min_draft_len.max(1);
    let a = PaperPlanner::new(Scheme::Exact, Objective::Rate).plan(&Round::new(drafting)?)?;
    let b = PaperPlanner::new(Scheme::Best, Objective::Rate).plan(round)?;
    // Both unified planners start from paper B's `best` plan; `b` has just computed it on the same paper-B
    // scenario (the payload policy does not enter it), so it is passed on rather than searched for twice more.
    let seed = Some(b.draft_lengths.as_slice());
    let mut pair_spec = round.spec().clone();
    pair_spec.payload.policy = PayloadPolicy::Pair;
    let pair = plan_with_paper_b_best(&Round::new(pair_spec)?, &Options::default(), seed)?.0;
    let unified = plan_with_paper_b_best(round, &Options::default(), seed)?.0;
    Ok([rate(a), rate(b), rate(pair), rate(unified)])
}

/// One sweep: for every x value, the mean goodput over `drops` realisations (same channels at every x).
fn sweep(
    ctx: &Ctx,
    name: &str,
    x_name: &str,
    xs: &[f64],
    make: impl Fn(f64) -> DropRound + Sync,
) -> anyhow::Result<Table> {
    let sz = size(ctx.quick);
    let mut cols = vec![x_name];
    cols.extend(CONTROLLERS);
    cols.push("unified_gain_pct");
    let ci_names: Vec<String> = CONTROLLERS.iter().map(|c| format!("{c}_ci95")).collect();
    cols.extend(ci_names.iter().map(String::as_str));
    let mut table = Table::new(&cols);
    // Every (x, realisation) pair is one parallel task, so both cores stay busy across x values (a realisation
    // count that does not divide by the core count would otherwise idle one core at every x).
    let bar = ctx.progress((xs.len() * sz.drops) as u64, name);
    let results: Vec<[f64; 4]> = (0..xs.len() * sz.drops)
        .into_par_iter()
        .map(|i| {
            let (x, d) = (xs[i / sz.drops], i % sz.drops);
            let seed = ctx.seed ^ (0x756e_6966 + d as u64);
            let round = make(x).draw(&mut ChaCha8Rng::seed_from_u64(seed))?;
            let out = controllers(&round);
            bar.inc(1);
            out
        })
        .collect::<anyhow::Result<_>>()?;
    for (xi, &x) in xs.iter().enumerate() {
        let per_drop = &results[xi * sz.drops..(xi + 1) * sz.drops];
        let mean: Vec<f64> = (0..4)
            .map(|i| per_drop.iter().map(|r| r[i]).sum::<f64>() / per_drop.len() as f64)
            .collect();
        let best_paper = mean[0].max(mean[1]);
        let mut row = vec![Cell::from(x)];
        row.extend(mean.iter().map(|&v| Cell::from(v)));
        row.push(Cell::from(100.0 * (mean[3] / best_paper - 1.0)));
        row.extend((0..4).map(|i| {
            let v: Vec<f64> = per_drop.iter().map(|r| r[i]).collect();
            Cell::from(crate::stats::ci95(&v).unwrap_or(f64::NAN))
        }));
        table.push(row);
    }
    bar.finish_and_clear();
    Ok(table)
}

/// The figure of one sweep: the four controllers with their intervals.
pub fn figure(t: &Table, title: &str, x_label: &str, x_axis: Axis) -> anyhow::Result<Figure> {
    let ys: Vec<(&str, &str)> = CONTROLLERS.iter().map(|c| (*c, *c)).collect();
    crate::paper_b::line_figure(
        t,
        &t.columns[0],
        &ys,
        title.to_owned(),
        (x_label, x_axis, "goodput E[ΣN]/E[T] (tokens/s)"),
    )
}

/// The two sweeps: bandwidth at paper B's powers, and the DL/UL power ratio at 10 MHz under P_tot(K).
pub fn tables(ctx: &Ctx) -> anyhow::Result<(Table, Table)> {
    let sz = size(ctx.quick);
    let base = DropRound {
        devices: sz.devices,
        saa_samples: sz.saa_samples,
        ..DropRound::default()
    };
    let bandwidths = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0];
    let by_bandwidth = sweep(ctx, "unified: bandwidth", "bandwidth_mhz", &bandwidths, |mhz| {
        DropRound {
            bandwidth_hz: mhz_to_hz(mhz),
            ..base
        }
    })?;
    let paper_b = Radio::paper_b();
    let total = PowerBudget::total_w(paper_b.dl_power_w, paper_b.ul_power_w, sz.devices)?;
    let ratios = [1.0, 4.0, 16.0, 64.0, 256.0];
    let budgets: Vec<PowerBudget> = ratios
        .iter()
        .map(|&r| PowerBudget::split(total, r, sz.devices))
        .collect::<Result<_, _>>()?;
    let by_ratio = sweep(ctx, "unified: power ratio", "dl_ul_ratio", &ratios, |r| {
        let i = ratios.iter().position(|&x| x == r).unwrap_or(0);
        DropRound {
            radio: Radio {
                ul_power_w: budgets[i].ul_power_w,
                dl_power_w: budgets[i].dl_power_w,
                ..base.radio
            },
            ..base
        }
    })?;
    Ok((by_bandwidth, by_ratio))
}

/// Writes the CSV and SVG files and the report section.
pub fn reproduce(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let sz = size(ctx.quick);
    let (by_bandwidth, by_ratio) = ctx.timed("unified", || tables(ctx)).context("unified sweeps")?;
    by_bandwidth.write_csv(&ctx.path("unified_bandwidth.csv"))?;
    by_ratio.write_csv(&ctx.path("unified_power_ratio.csv"))?;
    let fb = figure(
        &by_bandwidth,
        "Unified versus paper-A-only and paper-B-only control across the bandwidth",
        "uplink bandwidth B (MHz, log scale)",
        Axis::Log2,
    )?;
    fb.write_svg(&ctx.path("unified_bandwidth.svg"))?;
    let fr = figure(
        &by_ratio,
        "Unified control across the DL/UL power ratio (P_tot(K) fixed, B = 10 MHz)",
        "power ratio P_dl/P_ul (log scale)",
        Axis::Log2,
    )?;
    fr.write_svg(&ctx.path("unified_power_ratio.svg"))?;
    let mut body = format!(
        "Paper B's drop and Qwen setting (T0 = 42.8 ms, T1 = 7.6 ms, T^dft = 15.2 ms × U[1, 1.15], acceptance \
         drawn from (0.85, 0.82, 0.72, 0.75)), K = {}, L ∈ {{0..20}}, D = 34,816 bits, pairs charged at 34 bits, \
         N_SAA = {}, {} realisation(s) per point, the same channels at every x. Every controller's plan is scored by \
         the same unified model (docs/unified.md): `paper_a` plans with paper A's exact planner and sends \
         distributions per token; `paper_b` plans γ with paper B's `best` search and sends pairs over equal shares; \
         `unified_pair` plans lengths, OFDMA shares and modes jointly with pairs; `unified` also chooses the payload \
         per device. `unified_gain_pct` is the gain of `unified` over the better of the two papers.\n\n\
         Goodput (tokens/s) versus bandwidth, P_ul = 15 dBm, P_dl = 30 dBm:\n\n",
        sz.devices, sz.saa_samples, sz.drops
    );
    body.push_str(&crate::report::embed(
        "unified_bandwidth.svg",
        &fb.title,
        &fb.all_notes(),
    ));
    body.push_str(&by_bandwidth.to_markdown_ci(4));
    body.push_str(
        "\nGoodput (tokens/s) versus P_dl/P_ul with P_dl + K·P_ul = P̄_dl + K·P̄_ul (30 dBm, 15 dBm), B = 10 MHz:\n\n",
    );
    body.push_str(&crate::report::embed(
        "unified_power_ratio.svg",
        &fr.title,
        &fr.all_notes(),
    ));
    body.push_str(&by_ratio.to_markdown_ci(4));
    body.push_str("\nFiles: `unified_bandwidth.{csv,svg}`, `unified_power_ratio.{csv,svg}`.\n");
    let gain = by_ratio.values("unified_gain_pct");
    let ratios = by_ratio.values("dl_ul_ratio");
    report.claim(crate::report::Claim {
        figure: "beyond both",
        claim: "unified control over the better paper, across P_dl/P_ul",
        ours: format!(
            "{:+.1} % at ratio {} … {:+.1} % at ratio {}",
            gain.first().copied().unwrap_or(f64::NAN),
            ratios.first().copied().unwrap_or(f64::NAN),
            gain.last().copied().unwrap_or(f64::NAN),
            ratios.last().copied().unwrap_or(f64::NAN)
        ),
        paper: "—",
        difference: "beyond the papers".into(),
        why:
            "a large P_dl/P_ul starves paper B's UL corrections and paper A's per-token uplink; choosing the \
              payload and the mode per device avoids both (docs/unified.md)"
                .into(),
    });
    report.section("Beyond the papers: unified control", body);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unified_is_never_below_either_paper_in_the_quick_sweeps() {
        let ctx = Ctx {
            out_dir: std::env::temp_dir(),
            quick: true,
            seed: 2026,
        };
        let (by_bandwidth, by_ratio) = tables(&ctx).unwrap();
        let f = figure(&by_ratio, "ratio", "P_dl/P_ul", Axis::Log2).unwrap();
        insta::assert_snapshot!(
            "unified_power_ratio_figure",
            crate::plot::testing::checked("u.svg", &f)
        );
        for t in [&by_bandwidth, &by_ratio] {
            assert!(!t.rows.is_empty());
            for row in &t.rows {
                let v: Vec<f64> = row
                    .iter()
                    .filter_map(|c| match c {
                        Cell::Num(v) => Some(*v),
                        Cell::Text(_) => None,
                    })
                    .collect();
                let (a, b, pair, unified) = (v[1], v[2], v[3], v[4]);
                assert!(unified >= a * (1.0 - 1e-9), "{v:?}");
                assert!(unified >= b * (1.0 - 1e-9), "{v:?}");
                assert!(unified >= pair * (1.0 - 1e-9), "{v:?}");
                assert!(pair >= b * (1.0 - 1e-9), "{v:?}");
            }
        }
    }
}
