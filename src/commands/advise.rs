//! `gpupilot advise [--json] [--window SECONDS]`: the advisor's hints on the daemon's recent
//! telemetry and the live runs' metrics, each with its evidence and the command that acts on it.

use std::process::ExitCode;

use crate::advisor::{self, AdvisorInput, Hint, HintKind, Thresholds, adapt};
use crate::cli::{AdviseArgs, GlobalArgs};
use crate::client::Client;
use crate::config::Paths;
use crate::supervisor::RunStatus;

/// Reports asked for per run: as many as one `run_metrics` answer holds (the daemon's
/// `MAX_METRICS`).
const RECENT_REPORTS: u64 = 5_000;

/// `gpupilot advise`.
pub fn advise(g: &GlobalArgs, args: &AdviseArgs) -> anyhow::Result<ExitCode> {
    let client = super::connect_or_spawn(g, &Paths::from_env())?;
    let th = Thresholds {
        window_s: args.window.clamp(30.0, 3600.0),
        ..Thresholds::default()
    };
    let input = gather(&client, &th)?;
    let hints = advisor::advise(&input, &th);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&hints)?);
    } else {
        print!("{}", render(&hints, th.window_s));
    }
    Ok(ExitCode::SUCCESS)
}

/// The advisor's input from the daemon behind `client`: each GPU's history over the window
/// (completed with its newest sample) and each live run's metrics reports and knob ranges.
/// The console's advisor pane gathers it the same way.
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
    for run in client.runs()? {
        if !matches!(run.status, RunStatus::Running) {
            continue;
        }
        let gpus =
            crate::control::tuner::session::run_gpus(&run.gpus, &snap.gpus).unwrap_or_default();
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

/// A hint's kind in words.
pub fn label(k: HintKind) -> &'static str {
    match k {
        HintKind::DataStall => "data stall",
        HintKind::MemoryHeadroom => "memory headroom",
        HintKind::PowerCapThrottle => "power-cap throttling",
        HintKind::ThermalThrottle => "thermal throttling",
        HintKind::IdleDrawingPower => "idle GPU drawing power",
        HintKind::ThroughputDrop => "throughput drop",
        HintKind::Straggler => "straggler",
    }
}

/// A number with the decimals that matter (fewer as it grows) and no trailing zeros.
pub fn num(v: f64) -> String {
    let s = match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    };
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The hints for people: the summary, the numbers behind it, the command.
pub fn render(hints: &[Hint], window_s: f64) -> String {
    if hints.is_empty() {
        return format!(
            "no hints: nothing in the last {:.0} s of telemetry and metrics calls for a change\n",
            window_s
        );
    }
    let mut out = String::new();
    for h in hints {
        let whose = match (&h.run, h.gpu) {
            (Some(r), _) => format!("run {r}"),
            (None, Some(g)) => format!("GPU {g}"),
            (None, None) => "node".into(),
        };
        out.push_str(&format!("{} ({whose}): {}\n", label(h.kind), h.summary));
        let numbers: Vec<String> = h
            .evidence
            .iter()
            .map(|e| {
                let unit = if e.unit.is_empty() || e.unit == "%" {
                    e.unit.clone()
                } else {
                    format!(" {}", e.unit)
                };
                format!("{} {}{unit}", e.name, num(e.value))
            })
            .collect();
        out.push_str(&format!("    evidence: {}\n", numbers.join("; ")));
        if let Some(a) = &h.action {
            out.push_str(&format!("    action:   {}\n", a.command()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advisor::{Evidence, Knob, Suggestion};

    #[test]
    fn hints_print_with_their_numbers_and_command() {
        let h = Hint {
            kind: HintKind::DataStall,
            gpu: None,
            run: Some("r1".into()),
            summary: "data stalls".into(),
            evidence: vec![
                Evidence {
                    name: "data wait share of step".into(),
                    value: 30.0,
                    unit: "%".into(),
                },
                Evidence {
                    name: "step time".into(),
                    value: 0.1,
                    unit: "s".into(),
                },
            ],
            action: Some(Suggestion::SetKnob {
                run: "r1".into(),
                knob: Knob::Prefetch,
                value: 4.0,
            }),
        };
        assert_eq!(
            render(&[h], 300.0),
            "data stall (run r1): data stalls\n    evidence: data wait share of step 30%; step time 0.1 s\n    action:   gpupilot set r1 prefetch 4\n"
        );
        assert!(render(&[], 300.0).starts_with("no hints"));
        assert_eq!(
            [num(3210.4), num(62.54), num(0.0125), num(30.0), num(-0.5)],
            ["3210", "62.5", "0.013", "30", "-0.5"]
        );
    }
}
