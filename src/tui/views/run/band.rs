//! The Run view's band between the run's panel and its log, for a run that reports metrics or
//! has knobs: loss, samples/s, step time and data wait over the run, with a mark where a knob
//! change took effect or a power cap changed, and the knob panel (value, `→ pending` while a
//! change is on its way, the allowed range, how the last change went and how long it took; for
//! a run of several ranks, how many agreed to a change in flight). A run of several ranks is
//! charted from rank 0's reports (the rank table shows every rank's newest).
//!
//! Where there is room the series are braille charts (four in a row, or two by two); where
//! there is not, one row each with a sparkline; where not even that fits beside a log, the band
//! is left out. Render only reads.

use super::ranks;
use crate::protocol::{KnobName, KnobState, RunInfo, StagedChange};
use crate::tui::action::Action;
use crate::tui::data::Data;
use crate::tui::format::NA;
use crate::tui::keymap::Context;
use crate::tui::metrics::{Marker, MarkerKind, RunMetrics, Series, markers};
use crate::tui::theme::Theme;
use crate::tui::views::Ctx;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::symbols::Marker as Dots;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Chart, Dataset, GraphType, Padding, Paragraph, Sparkline, SparklineBar, Widget,
    Wrap,
};

/// Rows the log keeps at least (three lines inside its border) before the band gets any.
pub const LOG_MIN: u16 = 5;
/// The band with one row per series (four, inside a border).
const COMPACT: u16 = 6;
/// The band with charts: at least this many rows, at most the larger.
const CHARTS_MIN: u16 = 10;
const CHARTS_MAX: u16 = 14;
/// Columns a chart needs to say anything.
const CHART_MIN_W: u16 = 24;

/// Rows the band takes of `rest` (what the run list and the run's panel leave for it and the
/// log): charts when half of it holds them, one row per series when that leaves the log its
/// minimum, else none.
pub fn rows(rest: u16) -> u16 {
    let half = (rest / 2).min(CHARTS_MAX);
    if half >= CHARTS_MIN {
        half
    } else if rest >= COMPACT + LOG_MIN {
        COMPACT
    } else {
        0
    }
}

/// Whether `run` has a band: it reported metrics or has knobs.
pub fn has_band(data: &Data, run: &RunInfo) -> bool {
    data.metrics.of(&run.id).is_some_and(RunMetrics::has_any)
}

/// Draw the band of `run` in `area`.
pub fn render(ctx: Ctx, run: &RunInfo, area: Rect, buf: &mut Buffer) {
    let Some(m) = ctx.data.metrics.of(&run.id) else {
        return;
    };
    let knob_w = if area.width >= 70 {
        (area.width * 2 / 5).clamp(30, 46)
    } else {
        area.width / 2
    };
    let [charts, knobs] =
        Layout::horizontal([Constraint::Fill(1), Constraint::Length(knob_w)]).areas(area);
    let marks = markers(&ctx.data.events, &run.id);
    let x = x_bounds(m);
    if area.height >= CHARTS_MIN && charts.width >= 4 * CHART_MIN_W {
        let cells: [Rect; 4] = Layout::horizontal([Constraint::Fill(1); 4]).areas(charts);
        for (s, cell) in Series::ALL.into_iter().zip(cells) {
            render_chart(ctx, m, s, x, &marks, cell, buf);
        }
    } else if area.height >= CHARTS_MIN && charts.width >= 2 * CHART_MIN_W {
        let [top, bottom] = Layout::vertical([Constraint::Fill(1); 2]).areas(charts);
        let [a, b]: [Rect; 2] = Layout::horizontal([Constraint::Fill(1); 2]).areas(top);
        let [c, d]: [Rect; 2] = Layout::horizontal([Constraint::Fill(1); 2]).areas(bottom);
        for (s, cell) in Series::ALL.into_iter().zip([a, b, c, d]) {
            render_chart(ctx, m, s, x, &marks, cell, buf);
        }
    } else {
        render_rows(ctx, m, x, &marks, charts, buf);
    }
    render_knobs(ctx, m, knobs, buf);
}

/// The time the charts span: the first report to the newest (at least a second).
fn x_bounds(m: &RunMetrics) -> [f64; 2] {
    let first = m.points.front().map_or(0.0, |p| p.t);
    let last = m.points.back().map_or(first, |p| p.t);
    [first, last.max(first + 1.0)]
}

