//! Paper B reproduction: Figs. 6–11 as CSV + SVG and one REPORT.md section each, with our `best` search beside
//! the paper's greedy in every draft-control figure.

pub(crate) mod config;
mod figures;

use crate::plot::{Axis, Figure, Marker, Series, label};
use crate::report::{Claim, Ctx, Report};
use crate::table::{Cell, Table};
use config::{Config, Load};

/// The numbers of column `name` (text cells skipped).
fn column(t: &Table, name: &str) -> Vec<f64> {
    let j = t.columns.iter().position(|c| c == name).unwrap_or(usize::MAX);
    t.rows
        .iter()
        .filter_map(|r| match r.get(j) {
            Some(Cell::Num(v)) => Some(*v),
            _ => None,
        })
        .collect()
}

/// A figure of columns `ys` (column name, legend key) of `t` against column `x`, each point with the interval from
/// its `<column>_ci95` column when the table has one.
pub(crate) fn line_figure(
    t: &Table,
    x: &str,
    ys: &[(&str, &str)],
    title: String,
    axes: (&str, Axis, &str),
) -> anyhow::Result<Figure> {
    let mut f = Figure::new(title, axes.0, axes.2);
    f.x_axis = axes.1;
    let xs = t.values(x);
    for &(col, key) in ys {
        let ci = t.values(&format!("{col}_ci95"));
        let v = t.values(col);
        anyhow::ensure!(v.len() == xs.len(), "no column {col}");
        f.series.push(Series::lines(
            label(key)?,
            xs.iter()
                .enumerate()
                .map(|(i, &xv)| (xv, v[i], ci.get(i).copied().filter(|h| h.is_finite()))),
        ));
    }
    Ok(f)
}

/// Fig. 6's figure: the three delays with n* marked (one drop, no Monte-Carlo interval).
pub(crate) fn fig6_figure(t6: &Table, n_star: usize) -> anyhow::Result<Figure> {
    let mut f6 = line_figure(
        t6,
        "n_ul",
        &[
            ("ul_delay_ms", "ul_delay_ms"),
            ("dl_delay_ms", "dl_delay_ms"),
            ("comm_delay_ms", "comm_delay_ms"),
        ],
        "Paper B Fig. 6: UL and DL delay versus the number n of UL devices (one drop, all rejected)".into(),
        ("number of UL devices n", Axis::Integer, "delay (ms)"),
    )?;
    f6.markers.push(Marker {
        x: n_star as f64,
        label: format!("n* = {n_star} (bisection = exhaustive)"),
    });
    Ok(f6)
}

/// Figs. 7–8's three figures (goodput, mean draft length, device states) for one pair.
pub(crate) fn fig78_figures(t: &Table, fig: u32, name: &str) -> anyhow::Result<Vec<(String, Figure)>> {
    let stem = format!("paper_b_fig{fig}");
    let axes = |y| ("DL transmit power P_dl (dBm)", Axis::Linear, y);
    let states: Vec<(&str, &str)> = [
        "greedy_accepted",
        "greedy_ul",
        "greedy_dl",
        "best_accepted",
        "best_ul",
        "best_dl",
    ]
    .iter()
    .map(|c| (*c, *c))
    .collect();
    Ok(vec![
        (
            format!("{stem}_goodput.svg"),
            line_figure(
                t,
                "p_dl_dbm",
                &[("greedy_tok_s", "greedy_tok_s"), ("best_tok_s", "best_tok_s")],
                format!("Paper B Fig. {fig}: goodput versus P_dl ({name})"),
                axes("sum token goodput (tokens/s)"),
            )?,
        ),
        (
            format!("{stem}_draft_len.svg"),
            line_figure(
                t,
                "p_dl_dbm",
                &[
                    ("greedy_mean_len", "greedy_mean_len"),
                    ("best_mean_len", "best_mean_len"),
                ],
                format!("Paper B Fig. {fig}: mean draft length versus P_dl ({name})"),
                axes("mean draft length γ (tokens)"),
            )?,
        ),
        (
            format!("{stem}_states.svg"),
            line_figure(
                t,
                "p_dl_dbm",
                &states,
                format!("Paper B Fig. {fig}: device states versus P_dl ({name})"),
                axes("fraction of devices"),
            )?,
        ),
    ])
}

