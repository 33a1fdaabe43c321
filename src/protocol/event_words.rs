//! A node event in words: who did it, what it is about, what changed (old → new with units),
//! and why; the numbers recorded with it; and the command that undoes it. The console's Events
//! view and `gpupilot events` both print events through here, so they say the same thing.
//!
//! One match over every [`NodeEvent`] without a wildcard: a new kind of event has to say how
//! it reads. Nothing here is a key=value or JSON dump of an event. The text is the daemon's
//! and its peers' (a run's name, a reason), so callers pass it through
//! [`crate::text::printable`] before a terminal sees it.

mod detail;

pub use detail::{about_gpu, about_run, numbers, undo};

use super::{KnobName, KnobVia, NodeEvent};
use crate::control::alerts::{Alert, AlertKind};
use crate::control::power::watts;

/// An event in words, in the columns of the Events view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Words {
    /// Who made it: `alice (uid 1000) via gpupilot (pid 4242)`, `energy tuner`, `alert`, …
    pub who: String,
    /// Who the event records (its `by`), where `who` is another: the energy tuner's caps are
    /// asked through the daemon's socket, so they are recorded as that connection's, with a
    /// why that names the tuner.
    pub through: Option<String>,
    /// What it is about: `GPU 1`, a run, `daemon`.
    pub subject: String,
    /// What changed, whole: `power limit 700 W → 300 W`.
    pub change: String,
    /// Why, as recorded (may be empty).
    pub why: String,
}

impl Words {
    /// The event on one line: `who: subject change; why`.
    pub fn line(&self) -> String {
        let mut s = if self.who == self.subject {
            self.who.clone()
        } else {
            format!("{}: {}", self.who, self.subject)
        };
        if !self.change.is_empty() {
            s.push(' ');
            s.push_str(&self.change);
        }
        if !self.why.is_empty() {
            s.push_str(" — ");
            s.push_str(&self.why);
        }
        s
    }
}

/// The kind of actor behind an event, from its `by` (the detail's "who").
pub fn actor(by: &str) -> &'static str {
    use crate::control::node::{BY_BUDGET, BY_ENERGY, BY_GOVERNOR};
    match by {
        b if b == BY_GOVERNOR => "thermal governor",
        b if b == BY_BUDGET => "node power budget",
        b if b == BY_ENERGY => "energy meter",
        "energy tuner" => "energy tuner",
        "alert" => "alert",
        "advisor" => "advisor",
        "driver" => "GPU driver",
        "daemon" => "the daemon by itself",
        "trainer" => "the run's trainer",
        "outside gpupilot" => "a tool other than gpupilot",
        b if b.contains("(uid ") || b.starts_with("uid ") => "a user",
        b if b.contains("advisor") => "advisor",
        _ => "other",
    }
}

fn gpus_word(gpus: &[u32]) -> String {
    match gpus {
        [] => String::new(),
        [g] => format!("GPU {g}"),
        gs => format!(
            "GPUs {}",
            gs.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
        ),
    }
}

fn opt_watts(w: Option<f64>) -> String {
    w.map_or("?".into(), watts)
}

fn celsius(c: f64) -> String {
    format!("{c:.0} °C")
}

fn knob_words(k: KnobName) -> &'static str {
    match k {
        KnobName::BatchSize => "batch size",
        KnobName::Prefetch => "prefetch",
    }
}

/// A GPU setting's name in words (`power_limit` → `power limit`).
fn setting_words(what: &str) -> String {
    match what {
        "gpu_max_temp" => "target temperature".into(),
        "locked_clocks" => "locked SM clocks".into(),
        w => w.replace('_', " "),
    }
}

/// An alert in words: `GPU 1 temperature 91 °C ≥ 90 °C` (raised) or what its message says.
fn alert_words(change: &str, a: &Alert) -> (String, String) {
    let subject = match (&a.gpu, &a.run) {
        (Some(g), _) => format!("GPU {g}"),
        (None, Some(r)) => format!("run {r}"),
        (None, None) => "node".into(),
    };
    let measured = match (a.kind, a.value, a.threshold) {
        (AlertKind::Temperature, Some(v), Some(t)) => {
            Some(format!("temperature {} ≥ {}", celsius(v), celsius(t)))
        }
        (AlertKind::Power, Some(v), Some(t)) => {
            Some(format!("power draw {} ≥ {}", watts(v), watts(t)))
        }
        _ => None,
    };
    let change = match (change, measured) {
        ("raised", Some(m)) => m,
        ("cleared", Some(m)) => format!("{} over (raised at {m})", a.kind.as_str()),
        ("cleared", None) => format!("{} over", a.kind.as_str()),
        (c, Some(m)) => format!("{m} ({c})"),
        ("raised", None) => a.kind.as_str().to_string(),
        (c, None) => format!("{} {c}", a.kind.as_str()),
    };
    (subject, change)
}

