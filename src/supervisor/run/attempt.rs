//! One attempt of a run: starting its process, noticing its end, signalling its group, and
//! what the restart policy makes of the end.

use std::time::{Duration, Instant, SystemTime};

use super::{Current, Phase, Run, io_err};
use crate::supervisor::SupervisorError;
use crate::supervisor::adopt;
use crate::supervisor::clock::Clock;
use crate::supervisor::events::{Event, ExitInfo, RunStatus};
use crate::supervisor::launch::{self, KnobValues, LaunchPlan};
use crate::supervisor::monitor;
use crate::supervisor::procfs;
use crate::supervisor::restart::{self, AfterExit, Attempt, GiveUp};
use crate::supervisor::rundir::PidRecord;
use crate::supervisor::signal::{self, Sig};
use crate::time::rfc3339;

/// How long a process's end may go unrecorded while its monitor still runs (the monitor
/// writes `exit.json` a moment after the end).
const MONITOR_WAIT: Duration = Duration::from_secs(5);

const SIGKILL: i32 = 9;

/// Why a restart a person asked for happened: `restarted for the change of batch_size 32 → 64`.
fn restart_reason(old: KnobValues, new: KnobValues) -> String {
    let show = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    let changes: Vec<String> = [
        ("batch_size", old.batch_size, new.batch_size),
        ("prefetch", old.prefetch, new.prefetch),
    ]
    .into_iter()
    .filter(|(_, a, b)| a != b)
    .map(|(name, a, b)| format!("{name} {} → {}", show(a), show(b)))
    .collect();
    if changes.is_empty() {
        "restarted on request".into()
    } else {
        format!("restarted for the change of {}", changes.join(", "))
    }
}

