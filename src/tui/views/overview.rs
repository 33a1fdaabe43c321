//! Overview: one block per GPU with utilization, memory, temperature (against its slowdown
//! threshold) and power (against its cap) as gauges with trend sparklines, throttle reasons
//! as badges, and clocks, P-state, fan and PCIe on a last line.
//!
//! The layout adapts: full blocks in one or two columns when they fit, compact two-line blocks
//! when they do not, and pages of GPUs (the one holding the selection) when even those do not.

use super::Ctx;
use crate::history::Metric;
use crate::telemetry::GpuSample;
use crate::tui::format;
use crate::tui::theme::Theme;
use crate::tui::widgets::{
    Bars, Meter, MeterAreas, MeterPart, Trend, badges, draw_frame, draw_frame_top, draw_line,
    gauge_ratio, level,
};
use ratatui::buffer::Buffer;
use ratatui::layout::{Margin, Position, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget, Wrap};
use std::sync::Arc;

const FULL_HEIGHT: u16 = 7;
const COMPACT_HEIGHT: u16 = 4;
/// Narrowest GPU block when two columns are used.
const MIN_COLUMN_WIDTH: u16 = 60;

/// How much each GPU block shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Density {
    /// Four meter lines and an info line.
    Full,
    /// Two lines of two meters each.
    Compact,
}

/// One GPU's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cell {
    /// Position of the GPU in the snapshot.
    pub gpu: usize,
    pub area: Rect,
}

/// Where each GPU block goes: a pure function of the body size, the GPU count and the
/// selection, shared by render and by mouse clicks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub density: Density,
    /// Rows each meter of a full block gets (its sparkline is that tall).
    pub meter_rows: u16,
    pub cells: Vec<Cell>,
    /// GPUs not shown before and after this page.
    pub hidden: (usize, usize),
}

impl Layout {
    pub fn new(body: Rect, n: usize, selected: usize) -> Layout {
        let two_cols = body.width >= 2 * MIN_COLUMN_WIDTH;
        let fits = |cols: usize, h: u16| n.div_ceil(cols) as u16 * h <= body.height;
        let (density, cols) = if fits(1, FULL_HEIGHT) {
            (Density::Full, 1)
        } else if two_cols && fits(2, FULL_HEIGHT) {
            (Density::Full, 2)
        } else if fits(1, COMPACT_HEIGHT) {
            (Density::Compact, 1)
        } else if two_cols && fits(2, COMPACT_HEIGHT) {
            (Density::Compact, 2)
        } else {
            (Density::Compact, if two_cols { 2 } else { 1 })
        };
        // Spare height goes to the sparklines of full blocks (up to four rows each).
        let meter_rows = match density {
            Density::Full => {
                let block_rows = n.div_ceil(cols).max(1) as u16;
                let spare = body.height.saturating_sub(block_rows * FULL_HEIGHT);
                1 + (spare / (block_rows * 4)).min(3)
            }
            Density::Compact => 1,
        };
        let h = match density {
            Density::Full => FULL_HEIGHT + 4 * (meter_rows - 1),
            Density::Compact => COMPACT_HEIGHT,
        };
        let rows = (body.height / h).max(1) as usize;
        let per_page = rows * cols;
        let first = (selected.min(n.saturating_sub(1)) / per_page) * per_page;
        let last = (first + per_page).min(n);
        let col_w = body.width / cols as u16;
        let cells = (first..last)
            .map(|gpu| {
                let k = gpu - first;
                let (r, c) = (k / cols, k % cols);
                let w = if c + 1 == cols {
                    body.width - col_w * c as u16
                } else {
                    col_w
                };
                Cell {
                    gpu,
                    area: Rect::new(
                        body.x + col_w * c as u16,
                        body.y + r as u16 * h,
                        w,
                        h.min(body.height),
                    ),
                }
            })
            .collect();
        Layout {
            density,
            meter_rows,
            cells,
            hidden: (first, n - last),
        }
    }

    /// The GPU whose block covers `p`.
    pub fn gpu_at(&self, p: Position) -> Option<usize> {
        self.cells
            .iter()
            .find(|c| c.area.contains(p))
            .map(|c| c.gpu)
    }
}

