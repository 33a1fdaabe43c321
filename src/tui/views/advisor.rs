//! The advisor pane, drawn over the body of any view: each hint's kind and whose it is, its
//! summary, the numbers behind it and what Enter does; or, with no hint, why there is none.
//! Its state ([`AdvisorState`]) and the keys it takes are here; what its actions do to the
//! console is in `app/advisor.rs`.

use super::Ctx;
use crate::advisor::text::{label, num};
use crate::advisor::{Evidence, Hint, Knob, Suggestion};
use crate::protocol::KnobName;
use crate::tui::action::Action;
use crate::tui::feed::Link;
use crate::tui::feed::daemon::Advice;
use crate::tui::format;
use crate::tui::widgets::centered;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget, Wrap};

/// A knob change waiting for the run's knobs to arrive before its dialog opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingKnob {
    pub run: String,
    pub knob: KnobName,
    pub value: i64,
}

/// The pane's state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdvisorState {
    pub open: bool,
    /// The hint selected (a position in the list).
    pub selected: usize,
    /// The newest advice from the feed; None until the first came.
    pub advice: Option<Advice>,
    pub pending: Option<PendingKnob>,
}

impl AdvisorState {
    /// The hints shown.
    pub fn hints(&self) -> &[Hint] {
        self.advice.as_ref().map_or(&[], |a| a.hints.as_slice())
    }

    /// The action a key runs while the pane is open (every key goes to it); `close` is the
    /// key the keymap binds to the advisor (it closes the pane too).
    pub fn action_for_key(&self, ev: &KeyEvent, close: bool) -> Option<Action> {
        let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
        if close {
            return Some(Action::Advisor);
        }
        match ev.code {
            KeyCode::Char('c') if ctrl => Some(Action::Quit),
            KeyCode::Esc | KeyCode::Char('q') => Some(Action::Advisor),
            KeyCode::Char('j') | KeyCode::Down => Some(Action::ScrollDown),
            KeyCode::Char('k') | KeyCode::Up => Some(Action::ScrollUp),
            KeyCode::Enter => Some(Action::HintAct(self.selected)),
            KeyCode::Char(c @ '1'..='9') => Some(Action::HintAct(c as usize - '1' as usize)),
            _ => None,
        }
    }

    /// Whether the open pane takes `a`.
    pub fn handles(a: Action) -> bool {
        matches!(
            a,
            Action::ScrollUp | Action::ScrollDown | Action::HintAct(_)
        )
    }
}

/// What the footer says while the pane is open.
pub fn footer(st: &AdvisorState) -> String {
    match st.hints().len() {
        0 => " Advisor · Esc: close".into(),
        1 => " Advisor · Enter or 1: act on the hint · Esc: close".into(),
        n => format!(
            " Advisor · j/k: select · Enter or 1–{}: act on the hint · Esc: close",
            n.min(9)
        ),
    }
}

/// The pane's width, at most.
const WIDTH: u16 = 120;

/// The pane, borrowed for one frame.
pub struct AdvisorView<'a> {
    pub ctx: Ctx<'a>,
    pub state: &'a AdvisorState,
}

/// An evidence number as `name value unit`.
fn evidence_text(e: &Evidence) -> String {
    let unit = if e.unit.is_empty() || e.unit == "%" {
        e.unit.clone()
    } else {
        format!(" {}", e.unit)
    };
    format!("{} {}{unit}", e.name, num(e.value))
}

/// What Enter does with a hint's suggestion, in a few words.
pub fn action_text(s: &Suggestion) -> String {
    match s {
        Suggestion::SetKnob {
            knob: Knob::PowerCap,
            ..
        } => format!("not from the console: {}", s.command()),
        Suggestion::SetKnob { knob, value, .. } => format!(
            "Enter: {} → {value:.0} in the run's knob dialog (Enter there sends it)",
            knob.name()
        ),
        Suggestion::PowerCap { gpus, watts } if gpus.len() == 1 => {
            let gpu = gpus[0];
            format!("Enter: GPU {gpu} cap → {watts:.0} W (power-cap dialog; it asks y/n)")
        }
        Suggestion::StopRun { run } => format!("Enter: stop run {run} (asks y/n)"),
        Suggestion::PowerCap { .. }
        | Suggestion::ThermalTarget { .. }
        | Suggestion::TuneEnergy { .. } => format!("run: {}", s.command()),
    }
}

/// `items` joined with ` · ` into lines of at most `width` characters after `indent`.
fn pack(items: &[String], indent: usize, width: usize) -> Vec<String> {
    wrap(items, " · ", indent, width)
}

/// `items` joined with `sep` into lines of at most `width` characters after `indent` (an item
/// longer than a line gets one of its own).
fn wrap(items: &[String], sep: &str, indent: usize, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for it in items {
        let add = if cur.is_empty() {
            it.clone()
        } else {
            format!("{cur}{sep}{it}")
        };
        if !cur.is_empty() && indent + add.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
            cur = it.clone();
        } else {
            cur = add;
        }
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

/// The lines of hint `i` in a pane `width` wide.
fn hint_lines(ctx: Ctx, i: usize, h: &Hint, width: usize, selected: bool) -> Vec<Line<'static>> {
    let t = ctx.theme;
    let whose = match (&h.run, h.gpu) {
        (Some(r), _) => format!("run {r}"),
        (None, Some(g)) => format!("GPU {g}"),
        (None, None) => "node".into(),
    };
    let head_style = if selected { t.selected } else { t.title };
    let marker = if selected { "▶" } else { " " };
    let head = format!("{marker}{} {} · {whose}", i + 1, label(h.kind));
    let mut lines = vec![Line::styled(head, head_style)];
    let words: Vec<String> = h.summary.split(' ').map(String::from).collect();
    for l in wrap(&words, " ", 3, width) {
        lines.push(Line::raw(format!(
            "   {}",
            format::fit(&l, width.saturating_sub(3))
        )));
    }
    let numbers: Vec<String> = h.evidence.iter().map(evidence_text).collect();
    for (k, l) in pack(&numbers, 12, width).into_iter().enumerate() {
        let lead = if k == 0 {
            "   evidence "
        } else {
            "            "
        };
        lines.push(Line::from(vec![
            Span::styled(lead, t.dim),
            Span::raw(format::fit(&l, width.saturating_sub(12))),
        ]));
    }
    if let Some(a) = &h.action {
        let words: Vec<String> = action_text(a).split(' ').map(String::from).collect();
        for (k, l) in wrap(&words, " ", 12, width).into_iter().enumerate() {
            let lead = if k == 0 {
                "   action   "
            } else {
                "            "
            };
            lines.push(Line::from(vec![
                Span::styled(lead, t.dim),
                Span::styled(format::fit(&l, width.saturating_sub(12)), t.key),
            ]));
        }
    }
    lines
}

