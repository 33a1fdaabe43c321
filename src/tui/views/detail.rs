//! GPU detail: braille line charts of the selected GPU over a chosen window (1 min … 7 days)
//! for utilization, memory, temperature (with the slowdown line), power (with the cap line)
//! and SM clock, the current value in each chart's title and the window's min and max under
//! it, and the processes on the GPU with their memory. Its first line adds the memory's health:
//! rows remapped or pages retired, and a reset pending or a GPU to replace.
//!
//! Charts ask the history for at most two points per column (braille has two dots across a
//! cell) and break their line where samples are missing: a gap is drawn as a gap.

use super::Ctx;
use crate::history::Metric;
use crate::telemetry::{GpuSample, throttle_reason_names};
use crate::text::printable;
use crate::tui::format;
use crate::tui::theme::Theme;
use crate::tui::widgets::{badges, segments};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Chart, Dataset, GraphType, Paragraph, Row, Table, Widget, Wrap,
};

/// The chart windows, shortest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TimeWindow {
    #[default]
    Minute,
    TenMinutes,
    Hour,
    Day,
    Week,
}

impl TimeWindow {
    const ALL: [TimeWindow; 5] = [
        TimeWindow::Minute,
        TimeWindow::TenMinutes,
        TimeWindow::Hour,
        TimeWindow::Day,
        TimeWindow::Week,
    ];

    pub fn seconds(self) -> f64 {
        match self {
            TimeWindow::Minute => 60.0,
            TimeWindow::TenMinutes => 600.0,
            TimeWindow::Hour => 3600.0,
            TimeWindow::Day => 86400.0,
            TimeWindow::Week => 7.0 * 86400.0,
        }
    }

    pub fn label(self) -> String {
        format::span(self.seconds())
    }

    fn step(self, by: isize) -> TimeWindow {
        let i = TimeWindow::ALL.iter().position(|w| *w == self).unwrap_or(0) as isize;
        TimeWindow::ALL[(i + by).clamp(0, TimeWindow::ALL.len() as isize - 1) as usize]
    }

    pub fn shorter(self) -> TimeWindow {
        self.step(-1)
    }

    pub fn longer(self) -> TimeWindow {
        self.step(1)
    }
}

/// What the detail view remembers between frames.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DetailState {
    pub window: TimeWindow,
    /// First process row shown.
    pub process_scroll: usize,
}

/// The detail view, borrowed for one frame: its state, and the GPU shown (a position in the
/// snapshot).
pub struct DetailView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a DetailState,
    pub selected: usize,
}

impl Widget for DetailView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let v = &self;
        let t = v.ctx.theme;
        let Some(g) = v.ctx.data.gpu(v.selected) else {
            let msg = if v.ctx.data.snapshot.is_none() {
                v.ctx.data.no_snapshot_text()
            } else {
                "No GPU to show.".into()
            };
            Paragraph::new(msg)
                .style(t.dim)
                .wrap(Wrap { trim: true })
                .render(area, buf);
            return;
        };
        let [info, grid] =
            Layout::vertical([Constraint::Length(1), Constraint::Fill(1)]).areas(area);
        let badges = Line::from(badges(g, t));
        let left = Rect {
            width: info.width.saturating_sub(badges.width() as u16 + 1),
            ..info
        };
        info_line(g, v.ctx.data.name(v.selected), t).render(left, buf);
        badges.right_aligned().render(info, buf);

        let rows: [Rect; 3] = Layout::vertical([Constraint::Ratio(1, 3); 3]).areas(grid);
        let cells: Vec<[Rect; 2]> = rows
            .iter()
            .map(|r| Layout::horizontal([Constraint::Ratio(1, 2); 2]).areas(*r))
            .collect();
        let specs = chart_specs(g, t);
        for (spec, area) in specs.into_iter().zip([
            cells[0][0],
            cells[0][1],
            cells[1][0],
            cells[1][1],
            cells[2][0],
        ]) {
            render_chart(v, g, &spec, area, buf);
        }
        let cell = cells[2][1];
        match super::mig::instances(g) {
            // A GPU in MIG mode: its instances above its processes, in at most half the cell.
            Some(m) => {
                let h = super::mig::table_height(m).min(cell.height / 2 + 1);
                let [top, rest] =
                    Layout::vertical([Constraint::Length(h), Constraint::Fill(1)]).areas(cell);
                super::mig::render_table(g, m, t, top, buf);
                render_processes(v, g, rest, buf);
            }
            None => render_processes(v, g, cell, buf),
        }
    }
}

