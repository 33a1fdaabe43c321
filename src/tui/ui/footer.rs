//! The footer's key hints: the actions of the view shown that do something now (a run's keys
//! while a run is shown, a replay's while a recording plays, nothing that changes the node
//! while one does), worded for the state (`p resume` while the run is paused), and fitted to
//! the width: the keymap's words, then its short words, then fewer hints with `? more` — the
//! help (`?`) lists every key of the view, so a hint left out is never out of reach.

use crate::protocol::LogStream;
use crate::supervisor::RunStatus;
use crate::tui::action::{Action, ViewId};
use crate::tui::app::App;
use crate::tui::feed::Link;
use crate::tui::keymap::Hint;
use crate::tui::views::help;
use crate::tui::views::run::knobs_row;
use unicode_width::UnicodeWidthStr;

/// One hint the footer may show: the key, its word, and a shorter word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub word: String,
    pub short: String,
    /// The help's key: it turns into `more` when hints are left out.
    pub help: bool,
}

/// The hints that apply in `app` now, in the order they are given up (last first): the help,
/// a replay's keys, the view's own, then the global ones.
pub fn entries(app: &App) -> Vec<Entry> {
    let hints = app.keymap.hints(app.view, app.help.open);
    let rank = |h: &Hint| match h.action {
        Action::Help => 0,
        Action::ReplayPause | Action::ReplaySeek(_) => 1,
        _ if h.own => 2,
        _ => 3,
    };
    let mut shown: Vec<&Hint> = hints
        .iter()
        .filter(|h| app.help.open || applies(app, h.action))
        .collect();
    shown.sort_by_key(|h| rank(h));
    shown
        .into_iter()
        .map(|h| {
            let (word, short) = match state_word(app, h.action) {
                Some(w) => (w.to_string(), w.to_string()),
                None => (h.word.clone(), h.short.clone()),
            };
            Entry {
                key: h.key.clone(),
                word,
                short,
                help: h.action == Action::Help,
            }
        })
        .collect()
}

/// Whether `action` does something in `app` as it is: the footer shows nothing that would
/// only answer "not here" or "not now".
pub fn applies(app: &App, action: Action) -> bool {
    if !help::works(action, app.replaying()) {
        return false;
    }
    let run = app.run.current(&app.data);
    let live_run = run.is_some_and(|r| !r.is_final());
    let in_run = app.view == ViewId::Run;
    match action {
        Action::ZoomIn | Action::ZoomOut => app.view == ViewId::Detail,
        Action::NextGpu | Action::PrevGpu | Action::FirstGpu | Action::LastGpu => {
            app.data.gpus().len() > 1
        }
        Action::StopRun | Action::PauseRun | Action::TuneEnergy => in_run && live_run,
        Action::SetKnob(k) => {
            in_run && live_run && run.is_some_and(|r| knobs_row::has_knob(&app.data, r, k))
        }
        Action::PowerCap if in_run => {
            run.is_some_and(|r| knobs_row::cap_target(&app.data, r, app.selected).is_some())
        }
        Action::PowerCap => app.data.gpu(app.selected).is_some_and(|g| !g.lost),
        Action::Search | Action::Follow | Action::LogStream => in_run && run.is_some(),
        Action::RunNext | Action::RunPrev | Action::RunOpen => {
            in_run && app.data.run_list().len() > 1
        }
        _ => true,
    }
}

/// The word for an action whose hint depends on the state: what the key does now.
fn state_word(app: &App, action: Action) -> Option<&'static str> {
    match action {
        Action::PauseRun => app
            .run
            .current(&app.data)
            .filter(|r| r.status == RunStatus::Paused)
            .map(|_| "resume"),
        Action::LogStream => (app.run.stream == LogStream::Stderr).then_some("stdout"),
        Action::ReplayPause => match &app.data.link {
            Link::Replay { paused: true, .. } => Some("play"),
            _ => None,
        },
        _ => None,
    }
}

/// The hints as they fit in `width` columns: `(key, word)` pairs.
pub fn fit(entries: &[Entry], width: usize) -> Vec<(String, String)> {
    let pick = |short: bool| -> Vec<(String, String)> {
        entries
            .iter()
            .map(|e| {
                let word = if short { &e.short } else { &e.word };
                (e.key.clone(), word.clone())
            })
            .collect()
    };
    for short in [false, true] {
        let shown = pick(short);
        if columns(&shown) <= width {
            return shown;
        }
    }
    // Fewer hints: the last ones go first; the help stays and says there is more.
    let mut shown = pick(true);
    let mut kept: Vec<bool> = entries.iter().map(|_| true).collect();
    if let Some(h) = entries.iter().position(|e| e.help) {
        shown[h].1 = "more".into();
    }
    loop {
        let now: Vec<(String, String)> = shown
            .iter()
            .zip(&kept)
            .filter(|(_, k)| **k)
            .map(|(s, _)| s.clone())
            .collect();
        if columns(&now) <= width {
            return now;
        }
        match (0..entries.len())
            .rev()
            .find(|&i| kept[i] && !entries[i].help)
        {
            Some(i) => kept[i] = false,
            None => return Vec::new(),
        }
    }
}

/// The columns hints take: ` k word  k word`.
pub fn columns(shown: &[(String, String)]) -> usize {
    if shown.is_empty() {
        return 0;
    }
    1 + shown
        .iter()
        .map(|(k, w)| k.width() + 1 + w.width())
        .sum::<usize>()
        + 2 * (shown.len() - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, word: &str, short: &str) -> Entry {
        Entry {
            key: key.into(),
            word: word.into(),
            short: short.into(),
            help: key == "?",
        }
    }

    fn line(shown: &[(String, String)]) -> String {
        shown
            .iter()
            .map(|(k, w)| format!("{k} {w}"))
            .collect::<Vec<_>>()
            .join("  ")
    }

    #[test]
    fn hints_shorten_then_give_way_to_more() {
        let entries = [
            e("?", "help", "help"),
            e("b", "batch size", "batch"),
            e("c", "power cap", "cap"),
            e("q", "quit", "quit"),
        ];
        assert_eq!(
            line(&fit(&entries, 80)),
            "? help  b batch size  c power cap  q quit"
        );
        assert_eq!(line(&fit(&entries, 32)), "? help  b batch  c cap  q quit");
        assert_eq!(line(&fit(&entries, 24)), "? more  b batch  c cap");
        assert_eq!(line(&fit(&entries, 8)), "? more");
        assert!(fit(&entries, 3).is_empty());
        for w in 0..60 {
            let shown = fit(&entries, w);
            assert!(columns(&shown) <= w, "{w}: {shown:?}");
            // Whatever is left out, the help says so.
            if shown.len() < entries.len() && !shown.is_empty() {
                assert_eq!(shown[0], ("?".into(), "more".into()), "{w}");
            }
        }
    }
}
