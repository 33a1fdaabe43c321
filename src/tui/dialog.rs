//! Small modal dialogs drawn over the body: a box of lines centred on the screen, and the
//! numeric dialog's number step, a field for a whole number checked against an inclusive range
//! before anything is sent, which the power-cap and the knob dialogs share. Views keep the
//! dialog's state and decide what Enter does; this module only edits and draws.

use crate::tui::action::Action;
use crate::tui::theme::Theme;
use crate::tui::widgets::centered;
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Padding, Paragraph, Widget, Wrap};

/// A key in a number field: Enter submits, Esc and Ctrl-C cancel, Backspace deletes, any other
/// plain character is typed (the field says which it refuses).
pub fn field_key(ev: &KeyEvent) -> Option<Action> {
    let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
    match ev.code {
        KeyCode::Enter => Some(Action::PromptSubmit),
        KeyCode::Esc => Some(Action::PromptCancel),
        KeyCode::Char('c') if ctrl => Some(Action::PromptCancel),
        KeyCode::Backspace => Some(Action::PromptBackspace),
        KeyCode::Char(c) if !ctrl && !ev.modifiers.contains(KeyModifiers::ALT) => {
            Some(Action::PromptChar(c))
        }
        _ => None,
    }
}

/// A key answering a y/n question: `y` is yes, any other key no.
pub fn yes_no_key(ev: &KeyEvent) -> Action {
    let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
    Action::Confirm(matches!(ev.code, KeyCode::Char('y' | 'Y') if !ctrl))
}

/// Whether an open dialog takes action `a` (every other action waits until it closes).
pub fn takes(a: Action) -> bool {
    matches!(
        a,
        Action::PromptChar(_)
            | Action::PromptBackspace
            | Action::PromptSubmit
            | Action::PromptCancel
            | Action::Confirm(_)
    )
}

/// Digits a number field takes (enough for any knob or wattage, short of overflowing `i64`).
const MAX_DIGITS: usize = 12;

/// The number step of a numeric dialog (the power cap's and the knobs'): a whole number being
/// typed, the inclusive range Enter checks it against, and why Enter did not go on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NumberField {
    pub text: String,
    pub min: i64,
    /// No upper bound when `None`.
    pub max: Option<i64>,
    /// Said after a refusal for the range (` W`), or nothing.
    pub unit: &'static str,
    /// Why Enter did not go on (out of range, not a number, no daemon).
    pub message: Option<String>,
}

/// What an action did to a [`NumberField`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edited {
    /// A digit typed or deleted, or refused with the message why: the dialog stays.
    Editing,
    /// Esc or Ctrl-C.
    Cancelled,
    /// Enter, on a number within the range.
    Entered(i64),
}

impl NumberField {
    /// An empty field for a number within `min..=max`; `unit` follows a refusal's range.
    pub fn new(min: i64, max: Option<i64>, unit: &'static str) -> NumberField {
        NumberField {
            min,
            max,
            unit,
            ..NumberField::default()
        }
    }

    /// Carry out a key's action on the field (what [`field_key`] maps keys to).
    pub fn edit(&mut self, a: Action) -> Edited {
        match a {
            Action::PromptChar(c) => self.message = self.push(c).err(),
            Action::PromptBackspace => {
                self.backspace();
                self.message = None;
            }
            Action::PromptCancel => return Edited::Cancelled,
            Action::PromptSubmit => match self.value_within(self.min, self.max) {
                Err(why) => self.message = Some(format!("{why}{}", self.unit)),
                Ok(v) => return Edited::Entered(v),
            },
            _ => {}
        }
        Edited::Editing
    }

    /// The range in words: `1–1024`, or `1 or more`.
    pub fn allowed(&self) -> String {
        allowed(self.min, self.max)
    }

    /// The field's line (`label`, then the number typed and a cursor) and, when Enter was
    /// refused, the line that says why.
    pub fn lines(&self, label: String, t: &Theme) -> Vec<Line<'static>> {
        let mut lines = vec![Line::from(vec![
            Span::styled(label, t.title),
            Span::styled(format!("{}█", self.text), t.text),
        ])];
        if let Some(m) = &self.message {
            lines.push(Line::styled(m.clone(), t.crit));
        }
        lines
    }

    /// Type `c`: digits only, up to [`MAX_DIGITS`]; anything else is refused with why.
    pub fn push(&mut self, c: char) -> Result<(), String> {
        if !c.is_ascii_digit() {
            return Err(format!("“{c}”: type digits only"));
        }
        if self.text.len() >= MAX_DIGITS {
            return Err(format!("at most {MAX_DIGITS} digits"));
        }
        self.text.push(c);
        Ok(())
    }

    pub fn backspace(&mut self) {
        self.text.pop();
    }

    /// The number typed, if it lies within `min..=max` (no `max`: no upper bound); else what
    /// is wrong, in words for the dialog.
    pub fn value_within(&self, min: i64, max: Option<i64>) -> Result<i64, String> {
        let allowed = allowed(min, max);
        if self.text.is_empty() {
            return Err(format!("type a number ({allowed})"));
        }
        let v: i64 = self
            .text
            .parse()
            .map_err(|_| format!("{} is not a number ({allowed})", self.text))?;
        if v < min || max.is_some_and(|m| v > m) {
            return Err(format!("{v} is outside the allowed range {allowed}"));
        }
        Ok(v)
    }
}

