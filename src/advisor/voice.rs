//! One voice between the advisor, the control loops and the energy tuner (docs/operations.md,
//! "One voice"): who holds a GPU's cap (the input's owners), which GPUs form one job, when the
//! tuner's choice no longer holds, and the last pass over the hints, which makes every cap or
//! thermal target proposed for a job's GPU act on the whole job.

use super::rules::{Window, ev, mean};
use super::{Evidence, Hint, HintKind, Knob, Suggestion, gpu_list};
use crate::control::owner::{CapOwner, TunerChoice};

impl<'a> Window<'a> {
    /// Who holds `gpu`'s cap, where the input says.
    pub(super) fn owner(&self, gpu: u32) -> Option<&'a CapOwner> {
        self.input
            .owners
            .iter()
            .find(|o| o.gpu == gpu)?
            .owner
            .as_ref()
    }

    /// The owner of `gpu`'s cap when it is not a person: the loops or the tuner chose it, and
    /// no rule proposes moving it.
    pub(super) fn chosen(&self, gpu: u32) -> Option<&'a CapOwner> {
        self.owner(gpu).filter(|o| !matches!(o, CapOwner::Operator))
    }

    /// The GPUs of the job `gpu` is one of (a live run's, or a tuned job's, of several GPUs),
    /// else `gpu` alone.
    pub(super) fn job_gpus(&self, gpu: u32) -> Vec<u32> {
        let run = self
            .input
            .runs
            .iter()
            .find(|r| r.gpus.len() > 1 && r.gpus.contains(&gpu))
            .map(|r| r.gpus.clone());
        let tuned = match self.owner(gpu) {
            Some(CapOwner::Tuner(c)) if c.gpus.len() > 1 => Some(c.gpus.clone()),
            Some(CapOwner::TunedClocks(c)) if c.gpus.len() > 1 => Some(c.gpus.clone()),
            _ => None,
        };
        let mut gpus = run.or(tuned).unwrap_or_else(|| vec![gpu]);
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }
}

/// Why a tuner's choice no longer holds, and the run to search again.
struct Moved {
    run: String,
    why: String,
    evidence: Vec<Evidence>,
}

/// Whether the workload moved away from what the search measured at its cap: the run's
/// throughput (the job's, over all its ranks) or its GPUs' power off by more than
/// `workload_shift`, read after the newest cap change on its GPUs has settled; or the run it
/// was measured on has ended and another trains on its GPUs. None: it holds, or there is too
/// little to tell.
fn moved(w: &Window, c: &TunerChoice) -> Option<Moved> {
    let th = w.th;
    let Some(run) = w.input.runs.iter().find(|r| r.run == c.run) else {
        let other = w
            .input
            .runs
            .iter()
            .find(|r| r.gpus.iter().any(|g| c.gpus.contains(g)))?;
        return Some(Moved {
            run: other.run.clone(),
            why: format!(
                "it was measured on run {}, which has ended, and run {} trains on its GPUs now",
                c.run, other.run
            ),
            evidence: Vec::new(),
        });
    };
    let since = run
        .changes
        .iter()
        .filter(|ch| ch.knob == Knob::PowerCap && ch.gpu.is_some_and(|g| c.gpus.contains(&g)))
        .map(|ch| ch.t)
        .fold(w.from, f64::max)
        + th.drop_settle_s;
    let half = (th.min_points / 2).max(2);
    let reported: Vec<f64> = w
        .recent_metrics(run)
        .iter()
        .filter(|m| m.t >= since)
        .filter_map(|m| m.samples_per_s)
        .collect();
    let rate = if reported.len() < half {
        None
    } else if run.ranks.is_empty() {
        mean(reported)
    } else {
        // A job's own reports are one rank's: the job's figure sums them all.
        run.job_samples_per_s
    };
    let power = c
        .gpus
        .iter()
        .map(|g| {
            let series = w.input.gpus.iter().find(|s| s.index == *g)?;
            let watts: Vec<f64> = w
                .recent_gpu(series)
                .iter()
                .filter(|p| p.t >= since)
                .filter_map(|p| p.power_w)
                .collect();
            (watts.len() >= half).then(|| mean(watts)).flatten()
        })
        .sum::<Option<f64>>();
    let shift = |m: f64, n: f64| (n - m) / m;
    let readings = [
        ("throughput", c.samples_per_s, rate, "samples/s"),
        ("power", c.power_w, power, "W"),
    ];
    let (name, m, n, unit) = readings
        .into_iter()
        .filter_map(|(name, m, n, unit)| Some((name, m.filter(|m| *m > 0.0)?, n?, unit)))
        .max_by(|a, b| shift(a.1, a.2).abs().total_cmp(&shift(b.1, b.2).abs()))?;
    let s = shift(m, n);
    if s.abs() <= th.workload_shift {
        return None;
    }
    Some(Moved {
        run: run.run.clone(),
        why: format!(
            "the run's {name} is {n:.0} {unit} against the {m:.0} {unit} the search measured at \
             that cap ({:+.0}%, more than {:.0}%): the workload changed since",
            100.0 * s,
            100.0 * th.workload_shift
        ),
        evidence: vec![
            ev(&format!("{name} the search measured at its cap"), m, unit),
            ev(&format!("{name} now"), n, unit),
            ev(&format!("{name} change"), 100.0 * s, "%"),
        ],
    })
}

