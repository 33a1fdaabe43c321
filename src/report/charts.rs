//! Line charts over a run's time, drawn with plotters' SVG backend into a string that the HTML
//! report inlines. Markers (knob and cap changes, restarts, stops) are vertical lines in their
//! kind's colour, numbered to match the report's marker list.
//!
//! No fonts are read: the SVG backend writes `<text>` elements that the viewer lays out.

use plotters::prelude::*;

use super::model::{Marker, MarkerKind};

/// Drawing size in SVG user units; the page scales it to its width (`viewBox`).
const SIZE: (u32, u32) = (900, 280);

/// One named series: `(unix seconds, value)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn line_colour(i: usize) -> RGBColor {
    const COLOURS: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(23, 190, 207),
    ];
    COLOURS[i % COLOURS.len()]
}

pub fn marker_colour(kind: MarkerKind) -> RGBColor {
    match kind {
        MarkerKind::Knob => RGBColor(46, 125, 50),
        MarkerKind::Cap => RGBColor(230, 81, 0),
        MarkerKind::Governor => RGBColor(106, 27, 154),
        MarkerKind::Restart => RGBColor(198, 40, 40),
        MarkerKind::Stop => RGBColor(97, 97, 97),
    }
}

/// A chart of `lines` over `[t0, t1]` (x in minutes from `t0`), or None when no line has a
/// point. `y_label` names the unit.
pub fn chart(
    title: &str,
    y_label: &str,
    lines: &[Line],
    markers: &[Marker],
    t0: f64,
    t1: f64,
) -> Option<String> {
    let values = || lines.iter().flat_map(|l| l.points.iter());
    values().next()?;
    let (mut lo, mut hi) = values().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p.1), hi.max(p.1))
    });
    if lo >= 0.0 && lo < hi * 0.5 {
        // Counts and rates read best from zero.
        lo = 0.0;
    }
    if hi - lo < 1e-9 {
        hi = lo + lo.abs().max(1.0) * 0.1;
        lo -= lo.abs().max(1.0) * 0.1;
    }
    let pad = (hi - lo) * 0.05;
    let x_end = ((t1 - t0) / 60.0).max(1.0 / 60.0);
    let mut svg = String::new();
    let drawn = draw(
        &mut svg,
        title,
        y_label,
        lines,
        markers,
        t0,
        (x_end, lo - pad, hi + pad),
    );
    match drawn {
        Ok(()) => Some(svg),
        Err(e) => {
            tracing::warn!("report chart {title}: {e}");
            None
        }
    }
}

fn draw(
    svg: &mut String,
    title: &str,
    y_label: &str,
    lines: &[Line],
    markers: &[Marker],
    t0: f64,
    (x_end, y_lo, y_hi): (f64, f64, f64),
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_end, y_lo..y_hi)?;
    chart
        .configure_mesh()
        .x_desc("minutes")
        .y_desc(y_label)
        .light_line_style(RGBColor(238, 238, 238))
        .draw()?;
    for (i, m) in markers.iter().enumerate() {
        let x = (m.t - t0) / 60.0;
        if !(0.0..=x_end).contains(&x) {
            continue;
        }
        let colour = marker_colour(m.kind);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, y_lo), (x, y_hi)],
            colour.stroke_width(1),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{}", i + 1),
            (x, y_hi),
            ("sans-serif", 12).into_font().color(&colour),
        )))?;
    }
    for (i, line) in lines.iter().enumerate() {
        if line.points.is_empty() {
            continue;
        }
        let colour = line_colour(i);
        chart
            .draw_series(LineSeries::new(
                line.points.iter().map(|&(t, v)| ((t - t0) / 60.0, v)),
                colour.stroke_width(2),
            ))?
            .label(line.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
    }
    if lines.len() > 1 {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(RGBColor(200, 200, 200))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
