//! Energy per GPU and per run: each GPU's meter (NVML's counter, else power integrated) at
//! every snapshot, charged to the runs on it (by the GPU memory their processes hold there,
//! else to the runs that declared it), each live run's samples from its `metrics.jsonl`, and
//! its ledger (`energy_ledger`) saved in its directory, so a daemon that starts again goes on
//! from the counters instead of losing what happened while none measured.

use std::collections::BTreeMap;
use std::path::Path;

use super::{
    BY_ENERGY, ControlEvent, ControlledRun, ENERGY_WRITE_EVERY_S, NodeControl, RunTrack, StepOutput,
};
use crate::control::energy::{EnergySource, GpuEnergy, RunEnergy, counter_bound_j};
use crate::control::energy_ledger::{self, Ledger, LedgerGpu};
use crate::telemetry::{GpuSample, Snapshot};

impl NodeControl {
    /// Energy per GPU from this snapshot.
    /// A counter that went back or jumped beyond what the GPU can draw is said once per GPU.
    pub(super) fn meter(&mut self, snap: &Snapshot, out: &mut StepOutput) {
        for s in &snap.gpus {
            if s.lost {
                continue;
            }
            let m = self.meters.entry(s.index).or_default();
            let d = m.update(s.time_s, s.energy_j, s.power_w, s.power_max_w);
            if let Some(why) = m.take_note() {
                out.events.push(ControlEvent::Governor {
                    gpu: s.index,
                    change: "implausible".into(),
                    target_c: None,
                    temperature_c: None,
                    old_w: None,
                    new_w: None,
                    by: BY_ENERGY.into(),
                    why: format!("GPU {}: {why}", s.index),
                });
            }
            if d <= 0.0 {
                continue;
            }
            // Which way most samples were measured, for saying so.
            let counter = m.last_source() == Some(EnergySource::Counter);
            for (id, share) in charged(s, &self.runs) {
                let Some(track) = self.runs.get_mut(&id) else {
                    continue;
                };
                if track.caught_up {
                    continue;
                }
                *track.per_gpu.entry(s.index).or_default() += d * share;
                if counter {
                    track.counter_s += 1.0;
                } else {
                    track.power_s += 1.0;
                }
            }
        }
    }

    /// Read new metrics lines of live runs; say their energy; save their ledgers.
    pub(super) fn run_energy(
        &mut self,
        snap: &Snapshot,
        runs: &[ControlledRun],
        now: f64,
        out: &mut StepOutput,
    ) {
        for r in runs.iter().filter(|r| r.live) {
            let Some(track) = self.runs.get_mut(&r.id) else {
                continue;
            };
            track.caught_up = false;
            if now - track.saved_s >= energy_ledger::SAVE_EVERY_S {
                track.saved_s = now;
                out.ledgers.push((r.dir.clone(), ledger_of(track, snap)));
            }
            read_metrics(&r.dir.join("metrics.jsonl"), track);
            let write = now - track.written_s >= ENERGY_WRITE_EVERY_S;
            if write {
                track.written_s = now;
            }
            let track = &self.runs[&r.id];
            out.energy
                .push((r.id.clone(), self.energy_of(track), write));
        }
    }

    pub(super) fn energy_of(&self, track: &RunTrack) -> RunEnergy {
        let per_gpu = track
            .per_gpu
            .iter()
            .map(|(g, j)| GpuEnergy {
                gpu: *g,
                energy_j: *j,
            })
            .collect();
        let source = if track.counter_s == 0.0 && track.power_s == 0.0 {
            None
        } else if track.counter_s >= track.power_s {
            Some(EnergySource::Counter)
        } else {
            Some(EnergySource::Power)
        };
        let rates = track.rules.energy.over(&self.settings.rates());
        RunEnergy::new(per_gpu, track.samples.samples(), None, source).with_rates(&rates)
    }
}

