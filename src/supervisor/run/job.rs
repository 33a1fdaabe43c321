//! A Slurm run's attempts: submitting the job, watching it, signalling it, and taking it
//! over from a supervisor that is gone (see `supervisor::slurm`).

use super::{Current, DEFAULT_GRACE, Phase, Run, io_err};
use crate::profile::SlurmSpec;
use crate::supervisor::SupervisorError;
use crate::supervisor::clock::Clock;
use crate::supervisor::events::{Event, ExitInfo, RunStatus};
use crate::supervisor::launch::LaunchPlan;
use crate::supervisor::rundir::PidRecord;
use crate::supervisor::signal::Sig;
use crate::supervisor::slurm::{self, JobState, SlurmJob, Tracker};

/// The pid record of an attempt that is a job: there is no local process.
fn no_pid() -> PidRecord {
    PidRecord {
        pid: 0,
        start_time: 0,
        boot_id: None,
    }
}

impl Run {
    /// Submit the next attempt (`plan`, the resume arguments added for a restart) as a job.
    pub(super) fn submit_job(
        &mut self,
        spec: &SlurmSpec,
        plan: &LaunchPlan,
        restart: bool,
        clock: &dyn Clock,
    ) -> Result<(), SupervisorError> {
        let attempt = self.history.len() as u32;
        let job = slurm::submit(spec, plan, &plan.argv, &self.dir, attempt).map_err(io_err(
            format!("submitting run {} with sbatch", self.dir.id()),
        ))?;
        job.write(&self.dir).map_err(io_err(format!(
            "writing {}",
            SlurmJob::path(&self.dir).display()
        )))?;
        self.attempt = attempt;
        self.current = Some(Current {
            child: None,
            rec: no_pid(),
            monitor: None,
            adopted: false,
            knobs: plan.knobs(),
            gone_since: None,
            own_group: false,
            started: clock.now(),
            started_wall: clock.wall(),
            job: Some(Tracker::new(job.clone(), plan)),
        });
        self.phase = Phase::Running;
        self.event(
            clock,
            Event::Submitted {
                attempt,
                job_id: job.job_id.clone(),
            },
        );
        if restart {
            tracing::info!("run {} resubmitted as job {}", self.id(), job.job_id);
        }
        self.slurm_job = Some(job);
        self.summary.pid = None;
        self.summary.attempt = attempt;
        self.summary.restarts = attempt;
        self.set_status(RunStatus::Running)
    }

    /// How the current job ended, if it has (Slurm is asked at most every
    /// [`slurm::POLL_EVERY`]). While Slurm cannot be asked, the job counts as running.
    pub(super) fn job_exit(&mut self) -> Result<Option<ExitInfo>, SupervisorError> {
        let Some(tracker) = self.current.as_mut().and_then(|c| c.job.as_mut()) else {
            return Ok(None);
        };
        let state = match tracker.query(false) {
            Ok(state) => state,
            Err(e) => {
                tracing::warn!(
                    "run {}: asking Slurm about job {}: {e}",
                    self.dir.id(),
                    tracker.job.job_id
                );
                return Ok(None);
            }
        };
        let job = tracker.job.clone();
        self.record_job(job)?;
        Ok(match state {
            None | Some(JobState::Active { .. }) => None,
            Some(JobState::Ended { exit, .. }) => Some(exit),
            Some(JobState::Forgotten) => Some(ExitInfo::unknown()),
        })
    }

    /// Keep what is known of the job (`slurm.json`, `ps`) when it changed.
    fn record_job(&mut self, job: SlurmJob) -> Result<(), SupervisorError> {
        if self.slurm_job.as_ref() != Some(&job) {
            job.write(&self.dir).map_err(io_err(format!(
                "writing {}",
                SlurmJob::path(&self.dir).display()
            )))?;
            self.slurm_job = Some(job);
        }
        Ok(())
    }

    /// `sig` to the job: TERM is `scancel --signal=TERM` (the steps), KILL is `scancel`, STOP and
    /// CONT are `scontrol suspend` / `resume`.
    pub(super) fn job_signal(&self, sig: Sig) -> Result<(), SupervisorError> {
        let Some(tracker) = self.current.as_ref().and_then(|c| c.job.as_ref()) else {
            return Ok(());
        };
        let done = match sig {
            Sig::Term => tracker.cancel(Some("TERM")),
            Sig::Kill => tracker.cancel(None),
            Sig::Stop => tracker.suspend(true),
            Sig::Cont => tracker.suspend(false),
        };
        done.map_err(io_err(format!(
            "signalling job {} of run {}",
            tracker.job.job_id,
            self.id()
        )))
    }

    /// Take over a Slurm run whose end was not recorded: watch its job if Slurm still runs
    /// it, else record how it ended (applying the restart policy).
    pub(super) fn adopt_job(&mut self, clock: &dyn Clock) -> Result<(), SupervisorError> {
        let was = self.summary.status;
        if was == RunStatus::Backoff {
            // It died waiting to be resubmitted: the wait is over.
            self.phase = Phase::Backoff { until: clock.now() };
            return Ok(());
        }
        let Some(job) = self.slurm_job.clone() else {
            return self.finish(
                clock,
                RunStatus::Unknown,
                ExitInfo::unknown(),
                "never submitted, or its slurm.json was lost".into(),
            );
        };
        let started_wall = std::fs::metadata(SlurmJob::path(&self.dir))
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| clock.wall());
        let age = clock
            .wall()
            .duration_since(started_wall)
            .unwrap_or_default();
        let now = clock.now();
        let mut tracker = Tracker::new(job.clone(), &self.plan);
        let state = tracker.query(true);
        let seen = tracker.job.clone();
        self.current = Some(Current {
            child: None,
            rec: no_pid(),
            monitor: None,
            adopted: true,
            knobs: self.plan.knobs(),
            gone_since: None,
            own_group: false,
            started: now.checked_sub(age).unwrap_or(now),
            started_wall,
            job: Some(tracker),
        });
        self.record_job(seen)?;
        let stopping = was == RunStatus::Stopping;
        let exit = match state {
            Ok(Some(JobState::Ended { exit, .. })) => Some(exit),
            Ok(Some(JobState::Forgotten)) => Some(ExitInfo::unknown()),
            Ok(Some(JobState::Active { .. })) | Ok(None) => None,
            Err(e) => {
                tracing::warn!(
                    "run {}: asking Slurm about job {}: {e}",
                    self.id(),
                    job.job_id
                );
                None
            }
        };
        if let Some(exit) = exit {
            self.phase = Phase::Running;
            return self.ended(clock, exit, stopping);
        }
        self.phase = if stopping {
            // The last supervisor died mid-stop: the job was signalled; finish the job.
            Phase::Stopping {
                requested: now,
                deadline: now + DEFAULT_GRACE,
                killed: false,
                at_once: false,
                leader_exit: None,
            }
        } else if self.slurm_job.as_ref().and_then(|j| j.state.as_deref()) == Some("SUSPENDED") {
            Phase::Paused
        } else {
            Phase::Running
        };
        self.event(clock, Event::AdoptedJob { job_id: job.job_id });
        self.summary.pid = None;
        self.set_status(self.phase_status())
    }
}