/// The overview, borrowed for one frame, with the GPU selected (a position in the snapshot).
pub struct OverviewView<'a> {
    pub ctx: Ctx<'a>,
    pub selected: usize,
}

impl Widget for OverviewView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let ctx = self.ctx;
        let t = ctx.theme;
        let gpus = ctx.data.gpus();
        if ctx.data.snapshot.is_none() {
            Paragraph::new(ctx.data.no_snapshot_text())
                .style(t.dim)
                .wrap(Wrap { trim: true })
                .render(area, buf);
            return;
        }
        if gpus.is_empty() {
            Paragraph::new("No GPUs: the source enumerates none. `gpupilot doctor` says why; `gpupilot demo` shows a simulated node.")
                .style(t.warn)
                .wrap(Wrap { trim: true })
                .render(area, buf);
            return;
        }
        let layout = Layout::new(area, gpus.len(), self.selected);
        for cell in &layout.cells {
            GpuBlock {
                ctx,
                g: &gpus[cell.gpu],
                pos: cell.gpu,
                selected: cell.gpu == self.selected,
                density: layout.density,
                meter_rows: layout.meter_rows,
            }
            .render(cell.area, buf);
        }
        let (before, after) = layout.hidden;
        if before + after > 0 {
            let note = format!(
                " GPUs {}–{} of {}: the page follows the selection ",
                before + 1,
                gpus.len() - after,
                gpus.len()
            );
            let y = area.bottom().saturating_sub(1);
            Line::styled(note, t.dim)
                .right_aligned()
                .render(Rect::new(area.x, y, area.width, 1), buf);
        }
    }
}

/// Each GPU block of the overview of `body` with GPU `selected` selected: its position, its
/// area and its model. `prev` gives the model each GPU's block had on the last frame, if any:
/// its texts are taken over where what they were made from did not change.
pub fn block_models<'p>(
    ctx: Ctx,
    selected: usize,
    body: Rect,
    prev: impl Fn(usize) -> Option<&'p BlockModel>,
) -> Vec<(usize, Rect, BlockModel)> {
    let gpus = ctx.data.gpus();
    let layout = Layout::new(body, gpus.len(), selected);
    layout
        .cells
        .iter()
        .map(|cell| {
            let block = GpuBlock {
                ctx,
                g: &gpus[cell.gpu],
                pos: cell.gpu,
                selected: cell.gpu == selected,
                density: layout.density,
                meter_rows: layout.meter_rows,
            };
            let model = BlockModel::of(&block, cell.area, prev(cell.gpu));
            (cell.gpu, cell.area, model)
        })
        .collect()
}

/// One GPU's block on one frame: its model, drawn.
struct GpuBlock<'a> {
    ctx: Ctx<'a>,
    g: &'a GpuSample,
    pos: usize,
    selected: bool,
    density: Density,
    meter_rows: u16,
}

impl Widget for GpuBlock<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        BlockModel::of(&self, area, None).draw(self.ctx.theme, area, buf);
    }
}

/// Everything a GPU block shows, quantized to what is drawn: numbers as their text, gauges to
/// eighths of a cell, sparklines to their bar heights. The same model on the same area draws
/// the same cells, so the console leaves a block alone on a frame where its model did not
/// change (most of them: see `tui::screen`). The theme is not in it: it does not change while
/// the console runs.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockModel {
    border: Style,
    title: Made<(u32, Style), Arc<Line<'static>>>,
    badges: Made<BadgeKey, Arc<Line<'static>>>,
    body: BlockBody,
}

/// What a block's badges are made from (see [`badges`]): the newest recent XID, lost, stale,
/// the throttle reasons.
type BadgeKey = (Option<u64>, bool, bool, Option<u64>);

/// A text of a block and what it was made from: the next frame's block takes it over where
/// that did not change, rather than formatting it again (most of a busy node's figures stay
/// the same from one second to the next). Equal where the texts are: what is drawn.
#[derive(Debug, Clone)]
struct Made<K, T> {
    from: K,
    text: T,
}

