//! Small building blocks the views share: a gauge bar, a one-line meter (label, gauge, value,
//! trend sparkline), throttle badges, the series helpers that turn history into sparkline
//! bars and chart segments, and [`centered`] for boxes drawn over the body. All of them only
//! read.

use super::ansi::narrow_char;
use super::data::{Data, Grid};
use super::format;
use super::theme::Theme;
use crate::history::{Metric, Point};
use crate::telemetry::{GpuSample, throttle};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

const PARTIAL: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];

/// A bar `width` cells wide filled to `ratio` (0..=1) with eighth-cell resolution. An absent
/// ratio draws an empty bar in the `empty` style.
pub fn bar(ratio: Option<f64>, width: usize, fill: Style, empty: Style) -> Vec<Span<'static>> {
    let Some(r) = ratio.filter(|r| r.is_finite()) else {
        return vec![Span::styled("░".repeat(width), empty)];
    };
    let eighths = (r.clamp(0.0, 1.0) * width as f64 * 8.0).round() as usize;
    let full = eighths / 8;
    let part = PARTIAL[eighths % 8];
    let used = full + usize::from(!part.is_empty());
    vec![
        Span::styled(format!("{}{}", "█".repeat(full), part), fill),
        Span::styled("░".repeat(width.saturating_sub(used)), empty),
    ]
}

/// [`bar`] written straight into the buffer, one cell at a time: gauges are drawn for every
/// GPU on every frame, and this skips laying out text that is known to be one cell per symbol.
pub fn draw_bar(ratio: Option<f64>, area: Rect, buf: &mut Buffer, fill: Style, empty: Style) {
    let width = area.width as usize;
    let eighths = ratio.filter(|r| r.is_finite()).map_or(0, |r| {
        (r.clamp(0.0, 1.0) * width as f64 * 8.0).round() as usize
    });
    for i in 0..width {
        let (symbol, style) = match (i * 8 + 8).cmp(&eighths) {
            std::cmp::Ordering::Less | std::cmp::Ordering::Equal => ("█", fill),
            _ if i * 8 < eighths => (PARTIAL[eighths % 8], fill),
            _ => ("░", empty),
        };
        buf[(area.x + i as u16, area.y)]
            .set_symbol(symbol)
            .set_style(style);
    }
}

/// Draw `line` on the first row of `area`, as `line.render(area, buf)` draws it: the same
/// cells, the same styles. A line of [`narrow_char`]s only (the console's numbers, units and
/// signs) is drawn a character a cell, without the grapheme segmentation and width lookups
/// ratatui does for every character, which made a GPU's info line cost about as much as the
/// rest of its block; any other line is left to ratatui.
pub fn draw_line(line: &Line, area: Rect, buf: &mut Buffer) {
    // Its width, a column a character, where every character is narrow.
    let width = line.spans.iter().try_fold(0usize, |n, s| {
        s.content
            .chars()
            .try_fold(n, |n, c| narrow_char(c).then_some(n + 1))
    });
    let Some(width) = width else {
        line.render(area, buf);
        return;
    };
    let area = area.intersection(buf.area);
    if area.is_empty() {
        return;
    }
    let area = Rect { height: 1, ..area };
    if width == 0 {
        return;
    }
    buf.set_style(area, line.style);
    let room = usize::from(area.width);
    // Room to spare: the line moves right by its alignment. Too little: its left end is cut
    // by its alignment, its right end by the area.
    let spare = room.saturating_sub(width);
    let over = width.saturating_sub(room);
    let (indent, mut skip) = match line.alignment {
        Some(ratatui::layout::Alignment::Center) => (spare / 2, over / 2),
        Some(ratatui::layout::Alignment::Right) => (spare, over),
        Some(ratatui::layout::Alignment::Left) | None => (0, 0),
    };
    let mut x = area.x + indent as u16;
    let y = area.y;
    for span in &line.spans {
        for c in span.content.chars() {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            if x >= area.right() {
                return;
            }
            buf[(x, y)].set_char(c).set_style(span.style);
            x += 1;
        }
    }
}

