//! One supervised run: start it, notice when it ends, restart it by its policy, stop, pause
//! and resume it, and take it over from a supervisor that died.
//!
//! [`Run`] is a state machine driven by [`Run::poll`]: nothing here blocks except the explicit
//! `wait*` helpers, so a daemon can poll many runs from one loop. Every change of state is
//! appended to `events.jsonl` and written to `summary.json` as it happens, so the run directory
//! is always the truth a new supervisor can start from. The run can replace those files too:
//! an event that cannot be written is noted ([`Run::problem`]) and never stops the machine, and
//! its end is taken from its monitor (`exit.json`), time included.
//!
//! When a run's main process ends, whatever is left in its process group (orphaned dataloader
//! workers, say) is killed, so a restart never competes with the last attempt's leftovers for
//! GPU memory. During a stop the group gets the whole grace period to finish first.

mod adoption;
mod attempt;
mod job;

use std::process::Child;
use std::time::{Duration, Instant, SystemTime};

use super::SupervisorError;
use super::clock::Clock;
use super::events::{Event, EventRecord, ExitInfo, RunStatus, Summary};
use super::launch::{self, Caller, LaunchOptions, LaunchPlan};
use super::restart::Attempt;
use super::rundir::{PidRecord, RunDir};
use super::signal::Sig;
use crate::profile::{Knobs, MetricsSettings, OnOom, Profile, RestartPolicy};
use crate::time::rfc3339;

/// The grace period between SIGTERM and SIGKILL when none is given.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// How often the blocking helpers poll.
const POLL_EVERY: Duration = Duration::from_millis(10);

/// The process of the current attempt.
#[derive(Debug)]
struct Current {
    /// Our child (we can wait for it); None when its monitor waits for it (it writes
    /// `exit.json`), or when it was adopted (we can only watch /proc).
    child: Option<Child>,
    rec: PidRecord,
    /// The monitor that waits for it (see `supervisor::monitor`), if it has one.
    monitor: Option<PidRecord>,
    /// Taken over from another supervisor rather than started by this one.
    adopted: bool,
    /// The knob values it was started with.
    knobs: launch::KnobValues,
    /// When the process was first seen gone while its monitor had not yet written its exit.
    gone_since: Option<Instant>,
    own_group: bool,
    started: Instant,
    started_wall: SystemTime,
    /// A Slurm run's attempt is a job, not a process (`rec` is then empty).
    job: Option<super::slurm::Tracker>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Running,
    Paused,
    Stopping {
        requested: Instant,
        deadline: Instant,
        killed: bool,
        /// `stop --kill`: SIGKILL at once, not at the end of a grace period.
        at_once: bool,
        /// The main process ended; the rest of the group may still be finishing.
        leader_exit: Option<ExitInfo>,
    },
    Backoff {
        until: Instant,
    },
    Finished,
}

/// A supervised run. See the module doc.
#[derive(Debug)]
pub struct Run {
    dir: RunDir,
    plan: LaunchPlan,
    policy: RestartPolicy,
    current: Option<Current>,
    phase: Phase,
    history: Vec<Attempt>,
    attempt: u32,
    first_start: SystemTime,
    summary: Summary,
    /// The profile's knob ranges.
    knobs: Knobs,
    /// How metrics are read from the run's output.
    metrics: MetricsSettings,
    /// The current attempt should be started again once it has stopped (a knob change that
    /// needs a restart).
    restart_requested: bool,
    /// The current attempt ran out of memory (the trainer said so).
    oom: bool,
    /// The size of stderr.log when the current attempt started: its own output starts there.
    stderr_from: u64,
    /// A Slurm run's current (or last) job.
    slurm_job: Option<super::slurm::SlurmJob>,
    /// What is wrong with the run directory (a file that cannot be read or written), if any.
    problem: Option<String>,
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> SupervisorError {
    let what = what.into();
    move |source| SupervisorError::Io { what, source }
}

impl Run {
    /// Make a run directory under `state_dir` for `profile`, plan it for `caller`, and start
    /// it. The directory is removed again if the plan fails (a missing program, say).
    pub fn start_new(
        state_dir: &std::path::Path,
        profile: &Profile,
        caller: &Caller,
        opts: &LaunchOptions,
        clock: &dyn Clock,
    ) -> Result<Run, SupervisorError> {
        let dir = RunDir::create(state_dir, &profile.name, clock.wall()).map_err(io_err(
            format!("creating a run directory under {}", state_dir.display()),
        ))?;
        match launch::plan(profile, caller, dir.id(), dir.path(), opts) {
            Ok(plan) => Run::start(dir, profile, plan, clock),
            Err(e) => {
                let _ = std::fs::remove_dir_all(dir.path());
                Err(e.into())
            }
        }
    }

