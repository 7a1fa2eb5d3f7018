//! The one figure style of the reproduction (plotters, SVG): every chart is a [`Figure`] (lines, steps, error bars)
//! or a [`BarFigure`], drawn with a colour-blind-safe palette, a marker shape and dash pattern per series (so
//! coinciding series stay visible), 95 % confidence intervals where a point is a Monte-Carlo mean, integer ticks on
//! integer axes, log axes for geometric sweeps, the legend below the plot area (never over the data), and caption
//! notes saying which series coincide. Legend labels come from one table ([`label`]).

use anyhow::{Context, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// One point of a series: a Monte-Carlo mean carries the half-width of its 95 % confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// x value (data units; a log axis takes the value itself, not its logarithm).
    pub x: f64,
    /// y value.
    pub y: f64,
    /// Half-width of the 95 % confidence interval of `y`, when `y` is a Monte-Carlo mean.
    pub ci: Option<f64>,
}

/// How a series joins its points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Straight segments (a quantity that varies continuously with x).
    Lines,
    /// Steps that change half-way between samples (an integer-valued quantity, e.g. an optimal draft length).
    Steps,
}

/// One named series.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label (from [`label`]).
    pub label: String,
    /// Points in x order.
    pub points: Vec<Point>,
    /// How the points are joined.
    pub join: Join,
}

impl Series {
    /// A series of straight segments from (x, y, ci) triples.
    pub fn lines(
        label: impl Into<String>,
        points: impl IntoIterator<Item = (f64, f64, Option<f64>)>,
    ) -> Self {
        Series {
            label: label.into(),
            points: points.into_iter().map(|(x, y, ci)| Point { x, y, ci }).collect(),
            join: Join::Lines,
        }
    }
}

/// The kind of an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// Linear with decimal ticks.
    Linear,
    /// Linear with integer ticks only (counts, draft lengths, device numbers).
    Integer,
    /// Base-2 logarithmic with ticks at powers of two (geometric sweeps such as power ratios 1–256).
    Log2,
}

/// A vertical marker line with a label (e.g. the optimum n* of paper B Fig. 6).
#[derive(Debug, Clone, PartialEq)]
pub struct Marker {
    /// Where.
    pub x: f64,
    /// What it marks.
    pub label: String,
}

/// A line/step chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// Title (first caption line).
    pub title: String,
    /// x-axis description with unit.
    pub x_label: String,
    /// y-axis description with unit.
    pub y_label: String,
    /// x-axis kind.
    pub x_axis: Axis,
    /// y-axis kind.
    pub y_axis: Axis,
    /// The series, drawn in order.
    pub series: Vec<Series>,
    /// Vertical markers.
    pub markers: Vec<Marker>,
    /// Extra caption notes (the notes on coinciding series are added by [`Figure::all_notes`]).
    pub notes: Vec<String>,
    /// What the error bars are, said in the caption when a point has one.
    pub ci_note: String,
}

/// One bar: its value and the half-width of its 95 % confidence interval, when it is a Monte-Carlo mean.
pub type Bar = (f64, Option<f64>);

/// A grouped bar chart: one group of bars per category, one bar (with its confidence interval) per series.
#[derive(Debug, Clone, PartialEq)]
pub struct BarFigure {
    /// Title.
    pub title: String,
    /// x-axis description.
    pub x_label: String,
    /// y-axis description with unit.
    pub y_label: String,
    /// Category names along x.
    pub categories: Vec<String>,
    /// (legend label, one (value, 95 % half-width) per category).
    pub groups: Vec<(String, Vec<Bar>)>,
    /// Extra caption notes.
    pub notes: Vec<String>,
}

