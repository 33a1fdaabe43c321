//! Alerts: at each step, the observations of the snapshot (temperature, power, ECC, row
//! remapping, a lost GPU, XIDs) against the alert rules that cover each GPU (`control.toml`'s and each live run's), the
//! live runs' progress against their stall limit, and the findings about jobs made outside the
//! loops (the advisor's straggler verdicts); each alert raised or cleared is an event and runs
//! the hooks of the rules that cover it.

use std::path::Path;

use super::{ControlEvent, ControlledRun, NodeControl, StepOutput};
use crate::control::alerts::{AlertChange, HookPayload, Observation};
use crate::control::settings::AlertRules;
use crate::telemetry::Snapshot;

impl NodeControl {
    /// Alerts from this snapshot and the live runs' progress.
    pub(super) fn alert(
        &mut self,
        snap: &Snapshot,
        runs: &[ControlledRun],
        now: f64,
        node: &str,
        out: &mut StepOutput,
    ) {
        let mut obs = Vec::new();
        for s in &snap.gpus {
            let sources = self.rules_for_gpu(s.index);
            if sources.is_empty() {
                continue;
            }
            let min = |f: fn(&AlertRules) -> Option<f64>| {
                sources.iter().filter_map(|r| f(r)).reduce(f64::min)
            };
            obs.push(Observation::Lost {
                gpu: s.index,
                lost: s.lost,
            });
            // Before the lost check: a lost GPU's last XID (79, often) says why.
            let mut newest: Vec<(u64, f64)> = Vec::new();
            for x in s.xids.iter().flatten() {
                match newest.iter_mut().find(|(n, _)| *n == x.xid) {
                    Some((_, t)) => *t = t.max(x.time_s),
                    None => newest.push((x.xid, x.time_s)),
                }
            }
            obs.extend(newest.into_iter().map(|(xid, last_s)| Observation::Xid {
                gpu: s.index,
                xid,
                last_s,
            }));
            if s.lost || s.stale {
                continue;
            }
            if let Some(limit_c) = min(|r| r.temp_c) {
                obs.push(Observation::Temperature {
                    gpu: s.index,
                    temp_c: s.temperature_c,
                    limit_c,
                });
            }
            if let Some(limit_w) = min(|r| r.power_w) {
                obs.push(Observation::Power {
                    gpu: s.index,
                    power_w: s.power_w,
                    limit_w,
                });
            }
            obs.push(Observation::Ecc {
                gpu: s.index,
                uncorrected: s.ecc_uncorrected,
            });
            obs.push(Observation::Memory {
                gpu: s.index,
                remapped: s.remapped_rows,
                retired: s.retired_pages,
            });
            let pcie = match (s.pcie_gen, s.pcie_width, s.pcie_gen_max, s.pcie_width_max) {
                (Some(g), Some(w), Some(mg), Some(mw)) => Some((g, w, mg, mw)),
                _ => None,
            };
            obs.push(Observation::Link {
                gpu: s.index,
                pcie,
                busy: s.pstate.is_some_and(|p| p <= 2) || s.util_gpu_pct.is_some_and(|u| u > 0.0),
                nvlink_down: s.nvlink.as_ref().map(|n| n.down()),
            });
        }
        for r in runs.iter().filter(|r| r.live && !r.paused) {
            let limit = [
                self.settings.alerts.stalled_after_s,
                self.runs
                    .get(&r.id)
                    .and_then(|t| t.rules.alerts.stalled_after_s),
            ]
            .into_iter()
            .flatten()
            .reduce(f64::min);
            if let Some(limit_s) = limit {
                let progress = last_progress_s(&r.dir)
                    .unwrap_or(r.started_s)
                    .max(r.started_s);
                obs.push(Observation::Stalled {
                    run: r.id.clone(),
                    idle_s: (now - progress).max(0.0),
                    limit_s,
                });
            }
        }
        obs.extend(self.job_findings.iter().cloned());
        for c in self.alerts.observe(&obs, now) {
            let (change, alert) = match &c {
                AlertChange::Raised(a) => ("raised", a),
                AlertChange::Cleared(a) => ("cleared", a),
            };
            out.events.push(ControlEvent::Alert {
                change: change.into(),
                alert: alert.clone(),
            });
            let mut hooks: Vec<Vec<String>> = Vec::new();
            let sources: Vec<&AlertRules> = match (alert.gpu, &alert.run) {
                (Some(g), _) => self.rules_for_gpu(g),
                (None, Some(run)) => std::iter::once(&self.settings.alerts)
                    .chain(self.runs.get(run).map(|t| &t.rules.alerts))
                    .collect(),
                (None, None) => vec![&self.settings.alerts],
            };
            for h in sources.into_iter().filter_map(|r| r.hook.clone()) {
                if !hooks.contains(&h) {
                    hooks.push(h);
                }
            }
            for h in hooks {
                out.hooks.push((
                    h,
                    HookPayload {
                        change: change.into(),
                        node: node.to_string(),
                        time: crate::time::rfc3339(
                            std::time::UNIX_EPOCH
                                + std::time::Duration::from_secs_f64(now.max(0.0)),
                        ),
                        alert: alert.clone(),
                    },
                ));
            }
        }
    }

    /// Every set of alert rules that covers GPU `g`: control.toml's and each live run's.
    fn rules_for_gpu(&self, g: u32) -> Vec<&AlertRules> {
        std::iter::once(&self.settings.alerts)
            .chain(
                self.runs
                    .values()
                    .filter(|t| t.gpus.as_ref().is_none_or(|s| s.contains(&g)))
                    .map(|t| &t.rules.alerts),
            )
            .filter(|r| r.any())
            .collect()
    }

    /// The findings about live jobs to alert on from the next step on (the daemon's straggler
    /// verdicts: `Observation::Straggler`), replacing the last ones.
    pub fn set_job_findings(&mut self, findings: Vec<Observation>) {
        self.job_findings = findings;
    }
}

/// Newest change to the run's output or metrics, Unix seconds.
fn last_progress_s(dir: &Path) -> Option<f64> {
    ["stdout.log", "stderr.log", "metrics.jsonl"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok()?.modified().ok())
        .filter_map(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs_f64())
        .reduce(f64::max)
}
