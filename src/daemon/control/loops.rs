//! The control loops in the daemon: at every snapshot, [`crate::control::node::NodeControl`]
//! runs the thermal governors, the node power budget, energy accounting for the runs, and
//! alerts, through the daemon's control handle (the same NVML or simulator object it samples).
//!
//! Each decision becomes a node event (`governor`, `budget`, `alert`); alert hooks run on
//! threads of their own; runs' energy goes to their `summary.json` and to `ps`. The requests
//! `thermal`, `thermal_set`, `thermal_off` and `power_budget` are answered here. Settings are
//! read from `$CONFIG/control.toml` at the first snapshot (a bad file is logged and ignored, and
//! `thermal` says so).
//!
//! Jobs of several ranks reach the loops as the GPUs their ranks train on
//! (`Runs::job_gpu_groups`), so that the governor and the budget can hold a job's GPUs at one
//! cap (`control.toml`'s `[power] job_caps`).
//!
//! The advisor's straggler verdict on each live job of several ranks (from each rank's newest
//! reports and the snapshot) reaches the loops as an alert observation, so a rank that holds
//! its job back is an `alert` event, in the hooks and in `thermal`'s active alerts.
//!
//! Before the loops first move a GPU's cap, its original is recorded in
//! `$STATE/control/originals.json` (as `power cap` does), so `power reset` puts it back
//! whatever the loops did; once they have put it back themselves the record is forgotten.
//!
//! A power limit that changed although gpupilot did not change it (pynvml, `nvidia-smi`) is
//! recorded first, as a `power_changed_outside` event, with the limit before it as the original
//! (`outside`); the loops then take the new limit for the user's cap.
//!
//! A read-only daemon measures energy and raises alerts, but moves no cap.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use super::Control;
use crate::control::ControlEvent;
use crate::control::alerts::{self, HOOK_TIMEOUT, HookUser, Observation, run_hook};
use crate::control::governor::Target;
use crate::control::node::{ControlledRun, NodeControl, RunRules};
use crate::control::power::{GpuControl, Originals};
use crate::control::settings;
use crate::control::status::ControlStatus;
use crate::control::{ControlError, PowerControl, PowerLimits};
use crate::daemon::base::{RequestError, lock};
use crate::daemon::runs::Runs;
use crate::daemon::telemetry::Telemetry;
use crate::protocol::bounds;
use crate::protocol::{ErrorCode, Response, TargetGpus};
use crate::telemetry::Snapshot;
use crate::time::parse_rfc3339;

/// Reports per rank fetched for the straggler verdict: twice what it judges a rank on (the
/// ranks' reports interleave, not always evenly).
const STRAGGLER_REPORTS: u64 = 2 * crate::advisor::straggler::REPORTS as u64;

/// The loops and what the daemon knows about them.
pub(super) struct Loops {
    node: NodeControl,
    /// Why control.toml was not used.
    settings_error: Option<String>,
    /// GPUs in the newest snapshot.
    gpus: Vec<u32>,
    /// Who alert hooks run as, or why none may run (said once, then in `status`'s notes).
    hook_user: Result<HookUser, String>,
    hook_refusal_said: bool,
}

impl Control {
    fn with_loops<R>(&self, f: impl FnOnce(&mut Loops) -> R) -> R {
        let mut g = lock(&self.loops);
        let inner = g.get_or_insert_with(|| {
            let (settings, settings_error) = match settings::load(&self.paths.config) {
                Ok(s) => (s, None),
                Err(e) => {
                    tracing::warn!("control settings not used: {e}");
                    (Default::default(), Some(e))
                }
            };
            let hook_user = alerts::hook_user(
                crate::config::safe_fs::my_uid(),
                settings.hook_user.as_deref(),
                crate::ipc::user_ids,
            );
            Loops {
                node: NodeControl::new(settings),
                settings_error,
                gpus: Vec::new(),
                hook_user,
                hook_refusal_said: false,
            }
        });
        f(inner)
    }

