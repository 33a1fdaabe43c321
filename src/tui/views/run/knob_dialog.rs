//! The Run view's knob dialog: `b` (batch size) or `d` (prefetch) opens it on the run shown
//! with the knob's value and allowed range; Enter checks the number against the range here
//! (out of range: the dialog says so and nothing is sent) and asks the daemon; Esc cancels.
//! When the daemon answers that the change needs a restart of the run, the dialog comes back
//! as a y/n question and `y` asks again allowing it. While it is open every key goes to it.

use super::state::RunState;
use crate::protocol::KnobName;
use crate::tui::action::Action;
use crate::tui::data::{Data, Level};
use crate::tui::dialog::{self, DialogBox, Edited, NumberField};
use crate::tui::feed::{Request, Update};
use crate::tui::views::Ctx;
use crossterm::event::KeyEvent;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

/// The dialog's width, at most.
const WIDTH: u16 = 64;

/// See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub enum KnobDialog {
    /// A new value being typed.
    Edit {
        run: String,
        knob: KnobName,
        /// The value the run uses now, and a change on its way.
        current: Option<i64>,
        pending: Option<i64>,
        /// The new value, within the knob's range.
        field: NumberField,
    },
    /// The daemon needs a restart of the run for this change: ask first.
    ConfirmRestart {
        run: String,
        knob: KnobName,
        value: i64,
        /// The daemon's words.
        text: String,
    },
}

impl KnobDialog {
    /// The action a key runs while the dialog is open (every key goes to it).
    pub fn action_for_key(&self, ev: &KeyEvent) -> Option<Action> {
        match self {
            KnobDialog::ConfirmRestart { .. } => Some(dialog::yes_no_key(ev)),
            KnobDialog::Edit { .. } => dialog::field_key(ev),
        }
    }

    /// Whether the dialog takes `a` (while open).
    pub fn handles(a: Action) -> bool {
        dialog::takes(a)
    }

    /// What the footer says while the dialog is open.
    pub fn keys(&self) -> &'static str {
        match self {
            KnobDialog::Edit { .. } => "Enter: set · Esc: cancel · Backspace: delete",
            KnobDialog::ConfirmRestart { .. } => "y: restart the run with it · any other key: no",
        }
    }
}

/// Open the dialog for `knob` of the run shown, or say in the footer why it cannot be changed.
pub fn open(st: &mut RunState, data: &mut Data, knob: KnobName) {
    let Some(r) = st.current(data) else {
        data.set_status(
            Level::Info,
            "no run to change: `gpupilot run PROFILE.toml` starts one",
        );
        return;
    };
    let id = r.id.clone();
    if r.is_final() {
        let msg = format!(
            "run {id} has ended ({}): its knobs no longer change",
            r.status.as_str()
        );
        data.set_status(Level::Info, msg);
        return;
    }
    let Some(m) = data.metrics.of(&id) else {
        data.set_status(
            Level::Info,
            format!("waiting for run {id}'s knobs from the daemon…"),
        );
        return;
    };
    let Some(k) = m.knob(knob) else {
        let msg = format!(
            "run {id} has no {knob} knob: give its profile a [knobs.{knob}] section (initial, \
             min, max), or let its trainer declare a range"
        );
        data.set_status(Level::Error, msg);
        return;
    };
    let Some(range) = k.range else {
        let msg = format!(
            "run {id}'s {knob} has no allowed range: give its profile [knobs.{knob}] min and max"
        );
        data.set_status(Level::Error, msg);
        return;
    };
    st.dialog = Some(KnobDialog::Edit {
        run: id,
        knob,
        current: k.value,
        pending: k.pending,
        field: NumberField::new(range.min, range.max, ""),
    });
}

/// Carry out `a` in the open dialog; returns the request for the feed, if any.
pub fn apply(st: &mut RunState, data: &mut Data, a: Action) -> Option<Request> {
    match st.dialog.as_mut()? {
        KnobDialog::Edit {
            run,
            knob,
            current,
            pending,
            field,
        } => match field.edit(a) {
            Edited::Editing => {}
            Edited::Cancelled => st.dialog = None,
            Edited::Entered(v) if Some(v) == *current && pending.is_none() => {
                field.message = Some(format!("{knob} is {v} already: nothing to change"));
            }
            Edited::Entered(value) => {
                let (run, knob) = (run.clone(), *knob);
                st.dialog = None;
                data.set_status(
                    Level::Info,
                    format!("asking the daemon: {knob} = {value} for run {run}…"),
                );
                return Some(Request::SetKnob {
                    run,
                    knob,
                    value,
                    restart: false,
                });
            }
        },
        KnobDialog::ConfirmRestart {
            run, knob, value, ..
        } => {
            let (run, knob, value) = (run.clone(), *knob, *value);
            st.dialog = None;
            if a == Action::Confirm(true) {
                data.set_status(
                    Level::Info,
                    format!("asking the daemon to restart run {run} with {knob} = {value}…"),
                );
                return Some(Request::SetKnob {
                    run,
                    knob,
                    value,
                    restart: true,
                });
            }
            data.set_status(
                Level::Info,
                format!("nothing changed: run {run} keeps its {knob}"),
            );
        }
    }
    None
}