/// Figs. 9–10's figure: the mode-selection schemes against K.
pub(crate) fn fig910_figure(t: &Table, fig: u64, ratio: f64) -> anyhow::Result<Figure> {
    line_figure(
        t,
        "devices",
        &[
            ("optimal_tok_s", "optimal_tok_s"),
            ("all_ul_tok_s", "all_ul_tok_s"),
            ("all_dl_tok_s", "all_dl_tok_s"),
            ("random_tok_s", "random_tok_s"),
            ("best_tok_s", "best_modes_tok_s"),
        ],
        format!(
            "Paper B Fig. {fig}: mode selection versus K (P_dl/P_ul = {})",
            crate::plot::num(ratio)
        ),
        (
            "number of devices K",
            Axis::Integer,
            "sum token goodput (tokens/s)",
        ),
    )
}

/// Fig. 11's figure: the draft-length control schemes against the power ratio (a geometric sweep: log axis).
pub(crate) fn fig11_figure(t: &Table) -> anyhow::Result<Figure> {
    line_figure(
        t,
        "ratio",
        &[
            ("greedy_tok_s", "greedy_tok_s"),
            ("best_tok_s", "best_tok_s"),
            ("uniform_tok_s", "uniform_tok_s"),
            ("comp_only_tok_s", "comp_only_tok_s"),
        ],
        "Paper B Fig. 11: draft-length control versus P_dl/P_ul (K = 20, optimal modes)".into(),
        (
            "power ratio P_dl/P_ul (log scale)",
            Axis::Log2,
            "sum token goodput (tokens/s)",
        ),
    )
}

/// Writes `figs` under the output folder and returns the Markdown that embeds them with their caption notes.
fn write_figures(ctx: &Ctx, figs: &[(String, Figure)]) -> anyhow::Result<String> {
    let mut md = String::new();
    for (file, f) in figs {
        f.write_svg(&ctx.path(file))?;
        md.push_str(&crate::report::embed(file, &f.title, &f.all_notes()));
    }
    Ok(md)
}