fn series_style(t: &Theme, s: Series) -> Style {
    match s {
        Series::Loss => t.util,
        Series::SamplesPerS => t.memory,
        Series::StepTime => t.clock,
        Series::DataWait => t.temperature,
    }
}

fn marker_style(t: &Theme, k: MarkerKind) -> Style {
    match k {
        MarkerKind::Knob => t.warn,
        MarkerKind::Power => t.threshold,
    }
}

/// The newest value of a series, as its title says it.
fn current(s: Series, pts: &[(f64, f64)]) -> String {
    pts.last()
        .map_or_else(|| NA.to_string(), |&(_, v)| s.format(v))
}

/// Low and high ends of a value axis with a little room, never empty. Values that are all
/// zero or more (loss, samples/s, step time, data wait) get no room below zero: an axis
/// labelled `-0.05` says the series could go there.
fn y_bounds(pts: &[(f64, f64)]) -> [f64; 2] {
    let lo = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return [0.0, 1.0];
    }
    let pad = if hi > lo {
        (hi - lo) * 0.05
    } else {
        (hi.abs() * 0.1).max(1e-3)
    };
    let floor = if lo >= 0.0 { 0.0 } else { f64::NEG_INFINITY };
    [(lo - pad).max(floor), hi + pad]
}

/// A series as chart lines over `x`: averaged into `bins` when it has more points than that,
/// and broken where reports stopped for much longer than they usually come (a restart, a
/// pause), so no line is drawn through values that were never reported.
pub fn segments(pts: &[(f64, f64)], x: [f64; 2], bins: usize) -> Vec<Vec<(f64, f64)>> {
    let bins = bins.max(1);
    let span = (x[1] - x[0]).max(1e-9);
    let bin_w = span / bins as f64;
    let thinned: Vec<(f64, f64)> = if pts.len() <= bins {
        pts.to_vec()
    } else {
        let mut sums = vec![(0.0, 0.0, 0usize); bins];
        for &(t, v) in pts {
            let i = (((t - x[0]) / bin_w) as usize).min(bins - 1);
            sums[i].0 += t;
            sums[i].1 += v;
            sums[i].2 += 1;
        }
        sums.into_iter()
            .filter(|s| s.2 > 0)
            .map(|(t, v, n)| (t / n as f64, v / n as f64))
            .collect()
    };
    let usual = span / (pts.len().max(2) - 1) as f64;
    let max_gap = (5.0 * usual).max(2.5 * bin_w);
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut prev: Option<f64> = None;
    for p in thinned {
        if prev.is_none_or(|t| p.0 - t > max_gap) {
            out.push(Vec::new());
        }
        if let Some(seg) = out.last_mut() {
            seg.push(p);
        }
        prev = Some(p.0);
    }
    out
}

/// The markers within `x`, and a legend for the kinds among them (` ┊ knob ┊ power `).
fn shown_markers(t: &Theme, marks: &[Marker], x: [f64; 2]) -> (Vec<Marker>, Vec<Span<'static>>) {
    let inside: Vec<Marker> = marks
        .iter()
        .filter(|m| m.t >= x[0] && m.t <= x[1])
        .copied()
        .collect();
    let mut legend = Vec::new();
    for (kind, word) in [(MarkerKind::Knob, "knob"), (MarkerKind::Power, "power")] {
        if inside.iter().any(|m| m.kind == kind) {
            legend.push(Span::styled(format!(" ┊ {word}"), marker_style(t, kind)));
        }
    }
    if !legend.is_empty() {
        legend.push(Span::raw(" "));
    }
    (inside, legend)
}

