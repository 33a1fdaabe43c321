//! The report as Markdown, for pasting into an issue or a chat: the same figures as the page,
//! without charts (a chart's summary is its table of means instead).

use std::fmt::Write as _;

use super::html::event_cells;
use super::model::Report;
use super::{advice_items, environment_rows, gpus_text, num, straggler_line, verdict};
use crate::control::energy::{J_PER_KWH, co2_text, joules_text, kwh_text};
use crate::units::format_duration;

/// A table cell: no `|` or newline breaks the row.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

pub fn render(r: &Report) -> String {
    let s = &r.summary;
    let mut m = String::new();
    let _ = writeln!(m, "# Run report: {}\n", s.id);
    if r.live {
        let _ = writeln!(
            m,
            "> **The run is still {}:** this is a report so far, up to {}.\n",
            s.status.as_str(),
            r.generated_at
        );
    }
    m.push_str("## Verdict\n\n| | |\n|---|---|\n");
    let t = &r.throughput;
    let dash = || "–".to_string();
    let rows = [
        ("status", verdict(r)),
        (
            "exit code",
            s.exit_code
                .map(|c| c.to_string())
                .or_else(|| s.signal_name.clone())
                .unwrap_or_else(dash),
        ),
        ("restarts", s.restarts.to_string()),
        ("duration", format_duration(r.end_s - r.start_s)),
        ("started", s.started_at.clone()),
        ("ended", s.ended_at.clone().unwrap_or_else(dash)),
        ("GPUs", gpus_text(r)),
        ("steps", t.steps.map_or_else(dash, |v| v.to_string())),
        ("samples", t.samples.map_or_else(dash, |v| v.to_string())),
        (
            "mean samples/s",
            t.mean_samples_per_s.map_or_else(dash, num),
        ),
        (
            "mean step time",
            t.mean_step_time_s
                .map_or_else(dash, |v| format!("{} ms", num(v * 1e3))),
        ),
        ("command", format!("`{}`", r.command.join(" "))),
    ];
    for (k, v) in rows {
        let _ = writeln!(m, "| {k} | {} |", cell(&v));
    }

    m.push_str("\n## Energy\n\n");
    match &r.energy {
        None => m.push_str("Not measured for this run.\n"),
        Some(e) => {
            let _ = writeln!(
                m,
                "{} in all ({}){}{}{}\n",
                kwh_text(e.kwh),
                joules_text(e.energy_j),
                e.j_per_sample
                    .map_or(String::new(), |j| format!(", {} J/sample", num(j))),
                match (e.cost, &e.currency) {
                    (Some(c), Some(cur)) => format!(", {c:.2} {cur}"),
                    (Some(c), None) => format!(", cost {c:.2}"),
                    _ => ", no price set".into(),
                },
                e.co2_g
                    .map_or(", no grid intensity set".into(), |g| format!(
                        ", {}",
                        co2_text(g)
                    )),
            );
            if let Some(line) = super::facility_line(e) {
                let _ = writeln!(m, "{line}\n");
            }
            m.push_str("| GPU | kWh | J |\n|---:|---:|---:|\n");
            for g in &e.per_gpu {
                let _ = writeln!(
                    m,
                    "| {} | {:.4} | {:.0} |",
                    g.gpu,
                    g.energy_j / J_PER_KWH,
                    g.energy_j
                );
            }
        }
    }

    m.push_str("\n## Time lost\n\n");
    match r.time_lost.data_wait_share {
        Some(share) => {
            let _ = writeln!(m, "- waiting for data: {:.1}% of step time", share * 100.0);
        }
        None => m.push_str("- waiting for data: not reported\n"),
    }
    if let Some(st) = &r.time_lost.straggler {
        let _ = writeln!(m, "- {}", straggler_line(st, r.end_s - r.start_s));
    }
    if r.gpu_history.is_none() {
        m.push_str("- throttling: unknown (no GPU history)\n");
    }
    for t in &r.time_lost.throttled {
        let _ = writeln!(
            m,
            "- GPU {}: held down by power {}, by temperature {}",
            t.gpu,
            t.power_s.map_or_else(dash, format_duration),
            t.thermal_s.map_or_else(dash, format_duration)
        );
    }

    m.push_str("\n## Advice\n\n");
    let advice = advice_items(r);
    if advice.is_empty() {
        m.push_str("Nothing over the whole run calls for a change.\n");
    }
    for a in advice {
        let _ = writeln!(m, "- **{}**: {}", a.title, a.summary);
        let _ = writeln!(m, "  - evidence: {}", a.evidence);
        if let Some(act) = a.action {
            let _ = writeln!(m, "  - action: `{act}`");
        }
    }

    m.push_str("\n## Changes during the run\n\n");
    if r.markers.is_empty() {
        m.push_str("None.\n");
    }
    for mk in &r.markers {
        let _ = writeln!(m, "- +{} {}", format_duration(mk.t - r.start_s), mk.label);
    }

    m.push_str("\n## Events\n\n| time | event | details |\n|---|---|---|\n");
    for e in &r.events {
        let (name, details) = event_cells(e);
        let _ = writeln!(m, "| {} | {} | {} |", e.time, cell(&name), cell(&details));
    }
    m.push_str("\n## Environment\n\n| | |\n|---|---|\n");
    for (k, v) in environment_rows(r) {
        let _ = writeln!(m, "| {k} | {} |", cell(&v));
    }
    if !r.missing.is_empty() {
        m.push_str("\n## Missing\n\n");
        for x in &r.missing {
            let _ = writeln!(m, "- {x}");
        }
    }
    m
}