fn rising(v: &[f64]) -> bool {
    v.windows(2).all(|w| w[1] >= w[0] * (1.0 - 1e-3))
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// Regenerates paper B's figures.
pub fn reproduce(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (cfg, path) = Config::load()?;
    setting_section(ctx, report, &cfg, &path)?;
    fig6_section(ctx, report, &cfg)?;
    for (pair_index, fig) in [(0usize, 7u32), (1, 8)] {
        fig78_section(ctx, report, &cfg, pair_index, fig)?;
    }
    for (i, fig) in [(0usize, 9u64), (1, 10)] {
        fig910_section(ctx, report, &cfg, i, fig)?;
    }
    fig11_section(ctx, report, &cfg)?;
    sensitivity_section(ctx, report, &cfg)
}

/// The setting section: the parameters of the run and Table I as chosen (`paper_b_table1_acceptance.csv`).
fn setting_section(
    ctx: &Ctx,
    report: &mut Report,
    cfg: &Config,
    path: &std::path::Path,
) -> anyhow::Result<()> {
    let size = cfg.size(ctx.quick);
    let mut setup = format!(
        "Parameters from `{}` (override with `{}`): K = {}, B = {} MHz, D = {} × ({} index bits + {}) bits, \
         γ_max = {}, N_SAA = {}, {} realisation(s) per point, objective E[ΣN]/E[T] (`rate`). Table I of paper B \
         is missing from the text; our acceptance rates per task ⟨C⟩:\n\n",
        path.file_name().map_or_else(
            || path.display().to_string(),
            |f| format!("scenarios/{}", f.to_string_lossy())
        ),
        config::CONFIG_ENV,
        cfg.devices,
        cfg.bandwidth_hz / 1e6,
        cfg.effective_support,
        spin_core::dist::index_bits(cfg.vocabulary as usize),
        cfg.quant_bits,
        cfg.max_draft_len,
        size.saa_samples,
        size.drops,
    );
    let mut t1 = Table::new(&["pair", "task", "acceptance"]);
    for p in &cfg.pairs {
        for (task, a) in p.tasks.iter().zip(&p.acceptance) {
            t1.push(vec![
                Cell::from(p.name.as_str()),
                Cell::from(task.as_str()),
                Cell::from(*a),
            ]);
        }
    }
    setup.push_str(&t1.to_markdown(4));
    t1.write_csv(&ctx.path("paper_b_table1_acceptance.csv"))?;
    report.section("Paper B: setting and Table I choice", setup);

    Ok(())
}

/// Fig. 6: UL and DL delay against the number of UL devices, bisection against exhaustive search.
fn fig6_section(ctx: &Ctx, report: &mut Report, cfg: &Config) -> anyhow::Result<()> {
    let (t6, n_star, best6, brute6) = ctx.timed("paper B fig 6", || figures::fig6(cfg, ctx))?;
    t6.write_csv(&ctx.path("paper_b_fig6.csv"))?;
    let ul6 = column(&t6, "ul_delay_ms");
    let dl6 = column(&t6, "dl_delay_ms");
    let md6 = write_figures(ctx, &[("paper_b_fig6.svg".into(), fig6_figure(&t6, n_star)?)])?;
    report.section(
        "Paper B Fig. 6: UL and DL delay versus the number of UL devices",
        format!(
            "All {} devices rejected, P_dl = {} dBm, P_ul = {} dBm, devices sorted by UL delay. Paper: the UL delay \
             rises and the DL delay falls with n; the optimum sits at the crossing. Here: UL rising {}, DL falling \
             {}; bisection picks n* = {n_star} with T_comm = {:.4} ms, exhaustive search over 2^{} assignments \
             gives {:.4} ms (equal: {}). This figure is reactive only: no draft control, so no `best` curve applies; \
             the exhaustive optimum is its reference.\n\n{md6}{}",
            cfg.devices,
            cfg.fig6.dl_power_dbm,
            cfg.fig6.ul_power_dbm,
            yes(rising(&ul6)),
            yes(rising(&dl6.iter().rev().copied().collect::<Vec<_>>())),
            best6 * 1e3,
            cfg.devices,
            brute6 * 1e3,
            yes((best6 - brute6).abs() <= 1e-12 * brute6),
            t6.to_markdown(4)
        ),
    );
    report.claim(Claim {
        figure: "B Fig. 6",
        claim: "UL delay rises, DL delay falls with n; optimum at the crossing (bisection)",
        ours: format!(
            "rising {}, falling {}; n* = {n_star}, {:.2} ms = exhaustive {:.2} ms",
            yes(rising(&ul6)),
            yes(rising(&dl6.iter().rev().copied().collect::<Vec<_>>())),
            best6 * 1e3,
            brute6 * 1e3
        ),
        paper: "prefix + bisection optimal",
        difference: "matches".into(),
        why: "Lemma 2 and Proposition 1 hold in the implemented model (tested against 2^K exhaustive search)"
            .into(),
    });

    Ok(())
}

/// Fig. 7 (pair 0) or Fig. 8 (pair 1): adaptation to the DL budget.
fn fig78_section(
    ctx: &Ctx,
    report: &mut Report,
    cfg: &Config,
    pair_index: usize,
    fig: u32,
) -> anyhow::Result<()> {
    let t = ctx.timed(&format!("paper B fig {fig}"), || {
        figures::fig7(cfg, ctx, pair_index)
    })?;
    let stem = format!("paper_b_fig{fig}");
    t.write_csv(&ctx.path(&format!("{stem}.csv")))?;
    let name = &cfg.pairs[pair_index].name;
    let g = column(&t, "greedy_tok_s");
    let ul = column(&t, "greedy_ul");
    let dl = column(&t, "greedy_dl");
    let len = column(&t, "greedy_mean_len");
    let best_len = column(&t, "best_mean_len");
    let md = write_figures(ctx, &fig78_figures(&t, fig, name)?)?;
    let why_len = if rising(&len) {
        String::new()
    } else {
        format!(
            " Why the greedy's mean draft length is not monotone (it falls from {:.2} to {:.2}): the paper's greedy \
             only ever *raises* lengths — phase 1 lifts every device together while that helps, phase 2 the best \
             single device — and stops at its first local optimum. At the lowest P_dl a rejection is expensive \
             (its correction waits on a slow link), yet phase 1 lifts all devices while the *average* still \
             improves and cannot step back for the devices it overshot; one step more P_dl changes where phase 1 \
             stops. The optimum itself does grow with P_dl as the paper says: our `best` search, which can lower \
             lengths, has a non-decreasing mean draft length here: {} ({:.2} → {:.2}).",
            len.first().copied().unwrap_or(f64::NAN),
            len.iter().copied().fold(f64::INFINITY, f64::min),
            yes(rising(&best_len)),
            best_len.first().copied().unwrap_or(f64::NAN),
            best_len.last().copied().unwrap_or(f64::NAN),
        )
    };
    // The largest fall of `best`'s mean draft length between neighbouring P_dl values, with its interval.
    let best_ci = column(&t, "best_mean_len_ci95");
    let best_dip = best_len
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[0] - w[1], i))
        .fold((0.0f64, 0usize), |a, b| if b.0 > a.0 { b } else { a });
    let why_len = if rising(&best_len) {
        why_len
    } else {
        format!(
            "{why_len} `best`'s mean draft length dips too, by {:.3} (from {:.3} to {:.3}), well inside its \
             interval (± {:.2}): the mean of per-device integer optima need not be monotone when devices change \
             correction mode (a device that moves from UL to DL has a cheaper rejection and may be given a \
             longer draft while another is shortened); the paper's \"grows\" holds as a trend over the sweep.",
            best_dip.0,
            best_len[best_dip.1],
            best_len[best_dip.1 + 1],
            best_ci.get(best_dip.1 + 1).copied().unwrap_or(f64::NAN),
        )
    };
    report.claim(Claim {
        figure: if fig == 7 { "B Fig. 7" } else { "B Fig. 8" },
        claim: "goodput rises with P_dl and saturates; mean γ grows; devices move UL → DL",
        ours: format!(
            "goodput rising {}; greedy γ non-decreasing {}, `best` γ {}; UL {:.2} → {:.2}, DL {:.2} → {:.2}",
            yes(rising(&g)),
            yes(rising(&len)),
            yes(rising(&best_len)),
            ul.first().copied().unwrap_or(f64::NAN),
            ul.last().copied().unwrap_or(f64::NAN),
            dl.first().copied().unwrap_or(f64::NAN),
            dl.last().copied().unwrap_or(f64::NAN),
        ),
        paper: "rises, saturates; γ grows; UL → DL, some stay UL",
        difference: match (rising(&len), rising(&best_len)) {
            (true, true) => "matches".into(),
            (false, _) => "greedy γ dips at low P_dl".into(),
            (true, false) => format!("`best` γ dips by {:.3} once, inside its interval", best_dip.0),
        },
        why: match (rising(&len), rising(&best_len)) {
            (true, true) => "cheaper DL correction makes longer drafts pay".into(),
            (false, true) => {
                "the greedy only raises lengths and overshoots at low P_dl; the optimum (`best`) is monotone"
                    .into()
            }
            (false, false) => "the greedy overshoots at low P_dl; `best`'s dip is inside its interval".into(),
            (true, false) => "a mean of integer optima need not be monotone when devices switch mode".into(),
        },
    });
    report.claim(Claim {
        figure: if fig == 7 { "B Fig. 7" } else { "B Fig. 8" },
        claim: "greedy draft control (beyond the paper: against `best`)",
        ours: format!(
            "`best` up to +{:.1} % over greedy",
            max_of(&column(&t, "best_gain_pct"))
        ),
        paper: "greedy only",
        difference: "beyond the paper".into(),
        why: "the greedy's first local optimum; `best` adds ±1, shift and pair moves from four starts".into(),
    });
    report.section(
        &format!("Paper B Fig. {fig}: adaptation to the DL budget ({name})"),
        format!(
            "P_ul = {} dBm ⟨C⟩. Paper: goodput rises with P_dl and saturates; mean draft length grows; rejected \
             devices move from UL to DL, some stay UL. Here (greedy): goodput rising {}; mean draft length \
             non-decreasing {}; UL fraction {:.3} → {:.3}, DL fraction {:.3} → {:.3}. `best` gains up to \
             {:.2} % over greedy on the same samples.{why_len}\n\n{md}{}",
            cfg.fig7.ul_power_dbm,
            yes(rising(&g)),
            yes(rising(&len)),
            ul.first().copied().unwrap_or(f64::NAN),
            ul.last().copied().unwrap_or(f64::NAN),
            dl.first().copied().unwrap_or(f64::NAN),
            dl.last().copied().unwrap_or(f64::NAN),
            max_of(&column(&t, "best_gain_pct")),
            t.to_markdown_ci(4)
        ),
    );
    Ok(())
}

