//! The power-cap dialog of the Overview and GPU detail views: `c` opens it on the selected GPU
//! with its cap, default and allowed range from the newest snapshot; Enter checks the watts
//! typed against the range here (outside: the dialog names the range and nothing is sent),
//! then asks "cap GPU 1 at 250 W (now 450 W)? y/n"; `y` sends `power_cap` through the feed and
//! the daemon's answer shows in the footer. `r` asks, the same way, to restore the limit
//! recorded before gpupilot's first change (`power_reset`). Esc cancels at any point. A console
//! without a daemon (an in-process sampler) says so instead of sending. While it is open every
//! key goes to it.

use super::Ctx;
use crate::tui::action::Action;
use crate::tui::data::{Data, Level};
use crate::tui::dialog::{self, DialogBox, Edited, NumberField};
use crate::tui::feed::local::NO_DAEMON;
use crate::tui::feed::{Link, Request};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Widget;

/// The dialog's width, at most.
const WIDTH: u16 = 64;

/// What the GPU reported about its power limit, watts (the allowed range as whole watts
/// inside the driver's bounds, so every value the field takes is one the GPU takes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub current_w: Option<f64>,
    pub default_w: Option<f64>,
    pub min_w: i64,
    pub max_w: i64,
}

/// What `y` will ask of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Cap(u32),
    /// Back to the limit recorded before gpupilot's first change.
    Reset,
}

/// See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub enum PowerDialog {
    /// Watts being typed.
    Edit {
        /// The GPU's index (as the daemon numbers them).
        gpu: u32,
        limits: Limits,
        /// The watts, within the allowed range.
        field: NumberField,
    },
    /// The change, asked y/n before it is sent.
    Confirm {
        gpu: u32,
        limits: Limits,
        change: Change,
    },
}

impl PowerDialog {
    /// The action a key runs while the dialog is open (every key goes to it).
    pub fn action_for_key(&self, ev: &KeyEvent) -> Option<Action> {
        // Esc and Ctrl-C cancel at every step, the question included.
        let ctrl = ev.modifiers.contains(KeyModifiers::CONTROL);
        match ev.code {
            KeyCode::Esc => return Some(Action::PromptCancel),
            KeyCode::Char('c') if ctrl => return Some(Action::PromptCancel),
            _ => {}
        }
        match self {
            PowerDialog::Confirm { .. } => Some(dialog::yes_no_key(ev)),
            PowerDialog::Edit { .. } => dialog::field_key(ev),
        }
    }

    /// Whether the dialog takes `a` (while open).
    pub fn handles(a: Action) -> bool {
        dialog::takes(a)
    }

    /// What the footer says while the dialog is open.
    pub fn keys(&self) -> &'static str {
        match self {
            PowerDialog::Edit { .. } => "Enter: next · r: restore the recorded cap · Esc: cancel",
            PowerDialog::Confirm { .. } => "y: yes · Esc or any other key: no",
        }
    }
}

/// Open the dialog on the GPU at position `selected`, or say in the footer why its cap cannot
/// be set from here.
pub fn open(data: &mut Data, selected: usize) -> Option<PowerDialog> {
    let Some(g) = data.gpu(selected) else {
        data.set_status(Level::Info, "no GPU to cap: waiting for the first sample…");
        return None;
    };
    let gpu = g.index;
    if g.lost {
        let msg = format!("GPU {gpu} fell off the bus: its power cap cannot be set");
        data.set_status(Level::Error, msg);
        return None;
    }
    let (Some(min), Some(max)) = (g.power_min_w, g.power_max_w) else {
        let msg = format!(
            "GPU {gpu} reports no power-limit range, so a cap cannot be checked here: \
             `gpupilot power` shows what the daemon reads"
        );
        data.set_status(Level::Error, msg);
        return None;
    };
    let (min_w, max_w) = (min.ceil() as i64, max.floor() as i64);
    if min_w > max_w {
        let msg = format!("GPU {gpu}'s power limit cannot be changed (its range is {min}–{max} W)");
        data.set_status(Level::Error, msg);
        return None;
    }
    Some(PowerDialog::Edit {
        gpu,
        limits: Limits {
            current_w: g.power_limit_w,
            default_w: g.power_default_w,
            min_w,
            max_w,
        },
        field: NumberField::new(min_w, Some(max_w), " W"),
    })
}

