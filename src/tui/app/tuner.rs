//! The energy tuner from the console, at work: `t` in the Run view asks "Tune the power cap of
//! run …? y/n" and `y` starts `gpupilot tune energy` on the run shown, with the defaults, on a
//! thread of the console's feed (its own connection to the daemon, the same search as the
//! command). Its progress comes back as [`Update::Tuner`] and the Run view draws it over the
//! log: the cap under test, how far through its window, the cost curve so far, then the best
//! cap and the saving. `t` while it runs asks to stop it (the starting caps go back, as with
//! Ctrl-C on the command); `t` after it ended closes the result. Quitting the console stops the
//! search and puts the starting caps back before the console exits.
//!
//! The tuner's state and panel are `views::run::tuner_panel`; these are the parts of
//! [`App::apply`] and [`App::on_update`] that are the tuner's.

use crate::tui::app::App;
use crate::tui::data::Level;
use crate::tui::feed::daemon::{TunerEnd, TunerEvent};
use crate::tui::feed::{Link, Request, Update};
use crate::tui::views::run::tuner_panel::{TuneAsk, TunerShown};

/// Take in an update.
pub fn on_update(app: &mut App, u: &Update) {
    if let Update::Tuner(e) = u {
        let ended = matches!(**e, TunerEvent::Ended { .. });
        app.tuner.on_event(e);
        if ended {
            let (level, text) = end_line(app.tuner.shown.as_ref().and_then(|s| s.end.as_ref()));
            app.data.set_status(level, text);
        }
    }
}

/// The footer's word on how a search ended.
fn end_line(end: Option<&TunerEnd>) -> (Level, String) {
    match end {
        Some(TunerEnd::Done { result, .. }) => {
            (Level::Info, format!("energy tuner: {}", result.summary()))
        }
        Some(TunerEnd::Cancelled {
            why,
            restored: Ok(()),
        }) => (
            Level::Info,
            format!("energy tuner stopped ({why}): the starting caps are back"),
        ),
        Some(TunerEnd::Cancelled {
            why,
            restored: Err(e),
        }) => (
            Level::Error,
            format!(
                "energy tuner stopped ({why}) and putting the starting caps back failed: {e}; \
                 check with `gpupilot power`"
            ),
        ),
        Some(TunerEnd::Failed(e)) => (Level::Error, format!("energy tuner: {e}")),
        None => (Level::Info, String::new()),
    }
}

/// `t` in the Run view: ask to start a search on the run shown, ask to stop the one running,
/// or close an ended one's result.
pub fn key(app: &mut App) {
    if let Some(s) = &app.tuner.shown {
        if s.running() {
            app.tuner.ask = Some(TuneAsk::Stop(s.run.clone()));
        } else {
            app.tuner.shown = None;
            app.data.set_status(
                Level::Info,
                "tuner result closed (t starts a new search; `tune-energy.json` in the run's \
                 directory keeps it)",
            );
        }
        return;
    }
    let Some(r) = app.run.current(&app.data) else {
        app.data.set_status(
            Level::Info,
            "no run to tune: `gpupilot run PROFILE.toml` starts one",
        );
        return;
    };
    let id = r.id.clone();
    if r.is_final() {
        let msg = format!("run {id} has ended: only a training run can be tuned");
        app.data.set_status(Level::Info, msg);
        return;
    }
    if app.data.link == Link::Local {
        app.data.set_status(
            Level::Info,
            "the energy tuner needs the daemon, and this console samples in-process: start \
             `gpupilot` (it starts the daemon)",
        );
        return;
    }
    app.tuner.ask = Some(TuneAsk::Start(id));
}

/// The answer to the footer's question.
pub fn answer(app: &mut App, yes: bool) {
    let Some(ask) = app.tuner.ask.take() else {
        return;
    };
    match (ask, yes) {
        (TuneAsk::Start(run), true) => {
            app.tuner.shown = Some(TunerShown::starting(&run));
            let msg = format!("starting the energy tuner on run {run}…");
            app.data.set_status(Level::Info, msg);
            app.outbox.push(Request::TuneEnergy(run));
        }
        (TuneAsk::Start(run), false) => {
            app.data
                .set_status(Level::Info, format!("run {run} left as it is"));
        }
        (TuneAsk::Stop(run), true) => {
            if let Some(s) = &mut app.tuner.shown {
                s.stopping = true;
            }
            let msg = format!("stopping the tuner on run {run}: the starting caps go back…");
            app.data.set_status(Level::Info, msg);
            app.outbox.push(Request::TuneStop);
        }
        (TuneAsk::Stop(run), false) => {
            app.data
                .set_status(Level::Info, format!("the tuner goes on with run {run}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_footer_says_how_it_ended() {
        let (level, text) = end_line(Some(&TunerEnd::Cancelled {
            why: "the run ended".into(),
            restored: Err("daemon gone".into()),
        }));
        assert_eq!(level, Level::Error);
        assert!(
            text.contains("the run ended") && text.contains("gpupilot power"),
            "{text}"
        );
        let (level, text) = end_line(Some(&TunerEnd::Cancelled {
            why: "interrupted".into(),
            restored: Ok(()),
        }));
        assert_eq!(level, Level::Info);
        assert!(text.contains("starting caps are back"), "{text}");
    }
}