/// The words of a tuning job's step.
#[allow(clippy::too_many_arguments)]
fn tune_words(
    job: &str,
    run: &str,
    change: &str,
    gpus: &[u32],
    old_w: Option<f64>,
    cap_w: Option<f64>,
    cost: Option<f64>,
) -> (String, String) {
    let subject = match gpus_word(gpus) {
        g if g.is_empty() => format!("run {run}"),
        g => g,
    };
    let words = match change {
        "started" => format!("search started on run {run} (job {job})"),
        "cap" => match old_w {
            Some(o) => format!(
                "cap {} → {} (job {job}, searching)",
                watts(o),
                opt_watts(cap_w)
            ),
            None => format!("cap → {} (job {job}, searching)", opt_watts(cap_w)),
        },
        "measured" => match cost {
            Some(c) => format!(
                "measured {}: cost {c:.4} J/sample (job {job})",
                opt_watts(cap_w)
            ),
            None => format!("measured {} (job {job})", opt_watts(cap_w)),
        },
        "done" => format!("best cap {} set (job {job}, done)", opt_watts(cap_w)),
        // A clock search (`tune energy --knob clocks|both`): its values are the top of the
        // locked SM clock range, MHz.
        "clock" => match old_w {
            Some(o) => format!(
                "SM clocks locked up to {} → {} (job {job}, searching)",
                mhz(Some(o)),
                mhz(cap_w)
            ),
            None => format!(
                "SM clocks locked up to {} (job {job}, searching)",
                mhz(cap_w)
            ),
        },
        "clock_measured" => match cost {
            Some(c) => format!(
                "measured SM clocks up to {}: cost {c:.4} J/sample (job {job})",
                mhz(cap_w)
            ),
            None => format!("measured SM clocks up to {} (job {job})", mhz(cap_w)),
        },
        "clock_done" => format!(
            "best SM clock lock up to {} set (job {job}, done)",
            mhz(cap_w)
        ),
        "batch" => format!("batch size tried at {} (job {job})", opt_watts(cap_w)),
        "oom" => format!("out of memory at a larger batch (job {job})"),
        other => format!("job {job} {other}"),
    };
    (subject, words)
}

/// A clock in MHz, `?` when absent.
fn mhz(v: Option<f64>) -> String {
    v.map_or("?".into(), |v| format!("{v:.0} MHz"))
}

/// The parts of the daemon that make changes through its socket, as their whys start.
const AGENTS: [&str; 2] = ["energy tuner", "advisor"];

/// The event in words. See the module doc.
pub fn words(e: &NodeEvent) -> Words {
    let mut w = recorded(e);
    for agent in AGENTS {
        if let Some(rest) = w.why.strip_prefix(agent).and_then(|r| r.strip_prefix(": ")) {
            if w.who != agent {
                w.why = rest.to_string();
                w.through = Some(std::mem::replace(&mut w.who, agent.to_string()));
            }
            break;
        }
    }
    w
}