/// A plain box border around `area` in `style`, with `left` and `right` titles on its top
/// edge, as `Block::bordered()` draws them, without restyling every cell inside the box
/// first (which `Block` does, and which is most of its cost for a block per GPU per frame).
pub fn draw_frame(area: Rect, buf: &mut Buffer, style: Style, left: Line, right: Line) {
    let area = area.intersection(buf.area);
    if area.width < 2 || area.height < 2 {
        return;
    }
    draw_frame_top(area, buf, style, left, right);
    let (l, r, b) = (area.left(), area.right() - 1, area.bottom() - 1);
    let mut put = |x: u16, y: u16, symbol: &str| {
        buf[(x, y)].set_symbol(symbol).set_style(style);
    };
    put(l, b, "└");
    put(r, b, "┘");
    for x in l + 1..r {
        put(x, b, "─");
    }
    for y in area.top() + 1..b {
        put(l, y, "│");
        put(r, y, "│");
    }
}

/// The top edge of [`draw_frame`]'s border around `area` (at least 2×2), titles included:
/// the same cells, on `buf`, which need hold no more than that row.
pub fn draw_frame_top(area: Rect, buf: &mut Buffer, style: Style, left: Line, right: Line) {
    let (l, r, t) = (area.left(), area.right() - 1, area.top());
    let mut put = |x: u16, symbol: &str| {
        buf[(x, t)].set_symbol(symbol).set_style(style);
    };
    put(l, "┌");
    put(r, "┐");
    for x in l + 1..r {
        put(x, "─");
    }
    // The titles sit between the corners; the right one is drawn last and wins an overlap.
    let titles = Rect::new(l + 1, t, area.width - 2, 1);
    let lw = (left.width() as u16).min(titles.width);
    draw_line(
        &left,
        Rect {
            width: lw,
            ..titles
        },
        buf,
    );
    let rw = (right.width() as u16).min(titles.width);
    let rx = titles.right().saturating_sub(rw).max(titles.left());
    draw_line(
        &right,
        Rect {
            x: rx,
            width: rw,
            ..titles
        },
        buf,
    );
}

/// `ratio` rounded to the eighths of a cell a gauge `width` cells wide shows (what
/// [`draw_bar`] draws of it is unchanged; nearby ratios become equal).
pub fn gauge_ratio(ratio: Option<f64>, width: u16) -> Option<f64> {
    let steps = f64::from(width.max(1)) * 8.0;
    ratio.map(|r| {
        if r.is_finite() {
            (r.clamp(0.0, 1.0) * steps).round() / steps
        } else {
            r
        }
    })
}

/// Values of one series, one per column, newest at the right; `None` where nothing was sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    pub values: Vec<Option<f64>>,
    /// The value a full-height bar stands for.
    pub max: f64,
}

impl Trend {
    /// The last `width` sampling intervals of a series, up to the newest snapshot. Bins sit
    /// on the sampling grid of the series (centred on its samples), so a steady sampler fills
    /// every column and a gap means samples really were missing.
    ///
    /// The series is placed against the newest snapshot's time, not the frame's: a reading is
    /// taken some time before the snapshot that carries it is sent, so a frame drawn late in a
    /// period (for an answer or a key) would otherwise find every series a period behind and
    /// shift every sparkline by a column, and back on the next snapshot. Snapshot and readings
    /// also share a clock (the daemon's, which may be another machine's). A GPU that stops
    /// reporting while the others go on falls behind the snapshots and shows the gap; once the
    /// whole source is stale, the series are placed against the frame's time (on the source's
    /// clock, [`Data::source_now`]), so the gap since the last data shows too.
    pub fn recent(data: &Data, gpu: usize, metric: Metric, width: usize, max: f64) -> Trend {
        Trend::made(data, gpu, metric, width, max, true)
    }

