//! One event's detail, drawn over the Events view: who made the change (and what kind of actor
//! that is), what changed, why, the numbers recorded with it, and the command that undoes it.
//! Esc closes it.

use crate::protocol::NodeEventRecord;
use crate::protocol::event_words::{actor, numbers, undo, words};
use crate::text::printable;
use crate::tui::theme::Theme;
use crate::tui::widgets::centered;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget, Wrap};

/// The detail of `record`, borrowed for one frame.
pub struct Detail<'a> {
    pub record: &'a NodeEventRecord,
    pub theme: &'a Theme,
}

impl Detail<'_> {
    /// The panel's lines, before wrapping.
    fn lines(&self) -> Vec<Line<'static>> {
        let t = self.theme;
        let e = &self.record.event;
        let w = words(e);
        let label = |s: &str| Span::styled(format!("{s:<8}"), t.dim);
        let who = printable(&w.who);
        let kind = actor(&w.who);
        let mut who_line = vec![label("Who"), Span::raw(who.clone())];
        if kind != who && kind != "other" {
            who_line.push(Span::styled(format!("  ({kind})"), t.dim));
        }
        if let Some(by) = &w.through {
            who_line.push(Span::styled(format!("  through {}", printable(by)), t.dim));
        }
        let what = if w.change.is_empty() {
            printable(&w.subject)
        } else {
            printable(&format!("{} {}", w.subject, w.change))
        };
        let mut lines = vec![
            Line::from(who_line),
            Line::from(vec![label("What"), Span::raw(what)]),
            Line::from(vec![
                label("Why"),
                if w.why.is_empty() {
                    Span::styled("not recorded", t.dim)
                } else {
                    Span::raw(printable(&w.why))
                },
            ]),
        ];
        let nums = numbers(e);
        if !nums.is_empty() {
            lines.push(Line::from(label("Numbers")));
            for (k, v) in nums {
                lines.push(Line::from(vec![
                    Span::raw("  "),
                    Span::styled(format!("{:<18}", printable(&k)), t.dim),
                    Span::raw(v),
                ]));
            }
        }
        lines.push(Line::from(vec![
            label("Undo"),
            match undo(e) {
                Some(cmd) => Span::styled(printable(&cmd), t.key),
                None => Span::styled("nothing to undo", t.dim),
            },
        ]));
        lines
    }
}

/// In place of the detail of event `seq`, gone from the list the daemon keeps.
pub fn gone(seq: u64, t: &Theme, area: Rect, buf: &mut Buffer) {
    let panel = centered(area, area.width.saturating_sub(4).min(60), 5);
    Clear.render(panel, buf);
    Paragraph::new(format!("Event {seq} is no longer in the daemon's list."))
        .style(t.dim)
        .wrap(Wrap { trim: true })
        .block(
            Block::bordered()
                .border_style(t.border_selected)
                .title_bottom(Line::styled(" Esc closes ", t.dim).right_aligned())
                .padding(Padding::horizontal(1)),
        )
        .render(panel, buf);
}

impl Widget for Detail<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        let lines = self.lines();
        let width = area.width.saturating_sub(4).min(100);
        // Lines that wrap take more rows; the panel grows up to the view's height.
        let inner = width.saturating_sub(4).max(1) as usize;
        let rows: usize = lines.iter().map(|l| l.width().div_ceil(inner).max(1)).sum();
        let panel = centered(area, width, (rows + 2) as u16);
        let title = format!(
            " Event {} · {} UTC ",
            self.record.seq,
            self.record
                .time
                .get(..19)
                .unwrap_or(&self.record.time)
                .replace('T', " ")
        );
        let block = Block::bordered()
            .border_style(t.border_selected)
            .title(Span::styled(title, t.title))
            .title_bottom(Line::styled(" Esc closes ", t.dim).right_aligned())
            .padding(Padding::horizontal(1));
        Clear.render(panel, buf);
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block)
            .render(panel, buf);
    }
}