impl Run {
    /// Start the next attempt (the first, or a restart).
    pub(super) fn launch_attempt(&mut self, clock: &dyn Clock) -> Result<(), SupervisorError> {
        let restart = !self.history.is_empty();
        let plan = if restart {
            LaunchPlan {
                argv: self.plan.restart_argv(),
                ..self.plan.clone()
            }
        } else {
            self.plan.clone()
        };
        self.oom = false;
        self.stderr_from = std::fs::metadata(self.dir.stderr_path()).map_or(0, |m| m.len());
        if let Some(spec) = self.plan.slurm.clone() {
            return self.submit_job(&spec, &plan, restart, clock);
        }
        let spawned = launch::spawn(&plan, &self.dir).map_err(io_err(format!(
            "starting `{}`",
            self.plan.argv.first().map(String::as_str).unwrap_or("")
        )))?;
        let rec = PidRecord {
            pid: spawned.pid,
            start_time: spawned.start_time,
            boot_id: procfs::boot_id(),
        };
        self.dir
            .write_pid(&rec)
            .map_err(io_err(format!("writing {}", self.dir.pid_path().display())))?;
        match &spawned.monitor {
            Some(m) => self.dir.write_monitor(m),
            None => std::fs::remove_file(self.dir.monitor_path()).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }),
        }
        .map_err(io_err(format!(
            "writing {}",
            self.dir.monitor_path().display()
        )))?;
        self.attempt = self.history.len() as u32;
        let (pid, start_time, own_session) = (spawned.pid, spawned.start_time, spawned.own_session);
        self.current = Some(Current {
            child: spawned.child,
            rec,
            monitor: spawned.monitor,
            adopted: false,
            knobs: plan.knobs(),
            gone_since: None,
            own_group: spawned.own_group,
            started: clock.now(),
            started_wall: clock.wall(),
            job: None,
        });
        self.phase = Phase::Running;
        let attempt = self.attempt;
        self.event(
            clock,
            if restart {
                Event::Restarted {
                    attempt,
                    pid,
                    start_time,
                    own_session,
                }
            } else {
                Event::Started {
                    attempt,
                    pid,
                    start_time,
                    own_session,
                }
            },
        );
        self.summary.pid = Some(pid);
        self.summary.attempt = attempt;
        self.summary.restarts = attempt;
        self.set_status(RunStatus::Running)
    }

    /// The current main process's exit, if it has ended.
    pub(super) fn check_exit(&mut self) -> Result<Option<ExitInfo>, SupervisorError> {
        if self.current.as_ref().is_some_and(|c| c.job.is_some()) {
            return self.job_exit();
        }
        let Some(cur) = self.current.as_mut() else {
            return Ok(None);
        };
        if let Some(child) = cur.child.as_mut() {
            let status = child
                .try_wait()
                .map_err(io_err(format!("waiting for pid {}", cur.rec.pid)))?;
            return Ok(status.map(ExitInfo::from_status));
        }
        // Its monitor writes how it ended; read that first (a zombie is not alive either).
        if let Some(exit) = monitor::recorded_exit(&self.dir, &cur.rec) {
            return Ok(Some(exit));
        }
        if adopt::is_alive(&cur.rec) {
            return Ok(None);
        }
        // Gone, but its monitor lives: it is about to write the exit (give it a moment).
        let now = Instant::now();
        let since = *cur.gone_since.get_or_insert(now);
        if cur.monitor.as_ref().is_some_and(adopt::is_alive)
            && now.duration_since(since) < MONITOR_WAIT
        {
            return Ok(None);
        }
        Ok(Some(self.adopted_exit()))
    }

    /// The live monitor of the current attempt, if it has one.
    fn live_monitor(&self) -> Option<u32> {
        let m = self.current.as_ref()?.monitor.as_ref()?;
        adopt::is_alive(m).then_some(m.pid)
    }

    /// What the run left outside its group: its monitor's descendants (orphans are reparented
    /// to the monitor, a child subreaper) that are not in the group.
    fn escaped(&self) -> Vec<u32> {
        let Some(cur) = self.current.as_ref() else {
            return Vec::new();
        };
        let Some(monitor) = self.live_monitor() else {
            return Vec::new();
        };
        procfs::descendants(monitor)
            .into_iter()
            .filter(|&pid| {
                !(cur.own_group && procfs::stat(pid).is_ok_and(|st| st.pgrp == cur.rec.pid as i32))
            })
            .collect()
    }

    /// Whether any process of the run still runs: its group, or what escaped it (zombies do
    /// not count: an init that is slow to reap, or a daemon that is pid 1 in a container, must
    /// not stretch every stop).
    pub(super) fn group_alive(&self) -> bool {
        self.current.as_ref().is_some_and(|c| {
            (c.own_group && !procfs::running_in_group(c.rec.pid).is_empty())
                || !self.escaped().is_empty()
        })
    }

    /// Send `sig` to the run's group (or, without a group of its own, its main process).
    pub(super) fn signal(&self, sig: Sig) -> Result<(), SupervisorError> {
        let Some(cur) = &self.current else {
            return Ok(());
        };
        if cur.job.is_some() {
            return self.job_signal(sig);
        }
        let pid = cur.rec.pid;
        let sent = if cur.own_group {
            signal::to_group(pid, sig).or_else(|_| signal::to_process(pid, sig))
        } else {
            signal::to_process(pid, sig)
        };
        // What left the group in a session of its own gets the same signal.
        for pid in self.escaped() {
            let _ = signal::to_process(pid, sig);
        }
        match sent {
            // Already gone: poll will notice the exit.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => Ok(()),
            r => r.map_err(io_err(format!("sending {sig:?} to run {}", self.id()))),
        }
    }

    /// The grace period is over (or `--kill`): SIGKILL to the group.
    pub(super) fn escalate(
        &mut self,
        clock: &dyn Clock,
        after: Duration,
    ) -> Result<(), SupervisorError> {
        self.signal(Sig::Kill)?;
        if let Phase::Stopping { killed, .. } = &mut self.phase {
            *killed = true;
        }
        self.event(
            clock,
            Event::Killed {
                after_s: after.as_secs_f64(),
            },
        );
        Ok(())
    }

    /// The current attempt's main process ended with `exit`.
    pub(super) fn ended(
        &mut self,
        clock: &dyn Clock,
        exit: ExitInfo,
        stopped_by_user: bool,
    ) -> Result<(), SupervisorError> {
        let killed = match self.phase {
            Phase::Stopping {
                killed: true,
                at_once,
                ..
            } => Some(at_once),
            _ => None,
        };
        // Leftovers outside the group (they escaped into sessions of their own) first, while
        // the monitor they were reparented to is known to be the run's.
        for pid in self.escaped() {
            let _ = signal::to_process(pid, Sig::Kill);
        }
        let Some(cur) = self.current.take() else {
            return Ok(());
        };
        let pid = cur.rec.pid;
        // Leftovers of the group (the grace period, if any, is over): kill them. A pgid is never
        // reused while any process is in the group, so this cannot hit a stranger.
        if cur.own_group && !procfs::running_in_group(pid).is_empty() {
            let _ = signal::to_group(pid, Sig::Kill);
        }
        // When it ended: as its monitor saw it (`exit.json`), not when this supervisor noticed
        // (which, for a run that ended while no daemon ran, is at the next adoption).
        let recorded_end = monitor::recorded_end(&self.dir, &cur.rec)
            .filter(|t| *t >= cur.started_wall && *t <= clock.wall());
        let ended_at = recorded_end.unwrap_or_else(|| clock.wall());
        let ran_for = match recorded_end {
            Some(t) => t.duration_since(cur.started_wall).unwrap_or_default(),
            None => clock.now().saturating_duration_since(cur.started),
        };
        let mut description = exit.describe();
        if exit.signal == Some(SIGKILL) {
            match killed {
                Some(true) => description.push_str(" (stop --kill)"),
                Some(false) => description.push_str(" after the grace period"),
                None => {}
            }
        }
        let restart_for = (stopped_by_user && self.restart_requested)
            .then(|| restart_reason(cur.knobs, self.plan.knobs()));
        let event_description = match &restart_for {
            Some(why) => format!("{description}; {why}"),
            None => description.clone(),
        };
        self.event_at(
            ended_at,
            Event::Exited {
                attempt: self.attempt,
                pid,
                code: exit.code,
                signal: exit.signal,
                signal_name: exit.signal_name().map(str::to_string),
                description: event_description,
                duration_s: ran_for.as_secs_f64(),
            },
        );
        self.history.push(Attempt {
            exit,
            stopped_by_user,
            ran_for,
        });
        self.summary.exit_code = exit.code;
        self.summary.signal = exit.signal;
        self.summary.signal_name = exit.signal_name().map(str::to_string);
        self.summary.description = Some(description.clone());

        if let Some(why) = restart_for {
            // A restart a person asked for (a knob change through the command line): shown as
            // that, not as the SIGTERM that ended the last attempt (`events.jsonl` keeps it).
            self.restart_requested = false;
            return match self.launch_attempt(clock) {
                Ok(()) => {
                    self.summary.exit_code = None;
                    self.summary.signal = None;
                    self.summary.signal_name = None;
                    self.summary.description = Some(why);
                    self.write_summary()
                }
                Err(e) => {
                    let description = format!("restart failed: {e}");
                    self.finish(clock, RunStatus::Failed, ExitInfo::unknown(), description)
                }
            };
        }
        // Out of memory: the trainer said so, or the attempt's last words on stderr do.
        let said_oom = std::mem::take(&mut self.oom);
        let oom = !exit.is_success() && (said_oom || self.stderr_says_oom());
        if !stopped_by_user && oom {
            if let Some(half) = self.halved_batch() {
                let restarts = self.history.len().saturating_sub(1) as u32;
                if restarts < self.policy.max_restarts {
                    let old = self.plan.knobs().batch_size;
                    let knobs = launch::KnobValues {
                        batch_size: Some(half),
                        ..self.plan.knobs()
                    };
                    self.set_knobs(knobs)?;
                    self.event(
                        clock,
                        Event::Changed {
                            by: "daemon".into(),
                            what: "batch_size".into(),
                            old: old.map(|o| o.to_string()),
                            new: Some(half.to_string()),
                            why: Some("out of memory; on_oom = \"halve_batch\"".into()),
                        },
                    );
                    return self.launch_attempt(clock).or_else(|e| {
                        let description = format!("restart failed: {e}");
                        self.finish(clock, RunStatus::Failed, ExitInfo::unknown(), description)
                    });
                }
            }
        }
        if stopped_by_user {
            self.event(clock, Event::Stopped {});
            return self.finish_at(
                ended_at,
                RunStatus::Stopped,
                exit,
                format!("stopped: {description}"),
            );
        }
        match restart::next_action(&self.policy, &self.history) {
            AfterExit::Restart { after } => {
                self.phase = Phase::Backoff {
                    until: clock.now() + after,
                };
                self.event(
                    clock,
                    Event::RestartScheduled {
                        attempt: self.attempt + 1,
                        after_s: after.as_secs_f64(),
                    },
                );
                self.set_status(RunStatus::Backoff)
            }
            AfterExit::GiveUp(why) => {
                let status = if exit.is_success() {
                    RunStatus::Succeeded
                } else if exit.is_unknown() {
                    RunStatus::Unknown
                } else {
                    RunStatus::Failed
                };
                if let GiveUp::MaxRestarts(_) = why {
                    self.event(
                        clock,
                        Event::GaveUp {
                            reason: why.to_string(),
                        },
                    );
                    description = format!("{description}; {why}");
                }
                self.finish_at(ended_at, status, exit, description)
            }
        }
    }

    /// Whether the end of this attempt's stderr reports an out-of-memory error (PyTorch's
    /// `torch.cuda.OutOfMemoryError: CUDA out of memory`, or the like). Only the attempt's own
    /// output, and of it the last 64 KiB: an earlier attempt's error, or one printed long ago by
    /// a script that went on, does not count.
    fn stderr_says_oom(&self) -> bool {
        use crate::config::safe_fs;
        // The run writes this file itself: a link or a FIFO in its place is not read.
        let Ok(mut f) = safe_fs::open_regular(&self.dir.stderr_path()) else {
            return false;
        };
        let Ok((tail, _)) = safe_fs::read_end(&mut f, 64 * 1024, self.stderr_from) else {
            return false;
        };
        let tail = String::from_utf8_lossy(&tail).to_lowercase();
        tail.contains("out of memory") || tail.contains("outofmemoryerror")
    }

    /// The run is over for good, now.
    pub(super) fn finish(
        &mut self,
        clock: &dyn Clock,
        status: RunStatus,
        exit: ExitInfo,
        description: String,
    ) -> Result<(), SupervisorError> {
        self.finish_at(clock.wall(), status, exit, description)
    }

    /// The run is over for good; it ended at `now` (its last process's end).
    pub(super) fn finish_at(
        &mut self,
        now: SystemTime,
        status: RunStatus,
        exit: ExitInfo,
        description: String,
    ) -> Result<(), SupervisorError> {
        self.phase = Phase::Finished;
        self.summary.status = status;
        self.summary.ended_at = Some(rfc3339(now));
        self.summary.duration_s = Some(
            now.duration_since(self.first_start)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        self.summary.exit_code = exit.code;
        self.summary.signal = exit.signal;
        self.summary.signal_name = exit.signal_name().map(str::to_string);
        self.summary.description = Some(description.clone());
        self.event_at(
            now,
            Event::Finished {
                status,
                description,
            },
        );
        self.write_summary()
    }
}
