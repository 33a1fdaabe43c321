//! The report as one self-contained HTML page: inline CSS, charts as inline `<svg>`, no script,
//! no font, no image, no link that loads anything. Readable on a phone (the layout is one
//! column, tables scroll sideways, charts scale to the width) and printed (no backgrounds,
//! charts kept whole on a page).

use std::fmt::Write as _;

use super::charts::{Line, chart, marker_colour};
use super::model::{GpuSeries, MarkerKind, Report};
use super::{gpus_text, num, verdict};
use crate::control::energy::{J_PER_KWH, co2_text, joules_text, kwh_text};
use crate::history::Metric;
use crate::protocol::MetricsReport;
use crate::units::format_duration;

const CSS: &str = r#"
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f;
  margin: 0 auto; max-width: 1000px; padding: 12px; background: #fff; }
h1 { font-size: 1.5em; margin: .2em 0; word-break: break-all; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
h3 { font-size: 1em; margin: 1em 0 .3em; }
.live { background: #fff3cd; border: 1px solid #e0b400; padding: .5em .8em; border-radius: 4px; }
.bad { color: #b71c1c; } .ok { color: #1b5e20; }
.tiles { display: grid; grid-template-columns: repeat(auto-fit, minmax(150px, 1fr)); gap: 8px; }
.tile { border: 1px solid #ddd; border-radius: 6px; padding: 8px 10px; }
.tile b { display: block; font-size: 1.25em; }
.tile span { color: #666; font-size: .85em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; width: 100%; font-size: .9em; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #eee; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 10px 0; }
figure svg { width: 100%; height: auto; display: block; }
.marker { display: inline-block; width: .8em; height: .8em; border-radius: 2px; margin-right: .3em; }
.missing li { color: #8a5a00; }
code { font-size: .9em; word-break: break-all; }
footer { color: #888; font-size: .8em; margin-top: 2em; }
@media (max-width: 600px) { body { font-size: 14px; padding: 8px; } th, td { padding: 2px 4px; } }
@media print {
  body { max-width: none; font-size: 11pt; }
  .live { background: none; }
  figure, table, .tiles { break-inside: avoid; page-break-inside: avoid; }
  h2 { break-after: avoid; page-break-after: avoid; }
  .scroll { overflow: visible; }
}
"#;

/// Escape text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page.
pub fn render(r: &Report) -> String {
    let mut h = String::new();
    let s = &r.summary;
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>Run report: {}</title><style>{CSS}</style></head><body>\n",
        esc(&s.id)
    );
    let _ = writeln!(h, "<h1>Run report: {}</h1>", esc(&s.id));
    if r.live {
        let _ = writeln!(
            h,
            "<p class=\"live\"><b>The run is still {}:</b> this is a report so far, up to {}.</p>",
            esc(s.status.as_str()),
            esc(&r.generated_at)
        );
    }
    verdict_section(&mut h, r);
    energy_section(&mut h, r);
    time_lost_section(&mut h, r);
    advice_section(&mut h, r);
    markers_section(&mut h, r);
    training_section(&mut h, r);
    gpu_section(&mut h, r);
    events_section(&mut h, r);
    environment_section(&mut h, r);
    if !r.missing.is_empty() {
        h.push_str("<h2>Missing</h2><ul class=\"missing\">");
        for m in &r.missing {
            let _ = write!(h, "<li>{}</li>", esc(m));
        }
        h.push_str("</ul>\n");
    }
    let _ = writeln!(
        h,
        "<footer>gpupilot {} · generated {} · <code>gpupilot report {}</code></footer></body></html>",
        env!("CARGO_PKG_VERSION"),
        esc(&r.generated_at),
        esc(&s.id)
    );
    h
}

fn tile(h: &mut String, label: &str, value: &str, class: &str) {
    let _ = write!(
        h,
        "<div class=\"tile\"><span>{}</span><b class=\"{class}\">{}</b></div>",
        esc(label),
        esc(value)
    );
}

fn verdict_section(h: &mut String, r: &Report) {
    let s = &r.summary;
    h.push_str("<h2>Verdict</h2><div class=\"tiles\">");
    let class = match s.status.as_str() {
        "succeeded" => "ok",
        "failed" | "unknown" => "bad",
        _ => "",
    };
    tile(h, "status", &verdict(r), class);
    let exit = match (s.exit_code, &s.signal_name) {
        (Some(c), _) => format!("{c}"),
        (None, Some(sig)) => sig.clone(),
        _ => "–".into(),
    };
    tile(h, "exit code", &exit, class);
    tile(h, "restarts", &s.restarts.to_string(), "");
    tile(h, "duration", &format_duration(r.end_s - r.start_s), "");
    tile(h, "GPUs", &gpus_text(r), "");
    let t = &r.throughput;
    tile(
        h,
        "steps",
        &t.steps.map_or("–".into(), |v| v.to_string()),
        "",
    );
    tile(
        h,
        "samples",
        &t.samples.map_or("–".into(), |v| v.to_string()),
        "",
    );
    tile(
        h,
        "mean samples/s",
        &t.mean_samples_per_s.map_or("–".into(), num),
        "",
    );
    tile(
        h,
        "mean step time",
        &t.mean_step_time_s
            .map_or("–".into(), |v| format!("{} ms", num(v * 1e3))),
        "",
    );
    h.push_str("</div>\n");
    let _ = writeln!(
        h,
        "<p>Started {} · ended {} · command <code>{}</code></p>",
        esc(&s.started_at),
        esc(s.ended_at.as_deref().unwrap_or("–")),
        esc(&r.command.join(" "))
    );
}

fn energy_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Energy</h2>");
    let Some(e) = &r.energy else {
        h.push_str("<p>Not measured for this run.</p>\n");
        return;
    };
    h.push_str("<div class=\"tiles\">");
    tile(h, "in all", &kwh_text(e.kwh), "");
    tile(h, "joules", &joules_text(e.energy_j), "");
    tile(
        h,
        "per sample",
        &e.j_per_sample
            .map_or("–".into(), |j| format!("{} J", num(j))),
        "",
    );
    let cost = match (e.cost, &e.currency) {
        (Some(c), Some(cur)) => format!("{c:.2} {cur}"),
        (Some(c), None) => format!("{c:.2}"),
        _ => "no price set".into(),
    };
    tile(h, "cost", &cost, "");
    let co2 = e.co2_g.map_or("no grid intensity set".into(), co2_text);
    tile(h, "CO2", &co2, "");
    let facility = match (e.facility_kwh, e.pue) {
        (Some(f), Some(p)) => format!("{} (PUE {p:.2})", kwh_text(f)),
        _ => "no PUE set".into(),
    };
    tile(h, "at the facility", &facility, "");
    h.push_str("</div>\n");
    if let Some(line) = super::facility_line(e) {
        let _ = writeln!(h, "<p>{}</p>", esc(&line));
    }
    h.push_str("<div class=\"scroll\"><table><tr><th>GPU</th><th class=\"n\">kWh</th><th class=\"n\">J</th><th class=\"n\">share</th></tr>");
    for g in &e.per_gpu {
        let share = if e.energy_j > 0.0 {
            g.energy_j / e.energy_j * 100.0
        } else {
            0.0
        };
        let _ = write!(
            h,
            "<tr><td>{}</td><td class=\"n\">{:.4}</td><td class=\"n\">{:.0}</td><td class=\"n\">{share:.0}%</td></tr>",
            g.gpu,
            g.energy_j / J_PER_KWH,
            g.energy_j
        );
    }
    h.push_str("</table></div>\n");
}

fn time_lost_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Time lost</h2><ul>");
    let span = r.end_s - r.start_s;
    match r.time_lost.data_wait_share {
        Some(share) => {
            let _ = write!(
                h,
                "<li>Waiting for data: <b>{:.1}%</b> of step time (about {} of the run).</li>",
                share * 100.0,
                format_duration(share * span)
            );
        }
        None => h.push_str("<li>Waiting for data: not reported by the trainer.</li>"),
    }
    if let Some(st) = &r.time_lost.straggler {
        let _ = write!(
            h,
            "<li class=\"straggler\">{}.</li>",
            esc(&super::straggler_line(st, span))
        );
    }
    if r.gpu_history.is_none() {
        h.push_str("<li>Throttling: unknown (no GPU history).</li>");
    }
    for t in &r.time_lost.throttled {
        let _ = write!(
            h,
            "<li>GPU {}: held down by power {}, by temperature {}.</li>",
            t.gpu,
            t.power_s.map_or("–".into(), format_duration),
            t.thermal_s.map_or("–".into(), format_duration)
        );
    }
    h.push_str("</ul>\n");
}

fn markers_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Changes during the run</h2>");
    if r.markers.is_empty() {
        h.push_str("<p>None: no knob or cap change, no restart.</p>\n");
        return;
    }
    h.push_str("<p>Numbered as on the charts.</p><div class=\"scroll\"><table><tr><th class=\"n\">#</th><th>at</th><th>what</th><th>change</th></tr>");
    for (i, m) in r.markers.iter().enumerate() {
        let c = marker_colour(m.kind);
        let kind = match m.kind {
            MarkerKind::Knob => "knob",
            MarkerKind::Cap => "power cap",
            MarkerKind::Governor => "governor",
            MarkerKind::Restart => "restart",
            MarkerKind::Stop => "status",
        };
        let _ = write!(
            h,
            "<tr><td class=\"n\">{}</td><td>+{}</td><td><span class=\"marker\" style=\"background:rgb({},{},{})\"></span>{kind}</td><td>{}</td></tr>",
            i + 1,
            format_duration(m.t - r.start_s),
            c.0,
            c.1,
            c.2,
            esc(&m.label)
        );
    }
    h.push_str("</table></div>\n");
}

fn figure(h: &mut String, svg: Option<String>) {
    if let Some(svg) = svg {
        h.push_str("<figure>");
        h.push_str(&svg);
        h.push_str("</figure>\n");
    }
}

/// One line per rank of the field `f` of the reports.
pub fn rank_lines(r: &Report, f: impl Fn(&MetricsReport) -> Option<f64>) -> Vec<Line> {
    r.ranks
        .iter()
        .map(|rank| Line {
            name: rank.rank.map_or("run".into(), |n| format!("rank {n}")),
            points: rank
                .points
                .iter()
                .filter_map(|p| Some((p.t, f(&p.report)?)))
                .filter(|(_, v)| v.is_finite())
                .collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect()
}

/// A number out of a trainer report.
type Field = fn(&MetricsReport) -> Option<f64>;

fn training_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Training</h2>");
    if r.ranks.is_empty() {
        h.push_str("<p>The run reported no training metrics.</p>\n");
        return;
    }
    let (t0, t1) = (r.start_s, r.end_s);
    let specs: [(&str, &str, Field); 4] = [
        ("Training loss", "loss", |m| m.loss),
        ("Throughput", "samples/s", |m| m.samples_per_s),
        ("Step time", "ms", |m| m.step_time_s.map(|s| s * 1e3)),
        ("Data wait", "ms", |m| m.data_wait_s.map(|s| s * 1e3)),
    ];
    for (title, unit, f) in specs {
        figure(h, chart(title, unit, &rank_lines(r, f), &r.markers, t0, t1));
    }
}

/// One line per GPU of `metric`'s mean.
pub fn gpu_lines(history: &[GpuSeries], metric: Metric, suffix: &str) -> Vec<Line> {
    history
        .iter()
        .filter_map(|g| {
            Some(Line {
                name: format!("GPU {}{suffix}", g.gpu),
                points: g.get(metric)?.iter().map(|p| (p.t, p.mean)).collect(),
            })
        })
        .collect()
}

fn gpu_section(h: &mut String, r: &Report) {
    h.push_str("<h2>GPUs</h2>");
    let Some(history) = &r.gpu_history else {
        h.push_str("<p>No GPU history for this run (see Missing).</p>\n");
        return;
    };
    let (t0, t1, m) = (r.start_s, r.end_s, &r.markers);
    let util = gpu_lines(history, Metric::UtilGpu, "");
    figure(h, chart("GPU utilization", "%", &util, m, t0, t1));
    let mut power = gpu_lines(history, Metric::Power, " power");
    power.extend(gpu_lines(history, Metric::PowerLimit, " cap"));
    figure(h, chart("Power against cap", "W", &power, m, t0, t1));
    let temp = gpu_lines(history, Metric::Temperature, "");
    figure(h, chart("Temperature", "°C", &temp, m, t0, t1));
    let clock = gpu_lines(history, Metric::SmClock, "");
    figure(h, chart("SM clock", "MHz", &clock, m, t0, t1));
}

fn events_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Events</h2>");
    if r.events.is_empty() {
        h.push_str("<p>None recorded.</p>\n");
        return;
    }
    h.push_str("<div class=\"scroll\"><table><tr><th>time</th><th>event</th><th>details</th></tr>");
    for e in &r.events {
        let (name, details) = event_cells(e);
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&e.time),
            esc(&name),
            esc(&details)
        );
    }
    h.push_str("</table></div>\n");
}

fn advice_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Advice</h2>");
    let items = super::advice_items(r);
    if items.is_empty() {
        h.push_str(
            "<p>Nothing over the whole run calls for a change (the advisor's rules, given the \
             run's span).</p>\n",
        );
        return;
    }
    h.push_str("<ul class=\"advice\">");
    for a in items {
        let _ = write!(
            h,
            "<li><b>{}</b>: {}<br><small>{}</small>",
            esc(&a.title),
            esc(&a.summary),
            esc(&a.evidence)
        );
        if let Some(act) = &a.action {
            let _ = write!(h, "<br><code>{}</code>", esc(act));
        }
        h.push_str("</li>");
    }
    h.push_str("</ul>\n");
}

fn environment_section(h: &mut String, r: &Report) {
    h.push_str("<h2>Environment</h2><table class=\"environment\">");
    for (k, v) in super::environment_rows(r) {
        let _ = write!(h, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(&v));
    }
    h.push_str("</table>\n");
}

/// An event's name and its other fields as `key=value` pairs.
pub fn event_cells(e: &crate::supervisor::EventRecord) -> (String, String) {
    let value = serde_json::to_value(&e.event).unwrap_or_default();
    let mut name = String::new();
    let mut parts = Vec::new();
    if let serde_json::Value::Object(map) = value {
        for (k, v) in map {
            match (k.as_str(), v) {
                ("event", serde_json::Value::String(s)) => name = s,
                (_, serde_json::Value::Null) => {}
                (k, serde_json::Value::String(s)) => parts.push(format!("{k}={s}")),
                (k, v) => parts.push(format!("{k}={v}")),
            }
        }
    }
    (name, parts.join(" "))
}
