//! The help screen: the bindings of the keymap that work in the view shown, with their
//! descriptions, by context: the view's own, then the ones that work everywhere (a replay's
//! keys only while a recording plays, and nothing that changes the node then). Generated from
//! the keymap, so it always says what the keys really do. Descriptions wrap at word
//! boundaries under their keys; what does not fit scrolls.

use super::Ctx;
use crate::tui::action::{Action, ViewId};
use crate::tui::keymap::{Binding, Context};
use crate::tui::widgets::centered;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget};
use unicode_width::UnicodeWidthStr;

/// Whether the help is open and how far it is scrolled.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelpState {
    pub open: bool,
    pub scroll: u16,
}

/// The help, drawn over the body.
pub struct HelpView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a HelpState,
    /// The view it is about.
    pub view: ViewId,
    /// A recording plays: its keys work, and nothing that changes the node does.
    pub replaying: bool,
}

/// Whether `action` works in a console that is (or is not) `replaying`.
pub fn works(action: Action, replaying: bool) -> bool {
    match action {
        Action::ReplayPause | Action::ReplaySeek(_) => replaying,
        a => !(replaying && a.changes_the_node()),
    }
}

/// The contexts whose bindings work in `view`, the view's own first.
pub fn contexts(view: ViewId) -> Vec<Context> {
    Context::of_view(view)
        .into_iter()
        .chain([Context::Global, Context::Help])
        .collect()
}

/// `text` cut into lines of at most `width` columns at spaces (a word longer than a line is
/// split where it must).
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let mut word = word.to_string();
        loop {
            let need = if line.is_empty() { 0 } else { 1 } + word.width();
            if line.width() + need <= width {
                if !line.is_empty() {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if !line.is_empty() {
                out.push(std::mem::take(&mut line));
                continue;
            }
            // A word wider than a line: as much as fits, the rest on the next.
            let mut head = String::new();
            let mut rest = word.chars();
            for c in rest.by_ref() {
                if head.width() + c.to_string().width() > width {
                    let tail: String = std::iter::once(c).chain(rest).collect();
                    out.push(std::mem::take(&mut head));
                    word = tail;
                    break;
                }
                head.push(c);
            }
            if !head.is_empty() {
                line = head;
                break;
            }
        }
    }
    if !line.is_empty() || out.is_empty() {
        out.push(line);
    }
    out
}

/// The help text for `view`, wrapped to `width` columns.
pub fn lines(ctx: Ctx, view: ViewId, replaying: bool, width: u16) -> Vec<Line<'static>> {
    let t = ctx.theme;
    let width = width as usize;
    let mut out = Vec::new();
    let keys_of = |b: &Binding| {
        b.keys
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let sections: Vec<(Context, Vec<&Binding>)> = contexts(view)
        .into_iter()
        .map(|c| {
            let shown = ctx
                .keymap
                .bindings(c)
                .iter()
                .filter(|b| works(b.action, replaying))
                .collect();
            (c, shown)
        })
        .collect();
    let key_w = sections
        .iter()
        .flat_map(|(_, bs)| bs.iter())
        .map(|b| keys_of(b).width())
        .max()
        .unwrap_or(0);
    // Keys in a column when that leaves the descriptions room; else above them.
    let column = key_w + 4 <= width / 2;
    let desc_w = if column {
        width - key_w - 4
    } else {
        width.saturating_sub(4)
    };
    for (context, bindings) in sections {
        if bindings.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(Line::raw(""));
        }
        let title = match context {
            Context::Global => "Everywhere".to_string(),
            Context::Help => context.title().to_string(),
            _ => format!("{} (this view)", context.title()),
        };
        out.push(Line::styled(title, t.help_section));
        for b in bindings {
            let desc = wrap(&b.desc, desc_w);
            if column {
                for (i, d) in desc.into_iter().enumerate() {
                    let keys = if i == 0 { keys_of(b) } else { String::new() };
                    out.push(Line::from(vec![
                        Span::styled(format!("  {keys:<key_w$}  "), t.key),
                        Span::styled(d, t.text),
                    ]));
                }
            } else {
                for k in wrap(&keys_of(b), width.saturating_sub(2)) {
                    out.push(Line::styled(format!("  {k}"), t.key));
                }
                for d in desc {
                    out.push(Line::styled(format!("    {d}"), t.text));
                }
            }
        }
    }
    out.push(Line::raw(""));
    let notes = [
        "In the search: Enter finds, Esc cancels. At y/n: y confirms, other keys say no."
            .to_string(),
        format!(
            "Mouse: click a GPU to select it, a tab to switch; the wheel scrolls. Theme: {}.",
            t.name
        ),
    ];
    for note in notes {
        for l in wrap(&note, width) {
            out.push(Line::styled(l, t.dim));
        }
    }
    out
}

impl Widget for HelpView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        // The popup's width, less its border and padding.
        let inner_w = 86.min(area.width).saturating_sub(4);
        let text = lines(self.ctx, self.view, self.replaying, inner_w);
        let h = (text.len() as u16 + 2).min(area.height);
        let popup = centered(area, 86, h);
        Clear.render(popup, buf);
        let block = Block::bordered()
            .border_style(t.border_selected)
            .title(Span::styled(" Keys ", t.title))
            .title(Line::styled(" ? or Esc closes ", t.dim).right_aligned())
            .padding(Padding::horizontal(1))
            .style(t.text);
        let inner = block.inner(popup);
        let max_scroll = (text.len() as u16).saturating_sub(inner.height);
        let block = if max_scroll > 0 {
            let at = self.state.scroll.min(max_scroll);
            let more = if at < max_scroll {
                " ↓ more: j/k scroll "
            } else {
                " j/k scroll "
            };
            block.title_bottom(Line::styled(more, t.dim).right_aligned())
        } else {
            block
        };
        Paragraph::new(text)
            .block(block)
            .scroll((self.state.scroll.min(max_scroll), 0))
            .render(popup, buf);
    }
}
