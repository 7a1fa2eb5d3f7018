//! Paper A's part of the reproduction: runs the figures of `paper_a`, writes their CSV and SVG files, and writes
//! the REPORT.md sections a reviewer reads (each figure embedded, ours beside the paper, every difference explained
//! from the model or by a parameter the paper leaves unstated, with its sensitivity band).

use crate::paper_a::{
    Config, ConfigRun, FIG3_BATCHES, SENSITIVITY, alg1_gap, fig3, fig3_figure, fig4, fig4_figures,
    fig4_fixed_values, fig6, fig6_figure, fig7, fig8, sensitivity, sweep_figures,
};
use crate::report::{Claim, Ctx, Report, embed};
use crate::table::{Cell, Table};
use anyhow::Result;
use spin_optimize::paper_a::homogeneous::optimal_uniform_length;

/// The value of column `col` in the row whose first column is `pair` and second is `x`.
fn at(t: &Table, pair: &str, x: f64, col: &str) -> f64 {
    let j = t.col(col).unwrap_or(usize::MAX);
    t.rows
        .iter()
        .find(|r| matches!(&r[0], Cell::Text(p) if p == pair) && matches!(&r[1], Cell::Num(v) if *v == x))
        .and_then(|r| match r.get(j) {
            Some(Cell::Num(v)) => Some(*v),
            _ => None,
        })
        .unwrap_or(f64::NAN)
}

