//! `gpupilot report RUN [--html FILE] [--md] [--json]`: a run's report. The run is found
//! through the daemon when one answers (which also gives the GPU history over the run's span),
//! else in `$STATE/runs/` directly: a report needs only the run directory, and says what it
//! could not show. No daemon is started for it.

use std::process::ExitCode;

use anyhow::Context as _;

use super::out;
use crate::cli::ReportArgs;
use crate::client::Client;
use crate::config::Paths;
use crate::protocol::RunInfo;
use crate::report::{self, Sources};
use crate::supervisor::RunDir;
use crate::supervisor::run_spec::SpecError;

/// `gpupilot report`.
pub fn report(args: &ReportArgs) -> anyhow::Result<ExitCode> {
    let paths = Paths::from_env();
    let client = super::connect(&paths).ok();
    let (dir, info) = find_run(&paths, client.as_ref(), &args.run)?;
    let history = client.as_ref().map(|c| history(c, &dir, info.as_ref()));
    let node_log = paths.state.join("events.jsonl");
    let r = report::gather(
        &dir,
        Sources {
            info: info.as_ref(),
            node_log: Some(&node_log),
            history,
            now_s: None,
        },
    )?;
    if args.json {
        // Compact: every series is in it, and scripts read it.
        out(&(serde_json::to_string(&r)? + "\n"))?;
    } else if args.md {
        out(&report::markdown::render(&r))?;
    } else {
        let path = args
            .html
            .clone()
            .unwrap_or_else(|| report::html_path(dir.path()));
        write_html(&path, &report::html::render(&r))?;
        out(&format!("{}\n", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn write_html(path: &std::path::Path, html: &str) -> anyhow::Result<()> {
    crate::config::safe_fs::write_atomic(path, html.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// The run `spec` names: through the daemon, else under `$STATE/runs/` by the same rule
/// ([`crate::supervisor::run_spec`]).
pub(crate) fn find_run(
    paths: &Paths,
    client: Option<&Client>,
    spec: &str,
) -> anyhow::Result<(RunDir, Option<RunInfo>)> {
    if let Some(c) = client {
        let info = c.run(spec)?;
        let dir = RunDir::open(&info.dir)?;
        return Ok((dir, Some(info)));
    }
    let runs = RunDir::list(&paths.state)
        .with_context(|| format!("listing {}", RunDir::runs_root(&paths.state).display()))?;
    let name = |d: &RunDir| d.read_summary().ok().flatten().map(|s| s.name);
    match crate::supervisor::run_spec::resolve(spec, &runs, RunDir::id, name) {
        Ok(d) => Ok((d.clone(), None)),
        Err(SpecError::NoRuns | SpecError::Unknown(_)) => Err(anyhow::anyhow!(
            "no run `{}` in {} (`gpupilot ps` lists the runs)",
            spec.trim(),
            RunDir::runs_root(&paths.state).display()
        )),
        Err(e) => Err(e.into()),
    }
}

/// The daemon's history of the run's GPUs over its span; every GPU of the node when the run's
/// are unknown.
fn history(
    client: &Client,
    dir: &RunDir,
    info: Option<&RunInfo>,
) -> Result<Vec<report::GpuSeries>, String> {
    let summary = dir
        .read_summary()
        .ok()
        .flatten()
        .ok_or_else(|| "no summary.json".to_string())?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let (from, to) = report::model::span(&summary, now);
    let energy = info
        .and_then(|i| i.energy.as_ref())
        .or(summary.energy.as_ref());
    let gpus = match report::model::run_gpus(dir, energy) {
        Some(g) => g,
        None => {
            let status = client.status().map_err(|e| e.to_string())?;
            status
                .snapshot
                .map(|s| s.gpus.iter().map(|g| g.index).collect())
                .unwrap_or_default()
        }
    };
    // The span's ends are widened by a sample so that the first and last seconds are in.
    report::model::gather_history(&gpus, from - 1.0, to + 1.0, |gpu, m, f, t, n| {
        client.history(gpu, m, f, t, n)
    })
    .map_err(|e| format!("the daemon's history could not be read: {e}"))
}