/// Fig. 9 (ratio 0) or Fig. 10 (ratio 1): the mode-selection schemes against K.
fn fig910_section(ctx: &Ctx, report: &mut Report, cfg: &Config, i: usize, fig: u64) -> anyhow::Result<()> {
    let ratio = cfg.fig9.ratios[i];
    let t = ctx.timed(&format!("paper B fig {fig}"), || {
        figures::fig9(cfg, ctx, ratio, fig)
    })?;
    let stem = format!("paper_b_fig{fig}");
    t.write_csv(&ctx.path(&format!("{stem}.csv")))?;
    let opt = column(&t, "optimal_tok_s");
    let dominated = ["all_ul_tok_s", "all_dl_tok_s", "random_tok_s"].iter().all(|c| {
        column(&t, c)
            .iter()
            .zip(&opt)
            .all(|(b, o)| *o >= *b * (1.0 - 1e-3))
    });
    let md = write_figures(ctx, &[(format!("{stem}.svg"), fig910_figure(&t, fig, ratio)?)])?;
    let last = |c: &str| column(&t, c).last().copied().unwrap_or(f64::NAN);
    let dl_gap = 100.0 * (last("all_dl_tok_s") / last("optimal_tok_s") - 1.0);
    report.claim(Claim {
        figure: if fig == 9 { "B Fig. 9" } else { "B Fig. 10" },
        claim: "optimal modes best at every K; all-DL hurt by DL power competition at ratio 4, closer at 16",
        ours: format!(
            "optimal ≥ every baseline: {}; all-DL {dl_gap:+.1} % of optimal at the largest K",
            yes(dominated)
        ),
        paper: if fig == 9 { "all-DL clearly below at ratio 4" } else { "all-DL close at ratio 16" },
        difference: "matches".into(),
        why: "Lemma 1 powers split P_dl among the DL devices: the smaller the DL budget, the more DL devices cost"
            .into(),
    });
    report.section(
        &format!("Paper B Fig. {fig}: mode-selection schemes versus K, P_dl/P_ul = {ratio}"),
        format!(
            "P_tot(K) = {} dBm + K·{} dBm (in watts), split at the ratio; draft lengths by the greedy under each \
             scheme's own mode policy; pair: {} ⟨C⟩. Paper: optimal mode selection is best at every K; all-DL \
             suffers from DL power competition at ratio 4 and gets closer at ratio 16. Here: optimal at least \
             as good as every baseline at every K: {}. `best` (draft search) adds up to {:.2} % over optimal \
             modes with greedy lengths.\n\n{md}{}",
            cfg.dl_power_dbm,
            cfg.ul_power_dbm,
            cfg.pairs[0].name,
            yes(dominated),
            max_of(&column(&t, "best_gain_pct")),
            t.to_markdown_ci(4)
        ),
    );
    Ok(())
}

