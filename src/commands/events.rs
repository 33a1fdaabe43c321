//! `gpupilot events`: the node's event log from the daemon, in the words of the console's
//! Events view ([`crate::protocol::event_words`]), or as JSON lines; `--follow` polls for new
//! events until Ctrl-C or until the daemon goes away.

use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::cli::EventsArgs;
use crate::client::{Client, ClientError};
use crate::config::Paths;
use crate::protocol::NodeEventRecord;
use crate::protocol::event_words::{about_gpu, about_run, undo, words};
use crate::text::printable;

use super::follow::{lost_reason, sleep_unless_stopped};
use super::{connect, ctrl_c_flag, is_broken_pipe, out};

/// How often a follower asks for new events.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// Which events to print.
struct Filter {
    /// Unix seconds: events before it are left out.
    since: Option<f64>,
    run: Option<String>,
    gpus: Vec<u32>,
}

impl Filter {
    fn keeps(&self, r: &NodeEventRecord) -> bool {
        let after = self.since.is_none_or(|since| {
            crate::time::parse_rfc3339(&r.time)
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .is_some_and(|t| t.as_secs_f64() >= since)
        });
        after
            && self.run.as_deref().is_none_or(|id| about_run(&r.event, id))
            && (self.gpus.is_empty() || about_gpu(&r.event, &self.gpus))
    }
}

/// One event as `gpupilot events` prints it: `2026-11-30T04:07:55Z  who: what change — why`,
/// or (`json`) its fields with its words (`text`) and `undo`.
pub fn format(r: &NodeEventRecord, json: bool) -> String {
    let text = words(&r.event).line();
    if json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("text".into(), text.into());
            o.insert("undo".into(), undo(&r.event).into());
        }
        return format!("{v}\n");
    }
    // Milliseconds left out: a second is what a person reads.
    let time = match (r.time.get(..19), r.time.ends_with('Z')) {
        (Some(t), true) => format!("{t}Z"),
        _ => r.time.clone(),
    };
    format!("{}  {}\n", printable(&time), printable(&text))
}

/// `gpupilot events [--since T] [--follow] [--json] [--run RUN] [--gpu I,J]`.
pub fn events(args: &EventsArgs) -> anyhow::Result<ExitCode> {
    let client = connect(&Paths::from_env())?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let run = match &args.run {
        // Resolved once: `last` must not move to a newer run while we follow.
        Some(spec) => Some(client.run(spec)?.id),
        None => None,
    };
    let filter = Filter {
        since: args.since.map(|w| w.resolve(now)),
        run,
        gpus: args.gpu.clone(),
    };
    let stop = if args.follow {
        ctrl_c_flag()
    } else {
        Default::default()
    };
    match pump(&client, &filter, args.json, args.follow, &stop) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if is_broken_pipe(&e) => Ok(ExitCode::SUCCESS),
        Err(e) => Err(e),
    }
}

/// Print the kept events the filter keeps, then (`follow`) new ones as they come, until
/// `stop` turns true or the daemon goes away.
fn pump(
    client: &Client,
    filter: &Filter,
    json: bool,
    follow: bool,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let mut next = 0;
    loop {
        // Every event after `next`, a bounded answer at a time.
        loop {
            let (batch, after) = match client.events(next) {
                Ok(b) => b,
                Err(e) if follow && gone(&e) => anyhow::bail!(
                    "the daemon went away ({}): no more events to follow; start one with \
                     `gpupilot daemon --detach` and run `gpupilot events` again",
                    lost_reason(&e)
                ),
                Err(e) => return Err(e.into()),
            };
            let text: String = batch
                .iter()
                .filter(|r| filter.keeps(r))
                .map(|r| format(r, json))
                .collect();
            out(&text)?;
            if batch.is_empty() || after <= next {
                break;
            }
            next = after;
        }
        if !follow || sleep_unless_stopped(POLL_EVERY, stop) {
            return Ok(());
        }
    }
}

/// Whether `e` says the daemon is no longer there.
fn gone(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Closed { .. } | ClientError::Io(_) | ClientError::Timeout { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::NodeEvent;

    fn rec(time: &str, gpu: u32) -> NodeEventRecord {
        NodeEventRecord {
            seq: 7,
            time: time.into(),
            event: NodeEvent::GpuChanged {
                gpu,
                what: "power_limit".into(),
                old: Some("700 W".into()),
                new: Some("300 W".into()),
                by: "root (uid 0) via gpupilot (pid 9)".into(),
                why: None,
            },
        }
    }

    #[test]
    fn a_line_has_the_time_and_the_words() {
        let r = rec("2026-11-30T04:07:55.652Z", 1);
        assert_eq!(
            format(&r, false),
            "2026-11-30T04:07:55Z  root (uid 0) via gpupilot (pid 9): GPU 1 power limit \
             700 W → 300 W\n"
        );
        let v: serde_json::Value = serde_json::from_str(&format(&r, true)).unwrap();
        assert_eq!(v["event"], "gpu_changed");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["old"], "700 W");
        assert_eq!(v["undo"], "gpupilot power cap 700 --gpu 1");
        assert!(v["text"].as_str().unwrap().ends_with("700 W → 300 W"));
    }

    #[test]
    fn the_filter_keeps_what_it_names() {
        let t0 = crate::time::parse_rfc3339("2026-11-30T04:00:00Z")
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let f = Filter {
            since: Some(t0),
            run: None,
            gpus: vec![1],
        };
        assert!(f.keeps(&rec("2026-11-30T04:07:55.652Z", 1)));
        assert!(!f.keeps(&rec("2026-11-30T03:59:59.999Z", 1)), "before");
        assert!(!f.keeps(&rec("2026-11-30T04:07:55.652Z", 0)), "another GPU");
        let by_run = Filter {
            since: None,
            run: Some("r1".into()),
            gpus: vec![],
        };
        assert!(!by_run.keeps(&rec("2026-11-30T04:07:55.652Z", 1)));
    }
}
