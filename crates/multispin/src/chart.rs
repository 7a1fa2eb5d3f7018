//! Line charts as SVG for the commands that write figures (`measure`, `simulate`), drawn with plotters as xtask
//! draws its own.

use crate::failure::Failure;
use plotters::prelude::*;
use std::path::Path;

/// One chart series: label, points, whether to draw markers.
pub type Series<'a> = (&'a str, &'a [(f64, f64)], bool);

/// A chart with f64 axes, as the body functions below draw on it.
type Chart<'a> = ChartContext<
    'a,
    SVGBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// The frame every chart shares: a white `size` canvas at `path`, the caption and labelled axes over `x` × `y`,
/// then `body`'s series, the legend box, and the file written; a drawing error names the file. An integer x axis
/// with `names` labels tick i with `names[i]` (a category axis).
fn draw_chart(
    path: &Path,
    size: (u32, u32),
    (title, x_label, y_label): (&str, &str, &str),
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (legend_at, integer_x, names): (SeriesLabelPosition, bool, &[String]),
    body: impl FnOnce(&mut Chart<'_>) -> Result<(), Box<dyn std::error::Error>>,
) -> Result<(), Failure> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, size).into_drawing_area();
        root.fill(&WHITE)?;
        let x_range = x.clone();
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range, y)?;
        // An integer axis (rounds, indices) gets integer ticks only, at most one per integer.
        let ticks = if integer_x {
            ((x.end.floor() - x.start.ceil()) as usize + 1).clamp(2, 12)
        } else {
            10
        };
        let x_fmt = |v: &f64| {
            if !integer_x {
                format!("{}", (v * 1e9).round() / 1e9)
            } else if (v - v.round()).abs() < 1e-9 && !names.is_empty() {
                let i = v.round() as i64;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| names.get(i))
                    .cloned()
                    .unwrap_or_default()
            } else if (v - v.round()).abs() < 1e-9 {
                format!("{}", v.round() as i64)
            } else {
                String::new()
            }
        };
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_labels(ticks)
            .x_label_formatter(&x_fmt)
            .draw()?;
        body(&mut chart)?;
        chart
            .configure_series_labels()
            .position(legend_at)
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| Failure::Runtime(anyhow::anyhow!("drawing {}: {e}", path.display())))
}

/// A line chart (points drawn for `markers` series) as SVG.
pub fn svg_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series<'_>],
) -> Result<(), Failure> {
    let all = series.iter().flat_map(|s| s.1.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Headroom above the data for the legend (about 20 px per entry of a ~330 px plotting height), so the legend in
    // the upper right never covers a curve.
    let legend_share = ((20 * series.len() + 24) as f64 / 330.0).min(0.6);
    let ranges = (x0..x1, 0f64..(y1 * 1.05 / (1.0 - legend_share)).max(1e-12));
    let integer_x = series
        .iter()
        .all(|s| s.1.iter().all(|p| (p.0 - p.0.round()).abs() < 1e-9));
    let legend = (SeriesLabelPosition::UpperRight, integer_x, &[][..]);
    draw_chart(
        path,
        (720, 450),
        (title, x_label, y_label),
        ranges,
        legend,
        |chart| {
            for (i, (label, pts, markers)) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                chart
                    .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
                    .label(*label)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
                if *markers {
                    chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
                }
            }
            Ok(())
        },
    )
}

/// A predicted-against-measured scatter: one labelled point per entry, with the diagonal y = x on which a perfect
/// prediction lies.
pub fn svg_scatter_labelled(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    points: &[(String, f64, f64)],
) -> Result<(), Failure> {
    let top = points
        .iter()
        .flat_map(|(_, x, y)| [*x, *y])
        .filter(|v| v.is_finite())
        .fold(0f64, f64::max)
        * 1.12;
    let top = if top > 0.0 { top } else { 1.0 };
    draw_chart(
        path,
        (720, 560),
        (title, x_label, y_label),
        (0f64..top, 0f64..top),
        // Points near the diagonal leave the lower right empty.
        (SeriesLabelPosition::LowerRight, false, &[][..]),
        |chart| {
            chart
                .draw_series(LineSeries::new([(0.0, 0.0), (top, top)], BLACK.mix(0.4)))?
                .label("prediction = measurement")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.mix(0.4)));
            for (i, (name, x, y)) in points.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba();
                chart.draw_series([Circle::new((*x, *y), 4, color.filled())])?;
                chart.draw_series([Text::new(
                    name.clone(),
                    (*x, *y),
                    ("sans-serif", 13).into_font().color(&color),
                )])?;
            }
            Ok(())
        },
    )
}

/// Grouped bars like paper A's Fig. 6: per group (a scheme) one bar per `series` name (e.g. measured, predicted),
/// each value written above its bar; a NaN value draws no bar ("n/a" where it would stand).
pub fn svg_bars(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[&str],
    groups: &[(String, Vec<f64>)],
) -> Result<(), Failure> {
    let top = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0f64, f64::max);
    let top = if top > 0.0 { top * 1.25 } else { 1.0 };
    let n = groups.len().max(1) as f64;
    let width = 0.8 / series.len().max(1) as f64;
    let names: Vec<String> = groups.iter().map(|g| g.0.clone()).collect();
    draw_chart(
        path,
        (160 * groups.len().max(4) as u32, 480),
        (title, "scheme", y_label),
        (-0.5..n - 0.5, 0f64..top),
        (SeriesLabelPosition::UpperRight, true, &names),
        |chart| {
            for (j, name) in series.iter().enumerate() {
                let color = Palette99::pick(j).to_rgba();
                let x0 = |i: usize| i as f64 - 0.4 + j as f64 * width;
                chart
                    .draw_series(groups.iter().enumerate().filter(|(_, g)| g.1[j].is_finite()).map(
                        |(i, g)| {
                            Rectangle::new([(x0(i), 0.0), (x0(i) + width * 0.92, g.1[j])], color.filled())
                        },
                    ))?
                    .label(*name)
                    .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
                chart.draw_series(groups.iter().enumerate().map(|(i, g)| {
                    let v = g.1[j];
                    let text = if v.is_finite() {
                        format!("{v:.1}")
                    } else {
                        "n/a".into()
                    };
                    let y = if v.is_finite() { v } else { 0.0 };
                    // The text hangs below its anchor: anchored a line above the bar's top, it sits on the bar.
                    Text::new(text, (x0(i), y + top * 0.05), ("sans-serif", 12).into_font())
                }))?;
            }
            Ok(())
        },
    )
}
