//! The Run view: the list of runs (when there are several), the shown run's state (status,
//! pid, uptime, restarts, how each attempt ended, command, GPUs), for a run of several ranks
//! its rank table, and the end of its log with the search's matches marked. The log follows
//! new output unless scrolled or searched. The run's knobs and the keys that change them are
//! in the bottom border of its panel at every size ([`knobs_row`]).

pub mod band;
pub mod knob_dialog;
pub mod knobs_row;
pub mod ranks;
pub mod state;
pub mod tuner_panel;

use super::Ctx;
use crate::protocol::{LogStream, RunInfo};
use crate::supervisor::RunStatus;
use crate::text::printable;
use crate::tui::data::Data;
use crate::tui::feed::{Link, local::NO_RUNS};
use crate::tui::log::{LogBuffer, matches};
use crate::tui::theme::Theme;
use crate::units::format_duration;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Padding, Paragraph, Row, Table, Widget, Wrap};
use state::{RunState, list, window};
use tuner_panel::TunerUi;
use unicode_width::UnicodeWidthStr;

/// Where each part of the view goes: a pure function of the body and the number of runs,
/// shared by render and by the app (a page of log is as many lines as fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The run list (a header row and the runs), when there are several runs.
    pub list: Option<Rect>,
    pub info: Rect,
    /// The rank table (see [`ranks`]), for a run of several ranks, when it fits.
    pub ranks: Option<Rect>,
    /// The training charts and knobs (see [`band`]), when the run has them and they fit.
    pub band: Option<Rect>,
    pub log: Rect,
}

impl Layout {
    pub fn new(body: Rect, runs: usize) -> Layout {
        Layout::with_band(body, runs, false)
    }

    /// The layout of `run`'s view: what it has (a band, a rank table) decides the parts.
    /// Render and the app (a page of log) both ask here, so they agree.
    pub fn of(body: Rect, data: &Data, run: &RunInfo) -> Layout {
        Layout::with_parts(
            body,
            data.run_list().len(),
            band::has_band(data, run),
            ranks::wanted_rows(data, &run.id),
        )
    }

    /// The layout with room for the band when `band` (the run has metrics or knobs).
    pub fn with_band(body: Rect, runs: usize, band: bool) -> Layout {
        Layout::with_parts(body, runs, band, 0)
    }

    /// The layout with room for the band when `band`, and for a rank table of `rank_rows`
    /// rows (0: none). The rank table comes before the band: where both do not fit beside the
    /// log, the band goes first (the table shows the change in flight too).
    pub fn with_parts(body: Rect, runs: usize, band: bool, rank_rows: u16) -> Layout {
        // The list gets up to a third of what the run's own panels leave.
        let list_rows = if runs >= 2 {
            let cap = (body.height.saturating_sub(10) / 3).max(1);
            (runs as u16).min(cap) + 1
        } else {
            0
        };
        let rest = body.height.saturating_sub(list_rows + 5);
        let room = rest.saturating_sub(band::LOG_MIN);
        let rank_rows = if rank_rows > 0 && room >= ranks::MIN_ROWS {
            rank_rows.min(room)
        } else {
            0
        };
        let band_rows = if band {
            band::rows(rest - rank_rows)
        } else {
            0
        };
        let [list, info, ranks_area, band_area, log] = ratatui::layout::Layout::vertical([
            Constraint::Length(list_rows),
            Constraint::Length(5),
            Constraint::Length(rank_rows),
            Constraint::Length(band_rows),
            Constraint::Min(3),
        ])
        .areas(body);
        Layout {
            list: (runs >= 2).then_some(list),
            info,
            ranks: (rank_rows > 0).then_some(ranks_area),
            band: (band_rows > 0).then_some(band_area),
            log,
        }
    }

    /// Log lines on screen.
    pub fn log_rows(&self) -> usize {
        self.log.height.saturating_sub(2) as usize
    }
}

/// The Run view, borrowed for one frame: its state, and the console's tuner (whose panel it
/// draws over the log of the run it tunes).
pub struct RunView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a RunState,
    pub tuner: &'a TunerUi,
    /// The selected GPU (a position in the snapshot): the power cap `c` sets, when the run
    /// uses it.
    pub selected: usize,
}

