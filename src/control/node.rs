//! The control loops of one node, run once per telemetry snapshot: thermal governors, the node
//! power budget, energy per GPU and per run, and alerts.
//!
//! [`NodeControl::step`] takes the snapshot, the runs the daemon knows ([`ControlledRun`]) and the
//! node's [`PowerControl`] handle, moves caps, and returns what happened ([`StepOutput`]): events
//! to record ([`ControlEvent`]), alert hooks to run, run energy to store. Who asked for what
//! lives here: governors and budgets turned on by a person (a request), by `control.toml`, or by
//! a run's profile while the run lives. The rest is in one file each:
//!
//! - `caps`: the governors' and the budget's caps, and setting them on the GPUs;
//! - `job_caps`: the GPUs of a job of several ranks held at one cap;
//! - `run_energy`: energy per GPU and per run, and the runs' ledgers;
//! - `alerting`: alerts from the snapshot, the runs' progress and the jobs' findings.
//!
//! Jobs: with `job_caps = "together"` (the default), the GPUs of a live job of several ranks
//! ([`ControlledRun::job_gpus`]) are held at one cap, the lowest the governors and the budget give any
//! of them (`jobs`), and the budget shares watts to the job as one unit; a GPU of the job that
//! nothing else controls is then controlled too, and let go (its user's cap back) with the job.
//!
//! No clock of its own (time is the snapshot's), no sleeping; reads run directories (profiles,
//! log and metrics sizes) and nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::PowerControl;
use super::alerts::{Alert, Alerts, HookPayload, Observation};
use super::budget::BudgetConfig;
use super::energy::{EnergyRates, GpuEnergy, GpuMeter, RunEnergy, SampleCounter};
use super::energy_ledger::{self, Ledger};
use super::governor::stale::StaleReport;
use super::governor::{Governor, GovernorConfig, Target};
use super::jobs::{self, JobCaps, JobGroup};
use super::settings::{AlertRules, ControlSettings};
use super::status::{BudgetStatus, CapChange, ControlStatus, GovernorStatus};
use crate::profile::VisibleGpus;
use crate::telemetry::Snapshot;

/// The budget is re-shared at most this often (seconds), unless it is exceeded.
pub const BUDGET_EVERY_S: f64 = 5.0;
/// The budget raises a cap only by at least this much (lowering is never held back).
pub const BUDGET_MIN_RAISE_W: f64 = 5.0;
/// Live runs' energy is written to their `summary.json` this often, seconds.
pub const ENERGY_WRITE_EVERY_S: f64 = 10.0;
/// `by` of what the loops do by themselves.
pub const BY_GOVERNOR: &str = "thermal governor";
pub const BY_BUDGET: &str = "power budget";
/// `by` of what the energy meter says about a GPU's counter.
pub const BY_ENERGY: &str = "energy meter";
/// A setter that failed is tried again after this long (seconds), doubled at each failure …
pub const RETRY_FIRST_S: f64 = 2.0;
/// … up to this.
pub const RETRY_MAX_S: f64 = 300.0;

/// A run as the loops see it (their input each step; not the console's `RunView` widget).
#[derive(Debug, Clone, PartialEq)]
pub struct ControlledRun {
    pub id: String,
    /// Not ended for good.
    pub live: bool,
    pub paused: bool,
    /// `CUDA_VISIBLE_DEVICES` as started (`0,2`, UUIDs), or None: every GPU.
    pub visible: Option<String>,
    pub dir: PathBuf,
    /// First start, Unix seconds.
    pub started_s: f64,
    /// Energy recorded before this daemon (an adopted run's `summary.json`).
    pub recorded: Option<RunEnergy>,
    /// The GPUs of its ranks, when it is a job of several ranks whose GPUs on this node are
    /// known; empty otherwise (a single process is no job).
    pub job_gpus: Vec<u32>,
    /// Its main process, which leads its process group.
    pub pid: Option<u32>,
    /// The GPUs its processes use now (NVML's process lists against the run's process tree),
    /// with the GPU memory they hold there, bytes; empty when none of its processes is on one.
    pub uses: BTreeMap<u32, u64>,
}

/// What a run's profile asks of the loops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRules {
    pub thermal: Option<Target>,
    pub node_budget_w: Option<f64>,
    pub alerts: AlertRules,
    /// The run's `[energy]`, over the node's for its figures.
    pub energy: EnergyRates,
}