fn render_chart(
    ctx: Ctx,
    m: &RunMetrics,
    s: Series,
    x: [f64; 2],
    marks: &[Marker],
    area: Rect,
    buf: &mut Buffer,
) {
    let t = ctx.theme;
    let pts = m.series(s);
    let value = current(s, &pts);
    let value_style = if pts.is_empty() {
        t.na
    } else {
        series_style(t, s)
    };
    let (inside, legend) = shown_markers(t, marks, x);
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(format!(" {} ", s.title()), t.title))
        .title(Line::from(Span::styled(format!(" {value} "), value_style)).right_aligned());
    let legend_w: usize = legend.iter().map(|s| s.width()).sum();
    if legend_w > 0 && legend_w + 2 <= area.width as usize {
        block = block.title_bottom(Line::from(legend));
    }
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height < 2 || inner.width < 8 {
        return;
    }
    if pts.is_empty() {
        let r = Rect::new(inner.x, inner.y + inner.height / 2, inner.width, 1);
        Line::styled("not reported", t.na).centered().render(r, buf);
        return;
    }
    let y = y_bounds(&pts);
    let labels = inner.width >= 20;
    let label_w = if labels {
        s.format(y[0]).len().max(s.format(y[1]).len()) as u16 + 1
    } else {
        0
    };
    let bins = (inner.width.saturating_sub(label_w) as usize * 2).max(2);
    let segs = segments(&pts, x, bins);
    let lines: Vec<[(f64, f64); 2]> = inside
        .iter()
        .map(|mk| [(mk.t, y[0]), (mk.t, y[1])])
        .collect();
    let mut datasets = Vec::new();
    for (mk, line) in inside.iter().zip(&lines) {
        datasets.push(
            Dataset::default()
                .marker(Dots::Braille)
                .graph_type(GraphType::Line)
                .style(marker_style(t, mk.kind))
                .data(line),
        );
    }
    for seg in &segs {
        datasets.push(
            Dataset::default()
                .marker(Dots::Braille)
                .graph_type(GraphType::Line)
                .style(series_style(t, s))
                .data(seg),
        );
    }
    let mut y_axis = Axis::default().bounds(y).style(t.axis);
    if labels {
        y_axis = y_axis.labels([Span::raw(s.format(y[0])), Span::raw(s.format(y[1]))]);
    }
    Chart::new(datasets)
        .x_axis(Axis::default().bounds(x).style(t.axis))
        .y_axis(y_axis)
        .legend_position(None)
        .render(inner, buf);
}

/// One row per series: name, newest value, and a sparkline over the run with marked columns.
fn render_rows(
    ctx: Ctx,
    m: &RunMetrics,
    x: [f64; 2],
    marks: &[Marker],
    area: Rect,
    buf: &mut Buffer,
) {
    let t = ctx.theme;
    let (inside, legend) = shown_markers(t, marks, x);
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(" Training ", t.title));
    let legend_w: usize = legend.iter().map(|s| s.width()).sum();
    if legend_w > 0 && legend_w + 12 <= area.width as usize {
        block = block.title(Line::from(legend).right_aligned());
    }
    let inner = block.inner(area);
    block.render(area, buf);
    const LABEL: u16 = 10;
    const VALUE: u16 = 9;
    for (i, s) in Series::ALL.into_iter().enumerate() {
        let row = inner.y + i as u16;
        if i as u16 >= inner.height {
            break;
        }
        let pts = m.series(s);
        let value = current(s, &pts);
        buf.set_stringn(inner.x, row, s.title(), LABEL as usize, t.dim);
        let style = if pts.is_empty() {
            t.na
        } else {
            series_style(t, s)
        };
        let vx = inner.x + LABEL.min(inner.width);
        let room = inner.right().saturating_sub(vx);
        buf.set_stringn(vx, row, &value, (VALUE - 1).min(room) as usize, style);
        let sx = vx + VALUE.min(room);
        let w = inner.right().saturating_sub(sx);
        if w < 4 || pts.is_empty() {
            continue;
        }
        let cols = columns(&pts, x, w as usize);
        let (lo, hi) = cols
            .iter()
            .flatten()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        let range = (hi - lo).max(1e-12);
        // The lowest value still shows as a sliver (an eighth of a cell): an empty column
        // means no report.
        let bars: Vec<SparklineBar> = cols
            .iter()
            .map(|v| SparklineBar::from(v.map(|v| 125 + ((v - lo) / range * 875.0) as u64)))
            .collect();
        let spark = Rect::new(sx, row, w, 1);
        Sparkline::default()
            .data(bars)
            .max(1000)
            .style(series_style(t, s))
            .absent_value_symbol(" ")
            .render(spark, buf);
        let span = (x[1] - x[0]).max(1e-9);
        for mk in &inside {
            let c = (((mk.t - x[0]) / span) * w as f64) as u16;
            let cell = &mut buf[(sx + c.min(w - 1), row)];
            if cols[c.min(w - 1) as usize].is_none() {
                cell.set_symbol("┊");
            }
            cell.set_style(marker_style(t, mk.kind));
        }
    }
}

