//! The `gpupilot` binary: parse the command line, dispatch into the library.

// Outside tests every failure is handled, or is an `expect` that says why it cannot happen:
// a daemon that supervises week-long runs must not die on an unexpected value (clippy.toml
// allows both in unit tests; integration tests are crates of their own).
#![deny(clippy::unwrap_used, clippy::panic)]

use anyhow::Context;
use clap::Parser;
use gpupilot::cli::{Cli, Command, GlobalArgs, ProfileCommand, StatusArgs};
use gpupilot::commands;
use gpupilot::status;
use gpupilot::telemetry::open::open_source;
use gpupilot::telemetry::{Sampler, SamplerConfig};
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

fn main() -> ExitCode {
    // `gpupilot run-monitor`: a run's monitor (hidden; see supervisor::monitor).
    if let Some(code) = gpupilot::supervisor::monitor::main_if_asked() {
        return code;
    }
    gpupilot::supervisor::launch::this_binary_monitors_runs();
    let cli = Cli::parse();
    if !matches!(&cli.command, Some(Command::Daemon(d)) if !d.detach && d.action.is_none()) {
        commands::end_quietly_on_closed_pipe();
    }
    match dispatch(cli) {
        Ok(code) => code,
        // The reader went away (`gpupilot ps | head`): no one is left to tell.
        Err(e) if commands::is_output_closed(&e) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "gpupilot: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let g = cli.global;
    if g.system {
        // Every command of this process talks to the system daemon's socket.
        gpupilot::config::paths::use_system_daemon();
    }
    match cli.command {
        None | Some(Command::Top) => commands::console::console(&g),
        Some(Command::Demo(args)) => commands::console::demo(&g, args.home.as_deref()),
        Some(Command::Status(args)) => status(&g, &args),
        Some(Command::Daemon(args)) => commands::daemon::daemon(&g, &args),
        Some(Command::Run(args)) => commands::runs::run(&g, &args),
        Some(Command::Ps(args)) => commands::runs::ps(&args),
        Some(Command::Attach(args)) => commands::runs::attach(&g, &args),
        Some(Command::Logs(args)) => commands::runs::logs(&args),
        Some(Command::Stop(args)) => commands::runs::stop(&args),
        Some(Command::Events(args)) => commands::events::events(&args),
        Some(Command::Profile(ProfileCommand::Check { file })) => commands::profile::check(&file),
        Some(Command::Power(args)) => commands::power::power(&g, &args),
        Some(Command::Set(args)) => commands::knobs::set(&args),
        Some(Command::Bridge) => commands::bridge::bridge(&g),
        Some(Command::SyntheticTrain(args)) => commands::knobs::synthetic_train(&g, &args),
        Some(Command::Ranks(args)) => commands::ranks::ranks(&args),
        Some(Command::Clocks(cmd)) => commands::power::clocks(&g, &cmd),
        Some(Command::Doctor(args)) => commands::doctor::doctor(&g, &args),
        Some(Command::Bench(cmd)) => commands::bench::bench(&g, &cmd),
        Some(Command::Advise(args)) => commands::advise::advise(&g, &args),
        Some(Command::Tune(cmd)) => commands::tune::tune(&g, &cmd),
        Some(Command::Thermal(args)) => commands::thermal::thermal(&g, &args),
        Some(Command::Budget(args)) => commands::thermal::budget(&g, &args),
        Some(Command::Cluster(args)) => commands::cluster::cluster(&args),
        Some(Command::Report(args)) => commands::report::report(&args),
        Some(Command::Export(args)) => commands::export::export(&args),
        Some(Command::Record(args)) => commands::record::record(&args),
        Some(Command::Replay(args)) => commands::record::replay(&g, &args),
        Some(Command::Completions(args)) => commands::completions::completions(args.shell),
        Some(Command::Man(args)) => commands::man::man(args.dir.as_deref()),
        Some(Command::CompleteValues(args)) => commands::completions::values(args.kind),
    }
}

fn status(g: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let source = open_source(g.source, g.nvml_lib.as_deref(), &g.sim.spec())
        .context("no GPU telemetry source works")?;
    let mut config = SamplerConfig::every(Duration::from_secs_f64(args.timeout.clamp(0.1, 60.0)));
    config.host = false;
    let mut snap = Arc::unwrap_or_clone(Sampler::start(source, config).latest());
    // A one-shot read hears only the XIDs of its own moment; a running daemon has listened
    // since it started.
    if let Some(daemon) = commands::daemon_snapshot() {
        status::merge_xids(&mut snap, &daemon);
    }
    if args.json {
        println!("{}", status::render_json(&snap));
    } else {
        print!("{}", status::render_table(&snap));
    }
    Ok(ExitCode::SUCCESS)
}
