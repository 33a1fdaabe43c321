//! `doctor`'s XID line: an XID heard within the last hour ([`XID_RECENT_S`]) is a problem.
//! One that is usually the application's (13, 31, 43, 45) is a warning; any other, the GPU's
//! memory, link, board, driver or firmware, or a number the catalog does not know, a failure.
//!
//! XIDs are events, not a state NVML can be asked for: only a listener hears them. With a
//! daemon running, the report has what it heard since it started; without one, only what
//! `doctor` heard while it ran, and the line says so.

use serde::{Deserialize, Serialize};

use super::checks::{Check, GpuFacts, Status};
use crate::telemetry::xid::{Blame, XID_RECENT_S, explain};
use crate::units::format_duration;

/// Who listened for the XIDs a report has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum XidsHeard {
    /// The running daemon, since it started.
    Daemon { now_s: f64 },
    /// `doctor` itself, for `listened_s` seconds (no daemon runs).
    Doctor { now_s: f64, listened_s: f64 },
}

impl Default for XidsHeard {
    fn default() -> Self {
        XidsHeard::Doctor {
            now_s: 0.0,
            listened_s: 0.0,
        }
    }
}

impl XidsHeard {
    fn now_s(&self) -> f64 {
        match self {
            XidsHeard::Daemon { now_s } | XidsHeard::Doctor { now_s, .. } => *now_s,
        }
    }
}

/// The `xid` line.
pub fn xid_check(gpus: &[GpuFacts], heard: &XidsHeard) -> Check {
    let now = heard.now_s();
    let listening: Vec<&GpuFacts> = gpus.iter().filter(|g| g.xids.is_some()).collect();
    let line = |status, detail| Check {
        name: "xid".into(),
        status,
        detail,
    };
    if listening.is_empty() {
        return line(
            Status::Info,
            "XID errors cannot be heard: the GPUs (or this NVML library) do not support events"
                .into(),
        );
    }
    let mut worst = Status::Ok;
    let mut found = Vec::new();
    for g in &listening {
        let recent: Vec<_> = g
            .xids
            .iter()
            .flatten()
            .filter(|x| now - x.time_s <= XID_RECENT_S)
            .collect();
        // The GPU's most serious recent XID, the newest of those.
        let Some(x) = recent
            .iter()
            .rev()
            .find(|x| explain(x.xid).blame != Blame::Application)
            .or(recent.last())
        else {
            continue;
        };
        let info = explain(x.xid);
        let status = match info.blame {
            Blame::Application => Status::Warn,
            _ => Status::Fail,
        };
        worst = worst.max(status);
        let more = match recent.len() {
            1 => String::new(),
            n => format!(" ({n} XIDs in the last hour)"),
        };
        found.push(format!(
            "GPU {}: {} {} ago{more}: {}",
            g.index,
            info.title(),
            format_duration(now - x.time_s),
            info.action
        ));
    }
    let scope = match heard {
        XidsHeard::Daemon { .. } => "heard by the daemon".to_string(),
        XidsHeard::Doctor { listened_s, .. } => format!(
            "no daemon runs, so only the {listened_s:.0} s doctor listened; `gpupilot daemon --detach` keeps listening"
        ),
    };
    let deaf = gpus.len() - listening.len();
    let deaf_note = match deaf {
        0 => String::new(),
        n => format!(
            "; {n} GPU{} without XID events",
            if n == 1 { "" } else { "s" }
        ),
    };
    if found.is_empty() {
        line(
            Status::Ok,
            format!("no XID error in the last hour ({scope}){deaf_note}"),
        )
    } else {
        line(worst, format!("{} ({scope})", found.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::xid::XidEvent;

    fn gpu(i: u32, xids: Option<Vec<XidEvent>>) -> GpuFacts {
        GpuFacts {
            index: i,
            xids,
            ..GpuFacts::default()
        }
    }

    const NOW: XidsHeard = XidsHeard::Daemon { now_s: 10_000.0 };

    #[test]
    fn a_hardware_xid_in_the_last_hour_fails_an_application_one_warns() {
        let c = xid_check(
            &[
                gpu(0, Some(vec![XidEvent::new(79, 9_880.0)])),
                gpu(1, Some(vec![])),
            ],
            &NOW,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail
                .starts_with("GPU 0: XID 79 (GPU has fallen off the bus) 2m00s ago: reset"),
            "{}",
            c.detail
        );
        let c = xid_check(&[gpu(0, Some(vec![XidEvent::new(13, 9_990.0)]))], &NOW);
        assert_eq!(c.status, Status::Warn);
        // The serious one is named even when an application XID came after it.
        let c = xid_check(
            &[gpu(
                3,
                Some(vec![XidEvent::new(48, 9_000.0), XidEvent::new(45, 9_500.0)]),
            )],
            &NOW,
        );
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("XID 48") && c.detail.contains("(2 XIDs in the last hour)"));
    }

    #[test]
    fn old_none_and_unheard() {
        let old = xid_check(&[gpu(0, Some(vec![XidEvent::new(79, 1.0)]))], &NOW);
        assert_eq!(old.status, Status::Ok, "{}", old.detail);
        let c = xid_check(
            &[gpu(0, Some(vec![])), gpu(1, None)],
            &XidsHeard::Doctor {
                now_s: 5.0,
                listened_s: 1.0,
            },
        );
        assert_eq!(c.status, Status::Ok);
        assert!(
            c.detail.contains("only the 1 s doctor listened"),
            "{}",
            c.detail
        );
        assert!(
            c.detail.ends_with("; 1 GPU without XID events"),
            "{}",
            c.detail
        );
        let none = xid_check(&[gpu(0, None)], &NOW);
        assert_eq!(none.status, Status::Info);
    }
}