impl<K, T: PartialEq> PartialEq for Made<K, T> {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl<K: PartialEq, T: Clone> Made<K, T> {
    /// The text `make` makes `from` these inputs, or `prev`'s where it was made from the same.
    fn of(prev: Option<&Made<K, T>>, from: K, make: impl FnOnce() -> T) -> Made<K, T> {
        let text = match prev {
            Some(p) if p.from == from => p.text.clone(),
            _ => make(),
        };
        Made { from, text }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum BlockBody {
    /// The GPU's last XID and what to do, when one was heard.
    Lost(Option<String>),
    Meters {
        density: Density,
        meter_rows: u16,
        meters: Box<[MeterSpec; 4]>,
        /// The clocks, P-state, fan and PCIe line of a full block.
        info: Option<Made<Option<InfoKey>, Arc<Line<'static>>>>,
    },
}

/// Where a block's parts go: the area inside its border, each meter's area, and the gauge,
/// sparkline and value widths.
struct BlockAreas {
    inner: Rect,
    meters: [Rect; 4],
    gauge: u16,
    spark: u16,
    label: u16,
    value: u16,
}

impl BlockAreas {
    /// Where the parts of meter `i` go (every meter of a block has a sparkline).
    fn meter_areas(&self, i: usize) -> MeterAreas {
        MeterAreas::of(self.meters[i], self.label, self.gauge, self.value, true)
    }

    fn of(area: Rect, density: Density, meter_rows: u16) -> BlockAreas {
        let inner = area.inner(Margin::new(2, 1));
        match density {
            Density::Full => {
                let gauge = inner.width.saturating_sub(6 + 17).div_ceil(3).clamp(8, 30);
                let h = meter_rows;
                BlockAreas {
                    inner,
                    meters: std::array::from_fn(|i| rows(inner, i as u16 * h, h)),
                    gauge,
                    spark: inner.width.saturating_sub(6 + gauge + 17 + 1),
                    label: 6,
                    value: 16,
                }
            }
            Density::Compact => {
                let half = inner.width / 2;
                let gauge = half.saturating_sub(6 + 15).div_ceil(2).clamp(4, 20);
                BlockAreas {
                    inner,
                    meters: std::array::from_fn(|i| {
                        let r = rows(inner, (i / 2) as u16, 1);
                        let (x, w) = if i % 2 == 0 {
                            (r.x, half)
                        } else {
                            (r.x + half, r.width - half)
                        };
                        Rect::new(x, r.y, w.saturating_sub(1), r.height)
                    }),
                    gauge,
                    spark: half.saturating_sub(1 + 6 + gauge + 15 + 1),
                    label: 6,
                    value: 14,
                }
            }
        }
    }
}

impl BlockModel {
    /// The model of block `b` on `area`, with the texts of `prev` (the block's last model)
    /// that were made from what `b` still shows.
    fn of(b: &GpuBlock, area: Rect, prev: Option<&BlockModel>) -> BlockModel {
        let t = b.ctx.theme;
        let g = b.g;
        // A GPU's name is the driver's, or a remote node's, words.
        let name = crate::text::printable(b.ctx.data.name(b.pos).unwrap_or(format::NA));
        let border = if b.selected {
            t.border_selected
        } else {
            t.border
        };
        // The name is in the title: taken over only where it reads the same.
        let same_name = |m: &&BlockModel| {
            let shown = m.title.text.spans.get(1);
            shown.and_then(|s| s.content.strip_suffix(' ')) == Some(name.as_str())
        };
        let title = Made::of(
            prev.filter(same_name).map(|m| &m.title),
            (g.index, border),
            || {
                Arc::new(Line::from(vec![
                    Span::styled(format!(" {} ", g.index), border),
                    Span::styled(format!("{name} "), t.title),
                ]))
            },
        );
        let xid = g
            .recent_xid(g.time_s, crate::telemetry::xid::XID_RECENT_S)
            .map(|x| x.xid);
        let badges = Made::of(
            prev.map(|m| &m.badges),
            (xid, g.lost, g.stale, g.throttle_reasons),
            || Arc::new(Line::from(badges(g, t)).right_aligned()),
        );
        let prev_body = prev.and_then(|m| match &m.body {
            BlockBody::Meters { meters, info, .. } => Some((&**meters, info.as_ref())),
            BlockBody::Lost(_) => None,
        });
        let body = if g.lost {
            BlockBody::Lost(g.last_xid().map(|x| {
                let info = crate::telemetry::xid::explain(x.xid);
                format!("{}: {}", info.title(), info.action)
            }))
        } else {
            let a = BlockAreas::of(area, b.density, b.meter_rows);
            let meters = meters(b.ctx, g, b.pos, &a, prev_body.map(|(m, _)| m));
            let info = (b.density == Density::Full).then(|| {
                // A GPU in MIG mode: its line is made on every frame (see `info_line`).
                let from = g.mig.is_none().then(|| InfoKey::of(g));
                let prev = prev_body.and_then(|(_, i)| i).filter(|_| from.is_some());
                Made::of(prev, from, || Arc::new(info_line(g, t)))
            });
            BlockBody::Meters {
                density: b.density,
                meter_rows: b.meter_rows,
                meters: Box::new(meters),
                info,
            }
        };
        BlockModel {
            border,
            title,
            badges,
            body,
        }
    }

    /// Draw the block on `area` (the area its model was made for).
    pub fn draw(&self, t: &Theme, area: Rect, buf: &mut Buffer) {
        draw_frame(
            area,
            buf,
            self.border,
            (*self.title.text).clone(),
            (*self.badges.text).clone(),
        );
        match &self.body {
            BlockBody::Lost(xid) => {
                let text = match xid {
                    Some(x) => format!("LOST after {x}."),
                    None => "LOST: the GPU fell off the bus. Nothing it reported before is current; check `dmesg` for Xid errors.".to_string(),
                };
                Paragraph::new(text)
                    .style(t.lost)
                    .wrap(Wrap { trim: true })
                    .render(area.inner(Margin::new(2, 1)), buf);
            }
            BlockBody::Meters {
                density,
                meter_rows,
                meters,
                info,
            } => {
                let a = BlockAreas::of(area, *density, *meter_rows);
                for (m, r) in meters.iter().zip(a.meters) {
                    m.meter(t, a.label, a.gauge, a.value).render(r, buf);
                }
                if let Some(info) = info {
                    draw_line(&info.text, rows(a.inner, 4 * meter_rows, 1), buf);
                }
            }
        }
    }

    /// Where this block (on `area`) and `next` (on the same area) differ, when only the top
    /// edge (the title and badges), parts of meters (a gauge, a value, a sparkline) or the
    /// info line do: those parts' areas, each drawn by [`Self::draw_part`] alike. `None` when
    /// the border's style or the layout differ (the whole block is redrawn then).
    pub fn changed_parts(&self, next: &BlockModel, area: Rect) -> Option<Vec<(Rect, Part)>> {
        if self.border != next.border || area.width < 2 || area.height < 2 {
            return None;
        }
        let mut parts: Vec<(Rect, Part)> = Vec::new();
        if (&self.title, &self.badges) != (&next.title, &next.badges) {
            // A badge that comes or goes (a throttle reason, most often) redraws the top edge.
            parts.push((Rect { height: 1, ..area }, Part::Top));
        }
        match (&self.body, &next.body) {
            (
                BlockBody::Meters {
                    density,
                    meter_rows,
                    meters,
                    info,
                },
                BlockBody::Meters {
                    density: d2,
                    meter_rows: r2,
                    meters: m2,
                    info: i2,
                },
            ) if (density, meter_rows) == (d2, r2) => {
                let a = BlockAreas::of(area, *density, *meter_rows);
                for (i, (m, n)) in meters.iter().zip(m2.iter()).enumerate() {
                    let at = a.meter_areas(i);
                    for part in m.changed(n) {
                        let r = at.of_part(part);
                        if !r.is_empty() {
                            parts.push((r, Part::Meter(i, part)));
                        }
                    }
                }
                if info != i2 {
                    parts.push((rows(a.inner, 4 * meter_rows, 1), Part::Info));
                }
                Some(parts)
            }
            _ => None,
        }
    }

    /// Draw one part of the block on `area` (the block's area) into `buf`, whose area is the
    /// part's: the same cells [`Self::draw`] draws there.
    pub fn draw_part(&self, t: &Theme, area: Rect, part: Part, buf: &mut Buffer) {
        if part == Part::Top {
            let (title, badges) = ((*self.title.text).clone(), (*self.badges.text).clone());
            draw_frame_top(area, buf, self.border, title, badges);
            return;
        }
        let BlockBody::Meters {
            density,
            meter_rows,
            meters,
            info,
        } = &self.body
        else {
            return;
        };
        let a = BlockAreas::of(area, *density, *meter_rows);
        match part {
            Part::Meter(i, p) => {
                meters[i]
                    .meter(t, a.label, a.gauge, a.value)
                    .render_part(a.meters[i], buf, p)
            }
            Part::Info => {
                if let Some(info) = info {
                    draw_line(&info.text, rows(a.inner, 4 * meter_rows, 1), buf);
                }
            }
            Part::Top => {}
        }
    }
}

impl BlockModel {
    /// What [`Self::draw_part`] draws for `part` on `area` (the block's), cell by cell, where
    /// that is a meter's sparkline: the bars, their area (right of the part's blank first
    /// column) and style. None for any other part.
    pub fn part_bars(&self, area: Rect, part: Part) -> Option<(&Bars, Rect, Style)> {
        let (
            BlockBody::Meters {
                density,
                meter_rows,
                meters,
                ..
            },
            Part::Meter(i, MeterPart::Trend),
        ) = (&self.body, part)
        else {
            return None;
        };
        let a = BlockAreas::of(area, *density, *meter_rows)
            .meter_areas(i)
            .trend;
        let m = meters.get(i)?;
        (!a.is_empty()).then(|| {
            (
                &m.bars,
                Rect::new(a.x + 1, a.y, a.width - 1, a.height),
                m.trend_style,
            )
        })
    }
}

/// A part of a GPU block that can be redrawn alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The top edge of the border, with the title and the badges.
    Top,
    /// A part of meter 0–3 (utilization, memory, temperature, power).
    Meter(usize, MeterPart),
    /// The clocks, P-state, fan and PCIe line.
    Info,
}

/// `n` rows of `area` from row `i` (clipped to its bottom; empty when past it).
fn rows(area: Rect, i: u16, n: u16) -> Rect {
    if i < area.height {
        Rect::new(area.x, area.y + i, area.width, n.min(area.height - i))
    } else {
        Rect::new(area.x, area.y, 0, 0)
    }
}

/// What one meter shows, quantized to what is drawn.
#[derive(Debug, Clone, PartialEq)]
struct MeterSpec {
    label: &'static str,
    /// Rounded to the gauge's eighths of a cell.
    ratio: Option<f64>,
    /// Made from the one or two figures it shows (as bits).
    value: Made<[Option<u64>; 2], Arc<str>>,
    fill: Style,
    bars: Bars,
    trend_style: Style,
}

impl MeterSpec {
    /// The parts of the meter that draw differently as `next`.
    fn changed(&self, next: &MeterSpec) -> impl Iterator<Item = MeterPart> {
        [
            (MeterPart::Label, self.label != next.label),
            (
                MeterPart::Gauge,
                (self.ratio, self.fill) != (next.ratio, next.fill),
            ),
            (MeterPart::Value, self.value != next.value),
            (
                MeterPart::Trend,
                (&self.bars, self.trend_style) != (&next.bars, next.trend_style),
            ),
        ]
        .into_iter()
        .filter_map(|(part, changed)| changed.then_some(part))
    }

