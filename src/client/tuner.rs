//! The daemon's client as the energy tuner's [`TunerDaemon`]: the session of
//! `control::tuner::session` reads the run, the snapshots, the reports and the power limits,
//! and sets caps, through these requests.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{Client, ClientError};
use crate::control::PowerLimits;
use crate::control::status::ControlStatus;
use crate::control::tuner::record::TuneJob;
use crate::control::tuner::session::{GpuClocks, Reports, RunSeen, TunerDaemon};
use crate::protocol::{ErrorCode, Request, Response, TargetGpus};
use crate::supervisor::RunStatus;
use crate::telemetry::Snapshot;

impl TunerDaemon for Client {
    fn run(&self, spec: &str) -> anyhow::Result<RunSeen> {
        let info = Client::run(self, spec)?;
        Ok(RunSeen {
            id: info.id,
            name: info.name,
            dir: info.dir,
            gpus: info.gpus,
            running: matches!(info.status, RunStatus::Running),
            restarting: matches!(info.status, RunStatus::Backoff),
            attempt: info.attempt,
        })
    }

    fn snapshot(&self) -> anyhow::Result<Option<Snapshot>> {
        Ok(self.status()?.snapshot)
    }

    fn reports(&self, run: &str, since: u64) -> anyhow::Result<Reports> {
        let m = self.run_metrics(run, since)?;
        Ok(Reports {
            points: m.points,
            next: m.next,
            trainer: m.trainer,
        })
    }

    fn power_limits(&self) -> anyhow::Result<Vec<(u32, Option<PowerLimits>)>> {
        let Response::Power { gpus, .. } = self.request(Request::Power {})? else {
            anyhow::bail!("the daemon answered `power` with something else");
        };
        Ok(gpus.into_iter().map(|g| (g.index, g.power)).collect())
    }

    fn clocks(&self) -> anyhow::Result<Vec<GpuClocks>> {
        let Response::Power { gpus, .. } = self.request(Request::Power {})? else {
            anyhow::bail!("the daemon answered `power` with something else");
        };
        Ok(gpus
            .into_iter()
            .map(|g| GpuClocks {
                index: g.index,
                range: g.clocks.map(|c| (c.min_mhz, c.max_mhz)),
                locked: g.locked_clocks_mhz,
            })
            .collect())
    }

    fn lock_clocks(
        &self,
        gpus: Vec<u32>,
        min_mhz: u32,
        max_mhz: u32,
        why: &str,
    ) -> anyhow::Result<()> {
        self.request(Request::ClocksLock {
            gpus: TargetGpus::Some(gpus),
            min_mhz,
            max_mhz,
            why: Some(why.to_string()),
        })?;
        Ok(())
    }

    fn reset_clocks(&self, gpus: Vec<u32>, why: &str) -> anyhow::Result<()> {
        self.request(Request::ClocksReset {
            gpus: TargetGpus::Some(gpus),
            why: Some(why.to_string()),
        })?;
        Ok(())
    }

    fn set_cap(&self, gpus: Vec<u32>, watts: f64, why: &str) -> anyhow::Result<()> {
        let request = Request::PowerCap {
            gpus: TargetGpus::Some(gpus),
            watts,
            why: Some(why.to_string()),
        };
        self.request(request)?;
        Ok(())
    }

    fn loops(&self) -> anyhow::Result<ControlStatus> {
        match self.request(Request::Thermal {})? {
            Response::Control(c) => Ok(*c),
            _ => anyhow::bail!("the daemon answered `thermal` with something else"),
        }
    }

    fn set_batch(&self, run: &str, batch: u32, why: &str) -> anyhow::Result<bool> {
        let asked = self.knob_set(
            run,
            crate::protocol::KnobName::BatchSize,
            i64::from(batch),
            false,
            Some(why.to_string()),
        );
        match asked {
            Ok(_) => Ok(true),
            Err(e) if no_trainer_now(&e) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// The daemon's answer to a knob change on a run no trainer is attached to now: one restarting
/// (after running out of memory), or one whose SDK has not reconnected to a daemon that just
/// started. The tuner asks again later rather than giving up the search.
fn no_trainer_now(e: &ClientError) -> bool {
    match e {
        ClientError::Daemon {
            code: ErrorCode::RestartNeeded,
            ..
        } => true,
        ClientError::Daemon {
            code: ErrorCode::BadState,
            message,
        } => message.starts_with("no trainer is attached"),
        _ => false,
    }
}

impl Client {
    /// One step of following tuning job `job`: `tune_stop` once `stop` has turned true (once:
    /// `stopping` remembers it was answered), else `tune_status`; the job as it stands. The CLI
    /// and the console follow a job the same way.
    pub fn tune_follow(
        &self,
        job: &str,
        stop: &AtomicBool,
        stopping: &mut bool,
    ) -> Result<TuneJob, ClientError> {
        let stop_now = stop.load(Ordering::SeqCst) && !*stopping;
        let request = if stop_now {
            Request::TuneStop { job: job.into() }
        } else {
            Request::TuneStatus {
                job: Some(job.into()),
            }
        };
        match self.request(request)? {
            Response::TuneJobs { jobs } if !jobs.is_empty() => {
                *stopping |= stop_now;
                Ok(jobs.into_iter().next().expect("not empty"))
            }
            other => {
                let got = serde_json::to_string(&other).unwrap_or_else(|_| format!("{other:?}"));
                Err(ClientError::Unexpected {
                    what: "tune_status",
                    got: got.chars().take(200).collect(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_run_without_a_trainer_now_is_asked_again_later() {
        let daemon = |code, message: &str| ClientError::Daemon {
            code,
            message: message.into(),
        };
        // As the daemon words them (daemon::runs::trainers, knob_set).
        assert!(no_trainer_now(&daemon(
            ErrorCode::BadState,
            "no trainer is attached to run r1 (it does not use the gpupilot SDK, or has not \
             connected yet) and its command has no {batch_size} placeholder"
        )));
        assert!(no_trainer_now(&daemon(
            ErrorCode::RestartNeeded,
            "no trainer is attached to run r1, and its command takes {batch_size}"
        )));
        // A run that is over, or a value out of range, is an answer, not a wait.
        assert!(!no_trainer_now(&daemon(
            ErrorCode::BadState,
            "run r1 is over; nothing changed"
        )));
        assert!(!no_trainer_now(&daemon(
            ErrorCode::BadRequest,
            "batch_size = 9 is outside run r1's allowed range"
        )));
    }
}
