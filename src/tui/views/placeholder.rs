//! The Run and Events views hold their place in the layout until the supervisor lands; each
//! says what it will show.

use crate::config::theme::Theme;
use crate::tui::action::ViewId;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Padding, Paragraph, Widget, Wrap};

/// A view that is not built yet.
pub struct Placeholder<'a> {
    pub view: ViewId,
    pub theme: &'a Theme,
}

impl Widget for Placeholder<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        let (what, body) = match self.view {
            ViewId::Run => (
                "Run",
                "The supervised training run will be shown here once the supervisor lands: its command and state, \
                 throughput and loss as they come in, data stalls, the batch-size and prefetch knobs you can change \
                 live, and energy per sample against the GPUs' power caps.",
            ),
            _ => (
                "Events",
                "Events will be listed here once the supervisor lands: run starts and exits, knob changes, power-cap \
                 and clock changes with who made them and why, thermal-governor decisions and alerts, as written to \
                 events.jsonl.",
            ),
        };
        let block = Block::bordered()
            .border_style(t.border)
            .title(Span::styled(format!(" {what} "), t.title))
            .padding(Padding::horizontal(1));
        let text = vec![
            Line::styled("Not available yet", t.warn),
            Line::raw(""),
            Line::styled(body, t.text),
            Line::raw(""),
            Line::styled(
                "Until then: `gpupilot demo` and the Overview and GPU detail views show the GPUs.",
                t.dim,
            ),
        ];
        Paragraph::new(text)
            .block(block)
            .wrap(Wrap { trim: true })
            .render(area, buf);
    }
}