    /// The loops themselves, locked for `f` (a run's `[power] cap_w`, see `run_power`).
    pub(in crate::daemon) fn with_node_control<R>(
        &self,
        f: impl FnOnce(&mut NodeControl) -> R,
    ) -> R {
        self.with_loops(|i| f(&mut i.node))
    }

    /// One step of the loops at a new snapshot (called from `take_snapshot`), over the
    /// daemon's `runs`.
    pub fn step(&self, snap: &Snapshot, runs: &Runs) {
        self.note_outside_changes(snap);
        self.run_caps_follow(runs);
        let mut views = self.controlled_runs(runs);
        let leaders: Vec<(usize, u32)> = views
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i, v.pid?)))
            .collect();
        for (i, uses) in gpu_use(snap, &leaders) {
            views[i].uses = uses;
        }
        let parts = if self.readonly {
            None
        } else {
            self.control_parts()
        };
        let node = &self.node;
        let findings = self.straggler_findings(snap, runs);
        let (out, hook_user) = self.with_loops(|inner| {
            inner.gpus.clear();
            inner.gpus.extend(snap.gpus.iter().map(|g| g.index));
            inner.node.set_job_findings(findings);
            let dev = parts.map(|(dev, originals, _)| Recording {
                dev: dev.as_ref(),
                originals,
            });
            let out = inner
                .node
                .step(snap, &views, &load_rules, dev.as_ref(), node);
            if let Some(dev) = &dev {
                dev.forget_restored(&out.events);
            }
            let hook_user = match &inner.hook_user {
                Ok(u) => Some(*u),
                Err(why) => {
                    if !out.hooks.is_empty()
                        && !std::mem::replace(&mut inner.hook_refusal_said, true)
                    {
                        tracing::warn!("alert hooks not run: {why}");
                    }
                    None
                }
            };
            (out, hook_user)
        });
        for e in out.events {
            self.events.record(e.into());
        }
        if let Some(user) = hook_user {
            for (argv, payload) in &out.hooks {
                // The thread is left to finish (or be killed at its timeout) on its own.
                let _ = run_hook(argv, payload, HOOK_TIMEOUT, user);
            }
        }
        for (dir, ledger) in &out.ledgers {
            if let Err(e) = crate::control::energy_ledger::save(dir, ledger) {
                tracing::warn!("{}: saving the run's energy: {e}", dir.display());
            }
        }
        if !out.energy.is_empty() {
            let mut table = runs.table();
            for (id, energy, write) in out.energy {
                if let Some(entry) = table.get_mut(&id) {
                    if let Err(e) = entry.run.set_energy(energy, write) {
                        tracing::warn!("run {id}: {e}");
                    }
                }
            }
        }
    }

    /// The live runs, as the loops see them: the loops act on live runs only (an ended run
    /// is one no longer among them), so the ended ones, however many, are not looked at at
    /// every snapshot.
    fn controlled_runs(&self, runs: &Runs) -> Vec<ControlledRun> {
        // Taken before the run table: the channels' lock comes after it, never with it here.
        let mut jobs: std::collections::BTreeMap<String, Vec<u32>> =
            runs.job_gpu_groups().into_iter().collect();
        let table = runs.table();
        table
            .list_live(std::time::SystemTime::now())
            .into_iter()
            .map(|info| ControlledRun {
                job_gpus: jobs.remove(&info.id).unwrap_or_default(),
                live: !info.is_final(),
                paused: info.status == crate::supervisor::RunStatus::Paused,
                visible: (info.gpus != "all").then(|| info.gpus.clone()),
                started_s: parse_rfc3339(&info.started_at)
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0.0, |d| d.as_secs_f64()),
                recorded: info.energy.clone(),
                pid: info.pid,
                uses: Default::default(),
                dir: info.dir,
                id: info.id,
            })
            .collect()
    }

    /// The straggler verdict on every live job of several ranks, as alert observations: each
    /// rank's last [`STRAGGLER_REPORTS`] reports against the snapshot's GPUs.
    fn straggler_findings(&self, snap: &Snapshot, runs: &Runs) -> Vec<Observation> {
        use crate::advisor::{self, AdvisorInput, Thresholds, adapt};
        let mut jobs = Vec::new();
        for (info, trainer) in runs.live_trainers() {
            let (Some(last), true) = (&trainer.last, trainer.ranks.len() >= 2) else {
                continue;
            };
            let since = (last.n + 1).saturating_sub(STRAGGLER_REPORTS * trainer.ranks.len() as u64);
            if let Ok(Response::RunMetrics {
                points, trainer, ..
            }) = runs.run_metrics(&info.id, since, None)
            {
                let w = adapt::run_window(&info.id, Vec::new(), &points, &trainer, Vec::new());
                jobs.push(w);
            }
        }
        // No job of several ranks: no verdict, and no GPU series to build (at every snapshot).
        if jobs.is_empty() {
            return Vec::new();
        }
        let input = AdvisorInput {
            now: crate::telemetry::now_s().max(snap.time_s),
            gpus: snap
                .gpus
                .iter()
                .map(|g| adapt::gpu_series(g, &[]))
                .collect(),
            runs: jobs,
            curves: Vec::new(),
            owners: Vec::new(),
        };
        let th = Thresholds::default();
        advisor::stragglers(&input, &th)
            .into_iter()
            .map(|v| Observation::Straggler {
                ratio: v.spread.as_ref().map(|s| s.ratio),
                raise_ratio: th.straggler_ratio,
                gpu: v.spread.as_ref().and_then(|s| s.gpu),
                message: v.hint.map_or(String::new(), |h| match &h.action {
                    Some(a) => format!("{} (`{}`)", h.summary, a.command()),
                    None => h.summary,
                }),
                run: v.run,
            })
            .collect()
    }

    /// The loops for `status` and `thermal`.
    pub fn status(&self) -> ControlStatus {
        self.with_loops(|inner| {
            let mut s = inner.node.status();
            if let Some(e) = &inner.settings_error {
                s.notes.push(format!("control.toml not used: {e}"));
            }
            if let (Err(why), true) = (
                &inner.hook_user,
                inner.node.settings().alerts.hook.is_some(),
            ) {
                s.notes.push(format!("alert hooks not run: {why}"));
            }
            s
        })
    }

    /// `thermal_set`: the governor holds the GPUs `gpus` names (against the newest snapshot in
    /// `telemetry`) under `target_c`, or `margin_c` below their slowdown temperature.
    pub(in crate::daemon) fn thermal_set(
        &self,
        by: &str,
        gpus: &TargetGpus,
        target_c: Option<f64>,
        margin_c: Option<f64>,
        why: Option<String>,
        telemetry: &Telemetry,
    ) -> Result<Response, RequestError> {
        let target = thermal_target(target_c, margin_c)?;
        self.needs_control()?;
        let list = self.gpu_list(gpus, telemetry)?;
        let why = why.unwrap_or_else(|| format!("hold {}", target.describe()));
        let events = self.with_loops(|i| i.node.thermal_on(&list, target, by, &why));
        Ok(self.loops_changed(events))
    }

    /// `thermal_off`: the governor lets go of the GPUs `gpus` names.
    pub(in crate::daemon) fn thermal_off(
        &self,
        by: &str,
        gpus: &TargetGpus,
        why: Option<String>,
        telemetry: &Telemetry,
    ) -> Result<Response, RequestError> {
        let list = self.gpu_list(gpus, telemetry)?;
        let why = why.unwrap_or_else(|| "turned off".into());
        let events = self.with_loops(|i| i.node.thermal_off(&list, by, &why));
        Ok(self.loops_changed(events))
    }

    /// `power_budget`: the node's budget set (checked against its bounds) or cleared.
    pub(in crate::daemon) fn power_budget(
        &self,
        by: &str,
        budget_w: Option<f64>,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        if let Some(w) = budget_w {
            bounds::BUDGET_W
                .check(w)
                .map_err(|m| RequestError::new(ErrorCode::BadRequest, m))?;
            self.needs_control()?;
        }
        let why = why.unwrap_or_else(|| match budget_w {
            Some(w) => format!("node budget {w:.0} W"),
            None => "budget cleared".into(),
        });
        let event = self.with_loops(|i| i.node.set_budget(budget_w, by, &why));
        Ok(self.loops_changed([event]))
    }

    /// `thermal`, and what every change of the loops answers: the loops as they are now.
    pub(in crate::daemon) fn loops_answer(&self) -> Response {
        Response::Control(Box::new(self.status()))
    }

    /// A change's events into the node's log; the loops as they are now.
    fn loops_changed(&self, events: impl IntoIterator<Item = ControlEvent>) -> Response {
        for e in events {
            self.events.record(e.into());
        }
        self.loops_answer()
    }

    fn needs_control(&self) -> Result<(), RequestError> {
        if self.gpu_control().is_none() {
            return Err(RequestError::new(
                ErrorCode::NotSupported,
                "this daemon has no GPUs to control (no telemetry source): start it on NVML or \
                 the simulator (`gpupilot daemon --source …`)",
            ));
        }
        Ok(())
    }

    /// The GPUs `sel` names, checked against the newest snapshot.
    fn gpu_list(&self, sel: &TargetGpus, telemetry: &Telemetry) -> Result<Vec<u32>, RequestError> {
        let have = match telemetry.newest().as_deref() {
            Some(s) => s.gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
            None => self.with_loops(|i| i.gpus.clone()),
        };
        match sel {
            TargetGpus::All => Ok(have),
            TargetGpus::Some(list) if list.is_empty() => Err(RequestError::new(
                ErrorCode::BadRequest,
                "no GPU named: give indices (`--gpu 0,1`) or leave --gpu out for all",
            )),
            TargetGpus::Some(list) => {
                if let Some(g) = list.iter().find(|g| !have.contains(g)) {
                    return Err(RequestError::new(
                        ErrorCode::BadRequest,
                        format!(
                            "no GPU {g}: this node has {} GPU{}",
                            have.len(),
                            if have.len() == 1 { "" } else { "s" }
                        ),
                    ));
                }
                Ok(list.clone())
            }
        }
    }

    /// The daemon is stopping: the caps the loops changed go back to the users' caps.
    pub fn loops_stopping(&self) {
        if self.readonly {
            return;
        }
        let Some((dev, originals, _)) = self.control_parts() else {
            return;
        };
        let dev = Recording {
            dev: dev.as_ref(),
            originals,
        };
        let events = self.with_loops(|i| {
            let events = i.node.release(&dev);
            dev.forget_restored(&events);
            events
        });
        for e in events {
            self.events.record(e.into());
        }
    }
}