    /// Start `plan` (made from `profile`) in the empty run directory `dir`.
    pub fn start(
        dir: RunDir,
        profile: &Profile,
        plan: LaunchPlan,
        clock: &dyn Clock,
    ) -> Result<Run, SupervisorError> {
        let what = |f: &str| format!("writing {f} in {}", dir.path().display());
        dir.write_profile(&profile.to_toml())
            .map_err(io_err(what("run.toml")))?;
        dir.write_launch(&plan)
            .map_err(io_err(what("launch.json")))?;
        let now = clock.wall();
        let summary = Summary {
            id: dir.id().to_string(),
            name: profile.name.clone(),
            status: RunStatus::Running,
            pid: None,
            attempt: 0,
            restarts: 0,
            started_at: rfc3339(now),
            ended_at: None,
            duration_s: None,
            exit_code: None,
            signal: None,
            signal_name: None,
            description: None,
            energy_j: None,
            samples: None,
            energy: None,
        };
        let mut run = Run {
            dir,
            plan,
            policy: profile.run.restart,
            current: None,
            phase: Phase::Running,
            history: Vec::new(),
            attempt: 0,
            first_start: now,
            summary,
            knobs: profile.knobs.clone(),
            metrics: profile.metrics.clone(),
            restart_requested: false,
            oom: false,
            stderr_from: 0,
            slurm_job: None,
            problem: None,
        };
        run.event(
            clock,
            Event::Created {
                name: profile.name.clone(),
                command: run.plan.argv.clone(),
                cwd: run.plan.cwd.display().to_string(),
                profile: profile.source.as_ref().map(|p| p.display().to_string()),
            },
        );
        if let Err(e) = run.launch_attempt(clock) {
            let description = format!("could not start: {e}");
            run.finish(clock, RunStatus::Failed, ExitInfo::unknown(), description)?;
            return Err(e);
        }
        Ok(run)
    }

    pub fn id(&self) -> &str {
        self.dir.id()
    }
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }
    pub fn plan(&self) -> &LaunchPlan {
        &self.plan
    }
    /// The summary as last written.
    pub fn summary(&self) -> &Summary {
        &self.summary
    }
    pub fn status(&self) -> RunStatus {
        self.summary.status
    }
    pub fn is_finished(&self) -> bool {
        self.phase == Phase::Finished
    }
    /// The current attempt's main process (which is also its session and group id).
    pub fn pid(&self) -> Option<u32> {
        self.current
            .as_ref()
            .filter(|c| c.job.is_none())
            .map(|c| c.rec.pid)
    }
    /// A Slurm run's current (or last) job: its id, state and nodes.
    pub fn slurm_job(&self) -> Option<&super::slurm::SlurmJob> {
        self.slurm_job.as_ref()
    }
    /// 0 for the first process, one more per restart.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }
    /// The profile's knob ranges.
    pub fn knob_ranges(&self) -> &Knobs {
        &self.knobs
    }

    /// How metrics are read from the run's output (`[metrics]`).
    pub fn metrics_settings(&self) -> &MetricsSettings {
        &self.metrics
    }

    /// Use `knobs` from the next attempt on (a change the trainer applied live, so that a
    /// restart keeps it; or the values a restart should bring). Written to `launch.json`.
    pub fn set_knobs(&mut self, knobs: launch::KnobValues) -> Result<(), SupervisorError> {
        self.plan = self.plan.with_knobs(knobs);
        self.dir.write_launch(&self.plan).map_err(io_err(format!(
            "writing {}",
            self.dir.launch_path().display()
        )))
    }

    /// The current attempt ran out of memory: with `on_oom = "halve_batch"` its end restarts
    /// the run with half the batch size.
    pub fn mark_oom(&mut self) {
        if !self.is_finished() {
            self.oom = true;
        }
    }

    /// Stop the current attempt (SIGTERM, SIGKILL after `grace`) and start the next at once,
    /// with the plan as it is then (see [`Run::set_knobs`]). Counts as a restart, but not
    /// against the policy's `max_restarts`: a person asked for it.
    pub fn restart_now(
        &mut self,
        grace: Duration,
        clock: &dyn Clock,
    ) -> Result<(), SupervisorError> {
        match self.phase {
            Phase::Running | Phase::Paused => {
                self.stop(grace, clock)?;
                self.restart_requested = true;
                Ok(())
            }
            Phase::Backoff { .. } => {
                self.phase = Phase::Backoff { until: clock.now() };
                Ok(())
            }
            Phase::Stopping { .. } | Phase::Finished => Err(self.bad_state("restart")),
        }
    }

