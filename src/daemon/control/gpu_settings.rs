//! The GPU-settings requests: power caps, SM clock locks and the driver's target temperature,
//! applied through the daemon's control handle (the same NVML or simulator object it samples).
//!
//! Every change is checked against the GPU's range before any setter is called, its original
//! value is recorded (`$STATE/control/originals.json`, synced) before the setter, and the
//! change is recorded as a `gpu_changed` node event with who, old → new and why. Changes are
//! made one at a time (the record's lock), so two clients never interleave a record and a set.
//! A power cap is the user's cap for the thermal governor and the node budget: it is set under
//! the loops' lock (lock order: the loops, then the record), so that no step of theirs reads
//! the caps before it and writes after it, and a GPU they hold lower stays there.

use super::run_power::{cap_one, put_back};
use super::{Control, Controller};
use crate::control::ControlError;
use crate::control::power::{check_clocks, check_gpu_max, check_power, watts};
use crate::daemon::base::{RequestError, lock};
use crate::protocol::bounds;
use crate::protocol::{ErrorCode, GpuChange, GpuSettings, NodeEvent, Response, TargetGpus};

const POWER: &str = "power_limit";
const CLOCKS: &str = "locked_clocks";
const GPU_MAX: &str = "gpu_max_temp";

fn mhz(v: [u32; 2]) -> String {
    format!("{}–{} MHz", v[0], v[1])
}

fn celsius(c: f64) -> String {
    format!("{c:.0} °C")
}

impl From<ControlError> for RequestError {
    fn from(e: ControlError) -> RequestError {
        let code = match &e {
            ControlError::NoPermission(_) => ErrorCode::NoPermission,
            ControlError::OutOfRange(_) | ControlError::NoGpu(_) => ErrorCode::BadRequest,
            ControlError::NotSupported(_) => ErrorCode::NotSupported,
            ControlError::Failed(_) => ErrorCode::Internal,
        };
        RequestError::new(code, e.to_string())
    }
}

/// A setter failed after others had succeeded: say which were changed.
fn failed(e: ControlError, done: &[GpuChange]) -> RequestError {
    let mut err = RequestError::from(e);
    if !done.is_empty() {
        let list: Vec<String> = done
            .iter()
            .map(|c| format!("GPU {} {}", c.gpu, c.new.as_deref().unwrap_or("reset")))
            .collect();
        err.message = format!("{} (already changed: {})", err.message, list.join(", "));
    }
    err
}

fn record_err(path: &std::path::Path, e: std::io::Error) -> RequestError {
    RequestError::new(
        ErrorCode::Internal,
        format!(
            "recording the original value in {} failed ({e}); nothing was changed",
            path.display()
        ),
    )
}

/// GPU `g` stays at `at_w`, below the user's cap `cap_w` just set.
fn held_note(g: usize, at_w: f64, cap_w: f64) -> String {
    format!(
        "GPU {g} stays at {}, where the thermal governor or the node budget holds it; {} is \
         its ceiling from now on",
        watts(at_w),
        watts(cap_w)
    )
}

/// A value read for `power`; an error becomes a note, but not having a setting at all
/// (NOT_SUPPORTED, e.g. no target temperature) is a fact about the GPU, shown as absent.
fn keep<T>(r: Result<T, ControlError>, notes: &mut Vec<String>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(ControlError::NotSupported(_)) => None,
        Err(e) => {
            notes.push(e.to_string());
            None
        }
    }
}

impl Control {
    fn controller(&self) -> Result<&Controller, RequestError> {
        self.handle.get().ok_or_else(|| {
            RequestError::new(
                ErrorCode::NotSupported,
                "this daemon has no GPUs to control (no telemetry source: see `gpupilot daemon \
                 --source`); start it on NVML or the simulator",
            )
        })
    }

    /// `power_reset`: the recorded power limits back on the GPUs `sel` names.
    pub(in crate::daemon) fn power_reset(
        &self,
        by: &str,
        sel: &TargetGpus,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        self.restore(by, sel, &[POWER], why)
    }

    /// `clocks_reset`: the recorded clock locks (or none) back on the GPUs `sel` names.
    pub(in crate::daemon) fn clocks_reset(
        &self,
        by: &str,
        sel: &TargetGpus,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        self.restore(by, sel, &[CLOCKS], why)
    }