/// The legend label of a table column or scheme key: the one table of human series names. Keys that are not in
/// the table are a bug in the figure code (every drawn series is named here), reported as an error.
pub fn label(key: &str) -> anyhow::Result<&'static str> {
    const LABELS: &[(&str, &str)] = &[
        // Paper A.
        ("theory", "theory (eq. 19, mean over fading blocks)"),
        ("empirical", "Monte Carlo (Σ tokens / Σ time)"),
        ("continuous_opt_len", "continuous optimum (Prop. 1)"),
        ("integer_opt_len", "integer optimum (Theorem 1)"),
        ("P2P-SPIN", "P2P-SPIN"),
        ("Cen-SPIN", "Cen-SPIN"),
        ("Multi-SPIN (Alg. 1)", "Multi-SPIN, Algorithm 1 (paper)"),
        ("Multi-SPIN exact (ours)", "Multi-SPIN, exact planner (ours)"),
        ("Fixed BW&L", "Fixed BW&L"),
        ("Uni-BW", "Uni-BW"),
        ("Homo", "Homo"),
        ("Hete (Alg. 1)", "Hete, Algorithm 1 (paper)"),
        ("Exact (ours)", "Hete, exact planner (ours)"),
        // Paper B.
        ("ul_delay_ms", "UL delay of the n UL devices"),
        ("dl_delay_ms", "DL delay of the others (Lemma 1 powers)"),
        ("comm_delay_ms", "communication delay (max of the two)"),
        ("greedy_tok_s", "greedy draft control (paper)"),
        ("best_tok_s", "best draft search (ours)"),
        ("greedy_mean_len", "greedy draft control (paper)"),
        ("best_mean_len", "best draft search (ours)"),
        ("greedy_accepted", "all accepted, greedy"),
        ("greedy_ul", "UL correction, greedy"),
        ("greedy_dl", "DL correction, greedy"),
        ("best_accepted", "all accepted, best"),
        ("best_ul", "UL correction, best"),
        ("best_dl", "DL correction, best"),
        ("optimal_tok_s", "optimal modes (paper)"),
        ("all_ul_tok_s", "all UL"),
        ("all_dl_tok_s", "all DL"),
        ("random_tok_s", "random modes"),
        ("best_modes_tok_s", "optimal modes + best draft search (ours)"),
        ("uniform_tok_s", "optimal uniform γ"),
        ("comp_only_tok_s", "computation-only control"),
        // Beyond the papers.
        ("paper_a", "paper A only (distributions, exact L + OFDMA)"),
        ("paper_b", "paper B only (pairs, best γ, equal shares, modes)"),
        ("unified_pair", "unified, pairs only (joint L + OFDMA + modes)"),
        ("unified", "unified (payload chosen per device)"),
    ];
    LABELS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .ok_or_else(|| anyhow!("no legend label for series `{key}` (add it to plot::label)"))
}

/// Width of every figure in pixels.
const WIDTH: u32 = 960;
/// Height of the title and plot area; the legend and notes add rows below.
const PLOT_HEIGHT: u32 = 540;
/// Height of one legend or note row.
const ROW: u32 = 22;

fn color(i: usize) -> RGBColor {
    // Okabe–Ito, colour-blind safe.
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 0, 0),
        RGBColor(160, 140, 20),
    ];
    PALETTE[i % PALETTE.len()]
}

/// Dash (on, off) lengths in pixels of series `i`; (0, 0) is solid.
fn dash(i: usize) -> (u32, u32) {
    [(0, 0), (10, 5), (3, 4), (14, 4), (6, 3), (2, 6)][i % 6]
}

/// Draws series `i`'s marker at `c`: shapes alternate filled and hollow and grow with i, so a later series drawn
/// on an earlier one leaves both visible.
fn marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    i: usize,
    c: (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let col = color(i);
    let s = 3 + 2 * (i % 4) as i32;
    let (x, y) = c;
    match i % 4 {
        0 => area.draw(&Circle::new(c, s, col.filled())),
        1 => area.draw(&Rectangle::new(
            [(x - s, y - s), (x + s, y + s)],
            col.stroke_width(2),
        )),
        2 => area.draw(&TriangleMarker::new(c, s, col.filled())),
        _ => area.draw(&Cross::new(c, s, col.stroke_width(2))),
    }
}

/// Pixel geometry of a drawn figure: where the data points and the legend box landed (the legend test checks them).
#[derive(Debug, Clone, Default)]
pub struct Layout {
    /// The plotting area (x0, y0, x1, y1).
    pub plot: (i32, i32, i32, i32),
    /// The legend box (x0, y0, x1, y1).
    pub legend: (i32, i32, i32, i32),
    /// Every data point's pixel, with the top and bottom of its interval when it has one.
    pub points: Vec<(i32, i32)>,
}

