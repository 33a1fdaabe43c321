//! The frame: header (node, driver, CUDA), host line, view tabs, the current view, footer (key
//! hints and status), and the help over it. Render reads the [`App`] and changes nothing; where
//! each part goes is `layout`, which mouse clicks are resolved against too. The footer's key
//! hints are worked out in [`footer`].

mod footer;

use super::action::ViewId;
use super::app::App;
use super::data::Level;
use super::feed::Link;
use super::format;
use super::layout::{Areas, tab_label};
use super::views::advisor::AdvisorView;
use super::views::power_dialog::PowerDialogView;
use super::views::run::knob_dialog::KnobDialogView;
use super::views::run::state::Confirm;
use super::views::topology::TopologyView;
use super::views::{
    detail::DetailView, events::EventsView, help::HelpView, overview::OverviewView, run::RunView,
};
use super::widgets::{bar, draw_line};
use ratatui::buffer::Buffer;
use ratatui::layout::{Alignment, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget, Wrap};

/// Below this the console says the terminal is too small instead of drawing.
pub const MIN_WIDTH: u16 = 40;
pub const MIN_HEIGHT: u16 = 12;

/// The theme's text style over `area`: what every frame starts from.
pub fn base(app: &App, area: Rect, buf: &mut Buffer) {
    if let Some(style) = base_style(app) {
        buf.set_style(area, style);
    }
}

/// The style [`base`] paints, or None where it paints nothing: painting 10,000 cells with the
/// terminal's own default is a waste of a frame.
pub fn base_style(app: &App) -> Option<Style> {
    let t = &app.theme;
    let plain = |c: Option<Color>| c.is_none_or(|c| c == Color::Reset);
    (!(plain(t.text.fg) && plain(t.text.bg) && t.text.add_modifier.is_empty())).then_some(t.text)
}

/// A row of the frame around the view, and what it shows there.
pub type Part = (Rect, fn(&App, Rect) -> Row);

/// The frame's parts when it can be drawn piece by piece: an overview with nothing over it,
/// every GPU on one page, on a terminal big enough. Then the frame is the rows around the view
/// (header, host line, tabs, footer: [`chrome`]) and one block per GPU
/// ([`super::views::overview::block_models`]), and nothing else; `None` otherwise. Two frames
/// with the same [`Pieces`] have their pieces in the same places.
///
/// Whatever [`App`]'s render draws over the body must make this `None`.
pub fn piecewise(app: &App, area: Rect) -> Option<Pieces> {
    let over = app.help.open || app.advisor.open || app.run.dialog.is_some() || app.power.is_some();
    if area.width < MIN_WIDTH
        || area.height < MIN_HEIGHT
        || app.view != ViewId::Overview
        || over
        || app.data.snapshot.is_none()
        || app.data.gpus().is_empty()
    {
        return None;
    }
    let a = app.areas(area);
    let gpus = app.data.gpus().len();
    let layout = super::views::overview::Layout::new(a.body, gpus, app.selected);
    (layout.hidden == (0, 0)).then_some(Pieces { areas: a, gpus })
}

/// Where the pieces of a frame drawn piece by piece go: the frame's areas, and the GPU count
/// (which, with the body, places every block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pieces {
    pub areas: Areas,
    pub gpus: usize,
}

/// The rows around the view, in the order the frame draws them.
pub fn chrome(a: &Areas) -> [Part; 4] {
    [
        (a.header, header_row),
        (a.host, host_row),
        (a.tabs, tabs_row),
        (a.footer, footer_row),
    ]
}

/// What a row around the view shows (the header, the host line, the tabs, the footer): the
/// same row on the same area draws the same cells, so the console leaves a row alone on a
/// frame where it did not change (see `tui::screen`).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// A style over the whole area first.
    base: Option<Style>,
    left: Line<'static>,
    /// Right-aligned over the end of `left`: drawn only when both fit, unless it matters more
    /// (`right_first`).
    right: Option<Line<'static>>,
    right_first: bool,
    /// Instead of lines: text wrapped over the area (an error in the footer), in its style.
    wrapped: Option<(String, Style)>,
}

impl Row {
    fn line(base: Option<Style>, left: Line<'static>) -> Row {
        Row {
            base,
            left,
            right: None,
            right_first: false,
            wrapped: None,
        }
    }

