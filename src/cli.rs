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
    /// The console on a simulated node with a synthetic training run (no GPU needed).
    Demo(TuiArgs),
    /// One-shot snapshot of every GPU (like gpustat; --json for scripts).
    Status(StatusArgs),
}

/// Options of the console.
#[derive(Debug, Args, Clone)]
pub struct TuiArgs {
    /// Seconds between samples and redraws; raise it on slow links.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = parse_refresh)]
    pub refresh: f64,
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
        assert!(matches!(cli.command, Some(Command::Demo(TuiArgs { refresh })) if refresh == 2.0));
        assert!(Cli::try_parse_from(["gpupilot", "status", "--gpus", "0"]).is_err());
    }
}
