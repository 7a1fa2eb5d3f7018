//! SVG charts of the reproduction (line and grouped-bar charts), drawn with plotters' pure-Rust SVG backend.

use anyhow::{Context, anyhow};
use plotters::prelude::*;
use std::path::Path;

/// One named curve of a line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label.
    pub label: String,
    /// (x, y) points in drawing order.
    pub points: Vec<(f64, f64)>,
}

/// A line chart with markers.
#[derive(Debug, Clone, Copy)]
pub struct LineChart<'a> {
    /// Caption.
    pub title: &'a str,
    /// x-axis description with unit.
    pub x_label: &'a str,
    /// y-axis description with unit.
    pub y_label: &'a str,
    /// The curves.
    pub series: &'a [Series],
}

/// A grouped bar chart: one group of bars per category, one bar per named group.
#[derive(Debug, Clone, Copy)]
pub struct BarChart<'a> {
    /// Caption.
    pub title: &'a str,
    /// y-axis description with unit.
    pub y_label: &'a str,
    /// Category names along x.
    pub categories: &'a [String],
    /// (legend label, one value per category).
    pub groups: &'a [(String, Vec<f64>)],
}

const SIZE: (u32, u32) = (900, 560);

fn color(i: usize) -> RGBColor {
    // A colour-blind-safe qualitative palette (Okabe–Ito), then the plotters palette.
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(0, 0, 0),
        RGBColor(240, 228, 66),
    ];
    PALETTE[i % PALETTE.len()]
}

/// The [lo, hi] range of `values` padded by 5 %, never empty.
fn padded_range(values: impl Iterator<Item = f64>, include_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if include_zero {
        lo = lo.min(0.0);
        hi = hi.max(0.0);
    }
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    (
        if include_zero && lo >= 0.0 {
            lo
        } else {
            lo - 0.05 * span
        },
        hi + 0.05 * span,
    )
}

fn prepare(path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// Draws `chart` as an SVG file at `path`.
pub fn line_chart(path: &Path, chart: &LineChart) -> anyhow::Result<()> {
    prepare(path)?;
    let (x0, x1) = padded_range(
        chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)),
        false,
    );
    let (y0, y1) = padded_range(
        chart.series.iter().flat_map(|s| s.points.iter().map(|p| p.1)),
        true,
    );
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow!("{e}"))?;
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, s) in chart.series.iter().enumerate() {
        let c = color(i);
        ctx.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
            .map_err(|e| anyhow!("{e}"))?
            .label(s.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        ctx.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

/// Draws `chart` as an SVG file at `path`.
pub fn bar_chart(path: &Path, chart: &BarChart) -> anyhow::Result<()> {
    prepare(path)?;
    let n_cat = chart.categories.len().max(1);
    let n_grp = chart.groups.len().max(1);
    let (_, y1) = padded_range(chart.groups.iter().flat_map(|g| g.1.iter().copied()), true);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5f64..(n_cat as f64 - 0.5), 0f64..y1)
        .map_err(|e| anyhow!("{e}"))?;
    let categories = chart.categories.to_vec();
    ctx.configure_mesh()
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
        .y_desc(chart.y_label)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    let width = 0.8 / n_grp as f64;
    for (g, (label, values)) in chart.groups.iter().enumerate() {
        let c = color(g);
        ctx.draw_series(values.iter().enumerate().map(|(j, &v)| {
            let left = j as f64 - 0.4 + g as f64 * width;
            Rectangle::new([(left, 0.0), (left + width * 0.92, v)], c.filled())
        }))
        .map_err(|e| anyhow!("{e}"))?
        .label(label.as_str())
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    ctx.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present()
        .map_err(|e| anyhow!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_svg_with_labels() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        let line = dir.join("line.svg");
        let series = [
            Series {
                label: "theory".into(),
                points: vec![(0.0, 1.0), (1.0, 3.0), (2.0, 2.5)],
            },
            Series {
                label: "simulated".into(),
                points: vec![(0.0, 1.1), (1.0, 2.9)],
            },
        ];
        line_chart(
            &line,
            &LineChart {
                title: "goodput",
                x_label: "L",
                y_label: "tok/s",
                series: &series,
            },
        )
        .unwrap();
        let svg = std::fs::read_to_string(&line).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("simulated") && svg.contains("tok/s"));
        let bar = dir.join("bar.svg");
        let cats = vec!["K=4".to_string(), "K=8".to_string()];
        let groups = vec![
            ("exact".to_string(), vec![1.0, 2.0]),
            ("fixed".to_string(), vec![0.5, 1.5]),
        ];
        bar_chart(
            &bar,
            &BarChart {
                title: "schemes",
                y_label: "tok/s",
                categories: &cats,
                groups: &groups,
            },
        )
        .unwrap();
        let svg = std::fs::read_to_string(&bar).unwrap();
        assert!(svg.contains("K=8") && svg.contains("fixed"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
