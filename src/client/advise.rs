//! The advisor's input, read from a daemon: what `gpupilot advise` and the console's advisor
//! pane hand to [`crate::advisor::advise`]. The advisor itself does no I/O.
//!
//! Besides telemetry and metrics it reads who holds each GPU's cap
//! ([`crate::control::owner`]): the GPUs' limits (`power`), the loops (`thermal`) and the
//! energy searches (`tune_status`), so the advisor never proposes undoing what one of them
//! chose without saying which and why.

use super::Client;
use crate::advisor::{AdvisorInput, Thresholds, adapt};
use crate::control::owner::owners;
use crate::control::tuner::session::TunerDaemon;
use crate::control::tuner::session::run_gpus;
use crate::protocol::{Request, Response};
use crate::supervisor::RunStatus;
use crate::telemetry::GpuSample;

/// Reports asked for per run: as many as one `run_metrics` answer holds (the daemon's
/// `MAX_METRICS`).
const RECENT_REPORTS: u64 = 5_000;

/// The advisor's input from the daemon behind `client`: each GPU's history over the window
/// (completed with its newest sample) and each live run's metrics reports and knob ranges.
/// `gpupilot advise` and the console's advisor pane both gather it here.
pub fn gather(client: &Client, th: &Thresholds) -> anyhow::Result<AdvisorInput> {
    let status = client.status()?;
    let Some(snap) = status.snapshot else {
        anyhow::bail!("the daemon has no GPU telemetry yet, so there is nothing to advise on");
    };
    let now = snap.time_s;
    let from = now - th.window_s;
    let mut input = AdvisorInput {
        now,
        ..AdvisorInput::default()
    };
    let mut limits = Vec::new();
    for gpu in &snap.gpus {
        let mut series = Vec::new();
        for m in adapt::METRICS {
            let points = client.history(gpu.index, m, from, now + 1.0, th.window_s as u32)?;
            if m == crate::history::Metric::PowerLimit {
                limits.push((gpu.index, points.clone()));
            }
            series.push((m, points));
        }
        input.gpus.push(adapt::gpu_series(gpu, &series));
    }
    input.curves = kept_curves(&status.daemon.state_dir, &snap.gpus);
    let jobs = match client.request(Request::TuneStatus { job: None })? {
        Response::TuneJobs { jobs } => jobs,
        _ => anyhow::bail!("the daemon answered `tune_status` with something else"),
    };
    let locked: Vec<(u32, [u32; 2])> = client
        .clocks()?
        .into_iter()
        .filter_map(|c| Some((c.index, c.locked?)))
        .collect();
    input.owners = owners(&client.power_limits()?, &locked, &client.loops()?, &jobs);
    for run in client.runs()? {
        if !matches!(run.status, RunStatus::Running) {
            continue;
        }
        let gpus = run_gpus(&run.gpus, &snap.gpus).unwrap_or_default();
        let mut m = client.run_metrics(&run.id, 0)?;
        // One answer holds the oldest reports; a long run's recent ones are what counts.
        let end = m.trainer.last.as_ref().map_or(m.next, |p| p.n + 1);
        if m.next < end {
            m = client.run_metrics(&run.id, end.saturating_sub(RECENT_REPORTS))?;
        }
        let recent: Vec<_> = m.points.into_iter().filter(|p| p.t >= from).collect();
        let caps = limits
            .iter()
            .filter(|(i, _)| gpus.contains(i))
            .flat_map(|(i, ps)| adapt::cap_changes(*i, ps))
            .collect();
        input
            .runs
            .push(adapt::run_window(&run.id, gpus, &recent, &m.trainer, caps));
    }
    Ok(input)
}

/// The GEMM power-sweep curves kept under the daemon's state directory for the node's GPU
/// models (`gpupilot bench power-sweep`); a model without one, or one that does not read, has
/// none.
fn kept_curves(state: &std::path::Path, gpus: &[GpuSample]) -> Vec<crate::advisor::CapCurve> {
    use crate::control::bench::{Workload, curve};
    let mut models: Vec<&str> = gpus.iter().filter_map(|g| g.name.as_deref()).collect();
    models.sort_unstable();
    models.dedup();
    models
        .into_iter()
        .filter_map(|model| {
            let kept = curve::load(state, model, Workload::Gemm).ok()?;
            Some(crate::advisor::CapCurve {
                model: model.to_string(),
                label: kept.label.as_str().to_string(),
                points: kept
                    .points
                    .iter()
                    .map(|p| (p.cap_w, p.throughput_per_s, p.power_w))
                    .collect(),
            })
        })
        .collect()
}