impl Widget for RunView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let v = &self;
        let t = v.ctx.theme;
        let d = v.ctx.data;
        let Some(run) = v.state.current(d) else {
            let text = match (&d.link, &d.runs) {
                (Link::Local, _) => NO_RUNS.to_string(),
                (Link::Gone { .. }, _) => {
                    "The daemon is gone, and with it the list of runs (the runs themselves go on). \
                     `gpupilot daemon --detach` starts it again; this console reconnects."
                        .to_string()
                }
                (_, None) => "Waiting for the daemon's list of runs…".to_string(),
                (_, Some(_)) => "No runs yet. Start one with `gpupilot run -- python3 train.py` \
                                 or `gpupilot run PROFILE.toml`: it shows here, and keeps running \
                                 when this console quits."
                    .to_string(),
            };
            let block = Block::bordered()
                .border_style(t.border)
                .title(Span::styled(" Run ", t.title))
                .padding(Padding::horizontal(1));
            Paragraph::new(text)
                .style(t.dim)
                .block(block)
                .wrap(Wrap { trim: true })
                .render(area, buf);
            return;
        };
        let layout = Layout::of(area, d, run);
        if let Some(list_area) = layout.list {
            render_list(v, run, list_area, buf);
        }
        render_info(v.ctx, run, v.selected, layout.info, buf);
        if let (Some(ranks_area), Some(tr)) = (layout.ranks, ranks::trainer_of(d, &run.id)) {
            ranks::render(t, d, &run.id, tr, ranks_area, buf);
        }
        if let Some(band_area) = layout.band {
            band::render(v.ctx, run, band_area, buf);
        }
        let mut log = layout.log;
        if let Some(s) = v.tuner.of(&run.id) {
            // The console's energy tuner on this run: its panel above the log.
            let h = tuner_panel::height(t, s, log);
            tuner_panel::render(t, s, Rect { height: h, ..log }, buf);
            log = Rect {
                y: log.y + h,
                height: log.height - h,
                ..log
            };
        }
        render_log(t, v.state, v.state.buffer(d), log, buf);
    }
}

/// The style a status is shown in.
fn status_style(s: RunStatus, t: &Theme) -> Style {
    match s {
        RunStatus::Running | RunStatus::Succeeded => t.ok,
        RunStatus::Paused | RunStatus::Stopping | RunStatus::Backoff => t.warn,
        RunStatus::Failed => t.crit,
        RunStatus::Stopped | RunStatus::Unknown => t.dim,
    }
}

/// How a run ended, short: `exit 1`, `SIGTERM`, `?`; `-` while it runs.
fn exit_cell(r: &RunInfo) -> String {
    match (r.exit_code, &r.signal_name) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => s.clone(),
        (None, None) if r.is_final() => "?".into(),
        (None, None) => "-".into(),
    }
}

fn render_list(v: &RunView, shown: &RunInfo, area: Rect, buf: &mut Buffer) {
    let t = v.ctx.theme;
    let rows_fit = area.height.saturating_sub(1) as usize;
    let skip = v.state.selected.saturating_sub(rows_fit.saturating_sub(1));
    let rows: Vec<Row> = list(v.ctx.data)
        .enumerate()
        .skip(skip)
        .take(rows_fit)
        .map(|(i, r)| {
            let mark = if r.id == shown.id { "▶" } else { " " };
            let row = Row::new(vec![
                Cell::from(mark),
                Cell::from(printable(&r.id)),
                Cell::from(Span::styled(r.status.as_str(), status_style(r.status, t))),
                Cell::from(r.uptime_s.map_or("-".into(), format_duration)),
                Cell::from(r.restarts.to_string()),
                Cell::from(exit_cell(r)),
                Cell::from(printable(&shell_words::join(&r.command))),
            ]);
            if i == v.state.selected {
                row.style(t.selected)
            } else {
                row
            }
        })
        .collect();
    let n = v.ctx.data.run_list().len();
    let header = Row::new(vec![
        "",
        "RUN",
        "STATUS",
        "UPTIME",
        "RESTARTS",
        "EXIT",
        if n > rows_fit {
            "COMMAND  (j/k more)"
        } else {
            "COMMAND"
        },
    ])
    .style(t.dim);
    Table::new(
        rows,
        [
            Constraint::Length(1),
            Constraint::Length(24),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Fill(1),
        ],
    )
    .header(header)
    .column_spacing(1)
    .render(area, buf);
}