fn info_line<'a>(g: &GpuSample, name: Option<&str>, t: &Theme) -> Line<'a> {
    let na = || format::NA.to_string();
    let dim = |s: &'static str| Span::styled(s, t.dim);
    let mut spans = vec![
        Span::styled(format!(" GPU {} ", g.index), t.title),
        Span::styled(name.map_or_else(na, printable), t.title),
        dim(" · bus "),
        Span::raw(g.pci_bus_id.clone().unwrap_or_else(na)),
        dim(" · P-state "),
        Span::raw(g.pstate.map_or_else(na, |p| format!("P{p}"))),
        dim(" · energy "),
        Span::raw(format::energy(g.energy_j)),
        dim(" · ECC "),
        Span::raw(match (g.ecc_corrected, g.ecc_uncorrected) {
            (None, None) => na(),
            (c, u) => format!(
                "{} corr / {} uncorr",
                c.map_or_else(na, |c| c.to_string()),
                u.map_or_else(na, |u| u.to_string())
            ),
        }),
    ];
    spans.extend(memory_health(g, t));
    spans.extend(link_health(g, t));
    if let Some(bits) = g.throttle_reasons.filter(|b| *b != 0) {
        spans.push(dim(" · held by "));
        spans.push(Span::styled(throttle_reason_names(bits).join(", "), t.warn));
    }
    Line::from(spans)
}

/// Remapped rows (A100 on) or retired pages (before A100), with what waits for a reset and
/// what means replace; nothing where the GPU reports neither or its memory is spotless.
fn memory_health<'a>(g: &GpuSample, t: &Theme) -> Vec<Span<'a>> {
    use crate::telemetry::memory::{MemoryAdvice, memory_health};
    let Some(m) = memory_health(g) else {
        return Vec::new();
    };
    let mut spans = vec![Span::styled(" · ", t.dim), Span::raw(m.what)];
    if let Some(a) = m.advice {
        let style = if a == MemoryAdvice::Replace {
            t.lost
        } else {
            t.warn
        };
        spans.push(Span::styled(format!(" ({})", a.words(m.remapping)), style));
    }
    spans
}

/// A PCIe link below the board's best (narrower, or at a lower generation while the GPU works:
/// an idle GPU lowers its generation to save power) and NVLink links down, with what to do;
/// nothing where every link is at its best or the GPU does not say.
fn link_health<'a>(g: &GpuSample, t: &Theme) -> Vec<Span<'a>> {
    let mut spans = Vec::new();
    if let (Some(generation), Some(width), Some(max_gen), Some(max_width)) =
        (g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max)
    {
        let busy = g.pstate.is_some_and(|p| p <= 2) || g.util_gpu_pct.is_some_and(|u| u > 0.0);
        if width < max_width || (busy && generation < max_gen) {
            spans.push(Span::styled(" · ", t.dim));
            spans.push(Span::styled(
                format!(
                    "PCIe Gen{generation} x{width} of Gen{max_gen} x{max_width} (reseat, check the riser)"
                ),
                t.warn,
            ));
        }
    }
    let down = g.nvlink.as_ref().map(|n| n.down()).unwrap_or_default();
    if !down.is_empty() {
        let list: Vec<String> = down.iter().map(u32::to_string).collect();
        spans.push(Span::styled(" · ", t.dim));
        spans.push(Span::styled(
            format!("NVLink {} down (reset the GPU)", list.join(", ")),
            t.warn,
        ));
    }
    spans
}

