//! What the user can ask the console to do. Keys map to these through the keymap; mouse
//! events map to them in `app`. Nothing here does anything: `App::apply` carries them out.

use crate::protocol::KnobName;

/// A replay's seek step, seconds of recorded time (`replay_back`, `replay_forward`).
pub const SEEK_S: i32 = 10;
use std::fmt;
use std::str::FromStr;

/// The views, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ViewId {
    #[default]
    Overview,
    Detail,
    Run,
    Events,
    Topology,
}

impl ViewId {
    pub const ALL: [ViewId; 5] = [
        ViewId::Overview,
        ViewId::Detail,
        ViewId::Run,
        ViewId::Events,
        ViewId::Topology,
    ];

    /// The name used in keymaps (`view detail`).
    pub fn key(self) -> &'static str {
        match self {
            ViewId::Overview => "overview",
            ViewId::Detail => "detail",
            ViewId::Run => "run",
            ViewId::Events => "events",
            ViewId::Topology => "topology",
        }
    }

    /// The title on its tab.
    pub fn title(self) -> &'static str {
        match self {
            ViewId::Overview => "Overview",
            ViewId::Detail => "GPU detail",
            ViewId::Run => "Run",
            ViewId::Events => "Events",
            ViewId::Topology => "Topology",
        }
    }

    pub fn position(self) -> usize {
        ViewId::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }

    /// The next view in tab order (`step` = 1 or -1), wrapping.
    pub fn cycle(self, step: isize) -> ViewId {
        let n = ViewId::ALL.len() as isize;
        ViewId::ALL[(self.position() as isize + step).rem_euclid(n) as usize]
    }
}

/// Everything a key, a click or the wheel can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Quit,
    /// Open the help screen.
    Help,
    /// Close whatever overlay is open (the help).
    Close,
    /// Clear the terminal and draw everything again (after a tmux reattach or line noise).
    Redraw,
    NextView,
    PrevView,
    ShowView(ViewId),
    NextGpu,
    PrevGpu,
    FirstGpu,
    LastGpu,
    /// Select a GPU by position (mouse click).
    SelectGpu(usize),
    /// A shorter chart window.
    ZoomIn,
    /// A longer chart window.
    ZoomOut,
    ScrollUp,
    ScrollDown,
    /// A page up or down (the run's log, the events).
    PageUp,
    PageDown,
    /// The start or the end (the end of a log also turns following on).
    Top,
    Bottom,
    /// Select the next or previous run in the run list.
    RunNext,
    RunPrev,
    /// Show the selected run's page.
    RunOpen,
    /// Open the selected event's detail (the Events view): who, what, why, the numbers, the
    /// command that undoes it.
    EventOpen,
    /// Start typing a search in the log.
    Search,
    /// The next (newer) or previous (older) match of the search.
    SearchNext,
    SearchPrev,
    /// Forget the search.
    SearchClear,
    /// Follow the log's end (tail) on or off.
    Follow,
    /// Show the run's stderr instead of its stdout, or back.
    LogStream,
    /// Stop the run shown (asks y/n first).
    StopRun,
    /// Pause the run shown, or resume it.
    PauseRun,
    /// Open the dialog that changes a knob of the run shown (`set_knob batch_size`).
    SetKnob(KnobName),
    /// Open the dialog that sets the selected GPU's power cap (Overview, GPU detail).
    PowerCap,
    /// Open the advisor pane over the view, or close it.
    Advisor,
    /// Act on the advisor's hint at this position (Enter or its number in the pane; not in
    /// keymaps).
    HintAct(usize),
    /// Start the energy tuner on the run shown (asks y/n), stop it, or close its result.
    TuneEnergy,
    /// A character typed into the footer prompt (the search), and the prompt's keys. Not in
    /// keymaps: while a prompt is open every key goes to it.
    PromptChar(char),
    PromptBackspace,
    PromptSubmit,
    PromptCancel,
    /// The answer to a y/n question in the footer.
    Confirm(bool),
    /// A replay: pause the recording's clock, or play on.
    ReplayPause,
    /// A replay: this many seconds of recorded time on, or back (`replay_forward`,
    /// `replay_back`: 10 s).
    ReplaySeek(i32),
    /// Does nothing: a user keymap binds a key to it to unbind a default.
    Noop,
}