    /// [`Trend::recent`], its columns from the raw samples through [`Data::trends`] (`keep`)
    /// or from the history's windows.
    fn made(data: &Data, gpu: usize, metric: Metric, width: usize, max: f64, keep: bool) -> Trend {
        let period = data.refresh_s();
        let Some((last_t, _)) = data.history.last(gpu, metric) else {
            return Trend {
                values: vec![None; width],
                max,
            };
        };
        let newest = match &data.snapshot {
            Some(s) if !data.source_stale() => s.time_s,
            _ => data.source_now(),
        };
        let behind = ((newest - last_t) / period).floor().max(0.0);
        let to = last_t + (behind + 0.5) * period;
        let from = to - width as f64 * period;
        // Columns older than the first sample stay empty: the query starts on the grid at or
        // after it, so the history answers from raw samples, not coarse buckets.
        let skip = data.since.map_or(0, |s| {
            (((s - from) / period - 1e-9).ceil().max(0.0) as usize).min(width)
        });
        let mut values = vec![None; width];
        let from_q = from + skip as f64 * period;
        let grid = Grid {
            from,
            period,
            width,
        };
        if !(keep
            && data
                .trends
                .columns(&data.history, gpu, metric, grid, skip, last_t, &mut values))
        {
            data.history
                .window_each(gpu, metric, from_q, to, width - skip, |p| {
                    if let Some(i) = grid.column(p.t) {
                        values[i] = Some(p.mean);
                    }
                });
        }
        // A sampler whose tick runs close to the GPU's reading may publish one reading twice
        // and skip the next; a lone empty column between two readings is that jitter, not an
        // outage (those last several intervals and stay empty), so it takes its left
        // neighbour's value instead of flickering as the chart scrolls.
        for i in 1..width.saturating_sub(1) {
            if values[i].is_none() && values[i + 1].is_some() {
                values[i] = values[i - 1];
            }
        }
        // The column holding the first sample starts before it: ask for just that span.
        if let (Some(s), Some(i)) = (data.since, skip.checked_sub(1)) {
            if let Some(p) = data.history.window(gpu, metric, s, from_q, 1).first() {
                values[i] = Some(p.mean);
            }
        }
        Trend { values, max }
    }

    /// The series as sparkline bars `rows` high: each value on a scale of 1,000 (to `max`),
    /// then in eighths of a row, as ratatui's `Sparkline` scales them.
    pub fn bars(&self, rows: u16) -> Bars {
        let scale = 1000.0 / self.max.max(1e-9);
        let max_ticks = u64::from(rows) * 8;
        let ticks = self
            .values
            .iter()
            .map(|v| {
                v.map(|v| {
                    // From 1,000 up, the bar is full (and the product cannot overflow).
                    let u = round_up_from_half(v.max(0.0) * scale).min(1000);
                    (u * max_ticks / 1000) as u16
                })
            })
            .collect();
        Bars { ticks, rows }
    }
}

/// `x.round() as u64` for `x` from 0 up (NaN is 0), without the call `round` is on a
/// baseline x86-64: the part below the point is exact to compute (below 2^52; above it there
/// is none), so a half or more rounds up, as `round` does.
fn round_up_from_half(x: f64) -> u64 {
    let whole = x as u64;
    if x - whole as f64 >= 0.5 {
        whole.saturating_add(1)
    } else {
        whole
    }
}

/// Sparkline bars as they are drawn: per column, the bar's height in eighths of a row (None
/// where nothing was sampled: a blank column), for an area `rows` high. Equal bars draw equal
/// cells, which is what lets a GPU block that did not change be left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bars {
    pub ticks: Vec<Option<u16>>,
    pub rows: u16,
}

impl Bars {
    /// The newest `area.width` bars, right-aligned to the data, bottom row up, in `style`
    /// (as ratatui's `Sparkline` draws them, without building its data each frame).
    pub fn render(&self, area: Rect, buf: &mut Buffer, style: Style) {
        let area = area.intersection(buf.area);
        let n = area.width as usize;
        let drawn = self.ticks.len().min(n) as u16;
        for x in 0..drawn {
            for y in 0..area.height {
                if let Some(eighths) = self.eighths_at(area, x, y) {
                    buf[(area.x + x, area.y + y)]
                        .set_symbol(eighths_symbol(eighths))
                        .set_style(style);
                }
            }
        }
    }

    /// What [`Bars::render`] draws on `area` at column `x` and row `y` of it (counted from
    /// its top left): the eighths of the cell its bar fills, 0 to 8 ([`eighths_symbol`]), or
    /// None where it draws nothing (columns right of the data).
    pub fn eighths_at(&self, area: Rect, x: u16, y: u16) -> Option<u16> {
        let skip = self.ticks.len().saturating_sub(usize::from(area.width));
        let t = self.ticks.get(skip + usize::from(x))?;
        // Each row up from the bottom one shows eight eighths less of the bar; a column with
        // no value is blank.
        let below = area.height.saturating_sub(y + 1);
        Some(t.map_or(0, |t| t.saturating_sub(8 * below).min(8)))
    }
}

/// A sparkline cell `eighths` of a row high (a full block from 8 up).
pub fn eighths_symbol(eighths: u16) -> &'static str {
    use ratatui::symbols::bar;
    match eighths {
        0 => " ",
        1 => bar::ONE_EIGHTH,
        2 => bar::ONE_QUARTER,
        3 => bar::THREE_EIGHTHS,
        4 => bar::HALF,
        5 => bar::FIVE_EIGHTHS,
        6 => bar::THREE_QUARTERS,
        7 => bar::SEVEN_EIGHTHS,
        _ => bar::FULL,
    }
}