/// A hint for each choice of the tuner that holds caps now but no longer fits its workload: it
/// names the choice and why, and proposes searching again.
pub(super) fn tuned_caps(w: &Window) -> Vec<Hint> {
    let mut seen: Vec<&TunerChoice> = Vec::new();
    for o in &w.input.owners {
        if let Some(CapOwner::Tuner(c)) = &o.owner {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
    }
    seen.into_iter()
        .filter_map(|c| {
            let m = moved(w, c)?;
            let mut evidence = vec![
                ev("power cap (the tuner's choice)", c.cap_w, "W"),
                ev("eta of the search", c.eta, ""),
            ];
            evidence.extend(m.evidence);
            Some(Hint {
                kind: HintKind::TunedCap,
                gpu: c.gpus.first().copied(),
                run: Some(m.run.clone()),
                summary: format!(
                    "GPU {}: power cap {:.0} W is {}, but {}; search again",
                    gpu_list(&c.gpus),
                    c.cap_w,
                    CapOwner::Tuner(c.clone()).describe(),
                    m.why
                ),
                evidence,
                action: Some(Suggestion::TuneEnergy {
                    run: m.run,
                    eta: c.eta,
                }),
            })
        })
        .collect()
}

/// The last pass: a cap or thermal target proposed for a GPU of a job acts on every GPU of
/// the job, said once (the first hint that proposes it).
pub(super) fn one_voice(w: &Window, hints: Vec<Hint>) -> Vec<Hint> {
    let mut out: Vec<Hint> = Vec::new();
    for mut h in hints {
        let gpus = match &mut h.action {
            Some(Suggestion::PowerCap { gpus, .. } | Suggestion::ThermalTarget { gpus, .. }) => {
                gpus
            }
            _ => {
                out.push(h);
                continue;
            }
        };
        let mut job: Vec<u32> = gpus.iter().flat_map(|g| w.job_gpus(*g)).collect();
        job.sort_unstable();
        job.dedup();
        if job.len() > gpus.len() {
            h.summary.push_str(&format!(
                " (on every GPU of its job, {}: a cap on one rank makes it the straggler)",
                gpu_list(&job)
            ));
            *gpus = job;
        }
        if !out
            .iter()
            .any(|o| o.kind == h.kind && o.action.is_some() && o.action == h.action)
        {
            out.push(h);
        }
    }
    out
}

#[cfg(test)]
mod tests;
