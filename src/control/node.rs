//! The control loops of one node, run once per telemetry snapshot: thermal governors, the node
//! power budget, energy per GPU and per run, and alerts.
//!
//! [`NodeControl::step`] takes the snapshot, the runs the daemon knows ([`RunView`]) and the
//! node's [`PowerControl`] handle, moves caps, and returns what happened ([`StepOutput`]): node
//! events to record, alert hooks to run, run energy to store. Who asked for what lives here
//! too: governors and budgets turned on by a person (a request), by `control.toml`, or by a
//! run's profile while the run lives.
//!
//! Caps: a governed GPU gets its governor's cap; with a budget, at most its share of the budget
//! (the budget's ceiling for a GPU is its governor's cap, the user's cap and its maximum). The
//! user's cap is the one found when the loops first touched the GPU, or one set since by
//! someone else (a cap that differs from the last one the loops set). When nothing controls a
//! GPU any more, its user's cap is put back.
//!
//! Jobs: with `job_caps = "together"` (the default), the GPUs of a live job of several ranks
//! ([`RunView::job_gpus`]) are held at one cap, the lowest the governors and the budget give any
//! of them (`jobs`), and the budget shares watts to the job as one unit; a GPU of the job that
//! nothing else controls is then controlled too, and let go (its user's cap back) with the job.
//!
//! No clock of its own (time is the snapshot's), no sleeping; reads run directories (profiles,
//! log and metrics sizes) and nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::alerts::{Alert, AlertChange, Alerts, HookPayload, Observation};
use super::budget::{self, BudgetConfig, BudgetGpu};
use super::energy::{EnergySource, GpuEnergy, GpuMeter, RunEnergy, SampleCounter};
use super::energy_ledger::{self, Ledger, LedgerGpu};
use super::governor::stale::{Said, StaleReport};
use super::governor::{Action, Governor, GovernorConfig, GovernorInput, Mode, Target};
use super::jobs::{self, JobCaps, JobGroup, JobHold};
use super::settings::{AlertRules, ControlSettings};
use super::status::{BudgetStatus, CapChange, ControlStatus, GovernorStatus};
use super::{ControlError, PowerControl, PowerLimits};
use crate::profile::VisibleGpus;
use crate::telemetry::{GpuSample, Snapshot, throttle};

/// The budget is re-shared at most this often (seconds), unless it is exceeded.
pub const BUDGET_EVERY_S: f64 = 5.0;
/// The budget raises a cap only by at least this much (lowering is never held back).
pub const BUDGET_MIN_RAISE_W: f64 = 5.0;
/// Live runs' energy is written to their `summary.json` this often, seconds.
pub const ENERGY_WRITE_EVERY_S: f64 = 10.0;
/// `by` of what the loops do by themselves.
pub const BY_GOVERNOR: &str = "thermal governor";
pub const BY_BUDGET: &str = "power budget";
/// A setter that failed is tried again after this long (seconds), doubled at each failure …
pub const RETRY_FIRST_S: f64 = 2.0;
/// … up to this.
pub const RETRY_MAX_S: f64 = 300.0;

/// A run as the loops see it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunView {
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
}

