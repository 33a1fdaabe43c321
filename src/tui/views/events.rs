//! The Events view: the node's `events.jsonl` as the daemon keeps it, newest first: when, who,
//! what, old → new, and why, in the words `gpupilot events` prints
//! ([`crate::protocol::event_words`]). A change is never cut: its column takes the width the
//! terminal leaves, and a row grows a line where it still does not fit. j/k select an event,
//! Enter opens its detail (`detail.rs`), Esc closes it.

mod detail;

use super::Ctx;
use crate::protocol::NodeEventRecord;
use crate::protocol::event_words::{Words, words};
use crate::text::printable;
use crate::tui::action::Action;
use crate::tui::feed::Link;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Cell, Padding, Paragraph, Row, Table, Widget, Wrap};
use unicode_width::UnicodeWidthStr;

/// The selected event, how far the list is scrolled, and the event whose detail is open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventsState {
    /// The selected event: how many newer events are above it.
    pub selected: usize,
    /// The number of newer events above the first row shown.
    pub scroll: usize,
    /// The `seq` of the event whose detail is open.
    pub open: Option<u64>,
}

impl EventsState {
    /// Carry out a selecting action over `n` events with `page` rows on screen; the list
    /// scrolls to keep the selection in sight.
    pub fn apply(&mut self, a: Action, n: usize, page: usize) {
        let page = page.max(1);
        let step = page.saturating_sub(1).max(1);
        let last = n.saturating_sub(1);
        self.selected = match a {
            Action::ScrollDown => self.selected + 1,
            Action::ScrollUp => self.selected.saturating_sub(1),
            Action::PageDown => self.selected + step,
            Action::PageUp => self.selected.saturating_sub(step),
            Action::Top => 0,
            Action::Bottom => last,
            _ => self.selected,
        }
        .min(last);
        if self.selected < self.scroll {
            self.scroll = self.selected;
        } else if self.selected >= self.scroll + page {
            self.scroll = self.selected + 1 - page;
        }
        self.scroll = self.scroll.min(n.saturating_sub(page));
    }

    /// Open the selected event's detail (of `events`, oldest first as the data keeps them).
    pub fn open_selected(&mut self, events: &std::collections::VecDeque<NodeEventRecord>) {
        self.open = events.iter().rev().nth(self.selected).map(|e| e.seq);
    }
}

/// What a key does while an event's detail is open: Esc, Enter, q and the keys that go back
/// close it; the rest do nothing (the list behind it stays as it was).
pub fn detail_key(ev: &crossterm::event::KeyEvent) -> Option<Action> {
    use crossterm::event::KeyCode;
    match ev.code {
        KeyCode::Esc
        | KeyCode::Enter
        | KeyCode::Backspace
        | KeyCode::Left
        | KeyCode::Char('q' | 'h') => Some(Action::Close),
        _ => None,
    }
}

/// Rows of one line each the view has room for in `body` (a bordered table with a header).
pub fn page_rows(body: Rect) -> usize {
    body.height.saturating_sub(3) as usize
}

/// One event in the view's columns (who, what, change, why), escaped for the terminal.
pub fn columns(e: &crate::protocol::NodeEvent) -> [String; 4] {
    let Words {
        who,
        subject,
        change,
        why,
        ..
    } = words(e);
    [who, subject, change, why].map(|c| printable(&c))
}

