//! `gpupilot advise [--json] [--window SECONDS]`: the advisor's hints on the daemon's recent
//! telemetry and the live runs' metrics, each with its evidence and the command that acts on it.

use std::process::ExitCode;

use crate::advisor::text::render;
use crate::advisor::{self, Thresholds};
use crate::cli::{AdviseArgs, GlobalArgs};
use crate::client::advise::gather;
use crate::config::Paths;

/// `gpupilot advise`.
pub fn advise(g: &GlobalArgs, args: &AdviseArgs) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let th = Thresholds {
        window_s: args.window.clamp(30.0, 3600.0),
        ..Thresholds::default()
    };
    let input = gather(&client, &th)?;
    let hints = advisor::advise(&input, &th);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&hints)?);
    } else {
        print!("{}", render(&hints, th.window_s));
    }
    Ok(ExitCode::SUCCESS)
}