impl From<&crate::profile::Profile> for RunRules {
    fn from(p: &crate::profile::Profile) -> RunRules {
        RunRules {
            thermal: p.thermal.target.map(Target::from),
            node_budget_w: p.power.node_budget_w,
            alerts: AlertRules::from(&p.alerts),
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
    /// (another GPU of a job moved with the one it governs).
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
    /// [`RunView::uses`], as of this step.
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
        runs: &[RunView],
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
        self.meter(snap);
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
        runs: &[RunView],
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

    /// Energy per GPU from this snapshot.
    fn meter(&mut self, snap: &Snapshot) {
        for s in &snap.gpus {
            if s.lost {
                continue;
            }
            let m = self.meters.entry(s.index).or_default();
            let d = m.update(s.time_s, s.energy_j, s.power_w);
            if d <= 0.0 {
                continue;
            }
            // Which way most samples were measured, for saying so.
            let counter = s.energy_j.is_some();
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
    fn run_energy(&mut self, snap: &Snapshot, runs: &[RunView], now: f64, out: &mut StepOutput) {
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

    fn energy_of(&self, track: &RunTrack) -> RunEnergy {
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
        RunEnergy::new(
            per_gpu,
            track.samples.samples(),
            self.settings.price.as_ref(),
            source,
        )
    }

    /// Governors, then the budget, then the caps.
    fn control<P: PowerControl + ?Sized>(
        &mut self,
        snap: &Snapshot,
        dev: &P,
        now: f64,
        out: &mut StepOutput,
    ) {
        let mut limits: BTreeMap<u32, PowerLimits> = BTreeMap::new();
        let wanted: BTreeSet<u32> = self
            .governors
            .keys()
            .chain(self.touched.keys())
            .copied()
            .chain(
                self.budget
                    .is_some()
                    .then(|| snap.gpus.iter().map(|g| g.index))
                    .into_iter()
                    .flatten(),
            )
            .chain(
                (!self.governors.is_empty() || self.budget.is_some())
                    .then(|| self.jobs.iter().flat_map(|j| j.gpus.iter().copied()))
                    .into_iter()
                    .flatten(),
            )
            .collect();
        let mut bad: BTreeMap<u32, PowerLimits> = BTreeMap::new();
        for g in wanted {
            if let Ok(l) = dev.power_limits(g as usize) {
                match l.problem() {
                    None => {
                        limits.insert(g, l);
                    }
                    Some(_) => {
                        bad.insert(g, l);
                    }
                }
            }
        }
        self.refuse(&bad, out);
        // Someone else set a cap since the loops last did: that is the user's cap now.
        for (g, t) in self.touched.iter_mut() {
            if let Some(l) = limits.get(g) {
                if (l.current_w - t.expected_w).abs() > 1.0 {
                    t.user_cap_w = l.current_w;
                    t.expected_w = l.current_w;
                }
            }
        }
        self.governors_step(snap, &limits, &bad, now, out);
        self.budget_step(snap, &limits, now, out);
        let holds = self.job_holds();
        // A GPU of a held job that nothing else controls is controlled from now on, so that
        // its user's cap comes back when the job is let go.
        for h in &holds {
            for g in &h.gpus {
                if let Some(l) = limits.get(g) {
                    self.touched.entry(*g).or_insert(Touch {
                        user_cap_w: l.current_w,
                        expected_w: l.current_w,
                    });
                }
            }
        }
        self.apply(dev, &limits, &holds, Some(now), out);
    }

    /// GPUs whose limits make no sense are left alone: no cap, no user's cap taken from them,
    /// nothing put back. Said once per GPU until its limits make sense again.
    fn refuse(&mut self, bad: &BTreeMap<u32, PowerLimits>, out: &mut StepOutput) {
        self.refused.retain(|g, _| bad.contains_key(g));
        for (g, l) in bad {
            let problem = l.problem().unwrap_or_default();
            let why = format!(
                "GPU {g}: {problem}: gpupilot does not move its cap until it reports plausible \
                 limits"
            );
            self.notes.push(why.clone());
            if self.refused.contains_key(g) {
                continue;
            }
            self.refused.insert(*g, problem);
            let by = if self.governors.contains_key(g) {
                BY_GOVERNOR
            } else if self.budget.is_some() {
                BY_BUDGET
            } else {
                "daemon"
            };
            out.events.push(ControlEvent::Governor {
                gpu: *g,
                change: "refused".into(),
                target_c: None,
                temperature_c: None,
                old_w: None,
                new_w: None,
                by: by.into(),
                why,
            });
        }
    }

    fn user_cap(&self, g: u32, l: &PowerLimits) -> f64 {
        self.touched.get(&g).map_or(l.current_w, |t| t.user_cap_w)
    }

    /// While the loops control GPU `g`: its user's cap and the cap they hold it at, watts.
    pub fn held(&self, g: u32) -> Option<(f64, f64)> {
        self.touched.get(&g).map(|t| (t.user_cap_w, t.expected_w))
    }

    /// A cap set as the user's from outside the loops (a run's `[power] cap_w`, and putting
    /// the original back when the run ends): from now on the loops keep GPU `g` at or below
    /// `user_w`. `set_w`: the cap just set on the GPU, if one was (so it is not taken for
    /// someone else's change). Nothing to do for a GPU the loops do not control.
    pub fn set_user_cap(&mut self, g: u32, user_w: f64, set_w: Option<f64>) {
        let Some(t) = self.touched.get_mut(&g) else {
            return;
        };
        t.user_cap_w = user_w;
        if let Some(w) = set_w {
            t.expected_w = w;
        }
        // A governor holding (stale telemetry) or a budget share between its steps must not
        // keep the GPU above its new ceiling.
        if let Some(cmd) = self.governors.get_mut(&g).and_then(|x| x.cmd_w.as_mut()) {
            *cmd = cmd.min(user_w);
        }
        if let Some(b) = self.budget_caps.get_mut(&g) {
            *b = b.min(user_w);
        }
    }

    fn governors_step(
        &mut self,
        snap: &Snapshot,
        limits: &BTreeMap<u32, PowerLimits>,
        bad: &BTreeMap<u32, PowerLimits>,
        now: f64,
        out: &mut StepOutput,
    ) {
        let gpus: Vec<u32> = self.governors.keys().copied().collect();
        for g in gpus {
            let Some(l) = limits.get(&g).copied() else {
                if let Some(l) = bad.get(&g) {
                    // The governor is shown refusing (it decides nothing from these figures).
                    let sample = snap.gpus.iter().find(|s| s.index == g);
                    let gov = self.governors.get_mut(&g).expect("listed");
                    let input = GovernorInput {
                        user_cap_w: None,
                        ..governor_input(sample, now, l.current_w, l, l.current_w)
                    };
                    gov.last = Some(gov.gov.decide(&input));
                }
                continue;
            };
            let user = self.user_cap(g, &l);
            let sample = snap.gpus.iter().find(|s| s.index == g);
            let gov = self.governors.get_mut(&g).expect("listed");
            let cmd = gov.cmd_w.unwrap_or(l.current_w.min(user));
            let input = governor_input(sample, now, cmd, &l, user);
            let d = gov.gov.decide(&input);
            if let Action::Set { from_w, to_w } = d.action {
                gov.cmd_w = Some(to_w);
                out.events.push(ControlEvent::Governor {
                    gpu: g,
                    change: "cap".into(),
                    target_c: d.target_c,
                    temperature_c: d.temperature_c,
                    old_w: Some(from_w),
                    new_w: Some(to_w),
                    by: BY_GOVERNOR.into(),
                    why: d.why.clone(),
                });
            } else if gov.cmd_w.is_none() {
                gov.cmd_w = Some(cmd);
            }
            let said = gov.stale.observe(d.mode == Mode::Stale, now);
            if let Some(said) = said {
                let (change, why) = match said {
                    Said::Stale => ("stale", d.why.clone()),
                    Said::Resumed { spells: 1, .. } => {
                        ("resumed", "telemetry is fresh again".to_string())
                    }
                    Said::Resumed { spells, over_s } => (
                        "resumed",
                        format!(
                            "telemetry is fresh again and has stayed so for {:.0} s, after \
                             {spells} stale spells over {over_s:.0} s",
                            super::governor::stale::SETTLE_S
                        ),
                    ),
                    Said::Flapping { spells, over_s } => (
                        "flapping",
                        format!(
                            "telemetry went stale again {over_s:.0} s after the last stale \
                             spell ({spells} spells): the cap is held at every stale sample; \
                             not said again until it stays fresh for {:.0} s",
                            super::governor::stale::SETTLE_S
                        ),
                    ),
                };
                out.events.push(ControlEvent::Governor {
                    gpu: g,
                    change: change.into(),
                    target_c: d.target_c,
                    temperature_c: d.temperature_c,
                    old_w: None,
                    new_w: None,
                    by: BY_GOVERNOR.into(),
                    why,
                });
            }
            gov.last = Some(d);
            self.touched.entry(g).or_insert(Touch {
                user_cap_w: user,
                expected_w: l.current_w,
            });
        }
    }

    fn budget_step(
        &mut self,
        snap: &Snapshot,
        limits: &BTreeMap<u32, PowerLimits>,
        now: f64,
        out: &mut StepOutput,
    ) {
        let Some(b) = &self.budget else {
            return;
        };
        let budget_w = b.budget_w;
        let current: f64 = snap
            .gpus
            .iter()
            .map(|s| {
                limits
                    .get(&s.index)
                    .map(|l| l.current_w)
                    .or(s.power_limit_w)
                    .unwrap_or(0.0)
            })
            .sum();
        if now - b.at_s < BUDGET_EVERY_S && current <= budget_w + 0.5 {
            return;
        }
        let gpus: Vec<BudgetGpu> = snap
            .gpus
            .iter()
            .map(|s| {
                let l = limits.get(&s.index);
                let fixed = s.lost || l.is_none();
                let cap = l.map(|l| l.current_w).or(s.power_limit_w).unwrap_or(0.0);
                let (min, max) = l.map_or((cap, cap), |l| (l.min_w, l.max_w));
                let user = l.map_or(cap, |l| self.user_cap(s.index, l));
                let gov = self.governors.get(&s.index).and_then(|g| g.cmd_w);
                let ceiling = gov.map_or(user.min(max), |c| c.min(user).min(max));
                BudgetGpu {
                    index: s.index,
                    cap_w: cap,
                    min_w: min,
                    ceiling_w: ceiling,
                    draw_w: s.power_w.filter(|_| !s.stale),
                    cap_limited: s.throttle_reasons.is_some_and(throttle::power_limited),
                    fixed,
                }
            })
            .collect();
        let groups: Vec<Vec<u32>> = self.jobs.iter().map(|j| j.gpus.clone()).collect();
        let a = budget::allocate_jobs(budget_w, &gpus, &groups, &self.budget_cfg);
        for (g, c) in &a.caps {
            if gpus.iter().any(|x| x.index == *g && !x.fixed) {
                self.budget_caps.insert(*g, *c);
                if let Some(l) = limits.get(g) {
                    let user = self.user_cap(*g, l);
                    self.touched.entry(*g).or_insert(Touch {
                        user_cap_w: user,
                        expected_w: l.current_w,
                    });
                }
            }
        }
        let b = self.budget.as_mut().expect("checked");
        if a.infeasible.is_some() && b.last.as_ref().is_none_or(|l| l.infeasible.is_none()) {
            out.events.push(ControlEvent::Budget {
                budget_w: Some(budget_w),
                total_w: Some(a.total_w),
                caps: vec![],
                by: BY_BUDGET.into(),
                why: a.infeasible.clone().unwrap_or_default(),
            });
        }
        b.at_s = now;
        b.last = Some(BudgetStatus {
            budget_w,
            total_w: a.total_w,
            demand_w: a.demand_w,
            caps: a.caps.clone(),
            infeasible: a.infeasible,
            by: b.owner.describe(),
        });
    }

    /// Set every cap the loops decide (each held job's GPUs at its cap), lowering before
    /// raising so a budget is never exceeded on the way.
    fn apply<P: PowerControl + ?Sized>(
        &mut self,
        dev: &P,
        limits: &BTreeMap<u32, PowerLimits>,
        holds: &[JobHold],
        now: Option<f64>,
        out: &mut StepOutput,
    ) {
        let own = self.own_targets();
        let mut held: BTreeMap<u32, (f64, &'static str)> = BTreeMap::new();
        for h in holds {
            let who = own.get(&h.leader).map_or(BY_GOVERNOR, |(_, who)| *who);
            for g in &h.gpus {
                held.insert(*g, (h.cap_w, who));
            }
        }
        let mut plan: Vec<(u32, f64, f64, &'static str)> = Vec::new();
        let mut released = Vec::new();
        for (&g, t) in &self.touched {
            let Some(l) = limits.get(&g) else {
                continue;
            };
            let gov = self.governors.get(&g).and_then(|x| x.cmd_w);
            // A job's cap, never above this GPU's user's cap.
            let job = held
                .get(&g)
                .map(|(w, who)| (w.min(t.user_cap_w), *who))
                .filter(|(w, _)| own.get(&g).is_none_or(|(o, _)| w < o));
            let (to, who) = match job.or(own.get(&g).copied()) {
                Some((x, who)) => (x.clamp(l.min_w, l.max_w), who),
                // Nothing controls it any more: its user's cap goes back.
                None => {
                    released.push(g);
                    (t.user_cap_w.clamp(l.min_w, l.max_w), "")
                }
            };
            let raise = to - l.current_w;
            let small = if who == BY_BUDGET && gov.is_none_or(|a| to < a) {
                raise > 0.0 && raise < BUDGET_MIN_RAISE_W
            } else {
                raise.abs() < 1.0
            };
            if raise.abs() < 0.5 || small {
                continue;
            }
            // A setter that failed waits its turn (`now` None: the daemon is stopping, and
            // every GPU is tried once more).
            if let (Some(now), Some(r)) = (now, self.retry.get(&g)) {
                if now < r.at_s {
                    continue;
                }
            }
            plan.push((g, l.current_w, to, who));
        }
        plan.sort_by(|a, b| (a.2 - a.1).total_cmp(&(b.2 - b.1)));
        let mut budget_changes = Vec::new();
        let mut changed = BTreeSet::new();
        for (g, from, to, who) in plan {
            match dev.set_power_limit_w(g as usize, to) {
                Ok(()) => {
                    changed.insert(g);
                    self.set_errors.remove(&g);
                    self.retry.remove(&g);
                    if let Some(t) = self.touched.get_mut(&g) {
                        t.expected_w = to;
                    }
                    match who {
                        BY_BUDGET => budget_changes.push(CapChange {
                            gpu: g,
                            old_w: from,
                            new_w: to,
                        }),
                        "" => out.events.push(ControlEvent::Governor {
                            gpu: g,
                            change: "restored".into(),
                            target_c: None,
                            temperature_c: None,
                            old_w: Some(from),
                            new_w: Some(to),
                            by: "daemon".into(),
                            why: "nothing controls this GPU's cap any more: the user's cap is back"
                                .into(),
                        }),
                        _ => {}
                    }
                }
                Err(e) => {
                    // The GPU did not follow: the governor goes on from the cap it has.
                    if let Some(gov) = self.governors.get_mut(&g) {
                        gov.cmd_w = Some(from);
                    }
                    let delay_s = self
                        .retry
                        .get(&g)
                        .map_or(RETRY_FIRST_S, |r| (r.delay_s * 2.0).min(RETRY_MAX_S));
                    if let Some(now) = now {
                        self.retry.insert(
                            g,
                            Retry {
                                at_s: now + delay_s,
                                delay_s,
                            },
                        );
                    }
                    self.set_failed(g, who, &e, out)
                }
            }
        }
        for g in released {
            if !self.set_errors.contains_key(&g) {
                self.touched.remove(&g);
                self.budget_caps.remove(&g);
            }
        }
        self.say_job_holds(holds, &held, &changed, out);
        if !budget_changes.is_empty() {
            let (budget_w, total_w) = match &self.budget {
                Some(b) => (Some(b.budget_w), b.last.as_ref().map(|l| l.total_w)),
                None => (None, None),
            };
            let why = job_caps::budget_why(&budget_changes, &self.jobs);
            out.events.push(ControlEvent::Budget {
                budget_w,
                total_w,
                caps: budget_changes,
                by: BY_BUDGET.into(),
                why: format!("caps follow demand: {why}"),
            });
        }
    }

    fn set_failed(&mut self, g: u32, who: &str, e: &ControlError, out: &mut StepOutput) {
        let msg = e.to_string();
        if self.set_errors.get(&g) == Some(&msg) {
            return;
        }
        self.set_errors.insert(g, msg.clone());
        let who = if who.is_empty() { "daemon" } else { who };
        out.events.push(ControlEvent::Governor {
            gpu: g,
            change: "failed".into(),
            target_c: None,
            temperature_c: None,
            old_w: None,
            new_w: None,
            by: who.into(),
            why: format!(
                "could not set the power cap: {msg}; tried again in {RETRY_FIRST_S:.0} s, then \
                 less and less often (at most every {:.0} min) until it works",
                RETRY_MAX_S / 60.0
            ),
        });
    }

    /// Alerts from this snapshot and the live runs' progress.
    fn alert(
        &mut self,
        snap: &Snapshot,
        runs: &[RunView],
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

fn governor_input(
    sample: Option<&GpuSample>,
    now: f64,
    cmd: f64,
    l: &PowerLimits,
    user: f64,
) -> GovernorInput {
    GovernorInput {
        now_s: now,
        sample_time_s: sample.map_or(f64::NEG_INFINITY, |s| s.time_s),
        temperature_c: sample.and_then(|s| s.temperature_c),
        slowdown_c: sample.and_then(|s| s.temp_slowdown_c),
        stale: sample.is_none_or(|s| s.stale || s.lost),
        power_w: sample.and_then(|s| s.power_w),
        cap_w: cmd,
        min_w: l.min_w,
        max_w: l.max_w,
        user_cap_w: Some(user),
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
fn ledger_of(track: &RunTrack, snap: &Snapshot) -> Ledger {
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
fn catch_up(l: &Ledger, snap: &Snapshot, per_gpu: &mut BTreeMap<u32, f64>) -> bool {
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
        match s.energy_j {
            Some(now) if now >= saved && now.is_finite() => {
                *per_gpu.entry(g.gpu).or_default() += now - saved;
                any = true;
            }
            _ => {}
        }
    }
    any
}

/// The GPUs a run sees: `CUDA_VISIBLE_DEVICES` as indices or UUIDs (None: every GPU).
pub fn visible_gpus(visible: Option<&str>, snap: &Snapshot) -> Option<BTreeSet<u32>> {
    let node = snap.gpus.iter().map(|g| (g.index, g.uuid.as_deref()));
    VisibleGpus::parse(visible).known(node)
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

/// Feed the metrics lines written since the last read to the run's sample counter.
fn read_metrics(path: &Path, track: &mut RunTrack) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
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

mod job_caps;
#[cfg(test)]
mod tests;
