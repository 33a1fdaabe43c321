//! The advisor's hints in words, for people: a kind's name, a number with the decimals that
//! matter, and the list `gpupilot advise` prints (the console's pane draws its own, with the
//! same words and numbers).

use super::{Hint, HintKind};
use crate::text::printable;

/// A hint's kind in words.
pub fn label(k: HintKind) -> &'static str {
    match k {
        HintKind::DataStall => "data stall",
        HintKind::MemoryHeadroom => "memory headroom",
        HintKind::PowerCapThrottle => "power-cap throttling",
        HintKind::ThermalThrottle => "thermal throttling",
        HintKind::IdleDrawingPower => "idle GPU drawing power",
        HintKind::MeasuredCap => "measured power curve",
        HintKind::ThroughputDrop => "throughput drop",
        HintKind::Straggler => "straggler",
        HintKind::TunedCap => "tuned cap no longer fits",
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
            (Some(r), _) => format!("run {}", printable(r)),
            (None, Some(g)) => format!("GPU {g}"),
            (None, None) => "node".into(),
        };
        // A summary may quote a GPU's name or who holds its cap: a peer's words.
        out.push_str(&format!(
            "{} ({whose}): {}\n",
            label(h.kind),
            printable(&h.summary)
        ));
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
            out.push_str(&format!("    action:   {}\n", printable(&a.command())));
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
        let hostile = Hint {
            kind: HintKind::DataStall,
            gpu: Some(0),
            run: None,
            summary: "cap held by gp\u{1b}[2J\nFAKE".into(),
            evidence: Vec::new(),
            action: None,
        };
        assert_eq!(
            render(&[hostile], 300.0),
            "data stall (GPU 0): cap held by gp\\x1b[2J\\nFAKE\n    evidence: \n"
        );
        assert_eq!(
            [num(3210.4), num(62.54), num(0.0125), num(30.0), num(-0.5)],
            ["3210", "62.5", "0.013", "30", "-0.5"]
        );
    }
}
