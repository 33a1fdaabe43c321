//! The help screen: every binding of the keymap with its description, by context. Generated
//! from the keymap, so it always says what the keys really do.

use super::Ctx;
use crate::tui::keymap::Context;
use crate::tui::widgets::centered;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget};

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
}

/// The help text, one line per binding.
pub fn lines(ctx: Ctx) -> Vec<Line<'static>> {
    let t = ctx.theme;
    let mut out = Vec::new();
    let keys_of = |b: &crate::tui::keymap::Binding| {
        b.keys
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let width = Context::ALL
        .iter()
        .flat_map(|c| ctx.keymap.bindings(*c))
        .map(|b| keys_of(b).chars().count())
        .max()
        .unwrap_or(0);
    for context in Context::ALL {
        let bindings = ctx.keymap.bindings(context);
        if bindings.is_empty() {
            continue;
        }
        if !out.is_empty() {
            out.push(Line::raw(""));
        }
        out.push(Line::styled(context.title(), t.help_section));
        for b in bindings {
            out.push(Line::from(vec![
                Span::styled(format!("  {:<width$}  ", keys_of(b)), t.key),
                Span::styled(b.desc.clone(), t.text),
            ]));
        }
    }
    out.push(Line::raw(""));
    out.push(Line::styled(
        "In the search: Enter finds, Esc cancels. At y/n: y confirms, other keys say no.",
        t.dim,
    ));
    out.push(Line::styled(
        format!(
            "Mouse: click a GPU to select it, a tab to switch; the wheel scrolls. Theme: {}.",
            t.name
        ),
        t.dim,
    ));
    out
}

impl Widget for HelpView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let text = lines(self.ctx);
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
