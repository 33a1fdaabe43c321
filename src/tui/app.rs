//! The console's state and the one place it changes: [`App::apply`] carries out an
//! [`Action`]; keys become actions through the keymap, clicks and the wheel through the same
//! layout functions render uses. Each view keeps its own state type; `App` only holds them
//! together with the data, the keymap and the theme.

use super::action::{Action, ViewId};
use super::data::{Data, Level};
use super::feed::{Request, Update};
use super::keymap::{Key, Keymap};
use super::layout::{self, Areas};
use super::theme::Theme;
use super::views::Ctx;
use super::views::advisor::AdvisorState;
use super::views::detail::DetailState;
use super::views::events::{self, EventsState};
use super::views::help::HelpState;
use super::views::overview;
use super::views::power_dialog::{self, PowerDialog};
use super::views::run::tuner_panel::TunerUi;
use super::views::run::{self, state::RunState};
use crate::telemetry::Snapshot;
use crossterm::event::{KeyEvent, KeyEventKind, MouseButton, MouseEvent, MouseEventKind};
use ratatui::layout::{Position, Rect};
use std::time::Duration;

/// The whole console state.
#[derive(Debug, Clone)]
pub struct App {
    pub data: Data,
    pub keymap: Keymap,
    pub theme: Theme,
    pub view: ViewId,
    /// The GPU the overview highlights and the detail view shows (a position in the snapshot).
    pub selected: usize,
    pub detail: DetailState,
    pub run: RunState,
    pub events: EventsState,
    pub help: HelpState,
    /// The power-cap dialog (Overview and GPU detail), while open.
    pub power: Option<PowerDialog>,
    /// The advisor pane (see `views::advisor`, `app/advisor.rs`).
    pub advisor: AdvisorState,
    /// The console's energy tuner (see `views::run::tuner_panel`, `app/tuner.rs`).
    pub tuner: TunerUi,
    /// The size of the last frame: mouse positions are resolved against it.
    pub size: Rect,
    pub quit: bool,
    /// Set by `Redraw`: the loop clears the terminal once before the next frame.
    pub full_redraw: bool,
    /// Requests for the feed (stop a run, tail another), taken by the event loop.
    pub outbox: Vec<Request>,
}

impl App {
    pub fn new(keymap: Keymap, theme: Theme, refresh: Duration) -> App {
        App {
            data: Data::new(refresh),
            keymap,
            theme,
            view: ViewId::Overview,
            selected: 0,
            detail: DetailState::default(),
            run: RunState::default(),
            events: EventsState::default(),
            help: HelpState::default(),
            power: None,
            advisor: Default::default(),
            tuner: Default::default(),
            size: Rect::new(0, 0, 80, 24),
            quit: false,
            full_redraw: false,
            outbox: Vec::new(),
        }
    }