/// Carry out `a` in the open dialog `slot`; returns the request for the feed, if any.
pub fn apply(slot: &mut Option<PowerDialog>, data: &mut Data, a: Action) -> Option<Request> {
    if a == Action::PromptCancel {
        *slot = None;
        return None;
    }
    let no_daemon = data.link == Link::Local;
    match slot.as_mut()? {
        PowerDialog::Edit { gpu, limits, field } => match a {
            Action::PromptChar('r' | 'R') if no_daemon => field.message = Some(NO_DAEMON.into()),
            Action::PromptChar('r' | 'R') => {
                *slot = Some(PowerDialog::Confirm {
                    gpu: *gpu,
                    limits: *limits,
                    change: Change::Reset,
                });
            }
            _ => match field.edit(a) {
                Edited::Editing => {}
                Edited::Cancelled => *slot = None,
                Edited::Entered(_) if no_daemon => field.message = Some(NO_DAEMON.into()),
                Edited::Entered(w) => {
                    *slot = Some(PowerDialog::Confirm {
                        gpu: *gpu,
                        limits: *limits,
                        // Within a GPU's range, which is a few hundred watts.
                        change: Change::Cap(w as u32),
                    });
                }
            },
        },
        PowerDialog::Confirm { gpu, change, .. } => {
            let (gpu, change) = (*gpu, *change);
            *slot = None;
            if a != Action::Confirm(true) {
                data.set_status(
                    Level::Info,
                    format!("nothing changed: GPU {gpu} keeps its power cap"),
                );
                return None;
            }
            return Some(match change {
                Change::Cap(watts) => {
                    data.set_status(
                        Level::Info,
                        format!("asking the daemon: cap GPU {gpu} at {watts} W…"),
                    );
                    Request::PowerCap { gpu, watts }
                }
                Change::Reset => {
                    data.set_status(
                        Level::Info,
                        format!("asking the daemon: restore GPU {gpu}'s recorded power cap…"),
                    );
                    Request::PowerReset { gpu }
                }
            });
        }
    }
    None
}

/// `450 W`, or N/A.
fn w(v: Option<f64>) -> String {
    v.map_or_else(|| "N/A".to_string(), |v| format!("{v:.0} W"))
}

/// The dialog, drawn over the body.
pub struct PowerDialogView<'a> {
    pub ctx: Ctx<'a>,
    pub dialog: &'a PowerDialog,
}