impl Action {
    /// Whether the Run view's state carries it out (in the Run view, or whatever the view while
    /// the footer asks something): its run list, its log (scrolling, following, the stream, the
    /// search and its prompt), stopping and pausing the run, and the y/n question it asks. One
    /// match without a wildcard, so a new action has to say; what it does not take, the other
    /// views, the dialogs and the console do, or nothing.
    pub fn for_run_view(self) -> bool {
        match self {
            Action::ScrollUp
            | Action::ScrollDown
            | Action::PageUp
            | Action::PageDown
            | Action::Top
            | Action::Bottom
            | Action::RunNext
            | Action::RunPrev
            | Action::RunOpen
            | Action::Search
            | Action::SearchNext
            | Action::SearchPrev
            | Action::SearchClear
            | Action::Follow
            | Action::LogStream
            | Action::StopRun
            | Action::PauseRun
            | Action::PromptChar(_)
            | Action::PromptBackspace
            | Action::PromptSubmit
            | Action::PromptCancel
            | Action::Confirm(_) => true,
            Action::Quit
            | Action::Help
            | Action::Close
            | Action::Redraw
            | Action::NextView
            | Action::PrevView
            | Action::ShowView(_)
            | Action::NextGpu
            | Action::PrevGpu
            | Action::FirstGpu
            | Action::LastGpu
            | Action::SelectGpu(_)
            | Action::ZoomIn
            | Action::ZoomOut
            | Action::SetKnob(_)
            | Action::PowerCap
            | Action::Advisor
            | Action::HintAct(_)
            | Action::TuneEnergy
            | Action::EventOpen
            | Action::ReplayPause
            | Action::ReplaySeek(_)
            | Action::Noop => false,
        }
    }
}

impl Action {
    /// Whether it asks the node for a change (a run stopped or paused, a knob, a power cap, the
    /// tuner, an advisor hint's action): refused while a recording plays.
    pub fn changes_the_node(self) -> bool {
        matches!(
            self,
            Action::StopRun
                | Action::PauseRun
                | Action::SetKnob(_)
                | Action::PowerCap
                | Action::TuneEnergy
                | Action::HintAct(_)
        )
    }
}

/// An action name in a keymap that means nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown action {0:?}: one of quit, help, close, redraw, view_next, view_prev, view overview|detail|run|events, gpu_next, gpu_prev, gpu_first, gpu_last, zoom_in, zoom_out, scroll_up, scroll_down, page_up, page_down, top, bottom, run_next, run_prev, run_open, event_open, search, search_next, search_prev, search_clear, follow, log_stream, stop_run, pause_run, set_knob batch_size|prefetch, power_cap, advisor, tune_energy, replay_pause, replay_back, replay_forward, noop"
)]
pub struct UnknownAction(pub String);