    /// What the views may read besides their own state.
    pub fn ctx(&self) -> Ctx<'_> {
        Ctx {
            data: &self.data,
            theme: &self.theme,
            keymap: &self.keymap,
        }
    }

    /// Where the parts of a frame of `area` go now (the footer grows for a long error).
    pub fn areas(&self, area: Rect) -> Areas {
        Areas::of(
            area,
            layout::footer_height(self.modal(), &self.data, area.width),
        )
    }

    pub fn on_snapshot(&mut self, snap: Snapshot) {
        self.data.on_snapshot(snap);
        self.clamp_selection();
    }

    /// Take in an update from the feed.
    pub fn on_update(&mut self, u: Update) {
        let runs = matches!(u, Update::Runs(_));
        run::knob_dialog::on_update(&mut self.run, &u);
        let knob_waits = advisor::on_update(self, &u);
        tuner::on_update(self, &u);
        self.data.on_update(u);
        self.clamp_selection();
        if runs {
            self.run.on_runs(&self.data);
        }
        self.watch_current_run();
        if knob_waits {
            advisor::after_update(self);
        }
    }

    /// The requests made since the last call, oldest first.
    pub fn take_requests(&mut self) -> Vec<Request> {
        std::mem::take(&mut self.outbox)
    }

    /// Ask the feed for the shown run's log when the shown run changed.
    fn watch_current_run(&mut self) {
        let Some(id) = self.run.current(&self.data).map(|r| r.id.clone()) else {
            return;
        };
        if self.run.watching.as_ref() != Some(&id) {
            self.run.watching = Some(id.clone());
            self.outbox.push(Request::Watch(id));
        }
    }

    /// The action a key runs in the current view, if any. While the footer asks something
    /// (a search being typed, a y/n question) every key goes to it.
    pub fn action_for_key(&self, ev: &KeyEvent) -> Option<Action> {
        if ev.kind == KeyEventKind::Release {
            return None;
        }
        if let Some(d) = &self.run.dialog {
            return d.action_for_key(ev);
        }
        if let Some(d) = &self.power {
            return d.action_for_key(ev);
        }
        if self.tuner.ask.is_some() {
            return Some(crate::tui::dialog::yes_no_key(ev));
        }
        if self.advisor.open && self.run.confirm.is_none() {
            let mapped = self.keymap.lookup(self.view, false, Key::from_event(ev));
            return self
                .advisor
                .action_for_key(ev, mapped == Some(Action::Advisor));
        }
        if self.run.confirm.is_some() {
            return Some(crate::tui::dialog::yes_no_key(ev));
        }
        if self.run.prompt.is_some() {
            return crate::tui::dialog::field_key(ev);
        }
        if self.events.open.is_some() && self.view == ViewId::Events && !self.help.open {
            return events::detail_key(ev);
        }
        self.keymap
            .lookup(self.view, self.help.open, Key::from_event(ev))
    }

    /// The action a mouse event asks for: a click on a tab switches views, a click on a GPU
    /// selects it, the wheel scrolls what is under it.
    pub fn action_for_mouse(&self, ev: &MouseEvent) -> Option<Action> {
        let at = Position::new(ev.column, ev.row);
        let areas = self.areas(self.size);
        if self.advisor.open {
            return match ev.kind {
                MouseEventKind::ScrollDown => Some(Action::ScrollDown),
                MouseEventKind::ScrollUp => Some(Action::ScrollUp),
                _ => None,
            };
        }
        match ev.kind {
            MouseEventKind::ScrollDown | MouseEventKind::ScrollUp => {
                let down = ev.kind == MouseEventKind::ScrollDown;
                Some(match (self.help.open, self.view) {
                    (true, _) | (false, ViewId::Detail | ViewId::Run | ViewId::Events) => {
                        if down {
                            Action::ScrollDown
                        } else {
                            Action::ScrollUp
                        }
                    }
                    _ if down => Action::NextGpu,
                    _ => Action::PrevGpu,
                })
            }
            MouseEventKind::Down(MouseButton::Left) if !self.help.open => {
                if areas.tabs.contains(at) {
                    return layout::tab_at(&self.keymap, areas.tabs, at.x).map(Action::ShowView);
                }
                if self.view == ViewId::Overview && areas.body.contains(at) {
                    let layout =
                        overview::Layout::new(areas.body, self.data.gpus().len(), self.selected);
                    return layout.gpu_at(at).map(Action::SelectGpu);
                }
                None
            }
            _ => None,
        }
    }

    /// Whether a recording plays (nothing here changes a node then).
    pub fn replaying(&self) -> bool {
        matches!(self.data.link, super::feed::Link::Replay { .. })
    }

    /// Carry out one action.
    pub fn apply(&mut self, action: Action) {
        let n = self.data.gpus().len();
        if self.replaying() && action.changes_the_node() {
            self.data
                .set_status(Level::Error, super::feed::replay::REFUSED);
            return;
        }
        match action {
            Action::Quit => self.quit = true,
            Action::Help => {
                self.help.open = true;
                self.help.scroll = 0;
            }
            Action::Close if !self.help.open && self.events.open.is_some() => {
                self.events.open = None
            }
            Action::Close => self.help.open = false,
            Action::Redraw => self.full_redraw = true,
            Action::NextView => self.view = self.view.cycle(1),
            Action::PrevView => self.view = self.view.cycle(-1),
            Action::ShowView(v) => self.view = v,
            Action::NextGpu if n > 0 => self.select((self.selected + 1).min(n - 1)),
            Action::PrevGpu => self.select(self.selected.saturating_sub(1)),
            Action::FirstGpu => self.select(0),
            Action::LastGpu => self.select(n.saturating_sub(1)),
            Action::SelectGpu(i) if i < n => self.select(i),
            Action::ZoomIn | Action::ZoomOut => {
                let w = &mut self.detail.window;
                *w = if action == Action::ZoomIn {
                    w.shorter()
                } else {
                    w.longer()
                };
                if self.view != ViewId::Detail {
                    // The window is the GPU detail's: say so where it is not in sight.
                    let key = self
                        .keymap
                        .view_key(ViewId::Detail)
                        .map_or_else(String::new, |k| format!(" ({k} shows them)"));
                    let msg = format!(
                        "the GPU detail's charts now cover the last {}{key}",
                        self.detail.window.label()
                    );
                    self.data.set_status(Level::Info, msg);
                }
            }
            Action::ScrollUp if self.help.open => {
                self.help.scroll = self.help.scroll.saturating_sub(1)
            }
            Action::ScrollDown if self.help.open => {
                self.help.scroll = self.help.scroll.saturating_add(1)
            }
            Action::Advisor => advisor::toggle(self),
            Action::ReplayPause if self.replaying() => self.outbox.push(Request::ReplayPause),
            Action::ReplaySeek(s) if self.replaying() => self.outbox.push(Request::ReplaySeek(s)),
            Action::ReplayPause | Action::ReplaySeek(_) => self.data.set_status(
                Level::Info,
                "pause and seek move through a recording: `gpupilot replay FILE`",
            ),
            Action::Confirm(yes) if self.tuner.ask.is_some() => tuner::answer(self, yes),
            a if self.advisor.open && !self.modal_besides_advisor() && AdvisorState::handles(a) => {
                advisor::apply(self, a)
            }
            Action::TuneEnergy if self.view == ViewId::Run => tuner::key(self),
            Action::SetKnob(k) if self.view == ViewId::Run => {
                run::knob_dialog::open(&mut self.run, &mut self.data, k)
            }
            a if self.run.dialog.is_some() && run::knob_dialog::KnobDialog::handles(a) => {
                if let Some(r) = run::knob_dialog::apply(&mut self.run, &mut self.data, a) {
                    self.outbox.push(r);
                }
            }
            Action::PowerCap if matches!(self.view, ViewId::Overview | ViewId::Detail) => {
                self.power = power_dialog::open(&mut self.data, self.selected)
            }
            Action::PowerCap if self.view == ViewId::Run => {
                let target = self
                    .run
                    .current(&self.data)
                    .map(|r| run::knobs_row::cap_target(&self.data, r, self.selected));
                match target {
                    Some(Some(at)) => self.power = power_dialog::open(&mut self.data, at),
                    Some(None) => self.data.set_status(
                        Level::Info,
                        "the run uses no GPU this node reports: cap one from the overview",
                    ),
                    None => self.data.set_status(Level::Info, "no run shown to cap"),
                }
            }
            a if self.power.is_some() && PowerDialog::handles(a) => {
                if let Some(r) = power_dialog::apply(&mut self.power, &mut self.data, a) {
                    self.outbox.push(r);
                }
            }
            a if a.for_run_view() && (self.view == ViewId::Run || self.modal()) => {
                let body = self.areas(self.size).body;
                let page = match self.run.current(&self.data) {
                    Some(r) => run::Layout::of(body, &self.data, r),
                    None => run::Layout::new(body, self.data.run_list().len()),
                }
                .log_rows();
                if let Some(r) = self.run.apply(a, &mut self.data, page) {
                    self.outbox.push(r);
                }
                self.watch_current_run();
            }
            Action::EventOpen if self.view == ViewId::Events => {
                self.events.open_selected(&self.data.events)
            }
            a @ (Action::ScrollUp
            | Action::ScrollDown
            | Action::PageUp
            | Action::PageDown
            | Action::Top
            | Action::Bottom)
                if self.view == ViewId::Events =>
            {
                let body = self.areas(self.size).body;
                let n = self.data.events.len();
                self.events.apply(a, n, events::page_rows(body));
            }
            Action::ScrollUp => {
                self.detail.process_scroll = self.detail.process_scroll.saturating_sub(1)
            }
            Action::ScrollDown => {
                self.detail.process_scroll = self.detail.process_scroll.saturating_add(1)
            }
            // Nothing here takes it: a guard above did not hold (no GPU to select, a key of
            // another view, a dialog that is not open), or it does nothing (noop).
            _ => {}
        }
    }

    /// The footer is asking something: keys go to it whatever the view.
    pub fn modal(&self) -> bool {
        self.modal_besides_advisor() || self.advisor.open
    }

    /// A question or dialog is open (the advisor pane aside).
    fn modal_besides_advisor(&self) -> bool {
        self.run.prompt.is_some()
            || self.run.confirm.is_some()
            || self.run.dialog.is_some()
            || self.power.is_some()
            || self.tuner.ask.is_some()
    }

    fn select(&mut self, i: usize) {
        if i != self.selected {
            self.selected = i;
            self.detail.process_scroll = 0;
        }
    }

    fn clamp_selection(&mut self) {
        let n = self.data.gpus().len();
        if n > 0 && self.selected >= n {
            self.selected = n - 1;
        }
    }
}

