//! What an event's detail shows besides its words: the numbers recorded with it and the
//! command that undoes it; and which run or GPUs it is about (`gpupilot events --run/--gpu`).

use crate::control::power::watts;
use crate::protocol::NodeEvent;

/// The command that undoes the event, when one does: `gpupilot power cap 700 --gpu 1`,
/// `gpupilot set RUN batch-size 256`.
pub fn undo(e: &NodeEvent) -> Option<String> {
    /// `700 W` → `700`; a number a command takes back.
    fn number(s: &str, unit: &str) -> Option<String> {
        let n = s.strip_suffix(unit)?.trim();
        n.parse::<f64>().ok().map(|_| n.to_string())
    }
    match e {
        NodeEvent::GpuChanged { gpu, what, old, .. } => {
            let old = old.as_deref();
            match what.as_str() {
                "power_limit" => Some(match old.and_then(|o| number(o, "W")) {
                    Some(w) => format!("gpupilot power cap {w} --gpu {gpu}"),
                    None => format!("gpupilot power reset --gpu {gpu}"),
                }),
                "locked_clocks" => {
                    let range = old.and_then(|o| o.strip_suffix("MHz")).and_then(|r| {
                        let (a, b) = r.trim().split_once('–')?;
                        Some((a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?))
                    });
                    Some(match range {
                        Some((a, b)) => format!("gpupilot clocks lock {a} {b} --gpu {gpu}"),
                        None => format!("gpupilot clocks reset --gpu {gpu}"),
                    })
                }
                "gpu_max_temp" => Some(match old.and_then(|o| number(o, "°C")) {
                    Some(c) => format!("gpupilot power gpu-max {c} --gpu {gpu}"),
                    None => format!("gpupilot power gpu-max reset --gpu {gpu}"),
                }),
                _ => None,
            }
        }
        NodeEvent::PowerChangedOutside { gpu, old_w, .. } => {
            Some(format!("gpupilot power cap {old_w:.0} --gpu {gpu}"))
        }
        NodeEvent::KnobChanged {
            run,
            knob,
            old: Some(old),
            ..
        } => Some(format!("gpupilot set {run} {} {old}", knob.cli_name())),
        NodeEvent::Governor { gpu, change, .. } if change == "on" || change == "cap" => {
            Some(format!("gpupilot thermal off --gpu {gpu}"))
        }
        NodeEvent::Budget {
            budget_w: Some(_),
            caps,
            ..
        } if caps.is_empty() => Some("gpupilot budget off".into()),
        NodeEvent::Tune { job, change, .. }
            if matches!(
                change.as_str(),
                "started" | "cap" | "measured" | "batch" | "clock" | "clock_measured"
            ) =>
        {
            Some(format!("gpupilot tune stop {job}"))
        }
        NodeEvent::RunStarted { run, .. } => Some(format!("gpupilot stop {run}")),
        _ => None,
    }
}

/// The numbers recorded with the event, in words with their units: `("cap", "600 W")`.
pub fn numbers(e: &NodeEvent) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let value = serde_json::to_value(e).unwrap_or_default();
    collect_numbers("", &value, &mut out);
    // A clock search's values sit in the tune event's watt fields: they are MHz.
    if let NodeEvent::Tune {
        change,
        old_w,
        cap_w,
        ..
    } = e
    {
        if change.starts_with("clock") {
            out.retain(|(name, _)| name != "cap" && name != "old");
            let mhz = |v: f64| format!("{v:.0} MHz");
            out.extend(old_w.map(|v| ("SM clock lock before".to_string(), mhz(v))));
            out.extend(cap_w.map(|v| ("SM clock lock".to_string(), mhz(v))));
        }
    }
    out
}

fn collect_numbers(prefix: &str, v: &serde_json::Value, out: &mut Vec<(String, String)>) {
    let Some(map) = v.as_object() else { return };
    for (k, v) in map {
        let label = |name: &str| {
            let name = name.replace('_', " ");
            if prefix.is_empty() {
                name
            } else {
                format!("{prefix} {name}")
            }
        };
        match v {
            // Seconds since the epoch: the record's time says when.
            serde_json::Value::Number(_) if k == "since_s" => {}
            serde_json::Value::Number(n) => {
                let Some(x) = n.as_f64() else { continue };
                let (name, shown) = if let Some(s) = k.strip_suffix("_w") {
                    (s, watts(x))
                } else if let Some(s) = k.strip_suffix("_c") {
                    (s, format!("{} °C", plain(x)))
                } else if let Some(s) = k.strip_suffix("_ms") {
                    (s, format!("{x:.1} ms"))
                } else if let Some(s) = k.strip_suffix("_s") {
                    (s, format!("{x:.1} s"))
                } else {
                    (k.as_str(), plain(x))
                };
                out.push((label(name), shown));
            }
            serde_json::Value::Object(_) => collect_numbers(&label(k), v, out),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    collect_numbers(&label(&format!("{k} {}", i + 1)), item, out);
                }
            }
            _ => {}
        }
    }
}

/// Whether the event is about run `id` (its own events, its tuning job's, its alerts).
pub fn about_run(e: &NodeEvent, id: &str) -> bool {
    let v = serde_json::to_value(e).unwrap_or_default();
    v["run"].as_str() == Some(id) || v["alert"]["run"].as_str() == Some(id)
}

/// Whether the event is about one of `gpus`: a GPU's setting, its alert, an XID, a cap the
/// governor, the budget or the tuner moved.
pub fn about_gpu(e: &NodeEvent, gpus: &[u32]) -> bool {
    let v = serde_json::to_value(e).unwrap_or_default();
    let is = |x: &serde_json::Value| {
        x.as_u64()
            .is_some_and(|g| gpus.iter().any(|&w| u64::from(w) == g))
    };
    is(&v["gpu"])
        || is(&v["alert"]["gpu"])
        || v["gpus"].as_array().is_some_and(|a| a.iter().any(is))
        || v["caps"]
            .as_array()
            .is_some_and(|a| a.iter().any(|c| is(&c["gpu"])))
}

/// `91` for 91.0, `0.1235` for 0.12345: no trailing zeros.
fn plain(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        let s = format!("{x:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