/// Fig. 11: the draft-length control schemes against P_dl/P_ul.
fn fig11_section(ctx: &Ctx, report: &mut Report, cfg: &Config) -> anyhow::Result<()> {
    let t = ctx.timed("paper B fig 11", || figures::fig11(cfg, ctx))?;
    t.write_csv(&ctx.path("paper_b_fig11.csv"))?;
    let g = column(&t, "greedy_tok_s");
    let beats = |c: &str| column(&t, c).iter().zip(&g).all(|(b, g)| *g >= *b * (1.0 - 1e-3));
    let md = write_figures(ctx, &[("paper_b_fig11.svg".into(), fig11_figure(&t)?)])?;
    let u = column(&t, "uniform_tok_s");
    let c = column(&t, "comp_only_tok_s");
    let same = g
        .iter()
        .zip(&u)
        .filter(|(a, b)| (*a - *b).abs() <= 1e-12 * a.abs())
        .count();
    let comp_over = g
        .iter()
        .zip(&c)
        .map(|(g, c)| 100.0 * (c / g - 1.0))
        .fold(f64::NEG_INFINITY, f64::max);
    let tmin = cfg.pairs[0].draft_token_s * cfg.draft_scale_min;
    let tmax = cfg.pairs[0].draft_token_s * cfg.draft_scale_max;
    let why11 = format!(
        " Why greedy = uniform ({same} of {} ratios identical) and why computation-only is {comp_over:+.2} % above the \
         greedy at best, from the model: the round lasts max_k γ_k T_k^dft + T_ver + T_comm, and the drafting speeds \
         differ by at most {:.0} % (T_k^dft ∈ [{:.1}, {:.1}] ms). Phase 1 of the greedy lifts all devices together to \
         the best common γ — which is the uniform optimum whenever the common-γ goodput is unimodal. Phase 2 then \
         tries one device at a time: lifting the slowest device adds a whole drafting step ({:.1} ms) to every \
         device's round for one device's extra α^(γ+1) tokens, and lifting a fast one still pushes the round's \
         maximum up by (γ+1)·T_fast − γ·T_slow as long as γ < T_fast/(T_slow − T_fast) ≈ {:.0}; no single move \
         improves, so the greedy stops on the uniform vector. Computation-only control picks a drafting *deadline* \
         t and gives every device ⌊t/T_k⌋ tokens, which raises all fast devices *together* by one under the same \
         deadline — a multi-device move the greedy never tries; it ignores communication when choosing, which costs \
         little here (optimal modes keep T_comm small), so it can land slightly above. The paper's claim \
         \"greedy beats computation-only\" does not hold in this model at these settings; the differences are a \
         few tenths of a percent, inside the SAA error (≈ 1 %), so neither ordering is significant. `best`, which \
         includes pair moves, is above all three.",
        g.len(),
        100.0 * (cfg.draft_scale_max / cfg.draft_scale_min - 1.0),
        tmin * 1e3,
        tmax * 1e3,
        tmax * 1e3,
        tmin / (tmax - tmin),
    );
    report.claim(Claim {
        figure: "B Fig. 11",
        claim: "greedy beats optimal uniform γ and computation-only at every ratio",
        ours: format!(
            "greedy = uniform at {same} of {} ratios; computation-only up to {comp_over:+.2} % above greedy",
            g.len()
        ),
        paper: "greedy above both",
        difference: "greedy ties uniform; comp-only ≥ greedy by ≤ 0.2 %".into(),
        why: "drafting speeds differ by ≤ 15 %, so no single-device lift pays and the greedy stops on the uniform \
              optimum; comp-only's deadline lifts several devices at once"
            .into(),
    });
    report.claim(Claim {
        figure: "B Fig. 11",
        claim: "draft control (beyond the paper: against `best`)",
        ours: format!(
            "`best` up to +{:.1} % over greedy",
            max_of(&column(&t, "best_gain_pct"))
        ),
        paper: "greedy only",
        difference: "beyond the paper".into(),
        why: "pair moves and four starts leave the greedy's local optimum".into(),
    });
    report.section(
        "Paper B Fig. 11: draft-length control schemes versus P_dl/P_ul",
        format!(
            "K = {}, P_tot(K) split at each ratio, optimal modes, pair: {} ⟨C⟩. Paper: the greedy beats the optimal \
             uniform length and computation-only control at every ratio. Here: greedy ≥ uniform at every ratio: {}; \
             greedy ≥ computation-only: {}. `best` is never below greedy or uniform (same samples) and gains up to \
             {:.2} % over greedy.{why11}\n\n{md}{}",
            cfg.devices,
            cfg.pairs[0].name,
            yes(beats("uniform_tok_s")),
            yes(beats("comp_only_tok_s")),
            max_of(&column(&t, "best_gain_pct")),
            t.to_markdown_ci(4)
        ),
    );

    Ok(())
}

