//! Taking over a run from a supervisor that is gone (see `supervisor::adopt` for what the
//! run directory says). A run started under a monitor (`supervisor::monitor`) has its exit
//! status in `exit.json`, written whether or not a supervisor watched; only a run started
//! without one may end with its status unknown.

use std::ops::ControlFlow;
use std::time::Duration;

use super::{Current, DEFAULT_GRACE, Phase, Run, io_err};
use crate::profile;
use crate::supervisor::SupervisorError;
use crate::supervisor::adopt::{self, Adopted};
use crate::supervisor::clock::Clock;
use crate::supervisor::events::{Event, ExitInfo, RunStatus, Summary};
use crate::supervisor::monitor;
use crate::supervisor::procfs;
use crate::supervisor::restart::Attempt;
use crate::supervisor::rundir::{PidRecord, RunDir};
use crate::supervisor::signal;
use crate::time::{parse_rfc3339, rfc3339};

impl Run {
    /// Take over the run in `dir` from a supervisor that is gone: watch it if it is alive,
    /// record how it ended if it ended unwatched (applying the restart policy), or just report
    /// a finished run.
    pub fn adopt(dir: RunDir, clock: &dyn Clock) -> Result<Run, SupervisorError> {
        let plan = dir
            .read_launch()
            .map_err(io_err(format!("reading {}", dir.launch_path().display())))?;
        let profile = profile::Loader::new()
            .load(&dir.profile_path())
            .map_err(|source| SupervisorError::Profile {
                path: dir.profile_path(),
                source: Box::new(source),
            })?;
        let mut attempts = Attempts::default();
        dir.visit_events(|rec| {
            attempts.take(&rec.event);
            ControlFlow::Continue(())
        })
        .map_err(io_err(format!("reading {}", dir.events_path().display())))?;
        let Attempts {
            history, attempt, ..
        } = attempts;
        let read_summary = dir
            .read_summary()
            .map_err(io_err(format!("reading {}", dir.summary_path().display())))?;
        let found =
            adopt::adopt(&dir).map_err(io_err(format!("reading {}", dir.pid_path().display())))?;
        let summary = read_summary.unwrap_or_else(|| Summary {
            id: dir.id().to_string(),
            name: profile.name.clone(),
            status: RunStatus::Running,
            pid: None,
            attempt,
            restarts: attempt,
            started_at: rfc3339(clock.wall()),
            ended_at: None,
            duration_s: None,
            exit_code: None,
            signal: None,
            signal_name: None,
            description: None,
            energy_j: None,
            samples: None,
            energy: None,
        });
        let first_start = parse_rfc3339(&summary.started_at).unwrap_or_else(|| clock.wall());
        let stderr_from = std::fs::metadata(dir.stderr_path()).map_or(0, |m| m.len());
        let mut run = Run {
            dir,
            plan,
            policy: profile.run.restart,
            current: None,
            phase: Phase::Finished,
            history,
            attempt,
            first_start,
            summary,
            knobs: profile.knobs,
            metrics: profile.metrics,
            restart_requested: false,
            oom: false,
            // What the adopted attempt printed before this supervisor came is not read for an
            // out-of-memory error: it cannot be told apart from an earlier attempt's.
            stderr_from,
            slurm_job: None,
        };
        if run.plan.slurm.is_some() {
            run.slurm_job = crate::supervisor::slurm::SlurmJob::read(&run.dir)
                .ok()
                .flatten();
            if !matches!(found, Adopted::Finished(_)) {
                run.adopt_job(clock)?;
                return Ok(run);
            }
        }
        match found {
            Adopted::Finished(_) => {}
            Adopted::Live {
                pid,
                start_time,
                paused,
            } => {
                let rec = run.dir.read_pid().ok().flatten().unwrap_or(PidRecord {
                    pid,
                    start_time,
                    boot_id: procfs::boot_id(),
                });
                run.current = Some(run.adopted_current(rec, clock));
                let was = run.summary.status;
                run.phase = if was == RunStatus::Stopping {
                    // The last supervisor died mid-stop: SIGTERM went out; finish the job.
                    let now = clock.now();
                    Phase::Stopping {
                        requested: now,
                        deadline: now + DEFAULT_GRACE,
                        killed: false,
                        at_once: false,
                        leader_exit: None,
                    }
                } else if paused {
                    Phase::Paused
                } else {
                    Phase::Running
                };
                run.event(clock, Event::Adopted { pid, start_time })?;
                run.summary.pid = Some(pid);
                run.set_status(run.phase_status())?;
            }
            Adopted::Gone { pid, summary } => {
                let was = summary.map(|s| s.status);
                if was == Some(RunStatus::Backoff) {
                    // It died waiting to be restarted: the wait is over.
                    run.phase = Phase::Backoff { until: clock.now() };
                } else if let Some(rec) = pid {
                    let stopping = was == Some(RunStatus::Stopping);
                    run.current = Some(run.adopted_current(rec, clock));
                    run.phase = Phase::Running;
                    // Its monitor may still be writing how it ended: then the first poll has it.
                    if let Some(exit) = run.check_exit()? {
                        run.ended(clock, exit, stopping)?;
                    } else if stopping {
                        let now = clock.now();
                        run.phase = Phase::Stopping {
                            requested: now,
                            deadline: now + DEFAULT_GRACE,
                            killed: false,
                            at_once: false,
                            leader_exit: None,
                        };
                    }
                } else {
                    run.finish(
                        clock,
                        RunStatus::Unknown,
                        ExitInfo::unknown(),
                        "never started, or its pid file was lost".into(),
                    )?;
                }
            }
        }
        Ok(run)
    }