/// One meter: `label  ████░░░░  value  ▂▃▅▆▇` on its first row; the sparkline fills every
/// row of the area (its bars are for an area that tall: [`Trend::bars`]).
pub struct Meter<'a> {
    pub label: &'a str,
    pub label_width: u16,
    pub ratio: Option<f64>,
    pub gauge_width: u16,
    pub value: &'a str,
    pub value_width: u16,
    pub fill: Style,
    pub value_style: Style,
    pub trend: Option<&'a Bars>,
    pub trend_style: Style,
    pub theme: &'a Theme,
}

/// A part of a [`Meter`] that can be drawn alone (see [`MeterAreas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MeterPart {
    Label,
    Gauge,
    Value,
    Trend,
}

/// Where the parts of a meter go on its area: the label, the gauge and the value on its first
/// row, each value and sparkline after a blank column (which its area includes); the
/// sparkline fills every row. A part with no room is empty. Nothing else is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeterAreas {
    pub label: Rect,
    pub gauge: Rect,
    pub value: Rect,
    pub trend: Rect,
}

impl MeterAreas {
    /// The parts of a meter on `area` with these widths, with a sparkline or without.
    pub fn of(
        area: Rect,
        label_width: u16,
        gauge_width: u16,
        value_width: u16,
        trend: bool,
    ) -> MeterAreas {
        let label_w = label_width.min(area.width);
        let mut x = area.x + label_w;
        let gauge_w = gauge_width.min(area.right().saturating_sub(x));
        let gauge = Rect::new(x, area.y, gauge_w, area.height.min(1));
        x += gauge_w;
        let value_w = (value_width + 1).min(area.right().saturating_sub(x));
        let value = Rect::new(x, area.y, value_w, area.height.min(1));
        x += value_w;
        let w = area.right().saturating_sub(x + 1);
        let trend = if trend && w >= 4 {
            Rect::new(x, area.y, w + 1, area.height)
        } else {
            Rect::new(x, area.y, 0, 0)
        };
        MeterAreas {
            label: Rect::new(area.x, area.y, label_w, area.height.min(1)),
            gauge,
            value,
            trend,
        }
    }

    /// The area of `part`.
    pub fn of_part(&self, part: MeterPart) -> Rect {
        match part {
            MeterPart::Label => self.label,
            MeterPart::Gauge => self.gauge,
            MeterPart::Value => self.value,
            MeterPart::Trend => self.trend,
        }
    }
}

impl Meter<'_> {
    /// Where this meter's parts go on `area`.
    pub fn areas(&self, area: Rect) -> MeterAreas {
        MeterAreas::of(
            area,
            self.label_width,
            self.gauge_width,
            self.value_width,
            self.trend.is_some(),
        )
    }

    /// Draw one part of the meter on `area` (the whole meter's): the same cells the whole
    /// meter draws there, and nothing outside the part's area.
    pub fn render_part(&self, area: Rect, buf: &mut Buffer, part: MeterPart) {
        let t = self.theme;
        let a = self.areas(area).of_part(part);
        if a.is_empty() {
            return;
        }
        match part {
            MeterPart::Label => {
                buf.set_stringn(a.x, a.y, self.label, a.width as usize, t.dim);
            }
            MeterPart::Gauge => {
                let empty = if self.ratio.is_some() {
                    t.gauge_empty
                } else {
                    t.na
                };
                draw_bar(self.ratio, a, buf, self.fill, empty);
            }
            MeterPart::Value => {
                let style = if self.value == format::NA {
                    t.na
                } else {
                    self.value_style
                };
                let w = a.width.saturating_sub(1) as usize;
                buf.set_stringn(a.x + 1, a.y, format::fit(self.value, w), w, style);
            }
            MeterPart::Trend => {
                if let Some(trend) = self.trend {
                    let bars = Rect::new(a.x + 1, a.y, a.width - 1, a.height);
                    trend.render(bars, buf, self.trend_style);
                }
            }
        }
    }
}

impl Widget for Meter<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        for part in [
            MeterPart::Label,
            MeterPart::Gauge,
            MeterPart::Value,
            MeterPart::Trend,
        ] {
            self.render_part(area, buf, part);
        }
    }
}