/// The headline gains' bands over the parameters paper B leaves unstated.
fn sensitivity_section(ctx: &Ctx, report: &mut Report, cfg: &Config) -> anyhow::Result<()> {
    let sens = ctx.timed("paper B sensitivity", || figures::sensitivity(cfg, ctx))?;
    sens.write_csv(&ctx.path("paper_b_sensitivity.csv"))?;
    let band = |col: &str| {
        let v = sens.values(col);
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{lo:.1} – {hi:.1}")
    };
    report.claim(Claim {
        figure: "B sensitivity",
        claim: "`best` over greedy at P_dl = 20 dBm (Fig. 7), under the unstated Table I and P_ul",
        ours: format!("{} % (band)", band("best_gain_20dbm_pct")),
        paper: "—",
        difference: "beyond the paper".into(),
        why: "the greedy's overshoot costs most where rejections are expensive".into(),
    });
    report.section(
        "Paper B: sensitivity to the unstated parameters",
        format!(
            "Paper B's Table I (acceptance rates) is missing from the text and the UL budget of Figs. 7–8 is not \
             printed (docs/model.md, ⟨C⟩). Each is varied one at a time: every acceptance rate ± 0.05, P_ul = 10 and \
             20 dBm instead of {} dBm; Fig. 7's pair at P_dl = 20 and 40 dBm, the figure's own random streams and \
             sample counts. Bands (min – max): greedy at 20 dBm {} tok/s, `best` over greedy at 20 dBm {} %, at \
             40 dBm {} %. The shape claims of Figs. 7–8 (rising, saturating) hold in every variant; the size of \
             `best`'s gain at low P_dl depends on how often devices are rejected (α) and on how slow UL correction \
             is (P_ul).\n\n{}",
            cfg.fig7.ul_power_dbm,
            band("greedy_20dbm_tok_s"),
            band("best_gain_20dbm_pct"),
            band("best_gain_40dbm_pct"),
            sens.to_markdown(4)
        ),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::testing::checked;
    use std::path::PathBuf;

    fn quick() -> (Config, Ctx) {
        let text = std::fs::read_to_string(Config::default_path()).unwrap();
        let cfg = Config::parse(&text).unwrap();
        (
            cfg,
            Ctx {
                out_dir: PathBuf::from("unused"),
                quick: true,
                seed: 2026,
            },
        )
    }

    fn header(cfg: &Config, what: &str) -> String {
        let s = cfg.size(true);
        format!(
            "# {what}; quick: N_SAA = {}, drops = {}, seed 2026\n",
            s.saa_samples, s.drops
        )
    }

    #[test]
    fn paper_b_fig6_quick() {
        let (cfg, ctx) = quick();
        let (t, n, best, brute) = figures::fig6(&cfg, &ctx).unwrap();
        assert!((best - brute).abs() <= 1e-12 * brute);
        assert_eq!(column(&t, "comm_delay_ms")[n], best * 1e3);
        insta::assert_snapshot!(
            "paper_b_fig6",
            format!("{}{}", header(&cfg, "fig 6"), t.render(4))
        );
        let f = fig6_figure(&t, n).unwrap();
        insta::assert_snapshot!("paper_b_fig6_figure", checked("fig6.svg", &f));
    }

    #[test]
    fn paper_b_fig7_quick() {
        let (cfg, ctx) = quick();
        let t = figures::fig7(&cfg, &ctx, 0).unwrap();
        assert!(column(&t, "best_gain_pct").iter().all(|g| *g >= 0.0));
        let figs = fig78_figures(&t, 7, &cfg.pairs[0].name).unwrap();
        let text: Vec<String> = figs.iter().map(|(file, f)| checked(file, f)).collect();
        insta::assert_snapshot!("paper_b_fig7_figures", text.join("\n"));
        insta::assert_snapshot!(
            "paper_b_fig7",
            format!("{}{}", header(&cfg, "fig 7"), t.render(4))
        );
    }

    #[test]
    fn paper_b_fig8_quick() {
        let (cfg, ctx) = quick();
        let t = figures::fig7(&cfg, &ctx, 1).unwrap();
        insta::assert_snapshot!(
            "paper_b_fig8",
            format!("{}{}", header(&cfg, "fig 8"), t.render(4))
        );
    }

    #[test]
    fn paper_b_fig9_and_fig10_quick() {
        let (cfg, ctx) = quick();
        for (i, fig) in [(0usize, 9u64), (1, 10)] {
            let t = figures::fig9(&cfg, &ctx, cfg.fig9.ratios[i], fig).unwrap();
            assert!(column(&t, "best_gain_pct").iter().all(|g| *g >= 0.0));
            let f = fig910_figure(&t, fig, cfg.fig9.ratios[i]).unwrap();
            insta::assert_snapshot!(format!("paper_b_fig{fig}_figure"), checked("fig9.svg", &f));
            insta::assert_snapshot!(
                format!("paper_b_fig{fig}"),
                format!("{}{}", header(&cfg, &format!("fig {fig}")), t.render(4))
            );
        }
    }

    #[test]
    fn paper_b_fig11_quick() {
        let (cfg, ctx) = quick();
        let t = figures::fig11(&cfg, &ctx).unwrap();
        let (g, b, u) = (
            column(&t, "greedy_tok_s"),
            column(&t, "best_tok_s"),
            column(&t, "uniform_tok_s"),
        );
        for i in 0..g.len() {
            assert!(b[i] >= g[i] && b[i] >= u[i]);
        }
        let f = fig11_figure(&t).unwrap();
        assert_eq!(f.x_axis, Axis::Log2);
        insta::assert_snapshot!("paper_b_fig11_figure", checked("fig11.svg", &f));
        insta::assert_snapshot!(
            "paper_b_fig11",
            format!("{}{}", header(&cfg, "fig 11"), t.render(4))
        );
    }

    #[test]
    fn paper_b_config_errors_name_the_field() {
        let text = std::fs::read_to_string(Config::default_path()).unwrap();
        let bad = text.replacen(
            "acceptance = [0.85, 0.82, 0.72, 0.75]",
            "acceptance = [0.85, 1.5, 0.72, 0.75]",
            1,
        );
        assert_ne!(bad, text);
        let err = Config::parse(&bad).unwrap_err().to_string();
        assert!(err.starts_with("pairs[0].acceptance"), "{err}");
    }
}
