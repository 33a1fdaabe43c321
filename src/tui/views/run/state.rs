//! What the Run view remembers between frames, and how its actions change it: which run is
//! shown and which row of the run list is selected, the log's stream, scroll and following,
//! the search, and the footer's prompt and y/n question. Actions that need the daemon come
//! back as a [`Request`] for the feed; nothing here talks to anyone.

use super::knob_dialog::KnobDialog;
use crate::protocol::{LogStream, RunInfo};
use crate::supervisor::RunStatus;
use crate::tui::action::Action;
use crate::tui::data::{Data, Level};
use crate::tui::feed::{Link, Request, local::NO_RUNS};
use crate::tui::log::LogBuffer;

/// Lines one wheel step scrolls the log.
const WHEEL_LINES: u64 = 3;

/// A question in the footer, waiting for y or n.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// Stop this run (its id).
    Stop(String),
}

/// See the module doc.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// Row of the run list (newest first).
    pub selected: usize,
    /// The run chosen with Enter, `gpupilot run` or `attach` (its id); None: the newest live
    /// run, else the newest.
    pub open: Option<String>,
    /// The run whose log the feed was last asked to tail.
    pub watching: Option<String>,
    pub stream: LogStream,
    /// Show the end of the log as it grows.
    pub follow: bool,
    /// First line shown while not following.
    pub top: u64,
    /// The search (empty: none) and the line of its current match.
    pub query: String,
    pub current: Option<u64>,
    /// A search being typed in the footer.
    pub prompt: Option<String>,
    pub confirm: Option<Confirm>,
    /// The knob dialog, while open.
    pub dialog: Option<KnobDialog>,
    /// The list selection was put on the shown run once the runs came.
    placed: bool,
}

impl Default for RunState {
    fn default() -> Self {
        RunState {
            selected: 0,
            open: None,
            watching: None,
            stream: LogStream::Stdout,
            follow: true,
            top: 0,
            query: String::new(),
            current: None,
            prompt: None,
            confirm: None,
            dialog: None,
            placed: false,
        }
    }
}

/// The runs as the list shows them: newest first.
pub fn list(data: &Data) -> impl Iterator<Item = &RunInfo> {
    data.run_list().iter().rev()
}

/// The first and one-past-last line of `buf` shown in `height` rows.
pub fn window(state: &RunState, buf: &LogBuffer, height: usize) -> (u64, u64) {
    let (start, end) = (buf.start(), buf.end());
    let h = height as u64;
    let first = if state.follow {
        end.saturating_sub(h)
    } else {
        state.top.min(end.saturating_sub(h))
    }
    .max(start);
    (first, (first + h).min(end))
}

impl RunState {
    /// Open `run` (a full id) as `gpupilot run` and `attach` do.
    pub fn opened(run: String) -> RunState {
        RunState {
            open: Some(run),
            ..RunState::default()
        }
    }