impl Layout {
    /// Whether any data point (or interval end) lies inside the legend box.
    #[cfg_attr(not(test), allow(dead_code, reason = "the legend tests check it"))]
    pub fn legend_hits_data(&self) -> bool {
        let (x0, y0, x1, y1) = self.legend;
        self.points
            .iter()
            .any(|&(x, y)| x >= x0 && x <= x1 && y >= y0 && y <= y1)
    }
}

/// A number for a tick or a data dump: integers without a fraction, otherwise up to four significant digits.
pub fn num(v: f64) -> String {
    let s = crate::table::format_sig(v, 4);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    }
}

/// Which pairs of series are identical at every point (same x and y to 1e-9 relative): the caption says so, since
/// one is drawn over the other.
fn coinciding(series: &[Series]) -> Vec<String> {
    let same = |a: &Series, b: &Series| {
        a.points.len() == b.points.len()
            && !a.points.is_empty()
            && a.points
                .iter()
                .zip(&b.points)
                .all(|(p, q)| p.x == q.x && (p.y - q.y).abs() <= 1e-9 * p.y.abs().max(q.y.abs()).max(1e-300))
    };
    let mut notes = Vec::new();
    let mut taken = vec![false; series.len()];
    for i in 0..series.len() {
        if taken[i] {
            continue;
        }
        let group: Vec<usize> = (i + 1..series.len())
            .filter(|&j| same(&series[i], &series[j]))
            .collect();
        if group.is_empty() {
            continue;
        }
        let mut names = vec![format!("“{}”", series[i].label)];
        for &j in &group {
            taken[j] = true;
            names.push(format!("“{}”", series[j].label));
        }
        let list = match names.len() {
            2 => format!("{} and {}", names[0], names[1]),
            _ => format!(
                "{} and {}",
                names[..names.len() - 1].join(", "),
                names[names.len() - 1]
            ),
        };
        notes.push(format!(
            "{list} are identical at every point (drawn over each other; the markers differ)."
        ));
    }
    // Pairs that coincide at some points only (at least two, not all): say where.
    let close =
        |p: &Point, q: &Point| p.x == q.x && (p.y - q.y).abs() <= 1e-9 * p.y.abs().max(q.y.abs()).max(1e-300);
    for i in 0..series.len() {
        for j in i + 1..series.len() {
            let (a, b) = (&series[i], &series[j]);
            if a.points.len() != b.points.len() || same(a, b) {
                continue;
            }
            let at: Vec<String> = a
                .points
                .iter()
                .zip(&b.points)
                .filter(|(p, q)| close(p, q))
                .map(|(p, _)| num(p.x))
                .collect();
            if at.len() >= 2 {
                notes.push(format!(
                    "“{}” and “{}” coincide at x = {}.",
                    a.label,
                    b.label,
                    at.join(", ")
                ));
            }
        }
    }
    notes
}

/// The caption note of a figure whose points are means over independent realisations.
pub const CI_NOTE: &str =
    "Error bars: 95 % confidence intervals of the mean over independent realisations (Student t).";

impl Figure {
    /// A figure with no series yet.
    pub fn new(title: impl Into<String>, x_label: impl Into<String>, y_label: impl Into<String>) -> Self {
        Figure {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x_axis: Axis::Linear,
            y_axis: Axis::Linear,
            series: Vec::new(),
            markers: Vec::new(),
            notes: Vec::new(),
            ci_note: CI_NOTE.to_owned(),
        }
    }

    /// Every caption note: the figure's own, the interval note when a point has an interval, and one per group of
    /// coinciding series.
    pub fn all_notes(&self) -> Vec<String> {
        let mut n = self.notes.clone();
        if self
            .series
            .iter()
            .any(|s| s.points.iter().any(|p| p.ci.is_some()))
        {
            n.push(self.ci_note.clone());
        }
        n.extend(coinciding(&self.series));
        n
    }

