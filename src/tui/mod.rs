//! The terminal console: live per-GPU gauges and charts, light enough for an SSH session.
//!
//! Layout:
//! - [`action`]: the one `Action` enum; keys map to actions through `config::keymap`.
//! - [`app`]: the state (`App`, holding each view's own state) and `App::apply`, the only place
//!   it changes.
//! - [`data`]: the snapshot, history, frame time and status the views read.
//! - [`ui`] and [`views`]: render. They borrow the app and change nothing; no I/O, no locks.
//! - [`widgets`], [`format`]: gauges, sparklines, badges, compact numbers (`N/A` for absent).
//! - [`event_loop`]: input, snapshots and a tick on one tokio task; draws once per burst of
//!   events, capped at 20 frames per second.
//!
//! Samplers run on their own threads (`telemetry::Sampler`) and never block drawing. Nothing is
//! printed to stdout while the console owns the terminal, and the terminal is restored on quit
//! and on panic.

pub mod action;
pub mod app;
pub mod data;
pub mod event_loop;
pub mod format;
pub mod ui;
pub mod views;
pub mod widgets;

pub use action::{Action, ViewId};
pub use app::App;

use crate::config::{Paths, keymap, theme};
use crate::telemetry::{Sampler, SamplerConfig, Snapshot, Source, now_s};
use anyhow::Context as _;
use crossterm::event::{DisableMouseCapture, EnableMouseCapture, EventStream};
use crossterm::execute;
use data::Level;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the console shows and how.
pub struct TuiOptions {
    /// Where GPU samples come from.
    pub source: Arc<dyn Source>,
    /// Theme name from `--theme` (None: `NO_COLOR` → mono, else the default).
    pub theme: Option<String>,
    /// Sampling and redraw interval.
    pub refresh: Duration,
}

/// Build the app the console starts with: theme and keymap from the config directory (the
/// presets on error, with the error in the footer).
pub fn build_app(theme_flag: Option<&str>, refresh: Duration, paths: &Paths, now: f64) -> App {
    let name = theme::choose(theme_flag, theme::no_color_env());
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

/// Run the console until the user quits.
pub fn run(opts: TuiOptions) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        anyhow::bail!(
            "the console needs a terminal: stdout is not one (for a one-shot report use `gpupilot status`)"
        );
    }
    let mut app = build_app(
        opts.theme.as_deref(),
        opts.refresh,
        &Paths::from_env(),
        now_s(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .context("starting the console's event loop")?;

    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            // Raw mode may be on already: give the shell its terminal back before saying why.
            ratatui::restore();
            return Err(e).context("taking over the terminal");
        }
    };
    // ratatui's hook restores raw mode and the screen; mouse reporting must go too, or the
    // shell is flooded with escape codes after a panic.
    let restore_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = execute!(std::io::stdout(), DisableMouseCapture);
        restore_hook(info);
    }));
    let _ = execute!(std::io::stdout(), EnableMouseCapture);

    let result = (|| -> anyhow::Result<()> {
        // A first frame at once, before the first sample (which may take a period).
        terminal.draw(|f| f.render_widget(&app, f.area()))?;
        let sampler = Sampler::start(Arc::clone(&opts.source), SamplerConfig::every(opts.refresh));
        app.on_snapshot(sampler.latest());
        let snapshots = bridge(&sampler);
        rt.block_on(event_loop::run(
            &mut terminal,
            &mut app,
            snapshots,
            EventStream::new(),
            now_s,
            opts.refresh,
        ))?;
        Ok(())
    })();

    let _ = execute!(std::io::stdout(), DisableMouseCapture);
    ratatui::restore();
    result
}

/// Forward the sampler's snapshots into the tokio loop. The thread ends when the sampler is
/// dropped (its channel disconnects) or the loop is gone.
fn bridge(sampler: &Sampler) -> mpsc::Receiver<Snapshot> {
    let from = sampler.subscribe();
    let (tx, rx) = mpsc::channel(4);
    std::thread::Builder::new()
        .name("tui-snapshots".into())
        .spawn(move || {
            for snap in from.iter() {
                if tx.blocking_send(snap).is_err() {
                    break;
                }
            }
        })
        .expect("spawning the snapshot bridge");
    rx
}

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