/// Badges for a GPU's state: `LOST`, `stale`, then one per throttle reason (`pwr-cap`,
/// `thermal`, …). Reasons that cost throughput (power, thermal) stand out.
pub fn badges(g: &GpuSample, theme: &Theme) -> Vec<Span<'static>> {
    let mut out = Vec::new();
    // An XID within the last hour of this reading: the newest one's number.
    if let Some(x) = g.recent_xid(g.time_s, crate::telemetry::xid::XID_RECENT_S) {
        let app = crate::telemetry::xid::explain(x.xid).blame
            == crate::telemetry::xid::Blame::Application;
        let style = if app { theme.badge_warn } else { theme.lost };
        out.push(Span::styled(format!(" XID {} ", x.xid), style));
        out.push(Span::raw(" "));
    }
    if g.lost {
        out.push(Span::styled(" LOST ", theme.lost));
        return out;
    }
    if g.stale {
        out.push(Span::styled(" stale ", theme.stale));
        out.push(Span::raw(" "));
    }
    if let Some(bits) = g.throttle_reasons {
        for (bit, name, _) in throttle::REASONS {
            if bits & bit == 0 {
                continue;
            }
            let style = if throttle::held(*bit).any() {
                theme.badge_warn
            } else {
                theme.badge
            };
            out.push(Span::styled(format!(" {name} "), style));
            out.push(Span::raw(" "));
        }
    }
    if out.last().is_some_and(|s| s.content == " ") {
        out.pop();
    }
    out
}

/// Split chart points into runs with no gap longer than `max_gap` seconds, as (x, y) pairs
/// with x relative to `now` (so the right edge is 0). A line across a gap would draw values
/// that were never read.
pub fn segments(points: &[Point], now: f64, max_gap: f64) -> Vec<Vec<(f64, f64)>> {
    let mut out: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut prev: Option<f64> = None;
    for p in points {
        if prev.is_none_or(|t| p.t - t > max_gap) {
            out.push(Vec::new());
        }
        if let Some(seg) = out.last_mut() {
            seg.push((p.t - now, p.mean));
        }
        prev = Some(p.t);
    }
    out
}

/// The level style for `value` against a `limit`: ok, warn within `warn_frac` of it, crit at
/// or past `crit_frac`.
pub fn level(
    theme: &Theme,
    value: Option<f64>,
    limit: Option<f64>,
    warn_frac: f64,
    crit_frac: f64,
) -> Style {
    match (value, limit) {
        (Some(v), Some(l)) if l > 0.0 && v >= l * crit_frac => theme.crit,
        (Some(v), Some(l)) if l > 0.0 && v >= l * warn_frac => theme.warn,
        _ => theme.ok,
    }
}