/// A target from `target_c` or `margin_c` (exactly one), checked.
fn thermal_target(target_c: Option<f64>, margin_c: Option<f64>) -> Result<Target, RequestError> {
    let bad = |m: String| RequestError::new(ErrorCode::BadRequest, m);
    match (target_c, margin_c) {
        (Some(c), None) => bounds::TARGET_C.check(c).map(Target::Celsius).map_err(bad),
        (None, Some(m)) => bounds::MARGIN_C
            .check(m)
            .map(Target::BelowSlowdown)
            .map_err(bad),
        _ => Err(bad(
            "give a target temperature (`target_c`) or a margin below slowdown (`margin_c`), \
             one of the two"
                .into(),
        )),
    }
}

/// A run's `[thermal]`, `[power] node_budget_w` and `[alerts]`, from its `run.toml`.
fn load_rules(dir: &Path) -> Option<RunRules> {
    match crate::profile::check(dir.join("run.toml")) {
        Ok(p) => Some(RunRules::from(&p)),
        Err(e) => {
            tracing::warn!("{}: {e}", dir.display());
            None
        }
    }
}

/// For each run (by its place in `leaders`, with its main process): the GPUs its processes are
/// on in NVML's process lists, with the GPU memory they hold there. A process is the run's when
/// the run's main process is it, its process group or session leader, or one of its ancestors.
fn gpu_use(snap: &Snapshot, leaders: &[(usize, u32)]) -> BTreeMap<usize, BTreeMap<u32, u64>> {
    let mut out: BTreeMap<usize, BTreeMap<u32, u64>> = BTreeMap::new();
    if leaders.is_empty() {
        return out;
    }
    let mut owners: BTreeMap<u32, Option<usize>> = BTreeMap::new();
    for g in &snap.gpus {
        for p in g.processes.iter().flatten() {
            let owner = *owners
                .entry(p.pid)
                .or_insert_with(|| owner_of(p.pid, leaders));
            if let Some(run) = owner {
                *out.entry(run).or_default().entry(g.index).or_default() +=
                    p.used_memory_bytes.unwrap_or(0);
            }
        }
    }
    out
}