    /// The figure's rendered data as text (what the snapshot tests keep): axes, series, points with intervals,
    /// markers and notes.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "only the snapshot tests render figure data")
    )]
    pub fn data_text(&self) -> String {
        let mut out = format!(
            "{}\nx: {} ({:?})\ny: {} ({:?})\n",
            self.title, self.x_label, self.x_axis, self.y_label, self.y_axis
        );
        for s in &self.series {
            let _ = writeln!(out, "series {:?} ({:?})", s.label, s.join);
            for p in &s.points {
                let ci = p.ci.map(|c| format!(" ± {}", num(c))).unwrap_or_default();
                let _ = writeln!(out, "  {} {}{ci}", num(p.x), num(p.y));
            }
        }
        for m in &self.markers {
            let _ = writeln!(out, "marker x = {}: {}", num(m.x), m.label);
        }
        for n in self.all_notes() {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    fn tx(&self, x: f64) -> f64 {
        if self.x_axis == Axis::Log2 { x.log2() } else { x }
    }

    /// Draws the figure as an SVG file at `path` and returns where its points and legend landed.
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<Layout> {
        prepare(path)?;
        let notes = self.all_notes();
        let height = PLOT_HEIGHT + ROW * (self.series.len() + notes.len()) as u32 + 16;
        let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
        let layout = self
            .draw(&root, &notes)
            .map_err(|e| anyhow!("drawing {}: {e}", path.display()))?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
        Ok(layout)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        notes: &[String],
    ) -> Result<Layout, DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(PLOT_HEIGHT);
        // Ranges from the data and its intervals, padded; a Log2 axis works on log2(x).
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| self.tx(p.x)))
            .chain(self.markers.iter().map(|m| self.tx(m.x)))
            .collect();
        let ys: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| {
                s.points
                    .iter()
                    .flat_map(|p| [p.y - p.ci.unwrap_or(0.0), p.y + p.ci.unwrap_or(0.0)])
            })
            .collect();
        let (x0, x1) = padded(&xs, 0.03);
        let (y0, y1) = padded(&ys, 0.06);
        let mut chart = ChartBuilder::on(&top)
            .caption(&self.title, ("sans-serif", 20))
            .margin(14)
            .margin_top(8)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let x_axis = self.x_axis;
        let y_axis = self.y_axis;
        let x_fmt = move |v: &f64| tick(*v, x_axis);
        let y_fmt = move |v: &f64| tick(*v, y_axis);
        chart
            .configure_mesh()
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .x_labels(tick_count(x0, x1, x_axis))
            .y_labels(tick_count(y0, y1, y_axis))
            .x_label_formatter(&x_fmt)
            .y_label_formatter(&y_fmt)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let mut layout = Layout::default();
        let (rx, ry) = chart.plotting_area().get_pixel_range();
        layout.plot = (rx.start, ry.start, rx.end, ry.end);
        for m in &self.markers {
            let x = self.tx(m.x);
            let a = chart.backend_coord(&(x, y0));
            let b = chart.backend_coord(&(x, y1));
            root.draw(&PathElement::new(vec![a, b], BLACK.mix(0.6).stroke_width(1)))?;
            // The label on the side of the line with room for it (about 7 px per character).
            let width = 7 * m.label.chars().count() as i32;
            let left = if a.0 + 6 + width > layout.plot.2 {
                a.0 - 6 - width
            } else {
                a.0 + 6
            };
            root.draw(&Text::new(
                m.label.clone(),
                (left, b.1 + 6),
                ("sans-serif", 14).into_font().color(&BLACK),
            ))?;
        }
        for (i, s) in self.series.iter().enumerate() {
            let col = color(i);
            let pix: Vec<(i32, i32)> = s
                .points
                .iter()
                .map(|p| chart.backend_coord(&(self.tx(p.x), p.y)))
                .collect();
            let path = match s.join {
                Join::Lines => pix.clone(),
                Join::Steps => steps(&pix),
            };
            draw_path(root, &path, i, col)?;
            for (p, &c) in s.points.iter().zip(&pix) {
                if let Some(ci) = p.ci {
                    let lo = chart.backend_coord(&(self.tx(p.x), p.y - ci));
                    let hi = chart.backend_coord(&(self.tx(p.x), p.y + ci));
                    root.draw(&PathElement::new(vec![lo, hi], col.stroke_width(1)))?;
                    for e in [lo, hi] {
                        root.draw(&PathElement::new(
                            vec![(e.0 - 4, e.1), (e.0 + 4, e.1)],
                            col.stroke_width(1),
                        ))?;
                    }
                    layout.points.extend([lo, hi]);
                }
                layout.points.push(c);
                marker(root, i, c)?;
            }
        }
        layout.legend = legend(
            &bottom,
            &self.series.iter().map(|s| s.label.clone()).collect::<Vec<_>>(),
            true,
            notes,
        )?;
        Ok(layout)
    }
}

