//! A run's `[power] cap_w`: the daemon caps the run's GPUs while the run lives.
//!
//! - Start: the GPUs the run sees (`CUDA_VISIBLE_DEVICES` as its launch will set it, or every
//!   GPU) are checked against their range first; a value outside, a GPU the node lacks, a daemon
//!   with nothing to control or a setter that fails (NO_PERMISSION) refuses the run, which is
//!   then not started and nothing is left changed. The caps are set before the process starts,
//!   each original recorded first in `$STATE/control/originals.json`, as `power cap` does.
//! - Restart (a new attempt) and adoption by a new daemon: the caps are set again where they
//!   differ; a failure is said in the run's events and the node's log, the run goes on.
//! - End for good with `restore_on_exit` (the default): each GPU goes back to its recorded
//!   original, or to the cap of another live run that caps it too. A GPU whose cap someone
//!   changed since is left as it is, and the run's events say so.
//!
//! For the thermal governor and the node budget the run's cap is the user's cap (their
//! ceiling): a GPU they control is lowered at once, never raised past it.
//!
//! Lock order: the loops, then the runs' caps, then the originals; the run table is never held
//! with any of them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use super::Control;
use crate::control::ControlError;
use crate::control::node::NodeControl;
use crate::control::power::{GpuControl, Originals, check_power, watts};
use crate::daemon::base::{RequestError, lock};
use crate::daemon::runs::Runs;
use crate::profile::{self, Launcher, Profile, VisibleGpus};
use crate::protocol::{ErrorCode, NodeEvent};
use crate::supervisor::{Caller, Event, EventRecord, Run, RunDir};
use crate::time::rfc3339;

const POWER: &str = "power_limit";
const BY: &str = "daemon";

/// The caps runs' profiles set, by run id.
#[derive(Debug, Default)]
pub struct RunCaps {
    runs: BTreeMap<String, Held>,
    /// Live runs already looked at (so an adopted run's profile is read once).
    seen: BTreeSet<String>,
}

#[derive(Debug, Clone)]
struct Held {
    cap_w: f64,
    restore: bool,
    gpus: Vec<usize>,
    /// The attempt the caps were last set for: a new one is a restart.
    attempt: u32,
}

/// What an adopted run's profile asks: the cap, `restore_on_exit`, the GPUs.
type Wanted = (f64, bool, Vec<usize>);

/// What a start set, for [`Control::run_cap_started`] (or [`Control::run_cap_undo`] when the
/// run did not start after all).
pub(in crate::daemon) struct StartCap {
    cap_w: f64,
    restore: bool,
    gpus: Vec<usize>,
    done: Vec<Applied>,
}

/// One GPU capped.
pub(super) struct Applied {
    gpu: usize,
    /// The user's cap before (what the change record shows as old).
    pub(super) before_w: f64,
    /// Its original was recorded by this change.
    fresh: bool,
    /// The GPU's limit was set (not only the loops' ceiling moved).
    pub(super) set_device: bool,
}

/// The cap a profile asks this daemon to hold (a Slurm job's GPUs are on other nodes).
fn cap_of(p: &Profile) -> Option<f64> {
    match p.run.launcher {
        Launcher::Slurm(_) => None,
        _ => p.power.cap_w,
    }
}