impl From<&crate::profile::Profile> for RunRules {
    fn from(p: &crate::profile::Profile) -> RunRules {
        RunRules {
            thermal: p.thermal.target.map(Target::from),
            node_budget_w: p.power.node_budget_w,
            alerts: AlertRules::from(&p.alerts),
            energy: EnergyRates::from(&p.energy),
        }
    }
}

/// What the loops did or were told, for the node's event log (the daemon records each as the
/// protocol's `governor`, `budget` or `alert` node event, field for field: docs/protocol.md,
/// "Control loops").
#[derive(Debug, Clone, PartialEq)]
pub enum ControlEvent {
    /// The thermal governor of a GPU. `change`: `on`, `off`, `cap` (it moved the cap
    /// `old_w` → `new_w`), `stale` (telemetry went stale: it holds the cap), `resumed`,
    /// `flapping`, `restored` (nothing controls the cap any more: the user's cap is back),
    /// `failed` (a cap could not be set), `refused` (the GPU's limits make no sense), `job`
    /// (another GPU of a job moved with the one it governs), `implausible` (by [`BY_ENERGY`]:
    /// the GPU's energy counter went back or jumped beyond its maximum power, once per GPU).
    Governor {
        gpu: u32,
        change: String,
        target_c: Option<f64>,
        temperature_c: Option<f64>,
        old_w: Option<f64>,
        new_w: Option<f64>,
        by: String,
        why: String,
    },
    /// The node power budget was set (`budget_w`) or cleared (None), or it moved caps (`caps`).
    Budget {
        budget_w: Option<f64>,
        total_w: Option<f64>,
        caps: Vec<CapChange>,
        by: String,
        why: String,
    },
    /// An alert was raised or cleared (`change`).
    Alert { change: String, alert: Alert },
}

/// What one step did.
#[derive(Debug, Default)]
pub struct StepOutput {
    pub events: Vec<ControlEvent>,
    /// `(argv, payload)` of each alert hook to run.
    pub hooks: Vec<(Vec<String>, HookPayload)>,
    /// `(run, energy, write it to summary.json now)`.
    pub energy: Vec<(String, RunEnergy, bool)>,
    /// Live runs' ledgers to write now (`energy_ledger::save`), by run directory.
    pub ledgers: Vec<(PathBuf, Ledger)>,
}

/// Who turned something on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    Person(String),
    Config,
    Run(String),
}

impl Owner {
    fn describe(&self) -> String {
        match self {
            Owner::Person(by) => by.clone(),
            Owner::Config => "control.toml".into(),
            Owner::Run(id) => format!("run {id}"),
        }
    }
}

struct Gov {
    gov: Governor,
    owner: Owner,
    /// The cap the governor asks for (None until its first decision).
    cmd_w: Option<f64>,
    last: Option<super::governor::Decision>,
    /// What the event log was told about its telemetry going stale.
    stale: StaleReport,
}

struct BudgetSetting {
    budget_w: f64,
    owner: Owner,
    last: Option<BudgetStatus>,
    at_s: f64,
}

/// When a GPU whose setter failed is tried again.
#[derive(Debug, Clone, Copy)]
struct Retry {
    at_s: f64,
    delay_s: f64,
}

/// A GPU the loops have changed.
#[derive(Debug, Clone, Copy)]
struct Touch {
    user_cap_w: f64,
    /// The cap the loops last set, or found when they first touched the GPU.
    expected_w: f64,
}

struct RunTrack {
    gpus: Option<BTreeSet<u32>>,
    rules: RunRules,
    per_gpu: BTreeMap<u32, f64>,
    counter_s: f64,
    power_s: f64,
    samples: SampleCounter,
    metrics_read: u64,
    written_s: f64,
    /// When its ledger was last saved.
    saved_s: f64,
    /// [`ControlledRun::uses`], as of this step.
    uses: BTreeMap<u32, u64>,
    /// Energy up to this snapshot's counters was taken from its ledger: the meters' increments
    /// into this snapshot are not added again.
    caught_up: bool,
}