/// `text` in lines of at most `width` cells, broken between words where it can be; a word
/// longer than a line is cut where the line ends.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let fits = line.is_empty() || line.width() + 1 + word.width() <= width;
        if !fits {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        for c in word.chars() {
            let cw = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
            if line.width() + cw > width {
                lines.push(std::mem::take(&mut line));
            }
            line.push(c);
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// [`wrap`], at most `max` lines; the last one ends in `…` when text was left out.
fn wrap_at_most(text: &str, width: usize, max: usize) -> Vec<String> {
    let mut lines = wrap(text, width);
    if lines.len() > max {
        lines.truncate(max);
        if let Some(last) = lines.last_mut() {
            while !last.is_empty() && last.width() + 1 > width {
                last.pop();
            }
            last.push('…');
        }
    }
    lines
}

/// `2026-11-30T04:07:55.652Z` as `11-30 04:07:55` (the column says UTC).
fn short_time(rfc3339: &str) -> String {
    match (rfc3339.get(5..10), rfc3339.get(11..19)) {
        (Some(d), Some(t)) => format!("{d} {t}"),
        _ => rfc3339.to_string(),
    }
}

/// How the columns share a width: the time, who and what sized to what they hold (up to a
/// share of the width), the change to what is left (and to its longest row, where a why
/// column sits beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Widths {
    time: usize,
    who: usize,
    what: usize,
    change: usize,
    /// None: no column of its own; the why goes under the change.
    why: Option<usize>,
}

impl Widths {
    fn of(inner: usize, rows: &[[String; 4]]) -> Widths {
        let narrow = inner < 118;
        let longest = |i: usize| rows.iter().map(|r| r[i].width()).max().unwrap_or(0);
        let time = if narrow { 8 } else { 14 };
        let who = longest(0).clamp(3, if narrow { 12 } else { inner * 2 / 9 });
        // A run's id is 21 cells: room for one at every width.
        let what = longest(1).clamp(4, if narrow { 22 } else { (inner / 6).max(22) });
        let gaps = if narrow { 3 } else { 4 };
        let rest = inner.saturating_sub(time + who + what + gaps).max(1);
        if narrow {
            return Widths {
                time,
                who,
                what,
                change: rest,
                why: None,
            };
        }
        // The change takes what it needs, leaving the why at least a third.
        let change = longest(2).clamp(6, (rest * 2 / 3).max(6)).min(rest);
        Widths {
            time,
            who,
            what,
            change,
            why: Some(rest.saturating_sub(change + 1).max(1)),
        }
    }
}

/// A cell's lines, each with whether it is dim.
type CellLines = Vec<(String, bool)>;

/// One event's cells, wrapped to `w`: the lines of each, and the row's height.
fn cells(cols: &[String; 4], time: String, w: Widths) -> (Vec<CellLines>, usize) {
    let [who, what, change, why] = cols;
    let plain = |v: Vec<String>| v.into_iter().map(|l| (l, false)).collect::<CellLines>();
    let dim = |v: Vec<String>| v.into_iter().map(|l| (l, true)).collect::<CellLines>();
    let mut change_lines = plain(wrap(change, w.change));
    let mut out = vec![
        dim(vec![time]),
        plain(wrap_at_most(who, w.who, 2)),
        plain(wrap_at_most(what, w.what, 2)),
    ];
    match w.why {
        Some(why_w) => {
            out.push(change_lines);
            out.push(dim(wrap_at_most(why, why_w, 3)));
        }
        None => {
            if !why.is_empty() {
                change_lines.extend(dim(wrap_at_most(why, w.change, 1)));
            }
            out.push(change_lines);
        }
    }
    let height = out.iter().map(Vec::len).max().unwrap_or(1);
    (out, height)
}

/// The Events view, borrowed for one frame.
pub struct EventsView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a EventsState,
}

impl Widget for EventsView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let events = &self.ctx.data.events;
        let title = Span::styled(format!(" Events ({}) ", events.len()), t.title);
        let block = Block::bordered()
            .border_style(t.border)
            .title(title)
            .title(Line::styled(" newest first ", t.dim).right_aligned());
        if events.is_empty() {
            let text = match &self.ctx.data.link {
                Link::Local => {
                    "The demo has no daemon, so no event log. On a real node this lists the \
                     node's events.jsonl: runs started and stopped, daemons started, refused \
                     connections — who, when, old → new, and why."
                }
                Link::Gone { .. } => "The daemon is gone; its events come back when it does.",
                _ => "No events yet.",
            };
            Paragraph::new(text)
                .style(t.dim)
                .wrap(Wrap { trim: true })
                .block(block.padding(Padding::horizontal(1)))
                .render(area, buf);
            self.draw_detail(area, buf);
            return;
        }
        let n = events.len();
        let lines = page_rows(area);
        let selected = self.state.selected.min(n - 1);
        let narrow = area.width < 120;
        // The candidates: every row shown is among the `lines` events from the first one.
        let mut start = self.state.scroll.min(selected);
        let newest_first = |from: usize| events.iter().rev().skip(from).take(lines.max(1));
        let texts = |from: usize| -> Vec<(String, [String; 4])> {
            newest_first(from)
                .map(|e: &NodeEventRecord| {
                    let mut cols = columns(&e.event);
                    let time = if narrow {
                        // The user's name without the uid and pid.
                        if let Some(name) = cols[0].split(" (uid").next() {
                            cols[0] = name.to_string();
                        }
                        e.time.get(11..19).unwrap_or(&e.time).to_string()
                    } else {
                        short_time(&e.time)
                    };
                    (time, cols)
                })
                .collect()
        };
        let inner = area.width.saturating_sub(2) as usize;
        let (rows, widths) = loop {
            let page = texts(start);
            let cols: Vec<[String; 4]> = page.iter().map(|(_, c)| c.clone()).collect();
            let widths = Widths::of(inner, &cols);
            let mut used = 0;
            let mut rows = Vec::new();
            for (i, (time, cols)) in page.into_iter().enumerate() {
                let (cells, height) = cells(&cols, time, widths);
                if used + height > lines && !rows.is_empty() {
                    break;
                }
                used += height;
                rows.push((start + i, cells, height));
            }
            // Taller rows can push the selection off the page: start further down.
            let shown = rows.last().map_or(start, |r| r.0);
            if selected <= shown || start >= selected {
                break (rows, widths);
            }
            start += 1;
        };
        let first = rows.first().map_or(0, |r| r.0);
        let last = rows.last().map_or(0, |r| r.0);
        let table_rows: Vec<Row> = rows
            .into_iter()
            .map(|(i, cells, height)| {
                let row = Row::new(cells.into_iter().map(|lines| {
                    let text: Vec<Line> = lines
                        .into_iter()
                        .map(|(s, dim)| {
                            if dim {
                                Line::styled(s, t.dim)
                            } else {
                                Line::raw(s)
                            }
                        })
                        .collect();
                    Cell::from(Text::from(text))
                }))
                .height(height as u16);
                if i == selected {
                    row.style(t.selected)
                } else {
                    row
                }
            })
            .collect();
        let mut constraints = vec![
            Constraint::Length(widths.time as u16),
            Constraint::Length(widths.who as u16),
            Constraint::Length(widths.what as u16),
        ];
        let mut header = vec![if narrow { "UTC" } else { "TIME (UTC)" }, "WHO", "WHAT"];
        match widths.why {
            Some(_) => {
                constraints.extend([
                    Constraint::Length(widths.change as u16),
                    Constraint::Fill(1),
                ]);
                header.extend(["CHANGE", "WHY"]);
            }
            None => {
                constraints.push(Constraint::Fill(1));
                header.push("CHANGE · why");
            }
        }
        let more = if last + 1 - first < n {
            format!(
                " {}–{} of {} · {} of {n} ",
                first + 1,
                last + 1,
                n,
                selected + 1
            )
        } else {
            format!(" {} of {n} ", selected + 1)
        };
        let block = block.title_bottom(Line::styled(more, t.dim).right_aligned());
        Table::new(table_rows, constraints)
            .header(Row::new(header).style(t.dim))
            .column_spacing(1)
            .block(block)
            .render(area, buf);
        self.draw_detail(area, buf);
    }
}