/// One chart: a series, its scale and bounds, and an optional horizontal limit line.
struct ChartSpec {
    title: &'static str,
    metric: Metric,
    /// Multiplies the stored values (bytes → GiB).
    scale: f64,
    /// Bounds before the data widens them.
    y: [f64; 2],
    value: String,
    style: Style,
    /// A limit drawn across the chart, in scaled units, and its name.
    limit: Option<(f64, &'static str)>,
    unit: &'static str,
}

fn chart_specs(g: &GpuSample, t: &Theme) -> [ChartSpec; 5] {
    const GIB: f64 = (1u64 << 30) as f64;
    let lost = |s: String| if g.lost { "LOST".to_string() } else { s };
    let cap = g.power_limit_w.or(g.power_enforced_w);
    let power_top = [g.power_max_w, cap, g.power_default_w]
        .into_iter()
        .flatten()
        .fold(0.0, f64::max);
    let slowdown = g.temp_slowdown_c.or(g.temp_gpu_max_c);
    [
        ChartSpec {
            title: "Utilization",
            metric: Metric::UtilGpu,
            scale: 1.0,
            y: [0.0, 100.0],
            value: lost(format::pct(g.util_gpu_pct)),
            style: t.util,
            limit: None,
            unit: "%",
        },
        ChartSpec {
            title: "Memory",
            metric: Metric::MemoryUsed,
            scale: 1.0 / GIB,
            y: [0.0, g.memory_total_bytes.map_or(1.0, |b| b as f64 / GIB)],
            value: lost(format::memory(g.memory_used_bytes, g.memory_total_bytes)),
            style: t.memory,
            limit: None,
            unit: "GiB",
        },
        ChartSpec {
            title: "Temperature",
            metric: Metric::Temperature,
            scale: 1.0,
            y: [20.0, slowdown.map_or(90.0, |s| s + 5.0)],
            value: lost(format::temperature(g.temperature_c, g.temp_slowdown_c)),
            style: t.temperature,
            limit: slowdown.map(|s| (s, "slowdown")),
            unit: "°C",
        },
        ChartSpec {
            title: "Power",
            metric: Metric::Power,
            scale: 1.0,
            y: [
                0.0,
                if power_top > 0.0 {
                    power_top * 1.05
                } else {
                    100.0
                },
            ],
            value: lost(format::power(g.power_w, cap)),
            style: t.power,
            limit: cap.map(|c| (c, "cap")),
            unit: "W",
        },
        ChartSpec {
            title: "SM clock",
            metric: Metric::SmClock,
            scale: 1.0,
            y: [0.0, g.sm_clock_max_mhz.map_or(1000.0, f64::from)],
            value: lost(format::mhz_of(g.sm_clock_mhz, g.sm_clock_max_mhz)),
            style: t.clock,
            limit: None,
            unit: "MHz",
        },
    ]
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v.fract().abs() < 0.05 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn render_chart(v: &DetailView, g: &GpuSample, spec: &ChartSpec, area: Rect, buf: &mut Buffer) {
    let t = v.ctx.theme;
    let d = v.ctx.data;
    let window = v.state.window.seconds();
    let value_style = if spec.value == format::NA || spec.value == "LOST" {
        t.na
    } else if g.stale {
        t.stale
    } else {
        spec.style
    };
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(format!(" {} ", spec.title), t.title))
        .title(Line::from(Span::styled(format!(" {} ", spec.value), value_style)).right_aligned());
    let inner = block.inner(area);
    let cols = inner.width.saturating_sub(6).max(1) as usize;
    // Nothing is older than the first sample: asking from there keeps the history from
    // answering out of a coarse bucket that straddles the start.
    // The history is on the source's clock.
    let now = d.source_now();
    let from = d.since.map_or(now - window, |s| s.max(now - window));
    let points_wanted = ((cols * 2) as f64 * (now - from) / window).ceil().max(1.0) as usize;
    let points = d
        .history
        .window(v.selected, spec.metric, from, now, points_wanted);
    let scaled: Vec<_> = points
        .iter()
        .map(|p| crate::history::Point {
            t: p.t,
            min: p.min * spec.scale,
            mean: p.mean * spec.scale,
            max: p.max * spec.scale,
        })
        .collect();
    // Under the chart: the limit line's key on the left, the window's extremes on the right,
    // each only where it fits.
    let mut room = area.width.saturating_sub(2) as usize;
    if let Some((v, name)) = spec.limit {
        let key = format!(" ── {name} {} {} ", num(v), spec.unit);
        if key.chars().count() <= room {
            room -= key.chars().count();
            block = block.title_bottom(Line::styled(key, t.threshold));
        }
    }
    if !scaled.is_empty() {
        let lo = scaled.iter().map(|p| p.min).fold(f64::INFINITY, f64::min);
        let hi = scaled
            .iter()
            .map(|p| p.max)
            .fold(f64::NEG_INFINITY, f64::max);
        let stats = format!(" min {} · max {} {} ", num(lo), num(hi), spec.unit);
        if stats.chars().count() < room {
            room -= stats.chars().count();
            block = block.title_bottom(Line::styled(stats, t.dim).right_aligned());
        }
    }
    if spec.metric == Metric::SmClock {
        // Under the clock, where there is room: how long it was held down by power and by
        // heat in this window.
        if let Some(key) = limited_summary(v, from) {
            if key.chars().count() < room {
                block = block.title_bottom(Line::styled(key, t.warn));
            }
        }
    }
    block.render(area, buf);
    if inner.height < 2 || inner.width < 8 {
        return;
    }

    let bin = window / (cols * 2) as f64;
    let max_gap = (3.0 * d.refresh_s()).max(2.5 * bin);
    let segs = segments(&scaled, now, max_gap);
    let data_hi = scaled.iter().map(|p| p.max).fold(spec.y[1], f64::max);
    let data_lo = scaled.iter().map(|p| p.min).fold(spec.y[0], f64::min);
    let y = [
        data_lo.min(spec.y[0]),
        if data_hi > spec.y[1] {
            data_hi * 1.05
        } else {
            spec.y[1]
        },
    ];
    let limit_line = spec.limit.map(|(v, _)| [(-window, v), (0.0, v)]);

    let mut datasets = Vec::new();
    if let Some(line) = &limit_line {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(t.threshold)
                .data(line),
        );
    }
    for s in &segs {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(spec.style)
                .data(s),
        );
    }
    let mut x_axis = Axis::default().bounds([-window, 0.0]).style(t.axis);
    if inner.height >= 8 {
        x_axis = x_axis.labels([
            Span::raw(format!("-{}", v.state.window.label())),
            Span::raw("now"),
        ]);
    }
    let y_axis = Axis::default()
        .bounds(y)
        .style(t.axis)
        .labels([Span::raw(num(y[0])), Span::raw(num(y[1]))]);
    Chart::new(datasets)
        .x_axis(x_axis)
        .y_axis(y_axis)
        .legend_position(None)
        .render(inner, buf);
    let first = scaled.first().map(|p| p.t);
    if let Some(first) = first.filter(|f| now - f < window / 4.0) {
        // The samples cover only the end of a long window: say where they start, over the
        // empty part, so the chart does not look empty.
        let plot = inner.width.saturating_sub(6);
        let empty = (f64::from(plot) * (1.0 - (now - first) / window)) as u16;
        let msg = format!(
            "no samples before -{}",
            crate::units::format_duration((now - first).max(1.0))
        );
        if empty as usize > msg.chars().count() + 1 && inner.height >= 3 {
            let r = Rect::new(inner.x + 6, inner.y + inner.height / 2, empty, 1);
            Line::styled(msg, t.na).centered().render(r, buf);
        }
    }
    if scaled.is_empty() {
        let msg = if g.lost {
            "GPU lost: no samples"
        } else {
            "no samples in this window"
        };
        let r = Rect::new(
            inner.x + 6,
            inner.y + inner.height / 2,
            inner.width.saturating_sub(6),
            1,
        );
        Line::styled(msg, t.na).centered().render(r, buf);
    }
}