    /// What an out-of-memory end leads to under this run's policy: the batch size to restart
    /// with, if the policy halves it and there is room below.
    fn halved_batch(&self) -> Option<i64> {
        if self.policy.on_oom != OnOom::HalveBatch {
            return None;
        }
        let now = self.plan.knobs().batch_size?;
        let min = self.knobs.batch_size.map_or(1, |k| k.min).max(1);
        let half = (now / 2).max(min);
        (half < now).then_some(half)
    }

    /// Whether the current process is one this supervisor adopted rather than started.
    pub fn is_adopted(&self) -> bool {
        self.current.as_ref().is_some_and(|c| c.adopted)
    }

    /// Notice what happened since the last call: an exit, the end of a grace period or of a
    /// backoff. Call it every few hundred milliseconds, or when SIGCHLD says so.
    pub fn poll(&mut self, clock: &dyn Clock) -> Result<RunStatus, SupervisorError> {
        match self.phase {
            Phase::Finished => {}
            Phase::Backoff { until } => {
                if clock.now() >= until {
                    if let Err(e) = self.launch_attempt(clock) {
                        let description = format!("restart failed: {e}");
                        self.finish(clock, RunStatus::Failed, ExitInfo::unknown(), description)?;
                    }
                }
            }
            Phase::Running | Phase::Paused => {
                if let Some(exit) = self.check_exit()? {
                    self.ended(clock, exit, false)?;
                }
            }
            Phase::Stopping {
                requested,
                deadline,
                killed,
                at_once,
                mut leader_exit,
            } => {
                if leader_exit.is_none() {
                    leader_exit = self.check_exit()?;
                    self.phase = Phase::Stopping {
                        requested,
                        deadline,
                        killed,
                        at_once,
                        leader_exit,
                    };
                }
                let now = clock.now();
                let group_left = self.group_alive();
                match leader_exit {
                    Some(exit) if !group_left || killed || now >= deadline => {
                        self.ended(clock, exit, true)?;
                    }
                    _ if now >= deadline && !killed => self.escalate(clock, now - requested)?,
                    _ => {}
                }
            }
        }
        Ok(self.summary.status)
    }

    /// Stop: SIGTERM to the group now, SIGKILL when `grace` runs out (noticed by `poll`). A
    /// paused run is also sent SIGCONT so it can act on the SIGTERM. A run waiting to restart
    /// just stops waiting.
    pub fn stop(&mut self, grace: Duration, clock: &dyn Clock) -> Result<(), SupervisorError> {
        match self.phase {
            Phase::Running | Phase::Paused => {
                let paused = self.phase == Phase::Paused;
                self.signal(Sig::Term)?;
                if paused {
                    self.signal(Sig::Cont)?;
                }
                let now = clock.now();
                self.phase = Phase::Stopping {
                    requested: now,
                    deadline: now + grace,
                    killed: false,
                    at_once: false,
                    leader_exit: None,
                };
                self.event(
                    clock,
                    Event::StopRequested {
                        grace_s: grace.as_secs_f64(),
                    },
                );
                self.set_status(RunStatus::Stopping)
            }
            Phase::Backoff { .. } => {
                self.event(clock, Event::Stopped {});
                let exit = self.history.last().map(|a| a.exit).unwrap_or_default();
                self.finish(
                    clock,
                    RunStatus::Stopped,
                    exit,
                    "stopped while waiting to restart".into(),
                )
            }
            Phase::Stopping { .. } => Ok(()),
            Phase::Finished => Err(self.bad_state("stop")),
        }
    }

    /// `stop --kill`: SIGKILL to the group now.
    pub fn kill(&mut self, clock: &dyn Clock) -> Result<(), SupervisorError> {
        let now = clock.now();
        match self.phase {
            Phase::Running | Phase::Paused => {
                self.phase = Phase::Stopping {
                    requested: now,
                    deadline: now,
                    killed: false,
                    at_once: true,
                    leader_exit: None,
                };
                self.set_status(RunStatus::Stopping)?;
                self.escalate(clock, Duration::ZERO)
            }
            Phase::Stopping {
                requested,
                killed: false,
                ref mut at_once,
                ..
            } => {
                *at_once = true;
                self.escalate(clock, now - requested)
            }
            Phase::Stopping { .. } => Ok(()),
            Phase::Backoff { .. } => self.stop(Duration::ZERO, clock),
            Phase::Finished => Err(self.bad_state("kill")),
        }
    }