/// The event in the words of its fields, `who` as recorded.
fn recorded(e: &NodeEvent) -> Words {
    let w = |who: &str, subject: String, change: String, why: String| Words {
        who: who.to_string(),
        through: None,
        subject,
        change,
        why,
    };
    let or_empty = |s: &Option<String>| s.clone().unwrap_or_default();
    match e {
        NodeEvent::DaemonStarted {
            pid,
            version,
            telemetry,
            adopted,
            readonly,
        } => w(
            "daemon",
            "daemon".into(),
            format!("started (pid {pid}, {version})"),
            format!(
                "{telemetry}; {adopted} run{} adopted{}",
                if *adopted == 1 { "" } else { "s" },
                if *readonly { "; read-only" } else { "" }
            ),
        ),
        NodeEvent::DaemonStopped { pid, reason } => w(
            "daemon",
            "daemon".into(),
            format!("stopped (pid {pid})"),
            reason.clone(),
        ),
        NodeEvent::RunStarted { run, by, why, .. } => {
            w(by, run.clone(), "→ running".into(), or_empty(why))
        }
        NodeEvent::RunAdopted { run, pid, status } => w(
            "daemon",
            run.clone(),
            format!("adopted, {}", status.as_str()),
            pid.map_or(String::new(), |p| format!("pid {p}")),
        ),
        NodeEvent::RunStatus {
            run,
            old,
            new,
            by,
            why,
        } => w(
            by,
            run.clone(),
            format!("{} → {}", old.as_str(), new.as_str()),
            why.clone(),
        ),
        NodeEvent::PeerRefused { uid, pid, reason } => Words {
            who: match pid {
                Some(p) => format!("uid {uid} (pid {p})"),
                None => format!("uid {uid}"),
            },
            through: None,
            subject: "connection".into(),
            change: "refused".into(),
            why: reason.clone(),
        },
        NodeEvent::Trainer {
            run,
            attached,
            pid,
            rank,
        } => w(
            "trainer",
            run.clone(),
            match (rank, attached) {
                (Some(r), true) => format!("rank {r} attached"),
                (Some(r), false) => format!("rank {r} detached"),
                (None, true) => "attached".into(),
                (None, false) => "detached".into(),
            },
            pid.map_or(String::new(), |p| format!("pid {p}")),
        ),
        NodeEvent::RankRefused {
            run,
            rank,
            world_size,
            reason,
            ..
        } => w(
            "trainer",
            run.clone(),
            format!("rank {rank} of {world_size} refused"),
            reason.clone(),
        ),
        NodeEvent::RelayOpened {
            run, node, rank, ..
        } => w(
            "trainer",
            run.clone(),
            match rank {
                Some(r) => format!("rank {r} relayed to {node}"),
                None => format!("relayed to {node}"),
            },
            String::new(),
        ),
        NodeEvent::RelayFailed {
            run,
            node,
            rank,
            reason,
            ..
        } => w(
            "trainer",
            run.clone(),
            match rank {
                Some(r) => format!("rank {r}: no relay to {node}"),
                None => format!("no relay to {node}"),
            },
            reason.clone(),
        ),
        NodeEvent::KnobStaged {
            run,
            knob,
            value,
            apply_step,
            ranks,
            rtt_ms,
            ..
        } => w(
            "trainer",
            run.clone(),
            format!(
                "{} → {value} agreed by all {ranks} ranks",
                knob_words(*knob)
            ),
            format!("every rank applies it at step {apply_step}; agreed in {rtt_ms:.1} ms"),
        ),
        NodeEvent::KnobStray {
            run, rank, what, ..
        } => w(
            "trainer",
            run.clone(),
            rank.map_or("a rank".to_string(), |r| format!("rank {r}")),
            what.clone(),
        ),
        NodeEvent::KnobChanged {
            run,
            knob,
            old,
            new,
            via,
            by,
            why,
            ..
        } => w(
            by,
            run.clone(),
            format!(
                "{} {} → {new}",
                knob_words(*knob),
                old.map_or("?".to_string(), |o| o.to_string())
            ),
            match via {
                KnobVia::Trainer => or_empty(why),
                KnobVia::Restart => match why {
                    Some(y) => format!("by restart; {y}"),
                    None => "by restart".into(),
                },
            },
        ),
        NodeEvent::KnobApplied {
            run,
            knob,
            value,
            rtt_ms,
            ranks,
            step,
            ..
        } => w(
            "trainer",
            run.clone(),
            match (ranks, step) {
                (Some(n), Some(s)) => format!(
                    "{} = {value} applied on {n} ranks at step {s}",
                    knob_words(*knob)
                ),
                _ => format!("{} = {value} applied", knob_words(*knob)),
            },
            format!("round trip {rtt_ms:.1} ms"),
        ),
        NodeEvent::KnobRejected {
            run,
            knob,
            value,
            reason,
            kept,
            rank,
            ..
        } => {
            let k = knob_words(*knob);
            match reason.strip_prefix("called off on every rank: ") {
                // A change to several ranks that a rank refused (or that timed out): no rank
                // changed.
                Some(why) => w(
                    "trainer",
                    run.clone(),
                    format!("{k} = {value} called off"),
                    match kept {
                        Some(kv) => format!("{why}; every rank keeps {kv}"),
                        None => why.to_string(),
                    },
                ),
                None if rank.is_some() => w(
                    "trainer",
                    run.clone(),
                    format!("{k} = {value} not applied by every rank"),
                    reason.clone(),
                ),
                None => w(
                    "trainer",
                    run.clone(),
                    format!("{k} = {value} rejected"),
                    reason.clone(),
                ),
            }
        }
        NodeEvent::MetricsPreset {
            run,
            preset,
            from_profile,
        } => w(
            "daemon",
            run.clone(),
            format!("metrics read from {preset}'s log lines"),
            if *from_profile {
                "the profile's [metrics] preset".into()
            } else {
                "found in the run's output".into()
            },
        ),
        NodeEvent::TrainerError { run, kind, message } => w(
            "trainer",
            run.clone(),
            match kind.as_str() {
                "oom" => "error: out of memory".into(),
                k => format!("error: {k}"),
            },
            or_empty(message),
        ),
        NodeEvent::GpuChanged {
            gpu,
            what,
            old,
            new,
            by,
            why,
        } => w(
            by,
            format!("GPU {gpu}"),
            format!(
                "{} {} → {}",
                setting_words(what),
                old.as_deref().unwrap_or("?"),
                new.as_deref().unwrap_or("reset")
            ),
            or_empty(why),
        ),
        NodeEvent::PowerChangedOutside {
            gpu, old_w, new_w, ..
        } => w(
            "outside gpupilot",
            format!("GPU {gpu}"),
            format!("power limit {} → {}", watts(*old_w), watts(*new_w)),
            "changed outside gpupilot (power reset restores the limit before)".into(),
        ),
        NodeEvent::Xid {
            gpu,
            xid,
            name,
            repeats,
            ..
        } => {
            let info = crate::telemetry::xid::explain(*xid);
            w(
                "driver",
                format!("GPU {gpu}"),
                match repeats {
                    Some(n) => format!("XID {xid} ({n} more in a storm)"),
                    None => format!("XID {xid}"),
                },
                format!("{name}: {}; {}", info.meaning, info.action),
            )
        }
        NodeEvent::Governor {
            gpu,
            change,
            target_c,
            temperature_c,
            old_w,
            new_w,
            by,
            why,
        } => {
            let at = match (target_c, temperature_c) {
                (Some(t), Some(c)) => format!(" (target {}, at {})", celsius(*t), celsius(*c)),
                (Some(t), None) => format!(" (target {})", celsius(*t)),
                (None, Some(c)) => format!(" (at {})", celsius(*c)),
                (None, None) => String::new(),
            };
            let change = match change.as_str() {
                "cap" => format!("cap {} → {}{at}", opt_watts(*old_w), opt_watts(*new_w)),
                "on" => format!("on{at}"),
                "off" => "off".into(),
                "restored" => match (old_w, new_w) {
                    (Some(o), Some(n)) => {
                        format!("cap {} → {} (the user's cap back)", watts(*o), watts(*n))
                    }
                    _ => "the user's cap back".into(),
                },
                "implausible" => "energy counter implausible".into(),
                other => match (old_w, new_w) {
                    (Some(o), Some(n)) => format!("{other}: cap {} → {}{at}", watts(*o), watts(*n)),
                    _ => format!("{other}{at}"),
                },
            };
            w(by, format!("GPU {gpu}"), change, why.clone())
        }
        NodeEvent::Budget {
            budget_w,
            total_w,
            caps,
            by,
            why,
        } => {
            let change = if caps.is_empty() {
                match budget_w {
                    Some(b) => match total_w {
                        Some(t) => {
                            format!("node budget set to {} (caps now {})", watts(*b), watts(*t))
                        }
                        None => format!("node budget set to {}", watts(*b)),
                    },
                    None => "node budget off".into(),
                }
            } else {
                let moved: Vec<String> = caps
                    .iter()
                    .map(|c| format!("GPU {} cap {} → {}", c.gpu, watts(c.old_w), watts(c.new_w)))
                    .collect();
                match budget_w {
                    Some(b) => format!("{} (budget {})", moved.join(", "), watts(*b)),
                    None => moved.join(", "),
                }
            };
            w(by, "node".into(), change, why.clone())
        }
        NodeEvent::Alert { change, alert } => {
            let (subject, words) = alert_words(change, alert);
            w("alert", subject, words, alert.message.clone())
        }
        NodeEvent::Tune {
            job,
            run,
            change,
            gpus,
            old_w,
            cap_w,
            cost,
            why,
        } => {
            let (subject, words) = tune_words(job, run, change, gpus, *old_w, *cap_w, *cost);
            w("energy tuner", subject, words, or_empty(why))
        }
    }
}

#[cfg(test)]
mod tests;