/// The rectangle of `area` centred with at most `w`×`h` cells.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Characters for lines: narrow ones of every kind, and some that are not (wide, zero
    /// width, combining, a control, the soft hyphen) to send a line to ratatui.
    const CHARS: [char; 16] = [
        'a', '7', ' ', '%', '°', '·', '↓', '─', '▇', '⣿', '—', '漢', '\u{301}', '\u{200B}', '\t',
        '\u{AD}',
    ];

    fn any_style() -> impl proptest::strategy::Strategy<Value = Style> {
        use proptest::prelude::*;
        use ratatui::style::{Color, Modifier};
        let colour = prop_oneof![Just(None), Just(Some(Color::Red)), Just(Some(Color::Reset))];
        (colour.clone(), colour, 0u16..4, 0u16..4).prop_map(|(fg, bg, add, sub)| {
            let mut st = Style::new()
                .add_modifier(Modifier::from_bits_truncate(add))
                .remove_modifier(Modifier::from_bits_truncate(sub));
            st.fg = fg;
            st.bg = bg;
            st
        })
    }

    proptest::proptest! {
        /// A line drawn by `draw_line` leaves the buffer as ratatui's `Line::render` does,
        /// narrow or not, aligned any way, in an area wider or narrower than it, over cells
        /// already drawn.
        #[test]
        fn lines_draw_as_ratatui_draws_them(
            spans in proptest::collection::vec(
                (proptest::collection::vec(0usize..16, 0..12), any_style()),
                0..5,
            ),
            narrow_only in proptest::prelude::any::<bool>(),
            line_style in any_style(),
            align in 0u8..4,
            (x, w) in (0u16..6, 0u16..40),
            under in proptest::collection::vec(0usize..11, 48),
        ) {
            use ratatui::layout::Alignment;
            let spans: Vec<Span> = spans
                .into_iter()
                .map(|(chars, st)| {
                    let text: String = chars
                        .into_iter()
                        .map(|i| CHARS[if narrow_only { i % 11 } else { i }])
                        .collect();
                    Span::styled(text, st)
                })
                .collect();
            let mut line = Line::from(spans).style(line_style);
            line.alignment = match align {
                0 => None,
                1 => Some(Alignment::Left),
                2 => Some(Alignment::Center),
                _ => Some(Alignment::Right),
            };
            let mut want = Buffer::empty(Rect::new(0, 0, 48, 2));
            for (i, g) in under.iter().enumerate() {
                want[(i as u16, 0)].set_char(CHARS[*g]).set_style(Style::new().fg(ratatui::style::Color::Blue));
            }
            let mut got = want.clone();
            let area = Rect::new(x, 0, w, 2);
            (&line).render(area, &mut want);
            draw_line(&line, area, &mut got);
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn bars_draw_as_ratatuis_sparkline() {
        use ratatui::style::Color;
        use ratatui::widgets::{Sparkline, SparklineBar};
        let style = Style::new().fg(Color::Green);
        // A fixed pseudo-random walk over the range, with gaps and values past the maximum.
        let mut x = 7u64;
        let mut values = Vec::new();
        for _ in 0..300 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let v = (x >> 33) as f64 / (1u64 << 31) as f64 * 120.0 - 5.0;
            values.push((x % 11 != 0).then_some(v));
        }
        for rows in 1..=4u16 {
            for width in [4u16, 37, 120] {
                let trend = Trend {
                    values: values.clone(),
                    max: 100.0,
                };
                let area = Rect::new(2, 1, width, rows);
                let mut want = Buffer::empty(Rect::new(0, 0, width + 4, rows + 2));
                let mut got = want.clone();
                let scale = 1000.0 / trend.max;
                let skip = values.len() - width as usize;
                let data: Vec<SparklineBar> = values[skip..]
                    .iter()
                    .map(|v| SparklineBar::from(v.map(|v| (v.max(0.0) * scale).round() as u64)))
                    .collect();
                Sparkline::default()
                    .data(data)
                    .max(1000)
                    .style(style)
                    .absent_value_symbol(" ")
                    .render(area, &mut want);
                trend.bars(rows).render(area, &mut got, style);
                assert_eq!(got, want, "{rows} rows, {width} wide");
            }
        }
    }

    #[test]
    fn gauge_ratios_keep_what_the_gauge_shows() {
        let fill = Style::new().fg(ratatui::style::Color::Red);
        let empty = Style::default();
        for width in [1u16, 8, 13, 30] {
            for k in 0..=1000 {
                let r = Some(k as f64 / 1000.0 * 1.1 - 0.05);
                let area = Rect::new(0, 0, width, 1);
                let mut a = Buffer::empty(area);
                let mut b = Buffer::empty(area);
                draw_bar(r, area, &mut a, fill, empty);
                draw_bar(gauge_ratio(r, width), area, &mut b, fill, empty);
                assert_eq!(a, b, "{r:?} on {width}");
            }
        }
        assert_eq!(gauge_ratio(Some(0.5001), 10), gauge_ratio(Some(0.4999), 10));
        assert_eq!(gauge_ratio(None, 10), None);
    }

    #[test]
    fn frames_match_bordered_blocks() {
        use ratatui::style::{Color, Modifier};
        use ratatui::widgets::Block;
        let border = Style::new().fg(Color::Cyan);
        let title = Style::new().add_modifier(Modifier::BOLD);
        let left = || {
            Line::from(vec![
                Span::styled(" 3 ", border),
                Span::styled("NVIDIA H100 80GB HBM3 ", title),
            ])
        };
        let right = || {
            Line::from(vec![
                Span::styled(" pwr-cap ", Style::new().bg(Color::Red)),
                Span::raw(" "),
                Span::styled(" thermal ", Style::new().bg(Color::Yellow)),
            ])
            .right_aligned()
        };
        for (w, h) in [(100, 11), (40, 5), (24, 3), (2, 2), (12, 4)] {
            let area = Rect::new(1, 1, w, h);
            let mut want = Buffer::empty(Rect::new(0, 0, w + 2, h + 2));
            let mut got = want.clone();
            Block::bordered()
                .border_style(border)
                .title(left())
                .title(right())
                .render(area, &mut want);
            draw_frame(area, &mut got, border, left(), right());
            assert_eq!(got, want, "{w}x{h}");
        }
    }

    #[test]
    fn bars_drawn_in_place_match_bars_as_text() {
        let s = Style::default();
        for r in [
            None,
            Some(0.0),
            Some(0.26),
            Some(0.53),
            Some(0.999),
            Some(1.0),
            Some(7.0),
        ] {
            let mut buf = Buffer::empty(Rect::new(0, 0, 9, 1));
            draw_bar(r, buf.area, &mut buf, s, s);
            let drawn: String = buf.content().iter().map(|c| c.symbol()).collect();
            let text: String = bar(r, 9, s, s)
                .iter()
                .map(|s| s.content.to_string())
                .collect();
            assert_eq!(drawn, text, "{r:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn rounding_up_from_a_half_is_round(bits in proptest::num::u64::ANY, small in 0f64..2e3) {
            let any = f64::from_bits(bits).abs();
            for x in [any, small, small.floor() + 0.5, (small.floor() + 0.5).next_down()] {
                proptest::prop_assert_eq!(round_up_from_half(x), x.round() as u64, "{:e}", x);
            }
        }
    }

    #[test]
    fn rounding_up_from_a_half_at_the_edges() {
        for x in [
            0.0,
            0.5,
            0.49999999999999994,
            1.5,
            2.5,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e30,
            f64::MAX,
            f64::INFINITY,
            f64::NAN,
        ] {
            assert_eq!(round_up_from_half(x), x.round() as u64, "{x:e}");
        }
    }

    #[test]
    fn bars_fill_by_eighths() {
        let s = Style::default();
        let text = |r| {
            bar(r, 4, s, s)
                .iter()
                .map(|s| s.content.to_string())
                .collect::<String>()
        };
        assert_eq!(text(Some(0.0)), "░░░░");
        assert_eq!(text(Some(0.5)), "██░░");
        assert_eq!(text(Some(0.53)), "██▏░");
        assert_eq!(text(Some(1.4)), "████");
        assert_eq!(text(None), "░░░░");
    }

    #[test]
    fn trends_follow_the_sampling_grid_and_leave_gaps() {
        let mut d = Data::new(Duration::from_secs(1));
        // One reading a second with a little jitter; 5 and 6 never came (an outage), 9 was
        // skipped by the sampler (jitter).
        for i in (0..12).filter(|i| ![5, 6, 9].contains(i)) {
            let t = 1000.0 + i as f64 + if i % 2 == 0 { 0.03 } else { -0.02 };
            d.history.push(0, Metric::UtilGpu, t, i as f64 * 10.0);
        }
        d.since = Some(1000.03);
        d.now = 1011.5;
        let tr = Trend::recent(&d, 0, Metric::UtilGpu, 12, 100.0);
        let v: Vec<Option<f64>> = tr.values.iter().map(|v| v.map(f64::round)).collect();
        let expected = [
            Some(0.0),
            Some(10.0),
            Some(20.0),
            Some(30.0),
            Some(40.0),
            None,
            None,
            Some(70.0),
            Some(80.0),
            Some(80.0),
            Some(100.0),
            Some(110.0),
        ];
        assert_eq!(
            v, expected,
            "the outage stays a gap, the lone skip is bridged"
        );
        let tr = Trend::recent(&d, 0, Metric::UtilGpu, 14, 100.0);
        assert_eq!(
            tr.values[..2],
            [None, None],
            "nothing before the first reading"
        );
        // Ten seconds later, with no new readings, the trend has moved left and shows the gap.
        d.now = 1021.5;
        let tr = Trend::recent(&d, 0, Metric::UtilGpu, 12, 100.0);
        let v: Vec<Option<f64>> = tr.values.iter().map(|v| v.map(f64::round)).collect();
        assert_eq!(v[..2], [Some(100.0), Some(110.0)]);
        assert!(v[2..].iter().all(Option::is_none));
        assert!(
            Trend::recent(&d, 3, Metric::UtilGpu, 5, 100.0)
                .values
                .iter()
                .all(Option::is_none)
        );
    }

    /// A series sampled about once a period: jitter, outages, a reading twice in one period,
    /// frames drawn late; the trend the console keeps is the trend made afresh, every frame.
    fn jittering_frames() -> impl proptest::strategy::Strategy<Value = Vec<(Vec<f64>, f64)>> {
        use proptest::prelude::*;
        // Per frame: the readings that came (offsets from the frame's tick, in periods; none
        // for an outage) and how late the frame is drawn.
        proptest::collection::vec(
            (
                prop_oneof![
                    6 => (-0.45f64..0.45).prop_map(|j| vec![j]),
                    1 => Just(vec![]),
                    1 => (-0.45f64..0.0, 0.05f64..0.45).prop_map(|(a, b)| vec![a, b]),
                ],
                prop_oneof![4 => 0.0f64..0.4, 1 => 1.0f64..3.5],
            ),
            1..90,
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn a_trend_kept_from_frame_to_frame_is_the_trend_made_afresh(
            frames in jittering_frames(),
            width in 1usize..40,
        ) {
            let period = 1.0;
            let mut d = Data::new(Duration::from_secs_f64(period));
            let base = 1.7e9 + 0.123;
            for (tick, (readings, late)) in frames.iter().enumerate() {
                for j in readings {
                    let t = base + (tick as f64 + j) * period;
                    d.history.push(0, Metric::UtilGpu, t, (t * 7.3).sin() * 50.0 + 50.0);
                    d.since.get_or_insert(t);
                }
                d.now = base + (tick as f64 + 0.45 + late) * period;
                let kept = std::mem::take(&mut d.trends);
                let fresh = Trend::recent(&d, 0, Metric::UtilGpu, width, 100.0);
                d.trends = kept;
                let got = Trend::recent(&d, 0, Metric::UtilGpu, width, 100.0);
                proptest::prop_assert_eq!(&got, &fresh, "frame {}", tick);
                // And both are what the history's windows say.
                let windows = Trend::made(&d, 0, Metric::UtilGpu, width, 100.0, false);
                proptest::prop_assert_eq!(&got, &windows, "frame {}", tick);
            }
        }
    }

    #[test]
    fn a_steady_series_keeps_its_columns_and_reads_only_the_new_sample() {
        let mut d = Data::new(Duration::from_secs(1));
        let base = 1.7e9;
        let width = 30;
        for tick in 0..200u32 {
            // The sampler's tick wanders by a few milliseconds either way.
            let t = base + f64::from(tick) + f64::from(tick % 7) * 0.003 - 0.01;
            d.history
                .push(0, Metric::Power, t, f64::from(tick % 13) * 40.0);
            d.since.get_or_insert(t);
            d.now = t + 0.2;
            let got = Trend::recent(&d, 0, Metric::Power, width, 700.0);
            let kept = std::mem::take(&mut d.trends);
            assert_eq!(
                got,
                Trend::recent(&d, 0, Metric::Power, width, 700.0),
                "tick {tick}"
            );
            d.trends = kept;
        }
        let (kept, rebinned) = d.trends.counts();
        // Binned once, at the first frame, and kept from then on: also while the history
        // was younger than the trend.
        assert_eq!((kept, rebinned), (199, 1));
        // Another width is another grid; a history replaced is another history.
        Trend::recent(&d, 0, Metric::Power, width + 1, 700.0);
        d.history = d.history.clone();
        Trend::recent(&d, 0, Metric::Power, width + 1, 700.0);
        assert_eq!(d.trends.counts(), (199, 3));
    }

    #[test]
    fn segments_break_at_gaps() {
        let p = |t: f64| Point {
            t,
            min: t,
            mean: t,
            max: t,
        };
        let segs = segments(&[p(1.0), p(2.0), p(3.0), p(10.0), p(11.0)], 11.0, 2.5);
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[0], vec![(-10.0, 1.0), (-9.0, 2.0), (-8.0, 3.0)]);
        assert_eq!(segs[1], vec![(-1.0, 10.0), (0.0, 11.0)]);
    }

    #[test]
    fn badges_name_state_and_reasons() {
        let theme = Theme::default();
        let text = |g: &GpuSample| {
            badges(g, &theme)
                .iter()
                .map(|s| s.content.to_string())
                .collect::<String>()
        };
        let mut g = GpuSample {
            throttle_reasons: Some(throttle::SW_POWER_CAP | throttle::GPU_IDLE),
            ..Default::default()
        };
        assert_eq!(text(&g), " idle   pwr-cap ");
        g.stale = true;
        assert_eq!(text(&g), " stale   idle   pwr-cap ");
        g.lost = true;
        assert_eq!(text(&g), " LOST ");
        assert!(badges(&GpuSample::default(), &theme).is_empty());
    }
}