/// The control loops of a node. See the module doc.
pub struct NodeControl {
    settings: ControlSettings,
    gov_cfg: GovernorConfig,
    budget_cfg: BudgetConfig,
    governors: BTreeMap<u32, Gov>,
    budget: Option<BudgetSetting>,
    budget_caps: BTreeMap<u32, f64>,
    touched: BTreeMap<u32, Touch>,
    meters: BTreeMap<u32, GpuMeter>,
    runs: BTreeMap<String, RunTrack>,
    alerts: Alerts,
    /// The last error per GPU when setting a cap (said once, not every step).
    set_errors: BTreeMap<u32, String>,
    /// GPUs whose setter failed: not tried again before `at_s` (exponential backoff).
    retry: BTreeMap<u32, Retry>,
    /// GPUs whose limits make no sense, with why (said once per spell).
    refused: BTreeMap<u32, String>,
    notes: Vec<String>,
    /// control.toml's governor was started (at the first snapshot).
    config_applied: bool,
    /// The live jobs held together (none with `job_caps = "per-gpu"`).
    jobs: Vec<JobGroup>,
    /// The cap each governor-led job was last said to be held at, by run.
    jobs_said: BTreeMap<String, f64>,
    /// Findings about live jobs made outside the loops (a straggler, by the advisor), alerted
    /// with the rest at each step until replaced.
    job_findings: Vec<Observation>,
}

impl NodeControl {
    /// The loops with the daemon's `control.toml` settings (its governor and budget start at
    /// the first snapshot).
    pub fn new(settings: ControlSettings) -> NodeControl {
        let mut n = NodeControl {
            settings,
            gov_cfg: GovernorConfig::default(),
            budget_cfg: BudgetConfig::default(),
            governors: BTreeMap::new(),
            budget: None,
            budget_caps: BTreeMap::new(),
            touched: BTreeMap::new(),
            meters: BTreeMap::new(),
            runs: BTreeMap::new(),
            alerts: Alerts::new(),
            set_errors: BTreeMap::new(),
            retry: BTreeMap::new(),
            refused: BTreeMap::new(),
            notes: Vec::new(),
            config_applied: false,
            jobs: Vec::new(),
            jobs_said: BTreeMap::new(),
            job_findings: Vec::new(),
        };
        if let Some(w) = n.settings.node_budget_w {
            n.budget = Some(BudgetSetting {
                budget_w: w,
                owner: Owner::Config,
                last: None,
                at_s: f64::NEG_INFINITY,
            });
        }
        n
    }

    pub fn settings(&self) -> &ControlSettings {
        &self.settings
    }

    /// Turn the governor on for `gpus`, as `by` (a governor already there is replaced).
    pub fn thermal_on(
        &mut self,
        gpus: &[u32],
        target: Target,
        by: &str,
        why: &str,
    ) -> Vec<ControlEvent> {
        self.governors_on(gpus, target, Owner::Person(by.to_string()), why)
    }

    /// Turn the governor off for `gpus`; their caps go back to the users' caps at the next step.
    pub fn thermal_off(&mut self, gpus: &[u32], by: &str, why: &str) -> Vec<ControlEvent> {
        let mut events = Vec::new();
        for g in gpus {
            if self.governors.remove(g).is_some() {
                events.push(ControlEvent::Governor {
                    gpu: *g,
                    change: "off".into(),
                    target_c: None,
                    temperature_c: None,
                    old_w: None,
                    new_w: None,
                    by: by.to_string(),
                    why: why.to_string(),
                });
            }
        }
        events
    }

    /// Set (Some) or clear (None) the node budget, as `by`.
    pub fn set_budget(&mut self, budget_w: Option<f64>, by: &str, why: &str) -> ControlEvent {
        self.budget = budget_w.map(|w| BudgetSetting {
            budget_w: w,
            owner: Owner::Person(by.to_string()),
            last: None,
            at_s: f64::NEG_INFINITY,
        });
        if budget_w.is_none() {
            self.budget_caps.clear();
        }
        ControlEvent::Budget {
            budget_w,
            total_w: None,
            caps: vec![],
            by: by.to_string(),
            why: why.to_string(),
        }
    }

    /// Which GPUs have a governor.
    pub fn governed(&self) -> Vec<u32> {
        self.governors.keys().copied().collect()
    }

    fn governors_on(
        &mut self,
        gpus: &[u32],
        target: Target,
        owner: Owner,
        why: &str,
    ) -> Vec<ControlEvent> {
        let mut events = Vec::new();
        for &g in gpus {
            let by = owner.describe();
            self.governors.insert(
                g,
                Gov {
                    gov: Governor::new(target, self.gov_cfg),
                    owner: owner.clone(),
                    cmd_w: None,
                    last: None,
                    stale: StaleReport::new(),
                },
            );
            events.push(ControlEvent::Governor {
                gpu: g,
                change: "on".into(),
                target_c: match target {
                    Target::Celsius(c) => Some(c),
                    Target::BelowSlowdown(_) => None,
                },
                temperature_c: None,
                old_w: None,
                new_w: None,
                by,
                why: why.to_string(),
            });
        }
        events
    }

