//! The energy tuner from the console: `t` in the Run view asks "Tune the power cap of run …?
//! y/n" and `y` starts `gpupilot tune energy` on the run shown, with the defaults, on a thread
//! of the console's feed (its own connection to the daemon, the same search as the command).
//! Its progress comes back as [`Update::Tuner`] and the Run view draws it over the log: the
//! cap under test, how far through its window, the cost curve so far, then the best cap and
//! the saving. `t` while it runs asks to stop it (the starting caps go back, as with Ctrl-C on
//! the command); `t` after it ended closes the result. Quitting the console stops the search
//! and puts the starting caps back before the console exits.

use crate::control::tuner::{Progress, Window};
use crate::tui::action::Action;
use crate::tui::app::App;
use crate::tui::data::Level;
use crate::tui::feed::daemon::{TunerEnd, TunerEvent};
use crate::tui::feed::{Link, Request, Update};

/// A y/n question in the footer about the tuner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TuneAsk {
    /// Start a search on this run.
    Start(String),
    /// Stop the search running on this run.
    Stop(String),
}

/// The search the console started, as shown.
#[derive(Debug, Clone, PartialEq)]
pub struct TunerShown {
    pub run: String,
    pub gpus: Vec<u32>,
    pub plan: Vec<f64>,
    pub window: Option<Window>,
    pub eta: Option<f64>,
    pub progress: Option<Progress>,
    /// None while it runs.
    pub end: Option<TunerEnd>,
    /// A stop was asked for and not yet carried out.
    pub stopping: bool,
}

impl TunerShown {
    /// A search asked for on `run`, before its thread reports.
    pub fn starting(run: &str) -> TunerShown {
        TunerShown {
            run: run.to_string(),
            gpus: Vec::new(),
            plan: Vec::new(),
            window: None,
            eta: None,
            progress: None,
            end: None,
            stopping: false,
        }
    }

    pub fn running(&self) -> bool {
        self.end.is_none()
    }
}

/// The tuner's part of the console state.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TunerUi {
    pub ask: Option<TuneAsk>,
    pub shown: Option<TunerShown>,
}

impl TunerUi {
    /// Take in the tuner's report.
    pub fn on_event(&mut self, e: &TunerEvent) {
        let run = match e {
            TunerEvent::Started { run, .. }
            | TunerEvent::Progress { run, .. }
            | TunerEvent::Ended { run, .. } => run,
        };
        let shown = match &mut self.shown {
            Some(s) if &s.run == run => s,
            // A report about a search this console state did not start (a reconnect): show it.
            slot => slot.insert(TunerShown::starting(run)),
        };
        match e {
            TunerEvent::Started {
                gpus,
                plan,
                window,
                eta,
                ..
            } => {
                shown.gpus = gpus.clone();
                shown.plan = plan.clone();
                shown.window = Some(*window);
                shown.eta = Some(*eta);
            }
            TunerEvent::Progress { progress, .. } => shown.progress = Some(progress.clone()),
            TunerEvent::Ended { end, .. } => {
                if let TunerEnd::Done { result, .. } = end {
                    let p = shown.progress.get_or_insert_with(|| Progress {
                        phase: crate::control::tuner::Phase::Done,
                        cap_w: None,
                        index: 0,
                        planned: result.planned,
                        fraction: 1.0,
                        curve: Vec::new(),
                        best_cap_w: None,
                    });
                    p.curve = result.curve.clone();
                    p.best_cap_w = Some(result.best.cap_w);
                }
                shown.end = Some(end.clone());
                shown.stopping = false;
            }
        }
    }

    /// The tuner shown with run `id`, if any.
    pub fn of(&self, id: &str) -> Option<&TunerShown> {
        self.shown.as_ref().filter(|s| s.run == id)
    }
}

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

/// Whether the tuner takes `a` while its question is open.
pub fn handles(app: &App, a: Action) -> bool {
    app.tuner.ask.is_some() && matches!(a, Action::Confirm(_))
}

/// The footer's question.
pub fn question(ask: &TuneAsk) -> (String, &'static str) {
    match ask {
        TuneAsk::Start(run) => (
            format!(" Tune run {run}'s power cap for energy? "),
            " starts it (it stops if the console quits) · any other key: no",
        ),
        TuneAsk::Stop(run) => (
            format!(" Stop the tuner on run {run}? "),
            " stops it and puts the starting caps back · any other key: no",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::tuner::{CapPoint, Phase, TuneResult};

    fn point(cap_w: f64, cost: f64) -> CapPoint {
        CapPoint {
            cap_w,
            energy_j: 100.0,
            samples: 10.0,
            seconds: 1.0,
            energy_per_sample_j: 10.0,
            time_per_sample_s: 0.1,
            avg_power_w: 100.0,
            cost,
        }
    }

    fn progress(curve: Vec<CapPoint>) -> Progress {
        Progress {
            phase: Phase::Measure,
            cap_w: Some(650.0),
            index: 2,
            planned: 5,
            fraction: 0.5,
            curve,
            best_cap_w: Some(700.0),
        }
    }

    #[test]
    fn reports_build_up_what_the_panel_shows() {
        let mut ui = TunerUi {
            shown: Some(TunerShown::starting("r")),
            ..TunerUi::default()
        };
        ui.on_event(&TunerEvent::Started {
            run: "r".into(),
            gpus: vec![0, 1],
            plan: vec![700.0, 675.0],
            window: Window::DEFAULT_STEPS,
            eta: 0.5,
        });
        ui.on_event(&TunerEvent::Progress {
            run: "r".into(),
            progress: progress(vec![point(700.0, 3.0)]),
        });
        let s = ui.of("r").expect("shown");
        assert!(s.running());
        assert_eq!((s.gpus.as_slice(), s.plan.len()), (&[0, 1][..], 2));
        assert_eq!(s.progress.as_ref().unwrap().curve.len(), 1);
        assert!(ui.of("other").is_none());

        // The result's curve is the final one, and its best cap is marked.
        let mut result = TuneResult {
            eta: 0.5,
            max_power_w: 1400.0,
            window: Window::DEFAULT_STEPS,
            start_w: 700.0,
            default_w: 700.0,
            best: point(675.0, 2.0),
            default: Some(point(700.0, 3.0)),
            curve: vec![point(700.0, 3.0), point(675.0, 2.0)],
            energy_saving_pct: Some(5.0),
            time_change_pct: Some(1.0),
            cost_saving_pct: Some(33.0),
            stopped_early: false,
            planned: 2,
            duration_s: 60.0,
        };
        result.best.cap_w = 675.0;
        ui.on_event(&TunerEvent::Ended {
            run: "r".into(),
            end: TunerEnd::Done {
                result: Box::new(result),
                saved: Ok("/x/tune-energy.json".into()),
            },
        });
        let s = ui.of("r").unwrap();
        assert!(!s.running());
        let p = s.progress.as_ref().unwrap();
        assert_eq!((p.curve.len(), p.best_cap_w), (2, Some(675.0)));
    }

    #[test]
    fn a_report_about_another_run_replaces_what_is_shown() {
        let mut ui = TunerUi {
            shown: Some(TunerShown::starting("a")),
            ..TunerUi::default()
        };
        ui.on_event(&TunerEvent::Ended {
            run: "b".into(),
            end: TunerEnd::Failed("no metrics".into()),
        });
        assert!(ui.of("a").is_none());
        assert_eq!(
            ui.of("b").and_then(|s| s.end.clone()),
            Some(TunerEnd::Failed("no metrics".into()))
        );
    }

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