    /// `left` and, right-aligned, `right` on one row. When both do not fit, `right` is
    /// dropped, unless it matters more (`right_first`): then it is drawn over the end of
    /// `left`.
    fn split(
        base: Option<Style>,
        left: Line<'static>,
        right: Line<'static>,
        right_first: bool,
    ) -> Row {
        Row {
            right: Some(right.right_aligned()),
            right_first,
            ..Row::line(base, left)
        }
    }

    /// Draw the row on `area`.
    pub fn draw(&self, area: Rect, buf: &mut Buffer) {
        if let Some(style) = self.base {
            buf.set_style(area, style);
        }
        if let Some((text, style)) = &self.wrapped {
            buf.set_style(area, *style);
            Paragraph::new(text.as_str())
                .style(*style)
                .wrap(Wrap { trim: false })
                .render(area, buf);
            return;
        }
        draw_line(&self.left, area, buf);
        if let Some(right) = &self.right {
            if self.right_first || self.left.width() + right.width() < area.width as usize {
                draw_line(right, area, buf);
            }
        }
    }
}

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = &self.theme;
        base(self, area, buf);
        if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
            let msg = format!(
                "Terminal too small: {}×{}. gpupilot needs at least {MIN_WIDTH}×{MIN_HEIGHT}. Press q to quit.",
                area.width, area.height
            );
            Paragraph::new(msg)
                .style(t.warn)
                .wrap(Wrap { trim: true })
                .alignment(Alignment::Center)
                .render(area, buf);
            return;
        }
        let a = self.areas(area);
        header_row(self, a.header).draw(a.header, buf);
        host_row(self, a.host).draw(a.host, buf);
        tabs_row(self, a.tabs).draw(a.tabs, buf);
        let ctx = self.ctx();
        match self.view {
            ViewId::Overview => OverviewView {
                ctx,
                selected: self.selected,
            }
            .render(a.body, buf),
            ViewId::Detail => DetailView {
                ctx,
                state: &self.detail,
                selected: self.selected,
            }
            .render(a.body, buf),
            ViewId::Run => RunView {
                ctx,
                state: &self.run,
                tuner: &self.tuner,
                selected: self.selected,
            }
            .render(a.body, buf),
            ViewId::Events => EventsView {
                ctx,
                state: &self.events,
            }
            .render(a.body, buf),
            ViewId::Topology => TopologyView { ctx }.render(a.body, buf),
        }
        footer_row(self, a.footer).draw(a.footer, buf);
        if self.help.open {
            HelpView {
                ctx,
                state: &self.help,
                view: self.view,
                replaying: self.replaying(),
            }
            .render(a.body, buf);
        }
        if self.advisor.open {
            AdvisorView {
                ctx,
                state: &self.advisor,
            }
            .render(a.body, buf);
        }
        if let Some(dialog) = &self.run.dialog {
            KnobDialogView { ctx, dialog }.render(a.body, buf);
        }
        if let Some(dialog) = &self.power {
            PowerDialogView { ctx, dialog }.render(a.body, buf);
        }
    }
}

fn sep(t: &crate::tui::theme::Theme) -> Span<'static> {
    Span::styled(" │ ", t.dim)
}

