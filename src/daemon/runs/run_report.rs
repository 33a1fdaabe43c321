//! `report.html` into a run's directory when the run ends: the GPU history over its span is
//! copied out of the store at once (the store thins old samples), and the page is gathered and
//! written on a thread of its own a few seconds later, after the control loop's last energy
//! figure is in `summary.json`. Never on the daemon's hot path; a failure is logged, never
//! fatal.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::history::History;
use crate::report::{self, Sources};
use crate::supervisor::{Event, EventRecord, RunDir};

/// How long after the end the report is written: a few control-loop periods, so that the
/// run's final energy is in its summary.
const DELAY: Duration = Duration::from_secs(3);

/// GPUs tried when the run's own are not known (a GPU with no samples is left out).
const MAX_GPUS: u32 = 16;

/// Run `id` under `state` has ended: write its report soon.
pub(in crate::daemon) fn after_end(state: &Path, id: &str, history: &Mutex<History>) {
    let dir = match RunDir::open(RunDir::runs_root(state).join(id)) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!("run {id}: no report: {e}");
            return;
        }
    };
    let summary = dir.read_summary().ok().flatten();
    let gpus = report::model::run_gpus(&dir, summary.as_ref().and_then(|s| s.energy.as_ref()))
        .unwrap_or_else(|| (0..MAX_GPUS).collect());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let series = summary.map(|s| {
        let (from, to) = report::model::span(&s, now);
        let store = history.lock().unwrap_or_else(|p| p.into_inner());
        report::model::gather_history::<std::convert::Infallible>(
            &gpus,
            from - 1.0,
            to + 1.0,
            |gpu, m, f, t, n| Ok(store.window(gpu as usize, m, f, t, n as usize)),
        )
        .unwrap_or_default()
    });
    let node_log = state.join("events.jsonl");
    let run = id.to_string();
    let spawned = std::thread::Builder::new()
        .name("run-report".into())
        .spawn(move || {
            std::thread::sleep(DELAY);
            let src = Sources {
                node_log: Some(&node_log),
                history: series.map(Ok),
                ..Sources::default()
            };
            match report::write_into_run_dir(&dir, src) {
                Ok(path) => {
                    tracing::info!("run {run}: report written to {}", path.display());
                    // The run's last event says where its report is.
                    let rec = EventRecord {
                        time: crate::time::rfc3339(std::time::SystemTime::now()),
                        event: Event::ReportWritten {
                            path: path.display().to_string(),
                        },
                    };
                    if let Err(e) = dir.append_event(&rec) {
                        tracing::warn!("run {run}: recording where its report is: {e}");
                    }
                }
                Err(e) => tracing::warn!("run {run}: writing its report: {e}"),
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("run {id}: no report (no thread for it: {e})");
    }
}