    fn meter<'a>(
        &'a self,
        theme: &'a Theme,
        label_width: u16,
        gauge_width: u16,
        value_width: u16,
    ) -> Meter<'a> {
        Meter {
            label: self.label,
            label_width,
            ratio: self.ratio,
            gauge_width,
            value: &self.value.text,
            value_width,
            fill: self.fill,
            value_style: theme.text,
            trend: Some(&self.bars),
            trend_style: self.trend_style,
            theme,
        }
    }
}

fn ratio(v: Option<f64>, of: Option<f64>) -> Option<f64> {
    match (v, of) {
        (Some(v), Some(m)) if m > 0.0 => Some(v / m),
        _ => None,
    }
}

/// Util, memory, temperature, power: the four meters of a GPU block, for its areas `a`, with
/// the values of `prev` (the block's last meters) where they show the same figures. Their
/// sparklines are one column per sampling interval.
fn meters(
    ctx: Ctx,
    g: &GpuSample,
    pos: usize,
    a: &BlockAreas,
    prev: Option<&[MeterSpec; 4]>,
) -> [MeterSpec; 4] {
    let t = ctx.theme;
    let d = ctx.data;
    let w = a.spark as usize;
    let used = g.memory_used_bytes.map(|b| b as f64);
    let total = g.memory_total_bytes.map(|b| b as f64);
    let cap = g.power_limit_w.or(g.power_enforced_w);
    let temp_ref = g.temp_slowdown_c.or(g.temp_gpu_max_c);
    let mem_fill = if ratio(used, total).is_some_and(|r| r >= 0.9) {
        level(t, used, total, 0.9, 0.98)
    } else {
        t.memory
    };
    let bits = |v: Option<f64>| v.map(f64::to_bits);
    let spec = |i: usize,
                label: &'static str,
                r: Option<f64>,
                (from, value): ([Option<u64>; 2], &dyn Fn() -> String),
                fill: Style,
                metric: Metric,
                max: f64,
                trend_style: Style| MeterSpec {
        label,
        ratio: gauge_ratio(r, a.gauge),
        value: Made::of(prev.map(|m| &m[i].value), from, || value().into()),
        fill,
        bars: Trend::recent(d, pos, metric, w, max).bars(a.meters[i].height),
        trend_style,
    };
    [
        spec(
            0,
            "util",
            g.util_gpu_pct.map(|u| u / 100.0),
            ([bits(g.util_gpu_pct), None], &|| {
                format::pct(g.util_gpu_pct)
            }),
            t.util,
            Metric::UtilGpu,
            100.0,
            t.util,
        ),
        spec(
            1,
            "mem",
            ratio(used, total),
            ([g.memory_used_bytes, g.memory_total_bytes], &|| {
                format::memory(g.memory_used_bytes, g.memory_total_bytes)
            }),
            mem_fill,
            Metric::MemoryUsed,
            total.unwrap_or(1.0),
            t.memory,
        ),
        spec(
            2,
            "temp",
            ratio(g.temperature_c, temp_ref.or(Some(100.0))),
            ([bits(g.temperature_c), bits(g.temp_slowdown_c)], &|| {
                format::temperature(g.temperature_c, g.temp_slowdown_c)
            }),
            level(t, g.temperature_c, temp_ref, 0.9, 1.0),
            Metric::Temperature,
            temp_ref.unwrap_or(100.0),
            t.temperature,
        ),
        spec(
            3,
            "power",
            ratio(g.power_w, cap),
            ([bits(g.power_w), bits(cap)], &|| {
                format::power(g.power_w, cap)
            }),
            level(t, g.power_w, cap, 0.9, 1.0),
            Metric::Power,
            g.power_max_w.or(cap).unwrap_or(1.0),
            t.power,
        ),
    ]
}