/// (lo, hi) of the rows of `t` for `pair` in column `col`.
fn band_of(t: &Table, pair: &str, col: &str) -> (f64, f64) {
    let v: Vec<f64> = t
        .rows
        .iter()
        .zip(t.values(col))
        .filter(|(r, _)| matches!(&r[0], Cell::Text(p) if p == pair))
        .map(|(_, v)| v)
        .collect();
    (
        v.iter().copied().fold(f64::INFINITY, f64::min),
        v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// "lo – hi" of the rows of `t` for `pair` in column `col` (the sensitivity band).
fn band(t: &Table, pair: &str, col: &str, digits: usize) -> String {
    let v: Vec<f64> = t
        .rows
        .iter()
        .zip(t.values(col))
        .filter(|(r, _)| matches!(&r[0], Cell::Text(p) if p == pair))
        .map(|(_, v)| v)
        .collect();
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.digits$} – {hi:.digits$}")
}

/// Theorem 1's optimal common length for pair `pair` at `k` devices with the lowest, mean and highest Table I rate,
/// at ϑ = 40 ms (Fig. 4's centre): (lowest, mean, highest).
fn theorem1_lengths(cfg: &Config, pair: usize, k: usize) -> (u32, u32, u32) {
    let p = &cfg.pairs[pair];
    let t = p.verify_fixed_s + k as f64 * p.verify_per_device_s;
    let a: Vec<f64> = p.acceptance.values().copied().collect();
    let lo = a.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = a.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    let l = |x: f64| optimal_uniform_length(x, t, 0.040, 1, 25);
    (l(lo), l(mean), l(hi))
}

fn pct(a: f64, b: f64) -> f64 {
    100.0 * (a / b - 1.0)
}

/// A pair of held-fixed values as text, `names` and the scale to print each in.
fn pair_text(v: Option<(f64, f64)>, names: [(&str, f64, &str); 2]) -> String {
    match v {
        Some((a, b)) => format!(
            "{} = {}{}, {} = {}{}",
            names[0].0,
            crate::plot::num(a * names[0].1),
            names[0].2,
            names[1].0,
            crate::plot::num(b * names[1].1),
            names[1].2
        ),
        None => format!(
            "no point of the grid ({} and {} over 5 ms – 2 s) — the paper's end points are not both reachable under \
             Theorem 1 with L_max = 25, an erratum candidate of the paper's figure",
            names[0].0, names[1].0
        ),
    }
}

/// Regenerates paper A's figures as CSV + SVG and adds one report section per figure and the summary rows.
/// Regenerates paper A's figures as CSV + SVG and adds one report section per figure and the summary rows.
pub fn reproduce(ctx: &Ctx, report: &mut Report) -> Result<()> {
    let cfg = Config::load()?;
    let names: Vec<String> = cfg.pairs.iter().map(|p| p.name.clone()).collect();
    let sens = ctx.timed("paper A sensitivity", || sensitivity(&cfg, ctx))?;
    sens.write_csv(&ctx.path("paper_a_sensitivity.csv"))?;
    fig3_section(ctx, report, &cfg, &names)?;
    fig4_section(ctx, report)?;
    fig6_section(ctx, report, &cfg, &names, &sens)?;
    fig78_sections(ctx, report, &cfg, &names, &sens)?;
    sensitivity_and_gap_sections(ctx, report, &cfg, &sens)
}

/// Fig. 3: goodput against the common draft length, theory against Monte Carlo.
fn fig3_section(ctx: &Ctx, report: &mut Report, cfg: &Config, names: &[String]) -> Result<()> {
    let llama = names[0].as_str();
    let (t3, opt) = ctx.timed("paper A fig 3", || fig3(cfg, ctx))?;
    t3.write_csv(&ctx.path("paper_a_fig3.csv"))?;
    let f3 = fig3_figure(&t3, names, &opt)?;
    f3.write_svg(&ctx.path("paper_a_fig3.svg"))?;
    let rounds = if ctx.quick {
        cfg.quick.fig3_rounds
    } else {
        cfg.sampling.fig3_rounds
    };
    let mut body = format!(
        "Common draft length with Lemma 1 bandwidth, K = {}, every device on GSM8K. *Theory* is eq. 19 per fading \
         block, averaged over the simulated blocks; *Monte Carlo* is a seeded run ({rounds} rounds per L in \
         {FIG3_BATCHES} batches, Bernoulli acceptance, fresh Rayleigh fading each round) measured as Σ tokens / Σ \
         time.\n\n{}",
        cfg.system.devices,
        embed("paper_a_fig3.svg", &f3.title, &f3.all_notes())
    );
    let peak = |col: &str| {
        let v = t3.values(col);
        let i = (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap_or(0);
        (i, v.get(i).copied().unwrap_or(f64::NAN))
    };
    let mut peaks = Vec::new();
    for (name, l_star) in &opt {
        let (lt, vt) = peak(&format!("{name}_theory_tok_per_s"));
        let (le, ve) = peak(&format!("{name}_empirical_tok_per_s"));
        body.push_str(&format!(
            "- {name}: theory peaks at L = {lt} ({vt:.1} tok/s), Monte Carlo at L = {le} ({ve:.1} tok/s); Theorem 1 \
             at the mean ϑ gives L* = {l_star}.\n"
        ));
        peaks.push((name.clone(), lt, vt, le, ve, *l_star));
    }
    let gap = |name: &str, l: usize| {
        let t = t3.values(&format!("{name}_theory_tok_per_s"));
        let e = t3.values(&format!("{name}_empirical_tok_per_s"));
        let h = t3.values(&format!("{name}_empirical_tok_per_s_ci95"));
        (t[l], e[l], h[l])
    };
    let (t13, e13, h13) = gap(llama, 13.min(t3.rows.len() - 1));
    body.push_str(&format!(
        "\nWhy the Monte Carlo curve lies below the theory and jitters (e.g. {llama} at L = 13: {e13:.1} ± {h13:.1} \
         against {t13:.1} tok/s): the theory line is the *mean over rounds of each round's goodput* E[N/T], the Monte \
         Carlo value is the renewal–reward rate E[N]/E[T]. A round in a deep Rayleigh fade takes long and weighs in \
         E[T] in full, but counts little in E[N/T]. Given L, the tokens N depend on acceptance only and the round time \
         T on the fading only, so E[N/T] = E[N]·E[1/T] ≥ E[N]/E[T] by Jensen's inequality (1/T is convex), and the \
         gap grows with L because a longer draft makes the uplink — the faded part \
         — a larger share of the round. The error bars (batch means) show that the dips are this heavy-tailed round \
         time, not a bias: the longer the draft, the heavier the tail of the round time and the wider the interval.\n\n\
         Paper: Llama-2 peaks near 130–140 tok/s and Qwen3.5 near 200 tok/s with the derived optimum on the peak. \
         Ours: the same unimodal shape; the derived L* sits on the flat top (within 2 % of the peak).\n\n{}",
        t3.to_markdown_ci(4)
    ));
    report.section("Paper A, Fig. 3: theory vs simulation", body);
    for (name, lt, vt, le, ve, l_star) in &peaks {
        let paper = if name == llama {
            "peak ≈ 130–140 tok/s, derived L* on the peak"
        } else {
            "peak ≈ 200 tok/s, derived L* on the peak"
        };
        report.claim(Claim {
            figure: "A Fig. 3",
            claim: "goodput vs common L: unimodal, L* on the peak",
            ours: format!("{name}: theory {vt:.1} at L = {lt}, Monte Carlo {ve:.1} at L = {le}; L* = {l_star}"),
            paper,
            difference: format!(
                "peak {vt:.0} tok/s; L* − theory peak = {}",
                i64::from(*l_star) - *lt as i64
            ),
            why: "Monte Carlo = E[N]/E[T] below the theory line E[N/T] (deep-fade rounds); the level scales with the \
                  unstated T̄^S and p_k"
                .into(),
        });
    }

    Ok(())
}

/// Fig. 4: Theorem 1's optimal common draft length around the operating point.
fn fig4_section(ctx: &Ctx, report: &mut Report) -> Result<()> {
    let t4 = ctx.timed("paper A fig 4", fig4);
    t4.write_csv(&ctx.path("paper_a_fig4.csv"))?;
    let mut body = String::from(
        "Theorem 1 (eq. 24, lower Lambert-W branch) around T_ver = 277 ms (K = 20, Llama-2), ϑ = 40 ms, α = 0.739 \
         (GSM8K), one varied at a time. The integer optimum is drawn as steps (it is integer-valued).\n\n",
    );
    for (file, f) in fig4_figures(&t4)? {
        f.write_svg(&ctx.path(&file))?;
        body.push_str(&embed(&file, &f.title, &f.all_notes()));
    }
    let ranges: Vec<(String, u32, u32)> = ["verify_s", "per_token_s", "acceptance"]
        .iter()
        .map(|v| {
            let l: Vec<u32> = t4
                .rows
                .iter()
                .filter(|r| matches!(&r[0], Cell::Text(t) if t == v))
                .filter_map(|r| match r[3] {
                    Cell::Num(x) => Some(x as u32),
                    Cell::Text(_) => None,
                })
                .collect();
            (
                (*v).to_owned(),
                l.first().copied().unwrap_or(0),
                l.last().copied().unwrap_or(0),
            )
        })
        .collect();
    let [fv, ft, fa] = fig4_fixed_values();
    let lstar = |a: f64, t: f64, th: f64| optimal_uniform_length(a, t, th, 1, 25);
    body.push_str(&format!(
        "Ours: {}→{} over T_ver 0.1–0.4 s, {}→{} over ϑ 20–80 ms, {}→{} over α 0.6–0.95; paper: 2→7, 7→2, 4→14. The \
         trends match; the levels differ because the paper does not print the values it holds fixed in each sweep. \
         Held at our values, no choice of the *other* fixed value gives the paper's end points with α = 0.739 \
         (GSM8K): at α = 0.739 the T_ver sweep gives {}→{} at ϑ = 20 ms and {}→{} at ϑ = 15 ms — the optimum's range \
         over T_ver 0.1–0.4 s is too narrow for 2→7. A grid search over both held values (`fig4_fixed_values`) \
         finds the pairs nearest ours under which Theorem 1 gives the paper's end points: T_ver sweep 2→7 at {}; \
         ϑ sweep 7→2 at {}; α sweep 4→14 at {}. So the paper's Fig. 4 was drawn at a higher acceptance rate (or \
         another operating point) than its GSM8K Llama-2 setting; the formula itself is the paper's.\n\n{}",
        ranges[0].1,
        ranges[0].2,
        ranges[1].1,
        ranges[1].2,
        ranges[2].1,
        ranges[2].2,
        lstar(0.739, 0.1, 0.02),
        lstar(0.739, 0.4, 0.02),
        lstar(0.739, 0.1, 0.015),
        lstar(0.739, 0.4, 0.015),
        pair_text(fv, [("α", 1.0, ""), ("ϑ", 1e3, " ms")]),
        pair_text(ft, [("α", 1.0, ""), ("T_ver", 1e3, " ms")]),
        pair_text(fa, [("T_ver", 1e3, " ms"), ("ϑ", 1e3, " ms")]),
        t4.to_markdown(4)
    ));
    report.section("Paper A, Fig. 4: optimal common draft length", body);
    report.claim(Claim {
        figure: "A Fig. 4",
        claim: "L* grows with T_ver, falls with ϑ, grows fast as α → 1",
        ours: format!(
            "{}→{}, {}→{}, {}→{}",
            ranges[0].1, ranges[0].2, ranges[1].1, ranges[1].2, ranges[2].1, ranges[2].2
        ),
        paper: "2→7, 7→2, 4→14",
        difference: "same trends, lower levels".into(),
        why: format!(
            "the held values are not printed; at α = 0.739 no ϑ gives 2→7; Theorem 1 gives the paper's end points at \
             {} (T_ver sweep), {} (ϑ sweep)",
            pair_text(fv, [("α", 1.0, ""), ("ϑ", 1e3, " ms")]),
            pair_text(ft, [("α", 1.0, ""), ("T_ver", 1e3, " ms")])
        ),
    });

    Ok(())
}

/// Fig. 6: P2P-SPIN, Cen-SPIN and Multi-SPIN, with the bands over the unstated parameters.
fn fig6_section(ctx: &Ctx, report: &mut Report, cfg: &Config, names: &[String], sens: &Table) -> Result<()> {
    let t6 = ctx.timed("paper A fig 6", || fig6(cfg, ctx))?;
    t6.write_csv(&ctx.path("paper_a_fig6.csv"))?;
    let f6 = fig6_figure(&t6, names)?;
    f6.write_svg(&ctx.path("paper_a_fig6.svg"))?;
    let mut body = format!(
        "K = 20, B = 10 MHz, mean over realisations × prompts; 95 % intervals over the realisations.\n\n{}\
         | pair | ours: Multi-SPIN (Alg. 1) | paper | ours: × Cen-SPIN | paper | ours: × P2P | paper | exact / Alg. 1 | \
         band over the unstated parameters: Multi-SPIN, × Cen, × P2P |\n|---|---|---|---|---|---|---|---|---|\n",
        embed("paper_a_fig6.svg", &f6.title, &f6.all_notes())
    );
    let paper = [("≈145", "≈2.5×", "≈4.6×"), ("≈153", "≈3×", "—")];
    let col = |name: &str| t6.values(name);
    let (p2, cn, ma, ex) = (
        col("P2P-SPIN"),
        col("Cen-SPIN"),
        col("Multi-SPIN (Alg. 1)"),
        col("Multi-SPIN exact (ours)"),
    );
    for (r, name) in names.iter().enumerate().take(t6.rows.len()) {
        let (pm, pc, pp) = paper.get(r).copied().unwrap_or(("—", "—", "—"));
        body.push_str(&format!(
            "| {name} | {:.1} | {pm} | {:.2}× | {pc} | {:.2}× | {pp} | {:.4} | {} tok/s, {}×, {}× |\n",
            ma[r],
            ma[r] / cn[r],
            ma[r] / p2[r],
            ex[r] / ma[r],
            band(sens, name, "multi_spin_tok_s", 0),
            band(sens, name, "x_cen_spin", 2),
            band(sens, name, "x_p2p_spin", 2),
        ));
    }
    body.push_str(
        "\nThe Multi-SPIN level and the P2P ratio follow from the device drafting latency T̄^S and the transmit power \
         p_k, the Cen-SPIN ratio from the server's drafting cost: none is printed by the paper. They are calibrated \
         on the Llama-2 pair only (scenarios/paper-a.toml), so Llama-2 matches by construction and Qwen3.5 is a \
         prediction. Qwen3.5 is above the paper (202 against ≈153 tok/s): its Table I acceptance rates (0.81–0.97) \
         make long drafts pay, so its goodput grows with any drafting speed-up, and the paper's Qwen3.5-0.8B drafter \
         on the M4 Pro is evidently slower relative to its target than our T̄^S = 18 ms assumes; the band shows \
         T̄^S × 2 brings it to the paper's level. The exact planner's gain over Algorithm 1 is small at K = 20 \
         because rounding errors average out over 20 devices.\n\n",
    );
    body.push_str(&t6.to_markdown_ci(4));
    report.section("Paper A, Fig. 6: P2P-SPIN, Cen-SPIN and Multi-SPIN", body);
    for (r, name) in names.iter().enumerate().take(t6.rows.len()) {
        report.claim(Claim {
            figure: "A Fig. 6",
            claim: "Multi-SPIN goodput and its gain over Cen-SPIN",
            ours: format!("{name}: {:.1} tok/s, {:.2}× Cen-SPIN", ma[r], ma[r] / cn[r]),
            paper: if r == 0 { "≈145 tok/s, ≈2.5×" } else { "≈153 tok/s, ≈3×" },
            difference: {
                let (pg, pr) = [(145.0, 2.5), (153.0, 3.0)][r.min(1)];
                format!("{:+.0} %, {:+.2}×", pct(ma[r], pg), ma[r] / cn[r] - pr)
            },
            why: format!(
                "T̄^S, p_k and the server drafting cost are unstated (calibrated on Llama-2); band {} tok/s, {}×",
                band(sens, name, "multi_spin_tok_s", 0),
                band(sens, name, "x_cen_spin", 2)
            ),
        });
    }

    Ok(())
}

/// Figs. 7 and 8: the gains over Fixed BW&L against the bandwidth and against K.
fn fig78_sections(
    ctx: &Ctx,
    report: &mut Report,
    cfg: &Config,
    names: &[String],
    sens: &Table,
) -> Result<()> {
    let (llama, qwen) = (names[0].as_str(), names[1].as_str());
    let t7 = ctx.timed("paper A fig 7", || fig7(cfg, ctx))?;
    let t8 = ctx.timed("paper A fig 8", || fig8(cfg, ctx))?;
    for (fig, table) in [("7", &t7), ("8", &t8)] {
        table.write_csv(&ctx.path(&format!("paper_a_fig{fig}.csv")))?;
        let mut body = String::new();
        for (svg, f) in sweep_figures(fig, table, names)? {
            f.write_svg(&ctx.path(&svg))?;
            body.push_str(&embed(&svg, &f.title, &f.all_notes()));
        }
        let x_col = &table.columns[1];
        body.push_str(&format!(
            "Gains over Fixed BW&L (L = 8, B/K each) per x = {x_col}:\n\n| pair | x | Hete (Alg. 1) | exact | Uni-BW − \
             Homo |\n|---|---|---|---|---|\n"
        ));
        for r in &table.rows {
            let (Cell::Text(name), Cell::Num(x)) = (&r[0], &r[1]) else {
                continue;
            };
            let v = |c: &str| at(table, name, *x, c);
            body.push_str(&format!(
                "| {name} | {} | +{:.1} % | +{:.1} % | {:+.1} % |\n",
                crate::plot::num(*x),
                pct(v("Hete (Alg. 1)"), v("Fixed BW&L")),
                pct(v("Exact (ours)"), v("Fixed BW&L")),
                pct(v("Uni-BW"), v("Homo")),
            ));
        }
        body.push('\n');
        if fig == "7" {
            let g = |n: &str| {
                pct(
                    at(table, n, 5.0, "Hete (Alg. 1)"),
                    at(table, n, 5.0, "Fixed BW&L"),
                )
            };
            let ub = |n: &str| pct(at(table, n, 5.0, "Uni-BW"), at(table, n, 5.0, "Homo"));
            body.push_str(&format!(
                "Paper: Hete beats Fixed BW&L by ≈88 % at 5 MHz for both pairs, the gap narrows with B, Uni-BW lies \
                 above Homo. Ours: +{:.1} % ({llama}) and +{:.1} % ({qwen}) at 5 MHz, narrowing with B as in the paper. \
                 Uni-BW lies above Homo for {qwen} ({:+.1} %) but *below* it for {llama} ({:+.1} %). Why, from the \
                 model: Uni-BW keeps per-device lengths but equal bandwidth, Homo keeps one length but Lemma 1's \
                 bandwidth. Per-device lengths pay when the devices' optimal lengths differ, and by Theorem 1 (Fig. 4) \
                 they differ most when α is near 1: at K = 20 and ϑ = 40 ms, Theorem 1 gives {qwen}'s lowest and \
                 highest Table I rates the optimal lengths {} and {}, {llama}'s only {} and {}. Lemma 1's bandwidth pays when the uplink is a large \
                 share of the round, set by p_k and T̄^S, which the paper does not print. Over the sensitivity band \
                 (T̄^S × 0.5 … × 2, p_k ± 6 dB), Uni-BW − Homo for {llama} at 5 MHz ranges over {} %: {}\n\n",
                g(llama),
                g(qwen),
                ub(qwen),
                ub(llama),
                theorem1_lengths(cfg, 1, 20).0,
                theorem1_lengths(cfg, 1, 20).2,
                theorem1_lengths(cfg, 0, 20).0,
                theorem1_lengths(cfg, 0, 20).2,
                band(sens, llama, "uni_bw_vs_homo_5mhz_pct", 1),
                if band_of(sens, llama, "uni_bw_vs_homo_5mhz_pct").1 < 0.0 {
                    "negative throughout, so no plausible T̄^S or p_k restores the paper's order in this model. What \
                     does: heterogeneity of α beyond Table I. The paper measures α per prompt, and per-prompt rates \
                     scatter around the dataset means; our devices draw the dataset mean (a ⟨C⟩ of docs/paper-a.md). \
                     A wider α spread makes per-device lengths pay more (as for Qwen3.5), which is the direction \
                     needed — a hypothesis this model cannot test without per-prompt rates."
                } else {
                    "the paper's order holds for part of the plausible range, so the order is set by the unstated \
                     parameters."
                },
            ));
            for name in names {
                report.claim(Claim {
                    figure: "A Fig. 7",
                    claim: "Hete over Fixed BW&L at 5 MHz; gap narrows with B",
                    ours: format!("{name}: +{:.1} %, narrowing", g(name)),
                    paper: "≈ +88 %, narrowing",
                    difference: format!("{:+.0} points", g(name) - 88.0),
                    why: format!(
                        "unstated T̄^S and p_k set the uplink's share; band {} %",
                        band(sens, name, "fig7_gain_5mhz_pct", 0)
                    ),
                });
                report.claim(Claim {
                    figure: "A Fig. 7",
                    claim: "Uni-BW above Homo",
                    ours: format!("{name}: Uni-BW − Homo = {:+.1} % at 5 MHz", ub(name)),
                    paper: "Uni-BW above Homo",
                    difference: if ub(name) >= 0.0 {
                        "matches".into()
                    } else {
                        "opposite order".into()
                    },
                    why: format!(
                        "per-device L pays with a wide α spread (Qwen3.5), Lemma 1 bandwidth with a large uplink \
                         share (unstated p_k, T̄^S); band {} %",
                        band(sens, name, "uni_bw_vs_homo_5mhz_pct", 1)
                    ),
                });
            }
        } else {
            let g = |n: &str, k: f64| pct(at(table, n, k, "Hete (Alg. 1)"), at(table, n, k, "Fixed BW&L"));
            body.push_str(&format!(
                "Paper: Hete's gain over Fixed BW&L grows from ≈21 % (small K) to ≈67 % at K = 24 for {llama} and \
                 from ≈29 % to > 80 % for {qwen}. Ours: {llama} +{:.1} % at K = 4, +{:.1} % at K = 8, +{:.1} % at K = 24; \
                 {qwen} +{:.1} % at K = 4 and +{:.1} % at K = 24. The large-K gains match (Fixed BW&L's B/K shrinks \
                 with K and its L = 8 drafts then wait on the uplink). At small K the gain is set by how far L = 8 is \
                 from the optimum, and two effects meet: with few devices the verification T_ver(K) = T_fix + K·T_lin \
                 is short, so by Theorem 1 the optimum is short ({} for {llama} at K = 4 at its mean Table I rate \
                 and ϑ = 40 ms) and L = 8 wastes drafting time — this \
                 loss *falls* as K grows; the equal split B/K starves the uplink more as K grows — this loss *rises*. \
                 {} How large the first effect is depends on the unstated T̄^S (drafting time per token): the \
                 small-K gain for {llama} spans {} % over the sensitivity band, which {} the paper's ≈21 %. {qwen}'s high acceptance rates put its optimum at {} at K = 4 (same reading), nearer L = 8, so Fixed \
                 BW&L loses little there (+{:.1} %, paper ≈29 %; band {} %).\n\n",
                g(llama, 4.0),
                g(llama, 8.0),
                g(llama, 24.0),
                g(qwen, 4.0),
                g(qwen, 24.0),
                theorem1_lengths(cfg, 0, 4).1,
                if g(llama, 8.0) < g(llama, 4.0) {
                    format!(
                        "Hence {llama}'s gain first falls (K = 4 → 8) and then rises: not monotone, where the \
                         paper's curve is."
                    )
                } else {
                    format!("Here the second effect dominates from K = 4 on, and {llama}'s gain rises with K.")
                },
                band(sens, llama, "fig8_gain_k4_pct", 0),
                {
                    let (lo, hi) = band_of(sens, llama, "fig8_gain_k4_pct");
                    if (lo..=hi).contains(&21.0) { "contains" } else { "does not contain" }
                },
                theorem1_lengths(cfg, 1, 4).1,
                g(qwen, 4.0),
                band(sens, qwen, "fig8_gain_k4_pct", 0),
            ));
            for (name, small, large) in [(llama, "≈ +21 %", "≈ +67 %"), (qwen, "≈ +29 %", "> +80 %")] {
                report.claim(Claim {
                    figure: "A Fig. 8",
                    claim: "Hete over Fixed BW&L at small K",
                    ours: format!("{name}: +{:.1} % at K = 4", g(name, 4.0)),
                    paper: small,
                    difference: "see why".into(),
                    why: format!(
                        "L = 8 against a short optimum at small K (short T_ver) depends on the unstated T̄^S; band \
                         {} %",
                        band(sens, name, "fig8_gain_k4_pct", 0)
                    ),
                });
                report.claim(Claim {
                    figure: "A Fig. 8",
                    claim: "Hete over Fixed BW&L at K = 24",
                    ours: format!("{name}: +{:.1} %", g(name, 24.0)),
                    paper: large,
                    difference: "close".into(),
                    why: format!(
                        "B/K starves Fixed BW&L's uplink; band {} %",
                        band(sens, name, "fig8_gain_k24_pct", 0)
                    ),
                });
            }
        }
        body.push_str(&table.to_markdown_ci(4));
        report.section(&format!("Paper A, Fig. {fig}: control schemes"), body);
    }

    Ok(())
}

/// The sensitivity section and Algorithm 1's gap to the exact optimum.
fn sensitivity_and_gap_sections(ctx: &Ctx, report: &mut Report, cfg: &Config, sens: &Table) -> Result<()> {
    report.section(
        "Paper A: sensitivity to the unstated parameters",
        format!(
            "Paper A prints neither the device drafting latency T̄^S nor the transmit power p_k, nor the server's \
             drafting cost for Cen-SPIN (docs/model.md, ⟨C⟩). Each is varied one at a time over a plausible range \
             around the calibrated value (T̄^S × 0.5 … × 2, p_k ± 6 dB, Cen-SPIN cost × 0.5 … × 2), on the figures' \
             own random streams but with {} realisation(s) × {} prompts per point (so the calibrated row differs \
             slightly from the figures). The bands quoted in the sections above are the min – max of each column per \
             pair. Variants: {}.\n\n{}",
            if ctx.quick { 1 } else { 2 },
            if ctx.quick { 2 } else { 10 },
            SENSITIVITY.map(|v| v.0).join("; "),
            sens.to_markdown(4)
        ),
    );

    let tg = ctx.timed("paper A alg1 gap", || alg1_gap(cfg, ctx))?;
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
