//! The terminal console: live per-GPU gauges and charts, light enough for an SSH session.
//!
//! Layout, bottom to top: each module uses only those listed before it (parent ↔ child inside
//! one is fine), as `layers_tests.rs` checks.
//! - Leaves: [`action`], the one `Action` enum, and [`keymap`], keys to actions (defaults from
//!   `keymap-default.toml`, a user file merged over them); [`theme`], the colour themes
//!   (presets from `themes/`, user files merged over them); [`format`](mod@format), compact
//!   numbers (`N/A` for absent); [`log`], a run's log as lines, cleaned for a terminal, with
//!   search;
//!   [`metrics`], the shown run's training metrics, knobs, and the changes its charts mark;
//!   [`control`], the control loops' status in words; [`tty`], the terminal's size and input;
//!   [`ansi`], the backend that writes each frame in as few bytes as it can.
//! - [`feed`]: where data comes from, on threads of their own: an in-process sampler (the
//!   demo) or a client of the daemon (everything else). Both send the same [`feed::Update`]s,
//!   and the messages they carry live with the feed that produces them; the app asks for what
//!   needs the daemon with [`feed::Request`]s.
//! - [`data`]: what the views read: snapshot, history, runs, the shown run's log, events,
//!   the link to the daemon, frame time and status.
//! - [`widgets`]: gauges, sparklines, badges, `centered`; [`layout`]: where the frame's parts
//!   go, for render and for clicks; [`dialog`]: small modal dialogs and the number step the
//!   power-cap and knob dialogs share.
//! - [`views`]: each view's own state and its drawing, from that state and a narrow context
//!   (the data, the theme, the keymap); drawing changes nothing. A view's key handling (the
//!   Run view's and the Events list's `apply`, the knob and power-cap dialogs' `open` and
//!   `apply`) changes its own state and, through `&mut Data`, only the footer's message
//!   ([`data::Data::set_status`]), and returns the request for the feed, if any; `App::apply`
//!   alone calls it. No I/O, no locks.
//! - [`app`]: the state (`App`, holding each view's own state) and `App::apply`, the only place
//!   it changes (with `app/advisor.rs` and `app/tuner.rs` for the advisor pane and the tuner,
//!   and the views' key handling it calls).
//! - [`ui`]: the frame, drawn from the App; [`screen`]: the terminal's frames, redrawing only
//!   what changed; [`event_loop`]: input, updates and a tick on one tokio task; draws once per
//!   burst of events, capped at 20 frames per second.
//!
//! Data flows one way: daemon → subscription and polls (feed thread) → updates → app state →
//! render. Nothing is printed to stdout while the console owns the terminal, and the terminal
//! is restored on quit and on panic. Quitting the console ends the feed; the daemon and its
//! runs go on.

pub mod action;
pub mod ansi;
pub mod app;
pub mod control;
pub mod data;
pub mod dialog;
pub mod event_loop;
pub mod feed;
pub mod format;
pub mod keymap;
pub mod layout;
pub mod log;
pub mod metrics;
pub mod screen;
pub mod theme;
pub mod tty;
pub mod ui;
pub mod views;
pub mod widgets;

pub use action::{Action, ViewId};
pub use app::App;

use crate::config::Paths;
use crate::config::theme::{choose, no_color_env};
use anyhow::Context as _;
use crossterm::event::{DisableMouseCapture, EnableMouseCapture};
use crossterm::execute;
use data::Level;
pub use feed::DataSource;
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::time::Duration;
use views::run::state::RunState;

/// What the console shows and how.
pub struct TuiOptions {
    /// Where data comes from: an in-process sampler (demo) or the daemon.
    pub source: DataSource,
    /// Theme name from `--theme` (None: `NO_COLOR` → mono, else the default).
    pub theme: Option<String>,
    /// Redraw interval (and the demo's sampling interval).
    pub refresh: Duration,
    /// Open on this run's Run view (a full run id).
    pub open_run: Option<String>,
}

/// Build the app the console starts with: theme and keymap from the config directory (the
/// presets on error, with the error in the footer).
pub fn build_app(theme_flag: Option<&str>, refresh: Duration, paths: &Paths, now: f64) -> App {
    let name = choose(theme_flag, no_color_env());
    let (theme, theme_err) = theme::load(&name, &paths.config.join("themes"));
    let (keymap, keymap_err) = keymap::load(&paths.config);
    let mut app = App::new(keymap, theme, refresh);
    app.data.now = now;
    let mut errors = Vec::new();
    if let Some(e) = theme_err {
        errors.push(format!("theme: {e} (using {})", app.theme.name));
    }
    if let Some(e) = keymap_err {
        errors.push(format!("keymap: {e} (using the defaults)"));
    }
    if !errors.is_empty() {
        let mut msg = errors.join("; ");
        if let Some(home) = std::env::var_os("HOME").filter(|h| h.len() > 1) {
            msg = msg.replace(&*home.to_string_lossy(), "~");
        }
        app.data.set_status(Level::Error, msg);
    }
    app
}