    pub(super) fn adopted_current(&self, rec: PidRecord, clock: &dyn Clock) -> Current {
        // The pid file was written when the process started: its age is the attempt's age.
        let started_wall = std::fs::metadata(self.dir.pid_path())
            .and_then(|m| m.modified())
            .unwrap_or_else(|_| clock.wall());
        let age = clock
            .wall()
            .duration_since(started_wall)
            .unwrap_or_default();
        let now = clock.now();
        let own_group = procfs::stat(rec.pid).is_ok_and(|st| st.pgrp == rec.pid as i32);
        // The monitor file is written after the pid file: an older one belongs to an earlier
        // attempt, whose monitor (if it still runs) is not this process's.
        let monitor = self.dir.read_monitor().ok().flatten().filter(|_| {
            let modified =
                |p: std::path::PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
            modified(self.dir.monitor_path()) >= modified(self.dir.pid_path())
        });
        Current {
            child: None,
            monitor,
            adopted: true,
            knobs: self.plan.knobs(),
            gone_since: None,
            own_group: own_group || signal::group_exists(rec.pid),
            rec,
            started: now.checked_sub(age).unwrap_or(now),
            started_wall,
            job: None,
        }
    }

    /// How a process that is not our child ended: as its monitor wrote it (`exit.json`), else
    /// the code it wrote itself after it started, else unknown.
    pub(super) fn adopted_exit(&self) -> ExitInfo {
        if let Some(exit) = self
            .current
            .as_ref()
            .and_then(|c| monitor::recorded_exit(&self.dir, &c.rec))
        {
            return exit;
        }
        let started = self.current.as_ref().map(|c| c.started_wall);
        match (self.dir.read_exit_code(), started) {
            (Some((code, written)), Some(started)) if written >= started => ExitInfo::code(code),
            _ => ExitInfo::unknown(),
        }
    }
}

/// Attempts and the current attempt number, rebuilt from `events.jsonl` one event at a time.
#[derive(Default)]
struct Attempts {
    history: Vec<Attempt>,
    attempt: u32,
    stop_asked: bool,
}

impl Attempts {
    fn take(&mut self, event: &Event) {
        match event {
            Event::Started { attempt: a, .. }
            | Event::Restarted { attempt: a, .. }
            | Event::Submitted { attempt: a, .. } => {
                self.attempt = *a;
                self.stop_asked = false;
            }
            Event::StopRequested { .. } | Event::Killed { .. } => self.stop_asked = true,
            Event::Exited {
                code,
                signal,
                duration_s,
                ..
            } => self.history.push(Attempt {
                exit: ExitInfo {
                    code: *code,
                    signal: *signal,
                },
                stopped_by_user: self.stop_asked,
                ran_for: Duration::from_secs_f64(duration_s.max(0.0)),
            }),
            _ => {}
        }
    }
}
