//! The `gpupilot` binary: parse the command line, dispatch into the library.

use anyhow::Context;
use clap::Parser;
use gpupilot::cli::{Cli, Command, GlobalArgs, ProfileCommand, StatusArgs};
use gpupilot::commands;
use gpupilot::status;
use gpupilot::telemetry::open::open_source;
use gpupilot::telemetry::{Sampler, SamplerConfig};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpupilot: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let g = cli.global;
    match cli.command {
        None => commands::console::console(&g),
        Some(Command::Demo) => commands::console::demo(&g),
        Some(Command::Status(args)) => status(&g, &args),
        Some(Command::Daemon(args)) => commands::daemon::daemon(&g, &args),
        Some(Command::Run(args)) => commands::runs::run(&g, &args),
        Some(Command::Ps(args)) => commands::runs::ps(&args),
        Some(Command::Attach(args)) => commands::runs::attach(&g, &args),
        Some(Command::Logs(args)) => commands::runs::logs(&args),
        Some(Command::Stop(args)) => commands::runs::stop(&args),
        Some(Command::Profile(ProfileCommand::Check { file })) => commands::profile::check(&file),
    }
}

fn status(g: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let source = open_source(g.source, g.nvml_lib.as_deref(), &g.sim)
        .context("no GPU telemetry source works")?;
    let mut config = SamplerConfig::every(Duration::from_secs_f64(args.timeout.clamp(0.1, 60.0)));
    config.host = false;
    let snap = Sampler::start(source, config).latest();
    if args.json {
        println!("{}", status::render_json(&snap));
    } else {
        print!("{}", status::render_table(&snap));
    }
    Ok(ExitCode::SUCCESS)
}
