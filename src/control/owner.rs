//! Who holds each GPU's power cap now: "one voice" (docs/operations.md, "One voice").
//!
//! At any time one owner holds a GPU's cap: the thermal governor, the node power budget, the
//! energy tuner (a search measuring, or the best cap a finished search set), or a person (any
//! other cap below the default, `gpupilot power cap` or a run's `[power] cap_w`). At the default
//! nobody holds it. [`owners`] reads this from what the daemon shows every client (the loops'
//! status, the tuning jobs, the GPUs' limits), so the advisor, the console and the CLI agree on
//! it; the advisor reads it before it proposes a cap.
//!
//! Precedence follows who moves the cap last: the governor and the budget hold a GPU below the
//! cap a person or the tuner set (that cap is their ceiling), and a search sets every cap it
//! measures. So: a governor on the GPU, then a budget, then a search on a run of the GPU, then a
//! finished search whose best cap the GPU is at, then a finished search whose clock lock the GPU
//! holds (`--knob clocks`: the cap is not its, but moving it would move what it measured), then a
//! person.
//!
//! Pure: values in, values out.

use serde::{Deserialize, Serialize};

use super::PowerLimits;
use super::governor::Target;
use super::status::ControlStatus;
use super::tuner::TuneResult;
use super::tuner::record::{JobState, TuneJob};

/// How far a GPU's cap may be from a search's best cap and still be that cap (drivers keep
/// whole watts or milliwatts).
pub const SAME_CAP_W: f64 = 1.0;

/// What a finished energy search chose, and what it measured there: the basis a later
/// reading is compared with before anyone proposes undoing it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TunerChoice {
    pub run: String,
    /// Every GPU the search moved together (a job's GPUs).
    pub gpus: Vec<u32>,
    /// The weight of energy against time it was asked for.
    pub eta: f64,
    /// The best cap, watts.
    pub cap_w: f64,
    /// When the search started (RFC 3339).
    pub started: String,
    /// At that cap, over all the search's GPUs and all the run's ranks: samples per second…
    pub samples_per_s: Option<f64>,
    /// …and watts drawn (the GPUs together).
    pub power_w: Option<f64>,
}

impl TunerChoice {
    /// The choice of a finished search, or None (not done, no result, or a search that chose a
    /// clock lock, which leaves the cap where it was).
    pub fn of(job: &TuneJob) -> Option<TunerChoice> {
        if job.state != JobState::Done {
            return None;
        }
        let r = job.result.as_ref()?;
        TunerChoice::of_result(&job.run, &job.gpus, &job.started, r)
    }

    /// What `result`, a search on run `run`'s `gpus` started at `started` (RFC 3339), chose:
    /// None for a search that kept a clock lock (its points are MHz, and the cap stays where it
    /// was). The daemon's job record ([`TunerChoice::of`]) and a run's result file (the
    /// report) both come here.
    pub fn of_result(
        run: &str,
        gpus: &[u32],
        started: &str,
        result: &TuneResult,
    ) -> Option<TunerChoice> {
        if !result.knob.is_cap() {
            return None;
        }
        let best = &result.best;
        Some(TunerChoice {
            run: run.to_string(),
            gpus: gpus.to_vec(),
            eta: result.eta,
            cap_w: best.cap_w,
            started: started.to_string(),
            samples_per_s: (best.time_per_sample_s > 0.0).then(|| 1.0 / best.time_per_sample_s),
            power_w: (best.avg_power_w > 0.0).then_some(best.avg_power_w),
        })
    }
}

/// A finished search that kept a lock of the GPUs' SM clocks (`tune energy --knob clocks` or
/// `both`): the lock's top, which the GPUs hold while the lock is in place. It leaves their
/// caps where they were, but a cap moved under it would move what the search measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockChoice {
    pub run: String,
    pub gpus: Vec<u32>,
    pub eta: f64,
    /// The top of the locked SM clock range, MHz.
    pub max_mhz: u32,
    /// When the search started (RFC 3339).
    pub started: String,
}

impl ClockChoice {
    /// The lock a finished search kept, or None (not done, no result, or a search that kept a
    /// cap).
    pub fn of(job: &TuneJob) -> Option<ClockChoice> {
        if job.state != JobState::Done {
            return None;
        }
        let r = job.result.as_ref().filter(|r| !r.knob.is_cap())?;
        Some(ClockChoice {
            run: job.run.clone(),
            gpus: job.gpus.clone(),
            eta: r.eta,
            max_mhz: r.best.cap_w.round() as u32,
            started: job.started.clone(),
        })
    }
}