impl BarFigure {
    /// Every caption note (the figure's own, then the interval note).
    pub fn all_notes(&self) -> Vec<String> {
        let mut n = self.notes.clone();
        if self.groups.iter().any(|g| g.1.iter().any(|v| v.1.is_some())) {
            n.push(CI_NOTE.to_owned());
        }
        n
    }

    /// The rendered data as text (snapshot tests).
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "only the snapshot tests render figure data")
    )]
    pub fn data_text(&self) -> String {
        let mut out = format!("{}\nx: {}\ny: {}\n", self.title, self.x_label, self.y_label);
        for (label, values) in &self.groups {
            let _ = writeln!(out, "bars {label:?}");
            for (cat, (v, ci)) in self.categories.iter().zip(values) {
                let ci = ci.map(|c| format!(" ± {}", num(c))).unwrap_or_default();
                let _ = writeln!(out, "  {cat}: {}{ci}", num(*v));
            }
        }
        for n in self.all_notes() {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    /// Draws the bar chart as an SVG file at `path` (bars from zero, so their heights compare).
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<Layout> {
        prepare(path)?;
        let notes = self.all_notes();
        let height = PLOT_HEIGHT + ROW * (self.groups.len() + notes.len()) as u32 + 16;
        let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
        let layout = self
            .draw(&root, &notes)
            .map_err(|e| anyhow!("drawing {}: {e}", path.display()))?;
        root.present()
            .map_err(|e| anyhow!("writing {}: {e}", path.display()))?;
        Ok(layout)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        notes: &[String],
    ) -> Result<Layout, DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(PLOT_HEIGHT);
        let n_cat = self.categories.len().max(1);
        let n_grp = self.groups.len().max(1);
        let top_value = self
            .groups
            .iter()
            .flat_map(|g| g.1.iter().map(|(v, ci)| v + ci.unwrap_or(0.0)))
            .fold(0.0f64, f64::max);
        let y1 = if top_value > 0.0 { top_value * 1.08 } else { 1.0 };
        let mut chart = ChartBuilder::on(&top)
            .caption(&self.title, ("sans-serif", 20))
            .margin(14)
            .margin_top(8)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(-0.5f64..(n_cat as f64 - 0.5), 0f64..y1)?;
        let categories = self.categories.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n_cat)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    categories.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|v| num(*v))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .bold_line_style(BLACK.mix(0.12))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let mut layout = Layout::default();
        let (rx, ry) = chart.plotting_area().get_pixel_range();
        layout.plot = (rx.start, ry.start, rx.end, ry.end);
        let width = 0.8 / n_grp as f64;
        for (g, (_, values)) in self.groups.iter().enumerate() {
            let col = color(g);
            for (j, &(v, ci)) in values.iter().enumerate() {
                let left = j as f64 - 0.4 + g as f64 * width;
                let right = left + width * 0.9;
                chart.draw_series(std::iter::once(Rectangle::new(
                    [(left, 0.0), (right, v)],
                    col.filled(),
                )))?;
                let mid = (left + right) / 2.0;
                layout.points.push(chart.backend_coord(&(mid, v)));
                if let Some(ci) = ci {
                    let lo = chart.backend_coord(&(mid, v - ci));
                    let hi = chart.backend_coord(&(mid, v + ci));
                    root.draw(&PathElement::new(vec![lo, hi], BLACK.stroke_width(1)))?;
                    for e in [lo, hi] {
                        root.draw(&PathElement::new(
                            vec![(e.0 - 5, e.1), (e.0 + 5, e.1)],
                            BLACK.stroke_width(1),
                        ))?;
                    }
                    layout.points.extend([lo, hi]);
                }
            }
        }
        let labels: Vec<String> = self.groups.iter().map(|g| g.0.clone()).collect();
        layout.legend = legend(&bottom, &labels, false, notes)?;
        Ok(layout)
    }
}

