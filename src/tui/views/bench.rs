//! The bench view: a burn as it runs (`gpupilot bench burn` draws it in the terminal while the
//! load is on). A progress line with the label (`SIMULATED` on the simulator's figures), one
//! chart each for temperature, SM clock and power with a line per GPU, and a legend row per
//! GPU with its newest figures and throttle badges.
//!
//! Render reads the [`BurnProgress`] and the theme, and changes nothing.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph, Widget};

use crate::control::bench::Label;
use crate::control::bench::burn::{BurnPoint, BurnProgress};
use crate::tui::format::NA;
use crate::tui::theme::Theme;
use crate::units::format_duration;

/// The burn's live view.
pub struct BenchView<'a> {
    pub progress: &'a BurnProgress,
    pub theme: &'a Theme,
}

/// One figure of a read, for a chart.
type Reading = fn(&BurnPoint) -> Option<f64>;

/// Smallest area the view draws in; below it says so.
const MIN_W: u16 = 40;
const MIN_H: u16 = 12;

impl Widget for &BenchView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        if area.width < MIN_W || area.height < MIN_H {
            Paragraph::new(Line::styled(
                format!("terminal too small for the bench view ({MIN_W}×{MIN_H})"),
                t.status_error,
            ))
            .render(area, buf);
            return;
        }
        let p = self.progress;
        let legend_rows = (p.gpus.len() as u16 + 1).min(area.height / 3);
        let [head, charts, legend] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(6),
            Constraint::Length(legend_rows),
        ])
        .areas(area);
        self.header(head, buf);
        let rows = Layout::vertical([Constraint::Ratio(1, 3); 3]).split(charts);
        let metrics: [(&str, &str, Style, Reading); 3] = [
            ("Temperature", "°C", t.temperature, |p| p.temperature_c),
            ("SM clock", "MHz", t.clock, |p| {
                p.sm_clock_mhz.map(f64::from)
            }),
            ("Power", "W", t.power, |p| p.power_w),
        ];
        for (row, (title, unit, style, get)) in rows.iter().zip(metrics) {
            self.chart(*row, buf, title, unit, style, get);
        }
        self.legend(legend, buf);
    }
}

impl BenchView<'_> {
    fn header(&self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        let p = self.progress;
        let label = match p.label {
            Label::Simulated => Span::styled(" SIMULATED ", t.badge_warn),
            Label::Measured => Span::styled(" measured ", t.badge),
        };
        let text = format!(
            " bench burn · {} · {} of {} ",
            p.workload.as_str(),
            format_duration(p.elapsed_s),
            format_duration(p.duration_s)
        );
        let used = text.chars().count() as u16 + label.width() as u16 + 1;
        Line::from(vec![Span::styled(text, t.title), label, Span::raw(" ")]).render(area, buf);
        let bar = Rect {
            x: area.x + used,
            width: area.width.saturating_sub(used),
            ..area
        };
        let ratio = (p.duration_s > 0.0).then(|| (p.elapsed_s / p.duration_s).clamp(0.0, 1.0));
        crate::tui::widgets::draw_bar(ratio, bar, buf, t.util, t.gauge_empty);
    }

    /// One chart: `get` of every GPU's points against seconds into the burn.
    fn chart(
        &self,
        area: Rect,
        buf: &mut Buffer,
        title: &str,
        unit: &str,
        style: Style,
        get: Reading,
    ) {
        let t = self.theme;
        let p = self.progress;
        let series: Vec<Vec<(f64, f64)>> = p
            .gpus
            .iter()
            .map(|g| {
                g.points
                    .iter()
                    .filter_map(|pt| get(pt).map(|v| (pt.t_s, v)))
                    .collect()
            })
            .collect();
        let values = series.iter().flatten().map(|(_, v)| *v);
        let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
        let (lo, hi) = if lo.is_finite() {
            let pad = ((hi - lo) * 0.1).max(1.0);
            ((lo - pad).max(0.0).floor(), (hi + pad).ceil())
        } else {
            (0.0, 1.0)
        };
        let block = Block::bordered()
            .border_style(t.border)
            .title(Span::styled(format!(" {title} ({unit}) "), style));
        let sets: Vec<Dataset> = series
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Dataset::default()
                    .marker(Marker::Braille)
                    .graph_type(GraphType::Line)
                    .style(gpu_style(t, i))
                    .data(s)
            })
            .collect();
        let x_max = p.duration_s.max(1.0);
        Chart::new(sets)
            .block(block)
            .x_axis(Axis::default().style(t.axis).bounds([0.0, x_max]))
            .y_axis(
                Axis::default()
                    .style(t.axis)
                    .bounds([lo, hi])
                    .labels([format!("{lo:.0}"), format!("{hi:.0}")]),
            )
            .render(area, buf);
    }

    fn legend(&self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        let mut lines = vec![Line::styled(
            "  GPU  model                     temp     clock    power   throttle",
            t.dim,
        )];
        for (i, g) in self.progress.gpus.iter().enumerate() {
            let last = g.points.last().copied().unwrap_or_default();
            let name: String = g
                .name
                .as_deref()
                .unwrap_or("N/A")
                .chars()
                .take(24)
                .collect();
            let mut spans = vec![
                Span::styled("━ ", gpu_style(t, i)),
                Span::styled(format!("{:>3}  {name:<24}", g.gpu), t.text),
                Span::styled(
                    format!(
                        "{:>7}  {:>8}  {:>7}  ",
                        na(last.temperature_c.map(|v| format!("{v:.0} °C"))),
                        na(last.sm_clock_mhz.map(|v| format!("{v} MHz"))),
                        na(last.power_w.map(|v| format!("{v:.0} W")))
                    ),
                    t.text,
                ),
            ];
            let bits = last.throttle_reasons & !crate::telemetry::throttle::GPU_IDLE;
            for b in crate::telemetry::throttle_reason_badges(bits) {
                spans.push(Span::styled(format!(" {b} "), t.badge_warn));
                spans.push(Span::raw(" "));
            }
            lines.push(Line::from(spans));
        }
        Paragraph::new(lines).render(area, buf);
    }
}

fn na(v: Option<String>) -> String {
    v.unwrap_or_else(|| NA.into())
}

/// The line style of the `i`-th GPU: the theme's metric colours in turn.
fn gpu_style(t: &Theme, i: usize) -> Style {
    [
        t.util,
        t.memory,
        t.temperature,
        t.power,
        t.clock,
        t.ok,
        t.warn,
        t.crit,
    ][i % 8]
}
