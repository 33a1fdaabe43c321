//! Taking over a run from a supervisor that is gone (see `supervisor::adopt` for what the
//! run directory says). A run started under a monitor (`supervisor::monitor`) has its exit
//! status in `exit.json`, written whether or not a supervisor watched; only a run started
//! without one may end with its status unknown.

use std::ops::ControlFlow;
use std::time::Duration;

use super::{Current, DEFAULT_GRACE, Phase, Run};
use crate::profile;
use crate::supervisor::SupervisorError;
use crate::supervisor::adopt::{self, Adopted};
use crate::supervisor::clock::Clock;
use crate::supervisor::events::{Event, ExitInfo, RunStatus, Summary};
use crate::supervisor::launch::LaunchPlan;
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
    ///
    /// The run can replace any file in its directory (a link, a FIFO, garbage): a file that
    /// cannot be read is passed over and noted as the run's [`Run::problem`], and what the
    /// others say is used — the process from `pid`, else from the last start in
    /// `events.jsonl`, else from `exit.json`; the command from `launch.json`, else none (and
    /// then no restart). What cannot be written (the summary, say) is noted the same way:
    /// a run directory is always adopted, and listed with what is known of it.
    pub fn adopt(dir: RunDir, clock: &dyn Clock) -> Run {
        let mut problems: Vec<String> = Vec::new();
        let mut unread = |file: &str, e: &dyn std::fmt::Display| {
            tracing::warn!("run {}: reading {file}: {e}", dir.id());
            problems.push(format!("{file} not read: {e}"));
        };
        let read_plan = dir.read_launch();
        let profile = match profile::Loader::new().load(&dir.profile_path()) {
            Ok(p) => p,
            Err(e) => {
                unread("run.toml", &e);
                profile::Profile::from_command(Vec::new())
            }
        };
        let plan = match read_plan {
            Ok(plan) => plan,
            Err(e) => {
                unread("launch.json", &e);
                LaunchPlan {
                    argv: Vec::new(),
                    cwd: dir.path().to_path_buf(),
                    env: Default::default(),
                    template: None,
                    slurm: None,
                    monitor: None,
                }
            }
        };
        let mut attempts = Attempts::default();
        let events_read = dir.visit_events(|rec| {
            attempts.take(&rec.event);
            ControlFlow::Continue(())
        });
        if let Err(e) = &events_read {
            unread("events.jsonl", e);
        }
        let Attempts {
            history,
            mut attempt,
            last_start,
            ..
        } = attempts;
        let read_summary = dir.read_summary().unwrap_or_else(|e| {
            unread("summary.json", &e);
            None
        });
        if events_read.is_err() {
            // The attempt number is still in the summary.
            attempt = read_summary.as_ref().map_or(attempt, |s| s.attempt);
        }
        // A pid file that is gone (removed: it is written before the start is recorded) or
        // unreadable: the process from what else says it.
        let pid_rec = match dir.read_pid() {
            Ok(Some(rec)) => Some(rec),
            read => {
                if let Err(e) = read {
                    unread("pid", &e);
                }
                let summary_pid = read_summary.as_ref().and_then(|s| s.pid);
                last_start
                    .or_else(|| monitor_child(&dir, summary_pid?))
                    .or_else(|| {
                        monitor::read_record(&dir).map(|r| PidRecord {
                            pid: r.pid,
                            start_time: r.start_time,
                            boot_id: None,
                        })
                    })
            }
        };
        let found = adopt::judge(pid_rec.clone(), read_summary.clone());
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
        let mut policy = profile.run.restart;
        if plan.argv.is_empty() {
            // Nothing known to start again.
            policy.mode = profile::RestartMode::Never;
        }
        let problem = (!problems.is_empty()).then(|| problems.join("; "));
        let mut run = Run {
            dir,
            plan,
            policy,
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
            problem,
        };
        if let Err(e) = run.take_over(found, pid_rec, clock) {
            tracing::warn!("run {}: taking it over: {e}", run.id());
            run.note_problem(e.to_string());
        }
        run
    }

    /// Watch what `found` says is alive, or record how it ended (see [`Run::adopt`]).
    fn take_over(
        &mut self,
        found: Adopted,
        pid_rec: Option<PidRecord>,
        clock: &dyn Clock,
    ) -> Result<(), SupervisorError> {
        let run = self;
        if run.plan.slurm.is_some() {
            run.slurm_job = crate::supervisor::slurm::SlurmJob::read(&run.dir)
                .ok()
                .flatten();
            if !matches!(found, Adopted::Finished(_)) {
                return run.adopt_job(clock);
            }
        }
        match found {
            Adopted::Finished(_) => {}
            Adopted::Live {
                pid,
                start_time,
                paused,
            } => {
                let rec = pid_rec.unwrap_or(PidRecord {
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
                run.event(clock, Event::Adopted { pid, start_time });
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
        Ok(())
    }

    pub(super) fn adopted_current(&self, rec: PidRecord, clock: &dyn Clock) -> Current {
        // The pid file was written when the process started: its age is the attempt's age.
        // Something else in its place (the run can replace it) says nothing of the start.
        let pid_written = std::fs::symlink_metadata(self.dir.pid_path())
            .ok()
            .filter(|m| m.is_file())
            .and_then(|m| m.modified().ok());
        let started_wall = pid_written.unwrap_or(self.first_start).min(clock.wall());
        let age = clock
            .wall()
            .duration_since(started_wall)
            .unwrap_or_default();
        let now = clock.now();
        let own_group = procfs::stat(rec.pid).is_ok_and(|st| st.pgrp == rec.pid as i32);
        // The monitor file is written after the pid file: an older one belongs to an earlier
        // attempt, whose monitor (if it still runs) is not this process's. Without a pid file
        // to compare with, the monitor counts if it is the process's parent.
        let monitor = self.dir.read_monitor().ok().flatten().filter(|m| {
            let Some(pid_written) = pid_written else {
                return procfs::stat(rec.pid).is_ok_and(|st| st.ppid == m.pid as i32);
            };
            std::fs::metadata(self.dir.monitor_path())
                .and_then(|m| m.modified())
                .is_ok_and(|t| t >= pid_written)
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

/// The process `pid` (the summary's) as a pid record, if it is the child of the run's live
/// monitor: the monitor's record tells it from a recycled pid.
fn monitor_child(dir: &RunDir, pid: u32) -> Option<PidRecord> {
    let monitor = dir.read_monitor().ok().flatten()?;
    adopt::live_process(&monitor)?;
    let st = procfs::stat(pid).ok()?;
    (st.ppid == monitor.pid as i32 && st.is_running()).then(|| PidRecord {
        pid,
        start_time: st.start_time,
        boot_id: procfs::boot_id(),
    })
}

/// Attempts and the current attempt number, rebuilt from `events.jsonl` one event at a time.
#[derive(Default)]
struct Attempts {
    history: Vec<Attempt>,
    attempt: u32,
    stop_asked: bool,
    /// The process of the last attempt started (for a run whose pid file cannot be read).
    last_start: Option<PidRecord>,
}

impl Attempts {
    fn take(&mut self, event: &Event) {
        match event {
            Event::Started {
                attempt: a,
                pid,
                start_time,
                ..
            }
            | Event::Restarted {
                attempt: a,
                pid,
                start_time,
                ..
            } => {
                self.attempt = *a;
                self.stop_asked = false;
                self.last_start = Some(PidRecord {
                    pid: *pid,
                    start_time: *start_time,
                    boot_id: None,
                });
            }
            Event::Submitted { attempt: a, .. } => {
                self.attempt = *a;
                self.stop_asked = false;
                self.last_start = None;
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
