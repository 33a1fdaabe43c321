//! `gpupilot export`: the GPU history (asked of the daemon) or a run's trainer metrics (read
//! from its run directory) as CSV, JSON lines or Parquet. The tables and their formats are
//! [`crate::export`]'s; this parses the options, finds the run, asks the daemon and writes.
//!
//! Bad input (an unknown run or GPU, `--since` not before `--until`, an output directory that
//! does not exist, Parquet to a terminal) is an error on stderr and exit status 2, before the
//! daemon is asked anything; times and formats that do not parse are clap's, also 2.

use std::io::IsTerminal as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use super::{err_line, out};
use crate::cli::{ExportArgs, ExportFormat, ExportTable};
use crate::config::Paths;
use crate::export::{self, Format, gpus};

/// Input the command refuses (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BadInput(String);

fn bad(msg: impl Into<String>) -> anyhow::Error {
    BadInput(msg.into()).into()
}

/// `gpupilot export`.
pub fn export(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    match run(args) {
        Err(e) if e.is::<BadInput>() => {
            err_line(&format!("gpupilot: {e:#}"));
            Ok(ExitCode::from(2))
        }
        other => other,
    }
}

fn run(args: &ExportArgs) -> anyhow::Result<ExitCode> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let since = args.since.map(|w| w.resolve(now));
    let until = args.until.map(|w| w.resolve(now));
    if let (Some(a), Some(b)) = (since, until) {
        if a >= b {
            return Err(bad(format!(
                "--since ({}) is not before --until ({}): nothing to export",
                export::time_text(a),
                export::time_text(b)
            )));
        }
    }
    let format = match args.format {
        ExportFormat::Csv => Format::Csv,
        ExportFormat::Jsonl => Format::Jsonl,
        ExportFormat::Parquet => Format::Parquet,
    };
    check_out(args.out.as_deref(), format)?;
    let table = args.table.unwrap_or(if args.run.is_some() {
        ExportTable::Metrics
    } else {
        ExportTable::Gpus
    });
    if table == ExportTable::Metrics && !args.gpu.is_empty() {
        return Err(bad(
            "--gpu selects GPUs of the GPU history (--table gpus); a run's metrics are per rank",
        ));
    }
    if table == ExportTable::Metrics && args.run.is_none() {
        return Err(bad("--table metrics needs --run ID: whose metrics?"));
    }
    let paths = Paths::from_env();
    let client = super::connect(&paths).ok();
    let found = match &args.run {
        Some(spec) => Some(
            super::report::find_run(&paths, client.as_ref(), spec)
                .map_err(|e| bad(format!("{e:#}")))?,
        ),
        None => None,
    };
    let span = found.as_ref().and_then(|(dir, _)| {
        let summary = dir.read_summary().ok().flatten()?;
        Some(crate::report::model::span(&summary, now))
    });

    let data = match table {
        ExportTable::Metrics => {
            let Some((dir, _)) = &found else {
                return Err(bad("--table metrics needs --run ID"));
            };
            let from = since.unwrap_or(f64::NEG_INFINITY);
            let to = until.unwrap_or(f64::INFINITY);
            let path = dir.path().join("metrics.jsonl");
            let read = export::metrics::table(&path, dir.id(), from, to)
                .with_context(|| format!("reading {}", path.display()))?;
            if read.unreadable > 0 {
                err_line(&format!(
                    "gpupilot: {}: {} line(s) could not be read and were left out",
                    path.display(),
                    read.unreadable
                ));
            }
            read.table
        }
        ExportTable::Gpus => {
            let client = client.context(
                "the GPU history is the daemon's, and no daemon answers: start one with \
                 `gpupilot daemon --detach` (a run's metrics export without one: --run ID)",
            )?;
            let (from, to) = match span {
                Some((a, b)) => (since.unwrap_or(a), until.unwrap_or(b + 1.0)),
                None => (since.unwrap_or(now - 3600.0), until.unwrap_or(now)),
            };
            if from >= to {
                return Err(bad(format!(
                    "the window from {} to {} is empty",
                    export::time_text(from),
                    export::time_text(to)
                )));
            }
            let node: Vec<u32> = client
                .status()?
                .snapshot
                .map(|s| s.gpus.iter().map(|g| g.index).collect())
                .unwrap_or_default();
            let wanted = match (&found, args.gpu.is_empty()) {
                (_, false) => args.gpu.clone(),
                (Some((dir, info)), true) => {
                    let energy = info
                        .as_ref()
                        .and_then(|i| i.energy.as_ref())
                        .cloned()
                        .or_else(|| dir.read_summary().ok().flatten().and_then(|s| s.energy));
                    crate::report::model::run_gpus(dir, energy.as_ref())
                        .unwrap_or_else(|| node.clone())
                }
                (None, true) => node.clone(),
            };
            if let Some(g) = wanted.iter().find(|g| !node.contains(g)) {
                return Err(bad(format!(
                    "no GPU {g} on this node (its GPUs: {})",
                    list(&node)
                )));
            }
            let step = args.step.unwrap_or_else(|| gpus::default_step(now - from));
            let grid = gpus::Grid::cover(from, to, step).map_err(|e| bad(e.to_string()))?;
            gpus::table(&wanted, &grid, |gpu, m, a, b, n| {
                client.history(gpu, m, a, b, n)
            })
            .context("reading the daemon's history")?
        }
    };
    let bytes = export::write(&data, format)?;
    match &args.out {
        Some(path) => crate::config::safe_fs::write_atomic(path, &bytes)
            .with_context(|| format!("writing {}", path.display()))?,
        None if format == Format::Parquet => {
            use std::io::Write as _;
            let mut o = std::io::stdout().lock();
            o.write_all(&bytes).and_then(|()| o.flush())?;
        }
        // Text formats through `out`, which ends quietly on a closed pipe.
        None => out(&String::from_utf8_lossy(&bytes))?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `--out`'s directory exists; Parquet without it goes to a pipe or a file, not a terminal.
fn check_out(path: Option<&Path>, format: Format) -> anyhow::Result<()> {
    match path {
        Some(p) => {
            let dir = match p.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => Path::new("."),
            };
            if !dir.is_dir() {
                return Err(bad(format!(
                    "--out {}: the directory {} does not exist",
                    p.display(),
                    dir.display()
                )));
            }
            if p.is_dir() {
                return Err(bad(format!(
                    "--out {}: a directory; give a file name",
                    p.display()
                )));
            }
            Ok(())
        }
        None if format == Format::Parquet && std::io::stdout().is_terminal() => Err(bad(
            "Parquet is binary: give --out FILE (or send stdout to a pipe or a file)",
        )),
        None => Ok(()),
    }
}

fn list(gpus: &[u32]) -> String {
    if gpus.is_empty() {
        return "none".into();
    }
    gpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