/// Who holds a GPU's cap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "owner", rename_all = "snake_case")]
pub enum CapOwner {
    /// A thermal governor moves it toward a temperature.
    Governor { by: String, target_c: Option<f64> },
    /// The node power budget shares it.
    Budget { by: String, budget_w: f64 },
    /// An energy search on `run` is measuring caps.
    Search { run: String },
    /// A finished energy search set it.
    Tuner(TunerChoice),
    /// A finished energy search locked the GPU's clocks for energy: the cap is not its, but
    /// moving it would move what the search measured.
    TunedClocks(ClockChoice),
    /// A person set it below the default.
    Operator,
}

impl CapOwner {
    /// Who, in words: `the thermal governor (toward 78 °C, turned on by alice)`.
    pub fn describe(&self) -> String {
        match self {
            CapOwner::Governor { by, target_c } => match target_c {
                Some(t) => format!("the thermal governor (toward {t:.0} °C, turned on by {by})"),
                None => format!("the thermal governor (turned on by {by})"),
            },
            CapOwner::Budget { by, budget_w } => {
                format!("the node power budget ({budget_w:.0} W, set by {by})")
            }
            CapOwner::Search { run } => format!("the energy search on run {run}"),
            CapOwner::Tuner(c) => format!(
                "the energy tuner's choice for run {} (eta {}, search of {})",
                c.run, c.eta, c.started
            ),
            CapOwner::TunedClocks(c) => format!(
                "the energy tuner's clock lock for run {} (SM clocks at most {} MHz, eta {}, \
                 search of {})",
                c.run, c.max_mhz, c.eta, c.started
            ),
            CapOwner::Operator => "a person (`gpupilot power cap` or a run's profile)".into(),
        }
    }
}

/// One GPU's cap and who holds it (None: nobody, it is at its default or unknown).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuOwner {
    pub gpu: u32,
    pub cap_w: Option<f64>,
    pub owner: Option<CapOwner>,
}

