//! The console's feed and live knobs against a real daemon (`--source sim`, a temporary
//! GPUPILOT_HOME) and real supervised runs: the watched run's metrics and knobs come as
//! updates, a knob change asked through the request channel reaches the trainer and comes back
//! applied with its round trip, an out-of-range value is refused, and a change that needs a
//! restart comes back as a question, then restarts the run when allowed.

use std::time::Duration;

use crate::support::feed::Reader;
use crate::support::home::Home;
use gpupilot::protocol::{KnobName, KnobState};
use gpupilot::tui::feed::{DataSource, Request, Update};

const BIN: &str = env!("CARGO_BIN_EXE_gpupilot");
const WAIT: Duration = Duration::from_secs(20);

impl Reader {
    /// The numbers of every report received for `run`, in order, from its last reset on.
    fn report_numbers(&self, run: &str) -> Vec<u64> {
        let mut out = Vec::new();
        for u in &self.seen {
            if let Update::Metrics {
                run: r,
                points,
                reset,
                ..
            } = u
            {
                if r == run {
                    if *reset {
                        out.clear();
                    }
                    out.extend(points.iter().map(|p| p.n));
                }
            }
        }
        out
    }
}

fn knob_of(u: &Update, run: &str, knob: KnobName) -> Option<KnobState> {
    match u {
        Update::Metrics {
            run: r, trainer, ..
        } if r == run => trainer.knobs.iter().find(|k| k.knob == knob).cloned(),
        _ => None,
    }
}

fn profile(home: &Home, name: &str, command: &str) -> String {
    let body = format!(
        r#"name = "{name}"
[run]
command = {command}
[knobs.batch_size]
initial = 256
min = 8
max = 4096
[knobs.prefetch]
initial = 2
min = 0
max = 16
"#
    );
    let path = home.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, body).unwrap();
    path.display().to_string()
}

#[test]
fn metrics_and_knob_changes_flow_through_the_feed() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    let command = format!(r#"["{BIN}", "synthetic-train", "--speed", "4"]"#);
    let p = profile(&home, "synth", &command);
    let run = home.ok(&["run", "--detach", &p]).trim().to_string();

    let mut r = Reader::new(
        DataSource::Daemon(home.client()).start(Duration::from_millis(200)),
        WAIT,
    );
    r.send(Request::Watch(run.clone()));
    let first = r.until(
        "the run's first metrics",
        |u| matches!(u, Update::Metrics { run: x, reset: true, .. } if *x == run),
    );
    let Update::Metrics { trainer, .. } = &first else {
        unreachable!()
    };
    let batch = trainer.knobs.iter().find(|k| k.knob == KnobName::BatchSize);
    assert_eq!(
        batch.and_then(|k| k.range).map(|r| (r.min, r.max)),
        Some((8, Some(4096)))
    );
    r.until("reports from an attached trainer", |u| {
        matches!(u, Update::Metrics { run: x, points, trainer, .. }
            if *x == run && trainer.attached && !points.is_empty())
    });

    // The daemon refuses what is out of range, in words for the footer.
    r.send(Request::SetKnob {
        run: run.clone(),
        knob: KnobName::BatchSize,
        value: 99_999,
        restart: false,
    });
    let refused = r.until("the refusal", |u| matches!(u, Update::Answer { .. }));
    let Update::Answer { ok, text } = refused else {
        unreachable!()
    };
    assert!(!ok && text.contains("outside"), "{text}");

    r.send(Request::SetKnob {
        run: run.clone(),
        knob: KnobName::BatchSize,
        value: 512,
        restart: false,
    });
    let answer = r.until("the answer", |u| matches!(u, Update::Answer { .. }));
    assert_eq!(
        answer,
        Update::Answer {
            ok: true,
            text: "batch_size 256 → 512 sent to the trainer".into()
        }
    );
    let applied = r.until("the change applied, with its round trip", |u| {
        knob_of(u, &run, KnobName::BatchSize)
            .is_some_and(|k| k.value == Some(512) && k.last_outcome.as_deref() == Some("applied"))
    });
    let k = knob_of(&applied, &run, KnobName::BatchSize).unwrap();
    assert!(
        k.last_rtt_ms.is_some_and(|ms| ms > 0.0 && ms < 10_000.0),
        "{k:?}"
    );
    assert_eq!(k.pending, None);
    r.until("a report with the new batch size", |u| {
        matches!(u, Update::Metrics { run: x, points, .. }
            if *x == run && points.iter().any(|p| p.report.batch_size == Some(512)))
    });

    // Every report once, in order, with no gap.
    let ns = r.report_numbers(&run);
    assert!(ns.len() >= 2, "{ns:?}");
    assert!(
        ns.windows(2).all(|w| w[1] == w[0] + 1),
        "reports in order, once each: {ns:?}"
    );
}

#[test]
fn a_change_that_needs_a_restart_comes_back_as_a_question() {
    let home = Home::new();
    let _daemon = home.daemon(&[]);
    // No trainer channel: the value reaches the run only through its command line.
    let p = profile(&home, "plain", r#"["sleep", "600", "{batch_size}"]"#);
    let run = home.ok(&["run", "--detach", &p]).trim().to_string();

    let mut r = Reader::new(
        DataSource::Daemon(home.client()).start(Duration::from_millis(200)),
        WAIT,
    );
    r.send(Request::Watch(run.clone()));
    r.until("the run's knobs", |u| {
        knob_of(u, &run, KnobName::BatchSize).is_some()
    });
    r.send(Request::SetKnob {
        run: run.clone(),
        knob: KnobName::BatchSize,
        value: 128,
        restart: false,
    });
    let asked = r.until("the question", |u| {
        matches!(u, Update::KnobNeedsRestart { .. } | Update::Answer { .. })
    });
    let Update::KnobNeedsRestart {
        run: x,
        knob,
        value,
        text,
    } = asked
    else {
        panic!("{asked:?}")
    };
    assert_eq!(
        (x.as_str(), knob, value),
        (run.as_str(), KnobName::BatchSize, 128)
    );
    assert!(text.contains("--restart"), "{text}");

    r.send(Request::SetKnob {
        run: run.clone(),
        knob: KnobName::BatchSize,
        value: 128,
        restart: true,
    });
    let answer = r.until("the answer", |u| matches!(u, Update::Answer { .. }));
    let Update::Answer { ok, text } = answer else {
        unreachable!()
    };
    assert!(ok, "{text}");
    assert_eq!(
        text,
        format!("batch_size 256 → 128: restarting run {run} with it")
    );
    r.until("the knob at its new value", |u| {
        knob_of(u, &run, KnobName::BatchSize).is_some_and(|k| k.value == Some(128))
    });
    let _ = home.run(&["stop", &run, "--kill"], Duration::from_secs(15));
}