/// The legend (one row per entry) and the caption notes below the plot area; returns the legend box in pixels.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    labels: &[String],
    lines: bool,
    notes: &[String],
) -> Result<(i32, i32, i32, i32), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x0, y0) = area.get_base_pixel();
    let (left, top) = (x0 + 92, y0 + 4);
    let rows = labels.len() as i32;
    let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0) as i32;
    let box_ = (left, top, left + 64 + 8 * widest, top + ROW as i32 * rows + 4);
    if rows > 0 {
        area.draw(&Rectangle::new(
            [(box_.0 - x0, box_.1 - y0), (box_.2 - x0, box_.3 - y0)],
            BLACK.mix(0.5).stroke_width(1),
        ))?;
    }
    let root = area.strip_coord_spec();
    for (i, l) in labels.iter().enumerate() {
        let y = top + 4 + ROW as i32 * i as i32 + ROW as i32 / 2 - 2;
        let col = color(i);
        let (a, b) = ((left + 8, y), (left + 48, y));
        if lines {
            draw_path_at(&root, (x0, y0), &[a, b], i, col)?;
            marker_at(&root, (x0, y0), i, (left + 28, y))?;
        } else {
            root.draw(&Rectangle::new(
                [(left + 20 - x0, y - 6 - y0), (left + 36 - x0, y + 6 - y0)],
                col.filled(),
            ))?;
        }
        root.draw(&Text::new(
            l.clone(),
            (left + 58 - x0, y - 8 - y0),
            ("sans-serif", 15).into_font().color(&BLACK),
        ))?;
    }
    for (k, n) in notes.iter().enumerate() {
        let y = box_.3 + 6 + ROW as i32 * k as i32;
        root.draw(&Text::new(
            n.clone(),
            (16, y - y0),
            ("sans-serif", 13).into_font().color(&BLACK.mix(0.8)),
        ))?;
    }
    Ok(box_)
}

/// Draws a path given in root pixels on a sub-area whose origin is `origin`.
fn draw_path_at<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    origin: (i32, i32),
    path: &[(i32, i32)],
    i: usize,
    col: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let shifted: Vec<(i32, i32)> = path.iter().map(|p| (p.0 - origin.0, p.1 - origin.1)).collect();
    draw_path(area, &shifted, i, col)
}

fn marker_at<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    origin: (i32, i32),
    i: usize,
    c: (i32, i32),
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    marker(area, i, (c.0 - origin.0, c.1 - origin.1))
}

/// Series `i`'s line through `path` (pixels of `area`), solid or dashed.
fn draw_path<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    path: &[(i32, i32)],
    i: usize,
    col: RGBColor,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let style = col.stroke_width(2);
    match dash(i) {
        (0, _) => area.draw(&PathElement::new(path.to_vec(), style)),
        (on, off) => {
            for e in DashedLineSeries::new(path.to_vec(), on, off, style) {
                area.draw(&e)?;
            }
            Ok(())
        }
    }
}

/// A step path through pixel points: level until half-way to the next sample, then vertical.
fn steps(pix: &[(i32, i32)]) -> Vec<(i32, i32)> {
    let mut out = Vec::with_capacity(pix.len() * 3);
    for (k, &p) in pix.iter().enumerate() {
        match pix.get(k + 1) {
            Some(&q) => {
                let mid = (p.0 + q.0) / 2;
                out.extend([p, (mid, p.1), (mid, q.1)]);
            }
            None => out.push(p),
        }
    }
    out
}

/// [lo, hi] of `values` widened by `pad` of the span on each side, never empty.
fn padded(values: &[f64], pad: f64) -> (f64, f64) {
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    (lo - pad * span, hi + pad * span)
}

/// How many ticks to ask plotters for: on an integer axis no more than one per integer (so the "nice" steps it
/// picks are whole numbers), on a log axis one per power of two.
fn tick_count(lo: f64, hi: f64, axis: Axis) -> usize {
    match axis {
        Axis::Linear => 10,
        Axis::Integer | Axis::Log2 => ((hi.floor() - lo.ceil()) as usize + 1).clamp(2, 13),
    }
}

/// A tick label: integers only on integer and log axes (other ticks stay blank), powers of two on a log axis.
fn tick(v: f64, axis: Axis) -> String {
    let near_int = (v - v.round()).abs() < 1e-9;
    match axis {
        Axis::Linear => num((v * 1e9).round() / 1e9),
        Axis::Integer if near_int => format!("{}", v.round() as i64),
        Axis::Log2 if near_int => num(2f64.powi(v.round() as i32)),
        _ => String::new(),
    }
}