mod advisor;
#[cfg(test)]
pub(crate) mod run_tests;
mod tuner;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::GpuSample;
    use crossterm::event::{KeyCode, KeyModifiers};

    fn app_with(n: usize) -> App {
        let mut app = App::new(Keymap::defaults(), Theme::default(), Duration::from_secs(1));
        app.on_snapshot(Snapshot {
            time_s: 1.0,
            gpus: (0..n)
                .map(|i| GpuSample {
                    index: i as u32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        app
    }

    fn press(app: &mut App, code: KeyCode) {
        let ev = KeyEvent::new(code, KeyModifiers::NONE);
        if let Some(a) = app.action_for_key(&ev) {
            app.apply(a);
        }
    }

    #[test]
    fn keys_move_the_selection_within_bounds() {
        let mut app = app_with(3);
        press(&mut app, KeyCode::Char('k'));
        assert_eq!(app.selected, 0);
        for _ in 0..5 {
            press(&mut app, KeyCode::Char('j'));
        }
        assert_eq!(app.selected, 2);
        press(&mut app, KeyCode::Char('g'));
        assert_eq!(app.selected, 0);
        press(&mut app, KeyCode::End);
        assert_eq!(app.selected, 2);
    }

    #[test]
    fn views_help_and_quit() {
        let mut app = app_with(2);
        press(&mut app, KeyCode::Tab);
        assert_eq!(app.view, ViewId::Detail);
        press(&mut app, KeyCode::Char('4'));
        assert_eq!(app.view, ViewId::Events);
        press(&mut app, KeyCode::Char('1'));
        press(&mut app, KeyCode::Enter);
        assert_eq!(app.view, ViewId::Detail);
        press(&mut app, KeyCode::Esc);
        assert_eq!(app.view, ViewId::Overview);
        press(&mut app, KeyCode::Char('?'));
        assert!(app.help.open);
        press(&mut app, KeyCode::Char('q'));
        assert!(!app.help.open && !app.quit, "q in help closes the help");
        press(&mut app, KeyCode::Char('q'));
        assert!(app.quit);
    }

    #[test]
    fn zoom_walks_the_windows() {
        let mut app = app_with(1);
        assert_eq!(app.detail.window.label(), "1m");
        press(&mut app, KeyCode::Char('-'));
        press(&mut app, KeyCode::Char('-'));
        assert_eq!(app.detail.window.label(), "1h");
        for _ in 0..5 {
            press(&mut app, KeyCode::Char('-'));
        }
        assert_eq!(app.detail.window.label(), "7d");
        press(&mut app, KeyCode::Char('+'));
        assert_eq!(app.detail.window.label(), "24h");
    }

    #[test]
    fn clicks_select_gpus_and_tabs() {
        let mut app = app_with(4);
        app.size = Rect::new(0, 0, 200, 50);
        let areas = app.areas(app.size);
        let layout = overview::Layout::new(areas.body, 4, 0);
        let cell = layout.cells.iter().find(|c| c.gpu == 2).unwrap().area;
        let click = |x, y| MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column: x,
            row: y,
            modifiers: KeyModifiers::NONE,
        };
        let a = app.action_for_mouse(&click(cell.x + 3, cell.y + 1));
        assert_eq!(a, Some(Action::SelectGpu(2)));
        app.apply(a.unwrap());
        assert_eq!(app.selected, 2);

        let x = (0..200)
            .find(|&x| layout::tab_at(&app.keymap, areas.tabs, x) == Some(ViewId::Run))
            .unwrap();
        assert_eq!(
            app.action_for_mouse(&click(x, areas.tabs.y)),
            Some(Action::ShowView(ViewId::Run))
        );

        let wheel = MouseEvent {
            kind: MouseEventKind::ScrollDown,
            ..click(0, 10)
        };
        app.apply(app.action_for_mouse(&wheel).unwrap());
        assert_eq!(app.selected, 3);
    }
}
