//! A run's trainer and its knobs: `knob_set` (a client's change, carried to the trainer), and
//! the trainer channel: `trainer_attach` (a connection's first message becomes its trainer
//! side, [`Channel`]), then `metrics`, `knob_ack`, `knob_vote` and `trainer_error` on it. The
//! knobs' state machine (proposals, votes, apply steps, acknowledgements, for one rank or
//! many) is the runs part's (`super::super::runs`).

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Class, Sender, not_of};
use crate::daemon::auth::Access;
use crate::daemon::base::RequestError;
use crate::daemon::runs::trainers::Attach;
use crate::daemon::state::Daemon;
use crate::ipc::Peer;
use crate::protocol::{ErrorCode, Request, Response};

pub(super) fn class(request: &Request) -> Option<Class> {
    let sender = match request {
        Request::KnobSet { .. } => return Some(Class::new(Sender::Client, Access::Runs, true)),
        Request::TrainerAttach { .. }
        | Request::Metrics(_)
        | Request::KnobAck { .. }
        | Request::KnobVote { .. }
        | Request::TrainerError { .. } => Sender::Trainer,
        _ => return None,
    };
    Some(Class::new(sender, Access::Runs, false))
}

/// A client's request of this family: `knob_set`. The trainer channel's belong to a
/// trainer's connection ([`Channel`]).
pub(super) fn answer(
    daemon: &Daemon,
    peer: &Peer,
    request: Request,
) -> Result<Response, RequestError> {
    match request {
        Request::KnobSet {
            run,
            knob,
            value,
            restart,
            why,
        } => daemon.runs.knob_set(peer, &run, knob, value, restart, why),
        Request::TrainerAttach { .. }
        | Request::Metrics(_)
        | Request::KnobAck { .. }
        | Request::KnobVote { .. }
        | Request::TrainerError { .. } => Err(RequestError::new(
            ErrorCode::BadRequest,
            "trainer requests belong to a trainer's connection",
        )),
        other => Err(not_of("trainer", &other)),
    }
}

impl Daemon {
    /// `trainer_attach` on connection `conn` (`tx`: its queue, where knob changes are pushed
    /// later): the run's id, the rank the trainer said it is, the answer, and the knob pushes
    /// to send after it. Blocking (it may wait for a run still being launched); tests call it
    /// without a socket.
    pub fn trainer_attach(
        &self,
        conn: u64,
        tx: mpsc::Sender<String>,
        ask: Attach,
    ) -> Result<(String, Option<u32>, Response, Vec<String>), RequestError> {
        self.runs.trainer_attach(conn, tx, ask)
    }
}

/// The trainer side of one connection: none until it says `trainer_attach`, then the run
/// (and the rank, in a run of several) it speaks for.
#[derive(Debug, Default)]
pub struct Channel {
    run: Option<String>,
    rank: Option<u32>,
}

impl Channel {
    /// Whether the connection is a run's trainer.
    pub fn attached(&self) -> bool {
        self.run.is_some()
    }

    /// Answer a trainer channel's request on connection `conn` (`tx`: its queue, where knob
    /// changes are pushed later): the answer, and the frames to send after it.
    pub async fn answer(
        &mut self,
        daemon: &Arc<Daemon>,
        conn: u64,
        tx: &mpsc::Sender<String>,
        request: Request,
    ) -> (Response, Vec<String>) {
        let Some(run) = self.run.as_deref() else {
            return match request {
                Request::TrainerAttach {
                    run,
                    pid,
                    knobs,
                    ranges,
                    rank,
                    software,
                } => {
                    let ask = Attach {
                        run,
                        pid,
                        rank,
                        knobs,
                        ranges,
                        software,
                    };
                    self.attach(daemon, conn, tx, ask).await
                }
                _ => (
                    RequestError::new(
                        ErrorCode::BadState,
                        "attach first: send trainer_attach with the run's id (GPUPILOT_RUN_ID)",
                    )
                    .into_response(),
                    Vec::new(),
                ),
            };
        };
        // Small and frequent: answered on the connection's task, without a hop to the
        // blocking pool, so that a knob's round trip stays short.
        let runs = &daemon.runs;
        let rank = self.rank;
        let response = match request {
            Request::TrainerAttach { .. } => RequestError::new(
                ErrorCode::BadRequest,
                "this connection is already a trainer; open another to attach again",
            )
            .into_response(),
            Request::Metrics(report) => runs.trainer_metrics(run, rank, report),
            Request::KnobAck {
                seq,
                applied,
                reason,
                step,
            } => runs.knob_ack(run, rank, seq, applied, reason, step),
            Request::KnobVote {
                seq,
                ready,
                reason,
                step,
            } => runs.knob_vote(run, rank, seq, ready, reason, step),
            Request::TrainerError {
                kind,
                message,
                batch_size: _,
            } => runs.trainer_error(run, kind, message),
            other => not_of("trainer channel", &other).into_response(),
        };
        (response, Vec::new())
    }

    /// `trainer_attach`, in the blocking pool (it may wait for a run still being launched).
    async fn attach(
        &mut self,
        daemon: &Arc<Daemon>,
        conn: u64,
        tx: &mpsc::Sender<String>,
        ask: Attach,
    ) -> (Response, Vec<String>) {
        let daemon = Arc::clone(daemon);
        let tx = tx.clone();
        let answer =
            tokio::task::spawn_blocking(move || daemon.trainer_attach(conn, tx, ask)).await;
        match answer {
            Ok(Ok((run, rank, response, pushes))) => {
                self.run = Some(run);
                self.rank = rank;
                (response, pushes)
            }
            Ok(Err(e)) => (e.into_response(), Vec::new()),
            Err(e) => {
                tracing::error!("answering trainer_attach: {e}");
                let e = RequestError::new(
                    ErrorCode::Internal,
                    "the daemon failed answering trainer_attach; see its log",
                );
                (e.into_response(), Vec::new())
            }
        }
    }

    /// The connection closed: a trainer's run hears it has gone.
    pub fn close(&mut self, daemon: &Daemon, conn: u64) {
        if self.run.take().is_some() {
            daemon.runs.trainer_detached(conn);
        }
    }
}