/// The mean of a series in each of `w` columns across `x`; None where nothing was reported.
pub fn columns(pts: &[(f64, f64)], x: [f64; 2], w: usize) -> Vec<Option<f64>> {
    let span = (x[1] - x[0]).max(1e-9);
    let mut sums = vec![(0.0, 0usize); w];
    for &(t, v) in pts {
        let i = (((t - x[0]) / span * w as f64).max(0.0) as usize).min(w.saturating_sub(1));
        if let Some(s) = sums.get_mut(i) {
            s.0 += v;
            s.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(s, n)| (n > 0).then(|| s / n as f64))
        .collect()
}

/// `7.5 ms`, `0.4 ms`, `1.20 s`.
pub fn rtt(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.1} ms")
    }
}

/// How a knob's last change went, and the style to say it in; a change to several ranks in
/// flight says how far the ranks are with it.
fn outcome(t: &Theme, k: &KnobState, staged: Option<&StagedChange>) -> (String, Style) {
    if let Some(s) = staged.filter(|s| s.knob == k.knob) {
        let n = s.ranks.len();
        return match s.committed {
            None => (
                format!(
                    "{}/{n} ranks agreed, for step {}",
                    s.ready.len(),
                    s.apply_step
                ),
                t.warn,
            ),
            Some(true) => (
                format!(
                    "agreed; {}/{n} applied at step {}",
                    s.applied.len(),
                    s.apply_step
                ),
                t.warn,
            ),
            Some(false) => ("called off".into(), t.crit),
        };
    }
    let waiting = k.pending.is_some() && k.pending != k.value;
    match k.last_outcome.as_deref() {
        _ if waiting => ("waiting for the trainer…".into(), t.warn),
        Some("applied") => match k.last_rtt_ms {
            Some(ms) => (format!("applied in {}", rtt(ms)), t.ok),
            None => ("applied".into(), t.ok),
        },
        Some("restarted") => ("applied by restarting the run".into(), t.ok),
        Some(o) if o.starts_with("rejected") || o.starts_with("called off") => {
            (o.to_string(), t.crit)
        }
        Some(o) => (o.to_string(), t.dim),
        None => ("not changed yet".into(), t.dim),
    }
}

/// The key the keymap gives to changing `knob` in the Run view, if any.
fn key_for(ctx: Ctx, knob: KnobName) -> Option<String> {
    ctx.keymap
        .bindings(Context::Run)
        .iter()
        .find(|b| b.action == Action::SetKnob(knob))
        .and_then(|b| b.keys.first())
        .map(ToString::to_string)
}

/// The allowed range as the panel and the dialog say it: `1–1024`, `1 or more`.
pub fn range_text(k: &KnobState) -> String {
    match k.range {
        Some(r) => match r.max {
            Some(max) => format!("{}–{max}", r.min),
            None => format!("{} or more", r.min),
        },
        None => "no range".into(),
    }
}