    /// One step at snapshot `snap`. `load` reads a run's profile rules from its directory
    /// (once per run); `dev` is None when the daemon may not change anything (read-only, or no
    /// control handle): then governors and the budget wait, and energy and alerts go on.
    pub fn step<P: PowerControl + ?Sized>(
        &mut self,
        snap: &Snapshot,
        runs: &[ControlledRun],
        load: &dyn Fn(&Path) -> Option<RunRules>,
        dev: Option<&P>,
        node: &str,
    ) -> StepOutput {
        let mut out = StepOutput::default();
        let now = snap.time_s;
        let all: Vec<u32> = snap.gpus.iter().map(|g| g.index).collect();
        if !self.config_applied {
            self.config_applied = true;
            if let Some(target) = self.settings.thermal {
                let why = format!("control.toml: hold {}", target.describe());
                let ev = self.governors_on(&all, target, Owner::Config, &why);
                out.events.extend(ev);
            }
        }
        self.sync_runs(snap, runs, load, &all, &mut out);
        self.jobs = match self.settings.job_caps {
            JobCaps::Together => jobs::normalize(
                &runs
                    .iter()
                    .filter(|r| r.live)
                    .map(|r| JobGroup {
                        run: r.id.clone(),
                        gpus: r.job_gpus.clone(),
                    })
                    .collect::<Vec<_>>(),
            ),
            JobCaps::PerGpu => Vec::new(),
        };
        self.meter(snap, &mut out);
        self.run_energy(snap, runs, now, &mut out);
        self.notes.clear();
        match dev {
            Some(dev) => self.control(snap, dev, now, &mut out),
            None if !self.governors.is_empty() || self.budget.is_some() => {
                self.notes.push(
                    "the governor and the budget are not acting: this daemon cannot change GPU \
                     settings (read-only, or no GPUs to control)"
                        .into(),
                );
            }
            None => {}
        }
        self.alert(snap, runs, now, node, &mut out);
        out
    }

    /// Start what new runs' profiles ask for; stop what ended runs had started.
    fn sync_runs(
        &mut self,
        snap: &Snapshot,
        runs: &[ControlledRun],
        load: &dyn Fn(&Path) -> Option<RunRules>,
        all: &[u32],
        out: &mut StepOutput,
    ) {
        for r in runs.iter().filter(|r| r.live) {
            if let Some(t) = self.runs.get_mut(&r.id) {
                t.uses.clone_from(&r.uses);
                continue;
            }
            let rules = load(&r.dir).unwrap_or_default();
            let gpus = visible_gpus(r.visible.as_deref(), snap);
            let mut per_gpu = BTreeMap::new();
            if let Some(e) = &r.recorded {
                for g in &e.per_gpu {
                    per_gpu.insert(g.gpu, g.energy_j);
                }
            }
            let (mut counter_s, mut power_s, mut caught_up) = (0.0, 0.0, false);
            let ledger = energy_ledger::load(&r.dir).filter(|l| {
                r.recorded
                    .as_ref()
                    .is_none_or(|e| l.total_j() >= e.energy_j - 1e-6)
            });
            if let Some(l) = ledger {
                per_gpu = l.gpus.iter().map(|g| (g.gpu, g.energy_j)).collect();
                (counter_s, power_s) = (l.counter_s, l.power_s);
                caught_up = catch_up(&l, snap, &mut per_gpu);
            }
            let targets: Vec<u32> = match &gpus {
                Some(set) => set.iter().copied().collect(),
                None => all.to_vec(),
            };
            if let Some(t) = rules.thermal {
                let why = format!("the run's profile: hold {}", t.describe());
                let ev = self.governors_on(&targets, t, Owner::Run(r.id.clone()), &why);
                out.events.extend(ev);
            }
            if let Some(w) = rules.node_budget_w {
                self.budget = Some(BudgetSetting {
                    budget_w: w,
                    owner: Owner::Run(r.id.clone()),
                    last: None,
                    at_s: f64::NEG_INFINITY,
                });
                out.events.push(ControlEvent::Budget {
                    budget_w: Some(w),
                    total_w: None,
                    caps: vec![],
                    by: format!("run {}", r.id),
                    why: "the run's profile sets [power] node_budget_w".into(),
                });
            }
            self.runs.insert(
                r.id.clone(),
                RunTrack {
                    gpus,
                    rules,
                    per_gpu,
                    counter_s,
                    power_s,
                    samples: SampleCounter::default(),
                    metrics_read: 0,
                    written_s: f64::NEG_INFINITY,
                    saved_s: f64::NEG_INFINITY,
                    uses: r.uses.clone(),
                    caught_up,
                },
            );
        }
        let ended: Vec<String> = self
            .runs
            .keys()
            .filter(|id| !runs.iter().any(|r| &r.id == *id && r.live))
            .cloned()
            .collect();
        for id in ended {
            let owner = Owner::Run(id.clone());
            let mine: Vec<u32> = self
                .governors
                .iter()
                .filter(|(_, g)| g.owner == owner)
                .map(|(k, _)| *k)
                .collect();
            let why = "the run that turned it on has ended";
            out.events
                .extend(self.thermal_off(&mine, &owner.describe(), why));
            if self.budget.as_ref().is_some_and(|b| b.owner == owner) {
                // Back to control.toml's budget, if it has one.
                self.budget = self.settings.node_budget_w.map(|w| BudgetSetting {
                    budget_w: w,
                    owner: Owner::Config,
                    last: None,
                    at_s: f64::NEG_INFINITY,
                });
                if self.budget.is_none() {
                    self.budget_caps.clear();
                }
                out.events.push(ControlEvent::Budget {
                    budget_w: self.settings.node_budget_w,
                    total_w: None,
                    caps: vec![],
                    by: owner.describe(),
                    why: why.into(),
                });
            }
            // The run's final figures, written once more.
            if let Some(track) = self.runs.remove(&id) {
                if let Some(r) = runs.iter().find(|r| r.id == id) {
                    out.ledgers.push((r.dir.clone(), ledger_of(&track, snap)));
                }
                let e = self.energy_of(&track);
                out.energy.push((id, e, true));
            }
        }
    }