fn render_info(ctx: Ctx, r: &RunInfo, selected: usize, area: Rect, buf: &mut Buffer) {
    let t = ctx.theme;
    let dim = |s: &str| Span::styled(s.to_string(), t.dim);
    let sep = || Span::styled(" · ", t.dim);
    let mut first = vec![dim("pid ")];
    first.push(Span::raw(match r.pid {
        Some(p) if !r.is_final() => p.to_string(),
        _ => "-".into(),
    }));
    first.extend([sep(), dim(if r.is_final() { "ran " } else { "up " })]);
    first.push(Span::raw(r.uptime_s.map_or("-".into(), format_duration)));
    first.extend([sep(), dim("restarts "), Span::raw(r.restarts.to_string())]);
    first.extend([sep(), dim("GPUs "), Span::raw(r.gpus.clone())]);
    if r.adopted {
        first.extend([sep(), dim("adopted")]);
    }
    if let Some(e) = &r.energy {
        // Whole figures only: a cut `0.11 J/sample` reads `0.11 J/s`, another unit. Borders
        // and padding take four cells.
        let room = (area.width as usize).saturating_sub(4);
        let used: usize = first.iter().map(Span::width).sum::<usize>() + " · energy ".len();
        let line = crate::tui::control::energy_line(e);
        let mut kept = String::new();
        for part in line.split(" · ") {
            let next = if kept.is_empty() {
                part.to_string()
            } else {
                format!("{kept} · {part}")
            };
            if used + UnicodeWidthStr::width(next.as_str()) > room {
                break;
            }
            kept = next;
        }
        if !kept.is_empty() {
            first.extend([sep(), dim("energy "), Span::raw(kept)]);
        }
    }
    let log = &ctx.data.log;
    let exits = if log.run.as_deref() == Some(r.id.as_str()) && !log.exits.is_empty() {
        log.exits.join(" · ")
    } else if r.is_final() {
        r.description.clone().unwrap_or_else(|| exit_cell(r))
    } else {
        "none yet".into()
    };
    let mut second = vec![dim("exits: "), Span::raw(exits)];
    if !r.is_final() && r.attempt > 0 {
        second.push(dim(&format!(" · now attempt {}", r.attempt + 1)));
    }
    if r.is_final() {
        // Where the daemon writes it when a run ends (`gpupilot report RUN` writes it again).
        second.extend([
            dim(" · report "),
            Span::raw(crate::report::html_path(&r.dir).display().to_string()),
        ]);
    }
    let second = Line::from(second);
    let third = Line::from(vec![
        Span::styled("$ ", t.dim),
        Span::raw(printable(&shell_words::join(&r.command))),
        Span::styled(
            format!("   in {}", printable(&r.cwd.display().to_string())),
            t.dim,
        ),
    ]);
    let status = Span::styled(
        format!(" {} ", r.status.as_str()),
        status_style(r.status, t),
    );
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Span::styled(format!(" Run {} ", printable(&r.id)), t.title))
        .title(Line::from(status).right_aligned())
        .padding(Padding::horizontal(1));
    let knobs = knobs_row::spans(ctx, r, selected, area.width.saturating_sub(2) as usize);
    if !knobs.is_empty() {
        block = block.title_bottom(Line::from(knobs));
    }
    Paragraph::new(vec![Line::from(first), second, third])
        .block(block)
        .render(area, buf);
}

fn render_log(t: &Theme, st: &RunState, log: Option<&LogBuffer>, area: Rect, buf: &mut Buffer) {
    let name = st.stream.as_str();
    let other = match st.stream {
        LogStream::Stdout => "stderr",
        LogStream::Stderr => "stdout",
    };
    let mut block = Block::bordered()
        .border_style(t.border)
        .title(Line::from(vec![
            Span::styled(format!(" {name} "), t.title),
            Span::styled(format!("(e: {other}) "), t.dim),
        ]));
    let rows = area.height.saturating_sub(2) as usize;
    let Some(b) = log else {
        Paragraph::new(Line::styled("reading the log…", t.dim))
            .block(block)
            .render(area, buf);
        return;
    };
    let (first, end) = window(st, b, rows);
    let right = if st.follow {
        Span::styled(" following ", t.ok)
    } else {
        Span::styled(
            format!(" lines {}–{} of {}  G: follow ", first + 1, end, b.end()),
            t.dim,
        )
    };
    block = block.title(Line::from(right).right_aligned());
    if !st.query.is_empty() {
        let at = match st.current {
            Some(c) => format!(" /{}  match on line {}  n/N ", st.query, c + 1),
            None => format!(" /{}  n/N ", st.query),
        };
        block = block.title_bottom(Line::styled(at, t.key).right_aligned());
    }
    if b.truncated && first == b.start() {
        block = block.title_bottom(Line::styled(" earlier output: gpupilot logs RUN ", t.dim));
    }
    let lines: Vec<Line> = if b.is_empty() {
        vec![Line::styled("(no output yet)", t.dim)]
    } else {
        (first..end)
            .map(|n| {
                let text = b.line(n).unwrap_or_default();
                let style = if st.current == Some(n) {
                    t.search_current
                } else {
                    t.search_match
                };
                highlight(&text, &st.query, style)
            })
            .collect()
    };
    Paragraph::new(lines).block(block).render(area, buf);
}

/// `text` with every match of `query` in `style`.
fn highlight(text: &str, query: &str, style: Style) -> Line<'static> {
    let mut spans = Vec::new();
    let mut at = 0;
    for (s, e) in matches(text, query) {
        if s > at {
            spans.push(Span::raw(text[at..s].to_string()));
        }
        spans.push(Span::styled(text[s..e].to_string(), style));
        at = e;
    }
    if at < text.len() {
        spans.push(Span::raw(text[at..].to_string()));
    }
    Line::from(spans)
}