fn header_row(app: &App, area: Rect) -> Row {
    let t = &app.theme;
    // The parts after the name, given up from the end where the right side must fit.
    let mut parts: Vec<Vec<Span<'static>>> = Vec::new();
    match (&app.data.snapshot, &app.data.link) {
        (
            None,
            Link::Daemon {
                telemetry_error: Some(_),
                ..
            },
        ) => parts.push(vec![Span::styled("  no GPU telemetry", t.warn)]),
        (None, Link::Gone { .. }) => {}
        (None, _) => parts.push(vec![Span::styled("  waiting for the first sample…", t.dim)]),
        (Some(s), _) => {
            let n = &s.node;
            let na = || format::NA.to_string();
            parts.extend([
                vec![sep(t), Span::styled(n.hostname.clone(), t.title)],
                vec![
                    sep(t),
                    Span::styled("driver ", t.dim),
                    Span::raw(n.driver_version.clone().unwrap_or_else(na)),
                ],
                vec![
                    sep(t),
                    Span::styled("CUDA ", t.dim),
                    Span::raw(n.cuda_driver_version.clone().unwrap_or_else(na)),
                ],
                vec![
                    sep(t),
                    Span::raw(format!(
                        "{} GPU{}",
                        s.gpus.len(),
                        if s.gpus.len() == 1 { "" } else { "s" }
                    )),
                ],
            ]);
            if n.source == "sim" {
                parts.push(vec![Span::styled("  (simulated)", t.dim)]);
            }
        }
    }
    let left = |parts: &[Vec<Span<'static>>]| {
        let mut spans = vec![Span::styled(" gpupilot", t.header)];
        spans.extend(parts.iter().flatten().cloned());
        Line::from(spans)
    };
    let stale = app.data.source_stale();
    if let Link::Replay {
        file,
        start_s,
        speed,
        paused,
        end,
    } = &app.data.link
    {
        // A replay says so at every width: in full where it fits, else a short marker that
        // the node's details make room for.
        let at = crate::tui::feed::replay::offset(*start_s, app.data.now);
        let (state, short) = match (end, paused) {
            (Some(end), _) => (format!(" · {end}"), " ended".to_string()),
            (None, true) => (" · paused".into(), " paused".into()),
            (None, false) => (String::new(), String::new()),
        };
        let full = format!(" replay {file} {at} ×{speed}{state} ");
        let all = left(&parts);
        let w = area.width as usize;
        if all.width() + full.chars().count() < w {
            return Row::split(Some(t.header), all, Line::styled(full, t.warn), false);
        }
        let marker = format!(" REPLAY {at} ×{speed}{short} ");
        let room = w.saturating_sub(marker.chars().count() + 1);
        while !parts.is_empty() && left(&parts).width() > room {
            parts.pop();
        }
        return Row::split(
            Some(t.header),
            left(&parts),
            Line::styled(marker, t.stale),
            true,
        );
    }
    let right = if let Link::Gone { .. } = app.data.link {
        Line::styled(
            " daemon gone — runs continue; restart with `gpupilot daemon --detach` ",
            t.stale,
        )
    } else if stale {
        let age = app.data.data_age_s();
        Line::styled(
            format!(" STALE: no data for {} ", format::ago(age)),
            t.stale,
        )
    } else {
        Line::styled(
            format!("every {} ", format::span(app.data.refresh_s())),
            t.dim,
        )
    };
    let gone = matches!(app.data.link, Link::Gone { .. });
    Row::split(Some(t.header), left(&parts), right, stale || gone)
}

fn host_row(app: &App, area: Rect) -> Row {
    let t = &app.theme;
    let mut spans = vec![Span::styled(" host ", t.dim)];
    match app.data.snapshot.as_ref().and_then(|s| s.host.as_ref()) {
        None => spans.push(Span::styled(format::NA, t.na)),
        Some(h) => {
            // The whole line is about 70 columns plus two gauges.
            let gauge = (area.width.saturating_sub(70) / 2).clamp(4, 20) as usize;
            spans.push(Span::styled("cpu ", t.dim));
            spans.extend(bar(
                h.cpu_pct.map(|c| c / 100.0),
                gauge,
                t.util,
                t.gauge_empty,
            ));
            spans.push(Span::raw(format!(" {}", format::pct(h.cpu_pct))));
            if let Some(n) = h.cpu_count {
                spans.push(Span::styled(format!(" of {n}"), t.dim));
            }
            spans.push(sep(t));
            spans.push(Span::styled("mem ", t.dim));
            let ratio = match (h.memory_used_bytes, h.memory_total_bytes) {
                (Some(u), Some(m)) if m > 0 => Some(u as f64 / m as f64),
                _ => None,
            };
            spans.extend(bar(ratio, gauge, t.memory, t.gauge_empty));
            spans.push(Span::raw(format!(
                " {}",
                format::memory(h.memory_used_bytes, h.memory_total_bytes)
            )));
            spans.push(sep(t));
            spans.push(Span::styled("load ", t.dim));
            let load = [h.load_1m, h.load_5m, h.load_15m]
                .iter()
                .map(|l| l.map_or_else(|| format::NA.to_string(), |l| format!("{l:.2}")))
                .collect::<Vec<_>>()
                .join(" ");
            spans.push(Span::raw(load));
        }
    }
    Row::line(None, Line::from(spans))
}