fn prepare(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// What the figure tests of each paper share: draw a figure into a temporary file, check that its legend box
/// holds no data point, and return its rendered data for the snapshot.
#[cfg(test)]
pub mod testing {
    use super::*;

    /// Draws `f`, asserts the legend avoids the data, and returns `f.data_text()`.
    pub fn checked(file: &str, f: &Figure) -> String {
        let dir = std::env::temp_dir().join(format!("xtask-fig-{}", std::process::id()));
        let layout = f.write_svg(&dir.join(file)).unwrap();
        assert!(
            !layout.legend_hits_data(),
            "{file}: the legend covers a data point"
        );
        assert!(!layout.points.is_empty(), "{file}: no data drawn");
        let _ = std::fs::remove_file(dir.join(file));
        f.data_text()
    }

    /// Draws the bar chart `f`, asserts the legend avoids the bars, and returns `f.data_text()`.
    pub fn checked_bars(file: &str, f: &BarFigure) -> String {
        let dir = std::env::temp_dir().join(format!("xtask-fig-{}", std::process::id()));
        let layout = f.write_svg(&dir.join(file)).unwrap();
        assert!(!layout.legend_hits_data(), "{file}: the legend covers a bar");
        let _ = std::fs::remove_file(dir.join(file));
        f.data_text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Figure {
        let mut f = Figure::new("goodput", "draft length L", "tokens/s");
        f.x_axis = Axis::Integer;
        f.series.push(Series::lines(
            "theory",
            [(0.0, 1.0, None), (1.0, 3.0, None), (2.0, 2.5, None)],
        ));
        f.series.push(Series::lines(
            "simulated",
            [
                (0.0, 1.1, Some(0.1)),
                (1.0, 2.9, Some(0.2)),
                (2.0, 2.6, Some(0.1)),
            ],
        ));
        f.series.push(Series::lines(
            "copy",
            [(0.0, 1.0, None), (1.0, 3.0, None), (2.0, 2.5, None)],
        ));
        f
    }

    #[test]
    fn writes_svg_with_labels_intervals_and_notes() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        let f = sample();
        let layout = f.write_svg(&dir.join("line.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("line.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("simulated") && svg.contains("tokens/s"));
        assert!(
            svg.contains("are identical at every point"),
            "the coincidence note is in the caption"
        );
        assert!(!layout.legend_hits_data());
        // 3 + 3 + 3 markers and 2 interval ends per simulated point.
        assert_eq!(layout.points.len(), 9 + 6);
        let notes = f.all_notes();
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[1].starts_with("“theory” and “copy”"));
        let bar = BarFigure {
            title: "schemes".into(),
            x_label: "pair".into(),
            y_label: "tok/s".into(),
            categories: vec!["K=4".into(), "K=8".into()],
            groups: vec![
                ("exact".into(), vec![(1.0, Some(0.1)), (2.0, None)]),
                ("fixed".into(), vec![(0.5, None), (1.5, None)]),
            ],
            notes: vec![],
        };
        let layout = bar.write_svg(&dir.join("bar.svg")).unwrap();
        assert!(!layout.legend_hits_data());
        let svg = std::fs::read_to_string(dir.join("bar.svg")).unwrap();
        assert!(svg.contains("K=8") && svg.contains("fixed"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn ticks_are_integers_on_integer_axes_and_powers_on_log_axes() {
        assert_eq!(tick(5.0, Axis::Integer), "5");
        assert_eq!(tick(4.5, Axis::Integer), "");
        assert_eq!(tick(8.0, Axis::Log2), "256");
        assert_eq!(tick(0.5, Axis::Log2), "");
        assert_eq!(tick(0.30000000000000004, Axis::Linear), "0.3");
        assert_eq!(
            steps(&[(0, 0), (10, 5), (20, 5)]),
            vec![(0, 0), (5, 0), (5, 5), (10, 5), (15, 5), (15, 5), (20, 5)]
        );
        assert!(label("greedy_tok_s").is_ok() && label("nonsense").is_err());
    }

    /// The legend-box check itself can fail: a point inside the box is reported.
    #[test]
    fn legend_check_detects_a_point_inside() {
        let l = Layout {
            plot: (0, 0, 100, 100),
            legend: (10, 10, 20, 20),
            points: vec![(15, 15)],
        };
        assert!(l.legend_hits_data());
    }
}