    /// `gpu_max_temp_reset`: the recorded target temperatures back on the GPUs `sel` names.
    pub(in crate::daemon) fn gpu_max_reset(
        &self,
        by: &str,
        sel: &TargetGpus,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        self.restore(by, sel, &[GPU_MAX], why)
    }

    /// The GPUs `sel` names, checked against the node.
    fn targets(&self, c: &Controller, sel: &TargetGpus) -> Result<Vec<usize>, RequestError> {
        let n = c.dev.gpu_count();
        let all: Vec<usize> = (0..n).collect();
        let list = match sel {
            TargetGpus::All => return Ok(all),
            TargetGpus::Some(v) => v,
        };
        if list.is_empty() {
            return Err(RequestError::new(
                ErrorCode::BadRequest,
                "no GPU named: give indices (`--gpu 0,1`) or leave --gpu out for all",
            ));
        }
        let mut out = Vec::new();
        for &g in list {
            let g = g as usize;
            if g >= n {
                let have = match n {
                    0 => "no GPUs".to_string(),
                    1 => "GPU 0 only".to_string(),
                    n => format!("GPUs 0–{}", n - 1),
                };
                return Err(RequestError::new(
                    ErrorCode::BadRequest,
                    format!("no GPU {g}: this node has {have}"),
                ));
            }
            if !out.contains(&g) {
                out.push(g);
            }
        }
        Ok(out)
    }

    fn changed(&self, by: &str, why: &Option<String>, change: &GpuChange) {
        self.events.record(NodeEvent::GpuChanged {
            gpu: change.gpu,
            what: change.what.clone(),
            old: change.old.clone(),
            new: change.new.clone(),
            by: by.to_string(),
            why: why.clone(),
        });
    }

    pub(in crate::daemon) fn power_settings(&self) -> Result<Response, RequestError> {
        let c = self.controller()?;
        let originals = lock(&c.originals);
        let mut gpus = Vec::new();
        for g in 0..c.dev.gpu_count() {
            let mut notes = Vec::new();
            let power = keep(c.dev.power_limits(g), &mut notes);
            let clocks = keep(c.dev.clock_range(g), &mut notes);
            let gpu_max = keep(c.dev.gpu_max_temp(g), &mut notes);
            let original = originals.get(g as u32);
            gpus.push(GpuSettings {
                index: g as u32,
                uuid: c.dev.gpu_uuid(g),
                power,
                clocks,
                locked_clocks_mhz: original.locked_clocks_mhz,
                gpu_max,
                original,
                notes,
            });
        }
        Ok(Response::Power {
            gpus,
            restore_on_exit: c.restore_on_exit,
        })
    }

    pub(in crate::daemon) fn power_cap(
        &self,
        by: &str,
        sel: &TargetGpus,
        w: f64,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        bounds::CAP_W
            .check(w)
            .map_err(|m| RequestError::new(ErrorCode::BadRequest, m))?;
        let c = self.controller()?;
        let gpus = self.targets(c, sel)?;
        // Every GPU is checked before any is changed: a bad value changes nothing.
        let mut plan = Vec::new();
        let mut unreadable = Vec::new();
        for g in gpus {
            match c.dev.power_limits(g) {
                Ok(limits) => {
                    check_power(g, w, &limits)?;
                    plan.push(g);
                }
                Err(e) => unreadable.push((g, RequestError::from(e))),
            }
        }
        if let Some((g, e)) = unreadable.into_iter().next() {
            // One GPU that cannot be read (lost, or the driver refuses) holds the others back
            // only until the user names them.
            let hint = if plan.is_empty() {
                String::new()
            } else {
                let others: Vec<String> = plan.iter().map(|g| g.to_string()).collect();
                format!(
                    "; to cap the others: `gpupilot power cap {} --gpu {}`",
                    watts(w).trim_end_matches(" W"),
                    others.join(",")
                )
            };
            return Err(RequestError::new(
                e.code,
                format!("GPU {g}: {}; nothing changed{hint}", e.message),
            ));
        }
        // Under the loops' lock, so that none of their steps reads a cap before this change
        // and sets one after it; the loops take `w` as the user's cap (their ceiling) at once.
        self.with_node_control(|nc| {
            let mut originals = lock(&c.originals);
            let mut done: Vec<GpuChange> = Vec::new();
            let mut notes = Vec::new();
            for g in plan {
                let applied = cap_one(c.dev.as_ref(), nc, &mut originals, g, w, true)
                    .map_err(|e| failed(e, &done))?;
                // None: the loops hold it at or below `w`, its user's cap already.
                let before = applied.as_ref().map_or(w, |a| a.before_w);
                if !applied.is_some_and(|a| a.set_device) {
                    if let Some((_, at)) = nc.held(g as u32) {
                        notes.push(held_note(g, at, w));
                    }
                }
                let change = GpuChange {
                    gpu: g as u32,
                    what: POWER.into(),
                    old: Some(watts(before)),
                    new: Some(watts(w)),
                };
                self.changed(by, &why, &change);
                done.push(change);
            }
            Ok(Response::GpuChanged {
                changes: done,
                notes,
            })
        })
    }