/// `CUDA_VISIBLE_DEVICES` as the launch will set it (see `supervisor::launch::plan`).
fn visible_for(p: &Profile, caller: &Caller) -> Option<String> {
    const VAR: &str = "CUDA_VISIBLE_DEVICES";
    match &p.run.gpus {
        profile::GpuSelection::All => None,
        profile::GpuSelection::List(l) => {
            Some(l.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        }
        profile::GpuSelection::Inherit => {
            p.run.env.get(VAR).or_else(|| caller.env.get(VAR)).cloned()
        }
    }
}

/// The GPUs of this node a `CUDA_VISIBLE_DEVICES` value names (indices or UUID prefixes, read
/// by [`VisibleGpus`]: unset or `all` is every GPU, an empty list none).
fn gpus_of(dev: &dyn GpuControl, visible: Option<&str>) -> Result<Vec<usize>, String> {
    let n = dev.gpu_count();
    let uuids: Vec<Option<String>> = (0..n).map(|g| dev.gpu_uuid(g)).collect();
    let node = uuids
        .iter()
        .enumerate()
        .map(|(g, u)| (g as u32, u.as_deref()));
    match VisibleGpus::parse(visible).resolve(node) {
        Ok(gpus) => Ok(gpus.into_iter().map(|g| g as usize).collect()),
        Err(e) => {
            let have = match n {
                0 => "no GPUs".to_string(),
                1 => "GPU 0 only".to_string(),
                n => format!("GPUs 0–{}", n - 1),
            };
            Err(format!("{e} (it has {have})"))
        }
    }
}

fn run_event(dir: &RunDir, what: String, old: Option<String>, new: Option<String>, why: String) {
    let rec = EventRecord {
        time: rfc3339(SystemTime::now()),
        event: Event::Changed {
            by: BY.into(),
            what,
            old,
            new,
            why: Some(why),
        },
    };
    if let Err(e) = dir.append_event(&rec) {
        tracing::warn!("writing {}: {e}", dir.events_path().display());
    }
}

/// The limit to call "before" when the loops do not hold the GPU: a limit read as 0 W (a driver
/// oddity) is no value to restore, so the enforced, then the default limit.
fn found_w(l: &crate::control::PowerLimits) -> f64 {
    [Some(l.current_w), l.enforced_w]
        .into_iter()
        .flatten()
        .find(|v| *v > 0.0)
        .unwrap_or(l.default_w)
}

/// Cap GPU `g` at `w` as the user's cap: record the original first, set the GPU (or, where the
/// loops hold it at or below `w`, only their ceiling). None: it was at `w` already. `always`:
/// a GPU the loops do not hold is set even at `w` already (a user's `power cap`: the same
/// answer, NO_PERMISSION included, whatever the GPU was at).
pub(super) fn cap_one(
    dev: &dyn GpuControl,
    nc: &mut NodeControl,
    originals: &mut Originals,
    g: usize,
    w: f64,
    always: bool,
) -> Result<Option<Applied>, ControlError> {
    let l = dev.power_limits(g)?;
    check_power(g, w, &l)?;
    let held = nc.held(g as u32);
    let before_w = held.map_or_else(|| found_w(&l), |(user, _)| user);
    let set_device = match held {
        // The loops hold it lower already: they will not raise it past `w`.
        Some((_, at)) => at > w + 0.5,
        None => always || (l.current_w - w).abs() >= 0.5,
    };
    if !set_device && (before_w - w).abs() < 0.5 {
        return Ok(None);
    }
    let had = originals.get(g as u32).power_limit_w.is_some();
    originals
        .update(g as u32, dev.gpu_uuid(g), |r| {
            r.power_limit_w.get_or_insert(before_w);
        })
        .map_err(|e| {
            ControlError::Failed(format!(
                "recording the original value in {} failed ({e}); nothing was changed",
                originals.path().display()
            ))
        })?;
    if set_device {
        if let Err(e) = dev.set_power_limit_w(g, w) {
            if !had {
                let _ = originals.update(g as u32, None, |r| r.power_limit_w = None);
            }
            return Err(e);
        }
    }
    nc.set_user_cap(g as u32, w, set_device.then_some(w));
    Ok(Some(Applied {
        gpu: g,
        before_w,
        fresh: !had,
        set_device,
    }))
}

/// Put GPU `g` at `to` as the user's cap (setting the GPU only where the loops do not hold it
/// lower). Returns whether the GPU's limit was set.
pub(super) fn put_back(
    dev: &dyn GpuControl,
    nc: &mut NodeControl,
    g: usize,
    to: f64,
    now_w: f64,
) -> Result<bool, ControlError> {
    let set_device = match nc.held(g as u32) {
        Some((_, at)) => at > to + 0.5,
        None => (now_w - to).abs() >= 0.5,
    };
    if set_device {
        dev.set_power_limit_w(g, to)?;
    }
    nc.set_user_cap(g as u32, to, set_device.then_some(to));
    Ok(set_device)
}

/// A change made for a run, to record in both logs.
struct Note {
    dir: RunDir,
    /// None: about the run's GPUs together.
    gpu: Option<usize>,
    old: Option<String>,
    new: Option<String>,
    why: String,
    /// Also a `gpu_changed` node event (a change was made).
    node: bool,
}

impl Control {
    /// Before a run starts: when its profile sets `[power] cap_w`, cap the GPUs it will see.
    /// An error refuses the run, and nothing is left changed.
    pub(in crate::daemon) fn run_cap_before_start(
        &self,
        p: &Profile,
        caller: &Caller,
    ) -> Result<Option<StartCap>, RequestError> {
        let Some(w) = cap_of(p) else {
            if p.power.cap_w.is_some() {
                tracing::info!(
                    "profile {}: [power] cap_w is not applied by this daemon to a Slurm job",
                    p.name
                );
            }
            return Ok(None);
        };
        let refuse = |code: ErrorCode, m: String| {
            RequestError::new(
                code,
                format!(
                    "the profile's [power] cap_w = {}: {m}; the run was not started",
                    watts(w)
                ),
            )
        };
        let Some((dev, originals, caps)) = self.control_parts() else {
            return Err(refuse(
                ErrorCode::NotSupported,
                "this daemon has no GPUs to control (no telemetry source): start it on NVML or \
                 the simulator (`gpupilot daemon --source …`), or take cap_w out of the profile"
                    .into(),
            ));
        };
        let dev: &dyn GpuControl = dev.as_ref();
        let visible = visible_for(p, caller);
        let gpus =
            gpus_of(dev, visible.as_deref()).map_err(|m| refuse(ErrorCode::BadRequest, m))?;
        // Every GPU is checked before any is changed.
        for &g in &gpus {
            let l = dev
                .power_limits(g)
                .map_err(|e| refuse(RequestError::from(e.clone()).code, e.to_string()))?;
            check_power(g, w, &l).map_err(|e| {
                refuse(
                    ErrorCode::BadRequest,
                    format!("{e} (`gpupilot power` shows each GPU's range)"),
                )
            })?;
        }
        let result = self.with_node_control(|nc| {
            let _caps = lock(caps);
            let mut o = lock(originals);
            let mut done = Vec::new();
            for &g in &gpus {
                match cap_one(dev, nc, &mut o, g, w, false) {
                    Ok(a) => done.extend(a),
                    Err(e) => return Err((e, done)),
                }
            }
            Ok(done)
        });
        match result {
            Ok(done) => Ok(Some(StartCap {
                cap_w: w,
                restore: p.power.restore_on_exit,
                gpus,
                done,
            })),
            Err((e, done)) => {
                self.run_cap_undo(Some(StartCap {
                    cap_w: w,
                    restore: true,
                    gpus,
                    done,
                }));
                let code = RequestError::from(e.clone()).code;
                Err(refuse(code, e.to_string()))
            }
        }
    }

    /// The run did not start: put back what [`Self::run_cap_before_start`] set.
    pub(in crate::daemon) fn run_cap_undo(&self, cap: Option<StartCap>) {
        let Some(cap) = cap else {
            return;
        };
        let Some((dev, originals, caps)) = self.control_parts() else {
            return;
        };
        let dev: &dyn GpuControl = dev.as_ref();
        self.with_node_control(|nc| {
            let _caps = lock(caps);
            let mut o = lock(originals);
            for a in cap.done.iter().rev() {
                let r = if a.set_device {
                    dev.set_power_limit_w(a.gpu, a.before_w)
                } else {
                    Ok(())
                };
                nc.set_user_cap(a.gpu as u32, a.before_w, a.set_device.then_some(a.before_w));
                match r {
                    Ok(()) if a.fresh => {
                        let _ = o.update(a.gpu as u32, None, |r| r.power_limit_w = None);
                    }
                    Ok(()) => {}
                    Err(e) => tracing::warn!(
                        "GPU {}: putting back {} after a run did not start: {e}",
                        a.gpu,
                        watts(a.before_w)
                    ),
                }
            }
        });
    }

    /// The run started: record what its cap changed, and hold the cap while it lives.
    pub(in crate::daemon) fn run_cap_started(&self, run: &Run, cap: Option<StartCap>) {
        let Some(cap) = cap else {
            return;
        };
        let Some((_, _, caps)) = self.control_parts() else {
            return;
        };
        let id = run.id().to_string();
        let notes: Vec<Note> = cap
            .done
            .iter()
            .map(|a| Note {
                dir: run.dir().clone(),
                gpu: Some(a.gpu),
                old: Some(watts(a.before_w)),
                new: Some(watts(cap.cap_w)),
                why: format!("profile [power] cap_w of run {id}"),
                node: true,
            })
            .collect();
        {
            let mut c = lock(caps);
            c.seen.insert(id.clone());
            c.runs.insert(
                id,
                Held {
                    cap_w: cap.cap_w,
                    restore: cap.restore,
                    gpus: cap.gpus,
                    attempt: run.attempt(),
                },
            );
        }
        self.record_notes(notes);
    }

    fn record_notes(&self, notes: Vec<Note>) {
        for n in notes {
            let what = match n.gpu {
                Some(g) => format!("GPU {g} {POWER}"),
                None => POWER.into(),
            };
            if let (true, Some(g)) = (n.node, n.gpu) {
                self.events.record(NodeEvent::GpuChanged {
                    gpu: g as u32,
                    what: POWER.into(),
                    old: n.old.clone(),
                    new: n.new.clone(),
                    by: BY.into(),
                    why: Some(n.why.clone()),
                });
            }
            run_event(&n.dir, what, n.old, n.new, n.why);
        }
    }

    /// At each snapshot: cap again the GPUs of runs that restarted (or that this daemon adopted),
    /// and put back the caps of runs that ended for good.
    pub(in crate::daemon) fn run_caps_follow(&self, runs: &Runs) {
        if self.readonly {
            return;
        }
        let Some((dev, originals, caps)) = self.control_parts() else {
            return;
        };
        let dev: Arc<dyn GpuControl> = Arc::clone(dev);
        // What the run table says, read alone.
        let (tracked, seen) = {
            let c = lock(caps);
            (c.runs.clone(), c.seen.clone())
        };
        let mut ended: Vec<(String, RunDir)> = Vec::new();
        let mut restarted: Vec<(String, RunDir, u32)> = Vec::new();
        let mut fresh: Vec<(String, RunDir, u32, Option<String>)> = Vec::new();
        let mut live_ids = BTreeSet::new();
        {
            let table = runs.table();
            for (id, h) in &tracked {
                match table.get(id).map(|e| &e.run) {
                    Some(r) if !r.is_finished() && r.attempt() > h.attempt => {
                        restarted.push((id.clone(), r.dir().clone(), r.attempt()));
                    }
                    Some(r) if !r.is_finished() => {}
                    Some(r) => ended.push((id.clone(), r.dir().clone())),
                    None => {}
                }
            }
            for r in table.live() {
                live_ids.insert(r.id().to_string());
                if !seen.contains(r.id()) {
                    let visible = r.plan().env.get("CUDA_VISIBLE_DEVICES").cloned();
                    fresh.push((r.id().to_string(), r.dir().clone(), r.attempt(), visible));
                }
            }
        }
        if ended.is_empty() && restarted.is_empty() && fresh.is_empty() {
            return;
        }
        // Profiles of runs not looked at yet (adopted): read outside every lock.
        let fresh: Vec<(String, RunDir, u32, Option<Wanted>)> = fresh
            .into_iter()
            .map(|(id, dir, attempt, visible)| {
                let want = match profile::check(dir.path().join("run.toml")) {
                    Ok(p) => {
                        cap_of(&p).and_then(|w| match gpus_of(dev.as_ref(), visible.as_deref()) {
                            Ok(gpus) => Some((w, p.power.restore_on_exit, gpus)),
                            Err(m) => {
                                tracing::warn!("run {id}: [power] cap_w not applied: {m}");
                                None
                            }
                        })
                    }
                    Err(e) => {
                        tracing::warn!("run {id}: {e}");
                        None
                    }
                };
                (id, dir, attempt, want)
            })
            .collect();
        let notes = self.with_node_control(|nc| {
            let mut c = lock(caps);
            let mut o = lock(originals);
            let mut notes = Vec::new();
            for (id, dir, attempt, want) in fresh {
                c.seen.insert(id.clone());
                let Some((w, restore, gpus)) = want else {
                    continue;
                };
                let why = format!("profile [power] cap_w of run {id} (adopted by this daemon)");
                cap_all(dev.as_ref(), nc, &mut o, &gpus, w, &dir, &why, &mut notes);
                c.runs.insert(
                    id,
                    Held {
                        cap_w: w,
                        restore,
                        gpus,
                        attempt,
                    },
                );
            }
            for (id, dir, attempt) in restarted {
                let Some(h) = c.runs.get_mut(&id) else {
                    continue;
                };
                h.attempt = attempt;
                let (w, gpus) = (h.cap_w, h.gpus.clone());
                let why = format!("profile [power] cap_w of run {id} (restart, attempt {attempt})");
                cap_all(dev.as_ref(), nc, &mut o, &gpus, w, &dir, &why, &mut notes);
            }
            for (id, dir) in ended {
                let Some(h) = c.runs.remove(&id) else {
                    continue;
                };
                if !h.restore {
                    notes.push(Note {
                        dir: dir.clone(),
                        gpu: None,
                        old: None,
                        new: None,
                        why: format!(
                            "run {id} ended; restore_on_exit = false: its cap of {} stays on \
                             GPU {} (`gpupilot power reset` puts the originals back)",
                            watts(h.cap_w),
                            list(&h.gpus)
                        ),
                        node: false,
                    });
                    continue;
                }
                for &g in &h.gpus {
                    // Another live run that caps this GPU too: its cap holds (the newest).
                    let other = c
                        .runs
                        .iter()
                        .rev()
                        .find(|(_, x)| x.gpus.contains(&g))
                        .map(|(k, x)| (k.clone(), x.cap_w));
                    restore_one(
                        dev.as_ref(),
                        nc,
                        &mut o,
                        g,
                        &id,
                        &h,
                        other,
                        &dir,
                        &mut notes,
                    );
                }
            }
            let RunCaps { runs, seen } = &mut *c;
            seen.retain(|id| live_ids.contains(id) || runs.contains_key(id));
            notes
        });
        self.record_notes(notes);
    }
}

fn list(gpus: &[usize]) -> String {
    gpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Cap `gpus` at `w` after the run started (restart, adoption): failures are said, not
/// returned; the run goes on.
#[allow(clippy::too_many_arguments)]
fn cap_all(
    dev: &dyn GpuControl,
    nc: &mut NodeControl,
    o: &mut Originals,
    gpus: &[usize],
    w: f64,
    dir: &RunDir,
    why: &str,
    notes: &mut Vec<Note>,
) {
    for &g in gpus {
        match cap_one(dev, nc, o, g, w, false) {
            Ok(Some(a)) => notes.push(Note {
                dir: dir.clone(),
                gpu: Some(g),
                old: Some(watts(a.before_w)),
                new: Some(watts(w)),
                why: why.to_string(),
                node: true,
            }),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("GPU {g}: {why}: {e}");
                notes.push(Note {
                    dir: dir.clone(),
                    gpu: Some(g),
                    old: None,
                    new: None,
                    why: format!("{why}: could not set {}: {e}", watts(w)),
                    node: false,
                });
            }
        }
    }
}

/// The run `id` (cap `h.cap_w`) ended: GPU `g` back to `other`'s cap or its original, unless
/// someone changed it since.
#[allow(clippy::too_many_arguments)]
fn restore_one(
    dev: &dyn GpuControl,
    nc: &mut NodeControl,
    o: &mut Originals,
    g: usize,
    id: &str,
    h: &Held,
    other: Option<(String, f64)>,
    dir: &RunDir,
    notes: &mut Vec<Note>,
) {
    let mut say = |old: Option<String>, new: Option<String>, why: String, node: bool| {
        notes.push(Note {
            dir: dir.clone(),
            gpu: Some(g),
            old,
            new,
            why,
            node,
        })
    };
    let l = match dev.power_limits(g) {
        Ok(l) => l,
        Err(e) => {
            say(
                None,
                None,
                format!("run {id} ended; its cap was not put back: {e}"),
                false,
            );
            return;
        }
    };
    let now_w = nc.held(g as u32).map_or(l.current_w, |(user, _)| user);
    if (now_w - h.cap_w).abs() >= 0.5 {
        say(
            Some(watts(now_w)),
            Some(watts(now_w)),
            format!(
                "run {id} ended; GPU {g}'s cap was changed since the run set it to {} (it is {} \
                 now): left as it is (`gpupilot power reset` puts the recorded original back)",
                watts(h.cap_w),
                watts(now_w)
            ),
            false,
        );
        return;
    }
    let recorded = o.get(g as u32).power_limit_w;
    let (to, why, forget) = match (other, recorded) {
        (Some((run, w)), _) => (
            w,
            format!("run {id} ended; profile [power] cap_w of run {run}, which also caps GPU {g}"),
            false,
        ),
        (None, Some(orig)) => (
            orig,
            format!("run {id} ended: the original limit is back (profile [power] restore_on_exit)"),
            true,
        ),
        (None, None) => {
            say(
                Some(watts(now_w)),
                Some(watts(now_w)),
                format!(
                    "run {id} ended; no original is recorded for GPU {g} (a `power reset` since?): \
                     left as it is"
                ),
                false,
            );
            return;
        }
    };
    if let Err(e) = put_back(dev, nc, g, to, l.current_w) {
        say(
            Some(watts(now_w)),
            None,
            format!("{why}: putting back {} failed: {e}", watts(to)),
            false,
        );
        return;
    }
    if forget {
        if let Err(e) = o.update(g as u32, None, |r| r.power_limit_w = None) {
            tracing::warn!(
                "GPU {g} was restored, but updating {} failed: {e}",
                o.path().display()
            );
        }
    }
    if (to - now_w).abs() >= 0.5 {
        say(Some(watts(now_w)), Some(watts(to)), why, true);
    }
}