/// `min–max`, or `min or more` without a maximum.
fn allowed(min: i64, max: Option<i64>) -> String {
    match max {
        Some(max) => format!("{min}–{max}"),
        None => format!("{min} or more"),
    }
}

/// A dialog box: a title, its lines, and a line of keys at the bottom, centred in the area it
/// is drawn in and sized to its lines (at most `width` wide).
pub struct DialogBox<'a> {
    pub title: String,
    pub lines: Vec<Line<'a>>,
    /// The keys it takes, e.g. `Enter: set · Esc: cancel`.
    pub keys: String,
    pub width: u16,
    pub theme: &'a Theme,
}

impl Widget for DialogBox<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.theme;
        let w = self.width.min(area.width);
        // Lines wrap inside the border and padding.
        let inner_w = w.saturating_sub(4).max(1) as usize;
        let rows: usize = self
            .lines
            .iter()
            .map(|l| wrapped_rows(&l.to_string(), inner_w))
            .sum();
        let h = (rows as u16).saturating_add(2);
        let popup = centered(area, w, h);
        Clear.render(popup, buf);
        let block = Block::bordered()
            .border_style(t.border_selected)
            .title(Span::styled(format!(" {} ", self.title), t.title))
            .title_bottom(Line::styled(format!(" {} ", self.keys), t.dim).right_aligned())
            .padding(Padding::horizontal(1));
        Paragraph::new(self.lines)
            .style(t.text)
            .block(block)
            .wrap(Wrap { trim: false })
            .render(popup, buf);
    }
}

/// Rows `text` takes when wrapped at word boundaries to `width` columns (as the paragraph
/// wraps it; a word longer than a row is cut across rows).
fn wrapped_rows(text: &str, width: usize) -> usize {
    let width = width.max(1);
    let mut rows = 1;
    let mut used = 0;
    for word in text.split(' ') {
        let w = word.chars().count();
        let need = if used == 0 { w } else { used + 1 + w };
        if need <= width {
            used = need;
        } else if w <= width {
            rows += 1;
            used = w;
        } else {
            // A long word starts on a new row (unless this one is empty) and spills over.
            rows += usize::from(used > 0) + (w - 1) / width;
            used = (w - 1) % width + 1;
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_counted_as_words_wrap() {
        assert_eq!(wrapped_rows("", 10), 1);
        assert_eq!(wrapped_rows("abc def", 7), 1);
        assert_eq!(wrapped_rows("abc defg", 7), 2, "the word moves down whole");
        assert_eq!(wrapped_rows("abcdefghijklmnop", 5), 4);
        assert_eq!(wrapped_rows("ab abcdefghij", 5), 3);
    }

    #[test]
    fn number_fields_take_digits_and_check_the_range() {
        let mut f = NumberField::default();
        assert_eq!(
            f.value_within(1, Some(1024)),
            Err("type a number (1–1024)".into())
        );
        for c in "512".chars() {
            f.push(c).unwrap();
        }
        assert!(f.push('x').unwrap_err().contains("digits only"));
        assert!(f.push('-').is_err(), "no negative knobs");
        assert_eq!(f.text, "512");
        assert_eq!(f.value_within(1, Some(1024)), Ok(512));
        assert_eq!(f.value_within(512, Some(512)), Ok(512), "inclusive");
        assert_eq!(
            f.value_within(1, Some(256)),
            Err("512 is outside the allowed range 1–256".into())
        );
        assert_eq!(
            f.value_within(1000, None),
            Err("512 is outside the allowed range 1000 or more".into())
        );
        assert_eq!(f.value_within(1, None), Ok(512));
        f.backspace();
        assert_eq!(f.value_within(1, Some(1024)), Ok(51));
        for _ in 0..20 {
            let _ = f.push('9');
        }
        assert_eq!(f.text.len(), MAX_DIGITS);
        assert!(f.value_within(0, None).is_ok(), "12 digits fit in an i64");
    }
}