    pub(in crate::daemon) fn clocks_lock(
        &self,
        by: &str,
        sel: &TargetGpus,
        min_mhz: u32,
        max_mhz: u32,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        let c = self.controller()?;
        let gpus = self.targets(c, sel)?;
        for &g in &gpus {
            check_clocks(g, min_mhz, max_mhz, &c.dev.clock_range(g)?)?;
        }
        let mut originals = lock(&c.originals);
        let mut done: Vec<GpuChange> = Vec::new();
        for g in gpus {
            let prev = originals.get(g as u32).locked_clocks_mhz;
            // Recorded first: a daemon that dies right after the lock still knows to undo it.
            originals
                .update(g as u32, c.dev.gpu_uuid(g), |r| {
                    r.locked_clocks_mhz = Some([min_mhz, max_mhz]);
                })
                .map_err(|e| record_err(originals.path(), e))?;
            if let Err(e) = c.dev.lock_clocks(g, min_mhz, max_mhz) {
                let _ = originals.update(g as u32, None, |r| r.locked_clocks_mhz = prev);
                return Err(failed(e, &done));
            }
            let change = GpuChange {
                gpu: g as u32,
                what: CLOCKS.into(),
                old: Some(prev.map(mhz).unwrap_or_else(|| "unlocked".into())),
                new: Some(mhz([min_mhz, max_mhz])),
            };
            self.changed(by, &why, &change);
            done.push(change);
        }
        Ok(Response::GpuChanged {
            changes: done,
            notes: vec![],
        })
    }

    pub(in crate::daemon) fn gpu_max(
        &self,
        by: &str,
        sel: &TargetGpus,
        target_c: f64,
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        bounds::GPU_MAX_C
            .check(target_c)
            .map_err(|m| RequestError::new(ErrorCode::BadRequest, m))?;
        let c = self.controller()?;
        let gpus = self.targets(c, sel)?;
        let mut plan = Vec::new();
        for g in gpus {
            let t = c.dev.gpu_max_temp(g)?;
            check_gpu_max(g, target_c, &t)?;
            plan.push((g, t));
        }
        let mut originals = lock(&c.originals);
        let mut done: Vec<GpuChange> = Vec::new();
        for (g, t) in plan {
            let had = originals.get(g as u32).gpu_max_c.is_some();
            originals
                .update(g as u32, c.dev.gpu_uuid(g), |r| {
                    r.gpu_max_c.get_or_insert(t.current_c);
                })
                .map_err(|e| record_err(originals.path(), e))?;
            if let Err(e) = c.dev.set_gpu_max_temp(g, target_c as i32) {
                if !had {
                    let _ = originals.update(g as u32, None, |r| r.gpu_max_c = None);
                }
                return Err(failed(e, &done));
            }
            let change = GpuChange {
                gpu: g as u32,
                what: GPU_MAX.into(),
                old: Some(celsius(t.current_c)),
                new: Some(celsius(target_c)),
            };
            self.changed(by, &why, &change);
            done.push(change);
        }
        Ok(Response::GpuChanged {
            changes: done,
            notes: vec![],
        })
    }