/// Who is charged GPU `s`'s energy, and each one's share (summing to 1, or nothing):
///
/// - the runs whose processes are on it (NVML's process list), by the GPU memory they hold
///   there (equally when it is not reported);
/// - else the runs that declared it (`CUDA_VISIBLE_DEVICES`), equally;
/// - and, only where the GPU's processes cannot be read at all, the runs that declared no GPU
///   (they may use any).
///
/// A run that declared no GPU and has no process on one is charged nothing: a CPU-only script
/// costs no GPU energy.
fn charged(s: &GpuSample, runs: &BTreeMap<String, RunTrack>) -> Vec<(String, f64)> {
    let users: Vec<(&String, u64)> = runs
        .iter()
        .filter_map(|(id, t)| t.uses.get(&s.index).map(|b| (id, *b)))
        .collect();
    if !users.is_empty() {
        let total: u64 = users.iter().map(|(_, b)| b).sum();
        let n = users.len() as f64;
        return users
            .into_iter()
            .map(|(id, b)| {
                let share = if total > 0 {
                    b as f64 / total as f64
                } else {
                    1.0 / n
                };
                (id.clone(), share)
            })
            .collect();
    }
    let unknown = s.processes.is_none();
    let claim: Vec<&String> = runs
        .iter()
        .filter(|(_, t)| match &t.gpus {
            Some(set) => set.contains(&s.index),
            None => unknown,
        })
        .map(|(id, _)| id)
        .collect();
    let n = claim.len() as f64;
    claim.into_iter().map(|id| (id.clone(), 1.0 / n)).collect()
}

/// A run's ledger at snapshot `snap`: its energy per GPU and each GPU's counter now.
pub(super) fn ledger_of(track: &RunTrack, snap: &Snapshot) -> Ledger {
    let gpus = track
        .per_gpu
        .iter()
        .map(|(g, j)| {
            let s = snap.gpus.iter().find(|s| s.index == *g && !s.lost);
            LedgerGpu {
                gpu: *g,
                energy_j: *j,
                uuid: s.and_then(|s| s.uuid.clone()),
                counter_j: s.and_then(|s| s.energy_j),
            }
        })
        .collect();
    Ledger {
        saved_s: snap.time_s,
        gpus,
        counter_s: track.counter_s,
        power_s: track.power_s,
    }
}

/// Add to `per_gpu` what each GPU's counter moved since the ledger was saved (the run lived on
/// while no daemon measured it). True when any was added: the meters' first increments are
/// then already counted.
pub(super) fn catch_up(l: &Ledger, snap: &Snapshot, per_gpu: &mut BTreeMap<u32, f64>) -> bool {
    let mut any = false;
    for g in &l.gpus {
        let Some(saved) = g.counter_j else { continue };
        let Some(s) = snap.gpus.iter().find(|s| s.index == g.gpu && !s.lost) else {
            continue;
        };
        // Another GPU at this index, or a counter reset by a driver reload: nothing known.
        if g.uuid.is_some() && s.uuid.is_some() && g.uuid != s.uuid {
            continue;
        }
        // What the GPU could have drawn at most since the ledger was saved: a counter that
        // moved more (a wild reading, a wrap) tells nothing.
        let bound = counter_bound_j(s.power_max_w, snap.time_s - l.saved_s);
        match s.energy_j {
            Some(now) if now >= saved && now.is_finite() && now - saved <= bound => {
                *per_gpu.entry(g.gpu).or_default() += now - saved;
                any = true;
            }
            _ => {}
        }
    }
    any
}

/// Feed the metrics lines written since the last read to the run's sample counter.
fn read_metrics(path: &Path, track: &mut RunTrack) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = crate::config::safe_fs::open_regular(path) else {
        return;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len <= track.metrics_read || f.seek(SeekFrom::Start(track.metrics_read)).is_err() {
        return;
    }
    let mut buf = Vec::new();
    // At most 4 MiB a step: a huge backlog is caught up over several steps.
    if f.take(4 << 20).read_to_end(&mut buf).is_err() {
        return;
    }
    let Some(end) = buf.iter().rposition(|b| *b == b'\n') else {
        return;
    };
    for line in String::from_utf8_lossy(&buf[..end]).lines() {
        track.samples.line(line);
    }
    track.metrics_read += end as u64 + 1;
}