/// Each GPU's owner, from its limits and the clock locks gpupilot set (`power`: `locked`
/// names each locked GPU's `[min, max]` MHz), the loops (`thermal`) and the tuning jobs
/// (`tune_status`). See the module doc for the precedence.
pub fn owners(
    limits: &[(u32, Option<PowerLimits>)],
    locked: &[(u32, [u32; 2])],
    loops: &ControlStatus,
    jobs: &[TuneJob],
) -> Vec<GpuOwner> {
    // The newest search first: a later one on the same GPUs supersedes an earlier one.
    let mut jobs: Vec<&TuneJob> = jobs.iter().collect();
    jobs.sort_by(|a, b| b.started.cmp(&a.started));
    limits
        .iter()
        .map(|(gpu, l)| {
            let gpu = *gpu;
            let cap = l.map(|l| l.current_w);
            let governor = loops.governors.iter().find(|g| g.gpu == gpu);
            let searching = jobs
                .iter()
                .find(|j| !j.state.is_final() && j.gpus.contains(&gpu));
            let chose = jobs.iter().filter_map(|j| TunerChoice::of(j)).find(|c| {
                c.gpus.contains(&gpu) && cap.is_some_and(|w| (w - c.cap_w).abs() <= SAME_CAP_W)
            });
            let lock = locked.iter().find(|(g, _)| *g == gpu).map(|(_, r)| r[1]);
            let locked_by_tuner = jobs
                .iter()
                .filter_map(|j| ClockChoice::of(j))
                .find(|c| c.gpus.contains(&gpu) && lock == Some(c.max_mhz));
            let below_default = l.is_some_and(|l| l.current_w < l.default_w - SAME_CAP_W / 2.0);
            let owner = if let Some(g) = governor {
                Some(CapOwner::Governor {
                    by: g.by.clone(),
                    // Resolved at its first decision; asked for in degrees before that.
                    target_c: g.target_c.or(match g.target {
                        Target::Celsius(c) => Some(c),
                        Target::BelowSlowdown(_) => None,
                    }),
                })
            } else if let Some(b) = &loops.budget {
                Some(CapOwner::Budget {
                    by: b.by.clone(),
                    budget_w: b.budget_w,
                })
            } else if let Some(j) = searching {
                Some(CapOwner::Search { run: j.run.clone() })
            } else if let Some(c) = chose {
                Some(CapOwner::Tuner(c))
            } else if let Some(c) = locked_by_tuner {
                Some(CapOwner::TunedClocks(c))
            } else if below_default {
                Some(CapOwner::Operator)
            } else {
                None
            };
            GpuOwner {
                gpu,
                cap_w: cap,
                owner,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::governor::Mode;
    use crate::control::status::{BudgetStatus, GovernorStatus};
    use crate::control::tuner::{CapPoint, TuneResult, TuneSettings, Window};

    fn limits(caps: &[f64]) -> Vec<(u32, Option<PowerLimits>)> {
        caps.iter()
            .enumerate()
            .map(|(i, &w)| {
                let l = PowerLimits {
                    current_w: w,
                    enforced_w: Some(w),
                    default_w: 700.0,
                    min_w: 200.0,
                    max_w: 700.0,
                };
                (i as u32, Some(l))
            })
            .collect()
    }

    fn point(cap_w: f64, samples_per_s: f64, power_w: f64) -> CapPoint {
        CapPoint {
            se_pct: None,
            cap_w,
            batch: None,
            energy_j: power_w * 10.0,
            samples: samples_per_s * 10.0,
            seconds: 10.0,
            energy_per_sample_j: power_w / samples_per_s,
            time_per_sample_s: 1.0 / samples_per_s,
            avg_power_w: power_w,
            cost: 0.0,
        }
    }

    fn done(run: &str, gpus: &[u32], best_w: f64, started: &str) -> TuneJob {
        let best = point(best_w, 4012.0, 1300.0);
        TuneJob {
            id: TuneJob::id_for(run),
            run: run.into(),
            name: String::new(),
            what: String::new(),
            gpus: gpus.to_vec(),
            start_w: gpus.iter().map(|g| (*g, 700.0)).collect(),
            settings: TuneSettings::default(),
            state: JobState::Done,
            started: started.into(),
            progress: None,
            result: Some(TuneResult {
                confidence: None,
                saving_uncertainty_pct: None,
                knob: Default::default(),
                other: None,
                eta: 1.0,
                max_power_w: 1400.0,
                window: Window::GOLDEN_STEPS,
                start_w: 700.0,
                default_w: 700.0,
                best,
                default: Some(point(700.0, 4973.0, 1900.0)),
                curve: vec![best],
                energy_saving_pct: None,
                time_change_pct: None,
                cost_saving_pct: None,
                stopped_early: false,
                strategy: Default::default(),
                planned: 1,
                duration_s: 60.0,
                batch: None,
            }),
            why: None,
            restored: None,
            resumed: 0,
            saved: None,
            start_batch: None,
            start_locks: Vec::new(),
        }
    }

    fn owner_of(o: &[GpuOwner], gpu: u32) -> Option<&CapOwner> {
        o.iter().find(|o| o.gpu == gpu)?.owner.as_ref()
    }

    #[test]
    fn a_finished_search_holds_the_gpus_at_its_best_cap_and_only_those() {
        let jobs = [done("r1", &[0, 1], 325.0, "2026-12-01T10:00:00Z")];
        let o = owners(
            &limits(&[325.0, 325.4, 400.0, 700.0]),
            &[],
            &ControlStatus::default(),
            &jobs,
        );
        let Some(CapOwner::Tuner(c)) = owner_of(&o, 0) else {
            panic!("{o:?}")
        };
        assert_eq!(
            (c.cap_w, c.eta, c.gpus.as_slice()),
            (325.0, 1.0, &[0, 1][..])
        );
        assert!((c.samples_per_s.unwrap() - 4012.0).abs() < 1e-6);
        assert_eq!(c.power_w, Some(1300.0));
        assert!(matches!(owner_of(&o, 1), Some(CapOwner::Tuner(_))));
        // Not the tuner's GPU, below the default: a person's.
        assert_eq!(owner_of(&o, 2), Some(&CapOwner::Operator));
        assert_eq!(owner_of(&o, 3), None, "at the default nobody holds it");
        // Moved away from the best cap since: no longer the tuner's.
        let o = owners(&limits(&[450.0]), &[], &ControlStatus::default(), &jobs);
        assert_eq!(owner_of(&o, 0), Some(&CapOwner::Operator));
        // A search that kept a clock lock holds no cap: its best (MHz) is not a cap.
        let mut clocks = done("r1", &[0], 325.0, "2026-12-01T10:00:00Z");
        if let Some(r) = clocks.result.as_mut() {
            r.knob = crate::control::tuner::Knob::Clocks;
        }
        assert_eq!(TunerChoice::of(&clocks), None);
    }

    #[test]
    fn a_finished_clock_search_holds_the_gpus_whose_lock_is_its_own() {
        // `--knob clocks` kept 1410 MHz on GPUs 0 and 1 (its best is MHz).
        let mut job = done("r1", &[0, 1], 1410.0, "2026-12-01T10:00:00Z");
        if let Some(r) = job.result.as_mut() {
            r.knob = crate::control::tuner::Knob::Clocks;
        }
        let jobs = [job];
        // GPU 0 holds the lock; GPU 1's was reset since; GPU 2 is locked but not the search's;
        // all three at a cap a person set.
        let locked = [(0, [210, 1410]), (2, [210, 1410])];
        let o = owners(
            &limits(&[450.0, 450.0, 450.0]),
            &locked,
            &ControlStatus::default(),
            &jobs,
        );
        let Some(CapOwner::TunedClocks(c)) = owner_of(&o, 0) else {
            panic!("{o:?}")
        };
        assert_eq!((c.max_mhz, c.gpus.as_slice()), (1410, &[0, 1][..]));
        assert_eq!(
            CapOwner::TunedClocks(c.clone()).describe(),
            "the energy tuner's clock lock for run r1 (SM clocks at most 1410 MHz, eta 1, search \
             of 2026-12-01T10:00:00Z)"
        );
        assert_eq!(
            owner_of(&o, 1),
            Some(&CapOwner::Operator),
            "its lock was reset"
        );
        assert_eq!(
            owner_of(&o, 2),
            Some(&CapOwner::Operator),
            "not the search's GPU"
        );
        // A cap search's choice and a clock lock on the same GPU: the cap is the search's.
        let cap = done("r2", &[0], 450.0, "2026-12-01T11:00:00Z");
        let o = owners(
            &limits(&[450.0]),
            &locked,
            &ControlStatus::default(),
            &[jobs[0].clone(), cap],
        );
        assert!(matches!(owner_of(&o, 0), Some(CapOwner::Tuner(_))), "{o:?}");
    }

    #[test]
    fn the_loops_come_before_the_tuner_and_a_search_before_a_result() {
        let mut jobs = vec![done("r1", &[0, 1], 325.0, "2026-12-01T10:00:00Z")];
        let mut running = done("r1", &[1], 450.0, "2026-12-01T11:00:00Z");
        running.state = JobState::Running;
        jobs.push(running);
        let loops = ControlStatus {
            governors: vec![GovernorStatus {
                gpu: 0,
                target: Target::Celsius(78.0),
                target_c: Some(78.0),
                mode: Mode::Tracking,
                cap_w: Some(325.0),
                user_cap_w: Some(325.0),
                last: None,
                by: "alice".into(),
            }],
            ..Default::default()
        };
        let o = owners(&limits(&[325.0, 325.0]), &[], &loops, &jobs);
        assert_eq!(
            owner_of(&o, 0),
            Some(&CapOwner::Governor {
                by: "alice".into(),
                target_c: Some(78.0)
            })
        );
        assert_eq!(
            owner_of(&o, 1),
            Some(&CapOwner::Search { run: "r1".into() })
        );
        let budget = ControlStatus {
            budget: Some(BudgetStatus {
                budget_w: 1000.0,
                total_w: 650.0,
                demand_w: 900.0,
                caps: vec![(0, 325.0), (1, 325.0)],
                infeasible: None,
                by: "bob".into(),
            }),
            ..Default::default()
        };
        let o = owners(&limits(&[325.0, 325.0]), &[], &budget, &jobs[..1]);
        assert!(
            o.iter()
                .all(|g| matches!(&g.owner, Some(CapOwner::Budget { budget_w, .. }) if *budget_w == 1000.0)),
            "{o:?}"
        );
        assert!(
            CapOwner::Tuner(TunerChoice::of(&jobs[0]).unwrap())
                .describe()
                .contains("energy tuner's choice for run r1 (eta 1")
        );
    }
}
