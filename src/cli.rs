//! The command line (clap derive). Names here are stable: tests and docs rely on them.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// gpupilot: watch, supervise and tune deep-learning training on GPU machines.
#[derive(Debug, Parser)]
#[command(name = "gpupilot", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Options every command understands.
#[derive(Debug, Args, Clone)]
pub struct GlobalArgs {
    /// Where GPU telemetry comes from: NVML if it loads (auto), NVML only, or the simulator.
    #[arg(long, global = true, value_enum, default_value_t = SourceKind::Auto, env = "GPUPILOT_SOURCE")]
    pub source: SourceKind,
    /// Load NVML from this file instead of the system's libnvidia-ml.so.1.
    #[arg(long, global = true, value_name = "PATH", env = "GPUPILOT_NVML_LIB")]
    pub nvml_lib: Option<PathBuf>,
    /// Colour theme: dark, light, high-contrast, mono, or one of yours in the config dir.
    #[arg(long, global = true, value_name = "NAME", env = "GPUPILOT_THEME")]
    pub theme: Option<String>,
    /// Seconds between console redraws (and polls of the daemon; samples in `demo`); raise it
    /// on slow links.
    #[arg(long, global = true, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_refresh)]
    pub refresh: f64,
    #[command(flatten)]
    pub sim: SimArgs,
}

/// The simulated node used by `--source sim` and `demo`.
#[derive(Debug, Args, Clone)]
pub struct SimArgs {
    /// Number of simulated GPUs.
    #[arg(long = "gpus", global = true, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus: u32,
    /// Simulated GPU model: h100-sxm, h200, a100-sxm-80gb, v100-sxm2, rtx-4090.
    #[arg(
        long = "model",
        global = true,
        value_name = "NAME",
        default_value = "h100-sxm"
    )]
    pub model: String,
    /// Synthetic training workload on the simulated GPUs (or `idle`).
    #[arg(
        long = "workload",
        global = true,
        value_name = "NAME",
        default_value = "resnet50"
    )]
    pub workload: String,
    /// Seed of the simulator (same seed, same node).
    #[arg(long = "seed", global = true, value_name = "N", default_value_t = 0)]
    pub seed: u64,
}

/// Which telemetry source to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    Auto,
    Nvml,
    Sim,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The console on a simulated node with a synthetic training run (no GPU, no daemon needed).
    Demo,
    /// One-shot snapshot of every GPU (like gpustat; --json for scripts).
    Status(StatusArgs),
    /// The background daemon: GPU sampling, history, runs, event log (one per GPUPILOT_HOME).
    #[command(
        long_about = "The background daemon: it samples the GPUs, keeps their history, supervises \
runs and writes the node's event log; the console and the other commands are its clients over a \
Unix socket. One per GPUPILOT_HOME. Runs outlive it: on SIGTERM or SIGINT it leaves them running, \
and the next daemon adopts them. See docs/operations.md."
    )]
    Daemon(DaemonArgs),
    /// Start a supervised run from a profile or a command line.
    #[command(long_about = RUN_ABOUT)]
    Run(RunArgs),
    /// List runs: id, status, pid, uptime, restarts, exit, GPUs, command.
    Ps(PsArgs),
    /// Open the console on a run (the newest live run unless RUN is given); q detaches.
    #[command(long_about = ATTACH_ABOUT)]
    Attach(AttachArgs),
    /// Print a run's output; -f follows it until the run ends.
    Logs(LogsArgs),
    /// Stop a run: SIGTERM to its process group, SIGKILL after the grace period.
    Stop(StopArgs),
    /// Work with run profiles.
    #[command(subcommand)]
    Profile(ProfileCommand),
}

const RUN_ABOUT: &str =
    "Start a supervised run from a profile (PROFILE.toml, see docs/profiles.md) or from a \
command line after `--`. The run starts in its own session with its output written to files, so it \
outlives this terminal, the console and the daemon.

Without --detach it then opens the console on the run's Run view (its state and the end of its \
log, followed live); quitting the console (q), or a dropped SSH session, only detaches: the run \
goes on, and `gpupilot attach` shows it again. With --detach it prints the run's id and returns. \
When stdout is not a terminal it follows the run's output instead (like `gpupilot logs -f`) until \
the run ends, and exits with the run's exit code; Ctrl-C detaches.

`run -- CMD…` sets PYTHONUNBUFFERED=1 unless you have set it, so that Python's output reaches the \
log as it is printed. A daemon is started in the background when none answers.";

const ATTACH_ABOUT: &str = "Open the console on a run's Run view: its state, how each attempt \
ended, and the end of its log, followed live. Quitting (q) detaches and leaves the run running. RUN \
is an id, a unique id prefix, a run name, or `last`; without it, the newest live run (else the \
newest). When stdout is not a terminal it prints the run's last lines and then everything new until \
the run ends; Ctrl-C detaches. A daemon is started in the background when none answers.";

/// Options of `gpupilot daemon`.
#[derive(Debug, Args, Clone)]
pub struct DaemonArgs {
    /// Start in the background (own session, output to $STATE/daemon.log), print its pid once it
    /// answers, and return.
    #[arg(long)]
    pub detach: bool,
    /// Refuse every change: starting, stopping or signalling runs (watching still works).
    #[arg(long)]
    pub readonly: bool,
    /// GPU samples per second kept in history and pushed to clients.
    #[arg(long, value_name = "HZ", default_value_t = 1.0, value_parser = parse_rate)]
    pub rate: f64,
    /// Internal: started by --detach; call setsid(2) and log to the file only.
    #[arg(long, hide = true)]
    pub new_session: bool,
}