impl Widget for AdvisorView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let ctx = self.ctx;
        let t = ctx.theme;
        let st = self.state;
        let popup = centered(area, WIDTH, area.height);
        Clear.render(popup, buf);
        let window = st.advice.as_ref().map_or(String::new(), |a| {
            format!(" last {} ", format::span(a.window_s))
        });
        let block = Block::bordered()
            .border_style(t.border_selected)
            .title(Span::styled(" Advisor ", t.title))
            .title(Line::styled(window, t.dim).right_aligned())
            .padding(Padding::horizontal(1))
            .style(t.text);
        let inner = block.inner(popup);
        let width = inner.width as usize;
        let message = |text: String| Paragraph::new(text).style(t.dim).wrap(Wrap { trim: true });
        let hints = st.hints();
        if hints.is_empty() {
            let text = match (&ctx.data.link, &st.advice) {
                (Link::Local, _) => "The advisor needs the daemon's history and runs, and this \
                                     console samples in-process: start `gpupilot` (it starts \
                                     the daemon)."
                    .to_string(),
                (_, None) => "Gathering the last minutes of telemetry and metrics from the \
                              daemon…"
                    .to_string(),
                (_, Some(a)) => format!("Nothing to suggest: {}.", a.why_none),
            };
            message(text).block(block).render(popup, buf);
            return;
        }
        let mut lines: Vec<Line> = Vec::new();
        let mut spans = Vec::new();
        for (i, h) in hints.iter().enumerate() {
            if i > 0 {
                lines.push(Line::raw(""));
            }
            let first = lines.len();
            lines.extend(hint_lines(ctx, i, h, width, i == st.selected));
            spans.push((first, lines.len()));
        }
        // The selected hint in view: scrolled so that it ends on screen, or starts at the top.
        let rows = inner.height as usize;
        let (start, end) = spans[st.selected.min(spans.len() - 1)];
        let scroll = if end > rows {
            (end - rows).min(start)
        } else {
            0
        };
        Paragraph::new(lines)
            .block(block)
            .scroll((scroll as u16, 0))
            .render(popup, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evidence_packs_into_lines_that_fit() {
        let items: Vec<String> = ["aaaa", "bbbb", "cccc"].map(String::from).to_vec();
        assert_eq!(pack(&items, 0, 100), ["aaaa · bbbb · cccc"]);
        assert_eq!(pack(&items, 2, 13), ["aaaa · bbbb", "cccc"]);
        assert_eq!(
            pack(&items, 0, 3),
            ["aaaa", "bbbb", "cccc"],
            "one per line at worst"
        );
        assert!(pack(&[], 0, 10).is_empty());
    }

    #[test]
    fn actions_say_what_enter_does() {
        let knob = Suggestion::SetKnob {
            run: "r".into(),
            knob: Knob::Prefetch,
            value: 4.0,
        };
        assert!(action_text(&knob).starts_with("Enter: prefetch → 4 in the run's knob dialog"));
        let cap = Suggestion::PowerCap {
            gpus: vec![1],
            watts: 700.0,
        };
        assert!(action_text(&cap).contains("GPU 1 cap → 700 W"));
        let job = Suggestion::PowerCap {
            gpus: vec![0, 1, 2, 3],
            watts: 450.0,
        };
        assert_eq!(
            action_text(&job),
            "run: gpupilot power cap 450 --gpu 0,1,2,3"
        );
        let thermal = Suggestion::ThermalTarget {
            gpus: vec![0],
            celsius: 83.0,
        };
        assert_eq!(
            action_text(&thermal),
            "run: gpupilot thermal target 83 --gpu 0"
        );
    }

    #[test]
    fn keys_in_the_pane() {
        let st = AdvisorState {
            open: true,
            selected: 2,
            ..AdvisorState::default()
        };
        let key = |c| KeyEvent::new(c, KeyModifiers::NONE);
        assert_eq!(
            st.action_for_key(&key(KeyCode::Enter), false),
            Some(Action::HintAct(2))
        );
        assert_eq!(
            st.action_for_key(&key(KeyCode::Char('3')), false),
            Some(Action::HintAct(2))
        );
        assert_eq!(
            st.action_for_key(&key(KeyCode::Esc), false),
            Some(Action::Advisor)
        );
        assert_eq!(
            st.action_for_key(&key(KeyCode::Char('x')), true),
            Some(Action::Advisor),
            "the advisor's own key closes it"
        );
        assert_eq!(
            st.action_for_key(&key(KeyCode::Char('j')), false),
            Some(Action::ScrollDown)
        );
        assert_eq!(st.action_for_key(&key(KeyCode::Char('x')), false), None);
        assert_eq!(footer(&st), " Advisor · Esc: close");
    }
}