    /// The run shown: the one opened, else the newest live one, else the newest.
    pub fn current<'a>(&self, data: &'a Data) -> Option<&'a RunInfo> {
        let runs = data.run_list();
        if let Some(id) = &self.open {
            if let Some(r) = runs.iter().find(|r| &r.id == id) {
                return Some(r);
            }
        }
        runs.iter().rev().find(|r| !r.is_final()).or(runs.last())
    }

    /// After new runs came: keep the selection in the list, and start it on the shown run.
    pub fn on_runs(&mut self, data: &Data) {
        let n = data.run_list().len();
        if !self.placed && n > 0 {
            self.placed = true;
            if let Some(id) = self.current(data).map(|r| r.id.clone()) {
                self.selected = list(data).position(|r| r.id == id).unwrap_or(0);
            }
        }
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    /// The log shown now.
    pub fn buffer<'a>(&self, data: &'a Data) -> Option<&'a LogBuffer> {
        let run = self.current(data)?;
        (data.log.run.as_deref() == Some(run.id.as_str())).then(|| data.log.stream(self.stream))
    }

    /// Carry out `a` (one [`Action::for_run_view`] says this state takes); `page` is the
    /// number of log lines on screen. Returns what to ask the
    /// daemon, if anything; messages for the footer go to `data`.
    pub fn apply(&mut self, a: Action, data: &mut Data, page: usize) -> Option<Request> {
        let page = page.max(1);
        match a {
            Action::RunNext => {
                let n = data.run_list().len();
                self.selected = (self.selected + 1).min(n.saturating_sub(1));
            }
            Action::RunPrev => self.selected = self.selected.saturating_sub(1),
            Action::RunOpen => {
                if let Some(r) = list(data).nth(self.selected) {
                    self.open = Some(r.id.clone());
                    self.reset_view();
                }
            }
            Action::LogStream => {
                self.stream = match self.stream {
                    LogStream::Stdout => LogStream::Stderr,
                    LogStream::Stderr => LogStream::Stdout,
                };
                self.reset_view();
            }
            Action::Follow => {
                if self.follow {
                    self.top = self.shown(data, page).0;
                }
                self.follow = !self.follow;
            }
            Action::Top => {
                self.follow = false;
                self.top = 0;
            }
            Action::Bottom => self.follow = true,
            Action::PageUp => self.scroll(data, page, -(page.saturating_sub(1).max(1) as i64)),
            Action::PageDown => self.scroll(data, page, page.saturating_sub(1).max(1) as i64),
            Action::ScrollUp => self.scroll(data, page, -(WHEEL_LINES as i64)),
            Action::ScrollDown => self.scroll(data, page, WHEEL_LINES as i64),
            Action::Search => self.prompt = Some(String::new()),
            Action::PromptChar(c) => {
                if let Some(p) = &mut self.prompt {
                    p.push(c);
                }
            }
            Action::PromptBackspace => {
                if let Some(p) = &mut self.prompt {
                    p.pop();
                }
            }
            Action::PromptCancel => self.prompt = None,
            Action::PromptSubmit => {
                let query = self.prompt.take().unwrap_or_default();
                self.query = query;
                self.current = None;
                if !self.query.is_empty() {
                    // The newest match at or above the bottom of the screen.
                    let bottom = self.shown(data, page).1.saturating_sub(1);
                    self.jump(data, page, bottom, false);
                }
            }
            Action::SearchNext | Action::SearchPrev => {
                let forward = a == Action::SearchNext;
                if self.query.is_empty() {
                    data.set_status(Level::Info, "no search: / starts one");
                    return None;
                }
                let (first, end) = self.shown(data, page);
                let from = match self.current {
                    Some(c) if forward => c + 1,
                    Some(c) => c.saturating_sub(1),
                    None if forward => first,
                    None => end.saturating_sub(1),
                };
                self.jump(data, page, from, forward);
            }
            Action::SearchClear => {
                self.query.clear();
                self.current = None;
            }
            Action::StopRun => return self.ask_stop(data),
            Action::Confirm(yes) => {
                let Some(Confirm::Stop(id)) = self.confirm.take() else {
                    return None;
                };
                if yes {
                    data.set_status(Level::Info, format!("asking the daemon to stop run {id}…"));
                    return Some(Request::Stop(id));
                }
                data.set_status(Level::Info, format!("run {id} left running"));
            }
            Action::PauseRun => return self.pause(data),
            _ => {}
        }
        None
    }

    /// Forget the scroll and the current match (another run or stream is shown).
    fn reset_view(&mut self) {
        self.follow = true;
        self.top = 0;
        self.current = None;
    }

    fn shown(&self, data: &Data, page: usize) -> (u64, u64) {
        self.buffer(data).map_or((0, 0), |b| window(self, b, page))
    }

    /// Scroll by `by` lines; reaching the end follows it again.
    fn scroll(&mut self, data: &Data, page: usize, by: i64) {
        let Some(b) = self.buffer(data) else { return };
        let (first, _) = window(self, b, page);
        let last_top = b.end().saturating_sub(page as u64).max(b.start());
        let top = first.saturating_add_signed(by).clamp(b.start(), last_top);
        self.follow = by > 0 && top >= last_top;
        self.top = top;
    }

    /// Move to the match nearest `from` in a direction, scrolled to the middle of the screen.
    fn jump(&mut self, data: &mut Data, page: usize, from: u64, forward: bool) {
        let Some(b) = self.buffer(data) else { return };
        match b.find(&self.query, from, forward) {
            Some(line) => {
                let wrapped = match self.current {
                    Some(c) => (forward && line <= c) || (!forward && line >= c),
                    None => false,
                };
                self.current = Some(line);
                let (first, end) = window(self, b, page);
                // Stop following either way, so the match stays where it is as lines come.
                self.top = if (first..end).contains(&line) {
                    first
                } else {
                    line.saturating_sub(page as u64 / 2)
                };
                self.follow = false;
                if wrapped {
                    let end = if forward { "top" } else { "bottom" };
                    data.set_status(Level::Info, format!("search wrapped to the {end}"));
                }
            }
            None => {
                self.current = None;
                data.set_status(Level::Info, format!("no match for “{}”", self.query));
            }
        }
    }

    fn ask_stop(&mut self, data: &mut Data) -> Option<Request> {
        match self.current(data) {
            None => no_run(data, "stop"),
            Some(r) if r.is_final() => {
                let how = r.description.as_deref().unwrap_or(r.status.as_str());
                let msg = format!("run {} has already ended ({how})", r.id);
                data.set_status(Level::Info, msg);
            }
            Some(r) => self.confirm = Some(Confirm::Stop(r.id.clone())),
        }
        None
    }

    fn pause(&mut self, data: &mut Data) -> Option<Request> {
        let Some(r) = self.current(data) else {
            no_run(data, "pause");
            return None;
        };
        match r.status {
            RunStatus::Running => Some(Request::Pause(r.id.clone())),
            RunStatus::Paused => Some(Request::Resume(r.id.clone())),
            s => {
                let msg = format!("run {} is {}: only a running run pauses", r.id, s.as_str());
                data.set_status(Level::Error, msg);
                None
            }
        }
    }
}

fn no_run(data: &mut Data, what: &str) {
    let text = if data.link == Link::Local {
        NO_RUNS.to_string()
    } else {
        format!("no run to {what}: `gpupilot run -- CMD…` starts one")
    };
    data.set_status(Level::Info, text);
}
