//! The console's advisor pane at work: the hints of [`crate::advisor`] on the daemon's recent
//! telemetry and the live runs' metrics, each with the numbers behind it and its action one
//! key away. The pane's state and drawing are `views::advisor`; these are the parts of
//! [`App::apply`] and [`App::on_update`] that are the pane's.
//!
//! `a` opens the pane over any view (and `a`, Esc or q closes it). While it is open the feed
//! gathers the advisor's input as `gpupilot advise` does and sends the hints every
//! [`ADVISE_EVERY`](crate::tui::feed::daemon::ADVISE_EVERY) ([`Update::Advice`]); j/k select a
//! hint and Enter (or its number) acts on it through what the console already has: a knob
//! opens the Run view's knob dialog on the hint's run with the suggested value typed in, a
//! power cap opens the power-cap dialog of the GPU with the suggested watts, stopping a run
//! asks y/n in the footer. Nothing is sent before the user confirms there. A hint without a
//! console action (a thermal target) puts its command in the footer.

use crate::advisor::{Knob, Suggestion};
use crate::protocol::KnobName;
use crate::tui::action::{Action, ViewId};
use crate::tui::app::App;
use crate::tui::data::Level;
use crate::tui::feed::{Request, Update};
use crate::tui::views::advisor::PendingKnob;
use crate::tui::views::power_dialog::{self, PowerDialog};
use crate::tui::views::run::knob_dialog::{self, KnobDialog};
use crate::tui::views::run::state::Confirm;

/// Take in an update (before the data does): new advice. Returns whether a knob dialog waits
/// for this update (the run's knobs): then call [`after_update`] once the data took it in.
pub fn on_update(app: &mut App, u: &Update) -> bool {
    match u {
        Update::Advice(a) => {
            app.advisor.advice = Some((**a).clone());
            let n = app.advisor.hints().len();
            app.advisor.selected = app.advisor.selected.min(n.saturating_sub(1));
            false
        }
        Update::Metrics { run, .. } => app.advisor.pending.as_ref().is_some_and(|p| &p.run == run),
        _ => false,
    }
}

/// Open the knob dialog that waited for its run's knobs.
pub fn after_update(app: &mut App) {
    if let Some(p) = app.advisor.pending.take() {
        open_knob(app, p);
    }
}

/// Open or close the pane; the feed computes while it is open.
pub fn toggle(app: &mut App) {
    app.advisor.open = !app.advisor.open;
    if app.advisor.open {
        app.help.open = false;
    }
    app.outbox.push(Request::Advise(app.advisor.open));
}

/// Carry out `a` in the open pane.
pub fn apply(app: &mut App, a: Action) {
    let n = app.advisor.hints().len();
    match a {
        Action::ScrollDown => {
            app.advisor.selected = (app.advisor.selected + 1).min(n.saturating_sub(1))
        }
        Action::ScrollUp => app.advisor.selected = app.advisor.selected.saturating_sub(1),
        Action::HintAct(i) => act(app, i),
        _ => {}
    }
}

/// Act on hint `i`: open the dialog or question that makes its change.
pub fn act(app: &mut App, i: usize) {
    let Some(hint) = app.advisor.hints().get(i).cloned() else {
        let msg = match app.advisor.hints().len() {
            0 => "no hint to act on".to_string(),
            n => format!("there are {n} hints: press 1–{}", n.min(9)),
        };
        app.data.set_status(Level::Info, msg);
        return;
    };
    app.advisor.selected = i;
    let Some(action) = hint.action.clone() else {
        let msg = format!("this hint suggests no change: {}", hint.summary);
        app.data.set_status(Level::Info, msg);
        return;
    };
    match action.clone() {
        Suggestion::SetKnob { run, knob, value } => {
            let knob = match knob {
                Knob::BatchSize => KnobName::BatchSize,
                Knob::Prefetch => KnobName::Prefetch,
                Knob::PowerCap => {
                    let msg = format!("not from the console: {}", action.command());
                    app.data.set_status(Level::Info, msg);
                    return;
                }
            };
            close(app);
            open_knob(
                app,
                PendingKnob {
                    run,
                    knob,
                    value: value.round() as i64,
                },
            );
        }
        Suggestion::PowerCap { gpus, watts } if gpus.len() == 1 => {
            let gpu = gpus[0];
            let Some(pos) = app.data.gpus().iter().position(|g| g.index == gpu) else {
                let msg = format!("GPU {gpu} is not in the newest sample: its cap cannot be set");
                app.data.set_status(Level::Error, msg);
                return;
            };
            close(app);
            app.selected = pos;
            app.power = power_dialog::open(&mut app.data, pos);
            if let Some(PowerDialog::Edit { field, .. }) = &mut app.power {
                field.text = format!("{:.0}", watts.round());
            }
        }
        Suggestion::StopRun { run } => {
            close(app);
            app.view = ViewId::Run;
            app.run.confirm = Some(Confirm::Stop(run));
        }
        Suggestion::ThermalTarget { .. } => {
            let msg = format!(
                "the console sets no thermal target: run `{}`",
                action.command()
            );
            app.data.set_status(Level::Info, msg);
        }
        // The power-cap dialog sets one GPU; a job's GPUs go together from the command line.
        Suggestion::PowerCap { .. } | Suggestion::TuneEnergy { .. } => {
            let msg = format!("not from the console: run `{}`", action.command());
            app.data.set_status(Level::Info, msg);
        }
    }
}

fn close(app: &mut App) {
    if app.advisor.open {
        toggle(app);
    }
}

/// Show the hint's run in the Run view and open its knob dialog with the value typed in; when
/// the run's knobs have not come yet, once they do.
fn open_knob(app: &mut App, p: PendingKnob) {
    app.view = ViewId::Run;
    if app.run.open.as_deref() != Some(p.run.as_str()) {
        app.run.open = Some(p.run.clone());
        app.run.follow = true;
    }
    if app.run.watching.as_deref() != Some(p.run.as_str()) {
        app.run.watching = Some(p.run.clone());
        app.outbox.push(Request::Watch(p.run.clone()));
    }
    let here = app.run.current(&app.data).is_some_and(|r| r.id == p.run);
    if !here || app.data.metrics.of(&p.run).is_none() {
        let msg = format!("waiting for run {}'s knobs from the daemon…", p.run);
        app.data.set_status(Level::Info, msg);
        app.advisor.pending = Some(p);
        return;
    }
    knob_dialog::open(&mut app.run, &mut app.data, p.knob);
    if let Some(KnobDialog::Edit { field, .. }) = &mut app.run.dialog {
        field.text = p.value.to_string();
    }
}