/// Which of `leaders` process `pid` belongs to (see [`gpu_use`]), walking up its parents.
fn owner_of(pid: u32, leaders: &[(usize, u32)]) -> Option<usize> {
    use crate::supervisor::procfs;
    let find = |x: i64| {
        leaders
            .iter()
            .find(|(_, l)| i64::from(*l) == x)
            .map(|(i, _)| *i)
    };
    let mut cur = pid;
    // A bounded walk: a process tree deeper than this is no run's.
    for _ in 0..64 {
        if let Some(i) = find(i64::from(cur)) {
            return Some(i);
        }
        let st = procfs::stat(cur).ok()?;
        if let Some(i) = find(i64::from(st.pgrp)).or_else(|| find(i64::from(st.session))) {
            return Some(i);
        }
        cur = u32::try_from(st.ppid).ok().filter(|p| *p > 1)?;
    }
    None
}

/// The control handle as the loops use it: before their first change to a GPU's cap, its
/// original is recorded (synced), so a crash or `power reset` still knows what to put back.
/// Lock order: the loops (held by the caller), then the originals.
struct Recording<'a> {
    dev: &'a dyn GpuControl,
    originals: &'a Mutex<Originals>,
}

impl PowerControl for Recording<'_> {
    fn gpu_count(&self) -> usize {
        self.dev.gpu_count()
    }

    fn power_limits(&self, gpu: usize) -> Result<PowerLimits, ControlError> {
        self.dev.power_limits(gpu)
    }

    fn set_power_limit_w(&self, gpu: usize, watts: f64) -> Result<(), ControlError> {
        let mut originals = lock(self.originals);
        let g = gpu as u32;
        let fresh = originals.get(g).power_limit_w.is_none();
        if fresh {
            let l = self.dev.power_limits(gpu)?;
            if let Some(problem) = l.problem() {
                return Err(ControlError::Failed(format!(
                    "GPU {gpu}: {problem}: there is no original to record, so its cap is not moved"
                )));
            }
            originals
                .update(g, self.dev.gpu_uuid(gpu), |r| {
                    r.power_limit_w.get_or_insert(l.current_w);
                })
                .map_err(|e| {
                    ControlError::Failed(format!(
                        "recording the original power limit in {} failed ({e}); nothing was \
                         changed",
                        originals.path().display()
                    ))
                })?;
        }
        let r = self.dev.set_power_limit_w(gpu, watts);
        if r.is_err() && fresh {
            // Nothing changed: nothing to restore.
            let _ = originals.update(g, None, |r| r.power_limit_w = None);
        }
        r
    }
}

impl Recording<'_> {
    /// The loops put a GPU back at its recorded original: nothing is left to restore.
    fn forget_restored(&self, events: &[ControlEvent]) {
        let mut originals = lock(self.originals);
        for e in events {
            let ControlEvent::Governor {
                gpu,
                change,
                new_w: Some(w),
                ..
            } = e
            else {
                continue;
            };
            if change != "restored" {
                continue;
            }
            if originals
                .get(*gpu)
                .power_limit_w
                .is_some_and(|o| (o - w).abs() < 0.5)
            {
                if let Err(e) = originals.update(*gpu, None, |r| r.power_limit_w = None) {
                    tracing::warn!("GPU {gpu}: forgetting its restored power limit: {e}");
                }
            }
        }
    }
}