/// Whether the console can run here: stdin and stdout are terminals.
pub fn on_terminal() -> bool {
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// Resolves on SIGHUP or SIGTERM (never, if the handlers cannot be installed).
async fn ended_by_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::hangup()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut hup), Ok(mut term)) => {
            tokio::select! {
                _ = hup.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

/// An error unless stdout is a terminal the console can draw on: checked by [`run`], and
/// before that by whoever would start something for the console to show.
pub fn need_terminal() -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "the console needs a terminal: stdout is not one (for a one-shot report use `gpupilot status`)"
        );
    }
    Ok(())
}

/// Run the console until the user quits (or the terminal goes away, or SIGTERM).
pub fn run(opts: TuiOptions) -> anyhow::Result<()> {
    need_terminal()?;
    // A replay's frames go by the recording's clock.
    let clock = opts.source.clock();
    let mut app = build_app(
        opts.theme.as_deref(),
        opts.refresh,
        &Paths::from_env(),
        clock(),
    );
    if let Some(id) = opts.open_run {
        app.run = RunState::opened(id);
        app.view = ViewId::Run;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        // Signals (SIGHUP, SIGTERM) go through the I/O driver.
        .enable_io()
        .build()
        .context("starting the console's event loop")?;

    // The console's own copy of the terminal's output, for its frames (see `out` below).
    let tty_out = std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .context("the terminal's output")?;
    // What prints a panic, before ratatui puts its own hook in front of it.
    let print_panic = std::panic::take_hook();
    // ratatui sets the terminal up (raw mode, the alternate screen); the console draws through
    // a backend that learns the size from resize events.
    if let Err(e) = ratatui::try_init() {
        // Raw mode may be on already: give the shell its terminal back before saying why.
        let _ = ratatui::try_restore();
        std::panic::set_hook(print_panic);
        return Err(e).context("taking over the terminal");
    }
    let size = tty::KnownSize::default();
    // Each frame goes out in one write: stdout's own buffer holds 1 KiB, and a frame drawn
    // whole is ten times that. (The backend flushes at the end of every frame.) Through a copy
    // of its descriptor, not `Stdout`, whose line buffer writes a frame up to its last line
    // feed and then the rest: two writes a frame, as the backend moves down with a line feed.
    let out = std::io::BufWriter::with_capacity(64 << 10, std::fs::File::from(tty_out));
    let backend = tty::SizedBackend::new(ansi::AnsiBackend::new(out, size.clone()), size.clone());
    let mut terminal = screen::Screen::new(backend);
    // A panic gives the terminal back (mouse reporting too, or the shell is flooded with
    // escape codes), then is printed. Not through ratatui's own hook: it says a restore that
    // failed with `eprintln!`, which panics when the terminal has gone (a dropped SSH
    // session), and a panic in a panic hook aborts, skipping every clean-up on the way out.
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| {
        let _ = execute!(std::io::stdout(), DisableMouseCapture);
        let _ = ratatui::try_restore();
        print_panic(info);
    }));
    let _ = execute!(std::io::stdout(), EnableMouseCapture);

    let result = (|| -> anyhow::Result<()> {
        // A first frame at once, before the first sample (which may take a period).
        app.size = terminal.draw(&app)?;
        let feed = opts.source.start_on(opts.refresh, rt.handle());
        let requests = feed.requests.clone();
        rt.block_on(event_loop::run(
            &mut terminal,
            &mut app,
            feed.updates,
            // A dropped SSH session (SIGHUP) or SIGTERM ends the console as quitting does, so
            // what it holds is let go on the way out (a running tuner puts its caps back).
            futures::StreamExt::take_until(tty::input(size), Box::pin(ended_by_signal())),
            &*clock,
            opts.refresh,
            |r| {
                let _ = requests.send(r);
            },
        ))?;
        Ok(())
    })();

    // Quietly: when the terminal has gone there is nothing to restore and no one to tell, and
    // the way out must go on (the demo stops its node, a tuner puts its caps back).
    let _ = execute!(std::io::stdout(), DisableMouseCapture);
    let _ = ratatui::try_restore();
    result
}

#[cfg(test)]
mod layers_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_user_files_fall_back_and_say_why_in_the_footer() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths {
            config: dir.path().join("config"),
            state: dir.path().join("state"),
            runtime: dir.path().join("run"),
        };
        let good = build_app(Some("light"), Duration::from_secs(1), &paths, 10.0);
        assert_eq!(good.theme.name, "light");
        assert!(good.data.visible_status().is_none());

        std::fs::create_dir_all(paths.config.join("themes")).unwrap();
        std::fs::write(
            paths.config.join("themes/light.toml"),
            "[title]\nbold = \"yes\"\n",
        )
        .unwrap();
        std::fs::write(
            paths.config.join("keymap.toml"),
            "[[global]]\non = \"q\"\nrun = \"fly\"\n",
        )
        .unwrap();
        let app = build_app(Some("light"), Duration::from_secs(1), &paths, 10.0);
        assert_eq!(
            app.theme,
            theme::preset("light").unwrap().resolve("light"),
            "the preset, unchanged"
        );
        assert_eq!(app.keymap, keymap::Keymap::defaults());
        let status = app.data.visible_status().expect("an error in the footer");
        assert_eq!(status.level, Level::Error);
        assert!(
            status.text.contains("light.toml: line 2, column 8"),
            "{}",
            status.text
        );
        assert!(
            status
                .text
                .contains("keymap.toml: line 3, column 7: unknown action \"fly\""),
            "{}",
            status.text
        );
    }
}