impl EventsView<'_> {
    /// The open event's detail over the list; an event no longer kept (a daemon that came
    /// back with another log) says so, so that the keys it takes are not taken unseen.
    fn draw_detail(&self, area: Rect, buf: &mut Buffer) {
        let Some(seq) = self.state.open else { return };
        let t = self.ctx.theme;
        match self.ctx.data.events.iter().find(|e| e.seq == seq) {
            Some(e) => detail::Detail {
                record: e,
                theme: t,
            }
            .render(area, buf),
            None => detail::gone(seq, t, area, buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NodeEvent;

    #[test]
    fn the_selection_stays_within_the_list_and_the_page_follows_it() {
        let mut s = EventsState::default();
        s.apply(Action::ScrollUp, 30, 10);
        assert_eq!((s.selected, s.scroll), (0, 0));
        s.apply(Action::PageDown, 30, 10);
        assert_eq!((s.selected, s.scroll), (9, 0));
        s.apply(Action::ScrollDown, 30, 10);
        assert_eq!(
            (s.selected, s.scroll),
            (10, 1),
            "scrolled to keep it in sight"
        );
        s.apply(Action::Bottom, 30, 10);
        assert_eq!((s.selected, s.scroll), (29, 20), "the last page is full");
        s.apply(Action::ScrollDown, 30, 10);
        assert_eq!(s.selected, 29);
        s.apply(Action::Top, 30, 10);
        assert_eq!((s.selected, s.scroll), (0, 0));
        s.apply(Action::Bottom, 5, 10);
        assert_eq!((s.selected, s.scroll), (4, 0), "all fit");
    }

    #[test]
    fn open_takes_the_selected_event_by_its_seq() {
        let rec = |seq| NodeEventRecord {
            seq,
            time: "2026-11-30T04:07:55.652Z".into(),
            event: NodeEvent::DaemonStopped {
                pid: 1,
                reason: "SIGTERM".into(),
            },
        };
        let events: std::collections::VecDeque<_> = (1..=5).map(rec).collect();
        let mut s = EventsState {
            selected: 1,
            ..Default::default()
        };
        s.open_selected(&events);
        assert_eq!(s.open, Some(4), "the second newest");
    }

    #[test]
    fn wrapping_breaks_between_words_and_cuts_only_long_words() {
        assert_eq!(
            wrap("power limit 700 W → 300 W", 12),
            ["power limit", "700 W → 300", "W"]
        );
        assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
        assert_eq!(wrap("", 5), [""]);
        assert_eq!(wrap_at_most("one two three four", 9, 1), ["one two…"]);
    }

    #[test]
    fn the_change_column_grows_with_the_terminal() {
        let rows = vec![[
            "root (uid 0) via gpupilot (pid 9)".to_string(),
            "GPU 1".into(),
            "power limit 700 W → 300 W".into(),
            "a reason long enough to need a line of its own and then some".into(),
        ]];
        let w80 = Widths::of(78, &rows);
        assert_eq!(w80.why, None, "narrow: the why goes under the change");
        assert!(w80.change >= "power limit 700 W → 300 W".len(), "{w80:?}");
        let w200 = Widths::of(198, &rows);
        assert_eq!(w200.change, "power limit 700 W → 300 W".width());
        assert!(w200.why.unwrap() > 60, "{w200:?}");
    }

    #[test]
    fn times_are_short() {
        assert_eq!(short_time("2026-11-30T04:07:55.652Z"), "11-30 04:07:55");
        assert_eq!(short_time("odd"), "odd");
    }
}
