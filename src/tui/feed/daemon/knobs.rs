//! The watched run's metrics and knobs, and the console's knob changes, for the daemon feed.
//!
//! Metrics are read with `run_metrics` after the run's log at every poll: the first time from
//! the newest [`KEPT_POINTS`] reports (a long run's early reports are skipped, not read and
//! dropped), then from where the last read ended. They are a nicety: a daemon that cannot
//! answer leaves the Run view's band out and puts nothing in the footer. A knob change goes
//! out with `knob_set`; its answer comes back for the footer, except a refusal because the
//! change needs a restart, which comes back as [`Update::KnobNeedsRestart`] so the console can
//! ask before asking again.

use super::{Done, Watch, Worker};
use crate::client::ClientError;
use crate::protocol::{ErrorCode, KnobName, KnobVia};
use crate::tui::feed::Update;
use crate::tui::metrics::KEPT_POINTS;

/// `run_metrics` calls per poll: one answer holds at most 5,000 reports, so a run that
/// reports faster than that per refresh is caught up over several polls.
const CALLS_PER_POLL: usize = 4;

/// Why a change is made, as the run's and the node's events record it.
const WHY: &str = "gpupilot console";

impl Worker {
    /// New reports and the trainer's state of the watched run; passed on when anything changed.
    pub(super) fn poll_metrics(&self, w: &mut Watch) -> Result<Result<(), ClientError>, Done> {
        let Some(client) = &self.client else {
            return Ok(Ok(()));
        };
        let reset = w.metrics_next.is_none();
        let mut since = w.metrics_next.unwrap_or(0);
        let mut skipped = false;
        let mut points = Vec::new();
        let mut trainer = None;
        for _ in 0..CALLS_PER_POLL {
            let m = match client.run_metrics(&w.run, since) {
                Ok(m) => m,
                Err(e @ (ClientError::Closed { .. } | ClientError::Io(_))) => return Ok(Err(e)),
                Err(e) if e.code() == Some(ErrorCode::UnknownRun) => return Ok(Err(e)),
                Err(_) => return Ok(Ok(())),
            };
            // One past the newest report the daemon has.
            let end = m.trainer.last.as_ref().map_or(m.next, |p| p.n + 1);
            if reset && !skipped && end.saturating_sub(since) > KEPT_POINTS as u64 {
                skipped = true;
                since = end - KEPT_POINTS as u64;
                continue;
            }
            let caught_up = m.points.is_empty() || m.next >= end;
            since = m.next;
            points.extend(m.points);
            trainer = Some(m.trainer);
            if caught_up {
                break;
            }
        }
        let Some(trainer) = trainer else {
            return Ok(Ok(()));
        };
        w.metrics_next = Some(since);
        if reset || !points.is_empty() || w.trainer.as_ref() != Some(&trainer) {
            w.trainer = Some(trainer.clone());
            self.send(Update::Metrics {
                run: w.run.clone(),
                points,
                reset,
                trainer: Box::new(trainer),
            })?;
        }
        Ok(Ok(()))
    }

    /// Ask the daemon for a knob change; say how it went.
    pub(super) fn set_knob(
        &mut self,
        run: String,
        knob: KnobName,
        value: i64,
        restart: bool,
    ) -> Result<(), Done> {
        let Some(client) = &self.client else {
            return self.send(Update::Answer {
                ok: false,
                text: "the daemon is gone: start it again with `gpupilot daemon --detach`".into(),
            });
        };
        match client.knob_set(&run, knob, value, restart, Some(WHY.into())) {
            Ok(p) => {
                let old = p.old.map_or_else(|| "?".to_string(), |o| o.to_string());
                let text = match (p.via, p.ranks, p.apply_step) {
                    (KnobVia::Trainer, Some(n), Some(step)) => {
                        format!("{knob} {old} → {value} proposed to {n} ranks for step {step}")
                    }
                    (KnobVia::Trainer, ..) => format!("{knob} {old} → {value} sent to the trainer"),
                    (KnobVia::Restart, ..) => {
                        format!("{knob} {old} → {value}: restarting run {} with it", p.run)
                    }
                };
                self.send(Update::Answer { ok: true, text })?;
                // The knob panel shows the change pending at once.
                self.poll()
            }
            Err(ClientError::Daemon {
                code: ErrorCode::RestartNeeded,
                message,
            }) if !restart => self.send(Update::KnobNeedsRestart {
                run,
                knob,
                value,
                text: message,
            }),
            Err(e) => self.failed(e),
        }
    }
}