    /// Put back what was recorded for `settings` on the GPUs `sel` names, and forget it.
    fn restore(
        &self,
        by: &str,
        sel: &TargetGpus,
        settings: &[&str],
        why: Option<String>,
    ) -> Result<Response, RequestError> {
        let c = self.controller()?;
        let gpus = self.targets(c, sel)?;
        // Under the loops' lock, as `power_cap`.
        self.with_node_control(|nc| {
            let mut originals = lock(&c.originals);
            let mut done: Vec<GpuChange> = Vec::new();
            let mut notes = Vec::new();
            for g in gpus {
                let rec = originals.get(g as u32);
                if let (Some(was), Some(now)) = (&rec.uuid, c.dev.gpu_uuid(g)) {
                    if *was != now && !rec.is_empty() {
                        let path = originals.path().display();
                        notes.push(format!(
                            "GPU {g} is another GPU ({now}) than the one recorded ({was}): its \
                             record is kept; remove {path} if it is stale"
                        ));
                        continue;
                    }
                }
                for &what in settings {
                    let change = match what {
                        POWER => rec.power_limit_w.map(|orig| {
                            let now = c.dev.power_limits(g).ok().map(|l| l.current_w);
                            // The original is the user's cap again: a GPU the loops hold lower
                            // stays there, and its record stays until they let it go and put
                            // it back (a daemon that dies meanwhile leaves the GPU below it).
                            // A limit that cannot be read is set all the same.
                            let r =
                                put_back(c.dev.as_ref(), nc, g, orig, now.unwrap_or(f64::INFINITY));
                            let below = nc
                                .held(g as u32)
                                .map(|(_, at)| at)
                                .filter(|at| *at < orig - 0.5);
                            if let (Ok(false), Some(at)) = (&r, below) {
                                notes.push(held_note(g, at, orig));
                            }
                            let back = r.map(|set| set || below.is_none());
                            (
                                back,
                                GpuChange {
                                    gpu: g as u32,
                                    what: POWER.into(),
                                    old: now.map(watts),
                                    new: Some(watts(orig)),
                                },
                            )
                        }),
                        CLOCKS => rec.locked_clocks_mhz.map(|locked| {
                            (
                                c.dev.reset_clocks(g).map(|()| true),
                                GpuChange {
                                    gpu: g as u32,
                                    what: CLOCKS.into(),
                                    old: Some(mhz(locked)),
                                    new: Some("unlocked".into()),
                                },
                            )
                        }),
                        _ => rec.gpu_max_c.map(|orig| {
                            let now = c.dev.gpu_max_temp(g).ok().map(|t| celsius(t.current_c));
                            (
                                c.dev
                                    .set_gpu_max_temp(g, orig.round() as i32)
                                    .map(|()| true),
                                GpuChange {
                                    gpu: g as u32,
                                    what: GPU_MAX.into(),
                                    old: now,
                                    new: Some(celsius(orig)),
                                },
                            )
                        }),
                    };
                    let Some((result, change)) = change else {
                        let setting = match what {
                            POWER => "power limit",
                            CLOCKS => "clock lock",
                            _ => "target temperature",
                        };
                        // Asked of every GPU, the ones gpupilot never changed go without saying.
                        if *sel != TargetGpus::All {
                            notes.push(format!(
                                "GPU {g}: no {setting} recorded (gpupilot has not changed it)"
                            ));
                        }
                        continue;
                    };
                    // Whether the setting is at its original now (its record is forgotten).
                    let back = result.map_err(|e| failed(e, &done))?;
                    if back {
                        originals
                            .update(g as u32, None, |r| match what {
                                POWER => r.power_limit_w = None,
                                CLOCKS => r.locked_clocks_mhz = None,
                                _ => r.gpu_max_c = None,
                            })
                            .map_err(|e| {
                                RequestError::new(
                                    ErrorCode::Internal,
                                    format!(
                                        "GPU {g} was restored, but updating {} failed: {e}",
                                        originals.path().display()
                                    ),
                                )
                            })?;
                    }
                    self.changed(by, &why, &change);
                    done.push(change);
                }
            }
            if done.is_empty() && notes.is_empty() {
                notes.push(
                    "nothing recorded to restore: gpupilot has not changed these settings".into(),
                );
            }
            Ok(Response::GpuChanged {
                changes: done,
                notes,
            })
        })
    }

    /// The daemon is stopping: restore every recorded original when told to. Failures are
    /// logged; the record stays for the next daemon or a `reset`.
    pub fn settings_stopping(&self) {
        let Some(c) = self.handle.get() else {
            return;
        };
        if !c.restore_on_exit {
            return;
        }
        let why = Some("restore on exit (--restore-on-exit)".to_string());
        match self.restore("daemon", &TargetGpus::All, &[POWER, CLOCKS, GPU_MAX], why) {
            Ok(Response::GpuChanged { changes, .. }) => {
                tracing::info!(restored = changes.len(), "restored GPU settings on exit");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("restoring GPU settings on exit: {}", e.message),
        }
    }
}