/// Take in an update: a change that needs a restart opens the question.
pub fn on_update(st: &mut RunState, u: &Update) {
    if let Update::KnobNeedsRestart {
        run,
        knob,
        value,
        text,
    } = u
    {
        st.dialog = Some(KnobDialog::ConfirmRestart {
            run: run.clone(),
            knob: *knob,
            value: *value,
            text: text.clone(),
        });
    }
}

/// The dialog, drawn over the body.
pub struct KnobDialogView<'a> {
    pub ctx: Ctx<'a>,
    pub dialog: &'a KnobDialog,
}

impl Widget for KnobDialogView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let d = self.dialog;
        let (title, lines) = match d {
            KnobDialog::Edit {
                run,
                knob,
                current,
                pending,
                field,
            } => {
                let mut now = vec![
                    Span::styled("now ", t.dim),
                    Span::raw(current.map_or_else(|| "N/A".to_string(), |v| v.to_string())),
                ];
                if let Some(p) = pending.filter(|p| Some(*p) != *current) {
                    now.push(Span::styled(format!(" → {p} (on its way)"), t.warn));
                }
                now.push(Span::styled("   allowed ", t.dim));
                now.push(Span::raw(field.allowed()));
                let mut lines = vec![
                    Line::from(vec![Span::styled("run ", t.dim), Span::raw(run.clone())]),
                    Line::from(now),
                    Line::raw(""),
                ];
                lines.extend(field.lines(format!("new {knob}: "), t));
                (format!("Set {knob}"), lines)
            }
            KnobDialog::ConfirmRestart {
                run,
                knob,
                value,
                text,
            } => (
                "Restart the run?".to_string(),
                vec![
                    Line::styled(
                        format!("Restart run {run} with {knob} = {value}? y/n"),
                        t.warn,
                    ),
                    Line::raw(""),
                    Line::styled(text.clone(), t.dim),
                ],
            ),
        };
        DialogBox {
            title,
            lines,
            keys: d.keys().to_string(),
            width: WIDTH,
            theme: t,
        }
        .render(area, buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{KnobRange, KnobState, TrainerInfo};
    use crate::supervisor::RunStatus;
    use crate::tui::action::ViewId;
    use crate::tui::app::App;
    use crate::tui::app::run_tests::run_info;
    use crate::tui::keymap::Keymap;
    use crate::tui::theme::Theme;
    use crossterm::event::{KeyCode, KeyModifiers};
    use std::time::Duration;

    const RUN: &str = "20261130-030000-train";

    fn knob(knob: KnobName, value: i64, max: Option<i64>) -> KnobState {
        KnobState {
            knob,
            value: Some(value),
            pending: None,
            range: Some(KnobRange { min: 1, max }),
            last_rtt_ms: None,
            last_outcome: None,
        }
    }

    /// The Run view of one live run whose batch size is 256 (1–1024) and prefetch 2 (1–8).
    fn app() -> App {
        let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
        app.view = ViewId::Run;
        app.on_update(Update::Runs(vec![run_info(RUN, RunStatus::Running)]));
        app.on_update(Update::Metrics {
            run: RUN.into(),
            points: vec![],
            reset: true,
            trainer: Box::new(TrainerInfo {
                attached: true,
                pid: Some(5120),
                last: None,
                knobs: vec![
                    knob(KnobName::BatchSize, 256, Some(1024)),
                    knob(KnobName::Prefetch, 2, Some(8)),
                ],
                ..TrainerInfo::default()
            }),
        });
        assert_eq!(app.take_requests(), [Request::Watch(RUN.into())]);
        app
    }

    fn press(app: &mut App, code: KeyCode) {
        let ev = KeyEvent::new(code, KeyModifiers::NONE);
        if let Some(a) = app.action_for_key(&ev) {
            app.apply(a);
        }
    }

    fn typed(app: &mut App, s: &str) {
        for c in s.chars() {
            press(app, KeyCode::Char(c));
        }
    }

    fn message(app: &App) -> Option<String> {
        match &app.run.dialog {
            Some(KnobDialog::Edit { field, .. }) => field.message.clone(),
            _ => None,
        }
    }

    #[test]
    fn enter_sends_a_value_in_range_and_refuses_one_outside_it() {
        let mut app = app();
        press(&mut app, KeyCode::Char('b'));
        assert!(matches!(
            app.run.dialog,
            Some(KnobDialog::Edit {
                knob: KnobName::BatchSize,
                current: Some(256),
                ..
            })
        ));
        assert!(app.modal());
        typed(&mut app, "2048");
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            message(&app).as_deref(),
            Some("2048 is outside the allowed range 1–1024")
        );
        assert!(app.take_requests().is_empty(), "nothing sent");
        assert!(app.run.dialog.is_some(), "the dialog stays for a new value");

        // q is typed into the dialog, not a quit.
        press(&mut app, KeyCode::Char('q'));
        assert!(!app.quit);
        assert!(message(&app).unwrap().contains("digits only"));

        for _ in 0..4 {
            press(&mut app, KeyCode::Backspace);
        }
        typed(&mut app, "256");
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            message(&app).as_deref(),
            Some("batch_size is 256 already: nothing to change")
        );
        for _ in 0..3 {
            press(&mut app, KeyCode::Backspace);
        }
        typed(&mut app, "512");
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            app.take_requests(),
            [Request::SetKnob {
                run: RUN.into(),
                knob: KnobName::BatchSize,
                value: 512,
                restart: false,
            }]
        );
        assert!(app.run.dialog.is_none() && !app.modal());
    }

    #[test]
    fn escape_cancels_and_other_views_do_not_open_it() {
        let mut app = app();
        press(&mut app, KeyCode::Char('d'));
        typed(&mut app, "4");
        press(&mut app, KeyCode::Esc);
        assert!(app.run.dialog.is_none());
        assert!(app.take_requests().is_empty());
        assert_eq!(app.view, ViewId::Run, "Esc went to the dialog only");

        app.view = ViewId::Overview;
        app.apply(Action::SetKnob(KnobName::Prefetch));
        assert!(app.run.dialog.is_none());
    }

    #[test]
    fn a_change_that_needs_a_restart_is_asked_first() {
        let mut app = app();
        let needs = Update::KnobNeedsRestart {
            run: RUN.into(),
            knob: KnobName::Prefetch,
            value: 4,
            text: "no trainer is attached … `gpupilot set x prefetch 4 --restart`".into(),
        };
        app.on_update(needs.clone());
        assert!(matches!(
            app.run.dialog,
            Some(KnobDialog::ConfirmRestart { value: 4, .. })
        ));
        press(&mut app, KeyCode::Char('n'));
        assert!(app.run.dialog.is_none());
        assert!(app.take_requests().is_empty(), "no: nothing sent");
        assert!(
            app.data
                .visible_status()
                .is_some_and(|s| s.text.contains("nothing changed"))
        );

        app.on_update(needs);
        press(&mut app, KeyCode::Char('y'));
        assert_eq!(
            app.take_requests(),
            [Request::SetKnob {
                run: RUN.into(),
                knob: KnobName::Prefetch,
                value: 4,
                restart: true,
            }]
        );
    }

    #[test]
    fn runs_without_the_knob_or_ended_say_why_instead() {
        let mut app = app();
        app.on_update(Update::Metrics {
            run: RUN.into(),
            points: vec![],
            reset: false,
            trainer: Box::new(TrainerInfo {
                knobs: vec![knob(KnobName::BatchSize, 256, Some(1024))],
                ..TrainerInfo::default()
            }),
        });
        press(&mut app, KeyCode::Char('d'));
        assert!(app.run.dialog.is_none());
        let s = app.data.visible_status().unwrap();
        assert_eq!(s.level, Level::Error);
        assert!(s.text.contains("[knobs.prefetch]"), "{}", s.text);

        app.on_update(Update::Runs(vec![run_info(RUN, RunStatus::Failed)]));
        press(&mut app, KeyCode::Char('b'));
        assert!(app.run.dialog.is_none());
        assert!(
            app.data
                .visible_status()
                .unwrap()
                .text
                .contains("has ended")
        );
        assert!(app.take_requests().is_empty());
    }
}