    /// The loops as clients see them.
    pub fn status(&self) -> ControlStatus {
        let governors = self
            .governors
            .iter()
            .map(|(g, x)| GovernorStatus {
                gpu: *g,
                target: x.gov.target(),
                target_c: x.last.as_ref().and_then(|d| d.target_c),
                mode: x.gov.mode(),
                cap_w: x.cmd_w,
                user_cap_w: self.touched.get(g).map(|t| t.user_cap_w),
                last: x.last.clone(),
                by: x.owner.describe(),
            })
            .collect();
        let budget = self.budget.as_ref().map(|b| {
            b.last.clone().unwrap_or(BudgetStatus {
                budget_w: b.budget_w,
                total_w: 0.0,
                demand_w: 0.0,
                caps: vec![],
                infeasible: None,
                by: b.owner.describe(),
            })
        });
        ControlStatus {
            governors,
            budget,
            alerts: self.alerts.active().cloned().collect(),
            energy: self
                .meters
                .iter()
                .map(|(g, m)| GpuEnergy {
                    gpu: *g,
                    energy_j: m.total_j(),
                })
                .collect(),
            price: self.settings.price.clone(),
            notes: self.notes.clone(),
        }
    }

    /// The caps the loops changed, back to the users' caps (the daemon is stopping).
    pub fn release<P: PowerControl + ?Sized>(&mut self, dev: &P) -> Vec<ControlEvent> {
        self.governors.clear();
        self.budget = None;
        self.budget_caps.clear();
        let mut limits = BTreeMap::new();
        for g in self.touched.keys() {
            if let Ok(l) = dev.power_limits(*g as usize) {
                if l.problem().is_none() {
                    limits.insert(*g, l);
                }
            }
        }
        let mut out = StepOutput::default();
        self.apply(dev, &limits, &[], None, &mut out);
        out.events
    }
}

/// The GPUs a run sees: `CUDA_VISIBLE_DEVICES` as indices or UUIDs (None: every GPU). A MIG
/// instance's UUID names the GPU it is part of: energy is measured per physical GPU, so a run
/// on an instance is given its whole GPU's energy (shared with the GPU's other instances).
pub fn visible_gpus(visible: Option<&str>, snap: &Snapshot) -> Option<BTreeSet<u32>> {
    let node = snap.gpus.iter().flat_map(|g| {
        let instances = g
            .mig
            .iter()
            .flat_map(|m| m.instances.iter())
            .map(move |m| (g.index, m.uuid.as_deref()));
        std::iter::once((g.index, g.uuid.as_deref())).chain(instances)
    });
    VisibleGpus::parse(visible).known(node)
}

mod alerting;
mod caps;
mod job_caps;
mod run_energy;

use run_energy::{catch_up, ledger_of};
#[cfg(test)]
mod tests;
