//! Line charts as SVG for the commands that write figures (`measure`, `simulate`), drawn with plotters as xtask
//! draws its own.

use crate::failure::Failure;
use plotters::prelude::*;
use std::path::Path;

/// One chart series: label, points, whether to draw markers.
pub type Series<'a> = (&'a str, &'a [(f64, f64)], bool);

/// A line chart (points drawn for `markers` series) as SVG.
pub fn svg_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series<'_>],
) -> Result<(), Failure> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
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
        let root = SVGBackend::new(path, (720, 450)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, 0f64..(y1 * 1.1).max(1e-12))?;
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
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
        legend_and_save(&mut chart, &root)
    };
    draw().map_err(|e| Failure::Runtime(anyhow::anyhow!("drawing {}: {e}", path.display())))
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
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let top = points
            .iter()
            .flat_map(|(_, x, y)| [*x, *y])
            .filter(|v| v.is_finite())
            .fold(0f64, f64::max)
            * 1.12;
        let top = if top > 0.0 { top } else { 1.0 };
        let root = SVGBackend::new(path, (720, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..top, 0f64..top)?;
        chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
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
        legend_and_save(&mut chart, &root)
    };
    draw().map_err(|e| Failure::Runtime(anyhow::anyhow!("drawing {}: {e}", path.display())))
}

/// The legend box of a chart with f64 axes, then the file written.
fn legend_and_save<'a>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
) -> Result<(), Box<dyn std::error::Error>> {
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