impl Widget for PowerDialogView<'_> {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let t = self.ctx.theme;
        let d = self.dialog;
        let (gpu, limits) = match d {
            PowerDialog::Edit { gpu, limits, .. } | PowerDialog::Confirm { gpu, limits, .. } => {
                (*gpu, limits)
            }
        };
        let now = Line::from(vec![
            Span::styled("now ", t.dim),
            Span::raw(w(limits.current_w)),
            Span::styled("   default ", t.dim),
            Span::raw(w(limits.default_w)),
            Span::styled("   allowed ", t.dim),
            Span::raw(format!("{}–{} W", limits.min_w, limits.max_w)),
        ]);
        let mut lines = vec![now, Line::raw("")];
        let title = match d {
            PowerDialog::Edit { field, .. } => {
                lines.extend(field.lines("new cap, watts: ".into(), t));
                format!("Power cap of GPU {gpu}")
            }
            PowerDialog::Confirm { change, .. } => {
                let (question, note) = match change {
                    Change::Cap(watts) => (
                        format!(
                            "cap GPU {gpu} at {watts} W (now {})? y/n",
                            w(limits.current_w)
                        ),
                        "`gpupilot power reset` (or r here) restores the recorded cap",
                    ),
                    Change::Reset => (
                        format!(
                            "restore GPU {gpu}'s power cap recorded before gpupilot's first \
                             change (now {})? y/n",
                            w(limits.current_w)
                        ),
                        "`gpupilot power` shows the recorded value",
                    ),
                };
                lines.push(Line::styled(question, t.warn));
                lines.push(Line::styled(note, t.dim));
                format!("Power cap of GPU {gpu}?")
            }
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
    use crate::telemetry::{GpuSample, Snapshot};
    use crate::tui::action::ViewId;
    use crate::tui::app::App;
    use crate::tui::keymap::Keymap;
    use crate::tui::theme::Theme;
    use std::time::Duration;

    /// Two GPUs linked to a daemon: GPU 0 capped at 700 W, GPU 1 at 450 W (default 700 W,
    /// allowed 200–700 W).
    fn app(link: Link) -> App {
        let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
        app.on_update(crate::tui::feed::Update::Link(link));
        let gpu = |index, cap| GpuSample {
            index,
            power_limit_w: Some(cap),
            power_default_w: Some(700.0),
            power_min_w: Some(200.0),
            power_max_w: Some(700.0),
            ..GpuSample::default()
        };
        app.on_snapshot(Snapshot {
            time_s: 1.0,
            gpus: vec![gpu(0, 700.0), gpu(1, 450.0)],
            ..Default::default()
        });
        app
    }

    fn daemon() -> Link {
        Link::Daemon {
            pid: 4100,
            readonly: false,
            telemetry_error: None,
            rate_hz: 1.0,
        }
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
        match &app.power {
            Some(PowerDialog::Edit { field, .. }) => field.message.clone(),
            _ => None,
        }
    }

    #[test]
    fn the_selected_gpu_is_capped_after_a_yes() {
        let mut app = app(daemon());
        press(&mut app, KeyCode::Char('j'));
        press(&mut app, KeyCode::Char('c'));
        assert_eq!(
            app.power,
            Some(PowerDialog::Edit {
                gpu: 1,
                limits: Limits {
                    current_w: Some(450.0),
                    default_w: Some(700.0),
                    min_w: 200,
                    max_w: 700,
                },
                field: NumberField::new(200, Some(700), " W"),
            })
        );
        assert!(app.modal());
        // j and q are typed into the dialog: no new GPU, no quit.
        press(&mut app, KeyCode::Char('q'));
        assert!(!app.quit);
        assert!(message(&app).unwrap().contains("digits only"));
        typed(&mut app, "250");
        press(&mut app, KeyCode::Enter);
        assert!(
            matches!(
                app.power,
                Some(PowerDialog::Confirm {
                    gpu: 1,
                    change: Change::Cap(250),
                    ..
                })
            ),
            "{:?}",
            app.power
        );
        assert!(
            app.take_requests().is_empty(),
            "nothing sent before the yes"
        );
        press(&mut app, KeyCode::Char('y'));
        assert_eq!(
            app.take_requests(),
            [Request::PowerCap { gpu: 1, watts: 250 }]
        );
        assert!(app.power.is_none() && !app.modal());
        let s = app.data.visible_status().unwrap();
        assert_eq!(s.text, "asking the daemon: cap GPU 1 at 250 W…");
    }

    #[test]
    fn out_of_range_is_refused_with_the_range_and_nothing_is_sent() {
        let mut app = app(daemon());
        app.view = ViewId::Detail;
        press(&mut app, KeyCode::Char('c'));
        typed(&mut app, "150");
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            message(&app).as_deref(),
            Some("150 is outside the allowed range 200–700 W")
        );
        for _ in 0..3 {
            press(&mut app, KeyCode::Backspace);
        }
        typed(&mut app, "701");
        press(&mut app, KeyCode::Enter);
        assert_eq!(
            message(&app).as_deref(),
            Some("701 is outside the allowed range 200–700 W")
        );
        assert!(matches!(app.power, Some(PowerDialog::Edit { gpu: 0, .. })));
        assert!(app.take_requests().is_empty());
        // The bounds themselves are allowed.
        press(&mut app, KeyCode::Backspace);
        press(&mut app, KeyCode::Backspace);
        press(&mut app, KeyCode::Backspace);
        typed(&mut app, "700");
        press(&mut app, KeyCode::Enter);
        assert!(matches!(
            app.power,
            Some(PowerDialog::Confirm {
                change: Change::Cap(700),
                ..
            })
        ));
    }

    #[test]
    fn escape_cancels_at_any_point_and_no_is_no() {
        let mut app = app(daemon());
        press(&mut app, KeyCode::Char('c'));
        typed(&mut app, "300");
        press(&mut app, KeyCode::Esc);
        assert!(app.power.is_none());
        assert_eq!(app.view, ViewId::Overview, "Esc went to the dialog only");

        app.view = ViewId::Detail;
        press(&mut app, KeyCode::Char('c'));
        typed(&mut app, "300");
        press(&mut app, KeyCode::Enter);
        assert!(matches!(app.power, Some(PowerDialog::Confirm { .. })));
        press(&mut app, KeyCode::Esc);
        assert!(app.power.is_none());
        assert_eq!(
            app.view,
            ViewId::Detail,
            "Esc did not go back to the overview"
        );

        press(&mut app, KeyCode::Char('c'));
        typed(&mut app, "300");
        press(&mut app, KeyCode::Enter);
        press(&mut app, KeyCode::Char('n'));
        assert!(app.power.is_none());
        assert!(app.take_requests().is_empty(), "nothing sent");
        assert!(
            app.data
                .visible_status()
                .is_some_and(|s| s.text.contains("nothing changed"))
        );

        // Not in the Run or Events views (c means nothing there).
        app.view = ViewId::Run;
        app.apply(Action::PowerCap);
        assert!(app.power.is_none());
    }

    #[test]
    fn r_restores_the_recorded_cap_after_a_yes() {
        let mut app = app(daemon());
        press(&mut app, KeyCode::Char('G'));
        press(&mut app, KeyCode::Char('c'));
        press(&mut app, KeyCode::Char('r'));
        assert!(matches!(
            app.power,
            Some(PowerDialog::Confirm {
                gpu: 1,
                change: Change::Reset,
                ..
            })
        ));
        assert!(app.take_requests().is_empty());
        press(&mut app, KeyCode::Char('y'));
        assert_eq!(app.take_requests(), [Request::PowerReset { gpu: 1 }]);
    }

    #[test]
    fn without_a_daemon_the_dialog_says_so_instead_of_sending() {
        let mut app = app(Link::Local);
        press(&mut app, KeyCode::Char('c'));
        typed(&mut app, "300");
        press(&mut app, KeyCode::Enter);
        assert_eq!(message(&app).as_deref(), Some(NO_DAEMON));
        press(&mut app, KeyCode::Char('r'));
        assert_eq!(message(&app).as_deref(), Some(NO_DAEMON));
        assert!(matches!(app.power, Some(PowerDialog::Edit { .. })));
        assert!(app.take_requests().is_empty());
    }

    #[test]
    fn gpus_without_a_range_or_lost_say_why_instead() {
        let mut app = app(daemon());
        let mut snap = app.data.snapshot.clone().unwrap();
        snap.gpus[0].power_min_w = None;
        snap.gpus[1].lost = true;
        app.on_snapshot(snap);
        press(&mut app, KeyCode::Char('c'));
        assert!(app.power.is_none());
        let s = app.data.visible_status().unwrap();
        assert_eq!(s.level, Level::Error);
        assert!(s.text.contains("no power-limit range"), "{}", s.text);
        press(&mut app, KeyCode::Char('j'));
        press(&mut app, KeyCode::Char('c'));
        assert!(app.power.is_none());
        assert!(
            app.data
                .visible_status()
                .unwrap()
                .text
                .contains("fell off the bus")
        );
    }
}