impl FromStr for Action {
    type Err = UnknownAction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let words: Vec<&str> = s.split_whitespace().collect();
        let a = match words.as_slice() {
            ["quit"] => Action::Quit,
            ["help"] => Action::Help,
            ["close"] => Action::Close,
            ["redraw"] => Action::Redraw,
            ["view_next"] => Action::NextView,
            ["view_prev"] => Action::PrevView,
            ["view", v] => Action::ShowView(
                ViewId::ALL
                    .into_iter()
                    .find(|id| id.key() == *v)
                    .ok_or_else(|| UnknownAction(s.to_string()))?,
            ),
            ["gpu_next"] => Action::NextGpu,
            ["gpu_prev"] => Action::PrevGpu,
            ["gpu_first"] => Action::FirstGpu,
            ["gpu_last"] => Action::LastGpu,
            ["zoom_in"] => Action::ZoomIn,
            ["zoom_out"] => Action::ZoomOut,
            ["scroll_up"] => Action::ScrollUp,
            ["scroll_down"] => Action::ScrollDown,
            ["page_up"] => Action::PageUp,
            ["page_down"] => Action::PageDown,
            ["top"] => Action::Top,
            ["bottom"] => Action::Bottom,
            ["run_next"] => Action::RunNext,
            ["run_prev"] => Action::RunPrev,
            ["run_open"] => Action::RunOpen,
            ["event_open"] => Action::EventOpen,
            ["search"] => Action::Search,
            ["search_next"] => Action::SearchNext,
            ["search_prev"] => Action::SearchPrev,
            ["search_clear"] => Action::SearchClear,
            ["follow"] => Action::Follow,
            ["log_stream"] => Action::LogStream,
            ["stop_run"] => Action::StopRun,
            ["pause_run"] => Action::PauseRun,
            ["set_knob", k] => {
                Action::SetKnob(KnobName::parse(k).ok_or_else(|| UnknownAction(s.to_string()))?)
            }
            ["power_cap"] => Action::PowerCap,
            ["advisor"] => Action::Advisor,
            ["tune_energy"] => Action::TuneEnergy,
            ["replay_pause"] => Action::ReplayPause,
            ["replay_back"] => Action::ReplaySeek(-SEEK_S),
            ["replay_forward"] => Action::ReplaySeek(SEEK_S),
            ["noop"] => Action::Noop,
            _ => return Err(UnknownAction(s.to_string())),
        };
        Ok(a)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Action::Quit => "quit",
            Action::Help => "help",
            Action::Close => "close",
            Action::Redraw => "redraw",
            Action::NextView => "view_next",
            Action::PrevView => "view_prev",
            Action::ShowView(v) => return write!(f, "view {}", v.key()),
            Action::NextGpu => "gpu_next",
            Action::PrevGpu => "gpu_prev",
            Action::FirstGpu => "gpu_first",
            Action::LastGpu => "gpu_last",
            Action::SelectGpu(i) => return write!(f, "gpu {i}"),
            Action::ZoomIn => "zoom_in",
            Action::ZoomOut => "zoom_out",
            Action::ScrollUp => "scroll_up",
            Action::ScrollDown => "scroll_down",
            Action::PageUp => "page_up",
            Action::PageDown => "page_down",
            Action::Top => "top",
            Action::Bottom => "bottom",
            Action::RunNext => "run_next",
            Action::RunPrev => "run_prev",
            Action::RunOpen => "run_open",
            Action::EventOpen => "event_open",
            Action::Search => "search",
            Action::SearchNext => "search_next",
            Action::SearchPrev => "search_prev",
            Action::SearchClear => "search_clear",
            Action::Follow => "follow",
            Action::LogStream => "log_stream",
            Action::StopRun => "stop_run",
            Action::PauseRun => "pause_run",
            Action::SetKnob(k) => return write!(f, "set_knob {k}"),
            Action::PowerCap => "power_cap",
            Action::Advisor => "advisor",
            Action::HintAct(i) => return write!(f, "hint {i}"),
            Action::TuneEnergy => "tune_energy",
            Action::PromptChar(c) => return write!(f, "prompt_char {c:?}"),
            Action::PromptBackspace => "prompt_backspace",
            Action::PromptSubmit => "prompt_submit",
            Action::PromptCancel => "prompt_cancel",
            Action::Confirm(yes) => return write!(f, "confirm {yes}"),
            Action::ReplayPause => "replay_pause",
            Action::ReplaySeek(s) if *s == -SEEK_S => "replay_back",
            Action::ReplaySeek(s) if *s == SEEK_S => "replay_forward",
            Action::ReplaySeek(s) => return write!(f, "replay_seek {s}"),
            Action::Noop => "noop",
        };
        f.write_str(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in [
            Action::Quit,
            Action::ShowView(ViewId::Events),
            Action::NextView,
            Action::ZoomOut,
            Action::Search,
            Action::StopRun,
            Action::PageDown,
            Action::SetKnob(KnobName::BatchSize),
            Action::SetKnob(KnobName::Prefetch),
            Action::PowerCap,
            Action::Advisor,
            Action::TuneEnergy,
            Action::EventOpen,
            Action::ReplayPause,
            Action::ReplaySeek(-SEEK_S),
            Action::ReplaySeek(SEEK_S),
            Action::Noop,
        ] {
            assert_eq!(a.to_string().parse::<Action>(), Ok(a));
        }
        assert!("view nowhere".parse::<Action>().is_err());
        assert!("set_knob lr".parse::<Action>().is_err());
        assert_eq!(
            "set_knob batch-size".parse::<Action>(),
            Ok(Action::SetKnob(KnobName::BatchSize))
        );
        assert!(
            "fly"
                .parse::<Action>()
                .unwrap_err()
                .to_string()
                .contains("unknown action \"fly\"")
        );
    }

    #[test]
    fn views_cycle() {
        assert_eq!(ViewId::Overview.cycle(1), ViewId::Detail);
        assert_eq!(ViewId::Overview.cycle(-1), ViewId::Topology);
        assert_eq!(ViewId::Events.cycle(1), ViewId::Topology);
        assert_eq!(ViewId::Topology.cycle(1), ViewId::Overview);
    }
}