/// ` power-limited 3m24s · thermal 0s ` over the shown window, from the history's 0/1 series;
/// None when the history has neither.
fn limited_summary(v: &DetailView, from: f64) -> Option<String> {
    let d = v.ctx.data;
    let time = |m| {
        d.history
            .time_at_one(v.selected, m, from, d.source_now(), 120)
    };
    let (p, th) = (time(Metric::PowerLimited), time(Metric::ThermalLimited));
    if p.is_none() && th.is_none() {
        return None;
    }
    let s = |v: Option<(f64, f64)>| {
        v.map_or_else(
            || format::NA.to_string(),
            |(on, _)| crate::units::format_duration(on),
        )
    };
    Some(format!(" power-limited {} · thermal {} ", s(p), s(th)))
}

fn render_processes(v: &DetailView, g: &GpuSample, area: Rect, buf: &mut Buffer) {
    let t = v.ctx.theme;
    let title = match &g.processes {
        Some(p) => format!(" Processes ({}) ", p.len()),
        None => " Processes ".to_string(),
    };
    let block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(title, t.title));
    let inner = block.inner(area);
    block.render(area, buf);
    let procs = match &g.processes {
        None => {
            Paragraph::new("N/A: the driver does not list processes for this GPU")
                .style(t.na)
                .wrap(Wrap { trim: true })
                .render(inner, buf);
            return;
        }
        Some(p) if p.is_empty() => {
            Paragraph::new("no processes")
                .style(t.dim)
                .render(inner, buf);
            return;
        }
        Some(p) => p,
    };
    let scroll = v.state.process_scroll.min(procs.len().saturating_sub(1));
    // The user and the job, container or pod only where some process has them: a narrow
    // panel keeps its room for the command otherwise.
    let owned = procs.iter().any(|p| p.owner.is_some());
    let rows = procs.iter().skip(scroll).map(|p| {
        let mem = p.used_memory_bytes.map_or_else(
            || format::NA.to_string(),
            |b| format!("{} GiB", format::gib(b)),
        );
        let mut cells = vec![p.pid.to_string(), mem];
        if owned {
            let owner = p.owner.as_ref();
            cells.push(
                owner
                    .and_then(|o| o.user_label())
                    .map(|u| printable(&u))
                    .unwrap_or_else(|| format::NA.to_string()),
            );
            cells.push(
                owner
                    .and_then(|o| o.place())
                    .map(|p| printable(&p))
                    .unwrap_or_default(),
            );
        }
        cells.push(
            p.name
                .as_deref()
                .map_or_else(|| format::NA.to_string(), printable),
        );
        Row::new(cells)
    });
    let (widths, header) = if owned {
        (
            vec![
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Length(9),
                Constraint::Length(13),
                Constraint::Fill(1),
            ],
            vec!["PID", "GPU mem", "user", "job/ctr/pod", "command"],
        )
    } else {
        (
            vec![
                Constraint::Length(8),
                Constraint::Length(10),
                Constraint::Fill(1),
            ],
            vec!["PID", "GPU mem", "command"],
        )
    };
    Table::new(rows, widths)
        .header(Row::new(header).style(t.dim))
        .style(t.text)
        .render(inner, buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_step_and_stop_at_the_ends() {
        let w = TimeWindow::default();
        assert_eq!(w.label(), "1m");
        assert_eq!(w.shorter(), w);
        assert_eq!(w.longer().label(), "10m");
        assert_eq!(TimeWindow::Week.longer(), TimeWindow::Week);
        let labels: Vec<_> = TimeWindow::ALL.iter().map(|w| w.label()).collect();
        assert_eq!(labels, ["1m", "10m", "1h", "24h", "7d"]);
    }

    #[test]
    fn memory_health_says_what_was_retired_or_remapped_and_what_to_do() {
        use crate::telemetry::{RemappedRows, RetiredPages};
        let t = Theme::default();
        let text = |g: &GpuSample| -> String {
            memory_health(g, &t)
                .iter()
                .map(|s| s.content.to_string())
                .collect()
        };
        // Nothing reported, or spotless memory: nothing said.
        let mut g = GpuSample::default();
        assert_eq!(text(&g), "");
        g.retired_pages = Some(RetiredPages::default());
        assert_eq!(text(&g), "");
        g.retired_pages = Some(RetiredPages {
            single_bit: 3,
            double_bit: 2,
            pending: true,
        });
        assert_eq!(text(&g), " · 3 sbe + 2 dbe pages retired (reset pending)");
        g.retired_pages = Some(RetiredPages {
            double_bit: RetiredPages::REPLACE_DBE,
            ..RetiredPages::default()
        });
        assert_eq!(
            text(&g),
            " · 0 sbe + 10 dbe pages retired (replace the GPU)"
        );
        g.retired_pages = None;
        g.remapped_rows = Some(RemappedRows {
            correctable: 4,
            uncorrectable: 1,
            pending: false,
            failure: true,
        });
        assert_eq!(text(&g), " · 4 + 1 rows remapped (remap failed: replace)");
    }

    #[test]
    fn link_health_says_a_degraded_pcie_link_and_nvlink_links_down() {
        use crate::telemetry::nvlink::{LinkNow, NvLinkSample};
        let t = Theme::default();
        let text = |g: &GpuSample| -> String {
            link_health(g, &t)
                .iter()
                .map(|s| s.content.to_string())
                .collect()
        };
        let mut g = GpuSample {
            pcie_gen: Some(1),
            pcie_width: Some(16),
            pcie_gen_max: Some(5),
            pcie_width_max: Some(16),
            util_gpu_pct: Some(0.0),
            pstate: Some(8),
            ..GpuSample::default()
        };
        assert_eq!(text(&g), "", "an idle GPU's link saves power");
        g.util_gpu_pct = Some(90.0);
        assert_eq!(
            text(&g),
            " · PCIe Gen1 x16 of Gen5 x16 (reseat, check the riser)"
        );
        g.pcie_gen = Some(5);
        assert_eq!(text(&g), "");
        g.pcie_width = Some(8);
        g.util_gpu_pct = Some(0.0);
        assert_eq!(
            text(&g),
            " · PCIe Gen5 x8 of Gen5 x16 (reseat, check the riser)"
        );
        g.pcie_width = Some(16);
        let up = LinkNow {
            up: Some(true),
            ..LinkNow::default()
        };
        let down = LinkNow {
            up: Some(false),
            ..LinkNow::default()
        };
        g.nvlink = Some(NvLinkSample {
            per_link: vec![up, down, up, down],
            ..NvLinkSample::default()
        });
        assert_eq!(text(&g), " · NVLink 1, 3 down (reset the GPU)");
    }
}