/// What [`info_line`] is made from, for a GPU not in MIG mode.
#[derive(Debug, Clone, Copy, PartialEq)]
struct InfoKey {
    clocks: [Option<u32>; 4],
    fan: Option<u64>,
    pcie: [Option<u64>; 2],
    processes: Option<usize>,
}

impl InfoKey {
    fn of(g: &GpuSample) -> InfoKey {
        InfoKey {
            clocks: [
                g.sm_clock_mhz,
                g.sm_clock_max_mhz,
                g.mem_clock_mhz,
                g.pstate,
            ],
            fan: g.fan_pct.map(f64::to_bits),
            pcie: [g.pcie_rx_kbps, g.pcie_tx_kbps],
            processes: g.processes.as_ref().map(Vec::len),
        }
    }
}

/// `SM 1980/1980 MHz · mem 2619 MHz · P0 · fan N/A · PCIe ↓12.3 MB/s ↑4.5 MB/s · 1 process`
fn info_line(g: &GpuSample, t: &Theme) -> Line<'static> {
    let v = |s: String| {
        let style = if s == format::NA { t.na } else { t.text };
        Span::styled(s, style)
    };
    let l = |s: &'static str| Span::styled(s, t.dim);
    let procs = match &g.processes {
        None => format::NA.to_string(),
        Some(p) if p.len() == 1 => "1 process".to_string(),
        Some(p) => format!("{} processes", p.len()),
    };
    let mut spans = vec![
        l("SM "),
        v(format::mhz_of(g.sm_clock_mhz, g.sm_clock_max_mhz)),
        l(" · mem "),
        v(format::mhz(g.mem_clock_mhz)),
        l(" · P-state "),
        v(g.pstate
            .map_or_else(|| format::NA.into(), |p| format!("P{p}"))),
        l(" · fan "),
        v(format::pct(g.fan_pct)),
        l(" · PCIe ↓"),
        v(format::kbps(g.pcie_rx_kbps)),
        l(" ↑"),
        v(format::kbps(g.pcie_tx_kbps)),
        l(" · "),
        v(procs),
    ];
    // A GPU in MIG mode: its instances' profiles first, where a narrow block still shows them
    // (the table is in GPU detail).
    if let Some(m) = super::mig::summary(g) {
        spans.splice(0..0, [Span::styled(m, t.text), l(" · ")]);
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Snapshot;
    use crate::tui::data::Data;
    use crate::tui::keymap::Keymap;
    use std::time::Duration;

    #[test]
    fn a_block_made_with_the_last_frame_s_texts_is_the_block_made_afresh() {
        let (theme, keymap) = (Theme::default(), Keymap::defaults());
        let gpu = |s: usize| GpuSample {
            index: 3,
            time_s: 100.0 + s as f64,
            name: (s < 4).then(|| format!("H100 rev {}", s / 2)),
            util_gpu_pct: Some([97.0, 97.0, 98.2, 98.4, 99.0, 99.0][s]),
            memory_used_bytes: Some(30 << 30),
            memory_total_bytes: Some(80 << 30),
            temperature_c: Some([44.0, 45.0, 45.0, 45.0, 45.0, 46.0][s]),
            temp_slowdown_c: Some(89.0),
            power_w: Some(600.0 + s as f64),
            power_limit_w: Some(700.0),
            throttle_reasons: Some(if s % 2 == 0 { 0 } else { 4 }),
            sm_clock_mhz: Some(1980 - s as u32 % 2),
            sm_clock_max_mhz: Some(1980),
            pcie_rx_kbps: Some(3300 + s as u64 / 3),
            processes: (s % 3 != 1).then(Vec::new),
            lost: s == 3,
            ..Default::default()
        };
        let area = Rect::new(0, 3, 100, 11);
        let mut data = Data::new(Duration::from_secs(1));
        let mut last: Option<BlockModel> = None;
        for s in 0..6 {
            data.on_snapshot(Snapshot {
                time_s: 100.0 + s as f64,
                gpus: vec![gpu(s)],
                ..Default::default()
            });
            let ctx = Ctx {
                data: &data,
                theme: &theme,
                keymap: &keymap,
            };
            let block = GpuBlock {
                ctx,
                g: &data.gpus()[0],
                pos: 0,
                selected: s != 2,
                density: Density::Full,
                meter_rows: 2,
            };
            let fresh = BlockModel::of(&block, area, None);
            let made = BlockModel::of(&block, area, last.as_ref());
            assert_eq!(made, fresh, "second {s}");
            let text = |m: &BlockModel| {
                let mut buf = Buffer::empty(area);
                m.draw(&theme, area, &mut buf);
                buf
            };
            assert_eq!(text(&made), text(&fresh), "second {s}");
            last = Some(made);
        }
    }

    #[test]
    fn layout_prefers_full_blocks_then_columns_then_compact_then_pages() {
        let big = Rect::new(0, 3, 200, 46);
        let l = Layout::new(big, 4, 0);
        assert_eq!(
            (l.density, l.cells.len(), l.meter_rows),
            (Density::Full, 4, 2)
        );
        assert!(
            l.cells
                .iter()
                .all(|c| c.area.width == 200 && c.area.height == 11)
        );
        let l = Layout::new(big, 8, 0);
        assert_eq!((l.density, l.cells.len()), (Density::Full, 8));
        assert_eq!(l.cells[1].area.x, 100, "two columns");

        let small = Rect::new(0, 3, 80, 20);
        let l = Layout::new(small, 4, 0);
        assert_eq!(
            (l.density, l.cells.len(), l.hidden),
            (Density::Compact, 4, (0, 0))
        );
        let l = Layout::new(small, 8, 6);
        assert_eq!(l.density, Density::Compact);
        assert_eq!(l.hidden, (5, 0), "the page with the selection");
        assert_eq!(l.cells.first().map(|c| c.gpu), Some(5));
        assert_eq!(l.gpu_at(Position::new(10, 3 + 4 + 1)), Some(6));
        assert_eq!(Layout::new(small, 0, 0).cells, vec![]);
    }
}