    /// Pause: SIGSTOP to the group.
    pub fn pause(&mut self, clock: &dyn Clock) -> Result<(), SupervisorError> {
        if self.phase != Phase::Running {
            return Err(self.bad_state("pause"));
        }
        self.signal(Sig::Stop)?;
        self.phase = Phase::Paused;
        self.event(clock, Event::Paused {});
        self.set_status(RunStatus::Paused)
    }

    /// Resume a paused run: SIGCONT to the group.
    pub fn resume(&mut self, clock: &dyn Clock) -> Result<(), SupervisorError> {
        if self.phase != Phase::Paused {
            return Err(self.bad_state("resume"));
        }
        self.signal(Sig::Cont)?;
        self.phase = Phase::Running;
        self.event(clock, Event::Resumed {});
        self.set_status(RunStatus::Running)
    }

    /// Poll until the run is finished or `timeout` (real time) passes; true if finished.
    pub fn wait(&mut self, clock: &dyn Clock, timeout: Duration) -> Result<bool, SupervisorError> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll(clock)?;
            if self.is_finished() {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(POLL_EVERY);
        }
    }

    /// Stop and wait for the end: at most `grace` plus a little for SIGKILL to land.
    pub fn stop_and_wait(
        &mut self,
        grace: Duration,
        clock: &dyn Clock,
    ) -> Result<RunStatus, SupervisorError> {
        self.stop(grace, clock)?;
        self.wait(clock, grace + Duration::from_secs(5))?;
        Ok(self.status())
    }

    // ---- internals ----

    fn bad_state(&self, action: &'static str) -> SupervisorError {
        SupervisorError::BadState {
            id: self.id().to_string(),
            status: self.summary.status.as_str(),
            action,
        }
    }

    fn phase_status(&self) -> RunStatus {
        match self.phase {
            Phase::Running => RunStatus::Running,
            Phase::Paused => RunStatus::Paused,
            Phase::Stopping { .. } => RunStatus::Stopping,
            Phase::Backoff { .. } => RunStatus::Backoff,
            Phase::Finished => self.summary.status,
        }
    }

    /// Append `event` to `events.jsonl`, stamped now.
    fn event(&mut self, clock: &dyn Clock, event: Event) {
        self.event_at(clock.wall(), event);
    }

    /// Append `event` to `events.jsonl`, stamped `at`. The run can replace the file (a link, a
    /// FIFO): an event that cannot be written is logged and noted as the run's problem, and
    /// the run goes on as if it had been written — its exit, stop and status never wait on
    /// the log.
    fn event_at(&mut self, at: SystemTime, event: Event) {
        let rec = EventRecord {
            time: rfc3339(at),
            event,
        };
        if let Err(e) = self.dir.append_event(&rec) {
            tracing::warn!("run {}: writing an event: {e}", self.id());
            self.note_problem(format!("events.jsonl not written: {e}"));
        }
    }

    /// What is wrong with the run's directory, as `ps` shows it beside the status (the first
    /// problem found: later ones are most often the same).
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    fn note_problem(&mut self, what: String) {
        self.problem.get_or_insert(what);
    }

    /// Record the run's energy (measured by the daemon's control loop); `write`: into
    /// `summary.json` now (else with the next change). A run charged no GPU (a CPU-only
    /// script, or none measured yet) has no energy figure, not 0 J: `energy_j` and `energy`
    /// stay absent, and only its samples are kept.
    pub fn set_energy(
        &mut self,
        energy: crate::control::energy::RunEnergy,
        write: bool,
    ) -> Result<(), SupervisorError> {
        self.summary.samples = energy.samples;
        let charged = !energy.per_gpu.is_empty();
        self.summary.energy_j = charged.then_some(energy.energy_j);
        self.summary.energy = charged.then_some(energy);
        if write {
            self.write_summary()?;
        }
        Ok(())
    }

    fn write_summary(&self) -> Result<(), SupervisorError> {
        self.dir
            .write_summary(&self.summary)
            .map_err(io_err(format!(
                "writing {}",
                self.dir.summary_path().display()
            )))
    }

    fn set_status(&mut self, status: RunStatus) -> Result<(), SupervisorError> {
        self.summary.status = status;
        self.write_summary()
    }
}
