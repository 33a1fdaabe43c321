//! The console's ways in: `gpupilot` (no command) and `demo`, and the console side of `run`
//! and `attach`.
//!
//! Every console but the demo's is a client of the daemon (started in the background when none
//! answers); quitting it detaches, and the daemon and its runs go on. The demo samples a
//! simulated node in-process and leaves nothing running when it quits.

use std::process::ExitCode;
use std::time::Duration;

use super::connect_or_spawn;
use crate::cli::GlobalArgs;
use crate::client::Client;
use crate::config::Paths;
use crate::telemetry::open::open_sim;
use crate::tui::{self, DataSource, TuiOptions};

/// `gpupilot`: the console on the local daemon.
pub fn console(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let client = connect_or_spawn(g, &paths)?;
    tui::run(options(g, DataSource::Daemon(client), None))?;
    Ok(ExitCode::SUCCESS)
}

/// `gpupilot demo`: the console on a simulated node sampled in-process (no daemon).
pub fn demo(g: &GlobalArgs) -> anyhow::Result<ExitCode> {
    let source = open_sim(&g.sim)?;
    tui::run(options(g, DataSource::Local(source), None))?;
    Ok(ExitCode::SUCCESS)
}

/// The console on run `id`'s Run view (`run` and `attach` on a terminal); after it, whether
/// the run goes on.
pub fn attach(g: &GlobalArgs, paths: &Paths, client: Client, id: &str) -> anyhow::Result<ExitCode> {
    tui::run(options(g, DataSource::Daemon(client), Some(id.to_string())))?;
    match Client::connect(paths).and_then(|c| c.run(id)) {
        Ok(info) if info.is_final() => eprintln!(
            "gpupilot: run {id} has ended: {}",
            info.description.as_deref().unwrap_or(info.status.as_str())
        ),
        Ok(_) => eprintln!(
            "gpupilot: detached; run {id} goes on (`gpupilot attach {id}` shows it again)"
        ),
        Err(e) => eprintln!("gpupilot: detached from run {id} ({e})"),
    }
    Ok(ExitCode::SUCCESS)
}

fn options(g: &GlobalArgs, source: DataSource, open_run: Option<String>) -> TuiOptions {
    TuiOptions {
        source,
        theme: g.theme.clone(),
        refresh: Duration::from_secs_f64(g.refresh),
        open_run,
    }
}