fn tabs_row(app: &App, _area: Rect) -> Row {
    let t = &app.theme;
    let mut spans = vec![Span::raw(" ")];
    for (i, v) in ViewId::ALL.into_iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled("│", t.dim));
        }
        let style = if v == app.view { t.tab_active } else { t.tab };
        spans.push(Span::styled(tab_label(&app.keymap, v), style));
    }
    let runs = app.data.run_list().len();
    let right = match (app.view, app.data.gpu(app.selected)) {
        (ViewId::Detail, _) => format!("window {} ", app.detail.window.label()),
        (ViewId::Run, _) if runs > 0 => {
            format!("{runs} run{} ", if runs == 1 { "" } else { "s" })
        }
        (ViewId::Run, _) => String::new(),
        (_, Some(g)) => match app
            .data
            .control
            .as_ref()
            .and_then(|c| super::control::gpu_line(c, g.index))
        {
            // The governor of the selected GPU and the node budget, when on.
            Some(line) => format!("GPU {}: {line} ", g.index),
            None => format!("selected: GPU {} ", g.index),
        },
        (_, None) => String::new(),
    };
    Row::split(None, Line::from(spans), Line::styled(right, t.dim), false)
}

/// The footer's hints, from the keymap, as they fit in `width` (see [`footer`]).
fn hints(app: &App, width: usize) -> Vec<Span<'static>> {
    let t = &app.theme;
    let mut spans = vec![Span::raw(" ")];
    for (i, (key, word)) in footer::fit(&footer::entries(app), width)
        .into_iter()
        .enumerate()
    {
        if i > 0 {
            spans.push(Span::styled("  ", t.footer));
        }
        spans.push(Span::styled(key, t.key));
        spans.push(Span::styled(format!(" {word}"), t.footer));
    }
    spans
}

/// The columns a message or an alert may take on the footer's right: half the row, or on a
/// wide terminal all but a few hints (`? more` and two or three keys), so an alert there is
/// read whole.
fn right_room(width: u16) -> usize {
    let w = width as usize;
    if w >= 120 { w - 30 } else { w / 2 }
}

fn footer_row(app: &App, area: Rect) -> Row {
    let t = &app.theme;
    let row = |left: Line<'static>| Row::line(Some(t.footer), left);
    if let Some(Confirm::Stop(id)) = &app.run.confirm {
        return row(Line::from(vec![
            Span::styled(format!(" Stop run {id}? "), t.warn),
            Span::styled("y", t.key),
            Span::styled(
                " stops it (SIGTERM, SIGKILL after 10 s) · any other key: no",
                t.footer,
            ),
        ]));
    }
    if let Some(ask) = &app.tuner.ask {
        let (q, rest) = super::views::run::tuner_panel::question(ask);
        return row(Line::from(vec![
            Span::styled(q, t.warn),
            Span::styled("y", t.key),
            Span::styled(rest, t.footer),
        ]));
    }
    if let Some(d) = &app.run.dialog {
        return row(Line::styled(format!(" {}", d.keys()), t.footer));
    }
    if let Some(d) = &app.power {
        return row(Line::styled(format!(" {}", d.keys()), t.footer));
    }
    if app.advisor.open {
        return row(Line::styled(
            super::views::advisor::footer(&app.advisor),
            t.footer,
        ));
    }
    if let Some(q) = &app.run.prompt {
        return row(Line::from(vec![
            Span::styled(" /", t.key),
            Span::styled(format!("{q}█"), t.text),
            Span::styled("   Enter: search · Esc: cancel", t.dim),
        ]));
    }
    match app.data.visible_status() {
        Some(s) if s.level == Level::Error => Row {
            wrapped: Some((format!(" {}", s.text), t.status_error)),
            ..row(Line::default())
        },
        status => {
            let w = area.width as usize;
            let right = if let Some(s) = status {
                Some((s.text.clone(), t.status_info))
            } else {
                // Active alerts, while no message is shown.
                app.data
                    .control
                    .as_ref()
                    .and_then(super::control::alert_line)
                    .map(|a| (a, t.warn))
            };
            match right {
                Some((text, style)) => {
                    let text = format::fit(&format!(" {text} "), right_room(area.width));
                    let left = w.saturating_sub(text.chars().count() + 1);
                    Row::split(
                        Some(t.footer),
                        Line::from(hints(app, left)),
                        Line::styled(text, style),
                        true,
                    )
                }
                None => row(Line::from(hints(app, w))),
            }
        }
    }
}