/// Options of `gpupilot run`.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// The profile to run (a TOML file; `extends` looks in its directory, then
    /// $CONFIG/profiles, then the shipped profiles).
    #[arg(value_name = "PROFILE.toml", required_unless_present = "command")]
    pub profile: Option<PathBuf>,
    /// The command to run instead of a profile, after `--`: `gpupilot run -- python3 train.py`.
    #[arg(last = true, value_name = "CMD", conflicts_with = "profile")]
    pub command: Vec<String>,
    /// Print the run's id and return at once instead of opening the console on it.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The run's name (part of its id) instead of the profile's or the command's.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct PsArgs {
    /// Print JSON (an array of runs) instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone)]
pub struct AttachArgs {
    /// An id, a unique id prefix, a run name, or `last`.
    #[arg(value_name = "RUN")]
    pub run: Option<String>,
}

#[derive(Debug, Args, Clone)]
pub struct LogsArgs {
    /// An id, a unique id prefix, a run name, or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Keep printing new output until the run ends (Ctrl-C stops following).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// The run's stderr instead of its stdout.
    #[arg(long)]
    pub stderr: bool,
}

#[derive(Debug, Args, Clone)]
pub struct StopArgs {
    /// An id, a unique id prefix, a run name, or `last`.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// SIGKILL now instead of SIGTERM and a grace period.
    #[arg(long)]
    pub kill: bool,
    /// Seconds between SIGTERM and SIGKILL.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub grace: f64,
}

#[derive(Debug, Subcommand, Clone)]
pub enum ProfileCommand {
    /// Load a profile, follow `extends`, and print what would run, or every problem as
    /// FILE:LINE:COL (exit status 1).
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

#[derive(Debug, Args, Clone)]
pub struct StatusArgs {
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Wait at most this many seconds for a GPU that does not answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0)]
    pub timeout: f64,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of samples per second"))?;
    if !(0.01..=100.0).contains(&v) {
        return Err(format!("rate must be between 0.01 and 100 Hz, got {v}"));
    }
    Ok(v)
}

fn parse_refresh(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(0.05..=3600.0).contains(&v) {
        return Err(format!(
            "refresh must be between 0.05 and 3600 seconds, got {v}"
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn refresh_bounds() {
        assert!(Cli::try_parse_from(["gpupilot", "demo", "--refresh", "0.01"]).is_err());
        assert!(Cli::try_parse_from(["gpupilot", "demo", "--refresh", "x"]).is_err());
        let cli =
            Cli::try_parse_from(["gpupilot", "demo", "--refresh", "2", "--gpus", "8"]).unwrap();
        assert_eq!(cli.global.sim.gpus, 8);
        assert!(matches!(cli.command, Some(Command::Demo)));
        assert_eq!(cli.global.refresh, 2.0);
        // The console's other ways in take it too.
        let cli = Cli::try_parse_from(["gpupilot", "--refresh", "0.5"]).unwrap();
        assert!(cli.command.is_none() && cli.global.refresh == 0.5);
        let cli = Cli::try_parse_from(["gpupilot", "attach", "--refresh", "3", "last"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Attach(_))) && cli.global.refresh == 3.0);
        let cli = Cli::try_parse_from(["gpupilot", "run", "--refresh", "3", "--", "x"]).unwrap();
        assert!(matches!(cli.command, Some(Command::Run(_))) && cli.global.refresh == 3.0);
        assert_eq!(
            Cli::try_parse_from(["gpupilot"]).unwrap().global.refresh,
            1.0
        );
        assert!(Cli::try_parse_from(["gpupilot", "status", "--gpus", "0"]).is_err());
    }

    #[test]
    fn run_takes_a_profile_or_a_command() {
        let cli =
            Cli::try_parse_from(["gpupilot", "run", "--detach", "--", "python3", "-u", "t.py"])
                .unwrap();
        let Some(Command::Run(r)) = cli.command else {
            panic!("not run")
        };
        assert_eq!(r.command, ["python3", "-u", "t.py"]);
        assert!(r.detach && r.profile.is_none());
        let cli = Cli::try_parse_from(["gpupilot", "run", "p.toml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Run(RunArgs {
                profile: Some(_),
                ..
            }))
        ));
        assert!(
            Cli::try_parse_from(["gpupilot", "run"]).is_err(),
            "nothing to run"
        );
        assert!(Cli::try_parse_from(["gpupilot", "run", "p.toml", "--", "x"]).is_err());
        let cli =
            Cli::try_parse_from(["gpupilot", "--source", "sim", "daemon", "--readonly"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Daemon(DaemonArgs {
                readonly: true,
                detach: false,
                ..
            }))
        ));
        assert!(Cli::try_parse_from(["gpupilot", "daemon", "--rate", "0"]).is_err());
        let cli = Cli::try_parse_from(["gpupilot", "logs", "last", "-f", "--stderr"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Logs(LogsArgs {
                follow: true,
                stderr: true,
                ..
            }))
        ));
        let cli = Cli::try_parse_from(["gpupilot", "profile", "check", "x.toml"]).unwrap();
        assert!(matches!(
            cli.command,
            Some(Command::Profile(ProfileCommand::Check { .. }))
        ));
    }
}