fn render_knobs(ctx: Ctx, m: &RunMetrics, area: Rect, buf: &mut Buffer) {
    let t = ctx.theme;
    let (who, style) = match &m.trainer {
        Some(tr) if ranks::is_multi(tr) => {
            let attached = tr.ranks.iter().filter(|r| r.attached).count();
            let world = (tr.world_size.unwrap_or(0) as usize).max(tr.ranks.len());
            if attached == world {
                (format!(" {world} ranks attached "), t.ok)
            } else {
                (format!(" {attached}/{world} ranks attached "), t.warn)
            }
        }
        Some(tr) if tr.attached => (
            match tr.pid {
                Some(p) => format!(" trainer pid {p} "),
                None => " trainer attached ".into(),
            },
            t.ok,
        ),
        _ => (" no trainer ".into(), t.dim),
    };
    let block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(" Knobs ", t.title))
        .title(Line::styled(who, style).right_aligned())
        .padding(Padding::horizontal(1));
    let inner = block.inner(area);
    let knobs = m.trainer.as_ref().map_or(&[][..], |tr| &tr.knobs[..]);
    if knobs.is_empty() {
        Paragraph::new("no knobs: a profile's [knobs.batch_size] or [knobs.prefetch] adds them")
            .style(t.dim)
            .wrap(Wrap { trim: true })
            .block(block)
            .render(area, buf);
        return;
    }
    let two_rows = inner.height as usize >= 2 * knobs.len();
    let mut lines = Vec::new();
    for k in knobs {
        let mut first = Vec::new();
        if let Some(key) = key_for(ctx, k.knob) {
            first.push(Span::styled(format!("{key} "), t.key));
        }
        first.push(Span::styled(format!("{:<10} ", k.knob.as_str()), t.dim));
        first.push(Span::raw(
            k.value.map_or_else(|| NA.to_string(), |v| v.to_string()),
        ));
        if let Some(p) = k.pending.filter(|p| Some(*p) != k.value) {
            first.push(Span::styled(format!(" → {p}"), t.warn));
        }
        first.push(Span::styled(format!("  {}", range_text(k)), t.dim));
        let staged = m.trainer.as_ref().and_then(|tr| tr.staged.as_ref());
        let (said, said_style) = outcome(t, k, staged);
        if two_rows {
            lines.push(Line::from(first));
            lines.push(Line::styled(format!("  {said}"), said_style));
        } else {
            first.push(Span::styled(format!(" · {said}"), said_style));
            lines.push(Line::from(first));
        }
    }
    Paragraph::new(lines).block(block).render(area, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_band_shrinks_then_goes_before_the_log_does() {
        assert_eq!(rows(40), 14, "charts, at most 14 rows");
        assert_eq!(rows(20), 10, "charts, half of what is left");
        assert_eq!(rows(19), COMPACT, "one row per series");
        assert_eq!(rows(11), COMPACT);
        assert_eq!(rows(10), 0, "the log keeps its three lines");
        assert_eq!(rows(0), 0);
        for rest in 0..60 {
            let r = rows(rest);
            assert!(r == 0 || rest - r >= LOG_MIN, "{rest}: {r}");
        }
    }

    #[test]
    fn segments_thin_long_series_and_break_at_gaps() {
        // One report a second for 100 s, nothing for 60 s (a restart), then 40 more.
        let pts: Vec<(f64, f64)> = (0..100)
            .chain(160..200)
            .map(|s| (s as f64, s as f64 * 2.0))
            .collect();
        let x = [0.0, 199.0];
        let raw = segments(&pts, x, 1000);
        assert_eq!(raw.len(), 2, "the gap breaks the line");
        assert_eq!(raw[0].len(), 100);
        assert_eq!(raw[1][0], (160.0, 320.0));
        let thin = segments(&pts, x, 20);
        assert_eq!(thin.len(), 2, "still broken when thinned");
        let n: usize = thin.iter().map(Vec::len).sum();
        assert!(n <= 20, "{n} points for 20 bins");
        // A bin's point is the mean of its reports.
        let (t, v) = thin[0][0];
        assert!((v - 2.0 * t).abs() < 1e-9, "{t} {v}");
        assert!(segments(&[], x, 10).is_empty());
    }

    #[test]
    fn an_axis_of_values_that_are_never_negative_stops_at_zero() {
        // Loss near zero, data wait of zero: no room drawn below zero.
        let loss = [(0.0, 0.02), (1.0, 0.9), (2.0, 0.4)];
        let y = y_bounds(&loss);
        assert_eq!(y[0], 0.0, "{y:?}");
        assert!(y[1] > 0.9, "{y:?}");
        let wait = [(0.0, 0.0), (1.0, 0.0)];
        let y = y_bounds(&wait);
        assert!(y[0] == 0.0 && y[1] > 0.0, "{y:?}");
        // Well above zero, the axis keeps its room on both sides.
        let y = y_bounds(&[(0.0, 100.0), (1.0, 200.0)]);
        assert_eq!(y, [95.0, 205.0]);
        // A series that does go negative keeps its room below.
        let y = y_bounds(&[(0.0, -1.0), (1.0, 1.0)]);
        assert!(y[0] < -1.0, "{y:?}");
    }

    #[test]
    fn columns_average_and_leave_gaps_empty() {
        let pts = [(0.0, 1.0), (1.0, 3.0), (9.0, 10.0)];
        let c = columns(&pts, [0.0, 10.0], 5);
        assert_eq!(c, [Some(2.0), None, None, None, Some(10.0)]);
        assert_eq!(columns(&pts, [0.0, 10.0], 0), Vec::<Option<f64>>::new());
    }

    #[test]
    fn round_trips_read_at_a_glance() {
        assert_eq!(rtt(7.46), "7.5 ms");
        assert_eq!(rtt(0.41), "0.4 ms");
        assert_eq!(rtt(1200.0), "1.20 s");
    }
}
