//! The synthetic trainer's trainer channel: attach (with the rank, for a job of several), knob
//! changes in (immediate for a single process, proposed–voted–decided for a rank), votes,
//! acknowledgements and reports out, and the SM clocks of the job's GPUs from the daemon's
//! newest telemetry snapshot.

use crossbeam_channel::RecvTimeoutError;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::model::Model;
use super::staging::{Ack, Staging};
use crate::client::{Client, Push};
use crate::protocol::{MetricsReport, RankSpec, Request, Response};

/// The trainer channel, when the environment names one (`GPUPILOT_SOCKET`, `GPUPILOT_RUN_ID`).
pub(super) struct Channel {
    client: Client,
}

impl Channel {
    /// Attach to the run the environment names; `rank` is None for a single process. A rank's
    /// GPU UUID is read from the daemon's snapshot, so the daemon can match it to telemetry.
    pub(super) fn open(model: &Model, rank: Option<RankSpec>) -> Option<Channel> {
        let socket = std::env::var_os("GPUPILOT_SOCKET")?;
        let run = std::env::var("GPUPILOT_RUN_ID").ok()?;
        let client = match Client::connect_to(
            std::path::Path::new(&socket),
            concat!("gpupilot-synthetic-trainer ", env!("CARGO_PKG_VERSION")),
        ) {
            Ok(c) => c.with_timeout(Duration::from_secs(5)),
            Err(e) => {
                eprintln!("gpupilot: training without the trainer channel: {e}");
                return None;
            }
        };
        let rank = rank.map(|mut spec| {
            if spec.gpu_uuid.is_none() {
                spec.gpu_uuid = spec.gpu.and_then(|g| gpu_uuid(&client, g));
            }
            spec
        });
        let request = Request::TrainerAttach {
            run,
            pid: Some(std::process::id()),
            knobs: BTreeMap::from([
                ("batch_size".into(), i64::from(model.config.batch_size)),
                ("prefetch".into(), i64::from(model.config.prefetch_depth)),
            ]),
            ranges: BTreeMap::new(),
            rank,
            // The synthetic trainer trains no framework: it names itself.
            software: BTreeMap::from([(
                "gpupilot_synthetic".into(),
                env!("CARGO_PKG_VERSION").into(),
            )]),
        };
        match client.request(request) {
            Ok(Response::TrainerAttached { .. }) => {}
            Ok(other) => {
                eprintln!("gpupilot: the daemon refused the trainer: {other:?}");
                return None;
            }
            Err(e) => {
                eprintln!("gpupilot: the daemon refused the trainer: {e}");
                return None;
            }
        }
        Some(Channel { client })
    }

    /// Take every knob push that has arrived: a change without an apply step is applied at
    /// once and acknowledged; a proposal is voted on and staged; a decision is noted.
    pub(super) fn take_knobs(&self, model: &mut Model, staging: &mut Staging) {
        while let Ok(update) = self.client.updates().try_recv() {
            self.take(update, model, staging);
        }
    }

    /// Spend `d` (a step's time) answering knob pushes as they arrive, as a trainer's channel
    /// thread does while its GPU computes: a vote goes out at once, and a decision that comes
    /// during the step before the apply step is known when that step starts.
    pub(super) fn wait(&self, d: Duration, model: &mut Model, staging: &mut Staging) {
        let until = Instant::now() + d;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            match self.client.updates().recv_timeout(left) {
                Ok(update) => self.take(update, model, staging),
                Err(RecvTimeoutError::Timeout) => return,
                Err(RecvTimeoutError::Disconnected) => return std::thread::sleep(left),
            }
        }
    }

    fn take(&self, update: Push, model: &mut Model, staging: &mut Staging) {
        match update {
            Push::Knob {
                seq,
                knob,
                value,
                apply_step: None,
                ..
            } => {
                let (applied, reason) = match model.set(knob, value) {
                    Ok(()) => (true, None),
                    Err(e) => (false, Some(e.to_string())),
                };
                let _ = self.client.request(Request::KnobAck {
                    seq,
                    applied,
                    reason,
                    step: None,
                });
            }
            Push::Knob {
                seq,
                knob,
                value,
                apply_step: Some(at),
                ..
            } => {
                let vote = staging.propose(model, seq, knob, value, at);
                let _ = self.client.request(Request::KnobVote {
                    seq: vote.seq,
                    ready: vote.ready,
                    reason: vote.reason,
                    step: Some(vote.step),
                });
            }
            Push::KnobDecision { seq, commit, .. } => staging.decide(seq, commit),
            _ => {}
        }
    }

    /// Acknowledge changes applied (or dropped) at a step.
    pub(super) fn ack(&self, acks: Vec<Ack>) {
        for a in acks {
            let _ = self.client.request(Request::KnobAck {
                seq: a.seq,
                applied: a.applied,
                reason: a.reason,
                step: Some(a.step),
            });
        }
    }

    /// The SM clock of each of `gpus` in the daemon's newest snapshot (one read for all, so
    /// every rank paces by the same moment); a GPU the snapshot lacks is left out.
    pub(super) fn sm_clocks(&self, gpus: &[u32]) -> Option<BTreeMap<u32, f64>> {
        let status = self.client.status().ok()?;
        let snap = status.snapshot?;
        Some(
            snap.gpus
                .iter()
                .filter(|g| gpus.contains(&g.index) && !g.lost)
                .filter_map(|g| Some((g.index, f64::from(g.sm_clock_mhz?))))
                .collect(),
        )
    }

    pub(super) fn report(&self, report: MetricsReport) {
        let _ = self.client.request(Request::Metrics(report));
    }

    pub(super) fn error(&self, kind: &str, message: &str, batch: u32) {
        let _ = self.client.request(Request::TrainerError {
            kind: kind.into(),
            message: Some(message.into()),
            batch_size: Some(i64::from(batch)),
        });
    }
}

/// GPU `index`'s UUID in the daemon's newest snapshot.
fn gpu_uuid(client: &Client, index: u32) -> Option<String> {
    let snap = client.status().ok()?.snapshot?;
    snap.gpus.into_iter().find(|g| g.index == index)?.uuid
}
