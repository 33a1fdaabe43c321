//! A run's report (`gpupilot report RUN`, and `report.html` in the run directory when a run
//! ends): did it finish, how fast, what it cost in energy, where the time went, what changed.
//!
//! - [`model`]: the figures, gathered from the run directory (and the GPU history the caller
//!   hands in); says what it could not read.
//! - [`charts`]: line charts over the run's time as SVG (plotters), with change markers.
//! - [`html`]: one self-contained page (inline CSS and SVG, no scripts, no requests), for a
//!   phone and for print.
//! - [`markdown`]: the same figures for pasting into an issue or a chat; JSON is the model
//!   through serde.
//!
//! Layer: beside `advisor` (it reads run directories and protocol types); it never talks to a
//! daemon itself.

pub mod advice;
pub mod charts;
pub mod environment;
pub mod html;
pub mod markdown;
pub mod model;

pub use environment::Environment;
pub use model::{GpuSeries, Report, ReportError, Sources, gather};

use std::path::{Path, PathBuf};

use crate::supervisor::RunDir;

/// The report's file name in a run directory.
pub const HTML_NAME: &str = "report.html";

/// Where a run directory's report goes.
pub fn html_path(dir: &Path) -> PathBuf {
    dir.join(HTML_NAME)
}

/// Gather and write `report.html` into the run directory (replaced whole, never through a
/// link); its path.
pub fn write_into_run_dir(dir: &RunDir, src: Sources<'_>) -> Result<PathBuf, ReportError> {
    let report = gather(dir, src)?;
    let path = html_path(dir.path());
    crate::config::safe_fs::write_atomic(&path, html::render(&report).as_bytes())?;
    Ok(path)
}

/// A number with a sensible number of digits for its size.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.4}")
    }
}

/// How the run ended, in words: `succeeded (exit 0)`, `running (report so far)`.
pub fn verdict(r: &Report) -> String {
    let s = &r.summary;
    if r.live {
        return format!("{} (report so far)", s.status.as_str());
    }
    match &s.description {
        Some(d) => format!("{} ({d})", s.status.as_str()),
        None => s.status.as_str().to_string(),
    }
}

/// The facility's share through the configured PUE, in words; None without a PUE.
pub fn facility_line(e: &crate::control::energy::RunEnergy) -> Option<String> {
    use crate::control::energy::{co2_text, kwh_text};
    let (f, p) = (e.facility_kwh?, e.pue?);
    let mut s = format!(
        "At the facility (PUE {p:.2}): {} in all, of which {} is the facility's share (cooling, \
         power delivery) on top of the GPUs' {}",
        kwh_text(f),
        kwh_text(f - e.kwh),
        kwh_text(e.kwh)
    );
    if let Some(c) = e.facility_cost {
        s.push_str(&format!("; {c:.2}"));
        if let Some(cur) = &e.currency {
            s.push_str(&format!(" {cur}"));
        }
    }
    if let Some(g) = e.facility_co2_g {
        s.push_str(&format!("; {}", co2_text(g)));
    }
    s.push('.');
    Some(s)
}

/// `0,1` or `unknown`.
pub fn gpus_text(r: &Report) -> String {
    match &r.gpus {
        Some(g) if !g.is_empty() => {
            let list: Vec<String> = g.iter().map(u32::to_string).collect();
            format!("{} ({})", g.len(), list.join(", "))
        }
        _ => "unknown".into(),
    }
}

/// The time lost waiting for the slowest rank, in words.
pub fn straggler_line(s: &model::Straggler, span_s: f64) -> String {
    format!(
        "Waiting for the slowest rank: {:.1}% of the job's step time ({} summed over {} steps \
         of {} ranks, about {} of the run); rank {} was the slowest at {} of them",
        s.share * 100.0,
        crate::units::format_duration(s.wait_s),
        s.steps,
        s.ranks,
        crate::units::format_duration(s.share * span_s),
        s.slowest_rank,
        s.slowest_steps
    )
}

/// The environment's rows `(what, value)`; a value the run's record lacks is `not recorded`.
pub fn environment_rows(r: &Report) -> Vec<(&'static str, String)> {
    let none = || "not recorded".to_string();
    let e = r.environment.as_ref();
    let get = |f: fn(&Environment) -> Option<String>| e.and_then(f).unwrap_or_else(none);
    vec![
        ("host", get(|e| e.hostname.clone())),
        ("gpupilot", get(|e| e.gpupilot_version.clone())),
        ("driver", get(|e| e.driver_version.clone())),
        ("CUDA (driver)", get(|e| e.cuda_driver_version.clone())),
        ("GPU models", get(Environment::models_text)),
        ("telemetry", get(|e| e.telemetry_source.clone())),
        (
            "frameworks",
            e.and_then(Environment::software_text).unwrap_or_else(|| {
                "not reported: the run's script did not attach through the gpupilot SDK \
                 (`gpupilot doctor` shows the node's PyTorch)"
                    .to_string()
            }),
        ),
        (
            "ranks",
            e.and_then(Environment::ranks_text)
                .unwrap_or_else(|| "one process".to_string()),
        ),
        ("recorded", get(|e| Some(e.recorded_at.clone()))),
    ]
}

/// One of the advisor's findings, in words, for the report's forms.
#[derive(Debug, Clone, PartialEq)]
pub struct AdviceItem {
    /// What it is about and whose: `thermal throttling (GPU 3)`.
    pub title: String,
    pub summary: String,
    /// The numbers behind it: `time in thermal slowdown 62%; temperature (highest) 88 C`.
    pub evidence: String,
    /// What to do: a command, or for a run that has ended, what to change in the next one.
    pub action: Option<String>,
}

/// The report's findings in words.
pub fn advice_items(r: &Report) -> Vec<AdviceItem> {
    use crate::advisor::text::{label, num};
    use crate::advisor::{Knob, Suggestion};
    r.advice
        .iter()
        .map(|h| {
            let whose = match (&h.run, h.gpu) {
                (_, Some(g)) => format!("GPU {g}"),
                (Some(_), None) => "the run".to_string(),
                (None, None) => "the node".to_string(),
            };
            let evidence = h
                .evidence
                .iter()
                .map(|e| match e.unit.as_str() {
                    "" | "%" => format!("{} {}{}", e.name, num(e.value), e.unit),
                    u => format!("{} {} {u}", e.name, num(e.value)),
                })
                .collect::<Vec<_>>()
                .join("; ");
            let action = h.action.as_ref().and_then(|a| match a {
                _ if r.live => Some(a.command()),
                Suggestion::SetKnob {
                    knob: Knob::BatchSize,
                    value,
                    ..
                } => Some(format!(
                    "next run: [knobs.batch_size] initial = {value:.0} in its profile"
                )),
                Suggestion::SetKnob {
                    knob: Knob::Prefetch,
                    value,
                    ..
                } => Some(format!(
                    "next run: [knobs.prefetch] initial = {value:.0} in its profile"
                )),
                Suggestion::StopRun { .. } => None,
                other => Some(other.command()),
            });
            AdviceItem {
                title: format!("{} ({whose})", label(h.kind)),
                summary: h.summary.clone(),
                evidence,
                action,
            }
        })
        .collect()
}
